//! Opening the full mesh of TCP connections, before the communication
//! thread starts (plain blocking sockets, every wait bounded).
//!
//! 1. Node 0 (the coordinator) listens at `HYFI_COORD`, or binds a port and
//!    publishes `host:port` in the rendezvous file ([`crate::tcp::rendezvous`]).
//!    Without `HYFI_TOKEN` it makes a random token and puts it in that file
//!    (for a `HYFI_COORD` job, in `$TMPDIR/hyfi-<uid>/hyfi-job-<job>.addr`),
//!    created mode 0600 in a private directory, so only this user's
//!    processes on this host can join.
//! 2. Every other node connects to node 0 (retrying until the deadline: node
//!    0 may start last, and a stale rendezvous file is re-read), proves it
//!    knows the token and checks node 0's proof (the challenge–response of
//!    [`crate::tcp::wire`]), binds its own mesh listener and says where it is.
//! 3. Once all have arrived, node 0 removes the rendezvous file and sends
//!    everyone the table of listener addresses. Node 0's link to node *i* is
//!    the connection *i* opened.
//! 4. Node *i* connects to every node *j* with `0 < j < i`, and accepts from
//!    every *j > i*; every link runs the same mutual proof.
//!
//! **Strangers cannot stall start-up.** Each incoming connection gets a
//! thread of its own and [`HANDSHAKE_WAIT`] to prove itself (a deadline for
//! the whole handshake, so trickling one byte at a time does not extend it);
//! at most [`MAX_PENDING`] are in handshake at once. The real nodes are
//! admitted as soon as they prove themselves, and the whole of setup is
//! bounded by the `timeout` given to [`connect`] (`HYFI_TIMEOUT`).
//!
//! **Strangers cannot hijack it.** Nothing keyed by the token, and not the
//! address table, goes to a connection before it proved it knows the token;
//! a connection that fails is logged (rate-limited, see
//! `crate::tcp::refusal`) and dropped, and setup goes on. Only a node that
//! proved itself can end setup with an error: a node count that disagrees
//! with node 0's, or a rank claimed twice, ends setup on every node with an
//! error that says what to check.
//!
//! **Listeners bind the interface the job uses**, never every interface:
//! node 0 the address of `HYFI_COORD` (or loopback for a job whose
//! rendezvous file is in the private temporary directory, whose nodes are
//! all on this host; or `HYFI_HOST`/the host name's address otherwise); the
//! others the local address of their connection to node 0.
//!
//! One module per part: `addr` (which interface a listener binds),
//! `handshake` (both sides of the proof, and why one fails:
//! [`HandshakeError`]), `accept` (a thread per pending connection),
//! `coordinator` (node 0's side of setup), `member` (every other node's);
//! this one holds what they make, [`Links`].

mod accept;
mod addr;
mod clock;
mod coordinator;
mod handshake;
mod member;

pub(crate) use addr::COORD_FD_ENV;
pub use handshake::HandshakeError;

use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::bootstrap::JobSpec;
use crate::bootstrap::Token;
use crate::error::NetError;
use crate::tcp::lane::{self, Lanes};
use crate::tcp::refusal::RefusalLog;

/// The established mesh.
pub struct Links {
    /// This node's rank.
    pub rank: usize,
    /// Number of nodes.
    pub nodes: usize,
    /// Job id.
    pub job: u64,
    /// The job's token, which every link proved it knows.
    pub token: Token,
    /// One connection per other node (`None` at this node's own index).
    pub peers: Vec<Option<TcpStream>>,
    /// Listeners kept open during the run, so that stray connections are
    /// refused (and logged) instead of hanging in the backlog.
    pub listeners: Vec<TcpListener>,
    /// Connections refused while the mesh was being set up: the node's
    /// count of refusals starts there.
    pub refused: u64,
    /// The links that also have a shared-memory lane (nodes on one host):
    /// see [`crate::tcp::lane`].
    pub lanes: Lanes,
}

/// How often setup's loops look again (accepting, retrying).
const POLL: Duration = Duration::from_millis(5);
/// How long an incoming connection has to complete its handshake: a real
/// node answers in milliseconds; a stranger holds a thread no longer.
pub const HANDSHAKE_WAIT: Duration = Duration::from_secs(3);
/// Connections in handshake at once; more are closed at once (a real node
/// among them retries).
pub const MAX_PENDING: usize = 128;

/// Opens the mesh for `spec`, giving up after `timeout`; links between
/// nodes of one host get shared-memory lanes unless `HYFI_LANES=0`.
pub fn connect(spec: &JobSpec, timeout: Duration) -> Result<Links, NetError> {
    connect_with(spec, timeout, lane::wanted()?)
}

/// [`connect`], with shared-memory lanes where possible (`lanes`) or none.
pub fn connect_with(spec: &JobSpec, timeout: Duration, lanes: bool) -> Result<Links, NetError> {
    let deadline = Instant::now() + timeout;
    let log = Arc::new(RefusalLog::new(spec.rank));
    let links = if spec.rank == 0 {
        coordinator::coordinator(spec, deadline, timeout, &log)
    } else {
        member::member(spec, deadline, timeout, &log)
    };
    log.flush();
    let mut links = links?;
    links.refused = log.total();
    links.lanes = lane::pair(links.rank, &mut links.peers, lanes, deadline)?;
    Ok(links)
}

/// A link as the communication thread wants it: no Nagle delay, and no
/// timeouts (setup's are over; the heartbeat watches the link from now).
fn configure(s: &TcpStream) -> Result<(), NetError> {
    s.set_nodelay(true)
        .map_err(|e| NetError::io("TCP_NODELAY", e))?;
    s.set_read_timeout(None)
        .map_err(|e| NetError::io("set_read_timeout", e))?;
    s.set_write_timeout(None)
        .map_err(|e| NetError::io("set_write_timeout", e))
}
