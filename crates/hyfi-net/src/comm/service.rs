//! The service table: how frames for a registered hyfi-core [`Service`]
//! reach it.
//!
//! A layer above the transport (the DSM, cross-node stealing) registers a
//! [`Service`] under a [`ServiceId`]; its peers' messages travel as bulk
//! frames whose tag says "service" and names the id ([`service_tag`]). The
//! communication thread hands each such frame to the service, in the order
//! the frames came, while it holds the table's lock: a service's handler
//! runs on the communication thread and must not block. Frames that come
//! before their service is installed (a fast peer) wait in its slot and are
//! handed over, in order, when it is.
//!
//! A handler's failure ends the node (it means the peers no longer agree
//! on the protocol): it is a [`ServiceError`], said with the service.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use hyfi_core::link::{Class, FrameError, Service, ServiceId};

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

/// Why a service frame could not be handled, or a service not installed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ServiceError {
    /// A frame names a service number no [`ServiceId`] has.
    #[error("a frame for service {number}, which is none")]
    NoSuchService {
        /// The number in the frame's tag.
        number: u8,
    },
    /// The service's handler refused a frame: its own error (which names
    /// the layer and the sender), kept as the source.
    #[error("{source}")]
    Failed {
        /// The service.
        service: ServiceId,
        /// What its handler said.
        #[source]
        source: FrameError,
    },
    /// A second service under an id already taken.
    #[error("{service} was installed twice on this node")]
    Twice {
        /// The id.
        service: ServiceId,
    },
}

/// Hands one frame to `service`: the one place that turns what
/// [`Service::frame`] returns into this layer's error.
fn frame_to(
    service: &dyn Service,
    id: ServiceId,
    from: usize,
    payload: Vec<u8>,
) -> Result<(), ServiceError> {
    service
        .frame(from, payload)
        .map_err(|source| ServiceError::Failed {
            service: id,
            source,
        })
}

enum Slot {
    /// Frames that came before the service was installed.
    Pending(Vec<(usize, Vec<u8>)>),
    Ready(Arc<dyn Service>),
}

impl Default for Slot {
    fn default() -> Self {
        Slot::Pending(Vec::new())
    }
}

/// A node's services, by id.
#[derive(Default)]
pub(super) struct Services {
    slots: Mutex<HashMap<ServiceId, Slot>>,
}

impl Services {
    /// Hands a service frame to the service, or keeps it until one is
    /// installed. The slot's lock is held while the handler runs, so frames
    /// reach the service in the order they came.
    pub(super) fn to_service(
        &self,
        from: usize,
        tag: u64,
        payload: Vec<u8>,
    ) -> Result<(), ServiceError> {
        let number = split_service_tag(tag).0;
        let id = ServiceId::from_number(number).ok_or(ServiceError::NoSuchService { number })?;
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let slot = slots.entry(id).or_default();
        match slot {
            Slot::Pending(v) => {
                v.push((from, payload));
                Ok(())
            }
            Slot::Ready(s) => frame_to(&**s, id, from, payload),
        }
    }

    /// Installs `service` under `id` and hands it the frames that came
    /// before, in order (under the lock, so none overtakes them). An error
    /// from one of those frames is the handler's ([`ServiceError::Failed`]),
    /// and the service stays installed.
    pub(super) fn install(
        &self,
        id: ServiceId,
        service: Arc<dyn Service>,
    ) -> Result<(), ServiceError> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let slot = slots.entry(id).or_default();
        if let Slot::Ready(_) = slot {
            return Err(ServiceError::Twice { service: id });
        }
        let Slot::Pending(early) = std::mem::replace(slot, Slot::Ready(service.clone())) else {
            unreachable!("checked above")
        };
        for (from, payload) in early {
            frame_to(&*service, id, from, payload)?;
        }
        Ok(())
    }

    /// The services installed so far.
    pub(super) fn ready(&self) -> Vec<Arc<dyn Service>> {
        self.slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter_map(|slot| match slot {
                Slot::Ready(s) => Some(s.clone()),
                Slot::Pending(_) => None,
            })
            .collect()
    }

    /// Forgets every service. Services hold a `Sender`, which holds the
    /// inbox, which holds them: the node's close breaks the cycle so.
    pub(super) fn clear(&self) {
        self.slots.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}
