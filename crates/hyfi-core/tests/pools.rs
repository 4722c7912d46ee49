//! 3-D pools and strided (red-black) 2-D pools, each checked bit for bit
//! against the sequential loop it replaces, on several processor and pool
//! counts.

use hyfi_core::{Config, Control, Op, PoolArray, Program, Runtime, SharedMatrix, SharedVec};

fn rt(procs: usize) -> Runtime {
    Runtime::new(Config::new().procs(procs).pin(false)).unwrap()
}

/// The initial cube: hot faces at i = 0 and k = n - 1, an irregular interior.
fn init3(n: usize) -> impl Fn(usize) -> f64 {
    move |x| {
        let (i, j, k) = (x / (n * n), x / n % n, x % n);
        if i == 0 || k == n - 1 {
            1.0
        } else if j == 0 || i == n - 1 || j == n - 1 || k == 0 {
            0.0
        } else {
            ((i * 31 + j * 17 + k * 7) % 11) as f64 / 11.0
        }
    }
}

/// One 7-point Jacobi step at (i, j, k) of an n³ cube.
#[inline(always)]
fn jacobi7(old: impl Fn(usize) -> f64, n: usize, i: usize, j: usize, k: usize) -> f64 {
    let x = (i * n + j) * n + k;
    (old(x - n * n) + old(x + n * n) + old(x - n) + old(x + n) + old(x - 1) + old(x + 1)) / 6.0
}

/// `sweeps` 7-point Jacobi steps, sequentially: the grid and each step's maxdiff.
fn jacobi3_seq(n: usize, sweeps: usize) -> (Vec<f64>, Vec<f64>) {
    let mut old: Vec<f64> = (0..n * n * n).map(init3(n)).collect();
    let mut new = old.clone();
    let mut diffs = Vec::new();
    for _ in 0..sweeps {
        let mut m = 0.0f64;
        for i in 1..n - 1 {
            for j in 1..n - 1 {
                for k in 1..n - 1 {
                    let v = jacobi7(|x| old[x], n, i, j, k);
                    let x = (i * n + j) * n + k;
                    m = m.max((v - old[x]).abs());
                    new[x] = v;
                }
            }
        }
        diffs.push(m);
        std::mem::swap(&mut old, &mut new);
    }
    (old, diffs)
}

#[test]
fn a_3d_jacobi_matches_the_sequential_loop() {
    let (n, sweeps) = (10, 6);
    let (want, want_diffs) = jacobi3_seq(n, sweeps);
    for procs in [1, 2, 3] {
        for per_proc in [1, 2, 3] {
            let rt = rt(procs);
            let grids = [
                SharedVec::from_fn(n * n * n, init3(n)),
                SharedVec::from_fn(n * n * n, init3(n)),
            ];
            let maxdiff = rt.reduction(0.0f64);
            let mut diffs = Vec::new();
            let pools = PoolArray::block_planes(&rt, 1..n - 1, 1..n - 1, 1..n - 1, per_proc);
            assert_eq!(pools.len(), (n - 2).pow(3));
            let mut prog = Program::new();
            prog.phase(
                pools,
                |ctx, (i, j, k)| {
                    let s = ctx.iteration() as usize;
                    let (old, new) = (&grids[s % 2], &grids[(s + 1) % 2]);
                    let v = jacobi7(|x| old.get(x), n, i, j, k);
                    let x = (i * n + j) * n + k;
                    let d = (v - old.get(x)).abs();
                    new.set(x, v);
                    maxdiff.update(ctx, |m| m.max(d));
                },
                |post| {
                    diffs.push(post.reduce(&maxdiff, Op::Max));
                    post.set(&maxdiff, 0.0);
                    if diffs.len() == sweeps {
                        Control::Done
                    } else {
                        Control::Continue
                    }
                },
            );
            rt.start(&mut prog).unwrap();
            drop(prog);
            assert_eq!(
                grids[sweeps % 2].to_vec(),
                want,
                "{procs}p × {per_proc} pools"
            );
            assert_eq!(diffs, want_diffs);
        }
    }
}

#[test]
fn a_3d_jacobi_with_phase_with_sees_whole_boxes() {
    let (n, sweeps) = (9, 4);
    let (want, _) = jacobi3_seq(n, sweeps);
    for (procs, per_proc) in [(1, 1), (2, 2), (3, 1)] {
        let rt = rt(procs);
        let grids = [
            SharedVec::from_fn(n * n * n, init3(n)),
            SharedVec::from_fn(n * n * n, init3(n)),
        ];
        let maxdiff = rt.reduction(0.0f64);
        let mut done = 0;
        let mut prog = Program::new();
        prog.phase_with(
            PoolArray::block_planes(&rt, 1..n - 1, 1..n - 1, 1..n - 1, per_proc),
            |ctx, span| {
                // A whole block of planes: every j and k of the interior.
                assert_eq!((span.cols(), span.depth()), (1..n - 1, 1..n - 1));
                assert_eq!(span.len(), span.rows().len() * (n - 2) * (n - 2));
                maxdiff.local(ctx, Op::Max)
            },
            |ctx, (i, j, k), max| {
                let s = ctx.iteration() as usize;
                let (old, new) = (&grids[s % 2], &grids[(s + 1) % 2]);
                let v = jacobi7(|x| old.get(x), n, i, j, k);
                let x = (i * n + j) * n + k;
                max.fold((v - old.get(x)).abs());
                new.set(x, v);
            },
            |post| {
                post.reduce(&maxdiff, Op::Max);
                post.set(&maxdiff, 0.0);
                done += 1;
                if done == sweeps {
                    Control::Done
                } else {
                    Control::Continue
                }
            },
        );
        rt.start(&mut prog).unwrap();
        drop(prog);
        assert_eq!(
            grids[sweeps % 2].to_vec(),
            want,
            "{procs}p × {per_proc} pools"
        );
    }
}

const OMEGA: f64 = 1.5;

fn init2(n: usize) -> impl Fn(usize, usize) -> f64 {
    move |i, j| {
        if i == 0 || j == n - 1 {
            1.0
        } else if j == 0 || i == n - 1 {
            0.0
        } else {
            ((i * 13 + j * 5) % 7) as f64 / 7.0
        }
    }
}

#[inline(always)]
fn sor(u: impl Fn(usize, usize) -> f64, i: usize, j: usize) -> f64 {
    let gs = (u(i - 1, j) + u(i + 1, j) + u(i, j - 1) + u(i, j + 1)) * 0.25;
    (1.0 - OMEGA) * u(i, j) + OMEGA * gs
}

/// `sweeps` red-black SOR sweeps, sequentially (red points, then black).
fn red_black_seq(n: usize, sweeps: usize) -> Vec<f64> {
    let init = init2(n);
    let mut u: Vec<f64> = (0..n * n).map(|x| init(x / n, x % n)).collect();
    for _ in 0..sweeps {
        for colour in 0..2 {
            for i in 1..n - 1 {
                for j in 1..n - 1 {
                    if (i + j) % 2 == colour {
                        u[i * n + j] = sor(|a, b| u[a * n + b], i, j);
                    }
                }
            }
        }
    }
    u
}

#[test]
fn red_black_sor_matches_the_sequential_sweep_bit_for_bit() {
    let (n, sweeps) = (20, 7);
    let want = red_black_seq(n, sweeps);
    for procs in [1, 2] {
        for per_proc in [1, 2] {
            let rt = rt(procs);
            let u = SharedMatrix::from_fn(n, n, init2(n));
            let red = PoolArray::block_rows_red_black(&rt, 1..n - 1, 1..n - 1, 0, per_proc);
            let black = PoolArray::block_rows_red_black(&rt, 1..n - 1, 1..n - 1, 1, per_proc);
            assert_eq!(red.len() + black.len(), (n - 2) * (n - 2));
            // Coalesced: one segment per row and pool, not one per point.
            let mut segs = 0;
            for (p, k) in (0..procs).flat_map(|p| (0..per_proc).map(move |k| (p, k))) {
                segs += red.clone().pool_k(p, k).segments();
            }
            assert_eq!(segs, n - 2);
            let mut sweeps_done = 0;
            let mut prog = Program::new();
            let update = |_: &hyfi_core::Ctx, (i, j): (usize, usize)| {
                u.set(i, j, sor(|a, b| u.get(a, b), i, j));
            };
            prog.phase(red, update, |_| Control::Continue);
            prog.phase(black, update, |_| {
                sweeps_done += 1;
                if sweeps_done == sweeps {
                    Control::Done
                } else {
                    Control::Continue
                }
            });
            rt.start(&mut prog).unwrap();
            drop(prog);
            assert_eq!(u.to_vec(), want, "{procs}p × {per_proc} pools");
        }
    }
}

#[test]
fn red_black_phase_with_spans_are_rows_of_one_colour() {
    let n = 12;
    let rt = rt(2);
    let u = SharedMatrix::from_fn(n, n, init2(n));
    let want = red_black_seq(n, 1);
    let mut prog = Program::new();
    for colour in 0..2 {
        prog.phase_with(
            PoolArray::block_rows_red_black(&rt, 1..n - 1, 1..n - 1, colour, 1),
            move |_, span| {
                let i = span.rows().start;
                assert_eq!((span.rows().len(), span.col_step()), (1, 2));
                assert_eq!((i + span.cols().start) % 2, colour);
                assert_eq!(span.len(), (n - 2) / 2);
                i
            },
            |_, (i, j), row| {
                assert_eq!(i, *row);
                u.set(i, j, sor(|a, b| u.get(a, b), i, j));
            },
            move |_| {
                if colour == 1 {
                    Control::Done
                } else {
                    Control::Continue
                }
            },
        );
    }
    rt.start(&mut prog).unwrap();
    drop(prog);
    assert_eq!(u.to_vec(), want);
}
