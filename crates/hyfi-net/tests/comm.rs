//! The communication thread with real sockets on loopback: two or four
//! nodes as threads of one process (each with its own mesh and
//! communication thread).

use hyfi_core::layer::RuntimeExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyfi_core::{Config, Control, PoolArray, Program, Runtime};
use hyfi_net::tcp::comm::{Comm, FailureHook};
use hyfi_net::Cluster;

mod common;
use common::{close, comms_lanes, specs};

/// Ends the nodes together, as separate processes would: each waits for the
/// others' goodbye, so dropping them one after another would make each wait
/// its full grace period.
fn finish(cs: Vec<Arc<Cluster>>) {
    let hs: Vec<_> = cs
        .into_iter()
        .map(|c| std::thread::spawn(move || drop(c)))
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

/// Starts `n` nodes as threads; returns them in rank order.
fn nodes(n: usize) -> Vec<Arc<Cluster>> {
    let hs: Vec<_> = specs(n)
        .into_iter()
        .map(|spec| {
            std::thread::spawn(move || Cluster::connect(&spec, Duration::from_secs(20)).unwrap())
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Starts the bare message substrate of `n` nodes (mesh and communication
/// thread, no `Cluster` around them), as threads; returns them in rank
/// order.
fn comms(n: usize) -> Vec<Arc<Comm>> {
    comms_with_hooks((0..n).map(|_| -> FailureHook {
        Box::new(|why: &hyfi_net::cause::Cause| eprintln!("comm test: {why}"))
    }))
}

/// [`comms`] with a failure hook of the caller's per node.
fn comms_with_hooks(hooks: impl Iterator<Item = FailureHook>) -> Vec<Arc<Comm>> {
    let hooks: Vec<_> = hooks.collect();
    let hs: Vec<_> = specs(hooks.len())
        .into_iter()
        .zip(hooks)
        .map(|(spec, hook)| {
            std::thread::spawn(move || {
                let links = hyfi_net::tcp::mesh::connect(&spec, Duration::from_secs(20)).unwrap();
                Arc::new(Comm::start(links, hook, hyfi_net::DEFAULT_HEARTBEAT).unwrap())
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn collectives_combine_in_a_fixed_order() {
    for n in [2, 3, 4] {
        let cs = nodes(n);
        let hs: Vec<_> = cs
            .iter()
            .cloned()
            .map(|c| {
                std::thread::spawn(move || {
                    let mut out = Vec::new();
                    for round in 0..20u64 {
                        c.barrier().unwrap();
                        // A non-commutative combine (concatenation as a
                        // polynomial hash) exposes the combining order.
                        let mut v = (c.rank() as u64 + 1 + round * 10).to_le_bytes();
                        c.allreduce(&mut v, &mut |a, b| {
                            let x = u64::from_le_bytes(a.try_into().unwrap());
                            let y = u64::from_le_bytes(b.try_into().unwrap());
                            a.copy_from_slice(
                                &x.wrapping_mul(1_000_003).wrapping_add(y).to_le_bytes(),
                            );
                        })
                        .unwrap();
                        out.push(u64::from_le_bytes(v));
                    }
                    out
                })
            })
            .collect();
        let results: Vec<Vec<u64>> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(
            results.iter().all(|r| r == &results[0]),
            "n={n}: nodes disagree"
        );
        // Every node's value took part exactly once: check with a commutative sum.
        let cs2 = cs.clone();
        let handles: Vec<_> = cs2
            .into_iter()
            .map(|c| {
                std::thread::spawn(move || {
                    let mut v = (c.rank() as u64 + 1).to_le_bytes();
                    c.allreduce(&mut v, &mut |a, b| {
                        let s = u64::from_le_bytes(a.try_into().unwrap())
                            + u64::from_le_bytes(b.try_into().unwrap());
                        a.copy_from_slice(&s.to_le_bytes());
                    })
                    .unwrap();
                    u64::from_le_bytes(v)
                })
            })
            .collect();
        let sums: Vec<u64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(
            sums.iter().all(|&s| s == (n * (n + 1) / 2) as u64),
            "n={n}: {sums:?}"
        );
        finish(cs);
    }
}

#[test]
fn a_filament_waiting_for_the_network_lets_its_processor_run_other_pools() {
    let cs = comms(2);
    let (n0, n1) = (cs[0].clone(), cs[1].clone());
    let pool1_ran = Arc::new(AtomicBool::new(false));
    // Node 0 sends its page only once node 1's other pool has run: if the
    // waiting filament blocked the server thread, that never happens (the
    // sender gives up after 10 s and the order check fails).
    let sender = {
        let pool1_ran = pool1_ran.clone();
        std::thread::spawn(move || {
            let t = std::time::Instant::now();
            while !pool1_ran.load(Ordering::SeqCst) && t.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(1));
            }
            n0.send_bulk(1, 7, &[42u8; 4096]).unwrap();
            n0
        })
    };
    let rt = Runtime::new(Config::new().procs(1).pin(false)).unwrap();
    let order = Mutex::new(Vec::new());
    let mut pools = PoolArray::<usize>::new(&rt, 2);
    pools.pool_k(0, 0).push(0);
    pools.pool_k(0, 1).push(1);
    let mut prog = Program::new();
    prog.phase(
        pools,
        |_, i| {
            if i == 0 {
                let (tag, page) = n1.recv_bulk(0).unwrap();
                assert_eq!((tag, page.len(), page[4095]), (7, 4096, 42));
                order.lock().unwrap().push("page arrived");
            } else {
                order.lock().unwrap().push("other pool ran");
                pool1_ran.store(true, Ordering::SeqCst);
            }
        },
        |_| Control::Done,
    );
    rt.start(&mut prog).unwrap();
    drop(prog);
    let n0 = sender.join().unwrap();
    assert_eq!(
        *order.lock().unwrap(),
        vec!["other pool ran", "page arrived"]
    );
    assert_eq!(rt.stats().total().suspensions, 1);
    let st = n1.stats();
    assert_eq!(st.bulk_received.load(Ordering::Relaxed), 1);
    assert_eq!(st.bulk_bytes_received.load(Ordering::Relaxed), 4096 + 16);
    drop(cs);
    close(vec![n0, n1]);
}

#[test]
fn a_runtime_over_four_nodes_reduces_across_all_of_them() {
    let cs = nodes(4);
    let hs: Vec<_> = cs
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let rt = Runtime::with_link(Config::new().procs(1).pin(false), c).unwrap();
                assert_eq!((rt.num_nodes(), rt.node() < 4), (4, true));
                let s = rt.reduction(0u64);
                let mut got = Vec::new();
                let mut prog = Program::new();
                prog.phase(
                    PoolArray::block(&rt, 0..1000, 1),
                    |ctx, i| s.update(ctx, |v| v + i as u64),
                    |post| {
                        got.push(post.reduce(&s, hyfi_core::Op::Sum));
                        post.set(&s, 0);
                        if post.iteration() == 2 {
                            Control::Done
                        } else {
                            Control::Continue
                        }
                    },
                );
                rt.start(&mut prog).unwrap();
                drop(prog);
                got
            })
        })
        .collect();
    for h in hs {
        // Each node took its block of 0..1000; the reduction sums all blocks.
        assert_eq!(h.join().unwrap(), vec![499_500; 3]);
    }
}

/// Both nodes send each other a burst of frames of every size (empty, a
/// few bytes, more than the loop's 64 KiB read buffer, more than a socket
/// buffer) with control messages between them, before either reads: the
/// senders must not block (the rest waits in the backlogs, which the loops
/// write out as the sockets drain), and every frame must arrive whole, in
/// order, across however many partial reads and writes it took.
///
/// Over both kinds of link: nodes of one host pair up shared-memory lanes
/// (the 3 MiB frames are larger than a lane's ring, so they stream through
/// it in pieces and both rings fill: the backlog waits for the reader's
/// bell), and with lanes off every frame goes through the socket. Step
/// records held for the successor go out in front of frames of every
/// size, in every state of the backlog, and arrive in order.
#[test]
fn bursts_of_every_frame_size_arrive_whole_and_in_order() {
    for lanes in [true, false] {
        let cs = comms_lanes(2, lanes);
        for (c, count) in &cs {
            assert_eq!(
                *count,
                usize::from(lanes),
                "node {}'s links with a lane (lanes {lanes})",
                c.rank()
            );
            // What the node's traffic report says of it.
            assert_eq!(
                c.sender().stats().snapshot().shared_memory_links,
                u64::from(lanes),
                "node {}'s reported shared-memory links",
                c.rank()
            );
        }
        bursts(cs.into_iter().map(|(c, _)| c).collect());
    }
}

fn bursts(cs: Vec<Arc<Comm>>) {
    use hyfi_net::tcp::comm::Dir;
    use hyfi_net::tcp::wire::Msg;
    const SIZES: [usize; 7] = [0, 1, 15, 4096, 65_537, 300_000, 3 << 20];
    const FRAMES: u64 = 60;
    let byte = |i: u64, j: usize| (i as usize * 31 + j * 7) as u8;
    // Control messages received, counted before either node sends.
    let controls = |c: &Comm| c.sender().stats().snapshot().control.received;
    let befores: Vec<u64> = cs.iter().map(|c| controls(c)).collect();
    let hs: Vec<_> = cs
        .iter()
        .zip(befores)
        .map(|(c, before)| {
            let c = c.clone();
            std::thread::spawn(move || {
                let (me, peer) = (c.rank(), 1 - c.rank());
                for i in 0..FRAMES {
                    let len = SIZES[i as usize % SIZES.len()];
                    let data: Vec<u8> = (0..len).map(|j| byte(i, j)).collect();
                    if i % 3 == 0 {
                        // Both nodes take the same steps: held, they ride
                        // in front of the next frame (a large one, cut by
                        // a full ring, or one queued behind such), and the
                        // successor checks them in order.
                        c.enter_step(hyfi_core::Step::Phase {
                            program: 1,
                            phase: 0,
                            iteration: i,
                        })
                        .unwrap();
                    }
                    c.send_bulk(peer, i, &data).unwrap();
                    if i % 5 == 0 {
                        let up = Msg::Up {
                            seq: i,
                            data: vec![me as u8; 9],
                        };
                        c.send(peer, &up).unwrap();
                    }
                }
                for i in 0..FRAMES {
                    let (tag, data) = c.recv_bulk(peer).unwrap();
                    assert_eq!(tag, i, "bulk frames out of order");
                    let len = SIZES[i as usize % SIZES.len()];
                    assert_eq!(data.len(), len, "frame {i}'s length");
                    assert!(
                        data.iter().enumerate().all(|(j, b)| *b == byte(i, j)),
                        "frame {i}'s bytes"
                    );
                    if i % 5 == 0 {
                        let got = c.recv_coll(peer, i, Dir::Up).unwrap();
                        assert_eq!(got, vec![peer as u8; 9]);
                    }
                }
                // Every step record came, each ahead of the frame it rode
                // in front of: the peer's control messages and its steps.
                assert_eq!(
                    controls(&c) - before,
                    FRAMES.div_ceil(5) + FRAMES.div_ceil(3),
                    "node {me}: control messages received (collective pieces and step records)"
                );
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    close(cs);
}

/// The failure hook (which prints the node's "hyfi: node 1: …" line) runs
/// before any waiter sees the failure: a program that gets the error may
/// print it and exit at once, and the node's own line must be out by then
/// (a loaded machine once lost it, in tests/dsm.rs). The hook here is slow
/// on purpose, so the old order (waiters first) fails every time.
#[test]
fn the_failure_hook_runs_before_a_waiter_sees_the_failure() {
    let announced = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&announced);
    let hooks: Vec<FailureHook> = vec![
        Box::new(|why: &hyfi_net::cause::Cause| eprintln!("comm test: {why}")),
        Box::new(move |why: &hyfi_net::cause::Cause| {
            std::thread::sleep(Duration::from_millis(300));
            eprintln!("comm test, node 1: {why}");
            seen.store(true, Ordering::SeqCst);
        }),
    ];
    let cs = comms_with_hooks(hooks.into_iter());
    let waiter = {
        let c = cs[1].clone();
        std::thread::spawn(move || c.recv_bulk(0))
    };
    cs[0].abort("a test's abort");
    let got = waiter.join().unwrap();
    let err = got.expect_err("node 0 aborted: the wait must fail");
    assert!(
        announced.load(Ordering::SeqCst),
        "the waiter saw the failure ({err}) before the failure hook had run"
    );
    assert!(err.to_string().contains("a test's abort"), "{err}");
    close(cs);
}

/// Two different steps at the same number, as two diverged nodes take them.
fn diverged_steps() -> (hyfi_core::Step, hyfi_core::Step) {
    (
        hyfi_core::Step::Phase {
            program: 1,
            phase: 0,
            iteration: 3,
        },
        hyfi_core::Step::Alloc {
            seq: 2,
            elems: 10,
            bytes: 80,
        },
    )
}

/// Waits at most `secs` for `f` on another thread (a hang is a failure).
fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .expect("no answer in time: a held-back step never went out")
}

/// The TCP transport holds a node's step message back until it sends its
/// successor something else or waits (`Sender::hold_step`): a node that
/// diverged and then waits has sent it first, so its successor names the
/// divergence and the wait ends with it.
#[test]
fn a_held_step_goes_out_when_its_node_waits() {
    let cs = comms(2);
    let (a, b) = diverged_steps();
    // Node 1 (node 0's successor) has taken its first step; node 0 takes
    // another, held back, and waits for something node 1 never sends.
    cs[1].enter_step(b).unwrap();
    cs[0].enter_step(a).unwrap();
    let c0 = cs[0].clone();
    let err = within(20, move || c0.recv_bulk(1)).expect_err("the nodes diverged");
    let msg = err.to_string();
    assert!(msg.contains("different steps (step 1)"), "{msg}");
    assert!(msg.contains("node 0") && msg.contains("node 1"), "{msg}");
    close(cs);
}

/// A node that holds a step back and neither sends nor waits (a long
/// computation) still sends it: its communication thread does at its next
/// turn, a heartbeat's judging period at most.
#[test]
fn a_held_step_goes_out_while_its_node_computes() {
    let cs = comms(2);
    let (a, b) = diverged_steps();
    cs[0].enter_step(a).unwrap();
    cs[1].enter_step(b).unwrap();
    // Node 0 computes (this thread does nothing with it); node 1 waits.
    let c1 = cs[1].clone();
    let err = within(20, move || c1.recv_bulk(0)).expect_err("the nodes diverged");
    assert!(
        err.to_string().contains("different steps (step 1)"),
        "{err}"
    );
    close(cs);
}
