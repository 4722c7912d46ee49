//! Large frames' buffers, used again instead of freed: a transport takes
//! the buffer of a frame it builds or receives here, and whoever is done
//! with the frame (the transport once it is written, the service once it
//! has handled it) gives it back.
//!
//! # Why
//!
//! glibc's `malloc` serves a request of 128 KiB or more with a fresh
//! `mmap` and returns it with `munmap` when freed (and a thread's arena
//! gives the top of its heap back with `MADV_DONTNEED`). Every page of
//! such a buffer then faults on its first store and is zeroed by the
//! kernel, on every message: a `REL` that pushes 32 pages (a 3-D stencil's
//! halo, 128 KiB) cost its sender a fresh mapping of 33 pages for the
//! frame and another for the copy that put the held step records in
//! front, and its receiver a third: 69 µs to build the frame, 33 µs to
//! install it, where the copies themselves take a tenth of that
//! (BENCHMARKS.md, "Large frames"). A buffer used again has its pages
//! mapped already.
//!
//! # What is kept
//!
//! Only buffers of at least [`LARGE`] bytes (smaller ones come from the
//! allocator's heap, whose pages stay mapped), at most [`KEPT`] of them
//! and [`KEPT_BYTES`] in all, per process. A buffer taken while none fits
//! is allocated; one given back past those limits is freed. So a node
//! holds at most [`KEPT_BYTES`] more than it would without the pool, and
//! after a burst of large frames gives the rest back to the allocator.

use std::sync::Mutex;

/// The smallest buffer kept: below glibc's mapping threshold (128 KiB)
/// with room to spare, so that a frame a little smaller, whose buffer
/// comes from a thread arena's top, is kept too.
pub const LARGE: usize = 64 << 10;
/// How many buffers the pool keeps at most.
pub const KEPT: usize = 32;
/// How many bytes of buffers the pool keeps at most.
pub const KEPT_BYTES: usize = 32 << 20;

struct Pool {
    bufs: Vec<Vec<u8>>,
    bytes: usize,
}

static POOL: Mutex<Pool> = Mutex::new(Pool {
    bufs: Vec::new(),
    bytes: 0,
});

fn pool() -> std::sync::MutexGuard<'static, Pool> {
    POOL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The kept buffer whose capacity is the smallest of at least `cap`, with
/// its bytes as they were (initialized: every buffer kept was a `Vec<u8>`
/// of that length).
fn take(cap: usize) -> Option<Vec<u8>> {
    if cap < LARGE {
        return None;
    }
    let mut p = pool();
    let (i, _) = p
        .bufs
        .iter()
        .enumerate()
        .filter(|(_, b)| b.capacity() >= cap)
        .min_by_key(|(_, b)| b.capacity())?;
    let b = p.bufs.swap_remove(i);
    p.bytes -= b.capacity();
    Some(b)
}

/// An empty buffer of at least `cap` bytes' capacity: a kept one if one
/// fits, else a new one.
///
/// ```
/// use hyfi_core::link::buffers;
/// let mut frame = buffers::with_capacity(256 << 10);
/// frame.extend_from_slice(&[1, 2, 3]);
/// buffers::recycle(frame);
/// // The next large frame gets the same pages, already mapped.
/// let again = buffers::with_capacity(200 << 10);
/// assert!(again.is_empty() && again.capacity() >= 256 << 10);
/// ```
pub fn with_capacity(cap: usize) -> Vec<u8> {
    match take(cap) {
        Some(mut b) => {
            b.clear();
            b
        }
        None => Vec::with_capacity(cap),
    }
}

/// A buffer of exactly `len` bytes to be overwritten (a frame's payload
/// read from a link): a kept one, its old bytes left in place (the reader
/// overwrites them all), or a new one of zeros.
pub fn filled(len: usize) -> Vec<u8> {
    match take(len) {
        Some(mut b) => {
            if b.len() >= len {
                b.truncate(len);
            } else {
                b.resize(len, 0);
            }
            b
        }
        None => vec![0; len],
    }
}

/// Gives `buf` back: kept for the next large frame if it is large and the
/// pool has room, freed otherwise.
pub fn recycle(buf: Vec<u8>) {
    let cap = buf.capacity();
    if cap < LARGE {
        return;
    }
    let mut p = pool();
    if p.bufs.len() < KEPT && p.bytes + cap <= KEPT_BYTES {
        p.bytes += cap;
        p.bufs.push(buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the pool is the process's, and tests run in parallel.
    #[test]
    fn large_buffers_are_used_again_small_ones_and_the_surplus_are_freed() {
        // Small: never kept.
        let small = with_capacity(100);
        let p = small.as_ptr();
        recycle(small);
        assert!(pool().bufs.iter().all(|b| b.as_ptr() != p));

        // Large: the same allocation comes back, for a smaller request too,
        // empty for appending and of the asked length for reading into.
        let mut big = with_capacity(3 * LARGE);
        big.extend_from_slice(&[7; 100]);
        let p = big.as_ptr();
        recycle(big);
        let again = with_capacity(2 * LARGE + 1);
        assert_eq!(again.as_ptr(), p);
        assert!(again.is_empty());
        recycle(again);
        let read_into = filled(LARGE);
        assert_eq!(read_into.len(), LARGE);
        let p2 = read_into.as_ptr();
        recycle(read_into);
        let longer = filled(3 * LARGE);
        assert_eq!(longer.as_ptr(), p2);
        assert_eq!(longer.len(), 3 * LARGE);
        // The bytes past what an earlier user wrote are zeros.
        assert!(longer[LARGE..].iter().all(|&b| b == 0));
        recycle(longer);

        // A request larger than any kept buffer gets a new one.
        let huge = with_capacity(KEPT_BYTES / 2);
        assert!(huge.capacity() >= KEPT_BYTES / 2);

        // Past the byte limit, a buffer given back is freed.
        let (a, b) = (filled(KEPT_BYTES / 2), filled(KEPT_BYTES / 2));
        recycle(huge);
        recycle(a);
        recycle(b);
        let p = pool();
        assert!(p.bytes <= KEPT_BYTES && p.bufs.len() <= KEPT);
        assert_eq!(p.bytes, p.bufs.iter().map(|b| b.capacity()).sum::<usize>());
    }
}
