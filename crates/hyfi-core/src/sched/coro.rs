//! Filthreads as the scheduler runs them: the stackful coroutine on a
//! pooled stack ([`Filthread`]), resuming it ([`Filthread::resume`]), and
//! suspending the running one ([`suspend`], ended by its [`Waker`]). Part
//! of the scheduler's core (a latch suspends its joiner here); the public
//! seam, with the concept's documentation, is [`crate::filthread`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use corosensei::stack::DefaultStack;
use corosensei::{Coroutine, CoroutineResult, Yielder};

use super::{current_ctx, Ctx};
use crate::registry::Shared;
use crate::stack::{enter_guard, StackBounds};

pub(crate) type Co = Coroutine<(), (), (), DefaultStack>;
pub(crate) type Yld = Yielder<(), ()>;

/// A filthread owned by one worker.
pub(crate) struct Filthread {
    pub(crate) id: u64,
    pub(crate) co: Co,
    pub(crate) bounds: StackBounds,
    /// It ran before (a resumption, for the trace).
    pub(crate) started: bool,
}

/// What happened when a worker resumed a filthread.
pub(crate) enum Ran {
    Suspended(Filthread),
    Finished(DefaultStack),
}

impl Filthread {
    /// Makes a filthread on `stack` that runs `body`.
    ///
    /// `body` runs with the worker's [`Ctx`]; it must not unwind (callers
    /// catch panics inside it).
    pub(crate) fn new(
        id: u64,
        stack: DefaultStack,
        body: impl FnOnce(&Ctx) + 'static,
    ) -> Filthread {
        let bounds = StackBounds::of(&stack);
        let co = Co::with_stack(stack, move |y: &Yld, ()| {
            let ctx = current_ctx();
            ctx.yielder.set(y as *const Yld);
            body(ctx);
        });
        Filthread {
            id,
            co,
            bounds,
            started: false,
        }
    }

    /// Runs the filthread until it suspends or finishes.
    pub(crate) fn resume(mut self, ctx: &Ctx) -> Ran {
        let prev_bounds = ctx.set_bounds(self.bounds);
        let prev_guard = enter_guard(self.bounds.guard);
        ctx.current.set(self.id);
        self.started = true;
        // Its pruned joins may list their second branches from slot 0 (a
        // suspended filthread's were withdrawn; a finished one unlisted
        // its own).
        ctx.latent_armed.set(ctx.latent_on);
        let r = self.co.resume(());
        // Suspended, it leaves its frames behind: take their listings out
        // of the processor's slots before another filthread fills them.
        ctx.withdraw_listings();
        ctx.current.set(0);
        enter_guard(prev_guard);
        ctx.set_bounds(prev_bounds);
        ctx.yielder.set(std::ptr::null());
        match r {
            CoroutineResult::Yield(()) => Ran::Suspended(self),
            CoroutineResult::Return(()) => Ran::Finished(self.co.into_stack()),
        }
    }
}

/// Ends one suspension: handed to whoever will end the wait.
///
/// Not `Clone`: a suspension is ended exactly once.
pub struct Waker {
    inner: WakerInner,
}

enum WakerInner {
    Filthread {
        shared: Arc<Shared>,
        proc: usize,
        id: u64,
    },
    Thread(Arc<ThreadWait>),
}

pub(crate) struct ThreadWait {
    done: AtomicBool,
    parker: crate::sleep::Parker,
}

impl Waker {
    /// Makes the suspended filthread runnable again (or unblocks the thread).
    pub fn wake(self) {
        match self.inner {
            WakerInner::Filthread { shared, proc, id } => shared.wake(proc, id),
            WakerInner::Thread(t) => {
                t.done.store(true, Ordering::SeqCst);
                t.parker.notify();
            }
        }
    }
}

impl std::fmt::Debug for Waker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            WakerInner::Filthread { proc, id, .. } => {
                write!(f, "Waker(filthread {id} on processor {proc})")
            }
            WakerInner::Thread(_) => write!(f, "Waker(thread)"),
        }
    }
}

/// Suspends the calling filthread until the [`Waker`] given to `register` is
/// woken; the server thread runs other filthreads meanwhile.
///
/// `register` stores the waker where the waking party will find it and
/// returns `true`, or returns `false` if the awaited condition already holds
/// (then nothing is suspended and the waker is dropped unused). Registering
/// and making the condition true must be ordered by the caller's own lock or
/// atomics, as in any condition-variable protocol.
///
/// Outside a filthread (post-phase code, a plain thread) the calling OS thread
/// blocks instead; the protocol is the same.
pub fn suspend(register: impl FnOnce(Waker) -> bool) {
    match super::try_current_ctx() {
        Some(ctx) if !ctx.yielder.get().is_null() => {
            let waker = Waker {
                inner: WakerInner::Filthread {
                    shared: ctx.shared.clone(),
                    proc: ctx.proc,
                    id: ctx.current.get(),
                },
            };
            if ctx.in_update.get() {
                update_suspends();
            }
            if register(waker) {
                ctx.stats.suspensions.set(ctx.stats.suspensions.get() + 1);
                suspend_current(ctx);
            }
        }
        _ => {
            let t = Arc::new(ThreadWait {
                done: AtomicBool::new(false),
                parker: crate::sleep::Parker::current(),
            });
            let waker = Waker {
                inner: WakerInner::Thread(t.clone()),
            };
            if register(waker) {
                t.parker.wait_until(|| t.done.load(Ordering::SeqCst));
            }
        }
    }
}

/// Switches from the running filthread back to its server thread's scheduler.
/// The filthread continues here once woken and resumed.
fn suspend_current(ctx: &Ctx) {
    let y = ctx.yielder.get();
    let id = ctx.current.get();
    let bounds = ctx.bounds.get();
    let copy = ctx.copy.get();
    // SAFETY: `y` was set by this filthread's own body from the Yielder that
    // corosensei handed it; the filthread is running, so it is alive, and
    // it is only used on this OS thread (filthreads never migrate).
    unsafe { (*y).suspend(()) };
    // Resumed (by the same worker). The scheduler set the bounds of the
    // filthread's first stack; a join may have moved it onto a further
    // segment, so restore exactly what was current at the suspension.
    ctx.yielder.set(y);
    ctx.current.set(id);
    ctx.copy.set(copy);
    ctx.set_bounds(bounds);
    enter_guard(bounds.guard);
}

/// A filthread tried to suspend inside a `Reduction::update` closure.
#[cold]
#[inline(never)]
fn update_suspends() -> ! {
    panic!(
        "hyfi: a Reduction::update closure (or the combine function of a \
         Reduction::local_with) waited (for a shared page, a stolen child or a message): \
         another filthread of this processor could update the same copy meanwhile and one \
         update would be lost. Read what the update needs (shared elements, join results) \
         before calling update, and keep the closure to arithmetic on the copy; or fold with \
         Reduction::fold / Reduction::local"
    )
}
