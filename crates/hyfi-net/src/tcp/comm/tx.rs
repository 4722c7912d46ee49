//! The sending side: frames written by the calling thread under a
//! per-link lock; what a socket does not take waits in the link's backlog,
//! which the communication thread's event loop writes out when the socket
//! drains (the [`Waker`] tells it there is a backlog).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use hyfi_core::link::{Class, ServiceId};

use crate::cause::{Cause, CauseKind};
use crate::error::NetError;
use crate::tcp::wire::{self, Header, Kind, Msg, HEADER_LEN};

use super::inbox::Inbox;
use super::service::service_tag;
use super::stats::NetStats;
use crate::tcp::lane::Ring;

/// The sending side of one link. Every frame is written without blocking:
/// what the socket does not take at once waits in `backlog`, in order, and
/// the communication thread's event loop writes it as the socket drains. So
/// the communication thread may answer requests itself (a page, a steal)
/// without ever blocking on a full socket — two nodes answering each
/// other's requests could otherwise deadlock with both receive buffers full.
pub(super) struct PeerTx {
    pub(super) st: Mutex<TxState>,
    /// [`TxState::wants_out`] as of the last change under the lock: read
    /// by the event loop at every turn without taking the lock (taking it
    /// would make the loop wait for a sender's `write`, and that sender
    /// wake it afterwards: a context switch on every round trip).
    pub(super) out: AtomicBool,
    /// [`TxState::steps`] is not empty (read without the lock by the
    /// threads that flush it before they wait).
    steps_held: AtomicBool,
}

impl PeerTx {
    pub(super) fn new(sock: std::net::TcpStream, lane: Option<Ring>) -> PeerTx {
        PeerTx {
            st: Mutex::new(TxState {
                sock: Some(sock),
                lane,
                backlog: Default::default(),
                head_off: 0,
                controls: 0,
                steps: Vec::new(),
                steps_since: None,
            }),
            out: AtomicBool::new(false),
            steps_held: AtomicBool::new(false),
        }
    }

    /// Takes the `Step` frames `st` (this link's state, locked) holds back.
    fn take_steps(&self, st: &mut TxState) -> Vec<u8> {
        self.steps_held.store(false, Ordering::Relaxed);
        st.steps_since = None;
        std::mem::take(&mut st.steps)
    }

    /// Publishes whether `st` (this link's state, locked) has a backlog
    /// to write. Called after every change to the backlog or the socket.
    pub(super) fn note(&self, st: &TxState) {
        self.out.store(st.wants_out(), Ordering::SeqCst);
    }
}

pub(super) struct TxState {
    /// `None` once closed.
    pub(super) sock: Option<std::net::TcpStream>,
    /// The link's shared-memory lane, if its peer is on this host: frames
    /// go there instead of to `sock`, which then carries only bells (see
    /// [`crate::tcp::lane`]).
    pub(super) lane: Option<Ring>,
    /// Frames not yet fully written; the first one is written from `head_off`.
    pub(super) backlog: std::collections::VecDeque<Vec<u8>>,
    pub(super) head_off: usize,
    /// Control frames queued ahead of the rest, not started: they follow
    /// the head if it is being written (`head_off > 0`), else they are the
    /// first ones. A new control frame goes behind them, so control frames
    /// keep their order among themselves while they overtake bulk ones.
    pub(super) controls: usize,
    /// `Step` frames held back (see [`Sender::enter_step`]): they go out in
    /// front of the next frame to this peer, in one write with it.
    pub(super) steps: Vec<u8>,
    /// When the first of `steps` was held back.
    pub(super) steps_since: Option<std::time::Instant>,
}

/// The most `Step` messages a link holds back before it sends them anyway
/// (a node's ring successor compares the last 64 of its own).
const STEPS_HELD: usize = 16;

/// Why [`Sender::write_or_queue`] sent nothing.
enum Unsent {
    /// No link to that node (itself, or out of range).
    NoLink,
    /// The link is closed.
    Closed,
    /// Writing failed.
    Write(std::io::Error),
}

/// Writes as much of `buf` as the non-blocking socket takes now (the
/// blocking flag is the socket's, shared with the event loop's reading
/// handle). Returns how many bytes were written.
pub(super) fn write_some(s: &mut std::net::TcpStream, buf: &[u8]) -> std::io::Result<usize> {
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
    /// Writes as much of `buf` as the link takes now: its lane's ring if it
    /// has one (the socket rings the peer, unless `for_phase_end` lets it
    /// wait: see [`Ring::write`]), else its socket (open: the caller
    /// checked).
    fn put(
        sock: &mut std::net::TcpStream,
        lane: Option<&Ring>,
        buf: &[u8],
        for_phase_end: bool,
    ) -> std::io::Result<usize> {
        match lane {
            Some(lane) => lane
                .write(buf, sock, for_phase_end)
                .map_err(|b| std::io::Error::new(std::io::ErrorKind::InvalidData, b.to_string())),
            None => write_some(sock, buf),
        }
    }

    /// [`TxState::put`] on this link's socket or lane, now.
    fn put_now(&mut self, buf: &[u8], for_phase_end: bool) -> Result<usize, Unsent> {
        let sock = self.sock.as_mut().ok_or(Unsent::Closed)?;
        TxState::put(sock, self.lane.as_ref(), buf, for_phase_end).map_err(Unsent::Write)
    }

    /// Writes backlogged frames until the socket (or the lane's ring) would
    /// block; `Ok(true)` if the backlog is empty afterwards.
    pub(super) fn flush(&mut self) -> std::io::Result<bool> {
        let Some(sock) = self.sock.as_mut() else {
            return Ok(self.backlog.is_empty());
        };
        while let Some(head) = self.backlog.front() {
            let fresh = self.head_off == 0;
            // The loop writes a backlog: a frame that waited rings.
            let n = TxState::put(sock, self.lane.as_ref(), &head[self.head_off..], false)?;
            if fresh && n > 0 && self.controls > 0 {
                // The first queued control frame has started.
                self.controls -= 1;
            }
            self.head_off += n;
            if self.head_off < head.len() {
                return Ok(false);
            }
            if let Some(done) = self.backlog.pop_front() {
                hyfi_core::link::buffers::recycle(done);
            }
            self.head_off = 0;
        }
        Ok(true)
    }

    /// Whether the event loop should wait for this link's socket to drain.
    pub(super) fn wants_out(&self) -> bool {
        self.sock.is_some() && !self.backlog.is_empty()
    }
}

/// Wakes the communication thread's event loop out of its `poll`: a byte
/// down a socket pair whose other end is in the poll set. A sender wakes it
/// when a link's backlog goes from empty to not (the loop then waits for
/// that socket to drain as well), and [`super::Comm::close`] when it stops.
pub(super) struct Waker {
    /// The end the loop polls and drains.
    pub(super) rx: UnixStream,
    tx: UnixStream,
    /// A byte is on its way and not yet drained: later wakes need not write.
    pending: AtomicBool,
    /// The loop ends at its next turn.
    pub(super) stop: AtomicBool,
}

impl Waker {
    pub(super) fn new() -> std::io::Result<Waker> {
        let (rx, tx) = UnixStream::pair()?;
        rx.set_nonblocking(true)?;
        tx.set_nonblocking(true)?;
        Ok(Waker {
            rx,
            tx,
            pending: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        })
    }

    /// Makes the loop's current or next `poll` return.
    pub(super) fn wake(&self) {
        if !self.pending.swap(true, Ordering::SeqCst) {
            // A full pipe (it cannot be: one byte is pending at most) or
            // an interrupted write would still leave a byte to read.
            let _ = (&self.tx).write(&[1]);
        }
    }

    /// Called by the loop when `rx` is readable, before it looks at the
    /// backlogs: a wake after this writes a byte again.
    pub(super) fn drain(&self) {
        self.pending.store(false, Ordering::SeqCst);
        let mut b = [0u8; 64];
        while matches!((&self.rx).read(&mut b), Ok(n) if n > 0) {}
    }
}

/// What sending needs: the links' writing halves and the event loop's
/// waker. Shared by [`Comm`](super::Comm) and every [`Sender`] handed out.
pub struct SenderInner {
    pub(super) rank: usize,
    pub(super) nodes: usize,
    pub(super) tx: Arc<Vec<Option<PeerTx>>>,
    pub(super) waker: Arc<Waker>,
    pub(super) inbox: Arc<Inbox>,
    pub(super) stats: Arc<NetStats>,
}

/// A handle for sending to the peers, independent of the
/// [`Comm`](super::Comm)'s own lifetime: a
/// [`Service`](hyfi_core::link::Service) keeps one to answer requests while
/// its node closes (the node serves its peers until each has said `Bye`).
#[derive(Clone)]
pub struct Sender(pub(super) Arc<SenderInner>);

impl std::ops::Deref for Sender {
    type Target = SenderInner;
    fn deref(&self) -> &SenderInner {
        &self.0
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
    /// the event loop to write when the socket drains. A control frame
    /// overtakes backlogged bulk frames that have not started (and stays
    /// behind the control frames queued before it), so control traffic
    /// waits at most for one frame being written.
    pub(crate) fn push(&self, peer: usize, frame: Vec<u8>, control: bool) -> Result<(), NetError> {
        self.push_as(peer, frame, control, false)
    }

    /// [`Sender::push`], for a frame only the peer's phase end waits for
    /// if `for_phase_end` (see [`Ring::write`]).
    fn push_as(
        &self,
        peer: usize,
        frame: Vec<u8>,
        control: bool,
        for_phase_end: bool,
    ) -> Result<(), NetError> {
        match self.write_or_queue(peer, frame, control, for_phase_end) {
            Ok(()) => Ok(()),
            Err(Unsent::NoLink) => Err(self.failed_error(format!("no link to node {peer}"))),
            Err(Unsent::Closed) => Err(self.failed_error(format!("link to node {peer} is closed"))),
            Err(Unsent::Write(e)) => Err(self.write_failed(peer, e)),
        }
    }

    /// [`Sender::push`] without its error handling: what went wrong, for a
    /// caller that must not wait for the node's failure or report it (the
    /// abort a failing node sends its peers, some of them gone).
    fn write_or_queue(
        &self,
        peer: usize,
        frame: Vec<u8>,
        control: bool,
        for_phase_end: bool,
    ) -> Result<(), Unsent> {
        let Some(Some(tx)) = self.tx.get(peer) else {
            return Err(Unsent::NoLink);
        };
        hyfi_core::trace::instant(
            hyfi_core::trace::Kind::Send,
            [peer as u64, u64::from(!control), frame.len() as u64, 0],
        );
        let mut guard = tx.st.lock().unwrap_or_else(|e| e.into_inner());
        let st = &mut *guard;
        if st.sock.is_none() {
            return Err(Unsent::Closed);
        }
        // Nothing queued: the event loop is not watching this socket for
        // room (a longer backlog is watched already).
        let idle = st.backlog.is_empty();
        if !st.steps.is_empty() {
            // The held steps go first (they were entered before this frame
            // was sent), as control frames of their own: written now if
            // nothing waits, with the frame after them in this call (not
            // copied behind them: a large frame's copy cost a fresh mapping
            // of its size), else queued ahead of the bulk not started (a
            // later control frame must not overtake them).
            let steps = tx.take_steps(st);
            if idle {
                let n = st.put_now(&steps, for_phase_end)?;
                if n < steps.len() {
                    st.backlog.push_back(steps);
                    st.head_off = n;
                    // Not started: a control frame at the front.
                    st.controls += usize::from(n == 0);
                }
            } else {
                let at = usize::from(st.head_off > 0) + st.controls;
                st.backlog.insert(at, steps);
                st.controls += 1;
            }
        }
        if st.backlog.is_empty() {
            let n = st.put_now(&frame, for_phase_end)?;
            if n == frame.len() {
                drop(guard);
                hyfi_core::link::buffers::recycle(frame);
                return Ok(());
            }
            st.backlog.push_back(frame);
            st.head_off = n;
        } else if control {
            // Behind the frame being written and the control frames queued
            // before it, ahead of the bulk frames not started.
            let at = usize::from(st.head_off > 0) + st.controls;
            st.backlog.insert(at, frame);
            st.controls += 1;
        } else {
            st.backlog.push_back(frame);
        }
        if idle {
            tx.note(st);
            drop(guard);
            self.waker.wake();
        }
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
    /// frames; `for_phase_end` as for [`Ring::write`].
    pub(crate) fn send_service(
        &self,
        peer: usize,
        id: ServiceId,
        class: Class,
        for_phase_end: bool,
        len_hint: usize,
        fill: &mut dyn FnMut(&mut Vec<u8>),
    ) -> Result<usize, NetError> {
        let mut frame = hyfi_core::link::buffers::with_capacity(HEADER_LEN + len_hint);
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
        self.push_as(peer, frame, class == Class::Control, for_phase_end)?;
        Ok(bytes)
    }

    /// A direct write to `peer` failed: its end of the link is gone (reset,
    /// closed). The event loop, which reads the same socket, names the lost
    /// node and fails this one with the failure hook; this waits briefly
    /// for it (woken at once) so that the caller reports what the job
    /// reports ("lost node 1: …"), not the socket's errno. A peer that said
    /// `Bye` is not lost: the error is then only the write's.
    #[cold]
    fn write_failed(&self, peer: usize, e: std::io::Error) -> NetError {
        let fallback = format!("writing to node {peer}: {e}");
        let said_bye = self
            .inbox
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .gone
            .contains(&peer);
        if !said_bye {
            self.waker.wake();
            let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
            while self.inbox.failure().is_none() && std::time::Instant::now() < until {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        self.failed_error(fallback)
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
        self.push_control(peer, wire::control_frame(msg), false)
    }

    /// Queues a collective's piece to `peer` (never blocks): the peer reads
    /// it at its own call of the collective, which comes after its
    /// master's share of a phase, so it rings no bell while that master
    /// computes (`Port::send_for_phase_end`, as the seam's collectives
    /// send theirs). Every step of a release's all-reduce sent one, and
    /// on more than two nodes a node that ended its share first woke the
    /// others' communication threads onto their computing CPUs.
    pub fn send_collective(&self, peer: usize, msg: &Msg) -> Result<(), NetError> {
        self.send_collective_frame(peer, wire::control_frame(msg))
    }

    /// [`Sender::send_collective`] of a frame made already
    /// ([`wire::collective_frame`]).
    pub fn send_collective_frame(&self, peer: usize, f: Vec<u8>) -> Result<(), NetError> {
        self.push_control(peer, f, true)
    }

    /// Counts control frame `f` and queues it to `peer`.
    fn push_control(&self, peer: usize, f: Vec<u8>, for_phase_end: bool) -> Result<(), NetError> {
        self.stats.control_sent.fetch_add(1, Ordering::Relaxed);
        self.stats
            .control_bytes_sent
            .fetch_add(f.len() as u64, Ordering::Relaxed);
        self.push_as(peer, f, true, for_phase_end)
    }

    /// Queues raw bytes to `peer` under `tag` (never blocks).
    pub fn send_bulk(&self, peer: usize, tag: u64, bytes: &[u8]) -> Result<(), NetError> {
        self.send_frame(peer, wire::bulk_frame(tag, bytes))
    }

    /// Tells every peer the job ends, with its first `cause`.
    pub(super) fn send_abort(&self, cause: &Cause) {
        let msg = Msg::Abort {
            origin: cause.origin as u64,
            kind: cause.kind.to_wire(),
            cause: cause.text.clone(),
        };
        for p in (0..self.nodes).filter(|&p| p != self.rank) {
            let f = wire::control_frame(&msg);
            self.stats.control_sent.fetch_add(1, Ordering::Relaxed);
            (self.stats.control_bytes_sent).fetch_add(f.len() as u64, Ordering::Relaxed);
            // A peer that is gone cannot be told: no waiting for the
            // node's failure (it is this one, not published yet), no error
            // handed to the program.
            let _ = self.write_or_queue(p, f, true, false);
        }
    }

    /// This node enters its next SPMD step (see `hyfi_core::link::spmd`): compared with the
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
            Ok(n) => self.hold_step(
                (self.rank + 1) % self.nodes,
                &Msg::Step {
                    n,
                    step: step.to_words(),
                },
            ),
            Err(why) => {
                let cause = Cause::new(self.rank, CauseKind::Program, why.to_string());
                let line = cause.line(self.rank);
                self.fail_and_tell(cause, |_| {});
                Err(self.aborted(self.inbox.failure().unwrap_or(line)))
            }
        }
    }

    /// Holds the `Step` message for `peer` back until the next frame to
    /// it, or until this node waits ([`Sender::flush_steps`]), whichever
    /// comes first; at most [`STEPS_HELD`] of them.
    ///
    /// Why: a step message sent when a phase starts reaches the peer while
    /// it computes, and on a node that owns its CPUs its communication
    /// thread then wakes on the computing processor's CPU to read 60 bytes:
    /// a switch away and back, 10 µs or more on a virtual machine, once per
    /// phase. Held back, the step goes with the phase's release (or with
    /// whatever the node sends its successor next), and a node that waits
    /// sends it first: a node that diverged is still named as soon as it
    /// waits for the others (LU 2×1 over TCP: 0.086 s with a message per
    /// step, 0.069 s with none at all, BENCHMARKS.md).
    fn hold_step(&self, peer: usize, msg: &Msg) -> Result<(), NetError> {
        let Some(Some(tx)) = self.tx.get(peer) else {
            return self.send(peer, msg);
        };
        let f = wire::control_frame(msg);
        self.stats.control_sent.fetch_add(1, Ordering::Relaxed);
        self.stats
            .control_bytes_sent
            .fetch_add(f.len() as u64, Ordering::Relaxed);
        let mut st = tx.st.lock().unwrap_or_else(|e| e.into_inner());
        if st.sock.is_none() {
            drop(st);
            return self.push(peer, f, true);
        }
        if st.steps.is_empty() {
            st.steps_since = Some(std::time::Instant::now());
        }
        st.steps.extend_from_slice(&f);
        let full = st.steps.len() >= STEPS_HELD * f.len();
        tx.steps_held.store(true, Ordering::SeqCst);
        drop(st);
        if full {
            self.flush_steps();
        }
        Ok(())
    }

    /// [`Sender::flush_steps`], for steps held back longer than `age`
    /// (the communication thread's turns: a turn woken by a peer's frame
    /// while this node computes must not send the step the node holds for
    /// its release, which would wake the peer's thread in turn).
    pub(crate) fn flush_steps_older_than(&self, age: std::time::Duration) {
        self.flush_held(Some(age))
    }

    /// Sends the `Step` messages held back ([`Sender::hold_step`]) now. Every
    /// wait of this node for a peer calls it first (through the transport's
    /// idle progress, the inbox's waits, `hyfi_core::link::before_wait`);
    /// the communication thread sends those held for a while
    /// ([`Sender::flush_steps_older_than`]) at each turn of its loop.
    pub(crate) fn flush_steps(&self) {
        self.flush_held(None)
    }

    fn flush_held(&self, min_age: Option<std::time::Duration>) {
        if self.nodes < 2 {
            return;
        }
        let succ = (self.rank + 1) % self.nodes;
        let Some(Some(tx)) = self.tx.get(succ) else {
            return;
        };
        if !tx.steps_held.load(Ordering::SeqCst) {
            return;
        }
        let held = {
            let mut st = tx.st.lock().unwrap_or_else(|e| e.into_inner());
            if let (Some(age), Some(since)) = (min_age, st.steps_since) {
                if since.elapsed() < age {
                    return;
                }
            }
            tx.take_steps(&mut st)
        };
        if !held.is_empty() {
            // A link that cannot be written is failing: its reading side
            // (the loop, or a processor's pass) finds out and fails the
            // node, and the wait that follows reports it. Not `push`, whose
            // wait for that failure would stall the loop that finds it.
            // Sent for the successor's phase end: nobody there waits for a
            // step, so one that comes while its master computes is read at
            // that master's next wait, with no bell (a switch to the
            // communication thread on the computing CPU, and back). On 16
            // local nodes LU's odd nodes sent their step so every step, to a
            // successor still computing (its all-reduce partner is another
            // node): half the bells of the run. A successor that waits
            // elsewhere (it diverged) is rung as before.
            let _ = self.write_or_queue(succ, held, true, true);
        }
    }

    /// Fails this node with `why` (its waits return the error) and tells
    /// every peer; returns false if the node had failed already.
    /// `announce` runs first (see [`Inbox::fail_announced`]).
    pub(crate) fn fail_and_tell(&self, cause: Cause, announce: impl FnOnce(&Cause)) -> bool {
        if !self.inbox.claim_failure(&cause, announce) {
            return false;
        }
        // The peers are told before this node's waits wake: a program that
        // exits at once on the error closes its sockets, and a peer that saw
        // them close before the abort came would blame this node for the
        // failure instead of the node that caused it.
        self.send_abort(&cause);
        self.inbox.publish_failure(self.rank, cause);
        true
    }

    /// The error the program gets for the node's failure, `cause` its
    /// line. The program prints it, so hyfi's own line is not needed.
    pub(crate) fn aborted(&self, cause: String) -> NetError {
        crate::cause::mark_delivered();
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
        self.send_service(to, service, class, false, len_hint, fill)
            .map_err(|e| Box::new(e) as hyfi_core::LinkError)
    }

    fn send_for_phase_end(
        &self,
        to: usize,
        service: ServiceId,
        class: Class,
        len_hint: usize,
        fill: &mut dyn FnMut(&mut Vec<u8>),
    ) -> Result<usize, hyfi_core::LinkError> {
        self.send_service(to, service, class, true, len_hint, fill)
            .map_err(|e| Box::new(e) as hyfi_core::LinkError)
    }
}
