//! Conjugate gradients for the 2-D Poisson problem: the solver HPC users
//! write around a stencil, with two dot products an iteration.
//!
//! `−Δu = f` on the interior of an `n × n` grid (edges held at 0), the
//! 5-point Laplacian `4u(i,j) − u(i±1,j) − u(i,j±1)`, `f` smooth. Each
//! iteration is three phases, one filament per row, on four DSM grids
//! whose blocks of rows are homed where they are computed:
//!
//! 1. `q = A·p` (the one phase that reads other rows: `p`'s halo) and `p·q`;
//! 2. `x += α·p`, `r −= α·q` and `r·r`, read and rewritten in place with
//!    `RowWriter::update`;
//! 3. `p = r + β·p`.
//!
//! The dot products are [`hyfi::ExactSum`]s of per-row sums, so the
//! answer does not depend on how the rows are shared out: every
//! configuration, and the sequential loop on plain `Vec<f64>`s that every
//! node runs afterwards, give the same bits, which the example checks.
//!
//! ```text
//! cargo run --release --example cg -- --n 512 --procs 2
//! cargo run --release --example cg -- --n 512 --nodes 2 --procs 1
//! ```
//!
//! Exit status 1 if the results differ or the job fails, 2 for a
//! configuration error.

#[path = "common/mod.rs"]
mod common;
use common::at_least;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use clap::Parser;
use hyfi::exact::ExactAccumulator;
use hyfi::{Control, Dsm, Placement, PoolArray, Program, Runtime};

/// Conjugate gradients for −Δu = f with hyfi's iterative filaments.
#[derive(Parser, Debug, Clone)]
#[command(name = "cg")]
pub struct Args {
    /// Grid size (points per side, edges included).
    #[arg(long, default_value_t = 130, value_parser = at_least(3))]
    pub n: usize,
    /// Runtime options (--nodes, --procs, --pin/--no-pin).
    #[command(flatten)]
    pub runtime: common::RuntimeArgs,
    /// Most iterations to run.
    #[arg(long, default_value_t = 200, value_parser = at_least(1))]
    pub iters: usize,
    /// Stop once |r| ≤ tol·|b|.
    #[arg(long, default_value_t = 1e-8)]
    pub tol: f64,
}

/// The right-hand side at an interior point (0 on the edges).
fn rhs(i: usize, j: usize, n: usize) -> f64 {
    if i == 0 || j == 0 || i == n - 1 || j == n - 1 {
        return 0.0;
    }
    let (x, y) = (i as f64 / n as f64, j as f64 / n as f64);
    (7.0 * x).sin() * (3.0 * y).cos() + 1.0
}

/// `(A·p)(i, j)` from `p`'s rows above, at and below `i`. Both versions
/// use this expression, so they round alike.
#[inline(always)]
fn laplacian(up: &[f64], mid: &[f64], down: &[f64], j: usize) -> f64 {
    4.0 * mid[j] - up[j] - down[j] - mid[j - 1] - mid[j + 1]
}

/// What a run produced.
pub struct Output {
    /// The solution, edges included.
    pub x: Vec<f64>,
    /// Iterations run.
    pub iters: usize,
    /// `r·r` at the end.
    pub rr: f64,
    /// Seconds of the iterations alone.
    pub secs: f64,
}

/// The iterations with iterative filaments on `rt`.
pub fn run_hyfi(rt: &Runtime, args: &Args) -> Result<Output, Box<dyn std::error::Error>> {
    let n = args.n;
    let inner = 1..n - 1;
    let dsm = Dsm::new(rt)?;
    let grid = |f: fn(usize, usize, usize) -> f64| {
        dsm.matrix::<f64>(n, n)
            .placement(Placement::BlockRows(inner.clone()))
            .align_blocks()
            .from_fn(|i, j| f(i, j, n))
    };
    let zero = |_: usize, _: usize, _: usize| 0.0;
    let (x, r, p, q) = (grid(zero)?, grid(rhs)?, grid(rhs)?, grid(zero)?);
    let dot = rt.exact_sum();
    // Scalars the post-phase code sets and the next phase's filaments
    // read (f64 bits).
    let rr = AtomicU64::new(0);
    let alpha = AtomicU64::new(0);
    let beta = AtomicU64::new(0);
    let get = |a: &AtomicU64| f64::from_bits(a.load(Ordering::Relaxed));
    let set = |a: &AtomicU64, v: f64| a.store(v.to_bits(), Ordering::Relaxed);

    // r·r at the start (r = b).
    let mut prog = Program::new();
    prog.phase_with(
        PoolArray::block(rt, inner.clone(), 1),
        |ctx, span| r.read_rows(ctx, span.rows()),
        |ctx, i, r| dot.fold(ctx, r.row(i)[1..n - 1].iter().map(|v| v * v).sum()),
        |post| {
            set(&rr, post.reduce_exact(&dot));
            post.set_exact(&dot, 0.0);
            Control::Done
        },
    );
    rt.start(&mut prog)?;
    drop(prog);
    let stop = args.tol * args.tol * get(&rr);

    let mut iters = 0usize;
    let mut prog = Program::new();
    prog.phase_with(
        PoolArray::block(rt, inner.clone(), 1),
        |ctx, span| {
            (
                p.read_rows(ctx, span.rows_with_halo(1, n)),
                q.write_rows(ctx, span.rows()),
            )
        },
        |ctx, i, (p, q)| {
            let (up, mid, down) = (&p.row(i - 1)[..n], &p.row(i)[..n], &p.row(i + 1)[..n]);
            let mut pq = 0.0;
            q.row_mut(i).fill(1..n - 1, |j| {
                let v = laplacian(up, mid, down, j);
                pq += mid[j] * v;
                v
            });
            dot.fold(ctx, pq);
        },
        |post| {
            let pq = post.reduce_exact(&dot);
            post.set_exact(&dot, 0.0);
            set(&alpha, get(&rr) / pq);
            Control::Continue
        },
    );
    prog.phase_with(
        PoolArray::block(rt, inner.clone(), 1),
        |ctx, span| {
            (
                p.read_rows(ctx, span.rows()),
                q.read_rows(ctx, span.rows()),
                x.write_rows(ctx, span.rows()),
                r.write_rows(ctx, span.rows()),
            )
        },
        |ctx, i, (p, q, x, r)| {
            let a = get(&alpha);
            let (p, q) = (&p.row(i)[..n], &q.row(i)[..n]);
            x.row_mut(i).update(1..n - 1, |j, old| old + a * p[j]);
            let mut rr_row = 0.0;
            r.row_mut(i).update(1..n - 1, |j, old| {
                let v = old - a * q[j];
                rr_row += v * v;
                v
            });
            dot.fold(ctx, rr_row);
        },
        |post| {
            let rr_new = post.reduce_exact(&dot);
            post.set_exact(&dot, 0.0);
            set(&beta, rr_new / get(&rr));
            set(&rr, rr_new);
            iters += 1;
            if iters >= args.iters || rr_new <= stop {
                Control::Done
            } else {
                Control::Continue
            }
        },
    );
    prog.phase_with(
        PoolArray::block(rt, inner.clone(), 1),
        |ctx, span| {
            (
                r.read_rows(ctx, span.rows()),
                p.write_rows(ctx, span.rows()),
            )
        },
        |_ctx, i, (r, p)| {
            let b = get(&beta);
            let r = &r.row(i)[..n];
            p.row_mut(i).update(1..n - 1, |j, old| r[j] + b * old);
        },
        |_| Control::Continue,
    );
    let t = Instant::now();
    rt.start(&mut prog)?;
    let secs = t.elapsed().as_secs_f64();
    drop(prog);
    Ok(Output {
        x: x.to_vec(),
        iters,
        rr: get(&rr),
        secs,
    })
}

/// The exact sum of `parts`, added in order (as `ExactSum` adds them in
/// any order: exactly, then rounded once).
fn exact(parts: impl Iterator<Item = f64>) -> f64 {
    let mut s = ExactAccumulator::new();
    for v in parts {
        s.add(v);
    }
    s.value()
}

/// The same iterations on plain vectors, row slices, the same row sums
/// added exactly: the loop an HPC user writes, and the reference.
pub fn run_seq(args: &Args) -> Output {
    let n = args.n;
    let b: Vec<f64> = (0..n * n).map(|k| rhs(k / n, k % n, n)).collect();
    let (mut x, mut r, mut p, mut q) = (vec![0.0; n * n], b.clone(), b, vec![0.0; n * n]);
    let t = Instant::now();
    let mut rr =
        exact((1..n - 1).map(|i| r[i * n + 1..(i + 1) * n - 1].iter().map(|v| v * v).sum()));
    let stop = args.tol * args.tol * rr;
    let mut iters = 0;
    while iters < args.iters {
        let mut pq_rows = vec![0.0; n];
        for i in 1..n - 1 {
            let (up, mid, down) = (
                &p[(i - 1) * n..i * n],
                &p[i * n..(i + 1) * n],
                &p[(i + 1) * n..(i + 2) * n],
            );
            let out = &mut q[i * n..(i + 1) * n];
            let mut pq = 0.0;
            for j in 1..n - 1 {
                let v = laplacian(up, mid, down, j);
                pq += mid[j] * v;
                out[j] = v;
            }
            pq_rows[i] = pq;
        }
        let alpha = rr / exact(pq_rows[1..n - 1].iter().copied());
        let mut rr_rows = vec![0.0; n];
        for i in 1..n - 1 {
            let (pi, qi) = (&p[i * n..(i + 1) * n], &q[i * n..(i + 1) * n]);
            let xi = &mut x[i * n..(i + 1) * n];
            for j in 1..n - 1 {
                xi[j] += alpha * pi[j];
            }
            let ri = &mut r[i * n..(i + 1) * n];
            let mut s = 0.0;
            for j in 1..n - 1 {
                let v = ri[j] - alpha * qi[j];
                s += v * v;
                ri[j] = v;
            }
            rr_rows[i] = s;
        }
        let rr_new = exact(rr_rows[1..n - 1].iter().copied());
        let beta = rr_new / rr;
        rr = rr_new;
        iters += 1;
        if rr_new <= stop {
            break;
        }
        for i in 1..n - 1 {
            let ri = &r[i * n..(i + 1) * n];
            let pi = &mut p[i * n..(i + 1) * n];
            for j in 1..n - 1 {
                pi[j] = ri[j] + beta * pi[j];
            }
        }
    }
    Output {
        x,
        iters,
        rr,
        secs: t.elapsed().as_secs_f64(),
    }
}

fn main() {
    let args = Args::parse();
    let rt = common::or_exit("cg", args.runtime.start(|cfg| cfg));
    let par = common::or_exit("cg", run_hyfi(&rt, &args));
    let seq = run_seq(&args);
    println!(
        "cg n={} nodes={} procs={} (node {})",
        args.n,
        rt.num_nodes(),
        rt.procs(),
        rt.node()
    );
    println!(
        "hyfi:       {:.4} s, {} iterations, r·r {:e}",
        par.secs, par.iters, par.rr
    );
    println!(
        "sequential: {:.4} s, {} iterations, r·r {:e}",
        seq.secs, seq.iters, seq.rr
    );
    if par.iters != seq.iters || par.rr.to_bits() != seq.rr.to_bits() {
        eprintln!(
            "MISMATCH: {} iterations and r·r {:e} against {} and {:e}",
            par.iters, par.rr, seq.iters, seq.rr
        );
        std::process::exit(1);
    }
    let check = common::same_bits("point ", &par.x, &seq.x, args.n)
        .map(|()| common::fnv_words(par.x.iter().map(|v| v.to_bits())));
    common::print_ok_or_exit(check, "MISMATCH");
}
