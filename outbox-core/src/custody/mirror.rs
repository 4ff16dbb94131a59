//! Custody's mirror of its store: the outbox store itself and the copies custody reads
//! through (each loaded session's outbox, the ledger rows read or written, the set of
//! sessions with a saved outbox), kept equal to what the store holds.
//!
//! Every write of an outbox entry or a ledger row is a method of the mirror (claim, claim
//! while sending, claim of a session message, rekey, remove, positions, replace, replace
//! with the ledger, ledger rows, the sent proof), and memory follows only a write the
//! store took. The route deliveries of session messages and the shared run registry
//! hold nothing in memory here and are written by custody directly. What to do about a write the store refused or failed
//! (forget the session and schedule its repair, let the memory fallback take a ledger
//! row) is custody's: the mirror forgets what it is told to and never schedules work.

use std::collections::{BTreeMap, BTreeSet};

use super::state::SessionState;
use super::work::Work;
use super::STORE_RETRY;
use crate::entry::OutboxEntry;
use crate::fingerprint::Digest256;
use crate::ids::{OperationId, QueueId, ScopeId, SessionId};
use crate::ledger::LedgerRecord;
use crate::store::{Claim, OutboxError, OutboxStore, RouteClaim, SessionMessageRoute};
use timeline_core::time::Millis;

/// The store and what custody keeps of it in memory. See the module docs.
#[derive(Debug)]
pub(crate) struct Mirror<S> {
    /// The outbox store.
    pub(crate) store: S,
    /// Each loaded session's outbox, equal to what the store holds.
    states: BTreeMap<SessionId, SessionState>,
    /// Ledger rows read or written, keyed (scope, operation): what the store
    /// holds (`None`: no row).
    ledgers: BTreeMap<(ScopeId, OperationId), Option<LedgerRecord>>,
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
    fn put(&mut self, session: &SessionId, entry: OutboxEntry) {
        if let Some(state) = self.states.get_mut(session) {
            state.put(entry);
        }
        if let Some(known) = &mut self.outbox_sessions {
            known.insert(session.clone());
        }
    }

    /// Memory follows a removal the store took.
    fn remove(&mut self, session: &SessionId, queue_id: &QueueId) {
        if let Some(state) = self.states.get_mut(session) {
            state.remove(queue_id);
        }
    }

    /// The ledger row of `op` in `scope` is `record` (the store took it).
    fn ledger_is(&mut self, scope: ScopeId, op: OperationId, record: LedgerRecord) {
        self.ledgers.insert((scope, op), Some(record));
    }

    /// The ledger row of `op` in `scope` is no longer kept in memory (the
    /// operation left the outbox, or its row is unknown after a failed write).
    fn drop_ledger(&mut self, scope: ScopeId, op: OperationId) {
        self.ledgers.remove(&(scope, op));
    }

    /// Forgets what memory holds of `session` and its scope's ledger rows.
    pub(crate) fn forget(&mut self, session: &SessionId) {
        self.states.remove(session);
        let scope = ScopeId::of(session);
        self.ledgers.retain(|(s, _), _| s != &scope);
        self.outbox_sessions = None;
    }

    /// Forgets what memory holds of every session of `scope`.
    pub(crate) fn forget_scope(&mut self, scope: &ScopeId) {
        self.states.retain(|s, _| !scope.contains(s));
        self.ledgers.retain(|(s, _), _| s != scope);
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
    /// operation in `scope`, in one transaction; memory follows when the
    /// store took it.
    pub(crate) fn replace_with_ledger(
        &mut self,
        session: &SessionId,
        expected: &OutboxEntry,
        new: OutboxEntry,
        scope: &ScopeId,
        record: LedgerRecord,
    ) -> Result<bool, OutboxError> {
        let op = new.operation_id.clone();
        let written = self
            .store
            .replace_entry_with_ledger(session, expected, &new, scope, &record);
        let written = self.followed(session, written, new)?;
        if written {
            self.ledger_is(scope.clone(), op, record);
        }
        Ok(written)
    }

    /// Saves a new entry unless its operation is known ([`OutboxStore::claim`]); memory
    /// follows a claim the store took.
    pub(crate) fn claim(
        &mut self,
        session: &SessionId,
        fingerprint: &Digest256,
        entry: &OutboxEntry,
    ) -> Result<Claim, OutboxError> {
        let claim = self.store.claim(session, fingerprint, entry)?;
        if let Claim::Claimed = claim {
            self.put(session, entry.clone());
        }
        Ok(claim)
    }

    /// Saves a new entry already sending with its ledger row `record` in the scope of
    /// `scope`, in one transaction ([`OutboxStore::claim_sending`]); memory follows a claim
    /// the store took.
    pub(crate) fn claim_sending(
        &mut self,
        session: &SessionId,
        fingerprint: &Digest256,
        sending: &OutboxEntry,
        scope: &ScopeId,
        record: &LedgerRecord,
    ) -> Result<Claim, OutboxError> {
        let claim = self
            .store
            .claim_sending(session, fingerprint, sending, scope, record)?;
        if let Claim::Claimed = claim {
            self.put(session, sending.clone());
            self.ledger_is(scope.clone(), sending.operation_id.clone(), record.clone());
        }
        Ok(claim)
    }

    /// Saves a message from another session with its route
    /// ([`OutboxStore::claim_session_message`]); memory follows a claim the store took
    /// when the recipient's outbox is served here (`here`).
    pub(crate) fn claim_session_message(
        &mut self,
        recipient: &SessionId,
        fingerprint: &Digest256,
        entry: &OutboxEntry,
        route: &SessionMessageRoute,
        here: bool,
    ) -> Result<RouteClaim, OutboxError> {
        let claim = self
            .store
            .claim_session_message(recipient, fingerprint, entry, route)?;
        if let (RouteClaim::Claimed, true) = (&claim, here) {
            self.put(recipient, entry.clone());
        }
        Ok(claim)
    }

    /// Gives `expected` a new operation (`new`, an edit); memory follows when the store
    /// took it, and the old operation's ledger row leaves memory with it. False when the
    /// store holds something else.
    pub(crate) fn rekey(
        &mut self,
        session: &SessionId,
        expected: &OutboxEntry,
        fingerprint: &Digest256,
        new: OutboxEntry,
    ) -> Result<bool, OutboxError> {
        let written = self
            .store
            .rekey_entry(session, expected, fingerprint, &new)?;
        if written {
            self.drop_ledger(ScopeId::of(session), expected.operation_id.clone());
            self.put(session, new);
        }
        Ok(written)
    }

    /// Removes the queued entry `entry` of `session`; memory follows, its operation's
    /// ledger row leaving memory with it.
    pub(crate) fn remove_entry(
        &mut self,
        session: &SessionId,
        entry: &OutboxEntry,
    ) -> Result<(), OutboxError> {
        self.store.remove_entry(session, &entry.queue_id)?;
        self.remove(session, &entry.queue_id);
        self.drop_ledger(ScopeId::of(session), entry.operation_id.clone());
        Ok(())
    }

    /// Gives entries of `session` new positions (one store write); memory follows. Only
    /// a loaded outbox follows: the callers read the outbox to order it before they
    /// write its positions, and an outbox not in memory is read when next touched.
    pub(crate) fn set_positions(
        &mut self,
        session: &SessionId,
        positions: &[(QueueId, i64)],
    ) -> Result<(), OutboxError> {
        self.store.set_positions(session, positions)?;
        let moved: Vec<OutboxEntry> = match self.states.get(session) {
            Some(state) => positions
                .iter()
                .filter_map(|(q, p)| {
                    state.get(q).cloned().map(|mut e| {
                        e.position = *p;
                        e
                    })
                })
                .collect(),
            None => Vec::new(),
        };
        for e in moved {
            self.put(session, e);
        }
        Ok(())
    }

    /// The ledger row the store holds (read once, then kept).
    pub(crate) fn stored_ledger(
        &mut self,
        scope: &ScopeId,
        op: &OperationId,
    ) -> Result<Option<LedgerRecord>, OutboxError> {
        let key = (scope.clone(), op.clone());
        if let Some(known) = self.ledgers.get(&key) {
            return Ok(known.clone());
        }
        let read = self.store.ledger(scope, op)?;
        self.ledgers.insert(key, read.clone());
        Ok(read)
    }

    /// Stores a ledger row; memory follows, or forgets the row when the write failed.
    pub(crate) fn put_ledger(
        &mut self,
        scope: &ScopeId,
        op: &OperationId,
        record: &LedgerRecord,
    ) -> Result<(), OutboxError> {
        let key = (scope.clone(), op.clone());
        match self.store.put_ledger(scope, op, record) {
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

    /// Ledger sent, then the operation leaves the outbox of each of `members`, the
    /// sessions of `scope` that may hold it (one store transaction); memory follows when
    /// the store took it.
    pub(crate) fn confirm_sent(
        &mut self,
        scope: &ScopeId,
        members: &[SessionId],
        op: &OperationId,
        record: &LedgerRecord,
    ) -> Result<(), OutboxError> {
        let removed = self.store.confirm_sent(scope, members, op, record)?;
        for (s, q) in removed {
            self.remove(&s, &q);
        }
        // The operation left the outbox: its ledger row need not stay in memory.
        self.drop_ledger(scope.clone(), op.clone());
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

/// Custody's policy over its mirror: a session's outbox is read only for a scope this
/// host serves, and a write the store did not take forgets the session and schedules
/// its repair.
impl<S: OutboxStore> super::Custody<S> {
    /// The session's outbox, read from the store on first touch.
    pub(crate) fn state(&mut self, session: &SessionId) -> Result<&mut SessionState, OutboxError> {
        if !self.scope_granted(session) {
            let base = crate::ids::base_session(session);
            return Err(OutboxError::LeaseLost {
                message: format!("this host does not serve session {base}"),
                session: base,
            });
        }
        let (state, loaded) = self.mirror.state(session)?;
        if loaded {
            self.stats.outbox_loads += 1;
        }
        Ok(state)
    }

    /// The entry `queue_id` as the store holds it.
    pub(super) fn entry(
        &mut self,
        session: &SessionId,
        queue_id: &QueueId,
    ) -> Result<Option<OutboxEntry>, OutboxError> {
        Ok(self.state(session)?.get(queue_id).cloned())
    }

    /// Forgets what memory holds of `session` (after a failed or refused write), and
    /// schedules its repair: a write reported as failed may have been made, so an entry
    /// may be out in the store with nothing in flight. [`STORE_RETRY`] later the session
    /// is read again and every such entry is confirmed from the agent's history, as a
    /// restart does; it is never sent again blindly.
    pub(crate) fn forget(&mut self, session: &SessionId, now: Millis) {
        self.mirror.forget(session);
        let scheduled = self
            .retries
            .iter()
            .any(|(_, r)| matches!(r, Work::Repair(s) if s == session));
        if !scheduled {
            let at = now.saturating_add(STORE_RETRY);
            self.retries.push((at, Work::Repair(session.clone())));
        }
    }

    /// Replaces `expected` with `new` in the store, then in memory. False when the store
    /// holds something else (memory is forgotten then).
    pub(crate) fn replace(
        &mut self,
        session: &SessionId,
        expected: &OutboxEntry,
        new: OutboxEntry,
        now: Millis,
    ) -> Result<bool, OutboxError> {
        let written = self.mirror.replace(session, expected, new);
        self.forget_unless_written(session, written, now)
    }

    /// A compare-and-set write the store did not take (it held something else, or
    /// failed): memory of the session is forgotten and its repair scheduled.
    pub(crate) fn forget_unless_written(
        &mut self,
        session: &SessionId,
        written: Result<bool, OutboxError>,
        now: Millis,
    ) -> Result<bool, OutboxError> {
        if !matches!(written, Ok(true)) {
            self.forget(session, now);
        }
        written
    }
}
