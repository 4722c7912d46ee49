//! Rows lent as `&mut [T]` (`WriteRows::with_row`, `WriteRange::with_slice`):
//! the shared row itself in a plain-store view, a copy otherwise, the same
//! results either way, and every other path to a lent row refused.
//!
//! Results are checked against sequential computations and the DSM's
//! counters, never timings.

mod common;
use common::{on_nodes, one_per_node, start, until, wait_for};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use hyfi_core::link::InProcess;
use hyfi_core::{Config, Control, PoolArray, Program, Runtime};
use hyfi_dsm::{Dsm, DsmMatrix, DsmStats, DsmVec, Placement, PAGE};

/// The graph's distances: 0 on the diagonal, an edge of weight 1–99 for
/// one pair in five, infinity elsewhere.
fn graph(n: usize) -> Vec<f64> {
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    let mut d = vec![f64::INFINITY; n * n];
    for i in 0..n {
        for j in 0..n {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            if i == j {
                d[i * n + j] = 0.0;
            } else if s % 5 == 0 {
                d[i * n + j] = 1.0 + (s >> 11) as f64 / (1u64 << 53) as f64 * 98.0;
            }
        }
    }
    d
}

/// Floyd–Warshall on a plain vector: the loop a user writes without hyfi.
fn floyd_sequential(n: usize) -> Vec<f64> {
    let mut d = graph(n);
    let mut rk = vec![0.0; n];
    for k in 0..n {
        rk.copy_from_slice(&d[k * n..(k + 1) * n]);
        for row in d.chunks_exact_mut(n) {
            let dik = row[k];
            for (x, &y) in row.iter_mut().zip(&rk) {
                *x = x.min(dik + y);
            }
        }
    }
    d
}

/// Floyd–Warshall on one node of `link`'s job: one phase per `k`, one
/// filament per row, each row lent as a slice; row `k + 1` broadcast
/// after step `k` and copied by every node.
fn floyd_node(link: Arc<InProcess>, n: usize, procs: usize) -> (Vec<f64>, DsmStats) {
    let (rt, dsm) = start(&link, procs).unwrap();
    let g = graph(n);
    let d = dsm
        .matrix::<f64>(n, n)
        .placement(Placement::BlockRows(0..n))
        .from_fn(|i, j| g[i * n + j])
        .unwrap();
    let rowk = RwLock::new(g[..n].to_vec());
    let first_lends = AtomicU64::new(0);
    let mut prog = Program::new();
    prog.phase_with(
        PoolArray::block(&rt, 0..n, 1),
        |ctx, span| {
            (
                ctx.iteration() as usize,
                d.write_rows(ctx, span.rows()),
                rowk.read().unwrap(),
            )
        },
        |_ctx, i, (k, w, rk)| {
            if *k < 2 {
                first_lends.fetch_add(1, Ordering::Relaxed);
            }
            let rk: &[f64] = rk;
            w.with_row(i, |row| {
                let dik = row[*k];
                for (x, &y) in row.iter_mut().zip(rk) {
                    *x = x.min(dik + y);
                }
            });
        },
        |post| {
            let next = post.iteration() as usize + 1;
            if next == n {
                return Control::Done;
            }
            d.broadcast_rows(post, next..next + 1);
            d.read_row(next, &mut rowk.write().unwrap());
            Control::Continue
        },
    );
    rt.start(&mut prog).unwrap();
    drop(prog);
    let st = dsm.stats();
    // The phase's first two executions lend copies; every later one, whose
    // views are the same disjoint ones, the rows themselves.
    let first = first_lends.load(Ordering::Relaxed);
    assert_eq!(st.total.rows_lent_by_copy, first, "{st}");
    (d.to_vec(), st)
}

#[test]
fn floyd_warshall_through_lent_rows_gives_the_sequential_bits_on_every_configuration() {
    let n = 40;
    let want = floyd_sequential(n);
    for (nodes, procs) in [(1, 1), (1, 2), (2, 1), (2, 2), (3, 1)] {
        let out = on_nodes(nodes, move |l| floyd_node(l, n, procs));
        for (node, (got, stats)) in out.iter().enumerate() {
            let same = got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{nodes}x{procs}, node {node}: distances differ\n{stats}"
            );
            let t = &stats.total;
            assert!(t.plain_views > 0, "{nodes}x{procs}, node {node}: {t}");
            assert!(t.atomic_views > 0, "{nodes}x{procs}, node {node}: {t}");
        }
    }
}

/// `steps` executions of a phase over a 16 × 64 matrix on one node of
/// `procs` processors in which each filament lends its row and doubles
/// every element but the last. Each segment's write view covers `halo`
/// rows beyond its own; where it does (views overlap, so rows are lent as
/// copies), the closure also sets the last element to the execution's
/// number through the array's checked accessor. Returns the matrix and
/// the counters.
fn doubling(procs: usize, steps: u64, halo: usize) -> (Vec<f64>, DsmStats) {
    let rt = Runtime::new(Config::new().procs(procs).pin(false)).unwrap();
    let dsm = Dsm::new(&rt).unwrap();
    let (rows, n) = (16, 64);
    let m = dsm
        .matrix::<f64>(rows, n)
        .from_fn(|i, j| (i * n + j) as f64)
        .unwrap();
    let mut prog = Program::new();
    prog.phase_with(
        PoolArray::block(&rt, 0..rows, 1),
        |ctx, span| {
            let r = span.rows();
            m.write_rows(ctx, r.start.saturating_sub(halo)..(r.end + halo).min(rows))
        },
        |ctx, i, w| {
            w.with_row(i, |row| {
                if halo > 0 {
                    // Only in a view that lends a copy: the last element
                    // written beside the loan survives its return.
                    m.set(i, n - 1, ctx.iteration() as f64);
                }
                for x in &mut row[..n - 1] {
                    *x *= 2.0;
                }
            });
        },
        until(steps),
    );
    rt.start(&mut prog).unwrap();
    drop(prog);
    (m.to_vec(), dsm.stats())
}

#[test]
fn lent_rows_are_the_rows_in_plain_views_and_copies_where_views_overlap() {
    let (rows, n, steps) = (16, 64, 4u64);
    for procs in [1, 2] {
        // Disjoint views: plain from the third execution on.
        let (got, st) = doubling(procs, steps, 0);
        let want: Vec<f64> = (0..rows * n)
            .map(|e| {
                let x = e as f64;
                if e % n == n - 1 {
                    x
                } else {
                    x * (1u64 << steps) as f64
                }
            })
            .collect();
        assert_eq!(got, want, "procs {procs}, disjoint views");
        assert!(st.total.plain_views > 0, "{}", st.total);
        // The first two executions' rows only.
        assert_eq!(st.total.rows_lent_by_copy, 2 * rows as u64, "{}", st.total);
        // Overlapping views: atomic, every row lent as a copy; the checked
        // store made inside the closure into an element the closure leaves
        // alone is not undone when the copy is stored back.
        let (got, st) = doubling(procs, steps, 1);
        for (e, (&g, &w)) in got.iter().zip(&want).enumerate() {
            let w = if e % n == n - 1 {
                (steps - 1) as f64
            } else {
                w
            };
            assert_eq!(g, w, "procs {procs}, overlapping views, element {e}");
        }
        assert_eq!(st.total.plain_views, 0, "{}", st.total);
        assert_eq!(
            st.total.rows_lent_by_copy,
            rows as u64 * steps,
            "{}",
            st.total
        );
    }
}

#[test]
fn every_other_path_to_a_lent_row_is_refused() {
    // Through the array's checked read, its checked row writer, a row
    // copy, and a new write view, each from inside the closure once the
    // view is plain: each would alias the `&mut` the closure holds.
    for how in ["get", "row_mut", "read_row", "write_rows"] {
        for procs in [1, 2] {
            let rt = Runtime::new(Config::new().procs(procs).pin(false)).unwrap();
            let dsm = Dsm::new(&rt).unwrap();
            let (rows, n) = (8, 512);
            let m = dsm.matrix::<f64>(rows, n).zeroed().unwrap();
            let mut prog = Program::new();
            prog.phase_with(
                PoolArray::block(&rt, 0..rows, 1),
                |ctx, span| m.write_rows(ctx, span.rows()),
                |ctx, i, w| {
                    w.with_row(i, |row| {
                        if i == 3 && ctx.iteration() == 2 {
                            match how {
                                "get" => row[1] = m.get(i, 0),
                                "row_mut" => m.row_mut(ctx, i).set(1, 2.0),
                                "read_row" => m.read_row(i, &mut vec![0.0; n]),
                                _ => drop(m.write_rows(ctx, i..i + 1)),
                            }
                        }
                        row[0] += 1.0;
                    });
                },
                until(4),
            );
            let err = rt.start(&mut prog).expect_err("the access must be refused");
            let msg = err.to_string();
            assert!(
                msg.contains("with_row") && msg.contains("element"),
                "{how}, procs {procs}: {msg}"
            );
        }
    }
}

/// A `rows × n` matrix that started at `i + j` after `steps` executions
/// that each added 1 to every element.
fn counted_up(rows: usize, n: usize, steps: u64) -> Vec<f64> {
    (0..rows * n)
        .map(|e| ((e / n) + (e % n)) as f64 + steps as f64)
        .collect()
}

/// One node of two processors, its DSM, and the `rows × n` matrix that
/// [`counted_up`] describes after no step.
fn counting_from_zero(rows: usize, n: usize) -> (Runtime, Dsm, DsmMatrix<f64>) {
    let rt = Runtime::new(Config::new().procs(2).pin(false)).unwrap();
    let dsm = Dsm::new(&rt).unwrap();
    let m = dsm
        .matrix::<f64>(rows, n)
        .from_fn(|i, j| (i + j) as f64)
        .unwrap();
    (rt, dsm, m)
}

#[test]
fn a_second_view_over_a_chunks_rows_makes_its_loans_copies() {
    // From the fourth execution on, each segment also takes a second
    // write view over its own rows (the same chunk: allowed, its stores
    // are ordered), through which the chunk could reach a lent row: the
    // rows are lent as copies in that execution, with the same results.
    let (rows, n, steps) = (8, 256, 5u64);
    let (rt, dsm, m) = counting_from_zero(rows, n);
    let mut prog = Program::new();
    prog.phase_with(
        PoolArray::block(&rt, 0..rows, 1),
        |ctx, span| {
            // The first view first: it finds the epoch plain (its site's
            // history is clean), and the second, a site without history,
            // joins it.
            let first = m.write_rows(ctx, span.rows());
            let second = (ctx.iteration() == 3).then(|| m.write_rows(ctx, span.rows()));
            (first, second)
        },
        |_ctx, i, (w, _second)| {
            w.with_row(i, |row| row.iter_mut().for_each(|x| *x += 1.0));
        },
        until(steps),
    );
    rt.start(&mut prog).unwrap();
    drop(prog);
    assert_eq!(m.to_vec(), counted_up(rows, n, steps));
    // Copies in the first two executions (atomic) and the fourth; the
    // second view stores plainly beside the first (one chunk), so the
    // epoch stays clean, its footprints inside the third's, and the fifth
    // lends the rows again: every view but the first two executions' is
    // plain (the fourth takes two views a segment).
    let st = dsm.stats().total;
    assert_eq!(st.rows_lent_by_copy, 3 * rows as u64, "{st}");
    assert_eq!(st.plain_views, 2 * st.atomic_views, "{st}");
}

#[test]
fn a_checked_access_before_the_loan_makes_it_a_copy_with_the_same_results() {
    // In a plain epoch, a filament reads its own row through the array's
    // checked accessor and then lends it: the loan must not alias that
    // path, so the row is lent as a copy, and the results are the same.
    let (rows, n, steps) = (8, 256, 5u64);
    let (rt, dsm, m) = counting_from_zero(rows, n);
    let read = AtomicBool::new(false);
    let mut prog = Program::new();
    prog.phase_with(
        PoolArray::block(&rt, 0..rows, 1),
        |ctx, span| m.write_rows(ctx, span.rows()),
        |ctx, i, w| {
            let before = if ctx.iteration() == 3 {
                read.store(true, Ordering::Relaxed);
                m.get(i, 1)
            } else {
                0.0
            };
            w.with_row(i, |row| {
                for x in row.iter_mut() {
                    *x += 1.0;
                }
                row[0] += before * 0.0;
            });
        },
        until(steps),
    );
    rt.start(&mut prog).unwrap();
    drop(prog);
    assert!(read.load(Ordering::Relaxed));
    // Copies in the first two executions (atomic), in the fourth (plain,
    // but every row read through the array first) and in the fifth
    // (atomic: the fourth was not clean); the rows themselves in the
    // third.
    let st = dsm.stats().total;
    assert_eq!(st.rows_lent_by_copy, 4 * rows as u64, "{st}");
    // Views: atomic in three executions, plain in two.
    assert_eq!(3 * st.plain_views, 2 * st.atomic_views, "{st}");
    assert_eq!(m.to_vec(), counted_up(rows, n, steps));
}

#[test]
fn a_vector_lends_its_range() {
    let rt = Runtime::new(Config::new().procs(2).pin(false)).unwrap();
    let dsm = Dsm::new(&rt).unwrap();
    let len = 10_000;
    let v = dsm.vec::<u32>(len).from_fn(|i| i as u32).unwrap();
    let mut prog = Program::new();
    prog.phase_with(
        PoolArray::block(&rt, 0..len, 1),
        |ctx, span| v.write_range(ctx, span.rows()),
        |_ctx, i, w| w.with_slice(i..i + 1, |s| s[0] = s[0] * 3 + 1),
        until(3),
    );
    rt.start(&mut prog).unwrap();
    drop(prog);
    let want: Vec<u32> = (0..len as u32)
        .map(|x| ((x * 3 + 1) * 3 + 1) * 3 + 1)
        .collect();
    assert_eq!(v.to_vec(), want);
    assert!(dsm.stats().total.plain_views > 0);
}

/// Round + 1 in which node 0 holds its loan (the nodes are threads of
/// this process, so they can signal each other outside the DSM).
static LENDING: AtomicU64 = AtomicU64::new(0);
/// Round + 1 whose loan node 0 has ended.
static LENT_UNTIL: AtomicU64 = AtomicU64::new(0);

/// Node 0, the home of `v`, lends the first quarter of `v`'s page `k` in
/// round `k` from a write view of all of `v` (the shared bytes from the
/// third round on) and, inside the
/// closure, once node 1's request for that page waits for the loan's
/// view, reads an element of `u`'s page `k`, homed at node 1 and not yet
/// here: it faults, and waits for node 1 while it lends. Node 1 reads an
/// element of `v`'s page `k` that nobody writes (false sharing across
/// nodes) once node 0 lends. Node 1's request must wait for the loan to
/// end (no read of lent bytes), node 0's fault must be served meanwhile
/// (no deadlock), and every value must be right.
fn fault_inside_loan_node(link: Arc<InProcess>, rounds: u64) -> (DsmStats, Vec<String>) {
    let (rt, dsm) = start(&link, 1).unwrap();
    let pp = PAGE / 8;
    let v: DsmVec<u64> = dsm
        .vec::<u64>(rounds as usize * pp)
        .placement(Placement::Node(0))
        .from_fn(|e| e as u64)
        .unwrap();
    let u: DsmVec<u64> = dsm
        .vec::<u64>(rounds as usize * pp)
        .placement(Placement::Node(1))
        .from_fn(|e| 7 * e as u64)
        .unwrap();
    let me = rt.node();
    let bad: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let fail = |msg: String| bad.lock().unwrap().push(msg);
    let pools = one_per_node(&rt);
    let quarter = pp / 4;
    let mut prog = Program::new();
    prog.phase_with(
        pools,
        |ctx, _| (me == 0).then(|| v.write_range(ctx, 0..rounds as usize * pp)),
        |ctx, _, w| {
            let k = ctx.iteration();
            let base = k as usize * pp;
            if let Some(w) = w {
                let plain = w.plain_stores();
                w.with_slice(base..base + quarter, |s| {
                    for (d, x) in s.iter_mut().enumerate() {
                        *x = 1_000_000 + (base + d) as u64;
                    }
                    if !plain {
                        return;
                    }
                    let before = dsm.stats().total.requests_waited_plain;
                    LENDING.store(k + 1, Ordering::SeqCst);
                    if !wait_for(|| dsm.stats().total.requests_waited_plain != before) {
                        fail(format!("round {k}: no request waited for the loan"));
                    }
                    // A fault while lending: node 1 must serve it.
                    let e = base + pp / 2;
                    let got = u.get(e);
                    if got != 7 * e as u64 {
                        fail(format!("round {k}: u[{e}] is {got}"));
                    }
                });
                LENT_UNTIL.store(k + 1, Ordering::SeqCst);
            } else {
                if !wait_for(|| k < 2 || LENDING.load(Ordering::SeqCst) == k + 1) {
                    fail(format!("round {k}: node 0 never lent"));
                }
                let mid = base + pp / 2;
                let got = v.get(mid);
                if got != mid as u64 {
                    fail(format!("round {k}: v[{mid}] is {got}"));
                }
                // The page came after the loan ended, not while node 0
                // waited for its own page inside the closure.
                if k > 1 && LENT_UNTIL.load(Ordering::SeqCst) < k + 1 {
                    fail(format!(
                        "round {k}: the lent page was served during the loan"
                    ));
                }
            }
        },
        until(rounds),
    );
    rt.start(&mut prog).unwrap();
    drop(prog);
    let mut bad = bad.into_inner().unwrap();
    for (e, &x) in v.to_vec().iter().enumerate() {
        let want = if e % pp < quarter {
            1_000_000 + e as u64
        } else {
            e as u64
        };
        if x != want {
            bad.push(format!("node {me}: v[{e}] is {x}, want {want}"));
            break;
        }
    }
    (dsm.stats(), bad)
}

#[test]
fn a_fault_inside_a_loan_is_served_while_requests_for_the_lent_page_wait() {
    let rounds = 6;
    let out = on_nodes(2, move |l| fault_inside_loan_node(l, rounds));
    for (_, bad) in &out {
        assert!(bad.is_empty(), "{bad:?}\n{}\n{}", out[0].0, out[1].0);
    }
    let home = &out[0].0.total;
    // Rounds 0 and 1 are atomic (no history, then one round of it; the
    // loan a copy); in every later one node 1's request waited for the
    // loan's view, and node 0 fetched the page of `u` it faulted on while
    // lending.
    assert_eq!(home.plain_views, rounds - 2, "{home}");
    assert_eq!(home.requests_waited_plain, rounds - 2, "{home}");
    assert!(home.pages_fetched >= rounds - 2, "{home}");
}
