//! Node-local shared arrays: vectors and matrices that every filament of the
//! node may read and write concurrently, soundly.
//!
//! Elements are stored as atomics and accessed with `Relaxed` loads and
//! stores, which compile to plain moves on x86-64 and AArch64: a filament
//! writing element `(i, j)` while another writes `(i, j+1)` is not undefined
//! behaviour, and a racy read returns some written value, never garbage.
//! Ordering between phases comes from the phase barrier.
//!
//! These arrays are the single-node runtime's own, for its documentation,
//! tests and benchmarks, which cannot depend on the shared-memory layer
//! above it. Programs have one family of shared arrays, the DSM's
//! (`hyfi::DsmVec`, `hyfi::DsmMatrix`; the facade does not re-export these):
//! on one node they move nothing, and through footprint views they cost
//! what a plain slice loop costs, less than these arrays' checked,
//! per-element accessors.
//!
//! ```
//! use hyfi_core::SharedMatrix;
//! let m = SharedMatrix::from_fn(2, 3, |i, j| (i * 3 + j) as f64);
//! m.set(1, 2, 9.5);
//! assert_eq!(m.get(1, 2), 9.5);
//! assert_eq!(m.row(0).to_vec(), vec![0.0, 1.0, 2.0]);
//! ```

use std::sync::atomic::{
    AtomicI16, AtomicI32, AtomicI64, AtomicI8, AtomicIsize, AtomicU16, AtomicU32, AtomicU64,
    AtomicU8, AtomicUsize, Ordering::Relaxed,
};

mod sealed {
    pub trait Sealed {}
}

/// Element types of shared arrays: the primitive numbers.
pub trait Element:
    Copy + Send + Sync + Default + PartialEq + std::fmt::Debug + 'static + sealed::Sealed
{
    #[doc(hidden)]
    type Atom: Send + Sync;
    #[doc(hidden)]
    fn atom(v: Self) -> Self::Atom;
    #[doc(hidden)]
    fn load(a: &Self::Atom) -> Self;
    #[doc(hidden)]
    fn store(a: &Self::Atom, v: Self);
}

macro_rules! element_int {
    ($($t:ty => $a:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            type Atom = $a;
            #[inline(always)] fn atom(v: Self) -> $a { <$a>::new(v) }
            #[inline(always)] fn load(a: &$a) -> Self { a.load(Relaxed) }
            #[inline(always)] fn store(a: &$a, v: Self) { a.store(v, Relaxed) }
        }
    )*};
}
element_int!(i8 => AtomicI8, i16 => AtomicI16, i32 => AtomicI32, i64 => AtomicI64,
    isize => AtomicIsize, u8 => AtomicU8, u16 => AtomicU16, u32 => AtomicU32,
    u64 => AtomicU64, usize => AtomicUsize);

macro_rules! element_float {
    ($($t:ty => $a:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            type Atom = $a;
            #[inline(always)] fn atom(v: Self) -> $a { <$a>::new(v.to_bits()) }
            #[inline(always)] fn load(a: &$a) -> Self { <$t>::from_bits(a.load(Relaxed)) }
            #[inline(always)] fn store(a: &$a, v: Self) { a.store(v.to_bits(), Relaxed) }
        }
    )*};
}
element_float!(f64 => AtomicU64, f32 => AtomicU32);

/// A shared vector of `len` elements.
pub struct SharedVec<T: Element> {
    data: Box<[T::Atom]>,
}

impl<T: Element> SharedVec<T> {
    /// `len` elements, each `T::default()`.
    pub fn new(len: usize) -> Self {
        Self::from_fn(len, |_| T::default())
    }
    /// Element `i` is `f(i)`.
    pub fn from_fn(len: usize, mut f: impl FnMut(usize) -> T) -> Self {
        SharedVec {
            data: (0..len).map(|i| T::atom(f(i))).collect(),
        }
    }
    /// A copy of `v`.
    pub fn from_slice(v: &[T]) -> Self {
        Self::from_fn(v.len(), |i| v[i])
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }
    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
    /// Element `i`.
    #[inline(always)]
    pub fn get(&self, i: usize) -> T {
        T::load(&self.data[i])
    }
    /// Sets element `i`.
    #[inline(always)]
    pub fn set(&self, i: usize, v: T) {
        T::store(&self.data[i], v)
    }
    /// A copy of all elements.
    pub fn to_vec(&self) -> Vec<T> {
        self.data.iter().map(T::load).collect()
    }
}

/// A shared row-major matrix.
pub struct SharedMatrix<T: Element> {
    rows: usize,
    cols: usize,
    data: Box<[T::Atom]>,
}

impl<T: Element> SharedMatrix<T> {
    /// `rows × cols` elements, each `T::default()`.
    pub fn new(rows: usize, cols: usize) -> Self {
        Self::from_fn(rows, cols, |_, _| T::default())
    }
    /// Element `(i, j)` is `f(i, j)`.
    pub fn from_fn(rows: usize, cols: usize, mut f: impl FnMut(usize, usize) -> T) -> Self {
        let n = rows
            .checked_mul(cols)
            .expect("hyfi: matrix size overflows usize");
        SharedMatrix {
            rows,
            cols,
            data: (0..n)
                .map(|k| T::atom(f(k / cols.max(1), k % cols.max(1))))
                .collect(),
        }
    }
    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Number of columns.
    pub fn cols(&self) -> usize {
        self.cols
    }
    #[inline(always)]
    fn at(&self, i: usize, j: usize) -> &T::Atom {
        if i >= self.rows || j >= self.cols {
            out_of_bounds(i, j, self.rows, self.cols);
        }
        // SAFETY: i < rows and j < cols, so i * cols + j < rows * cols = data.len().
        unsafe { self.data.get_unchecked(i * self.cols + j) }
    }
    /// Element `(i, j)`.
    #[inline(always)]
    pub fn get(&self, i: usize, j: usize) -> T {
        T::load(self.at(i, j))
    }
    /// Sets element `(i, j)`.
    #[inline(always)]
    pub fn set(&self, i: usize, j: usize, v: T) {
        T::store(self.at(i, j), v)
    }
    /// Row `i`.
    #[inline(always)]
    pub fn row(&self, i: usize) -> Row<'_, T> {
        assert!(
            i < self.rows,
            "hyfi: row {i} out of a {}-row matrix",
            self.rows
        );
        Row {
            data: &self.data[i * self.cols..(i + 1) * self.cols],
        }
    }
    /// A copy of all elements, row-major.
    pub fn to_vec(&self) -> Vec<T> {
        self.data.iter().map(T::load).collect()
    }
}

#[cold]
#[inline(never)]
fn out_of_bounds(i: usize, j: usize, rows: usize, cols: usize) -> ! {
    panic!("hyfi: index ({i}, {j}) out of a {rows}×{cols} matrix")
}

/// One row of a [`SharedMatrix`].
#[derive(Clone, Copy)]
pub struct Row<'a, T: Element> {
    data: &'a [T::Atom],
}

impl<T: Element> Row<'_, T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }
    /// Whether the row is empty.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
    /// Element `j`.
    #[inline(always)]
    pub fn get(&self, j: usize) -> T {
        T::load(&self.data[j])
    }
    /// Sets element `j`.
    #[inline(always)]
    pub fn set(&self, j: usize, v: T) {
        T::store(&self.data[j], v)
    }
    /// A copy of the row.
    pub fn to_vec(&self) -> Vec<T> {
        self.data.iter().map(T::load).collect()
    }
    /// Copies the row into `out` (same length).
    pub fn copy_to(&self, out: &mut [T]) {
        assert_eq!(
            out.len(),
            self.data.len(),
            "hyfi: copy_to needs a slice of the row's length"
        );
        for (o, a) in out.iter_mut().zip(self.data) {
            *o = T::load(a);
        }
    }
    /// Copies `src` into the row (same length).
    pub fn copy_from(&self, src: &[T]) {
        assert_eq!(
            src.len(),
            self.data.len(),
            "hyfi: copy_from needs a slice of the row's length"
        );
        for (s, a) in src.iter().zip(self.data) {
            T::store(a, *s);
        }
    }
}
