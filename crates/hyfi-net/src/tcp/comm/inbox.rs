//! Where received frames wait for their takers: collective messages and
//! bulk frames (frames for a service go to it, see [`super::service`]);
//! waiting threads poll, then sleep, and waiting filthreads suspend.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use hyfi_core::link::{StepError, Steps};

use crate::cause::Cause;
use hyfi_core::link::ServiceTable;

/// How long a waiting thread polls before it sleeps. It polls by yielding
/// its CPU, not by spinning: the communication thread that will deliver the
/// message may share that CPU (with several nodes on a host, a node's
/// threads stay on its CPUs), and a spinning waiter would only delay it.
pub(super) const SPIN: Duration = Duration::from_micros(50);

/// Direction of a collective message.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Dir {
    /// Towards node 0.
    Up,
    /// From node 0 outwards.
    Down,
}

/// Where received messages wait for the server thread that wants them.
#[derive(Default)]
pub struct Inbox {
    pub(super) state: Mutex<InboxState>,
    pub(super) cv: Condvar,
    /// Set when this node is about to exit on a signal: the links its peers
    /// drop as they abort are then expected, and must not make this node's
    /// program exit first with an error status of its own.
    pub(super) exiting: std::sync::atomic::AtomicBool,
    /// Bumped by every `put`: lets a waiter spin on one atomic instead of
    /// sleeping on the condvar at once (a futex sleep and wake-up costs tens
    /// of microseconds on a VM, more than a round trip on loopback).
    pub(super) generation: AtomicU64,
    /// Threads asleep in [`Inbox::wait`]: whatever a bracket of theirs
    /// said, nobody of them reads a lane until a frame is delivered.
    pub(super) sleeping: std::sync::atomic::AtomicUsize,
    /// The node's services (see [`super::service`]).
    pub(super) services: ServiceTable,
}

/// Why a wait in the inbox ended without its message.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum WaitError {
    /// The node failed; the text is the failure's (shared by every waiter,
    /// so kept as the text it is shown as).
    #[error("{0}")]
    Failed(String),
    /// The peer waited for said `Bye` (its program ended) and what this
    /// node waits for was not sent before it.
    #[error(
        "node {me} waits for node {peer} at a barrier or reduction, but node {peer} ended its \
         program: every node must make the same phases, shared allocations and \
         run_distributed calls (SPMD)"
    )]
    Gone {
        /// This node.
        me: usize,
        /// The peer that ended its program.
        peer: usize,
    },
}

#[derive(Default)]
pub(super) struct InboxState {
    pub(super) coll: HashMap<(usize, u64, Dir), Vec<u8>>,
    pub(super) bulk: HashMap<usize, std::collections::VecDeque<(u64, Vec<u8>)>>,
    pub(super) failed: Option<String>,
    /// The first cause (see [`crate::cause`]): `failed` is its line.
    pub(super) cause: Option<crate::cause::Cause>,
    /// The node's first failure was claimed (see [`Inbox::fail_announced`]):
    /// set before `failed`, which is published after the announcement.
    pub(super) claimed: bool,
    pub(super) byes: usize,
    /// Peers that said `Bye`: they send nothing more but answers to
    /// requests, so a wait for anything else from them would never end.
    pub(super) gone: std::collections::HashSet<usize>,
    /// This node's SPMD steps and its ring predecessor's (see `hyfi_core::link::spmd`).
    pub(super) steps: Option<Steps>,
    /// Filthreads suspended until something arrives.
    pub(super) waiters: Vec<hyfi_core::filthread::Waker>,
}

impl InboxState {
    pub(super) fn take_waiters(&mut self) -> Vec<hyfi_core::filthread::Waker> {
        std::mem::take(&mut self.waiters)
    }
}

impl Inbox {
    pub(super) fn put(&self, f: impl FnOnce(&mut InboxState)) {
        let waiters = {
            let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
            f(&mut s);
            self.generation.fetch_add(1, Ordering::Release);
            // Only a sleeper needs the notification, a `futex` system call
            // whether or not anyone sleeps: every collective's piece and
            // every SPMD step comes through here. A sleeper counts itself
            // under this lock before it sleeps (`wait`).
            if self.sleeping.load(Ordering::SeqCst) > 0 {
                self.cv.notify_all();
            }
            s.take_waiters()
        };
        // Woken outside the lock; each re-checks for its own message.
        for w in waiters {
            w.wake();
        }
    }
    pub(super) fn put_coll(&self, from: usize, seq: u64, dir: Dir, data: Vec<u8>) {
        self.put(|s| {
            s.coll.insert((from, seq, dir), data);
        });
    }
    pub(super) fn put_bulk(&self, from: usize, tag: u64, data: Vec<u8>) {
        self.put(|s| s.bulk.entry(from).or_default().push_back((tag, data)));
    }
    /// Records node `me`'s first failure; returns true if it was the first.
    pub(super) fn fail(&self, me: usize, cause: Cause) -> bool {
        self.fail_announced(me, cause, |_| {})
    }

    /// Records the first failure, running `announce` with its text before
    /// any waiter can see it; returns true if it was the first.
    ///
    /// Announced first because a waiter that sees the failure returns its
    /// error to the program, which may print it and exit at once: the
    /// node's own line ("hyfi: node 0: lost node 1 …", the failure hook's)
    /// must already be out by then, or a loaded machine loses it.
    /// The cause also goes to the node's launcher ([`crate::cause`]), first
    /// of all, so that a node that dies at once has said it.
    pub(super) fn fail_announced(
        &self,
        me: usize,
        cause: Cause,
        announce: impl FnOnce(&Cause),
    ) -> bool {
        if !self.claim_failure(&cause, announce) {
            return false;
        }
        self.publish_failure(me, cause);
        true
    }
    /// Makes `cause` this node's failure if it has none (and is not
    /// exiting): reports and announces it, and wakes nobody yet. False if
    /// another failure came first.
    pub(super) fn claim_failure(&self, cause: &Cause, announce: impl FnOnce(&Cause)) -> bool {
        if self.exiting.load(Ordering::SeqCst) {
            return false;
        }
        {
            let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if s.claimed {
                return false;
            }
            s.claimed = true;
        }
        crate::cause::report(cause);
        announce(cause);
        true
    }
    /// Wakes every waiter and service with the claimed failure `cause`.
    pub(super) fn publish_failure(&self, me: usize, cause: Cause) {
        let text = cause.line(me);
        let why = text.clone();
        self.put(|s| {
            s.failed = Some(why);
            s.cause = Some(cause);
        });
        self.services.fail_all(&text);
    }
    /// Peer `from` said `Bye` after `steps` steps: an error if this node
    /// already went further.
    pub(super) fn bye(
        &self,
        from: usize,
        steps: u64,
        last: Option<hyfi_core::Step>,
    ) -> Result<(), StepError> {
        let mut r = Ok(());
        self.put(|s| {
            s.byes += 1;
            if let Some(st) = s.steps.as_mut() {
                r = st.on_bye(from, steps, last);
            }
            // A wrong goodbye is not a peer gone: its caller fails the node
            // with the SPMD cause at once, and a waiter that saw the peer
            // gone first would report a bare "ended its program" instead
            // (a release's all-reduce did, racing with it).
            if r.is_ok() {
                s.gone.insert(from);
            }
        });
        // A wrong goodbye fails the node (which wakes the services with
        // why); a right one only ends the services' waits for that peer.
        if r.is_ok() {
            self.services.peer_left(from);
        }
        r
    }
    /// Waits until `take` finds its message (or the node fails). On a
    /// filthread the filthread suspends and its server thread runs other
    /// work meanwhile; elsewhere the calling thread blocks.
    pub(super) fn wait<T>(
        &self,
        mut take: impl FnMut(&mut InboxState) -> Option<Result<T, WaitError>>,
    ) -> Result<T, WaitError> {
        if hyfi_core::filthread::in_filthread() {
            let mut got = None;
            loop {
                hyfi_core::filthread::suspend(|waker| {
                    let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(v) = take(&mut s) {
                        got = Some(v);
                        return false;
                    }
                    if let Some(f) = &s.failed {
                        got = Some(Err(WaitError::Failed(f.clone())));
                        return false;
                    }
                    // Registered under the lock that `put` takes: a message
                    // arriving after this check finds the waker.
                    s.waiters.push(waker);
                    true
                });
                if let Some(r) = got.take() {
                    return r;
                }
            }
        }
        // A thread's wait (a filthread suspends instead, above, and its
        // processor computes on): the master's `Computing` bracket, kept
        // open past its share of a phase (`hyfi_core::link::until_wait`),
        // ends here, before the thread can sleep. Its peers send a
        // collective's pieces for the phase's end, and ring no bell while
        // that bracket is open: a master that slept in it (a node that does
        // not own its CPUs, which polls for only `SPIN` below, in no
        // bracket) was woken only by the communication thread's next timer,
        // ~100 ms later, at every step of the release's all-reduce (LU 1024
        // on 4×1 unpinned: 30 s instead of 0.2 s). Held step messages go
        // out too.
        hyfi_core::link::before_wait();
        // What the wait ends with: its message, or the node's failure.
        let mut look = |s: &mut InboxState| {
            take(s).or_else(|| s.failed.clone().map(|f| Err(WaitError::Failed(f))))
        };
        // Poll a little first: replies on a fast network come back sooner
        // than a sleeping thread can be woken.
        if hyfi_core::sleep::own_cpu() {
            // A node that owns its CPUs polls for `OWN_CPU_POLL`, in the
            // core's polling bracket: where its CPUs are its own alone, the
            // waiter reads the links itself (`rx::idle_progress`), and the
            // bracket tells the lanes' producers so, who then ring no bell
            // (a write on the socket, and this node's communication thread
            // woken onto the CPU the waiter spins on). A collective's every
            // step waits here: on 16 local nodes an all-reduce is 4 such
            // waits, each of which rang a bell without the bracket.
            let got = hyfi_core::sleep::poll_own_cpu_for(&self.generation, || {
                look(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()))
            });
            if let Some(v) = got {
                return v;
            }
        } else {
            let spin_until = Instant::now() + SPIN;
            loop {
                let seen = self.generation.load(Ordering::Acquire);
                let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(v) = look(&mut s) {
                    return v;
                }
                drop(s);
                while self.generation.load(Ordering::Acquire) == seen && Instant::now() < spin_until
                {
                    std::thread::yield_now();
                }
                if Instant::now() >= spin_until {
                    break;
                }
            }
        }
        // It sleeps: a collective's polling bracket ends first (see
        // `hyfi_core::link::attending_collective`).
        hyfi_core::link::before_sleep();
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.sleeping.fetch_add(1, Ordering::SeqCst);
        let got = loop {
            if let Some(v) = look(&mut s) {
                break v;
            }
            s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner());
        };
        self.sleeping.fetch_sub(1, Ordering::SeqCst);
        got
    }
    /// The first cause, if the node has failed.
    pub fn cause(&self) -> Option<Cause> {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .cause
            .clone()
    }

    /// The failure's line, if the node has failed.
    pub fn failure(&self) -> Option<String> {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .failed
            .clone()
    }
}
