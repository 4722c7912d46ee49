//! Fork-join across nodes, the vocabulary: the plain data and state that
//! the scheduler's core and the cross-node layer (`crate::remote`) share.
//!
//! The core holds a node's cross-node state ([`NodeState`], in the
//! registry), a processor's start-up [`Slot`] and a serializable job's
//! shipping table ([`RemoteVTable`]) without knowing how the layer fills
//! them in; the layer (`remote`: start-up distribution, `balance`, `steal`)
//! builds on the core. Of that layer the state names one thing, the node's
//! fork-join messaging ([`Stealing`], installed by `steal::install`), which
//! the scheduler calls to ask other nodes for work. A [`Failure`], which
//! travels between nodes, is here too. The protocol is in
//! `remote/README.md`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::remote::steal::Stealing;
use crate::stats::RemoteStats;

/// A place in the start-up tree: slot `slot`, at depth `depth`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slot {
    /// Slot index, `0..nodes × procs`.
    pub slot: u32,
    /// How many forks of the tree lie above.
    pub depth: u32,
}

/// Why a shipped filament (or the run it belongs to) failed, in a form that
/// travels between nodes. Converted to [`Error`] where the run returns.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[non_exhaustive]
pub enum Failure {
    /// The filament (or one it joined) panicked.
    Panic {
        /// Node it ran on.
        node: usize,
        /// Processor it ran on.
        proc: usize,
        /// The panic message.
        message: String,
    },
    /// A node received a filament whose function it has not registered.
    Unknown {
        /// The node that received it.
        node: usize,
        /// The function's name.
        name: String,
    },
    /// An argument or a result could not be encoded or decoded.
    Codec {
        /// The node that failed.
        node: usize,
        /// The function's name.
        name: String,
        /// What failed.
        why: String,
    },
    /// The cluster failed (a lost node, an abort) during the run.
    Lost {
        /// What the cluster layer reported.
        why: String,
    },
}

impl From<Failure> for Error {
    fn from(f: Failure) -> Error {
        match f {
            Failure::Panic {
                node,
                proc,
                message,
            } => Error::FilamentPanic {
                node,
                proc,
                during: "fork-join".into(),
                message,
            },
            Failure::Unknown { node, name } => Error::UnknownFilament { node, name },
            Failure::Codec { node, name, why } => Error::FilamentCodec { node, name, why },
            Failure::Lost { why } => Error::Link(why.into()),
        }
    }
}

/// The panic payload that carries a [`Failure`] up through joins, so the
/// root reports the original node's error, not "a join panicked".
pub(crate) struct RemoteFailure(pub(crate) Failure);

/// A shipped filament's argument or result that would not encode or
/// decode. It reaches the other node as [`Failure::Codec`], whose text it
/// becomes (a failure travels as data).
#[derive(Debug, thiserror::Error)]
pub(crate) enum CodecError {
    /// The argument that came would not decode as the function's type.
    #[error("decoding its argument: {0}")]
    DecodeArgument(#[source] bincode::Error),
    /// The function's result would not encode.
    #[error("encoding its result: {0}")]
    EncodeResult(#[source] bincode::Error),
    /// The argument would not encode for shipping.
    #[error("encoding its argument: {0}")]
    EncodeArgument(#[source] bincode::Error),
    /// The job was exported after it ran (a bug in the runtime).
    #[error("hyfi: exported a job that already ran")]
    AlreadyRan,
}

/// A shipped filament: its function's name and its encoded argument.
pub(crate) type Encoded = (&'static str, Vec<u8>);

/// How the cluster layer handles a `RemoteJob` (`remote::join`) behind a type-erased
/// pointer: one static table per argument and result type.
pub(crate) struct RemoteVTable {
    /// The function's name and the encoded argument; the job keeps its
    /// argument if encoding fails.
    pub(crate) export: unsafe fn(*const ()) -> Result<Encoded, CodecError>,
    /// Completes the job with what the node that ran it sent back (the
    /// last argument is this node, for the error if the result will not
    /// decode).
    pub(crate) complete: unsafe fn(*const (), Result<Vec<u8>, Failure>, usize),
    /// The start-up slot the job carries (see `remote::startup`).
    pub(crate) startup: unsafe fn(*const ()) -> Option<Slot>,
}

/// A filament shipped from this node, waiting for its result.
pub(crate) struct Pending {
    pub(crate) ptr: *const (),
    pub(crate) vtable: &'static RemoteVTable,
}
// SAFETY: the pointee is a RemoteJob whose argument and result types are
// Send; its joiner waits for `complete` before freeing it, and the table
// hands each entry to exactly one completer.
unsafe impl Send for Pending {}

/// The cross-node fork-join state of one node.
#[derive(Default)]
pub(crate) struct NodeState {
    /// The node's fork-join messaging (several nodes; `steal::install`).
    pub(crate) stealing: OnceLock<Arc<Stealing>>,
    /// The distributed run in progress, 0 if none.
    pub(crate) run: AtomicU64,
    pub(crate) next_run: AtomicU64,
    /// Set when the cluster failed: every join unwinds.
    pub(crate) abort: AtomicBool,
    pub(crate) failure: Mutex<Option<Failure>>,
    /// The root's outcome, as node 0 sent it (other nodes).
    pub(crate) outcome: Mutex<Option<Result<Vec<u8>, Failure>>>,
    pub(crate) pending: Mutex<HashMap<u64, Pending>>,
    pub(crate) next_token: AtomicU64,
    /// Where the next received filament goes (spreading round-robin).
    pub(crate) spread: AtomicUsize,
    /// Where the next export starts taking (round-robin over processors).
    pub(crate) take_from: AtomicUsize,
    /// Bumped when idle processors should look again (a refused request):
    /// an idle processor waits for work, the run's end, or a change here.
    pub(crate) kick: AtomicU64,
    pub(crate) counters: Counters,
    /// Steal requests through memory shared with the other nodes of the
    /// host, where the link lends some (`remote::host`).
    pub(crate) host: Option<crate::remote::host::HostRequests>,
}

/// [`RemoteStats`] as atomics (the communication thread updates them).
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) steal_requests: AtomicU64,
    pub(crate) steals: AtomicU64,
    pub(crate) filaments_in: AtomicU64,
    pub(crate) filaments_out: AtomicU64,
    pub(crate) requests_served: AtomicU64,
    pub(crate) requests_refused: AtomicU64,
    pub(crate) steal_wait_ns: AtomicU64,
    pub(crate) requests_through_memory: AtomicU64,
    pub(crate) requests_resent: AtomicU64,
    pub(crate) served_by_processors: AtomicU64,
    pub(crate) latent_exported: AtomicU64,
}

impl Counters {
    pub(crate) fn get(&self) -> RemoteStats {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RemoteStats {
            steal_requests: g(&self.steal_requests),
            steals: g(&self.steals),
            filaments_in: g(&self.filaments_in),
            filaments_out: g(&self.filaments_out),
            requests_served: g(&self.requests_served),
            requests_refused: g(&self.requests_refused),
            steal_wait_ns: g(&self.steal_wait_ns),
            requests_through_memory: g(&self.requests_through_memory),
            requests_resent: g(&self.requests_resent),
            served_by_processors: g(&self.served_by_processors),
            latent_exported: g(&self.latent_exported),
        }
    }
    pub(crate) fn reset(&self) {
        for a in [
            &self.steal_requests,
            &self.steals,
            &self.filaments_in,
            &self.filaments_out,
            &self.requests_served,
            &self.requests_refused,
            &self.steal_wait_ns,
            &self.requests_through_memory,
            &self.requests_resent,
            &self.served_by_processors,
            &self.latent_exported,
        ] {
            a.store(0, Ordering::Relaxed);
        }
    }
}

pub(crate) fn bump(a: &AtomicU64, n: u64) {
    a.fetch_add(n, Ordering::Relaxed);
}

impl NodeState {
    /// Completes shipped filament `token` with `outcome` (`me` is this
    /// node); `false` if no such filament waits (already completed by the
    /// failure path, or never shipped).
    pub(crate) fn complete_pending(
        &self,
        token: u64,
        outcome: Result<Vec<u8>, Failure>,
        me: usize,
    ) -> bool {
        let p = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&token);
        match p {
            Some(p) => {
                // SAFETY: removed from the table, so this is the only
                // completer; the joiner is still waiting for the latch.
                unsafe { (p.vtable.complete)(p.ptr, outcome, me) };
                true
            }
            None => false,
        }
    }

    pub(crate) fn failure(&self) -> Failure {
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or(Failure::Lost {
                why: "the cluster failed".into(),
            })
    }
    pub(crate) fn active(&self, run: u64) -> bool {
        run != 0 && self.run.load(Ordering::SeqCst) == run && !self.abort.load(Ordering::SeqCst)
    }
}

impl NodeState {
    pub(crate) fn failure_or_stale(&self, run: u64) -> Failure {
        if self.abort.load(Ordering::SeqCst) {
            self.failure()
        } else {
            Failure::Lost {
                why: format!("a filament of fork-join run {run} arrived after that run ended"),
            }
        }
    }
}
