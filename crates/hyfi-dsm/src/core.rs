//! The coherence protocol: page table, page server, release.
//!
//! **Page states** (one byte per page, what the accessors check):
//! `INVALID` (no valid copy here), `PENDING` (requested, in flight),
//! `READ` (a valid copy, not written this phase), `WRITE` (valid, written
//! this phase: a non-home writer keeps a *twin*, the copy as it was before
//! its first write). A home's own pages are never invalid.
//!
//! **Page table** (paper §3.3): a lock per page guards its state changes,
//! twin, waiters and pending bits against faulting workers and the
//! communication thread. A page is requested only by the first processor
//! that finds it `INVALID`; later ones (pending bit set) wait for the same
//! reply; every waiter is woken when it arrives. Registering a waiter and
//! installing the page happen under the same lock, and the state becomes
//! `READ` only after the bytes are in. Per processor, an outstanding-request
//! counter tells the release that the node's phase work is done.
//!
//! **Release** (home-based lazy release consistency, at every phase end,
//! on every node, in place of the phase barrier):
//! 1. every page first written this phase is on the node's dirty list; a
//!    non-home page's diff against its twin (byte-exact runs) is computed;
//! 2. each node sends every other node one `REL` message holding
//!    everything it has for that node: its write notices for pages homed
//!    elsewhere (as ranges; they go to every node, since only the home
//!    knows who holds a copy), the diffs of pages homed there, and, as a
//!    home, the pages it wrote itself that the receiver holds a copy of
//!    (see *copy sets and producer push*). A page written only by its home
//!    moves no diff and no notice;
//! 3. a node waits for the `REL` of every other node (so this is a
//!    barrier). Homes apply diffs as they arrive; then every copy named in
//!    another node's notices is invalidated, and pushed pages are
//!    installed. A page written by this node alone keeps its copy (it
//!    equals the home's now).
//!
//! **Copy sets and producer push** (after HLRC's copy sets and the
//! producer push of Karlsson's Balder work). A home records, per page, the
//! nodes it served a copy to. When the home writes a page in a phase, it
//! sends the new page, in its `REL`, to every node of the copy set instead
//! of a write notice: the reader finds it valid in the next phase and
//! waits for nothing (a steady-state Jacobi sweep fetches no page). A
//! pushed page is installed with the `PUSHED` flag, which the first access
//! clears (one call of `ensure` per page and phase); a page that still
//! carries it at the reader's next release went unused, and the reader
//! drops it (`INVALID`) and *declines* it in its `REL` to the home, which
//! takes the reader out of the page's copy set: a page read once is pushed
//! at most once more. A home page with an empty copy set stays `WRITE`
//! across releases, so the home writes it without a fault per phase; the
//! page server turns it back to `READ`, and counts it as written this
//! phase, when it serves it. A push is discarded, and the copy invalidated, when
//! another node's notice names the page in the same release (a third
//! writer's diff may be missing from it), when the receiver wrote the page
//! itself, or when the receiver declines it in that release.
//!
//! **Epochs.** A node's epoch counts its completed releases. A `REL` is
//! applied only while its receiver is in the release of that epoch (one
//! that comes while the phase's filaments still run waits), so no diff is
//! written into a home page while filaments may read it as plain memory
//! through a footprint view. A page request
//! carries the requester's epoch *e*; the home serves it only once its own
//! epoch is ≥ *e*, i.e. once it has applied every diff of the phases before
//! (a request can overtake a slow node's diffs to the home). `REL` messages
//! of a later epoch (a fast node) wait until the current release is done,
//! so diffs are applied in phase order.

use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock};
use std::time::Instant;

use crossbeam_utils::CachePadded;
use hyfi_core::filthread::{self, Waker};
use hyfi_core::link::{Class, Port, Service, ServiceId};

use crate::elem::{self, Words};
use crate::region::{Region, PAGE};
use crate::stats::{AtomicCounters, DsmCounters, DsmStats};

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

// The messages: a kind byte, then the kind's fields (little-endian).
// `REQ` (a page request: epoch u64, count u32, global pages u64...) goes
// as control, so it overtakes pages and releases queued to the same home;
// `PAGES` (count u32, global pages u64..., the pages' bytes) and `REL`
// (epoch u64, notice ranges, diffs) are bulk.
const REQ: u8 = 1;
const PAGES: u8 = 2;
const REL: u8 = 3;
/// Pages per reply frame.
const REPLY_BATCH: usize = 64;

/// A set of small numbers (processors, nodes); empty until first used.
#[derive(Default)]
struct Bits(Vec<u64>);

impl Bits {
    /// Adds `k`; true if it was not there.
    fn insert(&mut self, k: usize) -> bool {
        let (w, b) = (k / 64, 1u64 << (k % 64));
        if self.0.len() <= w {
            self.0.resize(w + 1, 0);
        }
        let new = self.0[w] & b == 0;
        self.0[w] |= b;
        new
    }
    fn is_empty(&self) -> bool {
        self.0.iter().all(|&w| w == 0)
    }
    fn remove(&mut self, k: usize) {
        if let Some(w) = self.0.get_mut(k / 64) {
            *w &= !(1u64 << (k % 64));
        }
    }
    /// The members, in increasing order.
    fn iter(&self) -> impl Iterator<Item = usize> + '_ {
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
    fn drain(&mut self, f: impl FnMut(usize)) {
        self.iter().for_each(f);
        self.0.iter_mut().for_each(|w| *w = 0);
    }
}

/// One page's protected state.
#[derive(Default)]
pub(crate) struct Meta {
    waiters: Vec<Waker>,
    twin: Option<Box<Words>>,
    /// The slot (processor) whose request is in flight.
    requester: usize,
    /// Pending bits, one per slot (processor): who waits for this page.
    /// Each slot with its bit set counts the page in its outstanding
    /// counter until the page arrives.
    pending: Bits,
    /// At the home: the nodes holding a copy it served or pushed them (the
    /// copy set), until they decline a push. A member whose copy another
    /// writer's notice invalidated stays in it: it is pushed the page once
    /// more and declines it.
    copies: Bits,
    /// At the home: every node may hold a copy it was never served (a
    /// zeroed array starts valid everywhere), so the home's next write of
    /// the page goes out as a notice to every node rather than as pushes.
    presumed: bool,
    /// At the home: it wrote the page this phase through a write fault
    /// (the page had copies elsewhere). Cleared at the release.
    faulted: bool,
}

/// One shared array's pages.
pub(crate) struct Segment {
    pub(crate) seq: u64,
    pub(crate) base: *mut u8,
    /// Global number of the first page.
    pub(crate) first: u64,
    pub(crate) homes: Box<[u16]>,
    pub(crate) state: Box<[AtomicU8]>,
    meta: Box<[Mutex<Meta>]>,
    /// This node's access mode for the array in the current access epoch
    /// (read-only or written): see footprint.rs.
    pub(crate) access: AtomicU64,
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
    fn page_ptr(&self, p: usize) -> *mut u8 {
        // SAFETY (of the arithmetic): p < pages, inside the allocation.
        self.base.wrapping_add(p * PAGE)
    }
    fn lock(&self, p: usize) -> std::sync::MutexGuard<'_, Meta> {
        self.meta[p].lock().unwrap_or_else(|e| e.into_inner())
    }
}

struct Proto {
    /// `REL` messages of the current epoch received.
    got: usize,
    /// From which nodes.
    got_from: Vec<bool>,
    /// Nodes that ended their program (said `Bye`): a release of theirs
    /// that has not come will not.
    gone: Vec<bool>,
    /// Their write notices (page ranges).
    notices: Vec<(u64, u32)>,
    /// `REL` messages not applied yet, of this epoch or later: (from,
    /// epoch, payload).
    early: Vec<(usize, u64, Vec<u8>)>,
    /// This node is in its release: `REL`s of the current epoch are
    /// applied as they arrive. Outside it (while the phase's filaments
    /// run) they wait in `early`: a diff written into a home page during
    /// the phase could overlap a footprint read view's plain reads.
    releasing: bool,
    /// Page requests waiting for this node's epoch: (from, epoch, pages).
    deferred: Vec<(usize, u64, Vec<u64>)>,
    /// Pages pushed to this node in the current release: (global page,
    /// bytes), installed once every `REL` is in.
    pushes: Vec<(u64, Vec<u8>)>,
}

/// What one `REL` carries to one node besides the notices.
#[derive(Default)]
struct Body {
    /// Diffs of pages homed there: (page u64, runs u32, runs)...
    diffs: Vec<u8>,
    ndiffs: u32,
    /// Pages homed here that it holds a copy of: (page u64, bytes)...
    pushes: Vec<u8>,
    npushes: u32,
    /// Pages it pushed here that went unused.
    declines: Vec<u64>,
}

struct PhaseTable {
    last: DsmCounters,
    per_phase: Vec<DsmCounters>,
    releases: u64,
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
    proto_cv: Condvar,
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
    /// The runtime's access epoch (`Ctx::access_epoch`).
    pub(crate) epoch: Arc<AtomicU64>,
    /// Footprint views alive now (footprint.rs): none may outlive its
    /// access epoch.
    pub(crate) live_views: AtomicUsize,
}

/// A little reader of message payloads.
struct Rd<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Rd<'a> {
    fn new(b: &'a [u8]) -> Self {
        Rd { b, at: 0 }
    }
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], String> {
        let s = self
            .b
            .get(self.at..self.at + n)
            .ok_or_else(|| format!("DSM message truncated at byte {}", self.at))?;
        self.at += n;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.bytes(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.bytes(8)?.try_into().expect("8")))
    }
    fn rest(&self) -> &'a [u8] {
        &self.b[self.at..]
    }
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
                got_from: vec![false; nodes],
                gone: vec![false; nodes],
                notices: Vec::new(),
                early: Vec::new(),
                releasing: false,
                deferred: Vec::new(),
                pushes: Vec::new(),
            }),
            proto_cv: Condvar::new(),
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
            }),
            epoch,
            live_views: AtomicUsize::new(0),
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
    ) -> Segment {
        let me = self.me as u16;
        Segment {
            seq,
            // SAFETY (of the arithmetic): off + pages*PAGE ≤ region size,
            // checked by the allocator.
            base: self.region.base.wrapping_add(off),
            first: (off / PAGE) as u64,
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
        }
    }

    /// The counters slot of the calling thread.
    #[inline]
    fn slot(&self) -> usize {
        filthread::current_processor()
            .filter(|&p| p < self.procs)
            .unwrap_or(self.procs)
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
        let _g = self.proto.lock().unwrap_or_else(|e| e.into_inner());
        self.proto_cv.notify_all();
    }

    /// Sends a message of `kind` whose fields `fill` appends (about
    /// `len_hint` bytes) to node `to`, counted for `slot`.
    fn send(
        &self,
        to: usize,
        kind: u8,
        class: Class,
        len_hint: usize,
        slot: usize,
        fill: impl FnOnce(&mut Vec<u8>),
    ) {
        let Some(port) = &self.port else { return };
        let mut fill = Some(fill);
        let sent = port.send_with(to, ServiceId::Dsm, class, 1 + len_hint, &mut |b| {
            b.push(kind);
            if let Some(f) = fill.take() {
                f(b);
            }
        });
        match sent {
            Ok(bytes) => {
                let c = self.ctr(slot);
                c.messages_sent.fetch_add(1, Ordering::Relaxed);
                c.bytes_sent.fetch_add(bytes as u64, Ordering::Relaxed);
            }
            Err(e) => self.fail(&e.to_string()),
        }
    }

    // ---------------------------------------------------------------
    // The faulting side.

    /// Makes pages `lo..=hi` of `seg` readable (or writable) here: requests
    /// every missing page at once (one message per home), then waits for
    /// them, suspending the filthread so its processor runs other pools.
    #[cold]
    pub(crate) fn ensure(&self, seg: &Segment, lo: usize, hi: usize, write: bool) {
        let slot = self.slot();
        let ok = |st: u8| if write { writable(st) } else { readable(st) };
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
            self.request(reqs, slot);
            for p in wait_on {
                self.wait_valid(seg, p, slot);
            }
        }
    }

    fn request(&self, mut reqs: Vec<(u16, u64)>, slot: usize) {
        if reqs.is_empty() {
            return;
        }
        reqs.sort_unstable();
        let epoch = self.completed.load(Ordering::Acquire);
        let mut i = 0;
        while i < reqs.len() {
            let home = reqs[i].0;
            let j = i + reqs[i..].iter().take_while(|r| r.0 == home).count();
            let n = j - i;
            self.send(home as usize, REQ, Class::Control, 12 + 8 * n, slot, |b| {
                b.extend_from_slice(&epoch.to_le_bytes());
                b.extend_from_slice(&(n as u32).to_le_bytes());
                for r in &reqs[i..j] {
                    b.extend_from_slice(&r.1.to_le_bytes());
                }
            });
            i = j;
        }
    }

    fn wait_valid(&self, seg: &Segment, p: usize, slot: usize) {
        if seg.state[p].load(Ordering::Acquire) >= READ {
            return;
        }
        let t = Instant::now();
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
        self.ctr(slot)
            .wait_ns
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    // ---------------------------------------------------------------
    // The communication thread's side.

    fn on_request(&self, from: usize, payload: &[u8]) -> Result<(), String> {
        let mut r = Rd::new(payload);
        let epoch = r.u64()?;
        let n = r.u32()? as usize;
        let mut pages = Vec::with_capacity(n);
        for _ in 0..n {
            let gp = r.u64()?;
            let (seg, p) = self
                .find(gp)
                .ok_or_else(|| format!("request for page {gp}, which no shared array holds"))?;
            if seg.homes[p] as usize != self.me {
                return Err(format!(
                    "request for page {gp}, whose home is node {}, not this one",
                    seg.homes[p]
                ));
            }
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

    fn serve(&self, to: usize, pages: &[u64]) {
        for chunk in pages.chunks(REPLY_BATCH) {
            self.send(
                to,
                PAGES,
                Class::Bulk,
                4 + chunk.len() * (8 + PAGE),
                self.procs,
                |b| {
                    b.extend_from_slice(&(chunk.len() as u32).to_le_bytes());
                    for gp in chunk {
                        b.extend_from_slice(&gp.to_le_bytes());
                    }
                    for &gp in chunk {
                        let (seg, p) = self.find(gp).expect("checked when the request came");
                        let mut m = seg.lock(p);
                        m.copies.insert(to);
                        if seg.state[p].load(Ordering::Acquire) == WRITE {
                            // From now on the home's writes fault (and are
                            // pushed to `to` at the release).
                            seg.state[p].store(READ, Ordering::Release);
                            if !m.faulted && m.twin.is_none() {
                                // Writable without a fault until now: nobody
                                // else held it. A write that passed its state
                                // test before this serve may still land after
                                // the copy below, unseen; the release compares
                                // the page with this snapshot and pushes it if
                                // it changed.
                                // SAFETY: a page of a live segment homed here.
                                m.twin = Some(unsafe { elem::twin(seg.page_ptr(p)) });
                                self.dirty
                                    .lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .push(gp);
                            }
                        }
                        drop(m);
                        // SAFETY: a page of a live segment of our region.
                        unsafe { elem::copy_out(seg.page_ptr(p), b) };
                    }
                },
            );
            self.ctr(self.procs)
                .pages_served
                .fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
    }

    fn on_pages(&self, from: usize, payload: &[u8]) -> Result<(), String> {
        let mut r = Rd::new(payload);
        let n = r.u32()? as usize;
        let gps: Vec<u64> = (0..n).map(|_| r.u64()).collect::<Result<_, _>>()?;
        for gp in gps {
            let bytes = r.bytes(PAGE)?;
            let (seg, p) = self
                .find(gp)
                .ok_or_else(|| format!("page {gp} arrived, but no shared array holds it"))?;
            if seg.homes[p] as usize != from {
                return Err(format!(
                    "page {gp} arrived from a node that is not its home"
                ));
            }
            let waiters = {
                let mut m = seg.lock(p);
                if seg.state[p].load(Ordering::Acquire) != PENDING {
                    return Err(format!("page {gp} arrived, but it was not requested"));
                }
                // SAFETY: a page of a live segment; PENDING, so nobody here
                // reads or writes it until the state below says READ.
                unsafe { elem::copy_in(seg.page_ptr(p), bytes) };
                seg.state[p].store(READ | FRESH, Ordering::Release);
                self.fresh
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((seg.seq, p));
                self.ctr(m.requester)
                    .pages_fetched
                    .fetch_add(1, Ordering::Relaxed);
                let outstanding = &self.outstanding;
                m.pending.drain(|s| {
                    outstanding[s].fetch_sub(1, Ordering::Relaxed);
                });
                std::mem::take(&mut m.waiters)
            };
            for w in waiters {
                w.wake();
            }
        }
        Ok(())
    }

    fn on_release(&self, from: usize, payload: Vec<u8>) -> Result<(), String> {
        let epoch = Rd::new(&payload[1..]).u64()?;
        let mut pr = self.proto.lock().unwrap_or_else(|e| e.into_inner());
        let now = self.completed.load(Ordering::Acquire);
        if epoch == now && pr.releasing {
            self.apply_release(from, &payload, &mut pr)?;
            self.proto_cv.notify_all();
            Ok(())
        } else if epoch >= now {
            pr.early.push((from, epoch, payload));
            Ok(())
        } else {
            Err(format!(
                "a release of epoch {epoch} came after this node completed {now}"
            ))
        }
    }

    /// Applies one node's `REL`: its diffs to our home pages, its notices
    /// kept for the invalidation step.
    fn apply_release(&self, from: usize, payload: &[u8], pr: &mut Proto) -> Result<(), String> {
        // (After the kind byte, kept with the message while it waits.)
        let mut r = Rd::new(&payload[1..]);
        r.u64()?;
        let nr = r.u32()? as usize;
        for _ in 0..nr {
            let start = r.u64()?;
            let len = r.u32()?;
            pr.notices.push((start, len));
        }
        let nd = r.u32()? as usize;
        for _ in 0..nd {
            let gp = r.u64()?;
            let runs = r.u32()?;
            let (seg, p) = self
                .find(gp)
                .ok_or_else(|| format!("a diff for page {gp}, which no shared array holds"))?;
            if seg.homes[p] as usize != self.me {
                return Err(format!(
                    "a diff for page {gp} from node {from}, but its home is node {}",
                    seg.homes[p]
                ));
            }
            // The writer keeps its copy (it equals this one once every
            // diff is in, unless another writer's notice drops it).
            seg.lock(p).copies.insert(from);
            // SAFETY: a page of a live segment homed here; diff bytes are
            // written with byte atomics.
            let used = unsafe { elem::apply(seg.page_ptr(p), runs, r.rest()) }
                .ok_or_else(|| format!("a malformed diff for page {gp}"))?;
            r.bytes(used)?;
            self.ctr(self.procs)
                .diffs_applied
                .fetch_add(1, Ordering::Relaxed);
        }
        let np = r.u32()? as usize;
        for _ in 0..np {
            let gp = r.u64()?;
            let bytes = r.bytes(PAGE)?;
            let (seg, p) = self
                .find(gp)
                .ok_or_else(|| format!("a pushed page {gp}, which no shared array holds"))?;
            if seg.homes[p] as usize != from {
                return Err(format!(
                    "page {gp} pushed by node {from}, but its home is node {}",
                    seg.homes[p]
                ));
            }
            pr.pushes.push((gp, bytes.to_vec()));
        }
        let nd = r.u32()? as usize;
        for _ in 0..nd {
            let gp = r.u64()?;
            let (seg, p) = self
                .find(gp)
                .ok_or_else(|| format!("a declined page {gp}, which no shared array holds"))?;
            if seg.homes[p] as usize != self.me {
                return Err(format!(
                    "node {from} declined page {gp}, whose home is node {}",
                    seg.homes[p]
                ));
            }
            let mut m = seg.lock(p);
            m.copies.remove(from);
            if m.copies.is_empty() && !m.presumed && seg.state[p].load(Ordering::Acquire) == READ {
                // Nobody else holds it: the home writes it without faults.
                seg.state[p].store(WRITE, Ordering::Release);
            }
        }
        if !r.rest().is_empty() {
            return Err(format!("{} stray bytes after a release", r.rest().len()));
        }
        pr.got += 1;
        self.got.store(pr.got, Ordering::Release);
        pr.got_from[from] = true;
        Ok(())
    }

    // ---------------------------------------------------------------
    // The release, at the end of every phase and fork-join run.

    pub(crate) fn release(&self, phase: usize) -> Result<(), String> {
        let t0 = Instant::now();
        let slot = self.slot();
        if self.nodes > 1 {
            self.release_multi(slot)?;
        }
        self.ctr(slot)
            .release_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let total = self.totals();
        let mut t = self.phases.lock().unwrap_or_else(|e| e.into_inner());
        // A fork-join run's release has no phase: its traffic counts in the
        // totals and in the next phase's figures.
        if phase != hyfi_core::FORK_JOIN_PHASE {
            if t.per_phase.len() <= phase {
                t.per_phase.resize(phase + 1, DsmCounters::default());
            }
            let d = total.since(&t.last);
            t.per_phase[phase].accumulate(&d);
            t.last = total;
        }
        t.releases += 1;
        Ok(())
    }

    fn release_multi(&self, slot: usize) -> Result<(), String> {
        // The node's phase work is done: no request of it is in flight.
        while self
            .outstanding
            .iter()
            .any(|o| o.load(Ordering::Acquire) != 0)
        {
            if let Some(f) = self.failure() {
                return Err(f.clone());
            }
            std::thread::yield_now();
        }
        let epoch = self.completed.load(Ordering::Acquire);
        {
            // From now on this epoch's releases are applied as they come;
            // those that came while the phase ran are applied first.
            let mut pr = self.proto.lock().unwrap_or_else(|e| e.into_inner());
            pr.releasing = true;
            let early = std::mem::take(&mut pr.early);
            for (from, e, payload) in early {
                if e == epoch {
                    self.apply_release(from, &payload, &mut pr)?;
                } else {
                    pr.early.push((from, e, payload));
                }
            }
        }
        let mut dirty = std::mem::take(&mut *self.dirty.lock().unwrap_or_else(|e| e.into_inner()));
        dirty.sort_unstable();
        dirty.dedup();

        // 0. Pushed pages no access touched since the last release: dropped
        //    here and declined to their homes.
        let mut bodies: Vec<Body> = (0..self.nodes).map(|_| Body::default()).collect();
        let mut cache: Option<Arc<Segment>> = None;
        let mut declined: Vec<u64> = Vec::new();
        for gp in std::mem::take(&mut *self.pushed_last.lock().unwrap_or_else(|e| e.into_inner())) {
            let (seg, p) = self
                .find_cached(gp, &mut cache)
                .expect("pushed pages belong to segments");
            let _m = seg.lock(p);
            if seg.state[p].load(Ordering::Acquire) & PUSHED != 0 {
                seg.state[p].store(INVALID, Ordering::Release);
                bodies[seg.homes[p] as usize].declines.push(gp);
                declined.push(gp);
            }
        }
        declined.sort_unstable();
        self.ctr(slot)
            .pushes_declined
            .fetch_add(declined.len() as u64, Ordering::Relaxed);

        // 1. Diffs per home, pages back to READ; as a home, the pages
        //    written here go to the nodes holding a copy.
        let mut noticed_home: Vec<u64> = Vec::new();
        for &gp in &dirty {
            let (seg, p) = self
                .find_cached(gp, &mut cache)
                .expect("dirty pages belong to segments");
            let home = seg.homes[p] as usize;
            let mut m = seg.lock(p);
            if home != self.me {
                let twin = m
                    .twin
                    .take()
                    .expect("a non-home page written here has a twin");
                let b = &mut bodies[home];
                let at = b.diffs.len();
                b.diffs.extend_from_slice(&gp.to_le_bytes());
                b.diffs.extend_from_slice(&[0; 4]);
                // SAFETY: a page of a live segment; no filament runs now.
                let runs = unsafe { elem::diff(seg.page_ptr(p), &twin, &mut b.diffs) };
                if runs == 0 {
                    b.diffs.truncate(at); // written, but back to what it was
                } else {
                    b.diffs[at + 8..at + 12].copy_from_slice(&runs.to_le_bytes());
                    b.ndiffs += 1;
                    let c = self.ctr(slot);
                    c.diffs_sent.fetch_add(1, Ordering::Relaxed);
                    c.diff_bytes_sent
                        .fetch_add((b.diffs.len() - at - 12) as u64, Ordering::Relaxed);
                }
            } else if m
                .twin
                .take()
                // SAFETY: a page of a live segment homed here; no filament
                // runs now.
                .is_some_and(|t| unsafe { elem::same(seg.page_ptr(p), &t) })
            {
                // Served this phase from a page nobody else held, and not
                // written since: every holder has it as it is.
            } else if m.presumed {
                // Copies nobody was served: a notice to every node (below).
                m.presumed = false;
                noticed_home.push(gp);
            } else {
                for q in m.copies.iter() {
                    let b = &mut bodies[q];
                    b.pushes.extend_from_slice(&gp.to_le_bytes());
                    // SAFETY: a page of a live segment homed here; no
                    // filament runs now (diffs others apply meanwhile are
                    // byte atomics, and their writers' notices void this
                    // push at the receiver).
                    unsafe { elem::copy_out(seg.page_ptr(p), &mut b.pushes) };
                    b.npushes += 1;
                }
            }
            m.faulted = false;
            // A home page nobody else holds stays writable: its writes need
            // no fault (no twin, nobody to tell) until a node is served it.
            let home_alone = home == self.me && m.copies.is_empty() && !m.presumed;
            seg.state[p].store(if home_alone { WRITE } else { READ }, Ordering::Release);
        }

        // 2. Notices, as ranges of consecutive pages: the pages homed
        //    elsewhere that this node wrote (only their homes know who holds
        //    a copy), and pages homed here that every node may hold.
        //    Pages homed here that others were served went as pushes.
        let mut ranges: Vec<(u64, u32)> = Vec::new();
        let mut noticed = 0u64;
        for &gp in &dirty {
            let (seg, p) = self.find_cached(gp, &mut cache).expect("as above");
            if seg.homes[p] as usize == self.me && noticed_home.binary_search(&gp).is_err() {
                continue;
            }
            noticed += 1;
            match ranges.last_mut() {
                Some((s, l)) if *s + *l as u64 == gp && *l < u32::MAX => *l += 1,
                _ => ranges.push((gp, 1)),
            }
        }
        {
            let c = self.ctr(slot);
            c.notices_sent
                .fetch_add(noticed * (self.nodes as u64 - 1), Ordering::Relaxed);
            let pushed: u64 = bodies.iter().map(|b| u64::from(b.npushes)).sum();
            c.pages_pushed.fetch_add(pushed, Ordering::Relaxed);
        }
        for (q, b) in bodies.into_iter().enumerate() {
            if q == self.me {
                continue;
            }
            self.send(
                q,
                REL,
                Class::Bulk,
                24 + ranges.len() * 12 + b.diffs.len() + b.pushes.len() + 8 * b.declines.len(),
                slot,
                |buf| {
                    buf.extend_from_slice(&epoch.to_le_bytes());
                    buf.extend_from_slice(&(ranges.len() as u32).to_le_bytes());
                    for (s, l) in &ranges {
                        buf.extend_from_slice(&s.to_le_bytes());
                        buf.extend_from_slice(&l.to_le_bytes());
                    }
                    buf.extend_from_slice(&b.ndiffs.to_le_bytes());
                    buf.extend_from_slice(&b.diffs);
                    buf.extend_from_slice(&b.npushes.to_le_bytes());
                    buf.extend_from_slice(&b.pushes);
                    buf.extend_from_slice(&(b.declines.len() as u32).to_le_bytes());
                    for gp in &b.declines {
                        buf.extend_from_slice(&gp.to_le_bytes());
                    }
                },
            );
        }

        // 3. Wait for every other node's release of this epoch.
        let (mut notices, pushes) = {
            let mut pr = self.proto.lock().unwrap_or_else(|e| e.into_inner());
            let _w = hyfi_core::waits::waiting(
                |a| {
                    format!(
                        "the other nodes' releases (release #{}; {} of {} had come)",
                        a[0], a[1], a[2]
                    )
                },
                [epoch, pr.got as u64, self.nodes as u64 - 1],
            );
            if pr.got < self.nodes - 1 {
                drop(pr);
                hyfi_core::sleep::poll_own_cpu(|| {
                    self.got.load(Ordering::Acquire) >= self.nodes - 1
                });
                pr = self.proto.lock().unwrap_or_else(|e| e.into_inner());
            }
            while pr.got < self.nodes - 1 {
                if let Some(f) = self.failure() {
                    return Err(f.clone());
                }
                if let Some(p) = (0..self.nodes).find(|&p| pr.gone[p] && !pr.got_from[p]) {
                    return Err(format!(
                        "node {} waits for the release of node {p} at the end of a phase, \
                         but node {p} ended its program: every node must run the same \
                         phases and fork-join runs (SPMD)",
                        self.me
                    ));
                }
                pr = self
                    .proto_cv
                    .wait_timeout(pr, std::time::Duration::from_millis(100))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            if let Some(f) = self.failure() {
                return Err(f.clone());
            }
            (
                std::mem::take(&mut pr.notices),
                std::mem::take(&mut pr.pushes),
            )
        };

        // 4. Invalidate the copies others wrote.
        let mut invalidated = 0u64;
        for &(start, len) in &notices {
            for gp in start..start + len as u64 {
                let Some((seg, p)) = self.find_cached(gp, &mut cache) else {
                    return Err(format!(
                        "a write notice for page {gp}, which no shared array holds"
                    ));
                };
                if seg.homes[p] as usize != self.me
                    && seg.state[p].load(Ordering::Acquire) != INVALID
                {
                    let _m = seg.lock(p);
                    seg.state[p].store(INVALID, Ordering::Release);
                    invalidated += 1;
                }
            }
        }

        // 5. Install the pushed pages, unless another writer's notice names
        //    the page (its diff may be missing from the push), this node
        //    wrote it too, or this node declined it in this release: then
        //    the copy is dropped.
        notices.sort_unstable();
        let named = |gp: u64| {
            let k = notices.partition_point(|&(s, _)| s <= gp);
            k > 0 && gp < notices[k - 1].0 + u64::from(notices[k - 1].1)
        };
        let mut installed = Vec::with_capacity(pushes.len());
        for (gp, bytes) in pushes {
            let (seg, p) = self
                .find_cached(gp, &mut cache)
                .expect("checked on arrival");
            let _m = seg.lock(p);
            if named(gp) || dirty.binary_search(&gp).is_ok() || declined.binary_search(&gp).is_ok()
            {
                if seg.state[p].load(Ordering::Acquire) != INVALID {
                    seg.state[p].store(INVALID, Ordering::Release);
                    invalidated += 1;
                }
                continue;
            }
            // SAFETY: a page of a live segment homed elsewhere; no filament
            // runs now, and the next phase's barrier orders these bytes
            // before its accesses.
            unsafe { elem::copy_in(seg.page_ptr(p), &bytes) };
            seg.state[p].store(READ | PUSHED, Ordering::Release);
            installed.push(gp);
        }
        let c = self.ctr(slot);
        c.invalidations.fetch_add(invalidated, Ordering::Relaxed);
        c.pushes_installed
            .fetch_add(installed.len() as u64, Ordering::Relaxed);
        *self.pushed_last.lock().unwrap_or_else(|e| e.into_inner()) = installed;

        // Pages installed in this phase are settled from now on: this
        // read-modify-write acquires the installer's release, and the phase
        // barrier passes it on to every processor of the next phase.
        let fresh = std::mem::take(&mut *self.fresh.lock().unwrap_or_else(|e| e.into_inner()));
        if !fresh.is_empty() {
            let segs = self.segs.read().unwrap_or_else(|e| e.into_inner());
            for (seq, p) in fresh {
                segs[seq as usize].state[p].fetch_and(!FRESH, Ordering::AcqRel);
            }
        }

        // 5. Next epoch: serve what waited for it, take in early releases.
        let ready = {
            let mut pr = self.proto.lock().unwrap_or_else(|e| e.into_inner());
            let next = epoch + 1;
            self.completed.store(next, Ordering::Release);
            pr.got = 0;
            self.got.store(0, Ordering::Release);
            pr.got_from.iter_mut().for_each(|g| *g = false);
            // The next phase's filaments may run now: releases of the next
            // epoch that came early stay in `early` until its release.
            pr.releasing = false;
            let deferred = std::mem::take(&mut pr.deferred);
            let (ready, later): (Vec<_>, Vec<_>) = deferred.into_iter().partition(|d| d.1 <= next);
            pr.deferred = later;
            ready
        };
        for (from, _, pages) in ready {
            self.serve(from, &pages);
        }
        Ok(())
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
        }
    }
}

impl Service for Core {
    fn frame(&self, from: usize, payload: Vec<u8>) -> Result<(), String> {
        match payload.first().copied() {
            Some(REQ) => self.on_request(from, &payload[1..]),
            Some(PAGES) => self.on_pages(from, &payload[1..]),
            Some(REL) => self.on_release(from, payload),
            Some(k) => Err(format!("unknown DSM message kind {k}")),
            None => Err("an empty DSM message".into()),
        }
        .map_err(|why| format!("shared memory: {why}"))
    }
    fn failed(&self, why: &str) {
        self.fail(why);
    }
    fn peer_left(&self, peer: usize) {
        let mut pr = self.proto.lock().unwrap_or_else(|e| e.into_inner());
        pr.gone[peer] = true;
        self.proto_cv.notify_all();
    }
}

/// The release as hyfi-core's phase-end hook.
pub(crate) struct Hook(pub(crate) Arc<Core>);

impl hyfi_core::PhaseEnd for Hook {
    fn end_phase(
        &self,
        phase: usize,
        _link: &dyn hyfi_core::NodeLink,
    ) -> Result<(), hyfi_core::LinkError> {
        self.0.release(phase).map_err(|e| e.into())
    }
    fn access_epoch_ended(&self) {
        crate::footprint::check_no_live_views(&self.0);
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
