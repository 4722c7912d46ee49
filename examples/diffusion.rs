//! Explicit heat diffusion: the 5-point stencil users write most, without a
//! reduction.
//!
//! An `n × n` grid has its top edge held at 100 and its left edge at 50;
//! each step sets every interior point to
//! `mid + 0.2·((up + down + left + right) − 4·mid)` from the previous step,
//! for `--steps` steps (no convergence test, so nothing keeps the
//! compiler from vectorising the sequential loop). One filament per point
//! (`new.set`) or, with `--per-row`, one per row (`RowWriter::fill`), on
//! two double-buffered DSM grids, each block of rows homed where it is
//! computed. `--pad-rows` pads every row to whole pages, as the README's
//! Jacobi does; without it rows are contiguous and only the pages at
//! block boundaries are written by two nodes (a diff each way at the
//! release: the other node's to the home, the home's own writes back).
//!
//! ```text
//! cargo run --release --example diffusion -- --n 1026 --per-row --procs 2
//! cargo run --release --example diffusion -- --n 1026 --per-row --nodes 2 --procs 1
//! ```
//!
//! Every node then runs the same steps on plain `Vec<f64>`s and checks the
//! grid bit for bit; exit status 1 if they differ or the job fails, 2 for a
//! configuration error. Issue 22's benchmark: with nothing else touching
//! the new grid's rows, the write views store plainly (`new.set` and
//! `fill` alike) and the compiler vectorises both forms as it does the
//! slice loop (BENCHMARKS.md, stencils without a reduction).

#[path = "common/mod.rs"]
mod common;
use common::at_least;
use std::time::Instant;

use clap::Parser;
use hyfi::{Control, Dsm, Placement, PoolArray, Program, Runtime};

/// Explicit heat diffusion on an n×n grid with hyfi's iterative filaments.
#[derive(Parser, Debug, Clone)]
#[command(name = "diffusion")]
pub struct Args {
    /// Grid size (points per side, edges included).
    #[arg(long, default_value_t = 258, value_parser = at_least(3))]
    pub n: usize,
    /// Runtime options (--nodes, --procs, --pin/--no-pin).
    #[command(flatten)]
    pub runtime: common::RuntimeArgs,
    /// Pools per processor (rows in blocks over them).
    #[arg(long, default_value_t = 1, value_parser = at_least(1))]
    pub pools_per_proc: usize,
    /// Steps to run.
    #[arg(long, default_value_t = 100, value_parser = at_least(1))]
    pub steps: usize,
    /// One filament per row instead of one per point.
    #[arg(long)]
    pub per_row: bool,
    /// Pad every row to whole pages (as the README's Jacobi does).
    #[arg(long)]
    pub pad_rows: bool,
    /// Rows unpadded, each node's block starting on a page
    /// (`MatrixAlloc::align_blocks`).
    #[arg(long, conflicts_with = "pad_rows")]
    pub align_blocks: bool,
}

/// The initial grid: top edge 100, left edge 50, the rest 0.
fn init(i: usize, j: usize) -> f64 {
    if i == 0 {
        100.0
    } else if j == 0 {
        50.0
    } else {
        0.0
    }
}

/// The new value of a point. Both versions use this expression, so they
/// round identically.
#[inline(always)]
fn step(mid: f64, up: f64, down: f64, left: f64, right: f64) -> f64 {
    mid + 0.2 * ((up + down + left + right) - 4.0 * mid)
}

/// What a run produced.
pub use common::StepOutput as Output;

/// The steps with iterative filaments on `rt`.
pub fn run_hyfi(rt: &Runtime, args: &Args) -> Result<Output, Box<dyn std::error::Error>> {
    let (n, steps) = (args.n, args.steps);
    let inner = 1..n - 1;
    let dsm = Dsm::new(rt)?;
    let grid = || {
        let m = dsm.matrix::<f64>(n, n);
        let m = if args.pad_rows { m.pad_rows() } else { m };
        let m = if args.align_blocks {
            m.align_blocks()
        } else {
            m
        };
        m.placement(Placement::BlockRows(inner.clone()))
            .from_fn(init)
    };
    let grids = [grid()?, grid()?];
    // The old grid's rows with a one-row halo, read-only; the new grid's
    // own rows, written.
    let bind = |ctx: &hyfi::Ctx, span: &hyfi::Span| {
        let k = ctx.iteration() as usize;
        (
            grids[k % 2].read_rows(ctx, span.rows_with_halo(1, n)),
            grids[(k + 1) % 2].write_rows(ctx, span.rows()),
        )
    };
    let last = |post: &mut hyfi::PostPhase<'_>| {
        if post.iteration() + 1 >= steps as u64 {
            Control::Done
        } else {
            Control::Continue
        }
    };
    let mut prog = Program::new();
    if args.per_row {
        prog.phase_with(
            PoolArray::block(rt, inner.clone(), args.pools_per_proc),
            bind,
            |_ctx, i, (old, new)| {
                let (up, mid, down) =
                    (&old.row(i - 1)[..n], &old.row(i)[..n], &old.row(i + 1)[..n]);
                new.row_mut(i).fill(1..n - 1, |j| {
                    step(mid[j], up[j], down[j], mid[j - 1], mid[j + 1])
                });
            },
            last,
        );
    } else {
        prog.phase_with(
            PoolArray::block_rows(rt, inner.clone(), inner.clone(), args.pools_per_proc),
            bind,
            |_ctx, (i, j), (old, new)| {
                let v = step(
                    old[(i, j)],
                    old[(i - 1, j)],
                    old[(i + 1, j)],
                    old[(i, j - 1)],
                    old[(i, j + 1)],
                );
                new.set(i, j, v);
            },
            last,
        );
    }
    let t = Instant::now();
    rt.start(&mut prog)?;
    let secs = t.elapsed().as_secs_f64();
    drop(prog);
    // The counters before the final read, which fetches every other node's
    // rows: what the steps moved.
    let dsm = Some(dsm.stats());
    Ok(Output {
        grid: grids[steps % 2].to_vec(),
        secs,
        dsm,
    })
}

/// The same steps, sequentially, on plain vectors: the loop an HPC user
/// writes (row slices), the reference hyfi is timed against.
pub fn run_seq(args: &Args) -> Output {
    let n = args.n;
    let mut old: Vec<f64> = (0..n * n).map(|k| init(k / n, k % n)).collect();
    let mut new = old.clone();
    let t = Instant::now();
    for _ in 0..args.steps {
        for i in 1..n - 1 {
            let (up, mid, down) = (
                &old[(i - 1) * n..i * n],
                &old[i * n..(i + 1) * n],
                &old[(i + 1) * n..(i + 2) * n],
            );
            let out = &mut new[i * n..(i + 1) * n];
            for j in 1..n - 1 {
                out[j] = step(mid[j], up[j], down[j], mid[j - 1], mid[j + 1]);
            }
        }
        std::mem::swap(&mut old, &mut new);
    }
    Output {
        grid: old,
        secs: t.elapsed().as_secs_f64(),
        dsm: None,
    }
}

fn main() {
    let args = Args::parse();
    let rt = common::or_exit("diffusion", args.runtime.start(|cfg| cfg));
    let par = common::or_exit("diffusion", run_hyfi(&rt, &args));
    let seq = run_seq(&args);
    println!(
        "diffusion n={} nodes={} procs={} pools/proc={} one filament per {}{} (node {})",
        args.n,
        rt.num_nodes(),
        rt.procs(),
        args.pools_per_proc,
        if args.per_row { "row" } else { "point" },
        if args.pad_rows {
            ", rows padded to pages"
        } else if args.align_blocks {
            ", blocks aligned to pages"
        } else {
            ""
        },
        rt.node()
    );
    Output::report(&par, &seq, args.steps, args.n, "point ");
}
