//! Start-up and outbox loads (OB-10): every saved outbox is read once and its entries
//! still sending are confirmed from the agent's history, never sent again blindly; a
//! client's load does the same for a session with nothing in flight.

use timeline_core::time::Millis;

use super::run_life::awaited_run;
use super::{Custody, ReadPurpose};
use crate::entry::{HandoffPhase, OutboxEntry, StoredEntry, REOPEN_CHECK_TEXT};
use crate::ids::{ScopeId, SessionId};
use crate::store::{OutboxError, OutboxStore};

impl<S: OutboxStore> Custody<S> {
    /// At start-up: both lanes start for every saved outbox, and every entry still
    /// sending is confirmed from history (held with the unconfirmed text when the ledger
    /// cannot be read). Each outbox is read once here and kept in memory.
    pub fn start_up(&mut self, now: Millis) -> Result<(), OutboxError> {
        let sessions: Vec<SessionId> = self.mirror.outbox_sessions()?.iter().cloned().collect();
        let sessions: Vec<SessionId> = sessions
            .into_iter()
            .filter(|s| self.scope_granted(s))
            .collect();
        for session in sessions {
            self.confirm_sending(&session, now)?;
            self.wake(&session, now);
        }
        Ok(())
    }

    /// A client loads an outbox. With no drain and no run active, every entry still
    /// sending is confirmed from history. `now` times the repair a failed write here
    /// schedules.
    pub fn load_outbox(
        &mut self,
        session: &SessionId,
        now: Millis,
    ) -> Result<Vec<StoredEntry>, OutboxError> {
        let (normal, steer) = self.lane_busy(session);
        if !normal && !steer && self.scope_run(session).is_none() {
            self.confirm_sending(session, now)?;
        }
        self.entries(session)
    }

    /// Confirms from history every entry of `session` that is out with nothing in
    /// flight (at start-up, when an outbox is loaded, and in the repair after a failed
    /// write), lets a detached stop and send now whose run is gone go on to its own
    /// turn, and asks again for a reopen check whose read is not pending. What a run
    /// that still works accepted waits for that run's end.
    pub(super) fn confirm_sending(
        &mut self,
        session: &SessionId,
        now: Millis,
    ) -> Result<(), OutboxError> {
        let scope = ScopeId::of(session);
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
                self.dedicate(session, &e, now)?;
            }
        }
        let sending: Vec<OutboxEntry> = self.state(session)?.sending().cloned().collect();
        for e in sending {
            if !self.nothing_in_flight(session, &e) {
                continue;
            }
            if awaited_run(&e).is_some_and(|r| self.run_working(session, r)) {
                continue;
            }
            if let Err(error) = self.ledger_of(&scope, &e.operation_id) {
                // The seed's rule: an unreadable ledger holds the entry with the same
                // text; the embedding learns why.
                self.hold_unconfirmed(session, &e, now)?;
                self.note_failure(session, Some(&e.operation_id), error, None);
                continue;
            }
            self.read_history(session, ReadPurpose::Confirm, e);
        }
        // A reopen check cut short (its read was lost with the host that asked) is
        // asked again.
        let checking: Vec<OutboxEntry> = self
            .state(session)?
            .ordered()
            .filter(|e| e.state.hold_reason() == Some(REOPEN_CHECK_TEXT) && !e.state.auto_drain())
            .cloned()
            .collect();
        for e in checking {
            if !self.reading(session, &e) {
                self.read_history(session, ReadPurpose::Reopen, e);
            }
        }
        Ok(())
    }
}
