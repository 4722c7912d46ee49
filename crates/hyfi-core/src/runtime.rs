//! The runtime: server threads and the commands they run (a program of
//! phases, or a fork-join run).
//!
//! ```
//! use hyfi_core::{Config, Runtime};
//! let rt = Runtime::new(Config::new().procs(2).pin(false)).unwrap();
//! assert_eq!(rt.procs(), 2);
//! assert_eq!(rt.num_nodes(), 1);
//! let sum: u64 = rt.run(|ctx| ctx.join_n(100, |_, i| i as u64).iter().sum()).unwrap();
//! assert_eq!(sum, 4950);
//! ```

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

use crossbeam_deque::{Injector, Stealer, Worker};
use crossbeam_queue::SegQueue;
use crossbeam_utils::CachePadded;

use crate::config::Config;
use crate::error::{panic_message, Error};
use crate::fork::{HeapJob, JobRef};
use crate::node::PhaseEnd;
use crate::node::{NodeLink, SingleNode};
use crate::phase::{PhaseBody, Program};
use crate::reduce::Reduction;
use crate::sleep::Parker;
use crate::stats::{ProcStats, Stats};
use crate::worker::{self, Ctx};

/// `next` value meaning "the program is finished".
pub(crate) const DONE: usize = usize::MAX;

/// `Ctx::limit` value meaning "make the next join a real fork".
pub(crate) const WANTED: usize = usize::MAX;

/// The phase index [`PhaseEnd::end_phase`] is given for the release of a
/// fork-join run (see [`Runtime::run`] and [`Runtime::run_distributed`]):
/// no phase of a program has it.
pub const FORK_JOIN_PHASE: usize = usize::MAX;

static NEXT_RUNTIME_ID: AtomicU64 = AtomicU64::new(1);

/// What every server thread shares with the others.
pub(crate) struct WorkerShared {
    parker: OnceLock<Parker>,
    pub(crate) wakeups: SegQueue<u64>,
    /// The server thread's `Ctx::limit` (null while it is not running).
    limit: AtomicPtr<AtomicUsize>,
    /// Fork-join filaments sent to this processor: start-up distribution
    /// and filaments from other nodes. Other processors may steal them.
    pub(crate) incoming: Injector<JobRef>,
}

impl WorkerShared {
    pub(crate) fn set_parker(&self) {
        let _ = self.parker.set(Parker::current());
    }
    pub(crate) fn parker(&self) -> &Parker {
        self.parker.get().expect("hyfi: server thread not started")
    }
    /// Wakes the server thread if it is idle (no-op before it started).
    pub(crate) fn notify(&self) {
        if let Some(p) = self.parker.get() {
            p.notify();
        }
    }
    pub(crate) fn publish_limit(&self, limit: *const AtomicUsize) {
        self.limit
            .store(limit as *mut AtomicUsize, Ordering::Release);
    }
    /// Asks this processor to make its next join a real fork.
    pub(crate) fn want_fork(&self) {
        let p = self.limit.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: the pointer is published by the server thread to its
            // own Ctx, which outlives every command; it is withdrawn before
            // the Ctx is dropped, at shutdown, when no command runs.
            unsafe { (*p).store(WANTED, Ordering::Relaxed) };
        }
    }
}

#[derive(Clone, Copy)]
pub(crate) struct ProgramPtr(pub(crate) *const ProgramRun);
// SAFETY: the pointee is Sync and outlives the command (see Runtime::start).
unsafe impl Send for ProgramPtr {}

#[derive(Clone, Copy)]
pub(crate) enum Command {
    Idle,
    Program(ProgramPtr),
    ForkJoin,
    Shutdown,
}

pub(crate) struct Shared {
    pub(crate) id: u64,
    pub(crate) procs: usize,
    pub(crate) cfg: Config,
    pub(crate) link: Arc<dyn NodeLink>,
    pub(crate) phase_end: OnceLock<Arc<dyn PhaseEnd>>,
    pub(crate) workers: Vec<CachePadded<WorkerShared>>,
    pub(crate) stealers: Vec<Stealer<JobRef>>,
    pub(crate) injector: Injector<JobRef>,
    /// Server threads looking for fork-join work.
    pub(crate) idle: CachePadded<AtomicUsize>,
    pub(crate) fj_done: AtomicBool,
    /// Fork-join across nodes (see `balance`).
    pub(crate) fj: crate::balance::NodeState,
    pub(crate) epoch: AtomicU64,
    /// The *access epoch*: advanced whenever a phase (each execution of
    /// one) or a fork-join run is about to begin on this node, while no
    /// filament runs. Shared arrays key their per-phase access modes
    /// (read-only or written) on it; see [`Ctx::access_epoch`].
    pub(crate) access_epoch: Arc<AtomicU64>,
    command: Mutex<Command>,
    finished: AtomicUsize,
    caller: Mutex<Option<Arc<Parker>>>,
    pub(crate) stats: Vec<Mutex<ProcStats>>,
}

impl Shared {
    pub(crate) fn command(&self) -> Command {
        *self.command.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes filthread `id` of processor `proc` runnable.
    pub(crate) fn wake(&self, proc: usize, id: u64) {
        let w = &self.workers[proc];
        w.wakeups.push(id);
        w.parker().notify();
    }

    /// Wakes idle server threads after new work appeared.
    pub(crate) fn notify_idle(&self) {
        for w in &self.workers {
            if let Some(p) = w.parker.get() {
                p.notify();
            }
        }
    }

    pub(crate) fn finish_one(&self) {
        if self.finished.fetch_add(1, Ordering::SeqCst) + 1 == self.procs {
            if let Some(p) = self
                .caller
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
            {
                p.notify();
            }
        }
    }

    /// Ends the current access epoch and begins the next. Called only
    /// while no filament runs (between commands, or by the master at a
    /// phase barrier), so per-epoch state above hyfi-core may be checked.
    pub(crate) fn next_access_epoch(&self) {
        if let Some(h) = self.phase_end.get() {
            h.access_epoch_ended();
        }
        self.access_epoch.fetch_add(1, Ordering::SeqCst);
    }

    /// Hands `cmd` to every server thread and waits until all have finished it.
    pub(crate) fn dispatch(&self, cmd: Command) {
        let caller = Arc::new(Parker::current());
        *self.caller.lock().unwrap_or_else(|e| e.into_inner()) = Some(caller.clone());
        self.finished.store(0, Ordering::SeqCst);
        *self.command.lock().unwrap_or_else(|e| e.into_inner()) = cmd;
        self.next_access_epoch();
        self.epoch.fetch_add(1, Ordering::SeqCst);
        self.notify_idle();
        if matches!(cmd, Command::Shutdown) {
            return;
        }
        caller.wait_until(|| self.finished.load(Ordering::SeqCst) == self.procs);
        *self.command.lock().unwrap_or_else(|e| e.into_inner()) = Command::Idle;
    }
}

/// One execution of a [`Program`]: its phases and the barrier state.
pub(crate) struct ProgramRun {
    phases: Vec<&'static dyn PhaseBody>,
    pub(crate) iterations: Vec<AtomicU64>,
    pub(crate) arrived: CachePadded<AtomicUsize>,
    pub(crate) gen: CachePadded<AtomicU64>,
    pub(crate) next: AtomicUsize,
    abort: AtomicBool,
    error: Mutex<Option<Error>>,
    node: usize,
    /// Which program this is on the runtime (from 1): names its phases'
    /// SPMD steps.
    pub(crate) program: u64,
}

impl ProgramRun {
    pub(crate) fn phases(&self) -> &[&'static dyn PhaseBody] {
        &self.phases
    }
    pub(crate) fn aborted(&self) -> bool {
        self.abort.load(Ordering::Relaxed)
    }
    /// Records the first error and stops the program at the next barrier.
    pub(crate) fn fail(&self, e: Error) {
        let mut slot = self.error.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            *slot = Some(e);
        }
        self.abort.store(true, Ordering::SeqCst);
    }
    pub(crate) fn fail_panic(&self, proc: usize, during: String, p: Box<dyn std::any::Any + Send>) {
        let e = match p.downcast::<crate::reduce::LinkAbort>() {
            Ok(link) => link.0,
            Err(p) => Error::FilamentPanic {
                node: self.node,
                proc,
                during,
                message: panic_message(&*p),
            },
        };
        self.fail(e);
    }
}

/// A node's runtime: one server thread per processor, and the entry points
/// [`Runtime::start`] (iterative filaments) and [`Runtime::run`] (fork-join).
///
/// Dropping it stops and joins the server threads.
pub struct Runtime {
    pub(crate) shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    pub(crate) start_lock: Mutex<()>,
    /// Programs started so far (numbers their SPMD steps).
    programs: AtomicU64,
}

impl Runtime {
    /// Starts a single-node runtime.
    pub fn new(cfg: Config) -> Result<Self, Error> {
        Self::with_link(cfg, Arc::new(SingleNode))
    }

    /// Starts a single-node runtime configured from the `HYFI_*` variables.
    pub fn from_env() -> Result<Self, Error> {
        Self::new(Config::from_env()?)
    }

    /// Starts a runtime whose node-level steps (barrier, cross-node
    /// reduction) go through `link`: how the cluster layer plugs in.
    ///
    /// For layer crates (see `hyfi::layers`): hidden from the user's docs.
    #[doc(hidden)]
    pub fn with_link(cfg: Config, link: Arc<dyn NodeLink>) -> Result<Self, Error> {
        let (procs, cpus) = cfg.resolve()?;
        if std::env::var_os("HYFI_VERBOSE").is_some_and(|v| v != "0" && !v.is_empty()) {
            eprintln!(
                "hyfi: node {} of {}: {procs} server threads{} (share {:?} of the host)",
                link.my_node(),
                link.num_nodes(),
                if cfg.get_pin() {
                    format!(" pinned to CPUs {cpus:?}")
                } else {
                    " unpinned".to_string()
                },
                cfg.get_cpu_share().unwrap_or((0, 1)),
            );
        }
        if cfg.get_pin() && cfg.get_cpu_share().is_some_and(|(_, nodes)| nodes > 1) {
            // Several nodes on this host: the node's other threads (its
            // communication and flusher threads, `main`) stay on the node's
            // CPUs too, as a launcher's binding would keep them, instead of
            // preempting another node's server threads. Server threads are
            // then pinned one CPU each within this set.
            let mine = cfg.node_cpus();
            confine_process(&mine);
            if mine.len() <= procs {
                crate::sleep::set_own_cpu();
            }
        }
        crate::stack::install_overflow_handler(cfg.get_stack_size());
        let deques: Vec<Worker<JobRef>> = (0..procs).map(|_| Worker::new_lifo()).collect();
        let shared = Arc::new(Shared {
            id: NEXT_RUNTIME_ID.fetch_add(1, Ordering::Relaxed),
            procs,
            link,
            phase_end: OnceLock::new(),
            workers: (0..procs)
                .map(|_| {
                    CachePadded::new(WorkerShared {
                        parker: OnceLock::new(),
                        wakeups: SegQueue::new(),
                        limit: AtomicPtr::new(std::ptr::null_mut()),
                        incoming: Injector::new(),
                    })
                })
                .collect(),
            stealers: deques.iter().map(|d| d.stealer()).collect(),
            injector: Injector::new(),
            idle: CachePadded::new(AtomicUsize::new(0)),
            fj_done: AtomicBool::new(false),
            fj: Default::default(),
            epoch: AtomicU64::new(0),
            access_epoch: Arc::new(AtomicU64::new(1)),
            command: Mutex::new(Command::Idle),
            finished: AtomicUsize::new(0),
            caller: Mutex::new(None),
            stats: (0..procs)
                .map(|_| Mutex::new(ProcStats::default()))
                .collect(),
            cfg: cfg.clone(),
        });
        let mut rt = Runtime {
            shared: shared.clone(),
            threads: Vec::with_capacity(procs),
            start_lock: Mutex::new(()),
            programs: AtomicU64::new(0),
        };
        let (tx, rx) = std::sync::mpsc::channel();
        for (proc, deque) in deques.into_iter().enumerate() {
            let start = worker::Start {
                shared: shared.clone(),
                proc,
                cpu: cfg.get_pin().then(|| cpus[proc]),
                deque,
                ready: tx.clone(),
            };
            let h = std::thread::Builder::new()
                .name(format!("hyfi-server-{proc}"))
                .stack_size(16 << 20)
                .spawn(move || worker::main(start))
                .map_err(|source| Error::Spawn { proc, source })?;
            rt.threads.push(h);
        }
        drop(tx);
        for _ in 0..procs {
            match rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    return Err(Error::Spawn {
                        proc: 0,
                        source: std::io::Error::other("a server thread died while starting"),
                    })
                }
            }
        }
        Ok(rt)
    }

    /// The node-level link this runtime was started with.
    ///
    /// For layer crates (see `hyfi::layers`): hidden from the user's docs.
    #[doc(hidden)]
    pub fn link(&self) -> &Arc<dyn NodeLink> {
        &self.shared.link
    }

    /// Installs the work done at the end of every phase in place of the
    /// node-level barrier (see [`PhaseEnd`]). One per runtime: a second
    /// returns [`Error::PhaseEndTaken`].
    ///
    /// For layer crates (see `hyfi::layers`): hidden from the user's docs.
    #[doc(hidden)]
    pub fn set_phase_end(&self, hook: Arc<dyn PhaseEnd>) -> Result<(), Error> {
        self.shared
            .phase_end
            .set(hook)
            .map_err(|_| Error::PhaseEndTaken)
    }

    /// The phase-end hook installed, if any.
    ///
    /// For layer crates (see `hyfi::layers`): hidden from the user's docs.
    #[doc(hidden)]
    pub fn phase_end(&self) -> Option<&Arc<dyn PhaseEnd>> {
        self.shared.phase_end.get()
    }

    /// The counter behind [`Ctx::access_epoch`], for layers that check
    /// per-phase access modes outside a filament (hyfi-dsm's element
    /// writes). Read it `Relaxed`: it changes only while no filament runs.
    ///
    /// For layer crates (see `hyfi::layers`): hidden from the user's docs.
    #[doc(hidden)]
    pub fn access_epoch_counter(&self) -> Arc<AtomicU64> {
        self.shared.access_epoch.clone()
    }

    /// Processors (server threads) on this node.
    pub fn procs(&self) -> usize {
        self.shared.procs
    }
    /// Processors on each node (`filNumProcessorsPerNode`); the same as [`Runtime::procs`].
    pub fn procs_per_node(&self) -> usize {
        self.shared.procs
    }
    /// Number of nodes (`filNumNodes`).
    pub fn num_nodes(&self) -> usize {
        self.shared.link.num_nodes()
    }
    /// This node's index (`filMyNode`).
    pub fn node(&self) -> usize {
        self.shared.link.my_node()
    }
    /// The configuration the runtime was started with.
    pub fn config(&self) -> &Config {
        &self.shared.cfg
    }

    /// A reduction variable (`filCreateReduction`): a private copy per pool
    /// of each processor, each starting at `init` (see [`Reduction`]).
    pub fn reduction<T: bytemuck::Pod + Send + Sync>(&self, init: T) -> Reduction<T> {
        Reduction::new(self.shared.id, self.shared.procs, init)
    }

    /// An exact sum reduction variable: a private exact accumulator per
    /// pool of each processor, starting empty, whose reduce gives the same
    /// bits on every configuration (see [`ExactSum`](crate::ExactSum)).
    pub fn exact_sum(&self) -> crate::exact::ExactSum {
        crate::exact::ExactSum::new(self.shared.id, self.shared.procs)
    }

    /// The value of processor 0's copy of `r` (after a reduce, every copy's).
    /// Waits for a running program to end.
    pub fn get<T: bytemuck::Pod + Send + Sync>(&self, r: &Reduction<T>) -> Result<T, Error> {
        let _g = self.start_lock.lock().unwrap_or_else(|e| e.into_inner());
        r.check(self.shared.id)?;
        // SAFETY: no program runs (we hold the start lock), so no server
        // thread touches the copies.
        Ok(unsafe { r.read(0) })
    }

    /// Sets every private copy of `r`. Waits for a running program to end.
    pub fn set<T: bytemuck::Pod + Send + Sync>(&self, r: &Reduction<T>, v: T) -> Result<(), Error> {
        let _g = self.start_lock.lock().unwrap_or_else(|e| e.into_inner());
        r.check(self.shared.id)?;
        // SAFETY: as in `get`.
        unsafe { r.write_all(v) };
        Ok(())
    }

    pub(crate) fn check_not_nested(&self) -> Result<(), Error> {
        match worker::try_current_ctx() {
            Some(c) if c.shared.id == self.shared.id => Err(Error::Nested),
            _ => Ok(()),
        }
    }

    /// Runs a program of iterative filaments (`filStart`): every phase in
    /// turn, each followed by its post-phase code, until a post-phase returns
    /// [`Control::Done`](crate::Control::Done).
    ///
    /// A panic in a filament or in post-phase code ends the program at the
    /// next barrier and is returned as [`Error::FilamentPanic`].
    pub fn start(&self, program: &mut Program<'_>) -> Result<(), Error> {
        self.check_not_nested()?;
        let _g = self.start_lock.lock().unwrap_or_else(|e| e.into_inner());
        let phases = program.bodies(self.shared.procs)?;
        let program_no = self.programs.fetch_add(1, Ordering::Relaxed) + 1;
        if self.num_nodes() > 1 {
            // Every node must start it (entered before the release below,
            // which waits for every node, so that a node that does
            // something else is named instead of awaited).
            self.shared
                .link
                .enter_step(crate::Step::Start {
                    program: program_no,
                })
                .map_err(Error::Link)?;
            // What local fork-join runs wrote since the last release.
            self.fork_join_release()?;
        }
        let n = phases.len();
        let run = ProgramRun {
            // SAFETY: lifetime erasure. The bodies borrow from `program`,
            // which outlives this call, and `dispatch` returns only after
            // every server thread has finished with them.
            phases: phases
                .into_iter()
                .map(|p| unsafe {
                    std::mem::transmute::<&dyn PhaseBody, &'static dyn PhaseBody>(p)
                })
                .collect(),
            iterations: (0..n).map(|_| AtomicU64::new(0)).collect(),
            arrived: CachePadded::new(AtomicUsize::new(0)),
            gen: CachePadded::new(AtomicU64::new(0)),
            next: AtomicUsize::new(0),
            abort: AtomicBool::new(false),
            error: Mutex::new(None),
            node: self.node(),
            program: program_no,
        };
        self.shared
            .dispatch(Command::Program(ProgramPtr(&run as *const ProgramRun)));
        match run.error.into_inner().unwrap_or_else(|e| e.into_inner()) {
            Some(e) => Err(self.failed(e)),
            None => Ok(()),
        }
    }

    /// An error of this node's own (not one its link reported) ends the
    /// job on every node: the peers are told at once, with the error, so
    /// none of them waits for this node at its next barrier.
    pub(crate) fn failed(&self, e: Error) -> Error {
        if !matches!(e, Error::Link(_)) && self.num_nodes() > 1 {
            self.shared.link.abort(&e.to_string());
        }
        e
    }

    /// Runs a fork-join computation: `root` on one processor, its joins
    /// spread over all of them by stealing. Returns `root`'s result.
    ///
    /// It stays on this node, whatever the cluster; to spread a
    /// computation over every node, call
    /// [`Runtime::run_distributed`] on every node.
    ///
    /// **Shared arrays** (hyfi-dsm): on one node, `run` ends with a
    /// release, like a phase. On several nodes it is local (other nodes
    /// need not call it), and a release is collective, so it cannot end
    /// with one: what its filaments wrote becomes visible to the other
    /// nodes at the next collective step — [`Runtime::start`] and
    /// [`Runtime::run_distributed`] begin with a release on several nodes.
    /// Within the node it is visible when `run` returns.
    ///
    /// A panic anywhere in the computation is returned as
    /// [`Error::FilamentPanic`] once every filament has stopped.
    pub fn run<R, F>(&self, root: F) -> Result<R, Error>
    where
        F: FnOnce(&Ctx) -> R + Send,
        R: Send,
    {
        self.check_not_nested()?;
        let _g = self.start_lock.lock().unwrap_or_else(|e| e.into_inner());
        let sh = &*self.shared;
        sh.fj_done.store(false, Ordering::SeqCst);
        let node = self.node();
        let slot = self.dispatch_fork_join(Some(move |ctx: &Ctx| {
            catch_unwind(AssertUnwindSafe(|| root(ctx))).map_err(|p| match p
                .downcast::<crate::reduce::LinkAbort>()
            {
                Ok(link) => link.0,
                Err(p) => Error::FilamentPanic {
                    node,
                    proc: ctx.proc(),
                    during: "fork-join".into(),
                    message: panic_message(&*p),
                },
            })
        }));
        let released = if self.num_nodes() == 1 {
            self.fork_join_release()
        } else {
            Ok(())
        };
        match slot {
            Some(Ok(r)) => released.map(|()| r),
            Some(Err(e)) => Err(self.failed(e)),
            None => unreachable!("hyfi: fork-join run ended without its root"),
        }
    }

    /// The release that ends a fork-join run, or begins a collective step
    /// after local runs: the phase-end hook's (hyfi-dsm makes what the
    /// filaments wrote to shared arrays visible on every node), with
    /// [`FORK_JOIN_PHASE`] for a phase index, then a new access epoch, as
    /// after a phase. Collective when the runtime spans nodes: every node
    /// must call it at the same point. Call it only between commands.
    pub(crate) fn fork_join_release(&self) -> Result<(), Error> {
        let sh = &*self.shared;
        let released = match sh.phase_end.get() {
            Some(h) => h.end_phase(FORK_JOIN_PHASE, &*sh.link).map_err(Error::Link),
            None => Ok(()),
        };
        sh.next_access_epoch();
        released
    }

    /// Runs one fork-join command on this node's server threads: `root`,
    /// if this node runs one, is queued as the root job; when it returns,
    /// its value is kept and the run is marked done. Returns the root's
    /// value once every server thread has finished the command. The caller
    /// clears `fj_done` first. `root` must not unwind (callers catch).
    pub(crate) fn dispatch_fork_join<R, F>(&self, root: Option<F>) -> Option<R>
    where
        F: FnOnce(&Ctx) -> R + Send,
        R: Send,
    {
        let sh = &*self.shared;
        let mut slot: Option<R> = None;
        if let Some(root) = root {
            let slot_ptr = SlotPtr(&mut slot as *mut Option<R>);
            let shared = self.shared.clone();
            let job = move |ctx: &Ctx| {
                let slot_ptr = slot_ptr;
                let r = root(ctx);
                // SAFETY: `slot` is read only after `dispatch` below has
                // returned, i.e. after this job ended, and only this job
                // writes it.
                unsafe { *slot_ptr.0 = Some(r) };
                shared.fj_done.store(true, Ordering::SeqCst);
                shared.notify_idle();
            };
            let job: Box<dyn FnOnce(&Ctx) + Send + '_> = Box::new(job);
            // SAFETY: lifetime erasure; the job runs and is freed before
            // `dispatch` returns, while everything it borrows is alive.
            let job: Box<dyn FnOnce(&Ctx) + Send + 'static> = unsafe { std::mem::transmute(job) };
            sh.injector.push(HeapJob::into_job_ref(job));
        }
        sh.dispatch(Command::ForkJoin);
        slot
    }

    /// Counters per processor, accumulated since the runtime started (or
    /// since [`Runtime::reset_stats`]).
    pub fn stats(&self) -> Stats {
        stats_of(&self.shared)
    }

    /// The cross-node layer's counters (messages and bytes sent and
    /// received, by kind), if this runtime spans nodes.
    pub fn traffic(&self) -> Option<crate::link::Traffic> {
        self.shared.link.traffic()
    }

    /// A handle that reads these counters from any thread (for a signal
    /// handler or a monitoring thread), without holding the runtime.
    pub fn stats_handle(&self) -> StatsHandle {
        StatsHandle(Arc::downgrade(&self.shared))
    }

    /// Zeroes the counters.
    pub fn reset_stats(&self) {
        for s in &self.shared.stats {
            *s.lock().unwrap_or_else(|e| e.into_inner()) = ProcStats::default();
        }
        self.shared.fj.counters.reset();
    }
}

/// Reads a runtime's counters from any thread (see [`Runtime::stats_handle`]).
///
/// It does not keep the runtime alive (a node's link holds one, and the
/// runtime holds the link: a strong handle would be a cycle).
#[derive(Clone)]
pub struct StatsHandle(std::sync::Weak<Shared>);

impl StatsHandle {
    /// The counters accumulated so far (those of a running program are added
    /// when its processors finish it); `None` once the runtime is gone.
    pub fn stats(&self) -> Option<Stats> {
        self.0.upgrade().map(|sh| stats_of(&sh))
    }
}

fn stats_of(sh: &Shared) -> Stats {
    Stats {
        node: sh.link.my_node(),
        procs: sh
            .stats
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).clone())
            .collect(),
        remote: sh.fj.counters.get(),
    }
}

impl std::fmt::Debug for StatsHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StatsHandle")
    }
}

pub(crate) struct SlotPtr<T>(pub(crate) *mut T);
impl<T> Clone for SlotPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SlotPtr<T> {}
// SAFETY: the slot is written by exactly one job and read after it ends.
unsafe impl<T: Send> Send for SlotPtr<T> {}

impl Drop for Runtime {
    fn drop(&mut self) {
        let _g = self.start_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.shared.dispatch(Command::Shutdown);
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("node", &self.node())
            .field("nodes", &self.num_nodes())
            .field("procs", &self.procs())
            .field("config", &self.shared.cfg)
            .finish()
    }
}

/// Restricts every thread of this process to `cpus`. Threads that end
/// meanwhile, or a mask the kernel refuses, leave the thread as it was:
/// this is placement, not correctness.
fn confine_process(cpus: &[usize]) {
    use nix::sched::{sched_setaffinity, CpuSet};
    use nix::unistd::Pid;
    let mut set = CpuSet::new();
    for &c in cpus {
        if set.set(c).is_err() {
            return;
        }
    }
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return;
    };
    for t in tasks.flatten() {
        if let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) {
            let _ = sched_setaffinity(Pid::from_raw(tid), &set);
        }
    }
}
