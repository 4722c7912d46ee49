//! The table of a node's services: how frames for a registered
//! [`Service`] reach it, for every transport.
//!
//! A transport hands each frame it receives for a service to
//! [`ServiceTable::deliver`], on its delivery thread, in the order the frames
//! came. The handler runs under the table's lock, so frames reach the service
//! in that order even if two threads deliver. Frames that come before their
//! service is registered (a fast peer: node 1's first page request can
//! arrive before node 0's `Dsm::new` returns) wait in the service's slot
//! and are handed over, in order, when it is ([`ServiceTable::install`]).
//!
//! A handler's failure ends the node (the peers no longer agree on the
//! protocol): it comes back as a [`ServiceError`], said with the service.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use super::{FrameError, Service, ServiceId};

/// Why a service frame could not be handled, or a service not installed.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The service's handler refused a frame: its own error (which names
    /// the layer and the sender), kept as the source.
    #[error("{source}")]
    Failed {
        /// The service.
        service: ServiceId,
        /// The node the frame came from.
        from: usize,
        /// What its handler said.
        #[source]
        source: FrameError,
    },
    /// A second service under an id already taken (two layers chose one
    /// number, or one layer was set up twice on a link).
    #[error("{service} was installed twice on this node (service number {number} is taken)", number = service.number())]
    Twice {
        /// The id.
        service: ServiceId,
    },
}

enum Slot {
    /// Frames that came before the service was installed.
    Pending(Vec<(usize, Vec<u8>)>),
    Ready(ServiceId, Arc<dyn Service>),
}

impl Default for Slot {
    fn default() -> Self {
        Slot::Pending(Vec::new())
    }
}

/// A node's services, by number; every transport keeps one.
#[derive(Default)]
pub struct ServiceTable {
    slots: Mutex<HashMap<u8, Slot>>,
    /// The installed services again, under a lock of their own that no
    /// handler runs under: a failure reaches every service at once even
    /// while one of them is stuck in a handler (which holds `slots`).
    installed: Mutex<Vec<Arc<dyn Service>>>,
}

impl std::fmt::Debug for ServiceTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let slots = self.lock();
        let mut ready: Vec<u8> = (slots.iter())
            .filter_map(|(n, s)| matches!(s, Slot::Ready(..)).then_some(*n))
            .collect();
        ready.sort_unstable();
        f.debug_struct("ServiceTable")
            .field("ready", &ready)
            .finish()
    }
}

/// Names of the services registered in this process, by number, so that a
/// number that came over the wire is said by name ([`ServiceId::from_number`]).
static NAMES: Mutex<[Option<&'static str>; 128]> = Mutex::new([None; 128]);

/// The name service `number` was registered under in this process.
pub(crate) fn registered_name(number: u8) -> Option<&'static str> {
    NAMES.lock().unwrap_or_else(|e| e.into_inner())[usize::from(number) & 127]
}

impl ServiceTable {
    /// An empty table.
    pub fn new() -> ServiceTable {
        ServiceTable::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u8, Slot>> {
        // A handler that panicked poisons the lock; the table itself is
        // consistent (a slot is replaced whole), and the panic already
        // fails the node.
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands a frame from node `from` to service `service`, or keeps it
    /// until the service is installed.
    pub fn deliver(&self, from: usize, service: u8, payload: Vec<u8>) -> Result<(), ServiceError> {
        let mut slots = self.lock();
        match slots.entry(service).or_default() {
            Slot::Pending(v) => {
                v.push((from, payload));
                Ok(())
            }
            Slot::Ready(id, s) => frame_to(&**s, *id, from, payload),
        }
    }

    /// Installs `service` under `id` and hands it the frames that came
    /// before, in order (under the lock, so none overtakes them). An error
    /// from one of those frames is the handler's ([`ServiceError::Failed`]),
    /// and the service stays installed.
    pub fn install(&self, id: ServiceId, service: Arc<dyn Service>) -> Result<(), ServiceError> {
        let mut slots = self.lock();
        let slot = slots.entry(id.number()).or_default();
        if let Slot::Ready(..) = slot {
            return Err(ServiceError::Twice { service: id });
        }
        NAMES.lock().unwrap_or_else(|e| e.into_inner())[usize::from(id.number())] = Some(id.name());
        (self.installed.lock().unwrap_or_else(|e| e.into_inner())).push(service.clone());
        let Slot::Pending(early) = std::mem::replace(slot, Slot::Ready(id, service.clone())) else {
            unreachable!("checked above")
        };
        for (from, payload) in early {
            frame_to(&*service, id, from, payload)?;
        }
        Ok(())
    }

    /// The services installed so far.
    pub fn ready(&self) -> Vec<Arc<dyn Service>> {
        self.installed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Tells every installed service that the node failed.
    pub fn fail_all(&self, why: &str) {
        for s in self.ready() {
            s.failed(why);
        }
    }

    /// Tells every installed service that `peer`'s program ended.
    pub fn peer_left(&self, peer: usize) {
        for s in self.ready() {
            s.peer_left(peer);
        }
    }

    /// Forgets every service. Services often hold the node's port, which
    /// holds the transport, which holds this table: a node's close breaks
    /// the cycle so.
    pub fn clear(&self) {
        self.lock().clear();
        self.installed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

/// Hands one frame to `service`: the one place that turns what
/// [`Service::frame`] returns into the table's error.
fn frame_to(
    service: &dyn Service,
    id: ServiceId,
    from: usize,
    payload: Vec<u8>,
) -> Result<(), ServiceError> {
    (service.frame(from, payload)).map_err(|source| ServiceError::Failed {
        service: id,
        from,
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// Records frames; its handler can be made to wait on a channel.
    #[derive(Default)]
    struct Rec {
        got: Mutex<Vec<(usize, Vec<u8>)>>,
        failed: Mutex<Option<String>>,
        hold: Mutex<Option<mpsc::Receiver<()>>>,
    }

    impl Service for Rec {
        fn frame(&self, from: usize, payload: Vec<u8>) -> Result<(), FrameError> {
            if payload == b"hold" {
                let rx = self.hold.lock().unwrap().take();
                if let Some(rx) = rx {
                    let _ = rx.recv();
                }
            }
            if payload == b"bad" {
                return Err(format!("a bad frame from node {from}").into());
            }
            self.got.lock().unwrap().push((from, payload));
            Ok(())
        }
        fn failed(&self, why: &str) {
            *self.failed.lock().unwrap() = Some(why.to_string());
        }
    }

    const ID: ServiceId = ServiceId::new(42, "a test service");

    #[test]
    fn early_frames_reach_the_service_in_order_and_errors_name_it() {
        let t = ServiceTable::new();
        t.deliver(1, 42, b"a".to_vec()).unwrap();
        t.deliver(2, 42, b"b".to_vec()).unwrap();
        let rec = Arc::new(Rec::default());
        t.install(ID, rec.clone()).unwrap();
        t.deliver(1, 42, b"c".to_vec()).unwrap();
        let got = rec.got.lock().unwrap().clone();
        assert_eq!(
            got,
            vec![(1, b"a".to_vec()), (2, b"b".to_vec()), (1, b"c".to_vec())]
        );
        let e = t.deliver(3, 42, b"bad".to_vec()).unwrap_err();
        assert!(matches!(e, ServiceError::Failed { from: 3, .. }), "{e}");
        assert_eq!(e.to_string(), "a bad frame from node 3");
        let e = t.install(ID, Arc::new(Rec::default())).unwrap_err();
        assert!(e.to_string().contains("installed twice"), "{e}");
        assert_eq!(ServiceId::from_number(42).unwrap().name(), "a test service");
    }

    #[test]
    fn a_failure_reaches_every_service_while_a_handler_is_stuck() {
        let t = Arc::new(ServiceTable::new());
        let rec = Arc::new(Rec::default());
        let (tx, rx) = mpsc::channel();
        *rec.hold.lock().unwrap() = Some(rx);
        t.install(ID, rec.clone()).unwrap();
        let t2 = t.clone();
        let stuck = std::thread::spawn(move || t2.deliver(1, 42, b"hold".to_vec()));
        // Wait until the handler holds the table (it has taken its channel).
        while rec.hold.lock().unwrap().is_some() {
            std::thread::yield_now();
        }
        t.fail_all("node 0: a peer was lost");
        assert_eq!(
            rec.failed.lock().unwrap().as_deref(),
            Some("node 0: a peer was lost")
        );
        tx.send(()).unwrap();
        stuck.join().unwrap().unwrap();
    }
}
