//! Post-phase code's view of the node: [`PostPhase`], through which it
//! reduces reduction variables and reads and resets their private copies.
//! It runs on processor 0 while the node's other processors wait at the
//! phase barrier (see `barrier` and this directory's `README.md`), which is
//! what makes touching every processor's copies sound.

use crate::error::{Error, LinkAbort};
use crate::exact::{ExactAccumulator, ExactSum};
use crate::reduce::{Arith, Op, Reduction};
use crate::registry::Shared;

/// What post-phase code may do: reduce reduction variables, read and reset
/// their private copies, and ask where it is. It runs on one processor per
/// node while the others wait at the phase's barrier.
pub struct PostPhase<'s> {
    shared: &'s Shared,
    phase: usize,
    iteration: u64,
}

impl<'s> PostPhase<'s> {
    pub(crate) fn new(shared: &'s Shared, phase: usize, iteration: u64) -> Self {
        PostPhase {
            shared,
            phase,
            iteration,
        }
    }

    /// Index of the phase in its program.
    pub fn phase(&self) -> usize {
        self.phase
    }
    /// How many times this phase's post-phase code ran before (0 the first time).
    pub fn iteration(&self) -> u64 {
        self.iteration
    }
    /// Number of nodes.
    pub fn num_nodes(&self) -> usize {
        self.shared.link.num_nodes()
    }
    /// This node's index.
    pub fn node(&self) -> usize {
        self.shared.link.my_node()
    }
    /// Processors per node.
    pub fn procs_per_node(&self) -> usize {
        self.shared.procs
    }

    fn check<T: bytemuck::Pod + Send + Sync>(&self, r: &Reduction<T>) {
        if r.check(self.shared.id).is_err() {
            panic!("{}", Error::ForeignReduction);
        }
    }

    /// `filReduce`: combines every private copy of `r` on every node with
    /// `op` (on each processor in pool order, then the node's processors in
    /// order, then across nodes in a fixed tree order), stores the result
    /// in every copy and returns it.
    pub fn reduce<T: Arith>(&mut self, r: &Reduction<T>, op: Op) -> T {
        self.reduce_with(r, move |a, b| op.apply(a, b))
    }

    /// Like [`PostPhase::reduce`] with a user-supplied associative `combine`.
    ///
    /// If the phase reduced `r` at its end
    /// ([`Program::reduce_at_end`](crate::Program::reduce_at_end)), this
    /// returns that result, without communicating and without calling
    /// `combine` (the program's function was used).
    pub fn reduce_with<T, C>(&mut self, r: &Reduction<T>, combine: C) -> T
    where
        T: bytemuck::Pod + Send + Sync,
        C: Fn(T, T) -> T,
    {
        self.check(r);
        if r.reduced_at_end.load(std::sync::atomic::Ordering::Relaxed) {
            // The phase's end reduced it with the combine its program
            // named (`Program::reduce_at_end`): every copy holds the result.
            // SAFETY: as below.
            return unsafe { r.read(0) };
        }
        // SAFETY: post-phase code runs while every other server thread of
        // the node waits at the barrier, whose SeqCst counter orders their
        // last writes before these accesses.
        match unsafe { r.reduce_everywhere(self.shared.procs, &*self.shared.link, combine) } {
            Ok(v) => v,
            // Unwind to the post-phase's catch without running the panic
            // hook: this is an error report, not a bug.
            Err(e) => std::panic::resume_unwind(Box::new(LinkAbort(Error::Link(e)))),
        }
    }

    /// Reduces an [`ExactSum`]: adds every private copy on every node
    /// exactly, stores the total in every copy (as [`PostPhase::reduce`]
    /// does) and returns it correctly rounded. The result is the same bits
    /// on every configuration and run.
    pub fn reduce_exact(&mut self, s: &ExactSum) -> f64 {
        self.reduce_with(s.reduction(), |mut a: ExactAccumulator, b| {
            a.merge(&b);
            a
        })
        .value()
    }

    /// Sets every private copy of `s` to exactly `v` (`0.0` to start the
    /// next phase's sum afresh, as `post.set(&r, 0.0)` for `Op::Sum`).
    pub fn set_exact(&mut self, s: &ExactSum, v: f64) {
        self.set(s.reduction(), ExactAccumulator::from(v));
    }

    /// The value of `r` when every copy holds it: after a reduce (this
    /// phase's [`PostPhase::reduce`], or the phase's end,
    /// [`Program::reduce_at_end`](crate::Program::reduce_at_end)), or a
    /// [`PostPhase::set`] that no filament updated since.
    ///
    /// # Panics
    ///
    /// If the phase's filaments updated `r` since the last reduce or set:
    /// each processor, chunk and node then holds a part of the result, and
    /// any one copy would be another answer on another configuration (the
    /// post-phase code's panic ends the program's `start` with an error that
    /// says so). Reduce it first. The check is each node's own: a node whose
    /// copies the phase happened to leave unchanged returns their value,
    /// which is then the reduction's on that node, and the nodes whose copies
    /// moved fail.
    pub fn get<T: bytemuck::Pod + Send + Sync>(&self, r: &Reduction<T>) -> T {
        self.check(r);
        // SAFETY: as in reduce_with.
        let Some(v) = (unsafe { r.value(self.shared.procs) }) else {
            panic!(
                "post.get(&r) on a reduction its filaments updated since the last reduce or set: \
                 its copies (one per processor, chunk and node) each hold a part of the result, \
                 so no one of them is its value; reduce it first (post.reduce(&r, op), \
                 post.reduce_with, or Program::reduce_at_end for the phase), or use \
                 post.get only to read back what post.set wrote"
            );
        };
        v
    }

    /// Sets every private copy of `r` (e.g. `maxdiff = 0` for the next iteration).
    ///
    /// It is also how post-phase code hands a value to the next execution's
    /// filaments (a norm to divide by, a step size): the filament closure
    /// runs on every processor, so it cannot read the post-phase code's
    /// locals (a `Cell` is not `Sync`), but each processor reads its copy
    /// of `r` with [`Reduction::get`]:
    ///
    /// ```
    /// use hyfi::{Config, Control, Op, PoolArray, Program, Runtime};
    ///
    /// let rt = Runtime::new(Config::new().procs(2).pin(false)).unwrap();
    /// let scale = rt.reduction(1.0f64); // set after each execution, read by the filaments
    /// let sum = rt.reduction(0.0f64);
    /// let mut sums = Vec::new();
    /// let mut prog = Program::new();
    /// prog.phase(
    ///     PoolArray::block(&rt, 0..4, 1),
    ///     |ctx, i| {
    ///         let s = scale.get(ctx);
    ///         sum.update(ctx, |acc| acc + s * i as f64)
    ///     },
    ///     |post| {
    ///         sums.push(post.reduce(&sum, Op::Sum));
    ///         post.set(&sum, 0.0);
    ///         post.set(&scale, 10.0 * post.get(&scale));
    ///         if sums.len() == 3 { Control::Done } else { Control::Continue }
    ///     },
    /// );
    /// rt.start(&mut prog).unwrap();
    /// drop(prog);
    /// assert_eq!(sums, [6.0, 60.0, 600.0]);
    /// ```
    pub fn set<T: bytemuck::Pod + Send + Sync>(&mut self, r: &Reduction<T>, v: T) {
        self.check(r);
        // SAFETY: as in reduce_with.
        unsafe { r.write_all(v) }
    }
}
