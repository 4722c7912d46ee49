//! The error type of hyfi-net: each message names the node, the variable or
//! the address, and says what to check.

use std::io;

/// What went wrong in the cluster layer.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum NetError {
    /// An environment variable holds a value hyfi cannot use.
    #[error("invalid configuration: {var}={value:?} is not valid: expected {expected}")]
    BadEnv {
        /// Variable name.
        var: &'static str,
        /// What it held.
        value: String,
        /// What it should hold.
        expected: &'static str,
    },

    /// A launcher was detected but nothing says where the peers meet.
    #[error(
        "{launcher} started this process as node {rank} of {nodes}, but hyfi cannot tell where \
         the nodes meet: {hint}"
    )]
    NoRendezvous {
        /// The launcher detected.
        launcher: &'static str,
        /// This rank.
        rank: usize,
        /// Number of nodes.
        nodes: usize,
        /// What to set.
        hint: &'static str,
    },

    /// This node could not reach the coordinator (or a peer) in time.
    #[error(
        "node {rank}: could not reach {what} at {addr} within {secs} s ({source}); check that \
         node 0 is running, that {addr} is reachable from this host, and that every node was \
         started with the same HYFI_COORD / HYFI_RENDEZVOUS"
    )]
    Unreachable {
        /// This rank.
        rank: usize,
        /// "the coordinator" or "node k".
        what: String,
        /// Address tried.
        addr: String,
        /// Seconds waited.
        secs: u64,
        /// Last error.
        #[source]
        source: io::Error,
    },

    /// The rendezvous file (or its directory) cannot be used safely.
    #[error("rendezvous file {path}: {why}")]
    Rendezvous {
        /// The file or directory.
        path: String,
        /// What is wrong, and what to do.
        why: String,
    },

    /// A node cannot learn the job's token: none was given and node 0 is on
    /// another host.
    #[error(
        "node {rank}: no HYFI_TOKEN, and node 0 ({coord}) is on another host, so this node cannot          read the token node 0 made; give every node the same secret, e.g.          `export HYFI_TOKEN=$(openssl rand -hex 16)` then `mpirun -x HYFI_TOKEN ...` or          `srun --export=ALL,HYFI_TOKEN=$HYFI_TOKEN ...`"
    )]
    NoToken {
        /// This rank.
        rank: usize,
        /// The coordinator's address.
        coord: String,
    },

    /// A peer answered, but the handshake never succeeded in time.
    #[error(
        "node {rank}: {what} at {addr} did not complete the handshake within {secs} s ({source});          every node must be given the same HYFI_TOKEN (or, without one, run as the same user          on node 0's host, reading its rendezvous file)"
    )]
    Rejected {
        /// This rank.
        rank: usize,
        /// "the coordinator (node 0)" or "node k".
        what: String,
        /// Address tried.
        addr: String,
        /// Seconds waited.
        secs: u64,
        /// The last failure.
        #[source]
        source: crate::tcp::wire::HandshakeError,
    },

    /// Not every node showed up at the coordinator in time.
    #[error(
        "node 0 (coordinator): only {arrived} of {nodes} nodes arrived within {secs} s \
         (missing: {missing}); check that all were started, with the same node count"
    )]
    MissingNodes {
        /// Nodes that arrived (counting node 0).
        arrived: usize,
        /// Nodes expected.
        nodes: usize,
        /// Ranks that did not.
        missing: String,
        /// Seconds waited.
        secs: u64,
    },

    /// Nodes disagree about the job's shape.
    #[error(
        "node {rank} was started for {theirs} nodes but node 0 for {ours}; start every node with \
         the same node count"
    )]
    NodeCountMismatch {
        /// The disagreeing rank.
        rank: usize,
        /// Its node count.
        theirs: usize,
        /// Node 0's.
        ours: usize,
    },

    /// Two processes claimed the same rank.
    #[error("two processes claim to be node {rank}; each node needs its own rank")]
    DuplicateRank {
        /// The rank.
        rank: usize,
    },

    /// A connection was refused at the handshake.
    #[error("handshake from {peer} refused: {why}")]
    Handshake {
        /// Peer address.
        peer: String,
        /// Reason.
        why: String,
    },

    /// A peer died or its connection dropped.
    #[error(
        "node {me}: lost node {lost} ({why}); the job cannot go on without it. Look at node \
         {lost}'s output for the cause"
    )]
    LostNode {
        /// This node.
        me: usize,
        /// The node lost.
        lost: usize,
        /// What happened.
        why: String,
    },

    /// The job failed: this node's failure, or the first cause it heard of
    /// (`node 1 failed first: …`, see [`crate::cause`]).
    #[error("node {me}: {cause}")]
    Aborted {
        /// This node.
        me: usize,
        /// Why.
        cause: String,
    },

    /// A message could not be encoded or decoded.
    #[error("node {me}: bad message from node {from}: {why}")]
    Protocol {
        /// This node.
        me: usize,
        /// Sender.
        from: usize,
        /// What was wrong.
        why: String,
    },

    /// The launcher could not start or supervise the nodes.
    #[error("launcher: {0}")]
    Launch(String),

    /// The program to launch is not there (exit code 127) or cannot be
    /// run (126), as a shell says.
    #[error("launcher: {what}")]
    NoProgram {
        /// What happened, and what to check.
        what: String,
        /// 127 or 126.
        code: i32,
    },

    // --- the launcher's limits (launch.rs, hyfi-run) ---
    /// The launcher was asked for more local nodes than it may start.
    #[error(
        "launcher: cannot start {nodes} nodes on this host: {why}. Start at most {max} (HYFI_NODES, \
         --nodes or hyfi-run -n), or spread the job over several hosts with mpirun or srun"
    )]
    TooManyNodes {
        /// Nodes asked for.
        nodes: usize,
        /// The most that fit.
        max: usize,
        /// Which bound, and how to change it.
        why: String,
    },
    // --- end of the launcher's limits ---
    /// An OS call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// The single-node runtime refused to start.
    #[error(transparent)]
    Core(#[from] hyfi_core::Error),
}

impl NetError {
    /// What kind of failure this is, for the exit code (see
    /// [`crate::cause::CauseKind::exit_code`]).
    pub fn cause_kind(&self) -> crate::cause::CauseKind {
        use crate::cause::CauseKind;
        match self {
            NetError::BadEnv { .. }
            | NetError::NoRendezvous { .. }
            | NetError::NoToken { .. }
            | NetError::NodeCountMismatch { .. }
            | NetError::DuplicateRank { .. }
            | NetError::TooManyNodes { .. } => CauseKind::Config,
            NetError::Core(e) if e.is_config() => CauseKind::Config,
            NetError::Unreachable { .. }
            | NetError::Rendezvous { .. }
            | NetError::Rejected { .. }
            | NetError::MissingNodes { .. }
            | NetError::Handshake { .. } => CauseKind::Startup,
            _ => CauseKind::Program,
        }
    }

    /// The exit code of a launcher that failed with this error before its
    /// nodes ran (the README's table): 2 for configuration, 126/127 for a
    /// program that cannot be run or is not there, 1 otherwise.
    pub fn launcher_exit_code(&self) -> i32 {
        match self {
            NetError::NoProgram { code, .. } => *code,
            e => e.cause_kind().exit_code(),
        }
    }

    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> Self {
        NetError::Io {
            what: what.into(),
            source,
        }
    }
}

/// Into the program's one error type (`hyfi::Error`): a refusal of the
/// single-node runtime is that error again; any other failure becomes
/// [`hyfi_core::Error::Layer`] of layer `"hyfi-net"`, which shows this
/// message and has this error as its source (a configuration error when
/// its cause is a setting to change).
impl From<NetError> for hyfi_core::Error {
    fn from(e: NetError) -> Self {
        match e {
            NetError::Core(e) => e,
            e => hyfi_core::Error::Layer {
                layer: "hyfi-net",
                config: e.cause_kind() == crate::cause::CauseKind::Config,
                source: Box::new(e),
            },
        }
    }
}

/// Debug shows the message (as `anyhow` does), so that `?` in a `main`
/// returning `Result<(), Box<dyn Error>>` prints what happened and what to
/// change, not the variant's fields.
impl std::fmt::Debug for NetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::NetError;

    #[test]
    fn debug_is_the_message() {
        let e = NetError::BadEnv {
            var: "HYFI_NODES",
            value: "two".into(),
            expected: "a node count of at least 1",
        };
        assert_eq!(format!("{e:?}"), e.to_string());
        assert!(format!("{e:?}").contains("HYFI_NODES=\"two\" is not valid"));
    }

    #[test]
    fn converts_into_the_core_error_with_its_message_and_source() {
        let net = NetError::Aborted {
            me: 0,
            cause: "node 1 failed first: x".into(),
        };
        let msg = net.to_string();
        let e = hyfi_core::Error::from(net);
        assert!(matches!(
            e,
            hyfi_core::Error::Layer {
                layer: "hyfi-net",
                config: false,
                ..
            }
        ));
        assert_eq!(e.to_string(), msg);
        assert_eq!(format!("{e:?}"), msg);
        assert_eq!(e.exit_code(), 1);
        let src = std::error::Error::source(&e).expect("the layer's error is the source");
        assert!(matches!(
            src.downcast_ref::<NetError>(),
            Some(NetError::Aborted { me: 0, .. })
        ));

        // A setting to change is a configuration error: exit code 2.
        let e = hyfi_core::Error::from(NetError::DuplicateRank { rank: 3 });
        assert!(matches!(
            e,
            hyfi_core::Error::Layer {
                layer: "hyfi-net",
                config: true,
                ..
            }
        ));
        assert_eq!(e.exit_code(), 2);
        let src = std::error::Error::source(&e).expect("the layer's error is the source");
        assert!(matches!(
            src.downcast_ref::<NetError>(),
            Some(NetError::DuplicateRank { rank: 3 })
        ));

        // The runtime's own refusal comes back as itself, not wrapped twice.
        let core = hyfi_core::Error::from(NetError::Core(hyfi_core::Error::EmptyProgram));
        assert!(matches!(core, hyfi_core::Error::EmptyProgram));
    }
}
