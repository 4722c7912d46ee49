//! Opening the full mesh of TCP connections, before the communication
//! thread starts (plain blocking sockets, every wait bounded).
//!
//! 1. Node 0 (the coordinator) listens at `HYFI_COORD`, or binds a port and
//!    publishes `host:port` in the rendezvous file ([`crate::rendezvous`]).
//!    Without `HYFI_TOKEN` it makes a random token and puts it in that file
//!    (for a `HYFI_COORD` job, in `$TMPDIR/hyfi-<uid>/hyfi-job-<job>.addr`),
//!    created mode 0600 in a private directory, so only this user's
//!    processes on this host can join.
//! 2. Every other node connects to node 0 (retrying until the deadline: node
//!    0 may start last, and a stale rendezvous file is re-read), proves it
//!    knows the token and checks node 0's proof (the challenge–response of
//!    [`crate::wire`]), binds its own mesh listener and says where it is.
//! 3. Once all have arrived, node 0 removes the rendezvous file and sends
//!    everyone the table of listener addresses. Node 0's link to node *i* is
//!    the connection *i* opened.
//! 4. Node *i* connects to every node *j* with `0 < j < i`, and accepts from
//!    every *j > i*; every link runs the same mutual proof.
//!
//! **Strangers cannot stall start-up.** Each incoming connection gets a
//! thread of its own and [`HANDSHAKE_WAIT`] to prove itself (a deadline for
//! the whole handshake, so trickling one byte at a time does not extend it);
//! at most [`MAX_PENDING`] are in handshake at once. The real nodes are
//! admitted as soon as they prove themselves, and the whole of setup is
//! bounded by the `timeout` given to [`connect`] (`HYFI_TIMEOUT`).
//!
//! **Strangers cannot hijack it.** Nothing keyed by the token, and not the
//! address table, goes to a connection before it proved it knows the token;
//! a connection that fails is logged (rate-limited, see
//! [`crate::refusal`]) and dropped, and setup goes on. Only a node that
//! proved itself can end setup with an error: a node count that disagrees
//! with node 0's, or a rank claimed twice, ends setup on every node with an
//! error that says what to check.
//!
//! **Listeners bind the interface the job uses**, never every interface:
//! node 0 the address of `HYFI_COORD` (or loopback for a job whose
//! rendezvous file is in the private temporary directory, whose nodes are
//! all on this host; or `HYFI_HOST`/the host name's address otherwise); the
//! others the local address of their connection to node 0.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::bootstrap::{random_token, JobSpec, Rendezvous, Token};
use crate::error::NetError;
use crate::refusal::RefusalLog;
use crate::rendezvous::{self, Published};
use crate::wire::{
    self, Binding, Handshake, Msg, Nonce, Proof, Purpose, Side, HANDSHAKE_LEN, NONCE_LEN, PROOF_LEN,
};

/// The established mesh.
pub struct Links {
    /// This node's rank.
    pub rank: usize,
    /// Number of nodes.
    pub nodes: usize,
    /// Job id.
    pub job: u64,
    /// The job's token, which every link proved it knows.
    pub token: Token,
    /// One connection per other node (`None` at this node's own index).
    pub peers: Vec<Option<TcpStream>>,
    /// Listeners kept open during the run, so that stray connections are
    /// refused (and logged) instead of hanging in the backlog.
    pub listeners: Vec<TcpListener>,
}

const POLL: Duration = Duration::from_millis(5);
/// How long an incoming connection has to complete its handshake: a real
/// node answers in milliseconds; a stranger holds a thread no longer.
pub const HANDSHAKE_WAIT: Duration = Duration::from_secs(3);
/// Connections in handshake at once; more are closed at once (a real node
/// among them retries).
pub const MAX_PENDING: usize = 128;

/// Opens the mesh for `spec`, giving up after `timeout`.
pub fn connect(spec: &JobSpec, timeout: Duration) -> Result<Links, NetError> {
    let deadline = Instant::now() + timeout;
    let log = Arc::new(RefusalLog::new(spec.rank));
    let links = if spec.rank == 0 {
        coordinator(spec, deadline, timeout, &log)
    } else {
        member(spec, deadline, timeout, &log)
    };
    log.flush();
    links
}

// ---------------------------------------------------------------------------
// Addresses

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

/// Is `ip` an address of this host? (Binding it succeeds only then.)
fn is_local(ip: IpAddr) -> bool {
    ip.is_loopback() || TcpListener::bind((ip, 0)).is_ok()
}

/// Binds the first address `host:port` resolves to that is this host's.
fn bind_host(host: &str, port: u16) -> std::io::Result<TcpListener> {
    let mut last = std::io::Error::new(
        std::io::ErrorKind::AddrNotAvailable,
        "the name resolves to no address",
    );
    for sa in (host, port).to_socket_addrs()? {
        match TcpListener::bind(sa) {
            Ok(l) => return Ok(l),
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn split_host_port(addr: &str) -> (&str, u16) {
    // bootstrap checked the syntax: host:port with a port in 1..=65535.
    match addr.rsplit_once(':') {
        Some((h, p)) => (
            h.trim_start_matches('[').trim_end_matches(']'),
            p.parse().unwrap_or(0),
        ),
        None => (addr, 0),
    }
}

/// Node 0's listener, and the published rendezvous file (removed when the
/// returned guard drops).
fn bind_coordinator(
    spec: &JobSpec,
    token: &Token,
) -> Result<(TcpListener, Option<Published>), NetError> {
    // The file carries the token only when node 0 made it up.
    let made = spec.token.is_none().then_some(token);
    match &spec.rendezvous {
        Rendezvous::Coord(addr) => {
            let (host, port) = split_host_port(addr);
            let l = bind_host(host, port).map_err(|e| {
                NetError::io(
                    format!(
                        "node 0: cannot listen at HYFI_COORD={addr}: HYFI_COORD must name node \
                         0's host by an address of one of its interfaces, with a free port"
                    ),
                    e,
                )
            })?;
            let published = match made {
                Some(t) => Some(rendezvous::publish(
                    &rendezvous::token_file(spec.job),
                    spec.job,
                    addr,
                    Some(t),
                )?),
                None => None,
            };
            Ok((l, published))
        }
        Rendezvous::File(path) => {
            let host = if rendezvous::is_private(path) {
                "127.0.0.1".to_string()
            } else {
                advertised_host()
            };
            let l = bind_host(&host, 0).map_err(|e| {
                NetError::io(
                    format!(
                        "node 0: cannot listen at {host}, this host's advertised address: set \
                         HYFI_HOST to an address of this host the other nodes can reach"
                    ),
                    e,
                )
            })?;
            let port = l
                .local_addr()
                .map_err(|e| NetError::io("node 0: local_addr", e))?
                .port();
            let published = rendezvous::publish(path, spec.job, &format!("{host}:{port}"), made)?;
            Ok((l, Some(published)))
        }
    }
}

// ---------------------------------------------------------------------------
// The handshake, both sides

fn nonce() -> Nonce {
    random_token()
}

/// `read_exact` with a deadline for the whole buffer, so that a peer
/// trickling one byte at a time cannot hold us past it.
fn read_by(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> std::io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("{got} of {} bytes before the deadline", buf.len()),
            ));
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn write_by(s: &mut TcpStream, bytes: &[u8], deadline: Instant) -> std::io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    s.set_write_timeout(Some(left.max(Duration::from_millis(1))))?;
    s.write_all(bytes)
}

/// Who may come in, and how they prove it.
struct Gate {
    me: usize,
    nodes: usize,
    job: u64,
    token: Token,
    purpose: Purpose,
    log: Arc<RefusalLog>,
}

/// A connection that proved it knows the token.
struct Admitted {
    rank: usize,
    nodes: usize,
    stream: TcpStream,
    /// Node 0 only: where the node's mesh listener is.
    listen: String,
}

impl Gate {
    /// The acceptor's side of the handshake; `Err` says why the connection
    /// is refused. Sends nothing but a nonce before the peer's proof.
    fn admit(&self, mut s: TcpStream, until: Instant) -> Result<Admitted, String> {
        let mut b = [0u8; HANDSHAKE_LEN];
        read_by(&mut s, &mut b, until).map_err(|e| format!("no handshake: {e}"))?;
        let h = Handshake::decode(&b).map_err(|e| e.to_string())?;
        if h.job != self.job {
            return Err(format!("a handshake of another job ({})", h.job));
        }
        if h.purpose != self.purpose {
            return Err(format!(
                "a {:?} handshake where a {:?} was expected",
                h.purpose, self.purpose
            ));
        }
        if self.purpose == Purpose::Mesh
            && (h.rank as usize <= self.me || h.rank as usize >= self.nodes)
        {
            return Err(format!(
                "claims to be node {}, which does not link to node {}",
                h.rank, self.me
            ));
        }
        let na = nonce();
        write_by(&mut s, &na, until).map_err(|e| format!("sending the challenge: {e}"))?;
        let mut p: Proof = [0; PROOF_LEN];
        read_by(&mut s, &mut p, until).map_err(|e| format!("no answer to the challenge: {e}"))?;
        let binding = Binding {
            purpose: h.purpose,
            job: h.job,
            from: h.rank,
            to: self.me as u32,
            nodes: h.nodes,
            connector_nonce: h.nonce,
            acceptor_nonce: na,
        };
        if !wire::proof_ok(&self.token, Side::Connector, &binding, &p) {
            return Err(format!(
                "claims to be node {} but does not know the job's token (check that every node \
                 has the same HYFI_TOKEN)",
                h.rank
            ));
        }
        let mine = wire::proof(&self.token, Side::Acceptor, &binding);
        write_by(&mut s, &mine, until).map_err(|e| format!("sending our proof: {e}"))?;
        let listen = if self.purpose == Purpose::Hello {
            let left = until.saturating_duration_since(Instant::now());
            s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .map_err(|e| e.to_string())?;
            match wire::read_msg(&mut s) {
                Ok(Msg::Hello { listen }) => listen,
                Ok(other) => return Err(format!("sent {other:?} instead of its hello")),
                Err(e) => return Err(format!("sent no hello: {e}")),
            }
        } else {
            String::new()
        };
        Ok(Admitted {
            rank: h.rank as usize,
            nodes: h.nodes as usize,
            stream: s,
            listen,
        })
    }
}

/// The connector's side of the handshake: proves we know `token` to node
/// `to` and checks its proof. `Err` says what went wrong.
fn introduce(
    s: &mut TcpStream,
    purpose: Purpose,
    spec: &JobSpec,
    to: usize,
    token: &Token,
    until: Instant,
) -> Result<(), String> {
    let nc = nonce();
    let h = Handshake {
        purpose,
        job: spec.job,
        nonce: nc,
        rank: spec.rank as u32,
        nodes: spec.nodes as u32,
    };
    write_by(s, &h.encode(), until).map_err(|e| format!("sending the handshake: {e}"))?;
    let mut na: Nonce = [0; NONCE_LEN];
    read_by(s, &mut na, until).map_err(|e| format!("no challenge: {e}"))?;
    let binding = Binding {
        purpose,
        job: spec.job,
        from: spec.rank as u32,
        to: to as u32,
        nodes: spec.nodes as u32,
        connector_nonce: nc,
        acceptor_nonce: na,
    };
    let p = wire::proof(token, Side::Connector, &binding);
    write_by(s, &p, until).map_err(|e| format!("sending our proof: {e}"))?;
    let mut theirs: Proof = [0; PROOF_LEN];
    read_by(s, &mut theirs, until).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof
        | std::io::ErrorKind::ConnectionReset
        | std::io::ErrorKind::BrokenPipe => {
            "it refused our proof of the job's token (a different token?)".to_string()
        }
        _ => format!("no proof from it: {e}"),
    })?;
    if !wire::proof_ok(token, Side::Acceptor, &binding, &theirs) {
        return Err("its proof of the job's token is wrong: not a node of this job".into());
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Accepting: a thread per pending connection

/// Accepts connections on a thread of its own and hands over those that
/// proved themselves; stops (and is joined) on drop.
struct Acceptor {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    admitted: Receiver<Admitted>,
}

impl Acceptor {
    fn start(l: &TcpListener, gate: Gate, deadline: Instant) -> Result<Acceptor, NetError> {
        let l = l
            .try_clone()
            .map_err(|e| NetError::io("cloning the listener", e))?;
        l.set_nonblocking(true)
            .map_err(|e| NetError::io("set_nonblocking", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, admitted) = mpsc::channel();
        let st = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("hyfi-accept-{}", gate.me))
            .spawn(move || accept_loop(l, Arc::new(gate), deadline, st, tx))
            .map_err(|e| NetError::io("starting the accepting thread", e))?;
        Ok(Acceptor {
            stop,
            thread: Some(thread),
            admitted,
        })
    }

    /// The next admitted connection, or `None` at the deadline.
    fn next(&self, deadline: Instant) -> Option<Admitted> {
        let left = deadline.saturating_duration_since(Instant::now());
        // An error is the deadline, or the accepting thread's end (its
        // deadline passed): nobody else is coming either way.
        self.admitted.recv_timeout(left).ok()
    }
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(
    l: TcpListener,
    gate: Arc<Gate>,
    deadline: Instant,
    stop: Arc<AtomicBool>,
    tx: Sender<Admitted>,
) {
    let pending = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        gate.log.tick();
        let (s, from) = match l.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(POLL);
                continue;
            }
            Err(e) => {
                // Out of descriptors, say: wait for some to close.
                gate.log.refuse("(accept)", e);
                std::thread::sleep(POLL * 20);
                continue;
            }
        };
        if pending.load(Ordering::Relaxed) >= MAX_PENDING {
            gate.log.refuse(
                from,
                format!("{MAX_PENDING} connections are already in handshake"),
            );
            continue;
        }
        if s.set_nonblocking(false).is_err() {
            continue;
        }
        pending.fetch_add(1, Ordering::Relaxed);
        let (g, p, tx) = (gate.clone(), pending.clone(), tx.clone());
        let until = deadline.min(Instant::now() + HANDSHAKE_WAIT);
        let spawned = std::thread::Builder::new()
            .name("hyfi-handshake".into())
            .stack_size(128 << 10)
            .spawn(move || {
                match g.admit(s, until) {
                    Ok(a) => {
                        let _ = tx.send(a);
                    }
                    Err(why) => {
                        g.log.refuse(from, why);
                    }
                }
                p.fetch_sub(1, Ordering::Relaxed);
            });
        if let Err(e) = spawned {
            pending.fetch_sub(1, Ordering::Relaxed);
            gate.log
                .refuse(from, format!("no thread for its handshake: {e}"));
        }
    }
}

// ---------------------------------------------------------------------------
// Node 0

fn coordinator(
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
    Ok(Links {
        rank: 0,
        nodes: n,
        job: spec.job,
        token,
        peers,
        listeners: vec![listener],
    })
}

fn configure(s: &TcpStream) -> Result<(), NetError> {
    s.set_nodelay(true)
        .map_err(|e| NetError::io("TCP_NODELAY", e))?;
    s.set_read_timeout(None)
        .map_err(|e| NetError::io("set_read_timeout", e))?;
    s.set_write_timeout(None)
        .map_err(|e| NetError::io("set_write_timeout", e))
}

// ---------------------------------------------------------------------------
// Other nodes

/// Why an attempt to reach a node failed (and will be tried again).
enum Failure {
    /// Nothing to connect to yet: the rendezvous file is not there (yet).
    Waiting { addr: String, why: String },
    /// The TCP connection failed.
    Connect { addr: String, err: std::io::Error },
    /// Connected, but the handshake failed.
    Handshake { addr: String, why: String },
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
                    why,
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
                    why: "it carries no token (node 0 was given HYFI_TOKEN, this node was \
                              not): give every node the same HYFI_TOKEN"
                        .into(),
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
                            why: "it carries no token".into(),
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

fn member(
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
    })
}
