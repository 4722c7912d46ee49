//! The job's status line: every node's latest progress, on the launcher's
//! terminal, rewritten in place.
//!
//! Nodes write progress as lines on stderr (`hyfi_core::progress`); the
//! forwarders never copy those, they hand them to `Status::update`. When
//! the launcher renders (its stderr a terminal, or `HYFI_PROGRESS=force`),
//! the supervising loop's `Status::tick` draws one line, at most every
//! [`REDRAW`]:
//!
//! ```text
//! hyfi 12 s | nodes 0-2: 1234 sweeps, maxdiff 1.2e-3 | node 3: 1233 sweeps, …
//! ```
//!
//! Any other output line goes through `Status::print`, which erases the
//! status line first (it is drawn again at the next tick), so the two never
//! share a line; `Status::clear` erases it for good at the end.
//!
//! Lock order: the status, then stdout or stderr.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hyfi_core::progress::{fit, terminal_width, Report, ERASE};

/// Least time between two drawings of the status line.
pub const REDRAW: Duration = Duration::from_millis(200);

/// The status line of a job (see the module docs).
pub(crate) struct Status {
    /// Whether the launcher draws it; if not, progress lines are dropped.
    render: bool,
    inner: Mutex<Inner>,
}

struct Inner {
    start: Instant,
    /// Each reporting node's latest text.
    nodes: BTreeMap<usize, String>,
    /// Whether the line is on the terminal now.
    shown: bool,
    /// Whether what is shown is out of date.
    dirty: bool,
    drawn_at: Option<Instant>,
    /// Set by [`Status::clear`]: nothing more is drawn.
    done: bool,
}

impl Status {
    pub(crate) fn new(render: bool) -> Status {
        Status {
            render,
            inner: Mutex::new(Inner {
                start: Instant::now(),
                nodes: BTreeMap::new(),
                shown: false,
                dirty: false,
                drawn_at: None,
                done: false,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Node `rank`'s report.
    pub(crate) fn update(&self, rank: usize, report: Report) {
        if !self.render {
            return;
        }
        let mut s = self.lock();
        match report {
            Report::Update { text, .. } => {
                s.nodes.insert(rank, text);
            }
            Report::End => {
                s.nodes.remove(&rank);
            }
        }
        s.dirty = true;
    }

    /// Draws the line if it is out of date and was not drawn just now.
    pub(crate) fn tick(&self) {
        if !self.render {
            return;
        }
        let mut s = self.lock();
        let due = !matches!(s.drawn_at, Some(t) if t.elapsed() < REDRAW);
        if s.done || !s.dirty || !due {
            return;
        }
        s.dirty = false;
        s.drawn_at = Some(Instant::now());
        let mut err = std::io::stderr().lock();
        if s.nodes.is_empty() {
            if s.shown {
                s.shown = false;
                let _ = err.write_all(ERASE.as_bytes()).and_then(|()| err.flush());
            }
            return;
        }
        let line = render(s.start.elapsed(), &s.nodes, terminal_width());
        s.shown = true;
        let _ = err
            .write_all(format!("{ERASE}{line}").as_bytes())
            .and_then(|()| err.flush());
    }

    /// Runs `write`, which writes whole lines, with the status line erased
    /// first; it is drawn again at the next tick.
    pub(crate) fn print<R>(&self, write: impl FnOnce() -> R) -> R {
        if !self.render {
            return write();
        }
        let mut s = self.lock();
        if s.shown {
            s.shown = false;
            s.dirty = !s.nodes.is_empty();
            let mut err = std::io::stderr().lock();
            let _ = err.write_all(ERASE.as_bytes()).and_then(|()| err.flush());
        }
        write()
    }

    /// Erases the line for good: the job is over.
    pub(crate) fn clear(&self) {
        if !self.render {
            return;
        }
        let mut s = self.lock();
        s.done = true;
        if s.shown {
            s.shown = false;
            let mut err = std::io::stderr().lock();
            let _ = err.write_all(ERASE.as_bytes()).and_then(|()| err.flush());
        }
    }
}

/// The status line for `nodes`' latest reports, at most `width - 1`
/// columns: nodes that report the same text share an entry (in SPMD
/// post-phase code they usually do), then as many entries as fit, then how
/// many nodes are left out.
pub fn render(elapsed: Duration, nodes: &BTreeMap<usize, String>, width: usize) -> String {
    // Entries in the order of their lowest rank.
    let mut entries: Vec<(&str, Vec<usize>)> = Vec::new();
    for (&rank, text) in nodes {
        match entries.iter_mut().find(|(t, _)| *t == text.as_str()) {
            Some((_, ranks)) => ranks.push(rank),
            None => entries.push((text, vec![rank])),
        }
    }
    let mut line = format!("hyfi {:.0} s", elapsed.as_secs_f64());
    let width = width.max(20);
    let mut left = nodes.len();
    for (k, (text, ranks)) in entries.iter().enumerate() {
        let who = match ranks.as_slice() {
            [one] => format!("node {one}"),
            many => format!("nodes {}", super::output::ranges(many)),
        };
        let part = format!(" | {who}: {text}");
        // Room kept for " | +N more node(s)" if this is not the last.
        let tail = if k + 1 < entries.len() { 24 } else { 0 };
        let cols = line.chars().count() + part.chars().count();
        if k > 0 && cols + tail >= width {
            let _ = write!(line, " | +{left} more node(s)");
            break;
        }
        line.push_str(&part);
        left -= ranks.len();
    }
    fit(&line, width)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: usize) -> BTreeMap<usize, String> {
        (0..n)
            .map(|r| (r, format!("{} sweeps, maxdiff 1.0e-3", 100 + r)))
            .collect()
    }

    #[test]
    fn nodes_saying_the_same_share_an_entry() {
        let mut same: BTreeMap<usize, String> = (0..64)
            .map(|r| (r, "7 sweeps, maxdiff 0.5".into()))
            .collect();
        same.insert(9, "6 sweeps, maxdiff 0.6".into());
        assert_eq!(
            render(Duration::from_secs(5), &same, 100),
            "hyfi 5 s | nodes 0-8, 10-63: 7 sweeps, maxdiff 0.5 | node 9: 6 sweeps, maxdiff 0.6"
        );
    }

    #[test]
    fn every_node_side_by_side() {
        let line = render(Duration::from_millis(12_400), &nodes(2), 200);
        assert_eq!(
            line,
            "hyfi 12 s | node 0: 100 sweeps, maxdiff 1.0e-3 | node 1: 101 sweeps, maxdiff 1.0e-3"
        );
    }

    #[test]
    fn many_nodes_fit_the_terminal() {
        let line = render(Duration::from_secs(3), &nodes(64), 80);
        assert!(line.chars().count() < 80, "{line}");
        assert!(line.contains("node 0: 100 sweeps"), "{line}");
        assert!(line.ends_with("more node(s)"), "{line}");
        // A single long report is cut, not wrapped.
        let mut one = BTreeMap::new();
        one.insert(0, "x".repeat(500));
        assert!(render(Duration::ZERO, &one, 80).chars().count() < 80);
    }

    #[test]
    fn a_quiet_status_passes_lines_through_and_draws_nothing() {
        let s = Status::new(false);
        s.update(0, Report::End);
        s.tick();
        assert_eq!(s.print(|| 7), 7);
        let g = s.lock();
        assert!(g.nodes.is_empty() && !g.shown && !g.dirty);
    }
}
