//! A page's diff: the bytes a node that is not the page's home wrote in a
//! phase, found at the release by comparing the page with its twin (the
//! copy taken before the first write), and applied at the home.
//!
//! A diff is a list of *runs* of changed bytes, each `(offset u16, length
//! u16, bytes)` (little-endian), in ascending offset order; `msg.rs` frames
//! it in a `REL` as (page, run count, runs). Runs are byte-exact, never
//! word-wide: two nodes writing different bytes of one word (two `u8` or
//! `f32` elements) both keep their writes at the home, since neither diff
//! carries the other's bytes.

use crate::elem::{self, Words};
use crate::error::ProtocolError;
use crate::region::PAGE;

/// A run's header: offset u16, length u16.
const HEAD: usize = 4;

// Offsets and lengths (up to a whole page) fit a run header's u16.
const _: () = assert!(PAGE <= u16::MAX as usize);

/// Appends to `out` the runs of bytes in which the page at `page` differs
/// from `twin`; returns how many (0 appends nothing).
///
/// # Safety
/// `page` is a page-aligned page of the region (see [`elem::word`]).
pub(super) unsafe fn encode(page: *const u8, twin: &Words, out: &mut Vec<u8>) -> u32 {
    let mut runs = 0u32;
    // The open run: (its first byte's offset, its header's position in `out`).
    let mut open: Option<(usize, usize)> = None;
    fn close(open: &mut Option<(usize, usize)>, end: usize, out: &mut [u8]) {
        if let Some((start, at)) = open.take() {
            let len = (end - start) as u16;
            out[at + 2..at + HEAD].copy_from_slice(&len.to_le_bytes());
        }
    }
    for (k, &old) in twin.iter().enumerate() {
        // SAFETY: the caller's; `k` is a word of the page.
        let cur = unsafe { elem::word(page, k) };
        if cur == old {
            close(&mut open, k * 8, out.as_mut_slice());
            continue;
        }
        let (cb, ob) = (cur.to_ne_bytes(), old.to_ne_bytes());
        for b in 0..8 {
            let off = k * 8 + b;
            if cb[b] != ob[b] {
                if open.is_none() {
                    let at = out.len();
                    out.extend_from_slice(&(off as u16).to_le_bytes());
                    out.extend_from_slice(&[0, 0]);
                    open = Some((off, at));
                    runs += 1;
                }
                out.push(cb[b]);
            } else {
                close(&mut open, off, out.as_mut_slice());
            }
        }
    }
    close(&mut open, PAGE, out.as_mut_slice());
    runs
}

/// The diff of one page as a message carries it: its runs, read in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Diff<'a> {
    /// The page (global number).
    pub(super) page: u64,
    runs: u32,
    /// Exactly the runs' bytes.
    bytes: &'a [u8],
}

impl<'a> Diff<'a> {
    /// The diff of `page` whose `runs` runs begin `src` (which may go on
    /// past them): every run must lie inside the page and inside `src`.
    pub(super) fn parse(page: u64, runs: u32, src: &'a [u8]) -> Result<Self, ProtocolError> {
        let malformed = ProtocolError::MalformedDiff { page };
        let mut at = 0usize;
        for _ in 0..runs {
            let h = src.get(at..at + HEAD).ok_or_else(|| malformed.clone())?;
            let (off, len) = head(h);
            at += HEAD;
            if off + len > PAGE || src.len() - at < len {
                return Err(malformed);
            }
            at += len;
        }
        Ok(Diff {
            page,
            runs,
            bytes: &src[..at],
        })
    }

    /// The run count and the runs' bytes, to keep (and parse again).
    pub(super) fn raw(&self) -> (u32, &'a [u8]) {
        (self.runs, self.bytes)
    }

    /// The runs' length in bytes (headers included).
    pub(super) fn len(&self) -> usize {
        self.bytes.len()
    }

    /// The runs: (offset in the page, the bytes written there).
    pub(super) fn runs(&self) -> Runs<'a> {
        Runs {
            left: self.runs,
            rest: self.bytes,
        }
    }

    /// Writes the runs into `twin`, a snapshot of the page (words as they
    /// lie in memory).
    pub(super) fn apply_to_twin(&self, twin: &mut Words) {
        let page: &mut [u8] = bytemuck::cast_slice_mut(&mut twin[..]);
        for (off, bytes) in self.runs() {
            page[off..off + bytes.len()].copy_from_slice(bytes);
        }
    }

    /// Writes the runs into the page at `dst`, byte by byte.
    ///
    /// # Safety
    /// `dst` is a page-aligned page of the region (see
    /// [`elem::store_bytes`]).
    pub(super) unsafe fn apply(&self, dst: *mut u8) {
        for (off, bytes) in self.runs() {
            // SAFETY: the caller's; `parse` checked that the run lies
            // inside the page.
            unsafe { elem::store_bytes(dst.add(off), bytes) };
        }
    }
}

/// The runs of a [`Diff`], checked when it was parsed.
pub(super) struct Runs<'a> {
    left: u32,
    rest: &'a [u8],
}

impl<'a> Iterator for Runs<'a> {
    type Item = (usize, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let (off, len) = head(&self.rest[..HEAD]);
        let (bytes, rest) = self.rest[HEAD..].split_at(len);
        self.rest = rest;
        Some((off, bytes))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left as usize, Some(self.left as usize))
    }
}

impl ExactSizeIterator for Runs<'_> {}

/// A run's header: (offset, length).
fn head(h: &[u8]) -> (usize, usize) {
    (
        usize::from(u16::from_le_bytes([h[0], h[1]])),
        usize::from(u16::from_le_bytes([h[2], h[3]])),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page of words `k * 0x0101_0101`, and its twin.
    fn page() -> (Vec<u64>, Box<Words>) {
        let page: Vec<u64> = (0..PAGE as u64 / 8).map(|k| k * 0x0101_0101).collect();
        // SAFETY: a page-sized, 8-aligned buffer.
        let t = unsafe { elem::twin(page.as_ptr() as *const u8) };
        (page, t)
    }

    fn bytes(page: &mut [u64]) -> &mut [u8] {
        bytemuck::cast_slice_mut(page)
    }

    fn encoded(page: &[u64], twin: &Words) -> (u32, Vec<u8>) {
        let mut out = Vec::new();
        // SAFETY: as above.
        let runs = unsafe { encode(page.as_ptr() as *const u8, twin, &mut out) };
        (runs, out)
    }

    #[test]
    fn diffs_are_byte_exact_and_apply() {
        let (mut page, t) = page();
        let b = bytes(&mut page);
        // Bytes 0 and 2 of word 3 (byte 1 untouched), and a run across a
        // word boundary.
        b[24] = 0xaa;
        b[26] = 0xbb;
        b[60..70].fill(0xcc);
        b[PAGE - 1] = 0xdd;
        let (runs, out) = encoded(&page, &t);
        assert_eq!(runs, 4);
        let d = Diff::parse(9, runs, &out).expect("a well-formed diff");
        assert_eq!(d.len(), out.len());
        // Apply to a copy of the original: it becomes the modified page.
        let mut other: Vec<u64> = t.to_vec();
        // SAFETY: a page-sized, 8-aligned buffer.
        unsafe { d.apply(other.as_mut_ptr() as *mut u8) };
        assert_eq!(other, page);
        // And to a twin: the same words.
        let mut twin = t.clone();
        d.apply_to_twin(&mut twin);
        assert_eq!(twin.to_vec(), page);
        // A third party's write to byte 25 (between the two runs) survives.
        let mut third: Vec<u64> = t.to_vec();
        bytes(&mut third)[25] = 0x11;
        // SAFETY: as above.
        unsafe { d.apply(third.as_mut_ptr() as *mut u8) };
        assert_eq!(bytes(&mut third)[24..27], [0xaa, 0x11, 0xbb]);
        assert_eq!(
            Diff::parse(9, runs + 1, &out),
            Err(ProtocolError::MalformedDiff { page: 9 })
        );
    }

    #[test]
    fn runs_round_trip_in_order() {
        let (mut page, t) = page();
        let b = bytes(&mut page);
        b[0] = 0x5a;
        b[100..140].iter_mut().for_each(|x| *x = !*x);
        let (runs, mut out) = encoded(&page, &t);
        // Bytes after the runs (the next diff of a message) are not taken.
        out.extend_from_slice(&[1, 2, 3]);
        let d = Diff::parse(4, runs, &out).unwrap();
        assert_eq!(d.page, 4);
        assert_eq!(d.len(), out.len() - 3);
        let got: Vec<(usize, Vec<u8>)> = d.runs().map(|(o, b)| (o, b.to_vec())).collect();
        let b = bytes(&mut page);
        assert_eq!(
            got,
            vec![(0, b[0..1].to_vec()), (100, b[100..140].to_vec())]
        );
        assert_eq!(d.runs().len(), 2);
    }

    #[test]
    fn an_unchanged_page_has_no_runs_and_a_rewritten_one_has_one() {
        let (mut page, t) = page();
        let (runs, out) = encoded(&page, &t);
        assert_eq!((runs, out.len()), (0, 0));
        for w in page.iter_mut() {
            *w = !*w;
        }
        let (runs, out) = encoded(&page, &t);
        assert_eq!((runs, out.len()), (1, HEAD + PAGE));
        let d = Diff::parse(0, runs, &out).unwrap();
        assert_eq!(d.runs().next().map(|(o, b)| (o, b.len())), Some((0, PAGE)));
    }

    #[test]
    fn runs_outside_the_page_or_the_message_are_malformed() {
        let bad = Err(ProtocolError::MalformedDiff { page: 3 });
        let run = |off: u16, len: u16, n: usize| {
            let mut v = off.to_le_bytes().to_vec();
            v.extend_from_slice(&len.to_le_bytes());
            v.extend(std::iter::repeat(7).take(n));
            v
        };
        // Past the page's end.
        assert_eq!(Diff::parse(3, 1, &run(PAGE as u16 - 1, 2, 2)), bad);
        // Shorter than its length, or cut in its header.
        assert_eq!(Diff::parse(3, 1, &run(0, 5, 4)), bad);
        assert_eq!(Diff::parse(3, 1, &run(0, 5, 5)[..3]), bad);
        // The last byte of the page, and an empty run, are fine.
        assert!(Diff::parse(3, 1, &run(PAGE as u16 - 1, 1, 1)).is_ok());
        assert!(Diff::parse(3, 1, &run(PAGE as u16, 0, 0)).is_ok());
    }
}
