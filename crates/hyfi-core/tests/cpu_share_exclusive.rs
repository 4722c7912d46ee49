//! A local node with CPUs no other local node shares (as many local nodes
//! as CPUs, or fewer) owns them exclusively: its waits may spin and read
//! the transport themselves (`hyfi_core::sleep::cpus_exclusive`). Its own
//! test binary: the runtime confines the whole process to its share, and
//! the decision is the process's.

use hyfi_core::{Config, Runtime};

#[test]
fn a_node_with_a_cpu_of_its_own_is_exclusive() {
    let cpus = std::thread::available_parallelism().unwrap().get();
    if cpus < 2 {
        // One CPU: two local nodes would share it (the other test's case),
        // and one local node alone is not a share: nothing to own.
        let rt = Runtime::new(Config::new().procs(1).pin(true).cpu_share(0, 1)).unwrap();
        assert_eq!(rt.run(|_| 7).unwrap(), 7);
        assert!(!hyfi_core::sleep::own_cpu());
        assert!(!hyfi_core::sleep::cpus_exclusive());
        return;
    }
    let rt = Runtime::new(Config::new().procs(1).pin(true).cpu_share(0, cpus)).unwrap();
    assert_eq!(rt.run(|_| 7).unwrap(), 7);
    assert!(hyfi_core::sleep::own_cpu());
    assert!(hyfi_core::sleep::cpus_exclusive());
}
