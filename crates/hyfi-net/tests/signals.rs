//! The signal-handling thread with real signals (paper §3.2).
//!
//! A process-directed signal goes to any thread that has not blocked it, and
//! the libtest harness starts its threads before any test runs, so these
//! scenarios cannot run inside the test process: they run the example
//! `signal_probe`, whose `main` blocks the signals before starting any thread,
//! as a node does. Every wait is bounded; a hung probe is killed.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, OnceLock};
use std::time::{Duration, Instant};

use hyfi_net::signals::{exit_code_for, SignalEvent, SignalThread, ASYNC_SIGNALS};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// How long a probe may take for a whole scenario.
const BOUND: Duration = Duration::from_secs(20);

/// The probe binary, built once per test process with the same profile as
/// this test. `cargo test --test signals` does not build examples, and a
/// leftover binary from an older build would test old code, so ask cargo
/// (a no-op when it is fresh).
fn probe_exe() -> &'static PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let me = std::env::current_exe().expect("current_exe");
        // target/<profile>/deps/signals-<hash>
        let profile_dir = me
            .parent()
            .and_then(|deps| deps.parent())
            .expect("test binary lives in target/<profile>/deps");
        let profile = profile_dir
            .file_name()
            .and_then(|n| n.to_str())
            .expect("profile directory name");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| env!("CARGO").to_owned());
        let mut cmd = Command::new(cargo);
        cmd.args([
            "build",
            "--quiet",
            "--example",
            "signal_probe",
            "--manifest-path",
        ])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"));
        match profile {
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
            .expect("running cargo to build the signal_probe example");
        assert!(
            status.success(),
            "cargo build --example signal_probe failed: {status}"
        );
        let exe = profile_dir.join("examples").join("signal_probe");
        assert!(
            exe.exists(),
            "cargo built signal_probe but {} is missing",
            exe.display()
        );
        exe
    })
}

/// A running probe: its stdout lines arrive on a channel so every read has a
/// deadline; dropping it kills the process.
struct Probe {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
    deadline: Instant,
}

impl Probe {
    fn start(mode: &str) -> Probe {
        let mut child = Command::new(probe_exe())
            .arg(mode)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning signal_probe");
        let out = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Probe {
            child,
            lines,
            seen: Vec::new(),
            deadline: Instant::now() + BOUND,
        }
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    fn send(&self, signal: Signal) {
        kill(self.pid(), signal).expect("kill");
    }

    /// Waits for a line starting with `prefix` and returns it.
    fn expect_line(&mut self, prefix: &str) -> String {
        loop {
            let left = self.deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.starts_with(prefix) {
                        return line;
                    }
                }
                Err(e) => {
                    let stderr = self.kill();
                    panic!(
                        "no line starting with {prefix:?} from signal_probe ({e}); stdout so far: \
                         {:#?}; stderr: {stderr}",
                        self.seen
                    );
                }
            }
        }
    }

    /// Waits for the probe to exit; returns its status and remaining stdout.
    fn wait(&mut self) -> (ExitStatus, Vec<String>) {
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                // The reader thread ends at EOF; collect what is left.
                let rest: Vec<String> = self.lines.iter().collect();
                self.seen.extend(rest.iter().cloned());
                return (status, rest);
            }
            if Instant::now() > self.deadline {
                let stderr = self.kill();
                panic!(
                    "signal_probe did not exit within {BOUND:?}; stdout: {:#?}; stderr: {stderr}",
                    self.seen
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Kills the probe and returns its stderr.
    fn kill(&mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        err
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Bit of `signal` in a /proc `SigBlk:` mask.
fn bit(signal: Signal) -> u64 {
    1 << (signal as u64 - 1)
}

/// (thread name, blocked mask) of every thread of `pid`, from /proc.
fn thread_masks(pid: Pid) -> Vec<(String, u64)> {
    let dir = format!("/proc/{pid}/task");
    let mut out = Vec::new();
    for task in std::fs::read_dir(&dir).expect("reading /proc/<pid>/task") {
        let path = task.expect("task entry").path().join("status");
        let Ok(status) = std::fs::read_to_string(&path) else {
            continue; // the thread ended meanwhile
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_owned())
                .unwrap_or_else(|| panic!("no {name} in {}", path.display()))
        };
        let mask = u64::from_str_radix(&field("SigBlk:"), 16).expect("hex SigBlk");
        out.push((field("Name:"), mask));
    }
    out
}

/// Starts a `serve` probe and waits until it is ready.
fn serving_probe() -> Probe {
    let mut p = Probe::start("serve");
    let ready = p.expect_line("ready pid ");
    assert_eq!(ready, format!("ready pid {}", p.child.id()));
    p
}

#[test]
fn every_thread_blocks_the_async_signals_and_not_the_faults() {
    let p = serving_probe();
    // Each worker checked its own mask with pthread_sigmask before `ready`.
    let reports: Vec<&String> = p.seen.iter().filter(|l| l.starts_with("worker ")).collect();
    assert_eq!(reports.len(), 3, "{:#?}", p.seen);
    for r in &reports {
        assert!(
            r.ends_with("async blocked: yes; SIGSEGV blocked: no"),
            "{r}"
        );
    }
    assert!(
        p.seen
            .contains(&"main: async blocked: yes; SIGSEGV blocked: no".to_owned()),
        "{:#?}",
        p.seen
    );

    // And from the kernel's side, for every thread including the signal
    // thread. While a thread sleeps in sigwait, Linux unblocks the awaited
    // signals in its mask (`SigBlk`), which is how they reach it: so the
    // signal thread must show them unblocked and every other thread blocked,
    // i.e. it is the only thread the kernel can deliver them to.
    let async_bits = ASYNC_SIGNALS.iter().fold(0, |m, &s| m | bit(s));
    let faults = [
        Signal::SIGSEGV,
        Signal::SIGBUS,
        Signal::SIGFPE,
        Signal::SIGILL,
        Signal::SIGABRT,
    ];
    let waiting = |masks: &[(String, u64)]| {
        masks
            .iter()
            .any(|(n, m)| n == "hyfi-signals" && m & async_bits == 0)
    };
    // `ready` can come before the signal thread has named itself (std does
    // that on the new thread) and reached sigwait: poll, bounded.
    let mut masks = thread_masks(p.pid());
    while !waiting(&masks) && Instant::now() < p.deadline {
        std::thread::sleep(Duration::from_millis(10));
        masks = thread_masks(p.pid());
    }
    let names: Vec<&str> = masks.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(masks.len(), 5, "main, 3 workers, hyfi-signals: {names:?}");
    assert!(
        waiting(&masks),
        "hyfi-signals is not in sigwait: {masks:x?}"
    );
    assert_eq!(
        names
            .iter()
            .filter(|n| n.starts_with("hyfi-worker-"))
            .count(),
        3,
        "{names:?}"
    );
    for (name, mask) in masks.iter().filter(|(n, _)| n != "hyfi-signals") {
        assert_eq!(
            mask & async_bits,
            async_bits,
            "thread {name} mask {mask:#x}"
        );
    }
    for (name, mask) in &masks {
        for f in faults {
            assert_eq!(mask & bit(f), 0, "thread {name} blocks {f}");
        }
    }
}

#[test]
fn sigusr1_dumps_stats_on_the_signal_thread_and_sigterm_exits_143() {
    let mut p = serving_probe();
    p.send(Signal::SIGUSR1);
    let stats = p.expect_line("stats ");
    assert!(
        stats.starts_with("stats on thread hyfi-signals: "),
        "{stats}"
    );
    assert!(stats.ends_with(" work units done"), "{stats}");

    // Ignored signals: any of them would kill a process whose threads had
    // not blocked them (default action: terminate). Then another dump shows
    // the probe is alive and the thread still waiting.
    for s in [Signal::SIGPIPE, Signal::SIGALRM, Signal::SIGUSR2] {
        p.send(s);
    }
    p.send(Signal::SIGUSR1);
    let again = p.expect_line("stats ");
    assert!(
        again.starts_with("stats on thread hyfi-signals: "),
        "{again}"
    );
    assert!(
        p.child.try_wait().expect("try_wait").is_none(),
        "probe died"
    );

    p.send(Signal::SIGTERM);
    let (status, rest) = p.wait();
    assert_eq!(status.code(), Some(143), "{status}; {:#?}", p.seen);
    assert_eq!(
        rest,
        ["abort: SIGTERM on thread hyfi-signals, exiting with 143"],
        "{:#?}",
        p.seen
    );
}

#[test]
fn sigint_exits_130() {
    let mut p = serving_probe();
    p.send(Signal::SIGINT);
    let (status, rest) = p.wait();
    assert_eq!(status.code(), Some(130), "{status}; {:#?}", p.seen);
    assert_eq!(
        rest,
        ["abort: SIGINT on thread hyfi-signals, exiting with 130"]
    );
}

#[test]
fn sighup_and_sigquit_abort_too() {
    for s in [Signal::SIGHUP, Signal::SIGQUIT] {
        let mut p = serving_probe();
        p.send(s);
        let (status, rest) = p.wait();
        let code = exit_code_for(s);
        assert_eq!(status.code(), Some(code), "{s}: {status}; {:#?}", p.seen);
        assert_eq!(
            rest,
            [format!(
                "abort: {s} on thread hyfi-signals, exiting with {code}"
            )]
        );
    }
}

#[test]
fn signal_thread_can_be_started_again_after_stop() {
    let mut p = Probe::start("restart");
    let (status, rest) = p.wait();
    if !status.success() {
        let stderr = p.kill();
        panic!("{status}; stdout: {:#?}; stderr: {stderr}", p.seen);
    }
    assert_eq!(
        rest,
        [
            "round 0: DumpStats",
            "round 1: DumpStats",
            "round 2: DumpStats",
            "restart ok"
        ]
    );
}

/// In this process only thread-directed signals are safe (the harness's
/// threads have not blocked anything): start and stop wake the thread with a
/// signal aimed at it alone, so this checks that stop never hangs, several
/// times in a row, and that the caller's mask is left as it was.
#[test]
fn start_stop_in_process_is_bounded_and_restores_the_mask() {
    let before = nix::sys::signal::SigSet::thread_get_mask().expect("mask");
    let t0 = Instant::now();
    for _ in 0..5 {
        let t = SignalThread::start(|e: SignalEvent| panic!("no signal was sent, got {e}"))
            .expect("start");
        t.stop().expect("stop");
    }
    // Drop stops it too.
    drop(SignalThread::start(|_| {}).expect("start"));
    assert!(t0.elapsed() < BOUND, "start/stop took {:?}", t0.elapsed());
    let after = nix::sys::signal::SigSet::thread_get_mask().expect("mask");
    for s in ASYNC_SIGNALS {
        assert_eq!(
            before.contains(s),
            after.contains(s),
            "{s} changed in the caller's mask"
        );
    }
}
