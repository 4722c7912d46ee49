//! Element and page access in shared memory, all through relaxed atomics.
//!
//! Several filaments (on several processors) write different elements of
//! one page at once, and the communication thread copies whole pages out
//! (to serve them) while the home's filaments write into them. With plain
//! loads and stores those would be data races, undefined behaviour in
//! Rust; relaxed atomics of the element's width make them defined, and
//! compile to the same plain moves on x86-64 and AArch64. Ordering between
//! phases comes from the release at the phase barrier.
//!
//! Pages are copied as 64-bit words and diffs applied as bytes, so a page
//! copy may use a different width than an element's own accesses. Mixed-size
//! atomic accesses to overlapping bytes are not described by the Rust
//! memory model, but both target architectures define them (single-copy
//! atomicity per aligned access); none of them is ever a non-atomic access.

use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering::Relaxed};

use std::ops::Range;

use bytemuck::Pod;

use crate::region::PAGE;

/// Width in bytes of the atomic units one element is accessed with.
#[inline(always)]
const fn unit<T>() -> usize {
    let (s, a) = (std::mem::size_of::<T>(), std::mem::align_of::<T>());
    let mut w = if a < 8 { a } else { 8 };
    while s % w != 0 {
        w /= 2;
    }
    w
}

/// Reads the element at `p`.
///
/// # Safety
/// `p` is aligned for `T` and points into the region's mapped memory.
#[inline(always)]
pub(crate) unsafe fn load<T: Pod>(p: *const T) -> T {
    match (std::mem::size_of::<T>(), unit::<T>()) {
        (8, 8) => bytemuck::cast((*(p as *const AtomicU64)).load(Relaxed)),
        (4, 4) => bytemuck::cast((*(p as *const AtomicU32)).load(Relaxed)),
        (2, 2) => bytemuck::cast((*(p as *const AtomicU16)).load(Relaxed)),
        (1, 1) => bytemuck::cast((*(p as *const AtomicU8)).load(Relaxed)),
        (s, w) => {
            let mut v = T::zeroed();
            let dst = bytemuck::bytes_of_mut(&mut v);
            let src = p as *const u8;
            for k in (0..s).step_by(w) {
                load_unit(src.add(k), w, &mut dst[k..k + w]);
            }
            v
        }
    }
}

/// Writes `v` at `p`.
///
/// # Safety
/// As for [`load`].
#[inline(always)]
pub(crate) unsafe fn store<T: Pod>(p: *mut T, v: T) {
    match (std::mem::size_of::<T>(), unit::<T>()) {
        (8, 8) => (*(p as *const AtomicU64)).store(bytemuck::cast(v), Relaxed),
        (4, 4) => (*(p as *const AtomicU32)).store(bytemuck::cast(v), Relaxed),
        (2, 2) => (*(p as *const AtomicU16)).store(bytemuck::cast(v), Relaxed),
        (1, 1) => (*(p as *const AtomicU8)).store(bytemuck::cast(v), Relaxed),
        (s, w) => {
            let src = bytemuck::bytes_of(&v);
            let dst = p as *mut u8;
            for k in (0..s).step_by(w) {
                store_unit(dst.add(k), w, &src[k..k + w]);
            }
        }
    }
}

/// Stores `v` at `p`: a plain move in a plain-store view (`plain`), which
/// the compiler vectorises, else [`store`]. The views' `set`s all go
/// through it; `plain` is the same for all of a view's filaments, so the
/// branch leaves the segment's loop.
///
/// # Safety
/// As [`store`]; and if `plain`, no other thread accesses `*p` while the
/// view lives (the `plain` module's claim).
#[inline(always)]
pub(crate) unsafe fn store_as<T: Pod>(p: *mut T, v: T, plain: bool) {
    if plain {
        p.write(v)
    } else {
        store(p, v)
    }
}

#[inline(always)]
unsafe fn load_unit(p: *const u8, w: usize, out: &mut [u8]) {
    match w {
        8 => out.copy_from_slice(&(*(p as *const AtomicU64)).load(Relaxed).to_ne_bytes()),
        4 => out.copy_from_slice(&(*(p as *const AtomicU32)).load(Relaxed).to_ne_bytes()),
        2 => out.copy_from_slice(&(*(p as *const AtomicU16)).load(Relaxed).to_ne_bytes()),
        _ => out[0] = (*(p as *const AtomicU8)).load(Relaxed),
    }
}

#[inline(always)]
unsafe fn store_unit(p: *mut u8, w: usize, b: &[u8]) {
    match w {
        8 => (*(p as *const AtomicU64)).store(u64::from_ne_bytes(b.try_into().unwrap()), Relaxed),
        4 => (*(p as *const AtomicU32)).store(u32::from_ne_bytes(b.try_into().unwrap()), Relaxed),
        2 => (*(p as *const AtomicU16)).store(u16::from_ne_bytes(b.try_into().unwrap()), Relaxed),
        _ => (*(p as *const AtomicU8)).store(b[0], Relaxed),
    }
}

/// Updates the `src.len()` elements at `p` in place: element `k` becomes
/// `f(element, src[k])` (a row update such as LU's `x - l * y`).
///
/// **Why not [`load`] and [`store`] per element.** Those are relaxed
/// atomics, which the compiler never vectorises: a row update through them
/// costs about 1.7× the plain slice loop (LU). On x86-64, elements of 8
/// bytes therefore move two at a time, by 16-byte aligned SSE loads and
/// stores written as inline assembly (`movdqa`), with the arithmetic
/// between them in vector registers. Each such access is, at the hardware
/// level, one access of two naturally aligned 8-byte units, each of which
/// x86-64 reads or writes as a unit (processors with AVX guarantee the
/// whole aligned 16 bytes as one); so it is the same as two relaxed 8-byte
/// atomic accesses, which is how the rest of the DSM reads and writes these
/// bytes. This is the reasoning `portable-atomic` applies to its 128-bit
/// atomics. Other element sizes and other targets take the per-element
/// path.
///
/// # Safety
/// As for [`store`], for every element of the run.
#[inline(always)]
pub(crate) unsafe fn update<T: Pod>(p: *mut T, src: &[T], f: impl Fn(T, T) -> T) {
    // `runs` passes `k < n` to `one`, `k + 1 < n` to `two` and `k + 7 < n`
    // to `eight`, so the unchecked reads of `src` below are in bounds.
    let s = |k: usize| *src.get_unchecked(k);
    // The pair at element `k`, whose old words are `[a, b]`, updated.
    #[cfg(target_arch = "x86_64")]
    let pair = |k: usize, [a, b]: [u64; 2]| {
        [
            bytemuck::cast::<T, u64>(f(bytemuck::cast(a), s(k))),
            bytemuck::cast::<T, u64>(f(bytemuck::cast(b), s(k + 1))),
        ]
    };
    runs::<T>(
        p,
        src.len(),
        |k| store(p.add(k), f(load(p.add(k)), s(k))),
        #[cfg(target_arch = "x86_64")]
        |k| {
            let q = p.add(k) as *mut u8;
            wide::store16(q, pair(k, wide::load16(q)));
        },
        #[cfg(target_arch = "x86_64")]
        |k| {
            let q = p.add(k) as *mut u8;
            let v = wide::load64(q);
            wide::store64(q, std::array::from_fn(|i| pair(k + 2 * i, v[i])));
        },
    )
}

/// Runs `one(k)`, `two(k)` (elements `k` and `k + 1`) or `eight(k)`
/// (elements `k..k + 8`) over elements `0..n` at `p`: on x86-64, for 8-byte
/// elements, `eight` on runs of four 16-byte aligned pairs, `two` on the
/// pairs after them, `one` on a first element before them and a last one
/// after; elsewhere `one` on every element.
///
/// # Safety
/// `p` is aligned for `T`; the closures' own.
#[inline(always)]
unsafe fn runs<T: Pod>(
    p: *const T,
    n: usize,
    mut one: impl FnMut(usize),
    #[cfg(target_arch = "x86_64")] mut two: impl FnMut(usize),
    #[cfg(target_arch = "x86_64")] mut eight: impl FnMut(usize),
) {
    #[allow(unused_mut)]
    let mut k = 0;
    #[cfg(target_arch = "x86_64")]
    if std::mem::size_of::<T>() == 8 && unit::<T>() == 8 && n >= 2 {
        if (p as usize) % 16 != 0 {
            one(0);
            k = 1;
        }
        // Four pairs per iteration, as the compiler unrolls the slice loop:
        // with one, LU's row update ran 1.2-1.3x the slice loop, the loop's
        // own counting and branching a third of its instructions; with two,
        // 0.95x or 1.3x depending on where the loop landed in the code
        // (two builds of the same loop, AMD Zen 5; 1.3x in both with
        // `-C llvm-args=-align-loops=64`); with four, 0.93-1.0x either way.
        // And the four in one `eight` call, whose assembly addresses them
        // from one register: as four `two` calls each pair's address took
        // an instruction of its own (a sixth of the loop's), and LU 2048 on
        // 1×1, whose first steps stream the matrix from memory, ran 1.15×
        // its slice loop against 1.04× now (fewer instructions a byte keep
        // more loads in flight; 7 alternated runs, AMD EPYC VM).
        while k + 8 <= n {
            eight(k);
            k += 8;
        }
        if k + 4 <= n {
            two(k);
            two(k + 2);
            k += 4;
        }
        if k + 2 <= n {
            two(k);
            k += 2;
        }
    }
    while k < n {
        one(k);
        k += 1;
    }
}

/// Copies the `out.len()` elements at `p` into `out` (see [`update`] for
/// the 16-byte path).
///
/// # Safety
/// As for [`load`], for every element of the run.
#[inline(always)]
pub(crate) unsafe fn load_run<T: Pod>(p: *const T, out: &mut [T]) {
    let o = out.as_mut_ptr();
    runs::<T>(
        p,
        out.len(),
        |k| *o.add(k) = load(p.add(k)),
        #[cfg(target_arch = "x86_64")]
        |k| {
            let [a, b] = wide::load16(p.add(k) as *const u8);
            *o.add(k) = bytemuck::cast(a);
            *o.add(k + 1) = bytemuck::cast(b);
        },
        #[cfg(target_arch = "x86_64")]
        |k| {
            let v = wide::load64(p.add(k) as *const u8);
            for (i, [a, b]) in v.into_iter().enumerate() {
                *o.add(k + 2 * i) = bytemuck::cast(a);
                *o.add(k + 2 * i + 1) = bytemuck::cast(b);
            }
        },
    )
}

/// Writes `f(j)` into element `j` of the row at `row`, for each `j` of
/// `cols` in order, calling `f` once per element.
///
/// The loop runs over the caller's own range, not over `0..cols.len()`
/// with an offset, so the column a user's closure receives is the range's
/// own induction variable. The compiler still keeps the closure's bounds
/// checks on `mid[j - 1]` and `mid[j + 1]` (as it does in the slice loop),
/// but in a form one instruction shorter per element; per-row Jacobi 1024²
/// on 1×1 ran at a median 1.06× its slice loop from an offset, 1.02× this
/// way (12 alternated rounds).
///
/// One element at a time, each a relaxed store as it is computed, with `f`
/// at exactly one call site, so the compiler inlines a user's closure of
/// any size (with three call sites a 3×3 stencil's closure was not inlined
/// and every element became a call). Measured alternatives (per-row Jacobi
/// 1024², whose running maximum is a loop-carried chain, and a diffusion
/// stencil without one; 1×1, against the slice loop):
///
/// | `fill` | Jacobi | diffusion |
/// |---|---|---|
/// | values in pairs, 16-byte stores where aligned (before) | 1.29× | 1.7× |
/// | pairs aligned to 16 bytes by a guarded first element | 1.25× | 1.7× |
/// | computed into a stack buffer (256 B to 2 KiB), copied out by [`store_run`] | 1.35–1.45× | 1.2× |
/// | the same, double-buffered (a chunk copied out after the next is computed) | 1.25–1.4× | 1.2× |
/// | **one element at a time (this)** | **1.0×** | 1.4–1.6× |
///
/// The pairs' shuffles and the buffer's second pass both sit on the loop
/// that a maximum already makes latency-bound. No form reaches the slice
/// loop on a stencil without a reduction: the compiler vectorises no loop
/// that holds an atomic store, and only the buffer takes the store out of
/// the loop, at the cost of that second pass. That is why a view whose
/// footprint nothing else touches stores plainly ([`fill_plain`], the
/// `plain` module).
///
/// # Safety
/// `row.add(j)` meets [`store`]'s contract for every `j` in `cols`.
#[inline(always)]
pub(crate) unsafe fn fill<T: Pod>(row: *mut T, cols: Range<usize>, mut f: impl FnMut(usize) -> T) {
    for j in cols {
        store(row.add(j), f(j));
    }
}

/// [`fill`] with plain stores, for a plain-store view (plain.rs): the
/// loop the compiler vectorises as it does the user's slice loop.
///
/// # Safety
/// `row.add(j)` is valid for writes for every `j` in `cols`, and no other
/// thread reads or writes those elements while the view that calls this
/// lives (plain.rs, core/plain.rs).
#[inline(always)]
pub(crate) unsafe fn fill_plain<T: Pod>(
    row: *mut T,
    cols: Range<usize>,
    mut f: impl FnMut(usize) -> T,
) {
    for j in cols {
        row.add(j).write(f(j));
    }
}

/// Sets every element `j` of `cols` to `f(j, old)`, where `old` is the
/// element's value before: [`fill`] for a read-modify-write, each element
/// loaded and stored as a unit.
///
/// # Safety
/// As for [`fill`]; the elements are also valid for reads.
#[inline(always)]
pub(crate) unsafe fn fill_update<T: Pod>(
    row: *mut T,
    cols: Range<usize>,
    mut f: impl FnMut(usize, T) -> T,
) {
    for j in cols {
        let p = row.add(j);
        store(p, f(j, load(p)));
    }
}

/// [`fill_update`] with plain loads and stores, for a plain-store view:
/// what the compiler vectorises as it does `x[j] += a * y[j]` on a slice.
///
/// # Safety
/// As for [`fill_plain`]; the elements are also valid for reads.
#[inline(always)]
pub(crate) unsafe fn fill_update_plain<T: Pod>(
    row: *mut T,
    cols: Range<usize>,
    mut f: impl FnMut(usize, T) -> T,
) {
    for j in cols {
        let p = row.add(j);
        p.write(f(j, p.read()));
    }
}

/// Writes `src` into the `src.len()` elements at `p` (see [`update`] for
/// the 16-byte path).
///
/// # Safety
/// As for [`store`], for every element of the run.
#[inline(always)]
pub(crate) unsafe fn store_run<T: Pod>(p: *mut T, src: &[T]) {
    // In bounds: see `update`.
    let s = |k: usize| *src.get_unchecked(k);
    // Elements `k` and `k + 1` of `src` as the words of one pair.
    #[cfg(target_arch = "x86_64")]
    let pair = |k: usize| {
        [
            bytemuck::cast::<T, u64>(s(k)),
            bytemuck::cast::<T, u64>(s(k + 1)),
        ]
    };
    runs::<T>(
        p,
        src.len(),
        |k| store(p.add(k), s(k)),
        #[cfg(target_arch = "x86_64")]
        |k| wide::store16(p.add(k) as *mut u8, pair(k)),
        #[cfg(target_arch = "x86_64")]
        |k| {
            let w = std::array::from_fn(|i| pair(k + 2 * i));
            wide::store64(p.add(k) as *mut u8, w);
        },
    )
}

/// The 16-byte accesses of [`update`], [`load_run`] and [`store_run`], one
/// or four at a time.
#[cfg(target_arch = "x86_64")]
mod wide {
    use std::arch::asm;
    use std::arch::x86_64::__m128i;

    /// Reads the 16 bytes at `p` with one aligned SSE load.
    ///
    /// # Safety
    /// `p` is 16-aligned and its 16 bytes are readable.
    #[inline(always)]
    pub(super) unsafe fn load16(p: *const u8) -> [u64; 2] {
        let v: __m128i;
        // SAFETY: the caller's; `movdqa` reads exactly the 16 bytes at `p`
        // and touches no other state.
        unsafe {
            asm!(
                "movdqa {v}, xmmword ptr [{p}]",
                p = in(reg) p,
                v = out(xmm_reg) v,
                options(nostack, preserves_flags, readonly),
            );
            std::mem::transmute::<__m128i, [u64; 2]>(v)
        }
    }

    /// Reads the 64 bytes at `p` with four aligned SSE loads.
    ///
    /// # Safety
    /// `p` is 16-aligned and its 64 bytes are readable.
    #[inline(always)]
    pub(super) unsafe fn load64(p: *const u8) -> [[u64; 2]; 4] {
        let (a, b, c, d): (__m128i, __m128i, __m128i, __m128i);
        // SAFETY: the caller's; each `movdqa` reads exactly its aligned 16
        // bytes of the 64 at `p` and touches no other state.
        unsafe {
            asm!(
                "movdqa {a}, xmmword ptr [{p}]",
                "movdqa {b}, xmmword ptr [{p} + 16]",
                "movdqa {c}, xmmword ptr [{p} + 32]",
                "movdqa {d}, xmmword ptr [{p} + 48]",
                p = in(reg) p,
                a = out(xmm_reg) a,
                b = out(xmm_reg) b,
                c = out(xmm_reg) c,
                d = out(xmm_reg) d,
                options(nostack, preserves_flags, readonly),
            );
            std::mem::transmute::<[__m128i; 4], [[u64; 2]; 4]>([a, b, c, d])
        }
    }

    /// Writes `w` to the 64 bytes at `p` with four aligned SSE stores.
    ///
    /// # Safety
    /// `p` is 16-aligned and its 64 bytes are writable.
    #[inline(always)]
    pub(super) unsafe fn store64(p: *mut u8, w: [[u64; 2]; 4]) {
        // SAFETY: the caller's; each `movdqa` writes exactly its aligned 16
        // bytes of the 64 at `p`.
        unsafe {
            let [a, b, c, d] = std::mem::transmute::<[[u64; 2]; 4], [__m128i; 4]>(w);
            asm!(
                "movdqa xmmword ptr [{p}], {a}",
                "movdqa xmmword ptr [{p} + 16], {b}",
                "movdqa xmmword ptr [{p} + 32], {c}",
                "movdqa xmmword ptr [{p} + 48], {d}",
                p = in(reg) p,
                a = in(xmm_reg) a,
                b = in(xmm_reg) b,
                c = in(xmm_reg) c,
                d = in(xmm_reg) d,
                options(nostack, preserves_flags),
            );
        }
    }

    /// Writes `w` to the 16 bytes at `p` with one aligned SSE store.
    ///
    /// # Safety
    /// `p` is 16-aligned and its 16 bytes are writable.
    #[inline(always)]
    pub(super) unsafe fn store16(p: *mut u8, w: [u64; 2]) {
        // SAFETY: the caller's; `movdqa` writes exactly the 16 bytes at `p`.
        unsafe {
            let v = std::mem::transmute::<[u64; 2], __m128i>(w);
            asm!(
                "movdqa xmmword ptr [{p}], {v}",
                p = in(reg) p,
                v = in(xmm_reg) v,
                options(nostack, preserves_flags),
            );
        }
    }
}

/// A page's bytes as 64-bit words.
pub(crate) type Words = [u64; PAGE / 8];

/// Copies the page at `page` out (appends its bytes to `out`), by aligned
/// 16-byte loads on x86-64 and word by word elsewhere.
///
/// # Safety
/// `page` is a page-aligned page of the region.
pub(crate) unsafe fn copy_out(page: *const u8, out: &mut Vec<u8>) {
    out.reserve(PAGE);
    // Word by word into the reserved room, then one length update: a push
    // per word (a capacity test and a length store each) took the page
    // server about as long as the rest of a reply.
    let at = out.len();
    let dst = out.as_mut_ptr().add(at) as *mut [u8; 8];
    // `dst` has room for PAGE bytes past the length (reserved above).
    #[cfg(target_arch = "x86_64")]
    for k in (0..PAGE / 8).step_by(2) {
        // Two words per aligned 16-byte load, as the run functions read
        // (see `update`): a page's 512 words in 256 loads.
        let [a, b] = wide::load16(page.add(8 * k));
        dst.add(k).write_unaligned(a.to_ne_bytes());
        dst.add(k + 1).write_unaligned(b.to_ne_bytes());
    }
    #[cfg(not(target_arch = "x86_64"))]
    for k in 0..PAGE / 8 {
        let w = page as *const AtomicU64;
        dst.add(k)
            .write_unaligned((*w.add(k)).load(Relaxed).to_ne_bytes());
    }
    // The PAGE bytes past `at` were all written just above.
    out.set_len(at + PAGE);
}

/// Copies the page at `page` into a twin.
///
/// # Safety
/// As for [`copy_out`].
pub(crate) unsafe fn twin(page: *const u8) -> Box<Words> {
    let w = page as *const AtomicU64;
    let mut t: Box<Words> = Box::new([0; PAGE / 8]);
    for (k, x) in t.iter_mut().enumerate() {
        *x = (*w.add(k)).load(Relaxed);
    }
    t
}

/// Whether the page at `page` still equals `twin`.
///
/// # Safety
/// As for [`copy_out`].
pub(crate) unsafe fn same(page: *const u8, twin: &Words) -> bool {
    let w = page as *const AtomicU64;
    twin.iter()
        .enumerate()
        .all(|(k, &x)| (*w.add(k)).load(Relaxed) == x)
}

/// Writes a whole page's bytes (a fetched copy) into `page`.
///
/// # Safety
/// As for [`copy_out`]; `bytes` is `PAGE` long.
pub(crate) unsafe fn copy_in(page: *mut u8, bytes: &[u8]) {
    let w = page as *const AtomicU64;
    for (k, c) in bytes.chunks_exact(8).enumerate() {
        (*w.add(k)).store(u64::from_ne_bytes(c.try_into().unwrap()), Relaxed);
    }
}

/// Word `k` of the page at `page` (a diff compares the page with its twin
/// word by word, core/diff.rs).
///
/// # Safety
/// As for [`copy_out`]; `k < PAGE / 8`.
#[inline(always)]
pub(crate) unsafe fn word(page: *const u8, k: usize) -> u64 {
    (*(page as *const AtomicU64).add(k)).load(Relaxed)
}

/// Writes `bytes` at `p` (a diff's run, core/diff.rs), and nothing around
/// them: the bytes around it, which another node may have written, stay as
/// they are. Whole aligned words inside the run are stored a word at a
/// time, the bytes at its ends one at a time.
///
/// # Safety
/// `p..p + bytes.len()` lies inside one page of the region.
#[inline]
pub(crate) unsafe fn store_bytes(p: *mut u8, bytes: &[u8]) {
    let byte = |i: usize| (*(p.add(i) as *const AtomicU8)).store(bytes[i], Relaxed);
    let head = p.align_offset(8).min(bytes.len());
    for i in 0..head {
        byte(i);
    }
    let words = (bytes.len() - head) / 8;
    for w in 0..words {
        let i = head + 8 * w;
        let v = u64::from_ne_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        // `p + i` is 8-aligned (after `head` bytes).
        (*(p.add(i) as *const AtomicU64)).store(v, Relaxed);
    }
    for i in head + 8 * words..bytes.len() {
        byte(i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_stores_its_bytes_and_nothing_around_them() {
        for (off, len) in [(0, 0), (3, 1), (5, 3), (8, 8), (6, 21), (16, 40), (1, 63)] {
            let mut page = vec![0xeeu64; 16];
            let run: Vec<u8> = (0..len as u8).map(|b| b + 1).collect();
            // SAFETY: `off + len` lies inside the 128-byte buffer.
            unsafe { store_bytes((page.as_mut_ptr() as *mut u8).add(off), &run) };
            let bytes: &[u8] = bytemuck::cast_slice(&page);
            for (i, &b) in bytes.iter().enumerate() {
                let want = if (off..off + len).contains(&i) {
                    run[i - off]
                } else {
                    0xee_u64.to_ne_bytes()[i % 8]
                };
                assert_eq!(b, want, "byte {i} of a run at {off}, {len} long");
            }
        }
    }

    #[repr(C, align(4))]
    #[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
    struct P3 {
        x: f32,
        y: f32,
        z: f32,
    }

    #[test]
    fn elements_round_trip() {
        let mut buf = vec![0u64; 8];
        let p = buf.as_mut_ptr() as *mut u8;
        unsafe {
            store(p as *mut f64, 2.5);
            assert_eq!(load(p as *const f64), 2.5);
            store(
                p.add(8) as *mut P3,
                P3 {
                    x: 1.0,
                    y: 2.0,
                    z: 3.0,
                },
            );
            assert_eq!(
                load(p.add(8) as *const P3),
                P3 {
                    x: 1.0,
                    y: 2.0,
                    z: 3.0
                }
            );
            store(p.add(20) as *mut [u8; 3], [7, 8, 9]);
            assert_eq!(load(p.add(20) as *const [u8; 3]), [7, 8, 9]);
        }
        assert_eq!(unit::<P3>(), 4);
        assert_eq!(unit::<[u8; 3]>(), 1);
        assert_eq!(unit::<[f64; 2]>(), 8);
    }

    /// The 16-byte path of the run functions against a scalar loop, at
    /// both 8-byte alignments and every short length (peel, runs of eight, pairs, tail),
    /// leaving the elements around the run untouched; and an element type
    /// that takes the per-element path.
    #[test]
    fn runs_match_the_element_loop_at_every_alignment_and_length() {
        for start in 0..4usize {
            // Up to four runs of eight, then pairs and a last element.
            for n in 0..36usize {
                let src: Vec<f64> = (0..n).map(|k| k as f64 * 0.5 - 1.0).collect();
                let init = |k: usize| k as f64 * 3.0 + 0.25;
                let mut buf: Vec<f64> = (0..40).map(init).collect();
                let mut want = buf.clone();
                for k in 0..n {
                    want[start + k] -= 1.5 * src[k];
                }
                // SAFETY: the run lies inside `buf`.
                unsafe { update(buf.as_mut_ptr().add(start), &src, |x, y| x - 1.5 * y) };
                assert_eq!(buf, want, "update, start {start}, n {n}");

                let mut out = vec![0.0; n];
                // SAFETY: as above.
                unsafe { load_run(buf.as_ptr().add(start), &mut out) };
                assert_eq!(
                    out,
                    want[start..start + n],
                    "load_run, start {start}, n {n}"
                );

                // SAFETY: as above.
                unsafe { store_run(buf.as_mut_ptr().add(start), &src) };
                want[start..start + n].copy_from_slice(&src);
                assert_eq!(buf, want, "store_run, start {start}, n {n}");

                // `fill` calls its function once per element, in order.
                let mut calls = Vec::new();
                // SAFETY: as above.
                unsafe {
                    fill(buf.as_mut_ptr(), start..start + n, |j| {
                        calls.push(j);
                        (100 + j) as f64 * 2.0
                    })
                };
                assert_eq!(
                    calls,
                    (start..start + n).collect::<Vec<_>>(),
                    "fill's calls, start {start}, n {n}"
                );
                for (j, w) in want.iter_mut().enumerate().skip(start).take(n) {
                    *w = (100 + j) as f64 * 2.0;
                }
                assert_eq!(buf, want, "fill, start {start}, n {n}");
            }
        }
        let mut ps = vec![
            P3 {
                x: 1.0,
                y: 2.0,
                z: 3.0
            };
            5
        ];
        let add = [P3 {
            x: 1.0,
            y: 1.0,
            z: 1.0,
        }; 3];
        // SAFETY: inside `ps`.
        unsafe {
            update(ps.as_mut_ptr().add(1), &add, |a, b| P3 {
                x: a.x + b.x,
                y: a.y + b.y,
                z: a.z + b.z,
            })
        };
        let two = P3 {
            x: 2.0,
            y: 3.0,
            z: 4.0,
        };
        let one = P3 {
            x: 1.0,
            y: 2.0,
            z: 3.0,
        };
        assert_eq!(ps, [one, two, two, two, one]);
    }
}
