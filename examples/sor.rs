//! Red-black SOR with iterative filaments: a grid updated in place.
//!
//! An `n × n` grid has its top edge held at 1.0 and the other edges at 0.0.
//! A sweep colours the interior points like a chessboard, `(i + j) % 2`,
//! and updates first every red point, then every black one, each to
//! `(1 - ω)·u + ω·(average of its four neighbours)`; a red point's
//! neighbours are all black and the reverse, so the points of one colour
//! can be updated in any order and in parallel, in place (Gauss–Seidel when
//! ω = 1). The sweeps stop when the largest change of a sweep is below
//! `--eps`, or after `--iters` sweeps.
//!
//! In hyfi terms: two phases per sweep over pools from
//! `PoolArray::block_rows_red_black` (one segment per row, its columns two
//! apart). Jacobi (`examples/jacobi.rs`) reads one grid and writes the
//! other, so it takes a read view of the old grid's rows with a halo; here
//! the one grid is both read and written in each phase, so each segment
//! takes a *write* view of its rows with a one-row halo and reads the
//! neighbours through it (`get`). The largest change is a `Max` reduction
//! folded in a register (`Reduction::local`), combined by the black
//! phase's post-phase code, which decides whether to go on.
//!
//! On several nodes a block's halo rows are another node's: the write view
//! makes their pages writable here (a twin is taken), but nothing is
//! stored into them, so the release finds them unchanged and treats this
//! node as a reader of them: no diff, no write notice, and the copy stays,
//! refreshed by its home's push (`unchanged` in the counters). The
//! program prints the shared memory's traffic per sweep: after the first,
//! no page is fetched.
//!
//! ```text
//! cargo run --release --example sor -- --n 1024 --procs 2           # 1 node × 2
//! cargo run --release --example sor -- --n 1024 --nodes 2 --procs 1 # 2 local nodes × 1
//! ```
//!
//! Every node then runs the same sweeps sequentially on a plain `Vec<f64>`
//! and checks that both did the same number of sweeps and hold the same
//! grid, bit for bit (each point is computed by the same expression from
//! the same values in both). It exits with status 1 if they differ or the
//! job fails, 2 for a configuration error (README: exit codes).

#[path = "common/mod.rs"]
mod common;
use common::at_least;
use std::time::Instant;

use clap::Parser;
use hyfi::{Control, Dsm, Local, Op, Placement, PoolArray, Program, Runtime, WriteRows};

/// Red-black SOR on an n×n grid, in place, with hyfi's iterative filaments.
#[derive(Parser, Debug, Clone)]
#[command(name = "sor")]
pub struct Args {
    /// Grid size (points per side, edges included).
    #[arg(long, default_value_t = 512, value_parser = at_least(3))]
    pub n: usize,
    /// Runtime options (--nodes, --procs, --pin/--no-pin).
    #[command(flatten)]
    pub runtime: common::RuntimeArgs,
    /// Pools per processor (rows in blocks over them).
    #[arg(long, default_value_t = 1, value_parser = at_least(1))]
    pub pools_per_proc: usize,
    /// Relaxation factor ω (1 is Gauss–Seidel; between 0 and 2 converges).
    #[arg(long, default_value_t = 1.5)]
    pub omega: f64,
    /// When to stop (--iters, --eps).
    #[command(flatten)]
    pub sweeps: common::SweepArgs,
}

/// What a run computed: sweeps, the last maxdiff, the final grid.
pub use common::SweepOutput as Output;

/// The new value of a point from its own and its neighbours'. Both
/// versions use this expression, so they round identically.
#[inline(always)]
fn relax(omega: f64, u: f64, up: f64, down: f64, left: f64, right: f64) -> f64 {
    (1.0 - omega) * u + omega * ((up + down + left + right) * 0.25)
}

/// The sweeps with iterative filaments on `rt`, the grid in `rt`'s shared
/// memory.
pub fn run_hyfi(rt: &Runtime, args: &Args) -> Result<Output, Box<dyn std::error::Error>> {
    let dsm = Dsm::new(rt)?;
    let (n, omega) = (args.n, args.omega);
    let (eps, max_iters) = (args.sweeps.eps, args.sweeps.iters);
    let inner = 1..n - 1;
    // One grid, rows padded to pages, each block of rows homed on the node
    // whose pools update it.
    let u = dsm
        .matrix::<f64>(n, n)
        .pad_rows()
        .placement(Placement::BlockRows(inner.clone()))
        .from_fn(common::hot_top_edge)?;
    let change = rt.reduction(0.0f64);
    let (mut iters, mut last, mut converged) = (0usize, 0.0f64, false);

    // Per segment (one row of one colour): the row with its neighbours,
    // written in place (only the row itself is stored into), and the
    // largest change in a register.
    let bind = |ctx: &hyfi::Ctx, span: &hyfi::Span| {
        (
            u.write_rows(ctx, span.rows_with_halo(1, n)),
            change.local(ctx, Op::Max),
        )
    };
    // Both phases' filament: the neighbours are of the other colour, which
    // nobody writes in this phase.
    let point = |_: &hyfi::Ctx,
                 (i, j): (usize, usize),
                 (v, m): &mut (WriteRows<'_, f64>, Local<'_, f64>)| {
        let old = v.get(i, j);
        let x = relax(
            omega,
            old,
            v.get(i - 1, j),
            v.get(i + 1, j),
            v.get(i, j - 1),
            v.get(i, j + 1),
        );
        v.set(i, j, x);
        m.fold((x - old).abs());
    };

    let mut prog = Program::new();
    prog.phase_with(
        PoolArray::block_rows_red_black(rt, inner.clone(), inner.clone(), 0, args.pools_per_proc),
        bind,
        point,
        |_| Control::Continue,
    );
    prog.phase_with(
        PoolArray::block_rows_red_black(rt, inner.clone(), inner.clone(), 1, args.pools_per_proc),
        bind,
        point,
        // The sweep is complete: combine the change of both colours, reset
        // it, decide.
        |post| {
            iters += 1;
            last = post.reduce(&change, Op::Max);
            post.set(&change, 0.0);
            converged = last < eps;
            if converged || iters >= max_iters {
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
    let dsm_stats = dsm.stats();
    Ok(Output {
        iters,
        maxdiff: last,
        converged,
        grid: u.to_vec(),
        secs,
        dsm: Some(dsm_stats),
    })
}

/// The same sweeps, sequentially, on a plain vector: red points, then
/// black, row by row.
pub fn run_seq(args: &Args) -> Output {
    let (n, omega) = (args.n, args.omega);
    let mut u: Vec<f64> = (0..n * n)
        .map(|k| common::hot_top_edge(k / n, k % n))
        .collect();
    let mut iters = 0usize;
    let t = Instant::now();
    let (last, converged) = loop {
        let mut m = 0.0f64;
        for colour in 0..2 {
            for i in 1..n - 1 {
                // The first column of the colour in this row: (i + j) % 2 == colour.
                let first = 1 + (colour + i + 1) % 2;
                for j in (first..n - 1).step_by(2) {
                    let old = u[i * n + j];
                    let x = relax(
                        omega,
                        old,
                        u[(i - 1) * n + j],
                        u[(i + 1) * n + j],
                        u[i * n + j - 1],
                        u[i * n + j + 1],
                    );
                    u[i * n + j] = x;
                    let d = (x - old).abs();
                    if d > m {
                        m = d;
                    }
                }
            }
        }
        iters += 1;
        if m < args.sweeps.eps || iters >= args.sweeps.iters {
            break (m, m < args.sweeps.eps);
        }
    };
    Output {
        iters,
        maxdiff: last,
        converged,
        grid: u,
        secs: t.elapsed().as_secs_f64(),
        dsm: None,
    }
}

fn main() {
    let args = Args::parse();
    let rt = common::or_exit("sor", args.runtime.start(|cfg| cfg));
    let par = common::or_exit("sor", run_hyfi(&rt, &args));
    let seq = run_seq(&args);

    println!(
        "sor n={} omega={} nodes={} procs={} pools/proc={} (node {})",
        args.n,
        args.omega,
        rt.num_nodes(),
        rt.procs(),
        args.pools_per_proc,
        rt.node()
    );
    Output::print_beside(&par, &seq);
    print!("{}", rt.stats());
    if let Some(d) = &par.dsm {
        print!("{d}");
        // The two phases' own counters (folded at every release), per sweep.
        let sweeps = par.iters.max(1) as u64;
        let sum = |f: fn(&hyfi::DsmCounters) -> u64| d.per_phase.iter().take(2).map(f).sum::<u64>();
        println!(
            "dsm per sweep: {} pages fetched, {} pushed, {} notices, {} bytes sent (node {})",
            sum(|c| c.pages_fetched) / sweeps,
            sum(|c| c.pages_pushed) / sweeps,
            sum(|c| c.notices_sent) / sweeps,
            sum(|c| c.bytes_sent) / sweeps,
            rt.node()
        );
    }
    let check = par.check_same(&seq).map(|()| common::fnv_bytes(&par.grid));
    common::print_ok_or_exit(check, "sor: MISMATCH between hyfi and sequential");
}
