//! The seams between hyfi's layers, for whoever writes or tests a layer; a
//! program needs none of this.
//!
//! hyfi is three layers: `hyfi_core` runs one node (server threads,
//! filthreads, pools, phases, reductions, fork-join); `hyfi_net` connects
//! nodes (start-up, the mesh, the communication thread, cross-node
//! stealing); `hyfi_dsm` shares memory across them. Each plugs into the one
//! below through the names here:
//!
//! * **The node-level step.** A runtime takes its barrier, cross-node
//!   reductions and SPMD step checks through a [`NodeLink`] ([`SingleNode`]
//!   on one node; hyfi-net's [`Cluster`] on several), whose errors are
//!   [`LinkError`]s, comparing [`Step`]s between nodes.
//! * **The end of a phase.** A [`PhaseEnd`] hook replaces the barrier at the
//!   end of every phase (the DSM's release); fork-join runs end with
//!   [`FORK_JOIN_PHASE`] as the phase index.
//! * **Fork-join across nodes.** hyfi-core carries it itself, over the
//!   node seam: [`steal::install`] makes a runtime's fork-join runs span its
//!   link's nodes (hyfi-net does so for every runtime of several nodes).
//!   [`Slot`] places a filament in the start-up tree; [`Failure`] is a
//!   failure as it travels between nodes; [`remote`] and [`steal`]
//!   describe the protocol.
//! * **Waiting.** A layer suspends a filthread until its page or message
//!   arrives with [`filthread::suspend`], and records what it waits for with
//!   [`waits::waiting`] (the SIGUSR1 hang report).
//! * **The node seam** ([`link`]): sending to a node with a priority class
//!   ([`link::Class`]: control overtakes queued bulk), services under typed
//!   ids ([`link::ServiceId`], [`link::Service`]), typed traffic counters;
//!   hyfi-net implements it over TCP, [`link::InProcess`] with channels
//!   between several runtimes of one process (for protocol tests). The
//!   shared memory and cross-node stealing ([`steal`]) use only the seam.
//! * **Errors.** Each layer has its own error type ([`NetError`],
//!   [`DsmError`]); a program sees them as [`crate::Error::Layer`], which
//!   names the layer and has the layer's error as its source.
//!
//! * **A layer's side of `Runtime` and `Ctx`** ([`RuntimeExt`],
//!   [`CtxExt`]): starting a runtime over a link, installing the phase-end
//!   hook, keeping a layer's state on the runtime
//!   ([`RuntimeExt::set_layer_state`]), the per-phase access epoch the DSM
//!   keys its views on. Extension traits, so that a program's `Runtime` shows only
//!   the program's API: these methods exist for code that imports them.
//! * **Bytes that ride with a reduction at a phase's end** ([`Payload`],
//!   [`ProgramExt::reduce_at_end_carrying`]): how hyfi-dsm sends LU's
//!   pivot row in the release that finds the pivot.

pub use hyfi_core::layer::{CtxExt, Payload, ProgramExt, RuntimeExt};
pub use hyfi_core::{filthread, layer, link, remote, steal, waits};
pub use hyfi_core::{
    is_registered, parse_size, Failure, LinkError, NodeLink, PhaseEnd, SingleNode, Slot, Step,
    FORK_JOIN_PHASE,
};
pub use hyfi_dsm::DsmError;
pub use hyfi_net::{Cluster, NetError};
