//! The wire: the [`handshake`] every connection opens with (and the proof
//! of the job's token it carries), then [`frame`]s. Bytes that are not
//! hyfi's wire format, in either, are a [`WireError`] (defined here, for
//! both).
//!
//! The items of both are re-exported here: the rest of the crate names them
//! `wire::Msg`, `wire::proof`, ...

pub mod frame;
pub mod handshake;

pub use frame::{
    bulk_frame, bulk_frame_with, collective_frame, control_frame, decode_msg, read_msg, write_msg,
    Header, Kind, Msg, HEADER_LEN, MAX_FRAME,
};
pub use handshake::{
    proof, proof_ok, Binding, Handshake, HandshakeError, Nonce, Proof, Purpose, Side,
    HANDSHAKE_LEN, NONCE_LEN, PROOF_LEN, VERSION,
};

/// What is wrong with bytes that should be hyfi's wire format (garbage on
/// a socket, another program, another build).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The connection does not start with hyfi's magic bytes.
    #[error("not a hyfi peer (first bytes {0:02x?})")]
    NotHyfi([u8; 4]),
    /// Another version of the protocol.
    #[error("protocol version {theirs}, this node speaks {VERSION}: run the same hyfi build on every node")]
    Version {
        /// The peer's version.
        theirs: u16,
    },
    /// A handshake for no purpose this build knows.
    #[error("unknown connection purpose {0}")]
    Purpose(u8),
    /// A frame longer than any hyfi sends.
    #[error("frame of {len} bytes exceeds the {MAX_FRAME}-byte limit")]
    TooLarge {
        /// The length the header claims.
        len: u32,
    },
    /// A frame kind this build does not know.
    #[error("unknown frame kind {0}")]
    Kind(u8),
    /// A control payload that is not a message.
    #[error("undecodable control message: {0}")]
    Undecodable(String),
}
