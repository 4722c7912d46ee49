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
use crate::tcp::wire::{self, Msg};

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

#[cfg(test)]
mod tests {
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    #[test]
    fn one_host_measures_no_offset() {
        // Both ends read the same clock: the offset found is within the
        // shortest round trip, whatever the load (a loaded machine only
        // makes every round trip longer, and the shortest is kept).
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            super::serve(&mut s, 1, Instant::now() + Duration::from_secs(10))
        });
        let mut c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let t = Instant::now();
        let offset = super::measure(&mut c, 1).unwrap();
        let whole = t.elapsed().as_nanos() as i64;
        server.join().unwrap().unwrap();
        assert!(
            offset.abs() <= whole,
            "offset {offset} ns within {whole} ns"
        );
    }

    #[test]
    fn a_peer_that_says_something_else_is_a_protocol_error() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let peer = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let _ = crate::tcp::wire::read_msg(&mut s);
            crate::tcp::wire::write_msg(&mut s, &crate::tcp::wire::Msg::Heartbeat).unwrap();
        });
        let mut c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let e = super::measure(&mut c, 3).unwrap_err();
        peer.join().unwrap();
        assert!(e.to_string().contains("clock"), "{e}");
    }
}
