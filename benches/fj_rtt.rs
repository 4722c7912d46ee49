//! Cost of shipping one fork-join filament to another node and getting its
//! result back, on loopback: two in-process nodes (each a `Cluster` with
//! its communication thread and a one-processor `Runtime` with
//! cross-node stealing installed), connected through a coordinator on a
//! free 127.0.0.1 port.
//!
//! * `raw_tcp_16B`: the baseline, a blocking 16-byte request/response over
//!   one loopback `TcpStream` pair with `TCP_NODELAY` (an echo thread).
//! * `local_only`: a distributed run whose root forks one filament that
//!   stays on node 0 (`Ctx::join`): the cost of a distributed run itself
//!   (waking the server thread, the root, and the `Done` message to node 1).
//! * `remote_fork`: the same run, the forked filament a `RemoteFn`; start-up
//!   distribution sends it to node 1 (slot 1), which runs it and sends the
//!   result back. The difference to `local_only` is one cross-node
//!   filament round trip (encode, `Push`, run on node 1, `Result`, decode),
//!   the same messages and hand-offs as a steal round trip (request →
//!   filaments installed), which the nodes also measure in real runs
//!   (`RemoteStats::steal_wait_ns`, reported by `benches/fj_nodes.rs`).
//!
//! Run with `cargo bench --bench fj_rtt -- --noplot`.

use hyfi::layers::RuntimeExt;
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use hyfi::{Config, Ctx, RemoteFn, Runtime};
use hyfi_net::bootstrap::{JobSpec, Launcher, Rendezvous};
use hyfi_net::Cluster;

fn echo(_: &Ctx, x: u64) -> u64 {
    x
}
static ECHO: RemoteFn<u64, u64> = RemoteFn::new("fj_rtt::echo", echo);

/// The root of one iteration: returns whether node 1 should stop.
fn root(ctx: &Ctx, remote: bool, stop: bool) -> bool {
    let (a, b) = if remote {
        ctx.join_remote(|_| 1u64, &ECHO, 2)
    } else {
        ctx.join(|_| 1u64, |_| 2u64)
    };
    assert_eq!(a + b, 3);
    stop
}

/// Two in-process nodes; node 1 follows node 0's runs on a thread until a
/// root returns `true`.
fn two_nodes(job: u64) -> (Runtime, Arc<Cluster>, std::thread::JoinHandle<Arc<Cluster>>) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let coord = format!("127.0.0.1:{port}");
    let connect = move |rank: usize| {
        let spec = JobSpec {
            rank,
            nodes: 2,
            rendezvous: Rendezvous::Coord(coord.clone()),
            job,
            token: Some([0x3c; 16]),
            launcher: Launcher::Hyfi,
        };
        let cluster = Cluster::connect(&spec, Duration::from_secs(30)).expect("Cluster::connect");
        let rt = Runtime::with_link(Config::new().procs(1).pin(false), cluster.clone())
            .expect("runtime");
        hyfi_core::steal::install(&rt).expect("steal::install");
        (rt, cluster)
    };
    let c1 = connect.clone();
    let follower = std::thread::spawn(move || {
        let (rt, cluster) = c1(1);
        // Node 1 never runs a root: it runs what node 0 ships, and returns
        // node 0's root's result.
        while !rt
            .run_distributed(|_| -> bool { unreachable!("node 1 runs no root") })
            .expect("node 1's run")
        {}
        drop(rt);
        cluster
    });
    let (rt, cluster) = connect(0);
    (rt, cluster, follower)
}

/// The baseline: 16 bytes out and back over loopback TCP.
fn raw_tcp(g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let mut client = std::net::TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
    let (mut server, _) = l.accept().expect("accept");
    client.set_nodelay(true).expect("nodelay");
    server.set_nodelay(true).expect("nodelay");
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 16];
        while server.read_exact(&mut buf).is_ok() {
            if server.write_all(&buf).is_err() {
                break;
            }
        }
    });
    let (out, mut back) = ([7u8; 16], [0u8; 16]);
    g.bench_function("raw_tcp_16B", |b| {
        b.iter(|| {
            client.write_all(&out).expect("write");
            client.read_exact(&mut back).expect("read");
        })
    });
    drop(client);
    echo.join().expect("echo thread");
}

fn bench(c: &mut Criterion) {
    ECHO.register().expect("register");
    let mut g = c.benchmark_group("fj_remote_round_trip_2n");
    raw_tcp(&mut g);
    for (name, remote, job) in [
        ("local_only", false, 0x464a_0001u64),
        ("remote_fork", true, 0x464a_0002),
    ] {
        let (rt, cluster, follower) = two_nodes(job);
        g.bench_function(name, |b| {
            b.iter(|| {
                rt.run_distributed(|ctx| root(ctx, remote, false))
                    .expect("run")
            })
        });
        assert!(rt
            .run_distributed(|ctx| root(ctx, remote, true))
            .expect("last run"));
        let other = follower.join().expect("node 1");
        let moved = rt.stats().remote.filaments_out;
        assert_eq!(moved > 0, remote, "{name}: filaments sent {moved}");
        drop(rt);
        // Closing both clusters at once races (see benches/net.rs): leak
        // them; their threads idle until the process exits.
        std::mem::forget(cluster);
        std::mem::forget(other);
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(50).measurement_time(Duration::from_secs(4));
    targets = bench
}
criterion_main!(benches);
