//! The exact accumulator against an independent exact sum (big integers in
//! units of 2⁻¹⁰⁷⁴), and the `ExactSum` reduction on several processors
//! and pool counts against a sequential exact sum.

use num_bigint::BigInt;

use super::ExactAccumulator;
use crate::{Config, Control, PoolArray, Program, Runtime};

/// `x` (finite) as an integer multiple of 2⁻¹⁰⁷⁴, by halving/doubling
/// arithmetic on the value rather than its bit fields.
fn scaled(x: f64) -> BigInt {
    assert!(x.is_finite());
    if x == 0.0 {
        return BigInt::from(0);
    }
    let neg = x < 0.0;
    let mut a = x.abs();
    // Bring `a` into [2⁵², 2⁵³) by exact power-of-two scaling; `a`'s
    // mantissa is then an integer (a subnormal's, at 2¹⁰⁷⁴ times it).
    let mut e: i64 = 0;
    while a < 4503599627370496.0 && e > -1074 {
        a *= 2.0; // exact: no overflow below 2⁵³

        e -= 1;
    }
    while a >= 9007199254740992.0 {
        a /= 2.0; // exact: the half of a ≥ 2⁵³ is normal
        e += 1;
    }
    assert_eq!(a.fract(), 0.0);
    let m = BigInt::from(a as u64);
    let shift = e + 1074;
    assert!(shift >= 0, "{x} scaled below 2^-1074");
    let v = m << shift as usize;
    if neg {
        -v
    } else {
        v
    }
}

fn exact(xs: &[f64]) -> BigInt {
    xs.iter().map(|&x| scaled(x)).sum()
}

fn next_toward_zero_or_away(x: f64, away: bool) -> f64 {
    // x ≥ 0 finite.
    let b = x.to_bits();
    if away {
        f64::from_bits(b + 1)
    } else {
        f64::from_bits(b - 1)
    }
}

/// Asserts that `r` is `s` (in units of 2⁻¹⁰⁷⁴) rounded to nearest-even.
fn assert_correctly_rounded(s: &BigInt, r: f64, what: &str) {
    // The rounding boundary to infinity: 2¹⁰²⁴ − 2⁹⁷⁰ (MAX's mantissa is
    // odd, so the tie goes to 2¹⁰²⁴, i.e. infinity).
    let limit = (BigInt::from(1) << 2098usize) - (BigInt::from(1) << 2044usize);
    let mag = if *s < BigInt::from(0) {
        -s.clone()
    } else {
        s.clone()
    };
    if mag >= limit {
        assert!(
            r.is_infinite(),
            "{what}: |sum| ≥ overflow bound but got {r:e}"
        );
        assert_eq!(r > 0.0, *s > BigInt::from(0), "{what}: sign of infinity");
        return;
    }
    assert!(r.is_finite(), "{what}: finite sum rounded to {r}");
    if mag == BigInt::from(0) {
        assert_eq!(r.to_bits(), 0, "{what}: exact zero must be +0.0, got {r:e}");
        return;
    }
    assert_eq!(r < 0.0, *s < BigInt::from(0), "{what}: sign");
    let a = r.abs();
    let d = |y: f64| -> BigInt {
        let t = if y.is_infinite() {
            BigInt::from(1) << 2098usize
        } else {
            scaled(y)
        };
        let diff = &mag - t;
        if diff < BigInt::from(0) {
            -diff
        } else {
            diff
        }
    };
    let here = d(a);
    let up = d(next_toward_zero_or_away(a, true));
    assert!(
        here <= up,
        "{what}: {r:e} is not the nearest (next up is nearer)"
    );
    if a > 0.0 {
        let down = d(next_toward_zero_or_away(a, false));
        assert!(
            here <= down,
            "{what}: {r:e} is not the nearest (next down is nearer)"
        );
        if here == down {
            assert_eq!(a.to_bits() & 1, 0, "{what}: tie not to even");
        }
    }
    if here == up {
        assert_eq!(a.to_bits() & 1, 0, "{what}: tie not to even");
    }
}

fn sum(xs: &[f64]) -> f64 {
    let mut a = ExactAccumulator::new();
    a.add_all(xs);
    a.value()
}

fn check(xs: &[f64], what: &str) -> f64 {
    let r = sum(xs);
    assert_correctly_rounded(&exact(xs), r, what);
    r
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// Any finite double with an exponent in `lo..hi` (biased), either sign.
    fn double(&mut self, lo: u64, hi: u64) -> f64 {
        let z = self.next();
        let e = lo + z % (hi - lo);
        f64::from_bits((z & (1 << 63)) | e << 52 | (self.next() & ((1 << 52) - 1)))
    }
    fn shuffle(&mut self, xs: &mut [f64]) {
        for i in (1..xs.len()).rev() {
            xs.swap(i, self.below(i + 1));
        }
    }
}

#[test]
fn the_checker_catches_a_wrong_rounding() {
    let xs = [1e16, 1.0, -1e16];
    let r = std::panic::catch_unwind(|| assert_correctly_rounded(&exact(&xs), 0.0, "plain"));
    assert!(r.is_err());
    assert_eq!(scaled(1.0), BigInt::from(1) << 1074usize);
    assert_eq!(scaled(f64::from_bits(1)), BigInt::from(1));
    assert_eq!(scaled(-0.75), -(BigInt::from(3) << 1072usize));
}

#[test]
fn known_sums() {
    assert_eq!(check(&[1e16, 1.0, -1e16], "1e16+1-1e16"), 1.0);
    assert_eq!(check(&[], "empty").to_bits(), 0);
    assert_eq!(check(&[-0.0, -0.0], "-0").to_bits(), 0);
    assert_eq!(check(&[1.0, -1.0], "1-1").to_bits(), 0);
    assert_eq!(check(&[0.1; 10], "ten tenths"), 1.0);
    assert_eq!(check(&[1e308, 1e-308, -1e308], "huge cancellation"), 1e-308);
    assert_eq!(
        check(&[f64::MAX, f64::MAX, -f64::MAX], "past MAX and back"),
        f64::MAX
    );
    assert_eq!(check(&[f64::MAX, f64::MAX], "overflow"), f64::INFINITY);
    assert_eq!(
        check(&[-f64::MAX, -f64::MAX], "-overflow"),
        f64::NEG_INFINITY
    );
    // MAX + half an ulp is a tie between MAX (odd) and 2¹⁰²⁴: infinity.
    let half_ulp = 2f64.powi(970);
    assert_eq!(check(&[f64::MAX, half_ulp], "tie at MAX"), f64::INFINITY);
    let below = f64::from_bits(half_ulp.to_bits() - 1);
    assert_eq!(check(&[f64::MAX, below], "below the tie at MAX"), f64::MAX);
    // Ties to even at 2⁵³.
    let p53 = 2f64.powi(53);
    assert_eq!(check(&[p53, 1.0], "tie down"), p53);
    assert_eq!(check(&[p53 + 2.0, 1.0], "tie up"), p53 + 4.0);
    assert_eq!(
        check(
            &[p53, 1.0, f64::from_bits(1)],
            "tie broken by the least bit"
        ),
        p53 + 2.0
    );
    assert_eq!(
        check(&[-p53, -1.0, -f64::from_bits(1)], "negative"),
        -(p53 + 2.0)
    );
}

#[test]
fn subnormals() {
    let tiny = f64::from_bits(1);
    assert_eq!(check(&[tiny; 3], "three least"), f64::from_bits(3));
    let big_sub = f64::from_bits((1 << 52) - 1);
    assert_eq!(
        check(&[big_sub, tiny], "into the normals"),
        f64::MIN_POSITIVE
    );
    assert_eq!(
        check(&[f64::MIN_POSITIVE, -tiny], "out of the normals"),
        big_sub
    );
    let mut r = Rng(7);
    for k in 0..200 {
        let xs: Vec<f64> = (0..50).map(|_| r.double(0, 3)).collect();
        check(&xs, &format!("subnormal set {k}"));
    }
}

#[test]
fn specials() {
    let nan = f64::NAN;
    assert!(sum(&[1.0, nan, 2.0]).is_nan());
    assert!(sum(&[-nan]).is_nan());
    assert!(sum(&[f64::INFINITY, f64::NEG_INFINITY]).is_nan());
    assert!(sum(&[f64::INFINITY, nan]).is_nan());
    assert_eq!(sum(&[f64::INFINITY, -1e308, -1e308]), f64::INFINITY);
    assert_eq!(sum(&[1.0, f64::NEG_INFINITY]), f64::NEG_INFINITY);
    let mut a = ExactAccumulator::from(f64::INFINITY);
    a.merge(&ExactAccumulator::from(f64::NEG_INFINITY));
    assert!(a.value().is_nan());
}

#[test]
fn deferred_carries_agree_with_frequent_ones() {
    let mut r = Rng(11);
    let xs: Vec<f64> = (0..5000).map(|_| r.double(1000, 1100)).collect();
    let mut lazy = ExactAccumulator::new();
    let mut eager = ExactAccumulator::new();
    for &x in &xs {
        lazy.add(x);
        eager.room = eager.room.min(3);
        eager.add(x);
    }
    assert_eq!(lazy.value().to_bits(), eager.value().to_bits());
    assert_correctly_rounded(&exact(&xs), lazy.value(), "lazy");
    // The largest digits, all one sign, many times: limbs near their bound.
    let mut a = ExactAccumulator::new();
    let n = 1u64 << 20;
    let x = f64::from_bits(0x433f_ffff_ffff_ffff); // 53 ones, aligned to straddle limbs
    for _ in 0..n {
        a.add(x);
    }
    assert_correctly_rounded(&(scaled(x) * BigInt::from(n)), a.value(), "repeated");
}

#[test]
fn any_order_and_any_split_give_the_correctly_rounded_bits() {
    let mut r = Rng(42);
    for round in 0..40 {
        let n = 1 + r.below(400);
        let mut xs: Vec<f64> = (0..n)
            .map(|_| match r.below(4) {
                0 => r.double(1, 2047),    // anywhere
                1 => r.double(1000, 1100), // near 1
                _ => r.double(1020, 1090), // cancellations below
            })
            .collect();
        // Pairs that cancel, leaving small values to decide the result.
        for i in 0..n / 4 {
            let v = xs[i];
            xs.push(-v);
        }
        xs.push(1e-300);
        let first = check(&xs, &format!("round {round}"));
        for _ in 0..5 {
            r.shuffle(&mut xs);
            assert_eq!(sum(&xs).to_bits(), first.to_bits(), "round {round}: order");
            // Split into chunks, merged in a shuffled order.
            let parts = 1 + r.below(8);
            let mut accs: Vec<ExactAccumulator> = xs
                .chunks(xs.len().div_ceil(parts))
                .map(|c| {
                    let mut a = ExactAccumulator::new();
                    a.add_all(c);
                    a
                })
                .collect();
            while accs.len() > 1 {
                let i = r.below(accs.len());
                let a = accs.swap_remove(i);
                let j = r.below(accs.len());
                accs[j].merge(&a);
            }
            assert_eq!(
                accs[0].value().to_bits(),
                first.to_bits(),
                "round {round}: split"
            );
        }
    }
}

/// The values the runtime tests sum: order-sensitive in f64.
fn value(i: usize) -> f64 {
    let z = Rng(i as u64).next();
    match i % 5 {
        0 => 1e16,
        1 => 1.0,
        2 => -1e16,
        3 => f64::from_bits(z & !(0x7ff << 52) | (900 + z % 300) << 52),
        _ => (z >> 11) as f64 / (1u64 << 53) as f64 * 1e-3,
    }
}

#[test]
fn reduce_on_processors_and_pools_gives_the_sequential_bits() {
    let n = 20_000;
    let xs: Vec<f64> = (0..n).map(value).collect();
    let want = check(&xs, "runtime data");
    for procs in [1, 2, 3] {
        let rt = Runtime::new(Config::new().procs(procs).pin(false)).unwrap();
        for pools in [1, 2, 3, 7] {
            let s = rt.exact_sum();
            let mut got = Vec::new();
            let mut prog = Program::new();
            prog.phase(
                PoolArray::block(&rt, 0..n, pools),
                |ctx, i| s.fold(ctx, xs[i]),
                |post| {
                    got.push(post.reduce_exact(&s));
                    post.set_exact(&s, 0.0);
                    if got.len() == 3 {
                        Control::Done
                    } else {
                        Control::Continue
                    }
                },
            );
            rt.start(&mut prog).unwrap();
            drop(prog);
            for g in got {
                assert_eq!(g.to_bits(), want.to_bits(), "{procs} procs x {pools} pools");
            }
        }
    }
}

#[test]
fn local_accumulators_and_unreset_sums_match_reduction_semantics() {
    let n = 10_000;
    let xs: Vec<f64> = (0..n).map(value).collect();
    let rt = Runtime::new(Config::new().procs(2).pin(false)).unwrap();
    let s = rt.exact_sum();
    let mut got = Vec::new();
    let mut prog = Program::new();
    prog.phase_with(
        PoolArray::block(&rt, 0..n, 3),
        |ctx, _span| s.local(ctx),
        |_ctx, i, acc| acc.fold(xs[i]),
        |post| {
            got.push(post.reduce_exact(&s));
            // Not reset: as with Op::Sum, every copy now holds the total,
            // and the next reduce adds each copy's again.
            Control::Done
        },
    );
    rt.start(&mut prog).unwrap();
    drop(prog);
    assert_eq!(got[0].to_bits(), sum(&xs).to_bits());

    // A second program, with set_exact to a start value.
    let mut got2 = None;
    let mut prog = Program::new();
    prog.phase(
        PoolArray::block(&rt, 0..n, 3),
        |ctx, i| s.fold(ctx, xs[i]),
        |post| {
            got2 = Some(post.reduce_exact(&s));
            Control::Done
        },
    );
    // Every copy (2 procs × 3 pools × the chunks of each, every pool being
    // large enough to be cut into the default number) starts from the
    // first total.
    let copies = 2 * 3 * crate::DEFAULT_CHUNKS;
    rt.start(&mut prog).unwrap();
    drop(prog);
    let mut want = ExactAccumulator::new();
    for _ in 0..copies + 1 {
        want.add_all(&xs);
    }
    assert_eq!(got2.unwrap().to_bits(), want.value().to_bits());
}
