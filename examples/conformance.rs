//! The transport conformance suite (`hyfi::conformance`) as a program:
//! run it on every node of a job, over whatever transport started it.
//!
//! ```sh
//! cargo run --release --example conformance -- --nodes 4 --procs 1          # all checks
//! cargo run --release --example conformance -- lose --victim 1 --nodes 3    # a node exits
//! HYFI_HEARTBEAT=2 cargo run --release --example conformance -- stop --victim 2 --nodes 3
//! HYFI_TRANSPORT=mpi mpirun -np 4 target/release/examples/conformance       # over MPI
//! ```
//!
//! Modes:
//!
//! * `all` (default): every check of `hyfi::conformance::run`; node 0
//!   prints `conformance: ok` and what was checked (`key=value` pairs),
//!   every other node `conformance: node i: ok`;
//! * `lose --victim K`: node K exits at once; every other node prints
//!   `conformance: node i: node K was lost, detected in … s: <the error>`;
//! * `stop --victim K`: node K stops itself (SIGSTOP); every other node
//!   prints `conformance: node i: node K was stopped, detected in … s: …`.
//!
//! A failed check prints `conformance: node i: FAILED: <what>` and exits 1;
//! so does a survivor of `lose` and `stop` after its line, since the job
//! did fail (the launcher's exit code says why: README, exit codes). A
//! configuration error exits 2.

#[path = "common/mod.rs"]
mod common;

use clap::{Parser, ValueEnum};
use hyfi::conformance::{self, Ending, Loss, Stop};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// Every check of the suite.
    All,
    /// The victim exits; the others must name it.
    Lose,
    /// The victim stops (SIGSTOP); the others must name it.
    Stop,
}

#[derive(Parser, Debug)]
#[command(about = "The conformance suite of hyfi's transports, on every node of a job")]
struct Args {
    /// What to check.
    #[arg(value_enum, default_value_t = Mode::All)]
    mode: Mode,
    /// The node that goes wrong (lose, stop).
    #[arg(long, default_value_t = 1)]
    victim: usize,
    /// Seed of the checks' random plans.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Runtime options (--nodes, --procs, --pin/--no-pin).
    #[command(flatten)]
    runtime: common::RuntimeArgs,
}

fn main() {
    let args = Args::parse();
    let rt = common::or_exit("conformance", args.runtime.start(|cfg| cfg));
    let me = rt.node();
    let t0 = std::time::Instant::now();
    let (ending, what) = match args.mode {
        Mode::All => match conformance::run(&rt, args.seed) {
            Ok(summary) => {
                if me == 0 {
                    println!(
                        "conformance: ok {summary} seconds={:.2}",
                        t0.elapsed().as_secs_f64()
                    );
                } else {
                    println!("conformance: node {me}: ok");
                }
                return;
            }
            Err(e) => failed(me, &e),
        },
        Mode::Lose => (conformance::lose_node(&rt, args.victim, Loss::Exit), "lost"),
        Mode::Stop => (
            conformance::stop_node(&rt, args.victim, Stop::Signal),
            "stopped",
        ),
    };
    match ending {
        Ok(Ending::Detected { error, after }) => {
            say(&format!(
                "conformance: node {me}: node {} was {what}, detected in {:.2} s: {error}",
                args.victim,
                after.as_secs_f64()
            ));
            // Under mpirun the first rank to exit ends the job: give the
            // other survivors, which may detect the loss a heartbeat check
            // later or through the first one's abort, the time to say it too
            // (well inside the launchers' 2 s grace).
            std::thread::sleep(std::time::Duration::from_millis(300));
            std::process::exit(1);
        }
        Ok(Ending::Victim) => {
            say(&format!(
                "conformance: node {me}: the victim, running again"
            ));
            std::process::exit(1);
        }
        Err(e) => failed(me, &e),
    }
}

fn failed(me: usize, e: &str) -> ! {
    say(&format!("conformance: node {me}: FAILED: {e}"));
    std::process::exit(1)
}

/// Prints a line to stderr in one write (`mpirun --tag-output` tags every
/// write, and `eprintln!` writes a formatted line in pieces).
fn say(line: &str) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}
