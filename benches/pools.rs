//! Per-point cost of strided (red-black) pools against the dense pool and
//! the sequential loop, on one processor: one SOR update per point.
//!
//! * `seq_red_black_sweep`: the sequential red-black sweep (two passes over
//!   the rows, each touching every other column).
//! * `hyfi_dense_phase`: one phase over every interior point (a dense
//!   pool, one segment per pool), writing a second matrix.
//! * `hyfi_red_black_phases`: a red phase then a black phase over pools
//!   from `PoolArray::block_rows_red_black` (one segment per row).
//! * `seq_red_black_sweep_residual` / `hyfi_red_black_views_residual`: the
//!   same sweep keeping its largest change, sequentially and in place on a
//!   DSM matrix through write views (`Program::phase_with`, one view of a
//!   row and its neighbours per segment, a register accumulator).
//!
//! Throughput is interior points per sweep, so the three read as a cost
//! per point.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use hyfi::{Config, Control, Dsm, Op, PoolArray, Program, Runtime};
// hyfi-core's node-local matrix (not in the facade: programs use the DSM's
// arrays): these benchmarks measure the pools and phases alone.
use hyfi_core::SharedMatrix;

const N: usize = 256;
const OMEGA: f64 = 1.5;

#[inline(always)]
fn sor(u: impl Fn(usize, usize) -> f64, i: usize, j: usize) -> f64 {
    let gs = (u(i - 1, j) + u(i + 1, j) + u(i, j - 1) + u(i, j + 1)) * 0.25;
    (1.0 - OMEGA) * u(i, j) + OMEGA * gs
}

fn init(i: usize, j: usize) -> f64 {
    if i == 0 {
        1.0
    } else {
        ((i * 13 + j * 5) % 7) as f64 / 7.0
    }
}

fn red_black(c: &mut Criterion) {
    let points = ((N - 2) * (N - 2)) as u64;
    let mut g = c.benchmark_group("red_black_sor_256_1p");
    g.throughput(Throughput::Elements(points));

    let mut u: Vec<f64> = (0..N * N).map(|x| init(x / N, x % N)).collect();
    g.bench_function("seq_red_black_sweep", |b| {
        b.iter(|| {
            for colour in 0..2 {
                for i in 1..N - 1 {
                    let first = 1 + (colour + i + 1) % 2;
                    for j in (first..N - 1).step_by(2) {
                        u[i * N + j] = sor(|a, b| u[a * N + b], i, j);
                    }
                }
            }
            black_box(&u);
        })
    });

    let rt = Runtime::new(Config::new().procs(1).pin(false)).expect("hyfi runtime");
    let m = SharedMatrix::from_fn(N, N, init);
    let sweeps = AtomicU64::new(1);
    let update = |_: &hyfi::Ctx, (i, j): (usize, usize)| m.set(i, j, sor(|a, b| m.get(a, b), i, j));
    let until = |post: &mut hyfi::PostPhase<'_>| {
        if post.iteration() + 1 >= sweeps.load(Relaxed) {
            Control::Done
        } else {
            Control::Continue
        }
    };

    // Into another matrix: an in-place dense sweep would chain each point
    // on its left neighbour's result (Gauss-Seidel), which red-black avoids.
    let out = SharedMatrix::<f64>::new(N, N);
    let mut dense = Program::new();
    dense.phase(
        PoolArray::block_rows(&rt, 1..N - 1, 1..N - 1, 1),
        |_, (i, j)| out.set(i, j, sor(|a, b| m.get(a, b), i, j)),
        until,
    );
    g.bench_function("hyfi_dense_phase", |b| {
        b.iter_custom(|iters| {
            sweeps.store(iters, Relaxed);
            let t = Instant::now();
            rt.start(&mut dense).unwrap();
            t.elapsed()
        })
    });
    drop(dense);

    let red = PoolArray::block_rows_red_black(&rt, 1..N - 1, 1..N - 1, 0, 1);
    let black = PoolArray::block_rows_red_black(&rt, 1..N - 1, 1..N - 1, 1, 1);
    let mut rb = Program::new();
    rb.phase(red, update, |_| Control::Continue);
    rb.phase(black, update, until);
    g.bench_function("hyfi_red_black_phases", |b| {
        b.iter_custom(|iters| {
            sweeps.store(iters, Relaxed);
            let t = Instant::now();
            rt.start(&mut rb).unwrap();
            t.elapsed()
        })
    });
    drop(rb);

    // In place through the DSM's write views (rows and their neighbours,
    // validated once per segment), with the sweep's largest change kept in
    // a register accumulator: the shape a user writes for SOR with a
    // convergence test. Its sequential counterpart computes the same change.
    let mut u2: Vec<f64> = (0..N * N).map(|x| init(x / N, x % N)).collect();
    g.bench_function("seq_red_black_sweep_residual", |b| {
        b.iter(|| {
            let mut m = 0.0f64;
            for colour in 0..2 {
                for i in 1..N - 1 {
                    let first = 1 + (colour + i + 1) % 2;
                    for j in (first..N - 1).step_by(2) {
                        let old = u2[i * N + j];
                        let v = sor(|a, b| u2[a * N + b], i, j);
                        u2[i * N + j] = v;
                        let d = (v - old).abs();
                        if d > m {
                            m = d
                        }
                    }
                }
            }
            black_box((&u2, m));
        })
    });
    let dsm = Dsm::new(&rt).expect("dsm");
    let w = dsm
        .matrix::<f64>(N, N)
        .pad_rows()
        .from_fn(init)
        .expect("matrix");
    let change = rt.reduction(0.0f64);
    let bind = |ctx: &hyfi::Ctx, span: &hyfi::Span| {
        let r = span.rows();
        (
            w.write_rows(ctx, r.start - 1..r.end + 1),
            change.local(ctx, Op::Max),
        )
    };
    let point = |_: &hyfi::Ctx,
                 (i, j): (usize, usize),
                 (v, m): &mut (hyfi::WriteRows<'_, f64>, hyfi::Local<'_, f64>)| {
        let old = v.get(i, j);
        let x = sor(|a, b| v.get(a, b), i, j);
        v.set(i, j, x);
        m.fold((x - old).abs());
    };
    let mut rbv = Program::new();
    rbv.phase_with(
        PoolArray::block_rows_red_black(&rt, 1..N - 1, 1..N - 1, 0, 1),
        bind,
        point,
        |_| Control::Continue,
    );
    rbv.phase_with(
        PoolArray::block_rows_red_black(&rt, 1..N - 1, 1..N - 1, 1, 1),
        bind,
        point,
        |post| {
            black_box(post.reduce(&change, Op::Max));
            post.set(&change, 0.0);
            until(post)
        },
    );
    g.bench_function("hyfi_red_black_views_residual", |b| {
        b.iter_custom(|iters| {
            sweeps.store(iters, Relaxed);
            let t = Instant::now();
            rt.start(&mut rbv).unwrap();
            t.elapsed()
        })
    });
    drop(rbv);
    g.finish();
}

criterion_group!(benches, red_black);
criterion_main!(benches);
