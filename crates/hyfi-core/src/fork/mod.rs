//! Fork-join filaments: `join`, `join_n`, pruning and the pruned copy. Their
//! jobs are in [`crate::job`], the latch a joiner waits on in
//! [`crate::latch`]; the one join path every join takes is `join`, and how
//! a fork-join run starts and ends is `run`. `join_remote` (its branches,
//! its job, and the [`Fork`](crate::Fork) trait that names it) belongs to
//! the layer that ships filaments, `crate::remote` (module `join`), which
//! plugs its branches into this path. The protocol (who waits for whom, the pruning
//! word, the invariants) is in this directory's `README.md`.
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
//! **The pruned copy** ([`Fork`](crate::Fork), [`Pruned`]): the test itself
//! stops the compiler from turning a recursion's last call into a loop,
//! which the plain recursion gets (fib's `fib(n - 1) + fib(n - 2)` loses
//! half its speed to that). A filament written generic over `Fork` whose
//! [`RemoteFn`](crate::RemoteFn) names its pruned copy runs small subtrees
//! as that copy, the plain recursion: a pruned `join_remote` whose first
//! branch took less than [`SEQ_TICKS`] runs its forked branch so. Idle processors find work at
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

use std::marker::PhantomData;
use std::ops::Deref;

use crate::sched::Ctx;
use crate::stack::stack_pointer;

mod join;
mod latent;
mod run;

pub(crate) use join::Branches;
pub(crate) use latent::{LatentSlots, Listed};
#[cfg(test)]
mod latent_test;
#[cfg(test)]
mod test;

/// Marks the path that calls it as unlikely (for block layout), without
/// making the function it calls cold.
#[cold]
#[inline(always)]
pub(crate) fn unlikely_path() {}

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
/// ([`RemoteFn::with_pruned`](crate::RemoteFn::with_pruned)) runs the forked
/// branch as that clone, with no pruning test at all, if its sibling (the
/// first branch) took less than this many [`ticks`] (about 20–30 µs):
/// siblings are usually of one size,
/// so a processor that goes idle waits about that long at most before the
/// busy one reaches a join that can fork for it.
pub(crate) const SEQ_TICKS: u64 = 1 << 16;

/// Stack a subtree run as the pruned copy may use (it makes no stack test):
/// the copy is entered only with this much free above the red zone, where a
/// join would move to a fresh segment. A quick subtree is rarely deep; one
/// deeper than this runs into the guard page, which stops the program with
/// a message naming the stack-size setting.
pub(crate) const PRUNED_STACK: usize = 256 * 1024;

/// A processor's context inside a subtree that pruning runs as plain calls
/// (see [`Fork`](crate::Fork)): its joins are the two calls, with no pruning test.
///
/// It dereferences to the [`Ctx`], for everything else a filament does.
/// Its joins count nothing: the subtree counts once, in
/// [`ProcStats::pruned`](crate::ProcStats::pruned), and its branches are not
/// in [`ProcStats::filaments`](crate::ProcStats::filaments). A counter
/// bumped at every call, even one of its own on the stack, cost fib(40)
/// 30% (measured): its increments form one chain of dependent memory
/// updates through the whole recursion.
///
/// **Empty, and always the same.** A `Pruned` holds nothing: its [`Ctx`] is
/// the calling server thread's (the thread-local every server thread
/// publishes), and its joins hand their branches one constant `&Pruned`
/// rather than the one they were given. So a filament's copy for `Pruned`
/// is the plain recursion to the register: when it held the `Ctx`'s
/// address, every frame of the copy kept that address in a callee-saved
/// register across its calls (two more pushes and pops per call of fib),
/// and fib(40) ran at 1.09× the plain recursion.
pub struct Pruned {
    /// Neither `Send` nor `Sync`, as [`Ctx`]: a `&Pruned` stands for the
    /// processor that runs the subtree, so it never leaves the thread.
    _processor: PhantomData<*const Ctx>,
}

impl Pruned {
    /// The one `&Pruned` every pruned branch is handed: a constant, so the
    /// copy never has to keep the one it was given.
    pub(crate) const VIEW: &'static Pruned = &Pruned {
        _processor: PhantomData,
    };

    /// The processor's context: a read of a thread-local (the server
    /// thread's published context), so a loop that needs it often should
    /// take it once.
    #[inline(always)]
    pub fn ctx(&self) -> &Ctx {
        // A `Pruned` is only lent, by `Ctx::run_pruned` and the joins
        // inside the subtree it starts, to code on a server thread, and it
        // cannot leave that thread.
        crate::sched::current_ctx()
    }

    /// [`Ctx::join`] where pruning already decided: `a`, then `b`, here.
    #[inline(always)]
    pub fn join<A, B, RA, RB>(&self, a: A, b: B) -> (RA, RB)
    where
        A: FnOnce(&Pruned) -> RA + Send,
        B: FnOnce(&Pruned) -> RB + Send,
        RA: Send,
        RB: Send,
    {
        (a(Pruned::VIEW), b(Pruned::VIEW))
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
        f(Pruned::VIEW)
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
        self.join_with(join::Pair(a, b))
    }

    /// Runs `n` filaments `f(ctx, 0..n)` as fork-join filaments and returns
    /// their results in index order (the n-way form of [`Ctx::join`]).
    ///
    /// ```
    /// use hyfi::{Config, Runtime};
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
}
