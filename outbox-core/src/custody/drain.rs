//! The drain lanes (OB-10): two lanes per session, normal and steer, each with a guard
//! and a follow-up flag so no wake-up is lost; the hold check of session messages; run
//! starts and the hand-off of a message to the agent (OB-09).
//!
//! A pass reads nothing from the store: it asks the session's in-memory outbox, whose
//! indexes answer in O(log n).

use std::collections::BTreeSet;

use timeline_core::time::Millis;

use super::SENDING_WRITE_FAILED_TEXT;
use super::{Custody, CustodyEffect, InFlight, LaneKind, ReadPurpose, Work, SEND_PATH_DEADLINE};
use crate::adapter::{SendKind, SendRequest};
use crate::entry::{OutboxEntry, SendMode};
use crate::fingerprint::admission_input_digest;
use crate::ids::{QueueId, RunId, ScopeId, SessionId};
use crate::ledger::{reopen, transition, LedgerRecord, LedgerStatus, Transition};
use crate::store::{OutboxError, OutboxStore, RouteDelivery};

impl<S: OutboxStore> Custody<S> {
    /// Wakes both drain lanes of a session. A lane that is busy records a follow-up that
    /// its finishing pass runs, so no wake-up is lost.
    pub fn wake(&mut self, session: &SessionId, now: Millis) {
        self.pass(session, LaneKind::Normal, now);
        self.pass(session, LaneKind::Steer, now);
    }

    /// Wakes every session of the scope of `session`.
    pub(super) fn wake_scope(&mut self, session: &SessionId, now: Millis) {
        // The registered members of the scope, and `session` itself in any case.
        let members: Vec<SessionId> = crate::ids::ScopeId::of(session)
            .members()
            .into_iter()
            .filter(|s| s == session || self.sessions.contains_key(s))
            .collect();
        for s in members {
            self.wake(&s, now);
        }
    }

    /// Whether the normal and the steer lane of `session` are busy (for tests of lost
    /// wake-ups).
    #[cfg(feature = "testing")]
    pub fn lane_busy(&self, session: &SessionId) -> (bool, bool) {
        self.asked.busy(session)
    }

    /// Whether the normal and the steer lane of `session` are busy.
    #[cfg(not(feature = "testing"))]
    pub(crate) fn lane_busy(&self, session: &SessionId) -> (bool, bool) {
        self.asked.busy(session)
    }

    fn pass(&mut self, session: &SessionId, kind: LaneKind, now: Millis) {
        let lane = self.asked.lane(session, kind);
        if lane.busy {
            lane.follow_up = true;
            return;
        }
        lane.follow_up = false;
        if !self.sessions.contains_key(session) {
            return;
        }
        // The stale reclaim runs at each new start (OB-14): a stale run must not keep
        // the queue waiting until a client reads the active runs.
        self.reclaim_before_start(session, now);
        if self.runs.scope_ambiguous(session) {
            return;
        }
        // The steer lane only ever joins this session's active run.
        if kind == LaneKind::Steer && self.runs.active(session).is_none() {
            return;
        }
        let result = match kind {
            LaneKind::Normal => self.normal_pass(session, now),
            LaneKind::Steer => self.steer_pass(session, now),
        };
        if let Err(error) = result {
            self.retry_later(Work::Wake(session.clone()), error, now);
        }
    }

    pub(super) fn finish(&mut self, session: &SessionId, kind: LaneKind, now: Millis) {
        let lane = self.asked.lane(session, kind);
        lane.busy = false;
        // The finishing pass returns the follow-up; wake both lanes of every session of
        // the scope, since any result (a run that ended, an entry that left) can free
        // the queue of an alias too.
        lane.follow_up = false;
        self.wake_scope(session, now);
    }

    pub(super) fn scope_run(&self, session: &SessionId) -> Option<(SessionId, RunId)> {
        self.runs.scope_runs(session).into_iter().next()
    }

    fn normal_pass(&mut self, session: &SessionId, now: Millis) -> Result<(), OutboxError> {
        if self.asked.interrupts.contains_key(session) {
            return Ok(());
        }
        // An entry that is sending without an acceptance is a send in flight or a read
        // pending: the queue waits for it.
        if self.state(session)?.has_unaccepted_sending() {
            return Ok(());
        }
        let Some(head) = self.next_drainable(session, now)? else {
            return Ok(());
        };
        let Some((run_session, run)) = self.scope_run(session) else {
            if !self.start_entry(session, head.clone(), now)? {
                // The head was held back (a reopen check, a hold, a failed write): the
                // next entry may go. A head that is unchanged means nothing can start.
                let changed = self.entry(session, &head.queue_id)?.as_ref() != Some(&head);
                if changed && self.scope_run(session).is_none() {
                    self.pass(session, LaneKind::Normal, now);
                }
            }
            return Ok(());
        };
        // A run is active in the scope: a steer for it goes through the steer lane, an
        // interrupt stops it, anything else waits for it to end.
        let spent = self
            .asked
            .interrupt_spent
            .contains(&(session.clone(), head.operation_id.clone()));
        match head.controls.send_mode {
            SendMode::SteerRunning
                if head.controls.expected_active_run_id.as_ref() == Some(&run)
                    && &run_session == session =>
            {
                self.pass(session, LaneKind::Steer, now);
                Ok(())
            }
            SendMode::InterruptRunning if !spent && &run_session == session => {
                self.begin_interrupt(session, head, run, now)
            }
            _ => Ok(()),
        }
    }

    fn steer_pass(&mut self, session: &SessionId, now: Millis) -> Result<(), OutboxError> {
        // Only the queued head, only as an exact active-run steer; never a new turn.
        let Some(head) = self.state(session)?.queued_head().cloned() else {
            return Ok(());
        };
        let Some(active) = self.runs.active(session).map(|a| a.run_id.clone()) else {
            return Ok(());
        };
        if !head.drainable()
            || head.controls.send_mode != SendMode::SteerRunning
            || head.controls.expected_active_run_id.as_ref() != Some(&active)
        {
            return Ok(());
        }
        if self.hold_check(session, &head, now)?.is_some() {
            return Ok(());
        }
        if head.session_message.is_some() {
            self.runs.joined_by(session, &active, &head.operation_id);
            self.shared_joined(session, &active, &head.operation_id, now);
        }
        self.send_to_agent(
            session,
            head,
            SendKind::Steer { run: active },
            LaneKind::Steer,
            now,
        )?;
        Ok(())
    }

    /// The first queued entry with auto-drain on that no hold rule keeps back.
    fn next_drainable(
        &mut self,
        session: &SessionId,
        now: Millis,
    ) -> Result<Option<OutboxEntry>, OutboxError> {
        let mut checked: BTreeSet<QueueId> = BTreeSet::new();
        loop {
            let next = self
                .state(session)?
                .drainable()
                .find(|e| !checked.contains(&e.queue_id))
                .cloned();
            let Some(e) = next else {
                return Ok(None);
            };
            if self.hold_check(session, &e, now)?.is_none() {
                return Ok(Some(e));
            }
            checked.insert(e.queue_id);
        }
    }

    /// Session messages are checked again before each drain: a hold turns auto-drain off
    /// and marks the route needs-approval. Returns the reason when held.
    fn hold_check(
        &mut self,
        session: &SessionId,
        e: &OutboxEntry,
        now: Millis,
    ) -> Result<Option<String>, OutboxError> {
        let Some(origin) = e.session_message.as_ref() else {
            return Ok(None);
        };
        if origin.approved {
            return Ok(None);
        }
        let Some(reason) = crate::session_message::hold_reason(self, session, origin.sender_access)
        else {
            return Ok(None);
        };
        let Some(held) = e.state.hold_for_approval(reason.clone()) else {
            // Not queued: nothing for the drain to hold back.
            return Ok(Some(reason));
        };
        if self.replace(session, e, e.with_state(held), now)? {
            self.set_delivery(&e.operation_id, RouteDelivery::NeedsApproval)?;
        }
        Ok(Some(reason))
    }

    /// Starts a run for `head` in the registry; `None` (and [`CustodyEffect::RunRefused`]) when
    /// the registry refuses.
    pub(super) fn start_run(
        &mut self,
        session: &SessionId,
        head: &OutboxEntry,
        now: Millis,
    ) -> Option<RunId> {
        let uuid = self.next_uuid();
        let run = RunId::generate(&uuid, now);
        let access = self.sessions.get(session).and_then(|i| i.access);
        let vetoes = &self.vetoes;
        let shared = &self.shared;
        let veto = |s: &SessionId, r: &RunId| {
            vetoes.contains(&(s.clone(), r.clone())) || shared.is_adopted(s, r)
        };
        match self.runs.start(
            session,
            run.clone(),
            Some(head.operation_id.clone()),
            access,
            now,
            &veto,
        ) {
            Ok(()) => self.shared_start(session, &run, now).then_some(run),
            Err(error) => {
                self.effects.push_back(CustodyEffect::RunRefused {
                    session: session.clone(),
                    operation_id: head.operation_id.clone(),
                    error,
                });
                None
            }
        }
    }

    /// Starts `head` as a new run; false when it did not go.
    fn start_entry(
        &mut self,
        session: &SessionId,
        head: OutboxEntry,
        now: Millis,
    ) -> Result<bool, OutboxError> {
        let Some(run) = self.start_run(session, &head, now) else {
            return Ok(false);
        };
        // A session message that starts a run continues its exchange.
        if head.session_message.is_some() {
            self.runs.joined_by(session, &run, &head.operation_id);
            self.shared_joined(session, &run, &head.operation_id, now);
        }
        let sent = self.send_to_agent(
            session,
            head,
            SendKind::Start { run: run.clone() },
            LaneKind::Normal,
            now,
        );
        if !matches!(sent, Ok(true)) && !self.end_run(session, &run, now) {
            // The scope went with the failed write (its lease was lost): custody's
            // registry let the run go, but the shared one holds the start just written.
            self.shared_ended(session, &run, now);
        }
        sent
    }

    /// The entry as it goes sending, and the ledger's `sending` record for it; `None`
    /// when `head` is not queued.
    pub(super) fn sending_record(
        &self,
        head: &OutboxEntry,
        now: Millis,
    ) -> Option<(OutboxEntry, LedgerRecord)> {
        let sending = head.with_state(head.state.mark_sending()?);
        let images: Vec<&str> = head
            .request
            .attachments
            .iter()
            .filter(|a| a.kind == "image")
            .map(|a| a.path.as_str())
            .collect();
        let mut record = LedgerRecord::new(LedgerStatus::Sending, now);
        record.admission_input_digest =
            Some(admission_input_digest(head.request.agent_text(), &images));
        Some((sending, record))
    }

    /// The steps before the hand-off: the ledger says sending and the entry goes
    /// sending (one transaction), then the send effect. A failure here is proven
    /// unadmitted (OB-09).
    fn send_to_agent(
        &mut self,
        session: &SessionId,
        head: OutboxEntry,
        kind: SendKind,
        lane: LaneKind,
        now: Millis,
    ) -> Result<bool, OutboxError> {
        let scope = ScopeId::of(session);
        let mut current = self.ledger_of(&scope, &head.operation_id)?;
        match &current {
            Some(l) if l.status == LedgerStatus::Sent => {
                // Already proven delivered: never send twice.
                self.confirm_sent(session, &head.operation_id, now)?;
                return Ok(false);
            }
            Some(l) if l.status == LedgerStatus::Sending && l.acceptance.is_some() => {
                // A turn accepted an earlier attempt and nothing settled it: read history
                // instead of sending again.
                let confirming = head.state.mark_confirming();
                if let Some(state) = confirming.filter(|_| !self.reading(session, &head)) {
                    let waiting = head.with_state(state);
                    self.read_after_replace(session, &head, waiting, ReadPurpose::Confirm, now)?;
                }
                return Ok(false);
            }
            Some(l) if l.status == LedgerStatus::Canceled => {
                // The reopen check (OB-12): a canceled attempt that a turn accepted is
                // read from history first; one that no turn accepted reopens at once.
                if l.acceptance.is_some() {
                    if let Some(state) = head.state.await_reopen_check() {
                        let waiting = head.with_state(state);
                        self.read_after_replace(session, &head, waiting, ReadPurpose::Reopen, now)?;
                    }
                    return Ok(false);
                }
                if let Some(r) = reopen(l, now) {
                    self.write_ledger(&scope, &head.operation_id, r.clone())?;
                    current = Some(r);
                }
            }
            _ => {}
        }
        let Some((sending, proposed)) = self.sending_record(&head, now) else {
            return Ok(false);
        };
        let record = match transition(current.as_ref(), proposed) {
            Transition::Apply(r) => r,
            Transition::Keep => {
                current.unwrap_or_else(|| LedgerRecord::new(LedgerStatus::Sending, now))
            }
        };
        match self.replace_with_ledger(session, &head, sending.clone(), &scope, record.clone(), now)
        {
            Ok(true) => {}
            Ok(false) => return Ok(false),
            Err(error) => {
                // The store cannot record the hand-off. The memory ledger serves for the
                // record (OB-07) when the entry itself can still be written; otherwise
                // this is the seed's "failed sending write": nothing reached the agent
                // (OB-09), and the entry waits for the user with the seed's text.
                self.note_failure(session, Some(&head.operation_id), error, None);
                let kept = self.fallback.record(&scope, &head.operation_id, record);
                let in_memory = match kept {
                    Ok(_) => match self.replace(session, &head, sending.clone(), now) {
                        Ok(written) => written,
                        Err(error) => {
                            self.note_failure(session, Some(&head.operation_id), error, None);
                            false
                        }
                    },
                    Err(_) => false,
                };
                if !in_memory {
                    let failed = head.state.hold(Some(SENDING_WRITE_FAILED_TEXT.to_owned()));
                    self.replace(session, &head, head.with_state(failed), now)?;
                    return Ok(false);
                }
            }
        }
        self.dispatch(session, sending, kind, lane, now);
        Ok(true)
    }

    /// Hands a saved `sending` entry to the agent: a new attempt, its deadline, the lane
    /// busy, the send effect.
    pub(super) fn dispatch(
        &mut self,
        session: &SessionId,
        sending: OutboxEntry,
        kind: SendKind,
        lane: LaneKind,
        now: Millis,
    ) {
        self.supersede(session, &sending.operation_id);
        let attempt = self.next_attempt();
        let request = SendRequest {
            attempt,
            session: session.clone(),
            operation_id: sending.operation_id.clone(),
            request: sending.request.clone(),
            kind,
            rollback_before_send: sending.request.rollback_before_send
                && !self.rolled_back(session, &sending.operation_id),
            fresh_thread: false,
        };
        self.asked.in_flight.insert(
            attempt,
            InFlight {
                snapshot: sending,
                lane,
                deadline: now.saturating_add(SEND_PATH_DEADLINE),
                request: request.clone(),
            },
        );
        self.asked.lane(session, lane).busy = true;
        self.effects.push_back(CustodyEffect::Send(request));
    }
}
