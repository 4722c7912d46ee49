//! The protocol's messages and their encoding, in one place: the rest of
//! the protocol builds messages only through these types and reads them
//! only through their decoders.
//!
//! A message is a kind byte, then the kind's fields, little-endian (pages
//! are global page numbers):
//!
//! | kind | class | fields after the kind byte |
//! |---|---|---|
//! | `REQ` = 1, a page request | control | epoch u64 · count u32 · page u64 × count |
//! | `PAGES` = 2, a reply | bulk | count u32 (at most [`REPLY_BATCH`]) · page u64 × count · then each page's `PAGE` bytes, in the same order |
//! | `REL` = 3, a release | bulk | epoch u64 · notices: count u32, (first page u64 · pages u32) × count · diffs: count u32, (page u64 · runs u32 · runs) × count · pushes: count u32, (page u64 · `PAGE` bytes) × count · declines: count u32, page u64 × count · carried: length u32, bytes |
//! | `BCAST` = 4, pages a home broadcasts | bulk | epoch u64 · root u32 · span u32 · then as `PAGES`: count u32 · page u64 × count · the pages' bytes |
//!
//! A diff's runs are `(offset u16 · length u16 · bytes)`, each inside the
//! page (`diff.rs` owns that format). A request's epoch is the requester's
//! completed releases; a release's is the sender's (see the README); a
//! release's carried bytes are the phase's reductions on two nodes, where
//! the `REL` exchange is the phase's only collective (`release.rs`), and
//! empty otherwise. A
//! broadcast's is its root's (the pages' home), and its span is how many
//! nodes, counted on from the receiver in the root's relative order, the
//! receiver passes it on to (itself included: a binomial tree).
//!
//! **Classes.** A request goes as control, so it overtakes pages and
//! releases queued to the same home (a filthread waits for its reply);
//! replies and releases, which carry pages, are bulk.
//!
//! **Encoding** appends to the caller's buffer (the link's frame), so a
//! page's bytes are copied once, from the region into the frame: a reply
//! or a broadcast is built in place page by page ([`PagesFrame`]) and
//! handed to the link whole. A release's
//! diffs and pushes are gathered per node during the release, each encoded
//! as it is added ([`ReleaseBody`]), and framed at the end ([`ReleaseOut`]).
//!
//! **Decoding** takes the whole frame, checks every field before the
//! protocol applies anything, and returns values that borrow from it:
//! pages, diffs and their runs are read in place. A bad message is a typed
//! [`ProtocolError`]; `Truncated`'s byte counts from after the kind byte.
//! Bytes after a reply's pages or a request's pages are ignored; after a
//! release's declines, they are an error.

use std::slice::ChunksExact;

use hyfi_core::link::{buffers, Class};

use super::diff::Diff;
use crate::error::ProtocolError;
use crate::region::PAGE;

const REQ: u8 = 1;
const PAGES: u8 = 2;
const REL: u8 = 3;
const BCAST: u8 = 4;
/// Pages per reply frame.
pub(super) const REPLY_BATCH: usize = 64;

/// A notice range's size: first page u64, pages u32.
const NOTICE: usize = 12;
/// A push's size: page u64, its bytes.
const PUSH: usize = 8 + PAGE;

/// The kind of a message received, from its first byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Request,
    Pages,
    Release,
    Broadcast,
}

impl Kind {
    pub(super) fn of(frame: &[u8]) -> Result<Kind, ProtocolError> {
        match frame.first().copied() {
            Some(REQ) => Ok(Kind::Request),
            Some(PAGES) => Ok(Kind::Pages),
            Some(REL) => Ok(Kind::Release),
            Some(BCAST) => Ok(Kind::Broadcast),
            Some(kind) => Err(ProtocolError::UnknownKind { kind }),
            None => Err(ProtocolError::Empty),
        }
    }
}

/// A message to send.
pub(super) trait Encode {
    /// The link class it goes as.
    const CLASS: Class;
    /// Whether only the receiver's phase end waits for it (a `REL`): it
    /// then need not wake the receiver while its master computes
    /// ([`hyfi_core::link::Port::send_for_phase_end`]).
    const FOR_PHASE_END: bool = false;
    /// Its length, kind byte included (the frame's capacity).
    fn encoded_len(&self) -> usize;
    /// Appends it, kind byte first, to `out`.
    fn encode(self, out: &mut Vec<u8>);
}

// ---------------------------------------------------------------------
// REQ

/// `REQ`: the pages a node asks their home for, and the requester's epoch
/// (the home serves them once its own epoch has caught up). Sent with any
/// iterator of pages; received with a [`PageList`] over the frame.
#[derive(Clone, Debug)]
pub(super) struct Request<P> {
    pub(super) epoch: u64,
    pub(super) pages: P,
}

impl<P: ExactSizeIterator<Item = u64>> Encode for Request<P> {
    const CLASS: Class = Class::Control;

    fn encoded_len(&self) -> usize {
        1 + 8 + 4 + 8 * self.pages.len()
    }

    fn encode(self, out: &mut Vec<u8>) {
        out.push(REQ);
        put_u64(out, self.epoch);
        put_u32(out, count(self.pages.len()));
        for gp in self.pages {
            put_u64(out, gp);
        }
    }
}

impl<'a> Request<PageList<'a>> {
    pub(super) fn decode(frame: &'a [u8]) -> Result<Self, ProtocolError> {
        let mut r = Rd::fields(frame, REQ)?;
        let epoch = r.u64()?;
        let n = r.u32()? as usize;
        let pages = r.pages(n)?;
        Ok(Request { epoch, pages })
    }
}

// ---------------------------------------------------------------------
// PAGES

/// `PAGES`, to send, built in place: the frame is allocated once, at its
/// full length for up to `cap` pages, and each page's bytes are copied
/// straight into it. The page server copies under its locks and hands the
/// frame to the link as it is ([`Port::send_vec`]): one copy of a served
/// page on the home, where there were two.
///
/// [`Port::send_vec`]: hyfi_core::link::Port::send_vec
///
/// A `BCAST` frame is the same after its own head ([`PagesFrame::broadcast`]).
pub(super) struct PagesFrame {
    buf: Vec<u8>,
    /// Where the count is (after the kind byte and the kind's fields).
    head: usize,
    cap: usize,
    n: usize,
}

/// Where a `BCAST` frame's span is: after the kind, the epoch and the root.
const BCAST_SPAN: usize = 1 + 8 + 4;

impl PagesFrame {
    /// An empty frame with room for `cap` pages (at most [`REPLY_BATCH`]
    /// from the server).
    pub(super) fn new(cap: usize) -> PagesFrame {
        PagesFrame::with_head(&[PAGES], cap)
    }

    /// An empty `BCAST` frame from `root` (the pages' home) in its epoch
    /// `epoch`, for a receiver that passes it on to `span` nodes.
    pub(super) fn broadcast(epoch: u64, root: u32, span: u32, cap: usize) -> PagesFrame {
        let mut head = vec![BCAST];
        put_u64(&mut head, epoch);
        put_u32(&mut head, root);
        put_u32(&mut head, span);
        debug_assert_eq!(head.len(), BCAST_SPAN + 4, "the span ends the head");
        PagesFrame::with_head(&head, cap)
    }

    fn with_head(head: &[u8], cap: usize) -> PagesFrame {
        let mut buf = Vec::with_capacity(head.len() + 4 + cap * (8 + PAGE));
        buf.extend_from_slice(head);
        // The count and `cap` page numbers, written as pages are added.
        buf.resize(head.len() + 4 + 8 * cap, 0);
        PagesFrame {
            buf,
            head: head.len(),
            cap,
            n: 0,
        }
    }

    /// Adds page `gp`, whose `PAGE` bytes `copy` appends to the frame.
    pub(super) fn push(&mut self, gp: u64, copy: impl FnOnce(&mut Vec<u8>)) {
        assert!(
            self.n < self.cap,
            "a frame holds at most {} pages",
            self.cap
        );
        let at = self.head + 4 + 8 * self.n;
        self.buf[at..at + 8].copy_from_slice(&gp.to_le_bytes());
        let before = self.buf.len();
        copy(&mut self.buf);
        assert_eq!(
            self.buf.len() - before,
            PAGE,
            "a frame's page {gp} is one page"
        );
        self.n += 1;
    }

    /// The pages added so far.
    pub(super) fn pages(&self) -> usize {
        self.n
    }

    /// The frame, its count written and, if fewer than `cap` pages were
    /// added, the unused page numbers closed up (the server skips the
    /// pages a plain-store view holds: rare).
    pub(super) fn finish(mut self) -> Vec<u8> {
        let h = self.head;
        self.buf[h..h + 4].copy_from_slice(&count(self.n).to_le_bytes());
        if self.n < self.cap {
            let gap = 8 * (self.cap - self.n);
            let body = h + 4 + 8 * self.cap;
            self.buf.copy_within(body.., body - gap);
            self.buf.truncate(self.buf.len() - gap);
        }
        self.buf
    }
}

/// `PAGES`, received: the pages and their bytes, in place.
#[derive(Clone, Debug)]
pub(super) struct Pages<'a> {
    pages: PageList<'a>,
    bytes: &'a [u8],
}

impl<'a> Pages<'a> {
    pub(super) fn decode(frame: &'a [u8]) -> Result<Self, ProtocolError> {
        Pages::read(&mut Rd::fields(frame, PAGES)?)
    }

    /// The count, the page numbers and the pages' bytes, from `r` on (a
    /// `PAGES` frame's fields, and a `BCAST` frame's after its head).
    fn read(r: &mut Rd<'a>) -> Result<Self, ProtocolError> {
        let n = r.u32()? as usize;
        let pages = r.pages(n)?;
        let bytes = r.items(n, PAGE)?;
        Ok(Pages { pages, bytes })
    }

    /// (page, its `PAGE` bytes), in the order sent.
    pub(super) fn iter(&self) -> impl ExactSizeIterator<Item = (u64, &'a [u8])> {
        self.pages.clone().zip(self.bytes.chunks_exact(PAGE))
    }
}

// ---------------------------------------------------------------------
// BCAST

/// `BCAST`, received: the root's epoch, the root, the receiver's span, and
/// the pages with their bytes, in place.
#[derive(Clone, Debug)]
pub(super) struct Broadcast<'a> {
    pub(super) epoch: u64,
    pub(super) root: u32,
    pub(super) span: u32,
    pub(super) pages: Pages<'a>,
}

impl<'a> Broadcast<'a> {
    pub(super) fn decode(frame: &'a [u8]) -> Result<Self, ProtocolError> {
        let mut r = Rd::fields(frame, BCAST)?;
        let epoch = r.u64()?;
        let root = r.u32()?;
        let span = r.u32()?;
        Ok(Broadcast {
            epoch,
            root,
            span,
            pages: Pages::read(&mut r)?,
        })
    }

    /// Sets the span of a `BCAST` frame (checked by a decode before), to
    /// pass it on.
    pub(super) fn set_span(frame: &mut [u8], span: u32) {
        frame[BCAST_SPAN..BCAST_SPAN + 4].copy_from_slice(&span.to_le_bytes());
    }
}

// ---------------------------------------------------------------------
// REL

/// What one `REL` carries to one node besides the epoch and the notices
/// (which go to every node alike): gathered during the release, page by
/// page, each item encoded as it is added.
#[derive(Default)]
pub(super) struct ReleaseBody {
    /// Diffs of pages homed there: (page u64, runs u32, runs)...
    diffs: Vec<u8>,
    ndiffs: u32,
    /// Pages homed here that it holds a copy of: (page u64, bytes)...
    pushes: Vec<u8>,
    npushes: u32,
    /// Pages homed here that it holds a copy of, as the home's own writes
    /// (a diff, encoded as `diffs` are): (page u64, runs u32, runs)...
    push_diffs: Vec<u8>,
    npush_diffs: u32,
    /// Pages it pushed here that went unused.
    declines: Vec<u64>,
}

/// Room for `more` bytes at the end of `list`, one of a `REL`'s lists:
/// past half of [`buffers::LARGE`] it grows into a buffer of the
/// transport's pool, whose pages are mapped already, and gives the one it
/// outgrew back (a list of 32 pushed pages grown by the allocator alone
/// faulted in fresh pages at every release; `hyfi_core::link::buffers`).
fn reserve(list: &mut Vec<u8>, more: usize) {
    let need = list.len() + more;
    if need <= list.capacity() || need < buffers::LARGE / 2 {
        return;
    }
    let mut bigger = buffers::with_capacity(need.max(2 * list.capacity()).max(buffers::LARGE));
    bigger.extend_from_slice(list);
    buffers::recycle(std::mem::replace(list, bigger));
}

impl Drop for ReleaseBody {
    fn drop(&mut self) {
        for list in [&mut self.diffs, &mut self.pushes, &mut self.push_diffs] {
            buffers::recycle(std::mem::take(list));
        }
    }
}

impl ReleaseBody {
    /// Adds the diff of `page`, whose runs `runs` appends, returning how
    /// many ([`super::diff::encode`]). A diff of no runs (the page was
    /// written back to what it was) is dropped. Returns the runs' bytes if
    /// the diff is kept.
    pub(super) fn diff(
        &mut self,
        page: u64,
        runs: impl FnOnce(&mut Vec<u8>) -> u32,
    ) -> Option<usize> {
        // A page's diff is about a page at most, usually (a hint: the list
        // grows as a `Vec` does past it).
        reserve(&mut self.diffs, 12 + PAGE);
        let at = self.diffs.len();
        put_u64(&mut self.diffs, page);
        put_u32(&mut self.diffs, 0); // the run count, once known
        let n = runs(&mut self.diffs);
        if n == 0 {
            self.diffs.truncate(at);
            return None;
        }
        self.diffs[at + 8..at + 12].copy_from_slice(&n.to_le_bytes());
        self.ndiffs += 1;
        Some(self.diffs.len() - at - 12)
    }

    /// Adds a push of `page`, whose `PAGE` bytes `copy` appends.
    pub(super) fn push(&mut self, page: u64, copy: impl FnOnce(&mut Vec<u8>)) {
        reserve(&mut self.pushes, 8 + PAGE);
        put_u64(&mut self.pushes, page);
        let at = self.pushes.len();
        copy(&mut self.pushes);
        assert_eq!(
            self.pushes.len() - at,
            PAGE,
            "a push of page {page} is one page"
        );
        self.npushes += 1;
    }

    /// Adds a push of `page` as a diff: `encoded`, its run count and runs
    /// as [`super::diff::encode`] wrote them.
    pub(super) fn push_diff(&mut self, page: u64, runs: u32, encoded: &[u8]) {
        reserve(&mut self.push_diffs, 12 + encoded.len());
        put_u64(&mut self.push_diffs, page);
        put_u32(&mut self.push_diffs, runs);
        self.push_diffs.extend_from_slice(encoded);
        self.npush_diffs += 1;
    }

    /// Adds a decline of `page`.
    pub(super) fn decline(&mut self, page: u64) {
        self.declines.push(page);
    }

    /// The pages pushed so far, whole or as diffs.
    pub(super) fn pushes(&self) -> u32 {
        self.npushes + self.npush_diffs
    }

    /// Nothing for its node: no diff, push or decline.
    pub(super) fn is_empty(&self) -> bool {
        self.ndiffs == 0 && self.npushes == 0 && self.npush_diffs == 0 && self.declines.is_empty()
    }
}

/// `REL`, to send: the sender's epoch, its write notices (first page,
/// pages), what it has for the receiver, and the reductions it carries.
pub(super) struct ReleaseOut<'a> {
    pub(super) epoch: u64,
    pub(super) notices: &'a [(u64, u32)],
    pub(super) body: &'a ReleaseBody,
    pub(super) carried: &'a [u8],
}

impl Encode for ReleaseOut<'_> {
    const CLASS: Class = Class::Bulk;
    // The receiver applies it in its own release, or keeps it for then if
    // it comes early (its diffs to home pages included: the pages' readers
    // are served only in the next epoch).
    const FOR_PHASE_END: bool = true;

    fn encoded_len(&self) -> usize {
        let b = self.body;
        1 + 8
            + 4
            + NOTICE * self.notices.len()
            + 4
            + b.diffs.len()
            + 4
            + b.pushes.len()
            + 4
            + b.push_diffs.len()
            + 4
            + 8 * b.declines.len()
            + 4
            + self.carried.len()
    }

    fn encode(self, out: &mut Vec<u8>) {
        let b = self.body;
        out.push(REL);
        put_u64(out, self.epoch);
        put_u32(out, count(self.notices.len()));
        for &(first, pages) in self.notices {
            put_u64(out, first);
            put_u32(out, pages);
        }
        put_u32(out, b.ndiffs);
        out.extend_from_slice(&b.diffs);
        put_u32(out, b.npushes);
        out.extend_from_slice(&b.pushes);
        put_u32(out, b.npush_diffs);
        out.extend_from_slice(&b.push_diffs);
        put_u32(out, count(b.declines.len()));
        for &gp in &b.declines {
            put_u64(out, gp);
        }
        put_u32(out, count(self.carried.len()));
        out.extend_from_slice(self.carried);
    }
}

/// `REL`, received and checked: its parts, read in place.
#[derive(Clone, Debug)]
pub(super) struct Release<'a> {
    pub(super) epoch: u64,
    notices: &'a [u8],
    ndiffs: u32,
    diffs: &'a [u8],
    pushes: &'a [u8],
    npush_diffs: u32,
    push_diffs: &'a [u8],
    declines: PageList<'a>,
    /// The sender's phase-end reductions (empty if none).
    pub(super) carried: &'a [u8],
}

impl<'a> Release<'a> {
    /// The epoch of a release, read before the rest (which waits, unread,
    /// if the release came early).
    pub(super) fn peek_epoch(frame: &[u8]) -> Result<u64, ProtocolError> {
        Rd::fields(frame, REL)?.u64()
    }

    pub(super) fn decode(frame: &'a [u8]) -> Result<Self, ProtocolError> {
        let mut r = Rd::fields(frame, REL)?;
        let epoch = r.u64()?;
        let n = r.u32()? as usize;
        let from = r.at;
        for _ in 0..n {
            r.u64()?;
            r.u32()?;
        }
        let notices = r.since(from);
        let (ndiffs, diffs) = Self::diff_list(&mut r)?;
        let n = r.u32()? as usize;
        let from = r.at;
        for _ in 0..n {
            r.u64()?;
            r.bytes(PAGE)?;
        }
        let pushes = r.since(from);
        let (npush_diffs, push_diffs) = Self::diff_list(&mut r)?;
        let n = r.u32()? as usize;
        let declines = r.pages(n)?;
        let n = r.u32()? as usize;
        let carried = r.bytes(n)?;
        if !r.rest().is_empty() {
            return Err(ProtocolError::StrayBytes {
                len: r.rest().len(),
            });
        }
        Ok(Release {
            epoch,
            notices,
            ndiffs,
            diffs,
            pushes,
            npush_diffs,
            push_diffs,
            declines,
            carried,
        })
    }

    /// A count of diffs and the diffs (page, run count, runs), each
    /// checked; returns the count and their bytes, in place.
    fn diff_list(r: &mut Rd<'a>) -> Result<(u32, &'a [u8]), ProtocolError> {
        let n = r.u32()?;
        let from = r.at;
        for _ in 0..n {
            let gp = r.u64()?;
            let runs = r.u32()?;
            let d = Diff::parse(gp, runs, r.rest())?;
            r.bytes(d.len())?;
        }
        Ok((n, r.since(from)))
    }

    /// The write notices: (first page, pages).
    pub(super) fn notices(&self) -> impl ExactSizeIterator<Item = (u64, u32)> + 'a {
        self.notices
            .chunks_exact(NOTICE)
            .map(|c| (le_u64(&c[..8]), le_u32(&c[8..])))
    }

    /// The diffs of pages homed at the receiver.
    pub(super) fn diffs(&self) -> Diffs<'a> {
        Diffs {
            left: self.ndiffs,
            rest: self.diffs,
        }
    }

    /// The pages pushed to the receiver: (page, its `PAGE` bytes).
    pub(super) fn pushes(&self) -> impl ExactSizeIterator<Item = (u64, &'a [u8])> {
        self.pushes
            .chunks_exact(PUSH)
            .map(|c| (le_u64(&c[..8]), &c[8..]))
    }

    /// The pages pushed to the receiver as the home's own writes: diffs,
    /// each to apply to a copy the receiver holds.
    pub(super) fn push_diffs(&self) -> Diffs<'a> {
        Diffs {
            left: self.npush_diffs,
            rest: self.push_diffs,
        }
    }

    /// The pages the sender declines (pushed by the receiver, unused).
    pub(super) fn declines(&self) -> PageList<'a> {
        self.declines.clone()
    }
}

/// The diffs of a [`Release`], checked when it was decoded.
pub(super) struct Diffs<'a> {
    left: u32,
    rest: &'a [u8],
}

impl<'a> Iterator for Diffs<'a> {
    type Item = Diff<'a>;

    fn next(&mut self) -> Option<Diff<'a>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let (gp, runs) = (le_u64(&self.rest[..8]), le_u32(&self.rest[8..12]));
        let d = Diff::parse(gp, runs, &self.rest[12..]).expect("checked by Release::decode");
        self.rest = &self.rest[12 + d.len()..];
        Some(d)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left as usize, Some(self.left as usize))
    }
}

impl ExactSizeIterator for Diffs<'_> {}

// ---------------------------------------------------------------------
// Fields

/// Global pages as a message carries them (u64 each), read in place.
#[derive(Clone, Debug)]
pub(super) struct PageList<'a>(ChunksExact<'a, u8>);

impl Iterator for PageList<'_> {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        self.0.next().map(le_u64)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.0.size_hint()
    }
}

impl ExactSizeIterator for PageList<'_> {}

/// A count of items, as a u32 field.
fn count(n: usize) -> u32 {
    u32::try_from(n).expect("fewer than 2^32 items in a message")
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Callers pass exactly 4 bytes.
fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b.try_into().expect("4 bytes"))
}

/// Callers pass exactly 8 bytes.
fn le_u64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b.try_into().expect("8 bytes"))
}

/// A reader of a message's fields.
struct Rd<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Rd<'a> {
    /// The fields of `frame`, a message of `kind` (to this decoder, a
    /// message of another kind is of an unknown one).
    fn fields(frame: &'a [u8], kind: u8) -> Result<Self, ProtocolError> {
        match frame.first().copied() {
            Some(k) if k == kind => Ok(Rd {
                b: &frame[1..],
                at: 0,
            }),
            Some(kind) => Err(ProtocolError::UnknownKind { kind }),
            None => Err(ProtocolError::Empty),
        }
    }

    fn bytes(&mut self, n: usize) -> Result<&'a [u8], ProtocolError> {
        let s = self
            .b
            .get(self.at..self.at.saturating_add(n))
            .ok_or(ProtocolError::Truncated { at: self.at })?;
        self.at += n;
        Ok(s)
    }

    /// `n` items of `size` bytes; cut short at the first incomplete one.
    fn items(&mut self, n: usize, size: usize) -> Result<&'a [u8], ProtocolError> {
        let whole = self.rest().len() / size;
        if whole < n {
            return Err(ProtocolError::Truncated {
                at: self.at + whole * size,
            });
        }
        self.bytes(n * size)
    }

    fn pages(&mut self, n: usize) -> Result<PageList<'a>, ProtocolError> {
        Ok(PageList(self.items(n, 8)?.chunks_exact(8)))
    }

    fn u32(&mut self) -> Result<u32, ProtocolError> {
        self.bytes(4).map(le_u32)
    }

    fn u64(&mut self) -> Result<u64, ProtocolError> {
        self.bytes(8).map(le_u64)
    }

    fn rest(&self) -> &'a [u8] {
        &self.b[self.at..]
    }

    /// The bytes read since offset `from`.
    fn since(&self, from: usize) -> &'a [u8] {
        &self.b[from..self.at]
    }
}

#[cfg(test)]
mod tests;
