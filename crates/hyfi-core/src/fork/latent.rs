//! Latent joins: the shallowest pruned joins of the running filthread list
//! their second branch where a thief can take it, so that an idle processor
//! (or another node) gets the largest piece of work there is, without the
//! busy processor's help.
//!
//! **Why.** Pruning makes a join a plain call unless a fork is wanted; when
//! one is, the busy processor forks at its *next* join, at whatever depth
//! it has reached. In a balanced recursion (fib, quad) that piece is big
//! enough. In an unbalanced one (a search tree, UTS) the current depth's
//! subtrees are mostly tiny, so processors trade crumbs; and inside a
//! subtree run as the pruned copy no join tests at all, so a thief waits
//! until the copy ends. A deque of every join (rayon) gives thieves the
//! oldest, largest job, at the price of a push and a pop per join.
//!
//! **What.** Each processor has [`SLOTS`] latent slots. While the processor
//! is *armed* (one more test in the pruning test, `Ctx::join_with`), a
//! pruned join is *listed*: it builds its job in its frame as a real fork
//! would, stores the job's address in the next slot, runs its first
//! branch, then *unlists* it and runs the second branch itself, unless a
//! thief claimed it meanwhile; then it waits for the job's latch as a join
//! whose job was stolen. After [`BATCH`] listings in a row the processor
//! disarms, so the joins below them (almost all joins) pay the test only;
//! it arms again when a listed join is unlisted (its second branch, now
//! running, holds the next largest pieces) and when a filthread starts or
//! resumes. So the listed joins are the shallowest pruned joins whose first
//! branch is running, [`BATCH`] at a time, and the lowest slot holds the
//! largest piece.
//!
//! Arming is a flag, not a stack address to compare with: a first build
//! disarmed by storing the last listed join's stack pointer and listed
//! the joins above it, and fib's every join ran 5–15 % slower on two
//! processors with the same instructions per join (BENCHMARKS.md,
//! "Latent joins", where the cost that remains is measured too).
//!
//! **Who takes them.** A thief on the node (`Ctx::steal`, before the
//! deques and incoming lists: the largest piece first) claims the lowest
//! unclaimed slot of a victim and asks the victim for one more real fork,
//! as a deque steal does; a donor node's steal answer (`remote::balance`)
//! claims the lowest *portable* one (a `join_remote`) and ships it.
//!
//! **Off by default** ([`Config::latent_joins`](crate::Config::latent_joins)):
//! on two CPUs the gain and the cost were both a few per cent
//! (BENCHMARKS.md, "Latent joins"); 16 processors, where each steal's
//! piece matters more, have not measured it yet.
//!
//! # The protocol
//!
//! A slot holds `0` (empty) or a listed join's [`Listing`] address with
//! tag bits: [`PORTABLE`] (a `join_remote`, which may leave the node) and
//! [`CLAIMED`]. Only the owner (the processor running the joins) stores a
//! listing into a slot or empties it; a thief only sets [`CLAIMED`], by a
//! compare-and-swap from the unclaimed value, and reads the listing (its
//! [`JobRef`]) after winning it, never before. So:
//!
//! * **One owner per job.** The owner unlists by a compare-and-swap from
//!   the unclaimed value to `0`: exactly one of it and the thieves wins
//!   (the job-lifetime invariant's first rule, `crate::job`).
//! * **The frame outlives the claim.** A thief that won a slot reads the
//!   listing, in the owner's frame; the owner cannot leave that frame
//!   before its unlisting fails on the claimed value, and then it waits for
//!   the job's latch, which the thief sets last (the invariant's second and
//!   third rules). The listing's address may have been listed, unlisted and
//!   listed again by a deeper join of the same stack meanwhile (an ABA):
//!   harmless, since the thief reads the listing only after its swap, and
//!   then reads the job listed now.
//! * **Filthreads that suspend.** The slots belong to the processor, and a
//!   filthread that suspends leaves its frames behind while another runs.
//!   So when a filthread suspends (`Filthread::resume` returns), its
//!   listings are *withdrawn*: each slot is emptied by the same
//!   compare-and-swap, and the owner notes in the listing (a `Cell` only it
//!   touches) whether the join was withdrawn or claimed; the join reads the
//!   note instead of the slot when it unlists. A resumed filthread lists
//!   its deeper joins from slot 0 again.
//! * **One processor, one node**: nobody could take a listed job, so no
//!   join is listed (the processor never arms; nor with pruning off, where
//!   every join forks, or [`Config::latent_joins`](crate::Config::latent_joins) off).

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::job::JobRef;
use crate::sched::Ctx;

/// Latent slots per processor: at most this many joins listed at once.
pub(crate) const SLOTS: usize = 16;

/// Joins listed in a row before the processor disarms (module docs): two,
/// so that few joins are listed (a listing costs about 9 ns more than a
/// pruned join) and a thief still finds the next piece when it took one.
pub(crate) const BATCH: usize = 2;

/// Tag of a slot whose listing a thief claimed.
const CLAIMED: usize = 1;
/// Tag of a slot whose job may leave the node (a `join_remote`).
const PORTABLE: usize = 2;
/// The tag bits (a [`Listing`] is aligned to 8 bytes).
const TAGS: usize = 7;

/// A processor's latent slots, read and claimed by other processors and by
/// the node's steal answers. Aligned so that the owner's stores land on
/// lines of their own, not on the worker's parker and pruning-word pointer
/// beside them.
#[repr(align(128))]
pub(crate) struct LatentSlots {
    slots: [AtomicUsize; SLOTS],
}

impl LatentSlots {
    pub(crate) fn new() -> LatentSlots {
        LatentSlots {
            slots: std::array::from_fn(|_| AtomicUsize::new(0)),
        }
    }

    /// Claims the lowest listed job (the largest piece), if any; with
    /// `portable_only`, the lowest that may leave the node. The caller owns
    /// the job (runs or ships it) under the job-lifetime invariant.
    pub(crate) fn claim(&self, portable_only: bool) -> Option<JobRef> {
        for s in &self.slots {
            let v = s.load(Ordering::Acquire);
            if v == 0 {
                // Slots fill from the lowest: nothing listed above an empty one.
                return None;
            }
            if v & CLAIMED != 0 || (portable_only && v & PORTABLE == 0) {
                continue;
            }
            if s.compare_exchange(v, v | CLAIMED, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                // SAFETY: the swap made us the job's one owner, and its
                // joiner cannot leave the frame holding the listing until
                // the job's latch is set (module docs, "The protocol").
                // The listing is the one stored with the value we swapped
                // (release store, acquire swap).
                return Some(unsafe { (*((v & !TAGS) as *const Listing)).job });
            }
        }
        None
    }

    /// Whether a slot holds a listing nobody claimed yet: an idle
    /// processor's reason to wake up.
    pub(crate) fn any_listed(&self) -> bool {
        self.slots
            .iter()
            .map(|s| s.load(Ordering::SeqCst))
            .take_while(|&v| v != 0)
            .any(|v| v & CLAIMED == 0)
    }
}

/// What became of a listing, noted by its owner when it withdrew it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Note {
    /// In its slot: unlist it there.
    Listed,
    /// Withdrawn unclaimed: the join runs its second branch.
    Withdrawn,
    /// Claimed before it was withdrawn: the join waits for the job.
    Claimed,
}

/// A listed join's entry, in its frame: the job a thief takes, and the
/// owner's own bookkeeping.
#[repr(align(8))]
pub(crate) struct Listing {
    job: JobRef,
    slot: Cell<usize>,
    note: Cell<Note>,
}

impl Listing {
    pub(crate) fn new(job: JobRef) -> Listing {
        Listing {
            job,
            slot: Cell::new(0),
            note: Cell::new(Note::Withdrawn),
        }
    }

    /// What its slot holds while it is listed and unclaimed: its address,
    /// tagged [`PORTABLE`] if its job may leave the node.
    fn slot_value(&self) -> usize {
        let tag = if self.job.portable().is_some() {
            PORTABLE
        } else {
            0
        };
        self as *const Listing as usize | tag
    }
}

/// What [`Ctx::run_first_listed`] did with a join's first branch.
pub(crate) enum Listed<A, RA> {
    /// Every slot was taken: nothing ran, and the branch comes back.
    NotListed(A),
    /// The branch ran (its result, or its panic). `claimed`: a thief has
    /// the second branch; wait for its job's latch before leaving the frame.
    Ran {
        ra: std::thread::Result<RA>,
        claimed: bool,
    },
}

impl Ctx {
    /// A listed join's first part, for every kind of join: lists `job`
    /// (its second branch, in the caller's frame), runs `a` catching its
    /// panic, and unlists the job. The caller then runs the second branch
    /// or, if it was claimed, waits for the job's latch.
    #[inline]
    pub(crate) fn run_first_listed<A, RA>(&self, job: JobRef, a: A) -> Listed<A, RA>
    where
        A: FnOnce(&Ctx) -> RA,
    {
        let listing = Listing::new(job);
        if !self.list(&listing) {
            return Listed::NotListed(a);
        }
        self.count_filaments(1);
        let ra = catch_unwind(AssertUnwindSafe(|| a(self)));
        // The job points into the caller's frame: unlist it (or learn of
        // its claimer) even if `a` panicked.
        Listed::Ran {
            ra,
            claimed: self.unlist(&listing),
        }
    }

    /// Lists `l` in the next slot. `false` if all are taken (the join then
    /// runs as a plain one, and deeper joins stop trying).
    #[inline]
    pub(crate) fn list(&self, l: &Listing) -> bool {
        let i = self.latent_len.get();
        if i >= SLOTS {
            self.latent_armed.set(false);
            return false;
        }
        l.slot.set(i);
        l.note.set(Note::Listed);
        // Sequentially consistent, as the idle count read next: an idle
        // processor counts itself idle, then looks at the slots before it
        // sleeps (`sched`), so one of the two sees the other.
        self.ws().latent.slots[i].store(l.slot_value(), Ordering::SeqCst);
        self.latent_len.set(i + 1);
        let sh = &*self.shared;
        if sh.idle.load(Ordering::SeqCst) > 0 {
            sh.notify_idle();
        }
        if (i + 1) % BATCH == 0 {
            self.latent_armed.set(false);
        }
        true
    }

    /// Unlists `l` after the join's first branch: `true` if a thief claimed
    /// its job (wait for its latch), `false` if the second branch is ours.
    #[inline]
    pub(crate) fn unlist(&self, l: &Listing) -> bool {
        match l.note.get() {
            Note::Withdrawn => false,
            Note::Claimed => true,
            Note::Listed => {
                let i = l.slot.get();
                let slot = &self.ws().latent.slots[i];
                let claimed = slot
                    .compare_exchange(l.slot_value(), 0, Ordering::Acquire, Ordering::Acquire)
                    .is_err();
                if claimed {
                    slot.store(0, Ordering::Relaxed);
                }
                self.latent_len.set(i);
                self.latent_armed.set(self.latent_on);
                claimed
            }
        }
    }

    /// Withdraws every listing of the filthread that just suspended (see
    /// the module docs), noting in each whether it was claimed first.
    pub(crate) fn withdraw_listings(&self) {
        if self.latent_len.get() == 0 {
            return;
        }
        let slots = &self.ws().latent.slots;
        for s in &slots[..self.latent_len.get()] {
            let v = s.load(Ordering::Acquire);
            // SAFETY: slots below `latent_len` hold listings of the
            // suspended filthread's live frames (it unlists before leaving
            // a frame); only this thread writes their notes.
            let l = unsafe { &*((v & !TAGS) as *const Listing) };
            let withdrawn = v & CLAIMED == 0
                && s.compare_exchange(v, 0, Ordering::Acquire, Ordering::Acquire)
                    .is_ok();
            if !withdrawn {
                s.store(0, Ordering::Relaxed);
            }
            l.note.set(if withdrawn {
                Note::Withdrawn
            } else {
                Note::Claimed
            });
        }
        self.latent_len.set(0);
    }
}
