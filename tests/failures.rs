//! One node goes wrong; the job ends on every node, each printing the cause
//! (issue: failures end the job in seconds and say why). Real processes,
//! started by hand as a launcher would (so that each node's own detection
//! is tested, not the launcher's), running `examples/faults.rs`.
//!
//! Every wait is bounded; the bounds are generous (a loaded machine) and
//! only turn what used to be a hang (120 s and more) into a red test.

mod common;

use std::time::{Duration, Instant};

use common::*;

/// Starts `faults` on `nodes` nodes of `procs` processors with `args`;
/// `env` is added to node `rank`'s environment by `env_of(rank)`.
fn start(
    what: &str,
    nodes: usize,
    procs: usize,
    args: &[&str],
    env_of: impl Fn(usize) -> Vec<(&'static str, String)>,
) -> Job {
    let coord = format!("127.0.0.1:{}", free_port());
    let mut job = Job::new(what);
    for rank in 0..nodes {
        let mut cmd = command(&bins().faults);
        cmd.args(args)
            .args(["--procs", &procs.to_string()])
            .env("HYFI_RANK", rank.to_string())
            .env("HYFI_NODES", nodes.to_string())
            .env("HYFI_COORD", &coord)
            .env("HYFI_TIMEOUT", "20");
        for (k, v) in env_of(rank) {
            cmd.env(k, v);
        }
        job.spawn(&format!("rank {rank}"), cmd);
    }
    job
}

/// Runs fault `fault` on node 1 of a 2×1 job; every node must end within
/// the bound and fail. Returns the job, for its output.
fn fault_on_node_1(fault: &str) -> Job {
    let mut job = start(fault, 2, 1, &["--fault", fault, "--on", "1"], |_| vec![]);
    let t = Instant::now();
    let st = job.wait_all(Duration::from_secs(60));
    for (r, s) in st.iter().enumerate() {
        // Those that did nothing wrong themselves may end well: the node
        // that skipped run_distributed, the node that exits with 0.
        let may_succeed = (fault == "distributed-alone" && r == 0) || (fault == "exit" && r == 1);
        if s.success() && !may_succeed {
            job.fail(&format!("node {r} should fail with fault {fault}"));
        }
    }
    eprintln!(
        "{fault}: every node ended {:?} after the start",
        t.elapsed()
    );
    job
}

fn says(job: &Job, rank: usize, needles: &[&str]) {
    let err = job.stderr(rank);
    for n in needles {
        if !err.contains(n) {
            job.fail(&format!("node {rank} does not say {n:?}"));
        }
    }
}

#[test]
fn without_a_fault_every_configuration_gives_the_sequential_answer() {
    for (nodes, procs) in [(1, 1), (1, 2), (2, 1), (2, 2)] {
        let mut job = start("no fault", nodes, procs, &[], |_| vec![]);
        let st = job.wait_all(BOUND);
        for (r, s) in st.iter().enumerate() {
            if !s.success() {
                job.fail(&format!("{nodes}x{procs}: node {r} failed"));
            }
            if !job
                .stdout(r)
                .iter()
                .any(|l| l.contains(&format!("node {r}: check OK")))
            {
                job.fail(&format!("{nodes}x{procs}: node {r} did not check OK"));
            }
        }
        job.no_panics();
    }
}

#[test]
fn a_panicking_filament_on_one_node_ends_the_job_everywhere_with_its_message() {
    let job = fault_on_node_1("panic-filament");
    says(
        &job,
        0,
        &[
            "node 0: node 1 failed first: a filament panicked on processor 0 (phase 0 filament): \
           filament 19999 gave up",
        ],
    );
    says(
        &job,
        1,
        &["a filament panicked on node 1, processor 0 (phase 0 filament): filament 19999 gave up"],
    );
}

#[test]
fn panicking_post_phase_code_on_one_node_ends_the_job_everywhere() {
    let job = fault_on_node_1("panic-post");
    let cause = "(phase 0 post-phase): post-phase code gave up";
    says(
        &job,
        0,
        &["node 0: node 1 failed first: a filament panicked", cause],
    );
    says(&job, 1, &[cause]);
}

#[test]
fn a_program_that_panics_outside_the_runtime_tells_its_peers() {
    let job = fault_on_node_1("panic-main");
    says(
        &job,
        0,
        &[
            "node 0: node 1 failed first: its program panicked: the program of node 1 gave up between its programs",
            "examples/faults.rs",
        ],
    );
}

#[test]
fn a_program_that_returns_early_is_named_by_the_node_that_went_on() {
    let job = fault_on_node_1("error-return");
    says(
        &job,
        1,
        &["node 1 found something wrong between its programs"],
    );
    says(
        &job,
        0,
        &[
            // What node 0 did next depends on when the goodbye came: its
            // distributed run (which node 0 may finish alone) or program 2.
            "node 1 ended its program after",
            "node 0 went on: it ",
            "SPMD",
        ],
    );
}

#[test]
fn one_allocation_more_on_one_node_is_named_on_both() {
    let job = fault_on_node_1("extra-alloc");
    for r in 0..2 {
        says(
            &job,
            r,
            &[
                "nodes took different steps",
                "node 1 made shared allocation #1 (2000 elements, 16000 bytes)",
                "node 0 called run_distributed (#1)",
            ],
        );
    }
    // `?` in `main` shows the error's message, not its Debug structure.
    says(&job, 1, &["Error: shared memory: a collective step failed"]);
    job.no_panics();
}

#[test]
fn run_distributed_on_one_node_only_is_named() {
    // Node 1 alone calls it: node 0 ends and is named.
    let job = fault_on_node_1("distributed-alone");
    says(
        &job,
        1,
        &[
            "node 0 ended its program after",
            "node 1 went on: it called run_distributed (#1)",
        ],
    );
    job.no_panics();
    // Node 0 alone (the root of the run) calls it: node 1 ends.
    let mut job = start(
        "distributed-alone on 0",
        2,
        1,
        &["--fault", "distributed-alone", "--on", "0"],
        |_| vec![],
    );
    job.wait_all(Duration::from_secs(60));
    says(
        &job,
        0,
        &[
            "node 1 ended its program after",
            "node 0 went on: it called run_distributed (#1)",
        ],
    );
    job.no_panics();
}

#[test]
fn post_phase_decisions_that_differ_are_named() {
    let job = fault_on_node_1("post-diverges");
    for r in 0..2 {
        says(
            &job,
            r,
            &[
                "nodes took different steps",
                "node 0 ran phase 0 (execution 5) of program #1",
                "node 1 called run_distributed (#1)",
                "post-phase decisions that differ",
            ],
        );
    }
    job.no_panics();
}

#[test]
fn a_node_that_exits_without_ending_its_runtime_is_a_lost_node() {
    let job = fault_on_node_1("exit");
    says(&job, 0, &["node 0: node 1 failed first: lost"]);
    job.no_panics();
}

/// The state letter of `pid` in /proc (`T` when stopped).
fn proc_state(pid: u32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit_once(") ")?.1.chars().next()
}

fn wait_stopped(job: &Job, rank: usize) {
    let until = Instant::now() + BOUND;
    while proc_state(job.pid(rank)) != Some('T') {
        if Instant::now() > until {
            job.fail(&format!("node {rank} never stopped itself"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_stopped_peer_is_lost_at_the_heartbeat_limit() {
    let mut job = start("node 1 stops itself", 2, 1, &["--fault", "stop"], |_| {
        vec![("HYFI_HEARTBEAT", "2".to_string())]
    });
    wait_stopped(&job, 1);
    let status = job.wait(0, Duration::from_secs(60));
    if status.success() {
        job.fail("node 0 should fail");
    }
    says(
        &job,
        0,
        &[
            "node 0: node 1 failed first: it stopped answering node 0",
            "HYFI_HEARTBEAT=2",
            "hung, stopped (SIGSTOP)",
        ],
    );
    job.no_panics();
    // Dropping the job kills the stopped node.
}

#[test]
fn sigusr1_says_what_each_processor_waits_for() {
    // A long heartbeat limit: node 0 stays waiting for the stopped node.
    let mut job = start("node 1 stops itself", 2, 1, &["--fault", "stop"], |_| {
        vec![("HYFI_HEARTBEAT", "120".to_string())]
    });
    wait_stopped(&job, 1);
    let node0 = job.pid(0).to_string();
    let until = Instant::now() + BOUND;
    // Node 0 gets to its next phase's release soon after node 1 stopped;
    // ask until the report shows it waiting there.
    loop {
        assert!(send_signal(&node0, "USR1"), "node 0 is gone");
        std::thread::sleep(Duration::from_millis(300));
        let err = job.stderr(0);
        if err.contains("waits for the other nodes' releases") {
            break;
        }
        if Instant::now() > until {
            job.fail("no wait report naming the release");
        }
    }
    says(&job, 0, &["hyfi: node 0 waits for:", "traffic"]);
    // Then the node is killed: node 0 ends with the lost node.
    assert!(send_signal(&job.pid(1).to_string(), "KILL"));
    let status = job.wait(0, BOUND);
    if status.success() {
        job.fail("node 0 should fail once node 1 is killed");
    }
    says(&job, 0, &["node 0: node 1 failed first: lost"]);
    job.no_panics();
}

#[test]
fn a_bad_heartbeat_setting_is_a_clear_error() {
    let mut job = start("HYFI_HEARTBEAT=soon", 2, 1, &[], |_| {
        vec![("HYFI_HEARTBEAT", "soon".to_string())]
    });
    let st = job.wait_all(BOUND);
    for (r, s) in st.iter().enumerate() {
        if s.success() {
            job.fail(&format!("node {r} should refuse HYFI_HEARTBEAT=soon"));
        }
        says(&job, r, &["HYFI_HEARTBEAT", "soon", "seconds"]);
    }
}
