//! The suite's side of the node seam: three services on every node's link
//! (frames of each class, and the replies), and the state the calling
//! thread waits on.
//!
//! A [`Service::frame`] runs on the transport's delivery thread and must
//! not wait, so the handlers only check, record, reply (sending never
//! blocks) and wake; the thread that runs the check waits on a condition
//! variable, with a deadline, and never on the delivery thread. The one
//! exception is on purpose: checks 5 and [`stop_node`](super::stop_node)
//! stall the delivery thread to make a transport queue messages, or stop
//! answering.
//!
//! The handler of a frame is not told the frame's class, so each class has
//! a service of its own; a frame is known by its place in its sender's
//! sequence of that class, and checked against the frame the plan puts
//! there: the frames carry nothing but the pattern, and a frame of 0
//! bytes is a frame like any other.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::frames::{self, Plan};
use crate::layers::link::{Class, FrameError, Port, Service, ServiceId};
use crate::layers::RuntimeExt;
use crate::Runtime;

/// Frames of check 4 and 5 sent as [`Class::Bulk`].
pub(super) const BULK: ServiceId = ServiceId::new(100, "the conformance suite (bulk frames)");
/// Frames sent as [`Class::Control`].
pub(super) const CONTROL: ServiceId = ServiceId::new(101, "the conformance suite (control frames)");
/// A receiver's reply to each frame of check 4: its digest.
pub(super) const REPLIES: ServiceId = ServiceId::new(102, "the conformance suite's replies");

/// Index of a class in per-class arrays.
pub(super) fn ix(c: Class) -> usize {
    match c {
        Class::Control => 0,
        Class::Bulk => 1,
    }
}

/// The service that carries frames of class `c`.
pub(super) fn service_of(c: Class) -> ServiceId {
    match c {
        Class::Control => CONTROL,
        Class::Bulk => BULK,
    }
}

/// What the node's services expect, set by the calling thread before the
/// barrier that lets the others send.
#[derive(Clone)]
pub(super) enum Expect {
    /// Nothing: a frame is an error.
    Nothing,
    /// Check 4: the plan's frames from every other node, each answered.
    Frames(Arc<Plan>),
    /// Check 5: the plan's frames, recorded in the order they arrive; the
    /// first bulk frame stalls the delivery thread for `stall`.
    Overtake { plan: Arc<Plan>, stall: Duration },
    /// `stop_node`: the first control frame stalls the delivery thread for
    /// this long (or until the node fails).
    Stall(Duration),
}

/// What the services saw, for the calling thread.
pub(super) struct State {
    pub expect: Expect,
    /// Frames received, per sender and class.
    pub got: Vec<[usize; 2]>,
    /// Their bytes.
    pub bytes: u64,
    /// Digests of the frames this node sent, per receiver and class.
    pub sent: Vec<[Vec<u64>; 2]>,
    /// Replies received, per receiver and class.
    pub replies: Vec<[usize; 2]>,
    /// Check 5: frames in the order they arrived.
    pub arrivals: Vec<(Class, usize)>,
    /// `stop_node`: the stall began, and ended.
    pub stalls: (bool, bool),
    /// What went wrong (the node's own words).
    pub errors: Vec<String>,
    /// The node failed: why.
    pub failed: Option<String>,
    /// Peers whose program ended.
    pub left: Vec<bool>,
}

/// A node's suite: the state its services share with the calling thread.
pub(super) struct Suite {
    pub me: usize,
    pub nodes: usize,
    pub port: Arc<dyn Port>,
    st: Mutex<State>,
    cv: Condvar,
}

/// One of the suite's services.
struct Endpoint {
    suite: Arc<Suite>,
    /// The class of the frames it takes; `None`: the replies.
    class: Option<Class>,
}

impl Service for Endpoint {
    fn frame(&self, from: usize, payload: Vec<u8>) -> Result<(), FrameError> {
        match self.class {
            Some(c) => self.suite.on_frame(from, c, payload),
            None => self.suite.on_reply(from, &payload),
        }
        Ok(())
    }
    fn failed(&self, why: &str) {
        let mut st = self.suite.lock();
        st.failed.get_or_insert_with(|| why.to_string());
        self.suite.cv.notify_all();
    }
    fn peer_left(&self, peer: usize) {
        let mut st = self.suite.lock();
        if let Some(l) = st.left.get_mut(peer) {
            *l = true;
        }
        self.suite.cv.notify_all();
    }
}

impl Suite {
    /// The runtime's suite, registered on its link the first time; `None`
    /// on one node (a link of one node carries no services).
    pub fn on(rt: &Runtime) -> Result<Option<Arc<Suite>>, String> {
        let link = rt.link();
        let (me, nodes) = (link.my_node(), link.num_nodes());
        if nodes < 2 {
            return Ok(None);
        }
        if let Some(s) = rt.layer_state::<Suite>() {
            return Ok(Some(s));
        }
        let port = link
            .port()
            .ok_or_else(|| format!("node {me}: the link of {nodes} nodes has no port"))?;
        let suite = Arc::new(Suite {
            me,
            nodes,
            port,
            st: Mutex::new(State {
                expect: Expect::Nothing,
                got: vec![[0; 2]; nodes],
                bytes: 0,
                sent: vec![[Vec::new(), Vec::new()]; nodes],
                replies: vec![[0; 2]; nodes],
                arrivals: Vec::new(),
                stalls: (false, false),
                errors: Vec::new(),
                failed: None,
                left: vec![false; nodes],
            }),
            cv: Condvar::new(),
        });
        for (id, class) in [
            (BULK, Some(Class::Bulk)),
            (CONTROL, Some(Class::Control)),
            (REPLIES, None),
        ] {
            let endpoint = Endpoint {
                suite: suite.clone(),
                class,
            };
            link.set_service(id, Arc::new(endpoint))
                .map_err(|e| format!("node {me}: registering {id}: {e}"))?;
        }
        rt.set_layer_state(suite.clone())
            .map_err(|e| format!("node {me}: keeping the suite on the runtime: {e}"))?;
        Ok(Some(suite))
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Expects `e` from now on, with every count back to zero.
    pub fn expect(&self, e: Expect) {
        let mut st = self.lock();
        st.expect = e;
        st.got.iter_mut().for_each(|g| *g = [0; 2]);
        st.replies.iter_mut().for_each(|g| *g = [0; 2]);
        st.sent
            .iter_mut()
            .for_each(|s| s.iter_mut().for_each(Vec::clear));
        st.bytes = 0;
        st.arrivals.clear();
        st.stalls = (false, false);
        st.errors.clear();
    }

    /// Records the digest of frame `k` of class `c` to node `to`, before it
    /// is sent (its reply may come back before `send_with` returns).
    pub fn record_sent(&self, to: usize, c: Class, digest: u64) {
        self.lock().sent[to][ix(c)].push(digest);
    }

    /// Whether `f` holds of the state now.
    pub fn peek(&self, f: impl Fn(&State) -> bool) -> bool {
        f(&self.lock())
    }

    /// Waits until `done` holds, the node fails, or `deadline` passes
    /// (then the error says what was missing, by `missing`).
    pub fn wait(
        &self,
        deadline: Instant,
        done: impl Fn(&State) -> bool,
        missing: impl Fn(&State) -> String,
    ) -> Result<(), String> {
        let mut st = self.lock();
        loop {
            if done(&st) {
                return Ok(());
            }
            if let Some(why) = &st.failed {
                return Err(format!(
                    "node {}: the node failed while waiting ({}): {why}",
                    self.me,
                    missing(&st)
                ));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(format!(
                    "node {}: {} after {:.0} s",
                    self.me,
                    missing(&st),
                    super::WAIT_BOUND.as_secs_f64()
                ));
            }
            st = self
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn error(&self, e: String) {
        let mut st = self.lock();
        st.errors.push(format!("node {}: {e}", self.me));
        self.cv.notify_all();
    }

    /// A frame of class `c` from node `from`, on the delivery thread.
    fn on_frame(&self, from: usize, c: Class, payload: Vec<u8>) {
        if from >= self.nodes || from == self.me {
            return self.error(format!(
                "a {c:?} frame came from node {from}, which is no peer"
            ));
        }
        let (expect, k) = {
            let st = self.lock();
            (st.expect.clone(), st.got[from][ix(c)])
        };
        let plan = match expect {
            Expect::Frames(ref plan) | Expect::Overtake { ref plan, .. } => plan.clone(),
            Expect::Stall(d) => return self.stall(c, d),
            Expect::Nothing => {
                return self.error(format!(
                    "a {c:?} frame of {} bytes from node {from} came when none was expected",
                    payload.len()
                ))
            }
        };
        // Checked outside the lock: 64 MiB take a while.
        let verdict = plan.check(from, self.me, c, k, &payload);
        let digest = frames::digest(&payload);
        {
            let mut st = self.lock();
            if let Err(e) = verdict {
                st.errors.push(format!("node {}: {e}", self.me));
            }
            st.got[from][ix(c)] += 1;
            st.bytes += payload.len() as u64;
            if let Expect::Overtake { .. } = expect {
                st.arrivals.push((c, k));
            }
            self.cv.notify_all();
        }
        match expect {
            Expect::Frames(_) => {
                let reply = frames::reply(c, k, payload.len(), digest);
                if let Err(e) = self.port.send_bytes(from, REPLIES, Class::Control, &reply) {
                    self.error(format!("replying to node {from}: {e}"));
                }
            }
            Expect::Overtake { stall, .. } if c == Class::Bulk && k == 0 => {
                // On purpose: the delivery thread stalls, so that what the
                // sender queues behind this frame waits.
                std::thread::sleep(stall);
            }
            _ => {}
        }
    }

    /// `stop_node`'s stall: the first control frame holds the delivery
    /// thread for `d`, or until the node fails (a transport may be unable
    /// to tell a service whose handler is running).
    fn stall(&self, c: Class, d: Duration) {
        let mut st = self.lock();
        if c != Class::Control || st.stalls.0 {
            return;
        }
        st.stalls.0 = true;
        self.cv.notify_all();
        let until = Instant::now() + d;
        while st.failed.is_none() {
            let now = Instant::now();
            if now >= until {
                break;
            }
            st = self
                .cv
                .wait_timeout(st, until - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        st.stalls.1 = true;
        self.cv.notify_all();
    }

    /// A reply from node `from` to a frame this node sent it.
    fn on_reply(&self, from: usize, payload: &[u8]) {
        if from >= self.nodes || from == self.me {
            return self.error(format!("a reply came from node {from}, which is no peer"));
        }
        let Some((c, k, len, digest)) = frames::parse_reply(payload) else {
            return self.error(format!(
                "node {from} replied with {} bytes, not a reply",
                payload.len()
            ));
        };
        let mut st = self.lock();
        let due = st.replies[from][ix(c)];
        let sent = st.sent[from][ix(c)].get(k).copied();
        st.replies[from][ix(c)] += 1;
        drop(st);
        if k != due {
            return self.error(format!(
                "node {from}'s reply to {c:?} frame #{k} came where its reply to #{due} was due: \
                 frames of one class, or the replies, were reordered"
            ));
        }
        match sent {
            Some(d) if d == digest => {}
            Some(d) => self.error(format!(
                "node {from} received {c:?} frame #{k} ({len} bytes) with digest {digest:#018x}, \
                 node {} sent {d:#018x}",
                self.me
            )),
            None => self.error(format!(
                "node {from} replied to {c:?} frame #{k}, which this node had not sent"
            )),
        }
        self.cv.notify_all();
    }
}
