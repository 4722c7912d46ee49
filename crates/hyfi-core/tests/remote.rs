//! Serializable fork-join filaments on one node: `RemoteFn` registration,
//! `Ctx::join_remote`, `Runtime::run_distributed` and its errors. (Across
//! nodes, with real processes: `tests/forkjoin_nodes.rs` of the facade.)

use hyfi_core::layer::RuntimeExt;
use hyfi_core::{Config, Ctx, Error, LinkError, NodeLink, RemoteFn, Runtime};
use std::sync::Arc;

fn tree(ctx: &Ctx, (depth, leaf): (u32, u64)) -> u64 {
    if depth == 0 {
        return leaf;
    }
    let (a, b) = ctx.join_remote(
        |c| tree(c, (depth - 1, 2 * leaf)),
        &TREE,
        (depth - 1, 2 * leaf + 1),
    );
    a + b
}
static TREE: RemoteFn<(u32, u64), u64> = RemoteFn::new("tests::tree", tree);

/// Sum of the leaves 0..2^depth.
fn tree_sum(depth: u32) -> u64 {
    let n = 1u64 << depth;
    n * (n - 1) / 2
}

fn boom(ctx: &Ctx, (depth, leaf, target): (u32, u64, u64)) -> u64 {
    if depth == 0 {
        if leaf == target {
            panic!("boom at leaf {leaf}");
        }
        return 1;
    }
    let (a, b) = ctx.join_remote(
        |c| boom(c, (depth - 1, 2 * leaf, target)),
        &BOOM,
        (depth - 1, 2 * leaf + 1, target),
    );
    a + b
}
static BOOM: RemoteFn<(u32, u64, u64), u64> = RemoteFn::new("tests::boom", boom);

fn runtime(procs: usize, prune: bool) -> Runtime {
    Runtime::new(Config::new().procs(procs).pin(false).prune(prune)).expect("runtime")
}

#[test]
fn registering_is_checked_by_name() {
    static OTHER: RemoteFn<(u32, u64), u64> = RemoteFn::new("tests::tree", |_, _| 0);
    TREE.register().expect("first registration");
    TREE.register()
        .expect("registering the same function again is fine");
    assert!(hyfi_core::is_registered("tests::tree"));
    assert!(!hyfi_core::is_registered("tests::nothing"));
    match OTHER.register() {
        Err(e @ Error::DuplicateFilament { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("\"tests::tree\""), "{msg}");
        }
        other => panic!("expected DuplicateFilament, got {other:?}"),
    }
    assert_eq!(TREE.name(), "tests::tree");
    assert_eq!(format!("{TREE:?}"), "RemoteFn(\"tests::tree\")");
}

#[test]
fn join_remote_on_one_node_equals_the_sequential_sum() {
    for (procs, prune) in [(1, true), (1, false), (2, true), (2, false)] {
        let rt = runtime(procs, prune);
        for depth in [0, 1, 5, 14] {
            assert_eq!(
                rt.run(|ctx| tree(ctx, (depth, 0))).expect("run"),
                tree_sum(depth),
                "run, procs {procs} prune {prune} depth {depth}"
            );
            assert_eq!(
                rt.run_distributed(|ctx| tree(ctx, (depth, 0)))
                    .expect("run_distributed"),
                tree_sum(depth),
                "run_distributed, procs {procs} prune {prune} depth {depth}"
            );
        }
    }
}

#[test]
fn every_branch_counts_as_a_filament() {
    // A tree of depth d makes 2^d - 1 joins, each of two branches, plus the
    // root: 2^(d+1) - 1 filaments, wherever they ran and pruned or not.
    for (procs, prune) in [(1, true), (2, true), (2, false)] {
        let rt = runtime(procs, prune);
        rt.reset_stats();
        rt.run_distributed(|ctx| tree(ctx, (12, 0))).expect("runs");
        let t = rt.stats().total();
        assert_eq!(t.filaments, (1 << 13) - 2, "procs {procs} prune {prune}");
        if !prune {
            assert_eq!(t.forks, (1 << 12) - 1, "procs {procs}: every join forks");
        }
        // One node: nothing crossed a node boundary.
        assert_eq!(rt.stats().remote, Default::default());
    }
}

#[test]
fn start_up_distribution_gives_the_second_processor_work() {
    // Slot 1 of a 1 x 2 run is processor 1: the root's first fork goes to
    // its list. A processor the OS does not schedule during a run cannot
    // take it (processor 0 takes it back when it runs out of work, and tests
    // run in parallel on few cores): make runs long enough, allow a few.
    let rt = runtime(2, true);
    rt.reset_stats();
    for _ in 0..20 {
        rt.run_distributed(|ctx| tree(ctx, (21, 0))).expect("runs");
        if rt.stats().procs[1].filaments > 0 {
            return;
        }
    }
    panic!("processor 1 never ran a filament:\n{}", rt.stats());
}

#[test]
fn a_panic_is_an_error_and_the_runtime_survives() {
    for (procs, prune) in [(1, true), (2, true), (2, false)] {
        let rt = runtime(procs, prune);
        for target in [0, 777, (1 << 12) - 1] {
            match rt.run_distributed(|ctx| boom(ctx, (12, 0, target))) {
                Err(Error::FilamentPanic { node, message, .. }) => {
                    assert_eq!(node, 0);
                    assert!(
                        message.contains(&format!("boom at leaf {target}")),
                        "{message}"
                    );
                }
                other => {
                    panic!("procs {procs} prune {prune}: expected FilamentPanic, got {other:?}")
                }
            }
            assert_eq!(
                rt.run_distributed(|ctx| boom(ctx, (12, 0, u64::MAX)))
                    .expect("usable afterwards"),
                1 << 12
            );
        }
    }
}

/// A link that claims two nodes but has no cluster layer behind it.
struct TwoNodes;
impl NodeLink for TwoNodes {
    fn num_nodes(&self) -> usize {
        2
    }
    fn my_node(&self) -> usize {
        0
    }
    fn barrier(&self) -> Result<(), LinkError> {
        Ok(())
    }
    fn allreduce(
        &self,
        _: &mut [u8],
        _: &mut dyn FnMut(&mut [u8], &[u8]),
    ) -> Result<(), LinkError> {
        Ok(())
    }
    fn allreduce_vec(
        &self,
        _: &mut Vec<u8>,
        _: &mut dyn FnMut(&mut Vec<u8>, &[u8]),
    ) -> Result<(), LinkError> {
        Ok(())
    }
}

#[test]
fn several_nodes_without_a_balancer_is_an_error() {
    let rt =
        Runtime::with_link(Config::new().procs(1).pin(false), Arc::new(TwoNodes)).expect("runtime");
    match rt.run_distributed(|ctx| tree(ctx, (3, 0))) {
        Err(e @ Error::NoBalancer { nodes: 2 }) => {
            assert!(e.to_string().contains("hyfi::init"), "{e}")
        }
        other => panic!("expected NoBalancer, got {other:?}"),
    }
}
