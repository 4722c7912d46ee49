//! Several nodes in one process: the node seam over channels, for unit
//! tests of the protocols that run over it (the shared memory, stealing).
//!
//! Each node has a mailbox (a control queue and a bulk queue) and a
//! delivery thread that plays the communication thread's part: it takes
//! control messages first, then bulk ones, each class in order, and hands
//! them to the node's services. Collectives meet in one shared state
//! (combined in node order, so results are reproducible). A node whose
//! [`InProcess`] is dropped says goodbye to every peer behind everything it
//! sent (the services' `peer_left`); its delivery thread keeps serving its
//! peers until every node has left, as a TCP node does after its program
//! ends. The last node to leave stops every delivery thread, so dropping
//! nodes never waits (they may be dropped on one thread, in any order).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use super::{Class, ClassTraffic, Port, Report, Service, ServiceId, Traffic};
use crate::node::{LinkError, NodeLink};

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

enum Slot {
    /// Messages that came before the service was registered.
    Pending(Vec<(usize, Vec<u8>)>),
    Ready(Arc<dyn Service>),
}

/// Counters by class: index 0 control, 1 bulk.
#[derive(Default)]
struct Counters {
    sent: [AtomicU64; 2],
    bytes_sent: [AtomicU64; 2],
    received: [AtomicU64; 2],
    bytes_received: [AtomicU64; 2],
}

fn ix(c: Class) -> usize {
    match c {
        Class::Control => 0,
        Class::Bulk => 1,
    }
}

impl Counters {
    fn class(&self, i: usize) -> ClassTraffic {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ClassTraffic {
            sent: g(&self.sent[i]),
            bytes_sent: g(&self.bytes_sent[i]),
            received: g(&self.received[i]),
            bytes_received: g(&self.bytes_received[i]),
        }
    }
}

#[derive(Default)]
struct Mailbox {
    q: Mutex<Queues>,
    cv: Condvar,
    services: Mutex<HashMap<ServiceId, Slot>>,
    counters: Counters,
}

/// The collectives' meeting point, the failure, and who has left.
struct State {
    gen: u64,
    arrived: usize,
    values: Vec<Vec<u8>>,
    result: Vec<u8>,
    failed: Option<String>,
    left: Vec<bool>,
}

struct Hub {
    nodes: Vec<Mailbox>,
    /// The delivery threads, joined by the last node to leave.
    delivery: Mutex<Vec<JoinHandle<()>>>,
    st: Mutex<State>,
    cv: Condvar,
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
            for s in ready(mb) {
                s.failed(&why);
            }
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

/// The services registered so far on `mb`.
fn ready(mb: &Mailbox) -> Vec<Arc<dyn Service>> {
    lock(&mb.services)
        .values()
        .filter_map(|s| match s {
            Slot::Ready(s) => Some(s.clone()),
            Slot::Pending(_) => None,
        })
        .collect()
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
            Item::Bye => {
                for s in ready(mb) {
                    s.peer_left(from);
                }
            }
            Item::Msg { service, payload } => {
                mb.counters.received[ix(class)].fetch_add(1, Ordering::Relaxed);
                mb.counters.bytes_received[ix(class)]
                    .fetch_add(payload.len() as u64, Ordering::Relaxed);
                // The lock is held while the handler runs, so messages
                // reach the service in the order they came.
                let mut slots = lock(&mb.services);
                let r = match slots
                    .entry(service)
                    .or_insert_with(|| Slot::Pending(Vec::new()))
                {
                    Slot::Pending(v) => {
                        v.push((from, payload));
                        Ok(())
                    }
                    Slot::Ready(s) => s.frame(from, payload),
                };
                drop(slots);
                if let Err(why) = r {
                    hub.fail(format!("node {me}: {service} of node {from}: {why}"));
                }
            }
        }
    }
}

/// One node of an in-process job: a [`NodeLink`] whose peers are other
/// runtimes of this process. See the [module docs](self).
///
/// ```
/// use hyfi_core::link::InProcess;
/// use hyfi_core::NodeLink;
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
        let n = payload.len();
        self.hub.push(
            to,
            Frame {
                from: self.me,
                class,
                item: Item::Msg { service, payload },
            },
        )?;
        let c = &self.hub.nodes[self.me].counters;
        c.sent[ix(class)].fetch_add(1, Ordering::Relaxed);
        c.bytes_sent[ix(class)].fetch_add(n as u64, Ordering::Relaxed);
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
        assert!(n > 0, "InProcess::connect needs at least one node");
        let hub = Arc::new(Hub {
            nodes: (0..n).map(|_| Mailbox::default()).collect(),
            delivery: Mutex::new(Vec::new()),
            st: Mutex::new(State {
                gen: 0,
                arrived: 0,
                values: vec![Vec::new(); n],
                result: Vec::new(),
                failed: None,
                left: vec![false; n],
            }),
            cv: Condvar::new(),
        });
        for me in 0..n {
            let h = hub.clone();
            let t = std::thread::Builder::new()
                .name(format!("hyfi-inproc-{me}"))
                .spawn(move || deliver(h, me))
                .expect("hyfi: spawning an in-process delivery thread");
            lock(&hub.delivery).push(t);
        }
        (0..n)
            .map(|me| {
                Arc::new(InProcess {
                    me,
                    hub: hub.clone(),
                    reports: Mutex::new(Vec::new()),
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
        let n = self.hub.nodes.len();
        let mut st = lock(&self.hub.st);
        let gen = st.gen;
        st.values[self.me] = value.to_vec();
        st.arrived += 1;
        if st.arrived == n {
            // In node order, so the result is the same on every run.
            let mut acc = std::mem::take(&mut st.values[0]);
            for i in 1..n {
                combine(&mut acc, &st.values[i]);
            }
            st.result = acc;
            st.arrived = 0;
            st.gen += 1;
            self.hub.cv.notify_all();
        }
        loop {
            if st.gen != gen {
                // The next collective cannot complete (and overwrite the
                // result) before this node enters it.
                value.copy_from_slice(&st.result);
                return Ok(());
            }
            if let Some(f) = &st.failed {
                return Err(f.clone().into());
            }
            if let Some(p) = st.left.iter().position(|l| *l) {
                return Err(format!(
                    "node {} waits for node {p} at a barrier or reduction, but node {p} \
                     ended its program",
                    self.me
                )
                .into());
            }
            st = self.hub.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }
    fn abort(&self, cause: &str) {
        self.hub.fail(format!("node {} aborted: {cause}", self.me));
    }
    fn port(&self) -> Option<Arc<dyn Port>> {
        Some(Arc::new(InPort {
            me: self.me,
            hub: self.hub.clone(),
        }))
    }
    fn set_service(&self, id: ServiceId, service: Arc<dyn Service>) -> Result<(), LinkError> {
        let mb = &self.hub.nodes[self.me];
        let mut slots = lock(&mb.services);
        let early = match slots.insert(id, Slot::Ready(service.clone())) {
            None => Vec::new(),
            Some(Slot::Pending(v)) => v,
            Some(Slot::Ready(old)) => {
                slots.insert(id, Slot::Ready(old));
                return Err(format!("node {}: {id} was registered twice", self.me).into());
            }
        };
        let mut r = Ok(());
        for (from, payload) in early {
            if let Err(why) = service.frame(from, payload) {
                r = Err(format!("node {}: {id} of node {from}: {why}", self.me));
                break;
            }
        }
        drop(slots);
        if let Err(why) = r {
            self.hub.fail(why.clone());
            return Err(why.into());
        }
        if let Some(f) = self.hub.failure() {
            service.failed(&f);
        }
        Ok(())
    }
    fn traffic(&self) -> Option<Traffic> {
        let c = &self.hub.nodes[self.me].counters;
        Some(Traffic {
            control: c.class(0),
            bulk: c.class(1),
            refused: 0,
        })
    }
    fn add_report(&self, section: Report) {
        lock(&self.reports).push(section);
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        let me = self.me;
        if std::thread::panicking() {
            self.hub.fail(format!("node {me}'s program panicked"));
        }
        // Goodbye, behind everything this node sent.
        for to in (0..self.hub.nodes.len()).filter(|&p| p != me) {
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
            st.left.iter().all(|l| *l)
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
            lock(&mb.services).clear();
        }
    }
}
