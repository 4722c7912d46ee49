//! The protocol's messages: a kind byte, then the kind's fields
//! (little-endian), and a reader of their payloads.

use crate::error::ProtocolError;

// The messages: a kind byte, then the kind's fields (little-endian).
// `REQ` (a page request: epoch u64, count u32, global pages u64...) goes
// as control, so it overtakes pages and releases queued to the same home;
// `PAGES` (count u32, global pages u64..., the pages' bytes) and `REL`
// (epoch u64, notice ranges, diffs) are bulk.
pub(super) const REQ: u8 = 1;
pub(super) const PAGES: u8 = 2;
pub(super) const REL: u8 = 3;
/// Pages per reply frame.
pub(super) const REPLY_BATCH: usize = 64;

/// What one `REL` carries to one node besides the notices.
#[derive(Default)]
pub(super) struct Body {
    /// Diffs of pages homed there: (page u64, runs u32, runs)...
    pub(super) diffs: Vec<u8>,
    pub(super) ndiffs: u32,
    /// Pages homed here that it holds a copy of: (page u64, bytes)...
    pub(super) pushes: Vec<u8>,
    pub(super) npushes: u32,
    /// Pages it pushed here that went unused.
    pub(super) declines: Vec<u64>,
}

/// A little reader of message payloads.
pub(super) struct Rd<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Rd<'a> {
    pub(super) fn new(b: &'a [u8]) -> Self {
        Rd { b, at: 0 }
    }
    pub(super) fn bytes(&mut self, n: usize) -> Result<&'a [u8], ProtocolError> {
        let s = self
            .b
            .get(self.at..self.at + n)
            .ok_or(ProtocolError::Truncated { at: self.at })?;
        self.at += n;
        Ok(s)
    }
    pub(super) fn u32(&mut self) -> Result<u32, ProtocolError> {
        Ok(u32::from_le_bytes(self.bytes(4)?.try_into().expect("4")))
    }
    pub(super) fn u64(&mut self) -> Result<u64, ProtocolError> {
        Ok(u64::from_le_bytes(self.bytes(8)?.try_into().expect("8")))
    }
    pub(super) fn rest(&self) -> &'a [u8] {
        &self.b[self.at..]
    }
}
