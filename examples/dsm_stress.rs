//! A randomized check of the DSM on any configuration: every node writes
//! random elements of several shared arrays, phase after phase, and after
//! every phase every node reads every element back and compares it with a
//! sequential model of what the writes must have produced.
//!
//! The arrays cover the awkward cases on purpose: bytes (`u8`) and words
//! (`u32`) written by different nodes within one page and one machine word
//! (false sharing: twins and byte-exact diffs must keep every write), a
//! matrix of `f64` with rows that do not fit pages, and 12-byte structs that
//! straddle page boundaries, with block, cyclic and random explicit
//! placements. Arrays are initialized at their homes only, so the first
//! check fetches them on first touch.
//!
//! Modes (`--mode`):
//!
//! * `random` (default): writers are random processors of any node;
//! * `home-only`: every element is written by a processor of its page's
//!   home node, so no diff may move (the run fails if one does);
//! * `many-waiters`: one page homed on node 0, written by node 0 and read by
//!   every filament of every other node in the next phase: each node must
//!   request it once per phase however many filaments wait for it;
//! * `--rounds 0` runs until killed (for failure tests).
//!
//! ```text
//! cargo run --release --example dsm_stress -- --nodes 2 --procs 2 --rounds 20
//! ```
//!
//! Prints `dsm_stress: OK ...` and a `stats:` line per node; exits 1 on a
//! mismatch (naming the array, element, round, value and expected value),
//! 2 for a configuration error
//! (README: exit codes).

#[path = "common/mod.rs"]
mod common;
use common::at_least;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::RwLock;

use bytemuck::{Pod, Zeroable};
use clap::{Parser, ValueEnum};
use hyfi::{Control, Dsm, DsmMatrix, DsmVec, Placement, PoolArray, Program, Runtime};

/// Which workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Random writers anywhere.
    Random,
    /// Writers on the home node of what they write.
    HomeOnly,
    /// One page, many waiters.
    ManyWaiters,
}

/// Randomized DSM check.
#[derive(Parser, Debug, Clone)]
#[command(name = "dsm_stress")]
pub struct Args {
    /// Write-and-check rounds (0: forever).
    #[arg(long, default_value_t = 10)]
    pub rounds: u64,
    /// Seed of the random plan.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Workload.
    #[arg(long, value_enum, default_value_t = Mode::Random)]
    pub mode: Mode,
    /// Pools (filthreads) per processor in the checking phase.
    #[arg(long, default_value_t = 4, value_parser = at_least(1))]
    pub pools_per_proc: usize,
    /// Runtime options (--procs, --pin/--no-pin).
    #[command(flatten)]
    pub runtime: common::RuntimeArgs,
}

/// A 12-byte element: straddles page boundaries (4096 = 341 × 12 + 4).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct P3 {
    x: f32,
    y: u32,
    z: f32,
}

/// Values derived from a random word.
trait Gen: Pod + PartialEq + std::fmt::Debug + Send + Sync {
    fn from_r(r: u64) -> Self;
}
impl Gen for u8 {
    fn from_r(r: u64) -> Self {
        (r >> 24) as u8
    }
}
impl Gen for u32 {
    fn from_r(r: u64) -> Self {
        (r >> 24) as u32
    }
}
impl Gen for f64 {
    fn from_r(r: u64) -> Self {
        (r >> 24) as f64 * 0.25
    }
}
impl Gen for P3 {
    fn from_r(r: u64) -> Self {
        P3 {
            x: (r >> 40) as f32,
            y: (r >> 8) as u32,
            z: -((r >> 48) as f32),
        }
    }
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The plan's word for element `e` of array `a` in round `k`.
fn plan(seed: u64, k: u64, a: u64, e: u64) -> u64 {
    mix(mix(mix(seed ^ (a << 56)) ^ k) ^ e)
}

/// Element access common to vectors and matrices.
trait Elems<T>: Send + Sync {
    fn len(&self) -> usize;
    fn get(&self, e: usize) -> T;
    fn set(&self, e: usize, v: T);
    /// Home node of element `e`'s first byte.
    fn home(&self, e: usize) -> usize;
}
impl<T: Pod + Send + Sync> Elems<T> for DsmVec<T> {
    fn len(&self) -> usize {
        DsmVec::len(self)
    }
    fn get(&self, e: usize) -> T {
        DsmVec::get(self, e)
    }
    fn set(&self, e: usize, v: T) {
        DsmVec::set(self, e, v)
    }
    fn home(&self, e: usize) -> usize {
        // An element straddling two pages has no single home.
        let s = std::mem::size_of::<T>();
        if (e * s) / hyfi::dsm::PAGE == (e * s + s - 1) / hyfi::dsm::PAGE {
            self.home_of(e)
        } else {
            usize::MAX
        }
    }
}
impl<T: Pod + Send + Sync> Elems<T> for DsmMatrix<T> {
    fn len(&self) -> usize {
        self.rows() * self.cols()
    }
    fn get(&self, e: usize) -> T {
        DsmMatrix::get(self, e / self.cols(), e % self.cols())
    }
    fn set(&self, e: usize, v: T) {
        DsmMatrix::set(self, e / self.cols(), e % self.cols(), v)
    }
    fn home(&self, e: usize) -> usize {
        // Sizes that divide the page never straddle.
        self.home_of(e / self.cols(), e % self.cols())
    }
}

/// A shared array under test with its sequential model.
trait Checked: Send + Sync {
    /// Round `k`'s writes (and read checks) of global processor `g`.
    fn write(&self, k: u64, g: usize, who: &Who) -> Result<(), String>;
    /// Checks elements `range` against the model.
    fn check(&self, k: u64, range: std::ops::Range<usize>) -> Result<(), String>;
    /// Applies round `k`'s writes to the model.
    fn advance(&self, k: u64, who: &Who);
    fn len(&self) -> usize;
}

/// Who writes what in a round.
struct Who {
    seed: u64,
    procs: usize,
    nodes: usize,
    home_only: bool,
}

impl Who {
    /// The global processor writing element `e` of array `a` in round `k`
    /// (`None`: nobody), and whether `g` should read-check it instead.
    fn writer(&self, k: u64, a: u64, e: usize, home: impl FnOnce() -> usize) -> Option<usize> {
        let r = plan(self.seed, k, a, e as u64);
        if r % 4 != 0 {
            return None;
        }
        let g = self.procs * self.nodes;
        if self.home_only {
            let h = home();
            if h == usize::MAX {
                return None;
            }
            Some(h * self.procs + (r >> 8) as usize % self.procs)
        } else {
            Some((r >> 8) as usize % g)
        }
    }
}

struct Tracked<T, A> {
    id: u64,
    name: &'static str,
    arr: A,
    model: RwLock<Vec<T>>,
}

impl<T: Gen, A: Elems<T>> Checked for Tracked<T, A> {
    fn write(&self, k: u64, g: usize, who: &Who) -> Result<(), String> {
        let model = self.model.read().unwrap();
        for e in 0..self.arr.len() {
            match who.writer(k, self.id, e, || self.arr.home(e)) {
                Some(w) if w == g => self
                    .arr
                    .set(e, T::from_r(plan(who.seed, k, self.id, e as u64))),
                None if plan(who.seed, k, self.id, e as u64) % 4 == 1
                    && (plan(who.seed, k, self.id, e as u64) >> 8) as usize
                        % (who.procs * who.nodes)
                        == g =>
                {
                    // Not written by anyone this round: must read as the
                    // model says, whoever wrote it before.
                    let got = self.arr.get(e);
                    if got != model[e] {
                        return Err(format!(
                            "{} element {e} in round {k} (read while writing): {got:?}, expected {:?}",
                            self.name, model[e]
                        ));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
    fn check(&self, k: u64, range: std::ops::Range<usize>) -> Result<(), String> {
        let model = self.model.read().unwrap();
        for e in range {
            let got = self.arr.get(e);
            if got != model[e] {
                return Err(format!(
                    "{} element {e} after {k} rounds: {got:?}, expected {:?}",
                    self.name, model[e]
                ));
            }
        }
        Ok(())
    }
    fn advance(&self, k: u64, who: &Who) {
        let mut model = self.model.write().unwrap();
        for (e, m) in model.iter_mut().enumerate() {
            if who.writer(k, self.id, e, || self.arr.home(e)).is_some() {
                *m = T::from_r(plan(who.seed, k, self.id, e as u64));
            }
        }
    }
    fn len(&self) -> usize {
        self.arr.len()
    }
}

fn tracked<T: Gen, A: Elems<T> + 'static>(
    id: u64,
    name: &'static str,
    arr: A,
    init: impl Fn(usize) -> T,
) -> Box<dyn Checked> {
    let model = (0..arr.len()).map(init).collect();
    Box::new(Tracked {
        id,
        name,
        arr,
        model: RwLock::new(model),
    })
}

/// Elements checked per filament of the checking phase.
const CHUNK: usize = 512;

/// Runs the randomized rounds; returns the number of rounds checked.
pub fn run_random(rt: &Runtime, dsm: &Dsm, args: &Args) -> Result<u64, Box<dyn std::error::Error>> {
    let (nodes, procs) = (rt.num_nodes(), rt.procs());
    let seed = args.seed;
    let init = |a: u64| move |e: usize| mix(seed ^ (a << 40) ^ e as u64);
    // Random explicit homes for the structs.
    let p3_len = 3000; // 36000 bytes: 9 pages, elements straddle pages
    let p3_pages = (p3_len * 12usize).div_ceil(hyfi::dsm::PAGE);
    let p3_homes: Vec<usize> = (0..p3_pages)
        .map(|p| mix(seed ^ 0x77 ^ p as u64) as usize % nodes)
        .collect();
    let bytes_len = 3 * hyfi::dsm::PAGE + 100;
    let arrays: Vec<Box<dyn Checked>> = vec![
        tracked(
            1,
            "u8 vector",
            dsm.vec::<u8>(bytes_len)
                .placement(Placement::Cyclic)
                .from_fn(|e| u8::from_r(init(1)(e)))?,
            |e| u8::from_r(init(1)(e)),
        ),
        tracked(
            2,
            "u32 vector",
            dsm.vec::<u32>(5000)
                .placement(Placement::Block)
                .from_fn(|e| u32::from_r(init(2)(e)))?,
            |e| u32::from_r(init(2)(e)),
        ),
        tracked(
            3,
            "f64 matrix",
            dsm.matrix::<f64>(120, 37)
                .placement(Placement::Cyclic)
                .from_fn(|i, j| f64::from_r(init(3)(i * 37 + j)))?,
            |e| f64::from_r(init(3)(e)),
        ),
        tracked(
            4,
            "P3 vector",
            dsm.vec::<P3>(p3_len)
                .placement(Placement::Explicit(p3_homes))
                .from_fn(|e| P3::from_r(init(4)(e)))?,
            |e| P3::from_r(init(4)(e)),
        ),
    ];
    let who = Who {
        seed,
        procs,
        nodes,
        home_only: args.mode == Mode::HomeOnly,
    };
    let rounds = args.rounds;
    let failure: RwLock<Option<String>> = RwLock::new(None);
    let fail = |r: Result<(), String>| {
        if let Err(e) = r {
            failure.write().unwrap().get_or_insert(e);
        }
    };
    let done = AtomicU64::new(0);

    // Checking filaments: every node checks every element; its processors
    // (and their pools) split the work.
    let mut check_pools = PoolArray::new(rt, args.pools_per_proc);
    let mut jobs = Vec::new();
    for (a, arr) in arrays.iter().enumerate() {
        for c in 0..arr.len().div_ceil(CHUNK) {
            jobs.push((a, c));
        }
    }
    let slots = procs * args.pools_per_proc;
    for (j, _) in jobs.iter().enumerate() {
        check_pools
            .pool_k((j % slots) / args.pools_per_proc, j % args.pools_per_proc)
            .push(j);
    }
    let mut write_pools = PoolArray::new(rt, 1);
    for p in 0..procs {
        write_pools.pool(p).push(rt.node() * procs + p);
    }

    let mut prog = Program::new();
    prog.phase(
        check_pools,
        |ctx, j| {
            let (a, c) = jobs[j];
            let arr = &arrays[a];
            let range = c * CHUNK..((c + 1) * CHUNK).min(arr.len());
            fail(arr.check(ctx.iteration(), range));
        },
        |post| {
            let k = post.iteration();
            if let Some(e) = failure.read().unwrap().as_ref() {
                eprintln!("dsm_stress: node {}: MISMATCH: {e}", post.node());
                std::process::exit(1);
            }
            done.store(k + 1, Relaxed);
            if post.node() == 0 && rounds == 0 && k % 10 == 0 {
                println!("round {k} checked");
            }
            if rounds != 0 && k >= rounds {
                Control::Done
            } else {
                Control::Continue
            }
        },
    );
    prog.phase(
        write_pools,
        |ctx, g| {
            for arr in &arrays {
                fail(arr.write(ctx.iteration(), g, &who));
            }
        },
        |post| {
            let k = post.iteration();
            for arr in &arrays {
                arr.advance(k, &who);
            }
            Control::Continue
        },
    );
    rt.start(&mut prog)?;
    Ok(done.load(Relaxed))
}

/// One page homed on node 0; every filament of every other node waits for
/// it in every round.
pub fn run_many_waiters(
    rt: &Runtime,
    dsm: &Dsm,
    args: &Args,
) -> Result<u64, Box<dyn std::error::Error>> {
    // A page of its own per round: a page read every round would be pushed
    // by its home at each release after the first (and never requested
    // again); a new page each round is a miss every round.
    let rounds = args.rounds.max(1);
    let stride = (4096 / std::mem::size_of::<u64>()) as u64;
    let v = dsm
        .vec::<u64>((rounds * stride) as usize)
        .placement(Placement::Node(0))
        .zeroed()?;
    let bad = AtomicU64::new(0);
    let mut writer = PoolArray::new(rt, 1);
    if rt.node() == 0 {
        writer.pool(0).push(0);
    }
    let mut readers = PoolArray::new(rt, args.pools_per_proc);
    if rt.node() != 0 || rt.num_nodes() == 1 {
        for p in 0..rt.procs() {
            for k in 0..args.pools_per_proc {
                readers.pool_k(p, k).push(p * args.pools_per_proc + k);
            }
        }
    }
    let mut prog = Program::new();
    prog.phase(
        writer,
        |ctx, _| v.set((ctx.iteration() * stride) as usize, ctx.iteration() + 1),
        |_| Control::Continue,
    );
    prog.phase(
        readers,
        |ctx, _| {
            if v.get((ctx.iteration() * stride) as usize) != ctx.iteration() + 1 {
                bad.fetch_add(1, Relaxed);
            }
        },
        |post| {
            if post.iteration() + 1 >= rounds {
                Control::Done
            } else {
                Control::Continue
            }
        },
    );
    rt.start(&mut prog)?;
    let b = bad.load(Relaxed);
    if b != 0 {
        return Err(format!("{b} reads of the shared page saw a stale value").into());
    }
    Ok(rounds)
}

fn main() {
    let args = Args::parse();
    let rt = common::or_exit("dsm_stress", args.runtime.start(|cfg| cfg));
    common::print_node_line(&rt);
    let dsm = common::or_exit("dsm_stress", Dsm::new(&rt));
    let rounds = match args.mode {
        Mode::ManyWaiters => common::or_exit("dsm_stress", run_many_waiters(&rt, &dsm, &args)),
        _ => common::or_exit("dsm_stress", run_random(&rt, &dsm, &args)),
    };
    let st = dsm.stats();
    let t = st.total;
    print!("{st}");
    print!("{}", rt.stats());
    println!(
        "stats: node={} fetched={} read_faults={} write_faults={} diffs={} diff_bytes={} invalidations={} pushed={} as_diffs={} gathered={} installed={} declined={} deferred={} suspensions={}",
        rt.node(),
        t.pages_fetched,
        t.read_faults,
        t.write_faults,
        t.diffs_sent,
        t.diff_bytes_sent,
        t.invalidations,
        t.pages_pushed,
        t.pushes_as_diffs,
        t.pushes_gathered,
        t.pushes_installed,
        t.pushes_declined,
        t.requests_deferred,
        rt.stats().total().suspensions
    );
    if args.mode == Mode::HomeOnly && t.diffs_sent != 0 {
        eprintln!(
            "dsm_stress: node {}: {} diffs moved although only homes wrote",
            rt.node(),
            t.diffs_sent
        );
        std::process::exit(1);
    }
    println!(
        "dsm_stress: OK mode={:?} rounds={rounds} nodes={} procs={}",
        args.mode,
        rt.num_nodes(),
        rt.procs()
    );
}
