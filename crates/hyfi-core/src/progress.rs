//! Progress of long work on the terminal: "sweep 1234, maxdiff 1.2e-3".
//!
//! A program that runs for more than a few seconds updates a [`Progress`]
//! from its post-phase code; the update costs one branch when progress is
//! off and a clock read otherwise, and at most [`EVERY`] apart (never before
//! [`DELAY`] of run time) it reaches the user:
//!
//! - **One node, stderr a terminal**: a status line on stderr, rewritten in
//!   place (`\r`, clear line) and erased by [`Progress::finish`] (or drop).
//! - **Local nodes** (`--nodes N`, `HYFI_NODES`, `hyfi-run`): a node's
//!   stderr is a pipe to the launcher, so when the *launcher's* stderr is a
//!   terminal it sets `HYFI_PROGRESS=lines` for the nodes; each node then
//!   writes machine-readable lines ([`format_line`], starting with
//!   [`LINE_PREFIX`]) on stderr, which the launcher takes out of the output
//!   ([`parse_line`]) and renders as one status line for the job, the latest
//!   report of every node side by side.
//! - **Anything else is quiet**: stderr redirected to a file or a pipe,
//!   `HYFI_PROGRESS=off`, or a job of several nodes started by `mpirun` or
//!   `srun` (their nodes' stderr is not a terminal and nobody sets
//!   `HYFI_PROGRESS=lines`). Nothing is written at all.
//!
//! `HYFI_PROGRESS` ([`Setting`]): unset or `auto` decides by the terminal as
//! above; `off` (or `0`) never shows progress; `force` (or `on`, `1`) shows
//! it as if stderr were a terminal, for logs and tests (on one node, or
//! rendered by a launcher; a node of a job started otherwise stays quiet);
//! `lines` is what a launcher sets for its nodes.
//!
//! ```
//! use hyfi_core::{Config, Control, Op, PoolArray, Program, Progress, Runtime};
//!
//! let rt = Runtime::new(Config::new().procs(2).pin(false))?;
//! let progress = Progress::new(&rt, "sweeps");
//! let change = rt.reduction(0.0f64);
//! let mut prog = Program::new();
//! prog.phase(
//!     PoolArray::block(&rt, 0..64, 1),
//!     |ctx, i| change.update(ctx, |m| m.max(1.0 / (i + 1) as f64 / (ctx.iteration() + 1) as f64)),
//!     |post| {
//!         let m = post.reduce(&change, Op::Max);
//!         post.set(&change, 0.0);
//!         progress.report(post.iteration() + 1, format_args!("maxdiff {m:.3e}"));
//!         if m < 0.01 { Control::Done } else { Control::Continue }
//!     },
//! );
//! rt.start(&mut prog)?;
//! progress.finish(); // erase the status line before printing results
//! # Ok::<(), hyfi_core::Error>(())
//! ```

use std::fmt::{self, Write as _};
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::Runtime;

/// Nothing is shown before the run has gone this long: short runs stay quiet.
pub const DELAY: Duration = Duration::from_secs(2);

/// Least time between two updates shown: a few a second.
pub const EVERY: Duration = Duration::from_millis(250);

/// What a progress line of a node starts with; the rest is
/// `<elapsed ms> <text>`, or `<elapsed ms> end` when the node is finished.
pub const LINE_PREFIX: &str = "hyfi-progress: ";

/// Moves the cursor to the start of the line and clears it.
pub const ERASE: &str = "\r\x1b[2K";

/// The environment variable that turns progress on or off.
pub const ENV: &str = "HYFI_PROGRESS";

/// What `HYFI_PROGRESS` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setting {
    /// Unset, `auto` or anything unknown: shown when stderr is a terminal.
    Auto,
    /// `off`, `0`, `no`: never shown.
    Off,
    /// `force`, `on`, `1`, `yes`: shown as if stderr were a terminal.
    Force,
    /// `lines`: this node writes progress lines for its launcher.
    Lines,
}

impl Setting {
    /// The setting in `HYFI_PROGRESS`.
    pub fn from_env() -> Setting {
        Setting::parse(std::env::var(ENV).ok().as_deref())
    }

    /// The setting a value of `HYFI_PROGRESS` asks for.
    pub fn parse(value: Option<&str>) -> Setting {
        match value.map(str::trim) {
            Some("off" | "0" | "no") => Setting::Off,
            Some("force" | "on" | "1" | "yes") => Setting::Force,
            Some("lines") => Setting::Lines,
            _ => Setting::Auto,
        }
    }

    /// Whether a launcher with this setting renders its nodes' progress
    /// (then it sets `HYFI_PROGRESS=lines` for them, else `off`).
    pub fn launcher_renders(self) -> bool {
        match self {
            Setting::Force => true,
            Setting::Off => false,
            Setting::Auto | Setting::Lines => std::io::stderr().is_terminal(),
        }
    }
}

/// How a [`Progress`] shows its reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Off,
    /// A status line on our own stderr, rewritten in place.
    Terminal,
    /// [`format_line`] lines on stderr, for a launcher to render.
    Lines,
}

/// Lets through at most one event per `every`, none before `delay`; shared
/// by threads without a lock (one compare-exchange when an event is due).
#[derive(Debug)]
pub struct Throttle {
    every: u64,
    /// Nanoseconds of run time from which the next event is let through.
    next: AtomicU64,
}

impl Throttle {
    /// None before `delay`, then at most one per `every`.
    pub fn new(delay: Duration, every: Duration) -> Throttle {
        Throttle {
            every: nanos(every),
            next: AtomicU64::new(nanos(delay)),
        }
    }

    /// Whether an event at run time `at` is let through. Of several threads
    /// asking at once, one wins.
    pub fn due(&self, at: Duration) -> bool {
        let now = nanos(at);
        let next = self.next.load(Ordering::Relaxed);
        now >= next
            && self
                .next
                .compare_exchange(next, now + self.every, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A report of progress, shown on the terminal when the run is long and
/// the user can see it; see the [module docs](self).
#[derive(Debug)]
pub struct Progress {
    mode: Mode,
    unit: String,
    start: Instant,
    throttle: Throttle,
    /// Whether anything was written (a status line to erase, or lines to
    /// end with an `end` line).
    shown: AtomicBool,
    /// Serialises the writes and holds the text being built.
    text: Mutex<String>,
}

impl Progress {
    /// Progress of `rt`'s work, counted in `unit` ("sweeps", "steps"):
    /// shown by the rules of the [module docs](self) (a job of several
    /// nodes shows it only through a local launcher).
    pub fn new(rt: &Runtime, unit: &str) -> Progress {
        Progress::for_nodes(rt.num_nodes(), unit)
    }

    /// [`Progress::new`] for a job of `nodes` nodes.
    pub fn for_nodes(nodes: usize, unit: &str) -> Progress {
        let tty = std::io::stderr().is_terminal();
        let mode = match Setting::from_env() {
            Setting::Off => Mode::Off,
            Setting::Lines => Mode::Lines,
            Setting::Force if nodes <= 1 => Mode::Terminal,
            Setting::Auto if nodes <= 1 && tty => Mode::Terminal,
            // Several nodes with no launcher of ours to combine them
            // (mpirun, srun): one status line per node would be garbage.
            Setting::Force | Setting::Auto => Mode::Off,
        };
        Progress::with_mode(mode, unit)
    }

    /// A progress that never shows anything.
    pub fn off() -> Progress {
        Progress::with_mode(Mode::Off, "")
    }

    fn with_mode(mode: Mode, unit: &str) -> Progress {
        Progress {
            mode,
            unit: unit.to_owned(),
            start: Instant::now(),
            throttle: Throttle::new(DELAY, EVERY),
            shown: AtomicBool::new(false),
            text: Mutex::new(String::new()),
        }
    }

    /// Whether reports may be shown at all.
    pub fn is_enabled(&self) -> bool {
        self.mode != Mode::Off
    }

    /// Reports `done` units of work, with `detail` (`format_args!("maxdiff
    /// {m:.3e}")`, or `format_args!("")`). Cheap enough for every phase:
    /// formats and writes only when an update is due.
    pub fn report(&self, done: u64, detail: fmt::Arguments<'_>) {
        if self.mode == Mode::Off {
            return;
        }
        let at = self.start.elapsed();
        if !self.throttle.due(at) {
            return;
        }
        let mut text = self.text.lock().unwrap_or_else(|e| e.into_inner());
        text.clear();
        let _ = write!(text, "{done} {}", self.unit);
        let start = text.len();
        let _ = write!(text, ", {detail}");
        if text.len() == start + 2 {
            text.truncate(start);
        }
        let out = match self.mode {
            Mode::Terminal => {
                let line = format!("progress {:.0} s: {text}", at.as_secs_f64());
                format!("{ERASE}{}", fit(&line, terminal_width()))
            }
            Mode::Lines => format_line(at, &text),
            Mode::Off => return,
        };
        self.shown.store(true, Ordering::Relaxed);
        write_stderr(&out);
    }

    /// Ends the reports: erases the status line, or tells the launcher this
    /// node is finished. Call it before printing results; drop calls it too.
    pub fn finish(&self) {
        if !self.shown.swap(false, Ordering::Relaxed) {
            return;
        }
        let _guard = self.text.lock().unwrap_or_else(|e| e.into_inner());
        match self.mode {
            Mode::Terminal => write_stderr(ERASE),
            Mode::Lines => write_stderr(&format!(
                "{LINE_PREFIX}{} end\n",
                self.start.elapsed().as_millis()
            )),
            Mode::Off => {}
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

/// One write, so that a line is not split by another thread's output; a
/// closed stderr is no reason to fail the program.
fn write_stderr(s: &str) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(s.as_bytes()).and_then(|()| err.flush());
}

/// A node's progress line for its launcher: `hyfi-progress: <ms> <text>\n`
/// (line breaks in `text` become spaces, so it stays one line).
pub fn format_line(elapsed: Duration, text: &str) -> String {
    let text = text.replace(['\n', '\r'], " ");
    format!("{LINE_PREFIX}{} {text}\n", elapsed.as_millis())
}

/// What a node's progress line says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Report {
    /// The node's latest progress, at `elapsed` of its run time.
    Update {
        /// The node's run time when it reported.
        elapsed: Duration,
        /// "1234 sweeps, maxdiff 1.2e-3".
        text: String,
    },
    /// The node is finished: its progress is no longer shown.
    End,
}

/// The report in `line` (without its line break), if it is a progress
/// line ([`format_line`]); `None` for any other line.
pub fn parse_line(line: &str) -> Option<Report> {
    let rest = line.strip_prefix(LINE_PREFIX)?;
    let (ms, text) = rest.split_once(' ').unwrap_or((rest, ""));
    let ms: u64 = ms.parse().ok()?;
    if text == "end" {
        return Some(Report::End);
    }
    Some(Report::Update {
        elapsed: Duration::from_millis(ms),
        text: text.to_owned(),
    })
}

/// `line` cut to fit in `width` columns (one per character), ending in `…`
/// if cut: a status line must not wrap, or `\r` could not rewrite it.
pub fn fit(line: &str, width: usize) -> String {
    let width = width.max(2);
    if line.chars().count() < width {
        return line.to_owned();
    }
    let mut s: String = line.chars().take(width - 2).collect();
    s.push('…');
    s
}

/// Columns of the terminal on stderr; 80 if it cannot be asked.
pub fn terminal_width() -> usize {
    let mut ws = std::mem::MaybeUninit::<libc::winsize>::zeroed();
    // SAFETY: TIOCGWINSZ writes one `winsize` through the pointer, which
    // points at a zeroed `winsize` that lives across the call; on failure
    // nothing is written and the zeroes are never read.
    let rc = unsafe { libc::ioctl(libc::STDERR_FILENO, libc::TIOCGWINSZ, ws.as_mut_ptr()) };
    // SAFETY: zeroed, then (on success) filled in by the kernel.
    let cols = if rc == 0 {
        unsafe { ws.assume_init() }.ws_col
    } else {
        0
    };
    if cols > 0 {
        usize::from(cols)
    } else {
        80
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn throttle_waits_then_lets_a_few_through() {
        let t = Throttle::new(2000 * MS, 250 * MS);
        // Nothing before the delay, however often asked.
        assert!((0..2000).step_by(10).all(|ms| !t.due(ms * MS)));
        assert!(t.due(2000 * MS));
        assert!(!t.due(2000 * MS));
        assert!(!t.due(2249 * MS));
        assert!(t.due(2250 * MS));
        // A late event counts from itself, not from the schedule.
        assert!(t.due(5000 * MS));
        assert!(!t.due(5100 * MS));
        // Asked every millisecond for 10 s: at most one per 250 ms.
        let t = Throttle::new(2000 * MS, 250 * MS);
        let shown = (0..10_000).filter(|&ms| t.due(ms * MS)).count();
        assert_eq!(shown, 32);
    }

    #[test]
    fn throttle_lets_one_of_many_threads_through() {
        let t = Throttle::new(Duration::ZERO, Duration::from_secs(3600));
        let through = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..1000).filter(|_| t.due(MS)).count()))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum::<usize>()
        });
        assert_eq!(through, 1);
    }

    #[test]
    fn lines_round_trip() {
        let line = format_line(5123 * MS, "1234 sweeps, maxdiff 1.200e-3");
        assert_eq!(line, "hyfi-progress: 5123 1234 sweeps, maxdiff 1.200e-3\n");
        assert_eq!(
            parse_line(line.trim_end()),
            Some(Report::Update {
                elapsed: 5123 * MS,
                text: "1234 sweeps, maxdiff 1.200e-3".into()
            })
        );
        assert_eq!(parse_line("hyfi-progress: 7000 end"), Some(Report::End));
        // One line, whatever the text holds.
        assert_eq!(format_line(MS, "a\nb\r").lines().count(), 1);
        // Other lines are not progress.
        for other in [
            "hyfi-progress:",
            "hyfi-progress: soon 3 sweeps",
            "node 0: hyfi-progress: 5 x",
            "jacobi n=256",
        ] {
            assert_eq!(parse_line(other), None, "{other}");
        }
    }

    #[test]
    fn settings() {
        assert_eq!(Setting::parse(None), Setting::Auto);
        assert_eq!(Setting::parse(Some("auto")), Setting::Auto);
        assert_eq!(Setting::parse(Some("off")), Setting::Off);
        assert_eq!(Setting::parse(Some("0")), Setting::Off);
        assert_eq!(Setting::parse(Some("force")), Setting::Force);
        assert_eq!(Setting::parse(Some("1")), Setting::Force);
        assert_eq!(Setting::parse(Some("lines")), Setting::Lines);
        assert!(Setting::Force.launcher_renders());
        assert!(!Setting::Off.launcher_renders());
    }

    #[test]
    fn long_lines_are_cut_to_the_width() {
        assert_eq!(fit("short", 80), "short");
        let cut = fit(&"é".repeat(100), 40);
        assert_eq!(cut.chars().count(), 39);
        assert!(cut.ends_with('…'));
    }

    #[test]
    fn an_off_progress_writes_nothing_and_costs_no_clock() {
        let p = Progress::off();
        assert!(!p.is_enabled());
        p.report(1, format_args!("x"));
        p.finish();
        assert!(!p.shown.load(Ordering::Relaxed));
        assert_eq!(p.throttle.next.load(Ordering::Relaxed), nanos(DELAY));
    }
}
