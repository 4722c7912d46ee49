//! The handshake of a mesh connection, both sides: the acceptor's [`Gate`]
//! and the connector's [`introduce`], running the mutual challenge–response
//! of [`crate::tcp::wire`] under one deadline for the whole exchange (a peer
//! trickling one byte at a time cannot extend it). A failure is a
//! [`HandshakeError`]: refused and logged on the acceptor's side, retried
//! until setup's deadline on the connector's.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::bootstrap::JobSpec;
use crate::bootstrap::{random_token, Token};
use crate::tcp::refusal::RefusalLog;
pub use crate::tcp::wire::HandshakeError;
use crate::tcp::wire::{
    self, Binding, Handshake, Msg, Nonce, Proof, Purpose, Side, HANDSHAKE_LEN, NONCE_LEN, PROOF_LEN,
};

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
pub(super) struct Gate {
    pub(super) me: usize,
    pub(super) nodes: usize,
    pub(super) job: u64,
    pub(super) token: Token,
    pub(super) purpose: Purpose,
    pub(super) log: Arc<RefusalLog>,
}

/// A connection that proved it knows the token.
pub(super) struct Admitted {
    pub(super) rank: usize,
    pub(super) nodes: usize,
    pub(super) stream: TcpStream,
    /// Node 0 only: where the node's mesh listener is.
    pub(super) listen: String,
}

impl Gate {
    /// The acceptor's side of the handshake; `Err` says why the connection
    /// is refused. Sends nothing but a nonce before the peer's proof.
    pub(super) fn admit(
        &self,
        mut s: TcpStream,
        until: Instant,
    ) -> Result<Admitted, HandshakeError> {
        let mut b = [0u8; HANDSHAKE_LEN];
        read_by(&mut s, &mut b, until).map_err(HandshakeError::NoHandshake)?;
        let h = Handshake::decode(&b)?;
        if h.job != self.job {
            return Err(HandshakeError::OtherJob { job: h.job });
        }
        if h.purpose != self.purpose {
            return Err(HandshakeError::WrongPurpose {
                theirs: h.purpose,
                expected: self.purpose,
            });
        }
        if self.purpose == Purpose::Mesh
            && (h.rank as usize <= self.me || h.rank as usize >= self.nodes)
        {
            return Err(HandshakeError::NotALink {
                rank: h.rank,
                me: self.me,
            });
        }
        let na = nonce();
        write_by(&mut s, &na, until).map_err(HandshakeError::SendingChallenge)?;
        let mut p: Proof = [0; PROOF_LEN];
        read_by(&mut s, &mut p, until).map_err(HandshakeError::NoAnswer)?;
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
            return Err(HandshakeError::NoToken { rank: h.rank });
        }
        let mine = wire::proof(&self.token, Side::Acceptor, &binding);
        write_by(&mut s, &mine, until).map_err(HandshakeError::SendingProof)?;
        let listen = if self.purpose == Purpose::Hello {
            let left = until.saturating_duration_since(Instant::now());
            s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .map_err(HandshakeError::Socket)?;
            match wire::read_msg(&mut s) {
                Ok(Msg::Hello { listen }) => listen,
                Ok(other) => return Err(HandshakeError::NotHello(other)),
                Err(e) => return Err(HandshakeError::NoHello(e)),
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
pub(super) fn introduce(
    s: &mut TcpStream,
    purpose: Purpose,
    spec: &JobSpec,
    to: usize,
    token: &Token,
    until: Instant,
) -> Result<(), HandshakeError> {
    let nc = nonce();
    let h = Handshake {
        purpose,
        job: spec.job,
        nonce: nc,
        rank: spec.rank as u32,
        nodes: spec.nodes as u32,
    };
    write_by(s, &h.encode(), until).map_err(HandshakeError::SendingHandshake)?;
    let mut na: Nonce = [0; NONCE_LEN];
    read_by(s, &mut na, until).map_err(HandshakeError::NoChallenge)?;
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
    write_by(s, &p, until).map_err(HandshakeError::SendingProof)?;
    let mut theirs: Proof = [0; PROOF_LEN];
    read_by(s, &mut theirs, until).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof
        | std::io::ErrorKind::ConnectionReset
        | std::io::ErrorKind::BrokenPipe => HandshakeError::ProofRefused(e),
        _ => HandshakeError::NoProof(e),
    })?;
    if !wire::proof_ok(token, Side::Acceptor, &binding, &theirs) {
        return Err(HandshakeError::WrongProof);
    }
    Ok(())
}
