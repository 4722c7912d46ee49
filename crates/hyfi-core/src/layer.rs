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

use std::any::{type_name, Any, TypeId};
use std::collections::hash_map::{Entry, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::config::Config;
use crate::error::Error;
use crate::node::{NodeLink, PhaseEnd};
use crate::phase::Program;
use crate::reduce::Reduction;
use crate::runtime::Runtime;
use crate::sched::Ctx;

mod sealed {
    pub trait Sealed {}
    impl Sealed for crate::runtime::Runtime {}
    impl Sealed for crate::sched::Ctx {}
    impl Sealed for crate::phase::Program<'_> {}
}

/// Bytes that travel with a reduction a phase reduces at its end and
/// follow its result ([`ProgramExt::reduce_at_end_carrying`]): each node
/// offers some along with its value; where two values combine, the bytes
/// of the input the result equals go on (the combine must pick one of its
/// inputs: a maximum, a minimum, an argmax); every node receives the
/// result's. hyfi-dsm sends LU's pivot row this way, in the release that
/// also finds the pivot.
pub trait Payload: Send + Sync {
    /// How many bytes, the same on every node and at every phase end.
    fn size(&self) -> usize;
    /// Fills `out` (`size()` bytes, zeroed) with what this node offers
    /// along with `value`, the bytes of its combination of the
    /// reduction's copies. Called by the node's master processor at the
    /// phase's end, before the node-level step, while no filament runs.
    fn offer(&self, value: &[u8], out: &mut [u8]);
    /// Receives the job-wide result and the bytes that came with it, after
    /// the node-level step and before the post-phase code, while no
    /// filament runs.
    fn take(&self, value: &[u8], bytes: &[u8]);
}

/// A layer's side of a [`Program`]: reductions at a phase's end that carry
/// a layer's bytes.
pub trait ProgramExt<'a>: sealed::Sealed {
    /// Like [`Program::reduce_at_end_with`], with `payload`'s bytes
    /// following the result (see [`Payload`]). `combine` must return one
    /// of its inputs.
    ///
    /// # Panics
    /// If the program has no phase yet.
    fn reduce_at_end_carrying<T, C>(
        &mut self,
        r: &'a Reduction<T>,
        combine: C,
        payload: Arc<dyn Payload + 'a>,
    ) -> &mut Self
    where
        T: bytemuck::Pod + Send + Sync,
        C: Fn(T, T) -> T + Send + Sync + 'a;
}

impl<'a> ProgramExt<'a> for Program<'a> {
    fn reduce_at_end_carrying<T, C>(
        &mut self,
        r: &'a Reduction<T>,
        combine: C,
        payload: Arc<dyn Payload + 'a>,
    ) -> &mut Self
    where
        T: bytemuck::Pod + Send + Sync,
        C: Fn(T, T) -> T + Send + Sync + 'a,
    {
        self.push_at_end(r, combine, Some(payload))
    }
}

/// A layer's side of a [`Runtime`]: starting one over a link, installing
/// the phase-end hook, and keeping the layer's own state on the runtime.
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

    /// Keeps `state` on this runtime, under its type `T`, for as long as
    /// the runtime lives: how a layer finds what it set up on a runtime
    /// again (hyfi-dsm: its shared memory, so that a second `Dsm::new` on
    /// the runtime returns the same one) without the runtime knowing the
    /// layer. Key it on a type of the layer's own (crate-private), which no
    /// other layer can name. One per type and runtime: a second returns
    /// [`Error::LayerStateTaken`] and keeps the first.
    ///
    /// Not the program's [`Runtime::share`]: that is reachable from every
    /// filament and replaceable; this is neither.
    ///
    /// ```
    /// use hyfi::layers::RuntimeExt;
    /// use std::sync::Arc;
    ///
    /// struct MyLayer {
    ///     pages: usize,
    /// }
    /// let rt = hyfi::Runtime::new(hyfi::Config::new().procs(1).pin(false))?;
    /// assert!(rt.layer_state::<MyLayer>().is_none());
    /// rt.set_layer_state(Arc::new(MyLayer { pages: 4 }))?;
    /// assert_eq!(rt.layer_state::<MyLayer>().map(|s| s.pages), Some(4));
    /// let again = rt.set_layer_state(Arc::new(MyLayer { pages: 8 }));
    /// assert!(matches!(again, Err(hyfi::Error::LayerStateTaken { .. })));
    /// assert_eq!(rt.layer_state::<MyLayer>().map(|s| s.pages), Some(4));
    /// # Ok::<(), hyfi::Error>(())
    /// ```
    fn set_layer_state<T: Any + Send + Sync>(&self, state: Arc<T>) -> Result<(), Error>;

    /// The state of type `T` a layer keeps on this runtime (see
    /// [`set_layer_state`](RuntimeExt::set_layer_state)), if any.
    fn layer_state<T: Any + Send + Sync>(&self) -> Option<Arc<T>>;
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

    fn set_layer_state<T: Any + Send + Sync>(&self, state: Arc<T>) -> Result<(), Error> {
        self.shared.layer_states.set(state)
    }

    fn layer_state<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        self.shared.layer_states.get()
    }
}

/// The layers' states on one runtime ([`RuntimeExt::set_layer_state`]),
/// one per type. Set once per type, so a value handed out stays the one
/// stored.
#[derive(Default)]
pub(crate) struct LayerStates(RwLock<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>);

impl LayerStates {
    fn set<T: Any + Send + Sync>(&self, state: Arc<T>) -> Result<(), Error> {
        let mut map = self.0.write().unwrap_or_else(|e| e.into_inner());
        match map.entry(TypeId::of::<T>()) {
            Entry::Vacant(v) => {
                v.insert(state);
                Ok(())
            }
            Entry::Occupied(_) => Err(Error::LayerStateTaken {
                state: type_name::<T>(),
            }),
        }
    }

    fn get<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        let map = self.0.read().unwrap_or_else(|e| e.into_inner());
        // Stored under `T`'s id, so the downcast succeeds.
        map.get(&TypeId::of::<T>())?.clone().downcast::<T>().ok()
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
    /// phases (of this program and of every other `Program` made in the
    /// process) and stays the same across a phase's executions, in every
    /// start of its program: layers key what they learn about a phase on
    /// it (hyfi-dsm: whether its write views may store plainly). `u64::MAX` in fork-join mode, where a
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
