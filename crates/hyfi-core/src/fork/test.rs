//! Tests of the pruned copy ([`super::Fork`], [`super::Pruned`]).

use crate::Fork;
use crate::{Config, RemoteFn, Runtime};

/// A binary tree of joins whose forked branch has a pruned copy.
fn tree(ctx: &impl Fork, (depth, leaf): (u32, u64)) -> u64 {
    if depth == 0 {
        return std::hint::black_box(leaf);
    }
    let (a, b) = ctx.join_remote(
        |c| tree(c, (depth - 1, 2 * leaf)),
        &TREE,
        (depth - 1, 2 * leaf + 1),
    );
    a + b
}
static TREE: RemoteFn<(u32, u64), u64> = RemoteFn::new("fork::tests::tree", tree).with_pruned(tree);

#[test]
fn the_pruned_copy_gives_the_same_result_and_counts_the_joins_outside_it() {
    let depth = 16;
    let n = 1u64 << depth;
    for (procs, prune) in [(1, true), (2, true), (2, false)] {
        let rt = Runtime::new(Config::new().procs(procs).pin(false).prune(prune)).unwrap();
        for _ in 0..3 {
            rt.reset_stats();
            assert_eq!(
                rt.run(|ctx| tree(ctx, (depth, 0))).unwrap(),
                n * (n - 1) / 2
            );
            let t = rt.stats().total();
            if prune {
                // The joins outside pruned subtrees count two branches
                // each; the subtrees count once each, not their joins.
                assert!(t.pruned > 0, "procs {procs}: no subtree ran pruned");
                assert!(t.filaments % 2 == 0 && t.filaments < 2 * (n - 1));
            } else {
                // 2^depth - 1 joins of two branches each, wherever they ran.
                assert_eq!(t.filaments, 2 * (n - 1), "procs {procs}");
                assert_eq!(t.forks, n - 1, "procs {procs}: every join forks");
                assert_eq!(t.pruned, 0, "procs {procs}");
            }
        }
    }
}

#[test]
fn a_panic_in_the_pruned_copy_reaches_the_root() {
    fn boom(ctx: &impl Fork, depth: u32) -> u64 {
        if depth == 0 {
            panic!("boom in a leaf");
        }
        let (a, b) = ctx.join_remote(|c| boom(c, depth - 1), &BOOM, depth - 1);
        a + b
    }
    static BOOM: RemoteFn<u32, u64> = RemoteFn::new("fork::tests::boom", boom).with_pruned(boom);
    let rt = Runtime::new(Config::new().procs(2).pin(false)).unwrap();
    assert!(rt.run(|ctx| boom(ctx, 12)).is_err());
    // The runtime survives.
    assert_eq!(rt.run(|ctx| tree(ctx, (4, 0))).unwrap(), 120);
}

#[test]
fn a_pruned_subtree_sees_the_context_of_the_processor_that_runs_it() {
    // Each call passes its own context's address to both branches. A
    // branch run as the pruned copy is a plain call on its parent's
    // thread, so its `ctx()` (which holds no pointer: it reads the server
    // thread's published context) must be its parent's context, the one
    // the old `Pruned` carried; a branch run as a `Ctx` may have been
    // stolen, so it is only counted.
    use std::sync::atomic::{AtomicU64, Ordering};
    static PRUNED_CALLS: AtomicU64 = AtomicU64::new(0);
    static WRONG: AtomicU64 = AtomicU64::new(0);
    fn count<C: Fork>(ctx: &C, (depth, parent): (u32, usize)) -> u64 {
        let me = ctx.ctx() as *const crate::Ctx as usize;
        if std::any::type_name::<C>().ends_with("Pruned") {
            PRUNED_CALLS.fetch_add(1, Ordering::Relaxed);
            if me != parent {
                WRONG.fetch_add(1, Ordering::Relaxed);
            }
        }
        if depth == 0 {
            return 1;
        }
        let (a, b) = ctx.join_remote(|c| count(c, (depth - 1, me)), &COUNT, (depth - 1, me));
        a + b
    }
    static COUNT: RemoteFn<(u32, usize), u64> =
        RemoteFn::new("fork::tests::count", count).with_pruned(count);
    let depth = 16;
    for procs in [1, 2] {
        let rt = Runtime::new(Config::new().procs(procs).pin(false)).unwrap();
        PRUNED_CALLS.store(0, Ordering::Relaxed);
        rt.reset_stats();
        assert_eq!(rt.run(|ctx| count(ctx, (depth, 0))).unwrap(), 1 << depth);
        assert!(
            rt.stats().total().pruned > 0 && PRUNED_CALLS.load(Ordering::Relaxed) > 0,
            "procs {procs}: no subtree ran pruned"
        );
        assert_eq!(
            WRONG.load(Ordering::Relaxed),
            0,
            "procs {procs}: a pruned call saw another context than its parent's"
        );
    }
}
