//! State a filament reaches without capturing it: values shared with a
//! runtime, one per type.
//!
//! A [`RemoteFn`](crate::RemoteFn) is a plain `fn`, so it captures nothing:
//! what it reads beside its argument (a table, a mesh, parameters read from
//! the command line) must be reachable from its `&Ctx`. [`Runtime::share`]
//! makes a value reachable from every filament of that runtime as
//! [`Ctx::shared`], by its type. Every node runs the same program, so each
//! shares its own copy of the value before the run (as each registers its
//! `RemoteFn`s): a filament shipped to another node finds that node's copy.
//! Share values every node computes alike, or the results depend on where
//! filaments ran.
//!
//! ```
//! use hyfi_core::{Config, Ctx, RemoteFn, Runtime};
//!
//! /// What the filaments read: built from the input on every node.
//! struct Weights(Vec<u64>);
//!
//! /// The weighted sum of `w[lo..hi]`, split in halves that may leave the node.
//! fn weighted(ctx: &Ctx, (lo, hi): (usize, usize)) -> u64 {
//!     if hi - lo <= 64 {
//!         let w = ctx.shared::<Weights>(); // this node's copy
//!         return (lo..hi).map(|i| w.0[i] * i as u64).sum();
//!     }
//!     let mid = (lo + hi) / 2;
//!     let (a, b) = ctx.join_remote(|c| weighted(c, (lo, mid)), &WEIGHTED, (mid, hi));
//!     a + b
//! }
//! static WEIGHTED: RemoteFn<(usize, usize), u64> = RemoteFn::new("doc::weighted", weighted);
//!
//! WEIGHTED.register()?;
//! let rt = Runtime::new(Config::new().procs(2).pin(false))?;
//! let w: Vec<u64> = (0..1000).map(|i| i % 7).collect();
//! let want: u64 = w.iter().enumerate().map(|(i, x)| x * i as u64).sum();
//! rt.share(Weights(w)); // on every node, before the run
//! assert_eq!(rt.run_distributed(|ctx| weighted(ctx, (0, 1000)))?, want);
//! # Ok::<(), hyfi_core::Error>(())
//! ```
//!
//! A lookup takes a read lock and a hash probe (tens of nanoseconds): take
//! the value once per filament that works on a range, not once per element.
//! Before this, the way was a `static OnceLock<T>` per value, set once per
//! process; it still works, but is one value for every runtime of the
//! process and cannot be replaced between runs.

use std::any::{type_name, Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, RwLock, Weak};

use crate::registry::Shared;
use crate::runtime::Runtime;
use crate::sched::Ctx;

type Values = HashMap<TypeId, Arc<dyn Any + Send + Sync>>;

/// The values of one runtime, dropped (lazily, at the next `share`) once
/// the runtime is gone.
struct Entry {
    owner: Weak<Shared>,
    values: Values,
}

/// Runtime id → its shared values.
static STATE: RwLock<Option<HashMap<u64, Entry>>> = RwLock::new(None);

impl Runtime {
    /// Makes `value` reachable from every filament of this runtime as
    /// [`Ctx::shared::<T>()`](Ctx::shared), replacing the value of type `T`
    /// shared before; returns it. Call it on every node, before the run that
    /// reads it (see the [module docs](crate::state) for an example).
    /// Filaments holding the old value keep it until they drop it.
    pub fn share<T: Any + Send + Sync>(&self, value: T) -> Arc<T> {
        let v = Arc::new(value);
        let mut g = STATE.write().unwrap_or_else(|e| e.into_inner());
        let map = g.get_or_insert_with(HashMap::new);
        map.retain(|_, e| e.owner.strong_count() > 0);
        map.entry(self.shared.id)
            .or_insert_with(|| Entry {
                owner: Arc::downgrade(&self.shared),
                values: HashMap::new(),
            })
            .values
            .insert(TypeId::of::<T>(), v.clone());
        v
    }

    /// The value of type `T` shared with this runtime, if any.
    pub fn shared<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        get(self.shared.id)
    }
}

fn get<T: Any + Send + Sync>(id: u64) -> Option<Arc<T>> {
    let g = STATE.read().unwrap_or_else(|e| e.into_inner());
    let v = g
        .as_ref()?
        .get(&id)?
        .values
        .get(&TypeId::of::<T>())?
        .clone();
    v.downcast::<T>().ok()
}

impl Ctx {
    /// The value of type `T` shared with this runtime on this node
    /// ([`Runtime::share`]).
    ///
    /// # Panics
    /// If no value of type `T` was shared (the message names the type and
    /// the node; a run fails with it as a filament panic).
    pub fn shared<T: Any + Send + Sync>(&self) -> Arc<T> {
        self.try_shared().unwrap_or_else(|| {
            panic!(
                "hyfi: no value of type {} is shared with the runtime on node {}: \
                 call rt.share(value) on every node before the run",
                type_name::<T>(),
                self.node()
            )
        })
    }

    /// The value of type `T` shared with this runtime on this node, if any.
    pub fn try_shared<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        get(self.shared.id)
    }
}

#[cfg(test)]
mod tests {
    use crate::{Config, Runtime};

    #[derive(Debug, PartialEq)]
    struct Scale(u64);

    #[test]
    fn values_are_per_runtime_and_per_type_and_replaceable() {
        let a = Runtime::new(Config::new().procs(2).pin(false)).unwrap();
        let b = Runtime::new(Config::new().procs(1).pin(false)).unwrap();
        a.share(Scale(3));
        a.share(7u32);
        assert_eq!(a.run(|ctx| ctx.shared::<Scale>().0).unwrap(), 3);
        assert_eq!(a.run(|ctx| *ctx.shared::<u32>()).unwrap(), 7);
        assert_eq!(b.run(|ctx| ctx.try_shared::<Scale>()).unwrap(), None);
        let old = a.shared::<Scale>().unwrap();
        a.share(Scale(5));
        assert_eq!(
            a.run(|ctx| ctx.join_n(4, |c, _| c.shared::<Scale>().0))
                .unwrap(),
            vec![5; 4]
        );
        assert_eq!(*old, Scale(3)); // still held
        let err = b
            .run(|ctx| ctx.shared::<Scale>().0)
            .unwrap_err()
            .to_string();
        assert!(err.contains("Scale") && err.contains("rt.share"), "{err}");
    }
}
