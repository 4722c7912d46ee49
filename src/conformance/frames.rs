//! Checks 4 and 5: frames of every size in both classes, each node to each
//! other; and a control message overtaking bulk messages queued before it.
//!
//! A frame's bytes are a pattern of its key (the seed, sender, receiver,
//! class and place in the sequence): word `i` is `(i + 1) · φ ⊕ key`
//! (φ = 0x9e37…, odd), so every 8-byte word of every frame differs from
//! every other, and a frame displaced, cut, or with a piece of another in
//! it fails the comparison at the first byte that moved.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::service::{ix, service_of, Expect, State, Suite};
use super::{agree, hash, Summary, WAIT_BOUND};
use crate::layers::link::Class;
use crate::layers::NodeLink;

/// Check 4's word in the plan.
const CHECK: u64 = 4;
/// Check 5's word in the plan.
const OVERTAKE: u64 = 5;

/// Sizes of the bulk frames each node sends each other node: empty, one
/// byte, around a page, a page and a bit, around the MPI transport's piece
/// boundaries (two pieces of 4 000 bytes, three, the longest frame sent in
/// pieces), 1 MiB, and 64 MiB, the largest frame a transport must carry
/// (hyfi-net's frame limit).
const BULK_SIZES: [usize; 11] = [
    0,
    1,
    4095,
    4096,
    4097,
    8000,
    8001,
    65536,
    65536 + 3,
    1 << 20,
    64 << 20,
];
/// Sizes of the control frames: control messages are small by contract.
const CONTROL_SIZES: [usize; 8] = [0, 1, 4095, 4096, 4097, 8001, 65536, 65536 + 3];
/// Frames of each class of a size from the seed (below 256 KiB), after
/// the fixed ones.
const EXTRA: u64 = 3;

/// Check 5: bulk messages queued before the control message.
const QUEUED: usize = 48;
/// Their size.
const QUEUED_SIZE: usize = 1 << 20;
/// The control message's size.
const CONTROL_LEN: usize = 64;
/// How long node 1's delivery thread stalls on the first bulk message:
/// far longer than node 0 takes to queue the rest (tens of ms), far
/// shorter than the time after which a transport takes a silent peer for
/// stopped (5 s by default, `HYFI_HEARTBEAT`).
const STALL: Duration = Duration::from_secs(1);

/// The frames each node sends each other node: their sizes by class
/// (index: [`ix`]), and the key of their pattern.
pub(super) struct Plan {
    seed: u64,
    sizes: [Vec<usize>; 2],
}

impl Plan {
    fn frames(seed: u64) -> Plan {
        let extra =
            |c: u64, max: u64| (0..EXTRA).map(move |k| (hash(&[seed, CHECK, c, k]) % max) as usize);
        let mut control = CONTROL_SIZES.to_vec();
        control.extend(extra(0, 256 << 10));
        let mut bulk = BULK_SIZES.to_vec();
        bulk.extend(extra(1, 256 << 10));
        Plan {
            seed: hash(&[seed, CHECK]),
            sizes: [control, bulk],
        }
    }

    fn key(&self, from: usize, to: usize, c: Class, k: usize) -> u64 {
        hash(&[self.seed, from as u64, to as u64, ix(c) as u64, k as u64])
    }

    fn count(&self, c: Class) -> usize {
        self.sizes[ix(c)].len()
    }

    /// Checks frame `k` of class `c` from `from` to `to` against the plan.
    pub fn check(
        &self,
        from: usize,
        to: usize,
        c: Class,
        k: usize,
        payload: &[u8],
    ) -> Result<(), String> {
        let Some(&len) = self.sizes[ix(c)].get(k) else {
            return Err(format!(
                "node {from} sent {c:?} frame #{k} ({} bytes), more than the {} it was to send",
                payload.len(),
                self.count(c)
            ));
        };
        if payload.len() != len {
            return Err(format!(
                "{c:?} frame #{k} from node {from} has {} bytes where node {from} sent {len}: \
                 frames of one class were lost, cut, duplicated or reordered",
                payload.len()
            ));
        }
        match first_difference(payload, self.key(from, to, c, k)) {
            None => Ok(()),
            Some(at) => Err(format!(
                "{c:?} frame #{k} from node {from} ({len} bytes) differs from what node {from} \
                 sent from byte {at} on"
            )),
        }
    }
}

/// Word `i` of the pattern of `key`.
fn word(key: u64, i: usize) -> u64 {
    (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ key
}

/// Appends `len` bytes of `key`'s pattern to `buf`; returns their digest.
fn fill(buf: &mut Vec<u8>, key: u64, len: usize) -> u64 {
    let start = buf.len();
    buf.resize(start + len, 0);
    for (i, chunk) in buf[start..].chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&word(key, i).to_le_bytes()[..chunk.len()]);
    }
    digest(&buf[start..])
}

/// The first byte of `payload` that is not `key`'s pattern.
fn first_difference(payload: &[u8], key: u64) -> Option<usize> {
    let bad = payload
        .chunks(8)
        .enumerate()
        .position(|(i, chunk)| *chunk != word(key, i).to_le_bytes()[..chunk.len()])?;
    let want = word(key, bad).to_le_bytes();
    let chunk = &payload[8 * bad..];
    Some(
        8 * bad
            + chunk
                .iter()
                .zip(want)
                .position(|(a, b)| *a != b)
                .unwrap_or(0),
    )
}

/// A digest of `bytes` (FNV-1a over 64-bit words, and the length).
pub(super) fn digest(bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ bytes.len() as u64;
    for chunk in bytes.chunks(8) {
        let mut w = [0u8; 8];
        w[..chunk.len()].copy_from_slice(chunk);
        h = (h ^ u64::from_le_bytes(w)).wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// A receiver's reply to frame `k` of class `c`: `len` bytes came, with
/// this digest.
pub(super) fn reply(c: Class, k: usize, len: usize, digest: u64) -> [u8; 32] {
    let mut r = [0u8; 32];
    for (i, w) in [ix(c) as u64, k as u64, len as u64, digest]
        .iter()
        .enumerate()
    {
        r[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
    }
    r
}

/// What [`reply`] made.
pub(super) fn parse_reply(r: &[u8]) -> Option<(Class, usize, usize, u64)> {
    if r.len() != 32 {
        return None;
    }
    let w = |i: usize| u64::from_le_bytes(r[8 * i..8 * i + 8].try_into().unwrap());
    let c = match w(0) {
        0 => Class::Control,
        1 => Class::Bulk,
        _ => return None,
    };
    Some((c, w(1) as usize, w(2) as usize, w(3)))
}

/// Sends frame `k` of class `c` to node `to`; returns its size. Even
/// frames go by `Port::send_with` (filled in the transport's buffer), odd
/// ones by `Port::send_vec` (built whole first, as the page server's
/// replies are): both of a transport's ways of sending are checked alike.
fn send(suite: &Suite, plan: &Plan, to: usize, c: Class, k: usize) -> Result<usize, String> {
    let me = suite.me;
    let (key, len) = (plan.key(me, to, c, k), plan.sizes[ix(c)][k]);
    let sent = if k % 2 == 0 {
        let mut fill_in = |buf: &mut Vec<u8>| {
            let d = fill(buf, key, len);
            suite.record_sent(to, c, d);
        };
        suite
            .port
            .send_with(to, service_of(c), c, len, &mut fill_in)
    } else {
        let mut frame = Vec::with_capacity(len);
        let d = fill(&mut frame, key, len);
        suite.record_sent(to, c, d);
        suite.port.send_vec(to, service_of(c), c, frame)
    };
    sent.map_err(|e| {
        format!("node {me}: sending {c:?} frame #{k} ({len} bytes) to node {to}: {e}")
    })?;
    Ok(len)
}

/// The order of one node's frames to another: the classes interleaved at
/// random, each in its own order.
fn order(plan: &Plan) -> Vec<(Class, usize)> {
    let (nc, nb) = (plan.count(Class::Control), plan.count(Class::Bulk));
    let (mut k, mut out) = ([0usize; 2], Vec::new());
    while k[0] < nc || k[1] < nb {
        let coin = hash(&[plan.seed, 9, out.len() as u64]) % 2 == 0;
        let c = if k[1] >= nb || (k[0] < nc && coin) {
            Class::Control
        } else {
            Class::Bulk
        };
        out.push((c, k[ix(c)]));
        k[ix(c)] += 1;
    }
    out
}

/// Every other node's frames and replies are in, or a node whose program
/// ended left some out (the transport lost them: they came before its
/// goodbye, or never).
fn frames_in(st: &State, me: usize, want: [usize; 2]) -> bool {
    let mut peers = (0..st.got.len()).filter(|&q| q != me);
    peers
        .clone()
        .all(|q| st.got[q] == want && st.replies[q] == want)
        || peers.any(|q| st.left[q] && st.got[q] != want)
}

/// What [`frames_in`] still waits for.
fn frames_missing(st: &State, me: usize, want: [usize; 2]) -> String {
    let late: Vec<String> = (0..st.got.len())
        .filter(|&q| q != me && (st.got[q] != want || st.replies[q] != want))
        .map(|q| {
            let ended = if st.left[q] {
                " (its program ended)"
            } else {
                ""
            };
            format!(
                "node {q}{ended}: {:?} of its {want:?} frames (control, bulk) received, replies \
                 from it to {:?}",
                st.got[q], st.replies[q]
            )
        })
        .collect();
    format!("frames or replies missing: {}", late.join("; "))
}

/// Runs check 4 on this node (see the module docs).
pub(super) fn check(
    link: &Arc<dyn NodeLink>,
    suite: &Suite,
    seed: u64,
    s: &mut Summary,
) -> Result<(), String> {
    let (me, n) = (suite.me, suite.nodes);
    let plan = Arc::new(Plan::frames(seed));
    suite.expect(Expect::Frames(plan.clone()));
    link.barrier()
        .map_err(|e| format!("node {me}: the barrier before the frames failed: {e}"))?;
    let deadline = Instant::now() + WAIT_BOUND;
    let want = [plan.count(Class::Control), plan.count(Class::Bulk)];
    let mut mine = Ok(0);
    'send: for (c, k) in order(&plan) {
        for p in 1..n {
            let to = (me + p) % n;
            match send(suite, &plan, to, c, k) {
                Ok(len) => {
                    s.frames_sent += 1;
                    s.frame_bytes += len as u64;
                }
                Err(e) => {
                    mine = Err(e);
                    break 'send;
                }
            }
        }
    }
    let peers = || (0..n).filter(move |&q| q != me);
    if mine.is_ok() {
        let done = |st: &State| frames_in(st, me, want);
        let missing = |st: &State| frames_missing(st, me, want);
        mine = suite.wait(deadline, done, missing).map(|()| 0);
    }
    {
        let st = suite.lock();
        s.frames_received += st.got.iter().map(|g| (g[0] + g[1]) as u64).sum::<u64>();
        if let Some(q) = peers().find(|&q| st.got[q] != want) {
            mine = mine.and(Err(format!(
                "node {me}: node {q}'s program ended after {:?} of its {want:?} frames (control, \
                 bulk) arrived",
                st.got[q]
            )));
        }
        if let Some(e) = st.errors.first() {
            mine = mine.and(Err(format!(
                "{e} ({} error(s) on this node)",
                st.errors.len()
            )));
        }
    }
    agree(link, "frames of every size", mine).map(drop)
}

/// Runs check 5 (see the module docs and [`STALL`]). Deterministic enough:
/// node 0 queues its 48 MiB within tens of milliseconds of the first
/// frame, which node 1's delivery thread then holds for a second, so when
/// the control message is sent the bulk messages behind the first are
/// still queued at node 0 (or in the kernel's socket buffers, a few MiB at
/// most), not yet moving; a transport that keeps the classes in one queue
/// delivers it last.
pub(super) fn overtaking(
    link: &Arc<dyn NodeLink>,
    suite: &Suite,
    seed: u64,
    s: &mut Summary,
) -> Result<(), String> {
    let me = suite.me;
    let plan = Arc::new(Plan {
        seed: hash(&[seed, OVERTAKE]),
        sizes: [vec![CONTROL_LEN], vec![QUEUED_SIZE; QUEUED]],
    });
    suite.expect(Expect::Overtake {
        plan: plan.clone(),
        stall: STALL,
    });
    link.barrier()
        .map_err(|e| format!("node {me}: the barrier before the overtaking check failed: {e}"))?;
    let mine = match me {
        0 => (0..QUEUED)
            .map(|k| (Class::Bulk, k))
            .chain([(Class::Control, 0)])
            .try_for_each(|(c, k)| send(suite, &plan, 1, c, k).map(drop))
            .map(|()| 0),
        1 => overtaken(suite),
        _ => Ok(0),
    };
    s.overtaken += agree(link, "control overtaking queued bulk", mine)?;
    Ok(())
}

/// Node 1's side of check 5: how many bulk messages node 0's control
/// message overtook (at least one), once all arrived. The bulk ones came
/// in order: each was checked against the pattern of its place.
fn overtaken(suite: &Suite) -> Result<u64, String> {
    let all = QUEUED + 1;
    suite.wait(
        Instant::now() + WAIT_BOUND,
        |st| st.arrivals.len() == all || st.left[0],
        |st| format!("{} of node 0's {all} messages arrived", st.arrivals.len()),
    )?;
    let st = suite.lock();
    if let Some(e) = st.errors.first() {
        return Err(e.clone());
    }
    if st.arrivals.len() != all {
        return Err(format!(
            "node 1: node 0's program ended after {} of its {all} messages arrived",
            st.arrivals.len()
        ));
    }
    let at = st.arrivals.iter().position(|(c, _)| *c == Class::Control);
    match at.map(|at| all - at - 1) {
        Some(0) => Err(format!(
            "node 1: node 0's control message arrived after the {QUEUED} bulk messages queued \
             before it: it waited behind bulk messages that had not started moving, where \
             control must overtake them"
        )),
        Some(overtaken) => Ok(overtaken as u64),
        None => Err("node 1: node 0's control message never arrived".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_is_its_pattern_and_a_moved_byte_is_found() {
        let plan = Plan::frames(3);
        for (c, k) in order(&plan) {
            let mut buf = Vec::new();
            let len = plan.sizes[ix(c)][k];
            let d = fill(&mut buf, plan.key(0, 1, c, k), len.min(70_000));
            assert_eq!(d, digest(&buf));
            if len <= 70_000 {
                assert_eq!(plan.check(0, 1, c, k, &buf), Ok(()));
                // From another sender, or another place, it is not.
                if len > 0 {
                    assert!(plan.check(2, 1, c, k, &buf).is_err());
                }
            }
        }
        let key = plan.key(0, 1, Class::Bulk, 2);
        let mut buf = Vec::new();
        fill(&mut buf, key, 4095);
        buf[1234] ^= 1;
        assert_eq!(first_difference(&buf, key), Some(1234));
    }

    #[test]
    fn replies_round_trip_and_the_order_keeps_each_class_in_order() {
        let r = reply(Class::Bulk, 7, 4097, 0xabc);
        assert_eq!(parse_reply(&r), Some((Class::Bulk, 7, 4097, 0xabc)));
        let plan = Plan::frames(1);
        let o = order(&plan);
        for c in [Class::Control, Class::Bulk] {
            let ks: Vec<usize> = o.iter().filter(|(x, _)| *x == c).map(|(_, k)| *k).collect();
            assert_eq!(ks, (0..plan.count(c)).collect::<Vec<_>>());
        }
    }
}
