//! DSM counters: per processor while a phase runs (no sharing on the hot
//! path), folded per phase at every release.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Counters of one node, for one phase or in total.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct DsmCounters {
            $($(#[$doc])* pub $name: u64,)*
        }

        #[derive(Default)]
        pub(crate) struct AtomicCounters {
            $(pub(crate) $name: AtomicU64,)*
        }

        impl AtomicCounters {
            pub(crate) fn snapshot(&self) -> DsmCounters {
                DsmCounters { $($name: self.$name.load(Relaxed),)* }
            }
        }

        impl DsmCounters {
            fn add(&mut self, o: &DsmCounters) {
                $(self.$name += o.$name;)*
            }
            fn sub(&self, o: &DsmCounters) -> DsmCounters {
                DsmCounters { $($name: self.$name.saturating_sub(o.$name),)* }
            }
        }
    };
}

counters! {
    /// Reads that found a page missing and requested it.
    read_faults,
    /// First writes to a page in a phase (a twin made, or the home marking it).
    write_faults,
    /// Pages that arrived from their homes.
    pages_fetched,
    /// Pages this node sent as a home.
    pages_served,
    /// Page requests that came before the home's release was complete and waited for it.
    requests_deferred,
    /// Diffs sent to homes.
    diffs_sent,
    /// Bytes of diff runs sent.
    diff_bytes_sent,
    /// Diffs applied here as a home.
    diffs_applied,
    /// Pages homed elsewhere that a write view made writable here and the
    /// phase left unchanged (a stencil's halo rows): no diff and no notice,
    /// and the copy stays, to be pushed to or invalidated like a reader's.
    pages_unchanged,
    /// Pages named in this node's write notices, counted once per receiving node.
    notices_sent,
    /// Pages this node, as their home, pushed to nodes holding a copy.
    pages_pushed,
    /// Pages pushed here and installed.
    pushes_installed,
    /// Pages pushed here that no access used before the next release: dropped and declined.
    pushes_declined,
    /// Pushes this node, as their home, sent as a diff of its own writes (a
    /// page another node wrote lately: the diff applies to that writer's
    /// copy too), counted once per receiving node (and in `pages_pushed`).
    pushes_as_diffs,
    /// Pushes this node, as their home, did not send: another node wrote the
    /// page in the same phase, so every receiver would have dropped it.
    pushes_withheld,
    /// Pages this node, as their home, pushed through the release's
    /// all-reduce (at least half the other nodes hold them), once each.
    pushes_gathered,
    /// Copies invalidated by other nodes' write notices (or by a push voided by one).
    invalidations,
    /// Nanoseconds filthreads (and threads) spent waiting for pages.
    wait_ns,
    /// Nanoseconds spent in releases (diffs, notices, waiting for the other nodes).
    release_ns,
    /// DSM messages sent.
    messages_sent,
    /// DSM bytes sent (frames included).
    bytes_sent,
    /// Write views that stored plainly (their stores vectorise; see the `plain` module).
    plain_views,
    /// Write views that stored with relaxed atomics (a phase's first two executions, or footprints that overlap or checked accesses beside them).
    atomic_views,
    /// Page requests that waited for plain-store views of the page to end.
    requests_waited_plain,
    /// Rows (or vector ranges) lent to a closure as a copy rather than as the shared elements (`WriteRows::with_row` in a view that is not plain, or where another path to the row was taken first): each cost two copies of the row.
    rows_lent_by_copy,
    /// Pages this node sent in broadcasts (`broadcast_rows`), as their home or passing them on along the tree, counted once per receiver.
    pages_broadcast,
    /// Broadcast messages received (each is installed, or finds its pages valid here already).
    broadcasts_received,
    /// Broadcast pages installed here (they were not valid here when they came).
    broadcasts_installed,
    /// Broadcasts that came too late to install (this node was in or past the release after them): dropped.
    broadcasts_dropped,
    /// Pages of rows that rode with a reduction at a phase's end (`DsmMatrix::reduce_at_end_with_row`) and were installed here.
    pages_carried,
}

impl DsmCounters {
    /// Sum of several.
    pub fn sum<'a>(all: impl IntoIterator<Item = &'a DsmCounters>) -> DsmCounters {
        let mut t = DsmCounters::default();
        for c in all {
            t.add(c);
        }
        t
    }
    /// What happened between two snapshots: each of these counters less
    /// `before`'s (a window of phases, taken in post-phase code).
    ///
    /// ```
    /// use hyfi_dsm::DsmCounters;
    /// let before = DsmCounters { pages_fetched: 3, ..DsmCounters::default() };
    /// let after = DsmCounters { pages_fetched: 10, ..DsmCounters::default() };
    /// assert_eq!(after.since(&before).pages_fetched, 7);
    /// ```
    pub fn since(&self, before: &DsmCounters) -> DsmCounters {
        self.sub(before)
    }
    pub(crate) fn accumulate(&mut self, o: &DsmCounters) {
        self.add(o)
    }
}

impl fmt::Display for DsmCounters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "read faults {}, write faults {}, pages fetched {} served {} (deferred {}), \
             diffs sent {} ({} B) applied {}, unchanged {}, notices {}, invalidations {}, \
             pushed {} (as diffs {}) installed {} declined {} withheld {} gathered {}, \
             waiting {:.3} ms, releases {:.3} ms, {} messages ({} B), \
             write views plain {} atomic {} (requests waited for plain stores {}, \
             rows lent as copies {}), \
             broadcast sent {} received {} installed {} dropped {}, \
             pages carried by reductions {}",
            self.read_faults,
            self.write_faults,
            self.pages_fetched,
            self.pages_served,
            self.requests_deferred,
            self.diffs_sent,
            self.diff_bytes_sent,
            self.diffs_applied,
            self.pages_unchanged,
            self.notices_sent,
            self.invalidations,
            self.pages_pushed,
            self.pushes_as_diffs,
            self.pushes_installed,
            self.pushes_declined,
            self.pushes_withheld,
            self.pushes_gathered,
            self.wait_ns as f64 / 1e6,
            self.release_ns as f64 / 1e6,
            self.messages_sent,
            self.bytes_sent,
            self.plain_views,
            self.atomic_views,
            self.requests_waited_plain,
            self.rows_lent_by_copy,
            self.pages_broadcast,
            self.broadcasts_received,
            self.broadcasts_installed,
            self.broadcasts_dropped,
            self.pages_carried
        )
    }
}

/// A node's DSM statistics: the total and one entry per program phase
/// index (what was counted from the end of the previous release to the end
/// of this phase's release).
#[derive(Clone, Debug, Default)]
pub struct DsmStats {
    /// This node.
    pub node: usize,
    /// Releases completed (phases ended).
    pub releases: u64,
    /// Everything so far.
    pub total: DsmCounters,
    /// By phase index of the program(s) run (index 0 is the first phase).
    pub per_phase: Vec<DsmCounters>,
    /// What the DSM advised this node, once, on its standard error: a
    /// phase that writes a third or more of its pages homed on other nodes, release after
    /// release (each costs a twin, a diff and a notice), and what to do.
    pub advice: Option<String>,
}

impl fmt::Display for DsmStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "dsm node {}: {} releases; {}",
            self.node, self.releases, self.total
        )?;
        for (k, c) in self.per_phase.iter().enumerate() {
            writeln!(f, "dsm node {} phase {k}: {c}", self.node)?;
        }
        if let Some(a) = &self.advice {
            writeln!(f, "dsm node {} advice: {a}", self.node)?;
        }
        Ok(())
    }
}
