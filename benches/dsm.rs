//! hyfi-dsm costs, each against a baseline measured in the same run.
//!
//! * `dsm_fetch` (own timing, not criterion): the latency of a remote page
//!   fetch — a read miss sends the request, the home's communication thread
//!   serves the page, the reply is installed and the filthread resumed —
//!   against a raw TCP 4 KiB request/response between the same two
//!   processes. Two nodes are needed (the DSM region sits at the same
//!   address on every node, so two nodes cannot share a process): this
//!   binary starts two copies of itself as nodes 0 and 1 (`LocalLaunch`,
//!   as `hyfi::init` does for `HYFI_NODES=2`), each with 1 processor, on
//!   loopback.
//!
//!   A vector of `2 × PAGES` pages is homed on node 1. Each round is two
//!   phases: (A) node 1 writes one element of every page; (B) node 0's
//!   single filament reads the same element of each page of one half in
//!   turn (the halves alternate by round), timing each read and checking
//!   the value. Alternating halves keeps every read a miss: a page node 0
//!   read is pushed by its home at the next release (producer push), goes
//!   unused in the next round, is declined, and is requested again the
//!   round after. So every timed read is one miss, one request, one page,
//!   one suspend/resume (checked with the DSM's counters). Baseline `raw_tcp`: a blocking
//!   `std::net::TcpStream` (`TCP_NODELAY`) from node 0's main thread to an
//!   echo thread of node 1: write 16 bytes, read a 4096-byte reply (checked).
//!   Blocks of raw round trips and blocks of DSM rounds alternate, so both
//!   see the same machine; medians per block, and the ratio of medians per
//!   block (its median over the blocks is the figure).
//!
//! * `dsm_jacobi{1024,512}_1p` (criterion): Jacobi, 10 sweeps (eps = 0),
//!   one node of 1 processor. The same hyfi program (one filament per
//!   point, or per row) over the grids as `DsmMatrix`es (`get/set`, or
//!   `row/row_mut` views: every access checks its page's state byte) and as
//!   node-local `SharedMatrix`es (relaxed atomics, no check), and a
//!   sequential loop over `Vec<f64>`. The `SharedMatrix` programs run on a
//!   runtime without a DSM, the DSM programs on one with (its phase-end
//!   hook included). Every variant is checked once against the sequential
//!   grid, bit for bit. The ratios of criterion's median estimates are
//!   printed at the end.
//!
//! Over MPI (`--features mpi`): `mpirun -np 2 target/release/deps/dsm-* --bench
//! dsm_fetch` runs the fetch part alone over the site's MPI, against a raw
//! MPI ping-pong of the same sizes between the same two processes
//! (`hyfi_net::mpi::raw_round_trips`, on their communication threads), and
//! against the same ping-pong with the reply in the pieces hyfi sends a
//! page in (`raw_round_trips_in_pieces`), which shows hyfi's own cost.
//!
//! Run with `cargo bench --bench dsm -- --noplot` (about 2 minutes). A
//! criterion filter that does not match `dsm_fetch` skips the fetch part;
//! without `--bench` (as under `cargo test --benches`) the fetch part runs
//! one short block, as a smoke test.

use hyfi::layers::RuntimeExt;
use std::hint::black_box;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode};
use hyfi::{
    Config, Control, Ctx, Dsm, DsmMatrix, Op, Placement, PoolArray, Program, Reduction, Runtime,
};
// hyfi-core's node-local matrix, which the facade no longer offers: kept
// here as the reference the DSM's one-node path was measured against.
use hyfi_core::SharedMatrix;

// ------------------------------------------------------------ page fetch

/// Pages of the fetched vector (u64 elements, 512 per 4 KiB page).
const PAGES: usize = 64;
const PER_PAGE: usize = 4096 / 8;
/// Rounds (write phase + read phase) per DSM block.
const ROUNDS: usize = 20;
/// Alternating (raw, DSM) blocks.
const BLOCKS: usize = 9;
/// Raw round trips per raw block (as many as DSM fetches per block).
const RAW_PER_BLOCK: usize = PAGES * ROUNDS;
const REQ: usize = 16;
const REPLY: usize = 4096;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn pct(v: &[f64], p: f64) -> f64 {
    // v sorted
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// The launcher side: starts two copies of this binary as nodes 0 and 1.
fn launch_fetch() {
    let program = std::env::current_exe().expect("current_exe");
    let launch = hyfi_net::launch::LocalLaunch {
        nodes: 2,
        procs: None,
        program,
        args: std::env::args_os().skip(1).collect(),
        timeout: Some(Duration::from_secs(180)),
    };
    let outcome = launch.run().expect("launching the two fetch nodes");
    assert!(
        outcome.success(),
        "dsm_fetch: a node failed (exit code {})",
        outcome.exit_code()
    );
}

/// One node of the fetch benchmark (this process was started by
/// [`launch_fetch`]).
fn fetch_node(full: bool) {
    let (blocks, rounds) = if full { (BLOCKS, ROUNDS) } else { (1, 2) };
    // Default placement: each of the two local nodes pinned to its own CPU.
    let rt = hyfi::init_nodes(Config::new().procs(1), None).expect("hyfi::init");
    assert_eq!(rt.num_nodes(), 2, "dsm_fetch runs on 2 nodes");
    let me = rt.node();
    let dsm = Dsm::new(&rt).expect("Dsm::new");
    let v = dsm
        .vec::<u64>(2 * PAGES * PER_PAGE)
        .placement(Placement::Node(1))
        .zeroed()
        .expect("shared vector");
    assert!((0..2 * PAGES).all(|p| v.home_of(p * PER_PAGE) == 1));

    // Raw baseline: over TCP, node 0 connects to an echo thread of node 1;
    // over MPI, the two communication threads ping-pong with MPI_Send and
    // MPI_Recv (`hyfi_net::mpi::raw_round_trips`).
    let over_mpi =
        hyfi_net::Transport::from_env().expect("HYFI_TRANSPORT") == hyfi_net::Transport::Mpi;
    let raw_name = if over_mpi { "raw_mpi" } else { "raw_tcp" };
    let listener = (me == 1 && !over_mpi).then(|| TcpListener::bind("127.0.0.1:0").expect("bind"));
    let mut port = listener
        .as_ref()
        .map_or(0u64, |l| u64::from(l.local_addr().expect("addr").port()));
    {
        let mut b = port.to_le_bytes();
        rt.link()
            .allreduce(&mut b, &mut |acc, o| {
                let x = u64::from_le_bytes(acc.try_into().unwrap())
                    .max(u64::from_le_bytes(o.try_into().unwrap()));
                acc.copy_from_slice(&x.to_le_bytes());
            })
            .expect("allreduce");
        port = u64::from_le_bytes(b);
    }
    let mut client = None;
    let echo = if let Some(l) = listener {
        let (mut s, _) = l.accept().expect("accept");
        s.set_nodelay(true).expect("nodelay");
        Some(std::thread::spawn(move || {
            let (mut req, mut reply) = ([0u8; REQ], vec![0u8; REPLY]);
            while s.read_exact(&mut req).is_ok() {
                // The reply carries the request's counter, checked by node 0.
                reply[..8].copy_from_slice(&req[..8]);
                reply[REPLY - 8..].copy_from_slice(&req[..8]);
                if s.write_all(&reply).is_err() {
                    break;
                }
            }
        }))
    } else {
        if !over_mpi {
            let s = TcpStream::connect(("127.0.0.1", port as u16)).expect("connect");
            s.set_nodelay(true).expect("nodelay");
            client = Some(s);
        }
        None
    };

    let mut raw_med = Vec::new();
    let mut dsm_med = Vec::new();
    let mut ratios = Vec::new();
    let (mut raw_all, mut dsm_all) = (Vec::new(), Vec::new());
    // Over MPI, also the raw round trip with the reply in pieces, as hyfi
    // sends a page (hyfi's own cost shows against it).
    let (mut pieced_all, mut pieced_ratios) = (Vec::new(), Vec::new());
    let mut pieced = Vec::new();
    let mut counter = 0u64;
    let mut fetched_before = dsm.stats().total.pages_fetched;
    for block in 0..blocks {
        // Raw block (node 0 asks, node 1's echo thread answers).
        let mut raw = Vec::with_capacity(RAW_PER_BLOCK);
        let n_raw = if full { RAW_PER_BLOCK } else { 50 };
        if over_mpi {
            raw = raw_mpi(me, n_raw, false);
            pieced = raw_mpi(me, n_raw, true);
        } else if let Some(c) = client.as_mut() {
            let mut req = [0u8; REQ];
            let mut reply = vec![0u8; REPLY];
            let n = if full { RAW_PER_BLOCK } else { 50 };
            for _ in 0..n {
                counter += 1;
                req[..8].copy_from_slice(&counter.to_le_bytes());
                let t = Instant::now();
                c.write_all(&req).expect("raw write");
                c.read_exact(&mut reply).expect("raw read");
                raw.push(t.elapsed().as_nanos() as f64);
                assert_eq!(reply[..8], counter.to_le_bytes());
                assert_eq!(reply[REPLY - 8..], counter.to_le_bytes());
            }
        }
        rt.link().barrier().expect("barrier");

        // DSM block: `rounds` × (node 1 writes every page; node 0 reads each).
        let lat = Mutex::new(Vec::<f64>::with_capacity(PAGES * rounds));
        let bad = Mutex::new(Vec::<String>::new());
        let mut round = 0usize;
        let base = block as u64 + 1; // distinct values per block (same on both nodes)
        let value =
            |round: usize, p: usize| base * 1_000_000 + (round as u64 + 1) * 1000 + p as u64;
        let mut prog = Program::new();
        prog.phase(
            PoolArray::block(&rt, 0..2, 1),
            |ctx: &Ctx, i: usize| {
                if i == 1 {
                    let r = ctx.iteration() as usize;
                    for p in 0..2 * PAGES {
                        v.set(p * PER_PAGE, value(r, p));
                    }
                }
            },
            |_| Control::Continue,
        );
        prog.phase(
            PoolArray::block(&rt, 0..2, 1),
            |ctx: &Ctx, i: usize| {
                if i == 0 {
                    let r = ctx.iteration() as usize;
                    let mut mine = Vec::with_capacity(PAGES);
                    let half = (block * rounds + r) % 2;
                    for p in half * PAGES..(half + 1) * PAGES {
                        let t = Instant::now();
                        let x = black_box(v.get(p * PER_PAGE));
                        mine.push(t.elapsed().as_nanos() as f64);
                        if x != value(r, p) {
                            bad.lock().unwrap().push(format!(
                                "round {r} page {p}: read {x}, expected {}",
                                value(r, p)
                            ));
                        }
                    }
                    lat.lock().unwrap().extend(mine);
                }
            },
            |_| {
                round += 1;
                if round >= rounds {
                    Control::Done
                } else {
                    Control::Continue
                }
            },
        );
        rt.start(&mut prog).expect("dsm rounds");
        drop(prog);
        let bad = bad.into_inner().unwrap();
        assert!(bad.is_empty(), "dsm_fetch read wrong values: {bad:?}");
        let fetched = dsm.stats().total.pages_fetched;
        if me == 0 {
            // Every timed read was exactly one page fetched from node 1.
            assert_eq!(
                fetched - fetched_before,
                (PAGES * rounds) as u64,
                "pages fetched in a block"
            );
            let mut lat = lat.into_inner().unwrap();
            assert_eq!(lat.len(), PAGES * rounds);
            raw_all.extend_from_slice(&raw);
            dsm_all.extend_from_slice(&lat);
            let (r, d) = (median(&mut raw), median(&mut lat));
            if over_mpi {
                pieced_all.extend_from_slice(&pieced);
                pieced_ratios.push(d / median(&mut pieced));
            }
            raw_med.push(r);
            dsm_med.push(d);
            ratios.push(d / r);
        }
        fetched_before = fetched;
        rt.link().barrier().expect("barrier");
    }
    drop(client);
    if let Some(h) = echo {
        h.join().expect("echo thread");
    }
    if me == 0 {
        let (rm, dm) = (median(&mut raw_all), median(&mut dsm_all));
        println!(
            "dsm_fetch: {blocks} blocks × ({} {raw_name} 16 B → 4 KiB round trips, {} page \
             fetches); per-block medians in µs:",
            if full { RAW_PER_BLOCK } else { 50 },
            PAGES * rounds
        );
        for k in 0..raw_med.len() {
            println!(
                "dsm_fetch:   block {k}: {raw_name} {:7.2}  dsm_fetch {:7.2}  ratio {:.2}",
                raw_med[k] / 1e3,
                dsm_med[k] / 1e3,
                ratios[k]
            );
        }
        println!(
            "dsm_fetch: all samples: {raw_name} median {:.2} µs (p10 {:.2}, p90 {:.2}); \
             dsm_fetch median {:.2} µs (p10 {:.2}, p90 {:.2})",
            rm / 1e3,
            pct(&raw_all, 0.1) / 1e3,
            pct(&raw_all, 0.9) / 1e3,
            dm / 1e3,
            pct(&dsm_all, 0.1) / 1e3,
            pct(&dsm_all, 0.9) / 1e3
        );
        let mut rs = ratios.clone();
        let lo = rs.iter().cloned().fold(f64::INFINITY, f64::min);
        let hi = rs.iter().cloned().fold(0.0, f64::max);
        println!(
            "dsm_fetch: RESULT remote page fetch / {raw_name} 4 KiB round trip = {:.2} \
             (median of per-block ratios, range {lo:.2}–{hi:.2}); {:.2} (ratio of the \
             medians of all samples); target ≤ 1.50",
            median(&mut rs),
            dm / rm
        );
        if over_mpi {
            let pm = median(&mut pieced_all);
            println!(
                "dsm_fetch: raw_mpi with the reply in pieces of {} B (as hyfi sends a page) \
                 median {:.2} µs; remote page fetch / it = {:.2} (median of per-block ratios)",
                hyfi_piece(),
                pm / 1e3,
                median(&mut pieced_ratios)
            );
        }
        println!("dsm_fetch: {}", dsm.stats().total);
    }
}

#[cfg(feature = "mpi")]
fn hyfi_piece() -> usize {
    hyfi_net::mpi::PIECE
}

#[cfg(not(feature = "mpi"))]
fn hyfi_piece() -> usize {
    unreachable!("HYFI_TRANSPORT=mpi is refused without the feature")
}

/// Raw MPI round trips, 16 bytes out and 4 KiB back (whole, or in pieces
/// as hyfi sends a page), node 0 asking node 1: their times in ns on node 0.
#[cfg(feature = "mpi")]
fn raw_mpi(me: usize, n: usize, pieces: bool) -> Vec<f64> {
    let f = if pieces {
        hyfi_net::mpi::raw_round_trips_in_pieces
    } else {
        hyfi_net::mpi::raw_round_trips
    };
    let t = f(1 - me, me == 0, REQ, REPLY, n).expect("raw MPI");
    t.iter().map(|d| d.as_nanos() as f64).collect()
}

#[cfg(not(feature = "mpi"))]
fn raw_mpi(_: usize, _: usize, _: bool) -> Vec<f64> {
    unreachable!("HYFI_TRANSPORT=mpi is refused without the feature")
}

// ------------------------------------------------------------- Jacobi 1×1

/// Boundary 1.0, interior 0.5: values stay in [0.5, 1], so no subnormals
/// appear however many sweeps criterion accumulates on the same grids.
fn init(n: usize) -> impl Fn(usize, usize) -> f64 {
    move |i, j| {
        if i == 0 || j == 0 || i == n - 1 || j == n - 1 {
            1.0
        } else {
            0.5
        }
    }
}

#[inline(always)]
fn average(up: f64, down: f64, left: f64, right: f64) -> f64 {
    (up + down + left + right) * 0.25
}

/// The best straightforward sequential loop: row slices, `if d > m`.
fn seq(old: &mut Vec<f64>, new: &mut Vec<f64>, n: usize, iters: u64) -> f64 {
    let mut m = 0.0f64;
    for _ in 0..iters {
        m = 0.0;
        for i in 1..n - 1 {
            let (up, mid, down) = (
                &old[(i - 1) * n..i * n],
                &old[i * n..(i + 1) * n],
                &old[(i + 1) * n..(i + 2) * n],
            );
            let out = &mut new[i * n..(i + 1) * n];
            for j in 1..n - 1 {
                let v = average(up[j], down[j], mid[j - 1], mid[j + 1]);
                out[j] = v;
                let d = (v - mid[j]).abs();
                if d > m {
                    m = d;
                }
            }
        }
        std::mem::swap(old, new);
    }
    m
}

fn post<'a>(
    maxdiff: &'a Reduction<f64>,
    iters: u64,
) -> impl FnMut(&mut hyfi::PostPhase<'_>) -> Control + Send + 'a {
    move |post| {
        let m = post.reduce(maxdiff, Op::Max);
        post.set(maxdiff, 0.0);
        black_box(m);
        if post.iteration() + 1 >= iters {
            Control::Done
        } else {
            Control::Continue
        }
    }
}

/// The grids: node-local, or in the DSM (rows padded to pages, homed by
/// blocks of rows as in `examples/jacobi.rs`; one node owns them all here).
enum Grids {
    Local([SharedMatrix<f64>; 2]),
    Dsm([DsmMatrix<f64>; 2]),
}

impl Grids {
    fn local(n: usize) -> Self {
        Grids::Local([
            SharedMatrix::from_fn(n, n, init(n)),
            SharedMatrix::from_fn(n, n, init(n)),
        ])
    }
    fn dsm(dsm: &Dsm, n: usize) -> Self {
        let g = || {
            dsm.matrix::<f64>(n, n)
                .pad_rows()
                .placement(Placement::BlockRows(1..n - 1))
                .from_fn(init(n))
                .expect("dsm matrix")
        };
        Grids::Dsm([g(), g()])
    }
    fn to_vec(&self, k: usize) -> Vec<f64> {
        match self {
            Grids::Local(g) => g[k].to_vec(),
            Grids::Dsm(g) => g[k].to_vec(),
        }
    }
}

/// Element access both grid kinds offer, so that the per-point program is
/// written once for both (the per-row ones differ: DSM views take `ctx`).
trait Grid: Sync {
    fn get(&self, i: usize, j: usize) -> f64;
    fn set(&self, i: usize, j: usize, v: f64);
}

impl Grid for SharedMatrix<f64> {
    #[inline(always)]
    fn get(&self, i: usize, j: usize) -> f64 {
        SharedMatrix::get(self, i, j)
    }
    #[inline(always)]
    fn set(&self, i: usize, j: usize, v: f64) {
        SharedMatrix::set(self, i, j, v)
    }
}

impl Grid for DsmMatrix<f64> {
    #[inline(always)]
    fn get(&self, i: usize, j: usize) -> f64 {
        DsmMatrix::get(self, i, j)
    }
    #[inline(always)]
    fn set(&self, i: usize, j: usize, v: f64) {
        DsmMatrix::set(self, i, j, v)
    }
}

/// The per-point Jacobi phase over `g` (monomorphized per grid kind).
fn point_phase<'a, G: Grid>(
    prog: &mut Program<'a>,
    rt: &Runtime,
    n: usize,
    g: &'a [G; 2],
    maxdiff: &'a Reduction<f64>,
    iters: u64,
) {
    prog.phase(
        PoolArray::block_rows(rt, 1..n - 1, 1..n - 1, 1),
        move |ctx: &Ctx, (i, j): (usize, usize)| {
            let k = ctx.iteration() as usize;
            let (old, new) = (&g[k % 2], &g[(k + 1) % 2]);
            let v = average(
                old.get(i - 1, j),
                old.get(i + 1, j),
                old.get(i, j - 1),
                old.get(i, j + 1),
            );
            new.set(i, j, v);
            let d = (v - old.get(i, j)).abs();
            maxdiff.update(ctx, |m| m.max(d));
        },
        post(maxdiff, iters),
    );
}

/// The footprint form (`Program::phase_with`, as `examples/jacobi.rs`):
/// read view of the old grid with a one-row halo, write view of the new
/// grid's rows, a segment-local maximum; one filament per point or per row.
fn footprint_program<'a>(
    rt: &Runtime,
    n: usize,
    g: &'a [DsmMatrix<f64>; 2],
    maxdiff: &'a Reduction<f64>,
    iters: u64,
    per_row: bool,
) -> Program<'a> {
    let bind = move |ctx: &Ctx, span: &hyfi::Span| {
        let k = ctx.iteration() as usize;
        (
            g[k % 2].read_rows(ctx, span.rows_with_halo(1, n)),
            g[(k + 1) % 2].write_rows(ctx, span.rows()),
            maxdiff.local(ctx, Op::Max),
        )
    };
    let mut prog = Program::new();
    if per_row {
        prog.phase_with(
            PoolArray::<usize>::block(rt, 1..n - 1, 1),
            bind,
            move |_ctx, i, (old, new, m)| {
                let (up, mid, down) = (old.row(i - 1), old.row(i), old.row(i + 1));
                let out = new.row_mut(i);
                let mut row_max = 0.0f64;
                for j in 1..n - 1 {
                    let v = average(up[j], down[j], mid[j - 1], mid[j + 1]);
                    out.set(j, v);
                    let d = (v - mid[j]).abs();
                    if d > row_max {
                        row_max = d;
                    }
                }
                m.fold(row_max);
            },
            post(maxdiff, iters),
        );
    } else {
        prog.phase_with(
            PoolArray::block_rows(rt, 1..n - 1, 1..n - 1, 1),
            bind,
            |_ctx, (i, j), (old, new, m)| {
                let v = average(
                    old[(i - 1, j)],
                    old[(i + 1, j)],
                    old[(i, j - 1)],
                    old[(i, j + 1)],
                );
                new.set(i, j, v);
                m.fold((v - old[(i, j)]).abs());
            },
            post(maxdiff, iters),
        );
    }
    prog
}

/// The hyfi Jacobi program over `grids`, one filament per point or per row,
/// through the checked per-element accessors.
fn program<'a>(
    rt: &Runtime,
    n: usize,
    grids: &'a Grids,
    maxdiff: &'a Reduction<f64>,
    iters: u64,
    per_row: bool,
) -> Program<'a> {
    let mut prog = Program::new();
    match (grids, per_row) {
        (Grids::Local(g), false) => point_phase(&mut prog, rt, n, g, maxdiff, iters),
        (Grids::Dsm(g), false) => point_phase(&mut prog, rt, n, g, maxdiff, iters),
        (Grids::Local(g), true) => {
            prog.phase(
                PoolArray::<usize>::block(rt, 1..n - 1, 1),
                move |ctx: &Ctx, i: usize| {
                    let k = ctx.iteration() as usize;
                    let (old, new) = (&g[k % 2], &g[(k + 1) % 2]);
                    let (up, mid, down, out) =
                        (old.row(i - 1), old.row(i), old.row(i + 1), new.row(i));
                    let mut m = 0.0f64;
                    for j in 1..n - 1 {
                        let v = average(up.get(j), down.get(j), mid.get(j - 1), mid.get(j + 1));
                        out.set(j, v);
                        m = m.max((v - mid.get(j)).abs());
                    }
                    maxdiff.update(ctx, |x| x.max(m));
                },
                post(maxdiff, iters),
            );
        }
        (Grids::Dsm(g), true) => {
            prog.phase(
                PoolArray::<usize>::block(rt, 1..n - 1, 1),
                move |ctx: &Ctx, i: usize| {
                    let k = ctx.iteration() as usize;
                    let (old, new) = (&g[k % 2], &g[(k + 1) % 2]);
                    let (up, mid, down) =
                        (old.row(ctx, i - 1), old.row(ctx, i), old.row(ctx, i + 1));
                    let out = new.row_mut(ctx, i);
                    let mut m = 0.0f64;
                    for j in 1..n - 1 {
                        let v = average(up.get(j), down.get(j), mid.get(j - 1), mid.get(j + 1));
                        out.set(j, v);
                        m = m.max((v - mid.get(j)).abs());
                    }
                    maxdiff.update(ctx, |x| x.max(m));
                },
                post(maxdiff, iters),
            );
        }
    }
    prog
}

/// Runs the hyfi program once on fresh grids; bit-for-bit against `want`.
fn check(rt: &Runtime, dsm: Option<&Dsm>, n: usize, iters: u64, per_row: bool, want: &[f64]) {
    let grids = match dsm {
        Some(d) => Grids::dsm(d, n),
        None => Grids::local(n),
    };
    let maxdiff = rt.reduction(0.0f64);
    let mut prog = program(rt, n, &grids, &maxdiff, iters, per_row);
    rt.start(&mut prog).expect("jacobi");
    drop(prog);
    assert!(
        grids.to_vec((iters % 2) as usize) == want,
        "Jacobi over {} grids (per_row={per_row}) differs from the sequential loop",
        if dsm.is_some() { "DSM" } else { "SharedMatrix" }
    );
}

const VARIANTS: [&str; 7] = [
    "baseline_seq_vec",
    "shared_matrix_per_point",
    "dsm_per_point",
    "shared_matrix_per_row",
    "dsm_per_row",
    "dsm_footprint_per_point",
    "dsm_footprint_per_row",
];

fn jacobi_group(c: &mut Criterion, n: usize, iters: u64) {
    let name = format!("dsm_jacobi{n}_1p");
    let cfg = || Config::new().procs(1).pin(false);
    // The reference grid, and the check of every variant.
    let v0: Vec<f64> = (0..n * n).map(|k| init(n)(k / n, k % n)).collect();
    let (mut want, mut tmp) = (v0.clone(), v0.clone());
    seq(&mut want, &mut tmp, n, iters);

    let mut g = c.benchmark_group(&name);
    g.sampling_mode(SamplingMode::Flat)
        .sample_size(15)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));

    let (mut old, mut new) = (v0.clone(), v0.clone());
    g.bench_function(VARIANTS[0], |b| {
        b.iter(|| seq(&mut old, &mut new, n, iters))
    });
    drop((old, new));

    // Node-local grids, on a runtime without a DSM.
    {
        let rt = Runtime::new(cfg()).expect("runtime");
        let maxdiff = rt.reduction(0.0f64);
        for (per_row, id) in [(false, VARIANTS[1]), (true, VARIANTS[3])] {
            check(&rt, None, n, iters, per_row, &want);
            let grids = Grids::local(n);
            let mut prog = program(&rt, n, &grids, &maxdiff, iters, per_row);
            g.bench_function(id, |b| b.iter(|| rt.start(&mut prog).expect("jacobi")));
        }
    }
    // DSM grids, on a runtime with one.
    {
        let rt = Runtime::new(cfg()).expect("runtime");
        let dsm = Dsm::new(&rt).expect("Dsm::new");
        let maxdiff = rt.reduction(0.0f64);
        for (per_row, id) in [(false, VARIANTS[2]), (true, VARIANTS[4])] {
            check(&rt, Some(&dsm), n, iters, per_row, &want);
            let grids = Grids::dsm(&dsm, n);
            let mut prog = program(&rt, n, &grids, &maxdiff, iters, per_row);
            g.bench_function(id, |b| b.iter(|| rt.start(&mut prog).expect("jacobi")));
        }
        for (per_row, id) in [(false, VARIANTS[5]), (true, VARIANTS[6])] {
            let grids = Grids::dsm(&dsm, n);
            let Grids::Dsm(gr) = &grids else {
                unreachable!("Grids::dsm makes DSM grids")
            };
            let mut prog = footprint_program(&rt, n, gr, &maxdiff, iters, per_row);
            rt.start(&mut prog).expect("jacobi");
            drop(prog);
            assert!(
                grids.to_vec((iters % 2) as usize) == want,
                "footprint Jacobi (per_row={per_row}) differs from the sequential loop"
            );
            let mut prog = footprint_program(&rt, n, gr, &maxdiff, iters, per_row);
            g.bench_function(id, |b| b.iter(|| rt.start(&mut prog).expect("jacobi")));
        }
        let s = dsm.stats().total;
        // One node: every page is home and writable; nothing may move.
        assert_eq!(s.pages_fetched + s.messages_sent + s.read_faults, 0);
    }
    g.finish();
}

/// Criterion's median point estimate (ns) of `group/id`, from its
/// `estimates.json`.
fn criterion_median(group: &str, id: &str) -> Option<f64> {
    let dir = std::env::var_os("CRITERION_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("CARGO_TARGET_DIR").map(|t| std::path::Path::new(&t).join("criterion"))
        })
        .unwrap_or_else(|| "target/criterion".into());
    let text = std::fs::read_to_string(dir.join(group).join(id).join("new/estimates.json")).ok()?;
    let at = text.find("\"median\"")?;
    let rest = &text[at..];
    let pe = rest.find("\"point_estimate\":")? + "\"point_estimate\":".len();
    let num: String = rest[pe..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '-' | '+'))
        .collect();
    num.parse().ok()
}

fn jacobi_summary(groups: &[usize]) {
    for &n in groups {
        let group = format!("dsm_jacobi{n}_1p");
        let t: Vec<Option<f64>> = VARIANTS
            .iter()
            .map(|v| criterion_median(&group, v))
            .collect();
        let ms = |x: Option<f64>| x.map_or("—".to_string(), |x| format!("{:.2} ms", x / 1e6));
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => format!("{:.3}", a / b),
            _ => "—".into(),
        };
        println!(
            "{group}: seq Vec {}; per point: SharedMatrix {} DSM {}; per row: SharedMatrix {} DSM {}",
            ms(t[0]),
            ms(t[1]),
            ms(t[2]),
            ms(t[3]),
            ms(t[4])
        );
        println!(
            "{group}: RESULT per point: DSM/SharedMatrix {}  DSM/Vec {} | per row: DSM/SharedMatrix {}  DSM/Vec {} (checked accessors)",
            ratio(t[2], t[1]),
            ratio(t[2], t[0]),
            ratio(t[4], t[3]),
            ratio(t[4], t[0])
        );
        println!(
            "{group}: RESULT footprint views / best sequential loop: per point {} (target ≤ 1.10) | per row {} (target ≤ 1.05); footprint per point {}, per row {}",
            ratio(t[5], t[0]),
            ratio(t[6], t[0]),
            ms(t[5]),
            ms(t[6])
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    // As criterion decides: `--bench` without `--test` measures; anything
    // else (`cargo test --benches`) is a smoke test.
    let full = has("--bench") && !has("--test");
    // A node of the fetch pair: started by `launch_fetch` (hyfi's launcher)
    // or by `mpirun -np 2` (over MPI or TCP, as HYFI_TRANSPORT says).
    if std::env::var_os("HYFI_RANK").is_some() || std::env::var_os("OMPI_COMM_WORLD_RANK").is_some()
    {
        fetch_node(full);
        return;
    }
    // Criterion's filter (the first positional argument), if any.
    let filter = args.iter().find(|a| !a.starts_with('-')).cloned();
    let fetch_only = filter.as_deref().is_some_and(|f| f.contains("fetch"));
    let fetch = filter
        .as_deref()
        .map_or(true, |f| fetch_only || "dsm_fetch".contains(f));
    if fetch && !has("--list") {
        launch_fetch();
    }
    let mut c = Criterion::default().configure_from_args();
    let mut ran = Vec::new();
    if !fetch_only {
        for (n, iters) in [(1024usize, 10u64), (512, 20)] {
            jacobi_group(&mut c, n, iters);
            let group = format!("dsm_jacobi{n}_1p");
            if filter.as_deref().map_or(true, |f| group.contains(f)) {
                ran.push(n);
            }
        }
    }
    c.final_summary();
    if full {
        jacobi_summary(&ran);
    }
}
