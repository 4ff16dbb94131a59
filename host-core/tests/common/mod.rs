//! Test doubles shared by the host's integration tests.
#![allow(dead_code)]

use overlay_core::overlay::Change;
use overlay_core::store::{StoreError, Update};
use overlay_core::{CleanupJournal, MemoryOverlayStore, OverlayStore, StoredBlock, StoredOverlay};
use timeline_core::{RunId, SessionId, TargetId};

/// An overlay store that refuses writes (and, with `reads_off`, reads) while told to.
#[derive(Default)]
pub struct Flaky {
    pub inner: MemoryOverlayStore,
    pub writes_off: bool,
    pub reads_off: bool,
}

fn down() -> StoreError {
    StoreError::Unavailable("the disk is gone".into())
}

impl OverlayStore for Flaky {
    fn load(&mut self, s: &SessionId, t: &TargetId) -> Result<Option<StoredOverlay>, StoreError> {
        if self.reads_off {
            return Err(down());
        }
        self.inner.load(s, t)
    }
    fn compare_and_set(
        &mut self,
        s: &SessionId,
        t: &TargetId,
        expected: Option<u64>,
        epoch: u64,
        blocks: Vec<StoredBlock>,
    ) -> Result<StoredOverlay, StoreError> {
        if self.writes_off {
            return Err(down());
        }
        self.inner.compare_and_set(s, t, expected, epoch, blocks)
    }
    fn update(
        &mut self,
        s: &SessionId,
        t: &TargetId,
        change: &Change,
    ) -> Result<Update, StoreError> {
        if self.writes_off {
            return Err(down());
        }
        self.inner.update(s, t, change)
    }
    fn delete(&mut self, s: &SessionId, t: &TargetId) -> Result<bool, StoreError> {
        self.inner.delete(s, t)
    }
    fn targets(&mut self, s: &SessionId) -> Result<Vec<TargetId>, StoreError> {
        self.inner.targets(s)
    }
    fn current_revision(&mut self) -> Result<u64, StoreError> {
        self.inner.current_revision()
    }
}

impl CleanupJournal for Flaky {
    fn add_cleanup(&mut self, s: &SessionId, r: &RunId) -> Result<(), StoreError> {
        self.inner.add_cleanup(s, r)
    }
    fn remove_cleanup(&mut self, s: &SessionId, r: &RunId) -> Result<bool, StoreError> {
        self.inner.remove_cleanup(s, r)
    }
    fn pending_cleanups(
        &mut self,
        s: Option<&SessionId>,
    ) -> Result<Vec<(SessionId, RunId)>, StoreError> {
        self.inner.pending_cleanups(s)
    }
}
