//! The operation ledger as custody uses it (OB-07, OB-08): reads through the in-memory
//! copy, writes with the 256-record memory fallback, entry changes that carry their
//! ledger row in one transaction, the sent proof, and session-message deliveries.

use timeline_core::time::Millis;

use super::{Custody, CustodyEffect, StoreFailure};
use crate::entry::OutboxEntry;
use crate::ids::{OperationId, ScopeId, SessionId};
use crate::ledger::{transition, LedgerRecord, LedgerStatus, Transition};
use crate::store::{OutboxError, OutboxStore, RouteDelivery};

impl<S: OutboxStore> Custody<S> {
    /// The ledger record, from the store (read once, then kept) or the memory fallback,
    /// whichever is stronger proof.
    pub fn ledger_of(
        &mut self,
        scope: &ScopeId,
        op: &OperationId,
    ) -> Result<Option<LedgerRecord>, OutboxError> {
        let stored = self.mirror.stored_ledger(scope, op)?;
        let fallback = self.fallback.get(scope, op).cloned();
        Ok(match (stored, fallback) {
            (Some(a), Some(b)) => Some(if b.status.strength() > a.status.strength() {
                b
            } else {
                a
            }),
            (a, b) => a.or(b),
        })
    }

    /// What the ledger becomes when `proposed` meets the current record; `None` when
    /// the current record stays (the proposal is weaker proof).
    pub(super) fn ledger_after(
        &mut self,
        scope: &ScopeId,
        op: &OperationId,
        proposed: LedgerRecord,
    ) -> Result<Option<LedgerRecord>, OutboxError> {
        let current = self.ledger_of(scope, op)?;
        Ok(match transition(current.as_ref(), proposed) {
            Transition::Apply(r) => Some(r),
            Transition::Keep => None,
        })
    }

    /// Stores a ledger row (the caller applied the lattice). When the store cannot be
    /// written, the memory fallback takes it (OB-07) and the embedding is told; an error
    /// only when neither could record it.
    pub(super) fn write_ledger(
        &mut self,
        scope: &ScopeId,
        op: &OperationId,
        record: LedgerRecord,
    ) -> Result<(), OutboxError> {
        match self.mirror.put_ledger(scope, op, &record) {
            Ok(()) => Ok(()),
            Err(error) => match self.fallback.record(scope, op, record) {
                Ok(_) => {
                    self.note_failure(scope.base(), Some(op), error, None);
                    Ok(())
                }
                Err(_) => Err(error),
            },
        }
    }

    /// Replaces `expected` with `new` and stores the ledger row of `new`'s operation,
    /// in one transaction. False when the store holds another entry.
    pub(super) fn replace_with_ledger(
        &mut self,
        session: &SessionId,
        expected: &OutboxEntry,
        new: OutboxEntry,
        scope: &ScopeId,
        record: LedgerRecord,
        now: Millis,
    ) -> Result<bool, OutboxError> {
        let written = self
            .mirror
            .replace_with_ledger(session, expected, new, scope, record);
        self.forget_unless_written(session, written, now)
    }

    /// The entry change `new`, with the ledger moved toward `proposed` in the same
    /// transaction when the lattice takes it.
    pub(super) fn replace_recording(
        &mut self,
        session: &SessionId,
        expected: &OutboxEntry,
        new: OutboxEntry,
        proposed: LedgerRecord,
        now: Millis,
    ) -> Result<bool, OutboxError> {
        let scope = ScopeId::of(session);
        match self.ledger_after(&scope, &new.operation_id, proposed)? {
            Some(record) => self.replace_with_ledger(session, expected, new, &scope, record, now),
            None => self.replace(session, expected, new, now),
        }
    }

    /// Moves the ledger toward `proposed` (no entry change).
    pub(super) fn record_ledger(
        &mut self,
        scope: &ScopeId,
        op: &OperationId,
        proposed: LedgerRecord,
    ) -> Result<(), OutboxError> {
        match self.ledger_after(scope, op, proposed)? {
            Some(record) => self.write_ledger(scope, op, record),
            None => Ok(()),
        }
    }

    /// Ledger sent, then the operation leaves the outbox of every alias (one store
    /// transaction). When the store fails, the memory fallback keeps the sent proof so
    /// the message is never sent again, and the error is returned.
    pub(crate) fn confirm_sent(
        &mut self,
        session: &SessionId,
        op: &OperationId,
        now: Millis,
    ) -> Result<(), OutboxError> {
        let scope = ScopeId::of(session);
        let [base, alias] = scope.members();
        let mut members = vec![base];
        if self.sessions.contains_key(&alias) || self.mirror.has_outbox(&alias)? {
            members.push(alias);
        }
        let current = self.ledger_of(&scope, op)?;
        let record = match transition(current.as_ref(), LedgerRecord::new(LedgerStatus::Sent, now))
        {
            Transition::Apply(r) => r,
            Transition::Keep => {
                current.unwrap_or_else(|| LedgerRecord::new(LedgerStatus::Sent, now))
            }
        };
        match self.mirror.confirm_sent(&scope, &members, op, &record) {
            Ok(()) => Ok(()),
            Err(e) => {
                // The fallback keeps the sent proof meanwhile; when it is full of sent
                // proofs, that is a failure of its own the user must see.
                if let Err(full) = self.fallback.record(&scope, op, record) {
                    let error = OutboxError::backend(full);
                    self.note_failure(session, Some(op), error, None);
                }
                self.forget(session, now);
                Err(e)
            }
        }
    }

    pub(crate) fn set_delivery(
        &mut self,
        op: &OperationId,
        delivery: RouteDelivery,
    ) -> Result<(), OutboxError> {
        let Some(route) = self.mirror.store.route(op)? else {
            return Ok(());
        };
        if route.delivery == delivery {
            return Ok(());
        }
        self.mirror.store.set_route_delivery(op, delivery)?;
        self.effects.push_back(CustodyEffect::RouteDeliveryChanged {
            operation_id: op.clone(),
            sender_session: route.sender_session_id,
            sender_call_id: route.sender_call_id,
            delivery,
        });
        Ok(())
    }

    /// Tells the embedding of a store failure that was handled without a retry (the
    /// memory ledger took the record, or the entry now shows the error).
    pub(super) fn note_failure(
        &mut self,
        session: &SessionId,
        op: Option<&OperationId>,
        error: OutboxError,
        retry_at: Option<Millis>,
    ) {
        if self.lease_lost(&error) {
            return;
        }
        self.stats.store_failures += 1;
        self.effects
            .push_back(CustodyEffect::StoreFailed(StoreFailure {
                session: session.clone(),
                operation_id: op.cloned(),
                error,
                retry_at,
            }));
    }
}
