//! Declared footprints: views of shared arrays validated once per pool
//! segment, through which filaments read plain memory.
//!
//! **Why.** The checked accessors ([`DsmMatrix::get`]/[`DsmMatrix::set`])
//! test bounds and a page-state byte and go through an atomic on every
//! element; the compiler can then neither hoist the tests nor keep values
//! in registers, and a per-point Jacobi filament costs several times the
//! plain loop. A phase declared with `Program::phase_with` instead takes,
//! once per pool segment, the views its filaments need —
//! [`DsmMatrix::read_rows`] for rows it only reads (with a stencil's halo),
//! [`DsmMatrix::write_rows`] for the rows it computes — and the filaments
//! index those views. Taking a view makes every page of it valid here
//! (fetching every missing page at once and suspending the filthread
//! meanwhile), so the filaments never fault.
//!
//! **What it costs.** A read view is plain memory: a bounds test against
//! the footprint (which the compiler hoists or predicts) and a load that
//! can be vectorised and kept in registers; [`ReadRows::row`] is a `&[T]`.
//! A write view stores plainly when the phase's footprints show that
//! nothing else touches its rows (the compiler then vectorises a stencil
//! without a reduction as it does the slice loop, per point through
//! `set` as per row through `fill`; see the [`plain`](crate::plain) module
//! for when and why that is sound), and otherwise with relaxed atomics
//! (the communication thread may copy a home's page out while it is
//! written), a plain `mov` on x86-64 and AArch64 that no loop holding it
//! vectorises; runs of elements (`ViewMut::update_range`, `write_row`,
//! `copy_range_to`) move 16 aligned bytes at a time on x86-64, so a row
//! update vectorises (see `elem::update` for why that is still an atomic
//! access of each element). The alternatives measured (see BENCHMARKS.md) were the checked
//! per-element path, atomic loads in read views (1.6× a plain loop on
//! Jacobi), and memory protection (≈6 µs per fault, VMA fragmentation; the
//! design notes in DESIGN.md).
//!
//! **Capture by value.** A filament closure that reads a variable it
//! captured by reference (`|_ctx, i, (old, new)| .. r * old[i] ..` with a
//! local `r`) reloads it after every store through a write view: the
//! compiler cannot tell that the view's stores leave `r` alone (the slice
//! loop's `&mut [T]` tells it), so it keeps the loop scalar. Write the
//! closure `move |_ctx, i, (old, new)| ..` and the captured values are the
//! closure's own, kept in registers: a 1-D three-point stencil per element
//! runs at 1.05x its slice loop so, and at 2.8x without `move`
//! (BENCHMARKS.md).
//!
//! **Why plain reads are sound.** A read view may be taken of an array only
//! if no filament of this node writes it in the same *access epoch* (a
//! phase's execution, its post-phase code, or a fork-join run: see
//! `CtxExt::access_epoch`). Each array keeps its mode for the current epoch
//! in one atomic word, set by compare-and-swap: the first read view of an
//! epoch makes it *read-only*, the first write (through any path: `set`,
//! `write`, `row_mut`, `slice_mut`, a write view) makes it *written*, and
//! the other transition then panics, naming the array and the element.
//! Since the mode is claimed before the first write and before the first
//! plain read, a read view never overlaps a write of this node. Other
//! nodes' writes arrive only as diffs at the release, after the epoch; the
//! communication thread installs fetched bytes only into pages that are not
//! valid here, and a view covers valid pages only. A view must not
//! outlive its epoch: it lives in the segment's bound values, which the
//! runtime drops at the segment's end, and it is neither `Send` nor `Sync`;
//! the one way to keep it longer is a thread-local, so the DSM counts live
//! views and the runtime checks at every epoch's end that none is left —
//! if one is, the process stops with a message (an error could not take
//! the view back). Checking the epoch on every access instead cost 1.4× on
//! per-point Jacobi (a load the compiler cannot hoist past the stores).
//!
//! One case is outside this argument: a thread that is not a server
//! thread (one the program spawned itself) writing a shared array *while a
//! phase runs*. Nothing orders it with the phase's start, so its write may
//! be judged against an earlier epoch and overlap a read view's plain
//! reads; hyfi does not detect that. Write shared arrays from filaments,
//! from post-phase code, or between runs (as every hyfi program does).
//!
//! Element and row references handed out by a view borrow the view, and the
//! view lives in the segment's bound values, so no `&T` or `&[T]` outlives
//! the filament that took it:
//!
//! ```compile_fail,E0521
//! use hyfi::{Config, Control, PoolArray, Program, Runtime};
//! let rt = Runtime::new(Config::new().procs(1).pin(false))?;
//! let dsm = hyfi::Dsm::new(&rt)?;
//! let m = dsm.matrix::<f64>(4, 4).zeroed()?;
//! let kept = std::sync::Mutex::new(None);
//! let mut prog = Program::new();
//! prog.phase_with(
//!     PoolArray::block(&rt, 0..4, 1),
//!     |ctx, span| m.read_rows(ctx, span.rows()),
//!     |_ctx, i, old| *kept.lock().unwrap() = Some(old.row(i)), // error: the row borrows the view
//!     |_| Control::Done,
//! );
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! A write view's rows are written through a [`RowWriter`] (`fill`,
//! `set`), which borrows the view and so cannot outlive the filament
//! either, plain stores or not:
//!
//! ```compile_fail,E0521
//! use hyfi::{Config, Control, PoolArray, Program, Runtime};
//! let rt = Runtime::new(Config::new().procs(1).pin(false))?;
//! let dsm = hyfi::Dsm::new(&rt)?;
//! let m = dsm.matrix::<f64>(4, 4).zeroed()?;
//! let kept = std::sync::Mutex::new(None);
//! let mut prog = Program::new();
//! prog.phase_with(
//!     PoolArray::block(&rt, 0..4, 1),
//!     |ctx, span| m.write_rows(ctx, span.rows()),
//!     |_ctx, i, new| *kept.lock().unwrap() = Some(new.row_mut(i)), // error: the writer borrows the view
//!     |_| Control::Done,
//! );
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! and a `fill` closure cannot keep the writer's row either: it gets
//! column numbers and returns values, never a reference into the row.
//!
//! The one `&mut` into shared bytes is the slice [`WriteRows::with_row`]
//! and [`WriteRange::with_slice`] lend to a closure (the argument for it
//! is on `plain::Loan`). It cannot leave the closure:
//!
//! ```compile_fail
//! use hyfi::{Config, Control, PoolArray, Program, Runtime};
//! let rt = Runtime::new(Config::new().procs(1).pin(false))?;
//! let dsm = hyfi::Dsm::new(&rt)?;
//! let m = dsm.matrix::<f64>(4, 4).zeroed()?;
//! let mut prog = Program::new();
//! prog.phase_with(
//!     PoolArray::block(&rt, 0..4, 1),
//!     |ctx, span| m.write_rows(ctx, span.rows()),
//!     |_ctx, i, new| {
//!         let row: &mut [f64] = new.with_row(i, |row| row); // error: the slice is the closure's
//!         row[0] = 1.0;
//!     },
//!     |_| Control::Done,
//! );
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! no two of them cover one row at once (the view is borrowed mutably):
//!
//! ```compile_fail,E0500
//! use hyfi::{Config, Control, PoolArray, Program, Runtime};
//! let rt = Runtime::new(Config::new().procs(1).pin(false))?;
//! let dsm = hyfi::Dsm::new(&rt)?;
//! let m = dsm.matrix::<f64>(4, 4).zeroed()?;
//! let mut prog = Program::new();
//! prog.phase_with(
//!     PoolArray::block(&rt, 0..4, 1),
//!     |ctx, span| m.write_rows(ctx, span.rows()),
//!     |_ctx, i, new| {
//!         let new = &mut *new;
//!         new.with_row(i, |a| new.with_row(i, |b| a[0] = b[0])); // error: two `&mut`
//!     },
//!     |_| Control::Done,
//! );
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! and the view's own accessors cannot reach the row meanwhile:
//!
//! ```compile_fail,E0502
//! use hyfi::{Config, Control, PoolArray, Program, Runtime};
//! let rt = Runtime::new(Config::new().procs(1).pin(false))?;
//! let dsm = hyfi::Dsm::new(&rt)?;
//! let m = dsm.matrix::<f64>(4, 4).zeroed()?;
//! let mut prog = Program::new();
//! prog.phase_with(
//!     PoolArray::block(&rt, 0..4, 1),
//!     |ctx, span| m.write_rows(ctx, span.rows()),
//!     |_ctx, i, new| {
//!         let new = &mut *new;
//!         new.with_row(i, |row| row[0] = new.get(i, 1)); // error: the view is lent
//!     },
//!     |_| Control::Done,
//! );
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! A checked access to a lent row (through the array, not the view) is
//! not a borrow the compiler sees: in a plain-store view it panics.
//!
//! Nor can a write view's element be read as a plain reference (writes are
//! atomic; only read views index as `&T`):
//!
//! ```compile_fail,E0608
//! fn f(v: &hyfi::WriteRows<'_, f64>) -> f64 { v[(0, 0)] }
//! ```
//!
//! [`DsmMatrix::get`]: crate::DsmMatrix::get
//! [`DsmMatrix::set`]: crate::DsmMatrix::set
//! [`DsmMatrix::read_rows`]: crate::DsmMatrix::read_rows
//! [`DsmMatrix::write_rows`]: crate::DsmMatrix::write_rows

use std::marker::PhantomData;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::Release};

use bytemuck::Pod;

use crate::core::{Core, Segment};
use crate::elem;

/// Mode bits of [`Segment::access`]: `epoch << SHIFT | mode`.
const SHIFT: u32 = 3;
const MODE: u64 = (1 << SHIFT) - 1;
const READ_ONLY: u64 = 1;
/// Written, not (only) through disjoint write views: atomic stores.
const WRITTEN: u64 = 2;
/// Read through the checked accessors, not written (yet).
const CHECKED: u64 = 3;
/// The view bit: written so far only through disjoint write views (which
/// store atomically), so the epoch is still clean (plain.rs).
const VIEWS: u64 = 4;
/// As `VIEWS`, with plain stores.
const PLAIN: u64 = 5;

/// Where an access was, for messages: `(row, col)` of a matrix, or
/// `(index, NONE)` of a vector.
pub(crate) const NONE: usize = usize::MAX;

fn place(at: (usize, usize)) -> String {
    match at {
        (i, NONE) => format!("element {i}"),
        (i, j) => format!("element ({i}, {j})"),
    }
}

/// The epoch a claim in `epoch` is judged in (never older than the word's,
/// see `Segment::claim`) and the word `cur`'s mode in it (0: none yet).
fn current(cur: u64, epoch: u64) -> (u64, u64) {
    let e = epoch.max(cur >> SHIFT);
    (e, if cur >> SHIFT == e { cur & MODE } else { 0 })
}

impl Segment {
    /// Records that this node writes elements `e..e + n` of the array in
    /// `epoch` through a checked path. Panics if the array is read-only (a
    /// read view was taken) in `epoch`, or if the elements lie in another
    /// filament's plain-store view (plain.rs).
    #[inline(always)]
    pub(crate) fn note_write(&self, epoch: u64, e: usize, n: usize) {
        if self.access.load(Relaxed) != (epoch << SHIFT | WRITTEN) {
            self.claim(epoch, WRITTEN, (e, NONE), n);
        }
    }

    /// Whether this node reads the array as plain memory in `epoch` (a read
    /// view was taken in it): then no filament of this node writes it in
    /// `epoch` (each would panic before its store, footprint.rs), which the
    /// page server uses to serve its pages without a snapshot
    /// (core/server.rs).
    pub(crate) fn read_only_in(&self, epoch: u64) -> bool {
        self.access.load(Relaxed) == (epoch << SHIFT | READ_ONLY)
    }

    /// Records that this node reads the array as plain memory in `epoch`.
    /// Panics if the array is written in `epoch`.
    #[inline]
    pub(crate) fn note_read_only(&self, epoch: u64, at: (usize, usize)) {
        if self.access.load(Relaxed) != (epoch << SHIFT | READ_ONLY) {
            self.claim(epoch, READ_ONLY, at, 0);
        }
    }

    /// A checked read of elements `e..e + n`: one load and a branch while
    /// the array is read-only, written, or already read so in this epoch;
    /// otherwise (the epoch's first checked read, or write views wrote the
    /// array in this epoch) the cold path records it, which makes an epoch
    /// of write views not clean, and in a `PLAIN` epoch checks that the
    /// elements lie in no other filament's view. The mode is reset at every
    /// epoch's end, so a nonzero mode is this epoch's.
    #[inline(always)]
    pub(crate) fn note_checked_read(&self, now: &AtomicU64, e: usize, n: usize) {
        if (self.access.load(Relaxed) & MODE).wrapping_sub(1) >= CHECKED {
            self.checked_read_cold(now.load(Relaxed), e, n);
        }
    }

    #[cold]
    #[inline(never)]
    fn checked_read_cold(&self, epoch: u64, e: usize, n: usize) {
        let mut cur = self.access.load(Relaxed);
        loop {
            let (ep, mode) = current(cur, epoch);
            let want = match mode {
                0 => ep << SHIFT | CHECKED,
                VIEWS => ep << SHIFT | WRITTEN,
                PLAIN => return self.checked_in_plain_epoch("read of", e, n),
                _ => return,
            };
            match self.access.compare_exchange(cur, want, Relaxed, Relaxed) {
                Ok(_) => return,
                Err(now) => cur = now,
            }
        }
    }

    /// A write view of elements `span` (its first row's first element to
    /// its last row's last) taken at `site` in `epoch`: claims the array
    /// for views, and says whether this view stores plainly. `may_plain`:
    /// the view is taken within a phase and plain stores are on.
    pub(crate) fn note_view_write(
        &self,
        epoch: u64,
        span: Range<usize>,
        site: crate::plain::Site,
        may_plain: bool,
    ) -> bool {
        let mut cur = self.access.load(Relaxed);
        loop {
            let (e, mode) = current(cur, epoch);
            let want = match mode {
                READ_ONLY => conflict(self.seq, WRITTEN, (span.start, NONE)),
                WRITTEN => {
                    self.plain.note_site(site);
                    return false;
                }
                // Read through the checked accessors first: not clean.
                CHECKED => e << SHIFT | WRITTEN,
                VIEWS | PLAIN => {
                    let ft = hyfi_core::filthread::current_work();
                    return match self.plain.claim_view(span.clone(), ft, site, mode == PLAIN) {
                        crate::plain::Outcome::Plain => true,
                        crate::plain::Outcome::Atomic { clean: true } => false,
                        crate::plain::Outcome::Atomic { clean: false } => {
                            // Overlapping views: atomic from now on.
                            let _ = self.access.compare_exchange(
                                cur,
                                e << SHIFT | WRITTEN,
                                Relaxed,
                                Relaxed,
                            );
                            false
                        }
                        crate::plain::Outcome::Conflict => {
                            crate::plain::conflict(self.seq, "write view over", span.start)
                        }
                        crate::plain::Outcome::Lent => {
                            crate::plain::lent(self.seq, "write view over", span.start)
                        }
                    };
                }
                _ => {
                    let plain = may_plain && self.plain.site_is_steady(site);
                    e << SHIFT | if plain { PLAIN } else { VIEWS }
                }
            };
            match self.access.compare_exchange(cur, want, Relaxed, Relaxed) {
                Ok(_) => cur = want,
                Err(now) => cur = now,
            }
        }
    }

    /// A checked access of elements `e..e + n` in a `PLAIN` epoch: the
    /// epoch is not clean, and the elements must lie in no other
    /// filament's plain-store view (plain.rs).
    fn checked_in_plain_epoch(&self, what: &str, e: usize, n: usize) {
        use crate::plain::Refused;
        match self
            .plain
            .checked_access(e..e + n.max(1), hyfi_core::filthread::current_work())
        {
            None => {}
            Some(Refused::Conflict) => crate::plain::conflict(self.seq, what, e),
            Some(Refused::Lent) => crate::plain::lent(self.seq, what, e),
        }
    }

    /// At the end of an access epoch (no filament runs): records whether
    /// the epoch was clean for the call sites of its write views, and
    /// resets the word's mode, so that checked reads of the next epoch
    /// find the view bit clear.
    pub(crate) fn end_access_epoch(&self) {
        let cur = self.access.load(Relaxed);
        if cur & VIEWS != 0 || cur & MODE == WRITTEN {
            self.plain.end_epoch(cur & VIEWS != 0);
        }
        self.access.store(cur & !MODE, Relaxed);
    }

    #[cold]
    #[inline(never)]
    fn claim(&self, epoch: u64, mode: u64, at: (usize, usize), n: usize) {
        let mut cur = self.access.load(Relaxed);
        loop {
            // Never move the word's epoch back: a caller whose epoch is
            // stale (a thread outside the runtime that read the counter
            // before a phase began) is judged against the newer epoch.
            let e = epoch.max(cur >> SHIFT);
            let want = e << SHIFT | mode;
            if cur == want {
                return;
            }
            if cur >> SHIFT == e && cur & MODE != 0 && cur & MODE != CHECKED {
                let have = cur & MODE;
                if mode == READ_ONLY || have == READ_ONLY {
                    // One word, one modification order: whoever claimed
                    // first wins, so a plain read never overlaps a write
                    // of this node.
                    conflict(self.seq, mode, at);
                }
                if have == PLAIN {
                    // The word stays PLAIN (plain.rs).
                    return self.checked_in_plain_epoch("write of", at.0, n);
                }
                // VIEWS → WRITTEN: the epoch is no longer clean.
            }
            match self.access.compare_exchange(cur, want, Relaxed, Relaxed) {
                Ok(_) => return,
                Err(now) => cur = now,
            }
        }
    }
}

#[cold]
#[inline(never)]
#[track_caller]
fn conflict(seq: u64, wanted: u64, at: (usize, usize)) -> ! {
    if wanted == WRITTEN {
        panic!(
            "hyfi-dsm: write to {} of shared array #{seq}, which is read-only in this phase \
             (a read view was taken of it with read_rows/read_range): a phase either reads \
             an array as read-only or writes it; write it in another phase, or take a write \
             view (write_rows/write_range) instead of the read view",
            place(at)
        )
    } else {
        panic!(
            "hyfi-dsm: read view of shared array #{seq} (at {}) in a phase that writes it: \
             read views are for arrays no filament writes in the phase; read it through \
             get or the write view instead",
            place(at)
        )
    }
}

/// The shape of a footprint, by value: cold paths take no reference into
/// a view (which would make the view's address escape and keep it, and
/// the accumulators bound beside it, out of registers in the hot loop).
#[derive(Clone, Copy)]
struct Shape {
    first: usize,
    rows: usize,
    cols: usize,
    vector: bool,
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.vector {
            write!(f, "elements {}..{}", self.first, self.first + self.rows)
        } else {
            write!(
                f,
                "rows {}..{} × columns 0..{}",
                self.first,
                self.first + self.rows,
                self.cols
            )
        }
    }
}

#[cold]
#[inline(never)]
#[track_caller]
fn outside(kind: &'static str, seq: u64, at: (usize, usize), shape: Shape) -> ! {
    let footprint = shape.to_string();
    panic!(
        "hyfi-dsm: {} of shared array #{seq} is outside the {kind} view's footprint ({footprint}); \
         widen the view taken in the phase's bind (e.g. a larger halo), or use get/set",
        place(at)
    )
}

/// Called by the runtime whenever an access epoch ends, when no filament
/// runs: a view still alive then was kept past its segment (only a
/// thread-local can hold one: views are neither `Send` nor `Sync`), and its
/// plain reads could race with the next epoch's writes. That cannot be
/// reported by unwinding — the view would survive the error — so the
/// process stops.
pub(crate) fn check_no_live_views(core: &Core) {
    let n = core.live_views.load(Relaxed);
    if n != 0 {
        eprintln!(
            "hyfi-dsm: {n} view(s) of shared arrays (read_rows/write_rows/read_range/write_range) \
             outlived the phase or fork-join run that took them — kept in a thread-local or \
             leaked? A view is valid for one pool segment: its plain reads would race with the \
             next phase's writes, so the process stops. Drop views before the filament ends."
        );
        std::process::abort();
    }
}

/// What every view carries: where its rows start and its shape; it counts
/// itself among the DSM's live views for as long as it exists.
pub(crate) struct Frame {
    /// Element `(first, 0)`.
    ptr: *mut u8,
    first: usize,
    rows: usize,
    cols: usize,
    stride: usize,
    /// Bit 0: a write view that stores plainly (plain.rs). The rest: the
    /// counter this view decrements when it is dropped: the DSM's count of
    /// live views, or, for a plain view registered with the page server
    /// (core/plain.rs), its registration's, which the DSM reaps. One word
    /// and one atomic operation in the drop, as before plain views: the
    /// views a segment binds must stay a few plain values the compiler
    /// keeps in registers, and their drop small enough to inline (with an
    /// `Option<Arc<..>>` here, or a call or a second atomic in the drop,
    /// the tuple's drop stayed out of line, the bound values went to the
    /// stack, and per-point Jacobi ran 3.5x slower).
    live: usize,
    seq: u64,
}

impl Frame {
    /// The footprint `rows` rows of `cols` elements, `stride` apart, from
    /// row `first` of the array `sh` (a vector's: one element per row),
    /// counted among the live views (see [`check_no_live_views`]).
    ///
    /// # Safety
    /// Every page of the footprint is valid here (writable, for a write
    /// view), and the array's mode for this access epoch was claimed
    /// (read-only for a read view, written for a write view). If `plain`,
    /// the footprint is this filament's claim in a plain-store epoch
    /// (plain.rs) and `active` registers its home pages with the page
    /// server (or none need it).
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn new<T: Pod>(
        core: &Core,
        seg: &Segment,
        base: *mut T,
        first: usize,
        rows: usize,
        cols: usize,
        stride: usize,
        plain: bool,
        active: u64,
    ) -> Frame {
        // A registered view is counted live by its registration.
        core.live_views.fetch_add(1, Relaxed);
        Frame {
            ptr: base.wrapping_add(first * stride).cast(),
            first,
            rows,
            cols,
            stride,
            live: match active {
                0 => &core.live_views as *const AtomicUsize as usize,
                a => a as usize,
            } | usize::from(plain),
            seq: seg.seq,
        }
    }
    /// Offset of element `(i, j)` from `ptr`, in elements; panics outside.
    #[inline(always)]
    fn offset(&self, kind: &'static str, i: usize, j: usize) -> usize {
        let r = i.wrapping_sub(self.first);
        if r >= self.rows || j >= self.cols {
            outside(kind, self.seq, (i, j), self.shape(false));
        }
        r * self.stride + j
    }
    #[inline(always)]
    fn row_offset(&self, kind: &'static str, i: usize) -> usize {
        let r = i.wrapping_sub(self.first);
        if r >= self.rows {
            outside(kind, self.seq, (i, 0), self.shape(false));
        }
        r * self.stride
    }
    /// Offset of element `i` of a vector's view; panics outside.
    #[inline(always)]
    fn element(&self, kind: &'static str, i: usize) -> usize {
        let k = i.wrapping_sub(self.first);
        if k >= self.rows {
            outside(kind, self.seq, (i, NONE), self.shape(true));
        }
        k
    }
    /// Whether this write view stores plainly.
    #[inline(always)]
    fn plain(&self) -> bool {
        self.live & 1 != 0
    }
    #[inline(always)]
    fn shape(&self, vector: bool) -> Shape {
        Shape {
            first: self.first,
            rows: self.rows,
            cols: self.cols,
            vector,
        }
    }
}

impl Drop for Frame {
    #[inline(always)]
    fn drop(&mut self) {
        // SAFETY: the DSM's count of live views, or a registration's (see
        // `live`), both kept alive until the count is seen to drop: the
        // core by the array the view borrows, the registration by the
        // core's registry until it is reaped.
        unsafe { &*((self.live & !1) as *const AtomicUsize) }.fetch_sub(1, Release);
    }
}

/// Rows of a shared matrix that no filament of this node writes in the
/// phase, as plain memory: `row(i)` is a `&[T]`, `view[(i, j)]` a `&T`.
/// Made by [`DsmMatrix::read_rows`](crate::DsmMatrix::read_rows).
pub struct ReadRows<'a, T: Pod> {
    f: Frame,
    _a: PhantomData<(&'a T, *const ())>,
}

impl<'a, T: Pod> ReadRows<'a, T> {
    /// A view over `f`, made for this kind of view (see [`Frame::new`]).
    pub(crate) fn new(f: Frame) -> Self {
        ReadRows { f, _a: PhantomData }
    }

    /// The rows of the footprint.
    pub fn rows(&self) -> Range<usize> {
        self.f.first..self.f.first + self.f.rows
    }

    /// Element `(i, j)` (absolute indices); panics outside the footprint.
    #[inline(always)]
    pub fn get(&self, i: usize, j: usize) -> T {
        *self.at(i, j)
    }

    #[inline(always)]
    fn at(&self, i: usize, j: usize) -> &T {
        let k = self.f.offset("read", i, j);
        // SAFETY: inside the footprint, whose pages are valid here and not
        // written on this node in the view's epoch (checked just above:
        // see the module docs), so a plain shared reference is sound for
        // as long as it borrows the view, i.e. within the filament.
        unsafe { &*self.f.ptr.cast::<T>().add(k) }
    }

    /// Row `i` (absolute index) as a slice of its `cols` elements.
    ///
    /// The compiler does not know that `cols` is the `n` a loop runs to, so
    /// indexing the row inside `for j in 1..n - 1` keeps a bounds check per
    /// access (and the loop does not vectorise) unless the row is cut to
    /// that length first, as a slice of a `Vec` would be:
    /// `let up = &grid.row(i - 1)[..n];`.
    #[inline(always)]
    pub fn row(&self, i: usize) -> &[T] {
        let k = self.f.row_offset("read", i);
        // SAFETY: as in `at`, for the row's `cols` elements.
        unsafe { std::slice::from_raw_parts(self.f.ptr.cast::<T>().add(k), self.f.cols) }
    }
}

impl<T: Pod> std::ops::Index<(usize, usize)> for ReadRows<'_, T> {
    type Output = T;
    #[inline(always)]
    fn index(&self, (i, j): (usize, usize)) -> &T {
        self.at(i, j)
    }
}

/// Elements of a shared vector that no filament of this node writes in the
/// phase, as plain memory: `view[i]` is a `&T` (absolute index),
/// `as_slice()` the whole range. Made by
/// [`DsmVec::read_range`](crate::DsmVec::read_range); the rules of
/// [`ReadRows`] apply.
pub struct ReadRange<'a, T: Pod> {
    f: Frame,
    _a: PhantomData<(&'a T, *const ())>,
}

impl<'a, T: Pod> ReadRange<'a, T> {
    /// A view over `f`, made for this kind of view (see [`Frame::new`]).
    pub(crate) fn new(f: Frame) -> Self {
        ReadRange { f, _a: PhantomData }
    }

    /// The elements of the footprint.
    pub fn range(&self) -> Range<usize> {
        self.f.first..self.f.first + self.f.rows
    }

    /// Element `i` (absolute index); panics outside the footprint.
    #[inline(always)]
    pub fn get(&self, i: usize) -> T {
        self[i]
    }

    /// The footprint's elements as one slice (`[0]` is element `range().start`).
    #[inline]
    pub fn as_slice(&self) -> &[T] {
        // SAFETY: as in `ReadRows::at`, for the footprint's elements.
        unsafe { std::slice::from_raw_parts(self.f.ptr.cast::<T>(), self.f.rows) }
    }
}

impl<T: Pod> std::ops::Index<usize> for ReadRange<'_, T> {
    type Output = T;
    #[inline(always)]
    fn index(&self, i: usize) -> &T {
        let k = self.f.element("read", i);
        // SAFETY: as in `ReadRows::at`.
        unsafe { &*self.f.ptr.cast::<T>().add(k) }
    }
}

/// Rows of a shared matrix that this segment's filaments write: `set(i, j,
/// v)`, `row_mut(i).fill(..)`, `write_row(i, col, &src)`. Stores are plain
/// when the phase's footprints allow it (from the phase's third execution
/// on, if the two before it took the same disjoint views of the array and
/// nothing else accessed it: see the [`plain`](crate::plain) module and
/// [`WriteRows::plain_stores`]), and relaxed atomics otherwise (plain
/// moves on x86-64 and AArch64, which the compiler does not vectorise).
/// Made by [`DsmMatrix::write_rows`](crate::DsmMatrix::write_rows).
pub struct WriteRows<'a, T: Pod> {
    f: Frame,
    lender: Lender<'a>,
    _a: PhantomData<(&'a T, *const ())>,
}

impl<'a, T: Pod> WriteRows<'a, T> {
    /// A view over `f`, made for this kind of view (see [`Frame::new`]).
    pub(crate) fn new(f: Frame, lender: Lender<'a>) -> Self {
        WriteRows {
            f,
            lender,
            _a: PhantomData,
        }
    }

    /// The rows of the footprint.
    pub fn rows(&self) -> Range<usize> {
        self.f.first..self.f.first + self.f.rows
    }

    #[inline(always)]
    fn ptr_at(&self, i: usize, j: usize) -> *mut T {
        let k = self.f.offset("write", i, j);
        self.f.ptr.cast::<T>().wrapping_add(k)
    }

    /// Sets element `(i, j)` (absolute indices); panics outside the footprint.
    #[inline(always)]
    pub fn set(&self, i: usize, j: usize, v: T) {
        let p = self.ptr_at(i, j);
        // SAFETY: inside the footprint, writable here (see `new`); plain
        // only in a plain-store view, whose footprint no other filament or
        // node touches in the epoch (the `plain` module). The branch is on
        // a value of the view, the same for all its filaments, so LLVM
        // moves it out of the segment's loop and a per-point stencil
        // vectorises in the plain copy (BENCHMARKS.md, diffusion).
        unsafe { elem::store_as(p, v, self.f.plain()) }
    }

    /// Whether this view stores plainly (the compiler vectorises its
    /// stores) or atomically: see the `plain` module's docs for when.
    pub fn plain_stores(&self) -> bool {
        self.f.plain()
    }

    /// Element `(i, j)` (an atomic load: other filaments may write it).
    #[inline(always)]
    pub fn get(&self, i: usize, j: usize) -> T {
        let p = self.ptr_at(i, j);
        // SAFETY: inside the footprint, valid here; atomic.
        unsafe { elem::load(p) }
    }

    /// Row `i` (absolute index) to write by column: `row_mut(i).set(j, v)`
    /// checks only `j` against the columns.
    #[inline(always)]
    pub fn row_mut(&self, i: usize) -> RowWriter<'_, T> {
        let k = self.f.row_offset("write", i);
        RowWriter {
            ptr: self.f.ptr.cast::<T>().wrapping_add(k),
            cols: self.f.cols,
            row: i,
            seq: self.f.seq,
            plain: self.f.plain(),
            _v: PhantomData,
        }
    }

    /// Writes `src` into row `i` from column `col`.
    pub fn write_row(&self, i: usize, col: usize, src: &[T]) {
        if src.is_empty() {
            return;
        }
        // Both ends inside the footprint: the whole run is.
        let _ = self.ptr_at(i, col + src.len() - 1);
        let p0 = self.ptr_at(i, col);
        // SAFETY: inside the footprint (both ends checked), writable; every
        // element written as a unit (see `elem::store_run`).
        unsafe { elem::store_run(p0, src) }
    }

    /// Row `i` (absolute index), all its columns, as a `&mut [T]` for `f`:
    /// write the row as the sequential loop writes a slice of a `Vec`
    /// (iterators, `zip`, `chunks_exact_mut`, other crates' slice
    /// kernels), and the compiler vectorises it as it does that loop.
    ///
    /// In a plain-store view ([`WriteRows::plain_stores`]: from a phase's
    /// third execution on, where no other filament touches the view's
    /// rows) the slice is the shared row itself.
    ///
    /// **Read other data as slices too.** A loop that indexes data the
    /// compiler reaches through memory per element (a `Vec` behind a lock
    /// guard: `rk[j]` with `rk` a `RwLockReadGuard`) stays scalar, here as
    /// through [`RowWriter::update`]: the row's stores might change the
    /// `Vec`'s pointer and length, so they are loaded again for every
    /// element. Take the slice once (`let rk: &[f64] = &rk;`), or `zip`
    /// with it, which does. A user's Floyd–Warshall step ran at 2.5–4.5×
    /// the slice loop indexing the guard, through `update` or `with_row`
    /// alike, and at 0.9–1.6× with the slice taken once, through either
    /// (BENCHMARKS.md, "Rows lent as slices").
    ///
    /// Otherwise (a phase's first two executions; footprints that overlap; a
    /// checked access to the array, or a second view overlapping this one,
    /// earlier in the phase) `f` gets a copy of the row, and the elements
    /// it changed are stored back when it returns (atomically outside a
    /// plain-store view): the same results at the price of two copies of
    /// the row (counted in `DsmCounters::rows_lent_by_copy`).
    ///
    /// Outside a plain-store view nothing refuses another path to the row
    /// while `f` runs: a checked read of it sees the row as it was before
    /// `f`, and a checked store into an element `f` also changes is
    /// overwritten when the copy is stored back. Write the row only
    /// through the slice.
    ///
    /// While `f` runs, the row is `f`'s: the view is borrowed, and in a
    /// plain-store view a checked access to the row (`DsmMatrix::get`,
    /// `row_mut`, ...) or a new view over it panics, naming this method.
    ///
    /// ```
    /// use hyfi::{Config, Control, PoolArray, Program, Runtime};
    /// let rt = Runtime::new(Config::new().procs(2).pin(false))?;
    /// let dsm = hyfi::Dsm::new(&rt)?;
    /// let n = 64;
    /// let x = dsm.matrix::<f64>(n, n).from_fn(|i, j| (i * n + j) as f64)?;
    /// let p = dsm.matrix::<f64>(n, n).from_fn(|_, j| j as f64)?;
    /// let mut prog = Program::new();
    /// prog.phase_with(
    ///     PoolArray::block(&rt, 0..n, 1),
    ///     |ctx, span| (p.read_rows(ctx, span.rows()), x.write_rows(ctx, span.rows())),
    ///     |_ctx, i, (p, x)| {
    ///         let p = p.row(i);
    ///         x.with_row(i, |row| {
    ///             for (x, &y) in row.iter_mut().zip(p) {
    ///                 *x += 0.5 * y;
    ///             }
    ///         });
    ///     },
    ///     |post| if post.iteration() < 3 { Control::Continue } else { Control::Done },
    /// );
    /// rt.start(&mut prog)?;
    /// drop(prog);
    /// // Four executions: the first lent copies, the next three the rows.
    /// assert_eq!(x.get(3, 5), (3 * n + 5) as f64 + 4.0 * 0.5 * 5.0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline(always)]
    pub fn with_row<R>(&mut self, i: usize, f: impl FnOnce(&mut [T]) -> R) -> R {
        let k = self.f.row_offset("write", i);
        let p = self.f.ptr.cast::<T>().wrapping_add(k);
        let first = self.lender.origin + i * self.f.stride;
        // SAFETY: row `i` is inside the footprint (checked above), so its
        // `cols` elements are valid for reads and writes while the view
        // lives, and the view is borrowed mutably for the call.
        unsafe { lend(p, self.f.cols, first, self.f.plain(), &self.lender, f) }
    }
}

/// What a write view needs to lend its elements as a `&mut [T]`
/// ([`WriteRows::with_row`], [`WriteRange::with_slice`]): the array's
/// plain-store state, and where the array starts in its segment (the
/// units of claims and loans). Plain references: the views a segment
/// binds must stay values without drop glue (see [`Frame`]'s `live`).
#[derive(Clone, Copy)]
pub(crate) struct Lender<'a> {
    pub(crate) plain: &'a crate::plain::PlainState,
    pub(crate) origin: usize,
    /// For the count of rows lent as copies.
    pub(crate) core: &'a Core,
}

/// Lends the `len` elements at `p`, elements `first..first + len` of the
/// array's segment, to `f` as a `&mut [T]`: the shared elements
/// themselves in a plain-store view whose epoch allows it (the argument is
/// on [`crate::plain::Loan`]), else a copy whose changed elements are
/// stored back when `f` returns (plainly in a plain-store view, where no
/// other thread touches them; else atomically, and only those `f` changed,
/// so that another filament's stores into the rest of an overlapping
/// footprint are not undone).
///
/// # Safety
/// The elements are valid for reads and writes while the calling view
/// lives, the view is borrowed mutably for the call, and `plain` is the
/// view's mode.
#[inline(always)]
unsafe fn lend<T: Pod, R>(
    p: *mut T,
    len: usize,
    first: usize,
    plain: bool,
    lender: &Lender<'_>,
    f: impl FnOnce(&mut [T]) -> R,
) -> R {
    let state = lender.plain;
    if plain && state.lendable() {
        let _loan = crate::plain::Loan::new(state, first..first + len, true);
        // SAFETY: valid (the caller's contract); nothing else reads or
        // writes these elements while the slice lives (`Loan`).
        f(std::slice::from_raw_parts_mut(p, len))
    } else {
        lend_copy(p, len, first, plain, lender, f)
    }
}

/// [`lend`] by copy.
///
/// # Safety
/// As for [`lend`].
#[inline(never)]
unsafe fn lend_copy<T: Pod, R>(
    p: *mut T,
    len: usize,
    first: usize,
    plain: bool,
    lender: &Lender<'_>,
    f: impl FnOnce(&mut [T]) -> R,
) -> R {
    lender.core.count_lent_copy();
    // In a plain-store epoch the elements are lent all the same: a checked
    // access to them from `f` panics, as with the shared bytes.
    let _loan = plain.then(|| crate::plain::Loan::new(lender.plain, first..first + len, false));
    let mut buf = vec![T::zeroed(); 2 * len];
    let (row, old) = buf.split_at_mut(len);
    // SAFETY: valid for reads (the caller's contract), read as units.
    elem::load_run(p, row);
    old.copy_from_slice(row);
    let r = f(row);
    for (j, (new, old)) in row.iter().zip(old.iter()).enumerate() {
        if bytemuck::bytes_of(new) != bytemuck::bytes_of(old) {
            // SAFETY: valid for writes; plainly only in a plain-store view.
            elem::store_as(p.add(j), *new, plain);
        }
    }
    r
}

/// One row of a [`WriteRows`] view, borrowed from it for one filament.
pub struct RowWriter<'v, T: Pod> {
    ptr: *mut T,
    cols: usize,
    row: usize,
    seq: u64,
    plain: bool,
    _v: PhantomData<(&'v T, *const ())>,
}

impl<T: Pod> RowWriter<'_, T> {
    /// Sets column `j`.
    #[inline(always)]
    pub fn set(&self, j: usize, v: T) {
        if j >= self.cols {
            self.outside(j);
        }
        // SAFETY: inside the row, which the view made writable and which
        // lives while the view it borrows does; plain only in a
        // plain-store view (see `WriteRows::set`).
        unsafe { elem::store_as(self.ptr.add(j), v, self.plain) }
    }
    /// Sets every column `j` of `cols` to `f(j)`, calling `f` once per
    /// column, in order of `j`. The same as `for j in cols { row.set(j,
    /// f(j)) }`, checked once for the whole range instead of per column,
    /// with `f` inlined (one call site, see `elem::fill`); a per-row
    /// Jacobi stencil written this way runs at the slice loop's speed. In
    /// a plain-store view ([`WriteRows::plain_stores`]) the stores are
    /// plain and a stencil without a reduction vectorises as the slice
    /// loop does (a 5-point diffusion step at 1.0× the loop, BENCHMARKS.md);
    /// otherwise they are relaxed atomics, which no loop vectorises (1.5×
    /// the loop on that stencil):
    ///
    /// ```
    /// use hyfi::{Config, Control, Op, PoolArray, Program, Runtime};
    /// let rt = Runtime::new(Config::new().procs(1))?;
    /// let dsm = hyfi::Dsm::new(&rt)?;
    /// let n = 8;
    /// let a = dsm.matrix::<f64>(n, n).from_fn(|i, j| (i * n + j) as f64)?;
    /// let b = dsm.matrix::<f64>(n, n).zeroed()?;
    /// let mut prog = Program::new();
    /// prog.phase_with(
    ///     PoolArray::block(&rt, 1..n - 1, 1),
    ///     |ctx, span| (a.read_rows(ctx, span.rows_with_halo(1, n)), b.write_rows(ctx, span.rows())),
    ///     |_ctx, i, (a, b)| {
    ///         let (up, down) = (a.row(i - 1), a.row(i + 1));
    ///         b.row_mut(i).fill(0..n, |j| (up[j] + down[j]) * 0.5);
    ///     },
    ///     |_| Control::Done,
    /// );
    /// rt.start(&mut prog)?;
    /// assert_eq!(b.get(3, 5), ((2 * n + 5) + (4 * n + 5)) as f64 * 0.5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline(always)]
    pub fn fill(&self, cols: Range<usize>, f: impl FnMut(usize) -> T) {
        self.inside(&cols);
        // SAFETY: every `j` of `cols` is inside the row (an empty range
        // writes nothing; else `cols.end <= self.cols`, checked above),
        // which the view made writable; plainly only in a plain-store view,
        // whose footprint no other thread touches (plain.rs), else every
        // element written as a unit (see `elem::fill`).
        unsafe {
            if self.plain {
                elem::fill_plain(self.ptr, cols, f)
            } else {
                elem::fill(self.ptr, cols, f)
            }
        }
    }
    /// Sets every column `j` of `cols` to `f(j, old)`, `old` being its
    /// value before, in order of `j`: [`RowWriter::fill`] for the rows a
    /// phase reads and rewrites (CG's `x += αp`, `r -= αq`), which
    /// vectorises as the slice loop does in a plain-store view, where
    /// `fill` with [`WriteRows::get`] inside loads every element
    /// atomically. Where `f` indexes data it reaches through memory (a
    /// `Vec` behind a lock guard), the compiler reloads the data's pointer
    /// per element and the loop stays scalar: take a slice of it before
    /// the call (`let rk: &[f64] = &rk;`). [`WriteRows::with_row`] lends
    /// the row itself as a `&mut [T]`, for loops written over slices:
    ///
    /// ```
    /// use hyfi::{Config, Control, PoolArray, Program, Runtime};
    /// let rt = Runtime::new(Config::new().procs(1))?;
    /// let dsm = hyfi::Dsm::new(&rt)?;
    /// let n = 8;
    /// let x = dsm.matrix::<f64>(n, n).from_fn(|i, j| (i * n + j) as f64)?;
    /// let p = dsm.matrix::<f64>(n, n).from_fn(|_, _| 1.0)?;
    /// let mut prog = Program::new();
    /// prog.phase_with(
    ///     PoolArray::block(&rt, 0..n, 1),
    ///     |ctx, span| (p.read_rows(ctx, span.rows()), x.write_rows(ctx, span.rows())),
    ///     |_ctx, i, (p, x)| {
    ///         let p = p.row(i);
    ///         x.row_mut(i).update(0..n, |j, old| old + 0.5 * p[j]);
    ///     },
    ///     |_| Control::Done,
    /// );
    /// rt.start(&mut prog)?;
    /// assert_eq!(x.get(3, 5), (3 * n + 5) as f64 + 0.5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline(always)]
    pub fn update(&self, cols: Range<usize>, f: impl FnMut(usize, T) -> T) {
        self.inside(&cols);
        // SAFETY: as for `fill`: every `j` of `cols` is inside the row,
        // which the view made readable and writable (a write view's rows
        // are valid here: `WriteRows::get` reads them too); plainly only
        // in a plain-store view, whose footprint no other thread reads or
        // writes (plain.rs), else every element loaded and stored as a
        // unit.
        unsafe {
            if self.plain {
                elem::fill_update_plain(self.ptr, cols, f)
            } else {
                elem::fill_update(self.ptr, cols, f)
            }
        }
    }
    /// Panics unless every column of `cols` is inside the row (an empty
    /// range is).
    #[inline(always)]
    fn inside(&self, cols: &Range<usize>) {
        if cols.start < cols.end && cols.end > self.cols {
            // The first column the loop would write outside the row.
            self.outside(cols.start.max(self.cols));
        }
    }
    /// Panics: column `j` is outside the row.
    #[cold]
    #[inline(never)]
    fn outside(&self, j: usize) -> ! {
        let shape = Shape {
            first: self.row,
            rows: 1,
            cols: self.cols,
            vector: false,
        };
        outside("write", self.seq, (self.row, j), shape)
    }
    /// Columns in the row. Asserting `row.len() >= n` before a loop over
    /// `0..n` lets the compiler drop `set`'s check from the loop.
    #[inline(always)]
    pub fn len(&self) -> usize {
        self.cols
    }
    /// Whether the row has no columns.
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.cols == 0
    }
}

/// Elements of a shared vector that this segment's filaments write:
/// `set(i, v)`, `write_slice(start, &src)`. Made by
/// [`DsmVec::write_range`](crate::DsmVec::write_range); as [`WriteRows`].
pub struct WriteRange<'a, T: Pod> {
    f: Frame,
    lender: Lender<'a>,
    _a: PhantomData<(&'a T, *const ())>,
}

impl<'a, T: Pod> WriteRange<'a, T> {
    /// A view over `f`, made for this kind of view (see [`Frame::new`]).
    pub(crate) fn new(f: Frame, lender: Lender<'a>) -> Self {
        WriteRange {
            f,
            lender,
            _a: PhantomData,
        }
    }

    /// The elements of the footprint.
    pub fn range(&self) -> Range<usize> {
        self.f.first..self.f.first + self.f.rows
    }

    #[inline(always)]
    fn ptr_at(&self, i: usize) -> *mut T {
        let k = self.f.element("write", i);
        self.f.ptr.cast::<T>().wrapping_add(k)
    }

    /// Sets element `i` (absolute index); panics outside the footprint.
    #[inline(always)]
    pub fn set(&self, i: usize, v: T) {
        let p = self.ptr_at(i);
        // SAFETY: inside the footprint, writable here; plain only in a
        // plain-store view (see `WriteRows::set`).
        unsafe { elem::store_as(p, v, self.f.plain()) }
    }

    /// Whether this view stores plainly: see [`WriteRows::plain_stores`].
    pub fn plain_stores(&self) -> bool {
        self.f.plain()
    }

    /// Element `i` (an atomic load).
    #[inline(always)]
    pub fn get(&self, i: usize) -> T {
        let p = self.ptr_at(i);
        // SAFETY: inside the footprint, valid here; atomic.
        unsafe { elem::load(p) }
    }

    /// Sets every element `i` of `range` (absolute indices) to `f(i)`,
    /// calling `f` once per element, in order: `for i in range { view.set(i,
    /// f(i)) }` checked once for the whole range, with `f` inlined, and
    /// vectorised as a slice loop is when the view stores plainly (see
    /// [`RowWriter::fill`]).
    ///
    /// ```
    /// use hyfi::{Config, Control, PoolArray, Program, Runtime};
    /// let rt = Runtime::new(Config::new().procs(2).pin(false))?;
    /// let dsm = hyfi::Dsm::new(&rt)?;
    /// let n = 10_000;
    /// let x = dsm.vec::<f64>(n).from_fn(|i| i as f64)?;
    /// let y = dsm.vec::<f64>(n).zeroed()?;
    /// let mut prog = Program::new();
    /// prog.phase_with(
    ///     // One filament per block of 1000 elements: y = 3-point average of x.
    ///     PoolArray::block(&rt, 0..n / 1000, 1),
    ///     |ctx, span| {
    ///         let r = span.rows().start * 1000..span.rows().end * 1000;
    ///         (x.read_range(ctx, r.start.saturating_sub(1)..(r.end + 1).min(n)), y.write_range(ctx, r))
    ///     },
    ///     |_ctx, b, (x, y)| {
    ///         let lo = (b * 1000).max(1);
    ///         let hi = ((b + 1) * 1000).min(n - 1);
    ///         y.fill(lo..hi, |i| (x[i - 1] + x[i] + x[i + 1]) / 3.0);
    ///     },
    ///     |_| Control::Done,
    /// );
    /// rt.start(&mut prog)?;
    /// assert_eq!(y.get(500), 500.0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline(always)]
    pub fn fill(&self, range: Range<usize>, f: impl FnMut(usize) -> T) {
        let Some(base) = self.base_for(&range) else {
            return;
        };
        // SAFETY: every `i` of `range` is inside the footprint (both ends
        // checked above), so `base + i` is an element of it, writable here
        // (`base` is the vector's first element, in the same region);
        // plainly only in a plain-store view (plain.rs), else atomically.
        unsafe {
            if self.f.plain() {
                elem::fill_plain(base, range, f)
            } else {
                elem::fill(base, range, f)
            }
        }
    }

    /// Sets every element `i` of `range` to `f(i, old)`, `old` being its
    /// value before: [`WriteRange::fill`] for a read-modify-write, as
    /// [`RowWriter::update`] is for a row.
    ///
    /// ```
    /// use hyfi::{Config, Control, PoolArray, Program, Runtime};
    /// let rt = Runtime::new(Config::new().procs(1))?;
    /// let dsm = hyfi::Dsm::new(&rt)?;
    /// let y = dsm.vec::<f64>(100).from_fn(|i| i as f64)?;
    /// let mut prog = Program::new();
    /// prog.phase_with(
    ///     PoolArray::block(&rt, 0..1, 1),
    ///     |ctx, _span| y.write_range(ctx, 0..100),
    ///     |_ctx, _, y| y.update(0..100, |_, old| 2.0 * old),
    ///     |_| Control::Done,
    /// );
    /// rt.start(&mut prog)?;
    /// assert_eq!(y.get(21), 42.0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline(always)]
    pub fn update(&self, range: Range<usize>, f: impl FnMut(usize, T) -> T) {
        let Some(base) = self.base_for(&range) else {
            return;
        };
        // SAFETY: as for `fill`; the footprint is readable here too (a
        // write view's elements are valid: `get` reads them).
        unsafe {
            if self.f.plain() {
                elem::fill_update_plain(base, range, f)
            } else {
                elem::fill_update(base, range, f)
            }
        }
    }

    /// Element 0 of the vector, so that a loop's index is the range's own
    /// induction variable (see `elem::fill`), once both ends of `range`
    /// are checked inside the footprint (so the whole range is); `None`
    /// for an empty range.
    #[inline(always)]
    fn base_for(&self, range: &Range<usize>) -> Option<*mut T> {
        if range.is_empty() {
            return None;
        }
        let _ = self.ptr_at(range.start);
        let _ = self.ptr_at(range.end - 1);
        Some(self.f.ptr.cast::<T>().wrapping_sub(self.f.first))
    }

    /// Writes `src` at element `start`.
    pub fn write_slice(&self, start: usize, src: &[T]) {
        if src.is_empty() {
            return;
        }
        let _ = self.ptr_at(start + src.len() - 1);
        let p0 = self.ptr_at(start);
        // SAFETY: inside the footprint (both ends checked), writable; every
        // element written as a unit (see `elem::store_run`).
        unsafe { elem::store_run(p0, src) }
    }

    /// Elements `r` (absolute indices, inside the footprint) as a `&mut
    /// [T]` for `f`: [`WriteRows::with_row`] for a vector, with the same
    /// rules (the shared elements themselves in a plain-store view, else a
    /// copy whose changed elements are stored back).
    ///
    /// ```
    /// use hyfi::{Config, Control, PoolArray, Program, Runtime};
    /// let rt = Runtime::new(Config::new().procs(1))?;
    /// let dsm = hyfi::Dsm::new(&rt)?;
    /// let v = dsm.vec::<f64>(1000).from_fn(|i| i as f64)?;
    /// let mut prog = Program::new();
    /// prog.phase_with(
    ///     PoolArray::block(&rt, 0..1, 1),
    ///     |ctx, _span| v.write_range(ctx, 0..1000),
    ///     |_ctx, _, v| v.with_slice(0..1000, |s| s.iter_mut().for_each(|x| *x *= 2.0)),
    ///     |_| Control::Done,
    /// );
    /// rt.start(&mut prog)?;
    /// assert_eq!(v.get(999), 1998.0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline(always)]
    pub fn with_slice<R>(&mut self, r: Range<usize>, f: impl FnOnce(&mut [T]) -> R) -> R {
        if r.start >= r.end {
            return f(&mut []);
        }
        let _ = self.f.element("write", r.end - 1);
        let k = self.f.element("write", r.start);
        let p = self.f.ptr.cast::<T>().wrapping_add(k);
        let first = self.lender.origin + r.start;
        // SAFETY: both ends inside the footprint (checked above), so every
        // element is valid for reads and writes while the view lives; the
        // view is borrowed mutably for the call.
        unsafe { lend(p, r.len(), first, self.f.plain(), &self.lender, f) }
    }
}
