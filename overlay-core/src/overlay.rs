//! Overlay changes, settlement and the compare-and-set write loop (OV-01 to OV-04).
//!
//! Every change to a target's overlay is a [`Change`] value. [`apply`] computes the next
//! rows and epoch from the current snapshot (a pure function), and [`write`] stores the
//! result with compare-and-set, re-applying the change to the current snapshot when
//! another writer got there first. So a stale writer never overwrites, and the rules
//! below hold whatever the interleaving:
//!
//! - the settlement epoch rises only in a write that removes at least one ordinary row
//!   because history now holds its key (OV-04); ephemeral removals and retractions never
//!   raise it;
//! - a newer status row replaces the target's other status rows; a progress mirror from
//!   one run replaces mirrors from other runs; a latest window drops status rows,
//!   compacting markers and mirrors of runs that are not the current run; the Codex
//!   post-run cleanup removes every ephemeral row of its run; approval cards leave only
//!   with that cleanup (OV-03);
//! - an overlay that becomes empty is still stored, so the target keeps its epoch and
//!   revision (OV-02).

use std::collections::{HashMap, HashSet};

use timeline_core::key::{BlockKey, RunId, SessionId, TargetId};
use timeline_core::order::SourceOrder;

use crate::store::{OverlayStore, RowClass, StoreError, StoredBlock, StoredOverlay};

/// One change to a target's overlay.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Change {
    /// A publisher writes live rows, new or updated (same key replaces).
    Publish(Vec<StoredBlock>),
    /// A publisher retracts rows it no longer shows. Never raises the epoch.
    Retract(Vec<BlockKey>),
    /// A latest window loaded a history page holding `history_keys`: rows with those
    /// keys leave, and status rows, compacting markers and progress mirrors of any run
    /// other than `current_run` leave too.
    LatestWindow {
        /// Keys the loaded page holds.
        history_keys: HashSet<BlockKey>,
        /// The session's active run, if any.
        current_run: Option<RunId>,
    },
    /// An exact scan found these keys in history (Codex): those ordinary rows leave.
    Settle(HashSet<BlockKey>),
    /// The Codex post-run cleanup: every ephemeral row of the run leaves.
    RunCleanup(RunId),
}

/// The next state of an overlay.
#[derive(Clone, Debug, PartialEq)]
pub struct Next {
    /// The settlement epoch to store.
    pub epoch: u64,
    /// The rows to store, in canonical order.
    pub blocks: Vec<StoredBlock>,
}

/// Applies `change` to `current`. `None` when nothing changes (no write needed).
pub fn apply(current: Option<&StoredOverlay>, change: &Change) -> Option<Next> {
    let epoch = current.map_or(0, |c| c.settlement_epoch);
    let old: &[StoredBlock] = current.map_or(&[], |c| c.blocks.as_slice());
    let mut raise = false;
    // Stored rows are in canonical order; removals keep that order, so only a publish
    // sorts.
    let blocks: Vec<StoredBlock> = match change {
        Change::Publish(rows) => {
            let mut blocks = old.to_vec();
            for row in rows {
                let key = row.block.key();
                blocks.retain(|b| {
                    let same_key = b.block.key() == key;
                    let older_status = row.class == RowClass::Status && b.class == RowClass::Status;
                    let other_mirror = row.class == RowClass::ProgressMirror
                        && b.class == RowClass::ProgressMirror
                        && b.run_id != row.run_id;
                    !(same_key || older_status || other_mirror)
                });
                blocks.push(row.clone());
            }
            blocks.sort_by_cached_key(|b| b.block.order_key());
            if current.is_some() && blocks == old {
                return None;
            }
            blocks
        }
        Change::Retract(keys) => {
            let keys: HashSet<&BlockKey> = keys.iter().collect();
            keep(old, |b| !keys.contains(&b.block.key()))?
        }
        Change::LatestWindow {
            history_keys,
            current_run,
        } => keep(old, |b| {
            if history_keys.contains(&b.block.key()) {
                raise |= b.class == RowClass::Ordinary;
                return false;
            }
            let window_drops = matches!(
                b.class,
                RowClass::Status | RowClass::CompactingMarker | RowClass::ProgressMirror
            );
            !(window_drops && b.run_id.as_ref() != current_run.as_ref())
        })?,
        Change::Settle(keys) => keep(old, |b| {
            let settles = b.class == RowClass::Ordinary && keys.contains(&b.block.key());
            raise |= settles;
            !settles
        })?,
        Change::RunCleanup(run) => keep(old, |b| {
            !(b.class.is_ephemeral() && b.run_id.as_ref() == Some(run))
        })?,
    };
    if current.is_none() && blocks.is_empty() {
        return None;
    }
    Some(Next {
        epoch: if raise { epoch + 1 } else { epoch },
        blocks,
    })
}

/// The rows `keep_row` keeps, or `None` when it keeps them all (nothing changes).
fn keep(
    old: &[StoredBlock],
    mut keep_row: impl FnMut(&StoredBlock) -> bool,
) -> Option<Vec<StoredBlock>> {
    let keep_flags: Vec<bool> = old.iter().map(&mut keep_row).collect();
    if keep_flags.iter().all(|k| *k) {
        return None;
    }
    Some(
        old.iter()
            .zip(keep_flags)
            .filter(|(_, k)| *k)
            .map(|(b, _)| b.clone())
            .collect(),
    )
}

/// What [`write`] did.
#[derive(Clone, Debug, PartialEq)]
pub enum WriteResult {
    /// A new snapshot was stored; `epoch_raised` says whether settlement happened.
    Written {
        /// The stored snapshot.
        stored: StoredOverlay,
        /// True when the write raised the settlement epoch.
        epoch_raised: bool,
    },
    /// The change changed nothing; this is what is stored.
    Unchanged(Option<StoredOverlay>),
}

impl WriteResult {
    /// The snapshot stored after the call.
    pub fn stored(&self) -> Option<&StoredOverlay> {
        match self {
            WriteResult::Written { stored, .. } => Some(stored),
            WriteResult::Unchanged(s) => s.as_ref(),
        }
    }
}

/// Writes `change` to a target atomically (OV-02): through
/// [`OverlayStore::update`], so a stale writer re-applies its change to the current
/// snapshot instead of overwriting it.
pub fn write<S: OverlayStore + ?Sized>(
    store: &mut S,
    session: &SessionId,
    target: &TargetId,
    change: &Change,
) -> Result<WriteResult, StoreError> {
    let mut next =
        |current: Option<&StoredOverlay>| apply(current, change).map(|n| (n.epoch, n.blocks));
    let update = store.update(session, target, &mut next)?;
    Ok(match update.written {
        Some(stored) => WriteResult::Written {
            epoch_raised: stored.settlement_epoch
                > update.before.as_ref().map_or(0, |b| b.settlement_epoch),
            stored,
        },
        None => WriteResult::Unchanged(update.before),
    })
}

/// Hands out live sequence numbers (TL-05 `[2, sequence]`): a row gets its number once,
/// when it first enters its run, so every rebuild places it the same way.
#[derive(Clone, Debug, Default)]
pub struct LiveSequencer {
    next: u64,
    assigned: HashMap<(RunId, BlockKey), u64>,
}

impl LiveSequencer {
    /// A sequencer starting at 1.
    pub fn new() -> Self {
        Self::default()
    }

    /// The source order of `key` in `run`, assigning it on first use.
    pub fn source_order(&mut self, run: &RunId, key: &BlockKey) -> SourceOrder {
        let next = &mut self.next;
        let seq = *self
            .assigned
            .entry((run.clone(), key.clone()))
            .or_insert_with(|| {
                *next += 1;
                *next
            });
        SourceOrder::live(seq)
    }

    /// Forgets the numbers of a run that ended.
    pub fn end_run(&mut self, run: &RunId) {
        self.assigned.retain(|(r, _), _| r != run);
    }
}
