//! # hyfi-core: filaments on one node
//!
//! The single-node runtime of hyfi, after the HyFi paper (Lowenthal and
//! Subramanian, 2002), §2–3: one **server thread** per processor, pinned to
//! its core; **filthreads** (stackful coroutines on pooled, guarded stacks)
//! multiplexed on each; and two kinds of very light threads, **filaments**:
//!
//! * **Iterative filaments** run in *phases*. Each processor has one or more
//!   *pools* of filaments per phase; after all have run, one processor runs
//!   the phase's *post-phase* code, which may reduce *reduction variables*
//!   and decides whether to go on. See [`Program`], [`PoolArray`],
//!   [`Reduction`].
//! * **Fork-join filaments** split work recursively with [`Ctx::join`];
//!   idle processors steal, and forks become plain calls (*pruning*) once
//!   every processor is busy. See [`Runtime::run`]. Filaments forked with
//!   [`Ctx::join_remote`] (a [`RemoteFn`] of serde types) may also run on
//!   other nodes, with [`Runtime::run_distributed`] (see [`remote`] and
//!   [`steal`]: start-up distribution, cross-node stealing, termination).
//!
//! Jacobi iteration, the paper's Figure 1–2 program, checked against a
//! sequential loop:
//!
//! ```
//! use hyfi_core::{Config, Control, Op, PoolArray, Program, Runtime, SharedMatrix};
//!
//! let n = 34;
//! let eps = 1e-3;
//! let rt = Runtime::new(Config::new().procs(2).pin(false))?;
//! let init = |i: usize, j: usize| -> f64 { if i == 0 || j == 0 || i == n - 1 || j == n - 1 { 1.0 } else { 0.0 } };
//! // Two grids: in iteration k, `old` is grids[k % 2] and `new` the other.
//! let grids = [SharedMatrix::from_fn(n, n, init), SharedMatrix::from_fn(n, n, init)];
//! let maxdiff = rt.reduction(0.0f64);
//! let mut iters = 0;
//!
//! let mut prog = Program::new();
//! prog.phase(
//!     // One filament per interior point; rows in blocks over the processors.
//!     PoolArray::block_rows(&rt, 1..n - 1, 1..n - 1, 1),
//!     |ctx, (i, j)| {
//!         let k = ctx.iteration() as usize;
//!         let (old, new) = (&grids[k % 2], &grids[(k + 1) % 2]);
//!         let v = (old.get(i - 1, j) + old.get(i + 1, j) + old.get(i, j - 1) + old.get(i, j + 1)) * 0.25;
//!         new.set(i, j, v);
//!         let d = (v - old.get(i, j)).abs();
//!         maxdiff.update(ctx, |m| m.max(d));
//!     },
//!     |post| {
//!         iters += 1;
//!         let m = post.reduce(&maxdiff, Op::Max); // filReduce(maxdiff, MAX)
//!         post.set(&maxdiff, 0.0);
//!         if m < eps { Control::Done } else { Control::Continue }
//!     },
//! );
//! rt.start(&mut prog)?;
//! drop(prog);
//!
//! // The same computation, sequentially.
//! let (mut old, mut new) = (vec![0.0f64; n * n], vec![0.0f64; n * n]);
//! for i in 0..n { for j in 0..n { old[i * n + j] = init(i, j); new[i * n + j] = init(i, j); } }
//! let mut seq_iters = 0;
//! loop {
//!     let mut m = 0.0f64;
//!     for i in 1..n - 1 { for j in 1..n - 1 {
//!         let v = (old[(i - 1) * n + j] + old[(i + 1) * n + j] + old[i * n + j - 1] + old[i * n + j + 1]) * 0.25;
//!         new[i * n + j] = v;
//!         m = m.max((v - old[i * n + j]).abs());
//!     } }
//!     seq_iters += 1;
//!     std::mem::swap(&mut old, &mut new);
//!     if m < eps { break; }
//! }
//! assert_eq!(iters, seq_iters);
//! assert_eq!(grids[iters % 2].to_vec(), old); // bit for bit
//! # Ok::<(), hyfi_core::Error>(())
//! ```
//!
//! The cross-node layer plugs in through [`NodeLink`]; a filthread waits for
//! anything (a page, a message) through [`filthread::suspend`].

#![warn(missing_docs)]

mod config;
mod crossnode;
mod error;
pub mod exact;
pub mod filthread;
mod fork;
mod job;
pub mod last_words;
mod latch;
pub mod layer;
pub mod link;
mod node;
mod phase;
mod pool;
pub mod progress;
mod reduce;
mod registry;
pub mod remote;
mod runtime;
mod sched;
mod seg;
mod shared;
pub mod sleep;
mod stack;
pub mod state;
mod stats;
pub mod trace;
pub mod waits;

/// Fork-join across nodes, the messaging side (now `remote::steal`; kept
/// at this path).
pub use remote::steal;

/// Re-exported so reduction variables of your own `#[repr(C)]` types need
/// no direct dependency: derive with
/// `#[derive(Clone, Copy, hyfi::bytemuck::Pod, hyfi::bytemuck::Zeroable)]`
/// and `#[bytemuck(crate = "hyfi::bytemuck")]`.
pub use bytemuck;
pub use config::{
    parse_size, Config, DEFAULT_CHUNKS, DEFAULT_STACK_SIZE, MAX_CHUNKS, MAX_STACK_SIZE,
    MIN_STACK_SIZE,
};
pub use error::Error;
pub use exact::{ExactAccumulator, ExactLocal, ExactSum};
pub use fork::Pruned;
pub use node::{LinkError, NodeLink, PhaseEnd, SingleNode, Step};
pub use phase::{Control, PostPhase, Program};
pub use pool::{block, Index, Pool, PoolArray, Span};
pub use progress::Progress;
pub use reduce::{Arith, Local, LocalWith, Op, Reduction};
pub use remote::join::Fork;
pub use remote::startup::Slot;
pub use remote::{is_registered, Failure, RemoteFn};
pub use runtime::{Runtime, StatsHandle, FORK_JOIN_PHASE};
pub use sched::Ctx;
pub use shared::{Element, Row, SharedMatrix, SharedVec};
pub use stats::{ProcStats, RemoteStats, Stats};
