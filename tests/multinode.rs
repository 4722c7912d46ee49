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
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hyfi_net::wire::{Handshake, Purpose};

/// The longest any test may take.
const BOUND: Duration = Duration::from_secs(30);
/// Points per block: small, so a run takes a fraction of a second.
const SAMPLES: &str = "2000";

// ---------------------------------------------------------------------------
// Binaries

struct Bins {
    montecarlo: PathBuf,
    hyfi_run: PathBuf,
}

/// The example and `hyfi-run`, built once per test process with this test's
/// profile: `cargo test --test multinode` builds neither, and a leftover
/// binary from an older build would test old code (a no-op when fresh).
fn bins() -> &'static Bins {
    static BINS: OnceLock<Bins> = OnceLock::new();
    BINS.get_or_init(|| {
        let me = std::env::current_exe().expect("current_exe");
        // target/<profile>/deps/multinode-<hash>
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
            "--example",
            "montecarlo",
            "--bin",
            "hyfi-run",
            "-p",
            "hyfi",
            "-p",
            "hyfi-net",
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
        let status = cmd
            .status()
            .expect("running cargo to build montecarlo and hyfi-run");
        assert!(
            status.success(),
            "cargo build --example montecarlo --bin hyfi-run failed: {status}"
        );
        let bins = Bins {
            montecarlo: profile_dir.join("examples").join("montecarlo"),
            hyfi_run: profile_dir.join("hyfi-run"),
        };
        for exe in [&bins.montecarlo, &bins.hyfi_run] {
            assert!(
                exe.exists(),
                "cargo built it but {} is missing",
                exe.display()
            );
        }
        bins
    })
}

/// A command for `exe` with no launcher variables inherited from the test's
/// own environment, pinning off, and stdin closed.
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
            "MPI_LOCALNRANKS",
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

/// montecarlo with small sizes and `procs` processors per node.
fn montecarlo(procs: usize, extra: &[&str]) -> Command {
    let mut cmd = command(&bins().montecarlo);
    cmd.args(["--procs", &procs.to_string(), "--samples", SAMPLES])
        .args(extra);
    cmd
}

/// A port nobody listens on (bound, read and released).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("binding 127.0.0.1:0")
        .port()
}

/// A name no other test (or test run) uses.
fn unique(what: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "hyfi-multinode-{what}-{}-{nanos}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .expect("reading /dev/urandom");
    b
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

// ---------------------------------------------------------------------------
// Processes

/// Is `pid` a live (not zombie) montecarlo process?
fn montecarlo_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next());
    if matches!(state, Some('Z' | 'X') | None) {
        return false;
    }
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| String::from_utf8_lossy(&c).contains("montecarlo"))
        .unwrap_or(false)
}

fn send_signal(target: &str, signal: &str) -> bool {
    Command::new("kill")
        .args(["-s", signal, "--", target])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// One process the test started; its output is collected by two threads.
struct Proc {
    name: String,
    child: Child,
    out: Arc<Mutex<Vec<String>>>,
    err: Arc<Mutex<Vec<String>>>,
    /// Readers that reached end of file.
    eofs: Arc<AtomicUsize>,
    status: Option<(ExitStatus, Instant)>,
}

fn collect(
    from: impl Read + Send + 'static,
    into: Arc<Mutex<Vec<String>>>,
    eofs: Arc<AtomicUsize>,
) {
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines() {
            let Ok(line) = line else { break };
            into.lock().unwrap_or_else(|e| e.into_inner()).push(line);
        }
        eofs.fetch_add(1, Ordering::SeqCst);
    });
}

/// The processes of one test. Dropping it kills all of them (each one's
/// process group, and every montecarlo pid seen) and removes its files.
struct Job {
    what: String,
    procs: Vec<Proc>,
    deadline: Instant,
    pids: Vec<u32>,
    files: Vec<PathBuf>,
}

impl Job {
    fn new(what: &str) -> Job {
        Job {
            what: what.to_owned(),
            procs: Vec::new(),
            deadline: Instant::now() + BOUND,
            pids: Vec::new(),
            files: Vec::new(),
        }
    }

    /// Starts `cmd` in a process group of its own; returns its index.
    fn spawn(&mut self, name: &str, mut cmd: Command) -> usize {
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("{}: cannot start {name}: {e}", self.what));
        let (out, err) = (Arc::default(), Arc::default());
        let eofs = Arc::new(AtomicUsize::new(0));
        collect(
            child.stdout.take().expect("piped"),
            Arc::clone(&out),
            Arc::clone(&eofs),
        );
        collect(
            child.stderr.take().expect("piped"),
            Arc::clone(&err),
            Arc::clone(&eofs),
        );
        self.procs.push(Proc {
            name: name.to_owned(),
            child,
            out,
            err,
            eofs,
            status: None,
        });
        self.procs.len() - 1
    }

    fn pid(&self, i: usize) -> u32 {
        self.procs[i].child.id()
    }

    fn stdout(&self, i: usize) -> Vec<String> {
        self.procs[i]
            .out
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn stderr(&self, i: usize) -> String {
        self.procs[i]
            .err
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .join("\n")
    }

    /// Everything every process said so far, for failure messages.
    fn dump(&self) -> String {
        let mut s = String::new();
        for (i, p) in self.procs.iter().enumerate() {
            let status = match &p.status {
                Some((st, _)) => format!("{st}"),
                None => "running".to_owned(),
            };
            s += &format!(
                "\n--- {} (pid {}, {status}) stdout:\n{}\n--- {} stderr:\n{}\n",
                p.name,
                p.child.id(),
                self.stdout(i).join("\n"),
                p.name,
                self.stderr(i)
            );
        }
        s
    }

    fn fail(&self, msg: &str) -> ! {
        panic!("{}: {msg}{}", self.what, self.dump())
    }

    fn poll(&mut self, i: usize) -> Option<ExitStatus> {
        if self.procs[i].status.is_none() {
            match self.procs[i].child.try_wait() {
                Ok(Some(st)) => self.procs[i].status = Some((st, Instant::now())),
                Ok(None) => {}
                Err(e) => self.fail(&format!("try_wait on {}: {e}", self.procs[i].name)),
            }
        }
        self.procs[i].status.map(|(st, _)| st)
    }

    /// When process `i` was seen to exit.
    fn exited_at(&self, i: usize) -> Instant {
        self.procs[i].status.expect("exited").1
    }

    /// Waits (at most `within`, and never past the test's bound) for
    /// process `i` to exit, and for its output to be read.
    fn wait(&mut self, i: usize, within: Duration) -> ExitStatus {
        let until = self.deadline.min(Instant::now() + within);
        let status = loop {
            if let Some(st) = self.poll(i) {
                break st;
            }
            if Instant::now() >= until {
                self.fail(&format!(
                    "{} still running after {within:?}",
                    self.procs[i].name
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        // The pipes close when the last process holding them ends; a
        // grandchild left behind would hold them: do not wait forever.
        let drained = Instant::now() + Duration::from_secs(3);
        while self.procs[i].eofs.load(Ordering::SeqCst) < 2 && Instant::now() < drained {
            std::thread::sleep(Duration::from_millis(10));
        }
        status
    }

    /// Waits for every process; each must exit within `within` of now.
    fn wait_all(&mut self, within: Duration) -> Vec<ExitStatus> {
        (0..self.procs.len())
            .map(|i| self.wait(i, within))
            .collect()
    }

    /// Waits for a stdout line of process `i` that `pred` accepts.
    fn wait_line(&mut self, i: usize, what: &str, pred: impl Fn(&str) -> bool) -> String {
        loop {
            if let Some(l) = self.stdout(i).into_iter().find(|l| pred(l)) {
                return l;
            }
            if self.poll(i).is_some() && self.procs[i].eofs.load(Ordering::SeqCst) >= 2 {
                if let Some(l) = self.stdout(i).into_iter().find(|l| pred(l)) {
                    return l;
                }
                self.fail(&format!("{} ended without {what}", self.procs[i].name));
            }
            if Instant::now() >= self.deadline {
                self.fail(&format!(
                    "no {what} from {} within {BOUND:?}",
                    self.procs[i].name
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Fails if any process printed a panic: an orderly failure of the job
    /// (a lost node, an abort) is an error message, not a panic.
    fn no_panics(&self) {
        for (i, p) in self.procs.iter().enumerate() {
            if let Some(l) = self.stderr(i).lines().find(|l| l.contains("panicked at")) {
                self.fail(&format!("{} printed a panic: {l:?}", p.name));
            }
        }
    }

    /// Remembers a montecarlo pid, to be killed at the end if still alive.
    fn track(&mut self, pid: u32) {
        if !self.pids.contains(&pid) {
            self.pids.push(pid);
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        for i in 0..self.procs.len() {
            if self.poll_quiet(i) {
                continue;
            }
            let pgid = format!("-{}", self.procs[i].child.id());
            send_signal(&pgid, "KILL");
            let _ = self.procs[i].child.kill();
        }
        for &pid in &self.pids {
            if montecarlo_alive(pid) {
                send_signal(&pid.to_string(), "KILL");
            }
        }
        for p in &mut self.procs {
            if p.status.is_none() {
                let _ = p.child.wait();
            }
        }
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
    }
}

impl Job {
    /// Has process `i` exited (without panicking, for Drop)?
    fn poll_quiet(&mut self, i: usize) -> bool {
        let p = &mut self.procs[i];
        if p.status.is_none() {
            if let Ok(Some(st)) = p.child.try_wait() {
                p.status = Some((st, Instant::now()));
            }
        }
        p.status.is_some()
    }
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

/// Splits launcher output (`[node i] ...` lines) by node.
fn by_prefix(lines: &[String]) -> BTreeMap<usize, Vec<String>> {
    let mut m: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for l in lines {
        if let Some((rank, rest)) = l
            .strip_prefix("[node ")
            .and_then(|r| r.split_once("] "))
            .and_then(|(n, rest)| Some((n.parse::<usize>().ok()?, rest)))
        {
            m.entry(rank).or_default().push(rest.to_owned());
        }
    }
    m
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
        if err.contains("lost node") || err.contains("aborted") {
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
    let per_node = match nodes {
        Some(_) => by_prefix(&out),
        None => BTreeMap::from([(0, out)]),
    };
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
    let o = check_nodes(&job, &by_prefix(&job.stdout(0)), nodes, procs);
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
        cmd.envs(env(rank));
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

fn on_path(exe: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(exe))
        .find(|p| p.is_file())
}

fn run_mpirun(mpirun: &Path, nodes: usize) -> Outcome {
    let mut job = Job::new(&format!("mpirun -np {nodes}"));
    let mut cmd = command(mpirun);
    cmd.args(["--oversubscribe", "--allow-run-as-root", "-np"])
        .arg(nodes.to_string())
        .args(["-x", "HYFI_PIN=0"])
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
    for nodes in [2, 4] {
        let a = run_mpirun(&mpirun, nodes);
        let b = run_mpirun(&mpirun, nodes);
        check_runs(&format!("mpirun -np {nodes}"), &a, &b);
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
    if !err.contains("hyfi launcher: node 1 was killed by signal 9") {
        job.fail("the launcher does not report node 1 killed by signal 9");
    }
    for rank in [0, 2] {
        let prefix = format!("[node {rank}] ");
        let said_lost = err
            .lines()
            .any(|l| l.starts_with(&prefix) && l.contains("lost node 1"));
        let stopped = err.contains("hyfi launcher: a node failed; stopping the others");
        if !said_lost && !stopped {
            job.fail(&format!(
                "node {rank} neither reported `lost node 1` nor was stopped by the launcher"
            ));
        }
    }
    // No node left behind.
    let gone_by = Instant::now() + Duration::from_secs(2);
    while pids.iter().any(|&p| montecarlo_alive(p)) && Instant::now() < gone_by {
        std::thread::sleep(Duration::from_millis(20));
    }
    let alive: Vec<u32> = pids
        .iter()
        .copied()
        .filter(|&p| montecarlo_alive(p))
        .collect();
    if !alive.is_empty() {
        job.fail(&format!(
            "montecarlo processes still running after the launcher exited: {alive:?}"
        ));
    }
    job.no_panics();
    // Each message names its node once (`hyfi: node 0: lost node 1 ...`).
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
    if !job
        .stderr(other)
        .contains(&format!("node {victim} aborted"))
    {
        job.fail(&format!("node {other} does not say node {victim} aborted"));
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
    // A well-formed hello of this job with a wrong token.
    let mut wrong = token;
    wrong[0] ^= 0xff;
    let hello = Handshake {
        purpose: Purpose::Hello,
        job: id,
        token: wrong,
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
    let st = job.wait(0, Duration::from_secs(6));
    let took = job.exited_at(0) - started;
    if st.success() || took > Duration::from_secs(5) {
        job.fail(&format!(
            "should exit non-zero within 5 s: {st} after {took:?}"
        ));
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
