//! Matrix multiplication with iterative filaments (the HyFi paper, §4.3).
//!
//! Computes `C = A × B` for pseudo-random `n × n` matrices `A` and `B`
//! (entries in [-1, 1), from `--seed`).
//!
//! In hyfi terms: one filament per element `C(i, j)`, the rows of `C` in
//! blocks over the processors (`PoolArray::block_rows`), and a single phase
//! whose post-phase code returns `Done` at once: the workload is uniform and
//! there is no barrier but the last. `B` is stored transposed so that a
//! filament reads row `i` of `A` and row `j` of `Bᵀ` contiguously; the
//! products and their sum are the same.
//!
//! With `--per-row`, one filament per row of `C` instead, in the order a
//! user writes the fast sequential loop (i-k-j: row `i` of `C` accumulates
//! `A(i, k) ×` row `k` of `B`, which the compiler vectorises). Each dot
//! product of the per-element form is a chain of dependent additions, so it
//! runs at the latency of one addition per term; the per-row form runs at
//! the throughput of the vector units. Both sum each element in `k` order
//! from 0.0, so every form gives the same bits.
//!
//! Each pool segment takes read views of `A`'s rows and of all of `B`
//! (plain memory, fetched once per segment on several nodes) and a write
//! view of its rows of `C` (`Program::phase_with`).
//!
//! Run it with
//!
//! ```text
//! cargo run --release --example matmul -- --n 512 --procs 2
//! cargo run --release --example matmul -- --n 512 --nodes 2 --procs 1
//! ```
//!
//! It checks that a sequential triple loop summing over `k` in the same
//! order gives the same `C` bit for bit, and exits with status 1 if not, 2
//! if the runtime fails.

#[path = "common/mod.rs"]
mod common;
use common::at_least;
/// The `n × n` input matrices: entries in [-1, 1) from a splitmix64 stream.
pub use common::random_matrix as matrix;
use std::time::Instant;

use clap::Parser;
use hyfi::{Control, Dsm, Placement, PoolArray, Program, Runtime};

/// C = A×B with hyfi's iterative filaments, one filament per element of C.
#[derive(Parser, Debug, Clone)]
#[command(name = "matmul")]
pub struct Args {
    /// Matrix size.
    #[arg(long, default_value_t = 512, value_parser = at_least(1))]
    pub n: usize,
    /// Runtime options (--procs, --pin/--no-pin).
    #[command(flatten)]
    pub runtime: common::RuntimeArgs,
    /// Pools per processor (rows of C in blocks over them).
    #[arg(long, default_value_t = 1, value_parser = at_least(1))]
    pub pools_per_proc: usize,
    /// Seed of the pseudo-random matrices.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// One filament per row of C (i-k-j order inside) instead of one per element.
    #[arg(long)]
    pub per_row: bool,
}

/// What a multiplication computed.
#[derive(Debug, Clone)]
pub struct Output {
    /// `C`, row-major.
    pub c: Vec<f64>,
    /// Seconds the multiplication took.
    pub secs: f64,
    /// This node's DSM counters (hyfi runs only).
    pub dsm: Option<hyfi::DsmStats>,
}

impl Output {
    /// `Ok` if both hold the same `C`, bit for bit.
    pub fn check_same(&self, other: &Output, n: usize) -> Result<(), String> {
        common::same_bits("C", &self.c, &other.c, n)
    }
}

/// `A` and `B` for the given arguments (different streams of one seed).
pub fn inputs(args: &Args) -> (Vec<f64>, Vec<f64>) {
    let b_seed = args.seed ^ 0x5555_5555_5555_5555;
    (matrix(args.n, args.seed), matrix(args.n, b_seed))
}

/// The multiplication with iterative filaments on `rt`, the matrices in
/// `rt`'s shared memory: rows of `A` and `C` homed where the pools compute
/// them, `Bᵀ` in blocks over the nodes (every node reads all of it, and
/// fetches each page it lacks once).
pub fn run_hyfi(rt: &Runtime, args: &Args) -> Result<Output, Box<dyn std::error::Error>> {
    let n = args.n;
    let (a0, b0) = inputs(args);
    let dsm = Dsm::new(rt)?;
    let rows = Placement::BlockRows(0..n);
    let a = dsm
        .matrix(n, n)
        .pad_rows()
        .placement(rows.clone())
        .from_fn(|i, k| a0[i * n + k])?;
    let c = dsm
        .matrix::<f64>(n, n)
        .pad_rows()
        .placement(rows)
        .zeroed()?;

    if args.per_row {
        // B as it is: row k of B is what row i of C accumulates.
        let b = dsm
            .matrix(n, n)
            .pad_rows()
            .placement(Placement::Block)
            .from_fn(|k, j| b0[k * n + j])?;
        let mut prog = Program::new();
        prog.phase_with(
            PoolArray::block(rt, 0..n, args.pools_per_proc),
            |ctx, span| {
                (
                    a.read_rows(ctx, span.rows()),
                    b.read_rows(ctx, 0..n),
                    c.write_rows(ctx, span.rows()),
                )
            },
            |_ctx, i, (a, b, c)| {
                let mut ci = vec![0.0f64; n];
                for (k, &aik) in a.row(i).iter().enumerate() {
                    for (cij, &bkj) in ci.iter_mut().zip(b.row(k)) {
                        *cij += aik * bkj;
                    }
                }
                c.write_row(i, 0, &ci);
            },
            |_post| Control::Done,
        );
        let t = Instant::now();
        rt.start(&mut prog)?;
        let secs = t.elapsed().as_secs_f64();
        drop(prog);
        return Ok(Output {
            c: c.to_vec(),
            secs,
            dsm: Some(dsm.stats()),
        });
    }
    let bt = dsm
        .matrix(n, n)
        .pad_rows()
        .placement(Placement::Block)
        .from_fn(|j, k| b0[k * n + j])?;
    let mut prog = Program::new();
    prog.phase_with(
        PoolArray::block_rows(rt, 0..n, 0..n, args.pools_per_proc),
        |ctx, span| {
            (
                a.read_rows(ctx, span.rows()),
                bt.read_rows(ctx, 0..n),
                c.write_rows(ctx, span.rows()),
            )
        },
        |_ctx, (i, j), (a, bt, c)| {
            // Sum in k order from 0.0, as the sequential loop does.
            let mut s = 0.0f64;
            for (&aik, &bkj) in a.row(i).iter().zip(bt.row(j)) {
                s += aik * bkj;
            }
            c.set(i, j, s);
        },
        // Every element is computed once: nothing to iterate.
        |_post| Control::Done,
    );

    let t = Instant::now();
    rt.start(&mut prog)?;
    let secs = t.elapsed().as_secs_f64();
    drop(prog);
    let dsm_stats = dsm.stats();
    Ok(Output {
        c: c.to_vec(),
        secs,
        dsm: Some(dsm_stats),
    })
}

/// The same product as an HPC user writes it sequentially: the i-k-j loop
/// over row slices (vectorised; each element still summed in k order from
/// 0.0, so the bits are those of the dot products).
pub fn run_seq(args: &Args) -> Output {
    let n = args.n;
    let (a, b) = inputs(args);
    let mut c = vec![0.0f64; n * n];
    let t = Instant::now();
    for (ci, ai) in c.chunks_exact_mut(n).zip(a.chunks_exact(n)) {
        for (&aik, bk) in ai.iter().zip(b.chunks_exact(n)) {
            for (cij, &bkj) in ci.iter_mut().zip(bk) {
                *cij += aik * bkj;
            }
        }
    }
    Output {
        c,
        secs: t.elapsed().as_secs_f64(),
        dsm: None,
    }
}

/// The per-element form's arithmetic, sequentially: one dot product of
/// row `i` of `A` and row `j` of `Bᵀ` per element (a chain of dependent
/// additions each; the same bits). Returns the seconds it took.
pub fn time_seq_dots(args: &Args) -> f64 {
    let n = args.n;
    let (a, b) = inputs(args);
    let mut bt = vec![0.0f64; n * n];
    for k in 0..n {
        for j in 0..n {
            bt[j * n + k] = b[k * n + j];
        }
    }
    let mut c = vec![0.0f64; n * n];
    let t = Instant::now();
    for (ci, ai) in c.chunks_exact_mut(n).zip(a.chunks_exact(n)) {
        for (cij, bj) in ci.iter_mut().zip(bt.chunks_exact(n)) {
            let mut s = 0.0f64;
            for (&x, &y) in ai.iter().zip(bj) {
                s += x * y;
            }
            *cij = s;
        }
    }
    let secs = t.elapsed().as_secs_f64();
    std::hint::black_box(&c);
    secs
}

fn main() {
    let args = Args::parse();
    let rt = common::or_exit("matmul", args.runtime.start(|cfg| cfg));
    let par = common::or_exit("matmul", run_hyfi(&rt, &args));
    let seq = run_seq(&args);
    let dots = (!args.per_row).then(|| time_seq_dots(&args));

    println!(
        "matmul n={} nodes={} procs={} pools/proc={} seed={} (one filament per {} of C) (node {})",
        args.n,
        rt.num_nodes(),
        rt.procs(),
        args.pools_per_proc,
        args.seed,
        if args.per_row { "row" } else { "element" },
        rt.node()
    );
    println!("hyfi:       {:.4} s", par.secs);
    println!("sequential: {:.4} s (i-k-j loop over row slices)", seq.secs);
    println!("ratio hyfi/sequential: {:.2}", par.secs / seq.secs);
    if let Some(d) = dots {
        println!(
            "sequential dot products against Bᵀ (the per-element form's arithmetic): {d:.4} s; \
             ratio hyfi/that: {:.2} (--per-row is the fast formulation)",
            par.secs / d
        );
    }
    print!("{}", rt.stats());
    if let Some(d) = &par.dsm {
        print!("{d}");
    }
    match par.check_same(&seq, args.n) {
        Ok(()) => println!("OK: hyfi and sequential C are identical bit for bit"),
        Err(what) => {
            eprintln!("matmul: MISMATCH between hyfi and sequential: {what}");
            std::process::exit(1);
        }
    }
}
