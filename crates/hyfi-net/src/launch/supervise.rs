//! The supervising loop of a local launch: the only code that reaps and
//! signals the nodes (so a pid is never signalled after it was reaped),
//! stopping them all when one fails, a signal comes or the deadline passes,
//! with a bounded grace before SIGKILL, and reporting how they failed.

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::causes::{self, Ending, Verdict};
use super::node::Node;
use super::status::Status;
use super::{output, GRACE, POLL, REPORTS_SHOWN, STOP_DELAY};

/// The supervising loop's state: the nodes, and how far stopping them got.
pub(super) struct Supervisor {
    pub(super) nodes: Vec<Node>,
    timeout: Option<Duration>,
    deadline: Option<Instant>,
    /// The first node reaped with a failure, and when.
    pub(super) first_failure: Option<usize>,
    failed_at: Option<Instant>,
    /// When the nodes were first told to stop (SIGTERM or a forwarded signal).
    stopping_since: Option<Instant>,
    /// When they were SIGKILLed.
    killed_at: Option<Instant>,
    pub(super) timed_out: bool,
    pub(super) interrupted: Option<Signal>,
    signals: usize,
    /// The job's status line, erased before each line the launcher says.
    status: Arc<Status>,
}

impl Supervisor {
    pub(super) fn new(
        capacity: usize,
        timeout: Option<Duration>,
        status: Arc<Status>,
    ) -> Supervisor {
        Supervisor {
            nodes: Vec::with_capacity(capacity),
            timeout,
            deadline: timeout.map(|t| Instant::now() + t),
            first_failure: None,
            failed_at: None,
            stopping_since: None,
            killed_at: None,
            timed_out: false,
            interrupted: None,
            signals: 0,
            status,
        }
    }

    /// Reaps the nodes that ended, and reports the failures.
    pub(super) fn reap(&mut self) {
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
                // Reported at the end, once every node said its cause: the
                // first reaped is not always the first to fail.
                if self.first_failure.is_none() {
                    self.first_failure = Some(rank);
                    self.failed_at = Some(Instant::now());
                }
            }
        }
    }

    /// Sends `sig` to every node still running, and starts the grace.
    pub(super) fn stop(&mut self, sig: Signal) {
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
    pub(super) fn on_signal(&mut self, sig: Signal) {
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
    pub(super) fn watch(&mut self, signals: &mpsc::Receiver<Signal>) {
        loop {
            self.reap();
            if self.nodes.iter().all(|n| n.status.is_some()) {
                return;
            }
            let now = Instant::now();
            // hyfi nodes end by themselves within FAILURE_GRACE of a
            // failure, each saying why; those still there then are stopped.
            if self
                .failed_at
                .is_some_and(|t| now.duration_since(t) >= STOP_DELAY)
                && self.stopping_since.is_none()
            {
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

    /// How each node ended.
    pub(super) fn endings(&self) -> Vec<Ending> {
        self.nodes
            .iter()
            .map(|n| Ending {
                status: n.status,
                signalled: n.signalled.is_some(),
            })
            .collect()
    }

    /// The job's end on stderr: the node that failed first and why (the
    /// launcher's first line, unless a signal or the timeout stopped the
    /// job, which the launcher said when it happened), then the nodes that
    /// failed after it, the first [`REPORTS_SHOWN`] one by one and the rest
    /// a line per way of ending.
    pub(super) fn report(&self, verdict: Option<&Verdict>) {
        if let Some(v) = verdict {
            eprintln!("hyfi launcher: node {} failed first: {}", v.node, v.why);
        }
        let first = verdict.map(|v| v.node);
        let because = if first.is_some() {
            " because of it"
        } else {
            ""
        };
        let mut shown = 0;
        let mut grouped: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (rank, ending) in self.endings().iter().enumerate() {
            if Some(rank) == first {
                continue;
            }
            let Some(how) = causes::after(ending) else {
                continue;
            };
            if shown < REPORTS_SHOWN {
                shown += 1;
                eprintln!("hyfi launcher: node {rank} ended{because}: {how}");
            } else {
                grouped.entry(how).or_default().push(rank);
            }
        }
        for (how, ranks) in &grouped {
            eprintln!(
                "hyfi launcher: {} more node(s) (ranks {}) ended{because}: each {how}",
                ranks.len(),
                output::ranges(ranks)
            );
        }
    }
}
