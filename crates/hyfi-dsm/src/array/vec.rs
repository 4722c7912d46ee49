//! [`DsmVec`]: a shared vector, its checked accessors and its views.

use std::marker::PhantomData;
use std::ops::Range;
use std::sync::Arc;

use bytemuck::Pod;
use hyfi_core::{Ctx, PostPhase};

use super::*;
use crate::footprint::{ReadRange, WriteRange};

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
    #[track_caller]
    pub fn read_range<'a>(&'a self, ctx: &Ctx, r: Range<usize>) -> ReadRange<'a, T> {
        ReadRange::new(self.range_frame(ctx, r, false))
    }

    /// Elements `r` as a write view (`view.set(i, v)`), for the
    /// filaments of one pool segment: see [`DsmMatrix::write_rows`].
    #[track_caller]
    pub fn write_range<'a>(&'a self, ctx: &Ctx, r: Range<usize>) -> WriteRange<'a, T> {
        WriteRange::new(self.range_frame(ctx, r, true), self.sh.lender())
    }

    /// The footprint of a vector's view of `r` (rows of one element).
    #[track_caller]
    fn range_frame(&self, ctx: &Ctx, r: Range<usize>, write: bool) -> Frame {
        self.check_range(&r);
        self.sh
            .frame(ctx, r, 1, 1, NONE, write, std::panic::Location::caller())
    }

    /// Sends elements `r` to every node now, from their homes, because
    /// every node will read them in the next phase: see
    /// [`DsmMatrix::broadcast_rows`]. Call it in post-phase code, on every
    /// node alike.
    ///
    /// ```
    /// use hyfi::{Config, Control, PoolArray, Program, Runtime};
    /// let rt = Runtime::new(Config::new().procs(2).pin(false))?;
    /// let dsm = hyfi::Dsm::new(&rt)?;
    /// // A coefficient table every filament reads, and one result each.
    /// let coef = dsm.vec::<f64>(512).from_fn(|i| i as f64)?;
    /// let out = dsm.vec::<f64>(64).zeroed()?;
    /// let mut prog = Program::new();
    /// prog.phase(
    ///     PoolArray::block(&rt, 0..64, 1),
    ///     |ctx, i| {
    ///         let k = ctx.iteration() as usize;
    ///         out.set(i, out.get(i) + coef.get(k * 64 + i));
    ///     },
    ///     |post| {
    ///         let next = post.iteration() as usize + 1;
    ///         if next == 8 {
    ///             return Control::Done;
    ///         }
    ///         // Every node reads the next 64 coefficients next phase.
    ///         coef.broadcast(post, next * 64..(next + 1) * 64);
    ///         Control::Continue
    ///     },
    /// );
    /// rt.start(&mut prog)?;
    /// drop(prog);
    /// // out[i] = Σ_k (64k + i) = 64·28 + 8i.
    /// assert_eq!(out.get(3), (64 * 28 + 8 * 3) as f64);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn broadcast(&self, _post: &PostPhase<'_>, r: Range<usize>) {
        self.check_range(&r);
        self.sh.broadcast_rows(&r, 1, 1);
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
