//! Every error case of the single-node runtime ends in a typed error or a
//! clear message: panics in filaments, post-phase code and fork-join
//! filaments, stack overflow of a filthread, bad configuration, misuse.

use std::process::Command;
use std::time::Duration;

use hyfi_core::{Config, Control, Error, Op, PoolArray, Program, Runtime};

fn rt(p: usize) -> Runtime {
    Runtime::new(Config::new().procs(p).pin(false)).expect("runtime")
}

#[test]
fn panic_in_iterative_filament_reaches_start() {
    for p in [1, 2] {
        let rt = rt(p);
        let mut prog = Program::new();
        prog.phase(
            PoolArray::block(&rt, 0..1000, 2),
            |_, i| {
                if i == 777 {
                    panic!("filament {i} found a negative pressure");
                }
            },
            |_| Control::Continue,
        );
        let e = rt.start(&mut prog).unwrap_err();
        match &e {
            Error::FilamentPanic {
                message, during, ..
            } => {
                assert!(
                    message.contains("filament 777 found a negative pressure"),
                    "{e}"
                );
                assert!(during.contains("phase 0 filament"), "{e}");
            }
            other => panic!("expected FilamentPanic, got {other}"),
        }
        // The runtime stays usable.
        let mut ok = Program::new();
        ok.phase(
            PoolArray::block(&rt, 0..10, 1),
            |_, _| {},
            |_| Control::Done,
        );
        rt.start(&mut ok).unwrap();
    }
}

#[test]
fn panic_in_post_phase_reaches_start() {
    let rt = rt(2);
    let mut prog = Program::new();
    prog.phase(
        PoolArray::block(&rt, 0..10, 1),
        |_, _| {},
        |post| {
            if post.iteration() == 3 {
                panic!("check() diverged");
            }
            Control::Continue
        },
    );
    let e = rt.start(&mut prog).unwrap_err();
    assert!(
        matches!(&e, Error::FilamentPanic { message, during, .. }
            if message == "check() diverged" && during == "phase 0 post-phase"),
        "{e}"
    );
}

#[test]
fn panic_in_fork_join_filament_reaches_run() {
    fn tree(ctx: &hyfi_core::Ctx, n: u32) -> u64 {
        if n == 0 {
            return 1;
        }
        if n == 7 && ctx.proc() < 100 {
            // Deep in the recursion, on whichever processor got here.
            let (a, _) = ctx.join(|c| tree(c, n - 1), |_| -> u64 { panic!("leaf exploded") });
            return a;
        }
        let (a, b) = ctx.join(|c| tree(c, n - 1), |c| tree(c, n - 1));
        a + b
    }
    for p in [1, 2] {
        for prune in [true, false] {
            let rt = Runtime::new(Config::new().procs(p).pin(false).prune(prune)).unwrap();
            let e = rt.run(|c| tree(c, 12)).unwrap_err();
            assert!(
                matches!(&e, Error::FilamentPanic { message, during, .. }
                    if message == "leaf exploded" && during == "fork-join"),
                "{e}"
            );
            assert_eq!(rt.run(|c| c.join(|_| 1, |_| 2)).unwrap(), (1, 2));
        }
    }
}

#[test]
fn nested_start_is_an_error_not_a_deadlock() {
    let rt = rt(2);
    let inner = rt.run(|_| rt.run(|_| 1)).unwrap();
    assert!(matches!(inner, Err(Error::Nested)), "{inner:?}");
}

#[test]
fn reduction_of_another_runtime_is_refused() {
    let a = rt(1);
    let b = rt(1);
    let r = a.reduction(0u32);
    assert!(matches!(b.get(&r), Err(Error::ForeignReduction)));
    let mut prog = Program::new();
    prog.phase(
        PoolArray::block(&b, 0..4, 1),
        |ctx, _| r.set(ctx, 1),
        |_| Control::Done,
    );
    let e = b.start(&mut prog).unwrap_err();
    assert!(e.to_string().contains("another runtime"), "{e}");
    let mut prog = Program::new();
    prog.phase(
        PoolArray::block(&b, 0..4, 1),
        |_, _| {},
        |post| {
            post.reduce(&r, Op::Sum);
            Control::Done
        },
    );
    let e = b.start(&mut prog).unwrap_err();
    assert!(e.to_string().contains("another runtime"), "{e}");
}

#[test]
fn pool_array_of_another_shape_is_refused() {
    let one = rt(1);
    let two = rt(2);
    let mut prog = Program::new();
    prog.phase(
        PoolArray::block(&one, 0..4, 1),
        |_, _| {},
        |_| Control::Done,
    );
    let e = two.start(&mut prog).unwrap_err();
    assert!(
        matches!(
            e,
            Error::PoolShape {
                pool_procs: 1,
                procs: 2,
                ..
            }
        ),
        "{e}"
    );
    assert!(matches!(
        two.start(&mut Program::new()),
        Err(Error::EmptyProgram)
    ));
}

#[test]
fn invalid_configuration_is_a_typed_error() {
    let e = Runtime::new(Config::new().procs(0)).unwrap_err();
    assert!(e.to_string().contains("at least 1"), "{e}");
    let too_many = std::thread::available_parallelism().unwrap().get() + 1;
    let e = Runtime::new(Config::new().procs(too_many).pin(true)).unwrap_err();
    assert!(matches!(e, Error::TooManyProcs { .. }), "{e}");
    assert!(e.to_string().contains("HYFI_PIN=0"), "{e}");
    let e = Runtime::new(Config::new().stack_size(10)).unwrap_err();
    assert!(e.to_string().contains("HYFI_STACK_SIZE"), "{e}");
    // Oversubscription is allowed when unpinned.
    let rt = Runtime::new(Config::new().procs(too_many).pin(false)).unwrap();
    assert_eq!(rt.procs(), too_many);
}

/// Runs this test binary again with `HYFI_CHILD=<what>`, returning its exit
/// status and stderr. Bounded: a child that hangs is killed.
fn child(what: &str, env: &[(&str, &str)]) -> (std::process::ExitStatus, String) {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env("HYFI_CHILD", what)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut ch = cmd.spawn().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = ch.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            ch.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            return (status, err);
        }
        if std::time::Instant::now() > deadline {
            let _ = ch.kill();
            let _ = ch.wait();
            panic!("child {what} hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Entry point of the child processes (does nothing in a normal run).
#[test]
fn child_entry() {
    let Ok(what) = std::env::var("HYFI_CHILD") else {
        return;
    };
    #[inline(never)]
    #[allow(unconditional_recursion)]
    fn runaway(depth: u64, pad: &mut [u8; 256]) -> u64 {
        // Plain recursion (not through join): nothing can grow the stack.
        pad[(depth % 256) as usize] = depth as u8;
        let mut next = [0u8; 256];
        std::hint::black_box(&mut next);
        1 + runaway(depth + 1, std::hint::black_box(&mut next)) + pad[0] as u64
    }
    let rt = Runtime::from_env().unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2)
    });
    match what.as_str() {
        "overflow-forkjoin" => {
            let r = rt.run(|_| runaway(0, &mut [0; 256]));
            println!("{r:?}");
        }
        "overflow-filament" => {
            let mut prog = Program::new();
            prog.phase(
                PoolArray::block(&rt, 0..4, 1),
                |_, _| {
                    std::hint::black_box(runaway(0, &mut [0; 256]));
                },
                |_| Control::Done,
            );
            println!("{:?}", rt.start(&mut prog));
        }
        other => panic!("unknown child {other}"),
    }
}

#[test]
fn filthread_stack_overflow_names_the_setting() {
    for what in ["overflow-forkjoin", "overflow-filament"] {
        let (status, err) = child(
            what,
            &[
                ("HYFI_PROCS", "2"),
                ("HYFI_PIN", "0"),
                ("HYFI_STACK_SIZE", "256K"),
            ],
        );
        assert!(!status.success(), "{what}: child survived: {err}");
        assert!(
            err.contains("hyfi: filthread stack overflow on processor"),
            "{what}: {err}"
        );
        assert!(err.contains("stack size 262144 bytes"), "{what}: {err}");
        assert!(err.contains("HYFI_STACK_SIZE"), "{what}: {err}");
    }
}

#[test]
fn bad_environment_is_reported_by_from_env() {
    let (status, err) = child("overflow-forkjoin", &[("HYFI_PROCS", "lots")]);
    assert!(!status.success());
    assert!(err.contains("HYFI_PROCS=\"lots\" is not valid"), "{err}");
}

#[test]
fn debug_of_an_error_is_its_message() {
    // What `?` in `fn main() -> Result<(), Box<dyn Error>>` prints.
    let rt = Runtime::new(Config::new().procs(1).pin(false)).unwrap();
    let e = rt.start(&mut Program::new()).unwrap_err();
    assert!(matches!(e, Error::EmptyProgram));
    assert_eq!(format!("{e:?}"), e.to_string());
    let boxed: Box<dyn std::error::Error> = Box::new(e);
    assert_eq!(format!("{boxed:?}"), boxed.to_string());
}
