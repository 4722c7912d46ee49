//! Shared vectors and matrices, and the checked views filaments take of
//! them (the footprint views of footprint.rs are the fast path).
//!
//! Every checked access tests the per-page state byte: on a hit that is one byte
//! load and a predictable branch. A miss requests every missing page of
//! the range at once and suspends the filthread (see core.rs).
//!
//! **Soundness.** Elements are read and written with relaxed atomics of
//! their own width (elem.rs), so concurrent writes of different elements —
//! even by several processors and the communication thread — are not
//! undefined behaviour, and no `&`/`&mut` to shared bytes is ever handed
//! out. A view ([`View`], [`ViewMut`], [`MatrixView`]) is only made from a
//! filament's `&Ctx` and borrows it: it cannot outlive the filament, so
//! the release at the phase barrier (which may invalidate its pages) never
//! races a live view. Views are neither `Send` nor `Sync`.

use std::marker::PhantomData;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytemuck::Pod;
use hyfi_core::Ctx;

use crate::core::{readable, settled_readable, writable, Core, Segment};
use crate::elem;
use crate::footprint::{Frame, ReadRange, ReadRows, WriteRange, WriteRows, NONE};
use crate::region::PAGE;

const SHIFT: u32 = PAGE.trailing_zeros();

/// What an array shares: its segment and the DSM.
pub(crate) struct Shared<T> {
    pub(crate) core: Arc<Core>,
    pub(crate) seg: Arc<Segment>,
    pub(crate) base: *mut T,
    _t: PhantomData<T>,
}

// SAFETY: `base` points into the DSM region, kept alive by `core`; all
// access to the bytes is atomic (elem.rs) and the page protocol is
// thread-safe.
unsafe impl<T: Pod + Send> Send for Shared<T> {}
// SAFETY: as above.
unsafe impl<T: Pod + Sync> Sync for Shared<T> {}

impl<T: Pod> Shared<T> {
    pub(crate) fn new(core: Arc<Core>, seg: Arc<Segment>) -> Self {
        let base = seg.base.cast::<T>();
        Shared {
            core,
            seg,
            base,
            _t: PhantomData,
        }
    }

    /// Pages holding elements `e..e+n` (n ≥ 1).
    #[inline(always)]
    fn pages_of(e: usize, n: usize) -> (usize, usize) {
        let s = std::mem::size_of::<T>();
        ((e * s) >> SHIFT, ((e + n) * s - 1) >> SHIFT)
    }

    /// Makes elements `e..e+n` readable here.
    #[inline(always)]
    pub(crate) fn check_read(&self, e: usize, n: usize) {
        let (lo, hi) = Self::pages_of(e, n);
        // SAFETY: callers checked e + n ≤ the array's extent, whose pages
        // all exist.
        if lo == hi && readable(unsafe { self.seg.state.get_unchecked(lo) }.load(Ordering::Acquire))
        {
            return;
        }
        self.slow(lo, hi, false);
    }

    /// The runtime's access epoch now.
    #[inline(always)]
    pub(crate) fn epoch(&self) -> u64 {
        self.core.epoch.load(Ordering::Relaxed)
    }

    /// Makes elements `e..e+n` writable here (and the array written in
    /// this access epoch: see footprint.rs).
    #[inline(always)]
    pub(crate) fn check_write(&self, e: usize, n: usize) {
        self.seg.note_write(self.epoch(), (e, NONE));
        let (lo, hi) = Self::pages_of(e, n);
        // SAFETY: as in check_read.
        if lo == hi && writable(unsafe { self.seg.state.get_unchecked(lo) }.load(Ordering::Acquire))
        {
            return;
        }
        self.slow(lo, hi, true);
    }

    #[cold]
    #[inline(never)]
    fn slow(&self, lo: usize, hi: usize, write: bool) {
        let ok = |st: u8| if write { writable(st) } else { readable(st) };
        if (lo..=hi).all(|p| ok(self.seg.state[p].load(Ordering::Acquire))) {
            return;
        }
        self.core.ensure(&self.seg, lo, hi, write);
    }

    /// Reads element `e`. The caller checked it is in bounds.
    #[inline(always)]
    pub(crate) fn load(&self, e: usize) -> T {
        self.check_read(e, 1);
        // SAFETY: in bounds, valid here (checked above), read atomically.
        unsafe { elem::load(self.base.add(e)) }
    }

    /// Writes element `e`. The caller checked it is in bounds.
    #[inline(always)]
    pub(crate) fn store(&self, e: usize, v: T) {
        self.check_write(e, 1);
        // SAFETY: in bounds, writable here (checked above), written atomically.
        unsafe { elem::store(self.base.add(e), v) }
    }

    /// [`Shared::load`] kept out of line: the miss path of the fast accessors.
    #[cold]
    #[inline(never)]
    fn load_cold(&self, e: usize) -> T {
        self.load(e)
    }

    /// [`Shared::store`] kept out of line.
    #[cold]
    #[inline(never)]
    fn store_cold(&self, e: usize, v: T) {
        self.store(e, v)
    }

    pub(crate) fn read_into(&self, e: usize, out: &mut [T]) {
        if out.is_empty() {
            return;
        }
        self.check_read(e, out.len());
        for (k, o) in out.iter_mut().enumerate() {
            // SAFETY: in bounds (caller), valid (checked above).
            *o = unsafe { elem::load(self.base.add(e + k)) };
        }
    }

    pub(crate) fn write_from(&self, e: usize, src: &[T]) {
        if src.is_empty() {
            return;
        }
        self.check_write(e, src.len());
        for (k, &v) in src.iter().enumerate() {
            // SAFETY: in bounds (caller), writable (checked above).
            unsafe { elem::store(self.base.add(e + k), v) };
        }
    }

    pub(crate) fn home_of(&self, e: usize) -> usize {
        self.seg.homes[Self::pages_of(e, 1).0] as usize
    }
}

/// The hit path of element access, from pointers kept in the array handle
/// itself (no pointer chase through the shared state): one byte load and a
/// branch, then the element. Elements whose size is not a power of two may
/// straddle two pages and take the general path.
#[derive(Clone, Copy)]
pub(crate) struct Fast<T> {
    base: *mut T,
    state: *const std::sync::atomic::AtomicU8,
    /// The array's access mode word and the runtime's access epoch: a
    /// write checks the array is not read-only now (footprint.rs).
    seg: *const Segment,
    now: *const AtomicU64,
}

impl<T: Pod> Fast<T> {
    fn of(sh: &Shared<T>) -> Self {
        Fast {
            base: sh.base,
            state: sh.seg.state.as_ptr(),
            seg: Arc::as_ptr(&sh.seg),
            now: Arc::as_ptr(&sh.core.epoch),
        }
    }
    const SIMPLE: bool = std::mem::size_of::<T>().is_power_of_two();
    /// log2 of the elements per page, for power-of-two element sizes.
    const PER_PAGE_SHIFT: u32 = SHIFT - std::mem::size_of::<T>().trailing_zeros();

    #[inline(always)]
    fn load(&self, sh: &Shared<T>, e: usize) -> T {
        if Self::SIMPLE {
            let page = e >> Self::PER_PAGE_SHIFT;
            // SAFETY: the caller checked `e` is in bounds, so `page` is one
            // of the segment's pages; a hit means the page is valid here and
            // has been since the phase began, so the phase's barrier orders
            // its bytes before this read and `Relaxed` suffices (see
            // `core::FRESH`; pages installed since take the slow path).
            unsafe {
                if settled_readable((*self.state.add(page)).load(Ordering::Relaxed)) {
                    return elem::load(self.base.add(e));
                }
            }
        }
        sh.load_cold(e)
    }

    #[inline(always)]
    fn store(&self, sh: &Shared<T>, e: usize, v: T) {
        // SAFETY: both point into state kept alive by `sh` (the segment
        // and the core holding the epoch counter).
        unsafe { (*self.seg).note_write((*self.now).load(Ordering::Relaxed), (e, NONE)) };
        if Self::SIMPLE {
            let page = e >> Self::PER_PAGE_SHIFT;
            // SAFETY: as in load; WRITE means writable here (twin taken).
            unsafe {
                if writable((*self.state.add(page)).load(Ordering::Acquire)) {
                    return elem::store(self.base.add(e), v);
                }
            }
        }
        sh.store_cold(e, v)
    }
}

#[cold]
#[inline(never)]
fn out_of_bounds(what: &str, index: String, shape: String) -> ! {
    panic!("hyfi-dsm: {what} index {index} out of bounds for a shared array of {shape}")
}

// The hot accessors call these with plain numbers: the formatting stays out
// of line, so an inlined `get` is a compare and a branch, not a panic's
// argument set-up.
#[cold]
#[inline(never)]
#[track_caller]
fn element_oob(i: usize, len: usize) -> ! {
    out_of_bounds("vector", i.to_string(), format!("{len} elements"))
}

#[cold]
#[inline(never)]
#[track_caller]
fn view_oob(j: usize, len: usize) -> ! {
    out_of_bounds("view", j.to_string(), format!("{len} elements"))
}

#[cold]
#[inline(never)]
#[track_caller]
fn matrix_oob(i: usize, j: usize, rows: usize, cols: usize) -> ! {
    out_of_bounds("matrix", format!("({i}, {j})"), format!("{rows} × {cols}"))
}

/// A read-only view of consecutive elements, valid for the filament that
/// took it (all its pages are present).
///
/// A view borrows the filament's `&Ctx`, so it cannot be kept past the
/// filament (the release at the phase's end may invalidate its pages):
///
/// ```compile_fail
/// use hyfi_core::{Config, Control, PoolArray, Program, Runtime};
/// use std::sync::Mutex;
/// let rt = Runtime::new(Config::new().procs(1))?;
/// let dsm = hyfi_dsm::Dsm::new(&rt)?;
/// let v = dsm.vec::<f64>(8).zeroed()?;
/// let kept = Mutex::new(None);
/// let mut prog = Program::new();
/// prog.phase(
///     PoolArray::block(&rt, 0..1, 1),
///     |ctx, _| *kept.lock().unwrap() = Some(v.slice(ctx, 0..8)), // error: borrowed `ctx` escapes
///     |_| Control::Done,
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// Nor can it move to another thread (it is neither `Send` nor `Sync`):
///
/// ```compile_fail
/// fn send<T: Send>(_: T) {}
/// fn f(v: hyfi_dsm::View<'_, f64>) { send(v) }
/// ```
pub struct View<'a, T: Pod> {
    ptr: *const T,
    len: usize,
    _life: PhantomData<(&'a T, *const ())>,
}

impl<'a, T: Pod> View<'a, T> {
    /// Elements in the view.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the view is empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Element `j` of the view.
    #[inline(always)]
    pub fn get(&self, j: usize) -> T {
        if j >= self.len {
            view_oob(j, self.len);
        }
        // SAFETY: in bounds; the view's pages were made valid when it was
        // taken and stay so until the filament ends (views cannot outlive it).
        unsafe { elem::load(self.ptr.add(j)) }
    }
    /// Copies the view into `out` (same length).
    pub fn copy_to(&self, out: &mut [T]) {
        assert_eq!(out.len(), self.len, "hyfi-dsm: copy_to length mismatch");
        for (j, o) in out.iter_mut().enumerate() {
            // SAFETY: as in get.
            *o = unsafe { elem::load(self.ptr.add(j)) };
        }
    }
    /// Copies elements `start..start + out.len()` of the view into `out`.
    pub fn copy_range_to(&self, start: usize, out: &mut [T]) {
        if start > self.len || out.len() > self.len - start {
            view_oob(start + out.len(), self.len);
        }
        for (j, o) in out.iter_mut().enumerate() {
            // SAFETY: in bounds (checked above); valid as in `get`.
            *o = unsafe { elem::load(self.ptr.add(start + j)) };
        }
    }
    /// The view's elements.
    pub fn to_vec(&self) -> Vec<T> {
        let mut v = vec![T::zeroed(); self.len];
        self.copy_to(&mut v);
        v
    }
    /// Iterates over the elements.
    pub fn iter(&self) -> impl Iterator<Item = T> + '_ {
        (0..self.len).map(move |j| {
            // SAFETY: as in get.
            unsafe { elem::load(self.ptr.add(j)) }
        })
    }
}

/// A writable view of consecutive elements, valid for the filament that
/// took it (all its pages are writable here). Reads as a [`View`] does.
pub struct ViewMut<'a, T: Pod> {
    view: View<'a, T>,
}

impl<'a, T: Pod> std::ops::Deref for ViewMut<'a, T> {
    type Target = View<'a, T>;
    fn deref(&self) -> &View<'a, T> {
        &self.view
    }
}

impl<'a, T: Pod> ViewMut<'a, T> {
    fn new(ptr: *mut T, len: usize) -> Self {
        ViewMut {
            view: View {
                ptr,
                len,
                _life: PhantomData,
            },
        }
    }
    /// Sets element `j`.
    #[inline(always)]
    pub fn set(&self, j: usize, v: T) {
        if j >= self.len {
            view_oob(j, self.len);
        }
        // SAFETY: in bounds; the pages were made writable (twins taken)
        // when the view was made, and stay so until the filament ends. The
        // pointer came from a `*mut T` (see `new`).
        unsafe { elem::store(self.view.ptr.cast_mut().add(j), v) }
    }
    /// Copies `src` into elements `start..start + src.len()` of the view.
    pub fn copy_range_from(&self, start: usize, src: &[T]) {
        if start > self.len || src.len() > self.len - start {
            view_oob(start + src.len(), self.len);
        }
        for (j, &v) in src.iter().enumerate() {
            // SAFETY: in bounds (checked above); writable as in `set`.
            unsafe { elem::store(self.view.ptr.cast_mut().add(start + j), v) };
        }
    }
    /// Updates elements `start..start + src.len()` in place, one pass:
    /// element `start + k` becomes `f(element, src[k])` (a row update such
    /// as LU's `a[i][j] -= l * a[p][j]`, with the bounds checked once).
    #[inline]
    pub fn update_range(&self, start: usize, src: &[T], f: impl Fn(T, T) -> T) {
        if start > self.len || src.len() > self.len - start {
            view_oob(start + src.len(), self.len);
        }
        let p = self.view.ptr.cast_mut().wrapping_add(start);
        for (k, &s) in src.iter().enumerate() {
            // SAFETY: in bounds (checked above); writable as in `set`;
            // atomic element accesses.
            unsafe { elem::store(p.add(k), f(elem::load(p.add(k)), s)) };
        }
    }
    /// Copies `src` (same length) into the view.
    pub fn copy_from(&self, src: &[T]) {
        assert_eq!(src.len(), self.len, "hyfi-dsm: copy_from length mismatch");
        for (j, &v) in src.iter().enumerate() {
            // SAFETY: as in set.
            unsafe { elem::store(self.view.ptr.cast_mut().add(j), v) };
        }
    }
}

/// A shared vector: `len` elements spread over the nodes' pages.
///
/// Made collectively with [`crate::Dsm::vec`]. Cloning the handle is cheap
/// (both handles name the same shared elements).
pub struct DsmVec<T: Pod> {
    fast: Fast<T>,
    len: usize,
    sh: Arc<Shared<T>>,
}

// SAFETY: the raw pointers in `fast` point into the region and the page
// table kept alive by `sh`, which is Send + Sync; access through them is
// atomic (see the module docs).
unsafe impl<T: Pod + Send + Sync> Send for DsmVec<T> {}
// SAFETY: as above.
unsafe impl<T: Pod + Send + Sync> Sync for DsmVec<T> {}

impl<T: Pod> Clone for DsmVec<T> {
    fn clone(&self) -> Self {
        DsmVec {
            fast: self.fast,
            len: self.len,
            sh: self.sh.clone(),
        }
    }
}

impl<T: Pod> DsmVec<T> {
    pub(crate) fn new(sh: Arc<Shared<T>>, len: usize) -> Self {
        DsmVec {
            fast: Fast::of(&sh),
            len,
            sh,
        }
    }
    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    #[inline(always)]
    fn check(&self, i: usize) {
        if i >= self.len {
            element_oob(i, self.len);
        }
    }
    fn check_range(&self, r: &Range<usize>) {
        if r.start > r.end || r.end > self.len {
            out_of_bounds("vector", format!("{r:?}"), format!("{} elements", self.len));
        }
    }
    /// Element `i` (fetched first if its page is not here).
    #[inline]
    pub fn get(&self, i: usize) -> T {
        self.check(i);
        self.fast.load(&self.sh, i)
    }
    /// Sets element `i`.
    #[inline]
    pub fn set(&self, i: usize, v: T) {
        self.check(i);
        self.fast.store(&self.sh, i, v)
    }
    /// A read view of `r`, for the filament owning `ctx`; every missing page
    /// of the range is requested at once.
    pub fn slice<'a>(&'a self, _ctx: &'a Ctx, r: Range<usize>) -> View<'a, T> {
        self.check_range(&r);
        if !r.is_empty() {
            self.sh.check_read(r.start, r.len());
        }
        View {
            // SAFETY (of the arithmetic): r.start ≤ len.
            ptr: self.sh.base.wrapping_add(r.start),
            len: r.len(),
            _life: PhantomData,
        }
    }
    /// A writable view of `r`, for the filament owning `ctx`.
    pub fn slice_mut<'a>(&'a self, _ctx: &'a Ctx, r: Range<usize>) -> ViewMut<'a, T> {
        self.check_range(&r);
        if !r.is_empty() {
            self.sh.check_write(r.start, r.len());
        }
        ViewMut::new(self.sh.base.wrapping_add(r.start), r.len())
    }
    /// Elements `r` as a read-only view of plain memory (`view[i]`,
    /// `view.as_slice()`), for the filaments of one pool segment: see
    /// [`DsmMatrix::read_rows`], whose rules it follows.
    pub fn read_range<'a>(&'a self, ctx: &Ctx, r: Range<usize>) -> ReadRange<'a, T> {
        ReadRange::new(self.range_frame(ctx, r, false))
    }

    /// Elements `r` as a write view (`view.set(i, v)`), for the
    /// filaments of one pool segment: see [`DsmMatrix::write_rows`].
    pub fn write_range<'a>(&'a self, ctx: &Ctx, r: Range<usize>) -> WriteRange<'a, T> {
        WriteRange::new(self.range_frame(ctx, r, true))
    }

    /// The footprint of a vector's view of `r`: the mode claimed for this
    /// access epoch (a write claims it in `check_write`), the pages made
    /// valid (or writable).
    fn range_frame(&self, ctx: &Ctx, r: Range<usize>, write: bool) -> Frame {
        self.check_range(&r);
        if !write {
            self.sh
                .seg
                .note_read_only(ctx.access_epoch(), (r.start, NONE));
        }
        if !r.is_empty() {
            if write {
                self.sh.check_write(r.start, r.len());
            } else {
                self.sh.check_read(r.start, r.len());
            }
        }
        // SAFETY: the range's pages are valid (writable) here and the
        // vector's mode is claimed (above, or by check_write; an empty
        // range is never accessed). A vector's view has one element a row.
        unsafe { Frame::new(&self.sh, r.start, r.len(), 1, 1) }
    }

    /// Copies elements `start..start+out.len()` into `out`.
    pub fn read(&self, start: usize, out: &mut [T]) {
        self.check_range(&(start..start + out.len()));
        self.sh.read_into(start, out)
    }
    /// Writes `src` at `start`.
    pub fn write(&self, start: usize, src: &[T]) {
        self.check_range(&(start..start + src.len()));
        self.sh.write_from(start, src)
    }
    /// All elements (fetching what is not here).
    pub fn to_vec(&self) -> Vec<T> {
        let mut v = vec![T::zeroed(); self.len];
        self.read(0, &mut v);
        v
    }
    /// The home node of element `i`'s page.
    pub fn home_of(&self, i: usize) -> usize {
        self.check(i);
        self.sh.home_of(i)
    }
}

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

/// A read view of a block of rows, for one filament.
pub struct MatrixView<'a, T: Pod> {
    ptr: *const T,
    rows: Range<usize>,
    cols: usize,
    stride: usize,
    _life: PhantomData<(&'a T, *const ())>,
}

impl<'a, T: Pod> MatrixView<'a, T> {
    /// Element `(i, j)`, `i` an absolute row index inside the view's rows.
    #[inline(always)]
    pub fn get(&self, i: usize, j: usize) -> T {
        if !self.rows.contains(&i) || j >= self.cols {
            out_of_bounds(
                "matrix view",
                format!("({i}, {j})"),
                format!("rows {:?} × {} columns", self.rows, self.cols),
            );
        }
        // SAFETY: in bounds; the view's pages are valid for its lifetime.
        unsafe { elem::load(self.ptr.add((i - self.rows.start) * self.stride + j)) }
    }
    /// Row `i` of the view.
    pub fn row(&self, i: usize) -> View<'a, T> {
        if !self.rows.contains(&i) {
            out_of_bounds(
                "matrix view row",
                i.to_string(),
                format!("rows {:?}", self.rows),
            );
        }
        View {
            ptr: self.ptr.wrapping_add((i - self.rows.start) * self.stride),
            len: self.cols,
            _life: PhantomData,
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
    /// are padded to pages).
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
        self.validate_rows(&r, false);
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
    /// use hyfi_core::{Config, Control, Op, PoolArray, Program, Runtime};
    /// let rt = Runtime::new(Config::new().procs(2).pin(false))?;
    /// let dsm = hyfi_dsm::Dsm::new(&rt)?;
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
    pub fn read_rows<'a>(&'a self, ctx: &Ctx, r: Range<usize>) -> ReadRows<'a, T> {
        ReadRows::new(self.rows_frame(ctx, r, false))
    }

    /// The rows `r` as a write view, for the filaments of one pool segment:
    /// every page of the rows is made writable here at once (fetched if
    /// missing, twins taken), and the array is marked written in this
    /// phase (a read view of it then panics).
    pub fn write_rows<'a>(&'a self, ctx: &Ctx, r: Range<usize>) -> WriteRows<'a, T> {
        WriteRows::new(self.rows_frame(ctx, r, true))
    }

    /// The footprint of a view of rows `r`: the mode claimed for this
    /// access epoch (a write claims it in `check_write`), the pages made
    /// valid (or writable).
    fn rows_frame(&self, ctx: &Ctx, r: Range<usize>, write: bool) -> Frame {
        self.check_rows(&r);
        if !write {
            self.sh.seg.note_read_only(ctx.access_epoch(), (r.start, 0));
        }
        self.validate_rows(&r, write);
        // SAFETY: the rows' pages are valid (writable) here and the array's
        // mode is claimed (above, or by check_write; empty rows are never
        // accessed).
        unsafe { Frame::new(&self.sh, r.start, r.len(), self.cols, self.stride) }
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

    /// Makes every page of rows `r` readable (or writable) here.
    fn validate_rows(&self, r: &Range<usize>, write: bool) {
        if r.is_empty() || self.cols == 0 {
            return;
        }
        let first = r.start * self.stride;
        let n = (r.len() - 1) * self.stride + self.cols;
        if write {
            self.sh.check_write(first, n);
        } else {
            self.sh.check_read(first, n);
        }
    }

    /// Copies row `i` into `out` (`cols` long).
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
}
