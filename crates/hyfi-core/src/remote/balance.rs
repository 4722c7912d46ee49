//! Fork-join across nodes (paper §3.5): the node's side of start-up
//! distribution, cross-node stealing and termination, and the handle
//! through which the node's fork-join messaging (`steal`) moves filaments
//! ([`FjNode`]).
//!
//! **Entry point.** Every node calls [`Runtime::run_distributed`](crate::Runtime::run_distributed) with the
//! same root, in SPMD style (the same program runs everywhere). Node 0 runs
//! the root; the others start with nothing and get work by start-up
//! distribution and stealing. When the root returns on node 0, its result is
//! sent to every node, and `run_distributed` returns it everywhere. Only
//! filaments forked with [`Ctx::join_remote`] leave their node.
//!
//! **Start-up distribution** (module `startup`): the first forks go out
//! along a logical binomial tree of (node, processor) slots, largest pieces
//! across nodes first, so every processor of every node has work after
//! `log2(N·P)` forks.
//!
//! **Stealing.** An idle processor first steals on its own node (other
//! processors' deques and incoming lists); then it asks the node's
//! messaging ([`Stealing::want_work`](crate::steal::Stealing::want_work)),
//! which sends one request at a time to another node. The donor takes half
//! of all its ready filaments (rounded up), one by one round-robin from its
//! processors' lists ([`FjNode::export_half`]); the receiver spreads them
//! evenly over its processors ([`FjNode::install`]). A donor with nothing
//! to give asks every processor for a real fork, so pruning never starves
//! another node: while nodes keep asking, forks stay real. A shipped
//! filament's parent waits for its result as for a filament stolen on its
//! own node (its filthread suspends).
//!
//! **Termination.** A fork-join computation is finished when its root
//! returns: every filament's result reaches its parent before the parent's
//! join returns, so nothing of the run is left anywhere. Node 0 sends the
//! root's outcome to every node
//! ([`Stealing::finish`](crate::steal::Stealing::finish)); each node's
//! server threads stop when it arrives.
//!
//! **Failure.** If the cluster fails (a lost node, an abort) the link tells
//! the node's messaging, which calls [`FjNode::fail`]: filaments shipped
//! from here are completed with the error, every later join unwinds at
//! once, and `run_distributed` returns [`Error::Link`](crate::Error::Link)
//! on every surviving node.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use crossbeam_deque::Steal;
use serde::{Deserialize, Serialize};

use crate::crossnode::{bump, Counters, Failure, Pending};
use crate::job::{HeapJob, JobRef};
use crate::registry::Shared;
use crate::remote;
use crate::remote::startup::{with_startup, Slot};
use crate::runtime::Runtime;
use crate::sched::Ctx;

/// A filament on its way to another node: its function's name and encoded
/// argument, and the token its home node completes it by.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct PortableJob {
    /// Identifies the waiting parent on the home node.
    pub(crate) token: u64,
    /// The [`RemoteFn`](crate::RemoteFn)'s name.
    pub(crate) name: String,
    /// The bincode-encoded argument.
    pub(crate) args: Vec<u8>,
    /// The start-up slot it takes over, if it is a start-up filament.
    pub(crate) startup: Option<Slot>,
}

/// A result for a shipped filament that no filament of this node waits
/// for: a protocol violation by the node that sent it (or a late result
/// after a failure, which the receiver expects and ignores).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a result for filament {token}, which nobody waits for")]
pub(crate) struct NobodyWaits {
    /// The filament's token.
    pub(crate) token: u64,
}

/// The node's fork-join messaging's handle on the node's fork-join state.
/// It does not keep the runtime alive; once the runtime is gone every call
/// does nothing.
#[derive(Clone)]
pub(crate) struct FjNode(Weak<Shared>);

impl std::fmt::Debug for FjNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FjNode")
    }
}

/// What became of a job the donor took from a deque.
pub(crate) enum Taken {
    Shipped(PortableJob),
    /// Not serializable (a plain `join`), or its argument would not encode.
    Local(JobRef),
    /// The node failed meanwhile; the job was completed with the failure.
    Consumed,
}

/// Encodes a job for another node and records it as pending.
pub(crate) fn ship(sh: &Shared, job: JobRef) -> Taken {
    let Some((ptr, vtable)) = job.portable() else {
        return Taken::Local(job);
    };
    // SAFETY: the job was just taken from a deque (or never published), so
    // this thread owns it; its joiner waits for its latch.
    let startup = unsafe { (vtable.startup)(ptr) };
    // SAFETY: as above.
    let (name, args) = match unsafe { (vtable.export)(ptr) } {
        Ok(x) => x,
        Err(why) => {
            tracing::warn!("hyfi: a filament's argument would not encode ({why}); it runs here");
            return Taken::Local(job);
        }
    };
    let token = sh.fj.next_token.fetch_add(1, Ordering::Relaxed) + 1;
    sh.fj
        .pending
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(token, Pending { ptr, vtable });
    // `fail` drains the table after setting `abort`: if it already ran, it
    // missed this entry, so complete it here.
    if sh.fj.abort.load(Ordering::SeqCst) {
        sh.fj
            .complete_pending(token, Err(sh.fj.failure()), sh.link.my_node());
        return Taken::Consumed;
    }
    bump(&sh.fj.counters.filaments_out, 1);
    Taken::Shipped(PortableJob {
        token,
        name: name.to_string(),
        args,
        startup,
    })
}

/// A job taken from processor `victim` for another node: shipped into
/// `out`, or (not serializable) back to this node's injector. The victim
/// may have nothing left, so its next join forks.
fn give(sh: &Shared, victim: usize, job: JobRef, out: &mut Vec<PortableJob>) {
    sh.workers[victim].want_fork();
    match ship(sh, job) {
        Taken::Shipped(pj) => out.push(pj),
        Taken::Local(j) => {
            sh.injector.push(j);
            sh.notify_idle();
        }
        Taken::Consumed => {}
    }
}

impl FjNode {
    /// The handle on `rt`'s node.
    pub(crate) fn of(rt: &Runtime) -> FjNode {
        FjNode(Arc::downgrade(&rt.shared))
    }

    /// Donor side of a steal from another node: half of this node's ready
    /// filaments (rounded up), taken one by one round-robin from the
    /// processors' lists and encoded. Empty if `run` is not in progress
    /// here or nothing is ready; then every processor is asked for a real
    /// fork, so the next request finds work.
    pub(crate) fn export_half(&self, run: u64) -> Vec<PortableJob> {
        let Some(sh) = self.0.upgrade() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if sh.fj.active(run) {
            let p = sh.procs;
            // The largest piece first: a processor's shallowest latent
            // `join_remote` (`fork::latent`), claimed while it runs the
            // first branch, even inside a subtree its pruned copy runs.
            let first = sh.fj.take_from.load(Ordering::Relaxed) % p;
            for k in 0..p {
                let i = (first + k) % p;
                if let Some(j) = sh.workers[i].latent.claim(true) {
                    bump(&sh.fj.counters.latent_exported, 1);
                    give(&sh, i, j, &mut out);
                    break;
                }
            }
            // Else half of the ready filaments (rounded up), round-robin.
            if out.is_empty() {
                let ready: usize = (0..p)
                    .map(|i| sh.stealers[i].len() + sh.workers[i].incoming.len())
                    .sum();
                let want = ready.div_ceil(2);
                let mut i = sh.fj.take_from.fetch_add(1, Ordering::Relaxed) % p;
                let mut dry = 0;
                while out.len() < want && dry < p {
                    let got = match sh.workers[i].incoming.steal() {
                        Steal::Success(j) => Some(j),
                        _ => loop {
                            match sh.stealers[i].steal() {
                                Steal::Success(j) => break Some(j),
                                Steal::Retry => continue,
                                Steal::Empty => break None,
                            }
                        },
                    };
                    match got {
                        Some(j) => {
                            dry = 0;
                            give(&sh, i, j, &mut out);
                        }
                        None => dry += 1,
                    }
                    i = (i + 1) % p;
                }
            }
        }
        if out.is_empty() {
            bump(&sh.fj.counters.requests_refused, 1);
            for w in &sh.workers {
                w.want_fork();
            }
        } else {
            bump(&sh.fj.counters.requests_served, 1);
        }
        out
    }

    /// Receiver side: runs `jobs`, which came from node `from`, on this
    /// node: on processor `at` (start-up distribution), or spread evenly
    /// over the processors (a steal). Jobs for a run not in progress here
    /// are answered with a failure at once, so their parents never hang.
    pub(crate) fn install(&self, run: u64, from: usize, jobs: Vec<PortableJob>, at: Option<usize>) {
        let Some(sh) = self.0.upgrade() else { return };
        if !sh.fj.active(run) {
            if let Some(b) = sh.fj.stealing.get() {
                for j in jobs {
                    b.send_result(from, run, j.token, Err(sh.fj.failure_or_stale(run)));
                }
            }
            return;
        }
        let n = jobs.len();
        if n == 0 {
            return;
        }
        bump(&sh.fj.counters.filaments_in, n as u64);
        if at.is_none() {
            bump(&sh.fj.counters.steals, 1);
        }
        let p = sh.procs;
        let start = sh.fj.spread.fetch_add(n, Ordering::Relaxed);
        for (k, job) in jobs.into_iter().enumerate() {
            let proc = at.map_or((start + k) % p, |a| a.min(p - 1));
            let job_ref = HeapJob::into_job_ref(move |ctx: &Ctx| {
                let token = job.token;
                crate::trace::instant(crate::trace::Kind::RemoteRun, [from as u64, 0, 0, 0]);
                let out = with_startup(ctx, job.startup, || {
                    ctx.count_filaments(1);
                    remote::run_imported(ctx, &job.name, &job.args)
                });
                if let Some(b) = ctx.shared.fj.stealing.get() {
                    b.send_result(from, run, token, out);
                }
            });
            sh.workers[proc].incoming.push(job_ref);
            sh.workers[proc].notify();
        }
        sh.notify_idle();
    }

    /// The outcome of filament `token` shipped from here. `Err` if no such
    /// filament waits (a protocol violation).
    pub(crate) fn complete(
        &self,
        token: u64,
        outcome: Result<Vec<u8>, Failure>,
    ) -> Result<(), NobodyWaits> {
        let Some(sh) = self.0.upgrade() else {
            return Ok(());
        };
        if sh.fj.complete_pending(token, outcome, sh.link.my_node()) {
            Ok(())
        } else {
            Err(NobodyWaits { token })
        }
    }

    /// Node 0 says the root of `run` returned with `outcome`: this node's
    /// part of the run ends.
    pub(crate) fn finished(&self, run: u64, outcome: Result<Vec<u8>, Failure>) {
        let Some(sh) = self.0.upgrade() else { return };
        if sh.fj.run.load(Ordering::SeqCst) != run {
            return;
        }
        *sh.fj.outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(outcome);
        sh.fj_done.store(true, Ordering::SeqCst);
        sh.notify_idle();
    }

    /// The cluster failed: complete every filament shipped from here with
    /// the failure, make every join unwind, and end this node's run.
    pub(crate) fn fail(&self, why: &str) {
        let Some(sh) = self.0.upgrade() else { return };
        {
            let mut f = sh.fj.failure.lock().unwrap_or_else(|e| e.into_inner());
            if f.is_some() {
                return;
            }
            *f = Some(Failure::Lost { why: why.into() });
        }
        sh.fj.abort.store(true, Ordering::SeqCst);
        // Every join takes the slow path, which unwinds.
        for w in &sh.workers {
            w.want_fork();
        }
        let pending: Vec<Pending> = sh
            .fj
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .map(|(_, p)| p)
            .collect();
        for p in pending {
            // SAFETY: drained from the table: we are its only completer.
            unsafe { (p.vtable.complete)(p.ptr, Err(sh.fj.failure()), sh.link.my_node()) };
        }
        // Node 0 ends when its root has unwound; the others end now.
        if sh.link.my_node() != 0 && sh.fj.run.load(Ordering::SeqCst) != 0 {
            *sh.fj.outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(Err(sh.fj.failure()));
            sh.fj_done.store(true, Ordering::SeqCst);
        }
        sh.notify_idle();
    }

    /// Wakes the idle processors (to ask again after a refusal).
    pub(crate) fn wake_idle(&self) {
        if let Some(sh) = self.0.upgrade() {
            sh.fj.kick.fetch_add(1, Ordering::SeqCst);
            sh.notify_idle();
        }
    }

    /// Counts the time from sending a steal request to having installed
    /// its answer.
    pub(crate) fn count_steal_wait(&self, d: Duration) {
        if let Some(sh) = self.0.upgrade() {
            bump(&sh.fj.counters.steal_wait_ns, d.as_nanos() as u64);
        }
    }

    /// Adds one to the node's counter `which` (the `RemoteStats` counts).
    pub(crate) fn count(&self, which: impl FnOnce(&Counters) -> &AtomicU64) {
        if let Some(sh) = self.0.upgrade() {
            bump(which(&sh.fj.counters), 1);
        }
    }

    /// Node `from`'s request of `run`, made through shared memory, came as
    /// a message: `true` if it still waits (now taken: answer it), `false`
    /// if a processor answered it. `true` where this node shares no words.
    pub(crate) fn claim_host_request(&self, from: usize, run: u64) -> bool {
        let Some(sh) = self.0.upgrade() else {
            return true;
        };
        sh.fj.host.as_ref().map_or(true, |h| h.claim(from, run))
    }
}

/// Sends a start-up filament to the processor that owns `slot`.
pub(crate) fn send_to_slot(ctx: &Ctx, job: JobRef, slot: Slot) {
    let sh = &*ctx.shared;
    let nodes = ctx.nodes;
    let (node, proc) = (slot.slot as usize % nodes, slot.slot as usize / nodes);
    ctx.stats.forks.set(ctx.stats.forks.get() + 1);
    let local = |job: JobRef| {
        let proc = if node == ctx.node { proc } else { ctx.proc };
        sh.workers[proc].incoming.push(job);
        sh.workers[proc].notify();
        sh.notify_idle();
    };
    let (Some(b), true) = (sh.fj.stealing.get(), node != ctx.node) else {
        return local(job);
    };
    let run = sh.fj.run.load(Ordering::SeqCst);
    match ship(sh, job) {
        Taken::Shipped(pj) => {
            let token = pj.token;
            if let Err(e) = b.push(node, proc, run, pj) {
                // The node failed: complete the job with the failure (unless
                // `fail` already did).
                let lost = Failure::Lost { why: e.to_string() };
                sh.fj.complete_pending(token, Err(lost), ctx.node);
            }
        }
        Taken::Local(job) => local(job),
        Taken::Consumed => {}
    }
}
