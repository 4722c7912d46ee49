//! The shared memory as hyfi-core's phase-end hook: the release at every
//! phase's end, and the check at every access epoch's end that no
//! footprint view outlived it. Apart from `core` so that the protocol does
//! not depend on the views built on top of it.

use std::sync::Arc;

use crate::core::Core;
use crate::error::ReleaseError;

/// The release as hyfi-core's phase-end hook.
pub(crate) struct Hook(pub(crate) Arc<Core>);

impl hyfi_core::PhaseEnd for Hook {
    fn end_phase(
        &self,
        phase: usize,
        link: &dyn hyfi_core::NodeLink,
    ) -> Result<(), hyfi_core::LinkError> {
        self.0
            .release(phase, link, None)
            .map_err(|e| ended_by(e, link))
    }
    fn end_phase_reducing(
        &self,
        phase: usize,
        link: &dyn hyfi_core::NodeLink,
        value: &mut [u8],
        combine: &mut dyn FnMut(&mut [u8], &[u8]),
    ) -> Result<(), hyfi_core::LinkError> {
        let carried = crate::core::Carried { value, combine };
        self.0
            .release(phase, link, Some(carried))
            .map_err(|e| ended_by(e, link))
    }
    fn access_epoch_ended(&self) {
        // Reaped first: a registered view counts as live until then.
        self.0.reap_plain();
        crate::footprint::check_no_live_views(&self.0);
        self.0.end_access_epoch();
    }
}

/// A release's error as the runtime's link error; one this node found
/// itself (a peer's malformed `REL`, a broadcast that never came, nodes that
/// name different reductions) first ends the job on every node with it, so
/// that the peers, which wait for this node's next release, report the
/// cause rather than that this node left.
fn ended_by(e: ReleaseError, link: &dyn hyfi_core::NodeLink) -> hyfi_core::LinkError {
    if e.found_here() {
        link.abort(&e.to_string());
    }
    e.into()
}
