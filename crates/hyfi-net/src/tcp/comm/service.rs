//! How frames for a hyfi-core [`Service`](hyfi_core::link::Service) travel
//! over TCP: as bulk frames whose tag says "service" and names the id
//! ([`service_tag`]). The communication thread hands each to the node's
//! [`ServiceTable`](hyfi_core::link::ServiceTable) (the seam's one table of
//! services and early frames), in the order the frames came: a service's
//! handler runs on the communication thread and must not block.

use hyfi_core::link::{Class, ServiceId};

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
