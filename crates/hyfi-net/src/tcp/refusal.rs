//! Refused connections: one line each, rate-limited.
//!
//! A connection that is not a hyfi peer of this job (garbage, a port scan, a
//! node of another job, a wrong token) is worth one line on stderr and in the
//! log: it is an attack or a misconfiguration a user wants to see. A flood of
//! them must not flood stderr, so at most [`LINES_PER_WINDOW`] lines are
//! written per [`WINDOW`]; the rest are counted and summed up in one line
//! ("…and 1995 more refused connections") when the window ends.

use std::fmt::Display;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Lines written per window before the rest are only counted.
pub const LINES_PER_WINDOW: u32 = 5;
/// The rate limit's window.
pub const WINDOW: Duration = Duration::from_secs(1);

/// The refusal log of one node (shared by the threads or tasks that refuse).
pub(crate) struct RefusalLog {
    me: usize,
    state: Mutex<State>,
}

struct State {
    /// Every refusal, logged or held back.
    total: u64,
    window: Instant,
    written: u32,
    held_back: u64,
    summary_due: bool,
}

impl RefusalLog {
    pub(crate) fn new(me: usize) -> RefusalLog {
        RefusalLog {
            me,
            state: Mutex::new(State {
                total: 0,
                window: Instant::now(),
                written: 0,
                held_back: 0,
                summary_due: false,
            }),
        }
    }

    /// Logs the refusal of a connection from `from`. Returns how long until
    /// the held-back count must be summed up, when this call held its line
    /// back and nobody was told so yet: the caller then calls [`tick`]
    /// after that delay, so that the summary appears even if no other
    /// connection comes.
    ///
    /// [`tick`]: RefusalLog::tick
    pub(crate) fn refuse(&self, from: impl Display, why: impl Display) -> Option<Duration> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        st.total += 1;
        if now >= st.window + WINDOW {
            self.summarise(&mut st);
            st.window = now;
            st.written = 0;
        }
        if st.written < LINES_PER_WINDOW {
            st.written += 1;
            emit(format!(
                "node {}: refused a connection from {from}: {why}",
                self.me
            ));
            return None;
        }
        st.held_back += 1;
        if st.summary_due {
            return None;
        }
        st.summary_due = true;
        Some((st.window + WINDOW).saturating_duration_since(now))
    }

    /// How many connections were refused, logged or not.
    pub(crate) fn total(&self) -> u64 {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).total
    }

    /// Sums up the held-back lines if their window is over.
    pub(crate) fn tick(&self) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if Instant::now() >= st.window + WINDOW {
            self.summarise(&mut st);
        }
    }

    /// Sums up the held-back lines now (at the end of setup).
    pub(crate) fn flush(&self) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.summarise(&mut st);
    }

    fn summarise(&self, st: &mut State) {
        if st.held_back > 0 {
            emit(format!(
                "node {}: …and {} more refused connections (at most {LINES_PER_WINDOW} are \
                 logged a second)",
                self.me, st.held_back
            ));
            st.held_back = 0;
        }
        st.summary_due = false;
    }
}

fn emit(msg: String) {
    tracing::warn!("{msg}");
    eprintln!("hyfi: {msg}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_held_back_and_counted() {
        let log = RefusalLog::new(0);
        let mut asked = 0;
        for i in 0..1000 {
            if log.refuse(format!("10.0.0.1:{i}"), "garbage").is_some() {
                asked += 1;
            }
        }
        let st = log.state.lock().unwrap();
        // 1000 calls take far less than the 1 s window unless the machine
        // stalls; either way at most 5 lines per window, one summary each.
        assert!(st.written <= LINES_PER_WINDOW);
        assert!(asked >= 1 && asked <= 1000 / (LINES_PER_WINDOW as usize + 1));
        assert_eq!(st.total, 1000);
        drop(st);
        log.flush();
        let st = log.state.lock().unwrap();
        assert_eq!((st.held_back, st.summary_due), (0, false));
    }
}
