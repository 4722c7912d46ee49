//! Iterative filaments: phases, post-phase code, and programs (sequences of
//! phases).
//!
//! A *phase* is filament code plus *post-phase* code. Every filament of the
//! phase (spread over the processors' pools) runs once; then, after a
//! barrier, one processor per node runs the post-phase code, which may reduce
//! reduction variables and returns [`Control::Continue`] or [`Control::Done`].
//! A [`Program`] holds one or more phases run in turn (a loop body with
//! several barriers, as LU's pivot and elimination); it ends when any
//! post-phase returns `Done`.
//!
//! ```
//! use hyfi_core::{Config, Control, Op, PoolArray, Program, Runtime};
//!
//! let rt = Runtime::new(Config::new().procs(2).pin(false)).unwrap();
//! let total = rt.reduction(0u64);
//! let mut rounds = 0;
//! let mut grand = 0;
//! let mut prog = Program::new();
//! prog.phase(
//!     PoolArray::block(&rt, 0..1000, 1),
//!     |ctx, i| total.update(ctx, |s| s + i as u64),
//!     |post| {
//!         let s = post.reduce(&total, Op::Sum); // every copy now holds s
//!         assert_eq!(s, 499_500);
//!         post.set(&total, 0);
//!         grand += s;
//!         rounds += 1;
//!         if rounds == 3 { Control::Done } else { Control::Continue }
//!     },
//! );
//! rt.start(&mut prog).unwrap();
//! drop(prog);
//! assert_eq!(grand, 3 * 499_500);
//! ```
//!
//! This module holds the user's types ([`Program`], [`Control`],
//! [`PostPhase`] in `post`); `state` holds one execution of a program
//! ([`Runtime::start`](crate::Runtime::start) and the barrier's counters),
//! and `barrier` what every server thread does with it: run its pools, meet
//! the others at the phase barrier, and (processor 0) run the post-phase
//! code. The protocol is in this directory's `README.md`.

use std::marker::PhantomData;
use std::sync::Mutex;

use crate::error::Error;
use crate::exact::{ExactAccumulator, ExactSum};
use crate::pool::{each_filament, each_segment, Index, PoolArray, Span};
use crate::reduce::{Arith, Op, Reduction};
use crate::sched::Ctx;
use at_end::AtEndList;

mod at_end;
mod barrier;
mod post;
mod share;
mod state;

pub use post::PostPhase;
pub(crate) use share::{CopyAt, Shares, Taken};
pub(crate) use state::{ProgramRun, DONE};

/// What post-phase code decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    /// Run the next phase of the program (the first again after the last).
    Continue,
    /// End the program: [`Runtime::start`](crate::Runtime::start) returns.
    Done,
}

/// A phase with its types erased, as the server threads see it.
pub(crate) trait PhaseBody: Sync {
    fn procs(&self) -> usize;
    /// The pools cut into chunks, and who runs which (`share.rs`).
    fn shares(&self) -> &Shares;
    /// Runs chunk `t`'s filaments, in order.
    fn run_chunk(&self, ctx: &Ctx, t: Taken);
    fn post(&self, post: &mut PostPhase<'_>) -> Control;
}

struct PhaseImpl<'a, I: Index, F> {
    /// The pools, cut into chunks (the pools themselves are not kept).
    shares: Shares,
    _index: PhantomData<fn(I)>,
    filament: F,
    // Boxed so that PhaseImpl itself holds no UnsafeCell: `&self` in
    // `run_pool` is then `noalias readonly`, which lets the compiler keep
    // what the filament captured by value in registers across the pool.
    // Type-erased so that the phase's loop is one function per filament,
    // not one per post-phase closure: two phases sharing a filament share
    // its one call site (see `run_pool`).
    post: Post<'a>,
}

/// A phase's post-phase code, type-erased.
type Post<'a> = Box<Mutex<dyn FnMut(&mut PostPhase<'_>) -> Control + Send + 'a>>;

impl<I, F> PhaseBody for PhaseImpl<'_, I, F>
where
    I: Index,
    F: Fn(&Ctx, I) + Sync,
{
    fn procs(&self) -> usize {
        self.shares.procs()
    }
    fn shares(&self) -> &Shares {
        &self.shares
    }
    fn run_chunk(&self, ctx: &Ctx, t: Taken) {
        let f = &self.filament;
        each_filament(self.shares.segs(t), |i| f(ctx, i));
        ctx.count_filaments(self.shares.filaments(t));
    }
    fn post(&self, post: &mut PostPhase<'_>) -> Control {
        let mut g = self.post.lock().unwrap_or_else(|e| e.into_inner());
        (*g)(post)
    }
}

/// A phase whose filaments see, per pool segment, what `bind` returned.
struct BoundPhaseImpl<'a, I: Index, B, F> {
    shares: Shares,
    _index: PhantomData<fn(I)>,
    bind: B,
    filament: F,
    post: Post<'a>,
}

impl<I, B, V, F> PhaseBody for BoundPhaseImpl<'_, I, B, F>
where
    I: Index,
    B: Fn(&Ctx, &Span) -> V + Sync,
    F: Fn(&Ctx, I, &mut V) + Sync,
{
    fn procs(&self) -> usize {
        self.shares.procs()
    }
    fn shares(&self) -> &Shares {
        &self.shares
    }
    fn run_chunk(&self, ctx: &Ctx, t: Taken) {
        let (bind, f) = (&self.bind, &self.filament);
        let segs = self.shares.segs(t);
        each_segment(segs, |span| bind(ctx, span), |i, v| f(ctx, i, v));
        ctx.count_filaments(self.shares.filaments(t));
    }
    fn post(&self, post: &mut PostPhase<'_>) -> Control {
        let mut g = self.post.lock().unwrap_or_else(|e| e.into_inner());
        (*g)(post)
    }
}

/// A sequence of phases (`filCreatePhase` for each), run by
/// [`Runtime::start`](crate::Runtime::start).
///
/// Filament and post-phase closures may borrow from the caller's stack:
/// `start` returns only after they have all finished. What they borrow
/// must outlive the `Program` that holds them: declare it before
/// `Program::new()` (a `let` after it is dropped first, and the compiler
/// says it "does not live long enough"), or `drop(prog)` before using it
/// mutably again.
///
/// A program may be started again (a time loop around `start`, with I/O
/// between steps): start the same `Program` rather than a new one each
/// time. Its phases keep what the layers learned about them in earlier
/// starts (hyfi-dsm: write views whose footprints repeat store plainly
/// from a phase's third execution, counted across starts); a new
/// `Program` starts that over.
///
/// Post-phase code runs on a server thread, so its closure must be `Send`:
/// one closure may capture a local `&mut`, but two post-phase closures
/// cannot both borrow one variable mutably, and a `&Cell` is not `Send`.
/// Share a variable between them through a type made for sharing: an
/// atomic for a counter or a flag (an `f64` as `AtomicU64` of its bits), a
/// `Mutex` for anything else. Only one post-phase code runs at a time, so
/// neither is ever contended (an uncontended lock is tens of nanoseconds).
/// (A count of sweeps is also [`PostPhase::iteration`].)
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
/// use std::sync::Mutex;
/// use hyfi::{Config, Control, Op, PoolArray, Program, Runtime};
///
/// let rt = Runtime::new(Config::new().procs(2).pin(false))?;
/// let total = rt.reduction(0u64);
/// let rounds = AtomicUsize::new(0); // both post-phase closures use it
/// let sums = Mutex::new(Vec::new()); // and this
/// let mut prog = Program::new();
/// prog.phase(
///     PoolArray::block(&rt, 0..100, 1),
///     |ctx, i| total.fold(ctx, Op::Sum, i as u64),
///     |post| {
///         sums.lock().unwrap().push(post.reduce(&total, Op::Sum));
///         post.set(&total, 0);
///         rounds.fetch_add(1, Relaxed);
///         Control::Continue
///     },
/// );
/// prog.phase(
///     PoolArray::block(&rt, 0..10, 1),
///     |ctx, i| total.fold(ctx, Op::Sum, i as u64),
///     |post| {
///         sums.lock().unwrap().push(post.reduce(&total, Op::Sum));
///         post.set(&total, 0);
///         if rounds.load(Relaxed) == 3 { Control::Done } else { Control::Continue }
///     },
/// );
/// rt.start(&mut prog)?;
/// drop(prog);
/// assert_eq!(sums.into_inner().unwrap(), [4950, 45, 4950, 45, 4950, 45]);
/// # Ok::<(), hyfi::Error>(())
/// ```
pub struct Program<'a> {
    phases: Vec<Phase<'a>>,
    /// Names this program's phases to the layers (`CtxExt::phase_key`)
    /// in every start of it: what a layer learns about a phase (hyfi-dsm:
    /// whether its write views may store plainly) holds when the same
    /// program is started again, as a time loop around `start` does.
    key: u64,
}

/// The next [`Program`]'s key (from 1; process-wide, so no two programs
/// share one, on any runtime).
static NEXT_KEY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl Default for Program<'_> {
    fn default() -> Self {
        Program::new()
    }
}

/// One phase of a program: its body and the reductions its end reduces.
struct Phase<'a> {
    body: Box<dyn PhaseBody + 'a>,
    at_end: AtEndList<'a>,
}

impl<'a> Phase<'a> {
    fn new(body: Box<dyn PhaseBody + 'a>) -> Self {
        Phase {
            body,
            at_end: AtEndList::default(),
        }
    }
}

impl<'a> Program<'a> {
    /// An empty program.
    pub fn new() -> Self {
        Program {
            phases: Vec::new(),
            // Phase keys hold the program's key above the phase's index
            // (32 bits each); `u64::MAX` means fork-join mode.
            key: NEXT_KEY.fetch_add(1, std::sync::atomic::Ordering::Relaxed) & 0x7fff_ffff,
        }
    }

    /// The key of this program's phases (see the field).
    pub(crate) fn key(&self) -> u64 {
        self.key
    }

    /// Appends a phase: `pools` hold its filaments, `filament(ctx, index)` is
    /// the filament code, `post` the post-phase code.
    pub fn phase<I, F, G>(&mut self, pools: PoolArray<I>, filament: F, post: G) -> &mut Self
    where
        I: Index,
        F: Fn(&Ctx, I) + Sync + 'a,
        G: FnMut(&mut PostPhase<'_>) -> Control + Send + 'a,
    {
        self.phases.push(Phase::new(Box::new(PhaseImpl {
            shares: Shares::new(&pools),
            _index: PhantomData,
            filament,
            post: Box::new(Mutex::new(post)),
        })));
        self
    }

    /// Appends a phase with a declared footprint: before the filaments of
    /// each pool segment run, `bind(ctx, span)` is called once with the
    /// segment's [`Span`] (a pool is cut into chunks for within-node
    /// balancing, [`Config::chunks`](crate::Config::chunks), and a segment
    /// here is a chunk's piece of a pool's segment: its rows run on one
    /// processor, in order) and returns what they work with: views of the
    /// shared arrays the segment reads and writes (validated and, on
    /// several nodes, fetched once for the whole segment), segment-local
    /// reduction accumulators ([`Reduction::local`](crate::Reduction::local)), anything else. Each
    /// filament then gets `&mut` of it: `filament(ctx, index, &mut bound)`.
    /// What `bind` returned is dropped at the segment's end (a local
    /// accumulator folds into its pool's copy then).
    ///
    /// This is the fast path for regular access: the per-element checks of
    /// [`Program::phase`] are paid once per segment, the filament is
    /// inlined into the pool's loop, and the bound views and accumulators
    /// stay in registers. The filaments of Jacobi's Figure 1, one per
    /// point, then cost what the plain loop costs:
    ///
    /// ```
    /// use hyfi::{Config, Control, Op, PoolArray, Program, Runtime};
    ///
    /// let rt = Runtime::new(Config::new().procs(2).pin(false)).unwrap();
    /// let data: Vec<f64> = (0..1000).map(|i| ((i * 7919) % 1000) as f64).collect();
    /// let top = rt.reduction(f64::MIN);
    /// let mut found = 0.0;
    /// let mut prog = Program::new();
    /// prog.phase_with(
    ///     PoolArray::block(&rt, 0..1000, 1),
    ///     |ctx, span| (&data[span.rows()], span.rows().start, top.local(ctx, Op::Max)),
    ///     |_ctx, i, (part, first, max)| max.fold(part[i - *first]),
    ///     |post| { found = post.reduce(&top, Op::Max); Control::Done },
    /// );
    /// rt.start(&mut prog).unwrap();
    /// drop(prog);
    /// assert_eq!(found, 999.0);
    /// ```
    pub fn phase_with<I, B, V, F, G>(
        &mut self,
        pools: PoolArray<I>,
        bind: B,
        filament: F,
        post: G,
    ) -> &mut Self
    where
        I: Index,
        B: Fn(&Ctx, &Span) -> V + Sync + 'a,
        F: Fn(&Ctx, I, &mut V) + Sync + 'a,
        G: FnMut(&mut PostPhase<'_>) -> Control + Send + 'a,
        V: 'a,
    {
        self.phases.push(Phase::new(Box::new(BoundPhaseImpl {
            shares: Shares::new(&pools),
            _index: PhantomData,
            bind,
            filament,
            post: Box::new(Mutex::new(post)),
        })));
        self
    }

    /// The phase appended last reduces `r` with `op` at its end, carried
    /// by the collective that ends the phase anyway: on several nodes the
    /// DSM's release or the barrier, so the reduction costs no round of
    /// its own. Post-phase code reads the result with
    /// [`PostPhase::get`] (or [`PostPhase::reduce`], which then returns
    /// it without communicating). The result is the bits
    /// [`PostPhase::reduce`] gives: the same local order, the link's order
    /// across nodes. Name several reductions with several calls; they
    /// travel together.
    ///
    /// # Panics
    /// If the program has no phase yet.
    ///
    /// ```
    /// use hyfi::{Config, Control, Op, PoolArray, Program, Runtime};
    ///
    /// let rt = Runtime::new(Config::new().procs(2).pin(false)).unwrap();
    /// let top = rt.reduction(f64::MIN);
    /// let mut tops = Vec::new();
    /// let mut prog = Program::new();
    /// prog.phase(
    ///     PoolArray::block(&rt, 0..100, 1),
    ///     |ctx, i| top.fold(ctx, Op::Max, ((i * 37) % 100) as f64),
    ///     |post| {
    ///         tops.push(post.get(&top)); // reduced by the phase's end
    ///         post.set(&top, f64::MIN);
    ///         if tops.len() == 2 { Control::Done } else { Control::Continue }
    ///     },
    /// )
    /// .reduce_at_end(&top, Op::Max);
    /// rt.start(&mut prog).unwrap();
    /// drop(prog);
    /// assert_eq!(tops, [99.0, 99.0]);
    /// ```
    pub fn reduce_at_end<T: Arith>(&mut self, r: &'a Reduction<T>, op: Op) -> &mut Self {
        self.reduce_at_end_with(r, move |a, b| op.apply(a, b))
    }

    /// Like [`Program::reduce_at_end`] with a user-supplied associative
    /// `combine`, as [`PostPhase::reduce_with`] takes (LU's pivot: the
    /// larger magnitude, the lower row on a tie).
    ///
    /// # Panics
    /// If the program has no phase yet.
    pub fn reduce_at_end_with<T, C>(&mut self, r: &'a Reduction<T>, combine: C) -> &mut Self
    where
        T: bytemuck::Pod + Send + Sync,
        C: Fn(T, T) -> T + Send + Sync + 'a,
    {
        self.push_at_end(r, combine, None)
    }

    /// Like [`Program::reduce_at_end`] for an [`ExactSum`]: post-phase
    /// code reads the correctly rounded total with
    /// [`PostPhase::reduce_exact`], which then returns it without
    /// communicating.
    ///
    /// ```
    /// use hyfi::{Config, Control, PoolArray, Program, Runtime};
    ///
    /// let rt = Runtime::new(Config::new().procs(2).pin(false)).unwrap();
    /// let s = rt.exact_sum();
    /// let mut total = 0.0;
    /// let mut prog = Program::new();
    /// prog.phase(
    ///     PoolArray::block(&rt, 0..3, 1),
    ///     |ctx, i| s.fold(ctx, [1e100, 1.0, -1e100][i]),
    ///     |post| {
    ///         total = post.reduce_exact(&s);
    ///         Control::Done
    ///     },
    /// )
    /// .reduce_exact_at_end(&s);
    /// rt.start(&mut prog).unwrap();
    /// drop(prog);
    /// assert_eq!(total, 1.0);
    /// ```
    ///
    /// # Panics
    /// If the program has no phase yet.
    pub fn reduce_exact_at_end(&mut self, s: &'a ExactSum) -> &mut Self {
        self.reduce_at_end_with(s.reduction(), |mut a: ExactAccumulator, b| {
            a.merge(&b);
            a
        })
    }

    /// Appends a reduction to the last phase's end (see `at_end.rs`).
    pub(crate) fn push_at_end<T, C>(
        &mut self,
        r: &'a Reduction<T>,
        combine: C,
        payload: Option<std::sync::Arc<dyn crate::layer::Payload + 'a>>,
    ) -> &mut Self
    where
        T: bytemuck::Pod + Send + Sync,
        C: Fn(T, T) -> T + Send + Sync + 'a,
    {
        self.phases
            .last_mut()
            .expect(
                "reduce_at_end names a reduction of the phase before it: append the phase first",
            )
            .at_end
            .push(r, combine, payload);
        self
    }

    /// Number of phases.
    pub fn len(&self) -> usize {
        self.phases.len()
    }
    /// Whether the program has no phase.
    pub fn is_empty(&self) -> bool {
        self.phases.is_empty()
    }

    /// The phases, checked against the runtime (`procs` processors,
    /// identity `rt`): each phase's body and the reductions its end
    /// reduces.
    pub(crate) fn bodies(
        &self,
        procs: usize,
        rt: u64,
    ) -> Result<Vec<(&(dyn PhaseBody + 'a), &AtEndList<'a>)>, Error> {
        if self.phases.is_empty() {
            return Err(Error::EmptyProgram);
        }
        for (i, p) in self.phases.iter().enumerate() {
            if p.body.procs() != procs {
                return Err(Error::PoolShape {
                    phase: i,
                    pool_procs: p.body.procs(),
                    procs,
                });
            }
            p.at_end.check(rt)?;
        }
        Ok(self.phases.iter().map(|p| (&*p.body, &p.at_end)).collect())
    }
}
