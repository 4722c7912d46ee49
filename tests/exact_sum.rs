//! `examples/exact_sum` on 1×1, 1×2, 2×1 and 2×2 (nodes × processors),
//! real processes through the embedded launcher: the exact sum's bits are
//! the same everywhere and equal a sequential exact sum, where plain
//! `Op::Sum` over the same values gives different bits on different
//! configurations.

use std::collections::BTreeSet;

mod common;
use common::*;

fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|w| w.strip_prefix('=')))
}

/// The (exact, plain) bits every node of `nodes × procs` printed, checked
/// to agree across nodes; and the sequential exact bits.
fn run(nodes: usize, procs: usize) -> (String, String, String) {
    // Built before the job's clock starts: the first build takes a while.
    let exe = &bins().exact_sum;
    let mut job = Job::new(&format!("exact_sum on {nodes} nodes x {procs} procs"));
    let mut cmd = command(exe);
    cmd.args([
        "--nodes",
        &nodes.to_string(),
        "--procs",
        &procs.to_string(),
        "--n",
        "50000",
    ]);
    job.spawn("exact_sum", cmd);
    let status = job.wait(0, BOUND);
    if !status.success() {
        job.fail(&format!("exited with {status}"));
    }
    let per_node = by_node(&job.stdout(0), nodes);
    if per_node.keys().copied().collect::<Vec<_>>() != (0..nodes).collect::<Vec<_>>() {
        job.fail(&format!("expected output from nodes 0..{nodes}"));
    }
    let mut seen = BTreeSet::new();
    let mut seq = BTreeSet::new();
    for (rank, lines) in &per_node {
        let line = |prefix: &str| {
            let found: Vec<&String> = lines.iter().filter(|l| l.starts_with(prefix)).collect();
            match found.as_slice() {
                [l] => (*l).clone(),
                _ => job.fail(&format!("node {rank}: expected one {prefix:?} line")),
            }
        };
        let res = line("result: ");
        let shape = format!("({nodes} nodes x {procs} procs,");
        if !res.contains(&shape) {
            job.fail(&format!(
                "node {rank}: result line without {shape:?}: {res}"
            ));
        }
        let (Some(e), Some(p)) = (field(&res, "exact_bits"), field(&res, "plain_bits")) else {
            job.fail(&format!(
                "node {rank}: no exact_bits= and plain_bits= in {res}"
            ))
        };
        seen.insert((e.to_owned(), p.to_owned()));
        let s = line("sequential: ");
        let Some(s) = field(&s, "exact_bits") else {
            job.fail(&format!("node {rank}: no sequential exact_bits= in {s}"))
        };
        seq.insert(s.to_owned());
        if !lines.iter().any(|l| l.starts_with("check: OK")) {
            job.fail(&format!("node {rank}: no `check: OK`"));
        }
    }
    if seen.len() != 1 || seq.len() != 1 {
        job.fail(&format!("nodes disagree: {seen:?}, sequential {seq:?}"));
    }
    let (e, p) = seen.into_iter().next().expect("one result");
    (e, p, seq.into_iter().next().expect("one sequential result"))
}

#[test]
fn exact_sum_has_the_same_bits_on_every_configuration() {
    let configs = [(1, 1), (1, 2), (2, 1), (2, 2)];
    let results: Vec<_> = configs.iter().map(|&(n, p)| run(n, p)).collect();
    let (exact0, _, seq) = &results[0];
    assert_eq!(exact0, seq, "1x1 exact sum vs sequential exact sum");
    for ((n, p), (e, _, s)) in configs.iter().zip(&results) {
        assert_eq!(e, seq, "{n}x{p}: exact sum differs from the sequential one");
        assert_eq!(s, seq, "{n}x{p}: sequential exact sums differ");
    }
    // Why it exists: the plain f64 sum of the same values, reproducible on
    // one configuration, is not the same on all of them.
    let plain: BTreeSet<&String> = results.iter().map(|(_, p, _)| p).collect();
    assert!(
        plain.len() > 1,
        "plain Op::Sum gave the same bits everywhere ({plain:?}); the data no longer shows the difference"
    );
}

#[test]
fn exact_sum_is_the_same_on_every_run() {
    let first = run(2, 2);
    for _ in 0..2 {
        assert_eq!(run(2, 2), first);
    }
}
