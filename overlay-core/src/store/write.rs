//! The one write of an overlay change: the reducer's result stored through the store.

use timeline_core::key::{SessionId, TargetId};

use super::{Changes, OverlayError, OverlayStore, Snapshot, StoredOverlay, Update};
use crate::overlay::reducer::Change;

/// What [`write()`] did.
#[derive(Clone, Debug, PartialEq)]
pub enum WriteResult {
    /// A new version was stored.
    Written {
        /// The stored version (shared with the store; [`Snapshot::stored`] builds the
        /// whole form).
        stored: Snapshot,
        /// True when the write raised the settlement epoch.
        epoch_raised: bool,
        /// The revision the change was applied to (`None`: the target had no row).
        base_revision: Option<u64>,
        /// What changed from that revision.
        changes: Changes,
    },
    /// The change changed nothing; this is what is stored.
    Unchanged(Option<Snapshot>),
}

impl WriteResult {
    /// The version stored after the call.
    pub fn snapshot(&self) -> Option<&Snapshot> {
        match self {
            WriteResult::Written { stored, .. } => Some(stored),
            WriteResult::Unchanged(s) => s.as_ref(),
        }
    }

    /// The whole stored form after the call, built on first use (O(n)).
    pub fn stored(&self) -> Option<&StoredOverlay> {
        self.snapshot().map(Snapshot::stored)
    }
}

/// Writes `change` to a target atomically (OV-02): through
/// [`OverlayStore::update`], so a stale writer re-applies its change to the current
/// overlay instead of overwriting it.
pub fn write<S: OverlayStore + ?Sized>(
    store: &mut S,
    session: &SessionId,
    target: &TargetId,
    change: &Change,
) -> Result<WriteResult, OverlayError> {
    Ok(match store.update(session, target, change)? {
        Update::Written {
            base_revision,
            stored,
            changes,
        } => WriteResult::Written {
            epoch_raised: changes.raises_epoch,
            stored,
            base_revision,
            changes,
        },
        Update::Unchanged(stored) => WriteResult::Unchanged(stored),
    })
}
