//! The node seam for layers: how a layer above the runtime (the shared
//! memory, cross-node stealing) talks to the same layer on other nodes,
//! without knowing the transport.
//!
//! A layer is a [`Service`] registered on its node's link under a
//! [`ServiceId`] ([`NodeLink::set_service`](crate::NodeLink::set_service)).
//! It sends with the node's [`Port`]
//! ([`NodeLink::port`](crate::NodeLink::port)): a payload it builds itself,
//! to one node, for the same service there, in one of two priority
//! classes. The transport frames the payload, moves it, and hands it to
//! the receiving node's service on that node's *delivery thread* (over TCP,
//! the communication thread), in the order it was sent per sender and
//! class.
//!
//! # Priority classes
//!
//! * [`Class::Control`]: small messages someone waits for with nothing
//!   else to do — a page *request*, a steal *request*. A control message
//!   overtakes bulk messages queued before it to the same node and that
//!   have not started moving yet: **control never waits behind bulk**
//!   (at most behind one bulk message already being written).
//! * [`Class::Bulk`]: data — pages, diffs and write notices (a release),
//!   stolen filaments, results. Bulk messages to one node stay in order.
//!
//! Messages of different classes from one node to another may be
//! reordered; a protocol that needs an order between them must not rely on
//! the transport for it (the DSM's requests carry the requester's epoch for
//! this reason).
//!
//! # Handlers
//!
//! [`Service::frame`] runs on the receiving node's delivery thread. It
//! must not block: it may send (sending never blocks) and wake waiters,
//! nothing more. A handler's `Err` is a protocol violation and fails the
//! node. [`Service::failed`] tells the service that its node failed (a lost
//! peer, an abort): every waiter must wake with the reason.
//! [`Service::peer_left`] tells it that a peer's program ended: that peer
//! asks for nothing more, but still answers requests.
//!
//! # Implementations
//!
//! hyfi-net implements the seam over TCP (`hyfi_net::tcp::Cluster`) and,
//! with its `mpi` feature, over MPI (`hyfi_net::mpi::MpiLink`);
//! [`InProcess`] implements it with channels between several runtimes in
//! one process, for unit tests of the protocols. What every transport
//! shares is here, written once: the table of services and of the frames
//! that come before their service ([`ServiceTable`]), barrier and
//! all-reduce with their fixed combining order ([`collective`]), the SPMD
//! step checks ([`spmd`]), and, for a transport that must be polled,
//! progress made by idle processors ([`set_idle_progress`]). The facade's
//! `hyfi::conformance` suite says what a transport must do, and CI runs
//! it over each of them.
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use hyfi::layers::link::{Class, FrameError, InProcess, Service, ServiceId};
//! use hyfi::layers::NodeLink;
//!
//! /// Collects what it receives.
//! #[derive(Default)]
//! struct Log(Mutex<Vec<(usize, Vec<u8>)>>);
//! impl Service for Log {
//!     fn frame(&self, from: usize, payload: Vec<u8>) -> Result<(), FrameError> {
//!         self.0.lock().unwrap().push((from, payload));
//!         Ok(())
//!     }
//!     fn failed(&self, _why: &str) {}
//! }
//!
//! let nodes = InProcess::connect(2);
//! let log = Arc::new(Log::default());
//! // A layer owns its service's number and name.
//! const LOG: ServiceId = ServiceId::new(100, "a log");
//! nodes[1].set_service(LOG, log.clone()).unwrap();
//! let port = nodes[0].port().unwrap();
//! port.send_bytes(1, LOG, Class::Control, b"hello").unwrap();
//! // Delivery is asynchronous, on node 1's delivery thread.
//! while log.0.lock().unwrap().is_empty() {
//!     std::thread::yield_now();
//! }
//! assert_eq!(log.0.lock().unwrap()[0], (0, b"hello".to_vec()));
//! ```

pub mod collective;
mod counters;
mod in_process;
mod services;
pub mod spmd;

pub use counters::TrafficCounters;
pub use in_process::InProcess;
pub(crate) use services::registered_name;
pub use services::{ServiceError, ServiceTable};
pub use spmd::{StepError, Steps};

/// A transport's progress function, polled by idle processors: see
/// [`set_idle_progress`].
static IDLE_PROGRESS: std::sync::OnceLock<fn() -> bool> = std::sync::OnceLock::new();

/// Lets this process's idle processors drive a transport's progress.
///
/// A transport whose messages arrive only when someone polls (MPI's
/// progress engine has no descriptor to sleep on) otherwise needs its
/// communication thread to poll, and a message then reaches a waiting
/// filthread through that thread: on a node whose server thread shares its
/// CPU with the communication thread (`mpirun` binds a rank to one core),
/// every message costs context switches between the two. With a progress
/// function, a processor with nothing to run (its filthreads wait for a
/// page, a steal, a release) calls `progress` while it waits: it receives
/// and handles the messages itself, on its own CPU, as the communication
/// thread would (services' handlers then run on that processor, between
/// filaments; they must not block, as always). `progress` must return at
/// once when another thread is polling (a `try_lock`), and say whether it
/// moved anything. The transport's own thread must go on polling as well:
/// a processor polls only while it waits, and a wait may end in sleep. One
/// function per process; false if one was set already.
pub fn set_idle_progress(progress: fn() -> bool) -> bool {
    IDLE_PROGRESS.set(progress).is_ok()
}

/// Polls the transport's progress function, if any: for a thread with
/// nothing to do while it waits (an idle processor, a collective's wait).
/// True if there is one.
#[inline]
pub(crate) fn idle_progress() -> bool {
    match IDLE_PROGRESS.get() {
        Some(f) => {
            f();
            true
        }
        None => false,
    }
}

/// A transport's poll for a processor that computes: see
/// [`set_busy_progress`].
static BUSY_PROGRESS: std::sync::OnceLock<fn() -> bool> = std::sync::OnceLock::new();

/// Lets this process's computing processors poll a transport now and then.
///
/// [`set_idle_progress`] covers a processor with nothing to run. A node
/// whose processors all compute still receives requests that another
/// node waits on (a page of which this node is the home, a steal): with
/// a transport that must be polled, only the transport's own thread would
/// take them, and on a core it shares with a computing server thread that
/// thread runs when the OS lets it (on `mpirun`'s one core per rank, a
/// pivot row's fetch in LU waited 38 µs for a home that computed, against
/// 6 µs for one that waited). With `progress` set, a processor runs each
/// segment of its pool in pieces of rows (of filaments, in a 1-D pool),
/// each bound as a segment of its own, and calls `progress` between them:
/// [`BUSY_POLL`] after the pool starts, then at intervals that
/// double while polls find nothing, up to [`BUSY_POLL_MAX`], and fall back
/// to [`BUSY_POLL`] when one finds something (requests come when other
/// nodes start their phase and fault, so a long phase that moves nothing
/// is polled rarely); the number of filaments between two calls adapts to
/// their length. `progress` should take only what another node waits for
/// (requests, control messages), return at once when another thread polls
/// (a `try_lock`), never block, and say whether it found anything;
/// handlers run on that processor between filaments, as with idle
/// progress. One function per process; false if one was set already.
pub fn set_busy_progress(progress: fn() -> bool) -> bool {
    BUSY_PROGRESS.set(progress).is_ok()
}

/// How soon a computing processor polls the transport after its pool
/// starts or a poll found something, if it has a busy progress function
/// ([`set_busy_progress`]).
pub const BUSY_POLL: std::time::Duration = std::time::Duration::from_micros(10);
/// The longest interval between its polls, reached by doubling while polls
/// find nothing: an MPI poll that finds nothing costs about a microsecond
/// (measured: polling every 10 µs throughout cost Jacobi 2×1 over MPI
/// 10–15 %).
pub const BUSY_POLL_MAX: std::time::Duration = std::time::Duration::from_micros(160);

/// A pool loop's countdown to its next busy poll (see
/// [`set_busy_progress`]), in rows (filaments of a 1-D pool): the pool
/// runs a segment in pieces of at most `left` rows and polls when it runs
/// out (`Pool::for_each_segment`), reading the clock only then. Without a
/// busy progress function it starts at `u64::MAX` and never runs out.
pub(crate) struct BusyPoll<'s> {
    /// Filaments (rows) left before the next poll: the pool loop counts it
    /// down (`Pool::for_each_segment`) and calls [`BusyPoll::due`] when it
    /// runs out.
    pub(crate) left: u64,
    state: &'s BusyState,
}

impl<'s> BusyPoll<'s> {
    /// The countdown of a processor (its `Ctx::busy`) for a pool that
    /// starts: the next poll comes [`BUSY_POLL`] on.
    #[inline]
    pub(crate) fn new(state: &'s BusyState) -> Self {
        if state.left.get() != u64::MAX {
            state.restart();
        }
        BusyPoll {
            left: state.left.get(),
            state,
        }
    }

    /// The countdown ran out: polls, and returns the next countdown.
    #[inline(always)]
    pub(crate) fn due(&self) -> u64 {
        due(self.state)
    }
}

/// Polls, and returns the next countdown: the interval doubles if the
/// poll found nothing (up to [`BUSY_POLL_MAX`]) and is [`BUSY_POLL`] again
/// if it found something; the filaments it spans are the rate the
/// countdown that just ran out measured.
#[cold]
#[inline(never)]
fn due(b: &BusyState) -> u64 {
    let Some(poll) = BUSY_PROGRESS.get() else {
        return u64::MAX;
    };
    let found = poll();
    let now = std::time::Instant::now();
    let took = now.saturating_duration_since(b.last.get()).as_secs_f64();
    b.last.set(now);
    b.rate.set(b.armed.get() as f64 / took.max(1e-8));
    let next = if found {
        BUSY_POLL
    } else {
        (b.interval.get() * 2).min(BUSY_POLL_MAX)
    };
    b.arm(next)
}

impl BusyPoll<'_> {
    /// Keeps the countdown for the processor's next pool (explicit, not a
    /// `Drop`: the pool loop gets no destructor to run on unwinding; a
    /// panicking pool just loses its countdown).
    #[inline]
    pub(crate) fn save(self) {
        self.state.left.set(self.left);
    }
}

/// A processor's busy-poll state (see [`BusyPoll`]), kept in its `Ctx`.
pub(crate) struct BusyState {
    /// Filaments left before the next poll (`u64::MAX`: never).
    left: std::cell::Cell<u64>,
    /// Filaments the current countdown started with.
    armed: std::cell::Cell<u64>,
    /// When it last polled (or its pool started).
    last: std::cell::Cell<std::time::Instant>,
    /// The interval the current countdown aims at.
    interval: std::cell::Cell<std::time::Duration>,
    /// Filaments per second, as the last countdown measured.
    rate: std::cell::Cell<f64>,
}

impl BusyState {
    pub(crate) fn new() -> Self {
        let s = BusyState {
            left: std::cell::Cell::new(u64::MAX),
            armed: std::cell::Cell::new(0),
            last: std::cell::Cell::new(std::time::Instant::now()),
            interval: std::cell::Cell::new(BUSY_POLL),
            rate: std::cell::Cell::new(1e6),
        };
        // Without a busy progress function (set before the runtime's
        // processors start, by the transport) the countdown never runs out.
        if BUSY_PROGRESS.get().is_some() {
            s.left.set(s.arm(BUSY_POLL));
        }
        s
    }

    /// Sets a countdown of the filaments `interval` takes at the measured
    /// rate; returns it.
    fn arm(&self, interval: std::time::Duration) -> u64 {
        let n = (self.rate.get() * interval.as_secs_f64()).clamp(1.0, (1u64 << 20) as f64) as u64;
        self.interval.set(interval);
        self.armed.set(n);
        self.left.set(n);
        n
    }

    /// A pool starts: the next poll comes [`BUSY_POLL`] on.
    fn restart(&self) {
        self.last.set(std::time::Instant::now());
        self.arm(BUSY_POLL);
    }
}

// The seam's types are defined next to `NodeLink`, which hands them out
// (so that `node` needs nothing of this module); this is their public home.
pub use crate::node::{
    Class, ClassTraffic, FrameError, Port, Report, Service, ServiceId, Traffic, MAX_PAYLOAD,
};
