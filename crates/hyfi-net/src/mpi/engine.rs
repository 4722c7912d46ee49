//! The communication thread: the one thread that calls MPI (see the
//! [module docs](super)).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mpi::datatype::Equivalence;
use mpi::point_to_point::{Destination, MatchedReceiveVec, Message, Source, Status};
use mpi::request::{Request, StaticScope};
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::Threading;

use hyfi_core::link::spmd::Steps;
use hyfi_core::link::{Class, ServiceTable};
use hyfi_core::Step;

use super::{decode_abort, lock, tag, Out, Outbox, RawJob, Shared};
use super::{BULK_IN_FLIGHT, HOT, NAP_MAX, NAP_MIN, NAP_QUIET, PIECE, PIECED_MAX, QUIET};
use super::{STEPS_HELD_FOR, STEP_RECORD};
use crate::cause::{Cause, CauseKind};
use crate::error::NetError;
use crate::since_start;

/// A posted frame: its sends (one, or one per piece) and the buffer they
/// read.
struct Posted {
    reqs: Vec<Request<'static, [u8], StaticScope>>,
    /// The buffer (a `Vec`'s parts: pointer, length, capacity), leaked for
    /// the requests' `'static` borrow; given back to the pool of large
    /// frames' buffers (or freed) when every request completed.
    buf: (*mut u8, usize, usize),
    to: usize,
    class: Class,
}

/// Starts the communication thread; returns once MPI is initialised,
/// with the node's shared state.
pub(super) fn spawn(heartbeat: Duration) -> Result<(Arc<Shared>, JoinHandle<()>), NetError> {
    let (tx, rx) = std::sync::mpsc::channel::<Result<Arc<Shared>, String>>();
    let t = std::thread::Builder::new()
        .name("hyfi-mpi".into())
        .spawn(move || run(heartbeat, tx))
        .map_err(|e| NetError::io("spawning the MPI communication thread", e))?;
    match rx.recv() {
        Ok(Ok(shared)) => {
            let _ = shared.thread.set(t.thread().clone());
            Ok((shared, t))
        }
        Ok(Err(why)) => {
            let _ = t.join();
            Err(NetError::Launch(why))
        }
        Err(_) => {
            let _ = t.join();
            Err(NetError::Launch(
                "the MPI communication thread ended while initialising MPI".into(),
            ))
        }
    }
}

fn run(heartbeat: Duration, tx: std::sync::mpsc::Sender<Result<Arc<Shared>, String>>) {
    // SERIALIZED: idle processors may poll too, one thread at a time (the
    // engine's lock); an MPI that offers only FUNNELED gets the
    // communication thread alone.
    let Some((universe, level)) = mpi::initialize_with_threading(Threading::Serialized) else {
        let _ = tx.send(Err(
            "MPI was initialised already in this process: hyfi's MPI transport initialises \
             it itself, on its communication thread; do not initialise MPI in the program"
                .into(),
        ));
        return;
    };
    if level < Threading::Funneled {
        let _ = tx.send(Err(format!(
            "this MPI library offers threads at level {level:?}, below MPI_THREAD_FUNNELED, \
             which hyfi's communication thread needs: use an MPI built with thread support, \
             or HYFI_TRANSPORT=tcp"
        )));
        return;
    }
    let world = universe.world();
    let (rank, nodes) = (world.rank() as usize, world.size() as usize);
    let shared = Arc::new(Shared {
        rank,
        nodes,
        out: Mutex::new(Outbox::default()),
        thread: std::sync::OnceLock::new(),
        asleep: Default::default(),
        services: ServiceTable::new(),
        failure: Mutex::new(None),
        steps: Mutex::new(Steps::new(rank)),
        counters: Default::default(),
        steps_held: Default::default(),
        heartbeat,
    });
    let e = Engine {
        control: world.duplicate(),
        bulk: world.duplicate(),
        raw: world.duplicate(),
        world,
        s: shared.clone(),
        posted: Vec::new(),
        in_flight: vec![0; nodes],
        heard: vec![Instant::now(); nodes],
        byes: vec![0; nodes],
        held: VecDeque::new(),
    };
    *lock(&ENGINE) = Some(e);
    if level >= Threading::Serialized {
        SERIALIZED.store(true, Ordering::Release);
        hyfi_core::link::set_idle_progress(idle_progress);
    }
    if tx.send(Ok(shared.clone())).is_err() {
        drop(lock(&ENGINE).take());
        return;
    }
    comm_loop(&shared);
    // Communicators are freed before MPI is finalised (the universe's drop).
    drop(lock(&ENGINE).take());
    drop(universe);
}

/// The node's MPI state, under the lock that serialises MPI calls: the
/// communication thread takes it for each pass of its loop, an idle
/// processor or a sender only when it is free ([`idle_progress`],
/// [`post_now`]). `None` before MPI is initialised and after it is
/// finalised.
static ENGINE: Mutex<Option<Engine>> = Mutex::new(None);

/// Whether MPI runs at `MPI_THREAD_SERIALIZED`, so that threads other than
/// the communication thread may make (serialised) MPI calls.
static SERIALIZED: AtomicBool = AtomicBool::new(false);

/// An idle processor's poll (see `hyfi_core::link::set_idle_progress`):
/// one pass of the engine if no other thread is in MPI.
fn idle_progress() -> bool {
    // A thread of this node waits for a peer: the step records held back
    // go now (by whichever thread holds the engine next), so a node that
    // diverged is named as soon as it waits.
    STEPS_DUE.store(true, Ordering::Release);
    let Ok(mut g) = ENGINE.try_lock() else {
        return false;
    };
    // One bulk message at most: a page the processor's filthread waits
    // for is installed, and the processor goes back to it without
    // another probe (the communication thread takes the rest).
    g.as_mut().is_some_and(|e| e.pass(1))
}

/// When a request (a service's control message: a page or steal request)
/// was last posted or received (`crate::since_start` units): the
/// communication thread naps short for [`QUIET`] after it (module docs).
static REQUESTS_MOVED: AtomicU64 = AtomicU64::new(0);

/// Whether a message of `class` with (unpieced) `tag` is a request: a
/// service's control message other than a collective's piece, which its
/// waiter polls for itself.
fn is_request(class: Class, tag: i32) -> bool {
    class == Class::Control
        && (1..=127).contains(&tag)
        && tag != i32::from(hyfi_core::link::collective::SERVICE.number())
}

/// A thread waits ([`idle_progress`]): the next [`Engine::post`] sends the
/// held step records.
static STEPS_DUE: AtomicBool = AtomicBool::new(false);

/// When a pass by any thread last moved a message (`crate::since_start`
/// units):
/// the communication thread polls, yielding, for [`HOT`] after it.
static MOVED: AtomicU64 = AtomicU64::new(0);

/// Posts what senders queued, on the calling thread, if MPI allows it and
/// no other thread is in MPI; false if the communication thread must.
pub(super) fn post_now() -> bool {
    if !SERIALIZED.load(Ordering::Acquire) {
        return false;
    }
    let Ok(mut g) = ENGINE.try_lock() else {
        return false;
    };
    let posted = g.as_mut().is_some_and(Engine::post);
    if posted {
        MOVED.store(since_start(), Ordering::Relaxed);
    }
    posted
}

/// The communication thread's loop: an engine pass under the lock, then
/// its own duties (heartbeats, raw ping-pongs, the end), then a pause that
/// lets others in.
fn comm_loop(s: &Arc<Shared>) {
    // Naps of tens of µs: without this, Linux stretches each by its default
    // 50 µs of timer slack.
    // SAFETY: PR_SET_TIMERSLACK takes a plain integer and affects only the
    // calling thread.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
    let beat = (s.heartbeat / 4).max(Duration::from_millis(10));
    let mut next_beat = Instant::now();
    let mut nap = NAP_MIN;
    loop {
        let now = Instant::now();
        let moved = {
            let mut g = lock(&ENGINE);
            let e = g.as_mut().expect("the engine lives until this loop ends");
            let moved = e.pass(4);
            e.flush_steps(Some(STEPS_HELD_FOR));
            if now >= next_beat {
                e.beat();
                e.judge(now);
                next_beat = now + beat;
            }
            let (closing, abort, raw) = {
                let mut o = lock(&s.out);
                (o.closing, o.abort, o.raw.take())
            };
            if let Some(job) = raw {
                e.ping_pong(job);
                MOVED.store(since_start(), Ordering::Relaxed);
                continue;
            }
            if let Some(code) = abort {
                e.world.abort(code);
            }
            if closing {
                if let Some(c) = s.failure() {
                    // The program ended after the node failed: end the job
                    // now rather than wait for peers that may never leave.
                    super::say(&c.line(s.rank));
                    e.world.abort(c.kind.exit_code());
                }
                if e.done() {
                    return;
                }
            }
            moved
        };
        let t = since_start();
        let still = t.saturating_sub(MOVED.load(Ordering::Relaxed));
        let hot = still < HOT.as_nanos() as u64;
        if hot {
            nap = NAP_MIN;
            std::thread::yield_now();
            continue;
        }
        // Idle: sleep between polls; a sender wakes the thread. Short naps
        // only while requests move: what else comes is awaited by a
        // thread that polls itself.
        let requests = t.saturating_sub(REQUESTS_MOVED.load(Ordering::Relaxed));
        let this_nap = if requests < QUIET.as_nanos() as u64 {
            nap
        } else {
            NAP_QUIET
        };
        s.asleep.store(true, Ordering::Release);
        let pending = {
            let o = lock(&s.out);
            !o.control.is_empty() || !o.bulk.is_empty() || o.abort.is_some()
        };
        if !pending {
            std::thread::park_timeout(this_nap.min(next_beat.saturating_duration_since(now)));
        }
        s.asleep.store(false, Ordering::Release);
        if !moved {
            nap = (nap * 2).min(NAP_MAX);
        }
    }
}

struct Engine {
    world: SimpleCommunicator,
    control: SimpleCommunicator,
    bulk: SimpleCommunicator,
    /// For [`super::raw_round_trips`] alone.
    raw: SimpleCommunicator,
    s: Arc<Shared>,
    posted: Vec<Posted>,
    /// Bulk bytes posted and not yet completed, per destination.
    in_flight: Vec<usize>,
    /// When each peer was last heard from.
    heard: Vec<Instant>,
    /// Goodbyes received from each peer (one per class).
    byes: Vec<u8>,
    /// Bulk messages held back by [`BULK_IN_FLIGHT`], in order.
    held: VecDeque<Out>,
}

// SAFETY: `Posted::buf` is a leaked box owned by the engine alone. The
// engine moves between threads only under `ENGINE`'s lock: MPI objects
// (communicators, requests) may be used by any thread when MPI runs at
// `MPI_THREAD_SERIALIZED` and calls never overlap, which the lock ensures;
// at `MPI_THREAD_FUNNELED` only the communication thread takes the lock.
unsafe impl Send for Engine {}

impl Engine {
    /// The communicator a class travels on.
    fn comm(&self, class: Class) -> &SimpleCommunicator {
        match class {
            Class::Control => &self.control,
            Class::Bulk => &self.bulk,
        }
    }

    /// One pass: post what is queued, free what completed, receive what
    /// arrived (at most `bulk` bulk messages). Whether anything moved.
    fn pass(&mut self, bulk: usize) -> bool {
        let mut moved = self.post();
        moved |= self.complete();
        moved |= self.receive(bulk);
        if moved {
            MOVED.store(since_start(), Ordering::Relaxed);
        }
        moved
    }

    /// Every peer said goodbye and everything this node sent is sent.
    fn done(&self) -> bool {
        let o = lock(&self.s.out);
        let all_left = (0..self.s.nodes).all(|p| p == self.s.rank || self.byes[p] >= 2);
        all_left
            && o.steps.is_empty()
            && o.control.is_empty()
            && o.bulk.is_empty()
            && self.held.is_empty()
            && self.posted.is_empty()
    }

    /// Posts queued messages: control first, bulk as far as the in-flight
    /// limit allows.
    fn post(&mut self) -> bool {
        if STEPS_DUE.swap(false, Ordering::AcqRel) {
            self.flush_steps(None);
        }
        let (control, bulk) = {
            let mut o = lock(&self.s.out);
            (std::mem::take(&mut o.control), std::mem::take(&mut o.bulk))
        };
        let moved = !control.is_empty() || !bulk.is_empty();
        for m in control {
            self.isend(m);
        }
        self.held.extend(bulk);
        while let Some(m) = self.held.front() {
            let room =
                self.in_flight[m.to] == 0 || self.in_flight[m.to] + m.data.len() <= BULK_IN_FLIGHT;
            if !room {
                // Later messages to other nodes could go, but bulk stays in
                // order per destination; holding all is simpler and rare.
                break;
            }
            let m = self.held.pop_front().expect("front exists");
            self.isend(m);
        }
        moved
    }

    /// Posts the held step records ([`super::STEPS_HELD`]) to the ring
    /// successor as a message of their own, if any were held since at
    /// least `min_age` (`None`: whatever their age).
    fn flush_steps(&mut self, min_age: Option<Duration>) {
        if let Some(m) = self.s.steps_message(min_age) {
            self.isend(m);
        }
    }

    fn isend(&mut self, m: Out) {
        let Out {
            to,
            tag,
            class,
            mut data,
        } = m;
        let service = (1..=127).contains(&tag);
        let mut steps = false;
        if service && to == (self.s.rank + 1) % self.s.nodes {
            // The held step records ride on this frame to the successor:
            // no message of their own.
            if let Some(held) = self.s.take_steps(None) {
                data.extend_from_slice(&held);
                data.push((held.len() / STEP_RECORD) as u8);
                steps = true;
            }
        }
        if class == Class::Bulk {
            self.in_flight[to] += data.len();
        }
        if is_request(class, tag) {
            REQUESTS_MOVED.store(since_start(), Ordering::Relaxed);
        }
        if tag != tag::HEARTBEAT {
            hyfi_core::trace::instant(
                hyfi_core::trace::Kind::Send,
                [
                    to as u64,
                    u64::from(class == Class::Bulk),
                    data.len() as u64,
                    0,
                ],
            );
        }
        let flag = if steps { tag::STEPS } else { 0 };
        let comm = self.comm(class);
        let mut data = std::mem::ManuallyDrop::new(data);
        let ptr = (data.as_mut_ptr(), data.len(), data.capacity());
        // SAFETY: the vector's initialized bytes, leaked (`ManuallyDrop`)
        // and taken back only in `complete`, or in the engine's drop, after
        // every request that reads them completed.
        let bytes: &'static [u8] = unsafe { std::slice::from_raw_parts(ptr.0, ptr.1) };
        let peer = comm.process_at_rank(to as i32);
        let reqs = match pieces(bytes.len(), tag) {
            None => vec![peer.immediate_send_with_tag(StaticScope, bytes, tag | flag)],
            Some(n) => {
                // In pieces under the eager limit, back to back under the
                // engine's lock: the receiver takes the first piece's
                // followers as the next `tag::PIECE` messages from this
                // node on this communicator (MPI's non-overtaking rule).
                let mut chunks = bytes.chunks(PIECE);
                let first = chunks
                    .next()
                    .expect("a pieced frame is longer than a piece");
                let mut reqs = Vec::with_capacity(n);
                reqs.push(peer.immediate_send_with_tag(
                    StaticScope,
                    first,
                    pieced_tag(tag, n) | flag,
                ));
                reqs.extend(
                    chunks.map(|c| peer.immediate_send_with_tag(StaticScope, c, tag::PIECE)),
                );
                reqs
            }
        };
        self.posted.push(Posted {
            reqs,
            buf: ptr,
            to,
            class,
        });
    }

    /// Frees the buffers of completed sends.
    fn complete(&mut self) -> bool {
        let mut moved = false;
        let mut i = 0;
        while i < self.posted.len() {
            let p = &mut self.posted[i];
            let reqs = std::mem::take(&mut p.reqs);
            for req in reqs {
                match req.test() {
                    Ok(_) => moved = true,
                    Err(req) => p.reqs.push(req),
                }
            }
            if !p.reqs.is_empty() {
                i += 1;
                continue;
            }
            let p = self.posted.swap_remove(i);
            // SAFETY: every send that borrowed the buffer completed;
            // nothing else refers to it.
            let buf = unsafe { Vec::from_raw_parts(p.buf.0, p.buf.1, p.buf.2) };
            if p.class == Class::Bulk {
                self.in_flight[p.to] -= buf.len();
            }
            hyfi_core::link::buffers::recycle(buf);
        }
        moved
    }

    /// Receives what has arrived: every control message, then at most
    /// `bulk` bulk ones. One round, not until nothing is left: an idle
    /// processor that polls returns to the work a message woke (a page
    /// its filthread waits for) without more probes, and the
    /// communication thread, still hot, comes back at once.
    fn receive(&mut self, bulk: usize) -> bool {
        let mut got = false;
        while let Some(m) = self.control.any_process().immediate_matched_probe() {
            self.take(m, Class::Control);
            got = true;
        }
        for _ in 0..bulk {
            let Some(m) = self.bulk.any_process().immediate_matched_probe() else {
                break;
            };
            self.take(m, Class::Bulk);
            got = true;
        }
        got
    }

    /// Receives a matched message, and its other pieces if it is the first
    /// of a pieced frame, and dispatches the frame.
    fn take(&mut self, (msg, st): (Message, Status), class: Class) {
        let from = st.source_rank() as usize;
        let steps = st.tag() & tag::STEPS != 0;
        let t = st.tag() & !tag::STEPS;
        let pieced = unpieced_tag(t);
        if is_request(class, pieced.map_or(t, |(tag, _)| tag)) {
            REQUESTS_MOVED.store(since_start(), Ordering::Relaxed);
        }
        let Some((tag, n)) = pieced else {
            let len = st.count(u8::equivalent_datatype()) as usize;
            let data = if len >= hyfi_core::link::buffers::LARGE {
                // Into a buffer used before, as for pieces (below).
                let mut data = hyfi_core::link::buffers::filled(len);
                msg.matched_receive_into(&mut data[..]);
                data
            } else {
                (msg, st).matched_receive_vec::<u8>().0
            };
            self.dispatch_carrying(from, t, class, data, steps);
            return;
        };
        // A large frame's buffer is one used before (whoever handles the
        // frame gives it back; `hyfi_core::link::buffers`).
        let mut data = hyfi_core::link::buffers::with_capacity(n * PIECE);
        receive_appending(&mut data, msg, &st);
        let src = self.comm(class).process_at_rank(from as i32);
        // The followers were posted with the first piece and travel eagerly:
        // they are here or about to be. A sender that dies meanwhile is
        // reported by the launcher; one that stops is bounded by the
        // heartbeat.
        let since = Instant::now();
        for k in 1..n {
            loop {
                if let Some((m, s)) = src.immediate_matched_probe_with_tag(tag::PIECE) {
                    receive_appending(&mut data, m, &s);
                    break;
                }
                if since.elapsed() > self.s.heartbeat {
                    self.s.fail(Cause::new(
                        from,
                        CauseKind::Hung,
                        format!(
                            "sent node {} a frame in {n} pieces and piece {k} did not \
                             follow within {:.1} s (HYFI_HEARTBEAT)",
                            self.s.rank,
                            self.s.heartbeat.as_secs_f64()
                        ),
                    ));
                    return;
                }
                std::hint::spin_loop();
            }
        }
        self.dispatch_carrying(from, tag, class, data, steps);
    }

    /// Dispatches a frame that may carry step records at its end
    /// (`steps`: its tag had [`tag::STEPS`]): the records first, as the
    /// sender entered them before it sent the frame.
    fn dispatch_carrying(
        &mut self,
        from: usize,
        tag: i32,
        class: Class,
        mut data: Vec<u8>,
        steps: bool,
    ) {
        if steps {
            let n = data.last().map_or(0, |&n| usize::from(n));
            let Some(at) = data.len().checked_sub(n * STEP_RECORD + 1) else {
                self.s.fail(Cause::new(
                    self.s.rank,
                    CauseKind::Program,
                    format!(
                        "a frame of {} bytes from node {from} that says it carries {n} step records: is another library sending on hyfi's communicators?",
                        data.len()
                    ),
                ));
                return;
            };
            self.on_steps(from, &data[at..data.len() - 1]);
            data.truncate(at);
        }
        self.dispatch(from, tag, class, data);
    }

    /// Checks the ring predecessor's step records.
    fn on_steps(&mut self, from: usize, records: &[u8]) {
        let s = &self.s;
        for r in records.chunks(STEP_RECORD) {
            let w = words(r);
            let r = match Step::from_words([w[1], w[2], w[3], w[4]]) {
                Some(step) => lock(&s.steps)
                    .on_step(from, w[0], step)
                    .map_err(|e| e.to_string()),
                None => Err(format!(
                    "a step message from node {from} that names no step"
                )),
            };
            if let Err(why) = r {
                s.fail(Cause::new(s.rank, CauseKind::Program, why));
                return;
            }
        }
    }

    fn dispatch(&mut self, from: usize, tag: i32, class: Class, data: Vec<u8>) {
        let s = self.s.clone();
        self.heard[from] = Instant::now();
        match tag {
            t @ 1..=127 => {
                s.counters.count_received(class, data.len());
                hyfi_core::trace::instant(
                    hyfi_core::trace::Kind::Recv,
                    [
                        from as u64,
                        u64::from(class == Class::Bulk),
                        data.len() as u64,
                        0,
                    ],
                );
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    s.services.deliver(from, t as u8, data)
                }));
                let why = match r {
                    Ok(Ok(())) => {
                        // What the handler sent (a page server's reply, a
                        // steal's answer) found the engine locked by this
                        // pass: post it now, before the next probe.
                        self.post();
                        return;
                    }
                    Ok(Err(e)) => e.to_string(),
                    Err(p) => format!(
                        "the handler of service {t} panicked on a message from node {from}: {}",
                        p.downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| p.downcast_ref::<String>().cloned())
                            .unwrap_or_default()
                    ),
                };
                s.fail(Cause::new(s.rank, CauseKind::Program, why));
            }
            tag::STEP => self.on_steps(from, &data),
            tag::BYE => {
                self.byes[from] += 1;
                if self.byes[from] == 2 {
                    let w = words(&data);
                    let last = Step::from_words([w[1], w[2], w[3], w[4]]);
                    match lock(&s.steps).on_bye(from, w[0], last) {
                        Ok(()) => s.services.peer_left(from),
                        Err(e) => s.fail(Cause::new(s.rank, CauseKind::Program, e.to_string())),
                    }
                }
            }
            tag::ABORT => s.fail(decode_abort(from, &data)),
            tag::HEARTBEAT => {}
            t => s.fail(Cause::new(
                s.rank,
                CauseKind::Program,
                format!(
                    "a message with tag {t} from node {from}, which is no tag of hyfi's MPI \
                     transport: is another library sending on hyfi's communicators?"
                ),
            )),
        }
    }

    /// Runs a raw ping-pong (see [`super::raw_round_trips`]).
    fn ping_pong(&mut self, job: RawJob) {
        // What was queued before goes first (the peer may wait for it, a
        // collective's last message, before it joins the ping-pong).
        self.post();
        let peer = self.raw.process_at_rank(job.peer as i32);
        let mut req = vec![0u8; job.request];
        let mut rep = vec![0u8; job.reply];
        let mut times = Vec::with_capacity(if job.first { job.n } else { 0 });
        // The reply in pieces, as hyfi sends a frame of its size.
        let pieced = job.pieces && job.reply > PIECE;
        for i in 0..job.n {
            if job.first {
                req[..8.min(job.request)]
                    .copy_from_slice(&(i as u64).to_le_bytes()[..8.min(job.request)]);
                let t = Instant::now();
                peer.send_with_tag(&req[..], 0);
                if pieced {
                    for c in rep.chunks_mut(PIECE) {
                        peer.receive_into_with_tag(c, 0);
                    }
                } else {
                    peer.receive_into_with_tag(&mut rep[..], 0);
                }
                times.push(t.elapsed());
            } else {
                peer.receive_into_with_tag(&mut req[..], 0);
                if !pieced {
                    peer.send_with_tag(&rep[..], 0);
                    continue;
                }
                mpi::request::scope(|sc| {
                    let reqs: Vec<_> = rep
                        .chunks(PIECE)
                        .map(|c| peer.immediate_send_with_tag(sc, c, 0))
                        .collect();
                    reqs.into_iter().for_each(|r| {
                        r.wait();
                    });
                });
            }
        }
        // Silence from the peer while it was busy here is no hang.
        let now = Instant::now();
        self.heard.iter_mut().for_each(|h| *h = now);
        let _ = job.done.send(times);
    }

    /// Tells every peer that this node is alive.
    fn beat(&mut self) {
        let (me, n) = (self.s.rank, self.s.nodes);
        for to in (0..n).filter(|&p| p != me) {
            self.isend(Out {
                to,
                tag: tag::HEARTBEAT,
                class: Class::Control,
                data: Vec::new(),
            });
        }
    }

    /// Fails the node if a peer that has not left was silent too long.
    fn judge(&self, now: Instant) {
        let s = &self.s;
        if s.failure().is_some() {
            return;
        }
        for p in (0..s.nodes).filter(|&p| p != s.rank && self.byes[p] == 0) {
            let silent = now.duration_since(self.heard[p]);
            if silent > s.heartbeat {
                s.fail(Cause::new(
                    p,
                    CauseKind::Hung,
                    format!(
                        "stopped answering: node {} heard nothing from it, not even a \
                         heartbeat, for {:.1} s (HYFI_HEARTBEAT={:.1}); a stopped \
                         (SIGSTOP) or stalled process",
                        s.rank,
                        silent.as_secs_f64(),
                        s.heartbeat.as_secs_f64()
                    ),
                ));
                // The cause is the peer's, but this node found it: tell the
                // others.
                let text = super::encode_abort(&Cause::new(
                    p,
                    CauseKind::Hung,
                    "stopped answering (no heartbeat)",
                ));
                for to in (0..s.nodes).filter(|&q| q != s.rank && q != p) {
                    s.push(Out {
                        to,
                        tag: tag::ABORT,
                        class: Class::Control,
                        data: text.clone(),
                    });
                }
                return;
            }
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // Requests must complete before their buffers go (and rsmpi aborts
        // on a dropped request).
        for p in self.posted.drain(..) {
            for req in p.reqs {
                req.wait();
            }
            // SAFETY: as in `complete`.
            drop(unsafe { Vec::from_raw_parts(p.buf.0, p.buf.1, p.buf.2) });
        }
    }
}

/// How many pieces a frame of `len` bytes with `tag` travels in, if more
/// than one: a service's frame longer than a piece and no longer than
/// [`PIECED_MAX`].
fn pieces(len: usize, tag: i32) -> Option<usize> {
    let service = (1..=127).contains(&tag);
    (service && len > PIECE && len <= PIECED_MAX).then(|| len.div_ceil(PIECE))
}

/// The tag of a pieced frame's first piece: the service's tag and the
/// number of pieces, above every plain tag.
fn pieced_tag(tag: i32, n: usize) -> i32 {
    tag::PIECED + ((n as i32) << 7 | tag)
}

/// The service tag and piece count a first piece's tag carries, if it is
/// one.
fn unpieced_tag(t: i32) -> Option<(i32, usize)> {
    (t > tag::PIECED).then(|| {
        let v = t - tag::PIECED;
        (v & 127, (v >> 7) as usize)
    })
}

/// Receives a matched piece onto the end of `data`.
fn receive_appending(data: &mut Vec<u8>, msg: Message, st: &Status) {
    let len = st.count(u8::equivalent_datatype()) as usize;
    let at = data.len();
    data.resize(at + len, 0);
    msg.matched_receive_into(&mut data[at..]);
}

/// The little-endian words of a step or goodbye message (zero-padded).
fn words(data: &[u8]) -> [u64; 5] {
    let mut w = [0u64; 5];
    for (i, c) in data.chunks(8).take(5).enumerate() {
        let mut b = [0u8; 8];
        b[..c.len()].copy_from_slice(c);
        w[i] = u64::from_le_bytes(b);
    }
    w
}
