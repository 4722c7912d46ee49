//! Progress on long work, with real processes: a launcher told to render
//! (`HYFI_PROGRESS=force`, as if its stderr were a terminal) tells its
//! nodes to write progress lines, takes every one of them out of the
//! output and draws one status line per job, erased before other lines and
//! at the end; with stderr not a terminal, nothing about progress is
//! written at all, however long the run.

mod common;
use common::*;

/// Clears the line: what the status line starts and ends with.
const ERASE: &str = "\r\x1b[2K";

/// Whether `err` holds anything of progress: raw lines, or drawing.
fn has_progress(err: &str) -> bool {
    err.contains("hyfi-progress") || err.contains('\x1b') || err.contains('\r')
}

fn check(job: &Job, ok: bool, what: &str) {
    assert!(ok, "{}: {what}{}", job.what, job.dump());
}

/// Node script: says which `HYFI_PROGRESS` it got on stdout, reports three
/// times (far enough apart to be drawn), writes an ordinary stderr line,
/// and ends its progress.
const NODE: &str = "echo \"progress=$HYFI_PROGRESS\"; \
    for k in 1 2 3; do echo \"hyfi-progress: $((2000 + k)) $k sweeps, maxdiff 0.$k$HYFI_RANK\" >&2; sleep 0.3; done; \
    echo plain >&2; sleep 0.3; echo \"hyfi-progress: 3000 end\" >&2";

#[test]
fn hyfi_run_renders_the_nodes_progress_lines_and_never_copies_them() {
    bins();
    let mut job = Job::new("hyfi-run -n 2 with HYFI_PROGRESS=force");
    let mut cmd = command(&bins().hyfi_run);
    cmd.args(["-n", "2", "--", "sh", "-c", NODE])
        .env("HYFI_PROGRESS", "force");
    let i = job.spawn("hyfi-run", cmd);
    let st = job.wait(i, BOUND);
    check(&job, st.success(), "should succeed");
    let out = job.stdout(i);
    for r in 0..2 {
        check(
            &job,
            out.contains(&format!("[node {r}] progress=lines")),
            "nodes should get HYFI_PROGRESS=lines",
        );
    }
    let err = job.stderr(i);
    check(
        &job,
        !err.contains("hyfi-progress"),
        "a progress line was copied",
    );
    check(
        &job,
        err.contains(" | node 0: 3 sweeps, maxdiff 0.30 | node 1: 3 sweeps, maxdiff 0.31"),
        "no status line with both nodes' last report",
    );
    // Every drawing starts by erasing the line; an ordinary line comes
    // after an erase, never after a drawn status; the end is erased.
    check(
        &job,
        err.matches("hyfi ").count() == err.matches(&format!("{ERASE}hyfi ")).count(),
        "a status line not drawn from the line's start",
    );
    for r in 0..2 {
        let plain = format!("[node {r}] plain");
        let at = err
            .find(&plain)
            .unwrap_or_else(|| job.fail("ordinary line lost"));
        let before = &err[..at];
        check(
            &job,
            before.is_empty() || before.ends_with('\n') || before.ends_with(ERASE),
            &format!("{plain:?} shares a line with the status"),
        );
    }
    check(
        &job,
        err.ends_with(ERASE),
        "the status line is not erased at the end",
    );
}

#[test]
fn hyfi_run_on_a_pipe_tells_nodes_off_and_shows_nothing() {
    bins();
    let mut job = Job::new("hyfi-run -n 2 on a pipe");
    let mut cmd = command(&bins().hyfi_run);
    cmd.args(["-n", "2", "--", "sh", "-c", NODE]);
    let i = job.spawn("hyfi-run", cmd);
    let st = job.wait(i, BOUND);
    check(&job, st.success(), "should succeed");
    check(
        &job,
        job.stdout(i).contains(&"[node 0] progress=off".to_owned()),
        "nodes should get HYFI_PROGRESS=off",
    );
    let err = job.stderr(i);
    // Even lines a node writes regardless are taken out.
    check(&job, !has_progress(&err), "progress on a pipe");
    check(&job, err.contains("[node 1] plain"), "ordinary line lost");
}

#[test]
fn a_long_real_job_shows_each_nodes_phases_when_forced() {
    bins();
    let mut job = Job::new("montecarlo --nodes 2, 3 s, HYFI_PROGRESS=force");
    let mut cmd = command(&bins().montecarlo);
    cmd.args([
        "--nodes",
        "2",
        "--procs",
        "1",
        "--phases",
        "10",
        "--sleep-ms",
        "300",
    ])
    .env("HYFI_PROGRESS", "force");
    let i = job.spawn("montecarlo", cmd);
    let st = job.wait(i, BOUND);
    check(&job, st.success(), "should succeed");
    let err = job.stderr(i);
    check(
        &job,
        // Both nodes in one entry when they report the same phase.
        (err.contains(" | nodes 0, 1: ")
            || (err.contains(" | node 0: ") && err.contains(" | node 1: ")))
            && err.contains(" phases, "),
        "no status line with each node's phases",
    );
    check(
        &job,
        !err.contains("hyfi-progress"),
        "a progress line was copied",
    );
    check(
        &job,
        err.ends_with(ERASE),
        "the status line is not erased at the end",
    );
    // The results are untouched.
    let ok = job
        .stdout(i)
        .iter()
        .filter(|l| l.contains("check: OK"))
        .count();
    check(&job, ok == 2, "each node should print its check");
}

#[test]
fn without_a_terminal_nothing_about_progress_is_written() {
    bins();
    let runs: [(&str, &std::path::Path, &[&str]); 3] = [
        (
            "jacobi --nodes 2",
            &bins().jacobi,
            &["--nodes", "2", "--n", "256"],
        ),
        (
            "montecarlo --nodes 2 for 3 s",
            &bins().montecarlo,
            &[
                "--nodes",
                "2",
                "--procs",
                "1",
                "--phases",
                "10",
                "--sleep-ms",
                "300",
            ],
        ),
        (
            "montecarlo on one node for 3 s",
            &bins().montecarlo,
            &["--procs", "1", "--phases", "10", "--sleep-ms", "300"],
        ),
    ];
    for (what, exe, args) in runs {
        let mut job = Job::with_bound(what, BOUND);
        let mut cmd = command(exe);
        cmd.args(args);
        let i = job.spawn(what, cmd);
        let st = job.wait(i, BOUND);
        check(&job, st.success(), "should succeed");
        check(&job, !has_progress(&job.stderr(i)), "progress on a pipe");
        check(&job, !job.stdout(i).is_empty(), "no results");
    }
}
