//! Where received frames wait for their takers: collectives, bulk
//! frames, services; waiting threads poll, then sleep.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use hyfi_core::link::{Class, Service, ServiceId};

use crate::spmd::Steps;

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
    pub(super) services: Mutex<HashMap<ServiceId, ServiceSlot>>,
}

/// Tag bit of bulk frames that go to one of the node's [`Service`]s
/// instead of the inbox; bits 56..63 name the service ([`ServiceId`]),
/// bit 0 says the frame was sent as [`Class::Control`] (so the receiver
/// counts it as such); the other bits are zero.
pub(crate) const SERVICE_TAG: u64 = 1 << 63;

/// The tag of a frame for service `id` sent in `class`.
pub(crate) const fn service_tag(id: ServiceId, class: Class) -> u64 {
    SERVICE_TAG | (((id.number() & 0x7f) as u64) << 56) | matches!(class, Class::Control) as u64
}

/// The service number and the class of a service tag.
pub(crate) const fn split_service_tag(tag: u64) -> (u8, Class) {
    let class = if tag & 1 == 1 {
        Class::Control
    } else {
        Class::Bulk
    };
    (((tag >> 56) & 0x7f) as u8, class)
}

pub(super) enum ServiceSlot {
    /// Frames that came before the service was installed.
    Pending(Vec<(usize, Vec<u8>)>),
    Ready(Arc<dyn Service>),
}

impl Default for ServiceSlot {
    fn default() -> Self {
        ServiceSlot::Pending(Vec::new())
    }
}

#[derive(Default)]
pub(super) struct InboxState {
    pub(super) coll: HashMap<(usize, u64, Dir), Vec<u8>>,
    pub(super) bulk: HashMap<usize, std::collections::VecDeque<(u64, Vec<u8>)>>,
    pub(super) failed: Option<String>,
    pub(super) byes: usize,
    /// Peers that said `Bye`: they send nothing more but answers to
    /// requests, so a wait for anything else from them would never end.
    pub(super) gone: std::collections::HashSet<usize>,
    /// This node's SPMD steps and its ring predecessor's (see `spmd`).
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
            self.cv.notify_all();
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
    /// Records the first failure; returns true if it was the first.
    pub(super) fn fail(&self, why: String) -> bool {
        if self.exiting.load(Ordering::SeqCst) {
            return false;
        }
        let mut first = false;
        let text = why.clone();
        self.put(|s| {
            first = s.failed.is_none();
            if first {
                s.failed = Some(why);
            }
        });
        if first {
            for s in self.ready_services() {
                s.failed(&text);
            }
        }
        first
    }
    /// The services installed so far.
    pub(super) fn ready_services(&self) -> Vec<Arc<dyn Service>> {
        self.services
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter_map(|slot| match slot {
                ServiceSlot::Ready(s) => Some(s.clone()),
                ServiceSlot::Pending(_) => None,
            })
            .collect()
    }
    /// Hands a service frame to the service, or keeps it until one is
    /// installed. The slot's lock is held while the handler runs, so frames
    /// reach the service in the order they came.
    pub(super) fn to_service(&self, from: usize, tag: u64, payload: Vec<u8>) -> Result<(), String> {
        let n = split_service_tag(tag).0;
        let id = ServiceId::from_number(n)
            .ok_or_else(|| format!("a frame for service {n}, which is none"))?;
        let mut slots = self.services.lock().unwrap_or_else(|e| e.into_inner());
        let slot = slots.entry(id).or_default();
        match slot {
            ServiceSlot::Pending(v) => {
                v.push((from, payload));
                Ok(())
            }
            ServiceSlot::Ready(s) => s.frame(from, payload),
        }
    }
    /// Peer `from` said `Bye` after `steps` steps: an error if this node
    /// already went further.
    pub(super) fn bye(
        &self,
        from: usize,
        steps: u64,
        last: Option<hyfi_core::Step>,
    ) -> Result<(), String> {
        let mut r = Ok(());
        self.put(|s| {
            s.byes += 1;
            s.gone.insert(from);
            if let Some(st) = s.steps.as_mut() {
                r = st.on_bye(from, steps, last);
            }
        });
        // A wrong goodbye fails the node (which wakes the services with
        // why); a right one only ends the services' waits for that peer.
        if r.is_ok() {
            for s in self.ready_services() {
                s.peer_left(from);
            }
        }
        r
    }
    /// Waits until `take` finds its message (or the node fails). On a
    /// filthread the filthread suspends and its server thread runs other
    /// work meanwhile; elsewhere the calling thread blocks.
    pub(super) fn wait<T>(
        &self,
        mut take: impl FnMut(&mut InboxState) -> Option<Result<T, String>>,
    ) -> Result<T, String> {
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
                        got = Some(Err(f.clone()));
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
        // Poll a little first: replies on a fast network come back sooner
        // than a sleeping thread can be woken.
        let spin_until = Instant::now()
            + if hyfi_core::sleep::own_cpu() {
                hyfi_core::sleep::OWN_CPU_POLL
            } else {
                SPIN
            };
        loop {
            let seen = self.generation.load(Ordering::Acquire);
            {
                let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(v) = take(&mut s) {
                    return v;
                }
                if let Some(f) = &s.failed {
                    return Err(f.clone());
                }
            }
            while self.generation.load(Ordering::Acquire) == seen && Instant::now() < spin_until {
                std::thread::yield_now();
            }
            if Instant::now() >= spin_until {
                break;
            }
        }
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(v) = take(&mut s) {
                return v;
            }
            if let Some(f) = &s.failed {
                return Err(f.clone());
            }
            s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }
    /// The failure, if the node has failed.
    pub fn failure(&self) -> Option<String> {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .failed
            .clone()
    }
}
