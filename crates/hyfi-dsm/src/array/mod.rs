//! Shared vectors and matrices, and the checked views filaments take of
//! them (the footprint views of footprint.rs are the fast path).
//!
//! Every checked access tests the per-page state byte: on a hit that is one byte
//! load and a predictable branch. A miss requests every missing page of
//! the range at once and suspends the filthread (see core.rs).
//!
//! One module per part: this one holds what every array shares (the
//! segment and the DSM behind it, the hit path, the bounds panics);
//! `view` the checked views, `vec` and `matrix` the two array types.
//!
//! **Soundness.** Elements are read and written with relaxed atomics of
//! their own width (elem.rs), so concurrent writes of different elements —
//! even by several processors and the communication thread — are not
//! undefined behaviour, and no `&`/`&mut` to shared bytes is ever handed
//! out. A view ([`View`], [`ViewMut`], [`MatrixView`]) is only made from a
//! filament's `&Ctx` and borrows it: it cannot outlive the filament, so
//! the release at the phase barrier (which may invalidate its pages) never
//! races a live view. Views are neither `Send` nor `Sync`.

use hyfi_core::layer::CtxExt;
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytemuck::Pod;
use hyfi_core::Ctx;

mod matrix;
mod vec;
mod view;

pub use matrix::DsmMatrix;
pub use vec::DsmVec;
pub use view::{MatrixView, View, ViewMut};

use crate::core::{readable, settled_readable, writable, Core, Segment};
use crate::elem;
use crate::footprint::{Frame, NONE};
use crate::region::PAGE;

const SHIFT: u32 = PAGE.trailing_zeros();

/// The elements rows `r` span (`cols` elements each, `stride` apart): the
/// first and how many, from the first row's start to the last row's end;
/// `None` if there are none.
fn rows_extent(r: &Range<usize>, cols: usize, stride: usize) -> Option<(usize, usize)> {
    (!r.is_empty() && cols > 0).then(|| (r.start * stride, (r.len() - 1) * stride + cols))
}

/// What an array shares: its segment and the DSM.
///
/// Element `e` of the array is element `origin + e` of its segment: a
/// matrix whose blocks are aligned to pages ([`MatrixAlloc::align_blocks`])
/// starts a little way into its first page. `base` points at element 0 of
/// the array; every page, claim and home is looked up at `origin + e`.
///
/// [`MatrixAlloc::align_blocks`]: crate::MatrixAlloc::align_blocks
pub(crate) struct Shared<T> {
    pub(crate) core: Arc<Core>,
    pub(crate) seg: Arc<Segment>,
    pub(crate) base: *mut T,
    /// Elements of the segment before the array's first (less than a page).
    pub(crate) origin: usize,
    _t: PhantomData<T>,
}

// SAFETY: `base` points into the DSM region, kept alive by `core`; all
// access to the bytes is atomic (elem.rs) and the page protocol is
// thread-safe.
unsafe impl<T: Pod + Send> Send for Shared<T> {}
// SAFETY: as above.
unsafe impl<T: Pod + Sync> Sync for Shared<T> {}

impl<T: Pod> Shared<T> {
    /// The array whose element 0 is element `origin` of `seg`.
    pub(crate) fn new(core: Arc<Core>, seg: Arc<Segment>, origin: usize) -> Self {
        let base = seg.base.cast::<T>().wrapping_add(origin);
        Shared {
            core,
            seg,
            base,
            origin,
            _t: PhantomData,
        }
    }

    /// Pages holding elements `e..e+n` (n ≥ 1) of the segment.
    #[inline(always)]
    fn pages_of(e: usize, n: usize) -> (usize, usize) {
        let s = std::mem::size_of::<T>();
        ((e * s) >> SHIFT, ((e + n) * s - 1) >> SHIFT)
    }

    /// Pages holding elements `e..e+n` (n ≥ 1) of the array.
    #[inline(always)]
    pub(crate) fn pages(&self, e: usize, n: usize) -> (usize, usize) {
        Self::pages_of(self.origin + e, n)
    }

    /// What the array's write views need to lend their elements as
    /// slices (footprint.rs, `with_row`).
    pub(crate) fn lender(&self) -> crate::footprint::Lender<'_> {
        crate::footprint::Lender {
            plain: &self.seg.plain,
            origin: self.origin,
            core: &self.core,
        }
    }

    /// Makes elements `e..e+n` readable here.
    #[inline(always)]
    pub(crate) fn check_read(&self, e: usize, n: usize) {
        self.seg
            .note_checked_read(&self.core.epoch, self.origin + e, n);
        let (lo, hi) = self.pages(e, n);
        // SAFETY: callers checked e + n ≤ the array's extent, whose pages
        // all exist.
        if lo == hi && readable(unsafe { self.seg.state.get_unchecked(lo) }.load(Ordering::Acquire))
        {
            return;
        }
        self.slow(lo, hi, false);
    }

    /// Makes rows `r` readable here (a checked read): `cols` elements
    /// each, `stride` apart (a vector is rows of one element).
    pub(crate) fn validate_rows(&self, r: &Range<usize>, cols: usize, stride: usize) {
        if let Some((e, n)) = rows_extent(r, cols, stride) {
            self.check_read(e, n);
        }
    }

    /// The footprint of a view of rows `r` (`cols` elements each, `stride`
    /// apart):
    /// the array's mode claimed for this access epoch, the pages made valid
    /// (or writable). `col` is the column a read-only claim names in
    /// messages ([`NONE`] for a vector). A write view is claimed as a view
    /// (footprint.rs), which decides whether it stores plainly (plain.rs);
    /// `site` is where it was taken.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn frame(
        &self,
        ctx: &Ctx,
        r: Range<usize>,
        cols: usize,
        stride: usize,
        col: usize,
        write: bool,
        site: &'static std::panic::Location<'static>,
    ) -> Frame {
        let (mut plain, mut active) = (false, 0);
        if !write {
            self.seg.note_read_only(ctx.access_epoch(), (r.start, col));
        }
        if !r.is_empty() && cols > 0 {
            // The footprint's elements, in the segment.
            let (first, n) = (
                self.origin + r.start * stride,
                (r.len() - 1) * stride + cols,
            );
            if write {
                // Plain stores only within phases (fork-join: `u64::MAX`).
                let may = crate::plain::enabled() && ctx.phase_key() != u64::MAX;
                let site = (site, ctx.phase_key());
                plain = self
                    .seg
                    .note_view_write(ctx.access_epoch(), first..first + n, site, may);
                self.core.count_view(plain, ctx.proc());
            }
            let (lo, hi) = Self::pages_of(first, n);
            self.slow(lo, hi, write);
            if plain {
                active = self.core.activate(&self.seg, lo, hi);
            }
        }
        // SAFETY: the rows' pages are valid (writable) here and the array's
        // mode is claimed (above; empty rows are never accessed); a plain
        // view's footprint is its claim and its home pages are registered.
        unsafe {
            Frame::new(
                &self.core,
                &self.seg,
                self.base,
                r.start,
                r.len(),
                cols,
                stride,
                plain,
                active,
            )
        }
    }

    /// Broadcasts the pages of rows `r` (`cols` elements each, `stride`
    /// apart; a vector is rows of one element) that are homed here, and
    /// expects the others (see [`DsmMatrix::broadcast_rows`]).
    pub(crate) fn broadcast_rows(&self, r: &Range<usize>, cols: usize, stride: usize) {
        if let Some((e, n)) = rows_extent(r, cols, stride) {
            let (lo, hi) = self.pages(e, n);
            self.core.broadcast(&self.seg, lo, hi);
        }
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
        self.seg.note_write(self.epoch(), self.origin + e, n);
        let (lo, hi) = self.pages(e, n);
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
        // SAFETY: in bounds (caller), valid (checked above).
        unsafe { elem::load_run(self.base.add(e), out) }
    }

    pub(crate) fn write_from(&self, e: usize, src: &[T]) {
        if src.is_empty() {
            return;
        }
        self.check_write(e, src.len());
        // SAFETY: in bounds (caller), writable (checked above).
        unsafe { elem::store_run(self.base.add(e), src) }
    }

    pub(crate) fn home_of(&self, e: usize) -> usize {
        self.seg.homes[self.pages(e, 1).0] as usize
    }
}

/// The hit path of element access, from pointers kept in the array handle
/// itself (no pointer chase through the shared state): one byte load and a
/// branch, then the element. Elements whose size is not a power of two may
/// straddle two pages and take the general path.
#[derive(Clone, Copy)]
pub(crate) struct Fast<T> {
    base: *mut T,
    /// The array's first element in its segment (see [`Shared`]).
    origin: usize,
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
            origin: sh.origin,
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
        // SAFETY: both point into state kept alive by `sh`.
        unsafe { (*self.seg).note_checked_read(&*self.now, self.origin + e, 1) };
        if Self::SIMPLE {
            let page = (self.origin + e) >> Self::PER_PAGE_SHIFT;
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
        unsafe { (*self.seg).note_write((*self.now).load(Ordering::Relaxed), self.origin + e, 1) };
        if Self::SIMPLE {
            let page = (self.origin + e) >> Self::PER_PAGE_SHIFT;
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
