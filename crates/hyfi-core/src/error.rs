//! The one error type of hyfi-core, and of a hyfi program: the layers above
//! (hyfi-net, hyfi-dsm, a layer of your own) convert their errors into it
//! ([`Error::Layer`], whose source is the layer's own error), so a `main`
//! returning `Result<(), Error>` can `?` them all. Every message says what
//! happened and what to change.

use std::io;

/// What went wrong in the single-node runtime.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Zero processors were asked for.
    #[error("invalid configuration: {source_name} asks for 0 processors; ask for at least 1")]
    ZeroProcs {
        /// Where the value came from (`HYFI_PROCS` or `Config::procs`).
        source_name: &'static str,
    },

    /// More processors than the machine lets this process use, with pinning on.
    #[error(
        "invalid configuration: {requested} processors requested but this node may run on \
         only {available} CPUs (those allowed to the process, divided between the nodes of the \
         job on this host); with pinning on (HYFI_PIN=1 / Config::pin(true)) each server \
         thread needs a CPU of its own. Ask for at most {available}, or set HYFI_PIN=0 to \
         oversubscribe"
    )]
    TooManyProcs {
        /// Processors asked for.
        requested: usize,
        /// CPUs this node may use: the process's affinity mask, or this
        /// node's share of it when several nodes run on one host.
        available: usize,
    },

    /// An environment variable that hyfi reads holds a value it cannot use.
    #[error("invalid configuration: {var}={value:?} is not valid: expected {expected}")]
    BadEnv {
        /// The variable's name.
        var: &'static str,
        /// What it held.
        value: String,
        /// What it should hold.
        expected: &'static str,
    },

    /// A filthread stack size outside the supported range.
    #[error(
        "invalid configuration: filthread stack size {requested} bytes is outside \
         {min}..={max}; set HYFI_STACK_SIZE or Config::stack_size within that range"
    )]
    BadStackSize {
        /// Bytes asked for.
        requested: usize,
        /// Smallest supported.
        min: usize,
        /// Largest supported.
        max: usize,
    },

    /// The OS refused to start a server thread.
    #[error("could not start server thread {proc}: {source}; lower HYFI_PROCS or check ulimit -u")]
    Spawn {
        /// Processor index.
        proc: usize,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// Pinning a server thread to its CPU failed.
    #[error(
        "could not pin server thread {proc} to CPU {cpu}: {source}; set HYFI_PIN=0 to run unpinned"
    )]
    Pin {
        /// Processor index.
        proc: usize,
        /// CPU it was to be pinned to.
        cpu: usize,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// The OS refused to map a filthread stack.
    #[error(
        "could not map a {size}-byte filthread stack: {source}; lower HYFI_STACK_SIZE or raise \
         vm.max_map_count"
    )]
    StackMap {
        /// Stack size asked for.
        size: usize,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// A filament (or post-phase code, or a fork-join closure) panicked.
    #[error("a filament panicked on node {node}, processor {proc} ({during}): {message}")]
    FilamentPanic {
        /// Node on which it ran.
        node: usize,
        /// Processor on which it ran.
        proc: usize,
        /// What was running: "phase 1 filament", "phase 0 post-phase", "fork-join".
        during: String,
        /// The panic message.
        message: String,
    },

    /// `Runtime::get` of a reduction whose copies each hold a part of its
    /// value: filaments updated it since the last reduce or set.
    #[error(
        "Runtime::get on a reduction that filaments updated since its last reduce or set: its \
         copies (one per processor, chunk and node) each hold a part of the result, so no one \
         of them is its value; reduce it first (Runtime::reduce after a run, on every node; \
         PostPhase::reduce in a phase's post-phase code)"
    )]
    Unreduced,

    /// `start`/`run` was called from inside a filament of the same runtime,
    /// which would deadlock.
    #[error(
        "Runtime::start/run called from inside a filament of the same runtime; \
         nest parallelism with Ctx::join instead"
    )]
    Nested,

    /// A phase program with no phases.
    #[error("the program has no phases; add one with Program::phase before Runtime::start")]
    EmptyProgram,

    /// A pool array built for a different runtime shape.
    #[error(
        "phase {phase}: its pool array has {pool_procs} processors but the runtime has {procs}; \
         build it with PoolArray::new(&runtime, ..)"
    )]
    PoolShape {
        /// Phase index.
        phase: usize,
        /// Processors the pool array was made for.
        pool_procs: usize,
        /// Processors the runtime has.
        procs: usize,
    },

    /// A reduction used with a runtime other than the one that created it.
    #[error("reduction variable belongs to another runtime; create it with this runtime's Runtime::reduction")]
    ForeignReduction,

    /// The cross-node layer failed (a lost peer, a refused connection, ...).
    #[error("{0}")]
    Link(#[source] Box<dyn std::error::Error + Send + Sync>),

    /// A node received a fork-join filament whose function it has not registered.
    #[error(
        "node {node} received a fork-join filament of function {name:?}, which is not \
         registered there; call RemoteFn::register for it on every node before run_distributed"
    )]
    UnknownFilament {
        /// The node that received it.
        node: usize,
        /// The function's name.
        name: String,
    },

    /// Two different functions were registered under one name.
    #[error(
        "two different fork-join functions are registered as {name:?}; give each RemoteFn a \
         name of its own"
    )]
    DuplicateFilament {
        /// The name.
        name: String,
    },

    /// A shipped filament's argument or result could not be encoded or decoded.
    #[error(
        "fork-join filament {name:?} on node {node}: {why}; every node must run the same \
         program (same types under the same names)"
    )]
    FilamentCodec {
        /// The node where it failed.
        node: usize,
        /// The function's name.
        name: String,
        /// What failed.
        why: String,
    },

    /// A multi-node runtime has no cross-node fork-join layer.
    #[error(
        "run_distributed on {nodes} nodes needs the cluster layer's fork-join messaging; start \
         the runtime with hyfi::init (or install it with hyfi::layers::steal::install)"
    )]
    NoBalancer {
        /// Nodes of the runtime.
        nodes: usize,
    },

    /// Cross-node fork-join was installed twice on one runtime
    /// (`steal::install`).
    #[error("this runtime already has cross-node fork-join: install it once per runtime")]
    BalancerTaken,

    /// A second phase-end hook was installed on one runtime.
    #[error("this runtime already has a phase-end hook (a DSM): create one DSM per runtime and share it")]
    PhaseEndTaken,

    /// A layer stored a second state of one type on one runtime
    /// (`RuntimeExt::set_layer_state`).
    #[error(
        "this runtime already has a layer state of type {state}: a layer sets up its state \
         once per runtime and finds it again with RuntimeExt::layer_state"
    )]
    LayerStateTaken {
        /// The state's type.
        state: &'static str,
    },

    /// A layer above this one failed: the cluster layer could not start,
    /// find or keep this node's peers (`hyfi::init`), the shared memory
    /// could not reserve its region or make an allocation (`Dsm::new`,
    /// `Dsm::vec`), or a setting of the layer is not valid. Shows the
    /// layer's message; its [`source`](std::error::Error::source) is the
    /// layer's own error (`hyfi_net::NetError`, `hyfi_dsm::DsmError`), for
    /// a caller that wants to match on it (downcast it).
    #[error("{source}")]
    Layer {
        /// The layer, by its crate's name: `"hyfi-net"`, `"hyfi-dsm"`.
        layer: &'static str,
        /// Whether it is a setting to change (a `HYFI_*` variable, a node
        /// count): a configuration error, exit code 2
        /// ([`Error::exit_code`]).
        config: bool,
        /// The layer's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// The trace file (`HYFI_TRACE`, `Config::trace`) cannot be written:
    /// found when the runtime starts, not after the run.
    #[error(
        "cannot write the trace file {path} (HYFI_TRACE / Config::trace): {source}; \
         name a file in a directory this user can write"
    )]
    TraceFile {
        /// The file this node would write.
        path: std::path::PathBuf,
        /// Why not.
        source: std::io::Error,
    },
}

impl Error {
    /// Whether this is a configuration error: a setting to change before
    /// running again.
    pub fn is_config(&self) -> bool {
        matches!(
            self,
            Error::ZeroProcs { .. }
                | Error::TooManyProcs { .. }
                | Error::BadEnv { .. }
                | Error::BadStackSize { .. }
                | Error::Layer { config: true, .. }
                | Error::TraceFile { .. }
        )
    }

    /// The exit code a program should end with for this error, as hyfi's
    /// launchers do (the README's table): 2 for a configuration error, 1
    /// for any other.
    ///
    /// ```
    /// let e = hyfi::Error::BadEnv {
    ///     var: "HYFI_PROCS",
    ///     value: "abc".into(),
    ///     expected: "a processor count",
    /// };
    /// assert_eq!(e.exit_code(), 2);
    /// assert_eq!(hyfi::Error::EmptyProgram.exit_code(), 1);
    /// ```
    pub fn exit_code(&self) -> i32 {
        if self.is_config() {
            2
        } else {
            1
        }
    }
}

/// A failed node-level step inside post-phase code (or a wait of a
/// filament), carried out by unwinding: the runtime returns the error, not a
/// filament panic.
pub(crate) struct LinkAbort(pub(crate) Error);

/// Extracts the message of a panic payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(panic payload is not a string)".to_string()
    }
}

/// Debug shows the message (as `anyhow` does), so that `?` in a `main`
/// returning `Result<(), Box<dyn Error>>` prints what happened and what to
/// change, not the variant's fields.
impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}
