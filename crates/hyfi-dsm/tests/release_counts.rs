//! Messages per node per phase at the release, counted (never timed), on
//! many in-process nodes: a node sends a `REL` only to the nodes it has
//! something for, and the phase ends with one all-reduce of the counts
//! (issue 23). A block-row Jacobi then moves, per node and phase, its two
//! boundary rows to its two neighbours and nothing else, at 2, 8, 64 and
//! 256 nodes alike.
//!
//! The in-process link's all-reduce meets in shared memory and sends no
//! message; over TCP it is a recursive doubling (`log2 N` messages per
//! node), counted by `tests/dsm.rs` with real processes.

mod common;
use common::{on_nodes_ok, start};
use std::sync::Arc;

use hyfi_core::link::InProcess;
use hyfi_core::{Control, PoolArray, Program};
use hyfi_dsm::{DsmCounters, Placement, PAGE};

/// Columns: one row is one page, so the blocks of rows the nodes own
/// share no page (no false sharing, no diff, no notice).
const COLS: usize = PAGE / 8;

/// One node of a Jacobi-like sweep over `2 + 2 * nodes` rows, two rows per
/// node: `warm` sweeps, then the counters over `sweeps` more. Returns the
/// node's counters over those sweeps, and its two rows of the result.
fn node(link: Arc<InProcess>, warm: u64, sweeps: u64) -> Result<(DsmCounters, Vec<f64>), String> {
    let (rt, dsm) = start(&link, 1)?;
    let rows = 2 + 2 * rt.num_nodes();
    let inner = 1..rows - 1;
    let init = |i: usize, j: usize| if i == 0 { 1.0 } else { (j % 7) as f64 };
    let grid = || {
        dsm.matrix::<f64>(rows, COLS)
            .placement(Placement::BlockRows(inner.clone()))
            .from_fn(init)
            .map_err(|e| e.to_string())
    };
    let g = [grid()?, grid()?];
    // One program; the counters read in the post-phase code after the
    // release of sweep `warm - 1` and of the last sweep.
    let snaps = std::sync::Mutex::new(Vec::new());
    let mut prog = Program::new();
    prog.phase_with(
        PoolArray::block(&rt, inner.clone(), 1),
        |ctx, span| {
            let k = ctx.iteration() as usize;
            (
                g[k % 2].read_rows(ctx, span.rows_with_halo(1, rows)),
                g[(k + 1) % 2].write_rows(ctx, span.rows()),
            )
        },
        |_ctx, i, (old, new)| {
            let (up, mid, down) = (old.row(i - 1), old.row(i), old.row(i + 1));
            new.row_mut(i).fill(1..COLS - 1, |j| {
                (up[j] + down[j] + mid[j - 1] + mid[j + 1]) * 0.25
            });
        },
        |post| {
            let k = post.iteration() + 1;
            if k == warm || k == warm + sweeps {
                snaps.lock().unwrap().push(dsm.stats().total);
            }
            if k >= warm + sweeps {
                Control::Done
            } else {
                Control::Continue
            }
        },
    );
    rt.start(&mut prog).map_err(|e| e.to_string())?;
    drop(prog);
    let snaps = snaps.into_inner().unwrap();
    let (before, after) = (snaps[0], snaps[1]);
    let d = DsmCounters {
        messages_sent: after.messages_sent - before.messages_sent,
        bytes_sent: after.bytes_sent - before.bytes_sent,
        pages_fetched: after.pages_fetched - before.pages_fetched,
        notices_sent: after.notices_sent - before.notices_sent,
        pages_pushed: after.pages_pushed - before.pages_pushed,
        pages_served: after.pages_served - before.pages_served,
        pushes_declined: after.pushes_declined - before.pushes_declined,
        diffs_sent: after.diffs_sent - before.diffs_sent,
        ..DsmCounters::default()
    };
    let k = ((warm + sweeps) % 2) as usize;
    let me = rt.node();
    let mine = (1 + 2 * me..3 + 2 * me)
        .flat_map(|i| (0..COLS).map(move |j| (i, j)))
        .map(|(i, j)| g[k].get(i, j))
        .collect();
    Ok((d, mine))
}

/// The same sweeps on plain vectors.
fn sequential(rows: usize, sweeps: u64) -> Vec<f64> {
    let init = |i: usize, j: usize| if i == 0 { 1.0 } else { (j % 7) as f64 };
    let mut a: Vec<f64> = (0..rows * COLS).map(|e| init(e / COLS, e % COLS)).collect();
    let mut b = a.clone();
    for _ in 0..sweeps {
        for i in 1..rows - 1 {
            for j in 1..COLS - 1 {
                b[i * COLS + j] = (a[(i - 1) * COLS + j]
                    + a[(i + 1) * COLS + j]
                    + a[i * COLS + j - 1]
                    + a[i * COLS + j + 1])
                    * 0.25;
            }
        }
        std::mem::swap(&mut a, &mut b);
    }
    a
}

fn counts(nodes: usize) {
    let (warm, sweeps) = (3, 6);
    let out: Vec<(DsmCounters, Vec<f64>)> = on_nodes_ok(nodes, move |l| node(l, warm, sweeps));
    let want = sequential(2 + 2 * nodes, warm + sweeps);
    let row_bytes = (COLS * 8) as u64;
    for (me, (d, mine)) in out.iter().enumerate() {
        assert!(
            mine.iter()
                .zip(&want[(1 + 2 * me) * COLS..(3 + 2 * me) * COLS])
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "node {me} of {nodes}: its rows differ from the sequential sweeps"
        );
        let neighbours = u64::from(me > 0) + u64::from(me + 1 < nodes);
        // Per sweep: one REL to each neighbour (its boundary row pushed),
        // none to anyone else, and no page fetched or noticed.
        assert_eq!(
            d.messages_sent,
            neighbours * sweeps,
            "node {me} of {nodes}: {} messages in {sweeps} sweeps: {d}",
            d.messages_sent
        );
        assert_eq!(d.pages_fetched + d.notices_sent, 0, "node {me} of {nodes}");
        // The bytes: the rows that must move, within 10 %.
        let rows_moved = neighbours * sweeps * row_bytes;
        assert!(
            d.bytes_sent >= rows_moved && d.bytes_sent * 10 <= rows_moved * 11,
            "node {me} of {nodes}: {} bytes for {rows_moved} bytes of rows",
            d.bytes_sent
        );
    }
}

#[test]
fn a_block_row_sweep_sends_two_rels_per_node_on_2_and_8_nodes() {
    counts(2);
    counts(8);
}

#[test]
fn a_block_row_sweep_sends_two_rels_per_node_on_64_nodes() {
    counts(64);
}

#[test]
fn a_block_row_sweep_sends_two_rels_per_node_on_256_nodes() {
    counts(256);
}
