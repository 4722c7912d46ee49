//! One node process of a local launch: how it is started (its
//! environment, a process group of its own, death with the launcher),
//! signalled (always as a whole group, so what it started goes with it),
//! and what is left of its group cleaned up once it is reaped.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::Instant;

use hyfi_core::progress;
use nix::errno::Errno;
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use super::{LocalLaunch, GRACE, POLL};

impl LocalLaunch {
    /// The command that starts node `rank`; `coord`: node 0's port, and
    /// for node 0 the launcher's listener on it, which it inherits;
    /// `progress`: whether its progress lines are rendered (else it is
    /// told to write none).
    pub(super) fn command(
        &self,
        rank: usize,
        (port, coord): (u16, Option<std::os::fd::RawFd>),
        job: u64,
        token: &str,
        progress: bool,
        report: Option<std::os::fd::RawFd>,
    ) -> Command {
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
        match report {
            Some(fd) => cmd.env(crate::cause::REPORT_FD_ENV, fd.to_string()),
            None => cmd.env_remove(crate::cause::REPORT_FD_ENV),
        };
        match coord {
            Some(fd) => cmd.env(crate::tcp::mesh::COORD_FD_ENV, fd.to_string()),
            None => cmd.env_remove(crate::tcp::mesh::COORD_FD_ENV),
        };
        let parent = std::process::id();
        // SAFETY: the closure runs in the child between fork and exec, where
        // only async-signal-safe calls are allowed: prctl, getppid, fcntl and
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
                // The node's end of its cause pipe stays open across exec
                // (every other descriptor of ours is closed on exec).
                if let Some(fd) = report {
                    if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                // So does node 0's listener, which the launcher bound.
                if let Some(fd) = coord {
                    if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                        return Err(std::io::Error::last_os_error());
                    }
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
pub(super) struct Node {
    pub(super) child: Child,
    pub(super) status: Option<ExitStatus>,
    /// The last signal the launcher sent it, to tell "failed" from "stopped".
    pub(super) signalled: Option<Signal>,
}

impl Node {
    pub(super) fn new(child: Child) -> Node {
        Node {
            child,
            status: None,
            signalled: None,
        }
    }

    /// The node's process group: its pid, since it leads the group.
    pub(super) fn group(&self) -> Pid {
        Pid::from_raw(-(self.child.id() as i32))
    }

    /// Sends `sig` to the node's whole group, unless it is reaped.
    pub(super) fn signal(&mut self, sig: Signal) {
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

/// Stops what is left in the nodes' process groups once every node is
/// reaped: SIGTERM, then SIGKILL after [`GRACE`], then no more waiting.
///
/// Signalling a group after its leader was reaped is safe on Linux: the
/// kernel does not hand out a pid again while a process group of that id
/// has members, so `-pid` is still the node's group, or no group (ESRCH).
pub(super) fn cleanup_groups(nodes: &[Node]) {
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
