//! # hyfi — fine-grain parallelism for networks of multiprocessors
//!
//! Write a program once with *filaments* — iterative filaments in pools and
//! phases, or fork-join filaments — and run it on one core, on all cores of
//! a machine, or on N machines of P cores, after the HyFi package
//! (Lowenthal & Subramanian, 2002).
//!
//! This crate is the one place a user imports from; it re-exports the
//! single-node runtime [`hyfi_core`], the start of a multi-node job
//! ([`init`], from `hyfi_net`) and the shared memory across nodes ([`Dsm`],
//! from [`dsm`]). See the README for a tour and [`Program`], [`Ctx::join`],
//! [`Reduction`] and [`Dsm`] for the iterative model; [`Ctx::join_remote`],
//! [`RemoteFn`] and [`Runtime::run_distributed`] for fork-join filaments
//! across nodes.
//!
//! **Fine grain at the cost of the plain loop.** Declare what a phase's
//! filaments touch with [`Program::phase_with`]: per pool segment, read
//! views ([`DsmMatrix::read_rows`], plain memory), write views
//! ([`DsmMatrix::write_rows`]) and register accumulators
//! ([`Reduction::local`]); the filament is then inlined into the pool's loop.
//! Write recursive filaments generic over [`Fork`] and name their pruned
//! copy ([`RemoteFn::with_pruned`]) so that pruned subtrees are the plain
//! recursion.
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

pub use hyfi_core::*;
/// The shared memory layer (page size, placement, statistics, errors).
pub use hyfi_dsm as dsm;
pub use hyfi_dsm::{
    Dsm, DsmCounters, DsmError, DsmMatrix, DsmStats, DsmVec, MatrixView, Placement, ReadRange,
    ReadRows, View, ViewMut, WriteRange, WriteRows,
};
pub use hyfi_net::{init, init_nodes, init_with, Cluster, NetError};
