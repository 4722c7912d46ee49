//! Plain-store views and the page server (the node-local rule is in
//! `plain.rs` at the crate root).
//!
//! A home page's bytes are copied out by the communication thread when
//! another node asks for the page, possibly in the middle of a phase. A
//! plain store racing with that copy would be undefined behaviour, so a
//! request never copies a page while a plain store into it may be in
//! flight:
//!
//! - A plain view over home pages registers with the node (an entry in
//!   the [`Registry`], under its lock: the pages it covers are *active*)
//!   before its first store, and marks the entry ended, with one atomic
//!   operation, when it is dropped.
//! - The server copies a page under the registry's lock; if an active
//!   entry covers the page, it does not copy it: the request waits in the
//!   registry.
//! - Ended entries are *reaped* — their pages deactivated, and the
//!   requests waiting for a page that is no longer active served — by the
//!   server before it makes a request wait, by every filthread before it
//!   waits for a page, at every access epoch's end, and, while any request
//!   waits, by the node's reaper thread, which polls every few tens of
//!   microseconds and sleeps otherwise. Lock then copy, or activate then
//!   store: the page lock orders every copy before or after every active
//!   period; the entry's ended count (`Release`, read `Acquire` by the
//!   reaper) orders the view's stores before the deactivation. One lock
//!   per view, not one per page: page locks per view cost 2×1 diffusion
//!   and Jacobi 5-10% (a thousand pages per node and phase).
//! - A filthread that holds active views and must wait for a page itself
//!   (its filament faulted) deactivates them first and reactivates them
//!   when it resumes, so a request never waits for a filthread that waits
//!   for a page: two homes whose filaments each need a page the other is
//!   writing plainly (false sharing across nodes) serve each other, where
//!   deferring requests to the phase's end would deadlock.
//! - Except while it lends a row as a `&mut [T]` (`WriteRows::with_row`):
//!   the compiler may assume that nothing else reads the lent bytes until
//!   the closure holding them returns, suspended or not, so a filthread
//!   that faults inside such a closure keeps its views active through the
//!   wait (a loan of a copy lends nothing shared and keeps nothing
//!   active). The exception costs a wait only where a request for one of
//!   its pages comes meanwhile, and a cycle only where nodes each fault,
//!   inside such a closure, on a page the next one's lending views cover,
//!   around a cycle of two or more in the same phase (false sharing
//!   across nodes, and a checked access or a view taken inside every
//!   closure of the cycle): take the rows a closure reads as views in the
//!   segment's bind, before the loan, and no closure faults.
//!
//! An active period ends within the segment that began it, or at the
//! segment's next page wait: within a phase a filthread waits for nothing
//! else (fork-join filaments, which may wait in a join for another node,
//! get atomic views). So every waiting request is answered, at the latest
//! a poll interval after the views over its page end. Release consistency
//! allows the copy it gets then: the requester may not read in this phase
//! the bytes this node writes in it, and the release brings it the new
//! ones (the page is in its copy set from the serve on).
//!
//! **Why an ended flag and a reaper, not a call when the view is dropped.**
//! The runtime inlines a segment's filament and its views' drops into one
//! loop nest; a call in a view's drop, even a cold one, made the compiler
//! stop hoisting a reduction's operator out of per-point Jacobi's loop
//! (3.5x slower). A view's drop is two atomic operations.
//!
//! One node's plain views register nothing (no page is ever asked for),
//! nor do views of pages homed elsewhere (only homes serve pages).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Duration;

use super::{Core, Segment};

/// How often the reaper looks for ended views while a request waits.
const POLL: Duration = Duration::from_micros(20);

/// One plain view's registration.
pub(super) struct Entry {
    /// 1 while the view lives; the view's drop decrements it (`Release`),
    /// as it would the DSM's count of live views, which counts the view
    /// until it is reaped.
    ended: AtomicUsize,
    /// The filthread whose view it is.
    ft: u64,
    seg: Arc<Segment>,
    /// The pages it covers (indices in `seg`).
    lo: usize,
    hi: usize,
    /// Its pages count as active (not while its filthread waits for a page).
    active: bool,
}

#[derive(Default)]
pub(super) struct Inner {
    /// Boxed for a stable address: a view holds a pointer to its entry's
    /// count while the vector grows and shrinks.
    #[allow(clippy::vec_box)]
    entries: Vec<Box<Entry>>,
    /// Requests waiting for views: (node, global page).
    asked: Vec<(usize, u64)>,
}

impl Inner {
    /// Whether an active registration covers global page `gp`.
    fn covers(&self, gp: u64) -> bool {
        self.entries
            .iter()
            .any(|e| e.active && gp >= e.seg.first + e.lo as u64 && gp <= e.seg.first + e.hi as u64)
    }
    /// Takes the waiting requests whose pages are no longer active.
    fn free(&mut self) -> Vec<(usize, u64)> {
        let asked = std::mem::take(&mut self.asked);
        let (free, wait): (Vec<_>, Vec<_>) =
            asked.into_iter().partition(|&(_, gp)| !self.covers(gp));
        self.asked = wait;
        free
    }
}

/// The node's registrations and its reaper's wake-up.
#[derive(Default)]
pub(super) struct Registry {
    /// Entries boxed: a view holds the address of its entry's count.
    inner: Mutex<Inner>,
    /// Requests waiting (mirrors `inner.asked.len()` for the reaper).
    waiting: AtomicUsize,
    /// The reaper's wake-up (shared with the thread, which holds the core
    /// only weakly).
    wake: Arc<(Mutex<bool>, Condvar)>,
    reaper: AtomicBool,
}

impl Registry {
    pub(super) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Core {
    /// Registers a plain view over pages `lo..=hi` of `seg`, if some are
    /// homed here and other nodes may ask for them. Returns the address of
    /// the registration's live count, for the view to decrement when it is
    /// dropped (0: nothing registered).
    pub(crate) fn activate(self: &Arc<Self>, seg: &Arc<Segment>, lo: usize, hi: usize) -> u64 {
        if self.nodes == 1 || !(lo..=hi).any(|p| seg.homes[p] as usize == self.me) {
            return 0;
        }
        let entry = Box::new(Entry {
            ended: AtomicUsize::new(1),
            ft: crate::plain::filthread(),
            seg: seg.clone(),
            lo,
            hi,
            active: true,
        });
        let count = &entry.ended as *const AtomicUsize as u64;
        self.plain_views.lock().entries.push(entry);
        if !self.plain_views.reaper.swap(true, Ordering::Relaxed) {
            self.start_reaper();
        }
        count
    }

    /// Forgets every ended registration and serves the requests that
    /// waited for its pages (at an access epoch's end, when no filament
    /// runs, that is every registration).
    pub(crate) fn reap_plain(&self) {
        let free = {
            let mut inner = self.plain_views.lock();
            if inner.entries.is_empty() {
                return;
            }
            self.forget_ended(&mut inner);
            inner.free()
        };
        self.serve_freed(free);
    }

    /// Drops the registrations whose views have ended.
    fn forget_ended(&self, inner: &mut Inner) {
        let before = inner.entries.len();
        inner
            .entries
            .retain(|e| e.ended.load(Ordering::Acquire) != 0);
        // Each ended view counted itself live until now.
        self.live_views
            .fetch_sub(before - inner.entries.len(), Ordering::Relaxed);
    }

    /// Serves requests whose pages are no longer active.
    fn serve_freed(&self, free: Vec<(usize, u64)>) {
        if free.is_empty() {
            return;
        }
        self.plain_views
            .waiting
            .fetch_sub(free.len(), Ordering::Relaxed);
        for (to, gp) in free {
            self.serve(to, &[gp]);
        }
    }

    /// Called by the server, holding the registry's lock, for a request
    /// from `to` for page `gp`: true if the page is active (the request
    /// then waits in the registry).
    pub(super) fn plain_holds(&self, inner: &mut Inner, to: usize, gp: u64) -> bool {
        if !inner.covers(gp) {
            return false;
        }
        if !inner.asked.contains(&(to, gp)) {
            inner.asked.push((to, gp));
            self.plain_views.waiting.fetch_add(1, Ordering::Relaxed);
            let (lock, cv) = &*self.plain_views.wake;
            *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
            cv.notify_one();
        }
        true
    }

    /// The reaper: sleeps until a request waits for plain views, then
    /// reaps every [`POLL`] until none waits. It holds the core weakly and
    /// ends with it.
    fn start_reaper(self: &Arc<Self>) {
        let weak: Weak<Core> = Arc::downgrade(self);
        let wake = self.plain_views.wake.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("hyfi-dsm-reaper-{}", self.me))
            .spawn(move || loop {
                {
                    let (lock, cv) = &*wake;
                    let mut go = lock.lock().unwrap_or_else(|e| e.into_inner());
                    if !*go {
                        go = cv
                            .wait_timeout(go, Duration::from_millis(200))
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                    }
                    *go = false;
                }
                let Some(core) = weak.upgrade() else { return };
                while core.plain_views.waiting.load(Ordering::Relaxed) > 0 {
                    core.reap_plain();
                    std::thread::sleep(POLL);
                }
            });
        if spawned.is_err() {
            // No thread: requests are served when a view's filthread next
            // waits for a page, when the server next serves, or at the
            // epoch's end; correct, only later.
            self.plain_views.reaper.store(false, Ordering::Relaxed);
        }
    }

    /// Resets every array's access mode at an access epoch's end (no
    /// filament runs), under the registry's lock: the page server reads
    /// an array's mode under it to serve a read-only array's page without
    /// a snapshot (server.rs), which is sound only if the epoch cannot
    /// end, and the next one's writes begin, while it serves.
    pub(crate) fn end_access_epoch(&self) {
        let _serving = self.plain_views.lock();
        for seg in self.segs.read().unwrap_or_else(|e| e.into_inner()).iter() {
            seg.end_access_epoch();
        }
    }

    /// Before the current filthread waits for a page: reaps, and
    /// deactivates its own plain views (see the module docs). Returns
    /// whether it had any, to reactivate after the wait.
    pub(super) fn park_plain(&self) -> bool {
        if self.nodes == 1 {
            return false;
        }
        let ft = crate::plain::filthread();
        let (parked, free) = {
            let mut inner = self.plain_views.lock();
            if inner.entries.is_empty() {
                return false;
            }
            self.forget_ended(&mut inner);
            let mut parked = false;
            // A filthread that lends a row as `&mut [T]` keeps its views
            // active while it waits: nothing may read lent bytes while the
            // closure holding them lives, suspended or not (see the module
            // docs for what that costs).
            let lends = crate::plain::holds_loan();
            for e in inner
                .entries
                .iter_mut()
                .filter(|e| e.active && e.ft == ft && !lends)
            {
                e.active = false;
                parked = true;
            }
            (parked, inner.free())
        };
        self.serve_freed(free);
        parked
    }

    /// After the wait: reactivates the filthread's views, before it stores
    /// again (after any copy in progress: the server copies under the
    /// registry's lock).
    pub(super) fn unpark_plain(&self, parked: bool) {
        if !parked {
            return;
        }
        let ft = crate::plain::filthread();
        let mut inner = self.plain_views.lock();
        for e in inner.entries.iter_mut().filter(|e| e.ft == ft) {
            e.active = true;
        }
    }
}
