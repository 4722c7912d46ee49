//! Launching nodes as local processes: the embedded default and `hyfi-run`.
//!
//! A program run with `HYFI_NODES=n` and no launcher around
//! ([`Detected::LaunchLocal`](crate::bootstrap::Detected::LaunchLocal)) calls
//! [`launch_self`], which starts n copies of itself as the nodes; `hyfi-run`
//! does the same for any program. Either way a [`LocalLaunch`] does the work:
//!
//! - **Environment.** Node i gets `HYFI_RANK=i`, `HYFI_NODES=n`,
//!   `HYFI_COORD=127.0.0.1:<port>` (a port free at launch time), a random
//!   `HYFI_JOB` and `HYFI_TOKEN`, and `HYFI_PROCS` if asked for. Variables of
//!   other launchers (`OMPI_*`, `PMI_*`, `PMIX_*`, `SLURM_PROCID`,
//!   `SLURM_NTASKS`) are removed so that a node run inside `mpirun` or `srun`
//!   does not take itself for one of their ranks. Stdin is `/dev/null`.
//! - **Output.** Each line a node writes is copied whole to the launcher's
//!   stdout or stderr, prefixed with `[node i] `.
//! - **Failure.** When a node fails (non-zero exit or a signal), the others
//!   get SIGTERM, then SIGKILL after [`GRACE`]; every node is reaped and each
//!   failure reported on stderr. A node still running at the optional
//!   deadline is stopped the same way, and the launch is an error.
//! - **No orphans.** Each node asks the kernel for SIGKILL when the launcher
//!   goes away (`PR_SET_PDEATHSIG`), so even a `kill -9` of the launcher
//!   takes the nodes with it. SIGINT, SIGTERM and SIGHUP sent to the launcher
//!   are *forwarded*: [`LocalLaunch::run`] blocks them on its thread and a
//!   thread of its own takes them with `sigtimedwait` and hands them to the
//!   supervising loop, which sends them on to the nodes still running (a
//!   second signal sends SIGKILL). The nodes then exit and are reaped as
//!   usual, and the outcome reports them killed by that signal. We forward
//!   rather than die because dying would let the kernel SIGKILL the nodes,
//!   which gives them no chance to shut down in order.
//!
//! Only the supervising loop signals and reaps the nodes, so a node's pid is
//! never signalled after it was reaped (and possibly reused).
//!
//! ```no_run
//! use hyfi_net::launch::LocalLaunch;
//!
//! let launch = LocalLaunch::new(4, "/usr/bin/env".into());
//! let outcome = launch.run().expect("launcher failed");
//! std::process::exit(outcome.exit_code());
//! ```

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{SigSet, SigmaskHow, Signal};

use crate::bootstrap::{random_token, random_u64, token_hex};
use crate::NetError;

/// How long nodes get between SIGTERM and SIGKILL.
pub const GRACE: Duration = Duration::from_secs(5);

/// How often the supervising loop looks at the nodes.
const POLL: Duration = Duration::from_millis(20);

/// How long to wait, once every node is reaped, for the last of its output:
/// a grandchild that inherited a node's pipe could hold it open forever.
const DRAIN: Duration = Duration::from_secs(2);

/// The signals the launcher forwards to its nodes.
const FORWARDED: [Signal; 3] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP];

/// Start `nodes` copies of a program as the nodes of one job on this host.
#[derive(Clone, Debug)]
pub struct LocalLaunch {
    /// Number of nodes (processes) to start.
    pub nodes: usize,
    /// Worker threads per node (`HYFI_PROCS`); `None` leaves it to the node.
    pub procs: Option<usize>,
    /// The program each node runs.
    pub program: PathBuf,
    /// Its arguments (without the program name).
    pub args: Vec<OsString>,
    /// Stop the nodes still running after this long, and fail.
    pub timeout: Option<Duration>,
}

/// How the nodes ended.
#[derive(Clone, Debug)]
pub struct LaunchOutcome {
    /// Node i's exit status at index i.
    pub statuses: Vec<ExitStatus>,
    /// The node that failed first in time, if any: the likely cause, since
    /// the others may have been stopped by the launcher because of it.
    pub first_failure: Option<usize>,
}

impl LaunchOutcome {
    /// Whether every node exited with status 0.
    pub fn success(&self) -> bool {
        self.statuses.iter().all(ExitStatus::success)
    }

    /// The exit code the launcher should end with: 0 if every node
    /// succeeded, else the code of the first node to fail, or 128 + signal
    /// if a signal killed it (the shell's convention).
    pub fn exit_code(&self) -> i32 {
        let failed = self
            .first_failure
            .or_else(|| self.statuses.iter().position(|s| !s.success()));
        match failed.and_then(|i| self.statuses.get(i)) {
            None => 0,
            Some(s) => status_code(*s),
        }
    }
}

fn status_code(s: ExitStatus) -> i32 {
    match (s.code(), s.signal()) {
        (Some(c), _) => c,
        (None, Some(sig)) => 128 + sig,
        (None, None) => 1,
    }
}

/// "exited with status 3" / "was killed by signal 9 (SIGKILL)".
fn describe(s: ExitStatus) -> String {
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(sig)) => match Signal::try_from(sig) {
            Ok(name) => format!("was killed by signal {sig} ({name})"),
            Err(_) => format!("was killed by signal {sig}"),
        },
        (None, None) => format!("ended with status {s}"),
    }
}

impl LocalLaunch {
    /// A launch of `nodes` nodes of `program`, with no arguments, no
    /// `HYFI_PROCS` and no timeout.
    pub fn new(nodes: usize, program: PathBuf) -> Self {
        LocalLaunch {
            nodes,
            procs: None,
            program,
            args: Vec::new(),
            timeout: None,
        }
    }

    /// Starts the nodes, forwards their output, and waits for all of them.
    ///
    /// Returns how each node ended; `Err` if the nodes could not be started
    /// or the timeout expired. Call it on a thread that lives until it
    /// returns (it does not return earlier): `PR_SET_PDEATHSIG` fires when
    /// the *thread* that started a node ends. SIGINT, SIGTERM and SIGHUP are
    /// blocked on the calling thread while it runs and forwarded to the
    /// nodes; threads the program started before the call still take them,
    /// so call it early (as [`launch_self`] and `hyfi-run` do).
    pub fn run(&self) -> Result<LaunchOutcome, NetError> {
        if self.nodes == 0 {
            return Err(NetError::Launch("cannot start 0 nodes".into()));
        }
        let mut blocked = SigSet::empty();
        for s in FORWARDED {
            blocked.add(s);
        }
        // Block before any thread of ours starts, so they inherit the mask
        // and only the signal thread takes these signals.
        let old_mask = blocked
            .thread_swap_mask(SigmaskHow::SIG_BLOCK)
            .map_err(|e| NetError::io("blocking SIGINT/SIGTERM/SIGHUP", e.into()))?;
        let (sig_tx, sig_rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let sig_thread = {
            let stop = Arc::clone(&stop);
            thread::Builder::new()
                .name("hyfi-launch-signals".into())
                .spawn(move || signal_loop(blocked, &stop, &sig_tx))
        };
        let result = match sig_thread {
            Ok(handle) => {
                let r = self.supervise(&sig_rx);
                stop.store(true, Ordering::Relaxed);
                // The loop wakes within its poll period.
                let _ = handle.join();
                r
            }
            Err(e) => Err(NetError::io("starting the launcher's signal thread", e)),
        };
        // A signal that arrived after the signal thread stopped is still
        // pending and now takes its default action on us: right, since it
        // was meant for the launcher.
        let _ = old_mask.thread_set_mask();
        result
    }

    /// Spawns the nodes and watches them until all are reaped.
    fn supervise(&self, signals: &mpsc::Receiver<Signal>) -> Result<LaunchOutcome, NetError> {
        let port = free_port()?;
        let job = random_u64();
        let token = token_hex(&random_token());
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let mut nodes: Vec<Node> = Vec::with_capacity(self.nodes);
        let mut forwarders = 0;
        for rank in 0..self.nodes {
            let mut cmd = self.command(rank, port, job, &token);
            match cmd.spawn() {
                Ok(mut child) => {
                    if let Some(out) = child.stdout.take() {
                        forwarders += forward(rank, out, false, done_tx.clone());
                    }
                    if let Some(err) = child.stderr.take() {
                        forwarders += forward(rank, err, true, done_tx.clone());
                    }
                    nodes.push(Node {
                        child,
                        status: None,
                        signalled: None,
                    });
                }
                Err(e) => {
                    // Stop the nodes already started: without this one the
                    // job cannot run.
                    for n in &mut nodes {
                        n.signal(Signal::SIGKILL);
                        let _ = n.child.wait();
                    }
                    return Err(NetError::Launch(format!(
                        "could not start node {rank} ({}): {e}",
                        self.program.display()
                    )));
                }
            }
        }
        drop(done_tx);

        let deadline = self.timeout.map(|t| Instant::now() + t);
        let mut first_failure = None;
        let mut stopping_since: Option<Instant> = None;
        let mut killed = false;
        let mut timed_out = false;
        let mut interrupted = 0;
        loop {
            for (rank, n) in nodes.iter_mut().enumerate() {
                if n.status.is_some() {
                    continue;
                }
                match n.child.try_wait() {
                    Ok(Some(status)) => {
                        n.status = Some(status);
                        if !status.success() {
                            report(rank, status, n.signalled);
                            if first_failure.is_none() {
                                first_failure = Some(rank);
                            }
                        }
                    }
                    Ok(None) => {}
                    Err(e) => {
                        // Cannot happen for a child we own; if it does, the
                        // node is beyond our reach: kill it and move on.
                        eprintln!("hyfi launcher: cannot wait for node {rank}: {e}; killing it");
                        n.signal(Signal::SIGKILL);
                        n.status = n.child.wait().ok();
                        if n.status.is_none() {
                            n.status = Some(ExitStatus::from_raw(libc::SIGKILL));
                        }
                        first_failure.get_or_insert(rank);
                    }
                }
            }
            if nodes.iter().all(|n| n.status.is_some()) {
                break;
            }
            let now = Instant::now();
            if first_failure.is_some() && stopping_since.is_none() {
                eprintln!("hyfi launcher: a node failed; stopping the others");
                signal_all(&mut nodes, Signal::SIGTERM);
                stopping_since = Some(now);
            }
            if let Some(d) = deadline {
                if now >= d && !timed_out {
                    timed_out = true;
                    eprintln!(
                        "hyfi launcher: timeout of {:?} reached; stopping the nodes still running",
                        self.timeout.unwrap_or_default()
                    );
                    signal_all(&mut nodes, Signal::SIGTERM);
                    stopping_since.get_or_insert(now);
                }
            }
            if let Some(t) = stopping_since {
                if !killed && now.duration_since(t) >= GRACE {
                    killed = true;
                    signal_all(&mut nodes, Signal::SIGKILL);
                }
            }
            // Waiting on the signal channel doubles as the poll sleep, so a
            // signal is forwarded at once.
            match signals.recv_timeout(POLL) {
                Ok(sig) => {
                    interrupted += 1;
                    let sig = if interrupted > 1 {
                        Signal::SIGKILL
                    } else {
                        sig
                    };
                    eprintln!("hyfi launcher: got a signal; sending {sig} to the nodes");
                    signal_all(&mut nodes, sig);
                    stopping_since.get_or_insert(now);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => thread::sleep(POLL),
            }
        }

        // Let the forwarders print what the nodes wrote last.
        let drain_until = Instant::now() + DRAIN;
        for _ in 0..forwarders {
            let left = drain_until.saturating_duration_since(Instant::now());
            if done_rx.recv_timeout(left).is_err() {
                break;
            }
        }

        let statuses: Vec<ExitStatus> = nodes
            .iter()
            .map(|n| n.status.unwrap_or(ExitStatus::from_raw(libc::SIGKILL)))
            .collect();
        if timed_out {
            let still: Vec<String> = nodes
                .iter()
                .enumerate()
                .filter(|(_, n)| n.signalled.is_some())
                .map(|(i, _)| i.to_string())
                .collect();
            return Err(NetError::Launch(format!(
                "timed out after {:?}: node(s) {} were still running and were stopped",
                self.timeout.unwrap_or_default(),
                still.join(", ")
            )));
        }
        Ok(LaunchOutcome {
            statuses,
            first_failure,
        })
    }

    /// The command that starts node `rank`.
    fn command(&self, rank: usize, port: u16, job: u64, token: &str) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (key, _) in std::env::vars_os() {
            let k = key.to_string_lossy();
            if k.starts_with("OMPI_")
                || k.starts_with("PMI_")
                || k.starts_with("PMIX_")
                || k == "SLURM_PROCID"
                || k == "SLURM_NTASKS"
                || k == "HYFI_RENDEZVOUS"
            {
                cmd.env_remove(&key);
            }
        }
        cmd.env("HYFI_RANK", rank.to_string())
            .env("HYFI_NODES", self.nodes.to_string())
            // Every node runs on this host: node `rank` of `nodes` here,
            // for the division of the CPUs between them.
            .env("HYFI_LOCAL_RANK", rank.to_string())
            .env("HYFI_LOCAL_SIZE", self.nodes.to_string())
            .env("HYFI_COORD", format!("127.0.0.1:{port}"))
            .env("HYFI_JOB", job.to_string())
            .env("HYFI_TOKEN", token);
        if let Some(p) = self.procs {
            cmd.env("HYFI_PROCS", p.to_string());
        }
        let parent = std::process::id();
        // SAFETY: the closure runs in the child between fork and exec, where
        // only async-signal-safe calls are allowed: prctl, getppid and
        // pthread_sigmask are, and it allocates nothing (the error paths
        // build io::Errors from an errno, which does not allocate).
        unsafe {
            cmd.pre_exec(move || {
                // Die with the launcher (see the module docs).
                if libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                ) == -1
                {
                    return Err(std::io::Error::last_os_error());
                }
                // The launcher may have died between fork and prctl, in
                // which case no death signal will come: give up now.
                if libc::getppid() as u32 != parent {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                // std resets the mask already; do it here too, since a node
                // that inherited our blocked SIGTERM could not be stopped.
                let mut empty = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
                libc::sigemptyset(empty.as_mut_ptr());
                libc::pthread_sigmask(libc::SIG_SETMASK, empty.as_ptr(), std::ptr::null_mut());
                Ok(())
            });
        }
        cmd
    }
}

/// One node being supervised.
struct Node {
    child: Child,
    status: Option<ExitStatus>,
    /// The last signal the launcher sent it, to tell "failed" from "stopped".
    signalled: Option<Signal>,
}

impl Node {
    fn signal(&mut self, sig: Signal) {
        if self.status.is_some() {
            return;
        }
        // The child is not reaped yet (only the supervising loop reaps), so
        // its pid is still ours; ESRCH cannot happen and other errors leave
        // nothing to do.
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, sig);
        self.signalled = Some(sig);
    }
}

fn signal_all(nodes: &mut [Node], sig: Signal) {
    for n in nodes {
        n.signal(sig);
    }
}

fn report(rank: usize, status: ExitStatus, signalled: Option<Signal>) {
    let by_us = if signalled.is_some() {
        " (stopped by the launcher)"
    } else {
        ""
    };
    eprintln!("hyfi launcher: node {rank} {}{by_us}", describe(status));
}

/// Takes the forwarded signals until `stop`; `sigtimedwait` with a short
/// timeout because nothing can interrupt a plain `sigwait` portably.
fn signal_loop(set: SigSet, stop: &AtomicBool, tx: &mpsc::Sender<Signal>) {
    let timeout = libc::timespec {
        tv_sec: 0,
        tv_nsec: 100_000_000,
    };
    while !stop.load(Ordering::Relaxed) {
        // SAFETY: `set` is a valid, initialised sigset (SigSet wraps one),
        // the info pointer may be null and `timeout` lives across the call.
        let sig = unsafe { libc::sigtimedwait(set.as_ref(), std::ptr::null_mut(), &timeout) };
        if sig > 0 {
            if let Ok(s) = Signal::try_from(sig) {
                if tx.send(s).is_err() {
                    return;
                }
            }
        }
    }
}

/// A TCP port free on 127.0.0.1 right now. Another process could take it
/// before node 0 binds it; node 0 then fails with a clear bind error.
fn free_port() -> Result<u16, NetError> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| NetError::io("finding a free port on 127.0.0.1", e))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| NetError::io("finding a free port on 127.0.0.1", e))
}

/// Copies `pipe` to our stdout (or stderr) line by line with the node's
/// prefix; signals `done` at end of file. Returns the number of threads
/// started (0 or 1).
fn forward(
    rank: usize,
    pipe: impl Read + Send + 'static,
    to_err: bool,
    done: mpsc::Sender<()>,
) -> usize {
    let spawned = thread::Builder::new()
        .name(format!("hyfi-launch-out{rank}"))
        .spawn(move || {
            let prefix = format!("[node {rank}] ");
            let mut reader = BufReader::new(pipe);
            let mut line = Vec::new();
            let mut out = prefix.clone().into_bytes();
            loop {
                line.clear();
                match reader.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                out.truncate(prefix.len());
                out.extend_from_slice(&line);
                if !line.ends_with(b"\n") {
                    out.push(b'\n');
                }
                // One write_all under the lock: lines never interleave. A
                // closed stdout is no reason to stop draining the node
                // (it would block on a full pipe), so errors are dropped.
                if to_err {
                    let _ = std::io::stderr().lock().write_all(&out);
                } else {
                    let mut o = std::io::stdout().lock();
                    let _ = o.write_all(&out).and_then(|()| o.flush());
                }
            }
            let _ = done.send(());
        });
    usize::from(spawned.is_ok())
}

/// Starts `nodes` copies of this program as the nodes of a local job, waits
/// for them, and exits with their [`LaunchOutcome::exit_code`] (1, with the
/// error on stderr, if the launch itself fails).
///
/// A program calls this when [`detect`](crate::bootstrap::detect) answers
/// [`Detected::LaunchLocal`](crate::bootstrap::Detected::LaunchLocal); do it
/// early, before starting threads (see [`LocalLaunch::run`]).
pub fn launch_self(nodes: usize) -> ! {
    let program = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("hyfi: cannot find this program's executable to start {nodes} nodes: {e}");
            std::process::exit(1);
        }
    };
    let launch = LocalLaunch {
        nodes,
        procs: None,
        program,
        args: std::env::args_os().skip(1).collect(),
        timeout: None,
    };
    match launch.run() {
        Ok(outcome) => std::process::exit(outcome.exit_code()),
        Err(e) => {
            eprintln!("hyfi: {e}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(raw: &[i32], first: Option<usize>) -> LaunchOutcome {
        LaunchOutcome {
            statuses: raw.iter().map(|&r| ExitStatus::from_raw(r)).collect(),
            first_failure: first,
        }
    }

    #[test]
    fn exit_codes() {
        // Raw wait statuses: code c is c << 8, signal s is s.
        assert_eq!(outcome(&[0, 0], None).exit_code(), 0);
        assert!(outcome(&[0, 0], None).success());
        assert_eq!(outcome(&[0, 3 << 8], None).exit_code(), 3);
        assert!(!outcome(&[0, 3 << 8], None).success());
        assert_eq!(outcome(&[9, 0], None).exit_code(), 137);
        // The first failure in time wins over the lowest rank.
        assert_eq!(outcome(&[15, 3 << 8], Some(1)).exit_code(), 3);
    }

    #[test]
    fn descriptions() {
        assert_eq!(
            describe(ExitStatus::from_raw(3 << 8)),
            "exited with status 3"
        );
        assert_eq!(
            describe(ExitStatus::from_raw(9)),
            "was killed by signal 9 (SIGKILL)"
        );
    }
}
