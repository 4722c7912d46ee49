//! Segments: how a pool stores its filaments, and the index types a
//! filament gets.
//!
//! A segment is a box of the index space: rows `i` (every `step`-th) ×
//! columns `j` (every `col_step`-th) × depths `k`, run in row-major order.
//! 1-D pools use only the rows, 2-D pools rows and columns, 3-D pools all
//! three. Pushing filaments one by one extends the last segment whenever
//! the new ones continue it in order, so a loop of pushes costs a few
//! segments, also for strided orderings such as red-black.
//!
//! Plain data with no dependency in the crate: `crate::pool` stores
//! segments, and the configuration splits CPUs with [`block`].

use std::ops::Range;

mod sealed {
    pub trait Sealed {}
    impl Sealed for usize {}
    impl Sealed for (usize, usize) {}
    impl Sealed for (usize, usize, usize) {}
}

/// The argument of an iterative filament: a 1-D index `usize`, a 2-D index
/// `(i, j)` or a 3-D index `(i, j, k)`. Filaments needing other data
/// compute it from the index.
pub trait Index: Copy + Send + Sync + 'static + sealed::Sealed {
    /// Number of dimensions (1, 2 or 3).
    #[doc(hidden)]
    const DIMS: usize;
    #[doc(hidden)]
    fn at(i: usize, j: usize, k: usize) -> Self;
    #[doc(hidden)]
    fn unit(self) -> Seg;
}

impl Index for usize {
    const DIMS: usize = 1;
    #[inline(always)]
    fn at(i: usize, _j: usize, _k: usize) -> Self {
        i
    }
    fn unit(self) -> Seg {
        Seg::new(self..self + 1, 1, 0..1, 1, 0..1)
    }
}

impl Index for (usize, usize) {
    const DIMS: usize = 2;
    #[inline(always)]
    fn at(i: usize, j: usize, _k: usize) -> Self {
        (i, j)
    }
    fn unit(self) -> Seg {
        Seg::new(self.0..self.0 + 1, 1, self.1..self.1 + 1, 1, 0..1)
    }
}

impl Index for (usize, usize, usize) {
    const DIMS: usize = 3;
    #[inline(always)]
    fn at(i: usize, j: usize, k: usize) -> Self {
        (i, j, k)
    }
    fn unit(self) -> Seg {
        Seg::new(
            self.0..self.0 + 1,
            1,
            self.1..self.1 + 1,
            1,
            self.2..self.2 + 1,
        )
    }
}

/// A box of filaments: rows `rows` (every `step`-th) × columns `cols`
/// (every `col_step`-th) × depths `depth`.
///
/// Kept normal (see [`Seg::new`]): `cols` ends one past its last column,
/// and a single column has `col_step` 1, so equal column sets compare equal.
#[doc(hidden)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seg {
    pub(super) rows: Range<usize>,
    pub(super) step: usize,
    pub(super) cols: Range<usize>,
    pub(super) col_step: usize,
    pub(super) depth: Range<usize>,
}

impl Seg {
    pub(super) fn new(
        rows: Range<usize>,
        step: usize,
        cols: Range<usize>,
        col_step: usize,
        depth: Range<usize>,
    ) -> Seg {
        assert!(
            step > 0 && col_step > 0,
            "hyfi: a pool's row and column steps must be at least 1"
        );
        let n = cols.clone().step_by(col_step).len();
        let (cols, col_step) = match n {
            0 => (cols.start..cols.start, 1),
            1 => (cols.start..cols.start + 1, 1),
            n => (cols.start..cols.start + (n - 1) * col_step + 1, col_step),
        };
        Seg {
            rows,
            step,
            cols,
            col_step,
            depth,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.rows.is_empty() || self.cols.is_empty() || self.depth.is_empty()
    }

    pub(super) fn len(&self) -> usize {
        self.rows.clone().step_by(self.step).len()
            * self.cols.clone().step_by(self.col_step).len()
            * self.depth.len()
    }

    fn one_row(&self) -> bool {
        self.rows.len() == 1
    }

    /// Extends `self` by `b` if running `self` then `b` is running the
    /// extended segment: the order of the filaments is kept.
    pub(super) fn absorb(&mut self, b: &Seg) -> bool {
        let a = self;
        let same_point_row = a.one_row() && b.one_row() && a.rows == b.rows;
        // Same (i, j), next depths.
        if same_point_row && a.cols.len() == 1 && a.cols == b.cols && a.depth.end == b.depth.start {
            a.depth.end = b.depth.end;
            return true;
        }
        // Same row and depths, next columns at the same column step (two
        // single columns set the step: red-black pushes coalesce).
        if same_point_row && a.depth == b.depth && b.cols.start >= a.cols.end {
            let gap = b.cols.start - (a.cols.end - 1);
            let step = match (a.cols.len() == 1, b.cols.len() == 1) {
                (true, true) => gap,
                (true, false) => b.col_step,
                (false, true) => a.col_step,
                (false, false) if a.col_step == b.col_step => a.col_step,
                (false, false) => 0,
            };
            if gap == step {
                a.cols.end = b.cols.end;
                a.col_step = step;
                return true;
            }
        }
        // Same columns and depths, next rows.
        if a.step == 1
            && b.step == 1
            && a.cols == b.cols
            && a.col_step == b.col_step
            && a.depth == b.depth
            && a.rows.end == b.rows.start
        {
            a.rows.end = b.rows.end;
            return true;
        }
        false
    }

    /// The segment as [`Span`]: rows tight, from the first to one past the
    /// last row a filament has (a strided range may end past it).
    pub(super) fn span(&self) -> Span {
        let n = self.rows.clone().step_by(self.step).len();
        let end = if n == 0 {
            self.rows.start
        } else {
            self.rows.start + (n - 1) * self.step + 1
        };
        Span {
            rows: self.rows.start..end,
            step: self.step,
            cols: self.cols.clone(),
            col_step: self.col_step,
            depth: self.depth.clone(),
        }
    }

    /// Runs `f` on every filament of the segment, in order, from one call
    /// site: a 1-D or 2-D segment (dense or column-strided) is one loop
    /// nest whose column step is a variable, a 3-D one (`I::DIMS` is a
    /// constant, so only one of the two nests exists per index type) a
    /// triple nest.
    ///
    /// One call site is what lets LLVM inline a large filament: with a
    /// dense nest here and the strided ones out of line, a red-black
    /// filament was called per point from the out-of-line copy (the
    /// inliner declines a large callee with two callers), and red-black
    /// SOR ran ~2.6x its loop. Inlined here into a loop over segments whose
    /// bound values are locals (`Pool::for_each_segment`), the filament's
    /// views and accumulators stay in registers.
    #[inline(always)]
    pub(super) fn each<I: Index>(&self, mut f: impl FnMut(I)) {
        if I::DIMS == 3 {
            for i in self.rows.clone().step_by(self.step) {
                for j in self.cols.clone().step_by(self.col_step) {
                    for k in self.depth.clone() {
                        f(I::at(i, j, k));
                    }
                }
            }
        } else {
            let (first, end, step) = (self.cols.start, self.cols.end, self.col_step);
            for i in self.rows.clone().step_by(self.step) {
                let mut j = first;
                while j < end {
                    f(I::at(i, j, 0));
                    j += step;
                }
            }
        }
    }
}

/// The filaments of one pool segment, as a phase declared with
/// [`Program::phase_with`](crate::Program::phase_with) sees them before it
/// runs them: rows `rows()` (every `step()`-th) × columns `cols()` (every
/// `col_step()`-th) × depths `depth()`. For a 1-D pool the rows are the
/// indices and `cols()` is `0..1`; for 1-D and 2-D pools `depth()` is `0..1`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    rows: Range<usize>,
    step: usize,
    cols: Range<usize>,
    col_step: usize,
    depth: Range<usize>,
}

impl Span {
    /// The rows (1-D: the indices; 3-D: the first index `i`) the segment's
    /// filaments cover, from the first to one past the last (with a step
    /// above 1, the rows between belong to other segments).
    #[inline]
    pub fn rows(&self) -> Range<usize> {
        self.rows.clone()
    }
    /// Distance between consecutive rows (1 but for strided pools).
    #[inline]
    pub fn step(&self) -> usize {
        self.step
    }
    /// The columns (2-D and 3-D pools: the index `j`), from the first to
    /// one past the last.
    #[inline]
    pub fn cols(&self) -> Range<usize> {
        self.cols.clone()
    }
    /// Distance between consecutive columns: 1 but for strided 2-D pools
    /// (2 for a red-black row, see
    /// [`Pool::push_red_black`](crate::Pool::push_red_black)).
    #[inline]
    pub fn col_step(&self) -> usize {
        self.col_step
    }
    /// The depths (3-D pools: the index `k`; `0..1` otherwise).
    #[inline]
    pub fn depth(&self) -> Range<usize> {
        self.depth.clone()
    }
    /// The rows widened by `halo` on each side, clipped to `0..limit`: the
    /// rows a stencil of that reach reads.
    #[inline]
    pub fn rows_with_halo(&self, halo: usize, limit: usize) -> Range<usize> {
        self.rows.start.saturating_sub(halo).min(limit)..(self.rows.end + halo).min(limit)
    }
    /// Number of filaments in the segment.
    pub fn len(&self) -> usize {
        self.rows.clone().step_by(self.step).len()
            * self.cols.clone().step_by(self.col_step).len()
            * self.depth.len()
    }
    /// Whether the segment has no filament.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The `k`-th of `parts` balanced blocks of `range`.
pub fn block(range: Range<usize>, parts: usize, k: usize) -> Range<usize> {
    let n = range.len();
    let (q, r) = (n / parts, n % parts);
    let lo = range.start + k * q + k.min(r);
    let hi = lo + q + usize::from(k < r);
    lo..hi
}
