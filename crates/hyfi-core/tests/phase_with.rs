//! `Program::phase_with` (a phase with a per-segment `bind`), segment-local
//! reduction accumulators and `Reduction::fold`: each checked against a
//! sequential computation.

use std::collections::BTreeMap;
use std::sync::Mutex;

use hyfi_core::{Config, Control, Op, PoolArray, Program, Runtime, Span};

fn rt(procs: usize) -> Runtime {
    Runtime::new(Config::new().procs(procs).pin(false)).expect("runtime")
}

#[test]
fn bind_runs_once_per_chunk_segment_and_every_filament_sees_its_segment() {
    for (procs, pools, chunks) in [
        (1, 1, 1),
        (2, 1, 1),
        (2, 3, 1),
        (3, 2, 1),
        (1, 1, 8),
        (2, 1, 8),
        (2, 3, 4),
        (3, 2, 3),
    ] {
        let rt = Runtime::new(Config::new().procs(procs).pin(false).chunks(chunks)).unwrap();
        let (rows, cols) = (3..40, 2..9);
        let spans = Mutex::new(Vec::new());
        let seen = Mutex::new(BTreeMap::new());
        let mut prog = Program::new();
        prog.phase_with(
            PoolArray::block_rows(&rt, rows.clone(), cols.clone(), pools),
            |ctx, span: &Span| {
                spans.lock().unwrap().push(span.clone());
                (span.clone(), ctx.proc(), 0usize)
            },
            |ctx, (i, j), (span, proc, count)| {
                assert_eq!(ctx.proc(), *proc, "a segment runs on one processor");
                assert!(span.rows().contains(&i) && span.cols().contains(&j));
                *count += 1;
                *seen.lock().unwrap().entry((i, j)).or_insert(0) += 1;
            },
            |_| Control::Done,
        );
        rt.start(&mut prog).unwrap();
        drop(prog);
        let seen = seen.into_inner().unwrap();
        let want: BTreeMap<(usize, usize), i32> = rows
            .clone()
            .flat_map(|i| cols.clone().map(move |j| ((i, j), 1)))
            .collect();
        assert_eq!(seen, want, "{procs}×{pools}: every filament exactly once");
        // Blocks of rows: one segment per non-empty pool, each cut into
        // `chunks` pieces (one per row in a pool of fewer rows), covering
        // the rows without overlap.
        let mut spans = spans.into_inner().unwrap();
        spans.sort_by_key(|s| s.rows().start);
        let mut pieces = 0;
        for p in 0..procs {
            for k in 0..pools {
                let b = hyfi_core::block(hyfi_core::block(rows.clone(), procs, p), pools, k);
                pieces += b.len().min(chunks);
            }
        }
        assert_eq!(spans.len(), pieces, "{procs}×{pools} cut in {chunks}");
        let covered: Vec<usize> = spans.iter().flat_map(|s| s.rows()).collect();
        assert_eq!(covered, rows.clone().collect::<Vec<_>>());
        assert!(spans.iter().all(|s| s.cols() == cols && s.step() == 1));
    }
}

/// The spans `bind` sees for `1..10` dealt cyclically over 2 processors,
/// each pool cut into at most `chunks` chunks, in row order.
fn cyclic_spans(chunks: usize) -> Vec<Span> {
    let rt = Runtime::new(Config::new().procs(2).pin(false).chunks(chunks)).unwrap();
    let spans = Mutex::new(Vec::new());
    let mut prog = Program::new();
    prog.phase_with(
        PoolArray::cyclic(&rt, 1..10),
        |_, span| spans.lock().unwrap().push(span.clone()),
        |_, _, _| {},
        |_| Control::Done,
    );
    rt.start(&mut prog).unwrap();
    drop(prog);
    let mut spans = spans.into_inner().unwrap();
    spans.sort_by_key(|s| s.rows().start);
    spans
}

#[test]
fn strided_spans_are_tight_and_halos_are_clipped() {
    // One chunk per pool: each pool's strided segment whole.
    let spans = cyclic_spans(1);
    // Processor 0: 1, 3, 5, 7, 9; processor 1: 2, 4, 6, 8.
    assert_eq!(spans[0].rows(), 1..10);
    assert_eq!(spans[1].rows(), 2..9);
    assert_eq!((spans[0].step(), spans[0].len()), (2, 5));
    assert_eq!(spans[1].len(), 4);
    assert_eq!(spans[0].rows_with_halo(1, 10), 0..10);
    assert_eq!(spans[1].rows_with_halo(3, 10), 0..10);
    assert_eq!(spans[1].rows_with_halo(1, 100), 1..10);

    // Cut in chunks of two rows: processor 0's 1, 3, 5, 7, 9 in (1, 3),
    // (5, 7), (9); the pieces keep the stride.
    let pieces: Vec<_> = cyclic_spans(3)
        .iter()
        .map(|s| (s.rows(), s.step(), s.len()))
        .collect();
    assert_eq!(
        pieces,
        [
            (1..4, 2, 2),
            (2..5, 2, 2),
            (5..8, 2, 2),
            (6..7, 2, 1),
            (8..9, 2, 1),
            (9..10, 2, 1)
        ]
    );
}

#[test]
fn local_accumulators_fold_every_op_and_combine_into_the_copies() {
    let n = 10_000u64;
    let f = |i: usize| ((i as u64 * 7919) % 1013) as i64 - 500;
    for (procs, pools) in [(1, 1), (2, 1), (2, 4)] {
        let rt = rt(procs);
        let (sum, max, min, prod) = (
            rt.reduction(0i64),
            rt.reduction(i64::MIN),
            rt.reduction(i64::MAX),
            rt.reduction(1i64),
        );
        let mut got = (0, 0, 0, 0);
        let mut prog = Program::new();
        prog.phase_with(
            PoolArray::block(&rt, 0..n as usize, pools),
            |ctx, _| {
                (
                    sum.local(ctx, Op::Sum),
                    max.local(ctx, Op::Max),
                    min.local(ctx, Op::Min),
                    prod.local(ctx, Op::Product),
                )
            },
            |_, i, (s, mx, mn, p)| {
                s.fold(f(i));
                mx.fold(f(i));
                mn.fold(f(i));
                p.fold(if i % 1000 == 0 { -1 } else { 1 });
            },
            |post| {
                got = (
                    post.reduce(&sum, Op::Sum),
                    post.reduce(&max, Op::Max),
                    post.reduce(&min, Op::Min),
                    post.reduce(&prod, Op::Product),
                );
                Control::Done
            },
        );
        rt.start(&mut prog).unwrap();
        drop(prog);
        let all: Vec<i64> = (0..n as usize).map(f).collect();
        let want = (
            all.iter().sum::<i64>(),
            *all.iter().max().unwrap(),
            *all.iter().min().unwrap(),
            1, // ten factors of -1
        );
        assert_eq!(got, want, "{procs}×{pools}");
    }
}

#[test]
fn fold_takes_strictly_better_values_and_ignores_nan() {
    let rt = rt(1);
    let m = rt.reduction(f64::NEG_INFINITY);
    let lo = rt.reduction(f64::INFINITY);
    let vals = [3.0, f64::NAN, 7.5, -2.0, 7.5, f64::NAN, 1.0];
    let mut got = (0.0, 0.0);
    let mut prog = Program::new();
    prog.phase(
        PoolArray::block(&rt, 0..vals.len(), 1),
        |ctx, i| {
            m.fold(ctx, Op::Max, vals[i]);
            lo.fold(ctx, Op::Min, vals[i]);
        },
        |post| {
            got = (post.reduce(&m, Op::Max), post.reduce(&lo, Op::Min));
            Control::Done
        },
    );
    rt.start(&mut prog).unwrap();
    drop(prog);
    assert_eq!(got, (7.5, -2.0));
    assert_eq!(Op::Max.fold(1.0, f64::NAN), 1.0);
    assert_eq!(Op::Min.fold(1.0, f64::NAN), 1.0);
    assert_eq!(Op::Sum.fold(1.5, 2.0), 3.5);
}
