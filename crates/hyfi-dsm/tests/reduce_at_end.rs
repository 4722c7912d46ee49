//! Reductions a phase reduces at its end (`Program::reduce_at_end`, and
//! `reduce_exact_at_end` for an exact sum) give
//! the bits post-phase code's `reduce` gives, on every node count, with and
//! without the DSM's release carrying them (on two nodes in the `REL`s, on
//! more in the all-reduce of the counts; without a DSM in the all-reduce
//! that replaces the barrier); `reduce` after one returns it instead of
//! reducing it again; and nodes that name different reductions end with an
//! error that says so, not a hang or a wrong answer.

mod common;
use common::{larger, on_nodes, Top, NO_TOP};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use hyfi_core::layer::RuntimeExt;
use hyfi_core::link::InProcess;
use hyfi_core::{Config, Control, NodeLink, Op, PoolArray, Program, Runtime};
use hyfi_dsm::{Dsm, Placement};

const N: usize = 2000;
const SWEEPS: u64 = 3;

/// A value whose sum depends on the order it is added in (large and small
/// magnitudes mixed), so a combining order other than `reduce`'s shows.
fn value(i: usize, sweep: u64) -> f64 {
    let h = (i as u64 ^ sweep.wrapping_mul(0x9e37_79b9)).wrapping_mul(0x2545_f491_4f6c_dd1d);
    let m = (h >> 11) as f64 / (1u64 << 53) as f64;
    match h % 3 {
        0 => m * 1e16,
        1 => -m * 1e15,
        _ => m,
    }
}

/// Per sweep: the sum (its bits), the argmax, what `reduce` returned
/// after it (the same, if the phase's end reduced them), and the exact
/// sum (its bits).
type Sweep = (u64, Top, u64, u64);

/// One node: a phase over `N` filaments in 3 pools per processor, run
/// `SWEEPS` times, that folds `value` into a sum and an argmax and (with a
/// DSM) writes its share of a shared vector, so the release has pages
/// to move. `at_end`: the phase names both reductions; otherwise
/// post-phase code reduces them.
fn node(link: Arc<InProcess>, dsm: bool, at_end: bool) -> Result<Vec<Sweep>, String> {
    let rt = Runtime::with_link(
        Config::new().procs(2).pin(false),
        link.clone() as Arc<dyn NodeLink>,
    )
    .map_err(|e| e.to_string())?;
    let dsm = if dsm {
        Some(Dsm::with_base(&rt, None).map_err(|e| e.to_string())?)
    } else {
        None
    };
    let v = match &dsm {
        Some(d) => Some(
            d.vec::<f64>(N)
                .placement(Placement::Block)
                .zeroed()
                .map_err(|e| e.to_string())?,
        ),
        None => None,
    };
    let sum = rt.reduction(0.0f64);
    let best = rt.reduction(NO_TOP);
    let exact = rt.exact_sum();
    let out = Mutex::new(Vec::new());
    let mut prog = Program::new();
    prog.phase(
        PoolArray::block(&rt, 0..N, 3),
        |ctx, i| {
            let x = value(i, ctx.iteration());
            sum.update(ctx, |s| s + x);
            exact.fold(ctx, x);
            best.update(ctx, |b| {
                larger(
                    b,
                    Top {
                        value: x,
                        index: i as u64,
                    },
                )
            });
            if let Some(v) = &v {
                // The nodes' blocks of filaments do not end at page
                // boundaries: pages with two writers, so the release moves
                // diffs and notices.
                v.set(i, x);
            }
        },
        |post| {
            let (s, b) = if at_end {
                (post.get(&sum), post.get(&best))
            } else {
                (post.reduce(&sum, Op::Sum), post.reduce_with(&best, larger))
            };
            // Reducing again after the phase's end did: the same value,
            // not the sum of every copy of the result.
            let again = if at_end {
                post.reduce(&sum, Op::Sum)
            } else {
                s
            };
            let e = post.reduce_exact(&exact);
            out.lock()
                .unwrap()
                .push((s.to_bits(), b, again.to_bits(), e.to_bits()));
            post.set(&sum, 0.0);
            post.set_exact(&exact, 0.0);
            post.set(&best, NO_TOP);
            if post.iteration() + 1 == SWEEPS {
                Control::Done
            } else {
                Control::Continue
            }
        },
    );
    if at_end {
        prog.reduce_at_end(&sum, Op::Sum)
            .reduce_at_end_with(&best, larger)
            .reduce_exact_at_end(&exact);
    }
    rt.start(&mut prog).map_err(|e| e.to_string())?;
    drop(prog);
    if let Some(v) = &v {
        // Every node's writes reached every node through the releases.
        let want: Vec<f64> = (0..N).map(|i| value(i, SWEEPS - 1)).collect();
        let got = v.to_vec();
        if let Some(i) = (0..N).find(|&i| got[i].to_bits() != want[i].to_bits()) {
            return Err(format!(
                "node {}{}: the shared vector differs at {i}: {} against {}",
                rt.node(),
                if at_end { " (at end)" } else { "" },
                got[i],
                want[i]
            ));
        }
    }
    Ok(out.into_inner().unwrap())
}

fn same_bits(nodes: usize, dsm: bool) {
    let run = |at_end: bool| -> Vec<Vec<Sweep>> {
        on_nodes(nodes, move |l| node(l, dsm, at_end))
            .into_iter()
            .map(|r| r.unwrap_or_else(|e| panic!("{nodes} nodes, dsm {dsm}: {e}")))
            .collect()
    };
    let posted = run(false);
    let folded = run(true);
    for (me, (f, p)) in folded.iter().zip(&posted).enumerate() {
        assert_eq!(f.len(), SWEEPS as usize);
        assert_eq!(f, p, "node {me} of {nodes}, dsm {dsm}");
        for (k, (s, b, again, e)) in f.iter().enumerate() {
            // The exact sum against a sequential one (correctly rounded:
            // the same bits in any order).
            let mut acc = hyfi_core::ExactAccumulator::default();
            (0..N).for_each(|i| acc.add(value(i, k as u64)));
            assert_eq!(*e, acc.value().to_bits(), "node {me} of {nodes}, sweep {k}");
            assert_eq!(s, again, "node {me} of {nodes}: reduce after the end");
            // The argmax against a sequential scan (a sum's bits depend on
            // the order, so it is checked against `reduce` above).
            let seq = (0..N).fold(NO_TOP, |acc, i| {
                larger(
                    acc,
                    Top {
                        value: value(i, k as u64),
                        index: i as u64,
                    },
                )
            });
            assert_eq!(*b, seq, "node {me} of {nodes}, sweep {k}");
        }
    }
}

#[test]
fn reductions_at_a_phase_end_match_post_phase_reduce_with_the_dsm() {
    for nodes in [1, 2, 3, 4, 8] {
        same_bits(nodes, true);
    }
}

#[test]
fn reductions_at_a_phase_end_match_post_phase_reduce_without_a_dsm() {
    for nodes in [1, 2, 3, 5] {
        same_bits(nodes, false);
    }
}

/// One node names a reduction at the phase's end and the others do not:
/// every node ends with an error, none hangs or returns a value.
fn mismatch(nodes: usize, dsm: bool) -> Vec<String> {
    let started = AtomicUsize::new(0);
    let started = Arc::new(started);
    on_nodes(nodes, move |l: Arc<InProcess>| {
        let me = l.my_node();
        started.fetch_add(1, Relaxed);
        let rt = Runtime::with_link(
            Config::new().procs(1).pin(false),
            l.clone() as Arc<dyn NodeLink>,
        )
        .expect("runtime");
        let _dsm = dsm.then(|| Dsm::with_base(&rt, None).expect("dsm"));
        let sum = rt.reduction(0u64);
        let mut prog = Program::new();
        prog.phase(
            PoolArray::block(&rt, 0..8, 1),
            |ctx, i| sum.update(ctx, |s| s + i as u64),
            |_| Control::Done,
        );
        if me == 0 {
            prog.reduce_at_end(&sum, Op::Sum);
        }
        match rt.start(&mut prog) {
            Ok(()) => panic!("node {me} of {nodes} (dsm {dsm}) finished a mismatched phase"),
            Err(e) => e.to_string(),
        }
    })
}

#[test]
fn nodes_that_name_different_reductions_end_with_an_error() {
    let on_two = mismatch(2, true);
    // The release names the cause on the node that found it; the other
    // ends with the abort that carries it.
    assert!(
        on_two.iter().all(|e| e.contains("reduce_at_end")),
        "{on_two:?}"
    );
    for dsm in [true, false] {
        let errs = mismatch(3, dsm);
        assert!(
            errs.iter().all(|e| !e.is_empty()),
            "3 nodes, dsm {dsm}: {errs:?}"
        );
    }
}
