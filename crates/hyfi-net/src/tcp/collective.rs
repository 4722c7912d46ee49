//! Cross-node collectives over TCP: the seam's barrier and all-reduce
//! ([`hyfi_core::link::collective`], where the algorithm and its fixed
//! combining order are written once), with their messages carried as this
//! transport's own control frames (`Msg::Up`, `Msg::Down`) and filed in the
//! node's inbox, where a waiting filthread suspends.

use std::sync::atomic::{AtomicU64, Ordering};

use hyfi_core::link::collective::{self, Channel, Dir as CollDir, SizeMismatch};

use crate::error::NetError;
use crate::tcp::comm::{Comm, Dir};

/// Sequence numbers of collectives: every node calls them in the same order.
#[derive(Default)]
pub struct Collectives {
    seq: AtomicU64,
}

/// The seam's channel over a node's [`Comm`].
struct Tcp<'a>(&'a Comm);

impl From<SizeMismatch> for NetError {
    fn from(e: SizeMismatch) -> NetError {
        NetError::Protocol {
            me: e.me,
            from: e.from,
            why: format!(
                "reduction value of {} bytes, expected {}: every node must reduce the same \
                 variables in the same order",
                e.got, e.expected
            ),
        }
    }
}

impl Channel for Tcp<'_> {
    type Error = NetError;
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn nodes(&self) -> usize {
        self.0.nodes()
    }
    fn send(&self, to: usize, seq: u64, dir: CollDir, data: &[u8]) -> Result<(), NetError> {
        // `Msg::Up`/`Msg::Down`'s frame, made from the borrowed value.
        let frame = crate::tcp::wire::collective_frame(dir == CollDir::Up, seq, data);
        self.0.send_collective_frame(to, frame)
    }
    fn recv(&self, from: usize, seq: u64, dir: CollDir) -> Result<Vec<u8>, NetError> {
        let dir = match dir {
            CollDir::Up => Dir::Up,
            CollDir::Down => Dir::Down,
        };
        self.0.recv_coll(from, seq, dir)
    }
}

impl Collectives {
    /// All-reduce `value` with `combine`; on return every node holds the result.
    pub fn allreduce(
        &self,
        comm: &Comm,
        value: &mut [u8],
        combine: &mut dyn FnMut(&mut [u8], &[u8]),
    ) -> Result<(), NetError> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        hyfi_core::link::attending_collective(|| {
            collective::allreduce(&Tcp(comm), seq, value, combine)
        })
    }

    /// [`collective::allreduce_vec`]: values of any length, gathered or
    /// combined.
    pub fn allreduce_vec(
        &self,
        comm: &Comm,
        value: &mut Vec<u8>,
        combine: &mut dyn FnMut(&mut Vec<u8>, &[u8]),
    ) -> Result<(), NetError> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        // Pieces that come between two steps ring no bell (the waiter reads
        // them at its next step).
        hyfi_core::link::attending_collective(|| {
            collective::allreduce_vec(&Tcp(comm), seq, value, combine)
        })
    }

    /// Returns once every node has entered the barrier.
    pub fn barrier(&self, comm: &Comm) -> Result<(), NetError> {
        self.allreduce(comm, &mut [], &mut |_, _| {})
    }
}
