//! A probe for the launcher tests: reports what `detect_env` sees, then does
//! what its arguments say.
//!
//! It prints `rank=<r> nodes=<n> launcher=<name> coord=<addr> pid=<pid>` on
//! stdout and `probe stderr rank=<r>` on stderr, then runs the first action
//! that applies to its rank. Actions: `exit:CODE`, `sleep:SECS`, `kill9`;
//! each may end in `@RANK` to apply to that rank only. With no action that
//! applies, it exits 0.
//!
//! ```text
//! hyfi-run -n 4 net_probe exit:3@1 sleep:60   # node 1 fails, the others sleep
//! ```

use hyfi_net::bootstrap::{detect_env, Detected, Rendezvous};

fn main() {
    let (rank, nodes, launcher, coord) = match detect_env() {
        Ok(Detected::Single) => (0, 1, "none".to_string(), "-".to_string()),
        Ok(Detected::LaunchLocal { nodes }) => (0, nodes, "launch-local".into(), "-".into()),
        Ok(Detected::Member(spec)) => {
            let coord = match spec.rendezvous {
                Rendezvous::Coord(c) => c,
                Rendezvous::File(p) => p.display().to_string(),
            };
            (spec.rank, spec.nodes, format!("{:?}", spec.launcher), coord)
        }
        Err(e) => {
            eprintln!("net_probe: {e}");
            std::process::exit(70);
        }
    };
    println!(
        "rank={rank} nodes={nodes} launcher={launcher} coord={coord} pid={}",
        std::process::id()
    );
    eprintln!("probe stderr rank={rank}");

    for action in std::env::args().skip(1) {
        let (what, only) = match action.split_once('@') {
            Some((w, r)) => (w, r.parse::<usize>().ok()),
            None => (action.as_str(), None),
        };
        if only.is_some_and(|r| r != rank) {
            continue;
        }
        match what.split_once(':') {
            Some(("exit", code)) => std::process::exit(code.parse().unwrap_or(1)),
            Some(("sleep", secs)) => {
                std::thread::sleep(std::time::Duration::from_secs(secs.parse().unwrap_or(60)));
                return;
            }
            _ if what == "kill9" => {
                // SAFETY: kill(2) on our own pid has no memory effects.
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            }
            _ => {
                eprintln!("net_probe: unknown action {action:?}");
                std::process::exit(64);
            }
        }
    }
}
