//! The runtime: the user's handle on a node's server threads. It starts
//! them (each runs `sched::main`), holds the registry they share, and is
//! the entry point of every command: [`Runtime::start`] (a program of
//! phases, in `phase`), [`Runtime::run`] (fork-join, in `fork`) and
//! [`Runtime::run_distributed`] (fork-join over every node, in `remote`).
//! This module keeps what is neither: start-up, configuration queries,
//! reduction variables, counters, shutdown.
//!
//! ```
//! use hyfi_core::{Config, Runtime};
//! let rt = Runtime::new(Config::new().procs(2).pin(false)).unwrap();
//! assert_eq!(rt.procs(), 2);
//! assert_eq!(rt.num_nodes(), 1);
//! let sum: u64 = rt.run(|ctx| ctx.join_n(100, |_, i| i as u64).iter().sum()).unwrap();
//! assert_eq!(sum, 4950);
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crossbeam_deque::Worker;

use crate::config::Config;
use crate::error::Error;
use crate::job::JobRef;
use crate::node::{NodeLink, SingleNode};
use crate::reduce::{Op, Reduction};
use crate::registry::{Command, Shared};
use crate::sched;
use crate::stats::{ProcStats, Stats};

/// The phase index [`PhaseEnd::end_phase`](crate::node::PhaseEnd::end_phase) is given for the release of a
/// fork-join run (see [`Runtime::run`] and [`Runtime::run_distributed`]):
/// no phase of a program has it.
pub const FORK_JOIN_PHASE: usize = usize::MAX;

static NEXT_RUNTIME_ID: AtomicU64 = AtomicU64::new(1);

/// A node's runtime: one server thread per processor, and the entry points
/// [`Runtime::start`] (iterative filaments) and [`Runtime::run`] (fork-join).
///
/// Dropping it stops and joins the server threads.
pub struct Runtime {
    pub(crate) shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    pub(crate) start_lock: Mutex<()>,
    /// Programs started so far (numbers their SPMD steps).
    pub(crate) programs: AtomicU64,
}

impl Runtime {
    /// Starts a single-node runtime.
    pub fn new(cfg: Config) -> Result<Self, Error> {
        Self::start_with_link(cfg, Arc::new(SingleNode))
    }

    /// Starts a single-node runtime configured from the `HYFI_*` variables.
    pub fn from_env() -> Result<Self, Error> {
        Self::new(Config::from_env()?)
    }

    /// Starts a runtime whose node-level steps go through `link`
    /// ([`RuntimeExt::with_link`](crate::layer::RuntimeExt::with_link)).
    pub(crate) fn start_with_link(cfg: Config, link: Arc<dyn NodeLink>) -> Result<Self, Error> {
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
            // communication thread, `main`) stay on the node's
            // CPUs too, as a launcher's binding would keep them, instead of
            // preempting another node's server threads. Server threads are
            // then pinned one CPU each within this set.
            let mine = cfg.node_cpus();
            // Exclusive only if no other node was given them too (more
            // local nodes than CPUs share them): a waiter that spins on a
            // CPU another node needs holds that node up. Decided before the
            // process is confined, which would look like a launcher's
            // binding.
            let exclusive = cfg.node_cpus_exclusive();
            confine_process(&mine);
            if mine.len() <= procs {
                crate::sleep::set_own_cpu();
                if exclusive {
                    crate::sleep::set_cpus_exclusive();
                }
            }
        }
        if let Some(path) = cfg.get_trace() {
            crate::trace::start(
                path,
                link.my_node(),
                link.num_nodes(),
                cfg.get_trace_events(),
            )?;
        }
        crate::stack::install_overflow_handler(cfg.get_stack_size());
        // The wait table (a leaf) learns from the scheduler who waits.
        crate::waits::set_locator(sched::locate);
        let deques: Vec<Worker<JobRef>> = (0..procs).map(|_| Worker::new_lifo()).collect();
        let shared = Arc::new(Shared::new(
            NEXT_RUNTIME_ID.fetch_add(1, Ordering::Relaxed),
            procs,
            cfg.clone(),
            link,
            deques.iter().map(|d| d.stealer()).collect(),
        ));
        let mut rt = Runtime {
            shared: shared.clone(),
            threads: Vec::with_capacity(procs),
            start_lock: Mutex::new(()),
            programs: AtomicU64::new(0),
        };
        let (tx, rx) = std::sync::mpsc::channel();
        for (proc, deque) in deques.into_iter().enumerate() {
            let start = sched::Start {
                shared: shared.clone(),
                proc,
                cpu: cfg.get_pin().then(|| cpus[proc]),
                deque,
                ready: tx.clone(),
            };
            let h = std::thread::Builder::new()
                .name(format!("hyfi-server-{proc}"))
                .stack_size(16 << 20)
                .spawn(move || sched::main(start))
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

    /// Processors (server threads) on this node.
    pub fn procs(&self) -> usize {
        self.shared.procs
    }
    /// Chunks each pool of an iterative phase is cut into, at most, for
    /// within-node balancing ([`Config::chunks`]).
    pub fn chunks(&self) -> usize {
        self.shared.cfg.get_chunks(self.shared.procs)
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

    /// The value of `r` when every copy holds it: after a reduce
    /// ([`Runtime::reduce`], or a phase's), or a [`Runtime::set`] that no
    /// filament updated since. Waits for a running program to end.
    ///
    /// [`Error::Unreduced`] if filaments updated `r` since (a fork-join
    /// run's, say): each processor, chunk and node then holds a part of
    /// the result, and any one copy would be another answer on another
    /// configuration. The check is this node's (as `PostPhase::get`'s).
    pub fn get<T: bytemuck::Pod + Send + Sync>(&self, r: &Reduction<T>) -> Result<T, Error> {
        let _g = self.start_lock.lock().unwrap_or_else(|e| e.into_inner());
        r.check(self.shared.id)?;
        // SAFETY: no program runs (we hold the start lock), so no server
        // thread touches the copies.
        unsafe { r.value(self.shared.procs) }.ok_or(Error::Unreduced)
    }

    /// Reduces `r` between programs, after a fork-join run whose filaments
    /// updated it: combines every copy of every processor (in the fixed
    /// order [`Reduction`] gives), then every node's (the link's
    /// all-reduce, so every node of the job must call it, in the same
    /// order as its other collectives, as it calls `start` and `run`),
    /// writes the result into every copy and returns it. Waits for a
    /// running program to end.
    ///
    /// ```
    /// use hyfi::{Config, Op, Runtime};
    ///
    /// let rt = Runtime::new(Config::new().procs(2).pin(false))?;
    /// let leaves = rt.reduction(0u64);
    /// fn count(ctx: &hyfi::Ctx, leaves: &hyfi::Reduction<u64>, depth: u32) {
    ///     if depth == 0 {
    ///         leaves.update(ctx, |n| n + 1);
    ///     } else {
    ///         ctx.join(|c| count(c, leaves, depth - 1), |c| count(c, leaves, depth - 1));
    ///     }
    /// }
    /// rt.run(|ctx| count(ctx, &leaves, 10))?;
    /// assert_eq!(rt.reduce(&leaves, Op::Sum)?, 1024);
    /// assert_eq!(rt.get(&leaves)?, 1024); // every copy holds it now
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reduce<T: crate::reduce::Arith>(&self, r: &Reduction<T>, op: Op) -> Result<T, Error> {
        self.reduce_with(r, move |a, b| op.apply(a, b))
    }

    /// [`Runtime::reduce`] with an associative `combine` of your own.
    pub fn reduce_with<T, C>(&self, r: &Reduction<T>, combine: C) -> Result<T, Error>
    where
        T: bytemuck::Pod + Send + Sync,
        C: Fn(T, T) -> T,
    {
        let _g = self.start_lock.lock().unwrap_or_else(|e| e.into_inner());
        r.check(self.shared.id)?;
        // SAFETY: as in `get`.
        unsafe { r.reduce_everywhere(self.shared.procs, &*self.shared.link, combine) }
            .map_err(Error::Link)
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
        match sched::try_current_ctx() {
            Some(c) if c.shared.id == self.shared.id => Err(Error::Nested),
            _ => Ok(()),
        }
    }

    /// An error of this node's own (not one its link reported) ends the
    /// job on every node: the peers are told at once, with the error, so
    /// none of them waits for this node at its next barrier.
    pub(crate) fn failed(&self, e: Error) -> Error {
        if !matches!(e, Error::Link(_)) && self.num_nodes() > 1 {
            // The link names this node as the cause's origin.
            let text = match &e {
                Error::FilamentPanic {
                    proc,
                    during,
                    message,
                    ..
                } => format!("a filament panicked on processor {proc} ({during}): {message}"),
                e => e.to_string(),
            };
            self.shared.link.abort(&text);
        }
        e
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
