//! Custody's runs written through to a registry several hosts share (OB-14 across
//! hosts, MH-03), when its store offers one ([`OutboxStore::shared_runs`]).
//!
//! Custody's own [`crate::runs::RunRegistry`] stays the judge of the runs it started;
//! the shared one decides between hosts:
//!
//! - **Start.** A start custody's registry allows is written to the shared registry
//!   before anything is sent. Refused there (another host's run is active in the session,
//!   or its stop is pending in the scope), nothing starts: custody adopts the scope's
//!   runs of other hosts, and the queue waits behind them as behind a run of its own.
//! - **Takeover.** A scope custody is granted ([`Custody::grant_scope`]) adopts every run
//!   of another host the shared registry holds for it: new starts wait for it, a stop
//!   stops it through this host's agent, and once the registry says it may be reclaimed
//!   (no activity for the stale limit and its host stopped renewing it) custody reclaims
//!   it, settles what it accepted and drains. A stop the other host began and did not end
//!   is resumed.
//! - **Renewal.** Every [`SharedRuns::renew_every`] custody renews its own runs and
//!   pending stops, marking those with activity since the last renewal; a host that
//!   dies stops renewing, and its runs pass to the next owner.
//! - **Failures.** A start the shared registry could not take is a store failure of the
//!   session (shown, retried). Any other write that failed (an end, a stop's begin or end)
//!   is kept in order and written again at each renewal until it is taken; each failure
//!   is counted in [`super::CustodyStats::store_failures`] and reported as
//!   [`Effect::StoreFailed`]. Until it is taken, the registry holds a claim this host no
//!   longer makes, which only delays another host's start in that session.

use std::collections::BTreeMap;

use timeline_core::time::Millis;

use super::{Custody, Effect, StoreFailure, Work};
use crate::ids::{base_session, RunId, SessionId};
use crate::runs::{ActiveRun, SharedRuns};
use crate::store::{OutboxStore, StoreError};

/// A write to the shared registry not taken yet.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Owed {
    Start(SessionId, ActiveRun),
    End(SessionId, RunId),
    BeginCancellation(SessionId, RunId),
    EndCancellation(SessionId, RunId),
}

impl Owed {
    fn session(&self) -> &SessionId {
        match self {
            Owed::Start(s, _)
            | Owed::End(s, _)
            | Owed::BeginCancellation(s, _)
            | Owed::EndCancellation(s, _) => s,
        }
    }

    fn write(&self, shared: &mut dyn SharedRuns) -> Result<(), StoreError> {
        match self {
            // A restore refused there is another host's run: custody's own goes on.
            Owed::Start(s, run) => shared.start_run(s, run).map(|_| ()),
            Owed::End(s, r) => shared.end_run(s, r),
            Owed::BeginCancellation(s, r) => shared.begin_cancellation(s, r),
            Owed::EndCancellation(s, r) => shared.end_cancellation(s, r),
        }
    }
}

/// What custody keeps of the shared registry. See the module docs.
#[derive(Debug, Default)]
pub(super) struct SharedMirror {
    /// Runs of other hosts custody adopted, with the time it may reclaim each.
    adopted: BTreeMap<(SessionId, RunId), Millis>,
    /// Custody's own runs with activity since the last renewal.
    touched: std::collections::BTreeSet<(SessionId, RunId)>,
    /// Writes not taken yet, oldest first.
    owed: Vec<Owed>,
    /// When the next renewal is due; `None` while nothing needs renewing.
    renew_at: Option<Millis>,
}

impl SharedMirror {
    /// The deadlines of the shared registry: the next renewal, the adopted runs'
    /// reclaims.
    pub(super) fn deadlines(&self) -> impl Iterator<Item = Millis> + '_ {
        self.renew_at
            .into_iter()
            .chain(self.adopted.values().copied())
    }

    /// Forgets what it kept of the scope whose base is `base` (custody let it go). Its
    /// owed ends stay, since the registry must still hear that this host's claims are
    /// over; an owed start is dropped, since this host claims nothing there any more.
    pub(super) fn forget_scope(&mut self, base: &SessionId) {
        self.adopted.retain(|(s, _), _| base_session(s) != *base);
        self.touched.retain(|(s, _)| base_session(s) != *base);
        self.owed.retain(|w| {
            !matches!(w, Owed::Start(..) | Owed::BeginCancellation(..))
                || base_session(w.session()) != *base
        });
    }
}

impl<S: OutboxStore> Custody<S> {
    /// Writes the start of `run` (just started in custody's registry) to the shared
    /// registry. True when it may go; false when the shared registry refused (custody
    /// ended the run again and adopted what holds the scope) or could not be written (a
    /// store failure, retried).
    pub(super) fn shared_start(&mut self, session: &SessionId, run: &RunId, now: Millis) -> bool {
        let Some(active) = self.runs.active(session).cloned() else {
            return true;
        };
        let Some(shared) = self.mirror.store.shared_runs() else {
            return true;
        };
        let refused = match shared.start_run(session, &active) {
            Ok(Ok(())) => {
                let every = shared_every(&mut self.mirror.store);
                self.shared_renew_soon(every, now);
                return true;
            }
            Ok(Err(_)) => None,
            Err(error) => Some(error),
        };
        self.runs.end(session, run);
        match refused {
            Some(error) => self.retry_later(Work::Wake(session.clone()), error, now),
            None => {
                if self.adopt_shared(&base_session(session), now) == 0 {
                    // Gone again before it was read: try once more a renewal later.
                    let at = now.saturating_add(shared_every(&mut self.mirror.store));
                    self.retries.push((at, Work::Wake(session.clone())));
                }
            }
        }
        false
    }

    /// Adopts every run of another host the shared registry holds for the scope whose
    /// base is `base`, and resumes the stops another host began there. Returns how many
    /// runs it adopted.
    pub(super) fn adopt_shared(&mut self, base: &SessionId, now: Millis) -> usize {
        let Some(shared) = self.mirror.store.shared_runs() else {
            return 0;
        };
        let scope = match shared.scope(base) {
            Ok(scope) => scope,
            Err(error) => {
                self.retry_later(Work::Repair(base.clone()), error, now);
                return 0;
            }
        };
        let mut adopted = 0;
        for run in scope.runs.into_iter().filter(|r| !r.mine) {
            let mut active = run.run;
            active.last_activity = now;
            active.finalizing = false;
            let key = (run.session.clone(), active.run_id.clone());
            if self.runs.restore(&run.session, active).is_ok() {
                self.shared
                    .adopted
                    .insert(key, now.saturating_add(run.reclaimable_in));
                adopted += 1;
            }
        }
        for stop in scope.cancellations.into_iter().filter(|c| !c.mine) {
            if self.run_active(&stop.session, &stop.run) {
                self.stop(&stop.session, &stop.run, None, now);
            } else {
                // Its run is gone: the stop has nothing left to wait for.
                self.owe(Owed::EndCancellation(stop.session, stop.run), now);
            }
        }
        adopted
    }

    /// A run custody put back (a turn after its predecessor removed it).
    pub(super) fn shared_restored(&mut self, session: &SessionId, run: &ActiveRun, now: Millis) {
        self.owe(Owed::Start(session.clone(), run.clone()), now);
    }

    /// `run` left custody's registry.
    pub(super) fn shared_ended(&mut self, session: &SessionId, run: &RunId, now: Millis) {
        let key = (session.clone(), run.clone());
        self.shared.adopted.remove(&key);
        self.shared.touched.remove(&key);
        self.owe(Owed::End(session.clone(), run.clone()), now);
    }

    /// A stop of `run` began.
    pub(super) fn shared_stop_began(&mut self, session: &SessionId, run: &RunId, now: Millis) {
        self.owe(Owed::BeginCancellation(session.clone(), run.clone()), now);
    }

    /// A stop of `run` ended.
    pub(super) fn shared_stop_ended(&mut self, session: &SessionId, run: &RunId, now: Millis) {
        self.owe(Owed::EndCancellation(session.clone(), run.clone()), now);
    }

    /// `run` had activity.
    pub(super) fn shared_touched(&mut self, session: &SessionId, run: &RunId) {
        if self.shared.renew_at.is_some() {
            self.shared.touched.insert((session.clone(), run.clone()));
        }
    }

    /// The renewal, the owed writes and the adopted runs' reclaims that are due.
    pub(super) fn shared_timeout(&mut self, now: Millis) {
        let due: Vec<(SessionId, RunId)> = self
            .shared
            .adopted
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for (session, run) in due {
            self.shared.adopted.remove(&(session.clone(), run.clone()));
            if self.runs.end(&session, &run) {
                self.shared_ended(&session, &run, now);
                self.settle_or_retry(session.clone(), run, Vec::new(), now);
                self.wake_scope(&session, now);
            }
        }
        if self.shared.renew_at.is_some_and(|at| at <= now) {
            self.shared_renew(now);
        }
    }

    fn shared_renew(&mut self, now: Millis) {
        self.shared.renew_at = None;
        let Some(shared) = self.mirror.store.shared_runs() else {
            return;
        };
        let every = shared.renew_every();
        let owed = std::mem::take(&mut self.shared.owed);
        let mut failed = Vec::new();
        for (i, write) in owed.iter().enumerate() {
            if let Err(error) = write.write(shared) {
                failed.push((write.session().clone(), error));
                self.shared.owed = owed[i..].to_vec();
                break;
            }
        }
        let own: Vec<(SessionId, RunId, bool)> = self
            .runs
            .active_iter()
            .filter(|(s, a)| {
                !self
                    .shared
                    .adopted
                    .contains_key(&((*s).clone(), a.run_id.clone()))
            })
            .map(|(s, a)| {
                let key = (s.clone(), a.run_id.clone());
                let touched = self.shared.touched.contains(&key);
                (key.0, key.1, touched)
            })
            .collect();
        let renewing = own
            .first()
            .map(|r| r.0.clone())
            .or_else(|| self.stops.keys().next().map(|k| k.0.clone()));
        if let Some(session) = renewing.clone() {
            match shared.renew(&own) {
                Ok(()) => self.shared.touched.clear(),
                Err(error) => failed.push((session, error)),
            }
        }
        let owing = !self.shared.owed.is_empty();
        for (session, error) in failed {
            self.shared_failed(session, error, now, every);
        }
        if renewing.is_some() || owing {
            self.shared.renew_at = Some(now.saturating_add(every));
        }
    }

    /// Writes `write` now; kept for the next renewal when it fails.
    fn owe(&mut self, write: Owed, now: Millis) {
        let Some(shared) = self.mirror.store.shared_runs() else {
            return;
        };
        let every = shared.renew_every();
        if self.shared.owed.is_empty() {
            match write.write(shared) {
                Ok(()) => {
                    self.shared_renew_soon(every, now);
                    return;
                }
                Err(error) => {
                    let session = write.session().clone();
                    self.shared.owed.push(write);
                    self.shared_failed(session, error, now, every);
                }
            }
        } else {
            // Earlier writes are owed: this one waits behind them, in order.
            self.shared.owed.push(write);
        }
        self.shared_renew_soon(every, now);
    }

    fn shared_renew_soon(&mut self, every: Millis, now: Millis) {
        let at = now.saturating_add(every);
        self.shared.renew_at = Some(self.shared.renew_at.map_or(at, |t| t.min(at)));
    }

    fn shared_failed(&mut self, session: SessionId, error: StoreError, now: Millis, every: Millis) {
        if self.lease_lost(&error, now) {
            // The scope is another host's now: it reads the registry itself.
            return;
        }
        self.stats.store_failures += 1;
        self.effects.push_back(Effect::StoreFailed(StoreFailure {
            session,
            operation_id: None,
            error,
            retry_at: Some(now.saturating_add(every)),
        }));
    }
}

/// The renewal interval of the store's shared registry (none: never).
fn shared_every<S: OutboxStore>(store: &mut S) -> Millis {
    store
        .shared_runs()
        .map_or(Millis(u64::MAX), |s| s.renew_every())
}
