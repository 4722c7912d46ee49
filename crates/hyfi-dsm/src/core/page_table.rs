//! The page table: per-page states (what the accessors test), and the
//! locked per-page metadata (waiters, twin, pending bits, copy set).

use std::sync::atomic::{AtomicU64, AtomicU8};
use std::sync::Mutex;

use hyfi_core::filthread::Waker;

use crate::elem::Words;
use crate::region::PAGE;

pub(crate) const INVALID: u8 = 0;
pub(crate) const PENDING: u8 = 1;
pub(crate) const READ: u8 = 2;
pub(crate) const WRITE: u8 = 3;
/// Flag on `READ`/`WRITE`: the page's bytes arrived during this phase. A
/// page valid since the phase began was made valid before the phase's
/// barrier, which orders its bytes before every access of the phase, so
/// the accessors' hit test may load its state `Relaxed` (letting the
/// compiler keep the array's shape and pointers in registers). A page
/// installed during the phase needs the `Acquire` load that pairs with the
/// installer's `Release`: the flag sends its reads to that path until the
/// release clears it.
pub(crate) const FRESH: u8 = 4;
/// Flag on `READ`: the page's home pushed it at the last release (producer
/// push) and no access has touched it since. Every accessor's hit test
/// fails on it, so the first access of the phase goes through `ensure`,
/// which clears the flag: a page that still carries it at the next release
/// was not used, and this node declines further pushes of it (see the
/// module docs). Once per pushed page and phase, off the element path.
pub(crate) const PUSHED: u8 = 8;

/// Whether a page in state `st` is valid here (readable) and not waiting
/// for its first use since a push.
#[inline(always)]
pub(crate) fn readable(st: u8) -> bool {
    (READ..PUSHED).contains(&st)
}

/// Whether a page in state `st` is writable here (twin taken if needed).
#[inline(always)]
pub(crate) fn writable(st: u8) -> bool {
    st & WRITE == WRITE
}

/// Whether a page whose state was loaded `Relaxed` may be read: valid
/// since the phase began (not `FRESH`).
#[inline(always)]
pub(crate) fn settled_readable(st: u8) -> bool {
    st | 1 == WRITE
}

/// A set of small numbers (processors, nodes); empty until first used.
#[derive(Default)]
pub(super) struct Bits(Vec<u64>);

impl Bits {
    /// Adds `k`; true if it was not there.
    pub(super) fn insert(&mut self, k: usize) -> bool {
        let (w, b) = (k / 64, 1u64 << (k % 64));
        if self.0.len() <= w {
            self.0.resize(w + 1, 0);
        }
        let new = self.0[w] & b == 0;
        self.0[w] |= b;
        new
    }
    /// How many members.
    pub(super) fn len(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }
    pub(super) fn is_empty(&self) -> bool {
        self.0.iter().all(|&w| w == 0)
    }
    pub(super) fn remove(&mut self, k: usize) {
        if let Some(w) = self.0.get_mut(k / 64) {
            *w &= !(1u64 << (k % 64));
        }
    }
    /// The members, in increasing order.
    pub(super) fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().enumerate().flat_map(|(w, &word)| {
            let mut word = word;
            std::iter::from_fn(move || {
                (word != 0).then(|| {
                    let b = word.trailing_zeros() as usize;
                    word &= word - 1;
                    w * 64 + b
                })
            })
        })
    }
    /// Empties the set, calling `f` with each member.
    pub(super) fn drain(&mut self, f: impl FnMut(usize)) {
        self.iter().for_each(f);
        self.0.iter_mut().for_each(|w| *w = 0);
    }
}

/// One page's protected state.
#[derive(Default)]
pub(crate) struct Meta {
    pub(super) waiters: Vec<Waker>,
    pub(super) twin: Option<Box<Words>>,
    /// The slot (processor) whose request is in flight.
    pub(super) requester: usize,
    /// Pending bits, one per slot (processor): who waits for this page.
    /// Each slot with its bit set counts the page in its outstanding
    /// counter until the page arrives.
    pub(super) pending: Bits,
    /// At the home: the nodes holding a copy it served or pushed them (the
    /// copy set), until they decline a push. A member whose copy another
    /// writer's notice invalidated stays in it: it is pushed the page once
    /// more and declines it.
    pub(super) copies: Bits,
    /// At the home: every node may hold a copy it was never served (a
    /// zeroed array starts valid everywhere), so the home's next write of
    /// the page goes out as a notice to every node rather than as pushes.
    pub(super) presumed: bool,
    /// At the home: it wrote the page this phase through a write fault
    /// (the page had copies elsewhere). Cleared at the release.
    pub(super) faulted: bool,
    /// At the home: one more than the epoch of the last release in which
    /// another node's diff of the page was applied here (0: none).
    pub(super) diffed: u64,
    /// At the home: `twin` was taken at the home's write fault because
    /// another node wrote the page lately (`diffed`): the release pushes
    /// the home's own writes to the copies as a diff against it, which a
    /// copy that another writer changed can take too (see
    /// `Core::diffs_and_pushes`).
    pub(super) own_twin: bool,
    /// A broadcast installed the page while this node's request for it was
    /// in flight: the reply is dropped when it comes (core/broadcast.rs).
    pub(super) reply_due: bool,
}

/// One shared array's pages.
pub(crate) struct Segment {
    pub(crate) seq: u64,
    pub(crate) base: *mut u8,
    /// Global number of the first page.
    pub(crate) first: u64,
    pub(crate) homes: Box<[u16]>,
    /// The array's element alignment, at most 8 (1, 2, 4 or 8 bytes): the
    /// chunks its diffs' runs are made of (core/diff.rs).
    pub(crate) grain: usize,
    pub(crate) state: Box<[AtomicU8]>,
    pub(super) meta: Box<[Mutex<Meta>]>,
    /// This node's access mode for the array in the current access epoch
    /// (read-only or written): see footprint.rs.
    pub(crate) access: AtomicU64,
    /// Plain-store views' claims and their call sites' history (plain.rs).
    pub(crate) plain: crate::plain::PlainState,
}

// SAFETY: `base` points into the region, which outlives every segment (the
// core owns both); the bytes behind it are only accessed through atomics
// (elem.rs), and the per-page metadata is behind locks.
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

impl Segment {
    pub(crate) fn pages(&self) -> usize {
        self.homes.len()
    }
    pub(super) fn page_ptr(&self, p: usize) -> *mut u8 {
        // SAFETY (of the arithmetic): p < pages, inside the allocation.
        self.base.wrapping_add(p * PAGE)
    }
    pub(super) fn lock(&self, p: usize) -> std::sync::MutexGuard<'_, Meta> {
        self.meta[p].lock().unwrap_or_else(|e| e.into_inner())
    }
}
