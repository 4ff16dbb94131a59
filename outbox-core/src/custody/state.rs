//! The in-memory copy of one session's outbox that custody keeps between calls.
//!
//! Custody reads a session's outbox from the store once (at start-up or on first touch)
//! and from then on changes it only after the store accepted the change, so the copy
//! always equals what the store holds. A failed or refused write drops the copy; the next
//! touch reads the store again, and the repair that the failure schedules does at the
//! latest. The indexes answer every question a drain pass asks (the head of the queue,
//! the first drainable entry, whether a send is in flight, the place for a new entry,
//! the entries a run accepted) in O(log n), so the cost of a pass does not grow with
//! entries that just sit in the queue. Lookups by key are hashed; only the queue order
//! is a tree.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;

use crate::entry::{BlockedEntry, EntryState, OutboxEntry, StoredEntry};
use crate::ids::{OperationId, QueueId};

type Slot = (i64, QueueId);

/// One session's outbox as the store holds it, with the indexes of the drain.
#[derive(Clone, Debug, Default)]
pub(crate) struct SessionState {
    entries: HashMap<QueueId, OutboxEntry>,
    by_op: HashMap<OperationId, QueueId>,
    /// Every decoded entry by (position, queue ID).
    order: BTreeSet<Slot>,
    queued: BTreeSet<Slot>,
    /// How many queued entries sit at each position.
    queued_positions: BTreeMap<i64, usize>,
    sending: BTreeSet<Slot>,
    drainable: BTreeSet<Slot>,
    /// Sending entries without an acceptance: a send in flight or a read pending.
    unaccepted_sending: usize,
    /// Entries with an acceptance or a `handoff` (the ones a run end settles).
    accepted: BTreeSet<QueueId>,
    blocked: Vec<BlockedEntry>,
}

impl SessionState {
    /// The state of a loaded outbox.
    pub(crate) fn load(stored: Vec<StoredEntry>) -> SessionState {
        let mut state = SessionState::default();
        for e in stored {
            match e {
                StoredEntry::Entry(e) => state.put(*e),
                StoredEntry::Blocked(b) => state.blocked.push(b),
            }
        }
        state
    }

    /// Inserts or replaces the entry with `e.queue_id`.
    pub(crate) fn put(&mut self, e: OutboxEntry) {
        self.remove(&e.queue_id);
        let slot = (e.position, e.queue_id.clone());
        self.order.insert(slot.clone());
        if e.state.is_queued() {
            self.queued.insert(slot.clone());
            *self.queued_positions.entry(e.position).or_default() += 1;
        } else {
            self.sending.insert(slot.clone());
            if matches!(e.state, EntryState::Sending { .. }) {
                self.unaccepted_sending += 1;
            }
        }
        if e.drainable() {
            self.drainable.insert(slot);
        }
        if e.state.acceptance().is_some() || e.state.handoff().is_some() {
            self.accepted.insert(e.queue_id.clone());
        }
        self.by_op
            .insert(e.operation_id.clone(), e.queue_id.clone());
        self.entries.insert(e.queue_id.clone(), e);
    }

    /// Removes the entry `queue_id`; returns it.
    pub(crate) fn remove(&mut self, queue_id: &QueueId) -> Option<OutboxEntry> {
        let e = self.entries.remove(queue_id)?;
        let slot = (e.position, e.queue_id.clone());
        self.order.remove(&slot);
        if self.queued.remove(&slot) {
            if let Some(n) = self.queued_positions.get_mut(&e.position) {
                *n -= 1;
                if *n == 0 {
                    self.queued_positions.remove(&e.position);
                }
            }
        }
        self.drainable.remove(&slot);
        if self.sending.remove(&slot) && matches!(e.state, EntryState::Sending { .. }) {
            self.unaccepted_sending -= 1;
        }
        self.accepted.remove(queue_id);
        if self.by_op.get(&e.operation_id) == Some(queue_id) {
            self.by_op.remove(&e.operation_id);
        }
        Some(e)
    }

    /// The entry `queue_id`.
    pub(crate) fn get(&self, queue_id: &QueueId) -> Option<&OutboxEntry> {
        self.entries.get(queue_id)
    }

    /// The entry of operation `op`.
    pub(crate) fn by_op(&self, op: &OperationId) -> Option<&OutboxEntry> {
        self.by_op.get(op).and_then(|q| self.entries.get(q))
    }

    /// True while a send is in flight or a read pending (sending without acceptance).
    pub(crate) fn has_unaccepted_sending(&self) -> bool {
        self.unaccepted_sending > 0
    }

    /// The first queued entry.
    pub(crate) fn queued_head(&self) -> Option<&OutboxEntry> {
        self.queued.first().and_then(|(_, q)| self.entries.get(q))
    }

    /// Queued entries with auto-drain on, in queue order.
    pub(crate) fn drainable(&self) -> impl Iterator<Item = &OutboxEntry> {
        self.drainable
            .iter()
            .filter_map(|(_, q)| self.entries.get(q))
    }

    /// Sending entries, in queue order.
    pub(crate) fn sending(&self) -> impl Iterator<Item = &OutboxEntry> {
        self.sending.iter().filter_map(|(_, q)| self.entries.get(q))
    }

    /// Entries with an acceptance or a `handoff`.
    pub(crate) fn accepted(&self) -> impl Iterator<Item = &OutboxEntry> {
        self.accepted.iter().filter_map(|q| self.entries.get(q))
    }

    /// Every decoded entry in queue order.
    pub(crate) fn ordered(&self) -> impl Iterator<Item = &OutboxEntry> {
        self.order.iter().filter_map(|(_, q)| self.entries.get(q))
    }

    /// The position of the entry just before (`position`, `queue_id`) in queue order,
    /// not counting the entry `skip` (the one being moved).
    pub(crate) fn position_before(
        &self,
        position: i64,
        queue_id: &QueueId,
        skip: &QueueId,
    ) -> Option<i64> {
        self.order
            .range(..(position, queue_id.clone()))
            .rev()
            .find(|(_, q)| q != skip)
            .map(|(p, _)| *p)
    }

    /// The highest position of any entry.
    pub(crate) fn max_position(&self) -> Option<i64> {
        let decoded = self.order.last().map(|(p, _)| *p);
        let blocked = self.blocked.iter().map(|b| b.position).max();
        decoded.max(blocked)
    }

    /// The highest position of a sending entry.
    pub(crate) fn max_sending(&self) -> Option<i64> {
        self.sending.last().map(|(p, _)| *p)
    }

    /// The lowest position of a queued entry placed after `after`, not counting one
    /// entry at position `skip` (the entry being moved).
    pub(crate) fn min_queued_after(&self, after: Option<i64>, skip: Option<i64>) -> Option<i64> {
        let positions = match after {
            None => self.queued_positions.range(..),
            Some(s) => self
                .queued_positions
                .range((Bound::Excluded(s), Bound::Unbounded)),
        };
        positions
            .filter(|(p, n)| !(Some(**p) == skip && **n == 1))
            .map(|(p, _)| *p)
            .next()
    }

    /// The outbox as the store returns it: decoded and blocked entries in queue order.
    pub(crate) fn stored(&self) -> Vec<StoredEntry> {
        let mut out: Vec<StoredEntry> = self
            .ordered()
            .map(|e| StoredEntry::Entry(Box::new(e.clone())))
            .chain(self.blocked.iter().cloned().map(StoredEntry::Blocked))
            .collect();
        out.sort_by_key(StoredEntry::position);
        out
    }
}
