//! The release, at every phase end and fork-join run, in place of the
//! barrier: diffs to homes, notices, producer pushes and declines, one
//! message to each node there is something for, and an all-reduce of the
//! counts; then invalidations and installs (see the README).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::diff;
use super::msg::{Release, ReleaseBody, ReleaseOut};
use super::page_table::{Segment, FRESH, INVALID, PUSHED, READ, WRITE};
use super::Core;
use crate::elem;
use crate::error::{ProtocolError, ReleaseError, Violation};
use crate::stats::DsmCounters;

/// One release's working set.
struct Round {
    epoch: u64,
    slot: usize,
    /// Pages first written here this phase (sorted, unique).
    dirty: Vec<u64>,
    /// Pushed pages this node declines in this release (sorted).
    declined: Vec<u64>,
    /// What goes to each node.
    bodies: Vec<ReleaseBody>,
    /// How many of `dirty` are homed elsewhere (`Core::advise`).
    offhome: usize,
    /// Pages written here, as their home, that at least half the other
    /// nodes hold: pushed through the release's all-reduce (see
    /// [`Gathered`]) instead of in a `REL` to each. Each is the holders
    /// (a bit per node) followed by the page's bytes.
    gathered: Vec<(u64, Vec<u8>)>,
    /// The segment of the last page looked up.
    cache: Option<Arc<Segment>>,
}

/// A page its home pushed to this node: the whole page, or the home's own
/// writes as a diff (its run count and runs as `diff::encode` wrote them).
pub(super) enum Pushed {
    /// A whole page gathered through the all-reduce.
    Page(Vec<u8>),
    /// A whole page in a `REL` kept for the install ([`Pushes::frames`]):
    /// its bytes at `at` in frame `frame`, installed from there (a copy
    /// of each page out of the frame cost 32 allocations and copies a
    /// release on a 3-D stencil's halo).
    Held { frame: usize, at: usize },
    /// The home's own writes, in a kept `REL` as well: `runs` runs in
    /// `len` bytes at `at` of frame `frame`.
    Diff {
        frame: usize,
        at: usize,
        len: usize,
        runs: u32,
    },
}

/// The pages pushed to this node in a release, and the `REL`s their bytes
/// are in.
#[derive(Default)]
pub(super) struct Pushes {
    pub(super) pages: Vec<(u64, Pushed)>,
    pub(super) frames: Vec<Vec<u8>>,
}

pub(super) struct Proto {
    /// `REL` messages of the current epoch received.
    pub(super) got: usize,
    /// Their write notices (page ranges).
    pub(super) notices: Vec<(u64, u32)>,
    /// `REL` messages not applied yet, of this epoch or later: (from,
    /// epoch, frame).
    pub(super) early: Vec<(usize, u64, Vec<u8>)>,
    /// This node is in its release: `REL`s of the current epoch are
    /// applied as they arrive. Outside it (while the phase's filaments
    /// run) they wait in `early`: a diff written into a home page during
    /// the phase could overlap a footprint read view's plain reads.
    pub(super) releasing: bool,
    /// Page requests waiting for this node's epoch: (from, epoch, pages).
    pub(super) deferred: Vec<(usize, u64, Vec<u64>)>,
    /// Pages pushed to this node in the current release, whole or as
    /// their home's own writes, installed once every `REL` is in.
    pub(super) pushes: Pushes,
    /// Broadcasts of a later epoch than this node's (their root finished a
    /// release this node is still in): (epoch, frame), installed when this
    /// node's epoch reaches theirs (core/broadcast.rs).
    pub(super) early_broadcasts: Vec<(u64, Vec<u8>)>,
    /// Broadcast messages of the current epoch this node expects (it named
    /// their pages in `broadcast_rows`), and those it received: the release
    /// waits until every one came, so that none is still on its way (or
    /// passed on) after it.
    pub(super) bcast_expected: u64,
    pub(super) bcast_received: u64,
    /// The pages homed elsewhere that `broadcast_rows` named in the
    /// current epoch and whose broadcast has not come yet: a thread that
    /// reads one outside a filthread waits for it rather than requesting
    /// it ([`Core::await_broadcast_of`]).
    pub(super) bcast_due: std::collections::HashSet<u64>,
    /// The reductions carried by the `REL`s of the current epoch: (from,
    /// bytes); on two nodes the other node's (see [`Carried`]).
    pub(super) carried: Vec<(usize, Vec<u8>)>,
    /// The pages the last release's write notices named, this node's and
    /// the others' (first, pages): rows carried with a reduction are not
    /// installed if any of their pages is among them (`take_carried`).
    pub(super) noticed: Vec<(u64, u32)>,
}

/// Pages a node wrote in a phase: all of them, those homed elsewhere, and
/// the first of those whose copy here the release dropped because another
/// node wrote it too (allocation, page, home).
#[derive(Clone, Copy, Debug, Default)]
struct Written {
    pages: usize,
    offhome: usize,
    shared: Option<(u64, usize, usize)>,
}

/// A release whose pages written are at least this many homed elsewhere,
/// and at least half of them, counts towards the advice (`Core::advise`),
/// given on the third such release of a phase.
const OFFHOME_PAGES: usize = 16;
const OFFHOME_RELEASES: u32 = 3;
/// A phase whose writes here lost their copy of a page another node wrote
/// too in this many releases is advised (`Core::advise`).
const SHARED_RELEASES: u32 = 3;

/// A value the release all-reduces on its way: the reductions its phase
/// reduces at its end ([`hyfi_core::PhaseEnd::end_phase_reducing`]). On
/// two nodes each `REL` carries the sender's value (the exchange is the
/// phase's barrier, and so its all-reduce); on more, the value rides in
/// the all-reduce of the counts. Either way the result is the bits
/// [`hyfi_core::NodeLink::allreduce`] gives: on two nodes it combines
/// node 0's value with node 1's, as the link's recursive doubling does.
pub(crate) struct Carried<'v> {
    pub(crate) value: &'v mut [u8],
    pub(crate) combine: &'v mut dyn FnMut(&mut [u8], &[u8]),
}

impl Core {
    pub(super) fn on_release(&self, from: usize, frame: Vec<u8>) -> Result<(), ProtocolError> {
        let epoch = Release::peek_epoch(&frame)?;
        let mut pr = self.proto.lock().unwrap_or_else(|e| e.into_inner());
        let now = self.completed.load(Ordering::Acquire);
        if epoch == now && pr.releasing {
            self.apply_release(from, frame, &mut pr)?;
            self.proto_cv.notify_all(&pr);
            Ok(())
        } else if epoch >= now {
            pr.early.push((from, epoch, frame));
            Ok(())
        } else {
            Err(ProtocolError::LateRelease {
                epoch,
                completed: now,
            })
        }
    }

    /// Applies one node's `REL`: its diffs to our home pages, its notices
    /// kept for the invalidation step, the frame itself if it pushes pages
    /// (whole or as diffs, installed from it), else given back to the
    /// transport's pool. A malformed `REL` is refused whole, before any of
    /// it is applied.
    fn apply_release(
        &self,
        from: usize,
        frame: Vec<u8>,
        pr: &mut Proto,
    ) -> Result<(), ProtocolError> {
        let rel = Release::decode(&frame)?;
        // Applied only in the release of its epoch (see `Proto::releasing`).
        debug_assert_eq!(rel.epoch, self.completed.load(Ordering::Acquire));
        pr.notices.extend(rel.notices());
        for d in rel.diffs() {
            let (seg, p) = self.page_homed_at(d.page, self.me, "a diff for")?;
            // The writer keeps its copy (it equals this one once every
            // diff is in, unless another writer's notice drops it).
            let mut m = seg.lock(p);
            m.copies.insert(from);
            m.diffed = rel.epoch + 1;
            if let Some(twin) = m.twin.as_deref_mut() {
                // Served this phase while the home could write it without a
                // fault (server.rs): the release pushes the page if it no
                // longer equals this snapshot, which must then mean the
                // home wrote it, not that a diff came. (Else the writer got
                // its own write pushed back, dropped it, and fetched the
                // page again.)
                d.apply_to_twin(twin);
            }
            // SAFETY: a page of a live segment homed here; diff bytes are
            // written with byte atomics.
            unsafe { d.apply(seg.page_ptr(p)) };
            drop(m);
            self.ctr(self.procs)
                .diffs_applied
                .fetch_add(1, Ordering::Relaxed);
        }
        // Pushed pages and diffs are installed from the frame, kept until
        // then: their place in it.
        let (held, mut holds) = (pr.pushes.frames.len(), false);
        let at = |bytes: &[u8]| bytes.as_ptr() as usize - frame.as_ptr() as usize;
        for (gp, bytes) in rel.pushes() {
            self.page_homed_at(gp, from, "a push of")?;
            let at = at(bytes);
            pr.pushes.pages.push((gp, Pushed::Held { frame: held, at }));
            holds = true;
        }
        for d in rel.push_diffs() {
            self.page_homed_at(d.page, from, "a push of")?;
            let (runs, bytes) = d.raw();
            let (at, len) = (at(bytes), bytes.len());
            let push = Pushed::Diff {
                frame: held,
                at,
                len,
                runs,
            };
            pr.pushes.pages.push((d.page, push));
            holds = true;
        }
        pr.carried.push((from, rel.carried.to_vec()));
        for gp in rel.declines() {
            let (seg, p) = self.page_homed_at(gp, self.me, "a decline of")?;
            let mut m = seg.lock(p);
            m.copies.remove(from);
            if m.copies.is_empty() && !m.presumed && seg.state[p].load(Ordering::Acquire) == READ {
                // Nobody else holds it: the home writes it without faults.
                seg.state[p].store(WRITE, Ordering::Release);
            }
        }
        pr.got += 1;
        self.got.store(pr.got, Ordering::Release);
        if holds {
            pr.pushes.frames.push(frame);
        } else {
            hyfi_core::link::buffers::recycle(frame);
        }
        Ok(())
    }

    /// Ends phase `phase` (a fork-join run's release if
    /// `FORK_JOIN_PHASE`), all-reducing `carried` on the way. On one node
    /// there is nothing to exchange, and `carried` is already the result.
    pub(crate) fn release(
        &self,
        phase: usize,
        link: &dyn hyfi_core::NodeLink,
        carried: Option<Carried<'_>>,
    ) -> Result<(), ReleaseError> {
        let t0 = Instant::now();
        let slot = self.slot();
        if self.nodes == 1 {
            self.finish_release(t0, slot, phase, None, Written::default());
            return Ok(());
        }
        let epoch = self.prepare_release()?;
        // From its `REL`s' sending to the next epoch, this thread reads what
        // comes (it polls for the others' `REL`s in between, and installs
        // what they brought after): a message sent here meanwhile needs no
        // bell, a socket write of 10-20 us on a virtual machine and this
        // node's communication thread woken onto its master's CPU. The
        // waits before (page replies, broadcasts) are not inside: they
        // sleep on messages that must ring.
        hyfi_core::link::attending_collective(|| {
            let written = self.release_round(phase, slot, link, carried, epoch)?;
            self.finish_release(t0, slot, phase, Some(epoch), written);
            Ok(())
        })
    }

    /// The release's bookkeeping, then the next epoch (after `epoch`, the
    /// one completed, on several nodes).
    fn finish_release(
        &self,
        t0: Instant,
        slot: usize,
        phase: usize,
        epoch: Option<u64>,
        written: Written,
    ) {
        self.ctr(slot)
            .release_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        {
            let total = self.totals();
            let mut t = self.phases.lock().unwrap_or_else(|e| e.into_inner());
            // A fork-join run's release has no phase: its traffic counts in
            // the totals and in the next phase's figures.
            if phase != hyfi_core::FORK_JOIN_PHASE {
                if t.per_phase.len() <= phase {
                    t.per_phase.resize(phase + 1, DsmCounters::default());
                }
                let d = total.since(&t.last);
                t.per_phase[phase].accumulate(&d);
                t.last = total;
                self.advise(&mut t, phase, written);
            }
            t.releases += 1;
        }
        // Only now the next epoch, whose first act is to serve the requests
        // of nodes already in it: they count in the next phase's figures,
        // not in this one's (a faster node reading the results after the
        // program's last release made that phase's look thousands of pages
        // heavier, by chance).
        if let Some(e) = epoch {
            self.next_epoch(e);
        }
    }

    /// Counts a release that wrote a third or more pages homed elsewhere, or that
    /// dropped the copy of a page this node and another wrote, and says
    /// once per node, on the third of either, what it costs and what to do.
    fn advise(&self, t: &mut super::PhaseTable, phase: usize, w: Written) {
        // The wider advice first: a phase that writes many pages homed
        // elsewhere also shares pages with their homes.
        self.advise_offhome(t, phase, w);
        let Some((seq, page, home)) = w.shared else {
            return;
        };
        if t.shared.len() <= phase {
            t.shared.resize(phase + 1, 0);
        }
        t.shared[phase] += 1;
        if t.shared[phase] < SHARED_RELEASES || t.advice.is_some() {
            return;
        }
        let advice = format!(
            "hyfi-dsm: node {}: phase {phase} wrote page {page} of shared allocation #{seq} \
             (home node {home}) while another node wrote it too, in {SHARED_RELEASES} releases \
             so far: each release drops this node's copy (neither writer's copy has the \
             other's bytes), and the next phase fetches it again, a round trip on its critical \
             path. Two nodes' blocks that share a page do this: a vector, or a matrix made \
             without pad_rows, split between nodes inside a page (pad the matrix's rows, or \
             size the vector so that each node's block starts on a page of {} bytes), or \
             filaments that store into rows another node writes (a halo in a write view \
             costs nothing while nothing is stored into it). Dsm::stats counts it (pages \
             fetched).",
            self.me,
            crate::region::PAGE
        );
        eprintln!("{advice}");
        t.advice = Some(advice);
    }

    /// The advice on pages homed elsewhere (see [`Core::advise`]).
    fn advise_offhome(&self, t: &mut super::PhaseTable, phase: usize, w: Written) {
        // A third or more: a user's bucket sort writing half its pages
        // into the other node's buckets (a fetch, a diff and pushes back
        // for each, five times the bytes that must move) was not advised
        // at "most".
        if w.offhome < OFFHOME_PAGES || 3 * w.offhome < w.pages {
            return;
        }
        if t.offhome.len() <= phase {
            t.offhome.resize(phase + 1, 0);
        }
        t.offhome[phase] += 1;
        if t.offhome[phase] < OFFHOME_RELEASES || t.advice.is_some() {
            return;
        }
        let advice = format!(
            "hyfi-dsm: node {}: phase {phase} wrote {} pages homed on other nodes (of the {} \
             pages it wrote) in its last release, and a third or more such pages in \
             {OFFHOME_RELEASES} releases so far. Each costs a fetch if missing, a twin, a diff \
             to its home and a write notice, and a page several nodes write is fetched again \
             by each. Place the data where the filaments that write it run (the same \
             range in Placement::BlockRows as in PoolArray::block, or CyclicRows with \
             PoolArray::cyclic), or write what this node homes and read the rest; \
             Dsm::stats counts it (diffs sent, notices).",
            self.me, w.offhome, w.pages
        );
        eprintln!("{advice}");
        t.advice = Some(advice);
    }

    /// The release on several nodes, up to its `REL`s: waits until no
    /// request of the phase is in flight and every broadcast expected came,
    /// applies the `REL`s of this epoch that came early, and returns the
    /// epoch (`release` starts the next, `next_epoch`).
    fn prepare_release(&self) -> Result<u64, ReleaseError> {
        // The node's phase work is done: no request of it is in flight.
        while self
            .outstanding
            .iter()
            .any(|o| o.load(Ordering::Acquire) != 0)
        {
            if let Some(f) = self.failure() {
                return Err(ReleaseError::Failed(f.clone()));
            }
            std::thread::yield_now();
        }
        self.await_broadcasts()?;
        let epoch = self.completed.load(Ordering::Acquire);
        {
            // From now on this epoch's releases are applied as they come;
            // those that came while the phase ran are applied first.
            let mut pr = self.proto.lock().unwrap_or_else(|e| e.into_inner());
            pr.releasing = true;
            let early = std::mem::take(&mut pr.early);
            for (from, e, frame) in early {
                if e == epoch {
                    self.apply_release(from, frame, &mut pr)
                        .map_err(|error| Violation { from, error })?;
                } else {
                    pr.early.push((from, e, frame));
                }
            }
        }
        Ok(epoch)
    }

    /// The release's exchange: sends this node's `REL`s, waits for the
    /// others' (and the count's all-reduce on more than two nodes), and
    /// applies them; returns what the node wrote in the phase.
    fn release_round(
        &self,
        phase: usize,
        slot: usize,
        link: &dyn hyfi_core::NodeLink,
        mut carried: Option<Carried<'_>>,
        epoch: u64,
    ) -> Result<Written, ReleaseError> {
        let mut dirty = std::mem::take(&mut *self.dirty.lock().unwrap_or_else(|e| e.into_inner()));
        dirty.sort_unstable();
        dirty.dedup();

        let mut r = Round {
            epoch,
            slot,
            dirty,
            declined: Vec::new(),
            bodies: (0..self.nodes).map(|_| ReleaseBody::default()).collect(),
            offhome: 0,
            gathered: Vec::new(),
            cache: None,
        };
        self.decline_unused(&mut r);
        let noticed_home = self.diffs_and_pushes(&mut r);
        let (sent, mut noticed) = self.send_releases(&mut r, &noticed_home, carried.as_ref());
        let (expected, their_notices, their_pushes) =
            self.count_releases(phase, link, &sent, &noticed, &r.gathered, carried.as_mut())?;
        self.ctr(slot)
            .pushes_gathered
            .fetch_add(r.gathered.len() as u64, Ordering::Relaxed);
        let (mut notices, mut pushes, others) = self.await_releases(epoch, expected)?;
        // What the phase's end waited for is in: until the next phase
        // computes, a `REL` of the next epoch is read at its end.
        hyfi_core::link::phase_end_reached();
        // The others' notices: in their `REL`s on two nodes, gathered in the
        // all-reduce on more; and the pages their homes pushed through it.
        notices.extend(their_notices);
        self.pushed_here(their_pushes, &mut pushes)?;
        // This node's notices and the others': every page some node other
        // than its home wrote in the phase.
        noticed.extend_from_slice(&notices);
        self.proto.lock().unwrap_or_else(|e| e.into_inner()).noticed = noticed;
        if self.dense_release() {
            self.combine_carried(phase, carried, others)?;
        }
        let invalidated = self.invalidate_noticed(&notices, &mut r)?;
        self.install_pushes(notices, pushes, invalidated, &mut r);
        self.settle_fresh();
        let written = Written {
            pages: r.dirty.len(),
            offhome: r.offhome,
            shared: self.shared_written(&mut r),
        };
        Ok(written)
    }

    /// The first page this node wrote in the phase, homed elsewhere, whose
    /// copy the release left invalid: another node wrote it too (its
    /// home's notice, or this node's drop of its push).
    fn shared_written(&self, r: &mut Round) -> Option<(u64, usize, usize)> {
        // Only a page homed elsewhere can be one: most releases write none
        // (a block-row stencil's), and need not look up every page again.
        if r.offhome == 0 {
            return None;
        }
        for &gp in &r.dirty {
            let (seg, p) = self.find_cached(gp, &mut r.cache)?;
            let home = seg.homes[p] as usize;
            if home != self.me && seg.state[p].load(Ordering::Acquire) == INVALID {
                return Some((seg.seq, p, home));
            }
        }
        None
    }

    /// Waits until every broadcast this node expects in this epoch came
    /// (core/broadcast.rs): its pages are installed (or were fetched)
    /// before the release, and none is passed on after it.
    fn await_broadcasts(&self) -> Result<(), ReleaseError> {
        let mut pr = self.proto.lock().unwrap_or_else(|e| e.into_inner());
        if pr.bcast_received >= pr.bcast_expected {
            return Ok(());
        }
        // Not under the lock: the transport may deliver frames here, whose
        // handler takes it.
        drop(pr);
        hyfi_core::link::before_wait();
        pr = self.proto.lock().unwrap_or_else(|e| e.into_inner());
        let _w = hyfi_core::waits::waiting(
            |a| {
                format!(
                    "broadcast rows from their homes ({} of {} came)",
                    a[0], a[1]
                )
            },
            [pr.bcast_received, pr.bcast_expected, 0],
        );
        let t = Instant::now();
        while pr.bcast_received < pr.bcast_expected {
            if let Some(f) = self.failure() {
                return Err(ReleaseError::Failed(f.clone()));
            }
            if t.elapsed() > super::broadcast::MISSING_AFTER {
                return Err(ReleaseError::BroadcastMissing {
                    me: self.me,
                    missing: pr.bcast_expected - pr.bcast_received,
                    secs: super::broadcast::MISSING_AFTER.as_secs(),
                });
            }
            pr = self
                .proto_cv
                .wait_timeout(pr, std::time::Duration::from_millis(100));
        }
        Ok(())
    }

    /// 0. Pushed pages no access touched since the last release: dropped
    ///    here and declined to their homes.
    fn decline_unused(&self, r: &mut Round) {
        let Round {
            bodies,
            cache,
            declined,
            slot,
            ..
        } = r;
        for gp in std::mem::take(&mut *self.pushed_last.lock().unwrap_or_else(|e| e.into_inner())) {
            let (seg, p) = self
                .find_cached(gp, cache)
                .expect("pushed pages belong to segments");
            let _m = seg.lock(p);
            if seg.state[p].load(Ordering::Acquire) & PUSHED != 0 {
                seg.state[p].store(INVALID, Ordering::Release);
                bodies[seg.homes[p] as usize].decline(gp);
                declined.push(gp);
            }
        }
        declined.sort_unstable();
        self.ctr(*slot)
            .pushes_declined
            .fetch_add(declined.len() as u64, Ordering::Relaxed);
    }

    /// 1. Diffs per home, pages back to `READ`; as a home, the pages written
    ///    here go to the nodes holding a copy. Returns the home pages whose
    ///    write is noticed to every node instead (sorted): a first write
    ///    (zeroed copies everywhere), or one another node wrote too.
    fn diffs_and_pushes(&self, r: &mut Round) -> Vec<u64> {
        let Round {
            bodies,
            offhome,
            gathered,
            cache,
            dirty,
            slot,
            epoch,
            ..
        } = r;
        let mut noticed_home: Vec<u64> = Vec::new();
        // Pages homed elsewhere made writable here but not changed.
        let mut unchanged: Vec<u64> = Vec::new();
        for &gp in dirty.iter() {
            let (seg, p) = self
                .find_cached(gp, cache)
                .expect("dirty pages belong to segments");
            let home = seg.homes[p] as usize;
            let mut m = seg.lock(p);
            if home != self.me {
                let twin = m
                    .twin
                    .take()
                    .expect("a non-home page written here has a twin");
                let page = seg.page_ptr(p);
                // SAFETY: a page of a live segment; no filament runs now.
                let grain = seg.grain;
                let runs = |out: &mut Vec<u8>| unsafe { diff::encode(page, &twin, out, grain) };
                if let Some(bytes) = bodies[home].diff(gp, runs) {
                    *offhome += 1;
                    let c = self.ctr(*slot);
                    c.diffs_sent.fetch_add(1, Ordering::Relaxed);
                    c.diff_bytes_sent.fetch_add(bytes as u64, Ordering::Relaxed);
                } else {
                    // No byte differs from the twin: a write view's halo
                    // (a red-black sweep binds the rows around its own
                    // with it), or bytes written back to what they were.
                    // This node then wrote nothing the others lack, so it
                    // is no writer of the page: no notice, and its copy,
                    // back to `READ`, takes the home's push like any
                    // reader's (or the notice of another writer drops it).
                    // As a writer it dropped its copy at every release and
                    // fetched it again in the next phase.
                    unchanged.push(gp);
                }
            } else if self.twin_settles(&mut m, seg.page_ptr(p), seg.grain, gp, bodies, *slot) {
                // Snapshotted and unchanged by the home, or its own writes
                // pushed as a diff (see there).
            } else if m.presumed {
                // Copies nobody was served: a notice to every node (below).
                m.presumed = false;
                noticed_home.push(gp);
            } else if m.diffed == *epoch + 1 {
                // Another node wrote the page too, and its notice names it:
                // every receiver would drop a push (core/README.md), the
                // writer because it wrote the page, the others because its
                // diff may be missing. A notice of the home's own write
                // does what the dropped push did: it invalidates the
                // writer's copy, which lacks the home's bytes. (A diff that
                // comes after this point lets the pushes go, to be
                // dropped.)
                self.ctr(*slot)
                    .pushes_withheld
                    .fetch_add(m.copies.len() as u64, Ordering::Relaxed);
                noticed_home.push(gp);
            } else if self.gathers(m.copies.len()) {
                let map = self.nodes.div_ceil(8);
                let mut bytes = vec![0u8; map];
                for q in m.copies.iter() {
                    bytes[q / 8] |= 1 << (q % 8);
                }
                // SAFETY: as below.
                unsafe { elem::copy_out(seg.page_ptr(p), &mut bytes) };
                gathered.push((gp, bytes));
            } else {
                let page = seg.page_ptr(p);
                for q in m.copies.iter() {
                    // SAFETY: a page of a live segment homed here; no
                    // filament runs now (diffs others apply meanwhile are
                    // byte atomics, and their writers' notices void this
                    // push at the receiver).
                    bodies[q].push(gp, |out| unsafe { elem::copy_out(page, out) });
                }
            }
            m.faulted = false;
            // A home page nobody else holds stays writable: its writes need
            // no fault (no twin, nobody to tell) until a node is served it.
            let home_alone = home == self.me && m.copies.is_empty() && !m.presumed;
            seg.state[p].store(if home_alone { WRITE } else { READ }, Ordering::Release);
        }
        if !unchanged.is_empty() {
            // Both sorted: `dirty` is, and `unchanged` follows it.
            dirty.retain(|gp| unchanged.binary_search(gp).is_err());
            self.ctr(*slot)
                .pages_unchanged
                .fetch_add(unchanged.len() as u64, Ordering::Relaxed);
        }
        noticed_home
    }

    /// A home page written this phase, by its twin (taken when the page
    /// was served from `WRITE`, or at the home's write fault because
    /// another node wrote it lately, `Meta::own_twin`): true if that
    /// settles what its holders get, false if the release goes on as
    /// without a twin.
    ///
    /// - Unchanged since the twin: every holder has the home's bytes
    ///   (another writer's are in its diff, and its notice tells them).
    /// - Changed, and the twin taken for another writer: the home's own
    ///   writes go to every holder as a diff against the twin (to which
    ///   the others' diffs were applied as to the page), which applies to
    ///   a copy another writer changed as well. A whole page would not:
    ///   each writer dropped it (it lacks the writer's bytes) and fetched
    ///   the page again in the next phase (core/README.md, "pages two
    ///   nodes write").
    fn twin_settles(
        &self,
        m: &mut super::page_table::Meta,
        page: *mut u8,
        grain: usize,
        gp: u64,
        bodies: &mut [ReleaseBody],
        slot: usize,
    ) -> bool {
        let own = std::mem::take(&mut m.own_twin);
        let Some(twin) = m.twin.take() else {
            return false;
        };
        if !own || m.presumed || self.gathers(m.copies.len()) {
            // SAFETY: a page of a live segment homed here; no filament
            // runs now.
            return unsafe { elem::same(page, &twin) };
        }
        // One pass: no run is no change.
        let mut runs_out = Vec::new();
        // SAFETY: as above.
        let runs = unsafe { diff::encode(page, &twin, &mut runs_out, grain) };
        if runs == 0 {
            return true;
        }
        for q in m.copies.iter() {
            bodies[q].push_diff(gp, runs, &runs_out);
        }
        self.ctr(slot)
            .pushes_as_diffs
            .fetch_add(m.copies.len() as u64, Ordering::Relaxed);
        true
    }

    /// 2. A `REL` to every other node there is something for: diffs,
    ///    pushes or declines (on two nodes, always, with the notices).
    ///    Returns the `REL`s sent, one count per node, and this node's
    ///    notices: pages homed elsewhere that it wrote, and pages homed here
    ///    that others may hold unknown to it (`presumed`); every node needs
    ///    them, since only a page's home knows who holds a copy.
    fn send_releases(
        &self,
        r: &mut Round,
        noticed_home: &[u64],
        carried: Option<&Carried<'_>>,
    ) -> (Vec<u32>, Vec<(u64, u32)>) {
        let Round {
            bodies,
            cache,
            dirty,
            slot,
            epoch,
            ..
        } = r;
        let (slot, epoch) = (*slot, *epoch);
        let mut ranges: Vec<(u64, u32)> = Vec::new();
        let mut noticed = 0u64;
        for &gp in dirty.iter() {
            let (seg, p) = self.find_cached(gp, cache).expect("as above");
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
            let pushed: u64 = bodies.iter().map(|b| u64::from(b.pushes())).sum();
            c.pages_pushed.fetch_add(pushed, Ordering::Relaxed);
        }
        // On two nodes the `REL` carries the reductions (see `Carried`).
        let carried = match carried {
            Some(c) if self.dense_release() => &*c.value,
            _ => &[],
        };
        // On more than two nodes the notices ride in the all-reduce of the
        // counts (every node needs them, and a `REL` to each would be N − 1
        // messages a node); on two, in the `REL` every release sends.
        let notices: &[(u64, u32)] = if self.dense_release() { &ranges } else { &[] };
        let mut sent = vec![0u32; self.nodes];
        for (q, body) in bodies.iter().enumerate() {
            if q == self.me || (!self.dense_release() && body.is_empty()) {
                continue;
            }
            self.send(
                q,
                slot,
                ReleaseOut {
                    epoch,
                    notices,
                    body,
                    carried,
                },
            );
            sent[q] = 1;
        }
        (sent, ranges)
    }

    /// 3a. How many `REL`s of this epoch come to this node, and the other
    ///     nodes' write notices: one all-reduce (log-depth over the link,
    ///     and the phase's barrier: every node has sent its `REL`s when it
    ///     enters it) of a count per node, summed, the phase's reductions
    ///     if it carries some, combined, and every node's notices, gathered
    ///     (see [`Gathered`]). On two nodes the `REL` carries all of it, and
    ///     no all-reduce runs.
    fn count_releases(
        &self,
        phase: usize,
        link: &dyn hyfi_core::NodeLink,
        sent: &[u32],
        notices: &[(u64, u32)],
        pushes: &[(u64, Vec<u8>)],
        carried: Option<&mut Carried<'_>>,
    ) -> Result<Counted, ReleaseError> {
        if self.dense_release() {
            // Two nodes: each always sends the other its `REL`, and waiting
            // for it is the barrier (one message, one latency, where the
            // count's exchange would add a second round).
            return Ok((self.nodes - 1, Vec::new(), Vec::new()));
        }
        let (value, mut reduce) = match carried {
            Some(Carried { value, combine }) => (Some(value), Some(combine)),
            None => (None, None),
        };
        let mine: &[u8] = value.as_deref().map_or(&[], |v| &**v);
        let clen = mine.len();
        let mut v = Gathered::encode(self.me, sent, mine, notices, pushes);
        let nodes = self.nodes;
        let mut combine = |acc: &mut Vec<u8>, other: &[u8]| {
            Gathered::combine(nodes, acc, other, reduce.as_deref_mut())
        };
        let _w = hyfi_core::waits::waiting(
            |a| {
                format!(
                    "the other nodes' releases (release #{}: the count of the messages \
                     each node sent in it)",
                    a[0]
                )
            },
            [self.completed.load(Ordering::Acquire), 0, 0],
        );
        link.allreduce_vec(&mut v, &mut combine)
            .map_err(ReleaseError::Link)?;
        let g = Gathered::decode(nodes, &v, clen).map_err(|e| match e {
            Undecodable::Diverged { from, got } => ReleaseError::Carried {
                me: self.me,
                from,
                phase,
                got,
                expected: clen,
            },
            Undecodable::Stray(len) => ReleaseError::Notice(ProtocolError::StrayBytes { len }),
        })?;
        if let Some(value) = value {
            value.copy_from_slice(g.carried);
        }
        let (mut others, mut pushed) = (Vec::new(), Vec::new());
        for rec in g.records() {
            match rec.map_err(|len| ReleaseError::Notice(ProtocolError::StrayBytes { len }))? {
                Record::Notice { writer, .. } | Record::Push { writer, .. }
                    if writer == self.me => {}
                Record::Notice { first, pages, .. } => others.push((first, pages)),
                Record::Push {
                    page,
                    writer,
                    holders,
                    bytes,
                } => {
                    if holders[self.me / 8] & (1 << (self.me % 8)) != 0 {
                        pushed.push((writer, page, bytes.to_vec()));
                    }
                }
            }
        }
        Ok((g.count(self.me), others, pushed))
    }

    /// On two nodes every release sends its `REL` even when it is empty
    /// (see `count_releases`).
    fn dense_release(&self) -> bool {
        self.nodes == 2
    }

    /// Whether a page its home wrote, held by `holders` other nodes, goes
    /// through the all-reduce rather than in a `REL` to each holder: on
    /// more than two nodes, when at least half the others hold it. Every
    /// node then receives it, in the all-reduce's `log2 N` messages,
    /// where pushes cost the home one message per holder (a page every
    /// node reads, written each phase: `N − 1` messages a phase). The
    /// record names the holders, who install it as a push; the others
    /// receive at most as many bytes again as the holders, and drop them.
    fn gathers(&self, holders: usize) -> bool {
        !self.dense_release() && holders >= 2 && 2 * holders >= self.nodes - 1
    }

    /// 3b. Waits for the `REL`s of this epoch that were sent here (every
    ///     node has sent them: it passed the count's all-reduce, so a
    ///     missing one is on its way, or its link fails); returns their
    ///     notices and the pages pushed here.
    #[allow(clippy::type_complexity)]
    fn await_releases(
        &self,
        epoch: u64,
        expected: usize,
    ) -> Result<(Vec<(u64, u32)>, Pushes, Vec<(usize, Vec<u8>)>), ReleaseError> {
        let got = {
            let mut pr = self.proto.lock().unwrap_or_else(|e| e.into_inner());
            let _w = hyfi_core::waits::waiting(
                |a| {
                    format!(
                        "the other nodes' releases (release #{}; {} of {} had come)",
                        a[0], a[1], a[2]
                    )
                },
                [epoch, pr.got as u64, expected as u64],
            );
            if pr.got < expected {
                // Not under the lock: the transport may deliver frames
                // here, whose handler takes it.
                drop(pr);
                hyfi_core::link::poll_before_sleep(|| self.got.load(Ordering::Acquire) >= expected);
                pr = self.proto.lock().unwrap_or_else(|e| e.into_inner());
            }
            while pr.got < expected {
                if let Some(f) = self.failure() {
                    return Err(ReleaseError::Failed(f.clone()));
                }
                pr = self
                    .proto_cv
                    .wait_timeout(pr, std::time::Duration::from_millis(100));
            }
            if let Some(f) = self.failure() {
                return Err(ReleaseError::Failed(f.clone()));
            }
            (
                std::mem::take(&mut pr.notices),
                std::mem::take(&mut pr.pushes),
                std::mem::take(&mut pr.carried),
            )
        };
        Ok(got)
    }

    /// 3c. On two nodes: combines this node's reductions with those the
    ///     other node's `REL` carried, node 0's first (see [`Carried`]).
    ///     Both must carry as many bytes (none when neither reduces).
    fn combine_carried(
        &self,
        phase: usize,
        carried: Option<Carried<'_>>,
        others: Vec<(usize, Vec<u8>)>,
    ) -> Result<(), ReleaseError> {
        let [(from, mut theirs)]: [(usize, Vec<u8>); 1] =
            others.try_into().expect("two nodes: one REL an epoch");
        let mine = carried.as_ref().map_or(0, |c| c.value.len());
        if theirs.len() != mine {
            return Err(ReleaseError::Carried {
                me: self.me,
                from,
                phase,
                got: theirs.len(),
                expected: mine,
            });
        }
        let Some(c) = carried else { return Ok(()) };
        if self.me < from {
            (c.combine)(c.value, &theirs);
        } else {
            (c.combine)(&mut theirs, c.value);
            c.value.copy_from_slice(&theirs);
        }
        Ok(())
    }

    /// 4. Invalidates the copies others wrote; returns how many.
    fn invalidate_noticed(
        &self,
        notices: &[(u64, u32)],
        r: &mut Round,
    ) -> Result<u64, ReleaseError> {
        let mut invalidated = 0u64;
        for &(start, len) in notices {
            for gp in start..start + len as u64 {
                let Some((seg, p)) = self.find_cached(gp, &mut r.cache) else {
                    return Err(ReleaseError::Notice(ProtocolError::UnknownPage {
                        what: "a write notice for",
                        page: gp,
                    }));
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
        Ok(invalidated)
    }

    /// 4b. The pages pushed through the all-reduce to this node (it is in
    ///     the home's copy set), to install with the pushes its `REL`s
    ///     brought, by the same rules. Each must be homed at its sender.
    fn pushed_here(
        &self,
        gathered: Vec<(usize, u64, Vec<u8>)>,
        pushes: &mut Pushes,
    ) -> Result<(), ReleaseError> {
        for (from, gp, bytes) in gathered {
            self.page_homed_at(gp, from, "a gathered push of")
                .map_err(ReleaseError::Notice)?;
            pushes.pages.push((gp, Pushed::Page(bytes)));
        }
        Ok(())
    }

    /// 5. Installs the pushed pages, unless another writer's notice names
    ///    the page (its diff may be missing from the push), or this node
    ///    declined it in this release: then the copy is dropped. A whole
    ///    page is dropped as well where this node wrote it too (it lacks
    ///    this node's bytes). The home's own writes (a diff) bring up to
    ///    date a copy that is the home's page as of the last release,
    ///    changed since only by this node's own writes (or by none), which
    ///    the home's do not touch: they apply to a copy this node wrote,
    ///    but not to one it lacks.
    fn install_pushes(
        &self,
        mut notices: Vec<(u64, u32)>,
        pushes: Pushes,
        mut invalidated: u64,
        r: &mut Round,
    ) {
        let Pushes { pages, frames } = pushes;
        // The notices of every node, as disjoint sorted page ranges: two
        // nodes' ranges may overlap (one covering pages 10..15, another
        // page 12 alone), and a search for the last range starting at or
        // before a page would then find 12..13 for page 14 and miss it.
        // That installed stale pushes (a third writer's diff missing) on
        // 13 and 16 nodes of the randomized multi-writer test.
        let spans = disjoint(&mut notices);
        let named = |gp: u64| {
            let k = spans.partition_point(|&(s, _)| s <= gp);
            k > 0 && gp < spans[k - 1].1
        };
        let mut installed = Vec::with_capacity(pages.len());
        for (gp, push) in pages {
            let (seg, p) = self
                .find_cached(gp, &mut r.cache)
                .expect("checked on arrival");
            let _m = seg.lock(p);
            let st = seg.state[p].load(Ordering::Acquire);
            let applies = match push {
                Pushed::Page(_) | Pushed::Held { .. } => r.dirty.binary_search(&gp).is_err(),
                Pushed::Diff { .. } => st >= READ,
            };
            if !applies || named(gp) || r.declined.binary_search(&gp).is_ok() {
                if st != INVALID {
                    seg.state[p].store(INVALID, Ordering::Release);
                    invalidated += 1;
                }
                continue;
            }
            let page = seg.page_ptr(p);
            match push {
                // SAFETY: a page of a live segment homed elsewhere; no
                // filament runs now, and the next phase's barrier orders
                // these bytes before its accesses.
                Pushed::Page(bytes) => unsafe { elem::copy_in(page, &bytes) },
                // SAFETY: as above; `at..at + PAGE` is the page's bytes in
                // its frame (a decoded `REL`'s push).
                Pushed::Held { frame, at } => unsafe {
                    elem::copy_in(page, &frames[frame][at..at + crate::region::PAGE])
                },
                Pushed::Diff {
                    frame,
                    at,
                    len,
                    runs,
                } => {
                    let bytes = &frames[frame][at..at + len];
                    let d = diff::Diff::parse(gp, runs, bytes).expect("checked on arrival");
                    // SAFETY: as for a whole page, and the copy is valid
                    // here (checked above).
                    unsafe { d.apply(page) }
                }
            }
            seg.state[p].store(READ | PUSHED, Ordering::Release);
            installed.push(gp);
        }
        let c = self.ctr(r.slot);
        c.invalidations.fetch_add(invalidated, Ordering::Relaxed);
        c.pushes_installed
            .fetch_add(installed.len() as u64, Ordering::Relaxed);
        *self.pushed_last.lock().unwrap_or_else(|e| e.into_inner()) = installed;
        for f in frames {
            hyfi_core::link::buffers::recycle(f);
        }
    }

    /// Pages installed in this phase are settled from now on.
    fn settle_fresh(&self) {
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
    }

    /// The next epoch: serve what waited for it; the next epoch's early
    /// releases wait for its release.
    pub(super) fn next_epoch(&self, epoch: u64) {
        let ready = {
            let mut pr = self.proto.lock().unwrap_or_else(|e| e.into_inner());
            let next = epoch + 1;
            self.completed.store(next, Ordering::Release);
            pr.got = 0;
            self.got.store(0, Ordering::Release);
            pr.bcast_expected = 0;
            pr.bcast_received = 0;
            pr.bcast_due.clear();
            // The next phase's filaments may run now: releases of the next
            // epoch that came early stay in `early` until its release.
            pr.releasing = false;
            let deferred = std::mem::take(&mut pr.deferred);
            let (ready, later): (Vec<_>, Vec<_>) = deferred.into_iter().partition(|d| d.1 <= next);
            pr.deferred = later;
            let early = std::mem::take(&mut pr.early_broadcasts);
            for (e, frame) in early {
                if e > next {
                    pr.early_broadcasts.push((e, frame));
                } else {
                    self.install_broadcast(&frame, e, &mut pr);
                }
            }
            // A reader waiting for a broadcast (`await_broadcast_of`) looks
            // again: its page may be installed, or no longer due.
            self.proto_cv.notify_all(&pr);
            ready
        };
        for (from, _, pages) in ready {
            self.serve(from, &pages);
        }
    }
}

/// What a release all-reduces on more than two nodes, as bytes: a header,
/// the count of `REL`s each node sent to each node (summed), the phase's
/// reductions (combined), and records gathered from every node
/// (concatenated in node order), each tagged with the node that wrote it:
///
/// - **write notices**: every node must know every notice, since only a
///   page's home knows who holds a copy; gathered here they take the
///   all-reduce's `log2 N` messages a node, where a `REL` carrying them to
///   every node took `N − 1` (issue 23);
/// - **pushes of pages at least half the nodes hold** (`Core::gathers`): a
///   page every node reads, written by its home each phase, reaches them
///   in the same `log2 N` messages instead of `N − 1` from its home.
///
/// The header is the lowest node the value combines (`first`), the length
/// of its reductions, and the first disagreement found on the way (two
/// nodes and their reductions' lengths, or `NONE`): nodes that name
/// different reductions get the error on every node, never a hang.
struct Gathered<'v> {
    nodes: usize,
    counts: &'v [u8],
    carried: &'v [u8],
    records: &'v [u8],
}

/// Why a gathered value cannot be read.
enum Undecodable {
    /// Node `from` carried `got` bytes of reductions, this node another count.
    Diverged { from: usize, got: usize },
    /// The records end in a piece of one (its length).
    Stray(usize),
}

/// What the all-reduce of a release brings a node: the `REL`s meant for
/// it, the other nodes' notices, and the pages pushed through it (sender,
/// page, bytes).
type Counted = (usize, Vec<(u64, u32)>, Vec<(usize, u64, Vec<u8>)>);

/// One gathered record.
enum Record<'v> {
    /// Node `writer` wrote `pages` pages from `first`.
    Notice {
        first: u64,
        pages: u32,
        writer: usize,
    },
    /// Node `writer`, its home, pushes `page` (its bytes) to its holders
    /// (a bit per node).
    Push {
        page: u64,
        writer: usize,
        holders: &'v [u8],
        bytes: &'v [u8],
    },
}

const HEAD: usize = 24;
const NONE: u32 = u32::MAX;
/// A notice record: `N`, first page (u64), pages (u32), writer (u32).
const NOTICE: usize = 17;
/// A push record: `P`, page (u64), writer (u32), the holders (a bit per
/// node, `⌈N/8⌉` bytes), the page's bytes.
fn pushed_page(nodes: usize) -> usize {
    13 + nodes.div_ceil(8) + crate::region::PAGE
}

fn word(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

impl<'v> Gathered<'v> {
    fn encode(
        me: usize,
        sent: &[u32],
        carried: &[u8],
        notices: &[(u64, u32)],
        pushes: &[(u64, Vec<u8>)],
    ) -> Vec<u8> {
        let mut v = Vec::with_capacity(
            HEAD + 4 * sent.len()
                + carried.len()
                + NOTICE * notices.len()
                + pushed_page(sent.len()) * pushes.len(),
        );
        for w in [me as u32, carried.len() as u32, NONE, 0, NONE, 0] {
            v.extend_from_slice(&w.to_le_bytes());
        }
        for c in sent {
            v.extend_from_slice(&c.to_le_bytes());
        }
        v.extend_from_slice(carried);
        for &(first, len) in notices {
            v.push(b'N');
            v.extend_from_slice(&first.to_le_bytes());
            v.extend_from_slice(&len.to_le_bytes());
            v.extend_from_slice(&(me as u32).to_le_bytes());
        }
        for (page, bytes) in pushes {
            v.push(b'P');
            v.extend_from_slice(&page.to_le_bytes());
            v.extend_from_slice(&(me as u32).to_le_bytes());
            v.extend_from_slice(bytes);
        }
        v
    }

    /// `acc ∘ other`, `acc` the lower nodes' value (the order the link's
    /// all-reduce keeps).
    fn combine<R: FnMut(&mut [u8], &[u8]) + ?Sized>(
        nodes: usize,
        acc: &mut Vec<u8>,
        other: &[u8],
        reduce: Option<&mut R>,
    ) {
        let fixed = |b: &[u8]| HEAD + 4 * nodes + word(b, 4) as usize;
        if word(acc, 8) != NONE {
            return; // diverged already: only the first disagreement counts
        }
        let mark = |acc: &mut [u8], w: [u32; 4]| {
            for (k, w) in w.into_iter().enumerate() {
                acc[8 + 4 * k..12 + 4 * k].copy_from_slice(&w.to_le_bytes());
            }
        };
        let (a, la) = (word(acc, 0), word(acc, 4));
        if other.len() < HEAD || other.len() < fixed(other) {
            // Not a value of this layout (the link checks its frames, so
            // only a broken transport sends one): a divergence of unknown
            // origin.
            mark(acc, [a, la, NONE - 1, other.len() as u32]);
            return;
        }
        if word(other, 8) != NONE {
            mark(acc, std::array::from_fn(|k| word(other, 8 + 4 * k)));
            return;
        }
        if word(other, 4) != la {
            mark(acc, [a, la, word(other, 0), word(other, 4)]);
            return;
        }
        let end = fixed(acc);
        let (head, rest) = acc.split_at_mut(HEAD + 4 * nodes);
        for (a, b) in head[HEAD..]
            .chunks_exact_mut(4)
            .zip(other[HEAD..HEAD + 4 * nodes].chunks_exact(4))
        {
            let s = u32::from_le_bytes(a.try_into().expect("4 bytes"))
                + u32::from_le_bytes(b.try_into().expect("4 bytes"));
            a.copy_from_slice(&s.to_le_bytes());
        }
        if let Some(reduce) = reduce {
            reduce(
                &mut rest[..end - HEAD - 4 * nodes],
                &other[HEAD + 4 * nodes..end],
            );
        }
        acc.extend_from_slice(&other[end..]);
    }

    fn decode(nodes: usize, v: &'v [u8], mine: usize) -> Result<Gathered<'v>, Undecodable> {
        let end = HEAD + 4 * nodes + mine;
        if v.len() < end {
            // Only a broken transport shortens a value (see `combine`).
            return Err(Undecodable::Stray(v.len()));
        }
        if word(v, 8) != NONE {
            let (a, la) = (word(v, 8) as usize, word(v, 12) as usize);
            let (b, lb) = (word(v, 16) as usize, word(v, 20) as usize);
            return Err(if la != mine {
                Undecodable::Diverged { from: a, got: la }
            } else {
                Undecodable::Diverged { from: b, got: lb }
            });
        }
        Ok(Gathered {
            nodes,
            counts: &v[HEAD..HEAD + 4 * nodes],
            carried: &v[HEAD + 4 * nodes..end],
            records: &v[end..],
        })
    }

    /// The `REL`s sent to node `q`.
    fn count(&self, q: usize) -> usize {
        word(self.counts, 4 * q) as usize
    }

    /// Every node's records, in node order; `Err(len)` where the bytes
    /// left are not a record.
    fn records(&self) -> impl Iterator<Item = Result<Record<'v>, usize>> {
        let mut rest = self.records;
        let (push_len, map) = (pushed_page(self.nodes), self.nodes.div_ceil(8));
        std::iter::from_fn(move || {
            let (&kind, body) = rest.split_first()?;
            let len = match kind {
                b'N' => NOTICE,
                b'P' => push_len,
                _ => 0,
            };
            if len == 0 || rest.len() < len {
                let left = rest.len();
                rest = &[];
                return Some(Err(left));
            }
            let page = u64::from_le_bytes(body[..8].try_into().expect("8 bytes"));
            let rec = if kind == b'N' {
                Record::Notice {
                    first: page,
                    pages: word(body, 8),
                    writer: word(body, 12) as usize,
                }
            } else {
                Record::Push {
                    page,
                    writer: word(body, 8) as usize,
                    holders: &body[12..12 + map],
                    bytes: &body[12 + map..len - 1],
                }
            };
            rest = &rest[len..];
            Some(Ok(rec))
        })
    }
}

/// Page ranges `(first, count)` as sorted disjoint `(first, end)` spans.
fn disjoint(ranges: &mut [(u64, u32)]) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for &(s, n) in ranges.iter() {
        let e = s + u64::from(n);
        match out.last_mut() {
            Some((_, end)) if s <= *end => *end = (*end).max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::disjoint;

    #[test]
    fn overlapping_notice_ranges_merge_into_disjoint_spans() {
        // Node A noticed pages 10..15, node B page 12, node C pages 15..17
        // (adjacent to A's), node D page 30.
        let mut r = vec![(12, 1), (30, 1), (10, 5), (15, 2)];
        assert_eq!(disjoint(&mut r), vec![(10, 17), (30, 31)]);
        let spans = disjoint(&mut [(10, 5), (12, 1)]);
        // Page 14 is named (by A), though B's range starts later.
        let k = spans.partition_point(|&(s, _)| s <= 14);
        assert!(k > 0 && 14 < spans[k - 1].1);
    }
}
