//! The state of one execution of a [`Program`]: its phases, how often each
//! ran, and the phase barrier's counters (`arrived`, `gen`, `next`); and
//! [`Runtime::start`], which makes one and hands it to the server threads
//! as a command. Who reads and writes which counter is in this directory's
//! `README.md`.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use crossbeam_utils::CachePadded;

use super::at_end::AtEndList;
use super::{barrier, PhaseBody, Program};
use crate::error::{panic_message, Error, LinkAbort};
use crate::registry::{Command, ProgramPtr};
use crate::runtime::Runtime;

/// `next` value meaning "the program is finished".
pub(crate) const DONE: usize = usize::MAX;

/// A phase as its run sees it: the body, and the reductions its end
/// reduces.
#[derive(Clone, Copy)]
pub(crate) struct RunPhase {
    pub(crate) body: &'static dyn PhaseBody,
    pub(crate) at_end: &'static AtEndList<'static>,
}

/// One execution of a [`Program`]: its phases and the barrier state.
pub(crate) struct ProgramRun {
    phases: Vec<RunPhase>,
    pub(crate) iterations: Vec<AtomicU64>,
    pub(crate) arrived: CachePadded<AtomicUsize>,
    pub(crate) gen: CachePadded<AtomicU64>,
    pub(crate) next: AtomicUsize,
    abort: AtomicBool,
    error: Mutex<Option<Error>>,
    node: usize,
    /// Which program this is on the runtime (from 1): names its phases'
    /// SPMD steps.
    pub(crate) program: u64,
    /// The `Program`'s own key, the same in every start of it: names its
    /// phases to the layers (`CtxExt::phase_key`).
    pub(crate) key: u64,
}

impl ProgramRun {
    pub(crate) fn phases(&self) -> &[RunPhase] {
        &self.phases
    }
    pub(crate) fn aborted(&self) -> bool {
        self.abort.load(Ordering::Relaxed)
    }
    /// Records the first error and stops the program at the next barrier.
    pub(crate) fn fail(&self, e: Error) {
        let mut slot = self.error.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            *slot = Some(e);
        }
        self.abort.store(true, Ordering::SeqCst);
    }
    pub(crate) fn fail_panic(&self, proc: usize, during: String, p: Box<dyn std::any::Any + Send>) {
        let e = match p.downcast::<LinkAbort>() {
            Ok(link) => link.0,
            Err(p) => Error::FilamentPanic {
                node: self.node,
                proc,
                during,
                message: panic_message(&*p),
            },
        };
        self.fail(e);
    }
}

impl Runtime {
    /// Runs a program of iterative filaments (`filStart`): every phase in
    /// turn, each followed by its post-phase code, until a post-phase returns
    /// [`Control::Done`](crate::Control::Done).
    ///
    /// A panic in a filament or in post-phase code ends the program at the
    /// next barrier and is returned as [`Error::FilamentPanic`].
    pub fn start(&self, program: &mut Program<'_>) -> Result<(), Error> {
        self.check_not_nested()?;
        let _g = self.start_lock.lock().unwrap_or_else(|e| e.into_inner());
        let phases = program.bodies(self.shared.procs, self.shared.id)?;
        let program_no = self.programs.fetch_add(1, Ordering::Relaxed) + 1;
        if self.num_nodes() > 1 {
            // Every node must start it (entered before the release below,
            // which waits for every node, so that a node that does
            // something else is named instead of awaited).
            self.shared
                .link
                .enter_step(crate::Step::Start {
                    program: program_no,
                })
                .map_err(Error::Link)?;
            // What local fork-join runs wrote since the last release.
            self.fork_join_release()?;
        }
        let n = phases.len();
        // A run that ended in an error may have left chunks untaken.
        for (body, _) in &phases {
            body.shares().fill();
        }
        let run = ProgramRun {
            // SAFETY: lifetime erasure. The bodies borrow from `program`,
            // which outlives this call, and `dispatch` returns only after
            // every server thread has finished with them.
            phases: phases
                .into_iter()
                .map(|(body, at_end)| unsafe {
                    RunPhase {
                        body: std::mem::transmute::<&dyn PhaseBody, &'static dyn PhaseBody>(body),
                        at_end: std::mem::transmute::<&AtEndList<'_>, &'static AtEndList<'static>>(
                            at_end,
                        ),
                    }
                })
                .collect(),
            iterations: (0..n).map(|_| AtomicU64::new(0)).collect(),
            arrived: CachePadded::new(AtomicUsize::new(0)),
            gen: CachePadded::new(AtomicU64::new(0)),
            next: AtomicUsize::new(0),
            abort: AtomicBool::new(false),
            error: Mutex::new(None),
            node: self.node(),
            program: program_no,
            key: program.key(),
        };
        self.shared.dispatch(Command::Program(ProgramPtr {
            run: &run as *const ProgramRun as *const (),
            body: barrier::run_command,
        }));
        match run.error.into_inner().unwrap_or_else(|e| e.into_inner()) {
            Some(e) => Err(self.failed(e)),
            None => Ok(()),
        }
    }
}
