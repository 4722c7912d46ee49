//! Steal requests between the nodes of one host, through the memory they
//! share ([`HostWords`]), instead of as messages.
//!
//! **Why.** A steal request sent as a message reaches a donor whose
//! processors compute; its communication thread sleeps and must be woken
//! onto a CPU they run on. On the 2-vCPU VM that wake-up was 23–70 µs of a
//! 35–48 µs mean round trip (BENCHMARKS.md, "A cross-node steal's round
//! trip, taken apart"), and on 16 local nodes each node made ~1 000 such
//! requests in a 0.1 s run. A donor's processors already test one word at
//! every join, their pruning word (`Ctx::limit`): where that word lies in
//! memory the thief can write, the thief asks by writing it, and the
//! donor's next join forks for real and answers from there. No thread is
//! woken, no syscall is made, and the answer is rarely a refusal: the donor
//! has just forked.
//!
//! **The words** (each node's [`HOST_WORDS`]; this layer owns the layout):
//!
//! | index | written by | meaning |
//! |---|---|---|
//! | `PENDING` (0) | thieves (+1), the donor (−1) | requests waiting here, a hint |
//! | `LINE · (p + 1)`, p < [`MAX_PROCS`] | the donor's processor `p`; thieves and its other processors store `WANTED` | processor `p`'s pruning word, each on a cache line of its own |
//! | `ASKERS + n`, n < [`MAX_NODES`] | thief `n` (its run), the donor (0) | node `n` asks for work in that run |
//!
//! **Exactly one answer per request.** A thief asks ([`HostRequests::ask`])
//! by storing its run in its slot of the donor's words, then storing
//! `WANTED` into every pruning word of the donor. Whoever takes the slot
//! back to 0 answers: a donor's processor at its next portable fork or
//! while it idles ([`HostRequests::take`]), or, if the thief heard nothing
//! for `steal::DIRECT_WAIT` and sent the request as a message after all,
//! the donor's communication thread ([`HostRequests::claim`], a
//! compare-and-swap of the slot from the request's run to 0). A thief has
//! at most one request out, so a slot set is one request, and the swap
//! decides who answers it; the message that finds the slot already taken
//! is dropped.
//!
//! **Trust.** A peer may write any value into these words. A pruning word
//! only chooses between a plain call and a fork (the stack test's red zone
//! is the owner's: a peer that wrote garbage could at worst make a join
//! call plainly where the stack is nearly full, and the guard page then
//! ends the run with a stack-overflow report); a slot's run is checked
//! against the runs in progress (`FjNode::export_half` refuses another);
//! the pending count is a hint.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::link::{HostWords, HOST_WORDS};
use crate::registry::WANTED;

/// Words in a cache line: each pruning word has a line of its own.
const LINE: usize = 8;
/// Where the count of waiting requests is.
const PENDING: usize = 0;
/// Where the thieves' slots begin.
const ASKERS: usize = HOST_WORDS / 2;
/// The most processors a node may have for its pruning words to be shared.
pub(crate) const MAX_PROCS: usize = ASKERS / LINE - 1;
/// The most nodes a job may have for steal requests to go through memory.
pub(crate) const MAX_NODES: usize = HOST_WORDS - ASKERS;

// A pruning word is read as an `AtomicUsize` by its processor and written
// as an `AtomicU64` by thieves: one size, one alignment, on the targets
// where the words are shared (`HostRequests::new` is `None` elsewhere).
#[cfg(target_pointer_width = "64")]
const _: () = assert!(
    std::mem::size_of::<AtomicUsize>() == std::mem::size_of::<AtomicU64>()
        && std::mem::align_of::<AtomicUsize>() == std::mem::align_of::<AtomicU64>()
);

/// A node's steal requests through memory shared with the other nodes of
/// its host.
pub(crate) struct HostRequests {
    words: Arc<dyn HostWords>,
    me: usize,
    nodes: usize,
    /// Where the next [`HostRequests::take`] starts looking.
    next: AtomicUsize,
}

impl std::fmt::Debug for HostRequests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostRequests(node {} of {})", self.me, self.nodes)
    }
}

impl HostRequests {
    /// Node `me`'s requests over `words`, if they fit: at most
    /// [`MAX_PROCS`] processors and [`MAX_NODES`] nodes, 64-bit words.
    pub(crate) fn new(
        words: Arc<dyn HostWords>,
        me: usize,
        nodes: usize,
        procs: usize,
    ) -> Option<HostRequests> {
        let fits = cfg!(target_pointer_width = "64")
            && procs <= MAX_PROCS
            && nodes <= MAX_NODES
            && words.words(me).is_some();
        fits.then(|| HostRequests {
            words,
            me,
            nodes,
            next: AtomicUsize::new(me + 1),
        })
    }

    fn own(&self) -> &[AtomicU64; HOST_WORDS] {
        self.words
            .words(self.me)
            .expect("hyfi: a node's own host words (checked in `new`)")
    }

    /// Processor `proc`'s pruning word, in this node's words. Valid while
    /// `self` lives.
    pub(crate) fn limit_word(&self, proc: usize) -> *const AtomicUsize {
        assert!(proc < MAX_PROCS);
        let w: &AtomicU64 = &self.own()[LINE * (proc + 1)];
        (w as *const AtomicU64).cast()
    }

    /// Thief: asks node `victim` for work in `run` (not 0), waking its
    /// `procs` processors' next joins. `false` if `victim`'s words are out
    /// of reach (another host): send a message instead.
    pub(crate) fn ask(&self, victim: usize, run: u64, procs: usize) -> bool {
        debug_assert!(run != 0);
        let Some(w) = self.words.words(victim) else {
            return false;
        };
        // A slot still set is a request of an ended run, never answered:
        // this one takes its place, and the count stays as it was.
        if w[ASKERS + self.me].swap(run, Ordering::SeqCst) == 0 {
            w[PENDING].fetch_add(1, Ordering::SeqCst);
        }
        for p in 0..procs.min(MAX_PROCS) {
            w[LINE * (p + 1)].store(WANTED as u64, Ordering::SeqCst);
        }
        true
    }

    /// Donor: whether a request may be waiting (one load; a hint).
    #[inline]
    pub(crate) fn pending(&self) -> bool {
        self.own()[PENDING].load(Ordering::Relaxed) != 0
    }

    /// Donor: takes a waiting request, `(thief, run)`: the caller must
    /// answer it.
    pub(crate) fn take(&self) -> Option<(usize, u64)> {
        let w = self.own();
        let start = self.next.load(Ordering::Relaxed);
        for k in 0..self.nodes {
            let n = (start + k) % self.nodes;
            if n == self.me || w[ASKERS + n].load(Ordering::Relaxed) == 0 {
                continue;
            }
            let run = w[ASKERS + n].swap(0, Ordering::SeqCst);
            if run != 0 {
                w[PENDING].fetch_sub(1, Ordering::SeqCst);
                self.next.store(n + 1, Ordering::Relaxed);
                return Some((n, run));
            }
        }
        None
    }

    /// Donor: node `from`'s request of `run` came as a message after all
    /// (it asked through memory and heard nothing in time). `true` if it
    /// is still waiting, now taken: answer it; `false` if a processor
    /// took it (its answer is on its way): drop the message.
    pub(crate) fn claim(&self, from: usize, run: u64) -> bool {
        if from >= MAX_NODES {
            return true;
        }
        let w = self.own();
        let took = w[ASKERS + from]
            .compare_exchange(run, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok();
        if took {
            w[PENDING].fetch_sub(1, Ordering::SeqCst);
        }
        took
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::InProcess;
    use crate::node::NodeLink;

    fn pair() -> (Vec<Arc<InProcess>>, HostRequests, HostRequests) {
        let links = InProcess::connect(2);
        let words = links[0]
            .host_words()
            .expect("the in-process link shares words");
        let a = HostRequests::new(words.clone(), 0, 2, 4).unwrap();
        let b = HostRequests::new(words, 1, 2, 4).unwrap();
        (links, a, b)
    }

    /// A request through memory is taken once, by the donor's processor or
    /// by its communication thread, never both.
    #[test]
    fn a_request_is_answered_once() {
        let (_links, thief, donor) = pair();
        assert!(!donor.pending());
        assert!(thief.ask(1, 7, 4));
        assert!(donor.pending());
        // Every pruning word of the donor now asks for a fork.
        for p in 0..4 {
            // SAFETY: `donor` lives; the word is an atomic of this size.
            let w = unsafe { &*donor.limit_word(p) };
            assert_eq!(w.load(Ordering::SeqCst), WANTED);
        }
        assert_eq!(donor.take(), Some((0, 7)));
        assert!(!donor.pending());
        // The message that follows finds it taken.
        assert!(!donor.claim(0, 7));
        assert_eq!(donor.take(), None);

        // Asked again and not taken: the message claims it.
        assert!(thief.ask(1, 7, 4));
        assert!(donor.claim(0, 7));
        assert!(!donor.pending());
        assert_eq!(donor.take(), None);
    }

    /// A slot left set by an ended run is replaced, and counted once.
    #[test]
    fn a_stale_request_is_replaced() {
        let (_links, thief, donor) = pair();
        assert!(thief.ask(1, 3, 4));
        assert!(thief.ask(1, 4, 4));
        assert!(!donor.claim(0, 3), "run 3's request was replaced");
        assert_eq!(donor.take(), Some((0, 4)));
        assert!(!donor.pending(), "one request counted once");
    }

    /// Too many processors for the words: no requests through memory.
    #[test]
    fn more_processors_than_words_fall_back_to_messages() {
        let links = InProcess::connect(2);
        let words = links[0].host_words().unwrap();
        assert!(HostRequests::new(words.clone(), 0, 2, MAX_PROCS).is_some());
        assert!(HostRequests::new(words, 0, 2, MAX_PROCS + 1).is_none());
    }
}
