//! Custody's mirror of its store: the outbox store itself and the copies custody reads
//! through (each loaded session's outbox, the ledger rows read or written, the set of
//! sessions with a saved outbox), kept equal to what the store holds.
//!
//! Every store write of custody goes through the mirror's `store`, and memory follows
//! only a write the store took. What to do about a write the store refused or failed
//! (forget the session and schedule its repair, let the memory fallback take a ledger
//! row) is custody's: the mirror forgets what it is told to and never schedules work.

use std::collections::{BTreeMap, BTreeSet};

use super::state::SessionState;
use crate::entry::OutboxEntry;
use crate::ids::{base_session, OperationId, QueueId, SessionId};
use crate::ledger::LedgerRecord;
use crate::store::{OutboxError, OutboxStore};

/// The store and what custody keeps of it in memory. See the module docs.
#[derive(Debug)]
pub(crate) struct Mirror<S> {
    /// The outbox store.
    pub(crate) store: S,
    /// Each loaded session's outbox, equal to what the store holds.
    states: BTreeMap<SessionId, SessionState>,
    /// Ledger rows read or written, keyed (base session, operation): what the store
    /// holds (`None`: no row).
    ledgers: BTreeMap<(SessionId, OperationId), Option<LedgerRecord>>,
    /// Every session with a saved outbox, once read.
    outbox_sessions: Option<BTreeSet<SessionId>>,
}

impl<S> Mirror<S> {
    /// A mirror of `store` holding nothing yet.
    pub(crate) fn new(store: S) -> Self {
        Mirror {
            store,
            states: BTreeMap::new(),
            ledgers: BTreeMap::new(),
            outbox_sessions: None,
        }
    }

    /// Memory follows a write the store took.
    pub(crate) fn put(&mut self, session: &SessionId, entry: OutboxEntry) {
        if let Some(state) = self.states.get_mut(session) {
            state.put(entry);
        }
        if let Some(known) = &mut self.outbox_sessions {
            known.insert(session.clone());
        }
    }

    /// Memory follows a removal the store took.
    pub(crate) fn remove(&mut self, session: &SessionId, queue_id: &QueueId) {
        if let Some(state) = self.states.get_mut(session) {
            state.remove(queue_id);
        }
    }

    /// The ledger row of `op` in the scope of `base` is `record` (the store took it).
    pub(crate) fn ledger_is(&mut self, base: SessionId, op: OperationId, record: LedgerRecord) {
        self.ledgers.insert((base, op), Some(record));
    }

    /// The ledger row of `op` in the scope of `base` is no longer kept in memory (the
    /// operation left the outbox, or its row is unknown after a failed write).
    pub(crate) fn drop_ledger(&mut self, base: SessionId, op: OperationId) {
        self.ledgers.remove(&(base, op));
    }

    /// Forgets what memory holds of `session` and its scope's ledger rows.
    pub(crate) fn forget(&mut self, session: &SessionId) {
        self.states.remove(session);
        let base = base_session(session);
        self.ledgers.retain(|(s, _), _| s != &base);
        self.outbox_sessions = None;
    }

    /// Forgets what memory holds of every session of the scope of `base`.
    pub(crate) fn forget_scope(&mut self, base: &SessionId) {
        self.states.retain(|s, _| &base_session(s) != base);
        self.ledgers.retain(|(s, _), _| s != base);
        self.outbox_sessions = None;
    }

    /// Forgets everything (the caller may change the store).
    pub(crate) fn forget_all(&mut self) {
        self.states.clear();
        self.ledgers.clear();
        self.outbox_sessions = None;
    }
}

impl<S: OutboxStore> Mirror<S> {
    /// The session's outbox, read from the store on first touch; true when it was read
    /// now.
    pub(crate) fn state(
        &mut self,
        session: &SessionId,
    ) -> Result<(&mut SessionState, bool), OutboxError> {
        let mut loaded = false;
        if !self.states.contains_key(session) {
            let stored = self.store.entries(session)?;
            self.states
                .insert(session.clone(), SessionState::load(stored));
            loaded = true;
        }
        let state = self
            .states
            .get_mut(session)
            .ok_or_else(|| OutboxError::unavailable("the outbox was not loaded"))?;
        Ok((state, loaded))
    }

    /// Replaces `expected` with `new` in the store; memory follows when the store took
    /// it. False when the store holds something else (the caller forgets then, as after
    /// an error).
    pub(crate) fn replace(
        &mut self,
        session: &SessionId,
        expected: &OutboxEntry,
        new: OutboxEntry,
    ) -> Result<bool, OutboxError> {
        let written = self.store.replace_entry(session, expected, &new);
        self.followed(session, written, new)
    }

    /// Memory follows the outcome of a compare-and-set write of `new` when the store
    /// took it.
    fn followed(
        &mut self,
        session: &SessionId,
        written: Result<bool, OutboxError>,
        new: OutboxEntry,
    ) -> Result<bool, OutboxError> {
        if let Ok(true) = written {
            self.put(session, new);
        }
        written
    }

    /// Replaces `expected` with `new` and stores `record` as the ledger row of `new`'s
    /// operation in the scope of `base`, in one transaction; memory follows when the
    /// store took it.
    pub(crate) fn replace_with_ledger(
        &mut self,
        session: &SessionId,
        expected: &OutboxEntry,
        new: OutboxEntry,
        base: &SessionId,
        record: LedgerRecord,
    ) -> Result<bool, OutboxError> {
        let op = new.operation_id.clone();
        let written = self
            .store
            .replace_entry_with_ledger(session, expected, &new, base, &record);
        let written = self.followed(session, written, new)?;
        if written {
            self.ledger_is(base.clone(), op, record);
        }
        Ok(written)
    }

    /// The ledger row the store holds (read once, then kept).
    pub(crate) fn stored_ledger(
        &mut self,
        base: &SessionId,
        op: &OperationId,
    ) -> Result<Option<LedgerRecord>, OutboxError> {
        let key = (base.clone(), op.clone());
        if let Some(known) = self.ledgers.get(&key) {
            return Ok(known.clone());
        }
        let read = self.store.ledger(base, op)?;
        self.ledgers.insert(key, read.clone());
        Ok(read)
    }

    /// Stores a ledger row; memory follows, or forgets the row when the write failed.
    pub(crate) fn put_ledger(
        &mut self,
        base: &SessionId,
        op: &OperationId,
        record: &LedgerRecord,
    ) -> Result<(), OutboxError> {
        let key = (base.clone(), op.clone());
        match self.store.put_ledger(base, op, record) {
            Ok(()) => {
                self.ledgers.insert(key, Some(record.clone()));
                Ok(())
            }
            Err(error) => {
                self.ledgers.remove(&key);
                Err(error)
            }
        }
    }

    /// Ledger sent, then the operation leaves the outbox of every session of `scope`
    /// (one store transaction); memory follows when the store took it.
    pub(crate) fn confirm_sent(
        &mut self,
        scope: &[SessionId],
        base: &SessionId,
        op: &OperationId,
        record: &LedgerRecord,
    ) -> Result<(), OutboxError> {
        let removed = self.store.confirm_sent(scope, op, record)?;
        for (s, q) in removed {
            self.remove(&s, &q);
        }
        // The operation left the outbox: its ledger row need not stay in memory.
        self.drop_ledger(base.clone(), op.clone());
        Ok(())
    }

    /// Every session with a saved outbox (read once).
    pub(crate) fn outbox_sessions(&mut self) -> Result<&BTreeSet<SessionId>, OutboxError> {
        if self.outbox_sessions.is_none() {
            let read: BTreeSet<SessionId> = self.store.outbox_sessions()?.into_iter().collect();
            self.outbox_sessions = Some(read);
        }
        Ok(self.outbox_sessions.get_or_insert_with(BTreeSet::new))
    }

    /// True when `session` has a saved outbox.
    pub(crate) fn has_outbox(&mut self, session: &SessionId) -> Result<bool, OutboxError> {
        Ok(self.outbox_sessions()?.contains(session))
    }
}
