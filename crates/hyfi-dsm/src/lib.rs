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
//!   .fill(cols, |j| ..)`) or updated by `ViewMut::update_range` (LU's
//!   `x - l * y`) is checked once and moves 16 bytes at a time on x86-64,
//!   so it vectorises as the slice loop does; the `elem` module says why
//!   those wide accesses are as defined as the element accesses.
//!
//! Either way, a miss asks the home for every missing page of the range at
//! once and suspends the filthread, and its processor runs the filthreads
//! of its other pools meanwhile — several pools per processor overlap
//! communication with computation.
//!
//! **Consistency** is release consistency at phase boundaries: whatever
//! any node wrote during a phase is visible on every node after the phase's
//! barrier. Several nodes may write different bytes of one page in one
//! phase (twins and byte-exact diffs go to the home; write notices
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
//! use hyfi_core::{Config, Control, Ctx, Op, PoolArray, Program, Runtime};
//! use hyfi_dsm::{Dsm, DsmVec, Placement};
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
//! use hyfi_core::{Config, Control, PoolArray, Program, Runtime};
//! use hyfi_dsm::{Dsm, Placement};
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

mod array;
mod core;
mod elem;
mod error;
mod footprint;
mod hook;
mod region;
mod stats;

use hyfi_core::layer::RuntimeExt;
use std::ops::Range;
use std::sync::Arc;

use bytemuck::Pod;
use hyfi_core::link::ServiceId;
use hyfi_core::{NodeLink, Runtime};

pub use array::{DsmMatrix, DsmVec, MatrixView, View, ViewMut};
pub use error::DsmError;
pub use footprint::{ReadRange, ReadRows, RowWriter, WriteRange, WriteRows};
pub use region::{DEFAULT_ADDR, DEFAULT_SIZE, PAGE};
pub use stats::{DsmCounters, DsmStats};

use crate::core::{Core, INVALID, READ, WRITE};
use crate::hook::Hook;

/// Which node is the home of each page of an array.
#[derive(Clone)]
pub enum Placement {
    /// The pages in `nodes` contiguous blocks of (nearly) equal size.
    Block,
    /// Page `p` at node `p % nodes`.
    Cyclic,
    /// Every page at one node.
    Node(usize),
    /// Rows (of a matrix; elements of a vector) in blocks over the nodes
    /// exactly as [`hyfi_core::PoolArray::block`] and `block_rows` deal out
    /// `range` (rows before it go to node 0, after it to the last node), so
    /// a node's filaments write pages homed on that node. A page's home is
    /// the home of the row holding its first byte: pad rows to whole pages
    /// ([`MatrixAlloc::pad_rows`]) for an exact match.
    BlockRows(Range<usize>),
    /// Rows dealt cyclically over the global processors as
    /// [`hyfi_core::PoolArray::cyclic`] deals `range` (row `i` to global
    /// processor `(i - start) % (nodes × procs)`, whose node is its home).
    CyclicRows(Range<usize>),
    /// The home of every page, explicitly (one entry per page).
    Explicit(Vec<usize>),
}

impl std::fmt::Debug for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Placement::Block => write!(f, "Block"),
            Placement::Cyclic => write!(f, "Cyclic"),
            Placement::Node(n) => write!(f, "Node({n})"),
            Placement::BlockRows(r) => write!(f, "BlockRows({r:?})"),
            Placement::CyclicRows(r) => write!(f, "CyclicRows({r:?})"),
            Placement::Explicit(v) => write!(f, "Explicit({} pages)", v.len()),
        }
    }
}

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
        if let Some(h) = rt.phase_end() {
            if let Some(Hook(core)) = h.as_any().downcast_ref::<Hook>() {
                return Ok(Dsm {
                    core: core.clone(),
                    link,
                });
            }
        }
        let (me, nodes) = (link.my_node(), link.num_nodes());
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
            link.set_service(ServiceId::Dsm, core.clone())
                .map_err(DsmError::Link)?;
            // SIGUSR1 prints the DSM's counters with the node's traffic.
            let weak = Arc::downgrade(&core);
            link.add_report(Box::new(move || {
                weak.upgrade().map(|c| c.stats().to_string())
            }));
        }
        rt.set_phase_end(Arc::new(Hook(core.clone())))?;
        link.enter_step(hyfi_core::Step::Setup { layer: 1 })
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

    /// Starts the collective allocation of a shared vector of `len`
    /// elements (block placement unless changed).
    pub fn vec<T: Pod + Send + Sync>(&self, len: usize) -> VecAlloc<'_, T> {
        VecAlloc {
            dsm: self,
            len,
            placement: Placement::Block,
            _t: std::marker::PhantomData,
        }
    }

    /// Starts the collective allocation of a shared `rows × cols` matrix
    /// (block placement, unpadded rows unless changed).
    pub fn matrix<T: Pod + Send + Sync>(&self, rows: usize, cols: usize) -> MatrixAlloc<'_, T> {
        MatrixAlloc {
            dsm: self,
            rows,
            cols,
            pad: false,
            placement: Placement::Block,
            _t: std::marker::PhantomData,
        }
    }

    /// This node's counters, in total and per phase.
    pub fn stats(&self) -> DsmStats {
        self.core.stats()
    }

    /// Allocates `rows` rows of `stride` elements of `T` (rows padded when
    /// `stride` was rounded up), collectively, and initializes them.
    fn alloc<T: Pod>(
        &self,
        rows: usize,
        stride: usize,
        placement: &Placement,
        init: Option<&mut dyn FnMut(usize) -> T>,
    ) -> Result<Arc<array::Shared<T>>, DsmError> {
        let (size, align) = (std::mem::size_of::<T>(), std::mem::align_of::<T>());
        if size == 0 || size > PAGE || PAGE % align != 0 {
            return Err(DsmError::Element {
                ty: std::any::type_name::<T>(),
                size,
                align,
                page: PAGE,
            });
        }
        let bytes = rows
            .checked_mul(stride)
            .and_then(|e| e.checked_mul(size))
            .ok_or_else(|| DsmError::Placement("array size overflows".into()))?;
        let pages = bytes.div_ceil(PAGE);
        let row_bytes = (stride * size).max(1);
        let homes = self.homes(placement, pages, rows, row_bytes)?;
        let (off, seq) = {
            let a = self.core.alloc.lock().unwrap_or_else(|e| e.into_inner());
            (a.0, a.1)
        };
        // Every node must make the same allocations, in the same order.
        self.link
            .enter_step(hyfi_core::Step::Alloc {
                seq,
                elems: (rows * stride) as u64,
                bytes: bytes as u64,
            })
            .map_err(DsmError::Link)?;
        let fingerprint = [
            seq,
            pages as u64,
            bytes as u64,
            size as u64,
            fnv(homes.iter().flat_map(|h| h.to_le_bytes())),
        ];
        let agreed = allreduce_minmax(&*self.link, &fingerprint)?;
        let names = [
            "sequence",
            "page count",
            "byte size",
            "element size",
            "placement",
        ];
        for (k, what) in names.iter().enumerate() {
            if agreed[2 * k] != agreed[2 * k + 1] {
                return Err(DsmError::Mismatch { seq, what });
            }
        }
        let free = self.core.region.size - off;
        if pages * PAGE > free {
            return Err(DsmError::RegionFull {
                seq,
                asked: pages * PAGE,
                free,
                size: self.core.region.size,
            });
        }
        {
            let mut a = self.core.alloc.lock().unwrap_or_else(|e| e.into_inner());
            // The next array starts after a gap (see `region::COLOUR_GAP`).
            let next = (off + pages * PAGE + region::COLOUR_GAP).min(self.core.region.size);
            *a = (next, seq + 1);
        }
        // One node: every page is home, always writable (no protocol).
        // Several: zeroed pages are valid everywhere (their homes' first
        // write is noticed to every node); initialized pages only at their
        // homes (others fetch on first touch), writable there without a
        // fault until some node is served a copy.
        let (state0, home0) = match (self.core.nodes, init.is_some()) {
            (1, _) => (WRITE, WRITE),
            (_, false) => (READ, READ),
            (_, true) => (INVALID, WRITE),
        };
        let seg = Arc::new(self.core.segment(seq, off, homes, state0, home0));
        let sh = Arc::new(array::Shared::<T>::new(self.core.clone(), seg.clone()));
        if let Some(f) = init {
            let me = self.core.me as u16;
            for e in 0..rows * stride {
                let (lo, hi) = ((e * size) / PAGE, (e * size + size - 1) / PAGE);
                if seg.homes[lo] != me && seg.homes[hi] != me {
                    continue;
                }
                let v = f(e);
                // SAFETY: in bounds of the allocation; only this thread
                // touches the new array until it is returned.
                unsafe { elem::store(sh.base.add(e), v) };
            }
        }
        self.core.add_segment(seg);
        // Nobody asks for a page of it before its home has filled it.
        self.link.barrier().map_err(DsmError::Link)?;
        Ok(sh)
    }

    fn homes(
        &self,
        placement: &Placement,
        pages: usize,
        rows: usize,
        row_bytes: usize,
    ) -> Result<Vec<u16>, DsmError> {
        let n = self.core.nodes;
        let p = self.core.procs;
        let row_of = |pg: usize| ((pg * PAGE) / row_bytes).min(rows.saturating_sub(1));
        let homes: Vec<usize> = match placement {
            Placement::Block => (0..pages).map(|pg| pg * n / pages.max(1)).collect(),
            Placement::Cyclic => (0..pages).map(|pg| pg % n).collect(),
            Placement::Node(k) => vec![*k; pages],
            Placement::BlockRows(range) => (0..pages)
                .map(|pg| block_node(range, n, row_of(pg)))
                .collect(),
            Placement::CyclicRows(range) => (0..pages)
                .map(|pg| {
                    let i = row_of(pg).clamp(range.start, range.end.max(range.start + 1) - 1);
                    ((i - range.start) % (n * p)) / p
                })
                .collect(),
            Placement::Explicit(v) => {
                if v.len() != pages {
                    return Err(DsmError::Placement(format!(
                        "an explicit placement of {} entries for an array of {pages} pages",
                        v.len()
                    )));
                }
                v.clone()
            }
        };
        if let Some(bad) = homes.iter().find(|&&h| h >= n) {
            return Err(DsmError::Placement(format!(
                "{placement:?} names node {bad}, but the job has {n} nodes"
            )));
        }
        Ok(homes.into_iter().map(|h| h as u16).collect())
    }
}

/// The node whose block of `range` holds row `i` (as PoolArray deals it).
fn block_node(range: &Range<usize>, nodes: usize, i: usize) -> usize {
    if range.is_empty() || i < range.start {
        return 0;
    }
    if i >= range.end {
        return nodes - 1;
    }
    (0..nodes)
        .find(|&k| hyfi_core::block(range.clone(), nodes, k).contains(&i))
        .unwrap_or(nodes - 1)
}

fn fnv(bytes: impl Iterator<Item = u8>) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
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

/// The collective allocation of a shared vector (see [`Dsm::vec`]).
pub struct VecAlloc<'d, T> {
    dsm: &'d Dsm,
    len: usize,
    placement: Placement,
    _t: std::marker::PhantomData<T>,
}

impl<T: Pod + Send + Sync> VecAlloc<'_, T> {
    /// Where its pages live.
    pub fn placement(mut self, p: Placement) -> Self {
        self.placement = p;
        self
    }
    /// All zeros (valid on every node from the start).
    pub fn zeroed(self) -> Result<DsmVec<T>, DsmError> {
        let sh = self.dsm.alloc::<T>(self.len, 1, &self.placement, None)?;
        Ok(DsmVec::new(sh, self.len))
    }
    /// Element `i` is `f(i)`. Each home computes its own pages; other nodes
    /// fetch them on first touch.
    pub fn from_fn(self, mut f: impl FnMut(usize) -> T) -> Result<DsmVec<T>, DsmError> {
        let sh = self
            .dsm
            .alloc::<T>(self.len, 1, &self.placement, Some(&mut f))?;
        Ok(DsmVec::new(sh, self.len))
    }
}

/// The collective allocation of a shared matrix (see [`Dsm::matrix`]).
pub struct MatrixAlloc<'d, T> {
    dsm: &'d Dsm,
    rows: usize,
    cols: usize,
    pad: bool,
    placement: Placement,
    _t: std::marker::PhantomData<T>,
}

impl<T: Pod + Send + Sync> MatrixAlloc<'_, T> {
    /// Where its pages live.
    pub fn placement(mut self, p: Placement) -> Self {
        self.placement = p;
        self
    }
    /// Pads every row to whole pages, so no page holds two rows (rows owned
    /// by different nodes then never share a page).
    pub fn pad_rows(mut self) -> Self {
        self.pad = true;
        self
    }
    fn stride(&self) -> usize {
        let s = std::mem::size_of::<T>().max(1);
        if self.pad && PAGE % s == 0 {
            (self.cols * s).div_ceil(PAGE) * PAGE / s
        } else {
            self.cols
        }
    }
    /// All zeros (valid on every node from the start).
    pub fn zeroed(self) -> Result<DsmMatrix<T>, DsmError> {
        let stride = self.stride();
        let sh = self
            .dsm
            .alloc::<T>(self.rows, stride, &self.placement, None)?;
        Ok(DsmMatrix::new(sh, self.rows, self.cols, stride))
    }
    /// Element `(i, j)` is `f(i, j)`. Each home computes its own pages;
    /// other nodes fetch them on first touch.
    pub fn from_fn(self, mut f: impl FnMut(usize, usize) -> T) -> Result<DsmMatrix<T>, DsmError> {
        let stride = self.stride();
        let cols = self.cols;
        let mut g = |e: usize| {
            let (i, j) = (e / stride, e % stride);
            if j < cols {
                f(i, j)
            } else {
                T::zeroed()
            }
        };
        let sh = self
            .dsm
            .alloc::<T>(self.rows, stride, &self.placement, Some(&mut g))?;
        Ok(DsmMatrix::new(sh, self.rows, self.cols, stride))
    }
}
