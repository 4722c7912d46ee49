//! The context of a processor: what a filament sees of the server thread
//! running it ([`Ctx`]), and the processor-level services every kind of
//! filament uses: the pruning word, stealing on the node, the stack running
//! now and moving to a fresh segment when it is nearly full.
//!
//! One `Ctx` per server thread, boxed and published in a thread-local for
//! code that has no `&Ctx` at hand (a filthread's entry, [`crate::waits`]).

use std::cell::{Cell, RefCell};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crossbeam_deque::{Steal, Worker};

use super::coro::Yld;
use crate::job::JobRef;
use crate::registry::{LimitWord, Shared, WorkerShared, WANTED};
use crate::stack::{enter_guard, stack_pointer, StackBounds, StackPool};
use crate::stats::ProcStats;

thread_local! {
    pub(super) static CTX: Cell<*const Ctx> = const { Cell::new(std::ptr::null()) };
}

/// The calling server thread's context. Panics off a server thread.
pub(crate) fn current_ctx() -> &'static Ctx {
    try_current_ctx().expect("hyfi: not on a server thread")
}

/// The calling server thread's context, if it is one.
pub(crate) fn try_current_ctx() -> Option<&'static Ctx> {
    let p = CTX.with(|c| c.get());
    // SAFETY: the pointer is set by the server thread to its own boxed Ctx,
    // which lives until that thread's main loop returns, after which no code
    // that could call this runs on the thread; it is cleared before the box
    // is dropped.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// Where the caller runs, for [`crate::waits`] (registered with it at
/// start-up): its processor and, on a filthread, the filthread's id.
pub(crate) fn locate() -> Option<(usize, Option<u64>)> {
    try_current_ctx().map(|c| {
        (
            c.proc,
            (!c.yielder.get().is_null()).then(|| c.current.get()),
        )
    })
}

/// What a filament sees of the processor running it: the architecture
/// queries of the paper, fork-join ([`Ctx::join`]), and access to reduction
/// variables' private copies.
///
/// A `&Ctx` is only ever lent to code running on its server thread; it is
/// neither `Send` nor `Sync`, so it cannot be smuggled to another thread
/// (which would let two threads touch one processor's private copies):
///
/// ```compile_fail,E0277
/// fn needs_send<T: Send>(_: T) {}
/// fn leak(ctx: &hyfi::Ctx) { needs_send(ctx) }
/// ```
///
/// ```compile_fail,E0277
/// let rt = hyfi::Runtime::new(hyfi::Config::new().procs(1).pin(false)).unwrap();
/// rt.run(|ctx| std::thread::scope(|s| { s.spawn(|| ctx.proc()); })).unwrap();
/// ```
///
/// Fork-join closures must be `Send`, since a stolen one runs elsewhere:
///
/// ```compile_fail,E0277
/// let rt = hyfi::Runtime::new(hyfi::Config::new().procs(1).pin(false)).unwrap();
/// let local = std::rc::Rc::new(1);
/// rt.run(|ctx| ctx.join(|_| *local, |_| 2)).unwrap();
/// ```
pub struct Ctx {
    pub(crate) shared: Arc<Shared>,
    pub(crate) rt_id: u64,
    /// The pruning test of a join in one word: a join makes plain calls iff
    /// the stack pointer is at or above `limit`. It holds the red-zone
    /// address `bounds.red` while no fork is wanted, and [`WANTED`] (above any
    /// stack) when one is: another processor went idle or stole our last
    /// job, or pruning is off. Other processors store `WANTED` into it
    /// through [`WorkerShared::want_fork`], and idle nodes of this host
    /// through the host words where it lives if the link lends them
    /// (`remote::host`); the owner clears it.
    pub(crate) limit: LimitWord,
    pub(crate) proc: usize,
    pub(crate) node: usize,
    pub(crate) nodes: usize,
    /// More than one processor on the node (stealing is possible).
    pub(crate) multi: bool,
    pub(crate) prune: bool,
    pub(crate) deque: Worker<JobRef>,
    pub(crate) yielder: Cell<*const Yld>,
    pub(crate) current: Cell<u64>,
    /// Where the running filament's reduction copies are: the chunk's
    /// (its pool's processor and slot) in iterative mode, this
    /// processor's slot 0 in fork-join mode. Reductions keep one private
    /// copy per chunk of a pool, so neither the order in which chunks
    /// interleave (when one waits for a page) nor which processor runs
    /// them can change a result; see `reduce` and `phase/share.rs`.
    pub(crate) copy: Cell<crate::phase::CopyAt>,
    /// Set while a [`Reduction::update`](crate::Reduction::update) closure
    /// runs: suspending then could let another filthread update the same
    /// copy, and one of the two updates would be lost.
    pub(crate) in_update: Cell<bool>,
    /// The phase running: its program's number and its index in the
    /// program (see [`CtxExt::phase_key`](crate::layer::CtxExt::phase_key));
    /// `u64::MAX` in fork-join mode.
    pub(crate) phase: Cell<u64>,
    pub(crate) iteration: Cell<u64>,
    /// The stack running now: its red zone (below which a join moves to a
    /// new segment; 0 off a filthread) and guard page.
    pub(crate) bounds: Cell<StackBounds>,
    pub(crate) stacks: RefCell<StackPool>,
    pub(crate) stats: LocalStats,
    /// The start-up slot the running filament holds (see `startup`).
    pub(crate) startup: Cell<Option<crate::crossnode::Slot>>,
    /// Latent slots this processor's running stack fills (`fork::latent`).
    pub(crate) latent_len: Cell<usize>,
    /// Whether the next pruned join lists its second branch (`fork::latent`).
    pub(crate) latent_armed: Cell<bool>,
    /// Whether this processor lists joins at all (`fork::latent`).
    pub(crate) latent_on: bool,
    next_id: Cell<u64>,
    rng: Cell<u64>,
}

/// Counters kept in plain cells by the owning server thread.
#[derive(Default)]
pub(crate) struct LocalStats {
    pub(crate) filaments: Cell<u64>,
    pub(crate) pruned: Cell<u64>,
    pub(crate) forks: Cell<u64>,
    pub(crate) steal_attempts: Cell<u64>,
    pub(crate) steals: Cell<u64>,
    pub(crate) steals_latent: Cell<u64>,
    pub(crate) suspensions: Cell<u64>,
    pub(crate) filthreads: Cell<u64>,
    pub(crate) idle_ns: Cell<u64>,
    pub(crate) phases: Cell<u64>,
    pub(crate) chunks_stolen: Cell<u64>,
}

impl LocalStats {
    pub(crate) fn drain(&self) -> ProcStats {
        ProcStats {
            filaments: self.filaments.take(),
            pruned: self.pruned.take(),
            forks: self.forks.take(),
            steal_attempts: self.steal_attempts.take(),
            steals: self.steals.take(),
            steals_latent: self.steals_latent.take(),
            suspensions: self.suspensions.take(),
            filthreads: self.filthreads.take(),
            idle_ns: self.idle_ns.take(),
            phases: self.phases.take(),
            chunks_stolen: self.chunks_stolen.take(),
            stacks_mapped: 0,
            switched_out: 0,
            gave_up: 0,
        }
    }
}

impl Ctx {
    /// The context of server thread `proc` of `shared`, which owns `deque`.
    pub(crate) fn new(shared: &Arc<Shared>, proc: usize, deque: Worker<JobRef>) -> Ctx {
        Ctx {
            proc,
            node: shared.link.my_node(),
            nodes: shared.link.num_nodes(),
            multi: shared.procs > 1,
            prune: shared.cfg.get_prune(),
            deque,
            yielder: Cell::new(std::ptr::null()),
            current: Cell::new(0),
            copy: Cell::new(crate::phase::CopyAt { proc, slot: 0 }),
            in_update: Cell::new(false),
            phase: Cell::new(u64::MAX),
            iteration: Cell::new(0),
            bounds: Cell::new(StackBounds::default()),
            stacks: RefCell::new(StackPool::new(shared.cfg.get_stack_size())),
            stats: LocalStats::default(),
            startup: Cell::new(None),
            latent_len: Cell::new(0),
            latent_armed: Cell::new(false),
            // Alone on one node, nobody could claim a listed join (and
            // with pruning off every join forks).
            latent_on: (shared.procs > 1 || shared.link.num_nodes() > 1)
                && shared.cfg.get_latent_joins()
                && shared.cfg.get_prune(),
            next_id: Cell::new(1),
            rng: Cell::new(0x9e37_79b9_7f4a_7c15 ^ ((proc as u64 + 1) << 17)),
            rt_id: shared.id,
            limit: {
                let w = shared.workers[proc].limit;
                w.store(
                    if shared.procs > 1 || shared.link.num_nodes() > 1 || !shared.cfg.get_prune() {
                        WANTED
                    } else {
                        0
                    },
                    Ordering::SeqCst,
                );
                w
            },
            shared: shared.clone(),
        }
    }

    /// This processor's index on its node, `0..procs_per_node()` (`filMyProcessor`).
    #[inline]
    pub fn proc(&self) -> usize {
        self.proc
    }
    /// This node's index, `0..num_nodes()` (`filMyNode`).
    #[inline]
    pub fn node(&self) -> usize {
        self.node
    }
    /// Number of nodes (`filNumNodes`).
    #[inline]
    pub fn num_nodes(&self) -> usize {
        self.nodes
    }
    /// Processors on each node (`filNumProcessorsPerNode`).
    #[inline]
    pub fn procs_per_node(&self) -> usize {
        self.shared.procs
    }
    /// In iterative filaments: how many times the running phase has
    /// completed before (0 during its first execution). Lets filaments pick
    /// the current grid of a double-buffered computation, or LU's step `k`.
    #[inline]
    pub fn iteration(&self) -> u64 {
        self.iteration.get()
    }
    /// Global index of this processor: `node * procs_per_node + proc`.
    #[inline]
    pub fn global_proc(&self) -> usize {
        self.node * self.shared.procs + self.proc
    }

    /// Records the bounds of the stack now running; returns the previous.
    #[inline]
    pub(crate) fn set_bounds(&self, b: StackBounds) -> StackBounds {
        let cur = self.limit.load(Ordering::Relaxed);
        if cur != WANTED {
            // Fails only if another processor just asked for a fork: keep that.
            let _ = self
                .limit
                .compare_exchange(cur, b.red, Ordering::Relaxed, Ordering::Relaxed);
        }
        self.bounds.replace(b)
    }

    /// Makes this processor's next join a real fork.
    #[inline]
    pub(crate) fn want_fork(&self) {
        self.limit.store(WANTED, Ordering::Relaxed);
    }

    /// Back to pruning (plain calls) after a real fork, if pruning is on.
    #[inline]
    pub(crate) fn clear_want(&self) {
        if self.prune {
            let _ = self.limit.compare_exchange(
                WANTED,
                self.bounds.get().red,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }

    #[inline]
    pub(crate) fn ws(&self) -> &WorkerShared {
        &self.shared.workers[self.proc]
    }

    pub(crate) fn count_filaments(&self, n: u64) {
        self.stats.filaments.set(self.stats.filaments.get() + n);
    }

    pub(crate) fn next_id(&self) -> u64 {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        id
    }

    fn rand(&self) -> u64 {
        // xorshift64*: victim selection only.
        let mut x = self.rng.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.set(x);
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Takes a job from another processor of this node (or the injector).
    pub(crate) fn steal(&self) -> Option<JobRef> {
        let sh = &self.shared;
        loop {
            match sh.injector.steal() {
                Steal::Success(j) => return Some(j),
                Steal::Retry => continue,
                Steal::Empty => break,
            }
        }
        let p = sh.procs;
        if p == 1 {
            return None;
        }
        self.stats
            .steal_attempts
            .set(self.stats.steal_attempts.get() + 1);
        let start = (self.rand() as usize) % p;
        // The largest pieces first: the shallowest latent joins of the
        // other processors (`fork::latent`).
        for k in 0..p {
            let v = (start + k) % p;
            if v == self.proc {
                continue;
            }
            if let Some(j) = sh.workers[v].latent.claim(false) {
                // Its next join forks: one more piece for the next thief,
                // as after a deque steal.
                sh.workers[v].want_fork();
                self.stats.steals.set(self.stats.steals.get() + 1);
                self.stats
                    .steals_latent
                    .set(self.stats.steals_latent.get() + 1);
                crate::trace::instant(
                    crate::trace::Kind::Steal,
                    [self.proc as u64, v as u64, 1, 1],
                );
                return Some(j);
            }
        }
        for k in 0..p {
            let v = (start + k) % p;
            if v == self.proc {
                continue;
            }
            loop {
                match sh.stealers[v].steal() {
                    Steal::Success(j) => {
                        // The victim may have nothing left to give: ask it to
                        // make its next fork a real one.
                        sh.workers[v].want_fork();
                        self.stats.steals.set(self.stats.steals.get() + 1);
                        crate::trace::instant(
                            crate::trace::Kind::Steal,
                            [self.proc as u64, v as u64, 1, 0],
                        );
                        return Some(j);
                    }
                    Steal::Retry => continue,
                    Steal::Empty => break,
                }
            }
            // Filaments sent to a busy processor (from another node, or by
            // start-up distribution) are fair game too.
            if let Some(j) = steal_from(&sh.workers[v].incoming) {
                self.stats.steals.set(self.stats.steals.get() + 1);
                crate::trace::instant(
                    crate::trace::Kind::Steal,
                    [self.proc as u64, v as u64, 1, 0],
                );
                return Some(j);
            }
        }
        None
    }

    /// A filament sent to this processor, if any.
    pub(crate) fn pop_incoming(&self) -> Option<JobRef> {
        steal_from(&self.ws().incoming)
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

fn steal_from(q: &crossbeam_deque::Injector<JobRef>) -> Option<JobRef> {
    if q.is_empty() {
        return None;
    }
    loop {
        match q.steal() {
            Steal::Success(j) => return Some(j),
            Steal::Retry => continue,
            Steal::Empty => return None,
        }
    }
}
