//! Failure probe for fork-join across nodes (used by `tests/forkjoin_nodes.rs`).
//!
//! The root forks one serializable filament; start-up distribution sends the
//! first fork to slot 1, which is node 1 on any multi-node run, so the
//! filament runs remotely for sure.
//!
//! ```text
//! cargo run --release --example fj_probe -- --nodes 2 --mode panic     # panics on node 1
//! cargo run --release --example fj_probe -- --nodes 2 --mode unknown   # node 1 did not register it
//! cargo run --release --example fj_probe -- --nodes 2 --mode ok        # returns 7 * 7
//! cargo run --release --example fj_probe -- --nodes 2 --mode many      # join_remote_n over 0..64
//! ```
//!
//! Every node prints `result: ...` or `error: ...` (the error the run
//! returned on that node) and exits 0 or 1.

#[path = "common/mod.rs"]
mod common;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use hyfi::{Ctx, RemoteFn};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// The filament returns its argument squared.
    Ok,
    /// The filament panics when it runs on a node other than 0.
    Panic,
    /// Only node 0 registers the filament's function.
    Unknown,
    /// `join_remote_n` of a filament reading shared state, over 0..64:
    /// returns the sum of `x * x + offset` and prints the nodes that ran one.
    Many,
}

#[derive(Parser, Debug)]
#[command(about = "Fork-join across nodes: a remote panic, an unknown function")]
struct Args {
    #[arg(long, value_enum, default_value_t = Mode::Ok)]
    mode: Mode,
    /// Distributed runs one after the other (each must return the same).
    #[arg(long, default_value_t = 1)]
    runs: usize,
    #[command(flatten)]
    runtime: common::RuntimeArgs,
}

fn square(_ctx: &Ctx, x: u64) -> u64 {
    x * x
}

fn square_or_panic(ctx: &Ctx, x: u64) -> u64 {
    if ctx.node() != 0 {
        panic!("boom: filament {x} panicked on node {}", ctx.node());
    }
    x * x
}

/// What `Mode::Many`'s filaments read, shared on every node.
struct Offset(u64);

/// `x * x` plus the shared offset, and the node that computed it.
fn square_where(ctx: &Ctx, x: u64) -> (u64, usize) {
    (x * x + ctx.shared::<Offset>().0, ctx.node())
}

static SQUARE_WHERE: RemoteFn<u64, (u64, usize)> =
    RemoteFn::new("fj_probe::square_where", square_where);
static SQUARE: RemoteFn<u64, u64> = RemoteFn::new("fj_probe::square", square);
static BOOM: RemoteFn<u64, u64> = RemoteFn::new("fj_probe::boom", square_or_panic);

fn main() -> ExitCode {
    let args = Args::parse();
    let rt = common::or_exit("fj_probe", args.runtime.start(|cfg| cfg));
    let node = rt.node();
    if args.mode != Mode::Unknown || node == 0 {
        common::or_exit("fj_probe", SQUARE.register());
    }
    common::or_exit("fj_probe", BOOM.register());
    if args.mode == Mode::Many {
        common::or_exit("fj_probe", SQUARE_WHERE.register());
        rt.share(Offset(1000));
        for run in 0..args.runs {
            match rt.run_distributed(|ctx| ctx.join_remote_n(&SQUARE_WHERE, (0..64).collect())) {
                Ok(v) => {
                    let sum: u64 = v.iter().map(|r| r.0).sum();
                    let mut nodes: Vec<usize> = v.iter().map(|r| r.1).collect();
                    nodes.sort_unstable();
                    nodes.dedup();
                    println!("result: run {run}: {sum}");
                    println!("many: run {run}: ran on nodes {nodes:?}");
                }
                Err(e) => {
                    println!("error: node {node}: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        return ExitCode::SUCCESS;
    }
    let f = if args.mode == Mode::Panic {
        &BOOM
    } else {
        &SQUARE
    };
    for run in 0..args.runs {
        match rt.run_distributed(|ctx| {
            let (a, b) = ctx.join_remote(|_| 1u64, f, 7);
            a + b
        }) {
            Ok(v) => println!("result: run {run}: {v}"),
            Err(e) => {
                println!("error: node {node}: {e}");
                eprintln!("fj_probe: node {node}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let r = rt.stats().remote;
    println!(
        "moved: node {node} in {} out {}",
        r.filaments_in, r.filaments_out
    );
    ExitCode::SUCCESS
}
