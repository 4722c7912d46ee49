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

use super::node::Node;
use super::outcome::describe;
use super::status::Status;
use super::{output, GRACE, POLL, REPORTS_SHOWN};

/// The supervising loop's state: the nodes, and how far stopping them got.
pub(super) struct Supervisor {
    pub(super) nodes: Vec<Node>,
    timeout: Option<Duration>,
    deadline: Option<Instant>,
    pub(super) first_failure: Option<usize>,
    /// When the nodes were first told to stop (SIGTERM or a forwarded signal).
    stopping_since: Option<Instant>,
    /// When they were SIGKILLed.
    killed_at: Option<Instant>,
    pub(super) timed_out: bool,
    pub(super) interrupted: Option<Signal>,
    signals: usize,
    /// Failures after the first [`REPORTS_SHOWN`]: how they ended → ranks.
    unreported: BTreeMap<String, Vec<usize>>,
    reported: usize,
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
                let signalled = n.signalled;
                self.first_failure.get_or_insert(rank);
                self.report(rank, status, signalled);
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
    pub(super) fn report_the_rest(&self) {
        for (how, ranks) in &self.unreported {
            eprintln!(
                "hyfi launcher: {} more node(s) (ranks {}): each {how}",
                ranks.len(),
                output::ranges(ranks)
            );
        }
    }
}
