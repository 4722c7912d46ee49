//! The DSM protocol (faults, page server, releases with twins and diffs)
//! on 2–4 nodes in one process, over the in-process node seam
//! ([`hyfi_core::link::InProcess`]), each node's region at its own base
//! ([`Dsm::with_base`]). Random multi-writer rounds, every element checked
//! on every node against a sequential model after every round (as
//! `examples/dsm_stress.rs` does with real processes, tested in the
//! workspace's `tests/dsm.rs`).

mod common;
use common::{on_nodes_ok, one_per_node, start, until};
use std::sync::{Arc, Mutex, RwLock};

use hyfi_core::link::InProcess;
use hyfi_core::{Control, NodeLink, PoolArray, Program, Runtime};
use hyfi_dsm::{Dsm, DsmStats, DsmVec, Placement, PAGE};

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The plan's word for element `e` of array `a` in round `k`.
fn plan(seed: u64, k: u64, a: u64, e: usize) -> u64 {
    mix(mix(mix(seed ^ (a << 56)) ^ k) ^ e as u64)
}

/// The global processor writing element `e` of array `a` in round `k`, if
/// any (a quarter of the elements per round, by random processors of any
/// node: bytes and words of one page written by several nodes).
fn writer(seed: u64, k: u64, a: u64, e: usize, global: usize) -> Option<usize> {
    let r = plan(seed, k, a, e);
    (r % 4 == 0).then(|| (r >> 8) as usize % global)
}

trait Val: bytemuck::Pod + PartialEq + std::fmt::Debug + Send + Sync {
    fn from_r(r: u64) -> Self;
}
impl Val for u8 {
    fn from_r(r: u64) -> Self {
        (r >> 24) as u8
    }
}
impl Val for u32 {
    fn from_r(r: u64) -> Self {
        (r >> 24) as u32
    }
}
impl Val for f64 {
    fn from_r(r: u64) -> Self {
        (r >> 24) as f64 * 0.25
    }
}

/// A shared vector and its sequential model (the same on every node).
struct Tracked<T: Val> {
    id: u64,
    arr: DsmVec<T>,
    /// Read by filaments that may suspend on a page (so not a `Mutex`:
    /// another filament of the same server thread must get in).
    model: RwLock<Vec<T>>,
}

impl<T: Val> Tracked<T> {
    fn new(dsm: &Dsm, id: u64, len: usize, placement: Placement, seed: u64) -> Self {
        let init = |e: usize| T::from_r(mix(seed ^ (id << 40) ^ e as u64));
        let arr = dsm
            .vec::<T>(len)
            .placement(placement)
            .from_fn(init)
            .expect("allocation");
        Tracked {
            id,
            arr,
            model: RwLock::new((0..len).map(init).collect()),
        }
    }
    /// Round `k`'s writes of global processor `g`.
    fn write(&self, seed: u64, k: u64, g: usize, global: usize) {
        for e in 0..self.arr.len() {
            if writer(seed, k, self.id, e, global) == Some(g) {
                self.arr.set(e, T::from_r(plan(seed, k, self.id, e)));
            }
        }
    }
    /// Applies round `k`'s writes to the model.
    fn advance(&self, seed: u64, k: u64, global: usize) {
        let mut m = self.model.write().unwrap();
        for (e, v) in m.iter_mut().enumerate() {
            if writer(seed, k, self.id, e, global).is_some() {
                *v = T::from_r(plan(seed, k, self.id, e));
            }
        }
    }
    /// Checks elements `lo..hi` against the model.
    fn check(&self, node: usize, k: u64, lo: usize, hi: usize) -> Result<(), String> {
        let m = self.model.read().unwrap();
        for e in lo..hi.min(self.arr.len()) {
            let got = self.arr.get(e);
            if got != m[e] {
                return Err(format!(
                    "node {node}: array {} element {e} after round {k}: {got:?}, expected {:?}",
                    self.id, m[e]
                ));
            }
        }
        Ok(())
    }
}

/// Elements checked per filament.
const CHUNK: usize = 700;

/// Runs `prog` on `rt`; the DSM's counters, or the stale reads its
/// filaments recorded in `bad`.
fn run_checked(
    rt: &Runtime,
    mut prog: Program<'_>,
    bad: &Mutex<Vec<String>>,
    dsm: &Dsm,
) -> Result<DsmStats, String> {
    rt.start(&mut prog).map_err(|e| e.to_string())?;
    drop(prog);
    let bad = bad.lock().unwrap();
    if !bad.is_empty() {
        return Err(format!("node {} read stale values: {bad:?}", rt.node()));
    }
    Ok(dsm.stats())
}

/// `rounds` write-and-check rounds on one node; returns its DSM counters.
fn node_main(
    link: Arc<InProcess>,
    procs: usize,
    rounds: u64,
    seed: u64,
) -> Result<DsmStats, String> {
    let (rt, dsm) = start(&link, procs)?;
    let (me, nodes) = (rt.node(), rt.num_nodes());
    let global = nodes * procs;
    let p8 = Tracked::<u8>::new(&dsm, 1, 3 * PAGE + 100, Placement::Cyclic, seed);
    let p32 = Tracked::<u32>::new(&dsm, 2, 5000, Placement::Block, seed);
    let homes: Vec<usize> = (0..(3000 * 8usize).div_ceil(PAGE))
        .map(|p| mix(seed ^ 0x77 ^ p as u64) as usize % nodes)
        .collect();
    let p64 = Tracked::<f64>::new(&dsm, 3, 3000, Placement::Explicit(homes), seed);
    let lens = [p8.arr.len(), p32.arr.len(), p64.arr.len()];
    let failure: Mutex<Option<String>> = Mutex::new(None);
    let fail = |r: Result<(), String>| {
        if let Err(e) = r {
            failure.lock().unwrap().get_or_insert(e);
        }
    };

    // Checking: every node checks every element, its processors split it.
    let mut jobs = Vec::new();
    for (a, len) in lens.iter().enumerate() {
        for c in 0..len.div_ceil(CHUNK) {
            jobs.push((a, c * CHUNK));
        }
    }
    let mut check_pools = PoolArray::new(&rt, 2);
    for j in 0..jobs.len() {
        check_pools.pool_k(j % procs, (j / procs) % 2).push(j);
    }
    let mut write_pools = PoolArray::new(&rt, 1);
    for p in 0..procs {
        write_pools.pool(p).push(me * procs + p);
    }
    let mut prog = Program::new();
    prog.phase(
        check_pools,
        |ctx, j| {
            let (a, lo) = jobs[j];
            let k = ctx.iteration();
            fail(match a {
                0 => p8.check(me, k, lo, lo + CHUNK),
                1 => p32.check(me, k, lo, lo + CHUNK),
                _ => p64.check(me, k, lo, lo + CHUNK),
            });
        },
        |post| {
            if failure.lock().unwrap().is_some() || post.iteration() >= rounds {
                Control::Done
            } else {
                Control::Continue
            }
        },
    );
    prog.phase(
        write_pools,
        |ctx, g| {
            let k = ctx.iteration();
            p8.write(seed, k, g, global);
            p32.write(seed, k, g, global);
            p64.write(seed, k, g, global);
        },
        |post| {
            let k = post.iteration();
            p8.advance(seed, k, global);
            p32.advance(seed, k, global);
            p64.advance(seed, k, global);
            Control::Continue
        },
    );
    rt.start(&mut prog).map_err(|e| e.to_string())?;
    drop(prog);
    if let Some(e) = failure.lock().unwrap().take() {
        return Err(e);
    }
    // The node's report carries the DSM's section (what SIGUSR1 prints
    // over TCP).
    let report = link.report();
    if !report.contains("dsm node") {
        return Err(format!(
            "node {me}: the DSM added no report section: {report:?}"
        ));
    }
    // Page requests travel as control, pages and releases as bulk.
    let t = link.traffic().ok_or("the in-process link counts traffic")?;
    if t.bulk.sent == 0 || (dsm.stats().total.read_faults > 0 && t.control.sent == 0) {
        return Err(format!("node {me}: traffic by class {t}"));
    }
    Ok(dsm.stats())
}

fn run(nodes: usize, procs: usize, rounds: u64, seed: u64) {
    let stats = on_nodes_ok(nodes, move |l| node_main(l, procs, rounds, seed));
    let fetched: u64 = stats.iter().map(|s| s.total.pages_fetched).sum();
    let served: u64 = stats.iter().map(|s| s.total.pages_served).sum();
    let diffs: u64 = stats.iter().map(|s| s.total.diffs_applied).sum();
    assert!(fetched > 0, "{nodes} x {procs}: no page moved");
    assert_eq!(fetched, served, "every page served arrived");
    assert!(diffs > 0, "{nodes} x {procs}: no diff moved to a home");
}

#[test]
fn random_multi_writer_rounds_on_two_nodes() {
    run(2, 2, 12, 1);
}

#[test]
fn random_multi_writer_rounds_on_three_nodes() {
    run(3, 1, 10, 2);
}

#[test]
fn random_multi_writer_rounds_on_four_nodes() {
    run(4, 1, 8, 3);
}

/// Producer push on 2 nodes: node 0, the home, writes pages 0..=5 every
/// round; node 1 reads pages 0..=4 every round and page 5 in round 0 only.
/// Node 1 fetches each page once (round 0); from then on the home pushes
/// them at each release after it wrote them, and node 1 declines page 5,
/// the one it stopped reading, after one unused push. Every read checks the
/// value of its round.
fn push_node(link: Arc<InProcess>, rounds: u64) -> Result<DsmStats, String> {
    const HOT: usize = 5;
    let (rt, dsm) = start(&link, 1)?;
    let per_page = PAGE / 8;
    let v: DsmVec<u64> = dsm
        .vec::<u64>((HOT + 1) * per_page)
        .placement(Placement::Node(0))
        .zeroed()
        .map_err(|e| e.to_string())?;
    let me = rt.node();
    let bad: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut writers = PoolArray::new(&rt, 1);
    let mut readers = PoolArray::new(&rt, 1);
    for page in 0..=HOT {
        if me == 0 {
            writers.pool(0).push(page);
        } else {
            readers.pool(0).push(page);
        }
    }
    let mut prog = Program::new();
    prog.phase(
        writers,
        |ctx, page| {
            for e in 0..per_page {
                v.set(page * per_page + e, ctx.iteration() + 1);
            }
        },
        |_| Control::Continue,
    );
    prog.phase(
        readers,
        |ctx, page| {
            let k = ctx.iteration();
            if page == HOT && k > 0 {
                return; // read in round 0 only
            }
            for e in [0, per_page / 2, per_page - 1] {
                let got = v.get(page * per_page + e);
                if got != k + 1 {
                    bad.lock()
                        .unwrap()
                        .push(format!("round {k}, page {page}, element {e}: {got}"));
                }
            }
        },
        until(rounds),
    );
    run_checked(&rt, prog, &bad, &dsm)
}

#[test]
fn homes_push_what_readers_use_and_stop_when_declined() {
    let rounds = 6;
    let st = on_nodes_ok(2, move |l| push_node(l, rounds));
    let (home, reader) = (&st[0].total, &st[1].total);
    // Round 0: every page fetched once (the zeroed copies were voided by
    // the home's first write). Round 1: all six pushed; page 5 unused, so
    // declined at the release after round 1's reads. Rounds 2..: five.
    assert_eq!(reader.pages_fetched, 6, "{reader:?}");
    assert_eq!(reader.read_faults, 6, "{reader:?}");
    assert_eq!(home.pages_pushed, 6 + 5 * (rounds - 2), "{home:?}");
    assert_eq!(reader.pushes_installed, home.pages_pushed, "{reader:?}");
    assert_eq!(reader.pushes_declined, 1, "{reader:?}");
    // No write notice for pages only the home writes, once the zeroed
    // copies are gone (the first write's notice: 6 pages to one node).
    assert_eq!(home.notices_sent, 6, "{home:?}");
    assert_eq!(reader.diffs_sent + home.diffs_sent, 0);
}

/// A home page served while its home writes other bytes of it in the same
/// phase (false sharing): node 1 reads the last element of page `k` in
/// round `k` while node 0, the home, writes its first element many times.
/// Whether the copy left before or after the home's last write, node 1
/// must read the final value in the next phase: the home compares the page
/// with what it served and pushes it if it changed.
fn false_sharing_node(link: Arc<InProcess>, rounds: u64) -> Result<DsmStats, String> {
    let (rt, dsm) = start(&link, 1)?;
    let per_page = PAGE / 8;
    let v: DsmVec<u64> = dsm
        .vec::<u64>(rounds as usize * per_page)
        .placement(Placement::Node(0))
        .from_fn(|e| e as u64)
        .map_err(|e| e.to_string())?;
    let me = rt.node();
    let bad: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let one = one_per_node(&rt);
    let mut readers = PoolArray::new(&rt, 1);
    if me == 1 {
        readers.pool(0).push(0);
    }
    let mut prog = Program::new();
    prog.phase(
        one,
        |ctx, node| {
            let base = ctx.iteration() as usize * per_page;
            if node == 0 {
                for j in 0..20_000u64 {
                    v.set(base, j);
                }
                v.set(base, 1_000_000 + ctx.iteration());
            } else if v.get(base + per_page - 1) != (base + per_page - 1) as u64 {
                bad.lock()
                    .unwrap()
                    .push(format!("round {}: last element", ctx.iteration()));
            }
        },
        |_| Control::Continue,
    );
    prog.phase(
        readers,
        |ctx, _| {
            let got = v.get(ctx.iteration() as usize * per_page);
            if got != 1_000_000 + ctx.iteration() {
                bad.lock()
                    .unwrap()
                    .push(format!("round {}: first element {got}", ctx.iteration()));
            }
        },
        until(rounds),
    );
    run_checked(&rt, prog, &bad, &dsm)
}

#[test]
fn a_page_served_while_its_home_writes_it_reaches_the_reader() {
    let rounds = 40;
    let st = on_nodes_ok(2, move |l| false_sharing_node(l, rounds));
    // One fetch per round (a new page each round); each page either
    // pushed at the release or served after the home's last write.
    assert_eq!(st[1].total.pages_fetched, rounds);
    assert_eq!(st[0].total.pages_served, rounds);
    assert_eq!(
        st[1].total.pushes_installed, st[0].total.pages_pushed,
        "{:?}",
        st[1].total
    );
}

/// LU's pattern: each round every filament reads a key row chosen in the
/// post-phase code before, and writes its own row; the key row's home
/// broadcasts it (`broadcast_rows`). With `read_in_post`, the post-phase
/// code also copies the key row right after naming it (`read_row`, as an
/// elimination copies its pivot row), which waits for the broadcast
/// rather than requesting the row. Every read is checked against a model
/// every node keeps, and the matrix against it at the end.
fn broadcast_node(
    link: Arc<InProcess>,
    procs: usize,
    rounds: u64,
    read_in_post: bool,
) -> Result<DsmStats, String> {
    let (rt, dsm) = start(&link, procs)?;
    let n = 40;
    let a = dsm
        .matrix::<f64>(n, n)
        .pad_rows()
        .placement(Placement::CyclicRows(0..n))
        .from_fn(|i, j| (i * 1000 + j) as f64)
        .map_err(|e| e.to_string())?;
    let mut model: Vec<f64> = (0..n * n)
        .map(|e| ((e / n) * 1000 + e % n) as f64)
        .collect();
    let key = std::sync::atomic::AtomicUsize::new(0);
    let shared_model = RwLock::new(model.clone());
    let bad: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut prog = Program::new();
    prog.phase(
        PoolArray::cyclic(&rt, 0..n),
        |ctx, i| {
            let k = key.load(std::sync::atomic::Ordering::Relaxed);
            if i == k {
                return;
            }
            let got = a.row(ctx, k).get(i % n);
            let want = shared_model.read().unwrap()[k * n + i % n];
            if got != want {
                bad.lock().unwrap().push(format!(
                    "round {}: row {k} col {i}: {got} not {want}",
                    ctx.iteration()
                ));
            }
            a.row_mut(ctx, i).set(0, got + 1.0);
        },
        |post| {
            let k = key.load(std::sync::atomic::Ordering::Relaxed);
            for i in (0..n).filter(|&i| i != k) {
                model[i * n] = model[k * n + i % n] + 1.0;
            }
            *shared_model.write().unwrap() = model.clone();
            if post.iteration() + 1 >= rounds {
                return Control::Done;
            }
            let next = (post.iteration() as usize + 1) * 7 % n;
            key.store(next, std::sync::atomic::Ordering::Relaxed);
            a.broadcast_rows(post, next..next + 1);
            if read_in_post {
                let mut row = vec![0.0; n];
                a.read_row(next, &mut row);
                if row[..] != model[next * n..(next + 1) * n] {
                    bad.lock().unwrap().push(format!(
                        "round {}: row {next} read in post-phase code differs from the model",
                        post.iteration()
                    ));
                }
            }
            Control::Continue
        },
    );
    let stats = run_checked(&rt, prog, &bad, &dsm)?;
    let got = a.to_vec();
    let want = shared_model.into_inner().unwrap();
    if got != want {
        return Err(format!(
            "node {}: the matrix differs from the model",
            rt.node()
        ));
    }
    Ok(stats)
}

#[test]
fn broadcast_rows_reach_every_node_along_the_tree() {
    let rounds = 12;
    let configs = [(2, 1), (2, 2), (3, 1), (5, 1), (8, 1)];
    // Read by the filaments only, and also by the post-phase code right
    // after the broadcast is named (on fewer configurations: the counts
    // below hold either way, whichever came first).
    let runs =
        configs
            .iter()
            .map(|&c| (c, false))
            .chain([((2, 1), true), ((3, 1), true), ((5, 1), true)]);
    for ((nodes, procs), read_in_post) in runs {
        let st = on_nodes_ok(nodes, move |l| {
            broadcast_node(l, procs, rounds, read_in_post)
        });
        // Each round after the first, the key row's one page reaches the
        // N − 1 other nodes, one message each along the tree.
        let sent: u64 = st.iter().map(|s| s.total.pages_broadcast).sum();
        assert_eq!(
            sent,
            (rounds - 1) * (nodes as u64 - 1),
            "{nodes}x{procs}, read in post-phase: {read_in_post}"
        );
        // Each round's key row is a row no node read before (7 and 40 are
        // coprime), so every node that is not its home gets it once: from
        // the broadcast, or by a fetch that came first (round 0's always).
        let keys: Vec<usize> = (0..rounds as usize).map(|k| k * 7 % 40).collect();
        for (q, s) in st.iter().enumerate() {
            let needed = keys.iter().filter(|&&r| r % nodes != q).count() as u64;
            assert_eq!(
                s.total.pages_fetched + s.total.broadcasts_installed,
                needed,
                "{nodes}x{procs}, read in post-phase: {read_in_post}, node {q}: {:?}",
                s.total
            );
        }
    }
}

/// A program that is not SPMD: node 1 names a row in `broadcast_rows` and
/// node 0, its home, does not. Node 1's release waits for the broadcast,
/// then fails with what to do; the job ends on both nodes.
fn one_sided_broadcast(link: Arc<InProcess>) -> Result<(), String> {
    let (rt, dsm) = start(&link, 1)?;
    let a = dsm
        .matrix::<f64>(4, 8)
        .pad_rows()
        .placement(Placement::CyclicRows(0..4))
        .zeroed()
        .map_err(|e| e.to_string())?;
    let me = rt.node();
    let mut prog = Program::new();
    prog.phase(
        PoolArray::cyclic(&rt, 0..4),
        |ctx, i| a.row_mut(ctx, i).set(0, 1.0),
        |post| {
            if post.iteration() == 1 {
                return Control::Done;
            }
            if me == 1 {
                a.broadcast_rows(post, 0..1);
            }
            Control::Continue
        },
    );
    rt.start(&mut prog).map_err(|e| e.to_string())
}

#[test]
fn a_broadcast_only_one_node_asks_for_fails_the_job_with_the_cause() {
    let t = std::time::Instant::now();
    let r = common::on_nodes(2, one_sided_broadcast);
    let e1 = r[1]
        .as_ref()
        .expect_err("node 1 expected a broadcast that never came");
    assert!(
        e1.contains("never sent") && e1.contains("on every node alike"),
        "{e1}"
    );
    assert!(
        r[0].is_err(),
        "node 0 ends with node 1's failure: {:?}",
        r[0]
    );
    assert!(t.elapsed() < std::time::Duration::from_secs(120));
}

/// Node 1 sends node 0 a malformed `REL` (its notice count promises more
/// than follows) of epoch 1 before the program: node 0 keeps it, unread,
/// until its second release, which then fails. That error is node 0's own
/// finding: node 0 ends the job with it, so node 1, which waits for node
/// 0's `REL`, reports the same cause rather than that node 0 left.
fn malformed_release(link: Arc<InProcess>) -> Result<(), String> {
    let (rt, dsm) = start(&link, 1)?;
    let v = dsm
        .vec::<u64>(64)
        .placement(Placement::Block)
        .zeroed()
        .map_err(|e| e.to_string())?;
    if rt.node() == 1 {
        let mut rel = vec![3u8]; // REL
        rel.extend_from_slice(&1u64.to_le_bytes()); // epoch 1
        rel.extend_from_slice(&5u32.to_le_bytes()); // five notices, none there
        link.port()
            .expect("the in-process link has a port")
            .send_vec(0, hyfi_dsm::SERVICE, hyfi_core::link::Class::Bulk, rel)
            .map_err(|e| e.to_string())?;
    }
    let mut prog = Program::new();
    prog.phase(
        PoolArray::block(&rt, 0..64, 1),
        |_ctx, i| v.set(i, i as u64),
        |post| {
            if post.iteration() == 1 {
                Control::Done
            } else {
                Control::Continue
            }
        },
    );
    rt.start(&mut prog).map_err(|e| e.to_string())
}

#[test]
fn a_malformed_release_ends_the_job_with_its_cause_on_every_node() {
    // Bounded: a node that is not told would wait for its peer's `REL`
    // for ever (that is what this test guards against).
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(common::on_nodes(2, malformed_release)));
    let r = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("both nodes end within 60 s");
    for (me, r) in r.iter().enumerate() {
        let e = r.as_ref().expect_err("the release cannot complete");
        assert!(
            e.contains("a message from node 1") && e.contains("cut short"),
            "node {me}: {e}"
        );
    }
}

/// On more than two nodes the write notices ride in the release's
/// all-reduce (gathered, not sent to every node): a tree (5 and 7 nodes)
/// and recursive doubling (8), several seeds.
#[test]
fn random_multi_writer_rounds_on_five_seven_and_eight_nodes() {
    for (nodes, seed) in [(5, 4), (7, 5), (8, 6), (8, 7)] {
        run(nodes, 1, 8, seed);
    }
}

/// A page its home and another node both write in one phase. On two
/// nodes, once another node wrote the page, the home snapshots it at its
/// write fault and pushes its own writes as a diff, which the other writer
/// applies to its copy: it fetches the page no more. On three, the page
/// held by both others goes through the release's all-reduce whole
/// (gathered), which no receiver may install (it lacks the other
/// writer's bytes): the home sends none but a notice of its own write,
/// which invalidates the other writer's copy. Every node reads both
/// writes in the next phase. Node 0 (the home of page 0)
/// writes its word 0 and node 1 its word 1 in phase A; node 0's filament
/// ends 50 ms after node 1's (whose release then sends its diff at once),
/// so that the diff is applied before node 0 builds its pushes. In phase B
/// every node reads both words (on 3 nodes node 2 holds a copy it never
/// writes).
fn both_write_node(
    link: Arc<InProcess>,
    rounds: u64,
    written: Arc<std::sync::atomic::AtomicU64>,
) -> Result<DsmStats, String> {
    use std::sync::atomic::Ordering::{Acquire, Release};
    let (rt, dsm) = start(&link, 1)?;
    let v: DsmVec<u64> = dsm
        .vec::<u64>(PAGE / 8)
        .placement(Placement::Node(0))
        .from_fn(|_| 0)
        .map_err(|e| e.to_string())?;
    let bad: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let one = one_per_node(&rt);
    let mut prog = Program::new();
    prog.phase(
        one.clone(),
        |ctx, node| {
            let k = ctx.iteration();
            match node {
                0 => {
                    v.set(0, 10 * k + 1);
                    let t = std::time::Instant::now();
                    while written.load(Acquire) <= k && t.elapsed().as_secs() < 10 {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                1 => {
                    v.set(1, 10 * k + 2);
                    written.store(k + 1, Release);
                }
                _ => {}
            }
        },
        |_| Control::Continue,
    );
    prog.phase(
        one,
        |ctx, node| {
            let k = ctx.iteration();
            let got = (v.get(0), v.get(1));
            if got != (10 * k + 1, 10 * k + 2) {
                bad.lock()
                    .unwrap()
                    .push(format!("node {node}, round {k}: read {got:?}"));
            }
        },
        until(rounds),
    );
    run_checked(&rt, prog, &bad, &dsm)
}

#[test]
fn a_page_its_home_and_another_node_write_is_noticed_then_pushed_as_a_diff() {
    let rounds = 6;
    for nodes in [2, 3] {
        let written = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let st = on_nodes_ok(nodes, move |l| both_write_node(l, rounds, written.clone()));
        let home = &st[0].total;
        let writer = &st[1].total;
        if nodes == 2 {
            // From the second or third round on (the first serves and
            // drops settle the copy set), the home's own writes go to the
            // other writer as a diff, which it applies: it fetches the
            // page no more.
            assert!(home.pushes_as_diffs >= rounds - 2, "{home}");
            assert!(writer.pushes_installed >= rounds - 2, "{writer}");
            assert!(writer.pages_fetched <= 3, "{writer}");
        } else {
            // Held by both other nodes, the page's push would ride in the
            // release's all-reduce (gathered), whole, and every receiver
            // would drop it (node 1 wrote it; node 1's notice names it at
            // node 2): node 1's diff came before the home's pushes were
            // built (node 1 had 50 ms to send it), so the home withholds
            // them and notices its own write.
            assert!(home.pushes_withheld >= 1, "{home}");
            assert_eq!(home.pushes_as_diffs, 0, "{home}");
            let installed: u64 = st.iter().map(|s| s.total.pushes_installed).sum();
            assert_eq!(installed, 0, "{home}");
        }
    }
}

/// A phase that writes by columns (node `q` writes column `q` of every
/// row, a row a page, rows homed in blocks): most pages each node writes
/// are homed on the other, release after release. The DSM says so once
/// per node, with what to do (`DsmStats::advice`, printed on standard
/// error); the results are right all the same. Written by rows instead
/// (node `q` its own block of rows, column `q` of each), nothing is said.
fn column_writer_node(
    link: Arc<InProcess>,
    rounds: u64,
    by_columns: bool,
) -> Result<DsmStats, String> {
    let (rt, dsm) = start(&link, 1)?;
    let nodes = rt.num_nodes();
    let (rows, cols) = (64, PAGE / 8);
    let m = dsm
        .matrix::<u64>(rows, cols)
        .placement(Placement::BlockRows(0..rows))
        .from_fn(|_, _| 0)
        .map_err(|e| e.to_string())?;
    let bad: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let one = one_per_node(&rt);
    let mut prog = Program::new();
    prog.phase(
        one.clone(),
        |ctx, q| {
            let mine = if by_columns {
                0..rows
            } else {
                q * rows / nodes..(q + 1) * rows / nodes
            };
            // Never the initial 0: every write changes its page (a row
            // written back to what it was is no write, and a first round
            // that wrote row 0 as 0 made node 1's first release write 31
            // pages homed elsewhere of 63, short of the advice's half, so
            // that under load the other advice came first).
            for i in mine {
                m.set(i, q, 1000 * (ctx.iteration() + 1) + i as u64);
            }
        },
        |_| Control::Continue,
    );
    prog.phase(
        one,
        |ctx, _| {
            let k = ctx.iteration();
            for i in (0..rows).step_by(7) {
                for q in 0..nodes {
                    let written = by_columns || i * nodes / rows == q;
                    let want = 1000 * (k + 1) + i as u64;
                    let got = if written { m.get(i, q) } else { want };
                    if got != want {
                        bad.lock()
                            .unwrap()
                            .push(format!("round {k}: ({i}, {q}) read {got}"));
                    }
                }
            }
        },
        until(rounds),
    );
    run_checked(&rt, prog, &bad, &dsm)
}

#[test]
fn a_phase_that_writes_mostly_pages_homed_elsewhere_is_advised_once() {
    let st = on_nodes_ok(2, move |l| column_writer_node(l, 5, false));
    for s in &st {
        assert_eq!(s.advice, None, "node {}: rows written at home", s.node);
    }
    let st = on_nodes_ok(2, move |l| column_writer_node(l, 5, true));
    for s in &st {
        let a = s
            .advice
            .as_deref()
            .unwrap_or_else(|| panic!("node {}: no advice after 5 column-writing phases", s.node));
        assert!(
            a.contains(&format!(
                "node {}: phase 0 wrote 32 pages homed on other nodes",
                s.node
            )) && a.contains("Placement::BlockRows"),
            "{a}"
        );
        // And in the report (what SIGUSR1 prints on a cluster).
        let report = s.to_string();
        assert!(
            report.contains(&format!("dsm node {} advice: hyfi-dsm", s.node)),
            "{report}"
        );
    }
}

/// Two nodes write their blocks of a vector of `n` `f64`s, split as
/// `PoolArray::block` and `Placement::BlockRows` split `1..n-1`, for
/// `rounds` phases; every element is checked afterwards.
fn split_writer_node(link: Arc<InProcess>, n: usize, rounds: u64) -> Result<DsmStats, String> {
    let (rt, dsm) = start(&link, 1)?;
    let v = dsm
        .vec::<f64>(n)
        .placement(Placement::BlockRows(1..n - 1))
        .from_fn(|_| 0.0)
        .map_err(|e| e.to_string())?;
    let mut prog = Program::new();
    prog.phase(
        PoolArray::block(&rt, 1..n - 1, 1),
        |ctx, i| v.set(i, (ctx.iteration() * n as u64 + i as u64) as f64),
        until(rounds),
    );
    rt.start(&mut prog).map_err(|e| e.to_string())?;
    drop(prog);
    let last = rounds - 1;
    for i in 1..n - 1 {
        let (got, want) = (v.get(i), (last * n as u64 + i as u64) as f64);
        if got != want {
            return Err(format!(
                "node {}: element {i} is {got}, not {want}",
                rt.node()
            ));
        }
    }
    Ok(dsm.stats())
}

/// A vector whose block split falls inside a page (20 000 `f64`s: both
/// nodes write page 19 in every phase): the first releases drop the
/// non-home writer's copy (the home's push would lack its bytes); from
/// then on the home pushes its own writes to it as a diff, which it
/// applies to its copy, so it fetches the page no more and is not
/// advised. A split on a page boundary (20 480) shares no page.
#[test]
fn a_vector_split_inside_a_page_is_fetched_once() {
    let rounds = 5;
    let st = on_nodes_ok(2, move |l| split_writer_node(l, 20_000, rounds));
    for s in &st {
        assert_eq!(s.advice, None, "node {}: {}", s.node, s.total);
    }
    // Page 19 is homed on one of the two; the other fetches it once.
    let fetched: u64 = st.iter().map(|s| s.total.pages_fetched).sum();
    let as_diffs: u64 = st.iter().map(|s| s.total.pushes_as_diffs).sum();
    let installed: u64 = st.iter().map(|s| s.total.pushes_installed).sum();
    // The first rounds settle the copy set (the first fetch, a drop).
    assert!(as_diffs >= rounds - 2, "{st:?}");
    assert!(installed >= rounds - 2, "{st:?}");
    // The final check reads every element: the other node's pages once
    // each (19 and a half of them), page 19 at most twice more.
    assert!(fetched <= 2 + 20 + 20, "{st:?}");
    let st = on_nodes_ok(2, move |l| split_writer_node(l, 20_480, 5));
    for s in &st {
        assert_eq!(
            s.advice, None,
            "node {}: the split falls on a page boundary",
            s.node
        );
    }
}

/// A matrix whose blocks are aligned to pages (`align_blocks`) on 4 nodes:
/// rows of 130 `f64`s (1 040 bytes) in blocks of 32, so the stride grows
/// to 1 152 bytes and the matrix starts partway into its first page. Every
/// row's first page is homed on the node whose block holds the row, each
/// node writes its rows through the checked accessors and reads its
/// neighbours' boundary rows the same way in the next phase, and every
/// value read, and the whole matrix at the end, is the model's.
fn aligned_node(link: Arc<InProcess>, rounds: u64) -> Result<DsmStats, String> {
    const N: usize = 130;
    let (rt, dsm) = start(&link, 1)?;
    let inner = 1..N - 1;
    let m = dsm
        .matrix::<f64>(N, N)
        .placement(Placement::BlockRows(inner.clone()))
        .align_blocks()
        .zeroed()
        .map_err(|e| e.to_string())?;
    assert_eq!(m.stride(), 144, "1 040 bytes rounded up to 128");
    let nodes = rt.num_nodes();
    for i in 0..N {
        let want = if i < inner.start {
            0
        } else {
            (0..nodes)
                .find(|&k| hyfi_core::block(inner.clone(), nodes, k).contains(&i))
                .unwrap_or(nodes - 1)
        };
        if m.home_of_row(i) != want || m.home_of(i, N - 1) != want {
            return Err(format!(
                "row {i}: homed on {} / {}, not {want}",
                m.home_of_row(i),
                m.home_of(i, N - 1)
            ));
        }
    }
    let value = |k: u64, i: usize, j: usize| (k * 1_000_000 + (i * N + j) as u64) as f64;
    let bad: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut prog = Program::new();
    prog.phase(
        PoolArray::block(&rt, inner.clone(), 1),
        |ctx, i| {
            for j in 0..N {
                m.set(i, j, value(ctx.iteration(), i, j));
            }
        },
        |_| Control::Continue,
    );
    prog.phase(
        PoolArray::block(&rt, inner.clone(), 1),
        |ctx, i| {
            let k = ctx.iteration();
            for r in [i - 1, i + 1].into_iter().filter(|r| inner.contains(r)) {
                for j in [0, 1, N / 2, N - 1] {
                    let got = m.get(r, j);
                    if got != value(k, r, j) {
                        bad.lock()
                            .unwrap()
                            .push(format!("round {k}, ({r}, {j}): {got}"));
                    }
                }
            }
        },
        until(rounds),
    );
    let stats = run_checked(&rt, prog, &bad, &dsm)?;
    let last = rounds - 1;
    let all = m.to_vec();
    for i in 0..N {
        for j in 0..N {
            let want = if inner.contains(&i) {
                value(last, i, j)
            } else {
                0.0
            };
            if all[i * N + j] != want {
                return Err(format!("to_vec ({i}, {j}): {} not {want}", all[i * N + j]));
            }
        }
    }
    Ok(stats)
}

#[test]
fn aligned_blocks_keep_each_nodes_rows_on_its_own_pages() {
    let st = on_nodes_ok(4, |l| aligned_node(l, 5));
    for (n, s) in st.iter().enumerate() {
        // Each node writes only pages homed on it: no diff, no notice
        // after the zeroed copies' first.
        assert_eq!(s.total.diffs_sent, 0, "node {n}: {:?}", s.total);
        assert!(
            s.total.pages_fetched + s.total.pushes_installed > 0,
            "node {n}"
        );
    }
}
