//! Reduction variables (paper §3.4): private copies, one per pool,
//! combined by post-phase code with
//! [`PostPhase::reduce`](crate::PostPhase::reduce). What a program sees is
//! on [`Reduction`]; this module also holds the segment-local accumulators
//! ([`Local`], [`LocalWith`]) and the built-in operators ([`Op`], [`Arith`]).

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;

use crate::error::Error;
use crate::phase::CopyAt;
use crate::sched::Ctx;

/// A reduction variable of plain-data type `T` (paper §3.4): private
/// copies combined by post-phase code with
/// [`PostPhase::reduce`](crate::PostPhase::reduce).
///
/// The paper keeps one private copy per processor. Here each *chunk* of a
/// pool has its own copy (a pool is cut into chunks,
/// [`Config::chunks`](crate::Config::chunks), which the node's processors
/// share out while the phase runs; processor 0's first chunk's copy is
/// also the one fork-join filaments use): the chunks of a processor
/// interleave whenever one waits for a shared page, in an order that
/// depends on when pages arrive, and which processor runs a chunk depends
/// on timing, so with one copy per processor a floating-point sum would
/// come out differently from run to run. Filaments read and write their
/// chunk's copy through the [`Ctx`] they are given, with no
/// synchronization: a copy belongs to one filthread at a time, and copies
/// sit on separate cache lines.
///
/// A reduce combines the copies in a fixed order — on each processor in
/// pool order and within a pool in chunk order, then the processors of the
/// node in order, then the nodes in the node layer's fixed tree order —
/// and writes the result back into every copy. A given configuration
/// (nodes, processors, pools, chunks, and what each pool holds) therefore
/// reproduces its result bit for bit, whatever the order in which pages
/// arrive and whichever processor ran each chunk. A chunk's copy starts
/// from the variable's `init` (or from the value a reduce or
/// [`PostPhase::set`](crate::PostPhase::set) last wrote to every copy), so
/// start a sum from 0 and reset it with `set` after each reduce.
///
/// In fork-join runs the filthreads of a processor share its copy and the
/// order of their updates depends on stealing: reduce exact types there
/// (integers), or return values through joins.
///
/// A reduction of a type of your own (here: the largest value and where it
/// is, lowest index on ties, as a sequential scan would find it):
///
/// ```
/// use hyfi::{bytemuck, Config, Control, PoolArray, Program, Runtime};
///
/// #[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
/// #[bytemuck(crate = "hyfi::bytemuck")]
/// #[repr(C)]
/// struct ArgMax { value: f64, index: u64 }
///
/// fn better(a: ArgMax, b: ArgMax) -> ArgMax {
///     if b.value > a.value || (b.value == a.value && b.index < a.index) { b } else { a }
/// }
/// let f = |i: usize| ((i * 37) % 101) as f64;
/// let rt = Runtime::new(Config::new().procs(2).pin(false)).unwrap();
/// let best = rt.reduction(ArgMax { value: f64::MIN, index: u64::MAX });
/// let mut found = None;
/// let mut prog = Program::new();
/// prog.phase(
///     PoolArray::block(&rt, 0..1000, 1),
///     |ctx, i| best.update(ctx, |b| better(b, ArgMax { value: f(i), index: i as u64 })),
///     |post| { found = Some(post.reduce_with(&best, better)); Control::Done },
/// );
/// rt.start(&mut prog).unwrap();
/// drop(prog);
/// let seq = (0..1000).fold(ArgMax { value: f64::MIN, index: u64::MAX }, |b, i| better(b, ArgMax { value: f(i), index: i as u64 }));
/// assert_eq!(found, Some(seq));
/// ```
///
/// In a phase declared with [`Program::phase_with`](crate::Program::phase_with),
/// a segment folds into an accumulator in a register instead:
/// [`local`](Reduction::local) for the built-in numbers and operators,
/// [`local_with`](Reduction::local_with) for a type and combining function
/// of your own, as here.
pub struct Reduction<T> {
    rt: u64,
    copies: Box<[CachePadded<ProcCopies<T>>]>,
    /// The value a pool's copy starts from when that pool first touches
    /// the variable: `init`, or what was last written to every copy.
    base: UnsafeCell<T>,
    /// Reduced by its phase's end ([`crate::Program::reduce_at_end`]):
    /// set before the post-phase code runs, cleared after it, so that
    /// `PostPhase::reduce_with` returns the result instead of reducing
    /// it again. Written only by the master at the phase barrier.
    pub(crate) reduced_at_end: std::sync::atomic::AtomicBool,
}

/// One processor's private copies: slot 0's (pool 0's first chunk, also
/// fork-join's) inline, the other slots' (one per chunk of each of the
/// processor's pools, see `phase/share.rs`) made on first use. Those live
/// in buckets that never move, bucket `b` holding slots `2^b .. 2^(b+1)`,
/// each bucket made whole by whoever first needs one of its slots and
/// published with a compare-and-swap: the processor that owns the pool
/// and another that took one of its chunks may both make slots at once,
/// and a [`Local`] of one chunk keeps a pointer to its slot while other
/// chunks run.
struct ProcCopies<T> {
    first: UnsafeCell<T>,
    buckets: [AtomicPtr<Slot<T>>; BUCKETS],
    /// One past the highest slot ever handed out: the slots a reduce
    /// combines (those below it never touched hold the start value, as
    /// they would have had they been made).
    used: AtomicUsize,
}

type Slot<T> = CachePadded<UnsafeCell<T>>;

/// Slots `1..2^BUCKETS`: more than a processor's pools times chunks can be.
const BUCKETS: usize = usize::BITS as usize - 1;

/// The bucket of slot `k` (≥ 1) and its place in it.
#[inline(always)]
fn bucket_of(k: usize) -> (usize, usize) {
    let b = (usize::BITS - 1 - k.leading_zeros()) as usize;
    (b, k - (1 << b))
}

impl<T> Drop for ProcCopies<T> {
    fn drop(&mut self) {
        for (b, p) in self.buckets.iter_mut().enumerate() {
            let p = *p.get_mut();
            if !p.is_null() {
                // SAFETY: made by `Box::into_raw` of a boxed slice of
                // `1 << b` slots in `slot_made`, and owned here alone.
                drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, 1 << b)) });
            }
        }
    }
}

// SAFETY: a copy slot is accessed only by the filthread running the chunk
// that owns it (`CopyAt`, set from the chunk a processor took with a
// compare-and-swap, so one at a time; a chunk's filthread stays on one
// server thread), or by post-phase code and the Runtime while every server
// thread is quiescent at a barrier or idle between programs; `base` is
// written only then, and read by server threads only while no one writes
// it. Slots are made with atomics (`slot_made`). T: Send lets the value
// move between those threads.
unsafe impl<T: Send> Sync for Reduction<T> {}
unsafe impl<T: Send> Send for Reduction<T> {}

impl<T: bytemuck::Pod + Send + Sync> Reduction<T> {
    pub(crate) fn new(rt: u64, procs: usize, init: T) -> Self {
        Reduction {
            rt,
            copies: (0..procs)
                .map(|_| {
                    CachePadded::new(ProcCopies {
                        first: UnsafeCell::new(init),
                        buckets: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
                        used: AtomicUsize::new(1),
                    })
                })
                .collect(),
            base: UnsafeCell::new(init),
            reduced_at_end: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Combines every copy of the node's `procs` processors with
    /// `combine`: processor by processor, each in slot order (pool, then
    /// chunk: a fixed order, so the result depends neither on how the
    /// chunks interleaved nor on which processor ran them).
    ///
    /// # Safety
    /// No server thread may be accessing the copies.
    pub(crate) unsafe fn combine_node(&self, procs: usize, combine: impl Fn(T, T) -> T) -> T {
        let mut acc: Option<T> = None;
        for p in 0..procs {
            // SAFETY: the caller's.
            unsafe {
                self.for_each_copy(p, |v| {
                    acc = Some(match acc {
                        None => v,
                        Some(a) => combine(a, v),
                    })
                })
            };
        }
        // A runtime has at least one processor, whose pool-0 copy always exists.
        acc.unwrap_or_else(|| unsafe { self.read(0) })
    }

    pub(crate) fn check(&self, rt: u64) -> Result<(), Error> {
        if rt == self.rt {
            Ok(())
        } else {
            Err(Error::ForeignReduction)
        }
    }

    /// The running chunk's copy.
    #[inline(always)]
    fn slot(&self, ctx: &Ctx) -> *mut T {
        if ctx.rt_id != self.rt {
            foreign();
        }
        let at = ctx.copy.get();
        // SAFETY: the runtime that made this reduction has exactly
        // `copies.len()` processors, and ctx belongs to it (checked above);
        // `at.proc` is one of them (a processor index of that runtime).
        let pc = unsafe { self.copies.get_unchecked(at.proc) };
        match at.slot {
            0 => pc.first.get(),
            k => self.slot_k(pc, k),
        }
    }

    /// Slot `k`'s copy (`k` ≥ 1): a load of its bucket, inline, since a
    /// filament that folds per call (`fold`, `update`) in any chunk but a
    /// processor's first comes here every time.
    #[inline(always)]
    fn slot_k(&self, pc: &ProcCopies<T>, k: usize) -> *mut T {
        let (b, i) = bucket_of(k);
        let p = pc.buckets[b].load(Ordering::Acquire);
        if p.is_null() || pc.used.load(Ordering::Relaxed) <= k {
            return self.slot_made(pc, k);
        }
        // SAFETY: bucket `b` holds `1 << b` slots and `i < 1 << b`.
        unsafe { (*p.add(i)).get() }
    }

    /// Slot `k`'s copy (`k` ≥ 1), its bucket made on first use from
    /// `base`, and `used` raised past it. Out of line: a segment-local
    /// accumulator's drop calls it in the segment loop (inlined there, a
    /// larger drop made LLVM schedule red-black SOR's loop 2× slower).
    #[inline(never)]
    fn slot_made(&self, pc: &ProcCopies<T>, k: usize) -> *mut T {
        let (b, i) = bucket_of(k);
        let mut p = pc.buckets[b].load(Ordering::Acquire);
        if p.is_null() {
            p = self.make_bucket(pc, b);
        }
        if pc.used.load(Ordering::Relaxed) <= k {
            pc.used.fetch_max(k + 1, Ordering::Relaxed);
        }
        // SAFETY: bucket `b` holds `1 << b` slots and `i < 1 << b`.
        unsafe { (*p.add(i)).get() }
    }

    #[cold]
    fn make_bucket(&self, pc: &ProcCopies<T>, b: usize) -> *mut Slot<T> {
        // SAFETY: `base` is not written while filaments run.
        let v = unsafe { *self.base.get() };
        let fresh: Box<[Slot<T>]> = (0..1usize << b)
            .map(|_| CachePadded::new(UnsafeCell::new(v)))
            .collect();
        let fresh = Box::into_raw(fresh) as *mut Slot<T>;
        match pc.buckets[b].compare_exchange(
            std::ptr::null_mut(),
            fresh,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => fresh,
            Err(won) => {
                // SAFETY: ours, never published.
                drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(fresh, 1 << b)) });
                won
            }
        }
    }

    /// Calls `f` with every slot of `pc` below its `used` mark, in order
    /// (a slot whose bucket was never made holds `base`).
    ///
    /// # Safety
    /// No server thread may be accessing the copies.
    unsafe fn each_slot(&self, pc: &ProcCopies<T>, mut f: impl FnMut(*mut T)) {
        f(pc.first.get());
        let mut base = *self.base.get();
        for k in 1..pc.used.load(Ordering::Relaxed) {
            let (b, i) = bucket_of(k);
            let p = pc.buckets[b].load(Ordering::Acquire);
            if p.is_null() {
                f(&mut base);
            } else {
                f((*p.add(i)).get());
            }
        }
    }

    /// This chunk's copy, for reductions that update it in place (exact
    /// sums). Valid while the calling filthread neither suspends nor
    /// returns to its pool loop.
    #[inline(always)]
    pub(crate) fn copy_ptr(&self, ctx: &Ctx) -> *mut T {
        self.slot(ctx)
    }

    /// Where the copy `ctx` uses is, for accumulators that find it later
    /// with [`Reduction::copy_of`].
    #[inline]
    pub(crate) fn owner(&self, ctx: &Ctx) -> CopyAt {
        if ctx.rt_id != self.rt {
            foreign();
        }
        ctx.copy.get()
    }

    /// The copy at `at`, made if need be. Only the filthread running the
    /// chunk that owns it may call it, as [`Local`]'s drop does.
    pub(crate) fn copy_of(&self, at: CopyAt) -> *mut T {
        let pc = &self.copies[at.proc];
        match at.slot {
            0 => pc.first.get(),
            // Out of line: an accumulator's drop runs in a segment's loop.
            k => self.slot_made(pc, k),
        }
    }

    /// This chunk's copy (`filGetVal`; in fork-join, this processor's):
    /// after a reduce or a [`PostPhase::set`](crate::PostPhase::set), the
    /// value it wrote; while a phase runs, that value and what the
    /// chunk's filaments folded so far (a pool is cut into chunks, each
    /// with its own copy: [`Config::chunks`](crate::Config::chunks)).
    #[inline(always)]
    pub fn get(&self, ctx: &Ctx) -> T {
        // SAFETY: see the Sync impl: only this chunk's filthread touches its copy now.
        unsafe { *self.slot(ctx) }
    }

    /// Sets this chunk's copy (in fork-join, this processor's).
    #[inline(always)]
    pub fn set(&self, ctx: &Ctx, v: T) {
        // SAFETY: as in `get`.
        unsafe { *self.slot(ctx) = v }
    }

    /// Replaces this pool's copy `v` by `f(v)` (in fork-join, this
    /// processor's).
    ///
    /// The copy goes to `f` and back by value: for a value of many words
    /// (an array of sums, a histogram) that is a copy of every byte per
    /// call; keep a segment-local accumulator instead
    /// ([`local_with`](Reduction::local_with)) and change it in place
    /// ([`LocalWith::update`]).
    ///
    /// `f` must not wait: it may not touch a shared array whose page is
    /// not here, join, or otherwise suspend its filthread, since another
    /// filthread of the processor could update the same copy meanwhile and
    /// one of the two updates would be lost. Trying panics, saying so.
    /// Read what the update needs first, then call `update` with plain
    /// arithmetic:
    ///
    /// ```
    /// use hyfi::{Config, Control, Dsm, Op, PoolArray, Program, Runtime};
    ///
    /// let rt = Runtime::new(Config::new().procs(2).pin(false))?;
    /// let dsm = Dsm::new(&rt)?;
    /// let data = dsm.vec::<u64>(100).from_fn(|i| i as u64)?;
    /// let total = rt.reduction(0u64);
    /// let mut sum = 0;
    /// let mut prog = Program::new();
    /// prog.phase(
    ///     PoolArray::block(&rt, 0..100, 4),
    ///     |ctx, i| {
    ///         let x = data.get(i); // may wait for a page: outside the update
    ///         total.update(ctx, |s| s + x);
    ///     },
    ///     |post| { sum = post.reduce(&total, Op::Sum); Control::Done },
    /// );
    /// rt.start(&mut prog)?;
    /// drop(prog);
    /// assert_eq!(sum, 4950);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline(always)]
    pub fn update(&self, ctx: &Ctx, f: impl FnOnce(T) -> T) {
        let s = self.slot(ctx);
        let _no_wait = NoSuspend::enter(ctx);
        // SAFETY: as in `get`; the value is read out before `f` runs, so no
        // reference into the copy is alive while user code runs, and `f`
        // cannot suspend (NoSuspend), so no other filthread of this
        // processor runs between the read and the write.
        unsafe { *s = f(*s) }
    }

    /// Folds `v` into this pool's copy with `op`: for [`Op::Max`] and
    /// [`Op::Min`] one compare (`if v > copy { copy = v }`), not the
    /// NaN-handling `f64::max` (a NaN `v` is ignored either way).
    #[inline(always)]
    pub fn fold(&self, ctx: &Ctx, op: Op, v: T)
    where
        T: Arith,
    {
        let s = self.slot(ctx);
        // SAFETY: as in `get`; no user code runs between the read and the write.
        unsafe { *s = op.fold(*s, v) }
    }

    /// A segment-local accumulator for this pool's copy: folds stay in a
    /// register, and the accumulated value is folded into the copy (with
    /// `op`) when the accumulator is dropped. Made by the `bind` closure
    /// of [`Program::phase_with`](crate::Program::phase_with), it lives for
    /// one pool segment.
    ///
    /// It starts from `op`'s identity and combines at its end, so in
    /// fork-join (where the filthreads of a processor share its copy)
    /// another filthread may fold into the copy meanwhile without either
    /// losing an update.
    ///
    /// **Rounding.** The segment's values are combined with each other
    /// first and their total with the copy at the end: `copy + (v1 + v2 +
    /// …)`, where [`update`](Reduction::update) and
    /// [`fold`](Reduction::fold) compute `(copy + v1) + v2 …`. For
    /// integers and for `Max`/`Min` that is the same value; a
    /// floating-point `Sum` or `Product` rounds differently, so the same
    /// phase written with `local` and with `update` may differ in the last
    /// bits (each is still the same from run to run on a given
    /// configuration). For a sum that does not depend on the grouping at
    /// all, use an [`ExactSum`](crate::ExactSum).
    ///
    /// Only the built-in numbers ([`Arith`]) have an `Op`; for a type of
    /// your own, reduced with
    /// [`PostPhase::reduce_with`](crate::PostPhase::reduce_with), use
    /// [`local_with`](Reduction::local_with).
    #[inline]
    pub fn local<'r>(&'r self, ctx: &Ctx, op: Op) -> Local<'r, T>
    where
        T: Arith,
    {
        if ctx.rt_id != self.rt {
            foreign();
        }
        Local {
            r: self,
            at: ctx.copy.get(),
            acc: T::identity(op),
            op,
            _not_send: std::marker::PhantomData,
        }
    }

    /// A segment-local accumulator, as [`local`](Reduction::local), for a
    /// reduction combined by a function of your own (the one you give
    /// [`PostPhase::reduce_with`](crate::PostPhase::reduce_with)): it
    /// starts from `identity` (a value `combine` leaves the other operand
    /// unchanged with), folds with `combine(acc, v)`, and when dropped,
    /// at the segment's end, replaces this pool's copy `c` by
    /// `combine(c, acc)`.
    ///
    /// `combine` must be associative, as for `reduce_with`, and must not
    /// wait (as [`update`](Reduction::update)'s closure: touching a shared
    /// page that is not here panics while it folds into the copy).
    ///
    /// The largest value and where it is, lowest index on ties, as a
    /// sequential scan finds it:
    ///
    /// ```
    /// use hyfi::{bytemuck, Config, Control, PoolArray, Program, Runtime};
    ///
    /// #[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
    /// #[bytemuck(crate = "hyfi::bytemuck")]
    /// #[repr(C)]
    /// struct ArgMax { value: f64, index: u64 }
    ///
    /// fn better(a: ArgMax, b: ArgMax) -> ArgMax {
    ///     if b.value > a.value || (b.value == a.value && b.index < a.index) { b } else { a }
    /// }
    /// const NONE: ArgMax = ArgMax { value: f64::MIN, index: u64::MAX }; // better(NONE, x) == x
    ///
    /// let data: Vec<f64> = (0..1000).map(|i| ((i * 37) % 101) as f64).collect();
    /// let rt = Runtime::new(Config::new().procs(2).pin(false))?;
    /// let best = rt.reduction(NONE);
    /// let mut found = NONE;
    /// let mut prog = Program::new();
    /// prog.phase_with(
    ///     PoolArray::block(&rt, 0..data.len(), 1),
    ///     |ctx, _span| best.local_with(ctx, NONE, better),
    ///     |_ctx, i, best| best.fold(ArgMax { value: data[i], index: i as u64 }),
    ///     |post| { found = post.reduce_with(&best, better); Control::Done },
    /// );
    /// rt.start(&mut prog)?;
    /// drop(prog);
    /// let seq = (0..data.len()).fold(NONE, |b, i| better(b, ArgMax { value: data[i], index: i as u64 }));
    /// assert_eq!(found, seq);
    /// assert_eq!(found, ArgMax { value: 100.0, index: 30 });
    /// # Ok::<(), hyfi::Error>(())
    /// ```
    #[inline]
    pub fn local_with<'r, F>(&'r self, ctx: &Ctx, identity: T, combine: F) -> LocalWith<'r, T, F>
    where
        F: Fn(T, T) -> T,
    {
        if ctx.rt_id != self.rt {
            foreign();
        }
        LocalWith {
            r: self,
            at: ctx.copy.get(),
            acc: identity,
            combine,
            _not_send: std::marker::PhantomData,
        }
    }

    /// Calls `f` with every copy of processor `p`, in slot order.
    ///
    /// # Safety
    /// No server thread may be accessing the copies.
    pub(crate) unsafe fn for_each_copy(&self, p: usize, mut f: impl FnMut(T)) {
        self.each_slot(&self.copies[p], |c| f(*c));
    }

    /// Processor `p`'s first copy (pool 0's, fork-join's).
    ///
    /// # Safety
    /// No server thread may be accessing the copies.
    pub(crate) unsafe fn read(&self, p: usize) -> T {
        *self.copies[p].first.get()
    }

    /// The variable's value if every copy of the node's `procs` processors
    /// holds it (in its bits: the value last written to every copy, by a
    /// reduce or a set); `None` if the filaments updated a copy since, so
    /// that no copy alone is its value (`PostPhase::get`, `Runtime::get`).
    ///
    /// # Safety
    /// As for `read`.
    pub(crate) unsafe fn value(&self, procs: usize) -> Option<T> {
        let base = *self.base.get();
        let mut differs = false;
        for p in 0..procs {
            self.for_each_copy(p, |v| {
                differs |= bytemuck::bytes_of(&v) != bytemuck::bytes_of(&base);
            });
        }
        (!differs).then_some(base)
    }

    /// Reduces the variable: the node's `procs` processors' copies in
    /// their fixed order, then the nodes' over `link`; the result goes into
    /// every copy (`PostPhase::reduce_with`, `Runtime::reduce_with`).
    ///
    /// # Safety
    /// As for `read`.
    pub(crate) unsafe fn reduce_everywhere(
        &self,
        procs: usize,
        link: &dyn crate::NodeLink,
        combine: impl Fn(T, T) -> T,
    ) -> Result<T, crate::LinkError> {
        let mut acc = self.combine_node(procs, &combine);
        link.allreduce(
            bytemuck::bytes_of_mut(&mut acc),
            &mut |a: &mut [u8], b: &[u8]| {
                let x: T = bytemuck::pod_read_unaligned(a);
                let y: T = bytemuck::pod_read_unaligned(b);
                a.copy_from_slice(bytemuck::bytes_of(&combine(x, y)));
            },
        )?;
        self.write_all(acc);
        Ok(acc)
    }

    /// Writes `v` into every copy, and into the copies pools make later.
    ///
    /// # Safety
    /// As for `read`.
    pub(crate) unsafe fn write_all(&self, v: T) {
        *self.base.get() = v;
        for pc in self.copies.iter() {
            self.each_slot(pc, |c| *c = v);
        }
    }
}

/// Marks the running filthread as inside a `Reduction::update` closure
/// (where [`crate::filthread::suspend`] panics) until dropped, unwinding
/// included, so a panicking closure does not leave the mark behind.
struct NoSuspend<'c> {
    ctx: &'c Ctx,
    prev: bool,
}

impl<'c> NoSuspend<'c> {
    #[inline(always)]
    fn enter(ctx: &'c Ctx) -> Self {
        NoSuspend {
            ctx,
            prev: ctx.in_update.replace(true),
        }
    }
}

impl Drop for NoSuspend<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        self.ctx.in_update.set(self.prev);
    }
}

/// A segment-local accumulator of a [`Reduction`] (see
/// [`Reduction::local`]). It is neither `Send` nor `Sync`: it belongs to the
/// processor whose copy it folds into.
pub struct Local<'r, T: Arith> {
    // The copy is found at the drop, not here: `local` stays two loads, so
    // a `bind` closure that makes one is still inlined into the pool loop,
    // where `op` is a constant and `acc` a register (measured: finding the
    // copy here made Jacobi's per-point filaments 2× slower on one core).
    r: &'r Reduction<T>,
    at: CopyAt,
    acc: T,
    op: Op,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl<T: Arith> Local<'_, T> {
    /// Folds `v` into the accumulator.
    #[inline(always)]
    pub fn fold(&mut self, v: T) {
        self.acc = self.op.fold(self.acc, v);
    }
    /// The value accumulated so far (the op's identity at first).
    #[inline]
    pub fn value(&self) -> T {
        self.acc
    }
}

impl<T: Arith> Drop for Local<'_, T> {
    fn drop(&mut self) {
        let slot = self.r.copy_of(self.at);
        // SAFETY: `slot` is the copy of the chunk whose filthread made the
        // accumulator (through its Ctx), and the accumulator, being !Send,
        // is dropped on that filthread's server thread while the chunk
        // runs (it lives in the chunk's bound values), so no other thread
        // touches the slot; no user code runs between the read and the
        // write.
        unsafe { *slot = self.op.apply(*slot, self.acc) }
    }
}

/// A segment-local accumulator of a [`Reduction`] combined by a function
/// of your own (see [`Reduction::local_with`]). Like [`Local`], it is
/// neither `Send` nor `Sync`.
pub struct LocalWith<'r, T: bytemuck::Pod + Send + Sync, F: Fn(T, T) -> T> {
    // As in `Local`: the copy is found at the drop.
    r: &'r Reduction<T>,
    at: CopyAt,
    acc: T,
    combine: F,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl<T: bytemuck::Pod + Send + Sync, F: Fn(T, T) -> T> LocalWith<'_, T, F> {
    /// Folds `v` into the accumulator: `acc = combine(acc, v)`.
    #[inline(always)]
    pub fn fold(&mut self, v: T) {
        self.acc = (self.combine)(self.acc, v);
    }
    /// Changes the accumulator in place, as folding a value into it would:
    /// for a value of many words (a histogram, a k-means step's sums per
    /// cluster), where each filament adds to one or two of its entries.
    /// `fold` of a whole `T` per filament, or [`Reduction::update`] (which
    /// takes and returns the chunk's copy by value), moves every byte of
    /// `T` for each filament; this touches the entries `f` touches, as a
    /// sequential loop's local array does.
    ///
    /// Its result must be what folding the filament's contribution with
    /// `combine` would give (for a sum per entry: add to the entry), so
    /// that the total does not depend on how the filaments were grouped.
    ///
    /// ```
    /// use hyfi::{Config, Control, PoolArray, Program, Runtime};
    ///
    /// // A histogram of 64 bins, one filament per value.
    /// let data: Vec<u8> = (0..10_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    /// let add = |mut a: [u64; 64], b: [u64; 64]| { a.iter_mut().zip(b).for_each(|(x, y)| *x += y); a };
    /// let rt = Runtime::new(Config::new().procs(2).pin(false))?;
    /// let hist = rt.reduction([0u64; 64]);
    /// let mut counts = [0u64; 64];
    /// let mut prog = Program::new();
    /// prog.phase_with(
    ///     PoolArray::block(&rt, 0..data.len(), 1),
    ///     |ctx, _span| hist.local_with(ctx, [0; 64], add),
    ///     |_ctx, i, hist| hist.update(|h| h[usize::from(data[i] / 4)] += 1),
    ///     |post| { counts = post.reduce_with(&hist, add); Control::Done },
    /// );
    /// rt.start(&mut prog)?;
    /// drop(prog);
    /// let mut seq = [0u64; 64];
    /// data.iter().for_each(|&v| seq[usize::from(v / 4)] += 1);
    /// assert_eq!(counts, seq);
    /// # Ok::<(), hyfi::Error>(())
    /// ```
    #[inline(always)]
    pub fn update(&mut self, f: impl FnOnce(&mut T)) {
        f(&mut self.acc);
    }
    /// The value accumulated so far (the identity at first).
    #[inline]
    pub fn value(&self) -> T {
        self.acc
    }
}

impl<T: bytemuck::Pod + Send + Sync, F: Fn(T, T) -> T> Drop for LocalWith<'_, T, F> {
    fn drop(&mut self) {
        let slot = self.r.copy_of(self.at);
        // `combine` is user code run between the read and the write: it
        // must not suspend, or another filthread of this processor could
        // write the copy meanwhile (fork-join) and lose an update. The
        // accumulator is dropped on its server thread (it is !Send), whose
        // Ctx the thread-local finds.
        let _no_wait = crate::sched::try_current_ctx().map(NoSuspend::enter);
        // SAFETY: `slot` is the copy of the chunk whose filthread made the
        // accumulator (as in `Local`'s drop); the value is read out
        // before `combine` runs, so no reference into the copy is alive
        // while user code runs.
        unsafe {
            let c = *slot;
            *slot = (self.combine)(c, self.acc);
        }
    }
}

#[cold]
#[inline(never)]
fn foreign() -> ! {
    panic!("{}", Error::ForeignReduction)
}

impl<T: bytemuck::Pod + std::fmt::Debug> std::fmt::Debug for Reduction<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reduction")
            .field("copies", &self.copies.len())
            .finish()
    }
}

/// The built-in reduction operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Sum.
    Sum,
    /// Product.
    Product,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
}

impl Op {
    /// Applies the operator.
    #[inline]
    pub fn apply<T: Arith>(self, a: T, b: T) -> T {
        match self {
            Op::Sum => a.add(b),
            Op::Product => a.mul(b),
            Op::Max => a.max(b),
            Op::Min => a.min(b),
        }
    }

    /// Folds `v` into an accumulator `acc`: as [`Op::apply`], but
    /// [`Op::Max`]/[`Op::Min`] take `v` only if it is strictly better (one
    /// compare; a NaN `v` is ignored, as `f64::max` ignores it).
    #[inline(always)]
    pub fn fold<T: Arith>(self, acc: T, v: T) -> T {
        match self {
            Op::Sum => acc.add(v),
            Op::Product => acc.mul(v),
            Op::Max => {
                if v > acc {
                    v
                } else {
                    acc
                }
            }
            Op::Min => {
                if v < acc {
                    v
                } else {
                    acc
                }
            }
        }
    }
}

/// Numbers the built-in [`Op`]s work on.
pub trait Arith: bytemuck::Pod + Send + Sync + PartialOrd {
    /// a + b (wrapping for integers).
    fn add(self, o: Self) -> Self;
    /// a × b (wrapping for integers).
    fn mul(self, o: Self) -> Self;
    /// The larger.
    fn max(self, o: Self) -> Self;
    /// The smaller.
    fn min(self, o: Self) -> Self;
    /// The identity of `op`: 0 for sums, 1 for products, the least value
    /// (−∞ for floats) for maxima, the greatest (+∞) for minima.
    fn identity(op: Op) -> Self;
}

macro_rules! arith_int {
    ($($t:ty)*) => {$(
        impl Arith for $t {
            fn add(self, o: Self) -> Self { self.wrapping_add(o) }
            fn mul(self, o: Self) -> Self { self.wrapping_mul(o) }
            fn max(self, o: Self) -> Self { Ord::max(self, o) }
            fn min(self, o: Self) -> Self { Ord::min(self, o) }
            fn identity(op: Op) -> Self {
                match op { Op::Sum => 0, Op::Product => 1, Op::Max => <$t>::MIN, Op::Min => <$t>::MAX }
            }
        }
    )*};
}
arith_int!(i8 i16 i32 i64 i128 isize u8 u16 u32 u64 u128 usize);

macro_rules! arith_float {
    ($($t:ty)*) => {$(
        impl Arith for $t {
            fn add(self, o: Self) -> Self { self + o }
            fn mul(self, o: Self) -> Self { self * o }
            fn max(self, o: Self) -> Self { <$t>::max(self, o) }
            fn min(self, o: Self) -> Self { <$t>::min(self, o) }
            fn identity(op: Op) -> Self {
                match op { Op::Sum => 0.0, Op::Product => 1.0, Op::Max => <$t>::NEG_INFINITY, Op::Min => <$t>::INFINITY }
            }
        }
    )*};
}
arith_float!(f32 f64);
