//! A local node whose CPUs other local nodes share (more local nodes than
//! CPUs) owns them but not exclusively: its waits must yield, not spin
//! (`hyfi_core::sleep::cpus_exclusive`). Its own test binary: the runtime
//! confines the whole process to its share, and the decision is the
//! process's.

use hyfi_core::{Config, Runtime};

#[test]
fn a_node_sharing_its_cpu_with_other_local_nodes_is_not_exclusive() {
    let cpus = std::thread::available_parallelism().unwrap().get();
    // Twice as many local nodes as CPUs: every CPU is shared by two.
    let rt = Runtime::new(Config::new().procs(1).pin(true).cpu_share(0, 2 * cpus)).unwrap();
    assert_eq!(rt.run(|_| 7).unwrap(), 7);
    assert!(
        hyfi_core::sleep::own_cpu(),
        "a pinned local node owns its CPU"
    );
    assert!(
        !hyfi_core::sleep::cpus_exclusive(),
        "another local node shares this CPU: waits must not spin on it"
    );
}
