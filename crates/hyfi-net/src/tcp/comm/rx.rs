//! The communication thread's event loop: one `poll(2)` over every link (an
//! incremental frame decoder each), the links' backlogs (written when their
//! sockets drain), the listeners (strays accepted and refused), and the
//! [`Waker`]; heartbeats and deadlines are its timeout. See `README.md`.

use std::io::{ErrorKind, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use hyfi_core::link::{Attending, Class};

use crate::tcp::mesh::Links;
use crate::tcp::refusal::RefusalLog;
use crate::tcp::wire::{self, Header, Kind, Msg, HANDSHAKE_LEN, HEADER_LEN};

use super::inbox::Dir;
use super::service::{split_service_tag, SERVICE_TAG};
use super::tx::{Sender, Waker};
use super::FailureHook;
use crate::cause::{Cause, CauseKind};
use crate::since_start;
use crate::tcp::lane::{Ring, Sleeper};

/// What the communication thread shares with the failure path: the node's
/// sending side (and through it the inbox) and its failure hook.
#[derive(Clone)]
pub(super) struct Node {
    pub(super) sender: Sender,
    pub(super) hook: Arc<FailureHook>,
}

impl Node {
    /// The node fails with `cause`: the first time, the hook runs, then
    /// its program's waits return the error and every peer is told.
    pub(super) fn fail(&self, cause: Cause) {
        self.sender.fail_and_tell(cause, |c| (self.hook)(c));
    }
}

/// A link's read buffer: a frame's header and payload usually arrive in one
/// read.
const READ_BUF: usize = 64 * 1024;
/// Reads of one link per turn of the loop, so that a flooding peer does not
/// starve the others (`poll` is level-triggered: the rest is read next turn).
const READS_PER_TURN: usize = 16;
/// How long the listeners rest after `accept` failed (out of descriptors
/// under a flood, say).
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// How long a step message may be held back before the loop sends it
/// (see `Sender::hold_step`): longer than a phase's computation usually
/// takes, short beside a heartbeat.
const STEPS_HELD_FOR: Duration = Duration::from_millis(2);

/// Node `peer`'s link ended without a `Bye`: it died, or was cut off.
fn lost(peer: usize, why: &str) -> Cause {
    Cause::new(
        peer,
        CauseKind::Lost,
        format!("lost ({why}): it died or was cut off; its own output, or its launcher, says how"),
    )
}

/// How a link's reading ended.
enum Ended {
    /// End of stream after the peer's `Bye`.
    Cleanly,
    /// The node fails with this cause.
    Failed(Cause),
}

/// A frame whose payload is still arriving.
struct Partial {
    header: Header,
    payload: Vec<u8>,
    filled: usize,
}

/// The receiving side of one link.
struct Link {
    me: usize,
    peer: usize,
    /// The loop's handle of the socket (the senders write through a clone
    /// of it, see [`super::tx::PeerTx`]).
    sock: TcpStream,
    /// Bytes read and not yet decoded are `buf[lo..hi]`: between reads,
    /// less than a header.
    buf: Box<[u8]>,
    lo: usize,
    hi: usize,
    frame: Option<Partial>,
    said_bye: bool,
    /// When bytes last came.
    heard: Instant,
    /// The link's shared-memory lane, if its peer is on this host: frames
    /// come through its ring, and the socket carries only bells and says
    /// when the peer is gone (see [`crate::tcp::lane`]).
    lane: Option<Arc<Ring>>,
}

impl Link {
    /// Reads the link ([`Link::on_socket`], or [`Link::on_lane`] with its
    /// socket's bells and end looked at if `socket`: processors read only
    /// a lane's ring, with no syscall): `Ok(true)` while its reading goes
    /// on, `Ok(false)` once it ended cleanly (the peer said `Bye`), `Err`
    /// with the cause once it ended otherwise (the caller fails the node).
    fn read(&mut self, node: &Node, now: Instant, socket: bool) -> Result<bool, Cause> {
        let r = if self.lane.is_some() {
            self.on_lane(node, now, socket)
        } else {
            self.on_socket(node, now)
        };
        match r {
            Ok(()) => Ok(true),
            Err(Ended::Cleanly) => Ok(false),
            Err(Ended::Failed(why)) => Err(why),
        }
    }

    fn lost(&self, why: String) -> Ended {
        Ended::Failed(lost(self.peer, &why))
    }

    /// Garbage from the peer: its failure (a node of this job sends none).
    fn protocol(&self, why: String) -> Ended {
        Ended::Failed(Cause::new(
            self.peer,
            CauseKind::Program,
            format!("sent a bad message to node {}: {why}", self.me),
        ))
    }

    /// A lane's link: the ring read (up to [`READS_PER_TURN`] reads) and
    /// every frame completed delivered; with `socket`, its bells drained
    /// first, and if the socket ended, the ring read to its end before the
    /// link's end is judged (a peer's last frames, its `Bye`, are in the
    /// ring when its socket closes). `Err` when the link ends.
    fn on_lane(&mut self, node: &Node, now: Instant, socket: bool) -> Result<(), Ended> {
        let Some(lane) = self.lane.clone() else {
            return Ok(());
        };
        let closed = if socket {
            lane.drain_bells(&self.sock).err()
        } else {
            None
        };
        let mut reads = 0;
        loop {
            let read = match self.frame.as_mut() {
                // A payload's rest goes straight into it.
                Some(f) if self.lo == self.hi => {
                    let n = lane.read(&mut f.payload[f.filled..], &self.sock);
                    n.inspect(|n| f.filled += n)
                }
                _ => {
                    let n = lane.read(&mut self.buf[self.hi..], &self.sock);
                    n.inspect(|n| self.hi += n)
                }
            };
            match read {
                Err(broken) => return Err(self.protocol(broken.to_string())),
                Ok(0) => break,
                Ok(_) => {
                    self.heard = now;
                    self.decode(node)?;
                }
            }
            reads += 1;
            // A peer that is gone wrote all it will: read it all.
            if reads >= READS_PER_TURN && closed.is_none() {
                break;
            }
        }
        match closed {
            None => Ok(()),
            Some(_) if self.frame.is_some() => {
                Err(self.lost("in the middle of a frame: early eof".to_string()))
            }
            Some(_) if self.said_bye => Err(Ended::Cleanly),
            Some(e) if e.kind() == ErrorKind::UnexpectedEof => {
                Err(self.lost("its connection closed".to_string()))
            }
            Some(e) => Err(self.lost(e.to_string())),
        }
    }

    /// Reads what the socket has (up to [`READS_PER_TURN`] reads) and
    /// decodes and delivers every frame completed. `Err` when the link ends.
    fn on_socket(&mut self, node: &Node, now: Instant) -> Result<(), Ended> {
        for _ in 0..READS_PER_TURN {
            let (sock, buf) = (&self.sock, &mut self.buf);
            let (read, asked) = match self.frame.as_mut() {
                // A payload's rest goes straight into it.
                Some(f) if self.lo == self.hi => {
                    let asked = f.payload.len() - f.filled;
                    let read = (&*sock).read(&mut f.payload[f.filled..]);
                    (read.inspect(|n| f.filled += n), asked)
                }
                _ => {
                    let asked = buf.len() - self.hi;
                    let read = (&*sock).read(&mut buf[self.hi..]);
                    (read.inspect(|n| self.hi += n), asked)
                }
            };
            match read {
                Ok(0) => {
                    return Err(if self.frame.is_some() {
                        self.lost("in the middle of a frame: early eof".to_string())
                    } else if self.said_bye {
                        Ended::Cleanly
                    } else {
                        self.lost("its connection closed".to_string())
                    });
                }
                Ok(n) => {
                    self.heard = now;
                    self.decode(node)?;
                    // A short read took all there was: no second read to
                    // hear `EAGAIN` (one syscall per message saved; the
                    // level-triggered `poll` says when more comes).
                    if n < asked {
                        return Ok(());
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) if self.frame.is_some() => {
                    return Err(self.lost(format!("in the middle of a frame: {e}")))
                }
                Err(_) if self.said_bye => return Err(Ended::Cleanly),
                Err(e) => return Err(self.lost(e.to_string())),
            }
        }
        Ok(())
    }

    /// Delivers every complete frame in the buffer: header, then payload,
    /// across as many reads as they take.
    fn decode(&mut self, node: &Node) -> Result<(), Ended> {
        loop {
            if let Some(f) = self.frame.as_mut() {
                let take = (f.payload.len() - f.filled).min(self.hi - self.lo);
                f.payload[f.filled..f.filled + take]
                    .copy_from_slice(&self.buf[self.lo..self.lo + take]);
                f.filled += take;
                self.lo += take;
                if f.filled < f.payload.len() {
                    break;
                }
                let Some(f) = self.frame.take() else { break };
                self.deliver(node, f.header, f.payload)?;
                continue;
            }
            if self.hi - self.lo < HEADER_LEN {
                break;
            }
            let raw: &[u8; HEADER_LEN] = self.buf[self.lo..self.lo + HEADER_LEN]
                .try_into()
                .expect("HEADER_LEN bytes");
            let header = Header::decode(raw).map_err(|why| self.protocol(why.to_string()))?;
            self.lo += HEADER_LEN;
            let len = header.len as usize;
            if self.hi - self.lo >= len {
                let payload = self.buf[self.lo..self.lo + len].to_vec();
                self.lo += len;
                self.deliver(node, header, payload)?;
            } else {
                self.frame = Some(Partial {
                    header,
                    // A large frame's buffer is one used before, its pages
                    // mapped (whoever handles the frame gives it back).
                    payload: hyfi_core::link::buffers::filled(len),
                    filled: 0,
                });
            }
        }
        // Less than a header is left: to the front, for the next read.
        self.buf.copy_within(self.lo..self.hi, 0);
        self.hi -= self.lo;
        self.lo = 0;
        Ok(())
    }

    /// Files one frame in the inbox, hands it to its service, or acts on
    /// the control message.
    fn deliver(&mut self, node: &Node, h: Header, payload: Vec<u8>) -> Result<(), Ended> {
        let (me, peer) = (self.me, self.peer);
        let (inbox, stats) = (&*node.sender.inbox, &*node.sender.stats);
        let spmd = |origin: usize, why: &dyn std::fmt::Display| {
            Ended::Failed(Cause::new(origin, CauseKind::Program, why.to_string()))
        };
        let step = |w: [u64; 4]| hyfi_core::Step::from_words(w);
        let bytes = (HEADER_LEN + payload.len()) as u64;
        match h.kind {
            Kind::Bulk => {
                let class = if h.tag & SERVICE_TAG != 0 {
                    split_service_tag(h.tag).1
                } else {
                    Class::Bulk
                };
                stats.count_received(class, bytes);
                hyfi_core::trace::instant(
                    hyfi_core::trace::Kind::Recv,
                    [peer as u64, u64::from(class == Class::Bulk), bytes, 0],
                );
                if h.tag & SERVICE_TAG != 0 {
                    if let Err(why) =
                        inbox
                            .services
                            .deliver(peer, split_service_tag(h.tag).0, payload)
                    {
                        return Err(self.protocol(why.to_string()));
                    }
                } else {
                    inbox.put_bulk(peer, h.tag, payload);
                }
            }
            Kind::Control => {
                let msg = wire::decode_msg(&payload);
                if !matches!(msg, Ok(Msg::Heartbeat)) {
                    hyfi_core::trace::instant(
                        hyfi_core::trace::Kind::Recv,
                        [peer as u64, 0, bytes, 0],
                    );
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
                            return Err(self.protocol(format!("a step {w:?} that is none")));
                        };
                        let r = {
                            let mut s = inbox.state.lock().unwrap_or_else(|e| e.into_inner());
                            match s.steps.as_mut() {
                                Some(st) => st.on_step(peer, n, theirs),
                                None => Ok(()),
                            }
                        };
                        if let Err(why) = r {
                            return Err(spmd(me, &why));
                        }
                    }
                    // The peer is going away; whatever follows changes nothing.
                    Ok(Msg::Abort {
                        origin,
                        kind,
                        cause,
                    }) => {
                        // The origin's cause, as the origin said it; a node
                        // of another size naming no node of this job is the
                        // sender's.
                        let origin = usize::try_from(origin)
                            .ok()
                            .filter(|&o| o < node.sender.nodes)
                            .unwrap_or(peer);
                        return Err(Ended::Failed(Cause {
                            origin,
                            kind: CauseKind::from_wire(kind),
                            text: cause,
                        }));
                    }
                    Ok(Msg::Bye { steps, last }) => {
                        self.said_bye = true;
                        let last = if last == [0; 4] { None } else { step(last) };
                        // The node that ended its program early diverged.
                        if let Err(why) = inbox.bye(peer, steps, last) {
                            return Err(spmd(peer, &why));
                        }
                    }
                    Ok(other) => return Err(self.protocol(format!("unexpected {other:?}"))),
                    Err(why) => return Err(self.protocol(why.to_string())),
                }
            }
        }
        Ok(())
    }
}

/// The links' receiving sides, read by the communication thread when
/// `poll` says a link is readable and by the node's idle processors while
/// they wait ([`idle_progress`]), whichever holds the lock.
///
/// Why idle processors read. On a host shared by several nodes each node
/// owns its CPUs (`hyfi_core::sleep::cpus_exclusive`), so its communication thread
/// shares a CPU with the server thread that waits for the message. A frame
/// that the communication thread reads reaches the waiter only after that
/// thread was woken out of `poll` and scheduled, and the waiter yielded to
/// it: a loopback round trip so costs 17–22 µs on the 2-vCPU VM, against
/// 6.6–7.2 µs when the waiting thread reads the socket itself, with a
/// communication thread still in `poll` beside it (a two-process model,
/// BENCHMARKS.md). A release or a page's reply is one such trip.
///
/// Two measured details of that model shape the pass: the waiter reads each
/// link directly (a non-blocking `read` that says `EAGAIN` costs ~0.24 µs)
/// rather than asking `poll` first, which took the round trip from 7 to
/// 14-16 µs; and the communication thread, woken by the same bytes, leaves
/// them to a processor that passed in the last [`POLLED_RECENTLY`] (it
/// yields and looks again), as its taking the lock first cost as much.
pub(super) struct Rx {
    node: Node,
    reader: Mutex<Reader>,
    /// Per link (as `Reader::links`): its socket and peer, for the loop's
    /// `poll` set without the lock.
    fds: Vec<(std::os::fd::RawFd, usize)>,
    /// Per link: still read (a link whose reading ended is not expected to
    /// talk). Cleared under the reader's lock, read without it.
    reading: Vec<AtomicBool>,
    /// When a processor last passed (`crate::since_start`, ns).
    passed: AtomicU64,
    /// Per link (as `Reader::links`): its lane's ring and a second handle
    /// of its socket, if it has a lane, for the loop to look at the ring
    /// and drain the bells without the lock.
    probes: Vec<Option<(Arc<Ring>, TcpStream)>>,
    /// The loop's `asleep` flag in this node's lane region.
    sleeper: Sleeper,
}

/// What the reading thread of the moment holds.
struct Reader {
    links: Vec<Link>,
}

/// A processor that passed this recently is taken to be polling still: the
/// communication thread leaves a readable link to it (a polling processor
/// passes every microsecond or two). Longer windows were measured (five
/// alternated runs each, 2×1 over TCP): 50 µs took LU 1024 from 0.0665 to
/// 0.060 s but diffusion per row at 1026² from 0.036 to 0.051 s, 20 µs gave
/// 0.062 and 0.043 s; a hint from the core when a wait ends
/// (`idle_done`, tried) did not bring the diffusion back.
const POLLED_RECENTLY: Duration = Duration::from_micros(5);

/// Every communication thread's [`Rx`] in this process (one but in tests,
/// which start several nodes in one process).
static READERS: RwLock<Vec<Arc<Rx>>> = RwLock::new(Vec::new());

impl Rx {
    fn lock(&self) -> std::sync::MutexGuard<'_, Reader> {
        self.reader.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The reader, unless another thread holds it (a panic that poisoned
    /// it left the links as consistent as a failed read does).
    fn try_lock(&self) -> Option<std::sync::MutexGuard<'_, Reader>> {
        match self.reader.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Reads link `i` (the reader held; see [`Link::read`] for `socket`),
    /// and records it if its reading ended.
    fn read(&self, reader: &mut Reader, i: usize, now: Instant, socket: bool) {
        if !self.reading[i].load(Ordering::Relaxed) {
            return;
        }
        match reader.links[i].read(&self.node, now, socket) {
            Ok(true) => {}
            Ok(false) => self.reading[i].store(false, Ordering::Relaxed),
            Err(why) => {
                self.reading[i].store(false, Ordering::Relaxed);
                // What the other peers sent before this one was lost is
                // delivered first: a waiter whose message is already here
                // (the last piece of a barrier its lost peer had left)
                // completes, and meets the loss after. Without this, the
                // loss could be judged while that piece still sat in
                // another lane's ring, read only after the events.
                let mut more = Vec::new();
                for j in (0..reader.links.len()).filter(|&j| j != i) {
                    if !self.reading[j].load(Ordering::Relaxed) {
                        continue;
                    }
                    // A lane's ring alone (its socket is looked at when
                    // it says something); a plain link's socket.
                    if let Err(also) = reader.links[j].read(&self.node, now, false) {
                        self.reading[j].store(false, Ordering::Relaxed);
                        more.push(also);
                    }
                }
                // The first cause stands: this link's, seen first.
                self.node.fail(why);
                for also in more {
                    self.node.fail(also);
                }
            }
        }
    }

    /// Whether a lane's ring has bytes for this node.
    fn lanes_pending(&self) -> bool {
        self.probes.iter().flatten().any(|(ring, _)| ring.pending())
    }

    /// Whether a processor passed within [`POLLED_RECENTLY`].
    fn polled_recently(&self) -> bool {
        since_start().saturating_sub(self.passed.load(Ordering::Relaxed))
            < POLLED_RECENTLY.as_nanos() as u64
    }

    /// Makes `rx` readable by idle processors, and this transport's idle
    /// progress function the process's.
    fn register(rx: &Arc<Rx>) {
        READERS
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(rx.clone());
        // Several transports in one process (tests) each have their own
        // function; the core polls them all.
        hyfi_core::link::set_idle_progress(idle_progress);
        hyfi_core::link::set_attending(attend_begin, attend_end);
    }

    /// The communication thread has ended: no idle processor reads `rx`
    /// any more (its links close with it).
    fn unregister(rx: &Arc<Rx>) {
        READERS
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|r| !Arc::ptr_eq(r, rx));
    }

    /// One read of every link still read, if no other thread is reading:
    /// each frame delivered as the communication thread delivers it
    /// (services' handlers run on the calling thread). True if the links
    /// were read.
    fn pass(&self) -> bool {
        self.passed.store(since_start(), Ordering::Relaxed);
        let Some(mut reader) = self.try_lock() else {
            return false;
        };
        let now = Instant::now();
        for i in 0..reader.links.len() {
            self.read(&mut reader, i, now, false);
        }
        true
    }
}

/// This transport's idle progress (see `hyfi_core::link::set_idle_progress`):
/// the step messages held back go out, and on a node that owns its CPUs a
/// waiting processor reads the links itself
/// ([`Rx`]). Elsewhere the communication thread has a CPU to read on, and
/// an idle processor's `poll` per spin would only cost it.
pub(super) fn idle_progress() -> bool {
    let Ok(readers) = READERS.try_read() else {
        return false;
    };
    // Every node that waits sends the steps it held back first (see
    // `Sender::hold_step`).
    for rx in readers.iter() {
        rx.node.sender.flush_steps();
    }
    if !hyfi_core::sleep::cpus_exclusive() {
        return false;
    }
    readers.iter().fold(false, |moved, rx| rx.pass() | moved)
}

thread_local! {
    /// The readers whose lanes this thread said it attends to, by
    /// [`Attending`] kind (`attend_begin`), so that `attend_end` takes back
    /// exactly what it gave.
    static ATTENDED: [std::cell::RefCell<Vec<Arc<Rx>>>; 2] =
        const { [std::cell::RefCell::new(Vec::new()), std::cell::RefCell::new(Vec::new())] };
}

/// A thread starts attending (see `hyfi_core::link::set_attending`): an idle
/// processor's passes read the lanes' rings on a node that owns its CPUs,
/// so their producers need not ring the communication thread meanwhile;
/// the master that computes reads them when it stops, so frames for the
/// phase's end need no bell meanwhile (on any node: a bell wakes the
/// communication thread onto a CPU the computation uses).
fn attend_begin(kind: Attending) {
    if kind == Attending::Polling && !hyfi_core::sleep::cpus_exclusive() {
        return;
    }
    let readers = READERS.read().unwrap_or_else(|e| e.into_inner());
    ATTENDED.with(|a| {
        let mut a = a[kind as usize].borrow_mut();
        for rx in readers
            .iter()
            .filter(|rx| rx.probes.iter().any(Option::is_some))
        {
            rx.sleeper.attend(kind, true);
            a.push(rx.clone());
        }
    });
}

/// The thread stops attending: what came while producers counted on it is
/// read now, or, if another thread holds the reader, the communication
/// thread is woken to read it.
fn attend_end(kind: Attending) {
    let attended = ATTENDED.with(|a| std::mem::take(&mut *a[kind as usize].borrow_mut()));
    for rx in attended {
        rx.sleeper.attend(kind, false);
        if rx.lanes_pending() && !rx.pass() {
            rx.node.sender.waker.wake();
        }
    }
}

/// A connection accepted after setup: a stray (a port scan, a node of
/// another job, garbage). What it says is read, for the refusal's line,
/// until it has said a handshake's worth or its deadline passes.
struct Stray {
    sock: TcpStream,
    from: SocketAddr,
    said: [u8; HANDSHAKE_LEN],
    got: usize,
    deadline: Instant,
    /// Why it is refused, once known.
    why: Option<String>,
}

impl Stray {
    fn on_readable(&mut self) {
        while self.why.is_none() {
            match (&self.sock).read(&mut self.said[self.got..]) {
                Ok(0) => self.why = Some("no handshake: early eof".to_string()),
                Ok(n) => {
                    self.got += n;
                    if self.got == HANDSHAKE_LEN {
                        self.why = Some(match wire::Handshake::decode(&self.said) {
                            Ok(h) => format!(
                                "a handshake from rank {} of job {} after setup ended",
                                h.rank, h.job
                            ),
                            Err(why) => why.to_string(),
                        });
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) => self.why = Some(format!("no handshake: {e}")),
            }
        }
    }
}

/// What an entry of the poll set stands for.
#[derive(Clone, Copy)]
enum Slot {
    Wake,
    Link(usize),
    Listener(usize),
    Stray(usize),
}

/// The event loop's state.
struct Loop {
    me: usize,
    node: Node,
    waker: Arc<Waker>,
    /// The links' receiving sides, which idle processors read too.
    rx: Arc<Rx>,
    /// A readable link was left to a processor this turn.
    deferred: bool,
    listeners: Vec<TcpListener>,
    /// The listeners rest until then after `accept` failed.
    listen_after: Option<Instant>,
    strays: Vec<Stray>,
    log: RefusalLog,
    /// When the refusal log's held-back lines are to be summed up.
    tick_at: Option<Instant>,
    limit: Duration,
    /// How often a heartbeat goes to every peer: a quarter of the limit.
    every: Duration,
    /// How often silent peers are judged: a fiftieth of the limit, so a
    /// peer is lost within 2% of `HYFI_HEARTBEAT` (judging only when a beat
    /// is sent would add up to a quarter).
    judge_every: Duration,
    /// The next turn of heartbeat duty (`None` once the node failed).
    next_beat: Option<Instant>,
    /// When the next heartbeat is sent.
    next_send: Instant,
    last_beat: Instant,
}

/// The communication thread: runs the event loop until [`Waker::stop`].
pub(super) fn run(mut links: Links, node: Node, limit: Duration, waker: Arc<Waker>) {
    let me = links.rank;
    let now = Instant::now();
    let every = (limit / 4).max(Duration::from_millis(10));
    let judge_every = (limit / 50).max(Duration::from_millis(2));
    let listeners = links.listeners;
    let sleeper = links.lanes.sleeper();
    let mut lanes = std::mem::take(&mut links.lanes.rx);
    let links: Vec<Link> = links
        .peers
        .into_iter()
        .enumerate()
        .filter_map(|(peer, s)| {
            Some(Link {
                lane: lanes[peer].take(),
                me,
                peer,
                sock: s?,
                buf: vec![0; READ_BUF].into_boxed_slice(),
                lo: 0,
                hi: 0,
                frame: None,
                said_bye: false,
                heard: now,
            })
        })
        .collect();
    let rx = Arc::new(Rx {
        node: node.clone(),
        fds: links.iter().map(|l| (l.sock.as_raw_fd(), l.peer)).collect(),
        reading: links.iter().map(|_| AtomicBool::new(true)).collect(),
        passed: AtomicU64::new(0),
        probes: links
            .iter()
            // A lane whose socket cannot be cloned (no descriptor left) is
            // still read, by the processors and on its bells.
            .map(|l| Some((l.lane.clone()?, l.sock.try_clone().ok()?)))
            .collect(),
        sleeper,
        reader: Mutex::new(Reader { links }),
    });
    let mut l = Loop {
        me,
        rx: rx.clone(),
        deferred: false,
        listeners,
        listen_after: None,
        strays: Vec::new(),
        log: RefusalLog::new(me),
        tick_at: None,
        node,
        waker,
        limit,
        every,
        judge_every,
        next_beat: Some(now),
        // Each peer heard from this node at setup (`heard`), so the first
        // heartbeat is due a quarter of the limit later, not now: one then
        // rang every peer's sleeping reader as the job started.
        next_send: now + every,
        last_beat: now,
    };
    Rx::register(&rx);
    l.run();
    Rx::unregister(&rx);
}

/// Milliseconds from `now` until `t`, rounded up (`poll`'s timeout).
fn millis_until(t: Instant, now: Instant) -> i32 {
    let us = t.saturating_duration_since(now).as_micros();
    us.div_ceil(1000).min(i32::MAX as u128) as i32
}

impl Loop {
    fn run(&mut self) {
        let mut fds: Vec<libc::pollfd> = Vec::new();
        let mut slots: Vec<Slot> = Vec::new();
        while !self.waker.stop.load(Ordering::SeqCst) {
            if std::mem::take(&mut self.deferred) {
                // Bytes left to a polling processor would make `poll` return
                // at once: give it the CPU to read them.
                std::thread::yield_now();
            }
            // Steps held back for a while go out when this loop turns (a
            // heartbeat's judging period at the latest): a node that
            // neither sends nor waits still tells its successor.
            self.node.sender.flush_steps_older_than(STEPS_HELD_FOR);
            let now = Instant::now();
            fds.clear();
            slots.clear();
            let mut add = |fd, events, slot| {
                fds.push(libc::pollfd {
                    fd,
                    events,
                    revents: 0,
                });
                slots.push(slot);
            };
            add(self.waker.rx.as_raw_fd(), libc::POLLIN, Slot::Wake);
            for (i, &(fd, peer)) in self.rx.fds.iter().enumerate() {
                let mut events = if self.rx.reading[i].load(Ordering::Relaxed) {
                    libc::POLLIN
                } else {
                    0
                };
                if self.node.sender.tx[peer]
                    .as_ref()
                    .is_some_and(|tx| tx.out.load(Ordering::SeqCst))
                {
                    if self.rx.probes[i].is_some() {
                        // A lane's backlog: written as far as the ring has
                        // room; the reader rings when it frees more.
                        self.flush(peer);
                    } else {
                        events |= libc::POLLOUT;
                    }
                }
                // (Never an entry without events: a hung-up socket would
                // report POLLHUP at every turn.)
                if events != 0 {
                    add(fd, events, Slot::Link(i));
                }
            }
            if self.listen_after.is_some_and(|t| now >= t) {
                self.listen_after = None;
            }
            if self.listen_after.is_none() {
                for (i, l) in self.listeners.iter().enumerate() {
                    add(l.as_raw_fd(), libc::POLLIN, Slot::Listener(i));
                }
            }
            for (i, s) in self.strays.iter().enumerate() {
                add(s.sock.as_raw_fd(), libc::POLLIN, Slot::Stray(i));
            }
            let mut timeout = [self.next_beat, self.tick_at, self.listen_after]
                .into_iter()
                .flatten()
                .chain(self.strays.iter().map(|s| s.deadline))
                .min()
                .map_or(-1, |t| millis_until(t, now));
            // Lanes: say this thread sleeps, then look at the rings (a
            // producer publishes, then looks at the flag: one of the two
            // sees the other; see `crate::tcp::lane`).
            self.rx.sleeper.set(true);
            if self.rx.lanes_pending() {
                timeout = 0;
            }
            let slept = timeout != 0;
            // SAFETY: `fds` is a valid, initialised array of `fds.len()`
            // pollfds, and `poll` writes only their `revents`. Every fd in
            // it is owned by `self` (the waker, links, listeners, strays),
            // none of which is dropped before `poll` returns.
            let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
            self.rx.sleeper.set(false);
            if r < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != ErrorKind::Interrupted {
                    tracing::warn!("hyfi-net communication thread: poll failed: {e}");
                    std::thread::sleep(Duration::from_millis(1));
                }
                continue;
            }
            let now = Instant::now();
            for (fd, slot) in fds.iter().zip(&slots) {
                if fd.revents != 0 {
                    self.on_event(*slot, fd.revents, now);
                }
            }
            // Woken by its timer alone: a ring with bytes then had no bell,
            // and nobody of this node attends to it (a thread asleep in the
            // inbox attends to nothing, whatever its bracket says), a
            // wake-up lost.
            let timer = slept
                && r == 0
                && (!self.rx.sleeper.attended()
                    || self.node.sender.inbox.sleeping.load(Ordering::SeqCst) > 0);
            self.read_lanes(now, timer);
            self.on_time(now);
        }
        // The node is closing: the lines held back in the current window
        // are summed up now, not lost with the loop (a flood that ends the
        // job's last second would otherwise leave no summary).
        self.log.flush();
    }

    /// Reads the lanes whose rings have bytes (their sockets may have said
    /// nothing: a producer rings only while this thread sleeps), unless a
    /// processor is polling them (see `Rx`).
    /// `timer`: the loop's sleep ended by its timeout with nobody of the
    /// node attending to the rings, so that bytes found now came with no
    /// wake-up ([`hyfi_core::link::Traffic::unannounced`], counted once a
    /// turn).
    fn read_lanes(&mut self, now: Instant, timer: bool) {
        let mut unannounced = timer;
        for i in 0..self.rx.probes.len() {
            let Some((ring, _)) = &self.rx.probes[i] else {
                continue;
            };
            if !ring.pending() || !self.rx.reading[i].load(Ordering::Relaxed) {
                continue;
            }
            if self.rx.polled_recently() {
                self.deferred = true;
            } else {
                // A rung ring's bytes were announced: their bell is on its
                // way (its producer preempted between the two).
                if !ring.rung() && std::mem::take(&mut unannounced) {
                    self.node
                        .sender
                        .stats
                        .unannounced
                        .fetch_add(1, Ordering::Relaxed);
                }
                let mut reader = self.rx.lock();
                self.rx.read(&mut reader, i, now, false);
            }
        }
    }

    fn on_event(&mut self, slot: Slot, revents: libc::c_short, now: Instant) {
        let gone = libc::POLLHUP | libc::POLLERR;
        match slot {
            Slot::Wake => self.waker.drain(),
            Slot::Link(i) => {
                let peer = self.rx.fds[i].1;
                let probe = self.rx.probes[i].as_ref();
                if let (Some((ring, sock)), true) = (probe, revents & libc::POLLIN != 0) {
                    // A lane's bells: drained here, the ring read after the
                    // events (`read_lanes`). A socket that ended is read
                    // under the lock, ring first, to judge the link's end.
                    if ring.drain_bells(sock).is_err() || revents & gone != 0 {
                        let mut reader = self.rx.lock();
                        self.rx.read(&mut reader, i, now, true);
                    }
                } else if revents & (libc::POLLIN | gone) != 0 {
                    // A processor that is polling reads it (see `Rx`);
                    // else this thread, unless one is reading right now.
                    // Left, the bytes make the next `poll` return at once:
                    // the loop yields first (see `run`).
                    let mut read = false;
                    if !self.rx.polled_recently() {
                        // Blocking: a processor reading now (a long handler)
                        // lets go soon, and yielding and polling again
                        // meanwhile took its CPU.
                        let mut reader = self.rx.lock();
                        self.rx.read(&mut reader, i, now, true);
                        read = true;
                    }
                    self.deferred |= !read;
                }
                // A lane's bell may say its reader freed room in the ring.
                let lane = probe.is_some();
                if revents & (libc::POLLOUT | gone) != 0 || (lane && revents & libc::POLLIN != 0) {
                    self.flush(peer);
                }
            }
            Slot::Listener(i) => self.accept(i, now),
            Slot::Stray(i) => self.strays[i].on_readable(),
        }
    }

    /// Writes `peer`'s backlog as far as its socket takes it.
    fn flush(&self, peer: usize) {
        let Some(Some(tx)) = self.node.sender.tx.get(peer) else {
            return;
        };
        let mut st = tx.st.lock().unwrap_or_else(|e| e.into_inner());
        let flushed = st.flush();
        if flushed.is_err() {
            st.backlog.clear();
            st.controls = 0;
        }
        tx.note(&st);
        drop(st);
        if let Err(e) = flushed {
            self.node
                .fail(lost(peer, &format!("writing to it failed: {e}")));
        }
    }

    /// After setup, any connection to our listeners is a stray: accepted,
    /// read for what it says (at most [`crate::tcp::mesh::HANDSHAKE_WAIT`]),
    /// refused with a line (rate-limited: a flood costs a few lines and a
    /// count).
    fn accept(&mut self, i: usize, now: Instant) {
        loop {
            match self.listeners[i].accept() {
                Ok((sock, from)) => {
                    self.node
                        .sender
                        .stats
                        .refused
                        .fetch_add(1, Ordering::Relaxed);
                    let why = sock
                        .set_nonblocking(true)
                        .err()
                        .map(|e| format!("no handshake: {e}"));
                    self.strays.push(Stray {
                        sock,
                        from,
                        said: [0; HANDSHAKE_LEN],
                        got: 0,
                        deadline: now + crate::tcp::mesh::HANDSHAKE_WAIT,
                        why,
                    });
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                // Out of descriptors under a flood, say: refusing must go on.
                Err(e) => {
                    let after = self.log.refuse("(accept)", e);
                    self.summary_in(after, now);
                    self.listen_after = Some(now + ACCEPT_PAUSE);
                    return;
                }
            }
        }
    }

    /// The held-back refusal lines are summed up after `after`, even if no
    /// stray follows.
    fn summary_in(&mut self, after: Option<Duration>, now: Instant) {
        if let Some(after) = after {
            let t = now + after;
            self.tick_at = Some(self.tick_at.map_or(t, |u| u.min(t)));
        }
    }

    /// Deadlines: strays refused, the refusal summary, heartbeats.
    fn on_time(&mut self, now: Instant) {
        let wait = crate::tcp::mesh::HANDSHAKE_WAIT;
        let mut refused = Vec::new();
        self.strays.retain_mut(|s| {
            if s.why.is_none() && now >= s.deadline {
                s.why = Some(format!("no handshake within {} s", wait.as_secs()));
            }
            match s.why.take() {
                Some(why) => {
                    refused.push((s.from, why));
                    false
                }
                None => true,
            }
        });
        for (from, why) in refused {
            let after = self.log.refuse(from, why);
            self.summary_in(after, now);
        }
        if self.tick_at.is_some_and(|t| now >= t) {
            self.tick_at = None;
            self.log.tick();
        }
        if self.next_beat.is_some_and(|t| now >= t) {
            self.heartbeat(now);
        }
    }

    /// Sends a heartbeat to every peer at a quarter of the limit, and fails
    /// the node when a peer whose link is read has been silent past it
    /// (judged every fiftieth of the limit).
    fn heartbeat(&mut self, now: Instant) {
        if self.node.sender.inbox.failure().is_some() {
            self.next_beat = None;
            return;
        }
        self.next_beat = Some(now + self.judge_every);
        // If this thread itself did not run for a while (the process was
        // stopped, or starved), the peers' heartbeats waited unread in the
        // sockets: they were read this turn, but judge nobody yet.
        let late = now.saturating_duration_since(self.last_beat) > self.every;
        self.last_beat = now;
        let send = now >= self.next_send;
        if send {
            self.next_send = now + self.every;
        }
        let frame = wire::control_frame(&Msg::Heartbeat);
        let reader = self.rx.lock();
        let read = reader
            .links
            .iter()
            .zip(&self.rx.reading)
            .filter(|(_, r)| r.load(Ordering::Relaxed));
        for (link, _) in read {
            // Not counted as traffic: it is the link's own upkeep.
            if send {
                let _ = self.node.sender.push(link.peer, frame.clone(), true);
            }
            let silent = now.saturating_duration_since(link.heard);
            if silent > self.limit && !late {
                self.next_beat = None;
                self.node.fail(Cause::new(
                    link.peer,
                    CauseKind::Hung,
                    format!(
                        "it stopped answering node {}: nothing, not even a heartbeat, for \
                         {:.1} s (HYFI_HEARTBEAT={}): it is hung, stopped (SIGSTOP) or cut off",
                        self.me,
                        silent.as_secs_f64(),
                        self.limit.as_secs_f64()
                    ),
                ));
                return;
            }
        }
    }
}
