//! # hyfi — fine-grain parallelism for networks of multiprocessors
//!
//! Write a program once with *filaments* — iterative filaments in pools and
//! phases, or fork-join filaments — and run it on one core, on all cores of
//! a machine, or on N machines of P cores, after the HyFi package
//! (Lowenthal & Subramanian, 2002).
//!
//! This crate is the one place a user imports from: what a program names,
//! grouped below (starting, iterative filaments, reductions, fork-join,
//! shared memory, counters, errors), and nothing else. The seams through
//! which the layers (`hyfi_core`, `hyfi_net`, `hyfi_dsm`) plug into each
//! other are in [`layers`], for whoever writes a layer. See the README for a
//! tour and [`Program`], [`Ctx::join`],
//! [`Reduction`] and [`Dsm`] for the iterative model; [`Ctx::join_remote`],
//! [`RemoteFn`] and [`Runtime::run_distributed`] for fork-join filaments
//! across nodes.
//!
//! **Fine grain at the cost of the plain loop.** Declare what a phase's
//! filaments touch with [`Program::phase_with`]: per pool segment, read
//! views ([`DsmMatrix::read_rows`], plain memory), write views
//! ([`DsmMatrix::write_rows`]) and register accumulators
//! ([`Reduction::local`], [`Reduction::local_with`]); the filament is then
//! inlined into the pool's loop. Write recursive filaments generic over
//! [`Fork`] and name their pruned copy ([`RemoteFn::with_pruned`]) so that
//! pruned subtrees are the plain recursion.
//!
//! ```
//! use hyfi::{Config, Ctx, Runtime};
//!
//! fn fib(ctx: &Ctx, n: u64) -> u64 {
//!     if n < 2 { return n; }
//!     let (a, b) = ctx.join(|c| fib(c, n - 1), |c| fib(c, n - 2));
//!     a + b
//! }
//! let rt = Runtime::new(Config::new().procs(2).pin(false))?;
//! assert_eq!(rt.run(|ctx| fib(ctx, 25))?, 75_025);
//! # Ok::<(), hyfi::Error>(())
//! ```
//!
//! **One error type.** Every fallible step — starting the node
//! ([`init`], which returns it), the shared memory ([`Dsm::new`], its allocations), a program
//! ([`Runtime::start`], [`Runtime::run`], [`Runtime::run_distributed`]) —
//! converts into [`Error`] with `?`, and its `Debug` is the message, so a
//! `main` returning `Result<(), hyfi::Error>` prints what happened and what
//! to change. The layer's own error stays reachable as the
//! [`source`](std::error::Error::source) of [`Error::Layer`].
//!
//! ```
//! use hyfi::{Config, Control, Ctx, Dsm, Op, Placement, PoolArray, Program, RemoteFn};
//!
//! fn sum(ctx: &Ctx, (lo, hi): (u64, u64)) -> u64 {
//!     if hi - lo <= 64 { return (lo..hi).sum(); }
//!     let mid = lo + (hi - lo) / 2;
//!     let (a, b) = ctx.join_remote(|c| sum(c, (lo, mid)), &SUM, (mid, hi));
//!     a + b
//! }
//! static SUM: RemoteFn<(u64, u64), u64> = RemoteFn::new("facade-doc-sum", sum);
//!
//! fn main() -> Result<(), hyfi::Error> {
//!     let rt = hyfi::init_with(Config::new().procs(2).pin(false))?; // hyfi::Error already
//!     let dsm = Dsm::new(&rt)?;                                      // hyfi_dsm's error
//!     let v = dsm.vec::<f64>(1000).from_fn(|i| i as f64)?;
//!     let total = rt.reduction(0.0f64);
//!     let mut got = 0.0;
//!     let mut prog = Program::new();
//!     prog.phase(
//!         PoolArray::block(&rt, 0..1000, 1),
//!         |ctx, i| total.update(ctx, |t| t + v.get(i)),
//!         |post| {
//!             got = post.reduce(&total, Op::Sum);
//!             Control::Done
//!         },
//!     );
//!     rt.start(&mut prog)?;                                          // hyfi_core's error
//!     drop(prog);
//!     assert_eq!(got, 499_500.0);
//!
//!     SUM.register()?;
//!     assert_eq!(rt.run_distributed(|ctx| sum(ctx, (0, 1000)))?, 499_500);
//!
//!     // A layer's failure, as the program sees it: the message, and the
//!     // layer's error as the source.
//!     let Err(bad) = dsm.vec::<f64>(10).placement(Placement::Node(5)).zeroed() else {
//!         unreachable!("this job has one node")
//!     };
//!     let e = hyfi::Error::from(bad);
//!     assert!(matches!(e, hyfi::Error::Layer { layer: "hyfi-dsm", .. }));
//!     assert!(format!("{e:?}").contains("names node 5, but the job has 1 nodes"));
//!     let src = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<hyfi::dsm::DsmError>());
//!     assert!(matches!(src, Some(hyfi::dsm::DsmError::Placement(_))));
//!     Ok(())
//! }
//! ```

// The user's API, by what a program does. When a layer adds a name a program
// uses (e.g. a new reduction operator type, an index or pool type), add it to
// its group here; a name only another layer uses goes in `layers` below.

// --- Starting a node ---
pub use hyfi_core::{
    Config, Runtime, DEFAULT_CHUNKS, DEFAULT_STACK_SIZE, MAX_CHUNKS, MAX_STACK_SIZE, MIN_STACK_SIZE,
};

/// Starts this node's part of the job, configured from the `HYFI_*`
/// variables (see [`init_with`]).
///
/// It reads no command-line option: `HYFI_NODES=2 ./program` runs a
/// program on two local nodes, and `./program --nodes 2` runs it on one
/// (saying so on stderr) unless the program parses `--nodes` itself and
/// passes the count to [`init_nodes`], as the examples do.
///
/// The facade's entry points return the program's one error type,
/// [`Error`]; the cluster layer's own error is its
/// [`source`](std::error::Error::source) (`hyfi::layers::NetError`).
pub fn init() -> Result<Runtime, Error> {
    hyfi_dsm::check_env()?;
    Ok(hyfi_net::init()?)
}

/// Starts this node's part of the job with `cfg` for its processors:
///
/// * no launcher and `HYFI_NODES` unset or 1: a one-node runtime;
/// * `HYFI_NODES=N > 1` and no launcher: this process becomes the launcher of
///   N local nodes running the same program, and exits with their status
///   (it does not return);
/// * started by hyfi's launcher (`hyfi-run`), `mpirun` or `srun`: blocks the
///   asynchronous signals (call it before starting threads of your own),
///   opens the mesh, starts the signal-handling thread and returns a runtime
///   whose barriers and reductions span every node.
pub fn init_with(cfg: Config) -> Result<Runtime, Error> {
    hyfi_dsm::check_env()?;
    Ok(hyfi_net::init_with(cfg)?)
}

/// Like [`init_with`], with a node count from the program's command line
/// (a `--nodes N` option): with no launcher around it acts as
/// `HYFI_NODES=N`; under a launcher it must agree with the launcher's node
/// count.
pub fn init_nodes(cfg: Config, nodes: Option<usize>) -> Result<Runtime, Error> {
    hyfi_dsm::check_env()?;
    Ok(hyfi_net::init_nodes(cfg, nodes)?)
}

// --- Iterative filaments: pools, phases, post-phase code ---
pub use hyfi_core::{block, Control, Ctx, Index, Pool, PoolArray, PostPhase, Program, Span};

// --- Reduction variables ---
/// Re-exported so reduction variables of your own `#[repr(C)]` types need
/// no direct dependency: derive with
/// `#[derive(Clone, Copy, hyfi::bytemuck::Pod, hyfi::bytemuck::Zeroable)]`
/// and `#[bytemuck(crate = "hyfi::bytemuck")]`.
pub use hyfi_core::bytemuck;
/// The exact, order-independent floating-point sum ([`ExactSum`]).
pub use hyfi_core::exact;
pub use hyfi_core::{
    Arith, ExactAccumulator, ExactLocal, ExactSum, Local, LocalWith, Op, Reduction,
};

// --- Fork-join filaments, on one node or across nodes ---
pub use hyfi_core::{Fork, Pruned, RemoteFn};

// --- Shared memory across nodes ---
/// The shared memory layer: page size, allocation builders, views,
/// statistics and its error.
pub use hyfi_dsm as dsm;
pub use hyfi_dsm::{
    Dsm, DsmCounters, DsmMatrix, DsmStats, DsmVec, MatrixAlloc, MatrixView, Placement, ReadRange,
    ReadRows, VecAlloc, View, ViewMut, WriteRange, WriteRows,
};

// --- Counters ---
/// What [`Runtime::traffic`] returns: a node's messages and bytes by class.
pub use hyfi_core::link::{ClassTraffic, Traffic};
/// Progress of long runs on a terminal ([`Progress`]).
pub use hyfi_core::Progress;
pub use hyfi_core::{ProcStats, RemoteStats, Stats, StatsHandle};

/// A timeline of every node and processor (`HYFI_TRACE`, [`Config::trace`]).
pub use hyfi_core::trace;

// --- Errors ---
pub use hyfi_core::Error;

pub mod layers;

/// The conformance suite every transport of the node seam must pass
/// ([`conformance::run`]), and the failures it must detect.
pub mod conformance;

/// Visibility checks: the seams are not at the facade's root, only in
/// [`layers`]. Each `compile_fail` block must fail for the name alone, so
/// every block is the same program as a compiling one below but for the path.
///
/// ```compile_fail,E0432
/// use hyfi::NodeLink;
/// ```
/// ```compile_fail,E0432
/// use hyfi::PhaseEnd;
/// ```
/// ```compile_fail,E0432
/// use hyfi::SingleNode;
/// ```
/// ```compile_fail,E0432
/// use hyfi::LinkError;
/// ```
/// ```compile_fail,E0432
/// use hyfi::Step;
/// ```
/// ```compile_fail,E0432
/// use hyfi::Slot;
/// ```
/// ```compile_fail,E0432
/// use hyfi::Cluster;
/// ```
/// ```compile_fail,E0432
/// use hyfi::filthread;
/// ```
/// ```compile_fail,E0432
/// use hyfi::waits;
/// ```
/// ```compile_fail,E0432
/// use hyfi::link;
/// ```
/// ```compile_fail,E0432
/// use hyfi::steal;
/// ```
///
/// One family of shared arrays: the DSM's ([`DsmVec`], [`DsmMatrix`]),
/// on one node as on many. hyfi-core's node-local arrays are not a second
/// one for programs:
///
/// ```compile_fail,E0432
/// use hyfi::SharedMatrix;
/// ```
/// ```compile_fail,E0432
/// use hyfi::SharedVec;
/// ```
///
/// A layer's methods on `Runtime` and `Ctx` are extension traits in
/// `hyfi::layers`, not methods a program sees:
///
/// ```compile_fail,E0599
/// let rt = hyfi::Runtime::new(hyfi::Config::new().procs(1).pin(false)).unwrap();
/// let _ = rt.link();
/// ```
/// ```compile_fail,E0599
/// let rt = hyfi::Runtime::new(hyfi::Config::new().procs(1).pin(false)).unwrap();
/// let _ = rt.phase_end();
/// ```
/// ```compile_fail,E0599
/// let rt = hyfi::Runtime::new(hyfi::Config::new().procs(1).pin(false)).unwrap();
/// let _ = rt.layer_state::<u32>();
/// ```
/// ```compile_fail,E0599
/// let cfg = hyfi::Config::new().procs(1).pin(false);
/// let _ = hyfi::Runtime::with_link(cfg, std::sync::Arc::new(hyfi::layers::SingleNode));
/// ```
/// ```compile_fail,E0599
/// let rt = hyfi::Runtime::new(hyfi::Config::new().procs(1).pin(false)).unwrap();
/// rt.run(|ctx| ctx.access_epoch()).unwrap();
/// ```
///
/// With the traits imported, the same calls compile and run:
///
/// ```
/// use hyfi::layers::{CtxExt, RuntimeExt};
/// let cfg = hyfi::Config::new().procs(1).pin(false);
/// let rt = hyfi::Runtime::with_link(cfg, std::sync::Arc::new(hyfi::layers::SingleNode)).unwrap();
/// assert_eq!(rt.link().num_nodes(), 1);
/// assert!(rt.phase_end().is_none());
/// let _ = rt.layer_state::<u32>();
/// let a = rt.run(|ctx| ctx.access_epoch()).unwrap();
/// let b = rt.run(|ctx| ctx.access_epoch()).unwrap();
/// assert_ne!(a, b, "every fork-join run begins a new access epoch");
/// ```
///
/// The same names through `hyfi::layers` compile:
///
/// ```
/// #[allow(unused_imports)]
/// use hyfi::layers::{
///     filthread, link, steal, waits, Cluster, LinkError, NodeLink, PhaseEnd, SingleNode, Slot,
///     Step,
/// };
/// ```
#[cfg(doctest)]
pub struct FacadeHidesTheSeams;
