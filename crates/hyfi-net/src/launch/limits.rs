//! How many local nodes the launcher may start: a fixed bound, and what the
//! machine has room for.
//!
//! Each node costs at least [`TASKS_PER_NODE`] kernel tasks (its process and
//! the launcher's two threads that copy its stdout and stderr), more once
//! its own threads start. A count the host cannot hold would otherwise fail
//! half-way with `EAGAIN` from `fork`, after thousands of processes were
//! started and had to be stopped again, or exhaust the user's processes for
//! everything else they run. So `check` refuses, before any node starts:
//!
//! - more than [`MAX_LOCAL_NODES`] nodes (`HYFI_MAX_LOCAL_NODES` changes the
//!   bound, for a host that can hold more);
//! - more tasks than are left under `RLIMIT_NPROC` for this user (the soft
//!   limit, minus the tasks this user already runs, counted in `/proc`; not
//!   for root, whom the kernel does not hold to it);
//! - more than are left system-wide (`kernel.pid_max` and
//!   `kernel.threads-max`, minus the tasks running, from `/proc/loadavg`),
//!   or in this process's `pids` cgroup (`pids.max` minus `pids.current`).

use crate::NetError;

/// The most local nodes started unless `HYFI_MAX_LOCAL_NODES` says
/// otherwise: far more than a host has CPUs for, far fewer than would
/// exhaust a default process limit.
pub const MAX_LOCAL_NODES: usize = 4096;

/// Kernel tasks a node costs at the least (see the module docs).
pub const TASKS_PER_NODE: usize = 3;

/// What bounds the node count, as found on this host.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Limits {
    /// The fixed bound ([`MAX_LOCAL_NODES`] or `HYFI_MAX_LOCAL_NODES`).
    pub max_nodes: usize,
    /// Tasks that may still be started, and what sets that number.
    pub room: Vec<(usize, String)>,
}

impl Limits {
    /// This host's limits, read now.
    pub(crate) fn read() -> Result<Limits, NetError> {
        let max_nodes = match std::env::var("HYFI_MAX_LOCAL_NODES") {
            Err(_) => MAX_LOCAL_NODES,
            Ok(v) => {
                v.trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| n >= 1)
                    .ok_or(NetError::BadEnv {
                        var: "HYFI_MAX_LOCAL_NODES",
                        value: v,
                        expected: "a whole number >= 1 (the most local nodes a launcher may start)",
                    })?
            }
        };
        let mut room = Vec::new();
        if let Some(r) = user_room() {
            room.push(r);
        }
        if let Some(r) = system_room() {
            room.push(r);
        }
        if let Some(r) = cgroup_room() {
            room.push(r);
        }
        Ok(Limits { max_nodes, room })
    }

    /// `Ok` if `nodes` local nodes fit, else the error naming the bound.
    pub(crate) fn check(&self, nodes: usize) -> Result<(), NetError> {
        if nodes > self.max_nodes {
            return Err(NetError::TooManyNodes {
                nodes,
                max: self.max_nodes,
                why: format!(
                    "the launcher starts at most {} local processes (set \
                     HYFI_MAX_LOCAL_NODES to change that bound if this host can hold more)",
                    self.max_nodes
                ),
            });
        }
        let tight = self.room.iter().min_by_key(|(left, _)| *left);
        if let Some((left, what)) = tight {
            let fit = left / TASKS_PER_NODE;
            if nodes > fit {
                return Err(NetError::TooManyNodes {
                    nodes,
                    max: fit,
                    why: format!(
                        "each node needs at least {TASKS_PER_NODE} tasks (its process and the \
                         launcher's two output threads) and {what} leaves room for {left} more"
                    ),
                });
            }
        }
        Ok(())
    }
}

/// Room under `RLIMIT_NPROC`, which counts the tasks (threads) of every
/// process whose real uid is ours. `None` when unlimited or for root.
fn user_room() -> Option<(usize, String)> {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    if uid == 0 {
        return None;
    }
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into `lim`, which lives across
    // the call; it touches nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NPROC, &mut lim) } != 0 {
        return None;
    }
    let soft = lim.rlim_cur;
    if soft == libc::RLIM_INFINITY {
        return None;
    }
    let limit = usize::try_from(soft).unwrap_or(usize::MAX);
    let used = user_tasks(uid)?;
    Some((
        limit.saturating_sub(used),
        format!("RLIMIT_NPROC (ulimit -u) of {limit}, with {used} tasks of this user running,"),
    ))
}

/// The tasks of processes whose real uid is `uid`, from `/proc/*/status`.
/// A process that ends while we read is simply not counted.
fn user_tasks(uid: u32) -> Option<usize> {
    let mut total = 0;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let field = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<usize>().ok())
        };
        if field("Uid:") == Some(uid as usize) {
            total += field("Threads:").unwrap_or(1);
        }
    }
    Some(total)
}

/// Room under `kernel.pid_max` and `kernel.threads-max`, with the tasks
/// running now (the denominator of the 4th field of `/proc/loadavg`).
fn system_room() -> Option<(usize, String)> {
    let read = |p: &str| -> Option<usize> { std::fs::read_to_string(p).ok()?.trim().parse().ok() };
    let pid_max = read("/proc/sys/kernel/pid_max")?;
    let threads_max = read("/proc/sys/kernel/threads-max").unwrap_or(usize::MAX);
    let loadavg = std::fs::read_to_string("/proc/loadavg").ok()?;
    let running: usize = loadavg
        .split_whitespace()
        .nth(3)?
        .split_once('/')?
        .1
        .parse()
        .ok()?;
    let (limit, name) = if threads_max < pid_max {
        (threads_max, "kernel.threads-max")
    } else {
        (pid_max, "kernel.pid_max")
    };
    Some((
        limit.saturating_sub(running),
        format!("{name} of {limit}, with {running} tasks running on this host,"),
    ))
}

/// Room in this process's `pids` cgroup (v2, or v1's `pids` controller).
fn cgroup_room() -> Option<(usize, String)> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let dir = cgroups.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        match controllers {
            "" => Some(format!("/sys/fs/cgroup{path}")),
            c if c.split(',').any(|c| c == "pids") => Some(format!("/sys/fs/cgroup/pids{path}")),
            _ => None,
        }
    })?;
    let max = std::fs::read_to_string(format!("{dir}/pids.max")).ok()?;
    let max: usize = max.trim().parse().ok()?; // "max": no limit
    let current: usize = std::fs::read_to_string(format!("{dir}/pids.current"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some((
        max.saturating_sub(current),
        format!("the pids cgroup's pids.max of {max}, with {current} in use,"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(l: &Limits, nodes: usize) -> String {
        match l.check(nodes) {
            Err(e) => e.to_string(),
            Ok(()) => panic!("{nodes} nodes should be refused by {l:?}"),
        }
    }

    #[test]
    fn the_fixed_bound_is_named() {
        let l = Limits {
            max_nodes: 4096,
            room: vec![],
        };
        assert!(l.check(4096).is_ok());
        let e = refusal(&l, 100_000);
        assert!(e.contains("100000 nodes"), "{e}");
        assert!(e.contains("at most 4096"), "{e}");
        assert!(e.contains("HYFI_MAX_LOCAL_NODES"), "{e}");
        assert!(e.contains("mpirun or srun"), "{e}");
    }

    #[test]
    fn the_tightest_machine_limit_wins() {
        let l = Limits {
            max_nodes: 4096,
            room: vec![
                (30_000, "kernel.pid_max of 32768".into()),
                (300, "RLIMIT_NPROC (ulimit -u) of 400".into()),
            ],
        };
        assert!(l.check(100).is_ok());
        let e = refusal(&l, 101);
        assert!(e.contains("RLIMIT_NPROC"), "{e}");
        assert!(e.contains("at most 100"), "{e}");
    }

    #[test]
    fn this_host_is_read() {
        // Whatever the host, a 2-node job fits and reading does not fail.
        let l = Limits::read().expect("reading this host's limits");
        assert!(l.check(2).is_ok(), "{l:?}");
        assert!(l.room.iter().any(|(_, w)| w.contains("kernel.")), "{l:?}");
    }
}
