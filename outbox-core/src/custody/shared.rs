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
//!   the shared registry holds for it that custody's own registry does not (another
//!   host's, or this host's own from before it let the scope go): new starts wait for
//!   it, a stop stops it through this host's agent, and the local stale reclaim leaves it
//!   alone. When the registry said it may be reclaimed (no activity for the stale limit
//!   and its host stopped renewing it), custody asks the registry again; once it still
//!   may, custody reclaims it, settles what it accepted and drains. A stop the registry
//!   holds for the scope with no stop worker here is resumed. A scope whose registry
//!   rows could not be read is read again at each renewal until they are (meanwhile a
//!   start there is refused by the registry itself, this host's old runs included).
//!   What is owed is written before the read, so a run this host ended never comes
//!   back as one to adopt. An adopted run's activity is not written to the registry:
//!   each host runs its own agent processes, so a run another host started reports
//!   nothing here.
//! - **Renewal.** Every [`SharedRuns::renew_every`] custody renews its own runs and
//!   pending stops, marking those with activity since the last renewal; a host that
//!   dies stops renewing, and its runs pass to the next owner.
//! - **Failures.** A start the shared registry could not take is a store failure of the
//!   session (shown, retried). Any other write that failed (a restore, an end, a stop's
//!   begin or end) is kept in order and written again at each renewal until it is taken,
//!   and a start first writes what is owed, so the registry sees every change in the
//!   order custody made it. Each failure is counted in
//!   [`super::CustodyStats::store_failures`] and reported as [`CustodyEffect::StoreFailed`]; a
//!   restore the registry refuses when it is finally written (another host's run holds
//!   the session) is reported the same way, not retried. Until an owed write is taken,
//!   the registry holds a claim this host no longer makes (an end), which only delays
//!   another host's start in that session, or lacks one it makes (a restore, a stop),
//!   which matters only to a host that takes the session over meanwhile.

use std::collections::{BTreeMap, BTreeSet};

use timeline_core::time::Millis;

use super::{Custody, CustodyEffect, StoreFailure, Work};
use crate::ids::{base_session, OperationId, RunId, SessionId};
use crate::runs::ActiveRun;
use crate::store::SharedRuns;
use crate::store::{OutboxError, OutboxStore};

/// A write to the shared registry not taken yet.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Owed {
    Start(SessionId, ActiveRun),
    End(SessionId, RunId),
    Joined(SessionId, RunId, OperationId),
    BeginCancellation(SessionId, RunId),
    EndCancellation(SessionId, RunId),
}

impl Owed {
    fn session(&self) -> &SessionId {
        match self {
            Owed::Start(s, _)
            | Owed::End(s, _)
            | Owed::Joined(s, _, _)
            | Owed::BeginCancellation(s, _)
            | Owed::EndCancellation(s, _) => s,
        }
    }

    /// Writes it; `Ok(Some(_))`: a restore the registry refused, with what to report.
    fn write(&self, shared: &mut dyn SharedRuns) -> Result<Option<String>, OutboxError> {
        match self {
            Owed::Start(s, run) => Ok(shared.start_run(s, run)?.err().map(|refused| {
                format!(
                    "the shared run registry holds another host's run in session {s}, so \
                     this host's run {} is not registered there ({refused})",
                    run.run_id
                )
            })),
            Owed::End(s, r) => shared.end_run(s, r).map(|()| None),
            Owed::Joined(s, r, op) => shared.joined_by(s, r, op).map(|()| None),
            Owed::BeginCancellation(s, r) => shared.begin_cancellation(s, r).map(|()| None),
            Owed::EndCancellation(s, r) => shared.end_cancellation(s, r).map(|()| None),
        }
    }
}

/// What custody keeps of the shared registry. See the module docs.
#[derive(Debug, Default)]
pub(super) struct SharedMirror {
    /// Runs custody adopted, with the time to ask the registry again whether it may
    /// reclaim each.
    adopted: BTreeMap<(SessionId, RunId), Millis>,
    /// Bases of scopes whose registry rows could not be read at adoption.
    adopting: BTreeSet<SessionId>,
    /// Custody's own runs with activity since the last renewal.
    touched: BTreeSet<(SessionId, RunId)>,
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
        self.adopting.remove(base);
        self.touched.retain(|(s, _)| base_session(s) != *base);
        self.owed.retain(|w| {
            !matches!(w, Owed::Start(..) | Owed::BeginCancellation(..))
                || base_session(w.session()) != *base
        });
    }
}

impl SharedMirror {
    /// Whether custody adopted `run` of `session` (the local stale reclaim leaves it to
    /// the registry).
    pub(super) fn is_adopted(&self, session: &SessionId, run: &RunId) -> bool {
        self.adopted.contains_key(&(session.clone(), run.clone()))
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
        let every = shared_every(&mut self.mirror.store);
        if !self.flush(now) {
            // The registry must see what is owed first; it failed (and said so).
            self.runs.end(session, run);
            let at = now.saturating_add(every);
            self.retries.push((at, Work::Wake(session.clone())));
            return false;
        }
        let Some(shared) = self.mirror.store.shared_runs() else {
            return true;
        };
        let refused = match shared.start_run(session, &active) {
            Ok(Ok(())) => {
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
                    let at = now.saturating_add(every);
                    self.retries.push((at, Work::Wake(session.clone())));
                }
            }
        }
        false
    }

    /// Adopts every run the shared registry holds for the scope whose base is `base` that
    /// custody's registry does not, and resumes the stops the registry holds there with
    /// no stop worker here. Returns how many runs it adopted; a registry that could not
    /// be read is reported, and read again at the next renewal.
    pub(super) fn adopt_shared(&mut self, base: &SessionId, now: Millis) -> usize {
        // What this host owes (an end, a stop's end) must be in the registry before it is
        // read, or a run it ended would come back as one to adopt.
        let flushed = self.flush(now);
        let Some(shared) = self.mirror.store.shared_runs() else {
            return 0;
        };
        let every = shared.renew_every();
        if !flushed {
            self.shared.adopting.insert(base.clone());
            self.shared_renew_soon(every, now);
            return 0;
        }
        let scope = match shared.scope(base) {
            Ok(scope) => scope,
            Err(error) => {
                self.shared.adopting.insert(base.clone());
                self.shared_renew_soon(every, now);
                self.shared_failed(base.clone(), error, now, every);
                return 0;
            }
        };
        self.shared.adopting.remove(base);
        let mut adopted = 0;
        for run in scope.runs {
            // A run custody's registry holds (this host's, in this tenure) is its own
            // to judge; any other holds the session until the registry lets it go.
            if self.runs.active(&run.session).is_some() {
                continue;
            }
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
        for stop in scope.cancellations {
            let key = (stop.session.clone(), stop.run.clone());
            if self.asked.stops.contains_key(&key) {
                continue;
            }
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

    /// The session message `op` joined `run` (an adopter continues its exchange).
    pub(super) fn shared_joined(
        &mut self,
        session: &SessionId,
        run: &RunId,
        op: &OperationId,
        now: Millis,
    ) {
        self.owe(Owed::Joined(session.clone(), run.clone(), op.clone()), now);
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

    /// The renewal, the owed writes, the adoptions to read again and the adopted runs'
    /// reclaims that are due.
    pub(super) fn shared_timeout(&mut self, now: Millis) {
        let due: Vec<(SessionId, RunId)> = self
            .shared
            .adopted
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(k, _)| k.clone())
            .collect();
        if !due.is_empty() {
            self.reclaim_adopted(due, now);
        }
        if self.shared.renew_at.is_some_and(|at| at <= now) {
            self.shared_renew(now);
        }
    }

    /// Asks the registry again about adopted runs whose time came: one it no longer
    /// holds, or that may be reclaimed now, is reclaimed; one its host renewed meanwhile
    /// waits until the registry's new time.
    fn reclaim_adopted(&mut self, due: Vec<(SessionId, RunId)>, now: Millis) {
        let bases: BTreeSet<SessionId> = due.iter().map(|(s, _)| base_session(s)).collect();
        let mut scopes = BTreeMap::new();
        let mut failed = Vec::new();
        let every = match self.mirror.store.shared_runs() {
            Some(shared) => {
                for base in bases {
                    match shared.scope(&base) {
                        Ok(scope) => {
                            scopes.insert(base, scope);
                        }
                        Err(error) => failed.push((base, error)),
                    }
                }
                shared.renew_every()
            }
            None => {
                // No registry any more: nothing holds these runs but custody.
                for base in bases {
                    scopes.insert(base, crate::store::SharedScope::default());
                }
                Millis(u64::MAX)
            }
        };
        for (session, run) in due {
            let Some(scope) = scopes.get(&base_session(&session)) else {
                // Unread: asked again a renewal later.
                let key = (session, run);
                self.shared.adopted.insert(key, now.saturating_add(every));
                continue;
            };
            let held = scope
                .runs
                .iter()
                .find(|r| r.session == session && r.run.run_id == run);
            let key = (session.clone(), run.clone());
            match held {
                Some(r) if r.reclaimable_in > Millis(0) => {
                    self.shared
                        .adopted
                        .insert(key, now.saturating_add(r.reclaimable_in));
                }
                held => {
                    self.shared.adopted.remove(&key);
                    if self.runs.end(&session, &run) {
                        if held.is_some() {
                            self.shared_ended(&session, &run, now);
                        }
                        self.settle_or_retry(session.clone(), run, Vec::new(), now);
                        self.wake_scope(&session, now);
                    }
                }
            }
        }
        for (base, error) in failed {
            self.shared_failed(base, error, now, every);
        }
    }

    /// Writes what is owed, in order; true when nothing is owed any more. A write that
    /// failed is reported and it and what follows it stay owed.
    fn flush(&mut self, now: Millis) -> bool {
        if self.shared.owed.is_empty() {
            return true;
        }
        let Some(shared) = self.mirror.store.shared_runs() else {
            return true;
        };
        let every = shared.renew_every();
        let owed = std::mem::take(&mut self.shared.owed);
        let mut refused = Vec::new();
        let mut failed = None;
        for (i, write) in owed.iter().enumerate() {
            match write.write(shared) {
                Ok(None) => {}
                Ok(Some(text)) => refused.push((write.session().clone(), text)),
                Err(error) => {
                    failed = Some((write.session().clone(), error));
                    self.shared.owed = owed.get(i..).unwrap_or_default().to_vec();
                    break;
                }
            }
        }
        for (session, text) in refused {
            self.stats.store_failures += 1;
            self.effects
                .push_back(CustodyEffect::StoreFailed(StoreFailure {
                    session,
                    operation_id: None,
                    error: OutboxError::unavailable(text),
                    retry_at: None,
                }));
        }
        let written = failed.is_none();
        if let Some((session, error)) = failed {
            self.shared_renew_soon(every, now);
            self.shared_failed(session, error, now, every);
        }
        written
    }

    fn shared_renew(&mut self, now: Millis) {
        self.shared.renew_at = None;
        let Some(every) = self.mirror.store.shared_runs().map(|s| s.renew_every()) else {
            return;
        };
        self.flush(now);
        let adopting: Vec<SessionId> = self.shared.adopting.iter().cloned().collect();
        for base in adopting {
            if self.adopt_shared(&base, now) > 0 {
                for member in crate::ids::ScopeId::of(&base).members() {
                    self.wake(&member, now);
                }
            }
        }
        let own: Vec<(SessionId, RunId, bool)> = self
            .runs
            .active_iter()
            .filter(|(s, a)| !self.shared.is_adopted(s, &a.run_id))
            .map(|(s, a)| {
                let key = (s.clone(), a.run_id.clone());
                let touched = self.shared.touched.contains(&key);
                (key.0, key.1, touched)
            })
            .collect();
        let stops: Vec<(SessionId, RunId)> = self.asked.stops.keys().cloned().collect();
        let renewing = own
            .first()
            .map(|r| r.0.clone())
            .or_else(|| stops.first().map(|k| k.0.clone()));
        if let (Some(session), Some(shared)) = (renewing.clone(), self.mirror.store.shared_runs()) {
            match shared.renew(&own, &stops) {
                Ok(()) => self.shared.touched.clear(),
                Err(error) => self.shared_failed(session, error, now, every),
            }
        }
        let pending = !self.shared.owed.is_empty() || !self.shared.adopting.is_empty();
        if renewing.is_some() || pending {
            self.shared_renew_soon(every, now);
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
                Ok(None) => {
                    self.shared_renew_soon(every, now);
                    return;
                }
                Ok(Some(text)) => {
                    self.stats.store_failures += 1;
                    self.effects
                        .push_back(CustodyEffect::StoreFailed(StoreFailure {
                            session: write.session().clone(),
                            operation_id: None,
                            error: OutboxError::unavailable(text),
                            retry_at: None,
                        }));
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

    fn shared_failed(
        &mut self,
        session: SessionId,
        error: OutboxError,
        now: Millis,
        every: Millis,
    ) {
        if self.lease_lost(&error) {
            // The scope is another host's now: it reads the registry itself.
            return;
        }
        self.stats.store_failures += 1;
        self.effects
            .push_back(CustodyEffect::StoreFailed(StoreFailure {
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
