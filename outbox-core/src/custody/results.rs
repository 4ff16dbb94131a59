//! Answers from the agent (OB-08, OB-09, OB-12): send results, delivery proofs, history
//! reads, run ends; and the start-up and outbox-load confirmation of entries still
//! sending (OB-10).
//!
//! Each answer names its attempt; only the current attempt's answer is applied. Each
//! `apply_*` step is idempotent, so an answer whose store write failed is applied
//! again later (see "Failures are state" in the module docs).

use timeline_core::time::Millis;

use super::{
    AttemptId, Custody, Effect, InFlight, PendingRead, ReadPurpose, Retry, SEND_PATH_DEADLINE,
};
use crate::adapter::{HistoryRead, ProofKind, SendKind, SendResult};
use crate::entry::{
    HandoffPhase, OutboxEntry, StoredEntry, STOPPED_BEFORE_DELIVERY_TEXT, UNCONFIRMED_TEXT,
};
use crate::ids::{base_session, OperationId, RunId, SessionId};
use crate::ledger::{reopen, LedgerRecord, LedgerStatus};
use crate::store::{OutboxStore, StoreError};

impl<S: OutboxStore> Custody<S> {
    /// The result of send attempt `attempt`. A result for an attempt that is not in
    /// flight (after its deadline, answered before, or replaced) is ignored. A result
    /// changes the entry only while it still equals the snapshot taken when it went
    /// sending; the ledger moves only toward stronger proof either way.
    pub fn handle_send_result(&mut self, attempt: AttemptId, result: SendResult, now: Millis) {
        let Some(f) = self.in_flight.remove(&attempt) else {
            self.stats.stale_answers += 1;
            return;
        };
        self.run_answer(Retry::Send(Box::new(f), result), now);
    }

    pub(super) fn apply_send_result(
        &mut self,
        f: InFlight,
        result: SendResult,
        now: Millis,
    ) -> Result<(), StoreError> {
        let session = f.request.session.clone();
        let op = f.request.operation_id.clone();
        let started = match &f.request.kind {
            SendKind::Start { run } => Some(run.clone()),
            SendKind::Steer { .. } => None,
        };
        let current = self
            .entry(&session, &f.snapshot.queue_id)?
            .filter(|e| e == &f.snapshot);
        match result {
            SendResult::Delivered => self.confirm_sent(&session, &op, now)?,
            SendResult::Accepted(acceptance) => {
                if let Some(run) = &started {
                    self.runs.touch(&session, run, now);
                }
                let mut record = LedgerRecord::new(LedgerStatus::Sending, now);
                record.acceptance = Some(acceptance.clone());
                let accepted = current.and_then(|e| Some((e.state.accept(acceptance)?, e)));
                match accepted {
                    Some((state, e)) => {
                        self.replace_recording(&session, &e, e.with_state(state), record)?;
                    }
                    None => self.record_ledger(&base_session(&session), &op, record)?,
                }
            }
            SendResult::Deferred { reason } => {
                if let Some(run) = &started {
                    self.runs.end(&session, run);
                }
                let deferred = current.and_then(|e| Some((e.state.defer(reason)?, e)));
                if let Some((state, e)) = deferred {
                    self.replace(&session, &e, e.with_state(state))?;
                }
            }
            SendResult::Canceled => {
                if let Some(run) = &started {
                    self.runs.end(&session, run);
                }
                let record = LedgerRecord::new(LedgerStatus::Canceled, now);
                self.hold_recording(&session, current, &op, None, record)?;
            }
            SendResult::ProvenUnadmitted { error } => {
                if let Some(run) = &started {
                    self.runs.end(&session, run);
                }
                let record = LedgerRecord::new(LedgerStatus::Failed, now);
                self.hold_recording(&session, current, &op, Some(error), record)?;
            }
            SendResult::AdmissionUncertain { .. } => {
                if !self.reading(&session, &op) {
                    self.read_history(&session, ReadPurpose::Confirm, f.snapshot.clone());
                }
            }
            SendResult::ThreadGone => {
                // Nothing reached the old thread: clear the link and send to a fresh one,
                // as a new attempt.
                self.effects.push_back(Effect::ClearThreadLink {
                    session: session.clone(),
                });
                let attempt = self.next_attempt();
                let mut request = f.request.clone();
                request.attempt = attempt;
                request.fresh_thread = true;
                request.rollback_before_send = false;
                self.in_flight.insert(
                    attempt,
                    InFlight {
                        request: request.clone(),
                        deadline: now.saturating_add(SEND_PATH_DEADLINE),
                        ..f
                    },
                );
                self.effects.push_back(Effect::Send(request));
                return Ok(());
            }
        }
        self.finish(&session, f.lane, now);
        Ok(())
    }

    /// Puts `current` (when it is still the entry) back in the queue with auto-drain
    /// off, showing `error`, with the ledger moved toward `record` in the same
    /// transaction; only the ledger when the entry changed meanwhile.
    fn hold_recording(
        &mut self,
        session: &SessionId,
        current: Option<OutboxEntry>,
        op: &OperationId,
        error: Option<String>,
        record: LedgerRecord,
    ) -> Result<(), StoreError> {
        match current {
            Some(e) => {
                let held = e.with_state(e.state.hold(error));
                self.replace_recording(session, &e, held, record)?;
            }
            None => self.record_ledger(&base_session(session), op, record)?,
        }
        Ok(())
    }

    /// The agent echoed the operation (Codex `clientId`, Claude transcript UUID): the
    /// ledger says sent, then the entry leaves every alias. A proof is the agent's
    /// history speaking, so it belongs to no attempt.
    pub fn handle_delivery_proof(&mut self, session: &SessionId, op: &OperationId, now: Millis) {
        self.run_answer(Retry::Proof(session.clone(), op.clone()), now);
    }

    pub(super) fn apply_delivery_proof(
        &mut self,
        session: &SessionId,
        op: &OperationId,
        now: Millis,
    ) -> Result<(), StoreError> {
        self.confirm_sent(session, op, now)?;
        self.wake_scope(session, now);
        Ok(())
    }

    /// The answer to [`Effect::ReadHistory`] `attempt`.
    pub fn handle_history_read(&mut self, attempt: AttemptId, read: HistoryRead, now: Millis) {
        let Some(p) = self.reads.remove(&attempt) else {
            self.stats.stale_answers += 1;
            return;
        };
        self.run_answer(Retry::Read(Box::new(p), read), now);
    }

    pub(super) fn apply_history_read(
        &mut self,
        p: PendingRead,
        read: HistoryRead,
        now: Millis,
    ) -> Result<(), StoreError> {
        let session = p.session.clone();
        let op = p.snapshot.operation_id.clone();
        let base = base_session(&session);
        let current = self
            .entry(&session, &p.snapshot.queue_id)?
            .filter(|e| e == &p.snapshot);
        match (p.purpose, read) {
            (_, HistoryRead::Found) => self.confirm_sent(&session, &op, now)?,
            (ReadPurpose::Reopen, HistoryRead::Missing) => {
                // Readable and not there: a canceled record reopens (OB-12), and an
                // acceptance nothing applied is dropped, so the next send goes out.
                if let Some(mut l) = self.ledger_of(&base, &op)? {
                    if let Some(r) = reopen(&l, now) {
                        self.write_ledger(&base, &op, r)?;
                    } else if l.acceptance.take().is_some() {
                        l.updated_at = now;
                        self.write_ledger(&base, &op, l)?;
                    }
                }
                if let Some(e) = current {
                    self.release_to_front(&session, &e, now)?;
                }
            }
            (_, HistoryRead::Missing) => {
                // Readable and not there: whatever turn accepted it did not apply it.
                if let Some(mut l) = self.ledger_of(&base, &op)? {
                    if l.acceptance.take().is_some() {
                        l.updated_at = now;
                        self.write_ledger(&base, &op, l)?;
                    }
                }
                if let Some(e) = current {
                    self.hold_unconfirmed(&session, &e)?;
                }
            }
            (_, HistoryRead::Unreadable) => {
                if let Some(e) = current {
                    self.hold_unconfirmed(&session, &e)?;
                }
            }
        }
        self.wake_scope(&session, now);
        Ok(())
    }

    /// True while a history read of (`session`, `op`) is pending.
    pub(super) fn reading(&self, session: &SessionId, op: &OperationId) -> bool {
        self.reads
            .values()
            .any(|p| &p.session == session && &p.snapshot.operation_id == op)
    }

    fn sending_now(&self, session: &SessionId, op: &OperationId) -> bool {
        self.in_flight
            .values()
            .any(|f| &f.request.session == session && &f.request.operation_id == op)
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
        self.reads
            .retain(|_, p| !(&p.session == session && p.snapshot.operation_id == operation_id));
        self.reads.insert(
            attempt,
            PendingRead {
                session: session.clone(),
                purpose,
                snapshot,
            },
        );
        self.effects.push_back(Effect::ReadHistory {
            attempt,
            session: session.clone(),
            operation_id,
            proof,
        });
    }

    /// Saves `waiting` in place of `head` and, when that took (nobody changed the entry
    /// meanwhile), asks for the history read of `purpose`.
    pub(super) fn read_after_replace(
        &mut self,
        session: &SessionId,
        head: &OutboxEntry,
        waiting: OutboxEntry,
        purpose: ReadPurpose,
    ) -> Result<(), StoreError> {
        if self.replace(session, head, waiting.clone())? {
            self.read_history(session, purpose, waiting);
        }
        Ok(())
    }

    fn hold_unconfirmed(&mut self, session: &SessionId, e: &OutboxEntry) -> Result<(), StoreError> {
        let held = e.state.hold(Some(UNCONFIRMED_TEXT.to_owned()));
        self.replace(session, e, e.with_state(held))?;
        Ok(())
    }

    /// A run ended. Accepted messages the agent reported as not taken come back with
    /// auto-drain off; the rest of the run's accepted messages are confirmed from
    /// history.
    pub fn handle_run_ended(
        &mut self,
        session: &SessionId,
        run: &RunId,
        untaken: &[OperationId],
        now: Millis,
    ) {
        self.runs.end(session, run);
        self.settle_or_retry(session.clone(), run.clone(), untaken.to_vec(), false, now);
        self.wake_scope(session, now);
    }

    /// Settles the entries `run` accepted: a requested hand-off is dedicated, an
    /// untaken steer is canceled and held (with the stop text when a stop ended the
    /// run), and the rest are confirmed from history.
    pub(super) fn settle_run(
        &mut self,
        session: &SessionId,
        run: &RunId,
        untaken: &[OperationId],
        stopped: bool,
        now: Millis,
    ) -> Result<(), StoreError> {
        let accepted: Vec<OutboxEntry> = self.state(session)?.accepted().cloned().collect();
        for e in accepted {
            // A detached steer waits queued for its run to stop; an entry that went
            // sending again meanwhile is never pulled back.
            let detached = e.state.is_queued()
                && e.state.handoff().is_some_and(|h| {
                    h.phase == HandoffPhase::Requested && &h.acceptance.run_id == run
                });
            if detached {
                self.dedicate(session, &e)?;
                continue;
            }
            // Only a sending entry holds an acceptance.
            if e.state.acceptance().is_none_or(|acc| &acc.run_id != run) {
                continue;
            }
            if untaken.contains(&e.operation_id) {
                let error = stopped.then(|| STOPPED_BEFORE_DELIVERY_TEXT.to_owned());
                let record = LedgerRecord::new(LedgerStatus::Canceled, now);
                let held = e.with_state(e.state.hold(error));
                self.replace_recording(session, &e, held, record)?;
            } else if !self.reading(session, &e.operation_id) {
                self.read_history(session, ReadPurpose::Confirm, e);
            }
        }
        Ok(())
    }

    /// A turn that starts after its predecessor removed the run puts the run back
    /// (OB-14); refused when a different run is active.
    pub fn restore_run(
        &mut self,
        session: &SessionId,
        run: crate::runs::ActiveRun,
    ) -> Result<(), crate::runs::RunError> {
        self.runs.restore(session, run)
    }

    /// Records agent activity of a run (for the stale reclaim).
    pub fn touch_run(&mut self, session: &SessionId, run: &RunId, now: Millis) {
        self.runs.touch(session, run, now);
    }

    // ----- start-up and outbox loads (OB-10) -------------------------------------------

    /// At start-up: both lanes start for every saved outbox, and every entry still
    /// sending is confirmed from history (held with the unconfirmed text when the ledger
    /// cannot be read). Each outbox is read once here and kept in memory.
    pub fn start_up(&mut self, now: Millis) -> Result<(), StoreError> {
        let sessions: Vec<SessionId> = self.outbox_sessions()?.iter().cloned().collect();
        for session in sessions {
            self.confirm_sending(&session)?;
            self.wake(&session, now);
        }
        Ok(())
    }

    /// A client loads an outbox. With no drain and no run active, every entry still
    /// sending is confirmed from history.
    pub fn load_outbox(&mut self, session: &SessionId) -> Result<Vec<StoredEntry>, StoreError> {
        let (normal, steer) = self.lane_busy(session);
        if !normal && !steer && self.scope_run(session).is_none() {
            self.confirm_sending(session)?;
        }
        self.entries(session)
    }

    fn confirm_sending(&mut self, session: &SessionId) -> Result<(), StoreError> {
        let base = base_session(session);
        // A stop and send now whose take-back was confirmed waits for its run to stop;
        // when that run is gone (a restart drops every run), it goes on to its own turn.
        let detached: Vec<OutboxEntry> = self
            .state(session)?
            .accepted()
            .filter(|e| {
                e.state.is_queued()
                    && e.state
                        .handoff()
                        .is_some_and(|h| h.phase == HandoffPhase::Requested)
            })
            .cloned()
            .collect();
        for e in detached {
            let run_active = e.state.handoff().is_some_and(|h| {
                self.runs
                    .active(session)
                    .is_some_and(|a| a.run_id == h.acceptance.run_id)
            });
            if !run_active {
                self.dedicate(session, &e)?;
            }
        }
        let sending: Vec<OutboxEntry> = self.state(session)?.sending().cloned().collect();
        for e in sending {
            if self.reading(session, &e.operation_id) || self.sending_now(session, &e.operation_id)
            {
                continue;
            }
            if let Err(error) = self.ledger_of(&base, &e.operation_id) {
                // The seed's rule: an unreadable ledger holds the entry with the same
                // text; the embedding learns why.
                self.hold_unconfirmed(session, &e)?;
                self.note_failure(session, Some(&e.operation_id), error, None);
                continue;
            }
            self.read_history(session, ReadPurpose::Confirm, e);
        }
        Ok(())
    }
}
