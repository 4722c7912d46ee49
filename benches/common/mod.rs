//! Kernels and set-up shared by the criterion benches (not a bench itself).

use hyfi::{Config, Ctx, Runtime};

/// A runtime configuration for `procs` processors. This machine has 2
/// cores: pin whenever `procs <= 2`.
pub fn config(procs: usize) -> Config {
    Config::new().procs(procs).pin(procs <= 2)
}

/// A runtime of `procs` processors (see [`config`]).
#[allow(dead_code)] // not every bench builds its runtimes this way
pub fn runtime(procs: usize) -> Runtime {
    Runtime::new(config(procs)).expect("hyfi runtime")
}

/// The peer: a rayon pool of `threads` threads.
pub fn rayon_pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("rayon pool")
}

/// Recursive Fibonacci, the baseline.
pub fn fib_seq(n: u64) -> u64 {
    if n < 2 {
        return n;
    }
    fib_seq(n - 1) + fib_seq(n - 2)
}

/// Recursive Fibonacci with fork-join filaments.
pub fn fib_hyfi(ctx: &Ctx, n: u64) -> u64 {
    if n < 2 {
        return n;
    }
    let (a, b) = ctx.join(|c| fib_hyfi(c, n - 1), |c| fib_hyfi(c, n - 2));
    a + b
}

/// Recursive Fibonacci with `rayon::join`, the peer.
pub fn fib_rayon(n: u64) -> u64 {
    if n < 2 {
        return n;
    }
    let (a, b) = rayon::join(|| fib_rayon(n - 1), || fib_rayon(n - 2));
    a + b
}
