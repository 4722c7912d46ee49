//! A reduction-only iterative program for N×P: π by Monte Carlo and by a
//! statically partitioned midpoint rule, over several phases.
//!
//! ```sh
//! cargo run --release --example montecarlo                        # this machine, one node
//! cargo run --release --example montecarlo -- --nodes 2 --procs 2  # two local nodes (embedded launcher)
//! HYFI_NODES=2 cargo run --release --example montecarlo           # the same, from the environment
//! hyfi-run -n 4 -p 1 target/release/examples/montecarlo           # four local nodes
//! mpirun -np 2 target/release/examples/montecarlo                 # under Open MPI
//! ```
//!
//! Each phase draws `--samples` points per block with a counter-based
//! generator (point *k* is the same point whichever node and processor draws
//! it) and integrates 4/(1+x²) over the block's share of [0,1]. The hit count
//! is an integer sum, so it equals the sequential count exactly on every
//! configuration; the quadrature is a floating-point sum, identical bit for
//! bit on every run of one configuration and within 1e-12 of π on all.
//! Every node prints the same result line; the program checks it against a
//! sequential computation and exits non-zero if it differs.

#[path = "common/mod.rs"]
mod common;
use std::time::{Duration, Instant};

use clap::Parser;
use hyfi::{Control, Op, PoolArray, Program, Progress};

#[derive(Parser, Debug, Clone)]
#[command(about = "π by Monte Carlo and midpoint rule: a reduction-only program for N×P")]
pub struct Args {
    /// Blocks of work per phase (filaments, dealt in blocks over nodes and processors).
    #[arg(long, default_value_t = 256)]
    pub blocks: usize,
    /// Points drawn (and quadrature intervals) per block.
    #[arg(long, default_value_t = 20_000)]
    pub samples: u64,
    /// Phases.
    #[arg(long, default_value_t = 8)]
    pub phases: u64,
    /// Runtime options (--procs, --pin/--no-pin).
    #[command(flatten)]
    pub runtime: common::RuntimeArgs,
    /// Sleep this many milliseconds in each post-phase (to make a run last, for failure tests).
    #[arg(long, default_value_t = 0)]
    pub sleep_ms: u64,
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn unit(z: u64) -> f64 {
    (z >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Hits of block `b` in phase `p`.
pub fn block_hits(p: u64, b: u64, samples: u64) -> u64 {
    let base = (p << 40) ^ (b << 20);
    (0..samples)
        .filter(|&k| {
            let (x, y) = (
                unit(splitmix(2 * (base + k))),
                unit(splitmix(2 * (base + k) + 1)),
            );
            x * x + y * y <= 1.0
        })
        .count() as u64
}

/// Midpoint-rule integral of 4/(1+x²) over block `b` of `blocks`.
pub fn block_quad(b: u64, blocks: u64, samples: u64) -> f64 {
    let h = 1.0 / (blocks * samples) as f64;
    (0..samples)
        .map(|k| {
            let x = ((b * samples + k) as f64 + 0.5) * h;
            4.0 / (1.0 + x * x) * h
        })
        .sum()
}

fn main() {
    let args = Args::parse();
    let rt = common::or_exit("montecarlo", args.runtime.start(|cfg| cfg));
    common::print_node_line(&rt);
    let hits = rt.reduction(0u64);
    let area = rt.reduction(0.0f64);
    let (mut total_hits, mut last_area) = (0u64, 0.0f64);
    // Phases done on the terminal in a long run (see `hyfi::Progress`).
    let progress = Progress::new(&rt, "phases");
    let t = Instant::now();
    let mut prog = Program::new();
    prog.phase(
        PoolArray::block(&rt, 0..args.blocks, 1),
        |ctx, b| {
            let p = ctx.iteration();
            hits.update(ctx, |h| h + block_hits(p, b as u64, args.samples));
            area.update(ctx, |a| {
                a + block_quad(b as u64, args.blocks as u64, args.samples)
            });
        },
        |post| {
            total_hits += post.reduce(&hits, Op::Sum);
            last_area = post.reduce(&area, Op::Sum);
            post.set(&hits, 0);
            post.set(&area, 0.0);
            if args.sleep_ms > 0 {
                std::thread::sleep(Duration::from_millis(args.sleep_ms));
            }
            let done = post.iteration() + 1;
            progress.report(
                done,
                format_args!("{:.0}% done", 100.0 * done as f64 / args.phases as f64),
            );
            if post.iteration() + 1 == args.phases {
                Control::Done
            } else {
                Control::Continue
            }
        },
    );
    let ran = rt.start(&mut prog);
    progress.finish();
    if let Err(e) = ran {
        // hyfi's errors name the node (and the node that failed first).
        eprintln!("montecarlo: {e}");
        std::process::exit(1);
    }
    drop(prog);
    let elapsed = t.elapsed();

    // Independent answer: the same draws and intervals, sequentially, as a
    // plain loop (timed: the same arithmetic without hyfi).
    let t = Instant::now();
    let mut seq_hits = 0u64;
    let mut seq_area = 0.0f64;
    for p in 0..args.phases {
        seq_area = 0.0;
        for b in 0..args.blocks as u64 {
            seq_hits += block_hits(p, b, args.samples);
            seq_area += block_quad(b, args.blocks as u64, args.samples);
        }
    }
    let seq_secs = t.elapsed().as_secs_f64();
    std::hint::black_box(seq_area);
    let pi_mc = 4.0 * total_hits as f64 / (args.phases * args.blocks as u64 * args.samples) as f64;
    println!(
        "result: hits={total_hits} pi_mc={pi_mc:.6} quad_bits={:016x} quad={last_area:.15} ({} nodes x {} procs, {:.3} s)",
        last_area.to_bits(),
        rt.num_nodes(),
        rt.procs(),
        elapsed.as_secs_f64()
    );
    println!(
        "sequential: {seq_secs:.3} s (ratio hyfi/sequential {:.2}, node {})",
        elapsed.as_secs_f64() / seq_secs,
        rt.node()
    );
    let ok = total_hits == seq_hits && (last_area - std::f64::consts::PI).abs() < 1e-12;
    if let Some(t) = rt.traffic() {
        println!("traffic of node {}: {t}", rt.node());
    }
    if ok {
        println!("check: OK (hits equal the sequential count; quadrature within 1e-12 of pi)");
    } else {
        eprintln!(
            "check: FAILED: hits {total_hits} vs sequential {seq_hits}; quadrature error {:e}",
            last_area - std::f64::consts::PI
        );
        std::process::exit(1);
    }
}
