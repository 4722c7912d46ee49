//! Checked views: a run of consecutive elements ([`View`], [`ViewMut`])
//! or a block of rows ([`MatrixView`]) that one filament takes, all of
//! whose pages are present, read and written with relaxed atomics. They
//! borrow the filament's `&Ctx`, so they cannot outlive it (the module
//! docs of `array` say why that makes them sound).

use std::marker::PhantomData;
use std::ops::Range;

use bytemuck::Pod;

use super::*;
use crate::elem;

/// A read-only view of consecutive elements, valid for the filament that
/// took it (all its pages are present).
///
/// A view borrows the filament's `&Ctx`, so it cannot be kept past the
/// filament (the release at the phase's end may invalidate its pages):
///
/// ```compile_fail,E0521
/// use hyfi::{Config, Control, PoolArray, Program, Runtime};
/// use std::sync::Mutex;
/// let rt = Runtime::new(Config::new().procs(1))?;
/// let dsm = hyfi::Dsm::new(&rt)?;
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
/// ```compile_fail,E0277
/// fn send<T: Send>(_: T) {}
/// fn f(v: hyfi::View<'_, f64>) { send(v) }
/// ```
pub struct View<'a, T: Pod> {
    pub(super) ptr: *const T,
    pub(super) len: usize,
    pub(super) _life: PhantomData<(&'a T, *const ())>,
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
        // SAFETY: as in get, for every element of the run.
        unsafe { elem::load_run(self.ptr, out) }
    }
    /// Copies elements `start..start + out.len()` of the view into `out`.
    pub fn copy_range_to(&self, start: usize, out: &mut [T]) {
        if start > self.len || out.len() > self.len - start {
            view_oob(start + out.len(), self.len);
        }
        // SAFETY: in bounds (checked above); valid as in `get`.
        unsafe { elem::load_run(self.ptr.add(start), out) }
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
    pub(super) fn new(ptr: *mut T, len: usize) -> Self {
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
        // SAFETY: in bounds (checked above); writable as in `set`.
        unsafe { elem::store_run(self.view.ptr.cast_mut().add(start), src) }
    }
    /// Updates elements `start..start + src.len()` in place, one pass:
    /// element `start + k` becomes `f(element, src[k])` (a row update such
    /// as LU's `a[i][j] -= l * a[p][j]`, with the bounds checked once).
    #[inline]
    pub fn update_range(&self, start: usize, src: &[T], f: impl Fn(T, T) -> T) {
        if start > self.len || src.len() > self.len - start {
            view_oob(start + src.len(), self.len);
        }
        // SAFETY: in bounds (checked above); writable as in `set`; every
        // element read and written as a unit (see `elem::update`).
        unsafe { elem::update(self.view.ptr.cast_mut().add(start), src, f) }
    }
    /// Copies `src` (same length) into the view.
    pub fn copy_from(&self, src: &[T]) {
        assert_eq!(src.len(), self.len, "hyfi-dsm: copy_from length mismatch");
        // SAFETY: as in set, for every element of the run.
        unsafe { elem::store_run(self.view.ptr.cast_mut(), src) }
    }
}

/// A read view of a block of rows, for one filament.
pub struct MatrixView<'a, T: Pod> {
    pub(super) ptr: *const T,
    pub(super) rows: Range<usize>,
    pub(super) cols: usize,
    pub(super) stride: usize,
    pub(super) _life: PhantomData<(&'a T, *const ())>,
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
