//! A node's signal set-up in miniature, used by `tests/signals.rs` with real
//! signals (paper §3.2).
//!
//! `signal_probe` (or `signal_probe serve`): blocks the asynchronous signals
//! first thing, starts a few "server threads" that report their signal mask
//! and keep busy, then the signal-handling thread. SIGUSR1 prints a
//! statistics line; SIGINT/SIGTERM/SIGHUP/SIGQUIT print the signal and exit
//! with 128 + its number; SIGPIPE/SIGALRM/SIGUSR2 change nothing.
//!
//! `signal_probe restart`: starts and stops the signal-handling thread three
//! times in a row, each time checking that it receives a SIGUSR1.
//!
//! Try it: `cargo run -p hyfi-net --example signal_probe`, then
//! `kill -USR1 <pid>` and `kill <pid>` from another shell.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use hyfi_net::signals::{
    block_async_signals, exit_code_for, SignalEvent, SignalThread, ASYNC_SIGNALS,
};
use nix::sys::signal::{kill, SigSet, Signal};
use nix::unistd::getpid;

const WORKERS: usize = 3;

/// The probe exits on its own after this, so a broken test leaves no orphan.
const LIFETIME: Duration = Duration::from_secs(60);

fn main() {
    // Before any other thread exists: everything below inherits the mask.
    if let Err(e) = block_async_signals() {
        eprintln!("signal_probe: {e}");
        std::process::exit(2);
    }
    let mode = std::env::args().nth(1).unwrap_or_else(|| "serve".into());
    match mode.as_str() {
        "serve" => serve(),
        "restart" => restart(),
        other => {
            eprintln!("signal_probe: unknown mode {other:?} (expected serve or restart)");
            std::process::exit(2);
        }
    }
}

/// "yes" if every asynchronous signal is blocked in the calling thread.
fn mask_report() -> String {
    match SigSet::thread_get_mask() {
        Ok(mask) => {
            let all = ASYNC_SIGNALS.iter().all(|&s| mask.contains(s));
            let segv = mask.contains(Signal::SIGSEGV);
            format!(
                "async blocked: {}; SIGSEGV blocked: {}",
                if all { "yes" } else { "no" },
                if segv { "yes" } else { "no" }
            )
        }
        Err(e) => format!("mask unknown: {e}"),
    }
}

fn serve() {
    let work = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    let (ready_tx, ready_rx) = mpsc::channel();
    for w in 0..WORKERS {
        let work = Arc::clone(&work);
        let ready = ready_tx.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("hyfi-worker-{w}"))
            .spawn(move || {
                println!("worker {w}: {}", mask_report());
                let _ = ready.send(());
                // Like a server thread: busy most of the time, so a signal
                // that could land here would land mid-computation.
                loop {
                    for i in 0..100_000u64 {
                        std::hint::black_box(i);
                    }
                    work.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(1));
                }
            });
        match spawned {
            Ok(h) => workers.push(h),
            Err(e) => {
                eprintln!("signal_probe: spawning worker {w}: {e}");
                std::process::exit(2);
            }
        }
    }
    for _ in 0..WORKERS {
        let _ = ready_rx.recv();
    }

    let stats = Arc::clone(&work);
    let signals = SignalThread::start(move |event| {
        let thread = std::thread::current();
        let on = thread.name().unwrap_or("<unnamed>");
        match event {
            SignalEvent::DumpStats => {
                println!(
                    "stats on thread {on}: {} work units done",
                    stats.load(Ordering::Relaxed)
                );
            }
            SignalEvent::Abort { signal, .. } => {
                let code = exit_code_for(signal);
                println!("abort: {signal} on thread {on}, exiting with {code}");
                std::process::exit(code);
            }
        }
    });
    let _signals = match signals {
        Ok(s) => s,
        Err(e) => {
            eprintln!("signal_probe: {e}");
            std::process::exit(2);
        }
    };
    println!("main: {}", mask_report());
    println!("ready pid {}", std::process::id());

    std::thread::sleep(LIFETIME);
    eprintln!("signal_probe: no abort signal within {LIFETIME:?}, giving up");
    std::process::exit(3);
}

fn restart() {
    let deadline = Instant::now() + Duration::from_secs(20);
    for round in 0..3 {
        let (tx, rx) = mpsc::channel();
        let signals = SignalThread::start(move |event| {
            let _ = tx.send(event);
        });
        let signals = match signals {
            Ok(s) => s,
            Err(e) => {
                eprintln!("signal_probe: round {round}: {e}");
                std::process::exit(2);
            }
        };
        if let Err(e) = kill(getpid(), Signal::SIGUSR1) {
            eprintln!("signal_probe: round {round}: kill: {e}");
            std::process::exit(2);
        }
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(SignalEvent::DumpStats) => println!("round {round}: DumpStats"),
            other => {
                eprintln!("signal_probe: round {round}: expected DumpStats, got {other:?}");
                std::process::exit(4);
            }
        }
        if let Err(e) = signals.stop() {
            eprintln!("signal_probe: round {round}: stop: {e}");
            std::process::exit(5);
        }
    }
    println!("restart ok");
}
