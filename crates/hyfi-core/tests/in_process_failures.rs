//! The in-process transport detects what a TCP job detects, with the same
//! words: nodes that take different SPMD steps, a node that goes on after a
//! peer ended, a service whose handler panics, and a node whose delivery
//! thread stops answering. Each test runs real runtimes (or the raw link)
//! on several in-process nodes and checks that every node gets the error,
//! in bounded time, instead of hanging. The TCP side of the same checks is
//! `tests/failures.rs` of the workspace, with real processes.

use hyfi_core::layer::RuntimeExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyfi_core::link::{FrameError, InProcess, Service};
use hyfi_core::{Config, Control, NodeLink, PoolArray, Program, Runtime, Step};

/// Runs `body(node, link)` on one thread per node and returns what each
/// returned, in node order.
fn on_nodes<T: Send + 'static>(
    links: Vec<Arc<InProcess>>,
    body: impl Fn(usize, Arc<InProcess>) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let handles: Vec<_> = links
        .into_iter()
        .enumerate()
        .map(|(i, link)| {
            let body = body.clone();
            std::thread::spawn(move || body(i, link))
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("node thread"))
        .collect()
}

fn runtime(link: &Arc<InProcess>) -> Runtime {
    Runtime::with_link(
        Config::new().procs(1).pin(false),
        link.clone() as Arc<dyn NodeLink>,
    )
    .expect("runtime")
}

/// One program of one phase run `sweeps` times: the step every node enters
/// per sweep is (program, phase 0, sweep).
fn run_sweeps(rt: &Runtime, sweeps: u64) -> Result<u64, hyfi_core::Error> {
    let mut done = 0u64;
    let mut prog = Program::new();
    prog.phase(
        PoolArray::block(rt, 0..16, 1),
        |_, _| {},
        |_| {
            done += 1;
            if done == sweeps {
                Control::Done
            } else {
                Control::Continue
            }
        },
    );
    rt.start(&mut prog)?;
    drop(prog);
    Ok(done)
}

#[test]
fn the_same_steps_on_every_node_pass() {
    let got = on_nodes(InProcess::connect(3), |_, link| {
        let rt = runtime(&link);
        let a = run_sweeps(&rt, 5).map_err(|e| e.to_string())?;
        let b = run_sweeps(&rt, 3).map_err(|e| e.to_string())?;
        Ok::<_, String>((a, b))
    });
    for g in got {
        assert_eq!(g, Ok((5, 3)));
    }
}

#[test]
fn nodes_that_take_different_steps_are_named_on_every_node() {
    // Node 1 runs one more sweep than the others decided on: at its
    // fourth phase execution (step 5 after the program's start) the others
    // have started their second program.
    let got = on_nodes(InProcess::connect(2), |node, link| {
        let rt = runtime(&link);
        let first = if node == 1 { 4 } else { 3 };
        run_sweeps(&rt, first).and_then(|_| run_sweeps(&rt, 2))
    });
    for (node, g) in got.iter().enumerate() {
        let e = g
            .as_ref()
            .expect_err("a diverged node must fail")
            .to_string();
        assert!(
            e.contains("nodes took different steps (step 5)")
                && e.contains("started program #2")
                && e.contains("ran phase 0 (execution 4) of program #1")
                && e.contains("SPMD"),
            "node {node}: {e}"
        );
    }
}

#[test]
fn a_step_after_a_peer_ended_is_named() {
    // Node 0 ends its program after one run; node 1 starts another and
    // must hear why nobody meets it at the phase's end.
    let t0 = Instant::now();
    let got = on_nodes(InProcess::connect(2), |node, link| {
        let rt = runtime(&link);
        let r = run_sweeps(&rt, 2);
        if node == 0 {
            drop(rt);
            drop(link);
            return r.map(|_| ()).map_err(|e| e.to_string());
        }
        r.and_then(|_| run_sweeps(&rt, 2))
            .map(|_| ())
            .map_err(|e| e.to_string())
    });
    assert_eq!(got[0], Ok(()), "node 0 ended cleanly");
    let e = got[1].as_ref().expect_err("node 1 went on alone");
    // Node 0's goodbye is checked against node 1's steps before node 0
    // counts as gone, so the step is named, not only the wait. Which of
    // its steps node 1 had taken by then (the start of program #2 or its
    // first phase) depends on the threads' timing.
    assert!(
        e.contains("node 0 ended its program after 3 steps, the last: it ran phase 0 (execution 2) of program #1")
            && e.contains("node 1 went on: it ")
            && e.contains("program #2"),
        "{e}"
    );
    assert!(t0.elapsed() < Duration::from_secs(60), "bounded");
}

#[test]
fn raw_steps_that_differ_fail_the_barrier_on_both_nodes() {
    let got = on_nodes(InProcess::connect(2), |node, link| {
        let step = if node == 0 {
            Step::Distributed { seq: 1 }
        } else {
            Step::Alloc {
                seq: 0,
                elems: 10,
                bytes: 80,
            }
        };
        // The mismatch may be found by either node's enter or by the
        // delivery of the other's step; either way the barrier fails.
        link.enter_step(step).and_then(|_| link.barrier())
    });
    for (node, g) in got.iter().enumerate() {
        let e = g.as_ref().expect_err("steps differ").to_string();
        assert!(
            e.contains("called run_distributed (#1)")
                && e.contains("made shared allocation #0 (10 elements, 80 bytes)"),
            "node {node}: {e}"
        );
    }
}

/// A service that panics on its first message, or blocks in it until
/// `release` is set (so that the job's nodes can be dropped: the last one
/// joins the delivery threads).
struct Faulty {
    block: bool,
    release: Arc<AtomicBool>,
}

impl Service for Faulty {
    fn frame(&self, _from: usize, payload: Vec<u8>) -> Result<(), FrameError> {
        if self.block {
            let t0 = Instant::now();
            while !self.release.load(Ordering::Acquire) && t0.elapsed() < Duration::from_secs(120) {
                std::thread::sleep(Duration::from_millis(10));
            }
            return Ok(());
        }
        panic!("faulty service got {} bytes", payload.len());
    }
    fn failed(&self, _why: &str) {}
}

fn faulty_job(block: bool, limit: Duration) -> Vec<String> {
    let release = Arc::new(AtomicBool::new(false));
    on_nodes(
        InProcess::connect_with_limit(2, limit),
        move |node, link| {
            let faulty = Faulty {
                block,
                release: release.clone(),
            };
            link.set_service(hyfi_core::steal::SERVICE, Arc::new(faulty))
                .expect("register");
            // Every node registered before anything is sent: an early
            // message would be handled (and fail) in `set_service` instead.
            link.barrier().expect("registered everywhere");
            if node == 0 {
                let port = link.port().expect("a port");
                port.send_with(
                    1,
                    hyfi_core::steal::SERVICE,
                    hyfi_core::link::Class::Control,
                    3,
                    &mut |b| b.extend_from_slice(b"abc"),
                )
                .expect("send");
            }
            // Collectives do not pass through the delivery threads: meet
            // until the failure reaches this node (bounded).
            let t0 = Instant::now();
            let r = loop {
                if let Err(e) = link.barrier() {
                    break e.to_string();
                }
                if t0.elapsed() > Duration::from_secs(60) {
                    break "no failure within 60 s".to_string();
                }
                std::thread::sleep(Duration::from_millis(10));
            };
            release.store(true, Ordering::Release);
            r
        },
    )
}

#[test]
fn a_panicking_handler_fails_the_job_with_its_message() {
    for (node, e) in faulty_job(false, Duration::from_secs(5)).iter().enumerate() {
        assert!(
            e.contains("node 1: fork-join across nodes of node 0: its handler panicked: faulty service got 3 bytes"),
            "node {node}: {e:?}"
        );
    }
}

#[test]
fn a_stuck_handler_is_a_peer_that_stopped_answering() {
    let t0 = Instant::now();
    let got = faulty_job(true, Duration::from_millis(400));
    for (node, e) in got.iter().enumerate() {
        assert!(
            e.contains("node 1 stopped answering: its delivery thread has spent")
                && e.contains("in one message of fork-join across nodes from node 0"),
            "node {node}: {e:?}"
        );
    }
    assert!(t0.elapsed() < Duration::from_secs(60), "bounded");
}

/// `Runtime::reduce` between programs is a collective: on two nodes linked
/// in-process, each node's copies (updated by a phase whose post-phase
/// code did not reduce them) combine into the job's total on both.
#[test]
fn runtime_reduce_between_programs_combines_every_nodes_copies() {
    let got = on_nodes(InProcess::connect(2), |node, link| {
        let rt = runtime(&link);
        let total = rt.reduction(0u64);
        let mut prog = Program::new();
        prog.phase(
            PoolArray::block(&rt, 0..100, 1),
            |ctx, i| total.update(ctx, |t| t + i as u64),
            |_| Control::Done,
        );
        rt.start(&mut prog).expect("a phase");
        drop(prog);
        let unreduced = matches!(rt.get(&total), Err(hyfi_core::Error::Unreduced));
        let sum = rt.reduce(&total, hyfi_core::Op::Sum).expect("reduce");
        (node, unreduced, sum, rt.get(&total).expect("get"))
    });
    for (node, unreduced, sum, after) in got {
        assert!(unreduced, "node {node}: get before the reduce");
        assert_eq!((sum, after), (4950, 4950), "node {node}");
    }
}
