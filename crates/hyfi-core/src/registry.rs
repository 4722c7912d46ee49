//! The registry: the per-runtime state that the server threads and the
//! [`Runtime`](crate::Runtime) share, and how commands reach the threads.
//!
//! A runtime is one [`Shared`] behind an `Arc`: the processors' public
//! faces ([`WorkerShared`]: sleep slot, wake-up queue, incoming filaments,
//! the word through which others ask for a fork), the deques' stealing
//! ends and the injector, the fork-join run's flags, the cross-node
//! fork-join state, the counters, and the command slot. The caller of a
//! command ([`Shared::dispatch`]) stores it, bumps `epoch` and wakes every
//! server thread; each runs it (see `sched`) and reports with
//! [`Shared::finish_one`]; the caller waits until all `procs` have.
//!
//! The registry knows commands, not what they do: a program of phases is
//! an erased pointer and the function that runs it ([`ProgramPtr`]),
//! supplied by the `phase` module, so this module (and `sched`) need not
//! know phases.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crossbeam_deque::{Injector, Stealer};
use crossbeam_queue::SegQueue;
use crossbeam_utils::CachePadded;

use crate::config::Config;
use crate::fork::LatentSlots;
use crate::job::JobRef;
use crate::node::{NodeLink, PhaseEnd};
use crate::sched::{Ctx, Sched};
use crate::sleep::Parker;
use crate::stats::ProcStats;

/// `Ctx::limit` value meaning "make the next join a real fork".
pub(crate) const WANTED: usize = usize::MAX;

/// A processor's pruning word (`Ctx::limit`), wherever it lives: in the
/// runtime's own memory, or, where the link shares memory with the other
/// nodes of the host, in this node's host words, where an idle node may
/// write it to ask for work (`remote::host`). Held by the processor's
/// [`WorkerShared`] and its `Ctx`, both of which live no longer than the
/// [`Shared`] that owns the word.
#[derive(Clone, Copy)]
pub(crate) struct LimitWord(NonNull<AtomicUsize>);

// SAFETY: it points to an atomic, which any thread may access.
unsafe impl Send for LimitWord {}
// SAFETY: as for `Send`.
unsafe impl Sync for LimitWord {}

impl std::ops::Deref for LimitWord {
    type Target = AtomicUsize;
    #[inline(always)]
    fn deref(&self) -> &AtomicUsize {
        // SAFETY: the word is in the `Shared` it came from (its `limits`,
        // or the host words its `HostRequests` holds, neither of which
        // moves), and whoever holds this keeps that `Shared` alive (its
        // `WorkerShared` is in it; a `Ctx` holds an `Arc` of it); it is
        // only accessed atomically.
        unsafe { self.0.as_ref() }
    }
}

/// What every server thread shares with the others.
pub(crate) struct WorkerShared {
    parker: OnceLock<Parker>,
    pub(crate) wakeups: SegQueue<u64>,
    /// The processor's pruning word (its `Ctx::limit`).
    pub(crate) limit: LimitWord,
    /// Fork-join filaments sent to this processor: start-up distribution
    /// and filaments from other nodes. Other processors may steal them.
    pub(crate) incoming: Injector<JobRef>,
    /// The second branches of the processor's shallowest pruned joins,
    /// which others may claim (`fork::latent`).
    pub(crate) latent: LatentSlots,
}

impl WorkerShared {
    pub(crate) fn new(limit: LimitWord) -> Self {
        WorkerShared {
            parker: OnceLock::new(),
            wakeups: SegQueue::new(),
            limit,
            incoming: Injector::new(),
            latent: LatentSlots::new(),
        }
    }
    /// Called by the server thread itself; `pinned` if it is pinned to a CPU.
    pub(crate) fn set_parker(&self, pinned: bool) {
        let _ = self.parker.set(if pinned {
            Parker::pinned()
        } else {
            Parker::current()
        });
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
    /// Asks this processor to make its next join a real fork (before its
    /// server thread starts, `Ctx::new` sets the word's first value).
    pub(crate) fn want_fork(&self) {
        self.limit.store(WANTED, Ordering::Relaxed);
    }
}

/// A program of phases as a command: the run's state (a
/// `phase::ProgramRun`) behind an erased pointer, and the function every
/// server thread runs it with.
#[derive(Clone, Copy)]
pub(crate) struct ProgramPtr {
    pub(crate) run: *const (),
    pub(crate) body: fn(&Ctx, &mut Sched, *const ()),
}
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
    /// What the layers above keep on this runtime (`RuntimeExt::set_layer_state`).
    pub(crate) layer_states: crate::layer::LayerStates,
    pub(crate) workers: Vec<CachePadded<WorkerShared>>,
    pub(crate) stealers: Vec<Stealer<JobRef>>,
    pub(crate) injector: Injector<JobRef>,
    /// Server threads looking for fork-join work.
    pub(crate) idle: CachePadded<AtomicUsize>,
    pub(crate) fj_done: AtomicBool,
    /// Fork-join across nodes (see `crate::crossnode`; the layer that
    /// fills it in is `remote::balance`).
    pub(crate) fj: crate::crossnode::NodeState,
    pub(crate) epoch: AtomicU64,
    /// The *access epoch*: advanced whenever a phase (each execution of
    /// one) or a fork-join run is about to begin on this node, while no
    /// filament runs. Shared arrays key their per-phase access modes
    /// (read-only or written) on it; see [`CtxExt::access_epoch`](crate::layer::CtxExt::access_epoch).
    pub(crate) access_epoch: Arc<AtomicU64>,
    command: Mutex<Command>,
    finished: AtomicUsize,
    caller: Mutex<Option<Arc<Parker>>>,
    pub(crate) stats: Vec<Mutex<ProcStats>>,
    /// The processors' pruning words where the link lends no host words:
    /// owned here, read and written only through each processor's
    /// [`WorkerShared::limit`] (which points to its own, or to the host
    /// words).
    #[allow(dead_code)]
    limits: Vec<CachePadded<AtomicUsize>>,
}

impl Shared {
    /// The state of a new runtime of `procs` server threads, whose deques'
    /// stealing ends are `stealers`.
    pub(crate) fn new(
        id: u64,
        procs: usize,
        cfg: Config,
        link: Arc<dyn NodeLink>,
        stealers: Vec<Stealer<JobRef>>,
    ) -> Self {
        let host = cfg
            .get_host_steals()
            .then(|| link.host_words())
            .flatten()
            .and_then(|words| {
                crate::remote::host::HostRequests::new(
                    words,
                    link.my_node(),
                    link.num_nodes(),
                    procs,
                )
            });
        let limits: Vec<CachePadded<AtomicUsize>> = (0..procs)
            .map(|_| CachePadded::new(AtomicUsize::new(0)))
            .collect();
        // Processor p's pruning word: in the host words if the node asks
        // and is asked for work through them, else its own. Neither moves
        // when `Shared` does (a heap allocation; a mapping).
        let workers = (0..procs)
            .map(|p| {
                let w = match &host {
                    Some(h) => h.limit_word(p),
                    None => &*limits[p] as *const AtomicUsize,
                };
                let w = LimitWord(NonNull::new(w.cast_mut()).expect("a word's address"));
                CachePadded::new(WorkerShared::new(w))
            })
            .collect();
        Shared {
            id,
            procs,
            link,
            phase_end: OnceLock::new(),
            layer_states: Default::default(),
            workers,
            stealers,
            injector: Injector::new(),
            idle: CachePadded::new(AtomicUsize::new(0)),
            fj_done: AtomicBool::new(false),
            fj: crate::crossnode::NodeState {
                host,
                ..Default::default()
            },
            epoch: AtomicU64::new(0),
            access_epoch: Arc::new(AtomicU64::new(1)),
            command: Mutex::new(Command::Idle),
            finished: AtomicUsize::new(0),
            caller: Mutex::new(None),
            stats: (0..procs)
                .map(|_| Mutex::new(ProcStats::default()))
                .collect(),
            limits,
            cfg,
        }
    }

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
        caller.wait_for_command(|| self.finished.load(Ordering::SeqCst) == self.procs);
        *self.command.lock().unwrap_or_else(|e| e.into_inner()) = Command::Idle;
    }
}
