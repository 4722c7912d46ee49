//! The stealing protocol (start-up distribution, cross-node steals,
//! results, termination) on several nodes in one process, over the
//! in-process node seam ([`hyfi_core::link::InProcess`]). The same protocol
//! over TCP is tested with real processes in the workspace's
//! `tests/forkjoin_nodes.rs`.

use hyfi_core::layer::RuntimeExt;
use std::sync::Arc;

use hyfi_core::link::{InProcess, ServiceId};
use hyfi_core::{Config, Fork, NodeLink, RemoteFn, Runtime, Stats};

fn fib(ctx: &impl Fork, n: u64) -> u64 {
    if n < 2 {
        return n;
    }
    let (a, b) = ctx.join_remote(|c| fib(c, n - 1), &FIB, n - 2);
    a + b
}

static FIB: RemoteFn<u64, u64> = RemoteFn::new("steal_in_process::fib", fib).with_pruned(fib);

fn fib_seq(n: u64) -> u64 {
    let (mut a, mut b) = (0u64, 1u64);
    for _ in 0..n {
        (a, b) = (b, a + b);
    }
    a
}

/// Runs `runs` distributed fib(n) on `nodes` in-process nodes of `procs`
/// processors; returns each node's results and counters.
fn fib_on(nodes: usize, procs: usize, n: u64, runs: usize) -> Vec<(Vec<u64>, Stats)> {
    FIB.register().expect("register fib");
    let links = InProcess::connect(nodes);
    let handles: Vec<_> = links
        .into_iter()
        .map(|link| {
            std::thread::spawn(move || {
                // Without pruning every join_remote is a filament another
                // node can steal (with it, a busy node forks few).
                let rt = Runtime::with_link(
                    Config::new().procs(procs).pin(false).prune(false),
                    link.clone() as Arc<dyn NodeLink>,
                )
                .expect("runtime");
                hyfi_core::steal::install(&rt).expect("install stealing");
                let results = (0..runs)
                    .map(|_| {
                        rt.run_distributed(|ctx| fib(ctx, n))
                            .expect("distributed run")
                    })
                    .collect();
                let stats = rt.stats();
                (results, stats)
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("node thread"))
        .collect()
}

#[test]
fn fib_on_two_and_three_nodes_steals_across_nodes() {
    // fib(30) without pruning runs for some 0.1 s: long enough for steals
    // to be answered on a loaded machine. A node descheduled for the whole
    // run can make one run steal nothing: look over a few.
    let n = 30;
    for (nodes, procs) in [(2, 1), (3, 1), (2, 2)] {
        let mut seen = Vec::new();
        let mut stole = false;
        for _ in 0..5 {
            let out = fib_on(nodes, procs, n, 1);
            for (node, (results, _)) in out.iter().enumerate() {
                assert_eq!(
                    results,
                    &vec![fib_seq(n)],
                    "node {node} of {nodes} x {procs}"
                );
            }
            let moved_in: u64 = out.iter().map(|(_, s)| s.remote.filaments_in).sum();
            let moved_out: u64 = out.iter().map(|(_, s)| s.remote.filaments_out).sum();
            assert_eq!(moved_in, moved_out, "every filament sent arrived");
            // Start-up distribution gives each other node one filament.
            assert!(
                moved_in >= nodes as u64 - 1,
                "{nodes} x {procs}: no start-up filament"
            );
            for (node, (_, s)) in out.iter().enumerate() {
                assert!(
                    s.total().filaments > 0,
                    "node {node} of {nodes} ran no filament"
                );
            }
            let steals: u64 = out.iter().map(|(_, s)| s.remote.steals).sum();
            let served: u64 = out.iter().map(|(_, s)| s.remote.requests_served).sum();
            assert_eq!(
                steals, served,
                "every granted request was answered with filaments"
            );
            seen.push(out.into_iter().map(|(_, s)| s.remote).collect::<Vec<_>>());
            if steals > 0 {
                stole = true;
                break;
            }
        }
        assert!(
            stole,
            "{nodes} x {procs}: no steal across nodes in 5 runs: {seen:?}"
        );
    }
}

#[test]
fn stealing_needs_a_link_with_services() {
    let rt = Runtime::new(Config::new().procs(1).pin(false)).expect("runtime");
    let err = hyfi_core::steal::install(&rt).expect_err("one node has no port");
    assert!(err.to_string().contains("needs a link"), "{err}");
    // And the in-process link refuses a service registered twice.
    let links = InProcess::connect(2);
    struct Nop;
    impl hyfi_core::link::Service for Nop {
        fn frame(&self, _: usize, _: Vec<u8>) -> Result<(), hyfi_core::link::FrameError> {
            Ok(())
        }
        fn failed(&self, _: &str) {}
    }
    links[0].set_service(ServiceId::Dsm, Arc::new(Nop)).unwrap();
    let e = links[0]
        .set_service(ServiceId::Dsm, Arc::new(Nop))
        .unwrap_err();
    assert!(e.to_string().contains("twice"), "{e}");
    // Dropping the nodes one after the other must not hang: each waits
    // for the others to leave on its own thread.
    let hs: Vec<_> = links
        .into_iter()
        .map(|l| std::thread::spawn(move || drop(l)))
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}
