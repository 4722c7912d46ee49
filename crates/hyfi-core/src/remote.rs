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
//! use hyfi_core::{Config, Ctx, RemoteFn, Runtime};
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
//! # Ok::<(), hyfi_core::Error>(())
//! ```

use std::any::Any;
use std::cell::{Cell, UnsafeCell};
use std::collections::HashMap;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::RwLock;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{panic_message, Error};
use crate::fork::{JobRef, Latch, Pruned};
use crate::runtime::WANTED;
use crate::startup::{self, Slot};
use crate::worker::Ctx;

mod many;

/// A fork-join filament function that may run on any node: a stable name
/// and a plain function of a serializable argument.
///
/// Declare it as a `static` next to the function, and call
/// [`RemoteFn::register`] on every node before the run.
pub struct RemoteFn<A, R> {
    name: &'static str,
    f: fn(&Ctx, A) -> R,
    pruned: Option<fn(&Pruned, A) -> R>,
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
    fn call_bytes(&self, ctx: &Ctx, args: &[u8]) -> Result<Vec<u8>, String>;
    fn addr(&self) -> *const ();
    /// The `RemoteFn` itself, for a batch to find its typed function.
    fn as_any(&self) -> &(dyn Any + Send + Sync);
}

impl<A, R> Erased for RemoteFn<A, R>
where
    A: Serialize + DeserializeOwned + Send + 'static,
    R: Serialize + DeserializeOwned + Send + 'static,
{
    fn call_bytes(&self, ctx: &Ctx, args: &[u8]) -> Result<Vec<u8>, String> {
        let a: A = bincode::deserialize(args).map_err(|e| format!("decoding its argument: {e}"))?;
        let r = ctx.call_inline(|c| (self.f)(c, a));
        bincode::serialize(&r).map_err(|e| format!("encoding its result: {e}"))
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
            why,
        }),
        Err(p) => Err(failure_of(ctx.node(), ctx.proc(), p)),
    }
}

/// A shipped filament: its function's name and its encoded argument.
pub(crate) type Encoded = (&'static str, Vec<u8>);

/// How the cluster layer handles a [`RemoteJob`] behind a type-erased
/// pointer: one static table per argument and result type.
pub(crate) struct RemoteVTable {
    /// The function's name and the encoded argument; the job keeps its
    /// argument if encoding fails.
    pub(crate) export: unsafe fn(*const ()) -> Result<Encoded, String>,
    /// Completes the job with what the node that ran it sent back (the
    /// last argument is this node, for the error if the result will not
    /// decode).
    pub(crate) complete: unsafe fn(*const (), Result<Vec<u8>, Failure>, usize),
    /// The start-up slot the job carries (see [`startup`]).
    pub(crate) startup: unsafe fn(*const ()) -> Option<Slot>,
}

/// A serializable fork-join job in the joining filthread's frame.
struct RemoteJob<B: 'static, RB: 'static> {
    f: &'static RemoteFn<B, RB>,
    args: UnsafeCell<Option<B>>,
    result: UnsafeCell<Option<Result<RB, Box<dyn Any + Send>>>>,
    latch: Latch,
    /// Set for a start-up job: the slot it takes over.
    startup: Cell<Option<Slot>>,
}

impl<B, RB> RemoteJob<B, RB>
where
    B: Serialize + DeserializeOwned + Send + 'static,
    RB: Serialize + DeserializeOwned + Send + 'static,
{
    const VTABLE: RemoteVTable = RemoteVTable {
        export: Self::export,
        complete: Self::complete,
        startup: Self::startup_of,
    };

    fn as_job_ref(&self) -> JobRef {
        JobRef::remote(
            self as *const Self as *const (),
            Self::execute,
            &Self::VTABLE,
        )
    }

    /// Runs the job here (taken from a deque or an incoming list).
    ///
    /// # Safety
    /// `this` points at a live `RemoteJob<B, RB>` that nobody else runs,
    /// ships or completes: a `JobRef` is taken from its queue exactly once,
    /// and the joiner waits for the latch before the frame goes away.
    unsafe fn execute(this: *const (), ctx: &Ctx) {
        let this = &*(this as *const Self);
        let a = (*this.args.get())
            .take()
            .expect("hyfi: fork-join job executed twice");
        let slot = this.startup.get();
        let r = startup::with_startup(ctx, slot, || {
            catch_unwind(AssertUnwindSafe(|| {
                ctx.count_filaments(1);
                ctx.call_inline(|c| (this.f.f)(c, a))
            }))
        });
        *this.result.get() = Some(r);
        Latch::set(&this.latch);
    }

    /// Encodes the job's argument for another node.
    ///
    /// # Safety
    /// As for [`Self::execute`]: the caller took the job from its queue and
    /// owns it until it is completed.
    unsafe fn export(this: *const ()) -> Result<Encoded, String> {
        let this = &*(this as *const Self);
        let args = (*this.args.get())
            .as_ref()
            .ok_or("hyfi: exported a job that already ran")?;
        let bytes = bincode::serialize(args).map_err(|e| e.to_string())?;
        // Shipped: the argument now lives in `bytes`.
        (*this.args.get()).take();
        Ok((this.f.name, bytes))
    }

    /// Stores what the node that ran the job sent back and sets the latch.
    ///
    /// # Safety
    /// `this` was exported and removed from the pending table by the
    /// caller, so this is its only completion; the joiner is still waiting.
    /// Once the latch is set the joiner may free the job: nothing touches
    /// `this` afterwards.
    unsafe fn complete(this: *const (), outcome: Result<Vec<u8>, Failure>, node: usize) {
        let this = &*(this as *const Self);
        let r = match outcome {
            Ok(bytes) => bincode::deserialize::<RB>(&bytes).map_err(|e| {
                Box::new(RemoteFailure(Failure::Codec {
                    node,
                    name: this.f.name.to_string(),
                    why: format!("decoding its result: {e}"),
                })) as Box<dyn Any + Send>
            }),
            Err(f) => Err(Box::new(RemoteFailure(f)) as Box<dyn Any + Send>),
        };
        *this.result.get() = Some(r);
        Latch::set(&this.latch);
    }

    /// The start-up slot the job carries.
    ///
    /// # Safety
    /// As for [`Self::export`].
    unsafe fn startup_of(this: *const ()) -> Option<Slot> {
        (*(this as *const Self)).startup.get()
    }

    fn into_result(self) -> RB {
        match self.result.into_inner() {
            Some(Ok(r)) => r,
            Some(Err(p)) => resume_unwind(p),
            None => unreachable!("hyfi: joined a job that did not run"),
        }
    }
}

impl Ctx {
    /// Runs `a` here and the serializable filament `f(b)` potentially in
    /// parallel, on this node or on another one, and returns both results:
    /// [`Ctx::join`] whose forked branch may leave the node.
    ///
    /// `f` must be registered on every node ([`RemoteFn::register`]); its
    /// argument is encoded only if another node takes it. Panics propagate
    /// as in `join`, from whichever node ran the filament.
    #[inline]
    pub fn join_remote<A, RA, B, RB>(&self, a: A, f: &'static RemoteFn<B, RB>, b: B) -> (RA, RB)
    where
        A: FnOnce(&Ctx) -> RA + Send,
        RA: Send,
        B: Serialize + DeserializeOwned + Send + 'static,
        RB: Serialize + DeserializeOwned + Send + 'static,
    {
        // The same pruning test as `join`: a load, a compare and the calls.
        if self.pruned_here() {
            self.count_filaments(2);
            if f.pruned.is_some() {
                return self.join_remote_then_pruned(a, f, b);
            }
            return (a(self), (f.f)(self, b));
        }
        crate::fork::unlikely_path();
        self.join_remote_cold(a, f, b)
    }

    /// A pruned join of a function with a pruned copy: `a` here, then `b`
    /// as the pruned copy if `a` was quick (see [`SEQ_TICKS`]), else as
    /// this copy, which goes on testing for pruning at its joins.
    #[inline(always)]
    fn join_remote_then_pruned<A, RA, B, RB>(
        &self,
        a: A,
        f: &'static RemoteFn<B, RB>,
        b: B,
    ) -> (RA, RB)
    where
        A: FnOnce(&Ctx) -> RA + Send,
    {
        let since = self.mark();
        let ra = a(self);
        if self.sibling_may_run_pruned(since) {
            (ra, self.run_pruned(|p| f.call_pruned(p, b)))
        } else {
            (ra, (f.f)(self, b))
        }
    }

    /// A `join_remote` that is not pruned: a fork is wanted, or the stack
    /// is nearly full (then the calls run on a fresh segment).
    /// Out of line, not `#[cold]` (see `Ctx::join_cold`).
    #[inline(never)]
    fn join_remote_cold<A, RA, B, RB>(&self, a: A, f: &'static RemoteFn<B, RB>, b: B) -> (RA, RB)
    where
        A: FnOnce(&Ctx) -> RA + Send,
        RA: Send,
        B: Serialize + DeserializeOwned + Send + 'static,
        RB: Serialize + DeserializeOwned + Send + 'static,
    {
        if self.limit.load(Ordering::Relaxed) != WANTED {
            return self.call_on_new_segment(|c| {
                c.count_filaments(2);
                if f.pruned.is_some() {
                    return c.join_remote_then_pruned(a, f, b);
                }
                (a(c), (f.f)(c, b))
            });
        }
        self.join_remote_real(a, f, b)
    }

    #[inline]
    fn join_remote_real<A, RA, B, RB>(&self, a: A, f: &'static RemoteFn<B, RB>, b: B) -> (RA, RB)
    where
        A: FnOnce(&Ctx) -> RA + Send,
        RA: Send,
        B: Serialize + DeserializeOwned + Send + 'static,
        RB: Serialize + DeserializeOwned + Send + 'static,
    {
        self.check_abort();
        let job = RemoteJob {
            f,
            args: UnsafeCell::new(Some(b)),
            result: UnsafeCell::new(None),
            latch: Latch::new(),
            startup: Cell::new(None),
        };
        // Start-up distribution: the first forks go to their slots of the
        // logical tree, not to this deque.
        if let Some(child) = startup::next_startup_child(self) {
            job.startup.set(Some(child));
            startup::send_to_slot(self, job.as_job_ref(), child);
            self.count_filaments(1);
            let ra = catch_unwind(AssertUnwindSafe(|| self.call_inline(a)));
            // The job points into this frame: wait for it even if `a` panicked.
            job.latch.wait();
            return match ra {
                Ok(ra) => (ra, job.into_result()),
                Err(p) => resume_unwind(p),
            };
        }
        let job_ref = job.as_job_ref();
        // Whether `b`, taken back, may run as the pruned copy: only if `a`
        // was quick, and never with pruning off (every join forks then).
        let copy = f.pruned.is_some() && self.prune;
        let since = if copy {
            // `fork_and_run_a` counts `a` as a filament before it runs it.
            let (t, n) = self.mark();
            (t, n + 1)
        } else {
            (0, 0)
        };
        let ra = self.fork_and_run_a(job_ref, a);
        let quick = copy && self.sibling_may_run_pruned(since);
        // Take b back, or wait for whoever stole it (here or on another node).
        let got_back = self.take_back_or_wait(job_ref, &job.latch);
        let ra = match ra {
            Ok(v) => v,
            Err(p) => {
                if got_back {
                    // SAFETY: we own the job again; nobody else touches it.
                    unsafe { (*job.args.get()).take() };
                } else {
                    drop(job);
                }
                resume_unwind(p)
            }
        };
        if got_back {
            // SAFETY: popped back from our own deque: nobody else has it.
            let b = unsafe { (*job.args.get()).take() }.expect("hyfi: own job already taken");
            self.count_filaments(1);
            if quick {
                return (
                    ra,
                    self.call_inline(|c| c.run_pruned(|p| f.call_pruned(p, b))),
                );
            }
            return (ra, self.call_inline(|c| (f.f)(c, b)));
        }
        (ra, job.into_result())
    }
}
