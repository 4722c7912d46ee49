//! What a trace tells without a viewer: per node, where the processors'
//! time went, and how much of the time pages were in flight the
//! processors spent computing other pools (the paper's Table 3, measured).

use std::fmt::Write as _;
use std::path::Path;

use super::{Event, Kind, OTHER_TID};

/// One node's time and counts, from its events.
///
/// Times are sums over the node's processors (processor-seconds).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// The node.
    pub node: usize,
    /// Processors that recorded events.
    pub procs: u64,
    /// From the node's first event to its last (ns).
    pub span_ns: u64,
    /// Filthreads running: the segments (ns).
    pub compute_ns: u64,
    /// Filthreads waiting for pages (ns, summed per wait: four pools
    /// waiting at once count four times).
    pub page_wait_ns: u64,
    /// Of `page_wait_ns`, the time the waiting filthread's processor spent
    /// running other filthreads (ns): communication hidden by computation.
    /// The waiting filthread's own run before it suspends and after it is
    /// woken does not count.
    pub overlap_ns: u64,
    /// Processors waiting at phase ends: for each other, in the release
    /// or the link's barrier (ns).
    pub sync_ns: u64,
    /// Processors with nothing to run (ns).
    pub idle_ns: u64,
    /// Phases run, summed over processors (as `ProcStats::phases`).
    pub phases: u64,
    /// Jobs stolen within the node (as `ProcStats::steals`).
    pub steals: u64,
    /// Steal requests to other nodes answered with filaments (as
    /// `RemoteStats::steals`).
    pub remote_steals: u64,
    /// Filaments those brought.
    pub remote_filaments: u64,
    /// Pages that arrived from their homes (as `DsmCounters::pages_fetched`).
    pub pages_fetched: u64,
    /// Messages sent, and their bytes.
    pub sent: u64,
    /// Bytes sent.
    pub sent_bytes: u64,
    /// Messages received.
    pub received: u64,
    /// Events kept.
    pub events: u64,
    /// Events dropped at the cap.
    pub dropped: u64,
}

macro_rules! fields {
    ($m:ident) => {
        $m!(
            node,
            procs,
            span_ns,
            compute_ns,
            page_wait_ns,
            overlap_ns,
            sync_ns,
            idle_ns,
            phases,
            steals,
            remote_steals,
            remote_filaments,
            pages_fetched,
            sent,
            sent_bytes,
            received,
            events,
            dropped
        )
    };
}

impl Summary {
    /// Computes node `node`'s summary from its tracks.
    pub(super) fn of(node: usize, tracks: &[(u32, &str, &[Event])], dropped: u64) -> Summary {
        let mut s = Summary {
            node,
            dropped,
            ..Summary::default()
        };
        let (mut first, mut last) = (u64::MAX, 0u64);
        let mut procs = std::collections::BTreeSet::new();
        // Segments per processor, for the overlap.
        let mut segs: std::collections::BTreeMap<u32, Vec<(u64, u64, u64)>> = Default::default();
        let mut waits: Vec<(u32, u64, u64, u64)> = Vec::new();
        for &(tid, _, events) in tracks {
            let on_proc = tid < OTHER_TID;
            for e in events {
                s.events += 1;
                first = first.min(e.t);
                last = last.max(e.t + e.dur);
                let a = e.args;
                match e.kind {
                    Kind::Segment if on_proc => {
                        procs.insert(tid);
                        s.compute_ns += e.dur;
                        segs.entry(tid).or_default().push((e.t, e.t + e.dur, a[2]));
                    }
                    Kind::PageWait if on_proc => {
                        s.page_wait_ns += e.dur;
                        waits.push((tid, e.t, e.t + e.dur, a[3]));
                    }
                    Kind::Barrier | Kind::Release if on_proc => s.sync_ns += e.dur,
                    Kind::Idle if on_proc => s.idle_ns += e.dur,
                    Kind::Phase if on_proc => {
                        procs.insert(tid);
                        s.phases += 1;
                    }
                    Kind::Steal => s.steals += 1,
                    Kind::RemoteSteal => {
                        // Answered with filaments, as `RemoteStats::steals`.
                        s.remote_steals += u64::from(a[1] > 0);
                        s.remote_filaments += a[1];
                    }
                    Kind::PagesIn => s.pages_fetched += a[1],
                    Kind::Send => {
                        s.sent += 1;
                        s.sent_bytes += a[2];
                    }
                    Kind::Recv => s.received += 1,
                    _ => {}
                }
            }
        }
        s.procs = procs.len() as u64;
        s.span_ns = last.saturating_sub(first.min(last));
        for v in segs.values_mut() {
            v.sort_unstable();
        }
        for (tid, a, b, waiter) in waits {
            let Some(v) = segs.get(&tid) else { continue };
            // Segments on one processor do not overlap each other: those
            // that end after `a` start at or after the first one that does.
            let from = v.partition_point(|&(_, end, _)| end <= a);
            for &(x, y, ft) in &v[from..] {
                if x >= b {
                    break;
                }
                if ft != waiter {
                    s.overlap_ns += y.min(b).saturating_sub(x.max(a));
                }
            }
        }
        s
    }

    /// `key=value` pairs, as a node's file and the merged file keep it.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        macro_rules! enc {
            ($($f:ident),*) => { $( let _ = write!(out, "{}={} ", stringify!($f), self.$f); )* };
        }
        fields!(enc);
        out.pop();
        out
    }

    /// Reads what [`Summary::encode`] wrote; `None` if it is not that.
    pub fn decode(s: &str) -> Option<Summary> {
        let mut out = Summary::default();
        let mut seen = 0;
        for kv in s.split(' ') {
            let (k, v) = kv.split_once('=')?;
            let v: u64 = v.parse().ok()?;
            macro_rules! dec {
                ($($f:ident),*) => {
                    match k {
                        $( stringify!($f) => { out.$f = v as _; seen += 1; } )*
                        _ => {}
                    }
                };
            }
            fields!(dec);
        }
        (seen > 0).then_some(out)
    }

    /// The share of page-wait time that other pools' computation covered.
    pub fn overlap(&self) -> f64 {
        if self.page_wait_ns == 0 {
            0.0
        } else {
            self.overlap_ns as f64 / self.page_wait_ns as f64
        }
    }
}

/// The summary table a traced run prints at its end.
pub(super) fn table(path: &Path, all: &[Summary]) -> String {
    let mut out = String::new();
    let events: u64 = all.iter().map(|s| s.events).sum();
    let dropped: u64 = all.iter().map(|s| s.dropped).sum();
    let bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let span = all.iter().map(|s| s.span_ns).max().unwrap_or(0) as f64 / 1e9;
    let _ = writeln!(
        out,
        "hyfi trace: {} ({} node{}, {events} events, {:.1} MB, {:.1} MB per second of run){}",
        path.display(),
        all.len(),
        if all.len() == 1 { "" } else { "s" },
        bytes as f64 / 1e6,
        if span > 0.0 {
            bytes as f64 / 1e6 / span
        } else {
            0.0
        },
        if dropped > 0 {
            format!(
                "; {dropped} events DROPPED at the cap (HYFI_TRACE_EVENTS): the timeline ends early"
            )
        } else {
            String::new()
        }
    );
    let _ = writeln!(
        out,
        "hyfi trace: node procs |  compute s  page wait s (hidden)  barrier/release s   idle s | phases steals remote pages in"
    );
    for s in all {
        let sec = |ns: u64| ns as f64 / 1e9;
        let _ = writeln!(
            out,
            "hyfi trace: {:>4} {:>5} | {:>10.3} {:>12.3} ({:>4.0}%) {:>18.3} {:>8.3} | {:>6} {:>6} {:>6} {:>8}",
            s.node,
            s.procs,
            sec(s.compute_ns),
            sec(s.page_wait_ns),
            s.overlap() * 100.0,
            sec(s.sync_ns),
            sec(s.idle_ns),
            s.phases,
            s.steals,
            s.remote_steals,
            s.pages_fetched
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: Kind, t: u64, dur: u64, args: [u64; 4]) -> Event {
        Event { t, dur, args, kind }
    }

    #[test]
    fn overlap_is_the_computation_inside_page_waits() {
        // Processor 0: pool 0 (filthread 1) runs 0..12, waiting for pages
        // from 10 (when it asked) to 50; pool 1 (filthread 2) runs 12..30
        // and 40..48 meanwhile, pool 0 again from 48: 18 + 8 of the 40 ns
        // hidden (its own run at both ends does not count).
        let p0 = [
            ev(Kind::Segment, 0, 12, [0, 5, 1, 2]),
            ev(Kind::PageWait, 10, 40, [0, 3, 1 | 1 << 32, 1]),
            ev(Kind::Segment, 12, 18, [1, 4, 2, 2]),
            ev(Kind::Segment, 40, 8, [1, 4, 2, 1]),
            ev(Kind::Segment, 48, 17, [0, 5, 1, 1]),
            ev(Kind::Phase, 0, 70, [0, 0, 0, 0]),
            ev(Kind::Barrier, 65, 5, [0, 0, 0, 0]),
        ];
        // The communication thread: pages in, messages.
        let comm = [
            ev(Kind::PagesIn, 49, 0, [1, 3, 0, 0]),
            ev(Kind::Recv, 49, 0, [1, 1, 4096, 0]),
            ev(Kind::Send, 11, 0, [1, 0, 40, 0]),
        ];
        let tracks = vec![
            (0, "processor 0", &p0[..]),
            (OTHER_TID, "hyfi-comm", &comm[..]),
        ];
        let s = Summary::of(3, &tracks, 7);
        assert_eq!(s.node, 3);
        assert_eq!(s.procs, 1);
        assert_eq!(s.compute_ns, 12 + 18 + 8 + 17);
        assert_eq!(s.page_wait_ns, 40);
        assert_eq!(s.overlap_ns, 18 + 8);
        assert_eq!(s.sync_ns, 5);
        assert_eq!(s.phases, 1);
        assert_eq!(s.pages_fetched, 3);
        assert_eq!((s.sent, s.sent_bytes, s.received), (1, 40, 1));
        assert_eq!((s.events, s.dropped), (10, 7));
        assert_eq!(s.span_ns, 70);
        assert!((s.overlap() - 0.65).abs() < 1e-12);
    }

    #[test]
    fn a_summary_round_trips_through_its_text() {
        let s = Summary {
            node: 2,
            procs: 4,
            compute_ns: 123,
            overlap_ns: 5,
            dropped: 9,
            ..Summary::default()
        };
        assert_eq!(Summary::decode(&s.encode()), Some(s));
        assert_eq!(Summary::decode("not a summary"), None);
    }
}
