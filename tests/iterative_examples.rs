//! The iterative-filament examples (Jacobi, red-black SOR, LU, matrix
//! multiplication) at small sizes: each must match its sequential version
//! bit for bit, and one and two processors must agree bit for bit.

// Each example is a standalone program that includes examples/common;
// including several examples here loads that file once per example.
#![allow(clippy::duplicate_mod)]

use clap::Parser;
use hyfi::{Config, Runtime};

#[path = "../examples/diffusion.rs"]
#[allow(dead_code)]
mod diffusion;
#[path = "../examples/jacobi.rs"]
#[allow(dead_code)]
mod jacobi;
#[path = "../examples/lu.rs"]
#[allow(dead_code)]
mod lu;
#[path = "../examples/matmul.rs"]
#[allow(dead_code)]
mod matmul;
#[path = "../examples/sor.rs"]
#[allow(dead_code)]
mod sor;

/// Unpinned, so tests running side by side may oversubscribe the CPUs.
fn runtime(procs: usize) -> Runtime {
    Runtime::new(Config::new().procs(procs).pin(false)).expect("runtime starts")
}

/// Parses `cmdline` as the example's command line.
fn args<A: Parser>(name: &str, cmdline: &str) -> A {
    A::try_parse_from(std::iter::once(name).chain(cmdline.split_whitespace()))
        .unwrap_or_else(|e| panic!("{name} {cmdline}: {e}"))
}

/// Runs Jacobi on 1 and 2 processors; checks both against the sequential
/// sweeps and each other; returns the sequential result.
fn jacobi_1_2(cmdline: &str) -> jacobi::Output {
    let a: jacobi::Args = args("jacobi", cmdline);
    let seq = jacobi::run_seq(&a);
    let one = jacobi::run_hyfi(&runtime(1), &a).expect("1 processor runs");
    let two = jacobi::run_hyfi(&runtime(2), &a).expect("2 processors run");
    assert_eq!(
        one.check_same(&seq),
        Ok(()),
        "jacobi {cmdline}, 1 processor vs sequential"
    );
    assert_eq!(
        two.check_same(&seq),
        Ok(()),
        "jacobi {cmdline}, 2 processors vs sequential"
    );
    assert_eq!(
        one.check_same(&two),
        Ok(()),
        "jacobi {cmdline}, 1 vs 2 processors"
    );
    assert_eq!(one.converged, seq.converged);
    assert_eq!(two.converged, seq.converged);
    seq
}

#[test]
fn jacobi_point_filaments() {
    let seq = jacobi_1_2("--n 34 --iters 40");
    assert_eq!(seq.iters, 40);
    assert!(!seq.converged);
    // The top edge is hot and heat has flowed in.
    assert!(seq.grid[34 + 17] > 0.0);
}

#[test]
fn jacobi_three_pools_per_proc() {
    // 3 × 2 pools over 30 interior rows, and over 5 rows (some pools empty).
    let seq = jacobi_1_2("--n 32 --iters 25 --pools-per-proc 3");
    assert_eq!(seq.iters, 25);
    let seq = jacobi_1_2("--n 7 --iters 10 --pools-per-proc 3");
    assert_eq!(seq.iters, 10);
}

#[test]
fn jacobi_row_filaments() {
    let seq = jacobi_1_2("--n 33 --iters 30 --per-row");
    assert_eq!(seq.iters, 30);
    let seq = jacobi_1_2("--n 33 --iters 30 --per-row --pools-per-proc 3");
    assert_eq!(seq.iters, 30);
}

#[test]
fn jacobi_row_and_point_filaments_agree() {
    let a: jacobi::Args = args("jacobi", "--n 20 --iters 15");
    let b: jacobi::Args = args("jacobi", "--n 20 --iters 15 --per-row --pools-per-proc 2");
    let rt = runtime(2);
    let points = jacobi::run_hyfi(&rt, &a).expect("runs");
    let rows = jacobi::run_hyfi(&rt, &b).expect("runs");
    assert_eq!(points.check_same(&rows), Ok(()));
}

#[test]
fn jacobi_reduction_decides_when_to_stop() {
    // A large --iters: only the maxdiff reduction can end the sweeps, and it
    // must do so after exactly as many sweeps as the sequential loop.
    let seq = jacobi_1_2("--n 12 --eps 1e-4 --iters 100000");
    assert!(seq.converged);
    assert!(seq.iters > 1 && seq.iters < 100000, "{} sweeps", seq.iters);
    assert!(seq.maxdiff < 1e-4);
    // The reduction's value is the largest change of the last sweep.
    let rt = runtime(2);
    for eps in [1e-2, 1e-3, 1e-5] {
        let a: jacobi::Args = args("jacobi", &format!("--n 12 --iters 100000 --eps {eps}"));
        let par = jacobi::run_hyfi(&rt, &a).expect("runs");
        let seq = jacobi::run_seq(&a);
        assert!(par.converged, "eps {eps}");
        assert_eq!(par.iters, seq.iters, "eps {eps}");
        assert_eq!(par.maxdiff.to_bits(), seq.maxdiff.to_bits(), "eps {eps}");
        assert!(par.maxdiff < eps, "eps {eps}");
    }
    // Smaller eps: more sweeps.
    let count = |eps: f64| {
        let a: jacobi::Args = args("jacobi", &format!("--n 12 --iters 100000 --eps {eps}"));
        jacobi::run_hyfi(&rt, &a).expect("runs").iters
    };
    assert!(count(1e-2) < count(1e-3) && count(1e-3) < count(1e-5));
}

#[test]
fn jacobi_runtime_is_reusable() {
    // Two programs on one runtime: iteration counts start again from 0.
    let a: jacobi::Args = args("jacobi", "--n 16 --iters 9");
    let rt = runtime(2);
    let first = jacobi::run_hyfi(&rt, &a).expect("runs");
    let second = jacobi::run_hyfi(&rt, &a).expect("runs");
    assert_eq!(first.check_same(&second), Ok(()));
    assert_eq!(first.check_same(&jacobi::run_seq(&a)), Ok(()));
}

/// Runs red-black SOR on 1 and 2 processors; checks both against the
/// sequential sweeps and each other; returns the sequential result.
fn sor_1_2(cmdline: &str) -> sor::Output {
    let a: sor::Args = args("sor", cmdline);
    let seq = sor::run_seq(&a);
    let one = sor::run_hyfi(&runtime(1), &a).expect("1 processor runs");
    let two = sor::run_hyfi(&runtime(2), &a).expect("2 processors run");
    assert_eq!(
        one.check_same(&seq),
        Ok(()),
        "sor {cmdline}, 1 processor vs sequential"
    );
    assert_eq!(
        two.check_same(&seq),
        Ok(()),
        "sor {cmdline}, 2 processors vs sequential"
    );
    assert_eq!(
        one.check_same(&two),
        Ok(()),
        "sor {cmdline}, 1 vs 2 processors"
    );
    assert_eq!(one.converged, seq.converged);
    seq
}

#[test]
fn sor_in_place_matches_sequential() {
    let seq = sor_1_2("--n 34 --iters 40");
    assert_eq!(seq.iters, 40);
    assert!(seq.grid[34 + 17] > 0.0, "heat has flowed in");
    // Several pools per processor (some empty on 7 rows); Gauss–Seidel.
    sor_1_2("--n 32 --iters 25 --pools-per-proc 3");
    sor_1_2("--n 9 --iters 10 --pools-per-proc 3 --omega 1");
}

#[test]
fn sor_reduction_decides_when_to_stop() {
    let seq = sor_1_2("--n 12 --eps 1e-6 --iters 100000");
    assert!(seq.converged);
    assert!(seq.iters > 1 && seq.iters < 100000, "{} sweeps", seq.iters);
    assert!(seq.maxdiff < 1e-6);
    // Over-relaxation converges in fewer sweeps than Gauss–Seidel here.
    let gs = sor::run_seq(&args("sor", "--n 12 --eps 1e-6 --iters 100000 --omega 1"));
    assert!(seq.iters < gs.iters, "{} vs {}", seq.iters, gs.iters);
}

#[test]
fn diffusion_matches_sequential() {
    for cmdline in [
        "--n 34 --steps 15",
        "--n 34 --steps 15 --per-row --pools-per-proc 3",
        "--n 9 --steps 7 --per-row --pad-rows",
    ] {
        let a: diffusion::Args = args("diffusion", cmdline);
        let seq = diffusion::run_seq(&a);
        assert!(seq.grid[a.n + 1] > 0.0, "heat has flowed in");
        for procs in [1, 2] {
            let par = diffusion::run_hyfi(&runtime(procs), &a).expect("runs");
            let same = par.grid.len() == seq.grid.len()
                && par
                    .grid
                    .iter()
                    .zip(&seq.grid)
                    .all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(
                same,
                "diffusion {cmdline} on {procs} processors: not bit for bit the loop's"
            );
        }
    }
}

fn lu_1_2(cmdline: &str) -> lu::Output {
    let a: lu::Args = args("lu", cmdline);
    let seq = lu::run_seq(&a);
    let one = lu::run_hyfi(&runtime(1), &a).expect("1 processor runs");
    let two = lu::run_hyfi(&runtime(2), &a).expect("2 processors run");
    assert_eq!(
        one.check_same(&seq),
        Ok(()),
        "lu {cmdline}, 1 processor vs sequential"
    );
    assert_eq!(
        two.check_same(&seq),
        Ok(()),
        "lu {cmdline}, 2 processors vs sequential"
    );
    assert_eq!(
        one.check_same(&two),
        Ok(()),
        "lu {cmdline}, 1 vs 2 processors"
    );
    seq
}

#[test]
fn lu_matches_sequential_and_factors_a() {
    for cmdline in ["--n 48", "--n 33 --seed 7", "--n 1", "--n 2 --seed 3"] {
        let seq = lu_1_2(cmdline);
        assert_eq!(seq.singular_at, None, "{cmdline}");
        let a: lu::Args = args("lu", cmdline);
        let res = lu::scaled_residual(&a, &seq);
        assert!(
            res <= lu::RESIDUAL_LIMIT,
            "{cmdline}: scaled residual {res}"
        );
    }
}

#[test]
fn lu_pivots() {
    // A random matrix needs row exchanges; the permutation is a permutation.
    let seq = lu_1_2("--n 40 --seed 11");
    assert!(seq.perm.iter().enumerate().any(|(i, &p)| i != p));
    let mut sorted = seq.perm.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..40).collect::<Vec<_>>());
    // Partial pivoting keeps every multiplier at most 1 in magnitude.
    for i in 0..40 {
        for k in 0..i {
            assert!(
                seq.lu[i * 40 + k].abs() <= 1.0,
                "L[{i}][{k}] = {}",
                seq.lu[i * 40 + k]
            );
        }
    }
}

#[test]
fn lu_stops_at_a_zero_pivot() {
    let n = 12;
    let check = |a: &[f64]| {
        let seq = lu::factor_seq(n, a);
        for p in [1, 2] {
            let par = lu::factor_hyfi(&runtime(p), n, a).expect("runs");
            assert_eq!(par.check_same(&seq), Ok(()), "{p} processors");
        }
        seq.singular_at
    };
    // Column 0 all zero: no pivot at the first step.
    let mut a = lu::matrix(n, 3);
    for i in 0..n {
        a[i * n] = 0.0;
    }
    assert_eq!(check(&a), Some(0));
    // Two equal rows get the same updates until one is the pivot row; the
    // other then becomes exactly zero, so a later pivot is exactly zero.
    let mut a = lu::matrix(n, 3);
    let (r2, r9) = (2 * n, 9 * n);
    a.copy_within(r2..r2 + n, r9);
    assert!(matches!(check(&a), Some(k) if k > 0));
    // A regular matrix has none.
    assert_eq!(check(&lu::matrix(n, 3)), None);
}

#[test]
fn lu_on_more_processors_than_rows() {
    // Three processors, unpinned: the cyclic pools of some stay empty.
    let a: lu::Args = args("lu", "--n 2 --seed 5");
    let par = lu::run_hyfi(&runtime(3), &a).expect("runs");
    assert_eq!(par.check_same(&lu::run_seq(&a)), Ok(()));
}

fn matmul_1_2(cmdline: &str) {
    let a: matmul::Args = args("matmul", cmdline);
    let seq = matmul::run_seq(&a);
    let one = matmul::run_hyfi(&runtime(1), &a).expect("1 processor runs");
    let two = matmul::run_hyfi(&runtime(2), &a).expect("2 processors run");
    assert_eq!(
        one.check_same(&seq, a.n),
        Ok(()),
        "matmul {cmdline}, 1 processor vs sequential"
    );
    assert_eq!(
        two.check_same(&seq, a.n),
        Ok(()),
        "matmul {cmdline}, 2 processors vs sequential"
    );
    assert_eq!(
        one.check_same(&two, a.n),
        Ok(()),
        "matmul {cmdline}, 1 vs 2 processors"
    );
    assert_eq!(seq.c.len(), a.n * a.n);
}

#[test]
fn matmul_matches_sequential() {
    matmul_1_2("--n 40");
    matmul_1_2("--n 17 --seed 9 --pools-per-proc 3");
    matmul_1_2("--n 1");
    matmul_1_2("--n 40 --per-row");
    matmul_1_2("--n 17 --seed 9 --per-row --pools-per-proc 3");
}

#[test]
fn matmul_element_by_hand() {
    // The reference itself: one element of C summed by hand from A and B.
    let a: matmul::Args = args("matmul", "--n 6 --seed 4");
    let out = matmul::run_hyfi(&runtime(2), &a).expect("runs");
    let (x, y) = matmul::inputs(&a);
    let mut c23 = 0.0f64;
    for k in 0..6 {
        c23 += x[2 * 6 + k] * y[k * 6 + 3];
    }
    assert_eq!(out.c[2 * 6 + 3].to_bits(), c23.to_bits());
    assert_ne!(c23, 0.0);
}

#[test]
fn checks_catch_a_one_bit_difference() {
    // The comparisons above are bit for bit: flipping the lowest bit of one
    // value must be reported.
    let flip = |x: &mut f64| *x = f64::from_bits(x.to_bits() ^ 1);

    let a: jacobi::Args = args("jacobi", "--n 10 --iters 3");
    let good = jacobi::run_seq(&a);
    let mut bad = good.clone();
    flip(&mut bad.grid[4 * 10 + 5]);
    assert!(good.check_same(&bad).unwrap_err().contains("(4, 5)"));
    let mut bad = good.clone();
    bad.iters += 1;
    assert!(good.check_same(&bad).is_err());

    let a: sor::Args = args("sor", "--n 10 --iters 3");
    let good = sor::run_seq(&a);
    let mut bad = good.clone();
    flip(&mut bad.grid[4 * 10 + 5]);
    assert!(good.check_same(&bad).unwrap_err().contains("(4, 5)"));

    let a: lu::Args = args("lu", "--n 10");
    let good = lu::run_seq(&a);
    let mut bad = good.clone();
    flip(&mut bad.lu[7 * 10 + 2]);
    assert!(good.check_same(&bad).unwrap_err().contains("(7, 2)"));
    let mut bad = good.clone();
    bad.perm.swap(0, 1);
    assert!(good.check_same(&bad).is_err());
    // A wrong factor has a large residual.
    let mut bad = good.clone();
    bad.lu[9 * 10 + 9] += 1e-6;
    assert!(lu::scaled_residual(&a, &bad) > lu::RESIDUAL_LIMIT);

    let a: matmul::Args = args("matmul", "--n 10");
    let good = matmul::run_seq(&a);
    let mut bad = good.clone();
    flip(&mut bad.c[3 * 10 + 8]);
    assert!(good.check_same(&bad, 10).unwrap_err().contains("(3, 8)"));
}
