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
