//! Command-line plumbing shared by the examples (not an example itself:
//! cargo builds only `examples/*.rs` and `examples/*/main.rs`).

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
         remote_tries={} moved_in={} moved_out={} idle_ms={:.1} steal_rtt_us={:.1} time_s={seconds:.4}",
        rt.node(),
        t.filaments,
        t.pruned,
        t.steals,
        t.steal_attempts,
        r.steals,
        r.steal_requests,
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
