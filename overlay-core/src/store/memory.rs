//! The in-memory reference implementation of the overlay storage traits.
//!
//! It keeps every rule of the traits: compare-and-set on the expected revision, one
//! global counter that never goes back (also after a delete) and stops at 2^53 - 1.

use std::collections::{BTreeMap, BTreeSet};

use timeline_core::key::{RunId, SessionId, TargetId};
use timeline_core::policy::MAX_EXACT_INTEGER;

use super::{CleanupJournal, OverlayStore, StoreError, StoredBlock, StoredOverlay, FORMAT_VERSION};

/// In-memory overlay store and cleanup journal.
#[derive(Clone, Debug, Default)]
pub struct MemoryOverlayStore {
    overlays: BTreeMap<(SessionId, TargetId), StoredOverlay>,
    revision: u64,
    journal: BTreeSet<(SessionId, RunId)>,
}

impl MemoryOverlayStore {
    /// An empty store whose counter starts at 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store whose counter has already handed out `revision` (to test the cap).
    pub fn with_revision(revision: u64) -> Self {
        MemoryOverlayStore {
            revision,
            ..Self::default()
        }
    }

    /// Sets the counter (to test the cap).
    #[doc(hidden)]
    pub fn set_revision(&mut self, revision: u64) {
        self.revision = revision;
    }
}

impl OverlayStore for MemoryOverlayStore {
    fn load(
        &mut self,
        session: &SessionId,
        target: &TargetId,
    ) -> Result<Option<StoredOverlay>, StoreError> {
        Ok(self
            .overlays
            .get(&(session.clone(), target.clone()))
            .cloned())
    }

    fn compare_and_set(
        &mut self,
        session: &SessionId,
        target: &TargetId,
        expected: Option<u64>,
        epoch: u64,
        blocks: Vec<StoredBlock>,
    ) -> Result<StoredOverlay, StoreError> {
        let k = (session.clone(), target.clone());
        let current = self.overlays.get(&k);
        if current.map(|o| o.revision) != expected {
            return Err(StoreError::Stale {
                current: current.cloned().map(Box::new),
            });
        }
        if self.revision >= MAX_EXACT_INTEGER {
            return Err(StoreError::RevisionExhausted);
        }
        self.revision += 1;
        let stored = StoredOverlay {
            format_version: FORMAT_VERSION,
            settlement_epoch: epoch,
            revision: self.revision,
            blocks,
        };
        self.overlays.insert(k, stored.clone());
        Ok(stored)
    }

    fn delete(&mut self, session: &SessionId, target: &TargetId) -> Result<bool, StoreError> {
        Ok(self
            .overlays
            .remove(&(session.clone(), target.clone()))
            .is_some())
    }

    fn targets(&mut self, session: &SessionId) -> Result<Vec<TargetId>, StoreError> {
        Ok(self
            .overlays
            .keys()
            .filter(|(s, _)| s == session)
            .map(|(_, t)| t.clone())
            .collect())
    }

    fn current_revision(&mut self) -> Result<u64, StoreError> {
        Ok(self.revision)
    }
}

impl CleanupJournal for MemoryOverlayStore {
    fn add_cleanup(&mut self, session: &SessionId, run: &RunId) -> Result<(), StoreError> {
        self.journal.insert((session.clone(), run.clone()));
        Ok(())
    }

    fn remove_cleanup(&mut self, session: &SessionId, run: &RunId) -> Result<bool, StoreError> {
        Ok(self.journal.remove(&(session.clone(), run.clone())))
    }

    fn pending_cleanups(
        &mut self,
        session: Option<&SessionId>,
    ) -> Result<Vec<(SessionId, RunId)>, StoreError> {
        Ok(self
            .journal
            .iter()
            .filter(|(s, _)| session.is_none_or(|want| want == s))
            .cloned()
            .collect())
    }
}
