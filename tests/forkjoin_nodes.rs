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
use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// The longest one job may take.
const BOUND: Duration = Duration::from_secs(60);

struct Bins {
    quad: PathBuf,
    fib: PathBuf,
    probe: PathBuf,
    hyfi_run: PathBuf,
}

/// The examples, built once with this test's profile (a no-op when fresh).
fn bins() -> &'static Bins {
    static BINS: OnceLock<Bins> = OnceLock::new();
    BINS.get_or_init(|| {
        let me = std::env::current_exe().expect("current_exe");
        let profile_dir = me
            .parent()
            .and_then(|deps| deps.parent())
            .expect("test binary lives in target/<profile>/deps")
            .to_path_buf();
        let profile = profile_dir
            .file_name()
            .and_then(|n| n.to_str())
            .expect("profile directory name")
            .to_owned();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| env!("CARGO").to_owned());
        let mut cmd = Command::new(cargo);
        cmd.args([
            "build",
            "--quiet",
            "-p",
            "hyfi",
            "--example",
            "quad",
            "--example",
            "fib",
            "--example",
            "fj_probe",
            "-p",
            "hyfi-net",
            "--bin",
            "hyfi-run",
            "--manifest-path",
        ])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"));
        match profile.as_str() {
            "debug" => {}
            "release" => {
                cmd.arg("--release");
            }
            other => {
                cmd.args(["--profile", other]);
            }
        }
        let status = cmd.status().expect("running cargo to build the examples");
        assert!(status.success(), "building the examples failed: {status}");
        let ex = profile_dir.join("examples");
        Bins {
            quad: ex.join("quad"),
            fib: ex.join("fib"),
            probe: ex.join("fj_probe"),
            hyfi_run: profile_dir.join("hyfi-run"),
        }
    })
}

/// One test at a time.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// `exe` with no launcher variables inherited, pinning off, stdin closed.
fn command(exe: &Path) -> Command {
    let mut cmd = Command::new(exe);
    for (key, _) in std::env::vars_os() {
        let k = key.to_string_lossy();
        if [
            "HYFI_",
            "OMPI_",
            "PMI_",
            "PMIX_",
            "SLURM_",
            "RUST_BACKTRACE",
        ]
        .iter()
        .any(|p| k.starts_with(p))
        {
            cmd.env_remove(&key);
        }
    }
    cmd.env("HYFI_PIN", "0").stdin(Stdio::null());
    cmd
}

/// A started process; dropping it kills its process group.
struct Proc {
    child: Child,
    out: Arc<Mutex<Vec<String>>>,
    err: Arc<Mutex<Vec<String>>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

fn collect(
    from: impl Read + Send + 'static,
    into: Arc<Mutex<Vec<String>>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines() {
            let Ok(line) = line else { break };
            into.lock().unwrap_or_else(|e| e.into_inner()).push(line);
        }
    })
}

impl Proc {
    fn spawn(mut cmd: Command) -> Proc {
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {cmd:?}: {e}"));
        let (out, err) = (Arc::default(), Arc::default());
        let readers = vec![
            collect(child.stdout.take().expect("piped"), Arc::clone(&out)),
            collect(child.stderr.take().expect("piped"), Arc::clone(&err)),
        ];
        Proc {
            child,
            out,
            err,
            readers,
        }
    }

    fn stdout(&self) -> Vec<String> {
        self.out.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn stderr(&self) -> String {
        self.err
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .join("\n")
    }

    /// Waits at most `within` for the exit and the end of the output.
    fn wait(&mut self, within: Duration) -> Option<ExitStatus> {
        let until = Instant::now() + within;
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                for r in self.readers.drain(..) {
                    let _ = r.join();
                }
                return Some(st);
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn dump(&self) -> String {
        format!(
            "\n--- stdout:\n{}\n--- stderr:\n{}",
            self.stdout().join("\n"),
            self.stderr()
        )
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = Command::new("kill")
                .args(["-s", "KILL", "--", &format!("-{}", self.child.id())])
                .stderr(Stdio::null())
                .status();
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs `cmd` to its end (within [`BOUND`]).
fn run(what: &str, cmd: Command) -> (ExitStatus, Proc) {
    let mut p = Proc::spawn(cmd);
    match p.wait(BOUND) {
        Some(st) => (st, p),
        None => panic!("{what}: still running after {BOUND:?}{}", p.dump()),
    }
}

/// Output lines by node: `[node i] ...` from the embedded launcher, or
/// everything as node 0's for a one-node run.
fn by_node(lines: &[String], nodes: usize) -> BTreeMap<usize, Vec<String>> {
    if nodes == 1 {
        return BTreeMap::from([(0, lines.to_vec())]);
    }
    let mut m: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for l in lines {
        if let Some((n, rest)) = l
            .strip_prefix("[node ")
            .and_then(|r| r.split_once("] "))
            .and_then(|(n, rest)| Some((n.parse::<usize>().ok()?, rest)))
        {
            m.entry(n).or_default().push(rest.to_owned());
        }
    }
    m
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
    let what = format!("{} {args:?} on {nodes}x{procs}", exe.display());
    let mut cmd = command(exe);
    cmd.args(["--nodes", &nodes.to_string(), "--procs", &procs.to_string()])
        .args(args);
    let (st, p) = run(&what, cmd);
    let fail = |msg: &str| -> ! { panic!("{what}: {msg}{}", p.dump()) };
    if !st.success() {
        fail(&format!("exited with {st}"));
    }
    let err = p.stderr();
    if err.contains("lost node") || err.contains("aborted") || err.contains("panicked at") {
        fail("a clean run reported a failure");
    }
    let per_node = by_node(&p.stdout(), nodes);
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

const CONFIGS: [(usize, usize); 5] = [(1, 1), (1, 2), (2, 1), (2, 2), (4, 1)];

/// Every configuration gives the one-node answer (each run also checks it
/// against the sequential recursion itself), and the filaments executed on
/// all nodes add up to the one-node count: none lost, none run twice.
fn same_everywhere(exe: &Path, args: &[&str]) {
    let (want, one) = run_ok(exe, 1, 1, args);
    let total = one[0]["filaments"];
    assert!(
        total > 1000.0,
        "{args:?}: too small a problem ({total} filaments)"
    );
    for (nodes, procs) in CONFIGS.into_iter().skip(1) {
        let (got, stats) = run_ok(exe, nodes, procs, args);
        assert_eq!(got, want, "{args:?} on {nodes}x{procs}");
        let sum: f64 = stats.iter().map(|s| s["filaments"]).sum();
        assert_eq!(
            sum, total,
            "{args:?} on {nodes}x{procs}: filaments {stats:?}"
        );
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
    // the nearly empty half: node 0 only gets its share by stealing. On a
    // busy 2-core machine one process can be descheduled for a while, so
    // take the best of three runs for the balance; every run must show
    // node 0 stealing from node 1.
    let mut best = 0.0f64;
    let mut seen = Vec::new();
    for _ in 0..3 {
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
        let (a, b) = (s[0]["filaments"], s[1]["filaments"]);
        best = best.max(a.min(b) / a.max(b));
        seen.push((a, b));
        if best >= 0.8 {
            break;
        }
    }
    assert!(
        best >= 0.5,
        "the least busy node executed less than half the filaments of the busiest: {seen:?}"
    );
}

#[test]
fn a_steal_takes_half_of_many_ready_filaments() {
    // Without pruning every join forks, so the donor's deque holds one
    // ready filament per level of its recursion, and a request takes half
    // of them: some answered request moves more than one filament.
    let _g = serial();
    let mut seen = Vec::new();
    for _ in 0..5 {
        let (_, s) = run_ok(&bins().fib, 2, 1, &["--n", "24", "--no-prune", "--no-seq"]);
        // Node 1 received one start-up filament; the rest came by stealing.
        let stolen = s[1]["moved_in"] - 1.0;
        let steals = s[1]["remote_steals"];
        if steals >= 1.0 {
            assert!(
                stolen > steals,
                "node 1 got {stolen} filaments in {steals} steals: {s:?}"
            );
            return;
        }
        seen.push(s);
    }
    panic!("node 1 never stole in 5 runs: {seen:?}");
}

/// Runs the probe in `mode` on `nodes × 1`; returns (status, output by node).
fn probe(
    mode: &str,
    nodes: usize,
    extra: &[&str],
) -> (ExitStatus, BTreeMap<usize, Vec<String>>, String) {
    let mut cmd = command(&bins().probe);
    cmd.args([
        "--mode",
        mode,
        "--nodes",
        &nodes.to_string(),
        "--procs",
        "1",
    ])
    .args(extra);
    let (st, p) = run(&format!("fj_probe --mode {mode} on {nodes} nodes"), cmd);
    (st, by_node(&p.stdout(), nodes), p.stderr())
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
            !err.contains("lost node") && !err.contains("aborted"),
            "{err}"
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
fn all_ok_unprefixed(what: &str, st: ExitStatus, p: &Proc, nodes: usize) -> String {
    let out = p.stdout();
    let results: Vec<&String> = out.iter().filter(|l| l.starts_with("result: ")).collect();
    let oks = out.iter().filter(|l| l.starts_with("OK: ")).count();
    assert!(
        st.success() && oks == nodes && results.len() == nodes,
        "{what}: {st}, {oks} OK lines, results {results:?}{}",
        p.dump()
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
    let (st, p) = run("hyfi-run -n 3 fib", cmd);
    let per_node = by_node(&p.stdout(), 3);
    assert!(
        st.success() && per_node.len() == 3,
        "hyfi-run: {st}{}",
        p.dump()
    );
    for (n, lines) in &per_node {
        assert!(
            lines.contains(&want),
            "hyfi-run node {n}: no {want:?}{}",
            p.dump()
        );
        assert!(lines.iter().any(|l| l.starts_with("OK: ")), "{}", p.dump());
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
    let (st, p) = run("mpirun -np 2 fib", cmd);
    assert_eq!(all_ok_unprefixed("mpirun -np 2 fib", st, &p, 2), want);
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("binding 127.0.0.1:0")
        .port()
}

fn random_hex() -> String {
    let mut b = [0u8; 24];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .expect("reading /dev/urandom");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Three nodes started by hand run fib(48) (a minute); node `victim` is
/// killed mid-run, when every node holds filaments of the others.
fn kill_mid_run(victim: usize) {
    let nodes = 3;
    let coord = format!("127.0.0.1:{}", free_port());
    let rand = random_hex();
    let (job, token) = (
        u64::from_str_radix(&rand[..12], 16).unwrap_or(7),
        &rand[16..48],
    );
    let mut procs: Vec<Proc> = (0..nodes)
        .map(|rank| {
            let mut cmd = command(&bins().fib);
            cmd.args(["--n", "48", "--no-seq", "--procs", "1"])
                .env("HYFI_RANK", rank.to_string())
                .env("HYFI_NODES", nodes.to_string())
                .env("HYFI_COORD", &coord)
                .env("HYFI_JOB", job.to_string())
                .env("HYFI_TOKEN", token);
            Proc::spawn(cmd)
        })
        .collect();
    // Every node is in the run once it printed its header (after setup).
    let started = Instant::now();
    while !procs
        .iter()
        .all(|p| p.stdout().iter().any(|l| l.starts_with("fib: n = 48")))
    {
        assert!(
            started.elapsed() < BOUND,
            "the nodes did not start:{}",
            procs[0].dump()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(300));
    for (i, p) in procs.iter_mut().enumerate() {
        assert!(
            p.wait(Duration::ZERO).is_none(),
            "node {i} ended before the kill:{}",
            p.dump()
        );
    }
    let _ = procs[victim].child.kill(); // SIGKILL
    let killed = Instant::now();
    for rank in (0..nodes).filter(|&r| r != victim) {
        let st = procs[rank].wait(Duration::from_secs(10));
        let took = killed.elapsed();
        let p = &procs[rank];
        let Some(st) = st else {
            panic!(
                "node {rank} still runs 10 s after node {victim} was killed:{}",
                p.dump()
            )
        };
        assert!(
            !st.success() && took < Duration::from_secs(10),
            "node {rank}: {st} after {took:?}"
        );
        let err = p.stderr();
        assert!(
            err.contains(&format!("lost node {victim}")),
            "node {rank} does not name the lost node:{}",
            p.dump()
        );
        assert!(
            !err.contains("panicked at"),
            "node {rank} panicked:{}",
            p.dump()
        );
        // The run itself returns the failure (not only the cluster's
        // failure hook): `fib: node R: cross-node step failed: ...`.
        assert!(
            err.contains(&format!("fib: node {rank}: cross-node step failed")),
            "node {rank}'s run did not return the failure:{}",
            p.dump()
        );
    }
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
