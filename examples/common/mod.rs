//! What the examples share: their command-line plumbing, their inputs, and
//! the checks and report lines that tests and scripts read (not an example
//! itself: cargo builds only `examples/*.rs` and `examples/*/main.rs`).

use hyfi::{Config, Runtime};

/// The runtime options every example takes, flattened into its own `Args`.
#[derive(clap::Args, Debug, Clone)]
pub struct RuntimeArgs {
    /// Nodes: local processes the program starts itself when no launcher
    /// (hyfi-run, mpirun, srun) started it; like HYFI_NODES.
    #[arg(long, value_parser = at_least(1))]
    pub nodes: Option<usize>,
    /// Processors (server threads) per node [default: HYFI_PROCS, else all CPUs].
    #[arg(long, value_parser = at_least(1))]
    pub procs: Option<usize>,
    /// Pin server threads to CPUs [default: HYFI_PIN, else on].
    #[arg(long, overrides_with = "no_pin")]
    pub pin: bool,
    /// Do not pin server threads (allows more processors than CPUs).
    #[arg(long, overrides_with = "pin")]
    pub no_pin: bool,
}

impl RuntimeArgs {
    /// The runtime configuration: the `HYFI_*` variables, overridden by
    /// `--procs` and `--pin/--no-pin`.
    pub fn config(&self) -> Result<Config, hyfi::Error> {
        let mut cfg = Config::from_env()?;
        if let Some(p) = self.procs {
            cfg = cfg.procs(p);
        }
        if self.pin {
            cfg = cfg.pin(true);
        } else if self.no_pin {
            cfg = cfg.pin(false);
        }
        Ok(cfg)
    }
}

impl RuntimeArgs {
    /// Starts this node of the job (or, with `--nodes` and no launcher,
    /// becomes the launcher of the local nodes): [`RuntimeArgs::config`],
    /// changed by `adjust`, then `hyfi::init_nodes`.
    #[allow(dead_code)] // the test files that include an example do not start it
    pub fn start(&self, adjust: impl FnOnce(Config) -> Config) -> Result<Runtime, hyfi::Error> {
        let cfg = adjust(self.config()?);
        hyfi::init_nodes(cfg, self.nodes)
    }
}

/// A clap parser for whole numbers of at least `min`.
#[allow(dead_code)] // not every example has a bounded option of its own
pub fn at_least(min: u64) -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(min..)
}

/// The value, or `program: error` on stderr and the error's exit code
/// ([`hyfi::Error::exit_code`]: 2 for a configuration error, 1 for any other
/// failure, as the README's table says).
#[allow(dead_code)] // not every example uses it
pub fn or_exit<T>(program: &str, r: Result<T, impl Into<Box<dyn std::error::Error>>>) -> T {
    r.unwrap_or_else(|e| {
        let e = e.into();
        eprintln!("{program}: {e}");
        let code = match e.downcast_ref::<hyfi::Error>() {
            Some(e) => e.exit_code(),
            None => match e.downcast::<hyfi::dsm::DsmError>() {
                Ok(e) => hyfi::Error::from(*e).exit_code(),
                Err(_) => 1,
            },
        };
        std::process::exit(code)
    })
}

/// Prints this node's fork-join counters: the runtime's table, and one
/// `fjstats:` line with the figures of HyFi's per-node statistics (filaments
/// executed; steals attempted and succeeded within the node and across
/// nodes; filaments moved; idle time) for scripts and tests to read.
#[allow(dead_code)] // only the fork-join examples print these
pub fn print_fj_stats(rt: &hyfi::Runtime, seconds: f64) {
    let stats = rt.stats();
    let t = stats.total();
    let r = &stats.remote;
    println!();
    print!("{stats}");
    if let Some(traffic) = rt.traffic() {
        println!("traffic of node {}: {traffic}", rt.node());
    }
    println!(
        "fjstats: node={} filaments={} pruned={} local_steals={} local_tries={} remote_steals={} \
         remote_tries={} shm_tries={} resent={} served_by_procs={} latent_steals={} latent_out={} \
         moved_in={} moved_out={} \
         idle_ms={:.1} steal_rtt_us={:.1} time_s={seconds:.4}",
        rt.node(),
        t.filaments,
        t.pruned,
        t.steals,
        t.steal_attempts,
        r.steals,
        r.steal_requests,
        r.requests_through_memory,
        r.requests_resent,
        r.served_by_processors,
        t.steals_latent,
        r.latent_exported,
        r.filaments_in,
        r.filaments_out,
        t.idle_ns as f64 / 1e6,
        r.steal_wait_ns as f64 / 1e3 / r.steal_requests.max(1) as f64
    );
    println!();
}

/// An `n × n` matrix, row-major, with entries in [-1, 1) from a splitmix64
/// stream seeded with `seed` (the inputs of `lu` and `matmul`).
#[allow(dead_code)] // not every example has matrix inputs
pub fn random_matrix(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed;
    (0..n * n)
        .map(|_| {
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            // 53 random bits → [0, 1) → [-1, 1).
            (z >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        })
        .collect()
}

/// `Ok` if `a` and `b` (row-major, `n` columns) hold the same values, bit
/// for bit; otherwise where they first differ: "`what`(i, j) is x against y".
#[allow(dead_code)] // only the grid and matrix examples compare grids
pub fn same_bits(what: &str, a: &[f64], b: &[f64], n: usize) -> Result<(), String> {
    if a.len() != b.len() {
        return Err(format!("{} elements against {}", a.len(), b.len()));
    }
    match a
        .iter()
        .zip(b)
        .position(|(x, y)| x.to_bits() != y.to_bits())
    {
        None => Ok(()),
        Some(k) => Err(format!(
            "{what}({}, {}) is {:e} against {:e}",
            k / n.max(1),
            k % n.max(1),
            a[k],
            b[k]
        )),
    }
}

/// Prints `node R of N (P processors), pid PID`, the first line of the
/// examples that the multi-node tests start: they find each node's process
/// by it.
#[allow(dead_code)] // only the examples those tests run print it
pub fn print_node_line(rt: &Runtime) {
    println!(
        "node {} of {} ({} processors), pid {}",
        rt.node(),
        rt.num_nodes(),
        rt.procs(),
        std::process::id()
    );
}

// ------------------------------------------------------- grid relaxations
//
// `jacobi` and `sor` solve the same problem (a grid with its top edge hot)
// with the same stopping rule, so they share their options, their output
// and its report; `diffusion`, `cg` and `baselines` share the fingerprints.

/// When the sweeps of a relaxation stop: `--iters` and `--eps`.
#[derive(clap::Args, Debug, Clone, Copy)]
#[allow(dead_code)] // only the relaxations stop on a tolerance
pub struct SweepArgs {
    /// Most sweeps to run.
    #[arg(long, default_value_t = 100, value_parser = at_least(1))]
    pub iters: usize,
    /// Stop once no point changes by this much or more in a sweep.
    #[arg(long, default_value_t = 1e-6)]
    pub eps: f64,
}

/// The starting grid of a relaxation: top edge hot (1.0), everything else
/// cold.
#[allow(dead_code)] // only the relaxations start from it
pub fn hot_top_edge(i: usize, _j: usize) -> f64 {
    if i == 0 {
        1.0
    } else {
        0.0
    }
}

/// What a relaxation computed, on hyfi or sequentially.
#[derive(Debug, Clone)]
#[allow(dead_code)] // only the relaxations compute one
pub struct SweepOutput {
    /// Sweeps done.
    pub iters: usize,
    /// Largest change in the last sweep.
    pub maxdiff: f64,
    /// Whether the sweeps stopped because `maxdiff < eps`.
    pub converged: bool,
    /// The final grid, row-major.
    pub grid: Vec<f64>,
    /// Seconds the sweeps took.
    pub secs: f64,
    /// This node's DSM counters (hyfi runs only).
    pub dsm: Option<hyfi::DsmStats>,
}

#[allow(dead_code)] // only the relaxations compute one
impl SweepOutput {
    /// `Ok` if `self` and `other` did the same sweeps and hold the same
    /// grid, bit for bit; otherwise what differs first.
    pub fn check_same(&self, other: &SweepOutput) -> Result<(), String> {
        if self.iters != other.iters {
            return Err(format!("{} sweeps against {}", self.iters, other.iters));
        }
        if self.maxdiff.to_bits() != other.maxdiff.to_bits() {
            return Err(format!(
                "maxdiff {:e} against {:e}",
                self.maxdiff, other.maxdiff
            ));
        }
        let n = (self.grid.len() as f64).sqrt() as usize;
        same_bits("point ", &self.grid, &other.grid, n)
    }

    /// Prints the `hyfi:` and `sequential:` lines of a relaxation's report:
    /// the seconds, sweeps and last maxdiff of `par` and of `seq`.
    pub fn print_beside(par: &SweepOutput, seq: &SweepOutput) {
        println!(
            "hyfi:       {:.4} s, {} sweeps, maxdiff {:.6e}{}",
            par.secs,
            par.iters,
            par.maxdiff,
            if par.converged {
                " (converged)"
            } else {
                " (stopped at --iters)"
            }
        );
        println!(
            "sequential: {:.4} s, {} sweeps, maxdiff {:.6e}",
            seq.secs, seq.iters, seq.maxdiff
        );
    }
}

/// What a time-stepping grid example (`diffusion`, `heat3d`) computed, on
/// hyfi or sequentially.
#[allow(dead_code)] // only the stepping examples compute one
pub struct StepOutput {
    /// The grid after the last step, row after row.
    pub grid: Vec<f64>,
    /// Seconds of the steps alone.
    pub secs: f64,
    /// hyfi's DSM counters over the steps (none for the loop).
    pub dsm: Option<hyfi::DsmStats>,
}

#[allow(dead_code)] // only the stepping examples report one
impl StepOutput {
    /// The rest of a stepping example's report: the `hyfi:` and
    /// `sequential:` lines, hyfi's DSM counters, and the `OK` line if the
    /// grids (rows of `n` points; `unit` names one in a mismatch) are the
    /// same bit for bit, else the difference and exit status 1.
    pub fn report(par: &StepOutput, seq: &StepOutput, steps: usize, n: usize, unit: &str) {
        println!("hyfi:       {:.4} s, {} steps", par.secs, steps);
        println!("sequential: {:.4} s, {} steps", seq.secs, steps);
        if let Some(d) = &par.dsm {
            print!("{d}");
        }
        let check = same_bits(unit, &par.grid, &seq.grid, n)
            .map(|()| fnv_words(par.grid.iter().map(|v| v.to_bits())));
        print_ok_or_exit(check, "MISMATCH");
    }
}

/// The `grid_bits` fingerprint of `jacobi`, `sor` and `baselines jacobi`:
/// FNV-1a over the values' little-endian bytes (as
/// `benches/baselines/common.h` computes it), to compare runs across
/// configurations and with the C baselines.
#[allow(dead_code)] // only the relaxations print it
pub fn fnv_bytes(values: &[f64]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for v in values {
        for b in v.to_bits().to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// The `grid_bits` fingerprint of `diffusion` and `cg` (and
/// `benches/baselines/diffusion.c`), and `perm_hash` of `baselines lu`:
/// FNV over whole 64-bit words, one xor and multiply per word. Not the
/// bytewise [`fnv_bytes`]: each prints the fingerprint its C baseline does.
#[allow(dead_code)] // only some grid examples print it
pub fn fnv_words(words: impl IntoIterator<Item = u64>) -> u64 {
    words.into_iter().fold(0xcbf2_9ce4_8422_2325u64, |h, w| {
        (h ^ w).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The last line of a grid example's report. `check` is the fingerprint of
/// the grid if hyfi's run matched the sequential one bit for bit: then the
/// `OK: … (grid_bits=…)` line that tests and scripts read. Otherwise what
/// differs, after `mismatch`, on stderr, and exit status 1.
#[allow(dead_code)] // only the grid examples end so
pub fn print_ok_or_exit(check: Result<u64, String>, mismatch: &str) {
    match check {
        Ok(bits) => println!(
            "OK: hyfi and sequential results are identical bit for bit (grid_bits={bits:016x})"
        ),
        Err(what) => {
            eprintln!("{mismatch}: {what}");
            std::process::exit(1);
        }
    }
}
