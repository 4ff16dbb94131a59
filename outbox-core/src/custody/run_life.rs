//! What the agent says of its runs, and what custody does about it: a run's activity
//! and the stale reclaim (OB-14), a run restored after a restart, a run's end and the
//! settlement of what it accepted (OB-11, OB-13, OB-15).

use timeline_core::time::Millis;

use super::lanes::ReadPurpose;
use super::work::Work;
use super::Custody;
use crate::entry::{EntryState, HandoffPhase, OutboxEntry, SendMode, UNCONFIRMED_TEXT};
use crate::ids::{OperationId, RunId, SessionId};
use crate::runs::STALE_RUN_AFTER;
use crate::store::{OutboxError, OutboxStore};

impl<S: OutboxStore> Custody<S> {
    /// Every active run, after the stale reclaim: the seed's read of the active runs
    /// (`chat_active_runs`) drops the stale ones first (OB-14), so this is a command
    /// taking `now`, not a getter. [`Custody::runs`] reads without reclaiming.
    pub fn active_runs(&mut self, now: Millis) -> Vec<(SessionId, RunId)> {
        self.reclaim_stale_runs(now);
        self.runs
            .active_runs(now, &|_: &SessionId, _: &RunId| true)
            .into_iter()
            .map(|(s, r)| (s, r.run_id))
            .collect()
    }

    /// Drops every run that showed no activity for more than [`STALE_RUN_AFTER`]
    /// (unless its adapter objects) and wakes the queues behind them (OB-14): what a
    /// start and a read of the active runs do first, for a host whose clock reached a
    /// stale run's deadline with nothing else happening.
    pub fn reclaim_stale_runs(&mut self, now: Millis) {
        for session in self.reclaim_stale(now) {
            self.wake_scope(&session, now);
        }
    }

    /// Reclaims stale runs the adapter does not veto, and settles what they accepted
    /// (without waking anyone: the caller does). Returns the sessions whose run went.
    pub(super) fn reclaim_stale(&mut self, now: Millis) -> Vec<SessionId> {
        let vetoes = &self.vetoes;
        // A run adopted from the shared registry is the registry's to let go.
        let shared = &self.shared;
        let veto = |s: &SessionId, r: &RunId| {
            vetoes.contains(&(s.clone(), r.clone())) || shared.is_adopted(s, r)
        };
        let reclaimed = self.runs.reclaim_stale(now, &veto);
        let mut sessions = Vec::new();
        for (session, run) in reclaimed {
            self.shared_ended(&session, &run, now);
            if let Err(error) = self.settle_run(&session, &run, &[], now) {
                let work = Work::Settle {
                    session: session.clone(),
                    run,
                    untaken: Vec::new(),
                };
                self.retry_later(work, error, now);
            }
            sessions.push(session);
        }
        sessions
    }

    /// The stale reclaim before a start in `session`'s scope: every session of a scope
    /// whose run went is woken, the caller's own session excepted (its pass goes on by
    /// itself). A run of the caller's own scope blocked the other members of that scope
    /// too (an alias such as `s1::skills-agent` waits on the run of `s1`), so they are
    /// woken as well.
    pub(super) fn reclaim_before_start(&mut self, session: &SessionId, now: Millis) {
        for reclaimed in self.reclaim_stale(now) {
            let members: Vec<SessionId> = crate::ids::ScopeId::of(&reclaimed)
                .members()
                .into_iter()
                .filter(|s| s != session && (s == &reclaimed || self.sessions.contains_key(s)))
                .collect();
            for member in members {
                self.wake(&member, now);
            }
        }
    }

    /// Ends `run` in the registry (and in the shared one); false when it was not the
    /// active run of `session`.
    pub(crate) fn end_run(&mut self, session: &SessionId, run: &RunId, now: Millis) -> bool {
        let ended = self.runs.end(session, run);
        if ended {
            self.shared_ended(session, run, now);
        }
        ended
    }

    /// True while `run` is the active run of `session`.
    pub(crate) fn run_active(&self, session: &SessionId, run: &RunId) -> bool {
        self.runs.active(session).is_some_and(|a| &a.run_id == run)
    }

    /// True while `run` works for `session`: the registry holds it, or the agent reports
    /// it working and its end has not come. A message it accepted, or a steer sent to
    /// it, is settled by its end.
    pub(crate) fn run_working(&self, session: &SessionId, run: &RunId) -> bool {
        self.run_active(session, run)
            || self
                .foreign_runs
                .contains_key(&(session.clone(), run.clone()))
    }

    /// A run ended. Messages it accepted that the agent reported as not taken come back
    /// with auto-drain off and the seed's text; the rest of what the run accepted, and
    /// steers sent to it that wait with nothing in flight, are confirmed from history.
    pub fn handle_run_ended(
        &mut self,
        session: &SessionId,
        run: &RunId,
        untaken: &[OperationId],
        now: Millis,
    ) {
        self.end_run(session, run, now);
        self.foreign_runs.remove(&(session.clone(), run.clone()));
        self.settle_or_retry(session.clone(), run.clone(), untaken.to_vec(), now);
        self.wake_scope(session, now);
    }

    /// Settles the entries of `run`, which ended: a requested `handoff` is dedicated, a
    /// message the run did not take is held with the seed's text (or, when stop and
    /// send now was requested for it, goes on to its own turn), and the rest are
    /// confirmed from history, where a missing message is one the run did not take.
    /// A run whose start the agent refused never ran: the steers sent to it meanwhile
    /// wait for an end that no agent will report, so they are settled now, as at a run's
    /// end (sim seed 66039).
    pub(super) fn settle_unstarted(
        &mut self,
        session: &SessionId,
        run: Option<&RunId>,
        now: Millis,
    ) -> Result<(), OutboxError> {
        match run {
            Some(run) => self.settle_run(session, run, &[], now),
            None => Ok(()),
        }
    }

    pub(super) fn settle_run(
        &mut self,
        session: &SessionId,
        run: &RunId,
        untaken: &[OperationId],
        now: Millis,
    ) -> Result<(), OutboxError> {
        let accepted: Vec<OutboxEntry> = self.state(session)?.accepted().cloned().collect();
        // Steers sent to the run that wait with nothing in flight: a history read found
        // them missing while the run worked (its pending input is not in history).
        let steers: Vec<OutboxEntry> = self
            .state(session)?
            .sending()
            .filter(|e| {
                matches!(e.state, EntryState::Sending { .. }) && awaited_run(e) == Some(run)
            })
            .cloned()
            .collect();
        for e in steers {
            if !self.nothing_in_flight(session, &e) {
                continue;
            }
            if untaken.contains(&e.operation_id) {
                self.settle_untaken(session, &e, true, now)?;
            } else {
                self.read_history(session, ReadPurpose::Settle, e);
            }
        }
        // Uncertain steers held while the run worked: its pending input is in its
        // history now, or never will be. Found settles them; otherwise they stay held.
        let unconfirmed: Vec<OutboxEntry> = self
            .state(session)?
            .ordered()
            .filter(|e| held_unconfirmed_steer(e) == Some(run))
            .cloned()
            .collect();
        for e in unconfirmed {
            if self.nothing_in_flight(session, &e) {
                self.read_history(session, ReadPurpose::Confirm, e);
            }
        }
        for e in accepted {
            // A detached steer waits queued for its run to stop; an entry that went
            // sending again meanwhile is never pulled back.
            let detached = e.state.is_queued()
                && e.state.handoff().is_some_and(|h| {
                    h.phase == HandoffPhase::Requested && &h.acceptance.run_id == run
                });
            if detached {
                self.dedicate(session, &e, now)?;
                continue;
            }
            // Only a sending entry holds an acceptance.
            if e.state.acceptance().is_none_or(|acc| &acc.run_id != run) {
                continue;
            }
            if untaken.contains(&e.operation_id) {
                self.settle_untaken(session, &e, true, now)?;
            } else if !self.reading(session, &e) {
                self.read_history(session, ReadPurpose::Settle, e);
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
        now: Millis,
    ) -> Result<(), crate::runs::RunError> {
        let restored = self.runs.active(session).is_none();
        self.runs.restore(session, run.clone())?;
        if restored {
            self.shared_restored(session, &run, now);
        }
        Ok(())
    }

    /// Records agent activity of a run (for the stale reclaim). A run the registry does
    /// not hold (one from before a restart) is remembered as working until its end, or
    /// until it is silent for [`crate::runs::STALE_RUN_AFTER`]: a history read cannot
    /// see its pending input, so what it accepted waits for it.
    pub fn touch_run(&mut self, session: &SessionId, run: &RunId, now: Millis) {
        if self.run_active(session, run) {
            self.runs.touch(session, run, now);
            self.shared_touched(session, run);
        } else {
            let last = self
                .foreign_runs
                .entry((session.clone(), run.clone()))
                .or_insert(now);
            *last = (*last).max(now);
        }
    }
}

/// When a run the registry does not hold counts as gone: [`STALE_RUN_AFTER`] after its
/// latest activity, as the stale reclaim has it for a registered run (OB-14).
pub(super) fn foreign_stale_at(last_activity: Millis) -> Millis {
    last_activity
        .saturating_add(STALE_RUN_AFTER)
        .saturating_add(Millis(1))
}

/// The run a steer held with [`UNCONFIRMED_TEXT`] was sent to: its uncertain send met a
/// history that did not show it while that run worked.
pub(super) fn held_unconfirmed_steer(e: &OutboxEntry) -> Option<&RunId> {
    let held = e.state.is_queued() && !e.state.auto_drain();
    let unconfirmed = e.state.error() == Some(UNCONFIRMED_TEXT);
    if held && unconfirmed && e.controls.send_mode == SendMode::SteerRunning {
        e.controls.expected_active_run_id.as_ref()
    } else {
        None
    }
}

/// The run an out entry waits in: the run that accepted it, or the run a steer that no
/// turn accepted yet was sent to.
pub(super) fn awaited_run(e: &OutboxEntry) -> Option<&RunId> {
    match &e.state {
        EntryState::Accepted { acceptance, .. } | EntryState::HandingOff { acceptance } => {
            Some(&acceptance.run_id)
        }
        EntryState::Sending { .. } if e.controls.send_mode == SendMode::SteerRunning => {
            e.controls.expected_active_run_id.as_ref()
        }
        EntryState::Ready { .. } | EntryState::Held { .. } | EntryState::Sending { .. } => None,
    }
}
