//! A computing processor polls the transport's busy progress function
//! between pieces of its pool (`link::set_busy_progress`), and the pieces
//! run every filament once, in order, each piece bound as a segment. Its
//! own test binary: the progress function is one per process.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use hyfi_core::link::set_busy_progress;
use hyfi_core::{Config, Control, Op, PoolArray, Program, Runtime};

static POLLS: AtomicU64 = AtomicU64::new(0);

fn count_poll() -> bool {
    POLLS.fetch_add(1, Ordering::Relaxed);
    false
}

#[test]
fn a_long_pool_runs_in_pieces_with_polls_between_and_every_filament_once() {
    // Set before the runtime's processors start, as a transport does.
    assert!(set_busy_progress(count_poll));
    assert!(!set_busy_progress(count_poll), "one function per process");
    let n = 20_000usize;
    for procs in [1, 2] {
        let rt = Runtime::new(Config::new().procs(procs).pin(false)).unwrap();
        let seen = Mutex::new(vec![0u32; n]);
        let binds = AtomicU64::new(0);
        let sum = rt.reduction(0u64);
        let mut total = 0;
        POLLS.store(0, Ordering::Relaxed);
        let mut prog = Program::new();
        prog.phase_with(
            PoolArray::block(&rt, 0..n, 1),
            |ctx, span| {
                binds.fetch_add(1, Ordering::Relaxed);
                (span.rows(), sum.local(ctx, Op::Sum))
            },
            |_ctx, i, (rows, acc)| {
                // Each filament runs inside the piece it was bound with.
                assert!(rows.contains(&i), "filament {i} outside its piece {rows:?}");
                // Some work, so that pieces are many filaments long.
                let mut x = i as u64;
                for _ in 0..50 {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
                std::hint::black_box(x);
                acc.fold(i as u64);
                seen.lock().unwrap()[i] += 1;
            },
            |post| {
                total = post.reduce(&sum, Op::Sum);
                Control::Done
            },
        );
        rt.start(&mut prog).unwrap();
        drop(prog);
        let seen = seen.into_inner().unwrap();
        assert!(
            seen.iter().all(|&c| c == 1),
            "{procs} procs: a filament ran twice or never"
        );
        assert_eq!(total, (n as u64 - 1) * n as u64 / 2, "{procs} procs");
        // The first countdown is 10 filaments (the rate it assumes before it
        // has measured one): a pool of thousands is polled, whatever the
        // machine's speed, and runs in more pieces than it has segments.
        let polls = POLLS.load(Ordering::Relaxed);
        assert!(polls >= procs as u64, "{procs} procs: {polls} polls");
        assert!(
            binds.load(Ordering::Relaxed) > procs as u64,
            "{procs} procs: {} binds, one per pool: no pieces",
            binds.load(Ordering::Relaxed)
        );
    }
}
