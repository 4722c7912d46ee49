//! The same bits on every configuration: an exact floating-point sum
//! ([`hyfi::ExactSum`]) beside a plain `Op::Sum`, over values whose f64 sum
//! depends on the order of the additions.
//!
//! ```sh
//! cargo run --release --example exact_sum                        # this machine, one node
//! cargo run --release --example exact_sum -- --nodes 2 --procs 2  # two local nodes
//! ```
//!
//! Every filament folds one value (1e16, 1, −1e16, and values of random
//! sign and magnitude from 2⁻⁴⁰ to 2⁴⁰) into both reductions. The exact
//! sum comes out bit-identical on 1×1, 1×2, 2×1, 2×2, … and on every run,
//! and equals a sequential exact sum; the plain sum is reproducible on one
//! configuration but may differ between configurations. Every node prints
//! the same result line with both sums' bits; the program exits non-zero if
//! the exact sum differs from the sequential one or between phases.

#[path = "common/mod.rs"]
mod common;
use std::time::Instant;

use clap::Parser;
use hyfi::{Control, ExactAccumulator, Op, PoolArray, Program};

#[derive(Parser, Debug, Clone)]
#[command(about = "An exact f64 sum, the same bits on every N×P, beside Op::Sum")]
pub struct Args {
    /// Values summed per phase.
    #[arg(long, default_value_t = 200_000)]
    pub n: usize,
    /// Phases, each summing the same values afresh.
    #[arg(long, default_value_t = 3)]
    pub phases: u64,
    /// Pools per processor.
    #[arg(long, default_value_t = 2, value_parser = common::at_least(1))]
    pub pools: usize,
    /// Runtime options (--nodes, --procs, --pin/--no-pin).
    #[command(flatten)]
    pub runtime: common::RuntimeArgs,
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Value `i`: the same on every node and processor.
pub fn value(i: usize) -> f64 {
    match i % 7 {
        0 => 1e16,
        1 => 1.0,
        2 => -1e16,
        _ => {
            let z = splitmix(i as u64);
            let unit = (z >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
            let mag = (unit + 0.5) * 2f64.powi((z % 81) as i32 - 40);
            if z & 1 == 0 {
                mag
            } else {
                -mag
            }
        }
    }
}

fn main() {
    let args = Args::parse();
    let rt = common::or_exit("exact_sum", args.runtime.start(|cfg| cfg));
    common::print_node_line(&rt);
    let exact = rt.exact_sum();
    let plain = rt.reduction(0.0f64);
    let mut exact_sums = Vec::new();
    let mut plain_sums = Vec::new();
    let t = Instant::now();
    let mut prog = Program::new();
    prog.phase(
        PoolArray::block(&rt, 0..args.n, args.pools),
        |ctx, i| {
            let v = value(i);
            exact.fold(ctx, v);
            plain.fold(ctx, Op::Sum, v);
        },
        |post| {
            exact_sums.push(post.reduce_exact(&exact));
            plain_sums.push(post.reduce(&plain, Op::Sum));
            post.set_exact(&exact, 0.0);
            post.set(&plain, 0.0);
            if post.iteration() + 1 == args.phases {
                Control::Done
            } else {
                Control::Continue
            }
        },
    );
    if let Err(e) = rt.start(&mut prog) {
        // hyfi's errors name the node (and the node that failed first).
        eprintln!("exact_sum: {e}");
        std::process::exit(1);
    }
    drop(prog);
    let elapsed = t.elapsed();

    // Independent answers: an exact sum in index order, and the plain
    // sequential f64 loop (which differs from the exact one).
    let mut seq = ExactAccumulator::new();
    let mut seq_plain = 0.0f64;
    for i in 0..args.n {
        seq.add(value(i));
        seq_plain += value(i);
    }
    let want = seq.value();
    let (e, p) = (exact_sums[0], plain_sums[0]);
    println!(
        "result: exact_bits={:016x} plain_bits={:016x} exact={e:e} plain={p:e} \
         ({} nodes x {} procs, {:.3} s)",
        e.to_bits(),
        p.to_bits(),
        rt.num_nodes(),
        rt.procs(),
        elapsed.as_secs_f64()
    );
    println!(
        "sequential: exact_bits={:016x} plain_bits={:016x}",
        want.to_bits(),
        seq_plain.to_bits()
    );
    let same_phases = exact_sums.iter().all(|s| s.to_bits() == e.to_bits());
    if e.to_bits() == want.to_bits() && same_phases {
        println!("check: OK (exact sum equals the sequential exact sum, bit for bit, every phase)");
    } else {
        eprintln!(
            "check: FAILED: exact sums {exact_sums:?} vs sequential {want:e} ({:016x})",
            want.to_bits()
        );
        std::process::exit(1);
    }
}
