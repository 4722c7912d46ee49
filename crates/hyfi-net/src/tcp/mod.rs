//! The TCP transport (`HYFI_TRANSPORT=tcp`, the default): hyfi's own,
//! over sockets, under every launcher, hyfi's own included.
//!
//! A node of a TCP job is a [`Cluster`], hyfi-core's [`NodeLink`] for it.
//! Its parts, in the order a job meets them:
//!
//! * [`rendezvous`]: the file where node 0 publishes its address (and the
//!   job's token, when the launcher handed out none);
//! * [`mesh`]: the full mesh of connections, opened with the authenticated
//!   handshake of [`wire`] (whose frames then carry every message), and
//!   strangers refused, one rate-limited line each (`refusal`);
//! * [`comm`]: the message substrate, one communication thread per node
//!   (the link protocol is in its `README.md`): services, heartbeats, the
//!   SPMD step checks ([`hyfi_core::link::spmd`]) and failure detection;
//! * [`collective`]: the seam's barrier and all-reduce over it.
//!
//! What the launcher hands out is not this transport's: the job's
//! [`JobSpec`](crate::bootstrap::JobSpec) (rank, node count, job id) with
//! its meeting point ([`Rendezvous`](crate::bootstrap::Rendezvous)) and
//! secret ([`Token`](crate::bootstrap::Token)) is [`crate::bootstrap`]'s,
//! since hyfi's launchers make and pass them whatever reads them; the
//! failure plumbing (first causes, [`FAILURE_GRACE`](crate::FAILURE_GRACE),
//! signals) is the crate's. This module is how TCP nodes use them: how
//! they meet at the rendezvous, prove the token and talk.
//!
//! [`NodeLink`]: hyfi_core::NodeLink

mod cluster;
pub mod collective;
pub mod comm;
pub mod lane;
pub mod mesh;
mod refusal;
pub mod rendezvous;
pub mod wire;

pub use cluster::{Cluster, Report};
