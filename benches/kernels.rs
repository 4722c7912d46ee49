//! Application kernels: hyfi against a sequential baseline (and rayon as a
//! peer), each group holding the baseline and the hyfi variants side by side.
//!
//! * `t1_jacobi1024_1p`: Jacobi, n = 1024, 10 iterations (eps = 0, so it
//!   never stops early), 1 processor: plain `Vec<f64>` loop vs one filament
//!   per point vs one filament per row.
//! * `t2_fib32_prune_1p`: fib(32) with pruning, 1 processor, vs recursive fib.
//! * `t3_scale_*`: the same hyfi code on 1 and 2 processors (fib(34),
//!   adaptive quadrature of x^6 on [1, 70], Jacobi n = 256), with rayon on
//!   1 and 2 threads as a peer.
//!
//! Run with `cargo bench --bench kernels -- --noplot`.

mod common;
use common::{fib_hyfi, fib_rayon, fib_seq, rayon_pool, runtime};
use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, SamplingMode};
use hyfi::{Control, Ctx, Op, PoolArray, Program, Reduction, Runtime};
// hyfi-core's node-local matrix (not in the facade: programs use the DSM's
// arrays): these benchmarks measure the pools and phases alone.
use hyfi_core::SharedMatrix;
use rayon::prelude::*;

// ---------------------------------------------------------------- runtimes

// ------------------------------------------------------------------ Jacobi

/// Boundary 1.0, interior 0.5: values stay in [0.5, 1], so no subnormals
/// appear however many iterations criterion accumulates on the same grids.
fn jacobi_init(n: usize) -> impl Fn(usize, usize) -> f64 {
    move |i, j| {
        if i == 0 || j == 0 || i == n - 1 || j == n - 1 {
            1.0
        } else {
            0.5
        }
    }
}

fn jacobi_vecs(n: usize) -> (Vec<f64>, Vec<f64>) {
    let init = jacobi_init(n);
    let v: Vec<f64> = (0..n * n).map(|k| init(k / n, k % n)).collect();
    (v.clone(), v)
}

fn jacobi_grids(n: usize) -> [SharedMatrix<f64>; 2] {
    [
        SharedMatrix::from_fn(n, n, jacobi_init(n)),
        SharedMatrix::from_fn(n, n, jacobi_init(n)),
    ]
}

/// The sequential baseline: `iters` sweeps (fewer if maxdiff < eps), the
/// same arithmetic as the filament, maxdiff included. Returns the last maxdiff.
fn jacobi_seq(old: &mut Vec<f64>, new: &mut Vec<f64>, n: usize, iters: u64, eps: f64) -> f64 {
    let mut m = 0.0f64;
    for _ in 0..iters {
        m = 0.0;
        for i in 1..n - 1 {
            for j in 1..n - 1 {
                let v = (old[(i - 1) * n + j]
                    + old[(i + 1) * n + j]
                    + old[i * n + j - 1]
                    + old[i * n + j + 1])
                    * 0.25;
                new[i * n + j] = v;
                m = m.max((v - old[i * n + j]).abs());
            }
        }
        std::mem::swap(old, new);
        if m < eps {
            break;
        }
    }
    m
}

/// rayon peer: rows of the new grid in parallel, maxdiff by a max-reduce.
fn jacobi_rayon(old: &mut Vec<f64>, new: &mut Vec<f64>, n: usize, iters: u64, eps: f64) -> f64 {
    let mut m = 0.0f64;
    for _ in 0..iters {
        let o = &old[..];
        m = new[n..(n - 1) * n]
            .par_chunks_mut(n)
            .enumerate()
            .map(|(r, row)| {
                let i = r + 1;
                let mut m = 0.0f64;
                for j in 1..n - 1 {
                    let v = (o[(i - 1) * n + j]
                        + o[(i + 1) * n + j]
                        + o[i * n + j - 1]
                        + o[i * n + j + 1])
                        * 0.25;
                    row[j] = v;
                    m = m.max((v - o[i * n + j]).abs());
                }
                m
            })
            .reduce(|| 0.0, f64::max);
        std::mem::swap(old, new);
        if m < eps {
            break;
        }
    }
    m
}

/// Post-phase code shared by both Jacobi programs: reduce maxdiff, reset it,
/// stop after `iters` phases or when maxdiff < eps.
fn jacobi_post<'a>(
    maxdiff: &'a Reduction<f64>,
    iters: u64,
    eps: f64,
) -> impl FnMut(&mut hyfi::PostPhase<'_>) -> Control + Send + 'a {
    move |post| {
        let m = post.reduce(maxdiff, Op::Max); // filReduce(maxdiff, MAX)
        post.set(maxdiff, 0.0);
        black_box(m);
        if m < eps || post.iteration() + 1 >= iters {
            Control::Done
        } else {
            Control::Continue
        }
    }
}

/// One filament per interior point (the paper's Figure 1 program).
fn jacobi_point_program<'a>(
    rt: &Runtime,
    n: usize,
    grids: &'a [SharedMatrix<f64>; 2],
    maxdiff: &'a Reduction<f64>,
    iters: u64,
    eps: f64,
) -> Program<'a> {
    let mut prog = Program::new();
    prog.phase(
        PoolArray::block_rows(rt, 1..n - 1, 1..n - 1, 1),
        move |ctx: &Ctx, (i, j): (usize, usize)| {
            let k = ctx.iteration() as usize;
            let (old, new) = (&grids[k % 2], &grids[(k + 1) % 2]);
            let v = (old.get(i - 1, j) + old.get(i + 1, j) + old.get(i, j - 1) + old.get(i, j + 1))
                * 0.25;
            new.set(i, j, v);
            let d = (v - old.get(i, j)).abs();
            maxdiff.update(ctx, |m| m.max(d));
        },
        jacobi_post(maxdiff, iters, eps),
    );
    prog
}

/// One filament per interior row; the filament loops over the columns.
fn jacobi_row_program<'a>(
    rt: &Runtime,
    n: usize,
    grids: &'a [SharedMatrix<f64>; 2],
    maxdiff: &'a Reduction<f64>,
    iters: u64,
    eps: f64,
) -> Program<'a> {
    let mut prog = Program::new();
    prog.phase(
        PoolArray::<usize>::block(rt, 1..n - 1, 1),
        move |ctx: &Ctx, i: usize| {
            let k = ctx.iteration() as usize;
            let (old, new) = (&grids[k % 2], &grids[(k + 1) % 2]);
            let (up, mid, down, out) = (old.row(i - 1), old.row(i), old.row(i + 1), new.row(i));
            let mut m = 0.0f64;
            for j in 1..n - 1 {
                let v = (up.get(j) + down.get(j) + mid.get(j - 1) + mid.get(j + 1)) * 0.25;
                out.set(j, v);
                m = m.max((v - mid.get(j)).abs());
            }
            maxdiff.update(ctx, |x| x.max(m));
        },
        jacobi_post(maxdiff, iters, eps),
    );
    prog
}

/// Checks once, on fresh grids, that both hyfi programs compute the
/// baseline's grid bit for bit.
fn jacobi_check(rt: &Runtime, n: usize, iters: u64) {
    let (mut old, mut new) = jacobi_vecs(n);
    jacobi_seq(&mut old, &mut new, n, iters, 0.0);
    for per_row in [false, true] {
        let grids = jacobi_grids(n);
        let maxdiff = rt.reduction(0.0f64);
        let mut prog = if per_row {
            jacobi_row_program(rt, n, &grids, &maxdiff, iters, 0.0)
        } else {
            jacobi_point_program(rt, n, &grids, &maxdiff, iters, 0.0)
        };
        rt.start(&mut prog).unwrap();
        drop(prog);
        assert_eq!(
            grids[(iters % 2) as usize].to_vec(),
            old,
            "hyfi Jacobi differs (per_row={per_row})"
        );
    }
    let (mut o2, mut n2) = jacobi_vecs(n);
    jacobi_rayon(&mut o2, &mut n2, n, iters, 0.0);
    assert_eq!(o2, old, "rayon Jacobi differs");
}

fn t1_jacobi1024(c: &mut Criterion) {
    const N: usize = 1024;
    const ITERS: u64 = 10;
    let rt = runtime(1);
    jacobi_check(&rt, N, ITERS);

    let mut g = c.benchmark_group("t1_jacobi1024_1p");
    g.sampling_mode(SamplingMode::Flat)
        .sample_size(15)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));

    let (mut old, mut new) = jacobi_vecs(N);
    g.bench_function("baseline_seq_vec", |b| {
        b.iter(|| jacobi_seq(&mut old, &mut new, N, ITERS, 0.0))
    });
    drop((old, new));

    let grids = jacobi_grids(N);
    let maxdiff = rt.reduction(0.0f64);
    let mut prog = jacobi_point_program(&rt, N, &grids, &maxdiff, ITERS, 0.0);
    g.bench_function("hyfi_filament_per_point", |b| {
        b.iter(|| rt.start(&mut prog).unwrap())
    });
    drop(prog);

    let mut prog = jacobi_row_program(&rt, N, &grids, &maxdiff, ITERS, 0.0);
    g.bench_function("hyfi_filament_per_row", |b| {
        b.iter(|| rt.start(&mut prog).unwrap())
    });
    drop(prog);
    g.finish();
}

// --------------------------------------------------------------------- fib

/// The same recursion with the second call's result passed through
/// `black_box`, so LLVM cannot turn that call into a loop (it does so for
/// `fib_seq`, which then makes half the calls). A reference, not the target's
/// baseline.
fn fib_seq_no_loop(n: u64) -> u64 {
    if n < 2 {
        return n;
    }
    let a = fib_seq_no_loop(n - 1);
    a + black_box(fib_seq_no_loop(n - 2))
}

fn t2_fib32_prune(c: &mut Criterion) {
    const N: u64 = 32;
    let rt = runtime(1);
    assert!(rt.config().get_prune());
    assert_eq!(rt.run(|ctx| fib_hyfi(ctx, N)).unwrap(), fib_seq(N));

    let mut g = c.benchmark_group("t2_fib32_prune_1p");
    g.sampling_mode(SamplingMode::Flat)
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    g.bench_function("baseline_seq_recursive", |b| {
        b.iter(|| fib_seq(black_box(N)))
    });
    g.bench_function("hyfi_join_pruned", |b| {
        b.iter(|| rt.run(|ctx| fib_hyfi(ctx, black_box(N))).unwrap())
    });
    g.bench_function("ref_seq_recursive_no_loop", |b| {
        b.iter(|| fib_seq_no_loop(black_box(N)))
    });
    g.finish();
}

// -------------------------------------------------------------- quadrature

const QUAD_A: f64 = 1.0;
const QUAD_B: f64 = 70.0;
/// Absolute tolerance per interval: ~6.8 M calls, ~15 ms sequentially.
const QUAD_EPS: f64 = 1e-7;

#[inline(always)]
fn x6(x: f64) -> f64 {
    let x2 = x * x;
    x2 * x2 * x2
}

/// One adaptive trapezoid step on [a, b]: returns (m, f(m), left, right,
/// Some(left + right) if accurate enough).
#[inline(always)]
fn quad_step(a: f64, b: f64, fa: f64, fb: f64, area: f64) -> (f64, f64, f64, f64, Option<f64>) {
    let m = 0.5 * (a + b);
    let fm = x6(m);
    let l = 0.5 * (fa + fm) * (m - a);
    let r = 0.5 * (fm + fb) * (b - m);
    let lr = l + r;
    (m, fm, l, r, ((lr - area).abs() <= QUAD_EPS).then_some(lr))
}

fn quad_seq(a: f64, b: f64, fa: f64, fb: f64, area: f64) -> f64 {
    match quad_step(a, b, fa, fb, area) {
        (_, _, _, _, Some(v)) => v,
        (m, fm, l, r, None) => quad_seq(a, m, fa, fm, l) + quad_seq(m, b, fm, fb, r),
    }
}

fn quad_hyfi(ctx: &Ctx, a: f64, b: f64, fa: f64, fb: f64, area: f64) -> f64 {
    match quad_step(a, b, fa, fb, area) {
        (_, _, _, _, Some(v)) => v,
        (m, fm, l, r, None) => {
            let (x, y) = ctx.join(
                |c| quad_hyfi(c, a, m, fa, fm, l),
                |c| quad_hyfi(c, m, b, fm, fb, r),
            );
            x + y
        }
    }
}

fn quad_rayon(a: f64, b: f64, fa: f64, fb: f64, area: f64) -> f64 {
    match quad_step(a, b, fa, fb, area) {
        (_, _, _, _, Some(v)) => v,
        (m, fm, l, r, None) => {
            let (x, y) = rayon::join(
                || quad_rayon(a, m, fa, fm, l),
                || quad_rayon(m, b, fm, fb, r),
            );
            x + y
        }
    }
}

fn quad_args() -> (f64, f64, f64, f64, f64) {
    let (a, b) = (black_box(QUAD_A), black_box(QUAD_B));
    let (fa, fb) = (x6(a), x6(b));
    (a, b, fa, fb, 0.5 * (fa + fb) * (b - a))
}

// ----------------------------------------------------------------- scaling

fn scaling_group<'c>(
    c: &'c mut Criterion,
    name: &str,
) -> criterion::BenchmarkGroup<'c, criterion::measurement::WallTime> {
    let mut g = c.benchmark_group(name);
    g.sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(Duration::from_millis(1500))
        .measurement_time(Duration::from_secs(3));
    g
}

fn t3_scaling(c: &mut Criterion) {
    let (rt1, rt2) = (runtime(1), runtime(2));
    let (ry1, ry2) = (rayon_pool(1), rayon_pool(2));

    // fib(34), pruning on (the default), the same code on 1 and 2 processors.
    const FN: u64 = 34;
    let want = fib_seq(FN);
    assert_eq!(rt2.run(|ctx| fib_hyfi(ctx, FN)).unwrap(), want);
    assert_eq!(ry2.install(|| fib_rayon(FN)), want);
    let mut g = scaling_group(c, "t3_scale_fib34");
    g.bench_function("seq_recursive", |b| b.iter(|| fib_seq(black_box(FN))));
    g.bench_function("hyfi_1p", |b| {
        b.iter(|| rt1.run(|ctx| fib_hyfi(ctx, black_box(FN))).unwrap())
    });
    g.bench_function("hyfi_2p", |b| {
        b.iter(|| rt2.run(|ctx| fib_hyfi(ctx, black_box(FN))).unwrap())
    });
    g.bench_function("rayon_1t", |b| {
        b.iter(|| ry1.install(|| fib_rayon(black_box(FN))))
    });
    g.bench_function("rayon_2t", |b| {
        b.iter(|| ry2.install(|| fib_rayon(black_box(FN))))
    });
    g.finish();

    // Adaptive quadrature of x^6 on [1, 70].
    let q = || {
        let (a, b, fa, fb, area) = quad_args();
        quad_seq(a, b, fa, fb, area)
    };
    let qh = |rt: &Runtime| {
        rt.run(|ctx| {
            let (a, b, fa, fb, area) = quad_args();
            quad_hyfi(ctx, a, b, fa, fb, area)
        })
        .unwrap()
    };
    let qr = |pool: &rayon::ThreadPool| {
        pool.install(|| {
            let (a, b, fa, fb, area) = quad_args();
            quad_rayon(a, b, fa, fb, area)
        })
    };
    let want = q();
    assert_eq!(qh(&rt1), want);
    assert_eq!(qh(&rt2), want);
    assert_eq!(qr(&ry2), want);
    let mut g = scaling_group(c, "t3_scale_quad_x6");
    g.bench_function("seq_recursive", |b| b.iter(q));
    g.bench_function("hyfi_1p", |b| b.iter(|| qh(&rt1)));
    g.bench_function("hyfi_2p", |b| b.iter(|| qh(&rt2)));
    g.bench_function("rayon_1t", |b| b.iter(|| qr(&ry1)));
    g.bench_function("rayon_2t", |b| b.iter(|| qr(&ry2)));
    g.finish();

    // Jacobi n = 256 (two grids: 1 MiB), 100 iterations per run, one
    // filament per point.
    const JN: usize = 256;
    const JI: u64 = 100;
    jacobi_check(&rt2, JN, JI);
    let mut g = scaling_group(c, "t3_scale_jacobi256");
    let (mut old, mut new) = jacobi_vecs(JN);
    g.bench_function("seq_vec", |b| {
        b.iter(|| jacobi_seq(&mut old, &mut new, JN, JI, 0.0))
    });
    for (name, rt) in [("hyfi_1p", &rt1), ("hyfi_2p", &rt2)] {
        let grids = jacobi_grids(JN);
        let maxdiff = rt.reduction(0.0f64);
        let mut prog = jacobi_point_program(rt, JN, &grids, &maxdiff, JI, 0.0);
        g.bench_function(name, |b| b.iter(|| rt.start(&mut prog).unwrap()));
    }
    for (name, pool) in [("rayon_1t", &ry1), ("rayon_2t", &ry2)] {
        let (mut old, mut new) = jacobi_vecs(JN);
        g.bench_function(name, |b| {
            b.iter(|| pool.install(|| jacobi_rayon(&mut old, &mut new, JN, JI, 0.0)))
        });
    }
    g.finish();
}

criterion_group!(benches, t1_jacobi1024, t2_fib32_prune, t3_scaling);
criterion_main!(benches);
