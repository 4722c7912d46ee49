//! A collective's steps share one polling bracket
//! (`hyfi_core::link::attending_collective`): the transport hears one
//! begin, whatever the steps' own waits open inside it, and the bracket
//! ends before the thread sleeps (`before_sleep`), once. Its own test
//! binary: it declares the process's CPUs its own, as a node pinned to
//! CPUs no other node uses, which every wait in it then sees.

use std::cell::RefCell;

use hyfi_core::link::{self, Attending};

thread_local! {
    /// The brackets the transport heard begin and end on this thread.
    static HEARD: RefCell<Vec<(Attending, bool)>> = const { RefCell::new(Vec::new()) };
}

fn begin(kind: Attending) {
    HEARD.with(|h| h.borrow_mut().push((kind, true)));
}

fn end(kind: Attending) {
    HEARD.with(|h| h.borrow_mut().push((kind, false)));
}

fn heard() -> Vec<(Attending, bool)> {
    HEARD.with(|h| std::mem::take(&mut *h.borrow_mut()))
}

#[test]
fn a_collectives_steps_share_one_bracket_that_ends_before_a_sleep() {
    assert!(link::set_attending(begin, end));
    hyfi_core::sleep::set_own_cpu();
    hyfi_core::sleep::set_cpus_exclusive();

    // Three steps, each a wait that polls (and finds its piece at once):
    // one bracket for all of them.
    let steps = link::attending_collective(|| {
        let mut steps = 0;
        for _ in 0..3 {
            assert!(hyfi_core::sleep::poll_own_cpu(|| true));
            steps += 1;
        }
        assert_eq!(
            heard(),
            [(Attending::Polling, true)],
            "one bracket begun over the steps' waits, none ended"
        );
        steps
    });
    assert_eq!(steps, 3);
    assert_eq!(
        heard(),
        [(Attending::Polling, false)],
        "ended with the collective"
    );

    // A step that must sleep ends the bracket first, once; the steps after
    // it poll in brackets of their own.
    link::attending_collective(|| {
        assert_eq!(heard(), [(Attending::Polling, true)]);
        link::before_sleep();
        assert_eq!(
            heard(),
            [(Attending::Polling, false)],
            "ended before the sleep"
        );
        link::before_sleep();
        assert!(heard().is_empty(), "ended once");
        assert!(hyfi_core::sleep::poll_own_cpu(|| true));
        assert_eq!(
            heard(),
            [(Attending::Polling, true), (Attending::Polling, false)],
            "a later step's own bracket"
        );
    });
    assert!(heard().is_empty(), "nothing left to end after a sleep");

    // Nested collectives (a collective inside another's step) share the
    // outer one's bracket.
    link::attending_collective(|| link::attending_collective(|| ()));
    assert_eq!(
        heard(),
        [(Attending::Polling, true), (Attending::Polling, false)]
    );

    // A panic in a step ends the bracket too.
    let r = std::panic::catch_unwind(|| link::attending_collective(|| panic!("a step failed")));
    assert!(r.is_err());
    assert_eq!(
        heard(),
        [(Attending::Polling, true), (Attending::Polling, false)]
    );
}
