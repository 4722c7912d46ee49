//! End-to-end tests of `hyfi-run` with real processes.
//!
//! The nodes run the `net_probe` example (`examples/net_probe.rs`), which
//! `cargo test` builds next to this test's executable. Every run is bounded:
//! past [`LIMIT`], hyfi-run is killed (its nodes die with it through
//! `PR_SET_PDEATHSIG`) and the test fails.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(30);

fn probe() -> PathBuf {
    // target/<profile>/deps/launch-<hash> → target/<profile>/examples/.
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test executable in target/<profile>/deps");
    let probe = profile_dir.join("examples").join("net_probe");
    assert!(
        probe.is_file(),
        "{} is missing: run the tests with `cargo test -p hyfi-net` (which builds the \
         examples), or build it with `cargo build -p hyfi-net --example net_probe`",
        probe.display()
    );
    probe
}

fn hyfi_run(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hyfi-run"));
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // The test may itself run under a launcher or with HYFI_NODES set.
        .env_remove("HYFI_NODES")
        .env_remove("HYFI_RANK");
    cmd
}

/// A running hyfi-run whose stdout lines arrive on a channel as they come.
struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
    stdout: Vec<String>,
    stderr: thread::JoinHandle<String>,
    started: Instant,
}

impl Running {
    fn start(mut cmd: Command) -> Running {
        let mut child = cmd.spawn().expect("spawn hyfi-run");
        let out = child.stdout.take().expect("piped stdout");
        let mut err = child.stderr.take().expect("piped stderr");
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        Running {
            child,
            lines,
            stdout: Vec::new(),
            stderr,
            started: Instant::now(),
        }
    }

    fn left(&self) -> Duration {
        LIMIT.saturating_sub(self.started.elapsed())
    }

    /// Waits for `n` stdout lines (within the limit).
    fn wait_lines(&mut self, n: usize) {
        while self.stdout.len() < n {
            match self.lines.recv_timeout(self.left()) {
                Ok(l) => self.stdout.push(l),
                Err(_) => {
                    let _ = self.child.kill();
                    panic!(
                        "only {} of {n} lines within {LIMIT:?}: {:?}",
                        self.stdout.len(),
                        self.stdout
                    );
                }
            }
        }
    }

    /// Waits for hyfi-run to end (within the limit); returns its status,
    /// stdout lines and stderr.
    fn finish(mut self) -> (ExitStatus, Vec<String>, String) {
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("wait for hyfi-run") {
                break s;
            }
            if self.left().is_zero() {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("hyfi-run still running after {LIMIT:?}; killed it");
            }
            thread::sleep(Duration::from_millis(20));
        };
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.stdout.push(l);
        }
        let stderr = self.stderr.join().expect("stderr reader");
        (status, self.stdout, stderr)
    }
}

fn run(args: &[&str]) -> (ExitStatus, Vec<String>, String) {
    Running::start(hyfi_run(args)).finish()
}

/// The probe's `key=value` fields of a `[node i] rank=...` line.
fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|w| w.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}

/// Checks that ranks 0..n each report once, with prefixes and node counts
/// right; returns the nodes' pids by rank.
fn check_ranks(stdout: &[String], stderr: &str, n: usize) -> Vec<u32> {
    let pids = seen_ranks(stdout, stderr, n);
    for rank in 0..n {
        assert_eq!(stderr_lines(stderr, rank), 1, "{stderr}");
    }
    pids.into_iter()
        .enumerate()
        .map(|(r, p)| p.unwrap_or_else(|| panic!("rank {r} missing: {stdout:?}")))
        .collect()
}

/// How many times node `rank`'s stderr line appears.
fn stderr_lines(stderr: &str, rank: usize) -> usize {
    let line = format!("[node {rank}] probe stderr rank={rank}");
    stderr.lines().filter(|l| *l == line).count()
}

/// Like [`check_ranks`], for a job stopped early: a node stopped before it
/// got to print is no error, but whatever was printed must be right.
fn seen_ranks(stdout: &[String], stderr: &str, n: usize) -> Vec<Option<u32>> {
    let mut pids = vec![None; n];
    for line in stdout.iter().filter(|l| l.contains("rank=")) {
        let rank: usize = field(line, "rank").parse().expect("rank number");
        assert!(rank < n, "{line}");
        assert!(
            line.starts_with(&format!("[node {rank}] rank={rank} ")),
            "{line}"
        );
        assert_eq!(field(line, "nodes"), n.to_string(), "{line}");
        assert_eq!(field(line, "launcher"), "Hyfi", "{line}");
        assert!(field(line, "coord").starts_with("127.0.0.1:"), "{line}");
        let pid = field(line, "pid").parse().expect("pid number");
        assert!(
            pids[rank].replace(pid).is_none(),
            "rank {rank} twice: {stdout:?}"
        );
    }
    for (rank, pid) in pids.iter().enumerate() {
        // The probe writes stdout first: a node stopped early may have
        // written its stdout line and not its stderr line, never the reverse.
        let count = stderr_lines(stderr, rank);
        assert!(count <= usize::from(pid.is_some()), "{stderr}");
    }
    pids
}

/// Whether `pid` is gone (or a zombie nobody has reaped yet), waiting a bit.
fn gone(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return true,
            // The state follows the parenthesised command name.
            Ok(stat)
                if stat
                    .rsplit_once(") ")
                    .is_some_and(|(_, r)| r.starts_with('Z')) =>
            {
                return true
            }
            Ok(_) if Instant::now() >= deadline => return false,
            Ok(_) => thread::sleep(Duration::from_millis(50)),
        }
    }
}

#[test]
fn two_and_four_nodes_report_their_ranks() {
    let probe = probe();
    for n in [2usize, 4] {
        let ns = n.to_string();
        let (status, stdout, stderr) = run(&["-n", &ns, probe.to_str().expect("utf-8 path")]);
        assert!(status.success(), "{status}: {stderr}");
        assert_eq!(stdout.len(), n, "{stdout:?}");
        let coords: Vec<&str> = stdout.iter().map(|l| field(l, "coord")).collect();
        assert!(coords.iter().all(|c| *c == coords[0]), "{coords:?}");
        check_ranks(&stdout, &stderr, n);
    }
}

#[test]
fn a_failing_node_stops_the_others() {
    let probe = probe();
    let started = Instant::now();
    let (status, stdout, stderr) = run(&[
        "-n",
        "3",
        "--",
        probe.to_str().expect("utf-8 path"),
        "exit:3@1",
        "sleep:60",
    ]);
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("hyfi launcher: node 1 failed first: exited with status 3"),
        "{stderr}"
    );
    let pids = seen_ranks(&stdout, &stderr, 3);
    assert!(pids[1].is_some(), "{stdout:?}");
    for pid in pids.into_iter().flatten() {
        assert!(gone(pid), "node pid {pid} still alive");
    }
}

#[test]
fn a_node_killed_by_sigkill_fails_the_job() {
    let probe = probe();
    let (status, stdout, stderr) = run(&[
        "-n",
        "2",
        probe.to_str().expect("utf-8 path"),
        "kill9@0",
        "sleep:60",
    ]);
    assert_eq!(status.code(), Some(128 + 9), "{stderr}");
    assert!(
        stderr.contains("hyfi launcher: node 0 failed first: was killed by signal 9 (SIGKILL)"),
        "{stderr}"
    );
    let pids = seen_ranks(&stdout, &stderr, 2);
    assert!(pids[0].is_some(), "{stdout:?}");
    for pid in pids.into_iter().flatten() {
        assert!(gone(pid), "node pid {pid} still alive");
    }
}

#[test]
fn sigterm_to_the_launcher_reaches_the_nodes() {
    let probe = probe();
    let mut running = Running::start(hyfi_run(&[
        "-n",
        "3",
        probe.to_str().expect("utf-8 path"),
        "sleep:60",
    ]));
    running.wait_lines(3);
    let pids: Vec<u32> = running
        .stdout
        .iter()
        .map(|l| field(l, "pid").parse().expect("pid"))
        .collect();
    let launcher = running.child.id() as libc::pid_t;
    // SAFETY: kill(2) has no memory effects; the pid is our unreaped child.
    assert_eq!(unsafe { libc::kill(launcher, libc::SIGTERM) }, 0);
    let started = Instant::now();
    let (status, stdout, stderr) = running.finish();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(!status.success(), "{status}: {stderr}");
    assert_eq!(status.code(), Some(128 + 15), "{stderr}");
    // SIGTERM may have come between a probe's stdout and stderr lines.
    assert!(seen_ranks(&stdout, &stderr, 3).iter().all(Option::is_some));
    for pid in pids {
        assert!(gone(pid), "node pid {pid} outlived hyfi-run");
    }
}

#[test]
fn timeout_stops_the_nodes() {
    let probe = probe();
    let started = Instant::now();
    let (status, _, stderr) = run(&[
        "-n",
        "2",
        "--timeout",
        "0.5",
        probe.to_str().expect("utf-8 path"),
        "sleep:60",
    ]);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("timed out after"), "{stderr}");
}

#[test]
fn bad_usage_exits_2_with_the_usage() {
    for args in [
        &[][..],
        &["-n", "0", "true"],
        &["-n", "2"],
        &["--bogus", "true"],
    ] {
        let (status, stdout, stderr) = run(args);
        assert_eq!(status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stdout.is_empty(), "{stdout:?}");
        assert!(stderr.starts_with("hyfi-run: "), "{stderr}");
        assert!(stderr.contains("usage: hyfi-run -n NODES"), "{stderr}");
    }
    let (status, _, stderr) = run(&["-n", "2", "no-such-program-hyfi-test"]);
    assert_eq!(status.code(), Some(127), "{stderr}");
    assert!(
        stderr.contains("no-such-program-hyfi-test: not found in PATH"),
        "{stderr}"
    );
}

#[test]
fn program_is_found_in_path() {
    let (status, stdout, stderr) = run(&["-n", "2", "sh", "-c", "echo hi; echo oops >&2"]);
    assert!(status.success(), "{stderr}");
    let mut out = stdout.clone();
    out.sort();
    assert_eq!(out, ["[node 0] hi", "[node 1] hi"]);
    assert_eq!(
        stderr.lines().filter(|l| l.ends_with("] oops")).count(),
        2,
        "{stderr}"
    );
}
