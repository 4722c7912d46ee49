//! Fork-join across nodes, with the examples as the harness: real
//! processes on loopback (the embedded launcher), medians over rounds, and
//! every ratio taken within one round (1×1 and 2×1 back to back, in
//! alternating order, so a burst of noise on the shared machine hits both).
//!
//! * `quad x6` (default size, ~1 s sequential), `quad spiky` (the
//!   unbalanced integrand), `fib(40)`: node 0's time in `run_distributed`
//!   on 1×1 and 2×1 (one processor per node), and the speedup; and, for
//!   context, 1×2 (one process, two processors) in the same round: the
//!   VM's two vCPUs sometimes run both at reduced speed, which shows in
//!   1×2 as much as in 2×1;
//! * balance with the spiky integrand on 2×1: filaments executed by the
//!   busiest node over those of the least busy one;
//! * one cross-node steal round trip on loopback (request sent → answer
//!   installed), the mean of all requests of a spiky 2×1 run, as the
//!   nodes measure it (`RemoteStats::steal_wait_ns / steal_requests`).
//!
//! The machine is shared (2 cores): a round during which other processes
//! used more than [`FOREIGN_LIMIT`] of CPU time (from `/proc/stat`, minus
//! what this bench's own children used) is discarded and run again, and
//! the count of discarded rounds is printed.
//!
//! Run with `cargo bench --bench fj_nodes` (`-- --rounds 11` for more).
//! It builds the examples itself (release).

use std::path::{Path, PathBuf};
use std::process::Command;

fn examples_dir() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "--release",
            "-p",
            "hyfi",
            "--example",
            "quad",
            "--example",
            "fib",
            "--manifest-path",
            concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"),
        ])
        .status()
        .expect("running cargo build --examples");
    assert!(status.success(), "building the examples failed");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/target")));
    target.join("release").join("examples")
}

/// One node's `fjstats:` fields.
type Fields = std::collections::BTreeMap<String, f64>;

/// Runs `exe args` on `nodes × procs`; returns every node's `fjstats:` fields.
fn run(exe: &Path, nodes: usize, procs: usize, args: &[&str]) -> Vec<Fields> {
    let out = Command::new(exe)
        .args([
            "--nodes",
            &nodes.to_string(),
            "--procs",
            &procs.to_string(),
            "--no-seq",
        ])
        .args(args)
        // Default settings (pinned; local nodes on disjoint CPUs).
        .env_remove("HYFI_PIN")
        .env_remove("HYFI_NODES")
        .output()
        .expect("running an example");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{} {args:?} on {nodes} nodes failed:\n{text}\n{}",
        exe.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut nodes_stats: Vec<(usize, Fields)> = text
        .lines()
        .filter_map(|l| l.split_once("fjstats: ").map(|(_, rest)| rest))
        .map(|rest| {
            let f: Fields = rest
                .split_whitespace()
                .filter_map(|w| w.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.parse().unwrap_or(f64::NAN)))
                .collect();
            (f["node"] as usize, f)
        })
        .collect();
    nodes_stats.sort_by_key(|(n, _)| *n);
    assert_eq!(nodes_stats.len(), nodes, "{text}");
    nodes_stats.into_iter().map(|(_, f)| f).collect()
}

/// CPU seconds other processes may use during one round before it is redone.
const FOREIGN_LIMIT: f64 = 0.1;

/// Clock ticks per second of `/proc` (USER_HZ; 100 on Linux).
const HZ: f64 = 100.0;

/// CPU time (s) used so far by the whole machine (all but idle and iowait).
fn machine_busy() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(cpu) = stat.lines().next() else {
        return 0.0;
    };
    let v: Vec<f64> = cpu
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: f64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0.0) + v.get(4).copied().unwrap_or(0.0);
    (total - idle) / HZ
}

/// CPU time (s) used by this process's finished children (and theirs).
fn children_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name: state is field 3; cutime, cstime are 16, 17.
    let rest = stat.rsplit_once(") ").map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    (f.get(13).copied().unwrap_or(0.0) + f.get(14).copied().unwrap_or(0.0)) / HZ
}

/// Runs `round` until it runs without foreign CPU load (at most 10 tries;
/// the last try is kept whatever happened). Returns its value and the
/// number of discarded tries.
fn quiet<T>(mut round: impl FnMut() -> T) -> (T, usize) {
    let mut discarded = 0;
    loop {
        let (b0, c0) = (machine_busy(), children_cpu());
        let t = round();
        let foreign = (machine_busy() - b0) - (children_cpu() - c0);
        if foreign <= FOREIGN_LIMIT || discarded == 9 {
            return (t, discarded);
        }
        discarded += 1;
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

fn range(v: &[f64]) -> String {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("[{lo:.2}–{hi:.2}]")
}

fn main() {
    let mut rounds = 7usize;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        if a == "--rounds" {
            rounds = it.next().and_then(|r| r.parse().ok()).expect("--rounds N");
        }
        // Other arguments (cargo bench passes `--bench`) are ignored.
    }
    let dir = examples_dir();
    let (quad, fib) = (dir.join("quad"), dir.join("fib"));
    let workloads: [(&str, &Path, &[&str]); 3] = [
        ("quad x6 [1,70] eps 1.5e-3", &quad, &["--func", "x6"]),
        ("quad spiky eps 2e-11", &quad, &["--func", "spiky"]),
        ("fib(40)", &fib, &["--n", "40"]),
    ];
    println!("fork-join across nodes: {rounds} rounds, node 0's run time, 1x1 vs 2x1 (1 processor per node)\n");
    println!(
        "| workload | 1x1 median | 2x1 median | speedup 2x1/1x1 median [range] | target | 1x2 median | 2x1 time / 1x2 time [range] | rounds redone (machine busy) |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut balance = Vec::new();
    let mut rtt = Vec::new();
    for (name, exe, args) in workloads {
        let (mut t1, mut t2, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
        let (mut t12, mut vs12) = (Vec::new(), Vec::new());
        let mut redone = 0;
        for r in 0..rounds {
            let ((one, two, local2), d) = quiet(|| {
                if r % 2 == 0 {
                    let one = run(exe, 1, 1, args);
                    let local2 = run(exe, 1, 2, args);
                    (one, run(exe, 2, 1, args), local2)
                } else {
                    let two = run(exe, 2, 1, args);
                    let local2 = run(exe, 1, 2, args);
                    (run(exe, 1, 1, args), two, local2)
                }
            });
            redone += d;
            let (a, b, c) = (one[0]["time_s"], two[0]["time_s"], local2[0]["time_s"]);
            t1.push(a);
            t2.push(b);
            t12.push(c);
            ratio.push(a / b);
            vs12.push(b / c);
            if name.contains("spiky") {
                let (x, y) = (two[0]["filaments"], two[1]["filaments"]);
                balance.push(x.max(y) / x.min(y));
                let req: f64 = two.iter().map(|n| n["remote_tries"]).sum();
                let wait: f64 = two
                    .iter()
                    .map(|n| n["steal_rtt_us"] * n["remote_tries"])
                    .sum();
                if req > 0.0 {
                    rtt.push(wait / req);
                }
            }
        }
        println!(
            "| {name} | {:.3} s | {:.3} s | **{:.2}** {} | ≥ 1.9 | {:.3} s | {:.2} {} | {redone} |",
            median(t1),
            median(t2),
            median(ratio.clone()),
            range(&ratio),
            median(t12),
            median(vs12.clone()),
            range(&vs12)
        );
    }
    println!();
    println!(
        "balance, quad spiky on 2x1: busiest / least busy node's filaments: median {:.3} {} (target ≤ 1.2)",
        median(balance.clone()),
        range(&balance)
    );
    println!(
        "cross-node steal round trip (request sent → answer installed), mean per run: median {:.1} us {}",
        median(rtt.clone()),
        range(&rtt)
    );
}
