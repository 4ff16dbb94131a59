//! The in-memory reference implementation of the overlay storage traits.
//!
//! It keeps every rule of the traits: compare-and-set on the expected revision, one
//! global counter that never goes back (also after a delete) and stops at 2^53 - 1,
//! epochs that continue across a delete ([`super::created_epoch`]), one row per key. Each target is a [`Snapshot`] over [`super::OverlayRows`]: a write
//! builds the next version in O(k log n) for k changed rows and replaces the stored one,
//! so a snapshot a caller still holds is never copied or changed.

use std::collections::{BTreeMap, BTreeSet};

use timeline_core::key::{RunId, SessionId, TargetId};
use timeline_core::policy::MAX_EXACT_INTEGER;

use super::{
    created_epoch, next_epoch, CleanupJournal, OverlayError, OverlayRows, OverlayStore, Snapshot,
    StoredBlock, StoredOverlay, Update,
};
use crate::overlay::reducer::{apply, Change};

/// In-memory overlay store and cleanup journal.
#[derive(Clone, Debug, Default)]
pub struct MemoryOverlayStore {
    overlays: BTreeMap<(SessionId, TargetId), Snapshot>,
    /// The epoch each deleted target had, until it is written again.
    deleted: BTreeMap<(SessionId, TargetId), u64>,
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
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn set_revision(&mut self, revision: u64) {
        self.revision = revision;
    }
}

impl MemoryOverlayStore {
    /// The next revision from the counter, or [`OverlayError::RevisionExhausted`].
    fn next_revision(&self) -> Result<u64, OverlayError> {
        if self.revision >= MAX_EXACT_INTEGER {
            return Err(OverlayError::RevisionExhausted);
        }
        Ok(self.revision + 1)
    }
}

impl OverlayStore for MemoryOverlayStore {
    fn load(
        &mut self,
        session: &SessionId,
        target: &TargetId,
    ) -> Result<Option<StoredOverlay>, OverlayError> {
        Ok(self
            .overlays
            .get(&(session.clone(), target.clone()))
            .map(Snapshot::to_stored))
    }

    fn compare_and_set(
        &mut self,
        session: &SessionId,
        target: &TargetId,
        expected: Option<u64>,
        epoch: u64,
        blocks: Vec<StoredBlock>,
    ) -> Result<StoredOverlay, OverlayError> {
        let k = (session.clone(), target.clone());
        let current = self.overlays.get(&k);
        if current.map(|o| o.revision) != expected {
            return Err(OverlayError::Stale {
                current: current.map(|c| Box::new(c.to_stored())),
            });
        }
        let epoch = match expected {
            Some(_) => epoch,
            None => created_epoch(epoch, self.deleted.get(&k).copied()),
        };
        let rows =
            OverlayRows::from_blocks(blocks).map_err(|key| OverlayError::DuplicateKey { key })?;
        self.revision = self.next_revision()?;
        let stored = Snapshot::new(self.revision, epoch, rows);
        let whole = stored.to_stored();
        self.deleted.remove(&k);
        self.overlays.insert(k, stored);
        Ok(whole)
    }

    fn update(
        &mut self,
        session: &SessionId,
        target: &TargetId,
        change: &Change,
    ) -> Result<Update, OverlayError> {
        let k = (session.clone(), target.clone());
        let current = self.overlays.get(&k);
        let rows = current.map_or_else(OverlayRows::new, |c| c.rows().clone());
        let Some(next) = apply(&rows, change) else {
            return Ok(Update::Unchanged(current.cloned()));
        };
        let base_revision = current.map(|c| c.revision);
        let epoch = match current {
            Some(c) => next_epoch(Some(c.settlement_epoch), &next.changes),
            None => created_epoch(
                next_epoch(None, &next.changes),
                self.deleted.get(&k).copied(),
            ),
        };
        self.revision = self.next_revision()?;
        let stored = Snapshot::new(self.revision, epoch, next.rows);
        self.deleted.remove(&k);
        self.overlays.insert(k, stored.clone());
        Ok(Update::Written {
            base_revision,
            stored,
            changes: next.changes,
        })
    }

    fn delete(&mut self, session: &SessionId, target: &TargetId) -> Result<bool, OverlayError> {
        let k = (session.clone(), target.clone());
        let Some(gone) = self.overlays.remove(&k) else {
            return Ok(false);
        };
        self.deleted.insert(k, gone.settlement_epoch);
        Ok(true)
    }

    fn targets(&mut self, session: &SessionId) -> Result<Vec<TargetId>, OverlayError> {
        Ok(self
            .overlays
            .keys()
            .filter(|(s, _)| s == session)
            .map(|(_, t)| t.clone())
            .collect())
    }

    fn current_revision(&mut self) -> Result<u64, OverlayError> {
        Ok(self.revision)
    }
}

impl CleanupJournal for MemoryOverlayStore {
    fn add_cleanup(&mut self, session: &SessionId, run: &RunId) -> Result<(), OverlayError> {
        self.journal.insert((session.clone(), run.clone()));
        Ok(())
    }

    fn remove_cleanup(&mut self, session: &SessionId, run: &RunId) -> Result<bool, OverlayError> {
        Ok(self.journal.remove(&(session.clone(), run.clone())))
    }

    fn pending_cleanups(
        &mut self,
        session: Option<&SessionId>,
    ) -> Result<Vec<(SessionId, RunId)>, OverlayError> {
        Ok(self
            .journal
            .iter()
            .filter(|(s, _)| session.is_none_or(|want| want == s))
            .cloned()
            .collect())
    }
}
