//! Counters a user can print: per processor, accumulated over runs.

use std::fmt;

/// Counters of one processor.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcStats {
    /// Filaments executed: iterative filaments, and fork-join filaments
    /// (each branch of a join counts where it runs, whether the join forked
    /// or was pruned), except the branches inside pruned subtrees.
    pub filaments: u64,
    /// Subtrees run as the pruned copy of a filament
    /// ([`RemoteFn::with_pruned`](crate::RemoteFn::with_pruned)): the plain
    /// recursion, whose joins are plain calls that count nothing.
    pub pruned: u64,
    /// Real forks (pushed on the deque); pruned forks are plain calls and not counted.
    pub forks: u64,
    /// Steal rounds attempted (each visits every other processor once).
    pub steal_attempts: u64,
    /// Jobs stolen from other processors.
    pub steals: u64,
    /// Of [`steals`](Self::steals), those claimed from another processor's
    /// latent joins: the second branch of one of its shallowest pruned
    /// joins, taken while the first branch ran (the largest pieces; see
    /// the fork-join protocol in `hyfi-core`'s `fork/README.md`).
    pub steals_latent: u64,
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
    /// Chunks of iterative phases this processor took from other
    /// processors' pools ([`Config::chunks`](crate::Config::chunks)).
    pub chunks_stolen: u64,
    /// Times the OS took this processor's thread off its CPU while it
    /// could have run on (involuntary context switches, from
    /// `getrusage(RUSAGE_THREAD)` around each command): another thread
    /// wanted the CPU, such as the node's communication thread woken by a
    /// message onto the CPU of a processor that computes, another process
    /// or the hypervisor's scheduling of the vCPU. On a node that owns its
    /// CPUs, a count that grows with the messages says where wake-ups land.
    pub switched_out: u64,
    /// Times the thread gave up its CPU itself (voluntary context
    /// switches: it slept or yielded, waiting for work, a page, a release).
    pub gave_up: u64,
}

impl ProcStats {
    pub(crate) fn add(&mut self, o: &ProcStats) {
        self.filaments += o.filaments;
        self.pruned += o.pruned;
        self.forks += o.forks;
        self.steal_attempts += o.steal_attempts;
        self.steals += o.steals;
        self.steals_latent += o.steals_latent;
        self.suspensions += o.suspensions;
        self.filthreads += o.filthreads;
        self.stacks_mapped += o.stacks_mapped;
        self.idle_ns += o.idle_ns;
        self.phases += o.phases;
        self.chunks_stolen += o.chunks_stolen;
        self.switched_out += o.switched_out;
        self.gave_up += o.gave_up;
    }
}

/// Fork-join across nodes, counted for the whole node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RemoteStats {
    /// Steal requests this node sent to other nodes.
    pub steal_requests: u64,
    /// Of those, requests answered with filaments.
    pub steals: u64,
    /// Filaments received from other nodes (steals and start-up distribution).
    pub filaments_in: u64,
    /// Filaments sent to other nodes (steals and start-up distribution).
    pub filaments_out: u64,
    /// Requests from other nodes answered with filaments.
    pub requests_served: u64,
    /// Requests from other nodes answered with none.
    pub requests_refused: u64,
    /// Nanoseconds from sending a steal request to having installed the
    /// answer, summed over this node's requests (divide by
    /// `steal_requests` for the mean round trip).
    pub steal_wait_ns: u64,
    /// Of `steal_requests`, those made through memory shared with the
    /// other node (a node of this host): the thief writes the donor's
    /// pruning words, and a processor of the donor answers, with no
    /// message to wake anyone.
    pub requests_through_memory: u64,
    /// Of `requests_through_memory`, those also sent as a message: no
    /// processor of the donor answered within
    /// [`DIRECT_WAIT`](crate::steal::DIRECT_WAIT), or none had answered
    /// the last request to that donor (then the message goes at once).
    pub requests_resent: u64,
    /// Of the requests from other nodes answered here
    /// (`requests_served + requests_refused`), those a processor of this
    /// node answered (at a fork, or while it idled) rather than the
    /// communication thread.
    pub served_by_processors: u64,
    /// Of `requests_served`, those answered with a latent join: the second
    /// branch of one of a processor's shallowest pruned `join_remote`s,
    /// claimed while the first branch ran (the largest piece this node had;
    /// see the fork-join protocol in `hyfi-core`'s `fork/README.md`).
    pub latent_exported: u64,
}

impl RemoteStats {
    fn is_zero(&self) -> bool {
        *self == RemoteStats::default()
    }
}

/// Counters of every processor of one node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// The node.
    pub node: usize,
    /// One entry per processor.
    pub procs: Vec<ProcStats>,
    /// Fork-join across nodes.
    pub remote: RemoteStats,
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
            "node {:>2} proc | {:>12} {:>9} {:>9} {:>8} {:>7} {:>8} {:>9} {:>10} {:>7} {:>10} {:>7} {:>7} {:>9} {:>8}",
            self.node,
            "filaments",
            "pruned",
            "forks",
            "steals",
            "latent",
            "tries",
            "suspends",
            "filthreads",
            "stacks",
            "idle ms",
            "phases",
            "chunks",
            "preempted",
            "yielded"
        )?;
        for (p, s) in self.procs.iter().enumerate() {
            writeln!(
                f,
                "        {:>4} | {:>12} {:>9} {:>9} {:>8} {:>7} {:>8} {:>9} {:>10} {:>7} {:>10.2} {:>7} {:>7} {:>9} {:>8}",
                p,
                s.filaments,
                s.pruned,
                s.forks,
                s.steals,
                s.steals_latent,
                s.steal_attempts,
                s.suspensions,
                s.filthreads,
                s.stacks_mapped,
                s.idle_ns as f64 / 1e6,
                s.phases,
                s.chunks_stolen,
                s.switched_out,
                s.gave_up
            )?;
        }
        let r = &self.remote;
        if !r.is_zero() {
            writeln!(
                f,
                "node {:>2} across nodes: steals {} of {} requests (mean round trip {:.1} us; \
                 {} through shared memory, {} of them resent); filaments moved in {} out {}; \
                 requests from other nodes served {} refused {} ({} by processors, {} latent)",
                self.node,
                r.steals,
                r.steal_requests,
                r.steal_wait_ns as f64 / 1e3 / r.steal_requests.max(1) as f64,
                r.requests_through_memory,
                r.requests_resent,
                r.filaments_in,
                r.filaments_out,
                r.requests_served,
                r.requests_refused,
                r.served_by_processors,
                r.latent_exported
            )?;
        }
        Ok(())
    }
}
