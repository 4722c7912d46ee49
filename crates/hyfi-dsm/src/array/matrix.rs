//! [`DsmMatrix`]: a shared matrix (rows optionally padded to pages), its
//! checked accessors and its views.

use std::marker::PhantomData;
use std::ops::Range;
use std::sync::Arc;

use bytemuck::Pod;
use hyfi_core::layer::{Payload, ProgramExt};
use hyfi_core::{Ctx, PostPhase, Program, Reduction};

use super::*;
use crate::core::CARRY_HEADER;
use crate::footprint::{ReadRows, WriteRows};

/// A shared matrix: `rows × cols` elements in row-major order (each row
/// optionally padded to whole pages), spread over the nodes' pages.
///
/// Made collectively with [`crate::Dsm::matrix`].
pub struct DsmMatrix<T: Pod> {
    fast: Fast<T>,
    rows: usize,
    cols: usize,
    stride: usize,
    sh: Arc<Shared<T>>,
}

// SAFETY: as for DsmVec.
unsafe impl<T: Pod + Send + Sync> Send for DsmMatrix<T> {}
// SAFETY: as for DsmVec.
unsafe impl<T: Pod + Send + Sync> Sync for DsmMatrix<T> {}

impl<T: Pod> Clone for DsmMatrix<T> {
    fn clone(&self) -> Self {
        DsmMatrix {
            fast: self.fast,
            rows: self.rows,
            cols: self.cols,
            stride: self.stride,
            sh: self.sh.clone(),
        }
    }
}

impl<T: Pod> DsmMatrix<T> {
    pub(crate) fn new(sh: Arc<Shared<T>>, rows: usize, cols: usize, stride: usize) -> Self {
        DsmMatrix {
            fast: Fast::of(&sh),
            rows,
            cols,
            stride,
            sh,
        }
    }
    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Columns.
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// Elements from one row's start to the next (≥ `cols`; more if rows
    /// are padded to pages, or a little more where blocks are aligned to
    /// pages: see [`MatrixAlloc::align_blocks`](crate::MatrixAlloc::align_blocks)).
    pub fn stride(&self) -> usize {
        self.stride
    }
    #[inline(always)]
    fn check(&self, i: usize, j: usize) {
        if i >= self.rows || j >= self.cols {
            matrix_oob(i, j, self.rows, self.cols);
        }
    }
    fn check_row(&self, i: usize) {
        if i >= self.rows {
            out_of_bounds("matrix row", i.to_string(), format!("{} rows", self.rows));
        }
    }
    /// Element `(i, j)` (fetched first if its page is not here).
    #[inline]
    pub fn get(&self, i: usize, j: usize) -> T {
        self.check(i, j);
        self.fast.load(&self.sh, i * self.stride + j)
    }
    /// Sets element `(i, j)`.
    #[inline]
    pub fn set(&self, i: usize, j: usize, v: T) {
        self.check(i, j);
        self.fast.store(&self.sh, i * self.stride + j, v)
    }
    /// A read view of row `i`, for the filament owning `ctx`.
    pub fn row<'a>(&'a self, _ctx: &'a Ctx, i: usize) -> View<'a, T> {
        self.check_row(i);
        if self.cols > 0 {
            self.sh.check_read(i * self.stride, self.cols);
        }
        View {
            ptr: self.sh.base.wrapping_add(i * self.stride),
            len: self.cols,
            _life: PhantomData,
        }
    }
    /// A writable view of row `i`, for the filament owning `ctx`.
    pub fn row_mut<'a>(&'a self, _ctx: &'a Ctx, i: usize) -> ViewMut<'a, T> {
        self.check_row(i);
        if self.cols > 0 {
            self.sh.check_write(i * self.stride, self.cols);
        }
        ViewMut::new(self.sh.base.wrapping_add(i * self.stride), self.cols)
    }
    /// A read view of rows `r`, for the filament owning `ctx`: every
    /// missing page of the block is requested at once.
    pub fn rows_view<'a>(&'a self, _ctx: &'a Ctx, r: Range<usize>) -> MatrixView<'a, T> {
        self.check_rows(&r);
        self.sh.validate_rows(&r, self.cols, self.stride);
        MatrixView {
            ptr: self.sh.base.wrapping_add(r.start * self.stride),
            rows: r,
            cols: self.cols,
            stride: self.stride,
            _life: PhantomData,
        }
    }
    /// The rows `r` as a read-only view of plain memory, for the filaments
    /// of one pool segment (take it in `Program::phase_with`'s bind): every
    /// missing page of the rows is fetched at once first. The array becomes
    /// read-only on this node for the rest of the phase: a write to it
    /// panics, as does a read view of an array already written in the
    /// phase (see the footprint module's docs for why that makes plain
    /// reads sound).
    ///
    /// ```
    /// use hyfi::{Config, Control, Op, PoolArray, Program, Runtime};
    /// let rt = Runtime::new(Config::new().procs(2).pin(false))?;
    /// let dsm = hyfi::Dsm::new(&rt)?;
    /// let n = 64;
    /// let a = dsm.matrix::<f64>(n, n).from_fn(|i, j| (i * n + j) as f64)?;
    /// let b = dsm.matrix::<f64>(n, n).zeroed()?;
    /// let total = rt.reduction(0.0f64);
    /// let mut sum = 0.0;
    /// let mut prog = Program::new();
    /// prog.phase_with(
    ///     // One filament per interior point: b = the 4-neighbour average of a.
    ///     PoolArray::block_rows(&rt, 1..n - 1, 1..n - 1, 1),
    ///     |ctx, span| (a.read_rows(ctx, span.rows_with_halo(1, n)), b.write_rows(ctx, span.rows()), total.local(ctx, Op::Sum)),
    ///     |_ctx, (i, j), (a, b, total)| {
    ///         let v = (a[(i - 1, j)] + a[(i + 1, j)] + a[(i, j - 1)] + a[(i, j + 1)]) * 0.25;
    ///         b.set(i, j, v);
    ///         total.fold(v);
    ///     },
    ///     |post| { sum = post.reduce(&total, Op::Sum); Control::Done },
    /// );
    /// rt.start(&mut prog)?;
    /// drop(prog);
    /// // Each average of a linear function is the point's own value.
    /// assert_eq!(b.get(5, 7), a.get(5, 7));
    /// let want: f64 = (1..n - 1).flat_map(|i| (1..n - 1).map(move |j| (i * n + j) as f64)).sum();
    /// assert!((sum - want).abs() < 1e-6 * want);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[track_caller]
    pub fn read_rows<'a>(&'a self, ctx: &Ctx, r: Range<usize>) -> ReadRows<'a, T> {
        ReadRows::new(self.rows_frame(ctx, r, false))
    }

    /// The rows `r` as a write view, for the filaments of one pool segment:
    /// every page of the rows is made writable here at once (fetched if
    /// missing, twins taken), and the array is marked written in this
    /// phase (a read view of it then panics).
    ///
    /// **Write what this node homes.** A page homed on another node costs
    /// a fetch when the view is taken (even where the phase overwrites it
    /// whole), a diff to its home at the release, and the home's pushes
    /// of it back while this node holds a copy. Data that moves between
    /// nodes moves most cheaply as reads: a phase in which each node
    /// writes its own pages and a later one in which each reads from the
    /// others what it needs (a user's bucket sort, each node writing its
    /// keys into the other's buckets, moved five times the bytes that had
    /// to move and took 2.1× `sort_unstable`'s time on 2×1; each node
    /// reading its buckets' keys from the others moved what had to move
    /// and took 0.8×: BENCHMARKS.md).
    #[track_caller]
    pub fn write_rows<'a>(&'a self, ctx: &Ctx, r: Range<usize>) -> WriteRows<'a, T> {
        WriteRows::new(self.rows_frame(ctx, r, true), self.sh.lender())
    }

    #[track_caller]
    fn rows_frame(&self, ctx: &Ctx, r: Range<usize>, write: bool) -> Frame {
        self.check_rows(&r);
        self.sh.frame(
            ctx,
            r,
            self.cols,
            self.stride,
            0,
            write,
            std::panic::Location::caller(),
        )
    }

    fn check_rows(&self, r: &Range<usize>) {
        if r.start > r.end || r.end > self.rows {
            out_of_bounds(
                "matrix rows",
                format!("{r:?}"),
                format!("{} rows", self.rows),
            );
        }
    }

    /// Sends rows `r` to every node now, from their homes, because every
    /// node will read them in the next phase: LU's pivot row, a
    /// coefficient row a solver's filaments all use. Call it in post-phase
    /// code, on every node alike (SPMD); a node sends the pages it is home
    /// to and does nothing for the others.
    ///
    /// Without it each node requests the rows when a filament first reads
    /// them, from a home that is computing its own rows by then: the
    /// request waits until the home's communication thread gets a CPU (on
    /// `mpirun`'s one core per rank, tens of µs). A broadcast leaves
    /// before the phase starts and travels along a binomial tree rooted at
    /// the home (about ⌈log₂ N⌉ forwarding steps, one page message per
    /// edge), so readers usually find the rows here. A filament that reads
    /// a row before it comes requests it (and waits for whichever comes
    /// first); code outside the filaments, such as post-phase code that
    /// copies the row right after naming it, waits for the broadcast (for
    /// at most 500 µs, then requests it). The bytes are the same either
    /// way, so results do not depend on it.
    /// The receivers join the rows' copy sets: if the home writes the rows
    /// later, its release pushes them, and nodes that no longer read them
    /// decline. Counted in [`DsmCounters`](crate::DsmCounters)'
    /// `pages_broadcast` and `broadcasts_installed`.
    ///
    /// ```
    /// use hyfi::{Config, Control, PoolArray, Program, Runtime};
    /// use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    /// let rt = Runtime::new(Config::new().procs(2).pin(false))?;
    /// let dsm = hyfi::Dsm::new(&rt)?;
    /// let n = 64;
    /// // Each step scales every row by its entry in the step's key row.
    /// let a = dsm.matrix::<f64>(n, n).pad_rows().from_fn(|i, j| 1.0 + (i + j) as f64)?;
    /// let key = AtomicUsize::new(0);
    /// let mut prog = Program::new();
    /// prog.phase_with(
    ///     PoolArray::cyclic(&rt, 0..n),
    ///     |ctx, _span| {
    ///         let mut k = vec![0.0; n];
    ///         a.row(ctx, key.load(Relaxed)).copy_range_to(0, &mut k);
    ///         k
    ///     },
    ///     |ctx, i, k| {
    ///         if i != key.load(Relaxed) {
    ///             a.row_mut(ctx, i).set(0, k[i % n] * 0.5);
    ///         }
    ///     },
    ///     |post| {
    ///         if post.iteration() == 3 {
    ///             return Control::Done;
    ///         }
    ///         let next = (post.iteration() as usize + 1) * 7 % n;
    ///         key.store(next, Relaxed);
    ///         // Every node reads row `next` in the next phase.
    ///         a.broadcast_rows(post, next..next + 1);
    ///         Control::Continue
    ///     },
    /// );
    /// rt.start(&mut prog)?;
    /// drop(prog);
    /// // The last step's key row was 21: row 1 took half its entry 1.
    /// assert_eq!(a.get(1, 0), 0.5 * (1.0 + 21.0 + 1.0));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn broadcast_rows(&self, _post: &PostPhase<'_>, r: Range<usize>) {
        self.check_rows(&r);
        self.sh.broadcast_rows(&r, self.cols, self.stride);
    }

    /// Copies row `i` into `out` (`cols` long), fetching its pages from
    /// their home if this node holds no valid copy.
    ///
    /// **A row every node reads after each phase** (the next pivot row of
    /// an elimination, a row the next phase's filaments all use) costs a
    /// fetch round trip per node and phase when read so in post-phase
    /// code, on the step's critical path: Gaussian elimination without
    /// pivoting, n = 512 on 2 nodes, ran at 2.0× its sequential loop's
    /// time. Name it with [`broadcast_rows`](Self::broadcast_rows) on
    /// every node first: its home sends it at once, and this read waits
    /// for it instead of requesting it (1.0× at n = 512, 0.6× at 1 024
    /// against 1.0×). Where a reduction chooses the row, carry it with
    /// [`reduce_at_end_with_row`](Self::reduce_at_end_with_row): it then
    /// rides in the release that ends the phase (LU). AMD EPYC VM,
    /// 2026-11-27.
    pub fn read_row(&self, i: usize, out: &mut [T]) {
        self.check_row(i);
        assert_eq!(out.len(), self.cols, "hyfi-dsm: read_row length mismatch");
        self.sh.read_into(i * self.stride, out)
    }
    /// Writes `src` (`cols` long) into row `i`.
    pub fn write_row(&self, i: usize, src: &[T]) {
        self.check_row(i);
        assert_eq!(src.len(), self.cols, "hyfi-dsm: write_row length mismatch");
        self.sh.write_from(i * self.stride, src)
    }
    /// The whole matrix, row-major without padding (fetching what is not
    /// here: all missing pages at once).
    pub fn to_vec(&self) -> Vec<T> {
        if self.rows > 0 && self.cols > 0 {
            self.sh
                .check_read(0, (self.rows - 1) * self.stride + self.cols);
        }
        let mut v = vec![T::zeroed(); self.rows * self.cols];
        for (i, row) in v.chunks_mut(self.cols.max(1)).enumerate().take(self.rows) {
            self.sh.read_into(i * self.stride, row);
        }
        v
    }
    /// The home node of the page holding element `(i, j)`'s first byte.
    pub fn home_of(&self, i: usize, j: usize) -> usize {
        self.check(i, j);
        self.sh.home_of(i * self.stride + j)
    }
    /// The home node of row `i`'s first page.
    pub fn home_of_row(&self, i: usize) -> usize {
        self.check_row(i);
        self.sh.home_of(i * self.stride)
    }

    /// Reduces `r` with `combine` at the end of the phase `prog` appended
    /// last, as [`Program::reduce_at_end_with`] does, and sends every node
    /// the row the result names, `row_of(&result)`, in the same
    /// collective: LU's pivot search and pivot row in one exchange per
    /// step, where [`broadcast_rows`](DsmMatrix::broadcast_rows) in the
    /// post-phase code sends the row after the reduction.
    ///
    /// How: each node offers, with its value, the row its own value names
    /// if it is that row's home; where two values combine, the row of the
    /// one the result equals goes on (so `combine` must return one of its
    /// inputs: a maximum, an argmax); after the phase's release every node
    /// installs the result's row, and its home records that every node
    /// holds it (its next write goes to them, as for served pages). Each
    /// node carries one row's bytes in the collective. The next phase then
    /// reads the row without a fault. Nothing is installed, on any node,
    /// if the row's home did not offer it (the node whose value won is not
    /// its home) or another node wrote the row in the phase: it is then
    /// fetched when read, as without this call. Counted in
    /// `pages_carried`.
    ///
    /// **Memory.** Every row a result names ends up on every node, so for
    /// a matrix of at most 16 MiB the call maps, on each node of several,
    /// the pages it does not home right away (as zeros, never read as
    /// data), rather than at each install, where a first-touch fault per
    /// page lay on a short step's critical path: a full replica per node
    /// from the call on, which a factorization reaches by its end anyway.
    /// Larger matrices fault page by page as rows come (their steps are
    /// long, and a resident cold replica slowed them).
    ///
    /// # Panics
    /// If the matrix's rows are not padded to pages
    /// ([`MatrixAlloc::pad_rows`](crate::MatrixAlloc::pad_rows)), or the
    /// program has no phase yet.
    ///
    /// ```
    /// use hyfi::{Config, Control, Dsm, Placement, PoolArray, Program, Runtime};
    /// use bytemuck::{Pod, Zeroable};
    ///
    /// #[repr(C)]
    /// #[derive(Clone, Copy, Pod, Zeroable)]
    /// struct Top { value: f64, row: u64 }
    /// fn larger(a: Top, b: Top) -> Top {
    ///     if b.value > a.value || (b.value == a.value && b.row < a.row) { b } else { a }
    /// }
    /// const NONE: Top = Top { value: f64::MIN, row: u64::MAX };
    ///
    /// let rt = Runtime::new(Config::new().procs(2).pin(false))?;
    /// let dsm = Dsm::new(&rt)?;
    /// let n = 16;
    /// let a = dsm
    ///     .matrix::<f64>(n, 4)
    ///     .pad_rows()
    ///     .placement(Placement::CyclicRows(0..n))
    ///     .from_fn(|i, j| (i * 7 % n + j) as f64)?;
    /// let top = rt.reduction(NONE);
    /// let mut seen = Vec::new();
    /// let mut prog = Program::new();
    /// prog.phase(
    ///     PoolArray::cyclic(&rt, 0..n),
    ///     |ctx, i| {
    ///         let v = a.row(ctx, i).get(0);
    ///         top.update(ctx, |t| larger(t, Top { value: v, row: i as u64 }));
    ///     },
    ///     |post| {
    ///         let t = post.get(&top); // and every node holds row t.row now
    ///         seen.push((t.row, a.get(t.row as usize, 3)));
    ///         Control::Done
    ///     },
    /// );
    /// a.reduce_at_end_with_row(&mut prog, &top, larger, |t: &Top| {
    ///     (t.row != u64::MAX).then_some(t.row as usize)
    /// });
    /// rt.start(&mut prog)?;
    /// drop(prog);
    /// assert_eq!(seen, [(9, 18.0)]); // row 9 starts with 15 (9·7 mod 16)
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reduce_at_end_with_row<'a, R, C, F>(
        &'a self,
        prog: &mut Program<'a>,
        r: &'a Reduction<R>,
        combine: C,
        row_of: F,
    ) where
        T: Send + Sync,
        R: Pod + Send + Sync,
        C: Fn(R, R) -> R + Send + Sync + 'a,
        F: Fn(&R) -> Option<usize> + Send + Sync + 'a,
    {
        let row_bytes = self.stride * std::mem::size_of::<T>();
        assert!(
            self.rows == 0 || row_bytes % PAGE == 0,
            "hyfi-dsm: reduce_at_end_with_row sends whole rows, so the matrix's rows must be \
             padded to pages: allocate it with `.pad_rows()`"
        );
        self.sh.core.prepare_carried(&self.sh.seg);
        let payload = RowPayload {
            m: self,
            row_of,
            _r: PhantomData,
        };
        prog.reduce_at_end_carrying(r, combine, Arc::new(payload));
    }

    /// The pages of row `i` (padding included).
    fn row_pages(&self, i: usize) -> (usize, usize) {
        self.sh.pages(i * self.stride, self.stride)
    }
}

/// The row a reduction's value names, riding with it
/// ([`DsmMatrix::reduce_at_end_with_row`]).
struct RowPayload<'a, T: Pod, R, F> {
    m: &'a DsmMatrix<T>,
    row_of: F,
    _r: PhantomData<fn(R)>,
}

impl<T, R, F> Payload for RowPayload<'_, T, R, F>
where
    T: Pod + Send + Sync,
    R: Pod,
    F: Fn(&R) -> Option<usize> + Send + Sync,
{
    fn size(&self) -> usize {
        CARRY_HEADER + self.m.stride * std::mem::size_of::<T>()
    }
    fn offer(&self, value: &[u8], out: &mut [u8]) {
        if let Some((lo, hi)) = self.pages(value) {
            self.m.sh.core.offer_carried(&self.m.sh.seg, lo, hi, out);
        }
    }
    fn take(&self, value: &[u8], bytes: &[u8]) {
        if let Some((lo, hi)) = self.pages(value) {
            self.m.sh.core.take_carried(&self.m.sh.seg, lo, hi, bytes);
        }
    }
}

impl<T: Pod, R: Pod, F: Fn(&R) -> Option<usize>> RowPayload<'_, T, R, F> {
    /// The pages of the row `value` names, if it names one of the matrix.
    fn pages(&self, value: &[u8]) -> Option<(usize, usize)> {
        let v: R = bytemuck::pod_read_unaligned(value);
        (self.row_of)(&v)
            .filter(|&i| i < self.m.rows)
            .map(|i| self.m.row_pages(i))
    }
}
