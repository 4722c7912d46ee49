//! The launcher's verdict: which node failed first, and why.
//!
//! Each node writes its causes to a pipe of its own ([`crate::cause`]): its
//! own failure, or the first it heard of another's (`lost node 1`, an
//! `Abort` naming node 1's cause), with the time on the host's monotonic
//! clock. The earliest cause that names a node is the job's: that node
//! *failed first*. How it is described, and the exit code:
//!
//! - the node said its own cause (an error, a panic, a stack overflow, a
//!   signal someone else sent it): that, and its kind's code;
//! - it said nothing and ended by itself (SIGKILL, a crash, an exit while
//!   the others needed it): how it ended, and 128 + the signal or its
//!   status (1 for an exit with status 0);
//! - it is still there (stopped, hung) or the launcher stopped it: what the
//!   others saw ("it stopped answering …"), and that kind's code.
//!
//! A node that wrote nothing and whose peers wrote nothing either (a
//! program that is not a hyfi program, under `hyfi-run`) is judged by the
//! order the launcher reaped the failures in.

use std::io::{BufRead, BufReader};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::{mpsc, Arc, Mutex};
use std::thread;

use crate::cause::{CauseKind, Record};

use super::outcome::{describe, status_code};

/// Stack of a reading thread: a line buffer on the heap and little else.
const READER_STACK: usize = 64 * 1024;

/// Records kept per node: a node says its cause once or twice; more is a
/// node gone wrong, and the first ones are what counts.
const MAX_RECORDS: usize = 16;

/// What every node has said, shared with the pipes' readers.
#[derive(Default)]
pub(super) struct Causes {
    by_node: Mutex<Vec<Vec<Record>>>,
    /// The trace the nodes wrote their parts of, if they did.
    trace: Mutex<Option<std::path::PathBuf>>,
}

impl Causes {
    /// The trace the nodes said they wrote parts of.
    pub(super) fn trace(&self) -> Option<std::path::PathBuf> {
        self.trace.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn add(&self, rank: usize, r: Record) {
        let mut all = self.by_node.lock().unwrap_or_else(|e| e.into_inner());
        if all.len() <= rank {
            all.resize_with(rank + 1, Vec::new);
        }
        if all[rank].len() < MAX_RECORDS {
            all[rank].push(r);
        }
    }

    pub(super) fn snapshot(&self) -> Vec<Vec<Record>> {
        self.by_node
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// A pipe for node `rank`'s causes: the end the node writes (to pass to
/// it; closed on exec elsewhere) and a thread reading the other end into
/// `causes`, which sends on `done` at end of file.
pub(super) fn pipe(
    rank: usize,
    causes: &Arc<Causes>,
    done: mpsc::Sender<()>,
) -> std::io::Result<(OwnedFd, usize)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded: both are open and ours alone.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let causes = Arc::clone(causes);
    let spawned = thread::Builder::new()
        .name(format!("hyfi-launch-cause{rank}"))
        .stack_size(READER_STACK)
        .spawn(move || {
            let reader = BufReader::new(std::fs::File::from(read));
            for line in reader.split(b'\n') {
                let Ok(line) = line else { break };
                let text = std::str::from_utf8(&line).ok();
                if let Some(path) = text.and_then(|t| t.strip_prefix(crate::cause::TRACE_RECORD)) {
                    *causes.trace.lock().unwrap_or_else(|e| e.into_inner()) = Some(path.into());
                } else if let Some(r) = text.and_then(Record::decode) {
                    causes.add(rank, r);
                }
            }
            let _ = done.send(());
        });
    Ok((write, usize::from(spawned.is_ok())))
}

/// How one node ended, as the supervising loop saw it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Ending {
    /// Its status; `None` if it was given up on.
    pub status: Option<ExitStatus>,
    /// Whether the launcher signalled it before it was reaped.
    pub signalled: bool,
}

/// The job's first cause, as the launcher reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Verdict {
    /// The node that failed first.
    pub node: usize,
    /// Why: the rest of "node N failed first: …".
    pub why: String,
    /// The launcher's exit code.
    pub code: i32,
}

/// The first cause of a job whose nodes ended as `endings` and said
/// `records`; `first_reaped`: the first failure the loop reaped, for jobs
/// whose nodes say nothing. `None` if no node failed.
pub(super) fn verdict(
    endings: &[Ending],
    records: &[Vec<Record>],
    first_reaped: Option<usize>,
) -> Option<Verdict> {
    let named = records
        .iter()
        .flatten()
        .filter_map(|r| Some((r.t_ns, r.origin?, r)))
        .filter(|(_, o, _)| *o < endings.len())
        .min_by_key(|(t, _, _)| *t);
    let Some((_, node, heard)) = named else {
        let node = first_reaped?;
        let status = endings[node].status?;
        return Some(Verdict {
            node,
            why: describe(status),
            code: failure_code(status),
        });
    };
    let own = records
        .get(node)
        .into_iter()
        .flatten()
        .filter(|r| r.origin == Some(node))
        .min_by_key(|r| r.t_ns);
    let ending = endings[node];
    let ended_by_itself = ending.status.filter(|_| !ending.signalled);
    let kind = |r: &Record| r.kind.unwrap_or(CauseKind::Program);
    Some(match (own, ended_by_itself) {
        // It said why; a fatal fault's code is the signal it died of.
        (Some(r), Some(status)) if kind(r) == CauseKind::Fatal => Verdict {
            node,
            why: r.text.clone(),
            code: failure_code(status),
        },
        (Some(r), _) => Verdict {
            node,
            why: r.text.clone(),
            code: kind(r).exit_code(),
        },
        (None, Some(status)) => Verdict {
            node,
            why: if status.success() {
                "exited with status 0 while the other nodes still needed it (its program ended \
                 without ending its runtime with theirs)"
                    .to_string()
            } else {
                describe(status)
            },
            code: failure_code(status),
        },
        (None, None) => Verdict {
            node,
            why: heard.text.clone(),
            code: kind(heard).exit_code(),
        },
    })
}

/// The code for a node that ended with `status` on its own: its status,
/// 128 + the signal that killed it, 1 if it exited with 0 when it should
/// not have.
fn failure_code(status: ExitStatus) -> i32 {
    match status_code(status) {
        0 => 1,
        c => c,
    }
}

/// "exited with status 1" for a node reaped after the first failure.
pub(super) fn after(ending: &Ending) -> Option<String> {
    let status = ending.status?;
    if status.success() {
        return None;
    }
    Some(if ending.signalled {
        match status.signal() {
            Some(_) => format!("{} (stopped by the launcher)", describe(status)),
            None => format!("{} (after the launcher stopped it)", describe(status)),
        }
    } else {
        describe(status)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exited(code: i32) -> Ending {
        Ending {
            status: Some(ExitStatus::from_raw(code << 8)),
            signalled: false,
        }
    }
    fn killed(sig: i32, by_us: bool) -> Ending {
        Ending {
            status: Some(ExitStatus::from_raw(sig)),
            signalled: by_us,
        }
    }
    fn rec(t: u64, origin: usize, kind: CauseKind, text: &str) -> Record {
        Record {
            t_ns: t,
            origin: Some(origin),
            kind: Some(kind),
            text: text.into(),
        }
    }

    #[test]
    fn a_node_killed_without_a_word_is_named_by_its_peers() {
        // Node 0 heard node 1 go; node 1 was killed by SIGKILL.
        let records = vec![vec![rec(5, 1, CauseKind::Lost, "lost (closed)")], vec![]];
        let v = verdict(&[exited(1), killed(9, false)], &records, Some(0)).unwrap();
        assert_eq!(v.node, 1);
        assert_eq!(v.why, "was killed by signal 9 (SIGKILL)");
        assert_eq!(v.code, 137);
    }

    #[test]
    fn the_earliest_cause_wins_whatever_the_reaping_order() {
        let records = vec![
            vec![rec(9, 1, CauseKind::Fatal, "stack overflow")],
            vec![rec(
                3,
                1,
                CauseKind::Fatal,
                "filthread stack overflow on processor 0",
            )],
        ];
        let v = verdict(&[exited(1), killed(6, false)], &records, Some(0)).unwrap();
        assert_eq!(
            (v.node, v.why.as_str(), v.code),
            (1, "filthread stack overflow on processor 0", 134)
        );
    }

    #[test]
    fn a_stopped_node_is_named_with_what_its_peers_saw() {
        let records = vec![
            vec![rec(5, 1, CauseKind::Hung, "it stopped answering")],
            vec![],
        ];
        let v = verdict(&[exited(3), killed(15, true)], &records, Some(0)).unwrap();
        assert_eq!(
            (v.node, v.why.as_str(), v.code),
            (1, "it stopped answering", 3)
        );
    }

    #[test]
    fn a_node_that_took_a_signal_itself_is_the_cause() {
        let stopped = Record {
            t_ns: 8,
            origin: None,
            kind: None,
            text: "stopped".into(),
        };
        let records = vec![
            vec![stopped, rec(9, 1, CauseKind::Signal(2), "x")],
            vec![rec(
                4,
                1,
                CauseKind::Signal(2),
                "received SIGINT from process 7",
            )],
        ];
        let v = verdict(&[killed(15, true), exited(130)], &records, Some(1)).unwrap();
        assert_eq!(v.node, 1);
        assert_eq!(v.code, 130);
        assert!(v.why.starts_with("received SIGINT"));
    }

    #[test]
    fn nodes_that_say_nothing_are_judged_by_the_reaping_order() {
        let v = verdict(&[exited(0), exited(3)], &[], Some(1)).unwrap();
        assert_eq!((v.node, v.code), (1, 3));
        assert_eq!(verdict(&[exited(0), exited(0)], &[], None), None);
    }

    #[test]
    fn a_node_that_exits_0_while_needed_is_a_failure() {
        let records = vec![vec![rec(5, 1, CauseKind::Lost, "lost")], vec![]];
        let v = verdict(&[exited(1), exited(0)], &records, Some(0)).unwrap();
        assert_eq!((v.node, v.code), (1, 1));
        assert!(v.why.starts_with("exited with status 0 while"));
    }
}
