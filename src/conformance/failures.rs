//! The failures a transport must detect: a node lost (it exits or aborts)
//! and a node stopped (a signal, or a delivery thread that stalls). Each
//! ends the job, so each is an entry point of its own, called on every
//! node instead of [`run`](super::run): the victim goes wrong after a
//! barrier that every node passed, and every other node (a *survivor*)
//! enters another barrier, which must fail within [`DETECTION_BOUND`] with
//! an error that names the victim.

use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use super::service::{service_of, Expect, State, Suite};
use super::{names_node, WAIT_BOUND};
use crate::layers::link::Class;
use crate::layers::{NodeLink, RuntimeExt};
use crate::Runtime;

/// How long a survivor's barrier may take to fail. Far above what a
/// transport needs (a round trip for a lost node; the heartbeat limit,
/// `HYFI_HEARTBEAT`, 5 s by default, for a stopped one), and a bound:
/// a barrier that neither completes nor fails is a failed check, not a
/// hang.
pub const DETECTION_BOUND: Duration = Duration::from_secs(60);

/// How the victim of [`lose_node`] goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loss {
    /// Its process exits at once (`std::process::exit(0)`: no goodbye,
    /// and a status that says nothing went wrong, which the job must
    /// still count as a failure: the others needed it). For transports
    /// whose nodes are processes.
    Exit,
    /// It aborts through its link ([`NodeLink::abort`]), as a node whose
    /// program failed does: the way to lose a node of the in-process link,
    /// whose nodes share a process.
    Abort,
}

/// How the victim of [`stop_node`] stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Its process stops (SIGSTOP, sent with the system's `kill`
    /// command) and never answers again: for transports whose nodes are
    /// processes. The survivors find it at the heartbeat limit; whoever
    /// started the job must kill it.
    Signal,
    /// Its delivery thread stalls in a handler of the suite for this long
    /// (the next node sends it the message that does it), as a node whose
    /// communication thread hangs: the way to stop a node of the
    /// in-process link. Choose it above the transport's limit for a silent
    /// peer (the heartbeat, or `InProcess::connect_with_limit`).
    Stall(Duration),
}

/// How [`lose_node`] or [`stop_node`] ended on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ending {
    /// This node was the victim, and is still there to say so (it aborted,
    /// or its stall is over).
    Victim,
    /// This node survived: its barrier failed after `after` with `error`,
    /// which names the victim.
    Detected {
        /// The error the barrier returned.
        error: String,
        /// How long the barrier took to fail.
        after: Duration,
    },
}

/// Checks that the job detects the loss of node `victim`: call it on every
/// node. The victim goes as `how` says; on every other node it returns
/// [`Ending::Detected`] once the barrier it then enters fails naming the
/// victim, or an `Err` if the barrier completes, fails without naming the
/// victim, or neither within [`DETECTION_BOUND`]. With [`Loss::Exit`] the
/// victim's call does not return.
///
/// The job cannot go on afterwards: a survivor should end (with a non-zero
/// status: the job failed, as it was meant to).
pub fn lose_node(rt: &Runtime, victim: usize, how: Loss) -> Result<Ending, String> {
    let link = rt.link().clone();
    let me = prepare(&link, victim)?;
    if me == victim {
        match how {
            Loss::Exit => std::process::exit(0),
            Loss::Abort => {
                link.abort(&format!(
                    "node {me} gave up on purpose (the conformance suite's lost node)"
                ));
                return Ok(Ending::Victim);
            }
        }
    }
    survive(&link, victim, "lost")
}

/// Checks that the job detects that node `victim` stopped answering: call
/// it on every node; as [`lose_node`] otherwise. With [`Stop::Signal`] the
/// victim's call does not return (unless someone continues it, when it
/// returns [`Ending::Victim`]).
pub fn stop_node(rt: &Runtime, victim: usize, how: Stop) -> Result<Ending, String> {
    let link = rt.link().clone();
    let suite = Suite::on(rt)?;
    if let (Some(suite), Stop::Stall(d)) = (&suite, how) {
        suite.expect(Expect::Stall(d));
    }
    let me = prepare(&link, victim)?;
    let n = link.num_nodes();
    match how {
        Stop::Signal if me == victim => {
            let pid = std::process::id().to_string();
            let status = std::process::Command::new("kill")
                .args(["-s", "STOP", &pid])
                .status()
                .map_err(|e| format!("node {me}: cannot run `kill -s STOP {pid}`: {e}"))?;
            if !status.success() {
                return Err(format!("node {me}: `kill -s STOP {pid}` failed: {status}"));
            }
            return Ok(Ending::Victim);
        }
        Stop::Stall(d) => {
            let suite = suite.ok_or_else(|| format!("node {me}: no suite on one node"))?;
            if me == victim {
                // Wait (bounded) for the stall to begin and end, so that
                // the node is not closed under its own stalled thread. The
                // victim's own node fails meanwhile (its link names it as
                // stopped), which ends the wait early: then wait for the
                // stall's end without looking at the failure.
                let deadline = Instant::now() + d + WAIT_BOUND;
                let stalled = |st: &State| st.stalls.1;
                if suite
                    .wait(deadline, stalled, |st| {
                        format!("the stall (begun: {})", st.stalls.0)
                    })
                    .is_err()
                {
                    while !suite.peek(stalled) {
                        if Instant::now() >= deadline {
                            return Err(format!(
                                "node {me}: the stall did not end within {} s",
                                WAIT_BOUND.as_secs()
                            ));
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
                return Ok(Ending::Victim);
            }
            if me == (victim + 1) % n {
                suite
                    .port
                    .send_bytes(victim, service_of(Class::Control), Class::Control, b"stall")
                    .map_err(|e| format!("node {me}: asking node {victim} to stall: {e}"))?;
            }
        }
        Stop::Signal => {}
    }
    survive(&link, victim, "stopped")
}

/// Checks the arguments; every node passes a barrier (every node is set
/// up, and the victim is still there). Returns this node.
fn prepare(link: &Arc<dyn NodeLink>, victim: usize) -> Result<usize, String> {
    let (me, n) = (link.my_node(), link.num_nodes());
    if n < 2 || victim >= n {
        return Err(format!(
            "node {me}: a job of {n} node(s) has no node {victim} to lose and a survivor to \
             notice: run it on 2 nodes or more, with a victim below the node count"
        ));
    }
    link.barrier()
        .map_err(|e| format!("node {me}: the barrier before node {victim} goes failed: {e}"))?;
    Ok(me)
}

/// A survivor's side: a barrier that must fail, naming `victim`, within
/// [`DETECTION_BOUND`]. It runs on a thread of its own so that a barrier
/// that never returns is a failed check, not a hung node.
fn survive(link: &Arc<dyn NodeLink>, victim: usize, what: &str) -> Result<Ending, String> {
    let me = link.my_node();
    let t0 = Instant::now();
    let (tx, rx) = mpsc::channel();
    let l = link.clone();
    std::thread::Builder::new()
        .name("hyfi-conformance-barrier".into())
        .spawn(move || {
            let _ = tx.send(l.barrier().map_err(|e| e.to_string()));
        })
        .map_err(|e| format!("node {me}: starting the barrier's thread: {e}"))?;
    match rx.recv_timeout(DETECTION_BOUND) {
        Ok(Ok(())) => Err(format!(
            "node {me}: a barrier completed without node {victim}, which was {what}"
        )),
        Ok(Err(error)) if names_node(&error, victim) => Ok(Ending::Detected {
            error,
            after: t0.elapsed(),
        }),
        Ok(Err(error)) => Err(format!(
            "node {me}: the barrier failed without naming node {victim}, which was {what}: {error}"
        )),
        Err(_) => Err(format!(
            "node {me}: the barrier neither completed nor failed within {} s after node {victim} \
             was {what}",
            DETECTION_BOUND.as_secs()
        )),
    }
}
