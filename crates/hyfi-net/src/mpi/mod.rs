//! The MPI transport: hyfi's nodes over MPI point-to-point, through the
//! `mpi` crate (rsmpi), so that whatever the site's MPI drives carries
//! pages, steals, releases and collectives: shared memory within a host,
//! TCP, InfiniBand or RoCE through UCX or OFI.
//!
//! Built with the `mpi` feature; chosen at run time by `HYFI_TRANSPORT`
//! (see [`crate::Transport`]). Launched by `mpirun` or `srun` as the TCP
//! transport is; rank and size are MPI's.
//!
//! # MPI and threads: a communication thread, and idle processors
//!
//! The node's communication thread (`hyfi-mpi`) initialises MPI, asking
//! for `MPI_THREAD_SERIALIZED`, and finalises it. Every MPI call is made
//! under one lock (the engine's): by the communication thread, which polls
//! in a loop (post queued sends, complete sends, receive and hand each
//! frame to its service, as the TCP communication thread does); by a
//! sender, which posts its own message when the lock is free instead of
//! handing it over; and by an *idle processor*, a server thread with
//! nothing to run while its filthreads wait for a page, a steal or a
//! release, which polls MPI itself ([`hyfi_core::link::set_idle_progress`]).
//! With an MPI that offers only `MPI_THREAD_FUNNELED`, the communication
//! thread alone calls MPI.
//!
//! Why not `MPI_THREAD_MULTIPLE`? MPI would then lock inside every call,
//! for the same serialisation, and the communication thread's polling
//! would contend with every sender. Why not `FUNNELED` alone? `mpirun`
//! binds a rank to one core by default, so the server thread and the
//! communication thread share it, and every message crossed from one to
//! the other by a context switch: a page fetch took 11.8 µs with FUNNELED
//! and 6.1 µs with idle processors polling (and spinning between polls on
//! a CPU their node owns); with frames sent in eager pieces (below) it
//! takes 2.5 µs, 1.1× a raw MPI 4 KiB ping-pong of 2.3 µs between the same
//! processes (`benches/dsm.rs`, BENCHMARKS.md, which breaks a fetch down
//! step by step).
//!
//! **Frames in pieces.** Open MPI's shared-memory transport sends a
//! message of more than about 4 040 bytes by rendezvous: a request, a
//! single copy by the receiver, an acknowledgement, at 2 µs for a 4 KiB
//! reply against 0.5 µs for a message just under the limit. A page and its
//! header is just over it. So a service's frame of more than [`PIECE`]
//! bytes, up to [`PIECED_MAX`], travels in pieces of at most [`PIECE`]
//! bytes, posted back to back: the first with a tag that names the service
//! and the piece count, the rest with a tag of their own, all on the
//! frame's communicator. MPI keeps one sender's messages on one
//! communicator in order, and one thread posts a frame's pieces under the
//! engine's lock, so the pieces that follow a first piece are the next
//! ones from its sender; the receiver takes them at once (they travel
//! eagerly, so they are there or about to be) and hands the frame on
//! whole. Longer frames go whole, by the MPI's own single-copy protocol.
//!
//! A handler's messages (a page server's reply) are posted as soon as
//! the handler returns, by the thread that received the request, which
//! holds the engine; a pass receives one round of messages, and an idle
//! processor's at most one bulk message, so it goes back to the filthread
//! a page woke at once.
//!
//! **Waiting without taking a CPU from the servers.** MPI's progress
//! engine polls: there is no descriptor to sleep on. The communication
//! thread polls while messages flow, yielding the CPU between polls
//! (`sched_yield`, so a server thread that wants the CPU gets it); once
//! nothing has moved for [`HOT`] it sleeps between polls, for intervals
//! growing from [`NAP_MIN`] to [`NAP_MAX`] while *requests* moved in the
//! last [`QUIET`], and of [`NAP_QUIET`] otherwise; a sender wakes it at
//! once. A request (a service's control message: a page or steal request,
//! sent or received; not a collective's piece) is what a computing node
//! must answer, or await the answer of, without a thread of its own
//! polling; everything else is awaited by a thread that polls itself (a
//! release's `REL`s, a collective's pieces). Each wake-up costs the core the communication
//! thread shares with a server thread: on Jacobi 2048² over 2×1, which
//! moves its pages in `REL`s alone, naps that restarted at [`NAP_MIN`]
//! after every release cost 5 % of the run (0.493 → 0.468 s, the same
//! binary, 7 alternated rounds; BENCHMARKS.md). A node that computes
//! without requests so costs its servers a poll every [`NAP_QUIET`]; a
//! request that arrives while every thread sleeps waits at most that long
//! (a thread that waits for a message polls itself).
//!
//! # Classes on two communicators
//!
//! Control messages travel on one duplicate of `MPI_COMM_WORLD`, bulk
//! messages on another; the tag names the service. MPI keeps each
//! communicator's messages from one sender in order (its non-overtaking
//! rule), which is the seam's order per sender and class. The
//! communication thread receives control first, and posts queued control
//! messages before queued bulk ones; it keeps at most [`BULK_IN_FLIGHT`]
//! bytes of bulk messages posted per destination, so that a control
//! message overtakes bulk ones still queued (the seam's "control never
//! waits behind bulk").
//!
//! # Failures
//!
//! As over TCP ([`crate::Cluster`]):
//! * a node's error or panic tells every peer (an `Abort` message with the
//!   cause), whose waits end with it; the node prints the cause and, after
//!   [`crate::FAILURE_GRACE`] unless its program ended first, calls
//!   `MPI_Abort`, which ends the job everywhere;
//! * a stopped node (no message, not even a heartbeat, for
//!   `HYFI_HEARTBEAT` seconds) is named by its peers, which fail the same
//!   way;
//! * a dead process is seen by the MPI launcher, which ends the job and
//!   says which rank died; hyfi learns nothing it could add;
//! * SPMD steps are checked along the ring as over TCP
//!   ([`hyfi_core::link::spmd`]); a node's step records ride on its next
//!   frame to its successor, or go alone when it waits ([`STEPS_HELD`]).

mod engine;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use hyfi_core::link::collective::{self, Collectives};
use hyfi_core::link::spmd::Steps;
use hyfi_core::link::{
    Class, Port, Report, Service, ServiceError, ServiceId, ServiceTable, Traffic, TrafficCounters,
};
use hyfi_core::{LinkError, NodeLink, Step};

use crate::cause::{Cause, CauseKind};
use crate::error::NetError;
use crate::signals::{self, SignalEvent, SignalThread};

/// How long the communication thread polls, yielding the CPU between
/// polls, after any thread last moved a message. Short: a yielding thread
/// that stays runnable still takes its fair share of a core it shares with
/// a computing server thread (a 2 ms window cost 2048² Jacobi on 2×1 a
/// third of its time; BENCHMARKS.md).
pub const HOT: Duration = Duration::from_micros(50);
/// Its first sleep between polls once idle.
pub const NAP_MIN: Duration = Duration::from_micros(20);
/// Its longest sleep between polls while requests (services' control
/// messages) moved in the last [`QUIET`].
pub const NAP_MAX: Duration = Duration::from_micros(100);
/// After this long without a request, the thread naps [`NAP_QUIET`] at a
/// time.
pub const QUIET: Duration = Duration::from_millis(10);
/// Its longest sleep between polls once nothing has moved for [`QUIET`]:
/// the node computes alone, or the program runs code of its own between
/// hyfi's. Each wake-up costs the core the rank is bound to (which it
/// shares with a server thread or the program's main thread) a context
/// switch and a poll: at 100 µs naps, a user's loop after `Runtime::start`
/// ran 10–25 % slower beside an idle MPI node (2-vCPU VM, `mpirun -np 2`);
/// at 1 ms, a tenth of that. The first message after a quiet spell waits
/// up to this long for a thread to poll (one that waits for it polls
/// itself).
pub const NAP_QUIET: Duration = Duration::from_millis(1);
/// Bulk bytes posted and not yet sent, per destination, beyond which more
/// bulk messages wait in the outbox (at least one is always posted).
pub const BULK_IN_FLIGHT: usize = 4 << 20;

/// The most bytes of a frame in one MPI message when the frame travels in
/// pieces: below Open MPI's shared-memory eager limit (4 KiB, less its
/// match header: a 4 040-byte message goes eagerly, a 4 050-byte one by
/// rendezvous). Measured on one host (2-vCPU VM, Open MPI 4.1.4, C
/// ping-pongs of a 16-byte request and a reply sent whole or in pieces):
/// a 4 096-byte reply whole 2.05 µs, in two pieces 0.46 µs; 16 KiB 2.83
/// against 1.12 µs; 64 KiB 5.29 against 3.40 µs. A page (4 KiB and the
/// reply's header) so travels in two eager pieces instead of one
/// rendezvous (BENCHMARKS.md, the transports section).
pub const PIECE: usize = 4000;
/// Frames longer than this travel whole, by the MPI's own large-message
/// protocol (single copy where it has one).
pub const PIECED_MAX: usize = 64 << 10;

/// Tags of the transport's own messages (services use 1 to 127).
pub(crate) mod tag {
    /// An SPMD step, to the ring successor.
    pub const STEP: i32 = 1000;
    /// The sender's program ended (on both communicators).
    pub const BYE: i32 = 1001;
    /// The sender failed: the cause.
    pub const ABORT: i32 = 1002;
    /// Nothing: the sender is alive.
    pub const HEARTBEAT: i32 = 1003;
    /// A piece of a frame after its first (see [`super::PIECE`]).
    pub const PIECE: i32 = 1004;
    /// Above this: the first piece of a frame in pieces, `PIECED + (n << 7
    /// | service)` for `n` pieces (at most 17, so at most 10 495: within
    /// the 32 767 every MPI allows).
    pub const PIECED: i32 = 8192;
    /// A flag on a service frame's tag (or its first piece's): the frame
    /// ends with SPMD step records the sender held back for its ring
    /// successor (see [`super::STEPS_HELD`]), then one byte that counts
    /// them. Above every other tag: at most 16 384 + 10 495.
    pub const STEPS: i32 = 1 << 14;
}

/// The bytes of one SPMD step record: the step's number and its four
/// words, little-endian.
pub(crate) const STEP_RECORD: usize = 40;

/// Most SPMD step records a node holds back for its ring successor.
///
/// A step is entered as a phase starts, and a message of its own per step
/// cost both nodes an MPI send and a receive in every phase: 0.8 µs a
/// step of LU 512 on 2×1, a tenth of the step's communication (2-vCPU VM,
/// `mpirun -np 2`; BENCHMARKS.md). Held back, the records ride on the
/// next frame this node sends its successor (a release's `REL`, a page
/// request), in the same MPI message; they go alone, as one message, when
/// this node waits for a peer (a node that diverged is still named as soon
/// as it waits), when this many are held, or when the oldest was held for
/// [`STEPS_HELD_FOR`]. As over TCP.
pub const STEPS_HELD: usize = 16;
/// The bytes held step records add to a frame at most.
const STEPS_ROOM: usize = STEPS_HELD * STEP_RECORD + 1;
/// Longest a step record is held back (the communication thread sends
/// older ones at its next turn).
pub const STEPS_HELD_FOR: Duration = Duration::from_millis(2);

/// A message waiting to be posted.
pub(crate) struct Out {
    pub to: usize,
    pub tag: i32,
    pub class: Class,
    pub data: Vec<u8>,
}

/// What senders hand the communication thread.
#[derive(Default)]
pub(crate) struct Outbox {
    pub control: std::collections::VecDeque<Out>,
    pub bulk: std::collections::VecDeque<Out>,
    /// The program ended: leave once every peer has.
    pub closing: bool,
    /// End the job with `MPI_Abort` and this code.
    pub abort: Option<i32>,
    /// A raw ping-pong to time ([`raw_round_trips`]).
    pub raw: Option<RawJob>,
    /// SPMD step records held back for the ring successor
    /// ([`STEPS_HELD`]), [`STEP_RECORD`] bytes each.
    pub steps: Vec<u8>,
    /// When the oldest of `steps` was held back.
    pub steps_since: Option<std::time::Instant>,
}

impl Outbox {
    /// Takes the held step records, if any, and whether any were held
    /// since at least `min_age` (`None`: whatever their age).
    pub(crate) fn take_steps(&mut self, min_age: Option<Duration>) -> Option<Vec<u8>> {
        let since = self.steps_since?;
        if min_age.is_some_and(|age| since.elapsed() < age) {
            return None;
        }
        self.steps_since = None;
        Some(std::mem::take(&mut self.steps))
    }
}

/// A raw ping-pong for the communication thread to run and time.
pub(crate) struct RawJob {
    pub peer: usize,
    pub first: bool,
    pub request: usize,
    pub reply: usize,
    pub n: usize,
    /// The reply in pieces of [`PIECE`] bytes, sent back to back, as
    /// hyfi's own frames of that size travel.
    pub pieces: bool,
    pub done: std::sync::mpsc::Sender<Vec<Duration>>,
}

/// Times `n` raw MPI round trips with node `peer`, as a benchmark's
/// baseline for hyfi's own round trips (a page fetch): the node that is
/// `first` sends `request` bytes and waits for `reply` bytes, `n` times;
/// the peer, which must call this at the same time with `first` false,
/// answers. Blocking `MPI_Send` and `MPI_Recv` on a communicator of their
/// own, made by this node's communication thread while it does nothing
/// else, so they measure MPI alone between the same two processes. Returns
/// the round trips' times on the first node, nothing on the other.
pub fn raw_round_trips(
    peer: usize,
    first: bool,
    request: usize,
    reply: usize,
    n: usize,
) -> Result<Vec<Duration>, NetError> {
    raw_job(peer, first, request, reply, n, false)
}

/// As [`raw_round_trips`], with the reply sent as hyfi sends a frame of
/// its size: in pieces of at most [`PIECE`] bytes, back to back
/// (`MPI_Isend` each, then `MPI_Waitall`), received one by one. The
/// baseline that shows hyfi's own cost on a page fetch, where the plain
/// ping-pong shows what a user's straightforward code gets.
pub fn raw_round_trips_in_pieces(
    peer: usize,
    first: bool,
    request: usize,
    reply: usize,
    n: usize,
) -> Result<Vec<Duration>, NetError> {
    raw_job(peer, first, request, reply, n, true)
}

fn raw_job(
    peer: usize,
    first: bool,
    request: usize,
    reply: usize,
    n: usize,
    pieces: bool,
) -> Result<Vec<Duration>, NetError> {
    let shared = SHARED.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let Some(s) = shared.and_then(|w| w.upgrade()) else {
        return Err(NetError::Launch(
            "raw_round_trips needs a node running over MPI (HYFI_TRANSPORT=mpi under mpirun)"
                .into(),
        ));
    };
    if peer >= s.nodes || peer == s.rank {
        return Err(NetError::Launch(format!(
            "raw_round_trips: node {peer} is no peer of node {}",
            s.rank
        )));
    }
    let (tx, rx) = std::sync::mpsc::channel();
    lock(&s.out).raw = Some(RawJob {
        peer,
        first,
        request,
        reply,
        n,
        pieces,
        done: tx,
    });
    s.wake();
    rx.recv().map_err(|_| {
        NetError::Launch("the MPI communication thread ended during raw_round_trips".into())
    })
}

/// The node's state shared by its senders and its communication thread.
pub(crate) struct Shared {
    pub rank: usize,
    pub nodes: usize,
    pub out: Mutex<Outbox>,
    /// The communication thread, to wake when it sleeps.
    pub thread: std::sync::OnceLock<std::thread::Thread>,
    pub asleep: AtomicBool,
    pub services: ServiceTable,
    pub failure: Mutex<Option<Cause>>,
    pub steps: Mutex<Steps>,
    pub counters: TrafficCounters,
    /// [`Outbox::steps`] is not empty (read without the lock by every
    /// post to the successor).
    pub steps_held: AtomicBool,
    /// Silence after which a peer counts as stopped.
    pub heartbeat: Duration,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// Queues `out` for the communication thread and wakes it.
    pub(crate) fn push(&self, out: Out) {
        {
            let mut o = lock(&self.out);
            match out.class {
                Class::Control => o.control.push_back(out),
                Class::Bulk => o.bulk.push_back(out),
            }
        }
        // Posted by this thread when no other is in MPI (no hand-off); the
        // communication thread, if it sleeps, is woken to poll for the
        // reply while the processors compute.
        engine::post_now();
        self.wake();
    }

    /// Takes the held SPMD step records, if any were held since at least
    /// `min_age` (`None`: whatever their age), and clears
    /// [`Shared::steps_held`] under the outbox's lock, where `enter_step`
    /// sets it: a record entered meanwhile is never left held with the
    /// flag clear (the age and wait flushes read the flag alone).
    pub(crate) fn take_steps(&self, min_age: Option<Duration>) -> Option<Vec<u8>> {
        if !self.steps_held.load(Ordering::Acquire) {
            return None;
        }
        let mut o = lock(&self.out);
        let steps = o.take_steps(min_age)?;
        self.steps_held.store(false, Ordering::Release);
        Some(steps)
    }

    /// The held SPMD step records, if any were held since at least
    /// `min_age`, as a message of their own to the ring successor.
    pub(crate) fn steps_message(&self, min_age: Option<Duration>) -> Option<Out> {
        Some(Out {
            to: (self.rank + 1) % self.nodes,
            tag: tag::STEP,
            class: Class::Control,
            data: self.take_steps(min_age)?,
        })
    }

    /// Sends the held SPMD step records ([`STEPS_HELD`]) to the ring
    /// successor now, as one message.
    pub(crate) fn flush_steps(&self) {
        if let Some(m) = self.steps_message(None) {
            self.push(m);
        }
    }

    pub(crate) fn wake(&self) {
        if self.asleep.swap(false, Ordering::AcqRel) {
            if let Some(t) = self.thread.get() {
                t.unpark();
            }
        }
    }

    /// The node's failure, if it failed.
    pub(crate) fn failure(&self) -> Option<Cause> {
        lock(&self.failure).clone()
    }

    /// Fails this node with `cause` (the first failure wins): every waiter
    /// ends with it, the peers are told when it started here, and the job
    /// ends after the grace.
    pub(crate) fn fail(&self, cause: Cause) {
        {
            let mut f = lock(&self.failure);
            if f.is_some() {
                return;
            }
            *f = Some(cause.clone());
        }
        let line = cause.line(self.rank);
        if cause.origin == self.rank {
            let text = encode_abort(&cause);
            for to in (0..self.nodes).filter(|&p| p != self.rank) {
                self.push(Out {
                    to,
                    tag: tag::ABORT,
                    class: Class::Control,
                    data: text.clone(),
                });
            }
        }
        self.services.fail_all(&line);
        // The program's waits return the cause now, and it prints it as
        // its error; hyfi says it and ends the job if the program does not
        // end within the grace.
        let me = self.rank;
        let code = cause.kind.exit_code();
        let shared = SHARED.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let _ = std::thread::Builder::new()
            .name("hyfi-abort".into())
            .spawn(move || {
                std::thread::sleep(crate::FAILURE_GRACE);
                say(&cause.line(me));
                if let Some(s) = shared.and_then(|w| w.upgrade()) {
                    lock(&s.out).abort = Some(code);
                    s.wake();
                    // The communication thread ends the job; if it cannot
                    // (stuck in MPI), the process ends itself.
                    std::thread::sleep(Duration::from_secs(5));
                }
                std::process::exit(code);
            });
    }
}

/// Prints `hyfi: line` to stderr in one write: `mpirun --tag-output` tags
/// every write, and `eprintln!` writes a formatted line in pieces.
pub(crate) fn say(line: &str) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("hyfi: {line}\n").as_bytes());
}

/// The node's shared state, for the thread that ends the job after a
/// failure (a weak reference: a node that closed has nothing to end).
static SHARED: Mutex<Option<std::sync::Weak<Shared>>> = Mutex::new(None);

/// An abort's payload: the kind's exit code, the origin, and the text.
pub(crate) fn encode_abort(c: &Cause) -> Vec<u8> {
    let mut v = (c.kind.exit_code() as u32).to_le_bytes().to_vec();
    v.extend_from_slice(&(c.origin as u32).to_le_bytes());
    v.extend_from_slice(c.text.as_bytes());
    v
}

/// The cause an abort from node `from` carries.
pub(crate) fn decode_abort(from: usize, data: &[u8]) -> Cause {
    let word = |i: usize| {
        data.get(i..i + 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
    };
    let code = word(0).map_or(1, |c| c as i32);
    let origin = word(4).map_or(from, |o| o as usize);
    let kind = match code {
        2 => CauseKind::Config,
        3 => CauseKind::Lost,
        4 => CauseKind::Startup,
        c if c == 128 + libc::SIGABRT => CauseKind::Fatal,
        c if c > 128 => CauseKind::Signal(c - 128),
        _ => CauseKind::Program,
    };
    let text = String::from_utf8_lossy(data.get(8..).unwrap_or_default()).into_owned();
    Cause::new(origin, kind, text)
}

/// A node's sending side over MPI.
struct MpiPort(Arc<Shared>);

impl Port for MpiPort {
    fn send_with(
        &self,
        to: usize,
        service: ServiceId,
        class: Class,
        len_hint: usize,
        fill: &mut dyn FnMut(&mut Vec<u8>),
    ) -> Result<usize, LinkError> {
        // Room for held step records, which may ride on it (no copy).
        let mut data = hyfi_core::link::buffers::with_capacity(len_hint + STEPS_ROOM);
        fill(&mut data);
        self.send_vec(to, service, class, data)
    }

    fn send_vec(
        &self,
        to: usize,
        service: ServiceId,
        class: Class,
        data: Vec<u8>,
    ) -> Result<usize, LinkError> {
        let s = &self.0;
        if to >= s.nodes || to == s.rank {
            return Err(format!("node {}: no link to node {to}", s.rank).into());
        }
        if let Some(c) = s.failure() {
            return Err(c.line(s.rank).into());
        }
        let n = data.len();
        s.counters.count_sent(class, n);
        s.push(Out {
            to,
            tag: i32::from(service.number()),
            class,
            data,
        });
        Ok(n)
    }
}

/// One node of a job over MPI: the [`NodeLink`] the runtime runs on.
pub struct MpiLink {
    shared: Arc<Shared>,
    coll: Arc<Collectives>,
    thread: Mutex<Option<JoinHandle<()>>>,
    signals: Mutex<Option<SignalThread>>,
    reports: Mutex<Vec<Report>>,
    runtime_stats: Mutex<Option<hyfi_core::StatsHandle>>,
}

impl std::fmt::Debug for MpiLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MpiLink(node {} of {})",
            self.shared.rank, self.shared.nodes
        )
    }
}

impl MpiLink {
    /// Initialises MPI on this node's communication thread and joins the
    /// job. `expected` is the node count the launcher's environment gave,
    /// if any: MPI must agree.
    pub fn start(expected: Option<usize>, heartbeat: Duration) -> Result<Arc<MpiLink>, NetError> {
        crate::panics::record_panics();
        let (started, thread) = engine::spawn(heartbeat)?;
        let shared = started;
        if let Some(n) = expected.filter(|&n| n != shared.nodes) {
            return Err(NetError::BadEnv {
                var: "--nodes",
                value: n.to_string(),
                expected: "the number of MPI processes (or no --nodes under mpirun)",
            });
        }
        *SHARED.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::downgrade(&shared));
        let port: Arc<dyn Port> = Arc::new(MpiPort(shared.clone()));
        let coll = Collectives::new(shared.rank, shared.nodes, port);
        shared
            .services
            .install(collective::SERVICE, coll.clone())
            .map_err(|e| NetError::Protocol {
                me: shared.rank,
                from: shared.rank,
                why: e.to_string(),
            })?;
        // A fault that kills this process (a stack overflow, an abort) is
        // told to every peer before it dies.
        let s = shared.clone();
        let _ = hyfi_core::last_words::set_hook(move |text| {
            s.fail(Cause::new(s.rank, CauseKind::Fatal, text));
            std::thread::sleep(Duration::from_millis(100));
        });
        Ok(Arc::new(MpiLink {
            shared,
            coll,
            thread: Mutex::new(Some(thread)),
            signals: Mutex::new(None),
            reports: Mutex::new(Vec::new()),
            runtime_stats: Mutex::new(None),
        }))
    }

    /// Starts the signal-handling thread: SIGINT, SIGTERM, SIGHUP or
    /// SIGQUIT end the job (the cause told to every node, then
    /// `MPI_Abort`); SIGUSR1 prints the node's counters.
    pub fn handle_signals(self: &Arc<Self>) -> Result<(), NetError> {
        let weak = Arc::downgrade(self);
        let t = SignalThread::start(move |ev| {
            let Some(l) = weak.upgrade() else { return };
            match ev {
                SignalEvent::Abort { signal, from } => {
                    // SAFETY: getppid has no preconditions.
                    let parent = unsafe { libc::getppid() };
                    if from == Some(parent) {
                        // The MPI launcher (its daemon is the parent) ends
                        // the job: a rank died or aborted, which the
                        // launcher names itself. Say what this node knows.
                        let me = l.shared.rank;
                        match l.shared.failure() {
                            Some(c) => {
                                say(&c.line(me));
                                std::process::exit(c.kind.exit_code());
                            }
                            None => {
                                say(&format!(
                                    "node {me}: stopped by the MPI launcher ({signal}): \
                                     another rank ended or failed (the launcher says which)"
                                ));
                                std::process::exit(signals::exit_code_for(signal));
                            }
                        }
                    }
                    let sender = from
                        .map(|p| format!(" from process {p}"))
                        .unwrap_or_default();
                    let c = Cause::new(
                        l.shared.rank,
                        CauseKind::Signal(signal as i32),
                        format!("received {signal}{sender}; the job ends"),
                    );
                    say(&c.line(l.shared.rank));
                    l.shared.fail(c);
                    std::thread::sleep(Duration::from_millis(200));
                    lock(&l.shared.out).abort = Some(signals::exit_code_for(signal));
                    l.shared.wake();
                }
                SignalEvent::DumpStats => eprint!("{}", l.report()),
            }
        })?;
        *lock(&self.signals) = Some(t);
        Ok(())
    }

    /// Makes [`MpiLink::report`] include the runtime's counters.
    pub fn set_runtime_stats(&self, h: hyfi_core::StatsHandle) {
        *lock(&self.runtime_stats) = Some(h);
    }

    /// This node's counters: messages and bytes by class, the runtime's
    /// and the layers' sections. What SIGUSR1 prints.
    pub fn report(&self) -> String {
        let mut s = format!(
            "hyfi: node {} traffic (MPI): {}\n",
            self.shared.rank,
            self.traffic().unwrap_or_default()
        );
        if let Some(st) = lock(&self.runtime_stats).as_ref().and_then(|h| h.stats()) {
            s += &st.to_string();
        }
        for section in lock(&self.reports).iter() {
            if let Some(text) = section() {
                s += &text;
            }
        }
        s
    }

    fn failed(&self) -> Result<(), LinkError> {
        match self.shared.failure() {
            Some(c) => Err(c.line(self.shared.rank).into()),
            None => Ok(()),
        }
    }
}

impl NodeLink for MpiLink {
    fn num_nodes(&self) -> usize {
        self.shared.nodes
    }
    fn my_node(&self) -> usize {
        self.shared.rank
    }
    fn barrier(&self) -> Result<(), LinkError> {
        self.failed()?;
        self.coll.barrier()
    }
    fn allreduce(
        &self,
        value: &mut [u8],
        combine: &mut dyn FnMut(&mut [u8], &[u8]),
    ) -> Result<(), LinkError> {
        self.failed()?;
        self.coll.allreduce(value, combine)
    }
    fn allreduce_vec(
        &self,
        value: &mut Vec<u8>,
        combine: &mut dyn FnMut(&mut Vec<u8>, &[u8]),
    ) -> Result<(), LinkError> {
        self.failed()?;
        self.coll.allreduce_vec(value, combine)
    }
    fn traffic(&self) -> Option<Traffic> {
        Some(self.shared.counters.traffic())
    }
    fn port(&self) -> Option<Arc<dyn Port>> {
        Some(Arc::new(MpiPort(self.shared.clone())))
    }
    fn set_service(&self, id: ServiceId, service: Arc<dyn Service>) -> Result<(), LinkError> {
        let s = &self.shared;
        match s.services.install(id, service.clone()) {
            Ok(()) => {}
            Err(e @ ServiceError::Twice { .. }) => {
                return Err(format!("node {}: {e}", s.rank).into())
            }
            Err(e @ ServiceError::Failed { .. }) => {
                let c = Cause::new(s.rank, CauseKind::Program, e.to_string());
                s.fail(c.clone());
                return Err(c.line(s.rank).into());
            }
        }
        if let Some(c) = s.failure() {
            service.failed(&c.line(s.rank));
        }
        Ok(())
    }
    fn add_report(&self, section: Report) {
        lock(&self.reports).push(section);
    }
    fn enter_step(&self, step: Step) -> Result<(), LinkError> {
        let s = &self.shared;
        if s.nodes < 2 {
            return Ok(());
        }
        self.failed()?;
        let prev = (s.rank + s.nodes - 1) % s.nodes;
        let entered = lock(&s.steps).enter(prev, step);
        match entered {
            Ok(k) => {
                // Held back for the successor (see `STEPS_HELD`).
                let full = {
                    let mut o = lock(&s.out);
                    if o.steps.is_empty() {
                        o.steps_since = Some(std::time::Instant::now());
                    }
                    o.steps.extend_from_slice(&k.to_le_bytes());
                    for w in step.to_words() {
                        o.steps.extend_from_slice(&w.to_le_bytes());
                    }
                    s.steps_held.store(true, Ordering::Release);
                    o.steps.len() >= STEPS_HELD * STEP_RECORD
                };
                if full {
                    s.flush_steps();
                }
                Ok(())
            }
            Err(e) => {
                let c = Cause::new(s.rank, CauseKind::Program, e.to_string());
                s.fail(c.clone());
                Err(c.line(s.rank).into())
            }
        }
    }
    fn abort(&self, cause: &str) {
        let s = &self.shared;
        s.fail(Cause::new(s.rank, CauseKind::Program, cause));
    }
}

impl Drop for MpiLink {
    fn drop(&mut self) {
        if let Some(t) = lock(&self.signals).take() {
            let _ = t.stop();
        }
        let s = &self.shared;
        if std::thread::panicking() {
            let what = crate::panics::last_panic().unwrap_or_else(|| "(no message)".into());
            s.fail(Cause::new(
                s.rank,
                CauseKind::Program,
                format!("its program panicked: {what}"),
            ));
        }
        // Goodbye behind everything this node sent, on both classes; the
        // communication thread serves the peers until each said goodbye
        // too, then finalises MPI.
        let (steps, last) = lock(&s.steps).last();
        let mut bye = steps.to_le_bytes().to_vec();
        for w in last.map(Step::to_words).unwrap_or([0; 4]) {
            bye.extend_from_slice(&w.to_le_bytes());
        }
        {
            let mut o = lock(&s.out);
            // The held steps first: the successor checks them before the
            // goodbye's count.
            if let Some(data) = o.take_steps(None) {
                s.steps_held.store(false, Ordering::Release);
                o.control.push_back(Out {
                    to: (s.rank + 1) % s.nodes,
                    tag: tag::STEP,
                    class: Class::Control,
                    data,
                });
            }
            for to in (0..s.nodes).filter(|&p| p != s.rank) {
                for class in [Class::Control, Class::Bulk] {
                    let out = Out {
                        to,
                        tag: tag::BYE,
                        class,
                        data: bye.clone(),
                    };
                    match class {
                        Class::Control => o.control.push_back(out),
                        Class::Bulk => o.bulk.push_back(out),
                    }
                }
            }
            o.closing = true;
        }
        s.wake();
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
        // Services hold a port, which holds the shared state, which holds
        // them.
        s.services.clear();
        if let Some(c) = s.failure() {
            // The node failed and its program ended anyway: the job must
            // not look as if it succeeded.
            say(&c.line(s.rank));
            std::process::exit(c.kind.exit_code());
        }
    }
}
