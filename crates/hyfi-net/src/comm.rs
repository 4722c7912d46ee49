//! The communication thread: one per node, running a single-threaded tokio
//! runtime that reads every link.
//!
//! **Sending** does not go through it: the calling thread writes its frame
//! to the socket itself, under a per-link lock (frames never interleave; a
//! control frame waits at most for one frame already being written). This
//! departs from the design card's "workers hand messages to the
//! communication thread through lock-free queues": that hand-off cost a
//! wake-up of the communication thread per message, which measured 5–7×
//! a raw TCP round trip; writing directly removed it (see BENCHMARKS.md).
//! **Receiving**: one reader task per link decodes frames and files them in
//! the [`Inbox`], where waiting threads spin briefly and then sleep, and
//! waiting filthreads suspend (the hyfi-core seam) so their processor runs
//! other work.
//!
//! **Failure detection.** A link that closes or breaks before its peer said
//! `Bye`, or an `Abort` from a peer, fails the node: every waiter in the
//! inbox returns the error at once, the failure hook runs (the cluster layer
//! reports it and ends the process after a short grace), and the remaining
//! peers are told to abort. A killed process closes its sockets, so peers
//! notice within a round trip.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::sync::mpsc::unbounded_channel;

use hyfi_core::link::{Class, ClassTraffic, Service, ServiceId, Traffic};

use crate::error::NetError;
use crate::mesh::Links;
use crate::spmd::Steps;
use crate::wire::{self, Header, Kind, Msg, HANDSHAKE_LEN, HEADER_LEN};

/// How long a node whose program ended serves its peers before it says
/// so on stderr (it goes on serving them).
const CLOSE_NOTICE: Duration = Duration::from_secs(10);

/// How long a waiting thread polls before it sleeps. It polls by yielding
/// its CPU, not by spinning: the communication thread that will deliver the
/// message may share that CPU (with several nodes on a host, a node's
/// threads stay on its CPUs), and a spinning waiter would only delay it.
const SPIN: Duration = Duration::from_micros(50);

/// Direction of a collective message.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Dir {
    /// Towards node 0.
    Up,
    /// From node 0 outwards.
    Down,
}

/// Counters of one node's traffic.
#[derive(Debug, Default)]
pub struct NetStats {
    /// Control messages sent.
    pub control_sent: AtomicU64,
    /// Control bytes sent (frames included).
    pub control_bytes_sent: AtomicU64,
    /// Control messages received.
    pub control_received: AtomicU64,
    /// Control bytes received.
    pub control_bytes_received: AtomicU64,
    /// Bulk frames sent.
    pub bulk_sent: AtomicU64,
    /// Bulk bytes sent.
    pub bulk_bytes_sent: AtomicU64,
    /// Bulk frames received.
    pub bulk_received: AtomicU64,
    /// Bulk bytes received.
    pub bulk_bytes_received: AtomicU64,
    /// Connections refused after setup (garbage, wrong token, stale job).
    pub refused: AtomicU64,
}

impl NetStats {
    /// The counters now, by class (what [`hyfi_core::NodeLink::traffic`]
    /// reports).
    pub fn snapshot(&self) -> Traffic {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Traffic {
            control: ClassTraffic {
                sent: g(&self.control_sent),
                bytes_sent: g(&self.control_bytes_sent),
                received: g(&self.control_received),
                bytes_received: g(&self.control_bytes_received),
            },
            bulk: ClassTraffic {
                sent: g(&self.bulk_sent),
                bytes_sent: g(&self.bulk_bytes_sent),
                received: g(&self.bulk_received),
                bytes_received: g(&self.bulk_bytes_received),
            },
            refused: g(&self.refused),
        }
    }

    /// Counts a frame of `bytes` sent in `class`.
    fn count_sent(&self, class: Class, bytes: usize) {
        let (n, b) = match class {
            Class::Control => (&self.control_sent, &self.control_bytes_sent),
            Class::Bulk => (&self.bulk_sent, &self.bulk_bytes_sent),
        };
        n.fetch_add(1, Ordering::Relaxed);
        b.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Counts a frame of `bytes` received in `class`.
    fn count_received(&self, class: Class, bytes: u64) {
        let (n, b) = match class {
            Class::Control => (&self.control_received, &self.control_bytes_received),
            Class::Bulk => (&self.bulk_received, &self.bulk_bytes_received),
        };
        n.fetch_add(1, Ordering::Relaxed);
        b.fetch_add(bytes, Ordering::Relaxed);
    }
}

impl std::fmt::Display for NetStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.snapshot().fmt(f)
    }
}

/// Where received messages wait for the server thread that wants them.
#[derive(Default)]
pub struct Inbox {
    state: Mutex<InboxState>,
    cv: Condvar,
    /// Set when this node is about to exit on a signal: the links its peers
    /// drop as they abort are then expected, and must not make this node's
    /// program exit first with an error status of its own.
    exiting: std::sync::atomic::AtomicBool,
    /// Bumped by every `put`: lets a waiter spin on one atomic instead of
    /// sleeping on the condvar at once (a futex sleep and wake-up costs tens
    /// of microseconds on a VM, more than a round trip on loopback).
    generation: AtomicU64,
    services: Mutex<HashMap<ServiceId, ServiceSlot>>,
}

/// Tag bit of bulk frames that go to one of the node's [`Service`]s
/// instead of the inbox; bits 56..63 name the service ([`ServiceId`]),
/// bit 0 says the frame was sent as [`Class::Control`] (so the receiver
/// counts it as such); the other bits are zero.
pub(crate) const SERVICE_TAG: u64 = 1 << 63;

/// The tag of a frame for service `id` sent in `class`.
pub(crate) const fn service_tag(id: ServiceId, class: Class) -> u64 {
    SERVICE_TAG | (((id.number() & 0x7f) as u64) << 56) | matches!(class, Class::Control) as u64
}

/// The service number and the class of a service tag.
pub(crate) const fn split_service_tag(tag: u64) -> (u8, Class) {
    let class = if tag & 1 == 1 {
        Class::Control
    } else {
        Class::Bulk
    };
    (((tag >> 56) & 0x7f) as u8, class)
}

enum ServiceSlot {
    /// Frames that came before the service was installed.
    Pending(Vec<(usize, Vec<u8>)>),
    Ready(Arc<dyn Service>),
}

impl Default for ServiceSlot {
    fn default() -> Self {
        ServiceSlot::Pending(Vec::new())
    }
}

#[derive(Default)]
struct InboxState {
    coll: HashMap<(usize, u64, Dir), Vec<u8>>,
    bulk: HashMap<usize, std::collections::VecDeque<(u64, Vec<u8>)>>,
    failed: Option<String>,
    byes: usize,
    /// Peers that said `Bye`: they send nothing more but answers to
    /// requests, so a wait for anything else from them would never end.
    gone: std::collections::HashSet<usize>,
    /// This node's SPMD steps and its ring predecessor's (see `spmd`).
    steps: Option<Steps>,
    /// Filthreads suspended until something arrives.
    waiters: Vec<hyfi_core::filthread::Waker>,
}

impl InboxState {
    fn take_waiters(&mut self) -> Vec<hyfi_core::filthread::Waker> {
        std::mem::take(&mut self.waiters)
    }
}

impl Inbox {
    fn put(&self, f: impl FnOnce(&mut InboxState)) {
        let waiters = {
            let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
            f(&mut s);
            self.generation.fetch_add(1, Ordering::Release);
            self.cv.notify_all();
            s.take_waiters()
        };
        // Woken outside the lock; each re-checks for its own message.
        for w in waiters {
            w.wake();
        }
    }
    fn put_coll(&self, from: usize, seq: u64, dir: Dir, data: Vec<u8>) {
        self.put(|s| {
            s.coll.insert((from, seq, dir), data);
        });
    }
    fn put_bulk(&self, from: usize, tag: u64, data: Vec<u8>) {
        self.put(|s| s.bulk.entry(from).or_default().push_back((tag, data)));
    }
    /// Records the first failure; returns true if it was the first.
    fn fail(&self, why: String) -> bool {
        if self.exiting.load(Ordering::SeqCst) {
            return false;
        }
        let mut first = false;
        let text = why.clone();
        self.put(|s| {
            first = s.failed.is_none();
            if first {
                s.failed = Some(why);
            }
        });
        if first {
            for s in self.ready_services() {
                s.failed(&text);
            }
        }
        first
    }
    /// The services installed so far.
    fn ready_services(&self) -> Vec<Arc<dyn Service>> {
        self.services
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter_map(|slot| match slot {
                ServiceSlot::Ready(s) => Some(s.clone()),
                ServiceSlot::Pending(_) => None,
            })
            .collect()
    }
    /// Hands a service frame to the service, or keeps it until one is
    /// installed. The slot's lock is held while the handler runs, so frames
    /// reach the service in the order they came.
    fn to_service(&self, from: usize, tag: u64, payload: Vec<u8>) -> Result<(), String> {
        let n = split_service_tag(tag).0;
        let id = ServiceId::from_number(n)
            .ok_or_else(|| format!("a frame for service {n}, which is none"))?;
        let mut slots = self.services.lock().unwrap_or_else(|e| e.into_inner());
        let slot = slots.entry(id).or_default();
        match slot {
            ServiceSlot::Pending(v) => {
                v.push((from, payload));
                Ok(())
            }
            ServiceSlot::Ready(s) => s.frame(from, payload),
        }
    }
    /// Peer `from` said `Bye` after `steps` steps: an error if this node
    /// already went further.
    fn bye(&self, from: usize, steps: u64, last: Option<hyfi_core::Step>) -> Result<(), String> {
        let mut r = Ok(());
        self.put(|s| {
            s.byes += 1;
            s.gone.insert(from);
            if let Some(st) = s.steps.as_mut() {
                r = st.on_bye(from, steps, last);
            }
        });
        // A wrong goodbye fails the node (which wakes the services with
        // why); a right one only ends the services' waits for that peer.
        if r.is_ok() {
            for s in self.ready_services() {
                s.peer_left(from);
            }
        }
        r
    }
    /// Waits until `take` finds its message (or the node fails). On a
    /// filthread the filthread suspends and its server thread runs other
    /// work meanwhile; elsewhere the calling thread blocks.
    fn wait<T>(
        &self,
        mut take: impl FnMut(&mut InboxState) -> Option<Result<T, String>>,
    ) -> Result<T, String> {
        if hyfi_core::filthread::in_filthread() {
            let mut got = None;
            loop {
                hyfi_core::filthread::suspend(|waker| {
                    let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(v) = take(&mut s) {
                        got = Some(v);
                        return false;
                    }
                    if let Some(f) = &s.failed {
                        got = Some(Err(f.clone()));
                        return false;
                    }
                    // Registered under the lock that `put` takes: a message
                    // arriving after this check finds the waker.
                    s.waiters.push(waker);
                    true
                });
                if let Some(r) = got.take() {
                    return r;
                }
            }
        }
        // Poll a little first: replies on a fast network come back sooner
        // than a sleeping thread can be woken.
        let spin_until = Instant::now()
            + if hyfi_core::sleep::own_cpu() {
                hyfi_core::sleep::OWN_CPU_POLL
            } else {
                SPIN
            };
        loop {
            let seen = self.generation.load(Ordering::Acquire);
            {
                let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(v) = take(&mut s) {
                    return v;
                }
                if let Some(f) = &s.failed {
                    return Err(f.clone());
                }
            }
            while self.generation.load(Ordering::Acquire) == seen && Instant::now() < spin_until {
                std::thread::yield_now();
            }
            if Instant::now() >= spin_until {
                break;
            }
        }
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(v) = take(&mut s) {
                return v;
            }
            if let Some(f) = &s.failed {
                return Err(f.clone());
            }
            s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }
    /// The failure, if the node has failed.
    pub fn failure(&self) -> Option<String> {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .failed
            .clone()
    }
}

/// The sending side of one link. Every frame is written without blocking:
/// what the socket does not take at once waits in `backlog`, in order, and
/// the flusher thread writes it as the socket drains. So the communication
/// thread may answer requests itself (a page, a steal) without ever
/// blocking on a full socket — two nodes answering each other's requests
/// could otherwise deadlock with both receive buffers full.
struct PeerTx {
    st: Mutex<TxState>,
}

struct TxState {
    /// `None` once closed.
    sock: Option<std::net::TcpStream>,
    /// Frames not yet fully written; the first one is written from `head_off`.
    backlog: std::collections::VecDeque<Vec<u8>>,
    head_off: usize,
}

/// Writes as much of `buf` as the non-blocking socket takes now (tokio owns
/// the reading side, and the blocking flag is shared by both). Returns how
/// many bytes were written.
fn write_some(s: &mut std::net::TcpStream, buf: &[u8]) -> std::io::Result<usize> {
    use std::io::Write;
    let mut done = 0;
    while done < buf.len() {
        match s.write(&buf[done..]) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

impl TxState {
    /// Writes backlogged frames until the socket would block; `Ok(true)` if
    /// the backlog is empty afterwards.
    fn flush(&mut self) -> std::io::Result<bool> {
        let Some(sock) = self.sock.as_mut() else {
            return Ok(self.backlog.is_empty());
        };
        while let Some(head) = self.backlog.front() {
            let n = write_some(sock, &head[self.head_off..])?;
            self.head_off += n;
            if self.head_off < head.len() {
                return Ok(false);
            }
            self.backlog.pop_front();
            self.head_off = 0;
        }
        Ok(true)
    }
}

/// The thread that writes backlogged frames when their sockets drain.
struct Flusher {
    pending: Mutex<bool>,
    cv: Condvar,
    stop: std::sync::atomic::AtomicBool,
}

impl Flusher {
    fn kick(&self) {
        *self.pending.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cv.notify_one();
    }
}

fn flusher_loop(
    flusher: Arc<Flusher>,
    txs: Arc<Vec<Option<PeerTx>>>,
    on_error: impl Fn(usize, std::io::Error),
) {
    use std::os::fd::AsRawFd;
    loop {
        {
            let mut p = flusher.pending.lock().unwrap_or_else(|e| e.into_inner());
            while !*p && !flusher.stop.load(Ordering::SeqCst) {
                p = flusher.cv.wait(p).unwrap_or_else(|e| e.into_inner());
            }
            *p = false;
        }
        if flusher.stop.load(Ordering::SeqCst) {
            return;
        }
        // Until every backlog is empty: wait for room, then write.
        loop {
            let mut fds = Vec::new();
            for (peer, tx) in txs.iter().enumerate() {
                let Some(tx) = tx else { continue };
                let mut st = tx.st.lock().unwrap_or_else(|e| e.into_inner());
                match st.flush() {
                    Ok(true) => {}
                    Ok(false) => {
                        if let Some(s) = st.sock.as_ref() {
                            fds.push(libc::pollfd {
                                fd: s.as_raw_fd(),
                                events: libc::POLLOUT,
                                revents: 0,
                            });
                        }
                    }
                    Err(e) => {
                        st.backlog.clear();
                        drop(st);
                        on_error(peer, e);
                    }
                }
            }
            if fds.is_empty() || flusher.stop.load(Ordering::SeqCst) {
                break;
            }
            // SAFETY: `fds` is a valid array of pollfds for sockets held open
            // by `txs` (a closed socket's fd may be reused meanwhile; a
            // spurious POLLOUT only costs one more non-blocking write try).
            let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 100) };
            if r < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    tracing::warn!("hyfi-net flusher: poll failed: {e}");
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }
}

/// What sending needs: the links' writing halves and the flusher. Shared
/// by [`Comm`] and every [`Sender`] handed out.
pub struct SenderInner {
    rank: usize,
    nodes: usize,
    tx: Arc<Vec<Option<PeerTx>>>,
    flusher: Arc<Flusher>,
    inbox: Arc<Inbox>,
    stats: Arc<NetStats>,
}

/// A handle for sending to the peers, independent of the [`Comm`]'s own
/// lifetime: a [`Service`] keeps one to answer requests while its node
/// closes (the node serves its peers until each has said `Bye`).
#[derive(Clone)]
pub struct Sender(Arc<SenderInner>);

impl std::ops::Deref for Sender {
    type Target = SenderInner;
    fn deref(&self) -> &SenderInner {
        &self.0
    }
}

/// A node's communication thread and the handles to talk through it.
pub struct Comm {
    sender: Sender,
    flusher_thread: Mutex<Option<JoinHandle<()>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    shutdown: Arc<tokio::sync::Notify>,
}

impl std::ops::Deref for Comm {
    type Target = Sender;
    fn deref(&self) -> &Sender {
        &self.sender
    }
}

impl Sender {
    /// This node's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }
    /// Number of nodes.
    pub fn nodes(&self) -> usize {
        self.nodes
    }
    /// Traffic counters.
    pub fn stats(&self) -> &NetStats {
        &self.stats
    }
    /// Writes a frame to `peer` from the calling thread (no hand-off to the
    /// communication thread, whose wake-up would cost more than the write),
    /// never blocking: what the socket does not take now is backlogged for
    /// the flusher thread. A control frame overtakes backlogged frames that
    /// have not started, so control traffic waits at most for one frame
    /// being written.
    pub(crate) fn push(&self, peer: usize, frame: Vec<u8>, control: bool) -> Result<(), NetError> {
        let Some(Some(tx)) = self.tx.get(peer) else {
            return Err(self.failed_error(format!("no link to node {peer}")));
        };
        let mut guard = tx.st.lock().unwrap_or_else(|e| e.into_inner());
        let st = &mut *guard;
        let Some(sock) = st.sock.as_mut() else {
            return Err(self.failed_error(format!("link to node {peer} is closed")));
        };
        if st.backlog.is_empty() {
            let n = write_some(sock, &frame)
                .map_err(|e| self.failed_error(format!("writing to node {peer}: {e}")))?;
            if n == frame.len() {
                return Ok(());
            }
            st.backlog.push_back(frame);
            st.head_off = n;
        } else if control {
            // Behind the frame being written, ahead of those not started.
            let at = if st.head_off > 0 { 1 } else { 0 };
            st.backlog.insert(at, frame);
        } else {
            st.backlog.push_back(frame);
        }
        drop(guard);
        self.flusher.kick();
        Ok(())
    }

    /// Sends a bulk frame built with [`wire::bulk_frame`] or
    /// [`wire::bulk_frame_with`] (so a page is copied once, straight into
    /// the frame).
    pub fn send_frame(&self, peer: usize, frame: Vec<u8>) -> Result<(), NetError> {
        self.stats.count_sent(Class::Bulk, frame.len());
        self.push(peer, frame, false)
    }

    /// Sends a service's message (see [`hyfi_core::link::Port`]): the
    /// payload `fill` appends goes straight into the frame (a page is
    /// copied once); a [`Class::Control`] frame overtakes queued bulk
    /// frames.
    pub(crate) fn send_service(
        &self,
        peer: usize,
        id: ServiceId,
        class: Class,
        len_hint: usize,
        fill: &mut dyn FnMut(&mut Vec<u8>),
    ) -> Result<usize, NetError> {
        let mut frame = Vec::with_capacity(HEADER_LEN + len_hint);
        frame.extend_from_slice(&[0u8; HEADER_LEN]);
        fill(&mut frame);
        let len = frame.len() - HEADER_LEN;
        if len > wire::MAX_FRAME {
            return Err(NetError::Protocol {
                me: self.rank,
                from: self.rank,
                why: format!(
                    "a message of {len} bytes for {id} exceeds the frame limit of {} bytes",
                    wire::MAX_FRAME
                ),
            });
        }
        frame[..HEADER_LEN].copy_from_slice(
            &Header {
                len: len as u32,
                kind: Kind::Bulk,
                tag: service_tag(id, class),
            }
            .encode(),
        );
        let bytes = frame.len();
        self.stats.count_sent(class, bytes);
        self.push(peer, frame, class == Class::Control)?;
        Ok(bytes)
    }

    pub(crate) fn failed_error(&self, fallback: String) -> NetError {
        if self.inbox.exiting.load(Ordering::SeqCst) {
            // This node is ending on a signal, with that signal's status,
            // in a moment (the signal thread): the links its peers drop as
            // they abort must not make the program exit first with an
            // error status of its own. Its caller waits for the end.
            loop {
                std::thread::park();
            }
        }
        self.aborted(self.inbox.failure().unwrap_or(fallback))
    }

    /// Queues a control message to `peer` (never blocks).
    pub fn send(&self, peer: usize, msg: &Msg) -> Result<(), NetError> {
        let f = wire::control_frame(msg);
        self.stats.control_sent.fetch_add(1, Ordering::Relaxed);
        self.stats
            .control_bytes_sent
            .fetch_add(f.len() as u64, Ordering::Relaxed);
        self.push(peer, f, true)
    }

    /// Queues raw bytes to `peer` under `tag` (never blocks).
    pub fn send_bulk(&self, peer: usize, tag: u64, bytes: &[u8]) -> Result<(), NetError> {
        self.send_frame(peer, wire::bulk_frame(tag, bytes))
    }

    /// Tells every peer this node aborts the job, with `cause`.
    fn send_abort(&self, cause: &str) {
        // Failure texts name this node already; the peer names the sender.
        let prefix = format!("node {}: ", self.rank);
        let cause = cause.strip_prefix(&prefix).unwrap_or(cause);
        for p in 0..self.nodes {
            if p != self.rank {
                let _ = self.send(
                    p,
                    &Msg::Abort {
                        cause: cause.to_string(),
                    },
                );
            }
        }
    }

    /// This node enters its next SPMD step (see `spmd`): compared with the
    /// ring predecessor's, and sent to the successor.
    pub fn enter_step(&self, step: hyfi_core::Step) -> Result<(), NetError> {
        if self.nodes < 2 {
            return Ok(());
        }
        let prev = (self.rank + self.nodes - 1) % self.nodes;
        let entered = {
            let mut s = self.inbox.state.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(f) = &s.failed {
                return Err(self.aborted(f.clone()));
            }
            match s.steps.as_mut() {
                Some(st) => st.enter(prev, step),
                None => return Ok(()),
            }
        };
        match entered {
            Ok(n) => self.send(
                (self.rank + 1) % self.nodes,
                &Msg::Step {
                    n,
                    step: step.to_words(),
                },
            ),
            Err(why) => {
                let why = format!("node {}: {why}", self.rank);
                self.fail_and_tell(why.clone());
                Err(self.aborted(why))
            }
        }
    }

    /// Fails this node with `why` (its waits return the error) and tells
    /// every peer; returns false if the node had failed already.
    fn fail_and_tell(&self, why: String) -> bool {
        if self.inbox.fail(why.clone()) {
            self.send_abort(&why);
            return true;
        }
        false
    }

    pub(crate) fn aborted(&self, cause: String) -> NetError {
        // Failure texts already name this node; do not name it twice.
        let prefix = format!("node {}: ", self.rank);
        let cause = cause
            .strip_prefix(&prefix)
            .map(str::to_string)
            .unwrap_or(cause);
        NetError::Aborted {
            me: self.rank,
            cause,
        }
    }
}

/// Called once, on the communication thread, when the node fails.
pub type FailureHook = Box<dyn Fn(&str) + Send + Sync>;

/// Why a wait for `peer` cannot end: it said `Bye` (its program ended)
/// and what this node waits for was not sent before it.
fn gone(me: usize, peer: usize) -> String {
    format!(
        "node {me} waits for node {peer} at a barrier or reduction, but node {peer} ended its \
         program: every node must make the same phases, shared allocations and \
         run_distributed calls (SPMD)"
    )
}

impl Comm {
    /// Starts the communication thread over an established mesh. A peer
    /// that sends nothing (not even a heartbeat) for `heartbeat` is lost.
    pub fn start(
        links: Links,
        on_failure: FailureHook,
        heartbeat: Duration,
    ) -> Result<Comm, NetError> {
        let (rank, nodes) = (links.rank, links.nodes);
        let inbox = Arc::new(Inbox::default());
        inbox.state.lock().unwrap_or_else(|e| e.into_inner()).steps = Some(Steps::new(rank));
        let stats = Arc::new(NetStats::default());
        let on_failure: Arc<FailureHook> = Arc::new(on_failure);
        let mut txs = Vec::with_capacity(nodes);
        for p in &links.peers {
            txs.push(match p {
                Some(sock) => Some(PeerTx {
                    st: Mutex::new(TxState {
                        sock: Some(
                            sock.try_clone()
                                .map_err(|e| NetError::io("cloning a link for writing", e))?,
                        ),
                        backlog: Default::default(),
                        head_off: 0,
                    }),
                }),
                None => None,
            });
        }
        let txs = Arc::new(txs);
        for s in links.peers.iter().flatten() {
            s.set_nonblocking(true)
                .map_err(|e| NetError::io("set_nonblocking", e))?;
        }
        for l in &links.listeners {
            l.set_nonblocking(true)
                .map_err(|e| NetError::io("set_nonblocking", e))?;
        }
        let flusher = Arc::new(Flusher {
            pending: Mutex::new(false),
            cv: Condvar::new(),
            stop: Default::default(),
        });
        let sender = Sender(Arc::new(SenderInner {
            rank,
            nodes,
            tx: txs.clone(),
            flusher: flusher.clone(),
            inbox,
            stats,
        }));
        let node = Node {
            sender: sender.clone(),
            hook: on_failure,
        };
        let flusher_thread = {
            let (f, t, node) = (flusher.clone(), txs.clone(), node.clone());
            std::thread::Builder::new()
                .name("hyfi-flush".into())
                .spawn(move || {
                    flusher_loop(f, t, |peer, e| {
                        node.fail(
                            NetError::LostNode {
                                me: rank,
                                lost: peer,
                                why: format!("writing to it failed: {e}"),
                            }
                            .to_string(),
                        )
                    })
                })
                .map_err(|e| NetError::io("spawning the flusher thread", e))?
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| NetError::io("starting the communication thread's runtime", e))?;
        let shutdown = Arc::new(tokio::sync::Notify::new());
        let stop = shutdown.clone();
        let thread = std::thread::Builder::new()
            .name("hyfi-comm".into())
            .spawn(move || {
                rt.block_on(async move {
                    tokio::select! {
                        _ = run(links, node, heartbeat) => {}
                        _ = stop.notified() => {}
                    }
                })
            })
            .map_err(|e| NetError::io("spawning the communication thread", e))?;
        Ok(Comm {
            sender,
            flusher_thread: Mutex::new(Some(flusher_thread)),
            thread: Mutex::new(Some(thread)),
            shutdown,
        })
    }

    /// The inbox (for waiting on replies).
    pub fn inbox(&self) -> &Inbox {
        &self.inbox
    }

    /// A sending handle that outlives nothing it should not (see [`Sender`]).
    pub fn sender(&self) -> Sender {
        self.sender.clone()
    }

    /// Installs the handler of service `id`'s frames (bulk frames tagged
    /// with [`service_tag`]`(id, ..)`): a layer above (the DSM, cross-node
    /// stealing) that answers requests on the communication thread. Frames
    /// that came before are handed over first, in order.
    pub fn set_service(&self, id: ServiceId, service: Arc<dyn Service>) -> Result<(), NetError> {
        let mut slots = self
            .inbox
            .services
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let slot = slots.entry(id).or_default();
        if let ServiceSlot::Ready(_) = slot {
            return Err(NetError::Protocol {
                me: self.rank,
                from: self.rank,
                why: format!("{id} was installed twice on this node"),
            });
        }
        let ServiceSlot::Pending(early) =
            std::mem::replace(slot, ServiceSlot::Ready(service.clone()))
        else {
            unreachable!("checked above")
        };
        for (from, payload) in early {
            if let Err(why) = service.frame(from, payload) {
                drop(slots);
                self.inbox.fail(why.clone());
                return Err(self.aborted(why));
            }
        }
        drop(slots);
        if let Some(f) = self.inbox.failure() {
            service.failed(&f);
        }
        Ok(())
    }

    /// Waits for the collective message `(from, seq, dir)`.
    pub fn recv_coll(&self, from: usize, seq: u64, dir: Dir) -> Result<Vec<u8>, NetError> {
        let me = self.rank;
        let _w = hyfi_core::waits::waiting(
            |a| {
                format!(
                    "collective message #{} ({}) from node {} (a barrier or reduction)",
                    a[0],
                    if a[1] == 0 {
                        "up the tree"
                    } else {
                        "down the tree"
                    },
                    a[2]
                )
            },
            [seq, (dir == Dir::Down) as u64, from as u64],
        );
        self.inbox
            .wait(|s| match s.coll.remove(&(from, seq, dir)) {
                Some(d) => Some(Ok(d)),
                None => s.gone.contains(&from).then(|| Err(gone(me, from))),
            })
            .map_err(|cause| self.aborted(cause))
    }

    /// Waits for the next bulk frame from `from`.
    pub fn recv_bulk(&self, from: usize) -> Result<(u64, Vec<u8>), NetError> {
        let me = self.rank;
        self.inbox
            .wait(
                |s| match s.bulk.get_mut(&from).and_then(|q| q.pop_front()) {
                    Some(d) => Some(Ok(d)),
                    None => s.gone.contains(&from).then(|| Err(gone(me, from))),
                },
            )
            .map_err(|cause| self.aborted(cause))
    }

    /// Tells every peer this node aborts, and fails the node.
    pub fn abort(&self, cause: &str) {
        if self
            .inbox
            .fail(format!("node {} aborted: {cause}", self.rank))
        {
            self.send_abort(cause);
        }
    }

    /// Tells every peer this node aborts, without failing this node's own
    /// waits: the caller is about to end the process with its own status,
    /// and from now on lost links are not reported to this node's program.
    pub fn abort_peers(&self, cause: &str) {
        self.inbox.exiting.store(true, Ordering::SeqCst);
        self.send_abort(cause);
    }

    /// Orderly end: says `Bye` to every peer (after everything queued),
    /// keeps answering their requests until each has said `Bye` too (at
    /// most `grace`), writes out what is backlogged, and stops the threads.
    /// `Bye` means "I will ask for nothing more": a peer still reading pages
    /// homed here after its program ended is served until it says so.
    ///
    /// With `grace` `None` it waits as long as the peers live: a peer that
    /// stops answering is lost at the heartbeat limit, and one that took a
    /// step this node did not is named when it sees the `Bye`.
    pub fn close(&self, grace: Option<Duration>) {
        let (steps, last) = {
            let s = self.inbox.state.lock().unwrap_or_else(|e| e.into_inner());
            s.steps.as_ref().map(Steps::last).unwrap_or((0, None))
        };
        let bye = Msg::Bye {
            steps,
            last: last.map(hyfi_core::Step::to_words).unwrap_or([0; 4]),
        };
        for p in 0..self.nodes {
            if p != self.rank {
                let _ = self.send(p, &bye);
            }
        }
        let start = Instant::now();
        let mut said = false;
        {
            let mut s = self.inbox.state.lock().unwrap_or_else(|e| e.into_inner());
            while s.byes < self.nodes - 1 && s.failed.is_none() {
                let waited = start.elapsed();
                if grace.is_some_and(|g| waited >= g) {
                    break;
                }
                if !said && waited >= CLOSE_NOTICE {
                    said = true;
                    let busy: Vec<String> = (0..self.nodes)
                        .filter(|p| *p != self.rank && !s.gone.contains(p))
                        .map(|p| p.to_string())
                        .collect();
                    eprintln!(
                        "hyfi: node {}: its program ended; it goes on serving node(s) {} \
                         (shared pages homed here) until their programs end too",
                        self.rank,
                        busy.join(", ")
                    );
                }
                s = self
                    .inbox
                    .cv
                    .wait_timeout(s, Duration::from_millis(500))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
        // Every peer is done asking: write out what is left, then close our
        // sending halves (the peers' readers see a clean end after our Bye).
        let flush_until = Instant::now() + Duration::from_secs(5);
        for tx in self.tx.iter().flatten() {
            loop {
                let mut st = tx.st.lock().unwrap_or_else(|e| e.into_inner());
                let empty = st.flush().unwrap_or(true);
                if empty || Instant::now() >= flush_until || self.inbox.failure().is_some() {
                    if let Some(sock) = st.sock.take() {
                        let _ = sock.shutdown(std::net::Shutdown::Write);
                    }
                    break;
                }
                drop(st);
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        self.flusher.stop.store(true, Ordering::SeqCst);
        self.flusher.kick();
        if let Some(h) = self
            .flusher_thread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            let _ = h.join();
        }
        // Whatever the peers did, the thread ends now: its remaining tasks
        // (readers of peers that never closed) are dropped with the runtime.
        self.shutdown.notify_one();
        if let Some(h) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = h.join();
        }
        // Services hold a Sender, which holds the inbox, which holds them:
        // break the cycle now that nothing is served any more.
        self.inbox
            .services
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

/// What the communication thread's tasks share: the node's sending side
/// (and through it the inbox) and its failure hook.
#[derive(Clone)]
struct Node {
    sender: Sender,
    hook: Arc<FailureHook>,
}

impl Node {
    /// The node fails with `why`: the first time, its program's waits
    /// return the error, the hook runs, and every peer is told.
    fn fail(&self, why: String) {
        if self.sender.fail_and_tell(why.clone()) {
            (self.hook)(&why);
        }
    }
}

/// Milliseconds since `t0`, for the last-heard stamps.
fn millis(t0: Instant) -> u64 {
    t0.elapsed().as_millis() as u64
}

async fn run(links: Links, node: Node, heartbeat: Duration) {
    let me = links.rank;
    let nodes = links.nodes;
    let (done_tx, mut done_rx) = unbounded_channel::<()>();
    let t0 = Instant::now();
    // When each peer was last heard from, and whether its link is still
    // read (a link that ended cleanly is not expected to talk).
    let heard: Arc<Vec<AtomicU64>> = Arc::new((0..nodes).map(|_| AtomicU64::new(0)).collect());
    let open: Arc<Vec<std::sync::atomic::AtomicBool>> = Arc::new(
        (0..nodes)
            .map(|p| std::sync::atomic::AtomicBool::new(p != me))
            .collect(),
    );
    let mut tasks = 0usize;
    for (peer, stream) in links.peers.into_iter().enumerate() {
        let Some(stream) = stream else { continue };
        let stream = match tokio::net::TcpStream::from_std(stream) {
            Ok(s) => s,
            Err(e) => {
                node.fail(format!("node {me}: link to node {peer} unusable: {e}"));
                continue;
            }
        };
        // Writes go through the std clone in PeerTx; the reader task gets
        // the whole stream (not a split half: dropping tokio's write half
        // would shut our sending side down).
        tasks += 1;
        let (d, n, h, o) = (done_tx.clone(), node.clone(), heard.clone(), open.clone());
        tokio::spawn(async move {
            if let Some(why) = read_frames(me, peer, stream, &n, &h[peer], t0).await {
                n.fail(why);
            }
            o[peer].store(false, Ordering::SeqCst);
            let _ = d.send(());
        });
    }
    for l in links.listeners {
        if let Ok(l) = tokio::net::TcpListener::from_std(l) {
            let st = node.sender.stats.clone();
            tokio::spawn(refuse_strays(me, l, st));
        }
    }
    tokio::spawn(heartbeats(me, node.clone(), heard, open, t0, heartbeat));
    drop(done_tx);
    for _ in 0..tasks {
        if done_rx.recv().await.is_none() {
            break;
        }
    }
}

/// Sends a heartbeat to every peer at a quarter of the limit, and fails
/// the node when a peer whose link is open has been silent past it.
async fn heartbeats(
    me: usize,
    node: Node,
    heard: Arc<Vec<AtomicU64>>,
    open: Arc<Vec<std::sync::atomic::AtomicBool>>,
    t0: Instant,
    limit: Duration,
) {
    let every = (limit / 4).max(Duration::from_millis(10));
    let frame = wire::control_frame(&Msg::Heartbeat);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_tick = millis(t0);
    loop {
        tick.tick().await;
        if node.sender.inbox.failure().is_some() {
            return;
        }
        let now = millis(t0);
        // If this thread itself did not run for a while (the process was
        // stopped, or starved), the peers' heartbeats wait unread in the
        // sockets: let the readers take them before judging anyone.
        let late = now.saturating_sub(last_tick) > 2 * every.as_millis() as u64;
        last_tick = now;
        for peer in 0..heard.len() {
            if !open[peer].load(Ordering::SeqCst) {
                continue;
            }
            // Not counted as traffic: it is the link's own upkeep.
            let _ = node.sender.push(peer, frame.clone(), true);
            let silent = now.saturating_sub(heard[peer].load(Ordering::Relaxed));
            if silent > limit.as_millis() as u64 && !late {
                node.fail(
                    NetError::LostNode {
                        me,
                        lost: peer,
                        why: format!(
                            "it stopped answering: nothing, not even a heartbeat, for {:.1} s \
                             (HYFI_HEARTBEAT={}): it is hung, stopped (SIGSTOP) or cut off \
                             from this node",
                            silent as f64 / 1000.0,
                            limit.as_secs_f64()
                        ),
                    }
                    .to_string(),
                );
                return;
            }
        }
    }
}

/// Reads one link's frames into the inbox until the link ends. Returns why
/// it ended as a failure, or `None` if the peer said `Bye` first.
async fn read_frames(
    me: usize,
    peer: usize,
    r: tokio::net::TcpStream,
    node: &Node,
    heard: &AtomicU64,
    t0: Instant,
) -> Option<String> {
    let (inbox, stats) = (&*node.sender.inbox, &*node.sender.stats);
    let lost = |why: String| {
        Some(
            NetError::LostNode {
                me,
                lost: peer,
                why,
            }
            .to_string(),
        )
    };
    let protocol = |why: String| {
        Some(
            NetError::Protocol {
                me,
                from: peer,
                why,
            }
            .to_string(),
        )
    };
    let spmd = |why: String| Some(format!("node {me}: {why}"));
    let step = |w: [u64; 4]| hyfi_core::Step::from_words(w);
    // Buffered: a frame's header and payload usually arrive in one read.
    let mut r = tokio::io::BufReader::with_capacity(64 * 1024, r);
    let mut said_bye = false;
    loop {
        heard.store(millis(t0), Ordering::Relaxed);
        let mut h = [0u8; HEADER_LEN];
        if let Err(e) = r.read_exact(&mut h).await {
            if said_bye {
                return None;
            }
            return lost(if e.kind() == std::io::ErrorKind::UnexpectedEof {
                "its connection closed".to_string()
            } else {
                e.to_string()
            });
        }
        let h = match Header::decode(&h) {
            Ok(h) => h,
            Err(why) => return protocol(why),
        };
        let mut payload = vec![0u8; h.len as usize];
        if let Err(e) = r.read_exact(&mut payload).await {
            return lost(format!("in the middle of a frame: {e}"));
        }
        let bytes = (HEADER_LEN + payload.len()) as u64;
        match h.kind {
            Kind::Bulk => {
                let class = if h.tag & SERVICE_TAG != 0 {
                    split_service_tag(h.tag).1
                } else {
                    Class::Bulk
                };
                stats.count_received(class, bytes);
                if h.tag & SERVICE_TAG != 0 {
                    if let Err(why) = inbox.to_service(peer, h.tag, payload) {
                        return protocol(why);
                    }
                } else {
                    inbox.put_bulk(peer, h.tag, payload);
                }
            }
            Kind::Control => {
                let msg = wire::decode_msg(&payload);
                if !matches!(msg, Ok(Msg::Heartbeat)) {
                    stats.control_received.fetch_add(1, Ordering::Relaxed);
                    stats
                        .control_bytes_received
                        .fetch_add(bytes, Ordering::Relaxed);
                }
                match msg {
                    Ok(Msg::Up { seq, data }) => inbox.put_coll(peer, seq, Dir::Up, data),
                    Ok(Msg::Down { seq, data }) => inbox.put_coll(peer, seq, Dir::Down, data),
                    Ok(Msg::Heartbeat) => {}
                    Ok(Msg::Step { n, step: w }) => {
                        let Some(theirs) = step(w) else {
                            return protocol(format!("a step {w:?} that is none"));
                        };
                        let r = {
                            let mut s = inbox.state.lock().unwrap_or_else(|e| e.into_inner());
                            match s.steps.as_mut() {
                                Some(st) => st.on_step(peer, n, theirs),
                                None => Ok(()),
                            }
                        };
                        if let Err(why) = r {
                            return spmd(why);
                        }
                    }
                    // The peer is going away; whatever follows changes nothing.
                    Ok(Msg::Abort { cause }) => {
                        return Some(format!("node {peer} aborted the job: {cause}"))
                    }
                    Ok(Msg::Bye { steps, last }) => {
                        said_bye = true;
                        let last = if last == [0; 4] { None } else { step(last) };
                        if let Err(why) = inbox.bye(peer, steps, last) {
                            return spmd(why);
                        }
                    }
                    Ok(other) => return protocol(format!("unexpected {other:?}")),
                    Err(why) => return protocol(why),
                }
            }
        }
    }
}

/// After setup, any connection to our listeners is a stray (a port scan,
/// a node of another job, garbage): read what it says, log it (rate-limited:
/// a flood costs a few lines and a count), drop it.
async fn refuse_strays(me: usize, l: tokio::net::TcpListener, stats: Arc<NetStats>) {
    let log = Arc::new(crate::refusal::RefusalLog::new(me));
    let wait = crate::mesh::HANDSHAKE_WAIT;
    loop {
        let (mut s, from) = match l.accept().await {
            Ok(c) => c,
            // Out of descriptors under a flood, say: refusing must go on.
            Err(e) => {
                if let Some(after) = log.refuse("(accept)", e) {
                    let log = log.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(after).await;
                        log.tick();
                    });
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        stats.refused.fetch_add(1, Ordering::Relaxed);
        let log = log.clone();
        tokio::spawn(async move {
            let mut b = [0u8; HANDSHAKE_LEN];
            let why = match tokio::time::timeout(wait, s.read_exact(&mut b)).await {
                Ok(Ok(_)) => match wire::Handshake::decode(&b) {
                    Ok(h) => format!(
                        "a handshake from rank {} of job {} after setup ended",
                        h.rank, h.job
                    ),
                    Err(why) => why,
                },
                Ok(Err(e)) => format!("no handshake: {e}"),
                Err(_) => format!("no handshake within {} s", wait.as_secs()),
            };
            drop(s);
            // The held-back lines are summed up even if no stray follows.
            if let Some(after) = log.refuse(from, why) {
                tokio::time::sleep(after).await;
                log.tick();
            }
        });
    }
}

/// The TCP transport's side of the node seam: services send through it.
impl hyfi_core::link::Port for Sender {
    fn send_with(
        &self,
        to: usize,
        service: ServiceId,
        class: Class,
        len_hint: usize,
        fill: &mut dyn FnMut(&mut Vec<u8>),
    ) -> Result<usize, hyfi_core::LinkError> {
        self.send_service(to, service, class, len_hint, fill)
            .map_err(|e| Box::new(e) as hyfi_core::LinkError)
    }
}
