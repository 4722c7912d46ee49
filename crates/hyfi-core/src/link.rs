//! The node seam for layers: how a layer above the runtime (the shared
//! memory, cross-node stealing) talks to the same layer on other nodes,
//! without knowing the transport.
//!
//! A layer is a [`Service`] registered on its node's link under a
//! [`ServiceId`] ([`NodeLink::set_service`](crate::NodeLink::set_service)).
//! It sends with the node's [`Port`]
//! ([`NodeLink::port`](crate::NodeLink::port)): a payload it builds itself,
//! to one node, for the same service there, in one of two priority
//! classes. The transport frames the payload, moves it, and hands it to
//! the receiving node's service on that node's *delivery thread* (over TCP,
//! the communication thread), in the order it was sent per sender and
//! class.
//!
//! # Priority classes
//!
//! * [`Class::Control`]: small messages someone waits for with nothing
//!   else to do — a page *request*, a steal *request*. A control message
//!   overtakes bulk messages queued before it to the same node and that
//!   have not started moving yet: **control never waits behind bulk**
//!   (at most behind one bulk message already being written).
//! * [`Class::Bulk`]: data — pages, diffs and write notices (a release),
//!   stolen filaments, results. Bulk messages to one node stay in order.
//!
//! Messages of different classes from one node to another may be
//! reordered; a protocol that needs an order between them must not rely on
//! the transport for it (the DSM's requests carry the requester's epoch for
//! this reason).
//!
//! # Handlers
//!
//! [`Service::frame`] runs on the receiving node's delivery thread. It
//! must not block: it may send (sending never blocks) and wake waiters,
//! nothing more. A handler's `Err` is a protocol violation and fails the
//! node. [`Service::failed`] tells the service that its node failed (a lost
//! peer, an abort): every waiter must wake with the reason.
//! [`Service::peer_left`] tells it that a peer's program ended: that peer
//! asks for nothing more, but still answers requests.
//!
//! # Implementations
//!
//! hyfi-net implements the seam over TCP (`hyfi_net::Cluster`);
//! [`InProcess`] implements it with channels between several runtimes in
//! one process, for unit tests of the protocols.
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use hyfi_core::link::{Class, FrameError, InProcess, Service, ServiceId};
//! use hyfi_core::NodeLink;
//!
//! /// Collects what it receives.
//! #[derive(Default)]
//! struct Log(Mutex<Vec<(usize, Vec<u8>)>>);
//! impl Service for Log {
//!     fn frame(&self, from: usize, payload: Vec<u8>) -> Result<(), FrameError> {
//!         self.0.lock().unwrap().push((from, payload));
//!         Ok(())
//!     }
//!     fn failed(&self, _why: &str) {}
//! }
//!
//! let nodes = InProcess::connect(2);
//! let log = Arc::new(Log::default());
//! nodes[1].set_service(ServiceId::Steal, log.clone()).unwrap();
//! let port = nodes[0].port().unwrap();
//! port.send_bytes(1, ServiceId::Steal, Class::Control, b"hello").unwrap();
//! // Delivery is asynchronous, on node 1's delivery thread.
//! while log.0.lock().unwrap().is_empty() {
//!     std::thread::yield_now();
//! }
//! assert_eq!(log.0.lock().unwrap()[0], (0, b"hello".to_vec()));
//! ```

mod in_process;
pub mod spmd;

pub use in_process::InProcess;
pub use spmd::{StepError, Steps};

use crate::node::LinkError;

/// The priority class of a message (see the [module docs](self)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    /// Requests: overtake queued bulk messages.
    Control,
    /// Data: pages, diffs, filaments, results; in order.
    Bulk,
}

/// The services a node runs, by name: the one place their numbers are
/// agreed on (the number is what the transport puts on the wire).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ServiceId {
    /// The shared memory (hyfi-dsm): page requests, pages, releases.
    Dsm = 1,
    /// Fork-join across nodes ([`crate::steal`]): start-up distribution,
    /// steals, results, termination.
    Steal = 2,
}

impl ServiceId {
    /// Every service.
    pub const ALL: [ServiceId; 2] = [ServiceId::Dsm, ServiceId::Steal];

    /// The service's number on the wire (below 128).
    pub const fn number(self) -> u8 {
        self as u8
    }

    /// The service numbered `n`, if any.
    pub fn from_number(n: u8) -> Option<ServiceId> {
        ServiceId::ALL.into_iter().find(|s| s.number() == n)
    }
}

impl std::fmt::Display for ServiceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServiceId::Dsm => write!(f, "the shared memory"),
            ServiceId::Steal => write!(f, "fork-join across nodes"),
        }
    }
}

/// Why a [`Service`] refused a message: the layer's own error type (the
/// shared memory's `ProtocolError`, the stealing protocol's), boxed so that
/// the seam needs to know none of them and a caller can still downcast.
pub type FrameError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A layer that answers its own messages on the node's delivery thread
/// (the DSM's page server, cross-node stealing). See the
/// [module docs](self).
pub trait Service: Send + Sync + 'static {
    /// A message from node `from`, as the sender built it. Must not block.
    /// `Err` is a protocol violation: the node fails with that error, its
    /// `Display` the message (which should name the service and the
    /// sender); the transport keeps it as the source of its own error.
    fn frame(&self, from: usize, payload: Vec<u8>) -> Result<(), FrameError>;
    /// The node failed (a lost peer, an abort): wake every waiter with `why`.
    fn failed(&self, why: &str);
    /// Node `peer`'s program ended: it will send nothing more but answers
    /// to requests, so a wait for anything else from it must end.
    fn peer_left(&self, _peer: usize) {}
}

/// A node's sending side, for its services. It does not keep the link
/// alive (a service keeps one to answer requests while its node closes).
pub trait Port: Send + Sync + 'static {
    /// Sends to `service` on node `to` a payload that `fill` appends to the
    /// vector it is given (which may already hold the transport's header:
    /// `fill` only appends; `len_hint` is the expected length, for one
    /// allocation). Never blocks. Returns the bytes the message takes on
    /// the link (payload and framing), for the service's counters.
    fn send_with(
        &self,
        to: usize,
        service: ServiceId,
        class: Class,
        len_hint: usize,
        fill: &mut dyn FnMut(&mut Vec<u8>),
    ) -> Result<usize, LinkError>;

    /// Sends `bytes` (see [`Port::send_with`]).
    fn send_bytes(
        &self,
        to: usize,
        service: ServiceId,
        class: Class,
        bytes: &[u8],
    ) -> Result<usize, LinkError> {
        self.send_with(to, service, class, bytes.len(), &mut |b| {
            b.extend_from_slice(bytes)
        })
    }
}

/// Messages and bytes of one class, sent and received by a node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassTraffic {
    /// Messages sent.
    pub sent: u64,
    /// Bytes sent (framing included).
    pub bytes_sent: u64,
    /// Messages received.
    pub received: u64,
    /// Bytes received (framing included).
    pub bytes_received: u64,
}

/// A node's traffic by class, as its link counts it
/// ([`NodeLink::traffic`](crate::NodeLink::traffic)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Control messages (requests, collectives, the link's own).
    pub control: ClassTraffic,
    /// Bulk messages (data).
    pub bulk: ClassTraffic,
    /// Connections refused after set-up (strays), where the link has any.
    pub refused: u64,
}

impl std::fmt::Display for Traffic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (c, b) = (&self.control, &self.bulk);
        write!(
            f,
            "control sent {} ({} B) received {} ({} B); bulk sent {} ({} B) received {} ({} B); refused connections {}",
            c.sent,
            c.bytes_sent,
            c.received,
            c.bytes_received,
            b.sent,
            b.bytes_sent,
            b.received,
            b.bytes_received,
            self.refused
        )
    }
}

/// A section of a node's report (what SIGUSR1 prints on a cluster) from a
/// layer above: `None` once that layer is gone.
pub type Report = Box<dyn Fn() -> Option<String> + Send + Sync>;
