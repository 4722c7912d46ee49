//! Within-node balancing (`Config::chunks`): a processor with nothing left
//! takes chunks from the back of another processor's pools; every filament
//! still runs once, and reductions give the same bits however the chunks
//! were shared out. Each test checks counts and results against a
//! sequential computation, never timings.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hyfi_core::{Config, Control, Op, PoolArray, Program, Runtime};

/// How long a filament waits for the other processor before the test
/// fails (a bound, so a broken balancer is a red test, not a hang).
const PATIENCE: Duration = Duration::from_secs(60);

/// Waits (in a filament, blocking its processor) until `flag` is set;
/// fails with `what` after [`PATIENCE`].
fn wait_for(flag: &AtomicBool, what: &str) {
    let t0 = Instant::now();
    while !flag.load(Ordering::SeqCst) {
        assert!(t0.elapsed() < PATIENCE, "{what} in {PATIENCE:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn value(i: usize) -> f64 {
    1.0 / (i as f64 + 1.0) + (i % 7) as f64 * 1e-3
}

/// The sum a reduction folded per filament gives when `n` filaments on
/// one pool are cut into `chunks` chunks: each chunk's copy folds its
/// filaments from 0.0, and the copies are combined in chunk order (then
/// the other processor's untouched copy, 0.0).
fn chunked_sum(n: usize, chunks: usize) -> f64 {
    let mut total: Option<f64> = None;
    for c in 0..chunks {
        let part = hyfi_core::block(0..n, chunks, c).fold(0.0, |a, i| a + value(i));
        total = Some(match total {
            None => part,
            Some(t) => t + part,
        });
    }
    total.unwrap() + 0.0
}

/// Processor 0 holds every filament and its first one waits until
/// processor 1 has run a filament: processor 1 can only have taken it
/// from processor 0's pool. Every filament runs once, processor 1 counts
/// what it took, and the sum has the bits of the chunk-order fold.
#[test]
fn an_idle_processor_takes_chunks_from_a_busy_ones_pool() {
    let n = 64;
    let rt = Runtime::new(Config::new().procs(2).pin(false).chunks(8)).unwrap();
    let sum = rt.reduction(0.0f64);
    let ran = (0..n).map(|_| AtomicUsize::new(0)).collect::<Vec<_>>();
    let on_one = AtomicU64::new(0);
    let other_ran = AtomicBool::new(false);
    let mut total = None;
    let mut pools = PoolArray::<usize>::new(&rt, 1);
    pools.pool(0).push_range(0..n);
    let mut prog = Program::new();
    prog.phase(
        pools,
        |ctx, i| {
            if ctx.proc() == 1 {
                on_one.fetch_add(1, Ordering::SeqCst);
                other_ran.store(true, Ordering::SeqCst);
            }
            if i == 0 {
                wait_for(
                    &other_ran,
                    "processor 1 took no chunk of processor 0's pool",
                );
            }
            ran[i].fetch_add(1, Ordering::SeqCst);
            sum.fold(ctx, Op::Sum, value(i));
        },
        |post| {
            total = Some(post.reduce(&sum, Op::Sum));
            Control::Done
        },
    );
    rt.start(&mut prog).unwrap();
    drop(prog);
    assert!(ran.iter().all(|r| r.load(Ordering::SeqCst) == 1));
    let stats = rt.stats();
    let on_one = on_one.load(Ordering::SeqCst);
    assert!(on_one > 0);
    assert_eq!(stats.procs[0].chunks_stolen, 0, "{stats}");
    assert!(stats.procs[1].chunks_stolen >= 1, "{stats}");
    // Whole chunks of 8 filaments (all 8 if processor 1 came first).
    assert_eq!(on_one, 8 * stats.procs[1].chunks_stolen, "{stats}");
    assert!(stats.procs[1].chunks_stolen <= 8, "{stats}");
    assert_eq!(total.unwrap().to_bits(), chunked_sum(n, 8).to_bits());
}

/// With one chunk per pool (`Config::chunks(1)`) pools stay on their
/// processors, as the paper's: processor 1 has no pool and runs nothing,
/// though processor 0's first pool waits long enough for it to take the
/// second.
#[test]
fn one_chunk_per_pool_keeps_pools_on_their_processors() {
    let rt = Runtime::new(Config::new().procs(2).pin(false).chunks(1)).unwrap();
    let on_one = AtomicU64::new(0);
    let mut pools = PoolArray::<usize>::new(&rt, 2);
    pools.pool_k(0, 0).push_range(0..4);
    pools.pool_k(0, 1).push_range(4..8);
    let mut prog = Program::new();
    prog.phase(
        pools,
        |ctx, i| {
            if ctx.proc() == 1 {
                on_one.fetch_add(1, Ordering::SeqCst);
            }
            if i == 0 {
                std::thread::sleep(Duration::from_millis(50));
            }
        },
        |_| Control::Done,
    );
    rt.start(&mut prog).unwrap();
    drop(prog);
    assert_eq!(on_one.load(Ordering::SeqCst), 0);
    assert_eq!(rt.stats().total().chunks_stolen, 0);
}

/// Filaments of very unequal cost, on three processors with two pools
/// each, over many executions of the phase: which processor runs which
/// chunk changes from one execution to the next (a processor that gets a
/// slow chunk falls behind, and in each execution processor 0's first
/// filament waits until another processor has run a filament of
/// processor 0's pools), but a floating-point sum folded per filament and
/// one folded through segment-local accumulators each keep their bits,
/// and match a run with the same chunks on one processor.
#[test]
fn sums_keep_their_bits_however_the_chunks_are_shared_out() {
    let n = 600;
    let spin = |i: usize, round: u64| {
        // Filaments of round-dependent cost: 0 to ~50 µs.
        let cost = (i as u64 * 2654435761 + round * 40503) % 97;
        if cost > 90 {
            std::thread::sleep(Duration::from_micros(50));
        }
    };
    let run = |procs: usize, rounds: u64| -> (Vec<u64>, Vec<u64>, u64) {
        let rt = Runtime::new(Config::new().procs(procs).pin(false).chunks(6)).unwrap();
        let (a, b) = (rt.reduction(0.0f64), rt.reduction(0.0f64));
        // Set when a processor runs a filament of another's pool.
        let taken = AtomicBool::new(false);
        let owner = |i: usize| i * 6 / n * procs / 6;
        let got = Mutex::new((Vec::new(), Vec::new()));
        // The same pools on either runtime: 3 × 2 blocks, as a 3-processor
        // node places them, all given to processor 0 when there is one.
        let mut pools = PoolArray::<usize>::new(&rt, 6 / procs);
        for q in 0..6 {
            pools
                .pool_k(q * procs / 6, q % (6 / procs))
                .push_range(hyfi_core::block(0..n, 6, q));
        }
        let mut prog = Program::new();
        prog.phase_with(
            pools,
            |ctx, _span| a.local(ctx, Op::Sum),
            |ctx, i, acc| {
                if ctx.proc() != owner(i) {
                    taken.store(true, Ordering::SeqCst);
                }
                if i == 0 && procs > 1 {
                    wait_for(&taken, "no chunk was taken");
                }
                spin(i, ctx.iteration());
                acc.fold(value(i));
                b.fold(ctx, Op::Sum, value(i) * 3.0);
            },
            |post| {
                let mut g = got.lock().unwrap();
                g.0.push(post.reduce(&a, Op::Sum).to_bits());
                g.1.push(post.reduce(&b, Op::Sum).to_bits());
                post.set(&a, 0.0);
                post.set(&b, 0.0);
                taken.store(false, Ordering::SeqCst);
                if post.iteration() + 1 == rounds {
                    Control::Done
                } else {
                    Control::Continue
                }
            },
        );
        rt.start(&mut prog).unwrap();
        drop(prog);
        let stolen = rt.stats().total().chunks_stolen;
        let (x, y) = got.into_inner().unwrap();
        (x, y, stolen)
    };
    let rounds = 12;
    let (a3, b3, stolen3) = run(3, rounds);
    assert!(
        stolen3 >= rounds,
        "a chunk taken in every execution: {stolen3}"
    );
    let (a1, b1, stolen1) = run(1, 1);
    assert_eq!(stolen1, 0, "one processor has nobody to take from");
    for k in 0..a3.len() {
        assert_eq!(a3[k], a1[0], "execution {k}: segment-local sums");
        assert_eq!(b3[k], b1[0], "execution {k}: sums folded per filament");
    }
}
