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
//! - **Limits.** Before anything starts, the node count is checked against
//!   [`limits::MAX_LOCAL_NODES`] and what the host has room for (see
//!   [`limits`]); too many is a [`NetError::TooManyNodes`] naming the bound.
//! - **Output.** Each line a node writes is copied whole to the launcher's
//!   stdout or stderr, prefixed with `[node i] `; stderr lines that many
//!   nodes repeat are summarised (see [`output`]).
//! - **Progress.** When the launcher's stderr is a terminal (or
//!   `HYFI_PROGRESS=force`), nodes get `HYFI_PROGRESS=lines` and the
//!   progress lines they write on stderr become one status line for the job,
//!   rewritten in place and erased before any other line and at the end
//!   (see [`status`] and `hyfi_core::progress`); otherwise they get
//!   `HYFI_PROGRESS=off` and nothing about progress is written.
//! - **Process groups.** Each node leads a process group of its own, and
//!   the launcher signals the whole group (`kill(-pgid, sig)`), so what a
//!   node started is stopped with it. A node therefore does not get the
//!   terminal's Ctrl-C itself: the launcher forwards it (below).
//! - **Failure.** When a node fails (non-zero exit or a signal), the others
//!   get SIGTERM, then SIGKILL after [`GRACE`]; every node is reaped and its
//!   failure reported on stderr (the first [`REPORTS_SHOWN`] one by one, the
//!   rest grouped at the end). A node still running at the optional deadline
//!   is stopped the same way, and the launch is an error. A node that has
//!   not gone [`GRACE`] after its SIGKILL is given up on, so no wait is
//!   unbounded. A node failing while others are still being started stops
//!   the start-up.
//! - **Cleanup.** When every node is reaped, what is left in their process
//!   groups (a daemon a node started and did not wait for) gets SIGTERM,
//!   then SIGKILL after [`GRACE`].
//! - **No orphans.** Each node asks the kernel for SIGKILL when the launcher
//!   goes away (`PR_SET_PDEATHSIG`), so even a `kill -9` of the launcher
//!   takes the nodes with it. SIGINT, SIGTERM and SIGHUP sent to the launcher
//!   (unless it ignores them, as under `nohup`) are *forwarded*:
//!   [`LocalLaunch::run`] blocks them on its thread and a thread of its own takes them with `sigtimedwait` and hands them to the
//!   supervising loop, which sends them on to the nodes' groups (a second
//!   signal sends SIGKILL). A signal that comes while nodes are still being
//!   started stops the start-up there. The nodes then exit and are reaped as
//!   usual, and the launcher exits with 128 + the signal (130 for Ctrl-C,
//!   [`LaunchOutcome::exit_code`]) whatever the nodes' own statuses. We
//!   forward rather than die because dying would let the kernel SIGKILL the
//!   nodes, which gives them no chance to shut down in order.
//!
//! Only the supervising loop signals and reaps the nodes, so a node's pid is
//! never signalled after it was reaped (and possibly reused), except by the
//! cleanup of its group (see `cleanup_groups` for why that is safe).
//!
//! ```no_run
//! use hyfi_net::launch::LocalLaunch;
//!
//! let launch = LocalLaunch::new(4, "/usr/bin/env".into());
//! let outcome = launch.run().expect("launcher failed");
//! std::process::exit(outcome.exit_code());
//! ```

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::unistd::Pid;

use crate::bootstrap::{random_token, random_u64, token_hex};
use crate::NetError;
use hyfi_core::progress::{self, Setting};
use status::Status;

pub mod limits;
pub mod output;
pub mod status;

/// `eprintln!` with the job's status line erased first.
macro_rules! say {
    ($status:expr, $($arg:tt)*) => {
        $status.print(|| eprintln!($($arg)*))
    };
}

/// How long nodes get between SIGTERM and SIGKILL, and how long a node
/// SIGKILLed may take to go before it is given up on.
pub const GRACE: Duration = Duration::from_secs(5);

/// Failures reported one by one; the rest are grouped by how they ended.
pub const REPORTS_SHOWN: usize = 8;

/// How often the supervising loop looks at the nodes.
const POLL: Duration = Duration::from_millis(20);

/// While starting nodes, look at those started every this many spawns: a
/// node that failed at once stops the start-up, at a cost linear in nodes.
const POLL_EVERY_SPAWNS: usize = 64;

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
    /// Node i's exit status at index i, for the nodes started: fewer than
    /// asked for if a signal or a failure stopped the start-up.
    pub statuses: Vec<ExitStatus>,
    /// The node that failed first in time, if any: the likely cause, since
    /// the others may have been stopped by the launcher because of it.
    pub first_failure: Option<usize>,
    /// The first forwarded signal the launcher received, if any.
    pub interrupted: Option<Signal>,
}

impl LaunchOutcome {
    /// Whether every node exited with status 0 and no signal stopped the job.
    pub fn success(&self) -> bool {
        self.interrupted.is_none() && self.statuses.iter().all(ExitStatus::success)
    }

    /// The exit code the launcher should end with: 128 + the signal if one
    /// stopped the job (130 for Ctrl-C, as a shell reports it, whatever the
    /// nodes made of it); else 0 if every node succeeded, else the code of
    /// the first node to fail, or 128 + signal if a signal killed it.
    pub fn exit_code(&self) -> i32 {
        if let Some(sig) = self.interrupted {
            return crate::signals::exit_code_for(sig);
        }
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
    /// Returns how each node ended; `Err` if the node count is more than
    /// this host may run ([`NetError::TooManyNodes`], before any node
    /// starts), if the nodes could not be started, or if the timeout
    /// expired. Call it on a thread that lives until it returns (it does not
    /// return earlier): `PR_SET_PDEATHSIG` fires when the *thread* that
    /// started a node ends. SIGINT, SIGTERM and SIGHUP are blocked on the
    /// calling thread while it runs and forwarded to the nodes; threads the
    /// program started before the call still take them, so call it early (as
    /// [`launch_self`] and `hyfi-run` do).
    pub fn run(&self) -> Result<LaunchOutcome, NetError> {
        if self.nodes == 0 {
            return Err(NetError::Launch(
                "cannot start 0 nodes; ask for at least 1".into(),
            ));
        }
        limits::Limits::read()?.check(self.nodes)?;
        let mut blocked = SigSet::empty();
        for s in FORWARDED.into_iter().filter(|&s| !ignored(s)) {
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
        let stderr = Arc::new(output::Stderr::default());
        let render = Setting::from_env().launcher_renders();
        let status = Arc::new(Status::new(render));
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let mut sup = Supervisor::new(self.nodes, self.timeout, Arc::clone(&status));
        let mut forwarders = 0;
        let mut spawn_error = None;
        for rank in 0..self.nodes {
            // A signal or a failed node ends the start-up here: the job
            // cannot run, and starting thousands more only delays the end.
            if let Ok(sig) = signals.try_recv() {
                say!(
                    status,
                    "hyfi launcher: got {sig} while starting node {rank} of {}; starting no more",
                    self.nodes
                );
                sup.on_signal(sig);
                break;
            }
            if rank % POLL_EVERY_SPAWNS == 0 && rank > 0 {
                sup.reap();
                if sup.first_failure.is_some() {
                    say!(
                        status,
                        "hyfi launcher: a node failed while node {rank} of {} was being \
                         started; starting no more",
                        self.nodes
                    );
                    break;
                }
            }
            let mut cmd = self.command(rank, port, job, &token, render);
            match cmd.spawn() {
                Ok(mut child) => {
                    if let Some(out) = child.stdout.take() {
                        forwarders +=
                            output::forward(rank, out, None, Arc::clone(&status), done_tx.clone());
                    }
                    if let Some(err) = child.stderr.take() {
                        let seen = Some(Arc::clone(&stderr));
                        forwarders +=
                            output::forward(rank, err, seen, Arc::clone(&status), done_tx.clone());
                    }
                    sup.nodes.push(Node::new(child));
                }
                Err(e) => {
                    // Without this node the job cannot run: stop the others
                    // (through the loop below, with its bounded waits).
                    spawn_error = Some(NetError::Launch(format!(
                        "could not start node {rank} of {} ({}): {e}; if the host is out of \
                         processes or memory, start fewer nodes",
                        self.nodes,
                        self.program.display()
                    )));
                    sup.stop(Signal::SIGTERM);
                    break;
                }
            }
        }
        drop(done_tx);

        sup.watch(signals);
        cleanup_groups(&sup.nodes);

        // Let the forwarders print what the nodes wrote last.
        let drain_until = Instant::now() + DRAIN;
        for _ in 0..forwarders {
            let left = drain_until.saturating_duration_since(Instant::now());
            if done_rx.recv_timeout(left).is_err() {
                break;
            }
        }
        status.clear();
        for line in stderr.summary() {
            eprintln!("{line}");
        }
        sup.report_the_rest();

        if let Some(e) = spawn_error {
            return Err(e);
        }
        if sup.timed_out {
            let still: Vec<usize> = (0..sup.nodes.len())
                .filter(|&i| sup.nodes[i].signalled.is_some())
                .collect();
            return Err(NetError::Launch(format!(
                "timed out after {:?}: node(s) {} were still running and were stopped; \
                 raise the timeout if the job needs longer",
                self.timeout.unwrap_or_default(),
                output::ranges(&still)
            )));
        }
        Ok(LaunchOutcome {
            statuses: sup
                .nodes
                .iter()
                .map(|n| n.status.unwrap_or(ExitStatus::from_raw(libc::SIGKILL)))
                .collect(),
            first_failure: sup.first_failure,
            interrupted: sup.interrupted,
        })
    }

    /// The command that starts node `rank`; `progress`: whether its
    /// progress lines are rendered (else it is told to write none).
    fn command(&self, rank: usize, port: u16, job: u64, token: &str, progress: bool) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // A group of its own, led by the node: signalling -pid reaches
            // whatever the node starts (see the module docs).
            .process_group(0);
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
            .env("HYFI_TOKEN", token)
            .env(progress::ENV, if progress { "lines" } else { "off" });
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
    fn new(child: Child) -> Node {
        Node {
            child,
            status: None,
            signalled: None,
        }
    }

    /// The node's process group: its pid, since it leads the group.
    fn group(&self) -> Pid {
        Pid::from_raw(-(self.child.id() as i32))
    }

    /// Sends `sig` to the node's whole group, unless it is reaped.
    fn signal(&mut self, sig: Signal) {
        if self.status.is_some() {
            return;
        }
        // The node is not reaped yet (only the supervising loop reaps), so
        // its pid, and the group it leads, are still ours; ESRCH cannot
        // happen and other errors leave nothing to do.
        let _ = nix::sys::signal::kill(self.group(), sig);
        if sig == Signal::SIGTERM {
            // A stopped node (SIGSTOP, a debugger let go) would keep the
            // SIGTERM pending until the SIGKILL: let it run to take it.
            let _ = nix::sys::signal::kill(self.group(), Signal::SIGCONT);
        }
        self.signalled = Some(sig);
    }
}

/// The supervising loop's state: the nodes, and how far stopping them got.
struct Supervisor {
    nodes: Vec<Node>,
    timeout: Option<Duration>,
    deadline: Option<Instant>,
    first_failure: Option<usize>,
    /// When the nodes were first told to stop (SIGTERM or a forwarded signal).
    stopping_since: Option<Instant>,
    /// When they were SIGKILLed.
    killed_at: Option<Instant>,
    timed_out: bool,
    interrupted: Option<Signal>,
    signals: usize,
    /// Failures after the first [`REPORTS_SHOWN`]: how they ended → ranks.
    unreported: BTreeMap<String, Vec<usize>>,
    reported: usize,
    /// The job's status line, erased before each line the launcher says.
    status: Arc<Status>,
}

impl Supervisor {
    fn new(capacity: usize, timeout: Option<Duration>, status: Arc<Status>) -> Supervisor {
        Supervisor {
            nodes: Vec::with_capacity(capacity),
            timeout,
            deadline: timeout.map(|t| Instant::now() + t),
            first_failure: None,
            stopping_since: None,
            killed_at: None,
            timed_out: false,
            interrupted: None,
            signals: 0,
            unreported: BTreeMap::new(),
            reported: 0,
            status,
        }
    }

    /// Reaps the nodes that ended, and reports the failures.
    fn reap(&mut self) {
        for rank in 0..self.nodes.len() {
            let n = &mut self.nodes[rank];
            if n.status.is_some() {
                continue;
            }
            let status = match n.child.try_wait() {
                Ok(Some(status)) => status,
                Ok(None) => continue,
                Err(e) => {
                    // Cannot happen for a child we own; if it does, the
                    // node is beyond our reach: kill it and move on.
                    say!(
                        self.status,
                        "hyfi launcher: cannot wait for node {rank}: {e}; killing it"
                    );
                    n.signal(Signal::SIGKILL);
                    let _ = n.child.kill();
                    ExitStatus::from_raw(libc::SIGKILL)
                }
            };
            n.status = Some(status);
            if !status.success() {
                let signalled = n.signalled;
                self.first_failure.get_or_insert(rank);
                self.report(rank, status, signalled);
            }
        }
    }

    /// Sends `sig` to every node still running, and starts the grace.
    fn stop(&mut self, sig: Signal) {
        for n in &mut self.nodes {
            n.signal(sig);
        }
        let now = Instant::now();
        self.stopping_since.get_or_insert(now);
        if sig == Signal::SIGKILL {
            self.killed_at.get_or_insert(now);
        }
    }

    /// A forwarded signal: the first is passed on, a second means SIGKILL.
    fn on_signal(&mut self, sig: Signal) {
        self.signals += 1;
        self.interrupted.get_or_insert(sig);
        let sig = if self.signals > 1 {
            Signal::SIGKILL
        } else {
            sig
        };
        say!(
            self.status,
            "hyfi launcher: got a signal; sending {sig} to the nodes"
        );
        self.stop(sig);
    }

    /// Watches the nodes until every one is reaped or given up on.
    fn watch(&mut self, signals: &mpsc::Receiver<Signal>) {
        loop {
            self.reap();
            if self.nodes.iter().all(|n| n.status.is_some()) {
                return;
            }
            let now = Instant::now();
            if self.first_failure.is_some() && self.stopping_since.is_none() {
                say!(
                    self.status,
                    "hyfi launcher: a node failed; stopping the others"
                );
                self.stop(Signal::SIGTERM);
            }
            if self.deadline.is_some_and(|d| now >= d) && !self.timed_out {
                self.timed_out = true;
                say!(
                    self.status,
                    "hyfi launcher: timeout of {:?} reached; stopping the nodes still running",
                    self.timeout.unwrap_or_default()
                );
                self.stop(Signal::SIGTERM);
            }
            if self
                .stopping_since
                .is_some_and(|t| now.duration_since(t) >= GRACE)
                && self.killed_at.is_none()
            {
                self.stop(Signal::SIGKILL);
            }
            if self
                .killed_at
                .is_some_and(|t| now.duration_since(t) >= GRACE)
            {
                // SIGKILLed and still there (stuck in the kernel): waiting
                // longer would not help; PR_SET_PDEATHSIG ends it with us.
                let stuck: Vec<usize> = (0..self.nodes.len())
                    .filter(|&i| self.nodes[i].status.is_none())
                    .collect();
                say!(
                    self.status,
                    "hyfi launcher: node(s) {} still there {GRACE:?} after SIGKILL; giving up \
                     on them",
                    output::ranges(&stuck)
                );
                return;
            }
            self.status.tick();
            // Waiting on the signal channel doubles as the poll sleep, so a
            // signal is forwarded at once.
            match signals.recv_timeout(POLL) {
                Ok(sig) => self.on_signal(sig),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => thread::sleep(POLL),
            }
        }
    }

    /// Reports a failed node: at once for the first few, later grouped.
    fn report(&mut self, rank: usize, status: ExitStatus, signalled: Option<Signal>) {
        let by_us = if signalled.is_some() {
            " (stopped by the launcher)"
        } else {
            ""
        };
        let how = format!("{}{by_us}", describe(status));
        if self.reported < REPORTS_SHOWN {
            self.reported += 1;
            say!(self.status, "hyfi launcher: node {rank} {how}");
        } else {
            self.unreported.entry(how).or_default().push(rank);
        }
    }

    /// The failures not reported one by one, a line per way of ending.
    fn report_the_rest(&self) {
        for (how, ranks) in &self.unreported {
            eprintln!(
                "hyfi launcher: {} more node(s) (ranks {}): each {how}",
                ranks.len(),
                output::ranges(ranks)
            );
        }
    }
}

/// Stops what is left in the nodes' process groups once every node is
/// reaped: SIGTERM, then SIGKILL after [`GRACE`], then no more waiting.
///
/// Signalling a group after its leader was reaped is safe on Linux: the
/// kernel does not hand out a pid again while a process group of that id
/// has members, so `-pid` is still the node's group, or no group (ESRCH).
fn cleanup_groups(nodes: &[Node]) {
    let alive = |n: &&Node| nix::sys::signal::kill(n.group(), None) != Err(Errno::ESRCH);
    let left: Vec<&Node> = nodes.iter().filter(alive).collect();
    if left.is_empty() {
        return;
    }
    for sig in [Signal::SIGTERM, Signal::SIGKILL] {
        for n in &left {
            let _ = nix::sys::signal::kill(n.group(), sig);
            if sig == Signal::SIGTERM {
                let _ = nix::sys::signal::kill(n.group(), Signal::SIGCONT);
            }
        }
        let until = Instant::now() + GRACE;
        // Orphans are reaped by init (or a subreaper), not by us; a zombie
        // still counts as a member until then.
        while left.iter().any(alive) && Instant::now() < until {
            thread::sleep(POLL);
        }
        if !left.iter().any(alive) {
            return;
        }
    }
}

/// Whether `sig` is ignored in this process (`nohup` ignores SIGHUP; a
/// shell without job control ignores SIGINT for a job in the background).
/// Such a signal is not forwarded: the nodes inherit the same intent (an
/// ignored disposition survives exec), and a blocked signal would be taken
/// by `sigtimedwait` even though ignored.
fn ignored(sig: Signal) -> bool {
    let mut old = std::mem::MaybeUninit::<libc::sigaction>::zeroed();
    // SAFETY: with a null new action sigaction only writes the current one
    // into `old`, a zeroed (valid) sigaction that lives across the call.
    let rc = unsafe { libc::sigaction(sig as libc::c_int, std::ptr::null(), old.as_mut_ptr()) };
    // SAFETY: zeroed and then, on success, filled in by the kernel.
    rc == 0 && unsafe { old.assume_init() }.sa_sigaction == libc::SIG_IGN
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
            interrupted: None,
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
        // A signal to the launcher wins over whatever the nodes made of it.
        let mut o = outcome(&[0, 0], None);
        o.interrupted = Some(Signal::SIGINT);
        assert_eq!(o.exit_code(), 130);
        assert!(!o.success());
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
