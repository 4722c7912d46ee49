//! The node's traffic counters, by class.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use hyfi_core::link::{Class, ClassTraffic, Traffic};

/// Counters of one node's traffic.
#[derive(Debug, Default)]
pub struct NetStats {
    /// Control messages sent.
    pub control_sent: AtomicU64,
    /// Control bytes sent (frames included).
    pub control_bytes_sent: AtomicU64,
    /// Control messages received.
    pub control_received: AtomicU64,
    /// Control bytes received.
    pub control_bytes_received: AtomicU64,
    /// Bulk frames sent.
    pub bulk_sent: AtomicU64,
    /// Bulk bytes sent.
    pub bulk_bytes_sent: AtomicU64,
    /// Bulk frames received.
    pub bulk_received: AtomicU64,
    /// Bulk bytes received.
    pub bulk_bytes_received: AtomicU64,
    /// Connections refused (garbage, wrong token, stale job), from the
    /// first: those refused while the mesh was set up included.
    pub refused: AtomicU64,
    /// Links with a shared-memory lane.
    pub lanes: AtomicU64,
    /// Bells rung on lanes: times a sleeping peer was woken (shared with
    /// the lanes' rings, which count them).
    pub bells: Arc<AtomicU64>,
    /// Turns of the communication thread woken by its timer that found a
    /// lane's ring with bytes nobody rang for or was reading
    /// ([`Traffic::unannounced`]).
    pub unannounced: AtomicU64,
}

impl NetStats {
    /// The counters now, by class (what [`hyfi_core::NodeLink::traffic`]
    /// reports).
    pub fn snapshot(&self) -> Traffic {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        // `Traffic` is non-exhaustive: built from its default here.
        let mut t = Traffic::default();
        t.control = ClassTraffic {
            sent: g(&self.control_sent),
            bytes_sent: g(&self.control_bytes_sent),
            received: g(&self.control_received),
            bytes_received: g(&self.control_bytes_received),
        };
        t.bulk = ClassTraffic {
            sent: g(&self.bulk_sent),
            bytes_sent: g(&self.bulk_bytes_sent),
            received: g(&self.bulk_received),
            bytes_received: g(&self.bulk_bytes_received),
        };
        t.refused = g(&self.refused);
        t.shared_memory_links = g(&self.lanes);
        t.wakes = g(&self.bells);
        t.unannounced = g(&self.unannounced);
        t
    }

    /// Counts a frame of `bytes` sent in `class`.
    pub(super) fn count_sent(&self, class: Class, bytes: usize) {
        let (n, b) = match class {
            Class::Control => (&self.control_sent, &self.control_bytes_sent),
            Class::Bulk => (&self.bulk_sent, &self.bulk_bytes_sent),
        };
        n.fetch_add(1, Ordering::Relaxed);
        b.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Counts a frame of `bytes` received in `class`.
    pub(super) fn count_received(&self, class: Class, bytes: u64) {
        let (n, b) = match class {
            Class::Control => (&self.control_received, &self.control_bytes_received),
            Class::Bulk => (&self.bulk_received, &self.bulk_bytes_received),
        };
        n.fetch_add(1, Ordering::Relaxed);
        b.fetch_add(bytes, Ordering::Relaxed);
    }
}

impl std::fmt::Display for NetStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.snapshot().fmt(f)
    }
}
