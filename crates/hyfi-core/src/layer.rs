//! What a layer does with a runtime: the methods through which hyfi-net and
//! hyfi-dsm (or a layer of your own) plug into a [`Runtime`] and read a
//! [`Ctx`], as extension traits a program never imports.
//!
//! They are traits, not inherent methods, so that a program's `Runtime` and
//! `Ctx` show only the program's API: `rt.set_phase_end(..)` does not
//! compile without `use hyfi::layers::RuntimeExt`. Both traits are sealed:
//! only hyfi-core implements them.
//!
//! ```
//! use hyfi::layers::{RuntimeExt, SingleNode};
//! use hyfi::{Config, Runtime};
//! use std::sync::Arc;
//!
//! // A runtime over a link of the layer's choosing (here the one-node link).
//! let rt = Runtime::with_link(Config::new().procs(1).pin(false), Arc::new(SingleNode))?;
//! assert_eq!(rt.link().num_nodes(), 1);
//! assert!(rt.phase_end().is_none());
//! # Ok::<(), hyfi::Error>(())
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::balance::{Balancer, FjNode};
use crate::config::Config;
use crate::error::Error;
use crate::node::{NodeLink, PhaseEnd};
use crate::runtime::Runtime;
use crate::sched::Ctx;

mod sealed {
    pub trait Sealed {}
    impl Sealed for crate::runtime::Runtime {}
    impl Sealed for crate::sched::Ctx {}
}

/// A layer's side of a [`Runtime`]: starting one over a link, and
/// installing the phase-end hook and the fork-join balancer.
pub trait RuntimeExt: sealed::Sealed + Sized {
    /// Starts a runtime whose node-level steps (barrier, cross-node
    /// reduction, SPMD step checks) go through `link`: how the cluster
    /// layer plugs in. [`Runtime::new`] is this with the one-node link.
    fn with_link(cfg: Config, link: Arc<dyn NodeLink>) -> Result<Self, Error>;

    /// The node-level link this runtime was started with.
    fn link(&self) -> &Arc<dyn NodeLink>;

    /// Installs the work done at the end of every phase in place of the
    /// node-level barrier (see [`PhaseEnd`]). One per runtime: a second
    /// returns [`Error::PhaseEndTaken`].
    fn set_phase_end(&self, hook: Arc<dyn PhaseEnd>) -> Result<(), Error>;

    /// The phase-end hook installed, if any.
    fn phase_end(&self) -> Option<&Arc<dyn PhaseEnd>>;

    /// The counter behind [`CtxExt::access_epoch`], for layers that check
    /// per-phase access modes outside a filament (hyfi-dsm's element
    /// writes). Read it `Relaxed`: it changes only while no filament runs.
    fn access_epoch_counter(&self) -> Arc<AtomicU64>;

    /// Installs the cluster layer's side of fork-join across nodes (see
    /// [`Balancer`]). One per runtime: a second returns
    /// [`Error::BalancerTaken`].
    fn set_balancer(&self, b: Arc<dyn Balancer>) -> Result<(), Error>;

    /// The handle through which the cluster layer moves this node's
    /// filaments (see [`FjNode`]).
    fn fj_node(&self) -> FjNode;
}

impl RuntimeExt for Runtime {
    fn with_link(cfg: Config, link: Arc<dyn NodeLink>) -> Result<Self, Error> {
        Runtime::start_with_link(cfg, link)
    }

    fn link(&self) -> &Arc<dyn NodeLink> {
        &self.shared.link
    }

    fn set_phase_end(&self, hook: Arc<dyn PhaseEnd>) -> Result<(), Error> {
        self.shared
            .phase_end
            .set(hook)
            .map_err(|_| Error::PhaseEndTaken)
    }

    fn phase_end(&self) -> Option<&Arc<dyn PhaseEnd>> {
        self.shared.phase_end.get()
    }

    fn access_epoch_counter(&self) -> Arc<AtomicU64> {
        self.shared.access_epoch.clone()
    }

    fn set_balancer(&self, b: Arc<dyn Balancer>) -> Result<(), Error> {
        self.shared
            .fj
            .balancer
            .set(b)
            .map_err(|_| Error::BalancerTaken)
    }

    fn fj_node(&self) -> FjNode {
        FjNode(Arc::downgrade(&self.shared))
    }
}

/// A layer's side of a filament's [`Ctx`].
pub trait CtxExt: sealed::Sealed {
    /// The access epoch: a number that changes whenever a phase (each
    /// execution of it) or a fork-join run begins on this node, and only
    /// then. Layers above hyfi-core key per-phase state on it: hyfi-dsm's
    /// shared arrays record whether they are read-only or written in the
    /// current epoch, which is what makes their read-only views plain
    /// memory.
    fn access_epoch(&self) -> u64;

    /// The phase the filament runs in, as one number that differs between
    /// phases (of this program and of the programs run before it on this
    /// runtime) and stays the same across a phase's executions: layers key
    /// what they learn about a phase on it (hyfi-dsm: whether its write
    /// views may store plainly). `u64::MAX` in fork-join mode, where a
    /// filament may suspend in a join until another node's work is done
    /// (hyfi-dsm hands out plain-store views only within phases).
    fn phase_key(&self) -> u64;
}

impl CtxExt for Ctx {
    #[inline]
    fn access_epoch(&self) -> u64 {
        self.shared.access_epoch.load(Ordering::Relaxed)
    }
    #[inline]
    fn phase_key(&self) -> u64 {
        self.phase.get()
    }
}
