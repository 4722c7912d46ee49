//! Fork-join filaments: `join`, its n-way form, pruning, and the jobs and
//! latches they are made of.
//!
//! `ctx.join(a, b)` puts `b` on this processor's deque, runs `a`, then takes
//! `b` back and runs it, unless another processor stole it; then the joining
//! filthread suspends until the thief sets `b`'s latch, and the server thread
//! runs other work meanwhile. It never blocks the OS thread.
//!
//! **Pruning** (paper §4.4): once every processor has work, forks become plain
//! calls. Each processor has a *fork wanted* state, folded with the stack
//! check into one word (`Ctx::limit`) so that a pruned join costs one load and
//! one compare. A fork is wanted when some processor goes idle, when a thief
//! took this processor's job, and when this processor takes its own job
//! back; one want buys one real fork. So a busy node keeps about one
//! stealable job (the shallowest) on each deque and forks nothing else.
//! The slow paths (a real fork, a new stack segment) are out of line and
//! cold: a pruned join is the test, a counter add and the two calls.
//!
//! **The pruned copy** ([`Fork`], [`Pruned`]): the test itself stops the
//! compiler from turning a recursion's last call into a loop, which the
//! plain recursion gets (fib's `fib(n - 1) + fib(n - 2)` loses half its
//! speed to that). A filament written generic over [`Fork`] whose
//! [`RemoteFn`] names its pruned copy runs small subtrees as that copy, the
//! plain recursion: a pruned `join_remote` whose first branch took less than
//! [`SEQ_TICKS`] runs its forked branch so. Idle processors find work at
//! the joins of the other copy, above those subtrees.
//!
//! **Deep recursion**: before running a branch inline, a join checks the free
//! stack; below a red zone it runs the branch on a fresh pooled stack segment,
//! so recursion through joins is bounded by memory, not by the stack size.
//!
//! ```
//! use hyfi_core::{Config, Ctx, Runtime};
//!
//! fn fib(ctx: &Ctx, n: u64) -> u64 {
//!     if n < 2 { return n; }
//!     let (a, b) = ctx.join(|c| fib(c, n - 1), |c| fib(c, n - 2));
//!     a + b
//! }
//! let rt = Runtime::new(Config::new().procs(2).pin(false)).unwrap();
//! assert_eq!(rt.run(|ctx| fib(ctx, 20)).unwrap(), 6765);
//! ```

use std::any::Any;
use std::cell::UnsafeCell;
use std::ops::Deref;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU8, Ordering};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::filthread::{self, Waker};
use crate::remote::{RemoteFn, RemoteVTable};
use crate::runtime::WANTED;
use crate::stack::{enter_guard, StackBounds};
use crate::worker::Ctx;

/// A type-erased pointer to a job and the function that runs it; for a
/// serializable job ([`Ctx::join_remote`]), also how to ship it.
#[derive(Clone, Copy)]
pub(crate) struct JobRef {
    ptr: *const (),
    exec: unsafe fn(*const (), &Ctx),
    remote: Option<&'static RemoteVTable>,
}

impl std::fmt::Debug for JobRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "JobRef({:p}, remote: {})",
            self.ptr,
            self.remote.is_some()
        )
    }
}

// SAFETY: a JobRef is handed to exactly one thread (the deque guarantees it)
// and points at a job whose closure and result are Send.
unsafe impl Send for JobRef {}

impl PartialEq for JobRef {
    /// Jobs are identified by their address alone.
    fn eq(&self, o: &Self) -> bool {
        std::ptr::eq(self.ptr, o.ptr)
    }
}

impl JobRef {
    /// A serializable job: `ptr` is a `RemoteJob` that `vtable` knows how to ship.
    pub(crate) fn remote(
        ptr: *const (),
        exec: unsafe fn(*const (), &Ctx),
        vtable: &'static RemoteVTable,
    ) -> JobRef {
        JobRef {
            ptr,
            exec,
            remote: Some(vtable),
        }
    }

    /// The job's address and shipping table, if it may leave the node.
    pub(crate) fn portable(self) -> Option<(*const (), &'static RemoteVTable)> {
        self.remote.map(|v| (self.ptr, v))
    }

    /// Runs the job.
    ///
    /// # Safety
    /// The job must still be alive and not yet executed.
    pub(crate) unsafe fn execute(self, ctx: &Ctx) {
        (self.exec)(self.ptr, ctx)
    }
}

const UNSET: u8 = 0;
const WAITING: u8 = 1;
const SET: u8 = 2;

/// Signals that a job has finished, waking the joiner if it suspended.
pub(crate) struct Latch {
    state: AtomicU8,
    waker: UnsafeCell<Option<Waker>>,
}

impl Latch {
    pub(crate) fn new() -> Self {
        Latch {
            state: AtomicU8::new(UNSET),
            waker: UnsafeCell::new(None),
        }
    }

    #[inline]
    pub(crate) fn probe(&self) -> bool {
        self.state.load(Ordering::Acquire) == SET
    }

    /// Sets the latch.
    ///
    /// # Safety
    /// `this` must be alive on entry. Once the state is `SET`, the joiner may
    /// proceed and free the latch, so nothing here touches it afterwards,
    /// except in the `WAITING` case where the joiner is suspended until the
    /// waker we take is woken.
    pub(crate) unsafe fn set(this: *const Latch) {
        let prev = (*this).state.swap(SET, Ordering::AcqRel);
        if prev == WAITING {
            let w = (*(*this).waker.get()).take();
            if let Some(w) = w {
                w.wake();
            }
        }
    }

    /// Waits for the latch: suspends the calling filthread (or blocks the
    /// thread, off a filthread).
    pub(crate) fn wait(&self) {
        if self.probe() {
            return;
        }
        let _w = crate::waits::waiting(|_| "a stolen child to finish (a join)".into(), [0; 3]);
        filthread::suspend(|w| {
            // SAFETY: only the joiner writes the slot, before publishing
            // WAITING; the setter reads it only after observing WAITING.
            unsafe { *self.waker.get() = Some(w) };
            match self
                .state
                .compare_exchange(UNSET, WAITING, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => true,
                Err(_) => {
                    // Already set: nobody will read the slot; reclaim it.
                    unsafe { (*self.waker.get()).take() };
                    false
                }
            }
        });
        debug_assert!(self.probe());
    }
}

/// A job that lives in the joining filthread's stack frame.
struct StackJob<F, R> {
    func: UnsafeCell<Option<F>>,
    result: UnsafeCell<Option<Result<R, Box<dyn Any + Send>>>>,
    latch: Latch,
}

impl<F, R> StackJob<F, R>
where
    F: FnOnce(&Ctx) -> R + Send,
    R: Send,
{
    fn new(f: F) -> Self {
        StackJob {
            func: UnsafeCell::new(Some(f)),
            result: UnsafeCell::new(None),
            latch: Latch::new(),
        }
    }

    fn as_job_ref(&self) -> JobRef {
        JobRef {
            ptr: self as *const Self as *const (),
            exec: Self::execute,
            remote: None,
        }
    }

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

    fn into_result(self) -> R {
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
    /// Boxes `f` as a job that frees itself when run.
    pub(crate) fn into_job_ref(f: F) -> JobRef {
        let b = Box::new(HeapJob { func: f });
        JobRef {
            ptr: Box::into_raw(b) as *const (),
            exec: Self::execute,
            remote: None,
        }
    }

    unsafe fn execute(this: *const (), ctx: &Ctx) {
        let b = Box::from_raw(this as *mut Self);
        (b.func)(ctx)
    }
}

/// Marks the path that calls it as unlikely (for block layout), without
/// making the function it calls cold.
#[cold]
#[inline(always)]
pub(crate) fn unlikely_path() {}

#[inline(always)]
pub(crate) fn stack_pointer() -> usize {
    let sp: usize;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: reads the stack pointer register; no memory is touched.
    unsafe {
        std::arch::asm!("mov {}, rsp", out(reg) sp, options(nomem, nostack, preserves_flags))
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: as above.
    unsafe {
        std::arch::asm!("mov {}, sp", out(reg) sp, options(nomem, nostack, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let x = 0u8;
        sp = std::hint::black_box(&x) as *const u8 as usize;
    }
    sp
}

/// A time stamp for the pruning heuristics only: cheap, monotonic enough on
/// one processor, in unspecified units (see [`SEQ_TICKS`]).
#[inline(always)]
pub(crate) fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `rdtsc` reads the time-stamp counter; no memory is touched.
        #[allow(unused_unsafe)]
        unsafe {
            std::arch::x86_64::_rdtsc()
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        let t: u64;
        // SAFETY: reads the virtual counter register; no memory is touched.
        unsafe {
            std::arch::asm!("mrs {}, cntvct_el0", out(reg) t, options(nomem, nostack, preserves_flags))
        };
        // The counter runs at tens of MHz: scale it to about TSC units.
        t << 6
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        use std::sync::OnceLock;
        use std::time::Instant;
        static T0: OnceLock<Instant> = OnceLock::new();
        T0.get_or_init(Instant::now).elapsed().as_nanos() as u64 * 2
    }
}

/// A pruned [`Ctx::join_remote`] whose function has a pruned clone
/// ([`RemoteFn::with_pruned`]) runs the forked branch as that clone, with no
/// pruning test at all, if its sibling (the first branch) took less than
/// this many [`ticks`] (about 20–30 µs): siblings are usually of one size,
/// so a processor that goes idle waits about that long at most before the
/// busy one reaches a join that can fork for it.
pub(crate) const SEQ_TICKS: u64 = 1 << 16;

/// Stack a subtree run as the pruned copy may use (it makes no stack test):
/// the copy is entered only with this much free above the red zone, where a
/// join would move to a fresh segment. A quick subtree is rarely deep; one
/// deeper than this runs into the guard page, which stops the program with
/// a message naming the stack-size setting.
pub(crate) const PRUNED_STACK: usize = 256 * 1024;

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
/// use hyfi_core::{Config, Fork, RemoteFn, Runtime};
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
/// # Ok::<(), hyfi_core::Error>(())
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
    impl Sealed for super::Pruned {}
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

/// A processor's context inside a subtree that pruning runs as plain calls
/// (see [`Fork`]): its joins are the two calls, with no pruning test.
///
/// It dereferences to the [`Ctx`], for everything else a filament does.
/// Its joins count nothing: the subtree counts once, in
/// [`ProcStats::pruned`](crate::ProcStats::pruned), and its branches are not
/// in [`ProcStats::filaments`](crate::ProcStats::filaments). A counter
/// bumped at every call, even one of its own on the stack, cost fib(40)
/// 30% (measured): its increments form one chain of dependent memory
/// updates through the whole recursion.
pub struct Pruned {
    /// The processor's context. A `Pruned` is made only by
    /// [`Ctx::run_pruned`], on its stack frame, and lent by reference, so
    /// it never outlives the `Ctx`; a raw pointer (not a borrow) keeps
    /// lifetimes out of its type, so a generic filament instantiated for it
    /// is still a plain `fn(&Pruned, A) -> R`.
    ctx: *const Ctx,
}

impl Pruned {
    /// The processor's context.
    #[inline(always)]
    pub fn ctx(&self) -> &Ctx {
        // SAFETY: see the field: the `Ctx` outlives every `&Pruned`.
        unsafe { &*self.ctx }
    }

    /// [`Ctx::join`] where pruning already decided: `(a(self), b(self))`.
    #[inline(always)]
    pub fn join<A, B, RA, RB>(&self, a: A, b: B) -> (RA, RB)
    where
        A: FnOnce(&Pruned) -> RA + Send,
        B: FnOnce(&Pruned) -> RB + Send,
        RA: Send,
        RB: Send,
    {
        (a(self), b(self))
    }

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
        (a(self), f.call_pruned(self, b))
    }
}

impl Deref for Pruned {
    type Target = Ctx;
    #[inline(always)]
    fn deref(&self) -> &Ctx {
        self.ctx()
    }
}

impl std::fmt::Debug for Pruned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = self.ctx();
        write!(f, "Pruned(node {}, proc {})", c.node, c.proc)
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

impl Ctx {
    /// Where a first branch starts, for [`Ctx::sibling_may_run_pruned`]: the time
    /// and this processor's filament count.
    #[inline(always)]
    pub(crate) fn mark(&self) -> (u64, u64) {
        (ticks(), self.stats.filaments.get())
    }

    /// Whether the first branch that started at `mark` was quick (under
    /// [`SEQ_TICKS`]) without being a leaf (it joined something): then its
    /// sibling, likely as small, may run as the pruned copy. A leaf first
    /// branch tells nothing of its sibling (one half of an adaptive
    /// refinement may converge at once while the other goes deep).
    ///
    /// The pruned copy makes no stack test: it also needs [`PRUNED_STACK`]
    /// bytes of stack free above the red zone.
    #[inline(always)]
    pub(crate) fn sibling_may_run_pruned(&self, (t, n): (u64, u64)) -> bool {
        self.stats.filaments.get() != n
            && ticks().wrapping_sub(t) < SEQ_TICKS
            && stack_pointer() >= self.bounds.get().red.saturating_add(PRUNED_STACK)
    }

    /// Runs `f` with a pruned view of this context, counted as one pruned
    /// subtree (see [`Pruned`]: the joins inside it count nothing).
    #[inline(always)]
    pub(crate) fn run_pruned<R>(&self, f: impl FnOnce(&Pruned) -> R) -> R {
        self.stats.pruned.set(self.stats.pruned.get() + 1);
        f(&Pruned { ctx: self })
    }

    /// Runs `a` and `b`, potentially in parallel, and returns both results
    /// (a fork-join filament pair: fork `b`, run `a`, join `b`).
    ///
    /// With pruning on and every processor busy this is two plain calls. If
    /// `b` was stolen, the filthread suspends until it is done and this
    /// processor runs other work meanwhile. A panic in either closure
    /// propagates to the caller after both have finished.
    #[inline]
    pub fn join<A, B, RA, RB>(&self, a: A, b: B) -> (RA, RB)
    where
        A: FnOnce(&Ctx) -> RA + Send,
        B: FnOnce(&Ctx) -> RB + Send,
        RA: Send,
        RB: Send,
    {
        // The fast path is a load, a compare and the two calls: plain calls
        // unless a fork is wanted or the stack is nearly full (see
        // `Ctx::limit`). Everything else is out of line.
        if self.pruned_here() {
            self.count_filaments(2);
            return (a(self), b(self));
        }
        unlikely_path();
        self.join_cold(a, b)
    }

    /// The pruning test of a join: `true` to make plain calls.
    #[inline(always)]
    pub(crate) fn pruned_here(&self) -> bool {
        stack_pointer() >= self.limit.load(Ordering::Relaxed)
    }

    /// A join that is not pruned: a fork is wanted, or the stack is nearly
    /// full (then the two calls run on a fresh segment). Out of line but
    /// not `#[cold]`: calls made in a cold function are not inlined, and a
    /// real fork needs its pieces inlined; the branch to it is marked
    /// unlikely instead ([`unlikely_path`]).
    #[inline(never)]
    fn join_cold<A, B, RA, RB>(&self, a: A, b: B) -> (RA, RB)
    where
        A: FnOnce(&Ctx) -> RA + Send,
        B: FnOnce(&Ctx) -> RB + Send,
        RA: Send,
        RB: Send,
    {
        if self.limit.load(Ordering::Relaxed) != WANTED {
            return self.call_on_new_segment(|c| {
                c.count_filaments(2);
                (a(c), b(c))
            });
        }
        self.join_real(a, b)
    }

    #[inline]
    fn join_real<A, B, RA, RB>(&self, a: A, b: B) -> (RA, RB)
    where
        A: FnOnce(&Ctx) -> RA + Send,
        B: FnOnce(&Ctx) -> RB + Send,
        RA: Send,
        RB: Send,
    {
        self.check_abort();
        let job_b = StackJob::new(b);
        let job_ref = job_b.as_job_ref();
        let ra = self.fork_and_run_a(job_ref, a);
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
    #[inline]
    pub(crate) fn fork_and_run_a<RA>(
        &self,
        job: JobRef,
        a: impl FnOnce(&Ctx) -> RA,
    ) -> Result<RA, Box<dyn Any + Send>> {
        self.deque.push(job);
        self.stats.forks.set(self.stats.forks.get() + 1);
        // One want buys one real fork: this deque now holds a job to steal,
        // so go back to pruning. A thief asks again when it takes the job
        // (or fails a steal round), so a descheduled thief costs at most one
        // real fork, not a fork at every join until it runs.
        self.clear_want();
        let sh = &*self.shared;
        if sh.idle.load(Ordering::SeqCst) > 0 {
            sh.notify_idle();
        }
        self.count_filaments(1);
        catch_unwind(AssertUnwindSafe(|| self.call_inline(a)))
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
                // SAFETY: jobs in our deque are alive (see unsafe_execute).
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
            crate::balance::abort_unwind(self);
        }
    }

    /// Runs `n` filaments `f(ctx, 0..n)` as fork-join filaments and returns
    /// their results in index order (the n-way form of [`Ctx::join`]).
    ///
    /// ```
    /// use hyfi_core::{Config, Runtime};
    /// let rt = Runtime::new(Config::new().procs(2).pin(false)).unwrap();
    /// let v = rt.run(|ctx| ctx.join_n(5, |_, i| i * i)).unwrap();
    /// assert_eq!(v, vec![0, 1, 4, 9, 16]);
    /// ```
    pub fn join_n<R, F>(&self, n: usize, f: F) -> Vec<R>
    where
        R: Send,
        F: Fn(&Ctx, usize) -> R + Sync,
    {
        let mut out: Vec<Option<R>> = (0..n).map(|_| None).collect();
        fn rec<R: Send, F: Fn(&Ctx, usize) -> R + Sync>(
            ctx: &Ctx,
            slots: &mut [Option<R>],
            base: usize,
            f: &F,
        ) {
            match slots.len() {
                0 => {}
                1 => slots[0] = Some(f(ctx, base)),
                len => {
                    let mid = len / 2;
                    let (l, r) = slots.split_at_mut(mid);
                    ctx.join(|c| rec(c, l, base, f), |c| rec(c, r, base + mid, f));
                }
            }
        }
        rec(self, &mut out, 0, &f);
        out.into_iter()
            .map(|r| r.expect("hyfi: join_n slot not filled"))
            .collect()
    }

    /// Calls `f` here, first moving to a fresh stack segment if this one is
    /// nearly full.
    #[inline(always)]
    pub(crate) fn call_inline<R>(&self, f: impl FnOnce(&Ctx) -> R) -> R {
        if stack_pointer() < self.bounds.get().red {
            return self.call_on_new_segment(f);
        }
        f(self)
    }

    #[cold]
    #[inline(never)]
    pub(crate) fn call_on_new_segment<R>(&self, f: impl FnOnce(&Ctx) -> R) -> R {
        let taken = self.stacks.borrow_mut().take();
        let mut stack = match taken {
            Ok(s) => s,
            // No memory for a segment: go on and let the guard page report it.
            Err(_) => return f(self),
        };
        struct Restore<'a> {
            ctx: &'a Ctx,
            bounds: StackBounds,
            guard: usize,
        }
        impl Drop for Restore<'_> {
            fn drop(&mut self) {
                enter_guard(self.guard);
                self.ctx.set_bounds(self.bounds);
            }
        }
        let nb = StackBounds::of(&stack);
        let restore = Restore {
            ctx: self,
            bounds: self.set_bounds(nb),
            guard: enter_guard(nb.guard),
        };
        let r = catch_unwind(AssertUnwindSafe(|| {
            corosensei::on_stack(&mut stack, || f(self))
        }));
        drop(restore);
        self.stacks.borrow_mut().give(stack);
        match r {
            Ok(v) => v,
            Err(p) => resume_unwind(p),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Config, Runtime};

    /// A binary tree of joins whose forked branch has a pruned copy.
    fn tree(ctx: &impl Fork, (depth, leaf): (u32, u64)) -> u64 {
        if depth == 0 {
            return std::hint::black_box(leaf);
        }
        let (a, b) = ctx.join_remote(
            |c| tree(c, (depth - 1, 2 * leaf)),
            &TREE,
            (depth - 1, 2 * leaf + 1),
        );
        a + b
    }
    static TREE: RemoteFn<(u32, u64), u64> =
        RemoteFn::new("fork::tests::tree", tree).with_pruned(tree);

    #[test]
    fn the_pruned_copy_gives_the_same_result_and_counts_the_joins_outside_it() {
        let depth = 16;
        let n = 1u64 << depth;
        for (procs, prune) in [(1, true), (2, true), (2, false)] {
            let rt = Runtime::new(Config::new().procs(procs).pin(false).prune(prune)).unwrap();
            for _ in 0..3 {
                rt.reset_stats();
                assert_eq!(
                    rt.run(|ctx| tree(ctx, (depth, 0))).unwrap(),
                    n * (n - 1) / 2
                );
                let t = rt.stats().total();
                if prune {
                    // The joins outside pruned subtrees count two branches
                    // each; the subtrees count once each, not their joins.
                    assert!(t.pruned > 0, "procs {procs}: no subtree ran pruned");
                    assert!(t.filaments % 2 == 0 && t.filaments < 2 * (n - 1));
                } else {
                    // 2^depth - 1 joins of two branches each, wherever they ran.
                    assert_eq!(t.filaments, 2 * (n - 1), "procs {procs}");
                    assert_eq!(t.forks, n - 1, "procs {procs}: every join forks");
                    assert_eq!(t.pruned, 0, "procs {procs}");
                }
            }
        }
    }

    #[test]
    fn a_panic_in_the_pruned_copy_reaches_the_root() {
        fn boom(ctx: &impl Fork, depth: u32) -> u64 {
            if depth == 0 {
                panic!("boom in a leaf");
            }
            let (a, b) = ctx.join_remote(|c| boom(c, depth - 1), &BOOM, depth - 1);
            a + b
        }
        static BOOM: RemoteFn<u32, u64> =
            RemoteFn::new("fork::tests::boom", boom).with_pruned(boom);
        let rt = Runtime::new(Config::new().procs(2).pin(false)).unwrap();
        assert!(rt.run(|ctx| boom(ctx, 12)).is_err());
        // The runtime survives.
        assert_eq!(rt.run(|ctx| tree(ctx, (4, 0))).unwrap(), 120);
    }
}
