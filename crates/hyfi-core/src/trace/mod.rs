//! A timeline of every processor of the node: `HYFI_TRACE=path` (or
//! [`Config::trace`](crate::Config::trace)).
//!
//! Each thread records what it does into a buffer of its own (one lock
//! per event, never contended but by the writer at the end); at exit the
//! node writes its events in the Chrome trace event format, which
//! Perfetto (ui.perfetto.dev) and `chrome://tracing` open as they are:
//! one process per node, one thread per processor, plus the threads of
//! the layers (communication, signals, the program's `main`).
//!
//! **What is recorded** (never single filaments: a fine-grain program
//! runs millions):
//!
//! | event | where | what it says |
//! |---|---|---|
//! | `phase k` | processor | one phase on this processor, from its first pool to the barrier's release; its iteration |
//! | `pool k` / `filthread` | processor | a *segment*: a filthread running from its start or resumption until it suspends or ends; the filaments it ran and its pool |
//! | `page wait` | processor (async) | a filthread waiting for pages: the shared allocation, the first page, how many, their home; overlapping other pools' segments is the point |
//! | `join wait` | processor (async) | a join waiting for a stolen (or remote) child |
//! | `barrier` | processor | waiting for the node's other processors at a phase's end |
//! | `release` | processor 0 | the node-level step of a phase's end: the DSM's release, or the link's barrier |
//! | `post-phase` | processor 0 | the post-phase code |
//! | `idle` | processor | no runnable filthread and no work to steal |
//! | `steal` | processor | a job stolen on the node: thief, donor |
//! | `remote steal` | processor | a steal request to another node until its answer: the donor, filaments moved |
//! | `steal served` | communication | another node's request answered: the thief, filaments sent |
//! | `remote filament` | processor | a filament that came from another node ran here |
//! | `send` / `recv` | any | a message: peer, class (control or bulk), bytes |
//! | `pages in` | communication | pages that arrived from a home and were installed |
//!
//! **Bounded memory.** At most `HYFI_TRACE_EVENTS` events per node are kept
//! (default [`DEFAULT_CAP`], 56 bytes each: 56 MiB, and up to twice that
//! while a thread's buffer grows); later ones are counted as dropped, and
//! the summary and the file say how many.
//!
//! **One file for the job.** A one-node run writes `path` itself. The
//! nodes of a job write `path.node<i>`, with their clocks aligned to node
//! 0's (an offset the cluster layer estimates at start-up); a launcher of
//! hyfi's (the embedded one, `hyfi-run`) merges them into `path` and
//! removes them ([`merge`]); under `mpirun` or `srun`, `hyfi-run
//! --merge-trace path` does it after the job. Each node's file ends with
//! its [`Summary`]; the merge prints one line per node.
//!
//! Tracing off costs a load of one flag per segment, wait and message.
//!
//! One trace per process: the first runtime started with a trace path
//! records it, for every runtime of the process (nodes linked in one
//! process, as tests do with `InProcess`, share its file and node number).

mod chrome;
mod summary;

pub use chrome::{merge, Merged};
pub use summary::Summary;

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Events kept per node unless `HYFI_TRACE_EVENTS` says otherwise.
pub const DEFAULT_CAP: u64 = 1 << 20;

/// What an event is (see the table in the module's docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A phase on one processor: `[phase, iteration, 0, 0]`.
    Phase,
    /// A filthread's run: `[copy slot, filaments, filthread, flags]` (the
    /// slot of the chunk it ran last: pool `k`'s chunk `c` is
    /// `k · chunks + c`, see `Config::chunks`); flags bit 0: it was
    /// resumed (not started), bit 1: it suspended (did not end), bit 2:
    /// fork-join mode (no pool).
    Segment,
    /// Waiting for pages: `[allocation, first page, pages | home << 32,
    /// filthread]`.
    PageWait,
    /// A join waiting for its stolen child: `[filthread, 0, 0, 0]`.
    JoinWait,
    /// Waiting for the node's other processors: `[phase, 0, 0, 0]`.
    Barrier,
    /// The node-level step at a phase's end: `[phase, 0, 0, 0]`.
    Release,
    /// The post-phase code: `[phase, 0, 0, 0]`.
    PostPhase,
    /// Nothing to run: `[0; 4]`.
    Idle,
    /// A job stolen on the node: `[thief, donor, 1, from a latent join (1)
    /// or a deque or incoming list (0)]`.
    Steal,
    /// A steal request to another node, until the answer is installed:
    /// `[donor node, filaments, 0, 0]`.
    RemoteSteal,
    /// Another node's steal request answered: `[thief node, filaments, by a
    /// processor through shared memory (1) or by the communication thread
    /// (0), 0]`.
    StealServed,
    /// A filament from another node ran here: `[from node, 0, 0, 0]`.
    RemoteRun,
    /// A message sent: `[peer, class (0 control, 1 bulk), bytes, 0]`.
    Send,
    /// A message received: `[peer, class, bytes, 0]`.
    Recv,
    /// Pages installed from a home's reply: `[home, pages, 0, 0]`.
    PagesIn,
}

/// One recorded event, in this host's monotonic clock.
#[derive(Clone, Copy, Debug)]
pub struct Event {
    /// Start (nanoseconds, `CLOCK_MONOTONIC`).
    pub t: u64,
    /// Duration (0 for an instant).
    pub dur: u64,
    /// Its arguments (see [`Kind`]).
    pub args: [u64; 4],
    /// What it is.
    pub kind: Kind,
}

// The cap's documented memory: 56 bytes an event.
const _: () = assert!(std::mem::size_of::<Event>() == 56);

/// Processor tracks are numbered by processor; other threads from here.
const OTHER_TID: u32 = 1000;

struct Track {
    tid: u32,
    name: String,
    events: Mutex<Vec<Event>>,
}

struct Recorder {
    path: PathBuf,
    node: usize,
    nodes: usize,
    cap: u64,
    tracks: Mutex<Vec<Arc<Track>>>,
    next_tid: AtomicU64,
}

static ON: AtomicBool = AtomicBool::new(false);
static RECORDER: OnceLock<Recorder> = OnceLock::new();
static COUNT: AtomicU64 = AtomicU64::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);
/// Node 0's clock minus this node's (ns), set by the cluster layer.
static OFFSET: AtomicI64 = AtomicI64::new(0);
/// Called once the node's file is written (the cluster layer tells its
/// launcher where, so that it merges the parts).
static ON_WRITTEN: OnceLock<fn(&Path)> = OnceLock::new();

thread_local! {
    static MINE: RefCell<Option<Arc<Track>>> = const { RefCell::new(None) };
}

/// Whether this process records a trace.
#[inline(always)]
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Now, on the clock events are stamped with (`CLOCK_MONOTONIC`, ns): the
/// same clock in every process of one host.
#[inline]
pub fn now() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given, which lives
    // across the call.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The filthread running now (0 off a filthread): what a wait names, so
/// that the summary counts only *other* filthreads' computation as hiding it.
pub fn filthread() -> u64 {
    crate::sched::locate().and_then(|(_, f)| f).unwrap_or(0)
}

/// Records an event of `kind` that began at `t0` (from [`now`]) and ends now.
#[inline]
pub fn span(kind: Kind, t0: u64, args: [u64; 4]) {
    if on() {
        let t1 = now();
        record(Event {
            t: t0,
            dur: t1.saturating_sub(t0),
            args,
            kind,
        });
    }
}

/// Records an instant event of `kind`.
#[inline]
pub fn instant(kind: Kind, args: [u64; 4]) {
    if on() {
        record(Event {
            t: now(),
            dur: 0,
            args,
            kind,
        });
    }
}

#[cold]
fn record(e: Event) {
    let Some(rec) = RECORDER.get() else { return };
    if COUNT.fetch_add(1, Ordering::Relaxed) >= rec.cap {
        DROPPED.fetch_add(1, Ordering::Relaxed);
        return;
    }
    // `try_with`: a thread's thread-local destructors may still send a
    // message; their events are lost rather than a panic at thread exit.
    let _ = MINE.try_with(|m| {
        let Ok(mut m) = m.try_borrow_mut() else {
            return;
        };
        let track = m.get_or_insert_with(|| {
            let tid = OTHER_TID + rec.next_tid.fetch_add(1, Ordering::Relaxed) as u32;
            let name = std::thread::current()
                .name()
                .unwrap_or("thread")
                .to_string();
            rec.track(tid, name)
        });
        track
            .events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(e);
    });
}

impl Recorder {
    fn track(&self, tid: u32, name: String) -> Arc<Track> {
        let t = Arc::new(Track {
            tid,
            name,
            events: Mutex::new(Vec::new()),
        });
        self.tracks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(t.clone());
        t
    }
}

/// Names the calling thread's track as processor `proc` (a server thread
/// does, as it starts).
pub(crate) fn processor_track(proc: usize) {
    if let Some(rec) = RECORDER.get().filter(|_| on()) {
        let t = rec.track(proc as u32, format!("processor {proc}"));
        MINE.with(|m| *m.borrow_mut() = Some(t));
    }
}

/// Starts recording for node `node` of `nodes` into `path` (the first call
/// of the process wins; later ones with another path are told so). A file
/// that cannot be written is an error now, not at the end of the run.
pub(crate) fn start(path: &Path, node: usize, nodes: usize, cap: u64) -> Result<(), crate::Error> {
    if RECORDER.get().is_none() {
        let file = chrome::with_suffix(&part_path(path, node, nodes), ".tmp");
        std::fs::File::create(&file)
            .and_then(|_| std::fs::remove_file(&file))
            .map_err(|source| crate::Error::TraceFile {
                path: part_path(path, node, nodes),
                source,
            })?;
    }
    let mut first = false;
    let rec = RECORDER.get_or_init(|| {
        first = true;
        Recorder {
            path: path.to_path_buf(),
            node,
            nodes,
            cap,
            tracks: Mutex::new(Vec::new()),
            next_tid: AtomicU64::new(0),
        }
    });
    if !first {
        if rec.path != path {
            eprintln!(
                "hyfi: node {node}: a trace is already recorded into {} in this process; \
                 {} is not used (one trace per process)",
                rec.path.display(),
                path.display()
            );
        }
        return Ok(());
    }
    extern "C" fn at_exit() {
        // Nothing may unwind out of an atexit handler.
        let _ = std::panic::catch_unwind(|| {
            if let Err(e) = write() {
                eprintln!("hyfi: the trace could not be written: {e}");
            }
        });
    }
    // SAFETY: registers a plain function that takes no arguments; it runs
    // at `exit` (a return from `main` or `std::process::exit`).
    unsafe { libc::atexit(at_exit) };
    ON.store(true, Ordering::Release);
    Ok(())
}

/// Sets node 0's clock minus this node's, in ns (the cluster layer, from
/// its start-up exchange); events are shifted by it when written.
pub fn set_clock_offset(ns: i64) {
    OFFSET.store(ns, Ordering::Relaxed);
}

/// Registers what to call once the node's file is written (the cluster
/// layer tells its launcher, which merges the nodes' files).
pub fn on_written(f: fn(&Path)) {
    let _ = ON_WRITTEN.set(f);
}

/// Node `node`'s part of a job's trace `path`: `path.node<node>`.
fn node_file(path: &Path, node: usize) -> PathBuf {
    chrome::with_suffix(path, &format!(".node{node}"))
}

/// The file this node writes: `path` for a one-node job, `path.node<i>`
/// otherwise.
pub fn part_path(path: &Path, node: usize, nodes: usize) -> PathBuf {
    if nodes == 1 {
        path.to_path_buf()
    } else {
        node_file(path, node)
    }
}

/// Writes what this node recorded so far (it is written again, whole, at
/// exit). Returns the file, or `None` if nothing is traced.
pub fn write() -> std::io::Result<Option<PathBuf>> {
    let Some(rec) = RECORDER.get() else {
        return Ok(None);
    };
    let file = part_path(&rec.path, rec.node, rec.nodes);
    let summary = {
        // Written under the tracks' locks, not from a copy: a trace near
        // its cap is tens of MiB. A thread still recording waits meanwhile
        // (at exit, or during an explicit `write`); nothing below records.
        let all = rec.tracks.lock().unwrap_or_else(|e| e.into_inner());
        let guards: Vec<_> = all
            .iter()
            .map(|t| t.events.lock().unwrap_or_else(|e| e.into_inner()))
            .collect();
        let tracks: Vec<(u32, &str, &[Event])> = all
            .iter()
            .zip(&guards)
            .map(|(t, g)| (t.tid, t.name.as_str(), &g[..]))
            .collect();
        let summary = Summary::of(rec.node, &tracks, DROPPED.load(Ordering::Relaxed));
        chrome::write_node(
            &file,
            rec.node,
            rec.nodes,
            OFFSET.load(Ordering::Relaxed),
            &tracks,
            &summary,
        )?;
        summary
    };
    if rec.nodes == 1 {
        eprint!("{}", summary::table(&rec.path, &[summary]));
    } else if let Some(f) = ON_WRITTEN.get() {
        f(&rec.path);
    } else if rec.node == 0 {
        eprintln!(
            "hyfi: node 0: trace written as {}.node<i> by every node; merge them with \
             `hyfi-run --merge-trace {}` once the job has ended",
            rec.path.display(),
            rec.path.display()
        );
    }
    Ok(Some(file))
}
