//! What a pruned fork costs: recursive `fib(n)` written as a user writes it,
//! against the plain recursion `fib_seq(n - 1) + fib_seq(n - 2)`, on 1 and
//! 2 processors of one node, pruning on (the default).
//!
//! * `seq`: the plain recursion (LLVM turns its second call into a loop);
//! * `join`: `ctx.join(|c| fib(c, n - 1), |c| fib(c, n - 2))`, the README's
//!   form, a closure on each side: every join tests for pruning;
//! * `join_remote`: `ctx.join_remote(|c| fib(c, n - 1), &FIB, n - 2)` with
//!   a [`RemoteFn`] of a `&Ctx` function (no pruned copy);
//! * `join_remote_fork`: the same, written generic over [`Fork`] and
//!   declared `with_pruned`, as `examples/fib.rs` is: small subtrees run as
//!   the plain recursion.
//!
//! The variants run interleaved, round after round, in one process, so a
//! busy machine slows them alike; each line gives the fastest and the
//! median round, the ratio of the fastest to the fastest `seq` and the
//! speedup, and the least CPU time the process used for one run (all its
//! threads) over the least for `seq`: the work a variant adds, which a
//! machine busy with other processes does not hide as it hides speedups.
//!
//! Run with `cargo bench --bench prune` (`PRUNE_N`, default 40;
//! `PRUNE_ROUNDS`, default 7).

#[allow(dead_code)] // the other benches use the rest of it
mod common;
use common::{config, fib_seq};
use std::hint::black_box;
use std::time::Instant;

use hyfi::{Ctx, Fork, RemoteFn, Runtime};

fn fib_join(ctx: &Ctx, n: u64) -> u64 {
    if n < 2 {
        return n;
    }
    let (a, b) = ctx.join(|c| fib_join(c, n - 1), |c| fib_join(c, n - 2));
    a + b
}

fn fib_remote(ctx: &Ctx, n: u64) -> u64 {
    if n < 2 {
        return n;
    }
    let (a, b) = ctx.join_remote(|c| fib_remote(c, n - 1), &FIB_REMOTE, n - 2);
    a + b
}
static FIB_REMOTE: RemoteFn<u64, u64> = RemoteFn::new("prune::fib_remote", fib_remote);

fn fib_fork(ctx: &impl Fork, n: u64) -> u64 {
    if n < 2 {
        return n;
    }
    let (a, b) = ctx.join_remote(|c| fib_fork(c, n - 1), &FIB_FORK, n - 2);
    a + b
}
static FIB_FORK: RemoteFn<u64, u64> =
    RemoteFn::new("prune::fib_fork", fib_fork).with_pruned(fib_fork);

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// CPU time used so far by the process's live threads, in seconds (Linux:
/// the first field of each `/proc/self/task/*/schedstat`, in ns; 0 where
/// there is no such file).
fn cpu_time() -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    let ns: u64 = dir
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    ns as f64 * 1e-9
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument selects nothing here.
    let n = env("PRUNE_N", 40);
    let rounds = env("PRUNE_ROUNDS", 7) as usize;
    FIB_REMOTE.register().expect("register");
    FIB_FORK.register().expect("register");
    let want = fib_seq(n);
    for procs in [1usize, 2] {
        let rt = Runtime::new(config(procs)).expect("hyfi runtime");
        let names = ["seq", "join", "join_remote", "join_remote_fork"];
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
        let mut cpus: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
        for _ in 0..rounds {
            for (k, (t, c)) in times.iter_mut().zip(&mut cpus).enumerate() {
                let nn = black_box(n);
                let cpu = cpu_time();
                let start = Instant::now();
                let got = match k {
                    0 => fib_seq(nn),
                    1 => rt.run(|ctx| fib_join(ctx, nn)).expect("runs"),
                    2 => rt.run(|ctx| fib_remote(ctx, nn)).expect("runs"),
                    _ => rt.run(|ctx| fib_fork(ctx, nn)).expect("runs"),
                };
                t.push(start.elapsed().as_secs_f64());
                c.push(cpu_time() - cpu);
                assert_eq!(got, want, "{}", names[k]);
            }
        }
        for t in times.iter_mut().chain(&mut cpus) {
            t.sort_by(f64::total_cmp);
        }
        let (seq, seq_cpu) = (times[0][0], cpus[0][0]);
        for ((name, t), c) in names.iter().zip(&times).zip(&cpus) {
            println!(
                "prune fib({n}) 1x{procs} {name:17} min {:.4} s  median {:.4} s  min/seq_min {:.3}  \
                 speedup {:.2}  cpu/seq_cpu {:.3}",
                t[0],
                t[t.len() / 2],
                t[0] / seq,
                seq / t[0],
                c[0] / seq_cpu,
            );
        }
    }
}
