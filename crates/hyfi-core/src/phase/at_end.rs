//! Reductions a phase reduces at its end, in the same collective as the
//! node-level step ([`Program::reduce_at_end`](super::Program::reduce_at_end)).
//!
//! Post-phase code that reduces with [`PostPhase::reduce_with`] pays a
//! collective of its own after the phase's node-level step, which on
//! several nodes is itself a collective (the DSM's release, or the link's
//! barrier). A phase that names its reductions up front has them carried
//! by that step instead: the master combines the node's copies before the
//! step (the order `reduce_with` uses), the step all-reduces the bytes
//! ([`PhaseEnd::end_phase_reducing`](crate::PhaseEnd::end_phase_reducing),
//! or [`NodeLink::allreduce`](crate::NodeLink::allreduce) in place of the
//! barrier), and the result is in every copy before post-phase code runs.
//! The bits are those `reduce_with` gives: same local order, the link's
//! order across nodes.
//!
//! [`PostPhase::reduce_with`]: super::PostPhase::reduce_with

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::error::Error;
use crate::layer::Payload;
use crate::reduce::Reduction;

/// One reduction a phase reduces at its end, with its type erased.
pub(crate) trait AtEnd: Send + Sync {
    /// The reduction's runtime check.
    fn check(&self, rt: u64) -> Result<(), Error>;
    /// Its value's size in bytes.
    fn size(&self) -> usize;
    /// Appends the combination of the node's copies.
    ///
    /// # Safety
    /// Every server thread of the node is quiescent (the phase barrier).
    unsafe fn local(&self, procs: usize, out: &mut Vec<u8>);
    /// Combines `other` into `acc` (both `size()` bytes).
    fn combine(&self, acc: &mut [u8], other: &[u8]);
    /// Stores the job-wide result in every copy and marks the reduction
    /// reduced for this post-phase.
    ///
    /// # Safety
    /// As for `local`.
    unsafe fn store(&self, v: &[u8]);
    /// Clears the mark (the post-phase code has run).
    fn done(&self);
}

struct Typed<'a, T, C> {
    r: &'a Reduction<T>,
    combine: C,
    /// Bytes that follow the result (`ProgramExt::reduce_at_end_carrying`):
    /// they travel after the value.
    payload: Option<Arc<dyn Payload + 'a>>,
}

impl<T, C> AtEnd for Typed<'_, T, C>
where
    T: bytemuck::Pod + Send + Sync,
    C: Fn(T, T) -> T + Send + Sync,
{
    fn check(&self, rt: u64) -> Result<(), Error> {
        self.r.check(rt)
    }
    fn size(&self) -> usize {
        std::mem::size_of::<T>() + self.payload.as_ref().map_or(0, |p| p.size())
    }
    unsafe fn local(&self, procs: usize, out: &mut Vec<u8>) {
        // SAFETY: the caller's.
        let v = unsafe { self.r.combine_node(procs, &self.combine) };
        let at = out.len();
        out.extend_from_slice(bytemuck::bytes_of(&v));
        if let Some(p) = &self.payload {
            let k = std::mem::size_of::<T>();
            out.resize(at + k + p.size(), 0);
            let (value, bytes) = out[at..].split_at_mut(k);
            p.offer(value, bytes);
        }
    }
    fn combine(&self, acc: &mut [u8], other: &[u8]) {
        let k = std::mem::size_of::<T>();
        let x: T = bytemuck::pod_read_unaligned(&acc[..k]);
        let y: T = bytemuck::pod_read_unaligned(&other[..k]);
        let z = (self.combine)(x, y);
        let z = bytemuck::bytes_of(&z);
        // The payload follows the input the result equals (the combine
        // picks one): the accumulator's unless only the other's is it.
        if self.payload.is_some() && z != &acc[..k] && z == &other[..k] {
            acc[k..].copy_from_slice(&other[k..]);
        }
        acc[..k].copy_from_slice(z);
    }
    unsafe fn store(&self, v: &[u8]) {
        let k = std::mem::size_of::<T>();
        // SAFETY: the caller's.
        unsafe { self.r.write_all(bytemuck::pod_read_unaligned(&v[..k])) };
        self.r.reduced_at_end.store(true, Ordering::Relaxed);
        if let Some(p) = &self.payload {
            p.take(&v[..k], &v[k..]);
        }
    }
    fn done(&self) {
        self.r.reduced_at_end.store(false, Ordering::Relaxed);
    }
}

/// The reductions of one phase, in the order the program named them; their
/// values travel as one byte string, each at its offset.
#[derive(Default)]
pub(crate) struct AtEndList<'a> {
    items: Vec<Box<dyn AtEnd + 'a>>,
}

impl<'a> AtEndList<'a> {
    pub(crate) fn push<T, C>(
        &mut self,
        r: &'a Reduction<T>,
        combine: C,
        payload: Option<Arc<dyn Payload + 'a>>,
    ) where
        T: bytemuck::Pod + Send + Sync,
        C: Fn(T, T) -> T + Send + Sync + 'a,
    {
        self.items.push(Box::new(Typed {
            r,
            combine,
            payload,
        }));
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub(crate) fn check(&self, rt: u64) -> Result<(), Error> {
        self.items.iter().try_for_each(|a| a.check(rt))
    }

    /// The node's value of every reduction, one after the other.
    ///
    /// # Safety
    /// As for [`AtEnd::local`].
    pub(crate) unsafe fn local(&self, procs: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.items.iter().map(|a| a.size()).sum());
        for a in &self.items {
            // SAFETY: the caller's.
            unsafe { a.local(procs, &mut v) };
        }
        v
    }

    /// Combines two byte strings of [`AtEndList::local`]'s layout, each
    /// reduction with its own function.
    pub(crate) fn combine(&self, acc: &mut [u8], other: &[u8]) {
        let mut at = 0;
        for a in &self.items {
            let k = a.size();
            a.combine(&mut acc[at..at + k], &other[at..at + k]);
            at += k;
        }
    }

    /// Stores each result.
    ///
    /// # Safety
    /// As for [`AtEnd::local`].
    pub(crate) unsafe fn store(&self, v: &[u8]) {
        let mut at = 0;
        for a in &self.items {
            let k = a.size();
            // SAFETY: the caller's.
            unsafe { a.store(&v[at..at + k]) };
            at += k;
        }
    }

    pub(crate) fn done(&self) {
        self.items.iter().for_each(|a| a.done());
    }
}
