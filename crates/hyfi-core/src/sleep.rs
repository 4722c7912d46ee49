//! Idling without losing wake-ups.
//!
//! A waiting thread spins briefly (a phase barrier is usually short), then
//! yields, then parks. The protocol that makes parking safe is the classic
//! Dekker pair, both sides `SeqCst`:
//!
//! * waiter: `sleeping = true`, then re-check the condition, then park;
//! * notifier: make the condition true, then `if sleeping.swap(false) { unpark }`.
//!
//! Either the waiter's re-check sees the condition, or the notifier sees
//! `sleeping` and unparks. `unpark` before `park` is remembered by std, so the
//! order of the last two steps does not matter. A long `park_timeout` is a
//! backstop only; correctness never depends on it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::Thread;
use std::time::{Duration, Instant};

const SPINS: u32 = 2_000;
const YIELDS: u32 = 16;
const BACKSTOP: Duration = Duration::from_millis(50);

/// One thread's sleep slot.
#[derive(Debug)]
pub(crate) struct Parker {
    thread: Thread,
    sleeping: AtomicBool,
}

impl Parker {
    /// A slot for the calling thread.
    pub(crate) fn current() -> Self {
        Parker {
            thread: std::thread::current(),
            sleeping: AtomicBool::new(false),
        }
    }

    /// Waits until `ready()` holds. Must be called on the slot's own thread.
    pub(crate) fn wait_until(&self, ready: impl FnMut() -> bool) {
        self.wait_until_deadline(ready, None)
    }

    /// Waits until `ready()` holds or `deadline` (if any) has passed.
    pub(crate) fn wait_until_deadline(
        &self,
        mut ready: impl FnMut() -> bool,
        deadline: Option<Instant>,
    ) {
        let mut ready = move || ready() || deadline.is_some_and(|d| Instant::now() >= d);
        for _ in 0..SPINS {
            if ready() {
                return;
            }
            std::hint::spin_loop();
        }
        for _ in 0..YIELDS {
            if ready() {
                return;
            }
            std::thread::yield_now();
        }
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
