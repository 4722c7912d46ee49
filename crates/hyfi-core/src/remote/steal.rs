//! Fork-join across nodes, the messaging side (paper §3.5): the messages
//! of start-up distribution, cross-node stealing, results and termination.
//!
//! The node's side (module `balance`) decides *what* moves: which
//! filaments a donor gives, where received ones run, how a parent gets its
//! result. This module moves it, through the node seam only
//! ([`crate::link`]): it is the node's [`SERVICE`] service, so every message is handled
//! on the delivery (communication) thread as it arrives, without waking a
//! server thread: a donor answers a steal request while its processors
//! keep computing. Steal requests travel as [`Class::Control`] (they
//! overtake queued filaments and results); everything else as
//! [`Class::Bulk`]. Any transport that implements the seam carries it:
//! TCP (hyfi-net) or [`crate::link::InProcess`] (tests).
//!
//! | message      | from → to          | meaning                                            |
//! |--------------|--------------------|----------------------------------------------------|
//! | `StealReq`   | idle node → donor  | "give me work" (one request out per node at a time) |
//! | `StealReply` | donor → idle node  | half the donor's ready filaments (maybe none)       |
//! | `Push`       | parent → slot      | a start-up filament for one processor               |
//! | `Result`     | runner → parent    | a shipped filament's encoded result, or its failure |
//! | `Done`       | node 0 → all       | the root returned: the run is over, with its result |
//!
//! Every message names its run (runs are numbered alike on every node).
//! Filaments and results of a run never outlive it (a parent waits for each
//! child), so the only stale messages are requests and empty replies, which
//! are answered or dropped. A node that has not begun a run yet keeps that
//! run's `Push` and `Done` messages until it does.
//!
//! **Asking.** An idle node asks the other nodes in turn; after a round in
//! which every one refused, it waits before the next round (from
//! [`MIN_BACKOFF`], doubling up to [`MAX_BACKOFF`]), so a node at the end of
//! a run does not flood the others. A refusing donor asks its processors
//! for a real fork, so the next request usually finds work.
//!
//! **Asking a node of the same host** goes through the memory the two
//! share where the link lends some (module `host`): the thief writes the
//! donor's pruning words, and a processor of the donor answers at its next
//! portable fork (or at once, if it idles), with no message to wake anyone.
//! A request not answered within [`DIRECT_WAIT`] (a donor in a long leaf,
//! or asleep) is sent as a `StealReq` after all, marked `direct`; the
//! donor's communication thread answers it only if no processor has taken
//! it meanwhile, so each request has one answer. A donor whose last answer
//! came from its communication thread (its processors run long pruned
//! subtrees, which make no join that could answer) gets the next request
//! both ways at once; one answer by a processor returns it to memory only.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::layer::RuntimeExt;
use crate::link::{Class, FrameError, Port, Service, ServiceId};
use crate::node::LinkError;
use crate::remote::balance::{FjNode, NobodyWaits, PortableJob};
use crate::remote::host::HostRequests;
use crate::remote::Failure;
use crate::runtime::Runtime;
use crate::Error;

/// First wait after a round of refused requests.
pub const MIN_BACKOFF: Duration = Duration::from_micros(20);
/// Longest wait between rounds of requests.
pub const MAX_BACKOFF: Duration = Duration::from_millis(1);
/// How long a request made through shared memory waits for a donor's
/// processor before it goes as a message: about two of the subtrees that
/// a [`Fork`](crate::Fork) filament's pruned copy runs without a pruning
/// test (20–30 µs each), between which a busy donor makes a join that can
/// answer.
pub const DIRECT_WAIT: Duration = Duration::from_micros(50);

/// The service of fork-join across nodes: its number on the wire, owned
/// here (see [`ServiceId`]).
pub const SERVICE: ServiceId = ServiceId::new(2, "fork-join across nodes");

/// The messages (bincode payloads of [`SERVICE`]).
#[derive(Debug, Serialize, Deserialize)]
enum FjMsg {
    StealReq {
        run: u64,
        /// Asked through shared memory first (module `host`): answer only
        /// if no processor took it meanwhile.
        direct: bool,
    },
    StealReply {
        run: u64,
        jobs: Vec<PortableJob>,
        /// Answered by a processor, from shared memory (module `host`),
        /// not by the communication thread.
        by_processor: bool,
    },
    Push {
        run: u64,
        proc: u32,
        job: PortableJob,
    },
    Result {
        run: u64,
        token: u64,
        outcome: Result<Vec<u8>, Failure>,
    },
    Done {
        run: u64,
        outcome: Result<Vec<u8>, Failure>,
    },
}

impl FjMsg {
    fn run(&self) -> u64 {
        match self {
            FjMsg::StealReq { run, .. }
            | FjMsg::StealReply { run, .. }
            | FjMsg::Push { run, .. }
            | FjMsg::Result { run, .. }
            | FjMsg::Done { run, .. } => *run,
        }
    }
}

#[derive(Default)]
struct State {
    /// The run in progress here (0: none).
    run: u64,
    /// The last run begun here.
    begun: u64,
    /// `Push` and `Done` messages of runs not begun yet, in arrival order.
    early: Vec<(usize, FjMsg)>,
    /// A steal request is out (since when).
    asking: Option<Instant>,
    /// It was made through shared memory, to this node, and not yet sent
    /// as a message.
    direct: Option<usize>,
    /// Per node: the last request to it was answered by its communication
    /// thread, not by a processor through shared memory (its processors
    /// were in long leaves, or in pruned subtrees, which make no join that
    /// answers): the next request to it also goes as a message at once.
    unanswered: Vec<bool>,
    /// Requests refused since the last success or the last pause.
    refused: usize,
    /// Victims asked so far (the next one is `me + 1 + asked mod (N - 1)`).
    asked: usize,
    /// Do not ask before this.
    not_before: Option<Instant>,
    backoff: Duration,
    failed: bool,
}

/// A node's fork-join messaging: what the runtime calls to ask other nodes
/// for work, push start-up filaments and send results, and the [`Service`]
/// the delivery thread calls.
pub struct Stealing {
    port: Arc<dyn Port>,
    node: FjNode,
    me: usize,
    nodes: usize,
    st: Mutex<State>,
}

impl std::fmt::Debug for Stealing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stealing(node {} of {})", self.me, self.nodes)
    }
}

/// Makes `rt`'s fork-join runs span its link's nodes: installs the
/// messaging in the runtime and the [`SERVICE`] service on the
/// link. The cluster layer does this for every multi-node runtime
/// (`hyfi_net::init`); a one-node link carries no services and gets an
/// error.
pub fn install(rt: &Runtime) -> Result<Arc<Stealing>, Error> {
    let link = rt.link();
    let port = link.port().ok_or_else(|| {
        Error::Link("fork-join across nodes needs a link to other nodes; this one has none".into())
    })?;
    let s = Arc::new(Stealing {
        // The port does not keep the link alive: the runtime holds the
        // link, and the link's delivery thread holds this service.
        port,
        node: FjNode::of(rt),
        me: link.my_node(),
        nodes: link.num_nodes(),
        st: Mutex::new(State {
            backoff: MIN_BACKOFF,
            unanswered: vec![false; link.num_nodes()],
            ..State::default()
        }),
    });
    rt.shared
        .fj
        .stealing
        .set(s.clone())
        .map_err(|_| Error::BalancerTaken)?;
    link.set_service(SERVICE, s.clone()).map_err(Error::Link)?;
    Ok(s)
}

/// A fork-join message that breaks the protocol.
#[derive(Debug, thiserror::Error)]
enum StealError {
    /// Bytes that are no fork-join message.
    #[error("undecodable fork-join message from node {from}: {source}")]
    Undecodable {
        from: usize,
        #[source]
        source: bincode::Error,
    },
    /// A result nobody here waits for.
    #[error("node {from} sent {why}")]
    Unexpected {
        from: usize,
        #[source]
        why: NobodyWaits,
    },
}

impl Stealing {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn send(&self, to: usize, msg: &FjMsg) -> Result<(), LinkError> {
        let body = bincode::serialize(msg)
            .map_err(|e| format!("node {}: encoding a fork-join message: {e}", self.me))?;
        // Only requests overtake: a reply, a filament or a result is data.
        let class = match msg {
            FjMsg::StealReq { .. } => Class::Control,
            _ => Class::Bulk,
        };
        self.port
            .send_bytes(to, SERVICE, class, &body)
            .map_err(|e| {
                format!(
                    "node {}: sending a fork-join message of {} bytes to node {to}: {e} \
                     (a filament's arguments or result too large?)",
                    self.me,
                    body.len()
                )
                .into()
            })
            .map(|_| ())
    }

    /// Handles one message (with the state locked, so messages of a run
    /// that is just beginning are handled in order).
    fn handle(&self, st: &mut State, from: usize, msg: FjMsg) -> Result<(), StealError> {
        match msg {
            FjMsg::StealReq { run, direct } => {
                if direct && !self.node.claim_host_request(from, run) {
                    // A processor took it from shared memory and answered.
                    return Ok(());
                }
                self.answer(from, run, false);
            }
            FjMsg::StealReply {
                run,
                jobs,
                by_processor,
            } => {
                let asked = if run == st.run {
                    st.direct = None;
                    st.asking.take()
                } else {
                    None
                };
                if asked.is_some() {
                    // Whether this donor's processors answer through shared
                    // memory in time, for the next request to it.
                    st.unanswered[from] = !by_processor;
                    if jobs.is_empty() {
                        st.refused += 1;
                        if st.refused >= self.nodes - 1 {
                            // Every other node refused: pause before the next round.
                            st.refused = 0;
                            st.not_before = Some(Instant::now() + st.backoff);
                            st.backoff = (st.backoff * 2).min(MAX_BACKOFF);
                        }
                    } else {
                        st.refused = 0;
                        st.backoff = MIN_BACKOFF;
                        st.not_before = None;
                    }
                }
                if let (Some(t), true) = (asked, crate::trace::on()) {
                    let since = crate::trace::now() - t.elapsed().as_nanos() as u64;
                    crate::trace::span(
                        crate::trace::Kind::RemoteSteal,
                        since,
                        [from as u64, jobs.len() as u64, 0, 0],
                    );
                }
                if jobs.is_empty() {
                    // An idle processor asks again (or waits out the pause).
                    self.node.wake_idle();
                } else {
                    self.node.install(run, from, jobs, None);
                }
                if let Some(t) = asked {
                    self.node.count_steal_wait(t.elapsed());
                }
            }
            FjMsg::Push { run, proc, job } => {
                if run > st.begun {
                    st.early.push((from, FjMsg::Push { run, proc, job }));
                } else {
                    self.node.install(run, from, vec![job], Some(proc as usize));
                }
            }
            FjMsg::Result {
                run: _,
                token,
                outcome,
            } => {
                if let Err(why) = self.node.complete(token, outcome) {
                    // After a failure, waiting filaments were completed with
                    // it and their late results are expected.
                    if !st.failed {
                        return Err(StealError::Unexpected { from, why });
                    }
                }
            }
            FjMsg::Done { run, outcome } => {
                if run > st.begun {
                    st.early.push((from, FjMsg::Done { run, outcome }));
                } else {
                    self.node.finished(run, outcome);
                }
            }
        }
        Ok(())
    }
}

/// What the runtime calls (none of it blocks).
impl Stealing {
    /// Distributed run `run` begins on this node (runs are numbered 1, 2,
    /// ... in the same order on every node): messages of this run that
    /// came early are handled now.
    pub(crate) fn begin(&self, run: u64) {
        let mut st = self.lock();
        st.run = run;
        st.begun = run;
        st.asking = None;
        st.direct = None;
        st.refused = 0;
        st.not_before = None;
        st.backoff = MIN_BACKOFF;
        let early = std::mem::take(&mut st.early);
        for (from, msg) in early {
            if msg.run() > run {
                st.early.push((from, msg));
            } else if msg.run() == run {
                if let Err(why) = self.handle(&mut st, from, msg) {
                    tracing::warn!("hyfi: node {}: {why}", self.me);
                }
            }
        }
    }

    /// Run `run` ended on this node.
    pub(crate) fn end(&self, run: u64) {
        let mut st = self.lock();
        if st.run == run {
            st.run = 0;
            st.asking = None;
            st.direct = None;
        }
    }

    /// A processor of this node is idle and found no work on the node: asks
    /// another node, unless a request is already out (`host`: this node's
    /// requests through shared memory, if it makes any; `procs`: processors
    /// per node). Returns how long to wait before asking again if nothing
    /// arrives (`None`: the answer will wake the processor).
    pub(crate) fn want_work(
        &self,
        run: u64,
        host: Option<&HostRequests>,
        procs: usize,
    ) -> Option<Duration> {
        if self.nodes < 2 {
            return None;
        }
        let (victim, direct) = {
            let mut st = self.lock();
            if st.failed || st.run != run {
                return None;
            }
            if let Some(t) = st.asking {
                let victim = st.direct?;
                // Asked through shared memory: give the donor's processors
                // their time, then send the request as a message.
                let waited = t.elapsed();
                if waited < DIRECT_WAIT {
                    return Some(DIRECT_WAIT - waited);
                }
                st.direct = None;
                (victim, true)
            } else {
                if let Some(t) = st.not_before {
                    let now = Instant::now();
                    if now < t {
                        return Some(t - now);
                    }
                    st.not_before = None;
                }
                st.asking = Some(Instant::now());
                let k = st.asked % (self.nodes - 1);
                st.asked += 1;
                let victim = (self.me + 1 + k) % self.nodes;
                self.node.count(|c| &c.steal_requests);
                if host.is_some_and(|h| h.ask(victim, run, procs)) {
                    self.node.count(|c| &c.requests_through_memory);
                    if !st.unanswered[victim] {
                        st.direct = Some(victim);
                        return Some(DIRECT_WAIT);
                    }
                    // Its processors did not answer the last one: the
                    // message goes now too, and whichever answers first
                    // does.
                    (victim, true)
                } else {
                    (victim, false)
                }
            }
        };
        if direct {
            self.node.count(|c| &c.requests_resent);
        }
        if self.send(victim, &FjMsg::StealReq { run, direct }).is_err() {
            // The node failed; its failure path ends the run.
            self.lock().asking = None;
            return Some(MAX_BACKOFF);
        }
        None
    }

    /// A processor of this node answers a request another node of the host
    /// made through shared memory, if one waits (module `host`): half the
    /// node's ready filaments, as the communication thread would answer a
    /// message. Called where the processor has just forked a portable
    /// filament, or idles. `true` if it answered one.
    pub(crate) fn answer_host_request(&self, host: &HostRequests) -> bool {
        let Some((thief, run)) = host.take() else {
            return false;
        };
        self.node.count(|c| &c.served_by_processors);
        self.answer(thief, run, true);
        true
    }

    /// Answers `thief`'s request of `run`: half this node's ready
    /// filaments, or none.
    fn answer(&self, thief: usize, run: u64, by_processor: bool) {
        let jobs = self.node.export_half(run);
        crate::trace::instant(
            crate::trace::Kind::StealServed,
            [thief as u64, jobs.len() as u64, u64::from(by_processor), 0],
        );
        // A failed send means the node failed: the failure path ends the run.
        let _ = self.send(
            thief,
            &FjMsg::StealReply {
                run,
                jobs,
                by_processor,
            },
        );
    }

    /// Start-up distribution: `job` is for processor `proc` of `node`.
    pub(crate) fn push(
        &self,
        node: usize,
        proc: usize,
        run: u64,
        job: PortableJob,
    ) -> Result<(), LinkError> {
        self.send(
            node,
            &FjMsg::Push {
                run,
                proc: proc as u32,
                job,
            },
        )
    }

    /// The outcome of a filament that came from `node`, back to it.
    pub(crate) fn send_result(
        &self,
        node: usize,
        run: u64,
        token: u64,
        outcome: Result<Vec<u8>, Failure>,
    ) {
        // A failed send means the node failed: the parent's node learns of
        // the failure itself.
        let _ = self.send(
            node,
            &FjMsg::Result {
                run,
                token,
                outcome,
            },
        );
    }

    /// The root returned (node 0): tells every other node, with the
    /// encoded result.
    pub(crate) fn finish(&self, run: u64, outcome: &Result<Vec<u8>, Failure>) {
        for n in (0..self.nodes).filter(|&n| n != self.me) {
            let _ = self.send(
                n,
                &FjMsg::Done {
                    run,
                    outcome: outcome.clone(),
                },
            );
        }
    }
}

impl Service for Stealing {
    fn frame(&self, from: usize, payload: Vec<u8>) -> Result<(), FrameError> {
        let msg: FjMsg = bincode::deserialize(&payload)
            .map_err(|source| StealError::Undecodable { from, source })?;
        let mut st = self.lock();
        Ok(self.handle(&mut st, from, msg)?)
    }

    fn failed(&self, why: &str) {
        self.lock().failed = true;
        self.node.fail(why);
    }
}
