//! Plain-store views and the page server (the node-local rule is in
//! `plain.rs` at the crate root).
//!
//! A home page's bytes are copied out by the communication thread when
//! another node asks for the page, possibly in the middle of a phase. A
//! plain store racing with that copy would be undefined behaviour, so a
//! request never copies a page while a plain store into it may be in
//! flight:
//!
//! - A plain view *activates* each home page it covers (`Meta::plain`, a
//!   count under the page's lock) before its first store, and deactivates
//!   it when it is dropped.
//! - The server copies a page under its lock; if the page is active, it
//!   does not copy it: the request waits in the page's `Meta::asked`, and
//!   the view that deactivates the page last serves it (from its own
//!   thread, which stores nothing more into it). Lock then copy, or
//!   activate then store: the lock orders every copy before or after every
//!   active period.
//! - A filthread that holds active views and must wait for a page itself
//!   (its filament faulted) deactivates them first and reactivates them
//!   when it resumes, so a request never waits for a filthread that waits
//!   for a page: two homes whose filaments each need a page the other is
//!   writing plainly (false sharing across nodes) serve each other, where
//!   deferring requests to the phase's end would deadlock.
//!
//! An active period ends within the segment that began it, or at the
//! segment's next page wait: within a phase a filthread waits for nothing
//! else (fork-join filaments, which may wait in a join for another node,
//! get atomic views). So every deferred request is answered, at the latest
//! when the views over its page end. Release consistency allows the copy
//! it gets then: the requester may not read in this phase the bytes this
//! node writes in it, and the release brings it the new ones (the page is
//! in its copy set from the serve on).
//!
//! One node's plain views register nothing (no page is ever asked for),
//! nor do views of pages homed elsewhere (only homes serve pages).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use super::{Core, Segment};

/// A plain view's registration of the home pages it covers: deactivated
/// when dropped.
pub(crate) struct Activation {
    core: Arc<Core>,
    id: u64,
}

/// One registration in the node's list.
pub(super) struct Entry {
    id: u64,
    /// The filthread whose view it is.
    ft: u64,
    seg: Arc<Segment>,
    /// The home pages (indices in `seg`).
    pages: Vec<usize>,
    active: bool,
}

/// The node's registrations (views alive in a multi-node plain epoch).
#[derive(Default)]
pub(super) struct Registry {
    list: Mutex<Vec<Entry>>,
    next: std::sync::atomic::AtomicU64,
    /// Entries in the list: waits skip the lock when there are none.
    count: std::sync::atomic::AtomicUsize,
}

impl Core {
    /// Registers a plain view over pages `lo..=hi` of `seg`: activates the
    /// pages homed here, if other nodes may ask for them.
    pub(crate) fn activate(
        self: &Arc<Self>,
        seg: &Arc<Segment>,
        lo: usize,
        hi: usize,
    ) -> Option<Activation> {
        if self.nodes == 1 {
            return None;
        }
        let pages: Vec<usize> = (lo..=hi)
            .filter(|&p| seg.homes[p] as usize == self.me)
            .collect();
        if pages.is_empty() {
            return None;
        }
        for &p in &pages {
            seg.lock(p).plain += 1;
        }
        let reg = &self.plain_views;
        let id = reg.next.fetch_add(1, Ordering::Relaxed);
        reg.list
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Entry {
                id,
                ft: crate::plain::filthread(),
                seg: seg.clone(),
                pages,
                active: true,
            });
        reg.count.fetch_add(1, Ordering::Relaxed);
        Some(Activation {
            core: self.clone(),
            id,
        })
    }

    /// Ends the active period of `pages`: each page's count drops, and
    /// requests deferred for a page that is no longer active are served.
    fn deactivate_pages(&self, seg: &Segment, pages: &[usize]) {
        for &p in pages {
            let asked = {
                let mut m = seg.lock(p);
                m.plain -= 1;
                if m.plain == 0 {
                    std::mem::take(&mut m.asked)
                } else {
                    Vec::new()
                }
            };
            for to in asked {
                self.serve(to, &[seg.first + p as u64]);
            }
        }
    }

    /// Before the current filthread waits for a page: deactivates its
    /// plain views (see the module docs). Returns what to reactivate.
    pub(super) fn park_plain(&self) -> Vec<(Arc<Segment>, Vec<usize>, u64)> {
        let reg = &self.plain_views;
        if reg.count.load(Ordering::Relaxed) == 0 {
            return Vec::new();
        }
        let ft = crate::plain::filthread();
        let parked: Vec<_> = {
            let mut list = reg.list.lock().unwrap_or_else(|e| e.into_inner());
            list.iter_mut()
                .filter(|e| e.active && e.ft == ft)
                .map(|e| {
                    e.active = false;
                    (e.seg.clone(), e.pages.clone(), e.id)
                })
                .collect()
        };
        for (seg, pages, _) in &parked {
            self.deactivate_pages(seg, pages);
        }
        parked
    }

    /// After the wait: reactivates what [`Core::park_plain`] deactivated,
    /// before the filthread stores again.
    pub(super) fn unpark_plain(&self, parked: Vec<(Arc<Segment>, Vec<usize>, u64)>) {
        if parked.is_empty() {
            return;
        }
        for (seg, pages, _) in &parked {
            for &p in pages {
                seg.lock(p).plain += 1;
            }
        }
        let mut list = self
            .plain_views
            .list
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for (_, _, id) in &parked {
            if let Some(e) = list.iter_mut().find(|e| e.id == *id) {
                e.active = true;
            }
        }
    }
}

impl Drop for Activation {
    fn drop(&mut self) {
        let reg = &self.core.plain_views;
        let entry = {
            let mut list = reg.list.lock().unwrap_or_else(|e| e.into_inner());
            let k = list.iter().position(|e| e.id == self.id);
            k.map(|k| list.swap_remove(k))
        };
        if let Some(e) = entry {
            reg.count.fetch_sub(1, Ordering::Relaxed);
            if e.active {
                self.core.deactivate_pages(&e.seg, &e.pages);
            }
        }
    }
}
