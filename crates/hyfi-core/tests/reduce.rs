//! Reductions are reproducible however the pools of a processor interleave,
//! `Reduction::update` cannot lose an update, and `Reduction::local_with`
//! reduces a type of the user's own as a sequential scan does (folded by
//! value, or changed in place with `LocalWith::update`).
//!
//! Every filament here waits once (as one waiting for a shared page does)
//! before it contributes; a "network" thread ends the waits in an order
//! drawn from a seed, so each run interleaves the pools of a processor
//! differently.

use std::sync::mpsc;
use std::time::Duration;

use hyfi_core::{bytemuck, filthread, Config, Control, Error, Op, PoolArray, Program, Runtime};

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
    // The run's updates are in its copy, unreduced: `get` says so.
    assert!(matches!(rt.get(&count), Err(Error::Unreduced)));
    assert_eq!(rt.reduce(&count, Op::Sum).expect("reduce"), 2);
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

/// The largest value and its index, lowest index on ties: a reduction of
/// a user's own type, with no `Op`.
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[bytemuck(crate = "hyfi_core::bytemuck")]
#[repr(C)]
struct ArgMax {
    value: f64,
    index: u64,
}

/// `better(NONE, x) == x` for every `x`: the identity.
const NONE: ArgMax = ArgMax {
    value: f64::NEG_INFINITY,
    index: u64::MAX,
};

fn better(a: ArgMax, b: ArgMax) -> ArgMax {
    if b.value > a.value || (b.value == a.value && b.index < a.index) {
        b
    } else {
        a
    }
}

/// Values with many ties (the lowest index must win) and a few
/// negatives, so a wrong identity shows.
fn arg_value(i: usize) -> f64 {
    ((i * 7919) % 503) as f64 - 250.0
}

#[test]
fn local_with_matches_a_sequential_scan() {
    let n = 5000;
    let want = (0..n).fold(NONE, |b, i| {
        better(
            b,
            ArgMax {
                value: arg_value(i),
                index: i as u64,
            },
        )
    });
    assert_eq!(want.value, 252.0);
    for procs in [1, 2] {
        for pools in [1, 3] {
            let rt = Runtime::new(Config::new().procs(procs).pin(false)).expect("runtime");
            let best = rt.reduction(NONE);
            let (mut got, mut sweeps) = (Vec::new(), 0);
            let mut prog = Program::new();
            prog.phase_with(
                PoolArray::block(&rt, 0..n, pools),
                |ctx, _span| best.local_with(ctx, NONE, better),
                |_ctx, i, acc| {
                    acc.fold(ArgMax {
                        value: arg_value(i),
                        index: i as u64,
                    })
                },
                |post| {
                    got.push(post.reduce_with(&best, better));
                    // Reset every copy, as a sum is reset after a reduce.
                    post.set(&best, NONE);
                    sweeps += 1;
                    if sweeps == 3 {
                        Control::Done
                    } else {
                        Control::Continue
                    }
                },
            );
            rt.start(&mut prog).expect("program runs");
            drop(prog);
            assert_eq!(got, vec![want; 3], "{procs} processors, {pools} pools each");
        }
    }
}

/// Its combine function runs on the copy at the segment's end, so it may
/// not wait either: in fork-join, another filthread could update the copy
/// meanwhile.
#[test]
fn a_local_with_combine_that_waits_is_refused() {
    let rt = Runtime::new(Config::new().procs(1).pin(false)).expect("runtime");
    let count = rt.reduction(0u64);
    let (tx, net) = shuffler(7);
    let tx = std::sync::Mutex::new(tx);
    let waits = std::sync::atomic::AtomicBool::new(false);
    let combine = |a: u64, b: u64| {
        if waits.load(std::sync::atomic::Ordering::Relaxed) {
            filthread::suspend(|w| {
                tx.lock().unwrap().send(w).expect("shuffler alive");
                true
            });
        }
        a + b
    };
    let e = rt
        .run(|ctx| {
            let mut acc = count.local_with(ctx, 0, combine);
            acc.fold(1);
            // Folding into the accumulator is plain arithmetic; the drop
            // combines into the copy, where waiting is refused.
            waits.store(true, std::sync::atomic::Ordering::Relaxed);
        })
        .expect_err("a combine that waits on the copy must be refused");
    drop(tx);
    net.join().expect("shuffler");
    assert!(
        e.to_string().contains("local_with"),
        "the message names local_with: {e}"
    );
}

/// A combine function that panics while a phase's end reduces with it
/// (`Program::reduce_at_end_with`): the program ends with the panic as
/// its error, as one in post-phase code would, and the runtime runs the
/// next program.
#[test]
fn a_combine_that_panics_at_a_phase_end_ends_the_program_with_its_message() {
    let rt = Runtime::new(Config::new().procs(PROCS).pin(false)).expect("runtime");
    let top = rt.reduction(0u64);
    let mut prog = Program::new();
    prog.phase(
        PoolArray::block(&rt, 0..64, 2),
        |ctx, i| top.update(ctx, |t| t.max(i as u64)),
        |_| Control::Done,
    )
    .reduce_at_end_with(&top, |a: u64, b: u64| {
        assert!(a < 60 && b < 60, "no value may reach 60");
        a.max(b)
    });
    let e = rt.start(&mut prog).expect_err("the combine panicked");
    drop(prog);
    assert!(
        matches!(e, Error::FilamentPanic { .. })
            && e.to_string().contains("no value may reach 60")
            && e.to_string().contains("reductions at its end"),
        "{e}"
    );
    // The runtime is still usable, and the reduction reduces as before.
    let mut got = 0;
    let mut again = Program::new();
    again
        .phase(
            PoolArray::block(&rt, 0..32, 2),
            |ctx, i| top.update(ctx, |t| t.max(i as u64)),
            |post| {
                got = post.get(&top);
                Control::Done
            },
        )
        .reduce_at_end(&top, Op::Max);
    rt.start(&mut again).expect("a second program");
    drop(again);
    assert!(got >= 31, "{got}");
}

/// `post.get` is a reduction's value only when every copy holds it: after
/// a reduce, or a set no filament updated since. Read after the
/// filaments updated it, unreduced, one copy would be another answer on
/// another configuration (a user's max-norm power iteration gave
/// different eigenvalues on 1×1, 1×2 and 2×1 so): the post-phase code
/// panics instead, and `start` says why.
#[test]
fn post_get_of_an_unreduced_reduction_is_an_error_not_one_copy() {
    for procs in [1, 2] {
        let rt = Runtime::new(Config::new().procs(procs).pin(false)).unwrap();
        let biggest = rt.reduction(0u64);
        let mut prog = Program::new();
        prog.phase(
            PoolArray::block(&rt, 0..100, 1),
            |ctx, i| biggest.update(ctx, |b| b.max(i as u64)),
            |post| {
                let _ = post.get(&biggest);
                Control::Done
            },
        );
        let e = rt
            .start(&mut prog)
            .expect_err("an unreduced get fails the program");
        drop(prog);
        match &e {
            Error::FilamentPanic {
                during, message, ..
            } => {
                assert!(during.contains("post-phase"), "{during}");
                assert!(
                    message.contains("post.get(&r) on a reduction its filaments updated")
                        && message.contains("reduce it first"),
                    "{message}"
                );
            }
            other => panic!("{procs} processors: expected the post-phase's panic, got {other:?}"),
        }

        // Reduced first, or only set: get is the value, on every configuration.
        rt.set(&biggest, 0).unwrap();
        let (mut reduced, mut handed) = (0, 0);
        let step = rt.reduction(0u64);
        let mut prog = Program::new();
        prog.phase(
            PoolArray::block(&rt, 0..100, 1),
            |ctx, i| biggest.update(ctx, |b| b.max(i as u64)),
            |post| {
                post.reduce(&biggest, Op::Max);
                reduced = post.get(&biggest);
                post.set(&step, 7);
                Control::Continue
            },
        );
        prog.phase(
            PoolArray::block(&rt, 0..10, 1),
            |ctx, _| assert_eq!(step.get(ctx), 7),
            |post| {
                handed = post.get(&step);
                Control::Done
            },
        );
        rt.start(&mut prog).expect("reduced, then set");
        drop(prog);
        assert_eq!((reduced, handed), (99, 7), "{procs} processors");
    }
}

/// After a fork-join run, `Runtime::reduce` combines every processor's
/// copy (a stolen branch's updates sit in its thief's), the same sum on 1
/// and 4 processors; `Runtime::get` before it is an error, after it the
/// value.
#[test]
fn runtime_reduce_combines_a_fork_join_runs_copies() {
    fn leaves(ctx: &hyfi_core::Ctx, r: &hyfi_core::Reduction<u64>, depth: u32) {
        if depth == 0 {
            r.update(ctx, |n| n + 1);
        } else {
            ctx.join(|c| leaves(c, r, depth - 1), |c| leaves(c, r, depth - 1));
        }
    }
    for procs in [1, 4] {
        let rt = Runtime::new(Config::new().procs(procs).pin(false)).unwrap();
        let count = rt.reduction(0u64);
        let deepest = rt.reduction(0u64);
        rt.run(|ctx| {
            leaves(ctx, &count, 12);
            deepest.update(ctx, |d| d.max(12));
        })
        .unwrap();
        assert!(
            matches!(rt.get(&count), Err(Error::Unreduced)),
            "{procs} processors: get before the reduce"
        );
        assert_eq!(
            rt.reduce(&count, Op::Sum).unwrap(),
            4096,
            "{procs} processors"
        );
        assert_eq!(rt.get(&count).unwrap(), 4096);
        assert_eq!(rt.reduce_with(&deepest, |a, b| a.max(b)).unwrap(), 12);
        // A second reduce of the reduced copies would count them again:
        // set the start afresh, as in a phase.
        rt.set(&count, 0).unwrap();
        assert_eq!(rt.get(&count).unwrap(), 0);
    }
}

/// The histogram of `hist_value(i)` over `0..n`, in 64 bins.
fn histogram_seq(n: usize) -> [u64; 64] {
    let mut h = [0u64; 64];
    (0..n).for_each(|i| h[hist_value(i)] += i as u64 % 5 + 1);
    h
}

fn hist_value(i: usize) -> usize {
    (i.wrapping_mul(2_654_435_761) >> 7) % 64
}

fn add_bins(mut a: [u64; 64], b: [u64; 64]) -> [u64; 64] {
    a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
    a
}

/// A histogram kept in a segment-local accumulator changed in place
/// (`LocalWith::update`), on one to three nodes of one or two processors
/// (the in-process node seam), gives the sequential loop's counts in every
/// sweep: each sweep's copies are reset by the post-phase code.
#[test]
fn local_with_update_builds_the_sequential_histogram_on_every_configuration() {
    let n = 20_000;
    let want = histogram_seq(n);
    for nodes in [1, 2, 3] {
        for procs in [1, 2] {
            for pools in [1, 3] {
                let links = hyfi_core::link::InProcess::connect(nodes);
                let handles: Vec<_> = links
                    .into_iter()
                    .map(|link| {
                        std::thread::spawn(move || {
                            use hyfi_core::layer::RuntimeExt;
                            let rt = Runtime::with_link(
                                Config::new().procs(procs).pin(false),
                                link as std::sync::Arc<dyn hyfi_core::NodeLink>,
                            )
                            .expect("runtime");
                            let hist = rt.reduction([0u64; 64]);
                            let mut got = Vec::new();
                            let mut prog = Program::new();
                            prog.phase_with(
                                PoolArray::block(&rt, 0..n, pools),
                                |ctx, _span| hist.local_with(ctx, [0; 64], add_bins),
                                |_ctx, i, h| h.update(|h| h[hist_value(i)] += i as u64 % 5 + 1),
                                |post| {
                                    got.push(post.reduce_with(&hist, add_bins));
                                    post.set(&hist, [0; 64]);
                                    if got.len() == 3 {
                                        Control::Done
                                    } else {
                                        Control::Continue
                                    }
                                },
                            );
                            rt.start(&mut prog).expect("program runs");
                            drop(prog);
                            got
                        })
                    })
                    .collect();
                for (node, h) in handles.into_iter().enumerate() {
                    let got = h.join().expect("node thread");
                    assert_eq!(
                        got,
                        vec![want; 3],
                        "node {node} of {nodes}, {procs} processors, {pools} pools each"
                    );
                }
            }
        }
    }
}
