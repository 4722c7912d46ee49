//! Unbalanced Tree Search (binomial, after UTS's "T3" trees): counts the
//! nodes of a random tree whose shape is known only while it is walked,
//! the classic load-balancing test for fork-join runtimes. The root has
//! `B0` children; every other node has `M` children with probability `q`,
//! else none (`q·M` just under 1: a critical tree, deep and lopsided). A
//! node's "work" is `rounds` rounds of a 64-bit mixer (as UTS's SHA-1).
//!
//! A node's children are split in halves by joins, in the same order by
//! every variant:
//!
//! * `seq`: the plain recursion (a loop over the children);
//! * `rayon P`: `rayon::join` over the halves, P threads;
//! * `hyfi` with `join_remote` written generic over [`Fork`], **without**
//!   a pruned copy (`tested`: every join tests for pruning) and **with**
//!   one (`pruned`, as the docs advise), each with latent joins off (the
//!   default) and on ([`Config::latent_joins`]), on 1 and 2 processors.
//!
//! Each line gives the median over rounds of the time and of the ratio
//! to `seq` in the same round (the variants run round-robin in one
//! process; every count is checked against `seq`'s).
//!
//! Run with `cargo bench --bench uts` (`UTS_ROUNDS`, default 5;
//! `UTS_WORK`, the rounds of mixing per node, default `20,30`;
//! `UTS_PROCS`, the processor counts, default `1,2`; rayon gets the
//! largest).

#[allow(dead_code)] // the other benches use the rest of it
mod common;
use std::hint::black_box;
use std::time::Instant;

use hyfi::{Config, Fork, RemoteFn, Runtime};
use serde::{Deserialize, Serialize};

const B0: u64 = 2000;
const M: u64 = 8;
const Q: f64 = 0.124875;

#[derive(Clone, Copy, Serialize, Deserialize, Debug)]
struct Node {
    h: u64,
    depth: u32,
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[derive(Clone, Copy, Serialize, Deserialize, Debug)]
struct Params {
    /// Probability of `M` children, out of 2^32.
    q: u64,
    rounds: u32,
}

fn kids(p: Params, n: Node) -> u64 {
    if n.depth == 0 {
        return B0;
    }
    let mut x = n.h;
    for _ in 0..p.rounds {
        x = mix(x);
    }
    if (x >> 32) < p.q {
        M
    } else {
        0
    }
}

fn child(n: Node, i: u64) -> Node {
    Node {
        h: mix(n.h ^ i.wrapping_mul(0x2545_f491_4f6c_dd1d)),
        depth: n.depth + 1,
    }
}

fn seq(p: Params, n: Node) -> u64 {
    1 + (0..kids(p, n)).map(|i| seq(p, child(n, i))).sum::<u64>()
}

fn ray(p: Params, n: Node) -> u64 {
    1 + ray_range(p, n, 0, kids(p, n))
}

fn ray_range(p: Params, n: Node, lo: u64, hi: u64) -> u64 {
    match hi - lo {
        0 => 0,
        1 => ray(p, child(n, lo)),
        _ => {
            let mid = lo + (hi - lo) / 2;
            let (a, b) = rayon::join(|| ray_range(p, n, lo, mid), || ray_range(p, n, mid, hi));
            a + b
        }
    }
}

/// The children `lo..hi` of `n`, halved by `join_remote` through `f`.
fn range(ctx: &impl Fork, f: &'static RemoteFn<Span, u64>, (p, n, lo, hi): Span) -> u64 {
    match hi - lo {
        0 => 0,
        1 => {
            let c = child(n, lo);
            1 + range(ctx, f, (p, c, 0, kids(p, c)))
        }
        _ => {
            let mid = lo + (hi - lo) / 2;
            let (a, b) = ctx.join_remote(|c| range(c, f, (p, n, lo, mid)), f, (p, n, mid, hi));
            a + b
        }
    }
}

type Span = (Params, Node, u64, u64);

fn tested(ctx: &impl Fork, s: Span) -> u64 {
    range(ctx, &TESTED, s)
}
fn pruned(ctx: &impl Fork, s: Span) -> u64 {
    range(ctx, &PRUNED, s)
}
static TESTED: RemoteFn<Span, u64> = RemoteFn::new("uts::tested", tested);
static PRUNED: RemoteFn<Span, u64> = RemoteFn::new("uts::pruned", pruned).with_pruned(pruned);

fn env_list(name: &str, default: &[u32]) -> Vec<u32> {
    std::env::var(name)
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| default.to_vec())
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument selects nothing here.
    let rounds = env_list("UTS_ROUNDS", &[5])[0] as usize;
    TESTED.register().expect("register");
    PRUNED.register().expect("register");
    let root = Node { h: 19, depth: 0 };
    for work in env_list("UTS_WORK", &[20, 30]) {
        let p = Params {
            q: (Q * 4294967296.0) as u64,
            rounds: work,
        };
        let want = seq(p, root);
        let procs_list = env_list("UTS_PROCS", &[1, 2]);
        let threads = *procs_list.iter().max().unwrap_or(&2) as usize;
        let pool = common::rayon_pool(threads);
        // name -> (times, ratios to seq)
        let mut rows: Vec<(String, Vec<f64>, Vec<f64>)> = Vec::new();
        let mut row = |name: String, t: f64, r: f64| match rows.iter_mut().find(|x| x.0 == name) {
            Some(x) => {
                x.1.push(t);
                x.2.push(r);
            }
            None => rows.push((name, vec![t], vec![r])),
        };
        for _ in 0..rounds {
            let t = Instant::now();
            assert_eq!(seq(p, black_box(root)), want);
            let ts = t.elapsed().as_secs_f64();
            row("seq".into(), ts, 1.0);
            let t = Instant::now();
            assert_eq!(pool.install(|| ray(p, black_box(root))), want);
            let tr = t.elapsed().as_secs_f64();
            row(format!("rayon {threads}"), tr, tr / ts);
            for procs in procs_list.iter().map(|&p| p as usize) {
                for latent in [false, true] {
                    let cfg = Config::new()
                        .procs(procs)
                        .pin(procs <= 2)
                        .latent_joins(latent);
                    let rt = Runtime::new(cfg).expect("hyfi runtime");
                    for (name, f) in [("tested", &TESTED), ("pruned", &PRUNED)] {
                        let t = Instant::now();
                        let got = rt
                            .run(|ctx| 1 + range(ctx, f, (p, black_box(root), 0, B0)))
                            .expect("runs");
                        let th = t.elapsed().as_secs_f64();
                        assert_eq!(got, want, "{name} 1x{procs} latent {latent}");
                        let l = if latent { "latent on" } else { "latent off" };
                        row(format!("hyfi 1x{procs} {name} {l}"), th, th / ts);
                    }
                }
            }
        }
        let median = |v: &[f64]| {
            let mut v = v.to_vec();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        println!("uts q={Q} work={work} ({want} nodes), {rounds} rounds:");
        for (name, t, r) in &rows {
            println!(
                "  {name:28} median {:.4} s  [{:.4}-{:.4}]  time/seq {:.3}",
                median(t),
                t.iter().copied().fold(f64::MAX, f64::min),
                t.iter().copied().fold(0.0, f64::max),
                median(r)
            );
        }
    }
}
