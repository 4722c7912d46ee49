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
        self.row_count() * self.cols.clone().step_by(self.col_step).len() * self.depth.len()
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

    /// Number of rows that hold filaments (every `step`-th of `rows`).
    pub(super) fn row_count(&self) -> usize {
        self.rows.clone().step_by(self.step).len()
    }

    /// The segment's rows `a..b` (counted among the rows that hold
    /// filaments), with its columns and depths: running the pieces
    /// `0..m`, `m..n` in turn runs the segment.
    pub(super) fn sub_rows(&self, a: usize, b: usize) -> Seg {
        debug_assert!(a <= b && b <= self.row_count());
        let start = self.rows.start + a * self.step;
        let end = if b == a {
            start
        } else {
            self.rows.start + (b - 1) * self.step + 1
        };
        Seg {
            rows: start..end,
            step: self.step,
            cols: self.cols.clone(),
            col_step: self.col_step,
            depth: self.depth.clone(),
        }
    }

    /// The segment as [`Span`]: rows tight, from the first to one past the
    /// last row a filament has (a strided range may end past it).
    pub(super) fn span(&self) -> Span {
        let n = self.row_count();
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
    /// site: a 1-D or 2-D segment (dense or strided) is one loop nest, a
    /// 3-D one a triple nest (`I::DIMS` is a constant, so only one nest
    /// exists per index type).
    ///
    /// One call site is what lets LLVM inline a large filament: with a
    /// dense nest here and the strided ones out of line, a red-black
    /// filament was called per point from the out-of-line copy (the
    /// inliner declines a large callee with two callers), and red-black
    /// SOR ran ~2.6x its loop. Inlined here into a loop over segments whose
    /// bound values are locals (`pool::each_segment`), the filament's
    /// views and accumulators stay in registers.
    ///
    /// Columns (rows of a 1-D segment) run in unit-stride runs
    /// ([`unit_runs`]), which is what lets a per-point stencil vectorise.
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
        } else if I::DIMS == 1 {
            unit_runs(&self.rows, self.step, |i| f(I::at(i, 0, 0)));
        } else {
            for i in self.rows.clone().step_by(self.step) {
                unit_runs(&self.cols, self.col_step, |j| f(I::at(i, j, 0)));
            }
        }
    }
}

/// Calls `f(x)` for every `x` of `range` stepping by `step`, as
/// unit-stride runs from one call site: all of `range` in one run when
/// `step` is 1, else one run per `x`. In the innermost loop `x` then steps
/// by the constant 1, so LLVM can count the exits of a filament's footprint
/// checks and vectorise a stencil with no reduction as it does the slice
/// loop (a 5-point diffusion per point: 1.49x its loop with `x += step`,
/// 1.03x in runs; BENCHMARKS.md). With a variable step those exits are
/// uncountable and the loop stays scalar; with two loops, a dense one and a
/// strided one, the filament would have two call sites and not be inlined
/// (see [`Seg::each`]).
#[inline(always)]
fn unit_runs(range: &Range<usize>, step: usize, mut f: impl FnMut(usize)) {
    let mut run = range.start;
    while run < range.end {
        let run_end = if step == 1 { range.end } else { run + 1 };
        for x in run..run_end {
            f(x);
        }
        // The next run starts one step after this run's last element (none
        // past `usize::MAX`, as `step_by` stops there).
        match (run_end - 1).checked_add(step) {
            Some(next) => run = next,
            None => break,
        }
    }
}

/// The filaments of one pool segment (of the chunk a processor runs:
/// [`Config::chunks`](crate::Config::chunks)), as a phase declared with
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The filaments `each` visits, in order, against the nested `step_by`
    /// loops it replaces, for dense, strided and empty segments of every
    /// dimension, up to the end of `usize`.
    #[test]
    fn each_visits_what_the_nested_step_by_loops_visit_in_order() {
        let ranges = [
            0..0,
            3..3,
            0..1,
            2..3,
            0..7,
            1..10,
            5..6,
            usize::MAX - 5..usize::MAX,
        ];
        for rows in ranges.clone() {
            for step in 1..4 {
                for cols in ranges.clone() {
                    for col_step in 1..4 {
                        let seg = Seg::new(rows.clone(), step, cols.clone(), col_step, 0..1);
                        let mut got2 = Vec::new();
                        seg.each(|(i, j)| got2.push((i, j)));
                        let mut want2 = Vec::new();
                        for i in rows.clone().step_by(step) {
                            for j in cols.clone().step_by(col_step) {
                                want2.push((i, j));
                            }
                        }
                        assert_eq!(got2, want2, "2-D {rows:?}/{step} × {cols:?}/{col_step}");
                        let seg3 = Seg::new(rows.clone(), step, cols.clone(), col_step, 4..6);
                        let mut got3 = Vec::new();
                        seg3.each(|(i, j, k)| got3.push((i, j, k)));
                        let want3: Vec<_> = want2
                            .iter()
                            .flat_map(|&(i, j)| (4..6).map(move |k| (i, j, k)))
                            .collect();
                        assert_eq!(got3, want3, "3-D {rows:?}/{step} × {cols:?}/{col_step}");
                    }
                }
                let seg1 = Seg::new(rows.clone(), step, 0..1, 1, 0..1);
                let mut got1 = Vec::new();
                seg1.each(|i: usize| got1.push(i));
                let want1: Vec<usize> = rows.clone().step_by(step).collect();
                assert_eq!(got1, want1, "1-D {rows:?}/{step}");
            }
        }
    }
}
