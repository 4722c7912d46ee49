//! The shared region: one range of virtual memory, reserved at the same
//! address on every node, from which shared arrays are cut in allocation
//! order (a bump pointer: every node makes the same allocations in the same
//! order, so every array lands at the same address everywhere).
//!
//! The region is reserved with `MAP_NORESERVE`: only touched pages cost
//! memory. On several nodes it is placed at a fixed address
//! ([`DEFAULT_ADDR`], or `HYFI_DSM_ADDR`) with `MAP_FIXED_NOREPLACE`, which
//! fails instead of replacing anything already mapped there.

use crate::error::DsmError;

/// Size of a DSM page: the unit of transfer, of state and of homes.
pub const PAGE: usize = 4096;

/// Where the region goes on several nodes unless `HYFI_DSM_ADDR` says
/// otherwise: 32 TiB, far from the executable, the heap and the mmap area
/// of a 47-bit x86-64 or 48-bit AArch64 address space.
pub const DEFAULT_ADDR: usize = 0x2000_0000_0000;

/// Unused address space left after every shared array, so that arrays
/// allocated one after another do not start at addresses equal modulo a
/// large power of two.
///
/// **Why.** Two 2048² grids of `f64` (32 MiB each) cut back to back start
/// exactly 32 MiB apart; a Jacobi sweep then reads row `i` of one at the
/// same address modulo 1 MiB as it writes row `i` of the other, and on this
/// machine (AMD EPYC, KVM) the sweep took 1.45× as long as with the second
/// grid 64 KiB further on (a plain slice loop over two such mappings,
/// medians of 7 alternated runs: 0.90 s at a 0 offset, 0.62 s at 64 KiB,
/// 0.75 s for two `Vec`s, which glibc places 32 MiB + 4 KiB apart). The
/// gap costs address space only (the region is reserved, never touched
/// there): 64 KiB per array, 1/262144 of the default region per array.
pub(crate) const COLOUR_GAP: usize = 64 << 10;

/// Default region size: 16 GiB of address space (`HYFI_DSM_SIZE` changes it).
pub const DEFAULT_SIZE: usize = 16 << 30;

/// The reserved range.
pub(crate) struct Region {
    pub(crate) base: *mut u8,
    pub(crate) size: usize,
}

// SAFETY: the region is plain memory; every access to its bytes goes
// through atomics or through the page protocol's locks (see array.rs).
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

/// Why the region could not be reserved (the node says it in
/// [`DsmError::Region`]).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReserveError {
    /// `MAP_FIXED_NOREPLACE` found a mapping in the way.
    #[error("the address range is already in use in this process (one DSM per process at a time)")]
    InUse,
    /// The system refuses the address space.
    #[error("{source} (the system refuses {size} bytes of address space)")]
    NoAddressSpace {
        size: usize,
        #[source]
        source: std::io::Error,
    },
    /// Another `mmap` failure.
    #[error(transparent)]
    Os(std::io::Error),
    /// An old kernel that treats `MAP_FIXED_NOREPLACE` as a hint.
    #[error("the kernel placed it at {at:#x} instead")]
    Misplaced { at: usize },
}

impl Region {
    /// Reserves `size` bytes, at `addr` exactly if given.
    pub(crate) fn reserve(size: usize, addr: Option<usize>) -> Result<Region, ReserveError> {
        let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        if addr.is_some() {
            flags |= libc::MAP_FIXED_NOREPLACE;
        }
        let hint = addr.unwrap_or(0) as *mut libc::c_void;
        // SAFETY: an anonymous private mapping; with MAP_FIXED_NOREPLACE the
        // kernel refuses to overlap an existing mapping instead of
        // replacing it, so nothing of ours is clobbered.
        let p = unsafe { libc::mmap(hint, size, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
        if p == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::EEXIST) => ReserveError::InUse,
                Some(libc::ENOMEM) => ReserveError::NoAddressSpace { size, source: e },
                _ => ReserveError::Os(e),
            });
        }
        if let Some(a) = addr {
            if p as usize != a {
                // An old kernel that treats MAP_FIXED_NOREPLACE as a hint.
                // SAFETY: unmapping exactly what was just mapped.
                unsafe { libc::munmap(p, size) };
                return Err(ReserveError::Misplaced { at: p as usize });
            }
        }
        Ok(Region {
            base: p.cast(),
            size,
        })
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: our own mapping; every array that pointed into it is gone
        // (each holds the DSM, which holds the region).
        unsafe { libc::munmap(self.base.cast(), self.size) };
    }
}

/// `HYFI_DSM_SIZE`: bytes, optionally with a K/M/G/T suffix.
pub(crate) fn size_from_env() -> Result<usize, DsmError> {
    let Ok(v) = std::env::var("HYFI_DSM_SIZE") else {
        return Ok(DEFAULT_SIZE);
    };
    hyfi_core::parse_size(&v)
        .filter(|s| *s >= PAGE)
        .map(|s| s.div_ceil(PAGE) * PAGE)
        .ok_or(DsmError::BadEnv {
            var: "HYFI_DSM_SIZE",
            value: v,
            expected: "a size in bytes of at least 4096, optionally with a K, M, G or T suffix",
        })
}

/// `HYFI_DSM_ADDR`: a page-aligned address in hex (`0x...`) or decimal.
pub(crate) fn addr_from_env() -> Result<Option<usize>, DsmError> {
    let Ok(v) = std::env::var("HYFI_DSM_ADDR") else {
        return Ok(None);
    };
    let t = v.trim();
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(h) => usize::from_str_radix(h, 16).ok(),
        None => t.parse().ok(),
    };
    parsed
        .filter(|a| *a != 0 && a % PAGE == 0)
        .map(Some)
        .ok_or(DsmError::BadEnv {
            var: "HYFI_DSM_ADDR",
            value: v,
            expected: "a non-zero page-aligned address, such as 0x200000000000",
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_reservation_refuses_to_overlap() {
        let a = Region::reserve(1 << 20, None).unwrap();
        let at = a.base as usize;
        let err = Region::reserve(1 << 20, Some(at)).err().unwrap();
        assert!(matches!(err, ReserveError::InUse), "{err}");
        assert!(err.to_string().contains("already in use"), "{err}");
        drop(a);
        let b = Region::reserve(1 << 20, Some(at)).unwrap();
        assert_eq!(b.base as usize, at);
    }
}
