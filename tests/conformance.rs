//! The transport conformance suite (`hyfi::conformance`, run by
//! `examples/conformance.rs`) over every transport of the node seam:
//!
//! 1. the in-process link, 2, 3 and 4 nodes as threads of this process,
//!    including a lost node (an abort) and a stopped one (a stalled
//!    delivery thread);
//! 2. TCP, real processes under hyfi's embedded launcher, on 2×1, 4×1 and
//!    2×2 (nodes × processors; oversubscribed on a small machine);
//! 3. a node lost (it exits) and a node stopped (SIGSTOP) over TCP on 3×1:
//!    every survivor must end, by itself and non-zero, within a bound,
//!    saying which node it lost.
//!
//! The process jobs go through [`run_job`], one arm per [`Transport`]: a
//! transport is added to every multi-process check by adding its arm (MPI:
//! `mpirun -np N` with `HYFI_TRANSPORT=mpi`).
//!
//! Every wait is bounded and whatever a test started is killed when it
//! ends (see `common`). The tests take turns (one lock): on a machine of
//! two CPUs concurrent jobs would only measure the scheduler, and the
//! suite's timing checks (a late node at a barrier, a stalled delivery
//! thread) want the CPUs they were promised.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::{mpsc, Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use common::{by_node, command, mpirun, Job};
use hyfi::conformance::{self, Ending, Loss, Stop};
use hyfi::layers::link::InProcess;
use hyfi::layers::{steal, NodeLink, RuntimeExt};
use hyfi::{Config, Dsm, Runtime};

/// The seed of every run here (each check derives its plan from it).
const SEED: &str = "11";

/// The longest one job may take, start-up included (a run of the suite
/// takes a few seconds; 4×1 oversubscribed on two CPUs, about ten).
const JOB_BOUND: Duration = Duration::from_secs(120);

/// How soon a survivor must have named a lost node, and a stopped one
/// (the heartbeat limit is set to [`HEARTBEAT`] for those jobs).
const LOST_WITHIN: Duration = Duration::from_secs(10);
const STOPPED_WITHIN: Duration = Duration::from_secs(15);
const HEARTBEAT: &str = "2";

/// Frames each node sends each other node in check 4 (11 control, 14
/// bulk), and their bytes at least (the fixed sizes' 65 MiB and more).
const FRAMES_PER_PEER: u64 = 25;
const FRAME_BYTES_PER_PEER: u64 = 65 << 20;

/// One test at a time.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

// ---------------------------------------------------------------------------
// What a run of the suite must have checked

/// The `key=value` pairs of a summary line.
fn fields(line: &str) -> BTreeMap<String, u64> {
    line.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .filter_map(|(k, v)| Some((k.to_owned(), v.parse().ok()?)))
        .collect()
}

/// A summary (node 0's, or any node's in process) says the suite ran
/// every check on `nodes × procs`, and that each check had teeth.
fn check_summary(what: &str, line: &str, nodes: usize, procs: usize) {
    let f = fields(line);
    let get = |k: &str| {
        *f.get(k)
            .unwrap_or_else(|| panic!("{what}: no {k}= in {line:?}"))
    };
    let peers = nodes as u64 - 1;
    let expect = |ok: bool, about: &str| assert!(ok, "{what}: {about}: {line}");
    expect(get("nodes") == nodes as u64, "node count");
    expect(get("procs") == procs as u64, "processor count");
    expect(get("allreduces") >= 32, "all-reduces");
    expect(
        get("order_sensitive") >= 1,
        "no all-reduce whose order showed",
    );
    expect(get("reductions") >= 16, "reductions");
    expect(get("barriers") >= 3, "barriers");
    expect(
        get("dsm_rounds") >= 5 && get("dsm_elements") > 0,
        "shared memory",
    );
    expect(
        get("trees") >= 3 && get("tree_filaments") >= 3 * 32,
        "trees",
    );
    expect(
        get("filaments_moved") >= peers,
        "filaments moved across nodes",
    );
    expect(get("frames_sent") == peers * FRAMES_PER_PEER, "frames sent");
    expect(
        get("frames_received") == peers * FRAMES_PER_PEER,
        "frames received",
    );
    expect(
        get("frame_bytes") >= peers * FRAME_BYTES_PER_PEER,
        "frame bytes",
    );
    expect(get("overtaken") >= 1, "control overtaking bulk");
}

// ---------------------------------------------------------------------------
// The in-process link

/// Runs `body` on `nodes` in-process nodes of `procs` processors (a
/// runtime each, with fork-join across nodes and the shared memory, as
/// `hyfi::init` gives a node of a cluster); `limit` is how long a
/// delivery thread may spend in one message. Each node's result, in node
/// order; panics if one is not back within [`JOB_BOUND`].
fn in_process<T: Send + 'static>(
    nodes: usize,
    procs: usize,
    limit: Option<Duration>,
    body: impl Fn(&Runtime) -> Result<T, String> + Send + Sync + 'static,
) -> Vec<Result<T, String>> {
    let links = match limit {
        Some(l) => InProcess::connect_with_limit(nodes, l),
        None => InProcess::connect(nodes),
    };
    let body = Arc::new(body);
    let (tx, rx) = mpsc::channel();
    let threads: Vec<_> = links
        .into_iter()
        .enumerate()
        .map(|(node, link)| {
            let (body, tx) = (body.clone(), tx.clone());
            std::thread::Builder::new()
                .name(format!("in-process node {node}"))
                .spawn(move || {
                    let start = || {
                        let cfg = Config::new().procs(procs).pin(false);
                        let rt = Runtime::with_link(cfg, link as Arc<dyn NodeLink>)
                            .map_err(|e| e.to_string())?;
                        steal::install(&rt).map_err(|e| e.to_string())?;
                        Dsm::with_base(&rt, None).map_err(|e| e.to_string())?;
                        Ok::<_, String>(rt)
                    };
                    let r = start().and_then(|rt| body(&rt));
                    let _ = tx.send((node, r));
                })
                .expect("a thread per node")
        })
        .collect();
    let deadline = Instant::now() + JOB_BOUND;
    let mut got: Vec<Option<Result<T, String>>> = (0..nodes).map(|_| None).collect();
    for _ in 0..nodes {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((node, r)) => got[node] = Some(r),
            Err(_) => panic!(
                "in-process {nodes}x{procs}: nodes {:?} did not return within {JOB_BOUND:?}",
                (0..nodes).filter(|&n| got[n].is_none()).collect::<Vec<_>>()
            ),
        }
    }
    // Each node closes its runtime after sending its result: bounded too.
    for t in threads {
        while !t.is_finished() {
            assert!(
                Instant::now() < deadline,
                "in-process {nodes}x{procs}: a node did not close its runtime"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        t.join().expect("node thread");
    }
    got.into_iter()
        .map(|r| r.expect("every node answered"))
        .collect()
}

#[test]
fn the_in_process_link_passes_the_suite() {
    let _one = serial();
    let seed: u64 = SEED.parse().unwrap();
    for (nodes, procs) in [(2, 2), (3, 1), (4, 1)] {
        let what = format!("in-process {nodes}x{procs}");
        let t0 = Instant::now();
        let got = in_process(nodes, procs, None, move |rt| conformance::run(rt, seed));
        let lines: Vec<String> = (got.iter().enumerate())
            .map(|(node, r)| match r {
                Ok(s) => s.to_string(),
                Err(e) => panic!("{what}: node {node}: {e}"),
            })
            .collect();
        for (node, line) in lines.iter().enumerate() {
            check_summary(&format!("{what}, node {node}"), line, nodes, procs);
            // The job-wide figures agree.
            let (a, b) = (fields(line), fields(&lines[0]));
            for k in [
                "filaments_moved",
                "overtaken",
                "tree_filaments",
                "dsm_elements",
            ] {
                assert_eq!(
                    a[k], b[k],
                    "{what}: node {node}'s {k} differs from node 0's"
                );
            }
        }
        eprintln!("{what}: {:.1} s: {}", t0.elapsed().as_secs_f64(), lines[0]);
    }
}

/// `ending` is a survivor's, naming `victim` within `within`.
fn detected(
    what: &str,
    node: usize,
    ending: &Result<Ending, String>,
    victim: usize,
    within: Duration,
) {
    match ending {
        Ok(Ending::Detected { error, after }) => {
            assert!(
                error.contains(&format!("node {victim}")),
                "{what}: node {node}'s error does not name node {victim}: {error}"
            );
            assert!(
                *after < within,
                "{what}: node {node} took {after:?}: {error}"
            );
        }
        other => panic!("{what}: node {node} should have detected node {victim}: {other:?}"),
    }
}

#[test]
fn the_in_process_link_names_a_lost_and_a_stopped_node() {
    let _one = serial();
    let what = "in-process 3x1, node 1 aborts";
    let got = in_process(3, 1, None, |rt| conformance::lose_node(rt, 1, Loss::Abort));
    assert_eq!(got[1], Ok(Ending::Victim), "{what}");
    for node in [0, 2] {
        detected(what, node, &got[node], 1, LOST_WITHIN);
    }

    // A delivery thread held for 3 s where the link allows 0.5 s.
    let what = "in-process 3x1, node 2's delivery thread stalls";
    let got = in_process(3, 1, Some(Duration::from_millis(500)), |rt| {
        conformance::stop_node(rt, 2, Stop::Stall(Duration::from_secs(3)))
    });
    assert_eq!(got[2], Ok(Ending::Victim), "{what}");
    for node in [0, 1] {
        detected(what, node, &got[node], 2, STOPPED_WITHIN);
        let Ok(Ending::Detected { error, .. }) = &got[node] else {
            unreachable!()
        };
        assert!(
            error.contains("node 2 stopped answering"),
            "{what}: {error}"
        );
    }
}

// ---------------------------------------------------------------------------
// Transports of processes

/// How a job's processes are started and meet.
#[derive(Clone, Copy, Debug)]
enum Transport {
    /// hyfi's embedded launcher (`--nodes N`): local processes over TCP
    /// on loopback, ports chosen by the launcher; its output prefixes each
    /// node's lines with `[node i] ` and ends with its verdict. Nodes of
    /// one host pair up shared-memory lanes by default: frames go through
    /// rings, the sockets carry bells and say when a peer is gone.
    Tcp,
    /// [`Transport::Tcp`] with `HYFI_LANES=0`: every frame through the
    /// sockets.
    TcpNoLanes,
    /// `mpirun -np N --tag-output` with `HYFI_TRANSPORT=mpi` (a build with
    /// the `mpi` feature): each line prefixed `[job,rank]<stdout>:`, and
    /// mpirun's own verdict in its own words.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    Mpi,
}

/// Lines of `text` by MPI rank, with `--tag-output`'s prefix
/// (`[1,3]<stdout>:`) taken off.
fn by_rank(text: &[String], nodes: usize) -> BTreeMap<usize, Vec<String>> {
    let mut out: BTreeMap<usize, Vec<String>> = (0..nodes).map(|i| (i, Vec::new())).collect();
    for l in text {
        let Some(rest) = l.strip_prefix('[') else {
            continue;
        };
        let Some((tag, line)) = rest.split_once("]<") else {
            continue;
        };
        let Some(rank) = tag.split(',').nth(1).and_then(|r| r.parse::<usize>().ok()) else {
            continue;
        };
        let Some((_, line)) = line.split_once(">:") else {
            continue;
        };
        out.entry(rank).or_default().push(line.to_owned());
    }
    out
}

/// `examples/conformance`, built once per test process with this test's
/// profile (a leftover binary would test old code; a no-op when fresh).
fn exe() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let profile_dir = common::cargo_build(&["--example", "conformance", "-p", "hyfi"]);
        let exe = profile_dir.join("examples").join("conformance");
        assert!(
            exe.exists(),
            "cargo built it but {} is missing",
            exe.display()
        );
        exe
    })
}

/// A job that ran to its end: its processes (killed, if any is left, when
/// this is dropped), the exit status, and how long it took.
struct Ran {
    transport: Transport,
    what: String,
    job: Job,
    status: ExitStatus,
    elapsed: Duration,
    nodes: usize,
}

impl Ran {
    /// Node `i`'s lines, stdout then stderr, unprefixed.
    fn node(&self, i: usize) -> Vec<String> {
        if let Transport::Mpi = self.transport {
            let mut all = self.job.stdout(0);
            all.extend(self.job.stderr(0).lines().map(str::to_owned));
            return by_rank(&all, self.nodes).remove(&i).unwrap_or_default();
        }
        let mut lines = by_node(&self.job.stdout(0), self.nodes)
            .remove(&i)
            .unwrap_or_default();
        let err: Vec<String> = self.job.stderr(0).lines().map(str::to_owned).collect();
        lines.extend(by_node(&err, self.nodes).remove(&i).unwrap_or_default());
        lines
    }

    /// The launcher's own lines (its verdict).
    fn launcher(&self) -> Vec<String> {
        (self.job.stderr(0).lines())
            .filter(|l| l.starts_with("hyfi launcher: "))
            .map(str::to_owned)
            .collect()
    }

    fn fail(&self, msg: &str) -> ! {
        self.job.fail(&format!("{}: {msg}", self.what))
    }
}

/// Runs the conformance example with `args` on `nodes × procs` over
/// `transport`, with `env` added to every node's environment, to its end
/// (within [`JOB_BOUND`]).
fn run_job(
    transport: Transport,
    nodes: usize,
    procs: usize,
    args: &[&str],
    env: &[(&str, &str)],
) -> Ran {
    let what = format!(
        "{transport:?} {nodes}x{procs} conformance {}",
        args.join(" ")
    );
    // Only this example is needed: not `Job::new`, which builds them all.
    let mut job = Job {
        what: what.clone(),
        procs: Vec::new(),
        deadline: Instant::now() + JOB_BOUND,
        pids: Vec::new(),
        files: Vec::new(),
    };
    let exe = exe();
    let t0 = Instant::now();
    match transport {
        Transport::Tcp | Transport::TcpNoLanes => {
            let mut cmd = command(exe);
            if let Transport::TcpNoLanes = transport {
                cmd.env("HYFI_LANES", "0");
            }
            cmd.args(args)
                .args(["--nodes", &nodes.to_string(), "--procs", &procs.to_string()])
                .envs(env.iter().copied());
            job.spawn("launcher", cmd);
        }
        Transport::Mpi => {
            let mut cmd = command(&mpirun());
            cmd.args([
                "--oversubscribe",
                "--allow-run-as-root",
                "--tag-output",
                "-np",
            ])
            .arg(nodes.to_string())
            .args(["-x", "HYFI_PIN=0", "-x", "HYFI_TRANSPORT=mpi"]);
            for (k, v) in env {
                cmd.arg("-x").arg(format!("{k}={v}"));
            }
            cmd.arg(exe)
                .args(args)
                .args(["--procs", &procs.to_string()])
                // Open MPI 4 wants an ssh it can find even on one host.
                .env("OMPI_MCA_plm_rsh_agent", "false");
            job.spawn("mpirun", cmd);
        }
    }
    let status = job.wait(0, JOB_BOUND);
    Ran {
        transport,
        what,
        job,
        status,
        elapsed: t0.elapsed(),
        nodes,
    }
}

#[test]
fn tcp_passes_the_suite() {
    passes_the_suite(Transport::Tcp);
}

#[test]
fn tcp_without_lanes_passes_the_suite() {
    passes_the_suite(Transport::TcpNoLanes);
}

#[cfg(feature = "mpi")]
#[test]
fn mpi_passes_the_suite() {
    passes_the_suite(Transport::Mpi);
}

#[cfg(feature = "mpi")]
#[test]
fn mpi_survivors_name_a_stopped_node() {
    let _one = serial();
    let env = [("HYFI_HEARTBEAT", HEARTBEAT)];
    let ran = run_job(Transport::Mpi, 3, 1, &["stop", "--victim", "2"], &env);
    if ran.status.success() {
        ran.fail("the job should fail");
    }
    for i in [0, 1] {
        let said = "conformance: node {i}: node 2 was stopped, detected in "
            .replace("{i}", &i.to_string());
        if !ran.node(i).iter().any(|l| l.starts_with(&said)) {
            ran.fail(&format!("node {i} did not say {said:?}"));
        }
    }
}

#[cfg(feature = "mpi")]
#[test]
fn mpi_lost_node_ends_the_job_and_is_named() {
    // Under mpirun a rank that exits ends the job: the launcher kills the
    // others and names the rank, before a survivor could see it gone; each
    // survivor says it was stopped by the launcher.
    let _one = serial();
    let ran = run_job(Transport::Mpi, 3, 1, &["lose", "--victim", "1"], &[]);
    if ran.status.success() {
        ran.fail("the job should fail");
    }
    let all = format!("{}\n{}", ran.job.stdout(0).join("\n"), ran.job.stderr(0));
    if !all.contains("rank 1") {
        ran.fail("mpirun does not name rank 1");
    }
}

/// The suite on 2×1, 4×1 and 2×2 over `transport`.
fn passes_the_suite(transport: Transport) {
    let _one = serial();
    for (nodes, procs) in [(2, 1), (4, 1), (2, 2)] {
        let ran = run_job(transport, nodes, procs, &["--seed", SEED], &[]);
        if !ran.status.success() {
            ran.fail(&format!("exited with {}", ran.status));
        }
        ran.job.no_panics();
        let line = (ran.node(0).into_iter())
            .find(|l| l.starts_with("conformance: ok "))
            .unwrap_or_else(|| ran.fail("node 0 printed no `conformance: ok` line"));
        check_summary(&ran.what, &line, nodes, procs);
        for i in 1..nodes {
            let ok = format!("conformance: node {i}: ok");
            if !ran.node(i).contains(&ok) {
                ran.fail(&format!("node {i} did not print {ok:?}"));
            }
        }
        eprintln!("{}: {:.1} s: {line}", ran.what, ran.elapsed.as_secs_f64());
    }
}

/// Every survivor of a job whose node `victim` was `how` ("lost",
/// "stopped") said so within `within`, naming it, and exited by itself
/// with a failure; the launcher names the victim as the node that failed
/// first.
fn survivors_named(ran: &Ran, victim: usize, how: &str, within: Duration) {
    if ran.status.success() {
        ran.fail("the job should fail");
    }
    ran.job.no_panics();
    let launcher = ran.launcher();
    let first = format!("hyfi launcher: node {victim} failed first");
    if !launcher.iter().any(|l| l.starts_with(&first)) {
        ran.fail(&format!("the launcher does not say {first:?}"));
    }
    for i in (0..ran.nodes).filter(|&i| i != victim) {
        let said = format!("conformance: node {i}: node {victim} was {how}, detected in ");
        let Some(line) = ran.node(i).into_iter().find(|l| l.starts_with(&said)) else {
            ran.fail(&format!("node {i} did not say {said:?}"));
        };
        let secs: f64 = line[said.len()..]
            .split_once(" s: ")
            .and_then(|(s, _)| s.parse().ok())
            .unwrap_or_else(|| ran.fail(&format!("no time in {line:?}")));
        if secs > within.as_secs_f64() {
            ran.fail(&format!("node {i} took {secs} s to detect node {victim}"));
        }
        // It ended by itself, with a failure: not stopped by the launcher.
        let ended = format!("hyfi launcher: node {i} ended because of it: exited with status ");
        if !launcher
            .iter()
            .any(|l| l.starts_with(&ended) && !l.contains("launcher stopped"))
        {
            ran.fail(&format!("the launcher does not say {ended:?}…"));
        }
    }
    eprintln!(
        "{}: {:.1} s; {}",
        ran.what,
        ran.elapsed.as_secs_f64(),
        launcher.join(" | ")
    );
}

#[test]
fn tcp_survivors_name_a_lost_node() {
    let _one = serial();
    let ran = run_job(Transport::Tcp, 3, 1, &["lose", "--victim", "1"], &[]);
    survivors_named(&ran, 1, "lost", LOST_WITHIN);
}

#[test]
fn tcp_without_lanes_survivors_name_a_lost_node() {
    let _one = serial();
    let ran = run_job(Transport::TcpNoLanes, 3, 1, &["lose", "--victim", "1"], &[]);
    survivors_named(&ran, 1, "lost", LOST_WITHIN);
}

#[test]
fn tcp_survivors_name_a_stopped_node() {
    let _one = serial();
    let env = [("HYFI_HEARTBEAT", HEARTBEAT)];
    let ran = run_job(Transport::Tcp, 3, 1, &["stop", "--victim", "2"], &env);
    survivors_named(&ran, 2, "stopped", STOPPED_WITHIN);
}
