//! How the nodes of a local launch ended, and the exit code the launcher
//! ends with for them.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use nix::sys::signal::Signal;

/// How the nodes ended.
#[derive(Clone, Debug)]
pub struct LaunchOutcome {
    /// Node i's exit status at index i, for the nodes started: fewer than
    /// asked for if a signal or a failure stopped the start-up.
    pub statuses: Vec<ExitStatus>,
    /// The node that failed first, if any: the one whose cause every node
    /// reported first (see `causes`), or else the first reaped with a
    /// failure.
    pub first_failure: Option<usize>,
    /// Why it failed (the rest of "node N failed first: …") and the
    /// launcher's exit code for it.
    pub first_cause: Option<(String, i32)>,
    /// The first forwarded signal the launcher received, if any.
    pub interrupted: Option<Signal>,
}

impl LaunchOutcome {
    /// Whether every node exited with status 0 and no signal stopped the job.
    pub fn success(&self) -> bool {
        self.interrupted.is_none() && self.statuses.iter().all(ExitStatus::success)
    }

    /// The exit code the launcher should end with (the README's table):
    /// 128 + the signal if one stopped the job (130 for Ctrl-C, as a shell
    /// reports it, whatever the nodes made of it); else 0 if every node
    /// succeeded; else the code of the first cause (1 a program's error or
    /// panic, 2 configuration, 3 a node that stopped answering, 4 start-up,
    /// 128 + n a node killed by signal n, or that took it); else the
    /// status of the first node to fail.
    pub fn exit_code(&self) -> i32 {
        if let Some(sig) = self.interrupted {
            return crate::signals::exit_code_for(sig);
        }
        if let Some((_, code)) = &self.first_cause {
            return *code;
        }
        let failed = self
            .first_failure
            .or_else(|| self.statuses.iter().position(|s| !s.success()));
        match failed.and_then(|i| self.statuses.get(i)) {
            None => 0,
            Some(s) => status_code(*s),
        }
    }
}

pub(super) fn status_code(s: ExitStatus) -> i32 {
    match (s.code(), s.signal()) {
        (Some(c), _) => c,
        (None, Some(sig)) => 128 + sig,
        (None, None) => 1,
    }
}

/// "exited with status 3" / "was killed by signal 9 (SIGKILL)".
pub(super) fn describe(s: ExitStatus) -> String {
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(sig)) => match Signal::try_from(sig) {
            Ok(name) => format!("was killed by signal {sig} ({name})"),
            Err(_) => format!("was killed by signal {sig}"),
        },
        (None, None) => format!("ended with status {s}"),
    }
}
