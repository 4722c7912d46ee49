//! Baselines for the side-by-side comparison (`scripts/side-by-side.sh`):
//! the same kernels as the `jacobi`, `matmul`, `lu`, `fib` and `quad`
//! examples, written as an HPC programmer would write them without hyfi —
//! plain sequential Rust on flat `Vec<f64>`s and slices, and the natural
//! rayon version of the same loops. The C/OpenMP versions are in
//! `benches/baselines/`.
//!
//! ```text
//! cargo run --release --example baselines -- jacobi seq --n 1024 --iters 200
//! cargo run --release --example baselines -- jacobi rayon --threads 2
//! cargo run --release --example baselines -- matmul seq --n 1024
//! cargo run --release --example baselines -- lu rayon --n 1024
//! cargo run --release --example baselines -- fib rayon --n 40 [--cutoff 25]
//! cargo run --release --example baselines -- quad seq
//! ```
//!
//! Each run times only the computation (inputs are built, their pages
//! touched and the rayon pool started before the clock starts) and prints
//!
//! ```text
//! time: <seconds>
//! check: <key=value ...>
//! ```
//!
//! The `check` line is the same for the sequential, rayon and OpenMP
//! versions of a kernel (they do the same floating-point operations in the
//! same order per result), and uses the keys the hyfi examples print where
//! they print one: Jacobi's `grid_bits` (the example's grid fingerprint) and
//! `maxdiff_bits`, fib's `value`, quad's `value_bits` and `intervals`.
//! The inputs are the examples' own: Jacobi's grid with the top edge at 1.0,
//! the splitmix64 matrices of `matmul` and `lu` (seed 1), quad's `x^6` on
//! `[1, 70]` with tolerance 1.5e-3 halved per level.

#[path = "common/mod.rs"]
#[allow(dead_code)] // only the inputs and fingerprints are used here
mod common;

use std::hint::black_box;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, ValueEnum};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Kernel {
    /// Jacobi sweeps on an n×n grid (top edge 1.0), maxdiff per sweep.
    Jacobi,
    /// C = A×B, i-k-j loop order.
    Matmul,
    /// LU with partial pivoting, row-oriented elimination.
    Lu,
    /// Recursive Fibonacci.
    Fib,
    /// Adaptive trapezoid quadrature of x^6.
    Quad,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Variant {
    /// Plain sequential Rust.
    Seq,
    /// rayon on a pool of `--threads` threads.
    Rayon,
}

/// Sequential and rayon baselines of the side-by-side kernels.
#[derive(Parser, Debug)]
#[command(name = "baselines")]
struct Args {
    kernel: Kernel,
    variant: Variant,
    /// Problem size: grid or matrix side, or fib's n [default: 1024; 40 for fib].
    #[arg(long)]
    n: Option<usize>,
    /// Jacobi: sweeps.
    #[arg(long, default_value_t = 200)]
    iters: usize,
    /// Jacobi: stop once maxdiff < eps (0: never, run all --iters).
    #[arg(long, default_value_t = 0.0)]
    eps: f64,
    /// rayon threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// fib: below this n, rayon calls the sequential recursion (0: never).
    #[arg(long, default_value_t = 0)]
    cutoff: u64,
    /// matmul, lu: seed of the matrices (the examples' default is 1).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// quad: absolute tolerance at the root, halved per level.
    #[arg(long, default_value_t = 1.5e-3)]
    quad_eps: f64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(args.threads)
        .build()
        .expect("rayon pool");
    // Wake the workers before the clock starts.
    pool.install(|| rayon::join(|| (), || ()));
    let par = args.variant == Variant::Rayon;
    let (secs, check) = match args.kernel {
        Kernel::Jacobi => jacobi(&args, par.then_some(&pool)),
        Kernel::Matmul => matmul(&args, par.then_some(&pool)),
        Kernel::Lu => lu(&args, par.then_some(&pool)),
        Kernel::Fib => fib(&args, par.then_some(&pool)),
        Kernel::Quad => quad(&args, par.then_some(&pool)),
    };
    println!(
        "baselines {:?} {:?}{}",
        args.kernel,
        args.variant,
        if par {
            format!(" ({} threads)", args.threads)
        } else {
            String::new()
        }
    );
    println!("time: {secs:.6}");
    println!("check: {check}");
    ExitCode::SUCCESS
}

// ---------------------------------------------------------------- Jacobi

/// One interior row: `out[j]` from the rows above and below and the
/// neighbours in the row; returns the row's largest change.
#[inline(always)]
fn jacobi_row(up: &[f64], mid: &[f64], down: &[f64], out: &mut [f64]) -> f64 {
    let n = mid.len();
    // Same length for all four, so the indexing below needs no bounds checks.
    let (up, down, out) = (&up[..n], &down[..n], &mut out[..n]);
    let mut m = 0.0f64;
    for j in 1..n - 1 {
        let v = (up[j] + down[j] + mid[j - 1] + mid[j + 1]) * 0.25;
        out[j] = v;
        let d = (v - mid[j]).abs();
        if d > m {
            m = d;
        }
    }
    m
}

fn jacobi(args: &Args, pool: Option<&rayon::ThreadPool>) -> (f64, String) {
    use rayon::prelude::*;
    let n = args.n.unwrap_or(1024);
    assert!(n >= 3, "--n must be at least 3");
    // examples/jacobi.rs's grid: top edge 1.0, everything else 0.0.
    let mut old: Vec<f64> = (0..n * n)
        .map(|k| common::hot_top_edge(k / n, k % n))
        .collect();
    let mut new = old.clone();
    let mut maxdiff = 0.0f64;
    let t = Instant::now();
    for _ in 0..args.iters {
        let m = match pool {
            None => {
                let mut m = 0.0f64;
                for i in 1..n - 1 {
                    let d = jacobi_row(
                        &old[(i - 1) * n..i * n],
                        &old[i * n..(i + 1) * n],
                        &old[(i + 1) * n..(i + 2) * n],
                        &mut new[i * n..(i + 1) * n],
                    );
                    if d > m {
                        m = d;
                    }
                }
                m
            }
            Some(pool) => pool.install(|| {
                let old = &old;
                new[n..(n - 1) * n]
                    .par_chunks_mut(n)
                    .enumerate()
                    .map(|(r, out)| {
                        let i = r + 1;
                        jacobi_row(
                            &old[(i - 1) * n..i * n],
                            &old[i * n..(i + 1) * n],
                            &old[(i + 1) * n..(i + 2) * n],
                            out,
                        )
                    })
                    .reduce(|| 0.0, |a, b| if b > a { b } else { a })
            }),
        };
        std::mem::swap(&mut old, &mut new);
        maxdiff = m;
        if m < args.eps {
            break;
        }
    }
    let secs = t.elapsed().as_secs_f64();
    (
        secs,
        format!(
            "maxdiff_bits={:016x} grid_bits={:016x}",
            maxdiff.to_bits(),
            common::fnv_bytes(&old)
        ),
    )
}

// ---------------------------------------------------------------- matmul

/// Row `i` of C += A(i, k) × row `k` of B, for k = 0..n.
#[inline(always)]
fn matmul_row(ai: &[f64], b: &[f64], ci: &mut [f64]) {
    let n = ci.len();
    for (k, &aik) in ai.iter().enumerate() {
        let bk = &b[k * n..(k + 1) * n];
        for (c, &bkj) in ci.iter_mut().zip(bk) {
            *c += aik * bkj;
        }
    }
}

fn matmul(args: &Args, pool: Option<&rayon::ThreadPool>) -> (f64, String) {
    use rayon::prelude::*;
    let n = args.n.unwrap_or(1024);
    // examples/matmul.rs's inputs.
    let a = common::random_matrix(n, args.seed);
    let b = common::random_matrix(n, args.seed ^ 0x5555_5555_5555_5555);
    let mut c = vec![0.0f64; n * n];
    c.fill(0.0); // touch C's pages before the clock starts
    let t = Instant::now();
    match pool {
        None => {
            for (i, ci) in c.chunks_mut(n).enumerate() {
                matmul_row(&a[i * n..(i + 1) * n], &b, ci);
            }
        }
        Some(pool) => pool.install(|| {
            c.par_chunks_mut(n)
                .enumerate()
                .for_each(|(i, ci)| matmul_row(&a[i * n..(i + 1) * n], &b, ci));
        }),
    }
    let secs = t.elapsed().as_secs_f64();
    let sum: f64 = c.iter().sum();
    (secs, format!("sum_bits={:016x}", sum.to_bits()))
}

// ---------------------------------------------------------------- LU

fn lu(args: &Args, pool: Option<&rayon::ThreadPool>) -> (f64, String) {
    use rayon::prelude::*;
    let n = args.n.unwrap_or(1024);
    // examples/lu.rs's input.
    let mut a = common::random_matrix(n, args.seed);
    let mut perm: Vec<usize> = (0..n).collect();
    let mut singular_at = None;
    let t = Instant::now();
    for k in 0..n {
        // Pivot: the largest |a(i, k)|, i >= k.
        let mut p = k;
        let mut m = a[k * n + k].abs();
        for i in k + 1..n {
            let d = a[i * n + k].abs();
            if d > m {
                m = d;
                p = i;
            }
        }
        if m == 0.0 {
            singular_at = Some(k);
            break;
        }
        if p != k {
            let (top, bottom) = a.split_at_mut(p * n);
            top[k * n..(k + 1) * n].swap_with_slice(&mut bottom[..n]);
            perm.swap(k, p);
        }
        // Eliminate below the pivot row: l = a(i, k) / a(k, k) goes where
        // a(i, k) was, then row i -= l × row k.
        let (top, rest) = a.split_at_mut((k + 1) * n);
        let pivot = &top[k * n..];
        let eliminate = |row: &mut [f64]| {
            let l = row[k] / pivot[k];
            row[k] = l;
            for (x, &y) in row[k + 1..].iter_mut().zip(&pivot[k + 1..]) {
                *x -= l * y;
            }
        };
        match pool {
            None => rest.chunks_mut(n).for_each(eliminate),
            Some(pool) => pool.install(|| rest.par_chunks_mut(n).for_each(eliminate)),
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let sum: f64 = a.iter().sum();
    let h = common::fnv_words(perm.iter().map(|&r| r as u64));
    (
        secs,
        format!(
            "sum_bits={:016x} perm_hash={h:016x} singular_at={}",
            sum.to_bits(),
            singular_at.map_or(-1, |k| k as i64)
        ),
    )
}

// ---------------------------------------------------------------- fib

fn fib_seq(n: u64) -> u64 {
    if n < 2 {
        return n;
    }
    fib_seq(n - 1) + fib_seq(n - 2)
}

fn fib_rayon(n: u64, cutoff: u64) -> u64 {
    if n < 2 {
        return n;
    }
    if n < cutoff {
        return fib_seq(n);
    }
    let (a, b) = rayon::join(|| fib_rayon(n - 1, cutoff), || fib_rayon(n - 2, cutoff));
    a + b
}

fn fib(args: &Args, pool: Option<&rayon::ThreadPool>) -> (f64, String) {
    let n = args.n.unwrap_or(40) as u64;
    let t = Instant::now();
    let v = match pool {
        None => fib_seq(black_box(n)),
        Some(pool) => pool.install(|| fib_rayon(black_box(n), args.cutoff)),
    };
    (t.elapsed().as_secs_f64(), format!("value={v}"))
}

// ---------------------------------------------------------------- quad

#[inline(always)]
fn x6(x: f64) -> f64 {
    let x3 = x * x * x;
    x3 * x3
}

/// The area of [a, b] by recursive bisection with the trapezoid rule
/// (examples/quad.rs's tree), and the number of intervals accepted.
fn quad_seq(a: f64, b: f64, fa: f64, fb: f64, whole: f64, tol: f64) -> (f64, u64) {
    let m = 0.5 * (a + b);
    let fm = x6(m);
    let left = 0.5 * (fa + fm) * (m - a);
    let right = 0.5 * (fm + fb) * (b - m);
    if (left + right - whole).abs() <= tol || !(a < m && m < b) {
        return (left + right, 1);
    }
    let (l, nl) = quad_seq(a, m, fa, fm, left, 0.5 * tol);
    let (r, nr) = quad_seq(m, b, fm, fb, right, 0.5 * tol);
    (l + r, nl + nr)
}

/// The same recursion with the two halves a `rayon::join`.
fn quad_rayon(a: f64, b: f64, fa: f64, fb: f64, whole: f64, tol: f64) -> (f64, u64) {
    let m = 0.5 * (a + b);
    let fm = x6(m);
    let left = 0.5 * (fa + fm) * (m - a);
    let right = 0.5 * (fm + fb) * (b - m);
    if (left + right - whole).abs() <= tol || !(a < m && m < b) {
        return (left + right, 1);
    }
    let ((l, nl), (r, nr)) = rayon::join(
        || quad_rayon(a, m, fa, fm, left, 0.5 * tol),
        || quad_rayon(m, b, fm, fb, right, 0.5 * tol),
    );
    (l + r, nl + nr)
}

fn quad(args: &Args, pool: Option<&rayon::ThreadPool>) -> (f64, String) {
    let (a, b, eps) = (black_box(1.0f64), black_box(70.0f64), args.quad_eps);
    let t = Instant::now();
    let (fa, fb) = (x6(a), x6(b));
    let whole = 0.5 * (fa + fb) * (b - a);
    let (v, intervals) = match pool {
        None => quad_seq(a, b, fa, fb, whole, eps),
        Some(pool) => pool.install(|| quad_rayon(a, b, fa, fb, whole, eps)),
    };
    (
        t.elapsed().as_secs_f64(),
        format!("value_bits={:016x} intervals={intervals}", v.to_bits()),
    )
}
