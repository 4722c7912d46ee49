//! The launchers' limits, with real processes: the embedded launcher
//! (`HYFI_NODES=N` on `montecarlo`) and `hyfi-run -n N` refuse a node count
//! the host cannot hold before starting anything; a signal during start-up
//! stops it and exits 128 + the signal; stopping a node stops what it
//! started (its process group); and the stderr of many nodes failing the
//! same way stays in proportion to what they said, not to their number.
//!
//! Nodes are marked with an environment variable unique to the test
//! (`HYFI_TEST_MARK`, inherited from the launcher), so "no node remains" is
//! checked by reading `/proc/*/environ`, whatever the node's program is.
//! Every wait is bounded; the asserts are about outcomes, never speed. Each
//! test gets the binaries first: building them must not eat into a job's
//! bound.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::*;

/// Live (not zombie) processes whose environment holds `HYFI_TEST_MARK=mark`.
fn marked(mark: &str) -> Vec<u32> {
    let needle = format!("HYFI_TEST_MARK={mark}");
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .map(|env| env.split(|&b| b == 0).any(|v| v == needle.as_bytes()))
                .unwrap_or(false)
                && alive(pid)
        })
        .collect()
}

/// Is `pid` a process that has not ended (zombies have ended)?
fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next());
    !matches!(state, Some('Z' | 'X') | None)
}

/// Waits (bounded) until `f` holds; returns whether it did.
fn eventually(within: Duration, f: impl Fn() -> bool) -> bool {
    let until = Instant::now() + within;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `hyfi-run -n nodes -- program args…`, marked with `mark`.
fn hyfi_run(nodes: usize, mark: &str, program: &[&str]) -> Command {
    let mut cmd = command(&bins().hyfi_run);
    cmd.args(["-n", &nodes.to_string(), "--"])
        .args(program)
        .env("HYFI_TEST_MARK", mark);
    cmd
}

/// Each failed check names the job and shows its output.
fn check(job: &Job, ok: bool, what: &str) {
    if !ok {
        job.fail(what);
    }
}

#[test]
fn a_node_count_beyond_the_bound_is_refused_before_any_node_starts() {
    bins(); // built (once) before any job\'s time starts
    let mark = unique("too-many");
    let mut embedded = command(&bins().montecarlo);
    embedded
        .env("HYFI_NODES", "100000")
        .env("HYFI_TEST_MARK", &mark);
    let run = hyfi_run(100_000, &mark, &[bins().montecarlo.to_str().unwrap()]);
    for (name, cmd) in [("HYFI_NODES=100000", embedded), ("hyfi-run -n 100000", run)] {
        let mut job = Job::new(name);
        let i = job.spawn("launcher", cmd);
        let st = job.wait(i, BOUND);
        check(
            &job,
            st.code() == Some(2),
            "should exit with status 2 (configuration)",
        );
        let err = job.stderr(i);
        check(
            &job,
            err.contains("cannot start 100000 nodes")
                && err.contains("at most 4096")
                && err.contains("HYFI_MAX_LOCAL_NODES"),
            "the refusal should name the count, the bound and how to change it",
        );
        check(
            &job,
            !err.contains("[node ") && job.stdout(i).is_empty(),
            "no node should have run",
        );
        check(&job, marked(&mark).is_empty(), "a node process exists");
    }
}

#[test]
fn the_bound_can_be_lowered_and_is_then_enforced() {
    bins(); // built (once) before any job\'s time starts
            // HYFI_MAX_LOCAL_NODES=3: 4 nodes refused, 3 run.
    let mark = unique("lowered");
    let mut job = Job::new("HYFI_MAX_LOCAL_NODES=3");
    let mut cmd = hyfi_run(4, &mark, &["true"]);
    cmd.env("HYFI_MAX_LOCAL_NODES", "3");
    let i = job.spawn("hyfi-run -n 4", cmd);
    let st = job.wait(i, BOUND);
    check(
        &job,
        st.code() == Some(2),
        "4 > 3 nodes should be refused (exit 2, configuration)",
    );
    check(&job, job.stderr(i).contains("at most 3"), "no bound named");
    let mut cmd = hyfi_run(3, &mark, &["true"]);
    cmd.env("HYFI_MAX_LOCAL_NODES", "3");
    let i = job.spawn("hyfi-run -n 3", cmd);
    let st = job.wait(i, BOUND);
    check(&job, st.success(), "3 nodes should run");
}

#[test]
fn sigint_while_nodes_start_stops_the_start_up_and_exits_130() {
    bins(); // built (once) before any job\'s time starts
            // Many nodes that stay up; SIGINT as soon as the first one speaks, most
            // likely while the launcher is still starting the others (if start-up
            // won the race, the same outcome is required of the running job).
    let nodes = 400;
    let mark = unique("sigint-start");
    let mut job = Job::new("SIGINT during start-up");
    let i = job.spawn(
        "hyfi-run",
        hyfi_run(nodes, &mark, &["sh", "-c", "echo up; exec sleep 1000"]),
    );
    job.wait_line(i, "a node's first line", |l| l.ends_with("] up"));
    check(
        &job,
        send_signal(&job.pid(i).to_string(), "INT"),
        "kill -INT",
    );
    let st = job.wait(i, BOUND);
    check(&job, st.code() == Some(130), "the launcher should exit 130");
    let err = job.stderr(i);
    if let Some(l) = err.lines().find(|l| l.contains("starting no more")) {
        check(
            &job,
            l.contains(&format!("of {nodes}")),
            "bad start-up message",
        );
    }
    check(
        &job,
        eventually(BOUND, || marked(&mark).is_empty()),
        "node processes remain after the launcher exited",
    );
    // The stopped nodes are summarised, not listed one per line.
    let reports = err
        .lines()
        .filter(|l| l.starts_with("hyfi launcher: node "))
        .count();
    check(&job, reports <= 8, "more than 8 per-node reports");
}

#[test]
fn sigint_to_a_running_job_exits_130_from_both_launchers() {
    bins(); // built (once) before any job\'s time starts
    let args = ["--samples", "2000", "--phases", "400", "--sleep-ms", "50"];
    let mark = unique("sigint-run");
    let mut embedded = command(&bins().montecarlo);
    embedded
        .args(args)
        .env("HYFI_NODES", "2")
        .env("HYFI_TEST_MARK", &mark);
    let mut run = hyfi_run(2, &mark, &[bins().montecarlo.to_str().unwrap()]);
    run.args(args);
    for (name, cmd) in [("HYFI_NODES=2", embedded), ("hyfi-run -n 2", run)] {
        let mut job = Job::new(&format!("SIGINT to a running {name}"));
        let i = job.spawn("launcher", cmd);
        for rank in 0..2 {
            let head = format!("[node {rank}] node {rank} of 2 (");
            job.wait_line(i, "a node's header", |l| l.starts_with(&head));
        }
        check(
            &job,
            send_signal(&job.pid(i).to_string(), "INT"),
            "kill -INT",
        );
        let st = job.wait(i, BOUND);
        check(&job, st.code() == Some(130), "the launcher should exit 130");
        check(
            &job,
            eventually(BOUND, || marked(&mark).is_empty()),
            "node processes remain",
        );
        job.no_panics();
    }
}

/// The pids a node program printed as `child PID`.
fn children(job: &mut Job, i: usize, nodes: usize) -> Vec<u32> {
    for rank in 0..nodes {
        let prefix = format!("[node {rank}] child ");
        job.wait_line(i, "a node's child pid", |l| l.starts_with(&prefix));
    }
    job.stdout(i)
        .iter()
        .filter_map(|l| l.split_once("] child ")?.1.trim().parse().ok())
        .collect()
}

#[test]
fn stopping_the_launcher_stops_what_the_nodes_started() {
    bins(); // built (once) before any job\'s time starts
    let mark = unique("grandchild");
    let mut job = Job::new("SIGTERM to hyfi-run; nodes with a child each");
    let i = job.spawn(
        "hyfi-run",
        hyfi_run(2, &mark, &["sh", "-c", "sleep 1000 & echo child $!; wait"]),
    );
    let kids = children(&mut job, i, 2);
    check(
        &job,
        kids.len() == 2 && kids.iter().all(|&p| alive(p)),
        "no children",
    );
    check(
        &job,
        send_signal(&job.pid(i).to_string(), "TERM"),
        "kill -TERM",
    );
    let st = job.wait(i, BOUND);
    check(&job, st.code() == Some(143), "the launcher should exit 143");
    check(
        &job,
        eventually(BOUND, || kids.iter().all(|&p| !alive(p))),
        "a node's child outlived the job",
    );
    check(&job, marked(&mark).is_empty(), "marked processes remain");
}

#[test]
fn what_a_node_leaves_behind_is_stopped_when_it_exits() {
    bins(); // built (once) before any job\'s time starts
            // The node exits 0 at once and leaves a daemon in its group (holding its
            // output pipe): the launcher stops it and ends.
    let mark = unique("daemon");
    let mut job = Job::new("a node that leaves a child behind");
    let i = job.spawn(
        "hyfi-run",
        hyfi_run(1, &mark, &["sh", "-c", "sleep 1000 & echo child $!"]),
    );
    let kids = children(&mut job, i, 1);
    let st = job.wait(i, BOUND);
    check(
        &job,
        st.success(),
        "the node succeeded, so should the launcher",
    );
    check(
        &job,
        eventually(BOUND, || kids.iter().all(|&p| !alive(p))),
        "the node's child outlived the job",
    );
}

#[test]
fn stderr_of_many_failing_nodes_is_summarised() {
    // Built (once) before any job's time starts.
    bins();
    // Every node says the same thing (up to its rank) with a long rank list,
    // as peers relaying node 0's "missing" list do, and fails a little
    // later: the launcher starts no more nodes once one has failed, so the
    // failure waits until many have spoken, even on a loaded machine (it
    // failed once with only 7 started in time).
    let nodes = 300;
    let list: Vec<String> = (1..nodes).map(|r| r.to_string()).collect();
    let script = format!(
        "echo \"node $HYFI_RANK: refused: only 1 of {nodes} arrived (missing: {})\" >&2; \
         sleep 3; exit 3",
        list.join(", ")
    );
    let mark = unique("flood");
    let mut job = Job::new("300 nodes failing the same way");
    let i = job.spawn("hyfi-run", hyfi_run(nodes, &mark, &["sh", "-c", &script]));
    let st = job.wait(i, BOUND);
    check(
        &job,
        st.code() == Some(3),
        "should exit with the nodes' status 3",
    );
    let err = job.stderr(i);
    let lines = err.lines().count();
    // 8 copies of the line, 8 reports, and a handful of summaries.
    check(
        &job,
        lines <= 40,
        &format!("{lines} stderr lines for {nodes} nodes"),
    );
    check(
        &job,
        err.len() <= 8 * 1024,
        &format!("{} bytes of stderr", err.len()),
    );
    check(
        &job,
        err.contains(&format!("(missing: 1-{})", nodes - 1)),
        "list not compressed",
    );
    check(
        &job,
        err.contains("more line(s) like this"),
        "no summary of the held lines",
    );
    check(&job, marked(&mark).is_empty(), "marked processes remain");
}

#[test]
fn a_configuration_error_on_every_node_is_reported_once_with_a_count() {
    bins(); // built (once) before any job\'s time starts
            // A real hyfi program: every node rejects the same bad HYFI_TIMEOUT.
    let nodes = 60;
    let mark = unique("bad-env");
    let mut job = Job::new("60 montecarlo nodes with a bad HYFI_TIMEOUT");
    let mut cmd = command(&bins().montecarlo);
    cmd.env("HYFI_NODES", nodes.to_string())
        .env("HYFI_TIMEOUT", "soon")
        .env("HYFI_TEST_MARK", &mark);
    let i = job.spawn("launcher", cmd);
    let st = job.wait(i, BOUND);
    check(&job, !st.success() && st.signal().is_none(), "should fail");
    let err = job.stderr(i);
    let said = err.lines().filter(|l| l.contains("HYFI_TIMEOUT")).count();
    check(
        &job,
        (1..=12).contains(&said),
        &format!("{said} lines name HYFI_TIMEOUT"),
    );
    check(&job, err.lines().count() <= 40, "stderr not in proportion");
    check(&job, marked(&mark).is_empty(), "marked processes remain");
}
