//! Counters a user can print: per processor, accumulated over runs.

use std::fmt;

/// Counters of one processor.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcStats {
    /// Iterative filaments executed.
    pub filaments: u64,
    /// Real forks (pushed on the deque); pruned forks are plain calls and not counted.
    pub forks: u64,
    /// Steal rounds attempted (each visits every other processor once).
    pub steal_attempts: u64,
    /// Jobs stolen from other processors.
    pub steals: u64,
    /// Filthread suspensions (a join waiting for a stolen child, a page in flight, ...).
    pub suspensions: u64,
    /// Filthreads started.
    pub filthreads: u64,
    /// Fresh stacks mapped (the rest came from the pool).
    pub stacks_mapped: u64,
    /// Nanoseconds spent idle (no runnable filthread, no work to steal).
    pub idle_ns: u64,
    /// Phases executed.
    pub phases: u64,
}

impl ProcStats {
    pub(crate) fn add(&mut self, o: &ProcStats) {
        self.filaments += o.filaments;
        self.forks += o.forks;
        self.steal_attempts += o.steal_attempts;
        self.steals += o.steals;
        self.suspensions += o.suspensions;
        self.filthreads += o.filthreads;
        self.stacks_mapped += o.stacks_mapped;
        self.idle_ns += o.idle_ns;
        self.phases += o.phases;
    }
}

/// Counters of every processor of one node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// The node.
    pub node: usize,
    /// One entry per processor.
    pub procs: Vec<ProcStats>,
}

impl Stats {
    /// The sum over processors.
    pub fn total(&self) -> ProcStats {
        let mut t = ProcStats::default();
        for p in &self.procs {
            t.add(p);
        }
        t
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "node {:>2} proc | {:>12} {:>9} {:>8} {:>8} {:>9} {:>10} {:>7} {:>10} {:>7}",
            self.node,
            "filaments",
            "forks",
            "steals",
            "tries",
            "suspends",
            "filthreads",
            "stacks",
            "idle ms",
            "phases"
        )?;
        for (p, s) in self.procs.iter().enumerate() {
            writeln!(
                f,
                "        {:>4} | {:>12} {:>9} {:>8} {:>8} {:>9} {:>10} {:>7} {:>10.2} {:>7}",
                p,
                s.filaments,
                s.forks,
                s.steals,
                s.steal_attempts,
                s.suspensions,
                s.filthreads,
                s.stacks_mapped,
                s.idle_ns as f64 / 1e6,
                s.phases
            )?;
        }
        Ok(())
    }
}
