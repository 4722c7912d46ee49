//! The phase barrier: what every server thread does with a program (see
//! this directory's `README.md` for the protocol). Each runs its pools of
//! the phase, then meets the others: processor 0 waits until the others
//! arrived, takes the node-level step (the link's barrier, or the phase-end
//! hook), runs the post-phase code and releases them with its decision;
//! the others wait for the release.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;

use super::state::RunPhase;
use super::{Control, PhaseBody, PostPhase, ProgramRun, DONE};
use crate::sched::{Ctx, Sched};
use crate::trace::{self, Kind};

/// The body of [`Command::Program`](crate::registry::Command::Program):
/// runs the program `run` (a [`ProgramRun`]) on this server thread.
pub(super) fn run_command(ctx: &Ctx, sched: &mut Sched, run: *const ()) {
    // SAFETY: `start` keeps the program alive and does not return
    // until every server thread has reported finished.
    let run: &'static ProgramRun = unsafe { &*(run as *const ProgramRun) };
    run_program(ctx, sched, run);
}

/// Iterative mode: phases until a post-phase says done.
fn run_program(ctx: &Ctx, sched: &mut Sched, run: &'static ProgramRun) {
    let phases = run.phases();
    let p = ctx.shared.procs;
    let mut cur = 0usize;
    let mut gen = 0u64;
    loop {
        let body: &'static dyn PhaseBody = phases[cur].body;
        ctx.iteration
            .set(run.iterations[cur].load(Ordering::SeqCst));
        ctx.phase.set(run.key << 32 | cur as u64);
        if ctx.proc == 0 && !run.aborted() {
            // Every node must take the same steps: the link compares them
            // between nodes while this phase runs.
            let step = crate::Step::Phase {
                program: run.program,
                phase: cur as u64,
                iteration: ctx.iteration.get(),
            };
            if let Err(e) = ctx.shared.link.enter_step(step) {
                run.fail(crate::Error::Link(e));
            }
        }
        let t_phase = trace::on().then(trace::now);
        // The master reads what came for the phase's end before it waits
        // (see `link::Attending::Computing` and `link::until_wait`).
        // The bracket kept open since the last phase's end, if any
        // (`link::phase_end_reached`), else a new one.
        let computing = (ctx.proc == 0).then(|| {
            crate::link::kept()
                .unwrap_or_else(|| crate::link::Attend::start(crate::link::Attending::Computing))
        });
        run_phase(sched, ctx, body, run, cur);
        if let Some(c) = computing {
            crate::link::until_wait(c);
        }
        ctx.stats.phases.set(ctx.stats.phases.get() + 1);
        let t_barrier = t_phase.map(|_| trace::now());
        let next = if ctx.proc == 0 {
            // Master: wait for the others, then the node-level step, then the
            // post-phase code, then release everyone with the decision.
            let parker = ctx.ws().parker();
            if run.arrived.load(Ordering::SeqCst) != p - 1 {
                // Still computing for the transport (no `link::waits`): a
                // `REL` or a collective's piece that comes while the node's
                // other processors finish is read at the release, which
                // cannot start before they do anyway; rung, it woke the
                // communication thread onto a CPU they compute on (2x2:
                // half the bells of a run).
                // Recorded only when it will block: a phase of one processor
                // (or one whose others are done) pays nothing for the report.
                let _w = crate::waits::waiting(
                    |a| format!("the node's other processors to end phase {}", a[0]),
                    [cur as u64, 0, 0],
                );
                parker.wait_until(|| run.arrived.load(Ordering::SeqCst) == p - 1);
            }
            if let Some(t) = t_barrier {
                trace::span(Kind::Barrier, t, [cur as u64, 0, 0, 0]);
            }
            run.arrived.store(0, Ordering::SeqCst);
            // Every processor is done with this phase's chunks: make them
            // available to its next execution (published by the `gen`
            // store below).
            body.shares().fill();
            let next = post_phase(ctx, run, cur, phases[cur], phases.len());
            // The next phase is a new access epoch (no filament runs now;
            // the SeqCst `gen` store below publishes it to the others).
            ctx.shared.next_access_epoch();
            run.next.store(next, Ordering::SeqCst);
            run.gen.store(gen + 1, Ordering::SeqCst);
            for w in ctx.shared.workers.iter().skip(1) {
                w.parker().notify();
            }
            next
        } else {
            if run.arrived.fetch_add(1, Ordering::SeqCst) + 1 == p - 1 {
                ctx.shared.workers[0].parker().notify();
            }
            let parker = ctx.ws().parker();
            if run.gen.load(Ordering::SeqCst) == gen {
                let _w = crate::waits::waiting(
                    |a| {
                        format!(
                            "processor 0 to end phase {} (the node's barrier, release and post-phase code)",
                            a[0]
                        )
                    },
                    [cur as u64, 0, 0],
                );
                parker.wait_until(|| run.gen.load(Ordering::SeqCst) != gen);
            }
            if let Some(t) = t_barrier {
                trace::span(Kind::Barrier, t, [cur as u64, 0, 0, 0]);
            }
            run.next.load(Ordering::SeqCst)
        };
        if let Some(t) = t_phase {
            trace::span(Kind::Phase, t, [cur as u64, ctx.iteration.get(), 0, 0]);
        }
        gen += 1;
        if next == DONE {
            // Whatever path the phase's end took (an aborted run skips its
            // node step), the master's computing is over: no next phase's
            // share takes the bracket over.
            crate::link::waits();
            return;
        }
        cur = next;
    }
}

fn post_phase(
    ctx: &Ctx,
    run: &'static ProgramRun,
    cur: usize,
    phase: RunPhase,
    nphases: usize,
) -> usize {
    if run.aborted() {
        return DONE;
    }
    let t = trace::on().then(trace::now);
    // The reductions at the phase's end run the program's combine
    // functions (and a layer's payload): a panic there is the program's,
    // reported as post-phase code's would be.
    let ended = catch_unwind(AssertUnwindSafe(|| {
        crate::link::at_phase_end(|| node_step(ctx, cur, phase))
    }));
    if let Some(t) = t {
        trace::span(Kind::Release, t, [cur as u64, 0, 0, 0]);
    }
    match ended {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            run.fail(crate::Error::Link(e));
            return DONE;
        }
        Err(p) => {
            phase.at_end.done();
            run.fail_panic(ctx.proc, format!("phase {cur}'s reductions at its end"), p);
            return DONE;
        }
    }
    let iteration = run.iterations[cur].fetch_add(1, Ordering::Relaxed);
    // Post-phase code is an access epoch of its own: it may write what
    // the phase's filaments read as read-only.
    ctx.shared.next_access_epoch();
    let mut post = PostPhase::new(&ctx.shared, cur, iteration);
    let t = trace::on().then(trace::now);
    let decided = catch_unwind(AssertUnwindSafe(|| phase.body.post(&mut post)));
    phase.at_end.done();
    if let Some(t) = t {
        trace::span(Kind::PostPhase, t, [cur as u64, 0, 0, 0]);
    }
    match decided {
        Ok(Control::Continue) => (cur + 1) % nphases,
        Ok(Control::Done) => DONE,
        Err(p) => {
            run.fail_panic(ctx.proc, format!("phase {cur} post-phase"), p);
            DONE
        }
    }
}

/// The node-level step that ends phase `cur`: the phase-end hook (the
/// DSM's release) or the link's barrier, carrying the reductions the
/// phase reduces at its end (see `at_end.rs`).
fn node_step(ctx: &Ctx, cur: usize, phase: RunPhase) -> Result<(), crate::LinkError> {
    let (hook, link) = (ctx.shared.phase_end.get(), &*ctx.shared.link);
    if phase.at_end.is_empty() {
        return match hook {
            Some(h) => h.end_phase(cur, link),
            None => link.barrier(),
        };
    }
    // SAFETY: the master runs this while every other server thread of the
    // node waits at the phase barrier (see the README's invariants).
    let mut v = unsafe { phase.at_end.local(ctx.shared.procs) };
    let mut combine = |a: &mut [u8], b: &[u8]| phase.at_end.combine(a, b);
    match hook {
        Some(h) => h.end_phase_reducing(cur, link, &mut v, &mut combine)?,
        // An all-reduce waits for every node: the barrier it replaces.
        None => link.allreduce(&mut v, &mut combine)?,
    }
    // SAFETY: as above.
    unsafe { phase.at_end.store(&v) };
    Ok(())
}

/// Iterative mode: runs this processor's share of one phase: the chunks
/// of its own pools, then chunks taken from the back of other processors'
/// pools until none is left (see `share.rs`).
fn run_phase(
    sched: &mut Sched,
    ctx: &Ctx,
    body: &'static dyn PhaseBody,
    run: &'static ProgramRun,
    phase: usize,
) {
    let shares = body.shares();
    let balance = ctx.multi && shares.balanced();
    loop {
        sched.drain_wakeups(ctx);
        if let Some(ft) = sched.pop_ready() {
            sched.run(ctx, ft);
            continue;
        }
        if !run.aborted() {
            if let Some(first) = shares.take(ctx.proc, balance) {
                // One filthread runs chunks until none is left or it
                // suspends; then the next chunk starts on another, so a
                // chunk waiting for a page overlaps the rest.
                sched.spawn(ctx, move |ctx| {
                    let mut t = first;
                    loop {
                        if t.stolen {
                            ctx.stats
                                .chunks_stolen
                                .set(ctx.stats.chunks_stolen.get() + 1);
                        }
                        ctx.copy.set(shares.copy_at(t));
                        if let Err(p) = catch_unwind(AssertUnwindSafe(|| body.run_chunk(ctx, t))) {
                            run.fail_panic(ctx.proc, format!("phase {phase} filament"), p);
                            return;
                        }
                        match shares.take(ctx.proc, balance) {
                            Some(next) if !run.aborted() => t = next,
                            _ => return,
                        }
                    }
                });
                continue;
            }
        }
        if sched.none_suspended() {
            ctx.copy.set(crate::phase::CopyAt {
                proc: ctx.proc,
                slot: 0,
            });
            return;
        }
        sched.idle_wait(ctx, || false);
    }
}
