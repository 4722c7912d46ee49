//! Jobs: the type-erased units of fork-join work that deques, injectors
//! and incoming lists hold, and the one rule that makes them sound.
//!
//! A fork pushes a [`JobRef`]: a raw pointer to a job and its type's
//! [`JobVTable`] (the function that runs it and, for a serializable job,
//! how to ship it to another node).
//! Erasing the type lets one deque hold every kind of job, and lets a job
//! live where it is cheapest: in the joining filthread's frame
//! ([`StackJob`], or `RemoteJob` in `crate::remote::join`, whose shipping
//! table is a [`RemoteVTable`]) or, for a root or a filament that came from
//! another node, on the heap ([`HeapJob`]).
//!
//! # The job-lifetime invariant
//!
//! Every `unsafe` use of a job pointer in the crate rests on this, and cites
//! it as "the job-lifetime invariant":
//!
//! 1. **One owner at a time.** A `JobRef` is published once (pushed on one
//!    deque, injector or incoming list, or listed in its processor's
//!    latent slots, `fork::latent`) and taken from there exactly once:
//!    popped back (or unlisted) by its joiner, stolen or claimed by another
//!    processor, or exported by the donor of a cross-node steal. Whoever took it alone may run,
//!    ship or complete it; each job is executed or completed once.
//! 2. **The frame outlives the job.** A stack job lives in its joiner's
//!    frame, and the joiner does not leave that frame (not even by
//!    unwinding) until it took the job back or the job's [`Latch`] is set.
//!    A shipped job stays in the node's pending table until its result (or
//!    the node's failure) completes it, which sets the latch; the joiner
//!    waits for that too. A heap job owns itself and is freed by running it;
//!    the root's runner (see `fork::run`) waits for the whole run to end.
//! 3. **Nothing after the latch.** Setting the latch is the last thing a
//!    runner or completer does with the job: once it is set the joiner may
//!    return and free the frame ([`Latch::set`]).
//! 4. **Send.** A job's closure, argument and result are `Send`, so running
//!    it on another thread (or node) is allowed.

use std::any::Any;
use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

use crate::crossnode::RemoteVTable;
use crate::latch::Latch;
use crate::sched::Ctx;

/// A type-erased pointer to a job and its kind's [`JobVTable`].
///
/// Two words, as rayon's: an `Option<JobRef>` then comes back from a
/// deque's `pop` in two registers. With the function and the shipping table
/// as three words it came back through memory, which the joiner read back
/// at once, and a push wrote three words: a real fork cost 1.18× a
/// `rayon::join`, against about 1.0× now (BENCHMARKS.md, "a real fork at
/// `rayon::join`'s cost").
#[derive(Clone, Copy)]
pub(crate) struct JobRef {
    ptr: *const (),
    vtable: &'static JobVTable,
}

// Two words, so that `pop` returns it in registers (see `JobRef`).
const _: () = assert!(std::mem::size_of::<Option<JobRef>>() == 2 * std::mem::size_of::<usize>());

/// What a kind of job does: one static table per job type.
pub(crate) struct JobVTable {
    /// Runs the job at the pointer (see [`JobRef::execute`]).
    pub(crate) exec: unsafe fn(*const (), &Ctx),
    /// For a serializable job ([`Ctx::join_remote`]): how to ship it.
    pub(crate) remote: Option<RemoteVTable>,
}

impl std::fmt::Debug for JobRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "JobRef({:p}, remote: {})",
            self.ptr,
            self.vtable.remote.is_some()
        )
    }
}

// SAFETY: the job-lifetime invariant (module docs): one owner at a time,
// and the job's closure, argument and result are Send.
unsafe impl Send for JobRef {}

impl PartialEq for JobRef {
    /// Jobs are identified by their address alone.
    fn eq(&self, o: &Self) -> bool {
        std::ptr::eq(self.ptr, o.ptr)
    }
}

impl JobRef {
    /// The job at `ptr`, of the kind `vtable` describes.
    pub(crate) fn new(ptr: *const (), vtable: &'static JobVTable) -> JobRef {
        JobRef { ptr, vtable }
    }

    /// The job's address and shipping table, if it may leave the node.
    pub(crate) fn portable(self) -> Option<(*const (), &'static RemoteVTable)> {
        self.vtable.remote.as_ref().map(|v| (self.ptr, v))
    }

    /// Runs the job.
    ///
    /// # Safety
    /// The caller owns the job under the job-lifetime invariant (module
    /// docs): it is alive and not yet executed.
    pub(crate) unsafe fn execute(self, ctx: &Ctx) {
        (self.vtable.exec)(self.ptr, ctx)
    }
}

/// A job that lives in the joining filthread's stack frame.
pub(crate) struct StackJob<F, R> {
    pub(crate) func: UnsafeCell<Option<F>>,
    result: UnsafeCell<Option<Result<R, Box<dyn Any + Send>>>>,
    pub(crate) latch: Latch,
}

impl<F, R> StackJob<F, R>
where
    F: FnOnce(&Ctx) -> R + Send,
    R: Send,
{
    pub(crate) fn new(f: F) -> Self {
        StackJob {
            func: UnsafeCell::new(Some(f)),
            result: UnsafeCell::new(None),
            latch: Latch::new(),
        }
    }

    const VTABLE: JobVTable = JobVTable {
        exec: Self::execute,
        remote: None,
    };

    pub(crate) fn as_job_ref(&self) -> JobRef {
        JobRef::new(self as *const Self as *const (), &Self::VTABLE)
    }

    /// Runs the job where it was taken (the joiner is waiting for the latch).
    ///
    /// # Safety
    /// `this` points at a live `StackJob<F, R>` the caller owns (the
    /// job-lifetime invariant, module docs).
    unsafe fn execute(this: *const (), ctx: &Ctx) {
        let this = &*(this as *const Self);
        let f = (*this.func.get())
            .take()
            .expect("hyfi: fork-join job executed twice");
        let r = catch_unwind(AssertUnwindSafe(|| {
            ctx.count_filaments(1);
            ctx.call_inline(f)
        }));
        *this.result.get() = Some(r);
        Latch::set(&this.latch);
    }

    pub(crate) fn into_result(self) -> R {
        match self.result.into_inner() {
            Some(Ok(r)) => r,
            Some(Err(p)) => resume_unwind(p),
            None => unreachable!("hyfi: joined a job that did not run"),
        }
    }
}

/// A job on the heap: the root of a fork-join run.
pub(crate) struct HeapJob<F> {
    func: F,
}

impl<F: FnOnce(&Ctx) + Send> HeapJob<F> {
    const VTABLE: JobVTable = JobVTable {
        exec: Self::execute,
        remote: None,
    };

    /// Boxes `f` as a job that frees itself when run.
    pub(crate) fn into_job_ref(f: F) -> JobRef {
        let b = Box::new(HeapJob { func: f });
        JobRef::new(Box::into_raw(b) as *const (), &Self::VTABLE)
    }

    /// # Safety
    /// `this` came from [`HeapJob::into_job_ref`] and is run once (the
    /// job-lifetime invariant, module docs); running it frees it.
    unsafe fn execute(this: *const (), ctx: &Ctx) {
        let b = Box::from_raw(this as *mut Self);
        (b.func)(ctx)
    }
}

/// Runs a job taken from a deque, an injector or an incoming list.
pub(crate) fn unsafe_execute(job: JobRef, ctx: &Ctx) {
    // SAFETY: the job-lifetime invariant (module docs): the caller took
    // `job` from its queue, so it owns it and the job is alive.
    unsafe { job.execute(ctx) }
}
