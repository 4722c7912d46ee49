//! Several nodes in one process: the node seam over channels, for unit
//! tests of the protocols that run over it (the shared memory, stealing).
//!
//! Each node has a mailbox (a control queue and a bulk queue) and a
//! delivery thread that plays the communication thread's part: it takes
//! control messages first, then bulk ones, each class in order, and hands
//! them to the node's services. Collectives run the seam's algorithm
//! ([`super::collective`], so results are bit-identical to TCP's and
//! MPI's), their messages meeting in one shared state. A node whose
//! [`InProcess`] is dropped says goodbye to every peer behind everything it
//! sent (the services' `peer_left`); its delivery thread keeps serving its
//! peers until every node has left, as a TCP node does after its program
//! ends. The last node to leave stops every delivery thread, so dropping
//! nodes never waits (they may be dropped on one thread, in any order).
//!
//! The failures a TCP job detects are detected here too, with the same
//! words:
//! * **SPMD steps.** Each node hands every step it enters
//!   ([`NodeLink::enter_step`]) to the next node of the ring, and its
//!   goodbye hands its step count to every node, checked by the same
//!   [`Steps`] as over TCP: a node that takes a step the others do not
//!   ends the job, naming both. In one process the hand-over is a call,
//!   not a message, so the mismatch is found before either node can enter
//!   the collective that follows the step (over TCP the step message goes
//!   ahead of the collective's on the same connection, to the same end).
//! * **A peer that stops answering.** Over TCP, heartbeats find a peer
//!   whose communication thread no longer runs. Here a node's delivery
//!   thread is its communication thread: a watchdog fails the job when one
//!   has spent longer than the limit (5 s, `HYFI_HEARTBEAT`'s default;
//!   [`InProcess::connect_with_limit`]) in one message, since its peers
//!   would wait for it forever; and a service that panics on a message
//!   fails the job with the panic's message rather than killing the thread
//!   silently.

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::collective::{self, Channel, Dir};
use super::services::{ServiceError, ServiceTable};
use super::spmd::Steps;
use super::{
    Class, HostWords, Port, Report, Service, ServiceId, Traffic, TrafficCounters, HOST_WORDS,
};
use crate::node::{LinkError, NodeLink, Step};

/// How long a delivery thread may spend in one message before its peers
/// count it as stopped: `HYFI_HEARTBEAT`'s default.
const DEFAULT_LIMIT: Duration = Duration::from_secs(5);

enum Item {
    Msg {
        service: ServiceId,
        payload: Vec<u8>,
    },
    /// The sender's program ended: behind everything it sent.
    Bye,
}

struct Frame {
    from: usize,
    class: Class,
    item: Item,
}

#[derive(Default)]
struct Queues {
    control: VecDeque<Frame>,
    bulk: VecDeque<Frame>,
    stop: bool,
}

struct Mailbox {
    q: Mutex<Queues>,
    cv: Condvar,
    services: ServiceTable,
    counters: TrafficCounters,
    /// This node's SPMD steps and its ring predecessor's.
    steps: Mutex<Steps>,
    /// What the delivery thread is handling, and since when (for the
    /// watchdog): `(since, service, from)`.
    busy: Mutex<Option<(Instant, ServiceId, usize)>>,
}

impl Mailbox {
    fn new(me: usize) -> Mailbox {
        Mailbox {
            q: Mutex::default(),
            cv: Condvar::new(),
            services: ServiceTable::new(),
            counters: TrafficCounters::default(),
            steps: Mutex::new(Steps::new(me)),
            busy: Mutex::new(None),
        }
    }
}

/// The collectives' meeting point, the failure, and who has left.
struct State {
    /// Collective messages not yet taken, by (receiver, sender, sequence
    /// number, direction).
    coll: HashMap<(usize, usize, u64, Dir), Vec<u8>>,
    failed: Option<String>,
    left: Vec<bool>,
}

impl State {
    /// Every node has left: the delivery threads stop, the watchdog ends.
    fn all_left(&self) -> bool {
        self.left.iter().all(|l| *l)
    }
}

struct Hub {
    nodes: Vec<Mailbox>,
    /// The delivery threads, joined by the last node to leave.
    delivery: Mutex<Vec<JoinHandle<()>>>,
    st: Mutex<State>,
    cv: Condvar,
    /// How long a delivery thread may spend in one message.
    limit: Duration,
    /// The nodes' [`HostWords`]: one process, so every node reaches every
    /// node's.
    words: Arc<Words>,
}

/// The in-process nodes' shared words.
struct Words(Vec<Box<[AtomicU64; HOST_WORDS]>>);

impl HostWords for Words {
    fn words(&self, node: usize) -> Option<&[AtomicU64; HOST_WORDS]> {
        self.0.get(node).map(|w| &**w)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Hub {
    /// Fails every node with `why` (the first failure wins).
    fn fail(&self, why: String) {
        {
            let mut st = lock(&self.st);
            if st.failed.is_some() {
                return;
            }
            st.failed = Some(why.clone());
            self.cv.notify_all();
        }
        for mb in &self.nodes {
            mb.services.fail_all(&why);
        }
    }

    fn failure(&self) -> Option<String> {
        lock(&self.st).failed.clone()
    }

    fn push(&self, to: usize, frame: Frame) -> Result<(), LinkError> {
        let from = frame.from;
        let Some(mb) = self.nodes.get(to).filter(|_| to != from) else {
            return Err(format!("node {from}: no link to node {to}").into());
        };
        if let Some(f) = self.failure() {
            return Err(f.into());
        }
        let mut q = lock(&mb.q);
        if q.stop {
            return Err(format!("node {from}: node {to} has closed its link").into());
        }
        match frame.class {
            Class::Control => q.control.push_back(frame),
            Class::Bulk => q.bulk.push_back(frame),
        }
        mb.cv.notify_one();
        Ok(())
    }
}

/// One node's delivery thread: control first, then bulk, until stopped
/// with empty queues.
fn deliver(hub: Arc<Hub>, me: usize) {
    let mb = &hub.nodes[me];
    loop {
        let frame = {
            let mut q = lock(&mb.q);
            loop {
                if let Some(f) = q.control.pop_front().or_else(|| q.bulk.pop_front()) {
                    break Some(f);
                }
                if q.stop {
                    break None;
                }
                q = mb.cv.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        let Some(Frame { from, class, item }) = frame else {
            return;
        };
        match item {
            Item::Bye => mb.services.peer_left(from),
            Item::Msg { service, payload } => {
                mb.counters.count_received(class, payload.len());
                let r = handle(mb, service, from, || {
                    mb.services.deliver(from, service.number(), payload)
                });
                if let Err(why) = r {
                    hub.fail(format!("node {me}: {service} of node {from}: {why}"));
                }
            }
        }
    }
}

/// Runs `f` (a delivery to `service`'s handler), marked busy for the
/// watchdog. A panicking handler must not end the delivery thread silently
/// (its peers would wait forever): it is an error with the panic's message.
fn handle(
    mb: &Mailbox,
    service: ServiceId,
    from: usize,
    f: impl FnOnce() -> Result<(), ServiceError>,
) -> Result<(), String> {
    *lock(&mb.busy) = Some((Instant::now(), service, from));
    let r = catch_unwind(AssertUnwindSafe(f));
    *lock(&mb.busy) = None;
    match r {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(p) => Err(format!("its handler panicked: {}", panic_message(&*p))),
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(not a string)".to_string())
}

/// The watchdog: fails the job when a delivery thread has spent longer
/// than the limit in one message (see the module docs), until every node
/// has left.
fn watch(hub: Arc<Hub>) {
    let tick = hub.limit / 4;
    let mut st = lock(&hub.st);
    while !st.all_left() && st.failed.is_none() {
        st = hub
            .cv
            .wait_timeout(st, tick)
            .unwrap_or_else(|e| e.into_inner())
            .0;
        let stuck = hub.nodes.iter().enumerate().find_map(|(me, mb)| {
            let b = *lock(&mb.busy);
            b.filter(|(since, _, _)| since.elapsed() > hub.limit)
                .map(|(since, service, from)| (me, since.elapsed(), service, from))
        });
        if let Some((me, t, service, from)) = stuck {
            drop(st);
            hub.fail(format!(
                "node {me} stopped answering: its delivery thread has spent {:.1} s in one \
                 message of {service} from node {from} (limit {:.1} s); a handler that \
                 blocks or loops stalls every peer: a service must not wait in `frame`",
                t.as_secs_f64(),
                hub.limit.as_secs_f64()
            ));
            return;
        }
    }
}

/// One node of an in-process job: a [`NodeLink`] whose peers are other
/// runtimes of this process. See the [module docs](crate::link::InProcess) of `link::in_process`.
///
/// ```
/// use hyfi::layers::link::InProcess;
/// use hyfi::layers::NodeLink;
///
/// let nodes = InProcess::connect(3);
/// let handles: Vec<_> = nodes
///     .into_iter()
///     .map(|n| {
///         std::thread::spawn(move || {
///             let mut v = (n.my_node() as u64 + 1).to_le_bytes();
///             n.allreduce(&mut v, &mut |a, b| {
///                 let s = u64::from_le_bytes(a[..8].try_into().unwrap())
///                     + u64::from_le_bytes(b[..8].try_into().unwrap());
///                 a.copy_from_slice(&s.to_le_bytes());
///             })
///             .unwrap();
///             u64::from_le_bytes(v)
///         })
///     })
///     .collect();
/// for h in handles {
///     assert_eq!(h.join().unwrap(), 6);
/// }
/// ```
pub struct InProcess {
    me: usize,
    hub: Arc<Hub>,
    reports: Mutex<Vec<Report>>,
    /// The collectives this node entered.
    seq: AtomicU64,
}

impl std::fmt::Debug for InProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "InProcess(node {} of {})", self.me, self.hub.nodes.len())
    }
}

/// [`InProcess`]'s sending side.
struct InPort {
    me: usize,
    hub: Arc<Hub>,
}

impl Port for InPort {
    fn send_with(
        &self,
        to: usize,
        service: ServiceId,
        class: Class,
        len_hint: usize,
        fill: &mut dyn FnMut(&mut Vec<u8>),
    ) -> Result<usize, LinkError> {
        let mut payload = Vec::with_capacity(len_hint);
        fill(&mut payload);
        self.send_vec(to, service, class, payload)
    }

    fn send_vec(
        &self,
        to: usize,
        service: ServiceId,
        class: Class,
        payload: Vec<u8>,
    ) -> Result<usize, LinkError> {
        let n = payload.len();
        self.hub.push(
            to,
            Frame {
                from: self.me,
                class,
                item: Item::Msg { service, payload },
            },
        )?;
        self.hub.nodes[self.me].counters.count_sent(class, n);
        Ok(n)
    }
}

impl InProcess {
    /// `n` nodes connected to each other (index = node), each with its
    /// delivery thread running.
    ///
    /// # Panics
    ///
    /// If `n` is 0 or a delivery thread cannot be started.
    pub fn connect(n: usize) -> Vec<Arc<InProcess>> {
        Self::connect_with_limit(n, DEFAULT_LIMIT)
    }

    /// As [`connect`](Self::connect), with `limit` for how long a delivery
    /// thread may spend in one message before the job fails with "node k
    /// stopped answering" (see the module docs).
    ///
    /// # Panics
    ///
    /// If `n` is 0, `limit` is zero, or a thread cannot be started.
    pub fn connect_with_limit(n: usize, limit: Duration) -> Vec<Arc<InProcess>> {
        assert!(n > 0, "InProcess::connect needs at least one node");
        assert!(
            !limit.is_zero(),
            "InProcess::connect_with_limit needs a limit above zero"
        );
        let hub = Arc::new(Hub {
            nodes: (0..n).map(Mailbox::new).collect(),
            delivery: Mutex::new(Vec::new()),
            st: Mutex::new(State {
                coll: HashMap::new(),
                failed: None,
                left: vec![false; n],
            }),
            cv: Condvar::new(),
            limit,
            words: Arc::new(Words(
                (0..n)
                    .map(|_| Box::new(std::array::from_fn(|_| AtomicU64::new(0))))
                    .collect(),
            )),
        });
        for me in 0..n {
            let h = hub.clone();
            let t = std::thread::Builder::new()
                .name(format!("hyfi-inproc-{me}"))
                .spawn(move || deliver(h, me))
                .expect("hyfi: spawning an in-process delivery thread");
            lock(&hub.delivery).push(t);
        }
        let h = hub.clone();
        let t = std::thread::Builder::new()
            .name("hyfi-inproc-watchdog".to_string())
            .spawn(move || watch(h))
            .expect("hyfi: spawning the in-process watchdog");
        lock(&hub.delivery).push(t);
        (0..n)
            .map(|me| {
                Arc::new(InProcess {
                    me,
                    hub: hub.clone(),
                    reports: Mutex::new(Vec::new()),
                    seq: AtomicU64::new(0),
                })
            })
            .collect()
    }

    /// The sections the layers added ([`NodeLink::add_report`]), joined.
    pub fn report(&self) -> String {
        lock(&self.reports).iter().filter_map(|r| r()).collect()
    }
}

impl NodeLink for InProcess {
    fn num_nodes(&self) -> usize {
        self.hub.nodes.len()
    }
    fn my_node(&self) -> usize {
        self.me
    }
    fn barrier(&self) -> Result<(), LinkError> {
        self.allreduce(&mut [], &mut |_, _| {})
    }
    fn allreduce(
        &self,
        value: &mut [u8],
        combine: &mut dyn FnMut(&mut [u8], &[u8]),
    ) -> Result<(), LinkError> {
        // The seam's algorithm, so that results are bit-identical to every
        // other transport's; its messages meet in the hub, not through the
        // delivery threads (a collective completes while a service blocks
        // its node's delivery thread, as over TCP, where they are the
        // inbox's).
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        collective::allreduce(self, seq, value, combine)
    }
    fn allreduce_vec(
        &self,
        value: &mut Vec<u8>,
        combine: &mut dyn FnMut(&mut Vec<u8>, &[u8]),
    ) -> Result<(), LinkError> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        collective::allreduce_vec(self, seq, value, combine)
    }
    fn abort(&self, cause: &str) {
        self.hub.fail(format!("node {} aborted: {cause}", self.me));
    }
    fn enter_step(&self, step: Step) -> Result<(), LinkError> {
        let (me, n) = (self.me, self.hub.nodes.len());
        if n < 2 {
            return Ok(());
        }
        if let Some(f) = self.hub.failure() {
            return Err(f.into());
        }
        // Compared with the predecessor's steps here, then handed to the
        // successor, which compares them with its own (never both locks at
        // once: each guard is dropped at the end of its statement).
        let next = (me + 1) % n;
        let entered = lock(&self.hub.nodes[me].steps).enter((me + n - 1) % n, step);
        let checked = match entered {
            Ok(k) => {
                let handed = lock(&self.hub.nodes[next].steps).on_step(me, k, step);
                handed.map_err(|e| format!("node {next}: {e}"))
            }
            Err(e) => Err(format!("node {me}: {e}")),
        };
        checked.map_err(|why| {
            self.hub.fail(why.clone());
            why.into()
        })
    }
    fn host_words(&self) -> Option<Arc<dyn HostWords>> {
        (self.hub.nodes.len() > 1).then(|| self.hub.words.clone() as Arc<dyn HostWords>)
    }
    fn port(&self) -> Option<Arc<dyn Port>> {
        Some(Arc::new(InPort {
            me: self.me,
            hub: self.hub.clone(),
        }))
    }
    fn set_service(&self, id: ServiceId, service: Arc<dyn Service>) -> Result<(), LinkError> {
        let mb = &self.hub.nodes[self.me];
        // Frames that came early are handed over by `install`; one that
        // fails, or panics, fails the job as a delivery's would.
        let r = catch_unwind(AssertUnwindSafe(|| {
            mb.services.install(id, service.clone())
        }));
        let why = match r {
            Ok(Ok(())) => None,
            Ok(Err(e @ ServiceError::Twice { .. })) => {
                return Err(format!("node {}: {e}", self.me).into())
            }
            Ok(Err(e @ ServiceError::Failed { from, .. })) => {
                Some(format!("node {}: {id} of node {from}: {e}", self.me))
            }
            Err(p) => Some(format!(
                "node {}: {id}: its handler panicked: {}",
                self.me,
                panic_message(&*p)
            )),
        };
        if let Some(why) = why {
            self.hub.fail(why.clone());
            return Err(why.into());
        }
        if let Some(f) = self.hub.failure() {
            service.failed(&f);
        }
        Ok(())
    }
    fn traffic(&self) -> Option<Traffic> {
        Some(self.hub.nodes[self.me].counters.traffic())
    }
    fn add_report(&self, section: Report) {
        lock(&self.reports).push(section);
    }
}

impl Channel for InProcess {
    type Error = LinkError;
    fn rank(&self) -> usize {
        self.me
    }
    fn nodes(&self) -> usize {
        self.hub.nodes.len()
    }
    fn send(&self, to: usize, seq: u64, dir: Dir, data: &[u8]) -> Result<(), LinkError> {
        let mut st = lock(&self.hub.st);
        if let Some(f) = &st.failed {
            return Err(f.clone().into());
        }
        st.coll.insert((to, self.me, seq, dir), data.to_vec());
        self.hub.cv.notify_all();
        Ok(())
    }
    fn recv(&self, from: usize, seq: u64, dir: Dir) -> Result<Vec<u8>, LinkError> {
        let mut st = lock(&self.hub.st);
        loop {
            if let Some(d) = st.coll.remove(&(self.me, from, seq, dir)) {
                return Ok(d);
            }
            if let Some(f) = &st.failed {
                return Err(f.clone().into());
            }
            if st.left[from] {
                return Err(format!(
                    "node {} waits for node {from} at a barrier or reduction, but node {from} \
                     ended its program",
                    self.me
                )
                .into());
            }
            st = self.hub.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        let me = self.me;
        if std::thread::panicking() {
            self.hub.fail(format!("node {me}'s program panicked"));
        }
        // Goodbye: the step count to every peer at once (see `enter_step`),
        // the `Bye` behind everything this node sent.
        let (steps, last) = lock(&self.hub.nodes[me].steps).last();
        for to in (0..self.hub.nodes.len()).filter(|&p| p != me) {
            let checked = lock(&self.hub.nodes[to].steps).on_bye(me, steps, last);
            if let Err(e) = checked {
                self.hub.fail(format!("node {to}: {e}"));
            }
            let _ = self.hub.push(
                to,
                Frame {
                    from: me,
                    class: Class::Bulk,
                    item: Item::Bye,
                },
            );
        }
        // This node's delivery thread serves the peers until every node
        // has left; the last one to leave stops them all.
        let last = {
            let mut st = lock(&self.hub.st);
            st.left[me] = true;
            self.hub.cv.notify_all();
            st.all_left()
        };
        if !last {
            return;
        }
        for mb in &self.hub.nodes {
            lock(&mb.q).stop = true;
            mb.cv.notify_one();
        }
        let threads = std::mem::take(&mut *lock(&self.hub.delivery));
        for t in threads {
            let _ = t.join();
        }
        // Services hold a port, which holds the hub, which holds them.
        for mb in &self.hub.nodes {
            mb.services.clear();
        }
    }
}
