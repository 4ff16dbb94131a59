//! Storage traits of the host overlay (OV-01, OV-02, OV-06), with the in-memory reference
//! implementation in [`memory`] and the indexed overlay every store keeps in [`rows`].
//!
//! One trait per aggregate:
//! - [`OverlayStore`]: one overlay per (app session, timeline target), and the single
//!   global revision counter. A write is a compare-and-set on the revision the writer
//!   read, and takes its new revision from the counter **in the same transaction**; a
//!   stale writer gets [`OverlayError::Stale`] with the current snapshot and retries
//!   against it. [`OverlayStore::update`] is that loop for one [`Change`]; a store that
//!   keeps [`OverlayRows`] overrides it so a write costs O(k log n) for k changed rows in
//!   an n-row overlay and persists only the rows that changed.
//! - [`CleanupJournal`]: the rows of `chat_pending_terminal_overlay_cleanups` (session,
//!   run) that keep a Codex post-run cleanup alive across failures and restarts.
//!
//! Backends must keep these rules; the conformance suite in `fixtures` checks them
//! against every backend:
//! - the counter never hands out a revision twice, even after a target is deleted;
//! - a target's settlement epoch never starts over: a target written again after a
//!   delete starts one above the epoch it was deleted at ([`created_epoch`]), whatever
//!   epoch the write asks for (see below);
//! - the counter refuses to pass 9,007,199,254,740,991 ([`OverlayError::RevisionExhausted`]);
//! - an empty overlay is stored like any other, so the target keeps its epoch and
//!   revision;
//! - one row per key: rows that hold a key twice are refused
//!   ([`OverlayError::DuplicateKey`]) and never stored;
//! - a row that cannot be decoded is reported as [`OverlayError::Corrupt`], never dropped.
//!
//! # A deleted target that comes back
//!
//! Clients compare a target's overlays by `(settlementEpoch, revision)` and never go back
//! to a lower epoch (TL-06): a live update or a latest window with a lower epoch than the
//! one a client holds is ignored as stale. If a target written again after a delete
//! started at epoch 0, every client that still held the old target's higher epoch would
//! ignore its live updates (and the live hub would take them for older snapshots) until
//! that client opened the target anew. So epochs continue across a delete, like
//! revisions do: a store remembers the epoch each deleted target had, and the target's
//! next first write stores at least one more than it. One more rather than the same: a
//! delete takes rows away without saying whether history holds them, so it is a
//! settlement fence like OV-04's. A client that held the old target sees a higher epoch
//! in the next live update, keeps its rows and loads a latest window (history and the
//! new overlay in one step) instead of dropping rows that history may hold. The
//! remembered epoch leaves the store when the target is written again.

mod cache;
pub mod memory;
mod write;

use timeline_core::key::{BlockKey, RunId, SessionId, TargetId};
use timeline_core::policy::MAX_EXACT_INTEGER;

use crate::overlay::reducer::{apply, Change};
pub use crate::rows;
pub use crate::rows::{
    Changes, OverlayRows, RowClass, Runs, Snapshot, StoredBlock, StoredOverlay, FORMAT_VERSION,
};
pub use cache::{OverlayCache, OVERLAY_CACHE_TARGETS};
pub use write::{write, WriteResult};

/// Why a store call failed, grouped by what the caller does next.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum OverlayError {
    /// Compare-and-set lost: another writer stored `current` since the caller read.
    /// Retry against it.
    #[error("stale overlay write: the target changed since it was read")]
    Stale {
        /// What is stored now (`None`: no row).
        current: Option<Box<StoredOverlay>>,
    },
    /// The global revision counter would pass 2^53 - 1.
    #[error("overlay revision counter exhausted at 9007199254740991")]
    RevisionExhausted,
    /// A stored row could not be decoded; it is kept, not dropped.
    #[error("stored overlay for {what} cannot be decoded: {reason}")]
    Corrupt {
        /// Which row.
        what: String,
        /// The decoder's message.
        reason: String,
    },
    /// The backend could not be read or written (retry later).
    #[error("overlay store unavailable: {0}")]
    Unavailable(String),
    /// This host does not hold the lease of the session's scope (a store shared by
    /// several hosts refused the write): nothing was written, and the host that holds
    /// the lease serves the session.
    #[error("session lease lost: {message}")]
    LeaseLost {
        /// The base session of the scope.
        session: SessionId,
        /// What happened, for the user or the log.
        message: String,
    },
    /// The rows handed to the store hold this key twice (OV-01: one row per key).
    /// Nothing was written; the caller's rows are wrong.
    #[error("overlay rows hold the key {key} twice")]
    DuplicateKey {
        /// The key.
        key: BlockKey,
    },
}

/// Overlays and the global revision counter.
pub trait OverlayStore {
    /// The saved overlay of a target, if any, whole (O(n)).
    fn load(
        &mut self,
        session: &SessionId,
        target: &TargetId,
    ) -> Result<Option<StoredOverlay>, OverlayError>;

    /// Stores `blocks` (in any order; stored in canonical order) with `epoch` if the
    /// target's revision is still `expected` (`None`: no row yet), taking the next
    /// revision from the global counter in the same transaction. Returns what was
    /// stored. A stale `expected` is [`OverlayError::Stale`]; rows that hold a key twice
    /// are [`OverlayError::DuplicateKey`]. A target created again after a delete stores
    /// [`created_epoch`]`(epoch, ..)`, not a lower epoch. This replaces the whole
    /// overlay: a writer of one change uses [`OverlayStore::update`].
    fn compare_and_set(
        &mut self,
        session: &SessionId,
        target: &TargetId,
        expected: Option<u64>,
        epoch: u64,
        blocks: Vec<StoredBlock>,
    ) -> Result<StoredOverlay, OverlayError>;

    /// Reads the target, applies `change` ([`crate::overlay::apply`]) and stores the
    /// result with the next revision, as one atomic step; nothing is written when the
    /// change changes nothing.
    ///
    /// The default is the compare-and-set loop over [`OverlayStore::load`] and
    /// [`OverlayStore::compare_and_set`] (O(n) per write): a stale attempt re-applies the
    /// change to the current overlay, up to [`MAX_WRITE_ATTEMPTS`] times. The memory and
    /// SQLite stores override it with one step over the [`OverlayRows`] they keep, in
    /// O(k log n) for k changed rows, writing only those rows.
    fn update(
        &mut self,
        session: &SessionId,
        target: &TargetId,
        change: &Change,
    ) -> Result<Update, OverlayError> {
        let mut current = self.load(session, target)?;
        for _ in 0..MAX_WRITE_ATTEMPTS {
            let rows = match &current {
                Some(c) => OverlayRows::from_blocks(c.blocks.clone()).map_err(|key| {
                    OverlayError::Corrupt {
                        what: format!("overlay {session}/{target}"),
                        reason: format!("the stored overlay holds two blocks with the key {key}"),
                    }
                })?,
                None => OverlayRows::new(),
            };
            let Some(next) = apply(&rows, change) else {
                let unchanged =
                    current.map(|c| Snapshot::new(c.revision, c.settlement_epoch, rows));
                return Ok(Update::Unchanged(unchanged));
            };
            let base_revision = current.as_ref().map(|c| c.revision);
            let epoch = next_epoch(current.as_ref().map(|c| c.settlement_epoch), &next.changes);
            match self.compare_and_set(session, target, base_revision, epoch, next.rows.to_blocks())
            {
                Ok(stored) => {
                    return Ok(Update::Written {
                        base_revision,
                        stored: Snapshot::new(stored.revision, stored.settlement_epoch, next.rows),
                        changes: next.changes,
                    })
                }
                Err(OverlayError::Stale { current: now }) => current = now.map(|b| *b),
                Err(e) => return Err(e),
            }
        }
        Err(OverlayError::Unavailable(format!(
            "overlay write lost {MAX_WRITE_ATTEMPTS} compare-and-set races in a row"
        )))
    }

    /// Deletes a target's overlay. The counter keeps its value, and the store remembers
    /// the target's epoch, so a later first write of the target stores
    /// [`created_epoch`] (through [`OverlayStore::compare_and_set`] with `expected:
    /// None` as well as through [`OverlayStore::update`]).
    fn delete(&mut self, session: &SessionId, target: &TargetId) -> Result<bool, OverlayError>;

    /// Every target of a session that has a stored overlay.
    fn targets(&mut self, session: &SessionId) -> Result<Vec<TargetId>, OverlayError>;

    /// The last revision the counter handed out (0 before the first write).
    fn current_revision(&mut self) -> Result<u64, OverlayError>;
}

/// The epoch a write stores: the stored one (0 for a new target), plus one when the
/// change settled an ordinary row (OV-04).
pub fn next_epoch(stored: Option<u64>, changes: &Changes) -> u64 {
    let epoch = stored.unwrap_or(0);
    if changes.raises_epoch {
        epoch.saturating_add(1)
    } else {
        epoch
    }
}

/// The epoch the first write of a target stores: `asked` (what the write computed, 0
/// for a target that never had rows), raised to one above `deleted_at`, the epoch the
/// target had when it was last deleted, if it was (see the module docs). Capped at
/// 2^53 - 1 like every stored number.
pub fn created_epoch(asked: u64, deleted_at: Option<u64>) -> u64 {
    match deleted_at {
        Some(deleted) => asked.max(deleted.saturating_add(1).min(MAX_EXACT_INTEGER)),
        None => asked,
    }
}

/// How many times the default [`OverlayStore::update`] re-applies a change after losing
/// a compare-and-set.
pub const MAX_WRITE_ATTEMPTS: usize = 16;

/// What [`OverlayStore::update`] did.
#[derive(Clone, Debug, PartialEq)]
pub enum Update {
    /// The change changed the overlay and this was stored.
    Written {
        /// The revision the change was applied to (`None`: the target had no row).
        base_revision: Option<u64>,
        /// What is stored now.
        stored: Snapshot,
        /// What changed from the base.
        changes: Changes,
    },
    /// The change changed nothing; nothing was written. This is what is stored.
    Unchanged(Option<Snapshot>),
}

/// The terminal-cleanup journal (OV-06).
pub trait CleanupJournal {
    /// Records (session, run); recording it twice keeps one row.
    fn add_cleanup(&mut self, session: &SessionId, run: &RunId) -> Result<(), OverlayError>;
    /// Removes the row; false when there was none.
    fn remove_cleanup(&mut self, session: &SessionId, run: &RunId) -> Result<bool, OverlayError>;
    /// The pending rows of one session, or of all sessions.
    fn pending_cleanups(
        &mut self,
        session: Option<&SessionId>,
    ) -> Result<Vec<(SessionId, RunId)>, OverlayError>;
}
