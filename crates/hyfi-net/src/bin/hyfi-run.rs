//! `hyfi-run -n NODES [-p PROCS] [--timeout SECS] [--] PROGRAM [ARGS...]`:
//! starts a hyfi program as NODES nodes on this host, like `mpirun`.
//!
//! `hyfi-run --merge-trace PATH`: merges the files `PATH.node<i>` that the
//! nodes of a traced job (`HYFI_TRACE=PATH`) wrote under another launcher
//! (`mpirun`, `srun`) into `PATH`, and prints the trace's summary. Under
//! hyfi-run itself, and the embedded launcher, that happens by itself.
//!
//! Each node gets `HYFI_RANK`, `HYFI_NODES`, `HYFI_COORD`, `HYFI_JOB`,
//! `HYFI_TOKEN` (and `HYFI_PROCS` with `-p`); its output comes back prefixed
//! with `[node i] `. See `hyfi_net::launch` for how nodes are supervised.
//!
//! When hyfi-run's stderr is a terminal (or `HYFI_PROGRESS=force`), the
//! nodes get `HYFI_PROGRESS=lines` and their progress (`hyfi::Progress`) is
//! shown as one status line, every node's latest report side by side,
//! rewritten in place and erased at the end; otherwise nothing is shown.
//!
//! NODES is bounded (4096 unless `HYFI_MAX_LOCAL_NODES` says otherwise, and
//! what the host's process limits leave room for; see
//! `hyfi_net::launch::limits`): a larger count is refused before any node
//! starts.
//!
//! Exit status (the README's table): 128 + the signal if SIGINT, SIGTERM or
//! SIGHUP stopped the job (130 for Ctrl-C, even while nodes are still
//! starting); else 0 if all succeed; else the code of the first cause, as
//! the nodes report it (1 a program's failure, 3 a node that stopped
//! answering, 4 start-up, 128 + n a node killed by signal n, or the status of
//! a program that is not a hyfi program); 2 on bad usage or a bad setting
//! (checked before any node starts), 1 if the launch itself fails (a
//! timeout), 126/127 if PROGRAM cannot be run or found.

use std::ffi::{OsStr, OsString};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::exit;
use std::time::Duration;

use hyfi_net::launch::LocalLaunch;

const USAGE: &str = "\
usage: hyfi-run -n NODES [-p PROCS] [--timeout SECS] [--] PROGRAM [ARGS...]
       hyfi-run --merge-trace PATH

Starts PROGRAM as NODES nodes of one hyfi job on this host.

  -n, --nodes NODES    number of nodes (processes) to start, >= 1; at most
                       4096 (HYFI_MAX_LOCAL_NODES) and what the host's
                       process limits leave room for
  -p, --procs PROCS    worker threads per node (sets HYFI_PROCS), >= 1
      --timeout SECS   stop the nodes and fail after SECS seconds
      --merge-trace PATH
                       merge the trace files PATH.node<i> the nodes of a
                       job run with HYFI_TRACE=PATH wrote (under mpirun or
                       srun) into PATH, and print its summary
  -h, --help           show this help

With stderr a terminal (or HYFI_PROGRESS=force), the nodes' progress is
shown as one status line; HYFI_PROGRESS=off turns it off.
";

/// What the command line asks for.
#[derive(Debug, PartialEq)]
struct Args {
    nodes: usize,
    procs: Option<usize>,
    timeout: Option<Duration>,
    program: OsString,
    args: Vec<OsString>,
}

/// What parsing found instead of a command.
#[derive(Debug, PartialEq)]
enum Stop {
    Help,
    Usage(String),
}

fn parse(mut argv: impl Iterator<Item = OsString>) -> Result<Args, Stop> {
    let mut nodes = None;
    let mut procs = None;
    let mut timeout = None;
    let program = loop {
        let Some(arg) = argv.next() else {
            return Err(Stop::Usage("missing PROGRAM".into()));
        };
        let Some(flag) = arg.to_str() else {
            break arg;
        };
        // `-n4` and `--nodes=4` as well as `-n 4`.
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ if flag.len() > 2 && (flag.starts_with("-n") || flag.starts_with("-p")) => {
                (&flag[..2], Some(flag[2..].to_string()))
            }
            _ => (flag, None),
        };
        let mut value = |what: &str| -> Result<String, Stop> {
            match inline.clone() {
                Some(v) => Ok(v),
                None => argv
                    .next()
                    .and_then(|v| v.into_string().ok())
                    .ok_or_else(|| Stop::Usage(format!("{name} needs {what}"))),
            }
        };
        match name {
            "-h" | "--help" => return Err(Stop::Help),
            "-n" | "--nodes" => nodes = Some(count(name, &value("a number of nodes")?)?),
            "-p" | "--procs" => procs = Some(count(name, &value("a number of threads")?)?),
            "--timeout" => {
                let v = value("a number of seconds")?;
                match v.parse::<f64>() {
                    Ok(s) if s > 0.0 && s.is_finite() => timeout = Some(Duration::from_secs_f64(s)),
                    _ => {
                        return Err(Stop::Usage(format!(
                            "--timeout needs a positive number of seconds, not {v:?}"
                        )))
                    }
                }
            }
            "--" => match argv.next() {
                Some(p) => break p,
                None => return Err(Stop::Usage("missing PROGRAM after --".into())),
            },
            f if f.starts_with('-') && f.len() > 1 => {
                return Err(Stop::Usage(format!("unknown option {f}")))
            }
            _ => break arg,
        }
    };
    let nodes = nodes.ok_or_else(|| Stop::Usage("-n NODES is required".into()))?;
    Ok(Args {
        nodes,
        procs,
        timeout,
        program,
        args: argv.collect(),
    })
}

fn count(flag: &str, v: &str) -> Result<usize, Stop> {
    match v.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(Stop::Usage(format!(
            "{flag} needs a whole number >= 1, not {v:?}"
        ))),
    }
}

/// PROGRAM itself if it names a path, else the first executable file of
/// that name in `PATH` (as a shell would find it).
fn resolve(program: &OsStr) -> Option<PathBuf> {
    let p = Path::new(program);
    if program.as_encoded_bytes().contains(&b'/') {
        return Some(p.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(p))
        .find(|c| {
            c.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// `hyfi-run --merge-trace PATH`.
fn merge_trace(path: &OsStr) -> ! {
    match hyfi_core::trace::merge(Path::new(path), None) {
        Ok(merged) => {
            eprint!("{merged}");
            exit(0)
        }
        Err(e) => {
            eprintln!(
                "hyfi-run: cannot merge the trace {}: {e}",
                Path::new(path).display()
            );
            exit(1)
        }
    }
}

fn main() {
    let mut argv = std::env::args_os().skip(1).peekable();
    if argv.peek().is_some_and(|a| a == "--merge-trace") {
        argv.next();
        match (argv.next(), argv.next()) {
            (Some(path), None) => merge_trace(&path),
            _ => {
                eprint!("hyfi-run: --merge-trace needs exactly one PATH\n{USAGE}");
                exit(2);
            }
        }
    }
    let args = match parse(argv) {
        Ok(a) => a,
        Err(Stop::Help) => {
            print!("{USAGE}");
            exit(0);
        }
        Err(Stop::Usage(why)) => {
            eprint!("hyfi-run: {why}\n{USAGE}");
            exit(2);
        }
    };
    let Some(program) = resolve(&args.program) else {
        eprintln!(
            "hyfi-run: {}: not found in PATH",
            args.program.to_string_lossy()
        );
        exit(127);
    };
    let launch = LocalLaunch {
        nodes: args.nodes,
        procs: args.procs,
        program,
        args: args.args,
        timeout: args.timeout,
    };
    match launch.run() {
        Ok(outcome) => exit(outcome.exit_code()),
        Err(e) => {
            eprintln!("hyfi-run: {e}");
            exit(e.launcher_exit_code());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Args, Stop> {
        parse(args.iter().map(OsString::from))
    }

    #[test]
    fn parses_the_forms() {
        let a = p(&["-n", "4", "-p", "2", "--timeout", "1.5", "prog", "-x", "y"]).unwrap();
        assert_eq!(
            a,
            Args {
                nodes: 4,
                procs: Some(2),
                timeout: Some(Duration::from_millis(1500)),
                program: "prog".into(),
                args: vec!["-x".into(), "y".into()],
            }
        );
        let a = p(&["-n3", "--", "-weird-name", "--", "z"]).unwrap();
        assert_eq!(
            (a.nodes, a.program, a.args.len()),
            (3, "-weird-name".into(), 2)
        );
        assert_eq!(p(&["--nodes=2", "prog"]).unwrap().nodes, 2);
    }

    #[test]
    fn rejects_bad_usage() {
        let usage = |args: &[&str]| match p(args) {
            Err(Stop::Usage(why)) => why,
            other => panic!("expected a usage error, got {other:?}"),
        };
        assert_eq!(usage(&[]), "missing PROGRAM");
        assert_eq!(usage(&["prog"]), "-n NODES is required");
        assert_eq!(usage(&["-n"]), "-n needs a number of nodes");
        assert_eq!(
            usage(&["-n", "0", "prog"]),
            "-n needs a whole number >= 1, not \"0\""
        );
        assert_eq!(
            usage(&["-n", "x", "prog"]),
            "-n needs a whole number >= 1, not \"x\""
        );
        assert_eq!(usage(&["-q", "prog"]), "unknown option -q");
        assert_eq!(
            usage(&["-n", "2", "--timeout", "-1", "prog"]),
            "--timeout needs a positive number of seconds, not \"-1\""
        );
        assert_eq!(usage(&["-n", "2", "--"]), "missing PROGRAM after --");
        assert_eq!(p(&["--help"]), Err(Stop::Help));
    }

    #[test]
    fn resolves_through_path() {
        let sh = resolve(OsStr::new("sh")).expect("sh in PATH");
        assert!(sh.is_absolute() && sh.ends_with("sh"), "{}", sh.display());
        assert_eq!(resolve(OsStr::new("./x")), Some(PathBuf::from("./x")));
        assert_eq!(resolve(OsStr::new("no-such-program-hyfi")), None);
    }
}
