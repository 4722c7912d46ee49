//! Fork-join across nodes with real processes on loopback: `examples/quad`,
//! `examples/fib` and `examples/fj_probe` on 1, 2 and 4 nodes (the embedded
//! launcher, or nodes started by hand with hyfi's variables).
//!
//! * results equal the sequential recursion and the one-node run, on every
//!   node, with every node exiting cleanly, over repeated runs;
//! * the unbalanced integrand is shared (from the nodes' statistics);
//! * a filament that panics on node 1 surfaces its message at the root;
//! * a node that receives a filament it has not registered fails the run
//!   with the function's name;
//! * a node killed mid-run ends the job on every node, with a message.
//!
//! Every test is bounded; whatever it started is killed when it ends
//! (each process group; nodes of the embedded launcher die with it).
//! The tests take turns (one lock): concurrent jobs on a 2-core machine
//! would only measure the scheduler.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, ExitStatus};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

mod common;
use common::*;

/// The longest one job may take.
const FJ_BOUND: Duration = Duration::from_secs(60);

/// One test at a time.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `cmd` to its end (within [`FJ_BOUND`]).
fn run(what: &str, cmd: Command) -> (ExitStatus, Job) {
    let mut job = Job::with_bound(what, FJ_BOUND);
    job.spawn("program", cmd);
    let st = job.wait(0, FJ_BOUND);
    (st, job)
}

/// The `key=value` fields of a node's `fjstats:` line.
fn fjstats(lines: &[String]) -> BTreeMap<String, f64> {
    let line = lines
        .iter()
        .find(|l| l.starts_with("fjstats: "))
        .unwrap_or_else(|| panic!("no fjstats line in {lines:#?}"));
    line.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.parse().unwrap_or(f64::NAN)))
        .collect()
}

/// Runs an example on `nodes × procs` (the embedded launcher) and checks
/// that every node succeeded, printed `OK` and one `result:` line, the same
/// on all. Returns the result line and each node's statistics.
fn run_ok(
    exe: &Path,
    nodes: usize,
    procs: usize,
    args: &[&str],
) -> (String, Vec<BTreeMap<String, f64>>) {
    run_ok_with(exe, nodes, procs, args, &[])
}

/// [`run_ok`] with `env` set for every node.
fn run_ok_with(
    exe: &Path,
    nodes: usize,
    procs: usize,
    args: &[&str],
    env: &[(&str, &str)],
) -> (String, Vec<BTreeMap<String, f64>>) {
    let what = format!("{} {args:?} {env:?} on {nodes}x{procs}", exe.display());
    let mut cmd = command(exe);
    cmd.args(["--nodes", &nodes.to_string(), "--procs", &procs.to_string()])
        .args(args)
        .envs(env.iter().copied());
    let (st, job) = run(&what, cmd);
    let fail = |msg: &str| -> ! { job.fail(msg) };
    if !st.success() {
        fail(&format!("exited with {st}"));
    }
    let err = job.stderr(0);
    if err.contains("failed first") || err.contains("aborted") || err.contains("panicked at") {
        fail("a clean run reported a failure");
    }
    let per_node = by_node(&job.stdout(0), nodes);
    if per_node.keys().copied().collect::<Vec<_>>() != (0..nodes).collect::<Vec<_>>() {
        fail("not every node printed");
    }
    let mut results = Vec::new();
    let mut stats = Vec::new();
    for (n, lines) in &per_node {
        let res: Vec<&String> = lines.iter().filter(|l| l.starts_with("result: ")).collect();
        let [res] = res.as_slice() else {
            fail(&format!("node {n}: expected one result line"))
        };
        results.push((*res).clone());
        if !lines.iter().any(|l| l.starts_with("OK: ")) {
            fail(&format!("node {n}: no OK line"));
        }
        stats.push(fjstats(lines));
    }
    if results.iter().any(|r| *r != results[0]) {
        fail(&format!("nodes disagree: {results:?}"));
    }
    (results[0].clone(), stats)
}

const CONFIGS: [(usize, usize); 6] = [(1, 1), (1, 2), (2, 1), (2, 2), (4, 1), (8, 1)];

/// Every configuration gives the one-node answer (each run also checks it
/// against the sequential recursion itself, bit for bit, so a filament lost
/// or run twice shows). Without pruned subtrees (whose inner joins are
/// plain calls and are not counted), the filaments executed on all nodes
/// also add up to the one-node count.
fn same_everywhere(exe: &Path, args: &[&str]) {
    same_everywhere_with(exe, args, &[]);
}

/// [`same_everywhere`] with `env` set for every node of every
/// configuration but the one-node reference.
fn same_everywhere_with(exe: &Path, args: &[&str], env: &[(&str, &str)]) {
    let (want, one) = run_ok(exe, 1, 1, args);
    let total = one[0]["filaments"];
    let counted = |stats: &[BTreeMap<String, f64>]| stats.iter().all(|s| s["pruned"] == 0.0);
    assert!(
        total > 1000.0 || !counted(&one),
        "{args:?}: too small a problem ({total} filaments)"
    );
    for (nodes, procs) in CONFIGS.into_iter().skip(1) {
        let (got, stats) = run_ok_with(exe, nodes, procs, args, env);
        assert_eq!(got, want, "{args:?} on {nodes}x{procs}");
        let sum: f64 = stats.iter().map(|s| s["filaments"]).sum();
        let pruned: f64 = stats.iter().map(|s| s["pruned"]).sum();
        assert!(sum + pruned > 0.0, "{args:?} on {nodes}x{procs}: {stats:?}");
        if counted(&one) && counted(&stats) {
            assert_eq!(
                sum, total,
                "{args:?} on {nodes}x{procs}: filaments {stats:?}"
            );
        }
        let moved_in: f64 = stats.iter().map(|s| s["moved_in"]).sum();
        let moved_out: f64 = stats.iter().map(|s| s["moved_out"]).sum();
        assert_eq!(
            moved_in, moved_out,
            "{args:?} on {nodes}x{procs}: {stats:?}"
        );
        assert!(
            moved_in >= (nodes - 1) as f64 && (nodes > 1 || moved_in == 0.0),
            "{args:?} on {nodes}x{procs}: start-up distribution gives every node work: {stats:?}"
        );
    }
}

#[test]
fn quad_x6_equals_sequential_on_every_configuration() {
    let _g = serial();
    same_everywhere(&bins().quad, &["--func", "x6", "--eps", "1e-2"]);
}

#[test]
fn quad_spiky_equals_sequential_on_every_configuration() {
    let _g = serial();
    same_everywhere(&bins().quad, &["--func", "spiky", "--eps", "1e-8"]);
}

#[test]
fn fib_equals_sequential_on_every_configuration() {
    let _g = serial();
    same_everywhere(&bins().fib, &["--n", "27"]);
}

#[test]
fn fib_without_pruning_equals_sequential_on_every_configuration() {
    // Every join is a real fork: donors have many ready filaments and give
    // half of them per request.
    let _g = serial();
    same_everywhere(&bins().fib, &["--n", "22", "--no-prune"]);
}

#[test]
fn the_unbalanced_integrand_is_shared_between_two_nodes() {
    let _g = serial();
    // Start-up distribution gives node 1 the half with the peak and node 0
    // the nearly empty half: node 0 only gets its share by stealing. Every
    // run must show node 0 stealing from node 1. How much it then runs
    // depends on the CPU time each process gets: on a quiet machine the
    // two are within 0.8 of each other, but the suite beside a CI run and
    // two builds on 2 cores gave 0.37–0.48 in three runs (2026-11-27), the
    // same build passing every run beside 8 busy loops. So the bound is
    // one that stealing decides rather than the scheduler: without
    // stealing node 0 runs its nearly empty half alone; with it, at least
    // a quarter of node 1's filaments in the best of five runs. The
    // balance itself is a benchmark's figure (`benches/fj_nodes.rs`).
    let mut best = 0.0f64;
    let mut seen = Vec::new();
    for _ in 0..5 {
        let (_, s) = run_ok(
            &bins().quad,
            2,
            1,
            &["--func", "spiky", "--eps", "2e-10", "--no-seq"],
        );
        assert!(
            s[0]["remote_steals"] >= 1.0 && s[0]["moved_in"] >= 1.0,
            "node 0 never stole: {s:?}"
        );
        assert!(s[1]["moved_out"] >= 1.0, "node 1 never gave: {s:?}");
        // Two processes of one host share memory (lanes, on by default):
        // node 0 asks by writing node 1's pruning words.
        assert!(
            s[0]["shm_tries"] >= 1.0 && s[0]["shm_tries"] <= s[0]["remote_tries"],
            "node 0 asked node 1 through shared memory: {s:?}"
        );
        let (a, b) = (s[0]["filaments"], s[1]["filaments"]);
        best = best.max(a.min(b) / a.max(b));
        seen.push((a, b));
        if best >= 0.8 {
            break;
        }
    }
    assert!(
        best >= 0.25,
        "the least busy node executed less than a quarter of the filaments of the busiest: \
         {seen:?}"
    );
}

#[test]
fn latent_joins_give_the_same_answers_on_every_configuration() {
    // `HYFI_LATENT=1`: the shallowest pruned joins are listed, and idle
    // processors and other nodes' steal answers take their second
    // branches. The answers and the filaments moved must not change. How
    // many listings are claimed depends on timing (with the examples'
    // pruned copies, often none on a loaded machine), so this asserts no
    // count of them: the claim paths are tested deterministically in
    // hyfi-core (`fork/latent_test.rs`: an idle processor's claim, and a
    // listed `join_remote` shipped to another node).
    let _g = serial();
    let env = [("HYFI_LATENT", "1")];
    same_everywhere_with(&bins().fib, &["--n", "27"], &env);
    same_everywhere_with(&bins().quad, &["--func", "spiky", "--eps", "1e-8"], &env);
    // Off (the default), nothing is listed, so nothing is claimed.
    let (_, s) = run_ok(&bins().fib, 1, 2, &["--n", "27"]);
    assert_eq!(s[0]["latent_steals"], 0.0, "{s:?}");
}

#[test]
fn without_shared_memory_steal_requests_go_as_messages() {
    // `HYFI_LANES=0`: every link over TCP, no host words; `HYFI_HOST_STEALS=0`:
    // lanes, but requests not through them. Either way every request is a
    // message that the donor's communication thread answers. The
    // unbalanced integrand makes node 0 steal.
    let _g = serial();
    'settings: for env in [("HYFI_LANES", "0"), ("HYFI_HOST_STEALS", "0")] {
        for _ in 0..5 {
            let (_, s) = run_ok_with(
                &bins().quad,
                2,
                1,
                &["--func", "spiky", "--eps", "2e-10", "--no-seq"],
                &[env],
            );
            for (node, st) in s.iter().enumerate() {
                assert_eq!(st["shm_tries"], 0.0, "{env:?}: node {node}: {s:?}");
                assert_eq!(st["served_by_procs"], 0.0, "{env:?}: node {node}: {s:?}");
            }
            if s[0]["remote_steals"] >= 1.0 {
                continue 'settings;
            }
        }
        panic!("{env:?}: node 0 stole nothing in 5 runs");
    }
}

#[test]
fn a_steal_takes_half_of_many_ready_filaments() {
    // Without pruning every join forks, so the donor's deque holds one
    // ready filament per level of its recursion, and a request takes half
    // of them: some answered request moves more than one filament. (A
    // request that finds the donor with one ready filament moves one, which
    // happens when the machine delays the donor: look over several runs.)
    // fib(30) runs for some 0.1 s: long enough for steals to be answered on
    // a loaded machine, where a steal's round trip takes milliseconds (with
    // fib(24) both nodes were often done before any steal came back).
    // Either node may be the thief: on a loaded machine node 1 often runs
    // out of work first and node 0 steals back from it.
    let _g = serial();
    let mut seen = Vec::new();
    for _ in 0..5 {
        let (_, s) = run_ok(&bins().fib, 2, 1, &["--n", "30", "--no-prune", "--no-seq"]);
        // Node 1 received one start-up filament; the rest came by stealing.
        // Node 0 received none: all it moved in, it stole.
        for (node, start_up) in [(1, 1.0), (0, 0.0)] {
            let stolen = s[node]["moved_in"] - start_up;
            let steals = s[node]["remote_steals"];
            if steals >= 1.0 && stolen > steals {
                return;
            }
        }
        seen.push(s);
    }
    panic!("no run in 5 moved more filaments than steals to either node: {seen:?}");
}

/// Runs the probe in `mode` on `nodes × 1`; returns (status, output by node).
fn probe(
    mode: &str,
    nodes: usize,
    extra: &[&str],
) -> (ExitStatus, BTreeMap<usize, Vec<String>>, String) {
    let mut cmd = command(&bins().fj_probe);
    cmd.args([
        "--mode",
        mode,
        "--nodes",
        &nodes.to_string(),
        "--procs",
        "1",
    ])
    .args(extra);
    let (st, job) = run(&format!("fj_probe --mode {mode} on {nodes} nodes"), cmd);
    (st, by_node(&job.stdout(0), nodes), job.stderr(0))
}

#[test]
fn repeated_runs_return_on_every_node() {
    let _g = serial();
    for nodes in [2, 4] {
        let (st, out, err) = probe("ok", nodes, &["--runs", "30"]);
        assert!(st.success(), "{nodes} nodes: {st}\n{out:#?}\n{err}");
        for n in 0..nodes {
            let lines = &out[&n];
            for run in 0..30 {
                let want = format!("result: run {run}: 50");
                assert!(
                    lines.contains(&want),
                    "node {n} of {nodes}: no {want:?} in {lines:#?}"
                );
            }
        }
        // The first fork of every run went to node 1 (slot 1).
        assert!(
            out[&0].contains(&"moved: node 0 in 0 out 30".to_owned()),
            "{out:#?}"
        );
        assert!(
            out[&1].contains(&"moved: node 1 in 30 out 0".to_owned()),
            "{out:#?}"
        );
        assert!(
            !err.contains("failed first") && !err.contains("aborted"),
            "{err}"
        );
    }
}

#[test]
fn join_remote_n_spreads_over_nodes_and_reads_shared_state() {
    let _g = serial();
    // Sum over 0..64 of x * x + 1000 (the offset every node shares).
    let want: u64 = (0..64u64).map(|x| x * x + 1000).sum();
    for nodes in [2, 4] {
        let (st, out, err) = probe("many", nodes, &["--runs", "3"]);
        assert!(st.success(), "{nodes} nodes: {st}\n{out:#?}\n{err}");
        for n in 0..nodes {
            for run in 0..3 {
                let line = format!("result: run {run}: {want}");
                assert!(
                    out[&n].contains(&line),
                    "node {n} of {nodes}: no {line:?} in {out:#?}"
                );
            }
        }
        // Start-up distribution sends the first forked half to node 1.
        let ran = out[&0]
            .iter()
            .filter(|l| l.starts_with("many: "))
            .collect::<Vec<_>>();
        assert_eq!(ran.len(), 3, "{out:#?}");
        assert!(
            ran.iter()
                .all(|l| l.split("nodes ").nth(1).is_some_and(|s| s.contains('1'))),
            "{ran:#?}"
        );
    }
}

#[test]
fn a_panic_on_a_remote_node_surfaces_at_the_root() {
    let _g = serial();
    for nodes in [2, 4] {
        let (st, out, err) = probe("panic", nodes, &[]);
        assert!(
            !st.success(),
            "{nodes} nodes: the run should fail\n{out:#?}"
        );
        let want = "a filament panicked on node 1, processor 0 (fork-join): boom: filament 7 panicked on node 1";
        for n in 0..nodes {
            let said = out[&n]
                .iter()
                .any(|l| l == &format!("error: node {n}: {want}"));
            assert!(
                said,
                "node {n} of {nodes} does not report the panic:\n{out:#?}\n{err}"
            );
        }
    }
}

#[test]
fn an_unregistered_function_fails_the_run_with_its_name() {
    let _g = serial();
    let (st, out, _) = probe("unknown", 2, &[]);
    assert!(!st.success(), "the run should fail\n{out:#?}");
    let want = "node 1 received a fork-join filament of function \"fj_probe::square\", which is not registered there";
    for n in 0..2 {
        assert!(
            out[&n]
                .iter()
                .any(|l| l.starts_with(&format!("error: node {n}: {want}"))),
            "node {n}: {out:#?}"
        );
    }
}

/// Every node of a run whose output has no `[node i]` prefix (mpirun)
/// printed `OK` and the same result line.
fn all_ok_unprefixed(what: &str, st: ExitStatus, job: &Job, nodes: usize) -> String {
    let out = job.stdout(0);
    let results: Vec<&String> = out.iter().filter(|l| l.starts_with("result: ")).collect();
    let oks = out.iter().filter(|l| l.starts_with("OK: ")).count();
    assert!(
        st.success() && oks == nodes && results.len() == nodes,
        "{what}: {st}, {oks} OK lines, results {results:?}{}",
        job.dump()
    );
    assert!(
        results.iter().all(|r| *r == results[0]),
        "{what}: {results:?}"
    );
    results[0].clone()
}

#[test]
fn fib_runs_unchanged_under_hyfi_run_and_mpirun() {
    let _g = serial();
    let (want, _) = run_ok(&bins().fib, 1, 1, &["--n", "25"]);
    // hyfi-run: the launcher prefixes each node's lines.
    let mut cmd = command(&bins().hyfi_run);
    cmd.args(["-n", "3", "-p", "1", "--"])
        .arg(&bins().fib)
        .args(["--n", "25"]);
    let (st, job) = run("hyfi-run -n 3 fib", cmd);
    let per_node = by_node(&job.stdout(0), 3);
    assert!(
        st.success() && per_node.len() == 3,
        "hyfi-run: {st}{}",
        job.dump()
    );
    for (n, lines) in &per_node {
        assert!(
            lines.contains(&want),
            "hyfi-run node {n}: no {want:?}{}",
            job.dump()
        );
        assert!(
            lines.iter().any(|l| l.starts_with("OK: ")),
            "{}",
            job.dump()
        );
    }
    // mpirun (Open MPI), when installed (CI installs it).
    let mpirun = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("mpirun"))
            .find(|p| p.is_file())
    });
    let Some(mpirun) = mpirun else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install mpirun (see .ci/run)"
        );
        eprintln!("SKIPPED the mpirun part: mpirun not installed");
        return;
    };
    let mut cmd = command(&mpirun);
    cmd.args([
        "--oversubscribe",
        "--allow-run-as-root",
        "-np",
        "2",
        "-x",
        "HYFI_PIN=0",
    ])
    .arg(&bins().fib)
    .args(["--n", "25", "--procs", "1"])
    .env("OMPI_MCA_plm_rsh_agent", "false");
    let (st, job) = run("mpirun -np 2 fib", cmd);
    assert_eq!(all_ok_unprefixed("mpirun -np 2 fib", st, &job, 2), want);
}

/// Three nodes started by hand run fib(48) (a minute); node `victim` is
/// killed mid-run, when every node holds filaments of the others.
fn kill_mid_run(victim: usize) {
    let nodes = 3;
    let coord = format!("127.0.0.1:{}", free_port());
    let rand = hex(&random_bytes::<24>());
    let (id, token) = (
        u64::from_str_radix(&rand[..12], 16).unwrap_or(7),
        &rand[16..48],
    );
    let mut job = Job::with_bound(&format!("node {victim} of 3 killed mid-run"), FJ_BOUND);
    for rank in 0..nodes {
        let mut cmd = command(&bins().fib);
        cmd.args(["--n", "48", "--no-seq", "--procs", "1"])
            .env("HYFI_RANK", rank.to_string())
            .env("HYFI_NODES", nodes.to_string())
            .env("HYFI_COORD", &coord)
            .env("HYFI_JOB", id.to_string())
            .env("HYFI_TOKEN", token);
        job.spawn(&format!("rank {rank}"), cmd);
    }
    // Every node is in the run once it printed its header (after setup).
    for rank in 0..nodes {
        job.wait_line(rank, "the run's header", |l| l.starts_with("fib: n = 48"));
    }
    std::thread::sleep(Duration::from_millis(300));
    for rank in 0..nodes {
        if job.poll(rank).is_some() {
            job.fail(&format!("node {rank} ended before the kill"));
        }
    }
    assert!(send_signal(&job.pid(victim).to_string(), "KILL"));
    let killed = Instant::now();
    for rank in (0..nodes).filter(|&r| r != victim) {
        let st = job.wait(rank, Duration::from_secs(10));
        let took = job.exited_at(rank) - killed;
        if st.success() || took >= Duration::from_secs(10) {
            job.fail(&format!("node {rank}: {st} after {took:?}"));
        }
        let err = job.stderr(rank);
        // The run itself returns the failure, which names each node once:
        // `fib: node R: node V failed first: lost (...)`.
        if !err.contains(&format!(
            "fib: node {rank}: node {victim} failed first: lost"
        )) {
            job.fail(&format!("node {rank}'s run did not return the lost node"));
        }
    }
    job.no_panics();
}

#[test]
fn a_node_killed_mid_run_ends_the_job_on_every_node() {
    let _g = serial();
    kill_mid_run(1);
}

#[test]
fn the_root_node_killed_mid_run_ends_the_job_on_every_node() {
    let _g = serial();
    kill_mid_run(0);
}

/// A bad setting ends either fork-join example with status 2 (a
/// configuration error, as every example's) and a line that names it,
/// before any node runs; a failed run is status 1.
#[test]
fn bad_settings_exit_with_status_2_and_name_the_setting() {
    let _g = serial();
    let b = bins();
    // (what, program, arguments, a variable, what stderr must name)
    type Case<'a> = (
        &'a str,
        &'a Path,
        &'a [&'a str],
        Option<(&'a str, &'a str)>,
        &'a str,
    );
    let cases: [Case; 4] = [
        (
            "quad, HYFI_PIN=banana",
            &b.quad,
            &[],
            Some(("HYFI_PIN", "banana")),
            "HYFI_PIN=\"banana\"",
        ),
        (
            "fib, HYFI_PIN=banana",
            &b.fib,
            &["--n", "10"],
            Some(("HYFI_PIN", "banana")),
            "HYFI_PIN=\"banana\"",
        ),
        (
            "quad, a > b",
            &b.quad,
            &["--a", "5", "--b", "1"],
            None,
            "need finite a < b",
        ),
        (
            "quad, eps 0",
            &b.quad,
            &["--eps", "0"],
            None,
            "need a finite eps > 0",
        ),
    ];
    for (what, exe, args, env, named) in cases {
        let mut cmd = command(exe);
        cmd.args(args);
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        let (st, job) = run(what, cmd);
        if st.code() != Some(2) {
            job.fail(&format!("exited with {st}, not status 2"));
        }
        if !job.stderr(0).contains(named) {
            job.fail(&format!("stderr does not name `{named}`"));
        }
        if job.stdout(0).iter().any(|l| l.contains("OK:")) {
            job.fail("it ran");
        }
    }
}
