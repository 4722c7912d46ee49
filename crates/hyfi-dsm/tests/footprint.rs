//! Declared footprints (`Program::phase_with` with read and write views):
//! results against a sequential computation, and every error the access
//! path adds — a read or write outside the footprint, a write to an array
//! read-only in the phase, a read view of an array written in it, rows out
//! of bounds, a view kept past its phase — each a clear message, never a
//! wrong answer. Across nodes the same path is exercised by the examples'
//! multi-process tests (tests/iterative_examples.rs runs jacobi on 1×1,
//! 1×2, 2×1 and 2×2).

use std::process::Command;

use hyfi_core::{Config, Control, Error, Op, PoolArray, Program, Runtime};
use hyfi_dsm::{Dsm, DsmMatrix, Placement};

fn rt(procs: usize) -> Runtime {
    Runtime::new(Config::new().procs(procs).pin(false)).expect("runtime")
}

fn init(i: usize, j: usize) -> f64 {
    ((i * 31 + j * 17) % 101) as f64 / 7.0
}

/// `sweeps` Jacobi sweeps on plain vectors; returns the grid and the last
/// sweep's largest change.
fn jacobi_seq(n: usize, sweeps: usize) -> (Vec<f64>, f64) {
    let mut old: Vec<f64> = (0..n * n).map(|k| init(k / n, k % n)).collect();
    let mut new = old.clone();
    let mut m = 0.0;
    for _ in 0..sweeps {
        m = 0.0f64;
        for i in 1..n - 1 {
            for j in 1..n - 1 {
                let v = (old[(i - 1) * n + j]
                    + old[(i + 1) * n + j]
                    + old[i * n + j - 1]
                    + old[i * n + j + 1])
                    * 0.25;
                new[i * n + j] = v;
                let d = (v - old[i * n + j]).abs();
                if d > m {
                    m = d;
                }
            }
        }
        std::mem::swap(&mut old, &mut new);
    }
    (old, m)
}

/// The same sweeps with one filament per point (or per row) through read
/// and write views, on `procs` processors with `pools` pools each.
/// A filament's grain in [`jacobi_views`].
#[derive(Clone, Copy, Debug, PartialEq)]
enum Grain {
    /// One filament per point.
    Point,
    /// One per row, `set` per column.
    Row,
    /// One per row, the row written by `RowWriter::fill`.
    RowFill,
}

fn jacobi_views(
    procs: usize,
    pools: usize,
    grain: Grain,
    n: usize,
    sweeps: usize,
) -> (Vec<f64>, f64) {
    let rt = rt(procs);
    let dsm = Dsm::new(&rt).unwrap();
    let grid = || {
        dsm.matrix::<f64>(n, n)
            .placement(Placement::BlockRows(1..n - 1))
            .from_fn(init)
            .unwrap()
    };
    let grids = [grid(), grid()];
    let maxdiff = rt.reduction(0.0f64);
    let (mut done, mut last) = (0, 0.0);
    let bind = |ctx: &hyfi_core::Ctx, span: &hyfi_core::Span| {
        let k = ctx.iteration() as usize;
        (
            grids[k % 2].read_rows(ctx, span.rows_with_halo(1, n)),
            grids[(k + 1) % 2].write_rows(ctx, span.rows()),
            maxdiff.local(ctx, Op::Max),
        )
    };
    let post = |post: &mut hyfi_core::PostPhase<'_>| {
        last = post.reduce(&maxdiff, Op::Max);
        post.set(&maxdiff, 0.0);
        done += 1;
        if done == sweeps {
            Control::Done
        } else {
            Control::Continue
        }
    };
    let mut prog = Program::new();
    if grain == Grain::RowFill {
        prog.phase_with(
            PoolArray::block(&rt, 1..n - 1, pools),
            bind,
            |_, i, (old, new, m)| {
                let (up, mid, down) = (old.row(i - 1), old.row(i), old.row(i + 1));
                let mut row_max = 0.0f64;
                new.row_mut(i).fill(1..n - 1, |j| {
                    let v = (up[j] + down[j] + mid[j - 1] + mid[j + 1]) * 0.25;
                    row_max = row_max.max((v - mid[j]).abs());
                    v
                });
                m.fold(row_max);
            },
            post,
        );
    } else if grain == Grain::Row {
        prog.phase_with(
            PoolArray::block(&rt, 1..n - 1, pools),
            bind,
            |_, i, (old, new, m)| {
                let (up, mid, down) = (old.row(i - 1), old.row(i), old.row(i + 1));
                let out = new.row_mut(i);
                for j in 1..n - 1 {
                    let v = (up[j] + down[j] + mid[j - 1] + mid[j + 1]) * 0.25;
                    out.set(j, v);
                    m.fold((v - mid[j]).abs());
                }
            },
            post,
        );
    } else {
        prog.phase_with(
            PoolArray::block_rows(&rt, 1..n - 1, 1..n - 1, pools),
            bind,
            |_, (i, j), (old, new, m)| {
                let v =
                    (old[(i - 1, j)] + old[(i + 1, j)] + old[(i, j - 1)] + old[(i, j + 1)]) * 0.25;
                new.set(i, j, v);
                m.fold((v - old.get(i, j)).abs());
            },
            post,
        );
    }
    rt.start(&mut prog).unwrap();
    drop(prog);
    (grids[sweeps % 2].to_vec(), last)
}

#[test]
fn views_give_the_sequential_answer_bit_for_bit_on_every_shape() {
    let (n, sweeps) = (70, 9);
    let (want, m) = jacobi_seq(n, sweeps);
    for (procs, pools) in [(1, 1), (2, 1), (2, 3), (3, 2)] {
        for grain in [Grain::Point, Grain::Row, Grain::RowFill] {
            let (got, gm) = jacobi_views(procs, pools, grain, n, sweeps);
            let bad = got
                .iter()
                .zip(&want)
                .position(|(a, b)| a.to_bits() != b.to_bits());
            assert_eq!(
                bad, None,
                "{procs}×{pools} pools, {grain:?}: first differing point"
            );
            assert_eq!(
                gm.to_bits(),
                m.to_bits(),
                "maxdiff, {procs}×{pools}, {grain:?}"
            );
        }
    }
}

#[test]
fn vector_views_and_strided_pools_cover_exactly_their_filaments() {
    let rt = rt(2);
    let dsm = Dsm::new(&rt).unwrap();
    let n = 5000;
    let src = dsm
        .vec::<u64>(n)
        .from_fn(|i| (i * i) as u64 % 1009)
        .unwrap();
    let dst = dsm.vec::<u64>(n).zeroed().unwrap();
    let total = rt.reduction(0u64);
    let mut sum = 0;
    let mut prog = Program::new();
    prog.phase_with(
        // Cyclic: each processor's pool is one strided segment.
        PoolArray::cyclic(&rt, 0..n),
        |ctx, span| {
            // Tight: the last row of the span is a filament of it.
            assert_eq!((span.rows().end - 1 - span.rows().start) % span.step(), 0);
            (
                src.read_range(ctx, span.rows()),
                dst.write_range(ctx, span.rows()),
                total.local(ctx, Op::Sum),
            )
        },
        |_, i, (src, dst, total)| {
            dst.set(i, src[i] * 3);
            total.fold(src.get(i));
        },
        |post| {
            sum = post.reduce(&total, Op::Sum);
            Control::Done
        },
    );
    rt.start(&mut prog).unwrap();
    drop(prog);
    let want: Vec<u64> = (0..n).map(|i| (i * i) as u64 % 1009 * 3).collect();
    assert_eq!(dst.to_vec(), want);
    assert_eq!(sum, (0..n).map(|i| (i * i) as u64 % 1009).sum::<u64>());
}

/// Runs one phase of `filament` over rows 1..9 of a 10×10 matrix `m` with
/// the views `bind` takes, returning the run's error message.
fn failure(
    bind: impl Fn(&hyfi_core::Ctx, &hyfi_core::Span, &DsmMatrix<f64>, &DsmMatrix<f64>) + Sync,
) -> String {
    let rt = rt(2);
    let dsm = Dsm::new(&rt).unwrap();
    let a = dsm.matrix::<f64>(10, 10).from_fn(init).unwrap();
    let b = dsm.matrix::<f64>(10, 10).zeroed().unwrap();
    let mut prog = Program::new();
    prog.phase_with(
        PoolArray::block(&rt, 1..9, 1),
        |ctx, span| bind(ctx, span, &a, &b),
        |_, _, _| {},
        |_| Control::Done,
    );
    match rt.start(&mut prog) {
        Err(Error::FilamentPanic {
            message, during, ..
        }) => {
            assert!(during.contains("phase 0"), "{during}");
            message
        }
        other => panic!("expected a filament panic, got {other:?}"),
    }
}

#[test]
fn a_read_outside_the_footprint_names_the_array_the_index_and_the_footprint() {
    let msg = failure(|ctx, span, a, _| {
        let v = a.read_rows(ctx, span.rows());
        // One row above the segment: no halo was declared.
        let _ = v[(span.rows().start - 1, 3)];
    });
    assert!(msg.contains("outside the read view's footprint"), "{msg}");
    assert!(msg.contains("shared array #0"), "{msg}");
    assert!(msg.contains("rows "), "{msg}");
    assert!(msg.contains("widen the view"), "{msg}");
}

#[test]
fn a_write_outside_the_footprint_and_a_column_out_of_range_are_errors() {
    let msg = failure(|ctx, span, _, b| {
        let w = b.write_rows(ctx, span.rows());
        w.set(span.rows().end, 0, 1.0);
    });
    assert!(msg.contains("outside the write view's footprint"), "{msg}");
    assert!(msg.contains("shared array #1"), "{msg}");
    let msg = failure(|ctx, span, _, b| {
        let w = b.write_rows(ctx, span.rows());
        w.row_mut(span.rows().start).set(10, 1.0);
    });
    assert!(msg.contains("columns 0..10"), "{msg}");
    // A fill that runs past the row's end names the first column past it.
    let msg = failure(|ctx, span, _, b| {
        let w = b.write_rows(ctx, span.rows());
        w.row_mut(span.rows().start).fill(4..11, |j| j as f64);
    });
    assert!(msg.contains("columns 0..10"), "{msg}");
    assert!(msg.contains(", 10)"), "{msg}");
    // One that starts past it names its first column.
    let msg = failure(|ctx, span, _, b| {
        let w = b.write_rows(ctx, span.rows());
        w.row_mut(span.rows().start).fill(12..15, |j| j as f64);
    });
    assert!(msg.contains("columns 0..10"), "{msg}");
    assert!(msg.contains(", 12)"), "{msg}");
    let msg = failure(|ctx, span, a, _| {
        let _ = a.read_rows(ctx, span.rows()).row(0);
    });
    assert!(msg.contains("outside the read view's footprint"), "{msg}");
}

#[test]
fn writing_an_array_read_only_in_the_phase_is_an_error_whichever_comes_first() {
    // Read view first, then a checked write.
    let msg = failure(|ctx, span, a, _| {
        let _v = a.read_rows(ctx, span.rows());
        a.set(span.rows().start, 0, 1.0);
    });
    assert!(msg.contains("read-only in this phase"), "{msg}");
    assert!(msg.contains("shared array #0"), "{msg}");
    // A write view of a read-only array.
    let msg = failure(|ctx, span, a, _| {
        let _v = a.read_rows(ctx, span.rows());
        let _w = a.write_rows(ctx, span.rows());
    });
    assert!(msg.contains("read-only in this phase"), "{msg}");
    // Written first, then a read view.
    let msg = failure(|ctx, span, _, b| {
        b.set(span.rows().start, 1, 2.0);
        let _v = b.read_rows(ctx, span.rows());
    });
    assert!(msg.contains("in a phase that writes it"), "{msg}");
}

#[test]
fn rows_out_of_bounds_are_an_error() {
    let msg = failure(|ctx, _, a, _| {
        let _ = a.read_rows(ctx, 5..11);
    });
    assert!(msg.contains("out of bounds"), "{msg}");
    assert!(msg.contains("10 rows"), "{msg}");
}

#[test]
fn modes_last_one_epoch_post_phase_and_the_next_phase_may_write() {
    let rt = rt(2);
    let dsm = Dsm::new(&rt).unwrap();
    let n = 16;
    let a = dsm.matrix::<f64>(n, n).from_fn(init).unwrap();
    a.set(0, 0, 5.0); // the main thread, before the program: another epoch
    let b = dsm.matrix::<f64>(n, n).zeroed().unwrap();
    let mut rounds = 0;
    let mut prog = Program::new();
    // Phase 0 reads `a` as read-only and writes b = 2a.
    prog.phase_with(
        PoolArray::block(&rt, 0..n, 2),
        |ctx, span| {
            (
                a.read_rows(ctx, span.rows()),
                b.write_rows(ctx, span.rows()),
            )
        },
        |_, i, (a, b)| {
            for (j, &x) in a.row(i).iter().enumerate() {
                b.set(i, j, 2.0 * x);
            }
        },
        |post| {
            // Post-phase code may write what the phase read.
            let _ = post.iteration();
            a.set(0, 1, 7.0);
            Control::Continue
        },
    );
    // Phase 1 writes `a` (a = b + 1) with the checked path.
    prog.phase(
        PoolArray::block(&rt, 0..n, 1),
        |_, i| {
            for j in 0..n {
                a.set(i, j, b.get(i, j) + 1.0);
            }
        },
        |_| {
            rounds += 1;
            if rounds == 3 {
                Control::Done
            } else {
                Control::Continue
            }
        },
    );
    rt.start(&mut prog).unwrap();
    drop(prog);
    let mut want: Vec<f64> = (0..n * n).map(|k| init(k / n, k % n)).collect();
    want[0] = 5.0;
    for _ in 0..3 {
        let b: Vec<f64> = want.iter().map(|x| 2.0 * x).collect();
        want = b.iter().map(|x| x + 1.0).collect();
    }
    assert_eq!(a.to_vec(), want);
}

/// Child mode of the next test: keeps a view in a thread-local past its
/// phase. The runtime must stop the process at the phase's end, before any
/// later phase could write what the view reads.
fn leak_a_view_child() {
    use std::cell::RefCell;
    thread_local! {
        static KEPT: RefCell<Option<hyfi_dsm::ReadRows<'static, f64>>> = const { RefCell::new(None) };
    }
    let rt: &'static Runtime = Box::leak(Box::new(rt(1)));
    let dsm: &'static Dsm = Box::leak(Box::new(Dsm::new(rt).unwrap()));
    let a: &'static DsmMatrix<f64> = Box::leak(Box::new(dsm.matrix::<f64>(8, 8).zeroed().unwrap()));
    let mut prog = Program::new();
    prog.phase_with(
        PoolArray::block(rt, 0..8, 1),
        |ctx, span| Some(a.read_rows(ctx, span.rows())),
        |_, _, v| {
            if let Some(v) = v.take() {
                KEPT.with(|k| *k.borrow_mut() = Some(v));
            }
        },
        |_| Control::Done,
    );
    let _ = rt.start(&mut prog);
    println!("not stopped");
}

#[test]
fn a_view_kept_past_its_phase_stops_the_process_with_a_message() {
    if std::env::var_os("HYFI_TEST_LEAK_VIEW").is_some() {
        leak_a_view_child();
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_view_kept_past_its_phase_stops_the_process_with_a_message",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("HYFI_TEST_LEAK_VIEW", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "child exited successfully: {stdout}");
    assert!(!stdout.contains("not stopped"), "{stdout}");
    assert!(stderr.contains("outlived the phase"), "{stderr}");
}
