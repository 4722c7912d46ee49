//! Bootstrap: who am I, how many are we, and where do we meet.
//!
//! [`detect`] reads the environment the launcher left behind and answers with
//! a [`Detected`]. It is a pure function over a variable lookup, so every rule
//! below is unit-tested without touching the real environment; [`detect_env`]
//! runs it over `std::env::var`. The first rule that applies wins:
//!
//! 1. **hyfi's own launcher** (the embedded one or `hyfi-run`): `HYFI_RANK` is
//!    set. `HYFI_NODES` (≥ 1, greater than the rank) is required, and so is a
//!    rendezvous: `HYFI_COORD=host:port` ([`Rendezvous::Coord`]) or else
//!    `HYFI_RENDEZVOUS=/path` ([`Rendezvous::File`]).
//! 2. **Open MPI** (`mpirun`): `OMPI_COMM_WORLD_RANK` and
//!    `OMPI_COMM_WORLD_SIZE`. The rendezvous is `HYFI_COORD` or
//!    `HYFI_RENDEZVOUS` if set (pass them with `mpirun -x`); otherwise, when
//!    every rank runs on this host (`OMPI_COMM_WORLD_LOCAL_SIZE` equals the
//!    size), a file `$TMPDIR/hyfi-<uid>/hyfi-<jobkey>.addr` (`/tmp` if
//!    `TMPDIR` is unset; the directory is private to the user, see
//!    [`crate::tcp::rendezvous`]), where the job key is `PMIX_NAMESPACE` or else
//!    `OMPI_MCA_ess_base_jobid`.
//!    Ranks spread over several hosts with neither variable set cannot meet:
//!    [`NetError::NoRendezvous`] says what to set.
//! 3. **PMI** (MPICH's hydra and friends): `PMI_RANK` and `PMI_SIZE`. As for
//!    Open MPI, with job key `PMI_JOBID` or else `PMIX_NAMESPACE`; the
//!    temporary file is used only when a local-size variable (`PMI_LOCAL_SIZE`,
//!    or hydra's `MPI_LOCALNRANKS`) says every rank is on this host.
//! 4. **Slurm** (`srun`): `SLURM_PROCID` and `SLURM_NTASKS`. The rendezvous is
//!    `HYFI_COORD` or `HYFI_RENDEZVOUS` if set; otherwise node 0 listens on the
//!    first host of `SLURM_STEP_NODELIST` (else `SLURM_JOB_NODELIST`), at port
//!    `20000 + hash(SLURM_JOB_ID, SLURM_STEP_ID) % 40000`, which every task of
//!    the step computes alike and two steps rarely share.
//! 5. **No launcher**: `HYFI_NODES=n` with n > 1 asks for n nodes started as
//!    local processes ([`Detected::LaunchLocal`], see [`crate::launch`]);
//!    `HYFI_NODES` unset or 1 is a one-node run ([`Detected::Single`]).
//!
//! In every multi-node case, `HYFI_JOB` (a decimal `u64`) overrides the job id,
//! which is otherwise a hash of the launcher's job key (or, failing one, of the
//! rendezvous), and `HYFI_TOKEN` (32 hex digits) hands out the job's secret.
//! Without `HYFI_TOKEN`, node 0 makes a random token and leaves it in a file
//! only this user can read ([`crate::tcp::rendezvous`]), so a job without one
//! works only when every node can read that file (one host, or a
//! `HYFI_RENDEZVOUS` on a shared file system). `HYFI_COORD` and `HYFI_TOKEN`
//! are checked whatever the launcher, even for a one-node run: a malformed
//! value is an error, not ignored. Empty variables count as unset. A value hyfi cannot use is an error
//! ([`NetError::BadEnv`]) that names the variable and what it should hold,
//! never a silent fallback: a node that guessed its rank wrongly would hang the
//! whole job.
//!
//! All of this is the launcher's side of a job, whatever transport carries
//! it: the [`JobSpec`] with its meeting point ([`Rendezvous`], and the
//! private directory a default rendezvous file lives in, [`private_dir`])
//! and its secret ([`Token`]) is what hyfi's launchers make and pass, and
//! what `mpirun` and `srun` imply. How nodes meet there (the rendezvous
//! file's protocol) and prove the token is the TCP transport's
//! ([`crate::tcp`]); the MPI transport needs neither, as MPI's launcher
//! wires the job up itself.
//!
//! ```
//! use hyfi_net::bootstrap::{detect, Detected, Launcher, Rendezvous};
//!
//! let env = |k: &str| match k {
//!     "SLURM_PROCID" => Some("3".to_string()),
//!     "SLURM_NTASKS" => Some("8".to_string()),
//!     "SLURM_STEP_NODELIST" => Some("cn[017-020]".to_string()),
//!     "SLURM_JOB_ID" => Some("4242".to_string()),
//!     _ => None,
//! };
//! let Detected::Member(spec) = detect(env).unwrap() else { panic!() };
//! assert_eq!((spec.rank, spec.nodes, spec.launcher), (3, 8, Launcher::Slurm));
//! let Rendezvous::Coord(addr) = spec.rendezvous else { panic!() };
//! assert!(addr.starts_with("cn017:"));
//! ```

use std::path::{Path, PathBuf};

mod hostlist;
mod token;

use hostlist::first_host;
pub use token::{parse_token, random_token, random_u64, token_hex, Token};

use crate::NetError;

/// The program that started this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// hyfi's own launcher (embedded or `hyfi-run`): `HYFI_RANK` etc.
    Hyfi,
    /// Open MPI's `mpirun`: `OMPI_COMM_WORLD_RANK/SIZE`.
    OpenMpi,
    /// A PMI launcher (MPICH's hydra, ...): `PMI_RANK/PMI_SIZE`.
    Pmi,
    /// Slurm's `srun`: `SLURM_PROCID/SLURM_NTASKS`.
    Slurm,
}

impl Launcher {
    /// The launcher's name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Launcher::Hyfi => "hyfi",
            Launcher::OpenMpi => "Open MPI (mpirun)",
            Launcher::Pmi => "a PMI launcher",
            Launcher::Slurm => "Slurm (srun)",
        }
    }
}

/// Where the nodes meet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rendezvous {
    /// Node 0 listens at this `host:port`; the others connect to it.
    Coord(String),
    /// Node 0 writes its address into this file (on a file system every
    /// node sees); the others wait for it and read it.
    File(PathBuf),
}

/// This process's place in a multi-node job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobSpec {
    /// This node's rank, `0..nodes`.
    pub rank: usize,
    /// Number of nodes.
    pub nodes: usize,
    /// Where the nodes meet.
    pub rendezvous: Rendezvous,
    /// Job id: connections of another job are refused.
    pub job: u64,
    /// The job's secret, if the launcher handed one out (`HYFI_TOKEN`);
    /// otherwise node 0 makes one and gives it to the nodes that reach it.
    pub token: Option<Token>,
    /// Who started us.
    pub launcher: Launcher,
}

/// What the environment says this process is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Detected {
    /// A one-node run.
    Single,
    /// One node of a multi-node job.
    Member(JobSpec),
    /// `HYFI_NODES=n > 1` with no launcher around: start the nodes as local
    /// processes.
    LaunchLocal {
        /// Number of nodes to start.
        nodes: usize,
    },
}

/// This user's private directory under `tmp`: `tmp/hyfi-<uid>`, where a
/// job's default rendezvous file lives (the TCP transport creates it mode
/// 0700 and trusts nothing in it that is not this user's, see
/// [`crate::tcp::rendezvous`]).
pub fn private_dir(tmp: &Path) -> PathBuf {
    tmp.join(format!("hyfi-{}", euid()))
}

/// This process's effective user id.
pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The hint of [`NetError::NoRendezvous`] for Open MPI.
const HINT_OMPI: &str = "set HYFI_COORD=host:port (e.g. mpirun -x HYFI_COORD=node0:7777 ...) or \
                         HYFI_RENDEZVOUS=/shared/path";
/// The hint for PMI launchers.
const HINT_PMI: &str = "set HYFI_COORD=host:port (e.g. mpiexec -genv HYFI_COORD node0:7777 ...) \
                        or HYFI_RENDEZVOUS=/shared/path";
/// The hint for Slurm (reached only when no host list is around).
const HINT_SLURM: &str = "srun sets SLURM_STEP_NODELIST, which is missing here; set \
                          HYFI_COORD=host:port or HYFI_RENDEZVOUS=/shared/path";
/// The hint for hyfi's own variables.
const HINT_HYFI: &str = "HYFI_RANK is set, so also set HYFI_COORD=host:port or \
                         HYFI_RENDEZVOUS=/shared/path (hyfi-run sets both HYFI_RANK and \
                         HYFI_COORD)";

/// What the environment says this process is: [`detect`] over the real
/// environment.
pub fn detect_env() -> Result<Detected, NetError> {
    detect(|k| std::env::var(k).ok())
}

/// What the environment, as seen through `get`, says this process is.
///
/// The rules, in order, are in the [module documentation](self). `get` returns
/// a variable's value, or `None` when it is unset; empty values count as
/// unset.
pub fn detect(get: impl Fn(&str) -> Option<String>) -> Result<Detected, NetError> {
    let env = Env(&get);
    // Checked up front, so a typo is reported whichever rule applies (a
    // one-node run or the embedded launcher would otherwise ignore it).
    env.hyfi_rendezvous()?;
    env.token()?;

    if let Some(rank) = env.get("HYFI_RANK") {
        let rank = parse_rank("HYFI_RANK", &rank)?;
        let nodes = match env.get("HYFI_NODES") {
            Some(n) => parse_size("HYFI_NODES", &n)?,
            None => {
                return Err(NetError::BadEnv {
                    var: "HYFI_NODES",
                    value: String::new(),
                    expected: "the number of nodes (a whole number >= 1) whenever HYFI_RANK is set",
                })
            }
        };
        check_rank("HYFI_RANK", rank, nodes, "a whole number below HYFI_NODES")?;
        let rendezvous = env.hyfi_rendezvous()?.ok_or(NetError::NoRendezvous {
            launcher: Launcher::Hyfi.name(),
            rank,
            nodes,
            hint: HINT_HYFI,
        })?;
        return env.member(Launcher::Hyfi, rank, nodes, rendezvous, None);
    }

    if let Some(rank) = env.get("OMPI_COMM_WORLD_RANK") {
        let (rank, nodes) = env.rank_size(
            ("OMPI_COMM_WORLD_RANK", &rank),
            "OMPI_COMM_WORLD_SIZE",
            "a whole number below OMPI_COMM_WORLD_SIZE",
        )?;
        let key = env
            .get("PMIX_NAMESPACE")
            .or_else(|| env.get("OMPI_MCA_ess_base_jobid"));
        let local = env.local_size(&["OMPI_COMM_WORLD_LOCAL_SIZE"])?;
        return env.mpi_like(Launcher::OpenMpi, rank, nodes, key, local, HINT_OMPI);
    }

    if let Some(rank) = env.get("PMI_RANK") {
        let (rank, nodes) = env.rank_size(
            ("PMI_RANK", &rank),
            "PMI_SIZE",
            "a whole number below PMI_SIZE",
        )?;
        let key = env.get("PMI_JOBID").or_else(|| env.get("PMIX_NAMESPACE"));
        let local = env.local_size(&["PMI_LOCAL_SIZE", "MPI_LOCALNRANKS"])?;
        return env.mpi_like(Launcher::Pmi, rank, nodes, key, local, HINT_PMI);
    }

    if let Some(rank) = env.get("SLURM_PROCID") {
        let (rank, nodes) = env.rank_size(
            ("SLURM_PROCID", &rank),
            "SLURM_NTASKS",
            "a whole number below SLURM_NTASKS",
        )?;
        let job_id = env.get("SLURM_JOB_ID").or_else(|| env.get("SLURM_JOBID"));
        let step_id = env.get("SLURM_STEP_ID").or_else(|| env.get("SLURM_STEPID"));
        let key = format!(
            "slurm-{}.{}",
            job_id.as_deref().unwrap_or(""),
            step_id.as_deref().unwrap_or("")
        );
        let rendezvous = match env.hyfi_rendezvous()? {
            Some(r) => r,
            None => {
                let (var, list) = match env.get("SLURM_STEP_NODELIST") {
                    Some(l) => ("SLURM_STEP_NODELIST", l),
                    None => match env.get("SLURM_JOB_NODELIST") {
                        Some(l) => ("SLURM_JOB_NODELIST", l),
                        None => {
                            return Err(NetError::NoRendezvous {
                                launcher: Launcher::Slurm.name(),
                                rank,
                                nodes,
                                hint: HINT_SLURM,
                            })
                        }
                    },
                };
                let host = first_host(&list).map_err(|_| NetError::BadEnv {
                    var,
                    value: list.clone(),
                    expected: "a Slurm host list such as node[01-04,07],gpu3",
                })?;
                Rendezvous::Coord(format!("{host}:{}", slurm_port(&key)))
            }
        };
        return env.member(Launcher::Slurm, rank, nodes, rendezvous, Some(&key));
    }

    match env.get("HYFI_NODES") {
        None => Ok(Detected::Single),
        Some(n) => match parse_size("HYFI_NODES", &n)? {
            1 => Ok(Detected::Single),
            nodes => Ok(Detected::LaunchLocal { nodes }),
        },
    }
}

/// The port node 0 listens on under Slurm without `HYFI_COORD`: in
/// 20000..60000, below the usual ephemeral range (32768.. on Linux is partly
/// inside, which a busy port makes a clear bind error rather than a hang).
fn slurm_port(key: &str) -> u16 {
    // The remainder is below 40000, so the sum fits a u16.
    20000 + (fnv1a(key.as_bytes()) % 40000) as u16
}

/// A variable lookup that treats empty values as unset.
struct Env<'a, F: Fn(&str) -> Option<String>>(&'a F);

impl<F: Fn(&str) -> Option<String>> Env<'_, F> {
    fn get(&self, var: &str) -> Option<String> {
        (self.0)(var).filter(|v| !v.trim().is_empty())
    }

    /// The launcher's rank (already read) and size (`size_var`), checked.
    fn rank_size(
        &self,
        (rank_var, rank): (&'static str, &str),
        size_var: &'static str,
        rank_expected: &'static str,
    ) -> Result<(usize, usize), NetError> {
        let rank = parse_rank(rank_var, rank)?;
        let size = self.get(size_var).ok_or(NetError::BadEnv {
            var: size_var,
            value: String::new(),
            expected: "the number of processes (a whole number >= 1), which the launcher sets \
                       together with the rank",
        })?;
        let nodes = parse_size(size_var, &size)?;
        check_rank(rank_var, rank, nodes, rank_expected)?;
        Ok((rank, nodes))
    }

    /// The first of `vars` that is set, as a process count.
    fn local_size(&self, vars: &[&'static str]) -> Result<Option<usize>, NetError> {
        for &var in vars {
            if let Some(v) = self.get(var) {
                return parse_size(var, &v).map(Some);
            }
        }
        Ok(None)
    }

    /// `HYFI_COORD`, else `HYFI_RENDEZVOUS`, else `None`.
    fn hyfi_rendezvous(&self) -> Result<Option<Rendezvous>, NetError> {
        if let Some(coord) = self.get("HYFI_COORD") {
            let coord = coord.trim();
            let ok = match coord.rsplit_once(':') {
                Some((host, port)) => {
                    !host.is_empty()
                        && !host.contains(char::is_whitespace)
                        && port.parse::<u16>().is_ok_and(|p| p != 0)
                }
                None => false,
            };
            if !ok {
                return Err(NetError::BadEnv {
                    var: "HYFI_COORD",
                    value: coord.to_string(),
                    expected: "host:port, with a port in 1..=65535 (e.g. node0:7777)",
                });
            }
            return Ok(Some(Rendezvous::Coord(coord.to_string())));
        }
        Ok(self
            .get("HYFI_RENDEZVOUS")
            .map(|p| Rendezvous::File(PathBuf::from(p))))
    }

    /// `HYFI_TOKEN`, checked.
    fn token(&self) -> Result<Option<Token>, NetError> {
        match self.get("HYFI_TOKEN") {
            Some(t) => Ok(Some(parse_token(&t).ok_or(NetError::BadEnv {
                var: "HYFI_TOKEN",
                value: t.clone(),
                expected: "32 hexadecimal digits (16 bytes), the same on every node, e.g. from \
                           `openssl rand -hex 16`",
            })?)),
            None => Ok(None),
        }
    }

    /// The rendezvous rules shared by Open MPI and PMI.
    fn mpi_like(
        &self,
        launcher: Launcher,
        rank: usize,
        nodes: usize,
        key: Option<String>,
        local_size: Option<usize>,
        hint: &'static str,
    ) -> Result<Detected, NetError> {
        let key = key.map(|k| sanitise(&k));
        let rendezvous = match self.hyfi_rendezvous()? {
            Some(r) => r,
            None => match (&key, local_size) {
                // All ranks on this host: the temporary directory is shared
                // by construction, and the job key keeps jobs apart.
                (Some(key), Some(local)) if local == nodes => {
                    let dir = self.get("TMPDIR").unwrap_or_else(|| "/tmp".to_string());
                    let private = private_dir(&PathBuf::from(dir));
                    Rendezvous::File(private.join(format!("hyfi-{key}.addr")))
                }
                _ => {
                    return Err(NetError::NoRendezvous {
                        launcher: launcher.name(),
                        rank,
                        nodes,
                        hint,
                    })
                }
            },
        };
        self.member(launcher, rank, nodes, rendezvous, key.as_deref())
    }

    /// The job spec, with the job id and token rules common to all launchers.
    fn member(
        &self,
        launcher: Launcher,
        rank: usize,
        nodes: usize,
        rendezvous: Rendezvous,
        job_key: Option<&str>,
    ) -> Result<Detected, NetError> {
        let job = match self.get("HYFI_JOB") {
            Some(j) => j.trim().parse::<u64>().map_err(|_| NetError::BadEnv {
                var: "HYFI_JOB",
                value: j.clone(),
                expected: "a job id: a decimal number below 2^64",
            })?,
            None => match job_key {
                Some(key) => fnv1a(key.as_bytes()),
                None => match &rendezvous {
                    Rendezvous::Coord(c) => fnv1a(c.as_bytes()),
                    Rendezvous::File(p) => fnv1a(p.as_os_str().as_encoded_bytes()),
                },
            },
        };
        let token = self.token()?;
        Ok(Detected::Member(JobSpec {
            rank,
            nodes,
            rendezvous,
            job,
            token,
            launcher,
        }))
    }
}

fn parse_rank(var: &'static str, v: &str) -> Result<usize, NetError> {
    v.trim().parse::<usize>().map_err(|_| NetError::BadEnv {
        var,
        value: v.to_string(),
        expected: "a rank: a whole number >= 0",
    })
}

fn parse_size(var: &'static str, v: &str) -> Result<usize, NetError> {
    match v.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(NetError::BadEnv {
            var,
            value: v.to_string(),
            expected: "a number of nodes: a whole number >= 1",
        }),
    }
}

fn check_rank(
    var: &'static str,
    rank: usize,
    nodes: usize,
    expected: &'static str,
) -> Result<(), NetError> {
    if rank < nodes {
        Ok(())
    } else {
        Err(NetError::BadEnv {
            var,
            value: rank.to_string(),
            expected,
        })
    }
}

/// This node's place among the job's nodes on this host, from the launcher:
/// hyfi's own (`HYFI_LOCAL_RANK`/`HYFI_LOCAL_SIZE`, set by the embedded
/// launcher and `hyfi-run`), then Open MPI (`OMPI_COMM_WORLD_LOCAL_RANK`/
/// `OMPI_COMM_WORLD_LOCAL_SIZE`). The CPUs allowed to the process are divided
/// between the local nodes (see `Config::cpu_share`).
pub(crate) fn local_share() -> Result<Option<(usize, usize)>, NetError> {
    let get = |var: &str| std::env::var(var).ok();
    let env = Env(&get);
    for (rank_var, size_var) in [
        ("HYFI_LOCAL_RANK", "HYFI_LOCAL_SIZE"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ] {
        let (Some(r), Some(s)) = (env.get(rank_var), env.get(size_var)) else {
            continue;
        };
        let (rank, size) = (parse_rank(rank_var, &r)?, parse_size(size_var, &s)?);
        check_rank(
            rank_var,
            rank,
            size,
            "a local rank below the local node count",
        )?;
        return Ok(Some((rank, size)));
    }
    Ok(None)
}

/// Keeps `[A-Za-z0-9._-]` and replaces anything else with `_`, so a job key
/// can name a file (PMIx namespaces look like `prterun-host-1234@1`).
fn sanitise(key: &str) -> String {
    key.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// FNV-1a, 64 bits: a hash every node computes alike, whatever its build
/// (std's `DefaultHasher` promises no stability across releases).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests;
