//! The transport conformance suite: what every implementation of the node
//! seam ([`layers::link`](crate::layers::link)) must do, checked against
//! answers computed independently on every node.
//!
//! hyfi runs over several transports — [`InProcess`](crate::layers::link::InProcess)
//! (nodes as threads of one process, for protocol tests), TCP
//! (`hyfi-net`'s cluster) and MPI — and the layers above them (the shared
//! memory, fork-join filaments across nodes, reductions) know none of
//! them. This module is the one place that says what "a transport works"
//! means, as a program every node runs:
//! [`run`](crate::conformance::run), called SPMD on every node of a job
//! with the same seed. CI runs it over every transport
//! (`tests/conformance.rs`; by hand, `examples/conformance.rs`).
//!
//! # What [`run`](crate::conformance::run) checks
//!
//! Each check ends with a *verdict* all-reduced over the nodes, so that
//! every node returns the same `Err` (naming the node that saw the
//! failure and what it saw) or goes on; the collectives carry the
//! verdicts, so they are checked first.
//!
//! 1. **Collectives** (the cross-node step of reductions, paper §3.4):
//!    all-reduces through the seam
//!    ([`NodeLink::allreduce`](crate::layers::NodeLink::allreduce)) of
//!    `f64` values chosen so that the association changes the bits (`1e16`,
//!    `3.0`, `-1e16`, …), of a non-commutative combining function, of a
//!    three-word value and of a 1 MiB value, each compared *bit for bit*
//!    with the result computed locally in the documented order (the
//!    binomial tree over the ranks, `acc = combine(acc, child)` for the
//!    children `r+1, r+2, r+4, …`: see `hyfi_core::link::collective`);
//!    the same through a reduction variable in post-phase code (some
//!    rounds with a node whose master computes long, so that the
//!    others' messages for the phase's end come while it computes); and
//!    barriers that must hold every node until the last one, delayed on
//!    purpose, arrives.
//! 2. **Shared memory**: several rounds of a phase in which random
//!    processors of every node write random elements of shared arrays
//!    (bytes, words, `f64` matrix rows that do not fit pages, 12-byte
//!    elements straddling pages; pages written by one node and pages
//!    written by several) and a phase in which every node reads every
//!    element back, against a sequential model each node computes from
//!    the seed.
//! 3. **Fork-join filaments across nodes** (paper §3.5): randomly shaped
//!    trees of [`join_remote`](crate::Ctx::join_remote) whose result the
//!    sequential recursion gives, run with
//!    [`run_distributed`](crate::Runtime::run_distributed); the start-up
//!    distribution must have moved filaments to every other node.
//! 4. **Frames** from 0 bytes to 64 MiB (the largest a transport must
//!    carry, hyfi-net's frame limit), both classes, from every node to
//!    every other, sent by `Port::send_with` and `Port::send_vec` in
//!    turn, through the suite's own services (service numbers
//!    100 to 102): the receiving service checks each frame's length and
//!    content against the seeded pattern, in the order sent per class, and
//!    replies from its delivery thread with a digest that the sender
//!    compares with what it sent.
//! 5. **Control overtakes queued bulk**: node 0 queues 48 bulk messages of
//!    1 MiB to node 1, then one control message; node 1 stalls its
//!    delivery thread for a second on the first bulk message, so that
//!    the rest wait behind it; the control message must arrive before
//!    the last bulk one, and the bulk ones in order.
//!
//! The failures a transport must detect end the job, so each is an entry
//! point of its own, run instead of [`run`](crate::conformance::run):
//! [`lose_node`](crate::conformance::lose_node) (a node exits, or
//! aborts) and [`stop_node`](crate::conformance::stop_node) (a node is
//! stopped, or its delivery thread stalls); every other node then enters
//! a barrier, which must fail within
//! [`DETECTION_BOUND`](crate::conformance::DETECTION_BOUND) with an error
//! naming the node.
//!
//! # Running it
//!
//! Over whatever transport started the node (TCP under hyfi's launchers,
//! MPI under `mpirun` with `HYFI_TRANSPORT=mpi`):
//!
//! ```no_run
//! let rt = hyfi::init()?;
//! match hyfi::conformance::run(&rt, 7) {
//!     Ok(summary) if rt.node() == 0 => println!("conformance: ok {summary}"),
//!     Ok(_) => {}
//!     Err(e) => {
//!         eprintln!("conformance: {e}");
//!         std::process::exit(1);
//!     }
//! }
//! # Ok::<(), hyfi::Error>(())
//! ```
//!
//! Over the in-process link, a runtime per node thread, with the shared
//! memory at a base of its own (the nodes share one address space) and
//! fork-join across nodes installed, as hyfi-net does for its runtimes:
//!
//! ```no_run
//! use std::sync::Arc;
//! use hyfi::layers::link::InProcess;
//! use hyfi::layers::{steal, NodeLink, RuntimeExt};
//! use hyfi::{Config, Dsm, Runtime};
//!
//! let nodes: Vec<_> = InProcess::connect(2)
//!     .into_iter()
//!     .map(|link| {
//!         std::thread::spawn(move || {
//!             let cfg = Config::new().procs(1).pin(false);
//!             let rt = Runtime::with_link(cfg, link as Arc<dyn NodeLink>).map_err(|e| e.to_string())?;
//!             steal::install(&rt).map_err(|e| e.to_string())?;
//!             Dsm::with_base(&rt, None).map_err(|e| e.to_string())?;
//!             hyfi::conformance::run(&rt, 7)
//!         })
//!     })
//!     .collect();
//! for n in nodes {
//!     let summary = n.join().unwrap().unwrap();
//!     assert_eq!(summary.nodes, 2);
//! }
//! ```

use std::sync::Arc;
use std::time::Duration;

use crate::layers::{NodeLink, RuntimeExt};
use crate::Runtime;

mod collectives;
mod dsm;
mod failures;
mod fork_join;
mod frames;
mod service;

pub use failures::{lose_node, stop_node, Ending, Loss, Stop, DETECTION_BOUND};

/// How long a node waits for frames, replies or a peer's verdict before
/// the check fails (instead of hanging).
pub const WAIT_BOUND: Duration = Duration::from_secs(60);

/// What [`run`] checked on this node (the job-wide figures are the same on
/// every node). Its `Display` is one line of `key=value` pairs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Summary {
    /// Nodes of the job.
    pub nodes: usize,
    /// Processors of this node.
    pub procs: usize,
    /// All-reduces compared bit for bit with the documented order.
    pub allreduces: u64,
    /// Of those, the ones whose bits another combining order (left to
    /// right, right to left, reversed) would have changed: evidence that
    /// the comparison discriminates.
    pub order_sensitive: u64,
    /// Reductions in post-phase code compared bit for bit.
    pub reductions: u64,
    /// Barriers entered, of which some with a node arriving late on purpose.
    pub barriers: u64,
    /// Write-and-check rounds of the shared memory.
    pub dsm_rounds: u64,
    /// Shared elements this node compared with the model.
    pub dsm_elements: u64,
    /// Fork-join trees run across the nodes.
    pub trees: u64,
    /// Filaments of those trees (from the sequential recursion).
    pub tree_filaments: u64,
    /// Filaments that moved between nodes in those runs, job-wide.
    pub filaments_moved: u64,
    /// Frames this node sent to the suite's services of other nodes.
    pub frames_sent: u64,
    /// Their payload bytes.
    pub frame_bytes: u64,
    /// Frames this node received and checked.
    pub frames_received: u64,
    /// Bulk messages the control message overtook (node 0 to node 1).
    pub overtaken: u64,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "nodes={} procs={} allreduces={} order_sensitive={} reductions={} barriers={} \
             dsm_rounds={} dsm_elements={} trees={} tree_filaments={} filaments_moved={} \
             frames_sent={} frame_bytes={} frames_received={} overtaken={}",
            self.nodes,
            self.procs,
            self.allreduces,
            self.order_sensitive,
            self.reductions,
            self.barriers,
            self.dsm_rounds,
            self.dsm_elements,
            self.trees,
            self.tree_filaments,
            self.filaments_moved,
            self.frames_sent,
            self.frame_bytes,
            self.frames_received,
            self.overtaken
        )
    }
}

/// Runs the suite on this node: call it on every node of the job, with the
/// same `seed`, as the only thing the nodes do meanwhile (it runs programs,
/// distributed runs and shared allocations, which are SPMD steps). Returns
/// what it checked, or the first failed check's verdict, the same on every
/// node, naming the node that saw it.
///
/// On several nodes it needs the shared memory's and fork-join's layers,
/// which `hyfi::init` installs; over a link of your own, install fork-join
/// ([`layers::steal::install`](crate::layers::steal::install)) and, for
/// nodes in one process, make the shared memory first with
/// [`Dsm::with_base`](crate::Dsm::with_base) (the suite takes the
/// runtime's). It registers the suite's services on the link the first
/// time; it may be called again on the same runtime.
pub fn run(rt: &Runtime, seed: u64) -> Result<Summary, String> {
    let suite = service::Suite::on(rt)?;
    let link = rt.link().clone();
    let me = link.my_node();
    link.barrier()
        .map_err(|e| format!("node {me}: the barrier after registering the suite failed: {e}"))?;
    let mut s = Summary {
        nodes: link.num_nodes(),
        procs: rt.procs(),
        ..Summary::default()
    };
    collectives::check(rt, seed, &mut s)?;
    dsm::check(rt, seed, &mut s)?;
    fork_join::check(rt, seed, &mut s)?;
    if let Some(suite) = suite {
        frames::check(&link, &suite, seed, &mut s)?;
        frames::overtaking(&link, &suite, seed, &mut s)?;
    }
    Ok(s)
}

/// The largest part of a node's failure message that travels in a verdict.
const VERDICT_TEXT: usize = 1000;

/// The verdict of check `check`, the same on every node: `Ok` with the sum
/// over the nodes of what each contributed if every node's `mine` is `Ok`;
/// otherwise an `Err` with the lowest failed node's message (and how many
/// failed). Every node must call it, in the same order.
fn agree(link: &Arc<dyn NodeLink>, check: &str, mine: Result<u64, String>) -> Result<u64, String> {
    let me = link.my_node();
    // [sum, failed nodes, lowest failed node + 1, text length] then the text.
    let mut v = vec![0u8; 32 + VERDICT_TEXT];
    let word = |v: &[u8], i: usize| u64::from_le_bytes(v[8 * i..8 * i + 8].try_into().unwrap());
    let put =
        |v: &mut [u8], i: usize, x: u64| v[8 * i..8 * i + 8].copy_from_slice(&x.to_le_bytes());
    match &mine {
        Ok(x) => put(&mut v, 0, *x),
        Err(e) => {
            let mut n = e.len().min(VERDICT_TEXT);
            while !e.is_char_boundary(n) {
                n -= 1;
            }
            put(&mut v, 1, 1);
            put(&mut v, 2, me as u64 + 1);
            put(&mut v, 3, n as u64);
            v[32..32 + n].copy_from_slice(&e.as_bytes()[..n]);
        }
    }
    let r = link.allreduce(&mut v, &mut |a, b| {
        put(a, 0, word(a, 0).wrapping_add(word(b, 0)));
        put(a, 1, word(a, 1) + word(b, 1));
        let (fa, fb) = (word(a, 2), word(b, 2));
        if fb != 0 && (fa == 0 || fb < fa) {
            a[16..].copy_from_slice(&b[16..]);
        }
    });
    if let Err(e) = r {
        return Err(match mine {
            Err(own) => format!("{check}: {own} (and the verdict's all-reduce failed: {e})"),
            Ok(_) => format!("{check}: node {me}: the verdict's all-reduce failed: {e}"),
        });
    }
    let failed = word(&v, 1);
    if failed == 0 {
        return Ok(word(&v, 0));
    }
    let node = word(&v, 2).saturating_sub(1);
    let n = (word(&v, 3) as usize).min(VERDICT_TEXT);
    let text = String::from_utf8_lossy(&v[32..32 + n]);
    let others = match failed {
        1 => String::new(),
        k => format!(" ({} other node(s) failed it too)", k - 1),
    };
    Err(format!("{check} failed on node {node}{others}: {text}"))
}

/// A 64-bit mix (splitmix64's finalizer): the suite's one source of
/// randomness, so that every node derives the same plan from the seed.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The plan's word for `parts` (a seed, a check, a round, an index …).
fn hash(parts: &[u64]) -> u64 {
    parts.iter().fold(0x6879_6669u64, |h, &p| mix(h ^ p))
}

/// Does `text` name node `node` ("node 1", not "node 12")?
fn names_node(text: &str, node: usize) -> bool {
    let needle = format!("node {node}");
    text.match_indices(&needle).any(|(i, _)| {
        !text[i + needle.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_named_by_its_whole_number() {
        assert!(names_node("node 0: lost node 1 (closed)", 1));
        assert!(names_node("lost node 1", 1));
        assert!(!names_node("lost node 12", 1));
        assert!(names_node("lost node 12, node 1", 1));
    }

    #[test]
    fn plans_differ_by_every_part() {
        assert_ne!(hash(&[1, 2]), hash(&[2, 1]));
        assert_ne!(hash(&[1]), hash(&[1, 0]));
    }
}
