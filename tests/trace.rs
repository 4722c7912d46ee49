//! `HYFI_TRACE`: the merged timeline of real multi-process jobs, read back
//! as Chrome trace JSON and checked against the counters the same run
//! prints (phases, pages fetched, steals), under every launcher the tests
//! use (embedded, `hyfi-run`, `mpirun` and `hyfi-run --merge-trace`), and
//! the memory cap.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{bins, command, unique, Job, BOUND};
use serde_json::Value;

/// A directory of this test's own, removed when dropped.
struct Dir(PathBuf);

impl Dir {
    fn new(what: &str) -> Dir {
        let d = std::env::temp_dir().join(unique(what));
        std::fs::create_dir_all(&d).expect("creating a temporary directory");
        Dir(d)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `cmd` to its end; returns (stdout lines, stderr).
fn run(what: &str, cmd: Command) -> (Vec<String>, String) {
    let mut job = Job::new(what);
    job.spawn(what, cmd);
    let status = job.wait(0, BOUND);
    assert!(
        status.success(),
        "{what}: exited with {status}\n{}",
        job.dump()
    );
    (job.stdout(0), job.stderr(0))
}

/// The traced Jacobi of these tests: per row, one processor per node.
const JACOBI: [&str; 9] = [
    "--n",
    "130",
    "--iters",
    "20",
    "--eps",
    "0",
    "--per-row",
    "--procs",
    "1",
];

fn jacobi(nodes: usize, trace: &Path) -> Command {
    let mut cmd = command(&bins().jacobi);
    cmd.args(JACOBI)
        .args(["--nodes", &nodes.to_string()])
        .env("HYFI_TRACE", trace);
    cmd
}

/// The trace file, parsed; fails the test if it is not Chrome trace JSON.
fn parse(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading the trace {}: {e}", path.display()));
    let v: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    assert!(v["traceEvents"].is_array(), "no traceEvents array");
    v
}

fn events(v: &Value) -> &Vec<Value> {
    v["traceEvents"].as_array().expect("traceEvents")
}

fn num(e: &Value, key: &str) -> u64 {
    e["args"][key]
        .as_u64()
        .unwrap_or_else(|| panic!("event without a numeric {key}: {e}"))
}

/// Node `node`'s summary from the file's `otherData`, as `key -> value`.
fn summary(v: &Value, node: usize) -> BTreeMap<String, u64> {
    let s = v["otherData"][format!("hyfi_summary_node{node}")]
        .as_str()
        .unwrap_or_else(|| panic!("no summary of node {node} in otherData"));
    s.split(' ')
        .map(|kv| {
            let (k, v) = kv.split_once('=').expect("key=value");
            (k.to_string(), v.parse().expect("a number"))
        })
        .collect()
}

/// A number that follows `key` on a line (`"pages fetched 1026"`).
fn after(line: &str, key: &str) -> u64 {
    let rest = &line[line
        .find(key)
        .unwrap_or_else(|| panic!("{key:?} in {line:?}"))
        + key.len()..];
    rest.trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a number after {key:?} in {line:?}"))
}

/// What the run printed, per node: phases and steals (summed over the
/// processors of `Stats`' table) and DSM pages fetched.
fn printed_counters(out: &[String], nodes: usize) -> Vec<(u64, u64, u64)> {
    let by = common::by_node(out, nodes);
    (0..nodes)
        .map(|n| {
            let lines = &by[&n];
            let header = lines
                .iter()
                .position(|l| l.contains("proc |") && l.contains("phases"))
                .expect("the stats table");
            let (mut phases, mut steals) = (0, 0);
            for l in lines[header + 1..].iter().take_while(|l| l.contains(" | ")) {
                let cols: Vec<&str> = l.split('|').nth(1).unwrap().split_whitespace().collect();
                // filaments pruned forks steals latent tries suspends filthreads stacks idle phases
                steals += cols[3].parse::<u64>().unwrap();
                phases += cols[10].parse::<u64>().unwrap();
            }
            let pages = lines
                .iter()
                .find(|l| l.contains(" releases; "))
                .map(|l| after(l, "pages fetched"))
                .expect("the DSM's totals");
            (phases, steals, pages)
        })
        .collect()
}

/// Checks a merged trace of `nodes` one-processor nodes of jacobi against
/// the counters the run printed and the structure every trace has.
fn check_jacobi_trace(what: &str, trace: &Path, nodes: usize, out: &[String]) {
    let v = parse(trace);
    let evs = events(&v);
    // Events of every node and every processor.
    let mut segments: BTreeMap<(u64, u64), Vec<(f64, f64)>> = BTreeMap::new();
    let mut phases: BTreeMap<u64, u64> = BTreeMap::new();
    let mut pages_in: BTreeMap<u64, u64> = BTreeMap::new();
    let mut waits = 0;
    // Messages each node sent and received (to or from another node),
    // over whichever transport: TCP's and MPI's both trace them.
    let mut sent: BTreeMap<u64, u64> = BTreeMap::new();
    let mut received: BTreeMap<u64, u64> = BTreeMap::new();
    for e in evs {
        let pid = e["pid"].as_u64().expect("pid");
        let tid = e["tid"].as_u64().expect("tid");
        assert!(pid < nodes as u64, "{what}: event of node {pid}: {e}");
        let name = e["name"].as_str().expect("name");
        match (name, e["ph"].as_str().expect("ph")) {
            (n, "X") if n.starts_with("pool ") => {
                let ts = e["ts"].as_f64().unwrap();
                let dur = e["dur"].as_f64().unwrap();
                segments.entry((pid, tid)).or_default().push((ts, ts + dur));
            }
            (n, "X") if n.starts_with("phase ") => *phases.entry(pid).or_default() += 1,
            ("pages in", "i") => *pages_in.entry(pid).or_default() += num(e, "pages"),
            ("send", "i") => {
                let to = num(e, "to");
                assert!(to < nodes as u64 && to != pid, "{what}: {e}");
                assert!(num(e, "bytes") > 0, "{what}: {e}");
                *sent.entry(pid).or_default() += 1;
            }
            ("recv", "i") => {
                let from = num(e, "from");
                assert!(from < nodes as u64 && from != pid, "{what}: {e}");
                *received.entry(pid).or_default() += 1;
            }
            ("page wait", "b") => {
                // A page wait names the page and its home, another node.
                let home = num(e, "home");
                num(e, "page");
                assert!(num(e, "pages") >= 1, "{what}: {e}");
                assert!(home < nodes as u64 && home != pid, "{what}: {e}");
                waits += 1;
            }
            _ => {}
        }
    }
    assert!(
        waits > 0,
        "{what}: no page wait in a job that fetches pages"
    );
    for node in 0..nodes as u64 {
        // A release sends and receives at least one message a phase.
        let p = phases.get(&node).copied().unwrap_or(0);
        assert!(
            sent.get(&node).copied().unwrap_or(0) >= p
                && received.get(&node).copied().unwrap_or(0) >= p,
            "{what}: node {node}: {p} phases, {:?} messages sent, {:?} received",
            sent.get(&node),
            received.get(&node)
        );
        let segs = segments
            .get(&(node, 0))
            .unwrap_or_else(|| panic!("{what}: no segment of node {node}'s processor 0"));
        // One processor runs one segment at a time: after sorting by start,
        // each ends before the next begins (clocks monotonic per processor).
        let mut sorted = segs.clone();
        sorted.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
        for w in sorted.windows(2) {
            assert!(
                w[0].1 <= w[1].0 + 0.001,
                "{what}: node {node}: segments overlap: {w:?}"
            );
        }
    }
    // The trace's counts, its summary and the counters printed agree.
    let printed = printed_counters(out, nodes);
    for (node, &(p_phases, p_steals, p_pages)) in printed.iter().enumerate() {
        let s = summary(&v, node);
        let n = node as u64;
        assert_eq!(
            phases.get(&n).copied().unwrap_or(0),
            p_phases,
            "{what}: node {node}: phases"
        );
        assert_eq!(
            s["phases"], p_phases,
            "{what}: node {node}: summary's phases"
        );
        assert_eq!(
            s["steals"], p_steals,
            "{what}: node {node}: summary's steals"
        );
        assert_eq!(
            pages_in.get(&n).copied().unwrap_or(0),
            p_pages,
            "{what}: node {node}: pages in"
        );
        assert_eq!(
            s["pages_fetched"], p_pages,
            "{what}: node {node}: summary's pages"
        );
        assert_eq!(s["dropped"], 0, "{what}: node {node}: dropped events");
        assert!(s["compute_ns"] > 0, "{what}: node {node}: no compute time");
    }
    // The parts were merged and removed.
    for node in 0..nodes {
        let part = PathBuf::from(format!("{}.node{node}", trace.display()));
        assert!(!part.exists(), "{what}: {} left behind", part.display());
    }
}

#[test]
fn a_traced_job_merges_into_one_timeline_that_matches_its_counters() {
    for nodes in [2, 4] {
        let dir = Dir::new("trace-embedded");
        let trace = dir.0.join("jacobi.json");
        let what = format!("jacobi --nodes {nodes} with HYFI_TRACE");
        let (out, err) = run(&what, jacobi(nodes, &trace));
        check_jacobi_trace(&what, &trace, nodes, &out);
        // The launcher prints the summary: one line per node.
        let rows = err
            .lines()
            .filter(|l| l.starts_with("hyfi trace: ") && l.contains(" | "))
            .count();
        assert_eq!(
            rows,
            nodes + 1,
            "{what}: summary table (a header and a row per node):\n{err}"
        );
    }
}

#[test]
fn hyfi_run_merges_the_trace_too() {
    let dir = Dir::new("trace-hyfi-run");
    let trace = dir.0.join("jacobi.json");
    let mut cmd = command(&bins().hyfi_run);
    cmd.args(["-n", "2", "--"])
        .arg(&bins().jacobi)
        .args(JACOBI)
        .env("HYFI_TRACE", &trace);
    let (out, _) = run("hyfi-run -n 2 jacobi with HYFI_TRACE", cmd);
    check_jacobi_trace("hyfi-run -n 2 jacobi", &trace, 2, &out);
}

#[test]
fn under_mpirun_the_parts_merge_with_hyfi_run_merge_trace() {
    let Some(mpirun) = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("mpirun"))
            .find(|p| p.is_file())
    }) else {
        if std::env::var_os("CI").is_some() {
            panic!("mpirun is not installed: CI must install Open MPI: see .ci/run");
        }
        eprintln!("SKIPPED: mpirun not installed");
        return;
    };
    let dir = Dir::new("trace-mpirun");
    let trace = dir.0.join("jacobi.json");
    let mut cmd = command(&mpirun);
    cmd.args([
        "--oversubscribe",
        "--allow-run-as-root",
        "--tag-output",
        "-np",
        "2",
    ])
    .args(["-x", "HYFI_PIN=0", "-x"])
    .arg(format!("HYFI_TRACE={}", trace.display()))
    .arg(&bins().jacobi)
    .args(JACOBI)
    .env("OMPI_MCA_plm_rsh_agent", "false");
    let (out, err) = run("mpirun -np 2 jacobi with HYFI_TRACE", cmd);
    // No launcher of hyfi's: each node wrote its part, and node 0 says how
    // to merge them.
    assert!(
        err.contains("--merge-trace"),
        "node 0 names the merge command:\n{err}"
    );
    for node in 0..2 {
        let part = PathBuf::from(format!("{}.node{node}", trace.display()));
        assert!(part.exists(), "{} missing", part.display());
        // Each part opens alone.
        parse(&part);
    }
    let mut merge = command(&bins().hyfi_run);
    merge.arg("--merge-trace").arg(&trace);
    let (_, merged) = run("hyfi-run --merge-trace", merge);
    assert!(merged.contains("hyfi trace: "), "{merged}");
    // mpirun tags each line with its rank (`--tag-output`): `[1,r]<stdout>:`.
    let prefixed: Vec<String> = out
        .iter()
        .filter_map(|l| {
            let (tag, rest) = l.split_once("]<stdout>:")?;
            let rank = tag.rsplit(',').next()?;
            Some(format!("[node {rank}] {rest}"))
        })
        .collect();
    check_jacobi_trace("mpirun -np 2 jacobi", &trace, 2, &prefixed);
}

#[test]
fn steals_name_both_ends_and_match_the_counters() {
    // Within a node: fib on two processors.
    let dir = Dir::new("trace-fib");
    let trace = dir.0.join("fib.json");
    let mut cmd = command(&bins().fib);
    // Every fork real: processor 1 steals many times in any run (how many
    // is up to the scheduler; the trace must count what the counters do).
    cmd.args(["--n", "25", "--procs", "2", "--no-seq", "--no-prune"])
        .env("HYFI_TRACE", &trace);
    let (out, _) = run("fib --procs 2 with HYFI_TRACE", cmd);
    let v = parse(&trace);
    let mut steals = 0;
    for e in events(&v) {
        if e["name"] == "steal" {
            let (thief, donor) = (num(e, "thief"), num(e, "donor"));
            assert!(thief < 2 && donor < 2 && thief != donor, "{e}");
            assert_eq!(
                e["tid"].as_u64(),
                Some(thief),
                "a steal is on the thief's track: {e}"
            );
            steals += 1;
        }
    }
    let line = out
        .iter()
        .find(|l| l.starts_with("fjstats: "))
        .expect("fjstats line");
    assert_eq!(steals, after(line, "local_steals="), "{line}");
    assert_eq!(summary(&v, 0)["steals"], steals);

    // Across nodes: fib with join_remote on two nodes.
    let trace = dir.0.join("fib2.json");
    let mut cmd = command(&bins().fib);
    cmd.args(["--n", "30", "--procs", "1", "--nodes", "2", "--no-seq"])
        .env("HYFI_TRACE", &trace);
    let (out, _) = run("fib --nodes 2 with HYFI_TRACE", cmd);
    let v = parse(&trace);
    let by = common::by_node(&out, 2);
    let mut remote: BTreeMap<u64, u64> = BTreeMap::new();
    for e in events(&v) {
        let pid = e["pid"].as_u64().unwrap();
        match e["name"].as_str().unwrap() {
            "remote steal" => {
                let donor = num(e, "donor_node");
                assert!(donor < 2 && donor != pid, "{e}");
                if num(e, "filaments") > 0 {
                    *remote.entry(pid).or_default() += 1;
                }
            }
            "steal served" => assert!(num(e, "thief_node") < 2 && num(e, "thief_node") != pid),
            _ => {}
        }
    }
    for node in 0..2u64 {
        let line = by[&(node as usize)]
            .iter()
            .find(|l| l.starts_with("fjstats: "))
            .expect("fjstats line");
        let printed = after(line, "remote_steals=");
        assert_eq!(
            remote.get(&node).copied().unwrap_or(0),
            printed,
            "node {node}: {line}"
        );
        assert_eq!(summary(&v, node as usize)["remote_steals"], printed);
    }
}

#[test]
fn the_cap_bounds_memory_and_says_what_was_dropped() {
    let dir = Dir::new("trace-cap");
    let trace = dir.0.join("capped.json");
    let mut cmd = command(&bins().jacobi);
    cmd.args([
        "--n",
        "130",
        "--iters",
        "200",
        "--eps",
        "0",
        "--per-row",
        "--procs",
        "2",
    ])
    .env("HYFI_TRACE", &trace)
    .env("HYFI_TRACE_EVENTS", "100");
    let (_, err) = run("jacobi with HYFI_TRACE_EVENTS=100", cmd);
    assert!(
        err.contains("DROPPED"),
        "the run says events were dropped:\n{err}"
    );
    let v = parse(&trace);
    let kept = events(&v)
        .iter()
        .filter(|e| e["ph"] != "M" && e["ph"] != "e")
        .count();
    assert!(kept <= 100, "{kept} events kept, cap 100");
    let s = summary(&v, 0);
    assert_eq!(s["events"], 100);
    // 200 sweeps on two processors: at least a phase, a segment and a
    // barrier per sweep and processor were recorded or dropped.
    assert!(s["dropped"] >= 3 * 400 - 100, "{s:?}");
}

#[test]
fn a_bad_cap_is_a_configuration_error() {
    let dir = Dir::new("trace-badcap");
    let mut cmd = command(&bins().jacobi);
    cmd.args(["--n", "34", "--iters", "2", "--procs", "1"])
        .env("HYFI_TRACE", dir.0.join("x.json"))
        .env("HYFI_TRACE_EVENTS", "lots");
    let mut job = Job::new("jacobi with HYFI_TRACE_EVENTS=lots");
    job.spawn("jacobi", cmd);
    let status = job.wait(0, BOUND);
    assert_eq!(status.code(), Some(2), "{}", job.dump());
    assert!(
        job.stderr(0).contains("HYFI_TRACE_EVENTS"),
        "{}",
        job.dump()
    );
}

#[test]
fn a_trace_file_that_cannot_be_written_is_refused_at_start() {
    for nodes in ["1", "2"] {
        let mut cmd = command(&bins().jacobi);
        cmd.args([
            "--n", "34", "--iters", "2", "--procs", "1", "--nodes", nodes,
        ])
        .env("HYFI_TRACE", "/nonexistent-hyfi-dir/trace.json");
        let what = format!("jacobi --nodes {nodes} with an unwritable HYFI_TRACE");
        let mut job = Job::new(&what);
        job.spawn("jacobi", cmd);
        let status = job.wait(0, BOUND);
        assert_eq!(status.code(), Some(2), "{what}: {}", job.dump());
        let err = job.stderr(0);
        assert!(
            err.contains("cannot write the trace file /nonexistent-hyfi-dir/trace.json"),
            "{what}: {err}"
        );
        // Refused before the sweeps, not after: no result was printed.
        assert!(
            !job.stdout(0).iter().any(|l| l.contains("OK:")),
            "{what}: it ran"
        );
    }
}
