//! The message substrate: one I/O model, non-blocking sockets, one
//! `poll(2)` event loop per node on its communication thread. The link
//! protocol and the loop are described beside the code, in `README.md`.
//!
//! **Sending** does not go through the loop: the calling thread writes its
//! frame to the non-blocking socket itself, one `write` under a per-link
//! lock (frames never interleave; a control frame waits at most for one
//! frame already being written). This departs from the design card's
//! "workers hand messages to the communication thread through lock-free
//! queues": that hand-off cost a wake-up of the communication thread per
//! message, which measured 5–7× a raw TCP round trip; writing directly
//! removed it (see BENCHMARKS.md). Only what the socket does not take waits
//! in the link's backlog, and the loop (woken through a socket pair in its
//! poll set) writes it out when the socket drains: nothing ever blocks on a
//! full socket, not even the communication thread, which answers service
//! requests itself.
//!
//! **Receiving**: the loop reads every link with an incremental frame
//! decoder (header, then payload, across partial reads) and files frames in
//! the [`Inbox`], where waiting threads poll briefly and then sleep, and
//! waiting filthreads suspend (the hyfi-core seam) so their processor runs
//! other work; frames for a service go to its handler. On a node that owns
//! its CPUs, idle processors read the links too (`rx::Rx`): the
//! communication thread shares their CPU there, and a frame it reads costs
//! the waiter a wake-up and two switches. The same loop sends
//! heartbeats and judges silent peers (its `poll` timeout is the next
//! deadline), and accepts and refuses strays on the listeners. Before, reads
//! ran on a tokio runtime and backlogs on a separate flusher thread with its
//! own `poll`: two I/O models and one more thread for the same sockets.
//!
//! One module per part: `inbox` (where frames wait for their takers),
//! `service` (the table of the node's hyfi-core services, and how frames
//! tagged for one reach it), `tx` (the sending side: direct writes,
//! backlogs, the loop's waker), `rx` (the event loop: links read and
//! flushed, heartbeats, strays), `stats` (counters by class); this one
//! holds [`Comm`], which ties them to a node.
//!
//! **Failure detection.** A link that closes or breaks before its peer said
//! `Bye`, or an `Abort` from a peer, fails the node: the failure hook runs
//! (the cluster layer reports it and ends the process after a short grace),
//! then every waiter in the inbox returns the error at once and the
//! remaining peers are told to abort. A killed process closes its sockets, so peers
//! notice within a round trip.

mod inbox;
mod rx;
mod service;
mod stats;
mod tx;

pub use inbox::{Dir, Inbox};
pub use stats::NetStats;
pub use tx::{Sender, SenderInner};

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hyfi_core::link::{Service, ServiceId};

use crate::cause::{Cause, CauseKind};
use crate::error::NetError;
use crate::tcp::mesh::Links;
use crate::tcp::wire::Msg;
use hyfi_core::link::Steps;

use hyfi_core::link::ServiceError;
use inbox::WaitError;
use rx::{run, Node};
use tx::{PeerTx, Waker};

/// How long a node whose program ended serves its peers before it says
/// so on stderr (it goes on serving them).
const CLOSE_NOTICE: Duration = Duration::from_secs(10);

/// A node's communication thread and the handles to talk through it.
pub struct Comm {
    sender: Sender,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The host words the lanes lend, if the node has a lane.
    words: Option<Arc<crate::tcp::lane::LaneWords>>,
}

impl std::ops::Deref for Comm {
    type Target = Sender;
    fn deref(&self) -> &Sender {
        &self.sender
    }
}

/// Called once, on the communication thread, when the node fails.
pub type FailureHook = Box<dyn Fn(&Cause) + Send + Sync>;

impl Comm {
    /// Starts the communication thread over an established mesh. A peer
    /// that sends nothing (not even a heartbeat) for `heartbeat` is lost.
    pub fn start(
        mut links: Links,
        on_failure: FailureHook,
        heartbeat: Duration,
    ) -> Result<Comm, NetError> {
        let (rank, nodes) = (links.rank, links.nodes);
        let words = links.lanes.words.take();
        let inbox = Arc::new(Inbox::default());
        inbox.state.lock().unwrap_or_else(|e| e.into_inner()).steps = Some(Steps::new(rank));
        let stats = Arc::new(NetStats::default());
        // Refusals are counted from the first connection, setup's included.
        stats.refused.store(links.refused, Ordering::Relaxed);
        let on_failure: Arc<FailureHook> = Arc::new(on_failure);
        let mut txs = Vec::with_capacity(nodes);
        for (peer, p) in links.peers.iter().enumerate() {
            txs.push(match p {
                Some(sock) => Some(PeerTx::new(
                    sock.try_clone()
                        .map_err(|e| NetError::io("cloning a link for writing", e))?,
                    links.lanes.tx[peer].take().map(|lane| {
                        stats.lanes.fetch_add(1, Ordering::Relaxed);
                        lane.counting_bells(stats.bells.clone())
                    }),
                )),
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
        let waker =
            Arc::new(Waker::new().map_err(|e| NetError::io("creating the loop's waker", e))?);
        let sender = Sender(Arc::new(SenderInner {
            rank,
            nodes,
            tx: txs,
            waker: waker.clone(),
            inbox,
            stats,
        }));
        let node = Node {
            sender: sender.clone(),
            hook: on_failure,
        };
        let thread = std::thread::Builder::new()
            .name("hyfi-comm".into())
            .spawn(move || {
                // A service handler that panics (it runs on this thread)
                // must not leave the node's waits hanging: the node fails.
                let on_panic = node.clone();
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    run(links, node, heartbeat, waker)
                }));
                if let Err(p) = ran {
                    let what = p
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| p.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "(a non-string payload)".into());
                    on_panic.fail(Cause::new(
                        rank,
                        CauseKind::Program,
                        format!("its communication thread panicked: {what}"),
                    ));
                }
            })
            .map_err(|e| NetError::io("spawning the communication thread", e))?;
        Ok(Comm {
            sender,
            thread: Mutex::new(Some(thread)),
            words,
        })
    }

    /// The words this node shares with the nodes of its host it has lanes
    /// to ([`hyfi_core::link::HostWords`]); `None` without a lane.
    pub fn host_words(&self) -> Option<Arc<dyn hyfi_core::link::HostWords>> {
        self.words
            .clone()
            .map(|w| w as Arc<dyn hyfi_core::link::HostWords>)
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
    /// with `service_tag(id, ..)`): a layer above (the DSM, cross-node
    /// stealing) that answers requests on the communication thread. Frames
    /// that came before are handed over first, in order.
    pub fn set_service(&self, id: ServiceId, service: Arc<dyn Service>) -> Result<(), NetError> {
        match self.inbox.services.install(id, service.clone()) {
            Ok(()) => {}
            Err(e @ ServiceError::Twice { .. }) => {
                return Err(NetError::Protocol {
                    me: self.rank,
                    from: self.rank,
                    why: e.to_string(),
                })
            }
            // An early frame the service refused: the node cannot go on.
            Err(e) => {
                let cause = Cause::new(self.rank, CauseKind::Program, e.to_string());
                let line = cause.line(self.rank);
                self.inbox.fail(self.rank, cause);
                return Err(self.aborted(self.inbox.failure().unwrap_or(line)));
            }
        }
        if let Some(f) = self.inbox.failure() {
            service.failed(&f);
        }
        Ok(())
    }

    /// Waits for the collective message `(from, seq, dir)`.
    pub fn recv_coll(&self, from: usize, seq: u64, dir: Dir) -> Result<Vec<u8>, NetError> {
        self.flush_steps();
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
                None => s
                    .gone
                    .contains(&from)
                    .then_some(Err(WaitError::Gone { me, peer: from })),
            })
            .map_err(|cause| self.aborted(cause.to_string()))
    }

    /// Waits for the next bulk frame from `from`.
    pub fn recv_bulk(&self, from: usize) -> Result<(u64, Vec<u8>), NetError> {
        self.flush_steps();
        let me = self.rank;
        self.inbox
            .wait(
                |s| match s.bulk.get_mut(&from).and_then(|q| q.pop_front()) {
                    Some(d) => Some(Ok(d)),
                    None => s
                        .gone
                        .contains(&from)
                        .then_some(Err(WaitError::Gone { me, peer: from })),
                },
            )
            .map_err(|cause| self.aborted(cause.to_string()))
    }

    /// Fails the node with its program's failure `cause` and tells every
    /// peer (unless the node failed already: the first cause stands).
    pub fn abort(&self, cause: &str) {
        let cause = Cause::new(self.rank, CauseKind::Program, cause);
        self.sender.fail_and_tell(cause, |_| {});
    }

    /// From now on lost links are not reported to this node's program: the
    /// caller ends the process in a moment, with its own status.
    pub fn exiting(&self) {
        self.inbox.exiting.store(true, Ordering::SeqCst);
    }

    /// Tells every peer the job ends with `cause`, without failing this
    /// node's own waits: the caller is about to end the process with its
    /// own status, and from now on lost links are not reported to this
    /// node's program.
    pub fn abort_peers(&self, cause: &Cause) {
        self.inbox.exiting.store(true, Ordering::SeqCst);
        crate::cause::report(cause);
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
        // sending halves (the peers' loops see a clean end after our Bye).
        let flush_until = Instant::now() + Duration::from_secs(5);
        for tx in self.tx.iter().flatten() {
            loop {
                let mut st = tx.st.lock().unwrap_or_else(|e| e.into_inner());
                let empty = st.flush().unwrap_or(true);
                if empty || Instant::now() >= flush_until || self.inbox.failure().is_some() {
                    if let Some(sock) = st.sock.take() {
                        let _ = sock.shutdown(std::net::Shutdown::Write);
                    }
                    tx.note(&st);
                    break;
                }
                tx.note(&st);
                drop(st);
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        // Whatever the peers did, the loop ends now (links of peers that
        // never closed are dropped with it).
        self.waker.stop.store(true, Ordering::SeqCst);
        self.waker.wake();
        if let Some(h) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = h.join();
        }
        // Services hold a Sender, which holds the inbox, which holds them:
        // break the cycle now that nothing is served any more.
        self.inbox.services.clear();
    }
}
