//! hyfi-net latencies on loopback, each group holding a raw-socket baseline
//! and hyfi side by side. Every "node" lives on a thread of this process
//! (each with its own communication thread), connected through a
//! coordinator on a free 127.0.0.1 port: for the round trips the bare
//! message substrate ([`mesh::connect`] and [`Comm::start`], what a
//! `Cluster` runs on), for the collectives a `Cluster`.
//!
//! * `rtt_16B`, `rtt_4KiB`: node 0 sends, node 1 (an echo loop on its own
//!   thread: `recv_bulk` then `send_bulk`) echoes, node 0 waits for the
//!   echo; time per round trip. `hyfi_bulk` uses bulk frames both ways;
//!   `hyfi_ctrl_msg` (16 B only) sends a control [`Msg::Up`] with 16 data
//!   bytes and gets a [`Msg::Down`] back (`Comm::send` / `Comm::recv_coll`,
//!   the path the collectives use). Baseline `raw_tcp`: two threads, one
//!   blocking `std::net::TcpStream` pair with `TCP_NODELAY`, `write_all` the
//!   payload, `read_exact` it back (no header).
//! * `barrier_{2,4}n`, `allreduce_max_f64_{2,4}n`: time per operation seen
//!   by node 0, every node calling the collective back to back. hyfi:
//!   `Cluster::barrier` / `Cluster::allreduce` of one `f64` with a max
//!   combine. Baseline `raw_tree`: the same binomial tree as
//!   `hyfi_net::tcp::collective` (up to node 0 combining, then back down) over a
//!   full mesh of blocking `TcpStream`s with `TCP_NODELAY`, no
//!   communication thread: the value (1 byte for the barrier, 8 for the
//!   reduction) is written and read directly by the node's thread. With 2
//!   nodes this is exactly gather-to-0 and broadcast.
//!
//! With 4 nodes on a 2-vCPU machine both sides are oversubscribed (hyfi
//! runs 4 node threads + 4 communication threads, the baseline 4 threads).
//!
//! Run with `cargo bench --bench net -- --noplot`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use hyfi_net::bootstrap::{JobSpec, Launcher, Rendezvous};
use hyfi_net::tcp::comm::{Comm, Dir};
use hyfi_net::tcp::mesh;
use hyfi_net::tcp::wire::Msg;
use hyfi_net::Cluster;

const SETUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Bulk tag that stops an echo loop (below bit 63: tags with that bit
/// set are service frames, not for the inbox).
const STOP: u64 = u64::MAX >> 1;
/// Collective sequence numbers used by the hand-made control round trip,
/// far from those of `Cluster`'s own collectives.
const CTRL_SEQ0: u64 = 1 << 62;

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local_addr").port()
}

fn spec(rank: usize, nodes: usize, coord: String, job: u64) -> JobSpec {
    JobSpec {
        rank,
        nodes,
        rendezvous: Rendezvous::Coord(coord),
        job,
        token: Some([0x5a; 16]),
        launcher: Launcher::Hyfi,
    }
}

/// Connects `n` in-process nodes; index = rank.
fn clusters(n: usize, job: u64) -> Vec<Arc<Cluster>> {
    let coord = format!("127.0.0.1:{}", free_port());
    let handles: Vec<JoinHandle<Arc<Cluster>>> = (0..n)
        .map(|rank| {
            let spec = spec(rank, n, coord.clone(), job);
            std::thread::spawn(move || {
                Cluster::connect(&spec, SETUP_TIMEOUT).expect("Cluster::connect")
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("connect thread"))
        .collect()
}

/// The message substrate of `n` in-process nodes (the mesh and a
/// communication thread each, no `Cluster`); index = rank.
fn comms(n: usize, job: u64) -> Vec<Arc<Comm>> {
    let coord = format!("127.0.0.1:{}", free_port());
    let handles: Vec<JoinHandle<Arc<Comm>>> = (0..n)
        .map(|rank| {
            let spec = spec(rank, n, coord.clone(), job);
            std::thread::spawn(move || {
                let links = mesh::connect(&spec, SETUP_TIMEOUT).expect("mesh::connect");
                let hook =
                    Box::new(|why: &hyfi_net::cause::Cause| eprintln!("bench node failed: {why}"));
                Arc::new(
                    Comm::start(links, hook, hyfi_net::DEFAULT_HEARTBEAT).expect("Comm::start"),
                )
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("connect thread"))
        .collect()
}

/// Leaks the nodes instead of closing them: dropping every `Cluster` of a
/// job at once races in `Comm::close` (a node that already has all its
/// peers' `Bye` stops its communication thread, possibly before its own
/// `Bye` is written; the peer then sees the link close without one, fails,
/// and ends the process). The leaked communication threads sit idle in
/// `epoll_wait` until the benchmark process exits.
fn leak_all<N>(cs: Vec<Arc<N>>) {
    for c in cs {
        std::mem::forget(c);
    }
}

// ------------------------------------------------------------ round trips

fn raw_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let a = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
    let (b, _) = l.accept().expect("accept");
    a.set_nodelay(true).expect("nodelay");
    b.set_nodelay(true).expect("nodelay");
    (a, b)
}

/// Raw echo: the server thread echoes `size`-byte messages until EOF.
fn raw_echo(size: usize) -> (TcpStream, JoinHandle<()>) {
    let (client, mut server) = raw_pair();
    let h = std::thread::spawn(move || {
        let mut buf = vec![0u8; size];
        while server.read_exact(&mut buf).is_ok() {
            if server.write_all(&buf).is_err() {
                break;
            }
        }
    });
    (client, h)
}

fn bench_rtt(c: &mut Criterion) {
    for (name, size) in [("rtt_16B", 16usize), ("rtt_4KiB", 4096)] {
        let mut g = c.benchmark_group(name);

        // Baseline: raw blocking TCP request/response.
        let (mut client, echo) = raw_echo(size);
        let out = vec![7u8; size];
        let mut back = vec![0u8; size];
        g.bench_function("raw_tcp", |b| {
            b.iter(|| {
                client.write_all(&out).expect("write");
                client.read_exact(&mut back).expect("read");
            })
        });
        drop(client);
        echo.join().expect("raw echo thread");

        // hyfi: bulk frames both ways.
        let cs = comms(2, 0x4e45_5401 + size as u64);
        let n1 = cs[1].clone();
        let echo = std::thread::spawn(move || loop {
            let (tag, data) = n1.recv_bulk(0).expect("recv_bulk");
            if tag == STOP {
                break;
            }
            n1.send_bulk(0, tag, &data).expect("send_bulk");
        });
        let n0 = cs[0].clone();
        g.bench_function("hyfi_bulk", |b| {
            b.iter(|| {
                n0.send_bulk(1, 1, &out).expect("send_bulk");
                let (_, d) = n0.recv_bulk(1).expect("recv_bulk");
                assert_eq!(d.len(), size);
            })
        });
        n0.send_bulk(1, STOP, &[]).expect("stop");
        echo.join().expect("hyfi echo thread");

        // hyfi: control messages (Msg::Up out, Msg::Down back).
        if size == 16 {
            let n1 = cs[1].clone();
            let echo = std::thread::spawn(move || {
                let mut seq = CTRL_SEQ0;
                loop {
                    let data = n1.recv_coll(0, seq, Dir::Up).expect("recv_coll");
                    if data.is_empty() {
                        break;
                    }
                    n1.send(0, &Msg::Down { seq, data }).expect("send");
                    seq += 1;
                }
            });
            let mut seq = CTRL_SEQ0;
            g.bench_function("hyfi_ctrl_msg", |b| {
                b.iter(|| {
                    let m = Msg::Up {
                        seq,
                        data: out.clone(),
                    };
                    n0.send(1, &m).expect("send");
                    let d = n0.recv_coll(1, seq, Dir::Down).expect("recv_coll");
                    assert_eq!(d.len(), size);
                    seq += 1;
                })
            });
            let stop = Msg::Up {
                seq,
                data: Vec::new(),
            };
            n0.send(1, &stop).expect("stop");
            echo.join().expect("hyfi ctrl echo thread");
        }
        drop(n0);
        leak_all(cs);
        g.finish();
    }
}

// ----------------------------------------------------------- collectives

/// One node's side of a raw full mesh (`None` at its own index).
struct RawNode {
    rank: usize,
    peers: Vec<Option<TcpStream>>,
}

fn raw_mesh(n: usize) -> Vec<RawNode> {
    let mut nodes: Vec<RawNode> = (0..n)
        .map(|rank| RawNode {
            rank,
            peers: (0..n).map(|_| None).collect(),
        })
        .collect();
    for i in 0..n {
        for j in i + 1..n {
            let (a, b) = raw_pair();
            nodes[i].peers[j] = Some(a);
            nodes[j].peers[i] = Some(b);
        }
    }
    nodes
}

impl RawNode {
    fn send(&mut self, to: usize, v: &[u8]) {
        self.peers[to]
            .as_mut()
            .expect("link")
            .write_all(v)
            .expect("raw send");
    }
    fn recv(&mut self, from: usize, v: &mut [u8]) {
        self.peers[from]
            .as_mut()
            .expect("link")
            .read_exact(v)
            .expect("raw recv");
    }

    /// The binomial-tree all-reduce of `hyfi_net::tcp::collective`, over raw
    /// blocking sockets.
    fn allreduce(&mut self, value: &mut [u8], combine: &mut dyn FnMut(&mut [u8], &[u8])) {
        let (r, n) = (self.rank, self.peers.len());
        let mut tmp = [0u8; 64];
        let tmp = &mut tmp[..value.len()];
        let mut mask = 1usize;
        while mask < n {
            if r & mask != 0 {
                self.send(r - mask, value);
                break;
            }
            if r + mask < n {
                self.recv(r + mask, tmp);
                combine(value, tmp);
            }
            mask <<= 1;
        }
        if r != 0 {
            self.recv(r & (r - 1), value);
        }
        let low = if r == 0 {
            n.next_power_of_two()
        } else {
            r & r.wrapping_neg()
        };
        let mut m = low >> 1;
        while m > 0 {
            if r + m < n {
                self.send(r + m, value);
            }
            m >>= 1;
        }
    }
}

fn max_f64(acc: &mut [u8], other: &[u8]) {
    let a = f64::from_le_bytes(acc[..8].try_into().expect("8 bytes"));
    let b = f64::from_le_bytes(other[..8].try_into().expect("8 bytes"));
    acc.copy_from_slice(&a.max(b).to_le_bytes());
}

#[derive(Clone, Copy)]
enum Op {
    Barrier,
    MaxF64,
}

/// Runs `iters + 1` operations on every node (node 0 on the calling
/// thread, the others on persistent helper threads) and returns node 0's
/// time for the last `iters` (the first one absorbs the helpers' wake-up).
struct Team<N> {
    node0: N,
    cmds: Vec<mpsc::Sender<(Op, u64)>>,
    done: mpsc::Receiver<()>,
    threads: Vec<JoinHandle<()>>,
}

fn run_op_raw(node: &mut RawNode, op: Op, i: u64) {
    match op {
        Op::Barrier => node.allreduce(&mut [1u8], &mut |_, _| {}),
        Op::MaxF64 => {
            let mut v = ((node.rank as u64 + i) as f64).to_le_bytes();
            node.allreduce(&mut v, &mut max_f64);
        }
    }
}

fn run_op_hyfi(node: &mut Arc<Cluster>, op: Op, i: u64) {
    match op {
        Op::Barrier => node.barrier().expect("barrier"),
        Op::MaxF64 => {
            let mut v = ((node.rank() as u64 + i) as f64).to_le_bytes();
            node.allreduce(&mut v, &mut max_f64).expect("allreduce");
            assert_eq!(f64::from_le_bytes(v), (node.nodes() as u64 - 1 + i) as f64);
        }
    }
}

impl<N: Send + 'static> Team<N> {
    fn new(mut nodes: Vec<N>, run: fn(&mut N, Op, u64)) -> Team<N> {
        let (done_tx, done) = mpsc::channel();
        let mut cmds = Vec::new();
        let mut threads = Vec::new();
        let node0 = nodes.remove(0);
        for mut node in nodes {
            let (tx, rx) = mpsc::channel::<(Op, u64)>();
            let done_tx = done_tx.clone();
            cmds.push(tx);
            threads.push(std::thread::spawn(move || {
                while let Ok((op, iters)) = rx.recv() {
                    for i in 0..=iters {
                        run(&mut node, op, i);
                    }
                    done_tx.send(()).expect("done");
                }
            }));
        }
        Team {
            node0,
            cmds,
            done,
            threads,
        }
    }

    fn time(&mut self, op: Op, iters: u64, run: fn(&mut N, Op, u64)) -> Duration {
        for c in &self.cmds {
            c.send((op, iters)).expect("command");
        }
        run(&mut self.node0, op, 0);
        let t = Instant::now();
        for i in 1..=iters {
            run(&mut self.node0, op, i);
        }
        let el = t.elapsed();
        for _ in &self.cmds {
            self.done.recv().expect("helper done");
        }
        el
    }

    fn finish(self) -> N {
        drop(self.cmds);
        for t in self.threads {
            t.join().expect("helper thread");
        }
        self.node0
    }
}

fn bench_collectives(c: &mut Criterion) {
    for n in [2usize, 4] {
        let mut raw = Team::new(raw_mesh(n), run_op_raw);
        let cs = clusters(n, 0x4e45_5410 + n as u64);
        let mut hyfi = Team::new(cs.clone(), run_op_hyfi);
        for (name, op) in [
            (format!("barrier_{n}n"), Op::Barrier),
            (format!("allreduce_max_f64_{n}n"), Op::MaxF64),
        ] {
            let mut g = c.benchmark_group(name);
            g.bench_function("raw_tree", |b| {
                b.iter_custom(|iters| raw.time(op, iters, run_op_raw))
            });
            g.bench_function("hyfi", |b| {
                b.iter_custom(|iters| hyfi.time(op, iters, run_op_hyfi))
            });
            g.finish();
        }
        drop(raw.finish());
        drop(hyfi.finish());
        leak_all(cs);
    }
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_rtt, bench_collectives
}
criterion_main!(benches);
