//! Jacobi iteration with iterative filaments: the HyFi paper's Figures 1–2.
//!
//! An `n × n` grid has its top edge held at 1.0 and the other edges at 0.0.
//! Each sweep sets every interior point to the average of its four
//! neighbours from the previous sweep; the sweeps stop when the largest
//! change (`maxdiff`) is below `--eps`, or after `--iters` sweeps.
//!
//! In hyfi terms: one phase whose filaments are the interior points (one
//! filament per point, or with `--per-row` one per row), placed in pools by
//! blocks of rows; `maxdiff` is a reduction variable combined with `Op::Max`
//! by the post-phase code, which also decides whether to go on. The two grids
//! are double-buffered: in sweep `k` (`ctx.iteration()`) the old grid is
//! `grids[k % 2]`, so nothing has to be swapped.
//!
//! The grids are shared arrays of the DSM (`hyfi::Dsm`): each block of rows
//! homed on the node whose filaments compute it and starting on a page
//! (`align_blocks`: rows unpadded, no page holding two nodes' rows), so a
//! sweep moves only the boundary rows between nodes. The same program
//! runs on one node or several:
//!
//! ```text
//! cargo run --release --example jacobi -- --n 1024 --procs 2           # 1 node × 2
//! cargo run --release --example jacobi -- --n 1024 --nodes 2 --procs 1 # 2 local nodes × 1
//! hyfi-run -n 2 -p 2 target/release/examples/jacobi --n 1024           # 2 × 2
//! ```
//!
//! Every node then runs the same sweeps sequentially on plain `Vec<f64>`s
//! and checks that both stopped after the same number of sweeps with the
//! same grid, bit for bit (each point is computed by the same expression in
//! both, and a maximum does not depend on the order it is taken in). It
//! exits with status 1 if they differ or the job fails, 2 for a configuration
//! error (README: exit codes).
//!
//! A run longer than a few seconds shows the sweeps done and the last
//! maxdiff on the terminal (one status line, per node under a local
//! launcher), erased before the results; nothing when stderr is not a
//! terminal (see `hyfi::Progress`, `HYFI_PROGRESS`).

#[path = "common/mod.rs"]
mod common;
use common::at_least;
use std::time::Instant;

use clap::Parser;
use hyfi::{Control, Dsm, Op, Placement, PoolArray, Program, Progress, Runtime};

/// Jacobi iteration on an n×n grid with hyfi's iterative filaments.
#[derive(Parser, Debug, Clone)]
#[command(name = "jacobi")]
pub struct Args {
    /// Grid size (points per side, edges included).
    #[arg(long, default_value_t = 256, value_parser = at_least(3))]
    pub n: usize,
    /// Runtime options (--procs, --pin/--no-pin).
    #[command(flatten)]
    pub runtime: common::RuntimeArgs,
    /// Pools per processor (rows in blocks over them).
    #[arg(long, default_value_t = 1, value_parser = at_least(1))]
    pub pools_per_proc: usize,
    /// When to stop (--iters, --eps).
    #[command(flatten)]
    pub sweeps: common::SweepArgs,
    /// One filament per row instead of one per point.
    #[arg(long)]
    pub per_row: bool,
}

/// What a run computed: sweeps, the last maxdiff, the final grid.
pub use common::SweepOutput as Output;

/// The new value of an interior point. Both versions use this expression,
/// so they round identically.
#[inline(always)]
fn average(up: f64, down: f64, left: f64, right: f64) -> f64 {
    (up + down + left + right) * 0.25
}

/// The sweeps with iterative filaments on `rt`, the grids in `rt`'s
/// shared memory.
pub fn run_hyfi(rt: &Runtime, args: &Args) -> Result<Output, Box<dyn std::error::Error>> {
    let dsm = Dsm::new(rt)?;
    run_dsm(rt, &dsm, args)
}

/// The sweeps on `rt`, the grids allocated in `dsm`.
pub fn run_dsm(rt: &Runtime, dsm: &Dsm, args: &Args) -> Result<Output, Box<dyn std::error::Error>> {
    let n = args.n;
    let inner = 1..n.saturating_sub(1);
    let (eps, max_iters) = (args.sweeps.eps, args.sweeps.iters);
    // Both grids start with the edges, which no filament writes. A block of
    // rows is homed where the pools below compute it, starting on a page.
    let grid = || {
        dsm.matrix::<f64>(n, n)
            .placement(Placement::BlockRows(inner.clone()))
            .align_blocks()
            .from_fn(common::hot_top_edge)
    };
    let grids = [grid()?, grid()?];
    let maxdiff = rt.reduction(0.0f64);
    let (mut iters, mut last, mut converged) = (0usize, 0.0f64, false);
    let progress = Progress::new(rt, "sweeps");

    // Post-phase code (the paper's `check`): the sweep is complete on every
    // processor; combine maxdiff, decide, and reset it for the next sweep.
    let check = |post: &mut hyfi::PostPhase<'_>| {
        iters += 1;
        last = post.get(&maxdiff); // reduced at the sweep's end (below)
        post.set(&maxdiff, 0.0);
        converged = last < eps;
        progress.report(iters as u64, format_args!("maxdiff {last:.3e}"));
        if converged || iters >= max_iters {
            Control::Done
        } else {
            Control::Continue
        }
    };

    // What one pool segment's filaments touch, taken once per segment:
    // the old grid's rows with a one-row halo, read-only (plain memory);
    // the new grid's own rows, written; a segment-local maximum.
    let bind = |ctx: &hyfi::Ctx, span: &hyfi::Span| {
        let k = ctx.iteration() as usize;
        let (old, new) = (&grids[k % 2], &grids[(k + 1) % 2]);
        (
            old.read_rows(ctx, span.rows_with_halo(1, n)),
            new.write_rows(ctx, span.rows()),
            maxdiff.local(ctx, Op::Max),
        )
    };

    let mut prog = Program::new();
    if args.per_row {
        prog.phase_with(
            PoolArray::block(rt, inner.clone(), args.pools_per_proc),
            bind,
            |_ctx, i, (old, new, maxdiff)| {
                let (up, mid, down) = (old.row(i - 1), old.row(i), old.row(i + 1));
                // Rows of one length up front (as the sequential loop does):
                // the indexing below then needs no bounds checks.
                let (up, mid, down) = (&up[..n], &mid[..n], &down[..n]);
                // The row's maximum in a local, folded once per row.
                let mut m = 0.0f64;
                new.row_mut(i).fill(1..n - 1, |j| {
                    let v = average(up[j], down[j], mid[j - 1], mid[j + 1]);
                    let d = (v - mid[j]).abs();
                    if d > m {
                        m = d;
                    }
                    v
                });
                maxdiff.fold(m);
            },
            check,
        );
    } else {
        // The paper's Figure 1: one filament per point.
        prog.phase_with(
            PoolArray::block_rows(rt, inner.clone(), inner.clone(), args.pools_per_proc),
            bind,
            |_ctx, (i, j), (old, new, maxdiff)| {
                let v = average(
                    old[(i - 1, j)],
                    old[(i + 1, j)],
                    old[(i, j - 1)],
                    old[(i, j + 1)],
                );
                new.set(i, j, v);
                maxdiff.fold((v - old[(i, j)]).abs());
            },
            check,
        );
    }
    // maxdiff is reduced by the collective that ends the sweep anyway (on
    // several nodes the DSM's release): no all-reduce of its own.
    prog.reduce_at_end(&maxdiff, Op::Max);

    let t = Instant::now();
    rt.start(&mut prog)?;
    let secs = t.elapsed().as_secs_f64();
    drop(prog);
    progress.finish();
    // After `iters` sweeps the newest grid is the one sweep `iters` would
    // read (on several nodes, read through the DSM from every home).
    let grid = grids[iters % 2].to_vec();
    // After the read, so that the counters hold every page this node
    // fetched (a trace's summary counts them all).
    let dsm_stats = dsm.stats();
    Ok(Output {
        iters,
        maxdiff: last,
        converged,
        grid,
        secs,
        dsm: Some(dsm_stats),
    })
}

/// The same sweeps, sequentially, on plain vectors: the loop an HPC user
/// writes (row slices, `if d > m`), the reference hyfi is timed against.
pub fn run_seq(args: &Args) -> Output {
    let n = args.n;
    let inner = 1..n.saturating_sub(1);
    let mut old: Vec<f64> = (0..n * n)
        .map(|k| common::hot_top_edge(k / n, k % n))
        .collect();
    let mut new = old.clone();
    let mut iters = 0usize;
    let t = Instant::now();
    let (last, converged) = loop {
        let mut m = 0.0f64;
        for i in inner.clone() {
            let (up, mid, down) = (
                &old[(i - 1) * n..i * n],
                &old[i * n..(i + 1) * n],
                &old[(i + 1) * n..(i + 2) * n],
            );
            let out = &mut new[i * n..(i + 1) * n];
            for j in inner.clone() {
                let v = average(up[j], down[j], mid[j - 1], mid[j + 1]);
                out[j] = v;
                let d = (v - mid[j]).abs();
                if d > m {
                    m = d;
                }
            }
        }
        std::mem::swap(&mut old, &mut new);
        iters += 1;
        if m < args.sweeps.eps || iters >= args.sweeps.iters {
            break (m, m < args.sweeps.eps);
        }
    };
    Output {
        iters,
        maxdiff: last,
        converged,
        grid: old,
        secs: t.elapsed().as_secs_f64(),
        dsm: None,
    }
}

fn main() {
    let args = Args::parse();
    let rt = common::or_exit("jacobi", args.runtime.start(|cfg| cfg));
    let par = common::or_exit("jacobi", run_hyfi(&rt, &args));
    let seq = run_seq(&args);

    let grain = if args.per_row { "row" } else { "point" };
    println!(
        "jacobi n={} nodes={} procs={} pools/proc={} one filament per {grain} (node {})",
        args.n,
        rt.num_nodes(),
        rt.procs(),
        args.pools_per_proc,
        rt.node()
    );
    Output::print_beside(&par, &seq);
    print!("{}", rt.stats());
    if let Some(d) = &par.dsm {
        print!("{d}");
        // From the phase's own counters (folded at every release): the
        // total also counts pages served to other nodes' final checks.
        let sweep_bytes = d.per_phase.first().map_or(0, |c| c.bytes_sent);
        println!(
            "dsm bytes sent per sweep: {} (node {})",
            sweep_bytes / par.iters.max(1) as u64,
            rt.node()
        );
    }
    if let Some(t) = rt.traffic() {
        println!("traffic of node {}: {t}", rt.node());
    }
    let check = par.check_same(&seq).map(|()| common::fnv_bytes(&par.grid));
    common::print_ok_or_exit(check, "jacobi: MISMATCH between hyfi and sequential");
}
