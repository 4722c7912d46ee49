//! The fork-join examples (`examples/quad.rs`, `examples/fib.rs`) at small
//! sizes on 1 and 2 processors, pruning on and off; plus stealing, a panic
//! deep in a fork-join filament, and `join_n` ordering.

// Each example is a standalone program that includes examples/common;
// including several examples here loads that file once per example.
#![allow(clippy::duplicate_mod)]

#[path = "../examples/quad.rs"]
#[allow(dead_code)]
mod quad;

#[path = "../examples/fib.rs"]
#[allow(dead_code)]
mod fib;

use hyfi::{Config, Ctx, Runtime};
use quad::{allowed_error, quad_hyfi, quad_seq, Func};

/// (procs, pruning) for every configuration tested.
const CONFIGS: [(usize, bool); 4] = [(1, true), (1, false), (2, true), (2, false)];

fn runtime(procs: usize, prune: bool) -> Runtime {
    Runtime::new(Config::new().procs(procs).pin(false).prune(prune)).expect("runtime starts")
}

fn check_quad(f: Func, a: f64, b: f64, eps: f64) {
    let seq = quad_seq(f, a, b, eps);
    let exact = f.exact(a, b);
    assert!(
        (seq.value - exact).abs() <= allowed_error(eps, exact),
        "{f:?}: sequential {} vs exact {exact}",
        seq.value
    );
    assert!(
        seq.intervals > 100,
        "{f:?}: too easy ({} intervals)",
        seq.intervals
    );
    let mut values = Vec::new();
    for (procs, prune) in CONFIGS {
        let rt = runtime(procs, prune);
        // Several runs on 2 processors: different steals, same bits.
        for _ in 0..if procs > 1 { 3 } else { 1 } {
            let par = rt
                .run(|ctx| quad_hyfi(ctx, f, a, b, eps))
                .expect("quad runs");
            assert_eq!(
                par.value.to_bits(),
                seq.value.to_bits(),
                "{f:?} procs {procs} prune {prune}: {} vs sequential {}",
                par.value,
                seq.value
            );
            assert_eq!(
                par.intervals, seq.intervals,
                "{f:?} procs {procs} prune {prune}"
            );
            values.push(par.value.to_bits());
        }
    }
    assert!(values.windows(2).all(|w| w[0] == w[1]), "{f:?}: {values:?}");
}

#[test]
fn quad_x6_bit_for_bit_and_close_to_exact() {
    check_quad(Func::X6, 1.0, 70.0, 1e4);
}

#[test]
fn quad_spiky_bit_for_bit_and_close_to_exact() {
    check_quad(Func::Spiky, 0.0, 1.0, 1e-4);
}

#[test]
fn quad_spiky_work_is_near_the_peak() {
    // The integrand is badly unbalanced: the sliver around the peak needs
    // far more intervals than the rest of [0, 1] (same tree, same tolerances).
    let eps = 1e-4;
    let all = quad_seq(Func::Spiky, 0.0, 1.0, eps).intervals;
    // [0.875, 1] is the third-level subtree: tolerance eps / 8.
    let near = quad_seq(Func::Spiky, 0.875, 1.0, eps / 8.0).intervals;
    assert!(
        near * 10 > all * 9,
        "{near} of {all} intervals near the peak"
    );
}

#[test]
fn fib_equals_iterative_in_every_configuration() {
    let n = 20;
    let want = fib::fib_iter(n);
    assert_eq!(want, 6765);
    assert_eq!(fib::fib_seq(n), want);
    assert_eq!(fib::fib_iter(fib::MAX_N), 12_200_160_415_121_876_738);
    for (procs, prune) in CONFIGS {
        let rt = runtime(procs, prune);
        for cutoff in [0, 10] {
            let got = rt
                .run(|ctx| fib::fib_hyfi(ctx, n, cutoff))
                .expect("fib runs");
            assert_eq!(got, want, "procs {procs} prune {prune} cutoff {cutoff}");
        }
    }
}

#[test]
fn two_processors_steal_and_both_fork() {
    let rt = runtime(2, false);
    rt.reset_stats();
    // A server thread the OS does not schedule during a short run cannot
    // steal (tests run in parallel on 2 cores), so repeat until both have
    // worked; the counters accumulate over runs.
    let mut runs = 0;
    let stats = loop {
        let got = rt.run(|ctx| fib::fib_hyfi(ctx, 27, 0)).expect("fib runs");
        assert_eq!(got, fib::fib_iter(27));
        runs += 1;
        let stats = rt.stats();
        let both = stats.procs.iter().all(|p| p.forks > 0);
        if (stats.total().steals > 0 && both) || runs == 50 {
            break stats;
        }
    };
    let total = stats.total();
    assert!(total.steals > 0, "no steals in {runs} runs:\n{stats}");
    assert!(
        stats.procs.iter().all(|p| p.forks > 0),
        "a processor made no fork in {runs} runs:\n{stats}"
    );
    // Without pruning every join is a real fork: one per internal node.
    assert_eq!(total.forks, runs * (fib::fib_iter(28) - 1), "\n{stats}");
}

/// A binary fork-join tree of `depth` levels whose leaf `target` panics.
fn boom(ctx: &Ctx, depth: u32, leaf: u64, target: u64) -> u64 {
    if depth == 0 {
        if leaf == target {
            panic!("boom at leaf {leaf}");
        }
        return 1;
    }
    let (a, b) = ctx.join(
        |c| boom(c, depth - 1, 2 * leaf, target),
        |c| boom(c, depth - 1, 2 * leaf + 1, target),
    );
    a + b
}

#[test]
fn panic_deep_in_the_recursion_is_an_error_and_the_runtime_survives() {
    for (procs, prune) in CONFIGS {
        let rt = runtime(procs, prune);
        for target in [0, 12_345, (1 << 14) - 1] {
            match rt.run(|ctx| boom(ctx, 14, 0, target)) {
                Err(hyfi::Error::FilamentPanic { message, .. }) => assert!(
                    message.contains(&format!("boom at leaf {target}")),
                    "procs {procs} prune {prune}: message {message:?}"
                ),
                other => {
                    panic!("procs {procs} prune {prune}: expected FilamentPanic, got {other:?}")
                }
            }
            // Usable afterwards.
            assert_eq!(
                rt.run(|ctx| boom(ctx, 14, 0, u64::MAX)).expect("runs"),
                1 << 14
            );
            assert_eq!(rt.run(|ctx| fib::fib_hyfi(ctx, 18, 0)).expect("runs"), 2584);
        }
    }
}

#[test]
fn join_n_returns_results_in_index_order() {
    for (procs, prune) in CONFIGS {
        let rt = runtime(procs, prune);
        let n = 1000;
        // Uneven work per filament, so they finish out of order.
        let got = rt
            .run(|ctx| ctx.join_n(n, |c, i| (i, fib::fib_hyfi(c, (i % 17) as u64, 0))))
            .expect("join_n runs");
        let want: Vec<(usize, u64)> = (0..n)
            .map(|i| (i, fib::fib_iter((i % 17) as u64)))
            .collect();
        assert_eq!(got, want, "procs {procs} prune {prune}");
        assert!(rt
            .run(|ctx| ctx.join_n(0, |_, i| i))
            .expect("runs")
            .is_empty());
        assert_eq!(
            rt.run(|ctx| ctx.join_n(1, |_, i| i + 7)).expect("runs"),
            vec![7]
        );
    }
}
