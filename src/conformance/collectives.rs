//! Check 1: the collectives — all-reduces bit for bit in the documented
//! order, values of different lengths gathered in node order, reductions
//! in post-phase code, barriers that wait for the last node.
//!
//! The order (`hyfi_core::link::collective`): a binomial tree over the
//! ranks in which node `r` folds its children `r+1, r+2, r+4, …` (below
//! its lowest set bit) into its own value, `acc = combine(acc, child)`;
//! recursive doubling, which transports use when the node count is a power
//! of two, associates the same way. [`tree_order`] computes it
//! sequentially, the independent answer every node compares with.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{agree, hash, mix, Summary};
use crate::layers::{NodeLink, RuntimeExt};
use crate::{Control, Op, PoolArray, Program, Runtime};

/// The check's word in the plan.
const CHECK: u64 = 1;
/// Rounds of each kind of all-reduce.
const ROUNDS: u64 = 16;
/// Words of the large all-reduce (1 MiB).
const LARGE_WORDS: usize = 1 << 17;
/// How late the late node enters a barrier.
const LATE: Duration = Duration::from_millis(250);
/// Barriers with a late node.
const LATE_ROUNDS: u64 = 2;
/// How long the late node's master computes in the reduction rounds that
/// have one (see [`reductions`]).
const LATE_PHASE: Duration = Duration::from_millis(60);

/// Values whose sums depend on the association: `1e16 + 3.0` rounds, so
/// `(1e16 + 3) - 1e16` is 4 where `1e16 - 1e16 + 3` is 3. No `-0.0` (a
/// `+0.0` copy added to it would change its sign), so that adding the
/// zero copies of idle processors changes nothing.
const VALUES: [f64; 14] = [
    1e16,
    -1e16,
    3.0,
    1.0,
    -1.0,
    0.1,
    0.7,
    -0.3,
    9_007_199_254_740_992.0,  // 2^53
    -4_503_599_627_370_496.0, // -2^52
    1e-8,
    5e15,
    -7.5e15,
    123.456,
];

/// Node `r`'s `f64` in round `k`.
fn value(seed: u64, k: u64, r: usize) -> f64 {
    VALUES[(hash(&[seed, CHECK, k, r as u64]) % VALUES.len() as u64) as usize]
}

/// A combining function that is neither commutative nor associative: any
/// other order, or the arguments swapped, changes the result.
fn skew(a: u64, b: u64, word: u64) -> u64 {
    mix(a ^ word).wrapping_add(b.rotate_left(17 + (word % 32) as u32))
}

/// `vals` (one per node, in rank order) combined in the seam's order.
pub(super) fn tree_order<T: Clone, F: FnMut(T, T) -> T>(vals: &[T], combine: &mut F) -> T {
    /// The value of the subtree of node `r`, whose children are `r + m`
    /// for the powers of two `m` below `span`.
    fn subtree<T: Clone, F: FnMut(T, T) -> T>(r: usize, span: usize, v: &[T], c: &mut F) -> T {
        let mut acc = v[r].clone();
        let mut m = 1;
        while m < span {
            if r + m < v.len() {
                let child = subtree(r + m, m, v, c);
                acc = c(acc, child);
            }
            m <<= 1;
        }
        acc
    }
    subtree(0, vals.len().next_power_of_two(), vals, combine)
}

/// Would another plausible order (left to right, right to left, ranks
/// reversed) have given other bits than `want`?
fn order_sensitive<T: Clone + PartialEq>(
    vals: &[T],
    want: &T,
    c: &mut impl FnMut(T, T) -> T,
) -> bool {
    let left = vals[1..].iter().cloned().fold(vals[0].clone(), &mut *c);
    let n = vals.len();
    let right = vals[..n - 1]
        .iter()
        .rev()
        .cloned()
        .fold(vals[n - 1].clone(), |acc, v| c(v, acc));
    let reversed = vals[..n - 1]
        .iter()
        .rev()
        .cloned()
        .fold(vals[n - 1].clone(), &mut *c);
    [left, right, reversed].iter().any(|o| o != want)
}

fn f64_bytes_add(a: &mut [u8], b: &[u8]) {
    let x = f64::from_le_bytes(a[..8].try_into().unwrap());
    let y = f64::from_le_bytes(b[..8].try_into().unwrap());
    a.copy_from_slice(&(x + y).to_le_bytes());
}

fn skew_bytes(a: &mut [u8], b: &[u8]) {
    for (w, (x, y)) in a.chunks_exact_mut(8).zip(b.chunks_exact(8)).enumerate() {
        let (p, q) = (
            u64::from_le_bytes((&*x).try_into().unwrap()),
            u64::from_le_bytes(y.try_into().unwrap()),
        );
        x.copy_from_slice(&skew(p, q, w as u64).to_le_bytes());
    }
}

fn words(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
        .collect()
}

fn bytes(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// Runs check 1 on this node (see the module docs).
pub(super) fn check(rt: &Runtime, seed: u64, s: &mut Summary) -> Result<(), String> {
    let link = rt.link().clone();
    let (me, n) = (link.my_node(), link.num_nodes());
    let mut errors = Vec::new();
    let lerr = |what: &str, e: crate::layers::LinkError| format!("node {me}: {what} failed: {e}");

    // f64 sums, where the association shows in the bits.
    for k in 0..ROUNDS {
        let vals: Vec<f64> = (0..n).map(|r| value(seed, k, r)).collect();
        let mut add = |a: f64, b: f64| a + b;
        let want = tree_order(&vals, &mut add);
        let mut v = vals[me].to_le_bytes();
        link.allreduce(&mut v, &mut f64_bytes_add)
            .map_err(|e| lerr("an f64 all-reduce", e))?;
        let got = f64::from_le_bytes(v);
        if got.to_bits() != want.to_bits() {
            errors.push(format!(
                "node {me}: the f64 all-reduce of {vals:?} gave {got:e} ({:#x}), the seam's order \
                 gives {want:e} ({:#x})",
                got.to_bits(),
                want.to_bits()
            ));
        }
        let mut add_bits = |a: u64, b: u64| (f64::from_bits(a) + f64::from_bits(b)).to_bits();
        let bits: Vec<u64> = vals.iter().map(|v| v.to_bits()).collect();
        s.order_sensitive += u64::from(order_sensitive(&bits, &want.to_bits(), &mut add_bits));
        s.allreduces += 1;
    }

    // A combining function that shows any other order or swapped arguments,
    // on a three-word value and on a 1 MiB one.
    for k in 0..ROUNDS {
        let len = if k == 0 { LARGE_WORDS } else { 3 };
        let vals: Vec<Vec<u64>> = (0..n)
            .map(|r| {
                let base = hash(&[seed, CHECK, 100 + k, r as u64]);
                (0..len as u64).map(|j| mix(base ^ j)).collect()
            })
            .collect();
        let mut combine = |mut a: Vec<u64>, b: Vec<u64>| {
            for (w, (x, y)) in a.iter_mut().zip(&b).enumerate() {
                *x = skew(*x, *y, w as u64);
            }
            a
        };
        let want = tree_order(&vals, &mut combine);
        let mut v = bytes(&vals[me]);
        link.allreduce(&mut v, &mut skew_bytes)
            .map_err(|e| lerr("an all-reduce of a non-commutative function", e))?;
        let got = words(&v);
        if let Some(j) = (0..len).find(|&j| got[j] != want[j]) {
            errors.push(format!(
                "node {me}: the all-reduce of a non-commutative function over {len} words (round \
                 {k}) gave {:#x} in word {j}, the seam's order gives {:#x}",
                got[j], want[j]
            ));
        }
        if n > 1 && order_sensitive(&vals, &want, &mut combine) {
            s.order_sensitive += 1;
        }
        s.allreduces += 1;
    }

    // Values of different lengths, gathered by concatenation
    // (`allreduce_vec`, what a release's write notices ride in): every
    // node's bytes, in node order, on every node; node `r` gives a value
    // of `(r * 7 + k) % 5` words, none for some.
    for k in 0..ROUNDS {
        let vals: Vec<Vec<u64>> = (0..n)
            .map(|r| {
                let base = hash(&[seed, CHECK, 200 + k, r as u64]);
                (0..((r as u64 * 7 + k) % 5))
                    .map(|j| mix(base ^ j))
                    .collect()
            })
            .collect();
        let want: Vec<u64> = vals.concat();
        let mut v = bytes(&vals[me]);
        link.allreduce_vec(&mut v, &mut |acc, other| acc.extend_from_slice(other))
            .map_err(|e| lerr("a gathering all-reduce of values of different lengths", e))?;
        if v.len() != 8 * want.len() || words(&v) != want {
            errors.push(format!(
                "node {me}: gathering values of {:?} words (round {k}) gave {} bytes, not the \
                 {} of every node's value in node order",
                vals.iter().map(Vec::len).collect::<Vec<_>>(),
                v.len(),
                8 * want.len()
            ));
        }
        s.allreduces += 1;
    }

    reductions(rt, seed, &mut errors, s)?;
    barriers(&link, seed, &mut errors, s)?;
    let mine = match errors.first() {
        None => Ok(0),
        Some(e) => Err(format!("{e} ({} mismatch(es) on this node)", errors.len())),
    };
    agree(&link, "the collectives", mine).map(drop)
}

/// A reduction variable in post-phase code, over every node: processor 0
/// of each node holds the node's value, the others the sum's zero. In
/// every fourth round one node, chosen by the seed, computes
/// [`LATE_PHASE`] longer: the others' messages for the phase's end (their
/// all-reduce pieces, or `REL`s) come while its master computes, which a
/// transport may leave unread meanwhile
/// ([`Port::send_for_phase_end`](crate::layers::link::Port::send_for_phase_end)),
/// and must read when it stops.
fn reductions(
    rt: &Runtime,
    seed: u64,
    errors: &mut Vec<String>,
    s: &mut Summary,
) -> Result<(), String> {
    let (me, n) = (rt.node(), rt.num_nodes());
    let red = rt.reduction(0.0f64);
    let mut got = Vec::new();
    let mut pools = PoolArray::new(rt, 1);
    pools.pool(0).push(0usize);
    let mut prog = Program::new();
    prog.phase(
        pools,
        |ctx, _| {
            let k = ctx.iteration();
            let v = value(seed, 1000 + k, me);
            if k % 4 == 1 && n > 1 && (hash(&[seed, CHECK, 3000 + k]) % n as u64) as usize == me {
                std::thread::sleep(LATE_PHASE);
            }
            red.update(ctx, |_| v);
        },
        |post| {
            got.push(post.reduce(&red, Op::Sum));
            post.set(&red, 0.0);
            if post.iteration() + 1 >= ROUNDS {
                Control::Done
            } else {
                Control::Continue
            }
        },
    );
    rt.start(&mut prog)
        .map_err(|e| format!("node {me}: the reduction program failed: {e}"))?;
    drop(prog);
    for (k, got) in got.iter().enumerate() {
        let vals: Vec<f64> = (0..n).map(|r| value(seed, 1000 + k as u64, r)).collect();
        let want = tree_order(&vals, &mut |a: f64, b: f64| a + b);
        if got.to_bits() != want.to_bits() {
            errors.push(format!(
                "node {me}: the reduction of {vals:?} in post-phase code (iteration {k}) gave \
                 {got:e}, the seam's order gives {want:e}"
            ));
        }
        s.reductions += 1;
    }
    Ok(())
}

/// Barriers in which one node, chosen by the seed, arrives [`LATE`]: the
/// others must not leave before it came. They measure from the previous
/// barrier, which every node left within a message latency of the others,
/// so a barrier that waited returns after about `LATE` and one that did
/// not within that latency; half of `LATE` tells them apart.
fn barriers(
    link: &Arc<dyn NodeLink>,
    seed: u64,
    errors: &mut Vec<String>,
    s: &mut Summary,
) -> Result<(), String> {
    let (me, n) = (link.my_node(), link.num_nodes());
    let fail = |e| format!("node {me}: a barrier failed: {e}");
    link.barrier().map_err(fail)?;
    s.barriers += 1;
    for k in 0..LATE_ROUNDS {
        let late = (hash(&[seed, CHECK, 2000 + k]) % n as u64) as usize;
        let t0 = Instant::now();
        if me == late {
            std::thread::sleep(LATE);
        }
        link.barrier().map_err(fail)?;
        let waited = t0.elapsed();
        if n > 1 && me != late && waited < LATE / 2 {
            errors.push(format!(
                "node {me}: barrier {k} returned after {:.1} ms, before node {late}, {} ms late, \
                 could have entered it",
                waited.as_secs_f64() * 1e3,
                LATE.as_millis()
            ));
        }
        s.barriers += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tree_order_is_the_documented_one() {
        let cat = &mut |a: String, b: String| format!("({a}{b})");
        let v = |n: usize| (0..n).map(|r| r.to_string()).collect::<Vec<_>>();
        assert_eq!(tree_order(&v(1), cat), "0");
        assert_eq!(tree_order(&v(2), cat), "(01)");
        assert_eq!(tree_order(&v(3), cat), "((01)2)");
        // Recursive doubling's association for powers of two.
        assert_eq!(tree_order(&v(4), cat), "((01)(23))");
        assert_eq!(tree_order(&v(5), cat), "(((01)(23))4)");
        assert_eq!(tree_order(&v(6), cat), "(((01)(23))(45))");
        assert_eq!(tree_order(&v(8), cat), "(((01)(23))((45)(67)))");
    }

    #[test]
    fn the_values_make_the_order_show() {
        let vals = [1e16, 3.0, -1e16, 3.0];
        let want = tree_order(&vals, &mut |a: f64, b: f64| a + b);
        let bits: Vec<u64> = vals.iter().map(|v| v.to_bits()).collect();
        let add = &mut |a: u64, b: u64| (f64::from_bits(a) + f64::from_bits(b)).to_bits();
        assert!(order_sensitive(&bits, &want.to_bits(), add));
    }
}
