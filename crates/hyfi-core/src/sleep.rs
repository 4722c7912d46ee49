//! Idling without losing wake-ups.
//!
//! A waiting thread spins briefly (a phase barrier is usually short), then
//! yields, then parks. A server thread pinned to a CPU yields for longer
//! ([`PINNED_POLL`]) before it parks: see there. The protocol that makes
//! parking safe is the classic Dekker pair, both sides `SeqCst`:
//!
//! * waiter: `sleeping = true`, then re-check the condition, then park;
//! * notifier: make the condition true, then `if sleeping.swap(false) { unpark }`.
//!
//! Either the waiter's re-check sees the condition, or the notifier sees
//! `sleeping` and unparks. `unpark` before `park` is remembered by std, so the
//! order of the last two steps does not matter. A long `park_timeout` is a
//! backstop only; correctness never depends on it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::Thread;
use std::time::{Duration, Instant};

const SPINS: u32 = 2_000;
const YIELDS: u32 = 16;
const BACKSTOP: Duration = Duration::from_millis(50);

/// How long a waiting thread of a node that owns its CPUs polls (yielding)
/// before it sleeps: see [`own_cpu`].
pub const OWN_CPU_POLL: Duration = Duration::from_millis(1);

static OWN_CPU: AtomicBool = AtomicBool::new(false);

/// Declares that this process is a node whose threads all share CPUs no
/// other node uses, one per server thread (several nodes on a host, pinned).
/// Its waits then poll by yielding for up to [`OWN_CPU_POLL`] before they
/// sleep, instead of spinning: the thread that will end the wait (the
/// communication thread delivering a page or a release) runs on the same
/// CPU and needs it, and a CPU that went idle is slow to wake on a virtual
/// machine (the vCPU halts; tens of µs per message, measured). The node
/// owns the CPU, so nothing else loses by it.
pub fn set_own_cpu() {
    OWN_CPU.store(true, Ordering::Relaxed);
}

/// How long a server thread pinned to a CPU polls by yielding, after its
/// spin, before it sleeps.
///
/// A parked thread is slow to wake on a virtual machine: its vCPU halts,
/// and waking it costs tens of µs. Phase barriers of a Jacobi sweep of
/// 1024² on 2 processors (about 500 µs a sweep) outlast the 2 000-iteration
/// spin in up to a third of the sweeps (5 to 145 of a run's ~350 waits,
/// counted), from nothing but the host's noise, and each such sweep then
/// paid the wake-up on its critical path: the run's time was bimodal,
/// 0.096–0.119 s, against 0.102–0.106 s for OpenMP, whose threads spin
/// 300 000 times by default (libgomp's `GOMP_SPINCOUNT`; roughly a
/// millisecond here). Yielding rather than spinning keeps the wait fair
/// when the CPU is shared after all (several runtimes in one process, or
/// other programs pinned there): a thread that needs the CPU gets it.
pub const PINNED_POLL: Duration = Duration::from_micros(500);

/// Whether [`set_own_cpu`] was called.
pub fn own_cpu() -> bool {
    OWN_CPU.load(Ordering::Relaxed)
}

static CPUS_EXCLUSIVE: AtomicBool = AtomicBool::new(false);

/// Declares, after [`set_own_cpu`], that no other node shares this node's
/// CPUs either (local nodes that outnumber the CPUs share them round-robin,
/// and still own their CPUs in `set_own_cpu`'s sense: nothing outside the
/// job runs there). A waiting thread may then spin while it drives the
/// transport ([`poll_own_cpu`]), and a transport may read its links on the
/// waiting thread: nobody else needs the CPU. Where nodes share a CPU a
/// spinning waiter would hold the other node up for a time slice (4 local
/// nodes on 2 CPUs: LU 256 took 0.41 s so, against 0.04 s yielding).
pub fn set_cpus_exclusive() {
    CPUS_EXCLUSIVE.store(true, Ordering::Relaxed);
}

/// Whether [`set_own_cpu`] and [`set_cpus_exclusive`] were both called.
pub fn cpus_exclusive() -> bool {
    own_cpu() && CPUS_EXCLUSIVE.load(Ordering::Relaxed)
}

/// Polls `ready` by yielding the CPU, for up to [`OWN_CPU_POLL`] when the
/// node owns its CPUs (else not at all); true if it became ready.
pub fn poll_own_cpu(ready: impl FnMut() -> bool) -> bool {
    own_cpu() && poll_yielding(ready, OWN_CPU_POLL, Spin::WhileDriving)
}

/// [`poll_own_cpu`] for a mailbox whose deliveries each bump `generation`:
/// `look` runs first, then again only after a delivery; what it finds,
/// if anything within the poll. The waits for a collective's piece (the
/// seam's and hyfi-net's) poll so, inside the polling bracket, which
/// spares the lanes' producers their bell.
pub fn poll_own_cpu_for<T>(
    generation: &AtomicU64,
    mut look: impl FnMut() -> Option<T>,
) -> Option<T> {
    let mut seen = None;
    let mut got = None;
    poll_own_cpu(|| {
        let now = generation.load(Ordering::Acquire);
        if seen == Some(now) {
            return false;
        }
        seen = Some(now);
        got = look();
        got.is_some()
    });
    got
}

/// Whether a polling thread may spin rather than yield between polls.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Spin {
    /// Where the node's CPUs are its own and the transport is driven by
    /// polling: nothing else of the node needs this CPU while a command
    /// runs (its caller sleeps in [`Parker::wait_for_command`]).
    WhileDriving,
    /// Never: the thread that ends the wait needs this CPU (a server
    /// thread waiting for the next command, which the caller thread, on
    /// the node's CPUs too, must be given the CPU to issue).
    Never,
}

/// Polls `ready` by yielding the CPU for up to `span`; true if it became ready.
fn poll_yielding(mut ready: impl FnMut() -> bool, span: Duration, spin: Spin) -> bool {
    let until = Instant::now() + span;
    // The transport may skip waking this node while it polls.
    let _polling = crate::link::Attend::start(crate::link::Attending::Polling);
    loop {
        // A thread with nothing to do drives the transport's progress where
        // it has one (MPI: see `link::set_idle_progress`).
        let polls = crate::link::idle_progress();
        if ready() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        if polls && cpus_exclusive() && spin == Spin::WhileDriving {
            // The transport progresses only while someone polls, and this
            // thread is the one with nothing else to do: yielding would
            // hand the CPU to the transport's own polling thread and back,
            // a context switch per poll (a page fetch over MPI took 10.7 µs
            // so, 6.3 µs spinning; BENCHMARKS.md). The node owns the CPU,
            // and the wait is bounded by `span`.
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// One thread's sleep slot.
#[derive(Debug)]
pub(crate) struct Parker {
    thread: Thread,
    sleeping: AtomicBool,
    /// How long to poll by yielding before sleeping: [`PINNED_POLL`] for a
    /// server thread pinned to a CPU, else none (a few yields).
    poll: Duration,
}

impl Parker {
    /// A slot for the calling thread.
    pub(crate) fn current() -> Self {
        Parker {
            thread: std::thread::current(),
            sleeping: AtomicBool::new(false),
            poll: Duration::ZERO,
        }
    }

    /// A slot for the calling server thread, pinned to a CPU: it polls for
    /// [`PINNED_POLL`] before it sleeps.
    pub(crate) fn pinned() -> Self {
        Parker {
            poll: PINNED_POLL,
            ..Parker::current()
        }
    }

    /// Waits until `ready()` holds. Must be called on the slot's own thread.
    pub(crate) fn wait_until(&self, ready: impl FnMut() -> bool) {
        self.wait_until_deadline(ready, None)
    }

    /// Waits, as a server thread waits for the next command, until
    /// `ready()` holds: as [`Parker::wait_until`], but polling by yielding
    /// only, never spinning. The thread that issues the command (the
    /// program's, between its `start`s) runs on this node's CPUs: a server
    /// thread that spun there held it off until the scheduler preempted
    /// the spin, up to [`OWN_CPU_POLL`] for each command (see
    /// [`Parker::wait_for_command`]).
    pub(crate) fn wait_for_next_command(&self, ready: impl FnMut() -> bool) {
        self.wait_with(ready, None, Spin::Never)
    }

    /// Waits, as the thread that started a command waits for the server
    /// threads to finish it, until `ready()` holds: it sleeps at once. It
    /// has nothing to do meanwhile, and the processors it waits for run on
    /// the node's CPUs, which it shares with them (a node has one server
    /// thread per CPU). A caller that polled there held a processor off
    /// its CPU until the scheduler preempted it: every `rt.start` of a
    /// phase of one empty filament took 2.1 ms on 2 local nodes of one
    /// processor so, each message of the phase's end waiting for the poll
    /// to end, and a caller that spun and yielded a while before it slept
    /// still cost 95–100 µs a start on one node (under EEVDF a yielding
    /// thread keeps the CPU until the woken one is eligible); sleeping at
    /// once, 12–15 µs on one node, 25–30 µs on two (BENCHMARKS.md).
    pub(crate) fn wait_for_command(&self, ready: impl FnMut() -> bool) {
        // What the transport holds back goes out before this thread waits
        // (see `link::before_wait`).
        crate::link::idle_progress();
        self.sleep_until(ready, None);
    }

    /// Waits until `ready()` holds or `deadline` (if any) has passed.
    pub(crate) fn wait_until_deadline(
        &self,
        ready: impl FnMut() -> bool,
        deadline: Option<Instant>,
    ) {
        self.wait_with(ready, deadline, Spin::WhileDriving)
    }

    fn wait_with(&self, mut ready: impl FnMut() -> bool, deadline: Option<Instant>, spin: Spin) {
        let mut ready = move || ready() || deadline.is_some_and(|d| Instant::now() >= d);
        // What the transport holds back goes out before this thread waits
        // (see `link::before_wait`).
        crate::link::idle_progress();
        if own_cpu() && poll_yielding(&mut ready, OWN_CPU_POLL, spin) {
            return;
        }
        for _ in 0..SPINS {
            if ready() {
                return;
            }
            std::hint::spin_loop();
        }
        if self.poll.is_zero() || own_cpu() {
            // Unpinned (or the node's own-CPU poll above already ran).
            for _ in 0..YIELDS {
                if ready() {
                    return;
                }
                std::thread::yield_now();
            }
        } else if poll_yielding(&mut ready, self.poll, spin) {
            return;
        }
        self.sleep_until(ready, deadline);
    }

    /// Sleeps until `ready()` holds (`deadline`, if any, is in `ready`; it
    /// only shortens the naps): `sleeping` is set before the last look, so
    /// a `notify` after the condition became true finds it (Dekker's pair
    /// with `notify`).
    fn sleep_until(&self, mut ready: impl FnMut() -> bool, deadline: Option<Instant>) {
        loop {
            self.sleeping.store(true, Ordering::SeqCst);
            if ready() {
                self.sleeping.store(false, Ordering::Relaxed);
                return;
            }
            let nap = deadline.map_or(BACKSTOP, |d| {
                d.saturating_duration_since(Instant::now()).min(BACKSTOP)
            });
            std::thread::park_timeout(nap);
            self.sleeping.store(false, Ordering::Relaxed);
            if ready() {
                return;
            }
        }
    }

    /// Wakes the slot's thread if it sleeps. Call after making its condition true.
    pub(crate) fn notify(&self) {
        // Read first: most notifications find the thread awake, and a plain
        // load leaves its cache line shared instead of taking it exclusive.
        if self.sleeping.load(Ordering::SeqCst) && self.sleeping.swap(false, Ordering::SeqCst) {
            self.thread.unpark();
        }
    }
}

/// A condition variable that makes no system call when nobody sleeps on
/// it. Rust's [`Condvar::notify_all`] is a `futex` call whether or not a
/// thread waits; state that changes at every message (the shared memory's
/// protocol at each `REL`, the collectives at each piece) rang one for
/// nobody a microsecond each on a virtual machine, on a release's
/// critical path (LU 512 on 2×1: 1 715 `futex` wakes a run, 10 since).
///
/// It counts its sleepers. The count changes only under the mutex the
/// sleepers wait with: a sleeper counts itself while it holds the lock,
/// before the wait releases it, and uncounts itself after the wait takes
/// it again; a notifier looks at the count while it holds the same lock,
/// after its change. So a sleeper the notifier does not count has not
/// yet taken the lock to look at the state, and will see the change.
/// Every method takes the guard of that mutex as the proof it is held;
/// using two mutexes with one `QuietCondvar` loses wake-ups, as with a
/// `Condvar`.
///
/// ```
/// use hyfi_core::sleep::QuietCondvar;
/// use std::sync::{Arc, Mutex};
///
/// let state = Arc::new((Mutex::new(false), QuietCondvar::new()));
/// let s = state.clone();
/// let waiter = std::thread::spawn(move || {
///     let (m, cv) = &*s;
///     let mut done = m.lock().unwrap();
///     while !*done {
///         done = cv.wait(done);
///     }
/// });
/// let (m, cv) = &*state;
/// let mut done = m.lock().unwrap();
/// *done = true;
/// cv.notify_all(&done); // a system call only if the waiter sleeps
/// drop(done);
/// waiter.join().unwrap();
/// ```
///
/// [`Condvar::notify_all`]: std::sync::Condvar::notify_all
#[derive(Debug, Default)]
pub struct QuietCondvar {
    cv: std::sync::Condvar,
    /// Threads in a wait, changed and read only under the sleepers' mutex
    /// (an atomic for interior mutability; the mutex orders it).
    sleepers: std::sync::atomic::AtomicUsize,
}

impl QuietCondvar {
    /// A condition variable with no sleeper.
    pub const fn new() -> QuietCondvar {
        QuietCondvar {
            cv: std::sync::Condvar::new(),
            sleepers: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Sleeps until notified (or spuriously, as [`Condvar::wait`]);
    /// returns the lock again. A poisoned lock is taken as it is.
    ///
    /// [`Condvar::wait`]: std::sync::Condvar::wait
    pub fn wait<'a, T>(&self, held: std::sync::MutexGuard<'a, T>) -> std::sync::MutexGuard<'a, T> {
        self.sleepers.fetch_add(1, Ordering::Relaxed);
        let held = self.cv.wait(held).unwrap_or_else(|e| e.into_inner());
        self.sleepers.fetch_sub(1, Ordering::Relaxed);
        held
    }

    /// Sleeps until notified or for at most `d`; returns the lock again.
    pub fn wait_timeout<'a, T>(
        &self,
        held: std::sync::MutexGuard<'a, T>,
        d: Duration,
    ) -> std::sync::MutexGuard<'a, T> {
        self.sleepers.fetch_add(1, Ordering::Relaxed);
        let held = self
            .cv
            .wait_timeout(held, d)
            .unwrap_or_else(|e| e.into_inner())
            .0;
        self.sleepers.fetch_sub(1, Ordering::Relaxed);
        held
    }

    /// Wakes every sleeper, if any: call after the change, the lock still
    /// held (`held`).
    pub fn notify_all<T>(&self, held: &std::sync::MutexGuard<'_, T>) {
        if self.sleeping(held) {
            self.cv.notify_all();
        }
    }

    /// Whether a thread sleeps: look after the change, the lock held
    /// (`_held`), then [`notify_all_now`](QuietCondvar::notify_all_now)
    /// once the lock is released, so the woken thread does not wait for it.
    pub fn sleeping<T>(&self, _held: &std::sync::MutexGuard<'_, T>) -> bool {
        self.sleepers.load(Ordering::Relaxed) > 0
    }

    /// Wakes every sleeper, unconditionally: after
    /// [`sleeping`](QuietCondvar::sleeping) said one sleeps.
    pub fn notify_all_now(&self) {
        self.cv.notify_all();
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::{Config, Runtime};

    /// The poll of server thread 0 of a one-processor runtime.
    fn server_poll(pin: bool) -> Duration {
        let rt = Runtime::new(Config::new().procs(1).pin(pin)).unwrap();
        // Run something, so the server thread has certainly set its slot.
        assert_eq!(rt.run(|_| 7).unwrap(), 7);
        rt.shared.workers[0].parker().poll
    }

    #[test]
    fn only_a_pinned_server_thread_polls_before_it_sleeps() {
        assert_eq!(server_poll(true), PINNED_POLL);
        assert_eq!(server_poll(false), Duration::ZERO);
        // The runtime's caller, and any other thread, does not poll for
        // PINNED_POLL: after its spin and a few yields it sleeps.
        assert_eq!(Parker::current().poll, Duration::ZERO);
    }

    /// Many rounds of a turn handed back and forth between two threads,
    /// each sleeping on the one condition variable between its turns, one
    /// notifying under the lock and one after it: every round ends with
    /// the other thread's change seen, and the count of sleepers is back
    /// to none. (A missed sleeper would show as a wait that lasts to its
    /// timeout: the waits are bounded, so such a bug makes the test slow,
    /// never hung.)
    #[test]
    fn a_quiet_condvar_misses_no_sleeper() {
        use std::sync::{Arc, Mutex};
        let shared = Arc::new((Mutex::new(0u64), QuietCondvar::new()));
        let rounds = 5_000u64;
        let nap = Duration::from_millis(20);
        let other = {
            let shared = shared.clone();
            std::thread::spawn(move || {
                let (m, cv) = &*shared;
                let mut turn = m.lock().unwrap();
                while *turn < 2 * rounds {
                    if *turn % 2 == 1 {
                        *turn += 1;
                        cv.notify_all(&turn);
                    } else {
                        turn = cv.wait_timeout(turn, nap);
                    }
                }
            })
        };
        let (m, cv) = &*shared;
        let mut turn = m.lock().unwrap();
        while *turn < 2 * rounds {
            if *turn % 2 == 0 {
                *turn += 1;
                let sleeping = cv.sleeping(&turn);
                drop(turn);
                if sleeping {
                    cv.notify_all_now();
                }
                turn = m.lock().unwrap();
            } else {
                turn = cv.wait_timeout(turn, nap);
            }
        }
        drop(turn);
        other.join().unwrap();
        assert_eq!(*m.lock().unwrap(), 2 * rounds);
        assert_eq!(cv.sleepers.load(Ordering::Relaxed), 0);
    }
}
