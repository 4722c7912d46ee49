//! A node's last words: a fault that kills the process (a filthread stack
//! overflow, an abort, an out-of-memory) is handed to the layer above
//! before the process dies, so that the other nodes, and the launcher,
//! learn the real cause instead of only "its connection closed".
//!
//! The fault is noticed in a signal handler, where almost nothing is
//! allowed: no locks, no allocation, no sockets another thread may be
//! writing. So the handler only copies the text into a static buffer,
//! writes one byte to a pipe and waits (at most [`WAIT`]); a thread of this
//! module, blocked on the pipe, wakes, hands the text to the hook
//! ([`set_hook`]; hyfi-net sends it to every peer) and says when it is
//! done. Then the handler lets the process die as it would have.
//!
//! Ordering: the handler stores the text, then its length with `Release`;
//! the thread loads the length with `Acquire` after the pipe's byte, so it
//! reads the whole text. A second fault while the first is being told
//! waits for the process to die (bounded too).

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// How long a dying thread waits for its last words to be sent.
pub const WAIT: Duration = Duration::from_secs(1);

/// Longest text kept.
const CAP: usize = 1024;

type Hook = Box<dyn Fn(&str) + Send + Sync>;

static HOOK: OnceLock<Hook> = OnceLock::new();
/// The pipe's writing end, or -1 until [`set_hook`].
static PIPE_W: AtomicI32 = AtomicI32::new(-1);
/// Claimed by the first fault.
static CLAIMED: AtomicBool = AtomicBool::new(false);
/// Set when the hook returned.
static DONE: AtomicBool = AtomicBool::new(false);
static LEN: AtomicUsize = AtomicUsize::new(0);
static BUF: [AtomicU8; CAP] = [const { AtomicU8::new(0) }; CAP];

/// Installs `hook`, called with the text of this process's fatal fault
/// before it dies, on a thread of its own; and a SIGABRT handler, so that
/// an abort (an out-of-memory, a panic while panicking) is told too. Once
/// per process: a second call is ignored and returns `Ok`.
pub fn set_hook(hook: impl Fn(&str) + Send + Sync + 'static) -> std::io::Result<()> {
    if HOOK.set(Box::new(hook)).is_err() {
        return Ok(());
    }
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let read = fds[0];
    std::thread::Builder::new()
        .name("hyfi-last-words".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            let mut b = 0u8;
            // SAFETY: reads one byte into a live local; `read` is ours.
            let n = unsafe { libc::read(read, (&mut b as *mut u8).cast(), 1) };
            if n != 1 {
                return;
            }
            let len = LEN.load(Ordering::Acquire).min(CAP);
            let bytes: Vec<u8> = BUF[..len]
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect();
            if let Some(h) = HOOK.get() {
                h(&String::from_utf8_lossy(&bytes));
            }
            DONE.store(true, Ordering::Release);
        })?;
    PIPE_W.store(fds[1], Ordering::Release);
    install_abort_handler();
    Ok(())
}

/// Tells the hook `text` and waits for it (at most [`WAIT`]). Safe in a
/// signal handler: atomics, `write(2)` and `nanosleep(2)` only. Does
/// nothing without a hook. A second caller waits for the process to die.
pub(crate) fn say(text: &[u8]) {
    let w = PIPE_W.load(Ordering::Acquire);
    if w < 0 {
        return;
    }
    if CLAIMED.swap(true, Ordering::AcqRel) {
        wait_for(|| false);
        return;
    }
    let len = text.len().min(CAP);
    for (slot, &b) in BUF.iter().zip(&text[..len]) {
        slot.store(b, Ordering::Relaxed);
    }
    LEN.store(len, Ordering::Release);
    // SAFETY: writes one byte from a live static to our pipe.
    unsafe { libc::write(w, b"!".as_ptr().cast(), 1) };
    wait_for(|| DONE.load(Ordering::Acquire));
}

/// Sleeps in 1 ms steps until `done` or [`WAIT`] passed.
fn wait_for(done: impl Fn() -> bool) {
    let step = libc::timespec {
        tv_sec: 0,
        tv_nsec: 1_000_000,
    };
    for _ in 0..WAIT.as_millis() {
        if done() {
            return;
        }
        // SAFETY: nanosleep reads the timespec it is given.
        unsafe { libc::nanosleep(&step, std::ptr::null_mut()) };
    }
}

/// SIGABRT: say so, then die of it (the handler is reset first, so
/// `abort(3)`'s second raise kills the process).
fn install_abort_handler() {
    // SAFETY: sigaction with a valid handler and an empty mask.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_abort as *const () as usize;
        sa.sa_flags = libc::SA_RESETHAND | libc::SA_ONSTACK;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGABRT, &sa, std::ptr::null_mut());
    }
}

extern "C" fn on_abort(_sig: libc::c_int) {
    // A fault that was told already (a stack overflow aborts after it):
    // die at once.
    if CLAIMED.load(Ordering::Acquire) {
        return;
    }
    say(
        b"aborted (SIGABRT): an out-of-memory, a panic while panicking, or an assertion \
          in foreign code; its own output says which",
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn the_hook_hears_the_first_fault_and_the_caller_waits_for_it() {
        static HEARD: Mutex<Vec<String>> = Mutex::new(Vec::new());
        set_hook(|t| HEARD.lock().unwrap().push(t.to_string())).unwrap();
        say(b"filthread stack overflow on processor 3");
        // `say` returned after the hook, so it heard it already.
        assert_eq!(
            *HEARD.lock().unwrap(),
            vec!["filthread stack overflow on processor 3".to_string()]
        );
        assert!(DONE.load(Ordering::Acquire));
    }
}
