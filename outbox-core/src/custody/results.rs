//! Answers from the agent (OB-08, OB-09, OB-12): send results, delivery proofs, history
//! reads, run ends, run activity (the start-up and outbox-load confirmation of entries
//! still sending is in `startup`).
//!
//! Each answer names its attempt; only the current attempt's answer is applied. Each
//! `apply_*` step is idempotent, so an answer whose store write failed is applied
//! again later (see "Failures are state" in the module docs).

use crate::adapter::ReadHistoryRequest;
use timeline_core::time::Millis;

use super::run_life::awaited_run;
use super::{
    AttemptId, Custody, CustodyEffect, InFlight, PendingRead, ReadPurpose, Work, SEND_PATH_DEADLINE,
};
use crate::adapter::{HistoryRead, ProofKind, SendKind, SendResult};
use crate::entry::{
    EntryState, OutboxEntry, REOPEN_CHECK_TEXT, STOPPED_BEFORE_DELIVERY_TEXT, UNCONFIRMED_TEXT,
};
use crate::ids::{OperationId, ScopeId, SessionId};
use crate::ledger::{reopen, LedgerRecord, LedgerStatus};
use crate::store::{OutboxError, OutboxStore};

/// How often recording a rollback reads the entry again when the store held another
/// version than memory.
const MAX_STALE_READS: usize = 3;

/// How many rolled-back operations custody remembers beside the store.
const ROLLED_BACK_KEPT: usize = 1_024;

impl<S: OutboxStore> Custody<S> {
    /// The result of send attempt `attempt`. A result for an attempt that is not in
    /// flight (after its deadline, answered before, or replaced) is ignored. A result
    /// changes the entry only while it still equals the snapshot taken when it went
    /// sending; the ledger moves only toward stronger proof either way.
    pub fn handle_send_result(&mut self, attempt: AttemptId, result: SendResult, now: Millis) {
        let Some(f) = self.asked.in_flight.remove(&attempt) else {
            self.stats.stale_answers += 1;
            return;
        };
        self.run_work(Work::Send(Box::new(f), result), now);
    }

    pub(super) fn apply_send_result(
        &mut self,
        f: InFlight,
        result: SendResult,
        now: Millis,
    ) -> Result<(), OutboxError> {
        let session = f.request.session.clone();
        let op = f.request.operation_id.clone();
        let started = match &f.request.kind {
            SendKind::Start { run } => Some(run.clone()),
            SendKind::Steer { .. } => None,
        };
        // The entry as it went sending; a renumbering of the queue may have moved it.
        let current = self
            .entry(&session, &f.snapshot.queue_id)?
            .filter(|e| e.same_but_position(&f.snapshot));
        match result {
            SendResult::Delivered => self.confirm_sent(&session, &op, now)?,
            SendResult::Accepted(acceptance) => {
                if let Some(run) = &started {
                    self.runs.touch(&session, run, now);
                    self.shared_touched(&session, run);
                }
                let run_gone = !self.run_working(&session, &acceptance.run_id);
                let mut record = LedgerRecord::new(LedgerStatus::Sending, now);
                record.acceptance = Some(acceptance.clone());
                let accepted = current.and_then(|e| Some((e.state.accept(acceptance)?, e)));
                match accepted {
                    Some((state, e)) => {
                        let new = e.with_state(state);
                        let written =
                            self.replace_recording(&session, &e, new.clone(), record, now)?;
                        // The run ended before its acceptance arrived, so no run end will
                        // settle it: its history says now whether the run took it.
                        if written && run_gone {
                            self.read_history(&session, ReadPurpose::Settle, new);
                        }
                    }
                    None => self.record_ledger(&ScopeId::of(&session), &op, record)?,
                }
            }
            SendResult::Deferred { reason } => {
                if let Some(run) = &started {
                    self.end_run(&session, run, now);
                }
                let deferred = current.and_then(|e| Some((e.state.defer(reason)?, e)));
                if let Some((state, e)) = deferred {
                    self.replace(&session, &e, e.with_state(state), now)?;
                }
                self.settle_unstarted(&session, started.as_ref(), now)?;
            }
            SendResult::Canceled => {
                if let Some(run) = &started {
                    self.end_run(&session, run, now);
                }
                let record = LedgerRecord::new(LedgerStatus::Canceled, now);
                self.hold_recording(&session, current, &op, EntryState::cancel, record, now)?;
                self.settle_unstarted(&session, started.as_ref(), now)?;
            }
            SendResult::ProvenUnadmitted { error } => {
                if let Some(run) = &started {
                    self.end_run(&session, run, now);
                }
                let record = LedgerRecord::new(LedgerStatus::Failed, now);
                let held = |s: &EntryState| s.hold(Some(error));
                self.hold_recording(&session, current, &op, held, record, now)?;
                self.settle_unstarted(&session, started.as_ref(), now)?;
            }
            SendResult::AdmissionUncertain { .. } => {
                if !self.reading(&session, &f.snapshot) {
                    self.read_history(&session, ReadPurpose::Confirm, f.snapshot.clone());
                }
            }
            SendResult::ThreadGone => {
                // The turn every waiting replace latest of the session meant to roll back
                // went with the old thread, and a fresh thread has none: none of them
                // rolls back, now or on a later attempt (one submitted later does).
                let moot: Vec<OperationId> = self
                    .state(&session)?
                    .ordered()
                    .filter(|e| e.request.rollback_before_send)
                    .map(|e| e.operation_id.clone())
                    .collect();
                for o in moot {
                    self.note_rolled_back(&session, &o);
                    self.apply_rolled_back(&session, &o, now)?;
                }
                // Nothing reached the old thread: clear the link and send to a fresh one,
                // as a new attempt.
                self.effects.push_back(CustodyEffect::ClearThreadLink {
                    session: session.clone(),
                });
                let attempt = self.next_attempt();
                let mut request = f.request.clone();
                request.attempt = attempt;
                request.fresh_thread = true;
                request.rollback_before_send = false;

                self.asked.in_flight.insert(
                    attempt,
                    InFlight {
                        request: request.clone(),
                        deadline: now.saturating_add(SEND_PATH_DEADLINE),
                        ..f
                    },
                );
                self.effects.push_back(CustodyEffect::Send(request));
                return Ok(());
            }
        }
        self.finish(&session, f.lane, now);
        Ok(())
    }

    /// Puts `current` (when it is still the entry) back in the queue with auto-drain
    /// off, in the state `held` makes of it, with the ledger moved toward `record` in
    /// the same transaction; only the ledger when the entry changed meanwhile.
    fn hold_recording(
        &mut self,
        session: &SessionId,
        current: Option<OutboxEntry>,
        op: &OperationId,
        held: impl FnOnce(&EntryState) -> EntryState,
        record: LedgerRecord,
        now: Millis,
    ) -> Result<(), OutboxError> {
        match current {
            Some(e) => {
                let held = e.with_state(held(&e.state));
                self.replace_recording(session, &e, held, record, now)?;
            }
            None => self.record_ledger(&ScopeId::of(session), op, record)?,
        }
        Ok(())
    }

    /// The agent echoed the operation (Codex `clientId`, Claude transcript UUID): the
    /// ledger says sent, then the entry leaves every alias. A proof is the agent's
    /// history speaking, so it belongs to no attempt.
    pub fn handle_delivery_proof(&mut self, session: &SessionId, op: &OperationId, now: Millis) {
        self.run_work(Work::Proof(session.clone(), op.clone()), now);
    }

    pub(super) fn apply_delivery_proof(
        &mut self,
        session: &SessionId,
        op: &OperationId,
        now: Millis,
    ) -> Result<(), OutboxError> {
        self.confirm_sent(session, op, now)?;
        self.wake_scope(session, now);
        Ok(())
    }

    /// The agent rolled back its latest turn for `op`, a replace latest (OB-11), or
    /// may have: it asked for the rollback. A message rolls back at most once: the
    /// entry's `rollback_before_send` is cleared in the store, so no later attempt (a
    /// retry after a refusal, a deferral or a lost answer, the user's send again, a
    /// send after a restart) rolls back a second turn. Said before the attempt's
    /// result or after it; an operation no entry holds any more is left alone.
    pub fn handle_rolled_back(&mut self, session: &SessionId, op: &OperationId, now: Millis) {
        self.note_rolled_back(session, op);
        self.run_work(Work::RolledBack(session.clone(), op.clone()), now);
    }

    /// Memory's part of [`Custody::handle_rolled_back`]: holds while the store write
    /// waits for a retry.
    fn note_rolled_back(&mut self, session: &SessionId, op: &OperationId) {
        let key = (session.clone(), op.clone());
        let (known, order) = &mut self.rolled_back;
        if known.insert(key.clone()) {
            order.push_back(key);
            while order.len() > ROLLED_BACK_KEPT {
                if let Some(old) = order.pop_front() {
                    known.remove(&old);
                }
            }
        }
    }

    /// True when the agent rolled back for `op` (memory's part; the store's is the
    /// entry's cleared `rollback_before_send`).
    pub(super) fn rolled_back(&self, session: &SessionId, op: &OperationId) -> bool {
        self.rolled_back.0.contains(&(session.clone(), op.clone()))
    }

    pub(super) fn apply_rolled_back(
        &mut self,
        session: &SessionId,
        op: &OperationId,
        now: Millis,
    ) -> Result<(), OutboxError> {
        // A store that held another version than memory (`false`) is read again.
        for _ in 0..MAX_STALE_READS {
            let Some(e) = self.state(session)?.by_op(op).cloned() else {
                break;
            };
            if !e.request.rollback_before_send || self.replace(session, &e, e.rolled_back(), now)? {
                break;
            }
        }
        for f in self.asked.in_flight.values_mut() {
            if &f.request.session == session && &f.request.operation_id == op {
                f.request.rollback_before_send = false;
            }
        }
        Ok(())
    }

    /// The answer to [`CustodyEffect::ReadHistory`] `attempt`.
    pub fn handle_history_read(&mut self, attempt: AttemptId, read: HistoryRead, now: Millis) {
        let Some(p) = self.asked.reads.remove(&attempt) else {
            self.stats.stale_answers += 1;
            return;
        };
        self.run_work(Work::Read(Box::new(p), read), now);
    }

    pub(super) fn apply_history_read(
        &mut self,
        p: PendingRead,
        read: HistoryRead,
        now: Millis,
    ) -> Result<(), OutboxError> {
        let session = p.session.clone();
        let op = p.snapshot.operation_id.clone();
        let scope = ScopeId::of(&session);
        let current = self
            .entry(&session, &p.snapshot.queue_id)?
            .filter(|e| e.same_but_position(&p.snapshot));
        // A history read does not see what a running turn holds as pending input: while
        // the run the message waits in works, "missing" or "unreadable" proves nothing.
        // What the run accepted stays accepted and its end settles it; an uncertain
        // steer is shown held with the seed's text, and its run's end reads history
        // again (OB-08, OB-15).
        let waits_in_run = awaited_run(&p.snapshot).is_some_and(|r| self.run_working(&session, r));
        match (p.purpose, read) {
            (_, HistoryRead::Found) => self.confirm_sent(&session, &op, now)?,
            (ReadPurpose::Reopen, HistoryRead::Missing)
            | (ReadPurpose::UserSend, HistoryRead::Missing | HistoryRead::Unreadable) => {
                // Readable and not there, or the user's own send after being asked to
                // check the timeline: a canceled record reopens (OB-12), and an
                // acceptance nothing applied is dropped, so the next send goes out.
                if let Some(mut l) = self.ledger_of(&scope, &op)? {
                    if let Some(r) = reopen(&l, now) {
                        self.write_ledger(&scope, &op, r)?;
                    } else if l.acceptance.take().is_some() {
                        l.updated_at = now;
                        self.write_ledger(&scope, &op, l)?;
                    }
                }
                if let Some(e) = current {
                    self.release_to_front(&session, &e, now)?;
                }
            }
            (_, HistoryRead::Missing | HistoryRead::Unreadable) if waits_in_run => {
                if let Some(e) = current.filter(|e| e.state.acceptance().is_none()) {
                    self.hold_unconfirmed(&session, &e, now)?;
                }
            }
            (ReadPurpose::Settle, HistoryRead::Missing) => {
                // The run is over and its history does not hold the message: a message
                // it accepted it did not take (OB-11, OB-15). Of a steer no turn
                // accepted, custody knows only that it cannot confirm it (OB-08).
                match current {
                    Some(e) if e.state.acceptance().is_some() => {
                        self.settle_untaken(&session, &e, false, now)?;
                    }
                    Some(e) => self.hold_unconfirmed(&session, &e, now)?,
                    None => {}
                }
            }
            (_, HistoryRead::Missing) => {
                // Readable and not there: whatever turn accepted it did not apply it.
                self.drop_acceptance(&scope, &op, now)?;
                if let Some(e) = current {
                    self.hold_unconfirmed(&session, &e, now)?;
                }
            }
            (_, HistoryRead::Unreadable) => {
                if let Some(e) = current {
                    self.hold_unconfirmed(&session, &e, now)?;
                }
            }
        }
        self.wake_scope(&session, now);
        Ok(())
    }

    /// True while a history read is pending whose answer applies to `e` as it is: a
    /// read taken for the entry in another state (it changed since) settles nothing.
    pub(super) fn reading(&self, session: &SessionId, e: &OutboxEntry) -> bool {
        self.asked
            .reads
            .values()
            .any(|p| &p.session == session && e.same_but_position(&p.snapshot))
    }

    /// True when nothing under way will settle `e` as it is: no send in flight, history
    /// read or take-back pending, and no answer waiting for a retry of its write, that
    /// was taken for the entry in this state. One taken for the entry in another state
    /// (it changed since) applies to nothing, so it does not count.
    pub(super) fn nothing_in_flight(&self, session: &SessionId, e: &OutboxEntry) -> bool {
        let sending = self
            .asked
            .in_flight
            .values()
            .any(|f| &f.request.session == session && e.same_but_position(&f.snapshot));
        let taking_back = self
            .asked
            .take_backs
            .values()
            .any(|t| &t.session == session && e.same_but_position(&t.snapshot));
        let answer_kept = self.retries.iter().any(|(_, r)| match r {
            Work::Send(f, _) => &f.request.session == session && e.same_but_position(&f.snapshot),
            Work::Read(p, _) => &p.session == session && e.same_but_position(&p.snapshot),
            Work::TakeBack(t, _, _) => &t.session == session && e.same_but_position(&t.snapshot),
            Work::Proof(s, op) => s == session && op == &e.operation_id,
            Work::RolledBack(..) | Work::Wake(_) | Work::Settle { .. } | Work::Repair(_) => false,
        });
        !(self.reading(session, e) || sending || taking_back || answer_kept)
    }

    /// Asks the adapter to read the agent's history for `snapshot`'s operation, as a new
    /// attempt, and remembers what the answer is for.
    pub(super) fn read_history(
        &mut self,
        session: &SessionId,
        purpose: ReadPurpose,
        snapshot: OutboxEntry,
    ) {
        self.supersede(session, &snapshot.operation_id);
        let attempt = self.next_attempt();
        let operation_id = snapshot.operation_id.clone();
        let proof = self
            .sessions
            .get(session)
            .map_or(ProofKind::ClientIdEcho, |i| i.capabilities.proof);
        // A newer read of the same operation replaces an older one: only its answer
        // counts.
        self.asked
            .reads
            .retain(|_, p| !(&p.session == session && p.snapshot.operation_id == operation_id));
        self.asked.reads.insert(
            attempt,
            PendingRead {
                session: session.clone(),
                purpose,
                snapshot,
            },
        );
        self.effects
            .push_back(CustodyEffect::ReadHistory(ReadHistoryRequest {
                attempt,
                session: session.clone(),
                operation_id,
                proof,
            }));
    }

    /// Saves `waiting` in place of `head` and, when that took (nobody changed the entry
    /// meanwhile), asks for the history read of `purpose`.
    pub(super) fn read_after_replace(
        &mut self,
        session: &SessionId,
        head: &OutboxEntry,
        waiting: OutboxEntry,
        purpose: ReadPurpose,
        now: Millis,
    ) -> Result<(), OutboxError> {
        if self.replace(session, head, waiting.clone(), now)? {
            self.read_history(session, purpose, waiting);
        }
        Ok(())
    }

    pub(super) fn hold_unconfirmed(
        &mut self,
        session: &SessionId,
        e: &OutboxEntry,
        now: Millis,
    ) -> Result<(), OutboxError> {
        // The reopen check is over: its wait shows no more.
        let state = match e.state.release() {
            Some(released) if e.state.hold_reason() == Some(REOPEN_CHECK_TEXT) => released,
            _ => e.state.clone(),
        };
        let held = state.hold(Some(UNCONFIRMED_TEXT.to_owned()));
        self.replace(session, e, e.with_state(held), now)?;
        Ok(())
    }

    /// Drops the acceptance from the ledger row of `op`: whatever turn accepted it did
    /// not apply it.
    fn drop_acceptance(
        &mut self,
        scope: &ScopeId,
        op: &OperationId,
        now: Millis,
    ) -> Result<(), OutboxError> {
        if let Some(mut l) = self.ledger_of(scope, op)? {
            if l.acceptance.take().is_some() {
                l.updated_at = now;
                self.write_ledger(scope, op, l)?;
            }
        }
        Ok(())
    }

    /// The run that ended did not take `e` (OB-11, OB-15): the agent said so
    /// (`reported`: the ledger says canceled), or its history, read after the run, does
    /// not hold the message it accepted (the acceptance is dropped). It returns with
    /// auto-drain off and the seed's text. So does a stop and send now whose take-back
    /// the agent never confirmed: only a confirmed detach sends an accepted message again
    /// by itself (OB-13); the user sends it again, or not.
    pub(super) fn settle_untaken(
        &mut self,
        session: &SessionId,
        e: &OutboxEntry,
        reported: bool,
        now: Millis,
    ) -> Result<(), OutboxError> {
        let scope = ScopeId::of(session);
        if matches!(e.state, EntryState::HandingOff { .. })
            && self
                .ledger_of(&scope, &e.operation_id)?
                .is_some_and(|l| l.status == LedgerStatus::Sent)
        {
            return self.confirm_sent(session, &e.operation_id, now);
        }
        let held = e.with_state(e.state.hold(Some(STOPPED_BEFORE_DELIVERY_TEXT.to_owned())));
        if reported {
            let record = LedgerRecord::new(LedgerStatus::Canceled, now);
            self.replace_recording(session, e, held, record, now)?;
        } else {
            self.drop_acceptance(&scope, &e.operation_id, now)?;
            self.replace(session, e, held, now)?;
        }
        Ok(())
    }
}
