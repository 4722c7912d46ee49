//! Addresses: which interface each listener binds, and what node 0 tells
//! the others. A listener binds the interface the job uses, never every
//! interface, so that a job on a private network is not reachable from
//! the others (see the module docs of [`crate::tcp::mesh`]).

use std::net::{IpAddr, TcpListener, ToSocketAddrs};
use std::os::fd::{FromRawFd, IntoRawFd};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::bootstrap::Token;
use crate::bootstrap::{JobSpec, Rendezvous};
use crate::error::NetError;
use crate::tcp::rendezvous::{self, Published};

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
pub(super) fn is_local(ip: IpAddr) -> bool {
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

/// The descriptor of node 0's listener, bound by the local launcher at
/// `HYFI_COORD` and inherited open (launch/node.rs).
pub(crate) const COORD_FD_ENV: &str = "HYFI_COORD_FD";

/// Whether this process took the inherited listener already (a second
/// runtime in it binds the port itself, as without a launcher).
static COORD_FD_TAKEN: AtomicBool = AtomicBool::new(false);

/// The listener the launcher bound at `port` and this node inherited
/// ([`COORD_FD_ENV`]), if there is one: a descriptor that is not open, not
/// a socket, or bound elsewhere is left alone.
fn inherited_listener(port: u16) -> Option<TcpListener> {
    if COORD_FD_TAKEN.swap(true, Ordering::Relaxed) {
        return None;
    }
    let fd = crate::cause::inherited_fd(COORD_FD_ENV)?;
    // SAFETY: the descriptor is open (above) and this process owns it: the
    // launcher passed it to this node alone, and it is taken once. Anything
    // but the listener the launcher meant is given back unclosed below.
    let l = unsafe { TcpListener::from_raw_fd(fd) };
    match l.local_addr() {
        Ok(a) if a.port() == port => Some(l),
        _ => {
            let _ = l.into_raw_fd();
            None
        }
    }
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
pub(super) fn bind_coordinator(
    spec: &JobSpec,
    token: &Token,
) -> Result<(TcpListener, Option<Published>), NetError> {
    // The file carries the token only when node 0 made it up.
    let made = spec.token.is_none().then_some(token);
    match &spec.rendezvous {
        Rendezvous::Coord(addr) => {
            let (host, port) = split_host_port(addr);
            let bound = match inherited_listener(port) {
                Some(l) => Ok(l),
                None => bind_host(host, port),
            };
            let l = bound.map_err(|e| {
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
