//! The reducer: a [`Change`] applied to a target's rows gives the next rows and what
//! changed ([`apply`], a pure function that knows no store), and live sequence numbers
//! ([`LiveSequencer`]). The rules it keeps and its cost are in [`crate::overlay`].

use std::collections::{BTreeSet, HashMap, HashSet};

use timeline_core::key::{BlockKey, RunId};
use timeline_core::order::SourceOrder;

use crate::rows::{Changes, OverlayRows, RowClass, Runs, StoredBlock};

/// One change to a target's overlay.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Change {
    /// A publisher writes live rows, new or updated (same key replaces), in order: a
    /// later row of the list applies its rules to the rows before it too.
    Publish(Vec<StoredBlock>),
    /// A publisher retracts rows it no longer shows. Never raises the epoch.
    Retract(Vec<BlockKey>),
    /// A latest window loaded a history page holding `history_keys`: rows with those
    /// keys leave; compacting markers of any run other than `current_run` leave; status
    /// rows and progress mirrors leave only when another run is the current run (OV-03,
    /// the seed's table).
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
    /// The agent's history lost rows (OV-10): a replace latest rolled back the latest
    /// turn, or the session went on in a fresh thread. Every ordinary row of a run other
    /// than `current_run` leaves (no history row will ever settle a row of a turn that
    /// is gone, and the rows of older turns are history's), and the settlement epoch
    /// rises, also when no row left: a client holding a window from before the change
    /// loads the latest window again instead of showing what history no longer holds.
    /// Rows without a run and ephemeral rows stay. O(n) in the overlay's rows.
    HistoryRewritten {
        /// The run the message after the rollback starts, whose rows stay.
        current_run: Option<RunId>,
    },
}

/// The next version of an overlay's rows and what changed.
#[derive(Clone, Debug, PartialEq)]
pub struct Next {
    /// The rows to store, in canonical order (they share what did not change with the
    /// rows the change was applied to).
    pub rows: OverlayRows,
    /// What changed: the rows to write, the keys to remove, and whether the epoch rises.
    pub changes: Changes,
}

/// The classes a latest window drops for runs other than the current one, when a run is
/// current (OV-03); with no current run only compacting markers leave.
const WINDOW_DROPS: [RowClass; 3] = [
    RowClass::Status,
    RowClass::CompactingMarker,
    RowClass::ProgressMirror,
];

/// Every ephemeral class (the Codex post-run cleanup removes them all, OV-03).
const EPHEMERAL: [RowClass; 4] = [
    RowClass::Status,
    RowClass::CompactingMarker,
    RowClass::ProgressMirror,
    RowClass::ApprovalCard,
];

/// Applies `change` to `current`. `None` when nothing changes (no write needed). See
/// the module docs for the rules and the cost.
pub fn apply(current: &OverlayRows, change: &Change) -> Option<Next> {
    let mut rows = current.clone();
    let mut touched: BTreeSet<BlockKey> = BTreeSet::new();
    let mut raises_epoch = false;
    match change {
        Change::Publish(published) => {
            for row in published {
                let key = row.block.key();
                let replaced = match row.class {
                    RowClass::Status => rows.ephemeral_keys(RowClass::Status, Runs::Any),
                    RowClass::ProgressMirror => rows
                        .ephemeral_keys(RowClass::ProgressMirror, Runs::NotOf(row.run_id.as_ref())),
                    _ => Vec::new(),
                };
                for old in replaced {
                    rows.remove(&old);
                    touched.insert(old);
                }
                rows.insert(row.clone());
                touched.insert(key);
            }
        }
        Change::Retract(keys) => {
            for key in keys {
                if rows.remove(key).is_some() {
                    touched.insert(key.clone());
                }
            }
        }
        Change::LatestWindow {
            history_keys,
            current_run,
        } => {
            for key in history_keys {
                if let Some(row) = rows.remove(key) {
                    raises_epoch |= row.class == RowClass::Ordinary;
                    touched.insert(key.clone());
                }
            }
            // The seed's table (OV-03): a compacting marker leaves when its run is not
            // the current run; a status row and a progress mirror leave only when
            // another run is the current run (with no current run they stay).
            let classes: &[RowClass] = if current_run.is_some() {
                &WINDOW_DROPS
            } else {
                &[RowClass::CompactingMarker]
            };
            for &class in classes {
                for key in rows.ephemeral_keys(class, Runs::NotOf(current_run.as_ref())) {
                    rows.remove(&key);
                    touched.insert(key);
                }
            }
        }
        Change::Settle(keys) => {
            for key in keys {
                if rows.get(key).is_some_and(|b| b.class == RowClass::Ordinary) {
                    rows.remove(key);
                    raises_epoch = true;
                    touched.insert(key.clone());
                }
            }
        }
        Change::RunCleanup(run) => {
            for class in EPHEMERAL {
                for key in rows.ephemeral_keys(class, Runs::Of(Some(run))) {
                    rows.remove(&key);
                    touched.insert(key);
                }
            }
        }
        Change::HistoryRewritten { current_run } => {
            raises_epoch = true;
            let gone: Vec<BlockKey> = rows
                .iter()
                .filter(|b| {
                    b.class == RowClass::Ordinary
                        && b.run_id.is_some()
                        && b.run_id.as_ref() != current_run.as_ref()
                })
                .map(|b| b.block.key())
                .collect();
            for key in gone {
                rows.remove(&key);
                touched.insert(key);
            }
        }
    }
    let mut changes = Changes {
        raises_epoch,
        ..Changes::default()
    };
    for key in touched {
        match (current.get(&key), rows.get(&key)) {
            (before, after) if before == after => {}
            (_, Some(after)) => changes.upserts.push(after.clone()),
            (_, None) => changes.removals.push(key),
        }
    }
    if changes.is_empty() && !changes.raises_epoch {
        return None;
    }
    changes.upserts.sort_by_cached_key(|b| b.block.order_key());
    Some(Next { rows, changes })
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
