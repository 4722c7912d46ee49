//! The MPI transport (`--features mpi`, `HYFI_TRANSPORT=mpi` under
//! `mpirun`) against the TCP one, with real `mpirun` jobs:
//!
//! 1. The paper's kernels (Jacobi, LU, matmul, quad, fib) give the same
//!    bits over MPI as over TCP on 2×1, 4×1 and 2×2 (oversubscribed on a
//!    small machine), every node checking itself against the sequential
//!    code.
//! 2. Failures over MPI end the job everywhere with the cause: a panic in a
//!    filament, an error the program returns, SPMD divergence, a stopped
//!    rank, a killed rank.
//! 3. `HYFI_TRANSPORT` is checked: a bad value, or `mpi` without an MPI
//!    launcher, is a clear error.
//!
//! Without the feature this file compiles to one test that says so: CI
//! builds with the feature (`.ci/run`), so it runs there.

#![cfg_attr(not(feature = "mpi"), allow(dead_code, unused_imports))]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{bins, command, mpirun, Job};

/// The longest one job may take here (they take a second or two).
const JOB_BOUND: Duration = Duration::from_secs(60);

/// `mpirun -np nodes exe args`, over `transport`, with `env` set on every
/// rank.
fn mpirun_cmd(
    nodes: usize,
    transport: &str,
    env: &[(&str, &str)],
    exe: &Path,
    args: &[&str],
) -> Command {
    let mut cmd = command(&mpirun());
    cmd.args(["--oversubscribe", "--allow-run-as-root", "-np"])
        .arg(nodes.to_string())
        .args(["-x", "HYFI_PIN=0", "-x"])
        .arg(format!("HYFI_TRANSPORT={transport}"));
    for (k, v) in env {
        cmd.arg("-x").arg(format!("{k}={v}"));
    }
    cmd.arg(exe)
        .args(args)
        // Open MPI 4 wants an ssh it can find even on one host (local ranks
        // never use it).
        .env("OMPI_MCA_plm_rsh_agent", "false");
    cmd
}

/// The result lines of a successful run of `exe` on `nodes`×`procs`, over
/// hyfi's own launcher (`tcp`) or `mpirun` over MPI: every `OK` line (each
/// node prints one, with the kernel's fingerprint where it has one) and
/// the `value` lines, sorted.
fn results(transport: &str, nodes: usize, procs: usize, exe: &Path, args: &[&str]) -> Vec<String> {
    let p = procs.to_string();
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--procs", &p]);
    let n = nodes.to_string();
    let mut job = Job::with_bound(
        &format!(
            "{} {args:?} {nodes}x{procs} over {transport}",
            exe.display()
        ),
        JOB_BOUND,
    );
    let cmd = if transport == "tcp" {
        all.extend(["--nodes", &n]);
        let mut c = command(exe);
        c.args(&all);
        c
    } else {
        mpirun_cmd(nodes, transport, &[], exe, &all)
    };
    job.spawn(transport, cmd);
    let st = job.wait(0, JOB_BOUND);
    if !st.success() {
        job.fail(&format!("exited with {st}"));
    }
    // hyfi's launcher prefixes each node's lines with `[node k] `; mpirun
    // does not.
    let mut lines: Vec<String> = job
        .stdout(0)
        .iter()
        .map(|l| match l.strip_prefix("[node ") {
            Some(rest) => rest
                .split_once("] ")
                .map_or(l.clone(), |(_, t)| t.to_owned()),
            None => l.clone(),
        })
        .filter(|l| l.starts_with("OK") || l.starts_with("value ") || l.starts_with("result: "))
        .collect();
    lines.sort();
    let oks = lines.iter().filter(|l| l.starts_with("OK")).count();
    if oks < nodes {
        job.fail(&format!("{oks} OK lines from {nodes} nodes: {lines:?}"));
    }
    lines
}

#[cfg(feature = "mpi")]
#[test]
fn kernels_give_the_same_bits_over_mpi_as_over_tcp() {
    let b = bins();
    let kernels: [(&str, &Path, &[&str]); 7] = [
        (
            "jacobi",
            &b.jacobi,
            &["--n", "130", "--iters", "30", "--eps", "0"],
        ),
        (
            "jacobi per row",
            &b.jacobi,
            &["--n", "130", "--iters", "30", "--eps", "0", "--per-row"],
        ),
        ("lu", &b.lu, &["--n", "96"]),
        ("matmul", &b.matmul, &["--n", "80", "--per-row"]),
        ("quad", &b.quad, &[]),
        ("fib", &b.fib, &["--n", "22"]),
        // Halos of 18 pages pushed in 73 KiB `REL`s: over MPI, frames past
        // the pieced size, received whole into the buffer pool's buffers.
        ("heat3d", &b.heat3d, &["--n", "96", "--steps", "6"]),
    ];
    for (nodes, procs) in [(2, 1), (4, 1), (2, 2)] {
        for (name, exe, args) in kernels {
            let tcp = results("tcp", nodes, procs, exe, args);
            let mpi = results("mpi", nodes, procs, exe, args);
            assert_eq!(tcp, mpi, "{name} on {nodes}x{procs}: TCP and MPI differ");
        }
    }
}

/// Runs the faults example over MPI on 2 ranks with `fault` on node 1 (as
/// tests/failures.rs does over TCP):
/// mpirun's exit status and everything printed.
#[cfg(feature = "mpi")]
fn fault_over_mpi(
    fault: &str,
    extra_env: &[(&str, &str)],
) -> (std::process::ExitStatus, String, Duration) {
    let args = ["--fault", fault, "--on", "1", "--procs", "1"];
    let cmd = mpirun_cmd(2, "mpi", extra_env, &bins().faults, &args);
    let mut job = Job::with_bound(&format!("faults {fault} over MPI"), JOB_BOUND);
    let t = Instant::now();
    job.spawn("mpirun", cmd);
    let st = job.wait(0, JOB_BOUND);
    let took = t.elapsed();
    let text = format!("{}\n{}", job.stdout(0).join("\n"), job.stderr(0));
    (st, text, took)
}

#[cfg(feature = "mpi")]
#[test]
fn failures_over_mpi_end_the_job_with_the_cause() {
    // (fault, what every run must print, exit code)
    let cases: [(&str, &[&str], i32); 6] = [
        ("panic-filament", &["node 1", "panicked"], 1),
        ("error-return", &["node 1"], 1),
        (
            "extra-alloc",
            &["nodes took different steps", "made shared allocation"],
            1,
        ),
        // The diverging step rides on a release's frame (held back, as
        // every phase's step is), or goes alone when the node waits.
        (
            "post-diverges",
            &[
                "nodes took different steps",
                "node 0 ran phase 0 (execution 5) of program #1",
                "node 1 called run_distributed (#1)",
            ],
            1,
        ),
        ("stop", &["node 1 failed first: stopped answering"], 3),
        (
            "kill",
            &["rank 1", "signal 9", "stopped by the MPI launcher"],
            137,
        ),
    ];
    for (fault, words, code) in cases {
        let env: &[(&str, &str)] = if fault == "stop" {
            &[("HYFI_HEARTBEAT", "1")]
        } else {
            &[]
        };
        let (st, text, took) = fault_over_mpi(fault, env);
        assert!(!st.success(), "{fault}: the job succeeded:\n{text}");
        for w in words {
            assert!(text.contains(w), "{fault}: no {w:?} in:\n{text}");
        }
        assert_eq!(
            st.code(),
            Some(code),
            "{fault}: exit status {st} (took {took:?}):\n{text}"
        );
        assert!(
            !text.contains("check OK"),
            "{fault}: a node went on:\n{text}"
        );
    }
}

#[cfg(feature = "mpi")]
#[test]
fn the_transport_setting_is_checked() {
    // A value that is none.
    let mut cmd = command(&bins().montecarlo);
    cmd.env("HYFI_TRANSPORT", "carrier-pigeon")
        .args(["--procs", "1"]);
    let out = cmd.output().expect("montecarlo");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("HYFI_TRANSPORT") && err.contains("tcp or mpi"),
        "{err}"
    );
    // MPI without an MPI launcher.
    let mut cmd = command(&bins().montecarlo);
    cmd.env("HYFI_TRANSPORT", "mpi").args(["--procs", "1"]);
    let out = cmd.output().expect("montecarlo");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("mpirun -np N"), "{err}");
}

#[cfg(not(feature = "mpi"))]
#[test]
fn the_mpi_transport_needs_the_feature() {
    // Built without `--features mpi`: MPI is refused with the remedy.
    let mut cmd = command(&bins().montecarlo);
    cmd.env("HYFI_TRANSPORT", "mpi").args(["--procs", "1"]);
    let out = cmd.output().expect("montecarlo");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--features mpi"), "{err}");
}
