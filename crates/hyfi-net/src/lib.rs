//! # hyfi-net: nodes
//!
//! Turns one node into N (paper §3.2, §3.4). What every job needs, whatever
//! carries its messages:
//!
//! * [`bootstrap`]: who am I, how many are we, where do we meet, from the
//!   launcher's environment (hyfi's own, `mpirun`, `srun`), and the job's
//!   secret;
//! * [`launch`] and the `hyfi-run` binary: hyfi's own launcher of local
//!   nodes, which supervises them and names the job's first failure;
//! * [`cause`]: that first cause, on which the nodes and the launcher
//!   agree, and the exit codes; [`FAILURE_GRACE`], how long a failed node
//!   waits for its program before it ends itself;
//! * [`signals`]: the signal-handling thread (abort the job, dump
//!   counters);
//! * [`init`] and friends, which read the settings ([`check_env`]) and
//!   pick the transport ([`Transport`]).
//!
//! And the transports, each a module that implements hyfi-core's node seam
//! ([`hyfi_core::NodeLink`], [`hyfi_core::link`]: services, priority
//! classes, typed counters, the SPMD step checks, barrier and reduction),
//! over which fork-join across nodes ([`hyfi_core::steal`]) and the shared
//! memory (hyfi-dsm) talk without knowing which one runs:
//!
//! * [`tcp`]: hyfi's own, a full mesh of TCP connections opened with an
//!   authenticated handshake and a communication thread per node
//!   ([`Cluster`]);
//! * `mpi` (the `mpi` cargo feature): MPI point-to-point, under `mpirun` or
//!   `srun` (see [below](#mpi)).
//!
//! ## MPI
//!
//! Built with the `mpi` feature (it needs an MPI library and libclang),
//! `hyfi_net::mpi` carries a job over MPI point-to-point, so that whatever
//! the site's MPI drives (shared memory, InfiniBand, RoCE) carries it; it
//! is the default under an MPI launcher in such a build
//! (`HYFI_TRANSPORT`, see [`Transport`]).
//!
//! A program calls [`init`] first thing in `main`; the same binary then runs
//! on one node, on N local nodes (`HYFI_NODES=N`, or `hyfi-run -n N`), or
//! under `mpirun` / `srun`.

#![warn(missing_docs)]

use hyfi_core::layer::RuntimeExt;
use std::time::Duration;

use hyfi_core::{Config, Runtime};

pub mod bootstrap;
pub mod cause;
mod error;
pub mod launch;
#[cfg(feature = "mpi")]
pub mod mpi;
mod panics;
pub mod signals;
pub mod tcp;

pub use cause::FAILURE_GRACE;
pub use error::NetError;
pub use tcp::{Cluster, Report};

/// Default limit on how long setup waits for the other nodes (`HYFI_TIMEOUT`
/// overrides it, in seconds).
pub const DEFAULT_SETUP_TIMEOUT: Duration = Duration::from_secs(60);

/// Starts this node's part of the job, configured from the environment
/// (see [`init_with`]).
pub fn init() -> Result<Runtime, NetError> {
    init_with(Config::from_env()?)
}

/// Starts this node's part of the job with `cfg` for its processors:
///
/// * no launcher and `HYFI_NODES` unset or 1: a one-node runtime;
/// * `HYFI_NODES=N > 1` and no launcher: this process becomes the launcher of
///   N local nodes running the same program, and exits with their status
///   (it does not return);
/// * started by hyfi's launcher, `mpirun` or `srun`: blocks the asynchronous
///   signals (call `init` before starting threads of your own), opens the
///   mesh, starts the signal-handling thread and returns a runtime whose
///   barriers and reductions span every node.
pub fn init_with(cfg: Config) -> Result<Runtime, NetError> {
    init_nodes(cfg, None)
}

/// Like [`init_with`], with a node count from the program's command line
/// (a `--nodes N` option): with no launcher around it acts as `HYFI_NODES=N`;
/// under a launcher it must agree with the launcher's node count.
pub fn init_nodes(cfg: Config, nodes: Option<usize>) -> Result<Runtime, NetError> {
    if Transport::from_env()? == Transport::Mpi {
        return mpi_member(cfg, nodes);
    }
    let detected = match (bootstrap::detect_env()?, nodes) {
        (bootstrap::Detected::Single | bootstrap::Detected::LaunchLocal { .. }, Some(n))
            if n > 1 =>
        {
            bootstrap::Detected::LaunchLocal { nodes: n }
        }
        (bootstrap::Detected::LaunchLocal { .. }, Some(_)) => bootstrap::Detected::Single,
        (bootstrap::Detected::Member(spec), Some(n)) if n != spec.nodes => {
            return Err(NetError::BadEnv {
                var: "--nodes",
                value: n.to_string(),
                expected: "the node count the launcher started (or no --nodes under a launcher)",
            })
        }
        (d, _) => d,
    };
    match detected {
        bootstrap::Detected::Single => {
            if nodes.is_none() && names_nodes(std::env::args().skip(1)) {
                // A user who ran `./program --nodes 2` and timed it as two
                // nodes would be measuring one: say so once.
                eprintln!(
                    "hyfi: the command line has --nodes, which hyfi::init does not read: this \
                     runs one node; set HYFI_NODES=N to start N local nodes, or parse the \
                     option and pass the count to hyfi::init_nodes (as the examples do)"
                );
            }
            Ok(Runtime::new(cfg)?)
        }
        bootstrap::Detected::LaunchLocal { nodes } => {
            // The program's own settings too, before any node starts.
            cfg.check()?;
            launch::launch_self(nodes)
        }
        bootstrap::Detected::Member(spec) => {
            cause::open_report_pipe();
            if cause::has_launcher() {
                // The launcher merges the nodes' traces into one file.
                hyfi_core::trace::on_written(cause::report_trace);
            }
            let rank = spec.rank;
            member(cfg, spec).inspect_err(|e| {
                cause::report(&cause::Cause::new(rank, e.cause_kind(), e.to_string()))
            })
        }
    }
}

/// Whether a program's arguments hold a `--nodes` option (`--nodes N` or
/// `--nodes=N`), which only [`init_nodes`]' caller can have read.
fn names_nodes(mut args: impl Iterator<Item = String>) -> bool {
    args.any(|a| a == "--nodes" || a.starts_with("--nodes="))
}

/// Starts node `spec.rank` of a job.
fn member(cfg: Config, spec: bootstrap::JobSpec) -> Result<Runtime, NetError> {
    {
        {
            let cfg = match bootstrap::local_share()? {
                Some((index, count)) if cfg.get_cpu_share().is_none() => {
                    cfg.cpu_share(index, count)
                }
                _ => cfg,
            };
            signals::block_async_signals()?;
            let cluster = Cluster::connect(&spec, setup_timeout()?)?;
            cluster.handle_signals()?;
            let rt = Runtime::with_link(cfg, cluster.clone())?;
            cluster.set_runtime_stats(rt.stats_handle());
            hyfi_core::steal::install(&rt)?;
            Ok(rt)
        }
    }
}

/// How a job's nodes talk to each other: `HYFI_TRANSPORT`.
///
/// * `tcp`: hyfi's own transport, over sockets (hyfi-net's [`Cluster`]);
///   works under every launcher, hyfi's own included.
/// * `mpi`: over MPI point-to-point ([`mpi`](crate#mpi), with the `mpi`
///   cargo feature), for a job started by `mpirun` or `srun`: whatever the
///   site's MPI drives (shared memory, InfiniBand, RoCE, ...) carries it.
///
/// The default is `mpi` when the feature is built in *and* an MPI launcher
/// started the process (Open MPI's, PMI's or PMIx's variables are set):
/// whoever built the program with MPI and launched it with `mpirun` wants
/// MPI's fabric, and an MPI launcher's processes may not reach each other
/// over TCP at all (a cluster's compute network is often not IP). It is
/// `tcp` otherwise: hyfi's own launcher (`--nodes`, `HYFI_NODES`,
/// `hyfi-run`) starts no MPI job, and the default build carries no MPI.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// Sockets.
    Tcp,
    /// MPI point-to-point.
    Mpi,
}

impl Transport {
    /// The transport `HYFI_TRANSPORT` names, or the default (see the type's
    /// docs); an error for any other value, or for `mpi` in a build without
    /// the feature.
    pub fn from_env() -> Result<Transport, NetError> {
        let Ok(v) = std::env::var("HYFI_TRANSPORT") else {
            return Ok(if cfg!(feature = "mpi") && under_mpi_launcher() {
                Transport::Mpi
            } else {
                Transport::Tcp
            });
        };
        match v.trim() {
            "tcp" => Ok(Transport::Tcp),
            "mpi" if cfg!(feature = "mpi") => Ok(Transport::Mpi),
            "mpi" => Err(NetError::BadEnv {
                var: "HYFI_TRANSPORT",
                value: v,
                expected: "tcp: this program was built without hyfi's `mpi` feature (build \
                           it with `--features mpi` to run over MPI)",
            }),
            _ => Err(NetError::BadEnv {
                var: "HYFI_TRANSPORT",
                value: v,
                expected: "tcp or mpi",
            }),
        }
    }
}

/// Whether an MPI launcher (Open MPI's `mpirun`, a PMI or PMIx launcher
/// such as MPICH's hydra or `srun --mpi=pmix`) started this process.
fn under_mpi_launcher() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
}

/// Starts this node's part of a job over MPI.
#[cfg(feature = "mpi")]
fn mpi_member(cfg: Config, nodes: Option<usize>) -> Result<Runtime, NetError> {
    if !under_mpi_launcher() {
        return Err(NetError::BadEnv {
            var: "HYFI_TRANSPORT",
            value: "mpi".into(),
            expected: "tcp outside an MPI launcher: start the program with `mpirun -np N` \
                       (or `srun --mpi=pmix`) to run it over MPI",
        });
    }
    cfg.check()?;
    let cfg = match bootstrap::local_share()? {
        Some((index, count)) if cfg.get_cpu_share().is_none() => cfg.cpu_share(index, count),
        _ => cfg,
    };
    signals::block_async_signals()?;
    let link = mpi::MpiLink::start(nodes, heartbeat()?)?;
    link.handle_signals()?;
    let rt = Runtime::with_link(cfg, link.clone())?;
    link.set_runtime_stats(rt.stats_handle());
    hyfi_core::steal::install(&rt)?;
    Ok(rt)
}

#[cfg(not(feature = "mpi"))]
fn mpi_member(_: Config, _: Option<usize>) -> Result<Runtime, NetError> {
    unreachable!("Transport::from_env refuses mpi without the feature")
}

/// Checks every setting of this layer and the runtime's that a node reads
/// (`HYFI_PROCS`, `HYFI_PIN`, `HYFI_PRUNE`, `HYFI_STACK_SIZE`,
/// `HYFI_TIMEOUT`, `HYFI_HEARTBEAT`, `HYFI_PROGRESS`): the
/// launchers call it before they start any node, so that a bad value is one
/// error, exit code 2, not one per node.
pub fn check_env() -> Result<(), NetError> {
    Config::from_env()?.check()?;
    Transport::from_env()?;
    heartbeat()?;
    setup_timeout()?;
    const PROGRESS: [&str; 9] = ["auto", "off", "0", "no", "force", "on", "1", "yes", "lines"];
    if let Ok(v) = std::env::var(hyfi_core::progress::ENV) {
        if !PROGRESS.contains(&v.trim()) {
            return Err(NetError::BadEnv {
                var: hyfi_core::progress::ENV,
                value: v,
                expected: "auto, off, force or lines",
            });
        }
    }
    Ok(())
}

/// Default limit on how long a peer may send nothing at all before it is
/// declared lost (`HYFI_HEARTBEAT` overrides it, in seconds). Every link
/// carries a heartbeat at a quarter of it, from the communication thread,
/// whatever the program does; so only a peer that is hung, stopped or cut
/// off goes silent that long.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(5);

/// The heartbeat limit: `HYFI_HEARTBEAT` seconds, or [`DEFAULT_HEARTBEAT`].
pub fn heartbeat() -> Result<Duration, NetError> {
    match std::env::var("HYFI_HEARTBEAT") {
        Err(_) => Ok(DEFAULT_HEARTBEAT),
        Ok(v) => v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s >= 0.1 && *s <= 86_400.0)
            .map(Duration::from_secs_f64)
            .ok_or(NetError::BadEnv {
                var: "HYFI_HEARTBEAT",
                value: v,
                expected: "a number of seconds from 0.1 to 86400",
            }),
    }
}

/// The setup timeout: `HYFI_TIMEOUT` seconds, or [`DEFAULT_SETUP_TIMEOUT`].
pub fn setup_timeout() -> Result<Duration, NetError> {
    match std::env::var("HYFI_TIMEOUT") {
        Err(_) => Ok(DEFAULT_SETUP_TIMEOUT),
        Ok(v) => v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s >= 0.1 && *s <= 86_400.0)
            .map(Duration::from_secs_f64)
            .ok_or(NetError::BadEnv {
                var: "HYFI_TIMEOUT",
                value: v,
                expected: "a number of seconds from 0.1 to 86400",
            }),
    }
}

/// Nanoseconds since the first call in this process: a clock an atomic can
/// hold, for the transports' "when did a thread last move or poll" stamps.
pub(crate) fn since_start() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
}

#[cfg(test)]
mod names_nodes_tests {
    use super::names_nodes;

    fn args(a: &[&str]) -> impl Iterator<Item = String> {
        a.iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .into_iter()
    }

    #[test]
    fn a_nodes_option_is_seen_in_either_spelling_and_nothing_else_is() {
        assert!(names_nodes(args(&["--nodes", "2"])));
        assert!(names_nodes(args(&["--n", "64", "--nodes=4"])));
        assert!(!names_nodes(args(&["--n", "64", "--procs", "2"])));
        assert!(!names_nodes(args(&["--nodes-file", "x", "nodes"])));
        assert!(!names_nodes(args(&[])));
    }
}
