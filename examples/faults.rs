//! What a job does when one node goes wrong: a small SPMD program (a shared
//! vector, two programs of phases and a distributed fork-join run) that
//! misbehaves on one node on purpose, for the failure tests
//! (tests/failures.rs) and for a user who wants to see the messages.
//!
//! ```sh
//! cargo run --release --example faults -- --nodes 2                      # no fault: checks its answer
//! cargo run --release --example faults -- --nodes 2 --fault panic-filament --on 1
//! cargo run --release --example faults -- --nodes 2 --fault extra-alloc --on 1
//! ```
//!
//! Every fault ends the job on every node within seconds, each node
//! printing what happened on which node; without one, every node checks
//! the sums against a sequential computation.

#[path = "common/mod.rs"]
mod common;

use clap::{Parser, ValueEnum};
use hyfi::{Control, Dsm, Op, PoolArray, Program};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Fault {
    /// Nothing goes wrong.
    None,
    /// A filament panics (iteration 2 of the first program).
    PanicFilament,
    /// Post-phase code panics (iteration 2 of the first program).
    PanicPost,
    /// The program panics between its two programs (outside the runtime).
    PanicMain,
    /// The program returns an error between its two programs.
    ErrorReturn,
    /// The node makes one more shared allocation than the others.
    ExtraAlloc,
    /// Only this node calls `run_distributed`; the others end.
    DistributedAlone,
    /// Post-phase code says `Done` one iteration early on this node.
    PostDiverges,
    /// The node stops itself (SIGSTOP) between its two programs.
    Stop,
    /// The node exits (status 0) between its two programs, without ending
    /// its runtime.
    Exit,
    /// The node is killed by SIGKILL between its two programs (as
    /// `kill -9` would).
    Kill,
    /// The node sends itself SIGINT between its two programs (as `kill
    /// -INT` of that node, not of its launcher, would).
    Interrupt,
    /// A filament overflows its filthread stack (iteration 2 of the first
    /// program).
    Overflow,
    /// The node aborts (SIGABRT) between its two programs, as an
    /// out-of-memory does.
    Abort,
}

#[derive(Parser, Debug)]
#[command(about = "A job in which one node goes wrong on purpose")]
struct Args {
    /// What goes wrong.
    #[arg(long, value_enum, default_value_t = Fault::None)]
    fault: Fault,
    /// On which node.
    #[arg(long, default_value_t = 1)]
    on: usize,
    /// Elements of the shared vector.
    #[arg(long, default_value_t = 20_000)]
    n: usize,
    /// Iterations of each program.
    #[arg(long, default_value_t = 5)]
    iterations: u64,
    /// Runtime options (--nodes, --procs, --pin/--no-pin).
    #[command(flatten)]
    runtime: common::RuntimeArgs,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    // A configuration error exits 2 (hyfi::Error::exit_code), as in every
    // example; `?` from `main` would exit 1.
    let rt = common::or_exit("faults", args.runtime.start(|cfg| cfg));
    let me = rt.node();
    let faulty = args.fault != Fault::None && me == args.on;
    let fault = |f: Fault| faulty && args.fault == f;
    let dsm = Dsm::new(&rt)?;
    let x = dsm.vec::<f64>(args.n).zeroed()?;
    let sum = rt.reduction(0.0f64);
    let n = args.n;

    // Program 1: x[i] += i + 1 each iteration; the sum of x after it.
    let mut sums = Vec::new();
    let mut prog = Program::new();
    prog.phase(
        PoolArray::block(&rt, 0..n, 1),
        |ctx, i| {
            if fault(Fault::PanicFilament) && ctx.iteration() == 2 && i == n - 1 {
                panic!("filament {i} gave up (a fault injected on node {me})");
            }
            if fault(Fault::Overflow) && ctx.iteration() == 2 && i == n - 1 {
                std::hint::black_box(recurse(std::hint::black_box(1 << 40)));
            }
            let v = x.get(i) + (i + 1) as f64;
            x.set(i, v);
            sum.fold(ctx, Op::Sum, v);
        },
        |post| {
            sums.push(post.reduce(&sum, Op::Sum));
            post.set(&sum, 0.0);
            if fault(Fault::PanicPost) && post.iteration() == 2 {
                panic!("post-phase code gave up (a fault injected on node {me})");
            }
            let last = if fault(Fault::PostDiverges) {
                args.iterations - 2
            } else {
                args.iterations - 1
            };
            if post.iteration() == last {
                Control::Done
            } else {
                Control::Continue
            }
        },
    );
    rt.start(&mut prog)?;
    drop(prog);

    match args.fault {
        _ if !faulty => {}
        Fault::PanicMain => panic!("the program of node {me} gave up between its programs"),
        Fault::ErrorReturn => {
            return Err(format!("node {me} found something wrong between its programs").into())
        }
        Fault::ExtraAlloc => {
            let _extra = dsm.vec::<f64>(2000).zeroed()?;
        }
        Fault::Stop => {
            // SAFETY: raise() with a valid signal number has no memory effects.
            unsafe { libc::raise(libc::SIGSTOP) };
        }
        Fault::Exit => std::process::exit(0),
        // SAFETY: raise() with a valid signal number has no memory effects.
        Fault::Kill => unsafe {
            libc::raise(libc::SIGKILL);
        },
        Fault::Interrupt => {
            // SAFETY: as above; the node's signal thread takes it.
            unsafe { libc::kill(libc::getpid(), libc::SIGINT) };
            // That thread ends the job; the program waits for it here
            // rather than going on (on a loaded machine it went on through
            // both programs before the signal was handled, and the job
            // ended well).
            std::thread::sleep(std::time::Duration::from_secs(30));
            return Err("the SIGINT this node sent itself was not handled in 30 s".into());
        }
        Fault::Abort => std::process::abort(),
        _ => {}
    }

    // A distributed fork-join run: the sum of 0..n by halving.
    if fault(Fault::DistributedAlone) || args.fault != Fault::DistributedAlone {
        let total = rt.run_distributed(|ctx| tree_sum(ctx, 0, n as u64))?;
        let want = (n as u64) * (n as u64 - 1) / 2;
        if total != want {
            return Err(format!("run_distributed summed {total}, expected {want}").into());
        }
    }
    if args.fault == Fault::DistributedAlone {
        // The nodes that did not call it end here.
        println!("node {me}: skipped run_distributed");
        return Ok(());
    }

    // Program 2: read x back; its sum.
    let mut total = 0.0;
    let mut prog = Program::new();
    prog.phase(
        PoolArray::block(&rt, 0..n, 1),
        |ctx, i| sum.fold(ctx, Op::Sum, x.get(i)),
        |post| {
            total = post.reduce(&sum, Op::Sum);
            Control::Done
        },
    );
    rt.start(&mut prog)?;
    drop(prog);

    // Independent answer: the same updates, sequentially.
    let iters = args.iterations as f64;
    let want: Vec<f64> = (1..=args.iterations)
        .map(|k| (0..n).map(|i| k as f64 * (i + 1) as f64).sum())
        .collect();
    let want_total: f64 = (0..n).map(|i| iters * (i + 1) as f64).sum();
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs();
    let ok = sums.len() == want.len()
        && sums.iter().zip(&want).all(|(a, b)| close(*a, *b))
        && close(total, want_total);
    if !ok {
        return Err(format!(
            "node {me}: sums {sums:?} total {total}, expected {want:?} total {want_total}"
        )
        .into());
    }
    println!("node {me}: check OK (sums and total equal the sequential ones)");
    Ok(())
}

/// Recursion that never ends: a filthread stack overflow.
fn recurse(depth: u64) -> u64 {
    let pad = std::hint::black_box([depth; 64]);
    if depth == 0 {
        return pad[3];
    }
    recurse(depth - 1) + pad[7]
}

fn tree_sum(ctx: &hyfi::Ctx, lo: u64, hi: u64) -> u64 {
    if hi - lo <= 1000 {
        return (lo..hi).sum();
    }
    let mid = lo + (hi - lo) / 2;
    let (a, b) = ctx.join(|c| tree_sum(c, lo, mid), |c| tree_sum(c, mid, hi));
    a + b
}
