//! Filthread stacks: a per-worker pool of guarded `mmap` stacks, and the
//! SIGSEGV handler that turns a hit on a guard page into a message naming the
//! stack-size setting.
//!
//! Fresh stacks cost an `mmap` + `mprotect` (~9 µs); a pooled one costs a
//! `Vec::pop`. Stacks are never freed while the runtime lives, only reused.
//!
//! Overflow detection: every switch onto a filthread stack records that
//! stack's guard page in a thread-local ([`enter`]); the handler, which runs
//! on the thread's alternate signal stack, compares the faulting address with
//! it. Anything else is passed to the handler that was installed before ours
//! (normally std's, which reports overflows of OS thread stacks).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};

use corosensei::stack::{DefaultStack, Stack};

use crate::error::Error;

/// A pool of equally sized stacks, owned by one worker.
pub(crate) struct StackPool {
    size: usize,
    free: Vec<DefaultStack>,
    pub(crate) created: u64,
}

impl StackPool {
    pub(crate) fn new(size: usize) -> Self {
        StackPool {
            size,
            free: Vec::new(),
            created: 0,
        }
    }

    /// A stack from the pool, or a fresh one if the pool is empty.
    pub(crate) fn take(&mut self) -> Result<DefaultStack, Error> {
        match self.free.pop() {
            Some(s) => Ok(s),
            None => {
                self.created += 1;
                DefaultStack::new(self.size).map_err(|source| Error::StackMap {
                    size: self.size,
                    source,
                })
            }
        }
    }

    /// Returns a stack for reuse.
    pub(crate) fn give(&mut self, s: DefaultStack) {
        self.free.push(s);
    }
}

/// The bounds of the stack code is running on: the address below which a
/// join moves onto a fresh segment (`red`), and the guard page (`guard`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct StackBounds {
    pub(crate) red: usize,
    pub(crate) guard: usize,
}

/// Below this many free bytes a join runs its first branch on a new stack
/// segment, so deep recursion through joins never overflows.
pub(crate) const RED_ZONE: usize = 64 * 1024;

impl StackBounds {
    pub(crate) fn of(stack: &DefaultStack) -> Self {
        let limit = stack.limit().get();
        StackBounds {
            red: limit + page_size() + RED_ZONE,
            guard: limit,
        }
    }
}

thread_local! {
    // Guard page of the filthread stack this thread is running on (0: none).
    static GUARD: Cell<usize> = const { Cell::new(0) };
    // Processor index of this server thread, for the overflow message.
    static PROC: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// Records that the thread now runs on a stack with these bounds; returns the
/// previous guard so the caller can restore it.
#[inline]
pub(crate) fn enter_guard(guard: usize) -> usize {
    GUARD.with(|g| g.replace(guard))
}

pub(crate) fn set_proc(p: usize) {
    PROC.with(|c| c.set(p));
}

fn page_size() -> usize {
    static PS: OnceLock<usize> = OnceLock::new();
    // SAFETY: sysconf has no preconditions.
    *PS.get_or_init(|| unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize)
}

/// Stack size named in the overflow message (the largest configured in this
/// process).
static CONFIGURED_SIZE: AtomicUsize = AtomicUsize::new(0);
/// Set by the first overflow of the process, which alone reports it.
static OVERFLOWED: AtomicBool = AtomicBool::new(false);
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// Installs the overflow handler once per process and an alternate signal
/// stack on the calling thread if it has none.
pub(crate) fn install_overflow_handler(stack_size: usize) {
    CONFIGURED_SIZE.fetch_max(stack_size, Ordering::Relaxed);
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: sigaction with a valid handler and zeroed mask; the old
        // action is saved before ours can run (PREVIOUS is set first).
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGSEGV, std::ptr::null(), &mut old);
            let _ = PREVIOUS.set(old);
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_segv as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGSEGV, &sa, std::ptr::null_mut());
        }
    });
}

/// Makes sure the calling thread has an alternate signal stack, so the
/// handler can run when the regular stack is exhausted. std gives one to the
/// threads it spawns; this covers the case where it did not.
pub(crate) fn ensure_altstack() {
    // SAFETY: querying and setting the alternate stack of the calling thread
    // with a region we own and never free (one per server thread).
    unsafe {
        let mut cur: libc::stack_t = std::mem::zeroed();
        libc::sigaltstack(std::ptr::null(), &mut cur);
        if cur.ss_flags & libc::SS_DISABLE == 0 {
            return;
        }
        let size = 64 * 1024;
        let mem = libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if mem == libc::MAP_FAILED {
            return;
        }
        let st = libc::stack_t {
            ss_sp: mem,
            ss_flags: 0,
            ss_size: size,
        };
        libc::sigaltstack(&st, std::ptr::null_mut());
    }
}

extern "C" fn on_segv(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    let guard = GUARD.with(|g| g.get());
    if guard != 0 && addr >= guard && addr < guard + page_size() {
        // One message per process: with several processors overflowing at
        // once, the first tells it and ends the process; the others wait.
        if OVERFLOWED.swap(true, Ordering::AcqRel) {
            let second = libc::timespec {
                tv_sec: 1,
                tv_nsec: 0,
            };
            // The first thread aborts the process meanwhile: that bounds it.
            loop {
                // SAFETY: nanosleep only reads the timespec.
                unsafe { libc::nanosleep(&second, std::ptr::null_mut()) };
            }
        }
        let mut buf = [0u8; 512];
        let mut w = Writer {
            buf: &mut buf,
            len: 0,
        };
        w.put(b"filthread stack overflow on processor ");
        w.num(PROC.with(|p| p.get()));
        w.put(b" (filthread stack size ");
        w.num(CONFIGURED_SIZE.load(Ordering::Relaxed));
        w.put(
            b" bytes); raise it with HYFI_STACK_SIZE (e.g. HYFI_STACK_SIZE=8M) or \
              Config::stack_size, or make the filament recurse through Ctx::join, which \
              grows the stack",
        );
        let text_len = w.len;
        // SAFETY: write(2) is async-signal-safe; the buffers are live.
        unsafe {
            libc::write(2, b"hyfi: ".as_ptr().cast(), 6);
            libc::write(2, w.buf.as_ptr().cast(), text_len);
            libc::write(2, b"\n".as_ptr().cast(), 1);
        }
        // The other nodes hear it before this one dies (async-signal-safe).
        crate::last_words::say(&w.buf[..text_len]);
        // SAFETY: abort(3) is async-signal-safe.
        unsafe { libc::abort() };
    }
    // Not ours: hand over to the previous handler, or to the default action.
    // SAFETY: PREVIOUS holds the action that was installed before ours; calling
    // it with our arguments is what the kernel would have done.
    unsafe {
        match PREVIOUS.get() {
            Some(prev)
                if prev.sa_sigaction != libc::SIG_DFL && prev.sa_sigaction != libc::SIG_IGN =>
            {
                if prev.sa_flags & libc::SA_SIGINFO != 0 {
                    let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                        std::mem::transmute(prev.sa_sigaction);
                    f(sig, info, ctx);
                } else {
                    let f: extern "C" fn(libc::c_int) = std::mem::transmute(prev.sa_sigaction);
                    f(sig);
                }
            }
            _ => {
                // Restore the default action and return: the faulting
                // instruction runs again and the process dies of SIGSEGV.
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(libc::SIGSEGV, &sa, std::ptr::null_mut());
            }
        }
    }
}

/// Formats into a fixed buffer without allocating (signal-handler safe).
struct Writer<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl Writer<'_> {
    fn put(&mut self, s: &[u8]) {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s[..n]);
        self.len += n;
    }
    fn num(&mut self, mut v: usize) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        self.put(&digits[i..]);
    }
}

/// The stack pointer of the caller: the pruning test of a join and the
/// red-zone checks compare it with `Ctx::limit` and the stack bounds.
#[inline(always)]
pub(crate) fn stack_pointer() -> usize {
    let sp: usize;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: reads the stack pointer register; no memory is touched.
    unsafe {
        std::arch::asm!("mov {}, rsp", out(reg) sp, options(nomem, nostack, preserves_flags))
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: as above.
    unsafe {
        std::arch::asm!("mov {}, sp", out(reg) sp, options(nomem, nostack, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let x = 0u8;
        sp = std::hint::black_box(&x) as *const u8 as usize;
    }
    sp
}
