//! Reductions are reproducible however the pools of a processor interleave,
//! and `Reduction::update` cannot lose an update.
//!
//! Every filament here waits once (as one waiting for a shared page does)
//! before it contributes; a "network" thread ends the waits in an order
//! drawn from a seed, so each run interleaves the pools of a processor
//! differently.

use std::sync::mpsc;
use std::time::Duration;

use hyfi_core::{filthread, Config, Control, Error, Op, PoolArray, Program, Runtime};

const PROCS: usize = 2;
const POOLS: usize = 8;
const N: usize = 2000;

/// Values whose floating-point sum depends on the order they are added in.
fn value(i: usize) -> f64 {
    match i % 4 {
        0 => 1e16,
        1 => 1.0,
        2 => -1e16,
        _ => 0.5 + (i % 7) as f64,
    }
}

/// A thread that ends waits in a seeded random order: it holds the wakers
/// it has, and wakes a random one of them whenever no new one comes soon.
fn shuffler(seed: u64) -> (mpsc::Sender<filthread::Waker>, std::thread::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel::<filthread::Waker>();
    let h = std::thread::spawn(move || {
        let mut held: Vec<filthread::Waker> = Vec::new();
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        loop {
            let got = if held.is_empty() {
                rx.recv().ok()
            } else {
                match rx.recv_timeout(Duration::from_micros(50)) {
                    Ok(w) => Some(w),
                    Err(mpsc::RecvTimeoutError::Timeout) => None,
                    Err(mpsc::RecvTimeoutError::Disconnected) => None,
                }
            };
            let quiet = got.is_none();
            match got {
                Some(w) => held.push(w),
                None if held.is_empty() => return,
                None => {}
            }
            if !held.is_empty() && (quiet || x % 3 == 0) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let k = (x as usize) % held.len();
                held.swap_remove(k).wake();
            }
        }
    });
    (tx, h)
}

/// Which filaments pool `k` of processor `p` holds: filament `i` goes to
/// slot `i % (PROCS * POOLS)` (cyclic, as a cyclic placement deals them).
fn pools(rt: &Runtime) -> PoolArray<usize> {
    let mut pa = PoolArray::new(rt, POOLS);
    for i in 0..N {
        let s = i % (PROCS * POOLS);
        pa.pool_k(s / POOLS, s % POOLS).push(i);
    }
    pa
}

/// The sum in the order the reduce promises: each pool's filaments in
/// order, then the pools of a processor in order, then the processors.
fn fixed_order_sum() -> f64 {
    let mut acc: Option<f64> = None;
    for p in 0..PROCS {
        for k in 0..POOLS {
            let slot = p * POOLS + k;
            let pool = (0..N)
                .filter(|i| i % (PROCS * POOLS) == slot)
                .fold(0.0, |s, i| s + value(i));
            acc = Some(acc.map_or(pool, |a| a + pool));
        }
    }
    acc.expect("at least one pool")
}

#[derive(Clone, Copy, Debug)]
enum How {
    Fold,
    Update,
    Local,
}

/// One run: every filament waits (woken in the seed's order), then adds
/// its value to a sum with `how`.
fn run_once(seed: u64, how: How) -> f64 {
    let rt = Runtime::new(Config::new().procs(PROCS).pin(false)).expect("runtime");
    let (tx, net) = shuffler(seed);
    let tx = std::sync::Mutex::new(tx);
    let total = rt.reduction(0.0f64);
    let mut got = f64::NAN;
    let wait = || {
        filthread::suspend(|w| {
            tx.lock().unwrap().send(w).expect("shuffler alive");
            true
        })
    };
    let mut prog = Program::new();
    match how {
        How::Fold | How::Update => {
            prog.phase(
                pools(&rt),
                |ctx, i| {
                    wait();
                    match how {
                        How::Fold => total.fold(ctx, Op::Sum, value(i)),
                        _ => total.update(ctx, |s| s + value(i)),
                    }
                },
                |post| {
                    got = post.reduce(&total, Op::Sum);
                    Control::Done
                },
            );
        }
        How::Local => {
            prog.phase_with(
                pools(&rt),
                |ctx, _span| total.local(ctx, Op::Sum),
                |_ctx, i, acc| {
                    wait();
                    acc.fold(value(i));
                },
                |post| {
                    got = post.reduce(&total, Op::Sum);
                    Control::Done
                },
            );
        }
    }
    rt.start(&mut prog).expect("program runs");
    drop(prog);
    drop(tx);
    net.join().expect("shuffler");
    got
}

#[test]
fn sums_are_bit_identical_however_the_pools_interleave() {
    let want = fixed_order_sum();
    // The values really are order-sensitive: a plain sequential sum differs.
    let naive = (0..N).fold(0.0, |s, i| s + value(i));
    assert_ne!(naive.to_bits(), want.to_bits(), "test values too tame");
    for how in [How::Fold, How::Update, How::Local] {
        let runs: Vec<f64> = (1..=6).map(|seed| run_once(seed, how)).collect();
        for (r, v) in runs.iter().enumerate() {
            assert_eq!(
                v.to_bits(),
                want.to_bits(),
                "{how:?}, run {r}: {v:e}, expected {want:e} (all runs: {runs:?})"
            );
        }
    }
}

/// A fork-join run on one processor: `update`'s closure waits for a
/// stolen-like event. Before the fix, the other branch updated the copy
/// meanwhile and one of the two increments was lost (the total came out 1).
#[test]
fn an_update_closure_that_waits_is_refused_in_fork_join() {
    let rt = Runtime::new(Config::new().procs(1).pin(false)).expect("runtime");
    let count = rt.reduction(0u64);
    let (tx, net) = shuffler(3);
    let tx = std::sync::Mutex::new(tx);
    let e = rt
        .run(|ctx| {
            ctx.join(
                |c| {
                    count.update(c, |s| {
                        filthread::suspend(|w| {
                            tx.lock().unwrap().send(w).expect("shuffler alive");
                            true
                        });
                        s + 1
                    })
                },
                |c| count.update(c, |s| s + 1),
            )
        })
        .expect_err("an update closure that waits must be refused");
    drop(tx);
    net.join().expect("shuffler");
    match &e {
        Error::FilamentPanic { message, .. } => {
            assert!(
                message.contains("Reduction::update") && message.contains("before calling update"),
                "{message}"
            );
        }
        other => panic!("expected a filament panic, got {other:?}"),
    }
    // The runtime is usable afterwards, and update works without waiting.
    rt.set(&count, 0).expect("set");
    rt.run(|ctx| {
        ctx.join(
            |c| count.update(c, |s| s + 1),
            |c| count.update(c, |s| s + 1),
        )
    })
    .expect("runs");
    assert_eq!(rt.get(&count).expect("get"), 2);
}

/// The same refusal in a phase: the message names the phase.
#[test]
fn an_update_closure_that_waits_is_refused_in_a_phase() {
    let rt = Runtime::new(Config::new().procs(2).pin(false)).expect("runtime");
    let count = rt.reduction(0u64);
    let (tx, net) = shuffler(5);
    let tx = std::sync::Mutex::new(tx);
    let mut prog = Program::new();
    prog.phase(
        PoolArray::block(&rt, 0..64, 4),
        |ctx, _i| {
            count.update(ctx, |s| {
                filthread::suspend(|w| {
                    tx.lock().unwrap().send(w).expect("shuffler alive");
                    true
                });
                s + 1
            })
        },
        |_| Control::Done,
    );
    let e = rt.start(&mut prog).expect_err("must be refused");
    drop(prog);
    drop(tx);
    net.join().expect("shuffler");
    let s = e.to_string();
    assert!(
        s.contains("Reduction::update") && s.contains("phase 0"),
        "{s}"
    );
}
