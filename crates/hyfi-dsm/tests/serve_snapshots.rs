//! The page server and a home page writable without a fault: a request
//! turns it back to `READ`, so that the home's next write faults and goes
//! to the requester at the release. The server snapshots such a page
//! (a write that passed its state test may still land after the copy),
//! except where a read view made the array read-only on the home in its
//! current access epoch, when no write of that epoch can come (server.rs).
//!
//! Two in-process nodes, one processor each; every value checked on both
//! nodes against the rounds' plan, never timings.

mod common;
use common::{on_nodes, one_per_node, start, until, wait_for};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use hyfi_core::link::InProcess;
use hyfi_core::Program;
use hyfi_dsm::{DsmStats, DsmVec, Placement, PAGE};

/// Words of a page.
const PP: usize = PAGE / 8;

/// What node 0 writes into page `c` in the cycle's first round (`v`) and
/// its third (`w`): distinct from each other and from the initial values.
fn v(c: usize, e: usize) -> u64 {
    1_000_000 + (c * PP + e) as u64
}
fn w(c: usize, e: usize) -> u64 {
    2_000_000 + (c * PP + e) as u64
}

/// Round + 1 in which node 0 holds a read view of the whole array (the
/// nodes are threads of this process, so they can signal each other
/// outside the DSM).
static READ_ONLY: AtomicU64 = AtomicU64::new(0);
/// Round + 1 in which node 1 has read its page.
static READ_DONE: AtomicU64 = AtomicU64::new(0);

/// Cycles of three rounds, one page each, all homed on node 0:
/// 1. node 0 writes page `c` (`v`): its first write since the array was
///    made, a notice that invalidates node 1's copy; nobody else holds the
///    page, so the home keeps it writable without a fault afterwards;
/// 2. node 0 takes a read view of the whole array, then node 1 reads page
///    `c`, a request its home serves while its array is read-only there;
/// 3. node 0 writes page `c` again (`w`): the write must fault and reach
///    node 1, which holds the copy it was served, as a push.
///
/// At the end every node reads the whole array: the second values.
fn node(link: std::sync::Arc<InProcess>, cycles: usize) -> (DsmStats, Vec<String>) {
    let (rt, dsm) = start(&link, 1).unwrap();
    let len = cycles * PP;
    let a: DsmVec<u64> = dsm
        .vec::<u64>(len)
        .placement(Placement::Node(0))
        .from_fn(|e| e as u64)
        .unwrap();
    let me = rt.node();
    let bad: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let fail = |msg: String| bad.lock().unwrap().push(msg);
    let pools = one_per_node(&rt);
    let mut prog = Program::new();
    prog.phase_with(
        pools,
        |ctx, _| {
            let k = ctx.iteration();
            // Node 0's read view in the second round of a cycle: the
            // array's mode for the whole epoch, taken before node 1 asks.
            (me == 0 && k % 3 == 1).then(|| a.read_range(ctx, 0..len))
        },
        |ctx, _, view| {
            let k = ctx.iteration();
            let c = (k / 3) as usize;
            let page = c * PP..(c + 1) * PP;
            match (me, k % 3) {
                (0, 0) => page.for_each(|e| a.set(e, v(c, e - c * PP))),
                (0, 1) => {
                    let view = view.as_ref().expect("bound above");
                    let first = view.get(page.start);
                    READ_ONLY.store(k + 1, Ordering::SeqCst);
                    // Node 1's request is served while this epoch lasts.
                    if !wait_for(|| READ_DONE.load(Ordering::SeqCst) == k + 1) {
                        fail(format!("round {k}: node 1 never read its page"));
                    }
                    if first != v(c, 0) {
                        fail(format!("round {k}: node 0 reads {first}, want {}", v(c, 0)));
                    }
                }
                (0, _) => page.for_each(|e| a.set(e, w(c, e - c * PP))),
                (_, 1) => {
                    if !wait_for(|| READ_ONLY.load(Ordering::SeqCst) == k + 1) {
                        fail(format!("round {k}: node 0 never held its read view"));
                    }
                    for e in page {
                        let got = a.get(e);
                        if got != v(c, e - c * PP) {
                            fail(format!("round {k}: node 1 reads {got} at {e}"));
                            break;
                        }
                    }
                    READ_DONE.store(k + 1, Ordering::SeqCst);
                }
                _ => {}
            }
        },
        until(3 * cycles as u64),
    );
    rt.start(&mut prog).unwrap();
    drop(prog);
    // The program's counts, before this node's reads below fetch more (the
    // home's served count may include the other node's, which may be
    // served before the home looks).
    let stats = dsm.stats();
    let all = a.to_vec();
    let mut bad = bad.into_inner().unwrap();
    for (e, &x) in all.iter().enumerate() {
        let want = w(e / PP, e % PP);
        if x != want {
            bad.push(format!("node {me}: element {e} is {x}, want {want}"));
            break;
        }
    }
    (stats, bad)
}

#[test]
fn a_page_served_while_its_array_is_read_only_takes_the_homes_next_write() {
    let cycles = 6;
    let out = on_nodes(2, move |l| node(l, cycles));
    for (_, bad) in &out {
        assert!(bad.is_empty(), "{bad:?}\n{}\n{}", out[0].0, out[1].0);
    }
    let (home, reader) = (&out[0].0.total, &out[1].0.total);
    // Node 1 asked for each page once, in the cycle's second round, and
    // every third-round write reached it as a push of the page it was
    // served.
    assert_eq!(reader.pages_fetched, cycles as u64, "{reader}");
    assert!(home.pages_served >= cycles as u64, "{home}");
    assert_eq!(home.pages_pushed, cycles as u64, "{home}");
    assert_eq!(reader.pushes_installed, cycles as u64, "{reader}");
}
