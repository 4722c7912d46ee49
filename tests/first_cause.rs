//! The first cause wins: under the embedded launcher, every fault of
//! `examples/faults.rs` on node 1 gives the same launcher first line, the
//! same exit code on every run, and one cause line per node that names
//! each node once. Settings are refused before any node starts, with one
//! code whichever program. Real processes; every wait is bounded.

mod common;

use std::time::Duration;

use common::*;

/// Runs `faults --nodes 2 --procs 1 args` under its embedded launcher
/// (with `env`); the launcher's status and its stderr.
fn launched(what: &str, exe: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> Job {
    let mut job = Job::with_bound(what, Duration::from_secs(60));
    let mut cmd = command(exe);
    cmd.args(args).env("HYFI_HEARTBEAT", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    job.spawn("launcher", cmd);
    job
}

/// The launcher's own lines (the nodes' are prefixed `[node i] `).
fn launcher_lines(err: &str) -> Vec<&str> {
    err.lines()
        .filter(|l| l.starts_with("hyfi launcher:"))
        .collect()
}

/// Node `rank`'s lines, without their prefix.
fn node_lines(err: &str, rank: usize) -> Vec<String> {
    let prefix = format!("[node {rank}] ");
    err.lines()
        .filter_map(|l| l.strip_prefix(&prefix).map(str::to_string))
        .collect()
}

/// Fault `fault` on node 1 of 2, `runs` times: the launcher's first line
/// starts with `first`, its code is `code`, node 0 says `node 0: node 1
/// failed first: ` + `zero_says` once, and no line names a node twice.
fn fault_gives(fault: &str, runs: usize, first: &str, code: i32, zero_says: &str) {
    for run in 0..runs {
        let what = format!("--fault {fault}, run {run}");
        let mut job = launched(
            &what,
            &bins().faults,
            &[
                "--nodes", "2", "--procs", "1", "--fault", fault, "--on", "1",
            ],
            &[],
        );
        let st = job.wait(0, Duration::from_secs(60));
        let err = job.stderr(0);
        let ours = launcher_lines(&err);
        let want = format!("hyfi launcher: node 1 failed first: {first}");
        assert!(
            ours.first().is_some_and(|l| l.starts_with(&want)),
            "the launcher's first line should start with {want:?}\n{}",
            job.dump()
        );
        assert!(
            (st.code() == Some(code)),
            "the launcher should exit {code}, not {st}\n{}",
            job.dump()
        );
        assert!(
            ours.iter()
                .any(|l| l.starts_with("hyfi launcher: node 0 ended because of it")),
            "node 0 is not reported as ended because of node 1\n{}",
            job.dump()
        );
        let cause = format!("node 0: node 1 failed first: {zero_says}");
        let said = node_lines(&err, 0)
            .iter()
            .filter(|l| l.contains(&cause))
            .count();
        assert!(
            (said == 1),
            "node 0 says {cause:?} {said} times, not once\n{}",
            job.dump()
        );
        for rank in 0..2 {
            let twice = format!("node {rank}: node {rank}:");
            let named_twice = node_lines(&err, rank)
                .into_iter()
                .find(|l| l.contains(&twice));
            assert_eq!(
                named_twice,
                None,
                "a line names node {rank} twice\n{}",
                job.dump()
            );
        }
    }
}

#[test]
fn a_node_killed_by_sigkill_is_named_first_with_code_137() {
    fault_gives("kill", 5, "was killed by signal 9 (SIGKILL)", 137, "lost (");
}

#[test]
fn a_stack_overflow_reaches_every_node_and_exits_134() {
    let overflow = "filthread stack overflow on processor";
    fault_gives("overflow", 5, overflow, 134, overflow);
    // Node 1 says it once, however many processors overflow.
    let mut job = launched(
        "overflow on 2 processors",
        &bins().faults,
        &[
            "--nodes", "2", "--procs", "2", "--fault", "overflow", "--on", "1",
        ],
        &[],
    );
    job.wait(0, Duration::from_secs(60));
    let err = job.stderr(0);
    let n = node_lines(&err, 1)
        .iter()
        .filter(|l| l.contains(overflow))
        .count();
    assert!(
        (n == 1),
        "node 1 printed the overflow {n} times\n{}",
        job.dump()
    );
}

#[test]
fn a_signal_sent_to_a_node_not_its_launcher_is_that_nodes_cause() {
    fault_gives(
        "interrupt",
        5,
        "received SIGINT from process",
        130,
        "received SIGINT",
    );
}

#[test]
fn a_panicking_filament_is_the_cause_with_code_1() {
    fault_gives(
        "panic-filament",
        5,
        "a filament panicked on processor 0",
        1,
        "a filament panicked on processor 0",
    );
}

#[test]
fn an_abort_is_told_before_the_node_dies() {
    fault_gives("abort", 3, "aborted (SIGABRT)", 134, "aborted (SIGABRT)");
}

#[test]
fn a_stopped_node_is_named_first_with_code_3() {
    // HYFI_HEARTBEAT=1 (see `launched`): node 0 loses node 1 after 1 s.
    fault_gives(
        "stop",
        3,
        "it stopped answering node 0",
        3,
        "it stopped answering",
    );
}

#[test]
fn bad_settings_are_refused_before_any_node_starts_with_code_2() {
    let bad: [(&str, &str); 5] = [
        ("HYFI_PROCS", "0"),
        ("HYFI_TIMEOUT", "1e9"),
        ("HYFI_HEARTBEAT", "abc"),
        ("HYFI_DSM_SIZE", "1"),
        ("HYFI_STACK_SIZE", "1K"),
    ];
    for (var, value) in bad {
        for exe in [&bins().jacobi, &bins().fib, &bins().faults] {
            let what = format!("{var}={value} {}", exe.display());
            let mut job = launched(&what, exe, &["--nodes", "2"], &[(var, value)]);
            let st = job.wait(0, Duration::from_secs(60));
            let err = job.stderr(0);
            assert!(
                (st.code() == Some(2)),
                "should exit 2 (configuration), not {st}\n{}",
                job.dump()
            );
            assert!(!(err.contains("[node ")), "a node started\n{}", job.dump());
            assert!(
                err.contains(var) && err.lines().count() == 1,
                "should say one line naming {var}\n{}",
                job.dump()
            );
        }
    }
}

#[test]
fn hyfi_run_with_a_program_that_is_not_there_exits_127_and_says_so() {
    let mut job = Job::with_bound("hyfi-run of nothing", Duration::from_secs(30));
    let mut cmd = command(&bins().hyfi_run);
    cmd.args(["-n", "2", "./no/such/program"]);
    job.spawn("hyfi-run", cmd);
    let st = job.wait(0, Duration::from_secs(30));
    let err = job.stderr(0);
    assert!(
        (st.code() == Some(127)),
        "should exit 127, not {st}\n{}",
        job.dump()
    );
    assert!(
        !err.contains("fewer nodes") && err.contains("no/such/program"),
        "should name the program, and not blame the host's limits\n{}",
        job.dump()
    );
}
