//! Latches: how a joiner learns that its forked job finished, without
//! blocking its server thread.
//!
//! A [`Latch`] is one byte of state, `UNSET` → `SET`, plus a slot for the
//! joiner's [`Waker`]. The runner (a thief on this node, or the completer
//! of a job that ran on another node) sets it when the job's result is
//! stored; the joiner probes it, and if it is not set, suspends its
//! filthread after moving the state to `WAITING`, so the setter knows to
//! wake it. Setting is the last touch of the job (the job-lifetime
//! invariant, see [`crate::job`]).

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::sched::{suspend, Waker};

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
        let traced = crate::trace::on().then(|| (crate::trace::now(), crate::trace::filthread()));
        suspend(|w| {
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
                    // SAFETY: as above; the setter never saw WAITING.
                    unsafe { (*self.waker.get()).take() };
                    false
                }
            }
        });
        if let Some((t, ft)) = traced {
            crate::trace::span(crate::trace::Kind::JoinWait, t, [ft, 0, 0, 0]);
        }
        debug_assert!(self.probe());
    }
}
