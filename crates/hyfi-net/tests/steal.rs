//! Fork-join across nodes as threads of one process (each node with its own
//! mesh, communication thread and runtime): results, filaments reaching
//! every node, and messages of a run that a node has not begun yet (a
//! start-up filament, the run's end) kept until it begins.

use hyfi_core::layer::RuntimeExt;
use std::sync::Arc;
use std::time::Duration;

use hyfi_core::{Config, Ctx, RemoteFn, Runtime, Stats};
use hyfi_net::bootstrap::{random_token, random_u64, JobSpec, Launcher, Rendezvous};
use hyfi_net::Cluster;

fn sum(ctx: &Ctx, (lo, hi): (u64, u64)) -> u64 {
    if hi - lo <= 64 {
        return (lo..hi).map(|x| x * x % 7).sum();
    }
    let mid = lo + (hi - lo) / 2;
    let (a, b) = ctx.join_remote(|c| sum(c, (lo, mid)), &SUM, (mid, hi));
    a + b
}
static SUM: RemoteFn<(u64, u64), u64> = RemoteFn::new("steal_test::sum", sum);

fn seq(lo: u64, hi: u64) -> u64 {
    (lo..hi).map(|x| x * x % 7).sum()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// What one node saw: each run's result, and its counters.
struct Seen {
    results: Vec<u64>,
    stats: Stats,
}

/// Runs `ranges` one after the other as distributed runs on `n` nodes of
/// one processor; node `late` starts run `late_run` 200 ms after the
/// others.
fn nodes_run(n: usize, ranges: &[(u64, u64)], late: usize, late_run: usize) -> Vec<Seen> {
    SUM.register().unwrap();
    let coord = format!("127.0.0.1:{}", free_port());
    let (token, job) = (random_token(), random_u64());
    let hs: Vec<_> = (0..n)
        .map(|rank| {
            let coord = coord.clone();
            let ranges = ranges.to_vec();
            std::thread::spawn(move || {
                let spec = JobSpec {
                    rank,
                    nodes: n,
                    rendezvous: Rendezvous::Coord(coord),
                    job,
                    token: Some(token),
                    launcher: Launcher::Hyfi,
                };
                let cluster = Cluster::connect(&spec, Duration::from_secs(20)).unwrap();
                let rt =
                    Runtime::with_link(Config::new().procs(1).pin(false), cluster.clone()).unwrap();
                hyfi_core::steal::install(&rt).unwrap();
                let mut results = Vec::new();
                for (k, &(lo, hi)) in ranges.iter().enumerate() {
                    if rank == late && k == late_run {
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    results.push(rt.run_distributed(|ctx| sum(ctx, (lo, hi))).unwrap());
                }
                let stats = rt.stats();
                drop(rt);
                (Seen { results, stats }, cluster)
            })
        })
        .collect();
    let (seen, clusters): (Vec<Seen>, Vec<Arc<Cluster>>) =
        hs.into_iter().map(|h| h.join().unwrap()).unzip();
    // Close together, as separate processes would (each waits for the
    // others' goodbye).
    let closers: Vec<_> = clusters
        .into_iter()
        .map(|c| std::thread::spawn(move || drop(c)))
        .collect();
    for c in closers {
        c.join().unwrap();
    }
    seen
}

#[test]
fn every_node_returns_the_roots_result_and_runs_filaments() {
    for n in [2, 3] {
        let ranges = [(0, 1 << 14), (5, 70_000), (0, 1 << 16)];
        let seen = nodes_run(n, &ranges, usize::MAX, 0);
        let want: Vec<u64> = ranges.iter().map(|&(lo, hi)| seq(lo, hi)).collect();
        for (rank, s) in seen.iter().enumerate() {
            assert_eq!(s.results, want, "node {rank} of {n}");
            if rank > 0 {
                // Start-up distribution sends one filament to every other
                // node in every run (slots 1..n are nodes 1..n).
                assert!(
                    s.stats.remote.filaments_in >= ranges.len() as u64,
                    "node {rank} of {n}:\n{}",
                    s.stats
                );
            }
        }
        let moved_in: u64 = seen.iter().map(|s| s.stats.remote.filaments_in).sum();
        let moved_out: u64 = seen.iter().map(|s| s.stats.remote.filaments_out).sum();
        assert_eq!(moved_in, moved_out, "{n} nodes");
        // Every filament ran exactly once somewhere: 2 per join.
        let filaments: u64 = seen.iter().map(|s| s.stats.total().filaments).sum();
        let one_node = Runtime::new(Config::new().procs(1).pin(false)).unwrap();
        for &(lo, hi) in &ranges {
            one_node.run(|ctx| sum(ctx, (lo, hi))).unwrap();
        }
        assert_eq!(filaments, one_node.stats().total().filaments, "{n} nodes");
    }
}

#[test]
fn a_node_that_begins_a_run_late_gets_its_messages() {
    // Run 1: node 1 is late; node 0's start-up filament for it arrives
    // before node 1 begins the run, and node 0 waits for its result.
    // Run 2: a root too small to fork: node 0 ends the run at once, and
    // its `Done` reaches node 2 before node 2 begins the run.
    let ranges = [(0, 4096), (0, 4096), (0, 10), (0, 4096)];
    for (late, late_run) in [(1, 1), (2, 2)] {
        let seen = nodes_run(3, &ranges, late, late_run);
        let want: Vec<u64> = ranges.iter().map(|&(lo, hi)| seq(lo, hi)).collect();
        for (rank, s) in seen.iter().enumerate() {
            assert_eq!(
                s.results, want,
                "node {rank}, node {late} late in run {late_run}"
            );
        }
    }
}
