//! Serializable fork-join filaments: filaments that may run on another node.
//!
//! A plain [`Ctx::join`] forks a closure, which can only run on this node. A
//! filament whose function is a [`RemoteFn`] and whose argument and result
//! are serde types can be shipped: [`Ctx::join_remote`] forks it like `join`
//! does, and if an idle node asks for work while it waits in the deque, the
//! cluster layer serializes its argument (bincode), runs it there, and sends
//! the result back; the join completes here, on the parent's node. On one
//! node, or when nobody asks, it is an ordinary join and nothing is
//! serialized: a pruned `join_remote` costs what a pruned `join` costs.
//! Written generic over [`Fork`](crate::Fork), with
//! [`RemoteFn::with_pruned`], its small subtrees run as the plain recursion
//! (see [`Fork`](crate::Fork)).
//!
//! Functions travel by **name**: every node runs the same binary, but code
//! addresses differ between processes, so each node keeps a registry from
//! name to function. Registering is one line, run on every node before the
//! run ([`RemoteFn::register`]); a node that receives a filament whose name
//! it does not know fails the run with [`Error::UnknownFilament`] naming it.
//!
//! [`Ctx::join_remote_n`] runs one function on many arguments, split over
//! the processors and nodes that ask for work.
//!
//! ```
//! use hyfi::{Config, Ctx, RemoteFn, Runtime};
//!
//! /// fib(n) with the forked branch a serializable filament.
//! fn fib(ctx: &Ctx, n: u64) -> u64 {
//!     if n < 2 { return n; }
//!     let (a, b) = ctx.join_remote(|c| fib(c, n - 1), &FIB, n - 2);
//!     a + b
//! }
//! static FIB: RemoteFn<u64, u64> = RemoteFn::new("doc::fib", fib);
//!
//! FIB.register()?; // on every node, before the run
//! let rt = Runtime::new(Config::new().procs(2).pin(false))?;
//! // `run_distributed` is `run` on one node, and spans every node of a cluster.
//! assert_eq!(rt.run_distributed(|ctx| fib(ctx, 20))?, 6765);
//! # Ok::<(), hyfi::Error>(())
//! ```
//!
//! Across nodes, this directory holds the rest of the protocol: `startup`
//! (start-up distribution), `balance` (what moves: a node's ready
//! filaments, shipped jobs waiting for results, termination and failure)
//! and [`steal`] (the messages that move it). The protocol is in this
//! directory's `README.md`; the serializable job itself, `RemoteJob`, and
//! the branches of [`Ctx::join_remote`] are in `join`, on the one join path
//! of `crate::fork`. The data the scheduler's core shares with this layer
//! (the node's cross-node state, start-up slots, [`Failure`]) is in the
//! module `crate::crossnode`.

use std::any::Any;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::RwLock;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{panic_message, Error};
use crate::fork::Pruned;
use crate::sched::Ctx;

pub(crate) mod balance;
pub(crate) mod host;
pub(crate) mod join;
mod many;
mod run;
pub(crate) mod startup;
pub mod steal;

/// Shared with the scheduler's core (a leaf module, `crossnode`); this is
/// its public path.
pub use crate::crossnode::Failure;
pub(crate) use crate::crossnode::{CodecError, RemoteFailure};

/// A fork-join filament function that may run on any node: a stable name
/// and a plain function of a serializable argument.
///
/// Declare it as a `static` next to the function, and call
/// [`RemoteFn::register`] on every node before the run.
// No interior mutability here (no atomic, cell or lock): a `static` of a
// type that has none is read-only, so the compiler folds its function
// pointers into direct calls that it can inline at every join; with an
// `AtomicPtr` field fib ran at 1.7x its loop (BENCHMARKS.md, "A user's
// n-Queens").
pub struct RemoteFn<A, R> {
    pub(crate) name: &'static str,
    pub(crate) f: fn(&Ctx, A) -> R,
    pub(crate) pruned: Option<fn(&Pruned, A) -> R>,
}

impl<A, R> RemoteFn<A, R> {
    /// A filament function `f` known to every node as `name`. The name must
    /// be unique in the program; a crate path (`"quad::piece"`) is a good one.
    pub const fn new(name: &'static str, f: fn(&Ctx, A) -> R) -> Self {
        RemoteFn {
            name,
            f,
            pruned: None,
        }
    }

    /// The same function with its copy for subtrees that pruning runs as
    /// plain calls: for a filament written generic over [`Fork`](crate::Fork)
    /// (`fn fib(ctx: &impl Fork, n: u64)`), pass it again,
    /// `RemoteFn::new("fib", fib).with_pruned(fib)`, and the compiler makes
    /// the copy. Both must compute the same thing: `g` is `f` with its joins
    /// made plain calls.
    ///
    /// A pruned `join_remote` of it runs the forked branch as the copy when
    /// the first branch was quick (a few tens of microseconds) and not a
    /// leaf, taking the two branches to be of about one size, as in divide
    /// and conquer. Nothing in the copy can fork, so where the forked branch
    /// may be far larger than a quick first branch (a list walked one item
    /// per join, with the rest forked), leave the copy out: such a branch
    /// would run on one processor. With pruning off the copy is never used.
    pub const fn with_pruned(self, g: fn(&Pruned, A) -> R) -> Self {
        RemoteFn {
            name: self.name,
            f: self.f,
            pruned: Some(g),
        }
    }

    /// The name it travels under.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Calls the function here.
    pub fn call(&self, ctx: &Ctx, arg: A) -> R {
        (self.f)(ctx, arg)
    }

    /// Calls the function here where pruning already decided: its pruned
    /// copy if it has one.
    #[inline(always)]
    pub(crate) fn call_pruned(&self, ctx: &Pruned, arg: A) -> R {
        match self.pruned {
            Some(g) => g(ctx, arg),
            None => (self.f)(ctx.ctx(), arg),
        }
    }
}

impl<A, R> std::fmt::Debug for RemoteFn<A, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RemoteFn({:?})", self.name)
    }
}

/// What the registry keeps of a [`RemoteFn`]: its function behind bytes.
trait Erased: Send + Sync {
    /// Decodes the argument, runs the function, encodes the result.
    fn call_bytes(&self, ctx: &Ctx, args: &[u8]) -> Result<Vec<u8>, CodecError>;
    fn addr(&self) -> *const ();
    /// The `RemoteFn` itself, for a batch to find its typed function.
    fn as_any(&self) -> &(dyn Any + Send + Sync);
}

impl<A, R> Erased for RemoteFn<A, R>
where
    A: Serialize + DeserializeOwned + Send + 'static,
    R: Serialize + DeserializeOwned + Send + 'static,
{
    fn call_bytes(&self, ctx: &Ctx, args: &[u8]) -> Result<Vec<u8>, CodecError> {
        let a: A = bincode::deserialize(args).map_err(CodecError::DecodeArgument)?;
        let r = ctx.call_inline(|c| (self.f)(c, a));
        bincode::serialize(&r).map_err(CodecError::EncodeResult)
    }
    fn addr(&self) -> *const () {
        self as *const Self as *const ()
    }
    fn as_any(&self) -> &(dyn Any + Send + Sync) {
        self
    }
}

/// Name → function, one per process (every node registers the same ones).
static REGISTRY: RwLock<Option<HashMap<&'static str, &'static dyn Erased>>> = RwLock::new(None);

impl<A, R> RemoteFn<A, R>
where
    A: Serialize + DeserializeOwned + Send + 'static,
    R: Serialize + DeserializeOwned + Send + 'static,
{
    /// Makes this function runnable on this node when another node ships it
    /// here. Call it on every node (the same program calls it everywhere)
    /// before [`Runtime::run_distributed`](crate::Runtime::run_distributed).
    /// Registering the same function again is a no-op; another function
    /// under the same name is [`Error::DuplicateFilament`].
    ///
    /// It also registers the function's batches, `"name#n"`, which
    /// [`Ctx::join_remote_n`] ships.
    pub fn register(&'static self) -> Result<(), Error> {
        insert(self.name, self)?;
        many::register_batch(self)
    }
}

/// Registers `f` under `name`: a no-op for the same function again, and
/// [`Error::DuplicateFilament`] for another one.
fn insert(name: &'static str, f: &'static dyn Erased) -> Result<(), Error> {
    let mut g = REGISTRY.write().unwrap_or_else(|e| e.into_inner());
    let map = g.get_or_insert_with(HashMap::new);
    match map.get(name) {
        Some(other) if other.addr() != f.addr() => Err(Error::DuplicateFilament {
            name: name.to_string(),
        }),
        Some(_) => Ok(()),
        None => {
            map.insert(name, f);
            Ok(())
        }
    }
}

/// Whether `name` is registered on this node.
pub fn is_registered(name: &str) -> bool {
    lookup(name).is_some()
}

fn lookup(name: &str) -> Option<&'static dyn Erased> {
    REGISTRY
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .and_then(|m| m.get(name).copied())
}

/// The [`Failure`] for a panic payload caught on `node`, processor `proc`.
pub(crate) fn failure_of(node: usize, proc: usize, p: Box<dyn Any + Send>) -> Failure {
    match p.downcast::<RemoteFailure>() {
        Ok(f) => f.0,
        Err(p) => Failure::Panic {
            node,
            proc,
            message: panic_message(&*p),
        },
    }
}

/// Runs a filament shipped here: looks its function up by name, decodes the
/// argument, runs it, encodes the result. Never unwinds.
pub(crate) fn run_imported(ctx: &Ctx, name: &str, args: &[u8]) -> Result<Vec<u8>, Failure> {
    let Some(f) = lookup(name) else {
        return Err(Failure::Unknown {
            node: ctx.node(),
            name: name.to_string(),
        });
    };
    match catch_unwind(AssertUnwindSafe(|| f.call_bytes(ctx, args))) {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(why)) => Err(Failure::Codec {
            node: ctx.node(),
            name: name.to_string(),
            why: why.to_string(),
        }),
        Err(p) => Err(failure_of(ctx.node(), ctx.proc(), p)),
    }
}
