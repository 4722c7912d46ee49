//! Filthreads: stackful coroutines multiplexed on a server thread, and the
//! seam through which any layer suspends one.
//!
//! A filthread runs filaments (the filaments of one pool, or a fork-join
//! filament and everything it calls). It is never preempted; it gives the
//! processor up only by [`suspend`]ing, for a reason the core need not know:
//! a join waiting for a stolen child, a shared page in flight, a reply from
//! another node. The party that will end the wait receives a [`Waker`] and
//! calls [`Waker::wake`] from any thread; the filthread's own server thread
//! then resumes it. A suspended filthread never moves to another OS thread.
//!
//! The coroutines themselves belong to the scheduler (`sched::coro`, which
//! the core's latches suspend through); this module is the seam for the
//! layers above.
//!
//! ```
//! use hyfi::layers::filthread;
//! use hyfi::{Config, Runtime};
//! use std::sync::mpsc;
//!
//! let rt = Runtime::new(Config::new().procs(1).pin(false)).unwrap();
//! let (tx, rx) = mpsc::channel::<filthread::Waker>();
//! // A "network" thread that wakes whoever registers with it.
//! let net = std::thread::spawn(move || rx.recv().unwrap().wake());
//! let got = rt.run(|_ctx| {
//!     filthread::suspend(|waker| {
//!         tx.send(waker).unwrap();
//!         true // registered: stay suspended until woken
//!     });
//!     42
//! }).unwrap();
//! assert_eq!(got, 42);
//! net.join().unwrap();
//! ```

pub use crate::sched::{suspend, Waker};

/// Ends the calling filament because this node's link to the others
/// failed (a lost peer, an abort) while it waited: the runtime returns
/// `Error::Link(e)` from `start` or `run`, not a filament panic, and no
/// panic message is printed (the unwind skips the panic hook).
pub fn link_failed(e: crate::LinkError) -> ! {
    std::panic::resume_unwind(Box::new(crate::error::LinkAbort(crate::Error::Link(e))))
}

/// Whether the caller runs on a filthread (and so may suspend without
/// blocking its server thread).
pub fn in_filthread() -> bool {
    crate::sched::try_current_ctx().is_some_and(|c| !c.yielder.get().is_null())
}

/// What the caller runs, as a number unique on the node among what may
/// run at the same time (0 off the server threads): in an iterative phase
/// the chunk (its pool's processor and its copy slot: the same whichever
/// processor and filthread run it, see [`Config::chunks`](crate::Config::chunks)),
/// elsewhere the filthread. For layers that must tell accesses that may
/// race apart from accesses that run one after the other (the DSM's
/// footprint claims): two chunks may run at once on two processors, or
/// one after the other on one filthread, depending on timing; one chunk
/// never runs on two.
pub fn current_work() -> u64 {
    match crate::sched::try_current_ctx() {
        None => 0,
        Some(c) if c.phase.get() != u64::MAX => {
            let at = c.copy.get();
            1 << 63 | (at.proc as u64 + 1) << 40 | at.slot as u64
        }
        Some(c) => (c.proc as u64 + 1) << 40 | crate::trace::filthread(),
    }
}

/// The processor (server thread index on this node) the caller runs on, or
/// `None` off the server threads. For layers that keep per-processor
/// counters on their slow paths (the DSM's outstanding requests).
pub fn current_processor() -> Option<usize> {
    crate::sched::try_current_ctx().map(|c| c.proc)
}
