//! Explicit 3-D heat diffusion: the 7-point stencil, without a reduction.
//!
//! An `n × n × n` grid has its face `i = 0` held at 100 and its faces
//! `j = 0` and `k = 0` at 30; each step sets every interior point to
//! `c + (north + south + west + east + below + above − 6c)/8` from the
//! previous step, for `--steps` steps. The grid is a shared matrix of `n²`
//! rows, row `(i, j)` holding the `n` points along `k`, rows contiguous
//! (not padded: a row of a small grid is much shorter than a page), each
//! block of rows homed where it is computed. One filament per row: it
//! reads five rows of the old grid, its own and the rows `(i ± 1, j)` and
//! `(i, j ± 1)`, so a node's halo is `n` rows on each side of its block,
//! pushed to it whole by their home at every release (`n = 128`: 32 pages,
//! 128 KiB, a node and step).
//!
//! ```text
//! cargo run --release --example heat3d -- --n 128 --procs 2
//! cargo run --release --example heat3d -- --n 128 --nodes 2 --procs 1
//! ```
//!
//! Every node then runs the same steps on plain `Vec<f64>`s and checks the
//! grid bit for bit; exit status 1 if they differ or the job fails, 2 for a
//! configuration error.

#[path = "common/mod.rs"]
mod common;
use common::at_least;
use std::time::Instant;

use clap::Parser;
use hyfi::{Control, Dsm, Placement, PoolArray, Program, Runtime};

/// Explicit 3-D heat diffusion on an n×n×n grid with hyfi's iterative
/// filaments.
#[derive(Parser, Debug, Clone)]
#[command(name = "heat3d")]
pub struct Args {
    /// Grid size (points per side, faces included).
    #[arg(long, default_value_t = 64, value_parser = at_least(3))]
    pub n: usize,
    /// Runtime options (--nodes, --procs, --pin/--no-pin).
    #[command(flatten)]
    pub runtime: common::RuntimeArgs,
    /// Pools per processor (rows in blocks over them).
    #[arg(long, default_value_t = 1, value_parser = at_least(1))]
    pub pools_per_proc: usize,
    /// Steps to run.
    #[arg(long, default_value_t = 50, value_parser = at_least(1))]
    pub steps: usize,
}

/// The initial value of point `k` of row `r = i·n + j`.
fn init(n: usize) -> impl Fn(usize, usize) -> f64 {
    move |r, k| {
        let (i, j) = (r / n, r % n);
        if i == 0 {
            100.0
        } else if j == 0 || k == 0 {
            30.0
        } else {
            0.0
        }
    }
}

/// The new value of a point. Both versions use this expression, so they
/// round identically.
#[inline(always)]
fn step(c: f64, [n, s, w, e, b, a]: [f64; 6]) -> f64 {
    c + 0.125 * ((n + s + w + e + b + a) - 6.0 * c)
}

/// What a run produced.
pub use common::StepOutput as Output;

/// The steps with iterative filaments on `rt`.
pub fn run_hyfi(rt: &Runtime, args: &Args) -> Result<Output, Box<dyn std::error::Error>> {
    let (n, steps) = (args.n, args.steps);
    let rows = n * n;
    // Rows (1, 1) to (n − 2, n − 2): the faces i = 0 and i = n − 1 are
    // outside; rows with j on a face are inside and skipped by their
    // filament.
    let inner = n + 1..rows - n - 1;
    let dsm = Dsm::new(rt)?;
    let grid = || {
        dsm.matrix::<f64>(rows, n)
            .placement(Placement::BlockRows(inner.clone()))
            .from_fn(init(n))
    };
    let grids = [grid()?, grid()?];
    let mut prog = Program::new();
    prog.phase_with(
        PoolArray::block(rt, inner.clone(), args.pools_per_proc),
        // The old grid's rows with a halo of n rows, read-only; the new
        // grid's own rows, written.
        |ctx: &hyfi::Ctx, span: &hyfi::Span| {
            let k = ctx.iteration() as usize;
            (
                grids[k % 2].read_rows(ctx, span.rows_with_halo(n, rows)),
                grids[(k + 1) % 2].write_rows(ctx, span.rows()),
            )
        },
        |_ctx, r, (old, new)| {
            if r % n == 0 || r % n == n - 1 {
                return; // a face j = 0 or j = n − 1: held
            }
            let row = |q: usize| &old.row(q)[..n];
            let (c, north, south, west, east) =
                (row(r), row(r - n), row(r + n), row(r - 1), row(r + 1));
            new.row_mut(r).fill(1..n - 1, |k| {
                step(
                    c[k],
                    [north[k], south[k], west[k], east[k], c[k - 1], c[k + 1]],
                )
            });
        },
        |post| {
            if post.iteration() + 1 >= steps as u64 {
                Control::Done
            } else {
                Control::Continue
            }
        },
    );
    let t = Instant::now();
    rt.start(&mut prog)?;
    let secs = t.elapsed().as_secs_f64();
    drop(prog);
    // The counters before the final read, which fetches every other node's
    // rows: what the steps moved.
    let stats = dsm.stats();
    Ok(Output {
        grid: grids[steps % 2].to_vec(),
        secs,
        dsm: Some(stats),
    })
}

/// The same steps, sequentially, on plain vectors: the loop an HPC user
/// writes (row slices), the reference hyfi is timed against.
pub fn run_seq(args: &Args) -> Output {
    let n = args.n;
    let f = init(n);
    let mut old: Vec<f64> = (0..n * n * n).map(|x| f(x / n, x % n)).collect();
    let mut new = old.clone();
    let t = Instant::now();
    for _ in 0..args.steps {
        for i in 1..n - 1 {
            for j in 1..n - 1 {
                let r = i * n + j;
                let row = |q: usize| &old[q * n..(q + 1) * n];
                let (c, north, south, west, east) =
                    (row(r), row(r - n), row(r + n), row(r - 1), row(r + 1));
                let out = &mut new[r * n..(r + 1) * n];
                for k in 1..n - 1 {
                    out[k] = step(
                        c[k],
                        [north[k], south[k], west[k], east[k], c[k - 1], c[k + 1]],
                    );
                }
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
    let rt = common::or_exit("heat3d", args.runtime.start(|cfg| cfg));
    let par = common::or_exit("heat3d", run_hyfi(&rt, &args));
    let seq = run_seq(&args);
    println!(
        "heat3d n={} nodes={} procs={} pools/proc={} one filament per row of {} points (node {})",
        args.n,
        rt.num_nodes(),
        rt.procs(),
        args.pools_per_proc,
        args.n,
        rt.node()
    );
    Output::report(&par, &seq, args.steps, args.n, "row ");
}
