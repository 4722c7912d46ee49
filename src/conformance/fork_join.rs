//! Check 3: fork-join filaments across nodes — randomly shaped trees of
//! [`join_remote`](crate::Fork::join_remote), run with
//! [`run_distributed`](crate::Runtime::run_distributed), against the
//! sequential recursion.
//!
//! A tree's shape and values come from the seed: every filament above
//! [`MIN_DEPTH`] forks, deeper ones stop at random, and a filament's
//! result folds its children's results in an order-sensitive way, so a
//! result that came back to the wrong join, twice, or not at all changes
//! the root's. The first forks go out along the start-up distribution's
//! tree of (node, processor) slots, and [`MIN_DEPTH`] levels of forks are
//! enough for it to reach every slot of a job of up to 32 processors:
//! each other node must have received filaments. Idle processors steal
//! the rest across nodes as they please.

use super::{agree, hash, mix, Summary};
use crate::layers::RuntimeExt;
use crate::{Fork, RemoteFn, Runtime};

/// The check's word in the plan.
const CHECK: u64 = 3;
/// Trees per run of the check.
const TREES: u64 = 3;
/// Every filament above this depth forks.
const MIN_DEPTH: u32 = 5;
/// No filament at this depth forks.
const MAX_DEPTH: u32 = 14;
/// Mixes a leaf computes (about 10 µs): work worth stealing.
const LEAF_WORK: u32 = 4000;

/// A filament of the tree: `(tree seed, position, depth)`, the root at
/// position 1, the children of `i` at `2i` and `2i + 1`.
type Filament = (u64, u64, u32);

static TREE: RemoteFn<Filament, u64> =
    RemoteFn::new("hyfi::conformance::tree", tree).with_pruned(tree);

/// The plan's word for a filament, and whether it is a leaf.
fn shape((seed, id, depth): Filament) -> (u64, bool) {
    let w = hash(&[seed, CHECK, id]);
    let leaf = depth >= MAX_DEPTH || (depth >= MIN_DEPTH && w % 8 < 3);
    (w, leaf)
}

fn leaf_value(w: u64) -> u64 {
    (0..LEAF_WORK).fold(w, |x, _| mix(x))
}

/// Not commutative: swapped children change it.
fn fold(w: u64, a: u64, b: u64) -> u64 {
    mix(w ^ a).wrapping_add(b.rotate_left(23))
}

fn tree(ctx: &impl Fork, f: Filament) -> u64 {
    let (w, leaf) = shape(f);
    if leaf {
        return leaf_value(w);
    }
    let (seed, id, depth) = f;
    let (a, b) = ctx.join_remote(
        |c| tree(c, (seed, 2 * id, depth + 1)),
        &TREE,
        (seed, 2 * id + 1, depth + 1),
    );
    fold(w, a, b)
}

/// The tree's value by the plain recursion, and its filaments.
fn sequential(f: Filament) -> (u64, u64) {
    let (w, leaf) = shape(f);
    if leaf {
        return (leaf_value(w), 1);
    }
    let (seed, id, depth) = f;
    let (a, na) = sequential((seed, 2 * id, depth + 1));
    let (b, nb) = sequential((seed, 2 * id + 1, depth + 1));
    (fold(w, a, b), 1 + na + nb)
}

/// Runs check 3 on this node (see the module docs).
pub(super) fn check(rt: &Runtime, seed: u64, s: &mut Summary) -> Result<(), String> {
    let link = rt.link().clone();
    let (me, n) = (rt.node(), rt.num_nodes());
    TREE.register()
        .map_err(|e| format!("node {me}: registering the tree's filament: {e}"))?;
    let before = rt.stats().remote.filaments_in;
    let mut mine = Ok(());
    for t in 0..TREES {
        let root = (hash(&[seed, CHECK, u64::MAX, t]), 1, 0);
        let got = rt
            .run_distributed(|ctx| tree(ctx, root))
            .map_err(|e| format!("node {me}: the distributed run of tree {t} failed: {e}"))?;
        let (want, filaments) = sequential(root);
        if got != want && mine.is_ok() {
            mine = Err(format!(
                "node {me}: tree {t} ({filaments} filaments) gave {got:#x} across the nodes, \
                 the sequential recursion {want:#x}"
            ));
        }
        s.trees += 1;
        s.tree_filaments += filaments;
    }
    let moved_here = rt.stats().remote.filaments_in - before;
    let moved = agree(&link, "fork-join across nodes", mine.map(|()| moved_here))?;
    s.filaments_moved += moved;
    if n > 1 && moved < (n - 1) as u64 {
        return Err(format!(
            "fork-join across nodes: {TREES} distributed runs moved {moved} filament(s) between \
             {n} nodes: the start-up distribution must give every other node one"
        ));
    }
    Ok(())
}
