//! A floating-point sum over a shared vector, with several pools per
//! processor: checks that a reduction gives the same bits on every run of a
//! configuration, whatever the order its pages arrive in.
//!
//! The vector is placed cyclically (its pages homed on every node) and its
//! values (1e16, 1, −1e16, …) make the sum depend on the order of the
//! additions. Element `i` goes to global pool slot `i % (nodes × procs ×
//! pools)`; each pool's filthread reads its elements (waiting for pages
//! homed elsewhere, while the other pools of its processor run) and folds
//! them into the sum. Every node prints the reduced sum's bits and the bits
//! of the same sum computed sequentially in the order the reduce promises
//! (each chunk's elements in order, then the chunks of a pool, pools,
//! processors, and nodes in the node layer's tree order: a pool is cut
//! into `Config::chunks` chunks, each folding into its own copy whichever
//! processor of the node runs it).
//!
//! ```text
//! cargo run --release --example dsm_reduce -- --nodes 2 --procs 2 --pools 8
//! ```

#[path = "common/mod.rs"]
mod common;
use common::at_least;

use clap::Parser;
use hyfi::{Control, Dsm, Op, Placement, PoolArray, Program};

/// A reproducible floating-point sum over a shared vector.
#[derive(Parser, Debug, Clone)]
#[command(name = "dsm_reduce")]
pub struct Args {
    /// Elements.
    #[arg(long, default_value_t = 40_000)]
    pub len: usize,
    /// Pools per processor.
    #[arg(long, default_value_t = 8, value_parser = at_least(1))]
    pub pools: usize,
    /// Runtime options (--nodes, --procs, --pin/--no-pin).
    #[command(flatten)]
    pub runtime: common::RuntimeArgs,
}

/// Element `i`: a sum of these depends on the order it is taken in.
fn value(i: usize) -> f64 {
    match i % 4 {
        0 => 1e16,
        1 => 1.0,
        2 => -1e16,
        _ => 0.5 + (i % 7) as f64,
    }
}

/// The sum in the reduce's order, for `nodes × procs × pools` slots, each
/// pool cut into `chunks` chunks.
fn fixed_order(len: usize, nodes: usize, procs: usize, pools: usize, chunks: usize) -> f64 {
    let slots = nodes * procs * pools;
    // Pool `s`'s elements, one per row, cut where the runtime cuts them:
    // chunk `c` of `n` ends at element ⌈m · (c + 1) / n⌉.
    let chunk_sums = |s: usize| {
        let e: Vec<usize> = (s..len).step_by(slots).collect();
        let (m, n) = (e.len(), chunks.min(e.len()).max(1));
        (0..n)
            .map(|c| {
                e[(m * c).div_ceil(n)..(m * (c + 1)).div_ceil(n)]
                    .iter()
                    .fold(0.0, |a, &i| a + value(i))
            })
            .collect::<Vec<f64>>()
    };
    let node_sum = |n: usize| {
        let mut acc: Option<f64> = None;
        for s in n * procs * pools..(n + 1) * procs * pools {
            for v in chunk_sums(s) {
                acc = Some(acc.map_or(v, |a| a + v));
            }
        }
        acc.unwrap_or(0.0)
    };
    // The node layer's binomial tree: node r adds the subtree of r + m for
    // m = 1, 2, 4, … below r's lowest set bit.
    fn tree(r: usize, n: usize, node_sum: &dyn Fn(usize) -> f64) -> f64 {
        let mut v = node_sum(r);
        let mut mask = 1;
        while mask < n && r & mask == 0 {
            if r + mask < n {
                v += tree(r + mask, n, node_sum);
            }
            mask <<= 1;
        }
        v
    }
    tree(0, nodes, &node_sum)
}

fn main() {
    let args = Args::parse();
    let rt = common::or_exit("dsm_reduce", args.runtime.start(|cfg| cfg));
    let dsm = common::or_exit("dsm_reduce", Dsm::new(&rt));
    let (me, nodes, procs, pools, len) =
        (rt.node(), rt.num_nodes(), rt.procs(), args.pools, args.len);
    let v = common::or_exit(
        "dsm_reduce",
        dsm.vec::<f64>(len)
            .placement(Placement::Cyclic)
            .from_fn(value),
    );
    let slots = nodes * procs * pools;
    let mut pa = PoolArray::new(&rt, pools);
    for i in 0..len {
        let s = i % slots;
        if s / (procs * pools) == me {
            let local = s % (procs * pools);
            pa.pool_k(local / pools, local % pools).push(i);
        }
    }
    let total = rt.reduction(0.0f64);
    let mut sum = f64::NAN;
    let mut prog = Program::new();
    prog.phase(
        pa,
        |ctx, i| total.fold(ctx, Op::Sum, v.get(i)),
        |post| {
            sum = post.reduce(&total, Op::Sum);
            Control::Done
        },
    );
    common::or_exit("dsm_reduce", rt.start(&mut prog));
    drop(prog);
    let want = fixed_order(len, nodes, procs, pools, rt.chunks());
    let naive = (0..len).fold(0.0, |a, i| a + value(i));
    println!(
        "dsm_reduce: nodes={nodes} procs={procs} pools={pools} sum={sum:e} sum_bits={:016x} want_bits={:016x} naive={naive:e} suspensions={}",
        sum.to_bits(),
        want.to_bits(),
        rt.stats().total().suspensions
    );
}
