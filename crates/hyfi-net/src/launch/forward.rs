//! Forwarding the launcher's signals to its nodes. SIGINT, SIGTERM and
//! SIGHUP sent to the launcher are blocked on its thread and taken by a
//! thread of its own, which hands them to the supervising loop; the loop
//! sends them on to the nodes' groups. Forwarding rather than dying gives
//! the nodes a chance to shut down in order (the launcher's death would
//! SIGKILL them, see `PR_SET_PDEATHSIG` in [`super::node`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use nix::sys::signal::{SigSet, Signal};

/// The signals the launcher forwards to its nodes.
pub(super) const FORWARDED: [Signal; 3] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP];

/// Whether `sig` is ignored in this process (`nohup` ignores SIGHUP; a
/// shell without job control ignores SIGINT for a job in the background).
/// Such a signal is not forwarded: the nodes inherit the same intent (an
/// ignored disposition survives exec), and a blocked signal would be taken
/// by `sigtimedwait` even though ignored.
pub(super) fn ignored(sig: Signal) -> bool {
    let mut old = std::mem::MaybeUninit::<libc::sigaction>::zeroed();
    // SAFETY: with a null new action sigaction only writes the current one
    // into `old`, a zeroed (valid) sigaction that lives across the call.
    let rc = unsafe { libc::sigaction(sig as libc::c_int, std::ptr::null(), old.as_mut_ptr()) };
    // SAFETY: zeroed and then, on success, filled in by the kernel.
    rc == 0 && unsafe { old.assume_init() }.sa_sigaction == libc::SIG_IGN
}

/// Takes the forwarded signals until `stop`; `sigtimedwait` with a short
/// timeout because nothing can interrupt a plain `sigwait` portably.
pub(super) fn signal_loop(set: SigSet, stop: &AtomicBool, tx: &mpsc::Sender<Signal>) {
    let timeout = libc::timespec {
        tv_sec: 0,
        tv_nsec: 100_000_000,
    };
    while !stop.load(Ordering::Relaxed) {
        // SAFETY: `set` is a valid, initialised sigset (SigSet wraps one),
        // the info pointer may be null and `timeout` lives across the call.
        let sig = unsafe { libc::sigtimedwait(set.as_ref(), std::ptr::null_mut(), &timeout) };
        if sig > 0 {
            if let Ok(s) = Signal::try_from(sig) {
                if tx.send(s).is_err() {
                    return;
                }
            }
        }
    }
}
