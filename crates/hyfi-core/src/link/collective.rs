//! Barrier and all-reduce, written once over the node seam: the
//! cross-node step of hierarchical reductions (paper §3.4) and the end of
//! a phase, for every transport.
//!
//! # The algorithm, and why its order is fixed
//!
//! [`allreduce`] combines one value per node as a binomial tree over the
//! ranks. Up the tree, node *r* combines its children's values into its own
//! in a fixed order (`acc = combine(acc, child)` for children `r+1, r+2,
//! r+4, ...`), then sends the result to its parent; node 0 ends with the
//! combination of every node's value and sends it back down the same tree.
//! `log2(N)` message latencies each way.
//!
//! When N is a power of two, the same combination is computed by recursive
//! doubling instead: at stage `m = 1, 2, 4, ...` node *r* exchanges its
//! value with node `r ^ m`, and both compute `combine(lower, upper)` (the
//! value of the lower-numbered group as the accumulator). That is the
//! binomial tree's association, `((v0∘v1)∘(v2∘v3))...`, on every node, so
//! results are bit-identical to the tree's; it costs `log2(N)` latencies in
//! all instead of `2·log2(N)` (one exchange instead of a round trip on two
//! nodes, as `MPI_Allreduce` does).
//!
//! The combining order depends only on the node count, never on the
//! transport or on timing: a floating-point reduction gives the same bits
//! over the in-process link, TCP and MPI. That is part of hyfi's promise,
//! and why a transport may bring its own collectives only where they
//! combine in this order.
//!
//! # What a transport provides
//!
//! A [`Channel`]: send one collective message and wait for one, by sender,
//! sequence number and direction. A transport that has no channel of its
//! own uses [`Collectives`], a [`Service`] (number [`SERVICE`]) that
//! carries the messages through the transport's [`Port`] as control
//! messages and files them for their waiters. hyfi-net's TCP link files
//! them in its own inbox instead (the same frames it always had) and runs
//! this same [`allreduce`] over it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{Class, FrameError, Port, Service, ServiceId};
use crate::node::LinkError;
use crate::sleep::QuietCondvar;

/// The seam's collectives' service: its number on the wire.
pub const SERVICE: ServiceId = ServiceId::new(3, "the collectives");

/// Which way a collective message goes: up the tree (or a doubling
/// exchange), or down it (the result).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dir {
    /// Towards node 0, or a recursive-doubling exchange.
    Up,
    /// The result, from node 0 down.
    Down,
}

/// What the collectives need of a transport.
pub trait Channel {
    /// The transport's error.
    type Error: From<SizeMismatch>;
    /// This node's index.
    fn rank(&self) -> usize;
    /// Number of nodes.
    fn nodes(&self) -> usize;
    /// Sends collective message `(seq, dir)` to node `to`. Must not block
    /// on the receiver.
    fn send(&self, to: usize, seq: u64, dir: Dir, data: &[u8]) -> Result<(), Self::Error>;
    /// Waits for collective message `(seq, dir)` from node `from`.
    fn recv(&self, from: usize, seq: u64, dir: Dir) -> Result<Vec<u8>, Self::Error>;
}

/// A node sent a value of another size than this node's: the nodes do not
/// reduce the same variables in the same order (a bug of the program's
/// SPMD structure), or the transport damaged it.
#[derive(Debug, thiserror::Error)]
#[error(
    "node {me}: node {from} sent a reduction value of {got} bytes, expected {expected}: every \
     node must reduce the same variables in the same order"
)]
pub struct SizeMismatch {
    /// This node.
    pub me: usize,
    /// The sender.
    pub from: usize,
    /// Bytes received.
    pub got: usize,
    /// Bytes expected.
    pub expected: usize,
}

fn check<C: Channel>(ch: &C, from: usize, got: &[u8], value: &[u8]) -> Result<(), C::Error> {
    if got.len() == value.len() {
        return Ok(());
    }
    Err(SizeMismatch {
        me: ch.rank(),
        from,
        got: got.len(),
        expected: value.len(),
    }
    .into())
}

/// All-reduces `value` with `combine` over `ch`: on return every node holds
/// the combination of every node's value, in the order the module docs
/// give. `seq` numbers the collective: every node calls collectives in the
/// same order, with the same numbers. Every node's value has the same
/// length ([`SizeMismatch`] otherwise: the nodes diverged).
pub fn allreduce<C: Channel>(
    ch: &C,
    seq: u64,
    value: &mut [u8],
    combine: &mut dyn FnMut(&mut [u8], &[u8]),
) -> Result<(), C::Error> {
    let mut v = value.to_vec();
    combining(ch, seq, &mut v, true, &mut |acc, other| combine(acc, other))?;
    value.copy_from_slice(&v);
    Ok(())
}

/// [`allreduce`] of values whose lengths may differ from node to node, and
/// which `combine` may change: a concatenation (`acc.extend(other)`)
/// gathers every node's value, in node order, on every node, in the same
/// `log2(N)` latencies as a reduction (what a release's write notices ride
/// in, in hyfi-dsm).
pub fn allreduce_vec<C: Channel>(
    ch: &C,
    seq: u64,
    value: &mut Vec<u8>,
    combine: &mut dyn FnMut(&mut Vec<u8>, &[u8]),
) -> Result<(), C::Error> {
    combining(ch, seq, value, false, combine)
}

/// The binomial tree, or recursive doubling on a power of two: see the
/// module docs. `same_size`: a value of another length than this node's is
/// an error.
fn combining<C: Channel>(
    ch: &C,
    seq: u64,
    value: &mut Vec<u8>,
    same_size: bool,
    combine: &mut dyn FnMut(&mut Vec<u8>, &[u8]),
) -> Result<(), C::Error> {
    let (r, n) = (ch.rank(), ch.nodes());
    let sized = |from: usize, got: &[u8], value: &[u8]| match same_size {
        true => check(ch, from, got, value),
        false => Ok(()),
    };
    if n.is_power_of_two() {
        let mut m = 1usize;
        while m < n {
            let partner = r ^ m;
            ch.send(partner, seq, Dir::Up, value)?;
            let mut d = ch.recv(partner, seq, Dir::Up)?;
            sized(partner, &d, value)?;
            if r < partner {
                combine(value, &d);
            } else {
                combine(&mut d, value);
                *value = d;
            }
            m <<= 1;
        }
        return Ok(());
    }
    let mut mask = 1usize;
    while mask < n {
        if r & mask != 0 {
            ch.send(r - mask, seq, Dir::Up, value)?;
            break;
        }
        let child = r + mask;
        if child < n {
            let d = ch.recv(child, seq, Dir::Up)?;
            sized(child, &d, value)?;
            combine(value, &d);
        }
        mask <<= 1;
    }
    if r != 0 {
        let parent = r & (r - 1); // r minus its lowest set bit
        let d = ch.recv(parent, seq, Dir::Down)?;
        sized(parent, &d, value)?;
        *value = d;
    }
    // Children of r: r + m for every power of two m below r's lowest set
    // bit (all of them for node 0), largest subtree first.
    let low = if r == 0 {
        n.next_power_of_two()
    } else {
        r & r.wrapping_neg()
    };
    let mut m = low >> 1;
    while m > 0 {
        if r + m < n {
            ch.send(r + m, seq, Dir::Down, value)?;
        }
        m >>= 1;
    }
    Ok(())
}

/// How long a waiter polls before it sleeps: replies on a fast transport
/// come back sooner than a sleeping thread can be woken.
const SPIN: Duration = Duration::from_micros(50);

#[derive(Default)]
struct Mail {
    /// Messages not yet taken, by (sender, sequence number, direction).
    got: HashMap<(usize, u64, Dir), Vec<u8>>,
    /// Filthreads waiting for a message.
    waiters: Vec<crate::filthread::Waker>,
    failed: Option<String>,
    /// Peers whose program ended (they send no more collectives).
    left: Vec<usize>,
}

/// The seam's collectives for a transport that has no channel of its own:
/// a [`Service`] to register under [`SERVICE`] on the node's link, and the
/// [`Channel`] over the link's [`Port`]. See the module docs.
pub struct Collectives {
    me: usize,
    nodes: usize,
    port: Arc<dyn Port>,
    seq: AtomicU64,
    mail: Mutex<Mail>,
    /// Every piece of every all-reduce comes through `put`: notified only
    /// while a thread sleeps on it.
    cv: QuietCondvar,
    generation: AtomicU64,
}

impl std::fmt::Debug for Collectives {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collectives")
            .field("me", &self.me)
            .field("nodes", &self.nodes)
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

impl Collectives {
    /// The collectives of node `me` of `nodes`, sending through `port`.
    /// Register the result as service [`SERVICE`] on the same link.
    pub fn new(me: usize, nodes: usize, port: Arc<dyn Port>) -> Arc<Collectives> {
        Arc::new(Collectives {
            me,
            nodes,
            port,
            seq: AtomicU64::new(0),
            mail: Mutex::default(),
            cv: QuietCondvar::new(),
            generation: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Mail> {
        self.mail.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Changes the mail under its lock and wakes every waiter.
    fn put(&self, f: impl FnOnce(&mut Mail)) {
        let (waiters, sleeping) = {
            let mut m = self.lock();
            f(&mut m);
            self.generation.fetch_add(1, Ordering::Release);
            (std::mem::take(&mut m.waiters), self.cv.sleeping(&m))
        };
        if sleeping {
            self.cv.notify_all_now();
        }
        for w in waiters {
            w.wake();
        }
    }

    /// All-reduces `value` (see [`allreduce`]), numbering it after the
    /// collectives this node ran before.
    pub fn allreduce(
        &self,
        value: &mut [u8],
        combine: &mut dyn FnMut(&mut [u8], &[u8]),
    ) -> Result<(), LinkError> {
        if self.nodes == 1 {
            return Ok(());
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        allreduce(self, seq, value, combine)
    }

    /// [`allreduce_vec`], numbered as [`Collectives::allreduce`].
    pub fn allreduce_vec(
        &self,
        value: &mut Vec<u8>,
        combine: &mut dyn FnMut(&mut Vec<u8>, &[u8]),
    ) -> Result<(), LinkError> {
        if self.nodes == 1 {
            return Ok(());
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        allreduce_vec(self, seq, value, combine)
    }

    /// Returns once every node has entered the barrier.
    pub fn barrier(&self) -> Result<(), LinkError> {
        self.allreduce(&mut [], &mut |_, _| {})
    }

    /// Takes message `key`, or says why it will never come.
    fn take(&self, m: &mut Mail, key: (usize, u64, Dir)) -> Option<Result<Vec<u8>, LinkError>> {
        if let Some(d) = m.got.remove(&key) {
            return Some(Ok(d));
        }
        if let Some(f) = &m.failed {
            return Some(Err(f.clone().into()));
        }
        if m.left.contains(&key.0) {
            return Some(Err(format!(
                "node {}: node {} ended its program while this node waited for it in a \
                 collective (barrier or reduction #{}): the nodes did not run the same \
                 collectives",
                self.me, key.0, key.1
            )
            .into()));
        }
        None
    }
}

impl Channel for Collectives {
    type Error = LinkError;
    fn rank(&self) -> usize {
        self.me
    }
    fn nodes(&self) -> usize {
        self.nodes
    }
    fn send(&self, to: usize, seq: u64, dir: Dir, data: &[u8]) -> Result<(), LinkError> {
        let head = seq << 1 | u64::from(dir == Dir::Down);
        // Read at the receiver's collective call: no need to wake it while
        // its master computes.
        self.port
            .send_for_phase_end(to, SERVICE, Class::Control, 8 + data.len(), &mut |b| {
                b.extend_from_slice(&head.to_le_bytes());
                b.extend_from_slice(data);
            })
            .map(|_| ())
    }
    fn recv(&self, from: usize, seq: u64, dir: Dir) -> Result<Vec<u8>, LinkError> {
        let key = (from, seq, dir);
        if crate::filthread::in_filthread() {
            let mut got = None;
            loop {
                crate::filthread::suspend(|waker| {
                    let mut m = self.lock();
                    if let Some(r) = self.take(&mut m, key) {
                        got = Some(r);
                        return false;
                    }
                    // Registered under the lock that `put` takes: a message
                    // arriving after this check finds the waker.
                    m.waiters.push(waker);
                    true
                });
                if let Some(r) = got.take() {
                    return r;
                }
            }
        }
        if crate::sleep::own_cpu() {
            // A node that owns its CPUs polls as long as its other waits do
            // (`sleep::OWN_CPU_POLL`), driving the transport (MPI): each
            // step of a collective waits here, and one that outlasted a
            // short poll paid a sleep and a wake-up.
            let got = crate::sleep::poll_own_cpu_for(&self.generation, || {
                self.take(&mut self.lock(), key)
            });
            if let Some(r) = got {
                return r;
            }
        } else {
            let spin_until = Instant::now() + SPIN;
            let _polling = super::Attend::start(super::Attending::Polling);
            loop {
                let seen = self.generation.load(Ordering::Acquire);
                if let Some(r) = self.take(&mut self.lock(), key) {
                    return r;
                }
                while self.generation.load(Ordering::Acquire) == seen && Instant::now() < spin_until
                {
                    // Nothing to do but wait: drive the transport (MPI).
                    super::idle_progress();
                    std::hint::spin_loop();
                }
                if Instant::now() >= spin_until {
                    break;
                }
            }
        }
        // It sleeps: a collective's polling bracket ends first.
        super::before_sleep();
        let mut m = self.lock();
        loop {
            if let Some(r) = self.take(&mut m, key) {
                return r;
            }
            m = self.cv.wait(m);
        }
    }
}

impl Service for Collectives {
    fn frame(&self, from: usize, mut payload: Vec<u8>) -> Result<(), FrameError> {
        let Some(head) = payload.get(..8) else {
            return Err(format!(
                "node {}: a collective message of {} bytes from node {from}, shorter than its \
                 8-byte header",
                self.me,
                payload.len()
            )
            .into());
        };
        let head = u64::from_le_bytes(head.try_into().expect("8 bytes"));
        let dir = if head & 1 == 1 { Dir::Down } else { Dir::Up };
        payload.drain(..8);
        self.put(|m| {
            m.got.insert((from, head >> 1, dir), payload);
        });
        Ok(())
    }
    fn failed(&self, why: &str) {
        self.put(|m| {
            m.failed.get_or_insert_with(|| why.to_string());
        });
    }
    fn peer_left(&self, peer: usize) {
        self.put(|m| m.left.push(peer));
    }
}
