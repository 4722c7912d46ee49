//! Cost per update of an exact sum against a plain f64 sum, on one core.
//!
//! * `exact_sum_1p/seq_f64_loop`: `s += x` over a vector, the floor.
//! * `exact_sum_1p/seq_exact_accumulator`: `ExactAccumulator::add` over the
//!   same vector, no runtime.
//! * `exact_sum_1p/hyfi_{opsum,exact}_fold`: one phase of one filament per
//!   value, folding into a `Reduction<f64>` with `Op::Sum` or into an
//!   `ExactSum`, then its reduce.
//! * `exact_sum_1p/hyfi_{opsum,exact}_local`: the same with segment-local
//!   accumulators (`Program::phase_with`, `Reduction::local`,
//!   `ExactSum::local`).
//!
//! Throughput is in values, so 1 / thrpt is the cost per update. The
//! values span 2⁻⁴⁰..2⁴⁰ with both signs, as in `examples/exact_sum`.
//!
//! Run with `cargo bench --bench exact -- --noplot`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use hyfi::{Config, Control, ExactAccumulator, Op, PoolArray, Program, Runtime};

const N: usize = 1 << 20;

fn values() -> Vec<f64> {
    let mut s = 0x1234_5678u64;
    (0..N)
        .map(|_| {
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            let unit = (z >> 11) as f64 / (1u64 << 53) as f64;
            let mag = (unit + 0.5) * 2f64.powi((z % 81) as i32 - 40);
            if z & 1 == 0 {
                mag
            } else {
                -mag
            }
        })
        .collect()
}

fn exact_vs_sum(c: &mut Criterion) {
    let xs = values();
    // Unpinned: one processor wherever the OS puts it (a shared machine).
    let rt = Runtime::new(Config::new().procs(1).pin(false)).expect("hyfi runtime");
    let plain = rt.reduction(0.0f64);
    let exact = rt.exact_sum();
    let mut want = ExactAccumulator::new();
    want.add_all(&xs);
    let want = want.value();

    let mut g = c.benchmark_group("exact_sum_1p");
    g.throughput(Throughput::Elements(N as u64))
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    g.bench_function("seq_f64_loop", |b| {
        b.iter(|| {
            let mut s = 0.0f64;
            for &x in black_box(&xs[..]) {
                s += x;
            }
            s
        })
    });
    g.bench_function("seq_exact_accumulator", |b| {
        b.iter(|| {
            let mut a = ExactAccumulator::new();
            a.add_all(black_box(&xs[..]));
            a.value()
        })
    });
    let phase = |local: bool, exact_kind: bool| {
        let mut out = 0.0;
        let mut prog = Program::new();
        let pools = PoolArray::block(&rt, 0..N, 1);
        let post = |post: &mut hyfi::PostPhase<'_>| {
            out = if exact_kind {
                let v = post.reduce_exact(&exact);
                post.set_exact(&exact, 0.0);
                v
            } else {
                let v = post.reduce(&plain, Op::Sum);
                post.set(&plain, 0.0);
                v
            };
            Control::Done
        };
        match (local, exact_kind) {
            (false, false) => prog.phase(pools, |ctx, i| plain.fold(ctx, Op::Sum, xs[i]), post),
            (false, true) => prog.phase(pools, |ctx, i| exact.fold(ctx, xs[i]), post),
            (true, false) => prog.phase_with(
                pools,
                |ctx, span| {
                    (
                        &xs[span.rows()],
                        span.rows().start,
                        plain.local(ctx, Op::Sum),
                    )
                },
                |_, i, (part, first, acc)| acc.fold(part[i - *first]),
                post,
            ),
            (true, true) => prog.phase_with(
                pools,
                |ctx, span| (&xs[span.rows()], span.rows().start, exact.local(ctx)),
                |_, i, (part, first, acc)| acc.fold(part[i - *first]),
                post,
            ),
        };
        rt.start(&mut prog).expect("phase");
        drop(prog);
        out
    };
    assert_eq!(phase(false, true).to_bits(), want.to_bits());
    assert_eq!(phase(true, true).to_bits(), want.to_bits());
    g.bench_function("hyfi_opsum_fold", |b| b.iter(|| phase(false, false)));
    g.bench_function("hyfi_exact_fold", |b| b.iter(|| phase(false, true)));
    g.bench_function("hyfi_opsum_local", |b| b.iter(|| phase(true, false)));
    g.bench_function("hyfi_exact_local", |b| b.iter(|| phase(true, true)));
    g.finish();
}

criterion_group!(benches, exact_vs_sum);
criterion_main!(benches);
