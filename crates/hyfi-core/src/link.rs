//! The node seam for layers: how a layer above the runtime (the shared
//! memory, cross-node stealing) talks to the same layer on other nodes,
//! without knowing the transport.
//!
//! A layer is a [`Service`] registered on its node's link under a
//! [`ServiceId`] ([`NodeLink::set_service`](crate::NodeLink::set_service)).
//! It sends with the node's [`Port`]
//! ([`NodeLink::port`](crate::NodeLink::port)): a payload it builds itself,
//! to one node, for the same service there, in one of two priority
//! classes. The transport frames the payload, moves it, and hands it to
//! the receiving node's service on that node's *delivery thread* (over TCP,
//! the communication thread), in the order it was sent per sender and
//! class.
//!
//! # Priority classes
//!
//! * [`Class::Control`]: small messages someone waits for with nothing
//!   else to do — a page *request*, a steal *request*. A control message
//!   overtakes bulk messages queued before it to the same node and that
//!   have not started moving yet: **control never waits behind bulk**
//!   (at most behind one bulk message already being written).
//! * [`Class::Bulk`]: data — pages, diffs and write notices (a release),
//!   stolen filaments, results. Bulk messages to one node stay in order.
//!
//! Messages of different classes from one node to another may be
//! reordered; a protocol that needs an order between them must not rely on
//! the transport for it (the DSM's requests carry the requester's epoch for
//! this reason).
//!
//! # Handlers
//!
//! [`Service::frame`] runs on the receiving node's delivery thread. It
//! must not block: it may send (sending never blocks) and wake waiters,
//! nothing more. A handler's `Err` is a protocol violation and fails the
//! node. [`Service::failed`] tells the service that its node failed (a lost
//! peer, an abort): every waiter must wake with the reason.
//! [`Service::peer_left`] tells it that a peer's program ended: that peer
//! asks for nothing more, but still answers requests.
//!
//! # Implementations
//!
//! hyfi-net implements the seam over TCP (`hyfi_net::tcp::Cluster`) and,
//! with its `mpi` feature, over MPI (`hyfi_net::mpi::MpiLink`);
//! [`InProcess`] implements it with channels between several runtimes in
//! one process, for unit tests of the protocols. What every transport
//! shares is here, written once: the table of services and of the frames
//! that come before their service ([`ServiceTable`]), barrier and
//! all-reduce with their fixed combining order ([`collective`]), the SPMD
//! step checks ([`spmd`]), and, for a transport that must be polled,
//! progress made by idle processors ([`set_idle_progress`]). The facade's
//! `hyfi::conformance` suite says what a transport must do, and CI runs
//! it over each of them. One thing is optional: a transport whose nodes
//! share memory may lend some
//! ([`NodeLink::host_words`](crate::NodeLink::host_words),
//! [`HostWords`]), which the TCP transport's lanes and the in-process link
//! do; steal requests between those nodes then go through it, not as
//! messages.
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use hyfi::layers::link::{Class, FrameError, InProcess, Service, ServiceId};
//! use hyfi::layers::NodeLink;
//!
//! /// Collects what it receives.
//! #[derive(Default)]
//! struct Log(Mutex<Vec<(usize, Vec<u8>)>>);
//! impl Service for Log {
//!     fn frame(&self, from: usize, payload: Vec<u8>) -> Result<(), FrameError> {
//!         self.0.lock().unwrap().push((from, payload));
//!         Ok(())
//!     }
//!     fn failed(&self, _why: &str) {}
//! }
//!
//! let nodes = InProcess::connect(2);
//! let log = Arc::new(Log::default());
//! // A layer owns its service's number and name.
//! const LOG: ServiceId = ServiceId::new(100, "a log");
//! nodes[1].set_service(LOG, log.clone()).unwrap();
//! let port = nodes[0].port().unwrap();
//! port.send_bytes(1, LOG, Class::Control, b"hello").unwrap();
//! // Delivery is asynchronous, on node 1's delivery thread.
//! while log.0.lock().unwrap().is_empty() {
//!     std::thread::yield_now();
//! }
//! assert_eq!(log.0.lock().unwrap()[0], (0, b"hello".to_vec()));
//! ```

pub mod buffers;
pub mod collective;
mod counters;
mod in_process;
mod services;
pub mod spmd;

pub use counters::TrafficCounters;
pub use in_process::InProcess;
pub(crate) use services::registered_name;
pub use services::{ServiceError, ServiceTable};
pub use spmd::{StepError, Steps};

/// Transports' progress functions, polled by idle processors: see
/// [`set_idle_progress`]. A few slots: one transport per process in a
/// job, but tests run several in one process.
static IDLE_PROGRESS: [std::sync::OnceLock<fn() -> bool>; 4] =
    [const { std::sync::OnceLock::new() }; 4];

/// Lets this process's idle processors drive a transport's progress.
///
/// A transport whose messages arrive only when someone polls (MPI's
/// progress engine has no descriptor to sleep on) otherwise needs its
/// communication thread to poll, and a message then reaches a waiting
/// filthread through that thread: on a node whose server thread shares its
/// CPU with the communication thread (`mpirun` binds a rank to one core,
/// several local nodes each own their CPUs), every message costs context
/// switches between the two (TCP reads its sockets in a communication
/// thread too, but idle processors reading them save its wake-up). With a
/// progress function, a processor with nothing to run (its filthreads
/// wait for a page, a steal, a release) calls `progress` while it waits:
/// it receives and handles the messages itself, on its own CPU, as the
/// communication thread would (services' handlers then run on that
/// processor, between filaments; they must not block, as always).
/// `progress` must return at once when another thread is polling (a
/// `try_lock`), and say whether it moved anything. The transport's own
/// thread must go on polling as well: a processor polls only while it
/// waits, and a wait may end in sleep. Setting the same function twice
/// does nothing; false if every slot (four) is taken.
pub fn set_idle_progress(progress: fn() -> bool) -> bool {
    for slot in &IDLE_PROGRESS {
        match slot.get() {
            Some(&f) if f as usize == progress as usize => return true,
            Some(_) => {}
            None => {
                if slot.set(progress).is_ok() {
                    return true;
                }
                // Another thread took this slot meanwhile: it may have set
                // the same function.
                if slot.get().is_some_and(|&f| f as usize == progress as usize) {
                    return true;
                }
            }
        }
    }
    false
}

/// What a thread of a node attends to, for a transport that skips waking
/// the node while one of its threads will read what comes (see
/// [`set_attending`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attending {
    /// An idle thread polls the transport's progress in a loop: it reads
    /// whatever comes, at once.
    Polling,
    /// The node's master (processor 0) runs its share of a phase. It reads
    /// what came when it stops, before the phase's end, where the messages
    /// sent with [`Port::send_for_phase_end`] are waited for: those need
    /// not wake the node meanwhile. Every other message still must.
    Computing,
}

/// A transport's brackets: `begin` and `end`.
type Bracket = (fn(Attending), fn(Attending));

/// Transports' brackets: see [`set_attending`].
static ATTENDING: [std::sync::OnceLock<Bracket>; 4] = [const { std::sync::OnceLock::new() }; 4];

/// Tells a transport when a thread of the node starts and stops attending
/// to its messages ([`Attending`]): `begin` when it starts, `end` when it
/// stops, on the same thread; never nested per thread and kind.
///
/// A transport whose senders ring a sleeping reader (a byte on a socket,
/// a syscall on both sides, and a thread woken on the receiver's CPUs)
/// may skip the bell while the receiving node is known to read soon: the
/// TCP transport's shared-memory lanes count the threads that poll, and
/// whether the master computes, in shared memory; a thread that stops
/// reads what came meanwhile (`end`). Setting the same pair twice does
/// nothing; false if every slot (four) is taken.
pub fn set_attending(begin: fn(Attending), end: fn(Attending)) -> bool {
    for slot in &ATTENDING {
        match slot.get() {
            Some(&(b, e)) if b as usize == begin as usize && e as usize == end as usize => {
                return true
            }
            Some(_) => {}
            None => {
                if slot.set((begin, end)).is_ok() {
                    return true;
                }
                if slot
                    .get()
                    .is_some_and(|&(b, _)| b as usize == begin as usize)
                {
                    return true;
                }
            }
        }
    }
    false
}

thread_local! {
    /// The kinds this thread is inside an [`Attend`] bracket of (a bit
    /// per [`Attending`]).
    static ATTENDS: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
}

/// A bracket of [`set_attending`]: `begin` on creation, `end` on drop (the
/// outermost bracket of a thread and kind only).
pub(crate) struct Attend {
    kind: Attending,
    outer: bool,
}

impl Attend {
    pub(crate) fn start(kind: Attending) -> Attend {
        let bit = 1u8 << kind as u8;
        let outer = ATTENDS.with(|a| {
            let was = a.get();
            a.set(was | bit);
            was & bit == 0
        });
        if outer {
            for slot in &ATTENDING {
                match slot.get() {
                    Some(&(begin, _)) => begin(kind),
                    None => break,
                }
            }
        }
        if kind == Attending::Polling {
            // It reads from now on: the master's computing may end.
            waits();
        }
        Attend { kind, outer }
    }
}

thread_local! {
    /// The master's [`Attending::Computing`] bracket once its share of a
    /// phase ran (see [`until_wait`]).
    static COMPUTED: std::cell::RefCell<Option<Attend>> = const { std::cell::RefCell::new(None) };
}

/// The master's share of a phase ran, and `computing` stays open until it
/// first waits ([`waits`]): from here to its wait for the other nodes it
/// only prepares and sends its release, so it still reads, at that wait,
/// whatever was left for the phase's end, and a `REL` that comes meanwhile
/// (the other node ended its share at about the same time) need not ring.
/// Every wait of the master between its share and its release's wait
/// that reads the transport calls [`waits`] first (the link's: polling
/// starts, [`before_wait`]). The node barrier's wait for the node's other
/// processors does not: what it would read is for the release, which
/// follows it. The others (the release's wait for its page replies and
/// broadcasts) wait for messages that ring anyway.
pub(crate) fn until_wait(computing: Attend) {
    COMPUTED.with(|c| *c.borrow_mut() = Some(computing));
}

/// The thread is about to wait: ends the bracket [`until_wait`] kept open,
/// if any (reading what came while it was open).
pub(crate) fn waits() {
    drop(kept());
}

/// The bracket [`until_wait`] or [`phase_end_reached`] kept open, still
/// open, for the next phase's share to take over.
pub(crate) fn kept() -> Option<Attend> {
    COMPUTED.with(|c| c.borrow_mut().take())
}

thread_local! {
    /// This thread is the master taking a phase's node-level step
    /// ([`at_phase_end`]): only there does [`phase_end_reached`] act.
    static PHASE_END: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs the master's node-level step at a phase's end (`step`: the
/// phase-end hook, or the link's barrier), after which the master attends
/// as if computing until it next waits ([`phase_end_reached`], called here
/// too for a step that did not wait).
pub(crate) fn at_phase_end<R>(step: impl FnOnce() -> R) -> R {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            PHASE_END.with(|p| p.set(false));
        }
    }
    PHASE_END.with(|p| p.set(true));
    let reset = Reset;
    let ended = step();
    phase_end_reached();
    drop(reset);
    ended
}

/// The master has what its phase's end waited for (the other nodes'
/// releases are in): from here to its next phase's share it only finishes
/// the step (installing what came), runs the post-phase code and starts
/// the next phase, and it reads, at its next wait, whatever comes for the
/// next phase's end, so those messages need not ring
/// ([`Attending::Computing`], kept open as `until_wait` keeps it after a
/// share). Without it, a node whose share of the next phase is short
/// (LU's last steps) sent its next `REL` while this one still installed
/// the pivot row, and rang: a socket write of 10-20 µs on a virtual
/// machine, and this node's communication thread woken onto the CPU its
/// master needs.
///
/// A layer whose phase-end hook waits for the other nodes calls it once
/// that wait is over; it does nothing on any other thread or at any other
/// time. The bracket ends like the share's (`waits`: every wait of the
/// master calls it first, and post-phase code that sleeps waits for a
/// message that rings anyway), or the next phase's share takes it over,
/// or the program's end closes it.
pub fn phase_end_reached() {
    if PHASE_END.with(|p| p.get()) && COMPUTED.with(|c| c.borrow().is_none()) {
        until_wait(Attend::start(Attending::Computing));
    }
}

impl Drop for Attend {
    fn drop(&mut self) {
        if self.outer {
            for slot in &ATTENDING {
                match slot.get() {
                    Some(&(_, end)) => end(self.kind),
                    None => break,
                }
            }
            let bit = 1u8 << self.kind as u8;
            ATTENDS.with(|a| a.set(a.get() & !bit));
        }
    }
}

thread_local! {
    /// The [`Attending::Polling`] bracket of a collective this thread is
    /// in ([`attending_collective`]), until it ends or the thread sleeps.
    static COLLECTIVE: std::cell::RefCell<Option<Attend>> = const { std::cell::RefCell::new(None) };
}

/// Runs `collective` (a barrier or an all-reduce of several steps, each a
/// send and a wait) inside one [`Attending::Polling`] bracket, on a node
/// whose CPUs are its own alone (elsewhere a polling thread does not read
/// the transport, and the bracket means nothing), and not on a filthread.
///
/// Each of the collective's waits polls in a bracket of its own, but
/// between two of them (the step's value combined, the next piece sent)
/// the thread attends to nothing, and a piece that came then rang a bell:
/// the communication thread woken on the CPU the waiter needs, to read a
/// frame the waiter would have read microseconds later. On 16 local nodes
/// a sixth of an all-reduce's pieces came so. Kept open over the steps,
/// the bracket spares those bells; a wait that must sleep ends it first
/// ([`before_sleep`]), as a thread that sleeps reads nothing.
pub fn attending_collective<R>(collective: impl FnOnce() -> R) -> R {
    struct End(bool);
    impl Drop for End {
        fn drop(&mut self) {
            if self.0 {
                before_sleep();
            }
        }
    }
    // Not on a filthread: its waits suspend it, and its processor runs
    // other work meanwhile, reading nothing.
    // Nor inside another polling bracket (a service handler's, a poll's
    // ready check): that one is the thread's outermost, which
    // `before_sleep` cannot end.
    let polling = 1u8 << Attending::Polling as u8;
    let outer = crate::sleep::cpus_exclusive()
        && !crate::filthread::in_filthread()
        && COLLECTIVE.with(|c| c.borrow().is_none())
        && ATTENDS.with(|a| a.get() & polling == 0);
    if outer {
        let bracket = Attend::start(Attending::Polling);
        COLLECTIVE.with(|c| *c.borrow_mut() = Some(bracket));
    }
    let _end = End(outer);
    collective()
}

/// The thread is about to sleep (block until it is woken): the bracket of
/// a collective it is in ([`attending_collective`]) ends here, reading
/// what came while it was open, so that what comes next wakes it. Every
/// wait that may sleep inside a collective calls it before it sleeps.
pub fn before_sleep() {
    let bracket = COLLECTIVE.with(|c| c.borrow_mut().take());
    drop(bracket);
}

/// Runs the transports' progress functions once ([`set_idle_progress`]):
/// a layer calls it before it blocks on what its peers send (the DSM
/// before it sleeps on a release). A transport may hold small messages
/// back until its node sends the peer something else or waits (the TCP
/// transport's SPMD step messages): this is such a wait.
pub fn before_wait() {
    waits();
    idle_progress();
}

/// A layer's wait for what its peers send, up to the point where it may
/// sleep: [`before_wait`], then, on a node that owns its CPUs, a poll of
/// `ready` for up to `OWN_CPU_POLL` ([`crate::sleep::poll_own_cpu`],
/// which reads the transport itself); true if `ready` held. False: the
/// caller sleeps next, and [`before_sleep`] has ended a collective's
/// polling bracket it was in, so that what comes now rings it. (The DSM's
/// release wait once slept inside its release's bracket, and what came
/// waited for the communication thread's timer.)
pub fn poll_before_sleep(ready: impl FnMut() -> bool) -> bool {
    before_wait();
    if crate::sleep::poll_own_cpu(ready) {
        return true;
    }
    before_sleep();
    false
}

/// Polls the transports' progress functions, if any: for a thread with
/// nothing to do while it waits (an idle processor, a collective's wait).
/// True if there is one.
#[inline]
pub(crate) fn idle_progress() -> bool {
    let mut any = false;
    for slot in &IDLE_PROGRESS {
        match slot.get() {
            Some(f) => {
                f();
                any = true;
            }
            None => break,
        }
    }
    any
}

// The seam's types are defined next to `NodeLink`, which hands them out
// (so that `node` needs nothing of this module); this is their public home.
pub use crate::node::{
    Class, ClassTraffic, FrameError, HostWords, Port, Report, Service, ServiceId, Traffic,
    HOST_WORDS, MAX_PAYLOAD,
};

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    thread_local! {
        /// What this thread's brackets told the transport: (kind, began).
        static TOLD: RefCell<Vec<(Attending, bool)>> = const { RefCell::new(Vec::new()) };
    }

    fn begin(kind: Attending) {
        TOLD.with(|t| t.borrow_mut().push((kind, true)));
    }

    fn end(kind: Attending) {
        TOLD.with(|t| t.borrow_mut().push((kind, false)));
    }

    fn told() -> Vec<(Attending, bool)> {
        TOLD.with(|t| std::mem::take(&mut *t.borrow_mut()))
    }

    const COMPUTING: Attending = Attending::Computing;

    #[test]
    fn the_phase_end_keeps_the_master_computing_until_it_waits() {
        assert!(set_attending(begin, end));
        told();
        // Outside a node step nothing opens (a fork-join run's release).
        phase_end_reached();
        assert!(kept().is_none());
        assert_eq!(told(), vec![]);

        // The step's wait is over: computing from here, kept for the next
        // share, which takes it over (no end, no second begin).
        at_phase_end(phase_end_reached);
        assert_eq!(told(), vec![(COMPUTING, true)]);
        let share = kept().expect("kept for the next share");
        assert_eq!(told(), vec![]);
        drop(share);
        assert_eq!(told(), vec![(COMPUTING, false)]);

        // A step that never called it (the link's barrier) is covered too.
        at_phase_end(|| ());
        assert_eq!(told(), vec![(COMPUTING, true)]);
        // A wait ends it, reading what came.
        waits();
        assert_eq!(told(), vec![(COMPUTING, false)]);
        assert!(kept().is_none());

        // A share's bracket still open (a step that did not wait) is kept
        // as it is: no second one.
        until_wait(Attend::start(COMPUTING));
        at_phase_end(phase_end_reached);
        assert_eq!(told(), vec![(COMPUTING, true)]);
        waits();
        assert_eq!(told(), vec![(COMPUTING, false)]);

        // After the step, phase_end_reached does nothing again.
        phase_end_reached();
        assert!(kept().is_none());
        assert_eq!(told(), vec![]);
    }
}
