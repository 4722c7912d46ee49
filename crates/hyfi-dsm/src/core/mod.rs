#![doc = include_str!("README.md")]

mod access;
mod broadcast;
mod diff;
mod msg;
mod page_table;
mod plain;
mod release;
mod server;

use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use crossbeam_utils::CachePadded;
use hyfi_core::filthread;
use hyfi_core::link::{Class, FrameError, Port, Service};

pub(crate) use broadcast::CARRY_HEADER;
pub(crate) use page_table::{readable, settled_readable, writable, Segment, INVALID, READ, WRITE};
pub(crate) use release::Carried;

use msg::{Encode, Kind};
use page_table::Meta;
use release::Proto;

use crate::error::{ProtocolError, Violation};
use crate::region::{Region, PAGE};
use crate::stats::{AtomicCounters, DsmCounters, DsmStats};

pub(super) struct PhaseTable {
    last: DsmCounters,
    per_phase: Vec<DsmCounters>,
    releases: u64,
    /// Per phase: releases in which this node wrote mostly pages homed
    /// elsewhere (`Core::advise`).
    offhome: Vec<u32>,
    /// Per phase: releases that dropped this node's copy of a page it
    /// wrote and another node wrote too (`Core::advise`).
    shared: Vec<u32>,
    /// What `Core::advise` said, once.
    advice: Option<String>,
}

/// A node's DSM.
pub(crate) struct Core {
    pub(crate) me: usize,
    pub(crate) nodes: usize,
    pub(crate) procs: usize,
    pub(crate) region: Region,
    pub(crate) segs: RwLock<Vec<Arc<Segment>>>,
    /// Allocation cursor (bytes from the region's base) and count.
    pub(crate) alloc: Mutex<(usize, u64)>,
    /// The node seam's sending side (`None` on one node).
    port: Option<Arc<dyn Port>>,
    /// Completed releases (mirrors the value changed under `proto`).
    completed: AtomicU64,
    /// `REL`s of the current epoch applied (mirrors `Proto::got`), for the
    /// release's poll before it sleeps.
    got: AtomicUsize,
    proto: Mutex<Proto>,
    /// Notified at each change of `proto` that a thread may wait for (a
    /// `REL` applied, a broadcast, the next epoch): a system call only
    /// while one sleeps on it.
    proto_cv: hyfi_core::sleep::QuietCondvar,
    failed: OnceLock<String>,
    /// Pages first written in this phase (global numbers).
    dirty: Mutex<Vec<u64>>,
    /// Pages installed in this phase (segment, page): their FRESH flag is
    /// cleared at the release.
    fresh: Mutex<Vec<(u64, usize)>>,
    /// Pages installed by push at the last release (global numbers): those
    /// still `PUSHED` at the next one went unused and are declined.
    pushed_last: Mutex<Vec<u64>>,
    /// Requests in flight, per slot (processors, then one for other threads).
    outstanding: Box<[CachePadded<AtomicUsize>]>,
    counters: Box<[CachePadded<AtomicCounters>]>,
    phases: Mutex<PhaseTable>,
    /// The runtime's access epoch (`CtxExt::access_epoch`).
    pub(crate) epoch: Arc<AtomicU64>,
    /// Footprint views alive now (footprint.rs): none may outlive its
    /// access epoch.
    pub(crate) live_views: AtomicUsize,
    /// Plain-store views over home pages (core/plain.rs).
    plain_views: plain::Registry,
}

impl Core {
    pub(crate) fn new(
        me: usize,
        nodes: usize,
        procs: usize,
        region: Region,
        port: Option<Arc<dyn Port>>,
        epoch: Arc<AtomicU64>,
    ) -> Core {
        Core {
            me,
            nodes,
            procs,
            region,
            segs: RwLock::new(Vec::new()),
            alloc: Mutex::new((0, 0)),
            port,
            completed: AtomicU64::new(0),
            got: AtomicUsize::new(0),
            proto: Mutex::new(Proto {
                got: 0,
                notices: Vec::new(),
                early: Vec::new(),
                releasing: false,
                deferred: Vec::new(),
                pushes: Default::default(),
                early_broadcasts: Vec::new(),
                bcast_expected: 0,
                bcast_received: 0,
                bcast_due: Default::default(),
                carried: Vec::new(),
                noticed: Vec::new(),
            }),
            proto_cv: hyfi_core::sleep::QuietCondvar::new(),
            failed: OnceLock::new(),
            dirty: Mutex::new(Vec::new()),
            fresh: Mutex::new(Vec::new()),
            pushed_last: Mutex::new(Vec::new()),
            outstanding: (0..=procs).map(|_| Default::default()).collect(),
            counters: (0..=procs).map(|_| Default::default()).collect(),
            phases: Mutex::new(PhaseTable {
                last: DsmCounters::default(),
                per_phase: Vec::new(),
                releases: 0,
                offhome: Vec::new(),
                shared: Vec::new(),
                advice: None,
            }),
            epoch,
            live_views: AtomicUsize::new(0),
            plain_views: Default::default(),
        }
    }

    /// Registers a new segment (allocation order = address order).
    pub(crate) fn add_segment(&self, seg: Arc<Segment>) {
        self.segs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(seg);
    }

    /// Builds a segment whose pages start in `state0` (home pages: `home0`).
    pub(crate) fn segment(
        &self,
        seq: u64,
        off: usize,
        homes: Vec<u16>,
        state0: u8,
        home0: u8,
        grain: usize,
    ) -> Segment {
        let me = self.me as u16;
        Segment {
            seq,
            // SAFETY (of the arithmetic): off + pages*PAGE ≤ region size,
            // checked by the allocator.
            base: self.region.base.wrapping_add(off),
            first: (off / PAGE) as u64,
            grain,
            state: homes
                .iter()
                .map(|&h| AtomicU8::new(if h == me { home0 } else { state0 }))
                .collect(),
            meta: homes
                .iter()
                .map(|&h| {
                    Mutex::new(Meta {
                        presumed: h == me && state0 != INVALID && self.nodes > 1,
                        ..Meta::default()
                    })
                })
                .collect(),
            homes: homes.into_boxed_slice(),
            access: AtomicU64::new(0),
            plain: Default::default(),
        }
    }

    /// The counters slot of the calling thread.
    #[inline]
    fn slot(&self) -> usize {
        filthread::current_processor()
            .filter(|&p| p < self.procs)
            .unwrap_or(self.procs)
    }

    /// Counts a write view taken here (plain.rs).
    /// `proc` is the calling processor: its slot has no other writer, so a
    /// load and a store count it (a locked add per view cost red-black
    /// SOR, a view per row and colour, several percent).
    #[inline]
    pub(crate) fn count_view(&self, plain: bool, proc: usize) {
        let c = self.ctr(proc.min(self.procs));
        let n = if plain {
            &c.plain_views
        } else {
            &c.atomic_views
        };
        n.store(n.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    /// Counts a row lent as a copy (footprint.rs, `lend_copy`), on the
    /// processor running it.
    pub(crate) fn count_lent_copy(&self) {
        self.ctr(self.slot())
            .rows_lent_by_copy
            .fetch_add(1, Ordering::Relaxed);
    }

    fn ctr(&self, slot: usize) -> &AtomicCounters {
        &self.counters[slot]
    }

    /// The segment holding global page `gp`, and the page's index in it.
    fn find(&self, gp: u64) -> Option<(Arc<Segment>, usize)> {
        let segs = self.segs.read().unwrap_or_else(|e| e.into_inner());
        let k = segs.partition_point(|s| s.first <= gp);
        let seg = segs.get(k.checked_sub(1)?)?;
        let idx = (gp - seg.first) as usize;
        (idx < seg.pages()).then(|| (seg.clone(), idx))
    }

    /// The page `gp` that a message names as `what` (e.g. "a diff for"),
    /// which must be homed at node `home`.
    fn page_homed_at(
        &self,
        gp: u64,
        home: usize,
        what: &'static str,
    ) -> Result<(Arc<Segment>, usize), ProtocolError> {
        let (seg, p) = self
            .find(gp)
            .ok_or(ProtocolError::UnknownPage { what, page: gp })?;
        if seg.homes[p] as usize != home {
            return Err(ProtocolError::WrongHome {
                what,
                page: gp,
                home: seg.homes[p] as usize,
                expected: home,
            });
        }
        Ok((seg, p))
    }

    pub(crate) fn failure(&self) -> Option<&String> {
        self.failed.get()
    }

    /// The node failed: every waiter wakes and reports `why`.
    pub(crate) fn fail(&self, why: &str) {
        if self.failed.set(why.to_string()).is_err() {
            return;
        }
        let segs = self.segs.read().unwrap_or_else(|e| e.into_inner()).clone();
        for seg in segs {
            for p in 0..seg.pages() {
                let w = std::mem::take(&mut seg.lock(p).waiters);
                for w in w {
                    w.wake();
                }
            }
        }
        let pr = self.proto.lock().unwrap_or_else(|e| e.into_inner());
        self.proto_cv.notify_all(&pr);
    }

    /// Sends `msg` to node `to`, encoded straight into the link's frame,
    /// counted for `slot`.
    fn send<M: Encode>(&self, to: usize, slot: usize, msg: M) {
        let Some(port) = &self.port else { return };
        let len = msg.encoded_len();
        let mut msg = Some(msg);
        let mut fill = |b: &mut Vec<u8>| {
            if let Some(m) = msg.take() {
                m.encode(b);
            }
        };
        let sent = if M::FOR_PHASE_END {
            port.send_for_phase_end(to, crate::SERVICE, M::CLASS, len, &mut fill)
        } else {
            port.send_with(to, crate::SERVICE, M::CLASS, len, &mut fill)
        };
        self.count_sent(slot, sent);
    }

    /// Sends a frame built whole (a reply, [`msg::PagesFrame`]) as it is.
    fn send_frame(&self, to: usize, slot: usize, class: Class, frame: Vec<u8>) {
        let Some(port) = &self.port else { return };
        self.count_sent(slot, port.send_vec(to, crate::SERVICE, class, frame));
    }

    /// Counts a message sent, or fails the node if the link could not.
    fn count_sent(&self, slot: usize, sent: Result<usize, hyfi_core::LinkError>) {
        match sent {
            Ok(bytes) => {
                let c = self.ctr(slot);
                c.messages_sent.fetch_add(1, Ordering::Relaxed);
                c.bytes_sent.fetch_add(bytes as u64, Ordering::Relaxed);
            }
            Err(e) => self.fail(&e.to_string()),
        }
    }

    fn find_cached(
        &self,
        gp: u64,
        cache: &mut Option<Arc<Segment>>,
    ) -> Option<(Arc<Segment>, usize)> {
        if let Some(s) = cache {
            if gp >= s.first && gp < s.first + s.pages() as u64 {
                return Some((s.clone(), (gp - s.first) as usize));
            }
        }
        let (seg, idx) = self.find(gp)?;
        *cache = Some(seg.clone());
        Some((seg, idx))
    }

    // ---------------------------------------------------------------

    pub(crate) fn totals(&self) -> DsmCounters {
        let snaps: Vec<DsmCounters> = self.counters.iter().map(|c| c.snapshot()).collect();
        DsmCounters::sum(&snaps)
    }

    pub(crate) fn stats(&self) -> DsmStats {
        let t = self.phases.lock().unwrap_or_else(|e| e.into_inner());
        DsmStats {
            node: self.me,
            releases: t.releases,
            total: self.totals(),
            per_phase: t.per_phase.clone(),
            advice: t.advice.clone(),
        }
    }
}

impl Service for Core {
    fn frame(&self, from: usize, payload: Vec<u8>) -> Result<(), FrameError> {
        // A large frame's buffer goes back to the transport's pool once
        // handled (`hyfi_core::link::buffers`).
        let handled = |r, payload| {
            hyfi_core::link::buffers::recycle(payload);
            r
        };
        match Kind::of(&payload) {
            Ok(Kind::Request) => handled(self.on_request(from, &payload), payload),
            Ok(Kind::Pages) => handled(self.on_pages(from, &payload), payload),
            Ok(Kind::Release) => self.on_release(from, payload),
            Ok(Kind::Broadcast) => self.on_broadcast(payload),
            Err(e) => Err(e),
        }
        .map_err(|error| Violation { from, error }.into())
    }
    fn failed(&self, why: &str) {
        self.fail(why);
    }
}

#[cfg(test)]
mod tests {
    use super::msg::{PagesFrame, Request};
    use super::*;
    use std::time::{Duration, Instant};

    /// Node 0 of 2, with one segment of two pages: page 0 homed here,
    /// page 1 at node 1.
    fn core() -> Core {
        let region = Region::reserve(1 << 20, None).expect("a small region");
        let core = Core::new(0, 2, 1, region, None, Arc::new(AtomicU64::new(1)));
        let seg = core.segment(0, 0, vec![0, 1], INVALID, READ, 1);
        core.add_segment(Arc::new(seg));
        core
    }

    /// Which of `seg`'s pages are mapped in this process now.
    fn resident(seg: &Segment) -> Vec<bool> {
        let mut v = vec![0u8; seg.pages()];
        // SAFETY: the segment's range lies in the region's mapping, and `v`
        // has a byte per page of it.
        let r = unsafe { libc::mincore(seg.base.cast(), seg.pages() * PAGE, v.as_mut_ptr()) };
        assert_eq!(r, 0, "mincore: {}", std::io::Error::last_os_error());
        v.iter().map(|b| b & 1 == 1).collect()
    }

    #[test]
    fn a_carried_matrix_is_mapped_in_advance_on_several_nodes_only() {
        let c = core();
        let (seg, _) = page1(&c);
        assert_eq!(resident(&seg), [false, false]);
        c.prepare_carried(&seg);
        // Both pages in (the one homed elsewhere is what an install would
        // fault on), both still zeros, both still invalid here.
        assert_eq!(resident(&seg), [true, true]);
        // SAFETY: a mapped page of the segment; nothing else runs.
        let bytes = unsafe { std::slice::from_raw_parts(seg.page_ptr(1), PAGE) };
        assert!(bytes.iter().all(|&b| b == 0));
        assert_eq!(seg.state[1].load(Ordering::Acquire), INVALID);

        // A larger matrix is left to fault as its rows come.
        let region =
            Region::reserve(2 * super::broadcast::CARRIED_PREPARED, None).expect("a region");
        let big = Core::new(0, 2, 1, region, None, Arc::new(AtomicU64::new(1)));
        let pages = super::broadcast::CARRIED_PREPARED / PAGE + 1;
        let homes = (0..pages).map(|p| (p % 2) as u16).collect();
        let seg = Arc::new(big.segment(0, 0, homes, INVALID, READ, 1));
        big.prepare_carried(&seg);
        assert!(resident(&seg).iter().all(|&r| !r));

        // One node installs nothing: nothing is mapped for it.
        let region = Region::reserve(1 << 20, None).expect("a small region");
        let one = Core::new(0, 1, 1, region, None, Arc::new(AtomicU64::new(1)));
        let seg = Arc::new(one.segment(0, 0, vec![0, 0], WRITE, READ, 1));
        one.prepare_carried(&seg);
        assert_eq!(resident(&seg), [false, false]);
    }

    fn frame(c: &Core, bytes: &[u8]) -> String {
        let e = c
            .frame(1, bytes.to_vec())
            .expect_err("a message that breaks the protocol");
        // The layer's own error, through the seam.
        let v = e
            .downcast_ref::<Violation>()
            .expect("a shared-memory violation");
        assert_eq!(v.from, 1);
        e.to_string()
    }

    #[test]
    fn messages_that_break_the_protocol_say_what_and_from_whom() {
        let c = core();
        assert_eq!(
            frame(&c, &[]),
            "shared memory: a message from node 1: an empty message"
        );
        assert!(frame(&c, &[9]).ends_with("unknown message kind 9"));
        let request = |page: u64| {
            let mut m = Vec::new();
            Request {
                epoch: 0,
                pages: [page].into_iter(),
            }
            .encode(&mut m);
            m
        };
        // A request cut short in its epoch field.
        assert!(frame(&c, &request(0)[..3]).ends_with("the message is cut short at byte 0"));
        assert!(
            frame(&c, &request(77)).ends_with("a request for page 77, which no shared array holds")
        );
        assert!(frame(&c, &request(1))
            .ends_with("a request for page 1, whose home is node 1, not node 0"));
        // A reply for a page nobody requested.
        let mut reply = PagesFrame::new(1);
        reply.push(1, |b| b.extend_from_slice(&[0u8; PAGE]));
        let reply = reply.finish();
        assert!(frame(&c, &reply).ends_with("page 1 arrived, but it was not requested"));
        // The node is still usable: nothing was applied.
        assert!(c.failure().is_none());
        assert_eq!(c.totals().pages_fetched, 0);
    }

    /// A broadcast of page 1 (homed at node 1) from root 1 in epoch
    /// `epoch`, its bytes all `fill`, for a receiver covering `span`.
    fn bcast(epoch: u64, root: u32, span: u32, page: u64, fill: u8) -> Vec<u8> {
        let mut f = PagesFrame::broadcast(epoch, root, span, 1);
        f.push(page, |b| b.extend_from_slice(&[fill; PAGE]));
        f.finish()
    }

    fn page1(c: &Core) -> (Arc<Segment>, usize) {
        c.find(1).expect("page 1")
    }

    fn reply(fill: u8) -> Vec<u8> {
        let mut r = PagesFrame::new(1);
        r.push(1, |b| b.extend_from_slice(&[fill; PAGE]));
        r.finish()
    }

    #[test]
    fn a_broadcast_installs_a_missing_page_and_bad_ones_are_refused() {
        let c = core();
        assert!(frame(&c, &bcast(0, 0, 1, 1, 7)).ends_with(
            "a broadcast from root node 0 covering 1 nodes, which does not fit a job of 2 \
             nodes with this node in it"
        ));
        assert!(frame(&c, &bcast(0, 1, 0, 1, 7)).contains("covering 0 nodes"));
        assert!(frame(&c, &bcast(0, 1, 2, 1, 7)).contains("covering 2 nodes"));
        assert!(frame(&c, &bcast(0, 1, 1, 0, 7))
            .ends_with("a broadcast of page 0, whose home is node 0, not node 1"));
        assert!(frame(&c, &bcast(0, 1, 1, 0, 7)[..20]).contains("cut short"));
        let (seg, p) = page1(&c);
        assert_eq!(seg.state[p].load(Ordering::Acquire), INVALID);
        c.frame(1, bcast(0, 1, 1, 1, 7)).expect("a broadcast");
        assert_eq!(
            seg.state[p].load(Ordering::Acquire),
            READ | page_table::FRESH
        );
        // SAFETY: the page is valid here and nothing writes it.
        assert_eq!(unsafe { *seg.page_ptr(p).add(PAGE - 1) }, 7);
        // A second one finds the page valid and leaves it.
        c.frame(1, bcast(0, 1, 1, 1, 9)).expect("a broadcast");
        assert_eq!(unsafe { *seg.page_ptr(p) }, 7);
        let t = c.totals();
        assert_eq!((t.broadcasts_installed, t.broadcasts_dropped), (1, 0));
    }

    #[test]
    fn a_broadcast_overtaking_a_reply_wakes_the_page_and_the_reply_ends_the_request() {
        let c = core();
        let (seg, p) = page1(&c);
        // A processor requested page 1 (as `ensure` does).
        seg.state[p].store(page_table::PENDING, Ordering::Release);
        seg.lock(p).pending.insert(0);
        c.outstanding[0].store(1, Ordering::Release);
        c.frame(1, bcast(0, 1, 1, 1, 5)).expect("a broadcast");
        assert_eq!(
            seg.state[p].load(Ordering::Acquire),
            READ | page_table::FRESH
        );
        assert!(seg.lock(p).reply_due);
        // The request is still in flight: the release waits for its reply.
        assert_eq!(c.outstanding[0].load(Ordering::Acquire), 1);
        c.frame(1, reply(5)).expect("the reply still due");
        assert_eq!(c.outstanding[0].load(Ordering::Acquire), 0);
        assert!(!seg.lock(p).reply_due);
        assert_eq!(c.totals().pages_fetched, 0);
        // Another reply is one nobody asked for.
        assert!(frame(&c, &reply(5)).ends_with("page 1 arrived, but it was not requested"));
    }

    /// `broadcast_rows` names pages 0 and 1 on node 0: page 1, homed at
    /// node 1, becomes due; an access outside a filthread then waits for
    /// its broadcast (delivered here by another thread) instead of
    /// requesting it, and a bound ends the wait when none comes.
    #[test]
    fn a_read_waits_for_a_broadcast_its_node_expects() {
        let c = Arc::new(core());
        let (seg, p) = page1(&c);
        c.broadcast(&seg, 0, 1);
        let due: Vec<u64> = c.proto.lock().unwrap().bcast_due.iter().copied().collect();
        assert_eq!(due, [1], "only the page homed elsewhere is due");
        // Page 0 is valid here: nothing to wait for.
        assert!(!c.await_broadcast_of(&seg, 0, 0, Duration::from_secs(60)));
        // The broadcast comes from another thread while this one waits;
        // the wait ends with the page installed (a bound of a minute: the
        // test does not depend on how soon it comes).
        let sender = {
            let c = c.clone();
            std::thread::spawn(move || c.frame(1, bcast(0, 1, 1, 1, 6)).expect("a broadcast"))
        };
        // (Whether it waited depends on which thread came first.)
        c.await_broadcast_of(&seg, 0, 1, Duration::from_secs(60));
        assert_eq!(
            seg.state[p].load(Ordering::Acquire),
            READ | page_table::FRESH
        );
        sender.join().unwrap();
        assert!(c.proto.lock().unwrap().bcast_due.is_empty());

        // Due again in the next epoch, and no broadcast comes: the bound
        // ends the wait, the page still missing (the access requests it).
        c.next_epoch(0);
        seg.state[p].store(INVALID, Ordering::Release);
        c.broadcast(&seg, 1, 1);
        let t = Instant::now();
        assert!(c.await_broadcast_of(&seg, 1, 1, Duration::from_millis(20)));
        assert!(t.elapsed() >= Duration::from_millis(20));
        assert_eq!(seg.state[p].load(Ordering::Acquire), INVALID);
    }

    /// A broadcast that came before its page was named (it came early and
    /// was installed as the epoch began) leaves a due entry behind: the
    /// page is valid, so nothing waits. One dropped because it came during
    /// the node's release is no longer due, and a waiter stops waiting.
    #[test]
    fn broadcasts_that_came_first_or_were_dropped_leave_nothing_to_wait_for() {
        let c = core();
        let (seg, p) = page1(&c);
        c.frame(1, bcast(1, 1, 1, 1, 3))
            .expect("an early broadcast");
        c.next_epoch(0);
        c.broadcast(&seg, 1, 1);
        assert!(c.proto.lock().unwrap().bcast_due.contains(&1));
        assert!(!c.await_broadcast_of(&seg, 1, 1, Duration::from_secs(60)));

        c.next_epoch(1);
        seg.state[p].store(INVALID, Ordering::Release);
        c.broadcast(&seg, 1, 1);
        c.proto.lock().unwrap().releasing = true;
        c.frame(1, bcast(2, 1, 1, 1, 4)).expect("a broadcast");
        c.proto.lock().unwrap().releasing = false;
        assert_eq!(seg.state[p].load(Ordering::Acquire), INVALID);
        assert!(c.proto.lock().unwrap().bcast_due.is_empty());
        // Not due: the access requests at once.
        assert!(!c.await_broadcast_of(&seg, 1, 1, Duration::from_secs(60)));
    }

    #[test]
    fn broadcasts_wait_for_their_epoch_and_late_ones_are_dropped() {
        let c = core();
        let (seg, p) = page1(&c);
        // From a root a release ahead: held until this node's epoch is 1.
        c.frame(1, bcast(1, 1, 1, 1, 3))
            .expect("an early broadcast");
        assert_eq!(seg.state[p].load(Ordering::Acquire), INVALID);
        c.next_epoch(0);
        assert_eq!(
            seg.state[p].load(Ordering::Acquire),
            READ | page_table::FRESH
        );
        // One of epoch 1 while this node releases, and one of epoch 0 now
        // that it is at 1: both older than what the release brings.
        seg.state[p].store(INVALID, Ordering::Release);
        c.proto.lock().unwrap().releasing = true;
        c.frame(1, bcast(1, 1, 1, 1, 4)).expect("a broadcast");
        c.proto.lock().unwrap().releasing = false;
        c.frame(1, bcast(0, 1, 1, 1, 4)).expect("a late broadcast");
        assert_eq!(seg.state[p].load(Ordering::Acquire), INVALID);
        let t = c.totals();
        assert_eq!((t.broadcasts_installed, t.broadcasts_dropped), (1, 2));
    }
}
