//! The n-way form of [`Ctx::join_remote`]: `ctx.join_remote_n(&F, args)`
//! runs `F` on every argument, potentially in parallel on every node, and
//! returns the results in argument order.
//!
//! Pruned, it is a loop of plain calls, the pruning test taken before each
//! element; when a fork is wanted, what is left becomes a binary tree of
//! `join_remote`s, the one join path: each split forks its right half as
//! a *batch*, a filament of its own that an idle processor or node may
//! take whole and split further. A batch travels
//! like any [`RemoteFn`]: [`RemoteFn::register`] registers, next to each
//! function `F`, its batch `"F#n"` (argument: `F`'s name and a `Vec` of its
//! arguments; result: a `Vec` of its results), so a node that receives one
//! finds `F` by name and goes on splitting there.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::RwLock;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{insert, lookup, RemoteFn};
use crate::error::Error;
use crate::sched::Ctx;

/// The batch of a `RemoteFn<A, R>`: `(its name, some arguments)` to their
/// results.
type Batch<A, R> = RemoteFn<(Cow<'static, str>, Vec<A>), Vec<R>>;

/// Function name → its batch (a `&'static Batch<A, R>` behind `Any`).
static BATCHES: RwLock<Option<HashMap<&'static str, &'static (dyn std::any::Any + Send + Sync)>>> =
    RwLock::new(None);

/// Registers the batch of `f`, once (`f` itself was just registered).
pub(super) fn register_batch<A, R>(f: &'static RemoteFn<A, R>) -> Result<(), Error>
where
    A: Serialize + DeserializeOwned + Send + 'static,
    R: Serialize + DeserializeOwned + Send + 'static,
{
    let mut g = BATCHES.write().unwrap_or_else(|e| e.into_inner());
    let map = g.get_or_insert_with(HashMap::new);
    if map.contains_key(f.name) {
        return Ok(());
    }
    // Leaked once per function and process, as the function's own static.
    let name: &'static str = Box::leak(format!("{}#n", f.name).into_boxed_str());
    let batch: &'static Batch<A, R> = Box::leak(Box::new(RemoteFn::new(name, run_batch::<A, R>)));
    insert(name, batch)?;
    map.insert(f.name, batch);
    Ok(())
}

/// `f`'s batch, if it is registered. Looked up only where a split forks
/// (a lock and a hash of the name): pruned calls never need it.
fn batch_of<A, R>(f: &'static RemoteFn<A, R>) -> Option<&'static Batch<A, R>>
where
    A: 'static,
    R: 'static,
{
    let g = BATCHES.read().unwrap_or_else(|e| e.into_inner());
    let any: &'static (dyn std::any::Any + Send + Sync) = *g.as_ref()?.get(f.name)?;
    any.downcast_ref::<Batch<A, R>>()
}

/// A batch, where it runs (here, or on the node that took it): finds its
/// function by name and splits the arguments further.
fn run_batch<A, R>(ctx: &Ctx, (name, args): (Cow<'static, str>, Vec<A>)) -> Vec<R>
where
    A: Serialize + DeserializeOwned + Send + 'static,
    R: Serialize + DeserializeOwned + Send + 'static,
{
    let f = lookup(&name)
        .and_then(|e| e.as_any().downcast_ref::<RemoteFn<A, R>>())
        .unwrap_or_else(|| {
            panic!(
                "hyfi: node {} got a batch of `{name}`, which it has not registered with \
                 these argument and result types: call its RemoteFn::register on every node",
                ctx.node()
            )
        });
    ctx.join_remote_n(f, args)
}

impl Ctx {
    /// Runs the serializable filament `f` on each of `args`, potentially in
    /// parallel on this node and others, and returns the results in the
    /// order of `args`: the n-way form of [`Ctx::join_remote`], as
    /// [`Ctx::join_n`] is of [`Ctx::join`].
    ///
    /// Pruned, `f` runs on the arguments one after another, as a loop
    /// would. When a processor or node asks for work, what is left is
    /// split in halves recursively with `join_remote`; a forked half is one
    /// filament an idle processor or node takes whole (its arguments
    /// encoded together) and splits further. `f` must be registered on every node
    /// ([`RemoteFn::register`] also registers its batches); unregistered, the
    /// halves are plain [`Ctx::join`]s that never leave the node.
    ///
    /// ```
    /// use hyfi::{Config, Ctx, RemoteFn, Runtime};
    ///
    /// fn square(_ctx: &Ctx, x: u64) -> u64 { x * x }
    /// static SQUARE: RemoteFn<u64, u64> = RemoteFn::new("doc::square", square);
    ///
    /// SQUARE.register()?; // on every node, before the run
    /// let rt = Runtime::new(Config::new().procs(2).pin(false))?;
    /// let v = rt.run_distributed(|ctx| ctx.join_remote_n(&SQUARE, (0..10).collect()))?;
    /// assert_eq!(v, (0..10u64).map(|x| x * x).collect::<Vec<_>>());
    /// # Ok::<(), hyfi::Error>(())
    /// ```
    pub fn join_remote_n<A, R>(&self, f: &'static RemoteFn<A, R>, args: Vec<A>) -> Vec<R>
    where
        A: Serialize + DeserializeOwned + Send + 'static,
        R: Serialize + DeserializeOwned + Send + 'static,
    {
        let mut out = Vec::with_capacity(args.len());
        split(self, f, args, &mut out);
        out
    }
}

/// Runs `f` on `args` in order, appending the results to `out`: plain
/// calls while pruning holds, and the rest split in halves (left half
/// here, right half forked) as soon as a fork is wanted.
///
/// Pruned, a split would still cost its halves' allocations (the right
/// half's `Vec`, its results' `Vec`) and a look-up of the batch for two
/// plain calls: an n-Queens of n = 14 with a 14-way `join_remote_n` per
/// row spent 40 % over its sequential loop so (BENCHMARKS.md, "A user's
/// n-Queens"). So the elements are called one by one, and the pruning
/// test is taken again before each: a processor that goes idle meanwhile
/// gets the larger half of what is left.
fn split<A, R>(ctx: &Ctx, f: &'static RemoteFn<A, R>, args: Vec<A>, out: &mut Vec<R>)
where
    A: Serialize + DeserializeOwned + Send + 'static,
    R: Serialize + DeserializeOwned + Send + 'static,
{
    let mut it = args.into_iter();
    while it.len() > 1 && ctx.pruned_here() {
        if let Some(a) = it.next() {
            ctx.count_filaments(1);
            out.push(f.call(ctx, a));
        }
    }
    match it.len() {
        0 => {}
        // The last element needs no test: nothing would be left to give.
        1 => {
            if let Some(a) = it.next() {
                ctx.count_filaments(1);
                out.push(f.call(ctx, a));
            }
        }
        // What is left, in the iterator's own allocation.
        _ => split_in_halves(ctx, f, it.collect(), out),
    }
}

/// [`split`]'s real fork: the left half here, the right half forked as
/// one filament (a batch, if `f` is registered, that another node may
/// take whole); `args` holds two elements or more.
fn split_in_halves<A, R>(ctx: &Ctx, f: &'static RemoteFn<A, R>, mut args: Vec<A>, out: &mut Vec<R>)
where
    A: Serialize + DeserializeOwned + Send + 'static,
    R: Serialize + DeserializeOwned + Send + 'static,
{
    let right = args.split_off(args.len() / 2);
    let rs = match batch_of(f) {
        Some(b) => {
            let name = Cow::Borrowed(f.name);
            ctx.join_remote(|c| split(c, f, args, out), b, (name, right))
                .1
        }
        None => {
            ctx.join(
                |c| split(c, f, args, out),
                |c| {
                    let mut v = Vec::with_capacity(right.len());
                    split(c, f, right, &mut v);
                    v
                },
            )
            .1
        }
    };
    out.extend(rs);
}

#[cfg(test)]
mod tests {
    use crate::{Config, Ctx, RemoteFn, Runtime};

    fn cube(_ctx: &Ctx, x: u64) -> u64 {
        x * x * x
    }
    static CUBE: RemoteFn<u64, u64> = RemoteFn::new("remote::many::tests::cube", cube);
    static CUBE_UNREGISTERED: RemoteFn<u64, u64> =
        RemoteFn::new("remote::many::tests::cube_unregistered", cube);

    /// Nested: each filament runs an n-way join of its own.
    fn sum_of_cubes(ctx: &Ctx, n: u64) -> u64 {
        ctx.join_remote_n(&CUBE, (0..n).collect()).into_iter().sum()
    }
    static SUMS: RemoteFn<u64, u64> = RemoteFn::new("remote::many::tests::sums", sum_of_cubes);

    #[test]
    fn results_come_back_in_order_on_any_processor_count() {
        CUBE.register().unwrap();
        CUBE.register().unwrap(); // again: a no-op
        SUMS.register().unwrap();
        assert!(super::super::is_registered("remote::many::tests::cube#n"));
        for (procs, prune) in [(1, true), (2, true), (3, true), (3, false)] {
            let rt = Runtime::new(Config::new().procs(procs).pin(false).prune(prune)).unwrap();
            for n in [0u64, 1, 2, 3, 7, 64, 1000] {
                let want: Vec<u64> = (0..n).map(|x| x * x * x).collect();
                let got = rt
                    .run_distributed(|ctx| ctx.join_remote_n(&CUBE, (0..n).collect()))
                    .unwrap();
                assert_eq!(got, want, "procs {procs} prune {prune} n {n}");
                let got = rt
                    .run(|ctx| ctx.join_remote_n(&CUBE_UNREGISTERED, (0..n).collect()))
                    .unwrap();
                assert_eq!(got, want, "unregistered: procs {procs} n {n}");
            }
            rt.reset_stats();
            let nested = rt
                .run_distributed(|ctx| ctx.join_remote_n(&SUMS, (0..50).collect()))
                .unwrap();
            let want: Vec<u64> = (0..50u64)
                .map(|n| (0..n).map(|x| x * x * x).sum())
                .collect();
            assert_eq!(nested, want);
            // Every call of a function counts as a filament, wherever it ran.
            let calls: u64 = 50 + (0..50u64).sum::<u64>();
            assert!(rt.stats().total().filaments >= calls);
        }
    }

    /// Pruned, the elements are plain calls in a loop; a fork wanted
    /// during one element (as an idle processor asks) splits what is
    /// left, once.
    #[test]
    fn pruned_elements_are_calls_until_a_fork_is_wanted() {
        fn asks_at_three(ctx: &Ctx, x: u64) -> u64 {
            if x == 3 {
                ctx.want_fork();
            }
            x * x
        }
        static ASKS: RemoteFn<u64, u64> =
            RemoteFn::new("remote::many::tests::asks_at_three", asks_at_three);
        ASKS.register().unwrap();
        let rt = Runtime::new(Config::new().procs(1).pin(false)).unwrap();
        let want: Vec<u64> = (0..9u64).map(|x| x * x).collect();
        for (args, forks) in [(0..9u64, 1), (4..9, 0)] {
            rt.reset_stats();
            let got = rt
                .run_distributed(|ctx| ctx.join_remote_n(&ASKS, args.clone().collect()))
                .unwrap();
            assert_eq!(got, want[args.start as usize..]);
            assert_eq!(rt.stats().total().forks, forks, "arguments {args:?}");
        }
    }

    #[test]
    fn a_panicking_element_reaches_the_root() {
        fn picky(_ctx: &Ctx, x: u64) -> u64 {
            assert!(x != 13, "thirteen");
            x
        }
        static PICKY: RemoteFn<u64, u64> = RemoteFn::new("remote::many::tests::picky", picky);
        PICKY.register().unwrap();
        let rt = Runtime::new(Config::new().procs(2).pin(false)).unwrap();
        let err = rt
            .run_distributed(|ctx| ctx.join_remote_n(&PICKY, (0..40).collect()))
            .unwrap_err();
        assert!(err.to_string().contains("thirteen"), "{err}");
        assert_eq!(
            rt.run_distributed(|ctx| ctx.join_remote_n(&PICKY, (0..13).collect()))
                .unwrap(),
            (0..13).collect::<Vec<_>>()
        );
    }
}
