//! Fork-join across nodes, with the examples as the harness: real
//! processes on loopback (the embedded launcher), medians over rounds, and
//! every ratio taken within one round (1×1 and 2×1 back to back, in
//! alternating order, so a burst of noise on the shared machine hits both).
//!
//! * `quad x6` (default size, ~1 s sequential), `quad spiky` (the
//!   unbalanced integrand), `fib(40)`: node 0's time in `run_distributed`
//!   on 1×1 and 2×1 (one processor per node), and the speedup;
//! * balance with the spiky integrand on 2×1: filaments executed by the
//!   busiest node over those of the least busy one;
//! * one cross-node steal round trip on loopback (request sent → answer
//!   installed), the mean of all requests of a spiky 2×1 run, as the
//!   nodes measure it (`RemoteStats::steal_wait_ns / steal_requests`).
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

/// Runs `exe args` on `nodes × 1`; returns every node's `fjstats:` fields.
fn run(exe: &Path, nodes: usize, args: &[&str]) -> Vec<Fields> {
    let out = Command::new(exe)
        .args(["--nodes", &nodes.to_string(), "--procs", "1", "--no-seq"])
        .args(args)
        .env("HYFI_PIN", "0")
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
    println!("| workload | 1x1 median | 2x1 median | speedup median [range] | target |");
    println!("|---|---|---|---|---|");
    let mut balance = Vec::new();
    let mut rtt = Vec::new();
    for (name, exe, args) in workloads {
        let (mut t1, mut t2, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
        for r in 0..rounds {
            let (one, two) = if r % 2 == 0 {
                let one = run(exe, 1, args);
                (one, run(exe, 2, args))
            } else {
                let two = run(exe, 2, args);
                (run(exe, 1, args), two)
            };
            let (a, b) = (one[0]["time_s"], two[0]["time_s"]);
            t1.push(a);
            t2.push(b);
            ratio.push(a / b);
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
            "| {name} | {:.3} s | {:.3} s | **{:.2}** {} | ≥ 1.9 |",
            median(t1),
            median(t2),
            median(ratio.clone()),
            range(&ratio)
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
