//! Check 2: the shared memory, written at random by every node, against a
//! sequential model (the randomized multi-writer test of
//! `examples/dsm_stress.rs`, reduced to what a transport exercises).
//!
//! A program of two phases, run [`ROUNDS`] times and once more for the
//! last check: a *check* phase in which every node reads every element of
//! every array and compares it with its model, and a *write* phase in
//! which each element is written by at most one processor of the job,
//! chosen from the seed (the post-phase code of the write phase applies
//! the same writes to the model). What moves: first-touch page fetches,
//! diffs of pages several nodes wrote (twins, byte-exact merges at the
//! home), write notices and invalidations, pages the home pushes.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, RwLock};

use crate::bytemuck::Pod;

use super::{agree, hash, Summary};
use crate::dsm::PAGE;
use crate::layers::RuntimeExt;
use crate::{Control, Dsm, DsmMatrix, DsmVec, Placement, PoolArray, Program, Runtime};

/// The check's word in the plan.
const CHECK: u64 = 2;
/// Write rounds (each followed by a check).
const ROUNDS: u64 = 5;
/// Elements a checking filament compares.
const CHUNK: usize = 1024;

/// Who writes an element.
#[derive(Clone, Copy)]
enum Writers {
    /// Each element its own writer: pages written by several nodes.
    PerElement,
    /// One writer per page: pages written by one node (its own or not).
    PerPage,
}

/// An element type the plan can produce.
trait Gen: Pod + PartialEq + std::fmt::Debug + Send + Sync {
    fn from_word(w: u64) -> Self;
}
impl Gen for u8 {
    fn from_word(w: u64) -> Self {
        (w >> 24) as u8
    }
}
impl Gen for u32 {
    fn from_word(w: u64) -> Self {
        (w >> 16) as u32
    }
}
impl Gen for f64 {
    fn from_word(w: u64) -> Self {
        (w >> 11) as f64 * 0.5
    }
}
/// 12 bytes: straddles pages (4096 = 341 × 12 + 4).
impl Gen for [u32; 3] {
    fn from_word(w: u64) -> Self {
        [w as u32, (w >> 32) as u32, (w >> 16) as u32]
    }
}

/// Element access common to shared vectors and matrices.
trait Elems<T>: Send + Sync {
    fn len(&self) -> usize;
    fn get(&self, e: usize) -> T;
    fn set(&self, e: usize, v: T);
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
}

/// Who and what: the plan every node derives from the seed.
#[derive(Clone, Copy)]
struct Plan {
    seed: u64,
    /// Processors in the job (global processor `g` is processor `g % P`
    /// of node `g / P`).
    procs: usize,
}

impl Plan {
    /// The global processor that writes element `e` of array `a` (whose
    /// elements are `size` bytes) in round `k`, if any, and its value.
    fn writer(&self, k: u64, a: u64, e: usize, size: usize, w: Writers) -> Option<(usize, u64)> {
        let word = hash(&[self.seed, CHECK, k, a, e as u64]);
        let who = match w {
            Writers::PerElement => word,
            Writers::PerPage => hash(&[self.seed, CHECK, k, a, u64::MAX, (e * size / PAGE) as u64]),
        };
        (word % 3 == 0).then_some(((who >> 8) as usize % self.procs, word))
    }
}

/// A shared array under test, with this node's model of it.
trait Checked: Send + Sync {
    /// Global processor `g`'s writes of round `k`.
    fn write(&self, k: u64, g: usize, plan: &Plan);
    /// Compares elements `range` with the model after `k` rounds.
    fn check(&self, k: u64, range: std::ops::Range<usize>) -> Result<(), String>;
    /// Applies round `k`'s writes to the model.
    fn advance(&self, k: u64, plan: &Plan);
    fn len(&self) -> usize;
}

struct Tracked<T, A> {
    id: u64,
    name: &'static str,
    writers: Writers,
    arr: A,
    model: RwLock<Vec<T>>,
}

impl<T: Gen, A: Elems<T>> Checked for Tracked<T, A> {
    fn write(&self, k: u64, g: usize, plan: &Plan) {
        let size = std::mem::size_of::<T>();
        for e in 0..self.arr.len() {
            if let Some((w, word)) = plan.writer(k, self.id, e, size, self.writers) {
                if w == g {
                    self.arr.set(e, T::from_word(word));
                }
            }
        }
    }
    fn check(&self, k: u64, range: std::ops::Range<usize>) -> Result<(), String> {
        let model = self.model.read().unwrap_or_else(|e| e.into_inner());
        for e in range {
            let got = self.arr.get(e);
            if got != model[e] {
                return Err(format!(
                    "{} element {e} after {k} round(s) of writes reads {got:?}, the model says {:?}",
                    self.name, model[e]
                ));
            }
        }
        Ok(())
    }
    fn advance(&self, k: u64, plan: &Plan) {
        let size = std::mem::size_of::<T>();
        let mut model = self.model.write().unwrap_or_else(|e| e.into_inner());
        for (e, m) in model.iter_mut().enumerate() {
            if let Some((_, word)) = plan.writer(k, self.id, e, size, self.writers) {
                *m = T::from_word(word);
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
    writers: Writers,
    arr: A,
    init: impl Fn(usize) -> T,
) -> Box<dyn Checked> {
    let model = (0..arr.len()).map(init).collect();
    Box::new(Tracked {
        id,
        name,
        writers,
        arr,
        model: RwLock::new(model),
    })
}

/// The arrays, initialized at their homes from the seed.
fn arrays(
    dsm: &Dsm,
    seed: u64,
    nodes: usize,
) -> Result<Vec<Box<dyn Checked>>, crate::dsm::DsmError> {
    let init = move |a: u64| move |e: usize| hash(&[seed, CHECK, u64::MAX, a, e as u64]);
    let bytes = 3 * PAGE + 100;
    let cols = 37;
    let triples = 3000; // 36000 bytes: 9 pages, elements straddling pages
    let homes = (triples * 12usize).div_ceil(PAGE).max(1);
    let homes: Vec<usize> = (0..homes)
        .map(|p| (hash(&[seed, CHECK, 7, p as u64]) % nodes as u64) as usize)
        .collect();
    Ok(vec![
        tracked(
            1,
            "the u8 vector",
            Writers::PerElement,
            dsm.vec::<u8>(bytes)
                .placement(Placement::Cyclic)
                .from_fn(|e| u8::from_word(init(1)(e)))?,
            |e| u8::from_word(init(1)(e)),
        ),
        tracked(
            2,
            "the u32 vector",
            Writers::PerPage,
            dsm.vec::<u32>(5000)
                .placement(Placement::Block)
                .from_fn(|e| u32::from_word(init(2)(e)))?,
            |e| u32::from_word(init(2)(e)),
        ),
        tracked(
            3,
            "the f64 matrix",
            Writers::PerElement,
            dsm.matrix::<f64>(120, cols)
                .placement(Placement::Cyclic)
                .from_fn(|i, j| f64::from_word(init(3)(i * cols + j)))?,
            |e| f64::from_word(init(3)(e)),
        ),
        tracked(
            4,
            "the vector of 12-byte elements",
            Writers::PerElement,
            dsm.vec::<[u32; 3]>(triples)
                .placement(Placement::Explicit(homes))
                .from_fn(|e| <[u32; 3]>::from_word(init(4)(e)))?,
            |e| <[u32; 3]>::from_word(init(4)(e)),
        ),
    ])
}

/// Runs check 2 on this node (see the module docs).
pub(super) fn check(rt: &Runtime, seed: u64, s: &mut Summary) -> Result<(), String> {
    let link = rt.link().clone();
    let (me, nodes, procs) = (rt.node(), rt.num_nodes(), rt.procs());
    let dsm = Dsm::new(rt).map_err(|e| format!("node {me}: the shared memory: {e}"))?;
    let arrays = arrays(&dsm, seed, nodes)
        .map_err(|e| format!("node {me}: allocating the shared arrays: {e}"))?;
    let plan = Plan {
        seed,
        procs: procs * nodes,
    };
    let failure: Mutex<Option<String>> = Mutex::new(None);
    let fail = |r: Result<(), String>| {
        if let Err(e) = r {
            failure
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert(format!("node {me}: {e}"));
        }
    };
    let checked = AtomicU64::new(0);

    // Checking filaments: every node checks every element; its processors
    // share the chunks.
    let mut jobs = Vec::new();
    for (a, arr) in arrays.iter().enumerate() {
        for c in 0..arr.len().div_ceil(CHUNK) {
            jobs.push((a, c));
        }
    }
    let mut check_pools = PoolArray::new(rt, 1);
    for j in 0..jobs.len() {
        check_pools.pool(j % procs).push(j);
    }
    let mut write_pools = PoolArray::new(rt, 1);
    for p in 0..procs {
        write_pools.pool(p).push(me * procs + p);
    }

    let mut prog = Program::new();
    prog.phase(
        check_pools,
        |ctx, j| {
            let (a, c) = jobs[j];
            let range = c * CHUNK..((c + 1) * CHUNK).min(arrays[a].len());
            checked.fetch_add(range.len() as u64, Relaxed);
            fail(arrays[a].check(ctx.iteration(), range));
        },
        |post| {
            if post.iteration() >= ROUNDS {
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
                arr.write(ctx.iteration(), g, &plan);
            }
        },
        |post| {
            for arr in &arrays {
                arr.advance(post.iteration(), &plan);
            }
            Control::Continue
        },
    );
    rt.start(&mut prog)
        .map_err(|e| format!("node {me}: the shared-memory program failed: {e}"))?;
    drop(prog);
    s.dsm_rounds += ROUNDS;
    s.dsm_elements += checked.load(Relaxed);
    let mine = match failure.into_inner().unwrap_or_else(|e| e.into_inner()) {
        None => Ok(0),
        Some(e) => Err(e),
    };
    agree(&link, "the shared memory", mine).map(drop)
}
