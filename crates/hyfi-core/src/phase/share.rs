//! Within-node balancing: a phase's pools cut into chunks that the
//! node's processors share out while the phase runs.
//!
//! **Why.** The paper's pools are static: processor `p` runs pools
//! `(p, 0..)`, and the phase ends when the slowest processor's pools are
//! done. Filaments of unequal cost (a triangular loop, an adaptive
//! kernel) or processors slowed unequally (a virtual CPU whose host is
//! busy, a hyperthread sibling at work) then leave the others idle at the
//! barrier, where rayon's adaptive splitting keeps every thread busy.
//!
//! **What.** Each pool is cut, once, when its phase is made, into at most
//! `Config::chunks` chunks of about equal filament counts, at row
//! boundaries of its segments (a plan that depends on the pool alone).
//! While the phase runs, each pool has a cursor `(front, back)` over its
//! chunks in one atomic word. Processor `p` takes its own pools' chunks
//! from the front; a processor with none of its own left takes the last
//! chunk of the pool with the most chunks left on another processor. Both
//! take a chunk with one compare-and-swap, so every chunk runs exactly
//! once.
//!
//! **Why results stay bit-identical.** A chunk folds into a reduction copy
//! of its own (`CopyAt`: the pool's processor, and slot `k · width + c`
//! for chunk `c` of pool `k`), whichever processor runs it, and a reduce
//! combines the copies in processor, pool and chunk order (see
//! `crate::reduce`). The chunks' boundaries depend on the pool alone,
//! not on who ran what or when, so neither does any result.
//!
//! **Cursors between executions.** A phase's cursors are full when its
//! execution starts: `Runtime::start` fills every phase's before the
//! program runs, and the master fills phase `cur`'s once every processor
//! has arrived at its barrier (no one takes a chunk of it then) and
//! before it releases them into the next phase (see `barrier.rs`).

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

use crate::pool::{Index, PoolArray};
use crate::seg::Seg;

/// Where a running chunk's reduction copies are: the processor whose list
/// holds them, and the slot in it (see `crate::reduce`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CopyAt {
    pub(crate) proc: usize,
    pub(crate) slot: usize,
}

/// A chunk taken: pool `pool` (processor × pools-per-processor + k),
/// chunk `chunk` of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Taken {
    pub(crate) pool: usize,
    pub(crate) chunk: usize,
    /// Taken from another processor's pool.
    pub(crate) stolen: bool,
}

/// The chunk plan of a phase's pools and their cursors.
pub(crate) struct Shares {
    per_proc: usize,
    /// Chunks per pool at most: the stride of a pool's copy slots.
    width: usize,
    /// Every chunk's segments, pool by pool, chunk by chunk.
    segs: Vec<Seg>,
    /// Chunk `c` of pool `q` is `segs[chunks[first[q] + c]]`.
    chunks: Vec<Range<usize>>,
    /// Filaments per chunk, in the order of `chunks`: counted once here,
    /// not at each run (a red-black pool has a segment per row; counting
    /// them at each run cost SOR 514² on 1×2 6 %).
    lens: Vec<u64>,
    /// Where pool `q`'s chunks start in `chunks` (one more entry than
    /// pools: the end).
    first: Vec<usize>,
    /// Pool `q`'s cursor: front in the low 32 bits, back in the high 32.
    cursors: Box<[CachePadded<AtomicU64>]>,
}

impl Shares {
    /// The plan of `pools`: each pool cut into at most `pools.chunks()`
    /// chunks.
    pub(crate) fn new<I: Index>(pools: &PoolArray<I>) -> Shares {
        let width = pools.chunks().max(1);
        let mut s = Shares {
            per_proc: pools.pools_per_proc(),
            width,
            segs: Vec::new(),
            chunks: Vec::new(),
            lens: Vec::new(),
            first: vec![0],
            cursors: Box::new([]),
        };
        for p in pools.all() {
            cut(p.segs(), width, &mut s.segs, &mut s.chunks);
            s.first.push(s.chunks.len());
        }
        s.lens = s
            .chunks
            .iter()
            .map(|c| s.segs[c.clone()].iter().map(|g| g.len() as u64).sum())
            .collect();
        s.cursors = (0..pools.all().len())
            .map(|_| CachePadded::new(AtomicU64::new(0)))
            .collect();
        s.fill();
        s
    }

    /// Whether chunks may be taken from other processors' pools: not
    /// when each pool is one chunk (`Config::chunks(1)`: the paper's
    /// static pools).
    pub(crate) fn balanced(&self) -> bool {
        self.width > 1
    }

    fn len(&self, q: usize) -> usize {
        self.first[q + 1] - self.first[q]
    }

    /// Makes every chunk available again (no processor may be taking
    /// chunks of this phase: see the module's docs).
    pub(crate) fn fill(&self) {
        for (q, c) in self.cursors.iter().enumerate() {
            c.store((self.len(q) as u64) << 32, Ordering::Relaxed);
        }
    }

    /// The segments of chunk `t`.
    pub(crate) fn segs(&self, t: Taken) -> &[Seg] {
        &self.segs[self.chunks[self.first[t.pool] + t.chunk].clone()]
    }

    /// Filaments in chunk `t`.
    pub(crate) fn filaments(&self, t: Taken) -> u64 {
        self.lens[self.first[t.pool] + t.chunk]
    }

    /// Processors the pools were made for.
    pub(crate) fn procs(&self) -> usize {
        self.cursors.len() / self.per_proc
    }

    /// Where chunk `t` folds its reductions.
    pub(crate) fn copy_at(&self, t: Taken) -> CopyAt {
        CopyAt {
            proc: t.pool / self.per_proc,
            slot: t.pool % self.per_proc * self.width + t.chunk,
        }
    }

    /// The next chunk for processor `proc`: its own pools' first, from the
    /// front; then, if `balance`, the last chunk of the pool with the most
    /// left on another processor.
    pub(crate) fn take(&self, proc: usize, balance: bool) -> Option<Taken> {
        let own = proc * self.per_proc..(proc + 1) * self.per_proc;
        for q in own.clone() {
            let c = &self.cursors[q];
            let mut v = c.load(Ordering::Relaxed);
            while front(v) < back(v) {
                match c.compare_exchange_weak(v, v + 1, Ordering::AcqRel, Ordering::Relaxed) {
                    Ok(_) => {
                        return Some(Taken {
                            pool: q,
                            chunk: front(v),
                            stolen: false,
                        })
                    }
                    Err(now) => v = now,
                }
            }
        }
        if !balance {
            return None;
        }
        loop {
            // The pool with the most chunks left, others' only.
            let (mut best, mut most) = (usize::MAX, 0);
            for (q, c) in self.cursors.iter().enumerate() {
                if own.contains(&q) {
                    continue;
                }
                let v = c.load(Ordering::Relaxed);
                let left = back(v).saturating_sub(front(v));
                if left > most {
                    (best, most) = (q, left);
                }
            }
            if most == 0 {
                return None;
            }
            let c = &self.cursors[best];
            let mut v = c.load(Ordering::Relaxed);
            while front(v) < back(v) {
                let b = back(v) - 1;
                let taken = (v & 0xffff_ffff) | ((b as u64) << 32);
                match c.compare_exchange_weak(v, taken, Ordering::AcqRel, Ordering::Relaxed) {
                    Ok(_) => {
                        return Some(Taken {
                            pool: best,
                            chunk: b,
                            stolen: true,
                        })
                    }
                    Err(now) => v = now,
                }
            }
            // Emptied meanwhile: look again.
        }
    }
}

fn front(v: u64) -> usize {
    (v & 0xffff_ffff) as usize
}

fn back(v: u64) -> usize {
    (v >> 32) as usize
}

/// Cuts a pool's segments `segs` into at most `n` chunks of about equal
/// filament counts, at row boundaries (a pool of fewer rows gets one
/// chunk per row): appends their pieces to `out` and each chunk's range
/// of `out` to `chunks`.
fn cut(segs: &[Seg], n: usize, out: &mut Vec<Seg>, chunks: &mut Vec<Range<usize>>) {
    let total: usize = segs.iter().map(Seg::len).sum();
    let rows: usize = segs.iter().map(Seg::row_count).sum();
    if total == 0 {
        return;
    }
    let n = n.min(rows).max(1);
    // Chunk j (from 1) ends once `done` reaches ⌈total · j / n⌉.
    let target = |j: usize| ((total as u128 * j as u128).div_ceil(n as u128)) as usize;
    let (mut j, mut done, mut start) = (1, 0usize, out.len());
    for s in segs {
        let rc = s.row_count();
        if rc == 0 || s.is_empty() {
            continue;
        }
        let per_row = s.len() / rc;
        let mut a = 0;
        while a < rc {
            let want = target(j).saturating_sub(done).div_ceil(per_row).max(1);
            let b = if j < n { (a + want).min(rc) } else { rc };
            out.push(if a == 0 && b == rc {
                s.clone()
            } else {
                s.sub_rows(a, b)
            });
            done += (b - a) * per_row;
            a = b;
            if j < n && done >= target(j) {
                chunks.push(start..out.len());
                start = out.len();
                while j < n && done >= target(j) {
                    j += 1;
                }
            }
        }
    }
    if start < out.len() {
        chunks.push(start..out.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::each_filament;

    fn filaments(segs: &[Seg]) -> Vec<(usize, usize)> {
        let mut v = Vec::new();
        each_filament(segs, |ij: (usize, usize)| v.push(ij));
        v
    }

    /// Cut pools of every shape: the chunks, run in order, run the pool's
    /// filaments in order; there are at most `n` and none is empty; their
    /// sizes differ by at most a row's filaments.
    #[test]
    fn chunks_run_the_pool_in_order_and_are_balanced() {
        let shapes: Vec<Vec<Seg>> = vec![
            vec![Seg::new(0..10, 1, 0..1, 1, 0..1)],
            vec![Seg::new(3..40, 3, 0..5, 1, 0..1)],
            vec![Seg::new(0..7, 1, 2..9, 2, 0..1)],
            (0..9)
                .map(|i| Seg::new(i..i + 1, 1, i % 2..11, 2, 0..1))
                .collect(),
            vec![
                Seg::new(0..1, 1, 0..50, 1, 0..1),
                Seg::new(1..5, 1, 0..3, 1, 0..1),
            ],
            vec![Seg::new(0..1, 1, 0..100, 1, 0..1)],
        ];
        for segs in &shapes {
            let want = filaments(segs);
            for n in 1..12 {
                let (mut out, mut chunks) = (Vec::new(), Vec::new());
                cut(segs, n, &mut out, &mut chunks);
                assert!(!chunks.is_empty() && chunks.len() <= n, "{segs:?} n {n}");
                let mut got = Vec::new();
                let mut sizes = Vec::new();
                for c in &chunks {
                    let f = filaments(&out[c.clone()]);
                    assert!(!f.is_empty(), "{segs:?} n {n}: an empty chunk");
                    sizes.push(f.len());
                    got.extend(f);
                }
                assert_eq!(got, want, "{segs:?} cut in {n}");
                let rows: usize = segs.iter().map(Seg::row_count).sum();
                let widest = segs.iter().map(|s| s.len() / s.row_count()).max().unwrap();
                if segs.len() == 1 {
                    assert_eq!(chunks.len(), n.min(rows), "{segs:?} n {n}");
                    let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
                    assert!(hi - lo <= 2 * widest, "{segs:?} n {n}: {sizes:?}");
                }
            }
        }
    }
}
