//! How a launch's outcome reads: exit codes and descriptions.

use super::outcome::describe;
use super::*;

fn outcome(raw: &[i32], first: Option<usize>) -> LaunchOutcome {
    LaunchOutcome {
        statuses: raw.iter().map(|&r| ExitStatus::from_raw(r)).collect(),
        first_failure: first,
        first_cause: None,
        interrupted: None,
    }
}

#[test]
fn exit_codes() {
    // Raw wait statuses: code c is c << 8, signal s is s.
    assert_eq!(outcome(&[0, 0], None).exit_code(), 0);
    assert!(outcome(&[0, 0], None).success());
    assert_eq!(outcome(&[0, 3 << 8], None).exit_code(), 3);
    assert!(!outcome(&[0, 3 << 8], None).success());
    assert_eq!(outcome(&[9, 0], None).exit_code(), 137);
    // The first failure in time wins over the lowest rank.
    assert_eq!(outcome(&[15, 3 << 8], Some(1)).exit_code(), 3);
    // The first cause the nodes reported decides, whatever their statuses.
    let mut o = outcome(&[1 << 8, 9], Some(0));
    o.first_cause = Some(("was killed by signal 9 (SIGKILL)".into(), 137));
    assert_eq!(o.exit_code(), 137);
    // A signal to the launcher wins over whatever the nodes made of it.
    let mut o = outcome(&[0, 0], None);
    o.interrupted = Some(Signal::SIGINT);
    assert_eq!(o.exit_code(), 130);
    assert!(!o.success());
}

#[test]
fn descriptions() {
    assert_eq!(
        describe(ExitStatus::from_raw(3 << 8)),
        "exited with status 3"
    );
    assert_eq!(
        describe(ExitStatus::from_raw(9)),
        "was killed by signal 9 (SIGKILL)"
    );
}
