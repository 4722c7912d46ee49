//! Frames: what travels on a connection once its [`handshake`](super::handshake)
//! is done.
//!
//! A frame is a 16-byte header — payload length (u32), kind (u8: control
//! or bulk), 3 reserved bytes, tag (u64) — then the payload. Control
//! payloads are [`Msg`] values encoded with bincode 1.3; bulk payloads
//! (pages, diffs) are raw bytes, copied once into the frame and never
//! through serde. Frames larger than [`MAX_FRAME`] are a protocol error.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

use super::WireError;

/// Size of a frame header.
pub const HEADER_LEN: usize = 16;
/// Largest frame payload accepted (64 MiB).
pub const MAX_FRAME: usize = hyfi_core::link::MAX_PAYLOAD;

/// Frame kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A bincode-encoded [`Msg`].
    Control = 1,
    /// Raw bytes with a tag.
    Bulk = 2,
}

/// A collective's value as bytes on the wire: the length, then the bytes
/// (what bincode writes for a sequence of `u8` too, so the frames are the
/// same), encoded and decoded with one copy. Serde's default for a
/// `Vec<u8>` goes byte by byte: 2.8 µs to encode and 8 µs to decode 8 KiB
/// on the 2-vCPU EPYC, four times a step in LU 1024's release on 16 nodes
/// (its pieces carry the pivot row).
mod raw_bytes {
    use serde::de::{Error, Visitor};
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(v)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        d.deserialize_byte_buf(Bytes)
    }

    struct Bytes;

    impl<'de> Visitor<'de> for Bytes {
        type Value = Vec<u8>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("bytes")
        }
        fn visit_bytes<E: Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
            Ok(v.to_vec())
        }
        fn visit_byte_buf<E: Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
            Ok(v)
        }
    }
}

/// Control messages.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Msg {
    /// Node → coordinator, after the handshake: where its mesh listener is.
    Hello {
        /// `host:port` of the node's mesh listener.
        listen: String,
    },
    /// Coordinator → node, once the node proved it knows the job's token and
    /// every node arrived: every node's mesh address.
    Table {
        /// Mesh addresses by rank (entry 0 unused: the coordinator link is node 0's).
        addrs: Vec<String>,
    },
    /// Coordinator → node: you are not admitted (and why).
    Refuse {
        /// The reason, for the node's error message.
        why: String,
    },
    /// One step of a collective (barrier or reduction): `data` combined so far.
    Up {
        /// Collective sequence number.
        seq: u64,
        /// Combined value of the sender's subtree.
        #[serde(with = "raw_bytes")]
        data: Vec<u8>,
    },
    /// The result of a collective, on its way down the tree.
    Down {
        /// Collective sequence number.
        seq: u64,
        /// The result.
        #[serde(with = "raw_bytes")]
        data: Vec<u8>,
    },
    /// The job ends: the first cause the sender knows
    /// ([`crate::cause::Cause`]), its own or one it heard of.
    Abort {
        /// The node where it started.
        origin: u64,
        /// Its kind ([`crate::cause::CauseKind`], as a number).
        kind: u32,
        /// What happened.
        cause: String,
    },
    /// The sender is done and will close the link: not a failure. It will
    /// take no step after its `steps`-th, `last` (see [`Msg::Step`]).
    Bye {
        /// How many SPMD steps the sender took.
        steps: u64,
        /// Its last step ([`hyfi_core::Step::to_words`]; all zero if none).
        last: [u64; 4],
    },
    /// The sender entered its `n`-th SPMD step (from 1), `step`: sent to
    /// the next node of the ring, which compares it with its own `n`-th.
    Step {
        /// The step's number.
        n: u64,
        /// The step ([`hyfi_core::Step::to_words`]).
        step: [u64; 4],
    },
    /// "Still here": sent on every link at a fixed interval, so that a
    /// peer that stops answering (hung, stopped, cut off) is noticed.
    Heartbeat,
    /// A clock reading, during setup (the nodes' clocks are aligned for
    /// traces: `mesh::clock`).
    Clock {
        /// The sender's monotonic clock (ns).
        t: u64,
    },
}

/// A frame's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Payload length.
    pub len: u32,
    /// Payload kind.
    pub kind: Kind,
    /// Tag (bulk frames).
    pub tag: u64,
}

impl Header {
    /// Encodes the header.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&self.len.to_le_bytes());
        b[4] = self.kind as u8;
        b[8..16].copy_from_slice(&self.tag.to_le_bytes());
        b
    }
    /// Decodes and checks a header.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Header, WireError> {
        let len = u32::from_le_bytes(b[0..4].try_into().expect("4 bytes"));
        if len as usize > MAX_FRAME {
            return Err(WireError::TooLarge { len });
        }
        let kind = match b[4] {
            1 => Kind::Control,
            2 => Kind::Bulk,
            k => return Err(WireError::Kind(k)),
        };
        Ok(Header {
            len,
            kind,
            tag: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
        })
    }
}

/// A control frame's header for a payload of `len` bytes, in a buffer
/// with room for the payload.
fn control_header(len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + len);
    out.extend_from_slice(
        &Header {
            len: len as u32,
            kind: Kind::Control,
            tag: 0,
        }
        .encode(),
    );
    out
}

/// A control frame: header and bincode payload in one buffer (the payload
/// serialized in place).
pub fn control_frame(msg: &Msg) -> Vec<u8> {
    let len = bincode::serialized_size(msg).expect("hyfi: control messages always serialize");
    let mut out = control_header(len as usize);
    bincode::serialize_into(&mut out, msg).expect("hyfi: control messages always serialize");
    out
}

/// The control frame of `Msg::Up { seq, data }` (`up`) or `Msg::Down`,
/// made from a borrowed value: bincode's bytes of that message (its
/// variant as a `u32`, `seq`, the length as a `u64`, the bytes), written
/// straight into the frame. A collective's every step sends one, and
/// building the `Msg` first copied the value once more (LU's pieces carry
/// its pivot row). A test checks that the bytes are `control_frame`'s.
pub fn collective_frame(up: bool, seq: u64, data: &[u8]) -> Vec<u8> {
    // The variants' indices in `Msg`, in declaration order.
    const UP: u32 = 3;
    const DOWN: u32 = 4;
    let mut out = control_header(4 + 8 + 8 + data.len());
    out.extend_from_slice(&(if up { UP } else { DOWN }).to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&(data.len() as u64).to_le_bytes());
    out.extend_from_slice(data);
    out
}

/// A bulk frame: header and the bytes, copied once.
pub fn bulk_frame(tag: u64, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + bytes.len());
    out.extend_from_slice(
        &Header {
            len: bytes.len() as u32,
            kind: Kind::Bulk,
            tag,
        }
        .encode(),
    );
    out.extend_from_slice(bytes);
    out
}

/// A bulk frame whose payload `fill` appends in place (at most `len_hint`
/// bytes expected): a page goes from memory into the frame in one copy.
pub fn bulk_frame_with(tag: u64, len_hint: usize, fill: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + len_hint);
    out.extend_from_slice(&[0u8; HEADER_LEN]);
    fill(&mut out);
    let len = out.len() - HEADER_LEN;
    assert!(
        len <= MAX_FRAME,
        "hyfi: a bulk frame of {len} bytes exceeds the frame limit"
    );
    out[..HEADER_LEN].copy_from_slice(
        &Header {
            len: len as u32,
            kind: Kind::Bulk,
            tag,
        }
        .encode(),
    );
    out
}

/// Decodes a control payload.
pub fn decode_msg(payload: &[u8]) -> Result<Msg, WireError> {
    bincode::deserialize(payload).map_err(|e| WireError::Undecodable(e.to_string()))
}

/// Blocking: writes one control message (used during setup).
pub fn write_msg(w: &mut impl Write, msg: &Msg) -> io::Result<()> {
    w.write_all(&control_frame(msg))?;
    w.flush()
}

/// Blocking: reads one control message (used during setup).
pub fn read_msg(r: &mut impl Read) -> io::Result<Msg> {
    let mut h = [0u8; HEADER_LEN];
    r.read_exact(&mut h)?;
    let h = Header::decode(&h).map_err(io::Error::other)?;
    if h.kind != Kind::Control {
        return Err(io::Error::other("expected a control message during setup"));
    }
    let mut body = vec![0u8; h.len as usize];
    r.read_exact(&mut body)?;
    decode_msg(&body).map_err(io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_limits_hold() {
        let m = Msg::Up {
            seq: 9,
            data: vec![1, 2, 3],
        };
        let f = control_frame(&m);
        assert_eq!(read_msg(&mut &f[..]).unwrap(), m);
        let b = bulk_frame(42, &[9; 4096]);
        let h = Header::decode(b[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!((h.len, h.kind, h.tag), (4096, Kind::Bulk, 42));
        let mut huge = Header {
            len: 0,
            kind: Kind::Bulk,
            tag: 0,
        }
        .encode();
        huge[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Header::decode(&huge)
            .unwrap_err()
            .to_string()
            .contains("exceeds"));
    }
}

#[cfg(test)]
mod raw_bytes_tests {
    use super::Msg;

    /// The pieces' bytes are the frames a sequence of `u8` made (the wire
    /// is unchanged), and they decode to what was sent.
    #[test]
    fn collective_data_is_the_wire_of_a_byte_sequence() {
        #[derive(serde::Serialize)]
        enum Plain {
            _Hello { listen: String },
            _Table { addrs: Vec<String> },
            _Refuse { why: String },
            Up { seq: u64, data: Vec<u8> },
        }
        let data: Vec<u8> = (0..8341u32).map(|i| (i * 7) as u8).collect();
        let m = Msg::Up {
            seq: 9,
            data: data.clone(),
        };
        let fast = bincode::serialize(&m).unwrap();
        let plain = bincode::serialize(&Plain::Up {
            seq: 9,
            data: data.clone(),
        })
        .unwrap();
        assert_eq!(fast, plain);
        assert_eq!(bincode::deserialize::<Msg>(&fast).unwrap(), m);
        let empty = Msg::Down {
            seq: 1,
            data: Vec::new(),
        };
        let b = bincode::serialize(&empty).unwrap();
        assert_eq!(bincode::deserialize::<Msg>(&b).unwrap(), empty);
    }

    /// A collective's frame made from a borrowed value is the frame of the
    /// message itself, either way.
    #[test]
    fn collective_frames_are_the_messages_frames() {
        for (up, seq, data) in [
            (
                true,
                9u64,
                (0..8341u32).map(|i| (i * 7) as u8).collect::<Vec<u8>>(),
            ),
            (false, u64::MAX - 3, vec![1, 2, 3]),
            (true, 0, Vec::new()),
        ] {
            let m = if up {
                Msg::Up {
                    seq,
                    data: data.clone(),
                }
            } else {
                Msg::Down {
                    seq,
                    data: data.clone(),
                }
            };
            assert_eq!(
                super::collective_frame(up, seq, &data),
                super::control_frame(&m),
                "{m:?}"
            );
        }
    }
}
