//! Node 0's side of setup: publish where it listens, admit every other
//! node once it proved it knows the token, check that they agree on the
//! job's shape, then send everyone the table of mesh listener addresses.
//! Node 0's link to node *i* is the connection *i* opened.

use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::bootstrap::random_token;
use crate::bootstrap::JobSpec;
use crate::error::NetError;
use crate::tcp::refusal::RefusalLog;
use crate::tcp::wire::{self, Msg, Purpose};

use super::accept::Acceptor;
use super::addr::bind_coordinator;
use super::handshake::Gate;
use super::{configure, Links};

pub(super) fn coordinator(
    spec: &JobSpec,
    deadline: Instant,
    timeout: Duration,
    log: &Arc<RefusalLog>,
) -> Result<Links, NetError> {
    let n = spec.nodes;
    let token = spec.token.unwrap_or_else(random_token);
    // Dropped (the file removed) when this function returns, either way.
    let (listener, _published) = bind_coordinator(spec, &token)?;
    let acceptor = Acceptor::start(
        &listener,
        Gate {
            me: 0,
            nodes: n,
            job: spec.job,
            token,
            purpose: Purpose::Hello,
            log: log.clone(),
        },
        deadline,
    )?;
    let mut peers: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
    let mut addrs = vec![String::new(); n];
    let mut arrived = 1;
    let refuse_all = |peers: &mut Vec<Option<TcpStream>>, why: &str| {
        for s in peers.iter_mut().flatten() {
            let _ = wire::write_msg(
                s,
                &Msg::Refuse {
                    why: why.to_string(),
                },
            );
        }
    };
    while arrived < n {
        let Some(mut a) = acceptor.next(deadline) else {
            // As ranges: the list goes to every node that did arrive.
            let missing: Vec<usize> = (1..n).filter(|&r| peers[r].is_none()).collect();
            let e = NetError::MissingNodes {
                arrived,
                nodes: n,
                missing: crate::launch::output::ranges(&missing),
                secs: timeout.as_secs(),
            };
            refuse_all(&mut peers, &e.to_string());
            return Err(e);
        };
        // From here on the peer proved it knows the token: its mistakes are
        // the job's.
        if a.nodes != n {
            let e = NetError::NodeCountMismatch {
                rank: a.rank,
                theirs: a.nodes,
                ours: n,
            };
            let _ = wire::write_msg(&mut a.stream, &Msg::Refuse { why: e.to_string() });
            refuse_all(&mut peers, &e.to_string());
            return Err(e);
        }
        if a.rank == 0 || a.rank >= n || peers[a.rank].is_some() {
            let e = NetError::DuplicateRank { rank: a.rank };
            let _ = wire::write_msg(&mut a.stream, &Msg::Refuse { why: e.to_string() });
            refuse_all(&mut peers, &e.to_string());
            return Err(e);
        }
        configure(&a.stream)?;
        addrs[a.rank] = a.listen;
        peers[a.rank] = Some(a.stream);
        arrived += 1;
    }
    drop(acceptor);
    for s in peers.iter_mut().flatten() {
        wire::write_msg(
            s,
            &Msg::Table {
                addrs: addrs.clone(),
            },
        )
        .map_err(|e| NetError::io("node 0: sending the address table", e))?;
    }
    for (rank, s) in peers.iter_mut().enumerate() {
        if let Some(s) = s {
            super::clock::serve(s, rank, deadline)?;
        }
    }
    Ok(Links {
        rank: 0,
        nodes: n,
        job: spec.job,
        token,
        peers,
        listeners: vec![listener],
        refused: 0,
        lanes: crate::tcp::lane::Lanes::none(n),
    })
}
