//! What the in-process multi-node tests share: a node's runtime and DSM
//! over an in-process link, and one thread per node.

#![allow(dead_code)] // each test file uses what it needs

use hyfi_core::layer::RuntimeExt;
use std::sync::Arc;

use hyfi_core::link::InProcess;
use hyfi_core::{Config, Control, NodeLink, PoolArray, PostPhase, Runtime};
use hyfi_dsm::Dsm;

/// One in-process node: a runtime of `procs` processors over `link`, and
/// its DSM at a base of its own.
pub fn start(link: &Arc<InProcess>, procs: usize) -> Result<(Runtime, Dsm), String> {
    let rt = Runtime::with_link(
        Config::new().procs(procs).pin(false),
        link.clone() as Arc<dyn NodeLink>,
    )
    .map_err(|e| e.to_string())?;
    let dsm = Dsm::with_base(&rt, None).map_err(|e| e.to_string())?;
    Ok((rt, dsm))
}

/// Runs `node` on `n` in-process nodes, one thread each (1 MiB stacks:
/// 256 of them fit anywhere); their results in node order.
pub fn on_nodes<R: Send + 'static>(
    n: usize,
    node: impl Fn(Arc<InProcess>) -> R + Clone + Send + 'static,
) -> Vec<R> {
    let handles: Vec<_> = InProcess::connect(n)
        .into_iter()
        .map(|l| {
            let node = node.clone();
            std::thread::Builder::new()
                .stack_size(1 << 20)
                .spawn(move || node(l))
                .expect("a thread per node")
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("node thread"))
        .collect()
}

/// [`on_nodes`] for nodes that return a result: panics with the first error.
pub fn on_nodes_ok<R: Send + 'static>(
    n: usize,
    node: impl Fn(Arc<InProcess>) -> Result<R, String> + Clone + Send + 'static,
) -> Vec<R> {
    on_nodes(n, node)
        .into_iter()
        .map(|r| r.unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

/// An argmax candidate, a user type with a combine of its own for
/// reductions: a value and the index it came from.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Top {
    pub value: f64,
    pub index: u64,
}

/// No candidate yet (every candidate is larger).
pub const NO_TOP: Top = Top {
    value: f64::MIN,
    index: u64::MAX,
};

/// The larger value, the lower index on a tie: always one of its inputs
/// (what a reduction that carries its winner's row needs).
pub fn larger(a: Top, b: Top) -> Top {
    if b.value > a.value || (b.value == a.value && b.index < a.index) {
        b
    } else {
        a
    }
}

/// One filament per node, numbered by its node, in processor 0's pool:
/// the pools of a test whose nodes each play one part.
pub fn one_per_node(rt: &Runtime) -> PoolArray<usize> {
    let mut pools = PoolArray::new(rt, 1);
    pools.pool(0).push(rt.node());
    pools
}

/// A post-phase that ends the program after `executions` of its phase.
pub fn until(executions: u64) -> impl FnMut(&mut PostPhase<'_>) -> Control {
    move |post| {
        if post.iteration() + 1 >= executions {
            Control::Done
        } else {
            Control::Continue
        }
    }
}

/// Waits, yielding, until `ready()` holds or 20 s have passed (a test's
/// bound, never a timing it asserts); whether it held.
pub fn wait_for(mut ready: impl FnMut() -> bool) -> bool {
    let t = std::time::Instant::now();
    while !ready() {
        if t.elapsed() > std::time::Duration::from_secs(20) {
            return false;
        }
        std::thread::yield_now();
    }
    true
}
