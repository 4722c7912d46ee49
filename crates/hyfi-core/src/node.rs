//! The node-level seam: what the runtime asks of the cluster layer.
//!
//! hyfi-core runs one node. A phase ends with a barrier and reductions
//! combine private copies on the node; both then take a *node-level step*
//! through a [`NodeLink`], which the cluster layer (hyfi-net) implements over
//! the network. On one node it is [`SingleNode`], where both steps are
//! no-ops.

/// Errors a link reports (a lost peer, a timeout, ...).
pub type LinkError = Box<dyn std::error::Error + Send + Sync>;

/// Cross-node operations the runtime needs. Called by one server thread per
/// node (the master, processor 0), in the same order on every node.
pub trait NodeLink: Send + Sync + 'static {
    /// Number of nodes.
    fn num_nodes(&self) -> usize;
    /// This node's index.
    fn my_node(&self) -> usize;
    /// Returns once every node has entered the barrier.
    fn barrier(&self) -> Result<(), LinkError>;
    /// Combines `value` (one per node, all the same length) across nodes with
    /// `combine(acc, other)`, in node order 0, 1, ... so that the result is
    /// reproducible bit for bit; on return `value` holds the result on every
    /// node.
    fn allreduce(
        &self,
        value: &mut [u8],
        combine: &mut dyn FnMut(&mut [u8], &[u8]),
    ) -> Result<(), LinkError>;
    /// The link's own counters (messages, bytes), for printing; `None` if it
    /// keeps none.
    fn traffic(&self) -> Option<String> {
        None
    }
    /// The link as `Any`, so a layer above can reach the cluster type
    /// behind it (the DSM needs the communication thread); `None` if the
    /// link does not offer it.
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }
}

/// Work a layer must do at the end of every phase, on every node, in place
/// of the plain node-level barrier: the DSM's release (diffs to the homes,
/// write notices, invalidations), which is itself a barrier.
///
/// Called by the master processor of each node after every processor of
/// the node has finished the phase's pools, before the post-phase code.
pub trait PhaseEnd: Send + Sync + 'static {
    /// Ends phase `phase` (its index in the program) on this node; must not
    /// return before every node has ended it too.
    fn end_phase(&self, phase: usize, link: &dyn NodeLink) -> Result<(), LinkError>;
    /// Called when an access epoch ends (see `Ctx::access_epoch`): after a
    /// phase's filaments, after its post-phase code, and before a new
    /// command (program or fork-join run) begins. No filament runs then.
    fn access_epoch_ended(&self) {}
    /// The hook as `Any`, so its layer can find its own state again on a
    /// runtime it already set up.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// The link of a one-node run.
#[derive(Clone, Copy, Debug, Default)]
pub struct SingleNode;

impl NodeLink for SingleNode {
    fn num_nodes(&self) -> usize {
        1
    }
    fn my_node(&self) -> usize {
        0
    }
    fn barrier(&self) -> Result<(), LinkError> {
        Ok(())
    }
    fn allreduce(
        &self,
        _value: &mut [u8],
        _combine: &mut dyn FnMut(&mut [u8], &[u8]),
    ) -> Result<(), LinkError> {
        Ok(())
    }
}
