//! Pools: groups of iterative filaments with spatial locality, one or more
//! per processor (paper §2).
//!
//! A pool stores *segments* of a 1-D, 2-D or 3-D index space (the
//! filament gets `i`, `(i, j)` or `(i, j, k)`), never one descriptor per
//! filament: `push` in a loop, as the paper's `filCreateFilament`,
//! coalesces indices that continue each other into ranges (also evenly
//! spaced columns of a row, as in a red-black ordering), and `push_range` /
//! `push_grid` / `push_red_black` / `push_box` add a whole range at once.
//! Filling a pool with a million points costs a few segments.
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

// Segments and the block distribution are plain data (a leaf module), which
// the configuration's CPU shares use too.
pub use crate::seg::{block, Index, Seg, Span};

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
    /// Adds one filament (`filCreateFilament`). Indices that continue the
    /// last ones in order coalesce: consecutive ones, and evenly spaced
    /// columns of one row (a red-black row is one segment).
    pub fn push(&mut self, index: I) {
        self.add(index.unit());
    }

    fn add(&mut self, s: Seg) {
        if s.is_empty() {
            return;
        }
        self.len += s.len();
        if let Some(l) = self.segs.last_mut() {
            if l.absorb(&s) {
                // The widened segment may now continue the one before it
                // (a finished row extends the rectangle above it).
                while let [.., a, b] = &mut self.segs[..] {
                    if !a.absorb(b) {
                        break;
                    }
                    self.segs.pop();
                }
                return;
            }
        }
        self.segs.push(s);
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

    /// The pool's segments, in order.
    pub(crate) fn segs(&self) -> &[Seg] {
        &self.segs
    }
}

/// Runs `f` on every filament of segments `segs` (a pool's, or a
/// chunk's), in order. The loop is monomorphised over `f`, so a small
/// filament is inlined into it; `#[inline(always)]`, as `each_segment`.
#[inline(always)]
pub(crate) fn each_filament<I: Index>(segs: &[Seg], mut f: impl FnMut(I)) {
    for s in segs {
        s.each(&mut f);
    }
}

/// Runs, for each of segments `segs` (a pool's, or a chunk's):
/// `bind(span)`, then `f(index, &mut bound)` on each of its filaments, in
/// order; the bound value is dropped at the segment's end. Monomorphised
/// over both closures, and `f` called from one loop nest ([`Seg::each`]),
/// so the filament is inlined into the loop and what `bind` returned lives
/// in registers: `v` is a local of this loop whose address never leaves it
/// (measured: with `&mut v` passed to an out-of-line loop, per-point
/// Jacobi kept its accumulator and views on the stack and ran 2-3x
/// slower). `#[inline(always)]`: with `#[inline]` only, red-black SOR on
/// 1×1 ran 15 % slower in the phase's `run_chunk` (the hot loop held the
/// same operations in other registers and order; why LLVM chose so was
/// not pinned down; BENCHMARKS.md).
#[inline(always)]
pub(crate) fn each_segment<I: Index, V>(
    segs: &[Seg],
    mut bind: impl FnMut(&Span) -> V,
    mut f: impl FnMut(I, &mut V),
) {
    for s in segs {
        let mut v = bind(&s.span());
        s.each(|i| f(i, &mut v));
    }
}

impl Pool<usize> {
    /// Adds filaments `range` (1-D).
    pub fn push_range(&mut self, range: Range<usize>) {
        self.add(Seg::new(range, 1, 0..1, 1, 0..1));
    }
    /// Adds filaments `range.start, range.start + step, ...` (a cyclic share).
    pub fn push_strided(&mut self, range: Range<usize>, step: usize) {
        assert!(step > 0, "hyfi: push_strided needs a step of at least 1");
        self.add(Seg::new(range, step, 0..1, 1, 0..1));
    }
}

impl Pool<(usize, usize)> {
    /// Adds filaments `(i, j)` for `i` in `rows`, `j` in `cols` (row-major).
    pub fn push_grid(&mut self, rows: Range<usize>, cols: Range<usize>) {
        self.add(Seg::new(rows, 1, cols, 1, 0..1));
    }

    /// Adds the filaments `(i, j)` of `rows` × `cols` with
    /// `(i + j) % 2 == colour % 2`, row by row: one segment per row, its
    /// columns two apart, so a red-black sweep's filaments cost what the
    /// dense pool's do.
    ///
    /// ```
    /// use hyfi::Pool;
    /// let mut red = Pool::<(usize, usize)>::default();
    /// red.push_red_black(1..4, 1..6, 0);
    /// assert_eq!(red.segments(), 3);
    /// assert_eq!(red.len(), 3 + 2 + 3); // (1,1) (1,3) (1,5), (2,2) (2,4), ...
    /// ```
    pub fn push_red_black(&mut self, rows: Range<usize>, cols: Range<usize>, colour: usize) {
        for i in rows {
            // The first column of the colour in this row.
            let first = cols.start + (colour + i + cols.start) % 2;
            if first < cols.end {
                self.add(Seg::new(i..i + 1, 1, first..cols.end, 2, 0..1));
            }
        }
    }
}

impl Pool<(usize, usize, usize)> {
    /// Adds filaments `(i, j, k)` for `i` in `is`, `j` in `js`, `k` in `ks`
    /// (`k` fastest).
    pub fn push_box(&mut self, is: Range<usize>, js: Range<usize>, ks: Range<usize>) {
        self.add(Seg::new(is, 1, js, 1, ks));
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
    /// Chunks per pool for within-node balancing (`Config::chunks`).
    chunks: usize,
    pools: Vec<Pool<I>>,
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
            chunks: rt.chunks(),
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

    /// Every pool, processor by processor, each in pool order.
    pub(crate) fn all(&self) -> &[Pool<I>] {
        &self.pools
    }

    /// Chunks each pool is cut into, at most (`Config::chunks`).
    pub(crate) fn chunks(&self) -> usize {
        self.chunks
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

    /// Pools holding the filaments `(i, j)` of colour `colour` (0 red, 1
    /// black: `(i + j) % 2 == colour`) of `rows` × `cols`, rows placed as
    /// [`PoolArray::block_rows`] places them. Each row is one segment
    /// ([`Pool::push_red_black`]), so the two phases of a red-black sweep
    /// cost per point what one dense phase does.
    ///
    /// ```
    /// use hyfi::{Config, PoolArray, Runtime};
    /// let rt = Runtime::new(Config::new().procs(2).pin(false)).unwrap();
    /// let red = PoolArray::block_rows_red_black(&rt, 1..9, 1..9, 0, 1);
    /// let black = PoolArray::block_rows_red_black(&rt, 1..9, 1..9, 1, 1);
    /// assert_eq!(red.len() + black.len(), 64);
    /// ```
    pub fn block_rows_red_black(
        rt: &Runtime,
        rows: Range<usize>,
        cols: Range<usize>,
        colour: usize,
        pools_per_proc: usize,
    ) -> Self {
        let mut a = Self::new(rt, pools_per_proc);
        a.distribute_block(rows, |p, b| p.push_red_black(b, cols.clone(), colour));
        a
    }
}

impl PoolArray<(usize, usize, usize)> {
    /// Pools holding filaments `(i, j, k)` for this node's block of `is`
    /// (the outer index: planes), every `j` in `js` and `k` in `ks`; the
    /// planes split in blocks over processors and their pools, as
    /// [`PoolArray::block_rows`] splits rows.
    ///
    /// ```
    /// use hyfi::{Config, PoolArray, Runtime};
    /// let rt = Runtime::new(Config::new().procs(2).pin(false)).unwrap();
    /// let mut pools = PoolArray::block_planes(&rt, 1..5, 1..5, 1..5, 2);
    /// assert_eq!(pools.len(), 64);
    /// assert_eq!(pools.pool_k(1, 1).segments(), 1); // plane 4: (4, 1..5, 1..5)
    /// ```
    pub fn block_planes(
        rt: &Runtime,
        is: Range<usize>,
        js: Range<usize>,
        ks: Range<usize>,
        pools_per_proc: usize,
    ) -> Self {
        let mut a = Self::new(rt, pools_per_proc);
        a.distribute_block(is, |p, b| p.push_box(b, js.clone(), ks.clone()));
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect<I: Index>(p: &Pool<I>) -> Vec<I> {
        let mut v = Vec::new();
        each_filament(p.segs(), |i| v.push(i));
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

    #[test]
    fn red_black_rows_are_one_segment_each_and_pushes_coalesce_the_same() {
        for colour in 0..2 {
            for (rows, cols) in [(1..9, 1..9), (0..5, 0..1), (2..7, 3..4), (0..6, 0..7)] {
                let want: Vec<(usize, usize)> = rows
                    .clone()
                    .flat_map(|i| cols.clone().map(move |j| (i, j)))
                    .filter(|&(i, j)| (i + j) % 2 == colour)
                    .collect();
                let mut p = Pool::<(usize, usize)>::default();
                p.push_red_black(rows.clone(), cols.clone(), colour);
                assert_eq!(collect(&p), want, "{rows:?} {cols:?} colour {colour}");
                assert_eq!(p.len(), want.len());
                let nonempty_rows = rows
                    .clone()
                    .filter(|&i| want.iter().any(|&(r, _)| r == i))
                    .count();
                // A row with one point may merge with the next one-point row
                // only when they are the same column: never for red-black.
                assert_eq!(p.segments(), nonempty_rows);
                // The same points pushed one by one coalesce alike.
                let mut q = Pool::<(usize, usize)>::default();
                for &x in &want {
                    q.push(x);
                }
                assert_eq!(collect(&q), want);
                assert_eq!(q.segments(), p.segments());
            }
        }
    }

    #[test]
    fn spans_of_strided_rows_are_tight() {
        let mut p = Pool::<(usize, usize)>::default();
        p.push_red_black(3..5, 0..10, 1);
        let mut spans = Vec::new();
        let mut seen = Vec::new();
        each_segment(
            p.segs(),
            |s| {
                spans.push((s.rows(), s.cols(), s.col_step(), s.len()));
            },
            |ij: (usize, usize), _| seen.push(ij),
        );
        assert_eq!(spans, vec![(3..4, 0..9, 2, 5), (4..5, 1..10, 2, 5)]);
        assert_eq!(seen, collect(&p));
    }

    #[test]
    fn three_d_pushes_coalesce_and_keep_order() {
        let mut p = Pool::<(usize, usize, usize)>::default();
        let mut want = Vec::new();
        for i in 2..6 {
            for j in 1..4 {
                for k in 0..5 {
                    p.push((i, j, k));
                    want.push((i, j, k));
                }
            }
        }
        assert_eq!(p.segments(), 1);
        assert_eq!(collect(&p), want);
        let mut b = Pool::<(usize, usize, usize)>::default();
        b.push_box(2..6, 1..4, 0..5);
        assert_eq!(collect(&b), want);
        let mut spans = Vec::new();
        each_segment(
            b.segs(),
            |s| spans.push((s.rows(), s.cols(), s.depth(), s.len())),
            |_: (usize, usize, usize), _| {},
        );
        assert_eq!(spans, vec![(2..6, 1..4, 0..5, 60)]);
        // Irregular 3-D pushes are all kept, in order.
        let mut q = Pool::<(usize, usize, usize)>::default();
        let pts = [
            (0, 0, 0),
            (0, 0, 1),
            (0, 2, 0),
            (0, 2, 1),
            (1, 0, 0),
            (0, 0, 0),
            (0, 0, 2),
        ];
        for &x in &pts {
            q.push(x);
        }
        assert_eq!(collect(&q), pts.to_vec());
        assert_eq!(q.len(), pts.len());
    }
}
