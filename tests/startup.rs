//! Start-up that strangers cannot stall or hijack, with real processes
//! (`examples/montecarlo`) and real sockets on loopback: idle and trickling
//! connections at node 0's port, spoofed hellos with and without a token,
//! the private rendezvous file, malformed variables, and a flood of strays.
//!
//! Every wait is bounded and every test asserts results and messages, never
//! speed beyond "within HYFI_TIMEOUT".

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use hyfi_net::tcp::wire::{Handshake, Purpose, HANDSHAKE_LEN, NONCE_LEN, PROOF_LEN};

mod common;
use common::*;

/// montecarlo, one processor per node, small sizes, plus `extra`.
fn montecarlo(extra: &[&str]) -> Command {
    let mut cmd = command(&bins().montecarlo);
    cmd.args(["--procs", "1", "--samples", "2000"]).args(extra);
    cmd
}

/// Node `rank` of `nodes` with hyfi's variables (`token` None: no HYFI_TOKEN).
fn node(rank: usize, nodes: usize, coord: &str, job: u64, token: Option<&str>) -> Command {
    let mut cmd = montecarlo(&[]);
    cmd.env("HYFI_RANK", rank.to_string())
        .env("HYFI_NODES", nodes.to_string())
        .env("HYFI_COORD", coord)
        .env("HYFI_JOB", job.to_string())
        .env("HYFI_TIMEOUT", "20");
    if let Some(t) = token {
        cmd.env("HYFI_TOKEN", t);
    }
    cmd
}

/// Waits for every node to succeed with `check: OK` and one common result.
fn check_success(job: &mut Job, nodes: usize) {
    let statuses = job.wait_all(BOUND);
    if statuses.iter().any(|s| !s.success()) {
        job.fail(&format!("not every node succeeded: {statuses:?}"));
    }
    let mut results = Vec::new();
    for i in 0..nodes {
        let out = job.stdout(i);
        if !out.iter().any(|l| l.starts_with("check: OK")) {
            job.fail(&format!("process {i}: no `check: OK`"));
        }
        let res = out.iter().find_map(|l| {
            l.strip_prefix("result: ")
                .and_then(|r| r.split_once(" ("))
                .map(|(k, _)| k.to_owned())
        });
        match res {
            Some(r) => results.push(r),
            None => job.fail(&format!("process {i}: no result line")),
        }
    }
    if results.iter().any(|r| *r != results[0]) {
        job.fail(&format!("nodes disagree: {results:?}"));
    }
    job.no_panics();
}

/// Connects to `port`, retrying while node 0 starts.
fn connect_when_up(job: &Job, port: u16) -> TcpStream {
    loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => return s,
            Err(_) if Instant::now() < job.deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => job.fail(&format!("node 0 never listened on {port}: {e}")),
        }
    }
}

/// A stranger's attempt: a well-formed hello for `rank` of `nodes` in job
/// `id`, then a made-up proof. Returns every byte node 0 sent back.
fn spoof(job: &Job, port: u16, id: u64, rank: u32, nodes: u32) -> Vec<u8> {
    let mut s = connect_when_up(job, port);
    let hello = Handshake {
        purpose: Purpose::Hello,
        job: id,
        nonce: random_bytes(),
        rank,
        nodes,
    };
    s.write_all(&hello.encode())
        .expect("sending the spoofed hello");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut got = vec![0u8; NONCE_LEN];
    if s.read_exact(&mut got).is_err() {
        job.fail("node 0 sent no challenge to a well-formed hello");
    }
    let fake: [u8; PROOF_LEN] = random_bytes();
    let _ = s.write_all(&fake);
    // Whatever else node 0 says before it closes the connection.
    let _ = s.read_to_end(&mut got);
    got
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn parse_hex(h: &str) -> Vec<u8> {
    (0..h.len() / 2)
        .map(|i| u8::from_str_radix(&h[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

// ---------------------------------------------------------------------------

#[test]
fn idle_and_trickling_connections_do_not_stall_start_up() {
    let nodes = 3;
    let mut job = Job::new("7 idle and 1 trickling connection at node 0's port");
    let port = free_port();
    let coord = format!("127.0.0.1:{port}");
    let id = u64::from_le_bytes(random_bytes());
    let token = hex(&random_bytes::<16>());
    job.spawn("node 0", node(0, nodes, &coord, id, Some(&token)));
    // Before any real member: 7 connections that say nothing, and one that
    // sends a byte of a hello every 2 s (the old code waited 10 s for each,
    // in turn, and restarted the wait at every byte).
    let idle: Vec<TcpStream> = (0..7).map(|_| connect_when_up(&job, port)).collect();
    let mut trickle = connect_when_up(&job, port);
    let trickler = std::thread::spawn(move || {
        for b in b"HYFI\x02\x00\x01\x00" {
            if trickle.write_all(&[*b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_secs(2));
        }
    });
    let started = Instant::now();
    for rank in 1..nodes {
        job.spawn(
            &format!("node {rank}"),
            node(rank, nodes, &coord, id, Some(&token)),
        );
    }
    check_success(&mut job, nodes);
    // HYFI_TIMEOUT is 20 s: success means start-up completed within it;
    // this states it.
    let took = started.elapsed();
    assert!(took < Duration::from_secs(20), "took {took:?}");
    drop(idle);
    let _ = trickler.join();
    // The strangers' handshakes run out 3 s after they connected, often
    // after this short job ended: at most one line each, never an error.
    let err = job.stderr(0);
    let refused = err.matches("refused a connection").count();
    assert!(refused <= 8, "at most one line per stranger: {err}");
    assert!(!err.contains("error"), "{err}");
}

#[test]
fn a_stranger_with_a_wrong_token_gets_nothing_and_aborts_nothing() {
    let nodes = 2;
    let mut job = Job::new("spoofed hellos at node 0 with HYFI_TOKEN set");
    let port = free_port();
    let coord = format!("127.0.0.1:{port}");
    let id = u64::from_le_bytes(random_bytes());
    let token: [u8; 16] = random_bytes();
    job.spawn("node 0", node(0, nodes, &coord, id, Some(&hex(&token))));
    // A hello for rank 1, one claiming a node count that would abort the job
    // if node 0 believed it, and a hello of the old protocol (version 1,
    // which carried a token: zeros here).
    let got = spoof(&job, port, id, 1, nodes as u32);
    let got_bad_count = spoof(&job, port, id, 1, 5);
    let mut old = Handshake {
        purpose: Purpose::Hello,
        job: id,
        nonce: [0; 16],
        rank: 1,
        nodes: 2,
    }
    .encode();
    old[4..6].copy_from_slice(&1u16.to_le_bytes());
    let mut s = connect_when_up(&job, port);
    let _ = s.write_all(&old);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut got_old = Vec::new();
    let _ = s.read_to_end(&mut got_old);
    for (what, bytes) in [("spoof", &got), ("bad count", &got_bad_count)] {
        // The 16-byte challenge and nothing else: no proof, no table, no
        // token.
        assert_eq!(bytes.len(), NONCE_LEN, "{what}: {bytes:02x?}");
        assert!(!contains(bytes, &token[..8]) && !contains(bytes, &token[8..]));
    }
    assert!(got_old.is_empty(), "old protocol got {got_old:02x?}");
    if job.poll(0).is_some() {
        job.fail("node 0 ended because of a stranger");
    }
    job.spawn("node 1", node(1, nodes, &coord, id, Some(&hex(&token))));
    check_success(&mut job, nodes);
    let err = job.stderr(0);
    assert!(err.contains("does not know the job's token"), "{err}");
    assert!(err.contains("protocol version 1"), "{err}");
}

#[test]
fn without_a_token_the_rendezvous_file_is_private_and_removed() {
    let nodes = 2;
    let mut job = Job::new("Open MPI variables by hand, no HYFI_TOKEN");
    let ns = unique("startup");
    let id = u64::from_le_bytes(random_bytes());
    let tmp = std::env::var_os("TMPDIR")
        .filter(|t| !t.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    let dir = hyfi_net::bootstrap::private_dir(&tmp);
    let file = dir.join(format!("hyfi-{ns}.addr"));
    job.files.push(file.clone());
    // A stale file of a crashed run of this job: node 0 must replace it.
    if !dir.exists() {
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .unwrap();
    }
    std::fs::write(&file, format!("{id} 127.0.0.1:1 {}\n", "ab".repeat(16))).unwrap();
    let ompi = |rank: usize| {
        let mut cmd = montecarlo(&[]);
        // Open MPI's variables by hand, no MPI library behind them: the
        // TCP transport's bootstrap is tested.
        cmd.env("HYFI_TRANSPORT", "tcp")
            .env("OMPI_COMM_WORLD_RANK", rank.to_string())
            .env("OMPI_COMM_WORLD_SIZE", nodes.to_string())
            .env("OMPI_COMM_WORLD_LOCAL_SIZE", nodes.to_string())
            .env("PMIX_NAMESPACE", &ns)
            .env("HYFI_JOB", id.to_string())
            .env("HYFI_TIMEOUT", "20");
        cmd
    };
    job.spawn("node 0", ompi(0));
    // Node 0's entry: job, address, and a token of its own.
    let (addr, token) = loop {
        if let Ok(s) = std::fs::read_to_string(&file) {
            // `job addr token`, then `pid <publisher>` on a line of its own.
            let f: Vec<&str> = s.lines().next().unwrap_or("").split_whitespace().collect();
            if f.len() == 3 && f[1] != "127.0.0.1:1" {
                break (f[1].to_owned(), parse_hex(f[2]));
            }
        }
        if Instant::now() > job.deadline || job.poll(0).is_some() {
            job.fail("node 0 never published its rendezvous file");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let fm = std::fs::metadata(&file).unwrap();
    let dm = std::fs::symlink_metadata(&dir).unwrap();
    assert_eq!(fm.mode() & 0o777, 0o600, "the file's mode");
    assert_eq!(dm.mode() & 0o777, 0o700, "the directory's mode");
    assert!(
        addr.starts_with("127.0.0.1:"),
        "a local job listens on loopback: {addr}"
    );
    assert_eq!(token.len(), 16);
    // Someone who cannot read the file: a hello for rank 1 gets a challenge,
    // never the token, and neither it nor a bad node count ends the job.
    let port: u16 = addr.rsplit_once(':').unwrap().1.parse().unwrap();
    for count in [nodes as u32, 7] {
        let got = spoof(&job, port, id, 1, count);
        assert_eq!(got.len(), NONCE_LEN, "{got:02x?}");
        assert!(!contains(&got, &token[..8]) && !contains(&got, &token[8..]));
    }
    if job.poll(0).is_some() {
        job.fail("node 0 ended because of a stranger");
    }
    job.spawn("node 1", ompi(1));
    check_success(&mut job, nodes);
    assert!(!file.exists(), "node 0 left {} behind", file.display());
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(&ns))
        .collect();
    assert!(leftovers.is_empty(), "left behind: {leftovers:?}");
}

/// What is tried, the variables, and what stderr must say.
type Case = (
    &'static str,
    Vec<(&'static str, &'static str)>,
    &'static [&'static str],
);

#[test]
fn bad_coord_and_token_are_clear_errors() {
    let cases: [Case; 5] = [
        (
            "a coordinator without a port",
            vec![
                ("HYFI_RANK", "0"),
                ("HYFI_NODES", "2"),
                ("HYFI_COORD", "node0"),
            ],
            &["HYFI_COORD=\"node0\"", "host:port"],
        ),
        (
            "a token that is not hex",
            vec![
                ("HYFI_RANK", "1"),
                ("HYFI_NODES", "2"),
                ("HYFI_COORD", "127.0.0.1:7"),
                ("HYFI_TOKEN", "my-secret"),
            ],
            &["HYFI_TOKEN=\"my-secret\"", "32 hexadecimal digits"],
        ),
        (
            "a malformed token on a one-node run",
            vec![("HYFI_TOKEN", "0123")],
            &["HYFI_TOKEN=\"0123\""],
        ),
        (
            "a malformed coordinator under the embedded launcher",
            vec![("HYFI_NODES", "2"), ("HYFI_COORD", "127.0.0.1:http")],
            &["HYFI_COORD=\"127.0.0.1:http\""],
        ),
        (
            "node 0 at an address that is not this host's",
            vec![
                ("HYFI_RANK", "0"),
                ("HYFI_NODES", "2"),
                ("HYFI_COORD", "192.0.2.1:7777"),
            ],
            &[
                "cannot listen at HYFI_COORD=192.0.2.1:7777",
                "address of one of its interfaces",
            ],
        ),
    ];
    for (what, vars, expected) in cases {
        let mut job = Job::new(what);
        let mut cmd = montecarlo(&[]);
        cmd.envs(vars).env("HYFI_TIMEOUT", "2");
        job.spawn(what, cmd);
        let st = job.wait(0, BOUND);
        if st.success() {
            job.fail("should exit non-zero");
        }
        let err = job.stderr(0);
        for e in expected {
            if !err.contains(e) {
                job.fail(&format!("stderr does not contain {e:?}"));
            }
        }
        job.no_panics();
    }
}

#[test]
fn a_flood_of_strays_costs_a_bounded_number_of_lines() {
    let nodes = 2;
    let strays = 2000;
    let mut job = Job::new("2000 stray connections to node 0 mid-run");
    let port = free_port();
    let coord = format!("127.0.0.1:{port}");
    let id = u64::from_le_bytes(random_bytes());
    let token = hex(&random_bytes::<16>());
    for rank in 0..nodes {
        let mut cmd = node(rank, nodes, &coord, id, Some(&token));
        cmd.args(["--phases", "200", "--sleep-ms", "50"]);
        job.spawn(&format!("node {rank}"), cmd);
    }
    for rank in 0..nodes {
        let prefix = format!("node {rank} of {nodes} ");
        job.wait_line(rank, "its header", |l| l.starts_with(&prefix));
    }
    let started = Instant::now();
    // Up to `strays`, or until the job ends (on a loaded machine the job's
    // 10 s may not outlast 2000 connections): a count, not a race.
    let mut sent = 0;
    for i in 0..strays {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(mut s) => {
                let _ = s.write_all(&[b'#'; HANDSHAKE_LEN][..1 + i % 8]);
                sent += 1;
            }
            Err(_) if job.poll(0).is_some() => break,
            Err(e) => job.fail(&format!("stray {i}: {e}")),
        }
    }
    let flood = started.elapsed();
    if sent < 100 {
        job.fail(&format!("only {sent} strays before the job ended"));
    }
    let strays = sent;
    check_success(&mut job, nodes);
    let err = job.stderr(0);
    let lines = err.matches("refused a connection").count();
    let summaries: Vec<u64> = err
        .lines()
        .filter_map(|l| l.split("…and ").nth(1))
        .filter_map(|r| r.split_whitespace().next()?.parse().ok())
        .collect();
    // At most 5 lines a second, plus a summary a second.
    let secs = flood.as_secs() + 10;
    assert!(
        lines as u64 <= 5 * secs && summaries.len() as u64 <= secs,
        "{lines} lines and {} summaries for {strays} strays in {flood:?}",
        summaries.len()
    );
    assert!(!summaries.is_empty(), "no summary line: {err}");
    let counted = lines as u64 + summaries.iter().sum::<u64>();
    assert!(
        counted <= strays as u64 && counted >= strays as u64 / 2,
        "{counted} strays accounted for of {strays}"
    );
    eprintln!(
        "flood of {strays} strays in {flood:?}: {lines} lines, {} summaries, {counted} accounted",
        summaries.len()
    );
}
