//! The side of setup of every node but node 0: reach node 0 (retrying
//! until the deadline: node 0 may start last, and a stale rendezvous file is
//! re-read), prove ourselves, open our own mesh listener and say where it
//! is, then link to every lower node and accept every higher one.

use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::bootstrap::Token;
use crate::bootstrap::{JobSpec, Rendezvous};
use crate::error::NetError;
use crate::tcp::refusal::RefusalLog;
use crate::tcp::rendezvous::{self, EntryError};
use crate::tcp::wire::{self, Msg, Purpose};

use super::accept::Acceptor;
use super::addr::is_local;
use super::handshake::{introduce, Gate, HandshakeError};
use super::{configure, Links, HANDSHAKE_WAIT, POLL};

/// Why an attempt to reach a node failed (and will be tried again).
enum Failure {
    /// Nothing to connect to yet: the rendezvous file is not there (yet).
    Waiting { addr: String, why: EntryError },
    /// The TCP connection failed.
    Connect { addr: String, err: std::io::Error },
    /// Connected, but the handshake failed.
    Handshake { addr: String, why: HandshakeError },
}

/// Tries `attempt` until it succeeds, fails for good, or the deadline
/// passes; the error then describes the last failure.
fn reach<T>(
    rank: usize,
    what: &str,
    deadline: Instant,
    timeout: Duration,
    mut attempt: impl FnMut() -> Result<Result<T, Failure>, NetError>,
) -> Result<T, NetError> {
    loop {
        let failure = match attempt()? {
            Ok(t) => return Ok(t),
            Err(f) => f,
        };
        if Instant::now() >= deadline {
            let secs = timeout.as_secs();
            return Err(match failure {
                Failure::Waiting { addr, why } => NetError::Unreachable {
                    rank,
                    what: "the rendezvous file".into(),
                    addr,
                    secs,
                    source: std::io::Error::new(std::io::ErrorKind::TimedOut, why),
                },
                Failure::Connect { addr, err } => NetError::Unreachable {
                    rank,
                    what: what.into(),
                    addr,
                    secs,
                    source: err,
                },
                Failure::Handshake { addr, why } => NetError::Rejected {
                    rank,
                    what: what.into(),
                    addr,
                    secs,
                    source: why,
                },
            });
        }
        std::thread::sleep(POLL * 4);
    }
}

fn tcp_connect(addr: &str) -> Result<TcpStream, Failure> {
    let err = match addr.to_socket_addrs() {
        Ok(mut it) => match it.next() {
            Some(sa) => match TcpStream::connect_timeout(&sa, Duration::from_secs(2)) {
                Ok(s) => return Ok(s),
                Err(e) => e,
            },
            None => {
                std::io::Error::new(std::io::ErrorKind::NotFound, "address resolves to nothing")
            }
        },
        Err(e) => e,
    };
    Err(Failure::Connect {
        addr: addr.to_string(),
        err,
    })
}

/// Connects to node 0 and proves ourselves; returns the connection and the
/// job's token.
fn reach_coordinator(
    spec: &JobSpec,
    deadline: Instant,
    timeout: Duration,
) -> Result<(TcpStream, Token, String), NetError> {
    let rank = spec.rank;
    reach(rank, "the coordinator (node 0)", deadline, timeout, || {
        // Re-read every time: a stale file is replaced by node 0's.
        let (addr, from_file) = match &spec.rendezvous {
            Rendezvous::Coord(a) => (a.clone(), None),
            Rendezvous::File(p) => match rendezvous::read(p, spec.job) {
                Ok(e) => (e.addr, e.token),
                Err(why) => {
                    return Ok(Err(Failure::Waiting {
                        addr: p.display().to_string(),
                        why,
                    }))
                }
            },
        };
        let mut c = match tcp_connect(&addr) {
            Ok(c) => c,
            Err(f) => return Ok(Err(f)),
        };
        let token = match (spec.token, from_file, &spec.rendezvous) {
            (Some(t), _, _) => t,
            (None, Some(t), _) => t,
            (None, None, Rendezvous::File(p)) => {
                return Ok(Err(Failure::Waiting {
                    addr: p.display().to_string(),
                    why: EntryError::NoTokenGiven,
                }))
            }
            (None, None, Rendezvous::Coord(coord)) => {
                // Node 0 made a token and left it where only this user
                // on its host can read it.
                let local = c.peer_addr().is_ok_and(|p| is_local(p.ip()));
                if !local {
                    return Err(NetError::NoToken {
                        rank,
                        coord: coord.clone(),
                    });
                }
                let file = rendezvous::token_file(spec.job);
                match rendezvous::read(&file, spec.job) {
                    Ok(rendezvous::Entry { token: Some(t), .. }) => t,
                    Ok(_) => {
                        return Ok(Err(Failure::Waiting {
                            addr: file.display().to_string(),
                            why: EntryError::NoToken,
                        }))
                    }
                    Err(why) => {
                        return Ok(Err(Failure::Waiting {
                            addr: file.display().to_string(),
                            why,
                        }))
                    }
                }
            }
        };
        // Node 0 gives us HANDSHAKE_WAIT; waiting longer is pointless
        // (and a stale address may lead to something that never answers).
        let until = Instant::now() + HANDSHAKE_WAIT + Duration::from_secs(1);
        match introduce(&mut c, Purpose::Hello, spec, 0, &token, until) {
            Ok(()) => Ok(Ok((c, token, addr))),
            Err(why) => Ok(Err(Failure::Handshake { addr, why })),
        }
    })
}

pub(super) fn member(
    spec: &JobSpec,
    deadline: Instant,
    timeout: Duration,
    log: &Arc<RefusalLog>,
) -> Result<Links, NetError> {
    let (rank, n) = (spec.rank, spec.nodes);
    let (mut c, token, coord) = reach_coordinator(spec, deadline, timeout)?;
    // Listen on the interface that reaches node 0: the job's network.
    let my_ip = c
        .local_addr()
        .map_err(|e| NetError::io("local_addr", e))?
        .ip();
    let mesh = TcpListener::bind((my_ip, 0)).map_err(|e| {
        NetError::io(
            format!("node {rank}: cannot open its mesh listener on {my_ip}"),
            e,
        )
    })?;
    let mesh_port = mesh
        .local_addr()
        .map_err(|e| NetError::io("local_addr", e))?
        .port();
    // Accepting starts before anything waits on other nodes, so no order
    // of arrival can deadlock.
    let acceptor = Acceptor::start(
        &mesh,
        Gate {
            me: rank,
            nodes: n,
            job: spec.job,
            token,
            purpose: Purpose::Mesh,
            log: log.clone(),
        },
        deadline,
    )?;
    let listen = SocketAddr::new(my_ip, mesh_port).to_string();
    wire::write_msg(&mut c, &Msg::Hello { listen }).map_err(|e| {
        NetError::io(
            format!("node {rank}: talking to the coordinator at {coord}"),
            e,
        )
    })?;
    // Node 0 answers once every node has arrived: wait as long as setup may take.
    let left = deadline.saturating_duration_since(Instant::now()) + HANDSHAKE_WAIT;
    c.set_read_timeout(Some(left))
        .map_err(|e| NetError::io("set_read_timeout", e))?;
    let addrs = match wire::read_msg(&mut c) {
        Ok(Msg::Table { addrs }) => addrs,
        Ok(Msg::Refuse { why }) => {
            return Err(NetError::Launch(format!(
                "node {rank}: node 0 refused this node: {why}"
            )))
        }
        Ok(other) => {
            return Err(NetError::Protocol {
                me: rank,
                from: 0,
                why: format!("expected the address table, got {other:?}"),
            })
        }
        Err(e) => {
            return Err(NetError::Unreachable {
                rank,
                what: "the address table from node 0".into(),
                addr: coord,
                secs: timeout.as_secs(),
                source: e,
            })
        }
    };
    if addrs.len() != n {
        return Err(NetError::Protocol {
            me: rank,
            from: 0,
            why: format!("address table has {} entries for {n} nodes", addrs.len()),
        });
    }
    hyfi_core::trace::set_clock_offset(super::clock::measure(&mut c, rank)?);
    configure(&c)?;
    let mut peers: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
    peers[0] = Some(c);
    for (j, addr) in addrs.iter().enumerate().take(rank).skip(1) {
        let what = format!("node {j}");
        let s = reach(rank, &what, deadline, timeout, || {
            let mut s = match tcp_connect(addr) {
                Ok(s) => s,
                Err(f) => return Ok(Err(f)),
            };
            let until = Instant::now() + HANDSHAKE_WAIT + Duration::from_secs(1);
            Ok(
                match introduce(&mut s, Purpose::Mesh, spec, j, &token, until) {
                    Ok(()) => Ok(s),
                    Err(why) => Err(Failure::Handshake {
                        addr: addr.clone(),
                        why,
                    }),
                },
            )
        })?;
        configure(&s)?;
        peers[j] = Some(s);
    }
    let mut expected = n - 1 - rank;
    while expected > 0 {
        let Some(a) = acceptor.next(deadline) else {
            let missing: Vec<usize> = (rank + 1..n).filter(|&r| peers[r].is_none()).collect();
            return Err(NetError::Unreachable {
                rank,
                what: format!(
                    "links from node(s) {}",
                    crate::launch::output::ranges(&missing)
                ),
                addr: format!("port {mesh_port}"),
                secs: timeout.as_secs(),
                source: std::io::Error::new(std::io::ErrorKind::TimedOut, "they never connected"),
            });
        };
        if a.nodes != n || peers[a.rank].is_some() {
            log.refuse(
                format!("node {}", a.rank),
                "a second link, or one for another node count",
            );
            continue;
        }
        configure(&a.stream)?;
        peers[a.rank] = Some(a.stream);
        expected -= 1;
    }
    drop(acceptor);
    Ok(Links {
        rank,
        nodes: n,
        job: spec.job,
        token,
        peers,
        listeners: vec![mesh],
        refused: 0,
        lanes: crate::tcp::lane::Lanes::none(n),
    })
}
