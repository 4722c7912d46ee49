//! Server threads: one OS thread per processor, pinned by default, started
//! once and reused for every phase and every fork-join run.
//!
//! Each server thread owns a [`Ctx`] (what filaments see of it) and a
//! scheduler over its filthreads: runnable ones first, then (iterative mode)
//! the next pool of the phase, or (fork-join mode) its own deque, then
//! stealing, then idling until woken.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_deque::{Steal, Worker};

use crate::filthread::{Filthread, Ran, Yld};
use crate::fork::JobRef;
use crate::phase::{Control, PhaseBody, PostPhase};
use crate::runtime::{Command, ProgramRun, Shared, WorkerShared, DONE, WANTED};
use crate::stack::{self, StackBounds, StackPool};
use crate::stats::ProcStats;

thread_local! {
    static CTX: Cell<*const Ctx> = const { Cell::new(std::ptr::null()) };
}

/// The calling server thread's context. Panics off a server thread.
pub(crate) fn current_ctx() -> &'static Ctx {
    try_current_ctx().expect("hyfi: not on a server thread")
}

/// The calling server thread's context, if it is one.
pub(crate) fn try_current_ctx() -> Option<&'static Ctx> {
    let p = CTX.with(|c| c.get());
    // SAFETY: the pointer is set by the server thread to its own boxed Ctx,
    // which lives until that thread's main loop returns, after which no code
    // that could call this runs on the thread; it is cleared before the box
    // is dropped.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// What a filament sees of the processor running it: the architecture
/// queries of the paper, fork-join ([`Ctx::join`]), and access to reduction
/// variables' private copies.
///
/// A `&Ctx` is only ever lent to code running on its server thread; it is
/// neither `Send` nor `Sync`, so it cannot be smuggled to another thread
/// (which would let two threads touch one processor's private copies):
///
/// ```compile_fail,E0277
/// fn needs_send<T: Send>(_: T) {}
/// fn leak(ctx: &hyfi_core::Ctx) { needs_send(ctx) }
/// ```
///
/// ```compile_fail,E0277
/// let rt = hyfi_core::Runtime::new(hyfi_core::Config::new().procs(1).pin(false)).unwrap();
/// rt.run(|ctx| std::thread::scope(|s| { s.spawn(|| ctx.proc()); })).unwrap();
/// ```
///
/// Fork-join closures must be `Send`, since a stolen one runs elsewhere:
///
/// ```compile_fail,E0277
/// let rt = hyfi_core::Runtime::new(hyfi_core::Config::new().procs(1).pin(false)).unwrap();
/// let local = std::rc::Rc::new(1);
/// rt.run(|ctx| ctx.join(|_| *local, |_| 2)).unwrap();
/// ```
pub struct Ctx {
    pub(crate) shared: Arc<Shared>,
    pub(crate) rt_id: u64,
    /// The pruning test of a join in one word: a join makes plain calls iff
    /// the stack pointer is at or above `limit`. It holds the red-zone
    /// address `bounds.red` while no fork is wanted, and [`WANTED`] (above any
    /// stack) when one is: another processor went idle or stole our last
    /// job, or pruning is off. Other processors store `WANTED` into it
    /// through [`WorkerShared::want_fork`]; the owner clears it.
    pub(crate) limit: AtomicUsize,
    pub(crate) proc: usize,
    pub(crate) node: usize,
    pub(crate) nodes: usize,
    /// More than one processor on the node (stealing is possible).
    pub(crate) multi: bool,
    pub(crate) prune: bool,
    pub(crate) deque: Worker<JobRef>,
    pub(crate) yielder: Cell<*const Yld>,
    pub(crate) current: Cell<u64>,
    /// The pool (its index on this processor) whose filthread runs now; 0
    /// in fork-join mode. Reductions keep one private copy per pool, so
    /// the order in which pools interleave (when one waits for a page)
    /// cannot change a result; see `reduce`.
    pub(crate) pool: Cell<usize>,
    /// Set while a [`Reduction::update`](crate::Reduction::update) closure
    /// runs: suspending then could let another filthread update the same
    /// copy, and one of the two updates would be lost.
    pub(crate) in_update: Cell<bool>,
    pub(crate) iteration: Cell<u64>,
    /// The stack running now: its red zone (below which a join moves to a
    /// new segment; 0 off a filthread) and guard page.
    pub(crate) bounds: Cell<StackBounds>,
    pub(crate) stacks: RefCell<StackPool>,
    pub(crate) stats: LocalStats,
    /// The start-up slot the running filament holds (see `startup`).
    pub(crate) startup: Cell<Option<crate::startup::Slot>>,
    next_id: Cell<u64>,
    rng: Cell<u64>,
}

/// Counters kept in plain cells by the owning server thread.
#[derive(Default)]
pub(crate) struct LocalStats {
    pub(crate) filaments: Cell<u64>,
    pub(crate) pruned: Cell<u64>,
    pub(crate) forks: Cell<u64>,
    pub(crate) steal_attempts: Cell<u64>,
    pub(crate) steals: Cell<u64>,
    pub(crate) suspensions: Cell<u64>,
    pub(crate) filthreads: Cell<u64>,
    pub(crate) idle_ns: Cell<u64>,
    pub(crate) phases: Cell<u64>,
}

impl LocalStats {
    fn drain(&self) -> ProcStats {
        ProcStats {
            filaments: self.filaments.take(),
            pruned: self.pruned.take(),
            forks: self.forks.take(),
            steal_attempts: self.steal_attempts.take(),
            steals: self.steals.take(),
            suspensions: self.suspensions.take(),
            filthreads: self.filthreads.take(),
            idle_ns: self.idle_ns.take(),
            phases: self.phases.take(),
            stacks_mapped: 0,
        }
    }
}

impl Ctx {
    /// This processor's index on its node, `0..procs_per_node()` (`filMyProcessor`).
    #[inline]
    pub fn proc(&self) -> usize {
        self.proc
    }
    /// This node's index, `0..num_nodes()` (`filMyNode`).
    #[inline]
    pub fn node(&self) -> usize {
        self.node
    }
    /// Number of nodes (`filNumNodes`).
    #[inline]
    pub fn num_nodes(&self) -> usize {
        self.nodes
    }
    /// Processors on each node (`filNumProcessorsPerNode`).
    #[inline]
    pub fn procs_per_node(&self) -> usize {
        self.shared.procs
    }
    /// In iterative filaments: how many times the running phase has
    /// completed before (0 during its first execution). Lets filaments pick
    /// the current grid of a double-buffered computation, or LU's step `k`.
    #[inline]
    pub fn iteration(&self) -> u64 {
        self.iteration.get()
    }
    /// The access epoch: a number that changes whenever a phase (each
    /// execution of it) or a fork-join run begins on this node, and only
    /// then. Layers above hyfi-core key per-phase state on it: hyfi-dsm's
    /// shared arrays record whether they are read-only or written in the
    /// current epoch, which is what makes their read-only views plain
    /// memory.
    ///
    /// For layer crates (see `hyfi::layers`): hidden from the user's docs.
    #[doc(hidden)]
    #[inline]
    pub fn access_epoch(&self) -> u64 {
        self.shared.access_epoch.load(Ordering::Relaxed)
    }
    /// Global index of this processor: `node * procs_per_node + proc`.
    #[inline]
    pub fn global_proc(&self) -> usize {
        self.node * self.shared.procs + self.proc
    }

    /// Records the bounds of the stack now running; returns the previous.
    #[inline]
    pub(crate) fn set_bounds(&self, b: StackBounds) -> StackBounds {
        let cur = self.limit.load(Ordering::Relaxed);
        if cur != WANTED {
            // Fails only if another processor just asked for a fork: keep that.
            let _ = self
                .limit
                .compare_exchange(cur, b.red, Ordering::Relaxed, Ordering::Relaxed);
        }
        self.bounds.replace(b)
    }

    /// Makes this processor's next join a real fork.
    #[inline]
    pub(crate) fn want_fork(&self) {
        self.limit.store(WANTED, Ordering::Relaxed);
    }

    /// Back to pruning (plain calls) after a real fork, if pruning is on.
    #[inline]
    pub(crate) fn clear_want(&self) {
        if self.prune {
            let _ = self.limit.compare_exchange(
                WANTED,
                self.bounds.get().red,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }

    #[inline]
    pub(crate) fn ws(&self) -> &WorkerShared {
        &self.shared.workers[self.proc]
    }

    pub(crate) fn count_filaments(&self, n: u64) {
        self.stats.filaments.set(self.stats.filaments.get() + n);
    }

    fn next_id(&self) -> u64 {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        id
    }

    fn rand(&self) -> u64 {
        // xorshift64*: victim selection only.
        let mut x = self.rng.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.set(x);
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Takes a job from another processor of this node (or the injector).
    pub(crate) fn steal(&self) -> Option<JobRef> {
        let sh = &self.shared;
        loop {
            match sh.injector.steal() {
                Steal::Success(j) => return Some(j),
                Steal::Retry => continue,
                Steal::Empty => break,
            }
        }
        let p = sh.procs;
        if p == 1 {
            return None;
        }
        self.stats
            .steal_attempts
            .set(self.stats.steal_attempts.get() + 1);
        let start = (self.rand() as usize) % p;
        for k in 0..p {
            let v = (start + k) % p;
            if v == self.proc {
                continue;
            }
            loop {
                match sh.stealers[v].steal() {
                    Steal::Success(j) => {
                        // The victim may have nothing left to give: ask it to
                        // make its next fork a real one.
                        sh.workers[v].want_fork();
                        self.stats.steals.set(self.stats.steals.get() + 1);
                        return Some(j);
                    }
                    Steal::Retry => continue,
                    Steal::Empty => break,
                }
            }
            // Filaments sent to a busy processor (from another node, or by
            // start-up distribution) are fair game too.
            if let Some(j) = steal_from(&sh.workers[v].incoming) {
                self.stats.steals.set(self.stats.steals.get() + 1);
                return Some(j);
            }
        }
        None
    }

    /// A filament sent to this processor, if any.
    fn pop_incoming(&self) -> Option<JobRef> {
        steal_from(&self.ws().incoming)
    }
}

fn steal_from(q: &crossbeam_deque::Injector<JobRef>) -> Option<JobRef> {
    if q.is_empty() {
        return None;
    }
    loop {
        match q.steal() {
            Steal::Success(j) => return Some(j),
            Steal::Retry => continue,
            Steal::Empty => return None,
        }
    }
}

/// Filthreads of one server thread that are not running.
struct Sched {
    ready: VecDeque<Filthread>,
    suspended: HashMap<u64, Filthread, BuildHasherDefault<IdHasher>>,
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
    fn drain_wakeups(&mut self, ctx: &Ctx) {
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

    fn run(&mut self, ctx: &Ctx, ft: Filthread) {
        match ft.resume(ctx) {
            Ran::Suspended(ft) => {
                self.suspended.insert(ft.id, ft);
            }
            Ran::Finished(stack) => ctx.stacks.borrow_mut().give(stack),
        }
    }

    /// Runs `body` on a new filthread from the stack pool. If no stack can be
    /// had, `body` runs on the server thread's own stack: waits inside it
    /// then block the thread instead of switching, which is slower but
    /// correct.
    fn spawn(&mut self, ctx: &Ctx, body: impl FnOnce(&Ctx) + 'static) {
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

    fn idle_wait(&self, ctx: &Ctx, ready: impl FnMut() -> bool) {
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
        ctx.ws()
            .parker()
            .wait_until_deadline(|| !ctx.ws().wakeups.is_empty() || ready(), deadline);
        ctx.stats
            .idle_ns
            .set(ctx.stats.idle_ns.get() + t.elapsed().as_nanos() as u64);
    }

    /// Iterative mode: runs every pool of this processor for one phase.
    fn run_phase(
        &mut self,
        ctx: &Ctx,
        body: &'static dyn PhaseBody,
        run: &'static ProgramRun,
        phase: usize,
    ) {
        let pools = body.pools_of(ctx.proc);
        let mut next = 0;
        loop {
            self.drain_wakeups(ctx);
            if let Some(ft) = self.ready.pop_front() {
                self.run(ctx, ft);
                continue;
            }
            if next < pools && !run.aborted() {
                let k = next;
                next += 1;
                self.spawn(ctx, move |ctx| {
                    ctx.pool.set(k);
                    if let Err(p) = catch_unwind(AssertUnwindSafe(|| body.run_pool(ctx, k))) {
                        run.fail_panic(ctx.proc, format!("phase {phase} filament"), p);
                    }
                });
                continue;
            }
            if self.suspended.is_empty() {
                ctx.pool.set(0);
                return;
            }
            self.idle_wait(ctx, || false);
        }
    }

    /// Fork-join mode: runs jobs until the root has finished and nothing of
    /// this server thread is left suspended.
    fn run_fork_join(&mut self, ctx: &Ctx) {
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
            // Nothing on this node: ask another one (paper §3.5). The kick
            // is read first, so a refusal that comes meanwhile is not missed.
            let kick = sh.fj.kick.load(Ordering::SeqCst);
            let ask_again = crate::balance::idle(ctx);
            self.idle_wait_until(
                ctx,
                || {
                    sh.fj_done.load(Ordering::SeqCst)
                        || !sh.injector.is_empty()
                        || sh.stealers.iter().any(|s| !s.is_empty())
                        || sh.workers.iter().any(|w| !w.incoming.is_empty())
                        || sh.fj.kick.load(Ordering::SeqCst) != kick
                },
                ask_again,
            );
            sh.idle.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

fn unsafe_execute(job: JobRef, ctx: &Ctx) {
    // SAFETY: a JobRef in a deque or the injector points at a live job whose
    // owner waits for its latch (or, for the root, for the run to end)
    // before freeing it; each JobRef is popped or stolen exactly once.
    unsafe { job.execute(ctx) }
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
    shared.workers[proc].set_parker();
    let ctx = Box::new(Ctx {
        proc,
        node: shared.link.my_node(),
        nodes: shared.link.num_nodes(),
        multi: shared.procs > 1,
        prune: shared.cfg.get_prune(),
        deque,
        yielder: Cell::new(std::ptr::null()),
        current: Cell::new(0),
        pool: Cell::new(0),
        in_update: Cell::new(false),
        iteration: Cell::new(0),
        bounds: Cell::new(StackBounds::default()),
        stacks: RefCell::new(StackPool::new(shared.cfg.get_stack_size())),
        stats: LocalStats::default(),
        startup: Cell::new(None),
        next_id: Cell::new(1),
        rng: Cell::new(0x9e37_79b9_7f4a_7c15 ^ ((proc as u64 + 1) << 17)),
        rt_id: shared.id,
        limit: AtomicUsize::new(
            if shared.procs > 1 || shared.link.num_nodes() > 1 || !shared.cfg.get_prune() {
                WANTED
            } else {
                0
            },
        ),
        shared: shared.clone(),
    });
    CTX.with(|c| c.set(&*ctx as *const Ctx));
    shared.workers[proc].publish_limit(&ctx.limit);
    let _ = ready.send(Ok(()));
    drop(ready);

    let mut sched = Sched {
        ready: VecDeque::new(),
        suspended: HashMap::default(),
    };
    let mut seen = 0u64;
    loop {
        let ws = ctx.ws();
        ws.parker()
            .wait_until(|| shared.epoch.load(Ordering::SeqCst) != seen);
        seen = shared.epoch.load(Ordering::SeqCst);
        let cmd = shared.command();
        match cmd {
            Command::Shutdown => break,
            Command::Idle => continue,
            Command::ForkJoin => sched.run_fork_join(&ctx),
            Command::Program(run) => {
                // SAFETY: `start` keeps the program alive and does not return
                // until every server thread has reported finished.
                let run: &'static ProgramRun = unsafe { &*run.0 };
                run_program(&ctx, &mut sched, run);
            }
        }
        let mut s = ctx.stats.drain();
        s.stacks_mapped = std::mem::take(&mut ctx.stacks.borrow_mut().created);
        shared.stats[proc]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .add(&s);
        shared.finish_one();
    }
    // No command runs now, so no other processor is asking for forks.
    shared.workers[proc].publish_limit(std::ptr::null());
    CTX.with(|c| c.set(std::ptr::null()));
}

/// Iterative mode: phases until a post-phase says done.
fn run_program(ctx: &Ctx, sched: &mut Sched, run: &'static ProgramRun) {
    let phases = run.phases();
    let p = ctx.shared.procs;
    let mut cur = 0usize;
    let mut gen = 0u64;
    loop {
        let body: &'static dyn PhaseBody = phases[cur];
        ctx.iteration
            .set(run.iterations[cur].load(Ordering::SeqCst));
        if ctx.proc == 0 && !run.aborted() {
            // Every node must take the same steps: the link compares them
            // between nodes while this phase runs.
            let step = crate::Step::Phase {
                program: run.program,
                phase: cur as u64,
                iteration: ctx.iteration.get(),
            };
            if let Err(e) = ctx.shared.link.enter_step(step) {
                run.fail(crate::Error::Link(e));
            }
        }
        sched.run_phase(ctx, body, run, cur);
        ctx.stats.phases.set(ctx.stats.phases.get() + 1);
        let next = if ctx.proc == 0 {
            // Master: wait for the others, then the node-level step, then the
            // post-phase code, then release everyone with the decision.
            let parker = ctx.ws().parker();
            if run.arrived.load(Ordering::SeqCst) != p - 1 {
                // Recorded only when it will block: a phase of one processor
                // (or one whose others are done) pays nothing for the report.
                let _w = crate::waits::waiting(
                    |a| format!("the node's other processors to end phase {}", a[0]),
                    [cur as u64, 0, 0],
                );
                parker.wait_until(|| run.arrived.load(Ordering::SeqCst) == p - 1);
            }
            run.arrived.store(0, Ordering::SeqCst);
            let next = post_phase(ctx, run, cur, body, phases.len());
            // The next phase is a new access epoch (no filament runs now;
            // the SeqCst `gen` store below publishes it to the others).
            ctx.shared.next_access_epoch();
            run.next.store(next, Ordering::SeqCst);
            run.gen.store(gen + 1, Ordering::SeqCst);
            for w in ctx.shared.workers.iter().skip(1) {
                w.parker().notify();
            }
            next
        } else {
            if run.arrived.fetch_add(1, Ordering::SeqCst) + 1 == p - 1 {
                ctx.shared.workers[0].parker().notify();
            }
            let parker = ctx.ws().parker();
            if run.gen.load(Ordering::SeqCst) == gen {
                let _w = crate::waits::waiting(
                    |a| {
                        format!(
                            "processor 0 to end phase {} (the node's barrier, release and post-phase code)",
                            a[0]
                        )
                    },
                    [cur as u64, 0, 0],
                );
                parker.wait_until(|| run.gen.load(Ordering::SeqCst) != gen);
            }
            run.next.load(Ordering::SeqCst)
        };
        gen += 1;
        if next == DONE {
            return;
        }
        cur = next;
    }
}

fn post_phase(
    ctx: &Ctx,
    run: &'static ProgramRun,
    cur: usize,
    body: &dyn PhaseBody,
    nphases: usize,
) -> usize {
    if run.aborted() {
        return DONE;
    }
    let ended = match ctx.shared.phase_end.get() {
        Some(h) => h.end_phase(cur, &*ctx.shared.link),
        None => ctx.shared.link.barrier(),
    };
    if let Err(e) = ended {
        run.fail(crate::Error::Link(e));
        return DONE;
    }
    let iteration = run.iterations[cur].fetch_add(1, Ordering::Relaxed);
    // Post-phase code is an access epoch of its own: it may write what
    // the phase's filaments read as read-only.
    ctx.shared.next_access_epoch();
    let mut post = PostPhase::new(&ctx.shared, cur, iteration);
    match catch_unwind(AssertUnwindSafe(|| body.post(&mut post))) {
        Ok(Control::Continue) => (cur + 1) % nphases,
        Ok(Control::Done) => DONE,
        Err(p) => {
            run.fail_panic(ctx.proc, format!("phase {cur} post-phase"), p);
            DONE
        }
    }
}

fn pin_to(cpu: usize) -> std::io::Result<()> {
    use nix::sched::{sched_setaffinity, CpuSet};
    use nix::unistd::Pid;
    let mut set = CpuSet::new();
    set.set(cpu).map_err(std::io::Error::from)?;
    sched_setaffinity(Pid::from_raw(0), &set).map_err(std::io::Error::from)
}
