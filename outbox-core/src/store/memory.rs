//! The in-memory reference implementation of [`OutboxStore`].
//!
//! Entries are kept decoded; raw text can be stored too
//! ([`MemoryOutboxStore::insert_raw_entry`]), so an undecodable row behaves as it does in
//! a durable backend: it comes back blocked.

use std::collections::{BTreeSet, HashMap};

use crate::entry::{BlockedEntry, OutboxEntry, StoredEntry};
use crate::fingerprint::Digest256;
use crate::ids::{CallId, OperationId, QueueId, ScopeId, SessionId};
use crate::ledger::LedgerRecord;

use super::{
    Claim, Identity, OutboxError, OutboxStore, RouteClaim, RouteDelivery, SessionMessageRoute,
};

#[derive(Clone, Debug)]
struct RawEntry {
    position: i64,
    operation_id: String,
    /// Raw text written by [`MemoryOutboxStore::insert_raw_entry`].
    json: Option<String>,
    /// The entry as decoded (`None`: the raw text does not decode).
    decoded: Option<OutboxEntry>,
}

/// One session's outbox: entries by queue ID, and the queue IDs of each operation.
#[derive(Clone, Debug, Default)]
struct Outbox {
    entries: HashMap<String, RawEntry>,
    by_op: HashMap<String, BTreeSet<String>>,
}

impl Outbox {
    fn insert(&mut self, queue_id: String, raw: RawEntry) {
        self.remove(&queue_id);
        self.by_op
            .entry(raw.operation_id.clone())
            .or_default()
            .insert(queue_id.clone());
        self.entries.insert(queue_id, raw);
    }

    fn remove(&mut self, queue_id: &str) -> Option<RawEntry> {
        let raw = self.entries.remove(queue_id)?;
        if let Some(queues) = self.by_op.get_mut(&raw.operation_id) {
            queues.remove(queue_id);
            if queues.is_empty() {
                self.by_op.remove(&raw.operation_id);
            }
        }
        Some(raw)
    }
}

/// In-memory outbox, identities, ledger and routes, in hash maps: a call's cost does not
/// grow with the entries it does not touch (a whole-outbox read costs that session's
/// entries only).
#[derive(Clone, Debug, Default)]
pub struct MemoryOutboxStore {
    outboxes: HashMap<SessionId, Outbox>,
    identities: HashMap<(SessionId, OperationId), Identity>,
    ledger: HashMap<(ScopeId, OperationId), LedgerRecord>,
    routes: HashMap<OperationId, SessionMessageRoute>,
    /// The route of each (sender session, sender call).
    route_calls: HashMap<(SessionId, CallId), OperationId>,
}

impl MemoryOutboxStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Stores raw entry text as a damaged or foreign backend might have it.
    pub fn insert_raw_entry(
        &mut self,
        session: &SessionId,
        queue_id: &str,
        operation_id: &str,
        position: i64,
        json: &str,
    ) {
        self.outboxes.entry(session.clone()).or_default().insert(
            queue_id.to_owned(),
            RawEntry {
                position,
                operation_id: operation_id.to_owned(),
                json: Some(json.to_owned()),
                decoded: serde_json::from_str(json).ok(),
            },
        );
    }

    fn write_entry(&mut self, session: &SessionId, entry: &OutboxEntry) {
        self.outboxes.entry(session.clone()).or_default().insert(
            entry.queue_id.as_str().to_owned(),
            RawEntry {
                position: entry.position,
                operation_id: entry.operation_id.as_str().to_owned(),
                json: None,
                decoded: Some(entry.clone()),
            },
        );
    }

    fn remove_raw(&mut self, session: &SessionId, queue_id: &str) -> Option<RawEntry> {
        let outbox = self.outboxes.get_mut(session)?;
        let raw = outbox.remove(queue_id);
        if outbox.entries.is_empty() {
            self.outboxes.remove(session);
        }
        raw
    }

    fn holds_queue(&self, session: &SessionId, queue_id: &QueueId) -> bool {
        self.outboxes
            .get(session)
            .is_some_and(|o| o.entries.contains_key(queue_id.as_str()))
    }

    fn decoded(&self, session: &SessionId, queue_id: &QueueId) -> Option<OutboxEntry> {
        self.outboxes
            .get(session)?
            .entries
            .get(queue_id.as_str())?
            .decoded
            .clone()
    }

    fn mark_removed(&mut self, session: &SessionId, op: &OperationId) {
        if let Some(id) = self.identities.get_mut(&(session.clone(), op.clone())) {
            id.removed = true;
        }
    }

    fn claim_unchecked(
        &mut self,
        session: &SessionId,
        fingerprint: &Digest256,
        entry: &OutboxEntry,
    ) -> Result<Claim, OutboxError> {
        let k = (session.clone(), entry.operation_id.clone());
        if let Some(existing) = self.identities.get(&k) {
            return Ok(Claim::Existing(existing.clone()));
        }
        if self.holds_queue(session, &entry.queue_id) {
            return Err(OutboxError::QueueTaken(entry.queue_id.clone()));
        }
        self.write_entry(session, entry);
        self.identities.insert(
            k,
            Identity {
                fingerprint: fingerprint.clone(),
                queue_id: entry.queue_id.clone(),
                removed: false,
            },
        );
        Ok(Claim::Claimed)
    }
}

fn decode(queue_id: &str, raw: &RawEntry) -> StoredEntry {
    if let Some(e) = &raw.decoded {
        return StoredEntry::Entry(Box::new(e.clone()));
    }
    let reason = match raw.json.as_deref().map(serde_json::from_str::<OutboxEntry>) {
        Some(Ok(e)) => return StoredEntry::Entry(Box::new(e)),
        Some(Err(e)) => e.to_string(),
        None => "no entry text".to_owned(),
    };
    StoredEntry::Blocked(BlockedEntry {
        queue_id: queue_id.to_owned(),
        operation_id: Some(raw.operation_id.clone()).filter(|o| !o.is_empty()),
        position: raw.position,
        reason,
    })
}

impl OutboxStore for MemoryOutboxStore {
    fn claim(
        &mut self,
        session: &SessionId,
        fingerprint: &Digest256,
        entry: &OutboxEntry,
    ) -> Result<Claim, OutboxError> {
        if let Some(existing) = self
            .identities
            .get(&(session.clone(), entry.operation_id.clone()))
        {
            return Ok(Claim::Existing(existing.clone()));
        }
        self.claim_unchecked(session, fingerprint, entry)
    }

    fn claim_sending(
        &mut self,
        session: &SessionId,
        fingerprint: &Digest256,
        entry: &OutboxEntry,
        scope: &ScopeId,
        record: &LedgerRecord,
    ) -> Result<Claim, OutboxError> {
        if let Some(existing) = self
            .identities
            .get(&(session.clone(), entry.operation_id.clone()))
        {
            return Ok(Claim::Existing(existing.clone()));
        }
        // Both writes are checked before either is made: one transaction.
        let claim = self.claim_unchecked(session, fingerprint, entry)?;
        if claim == Claim::Claimed {
            self.ledger
                .insert((scope.clone(), entry.operation_id.clone()), record.clone());
        }
        Ok(claim)
    }

    fn claim_session_message(
        &mut self,
        recipient: &SessionId,
        fingerprint: &Digest256,
        entry: &OutboxEntry,
        route: &SessionMessageRoute,
    ) -> Result<RouteClaim, OutboxError> {
        let call = (
            route.sender_session_id.clone(),
            route.sender_call_id.clone(),
        );
        if let Some(existing) = self
            .route_calls
            .get(&call)
            .and_then(|op| self.routes.get(op))
        {
            return Ok(RouteClaim::ExistingCall(existing.clone()));
        }
        if self
            .identities
            .contains_key(&(recipient.clone(), entry.operation_id.clone()))
        {
            return Err(OutboxError::OperationTaken(entry.operation_id.clone()));
        }
        self.write_entry(recipient, entry);
        self.identities.insert(
            (recipient.clone(), entry.operation_id.clone()),
            Identity {
                fingerprint: fingerprint.clone(),
                queue_id: entry.queue_id.clone(),
                removed: false,
            },
        );
        self.route_calls.insert(call, route.operation_id.clone());
        self.routes
            .insert(route.operation_id.clone(), route.clone());
        Ok(RouteClaim::Claimed)
    }

    fn identity(
        &mut self,
        session: &SessionId,
        op: &OperationId,
    ) -> Result<Option<Identity>, OutboxError> {
        Ok(self.identities.get(&(session.clone(), op.clone())).cloned())
    }

    fn entries(&mut self, session: &SessionId) -> Result<Vec<StoredEntry>, OutboxError> {
        let Some(outbox) = self.outboxes.get(session) else {
            return Ok(Vec::new());
        };
        let mut keyed: Vec<(i64, &String, &RawEntry)> = outbox
            .entries
            .iter()
            .map(|(q, raw)| (raw.position, q, raw))
            .collect();
        // Queue order; equal positions by queue ID, so the order never depends on the map.
        keyed.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        Ok(keyed
            .into_iter()
            .map(|(_, q, raw)| decode(q, raw))
            .collect())
    }

    fn outbox_sessions(&mut self) -> Result<Vec<SessionId>, OutboxError> {
        let mut sessions: Vec<SessionId> = self.outboxes.keys().cloned().collect();
        sessions.sort();
        Ok(sessions)
    }

    fn replace_entry(
        &mut self,
        session: &SessionId,
        expected: &OutboxEntry,
        new: &OutboxEntry,
    ) -> Result<bool, OutboxError> {
        if self.decoded(session, &expected.queue_id).as_ref() != Some(expected) {
            return Ok(false);
        }
        self.write_entry(session, new);
        Ok(true)
    }

    fn replace_entry_with_ledger(
        &mut self,
        session: &SessionId,
        expected: &OutboxEntry,
        new: &OutboxEntry,
        scope: &ScopeId,
        record: &LedgerRecord,
    ) -> Result<bool, OutboxError> {
        if self.decoded(session, &expected.queue_id).as_ref() != Some(expected) {
            return Ok(false);
        }
        self.write_entry(session, new);
        self.ledger
            .insert((scope.clone(), new.operation_id.clone()), record.clone());
        Ok(true)
    }

    fn rekey_entry(
        &mut self,
        session: &SessionId,
        expected: &OutboxEntry,
        fingerprint: &Digest256,
        new: &OutboxEntry,
    ) -> Result<bool, OutboxError> {
        if self.decoded(session, &expected.queue_id).as_ref() != Some(expected) {
            return Ok(false);
        }
        let k = (session.clone(), new.operation_id.clone());
        if self.identities.contains_key(&k) {
            return Err(OutboxError::OperationTaken(new.operation_id.clone()));
        }
        self.mark_removed(session, &expected.operation_id);
        self.identities.insert(
            k,
            Identity {
                fingerprint: fingerprint.clone(),
                queue_id: new.queue_id.clone(),
                removed: false,
            },
        );
        self.write_entry(session, new);
        Ok(true)
    }

    fn remove_entry(
        &mut self,
        session: &SessionId,
        queue_id: &QueueId,
    ) -> Result<Option<OutboxEntry>, OutboxError> {
        let Some(raw) = self.remove_raw(session, queue_id.as_str()) else {
            return Ok(None);
        };
        if let Ok(op) = OperationId::new(raw.operation_id.clone()) {
            self.mark_removed(session, &op);
        }
        Ok(raw.decoded)
    }

    fn set_positions(
        &mut self,
        session: &SessionId,
        positions: &[(QueueId, i64)],
    ) -> Result<(), OutboxError> {
        for (q, p) in positions {
            if let Some(mut e) = self.decoded(session, q) {
                e.position = *p;
                self.write_entry(session, &e);
            }
        }
        Ok(())
    }

    fn ledger(
        &mut self,
        scope: &ScopeId,
        op: &OperationId,
    ) -> Result<Option<LedgerRecord>, OutboxError> {
        Ok(self.ledger.get(&(scope.clone(), op.clone())).cloned())
    }

    fn put_ledger(
        &mut self,
        scope: &ScopeId,
        op: &OperationId,
        record: &LedgerRecord,
    ) -> Result<(), OutboxError> {
        self.ledger
            .insert((scope.clone(), op.clone()), record.clone());
        Ok(())
    }

    fn confirm_sent(
        &mut self,
        scope: &ScopeId,
        members: &[SessionId],
        op: &OperationId,
        record: &LedgerRecord,
    ) -> Result<Vec<(SessionId, QueueId)>, OutboxError> {
        self.ledger
            .insert((scope.clone(), op.clone()), record.clone());
        let mut removed = Vec::new();
        for s in members.iter().filter(|m| scope.contains(m)) {
            let queues: Vec<String> = self
                .outboxes
                .get(s)
                .and_then(|o| o.by_op.get(op.as_str()))
                .map(|q| q.iter().cloned().collect())
                .unwrap_or_default();
            for q in queues {
                self.remove_raw(s, &q);
                self.mark_removed(s, op);
                if let Ok(q) = QueueId::new(q) {
                    removed.push((s.clone(), q));
                }
            }
        }
        Ok(removed)
    }

    fn route(&mut self, op: &OperationId) -> Result<Option<SessionMessageRoute>, OutboxError> {
        Ok(self.routes.get(op).cloned())
    }

    fn set_route_delivery(
        &mut self,
        op: &OperationId,
        delivery: RouteDelivery,
    ) -> Result<(), OutboxError> {
        if let Some(r) = self.routes.get_mut(op) {
            r.delivery = delivery;
        }
        Ok(())
    }
}
