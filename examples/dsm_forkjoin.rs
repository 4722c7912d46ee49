//! Shared arrays written by fork-join filaments, read everywhere after the
//! run: checks that `rt.run` and `run_distributed` end with a release.
//!
//! Two checks, each against values computed independently (`want`):
//!
//! 1. **local runs** (`rt.run` on every node): node `k`'s fork-join
//!    filaments write every element of vector `k`, whose pages are all
//!    homed on the *next* node. Then every node runs a program whose
//!    filaments read every element of every vector (the next collective
//!    step begins with a release), and afterwards reads them all again from
//!    the main thread.
//! 2. **distributed run** (`run_distributed`): filaments spread over every
//!    node write every element of a cyclically placed vector (pages homed
//!    on every node, written from anywhere); when the run returns, every
//!    node reads every element from the main thread, with no phase between.
//!
//! ```text
//! cargo run --release --example dsm_forkjoin -- --nodes 2 --procs 2
//! ```
//!
//! Prints `dsm_forkjoin: OK ...` per node; exits 1 naming the first stale
//! element, 2 for a configuration error (README: exit codes).

#[path = "common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use clap::Parser;
use hyfi::{Control, Ctx, Dsm, DsmVec, Placement, PoolArray, Program, RemoteFn, Runtime};

/// Shared arrays written by fork-join filaments.
#[derive(Parser, Debug, Clone)]
#[command(name = "dsm_forkjoin")]
pub struct Args {
    /// Elements per vector (several pages of u64).
    #[arg(long, default_value_t = 20_000)]
    pub len: usize,
    /// Runtime options (--nodes, --procs, --pin/--no-pin).
    #[command(flatten)]
    pub runtime: common::RuntimeArgs,
}

/// What element `i` of vector `k` must hold (any injective mix will do).
fn want(k: usize, i: usize) -> u64 {
    ((k as u64 + 1) << 40) ^ (i as u64).wrapping_mul(0x9e37_79b9) ^ 0x5a5a
}

/// Writes `want(k, i)` into `v[lo..hi]`, forking down to 256 elements.
fn fill(ctx: &Ctx, v: &DsmVec<u64>, k: usize, lo: usize, hi: usize) {
    if hi - lo <= 256 {
        for i in lo..hi {
            v.set(i, want(k, i));
        }
        return;
    }
    let mid = lo + (hi - lo) / 2;
    ctx.join(|c| fill(c, v, k, lo, mid), |c| fill(c, v, k, mid, hi));
}

/// The distributed run's vector: shared with the runtime on every node
/// (`rt.share`), where a remote filament finds it (`ctx.shared`).
struct Distributed(DsmVec<u64>);
/// Which vector index `want` uses for the distributed run.
const DIST: usize = 1000;

/// Writes `want(DIST, i)` into the distributed vector's `[lo..hi]`,
/// forking remotely.
fn fill_remote(ctx: &Ctx, (lo, hi): (u64, u64)) -> u64 {
    if hi - lo <= 512 {
        let v = ctx.shared::<Distributed>(); // this node's copy
        for i in lo..hi {
            v.0.set(i as usize, want(DIST, i as usize));
        }
        return hi - lo;
    }
    let mid = lo + (hi - lo) / 2;
    let (a, b) = ctx.join_remote(|c| fill_remote(c, (lo, mid)), &FILL, (mid, hi));
    a + b
}
static FILL: RemoteFn<(u64, u64), u64> = RemoteFn::new("dsm_forkjoin::fill", fill_remote);

/// The first element of `v` (vector `k`) that does not hold `want`.
fn first_stale(v: &DsmVec<u64>, k: usize) -> Option<String> {
    let got = v.to_vec();
    (0..v.len()).find(|&i| got[i] != want(k, i)).map(|i| {
        format!(
            "vector {k}, element {i}: {:#x}, expected {:#x}",
            got[i],
            want(k, i)
        )
    })
}

fn run(rt: &Runtime, dsm: &Dsm, len: usize) -> Result<String, String> {
    let (me, nodes) = (rt.node(), rt.num_nodes());
    let err = |e: &dyn std::fmt::Display| format!("node {me}: {e}");

    // 1. Local runs. Vector k is homed on node (k + 1) % nodes, written by node k.
    let vecs: Vec<DsmVec<u64>> = (0..nodes)
        .map(|k| {
            dsm.vec::<u64>(len)
                .placement(Placement::Node((k + 1) % nodes))
                .zeroed()
        })
        .collect::<Result<_, _>>()
        .map_err(|e| err(&e))?;
    rt.run(|ctx| fill(ctx, &vecs[me], me, 0, len))
        .map_err(|e| err(&e))?;
    let stale = AtomicU64::new(0);
    let first: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);
    let mut prog = Program::new();
    prog.phase(
        PoolArray::block(rt, 0..nodes * len, 2),
        |_ctx, g| {
            let (k, i) = (g / len, g % len);
            let got = vecs[k].get(i);
            if got != want(k, i) {
                stale.fetch_add(1, Relaxed);
                first.lock().unwrap().get_or_insert(format!(
                    "in the next program: vector {k}, element {i}: {got:#x}, expected {:#x}",
                    want(k, i)
                ));
            }
        },
        |_| Control::Done,
    );
    rt.start(&mut prog).map_err(|e| err(&e))?;
    drop(prog);
    if let Some(f) = first.into_inner().unwrap() {
        return Err(format!(
            "node {me}: {} stale elements after rt.run; first {f}",
            stale.load(Relaxed)
        ));
    }
    for (k, v) in vecs.iter().enumerate() {
        if let Some(f) = first_stale(v, k) {
            return Err(format!("node {me}: after rt.run and a program: {f}"));
        }
    }

    // 2. A distributed run, read right after it returns.
    let shared = dsm
        .vec::<u64>(len)
        .placement(Placement::Cyclic)
        .zeroed()
        .map_err(|e| err(&e))?;
    let dist = rt.share(Distributed(shared));
    let v = &dist.0;
    let wrote = rt
        .run_distributed(|ctx| fill_remote(ctx, (0, len as u64)))
        .map_err(|e| err(&e))?;
    if wrote != len as u64 {
        return Err(format!(
            "node {me}: the run wrote {wrote} elements, not {len}"
        ));
    }
    if let Some(f) = first_stale(v, DIST) {
        return Err(format!("node {me}: right after run_distributed: {f}"));
    }
    let st = dsm.stats();
    Ok(format!(
        "checked={} fetched={} diffs={}",
        (nodes + 1) * len,
        st.total.pages_fetched,
        st.total.diffs_sent
    ))
}

fn main() {
    let args = Args::parse();
    let rt = common::or_exit("dsm_forkjoin", args.runtime.start(|cfg| cfg));
    common::or_exit("dsm_forkjoin", FILL.register());
    let dsm = common::or_exit("dsm_forkjoin", Dsm::new(&rt));
    match run(&rt, &dsm, args.len) {
        Ok(figures) => println!(
            "dsm_forkjoin: OK nodes={} procs={} {figures}",
            rt.num_nodes(),
            rt.procs()
        ),
        Err(e) => {
            eprintln!("dsm_forkjoin: {e}");
            println!("dsm_forkjoin: STALE node={}", rt.node());
            std::process::exit(1);
        }
    }
}
