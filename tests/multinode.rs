//! Multi-node runs of `examples/montecarlo`: real processes over real sockets
//! on loopback, started by every launcher hyfi knows (the embedded one,
//! `hyfi-run`, Slurm, PMI and Open MPI variables set by hand, `mpirun`
//! itself), and the failures a cluster meets (a node killed, a node
//! interrupted, strays at the coordinator's port, mismatched node counts, an
//! unreachable coordinator).
//!
//! Every test is bounded: whatever it started is killed (its process group,
//! and every montecarlo pid it saw) when the test ends, passing or not, and a
//! test that waits longer than [`BOUND`] fails.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::TcpStream;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use hyfi_net::tcp::wire::{Handshake, Purpose};

/// Points per block: small, so a run takes a fraction of a second.
const SAMPLES: &str = "2000";

mod common;
use common::*;

// ---------------------------------------------------------------------------
// montecarlo

/// montecarlo with small sizes and `procs` processors per node.
fn montecarlo(procs: usize, extra: &[&str]) -> Command {
    let mut cmd = command(&bins().montecarlo);
    cmd.args(["--procs", &procs.to_string(), "--samples", SAMPLES])
        .args(extra);
    cmd
}

// ---------------------------------------------------------------------------
// What montecarlo prints

/// What a correct run printed.
#[derive(Debug, Clone, PartialEq)]
struct Outcome {
    /// The result line up to its timing, identical on every node.
    result: String,
    hits: u64,
    quad_bits: String,
    pids: Vec<u32>,
}

fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|w| w.strip_prefix('=')))
}

/// The pid in a `node R of N (P processors), pid PID` line.
fn header_pid(line: &str, rank: usize, nodes: usize) -> Option<u32> {
    line.strip_prefix(&format!("node {rank} of {nodes} ("))?
        .split_once("), pid ")?
        .1
        .trim()
        .parse()
        .ok()
}

/// Checks every node's output: each of ranks 0..nodes says who it is (with
/// `procs` processors), prints one result line, the same on all, and
/// `check: OK`.
fn check_nodes(
    job: &Job,
    per_node: &BTreeMap<usize, Vec<String>>,
    nodes: usize,
    procs: usize,
) -> Outcome {
    let ranks: Vec<usize> = per_node.keys().copied().collect();
    if ranks != (0..nodes).collect::<Vec<_>>() {
        job.fail(&format!(
            "expected output from nodes 0..{nodes}, got {ranks:?}"
        ));
    }
    let mut results = Vec::new();
    let mut pids = Vec::new();
    for (&rank, lines) in per_node {
        let headers: Vec<&String> = lines.iter().filter(|l| l.starts_with("node ")).collect();
        let pid = match headers.as_slice() {
            [h] if h.starts_with(&format!(
                "node {rank} of {nodes} ({procs} processors), pid "
            )) =>
            {
                header_pid(h, rank, nodes)
            }
            _ => None,
        };
        let Some(pid) = pid else {
            job.fail(&format!(
                "node {rank}: expected one line `node {rank} of {nodes} ({procs} processors), \
                 pid P`, got {headers:?}"
            ))
        };
        pids.push(pid);
        let res: Vec<&String> = lines.iter().filter(|l| l.starts_with("result: ")).collect();
        let [res] = res.as_slice() else {
            job.fail(&format!(
                "node {rank}: expected one result line, got {res:?}"
            ))
        };
        let shape = format!(" ({nodes} nodes x {procs} procs, ");
        let Some((key, _)) = res.split_once(&shape) else {
            job.fail(&format!(
                "node {rank}: result line without {shape:?}: {res}"
            ))
        };
        results.push(key.to_owned());
        if !lines.iter().any(|l| l.starts_with("check: OK")) {
            job.fail(&format!("node {rank}: no `check: OK`"));
        }
    }
    // A clean run ends with every link saying goodbye: no node may report
    // a lost peer or an abort on the way out.
    for i in 0..job.procs.len() {
        let err = job.stderr(i);
        if err.contains("failed first") || err.contains("aborted") {
            job.fail("a clean run reported a failure on its way out");
        }
    }
    outcome(job, results, pids)
}

fn outcome(job: &Job, results: Vec<String>, pids: Vec<u32>) -> Outcome {
    let first = results[0].clone();
    if results.iter().any(|r| *r != first) {
        job.fail(&format!("nodes disagree on the result: {results:#?}"));
    }
    let hits = field(&first, "hits").and_then(|h| h.parse().ok());
    let quad_bits = field(&first, "quad_bits").filter(|q| q.len() == 16);
    let (Some(hits), Some(quad_bits)) = (hits, quad_bits) else {
        job.fail(&format!("cannot read hits= and quad_bits= in {first:?}"))
    };
    Outcome {
        result: first.clone(),
        hits,
        quad_bits: quad_bits.to_owned(),
        pids,
    }
}

/// The one-node answer, computed once: every configuration's hits must
/// equal it.
fn reference() -> &'static Outcome {
    static REF: OnceLock<Outcome> = OnceLock::new();
    REF.get_or_init(|| run_embedded(None, 1))
}

/// Runs montecarlo with `HYFI_NODES=nodes` (unset for `None`): the
/// embedded launcher, or one node.
fn run_embedded(nodes: Option<usize>, procs: usize) -> Outcome {
    let mut job = Job::new(&format!(
        "embedded launch of {nodes:?} nodes x {procs} procs"
    ));
    let mut cmd = montecarlo(procs, &[]);
    if let Some(n) = nodes {
        cmd.env("HYFI_NODES", n.to_string());
    }
    job.spawn("montecarlo", cmd);
    let status = job.wait(0, BOUND);
    if !status.success() {
        job.fail(&format!("exited with {status}"));
    }
    let out = job.stdout(0);
    let per_node = by_node(&out, nodes.unwrap_or(1));
    let o = check_nodes(&job, &per_node, nodes.unwrap_or(1), procs);
    for &p in &o.pids {
        job.track(p);
    }
    o
}

/// Runs `hyfi-run -n nodes -p procs montecarlo`.
fn run_hyfi_run(nodes: usize, procs: usize) -> Outcome {
    let mut job = Job::new(&format!("hyfi-run -n {nodes} -p {procs}"));
    let mut cmd = command(&bins().hyfi_run);
    cmd.args(["-n", &nodes.to_string(), "-p", &procs.to_string(), "--"])
        .arg(&bins().montecarlo)
        .args(["--samples", SAMPLES]);
    job.spawn("hyfi-run", cmd);
    let status = job.wait(0, BOUND);
    if !status.success() {
        job.fail(&format!("exited with {status}"));
    }
    let o = check_nodes(&job, &by_node(&job.stdout(0), nodes), nodes, procs);
    for &p in &o.pids {
        job.track(p);
    }
    o
}

/// Starts `nodes` montecarlo processes by hand, node i with the variables
/// `env(i)`, and checks they all succeed with the same result.
fn run_by_hand(
    what: &str,
    nodes: usize,
    files: Vec<PathBuf>,
    env: impl Fn(usize) -> Vec<(&'static str, String)>,
) -> Outcome {
    let mut job = Job::new(what);
    job.files = files;
    for rank in 0..nodes {
        let mut cmd = montecarlo(1, &[]);
        // The launchers' variables by hand, without an MPI library behind
        // them: the TCP transport's bootstrap is what is tested (with the
        // `mpi` feature, MPI would be the default under them).
        cmd.env("HYFI_TRANSPORT", "tcp").envs(env(rank));
        job.spawn(&format!("rank {rank}"), cmd);
    }
    let statuses = job.wait_all(BOUND);
    if statuses.iter().any(|s| !s.success()) {
        job.fail(&format!("not every node succeeded: {statuses:?}"));
    }
    let per_node: BTreeMap<usize, Vec<String>> = (0..nodes).map(|r| (r, job.stdout(r))).collect();
    check_nodes(&job, &per_node, nodes, 1)
}

/// Checks that two runs of one configuration agree bit for bit, and that
/// their hits are the one-node count.
fn check_runs(what: &str, a: &Outcome, b: &Outcome) {
    assert_eq!(
        a.quad_bits, b.quad_bits,
        "{what}: two runs gave different quadrature bits: {a:?} vs {b:?}"
    );
    assert_eq!(a.result, b.result, "{what}: two runs differ");
    assert_eq!(
        a.hits,
        reference().hits,
        "{what}: hits differ from the one-node run {:?}",
        reference()
    );
}

// ---------------------------------------------------------------------------
// 1, 2: hyfi's launchers

#[test]
fn embedded_launch_agrees_with_one_node() {
    let one = run_embedded(None, 1);
    check_runs("1 x 1", reference(), &one);
    for (nodes, procs) in [(2, 1), (4, 1), (2, 2)] {
        let what = format!("HYFI_NODES={nodes}, {procs} procs");
        let a = run_embedded(Some(nodes), procs);
        let b = run_embedded(Some(nodes), procs);
        check_runs(&what, &a, &b);
        assert_eq!(a.pids.len(), nodes);
    }
}

#[test]
fn hyfi_run_agrees_with_one_node() {
    for nodes in [2, 4] {
        let a = run_hyfi_run(nodes, 1);
        let b = run_hyfi_run(nodes, 1);
        check_runs(&format!("hyfi-run -n {nodes} -p 1"), &a, &b);
    }
}

// ---------------------------------------------------------------------------
// 3: other launchers' variables, set by hand

#[test]
fn slurm_variables_by_hand() {
    let nodes = 3;
    let coord = format!("127.0.0.1:{}", free_port());
    let job_id = (u32::from_le_bytes(random_bytes()) % 1_000_000).to_string();
    let run = || {
        run_by_hand("Slurm by hand", nodes, Vec::new(), |rank| {
            vec![
                ("SLURM_PROCID", rank.to_string()),
                ("SLURM_NTASKS", nodes.to_string()),
                ("SLURM_JOB_ID", job_id.clone()),
                ("SLURM_STEP_ID", "0".to_owned()),
                ("HYFI_COORD", coord.clone()),
            ]
        })
    };
    let a = run();
    let b = run();
    check_runs("Slurm by hand", &a, &b);
}

#[test]
fn pmi_variables_by_hand() {
    let nodes = 2;
    let run = || {
        let file = std::env::temp_dir().join(format!("{}.addr", unique("pmi")));
        let f = file.to_string_lossy().into_owned();
        run_by_hand("PMI by hand", nodes, vec![file], |rank| {
            vec![
                ("PMI_RANK", rank.to_string()),
                ("PMI_SIZE", nodes.to_string()),
                ("HYFI_RENDEZVOUS", f.clone()),
            ]
        })
    };
    let a = run();
    let b = run();
    check_runs("PMI by hand", &a, &b);
}

#[test]
fn open_mpi_variables_by_hand() {
    let nodes = 3;
    let run = || {
        // The default rendezvous: $TMPDIR/hyfi-<namespace>.addr.
        let ns = unique("ompi");
        let tmp = std::env::var_os("TMPDIR")
            .filter(|t| !t.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/tmp"));
        let file = tmp.join(format!("hyfi-{ns}.addr"));
        run_by_hand("Open MPI by hand", nodes, vec![file], |rank| {
            vec![
                ("OMPI_COMM_WORLD_RANK", rank.to_string()),
                ("OMPI_COMM_WORLD_SIZE", nodes.to_string()),
                ("OMPI_COMM_WORLD_LOCAL_SIZE", nodes.to_string()),
                ("PMIX_NAMESPACE", ns.clone()),
            ]
        })
    };
    let a = run();
    let b = run();
    check_runs("Open MPI by hand", &a, &b);
}

// ---------------------------------------------------------------------------
// 4: mpirun

/// The transports a job under `mpirun` can run on in this build.
fn mpirun_transports() -> &'static [&'static str] {
    if cfg!(feature = "mpi") {
        &["tcp", "mpi"]
    } else {
        &["tcp"]
    }
}

fn run_mpirun(mpirun: &Path, nodes: usize, transport: &str) -> Outcome {
    let mut job = Job::new(&format!("mpirun -np {nodes} (HYFI_TRANSPORT={transport})"));
    let mut cmd = command(mpirun);
    cmd.args(["--oversubscribe", "--allow-run-as-root", "-np"])
        .arg(nodes.to_string())
        .args(["-x", "HYFI_PIN=0"])
        .args(["-x", &format!("HYFI_TRANSPORT={transport}")])
        .arg(&bins().montecarlo)
        .args(["--procs", "1", "--samples", SAMPLES])
        // Open MPI 4 refuses to start, even on one host, without an ssh or
        // rsh it can find (containers often have neither); local ranks never
        // use it.
        .env("OMPI_MCA_plm_rsh_agent", "false");
    job.spawn("mpirun", cmd);
    let status = job.wait(0, BOUND);
    let out = job.stdout(0);
    // Every rank writes straight to mpirun's stdout, without a prefix: tell
    // the nodes apart by their header lines, and count the rest.
    let mut pids = vec![None; nodes];
    for l in out.iter().filter(|l| l.starts_with("node ")) {
        let Some((rank, pid)) = (0..nodes).find_map(|r| Some((r, header_pid(l, r, nodes)?))) else {
            job.fail(&format!("unexpected line {l:?}"))
        };
        job.track(pid);
        if !l.contains(" (1 processors), pid ") || pids[rank].replace(pid).is_some() {
            job.fail(&format!("bad or repeated header {l:?}"));
        }
    }
    if !status.success() {
        job.fail(&format!("exited with {status}"));
    }
    let Some(pids) = pids.into_iter().collect::<Option<Vec<u32>>>() else {
        job.fail("not every rank printed its header")
    };
    let shape = format!(" ({nodes} nodes x 1 procs, ");
    let results: Vec<String> = out
        .iter()
        .filter(|l| l.starts_with("result: "))
        .map(|l| match l.split_once(&shape) {
            Some((key, _)) => key.to_owned(),
            None => job.fail(&format!("result line without {shape:?}: {l}")),
        })
        .collect();
    let oks = out.iter().filter(|l| l.starts_with("check: OK")).count();
    if results.len() != nodes || oks != nodes {
        job.fail(&format!(
            "expected {nodes} result lines and {nodes} `check: OK`, got {} and {oks}",
            results.len()
        ));
    }
    outcome(&job, results, pids)
}

#[test]
fn mpirun_agrees_with_one_node() {
    let Some(mpirun) = on_path("mpirun") else {
        if std::env::var_os("CI").is_some() {
            panic!("mpirun is not installed: CI must install Open MPI: see .ci/run");
        }
        eprintln!("SKIPPED: mpirun not installed");
        return;
    };
    for &transport in mpirun_transports() {
        for nodes in [2, 4] {
            let a = run_mpirun(&mpirun, nodes, transport);
            let b = run_mpirun(&mpirun, nodes, transport);
            check_runs(&format!("mpirun -np {nodes} over {transport}"), &a, &b);
        }
    }
}

// ---------------------------------------------------------------------------
// 5-9: failures

/// Environment of node `rank` of a job started by hand with hyfi's variables.
fn hyfi_env(
    rank: usize,
    nodes: usize,
    coord: &str,
    job: u64,
    token: &str,
) -> Vec<(&'static str, String)> {
    vec![
        ("HYFI_RANK", rank.to_string()),
        ("HYFI_NODES", nodes.to_string()),
        ("HYFI_COORD", coord.to_owned()),
        ("HYFI_JOB", job.to_string()),
        ("HYFI_TOKEN", token.to_owned()),
    ]
}

#[test]
fn kill_9_of_a_node_stops_the_job() {
    let nodes = 3;
    let mut job = Job::new("kill -9 of node 1 of 3 (embedded)");
    let mut cmd = montecarlo(1, &["--phases", "200", "--sleep-ms", "50"]);
    cmd.env("HYFI_NODES", nodes.to_string());
    job.spawn("launcher", cmd);
    let mut pids = Vec::new();
    for rank in 0..nodes {
        let prefix = format!("[node {rank}] node {rank} of {nodes} ");
        let line = job.wait_line(0, &format!("node {rank}'s header"), |l| {
            l.starts_with(&prefix)
        });
        let pid = header_pid(
            line.trim_start_matches(&format!("[node {rank}] ")),
            rank,
            nodes,
        )
        .unwrap_or_else(|| job.fail(&format!("no pid in {line:?}")));
        job.track(pid);
        pids.push(pid);
    }
    // Let it run a little, then kill node 1.
    std::thread::sleep(Duration::from_millis(200));
    if job.poll(0).is_some() {
        job.fail("the job ended before node 1 was killed");
    }
    assert!(
        send_signal(&pids[1].to_string(), "KILL"),
        "kill -9 {}",
        pids[1]
    );
    let killed = Instant::now();
    let status = job.wait(0, Duration::from_secs(5));
    let took = job.exited_at(0) - killed;
    if status.success() || took > Duration::from_secs(5) {
        job.fail(&format!(
            "the launcher should exit non-zero within 5 s of the kill: {status} after {took:?}"
        ));
    }
    let err = job.stderr(0);
    // The launcher's first line names the cause, and its code is SIGKILL's.
    let first = err.lines().find(|l| l.starts_with("hyfi launcher:"));
    if first != Some("hyfi launcher: node 1 failed first: was killed by signal 9 (SIGKILL)") {
        job.fail(&format!("the launcher's first line is {first:?}"));
    }
    if status.code() != Some(137) {
        job.fail(&format!(
            "the launcher should exit 137 (SIGKILL), not {status}"
        ));
    }
    for rank in [0, 2] {
        let prefix = format!("[node {rank}] ");
        let said = err.lines().any(|l| {
            l.starts_with(&prefix) && l.contains(&format!("node {rank}: node 1 failed first: lost"))
        });
        if !said {
            job.fail(&format!("node {rank} does not say node 1 failed first"));
        }
    }
    // No node left behind.
    let gone_by = Instant::now() + Duration::from_secs(2);
    while pids.iter().any(|&p| example_alive(p)) && Instant::now() < gone_by {
        std::thread::sleep(Duration::from_millis(20));
    }
    let alive: Vec<u32> = pids.iter().copied().filter(|&p| example_alive(p)).collect();
    if !alive.is_empty() {
        job.fail(&format!(
            "montecarlo processes still running after the launcher exited: {alive:?}"
        ));
    }
    job.no_panics();
    // Each message names its node once (`node 0: node 1 failed first: ...`).
    for rank in [0, 2] {
        let twice = format!("node {rank}: node {rank}:");
        if let Some(l) = err.lines().find(|l| l.contains(&twice)) {
            job.fail(&format!("node {rank} named twice in {l:?}"));
        }
    }
}

/// Two nodes started by hand; `signal` goes to node `victim` mid-run.
fn signal_a_node(signal: &str, victim: usize, code: i32) {
    let nodes = 2;
    let mut job = Job::new(&format!("SIG{signal} to node {victim} of 2 (by hand)"));
    let coord = format!("127.0.0.1:{}", free_port());
    let id = u64::from_le_bytes(random_bytes());
    let token = hex(&random_bytes::<16>());
    for rank in 0..nodes {
        let mut cmd = montecarlo(1, &["--phases", "400", "--sleep-ms", "50"]);
        cmd.envs(hyfi_env(rank, nodes, &coord, id, &token));
        job.spawn(&format!("node {rank}"), cmd);
    }
    for rank in 0..nodes {
        let prefix = format!("node {rank} of {nodes} ");
        job.wait_line(rank, "its header", |l| l.starts_with(&prefix));
        let pid = job.pid(rank);
        job.track(pid);
    }
    std::thread::sleep(Duration::from_millis(200));
    assert!(send_signal(&job.pid(victim).to_string(), signal));
    let sent = Instant::now();
    let statuses = job.wait_all(Duration::from_secs(5));
    for (rank, st) in statuses.iter().enumerate() {
        let took = job.exited_at(rank) - sent;
        if st.success() || took > Duration::from_secs(5) {
            job.fail(&format!(
                "node {rank} should exit non-zero within 5 s: {st} after {took:?}"
            ));
        }
    }
    if statuses[victim].code() != Some(code) {
        job.fail(&format!(
            "node {victim} should exit with {code}, not {}",
            statuses[victim]
        ));
    }
    if !job
        .stderr(victim)
        .contains(&format!("received SIG{signal}"))
    {
        job.fail(&format!(
            "node {victim} does not say it received SIG{signal}"
        ));
    }
    let other = 1 - victim;
    if !job.stderr(other).contains(&format!(
        "node {other}: node {victim} failed first: received SIG{signal}"
    )) {
        job.fail(&format!(
            "node {other} does not say node {victim} failed first"
        ));
    }
    job.no_panics();
}

#[test]
fn sigint_to_a_node_aborts_the_job() {
    signal_a_node("INT", 1, 130);
}

#[test]
fn sigterm_to_the_coordinator_aborts_the_job() {
    signal_a_node("TERM", 0, 143);
}

#[test]
fn strays_at_the_coordinator_are_refused() {
    let nodes = 2;
    let mut job = Job::new("garbage and a wrong token at node 0's port");
    let port = free_port();
    let coord = format!("127.0.0.1:{port}");
    let id = u64::from_le_bytes(random_bytes());
    let token: [u8; 16] = random_bytes();
    for rank in 0..nodes {
        let mut cmd = montecarlo(1, &["--phases", "40", "--sleep-ms", "50"]);
        cmd.envs(hyfi_env(rank, nodes, &coord, id, &hex(&token)));
        job.spawn(&format!("node {rank}"), cmd);
    }
    for rank in 0..nodes {
        let prefix = format!("node {rank} of {nodes} ");
        job.wait_line(rank, "its header", |l| l.starts_with(&prefix));
        let pid = job.pid(rank);
        job.track(pid);
    }
    // Garbage (never starting with the magic).
    let mut garbage: [u8; 64] = random_bytes();
    garbage[0] = b'#';
    let mut s = TcpStream::connect(("127.0.0.1", port))
        .unwrap_or_else(|e| job.fail(&format!("connecting to node 0 mid-run: {e}")));
    let _ = s.write_all(&garbage);
    drop(s);
    // A well-formed hello of this job from a stranger (who cannot prove the token).
    let mut wrong = token;
    wrong[0] ^= 0xff;
    let hello = Handshake {
        purpose: Purpose::Hello,
        job: id,
        nonce: wrong,
        rank: 1,
        nodes: nodes as u32,
    };
    let mut s = TcpStream::connect(("127.0.0.1", port))
        .unwrap_or_else(|e| job.fail(&format!("connecting to node 0 mid-run: {e}")));
    let _ = s.write_all(&hello.encode());
    drop(s);
    if job.poll(0).is_some() || job.poll(1).is_some() {
        job.fail("the job ended before the strays were sent: make the run longer");
    }
    let statuses = job.wait_all(BOUND);
    if statuses.iter().any(|s| !s.success()) {
        job.fail(&format!("the strays broke the job: {statuses:?}"));
    }
    let per_node: BTreeMap<usize, Vec<String>> = (0..nodes).map(|r| (r, job.stdout(r))).collect();
    check_nodes(&job, &per_node, nodes, 1);
    let refused = job.stderr(0).matches("refused a connection").count();
    if refused != 2 {
        job.fail(&format!(
            "node 0 should log `refused a connection` twice (garbage, wrong token), not {refused} times"
        ));
    }
}

#[test]
fn mismatched_node_counts_fail_both_nodes() {
    let mut job = Job::new("node 0 for 2 nodes, node 1 for 3");
    let coord = format!("127.0.0.1:{}", free_port());
    for (rank, nodes) in [(0, 2), (1, 3)] {
        let mut cmd = montecarlo(1, &[]);
        cmd.env("HYFI_RANK", rank.to_string())
            .env("HYFI_NODES", nodes.to_string())
            .env("HYFI_COORD", &coord)
            .env("HYFI_TIMEOUT", "5");
        job.spawn(&format!("node {rank}"), cmd);
    }
    let started = Instant::now();
    let statuses = job.wait_all(Duration::from_secs(10));
    for (rank, st) in statuses.iter().enumerate() {
        let took = job.exited_at(rank) - started;
        if st.success() || took > Duration::from_secs(10) {
            job.fail(&format!(
                "node {rank} should exit non-zero within 10 s: {st} after {took:?}"
            ));
        }
        if !job
            .stderr(rank)
            .contains("started for 3 nodes but node 0 for 2")
        {
            job.fail(&format!(
                "node {rank}'s stderr does not explain the mismatch"
            ));
        }
    }
    job.no_panics();
}

#[test]
fn unreachable_coordinator_times_out() {
    let mut job = Job::new("node 1 of 2 with no coordinator");
    let coord = format!("127.0.0.1:{}", free_port());
    let mut cmd = montecarlo(1, &[]);
    cmd.env("HYFI_RANK", "1")
        .env("HYFI_NODES", "2")
        .env("HYFI_COORD", &coord)
        .env("HYFI_TIMEOUT", "2");
    let started = Instant::now();
    job.spawn("node 1", cmd);
    // HYFI_TIMEOUT is 2 s; the bound only turns a hang into a red test (a
    // loaded machine may take several seconds more to start and stop it).
    let st = job.wait(0, Duration::from_secs(30));
    let took = job.exited_at(0) - started;
    if st.success() {
        job.fail(&format!("should exit non-zero: {st} after {took:?}"));
    }
    let err = job.stderr(0);
    if !err.contains("could not reach the coordinator") || !err.contains(&coord) {
        job.fail("stderr does not say the coordinator could not be reached, and where");
    }
    if st.signal().is_some() {
        job.fail("killed by a signal instead of exiting with an error");
    }
    job.no_panics();
}

#[test]
fn sigusr1_prints_a_nodes_statistics_and_the_job_goes_on() {
    let nodes = 2;
    let mut job = Job::new("SIGUSR1 to node 1 of 2 (by hand)");
    let coord = format!("127.0.0.1:{}", free_port());
    let id = u64::from_le_bytes(random_bytes());
    let token = hex(&random_bytes::<16>());
    for rank in 0..nodes {
        let mut cmd = montecarlo(1, &["--phases", "30", "--sleep-ms", "20"]);
        cmd.envs(hyfi_env(rank, nodes, &coord, id, &token));
        job.spawn(&format!("node {rank}"), cmd);
    }
    for rank in 0..nodes {
        let prefix = format!("node {rank} of {nodes} ");
        job.wait_line(rank, "its header", |l| l.starts_with(&prefix));
        let pid = job.pid(rank);
        job.track(pid);
    }
    std::thread::sleep(Duration::from_millis(200));
    assert!(send_signal(&job.pid(1).to_string(), "USR1"));
    let statuses = job.wait_all(Duration::from_secs(20));
    for (rank, st) in statuses.iter().enumerate() {
        if !st.success() {
            job.fail(&format!(
                "node {rank} should finish normally after SIGUSR1: {st}"
            ));
        }
        if !job.stdout(rank).iter().any(|l| l.starts_with("check: OK")) {
            job.fail(&format!("node {rank} did not check OK"));
        }
    }
    let err = job.stderr(1);
    // Message counters, then the runtime's per-processor table.
    if !err.contains("hyfi: node 1 traffic: control sent") || !err.contains("filaments") {
        job.fail("node 1 did not print its statistics on SIGUSR1");
    }
    job.no_panics();
}

// ---------------------------------------------------------------------------
// CPUs shared out between the nodes of one host

/// A `Cpus_allowed_list` value ("0-2,5") as CPU numbers.
fn cpu_list(v: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for part in v.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.parse::<usize>().unwrap()..=b.parse::<usize>().unwrap()),
            None => out.push(part.parse().unwrap()),
        }
    }
    out
}

/// `Cpus_allowed_list` of `/proc/<pid>[/task/<tid>]/status`.
fn allowed_of(status: &str) -> Vec<usize> {
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list in status");
    cpu_list(line)
}

/// Every thread of process `pid`: its name and the CPUs it may run on.
fn thread_cpus(pid: u32) -> Vec<(String, Vec<usize>)> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).expect("the node is running") {
        let dir = t.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        // A thread that ended between the listing and this read is skipped.
        if let Ok(status) = std::fs::read_to_string(dir.join("status")) {
            out.push((comm.trim().to_string(), allowed_of(&status)));
        }
    }
    out
}

/// The CPUs each server thread (`hyfi-server-*`) of process `pid` may run on.
fn server_thread_cpus(pid: u32) -> Vec<Vec<usize>> {
    thread_cpus(pid)
        .into_iter()
        .filter(|(name, _)| name.starts_with("hyfi-server"))
        .map(|(_, cpus)| cpus)
        .collect()
}

/// Runs `cmd` (a launcher starting 2 montecarlo nodes on this host, pinned,
/// default processors, for some 2 s) and checks that the nodes' server
/// threads, read back from `/proc`, are pinned to disjoint CPUs that
/// together are the CPUs allowed to this test.
fn local_nodes_share_the_cpus(what: &str, mut cmd: Command, lines_whole: bool) {
    let allowed = allowed_of(&std::fs::read_to_string("/proc/self/status").unwrap());
    let nodes = 2;
    let mut job = Job::new(what);
    cmd.env("HYFI_PIN", "1").env("HYFI_VERBOSE", "1");
    job.spawn("launcher", cmd);
    let mut per_node = Vec::new();
    for rank in 0..nodes {
        let line = job.wait_line(0, "a node's pid", |l| {
            l.contains(&format!("node {rank} of {nodes} (")) && l.contains("pid ")
        });
        let pid: u32 = line.rsplit("pid ").next().unwrap().trim().parse().unwrap();
        job.track(pid);
        per_node.push(server_thread_cpus(pid));
        // The node's other threads (communication, main) stay on
        // the node's CPUs (with the default processor count, its server
        // threads' CPUs), off the other node's.
        let share: Vec<usize> = per_node[rank].iter().flatten().copied().collect();
        for (name, cpus) in thread_cpus(pid) {
            assert!(
                cpus.iter().all(|c| share.contains(c)),
                "{what}: node {rank}: thread {name} may run on {cpus:?}, outside the node's CPUs {share:?}"
            );
        }
    }
    let st = job.wait(0, BOUND);
    if !st.success() {
        job.fail("the job failed");
    }
    // Each server thread pinned to one CPU; a node's threads to distinct ones.
    let mut all: Vec<usize> = Vec::new();
    for (rank, threads) in per_node.iter().enumerate() {
        assert!(
            !threads.is_empty(),
            "{what}: node {rank}: no server thread found"
        );
        for t in threads {
            assert_eq!(
                t.len(),
                1,
                "{what}: node {rank}: a server thread may run on {t:?}"
            );
        }
        all.extend(threads.iter().map(|t| t[0]));
    }
    all.sort_unstable();
    if allowed.len() == nodes {
        // Disjoint between the nodes, and together every allowed CPU (the
        // default processor count is the node's share).
        assert_eq!(all, allowed, "{what}: server threads' CPUs {per_node:?}");
    } else if allowed.len() > nodes {
        let mut dedup = all.clone();
        dedup.dedup();
        assert_eq!(dedup, all, "{what}: nodes share a CPU: {per_node:?}");
    }
    // The runtime says where it pinned at start-up (HYFI_VERBOSE=1); hyfi's
    // launchers pass each node's lines whole (mpirun may interleave them).
    let err = job.stderr(0);
    if lines_whole {
        let said = (0..nodes)
            .filter(|r| err.contains(&format!("hyfi: node {r} of {nodes}:")))
            .count();
        assert_eq!(said, nodes, "{what}: {err}");
    }
    job.no_panics();
}

/// montecarlo running 20 phases of 100 ms (long enough to read its threads).
fn slow_montecarlo_args() -> [&'static str; 6] {
    ["--samples", SAMPLES, "--phases", "20", "--sleep-ms", "100"]
}

#[test]
fn local_nodes_pin_to_disjoint_cpus_that_cover_the_allowed_ones() {
    let mut cmd = command(&bins().montecarlo);
    cmd.args(slow_montecarlo_args()).env("HYFI_NODES", "2");
    local_nodes_share_the_cpus("embedded launcher, 2 nodes", cmd, true);

    let mut cmd = command(&bins().hyfi_run);
    cmd.args(["-n", "2", "--"])
        .arg(&bins().montecarlo)
        .args(slow_montecarlo_args());
    local_nodes_share_the_cpus("hyfi-run -n 2", cmd, true);
}

#[test]
fn a_launcher_mask_of_one_cpu_is_kept() {
    // The whole job started under `taskset -c <last CPU>`: a mask of fewer
    // CPUs than the host has online is the launcher's binding, kept as it
    // is (both nodes on that CPU), not divided further.
    let allowed = allowed_of(&std::fs::read_to_string("/proc/self/status").unwrap());
    let Some(taskset) = on_path("taskset") else {
        panic!("taskset (util-linux) is needed for this test");
    };
    let cpu = *allowed.last().unwrap();
    let mut job = Job::new("taskset -c CPU, 2 local nodes");
    let mut cmd = command(&taskset);
    cmd.args(["-c", &cpu.to_string()])
        .arg(&bins().montecarlo)
        .args(slow_montecarlo_args())
        .env("HYFI_NODES", "2")
        .env("HYFI_PIN", "1");
    job.spawn("launcher", cmd);
    for rank in 0..2 {
        let line = job.wait_line(0, "a node's pid", |l| {
            l.contains(&format!("node {rank} of 2 (")) && l.contains("pid ")
        });
        let pid: u32 = line.rsplit("pid ").next().unwrap().trim().parse().unwrap();
        job.track(pid);
        let threads = server_thread_cpus(pid);
        assert!(!threads.is_empty());
        for t in &threads {
            assert_eq!(t, &vec![cpu], "node {rank}: {threads:?}");
        }
    }
    if !job.wait(0, BOUND).success() {
        job.fail("the job failed");
    }
    job.no_panics();
}

#[test]
fn local_nodes_under_mpirun_share_the_cpus_with_and_without_its_binding() {
    let Some(mpirun) = on_path("mpirun") else {
        if std::env::var_os("CI").is_some() {
            panic!("mpirun is not installed: CI must install Open MPI: see .ci/run");
        }
        eprintln!("SKIPPED: mpirun not installed");
        return;
    };
    // --bind-to none: the whole mask, divided by OMPI_COMM_WORLD_LOCAL_RANK;
    // --bind-to core: Open MPI's one-CPU masks, kept as they are.
    for bind in ["none", "core"] {
        let mut cmd = command(&mpirun);
        cmd.args(["--allow-run-as-root", "--bind-to", bind, "-np", "2"])
            .args(["-x", "HYFI_PIN=1", "-x", "HYFI_VERBOSE=1"])
            .arg(&bins().montecarlo)
            .args(slow_montecarlo_args())
            .env("OMPI_MCA_plm_rsh_agent", "false");
        local_nodes_share_the_cpus(&format!("mpirun --bind-to {bind} -np 2"), cmd, false);
    }
}

#[test]
fn asking_for_more_processors_than_the_nodes_share_is_a_clear_error() {
    let allowed = allowed_of(&std::fs::read_to_string("/proc/self/status").unwrap());
    let mut job = Job::new("2 local nodes asking for every CPU each");
    let mut cmd = command(&bins().montecarlo);
    cmd.args(["--samples", SAMPLES, "--procs", &allowed.len().to_string()])
        .env("HYFI_NODES", "2")
        .env("HYFI_PIN", "1");
    job.spawn("launcher", cmd);
    let st = job.wait(0, BOUND);
    if allowed.len() < 2 {
        return; // one CPU: each node's share is that CPU, and one processor fits
    }
    if st.success() {
        job.fail("should fail: each node's share is half the CPUs");
    }
    let err = job.stderr(0);
    assert!(
        err.contains("divided between the nodes of the job on this host")
            && err.contains("HYFI_PIN=0"),
        "{err}"
    );
}
