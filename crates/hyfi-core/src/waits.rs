//! What each filthread and thread of this process waits for: the hang
//! report a node prints on SIGUSR1 (hyfi-net's signal thread calls
//! [`report`]).
//!
//! Every layer that suspends a filthread or blocks a thread for a reason of
//! its own (a shared page and its home, a stolen child, a barrier, a
//! message) holds a [`Waiting`] guard meanwhile. Waits are a slow path —
//! each already costs a suspension or a network round trip — so one lock
//! per wait is cheap next to them; recording one allocates nothing once the
//! table has grown to the number of concurrent waits.
//!
//! A leaf: every layer, the scheduler's latches included, records its waits
//! here, so this module names none of them. Which processor and filthread
//! a caller is, only the scheduler knows: the runtime registers that lookup
//! at start-up (`set_locator`); before any runtime started no caller is on
//! a server thread, and the wait is the OS thread's.
//!
//! ```
//! let w = hyfi::layers::waits::waiting(|a| format!("page {} from node {}", a[0], a[1]), [7, 1, 0]);
//! assert!(hyfi::layers::waits::report().contains("page 7 from node 1"));
//! drop(w);
//! assert!(!hyfi::layers::waits::report().contains("page 7 from node 1"));
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// Describes a wait from its three numbers (no allocation until printed).
pub type Describe = fn(&[u64; 3]) -> String;

struct Entry {
    /// Processor and filthread, or the OS thread when not on a server thread.
    who: Who,
    what: Describe,
    args: [u64; 3],
    since: Instant,
}

enum Who {
    /// On processor `proc`: in filthread `filthread`, or (`None`) on the
    /// server thread itself.
    Filament {
        proc: usize,
        filthread: Option<u64>,
    },
    Thread(std::thread::Thread),
}

fn table() -> &'static Mutex<HashMap<u64, Entry>> {
    static T: OnceLock<Mutex<HashMap<u64, Entry>>> = OnceLock::new();
    T.get_or_init(|| Mutex::new(HashMap::new()))
}

static NEXT: AtomicU64 = AtomicU64::new(1);

/// Where the caller runs, as the scheduler knows it: `Some((processor,
/// filthread))` on a server thread (`filthread` is `None` on the server
/// thread's own stack), `None` elsewhere.
pub(crate) type Locate = fn() -> Option<(usize, Option<u64>)>;

static LOCATE: OnceLock<Locate> = OnceLock::new();

/// Registers the scheduler's lookup (the runtime does, at start-up; the
/// first registration stays: there is one scheduler).
pub(crate) fn set_locator(locate: Locate) {
    let _ = LOCATE.set(locate);
}

/// A wait in progress; ends when dropped.
#[must_use = "the wait is recorded only while the guard lives"]
pub struct Waiting(u64);

/// Records that the calling filthread (or thread) waits for what
/// `what(&args)` says, until the guard is dropped.
pub fn waiting(what: Describe, args: [u64; 3]) -> Waiting {
    let who = match LOCATE.get().and_then(|locate| locate()) {
        Some((proc, filthread)) => Who::Filament { proc, filthread },
        None => Who::Thread(std::thread::current()),
    };
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    table().lock().unwrap_or_else(|e| e.into_inner()).insert(
        id,
        Entry {
            who,
            what,
            args,
            since: Instant::now(),
        },
    );
    Waiting(id)
}

impl Drop for Waiting {
    fn drop(&mut self) {
        table()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.0);
    }
}

/// One line per wait in progress, by processor (then other threads),
/// oldest first within each: "processor 1, filthread 7: page 12 of shared
/// allocation #0 from its home node 1 (for 3.2 s)". Empty if nothing waits.
pub fn report() -> String {
    let mut rows: Vec<(usize, u64, String)> = {
        let t = table().lock().unwrap_or_else(|e| e.into_inner());
        t.values()
            .map(|e| {
                let (key, who) = match &e.who {
                    Who::Filament {
                        proc,
                        filthread: Some(f),
                    } => (*proc, format!("processor {proc}, filthread {f}")),
                    Who::Filament {
                        proc,
                        filthread: None,
                    } => (*proc, format!("processor {proc}")),
                    Who::Thread(t) => (
                        usize::MAX,
                        format!("thread {}", t.name().unwrap_or("(unnamed)")),
                    ),
                };
                let age = e.since.elapsed();
                (
                    key,
                    u64::MAX - age.as_micros() as u64,
                    format!(
                        "{who}: waits for {} (for {:.1} s)",
                        (e.what)(&e.args),
                        age.as_secs_f64()
                    ),
                )
            })
            .collect()
    };
    rows.sort();
    rows.into_iter().map(|(_, _, s)| s + "\n").collect()
}
