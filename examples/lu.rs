//! LU decomposition with partial pivoting, with iterative filaments (the
//! HyFi paper, §4.2).
//!
//! Factors a pseudo-random `n × n` matrix `A` (entries in [-1, 1), from
//! `--seed`) in place into `P·A = L·U`: `L` unit lower triangular (below the
//! diagonal), `U` upper triangular (on and above it), `P` the row
//! permutation chosen by partial pivoting.
//!
//! In hyfi terms: a program of one phase run once per step `k`
//! (`ctx.iteration()`), with one filament per row and the rows dealt
//! cyclically over the processors (the work shrinks as `k` grows, so blocks
//! would leave the first processors idle). Each row not yet chosen as a
//! pivot stores its multiplier `l = a[i][k] / a[p][k]`, subtracts `l ×` the
//! pivot row `p`, and then offers `|a[i][k+1]|`, its candidacy for the next
//! step, to the reduction variable `pivot` (the pivot search looks ahead,
//! as HPL's does, so a step costs one phase end, not two). The phase's end
//! reduces it (largest magnitude, lowest row on ties: the row a sequential
//! scan picks) in the release itself, and carries the chosen row to every
//! node with it (`DsmMatrix::reduce_at_end_with_row`): a step is one
//! exchange. The post-phase code reads the pivot and records step `k + 1`'s
//! pivot row. Step 0's pivot is found before the program, from the input
//! every node holds.
//!
//! Rows are not moved: the permutation is kept aside (node-local, the same
//! on every node because every node reduces the same pivot), and row `i`
//! of `L·U` is the matrix's row `perm[i]` at the end. So no row is written
//! by two nodes, and the pivot row is the only one a step moves between
//! nodes: every node's filaments read it, and it came with the pivot.
//!
//! The matrix is a shared array of the DSM, rows padded to pages and homed
//! cyclically exactly as the pools deal them out. Filaments of rows already
//! finished return at once: pools are built once, as in the paper.
//!
//! Run it with
//!
//! ```text
//! cargo run --release --example lu -- --n 512 --procs 2
//! cargo run --release --example lu -- --n 512 --nodes 2 --procs 1
//! ```
//!
//! It checks that a sequential LU of the same matrix gives the same factors
//! and permutation bit for bit (every row goes through the same flops in
//! the same order), and that `‖P·A − L·U‖∞ / (n ‖A‖∞ ε)` is small. It exits
//! with status 1 if a check fails or the job fails, 2 for a configuration error
//! (README: exit codes).

#[path = "common/mod.rs"]
mod common;
use common::at_least;
/// The `n × n` input matrices: entries in [-1, 1) from a splitmix64 stream.
pub use common::random_matrix as matrix;
use std::time::Instant;

use bytemuck::{Pod, Zeroable};
use clap::Parser;
use hyfi::{Control, Dsm, Placement, PoolArray, Program, Progress, Runtime};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{RwLock, RwLockWriteGuard};

/// LU decomposition with partial pivoting with hyfi's iterative filaments.
#[derive(Parser, Debug, Clone)]
#[command(name = "lu")]
pub struct Args {
    /// Matrix size.
    #[arg(long, default_value_t = 512, value_parser = at_least(1))]
    pub n: usize,
    /// Runtime options (--procs, --pin/--no-pin).
    #[command(flatten)]
    pub runtime: common::RuntimeArgs,
    /// Seed of the pseudo-random matrix.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// What a factorization computed.
#[derive(Debug, Clone)]
pub struct Output {
    /// `L` (strictly below the diagonal) and `U` (the rest), row-major.
    pub lu: Vec<f64>,
    /// `perm[i]` is the row of `A` that ended up as row `i`.
    pub perm: Vec<usize>,
    /// The step whose pivot was exactly zero (A is singular), if any; the
    /// factorization stopped there.
    pub singular_at: Option<usize>,
    /// Seconds the factorization took.
    pub secs: f64,
    /// This node's DSM counters (hyfi runs only).
    pub dsm: Option<hyfi::DsmStats>,
}

impl Output {
    /// `Ok` if both hold the same permutation and factors, bit for bit.
    pub fn check_same(&self, other: &Output) -> Result<(), String> {
        if self.singular_at != other.singular_at {
            return Err(format!(
                "singular at {:?} against {:?}",
                self.singular_at, other.singular_at
            ));
        }
        if let Some(i) = self.perm.iter().zip(&other.perm).position(|(a, b)| a != b) {
            return Err(format!(
                "pivot row of step {i} is {} against {}",
                self.perm[i], other.perm[i]
            ));
        }
        if self.lu.len() != other.lu.len() || self.perm.len() != other.perm.len() {
            return Err("sizes differ".into());
        }
        common::same_bits("element ", &self.lu, &other.lu, self.perm.len())
    }
}

/// A pivot candidate: the reduction variable the updated rows offer to.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct Pivot {
    /// `|a[row][k]|`.
    pub mag: f64,
    /// The candidate row.
    pub row: u64,
}

/// No candidate yet: loses to every row.
const NO_PIVOT: Pivot = Pivot {
    mag: -1.0,
    row: u64::MAX,
};

/// The better of two candidates: larger magnitude, lower row on ties. On
/// numbers (not NaN) it is associative and commutative, so the result does not depend on how rows
/// are spread over processors, and it is the row a sequential scan with a
/// strict `>` picks.
fn better(a: Pivot, b: Pivot) -> Pivot {
    if b.mag > a.mag || (b.mag == a.mag && b.row < a.row) {
        b
    } else {
        a
    }
}

/// The factorization of the matrix of `args` with iterative filaments on `rt`.
pub fn run_hyfi(rt: &Runtime, args: &Args) -> Result<Output, Box<dyn std::error::Error>> {
    factor_hyfi(rt, args.n, &matrix(args.n, args.seed))
}

/// Not chosen as a pivot yet.
const FREE: usize = usize::MAX;

/// The pivot row to write: only post-phase code (and the set-up before the
/// first step) writes it, while no filament reads it.
fn write_lock(r: &RwLock<Vec<f64>>) -> RwLockWriteGuard<'_, Vec<f64>> {
    r.write().unwrap_or_else(|e| e.into_inner())
}

/// The factorization of `a0` (`n × n`, row-major) with iterative filaments
/// on `rt`, the matrix in a new DSM of `rt`.
pub fn factor_hyfi(
    rt: &Runtime,
    n: usize,
    a0: &[f64],
) -> Result<Output, Box<dyn std::error::Error>> {
    let dsm = Dsm::new(rt)?;
    factor_dsm(rt, &dsm, n, a0)
}

/// The factorization of `a0` with iterative filaments on `rt`, the matrix
/// allocated in `dsm`.
pub fn factor_dsm(
    rt: &Runtime,
    dsm: &Dsm,
    n: usize,
    a0: &[f64],
) -> Result<Output, Box<dyn std::error::Error>> {
    assert_eq!(a0.len(), n * n, "factor_hyfi needs an n×n matrix");
    let a = dsm
        .matrix::<f64>(n, n)
        .pad_rows()
        .placement(Placement::CyclicRows(0..n))
        .from_fn(|i, j| a0[i * n + j])?;
    let pivot = rt.reduction(NO_PIVOT);
    // Node-local and the same on every node: the step at which each row was
    // chosen as pivot (FREE if not yet), and (below) the current pivot row.
    let step_of: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(FREE)).collect();
    // The current pivot row, copied once per step and node by post-phase
    // code (the release brought it here). The filaments cannot read it
    // through a read view: they write other rows of `a` in the phase.
    let pivot_row = RwLock::new(vec![0.0f64; n]);
    let mut perm: Vec<usize> = Vec::with_capacity(n);
    let mut singular_at = None;

    // Steps done on the terminal in a long run, with the share of the
    // flops (step k updates (n-k)² entries): see `hyfi::Progress`.
    let progress = Progress::new(rt, "steps");
    let flops_left = |k: usize| ((n - k) as f64 / n as f64).powi(3);

    // Step 0's pivot, from the input (the same on every node).
    let first = (0..n).fold(NO_PIVOT, |best, i| {
        better(
            best,
            Pivot {
                mag: a0[i * n].abs(),
                row: i as u64,
            },
        )
    });
    if n == 0 {
        // Nothing to factor.
    } else if first.mag == 0.0 {
        singular_at = Some(0);
    } else {
        let p = first.row as usize;
        step_of[p].store(0, Relaxed);
        perm.push(p);
        write_lock(&pivot_row).copy_from_slice(&a0[p * n..(p + 1) * n]);
    }

    let factor = n > 0 && singular_at.is_none();
    let mut prog = Program::new();
    // One phase per step k: elimination with the pivot row, then each
    // updated row offers its candidacy for step k + 1. Each pool segment
    // reads the pivot row that post-phase code copied (the one row a step
    // moves between nodes); each filament updates its row's tail in place
    // in one pass.
    prog.phase_with(
        PoolArray::cyclic(rt, 0..n),
        |ctx, _span| {
            let row = pivot_row.read().unwrap_or_else(|e| e.into_inner());
            (ctx.iteration() as usize, row)
        },
        |ctx, i, (k, row)| {
            let k = *k;
            let rp = &row[k..];
            if step_of[i].load(Relaxed) == FREE {
                let row = a.row_mut(ctx, i);
                // The multiplier goes where the eliminated entry was.
                let l = row.get(k) / rp[0];
                row.set(k, l);
                row.update_range(k + 1, &rp[1..], |x, y| x - l * y);
                if k + 1 < n {
                    let c = Pivot {
                        mag: row.get(k + 1).abs(),
                        row: i as u64,
                    };
                    pivot.update(ctx, |best| better(best, c));
                }
            }
        },
        |post| {
            let done = post.iteration() as usize + 1;
            progress.report(
                done as u64,
                format_args!(
                    "{:.0}% of the flops, n = {n}",
                    100.0 * (1.0 - flops_left(done))
                ),
            );
            if done >= n {
                return Control::Done;
            }
            // Reduced by the phase's end (`reduce_at_end_with_row` below).
            let p = post.get(&pivot);
            post.set(&pivot, NO_PIVOT);
            if p.mag == 0.0 {
                singular_at = Some(done);
                return Control::Done;
            }
            let p = p.row as usize;
            step_of[p].store(done, Relaxed);
            perm.push(p);
            a.read_row(p, &mut write_lock(&pivot_row));
            Control::Continue
        },
    );
    // The pivot search rides in the release that ends the step (no
    // all-reduce of its own), and the chosen row with it: every node holds
    // the next step's pivot row when the post-phase code runs.
    a.reduce_at_end_with_row(&mut prog, &pivot, better, |p: &Pivot| {
        (p.mag > 0.0).then_some(p.row as usize)
    });

    let t = Instant::now();
    if factor {
        rt.start(&mut prog)?;
    }
    let secs = t.elapsed().as_secs_f64();
    drop(prog);
    progress.finish();
    let dsm_stats = dsm.stats();
    // Rows never chosen (a singular matrix) follow in their order.
    perm.extend((0..n).filter(|&r| step_of[r].load(Relaxed) == FREE));
    let all = a.to_vec();
    Ok(Output {
        lu: perm
            .iter()
            .flat_map(|&r| all[r * n..(r + 1) * n].iter().copied())
            .collect(),
        perm,
        singular_at,
        secs,
        dsm: Some(dsm_stats),
    })
}

/// The same factorization, sequentially, on a plain vector.
pub fn run_seq(args: &Args) -> Output {
    factor_seq(args.n, &matrix(args.n, args.seed))
}

/// The factorization of `a0` (`n × n`, row-major), sequentially: the same
/// pivots (largest magnitude, lowest row on ties) and the same flops in
/// the same order as the filaments.
pub fn factor_seq(n: usize, a0: &[f64]) -> Output {
    assert_eq!(a0.len(), n * n, "factor_seq needs an n×n matrix");
    let mut a = a0.to_vec();
    let mut chosen = vec![false; n];
    let mut perm: Vec<usize> = Vec::with_capacity(n);
    let mut singular_at = None;
    let t = Instant::now();
    for k in 0..n {
        let mut best = NO_PIVOT;
        for i in (0..n).filter(|&i| !chosen[i]) {
            best = better(
                best,
                Pivot {
                    mag: a[i * n + k].abs(),
                    row: i as u64,
                },
            );
        }
        if best.mag == 0.0 {
            singular_at = Some(k);
            break;
        }
        let p = best.row as usize;
        chosen[p] = true;
        perm.push(p);
        let rp = a[p * n..(p + 1) * n].to_vec();
        for i in (0..n).filter(|&i| !chosen[i]) {
            let ri = &mut a[i * n..(i + 1) * n];
            let l = ri[k] / rp[k];
            ri[k] = l;
            for (x, &y) in ri[k + 1..].iter_mut().zip(&rp[k + 1..]) {
                *x -= l * y;
            }
        }
    }
    perm.extend((0..n).filter(|&r| !chosen[r]));
    Output {
        lu: perm
            .iter()
            .flat_map(|&r| a[r * n..(r + 1) * n].iter().copied())
            .collect(),
        perm,
        singular_at,
        secs: t.elapsed().as_secs_f64(),
        dsm: None,
    }
}

/// `‖P·A − L·U‖∞ / (n ‖A‖∞ ε)` for the factors in `out` of the matrix of
/// `args`: backward stable LU keeps it of order 1 (times the growth factor).
pub fn scaled_residual(args: &Args, out: &Output) -> f64 {
    let n = args.n;
    let a = matrix(n, args.seed);
    let lu = &out.lu;
    let mut norm_a = 0.0f64;
    let mut norm_r = 0.0f64;
    for i in 0..n {
        norm_a = norm_a.max(a[i * n..(i + 1) * n].iter().map(|x| x.abs()).sum());
        let pa = &a[out.perm[i] * n..(out.perm[i] + 1) * n];
        let mut r = 0.0f64;
        for (j, &paj) in pa.iter().enumerate() {
            // (L·U)[i][j] = Σ_{m ≤ min(i, j)} L[i][m] U[m][j], L[i][i] = 1.
            let mut s = 0.0f64;
            for m in 0..=i.min(j) {
                let l = if m == i { 1.0 } else { lu[i * n + m] };
                s += l * lu[m * n + j];
            }
            r += (paj - s).abs();
        }
        norm_r = norm_r.max(r);
    }
    if norm_a == 0.0 {
        return 0.0;
    }
    norm_r / (n as f64 * norm_a * f64::EPSILON)
}

/// Largest scaled residual accepted.
pub const RESIDUAL_LIMIT: f64 = 100.0;

fn main() {
    let args = Args::parse();
    let rt = common::or_exit("lu", args.runtime.start(|cfg| cfg));
    let par = common::or_exit("lu", run_hyfi(&rt, &args));
    let seq = run_seq(&args);

    println!(
        "lu n={} nodes={} procs={} seed={} (partial pivoting, rows cyclic) (node {})",
        args.n,
        rt.num_nodes(),
        rt.procs(),
        args.seed,
        rt.node()
    );
    println!("hyfi:       {:.4} s", par.secs);
    println!("sequential: {:.4} s (row slices)", seq.secs);
    println!("ratio hyfi/sequential: {:.2}", par.secs / seq.secs);
    print!("{}", rt.stats());
    if let Some(d) = &par.dsm {
        print!("{d}");
    }
    if let Some(t) = rt.traffic() {
        println!("traffic of node {}: {t}", rt.node());
    }
    if let Err(what) = par.check_same(&seq) {
        eprintln!("lu: MISMATCH between hyfi and sequential: {what}");
        std::process::exit(1);
    }
    if let Some(k) = par.singular_at {
        println!("OK: identical to sequential bit for bit; the matrix is singular (zero pivot at step {k})");
        return;
    }
    let res = scaled_residual(&args, &par);
    if res.is_nan() || res > RESIDUAL_LIMIT {
        eprintln!(
            "lu: FAILED: scaled residual ‖PA − LU‖∞/(n‖A‖∞ε) = {res:.3} exceeds {RESIDUAL_LIMIT}"
        );
        std::process::exit(1);
    }
    println!(
        "OK: identical to sequential bit for bit; scaled residual ‖PA − LU‖∞/(n‖A‖∞ε) = {res:.3}"
    );
}
