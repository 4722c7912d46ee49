//! A page's diff: the bytes a node that is not the page's home wrote in a
//! phase, found at the release by comparing the page with its twin (the
//! copy taken before the first write), and applied at the home.
//!
//! A diff is a list of *runs* of changed bytes, each `(offset u16, length
//! u16, bytes)` (little-endian), in ascending offset order; `msg.rs` frames
//! it in a `REL` as (page, run count, runs). Runs are made of whole
//! *grains* of the page's array, its element alignment up to a word, never
//! wider: two nodes writing different elements in one word (two `u8` or
//! `f32` elements) both keep their writes at the home, since neither diff
//! carries the other's bytes (see [`encode`]).

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
/// A run is made of whole *grains*, aligned chunks of `grain` bytes (1, 2,
/// 4 or 8): a grain any byte of which changed is sent whole. The grain is
/// the page's array's element alignment (at most 8, `Segment::grain`), so
/// no grain holds bytes of two elements: a grain of another node's element
/// is never in a run, and the unchanged bytes of a changed element sent
/// with it are this node's own (the element is this node's to write in the
/// phase, or the program races). For `f64`s a changed element is then one
/// copy, where byte-exact runs split it around its unchanged sign and
/// exponent bytes, a run each.
///
/// # Safety
/// `page` is a page-aligned page of the region (see [`elem::word`]).
pub(super) unsafe fn encode(page: *const u8, twin: &Words, out: &mut Vec<u8>, grain: usize) -> u32 {
    debug_assert!(matches!(grain, 1 | 2 | 4 | 8), "grain {grain}");
    // SAFETY (of each `word`): the caller's; `k` is a word of the page.
    let Some(first) = (0..twin.len()).find(|&k| unsafe { elem::word(page, k) } != twin[k]) else {
        return 0;
    };
    // Built in a buffer of the most a page's runs take (`MAX_RUNS`) and 8
    // bytes to spare (a run's bytes are
    // stored a word at a time, and only the changed ones counted), then
    // appended to `out` in one copy.
    let mut buf = [0u8; MAX_RUNS + 8];
    let mut n = 0usize;
    let mut runs = 0u32;
    // The open run's header position in `buf`, and its first byte's offset.
    let mut open: Option<(usize, usize)> = None;
    let close = |open: &mut Option<(usize, usize)>, end: usize, buf: &mut [u8]| {
        if let Some((at, start)) = open.take() {
            buf[at + 2..at + HEAD].copy_from_slice(&((end - start) as u16).to_le_bytes());
        }
    };
    // One grain's bits in a byte mask.
    let lanes = (1u32 << grain) - 1;
    for (k, &old) in twin.iter().enumerate().skip(first) {
        // SAFETY: as above.
        let cur = unsafe { elem::word(page, k) };
        if cur == old {
            close(&mut open, k * 8, &mut buf);
            continue;
        }
        // The word's bytes in memory order, as a little-endian number (byte
        // `b` is bits 8b..8b+8 on any machine), and which of them go in a
        // run: bit `b` for byte `b`, whole grains.
        let (cur, x) = (
            u64::from_le_bytes(cur.to_ne_bytes()),
            u64::from_le_bytes((cur ^ old).to_ne_bytes()),
        );
        let changed = if grain == 8 {
            0xff
        } else {
            let mut c = 0u32;
            for g in (0..8).step_by(grain) {
                if x >> (8 * g) & ((1u64 << (8 * grain)) - 1) != 0 {
                    c |= lanes << g;
                }
            }
            c
        };
        let mut b = 0usize;
        while b < 8 {
            let rest = changed >> b;
            if rest & 1 == 0 {
                // Unchanged grains end the open run.
                close(&mut open, k * 8 + b, &mut buf);
                if rest == 0 {
                    break;
                }
                b += rest.trailing_zeros() as usize;
                continue;
            }
            let e = b + (!rest).trailing_zeros() as usize;
            if open.is_none() {
                let off = (k * 8 + b) as u16;
                buf[n..n + 2].copy_from_slice(&off.to_le_bytes());
                open = Some((n, k * 8 + b));
                n += HEAD;
                runs += 1;
            }
            // Bytes b.. of the word: 8 stored, e − b kept.
            buf[n..n + 8].copy_from_slice(&(cur >> (8 * b)).to_le_bytes());
            n += e - b;
            b = e;
        }
    }
    close(&mut open, PAGE, &mut buf);
    out.extend_from_slice(&buf[..n]);
    runs
}

/// The most bytes a page's runs take: `r` runs need `r − 1` unchanged
/// bytes between them, so at most `PAGE / 2` runs, holding at most
/// `PAGE − (r − 1)` bytes: `HEAD·r + PAGE − r + 1`, largest at `r = PAGE/2`
/// (two changed bytes, then one of each: 10 241 bytes).
const MAX_RUNS: usize = (HEAD - 1) * (PAGE / 2) + PAGE + 1;

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
        let runs = unsafe { encode(page.as_ptr() as *const u8, twin, &mut out, 1) };
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
    fn runs_are_whole_grains_and_two_writers_of_one_word_keep_their_elements() {
        let (base, t) = page();
        // Words 3 and 4 change in their low bytes only (as a nearby f64
        // does, its sign and exponent bytes unchanged), word 9 in byte 5.
        let mut page = base.clone();
        page[3] ^= 0x00ff_ff00;
        page[4] ^= 0x0000_00ff;
        page[9] ^= 0xff << 40;
        let at = |off: usize, len: usize| (off, len);
        for (grain, want) in [
            // Byte-exact: the changed bytes alone.
            (1, vec![at(25, 2), at(32, 1), at(77, 1)]),
            // Whole halves of words.
            (2, vec![at(24, 4), at(32, 2), at(76, 2)]),
            (4, vec![at(24, 4), at(32, 4), at(76, 4)]),
            // Whole words: two changed words are one run.
            (8, vec![at(24, 16), at(72, 8)]),
        ] {
            let mut out = Vec::new();
            // SAFETY: a page-sized, 8-aligned buffer.
            let runs = unsafe { encode(page.as_ptr() as *const u8, &t, &mut out, grain) };
            let d = Diff::parse(0, runs, &out).unwrap();
            let got: Vec<_> = d.runs().map(|(o, b)| (o, b.len())).collect();
            assert_eq!(got, want, "grain {grain}");
            // Applied to the twin, it gives the page.
            let mut other: Vec<u64> = t.to_vec();
            // SAFETY: as above.
            unsafe { d.apply(other.as_mut_ptr() as *mut u8) };
            assert_eq!(other, page, "grain {grain}");
        }
        // Two nodes write the two u32 elements of one word (grain 4): the
        // home applies both diffs and keeps both writes.
        let (mut a, mut b) = (base.clone(), base.clone());
        bytes(&mut a)[40..44].copy_from_slice(&7u32.to_ne_bytes());
        bytes(&mut b)[44..48].copy_from_slice(&9u32.to_ne_bytes());
        let mut home: Vec<u64> = t.to_vec();
        for writer in [&a, &b] {
            let mut out = Vec::new();
            // SAFETY: as above.
            let runs = unsafe { encode(writer.as_ptr() as *const u8, &t, &mut out, 4) };
            let d = Diff::parse(0, runs, &out).unwrap();
            // SAFETY: as above.
            unsafe { d.apply(home.as_mut_ptr() as *mut u8) };
        }
        assert_eq!(bytes(&mut home)[40..44], 7u32.to_ne_bytes());
        assert_eq!(bytes(&mut home)[44..48], 9u32.to_ne_bytes());
    }

    #[test]
    fn the_most_runs_a_page_can_have_fit() {
        // Two changed bytes, then an unchanged and a changed one by turns:
        // PAGE / 2 runs, the most bytes a diff can take.
        let (mut page, t) = page();
        let b = bytes(&mut page);
        for (i, x) in b.iter_mut().enumerate() {
            if i < 2 || i % 2 == 1 {
                *x = !*x;
            }
        }
        let (runs, out) = encoded(&page, &t);
        assert_eq!(runs as usize, PAGE / 2);
        assert_eq!(out.len(), MAX_RUNS);
        let d = Diff::parse(0, runs, &out).unwrap();
        let mut other: Vec<u64> = t.to_vec();
        // SAFETY: a page-sized, 8-aligned buffer.
        unsafe { d.apply(other.as_mut_ptr() as *mut u8) };
        assert_eq!(other, page);
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
