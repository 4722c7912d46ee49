//! What the tests of the communication thread share: jobs on free
//! loopback ports, nodes as threads of the test process.
#![allow(dead_code)] // each test binary uses its own part

use std::sync::Arc;
use std::time::Duration;

use hyfi_net::bootstrap::{random_token, JobSpec, Launcher, Rendezvous};
use hyfi_net::tcp::comm::{Comm, FailureHook};

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The specs of an `n`-node job meeting on a free loopback port.
pub fn specs(n: usize) -> Vec<JobSpec> {
    let coord = format!("127.0.0.1:{}", free_port());
    let token = random_token();
    let job = hyfi_net::bootstrap::random_u64();
    (0..n)
        .map(|rank| JobSpec {
            rank,
            nodes: n,
            rendezvous: Rendezvous::Coord(coord.clone()),
            job,
            token: Some(token),
            launcher: Launcher::Hyfi,
        })
        .collect()
}

/// The bare message substrate (mesh and communication thread) of `n`
/// nodes, as threads, with shared-memory lanes on or off (not `HYFI_LANES`: tests
/// share the environment), and how many links of each node have one.
pub fn comms_lanes(n: usize, lanes: bool) -> Vec<(Arc<Comm>, usize)> {
    let hs: Vec<_> = specs(n)
        .into_iter()
        .map(|spec| {
            std::thread::spawn(move || {
                let links =
                    hyfi_net::tcp::mesh::connect_with(&spec, Duration::from_secs(20), lanes)
                        .unwrap();
                let count = links.lanes.count();
                let hook: FailureHook =
                    Box::new(|why: &hyfi_net::cause::Cause| eprintln!("comm test: {why}"));
                let c = Comm::start(links, hook, hyfi_net::DEFAULT_HEARTBEAT).unwrap();
                (Arc::new(c), count)
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Ends bare communication threads together (each waits for the
/// others' goodbye).
pub fn close(cs: Vec<Arc<Comm>>) {
    let hs: Vec<_> = cs
        .into_iter()
        .map(|c| std::thread::spawn(move || c.close(None)))
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}
