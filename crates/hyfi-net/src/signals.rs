//! The signal-handling thread (paper §3.2).
//!
//! A node runs one server thread per processor, plus the communication
//! thread. If an asynchronous signal (Ctrl-C, `kill`, a broken pipe) could be
//! delivered to any of them, the kernel would pick one at random and run the
//! handler on top of whatever it was doing — maybe inside `malloc`, maybe
//! holding a page-table lock. A handler that then allocates, logs, takes a
//! lock or sends a message to the other nodes deadlocks or corrupts state;
//! almost nothing useful is *async-signal-safe*.
//!
//! hyfi therefore never installs a handler for these signals. Instead:
//!
//! 1. Before any other thread exists, the main thread calls
//!    [`block_async_signals`]. Every thread created afterwards inherits the
//!    mask, so no server thread can ever be chosen to take one of
//!    [`ASYNC_SIGNALS`]: they stay pending on the process.
//! 2. [`SignalThread::start`] spawns one thread, `hyfi-signals`, that loops on
//!    `sigwait` over the same set. `sigwait` dequeues the pending signal and
//!    returns it as a plain value, so the handler runs as ordinary Rust code
//!    on that thread: it may allocate, lock, log and talk to other nodes.
//! 3. SIGINT, SIGTERM, SIGHUP and SIGQUIT become [`SignalEvent::Abort`] (the
//!    cluster layer tells the other nodes and exits with
//!    [`exit_code_for`]); SIGUSR1 becomes [`SignalEvent::DumpStats`].
//!    SIGPIPE (a dead peer shows up as `EPIPE` on the write instead),
//!    SIGALRM and SIGUSR2 are consumed and ignored.
//!
//! Synchronous faults (SIGSEGV, SIGBUS, SIGFPE, SIGILL) and SIGABRT are
//! deliberately left unblocked: they are raised by the faulting thread itself
//! and must be handled (or kill the process) there.
//!
//! As in the paper, the signal-handling thread is not bound to a processor;
//! the OS schedules it wherever there is room.
//!
//! # Example
//!
//! ```
//! use std::sync::mpsc;
//! use std::time::Duration;
//!
//! use hyfi_net::signals::{block_async_signals, SignalEvent, SignalThread};
//! use nix::sys::signal::{kill, Signal};
//! use nix::unistd::getpid;
//!
//! // First thing in main, before any other thread starts.
//! block_async_signals()?;
//!
//! let (tx, rx) = mpsc::channel();
//! let signals = SignalThread::start(move |event| {
//!     // Runs on "hyfi-signals", not in a signal handler: any code is fine.
//!     let _ = tx.send((event, std::thread::current().name().map(String::from)));
//! })?;
//!
//! // Process-directed, like `kill -USR1 <pid>` from a shell. (`raise` would
//! // direct it at this thread, where it would stay pending forever.)
//! kill(getpid(), Signal::SIGUSR1)?;
//! let (event, thread) = rx.recv_timeout(Duration::from_secs(10))?;
//! assert_eq!(event, SignalEvent::DumpStats);
//! assert_eq!(thread.as_deref(), Some("hyfi-signals"));
//!
//! signals.stop()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::io;
use std::os::unix::thread::JoinHandleExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use nix::sys::pthread::pthread_kill;
use nix::sys::signal::{SigSet, SigmaskHow, Signal};

use crate::NetError;

/// The asynchronous signals that [`block_async_signals`] blocks and the
/// signal-handling thread waits for.
pub const ASYNC_SIGNALS: [Signal; 8] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGPIPE,
    Signal::SIGALRM,
];

/// The signal [`SignalThread::stop`] sends to the thread to wake its
/// `sigwait`. It is otherwise ignored, so a stray one is harmless.
const WAKE: Signal = Signal::SIGUSR2;

/// What the signal-handling thread reports to its handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignalEvent {
    /// The user or the batch system asked the job to stop (SIGINT, SIGTERM,
    /// SIGHUP, SIGQUIT). The cluster layer aborts the job on every node and
    /// exits with [`exit_code_for`]`(signal)`.
    Abort {
        /// The signal received.
        signal: Signal,
        /// The process that sent it, when the kernel says (`si_pid`).
        from: Option<i32>,
    },
    /// SIGUSR1: print the counters of every layer and keep running.
    DumpStats,
}

impl fmt::Display for SignalEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SignalEvent::Abort { signal, .. } => write!(f, "abort requested by {signal}"),
            SignalEvent::DumpStats => f.write_str("statistics requested by SIGUSR1"),
        }
    }
}

/// The exit status a shell reports for a process killed by `signal`
/// (128 + its number: 130 for SIGINT, 143 for SIGTERM), so a job aborted by
/// a signal looks to scripts and batch systems as if the signal had killed it.
pub fn exit_code_for(signal: Signal) -> i32 {
    128 + signal as i32
}

/// The set [`ASYNC_SIGNALS`] as a `SigSet`.
fn async_set() -> SigSet {
    let mut set = SigSet::empty();
    for s in ASYNC_SIGNALS {
        set.add(s);
    }
    set
}

/// Blocks [`ASYNC_SIGNALS`] in the calling thread's signal mask.
///
/// Call it first thing in `main`, **before any other thread starts** (the
/// hyfi runtime does). A thread's mask is copied from its creator when it is
/// created, so every server thread, the communication thread and any thread a
/// library spawns later inherits the block, and the kernel can never pick
/// one of them to run a handler at an arbitrary point (paper §3.2). A thread
/// created *before* the call keeps its own, unblocked mask: a signal sent to
/// the process may then be delivered to it and take the default action
/// (usually killing the process) instead of reaching the signal-handling
/// thread.
///
/// Synchronous faults (SIGSEGV, SIGBUS, SIGFPE, SIGILL) and SIGABRT are not
/// blocked. Calling it more than once is harmless.
pub fn block_async_signals() -> Result<(), NetError> {
    async_set().thread_block().map_err(|e| {
        NetError::io(
            "blocking the asynchronous signals (pthread_sigmask)",
            io::Error::from(e),
        )
    })
}

/// The running signal-handling thread. Stop it with [`SignalThread::stop`];
/// dropping it stops it too.
///
/// Several may be started one after another in a process, but only one
/// should run at a time: with two, each signal goes to whichever calls
/// `sigwait` first.
pub struct SignalThread {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<(), NetError>>>,
}

impl fmt::Debug for SignalThread {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SignalThread")
            .field("running", &self.thread.is_some())
            .finish()
    }
}

impl SignalThread {
    /// Spawns the thread `hyfi-signals`, which waits for [`ASYNC_SIGNALS`]
    /// and calls `handler` for each [`SignalEvent`], on that thread, one at
    /// a time.
    ///
    /// Call [`block_async_signals`] on the main thread before starting any
    /// thread; if the calling thread has not blocked the set, this logs a
    /// warning (signals may then kill the process instead of reaching the
    /// handler). The new thread always has the set blocked from birth, as
    /// `sigwait` requires.
    ///
    /// A panic in `handler` is logged and the thread keeps waiting, so one bad
    /// event does not leave later Ctrl-Cs pending forever.
    pub fn start(handler: impl Fn(SignalEvent) + Send + 'static) -> Result<SignalThread, NetError> {
        let set = async_set();
        // Block in the caller for the duration of the spawn so the new thread
        // inherits the block at creation: no window where it could take one.
        let old = set.thread_swap_mask(SigmaskHow::SIG_BLOCK).map_err(|e| {
            NetError::io(
                "blocking the asynchronous signals to start the signal-handling thread",
                io::Error::from(e),
            )
        })?;
        if let Some(unblocked) = ASYNC_SIGNALS.iter().find(|&&s| !old.contains(s)) {
            tracing::warn!(
                "SignalThread::start: {unblocked} is not blocked in the calling thread; call \
                 hyfi_net::signals::block_async_signals() first thing in main, before any \
                 thread starts, or signals may be delivered to other threads"
            );
        }

        let stop = Arc::new(AtomicBool::new(false));
        let spawned = std::thread::Builder::new()
            .name("hyfi-signals".into())
            .spawn({
                let stop = Arc::clone(&stop);
                move || wait_loop(set, &stop, &handler)
            });
        // Restore the caller's mask whatever happened to the spawn.
        let restored = old.thread_set_mask();

        let thread = spawned.map_err(|e| NetError::io("spawning the signal-handling thread", e))?;
        let me = SignalThread {
            stop,
            thread: Some(thread),
        };
        restored.map_err(|e| {
            NetError::io(
                "restoring the signal mask after starting the signal-handling thread",
                io::Error::from(e),
            )
        })?;
        tracing::debug!("signal-handling thread started");
        Ok(me)
    }

    /// Stops the thread and waits for it to end. Returns the error that ended
    /// it early, if any (a failing `sigwait`).
    ///
    /// Signals that arrive after this stay pending (they are still blocked
    /// everywhere) and go to the next `SignalThread` started, if any.
    pub fn stop(mut self) -> Result<(), NetError> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), NetError> {
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        // Release pairs with the Acquire in `wait_loop`: the thread sees the
        // flag once it has taken our wake-up signal.
        self.stop.store(true, Ordering::Release);
        // A signal directed at the thread stays pending on it until its next
        // sigwait, so there is no lost wake-up even if it is between the
        // flag check and the call. The handle is not joined yet, so the
        // pthread_t is still valid even if the thread already returned.
        if let Err(e) = pthread_kill(thread.as_pthread_t(), WAKE) {
            // ESRCH: the thread already ended (its result says why).
            tracing::debug!("waking the signal-handling thread: {e}");
        }
        match thread.join() {
            Ok(result) => result,
            Err(_) => Err(NetError::io(
                "stopping the signal-handling thread",
                io::Error::other("the signal-handling thread panicked"),
            )),
        }
    }
}

impl Drop for SignalThread {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::error!("signal-handling thread: {e}");
        }
    }
}

/// Waits for a signal of `set` and says which, and which process sent it
/// (for signals sent by `kill`; `None` for those the kernel raised).
fn wait_info(set: &SigSet) -> io::Result<(Signal, Option<i32>)> {
    loop {
        let mut info = std::mem::MaybeUninit::<libc::siginfo_t>::zeroed();
        // SAFETY: the set is a valid sigset_t, and `info` a zeroed siginfo
        // that lives across the call, which writes it.
        let n = unsafe { libc::sigwaitinfo(set.as_ref(), info.as_mut_ptr()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        // SAFETY: sigwaitinfo filled `info` in.
        let info = unsafe { info.assume_init() };
        let signal = Signal::try_from(n).map_err(io::Error::from)?;
        // SI_USER, SI_QUEUE and SI_TKILL (kill, sigqueue, tgkill) carry the
        // sender's pid.
        let from = matches!(
            info.si_code,
            libc::SI_USER | libc::SI_QUEUE | libc::SI_TKILL
        )
        // SAFETY: for these codes the kernel fills in si_pid.
        .then(|| unsafe { info.si_pid() });
        return Ok((signal, from));
    }
}

/// The body of `hyfi-signals`: sigwait, dispatch, repeat until stopped.
fn wait_loop(
    set: SigSet,
    stop: &AtomicBool,
    handler: &(impl Fn(SignalEvent) + Send),
) -> Result<(), NetError> {
    loop {
        let signal = wait_info(&set).map_err(|e| {
            NetError::io(
                "waiting for signals (sigwaitinfo) in the signal-handling thread",
                e,
            )
        });
        let (signal, from) = match signal {
            Ok(s) => s,
            Err(e) => {
                tracing::error!("{e}; asynchronous signals will stay pending");
                return Err(e);
            }
        };
        let event = match signal {
            Signal::SIGINT | Signal::SIGTERM | Signal::SIGHUP | Signal::SIGQUIT => {
                SignalEvent::Abort { signal, from }
            }
            Signal::SIGUSR1 => SignalEvent::DumpStats,
            other => {
                if other == WAKE && stop.load(Ordering::Acquire) {
                    tracing::debug!("signal-handling thread stopping");
                    return Ok(());
                }
                tracing::debug!("signal-handling thread: ignoring {other}");
                continue;
            }
        };
        tracing::debug!("signal-handling thread: {signal} -> {event}");
        // The handler is only ever called here, on this thread, so a panic
        // cannot leave state shared with another call half-updated.
        if catch_unwind(AssertUnwindSafe(|| handler(event))).is_err() {
            tracing::error!("the signal handler panicked on {event}; still waiting for signals");
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn exit_codes_match_the_shell() {
        assert_eq!(exit_code_for(Signal::SIGINT), 130);
        assert_eq!(exit_code_for(Signal::SIGTERM), 143);
        assert_eq!(exit_code_for(Signal::SIGHUP), 129);
    }

    #[test]
    fn synchronous_faults_are_not_in_the_set() {
        let set = async_set();
        for s in [
            Signal::SIGSEGV,
            Signal::SIGBUS,
            Signal::SIGFPE,
            Signal::SIGILL,
            Signal::SIGABRT,
        ] {
            assert!(!set.contains(s), "{s} must stay unblocked");
        }
        assert_eq!(set.iter().count(), ASYNC_SIGNALS.len());
    }
}
