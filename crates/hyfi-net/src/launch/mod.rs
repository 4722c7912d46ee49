//! Launching nodes as local processes: the embedded default and `hyfi-run`.
//!
//! A program run with `HYFI_NODES=n` and no launcher around
//! ([`Detected::LaunchLocal`](crate::bootstrap::Detected::LaunchLocal)) calls
//! [`launch_self`], which starts n copies of itself as the nodes; `hyfi-run`
//! does the same for any program. Either way a [`LocalLaunch`] does the work:
//!
//! - **Environment.** Node i gets `HYFI_RANK=i`, `HYFI_NODES=n`,
//!   `HYFI_COORD=127.0.0.1:<port>`, a random `HYFI_JOB` and `HYFI_TOKEN`,
//!   and `HYFI_PROCS` if asked for. The launcher listens at that port
//!   itself and node 0 inherits the listener open (`HYFI_COORD_FD`), so
//!   no other process can take the port in between. Variables of
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
//!   are given [`STOP_DELAY`] to end by themselves (a hyfi node does, within
//!   [`FAILURE_GRACE`](crate::FAILURE_GRACE), printing the first cause),
//!   then get SIGTERM, then SIGKILL after [`GRACE`]. Every node is reaped;
//!   then the launcher says which node failed first and why (its first
//!   line, from the causes the nodes wrote on their pipes: see `causes` and
//!   [`crate::cause`]) and how the others ended because of it (the first
//!   [`REPORTS_SHOWN`] one by one, the rest grouped). A node still running at the optional deadline
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
//! One module per part: `node` (starting one node process, signalling its
//! group, cleaning up what is left of it), `supervise` (the supervising
//! loop), `forward` (the launcher's signals, forwarded), `outcome` (how
//! the nodes ended, the exit code), [`limits`], [`output`], [`status`];
//! this one holds [`LocalLaunch`], which starts the nodes and ties the
//! parts together, and [`launch_self`].
//!
//! ```no_run
//! use hyfi_net::launch::LocalLaunch;
//!
//! let launch = LocalLaunch::new(4, "/usr/bin/env".into());
//! let outcome = launch.run().expect("launcher failed");
//! std::process::exit(outcome.exit_code());
//! ```

use std::ffi::OsString;
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{SigSet, SigmaskHow, Signal};

use crate::bootstrap::{random_token, random_u64, token_hex};
use crate::NetError;
use hyfi_core::progress::Setting;

use forward::{ignored, signal_loop, FORWARDED};
use node::{cleanup_groups, Node};
use status::Status;
use supervise::Supervisor;

/// `eprintln!` with the job's status line erased first.
macro_rules! say {
    ($status:expr, $($arg:tt)*) => {
        $status.print(|| eprintln!($($arg)*))
    };
}

// After `say!`, which the submodules use.
pub mod limits;
pub mod output;
pub mod status;

mod causes;
mod forward;
mod node;
mod outcome;
mod supervise;
#[cfg(test)]
mod tests;

pub use outcome::LaunchOutcome;

/// How long nodes get between SIGTERM and SIGKILL, and how long a node
/// SIGKILLed may take to go before it is given up on.
pub const GRACE: Duration = Duration::from_secs(5);

/// Failures reported one by one; the rest are grouped by how they ended.
pub const REPORTS_SHOWN: usize = 8;

/// How long after a node failed the launcher lets the others end by
/// themselves before it stops them: a hyfi node ends within
/// [`FAILURE_GRACE`](crate::FAILURE_GRACE) of learning of a failure,
/// printing the first cause; stopped sooner, it could only say it was
/// stopped.
pub const STOP_DELAY: Duration = Duration::from_secs(3);

/// How often the supervising loop looks at the nodes.
const POLL: Duration = Duration::from_millis(20);

/// While starting nodes, look at those started every this many spawns: a
/// node that failed at once stops the start-up, at a cost linear in nodes.
const POLL_EVERY_SPAWNS: usize = 64;

/// How long to wait, once every node is reaped, for the last of its output:
/// a grandchild that inherited a node's pipe could hold it open forever.
const DRAIN: Duration = Duration::from_secs(2);

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
            return Err(NetError::BadEnv {
                var: "the node count (HYFI_NODES, --nodes or hyfi-run -n)",
                value: "0".into(),
                expected: "at least 1 node",
            });
        }
        // Every setting the nodes will read, before any starts.
        crate::check_env()?;
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
        // Node 0's listener, bound here and handed to node 0 open: a port
        // only found free here could be taken by another process (a
        // connection's ephemeral port) before node 0 bound it, which failed
        // the job with "Address already in use" on a busy machine.
        let coord = std::net::TcpListener::bind("127.0.0.1:0")
            .map_err(|e| NetError::io("listening on 127.0.0.1 for node 0", e))?;
        let port = coord
            .local_addr()
            .map_err(|e| NetError::io("listening on 127.0.0.1 for node 0", e))?
            .port();
        let mut coord = Some(coord);
        let job = random_u64();
        let token = token_hex(&random_token());
        let stderr = Arc::new(output::Stderr::default());
        let render = Setting::from_env().launcher_renders();
        let status = Arc::new(Status::new(render));
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let causes = Arc::new(causes::Causes::default());
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
            let report = match causes::pipe(rank, &causes, done_tx.clone()) {
                Ok((fd, readers)) => {
                    forwarders += readers;
                    Some(fd)
                }
                // The job runs without it; the verdict then rests on how
                // the nodes ended.
                Err(_) => None,
            };
            let report_fd = report.as_ref().map(|fd| fd.as_raw_fd());
            // Node 0 inherits the listener.
            let listener = if rank == 0 { coord.take() } else { None };
            let coord_fd = listener.as_ref().map(|l| l.as_raw_fd());
            let mut cmd = self.command(rank, (port, coord_fd), job, &token, render, report_fd);
            let spawned = cmd.spawn();
            // The node has its copies; ours must go, or the reader never
            // sees the end of the pipe.
            drop(cmd);
            drop(report);
            drop(listener);
            match spawned {
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
                    spawn_error = Some(spawn_failed(rank, self.nodes, &self.program, e));
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
        // A signal or the timeout stopped the job: the launcher said so
        // when it happened, and the nodes' failures follow from it.
        let verdict = if sup.interrupted.is_some() || sup.timed_out {
            None
        } else {
            causes::verdict(&sup.endings(), &causes.snapshot(), sup.first_failure)
        };
        sup.report(verdict.as_ref());
        if let Some(path) = causes.trace() {
            // The nodes wrote their parts of a trace: one file for the job.
            match hyfi_core::trace::merge(&path, Some(self.nodes)) {
                Ok(merged) => eprint!("{merged}"),
                Err(e) => eprintln!(
                    "hyfi launcher: could not merge the nodes' traces into {}: {e}; \
                     their files {}.node<i> are left as they are",
                    path.display(),
                    path.display()
                ),
            }
        }

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
            first_failure: verdict.as_ref().map(|v| v.node).or(sup.first_failure),
            first_cause: verdict.map(|v| (v.why, v.code)),
            interrupted: sup.interrupted,
        })
    }
}

/// The error for node `rank`'s process not starting: a program that is not
/// there or cannot be run says so; only a host out of processes or memory
/// is told to start fewer nodes.
fn spawn_failed(
    rank: usize,
    nodes: usize,
    program: &std::path::Path,
    e: std::io::Error,
) -> NetError {
    let hint = match e.raw_os_error() {
        Some(libc::ENOENT) => "; no such program: check its path",
        Some(libc::EACCES) | Some(libc::ENOEXEC) => {
            "; it cannot be run: check that it is an executable this host can run"
        }
        Some(libc::EAGAIN) | Some(libc::ENOMEM) => {
            "; the host is out of processes or memory: start fewer nodes"
        }
        _ => "",
    };
    let what = format!(
        "could not start node {rank} of {nodes} ({}): {e}{hint}",
        program.display()
    );
    match e.raw_os_error() {
        Some(libc::ENOENT) => NetError::NoProgram { what, code: 127 },
        Some(libc::EACCES) | Some(libc::ENOEXEC) => NetError::NoProgram { what, code: 126 },
        _ => NetError::Launch(what),
    }
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
            std::process::exit(e.launcher_exit_code());
        }
    }
}
