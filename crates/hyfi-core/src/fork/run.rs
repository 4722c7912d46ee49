//! How a fork-join run starts and ends on one node: [`Runtime::run`], and
//! the command every fork-join entry point (also
//! [`Runtime::run_distributed`]) dispatches: the root becomes a heap job in
//! the injector, every server thread runs the fork-join loop (`sched`)
//! until the root has returned (`fj_done`) and nothing of it is left
//! suspended, and the run ends with the phase-end hook's release.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;

use crate::error::{panic_message, Error, LinkAbort};
use crate::job::HeapJob;
use crate::registry::Command;
use crate::runtime::{Runtime, FORK_JOIN_PHASE};
use crate::sched::Ctx;

impl Runtime {
    /// Runs a fork-join computation: `root` on one processor, its joins
    /// spread over all of them by stealing. Returns `root`'s result.
    ///
    /// It stays on this node, whatever the cluster; to spread a
    /// computation over every node, call
    /// [`Runtime::run_distributed`] on every node.
    ///
    /// **Shared arrays** (hyfi-dsm): on one node, `run` ends with a
    /// release, like a phase. On several nodes it is local (other nodes
    /// need not call it), and a release is collective, so it cannot end
    /// with one: what its filaments wrote becomes visible to the other
    /// nodes at the next collective step — [`Runtime::start`] and
    /// [`Runtime::run_distributed`] begin with a release on several nodes.
    /// Within the node it is visible when `run` returns.
    ///
    /// A panic anywhere in the computation is returned as
    /// [`Error::FilamentPanic`] once every filament has stopped.
    pub fn run<R, F>(&self, root: F) -> Result<R, Error>
    where
        F: FnOnce(&Ctx) -> R + Send,
        R: Send,
    {
        self.check_not_nested()?;
        let _g = self.start_lock.lock().unwrap_or_else(|e| e.into_inner());
        let sh = &*self.shared;
        sh.fj_done.store(false, Ordering::SeqCst);
        let node = self.node();
        let slot = self.dispatch_fork_join(Some(move |ctx: &Ctx| {
            catch_unwind(AssertUnwindSafe(|| root(ctx))).map_err(|p| {
                match p.downcast::<LinkAbort>() {
                    Ok(link) => link.0,
                    Err(p) => Error::FilamentPanic {
                        node,
                        proc: ctx.proc(),
                        during: "fork-join".into(),
                        message: panic_message(&*p),
                    },
                }
            })
        }));
        let released = if self.num_nodes() == 1 {
            self.fork_join_release()
        } else {
            Ok(())
        };
        match slot {
            Some(Ok(r)) => released.map(|()| r),
            Some(Err(e)) => Err(self.failed(e)),
            None => unreachable!("hyfi: fork-join run ended without its root"),
        }
    }

    /// The release that ends a fork-join run, or begins a collective step
    /// after local runs: the phase-end hook's (hyfi-dsm makes what the
    /// filaments wrote to shared arrays visible on every node), with
    /// [`FORK_JOIN_PHASE`] for a phase index, then a new access epoch, as
    /// after a phase. Collective when the runtime spans nodes: every node
    /// must call it at the same point. Call it only between commands.
    pub(crate) fn fork_join_release(&self) -> Result<(), Error> {
        let sh = &*self.shared;
        let released = match sh.phase_end.get() {
            Some(h) => h.end_phase(FORK_JOIN_PHASE, &*sh.link).map_err(Error::Link),
            None => Ok(()),
        };
        sh.next_access_epoch();
        released
    }

    /// Runs one fork-join command on this node's server threads: `root`,
    /// if this node runs one, is queued as the root job; when it returns,
    /// its value is kept and the run is marked done. Returns the root's
    /// value once every server thread has finished the command. The caller
    /// clears `fj_done` first. `root` must not unwind (callers catch).
    pub(crate) fn dispatch_fork_join<R, F>(&self, root: Option<F>) -> Option<R>
    where
        F: FnOnce(&Ctx) -> R + Send,
        R: Send,
    {
        let sh = &*self.shared;
        let mut slot: Option<R> = None;
        if let Some(root) = root {
            let slot_ptr = SlotPtr(&mut slot as *mut Option<R>);
            let shared = self.shared.clone();
            let job = move |ctx: &Ctx| {
                let slot_ptr = slot_ptr;
                let r = root(ctx);
                // SAFETY: `slot` is read only after `dispatch` below has
                // returned, i.e. after this job ended, and only this job
                // writes it.
                unsafe { *slot_ptr.0 = Some(r) };
                shared.fj_done.store(true, Ordering::SeqCst);
                shared.notify_idle();
            };
            let job: Box<dyn FnOnce(&Ctx) + Send + '_> = Box::new(job);
            // SAFETY: lifetime erasure; the job runs and is freed before
            // `dispatch` returns, while everything it borrows is alive.
            let job: Box<dyn FnOnce(&Ctx) + Send + 'static> = unsafe { std::mem::transmute(job) };
            sh.injector.push(HeapJob::into_job_ref(job));
        }
        sh.dispatch(Command::ForkJoin);
        slot
    }
}

pub(crate) struct SlotPtr<T>(pub(crate) *mut T);
impl<T> Clone for SlotPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SlotPtr<T> {}
// SAFETY: the slot is written by exactly one job and read after it ends.
unsafe impl<T: Send> Send for SlotPtr<T> {}
