//! Recursive Fibonacci with fork-join filaments and pruning (HyFi paper, §4.5).
//!
//! Computes `fib(n)` as `fib(n - 1) + fib(n - 2)`, the two calls a fork-join
//! filament pair (`ctx.join_remote`: the forked call is a serializable
//! filament, so it may run on another node). Each call does almost nothing, so this
//! measures the cost of a fork: with pruning (the default) forks become
//! plain calls once every processor is busy, and idle processors steal the
//! shallowest pending calls; with `--no-prune` every fork is real. With
//! `--cutoff k`, calls with `n < k` run the sequential recursion directly
//! (default 0: none, so the whole tree goes through `join` as in the paper).
//!
//! [`fib`] is written generic over [`Fork`] and its [`RemoteFn`] names its
//! pruned copy: subtrees that pruning runs as plain calls run as that copy,
//! which is the plain recursion (no pruning test, so the compiler turns the
//! second call into a loop as it does for `fib_seq`). The plain recursion it
//! is timed against is `fib_seq(n - 1) + fib_seq(n - 2)`, unchanged.
//!
//! Run it with
//!
//! ```text
//! cargo run --release --example fib -- --n 37 --procs 2
//! cargo run --release --example fib -- --n 30 --procs 2 --no-prune
//! cargo run --release --example fib -- --n 40 --nodes 2 --procs 1   # two local nodes
//! hyfi-run -n 4 -p 1 target/release/examples/fib --n 38             # four local nodes
//! ```
//!
//! On several nodes every node runs the same program (`run_distributed`),
//! prints the result, and prints its own counters and an `fjstats:` line.
//!
//! It checks the result against an iterative `fib`, and prints the time, the
//! value, the ratio to the plain sequential recursion timed in the same run,
//! a verdict and the runtime's counters; it exits non-zero on failure.

#[path = "common/mod.rs"]
mod common;
use std::time::Instant;

use clap::Parser;
use hyfi::{Ctx, Fork, RemoteFn};

/// Largest `n` whose Fibonacci number fits in a `u64`.
pub const MAX_N: u64 = 93;

/// `fib(n)`, its two recursive calls a fork-join filament pair, as a user
/// writes it: `join_remote` at every call, no cutoff.
///
/// Generic over [`Fork`], so the compiler makes two copies: the one for
/// `Ctx` forks or prunes at every join, the one for `Pruned` (which [`FIB`]
/// names with `with_pruned`) is the plain recursion, for the subtrees that
/// pruning runs as plain calls.
pub fn fib(ctx: &impl Fork, n: u64) -> u64 {
    if n < 2 {
        return n;
    }
    let (a, b) = ctx.join_remote(|c| fib(c, n - 1), &FIB, n - 2);
    a + b
}

/// [`fib`] as a filament function any node can run.
pub static FIB: RemoteFn<u64, u64> = RemoteFn::new("fib::fib", fib).with_pruned(fib);

/// [`fib`] with the sequential recursion below `cutoff` (`--cutoff`).
pub fn fib_cutoff(ctx: &impl Fork, n: u64, cutoff: u64) -> u64 {
    if n < 2 {
        return n;
    }
    if n < cutoff {
        return fib_seq(n);
    }
    let (a, b) = ctx.join_remote(
        |c| fib_cutoff(c, n - 1, cutoff),
        &FIB_CUTOFF,
        (n - 2, cutoff),
    );
    a + b
}

/// [`fib_cutoff`] as a filament function any node can run: `(n, cutoff)`.
pub static FIB_CUTOFF: RemoteFn<(u64, u64), u64> =
    RemoteFn::new("fib::fib_cutoff", fib_cutoff_filament).with_pruned(fib_cutoff_filament);

fn fib_cutoff_filament(ctx: &impl Fork, (n, cutoff): (u64, u64)) -> u64 {
    fib_cutoff(ctx, n, cutoff)
}

/// `fib(n)` as the example runs it: [`fib`], or [`fib_cutoff`] for a cutoff
/// above 2 (below that the two are the same).
pub fn fib_hyfi(ctx: &Ctx, n: u64, cutoff: u64) -> u64 {
    if cutoff <= 2 {
        fib(ctx, n)
    } else {
        fib_cutoff(ctx, n, cutoff)
    }
}

/// The plain sequential recursion.
pub fn fib_seq(n: u64) -> u64 {
    if n < 2 {
        return n;
    }
    fib_seq(n - 1) + fib_seq(n - 2)
}

/// The iterative `fib`, the reference value.
pub fn fib_iter(n: u64) -> u64 {
    if n == 0 {
        return 0;
    }
    // (fib(k - 1), fib(k)) for k = 1..=n; never computes fib(n + 1), which
    // would overflow for n = MAX_N.
    let (mut a, mut b) = (0u64, 1u64);
    for _ in 1..n {
        (a, b) = (b, a + b);
    }
    b
}

#[derive(Parser, Debug)]
#[command(about = "Recursive Fibonacci with fork-join filaments (HyFi §4.5)")]
struct Args {
    /// Which Fibonacci number (at most 93; each +1 costs ~1.6x the time).
    #[arg(long, default_value_t = 37)]
    n: u64,
    /// Runtime options (--procs, --pin/--no-pin).
    #[command(flatten)]
    runtime: common::RuntimeArgs,
    /// Make every fork real (no pruning).
    #[arg(long)]
    no_prune: bool,
    /// Below this n, call the sequential fib instead of forking (0: never).
    #[arg(long, default_value_t = 0)]
    cutoff: u64,
    /// Skip the sequential recursion (the answer is still checked against
    /// the iterative fib); for timing runs.
    #[arg(long)]
    no_seq: bool,
}

fn main() {
    let args = Args::parse();
    common::or_exit("fib", run(&args));
}

fn run(args: &Args) -> Result<(), String> {
    let (n, cutoff) = (args.n, args.cutoff);
    if n > MAX_N {
        return Err(format!(
            "--n {n} is too large: fib({n}) overflows u64 (at most {MAX_N})"
        ));
    }
    // A configuration error exits 2, as in every example.
    let rt = common::or_exit(
        "fib",
        args.runtime
            .start(|cfg| if args.no_prune { cfg.prune(false) } else { cfg }),
    );
    FIB.register().map_err(|e| e.to_string())?;
    FIB_CUTOFF.register().map_err(|e| e.to_string())?;
    let prune = if rt.config().get_prune() { "on" } else { "off" };
    println!("fib: n = {n}, cutoff {cutoff}");

    let t = Instant::now();
    let par = rt
        .run_distributed(|ctx| fib_hyfi(ctx, n, cutoff))
        .map_err(|e| e.to_string())?;
    let t_par = t.elapsed().as_secs_f64();

    let want = fib_iter(n);
    println!(
        "hyfi ({} nodes x {} procs, pruning {prune}): {t_par:.3} s",
        rt.num_nodes(),
        rt.procs()
    );
    let seq = if args.no_seq {
        want
    } else {
        let t = Instant::now();
        let seq = fib_seq(std::hint::black_box(n));
        let t_seq = t.elapsed().as_secs_f64();
        println!(
            "sequential recursion:     {t_seq:.3} s   (hyfi/sequential {:.2}, speedup {:.2})",
            t_par / t_seq,
            t_seq / t_par
        );
        seq
    };
    println!("value      {par}");
    println!("result: value={par}");
    common::print_fj_stats(&rt, t_par);
    if par == want && seq == want {
        println!("OK: fib({n}) = {want}, as the iterative fib");
        Ok(())
    } else {
        Err(format!(
            "FAILED: hyfi gave {par}, the sequential recursion {seq}, the iterative fib {want}"
        ))
    }
}
