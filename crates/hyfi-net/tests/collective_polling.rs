//! A node that owns its CPUs and waits for a collective's piece reads the
//! shared-memory lanes itself, inside the core's polling bracket, so its
//! peers ring it no bell (a write on the socket, and its communication
//! thread woken onto the CPU the waiter spins on). Its own test binary: it
//! declares the process's CPUs its own, which every wait in it then sees.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyfi_core::link::Attending;
use hyfi_net::tcp::collective::Collectives;
use hyfi_net::tcp::comm::{Comm, Dir, FailureHook};
use hyfi_net::tcp::wire::Msg;

/// The waiting node's thread: the hooks below count its brackets only.
const WAITER: &str = "collective-waiter";

/// Polling brackets the waiter began, and ended.
static BEGUN: AtomicUsize = AtomicUsize::new(0);
static ENDED: AtomicUsize = AtomicUsize::new(0);
/// Node 0's pieces whose write (and bell, if any) is done.
static SENT: AtomicUsize = AtomicUsize::new(0);
/// The rounds whose bracket ended before node 0's piece was written: the
/// waiter's poll ran out (the machine descheduled a thread for a
/// millisecond), and it went to sleep. Only there may the piece ring.
static ENDED_FIRST: Mutex<Vec<usize>> = Mutex::new(Vec::new());

fn begin(kind: Attending) {
    if kind == Attending::Polling && std::thread::current().name() == Some(WAITER) {
        BEGUN.fetch_add(1, Ordering::SeqCst);
    }
}

fn end(kind: Attending) {
    if kind == Attending::Polling && std::thread::current().name() == Some(WAITER) {
        // This bracket is round `r`'s (the waiter's only wait in a round).
        let r = ENDED.fetch_add(1, Ordering::SeqCst);
        if SENT.load(Ordering::SeqCst) <= r {
            ENDED_FIRST.lock().unwrap().push(r);
        }
    }
}

/// Two nodes with lanes, as threads, with a heartbeat long enough that no
/// heartbeat frame (which may ring) goes out while the test runs.
fn two_nodes() -> Vec<Arc<Comm>> {
    let hs: Vec<_> = common::specs(2)
        .into_iter()
        .map(|spec| {
            std::thread::spawn(move || {
                let links = hyfi_net::tcp::mesh::connect_with(&spec, Duration::from_secs(20), true)
                    .unwrap();
                assert_eq!(
                    links.lanes.count(),
                    1,
                    "node {}: a lane to the other",
                    spec.rank
                );
                let hook: FailureHook =
                    Box::new(|why: &hyfi_net::cause::Cause| eprintln!("test: {why}"));
                Arc::new(Comm::start(links, hook, Duration::from_secs(600)).unwrap())
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn a_node_waiting_in_a_collective_polls_the_lanes_and_is_rung_no_bell() {
    let cs = two_nodes();
    // A few rounds first, delivered by the communication threads (the
    // nodes do not own their CPUs yet, so their waiters leave the links
    // to them): each installs the transport's brackets (`set_attending`)
    // before its loop runs. The test's own, installed next, then run after
    // the transport's: once the waiter is counted here, its lanes count
    // it polling.
    const WARM: usize = 3;
    let warm: Vec<_> = (0..2)
        .map(|i| {
            let c = cs[i].clone();
            std::thread::spawn(move || {
                let coll = Collectives::default();
                for _ in 0..WARM {
                    coll.barrier(&c).unwrap();
                }
                coll
            })
        })
        .collect();
    let mut colls = warm.into_iter().map(|h| h.join().unwrap());
    let coll1 = colls.nth(1).unwrap();
    assert!(hyfi_core::link::set_attending(begin, end));
    // From here on, as nodes pinned to CPUs no other node uses.
    hyfi_core::sleep::set_own_cpu();
    hyfi_core::sleep::set_cpus_exclusive();

    const ROUNDS: usize = 40;
    let c1 = cs[1].clone();
    let waiter = std::thread::Builder::new()
        .name(WAITER.into())
        .spawn(move || {
            let coll = coll1;
            for r in 0..ROUNDS {
                let mut v = [1u8];
                coll.allreduce(&c1, &mut v, &mut |a, b| a[0] += b[0] * 2)
                    .unwrap();
                // Node 0's value (2) combined with node 1's (1): 2 + 1·2.
                assert_eq!(v, [4], "round {r}: the all-reduce's result on node 1");
            }
        })
        .unwrap();

    // Node 0 plays its side of each all-reduce by hand (the same pieces
    // `Collectives` sends), so that it can say when its write is done.
    let sender = cs[0].sender();
    let stats = sender.stats();
    let mut rung = Vec::new();
    // The warm-up's barriers were collectives 0 .. WARM of each node.
    for (r, seq) in (0..ROUNDS).zip(WARM as u64..) {
        // Node 1 has sent its piece and waits for this node's, polling.
        let deadline = Instant::now() + Duration::from_secs(30);
        while BEGUN.load(Ordering::SeqCst) <= r {
            assert!(Instant::now() < deadline, "round {r}: node 1 never waited");
            std::thread::yield_now();
        }
        let before = stats.snapshot().wakes;
        sender
            .send_collective(1, &Msg::Up { seq, data: vec![2] })
            .unwrap();
        SENT.fetch_add(1, Ordering::SeqCst);
        if stats.snapshot().wakes != before {
            rung.push(r);
        }
        let theirs = cs[0].recv_coll(1, seq, Dir::Up).unwrap();
        assert_eq!(theirs, [1], "round {r}: node 1's piece");
    }
    waiter.join().unwrap();
    assert_eq!(
        BEGUN.load(Ordering::SeqCst),
        ROUNDS,
        "node 1's polling brackets"
    );
    assert_eq!(
        ENDED.load(Ordering::SeqCst),
        ROUNDS,
        "node 1's brackets ended"
    );
    // A bell only where node 1's poll ran out before the piece was
    // written: it slept then, and must be woken.
    let ended_first = ENDED_FIRST.lock().unwrap().clone();
    let unexplained: Vec<_> = rung.iter().filter(|r| !ended_first.contains(r)).collect();
    assert!(
        unexplained.is_empty(),
        "node 0 rang node 1 in rounds {unexplained:?} while node 1 polled its lanes \
         (rounds where node 1's poll ran out first: {ended_first:?})"
    );
    common::close(cs);
}
