//! Exact floating-point sums: the same bits on every configuration.
//!
//! A floating-point sum depends on the order of its additions, so
//! `Op::Sum` over `f64` gives one answer on 1×1 and another on 2×2 (each
//! is reproducible, but they differ), as rayon's sums differ by thread
//! count and `MPI_Allreduce`'s by rank count. An [`ExactSum`] does not:
//! every value is added *exactly* into a fixed-point accumulator wide enough
//! for the whole `f64` range (an [`ExactAccumulator`], a "superaccumulator"
//! after Kulisch, Neal and Collange et al.), private copies are combined by
//! integer addition, which is associative, and the total is rounded to
//! nearest-even once, at the end. The result is the correctly rounded exact
//! sum: bit-identical on every number of nodes, processors and pools, on
//! every run, in every order.
//!
//! The accumulator holds 68 signed 64-bit limbs, each standing for 32 bits
//! of a two's-complement fixed-point number whose least bit is 2⁻¹⁰⁷⁴ (the
//! smallest subnormal) and which reaches past 2¹⁰²⁴. Adding a value touches
//! three limbs; carries between limbs are deferred (each limb has 31 bits
//! of headroom) and propagated once every 2³⁰ additions, when two
//! accumulators are combined, and when the sum is read.
//!
//! Special values: any NaN, or both +∞ and −∞, give NaN; otherwise +∞ or −∞
//! if one was added, or if the finite total rounds beyond `f64::MAX`. An
//! exact zero is `+0.0` (as `Op::Sum` from `0.0` gives).
//!
//! Used as a reduction ([`Runtime::exact_sum`](crate::Runtime::exact_sum)),
//! it has the semantics of [`Reduction`] with `Op::Sum`:
//! each pool of each processor has a private copy that filaments
//! [`fold`](ExactSum::fold) into; [`PostPhase::reduce_exact`] combines all
//! copies on all nodes, stores the total in every copy and returns it
//! rounded; reset with [`PostPhase::set_exact`] before the next phase adds
//! to it. Since the combination is exact, fork-join filaments that share a
//! processor's copy also give the same bits whatever the stealing did.
//!
//! ```
//! use hyfi::{Config, Control, ExactAccumulator, PoolArray, Program, Runtime};
//!
//! // 1e16 + 1 − 1e16 + …: in f64, the 1s vanish or not depending on order.
//! let x = |i: usize| match i % 3 { 0 => 1e16, 1 => 1.0, _ => -1e16 };
//! let rt = Runtime::new(Config::new().procs(2).pin(false)).unwrap();
//! let total = rt.exact_sum();
//! let mut sum = f64::NAN;
//! let mut prog = Program::new();
//! prog.phase(
//!     PoolArray::block(&rt, 0..3000, 3),
//!     |ctx, i| total.fold(ctx, x(i)),
//!     |post| {
//!         sum = post.reduce_exact(&total);
//!         post.set_exact(&total, 0.0); // as `post.set(&r, 0.0)` for Op::Sum
//!         Control::Done
//!     },
//! );
//! rt.start(&mut prog).unwrap();
//! drop(prog);
//! assert_eq!(sum, 1000.0);
//! // The same bits sequentially, in any order.
//! let mut acc = ExactAccumulator::new();
//! (0..3000).rev().for_each(|i| acc.add(x(i)));
//! assert_eq!(acc.value().to_bits(), sum.to_bits());
//! ```
//!
//! [`PostPhase::reduce_exact`]: crate::PostPhase::reduce_exact
//! [`PostPhase::set_exact`]: crate::PostPhase::set_exact

use crate::reduce::Reduction;
use crate::sched::Ctx;

/// Limbs in groups of 4: `[[i64; 4]; 17]` is `Pod` without bytemuck's
/// const-generic arrays, and flattens to 68 limbs.
const GROUPS: usize = 17;
/// Limbs: 32 bits each, 2176 bits in all. A value's bits lie within bits
/// 0..2098 (2⁻¹⁰⁷⁴ to just below 2¹⁰²⁴); the rest hold carries and sign.
const LIMBS: usize = GROUPS * 4;
/// Additions between carry propagations: each adds less than 2³² to a
/// limb in [0, 2³²) after a propagation, so limbs stay below 2⁶² + 2³².
const ROOM: i64 = 1 << 30;
const DIGIT: i64 = 0xffff_ffff;

const NAN: u64 = 1;
const POS_INF: u64 = 2;
const NEG_INF: u64 = 4;

/// An exact sum of `f64` values, rounded to nearest-even only when read.
///
/// `add` is a few integer instructions; `merge` adds two accumulators
/// exactly; [`value`](ExactAccumulator::value) is the correctly rounded
/// total (see the [module docs](self) for NaN and infinities). Addition in
/// any order, split over any number of accumulators merged in any order,
/// gives the same bits.
///
/// ```
/// use hyfi::ExactAccumulator;
///
/// let mut a = ExactAccumulator::new();
/// for x in [1e16, 1.0, -1e16] { a.add(x); }
/// assert_eq!(a.value(), 1.0); // plain f64 addition gives 0.0
/// let mut b = ExactAccumulator::from(0.1);
/// b.merge(&a);
/// assert_eq!(b.value(), 1.1);
/// ```
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct ExactAccumulator {
    /// Limb `i` weighs 2^(32 i − 1074). Between propagations a limb may
    /// exceed 32 bits or be negative; after one, limbs 0..67 are in
    /// [0, 2³²) and limb 67 carries the sign.
    limbs: [[i64; 4]; GROUPS],
    /// Additions left before carries must be propagated.
    room: i64,
    /// NAN | POS_INF | NEG_INF: which special values were added.
    special: u64,
}

impl Default for ExactAccumulator {
    fn default() -> Self {
        Self::new()
    }
}

impl From<f64> for ExactAccumulator {
    fn from(v: f64) -> Self {
        let mut a = Self::new();
        a.add(v);
        a
    }
}

impl std::fmt::Debug for ExactAccumulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ExactAccumulator")
            .field(&self.value())
            .finish()
    }
}

impl ExactAccumulator {
    /// An empty sum (value `+0.0`).
    pub const fn new() -> Self {
        ExactAccumulator {
            limbs: [[0; 4]; GROUPS],
            room: ROOM,
            special: 0,
        }
    }

    #[inline(always)]
    fn limbs(&self) -> &[i64; LIMBS] {
        // GROUPS × 4 = LIMBS: the conversion cannot fail and compiles away.
        self.limbs
            .as_flattened()
            .try_into()
            .expect("GROUPS * 4 limbs")
    }

    #[inline(always)]
    fn limbs_mut(&mut self) -> &mut [i64; LIMBS] {
        self.limbs
            .as_flattened_mut()
            .try_into()
            .expect("GROUPS * 4 limbs")
    }

    /// Adds `v` exactly.
    #[inline(always)]
    pub fn add(&mut self, v: f64) {
        let bits = v.to_bits();
        let exp = ((bits >> 52) & 0x7ff) as usize;
        if exp == 0x7ff {
            self.add_special(bits);
            return;
        }
        // v = ±m · 2^(p − 1074): normal numbers carry the hidden bit and
        // p = exp − 1; subnormals (exp 0) have p = 0, as exp 1 does.
        // Branch-free: signs and subnormals are data, not control flow
        // (a random sign mispredicted costs more than the whole add).
        let m = bits & ((1 << 52) - 1) | ((exp != 0) as u64) << 52;
        let p = exp.saturating_sub(1);
        // m < 2⁵³ shifted by < 32 lies in 85 bits: three 32-bit digits,
        // negated (x ^ s) − s when the sign s is all ones.
        let wide = (m as u128) << (p & 31);
        let s = (bits as i64) >> 63;
        let digit = |d: u64| (d as i64 ^ s) - s;
        let i = p >> 5; // ≤ 2045 / 32 = 63, so i + 2 < LIMBS
        let l = self.limbs_mut();
        l[i] += digit(wide as u64 & DIGIT as u64);
        l[i + 1] += digit((wide >> 32) as u64 & DIGIT as u64);
        l[i + 2] += digit((wide >> 64) as u64);
        self.room -= 1;
        if self.room == 0 {
            self.propagate();
        }
    }

    #[cold]
    #[inline(never)]
    fn add_special(&mut self, bits: u64) {
        self.special |= if bits & ((1 << 52) - 1) != 0 {
            NAN
        } else if bits >> 63 != 0 {
            NEG_INF
        } else {
            POS_INF
        };
    }

    /// Adds every value of `xs`.
    pub fn add_all(&mut self, xs: &[f64]) {
        for &x in xs {
            self.add(x);
        }
    }

    /// Adds the sum held by `other`, exactly.
    pub fn merge(&mut self, other: &ExactAccumulator) {
        self.propagate();
        let mut o = *other;
        o.propagate();
        for (a, b) in self.limbs_mut().iter_mut().zip(o.limbs()) {
            *a += b;
        }
        self.special |= o.special;
        self.propagate();
    }

    /// Carries every limb's excess into the next: limbs 0..67 end in
    /// [0, 2³²), the top limb holds the rest, with the sign.
    #[cold]
    #[inline(never)]
    fn propagate(&mut self) {
        let l = self.limbs_mut();
        for i in 0..LIMBS - 1 {
            let carry = l[i] >> 32; // arithmetic: floor division by 2³²
            l[i] &= DIGIT;
            l[i + 1] += carry;
        }
        self.room = ROOM;
    }

    /// Whether the exact finite part is zero (special values aside).
    pub fn is_zero(&self) -> bool {
        let mut a = *self;
        a.propagate();
        a.limbs().iter().all(|&d| d == 0)
    }

    /// The sum, correctly rounded to the nearest `f64` (ties to even).
    pub fn value(&self) -> f64 {
        match self.special {
            0 => {}
            POS_INF => return f64::INFINITY,
            NEG_INF => return f64::NEG_INFINITY,
            _ => return f64::NAN, // a NaN, or +∞ and −∞
        }
        let mut a = *self;
        a.propagate();
        let neg = a.limbs()[LIMBS - 1] < 0;
        if neg {
            for d in a.limbs_mut().iter_mut() {
                *d = -*d;
            }
            a.propagate();
        }
        let mag = round_magnitude(a.limbs());
        if neg {
            -mag
        } else {
            mag
        }
    }
}

/// The non-negative fixed-point number in `l` (limbs in [0, 2³²) but the
/// top one, non-negative), rounded to nearest-even.
fn round_magnitude(l: &[i64; LIMBS]) -> f64 {
    let Some(h) = l.iter().rposition(|&d| d != 0) else {
        return 0.0;
    };
    let digit = |i: isize| {
        if i < 0 {
            0
        } else {
            l[i as usize] as u64 as u128
        }
    };
    let h = h as isize;
    // The top limb may exceed 32 bits only for totals far beyond f64::MAX.
    if l[h as usize] >> 32 != 0 {
        return f64::INFINITY;
    }
    // Highest set bit, counting from 2⁻¹⁰⁷⁴.
    let top = 32 * h as i64 + 63 - (l[h as usize] as u64).leading_zeros() as i64;
    if top <= 52 {
        // Below 2⁵³ units the units are the bit pattern itself: subnormals
        // are m · 2⁻¹⁰⁷⁴ and exponent 1's normals (1 << 52 | m) · 2⁻¹⁰⁷⁴.
        let v = (digit(1) << 32 | digit(0)) as u64;
        return f64::from_bits(v);
    }
    // A 96-bit window of the three highest limbs; its bit 0 is limb h−2's.
    let w = digit(h) << 64 | digit(h - 1) << 32 | digit(h - 2);
    let base = 32 * (h as i64 - 2);
    let shift = top - 52; // the mantissa's lowest bit, ≥ 1
    let rel = (shift - base) as u32; // in 12..=43 within the window
    let m = (w >> rel) as u64; // 53 bits, the top one set
    let half = (w >> (rel - 1)) & 1 != 0;
    let below =
        w & ((1u128 << (rel - 1)) - 1) != 0 || l[..(h - 2).max(0) as usize].iter().any(|&d| d != 0);
    let up = half && (below || m & 1 != 0);
    // Exponent field shift + 1 with m's hidden bit adding the 1: rounding
    // m up to 2⁵³ carries into the exponent, as it should.
    let bits = ((shift as u64) << 52) + m + up as u64;
    if bits >= f64::INFINITY.to_bits() {
        f64::INFINITY
    } else {
        f64::from_bits(bits)
    }
}

/// An exact sum reduction variable: a private [`ExactAccumulator`] per
/// pool of each processor, made by
/// [`Runtime::exact_sum`](crate::Runtime::exact_sum); see the
/// [module docs](self).
pub struct ExactSum {
    r: Reduction<ExactAccumulator>,
}

impl std::fmt::Debug for ExactSum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExactSum").finish_non_exhaustive()
    }
}

impl ExactSum {
    pub(crate) fn new(rt: u64, procs: usize) -> Self {
        ExactSum {
            r: Reduction::new(rt, procs, ExactAccumulator::new()),
        }
    }

    /// The private copies, for post-phase code and the runtime.
    pub(crate) fn reduction(&self) -> &Reduction<ExactAccumulator> {
        &self.r
    }

    /// Adds `v` exactly to this pool's copy (in fork-join, this processor's).
    #[inline(always)]
    pub fn fold(&self, ctx: &Ctx, v: f64) {
        let c = self.r.copy_ptr(ctx);
        // SAFETY: `copy_ptr` is this pool's copy, touched only by this
        // server thread now (see Reduction's Sync impl); `add` runs no user
        // code and cannot suspend, so no other filthread of the processor
        // touches the copy before this reference ends.
        unsafe { (*c).add(v) }
    }

    /// This pool's copy rounded (in fork-join, this processor's): what
    /// this pool added since the last reduce or reset, plus what that left.
    pub fn get(&self, ctx: &Ctx) -> f64 {
        self.r.get(ctx).value()
    }

    /// A segment-local accumulator (from the `bind` closure of
    /// [`Program::phase_with`](crate::Program::phase_with)): folds go to
    /// an accumulator on the server thread's stack, with no look-up of the
    /// pool's copy, and it is merged into that copy when dropped.
    #[inline]
    pub fn local<'r>(&'r self, ctx: &Ctx) -> ExactLocal<'r> {
        ExactLocal {
            s: self,
            at: self.r.owner(ctx),
            acc: ExactAccumulator::new(),
            _not_send: std::marker::PhantomData,
        }
    }
}

/// A segment-local accumulator of an [`ExactSum`] (see [`ExactSum::local`]);
/// neither `Send` nor `Sync`: it belongs to the processor whose copy it
/// merges into.
pub struct ExactLocal<'r> {
    s: &'r ExactSum,
    at: crate::phase::CopyAt,
    acc: ExactAccumulator,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl ExactLocal<'_> {
    /// Adds `v` exactly.
    #[inline(always)]
    pub fn fold(&mut self, v: f64) {
        self.acc.add(v);
    }
    /// What this accumulator added so far, rounded.
    pub fn value(&self) -> f64 {
        self.acc.value()
    }
}

impl Drop for ExactLocal<'_> {
    fn drop(&mut self) {
        let c = self.s.r.copy_of(self.at);
        // SAFETY: `c` is the copy of the chunk whose filthread made this
        // accumulator through its Ctx; being !Send, it is dropped on that
        // filthread's server thread while the chunk runs, so no other
        // thread touches the copy, and `merge` runs no user code.
        unsafe { (*c).merge(&self.acc) }
    }
}

#[cfg(test)]
mod test;
