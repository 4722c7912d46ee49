//! Collective allocation of shared arrays. [`Dsm::vec`] and [`Dsm::matrix`]
//! start a builder ([`VecAlloc`], [`MatrixAlloc`]) that says where the
//! pages live ([`Placement`]) and, for a matrix, how its rows are laid out
//! ([`MatrixAlloc::pad_rows`]); `zeroed` or `from_fn` then allocate on
//! every node. Every node makes the same allocations in the same order
//! (SPMD): the nodes compare each one (sequence, sizes, placement) before
//! any of them uses it, and a mismatch is an error naming what differs.

use std::ops::Range;
use std::sync::Arc;

use bytemuck::Pod;

use crate::core::{INVALID, READ, WRITE};
use crate::region::{self, PAGE};
use crate::{allreduce_minmax, array, elem, Dsm, DsmError, DsmMatrix, DsmVec};

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
    /// exactly as [`PoolArray::block`](hyfi_core::PoolArray::block) and
    /// `block_rows` deal out `range` (rows before it go to node 0, after it
    /// to the last node), so a node's filaments write pages homed on that
    /// node. A page's home is
    /// the home of the row holding its first byte: align the blocks to
    /// pages ([`MatrixAlloc::align_blocks`]) or pad rows to whole pages
    /// ([`MatrixAlloc::pad_rows`]) for an exact match.
    BlockRows(Range<usize>),
    /// Rows dealt cyclically over the global processors as
    /// [`PoolArray::cyclic`](hyfi_core::PoolArray::cyclic) deals `range`
    /// (row `i` to global processor `(i - start) % (nodes × procs)`, whose
    /// node is its home).
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

impl Dsm {
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
            align: false,
            placement: Placement::Block,
            _t: std::marker::PhantomData,
        }
    }

    /// Allocates `rows` rows of `stride` elements of `T` (rows padded when
    /// `stride` was rounded up), `origin` elements into the segment's first
    /// page (see [`MatrixAlloc::align_blocks`]), collectively, and
    /// initializes them (`init` gets the array's element index).
    fn alloc<T: Pod>(
        &self,
        rows: usize,
        stride: usize,
        origin: usize,
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
            .and_then(|e| e.checked_add(origin))
            .and_then(|e| e.checked_mul(size))
            .ok_or_else(|| DsmError::Placement("array size overflows".into()))?;
        let pages = bytes.div_ceil(PAGE);
        let row_bytes = (stride * size).max(1);
        let homes = self.homes(placement, pages, rows, row_bytes, origin * size)?;
        let (off, seq) = {
            let a = self.core.alloc.lock().unwrap_or_else(|e| e.into_inner());
            (a.0, a.1)
        };
        // Every node must make the same allocations, in the same order.
        self.link
            .enter_step(hyfi_core::Step::Alloc {
                seq,
                elems: (origin + rows * stride) as u64,
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
        // Diffs in whole elements up to a word (core/diff.rs).
        let grain = align.min(8);
        let seg = Arc::new(self.core.segment(seq, off, homes, state0, home0, grain));
        let sh = Arc::new(array::Shared::<T>::new(
            self.core.clone(),
            seg.clone(),
            origin,
        ));
        if let Some(f) = init {
            let me = self.core.me as u16;
            for e in 0..rows * stride {
                let (lo, hi) = sh.pages(e, 1);
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
        lead: usize,
    ) -> Result<Vec<u16>, DsmError> {
        let n = self.core.nodes;
        let p = self.core.procs;
        // The row holding the page's first byte (the first row, for the
        // `lead` bytes before it).
        let row_of =
            |pg: usize| ((pg * PAGE).saturating_sub(lead) / row_bytes).min(rows.saturating_sub(1));
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

/// `align_blocks`' layout of `rows` rows of `cols` elements of `size`
/// bytes whose rows `range` are dealt in blocks over `nodes` nodes: the
/// smallest stride (in elements, at least `cols`) for which the rows where
/// one node's rows follow another's are all a whole number of pages apart,
/// and the origin (elements before row 0) that puts the first of them on a
/// page boundary; `None` where only whole pages would do.
fn aligned_blocks(
    rows: usize,
    cols: usize,
    size: usize,
    range: &Range<usize>,
    nodes: usize,
) -> Option<(usize, usize)> {
    // Where the home changes: at the start of a block, or where the rows
    // after `range` (the last node's) begin.
    let mut starts: Vec<usize> = (0..nodes)
        .map(|k| hyfi_core::block(range.clone(), nodes, k).start)
        .chain([range.start, range.end])
        .filter(|&i| {
            i > 0 && i < rows && block_node(range, nodes, i) != block_node(range, nodes, i - 1)
        })
        .collect();
    starts.sort_unstable();
    starts.dedup();
    let Some(&first) = starts.first() else {
        // One home for every row: nothing to align.
        return Some((cols, 0));
    };
    // Every start a whole number of pages after the first: the stride in
    // bytes a multiple of PAGE / gcd(PAGE, d), d the gcd of the distances.
    let d = starts.iter().fold(0, |g, &i| gcd(g, i - first));
    let unit = if d == 0 { 1 } else { PAGE / gcd(PAGE, d) }.max(size);
    if unit >= PAGE {
        return None;
    }
    // `size` divides PAGE (the caller checked), so both are powers of two
    // and `unit` is a multiple of `size`.
    let stride = (cols * size).div_ceil(unit) * unit;
    let lead = (PAGE - (first * stride) % PAGE) % PAGE;
    Some((stride / size, lead / size))
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
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
        let sh = self.dsm.alloc::<T>(self.len, 1, 0, &self.placement, None)?;
        Ok(DsmVec::new(sh, self.len))
    }
    /// Element `i` is `f(i)`. Each home computes its own pages; other nodes
    /// fetch them on first touch.
    pub fn from_fn(self, mut f: impl FnMut(usize) -> T) -> Result<DsmVec<T>, DsmError> {
        let sh = self
            .dsm
            .alloc::<T>(self.len, 1, 0, &self.placement, Some(&mut f))?;
        Ok(DsmVec::new(sh, self.len))
    }
}

/// The collective allocation of a shared matrix (see [`Dsm::matrix`]).
pub struct MatrixAlloc<'d, T> {
    dsm: &'d Dsm,
    rows: usize,
    cols: usize,
    pad: bool,
    align: bool,
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
    /// by different nodes then never share a page). Without it, the page
    /// two nodes' blocks share is written by both in every phase: each
    /// release moves a diff from the other node to its home and the home's
    /// own writes back as a diff (after two releases to settle, on two
    /// nodes; on more, a page held by half the others or more is fetched
    /// again in every phase).
    ///
    /// Padding costs every sweep the gap it leaves, the plain loop's too: a
    /// row of 2 050 `f64`s (4.004 pages) padded to 5 pages makes a
    /// memory-bound sweep about a quarter slower on any configuration, and
    /// a short row padded to a page wastes the rest of it (a 3-D grid of n²
    /// rows of 96 `f64`s: 5.3× its memory, 2.4× the loop's time on one
    /// node). With a [`Placement::BlockRows`] placement,
    /// [`MatrixAlloc::align_blocks`] keeps two nodes' rows off one page
    /// without that gap (its docs and BENCHMARKS.md, "Padded rows", have
    /// the figures). Pad where rows must be whole pages
    /// ([`DsmMatrix::reduce_at_end_with_row`] carries one) or are already
    /// (n a multiple of 512 `f64`s loses nothing).
    pub fn pad_rows(mut self) -> Self {
        self.pad = true;
        self
    }
    /// Lays rows out unpadded, but so that every node's block of rows
    /// starts on a page: no page holds rows of two nodes, as with
    /// [`MatrixAlloc::pad_rows`], and a row is at most a few bytes longer
    /// than its elements, not up to a page. For a
    /// [`Placement::BlockRows`] placement (with another placement it pads
    /// rows as `pad_rows` does).
    ///
    /// The matrix starts a little way into its first page, and the row
    /// stride is rounded up just enough that the blocks' first rows all
    /// fall on page boundaries: by nothing for two nodes; for equal blocks
    /// of b rows to a multiple of 4096 / b bytes (32 bytes for sixteen
    /// blocks of 128 rows); where the blocks' first rows lie an odd number
    /// of rows apart (three blocks of 333), to whole pages, as `pad_rows`.
    /// The layout depends on the node count, so it differs between
    /// configurations; results do not.
    ///
    /// Use it for stencils over grids whose rows are not whole pages: a
    /// padded row leaves a gap every sweep streams past (2050² `f64`s: a
    /// diffusion per row on one node at 1.33× its loop's time padded, 1.02×
    /// so), and unpadded rows put two nodes' rows on one page, which a
    /// program that exchanges several grids' halos per iteration pays for
    /// (the CG example at 514² on 2×1: 1.15× the loop's time unpadded,
    /// 0.61× padded). BENCHMARKS.md, "Padded rows", has the figures. Rows
    /// that must be whole pages ([`DsmMatrix::reduce_at_end_with_row`]
    /// carries one) need `pad_rows`, which takes precedence.
    ///
    /// ```
    /// use hyfi::{Config, Placement, Runtime};
    /// let rt = Runtime::new(Config::new().procs(1))?;
    /// let dsm = hyfi::Dsm::new(&rt)?;
    /// let n = 1026;
    /// let g = dsm
    ///     .matrix::<f64>(n, n)
    ///     .placement(Placement::BlockRows(1..n - 1))
    ///     .align_blocks()
    ///     .from_fn(|i, j| (i * n + j) as f64)?;
    /// assert_eq!(g.get(1025, 1025), (1025 * n + 1025) as f64);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn align_blocks(mut self) -> Self {
        self.align = true;
        self
    }
    /// The row stride and the array's first element in its segment, in
    /// elements (see `pad_rows` and `align_blocks`).
    fn layout(&self) -> (usize, usize) {
        let s = std::mem::size_of::<T>().max(1);
        if PAGE % s != 0 || !(self.pad || self.align) {
            return (self.cols, 0);
        }
        let padded = ((self.cols * s).div_ceil(PAGE) * PAGE / s, 0);
        let range = match &self.placement {
            Placement::BlockRows(range) if !self.pad => range,
            _ => return padded,
        };
        aligned_blocks(self.rows, self.cols, s, range, self.dsm.core.nodes).unwrap_or(padded)
    }
    /// All zeros (valid on every node from the start).
    pub fn zeroed(self) -> Result<DsmMatrix<T>, DsmError> {
        let (stride, origin) = self.layout();
        let sh = self
            .dsm
            .alloc::<T>(self.rows, stride, origin, &self.placement, None)?;
        Ok(DsmMatrix::new(sh, self.rows, self.cols, stride))
    }
    /// Element `(i, j)` is `f(i, j)`. Each home computes its own pages;
    /// other nodes fetch them on first touch.
    pub fn from_fn(self, mut f: impl FnMut(usize, usize) -> T) -> Result<DsmMatrix<T>, DsmError> {
        let (stride, origin) = self.layout();
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
            .alloc::<T>(self.rows, stride, origin, &self.placement, Some(&mut g))?;
        Ok(DsmMatrix::new(sh, self.rows, self.cols, stride))
    }
}

#[cfg(test)]
mod tests {
    use super::{aligned_blocks, block_node, PAGE};

    /// Every row where the home changes starts on a page, the stride is at
    /// least the row and less than a page longer, the origin is within the
    /// first page; and the known cases come out as the docs say.
    #[test]
    fn aligned_blocks_put_every_nodes_first_row_on_a_page() {
        // (rows, cols, element size, range, nodes)
        let mut cases = vec![];
        for nodes in 1..=17 {
            for (rows, cols, size) in [
                (2050, 2050, 8),
                (1026, 1026, 8),
                (514, 514, 8),
                (66, 66, 8),
                (2050, 2050, 4),
                (1024, 1024, 8),
                (1000, 1000, 1),
                (300, 3, 2),
                (5, 7, 8),
            ] {
                cases.push((rows, cols, size, 1..rows - 1, nodes));
                cases.push((rows, cols, size, 0..rows, nodes));
            }
        }
        let (mut aligned, mut refused) = (0, 0);
        for (rows, cols, size, range, nodes) in cases {
            let case = format!("{rows}×{cols} of {size} B, {range:?} over {nodes}");
            let Some((stride, origin)) = aligned_blocks(rows, cols, size, &range, nodes) else {
                refused += 1;
                continue;
            };
            aligned += 1;
            assert!(stride >= cols && (stride - cols) * size < PAGE, "{case}");
            assert!(origin * size < PAGE, "{case}");
            for i in 1..rows {
                if block_node(&range, nodes, i) != block_node(&range, nodes, i - 1) {
                    assert_eq!((origin + i * stride) * size % PAGE, 0, "{case}: row {i}");
                }
            }
        }
        assert!(
            aligned > 50 && refused > 0,
            "{aligned} aligned, {refused} refused"
        );
        // Interiors of 2^k rows over 2^j nodes (the common grid) always
        // align, a row growing by less than a page over the block's rows.
        for nodes in [1, 2, 4, 8, 16] {
            for n in [2050, 1026, 514, 130] {
                let (stride, _) = aligned_blocks(n, n, 8, &(1..n - 1), nodes)
                    .unwrap_or_else(|| panic!("{n}² over {nodes}"));
                let block = (n - 2) / nodes;
                assert!(
                    (stride - n) * 8 < PAGE / block,
                    "{n}² over {nodes}: stride {stride}"
                );
            }
        }
        // Two nodes: no stride added. Sixteen blocks of 128 rows: 32 bytes.
        let (s2, o2) = aligned_blocks(2050, 2050, 8, &(1..2049), 2).unwrap();
        assert_eq!(s2, 2050);
        assert_eq!((o2 + 1025 * s2) * 8 % PAGE, 0);
        assert_eq!(
            aligned_blocks(2050, 2050, 8, &(1..2049), 16).unwrap().0,
            2052
        );
        assert_eq!(aligned_blocks(100, 100, 8, &(1..99), 1), Some((100, 0)));
        // Three blocks of 333 rows: only whole pages would do.
        assert_eq!(aligned_blocks(1001, 1000, 8, &(1..1000), 3), None);
    }
}
