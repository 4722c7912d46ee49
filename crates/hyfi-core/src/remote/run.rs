//! How a fork-join run over every node starts and ends on this one:
//! [`Runtime::run_distributed`] (the root on node 0, its result sent to
//! every node), through the node's fork-join messaging that the cluster
//! layer installs ([`steal::install`](crate::steal::install)). The protocol
//! is in this directory's `README.md`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::failure_of;
use super::startup::{with_startup, Slot};
use super::Failure;
use crate::error::Error;
use crate::runtime::Runtime;
use crate::sched::Ctx;

impl Runtime {
    /// Runs a fork-join computation over every node: call it on every node,
    /// with the same root, in the same order as the node's other runs (SPMD).
    /// Node 0 runs `root`; the other nodes run the filaments that start-up
    /// distribution and stealing send them (those forked with
    /// [`Ctx::join_remote`]). Returns the root's result on every node.
    ///
    /// On one node it is [`Runtime::run`] plus start-up distribution over
    /// the processors, and nothing is serialized.
    ///
    /// **Shared arrays** (hyfi-dsm): it begins (on several nodes) and ends
    /// with a collective release, like a phase: what any node's filaments
    /// wrote is visible on every node when it returns, and what local
    /// [`Runtime::run`]s wrote before is visible to its filaments.
    ///
    /// A panic anywhere, on any node, is returned as
    /// [`Error::FilamentPanic`] naming the node and processor where it
    /// happened; a filament whose function a node has not registered, as
    /// [`Error::UnknownFilament`]; a lost node, as [`Error::Link`].
    ///
    /// ```
    /// use hyfi::{Config, Ctx, RemoteFn, Runtime};
    /// fn sum(ctx: &Ctx, (lo, hi): (u64, u64)) -> u64 {
    ///     if hi - lo <= 1000 { return (lo..hi).sum(); }
    ///     let mid = lo + (hi - lo) / 2;
    ///     let (a, b) = ctx.join_remote(|c| sum(c, (lo, mid)), &SUM, (mid, hi));
    ///     a + b
    /// }
    /// static SUM: RemoteFn<(u64, u64), u64> = RemoteFn::new("doc::sum", sum);
    /// SUM.register()?;
    /// let rt = Runtime::new(Config::new().procs(2).pin(false))?;
    /// assert_eq!(rt.run_distributed(|ctx| sum(ctx, (0, 1_000_000)))?, 499_999_500_000);
    /// # Ok::<(), hyfi::Error>(())
    /// ```
    pub fn run_distributed<R, F>(&self, root: F) -> Result<R, Error>
    where
        F: FnOnce(&Ctx) -> R + Send,
        R: Serialize + DeserializeOwned + Send,
    {
        self.check_not_nested()?;
        let _g = self.start_lock.lock().unwrap_or_else(|e| e.into_inner());
        let sh = &*self.shared;
        if sh.fj.abort.load(Ordering::SeqCst) {
            return Err(sh.fj.failure().into());
        }
        let (me, nodes) = (sh.link.my_node(), sh.link.num_nodes());
        let stealing = sh.fj.stealing.get().cloned();
        if nodes > 1 && stealing.is_none() {
            return Err(Error::NoBalancer { nodes });
        }
        let total = nodes * sh.procs;
        let run = sh.fj.next_run.fetch_add(1, Ordering::SeqCst) + 1;
        // Every node must call it: a node that does not is named at once
        // (entered before the release below, which waits for every node).
        sh.link
            .enter_step(crate::Step::Distributed { seq: run })
            .map_err(Error::Link)?;
        if nodes > 1 {
            // What local fork-join runs wrote since the last release.
            self.fork_join_release()?;
        }
        sh.fj_done.store(false, Ordering::SeqCst);
        *sh.fj.outcome.lock().unwrap_or_else(|e| e.into_inner()) = None;
        sh.fj.run.store(run, Ordering::SeqCst);
        if let Some(b) = &stealing {
            b.begin(run);
        }
        let root_job = (me == 0).then(|| {
            let stealing = stealing.clone();
            move |ctx: &Ctx| {
                let start = (total > 1).then_some(Slot { slot: 0, depth: 0 });
                let mut r =
                    with_startup(ctx, start, || catch_unwind(AssertUnwindSafe(|| root(ctx))))
                        .map_err(|p| failure_of(me, ctx.proc(), p));
                if let Some(b) = &stealing {
                    let bytes = match &r {
                        Ok(v) => bincode::serialize(v).map_err(|e| Failure::Codec {
                            node: me,
                            name: "the root's result".into(),
                            why: e.to_string(),
                        }),
                        Err(f) => Err(f.clone()),
                    };
                    if let Err(f) = &bytes {
                        r = Err(f.clone());
                    }
                    b.finish(run, &bytes);
                }
                r
            }
        });
        let slot = self.dispatch_fork_join(root_job);
        sh.fj.run.store(0, Ordering::SeqCst);
        if let Some(b) = &stealing {
            b.end(run);
        }
        // Every node ran this command (SPMD), whatever its outcome, so the
        // collective release is reached everywhere; a lost node makes it
        // fail instead of wait.
        let released = self.fork_join_release();
        let r = if me == 0 {
            slot.expect("hyfi: fork-join run ended without its root")
        } else {
            match sh
                .fj
                .outcome
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
            {
                Some(Ok(bytes)) => bincode::deserialize(&bytes).map_err(|e| Failure::Codec {
                    node: me,
                    name: "the root's result".into(),
                    why: e.to_string(),
                }),
                Some(Err(f)) => Err(f),
                None => Err(sh.fj.failure()),
            }
        };
        // A failure of a distributed run reaches every node through the
        // run's own protocol (each returns it), so it is not an abort.
        let r = r.map_err(Error::from)?;
        released.map(|()| r)
    }
}
