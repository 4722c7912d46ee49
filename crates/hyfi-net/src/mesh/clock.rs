//! Aligning the nodes' clocks, for traces ([`hyfi_core::trace`]): during
//! setup, on the link to node 0, each node measures node 0's clock minus
//! its own, as Cristian's algorithm does: [`ROUNDS`] round trips, and the
//! one with the shortest round trip gives the offset (its error is at most
//! half that round trip: tens of microseconds on a LAN, a few on one host).
//!
//! Done by every job, traced or not: it costs [`ROUNDS`] round trips per
//! node at start-up, and needs no agreement between the nodes on whether
//! they trace.

use std::net::TcpStream;
use std::time::Instant;

use hyfi_core::trace;

use super::HANDSHAKE_WAIT;
use crate::error::NetError;
use crate::wire::{self, Msg};

/// Round trips per node.
pub(super) const ROUNDS: usize = 8;

/// Node 0's side: answers node `rank`'s [`ROUNDS`] readings with its clock.
pub(super) fn serve(s: &mut TcpStream, rank: usize, deadline: Instant) -> Result<(), NetError> {
    let wait = deadline.saturating_duration_since(Instant::now()) + HANDSHAKE_WAIT;
    s.set_read_timeout(Some(wait))
        .map_err(|e| NetError::io("set_read_timeout", e))?;
    for _ in 0..ROUNDS {
        match wire::read_msg(s) {
            Ok(Msg::Clock { .. }) => {}
            Ok(other) => {
                return Err(NetError::Protocol {
                    me: 0,
                    from: rank,
                    why: format!("expected a clock reading, got {other:?}"),
                })
            }
            Err(e) => {
                return Err(NetError::io(
                    format!("node 0: reading node {rank}'s clock reading"),
                    e,
                ))
            }
        }
        wire::write_msg(s, &Msg::Clock { t: trace::now() }).map_err(|e| {
            NetError::io(format!("node 0: answering node {rank}'s clock reading"), e)
        })?;
    }
    s.set_read_timeout(None)
        .map_err(|e| NetError::io("set_read_timeout", e))
}

/// Every other node's side: node 0's clock minus ours (ns), from the
/// round trip that took least.
pub(super) fn measure(c: &mut TcpStream, rank: usize) -> Result<i64, NetError> {
    let mut best = (u64::MAX, 0i64);
    for _ in 0..ROUNDS {
        let t1 = trace::now();
        wire::write_msg(c, &Msg::Clock { t: t1 }).map_err(|e| {
            NetError::io(format!("node {rank}: sending a clock reading to node 0"), e)
        })?;
        let t0 = match wire::read_msg(c) {
            Ok(Msg::Clock { t }) => t,
            Ok(other) => {
                return Err(NetError::Protocol {
                    me: rank,
                    from: 0,
                    why: format!("expected node 0's clock, got {other:?}"),
                })
            }
            Err(e) => {
                return Err(NetError::io(
                    format!("node {rank}: reading node 0's clock"),
                    e,
                ))
            }
        };
        let t2 = trace::now();
        let rtt = t2.saturating_sub(t1);
        if rtt < best.0 {
            best = (rtt, t0 as i64 - (t1 / 2 + t2 / 2) as i64);
        }
    }
    Ok(best.1)
}
