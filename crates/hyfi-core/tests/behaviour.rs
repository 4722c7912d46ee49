//! What the single-node runtime promises, each checked against an
//! independent answer: suspension and overlap, deep recursion, stealing,
//! sequences of phases, reductions, pinning, statistics.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use hyfi_core::filthread::{self, Waker};
use hyfi_core::{Config, Control, Ctx, Op, PoolArray, Program, Runtime};

fn rt(p: usize) -> Runtime {
    Runtime::new(Config::new().procs(p).pin(false)).expect("runtime")
}

#[test]
fn a_suspended_filthread_lets_the_other_pools_run() {
    // One processor, two pools. Pool 0's filament waits for an outside event
    // that happens only after pool 1 has run: if suspending blocked the
    // server thread, pool 1 could never run (the helper gives up after 10 s).
    let rt = rt(1);
    let pool1_ran = AtomicBool::new(false);
    let order = Mutex::new(Vec::new());
    let (tx, rx) = mpsc::channel::<Waker>();
    let helper = std::thread::spawn({
        let pool1_ran = &pool1_ran as *const AtomicBool as usize;
        move || {
            let w = rx.recv().unwrap();
            // SAFETY (test): the AtomicBool outlives this thread (joined below).
            let flag = unsafe { &*(pool1_ran as *const AtomicBool) };
            let t = Instant::now();
            while !flag.load(Ordering::SeqCst) && t.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(1));
            }
            w.wake();
        }
    });
    let mut pools = PoolArray::<usize>::new(&rt, 2);
    pools.pool_k(0, 0).push(0);
    pools.pool_k(0, 1).push(1);
    let mut prog = Program::new();
    prog.phase(
        pools,
        |_, i| {
            if i == 0 {
                let tx = tx.clone();
                filthread::suspend(|w| {
                    tx.send(w).unwrap();
                    true
                });
                order.lock().unwrap().push("pool 0 resumed");
            } else {
                order.lock().unwrap().push("pool 1 ran");
                pool1_ran.store(true, Ordering::SeqCst);
            }
        },
        |_| Control::Done,
    );
    rt.start(&mut prog).unwrap();
    helper.join().unwrap();
    assert_eq!(*order.lock().unwrap(), vec!["pool 1 ran", "pool 0 resumed"]);
    assert_eq!(rt.stats().total().suspensions, 1);
}

#[test]
fn suspend_off_a_filthread_blocks_the_thread() {
    let (tx, rx) = mpsc::channel::<Waker>();
    let h = std::thread::spawn(move || rx.recv().unwrap().wake());
    assert!(!filthread::in_filthread());
    filthread::suspend(|w| {
        tx.send(w).unwrap();
        true
    });
    h.join().unwrap();
    // A register that reports "already done" does not suspend at all.
    filthread::suspend(|_| false);
}

#[test]
fn many_filthreads_suspend_and_resume_on_each_processor() {
    // 2 processors × 8 pools; every filament suspends until a waker thread
    // wakes it, in reverse order of arrival. All must complete.
    let rt = rt(2);
    let (tx, rx) = mpsc::channel::<Waker>();
    let waker_thread = std::thread::spawn(move || {
        let mut got = Vec::new();
        while got.len() < 16 * 5 {
            match rx.recv_timeout(Duration::from_secs(10)) {
                Ok(w) => got.push(w),
                Err(_) => break,
            }
            if got.len() % 16 == 0 {
                for w in got.drain(..).rev() {
                    w.wake();
                }
            }
        }
        for w in got {
            w.wake();
        }
    });
    let done = AtomicUsize::new(0);
    let mut pools = PoolArray::<usize>::new(&rt, 8);
    for p in 0..2 {
        for k in 0..8 {
            pools.pool_k(p, k).push(p * 8 + k);
        }
    }
    let mut prog = Program::new();
    prog.phase(
        pools,
        |ctx, _| {
            assert!(filthread::in_filthread());
            let proc_before = ctx.proc();
            let tx = tx.clone();
            filthread::suspend(|w| {
                tx.send(w).unwrap();
                true
            });
            // A filthread never moves to another server thread.
            assert_eq!(hyfi_core_current_proc(ctx), proc_before);
            done.fetch_add(1, Ordering::SeqCst);
        },
        |post| {
            if post.iteration() == 4 {
                Control::Done
            } else {
                Control::Continue
            }
        },
    );
    rt.start(&mut prog).unwrap();
    drop(prog);
    drop(tx);
    waker_thread.join().unwrap();
    assert_eq!(done.load(Ordering::SeqCst), 16 * 5);
}

fn hyfi_core_current_proc(ctx: &Ctx) -> usize {
    // The OS thread's name carries the processor index.
    let name = std::thread::current().name().unwrap_or("").to_string();
    assert_eq!(name, format!("hyfi-server-{}", ctx.proc()));
    ctx.proc()
}

fn chain(ctx: &Ctx, n: u64) -> u64 {
    if n == 0 {
        return 0;
    }
    let (a, b) = ctx.join(|c| chain(c, n - 1), |_| 1u64);
    a + b
}

#[test]
fn deep_recursion_through_joins_with_default_stacks() {
    for p in [1, 2] {
        for prune in [true, false] {
            let rt = Runtime::new(Config::new().procs(p).pin(false).prune(prune)).unwrap();
            assert_eq!(
                rt.run(|c| chain(c, 100_000)).unwrap(),
                100_000,
                "p={p} prune={prune}"
            );
        }
    }
}

fn fib(ctx: &Ctx, n: u64) -> u64 {
    if n < 2 {
        return n;
    }
    let (a, b) = ctx.join(|c| fib(c, n - 1), |c| fib(c, n - 2));
    a + b
}

fn fib_iter(n: u64) -> u64 {
    let (mut a, mut b) = (0u64, 1u64);
    for _ in 0..n {
        (a, b) = (b, a + b);
    }
    a
}

#[test]
fn fork_join_steals_and_suspends_on_two_processors() {
    let rt = Runtime::new(Config::new().procs(2).pin(false).prune(false)).unwrap();
    // On a loaded machine the second server thread may not get a CPU during
    // one short run; repeat (bounded) until it has taken part. fib(28)
    // without pruning lasts ~10 ms, long enough for a parked thread to wake
    // and steal (with fib(24), ~1 ms, 200 runs beside a build once ended
    // without a single steal).
    let mut runs = 0u64;
    for _ in 0..100 {
        assert_eq!(rt.run(|c| fib(c, 28)).unwrap(), fib_iter(28));
        runs += 1;
        let s = rt.stats();
        if s.total().steals > 0 && s.procs.iter().all(|p| p.forks > 0) {
            break;
        }
    }
    let s = rt.stats();
    assert!(s.total().steals > 0, "{s}");
    assert!(s.procs.iter().all(|p| p.forks > 0), "{s}");
    // With pruning off every internal node of the recursion forks.
    assert_eq!(s.total().forks, runs * (fib_iter(29) - 1), "{s}");
}

#[test]
fn pruning_keeps_forks_few_when_everyone_is_busy() {
    let rt = Runtime::new(Config::new().procs(1).pin(false)).unwrap();
    assert_eq!(rt.run(|c| fib(c, 25)).unwrap(), fib_iter(25));
    assert_eq!(
        rt.stats().total().forks,
        0,
        "one processor: every fork pruned"
    );
    let rt = Runtime::new(Config::new().procs(2).pin(false)).unwrap();
    assert_eq!(rt.run(|c| fib(c, 25)).unwrap(), fib_iter(25));
    let forks = rt.stats().total().forks;
    assert!(forks < 75_025 / 10, "pruning left {forks} real forks");
}

#[test]
fn join_n_keeps_order_and_nests() {
    let rt = rt(2);
    let v = rt
        .run(|c| {
            c.join_n(300, |c, i| {
                c.join_n(i % 7, |_, k| k).iter().sum::<usize>() + i
            })
        })
        .unwrap();
    let want: Vec<usize> = (0..300).map(|i| (0..i % 7).sum::<usize>() + i).collect();
    assert_eq!(v, want);
    assert!(rt.run(|c| c.join_n(0, |_, i| i)).unwrap().is_empty());
}

#[test]
fn sequences_of_phases_run_in_turn() {
    // LU-like: phase 0 then phase 1, repeated; Done from phase 1 after 4 rounds.
    for p in [1, 2] {
        let rt = rt(p);
        let log = Mutex::new(Vec::new());
        let count = rt.reduction(0u64);
        let mut prog = Program::new();
        prog.phase(
            PoolArray::block(&rt, 0..10, 1),
            |ctx, _| count.update(ctx, |c| c + 1),
            |post| {
                let n = post.reduce(&count, Op::Sum);
                log.lock().unwrap().push((0, post.iteration(), n));
                post.set(&count, 0);
                Control::Continue
            },
        );
        prog.phase(
            PoolArray::block(&rt, 0..7, 2),
            |ctx, i| count.update(ctx, |c| c + i as u64),
            |post| {
                let n = post.reduce(&count, Op::Sum);
                log.lock().unwrap().push((1, post.iteration(), n));
                post.set(&count, 0);
                if post.iteration() == 3 {
                    Control::Done
                } else {
                    Control::Continue
                }
            },
        );
        rt.start(&mut prog).unwrap();
        drop(prog);
        let want: Vec<(usize, u64, u64)> = (0..4).flat_map(|k| [(0, k, 10), (1, k, 21)]).collect();
        assert_eq!(*log.lock().unwrap(), want);
        let st = rt.stats().total();
        assert_eq!(st.filaments, 4 * (10 + 7));
        assert_eq!(st.phases, 8 * p as u64);
    }
}

#[test]
fn ctx_iteration_counts_completed_executions_of_the_phase() {
    let rt = rt(2);
    let seen = Mutex::new(Vec::new());
    let mut prog = Program::new();
    prog.phase(
        PoolArray::block(&rt, 0..2, 1),
        |ctx, i| seen.lock().unwrap().push((ctx.iteration(), i)),
        |post| {
            if post.iteration() == 2 {
                Control::Done
            } else {
                Control::Continue
            }
        },
    );
    rt.start(&mut prog).unwrap();
    drop(prog);
    let mut s = seen.into_inner().unwrap();
    s.sort();
    assert_eq!(s, vec![(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]);
}

#[test]
fn reductions_all_ops_and_custom() {
    let rt = rt(2);
    let sum = rt.reduction(0.0f64);
    let prod = rt.reduction(1i64);
    let max = rt.reduction(i32::MIN);
    let min = rt.reduction(f32::INFINITY);
    let pair = rt.reduction([0u32, 0u32]);
    let got = Mutex::new(None);
    let mut prog = Program::new();
    prog.phase(
        PoolArray::block(&rt, 1..21, 1),
        |ctx, i| {
            sum.update(ctx, |s| s + i as f64 * 0.1);
            prod.update(ctx, |p| p * (i as i64 % 3 + 1));
            max.update(ctx, |m| m.max(i as i32 * 7 % 23));
            min.update(ctx, |m| m.min(i as f32 - 5.5));
            pair.update(ctx, |[a, b]| [a + i as u32, b.max(i as u32)]);
        },
        |post| {
            *got.lock().unwrap() = Some((
                post.reduce(&sum, Op::Sum),
                post.reduce(&prod, Op::Product),
                post.reduce(&max, Op::Max),
                post.reduce(&min, Op::Min),
                post.reduce_with(&pair, |[a, b], [c, d]| [a + c, b.max(d)]),
            ));
            Control::Done
        },
    );
    rt.start(&mut prog).unwrap();
    drop(prog);
    let (s, p, mx, mn, pr) = got.into_inner().unwrap().unwrap();
    assert!((s - (1..21).map(|i| i as f64 * 0.1).sum::<f64>()).abs() < 1e-12);
    assert_eq!(p, (1..21).map(|i| i as i64 % 3 + 1).product::<i64>());
    assert_eq!(mx, (1..21).map(|i| i * 7 % 23).max().unwrap());
    assert_eq!(mn, -4.5);
    assert_eq!(pr, [210, 20]);
    // After a reduce every private copy holds the result.
    assert_eq!(rt.get(&max).unwrap(), mx);
    rt.set(&max, 5).unwrap();
    assert_eq!(rt.get(&max).unwrap(), 5);
}

#[test]
fn float_reductions_reproduce_bit_for_bit_per_configuration() {
    let run = |p: usize| {
        let rt = rt(p);
        let s = rt.reduction(0.0f64);
        let out = AtomicU64::new(0);
        let mut prog = Program::new();
        prog.phase(
            PoolArray::block(&rt, 0..100_000, 3),
            |ctx, i| s.update(ctx, |v| v + 1.0 / (1.0 + i as f64)),
            |post| {
                out.store(post.reduce(&s, Op::Sum).to_bits(), Ordering::Relaxed);
                Control::Done
            },
        );
        rt.start(&mut prog).unwrap();
        drop(prog);
        out.into_inner()
    };
    for p in [1, 2] {
        let first = run(p);
        for _ in 0..5 {
            assert_eq!(run(p), first, "p={p}");
        }
    }
}

#[test]
fn pinned_server_threads_run_on_their_own_cpu() {
    let cpus = nix_cpus();
    let rt = Runtime::new(Config::new().procs(cpus.len().min(2)).pin(true)).unwrap();
    let got = Mutex::new(Vec::new());
    let mut prog = Program::new();
    prog.phase(
        PoolArray::block(&rt, 0..rt.procs(), 1),
        |ctx, _| got.lock().unwrap().push((ctx.proc(), nix_cpus())),
        |_| Control::Done,
    );
    rt.start(&mut prog).unwrap();
    drop(prog);
    let mut g = got.into_inner().unwrap();
    g.sort();
    for (p, set) in g {
        assert_eq!(set, vec![cpus[p]], "processor {p}");
    }
}

fn nix_cpus() -> Vec<usize> {
    use nix::sched::{sched_getaffinity, CpuSet};
    let set = sched_getaffinity(nix::unistd::Pid::from_raw(0)).unwrap();
    (0..CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap())
        .collect()
}

#[test]
fn architecture_queries() {
    let rt = rt(2);
    assert_eq!((rt.num_nodes(), rt.node(), rt.procs_per_node()), (1, 0, 2));
    let seen = rt
        .run(|c| {
            (
                c.num_nodes(),
                c.node(),
                c.procs_per_node(),
                c.global_proc() < 2,
            )
        })
        .unwrap();
    assert_eq!(seen, (1, 0, 2, true));
}

/// A filament that sleeps gives up its CPU: the processor's voluntary
/// context switches (`ProcStats::gave_up`) count it, for the run they
/// happened in; `reset_stats` clears them.
#[test]
fn a_filament_that_sleeps_is_counted_as_giving_up_its_cpu() {
    let rt = rt(1);
    rt.run(|_| {
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(1));
        }
    })
    .unwrap();
    let t = rt.stats().total();
    // Each sleep blocks the thread; the run's own waits may add more.
    assert!(t.gave_up >= 3, "{t:?}");
    rt.reset_stats();
    assert_eq!(rt.stats().total().gave_up, 0);
    assert_eq!(rt.stats().total().switched_out, 0);
}
