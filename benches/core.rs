//! Runtime overheads: hyfi's primitives against the nearest baseline, each
//! group holding the baseline and hyfi side by side.
//!
//! * `t2_fork_fib27_noprune_1p`: cost of a real fork (pruning off, every
//!   level forks) on 1 processor vs `rayon::join` on a 1-thread pool;
//!   throughput is in forks (joins), so 1 / thrpt is the cost per fork.
//! * `t4_empty_phase_{1,2}p`: P trivial filaments (one per processor) and
//!   one `Op::Sum` reduction per phase vs rayon's
//!   `(0..P).into_par_iter().sum()` on a pool of P threads (and
//!   `rayon::broadcast`, which like a phase involves every thread); time
//!   per phase.
//! * `t5_filthread_switch_1p`: suspend + wake + resume round trip vs a raw
//!   corosensei `resume` / `Yielder::suspend` round trip.
//! * `t5_filthread_create_1p`: a filthread per pool (1000 pools of one
//!   trivial filament per phase) vs raw corosensei `Coroutine::with_stack`
//!   + run to completion on a reused stack; throughput in filthreads.
//!
//! Run with `cargo bench --bench core -- --noplot`.

mod common;
use common::{config, fib_hyfi, fib_rayon, fib_seq, rayon_pool};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use corosensei::stack::DefaultStack;
use corosensei::{Coroutine, CoroutineResult, Yielder};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use hyfi::layers::filthread;
use hyfi::{Control, Op, PoolArray, Program, Runtime};
use rayon::prelude::*;

// ------------------------------------------------------- cost of a fork

fn t2_fork_cost(c: &mut Criterion) {
    const N: u64 = 27;
    // fib(n) makes one join per call with n >= 2: fib(n + 1) - 1 of them.
    let joins = fib_seq(N + 1) - 1;
    let rt = Runtime::new(config(1).prune(false)).expect("hyfi runtime");
    let pool = rayon_pool(1);
    assert_eq!(rt.run(|ctx| fib_hyfi(ctx, N)).unwrap(), fib_seq(N));
    rt.reset_stats();
    rt.run(|ctx| fib_hyfi(ctx, N)).unwrap();
    let forks: u64 = rt.stats().procs.iter().map(|p| p.forks).sum();
    assert_eq!(forks, joins, "pruning off: every join must fork");

    let mut g = c.benchmark_group("t2_fork_fib27_noprune_1p");
    g.throughput(Throughput::Elements(joins))
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .sample_size(30);
    g.bench_function("baseline_rayon_join_1t", |b| {
        b.iter(|| pool.install(|| fib_rayon(black_box(N))))
    });
    g.bench_function("hyfi_join_noprune", |b| {
        b.iter(|| rt.run(|ctx| fib_hyfi(ctx, black_box(N))).unwrap())
    });
    // For reference: the same recursion with no fork at all.
    g.bench_function("ref_seq_recursive", |b| b.iter(|| fib_seq(black_box(N))));
    g.finish();
}

// --------------------------------------------------------- empty phase

fn t4_empty_phase(c: &mut Criterion) {
    for p in [1usize, 2] {
        let rt = Runtime::new(config(p)).expect("hyfi runtime");
        let pool = rayon_pool(p);
        let mut g = c.benchmark_group(format!("t4_empty_phase_{p}p"));
        g.warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(3));

        g.bench_function(format!("baseline_rayon_par_sum_{p}t"), |b| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                pool.install(|| {
                    for _ in 0..iters {
                        black_box((0..black_box(p)).into_par_iter().sum::<usize>());
                    }
                });
                t.elapsed()
            })
        });

        // A closer peer: rayon::broadcast runs one closure on every thread of
        // the pool (as a phase runs one pool on every processor) and waits
        // for all of them, then the P results are summed.
        g.bench_function(format!("peer_rayon_broadcast_sum_{p}t"), |b| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                pool.install(|| {
                    for _ in 0..iters {
                        let v = rayon::broadcast(|c| c.index());
                        black_box(v.iter().sum::<usize>());
                    }
                });
                t.elapsed()
            })
        });

        // One program run = `iters` phases.
        let phases = AtomicU64::new(1);
        let sum = rt.reduction(0u64);
        let mut prog = Program::new();
        prog.phase(
            PoolArray::<usize>::block(&rt, 0..p, 1),
            |ctx, i| sum.update(ctx, |s| s + i as u64),
            |post| {
                let s = post.reduce(&sum, Op::Sum);
                black_box(s);
                post.set(&sum, 0);
                if post.iteration() + 1 >= phases.load(Relaxed) {
                    Control::Done
                } else {
                    Control::Continue
                }
            },
        );
        g.bench_function(format!("hyfi_phase_{p}p"), |b| {
            b.iter_custom(|iters| {
                phases.store(iters, Relaxed);
                let t = Instant::now();
                rt.start(&mut prog).unwrap();
                t.elapsed()
            })
        });
        drop(prog);
        g.finish();
    }
}

// ------------------------------------------------------------ filthreads

fn t5_filthread_switch(c: &mut Criterion) {
    let rt = Runtime::new(config(1)).expect("hyfi runtime");
    let mut g = c.benchmark_group("t5_filthread_switch_1p");
    g.warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));

    let mut co: Coroutine<(), (), ()> = Coroutine::new(|y: &Yielder<(), ()>, ()| loop {
        y.suspend(());
    });
    g.bench_function("baseline_corosensei_resume_suspend", |b| {
        b.iter(|| black_box(co.resume(())))
    });
    drop(co);

    g.bench_function("hyfi_suspend_wake_resume", |b| {
        b.iter_custom(|iters| {
            let t = Instant::now();
            rt.run(|_ctx| {
                for _ in 0..iters {
                    // Waking before the suspension completes is allowed.
                    filthread::suspend(|w| {
                        w.wake();
                        true
                    });
                }
            })
            .unwrap();
            t.elapsed()
        })
    });
    g.finish();
}

fn t5_filthread_create(c: &mut Criterion) {
    const POOLS: usize = 1000;
    let rt = Runtime::new(config(1)).expect("hyfi runtime");
    let mut g = c.benchmark_group("t5_filthread_create_1p");
    g.throughput(Throughput::Elements(POOLS as u64))
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));

    // Per iteration: POOLS coroutines made on one reused stack and run to
    // completion.
    let mut stack = Some(DefaultStack::new(hyfi::DEFAULT_STACK_SIZE).expect("stack"));
    g.bench_function("baseline_corosensei_with_stack_x1000", |b| {
        b.iter(|| {
            for k in 0..POOLS {
                let mut co: Coroutine<(), (), (), DefaultStack> = Coroutine::with_stack(
                    stack.take().unwrap(),
                    move |_y: &Yielder<(), ()>, ()| {
                        black_box(k);
                    },
                );
                let r = co.resume(());
                debug_assert!(matches!(r, CoroutineResult::Return(())));
                black_box(r);
                stack = Some(co.into_stack());
            }
        })
    });

    // Per iteration: one phase of POOLS pools with one trivial filament
    // each; every pool runs on a filthread of its own.
    let phases = AtomicU64::new(1);
    let mut prog = Program::new();
    prog.phase(
        PoolArray::<usize>::block(&rt, 0..POOLS, POOLS),
        |_ctx, i| {
            black_box(i);
        },
        |post| {
            if post.iteration() + 1 >= phases.load(Relaxed) {
                Control::Done
            } else {
                Control::Continue
            }
        },
    );
    rt.reset_stats();
    rt.start(&mut prog).unwrap();
    let st = rt.stats();
    assert_eq!(
        st.procs[0].filthreads, POOLS as u64,
        "one filthread per pool"
    );
    g.bench_function("hyfi_pool_filthreads_x1000", |b| {
        b.iter_custom(|iters| {
            phases.store(iters, Relaxed);
            let t = Instant::now();
            rt.start(&mut prog).unwrap();
            t.elapsed()
        })
    });
    drop(prog);
    g.finish();
}

criterion_group!(
    benches,
    t2_fork_cost,
    t4_empty_phase,
    t5_filthread_switch,
    t5_filthread_create
);
criterion_main!(benches);
