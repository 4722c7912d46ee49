//! The harness of the multi-process tests: builds the example programs and
//! `hyfi-run`, starts real processes, collects their output, bounds every
//! wait, and kills whatever a test started when it ends (passing or not).

#![allow(dead_code)] // each test file uses part of it

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The longest any test may take.
pub const BOUND: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------
// Binaries

pub struct Bins {
    pub montecarlo: PathBuf,
    pub hyfi_run: PathBuf,
    pub jacobi: PathBuf,
    pub lu: PathBuf,
    pub matmul: PathBuf,
    pub dsm_stress: PathBuf,
    pub dsm_forkjoin: PathBuf,
    pub dsm_reduce: PathBuf,
    pub quad: PathBuf,
    pub fib: PathBuf,
    pub fj_probe: PathBuf,
    pub faults: PathBuf,
    pub exact_sum: PathBuf,
    pub sor: PathBuf,
    pub diffusion: PathBuf,
    pub heat3d: PathBuf,
    pub cg: PathBuf,
    pub mandelbrot: PathBuf,
}

/// Runs `cargo build --quiet ARGS` for this workspace with this test's
/// profile and features (the `mpi` transport when the test has it), and
/// returns the profile's directory (`target/<profile>`): a test process
/// builds what it runs, so that a leftover binary never tests old code.
pub fn cargo_build(args: &[&str]) -> PathBuf {
    let me = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test>-<hash>
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
    cmd.args(["build", "--quiet"])
        .args(args)
        .arg("--manifest-path")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"));
    // The binaries with the transports this test was built with.
    if cfg!(feature = "mpi") {
        cmd.args(["--features", "mpi"]);
    }
    match profile.as_str() {
        "debug" => {}
        "release" => {
            cmd.arg("--release");
        }
        other => {
            cmd.args(["--profile", other]);
        }
    }
    let status = cmd.status().expect("running cargo build");
    assert!(status.success(), "cargo build {args:?} failed: {status}");
    profile_dir
}

/// The examples and `hyfi-run`, built once per test process with this test's
/// profile: `cargo test --test multinode` builds neither, and a leftover
/// binary from an older build would test old code (a no-op when fresh).
pub fn bins() -> &'static Bins {
    static BINS: OnceLock<Bins> = OnceLock::new();
    BINS.get_or_init(|| {
        let profile_dir = cargo_build(&[
            "--example",
            "montecarlo",
            "--example",
            "jacobi",
            "--example",
            "lu",
            "--example",
            "matmul",
            "--example",
            "dsm_stress",
            "--example",
            "dsm_forkjoin",
            "--example",
            "dsm_reduce",
            "--example",
            "quad",
            "--example",
            "fib",
            "--example",
            "fj_probe",
            "--example",
            "faults",
            "--example",
            "exact_sum",
            "--example",
            "sor",
            "--example",
            "diffusion",
            "--example",
            "heat3d",
            "--example",
            "cg",
            "--example",
            "mandelbrot",
            "--bin",
            "hyfi-run",
            "-p",
            "hyfi",
            "-p",
            "hyfi-net",
        ]);
        let ex = |name: &str| profile_dir.join("examples").join(name);
        let bins = Bins {
            montecarlo: ex("montecarlo"),
            hyfi_run: profile_dir.join("hyfi-run"),
            jacobi: ex("jacobi"),
            lu: ex("lu"),
            matmul: ex("matmul"),
            dsm_stress: ex("dsm_stress"),
            dsm_forkjoin: ex("dsm_forkjoin"),
            dsm_reduce: ex("dsm_reduce"),
            quad: ex("quad"),
            fib: ex("fib"),
            fj_probe: ex("fj_probe"),
            faults: ex("faults"),
            exact_sum: ex("exact_sum"),
            sor: ex("sor"),
            diffusion: ex("diffusion"),
            heat3d: ex("heat3d"),
            cg: ex("cg"),
            mandelbrot: ex("mandelbrot"),
        };
        for exe in [
            &bins.montecarlo,
            &bins.hyfi_run,
            &bins.jacobi,
            &bins.lu,
            &bins.matmul,
            &bins.dsm_stress,
            &bins.dsm_forkjoin,
            &bins.dsm_reduce,
            &bins.quad,
            &bins.fib,
            &bins.fj_probe,
            &bins.faults,
            &bins.exact_sum,
            &bins.sor,
            &bins.diffusion,
            &bins.heat3d,
            &bins.mandelbrot,
        ] {
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
pub fn command(exe: &Path) -> Command {
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
            "RUST_BACKTRACE",
        ]
        .iter()
        .any(|p| k.starts_with(p))
        {
            cmd.env_remove(&key);
        }
    }
    cmd.env("HYFI_PIN", "0").stdin(Stdio::null());
    // A test run from a non-interactive shell's background job inherits
    // SIGINT and SIGQUIT ignored (POSIX), and launchers rightly keep an
    // inherited ignore: start every program with the default dispositions
    // a user's terminal gives it, whatever ran the tests.
    // SAFETY: signal() with SIG_DFL is async-signal-safe, as pre_exec needs.
    unsafe {
        cmd.pre_exec(|| {
            for sig in [libc::SIGINT, libc::SIGQUIT, libc::SIGTERM, libc::SIGHUP] {
                libc::signal(sig, libc::SIG_DFL);
            }
            Ok(())
        });
    }
    cmd
}

/// `exe` found on `PATH`, if it is there.
pub fn on_path(exe: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(exe))
        .find(|p| p.is_file())
}

/// Open MPI's launcher, which the MPI transport's tests need.
pub fn mpirun() -> PathBuf {
    on_path("mpirun")
        .expect("mpirun is not installed: the MPI transport's tests need Open MPI (see .ci/run)")
}

/// A port nobody listens on (bound, read and released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("binding 127.0.0.1:0")
        .port()
}

/// A name no other test (or test run) uses.
pub fn unique(what: &str) -> String {
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

pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .expect("reading /dev/urandom");
    b
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

// ---------------------------------------------------------------------------
// Processes

/// Is `pid` a live (not zombie) process of one of our example programs?
pub fn example_alive(pid: u32) -> bool {
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
        .map(|c| String::from_utf8_lossy(&c).contains("/examples/"))
        .unwrap_or(false)
}

pub fn send_signal(target: &str, signal: &str) -> bool {
    Command::new("kill")
        .args(["-s", signal, "--", target])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// One process the test started; its output is collected by two threads.
pub struct Proc {
    pub name: String,
    pub child: Child,
    pub out: Arc<Mutex<Vec<String>>>,
    pub err: Arc<Mutex<Vec<String>>>,
    /// Readers that reached end of file.
    pub eofs: Arc<AtomicUsize>,
    pub status: Option<(ExitStatus, Instant)>,
}

pub fn collect(
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
pub struct Job {
    pub what: String,
    pub procs: Vec<Proc>,
    pub deadline: Instant,
    pub pids: Vec<u32>,
    pub files: Vec<PathBuf>,
}

impl Job {
    /// A job that may take at most [`BOUND`].
    pub fn new(what: &str) -> Job {
        Job::with_bound(what, BOUND)
    }

    /// A job that may take at most `bound`.
    pub fn with_bound(what: &str, bound: Duration) -> Job {
        // Build the programs first: a cold build on a loaded machine must
        // not count against the job's bound.
        bins();
        Job {
            what: what.to_owned(),
            procs: Vec::new(),
            deadline: Instant::now() + bound,
            pids: Vec::new(),
            files: Vec::new(),
        }
    }

    /// Starts `cmd` in a process group of its own; returns its index.
    pub fn spawn(&mut self, name: &str, mut cmd: Command) -> usize {
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

    pub fn pid(&self, i: usize) -> u32 {
        self.procs[i].child.id()
    }

    pub fn stdout(&self, i: usize) -> Vec<String> {
        self.procs[i]
            .out
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn stderr(&self, i: usize) -> String {
        self.procs[i]
            .err
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .join("\n")
    }

    /// Everything every process said so far, for failure messages.
    pub fn dump(&self) -> String {
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

    pub fn fail(&self, msg: &str) -> ! {
        panic!("{}: {msg}{}", self.what, self.dump())
    }

    pub fn poll(&mut self, i: usize) -> Option<ExitStatus> {
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
    pub fn exited_at(&self, i: usize) -> Instant {
        self.procs[i].status.expect("exited").1
    }

    /// Waits (at most `within`, and never past the test's bound) for
    /// process `i` to exit, and for its output to be read.
    pub fn wait(&mut self, i: usize, within: Duration) -> ExitStatus {
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
    pub fn wait_all(&mut self, within: Duration) -> Vec<ExitStatus> {
        (0..self.procs.len())
            .map(|i| self.wait(i, within))
            .collect()
    }

    /// Waits for a stdout line of process `i` that `pred` accepts.
    pub fn wait_line(&mut self, i: usize, what: &str, pred: impl Fn(&str) -> bool) -> String {
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
    pub fn no_panics(&self) {
        for (i, p) in self.procs.iter().enumerate() {
            if let Some(l) = self.stderr(i).lines().find(|l| l.contains("panicked at")) {
                self.fail(&format!("{} printed a panic: {l:?}", p.name));
            }
        }
    }

    /// Remembers a montecarlo pid, to be killed at the end if still alive.
    pub fn track(&mut self, pid: u32) {
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
            if example_alive(pid) {
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
    pub fn poll_quiet(&mut self, i: usize) -> bool {
        let p = &mut self.procs[i];
        if p.status.is_none() {
            if let Ok(Some(st)) = p.child.try_wait() {
                p.status = Some((st, Instant::now()));
            }
        }
        p.status.is_some()
    }
}

/// Output lines by node: `[node i] ...` from a launcher's prefixes, or all
/// of it as node 0's for a one-node run.
pub fn by_node(lines: &[String], nodes: usize) -> BTreeMap<usize, Vec<String>> {
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
