//! A node of a multi-node job over TCP, as hyfi-core sees it: a
//! [`NodeLink`] whose messages, barrier and reduction run over the mesh.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use hyfi_core::link::{Port, Service, ServiceId, Traffic};
use hyfi_core::{LinkError, NodeLink};

use crate::bootstrap::JobSpec;
use crate::cause::{self, end_after_grace, Cause, CauseKind};
use crate::error::NetError;
use crate::panics::{last_panic, record_panics};
use crate::signals::{self, SignalEvent, SignalThread};
use crate::tcp::collective::Collectives;
use crate::tcp::comm::{Comm, NetStats};
use crate::tcp::mesh;

/// One node of a multi-node job over TCP.
///
/// Layers above talk to other nodes through the node seam
/// ([`NodeLink::port`], [`NodeLink::set_service`]) and the collectives; the
/// node's message substrate itself is not handed out, since raw frames sent
/// beside the runtime's could break its protocols. Tests and benchmarks of
/// the substrate build their own with [`mesh::connect`] and
/// [`Comm::start`].
pub struct Cluster {
    comm: Comm,
    coll: Collectives,
    signals: Mutex<Option<SignalThread>>,
    runtime_stats: Mutex<Option<hyfi_core::StatsHandle>>,
    /// More sections of the report, from the layers above (the DSM).
    reports: Mutex<Vec<Report>>,
}

/// A section of [`Cluster::report`] from a layer above: `None` once that
/// layer is gone.
pub use hyfi_core::link::Report;

impl Cluster {
    /// Opens the mesh described by `spec` (waiting at most `timeout` for the
    /// other nodes) and starts the communication thread.
    ///
    /// If a peer is lost later, the program's waits return the error and,
    /// unless the program ends first, the process prints it and exits with
    /// its code ([`CauseKind::exit_code`]) after
    /// [`FAILURE_GRACE`](crate::FAILURE_GRACE): a node never hangs waiting
    /// for a dead peer.
    pub fn connect(spec: &JobSpec, timeout: Duration) -> Result<Arc<Cluster>, NetError> {
        let heartbeat = crate::heartbeat()?;
        let links = mesh::connect(spec, timeout)?;
        let rank = links.rank;
        record_panics();
        let comm = Comm::start(
            links,
            Box::new(move |cause: &Cause| {
                // The program's waits return the cause now, and it prints
                // it as its error; hyfi says it only if the program does
                // not take it within the grace (see `end_after_grace`).
                let cause = cause.clone();
                let _ = std::thread::Builder::new()
                    .name("hyfi-abort".into())
                    .spawn(move || end_after_grace(rank, &cause));
            }),
            heartbeat,
        )?;
        // A fault that kills this process (a stack overflow, an abort) is
        // told to every peer, and to the launcher, before it dies.
        let sender = comm.sender();
        let _ = hyfi_core::last_words::set_hook(move |text| {
            sender.fail_and_tell(Cause::new(rank, CauseKind::Fatal, text), |_| {});
            // Let the communication thread write the aborts out.
            std::thread::sleep(Duration::from_millis(100));
        });
        Ok(Arc::new(Cluster {
            comm,
            coll: Collectives::default(),
            signals: Mutex::new(None),
            runtime_stats: Mutex::new(None),
            reports: Mutex::new(Vec::new()),
        }))
    }

    /// Starts the signal-handling thread for this node: SIGINT, SIGTERM,
    /// SIGHUP or SIGQUIT abort the whole job (every node exits non-zero with
    /// a message naming the signal and the node); SIGUSR1 prints the node's
    /// traffic counters. The asynchronous signals must already be blocked
    /// ([`signals::block_async_signals`]) before any other thread started.
    pub fn handle_signals(self: &Arc<Self>) -> Result<(), NetError> {
        let weak: Weak<Cluster> = Arc::downgrade(self);
        let t = SignalThread::start(move |ev| {
            let Some(c) = weak.upgrade() else { return };
            match ev {
                SignalEvent::Abort { signal, from } => c.on_abort_signal(signal, from),
                SignalEvent::DumpStats => {
                    let waits = hyfi_core::waits::report();
                    let waits = if waits.is_empty() {
                        "nothing\n".to_string()
                    } else {
                        format!("\n{waits}")
                    };
                    eprint!("{}hyfi: node {} waits for: {waits}", c.report(), c.rank());
                }
            }
        })?;
        *self.signals.lock().unwrap_or_else(|e| e.into_inner()) = Some(t);
        Ok(())
    }

    /// SIGINT, SIGTERM, SIGHUP or SIGQUIT from process `from`: from this
    /// node's launcher, which stops the job (because another node failed,
    /// or it was told to), the node ends quietly, printing what it knows;
    /// from anywhere else, it is this node's failure, and the job's cause.
    fn on_abort_signal(&self, signal: nix::sys::signal::Signal, from: Option<i32>) {
        let me = self.rank();
        // SAFETY: getppid has no preconditions.
        let parent = unsafe { libc::getppid() };
        let by_launcher = cause::has_launcher() && from == Some(parent);
        if by_launcher {
            cause::report_stopped(&format!("stopped by its launcher ({signal})"));
            let known = self.comm.inbox().cause();
            self.comm.exiting();
            match known {
                Some(c) => {
                    if !cause::take_delivered() {
                        eprintln!("hyfi: {}", c.line(me));
                    }
                    std::process::exit(c.kind.exit_code());
                }
                None => {
                    eprintln!("hyfi: node {me}: stopped by its launcher ({signal})");
                    std::process::exit(signals::exit_code_for(signal));
                }
            }
        }
        let sender = match from {
            Some(pid) => format!(" from process {pid}"),
            None => String::new(),
        };
        let c = Cause::new(
            me,
            CauseKind::Signal(signal as i32),
            format!("received {signal}{sender}; the job ends"),
        );
        eprintln!("hyfi: {}", c.line(me));
        // Tell the peers, but do not fail this node's own waits: its
        // program would exit with its own error status first, and this
        // node must exit with 128 + the signal.
        self.comm.abort_peers(&c);
        // Give the writer a moment to pass the abort on.
        std::thread::sleep(Duration::from_millis(200));
        std::process::exit(signals::exit_code_for(signal));
    }

    /// Makes [`Cluster::report`] (and SIGUSR1) include the runtime's
    /// per-processor counters.
    pub fn set_runtime_stats(&self, h: hyfi_core::StatsHandle) {
        *self.runtime_stats.lock().unwrap_or_else(|e| e.into_inner()) = Some(h);
    }

    /// Adds a section to [`Cluster::report`] (and so to what SIGUSR1
    /// prints): the DSM adds its counters.
    pub fn add_report(&self, section: Report) {
        self.reports
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(section);
    }

    /// This node's statistics: messages and bytes by kind, and (if set) the
    /// runtime's counters per processor. What SIGUSR1 prints.
    pub fn report(&self) -> String {
        let mut s = format!("hyfi: node {} traffic: {}\n", self.rank(), self.stats());
        if let Some(h) = self
            .runtime_stats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            if let Some(st) = h.stats() {
                s += &st.to_string();
            }
        }
        for section in self
            .reports
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            if let Some(text) = section() {
                s += &text;
            }
        }
        s
    }

    /// This node's rank.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }
    /// Number of nodes.
    pub fn nodes(&self) -> usize {
        self.comm.nodes()
    }
    /// Messages and bytes sent and received, by kind.
    pub fn stats(&self) -> &NetStats {
        self.comm.stats()
    }
    /// Cross-node barrier.
    pub fn barrier(&self) -> Result<(), NetError> {
        self.coll.barrier(&self.comm)
    }
    /// Cross-node all-reduce of raw bytes (see [`Collectives::allreduce`]).
    pub fn allreduce(
        &self,
        value: &mut [u8],
        combine: &mut dyn FnMut(&mut [u8], &[u8]),
    ) -> Result<(), NetError> {
        self.coll.allreduce(&self.comm, value, combine)
    }
    /// Aborts the whole job with `cause`.
    pub fn abort(&self, cause: &str) {
        self.comm.abort(cause);
    }
}

impl NodeLink for Cluster {
    fn num_nodes(&self) -> usize {
        self.nodes()
    }
    fn my_node(&self) -> usize {
        self.rank()
    }
    fn traffic(&self) -> Option<Traffic> {
        Some(self.stats().snapshot())
    }
    fn host_words(&self) -> Option<Arc<dyn hyfi_core::link::HostWords>> {
        self.comm.host_words()
    }
    fn port(&self) -> Option<Arc<dyn Port>> {
        Some(Arc::new(self.comm.sender()))
    }
    fn set_service(&self, id: ServiceId, service: Arc<dyn Service>) -> Result<(), LinkError> {
        self.comm
            .set_service(id, service)
            .map_err(|e| Box::new(e) as LinkError)
    }
    fn add_report(&self, section: hyfi_core::link::Report) {
        Cluster::add_report(self, section);
    }
    fn enter_step(&self, step: hyfi_core::Step) -> Result<(), LinkError> {
        self.comm
            .enter_step(step)
            .map_err(|e| Box::new(e) as LinkError)
    }
    fn abort(&self, cause: &str) {
        Cluster::abort(self, cause);
    }
    fn barrier(&self) -> Result<(), LinkError> {
        Cluster::barrier(self).map_err(|e| Box::new(e) as LinkError)
    }
    fn allreduce(
        &self,
        value: &mut [u8],
        combine: &mut dyn FnMut(&mut [u8], &[u8]),
    ) -> Result<(), LinkError> {
        Cluster::allreduce(self, value, combine).map_err(|e| Box::new(e) as LinkError)
    }
    fn allreduce_vec(
        &self,
        value: &mut Vec<u8>,
        combine: &mut dyn FnMut(&mut Vec<u8>, &[u8]),
    ) -> Result<(), LinkError> {
        self.coll
            .allreduce_vec(&self.comm, value, combine)
            .map_err(|e| Box::new(e) as LinkError)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(t) = self
            .signals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            let _ = t.stop();
        }
        if std::thread::panicking() {
            // The program is unwinding past its runtime: the peers would
            // wait for this node at their next barrier. Tell them why.
            let what = last_panic().unwrap_or_else(|| "(no message)".into());
            self.comm.abort(&format!("its program panicked: {what}"));
        }
        // As long as a peer reads its results out of pages homed here: a
        // dead, hung or diverged peer ends the wait (lost link, heartbeat,
        // SPMD step), a live one is served until its program ends.
        self.comm.close(None);
    }
}
