//! The faulting side: a miss requests every missing page of a range at
//! once (one message per home) and suspends the filthread until they come.

use std::sync::atomic::Ordering;
use std::time::Instant;

use hyfi_core::filthread;

use super::msg::Request;
use super::page_table::{readable, writable, Segment, INVALID, PENDING, PUSHED, READ, WRITE};
use super::Core;
use crate::elem;

impl Core {
    /// Makes pages `lo..=hi` of `seg` readable (or writable) here: requests
    /// every missing page at once (one message per home), then waits for
    /// them, suspending the filthread so its processor runs other pools.
    #[cold]
    pub(crate) fn ensure(&self, seg: &Segment, lo: usize, hi: usize, write: bool) {
        let slot = self.slot();
        let ok = |st: u8| if write { writable(st) } else { readable(st) };
        if !filthread::in_filthread() {
            self.await_broadcast_of(seg, lo, hi, super::broadcast::BROADCAST_WAIT);
        }
        loop {
            let mut reqs: Vec<(u16, u64)> = Vec::new();
            let mut wait_on: Vec<usize> = Vec::new();
            for p in lo..=hi {
                if ok(seg.state[p].load(Ordering::Acquire)) {
                    continue;
                }
                let mut m = seg.lock(p);
                let mut st = seg.state[p].load(Ordering::Acquire);
                if st & PUSHED != 0 {
                    // The first use of a pushed page: it stays pushed.
                    st &= !PUSHED;
                    seg.state[p].store(st, Ordering::Release);
                }
                match st {
                    INVALID => {
                        seg.state[p].store(PENDING, Ordering::Relaxed);
                        m.requester = slot;
                        m.pending.insert(slot);
                        self.outstanding[slot].fetch_add(1, Ordering::Relaxed);
                        reqs.push((seg.homes[p], seg.first + p as u64));
                        wait_on.push(p);
                        self.ctr(slot).read_faults.fetch_add(1, Ordering::Relaxed);
                    }
                    PENDING => {
                        // Already requested on this node: never twice; this
                        // processor waits for the same reply.
                        if m.pending.insert(slot) {
                            self.outstanding[slot].fetch_add(1, Ordering::Relaxed);
                        }
                        wait_on.push(p);
                    }
                    st @ (READ | 6) if write => {
                        if seg.homes[p] as usize != self.me {
                            // SAFETY: a page of this segment, valid here.
                            m.twin = Some(unsafe { elem::twin(seg.page_ptr(p)) });
                        } else {
                            // Another node wrote this page in one of the
                            // last two releases: snapshot it, so that the
                            // release can push the home's own writes as a
                            // diff (core/README.md, "pages two nodes
                            // write"). Only at the page's first write
                            // fault of the phase with no twin yet: then
                            // it has not been writable here in this phase
                            // (a `WRITE` page the server turned `READ` got
                            // the server's snapshot), so no store into it,
                            // plain or atomic, has been made or is in
                            // flight. A later fault (after a serve) would
                            // copy bytes a plain view may be storing into,
                            // and a diff against that copy would miss the
                            // home's earlier writes.
                            let epoch = self.completed.load(Ordering::Acquire);
                            if !m.faulted
                                && m.twin.is_none()
                                && !m.copies.is_empty()
                                && m.diffed != 0
                                && m.diffed + 1 >= epoch
                            {
                                // SAFETY: a page of this segment, homed and
                                // valid here, not writable in this phase
                                // until now (above): nothing stores into it
                                // before its state says WRITE (below).
                                m.twin = Some(unsafe { elem::twin(seg.page_ptr(p)) });
                                m.own_twin = true;
                            }
                            m.faulted = true;
                        }
                        self.dirty
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(seg.first + p as u64);
                        // After the twin: a writer that sees WRITE writes
                        // into a page whose twin is already taken. FRESH,
                        // if set, stays.
                        seg.state[p].store(st | WRITE, Ordering::Release);
                        self.ctr(slot).write_faults.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {}
                }
            }
            if reqs.is_empty() && wait_on.is_empty() {
                return;
            }
            let traced = (hyfi_core::trace::on() && !wait_on.is_empty())
                .then(|| (hyfi_core::trace::now(), wait_on[0], wait_on.len()));
            self.request(reqs, slot);
            for p in wait_on {
                self.wait_valid(seg, p, slot);
            }
            if let Some((t, first, pages)) = traced {
                hyfi_core::trace::span(
                    hyfi_core::trace::Kind::PageWait,
                    t,
                    [
                        seg.seq,
                        first as u64,
                        pages as u64 | u64::from(seg.homes[first]) << 32,
                        hyfi_core::trace::filthread(),
                    ],
                );
            }
        }
    }

    pub(super) fn request(&self, mut reqs: Vec<(u16, u64)>, slot: usize) {
        if reqs.is_empty() {
            return;
        }
        reqs.sort_unstable();
        let epoch = self.completed.load(Ordering::Acquire);
        let mut i = 0;
        while i < reqs.len() {
            let home = reqs[i].0;
            let j = i + reqs[i..].iter().take_while(|r| r.0 == home).count();
            let pages = reqs[i..j].iter().map(|r| r.1);
            self.send(home as usize, slot, Request { epoch, pages });
            i = j;
        }
    }

    fn wait_valid(&self, seg: &Segment, p: usize, slot: usize) {
        if seg.state[p].load(Ordering::Acquire) >= READ {
            return;
        }
        let t = Instant::now();
        // Requests for pages this filthread stores into plainly must not
        // wait for it while it waits (core/plain.rs).
        let parked = self.park_plain();
        let _w = hyfi_core::waits::waiting(
            |a| {
                format!(
                    "page {} of shared allocation #{} from its home node {}",
                    a[0], a[1], a[2]
                )
            },
            [p as u64, seg.seq, u64::from(seg.homes[p])],
        );
        loop {
            if seg.state[p].load(Ordering::Acquire) >= READ {
                break;
            }
            if let Some(why) = self.failure() {
                let msg = format!(
                    "page {} of shared allocation #{} (home node {}) cannot arrive: {why}",
                    p, seg.seq, seg.homes[p]
                );
                if filthread::current_processor().is_some() {
                    // On a server thread the runtime catches the unwind and
                    // returns it from `start` as the link's failure (not a
                    // panic of the filament), once, without a panic message
                    // and backtrace per waiting filthread.
                    filthread::link_failed(msg.into());
                }
                panic!("hyfi-dsm: node {}: {msg}", self.me);
            }
            filthread::suspend(|w| {
                let mut m = seg.lock(p);
                if seg.state[p].load(Ordering::Acquire) >= READ || self.failure().is_some() {
                    return false;
                }
                m.waiters.push(w);
                true
            });
        }
        self.unpark_plain(parked);
        self.ctr(slot)
            .wait_ns
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }
}
