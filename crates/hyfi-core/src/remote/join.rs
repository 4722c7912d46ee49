//! `join_remote`: the join whose forked branch is a serializable filament
//! ([`RemoteFn`]) that may run on another node, on the one join path of
//! `crate::fork`. Here are what its branches do ([`RemotePair`], a
//! `fork::Branches`: as plain calls, with the pruned copy; as a real
//! fork, with start-up distribution), its job ([`RemoteJob`], which lives
//! in the joiner's frame under the job-lifetime invariant of `crate::job`),
//! and [`Fork`], the trait through which a filament generic over [`Ctx`]
//! and [`Pruned`] calls it. They are here, not in `fork`, because a real
//! `join_remote` fork is the cross-node layer's business (start-up slots,
//! shipping); `fork` knows only the join path they plug into.

use std::any::Any;
use std::cell::{Cell, UnsafeCell};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::balance::send_to_slot;
use super::startup;
use super::RemoteFn;
use crate::crossnode::{CodecError, Encoded, Failure, RemoteFailure, RemoteVTable, Slot};
use crate::fork::{Branches, Listed, Pruned};
use crate::job::{JobRef, JobVTable};
use crate::latch::Latch;
use crate::sched::Ctx;

/// What filament code forks through: a processor's [`Ctx`], or [`Pruned`],
/// its view in a subtree that pruning runs as plain calls.
///
/// Write a recursive filament generic over it (`ctx: &impl Fork`) and
/// declare its [`RemoteFn`] [`with_pruned`](RemoteFn::with_pruned): then the
/// compiler makes two copies of it. The copy for `Ctx` forks (or prunes) at
/// every join as usual; the copy for `Pruned` is the plain recursion, with no
/// pruning test, and runs the small subtrees that pruning would have run as
/// plain calls anyway (a joined branch whose sibling took a few tens of
/// microseconds). Idle processors find work in the joins of the `Ctx` copy,
/// above those subtrees.
///
/// ```
/// use hyfi::{Config, Fork, RemoteFn, Runtime};
///
/// fn fib(ctx: &impl Fork, n: u64) -> u64 {
///     if n < 2 { return n; }
///     let (a, b) = ctx.join_remote(|c| fib(c, n - 1), &FIB, n - 2);
///     a + b
/// }
/// static FIB: RemoteFn<u64, u64> = RemoteFn::new("doc::fork_fib", fib).with_pruned(fib);
///
/// FIB.register()?;
/// let rt = Runtime::new(Config::new().procs(2).pin(false))?;
/// assert_eq!(rt.run_distributed(|ctx| fib(ctx, 25))?, 75025);
/// # Ok::<(), hyfi::Error>(())
/// ```
///
/// The trait is sealed: `Ctx` and `Pruned` are its only implementations.
pub trait Fork: sealed::Sealed {
    /// The processor's context (architecture queries, reductions, views).
    fn ctx(&self) -> &Ctx;

    /// [`Ctx::join`]: runs `a` and `b`, potentially in parallel.
    fn join<A, B, RA, RB>(&self, a: A, b: B) -> (RA, RB)
    where
        A: FnOnce(&Self) -> RA + Send,
        B: FnOnce(&Self) -> RB + Send,
        RA: Send,
        RB: Send;

    /// [`Ctx::join_remote`]: runs `a` here and `f(b)` potentially in
    /// parallel, on this node or another.
    fn join_remote<A, RA, B, RB>(&self, a: A, f: &'static RemoteFn<B, RB>, b: B) -> (RA, RB)
    where
        A: FnOnce(&Self) -> RA + Send,
        RA: Send,
        B: Serialize + DeserializeOwned + Send + 'static,
        RB: Serialize + DeserializeOwned + Send + 'static;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for crate::Ctx {}
    impl Sealed for crate::fork::Pruned {}
}

impl Fork for Ctx {
    #[inline(always)]
    fn ctx(&self) -> &Ctx {
        self
    }

    #[inline(always)]
    fn join<A, B, RA, RB>(&self, a: A, b: B) -> (RA, RB)
    where
        A: FnOnce(&Self) -> RA + Send,
        B: FnOnce(&Self) -> RB + Send,
        RA: Send,
        RB: Send,
    {
        Ctx::join(self, a, b)
    }

    #[inline(always)]
    fn join_remote<A, RA, B, RB>(&self, a: A, f: &'static RemoteFn<B, RB>, b: B) -> (RA, RB)
    where
        A: FnOnce(&Self) -> RA + Send,
        RA: Send,
        B: Serialize + DeserializeOwned + Send + 'static,
        RB: Serialize + DeserializeOwned + Send + 'static,
    {
        Ctx::join_remote(self, a, f, b)
    }
}

impl Fork for Pruned {
    #[inline(always)]
    fn ctx(&self) -> &Ctx {
        Pruned::ctx(self)
    }

    #[inline(always)]
    fn join<A, B, RA, RB>(&self, a: A, b: B) -> (RA, RB)
    where
        A: FnOnce(&Self) -> RA + Send,
        B: FnOnce(&Self) -> RB + Send,
        RA: Send,
        RB: Send,
    {
        Pruned::join(self, a, b)
    }

    #[inline(always)]
    fn join_remote<A, RA, B, RB>(&self, a: A, f: &'static RemoteFn<B, RB>, b: B) -> (RA, RB)
    where
        A: FnOnce(&Self) -> RA + Send,
        RA: Send,
        B: Serialize + DeserializeOwned + Send + 'static,
        RB: Serialize + DeserializeOwned + Send + 'static,
    {
        Pruned::join_remote(self, a, f, b)
    }
}

impl Pruned {
    /// [`Ctx::join_remote`] where pruning already decided: `a`, then `f(b)`
    /// (its pruned clone if it has one), here.
    #[inline(always)]
    pub fn join_remote<A, RA, B, RB>(&self, a: A, f: &'static RemoteFn<B, RB>, b: B) -> (RA, RB)
    where
        A: FnOnce(&Pruned) -> RA + Send,
        RA: Send,
        B: Serialize + DeserializeOwned + Send + 'static,
        RB: Serialize + DeserializeOwned + Send + 'static,
    {
        (a(Pruned::VIEW), f.call_pruned(Pruned::VIEW, b))
    }
}

/// The branches of [`Ctx::join_remote`]: a closure, and a serializable
/// filament `f(b)`.
pub(crate) struct RemotePair<A, B: 'static, RB: 'static> {
    pub(crate) a: A,
    pub(crate) f: &'static RemoteFn<B, RB>,
    pub(crate) b: B,
}

impl<A, RA, B, RB> Branches for RemotePair<A, B, RB>
where
    A: FnOnce(&Ctx) -> RA + Send,
    RA: Send,
    B: Serialize + DeserializeOwned + Send + 'static,
    RB: Serialize + DeserializeOwned + Send + 'static,
{
    type Out = (RA, RB);

    #[inline(always)]
    fn plain(self, ctx: &Ctx) -> (RA, RB) {
        let RemotePair { a, f, b } = self;
        if f.pruned.is_some() {
            return ctx.join_remote_then_pruned(a, f, b);
        }
        (a(ctx), (f.f)(ctx, b))
    }

    #[inline(always)]
    fn fork(self, ctx: &Ctx) -> (RA, RB) {
        let RemotePair { a, f, b } = self;
        ctx.join_remote_real(a, f, b)
    }

    #[inline]
    fn listed(self, ctx: &Ctx) -> (RA, RB) {
        let RemotePair { a, f, b } = self;
        let job = RemoteJob {
            f,
            args: UnsafeCell::new(Some(b)),
            result: UnsafeCell::new(None),
            latch: Latch::new(),
            startup: Cell::new(None),
        };
        // SAFETY (both takes below): the job was never published, or was
        // unlisted unclaimed: nobody else has it.
        let take_b = || unsafe { (*job.args.get()).take() }.expect("hyfi: own job already taken");
        // As `join_remote_then_pruned`: `b` may run as the pruned copy if
        // `a` was quick (`run_first_listed` counts `a` before it runs it).
        let (t, n) = ctx.mark();
        match ctx.run_first_listed(job.as_job_ref(), a) {
            Listed::NotListed(a) => {
                let b = take_b();
                ctx.count_filaments(2);
                RemotePair { a, f, b }.plain(ctx)
            }
            Listed::Ran { ra, claimed: true } => {
                // Claimed here or by another node: wait for its outcome.
                job.latch.wait();
                match ra {
                    Ok(ra) => (ra, job.into_result()),
                    Err(p) => {
                        drop(job);
                        resume_unwind(p)
                    }
                }
            }
            Listed::Ran { ra, claimed: false } => {
                let quick = f.pruned.is_some() && ctx.sibling_may_run_pruned((t, n + 1));
                let b = take_b();
                let ra = ra.unwrap_or_else(|p| resume_unwind(p));
                ctx.count_filaments(1);
                if quick {
                    return (
                        ra,
                        ctx.call_inline(|c| c.run_pruned(|p| f.call_pruned(p, b))),
                    );
                }
                (ra, ctx.call_inline(|c| (f.f)(c, b)))
            }
        }
    }
}

impl Ctx {
    /// Runs `a` here and the serializable filament `f(b)` potentially in
    /// parallel, on this node or on another one, and returns both results:
    /// [`Ctx::join`] whose forked branch may leave the node.
    ///
    /// `f` must be registered on every node ([`RemoteFn::register`]); its
    /// argument is encoded only if another node takes it. Panics propagate
    /// as in `join`, from whichever node ran the filament.
    #[inline]
    pub fn join_remote<A, RA, B, RB>(&self, a: A, f: &'static RemoteFn<B, RB>, b: B) -> (RA, RB)
    where
        A: FnOnce(&Ctx) -> RA + Send,
        RA: Send,
        B: Serialize + DeserializeOwned + Send + 'static,
        RB: Serialize + DeserializeOwned + Send + 'static,
    {
        // The same pruning test as `join`: a load, a compare and the calls.
        self.join_with(RemotePair { a, f, b })
    }

    /// A pruned join of a function with a pruned copy: `a` here, then `b`
    /// as the pruned copy if `a` was quick (see
    /// [`SEQ_TICKS`](crate::fork::SEQ_TICKS)), else as this copy, which goes
    /// on testing for pruning at its joins.
    #[inline(always)]
    pub(crate) fn join_remote_then_pruned<A, RA, B, RB>(
        &self,
        a: A,
        f: &'static RemoteFn<B, RB>,
        b: B,
    ) -> (RA, RB)
    where
        A: FnOnce(&Ctx) -> RA + Send,
    {
        let since = self.mark();
        let ra = a(self);
        if self.sibling_may_run_pruned(since) {
            (ra, self.run_pruned(|p| f.call_pruned(p, b)))
        } else {
            (ra, (f.f)(self, b))
        }
    }

    #[inline]
    pub(crate) fn join_remote_real<A, RA, B, RB>(
        &self,
        a: A,
        f: &'static RemoteFn<B, RB>,
        b: B,
    ) -> (RA, RB)
    where
        A: FnOnce(&Ctx) -> RA + Send,
        RA: Send,
        B: Serialize + DeserializeOwned + Send + 'static,
        RB: Serialize + DeserializeOwned + Send + 'static,
    {
        let job = RemoteJob {
            f,
            args: UnsafeCell::new(Some(b)),
            result: UnsafeCell::new(None),
            latch: Latch::new(),
            startup: Cell::new(None),
        };
        // Start-up distribution: the first forks go to their slots of the
        // logical tree, not to this deque.
        if let Some(child) = startup::next_startup_child(self) {
            job.startup.set(Some(child));
            send_to_slot(self, job.as_job_ref(), child);
            self.count_filaments(1);
            let ra = catch_unwind(AssertUnwindSafe(|| self.call_inline(a)));
            // The job points into this frame: wait for it even if `a` panicked.
            job.latch.wait();
            return match ra {
                Ok(ra) => (ra, job.into_result()),
                Err(p) => resume_unwind(p),
            };
        }
        let job_ref = job.as_job_ref();
        // Whether `b`, taken back, may run as the pruned copy: only if `a`
        // was quick, and never with pruning off (every join forks then).
        let copy = f.pruned.is_some() && self.prune;
        let since = if copy {
            // `fork_and_run_a` counts `a` as a filament before it runs it.
            let (t, n) = self.mark();
            (t, n + 1)
        } else {
            (0, 0)
        };
        let ra = self.fork_and_run_a(job_ref, true, a);
        let quick = copy && self.sibling_may_run_pruned(since);
        // Take b back, or wait for whoever stole it (here or on another node).
        let got_back = self.take_back_or_wait(job_ref, &job.latch);
        let ra = match ra {
            Ok(v) => v,
            Err(p) => {
                if got_back {
                    // SAFETY: we own the job again; nobody else touches it.
                    unsafe { (*job.args.get()).take() };
                } else {
                    drop(job);
                }
                resume_unwind(p)
            }
        };
        if got_back {
            // SAFETY: popped back from our own deque: we own the job again.
            let b = unsafe { (*job.args.get()).take() }.expect("hyfi: own job already taken");
            self.count_filaments(1);
            if quick {
                return (
                    ra,
                    self.call_inline(|c| c.run_pruned(|p| f.call_pruned(p, b))),
                );
            }
            return (ra, self.call_inline(|c| (f.f)(c, b)));
        }
        (ra, job.into_result())
    }
}

/// A serializable fork-join job in the joining filthread's frame.
pub(crate) struct RemoteJob<B: 'static, RB: 'static> {
    pub(crate) f: &'static RemoteFn<B, RB>,
    pub(crate) args: UnsafeCell<Option<B>>,
    pub(crate) result: UnsafeCell<Option<Result<RB, Box<dyn Any + Send>>>>,
    pub(crate) latch: Latch,
    /// Set for a start-up job: the slot it takes over.
    pub(crate) startup: Cell<Option<Slot>>,
}

impl<B, RB> RemoteJob<B, RB>
where
    B: Serialize + DeserializeOwned + Send + 'static,
    RB: Serialize + DeserializeOwned + Send + 'static,
{
    const VTABLE: JobVTable = JobVTable {
        exec: Self::execute,
        remote: Some(RemoteVTable {
            export: Self::export,
            complete: Self::complete,
            startup: Self::startup_of,
        }),
    };

    pub(crate) fn as_job_ref(&self) -> JobRef {
        JobRef::new(self as *const Self as *const (), &Self::VTABLE)
    }

    /// Runs the job here (taken from a deque or an incoming list).
    ///
    /// # Safety
    /// `this` points at a live `RemoteJob<B, RB>` the caller owns (the
    /// job-lifetime invariant, module docs).
    unsafe fn execute(this: *const (), ctx: &Ctx) {
        let this = &*(this as *const Self);
        let a = (*this.args.get())
            .take()
            .expect("hyfi: fork-join job executed twice");
        let slot = this.startup.get();
        let r = startup::with_startup(ctx, slot, || {
            catch_unwind(AssertUnwindSafe(|| {
                ctx.count_filaments(1);
                ctx.call_inline(|c| (this.f.f)(c, a))
            }))
        });
        *this.result.get() = Some(r);
        Latch::set(&this.latch);
    }

    /// Encodes the job's argument for another node.
    ///
    /// # Safety
    /// As for [`Self::execute`]: the caller owns the job until it is
    /// completed.
    unsafe fn export(this: *const ()) -> Result<Encoded, CodecError> {
        let this = &*(this as *const Self);
        let args = (*this.args.get()).as_ref().ok_or(CodecError::AlreadyRan)?;
        let bytes = bincode::serialize(args).map_err(CodecError::EncodeArgument)?;
        // Shipped: the argument now lives in `bytes`.
        (*this.args.get()).take();
        Ok((this.f.name, bytes))
    }

    /// Stores what the node that ran the job sent back and sets the latch.
    ///
    /// # Safety
    /// `this` was exported and removed from the pending table by the
    /// caller, so this is its only completion (the job-lifetime invariant,
    /// module docs); nothing touches `this` after the latch is set.
    unsafe fn complete(this: *const (), outcome: Result<Vec<u8>, Failure>, node: usize) {
        let this = &*(this as *const Self);
        let r = match outcome {
            Ok(bytes) => bincode::deserialize::<RB>(&bytes).map_err(|e| {
                Box::new(RemoteFailure(Failure::Codec {
                    node,
                    name: this.f.name.to_string(),
                    why: format!("decoding its result: {e}"),
                })) as Box<dyn Any + Send>
            }),
            Err(f) => Err(Box::new(RemoteFailure(f)) as Box<dyn Any + Send>),
        };
        *this.result.get() = Some(r);
        Latch::set(&this.latch);
    }

    /// The start-up slot the job carries.
    ///
    /// # Safety
    /// As for [`Self::export`].
    unsafe fn startup_of(this: *const ()) -> Option<Slot> {
        (*(this as *const Self)).startup.get()
    }

    pub(crate) fn into_result(self) -> RB {
        match self.result.into_inner() {
            Some(Ok(r)) => r,
            Some(Err(p)) => resume_unwind(p),
            None => unreachable!("hyfi: joined a job that did not run"),
        }
    }
}
