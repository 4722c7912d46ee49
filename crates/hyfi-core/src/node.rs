//! The node-level seam: what the runtime asks of the cluster layer.
//!
//! hyfi-core runs one node. A phase ends with a barrier and reductions
//! combine private copies on the node; both then take a *node-level step*
//! through a [`NodeLink`], which the cluster layer (hyfi-net) implements over
//! the network. On one node it is [`SingleNode`], where both steps are
//! no-ops. Layers above the runtime (the shared memory, stealing) talk
//! to their peers through the same link: see [`crate::link`].
//!
//! This module also defines the types of that seam for layers ([`Service`],
//! [`Port`], [`ServiceId`], [`Class`], [`Traffic`], ...), since
//! [`NodeLink`] hands them out; they are documented, and exported, in
//! [`crate::link`], whose transports depend on this module only.

use std::sync::Arc;

/// Errors a link reports (a lost peer, a timeout, ...).
pub type LinkError = Box<dyn std::error::Error + Send + Sync>;

/// Cross-node operations the runtime needs. Called by one server thread per
/// node (the master, processor 0), in the same order on every node.
pub trait NodeLink: Send + Sync + 'static {
    /// Number of nodes.
    fn num_nodes(&self) -> usize;
    /// This node's index.
    fn my_node(&self) -> usize;
    /// Returns once every node has entered the barrier.
    fn barrier(&self) -> Result<(), LinkError>;
    /// Combines `value` (one per node, all the same length) across nodes with
    /// `combine(acc, other)`, in node order 0, 1, ... so that the result is
    /// reproducible bit for bit; on return `value` holds the result on every
    /// node.
    fn allreduce(
        &self,
        value: &mut [u8],
        combine: &mut dyn FnMut(&mut [u8], &[u8]),
    ) -> Result<(), LinkError>;
    /// [`allreduce`](NodeLink::allreduce) of values whose lengths may
    /// differ between nodes and which `combine` may change: a
    /// concatenation gathers every node's value, in node order, in the
    /// all-reduce's `log2(N)` latencies
    /// ([`collective::allreduce_vec`](crate::link::collective::allreduce_vec)).
    fn allreduce_vec(
        &self,
        value: &mut Vec<u8>,
        combine: &mut dyn FnMut(&mut Vec<u8>, &[u8]),
    ) -> Result<(), LinkError>;
    /// The link's own counters (messages and bytes by class); `None` if it
    /// keeps none.
    fn traffic(&self) -> Option<Traffic> {
        None
    }
    /// The sending side for this node's services (see [`crate::link`]);
    /// `None` on a link that carries no services (one node).
    fn port(&self) -> Option<Arc<dyn Port>> {
        None
    }
    /// Registers the handler of service `id`'s messages on this node (see
    /// [`crate::link`]). Messages that came before are handed over first,
    /// in order. An error if `id` is registered already or the link carries
    /// no services.
    fn set_service(&self, id: ServiceId, _service: Arc<dyn Service>) -> Result<(), LinkError> {
        Err(format!("this node's link carries no services ({id} needs several nodes)").into())
    }
    /// Adds a section to the node's report (what SIGUSR1 prints on a
    /// cluster): the shared memory adds its counters. Ignored by a link
    /// that prints no report.
    fn add_report(&self, _section: Report) {}
    /// This node enters the next SPMD step: every node must enter the same
    /// steps in the same order. A link over several nodes compares each
    /// node's steps with its neighbour's and ends the job, naming both,
    /// when they differ (a node that allocates, runs a phase or a
    /// distributed run the others do not), instead of hanging.
    fn enter_step(&self, _step: Step) -> Result<(), LinkError> {
        Ok(())
    }
    /// This node failed on its own (a panic in a filament, an error of its
    /// program): tell every other node at once, with `cause`, so that the
    /// job ends everywhere instead of waiting for this node.
    fn abort(&self, _cause: &str) {}
    /// Words of memory this node shares with the other nodes of its host
    /// ([`HostWords`]), where the transport has such memory; `None` (the
    /// default) where every word between nodes must travel as a message.
    /// Asked once, when the runtime starts.
    fn host_words(&self) -> Option<Arc<dyn HostWords>> {
        None
    }
}

/// How many words each node has in [`HostWords`].
pub const HOST_WORDS: usize = 1024;

/// Memory shared by the nodes of one host: [`HOST_WORDS`] words per node,
/// zero when made, which every node that reaches them may read and write
/// atomically at any time (a transport whose nodes share memory lends them:
/// the TCP transport's lanes between processes of one host, the in-process
/// link between its nodes).
///
/// The words carry no protocol of the transport's: the layer that uses
/// them owns their layout and their meaning (the cross-node fork-join
/// layer keeps each processor's pruning word there, so that an idle node
/// of the host asks for work by writing it instead of sending a message;
/// `remote/README.md`). A peer may write any value at any time, so a
/// value read from them is never trusted as an index or a length.
pub trait HostWords: Send + Sync + 'static {
    /// Node `node`'s words, if this node reaches them: its own, or a peer's
    /// that shares memory with it. The words of two nodes are reachable
    /// from each other or from neither.
    fn words(&self, node: usize) -> Option<&[std::sync::atomic::AtomicU64; HOST_WORDS]>;
}

/// One step of an SPMD program, as every node must take it: the unit the
/// link compares between nodes (see [`NodeLink::enter_step`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// Phase `phase` of the `program`-th program this runtime started
    /// (counting from 1), in its `iteration`-th execution (from 0): its
    /// filaments, its release and its post-phase code.
    Phase {
        /// Which program (1 for the first `Runtime::start`).
        program: u64,
        /// The phase's index in the program.
        phase: u64,
        /// How many times the phase ran before.
        iteration: u64,
    },
    /// The `seq`-th collective allocation of a shared array (from 0), of
    /// `elems` elements in `bytes` bytes.
    Alloc {
        /// Allocation number.
        seq: u64,
        /// Elements.
        elems: u64,
        /// Size in bytes.
        bytes: u64,
    },
    /// The start of the `program`-th program (from 1): on several nodes it
    /// begins with a release of what local fork-join runs wrote.
    Start {
        /// Which program.
        program: u64,
    },
    /// The `seq`-th distributed fork-join run (from 1).
    Distributed {
        /// Run number.
        seq: u64,
    },
    /// A layer's collective set-up (the shared memory's `Dsm::new`).
    Setup {
        /// Which layer, named by the service it runs (on the wire: the
        /// service's number).
        layer: ServiceId,
    },
}

impl Step {
    /// The step as four numbers (a kind and three arguments), for the wire.
    pub fn to_words(self) -> [u64; 4] {
        match self {
            Step::Phase {
                program,
                phase,
                iteration,
            } => [1, program, phase, iteration],
            Step::Alloc { seq, elems, bytes } => [2, seq, elems, bytes],
            Step::Distributed { seq } => [3, seq, 0, 0],
            Step::Setup { layer } => [4, u64::from(layer.number()), 0, 0],
            Step::Start { program } => [5, program, 0, 0],
        }
    }
    /// The step [`Step::to_words`] gave, or `None` for words that are none.
    pub fn from_words(w: [u64; 4]) -> Option<Step> {
        Some(match w {
            [1, program, phase, iteration] => Step::Phase {
                program,
                phase,
                iteration,
            },
            [2, seq, elems, bytes] => Step::Alloc { seq, elems, bytes },
            [3, seq, 0, 0] => Step::Distributed { seq },
            [4, layer, 0, 0] => Step::Setup {
                layer: ServiceId::from_number(u8::try_from(layer).ok()?)?,
            },
            [5, program, 0, 0] => Step::Start { program },
            _ => return None,
        })
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::Phase {
                program,
                phase,
                iteration,
            } => write!(
                f,
                "ran phase {phase} (execution {}) of program #{program}",
                iteration + 1
            ),
            Step::Alloc { seq, elems, bytes } => write!(
                f,
                "made shared allocation #{seq} ({elems} elements, {bytes} bytes)"
            ),
            Step::Distributed { seq } => write!(f, "called run_distributed (#{seq})"),
            Step::Start { program } => write!(f, "started program #{program}"),
            Step::Setup { layer } => write!(f, "set up {layer}"),
        }
    }
}

/// Work a layer must do at the end of every phase, on every node, in place
/// of the plain node-level barrier: the DSM's release (diffs to the homes,
/// write notices, invalidations), which is itself a barrier.
///
/// Called by the master processor of each node after every processor of
/// the node has finished the phase's pools, before the post-phase code.
pub trait PhaseEnd: Send + Sync + 'static {
    /// Ends phase `phase` (its index in the program) on this node; must not
    /// return before every node has ended it too.
    fn end_phase(&self, phase: usize, link: &dyn NodeLink) -> Result<(), LinkError>;
    /// Ends phase `phase` as [`PhaseEnd::end_phase`] does and, on the way,
    /// all-reduces `value` with `combine` exactly as
    /// [`NodeLink::allreduce`] would: the same bits on every node, combined
    /// in the link's order. It carries the reductions a phase reduces at
    /// its end ([`Program::reduce_at_end`](crate::Program::reduce_at_end)).
    /// The default runs the two one after the other; a hook whose end is
    /// itself a collective carries the value in it and saves a round.
    fn end_phase_reducing(
        &self,
        phase: usize,
        link: &dyn NodeLink,
        value: &mut [u8],
        combine: &mut dyn FnMut(&mut [u8], &[u8]),
    ) -> Result<(), LinkError> {
        self.end_phase(phase, link)?;
        link.allreduce(value, combine)
    }
    /// Called when an access epoch ends (see `CtxExt::access_epoch`): after a
    /// phase's filaments, after its post-phase code, and before a new
    /// command (program or fork-join run) begins. No filament runs then.
    fn access_epoch_ended(&self) {}
}

/// The link of a one-node run.
#[derive(Clone, Copy, Debug, Default)]
pub struct SingleNode;

impl NodeLink for SingleNode {
    fn num_nodes(&self) -> usize {
        1
    }
    fn my_node(&self) -> usize {
        0
    }
    fn barrier(&self) -> Result<(), LinkError> {
        Ok(())
    }
    fn allreduce(
        &self,
        _value: &mut [u8],
        _combine: &mut dyn FnMut(&mut [u8], &[u8]),
    ) -> Result<(), LinkError> {
        Ok(())
    }
    fn allreduce_vec(
        &self,
        _value: &mut Vec<u8>,
        _combine: &mut dyn FnMut(&mut Vec<u8>, &[u8]),
    ) -> Result<(), LinkError> {
        Ok(())
    }
}

// The seam for layers (see `crate::link`, where these are exported).

/// The priority class of a message (see the [module docs](crate::link)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    /// Requests: overtake queued bulk messages.
    Control,
    /// Data: pages, diffs, filaments, results; in order.
    Bulk,
}

/// A service's number on the wire and its name in messages. Each layer
/// owns its own: hyfi-dsm's `hyfi_dsm::SERVICE`, cross-node stealing's
/// [`crate::steal::SERVICE`], the seam's collectives'
/// [`crate::link::collective::SERVICE`]. The seam names none of them; two
/// layers that chose the same number find out when the second registers
/// ([`NodeLink::set_service`] refuses it).
///
/// Equality and hashing look at the number only: a step that came over
/// the wire ([`Step::from_words`]) names its layer by number.
#[derive(Clone, Copy, Debug)]
pub struct ServiceId {
    number: u8,
    name: &'static str,
}

impl ServiceId {
    /// The service numbered `number` (1 to 127; 0 and 128 up are the
    /// transports' own), called `name` in messages ("the shared memory").
    pub const fn new(number: u8, name: &'static str) -> ServiceId {
        assert!(number > 0 && number < 128, "a service's number is 1 to 127");
        ServiceId { number, name }
    }

    /// The service's number on the wire (below 128).
    pub const fn number(self) -> u8 {
        self.number
    }

    /// The service's name, for messages.
    pub const fn name(self) -> &'static str {
        self.name
    }

    /// The service numbered `n`, named as it was registered on this node
    /// (see [`crate::link::ServiceTable`]) or else by its number; `None`
    /// for a number no service may have.
    pub fn from_number(n: u8) -> Option<ServiceId> {
        if n == 0 || n >= 128 {
            return None;
        }
        let name = crate::link::registered_name(n).unwrap_or("an unregistered service");
        Some(ServiceId { number: n, name })
    }
}

impl PartialEq for ServiceId {
    fn eq(&self, other: &Self) -> bool {
        self.number == other.number
    }
}

impl Eq for ServiceId {}

impl std::hash::Hash for ServiceId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.number.hash(state)
    }
}

impl std::fmt::Display for ServiceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// Why a [`Service`] refused a message: the layer's own error type (the
/// shared memory's `ProtocolError`, the stealing protocol's), boxed so that
/// the seam needs to know none of them and a caller can still downcast.
pub type FrameError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A layer that answers its own messages on the node's delivery thread
/// (the DSM's page server, cross-node stealing). See the
/// [module docs](crate::link).
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

/// The largest payload every transport must carry (64 MiB): a layer that
/// sends more splits it.
pub const MAX_PAYLOAD: usize = 64 << 20;

/// A node's sending side, for its services. It does not keep the link
/// alive (a service keeps one to answer requests while its node closes).
pub trait Port: Send + Sync + 'static {
    /// Sends to `service` on node `to` a payload that `fill` appends to the
    /// vector it is given (which may already hold the transport's header:
    /// `fill` only appends; `len_hint` is the expected length, for one
    /// allocation). Never blocks. Returns the bytes the message takes on
    /// the link (payload and framing), for the service's counters.
    ///
    /// Every transport carries payloads of 0 bytes up to [`MAX_PAYLOAD`]
    /// (`hyfi::conformance` checks both ends); a larger one may be refused
    /// with an error.
    fn send_with(
        &self,
        to: usize,
        service: ServiceId,
        class: Class,
        len_hint: usize,
        fill: &mut dyn FnMut(&mut Vec<u8>),
    ) -> Result<usize, LinkError>;

    /// Sends like [`Port::send_with`] a message that the receiving node
    /// reads only at a phase's end, where its master waits for it: a
    /// release's `REL`, a collective's piece. A transport that wakes a
    /// sleeping node for each message may leave this one unread while the
    /// receiver's master runs its share of a phase
    /// ([`Attending::Computing`](crate::link::Attending::Computing)): the
    /// master reads it when it stops, and the wake-up, which would take a
    /// CPU from the computation, is saved. The default sends it as any
    /// other.
    fn send_for_phase_end(
        &self,
        to: usize,
        service: ServiceId,
        class: Class,
        len_hint: usize,
        fill: &mut dyn FnMut(&mut Vec<u8>),
    ) -> Result<usize, LinkError> {
        self.send_with(to, service, class, len_hint, fill)
    }

    /// Sends `payload`, built whole by the caller (see [`Port::send_with`]).
    /// A transport that can send the vector itself takes it (no copy: the
    /// page server builds a reply under its locks and hands it over);
    /// the default copies it through [`Port::send_with`].
    fn send_vec(
        &self,
        to: usize,
        service: ServiceId,
        class: Class,
        payload: Vec<u8>,
    ) -> Result<usize, LinkError> {
        self.send_bytes(to, service, class, &payload)
    }

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
/// ([`NodeLink::traffic`]). Non-exhaustive: transports count more over
/// time, so a transport outside this crate starts from
/// `Traffic::default()` and sets the fields it counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Traffic {
    /// Control messages (requests, collectives, the link's own).
    pub control: ClassTraffic,
    /// Bulk messages (data).
    pub bulk: ClassTraffic,
    /// Connections refused after set-up (strays), where the link has any.
    pub refused: u64,
    /// Links to peers that carry their frames through shared memory (the
    /// TCP transport's lanes between nodes of one host); 0 elsewhere.
    pub shared_memory_links: u64,
    /// Times this node woke a peer that slept (a lane's bell: a syscall
    /// here, a thread woken there); 0 where the transport wakes no one.
    pub wakes: u64,
    /// Times this node's transport found frames that had come with no
    /// wake-up, when it woke for a timer of its own while none of the
    /// node's threads was reading or due to read them: each waited for
    /// the clock (a heartbeat's interval) instead of being read at once.
    /// Where the transport's wake-up protocol holds (the TCP transport's
    /// lanes count it) it stays 0 but for a rare race: a sender descheduled
    /// between publishing a frame and looking whether to wake the reader,
    /// while the reader's timer fired. A count that grows with the phases
    /// is a lost wake-up. The traffic line names it when it is not 0.
    pub unannounced: u64,
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
        )?;
        if self.shared_memory_links > 0 {
            write!(
                f,
                "; links over shared memory {}, peers woken {} times",
                self.shared_memory_links, self.wakes
            )?;
        }
        if self.unannounced > 0 {
            write!(
                f,
                "; frames read only at a timer {} times (more than a few are a lost \
                 wake-up, a bug of the transport: please report it)",
                self.unannounced
            )?;
        }
        Ok(())
    }
}

/// A section of a node's report (what SIGUSR1 prints on a cluster) from a
/// layer above: `None` once that layer is gone.
pub type Report = Box<dyn Fn() -> Option<String> + Send + Sync>;

#[cfg(test)]
mod tests {
    use super::*;

    const DSM: ServiceId = ServiceId::new(1, "the shared memory");
    const STEAL: ServiceId = ServiceId::new(2, "fork-join across nodes");

    #[test]
    fn steps_round_trip_and_a_setup_names_its_layer() {
        let steps = [
            Step::Phase {
                program: 1,
                phase: 2,
                iteration: 3,
            },
            Step::Alloc {
                seq: 0,
                elems: 10,
                bytes: 80,
            },
            Step::Start { program: 1 },
            Step::Distributed { seq: 1 },
            Step::Setup { layer: DSM },
            Step::Setup { layer: STEAL },
        ];
        for s in steps {
            assert_eq!(Step::from_words(s.to_words()), Some(s), "{s}");
        }
        // The shared memory's set-up is service 1 on the wire, as before.
        let dsm = Step::Setup { layer: DSM };
        assert_eq!(dsm.to_words(), [4, 1, 0, 0]);
        assert_eq!(dsm.to_string(), "set up the shared memory");
        // A number no service may have is no step, nor is a word that is service
        // 1 only in its low byte.
        assert_eq!(Step::from_words([4, 200, 0, 0]), None);
        assert_eq!(Step::from_words([4, 0x101, 0, 0]), None);
    }

    /// The traffic line names the shared-memory links and the wake-ups
    /// only where a transport has them.
    #[test]
    fn the_traffic_line_names_shared_memory_only_where_there_is_some() {
        let mut t = Traffic {
            refused: 2,
            ..Traffic::default()
        };
        let plain = t.to_string();
        assert!(plain.ends_with("refused connections 2"), "{plain}");
        assert!(!plain.contains("shared memory"), "{plain}");
        t.shared_memory_links = 3;
        t.wakes = 17;
        let lanes = t.to_string();
        assert!(
            lanes.ends_with(
                "refused connections 2; links over shared memory 3, peers woken 17 times"
            ),
            "{lanes}"
        );
        t.unannounced = 2;
        let lost = t.to_string();
        assert!(
            lost.contains("peers woken 17 times; frames read only at a timer 2 times"),
            "{lost}"
        );
    }
}
