//! The scheduler: what a server thread (a processor) does. One OS thread
//! per processor, pinned by default, started once by the runtime and
//! reused for every command.
//!
//! A server thread waits for a command ([`crate::registry::Command`]), runs
//! it and reports it finished. While it runs one, it schedules its
//! filthreads ([`Sched`]): runnable ones first (woken after a suspension),
//! then new work, which is the command's: the next pool of the phase
//! (iterative mode, the loop is in `phase`), or (fork-join mode, here) its
//! own deque, its incoming list, then stealing on the node, then asking
//! another node. With nothing to do it *idles*: it says so (so that forks
//! elsewhere become real), and sleeps on its parker until work, a wake-up
//! or the end of the run arrives ([`crate::sleep`] makes that safe).
//!
//! What a filament sees of its processor is [`Ctx`] (module `ctx`); the
//! filthreads' coroutines, and suspending one, are module `coro`. The
//! scheduler's core (this module, `registry`, `job`, `latch`) names no
//! layer above hyfi-core: the cross-node state is plain data
//! (`crate::crossnode`), and the node's fork-join messaging
//! (`remote::steal`) is installed there at start-up.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_deque::Worker;

use crate::job::{unsafe_execute, JobRef};
use crate::registry::{Command, Shared};
use crate::stack;

mod coro;
mod ctx;

pub use coro::{suspend, Waker};
use coro::{Filthread, Ran};
pub use ctx::Ctx;
use ctx::CTX;
pub(crate) use ctx::{current_ctx, locate, try_current_ctx};

/// Filthreads of one server thread that are not running.
pub(crate) struct Sched {
    ready: VecDeque<Filthread>,
    suspended: HashMap<u64, Filthread, BuildHasherDefault<IdHasher>>,
    /// Running a fork-join command (the trace names segments by pool
    /// otherwise).
    fork_join: bool,
}

/// Filthread ids are distinct counters: hash them as themselves.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

impl Sched {
    /// The next runnable filthread, if any.
    #[inline]
    pub(crate) fn pop_ready(&mut self) -> Option<Filthread> {
        self.ready.pop_front()
    }

    /// Whether no filthread of this server thread waits to be woken.
    #[inline]
    pub(crate) fn none_suspended(&self) -> bool {
        self.suspended.is_empty()
    }

    pub(crate) fn drain_wakeups(&mut self, ctx: &Ctx) {
        let q = &ctx.ws().wakeups;
        // A pop on an empty SegQueue costs a SeqCst fence; this loop runs
        // between every two filthreads, almost always with nothing to drain.
        if q.is_empty() {
            return;
        }
        while let Some(id) = q.pop() {
            if let Some(ft) = self.suspended.remove(&id) {
                self.ready.push_back(ft);
            }
        }
    }

    pub(crate) fn run(&mut self, ctx: &Ctx, ft: Filthread) {
        if crate::trace::on() {
            return self.run_traced(ctx, ft);
        }
        match ft.resume(ctx) {
            Ran::Suspended(ft) => {
                self.suspended.insert(ft.id, ft);
            }
            Ran::Finished(stack) => ctx.stacks.borrow_mut().give(stack),
        }
    }

    /// [`Sched::run`], recording the segment: its pool, the filaments it
    /// ran, whether it was a resumption and whether it suspended.
    #[cold]
    fn run_traced(&mut self, ctx: &Ctx, ft: Filthread) {
        let (t0, f0, id) = (crate::trace::now(), ctx.stats.filaments.get(), ft.id);
        let mut flags = u64::from(ft.started) | (u64::from(self.fork_join) << 2);
        match ft.resume(ctx) {
            Ran::Suspended(ft) => {
                flags |= 2;
                self.suspended.insert(ft.id, ft);
            }
            Ran::Finished(stack) => ctx.stacks.borrow_mut().give(stack),
        }
        // The chunk's copy slot is the filthread's: it set it, and no
        // other filthread ran on this processor meanwhile.
        let pool = if self.fork_join {
            0
        } else {
            ctx.copy.get().slot
        };
        let ran = ctx.stats.filaments.get() - f0;
        crate::trace::span(
            crate::trace::Kind::Segment,
            t0,
            [pool as u64, ran, id, flags],
        );
    }

    /// Runs `body` on a new filthread from the stack pool. If no stack can be
    /// had, `body` runs on the server thread's own stack: waits inside it
    /// then block the thread instead of switching, which is slower but
    /// correct.
    pub(crate) fn spawn(&mut self, ctx: &Ctx, body: impl FnOnce(&Ctx) + 'static) {
        let stack = ctx.stacks.borrow_mut().take();
        match stack {
            Ok(stack) => {
                ctx.stats.filthreads.set(ctx.stats.filthreads.get() + 1);
                let ft = Filthread::new(ctx.next_id(), stack, body);
                self.run(ctx, ft);
            }
            Err(e) => {
                tracing::warn!(proc = ctx.proc, "{e}; running on the server thread's stack");
                body(ctx);
            }
        }
    }

    pub(crate) fn idle_wait(&self, ctx: &Ctx, ready: impl FnMut() -> bool) {
        self.idle_wait_until(ctx, ready, None)
    }

    /// [`Sched::idle_wait`], returning at `deadline` at the latest.
    fn idle_wait_until(
        &self,
        ctx: &Ctx,
        mut ready: impl FnMut() -> bool,
        deadline: Option<Instant>,
    ) {
        let t = Instant::now();
        let t0 = crate::trace::on().then(crate::trace::now);
        // An idle processor drives the transport's progress where it has
        // one (MPI: see `link::set_idle_progress`).
        ctx.ws().parker().wait_until_deadline(
            || {
                crate::link::idle_progress();
                !ctx.ws().wakeups.is_empty() || ready()
            },
            deadline,
        );
        ctx.stats
            .idle_ns
            .set(ctx.stats.idle_ns.get() + t.elapsed().as_nanos() as u64);
        if let Some(t0) = t0 {
            crate::trace::span(crate::trace::Kind::Idle, t0, [0; 4]);
        }
    }

    /// Fork-join mode: runs jobs until the root has finished and nothing of
    /// this server thread is left suspended.
    fn run_fork_join(&mut self, ctx: &Ctx) {
        self.fork_join = true;
        // Not in a phase: layers read it through `CtxExt::phase_key`.
        ctx.phase.set(u64::MAX);
        self.fork_join_loop(ctx);
        self.fork_join = false;
    }

    fn fork_join_loop(&mut self, ctx: &Ctx) {
        let sh = &*ctx.shared;
        loop {
            self.drain_wakeups(ctx);
            if let Some(ft) = self.ready.pop_front() {
                self.run(ctx, ft);
                continue;
            }
            if let Some(job) = ctx.deque.pop().or_else(|| ctx.pop_incoming()) {
                self.spawn(ctx, move |ctx| unsafe_execute(job, ctx));
                continue;
            }
            if sh.fj_done.load(Ordering::SeqCst) && self.suspended.is_empty() {
                return;
            }
            if let Some(job) = ctx.steal() {
                self.spawn(ctx, move |ctx| unsafe_execute(job, ctx));
                continue;
            }
            // Idle: say so (forks elsewhere become real), then wait for work.
            sh.idle.fetch_add(1, Ordering::SeqCst);
            if ctx.multi {
                for w in sh.workers.iter() {
                    w.want_fork();
                }
            }
            // A node of this host that asked through shared memory gets
            // its answer (a refusal) now, not when its request times out.
            ctx.answer_host_requests();
            // Nothing on this node: ask another one (paper §3.5). The kick
            // is read first, so a refusal that comes meanwhile is not missed.
            let kick = sh.fj.kick.load(Ordering::SeqCst);
            let ask_again = ask_another_node(ctx);
            self.idle_wait_until(
                ctx,
                || {
                    sh.fj_done.load(Ordering::SeqCst)
                        || !sh.injector.is_empty()
                        || sh.stealers.iter().any(|s| !s.is_empty())
                        || sh.workers.iter().any(|w| !w.incoming.is_empty())
                        || (ctx.latent_on && sh.workers.iter().any(|w| w.latent.any_listed()))
                        || sh.fj.kick.load(Ordering::SeqCst) != kick
                        || sh.fj.host.as_ref().is_some_and(|h| h.pending())
                },
                ask_again,
            );
            sh.idle.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// An idle processor found no work on its node: asks another node for
/// some (through the node's fork-join messaging, `remote::steal`, if one
/// is installed). Returns when to look again if nothing arrives.
fn ask_another_node(ctx: &Ctx) -> Option<Instant> {
    let sh = &*ctx.shared;
    let run = sh.fj.run.load(Ordering::SeqCst);
    if ctx.nodes == 1 || !sh.fj.active(run) || sh.fj_done.load(Ordering::SeqCst) {
        return None;
    }
    let b = sh.fj.stealing.get()?;
    b.want_work(run, sh.fj.host.as_ref(), sh.procs)
        .map(|d| Instant::now() + d)
}

/// Arguments a server thread starts with.
pub(crate) struct Start {
    pub(crate) shared: Arc<Shared>,
    pub(crate) proc: usize,
    pub(crate) cpu: Option<usize>,
    pub(crate) deque: Worker<JobRef>,
    pub(crate) ready: std::sync::mpsc::Sender<Result<(), crate::Error>>,
}

/// The body of server thread `proc`.
pub(crate) fn main(start: Start) {
    let Start {
        shared,
        proc,
        cpu,
        deque,
        ready,
    } = start;
    if let Some(cpu) = cpu {
        if let Err(e) = pin_to(cpu) {
            let _ = ready.send(Err(crate::Error::Pin {
                proc,
                cpu,
                source: e,
            }));
            return;
        }
    }
    stack::ensure_altstack();
    stack::set_proc(proc);
    shared.workers[proc].set_parker(cpu.is_some());
    let ctx = Box::new(Ctx::new(&shared, proc, deque));
    CTX.with(|c| c.set(&*ctx as *const Ctx));
    let _ = ready.send(Ok(()));
    drop(ready);

    let mut sched = Sched {
        ready: VecDeque::new(),
        suspended: HashMap::default(),
        fork_join: false,
    };
    crate::trace::processor_track(proc);
    let mut seen = 0u64;
    loop {
        let ws = ctx.ws();
        ws.parker()
            .wait_for_next_command(|| shared.epoch.load(Ordering::SeqCst) != seen);
        seen = shared.epoch.load(Ordering::SeqCst);
        let cmd = shared.command();
        let switches = thread_switches();
        match cmd {
            Command::Shutdown => break,
            Command::Idle => continue,
            Command::ForkJoin => sched.run_fork_join(&ctx),
            Command::Program(p) => (p.body)(&ctx, &mut sched, p.run),
        }
        let mut s = ctx.stats.drain();
        s.stacks_mapped = std::mem::take(&mut ctx.stacks.borrow_mut().created);
        let (gave_up, switched_out) = thread_switches();
        s.gave_up = gave_up.saturating_sub(switches.0);
        s.switched_out = switched_out.saturating_sub(switches.1);
        shared.stats[proc]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .add(&s);
        shared.finish_one();
    }
    CTX.with(|c| c.set(std::ptr::null()));
}

/// This thread's voluntary and involuntary context switches so far
/// (`ProcStats::gave_up`, `switched_out`); zeros if the OS will not say.
fn thread_switches() -> (u64, u64) {
    // SAFETY: `getrusage` writes the `rusage` it is given and nothing
    // else; an all-zero `rusage` is a valid value of the plain C struct.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_THREAD, &mut ru) != 0 {
            return (0, 0);
        }
        (ru.ru_nvcsw as u64, ru.ru_nivcsw as u64)
    }
}

fn pin_to(cpu: usize) -> std::io::Result<()> {
    use nix::sched::{sched_setaffinity, CpuSet};
    use nix::unistd::Pid;
    let mut set = CpuSet::new();
    set.set(cpu).map_err(std::io::Error::from)?;
    sched_setaffinity(Pid::from_raw(0), &set).map_err(std::io::Error::from)
}
