//! Composer actions on queued entries (OB-11): edit, remove, send now, reorder. A sending entry
//! cannot be changed: it stays until the ledger or the history settles it.

use timeline_core::time::Millis;

use super::run_life::held_unconfirmed_steer;
use super::{ActionError, Custody, ReadPurpose};
use crate::entry::{Intent, MessageRequest, OutboxEntry, Receipt, UNCONFIRMED_TEXT};
use crate::fingerprint::request_fingerprint;
use crate::ids::{OperationId, QueueId, SessionId};
use crate::store::{OutboxError, OutboxStore, RouteDelivery};

impl<S: OutboxStore> Custody<S> {
    /// Edits a queued message: it keeps its queue ID and place and takes a new
    /// operation ID. A sending entry cannot be edited.
    pub fn edit(
        &mut self,
        session: &SessionId,
        queue_id: &QueueId,
        new_operation: OperationId,
        request: MessageRequest,
        now: Millis,
    ) -> Result<Receipt, ActionError> {
        let edited = self.edit_granted(session, queue_id, new_operation, request, now);
        self.action_failed(edited.as_ref().err());
        edited
    }

    fn edit_granted(
        &mut self,
        session: &SessionId,
        queue_id: &QueueId,
        new_operation: OperationId,
        request: MessageRequest,
        now: Millis,
    ) -> Result<Receipt, ActionError> {
        let current = self.queued_entry(session, queue_id)?;
        let mut new = current.clone();
        new.operation_id = new_operation.clone();
        new.request = request;
        let fp = request_fingerprint(session, queue_id, &new.request);
        match self.mirror.rekey(session, &current, &fp, new) {
            Ok(true) => {
                self.wake(session, now);
                Ok(Receipt {
                    session_id: session.clone(),
                    queue_id: queue_id.clone(),
                    operation_id: new_operation,
                    replayed: false,
                })
            }
            Ok(false) => {
                self.forget(session, now);
                Err(ActionError::Blocked)
            }
            Err(OutboxError::OperationTaken(_)) => Err(ActionError::OperationTaken),
            Err(e) => {
                self.forget(session, now);
                Err(e.into())
            }
        }
    }

    /// Removes a queued entry; the active run is left alone. A sending entry cannot be
    /// removed: it stays until the ledger or the history settles it.
    pub fn remove(
        &mut self,
        session: &SessionId,
        queue_id: &QueueId,
        now: Millis,
    ) -> Result<(), ActionError> {
        let removed = self.remove_granted(session, queue_id, now);
        self.action_failed(removed.as_ref().err());
        removed
    }

    /// An action's store error that says the lease is lost lets the scope go.
    pub(super) fn action_failed(&mut self, error: Option<&ActionError>) {
        if let Some(ActionError::Store(error)) = error {
            self.lease_lost(error);
        }
    }

    fn remove_granted(
        &mut self,
        session: &SessionId,
        queue_id: &QueueId,
        now: Millis,
    ) -> Result<(), ActionError> {
        let current = self.queued_entry(session, queue_id)?;
        if let Err(e) = self.mirror.remove_entry(session, &current) {
            self.forget(session, now);
            return Err(e.into());
        }
        if current.session_message.is_some() {
            self.set_delivery(&current.operation_id, RouteDelivery::Declined)?;
        }
        self.wake(session, now);
        Ok(())
    }

    /// Sends a queued entry now (the user's choice): it goes to the front with auto-drain
    /// on. A session message is approved by this. A canceled operation goes through the
    /// reopen check first (OB-12).
    pub fn send_now(
        &mut self,
        session: &SessionId,
        queue_id: &QueueId,
        now: Millis,
    ) -> Result<(), ActionError> {
        let sent = self.send_now_granted(session, queue_id, now);
        self.action_failed(sent.as_ref().err());
        sent
    }

    fn send_now_granted(
        &mut self,
        session: &SessionId,
        queue_id: &QueueId,
        now: Millis,
    ) -> Result<(), ActionError> {
        let current = self.queued_entry(session, queue_id)?;
        // Held because custody could not confirm whether the agent has it: the agent's
        // history is read once more before it is sent again (found: settled as sent;
        // missing or unreadable: sent, once, since the user was asked to check the
        // timeline first and chose to send). The ledger cannot decide this alone: its
        // `sending` record may have lived only in the memory ledger of a machine that
        // restarted. A steer whose run still works may yet be taken from that run's
        // pending input, which no history shows: the send waits for the run's end.
        if current.state.error() == Some(UNCONFIRMED_TEXT) {
            if held_unconfirmed_steer(&current).is_some_and(|r| self.run_working(session, r)) {
                return Err(ActionError::RunMayStillTakeIt);
            }
            if let Some(state) = current.state.pause_for_reopen() {
                let waiting = current.with_state(state);
                self.read_after_replace(session, &current, waiting, ReadPurpose::UserSend, now)?;
            }
            return Ok(());
        }
        self.release_to_front(session, &current, now)?;
        Ok(())
    }

    pub(super) fn release_to_front(
        &mut self,
        session: &SessionId,
        current: &OutboxEntry,
        now: Millis,
    ) -> Result<(), OutboxError> {
        let Some(released) = current.state.release() else {
            // A sending entry is not the user's to release.
            return Ok(());
        };
        let mut new = current.with_state(released);
        if new.controls.intent == Intent::Enqueue {
            new.controls.intent = Intent::Automatic;
        }
        if let Some(origin) = &mut new.session_message {
            origin.approved = true;
        }
        self.asked
            .interrupt_spent
            .remove(&(session.clone(), new.operation_id.clone()));
        new.position = self.place(session, Intent::Automatic, Some(&current.queue_id), now)?;
        if self.replace(session, current, new.clone(), now)? {
            if new.session_message.is_some() {
                self.set_delivery(&new.operation_id, RouteDelivery::Sent)?;
            }
            self.wake(session, now);
        }
        Ok(())
    }

    /// Moves a queued entry to just before the queued entry `before`, or to the back of
    /// the queue when `before` is `None`; its text, operation and controls stay (the
    /// seed's "reorder", OB-11). A sending entry cannot be moved, and nothing is placed
    /// before one: both are [`ActionError::Blocked`], since a sending entry stays at the
    /// front until the ledger or the history settles it. Moving an entry before itself
    /// changes nothing. One store write, or one renumbering of the queue when no
    /// position is free between the two neighbours.
    pub fn reorder(
        &mut self,
        session: &SessionId,
        queue_id: &QueueId,
        before: Option<&QueueId>,
        now: Millis,
    ) -> Result<(), ActionError> {
        let moved = self.reorder_granted(session, queue_id, before, now);
        self.action_failed(moved.as_ref().err());
        moved
    }

    fn reorder_granted(
        &mut self,
        session: &SessionId,
        queue_id: &QueueId,
        before: Option<&QueueId>,
        now: Millis,
    ) -> Result<(), ActionError> {
        let current = self.queued_entry(session, queue_id)?;
        let Some(b) = before else {
            let mut new = current.clone();
            new.position = self.place(session, Intent::Enqueue, Some(queue_id), now)?;
            return self.reorder_write(session, &current, new, now);
        };
        let target = self.queued_entry(session, b)?;
        if b == queue_id {
            return Ok(());
        }
        // The free position between the target and the entry before it (the moved
        // entry left out): one lookup in the queue order, not a walk of the queue.
        let low = self
            .state(session)?
            .position_before(target.position, b, queue_id)
            .map(i128::from);
        let high = i128::from(target.position);
        let free = match low {
            Some(low) if high - low >= 2 => Some(low + (high - low) / 2),
            None => Some(high - i128::from(super::submit::POSITION_STEP)),
            Some(_) => None,
        };
        if let Some(position) = free.and_then(|p| i64::try_from(p).ok()) {
            let mut new = current.clone();
            new.position = position;
            return self.reorder_write(session, &current, new, now);
        }
        // No room: the queue in its new order, renumbered.
        let mut order: Vec<QueueId> = self
            .state(session)?
            .ordered()
            .map(|e| e.queue_id.clone())
            .filter(|q| q != queue_id)
            .collect();
        let at = order.iter().position(|q| q == b).unwrap_or(order.len());
        order.insert(at, queue_id.clone());
        self.renumber(session, &order, now)?;
        self.wake(session, now);
        Ok(())
    }

    fn reorder_write(
        &mut self,
        session: &SessionId,
        current: &OutboxEntry,
        new: OutboxEntry,
        now: Millis,
    ) -> Result<(), ActionError> {
        if !self.replace(session, current, new, now)? {
            return Err(ActionError::Blocked);
        }
        self.wake(session, now);
        Ok(())
    }

    /// The entry `queue_id` while it is queued; a sending entry is
    /// [`ActionError::Blocked`] (the ledger or the history settles it first).
    fn queued_entry(
        &mut self,
        session: &SessionId,
        queue_id: &QueueId,
    ) -> Result<OutboxEntry, ActionError> {
        let current = self.entry_by_queue(session, queue_id)?;
        if current.state.is_sending() {
            return Err(ActionError::Blocked);
        }
        Ok(current)
    }

    pub(super) fn entry_by_queue(
        &mut self,
        session: &SessionId,
        queue_id: &QueueId,
    ) -> Result<OutboxEntry, ActionError> {
        self.entry(session, queue_id)?.ok_or(ActionError::NotFound)
    }
}
