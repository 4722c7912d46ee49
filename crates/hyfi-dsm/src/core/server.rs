//! The page server (the communication thread's side of a fetch): requests
//! served once this node's epoch allows, replies installed and their
//! waiters woken.

use std::sync::atomic::Ordering;

use hyfi_core::link::Class;

use super::msg::{Pages, PagesFrame, Request, REPLY_BATCH};
use super::page_table::{Segment, FRESH, PENDING, READ, WRITE};
use super::Core;
use crate::elem;
use crate::error::ProtocolError;

impl Core {
    pub(super) fn on_request(&self, from: usize, frame: &[u8]) -> Result<(), ProtocolError> {
        let Request {
            epoch,
            pages: asked,
        } = Request::decode(frame)?;
        let mut pages = Vec::with_capacity(asked.len());
        for gp in asked {
            self.page_homed_at(gp, self.me, "a request for")?;
            pages.push(gp);
        }
        {
            let mut pr = self.proto.lock().unwrap_or_else(|e| e.into_inner());
            if self.completed.load(Ordering::Acquire) < epoch {
                // The requester is a phase ahead: serve once this node has
                // applied every diff of the phase before.
                pr.deferred.push((from, epoch, pages));
                self.ctr(self.procs)
                    .requests_deferred
                    .fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
        }
        self.serve(from, &pages);
        Ok(())
    }

    /// Sends `to` the pages it asked for. A page that a plain-store view
    /// stores into now is not copied: the request waits for the view
    /// (core/plain.rs). Every page is copied under the lock of the node's
    /// plain views, which orders the copy with their active periods.
    pub(super) fn serve(&self, to: usize, pages: &[u64]) {
        // Views that ended since the last look no longer hold their pages.
        self.reap_plain();
        for chunk in pages.chunks(REPLY_BATCH) {
            // Each page is copied once, straight into the reply's frame.
            let mut frame = PagesFrame::new(chunk.len());
            let mut plain = self.plain_views.lock();
            // Read under the lock: an array's mode is reset, at its
            // epoch's end, only under it (`Core::end_access_epoch`), and
            // the next epoch begins after that.
            let epoch = self.epoch.load(Ordering::SeqCst);
            for &gp in chunk {
                let (seg, p) = self.find(gp).expect("checked when the request came");
                if self.plain_holds(&mut plain, to, gp) {
                    self.ctr(self.procs)
                        .requests_waited_plain
                        .fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let mut m = seg.lock(p);
                m.copies.insert(to);
                if seg.state[p].load(Ordering::Acquire) == WRITE {
                    // From now on the home's writes fault (and are
                    // pushed to `to` at the release).
                    seg.state[p].store(READ, Ordering::Release);
                    if !m.faulted && m.twin.is_none() && !seg.read_only_in(epoch) {
                        // Writable without a fault until now: nobody
                        // else held it. A write that passed its state
                        // test before this serve may still land after
                        // the copy below, unseen; the release compares
                        // the page with this snapshot and pushes it if
                        // it changed. Not where a read view made the
                        // array read-only on this node in its current
                        // access epoch (matmul's B, an old grid): no
                        // write of this epoch can come (each would panic
                        // before its store), and one of a later epoch
                        // finds the page `READ` and faults: the mode read
                        // here is reset under the lock held here, before
                        // the next epoch begins. A 4 KiB snapshot per
                        // page served was most of a reply's cost.
                        // SAFETY: a page of a live segment homed here; no
                        // plain store is in flight (no active view covers it).
                        m.twin = Some(unsafe { elem::twin(seg.page_ptr(p)) });
                        self.dirty
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(gp);
                    }
                }
                // SAFETY: a page of a live segment of our region; no plain
                // store into it is in flight while the plain views' lock is
                // held and no active view covers it (core/plain.rs).
                frame.push(gp, |b| unsafe { elem::copy_out(seg.page_ptr(p), b) });
                drop(m);
            }
            drop(plain);
            let sent = frame.pages();
            if sent == 0 {
                continue;
            }
            // Counted before they leave: the requester may install them,
            // end its program and compare its counts with this node's
            // before this thread runs again (a test summing both saw one
            // page short under load).
            self.ctr(self.procs)
                .pages_served
                .fetch_add(sent as u64, Ordering::Relaxed);
            self.send_frame(to, self.procs, Class::Bulk, frame.finish());
        }
    }

    /// Installs page `p` of `seg` with `bytes` from its home: `READ`, and
    /// `FRESH` until the release (a reply, a broadcast).
    ///
    /// # Safety
    ///
    /// The page is not valid here (`INVALID` or `PENDING`: nobody here
    /// reads or writes it until its state says `READ`), and the caller
    /// holds its lock.
    pub(super) unsafe fn install_fresh(&self, seg: &Segment, p: usize, bytes: &[u8]) {
        // SAFETY: a page of a live segment that nobody here accesses (the
        // caller's contract).
        unsafe { elem::copy_in(seg.page_ptr(p), bytes) };
        seg.state[p].store(READ | FRESH, Ordering::Release);
        self.fresh
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((seg.seq, p));
    }

    pub(super) fn on_pages(&self, from: usize, frame: &[u8]) -> Result<(), ProtocolError> {
        let mut installed = 0u64;
        let r = self.install_pages(from, frame, &mut installed);
        hyfi_core::trace::instant(
            hyfi_core::trace::Kind::PagesIn,
            [from as u64, installed, 0, 0],
        );
        r
    }

    fn install_pages(
        &self,
        from: usize,
        frame: &[u8],
        installed: &mut u64,
    ) -> Result<(), ProtocolError> {
        for (gp, bytes) in Pages::decode(frame)?.iter() {
            let (seg, p) = self.page_homed_at(gp, from, "a reply with")?;
            let waiters = {
                let mut m = seg.lock(p);
                if seg.state[p].load(Ordering::Acquire) != PENDING {
                    if !std::mem::take(&mut m.reply_due) {
                        return Err(ProtocolError::NotRequested { page: gp });
                    }
                    // A broadcast brought the page first (core/broadcast.rs)
                    // and woke its waiters: the reply only ends the request.
                    let outstanding = &self.outstanding;
                    m.pending.drain(|s| {
                        outstanding[s].fetch_sub(1, Ordering::Relaxed);
                    });
                    continue;
                }
                // SAFETY: PENDING, and its lock is held.
                unsafe { self.install_fresh(&seg, p, bytes) };
                self.ctr(m.requester)
                    .pages_fetched
                    .fetch_add(1, Ordering::Relaxed);
                let outstanding = &self.outstanding;
                m.pending.drain(|s| {
                    outstanding[s].fetch_sub(1, Ordering::Relaxed);
                });
                std::mem::take(&mut m.waiters)
            };
            *installed += 1;
            for w in waiters {
                w.wake();
            }
        }
        Ok(())
    }
}
