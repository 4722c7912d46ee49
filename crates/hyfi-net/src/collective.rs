//! Cross-node collectives: the barrier and the cross-node step of
//! hierarchical reductions (paper §3.4), as a binomial tree over the ranks.
//!
//! Up the tree, node *r* combines its children's values into its own in a
//! fixed order (`acc = combine(acc, child)` for children `r+1, r+2, r+4, ...`),
//! then sends the result to its parent; node 0 ends with the combination of
//! every node's value, and sends it back down the same tree. The combining
//! order depends only on the node count, so a given configuration reproduces
//! its result bit for bit. `log2(N)` message latencies each way.
//!
//! When N is a power of two, the same combination is computed by recursive
//! doubling instead: at stage `m = 1, 2, 4, ...` node *r* exchanges its
//! value with node `r ^ m`, and both compute `combine(lower, upper)` (the
//! value of the lower-numbered group as the accumulator). That is the
//! binomial tree's association, `((v0∘v1)∘(v2∘v3))...`, on every node, so
//! results are bit-identical to the tree's; it costs `log2(N)` latencies in
//! all instead of `2·log2(N)` (one exchange instead of a round trip on two
//! nodes, as MPI_Allreduce does).

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
        if n.is_power_of_two() {
            return Self::doubling(comm, seq, value, combine);
        }
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

    /// All-reduce by recursive doubling (N a power of two): see the module docs.
    fn doubling(
        comm: &Comm,
        seq: u64,
        value: &mut [u8],
        combine: &mut dyn FnMut(&mut [u8], &[u8]),
    ) -> Result<(), NetError> {
        let (r, n) = (comm.rank(), comm.nodes());
        let mut m = 1usize;
        while m < n {
            let partner = r ^ m;
            comm.send(
                partner,
                &Msg::Up {
                    seq,
                    data: value.to_vec(),
                },
            )?;
            let mut d = comm.recv_coll(partner, seq, Dir::Up)?;
            if d.len() != value.len() {
                return Err(NetError::Protocol {
                    me: r,
                    from: partner,
                    why: format!(
                        "reduction value of {} bytes, expected {}: every node must reduce the same variables in the same order",
                        d.len(),
                        value.len()
                    ),
                });
            }
            if r < partner {
                combine(value, &d);
            } else {
                combine(&mut d, value);
                value.copy_from_slice(&d);
            }
            m <<= 1;
        }
        Ok(())
    }

    /// Returns once every node has entered the barrier.
    pub fn barrier(&self, comm: &Comm) -> Result<(), NetError> {
        self.allreduce(comm, &mut [], &mut |_, _| {})
    }
}
