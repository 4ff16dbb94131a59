//! Submit (OB-03, OB-04): validation, the claim, idempotent replay, conflicts, the
//! queue position of a new entry, and the one-commit hand-off of a message that finds
//! its session idle.

use timeline_core::time::Millis;

use super::{ConflictKind, Custody, LaneKind, SubmitError, SubmitRequest, ValidationError};
use crate::adapter::{Capabilities, SendKind};
use crate::entry::{
    Controls, HandoffPhase, Intent, MessageRequest, OutboxEntry, Receipt, SendMode,
};
use crate::fingerprint::request_fingerprint;
use crate::ids::{QueueId, RunId, ScopeId, SessionId};
use crate::ledger::LedgerStatus;
use crate::store::{Claim, Identity, OutboxError, OutboxStore};

/// The gap between positions a renumbering leaves.
pub(crate) const POSITION_STEP: i64 = 1 << 20;

impl<S: OutboxStore> Custody<S> {
    /// Takes custody of a message (OB-03, OB-04): validation, the claim in one
    /// transaction, idempotent replay, conflicts. A message that finds its session idle
    /// is handed off in the same transaction (see the module docs).
    pub fn submit(&mut self, req: SubmitRequest, now: Millis) -> Result<Receipt, SubmitError> {
        let submitted = self.submit_granted(req, now);
        if let Err(SubmitError::Store(error)) = &submitted {
            self.lease_lost(error);
        }
        submitted
    }

    fn submit_granted(&mut self, req: SubmitRequest, now: Millis) -> Result<Receipt, SubmitError> {
        let info = self
            .sessions
            .get(&req.session)
            .ok_or(ValidationError::UnknownSession)?;
        validate_controls(&req.controls, &req.request, &info.capabilities)?;
        let is_session_message = req
            .operation_id
            .as_str()
            .starts_with(crate::envelope::SESSION_MESSAGE_PREFIX);
        if is_session_message {
            return match self
                .mirror
                .store
                .identity(&req.session, &req.operation_id)?
            {
                Some(existing) => self.resubmit(req, existing, now),
                None => Err(ValidationError::ClientSessionMessage.into()),
            };
        }
        // An operation is one message in its whole scope: the same ID under another
        // alias is another message, a conflict.
        let others: Vec<SessionId> = crate::ids::ScopeId::of(&req.session)
            .members()
            .into_iter()
            .filter(|s| s != &req.session && self.sessions.contains_key(s))
            .collect();
        for other in others {
            if self
                .mirror
                .store
                .identity(&other, &req.operation_id)?
                .is_some()
            {
                return Err(SubmitError::Conflict(ConflictKind::DifferentRequest));
            }
        }
        let fp = request_fingerprint(&req.session, &req.queue_id, &req.request);
        // A new operation for a queue ID already queued: an edit.
        let queued = self.entry(&req.session, &req.queue_id)?;
        if let Some(current) = queued.filter(|e| e.operation_id != req.operation_id) {
            if current.state.is_sending() {
                return Err(SubmitError::Conflict(ConflictKind::DifferentRequest));
            }
            let mut new = current.clone();
            new.operation_id = req.operation_id.clone();
            new.request = req.request.clone();
            new.controls = req.controls.clone();
            return match self.mirror.rekey(&req.session, &current, &fp, new) {
                Ok(true) => {
                    self.wake(&req.session, now);
                    Ok(receipt(&req, false))
                }
                Ok(false) => {
                    self.forget(&req.session, now);
                    Err(SubmitError::Conflict(ConflictKind::DifferentRequest))
                }
                Err(OutboxError::OperationTaken(_)) => {
                    self.forget(&req.session, now);
                    Err(SubmitError::Conflict(ConflictKind::DifferentRequest))
                }
                Err(e) => {
                    self.forget(&req.session, now);
                    Err(e.into())
                }
            };
        }
        let position = self.place(&req.session, req.controls.intent, None, now)?;
        let entry = OutboxEntry::queued(
            req.queue_id.clone(),
            req.operation_id.clone(),
            req.request.clone(),
            req.controls.clone(),
            position,
        );
        if self.goes_out_at_once(&req.session, &entry, now)? {
            if let Some(run) = self.start_run(&req.session, &entry, now) {
                match self.claim_and_send(&req, &fp, &entry, run, now) {
                    Ok(Some(receipt)) => return Ok(receipt),
                    // The identity exists: the repeated submit's rules apply.
                    Ok(None) => {}
                    // The hand-off could not be recorded with the claim: save the entry
                    // alone, and let the drain meet the failure (and the memory ledger).
                    Err(error) => {
                        self.note_failure(&req.session, Some(&req.operation_id), error, None)
                    }
                }
            }
        }
        let claim = self.mirror.claim(&req.session, &fp, &entry);
        match claim {
            Ok(Claim::Claimed) => {
                self.wake(&req.session, now);
                Ok(receipt(&req, false))
            }
            Ok(Claim::Existing(existing)) => self.resubmit(req, existing, now),
            Err(e) => {
                self.forget(&req.session, now);
                Err(e.into())
            }
        }
    }

    /// True when `entry` would be the next message the normal lane sends and nothing
    /// stands in its way: then its claim records the hand-off too.
    fn goes_out_at_once(
        &mut self,
        session: &SessionId,
        entry: &OutboxEntry,
        now: Millis,
    ) -> Result<bool, OutboxError> {
        if entry.controls.send_mode == SendMode::SteerRunning || !entry.drainable() {
            return Ok(false);
        }
        // The stale reclaim of a new start (OB-14); whoever it frees is woken.
        for freed in self.reclaim_stale(now) {
            self.wake_scope(&freed, now);
        }
        let (normal_busy, steer_busy) = self.asked.busy(session);
        if normal_busy
            || steer_busy
            || self.asked.interrupts.contains_key(session)
            || self.runs.scope_ambiguous(session)
            || self.scope_run(session).is_some()
        {
            return Ok(false);
        }
        let state = self.state(session)?;
        if state.has_unaccepted_sending() {
            return Ok(false);
        }
        let first = state.drainable().next().map(|e| e.position);
        if first.is_some_and(|p| p <= entry.position) {
            return Ok(false);
        }
        // Only an operation with no ledger row is new enough to skip the drain's checks.
        let scope = ScopeId::of(session);
        Ok(self.ledger_of(&scope, &entry.operation_id)?.is_none())
    }

    /// The claim of a message that goes out at once: saved and handed off in one
    /// transaction, then the send. `None` when the operation was claimed before
    /// (nothing written); an error when nothing could be written.
    fn claim_and_send(
        &mut self,
        req: &SubmitRequest,
        fp: &crate::fingerprint::Digest256,
        entry: &OutboxEntry,
        run: RunId,
        now: Millis,
    ) -> Result<Option<Receipt>, OutboxError> {
        let session = req.session.clone();
        let scope = ScopeId::of(&session);
        let Some((sending, record)) = self.sending_record(entry, now) else {
            // Not queued: nothing to hand off; the plain claim saves it.
            self.end_run(&session, &run, now);
            return Ok(None);
        };
        match self
            .mirror
            .claim_sending(&session, fp, &sending, &scope, &record)
        {
            Ok(Claim::Claimed) => {
                self.dispatch(
                    &session,
                    sending,
                    SendKind::Start { run },
                    LaneKind::Normal,
                    now,
                );
                Ok(Some(receipt(req, false)))
            }
            Ok(Claim::Existing(_)) => {
                self.end_run(&session, &run, now);
                Ok(None)
            }
            Err(e) => {
                self.end_run(&session, &run, now);
                self.forget(&session, now);
                Err(e)
            }
        }
    }

    fn resubmit(
        &mut self,
        req: SubmitRequest,
        existing: Identity,
        now: Millis,
    ) -> Result<Receipt, SubmitError> {
        let fp = request_fingerprint(&req.session, &req.queue_id, &req.request);
        if existing.fingerprint != fp {
            return Err(SubmitError::Conflict(ConflictKind::DifferentRequest));
        }
        let current = self.state(&req.session)?.by_op(&req.operation_id).cloned();
        let Some(current) = current else {
            let scope = ScopeId::of(&req.session);
            let sent = self
                .ledger_of(&scope, &req.operation_id)?
                .is_some_and(|l| l.status == LedgerStatus::Sent);
            return if sent {
                Ok(receipt(&req, true))
            } else {
                Err(SubmitError::Conflict(ConflictKind::Removed))
            };
        };
        let (old, new) = (&current.controls, &req.controls);
        if old.send_mode == SendMode::SteerRunning
            && new.send_mode == SendMode::SteerRunning
            && old.expected_active_run_id != new.expected_active_run_id
        {
            return Err(SubmitError::Conflict(ConflictKind::SteerRetargeted));
        }
        // Queue, then send now: the same operation converges on the new controls. A
        // stop and send now in progress (OB-13) owns the entry until it is dedicated.
        let handing_off = current
            .state
            .handoff()
            .is_some_and(|h| h.phase == HandoffPhase::Requested);
        // An entry held with an error waits for the user's explicit send
        // ([`Custody::send_now`]); a repeated submit does not release it
        // ([`EntryState::resubmit`](crate::entry::EntryState::resubmit)).
        let resubmitted = current
            .state
            .resubmit()
            .filter(|_| new.intent != Intent::Enqueue && !handing_off);
        if let Some(state) = resubmitted {
            let mut updated = current.with_state(state);
            updated.controls = new.clone();
            if let Some(origin) = &mut updated.session_message {
                origin.approved = true;
            }
            updated.position =
                self.place(&req.session, new.intent, Some(&current.queue_id), now)?;
            if self.replace(&req.session, &current, updated.clone(), now)? {
                if updated.session_message.is_some() {
                    self.set_delivery(&updated.operation_id, crate::store::RouteDelivery::Sent)?;
                }
                self.wake(&req.session, now);
            }
        }
        Ok(receipt(&req, true))
    }

    /// A queue position for `intent` (ignoring the entry `moving`, which is the one
    /// placed): `enqueue` at the back; `automatic` and `replace-latest` at the front,
    /// behind entries that are sending.
    pub(crate) fn place(
        &mut self,
        session: &SessionId,
        intent: Intent,
        moving: Option<&QueueId>,
        now: Millis,
    ) -> Result<i64, OutboxError> {
        let state = self.state(session)?;
        let skip = moving
            .and_then(|q| state.get(q))
            .filter(|e| e.state.is_queued())
            .map(|e| e.position);
        let max = state.max_position();
        let sending_max = state.max_sending();
        let queued_min = state.min_queued_after(sending_max, skip);
        if intent == Intent::Enqueue {
            return Ok(max.map_or(0, |m| m.saturating_add(POSITION_STEP)));
        }
        match (sending_max, queued_min) {
            (_, None) => Ok(max.map_or(0, |m| m.saturating_add(POSITION_STEP))),
            (None, Some(q)) if q > i64::MIN / 2 => Ok(q - POSITION_STEP),
            (Some(s), Some(q)) if q - s >= 2 => Ok(s + (q - s) / 2),
            _ => {
                // No room: renumber the queue with wide gaps and place again.
                let order: Vec<QueueId> = state.ordered().map(|e| e.queue_id.clone()).collect();
                self.renumber(session, &order, now)?;
                self.place(session, intent, moving, now)
            }
        }
    }

    /// Gives the entries of `order` the positions of that order, with wide gaps (one
    /// store write), and memory follows.
    pub(crate) fn renumber(
        &mut self,
        session: &SessionId,
        order: &[QueueId],
        now: Millis,
    ) -> Result<(), OutboxError> {
        let positions: Vec<(QueueId, i64)> = order
            .iter()
            .enumerate()
            .map(|(i, q)| (q.clone(), (i as i64 + 1).saturating_mul(POSITION_STEP)))
            .collect();
        if let Err(e) = self.mirror.set_positions(session, &positions) {
            self.forget(session, now);
            return Err(e);
        }
        Ok(())
    }
}

pub(super) fn receipt(req: &SubmitRequest, replayed: bool) -> Receipt {
    Receipt {
        session_id: req.session.clone(),
        queue_id: req.queue_id.clone(),
        operation_id: req.operation_id.clone(),
        replayed,
    }
}

/// The control rules of OB-04 and the agent's capabilities.
pub fn validate_controls(
    controls: &Controls,
    request: &MessageRequest,
    caps: &Capabilities,
) -> Result<(), ValidationError> {
    match (controls.intent, controls.send_mode) {
        (Intent::Enqueue, m) if m != SendMode::Queue => {
            return Err(ValidationError::EnqueueNeedsQueue)
        }
        (Intent::ReplaceLatest, m) if m != SendMode::InterruptRunning => {
            return Err(ValidationError::ReplaceLatestNeedsInterrupt)
        }
        _ => {}
    }
    match (controls.send_mode, &controls.expected_active_run_id) {
        (SendMode::SteerRunning, None) => return Err(ValidationError::SteerNeedsRun),
        (m, Some(_)) if m != SendMode::SteerRunning => {
            return Err(ValidationError::RunIdOnlyForSteer)
        }
        _ => {}
    }
    if (controls.intent == Intent::ReplaceLatest) != request.rollback_before_send {
        return Err(ValidationError::RollbackNeedsReplaceLatest);
    }
    if controls.intent == Intent::ReplaceLatest && !caps.replace_latest {
        return Err(ValidationError::Unsupported("replace-latest"));
    }
    if controls.send_mode == SendMode::SteerRunning && !caps.steer {
        return Err(ValidationError::Unsupported("steer-running"));
    }
    if request.speed_mode.is_some() && !caps.speed_mode {
        return Err(ValidationError::Unsupported("speedMode"));
    }
    Ok(())
}
