//! Interrupt (OB-11), stop (OB-15), and stop and send now (OB-13).
//!
//! One stop worker per (session, run) serves every caller; each stop request to the
//! agent is an attempt, so a late answer of a crashed attempt is ignored once the retry
//! went out. A take-back is an attempt too.

use crate::adapter::{StopRequest, TakeBackRequest};
use timeline_core::time::Millis;

use super::{
    ActionError, AttemptId, CallerId, Custody, CustodyEffect, Interrupt, PendingTakeBack,
    ReadPurpose, StopAnswer, StopWorker, Work, INTERRUPT_POLL, INTERRUPT_WAIT, MODEL_CHANGED_TEXT,
    STOP_CALLER_WAIT, STOP_RETRY, STOP_SUCCESS_CACHE,
};
use crate::adapter::{StopResult, TakeBackResult};
use crate::entry::{Controls, EntryState, OutboxEntry};
use crate::ids::{OperationId, QueueId, RunId, ScopeId, SessionId};
use crate::ledger::LedgerStatus;
use crate::store::{OutboxError, OutboxStore};

impl<S: OutboxStore> Custody<S> {
    pub(super) fn model_changed(&self, session: &SessionId, e: &OutboxEntry) -> bool {
        let model = self.sessions.get(session).and_then(|i| i.model.as_ref());
        matches!((model, &e.request.expected_model), (Some(now), Some(then)) if now != then)
    }

    pub(super) fn begin_interrupt(
        &mut self,
        session: &SessionId,
        head: OutboxEntry,
        run: RunId,
        now: Millis,
    ) -> Result<(), OutboxError> {
        if self.model_changed(session, &head) {
            let held = head.state.hold(Some(MODEL_CHANGED_TEXT.to_owned()));
            self.replace(session, &head, head.with_state(held), now)?;
            return Ok(());
        }
        self.asked.interrupts.insert(
            session.clone(),
            Interrupt {
                op: head.operation_id.clone(),
                old_run: run.clone(),
                deadline: now.saturating_add(INTERRUPT_WAIT),
                next_poll: now.saturating_add(INTERRUPT_POLL),
            },
        );
        self.stop(session, &run, None, now);
        Ok(())
    }

    pub(super) fn poll_interrupts(&mut self, now: Millis) {
        let due: Vec<(SessionId, Interrupt)> = self
            .asked
            .interrupts
            .iter()
            .filter(|(_, i)| i.next_poll <= now)
            .map(|(s, i)| (s.clone(), i.clone()))
            .collect();
        for (session, mut i) in due {
            let old_active = self
                .runs
                .active(&session)
                .is_some_and(|a| a.run_id == i.old_run);
            if old_active {
                if now >= i.deadline {
                    // Still settling after 10 s: the message stays queued.
                    self.asked.interrupts.remove(&session);
                    self.asked
                        .interrupt_spent
                        .insert((session.clone(), i.op.clone()));
                } else {
                    while i.next_poll <= now {
                        i.next_poll = i.next_poll.saturating_add(INTERRUPT_POLL);
                    }
                    self.asked.interrupts.insert(session.clone(), i);
                }
                continue;
            }
            self.asked.interrupts.remove(&session);
            if self.scope_run(&session).is_some() {
                // A newer turn appeared during the wait: keep the message queued.
                self.asked
                    .interrupt_spent
                    .insert((session.clone(), i.op.clone()));
                continue;
            }
            self.wake(&session, now);
        }
    }

    /// Stops `run`. One worker per (session, run) serves every caller; a caller (if any)
    /// gets [`StopAnswer::StillSettling`] after 5 s while the worker goes on and keeps
    /// new runs blocked. A success answers repeated requests for 60 s. Stop removes no
    /// message.
    pub fn stop(
        &mut self,
        session: &SessionId,
        run: &RunId,
        caller: Option<CallerId>,
        now: Millis,
    ) {
        if !self.scope_granted(session) {
            // Another host serves the session: its run is that host's to stop.
            if let Some(c) = caller {
                let base = crate::ids::base_session(session);
                self.effects.push_back(CustodyEffect::StopAnswer {
                    caller: c,
                    answer: StopAnswer::Failed(format!("this host does not serve session {base}")),
                });
            }
            return;
        }
        let k = (session.clone(), run.clone());
        if self
            .asked
            .stop_cache
            .get(&k)
            .is_some_and(|until| now < *until)
        {
            if let Some(c) = caller {
                self.effects.push_back(CustodyEffect::StopAnswer {
                    caller: c,
                    answer: StopAnswer::Stopped,
                });
            }
            return;
        }
        let new = !self.asked.stops.contains_key(&k);
        let attempt = new.then(|| self.next_attempt());
        let worker = self.asked.stops.entry(k).or_insert(StopWorker {
            callers: Vec::new(),
            retry_at: None,
            attempt,
        });
        if let Some(c) = caller {
            worker
                .callers
                .push((c, now.saturating_add(STOP_CALLER_WAIT)));
        }
        if let Some(attempt) = attempt {
            self.runs.begin_cancellation(session, run);
            self.shared_stop_began(session, run, now);
            self.effects.push_back(CustodyEffect::Stop(StopRequest {
                attempt,
                session: session.clone(),
                run: run.clone(),
            }));
        }
    }

    /// The answer to [`CustodyEffect::Stop`] `attempt`.
    pub fn handle_stop_result(&mut self, attempt: AttemptId, result: StopResult, now: Millis) {
        let Some(k) = self
            .asked
            .stops
            .iter()
            .find(|(_, w)| w.attempt == Some(attempt))
            .map(|(k, _)| k.clone())
        else {
            self.stats.stale_answers += 1;
            return;
        };
        let Some(mut worker) = self.asked.stops.remove(&k) else {
            return;
        };
        let (session, run) = k.clone();
        let answer = match result {
            StopResult::Crashed => {
                worker.retry_at = Some(now.saturating_add(STOP_RETRY));
                worker.attempt = None;
                self.asked.stops.insert(k, worker);
                return;
            }
            StopResult::Stopped { untaken } => {
                self.asked
                    .stop_cache
                    .insert(k, now.saturating_add(STOP_SUCCESS_CACHE));
                self.runs.end_cancellation(&session, &run);
                self.shared_stop_ended(&session, &run, now);
                self.end_run(&session, &run, now);
                self.foreign_runs.remove(&(session.clone(), run.clone()));
                self.settle_or_retry(session.clone(), run.clone(), untaken, now);
                StopAnswer::Stopped
            }
            StopResult::Failed { error } => {
                self.runs.end_cancellation(&session, &run);
                self.shared_stop_ended(&session, &run, now);
                StopAnswer::Failed(error)
            }
        };
        for (caller, _) in worker.callers {
            self.effects.push_back(CustodyEffect::StopAnswer {
                caller,
                answer: answer.clone(),
            });
        }
        // After the result every outbox in the scope drains.
        self.wake_scope(&session, now);
    }

    /// Stop callers that waited 5 s, and crashed stop attempts due again.
    pub(super) fn poll_stops(&mut self, now: Millis) {
        let mut due = Vec::new();
        for (k, w) in self.asked.stops.iter_mut() {
            let (late, waiting): (Vec<_>, Vec<_>) =
                w.callers.drain(..).partition(|(_, d)| *d <= now);
            w.callers = waiting;
            for (caller, _) in late {
                self.effects.push_back(CustodyEffect::StopAnswer {
                    caller,
                    answer: StopAnswer::StillSettling,
                });
            }
            if w.retry_at.is_some_and(|at| at <= now) {
                w.retry_at = None;
                due.push(k.clone());
            }
        }
        for (session, run) in due {
            let attempt = self.next_attempt();
            if let Some(w) = self.asked.stops.get_mut(&(session.clone(), run.clone())) {
                w.attempt = Some(attempt);
            }
            self.effects.push_back(CustodyEffect::Stop(StopRequest {
                attempt,
                session,
                run,
            }));
        }
    }

    // ----- stop and send now (OB-13) ---------------------------------------------------

    /// Stop and send now: take back an accepted steer, revoke its acceptance, stop the
    /// run, and queue the message again for its own turn with the same operation ID.
    pub fn stop_and_send_now(
        &mut self,
        session: &SessionId,
        queue_id: &QueueId,
        now: Millis,
    ) -> Result<(), ActionError> {
        let handed = self.stop_and_send_now_granted(session, queue_id, now);
        self.action_failed(handed.as_ref().err());
        handed
    }

    fn stop_and_send_now_granted(
        &mut self,
        session: &SessionId,
        queue_id: &QueueId,
        now: Millis,
    ) -> Result<(), ActionError> {
        let current = self.entry_by_queue(session, queue_id)?;
        // Only an accepted steer without a `handoff` of its own can be requested, and
        // only while the turn that accepted it runs: the end of a run that is gone
        // settles what it accepted.
        let (Some(handing_off), Some(acceptance)) = (
            current.state.request_handoff(),
            current.state.acceptance().cloned(),
        ) else {
            return Err(ActionError::NotAnAcceptedSteer);
        };
        if !self.run_active(session, &acceptance.run_id) {
            return Err(ActionError::NotAnAcceptedSteer);
        }
        if self.model_changed(session, &current) {
            return Err(ActionError::ModelChanged);
        }
        let requested = current.with_state(handing_off);
        if !self.replace(session, &current, requested.clone(), now)? {
            return Err(ActionError::Blocked);
        }
        let attempt = self.next_attempt();
        self.asked.take_backs.insert(
            attempt,
            PendingTakeBack {
                session: session.clone(),
                snapshot: requested,
            },
        );
        self.effects
            .push_back(CustodyEffect::TakeBack(TakeBackRequest {
                attempt,
                session: session.clone(),
                operation_id: current.operation_id.clone(),
                acceptance,
            }));
        Ok(())
    }

    /// The answer to [`CustodyEffect::TakeBack`] `attempt`. Only a confirmed detach lets the
    /// `handoff` go on; if the ledger already says sent, nothing is replayed.
    pub fn handle_take_back(&mut self, attempt: AttemptId, result: TakeBackResult, now: Millis) {
        let Some(t) = self.asked.take_backs.remove(&attempt) else {
            self.stats.stale_answers += 1;
            return;
        };
        let op = t.snapshot.operation_id.clone();
        self.run_work(Work::TakeBack(Box::new(t), op, result), now);
    }

    pub(super) fn apply_take_back(
        &mut self,
        t: PendingTakeBack,
        op: &OperationId,
        result: TakeBackResult,
        now: Millis,
    ) -> Result<(), OutboxError> {
        let session = t.session;
        let snapshot = t.snapshot;
        let Some(current) = self.entry(&session, &snapshot.queue_id)? else {
            return Ok(());
        };
        // A renumbering of the queue may have moved it; any other change ends the
        // `handoff` this answer is for.
        if !current.same_but_position(&snapshot) {
            return Ok(());
        }
        let EntryState::HandingOff { acceptance } = &snapshot.state else {
            return Ok(());
        };
        match result {
            TakeBackResult::DetachedForReplay | TakeBackResult::AlreadyDetachedForReplay => {
                let scope = ScopeId::of(&session);
                let ledger = self.ledger_of(&scope, op)?;
                if ledger
                    .as_ref()
                    .is_some_and(|l| l.status == LedgerStatus::Sent)
                {
                    self.confirm_sent(&session, op, now)?;
                    return Ok(());
                }
                let Some(taken_back) = current.state.take_back() else {
                    return Ok(());
                };
                let detached = current.with_state(taken_back);
                // Revoke only the acceptance of that exact run, thread and turn, with the
                // entry change.
                let revoked = ledger
                    .filter(|l| l.acceptance.as_ref() == Some(acceptance))
                    .map(|mut l| {
                        l.acceptance = None;
                        l.updated_at = now;
                        l
                    });
                let written = match revoked {
                    Some(l) => self.replace_with_ledger(
                        &session,
                        &current,
                        detached.clone(),
                        &scope,
                        l,
                        now,
                    )?,
                    None => self.replace(&session, &current, detached.clone(), now)?,
                };
                if !written {
                    return Ok(());
                }
                let run = acceptance.run_id.clone();
                if self.runs.active(&session).is_some_and(|a| a.run_id == run) {
                    self.stop(&session, &run, None, now);
                } else {
                    self.dedicate(&session, &detached, now)?;
                    self.wake(&session, now);
                }
            }
            TakeBackResult::NotDetached { reason } => {
                let Some(kept) = current.state.keep_accepted() else {
                    return Ok(());
                };
                let kept = current.with_state(kept);
                let written = self.replace(&session, &current, kept.clone(), now)?;
                self.effects.push_back(CustodyEffect::TakeBackRefused {
                    session: session.clone(),
                    operation_id: op.clone(),
                    reason,
                });
                // The run ended while the take-back was asked: no run end will settle
                // the entry, so its history says now whether the run took it.
                let run_gone = !self.run_working(&session, &acceptance.run_id);
                if written && run_gone {
                    self.read_history(&session, ReadPurpose::Settle, kept);
                }
            }
        }
        Ok(())
    }

    pub(super) fn dedicate(
        &mut self,
        session: &SessionId,
        e: &OutboxEntry,
        now: Millis,
    ) -> Result<(), OutboxError> {
        // Only a queued entry with a `handoff` mark is dedicated; one that is sending
        // stays with its attempt.
        let Some(state) = e.state.dedicate() else {
            return Ok(());
        };
        let mut dedicated = e.with_state(state);
        dedicated.controls = Controls::automatic();
        self.replace(session, e, dedicated, now)?;
        Ok(())
    }
}
