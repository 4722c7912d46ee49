//! Broadcasts: between phases, a home sends pages that every node will
//! read in the next phase to all of them at once, along a binomial tree,
//! so that no node requests them from a home that computes (LU's pivot
//! row; see the README).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use hyfi_core::link::Class;

use super::msg::{Broadcast, PagesFrame, REPLY_BATCH};
use super::page_table::{Meta, Segment, INVALID, PENDING, READ, WRITE};
use super::release::Proto;
use super::Core;
use crate::elem;
use crate::error::ProtocolError;

/// How long a release waits for broadcasts it expects before it fails
/// the node: their homes did not call `broadcast_rows` (a program that is
/// not SPMD). A lost home fails the node at once, through the link.
pub(super) const MISSING_AFTER: Duration = Duration::from_secs(30);

/// How long an access outside a filthread (a read, or a write) waits for
/// a page its node expects by broadcast before it requests the page
/// ([`Core::await_broadcast_of`]): the broadcast leaves its home's
/// post-phase code about when this node's does, and takes microseconds;
/// a home that broadcasts late (or a program that is not SPMD) costs
/// each such access this long, once per page and epoch, and then the
/// request it would have made at once.
pub(super) const BROADCAST_WAIT: Duration = Duration::from_micros(500);

impl Core {
    /// Broadcasts the pages `lo..=hi` of `seg` that are homed here to every
    /// other node, and expects those homed elsewhere. Called between
    /// phases (the caller holds the post-phase context), on every node
    /// alike; a node sends only its own pages.
    pub(crate) fn broadcast(&self, seg: &Segment, lo: usize, hi: usize) {
        if self.nodes < 2 || lo > hi {
            return;
        }
        // The messages the other homes send this node: one per home and
        // batch of its pages, as they chunk them below.
        let mut per_home = vec![0usize; self.nodes];
        for p in lo..=hi {
            per_home[seg.homes[p] as usize] += 1;
        }
        let expected: u64 = (0..self.nodes)
            .filter(|&h| h != self.me)
            .map(|h| per_home[h].div_ceil(REPLY_BATCH) as u64)
            .sum();
        {
            let mut pr = self.proto.lock().unwrap_or_else(|e| e.into_inner());
            pr.bcast_expected += expected;
            for p in (lo..=hi).filter(|&p| seg.homes[p] as usize != self.me) {
                pr.bcast_due.insert(seg.first + p as u64);
            }
        }
        let mine: Vec<usize> = (lo..=hi)
            .filter(|&p| seg.homes[p] as usize == self.me)
            .collect();
        let epoch = self.completed.load(Ordering::Acquire);
        let slot = self.slot();
        for chunk in mine.chunks(REPLY_BATCH) {
            let mut frame =
                PagesFrame::broadcast(epoch, self.me as u32, self.nodes as u32, chunk.len());
            for &p in chunk {
                let mut m = seg.lock(p);
                self.held_everywhere(seg, p, &mut m);
                // SAFETY: a page of a live segment homed here, copied
                // between phases: no filament runs, so nothing stores into
                // it (and no view of it is alive: views end with their
                // phase).
                frame.push(seg.first + p as u64, |b| unsafe {
                    elem::copy_out(seg.page_ptr(p), b)
                });
            }
            let n = frame.pages() as u64;
            self.pass_on(self.me, self.nodes, frame.finish(), n, slot);
        }
    }

    /// Sends a broadcast frame on to this node's children in the binomial
    /// tree rooted at `root`, where this node covers `span` nodes
    /// ([`children`]). `n`: the frame's pages, counted per child.
    fn pass_on(&self, root: usize, span: usize, frame: Vec<u8>, n: u64, slot: usize) {
        let rel = (self.me + self.nodes - root) % self.nodes;
        let edges: Vec<_> = children(rel, span).collect();
        let last = edges.len().saturating_sub(1);
        let mut frame = Some(frame);
        for (k, &(child, child_span)) in edges.iter().enumerate() {
            // The last child gets the frame itself.
            let f = if k == last {
                frame.take()
            } else {
                frame.clone()
            };
            let mut f = f.expect("the frame is there until the last child");
            Broadcast::set_span(&mut f, child_span as u32);
            self.send_frame((root + child) % self.nodes, slot, Class::Bulk, f);
            self.ctr(slot)
                .pages_broadcast
                .fetch_add(n, Ordering::Relaxed);
        }
    }

    pub(super) fn on_broadcast(&self, frame: Vec<u8>) -> Result<(), ProtocolError> {
        let b = Broadcast::decode(&frame)?;
        let (root, span) = (b.root as usize, b.span as usize);
        if root >= self.nodes
            || root == self.me
            || span == 0
            || (self.me + self.nodes - root) % self.nodes + span > self.nodes
        {
            return Err(ProtocolError::BadBroadcast {
                root,
                span,
                nodes: self.nodes,
            });
        }
        for (gp, _) in b.pages.iter() {
            self.page_homed_at(gp, root, "a broadcast of")?;
        }
        let epoch = b.epoch;
        let n = b.pages.iter().len() as u64;
        if span > 1 {
            // Passed on before it is installed here: the subtree waits for
            // nothing this node does (the frame is kept for the install).
            self.pass_on(root, span, frame.clone(), n, self.procs);
        }
        self.ctr(self.procs)
            .broadcasts_received
            .fetch_add(1, Ordering::Relaxed);
        let mut pr = self.proto.lock().unwrap_or_else(|e| e.into_inner());
        if epoch > self.completed.load(Ordering::Acquire) {
            // The root is a release ahead (this node is still in it):
            // installed, and counted as expected, when this node's release
            // is done.
            pr.early_broadcasts.push((epoch, frame));
            return Ok(());
        }
        self.install_broadcast(&frame, epoch, &mut pr);
        self.proto_cv.notify_all(&pr);
        Ok(())
    }

    /// Counts a broadcast of this node's epoch as received, and installs its
    /// pages if the node is not in a release: a page not valid here is installed, and a
    /// page requested here meanwhile (a filament faulted on it before the
    /// broadcast came) is installed and its waiters woken, the reply still
    /// due dropped when it comes. Called under the protocol lock, which
    /// orders it with the epoch's change.
    pub(super) fn install_broadcast(&self, frame: &[u8], epoch: u64, pr: &mut Proto) {
        let now = self.completed.load(Ordering::Acquire);
        // One of the broadcasts this node's next release waits for.
        pr.bcast_received += u64::from(epoch == now);
        let b = Broadcast::decode(frame).expect("checked when it came");
        if epoch == now {
            // Come, installed or not: a reader waiting for one of its
            // pages stops waiting (and requests it if it is not valid).
            for (gp, _) in b.pages.iter() {
                pr.bcast_due.remove(&gp);
            }
        }
        if epoch != now || pr.releasing {
            // Older than what this node's release brings or brought (the
            // page's copy may be invalidated or replaced by it): dropped;
            // the page is fetched if it is read.
            self.ctr(self.procs)
                .broadcasts_dropped
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut installed = 0u64;
        for (gp, bytes) in b.pages.iter() {
            let (seg, p) = self.find(gp).expect("checked when it came");
            installed += u64::from(self.install_copy(&seg, p, bytes));
        }
        self.ctr(self.procs)
            .broadcasts_installed
            .fetch_add(installed, Ordering::Relaxed);
    }

    /// Waits, outside a filthread, for at most `bound` ([`BROADCAST_WAIT`]
    /// from `ensure`), until the pages of `lo..=hi` of `seg` missing here
    /// are installed by the broadcast of this epoch that they are due by;
    /// whether it waited. A read right after `broadcast_rows` (post-phase
    /// code copying the row every node needs) would otherwise request the
    /// page before the broadcast comes, from a home that has started
    /// computing, and pay a round trip the broadcast was there to spare.
    /// It waits only if every missing page is due by broadcast: otherwise
    /// the requests leave now, for those pages too (a reader takes
    /// whichever of a broadcast and a reply comes first). A filthread
    /// requests at once (it suspends, and its processor runs other
    /// filaments meanwhile).
    pub(super) fn await_broadcast_of(
        &self,
        seg: &Segment,
        lo: usize,
        hi: usize,
        bound: Duration,
    ) -> bool {
        let missing = |p: usize| seg.state[p].load(Ordering::Acquire) == INVALID;
        let due_by_broadcast =
            |pr: &Proto, p: usize| pr.bcast_due.contains(&(seg.first + p as u64));
        // Most faults (a write to a page valid here) take no lock.
        if !(lo..=hi).any(missing) {
            return false;
        }
        let due: Vec<usize> = {
            let pr = self.proto.lock().unwrap_or_else(|e| e.into_inner());
            if pr.bcast_due.is_empty() {
                return false;
            }
            let due: Vec<usize> = (lo..=hi).filter(|&p| missing(p)).collect();
            if !due.iter().all(|&p| due_by_broadcast(&pr, p)) {
                return false;
            }
            due
        };
        // Installed (a broadcast installs under the page's lock and then
        // notifies `proto_cv` under the protocol lock).
        let come = || !due.iter().any(|&p| missing(p));
        let deadline = Instant::now() + bound;
        // As a release waits for the others' `REL`s: what the transport
        // holds back goes first, then a node that owns its CPU polls
        // (reading the transport: no bell needed), and only then sleeps.
        if hyfi_core::link::poll_before_sleep(|| come() || Instant::now() >= deadline) {
            return true;
        }
        let mut pr = self.proto.lock().unwrap_or_else(|e| e.into_inner());
        // Also over once the broadcast came and was not installed (it
        // came while this node released: the page is fetched).
        while !come() && due.iter().any(|&p| due_by_broadcast(&pr, p)) && self.failure().is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            pr = self.proto_cv.wait_timeout(pr, left);
        }
        true
    }

    /// Records that every node holds page `p` of `seg`, homed here, from
    /// now on (its lock `m` held): the home's next write faults and goes
    /// to them at the release, as for pages it served.
    fn held_everywhere(&self, seg: &Segment, p: usize, m: &mut Meta) {
        for q in (0..self.nodes).filter(|&q| q != self.me) {
            m.copies.insert(q);
        }
        if seg.state[p].load(Ordering::Acquire) == WRITE {
            seg.state[p].store(READ, Ordering::Release);
        }
    }

    /// Installs `bytes` as this node's copy of page `p` of `seg` (homed
    /// elsewhere), unless it is valid here already (pushed at the release,
    /// or sent before: the same bytes); a page requested here meanwhile is
    /// installed and its waiters woken, the reply still due dropped when it
    /// comes. Between phases or outside a release. Returns whether it
    /// installed it.
    fn install_copy(&self, seg: &Segment, p: usize, bytes: &[u8]) -> bool {
        let waiters = {
            let mut m = seg.lock(p);
            let st = seg.state[p].load(Ordering::Acquire);
            if st != INVALID && st != PENDING {
                return false;
            }
            // SAFETY: not valid here (INVALID or PENDING), and its lock is
            // held.
            unsafe { self.install_fresh(seg, p, bytes) };
            if st == PENDING {
                // The request's reply is still due; its waiters keep their
                // outstanding counts until it comes.
                m.reply_due = true;
            }
            std::mem::take(&mut m.waiters)
        };
        for w in waiters {
            w.wake();
        }
        true
    }
}

/// Where a carried row's header ends: a presence byte, then its first
/// global page (u64); its pages' bytes follow.
pub(crate) const CARRY_HEADER: usize = 1 + 8;

/// The largest matrix (bytes) whose carried rows' pages
/// [`Core::prepare_carried`] maps in advance.
pub(crate) const CARRIED_PREPARED: usize = 16 << 20;

impl Core {
    /// Maps in advance the pages of `seg` (a matrix whose rows ride with a
    /// reduction at each phase's end) that this node does not home, if the
    /// matrix is at most [`CARRIED_PREPARED`] bytes, so that installing a
    /// carried row takes no first-touch page fault on its step's critical
    /// path. LU's pivot row, installed on every node but its home at every
    /// step, took one per page (1.2-1.5 us measured alone on a virtual
    /// machine, more in the run): LU 2x1 in one binary with and without it,
    /// 512 0.0076 -> 0.0068 s, 1024 0.0429 -> 0.0413 s. Not for larger
    /// matrices: at 2048 (32 MiB) the same made the run 10% slower (15
    /// alternated rounds), its memory-bound steps' compute 15-25% slower
    /// with the replica's pages resident and cold (the same with the pages
    /// written one by one instead), where a step's fault is a small part of
    /// its time anyway (BENCHMARKS.md). Each chosen row ends up on every
    /// node, so a factorization holds the whole matrix everywhere by its
    /// end; this only does it sooner. A kernel without `MADV_POPULATE_WRITE`
    /// (before 5.14) takes the faults as they come. Nothing changes a byte:
    /// pages already there are left as they are, the others come in as the
    /// zeros they would read.
    pub(crate) fn prepare_carried(&self, seg: &Segment) {
        let bytes = seg.pages() * crate::region::PAGE;
        if self.nodes < 2 || bytes == 0 || bytes > CARRIED_PREPARED {
            return;
        }
        // SAFETY: the segment's pages lie in the region's mapping;
        // populating maps the missing ones (as zeros, as a first touch
        // would) and leaves every byte of the others as it is.
        unsafe {
            libc::madvise(seg.base.cast(), bytes, libc::MADV_POPULATE_WRITE);
        }
    }

    /// Offers pages `lo..=hi` of `seg` to ride with a reduction at the
    /// phase's end ([`hyfi_core::layer::Payload`]): if this node is their
    /// home, `out` gets the header and their bytes; otherwise it stays
    /// zero (absent). Called at the phase's end, before the release: only
    /// the home writes a row it offers (a page another node wrote is
    /// noticed in the release and not installed, see `take_carried`).
    pub(crate) fn offer_carried(&self, seg: &Segment, lo: usize, hi: usize, out: &mut [u8]) {
        if (lo..=hi).any(|p| seg.homes[p] as usize != self.me) {
            return;
        }
        out[0] = 1;
        out[1..CARRY_HEADER].copy_from_slice(&(seg.first + lo as u64).to_le_bytes());
        let mut bytes = Vec::with_capacity((hi - lo + 1) * crate::region::PAGE);
        for p in lo..=hi {
            // SAFETY: a page of a live segment homed here, copied between
            // phases: no filament runs, so nothing stores into it.
            unsafe { elem::copy_out(seg.page_ptr(p), &mut bytes) };
        }
        out[CARRY_HEADER..CARRY_HEADER + bytes.len()].copy_from_slice(&bytes);
    }

    /// Takes the pages `lo..=hi` of `seg` that rode with the result of a
    /// reduction at the phase's end (`bytes`: what `offer_carried` made on
    /// their home), after the release, before the post-phase code. The
    /// home adds every node to their copy sets (each holds them now, so
    /// the home's next write goes to them); every other node installs
    /// those not valid here. Nothing happens, on every node alike, if no
    /// home offered them (absent, or other pages than `lo..=hi`: the
    /// combine did not pick an input) or another node wrote one in the
    /// phase (noticed in the release: the bytes offered before it are not
    /// the page's): the pages are fetched if read.
    pub(crate) fn take_carried(&self, seg: &Segment, lo: usize, hi: usize, bytes: &[u8]) {
        let first = u64::from_le_bytes(bytes[1..CARRY_HEADER].try_into().expect("8 bytes"));
        if self.nodes < 2 || bytes[0] != 1 || first != seg.first + lo as u64 {
            return;
        }
        let (g0, g1) = (seg.first + lo as u64, seg.first + hi as u64);
        {
            let pr = self.proto.lock().unwrap_or_else(|e| e.into_inner());
            if pr
                .noticed
                .iter()
                .any(|&(s, n)| s <= g1 && g0 < s + u64::from(n))
            {
                return;
            }
        }
        let mut installed = 0u64;
        for p in lo..=hi {
            if seg.homes[p] as usize == self.me {
                self.held_everywhere(seg, p, &mut seg.lock(p));
            } else {
                let at = CARRY_HEADER + (p - lo) * crate::region::PAGE;
                let page = &bytes[at..at + crate::region::PAGE];
                installed += u64::from(self.install_copy(seg, p, page));
            }
        }
        self.ctr(self.procs)
            .pages_carried
            .fetch_add(installed, Ordering::Relaxed);
    }
}

/// A binomial tree's edges from the node at relative place `rel` (the
/// root's is 0), which covers the `span` places `rel..rel + span`: for each
/// power of two `m` below the span, largest first, the child at `rel + m`
/// covers the rest of the span from there, and the node keeps the first
/// `m`. Each place below `rel + span` is reached once, in at most
/// ⌈log₂ span⌉ steps from the root.
pub(super) fn children(rel: usize, span: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut s = span;
    std::iter::from_fn(move || {
        (s > 1).then(|| {
            let m = s.next_power_of_two() / 2;
            let edge = (rel + m, s - m);
            s = m;
            edge
        })
    })
}

#[cfg(test)]
mod tests {
    use super::children;

    /// Every node of a job of 1 to 300 nodes is reached once, within
    /// ⌈log₂ N⌉ hops of the root, and each node sends at most that many
    /// messages.
    #[test]
    fn the_tree_reaches_every_node_once_in_log_depth() {
        for nodes in 1..=300usize {
            let mut depth = vec![usize::MAX; nodes];
            depth[0] = 0;
            let mut todo = vec![(0usize, nodes)];
            while let Some((rel, span)) = todo.pop() {
                let kids: Vec<_> = children(rel, span).collect();
                assert!(kids.len() <= nodes.next_power_of_two().ilog2() as usize);
                for (c, s) in kids {
                    assert!(
                        c < nodes && c + s <= rel + span,
                        "{nodes}: {rel}+{span} -> {c}+{s}"
                    );
                    assert_eq!(depth[c], usize::MAX, "{nodes}: node {c} reached twice");
                    depth[c] = depth[rel] + 1;
                    todo.push((c, s));
                }
            }
            let max = *depth.iter().max().unwrap();
            assert!(max != usize::MAX, "{nodes}: a node not reached");
            assert!(
                max <= nodes.next_power_of_two().ilog2() as usize,
                "{nodes} nodes: depth {max}"
            );
        }
    }
}
