//! Adaptive quadrature with fork-join filaments (HyFi paper, §4.4).
//!
//! Computes the area under `f` on `[a, b]` by recursive bisection with the
//! trapezoid rule: the area `whole` of an interval is compared with the sum of
//! the areas of its two halves; if `|left + right - whole| <= tol` the
//! interval is done (its area is `left + right`), otherwise both halves are
//! refined as a fork-join filament pair (`ctx.join_remote`: the forked half
//! is a serializable filament, so it may run on another node). The tolerance is
//! `--eps` (absolute) at the root and is halved at every level, so the
//! accepted error estimates of all leaves add up to at most `eps`. Pruning
//! turns the joins into plain calls once every processor is busy; idle
//! processors steal the shallowest unexplored halves.
//!
//! Two integrands (`--func`):
//!
//! * `x6`: `f(x) = x^6` on `[1, 70]` as in the paper; exact `(b^7 - a^7) / 7`.
//! * `spiky`: `f(x) = x^2 + H w^2 / ((x - c)^2 + w^2)` on `[0, 1]`, a smooth
//!   parabola plus a Lorentzian peak of height `H = 1e4` and half-width
//!   `w = 1e-4` at `c = 0.93`, so most of the subdivision lies in a sliver
//!   near the right end; exact
//!   `(b^3 - a^3) / 3 + H w (atan((b - c) / w) - atan((a - c) / w))`.
//!
//! Run it with
//!
//! ```text
//! cargo run --release --example quad -- --func spiky --procs 2
//! cargo run --release --example quad -- --func x6 --procs 1 --no-prune
//! cargo run --release --example quad -- --func spiky --nodes 2 --procs 1   # two local nodes
//! hyfi-run -n 4 -p 1 target/release/examples/quad                         # four local nodes
//! ```
//!
//! On several nodes every node runs the same program (`run_distributed`):
//! node 0 runs the root, the others get halves by start-up distribution and
//! by stealing, and every node prints the result and its own counters
//! (filaments executed, steals within and across nodes, filaments moved,
//! idle time) plus one `fjstats:` line a script can read.
//!
//! It checks that the hyfi result equals, bit for bit, a plain sequential
//! recursion over the same tree (the tree and the order of the additions do
//! not depend on which processor runs a branch), and that it lies within the
//! tolerance of the exact integral. It prints the times, the value, the
//! error, the number of intervals, a verdict and the runtime's counters, and
//! exits non-zero on failure.

#[path = "common/mod.rs"]
mod common;
use std::time::Instant;

use clap::{Parser, ValueEnum};
use hyfi::{Ctx, Fork, Pruned, RemoteFn};
use serde::{Deserialize, Serialize};

/// Height, half-width and centre of the `spiky` peak.
const PEAK_H: f64 = 1e4;
const PEAK_W: f64 = 1e-4;
const PEAK_C: f64 = 0.93;

/// An integrand known at compile time: the recursion is monomorphised for
/// it, as the function a user integrates would be.
pub trait Integrand: Send + Sync + 'static {
    /// f(x).
    fn eval(x: f64) -> f64;
    /// The filament function of the forked half, for this integrand.
    fn piece() -> &'static RemoteFn<Piece, Area>;
}

/// x^6.
pub struct X6;
/// x^2 plus a narrow, tall Lorentzian peak near x = 0.93.
pub struct Spiky;

impl Integrand for X6 {
    #[inline(always)]
    fn eval(x: f64) -> f64 {
        let x3 = x * x * x;
        x3 * x3
    }
    fn piece() -> &'static RemoteFn<Piece, Area> {
        &PIECE_X6
    }
}

impl Integrand for Spiky {
    #[inline(always)]
    fn eval(x: f64) -> f64 {
        let d = x - PEAK_C;
        x * x + PEAK_H * (PEAK_W * PEAK_W) / (d * d + PEAK_W * PEAK_W)
    }
    fn piece() -> &'static RemoteFn<Piece, Area> {
        &PIECE_SPIKY
    }
}

/// The integrand, as the command line names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
pub enum Func {
    /// x^6 (the paper's x^{2w} with w = 3).
    X6,
    /// x^2 plus a narrow, tall Lorentzian peak near x = 0.93.
    Spiky,
}

impl Func {
    pub fn eval(self, x: f64) -> f64 {
        match self {
            Func::X6 => X6::eval(x),
            Func::Spiky => Spiky::eval(x),
        }
    }

    /// The integral over `[a, b]` in closed form.
    pub fn exact(self, a: f64, b: f64) -> f64 {
        match self {
            Func::X6 => (b.powi(7) - a.powi(7)) / 7.0,
            Func::Spiky => {
                (b.powi(3) - a.powi(3)) / 3.0
                    + PEAK_H
                        * PEAK_W
                        * (((b - PEAK_C) / PEAK_W).atan() - ((a - PEAK_C) / PEAK_W).atan())
            }
        }
    }

    /// Default interval and root tolerance: about 1 s sequentially (release).
    pub fn defaults(self) -> (f64, f64, f64) {
        match self {
            Func::X6 => (1.0, 70.0, 1.5e-3),
            Func::Spiky => (0.0, 1.0, 2e-11),
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Func::X6 => "x^6",
            Func::Spiky => "x^2 + 1e4 * (1e-4)^2 / ((x - 0.93)^2 + (1e-4)^2)",
        }
    }
}

/// The result of a (sub)integration: the area and the number of intervals
/// accepted (leaves of the recursion tree).
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Area {
    pub value: f64,
    pub intervals: u64,
}

/// An interval still to integrate, with what its parent already computed:
/// the argument of the forked half's filament.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Piece {
    a: f64,
    b: f64,
    fa: f64,
    fb: f64,
    /// Trapezoid area of `[a, b]`.
    whole: f64,
    /// Tolerance at this level.
    tol: f64,
}

impl Piece {
    /// The root interval.
    pub fn root<F: Integrand>(a: f64, b: f64, eps: f64) -> Piece {
        let (fa, fb) = (F::eval(a), F::eval(b));
        Piece {
            a,
            b,
            fa,
            fb,
            whole: 0.5 * (fa + fb) * (b - a),
            tol: eps,
        }
    }
}

/// One bisection step of `[a, b]`, shared by the filaments and the
/// sequential recursion so both build the same tree with the same
/// arithmetic: `Ok(area)` if the interval is done, else the midpoint, f
/// there, and the two halves' trapezoid areas.
///
/// A NaN estimate (a non-finite integrand) counts as converged (`diff >
/// tol` is false), so the recursion ends and the check fails instead of recursing
/// forever; an interval whose midpoint no longer moves is done too.
#[inline(always)]
fn bisect<F: Integrand>(
    a: f64,
    b: f64,
    fa: f64,
    fb: f64,
    whole: f64,
    tol: f64,
) -> Result<f64, (f64, f64, f64, f64)> {
    let m = 0.5 * (a + b);
    let fm = F::eval(m);
    let left = 0.5 * (fa + fm) * (m - a);
    let right = 0.5 * (fm + fb) * (b - m);
    // Refine only a finite estimate above the tolerance of an interval
    // whose midpoint still moves (a NaN compares false: done).
    let refine = (left + right - whole).abs() > tol && a < m && m < b;
    if refine {
        Err((m, fm, left, right))
    } else {
        Ok(left + right)
    }
}

/// Adaptive quadrature of `f` on `[a, b]` with fork-join filaments.
pub fn quad_hyfi(ctx: &Ctx, f: Func, a: f64, b: f64, eps: f64) -> Area {
    match f {
        Func::X6 => piece::<X6, Ctx>(ctx, Piece::root::<X6>(a, b, eps)),
        Func::Spiky => piece::<Spiky, Ctx>(ctx, Piece::root::<Spiky>(a, b, eps)),
    }
}

/// The forked half's filament: [`rec`] on a [`Piece`].
pub fn piece<F: Integrand, C: Fork>(ctx: &C, p: Piece) -> Area {
    let (value, intervals) = rec::<F, C>(ctx, p.a, p.b, p.fa, p.fb, p.whole, p.tol);
    Area { value, intervals }
}

/// The recursion of [`quad_hyfi`]: both halves are a fork-join pair, the
/// right one a serializable filament that may run on another node. The
/// interval travels in registers (a `Piece` is built only for the forked
/// half). Generic over [`Fork`], so that the subtrees pruning runs as plain
/// calls are the plain recursion (the `Pruned` copy the `PIECE_*`
/// filaments name).
fn rec<F: Integrand, C: Fork>(
    ctx: &C,
    a: f64,
    b: f64,
    fa: f64,
    fb: f64,
    whole: f64,
    tol: f64,
) -> (f64, u64) {
    match bisect::<F>(a, b, fa, fb, whole, tol) {
        Ok(value) => (value, 1),
        Err((m, fm, left, right)) => {
            let tol = 0.5 * tol;
            let r = Piece {
                a: m,
                b,
                fa: fm,
                fb,
                whole: right,
                tol,
            };
            let ((l, nl), ar) =
                ctx.join_remote(|c| rec::<F, C>(c, a, m, fa, fm, left, tol), F::piece(), r);
            // The fixed `left + right` order is what makes the result
            // independent of which processor ran which half.
            (l + ar.value, nl + ar.intervals)
        }
    }
}

/// [`piece`] for x^6 as a filament function any node can run.
pub static PIECE_X6: RemoteFn<Piece, Area> =
    RemoteFn::new("quad::x6", piece::<X6, Ctx>).with_pruned(piece::<X6, Pruned>);
/// [`piece`] for the spiky integrand.
pub static PIECE_SPIKY: RemoteFn<Piece, Area> =
    RemoteFn::new("quad::spiky", piece::<Spiky, Ctx>).with_pruned(piece::<Spiky, Pruned>);

/// The same recursion as [`quad_hyfi`], as the plain sequential recursion
/// an HPC user writes (scalars in registers, no runtime).
pub fn quad_seq(f: Func, a: f64, b: f64, eps: f64) -> Area {
    fn rec<F: Integrand>(a: f64, b: f64, fa: f64, fb: f64, whole: f64, tol: f64) -> (f64, u64) {
        match bisect::<F>(a, b, fa, fb, whole, tol) {
            Ok(v) => (v, 1),
            Err((m, fm, left, right)) => {
                let (l, nl) = rec::<F>(a, m, fa, fm, left, 0.5 * tol);
                let (r, nr) = rec::<F>(m, b, fm, fb, right, 0.5 * tol);
                (l + r, nl + nr)
            }
        }
    }
    fn run<F: Integrand>(a: f64, b: f64, eps: f64) -> Area {
        let (fa, fb) = (F::eval(a), F::eval(b));
        let (value, intervals) = rec::<F>(a, b, fa, fb, 0.5 * (fa + fb) * (b - a), eps);
        Area { value, intervals }
    }
    match f {
        Func::X6 => run::<X6>(a, b, eps),
        Func::Spiky => run::<Spiky>(a, b, eps),
    }
}

/// Error allowed against the exact integral: the requested tolerance, but
/// not below what rounding over the whole sum can explain.
pub fn allowed_error(eps: f64, exact: f64) -> f64 {
    eps.max(1e-12 * exact.abs())
}

#[derive(Parser, Debug)]
#[command(about = "Adaptive quadrature with fork-join filaments (HyFi §4.4)")]
struct Args {
    /// Integrand.
    #[arg(long, value_enum, default_value_t = Func::X6)]
    func: Func,
    /// Left end [default: 1 for x6, 0 for spiky].
    #[arg(long, allow_negative_numbers = true)]
    a: Option<f64>,
    /// Right end [default: 70 for x6, 1 for spiky].
    #[arg(long, allow_negative_numbers = true)]
    b: Option<f64>,
    /// Absolute tolerance at the root, halved per level [default: 1.5e-3 for
    /// x6, 2e-11 for spiky]. Smaller means more intervals; far below the
    /// rounding error of the areas it will not finish.
    #[arg(long)]
    eps: Option<f64>,
    /// Runtime options (--procs, --pin/--no-pin).
    #[command(flatten)]
    runtime: common::RuntimeArgs,
    /// Make every fork real (no pruning).
    #[arg(long)]
    no_prune: bool,
    /// Skip the sequential run (the answer is still checked against the
    /// exact integral); for timing runs.
    #[arg(long)]
    no_seq: bool,
}

fn main() {
    let args = Args::parse();
    // Bad arguments exit with 2, as clap's own and a bad runtime setting
    // do; a failed run with 1.
    let interval = interval(&args).unwrap_or_else(|e| {
        eprintln!("quad: {e}");
        std::process::exit(2)
    });
    common::or_exit("quad", run(&args, interval));
}

/// The interval and tolerance `args` ask for, checked.
fn interval(args: &Args) -> Result<(f64, f64, f64), String> {
    let f = args.func;
    let (da, db, deps) = f.defaults();
    let (a, b, eps) = (
        args.a.unwrap_or(da),
        args.b.unwrap_or(db),
        args.eps.unwrap_or(deps),
    );
    if !(a.is_finite() && b.is_finite() && a < b) {
        return Err(format!("need finite a < b, got a = {a}, b = {b}"));
    }
    if !(eps.is_finite() && eps > 0.0) {
        return Err(format!("need a finite eps > 0, got {eps}"));
    }
    if !f.exact(a, b).is_finite() || !f.eval(a).is_finite() || !f.eval(b).is_finite() {
        return Err(format!(
            "the integral of {} on [{a}, {b}] overflows f64; choose a smaller interval",
            f.describe()
        ));
    }
    Ok((a, b, eps))
}

fn run(args: &Args, (a, b, eps): (f64, f64, f64)) -> Result<(), Box<dyn std::error::Error>> {
    let f = args.func;
    let exact = f.exact(a, b);
    // hyfi's errors keep their type: `or_exit` takes the exit status from
    // them (2 for a configuration error).
    let rt = args
        .runtime
        .start(|cfg| if args.no_prune { cfg.prune(false) } else { cfg })?;
    PIECE_X6.register()?;
    PIECE_SPIKY.register()?;
    let prune = if rt.config().get_prune() { "on" } else { "off" };
    println!(
        "quad: f(x) = {} on [{a}, {b}], eps {eps:e} (absolute at the root, halved per level)",
        f.describe()
    );

    let t = Instant::now();
    let par = rt.run_distributed(|ctx| quad_hyfi(ctx, f, a, b, eps))?;
    let t_par = t.elapsed().as_secs_f64();

    let seq = if args.no_seq {
        None
    } else {
        let t = Instant::now();
        let seq = quad_seq(f, a, b, eps);
        Some((seq, t.elapsed().as_secs_f64()))
    };

    let err = (par.value - exact).abs();
    let allowed = allowed_error(eps, exact);
    println!(
        "hyfi ({} nodes x {} procs, pruning {prune}): {t_par:.3} s",
        rt.num_nodes(),
        rt.procs()
    );
    if let Some((_, t_seq)) = seq {
        println!(
            "sequential:               {t_seq:.3} s   (speedup {:.2})",
            t_seq / t_par
        );
    }
    println!("value      {:.17e}", par.value);
    println!("exact      {exact:.17e}");
    println!(
        "error      {err:.3e} (relative {:.3e}, allowed {allowed:.3e})",
        err / exact.abs()
    );
    println!("intervals  {}", par.intervals);

    println!(
        "result: value_bits={:016x} intervals={}",
        par.value.to_bits(),
        par.intervals
    );

    let mut failures = Vec::new();
    if let Some((seq, _)) = seq {
        if par.value.to_bits() != seq.value.to_bits() || par.intervals != seq.intervals {
            failures.push(format!(
                "hyfi result {:e} ({} intervals) differs from the sequential {:e} ({} intervals)",
                par.value, par.intervals, seq.value, seq.intervals
            ));
        }
    }
    if err.is_nan() || err > allowed {
        failures.push(format!(
            "error {err:e} against the exact integral exceeds {allowed:e}"
        ));
    }
    common::print_fj_stats(&rt, t_par);
    if failures.is_empty() {
        println!("OK: hyfi equals the sequential recursion bit for bit and is within {allowed:.1e} of the exact integral");
        Ok(())
    } else {
        Err(format!("FAILED: {}", failures.join("; ")).into())
    }
}
