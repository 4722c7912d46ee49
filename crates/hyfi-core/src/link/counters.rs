//! A transport's message counters by class, kept the same way by every
//! transport that has no counters of its own (the in-process link, MPI).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::{Class, ClassTraffic, Traffic};

/// Messages and bytes sent and received, per [`Class`]: relaxed atomic
/// adds, read as a [`Traffic`] ([`NodeLink::traffic`](crate::NodeLink::traffic)).
#[derive(Debug, Default)]
pub struct TrafficCounters {
    /// Index 0 control, 1 bulk.
    sent: [AtomicU64; 2],
    bytes_sent: [AtomicU64; 2],
    received: [AtomicU64; 2],
    bytes_received: [AtomicU64; 2],
}

fn ix(c: Class) -> usize {
    match c {
        Class::Control => 0,
        Class::Bulk => 1,
    }
}

impl TrafficCounters {
    /// Counts a message of `bytes` bytes sent in `class`.
    #[inline]
    pub fn count_sent(&self, class: Class, bytes: usize) {
        self.sent[ix(class)].fetch_add(1, Relaxed);
        self.bytes_sent[ix(class)].fetch_add(bytes as u64, Relaxed);
    }

    /// Counts a message of `bytes` bytes received in `class`.
    #[inline]
    pub fn count_received(&self, class: Class, bytes: usize) {
        self.received[ix(class)].fetch_add(1, Relaxed);
        self.bytes_received[ix(class)].fetch_add(bytes as u64, Relaxed);
    }

    /// The counts so far (no refused connections: these transports have
    /// none).
    pub fn traffic(&self) -> Traffic {
        let class = |i: usize| {
            let g = |a: &AtomicU64| a.load(Relaxed);
            ClassTraffic {
                sent: g(&self.sent[i]),
                bytes_sent: g(&self.bytes_sent[i]),
                received: g(&self.received[i]),
                bytes_received: g(&self.bytes_received[i]),
            }
        };
        Traffic {
            control: class(0),
            bulk: class(1),
            ..Traffic::default()
        }
    }
}
