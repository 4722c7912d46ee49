//! The handshake every connection opens with, and the proof of the job's
//! token it carries. What follows the handshake is [`frame`](super::frame)s.
//!
//! **Handshake** (40 bytes, fixed layout, checked before anything else is
//! read, so garbage costs nothing): magic `HYFI`, protocol version (u16),
//! purpose (hello to the coordinator, or mesh link), job id (u64), the
//! connector's nonce (16 random bytes), sender rank (u32), sender's node
//! count (u32). Little endian throughout.
//!
//! **Proof of the job's token** (challenge–response, mutual). The token never
//! goes over the wire; each side proves it knows it:
//!
//! 1. connector → acceptor: the handshake, with a fresh nonce `Nc`;
//! 2. acceptor → connector: a fresh nonce `Na` ([`NONCE_LEN`] bytes);
//! 3. connector → acceptor: [`proof`]`(token, Connector, …)` ([`PROOF_LEN`]
//!    bytes); the acceptor checks it and, if wrong, closes the connection
//!    having sent nothing but `Na`;
//! 4. acceptor → connector: [`proof`]`(token, Acceptor, …)`, which the
//!    connector checks before it believes anything the acceptor says (node
//!    0's address table, say).
//!
//! A proof is HMAC-SHA256 keyed with the token over a [`Binding`]: the side,
//! the purpose, the job, both ranks, the node count and both nonces. Fresh
//! nonces on both sides make a recorded proof useless later; the side label
//! keeps an acceptor's proof from passing as a connector's. This
//! authenticates the peers at setup; it does not encrypt or sign the frames
//! that follow (run jobs on a network you trust with your data).
//!
//! ```
//! use hyfi_net::tcp::wire::{proof, proof_ok, Binding, Purpose, Side};
//!
//! let token = [7u8; 16];
//! let b = Binding { purpose: Purpose::Hello, job: 42, from: 1, to: 0, nodes: 2,
//!                   connector_nonce: [1; 16], acceptor_nonce: [2; 16] };
//! let p = proof(&token, Side::Connector, &b);
//! assert!(proof_ok(&token, Side::Connector, &b, &p));
//! assert!(!proof_ok(&[8u8; 16], Side::Connector, &b, &p));
//! assert!(!proof_ok(&token, Side::Acceptor, &b, &p));
//! ```

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::frame::Msg;
use super::WireError;
use crate::bootstrap::Token;

/// Protocol version; a peer speaking another is refused. Version 2 replaced
/// the token in the handshake with a nonce and a challenge–response.
pub const VERSION: u16 = 4;
const MAGIC: [u8; 4] = *b"HYFI";
/// Size of the handshake.
pub const HANDSHAKE_LEN: usize = 40;

/// Why a connection is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Purpose {
    /// A node reporting to the coordinator (node 0).
    Hello = 1,
    /// A link of the full mesh.
    Mesh = 2,
}

/// The opening of every connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handshake {
    /// Why the connection is opened.
    pub purpose: Purpose,
    /// Job id.
    pub job: u64,
    /// The connector's fresh random nonce (its half of the challenge).
    pub nonce: Nonce,
    /// Sender's rank.
    pub rank: u32,
    /// Sender's node count.
    pub nodes: u32,
}

impl Handshake {
    /// Encodes the handshake.
    pub fn encode(&self) -> [u8; HANDSHAKE_LEN] {
        let mut b = [0u8; HANDSHAKE_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6] = self.purpose as u8;
        b[8..16].copy_from_slice(&self.job.to_le_bytes());
        b[16..32].copy_from_slice(&self.nonce);
        b[32..36].copy_from_slice(&self.rank.to_le_bytes());
        b[36..40].copy_from_slice(&self.nodes.to_le_bytes());
        b
    }

    /// Decodes and checks the fixed parts; `Err` says what was wrong.
    pub fn decode(b: &[u8; HANDSHAKE_LEN]) -> Result<Handshake, WireError> {
        if b[0..4] != MAGIC {
            return Err(WireError::NotHyfi([b[0], b[1], b[2], b[3]]));
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != VERSION {
            return Err(WireError::Version { theirs: version });
        }
        let purpose = match b[6] {
            1 => Purpose::Hello,
            2 => Purpose::Mesh,
            p => return Err(WireError::Purpose(p)),
        };
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&b[16..32]);
        Ok(Handshake {
            purpose,
            job: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            nonce,
            rank: u32::from_le_bytes(b[32..36].try_into().expect("4 bytes")),
            nodes: u32::from_le_bytes(b[36..40].try_into().expect("4 bytes")),
        })
    }
}

/// Size of a nonce.
pub const NONCE_LEN: usize = 16;
/// A nonce: 16 fresh random bytes, one per side and connection.
pub type Nonce = [u8; NONCE_LEN];
/// Size of a proof (an HMAC-SHA256 tag).
pub const PROOF_LEN: usize = 32;
/// A proof that its sender knows the job's token.
pub type Proof = [u8; PROOF_LEN];

/// Which side of a connection computes a proof.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Side {
    /// The side that opened the connection (and sent the handshake).
    Connector = b'C',
    /// The side that accepted it (and sent the challenge).
    Acceptor = b'A',
}

/// Everything a proof is bound to: a proof made for one connection, job,
/// rank or direction is worthless for any other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Binding {
    /// The connection's purpose.
    pub purpose: Purpose,
    /// Job id.
    pub job: u64,
    /// The connector's rank.
    pub from: u32,
    /// The acceptor's rank (the node the connector means to reach).
    pub to: u32,
    /// The connector's node count.
    pub nodes: u32,
    /// The nonce the connector sent in its handshake.
    pub connector_nonce: Nonce,
    /// The nonce the acceptor sent back.
    pub acceptor_nonce: Nonce,
}

/// Domain separation: these MACs are for nothing but this handshake.
const PROOF_LABEL: &[u8] = b"hyfi handshake v2";

fn keyed(token: &Token, side: Side, b: &Binding) -> Hmac<Sha256> {
    // HMAC accepts keys of any length, so this cannot fail.
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(token).expect("HMAC takes any key length");
    m.update(PROOF_LABEL);
    m.update(&[side as u8, b.purpose as u8]);
    m.update(&b.job.to_le_bytes());
    m.update(&b.from.to_le_bytes());
    m.update(&b.to.to_le_bytes());
    m.update(&b.nodes.to_le_bytes());
    m.update(&b.connector_nonce);
    m.update(&b.acceptor_nonce);
    m
}

/// `side`'s proof that it knows `token`, for the connection `b` describes.
pub fn proof(token: &Token, side: Side, b: &Binding) -> Proof {
    keyed(token, side, b).finalize().into_bytes().into()
}

/// Checks `side`'s proof, in constant time (the comparison must not tell an
/// attacker how many leading bytes were right).
pub fn proof_ok(token: &Token, side: Side, b: &Binding, got: &Proof) -> bool {
    keyed(token, side, b).verify_slice(got).is_ok()
}

/// Why a handshake failed, on either side: the acceptor refuses the
/// connection (and logs why); the connector tries again until setup's
/// deadline, then reports the last failure ([`NetError::Rejected`]).
///
/// [`NetError::Rejected`]: crate::NetError::Rejected
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    // --- the acceptor's side ---
    /// The connection sent no (whole) handshake in time.
    #[error("no handshake: {0}")]
    NoHandshake(#[source] std::io::Error),
    /// The bytes are not a handshake this build speaks.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// A handshake for another job.
    #[error("a handshake of another job ({job})")]
    OtherJob {
        /// The job it names.
        job: u64,
    },
    /// A handshake for another purpose than this listener's.
    #[error("a {theirs:?} handshake where a {expected:?} was expected")]
    WrongPurpose {
        /// The purpose it names.
        theirs: Purpose,
        /// This listener's.
        expected: Purpose,
    },
    /// A mesh link from a node that is not to link to this one (node *i*
    /// accepts from nodes above *i* only).
    #[error("claims to be node {rank}, which does not link to node {me}")]
    NotALink {
        /// The rank it claims.
        rank: u32,
        /// This node.
        me: usize,
    },
    /// Writing our challenge failed.
    #[error("sending the challenge: {0}")]
    SendingChallenge(#[source] std::io::Error),
    /// The peer did not answer our challenge in time.
    #[error("no answer to the challenge: {0}")]
    NoAnswer(#[source] std::io::Error),
    /// The peer's proof is wrong: it does not know the job's token.
    #[error(
        "claims to be node {rank} but does not know the job's token (check that every node \
         has the same HYFI_TOKEN)"
    )]
    NoToken {
        /// The rank it claims.
        rank: u32,
    },
    /// Setting the socket's timeout for the hello failed.
    #[error("{0}")]
    Socket(#[source] std::io::Error),
    /// A node reporting to node 0 sent something else than its hello.
    #[error("sent {0:?} instead of its hello")]
    NotHello(Msg),
    /// A node reporting to node 0 sent no hello.
    #[error("sent no hello: {0}")]
    NoHello(#[source] std::io::Error),

    // --- both sides ---
    /// Writing our proof failed.
    #[error("sending our proof: {0}")]
    SendingProof(#[source] std::io::Error),

    // --- the connector's side ---
    /// Writing the handshake failed.
    #[error("sending the handshake: {0}")]
    SendingHandshake(#[source] std::io::Error),
    /// The acceptor sent no challenge.
    #[error("no challenge: {0}")]
    NoChallenge(#[source] std::io::Error),
    /// The acceptor closed the connection after our proof: it did not
    /// accept it.
    #[error("it refused our proof of the job's token (a different token?)")]
    ProofRefused(#[source] std::io::Error),
    /// The acceptor sent no proof of its own in time.
    #[error("no proof from it: {0}")]
    NoProof(#[source] std::io::Error),
    /// The acceptor's proof is wrong.
    #[error("its proof of the job's token is wrong: not a node of this job")]
    WrongProof,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handshake_round_trips_and_rejects_garbage() {
        let h = Handshake {
            purpose: Purpose::Mesh,
            job: 0xdead_beef_0123,
            nonce: [7; 16],
            rank: 3,
            nodes: 4,
        };
        assert_eq!(Handshake::decode(&h.encode()).unwrap(), h);
        let mut bad = h.encode();
        bad[0] = b'X';
        assert!(Handshake::decode(&bad)
            .unwrap_err()
            .to_string()
            .contains("not a hyfi peer"));
        let mut old = h.encode();
        old[4] = 0;
        old[5] = 0;
        assert_eq!(
            Handshake::decode(&old).unwrap_err(),
            WireError::Version { theirs: 0 }
        );
    }

    fn binding() -> Binding {
        Binding {
            purpose: Purpose::Mesh,
            job: 0x0123_4567_89ab_cdef,
            from: 3,
            to: 1,
            nodes: 4,
            connector_nonce: [0x11; NONCE_LEN],
            acceptor_nonce: [0x22; NONCE_LEN],
        }
    }

    #[test]
    fn a_proof_verifies_only_with_its_token_side_and_binding() {
        let token: Token = *b"0123456789abcdef";
        let b = binding();
        let p = proof(&token, Side::Connector, &b);
        assert!(proof_ok(&token, Side::Connector, &b, &p));
        // Deterministic: the other side recomputes the same tag.
        assert_eq!(p, proof(&token, Side::Connector, &b));
        // Another token, the other direction, or any field changed: refused.
        let mut other = token;
        other[15] ^= 1;
        assert!(!proof_ok(&other, Side::Connector, &b, &p));
        assert!(!proof_ok(&token, Side::Acceptor, &b, &p));
        let changed = [
            Binding {
                purpose: Purpose::Hello,
                ..b
            },
            Binding {
                job: b.job + 1,
                ..b
            },
            Binding { from: 2, ..b },
            Binding { to: 0, ..b },
            Binding { nodes: 5, ..b },
            Binding {
                connector_nonce: [0x12; NONCE_LEN],
                ..b
            },
            Binding {
                acceptor_nonce: [0x23; NONCE_LEN],
                ..b
            },
        ];
        for c in changed {
            assert!(!proof_ok(&token, Side::Connector, &c, &p), "{c:?}");
        }
        // A flipped bit of the tag, or a truncated one, is refused.
        let mut bad = p;
        bad[31] ^= 0x80;
        assert!(!proof_ok(&token, Side::Connector, &b, &bad));
    }

    #[test]
    fn the_proof_is_hmac_sha256_and_hides_the_token() {
        // RFC 4231 test case 2 pins the primitive: key "Jefe".
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(b"Jefe").unwrap();
        m.update(b"what do ya want for nothing?");
        let tag: [u8; 32] = m.finalize().into_bytes().into();
        assert_eq!(tag[..8], [0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75, 0x4e]);
        // Nothing a peer sends contains the token: not the handshake, not a
        // proof.
        let token: Token = [0xa5; 16];
        let b = binding();
        let h = Handshake {
            purpose: b.purpose,
            job: b.job,
            nonce: b.connector_nonce,
            rank: b.from,
            nodes: b.nodes,
        };
        for sent in [
            h.encode().to_vec(),
            proof(&token, Side::Connector, &b).to_vec(),
            proof(&token, Side::Acceptor, &b).to_vec(),
        ] {
            assert!(!sent.windows(4).any(|w| w == [0xa5; 4]), "{sent:02x?}");
        }
    }
}
