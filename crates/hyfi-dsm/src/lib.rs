//! # hyfi-dsm: shared arrays across nodes
//!
//! The multithreaded, page-based software distributed shared memory of
//! hyfi (the HyFi paper, §3.3). Shared vectors and matrices of plain data
//! live in one region reserved at the same virtual address on every node;
//! each page has a *home* node. Filaments read and write them in two ways:
//!
//! * **Footprint views** (the fast path, for regular access): a phase
//!   declared with `Program::phase_with` takes, once per pool segment,
//!   [`DsmMatrix::read_rows`] / [`DsmVec::read_range`] of what its filaments
//!   only read — plain memory, `&[T]` rows — and [`DsmMatrix::write_rows`] /
//!   [`DsmVec::write_range`] of what they write. The pages are validated
//!   (fetched, on several nodes) once per segment, so the filaments cost
//!   what the plain loop costs. See the `footprint` module's docs for why
//!   plain reads are sound (an array is read-only or written per phase,
//!   checked) and what was measured.
//! * **Checked accessors** (`get`/`set`, `row`/`row_mut`, for irregular
//!   access): each access tests its page's state byte.
//! * **Runs**: a row written by `RowWriter::fill` (`write_rows(..).row_mut(i)
//!   .fill(cols, |j| ..)`) is checked once, its closure inlined; a row
//!   updated by `ViewMut::update_range` (LU's `x - l * y`) or copied is
//!   checked once and moves 16 bytes at a time on x86-64, so it vectorises
//!   as the slice loop does; the `elem` module says why those wide
//!   accesses are as defined as the element accesses.
//!
//! Either way, a miss asks the home for every missing page of the range at
//! once and suspends the filthread, and its processor runs the filthreads
//! of its other pools meanwhile — several pools per processor overlap
//! communication with computation. Rows that every node reads in the next
//! phase (LU's pivot row) can be sent ahead instead, from post-phase code:
//! [`DsmMatrix::broadcast_rows`] / [`DsmVec::broadcast`] send them from
//! their home along a binomial tree before anyone computes.
//!
//! **Consistency** is release consistency at phase boundaries: whatever
//! any node wrote during a phase is visible on every node after the phase's
//! barrier. Several nodes may write different elements of one page in one
//! phase (twins and diffs of the elements written go to the home; write notices
//! invalidate stale copies: home-based lazy release consistency). Within a
//! phase, a filament must not read what another node writes in the same
//! phase (as in any data-race-free program).
//!
//! **Fork-join filaments** write shared arrays too, with the same
//! consistency: a fork-join run is released like a phase.
//! `Runtime::run_distributed` (collective: every node calls it) ends with a
//! release, so what any node's filaments wrote is visible on every node
//! when it returns. `Runtime::run` on one node ends with a release as
//! well. On several nodes `run` is local — other nodes need not call it —
//! and a release is collective, so its writes reach the other nodes at the
//! next collective step: `Runtime::start` and `run_distributed` begin with
//! a release on several nodes. Read them there, not from another node's
//! main thread right after the local run.
//!
//! ```
//! use hyfi::{Config, Control, Ctx, Dsm, DsmVec, Op, Placement, PoolArray, Program, Runtime};
//!
//! fn fill(ctx: &Ctx, v: &DsmVec<u64>, lo: usize, hi: usize) {
//!     if hi - lo <= 64 {
//!         for i in lo..hi { v.set(i, 3 * i as u64); }
//!     } else {
//!         let mid = (lo + hi) / 2;
//!         ctx.join(|c| fill(c, v, lo, mid), |c| fill(c, v, mid, hi));
//!     }
//! }
//! let rt = Runtime::new(Config::new().procs(2).pin(false))?;
//! let dsm = Dsm::new(&rt)?;
//! let n = 5000;
//! let v = dsm.vec::<u64>(n).placement(Placement::Cyclic).zeroed()?;
//! rt.run(|ctx| fill(ctx, &v, 0, n))?; // ends with a release
//! // A following phase (on any node) reads what the fork-join filaments wrote.
//! let total = rt.reduction(0u64);
//! let mut sum = 0;
//! let mut prog = Program::new();
//! prog.phase(
//!     PoolArray::block(&rt, 0..n, 1),
//!     |ctx, i| total.fold(ctx, Op::Sum, v.get(i)),
//!     |post| { sum = post.reduce(&total, Op::Sum); Control::Done },
//! );
//! rt.start(&mut prog)?;
//! drop(prog);
//! assert_eq!(sum, (0..n as u64).map(|i| 3 * i).sum::<u64>());
//! assert_eq!(v.get(n - 1), 3 * (n as u64 - 1));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The multi-node check of this is `examples/dsm_forkjoin.rs` (run by
//! `tests/dsm.rs` on 2×1 and 2×2).
//!
//! Every node makes the same allocations in the same order (SPMD, like the
//! rest of a hyfi program); a mismatch is detected and reported.
//!
//! ```
//! use hyfi::{Config, Control, Dsm, Placement, PoolArray, Program, Runtime};
//!
//! let rt = Runtime::new(Config::new().procs(2).pin(false))?;
//! let dsm = Dsm::new(&rt)?;
//! let n = 64;
//! // Squares of 0..n, computed by filaments into a shared vector.
//! let v = dsm.vec::<u64>(n).placement(Placement::Block).zeroed()?;
//! let mut prog = Program::new();
//! prog.phase(
//!     PoolArray::block(&rt, 0..n, 1),
//!     |_ctx, i| v.set(i, (i * i) as u64),
//!     |_| Control::Done,
//! );
//! rt.start(&mut prog)?;
//! drop(prog);
//! assert_eq!(v.to_vec(), (0..n as u64).map(|i| i * i).collect::<Vec<_>>());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

mod alloc;
mod array;
mod core;
mod elem;
mod error;
mod footprint;
mod hook;
pub mod plain;
mod region;
mod stats;

use std::sync::Arc;

use hyfi_core::layer::RuntimeExt;
use hyfi_core::link::ServiceId;
use hyfi_core::{NodeLink, Runtime};

pub use alloc::{MatrixAlloc, Placement, VecAlloc};
pub use array::{DsmMatrix, DsmVec, MatrixView, View, ViewMut};
pub use error::DsmError;

/// The shared memory's service on the node link: its number on the wire,
/// owned by this layer (see [`ServiceId`]).
pub const SERVICE: ServiceId = ServiceId::new(1, "the shared memory");
pub use footprint::{ReadRange, ReadRows, RowWriter, WriteRange, WriteRows};
pub use region::{DEFAULT_ADDR, DEFAULT_SIZE, PAGE};

/// Checks the shared memory's settings (`HYFI_DSM_SIZE`, `HYFI_DSM_ADDR`)
/// without reserving anything: a launcher checks them before it starts any
/// node ([`hyfi::init`](../hyfi/fn.init.html) does).
pub fn check_env() -> Result<(), DsmError> {
    region::size_from_env()?;
    region::addr_from_env()?;
    plain::configure()?;
    Ok(())
}
pub use stats::{DsmCounters, DsmStats};

use crate::core::Core;
use crate::hook::Hook;

/// Where a node reserves its region.
#[derive(Clone, Copy)]
enum Base {
    /// At one address, the same on every node (separate processes).
    Shared,
    /// At an address of each node's own (nodes in one process).
    PerNode(Option<usize>),
}

/// A node's shared memory. Create one per runtime, on every node, with
/// [`Dsm::new`]; clone the handle freely.
#[derive(Clone)]
pub struct Dsm {
    core: Arc<Core>,
    link: Arc<dyn NodeLink>,
}

impl Dsm {
    /// The DSM of `rt`'s node, created on the first call — collectively:
    /// every node calls it. Later calls on the same runtime return the same
    /// DSM (a runtime has one).
    ///
    /// Reserves the shared region (`HYFI_DSM_SIZE`, default
    /// [`DEFAULT_SIZE`] of address space; on several nodes at
    /// `HYFI_DSM_ADDR`, default [`DEFAULT_ADDR`], the same on every node),
    /// installs the page server on the communication thread and the
    /// release at every phase end of `rt`.
    pub fn new(rt: &Runtime) -> Result<Dsm, DsmError> {
        Dsm::create(rt, Base::Shared)
    }

    /// [`Dsm::new`] for several nodes in one process
    /// ([`hyfi_core::link::InProcess`]): each node reserves its region at
    /// its own `base` (page-aligned; `None`: wherever the kernel puts it)
    /// instead of one address shared by every node, since the nodes share
    /// one address space. The protocol names pages by number, not by
    /// address, so nothing else changes; only pointers stored *in* shared
    /// arrays would not mean the same on every node.
    pub fn with_base(rt: &Runtime, base: Option<usize>) -> Result<Dsm, DsmError> {
        Dsm::create(rt, Base::PerNode(base))
    }

    fn create(rt: &Runtime, base: Base) -> Result<Dsm, DsmError> {
        let link = rt.link().clone();
        if let Some(core) = rt.layer_state::<Core>() {
            return Ok(Dsm { core, link });
        }
        let (me, nodes) = (link.my_node(), link.num_nodes());
        plain::configure()?;
        let size = region::size_from_env()?;
        let addr = match base {
            Base::PerNode(addr) => addr,
            Base::Shared if nodes > 1 => Some(region::addr_from_env()?.unwrap_or(DEFAULT_ADDR)),
            Base::Shared => region::addr_from_env()?,
        };
        let port = if nodes > 1 {
            Some(link.port().ok_or(DsmError::NoServices { nodes })?)
        } else {
            None
        };
        let reserved = region::Region::reserve(size, addr);
        if nodes > 1 {
            // Did every node get the region, at the same address?
            // [min addr, max addr, min flag, max flag]; flag = failed node + 1.
            let mine = match &reserved {
                Ok(r) => [r.base as u64, 0],
                Err(_) => [addr.unwrap_or(0) as u64, me as u64 + 1],
            };
            let all = allreduce_minmax(&*link, &mine)?;
            if all[3] != 0 {
                let failed = all[3] as usize - 1;
                return Err(DsmError::Region {
                    node: failed,
                    addr: addr.unwrap_or(0),
                    size,
                    why: match (&reserved, failed == me) {
                        (Err(why), true) => why.to_string(),
                        _ => format!("see node {failed}'s output"),
                    },
                });
            }
            if all[0] != all[1] && matches!(base, Base::Shared) {
                return Err(DsmError::RegionMismatch {
                    lo: all[0] as usize,
                    hi: all[1] as usize,
                });
            }
        }
        let region = reserved.map_err(|why| DsmError::Region {
            node: me,
            addr: addr.unwrap_or(0),
            size,
            // Text: on several nodes the reason may be another node's.
            why: why.to_string(),
        })?;
        let core = Arc::new(Core::new(
            me,
            nodes,
            rt.procs(),
            region,
            port,
            rt.access_epoch_counter(),
        ));
        if nodes > 1 {
            link.set_service(SERVICE, core.clone())
                .map_err(DsmError::Link)?;
            // SIGUSR1 prints the DSM's counters with the node's traffic.
            let weak = Arc::downgrade(&core);
            link.add_report(Box::new(move || {
                weak.upgrade().map(|c| c.stats().to_string())
            }));
        }
        rt.set_phase_end(Arc::new(Hook(core.clone())))?;
        // Found again by a later `Dsm::new` on this runtime. The hook just
        // went in, so this is the runtime's first DSM.
        rt.set_layer_state(core.clone())?;
        link.enter_step(hyfi_core::Step::Setup { layer: SERVICE })
            .map_err(DsmError::Link)?;
        // Nobody sends a page request before every page server is in.
        link.barrier().map_err(DsmError::Link)?;
        Ok(Dsm { core, link })
    }

    /// This node.
    pub fn node(&self) -> usize {
        self.core.me
    }
    /// Number of nodes.
    pub fn nodes(&self) -> usize {
        self.core.nodes
    }

    // Allocating arrays (`vec`, `matrix`) is in the `alloc` module.

    /// This node's counters, in total and per phase.
    pub fn stats(&self) -> DsmStats {
        self.core.stats()
    }
}

/// All-reduces `vals` into `[min0, max0, min1, max1, ...]` over the nodes.
fn allreduce_minmax(link: &dyn NodeLink, vals: &[u64]) -> Result<Vec<u64>, DsmError> {
    let mut buf: Vec<u64> = vals.iter().flat_map(|&v| [v, v]).collect();
    let bytes = bytemuck::cast_slice_mut::<u64, u8>(&mut buf);
    link.allreduce(bytes, &mut |acc, other| {
        let a: &mut [u64] = bytemuck::cast_slice_mut(acc);
        let o: &[u64] = bytemuck::cast_slice(other);
        for k in 0..a.len() / 2 {
            a[2 * k] = a[2 * k].min(o[2 * k]);
            a[2 * k + 1] = a[2 * k + 1].max(o[2 * k + 1]);
        }
    })
    .map_err(DsmError::Link)?;
    Ok(buf)
}
