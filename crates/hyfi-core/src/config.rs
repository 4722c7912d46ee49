//! Runtime configuration, in code and from the environment.
//!
//! | variable          | meaning                                   | default            |
//! |-------------------|-------------------------------------------|--------------------|
//! | `HYFI_PROCS`      | server threads (processors) on this node  | all CPUs available |
//! | `HYFI_PIN`        | pin server thread *p* to the *p*-th CPU   | `1`                |
//! | `HYFI_STACK_SIZE` | filthread stack size (`512K`, `4M`, ...)  | `1M`               |
//! | `HYFI_PRUNE`      | pruning of fork-join filaments            | `1`                |
//! | `HYFI_HOST_STEALS` | steal requests between the nodes of one host through the memory they share ([`Config::host_steals`]) | `1` |
//! | `HYFI_LATENT`     | the shallowest pruned joins list their second branch for thieves ([`Config::latent_joins`]) | `0` |
//! | `HYFI_CHUNKS`     | chunks each pool is cut into, which idle processors of the node take from the back ([`Config::chunks`]) | `8` (`1` on one processor) |
//! | `HYFI_TRACE`      | record a timeline into this file ([`crate::trace`]) | off      |
//! | `HYFI_TRACE_EVENTS` | events a trace keeps per node, at most  | 1048576 (about 56 MiB) |
//!
//! Values in code override nothing: [`Config::from_env`] starts from the
//! defaults and applies the variables that are set; builder calls made after
//! it win.

use crate::error::Error;

/// Smallest filthread stack accepted (bytes).
pub const MIN_STACK_SIZE: usize = 64 * 1024;
/// Largest filthread stack accepted (bytes); stacks are reserved lazily, so
/// only touched pages cost memory.
pub const MAX_STACK_SIZE: usize = 1 << 30;
/// Chunks a pool is cut into on a node of several processors, unless
/// [`Config::chunks`] says otherwise.
pub const DEFAULT_CHUNKS: usize = 8;
/// Most chunks a pool may be cut into.
pub const MAX_CHUNKS: usize = 4096;
/// Default filthread stack size (bytes).
pub const DEFAULT_STACK_SIZE: usize = 1 << 20;

/// How a runtime is set up. Build one with [`Config::new`] or
/// [`Config::from_env`] and the builder methods.
///
/// ```
/// let cfg = hyfi::Config::new().procs(2).pin(false);
/// assert_eq!(cfg.get_procs(), Some(2));
/// ```
#[derive(Clone, Debug)]
pub struct Config {
    procs: Option<usize>,
    procs_source: &'static str,
    pin: bool,
    /// This node's share of the host's CPUs: (local index, local nodes).
    cpu_share: Option<(usize, usize)>,
    stack_size: usize,
    prune: bool,
    host_steals: bool,
    latent_joins: bool,
    chunks: Option<usize>,
    trace: Option<std::path::PathBuf>,
    trace_events: u64,
}

impl Default for Config {
    fn default() -> Self {
        Self::new()
    }
}

impl Config {
    /// Defaults: every CPU available to the process, pinned, 1 MiB filthread
    /// stacks, pruning on.
    pub fn new() -> Self {
        Config {
            procs: None,
            procs_source: "Config::procs",
            pin: true,
            cpu_share: None,
            stack_size: DEFAULT_STACK_SIZE,
            prune: true,
            host_steals: true,
            latent_joins: false,
            chunks: None,
            trace: None,
            trace_events: crate::trace::DEFAULT_CAP,
        }
    }

    /// The defaults, overridden by the `HYFI_*` variables that are set.
    pub fn from_env() -> Result<Self, Error> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Like [`Config::from_env`], reading variables through `get` (for tests
    /// and for launchers that pass settings another way).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, Error> {
        let mut cfg = Config::new();
        if let Some(v) = get("HYFI_PROCS") {
            let n: usize = v.trim().parse().map_err(|_| Error::BadEnv {
                var: "HYFI_PROCS",
                value: v.clone(),
                expected: "a whole number of processors, at least 1",
            })?;
            cfg.procs = Some(n);
            cfg.procs_source = "HYFI_PROCS";
        }
        // A variable that is on or off.
        let flag = |var: &'static str| {
            get(var)
                .map(|v| {
                    parse_bool(&v).ok_or(Error::BadEnv {
                        var,
                        value: v.clone(),
                        expected: "1/0, true/false, yes/no or on/off",
                    })
                })
                .transpose()
        };
        cfg.pin = flag("HYFI_PIN")?.unwrap_or(cfg.pin);
        cfg.prune = flag("HYFI_PRUNE")?.unwrap_or(cfg.prune);
        cfg.host_steals = flag("HYFI_HOST_STEALS")?.unwrap_or(cfg.host_steals);
        cfg.latent_joins = flag("HYFI_LATENT")?.unwrap_or(cfg.latent_joins);
        if let Some(v) = get("HYFI_CHUNKS") {
            cfg.chunks = Some(
                v.trim()
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_CHUNKS).contains(n))
                    .ok_or(Error::BadEnv {
                        var: "HYFI_CHUNKS",
                        value: v.clone(),
                        expected:
                            "a whole number of chunks per pool, from 1 (no balancing) to 4096",
                    })?,
            );
        }
        if let Some(v) = get("HYFI_STACK_SIZE") {
            cfg.stack_size = parse_size(&v).ok_or(Error::BadEnv {
                var: "HYFI_STACK_SIZE",
                value: v.clone(),
                expected: "a size in bytes, optionally with K, M or G (e.g. 512K, 4M)",
            })?;
        }
        if let Some(v) = get("HYFI_TRACE").filter(|v| !v.is_empty()) {
            cfg.trace = Some(v.into());
        }
        if let Some(v) = get("HYFI_TRACE_EVENTS") {
            cfg.trace_events =
                v.trim()
                    .parse()
                    .ok()
                    .filter(|&n: &u64| n >= 1)
                    .ok_or(Error::BadEnv {
                        var: "HYFI_TRACE_EVENTS",
                        value: v.clone(),
                        expected:
                            "a whole number of events, at least 1 (each takes about 56 bytes)",
                    })?;
        }
        Ok(cfg)
    }

    /// Number of processors (server threads) on this node.
    pub fn procs(mut self, n: usize) -> Self {
        self.procs = Some(n);
        self.procs_source = "Config::procs";
        self
    }

    /// Pin server thread *p* to the *p*-th CPU of the process's affinity mask.
    ///
    /// A pinned server thread treats its CPU as its own: when it waits (at a
    /// phase barrier, for work to steal, for the next run) it yields its CPU
    /// for up to 0.5 ms before it sleeps (`sleep::PINNED_POLL`), as
    /// OpenMP's threads spin by default, because a sleeping virtual CPU is
    /// slow to wake. Under a CPU quota that poll counts as use; unpinned
    /// server threads sleep after a short spin.
    pub fn pin(mut self, on: bool) -> Self {
        self.pin = on;
        self
    }

    /// Filthread stack size in bytes (rounded up to whole pages, plus a guard page).
    pub fn stack_size(mut self, bytes: usize) -> Self {
        self.stack_size = bytes;
        self
    }

    /// Pruning of fork-join filaments: once every processor has work, forks
    /// become plain calls. On by default; off makes every fork real.
    pub fn prune(mut self, on: bool) -> Self {
        self.prune = on;
        self
    }

    /// Steal requests between the nodes of one host through the memory
    /// they share, where the link lends some: an idle node writes a busy
    /// node's pruning words, and a processor there answers at its next
    /// fork, with no message to wake a thread (`steal` module docs). On by
    /// default; off sends every request as a message, as between hosts (a
    /// comparison, not a setting to tune: the answer is the same either
    /// way). Nodes that disagree still get every request answered: one
    /// asked through memory by a node that does not look there is sent as
    /// a message after [`DIRECT_WAIT`](crate::steal::DIRECT_WAIT).
    pub fn host_steals(mut self, on: bool) -> Self {
        self.host_steals = on;
        self
    }

    /// Latent joins: each processor's shallowest pruned joins list their
    /// second branch where an idle processor of the node, or another
    /// node's steal request, can claim it while the first branch runs, so
    /// thieves get the largest pieces there are, even while the busy
    /// processor runs a subtree as the pruned copy (the fork-join protocol,
    /// `hyfi-core`'s `fork/README.md`). A listed join costs about 9 ns
    /// more than a pruned one, and two are listed at a time. **Off by
    /// default**: on two CPUs it made an unbalanced search tree without a
    /// pruned copy 3–22 % faster and fib with plain joins 0–8 % slower
    /// (BENCHMARKS.md, "Latent joins"); whether it pays where steals are
    /// many (16 processors) is not yet measured. The results are the same
    /// either way. On one processor of one node nothing is listed.
    pub fn latent_joins(mut self, on: bool) -> Self {
        self.latent_joins = on;
        self
    }

    /// Cuts each pool of an iterative phase into `n` chunks (at most; a
    /// pool of fewer rows gets one per row), fixed by the pool alone.
    /// Each processor runs its own pools' chunks from the front, and a
    /// processor that has none left takes chunks from the back of the
    /// pool with the most left on another processor of the node: a phase
    /// whose filaments cost unequal amounts, or whose processors are
    /// slowed unequally (a shared or virtual CPU), ends when its work
    /// does, not when the slowest static block does. Results stay
    /// bit-identical from run to run however the chunks were shared out:
    /// each chunk folds into its own copy of every reduction, and the
    /// copies are combined in pool and chunk order (see
    /// [`Reduction`](crate::Reduction)). `1` turns the balancing off (one
    /// chunk per pool, as the paper's pools). A phase declared with
    /// [`Program::phase_with`](crate::Program::phase_with) calls its `bind`
    /// once per chunk's segment.
    ///
    /// Default: [`DEFAULT_CHUNKS`] on a node of several processors, `1` on
    /// one (nobody to share with); `HYFI_CHUNKS` sets it.
    ///
    /// # Panics
    /// If `n` is 0 or above [`MAX_CHUNKS`].
    pub fn chunks(mut self, n: usize) -> Self {
        assert!(
            (1..=MAX_CHUNKS).contains(&n),
            "hyfi: Config::chunks takes 1 (no balancing) to {MAX_CHUNKS}, got {n}"
        );
        self.chunks = Some(n);
        self
    }

    /// Chunks per pool on a node of `procs` processors (see
    /// [`Config::chunks`]).
    pub fn get_chunks(&self, procs: usize) -> usize {
        match self.chunks {
            Some(n) => n,
            None if procs > 1 => DEFAULT_CHUNKS,
            None => 1,
        }
    }

    /// Records a timeline of every processor of the node into `path` (see
    /// [`crate::trace`]); `HYFI_TRACE` does the same. On several nodes each
    /// writes `path.node<i>` and hyfi's launchers merge them into `path`.
    ///
    /// ```
    /// let cfg = hyfi::Config::new().trace("jacobi.trace.json");
    /// assert_eq!(cfg.get_trace(), Some(std::path::Path::new("jacobi.trace.json")));
    /// ```
    pub fn trace(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.trace = Some(path.into());
        self
    }

    /// The most events a trace keeps per node (later ones are counted as
    /// dropped); `HYFI_TRACE_EVENTS` sets it too.
    pub fn trace_events(mut self, cap: u64) -> Self {
        self.trace_events = cap.max(1);
        self
    }

    /// The trace's file, if tracing is on.
    pub fn get_trace(&self) -> Option<&std::path::Path> {
        self.trace.as_deref()
    }

    /// The most events a trace keeps per node.
    pub fn get_trace_events(&self) -> u64 {
        self.trace_events
    }

    /// Processors asked for, `None` meaning all available.
    pub fn get_procs(&self) -> Option<usize> {
        self.procs
    }
    /// This node's share of the host's CPUs when several nodes of one job
    /// run on one host: it is local node `index` of `count`. The CPUs
    /// allowed to the process are divided into `count` contiguous blocks and
    /// this node takes block `index`: its server threads are pinned there,
    /// and the default processor count is the block's size. A binding the
    /// launcher already imposed (a mask of fewer CPUs than PID 1 may use:
    /// a container's cpuset, or every online CPU) is respected as it is. The cluster layer sets this from the
    /// launcher (`hyfi-run`, the embedded launcher, Open MPI's local rank).
    ///
    /// ```
    /// let cfg = hyfi::Config::new().cpu_share(1, 2);
    /// assert_eq!(cfg.get_cpu_share(), Some((1, 2)));
    /// ```
    pub fn cpu_share(mut self, index: usize, count: usize) -> Self {
        self.cpu_share = (count > 0 && index < count).then_some((index, count));
        self
    }
    /// This node's share of the host's CPUs, if set: (index, count).
    pub fn get_cpu_share(&self) -> Option<(usize, usize)> {
        self.cpu_share
    }

    /// Whether server threads are pinned.
    pub fn get_pin(&self) -> bool {
        self.pin
    }
    /// Filthread stack size in bytes.
    pub fn get_stack_size(&self) -> usize {
        self.stack_size
    }
    /// Whether pruning is on.
    pub fn get_prune(&self) -> bool {
        self.prune
    }
    /// Whether steal requests go through shared memory where they can
    /// ([`Config::host_steals`]).
    pub fn get_host_steals(&self) -> bool {
        self.host_steals
    }
    /// Whether joins are listed for thieves ([`Config::latent_joins`]).
    pub fn get_latent_joins(&self) -> bool {
        self.latent_joins
    }

    /// The checks that need no machine: at least one processor, a stack
    /// size in range. A launcher runs them before it starts any node (the
    /// CPU count is checked on each node, which knows its share).
    pub fn check(&self) -> Result<(), Error> {
        if self.procs == Some(0) {
            return Err(Error::ZeroProcs {
                source_name: self.procs_source,
            });
        }
        if !(MIN_STACK_SIZE..=MAX_STACK_SIZE).contains(&self.stack_size) {
            return Err(Error::BadStackSize {
                requested: self.stack_size,
                min: MIN_STACK_SIZE,
                max: MAX_STACK_SIZE,
            });
        }
        Ok(())
    }

    /// Checks the configuration against this machine and returns the CPUs the
    /// server threads run on (one per processor; meaningful when pinned).
    pub(crate) fn resolve(&self) -> Result<(usize, Vec<usize>), Error> {
        let cpus = self.node_cpus();
        let procs = self.procs.unwrap_or(cpus.len().max(1));
        if procs == 0 {
            return Err(Error::ZeroProcs {
                source_name: self.procs_source,
            });
        }
        if self.pin && procs > cpus.len() {
            return Err(Error::TooManyProcs {
                requested: procs,
                available: cpus.len(),
            });
        }
        if !(MIN_STACK_SIZE..=MAX_STACK_SIZE).contains(&self.stack_size) {
            return Err(Error::BadStackSize {
                requested: self.stack_size,
                min: MIN_STACK_SIZE,
                max: MAX_STACK_SIZE,
            });
        }
        let chosen = (0..procs).map(|p| cpus[p % cpus.len().max(1)]).collect();
        Ok((procs, chosen))
    }
}

impl Config {
    /// The CPUs of this node: its share of the host's when several nodes
    /// run here, else every CPU allowed to the process.
    pub(crate) fn node_cpus(&self) -> Vec<usize> {
        match self.cpu_share {
            Some((index, count)) => share_of(&allowed_cpus(), online_cpus(), index, count),
            None => allowed_cpus(),
        }
    }

    /// Whether this node's CPUs ([`Config::node_cpus`]) are its own: no
    /// other local node of the job was given them too. Decided once per
    /// process, by the first runtime, before it confines the process to
    /// its share (a later runtime would take that for a launcher's
    /// binding).
    pub(crate) fn node_cpus_exclusive(&self) -> bool {
        static DECIDED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *DECIDED.get_or_init(|| match self.cpu_share {
            Some((_, count)) => share_is_exclusive(&allowed_cpus(), online_cpus(), count),
            None => true,
        })
    }
}

/// Whether the `count` nodes sharing `cpus` (see [`share_of`]) each get
/// CPUs of their own: not when there are more nodes than CPUs (they then
/// share them round-robin). A process its launcher bound keeps that
/// binding, which is the launcher's to make exclusive.
pub(crate) fn share_is_exclusive(cpus: &[usize], online: usize, count: usize) -> bool {
    count <= 1 || cpus.len() < online || count <= cpus.len()
}

/// Block `index` of `count` contiguous blocks of `cpus` (at least one CPU:
/// with more local nodes than CPUs, nodes share them round-robin), unless
/// the launcher already bound the process to fewer CPUs than the `online`
/// ones an unbound process here may use: that binding is this node's share
/// as it is.
pub(crate) fn share_of(cpus: &[usize], online: usize, index: usize, count: usize) -> Vec<usize> {
    if count <= 1 || cpus.is_empty() || cpus.len() < online {
        return cpus.to_vec();
    }
    let b = crate::seg::block(0..cpus.len(), count, index);
    if b.is_empty() {
        vec![cpus[index % cpus.len()]]
    } else {
        cpus[b].to_vec()
    }
}

/// The CPUs a process here may use when no launcher bound it: those allowed
/// to PID 1 (in a container, its cpuset; on a host, every online CPU), or,
/// if that cannot be read, the CPUs online. A process allowed fewer was
/// bound by its launcher.
fn online_cpus() -> usize {
    let from_init = std::fs::read_to_string("/proc/1/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .map(count_cpu_list)
        })
        .filter(|&n| n > 0);
    if let Some(n) = from_init {
        return n;
    }
    // SAFETY: sysconf reads a system value; no memory is passed.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n > 0 {
        n as usize
    } else {
        allowed_cpus().len()
    }
}

/// CPUs in a `Cpus_allowed_list` value such as `0-3,8`.
fn count_cpu_list(v: &str) -> usize {
    v.trim()
        .split(',')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('-') {
            Some((a, b)) => match (a.trim().parse::<usize>(), b.trim().parse::<usize>()) {
                (Ok(a), Ok(b)) if b >= a => b - a + 1,
                _ => 0,
            },
            None => usize::from(p.trim().parse::<usize>().is_ok()),
        })
        .sum()
}

/// CPUs in this process's affinity mask, in increasing order.
pub(crate) fn allowed_cpus() -> Vec<usize> {
    use nix::sched::{sched_getaffinity, CpuSet};
    use nix::unistd::Pid;
    match sched_getaffinity(Pid::from_raw(0)) {
        Ok(set) => (0..CpuSet::count())
            .filter(|&c| set.is_set(c).unwrap_or(false))
            .collect(),
        Err(_) => (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect(),
    }
}

fn parse_bool(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// A size as the `HYFI_*` variables write it: bytes, or with a K, M, G or
/// T suffix (powers of 1024). `None` if it is not one.
///
/// ```
/// assert_eq!(hyfi::layers::parse_size("512K"), Some(512 << 10));
/// assert_eq!(hyfi::layers::parse_size("lots"), None);
/// ```
pub fn parse_size(v: &str) -> Option<usize> {
    let t = v.trim();
    let (num, mult) = match t.char_indices().last()? {
        (i, 'k' | 'K') => (&t[..i], 1usize << 10),
        (i, 'm' | 'M') => (&t[..i], 1 << 20),
        (i, 'g' | 'G') => (&t[..i], 1 << 30),
        (i, 't' | 'T') => (&t[..i], 1 << 40),
        _ => (t, 1),
    };
    num.trim().parse::<usize>().ok()?.checked_mul(mult)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn env_values_parse() {
        let c = Config::from_lookup(env(&[
            ("HYFI_PROCS", "3"),
            ("HYFI_PIN", "off"),
            ("HYFI_STACK_SIZE", "512K"),
            ("HYFI_PRUNE", "0"),
            ("HYFI_HOST_STEALS", "off"),
            ("HYFI_LATENT", "no"),
        ]))
        .unwrap();
        assert_eq!(c.get_procs(), Some(3));
        assert!(!c.get_pin());
        assert_eq!(c.get_stack_size(), 512 * 1024);
        assert!(!c.get_prune());
        assert!(!c.get_host_steals());
        assert!(!c.get_latent_joins());
        assert!(!Config::new().get_latent_joins());
        let c = Config::from_lookup(env(&[("HYFI_LATENT", "1")])).unwrap();
        assert!(c.get_latent_joins());
        // Chunks: the default depends on the processors; the variable wins.
        assert_eq!((c.get_chunks(1), c.get_chunks(4)), (1, DEFAULT_CHUNKS));
        let c = Config::from_lookup(env(&[("HYFI_CHUNKS", "3")])).unwrap();
        assert_eq!((c.get_chunks(1), c.get_chunks(4)), (3, 3));
        for bad in ["0", "x", "4097"] {
            let e = Config::from_lookup(env(&[("HYFI_CHUNKS", bad)])).unwrap_err();
            assert!(e.to_string().contains("HYFI_CHUNKS"), "{e}");
        }
    }

    #[test]
    fn bad_env_values_name_the_variable() {
        let e = Config::from_lookup(env(&[("HYFI_PROCS", "two")])).unwrap_err();
        assert!(e.to_string().contains("HYFI_PROCS=\"two\""), "{e}");
        let e = Config::from_lookup(env(&[("HYFI_PIN", "maybe")])).unwrap_err();
        assert!(e.to_string().contains("HYFI_PIN"), "{e}");
        let e = Config::from_lookup(env(&[("HYFI_STACK_SIZE", "12Q")])).unwrap_err();
        assert!(e.to_string().contains("HYFI_STACK_SIZE"), "{e}");
    }

    #[test]
    fn zero_and_too_many_procs_are_errors() {
        let e = Config::from_lookup(env(&[("HYFI_PROCS", "0")]))
            .unwrap()
            .resolve()
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::ZeroProcs {
                    source_name: "HYFI_PROCS"
                }
            ),
            "{e}"
        );
        let many = allowed_cpus().len() + 1;
        let e = Config::new().procs(many).pin(true).resolve().unwrap_err();
        assert!(e.to_string().contains("HYFI_PIN=0"), "{e}");
        assert!(Config::new().procs(many).pin(false).resolve().is_ok());
    }

    #[test]
    fn stack_size_bounds() {
        let e = Config::new().stack_size(1000).resolve().unwrap_err();
        assert!(e.to_string().contains("HYFI_STACK_SIZE"), "{e}");
    }
}

#[cfg(test)]
mod share_tests {
    use super::share_of;

    #[test]
    fn local_nodes_get_disjoint_contiguous_blocks_covering_the_cpus() {
        let cpus: Vec<usize> = (0..8).collect();
        for count in 1..=8 {
            let mut all = Vec::new();
            for i in 0..count {
                let s = share_of(&cpus, 8, i, count);
                assert!(!s.is_empty());
                assert!(s.windows(2).all(|w| w[1] == w[0] + 1), "contiguous: {s:?}");
                all.extend(s);
            }
            assert_eq!(all, cpus, "{count} local nodes");
        }
        // More nodes than CPUs: one CPU each, shared round-robin.
        assert_eq!(share_of(&[0, 1], 2, 3, 4), vec![1]);
    }

    #[test]
    fn shares_are_exclusive_only_while_every_node_has_a_cpu_of_its_own() {
        use super::share_is_exclusive;
        let cpus: Vec<usize> = (0..8).collect();
        assert!(share_is_exclusive(&cpus, 8, 1));
        assert!(share_is_exclusive(&cpus, 8, 8));
        assert!(!share_is_exclusive(&cpus, 8, 9));
        assert!(!share_is_exclusive(&[0, 1], 2, 4));
        // Bound by a launcher: its binding, exclusive as far as hyfi knows.
        assert!(share_is_exclusive(&[4, 5], 8, 16));
    }

    #[test]
    fn cpu_lists_are_counted() {
        assert_eq!(super::count_cpu_list("0-3,8\n"), 5);
        assert_eq!(super::count_cpu_list("1"), 1);
        assert_eq!(super::count_cpu_list("junk"), 0);
    }

    #[test]
    fn a_launcher_binding_is_respected() {
        // The launcher bound this process to CPUs 4-5 of 8: that is its share.
        assert_eq!(share_of(&[4, 5], 8, 1, 4), vec![4, 5]);
        assert_eq!(share_of(&[0, 1, 2, 3], 4, 0, 1), vec![0, 1, 2, 3]);
    }
}
