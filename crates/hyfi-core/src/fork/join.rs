//! The one join path. [`Ctx::join`] and [`Ctx::join_remote`] differ only
//! in their jobs (a closure in a [`StackJob`], a serializable filament in a
//! `RemoteJob`) and in what their branches do when pruned ([`Branches`]:
//! `Pair` here, `RemotePair` with `join_remote` in `crate::remote`, the
//! layer that ships them, which plugs into this path); the decision
//! between a plain call, a fresh stack segment and a real fork, the fork,
//! and taking the forked job back or waiting for it are one code path
//! ([`Ctx::join_with`], [`Ctx::fork_and_run_a`], [`Ctx::take_back_or_wait`]),
//! described in this directory's `README.md`.

use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;

use super::latent::Listed;
use super::unlikely_path;
use crate::crossnode::RemoteFailure;
use crate::job::{JobRef, StackJob};
use crate::latch::Latch;
use crate::registry::WANTED;
use crate::sched::Ctx;
use crate::stack::stack_pointer;

/// The two branches of a join, as the join path sees them: it decides how
/// they run, and they say what running them means.
pub(crate) trait Branches: Sized {
    /// Both results.
    type Out;
    /// Both branches here, as plain calls: pruned, or on a fresh segment.
    fn plain(self, ctx: &Ctx) -> Self::Out;
    /// A real fork: the second branch becomes a job others may take.
    fn fork(self, ctx: &Ctx) -> Self::Out;
    /// A pruned join among the shallowest of the running stack: the second
    /// branch is listed where a thief can claim it while the first runs
    /// (`fork::latent`), and runs here unless one did.
    fn listed(self, ctx: &Ctx) -> Self::Out;
}

/// The branches of [`Ctx::join`]: two closures.
pub(crate) struct Pair<A, B>(pub(crate) A, pub(crate) B);

impl<A, B, RA, RB> Branches for Pair<A, B>
where
    A: FnOnce(&Ctx) -> RA + Send,
    B: FnOnce(&Ctx) -> RB + Send,
    RA: Send,
    RB: Send,
{
    type Out = (RA, RB);

    #[inline(always)]
    fn plain(self, ctx: &Ctx) -> (RA, RB) {
        let Pair(a, b) = self;
        (a(ctx), b(ctx))
    }

    #[inline(always)]
    fn fork(self, ctx: &Ctx) -> (RA, RB) {
        let Pair(a, b) = self;
        ctx.join_real(a, b)
    }

    #[inline]
    fn listed(self, ctx: &Ctx) -> (RA, RB) {
        let Pair(a, b) = self;
        let job_b = StackJob::new(b);
        // SAFETY (both takes below): the job was never published, or was
        // unlisted unclaimed: nobody else has it.
        let take_b = || unsafe { (*job_b.func.get()).take() }.expect("hyfi: own job already taken");
        match ctx.run_first_listed(job_b.as_job_ref(), a) {
            Listed::NotListed(a) => {
                let b = take_b();
                ctx.count_filaments(2);
                (a(ctx), b(ctx))
            }
            Listed::Ran { ra, claimed: true } => {
                job_b.latch.wait();
                match ra {
                    Ok(ra) => (ra, job_b.into_result()),
                    Err(p) => {
                        drop(job_b);
                        resume_unwind(p)
                    }
                }
            }
            Listed::Ran { ra, claimed: false } => {
                let b = take_b();
                let ra = ra.unwrap_or_else(|p| resume_unwind(p));
                ctx.count_filaments(1);
                (ra, ctx.call_inline(b))
            }
        }
    }
}

impl Ctx {
    /// The prologue of every join: plain calls if pruned, else out of line.
    ///
    /// The fast path is a load, a compare and the two calls: plain calls
    /// unless a fork is wanted or the stack is nearly full (see
    /// `Ctx::limit`). Everything else is out of line.
    #[inline(always)]
    pub(crate) fn join_with<J: Branches>(&self, j: J) -> J::Out {
        if self.pruned_here() {
            // Among the shallowest pruned joins of this stack: list the
            // second branch for thieves (`fork::latent`), out of line.
            if self.latent_armed.get() {
                unlikely_path();
                return self.join_listed(j);
            }
            self.count_filaments(2);
            return j.plain(self);
        }
        unlikely_path();
        self.join_cold(j)
    }

    /// The pruning test of a join: `true` to make plain calls.
    #[inline(always)]
    pub(crate) fn pruned_here(&self) -> bool {
        stack_pointer() >= self.limit.load(Ordering::Relaxed)
    }

    /// A pruned join that lists its second branch (`fork::latent`).
    #[inline(never)]
    pub(crate) fn join_listed<J: Branches>(&self, j: J) -> J::Out {
        j.listed(self)
    }

    /// A join that is not pruned: a fork is wanted, or the stack is nearly
    /// full (then the two calls run on a fresh segment). Out of line but
    /// not `#[cold]`: calls made in a cold function are not inlined, and a
    /// real fork needs its pieces inlined; the branch to it is marked
    /// unlikely instead ([`unlikely_path`]).
    #[inline(never)]
    fn join_cold<J: Branches>(&self, j: J) -> J::Out {
        if self.limit.load(Ordering::Relaxed) != WANTED {
            return self.call_on_new_segment(|c| {
                c.count_filaments(2);
                j.plain(c)
            });
        }
        self.check_abort();
        j.fork(self)
    }

    #[inline]
    pub(crate) fn join_real<A, B, RA, RB>(&self, a: A, b: B) -> (RA, RB)
    where
        A: FnOnce(&Ctx) -> RA + Send,
        B: FnOnce(&Ctx) -> RB + Send,
        RA: Send,
        RB: Send,
    {
        let job_b = StackJob::new(b);
        let job_ref = job_b.as_job_ref();
        let ra = self.fork_and_run_a(job_ref, false, a);
        let got_back = self.take_back_or_wait(job_ref, &job_b.latch);
        if got_back {
            // SAFETY: we popped our own job back: nobody else has it.
            let f = unsafe { (*job_b.func.get()).take() }.expect("hyfi: own job already taken");
            let ra = match ra {
                Ok(v) => v,
                Err(p) => resume_unwind(p),
            };
            self.count_filaments(1);
            return (ra, self.call_inline(f));
        }
        let ra = match ra {
            Ok(v) => v,
            Err(p) => {
                // b has finished (the latch is set); drop its result.
                drop(job_b);
                resume_unwind(p)
            }
        };
        (ra, job_b.into_result())
    }

    /// The fork of a real join: pushes `job` (branch b) on the deque, then
    /// runs `a` here, catching its panic (b must be joined first).
    /// `portable`: `job` may run on another node (a `join_remote`).
    #[inline]
    pub(crate) fn fork_and_run_a<RA>(
        &self,
        job: JobRef,
        portable: bool,
        a: impl FnOnce(&Ctx) -> RA,
    ) -> Result<RA, Box<dyn Any + Send>> {
        self.deque.push(job);
        self.stats.forks.set(self.stats.forks.get() + 1);
        // One want buys one real fork: this deque now holds a job to steal,
        // so go back to pruning. A thief asks again when it takes the job
        // (or fails a steal round), so a descheduled thief costs at most one
        // real fork, not a fork at every join until it runs.
        self.clear_want();
        // A node of this host asked through shared memory: answer it from
        // here if what was just forked can go there. (A plain join's fork
        // cannot; its request waits for a portable fork or goes as a
        // message. Making every plain join fork until then would cost a
        // program of plain joins a real fork per join while any node asks.)
        if portable && self.shared.fj.host.as_ref().is_some_and(|h| h.pending()) {
            self.answer_host_requests();
        }
        let sh = &*self.shared;
        if sh.idle.load(Ordering::SeqCst) > 0 {
            sh.notify_idle();
        }
        self.count_filaments(1);
        catch_unwind(AssertUnwindSafe(|| self.call_inline(a)))
    }

    /// Answers the steal requests that other nodes of this host made
    /// through shared memory, if any wait (`remote::host`): out of line,
    /// on a real fork or an idle processor's path only.
    #[inline(never)]
    pub(crate) fn answer_host_requests(&self) {
        let sh = &*self.shared;
        if let (Some(host), Some(stealing)) = (&sh.fj.host, sh.fj.stealing.get()) {
            while host.pending() && stealing.answer_host_request(host) {}
        }
    }

    /// After branch a: takes `job` back from the deque (`true`: run it
    /// here), or waits until whoever stole it, on this node or another,
    /// has set `latch` (`false`).
    #[inline]
    pub(crate) fn take_back_or_wait(&self, job: JobRef, latch: &Latch) -> bool {
        loop {
            if latch.probe() {
                return false;
            }
            match self.deque.pop() {
                Some(j) if j == job => {
                    if self.multi || self.nodes > 1 {
                        self.want_fork();
                    }
                    return true;
                }
                // A job of a frame below ours (cannot happen with the deque
                // discipline, but running it is always correct).
                // SAFETY: the job-lifetime invariant (see `crate::job`): we popped it.
                Some(j) => unsafe { j.execute(self) },
                None => {
                    latch.wait();
                    return false;
                }
            }
        }
    }

    /// Unwinds at once if the run was aborted (a lost node): every join
    /// takes this slow path then (the abort asks every processor for a
    /// fork), so a computation that can no longer finish stops quickly.
    #[inline]
    pub(crate) fn check_abort(&self) {
        if self.shared.fj.abort.load(Ordering::Relaxed) {
            abort_unwind(self);
        }
    }
}

/// Unwinds the calling filament with the cluster's failure.
#[cold]
#[inline(never)]
fn abort_unwind(ctx: &Ctx) -> ! {
    resume_unwind(Box::new(RemoteFailure(ctx.shared.fj.failure())))
}
