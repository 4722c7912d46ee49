//! Opening the full mesh of TCP connections, before the communication
//! thread starts (plain blocking sockets, every wait bounded).
//!
//! 1. Node 0 (the coordinator) listens at the rendezvous address, or binds
//!    any port and publishes `host:port` in the rendezvous file.
//! 2. Every other node binds its own mesh listener, connects to node 0
//!    (retrying until the deadline: node 0 may start last), presents the
//!    handshake and says where its listener is.
//! 3. Once all have arrived, node 0 sends everyone the table of listener
//!    addresses and the job's token. Node 0's link to node *i* is the
//!    connection *i* opened.
//! 4. Node *i* connects to every node *j* with `0 < j < i`, and accepts from
//!    every *j > i*. Every link opens with the handshake, token included.
//!
//! A connection whose handshake is wrong (garbage, another job, a wrong
//! token, another protocol version) is logged and dropped; setup goes on.
//! A node count that disagrees with node 0's, or a rank claimed twice, ends
//! setup on every node with an error that says what to check.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::bootstrap::{JobSpec, Rendezvous, Token};
use crate::error::NetError;
use crate::wire::{self, Handshake, Msg, Purpose, HANDSHAKE_LEN};

/// The established mesh.
pub struct Links {
    /// This node's rank.
    pub rank: usize,
    /// Number of nodes.
    pub nodes: usize,
    /// Job id.
    pub job: u64,
    /// The token every link presented.
    pub token: Token,
    /// One connection per other node (`None` at this node's own index).
    pub peers: Vec<Option<TcpStream>>,
    /// Listeners kept open during the run, so that stray connections are
    /// refused (and logged) instead of hanging in the backlog.
    pub listeners: Vec<TcpListener>,
}

/// A refused connection is worth a line on stderr (and in the log): it is
/// an attack, a misconfigured node, or a node of another job.
macro_rules! refused {
    ($($arg:tt)*) => {{
        let msg = format!($($arg)*);
        tracing::warn!("{msg}");
        eprintln!("hyfi: {msg}");
    }};
}

const POLL: Duration = Duration::from_millis(5);
const HANDSHAKE_WAIT: Duration = Duration::from_secs(10);

/// Opens the mesh for `spec`, giving up after `timeout`.
pub fn connect(spec: &JobSpec, timeout: Duration) -> Result<Links, NetError> {
    let deadline = Instant::now() + timeout;
    if spec.rank == 0 {
        coordinator(spec, deadline, timeout)
    } else {
        member(spec, deadline, timeout)
    }
}

fn bind_coordinator(spec: &JobSpec) -> Result<TcpListener, NetError> {
    match &spec.rendezvous {
        Rendezvous::Coord(addr) => {
            let l = TcpListener::bind(addr.as_str()).or_else(|e| {
                // The name may resolve to an address of another interface
                // than the one we are on: listen on all of them, same port.
                let port = addr.rsplit(':').next().and_then(|p| p.parse::<u16>().ok());
                match port {
                    Some(p) => TcpListener::bind(("0.0.0.0", p)),
                    None => Err(e),
                }
            });
            let l = l.map_err(|e| {
                NetError::io(format!("node 0: cannot listen at HYFI_COORD={addr}"), e)
            })?;
            Ok(l)
        }
        Rendezvous::File(path) => {
            let l = TcpListener::bind("0.0.0.0:0")
                .map_err(|e| NetError::io("node 0: cannot open a listening socket", e))?;
            let port = l
                .local_addr()
                .map_err(|e| NetError::io("node 0: local_addr", e))?
                .port();
            let addr = format!("{}:{port}", advertised_host());
            publish(path, spec.job, &addr)?;
            Ok(l)
        }
    }
}

/// The host name other nodes should use to reach this one.
fn advertised_host() -> String {
    if let Ok(h) = std::env::var("HYFI_HOST") {
        return h;
    }
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r == 0 {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        if let Ok(name) = std::str::from_utf8(&buf[..end]) {
            if (name, 0u16)
                .to_socket_addrs()
                .is_ok_and(|mut a| a.next().is_some())
            {
                return name.to_string();
            }
        }
    }
    "127.0.0.1".to_string()
}

/// Writes `job addr` to the rendezvous file atomically.
fn publish(path: &Path, job: u64, addr: &str) -> Result<(), NetError> {
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, format!("{job} {addr}\n"))
        .and_then(|_| std::fs::rename(&tmp, path))
        .map_err(|e| {
            NetError::io(
                format!("node 0: cannot write HYFI_RENDEZVOUS={}", path.display()),
                e,
            )
        })
}

/// Reads the coordinator's address from the rendezvous file, waiting for a
/// file of this job (a stale one of an earlier job is ignored).
fn lookup(
    path: &Path,
    job: u64,
    rank: usize,
    deadline: Instant,
    timeout: Duration,
) -> Result<String, NetError> {
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            let mut it = s.split_whitespace();
            if let (Some(j), Some(addr)) = (it.next(), it.next()) {
                if j.parse::<u64>() == Ok(job) {
                    return Ok(addr.to_string());
                }
            }
        }
        if Instant::now() > deadline {
            return Err(NetError::Unreachable {
                rank,
                what: "the rendezvous file".into(),
                addr: path.display().to_string(),
                secs: timeout.as_secs(),
                source: std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no address of this job in it",
                ),
            });
        }
        std::thread::sleep(POLL * 4);
    }
}

/// Accepts one connection before the deadline (None if it passed).
fn accept_until(
    l: &TcpListener,
    deadline: Instant,
) -> Result<Option<(TcpStream, SocketAddr)>, NetError> {
    l.set_nonblocking(true)
        .map_err(|e| NetError::io("set_nonblocking", e))?;
    loop {
        match l.accept() {
            Ok((s, a)) => {
                s.set_nonblocking(false)
                    .map_err(|e| NetError::io("set_nonblocking", e))?;
                return Ok(Some((s, a)));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return Ok(None);
                }
                std::thread::sleep(POLL);
            }
            Err(e) => return Err(NetError::io("accept", e)),
        }
    }
}

fn read_handshake(s: &mut TcpStream) -> Result<Handshake, String> {
    s.set_read_timeout(Some(HANDSHAKE_WAIT))
        .map_err(|e| e.to_string())?;
    let mut b = [0u8; HANDSHAKE_LEN];
    s.read_exact(&mut b)
        .map_err(|e| format!("no handshake: {e}"))?;
    Handshake::decode(&b)
}

fn configure(s: &TcpStream) -> Result<(), NetError> {
    s.set_nodelay(true)
        .map_err(|e| NetError::io("TCP_NODELAY", e))?;
    s.set_read_timeout(None)
        .map_err(|e| NetError::io("set_read_timeout", e))
}

fn coordinator(spec: &JobSpec, deadline: Instant, timeout: Duration) -> Result<Links, NetError> {
    let n = spec.nodes;
    let listener = bind_coordinator(spec)?;
    let token = spec.token.unwrap_or_else(crate::bootstrap::random_token);
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
        let Some((mut s, from)) = accept_until(&listener, deadline)? else {
            let missing: Vec<String> = (1..n)
                .filter(|&r| peers[r].is_none())
                .map(|r| r.to_string())
                .collect();
            let e = NetError::MissingNodes {
                arrived,
                nodes: n,
                missing: missing.join(", "),
                secs: timeout.as_secs(),
            };
            refuse_all(&mut peers, &e.to_string());
            return Err(e);
        };
        let h = match read_handshake(&mut s) {
            Ok(h) => h,
            Err(why) => {
                refused!("node 0: refused a connection from {from}: {why}");
                continue;
            }
        };
        let token_ok = match spec.token {
            Some(t) => wire::token_eq(&t, &h.token),
            None => true,
        };
        if h.purpose != Purpose::Hello || h.job != spec.job || !token_ok {
            refused!(
                "node 0: refused a connection from {from}: {}",
                if h.job != spec.job {
                    "another job"
                } else if !token_ok {
                    "wrong token"
                } else {
                    "not a hello"
                }
            );
            continue;
        }
        let rank = h.rank as usize;
        if h.nodes as usize != n {
            let e = NetError::NodeCountMismatch {
                rank,
                theirs: h.nodes as usize,
                ours: n,
            };
            let _ = wire::write_msg(&mut s, &Msg::Refuse { why: e.to_string() });
            refuse_all(&mut peers, &e.to_string());
            return Err(e);
        }
        if rank == 0 || rank >= n || peers[rank].is_some() {
            let e = NetError::DuplicateRank { rank };
            let _ = wire::write_msg(&mut s, &Msg::Refuse { why: e.to_string() });
            refuse_all(&mut peers, &e.to_string());
            return Err(e);
        }
        match wire::read_msg(&mut s) {
            Ok(Msg::Hello { listen }) => {
                addrs[rank] = listen;
                configure(&s)?;
                peers[rank] = Some(s);
                arrived += 1;
            }
            Ok(other) => refused!("node 0: node {rank} sent {other:?} instead of its hello"),
            Err(e) => refused!("node 0: node {rank} sent no hello: {e}"),
        }
    }
    for s in peers.iter_mut().flatten() {
        wire::write_msg(
            s,
            &Msg::Table {
                addrs: addrs.clone(),
                token,
            },
        )
        .map_err(|e| NetError::io("node 0: sending the address table", e))?;
    }
    Ok(Links {
        rank: 0,
        nodes: n,
        job: spec.job,
        token,
        peers,
        listeners: vec![listener],
    })
}

fn connect_retry(
    addr: &str,
    rank: usize,
    what: &str,
    deadline: Instant,
    timeout: Duration,
) -> Result<TcpStream, NetError> {
    loop {
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
        if Instant::now() > deadline {
            return Err(NetError::Unreachable {
                rank,
                what: what.into(),
                addr: addr.into(),
                secs: timeout.as_secs(),
                source: err,
            });
        }
        std::thread::sleep(POLL * 4);
    }
}

fn member(spec: &JobSpec, deadline: Instant, timeout: Duration) -> Result<Links, NetError> {
    let (rank, n) = (spec.rank, spec.nodes);
    let mesh = TcpListener::bind("0.0.0.0:0")
        .map_err(|e| NetError::io(format!("node {rank}: cannot open its mesh listener"), e))?;
    let mesh_port = mesh
        .local_addr()
        .map_err(|e| NetError::io("local_addr", e))?
        .port();
    let coord = match &spec.rendezvous {
        Rendezvous::Coord(a) => a.clone(),
        Rendezvous::File(p) => lookup(p, spec.job, rank, deadline, timeout)?,
    };
    let mut c = connect_retry(&coord, rank, "the coordinator (node 0)", deadline, timeout)?;
    let hello = Handshake {
        purpose: Purpose::Hello,
        job: spec.job,
        token: spec.token.unwrap_or([0; 16]),
        rank: rank as u32,
        nodes: n as u32,
    };
    let my_ip = c
        .local_addr()
        .map_err(|e| NetError::io("local_addr", e))?
        .ip();
    c.write_all(&hello.encode())
        .and_then(|_| {
            wire::write_msg(
                &mut c,
                &Msg::Hello {
                    listen: format!("{my_ip}:{mesh_port}"),
                },
            )
        })
        .map_err(|e| {
            NetError::io(
                format!("node {rank}: talking to the coordinator at {coord}"),
                e,
            )
        })?;
    // Node 0 answers once every node has arrived: wait as long as setup may take.
    let left = deadline.saturating_duration_since(Instant::now()) + HANDSHAKE_WAIT;
    c.set_read_timeout(Some(left))
        .map_err(|e| NetError::io("set_read_timeout", e))?;
    let (addrs, token) = match wire::read_msg(&mut c) {
        Ok(Msg::Table { addrs, token }) => (addrs, token),
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
    configure(&c)?;
    let mut peers: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
    peers[0] = Some(c);
    let link = Handshake {
        purpose: Purpose::Mesh,
        job: spec.job,
        token,
        rank: rank as u32,
        nodes: n as u32,
    };
    for (j, addr) in addrs.iter().enumerate().take(rank).skip(1) {
        let mut s = connect_retry(addr, rank, &format!("node {j}"), deadline, timeout)?;
        s.write_all(&link.encode())
            .map_err(|e| NetError::io(format!("node {rank}: handshake with node {j}"), e))?;
        configure(&s)?;
        peers[j] = Some(s);
    }
    let mut expected = n - 1 - rank;
    while expected > 0 {
        let Some((mut s, from)) = accept_until(&mesh, deadline)? else {
            let missing: Vec<String> = (rank + 1..n)
                .filter(|&r| peers[r].is_none())
                .map(|r| r.to_string())
                .collect();
            return Err(NetError::Unreachable {
                rank,
                what: format!("links from node(s) {}", missing.join(", ")),
                addr: format!("port {mesh_port}"),
                secs: timeout.as_secs(),
                source: std::io::Error::new(std::io::ErrorKind::TimedOut, "they never connected"),
            });
        };
        match read_handshake(&mut s) {
            Ok(h)
                if h.purpose == Purpose::Mesh
                    && h.job == spec.job
                    && wire::token_eq(&h.token, &token)
                    && (h.rank as usize) > rank
                    && (h.rank as usize) < n
                    && peers[h.rank as usize].is_none() =>
            {
                configure(&s)?;
                peers[h.rank as usize] = Some(s);
                expected -= 1;
            }
            Ok(h) => {
                refused!("node {rank}: refused a mesh link from {from} (rank {}, job {}): wrong job, token or rank", h.rank, h.job);
                let _ = s.shutdown(Shutdown::Both);
            }
            Err(why) => refused!("node {rank}: refused a connection from {from}: {why}"),
        }
    }
    Ok(Links {
        rank,
        nodes: n,
        job: spec.job,
        token,
        peers,
        listeners: vec![mesh],
    })
}
