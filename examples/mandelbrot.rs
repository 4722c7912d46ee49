//! Escape counts of the Mandelbrot set, one filament per row: a phase whose
//! filaments cost very unequal amounts.
//!
//! Row `i` of the `n × n` picture is the line `y = 1.2 · i / n` for `x` in
//! [-2, 0.6): the rows near the real axis (the first ones) cross the set
//! and cost up to `--max-iter` iterations a point, the last ones a few. In
//! blocks of rows (`PoolArray::block`), the processor holding the first
//! rows has most of the work. Within a node the processors share it out:
//! each pool is cut into chunks (`Config::chunks`, `HYFI_CHUNKS`) and a
//! processor with none of its own left takes chunks from the back of
//! another's pools (see `ProcStats::chunks_stolen` in the report). Across
//! nodes rows stay where they are placed (`--nodes 2` runs at the speed of
//! the node with the first rows).
//!
//! The phase runs `--reps` times; each writes the counts into a shared
//! matrix through a write view and sums them in a reduction. It is timed
//! against the sequential loop over row slices and against rayon
//! (`par_chunks_mut` over rows, its adaptive splitting) on as many threads
//! as the job has processors, in the same process, and checked against the
//! sequential counts, every one, and their sum.
//!
//! ```text
//! cargo run --release --example mandelbrot -- --n 1024 --procs 2
//! HYFI_CHUNKS=1 cargo run --release --example mandelbrot -- --n 1024 --procs 2
//! ```
//!
//! Exits with status 1 if a count differs, 2 if the runtime fails.

#[path = "common/mod.rs"]
mod common;
use common::at_least;
use std::time::Instant;

use clap::Parser;
use hyfi::{Control, Dsm, Op, PoolArray, Program};
use rayon::prelude::*;

/// Mandelbrot escape counts with one filament per row.
#[derive(Parser, Debug, Clone)]
#[command(name = "mandelbrot")]
pub struct Args {
    /// Picture size (rows and columns).
    #[arg(long, default_value_t = 1024, value_parser = at_least(2))]
    pub n: usize,
    /// Iterations at most per point.
    #[arg(long, default_value_t = 500, value_parser = at_least(1))]
    pub max_iter: usize,
    /// Executions of the phase (and of each baseline).
    #[arg(long, default_value_t = 3, value_parser = at_least(1))]
    pub reps: usize,
    /// Runtime options (--nodes, --procs, --pin/--no-pin).
    #[command(flatten)]
    pub runtime: common::RuntimeArgs,
}

/// Iterations until point `(cx, cy)` escapes the disc of radius 2, at most `max`.
fn escape(cx: f64, cy: f64, max: u32) -> u32 {
    let (mut x, mut y, mut k) = (0.0f64, 0.0f64, 0);
    while k < max && x * x + y * y <= 4.0 {
        let t = x * x - y * y + cx;
        y = 2.0 * x * y + cy;
        x = t;
        k += 1;
    }
    k
}

/// Row `i` of the picture into `out`.
fn row(i: usize, n: usize, max: u32, out: &mut [u32]) {
    let cy = 1.2 * i as f64 / n as f64;
    for (j, o) in out.iter_mut().enumerate() {
        *o = escape(-2.0 + 2.6 * j as f64 / n as f64, cy, max);
    }
}

fn main() {
    let args = Args::parse();
    let rt = common::or_exit("mandelbrot", args.runtime.start(|cfg| cfg));
    let dsm = common::or_exit("mandelbrot", Dsm::new(&rt));
    let (n, max, reps) = (args.n, args.max_iter as u32, args.reps);
    let img = common::or_exit("mandelbrot", dsm.matrix::<u32>(n, n).zeroed());
    let total = rt.reduction(0u64);
    let mut sums = Vec::new();
    let mut prog = Program::new();
    prog.phase_with(
        PoolArray::block(&rt, 0..n, 1),
        |ctx, span| {
            (
                img.write_rows(ctx, span.rows()),
                total.local(ctx, Op::Sum),
                vec![0u32; n],
            )
        },
        move |_ctx, i, (w, acc, buf)| {
            row(i, n, max, buf);
            acc.fold(buf.iter().map(|&k| k as u64).sum());
            w.write_row(i, 0, buf);
        },
        |post| {
            sums.push(post.reduce(&total, Op::Sum));
            post.set(&total, 0);
            if post.iteration() + 1 == reps as u64 {
                Control::Done
            } else {
                Control::Continue
            }
        },
    );
    let t = Instant::now();
    common::or_exit("mandelbrot", rt.start(&mut prog));
    let secs = t.elapsed().as_secs_f64() / reps as f64;
    drop(prog);

    let mut seq = vec![0u32; n * n];
    let t = Instant::now();
    for _ in 0..reps {
        for (i, r) in seq.chunks_mut(n).enumerate() {
            row(i, n, max, r);
        }
    }
    let seq_secs = t.elapsed().as_secs_f64() / reps as f64;
    let threads = rt.num_nodes() * rt.procs();
    let pool = common::or_exit(
        "mandelbrot",
        rayon::ThreadPoolBuilder::new().num_threads(threads).build(),
    );
    let mut par = vec![0u32; n * n];
    let t = Instant::now();
    pool.install(|| {
        for _ in 0..reps {
            par.par_chunks_mut(n)
                .enumerate()
                .for_each(|(i, r)| row(i, n, max, r));
        }
    });
    let par_secs = t.elapsed().as_secs_f64() / reps as f64;

    println!(
        "mandelbrot n={n} max_iter={max} reps={reps} nodes={} procs={} chunks={} (node {})",
        rt.num_nodes(),
        rt.procs(),
        rt.chunks(),
        rt.node()
    );
    println!("hyfi:       {secs:.4} s per execution");
    println!("sequential: {seq_secs:.4} s (the loop over row slices)");
    println!("rayon:      {par_secs:.4} s ({threads} threads, par_chunks_mut over rows)");
    println!(
        "ratio hyfi/sequential: {:.3}; hyfi/rayon: {:.3}",
        secs / seq_secs,
        secs / par_secs
    );
    print!("{}", rt.stats());
    let want: u64 = seq.iter().map(|&k| k as u64).sum();
    let got = img.to_vec();
    let bad = got.iter().zip(&seq).position(|(a, b)| a != b);
    if par != seq || bad.is_some() || sums.iter().any(|&s| s != want) {
        eprintln!(
            "mandelbrot: MISMATCH: first differing count at {bad:?} (row-major), sums {sums:?} \
             against {want}, rayon {}",
            if par == seq { "agrees" } else { "differs" }
        );
        std::process::exit(1);
    }
    println!("OK: every count and the sum of each execution equal the sequential ones ({want})");
}
