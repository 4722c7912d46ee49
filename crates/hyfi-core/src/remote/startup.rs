//! Start-up distribution (paper §3.5): the first forks of a distributed
//! run go out along a logical tree of (node, processor) slots, so every
//! processor of every node has work quickly.
//!
//! The `N × P` processors are slots `0..N·P`; slot `s` is processor `s / N`
//! of node `s % N`, so consecutive slots alternate between nodes and the
//! largest pieces of work (the first forks) cross nodes first. The root
//! holds slot 0 at depth 0. A filament holding slot `s` at depth `d` sends
//! its next forked filament ([`Ctx::join_remote`]) to slot `s + 2^d`, which
//! takes it over at depth `d + 1`, and goes on itself at depth `d + 1`,
//! until `s + 2^d ≥ N·P`: a binomial tree, so after `log2(N·P)` forks every
//! slot has a piece. Then joins prune as usual and stealing takes over.
//!
//! The slot a processor holds lives in `Ctx::startup` while the filament
//! that took it runs; holding one makes the next join take the slow path
//! (a fork is "wanted"), where the start-up fork is made. A plain
//! [`Ctx::join`] there makes an ordinary local fork instead, and start-up
//! distribution goes on at the next `join_remote`.

pub use crate::crossnode::Slot;
use crate::sched::Ctx;

/// Runs `f` with `slot` as the calling processor's start-up slot.
pub(crate) fn with_startup<T>(ctx: &Ctx, slot: Option<Slot>, f: impl FnOnce() -> T) -> T {
    let prev = ctx.startup.replace(slot);
    if slot.is_some() {
        // The next join must take the slow path, where start-up forks are made.
        ctx.want_fork();
    }
    let r = f();
    ctx.startup.set(prev);
    r
}

/// The slot the next forked filament goes to, if the caller still holds a
/// start-up slot with children left; advances the caller's depth.
pub(crate) fn next_startup_child(ctx: &Ctx) -> Option<Slot> {
    let s = ctx.startup.get()?;
    let total = (ctx.nodes * ctx.shared.procs) as u64;
    let child = u64::from(s.slot) + (1u64 << s.depth.min(63));
    if child >= total {
        ctx.startup.set(None);
        return None;
    }
    let depth = s.depth + 1;
    let more = u64::from(s.slot) + (1u64 << depth.min(63)) < total;
    ctx.startup.set(more.then_some(Slot {
        slot: s.slot,
        depth,
    }));
    if more {
        ctx.want_fork();
    } else {
        ctx.clear_want();
    }
    Some(Slot {
        slot: child as u32,
        depth,
    })
}
