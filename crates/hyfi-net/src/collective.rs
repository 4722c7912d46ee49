//! Cross-node collectives: the barrier and the cross-node step of
//! hierarchical reductions (paper §3.4), as a binomial tree over the ranks.
//!
//! Up the tree, node *r* combines its children's values into its own in a
//! fixed order (`acc = combine(acc, child)` for children `r+1, r+2, r+4, ...`),
//! then sends the result to its parent; node 0 ends with the combination of
//! every node's value, and sends it back down the same tree. The combining
//! order depends only on the node count, so a given configuration reproduces
//! its result bit for bit. `log2(N)` message latencies each way.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::comm::{Comm, Dir};
use crate::error::NetError;
use crate::wire::Msg;

/// Sequence numbers of collectives: every node calls them in the same order.
#[derive(Default)]
pub struct Collectives {
    seq: AtomicU64,
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
        let (r, n) = (comm.rank(), comm.nodes());
        let mut mask = 1usize;
        while mask < n {
            if r & mask != 0 {
                comm.send(
                    r - mask,
                    &Msg::Up {
                        seq,
                        data: value.to_vec(),
                    },
                )?;
                break;
            }
            let child = r + mask;
            if child < n {
                let d = comm.recv_coll(child, seq, Dir::Up)?;
                if d.len() != value.len() {
                    return Err(NetError::Protocol {
                        me: r,
                        from: child,
                        why: format!(
                            "reduction value of {} bytes, expected {}: every node must reduce the same variables in the same order",
                            d.len(),
                            value.len()
                        ),
                    });
                }
                combine(value, &d);
            }
            mask <<= 1;
        }
        if r != 0 {
            let parent = r & (r - 1); // r minus its lowest set bit
            let d = comm.recv_coll(parent, seq, Dir::Down)?;
            if d.len() != value.len() {
                return Err(NetError::Protocol {
                    me: r,
                    from: parent,
                    why: "result of the wrong size".into(),
                });
            }
            value.copy_from_slice(&d);
        }
        // Children of r: r + m for every power of two m below r's lowest set
        // bit (all of them for node 0), largest subtree first.
        let low = if r == 0 {
            n.next_power_of_two()
        } else {
            r & r.wrapping_neg()
        };
        let mut m = low >> 1;
        while m > 0 {
            if r + m < n {
                comm.send(
                    r + m,
                    &Msg::Down {
                        seq,
                        data: value.to_vec(),
                    },
                )?;
            }
            m >>= 1;
        }
        Ok(())
    }

    /// Returns once every node has entered the barrier.
    pub fn barrier(&self, comm: &Comm) -> Result<(), NetError> {
        self.allreduce(comm, &mut [], &mut |_, _| {})
    }
}
