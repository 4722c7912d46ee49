//! Why a job failed: the *first cause*, on which every node and the
//! launcher agree.
//!
//! When one node goes wrong, every other node soon fails too (its links
//! close, an `Abort` arrives, its launcher stops it), and each has an error
//! to print. What the user needs is the one that came first. So a failure
//! is a [`Cause`]: the node where it started (its *origin*), what kind it is
//! and its text. A node that learns of a failure elsewhere keeps the
//! origin's cause (an `Abort` carries it), and prints one line that names
//! each node once: `node 0: node 1 failed first: …`.
//!
//! Under hyfi's launchers (the embedded one and `hyfi-run`) each node also
//! writes its causes to a pipe the launcher gave it ([`REPORT_FD_ENV`]), one
//! line each, with the time on the host's monotonic clock. The launcher
//! takes the earliest cause as the job's, says so in its first line, and
//! exits with the code of [`CauseKind::exit_code`] (the table is in the
//! README). A node that died without a word (SIGKILL) wrote nothing; the
//! peers' "lost node 1" lines name it, and the launcher adds how it ended.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::Duration;

/// The variable that tells a node which file descriptor carries its causes
/// to its launcher (set by hyfi's launchers only).
pub const REPORT_FD_ENV: &str = "HYFI_REPORT_FD";

/// What kind of failure a [`Cause`] is; it decides the exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CauseKind {
    /// The program failed: an error it returned, a panic, an SPMD
    /// divergence.
    Program,
    /// A setting (`HYFI_*`, a command-line option) is not valid.
    Config,
    /// The nodes could not meet at start-up.
    Startup,
    /// The node stopped answering: nothing, not even a heartbeat, for
    /// `HYFI_HEARTBEAT` seconds.
    Hung,
    /// The node's links closed without a word: it died (how, only its
    /// launcher can tell).
    Lost,
    /// The node took this signal, not from its launcher.
    Signal(i32),
    /// The node died of a fault it could still name (a stack overflow, an
    /// abort, an out-of-memory): it ends with SIGABRT.
    Fatal,
}

impl CauseKind {
    /// The exit code for a job that failed first of this (see the README's
    /// table): 1 the program, 2 configuration, 3 a node lost, 4 start-up,
    /// 128 + n a signal, 134 (SIGABRT) a fatal fault.
    pub fn exit_code(self) -> i32 {
        match self {
            CauseKind::Program => 1,
            CauseKind::Config => 2,
            CauseKind::Hung | CauseKind::Lost => 3,
            CauseKind::Startup => 4,
            CauseKind::Signal(n) => 128 + n,
            CauseKind::Fatal => 128 + libc::SIGABRT,
        }
    }

    fn token(self) -> String {
        match self {
            CauseKind::Program => "program".into(),
            CauseKind::Config => "config".into(),
            CauseKind::Startup => "startup".into(),
            CauseKind::Hung => "hung".into(),
            CauseKind::Lost => "lost".into(),
            CauseKind::Signal(n) => format!("signal:{n}"),
            CauseKind::Fatal => "fatal".into(),
        }
    }

    fn from_token(s: &str) -> Option<CauseKind> {
        Some(match s {
            "program" => CauseKind::Program,
            "config" => CauseKind::Config,
            "startup" => CauseKind::Startup,
            "hung" => CauseKind::Hung,
            "lost" => CauseKind::Lost,
            "fatal" => CauseKind::Fatal,
            _ => CauseKind::Signal(s.strip_prefix("signal:")?.parse().ok()?),
        })
    }

    /// As carried by an `Abort` message.
    pub(crate) fn to_wire(self) -> u32 {
        match self {
            CauseKind::Program => 1,
            CauseKind::Config => 2,
            CauseKind::Startup => 3,
            CauseKind::Hung => 4,
            CauseKind::Lost => 5,
            CauseKind::Fatal => 6,
            CauseKind::Signal(n) => 0x100 | (n as u32 & 0xff),
        }
    }

    /// From an `Abort` message; an unknown code is a program failure.
    pub(crate) fn from_wire(w: u32) -> CauseKind {
        match w {
            2 => CauseKind::Config,
            3 => CauseKind::Startup,
            4 => CauseKind::Hung,
            5 => CauseKind::Lost,
            6 => CauseKind::Fatal,
            w if w & 0x100 != 0 => CauseKind::Signal((w & 0xff) as i32),
            _ => CauseKind::Program,
        }
    }
}

/// A failure and the node where it started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cause {
    /// The node that failed first.
    pub origin: usize,
    /// What kind of failure.
    pub kind: CauseKind,
    /// What happened, without naming the origin (the line does).
    pub text: String,
}

impl Cause {
    /// A failure of node `origin`.
    pub fn new(origin: usize, kind: CauseKind, text: impl Into<String>) -> Cause {
        let text = text.into();
        // Texts built from errors often start by naming the node: the line
        // names it, once.
        let prefix = format!("node {origin}: ");
        let text = match text.strip_prefix(&prefix) {
            Some(rest) => rest.to_string(),
            None => text,
        };
        Cause { origin, kind, text }
    }

    /// The line node `me` prints: `node 0: node 1 failed first: …`, or
    /// `node 1: …` on the origin itself.
    pub fn line(&self, me: usize) -> String {
        if self.origin == me {
            format!("node {me}: {}", self.text)
        } else {
            format!(
                "node {me}: node {} failed first: {}",
                self.origin, self.text
            )
        }
    }
}

/// `node 1: its text`: the cause as its origin says it.
impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "node {}: {}", self.origin, self.text)
    }
}

/// Whether this node's failure was given to its program as an error (which
/// prints it), or printed by hyfi already: then hyfi does not print it
/// (again). One node per process.
static DELIVERED: AtomicBool = AtomicBool::new(false);

/// The node's failure was returned to its program.
pub(crate) fn mark_delivered() {
    DELIVERED.store(true, Ordering::SeqCst);
}

/// Whether the failure was delivered or printed; from now on it counts as
/// printed.
pub(crate) fn take_delivered() -> bool {
    DELIVERED.swap(true, Ordering::SeqCst)
}

/// How long a node that failed, or learned of a failure, waits for its own
/// program to report the error before it ends the process itself.
pub const FAILURE_GRACE: Duration = Duration::from_secs(2);

/// Ends the process [`FAILURE_GRACE`] after node `me` failed with `cause`,
/// if its program has not ended it by then: printing the cause, unless the
/// program was given it as an error (and so printed it, or chose not to),
/// and exiting with the cause's code (see [`CauseKind::exit_code`]).
pub(crate) fn end_after_grace(me: usize, cause: &Cause) {
    std::thread::sleep(FAILURE_GRACE);
    if !take_delivered() {
        eprintln!("hyfi: {}", cause.line(me));
    }
    std::process::exit(cause.kind.exit_code());
}

/// Whether this node was started by hyfi's launcher (it has the pipe).
pub(crate) fn has_launcher() -> bool {
    REPORT_FD.load(Ordering::Relaxed) >= 0
}

/// The launcher's pipe, or -1 (none, or not read yet).
static REPORT_FD: AtomicI32 = AtomicI32::new(-1);

/// Takes the pipe named by [`REPORT_FD_ENV`], if any, and keeps it from
/// the programs this node may start. Called at start-up.
pub(crate) fn open_report_pipe() {
    if let Some(fd) = inherited_fd(REPORT_FD_ENV) {
        REPORT_FD.store(fd, Ordering::Relaxed);
    }
}

/// The descriptor the local launcher left open for this node under the
/// variable `var` (the cause pipe, node 0's listener), made close-on-exec
/// so that the programs this node starts do not inherit it: `None` if the
/// variable names none above 2, or one that is not open.
pub(crate) fn inherited_fd(var: &str) -> Option<i32> {
    let fd = std::env::var(var)
        .ok()?
        .parse::<i32>()
        .ok()
        .filter(|&fd| fd > 2)?;
    // SAFETY: fcntl on a descriptor number has no memory effects; a number
    // that is not open fails with EBADF, and is then not used.
    (unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } == 0).then_some(fd)
}

/// Tells the launcher (if any) this node's cause: its own failure, or what
/// it learned of another's.
pub(crate) fn report(cause: &Cause) {
    write_record(&Record {
        t_ns: hyfi_core::trace::now(),
        origin: Some(cause.origin),
        kind: Some(cause.kind),
        text: cause.text.clone(),
    });
}

/// Tells the launcher this node was stopped by it (a signal it sent).
pub(crate) fn report_stopped(text: &str) {
    write_record(&Record {
        t_ns: hyfi_core::trace::now(),
        origin: None,
        kind: None,
        text: text.to_string(),
    });
}

/// What starts a report-pipe line that names the node's trace (see
/// [`hyfi_core::trace`]): the launcher merges the nodes' files into it.
pub const TRACE_RECORD: &str = "hyfi-trace ";

/// Tells the launcher (if any) that this node wrote its part of the trace
/// `path` (registered with [`hyfi_core::trace::on_written`]).
pub(crate) fn report_trace(path: &std::path::Path) {
    let path = std::env::current_dir()
        .map(|d| d.join(path))
        .unwrap_or_else(|_| path.to_path_buf());
    write_line(&format!("{TRACE_RECORD}{}\n", path.display()));
}

fn write_record(r: &Record) {
    write_line(&r.encode());
}

fn write_line(line: &str) {
    let fd = REPORT_FD.load(Ordering::Relaxed);
    if fd < 0 {
        return;
    }
    // One write of less than PIPE_BUF bytes is atomic: the launcher reads
    // whole lines. A launcher gone already makes it fail; nothing to do.
    // SAFETY: writes from a live buffer of the length given.
    unsafe { libc::write(fd, line.as_ptr().cast(), line.len()) };
}

/// Longest text in a record, so that a record fits one atomic pipe write.
const MAX_TEXT: usize = 3000;

/// One line of a node's report pipe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// When, on the host's monotonic clock.
    pub t_ns: u64,
    /// The node the cause started at; `None`: the launcher stopped this one.
    pub origin: Option<usize>,
    /// Its kind (`None` with `origin`).
    pub kind: Option<CauseKind>,
    /// What happened.
    pub text: String,
}

impl Record {
    /// `hyfi-cause <t_ns> <origin|-> <kind|stopped> <text>\n`.
    pub fn encode(&self) -> String {
        let mut text: String = self
            .text
            .chars()
            .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
            .collect();
        if text.len() > MAX_TEXT {
            let mut cut = MAX_TEXT;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            text.push('…');
        }
        let origin = self.origin.map_or("-".to_string(), |o| o.to_string());
        let kind = self.kind.map_or("stopped".to_string(), CauseKind::token);
        format!("hyfi-cause {} {origin} {kind} {text}\n", self.t_ns)
    }

    /// The record on one line (without its newline); `None` if it is not one.
    pub fn decode(line: &str) -> Option<Record> {
        let rest = line.strip_prefix("hyfi-cause ")?;
        let mut parts = rest.splitn(4, ' ');
        let t_ns = parts.next()?.parse().ok()?;
        let origin = match parts.next()? {
            "-" => None,
            o => Some(o.parse().ok()?),
        };
        let kind = match parts.next()? {
            "stopped" => None,
            k => Some(CauseKind::from_token(k)?),
        };
        let text = parts.next().unwrap_or("").to_string();
        if origin.is_some() != kind.is_some() {
            return None;
        }
        Some(Record {
            t_ns,
            origin,
            kind,
            text,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_names_each_node_once() {
        let c = Cause::new(1, CauseKind::Lost, "node 1: its connection closed");
        assert_eq!(c.text, "its connection closed");
        assert_eq!(
            c.line(0),
            "node 0: node 1 failed first: its connection closed"
        );
        assert_eq!(c.line(1), "node 1: its connection closed");
    }

    #[test]
    fn records_and_kinds_round_trip() {
        for kind in [
            CauseKind::Program,
            CauseKind::Config,
            CauseKind::Startup,
            CauseKind::Hung,
            CauseKind::Lost,
            CauseKind::Signal(2),
            CauseKind::Fatal,
        ] {
            assert_eq!(CauseKind::from_wire(kind.to_wire()), kind);
            let r = Record {
                t_ns: 42,
                origin: Some(3),
                kind: Some(kind),
                text: "a b\nc".into(),
            };
            let line = r.encode();
            let back = Record::decode(line.trim_end()).expect("decodes");
            assert_eq!(back.text, "a b c");
            assert_eq!(
                (back.t_ns, back.origin, back.kind),
                (42, Some(3), Some(kind))
            );
        }
        let stopped = Record {
            t_ns: 7,
            origin: None,
            kind: None,
            text: "SIGTERM".into(),
        };
        assert_eq!(Record::decode(stopped.encode().trim_end()), Some(stopped));
        assert_eq!(Record::decode("hyfi-cause x 1 program t"), None);
        assert_eq!(Record::decode("hello"), None);
        assert_eq!(Record::decode("hyfi-cause 1 - program t"), None);
    }

    #[test]
    fn exit_codes_follow_the_table() {
        assert_eq!(CauseKind::Program.exit_code(), 1);
        assert_eq!(CauseKind::Config.exit_code(), 2);
        assert_eq!(CauseKind::Hung.exit_code(), 3);
        assert_eq!(CauseKind::Startup.exit_code(), 4);
        assert_eq!(CauseKind::Signal(2).exit_code(), 130);
        assert_eq!(CauseKind::Fatal.exit_code(), 134);
    }
}
