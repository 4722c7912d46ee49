//! SPMD steps: every node of a job must make the same collective calls in
//! the same order (phases, shared allocations, distributed runs). A node
//! that does not would otherwise hang the others at their next barrier,
//! with no word of why.
//!
//! Each node numbers the steps it enters ([`NodeLink::enter_step`]) and sends
//! each one to the next node of a ring (`(rank + 1) % nodes`): one small
//! control message per step, whatever the node count (a transport may hold
//! it back until it sends that node something else or waits, as the TCP
//! transport does: the comparison needs it before anyone blocks, not at
//! once). If the nodes'
//! sequences differ anywhere, two neighbours of the ring differ at the
//! first step where they do, so the receiver of that step notices it the
//! moment it has both, and ends the job naming both nodes and what each
//! did. A node that ends its program sends `Bye` with its step count to
//! every node: a node that takes a step beyond it is named the same way.
//!
//! [`Steps`] is the bookkeeping alone, shared by every transport: the TCP
//! cluster (hyfi-net) and [`InProcess`](super::InProcess) carry the step
//! messages and call it; what it finds is a [`StepError`].
//!
//! [`NodeLink::enter_step`]: crate::NodeLink::enter_step

use std::collections::{BTreeMap, VecDeque};

use crate::node::Step;

/// How many of its own past steps a node keeps to compare late messages
/// with (a neighbour is at most one step behind when the ring is sound).
const KEEP: usize = 64;

/// One node's record of its steps and its neighbour's.
pub struct Steps {
    me: usize,
    /// Steps entered so far.
    count: u64,
    /// The most recent steps: (number, step).
    recent: VecDeque<(u64, Step)>,
    /// Steps the ring predecessor took before this node did.
    ahead: BTreeMap<u64, Step>,
    /// Peers that ended their program: their step count and last step.
    ended: BTreeMap<usize, (u64, Option<Step>)>,
}

impl Steps {
    /// The record of node `me`, before its first step.
    pub fn new(me: usize) -> Steps {
        Steps {
            me,
            count: 0,
            recent: VecDeque::new(),
            ahead: BTreeMap::new(),
            ended: BTreeMap::new(),
        }
    }

    /// This node's step count and its last step (what `Bye` carries).
    pub fn last(&self) -> (u64, Option<Step>) {
        (self.count, self.recent.back().map(|&(_, s)| s))
    }

    /// This node enters `step`: returns its number, or why the job cannot
    /// go on (a peer took another step at that number, or ended before it).
    pub fn enter(&mut self, from_prev: usize, step: Step) -> Result<u64, StepError> {
        self.count += 1;
        let n = self.count;
        self.recent.push_back((n, step));
        if self.recent.len() > KEEP {
            self.recent.pop_front();
        }
        if let Some(theirs) = self.ahead.remove(&n) {
            if theirs != step {
                return Err(mismatch(n, from_prev, theirs, self.me, step));
            }
        }
        if let Some((&peer, &(steps, last))) = self.ended.iter().find(|(_, (c, _))| *c < n) {
            return Err(ended(peer, steps, last, self.me, step));
        }
        Ok(n)
    }

    /// The ring predecessor `from` entered its `n`-th step, `theirs`.
    pub fn on_step(&mut self, from: usize, n: u64, theirs: Step) -> Result<(), StepError> {
        if n > self.count {
            self.ahead.insert(n, theirs);
            return Ok(());
        }
        match self.recent.iter().find(|(k, _)| *k == n) {
            Some(&(_, mine)) if mine != theirs => Err(mismatch(n, from, theirs, self.me, mine)),
            _ => Ok(()),
        }
    }

    /// Peer `from` ended its program after `steps` steps, the last `last`.
    pub fn on_bye(&mut self, from: usize, steps: u64, last: Option<Step>) -> Result<(), StepError> {
        if self.count > steps {
            let mine = self
                .recent
                .back()
                .map(|&(_, s)| s)
                .expect("a node that counted steps has a last one");
            return Err(ended(from, steps, last, self.me, mine));
        }
        self.ended.insert(from, (steps, last));
        Ok(())
    }
}

const REMEDY: &str = "every node must make the same phases, shared allocations and \
                      run_distributed calls in the same order (SPMD): check code that \
                      depends on the node number, and post-phase decisions that differ";

/// Two nodes of a job took different SPMD steps: what each did, and the
/// remedy.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StepError {
    /// At step `n`, node `a` took `theirs` where node `b` took `mine`.
    #[error(
        "nodes took different steps (step {n}): node {a} {theirs} where node {b} {mine}; {REMEDY}"
    )]
    Differ {
        /// The step number (from 1).
        n: u64,
        /// One node.
        a: usize,
        /// What it did.
        theirs: Step,
        /// The other node.
        b: usize,
        /// What that one did.
        mine: Step,
    },
    /// Node `peer` ended its program after `steps` steps; node `me` went on
    /// with `mine`.
    #[error("node {peer} ended its program after {steps} steps{}; node {me} went on: it {mine}; {REMEDY}", last_step(last))]
    Ended {
        /// The node that ended.
        peer: usize,
        /// Its step count.
        steps: u64,
        /// Its last step.
        last: Option<Step>,
        /// The node that went on.
        me: usize,
        /// The step it took beyond.
        mine: Step,
    },
}

fn last_step(last: &Option<Step>) -> String {
    match last {
        Some(s) => format!(", the last: it {s}"),
        None => String::new(),
    }
}

fn mismatch(n: u64, a: usize, theirs: Step, b: usize, mine: Step) -> StepError {
    StepError::Differ {
        n,
        a,
        theirs,
        b,
        mine,
    }
}

fn ended(peer: usize, steps: u64, last: Option<Step>, me: usize, mine: Step) -> StepError {
    StepError::Ended {
        peer,
        steps,
        last,
        me,
        mine,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phase(iteration: u64) -> Step {
        Step::Phase {
            program: 1,
            phase: 0,
            iteration,
        }
    }

    #[test]
    fn equal_sequences_pass_in_any_interleaving() {
        let mut s = Steps::new(1);
        // The predecessor runs two steps ahead, then we catch up.
        s.on_step(0, 1, phase(0)).unwrap();
        s.on_step(0, 2, phase(1)).unwrap();
        assert_eq!(s.enter(0, phase(0)), Ok(1));
        assert_eq!(s.enter(0, phase(1)), Ok(2));
        // Now we are ahead; its message comes late.
        assert_eq!(s.enter(0, phase(2)), Ok(3));
        s.on_step(0, 3, phase(2)).unwrap();
        s.on_bye(0, 3, Some(phase(2))).unwrap();
    }

    #[test]
    fn a_different_step_is_named_with_both_nodes() {
        let mut s = Steps::new(0);
        s.enter(1, phase(0)).unwrap();
        let alloc = Step::Alloc {
            seq: 3,
            elems: 2000,
            bytes: 16000,
        };
        let e = s.on_step(1, 1, alloc).unwrap_err();
        assert!(
            e.to_string()
                .contains("node 1 made shared allocation #3 (2000 elements, 16000 bytes)")
                && e.to_string()
                    .contains("node 0 ran phase 0 (execution 1) of program #1"),
            "{e}"
        );
        // The same found the other way round: we enter after it arrived.
        let mut s = Steps::new(0);
        s.on_step(1, 1, alloc).unwrap();
        let e = s.enter(1, phase(0)).unwrap_err();
        assert!(
            e.to_string().contains("node 1 made") && e.to_string().contains("node 0 ran"),
            "{e}"
        );
    }

    #[test]
    fn a_step_after_a_peer_ended_is_named() {
        let mut s = Steps::new(0);
        s.enter(1, phase(0)).unwrap();
        s.on_bye(1, 1, Some(phase(0))).unwrap();
        let e = s.enter(1, Step::Distributed { seq: 1 }).unwrap_err();
        assert!(
            e.to_string()
                .contains("node 1 ended its program after 1 steps")
                && e.to_string()
                    .contains("node 0 went on: it called run_distributed"),
            "{e}"
        );
        // And a bye that comes after we went on.
        let mut s = Steps::new(0);
        s.enter(1, phase(0)).unwrap();
        s.enter(1, phase(1)).unwrap();
        let e = s.on_bye(1, 1, Some(phase(0))).unwrap_err();
        assert!(
            e.to_string()
                .contains("node 1 ended its program after 1 steps"),
            "{e}"
        );
    }
}
