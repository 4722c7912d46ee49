//! Reduction variables (paper §3.4): one private copy per processor, combined
//! by post-phase code with [`PostPhase::reduce`](crate::PostPhase::reduce).
//!
//! Filaments read and write their processor's copy through the [`Ctx`] they
//! are given, with no synchronization: a copy belongs to one server thread,
//! and copies sit on separate cache lines. A reduce combines the copies in
//! processor order on the node, then across nodes in node order, and writes
//! the result back into every copy, so a given configuration reproduces its
//! result bit for bit.
//!
//! A reduction of a type of your own (here: the largest value and where it
//! is, lowest index on ties, as a sequential scan would find it):
//!
//! ```
//! use hyfi_core::{bytemuck, Config, Control, PoolArray, Program, Runtime};
//!
//! #[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
//! #[bytemuck(crate = "hyfi_core::bytemuck")]
//! #[repr(C)]
//! struct ArgMax { value: f64, index: u64 }
//!
//! fn better(a: ArgMax, b: ArgMax) -> ArgMax {
//!     if b.value > a.value || (b.value == a.value && b.index < a.index) { b } else { a }
//! }
//! let f = |i: usize| ((i * 37) % 101) as f64;
//! let rt = Runtime::new(Config::new().procs(2).pin(false)).unwrap();
//! let best = rt.reduction(ArgMax { value: f64::MIN, index: u64::MAX });
//! let mut found = None;
//! let mut prog = Program::new();
//! prog.phase(
//!     PoolArray::block(&rt, 0..1000, 1),
//!     |ctx, i| best.update(ctx, |b| better(b, ArgMax { value: f(i), index: i as u64 })),
//!     |post| { found = Some(post.reduce_with(&best, better)); Control::Done },
//! );
//! rt.start(&mut prog).unwrap();
//! drop(prog);
//! let seq = (0..1000).fold(ArgMax { value: f64::MIN, index: u64::MAX }, |b, i| better(b, ArgMax { value: f(i), index: i as u64 }));
//! assert_eq!(found, Some(seq));
//! ```

use std::cell::UnsafeCell;

use crossbeam_utils::CachePadded;

use crate::error::Error;
use crate::worker::Ctx;

/// A reduction variable of plain-data type `T`.
pub struct Reduction<T> {
    rt: u64,
    copies: Box<[CachePadded<UnsafeCell<T>>]>,
}

// SAFETY: copy `p` is accessed only by server thread `p` (through a Ctx,
// whose processor index and runtime are checked), or by post-phase code and
// the Runtime while every server thread is quiescent at a barrier or idle
// between programs. T: Send lets the value move between those threads.
unsafe impl<T: Send> Sync for Reduction<T> {}
unsafe impl<T: Send> Send for Reduction<T> {}

impl<T: bytemuck::Pod + Send + Sync> Reduction<T> {
    pub(crate) fn new(rt: u64, procs: usize, init: T) -> Self {
        Reduction {
            rt,
            copies: (0..procs)
                .map(|_| CachePadded::new(UnsafeCell::new(init)))
                .collect(),
        }
    }

    pub(crate) fn check(&self, rt: u64) -> Result<(), Error> {
        if rt == self.rt {
            Ok(())
        } else {
            Err(Error::ForeignReduction)
        }
    }

    #[inline(always)]
    fn slot(&self, ctx: &Ctx) -> *mut T {
        if ctx.rt_id != self.rt {
            foreign();
        }
        // SAFETY: the runtime that made this reduction has exactly
        // `copies.len()` processors, and ctx belongs to it (checked above),
        // so ctx.proc() < copies.len().
        unsafe { self.copies.get_unchecked(ctx.proc()).get() }
    }

    /// This processor's copy (`filGetVal`).
    #[inline(always)]
    pub fn get(&self, ctx: &Ctx) -> T {
        // SAFETY: see the Sync impl: only this server thread touches its copy now.
        unsafe { *self.slot(ctx) }
    }

    /// Sets this processor's copy.
    #[inline(always)]
    pub fn set(&self, ctx: &Ctx, v: T) {
        // SAFETY: as in `get`.
        unsafe { *self.slot(ctx) = v }
    }

    /// Replaces this processor's copy `v` by `f(v)`.
    #[inline(always)]
    pub fn update(&self, ctx: &Ctx, f: impl FnOnce(T) -> T) {
        let s = self.slot(ctx);
        // SAFETY: as in `get`; the value is read out before `f` runs, so no
        // reference into the copy is alive while user code runs.
        unsafe { *s = f(*s) }
    }

    /// Folds `v` into this processor's copy with `op`: for [`Op::Max`] and
    /// [`Op::Min`] one compare (`if v > copy { copy = v }`), not the
    /// NaN-handling `f64::max` (a NaN `v` is ignored either way).
    #[inline(always)]
    pub fn fold(&self, ctx: &Ctx, op: Op, v: T)
    where
        T: Arith,
    {
        let s = self.slot(ctx);
        // SAFETY: as in `get`; no user code runs between the read and the write.
        unsafe { *s = op.fold(*s, v) }
    }

    /// A segment-local accumulator for this processor's copy: folds stay
    /// in a register, and the accumulated value is folded into the copy
    /// (with `op`) when the accumulator is dropped. Made by the `bind`
    /// closure of [`Program::phase_with`](crate::Program::phase_with), it
    /// lives for one pool segment.
    ///
    /// It starts from `op`'s identity and combines at its end, so another
    /// filthread of the processor (another pool, run while this one waits
    /// for a page) may fold into the copy meanwhile without either losing
    /// an update.
    #[inline]
    pub fn local<'r>(&'r self, ctx: &Ctx, op: Op) -> Local<'r, T>
    where
        T: Arith,
    {
        Local {
            slot: self.slot(ctx),
            acc: T::identity(op),
            op,
            _r: std::marker::PhantomData,
        }
    }

    /// # Safety
    /// No server thread may be accessing the copies.
    pub(crate) unsafe fn read(&self, p: usize) -> T {
        *self.copies[p].get()
    }

    /// # Safety
    /// As for `read`.
    pub(crate) unsafe fn write_all(&self, v: T) {
        for c in self.copies.iter() {
            *c.get() = v;
        }
    }
}

/// A segment-local accumulator of a [`Reduction`] (see
/// [`Reduction::local`]). It is neither `Send` nor `Sync`: it belongs to the
/// processor whose copy it folds into.
pub struct Local<'r, T: Arith> {
    slot: *mut T,
    acc: T,
    op: Op,
    _r: std::marker::PhantomData<(&'r Reduction<T>, *const ())>,
}

impl<T: Arith> Local<'_, T> {
    /// Folds `v` into the accumulator.
    #[inline(always)]
    pub fn fold(&mut self, v: T) {
        self.acc = self.op.fold(self.acc, v);
    }
    /// The value accumulated so far (the op's identity at first).
    #[inline]
    pub fn value(&self) -> T {
        self.acc
    }
}

impl<T: Arith> Drop for Local<'_, T> {
    fn drop(&mut self) {
        // SAFETY: `slot` is this processor's copy (taken through its Ctx),
        // and the accumulator, being !Send, is dropped on this server
        // thread; no user code runs between the read and the write.
        unsafe { *self.slot = self.op.apply(*self.slot, self.acc) }
    }
}

#[cold]
#[inline(never)]
fn foreign() -> ! {
    panic!("{}", Error::ForeignReduction)
}

impl<T: bytemuck::Pod + std::fmt::Debug> std::fmt::Debug for Reduction<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reduction")
            .field("copies", &self.copies.len())
            .finish()
    }
}

/// A failed node-level step inside post-phase code, carried out by unwinding.
pub(crate) struct LinkAbort(pub(crate) Error);

/// The built-in reduction operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Sum.
    Sum,
    /// Product.
    Product,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
}

impl Op {
    /// Applies the operator.
    #[inline]
    pub fn apply<T: Arith>(self, a: T, b: T) -> T {
        match self {
            Op::Sum => a.add(b),
            Op::Product => a.mul(b),
            Op::Max => a.max(b),
            Op::Min => a.min(b),
        }
    }

    /// Folds `v` into an accumulator `acc`: as [`Op::apply`], but
    /// [`Op::Max`]/[`Op::Min`] take `v` only if it is strictly better (one
    /// compare; a NaN `v` is ignored, as `f64::max` ignores it).
    #[inline(always)]
    pub fn fold<T: Arith>(self, acc: T, v: T) -> T {
        match self {
            Op::Sum => acc.add(v),
            Op::Product => acc.mul(v),
            Op::Max => {
                if v > acc {
                    v
                } else {
                    acc
                }
            }
            Op::Min => {
                if v < acc {
                    v
                } else {
                    acc
                }
            }
        }
    }
}

/// Numbers the built-in [`Op`]s work on.
pub trait Arith: bytemuck::Pod + Send + Sync + PartialOrd {
    /// a + b (wrapping for integers).
    fn add(self, o: Self) -> Self;
    /// a × b (wrapping for integers).
    fn mul(self, o: Self) -> Self;
    /// The larger.
    fn max(self, o: Self) -> Self;
    /// The smaller.
    fn min(self, o: Self) -> Self;
    /// The identity of `op`: 0 for sums, 1 for products, the least value
    /// (−∞ for floats) for maxima, the greatest (+∞) for minima.
    fn identity(op: Op) -> Self;
}

macro_rules! arith_int {
    ($($t:ty)*) => {$(
        impl Arith for $t {
            fn add(self, o: Self) -> Self { self.wrapping_add(o) }
            fn mul(self, o: Self) -> Self { self.wrapping_mul(o) }
            fn max(self, o: Self) -> Self { Ord::max(self, o) }
            fn min(self, o: Self) -> Self { Ord::min(self, o) }
            fn identity(op: Op) -> Self {
                match op { Op::Sum => 0, Op::Product => 1, Op::Max => <$t>::MIN, Op::Min => <$t>::MAX }
            }
        }
    )*};
}
arith_int!(i8 i16 i32 i64 i128 isize u8 u16 u32 u64 u128 usize);

macro_rules! arith_float {
    ($($t:ty)*) => {$(
        impl Arith for $t {
            fn add(self, o: Self) -> Self { self + o }
            fn mul(self, o: Self) -> Self { self * o }
            fn max(self, o: Self) -> Self { <$t>::max(self, o) }
            fn min(self, o: Self) -> Self { <$t>::min(self, o) }
            fn identity(op: Op) -> Self {
                match op { Op::Sum => 0.0, Op::Product => 1.0, Op::Max => <$t>::NEG_INFINITY, Op::Min => <$t>::INFINITY }
            }
        }
    )*};
}
arith_float!(f32 f64);
