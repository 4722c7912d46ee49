//! Command-line plumbing shared by the examples (not an example itself:
//! cargo builds only `examples/*.rs` and `examples/*/main.rs`).

use hyfi::Config;

/// The runtime options every example takes, flattened into its own `Args`.
#[derive(clap::Args, Debug, Clone)]
pub struct RuntimeArgs {
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

/// A clap parser for whole numbers of at least `min`.
#[allow(dead_code)] // not every example has a bounded option of its own
pub fn at_least(min: u64) -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(min..)
}

/// The value, or `program: error` on stderr and exit status 2 (a runtime or
/// configuration failure, as opposed to a failed check, which exits 1).
#[allow(dead_code)] // not every example uses it
pub fn or_exit<T>(program: &str, r: Result<T, impl std::fmt::Display>) -> T {
    r.unwrap_or_else(|e| {
        eprintln!("{program}: {e}");
        std::process::exit(2)
    })
}
