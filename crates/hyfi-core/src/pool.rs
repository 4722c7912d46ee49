//! Pools: groups of iterative filaments with spatial locality, one or more
//! per processor (paper §2).
//!
//! A pool stores *segments* of a 1-D or 2-D index space, never one
//! descriptor per filament: `push` in a loop, as the paper's
//! `filCreateFilament`, coalesces consecutive indices into ranges, and
//! `push_range` / `push_grid` add a whole range at once. Filling a pool with
//! a million points costs a few segments.
//!
//! ```
//! use hyfi_core::{Config, PoolArray, Runtime};
//! let rt = Runtime::new(Config::new().procs(2).pin(false)).unwrap();
//! let mut pools = PoolArray::<(usize, usize)>::new(&rt, 1);
//! for i in 0..4 {
//!     for j in 1..3 {
//!         pools.pool(i / 2).push((i, j)); // rows 0-1 on processor 0, 2-3 on 1
//!     }
//! }
//! assert_eq!(pools.pool(0).len(), 4);
//! assert_eq!(pools.pool(0).segments(), 1); // coalesced: rows 0..2 × cols 1..3
//! ```

use std::ops::Range;

use crate::runtime::Runtime;

mod sealed {
    pub trait Sealed {}
    impl Sealed for usize {}
    impl Sealed for (usize, usize) {}
}

/// The argument of an iterative filament: a 1-D index `usize` or a 2-D index
/// `(usize, usize)`. Filaments needing other data compute it from the index.
pub trait Index: Copy + Send + Sync + 'static + sealed::Sealed {
    #[doc(hidden)]
    fn at(i: usize, j: usize) -> Self;
    #[doc(hidden)]
    fn unit(self) -> Seg;
}

impl Index for usize {
    #[inline(always)]
    fn at(i: usize, _j: usize) -> Self {
        i
    }
    fn unit(self) -> Seg {
        Seg {
            rows: self..self + 1,
            step: 1,
            cols: 0..1,
        }
    }
}

impl Index for (usize, usize) {
    #[inline(always)]
    fn at(i: usize, j: usize) -> Self {
        (i, j)
    }
    fn unit(self) -> Seg {
        Seg {
            rows: self.0..self.0 + 1,
            step: 1,
            cols: self.1..self.1 + 1,
        }
    }
}

/// A rectangle of filaments: rows `rows` (every `step`-th) × columns `cols`.
#[doc(hidden)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seg {
    rows: Range<usize>,
    step: usize,
    cols: Range<usize>,
}

impl Seg {
    fn len(&self) -> usize {
        self.rows.clone().step_by(self.step).len() * self.cols.len()
    }
    fn single_row(&self) -> bool {
        self.rows.len() == 1
    }
}

/// One pool: the filaments one filthread runs, in the order they were added.
#[derive(Clone, Debug)]
pub struct Pool<I: Index> {
    segs: Vec<Seg>,
    len: usize,
    _index: std::marker::PhantomData<I>,
}

impl<I: Index> Default for Pool<I> {
    fn default() -> Self {
        Pool {
            segs: Vec::new(),
            len: 0,
            _index: std::marker::PhantomData,
        }
    }
}

impl<I: Index> Pool<I> {
    /// Adds one filament (`filCreateFilament`). Consecutive indices coalesce.
    pub fn push(&mut self, index: I) {
        self.add(index.unit());
    }

    fn add(&mut self, s: Seg) {
        if s.rows.is_empty() || s.cols.is_empty() {
            return;
        }
        self.len += s.len();
        if let Some(l) = self.segs.last_mut() {
            // Same single row, adjacent columns: widen.
            if l.single_row() && s.single_row() && l.rows == s.rows && l.cols.end == s.cols.start {
                l.cols.end = s.cols.end;
                self.merge_last_two();
                return;
            }
            // Same columns, next rows: lengthen.
            if l.step == 1 && s.step == 1 && l.cols == s.cols && l.rows.end == s.rows.start {
                l.rows.end = s.rows.end;
                return;
            }
        }
        self.merge_last_two();
        self.segs.push(s);
    }

    /// A finished row segment may extend the rectangle before it.
    fn merge_last_two(&mut self) {
        let n = self.segs.len();
        if n >= 2 {
            let (a, b) = (&self.segs[n - 2], &self.segs[n - 1]);
            if a.step == 1 && b.step == 1 && a.cols == b.cols && a.rows.end == b.rows.start {
                let end = b.rows.end;
                self.segs.pop();
                self.segs[n - 2].rows.end = end;
            }
        }
    }

    /// Number of filaments in the pool.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the pool has no filaments.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Number of stored segments (what the pool costs in memory).
    pub fn segments(&self) -> usize {
        self.segs.len()
    }
    /// Removes every filament.
    pub fn clear(&mut self) {
        self.segs.clear();
        self.len = 0;
    }

    /// Runs `f` on every filament, in order. The loop is monomorphised over
    /// `f`, so a small filament is inlined into it.
    #[inline]
    pub(crate) fn for_each(&self, mut f: impl FnMut(I)) {
        for s in &self.segs {
            for i in s.rows.clone().step_by(s.step) {
                for j in s.cols.clone() {
                    f(I::at(i, j));
                }
            }
        }
    }
}

/// The filaments of one pool segment, as a phase declared with
/// [`Program::phase_with`](crate::Program::phase_with) sees them before it
/// runs them: rows `rows()` (every `step()`-th) × columns `cols()`. For a
/// 1-D pool the rows are the indices and `cols()` is `0..1`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    rows: Range<usize>,
    step: usize,
    cols: Range<usize>,
}

impl Span {
    /// The rows (1-D: the indices) the segment's filaments cover, from the
    /// first to one past the last (with a step above 1, the rows between
    /// belong to other segments).
    #[inline]
    pub fn rows(&self) -> Range<usize> {
        self.rows.clone()
    }
    /// Distance between consecutive rows (1 but for strided pools).
    #[inline]
    pub fn step(&self) -> usize {
        self.step
    }
    /// The columns (2-D pools).
    #[inline]
    pub fn cols(&self) -> Range<usize> {
        self.cols.clone()
    }
    /// The rows widened by `halo` on each side, clipped to `0..limit`: the
    /// rows a stencil of that reach reads.
    #[inline]
    pub fn rows_with_halo(&self, halo: usize, limit: usize) -> Range<usize> {
        self.rows.start.saturating_sub(halo).min(limit)..(self.rows.end + halo).min(limit)
    }
    /// Number of filaments in the segment.
    pub fn len(&self) -> usize {
        self.rows.clone().step_by(self.step).len() * self.cols.len()
    }
    /// Whether the segment has no filament.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<I: Index> Pool<I> {
    /// Runs, for each segment: `bind(span)`, then `f(index, &mut bound)` on
    /// each of its filaments, in order; the bound value is dropped at the
    /// segment's end. Monomorphised over both closures, so the filament is
    /// inlined into the loop and what `bind` returned lives in registers.
    #[inline]
    pub(crate) fn for_each_segment<V>(
        &self,
        mut bind: impl FnMut(&Span) -> V,
        mut f: impl FnMut(I, &mut V),
    ) {
        for s in &self.segs {
            // Tight: from the first row to one past the last one a filament
            // has (a strided segment's range may end past its last row).
            let n = s.rows.clone().step_by(s.step).len();
            let end = if n == 0 {
                s.rows.start
            } else {
                s.rows.start + (n - 1) * s.step + 1
            };
            let span = Span {
                rows: s.rows.start..end,
                step: s.step,
                cols: s.cols.clone(),
            };
            let mut v = bind(&span);
            for i in s.rows.clone().step_by(s.step) {
                for j in s.cols.clone() {
                    f(I::at(i, j), &mut v);
                }
            }
        }
    }
}

impl Pool<usize> {
    /// Adds filaments `range` (1-D).
    pub fn push_range(&mut self, range: Range<usize>) {
        self.add(Seg {
            rows: range,
            step: 1,
            cols: 0..1,
        });
    }
    /// Adds filaments `range.start, range.start + step, ...` (a cyclic share).
    pub fn push_strided(&mut self, range: Range<usize>, step: usize) {
        assert!(step > 0, "hyfi: push_strided needs a step of at least 1");
        self.add(Seg {
            rows: range,
            step,
            cols: 0..1,
        });
    }
}

impl Pool<(usize, usize)> {
    /// Adds filaments `(i, j)` for `i` in `rows`, `j` in `cols` (row-major).
    pub fn push_grid(&mut self, rows: Range<usize>, cols: Range<usize>) {
        self.add(Seg {
            rows,
            step: 1,
            cols,
        });
    }
}

/// The pools of one phase on this node: `pools_per_proc` pools for each
/// processor (`filCreatePoolArray`). More than one pool per processor lets a
/// processor run one pool's filaments while another pool waits for data.
#[derive(Clone, Debug)]
pub struct PoolArray<I: Index> {
    procs: usize,
    per_proc: usize,
    node: usize,
    nodes: usize,
    pools: Vec<Pool<I>>,
}

/// The `k`-th of `parts` balanced blocks of `range`.
pub fn block(range: Range<usize>, parts: usize, k: usize) -> Range<usize> {
    let n = range.len();
    let (q, r) = (n / parts, n % parts);
    let lo = range.start + k * q + k.min(r);
    let hi = lo + q + usize::from(k < r);
    lo..hi
}

impl<I: Index> PoolArray<I> {
    /// Empty pools, `pools_per_proc` (at least 1) for each processor of `rt`.
    pub fn new(rt: &Runtime, pools_per_proc: usize) -> Self {
        let per_proc = pools_per_proc.max(1);
        PoolArray {
            procs: rt.procs(),
            per_proc,
            node: rt.node(),
            nodes: rt.num_nodes(),
            pools: (0..rt.procs() * per_proc)
                .map(|_| Pool::default())
                .collect(),
        }
    }

    /// The first pool of processor `proc`.
    pub fn pool(&mut self, proc: usize) -> &mut Pool<I> {
        self.pool_k(proc, 0)
    }

    /// Pool `k` of processor `proc`.
    pub fn pool_k(&mut self, proc: usize, k: usize) -> &mut Pool<I> {
        assert!(
            proc < self.procs && k < self.per_proc,
            "hyfi: pool ({proc}, {k}) does not exist: {} processors × {} pools",
            self.procs,
            self.per_proc
        );
        &mut self.pools[proc * self.per_proc + k]
    }

    pub(crate) fn get(&self, proc: usize, k: usize) -> &Pool<I> {
        &self.pools[proc * self.per_proc + k]
    }

    /// Processors the array was made for.
    pub fn procs(&self) -> usize {
        self.procs
    }
    /// Pools per processor.
    pub fn pools_per_proc(&self) -> usize {
        self.per_proc
    }
    /// Filaments in all pools of this node.
    pub fn len(&self) -> usize {
        self.pools.iter().map(Pool::len).sum()
    }
    /// Whether no pool has a filament.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// This node's share of `range` in blocks: node, then processor, then
    /// pool (the paper's Figure 2 distribution, for any configuration).
    /// Calls `add(pool, block)` for each non-empty block.
    fn distribute_block(
        &mut self,
        range: Range<usize>,
        mut add: impl FnMut(&mut Pool<I>, Range<usize>),
    ) {
        let mine = block(range, self.nodes, self.node);
        for p in 0..self.procs {
            let of_proc = block(mine.clone(), self.procs, p);
            for k in 0..self.per_proc {
                let b = block(of_proc.clone(), self.per_proc, k);
                if !b.is_empty() {
                    add(self.pool_k(p, k), b);
                }
            }
        }
    }
}

impl PoolArray<usize> {
    /// Pools holding this node's block of `range`, split in blocks over the
    /// processors and their pools.
    pub fn block(rt: &Runtime, range: Range<usize>, pools_per_proc: usize) -> Self {
        let mut a = Self::new(rt, pools_per_proc);
        a.distribute_block(range, |p, b| p.push_range(b));
        a
    }

    /// Pools holding `range` dealt cyclically: index `i` goes to global
    /// processor `(i - start) % (nodes × procs)` (its first pool). Balances
    /// work that shrinks with the index, as in LU decomposition.
    pub fn cyclic(rt: &Runtime, range: Range<usize>) -> Self {
        let mut a = Self::new(rt, 1);
        let slots = a.nodes * a.procs;
        for p in 0..a.procs {
            let g = a.node * a.procs + p;
            if range.start + g < range.end {
                a.pool(p).push_strided(range.start + g..range.end, slots);
            }
        }
        a
    }
}

impl PoolArray<(usize, usize)> {
    /// Pools holding filaments `(i, j)` for this node's block of `rows`, every
    /// `j` in `cols`; rows split in blocks over processors and their pools.
    pub fn block_rows(
        rt: &Runtime,
        rows: Range<usize>,
        cols: Range<usize>,
        pools_per_proc: usize,
    ) -> Self {
        let mut a = Self::new(rt, pools_per_proc);
        a.distribute_block(rows, |p, b| p.push_grid(b, cols.clone()));
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect<I: Index>(p: &Pool<I>) -> Vec<I> {
        let mut v = Vec::new();
        p.for_each(|i| v.push(i));
        v
    }

    #[test]
    fn pushes_coalesce_and_keep_order() {
        let mut p = Pool::<(usize, usize)>::default();
        let mut want = Vec::new();
        for i in 3..50 {
            for j in 1..9 {
                p.push((i, j));
                want.push((i, j));
            }
        }
        assert_eq!(p.segments(), 1);
        assert_eq!(p.len(), want.len());
        assert_eq!(collect(&p), want);
    }

    #[test]
    fn irregular_pushes_are_all_kept() {
        let mut p = Pool::<(usize, usize)>::default();
        let pts = [(0, 5), (0, 6), (1, 5), (7, 7), (7, 8), (2, 2), (0, 5)];
        for &x in &pts {
            p.push(x);
        }
        assert_eq!(collect(&p), pts.to_vec());
        let mut q = Pool::<usize>::default();
        q.push_range(0..10);
        q.push(10);
        q.push_strided(20..30, 3);
        q.push(5);
        assert_eq!(
            collect(&q),
            (0..11)
                .chain([20, 23, 26, 29])
                .chain([5])
                .collect::<Vec<_>>()
        );
        assert_eq!(q.len(), 16);
    }

    #[test]
    fn blocks_cover_the_range() {
        for n in 0..40 {
            for parts in 1..7 {
                let mut all = Vec::new();
                for k in 0..parts {
                    all.extend(block(3..3 + n, parts, k));
                }
                assert_eq!(all, (3..3 + n).collect::<Vec<_>>());
            }
        }
    }
}
