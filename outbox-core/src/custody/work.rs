//! Custody's unit of work, [`Work`]: an answer to apply, or a session to wake or to read
//! again. Work runs at once ([`Custody::run_work`]); when a store write fails it is kept
//! for [`STORE_RETRY`] later, the failure is shown, and the work runs again at its
//! deadline ([`Custody::run_due_work`]).

use std::collections::BTreeMap;

use super::lanes::{InFlight, PendingRead, PendingTakeBack};
use super::{Custody, CustodyEffect, StoreFailure, STORE_RETRY};
use crate::adapter::{HistoryRead, SendResult, TakeBackResult};
use crate::ids::{OperationId, RunId, SessionId};
use crate::store::{OutboxError, OutboxStore};
use timeline_core::time::Millis;

/// One unit of custody's work: an answer to apply, a session to wake or to read again.
/// It runs at once ([`Custody::run_work`]); when a store write fails it is kept and done
/// again at its deadline.
#[derive(Clone, Debug)]
pub(super) enum Work {
    /// Wake both lanes of a session.
    Wake(SessionId),
    /// Apply a send result.
    Send(Box<InFlight>, SendResult),
    /// Apply a history read.
    Read(Box<PendingRead>, HistoryRead),
    /// Apply a take-back answer.
    TakeBack(Box<PendingTakeBack>, OperationId, TakeBackResult),
    /// Record a delivery proof.
    Proof(SessionId, OperationId),
    /// Record that the agent rolled back the latest turn for a replace latest.
    RolledBack(SessionId, OperationId),
    /// Settle the entries of a run that ended.
    Settle {
        session: SessionId,
        run: RunId,
        untaken: Vec<OperationId>,
    },
    /// Read a session again and confirm every entry found out with nothing under way, as
    /// a restart does: after a failed write, or when a run the registry does not hold
    /// went silent.
    Repair(SessionId),
}

impl Work {
    pub(super) fn session(&self) -> &SessionId {
        match self {
            Work::Wake(s)
            | Work::Repair(s)
            | Work::Proof(s, _)
            | Work::RolledBack(s, _)
            | Work::Settle { session: s, .. } => s,
            Work::Send(f, _) => &f.request.session,
            Work::Read(p, _) => &p.session,
            Work::TakeBack(t, _, _) => &t.session,
        }
    }

    pub(super) fn operation(&self) -> Option<&OperationId> {
        match self {
            Work::Wake(_) | Work::Repair(_) | Work::Settle { .. } => None,
            Work::Proof(_, op) | Work::RolledBack(_, op) | Work::TakeBack(_, op, _) => Some(op),
            Work::Send(f, _) => Some(&f.request.operation_id),
            Work::Read(p, _) => Some(&p.snapshot.operation_id),
        }
    }
}

impl<S: OutboxStore> Custody<S> {
    /// Does `work`; on a store failure keeps it for [`STORE_RETRY`] later and tells the
    /// embedding. True when the work was done.
    pub(super) fn run_work(&mut self, work: Work, now: Millis) -> bool {
        let result = match work.clone() {
            Work::Wake(session) => {
                self.wake(&session, now);
                Ok(())
            }
            Work::Repair(session) => self
                .confirm_sending(&session, now)
                .map(|()| self.wake(&session, now)),
            Work::Send(f, result) => self.apply_send_result(*f, result, now),
            Work::Read(p, read) => self.apply_history_read(*p, read, now),
            Work::TakeBack(t, op, result) => self.apply_take_back(*t, &op, result, now),
            Work::Proof(session, op) => self.apply_delivery_proof(&session, &op, now),
            Work::RolledBack(session, op) => self.apply_rolled_back(&session, &op, now),
            Work::Settle {
                session,
                run,
                untaken,
            } => self
                .settle_run(&session, &run, &untaken, now)
                .map(|()| self.wake_scope(&session, now)),
        };
        match result {
            Ok(()) => true,
            Err(error) => {
                self.retry_later(work, error, now);
                false
            }
        }
    }

    /// Records a store failure met while doing `work`, and keeps the work for later.
    pub(super) fn retry_later(&mut self, work: Work, error: OutboxError, now: Millis) {
        if self.lease_lost(&error) {
            return;
        }
        let session = work.session().clone();
        let waking = matches!(&work, Work::Wake(s) if self.retries.iter().any(|(_, r)| matches!(r, Work::Wake(t) if t == s)));
        // Forgetting the session schedules its repair, which is all a failed repair
        // needs.
        let repairing = matches!(&work, Work::Repair(_));
        let retry_at = now.saturating_add(STORE_RETRY);
        self.forget(&session, now);
        let failure = StoreFailure {
            session: session.clone(),
            operation_id: work.operation().cloned(),
            error,
            retry_at: Some(retry_at),
        };
        self.stats.store_failures += 1;
        self.failures.insert(session, failure.clone());
        self.effects.push_back(CustodyEffect::StoreFailed(failure));
        if !waking && !repairing {
            self.retries.push((retry_at, work));
        }
    }

    /// A new attempt for (`session`, `op`) begins: answers of its older attempts that
    /// wait for a retry are dropped (counted as stale), so an old answer never lands on
    /// the new attempt's entry, even when the two entries look the same. A dropped send
    /// result frees the lane its attempt held; the new attempt's answer wakes the
    /// session, so a wake-up that came meanwhile is not lost.
    pub(super) fn supersede(&mut self, session: &SessionId, op: &OperationId) {
        let before = self.retries.len();
        let mut freed = Vec::new();
        self.retries.retain(|(_, r)| {
            let answer = matches!(r, Work::Send(..) | Work::Read(..) | Work::TakeBack(..));
            let dropped = answer && r.session() == session && r.operation() == Some(op);
            if let (true, Work::Send(f, _)) = (dropped, r) {
                freed.push(f.lane);
            }
            !dropped
        });
        self.stats.stale_answers += (before - self.retries.len()) as u64;
        if let Some(lanes) = self.asked.lanes.get_mut(session) {
            for lane in freed {
                lanes.get(lane).busy = false;
            }
        }
    }

    /// Settles a run's entries, or keeps that for later when the store fails.
    pub(super) fn settle_or_retry(
        &mut self,
        session: SessionId,
        run: RunId,
        untaken: Vec<OperationId>,
        now: Millis,
    ) {
        self.run_work(
            Work::Settle {
                session,
                run,
                untaken,
            },
            now,
        );
    }

    /// Runs the work kept for a deadline that passed.
    pub(super) fn run_due_work(&mut self, now: Millis) {
        let (mut due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.retries)
            .into_iter()
            .partition(|(at, _)| *at <= now);
        self.retries = later;
        // Repairs come last: the answers due with them are applied (or kept again)
        // first, so a repair never confirms from history an entry an answer is about
        // to settle.
        due.sort_by_key(|(_, r)| matches!(r, Work::Repair(_)));
        let mut retried = BTreeMap::new();
        for (_, retry) in due {
            let session = retry.session().clone();
            let done = self.run_work(retry, now);
            let all_done = retried.entry(session).or_insert(true);
            *all_done &= done;
        }
        // A session's failure shows until its retries succeed: none failed again, and no
        // work is kept for it any more (the repair a failure schedules is not work kept).
        for (session, all_done) in retried {
            let kept = self
                .retries
                .iter()
                .any(|(_, r)| r.session() == &session && !matches!(r, Work::Repair(_)));
            if all_done && !kept {
                self.failures.remove(&session);
            }
        }
    }
}
