//! What can go wrong in the DSM, each with what to do about it.

/// Errors of the shared memory.
#[derive(thiserror::Error)]
pub enum DsmError {
    /// The shared region could not be reserved at the same address everywhere.
    #[error(
        "node {node} could not reserve the shared region of {size} bytes at {addr:#x}: {why}; \
         set HYFI_DSM_ADDR to another free address (hex, page-aligned, the same on every node) \
         or HYFI_DSM_SIZE to a smaller size"
    )]
    Region {
        /// The node that failed.
        node: usize,
        /// The address tried.
        addr: usize,
        /// The region size.
        size: usize,
        /// The system's reason.
        why: String,
    },

    /// The nodes did not agree on the region (different settings per node).
    #[error(
        "the nodes reserved different shared regions (addresses {lo:#x}..{hi:#x}): \
         give every node the same HYFI_DSM_ADDR and HYFI_DSM_SIZE"
    )]
    RegionMismatch {
        /// Lowest address reported.
        lo: usize,
        /// Highest address reported.
        hi: usize,
    },

    /// The shared region has no room left for an allocation.
    #[error(
        "the shared region is full: allocation #{seq} needs {asked} bytes, {free} of {size} are free; \
         raise HYFI_DSM_SIZE (bytes, or with a K/M/G/T suffix)"
    )]
    RegionFull {
        /// Allocation sequence number.
        seq: u64,
        /// Bytes asked (page-rounded).
        asked: usize,
        /// Bytes free.
        free: usize,
        /// Region size.
        size: usize,
    },

    /// Not every node made the same allocation.
    #[error(
        "shared allocation #{seq} differs between nodes ({what}): every node must make the same \
         shared allocations (same types, shapes and placements) in the same order"
    )]
    Mismatch {
        /// Allocation sequence number.
        seq: u64,
        /// What differed.
        what: &'static str,
    },

    /// A placement named a node that does not exist, or had the wrong length.
    #[error("bad placement: {0}")]
    Placement(String),

    /// An element type that cannot live in shared pages.
    #[error("element type {ty} ({size} bytes, alignment {align}) cannot be shared: elements must be at most one page ({page} bytes)")]
    Element {
        /// Type name.
        ty: &'static str,
        /// Its size.
        size: usize,
        /// Its alignment.
        align: usize,
        /// The page size.
        page: usize,
    },

    /// A bad environment variable.
    #[error("{var}={value:?} is not valid: expected {expected}")]
    BadEnv {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What it should be.
        expected: &'static str,
    },

    /// The runtime's link carries no services (no [`hyfi_core::NodeLink::port`]).
    #[error(
        "this runtime spans {nodes} nodes through a link that carries no services \
         (NodeLink::port is None): start it with hyfi::init (or hyfi_net::init_nodes), \
         or give it a link that implements the node seam (hyfi_core::link)"
    )]
    NoServices {
        /// Node count of the link.
        nodes: usize,
    },

    /// The runtime refused the DSM's phase-end hook.
    #[error(transparent)]
    Core(#[from] hyfi_core::Error),

    /// A collective step failed through the runtime's link.
    #[error("shared memory: a collective step failed: {0}")]
    Link(hyfi_core::LinkError),
}

/// Debug shows the message (as `anyhow` does), so that `?` in a `main`
/// returning `Result<(), Box<dyn Error>>` prints what happened and what to
/// change, not the variant's fields.
impl std::fmt::Debug for DsmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// Into the program's one error type (`hyfi::Error`): a refusal of the
/// runtime is that error again; any other failure becomes
/// [`hyfi_core::Error::Layer`] of layer `"hyfi-dsm"`, which shows this
/// message and has this error as its source (a configuration error for a
/// bad `HYFI_*` setting).
impl From<DsmError> for hyfi_core::Error {
    fn from(e: DsmError) -> Self {
        match e {
            DsmError::Core(e) => e,
            e => hyfi_core::Error::Layer {
                layer: "hyfi-dsm",
                config: matches!(e, DsmError::BadEnv { .. }),
                source: Box::new(e),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::DsmError;

    #[test]
    fn converts_into_the_core_error_with_its_message_and_source() {
        let dsm = DsmError::Placement("Node(5) names node 5, but the job has 1 nodes".into());
        let msg = dsm.to_string();
        let e = hyfi_core::Error::from(dsm);
        assert!(matches!(
            e,
            hyfi_core::Error::Layer {
                layer: "hyfi-dsm",
                config: false,
                ..
            }
        ));
        assert_eq!(e.exit_code(), 1);
        assert_eq!(e.to_string(), msg);
        assert_eq!(format!("{e:?}"), msg);
        let src = std::error::Error::source(&e).expect("the layer's error is the source");
        assert!(matches!(
            src.downcast_ref::<DsmError>(),
            Some(DsmError::Placement(_))
        ));

        // A setting to change is a configuration error: exit code 2.
        let e = hyfi_core::Error::from(DsmError::BadEnv {
            var: "HYFI_DSM_SIZE",
            value: "lots".into(),
            expected: "a size",
        });
        assert!(matches!(
            e,
            hyfi_core::Error::Layer {
                layer: "hyfi-dsm",
                config: true,
                ..
            }
        ));
        assert_eq!(e.exit_code(), 2);

        let core = hyfi_core::Error::from(DsmError::Core(hyfi_core::Error::PhaseEndTaken));
        assert!(matches!(core, hyfi_core::Error::PhaseEndTaken));
    }
}

/// A DSM message that breaks the protocol: from a node of another build, or
/// a bug. Each one fails the node (and so the job) with this text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ProtocolError {
    /// The message ends before its fields do.
    #[error("the message is cut short at byte {at}")]
    Truncated { at: usize },
    /// It names a page no shared array holds.
    #[error("{what} page {page}, which no shared array holds")]
    UnknownPage { what: &'static str, page: u64 },
    /// It names a page homed at another node than the message implies.
    #[error("{what} page {page}, whose home is node {home}, not node {expected}")]
    WrongHome {
        what: &'static str,
        page: u64,
        home: usize,
        expected: usize,
    },
    /// A diff whose runs do not fit its page.
    #[error("a malformed diff for page {page}")]
    MalformedDiff { page: u64 },
    /// A page reply nobody asked for.
    #[error("page {page} arrived, but it was not requested")]
    NotRequested { page: u64 },
    /// A broadcast whose root or span does not fit the job.
    #[error(
        "a broadcast from root node {root} covering {span} nodes, which does not fit a job \
         of {nodes} nodes with this node in it"
    )]
    BadBroadcast {
        root: usize,
        span: usize,
        nodes: usize,
    },
    /// A release of an epoch this node has already completed.
    #[error("a release of epoch {epoch} came after this node completed {completed}")]
    LateRelease { epoch: u64, completed: u64 },
    /// Bytes after the last field.
    #[error("{len} stray bytes after a release")]
    StrayBytes { len: usize },
    /// A kind byte no version of the protocol uses.
    #[error("unknown message kind {kind}")]
    UnknownKind { kind: u8 },
    /// A message without even a kind byte.
    #[error("an empty message")]
    Empty,
}

/// A [`ProtocolError`] in a message from node `from`: what the shared
/// memory's service returns through the node seam
/// ([`hyfi_core::link::Service::frame`]), so that the transport's error
/// names the layer, the sender and the violation, and keeps this as its
/// source.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("shared memory: a message from node {from}: {error}")]
pub(crate) struct Violation {
    /// The sender.
    pub(crate) from: usize,
    /// What it broke.
    #[source]
    pub(crate) error: ProtocolError,
}

/// Why a release (the end of a phase on several nodes) could not
/// complete; the phase-end hook hands it to the runtime as its link error.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReleaseError {
    /// The node had failed (a lost peer, an abort, a violation): that
    /// failure's text, as every waiter of the node reports it.
    #[error("{0}")]
    Failed(String),
    /// A release that breaks the protocol.
    #[error(transparent)]
    Violation(#[from] Violation),
    /// A write notice that breaks the protocol (notices are merged, so
    /// their sender is not known here).
    #[error(transparent)]
    Notice(ProtocolError),
    /// The release's collective (the count of `REL`s each node receives)
    /// failed: the link's error (a lost node, SPMD divergence).
    #[error("{0}")]
    Link(hyfi_core::LinkError),
    /// Broadcasts this node expected (it called `broadcast_rows`) did not
    /// come: their homes did not make the same call.
    #[error(
        "node {me} waited {secs} s for {missing} broadcast message(s) of rows it named in \
         `broadcast_rows` (or `DsmVec::broadcast`), which their home nodes never sent: call it \
         on every node alike, with the same rows, in the same post-phase code"
    )]
    BroadcastMissing { me: usize, missing: u64, secs: u64 },
    /// The two nodes' releases carried phase-end reductions of different
    /// sizes: they did not name the same reductions.
    #[error(
        "node {me} ended phase {phase} with {expected} bytes of reductions \
         (`Program::reduce_at_end`) and node {from} with {got}: every node must run the same \
         program, naming the same reductions after the same phases"
    )]
    Carried {
        me: usize,
        from: usize,
        phase: usize,
        got: usize,
        expected: usize,
    },
}

impl ReleaseError {
    /// Found by this node, not reported to it: its peers do not know of it
    /// (they wait for this node's next release), so the node must end the
    /// job with it. `Failed` and `Link` are the link's, which ends the job
    /// itself.
    pub(crate) fn found_here(&self) -> bool {
        !matches!(self, ReleaseError::Failed(_) | ReleaseError::Link(_))
    }
}
