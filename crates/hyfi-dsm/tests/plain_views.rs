//! Plain-store write views (the `plain` module): handed out only when the
//! phase's footprints allow it, and sound against the page server.
//!
//! Each test checks results against a sequential computation and the
//! DSM's counters of plain and atomic views (`DsmCounters::plain_views`,
//! `atomic_views`, `requests_waited_plain`), never timings.

mod common;
use common::{on_nodes, one_per_node, start, until, wait_for};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use hyfi_core::link::InProcess;
use hyfi_core::{Config, Control, PoolArray, Program, Runtime};
use hyfi_dsm::{Dsm, DsmStats, DsmVec, Placement, ReadRows, WriteRows, PAGE};

/// A step of a 3-point smoothing, the same expression in both versions.
fn smooth(l: f64, m: f64, r: f64) -> f64 {
    m + 0.25 * (l + r - 2.0 * m)
}

/// Row `i` of the smoothing: `fill` for the interior, the two ends copied.
fn smooth_row(old: &ReadRows<'_, f64>, new: &WriteRows<'_, f64>, i: usize, n: usize) {
    let row = &old.row(i)[..n];
    new.row_mut(i)
        .fill(1..n - 1, |j| smooth(row[j - 1], row[j], row[j + 1]));
    new.set(i, 0, row[0]);
    new.set(i, n - 1, row[n - 1]);
}

/// The segments a phase binds per execution over `rows` rows in blocks
/// on one node of `procs` processors with `pools` pools each: every pool
/// cut into `Config::chunks` chunks (the default: one per row in a pool of
/// fewer rows, one chunk on one processor).
fn pieces(rows: usize, procs: usize, pools: usize) -> u64 {
    let chunks = Config::new().get_chunks(procs);
    let mut n = 0;
    for p in 0..procs {
        for k in 0..pools {
            let b = hyfi_core::block(hyfi_core::block(0..rows, procs, p), pools, k);
            n += b.len().min(chunks) as u64;
        }
    }
    n
}

/// `steps` smoothing steps of an `rows × n` grid (rows independent), on
/// one node of `procs` processors with `pools` pools per processor, each
/// segment's write view covering `halo` rows beyond its own (0: disjoint
/// views). Returns the grid, the counters, and which views stored plainly
/// per step.
fn smoothing(
    procs: usize,
    pools: usize,
    steps: u64,
    halo: usize,
    checked_read: bool,
) -> (Vec<f64>, DsmStats, Vec<(u64, bool)>) {
    let (rows, n) = (24, 300);
    let rt = Runtime::new(Config::new().procs(procs).pin(false)).unwrap();
    let dsm = Dsm::new(&rt).unwrap();
    let init = |i: usize, j: usize| ((i * 7 + j * 13) % 17) as f64;
    let g = [
        dsm.matrix::<f64>(rows, n).from_fn(init).unwrap(),
        dsm.matrix::<f64>(rows, n).from_fn(init).unwrap(),
    ];
    let seen = Mutex::new(Vec::new());
    let mut prog = Program::new();
    prog.phase_with(
        PoolArray::block(&rt, 0..rows, pools),
        |ctx, span| {
            let k = ctx.iteration() as usize;
            let r = span.rows();
            let w = r.start.saturating_sub(halo)..(r.end + halo).min(rows);
            (
                g[k % 2].read_rows(ctx, 0..rows),
                g[(k + 1) % 2].write_rows(ctx, w),
            )
        },
        |ctx, i, (old, new)| {
            seen.lock()
                .unwrap()
                .push((ctx.iteration(), new.plain_stores()));
            if checked_read {
                // A checked read of the array the phase writes (its own
                // row, so the footprints still do not overlap).
                let _ = g[(ctx.iteration() as usize + 1) % 2].get(i, 0);
            }
            smooth_row(old, new, i, n);
        },
        until(steps),
    );
    rt.start(&mut prog).unwrap();
    drop(prog);
    let out = g[steps as usize % 2].to_vec();
    let seen = seen.into_inner().unwrap();
    (out, dsm.stats(), seen)
}

fn smoothing_sequential(steps: u64) -> Vec<f64> {
    let (rows, n) = (24, 300);
    let mut a: Vec<f64> = (0..rows * n)
        .map(|e| (((e / n) * 7 + (e % n) * 13) % 17) as f64)
        .collect();
    let mut b = a.clone();
    for _ in 0..steps {
        for i in 0..rows {
            let row = &a[i * n..(i + 1) * n];
            let out = &mut b[i * n..(i + 1) * n];
            for j in 1..n - 1 {
                out[j] = smooth(row[j - 1], row[j], row[j + 1]);
            }
            out[0] = row[0];
            out[n - 1] = row[n - 1];
        }
        std::mem::swap(&mut a, &mut b);
    }
    a
}

#[test]
fn disjoint_views_store_plainly_once_the_phases_footprints_repeat() {
    let steps = 7;
    let (got, st, seen) = smoothing(2, 2, steps, 0, false);
    assert_eq!(got, smoothing_sequential(steps));
    let segments = pieces(24, 2, 2);
    // The first two executions of the phase that write a grid have no
    // history to go on, or one execution of it: atomic. Every later one
    // writes each grid through the same disjoint views as the two before
    // it: plain. Two grids, written in turn: each one's first two steps
    // are atomic.
    assert_eq!(st.total.atomic_views, 4 * segments, "{}", st.total);
    assert_eq!(st.total.plain_views, segments * (steps - 4), "{}", st.total);
    for (k, plain) in seen {
        assert_eq!(plain, k > 3, "step {k}");
    }
}

#[test]
fn overlapping_views_store_atomically() {
    let steps = 5;
    let (got, st, seen) = smoothing(2, 2, steps, 1, false);
    assert_eq!(got, smoothing_sequential(steps));
    assert_eq!(st.total.plain_views, 0, "{}", st.total);
    assert_eq!(
        st.total.atomic_views,
        pieces(24, 2, 2) * steps,
        "{}",
        st.total
    );
    assert!(seen.iter().all(|&(_, p)| !p));
}

#[test]
fn checked_reads_beside_views_keep_them_atomic() {
    let steps = 5;
    let (got, st, _) = smoothing(2, 2, steps, 0, true);
    assert_eq!(got, smoothing_sequential(steps));
    assert_eq!(st.total.plain_views, 0, "{}", st.total);
}

/// A phase whose access pattern changes: its first executions write the
/// vector through disjoint views only, then one filament reads an element
/// of the other pool's view. That read would race with plain stores: the
/// run fails with the cause and the remedy, on one processor as on two.
#[test]
fn an_access_into_another_filaments_plain_view_is_refused() {
    for procs in [1, 2] {
        let rt = Runtime::new(Config::new().procs(procs).pin(false)).unwrap();
        let dsm = Dsm::new(&rt).unwrap();
        let n = 4096;
        let v: DsmVec<f64> = dsm.vec::<f64>(n).zeroed().unwrap();
        // Two filaments, one per pool: on two processors one each, on one
        // processor two pools of it.
        let mut pools = PoolArray::new(&rt, 3 - procs);
        pools.pool(0).push(0);
        if procs == 2 {
            pools.pool(1).push(1);
        } else {
            pools.pool_k(0, 1).push(1);
        }
        let mut prog = Program::new();
        prog.phase_with(
            pools,
            |ctx, span| {
                let half = span.rows().start;
                v.write_range(ctx, half * n / 2..(half + 1) * n / 2)
            },
            |ctx, half, w| {
                if half == 0 && ctx.iteration() == 3 {
                    // Into the other half, which another filament writes.
                    let _ = v.get(n - 1);
                }
                for e in w.range() {
                    w.set(e, (e as u64 + ctx.iteration()) as f64);
                }
            },
            |post| {
                if post.iteration() >= 5 {
                    Control::Done
                } else {
                    Control::Continue
                }
            },
        );
        let err = rt.start(&mut prog).expect_err("the access must be refused");
        let msg = err.to_string();
        assert!(
            msg.contains("plain-store write view") && msg.contains("HYFI_PLAIN_STORES=0"),
            "procs {procs}: {msg}"
        );
    }
}

/// Node 0, the home of every page, writes the first quarter of page `k`
/// in round `k` through a write view of the whole vector (plain from the
/// third round on),
/// and node 1 reads an element of the same page that nobody writes, in
/// the same phase (false sharing across nodes): its first access to page
/// `k`, so it asks node 0 for it while node 0's plain view is live. Node 1
/// reads only once node 0 holds the view, and node 0 holds it until the
/// request is waiting for it (both waits bounded), so the overlap is not
/// left to luck: the request must wait for the view, then be served, with
/// every value right and no deadlock.
/// Round + 1 in which node 0 holds its plain view (the nodes are threads
/// of this process, so they can signal each other outside the DSM).
static HOLDING: AtomicU64 = AtomicU64::new(0);

fn request_during_plain_node(link: Arc<InProcess>, rounds: u64) -> (DsmStats, Vec<String>) {
    let (rt, dsm) = start(&link, 1).unwrap();
    let pp = PAGE / 8;
    let v: DsmVec<u64> = dsm
        .vec::<u64>(rounds as usize * pp)
        .placement(Placement::Node(0))
        .from_fn(|e| e as u64)
        .unwrap();
    let me = rt.node();
    let bad: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let pools = one_per_node(&rt);
    let quarter = pp / 4;
    let fail = |msg: String| bad.lock().unwrap().push(msg);
    let mut prog = Program::new();
    prog.phase_with(
        pools,
        |ctx, _| (me == 0).then(|| v.write_range(ctx, 0..rounds as usize * pp)),
        |ctx, _, w| {
            let k = ctx.iteration();
            let base = k as usize * pp;
            if let Some(w) = w {
                for e in base..base + quarter {
                    w.set(e, 1_000_000 + e as u64);
                }
                if w.plain_stores() {
                    // Hold the view until node 1's request waits for it.
                    let before = dsm.stats().total.requests_waited_plain;
                    HOLDING.store(k + 1, Ordering::SeqCst);
                    if !wait_for(|| dsm.stats().total.requests_waited_plain != before) {
                        fail(format!("round {k}: no request waited for the view"));
                    }
                }
            } else {
                if !wait_for(|| k < 2 || HOLDING.load(Ordering::SeqCst) == k + 1) {
                    fail(format!("round {k}: node 0 never held a plain view"));
                }
                let mid = base + pp / 2;
                let got = v.get(mid);
                if got != mid as u64 {
                    fail(format!("round {k}: element {mid} is {got}"));
                }
            }
        },
        until(rounds),
    );
    rt.start(&mut prog).unwrap();
    drop(prog);
    // Every node sees every round's writes.
    let all = v.to_vec();
    let mut bad = bad.into_inner().unwrap();
    for (e, &x) in all.iter().enumerate() {
        let want = if e % pp < quarter {
            1_000_000 + e as u64
        } else {
            e as u64
        };
        if x != want {
            bad.push(format!("node {me}: element {e} is {x}, want {want}"));
            break;
        }
    }
    (dsm.stats(), bad)
}

#[test]
fn a_request_waits_for_the_homes_plain_view_and_is_served() {
    let rounds = 8;
    let out = on_nodes(2, move |l| request_during_plain_node(l, rounds));
    for (_, bad) in &out {
        assert!(bad.is_empty(), "{bad:?}\n{}\n{}", out[0].0, out[1].0);
    }
    let home = &out[0].0.total;
    // Rounds 0 and 1 are atomic (no history, then one round of it); every
    // later round is plain, and the request of each waited for the view.
    assert_eq!(home.plain_views, rounds - 2, "{home}");
    assert_eq!(home.requests_waited_plain, rounds - 2, "{home}");
    assert!(out[1].0.total.pages_fetched >= rounds, "{}", out[1].0.total);
}

/// Footprints that overlap on one node only: node 0's views are disjoint
/// (plain from each grid's third step), node 1's overlap (atomic throughout);
/// the grid is the sequential one on both.
fn mixed_node(link: Arc<InProcess>, steps: u64) -> (Vec<f64>, DsmStats) {
    let (rt, dsm) = start(&link, 2).unwrap();
    let (rows, n) = (24, 300);
    let init = |i: usize, j: usize| ((i * 7 + j * 13) % 17) as f64;
    let alloc = || {
        dsm.matrix::<f64>(rows, n)
            .placement(Placement::BlockRows(0..rows))
            .from_fn(init)
            .unwrap()
    };
    let g = [alloc(), alloc()];
    let me = rt.node();
    let mut prog = Program::new();
    prog.phase_with(
        PoolArray::block(&rt, 0..rows, 1),
        |ctx, span| {
            let k = ctx.iteration() as usize;
            let r = span.rows();
            let w = if me == 1 {
                r.start.saturating_sub(1).max(rows / 2)..(r.end + 1).min(rows)
            } else {
                r
            };
            (
                g[k % 2].read_rows(ctx, span.rows()),
                g[(k + 1) % 2].write_rows(ctx, w),
            )
        },
        |_ctx, i, (old, new)| {
            smooth_row(old, new, i, n);
        },
        until(steps),
    );
    rt.start(&mut prog).unwrap();
    drop(prog);
    (g[steps as usize % 2].to_vec(), dsm.stats())
}

#[test]
fn footprints_that_overlap_on_one_node_keep_that_node_atomic() {
    let steps = 7;
    let out = on_nodes(2, move |l| mixed_node(l, steps));
    let want = smoothing_sequential(steps);
    for (grid, _) in &out {
        assert_eq!(grid, &want);
    }
    let (n0, n1) = (&out[0].1.total, &out[1].1.total);
    // Each node's 12 rows on its two processors.
    let segments = pieces(12, 2, 1);
    assert_eq!(n0.plain_views, segments * (steps - 4), "{n0}");
    assert_eq!(n1.plain_views, 0, "{n1}");
    assert_eq!(n1.atomic_views, segments * steps, "{n1}");
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Round `k`'s blocks: global processor `g` writes through a view of
/// `cuts[g]..cuts[g + 1]` (random lengths, so pages are written by several
/// processors of several nodes). The cuts hold for three rounds, so that
/// views become plain (two rounds of the same footprints) and then move.
fn cuts(seed: u64, k: u64, len: usize, global: usize) -> Vec<usize> {
    let era = k / 3;
    let mut c: Vec<usize> = (1..global)
        .map(|g| mix(seed ^ era << 20 ^ g as u64) as usize % (len + 1))
        .collect();
    c.push(0);
    c.push(len);
    c.sort_unstable();
    c
}

/// Whether element `e` is written in round `k` (the rest of a view's
/// footprint are gaps its filament does not write), and its new value.
fn written(seed: u64, k: u64, e: usize) -> Option<u64> {
    let r = mix(seed ^ 0xabc ^ k << 32 ^ e as u64);
    (r % 3 != 0).then_some(r >> 1)
}

/// Random rounds of multi-writer writes through write views, on every
/// node, checked against a sequential model after every round. In round
/// `k` node `k % nodes` is the reader: its filaments also read, while the
/// others' views store, gap elements of other nodes' blocks (which nobody
/// writes in the round: release consistency allows the read), so its
/// requests reach homes whose plain views are live. The reader's own views
/// are then atomic in the next round (a checked read beside them), the
/// others' plain: every path is taken, every value checked.
fn multi_writer_views_node(
    link: Arc<InProcess>,
    procs: usize,
    rounds: u64,
    seed: u64,
) -> (DsmStats, Vec<String>) {
    let (rt, dsm) = start(&link, procs).unwrap();
    let (me, nodes) = (rt.node(), rt.num_nodes());
    let global = nodes * procs;
    let len = 6 * PAGE / 8 + 77;
    let init = |e: usize| mix(seed ^ e as u64);
    let homes: Vec<usize> = (0..(len * 8).div_ceil(PAGE))
        .map(|p| mix(seed ^ 0x77 ^ p as u64) as usize % nodes)
        .collect();
    let v: DsmVec<u64> = dsm
        .vec::<u64>(len)
        .placement(Placement::Explicit(homes))
        .from_fn(init)
        .unwrap();
    let model = std::sync::RwLock::new((0..len).map(init).collect::<Vec<u64>>());
    let bad: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let fail = |m: String| bad.lock().unwrap().push(m);
    let mut writers = PoolArray::new(&rt, 1);
    for p in 0..procs {
        writers.pool(p).push(me * procs + p);
    }
    let mut checkers = PoolArray::new(&rt, 1);
    for p in 0..procs {
        checkers.pool(p).push(p);
    }
    let mut prog = Program::new();
    prog.phase_with(
        writers,
        |ctx, span| {
            let g = span.rows().start;
            let c = cuts(seed, ctx.iteration(), len, global);
            v.write_range(ctx, c[g]..c[g + 1])
        },
        |ctx, g, w| {
            let k = ctx.iteration();
            if me == (k % nodes as u64) as usize {
                let c = cuts(seed, k, len, global);
                let (mine_lo, mine_hi) = (c[me * procs], c[(me + 1) * procs]);
                let m = model.read().unwrap();
                for t in 0..40u64 {
                    let e = mix(seed ^ k << 40 ^ (g as u64) << 8 ^ t) as usize % len;
                    if (mine_lo..mine_hi).contains(&e) || written(seed, k, e).is_some() {
                        continue;
                    }
                    let got = v.get(e);
                    if got != m[e] {
                        fail(format!(
                            "round {k}: node {me} read element {e} = {got}, want {}",
                            m[e]
                        ));
                    }
                }
            }
            for e in w.range() {
                if let Some(x) = written(seed, k, e) {
                    w.set(e, x);
                }
            }
        },
        |post| {
            let k = post.iteration();
            let mut m = model.write().unwrap();
            for (e, x) in m.iter_mut().enumerate() {
                if let Some(y) = written(seed, k, e) {
                    *x = y;
                }
            }
            Control::Continue
        },
    );
    prog.phase(
        checkers,
        |ctx, p| {
            let m = model.read().unwrap();
            for e in (p..len).step_by(procs) {
                let got = v.get(e);
                if got != m[e] {
                    fail(format!(
                        "after round {}: node {me} element {e} = {got}, want {}",
                        ctx.iteration(),
                        m[e]
                    ));
                    break;
                }
            }
        },
        until(rounds),
    );
    rt.start(&mut prog).unwrap();
    drop(prog);
    (dsm.stats(), bad.into_inner().unwrap())
}

#[test]
fn random_multi_writer_rounds_through_plain_views_on_three_nodes() {
    let (rounds, seed) = (12, 0x5eed_0022);
    let out = on_nodes(3, move |l| multi_writer_views_node(l, 2, rounds, seed));
    for (st, bad) in &out {
        assert!(bad.is_empty(), "{bad:?}\n{st}");
    }
    let plain: u64 = out.iter().map(|(s, _)| s.total.plain_views).sum();
    let atomic: u64 = out.iter().map(|(s, _)| s.total.atomic_views).sum();
    // Rounds 0 and 1 are atomic everywhere, and so is a node's round
    // after it was the reader, or after the cuts moved; the rest plain.
    assert!(plain > 0 && atomic > 0, "plain {plain}, atomic {atomic}");
}

/// One helper takes the write views of two phases: disjoint ones in the
/// first, overlapping ones (a one-row halo) in the second. The history is
/// per phase, not per call site alone, so the second phase never inherits
/// the first's plain decision (which would make its overlapping views
/// conflict): the first phase stores plainly from its third execution,
/// the second atomically, and the grid is the sequential one.
#[test]
fn a_helper_shared_by_two_phases_keeps_their_histories_apart() {
    let rt = Runtime::new(Config::new().procs(2).pin(false)).unwrap();
    let dsm = Dsm::new(&rt).unwrap();
    let (rows, n) = (16, 64);
    let a = dsm.matrix::<f64>(rows, n).zeroed().unwrap();
    fn view<'a>(
        m: &'a hyfi_dsm::DsmMatrix<f64>,
        ctx: &hyfi_core::Ctx,
        r: std::ops::Range<usize>,
    ) -> hyfi_dsm::WriteRows<'a, f64> {
        m.write_rows(ctx, r)
    }
    let seen = Mutex::new(Vec::new());
    let mut prog = Program::new();
    prog.phase_with(
        PoolArray::block(&rt, 0..rows, 1),
        |ctx, span| view(&a, ctx, span.rows()),
        |ctx, i, w| {
            seen.lock()
                .unwrap()
                .push((0, ctx.iteration(), w.plain_stores()));
            w.row_mut(i)
                .fill(0..n, |j| (i * n + j) as f64 + ctx.iteration() as f64);
        },
        |_| Control::Continue,
    );
    prog.phase_with(
        PoolArray::block(&rt, 0..rows, 1),
        |ctx, span| view(&a, ctx, span.rows_with_halo(1, rows)),
        |ctx, i, w| {
            seen.lock()
                .unwrap()
                .push((1, ctx.iteration(), w.plain_stores()));
            let x = w.get(i, 0);
            w.set(i, 0, x + 1.0);
        },
        |post| {
            if post.iteration() >= 3 {
                Control::Done
            } else {
                Control::Continue
            }
        },
    );
    rt.start(&mut prog).unwrap();
    drop(prog);
    for (phase, k, plain) in seen.into_inner().unwrap() {
        assert_eq!(plain, phase == 0 && k > 1, "phase {phase}, execution {k}");
    }
    for i in 0..rows {
        assert_eq!(a.get(i, 0), (i * n) as f64 + 3.0 + 1.0);
        assert_eq!(a.get(i, 5), (i * n + 5) as f64 + 3.0);
    }
}

/// `x += 0.5·p` in place, row by row with `RowWriter::update` and over a
/// vector with `WriteRange::update`, `steps` times; `halo` widens each
/// write view over its neighbours' rows so that they overlap (atomic).
fn axpy_in_place(halo: usize, steps: u64) -> (Vec<f64>, Vec<f64>, DsmStats) {
    let (rows, n) = (24, 300);
    let rt = Runtime::new(Config::new().procs(2).pin(false)).unwrap();
    let dsm = Dsm::new(&rt).unwrap();
    let x = dsm
        .matrix::<f64>(rows, n)
        .from_fn(|i, j| (i * n + j) as f64)
        .unwrap();
    let p = dsm
        .matrix::<f64>(rows, n)
        .from_fn(|i, j| ((i + 3 * j) % 7) as f64)
        .unwrap();
    let v = dsm.vec::<f64>(rows * n).from_fn(|k| k as f64).unwrap();
    let mut prog = Program::new();
    prog.phase_with(
        PoolArray::block(&rt, 0..rows, 2),
        |ctx, span| {
            let r = span.rows();
            let w = r.start.saturating_sub(halo)..(r.end + halo).min(rows);
            (
                p.read_rows(ctx, r.clone()),
                x.write_rows(ctx, w.clone()),
                v.write_range(ctx, w.start * n..w.end * n),
            )
        },
        |_ctx, i, (p, x, v)| {
            let p = &p.row(i)[..n];
            x.row_mut(i).update(0..n, |j, old| old + 0.5 * p[j]);
            v.update(i * n..(i + 1) * n, |k, old| old - p[k - i * n]);
        },
        until(steps),
    );
    rt.start(&mut prog).unwrap();
    drop(prog);
    (x.to_vec(), v.to_vec(), dsm.stats())
}

#[test]
fn update_rewrites_in_place_through_plain_and_atomic_views() {
    let steps = 4;
    let (rows, n) = (24, 300);
    let (mut x, mut v) = (Vec::new(), Vec::new());
    for i in 0..rows {
        for j in 0..n {
            x.push((i * n + j) as f64);
            v.push((i * n + j) as f64);
        }
    }
    for _ in 0..steps {
        for i in 0..rows {
            for j in 0..n {
                let p = ((i + 3 * j) % 7) as f64;
                x[i * n + j] += 0.5 * p;
                v[i * n + j] -= p;
            }
        }
    }
    for halo in [0, 1] {
        let (gx, gv, st) = axpy_in_place(halo, steps);
        assert_eq!(gx, x, "the matrix, halo {halo}");
        assert_eq!(gv, v, "the vector, halo {halo}");
        if halo == 0 {
            assert!(
                st.total.plain_views > 0,
                "disjoint: plain from the second step: {}",
                st.total
            );
        } else {
            assert_eq!(st.total.plain_views, 0, "overlapping: atomic: {}", st.total);
        }
    }
}

/// The longest-common-subsequence table of `a` and `b` (`(n+1)²`, row and
/// column 0 zero), by the sequential loop.
fn lcs_sequential(a: &[u8], b: &[u8]) -> Vec<u32> {
    let (n, w) = (a.len(), b.len() + 1);
    let mut h = vec![0u32; (n + 1) * w];
    for i in 1..=n {
        for j in 1..w {
            h[i * w + j] = if a[i - 1] == b[j - 1] {
                h[(i - 1) * w + j - 1] + 1
            } else {
                h[(i - 1) * w + j].max(h[i * w + j - 1])
            };
        }
    }
    h
}

/// Two strings over four letters.
fn letters(n: usize, seed: u64) -> Vec<u8> {
    (0..n)
        .map(|i| b"ACGT"[mix(seed ^ i as u64) as usize & 3])
        .collect()
}

/// The LCS table by a blocked wavefront, a user's program: one phase per
/// anti-diagonal of `t × t` tiles, one filament per tile row (dealt
/// cyclically over every processor of the job), which in phase `d` takes a
/// write view of its tile's rows and the row above them — inside the
/// filament, so the views of a phase are those of the tiles on its
/// diagonal: one in the first execution, two overlapping ones (a tile's
/// last row is the halo of the tile below) in the second.
fn wavefront_node(link: Arc<InProcess>, procs: usize, n: usize, t: usize) -> (Vec<u32>, DsmStats) {
    let (rt, dsm) = start(&link, procs).unwrap();
    let (a, b) = (letters(n, 1), letters(n, 2));
    let (w, tiles) = (n + 1, n.div_ceil(t));
    let h = dsm.matrix::<u32>(n + 1, w).zeroed().unwrap();
    let mut prog = Program::new();
    prog.phase(
        PoolArray::cyclic(&rt, 0..tiles),
        |ctx, ti| {
            let d = ctx.iteration() as usize;
            if d < ti || d - ti >= tiles {
                return;
            }
            let rows = 1 + ti * t..(1 + (ti + 1) * t).min(n + 1);
            let cols = 1 + (d - ti) * t..(1 + (d - ti + 1) * t).min(w);
            let v = h.write_rows(ctx, rows.start - 1..rows.end);
            for i in rows {
                let (mut left, mut diag) = (v.get(i, cols.start - 1), v.get(i - 1, cols.start - 1));
                v.row_mut(i).fill(cols.clone(), |j| {
                    let up = v.get(i - 1, j);
                    let c = if a[i - 1] == b[j - 1] {
                        diag + 1
                    } else {
                        up.max(left)
                    };
                    (diag, left) = (up, c);
                    c
                });
            }
        },
        until(2 * tiles as u64 - 1),
    );
    rt.start(&mut prog).unwrap();
    drop(prog);
    (h.to_vec(), dsm.stats())
}

/// A phase whose footprints change from one execution to the next: the
/// views of the wavefront's second execution overlap, though its first
/// took one view only, so no execution stores plainly where a node holds
/// neighbouring tile rows (one clean execution does not make the next
/// plain; before, the second execution's second view was refused as a
/// conflict with the first's plain view and the program stopped), and the
/// table is the sequential one on every configuration.
#[test]
fn a_wavefront_whose_views_change_every_execution_gives_the_sequential_table() {
    let (n, t) = (90, 8);
    let want = lcs_sequential(&letters(n, 1), &letters(n, 2));
    for (nodes, procs) in [(1, 1), (1, 2), (2, 1), (2, 2), (3, 1)] {
        let out = on_nodes(nodes, move |l| wavefront_node(l, procs, n, t));
        for (node, (got, st)) in out.iter().enumerate() {
            assert!(
                got == &want,
                "{nodes}x{procs}, node {node}: the table differs\n{st}"
            );
            // Where a node holds neighbouring tile rows, its views overlap:
            // atomic throughout. Nodes of one processor each hold tile rows
            // `nodes` apart, whose views are disjoint on the node (they
            // overlap only across nodes, where the protocol merges the
            // pages' writers), and store plainly once they repeat.
            if nodes == 1 || procs > 1 {
                assert_eq!(
                    st.total.plain_views, 0,
                    "{nodes}x{procs}, node {node}: {}",
                    st.total
                );
            }
        }
    }
}

/// Views that shrink from one execution to the next (a factorization's
/// trailing rows: execution `k` writes rows `k..` of each segment) store
/// plainly from the third execution on; views that move (each segment's
/// window one row further down in every execution, still disjoint) never
/// do, as nothing says where the next execution's views will be. Both give
/// the sequential matrix.
#[test]
fn views_that_shrink_become_plain_and_views_that_move_stay_atomic() {
    let (rows, n, steps) = (32, 64, 6u64);
    for moving in [false, true] {
        let rt = Runtime::new(Config::new().procs(2).pin(false)).unwrap();
        let dsm = Dsm::new(&rt).unwrap();
        let m = dsm
            .matrix::<f64>(rows + steps as usize, n)
            .zeroed()
            .unwrap();
        let seen = Mutex::new(Vec::new());
        // Pools of row blocks, one segment per processor: the views are the
        // same chunk by chunk in every execution.
        let mut pools = PoolArray::new(&rt, 1);
        pools.pool(0).push(0);
        pools.pool(1).push(1);
        let mut prog = Program::new();
        prog.phase(
            pools,
            |ctx, p| {
                let k = ctx.iteration() as usize;
                let half = p * rows / 2..(p + 1) * rows / 2;
                let r = if moving {
                    half.start + k..half.end + k - 1
                } else {
                    (half.start + k).min(half.end)..half.end
                };
                let v = m.write_rows(ctx, r.clone());
                seen.lock().unwrap().push((k, v.plain_stores()));
                for i in r {
                    v.row_mut(i)
                        .fill(0..n, |j| v.get(i, j) + (k * n + j) as f64);
                }
            },
            until(steps),
        );
        rt.start(&mut prog).unwrap();
        drop(prog);
        let mut want = vec![0.0; (rows + steps as usize) * n];
        for k in 0..steps as usize {
            for p in 0..2 {
                let half = p * rows / 2..(p + 1) * rows / 2;
                let r = if moving {
                    half.start + k..half.end + k - 1
                } else {
                    (half.start + k).min(half.end)..half.end
                };
                for i in r {
                    for j in 0..n {
                        want[i * n + j] += (k * n + j) as f64;
                    }
                }
            }
        }
        assert_eq!(m.to_vec(), want, "moving {moving}");
        for (k, plain) in seen.into_inner().unwrap() {
            assert_eq!(plain, !moving && k > 1, "moving {moving}, execution {k}");
        }
    }
}

/// A program started again and again, one execution of its phase per
/// start (a time loop around `Runtime::start`), learns across the starts:
/// its views store plainly from the third start on, as a phase repeated
/// within one start does. A program made anew for each start has no
/// history, so its views stay atomic. The matrix is the sequential one
/// either way.
#[test]
fn a_program_started_again_keeps_what_its_phases_showed() {
    let (rows, n, starts) = (16, 64, 5u64);
    for again in [true, false] {
        let rt = Runtime::new(Config::new().procs(2).pin(false)).unwrap();
        let dsm = Dsm::new(&rt).unwrap();
        let m = dsm.matrix::<f64>(rows, n).zeroed().unwrap();
        let seen = Mutex::new(Vec::new());
        let make = || {
            let mut prog = Program::new();
            prog.phase_with(
                PoolArray::block(&rt, 0..rows, 1),
                |ctx, span| m.write_rows(ctx, span.rows()),
                |_ctx, i, w| {
                    seen.lock().unwrap().push(w.plain_stores());
                    w.row_mut(i)
                        .fill(0..n, |j| w.get(i, j) + (i * n + j) as f64);
                },
                |_| Control::Done,
            );
            prog
        };
        let mut prog = make();
        let mut plain_per_start = Vec::new();
        for _ in 0..starts {
            if !again {
                prog = make();
            }
            rt.start(&mut prog).unwrap();
            let s = std::mem::take(&mut *seen.lock().unwrap());
            plain_per_start.push(s.iter().all(|&p| p) && !s.is_empty());
        }
        drop(prog);
        let want: Vec<f64> = (0..rows * n).map(|e| (e as u64 * starts) as f64).collect();
        assert_eq!(m.to_vec(), want, "again {again}");
        let expect: Vec<bool> = (0..starts).map(|k| again && k > 1).collect();
        assert_eq!(plain_per_start, expect, "again {again}");
    }
}
