//! The run registry (OB-14): at most one active run per app session.
//!
//! - A second start in a session with an active run fails with
//!   [`RUN_IN_PROGRESS_TEXT`]; a start while a cancellation is pending in the scope fails
//!   with [`CANCELLATION_PENDING_TEXT`].
//! - The start/cancel barrier of a base session: the registry is one single-threaded
//!   machine, so a start and a stop never interleave; a pending cancellation keeps new
//!   runs out until the stop has a result.
//! - The finalizing flag is claimed once per run.
//! - A restore puts the same run ID back, and never replaces a different active run.
//! - A run whose newest activity is older than 45 s is reclaimed at each start and each
//!   read of the active runs, unless its adapter vetoes (a registered Codex turn, a live
//!   Claude host process).

use std::collections::{BTreeMap, BTreeSet};

use timeline_core::time::Millis;

use crate::entry::{AccessLevel, CANCELLATION_PENDING_TEXT, RUN_IN_PROGRESS_TEXT};
use crate::ids::{base_session, OperationId, RunId, SessionId};

/// A run whose newest activity is older than this is stale.
pub const STALE_RUN_AFTER: Millis = Millis(45_000);

/// Why a start or restore was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// Another run is active in the session.
    #[error("{}", RUN_IN_PROGRESS_TEXT)]
    InProgress,
    /// A cancellation is pending in the scope.
    #[error("{}", CANCELLATION_PENDING_TEXT)]
    CancellationPending,
    /// A restore met a different active run.
    #[error("a different run is active; the restore is refused")]
    RestoreRefused,
}

/// An active run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActiveRun {
    /// Its ID.
    pub run_id: RunId,
    /// The operation that started it.
    pub started_by: Option<OperationId>,
    /// The last session message that joined it.
    pub last_session_message: Option<OperationId>,
    /// The access level of its turn.
    pub access: Option<AccessLevel>,
    /// Newest activity.
    pub last_activity: Millis,
    /// The finalizer was claimed.
    pub finalizing: bool,
}

/// Active runs and pending cancellations.
#[derive(Clone, Debug, Default)]
pub struct RunRegistry {
    active: BTreeMap<SessionId, ActiveRun>,
    cancelling: BTreeSet<(SessionId, RunId)>,
}

impl RunRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reclaims stale runs whose adapter does not veto; returns what was reclaimed.
    pub fn reclaim_stale(
        &mut self,
        now: Millis,
        veto: &dyn Fn(&SessionId, &RunId) -> bool,
    ) -> Vec<(SessionId, RunId)> {
        let stale: Vec<(SessionId, RunId)> = self
            .active
            .iter()
            .filter(|(s, r)| {
                now.saturating_sub(r.last_activity) > STALE_RUN_AFTER && !veto(s, &r.run_id)
            })
            .map(|(s, r)| (s.clone(), r.run_id.clone()))
            .collect();
        for (s, _) in &stale {
            self.active.remove(s);
        }
        stale
    }

    /// Starts `run` in `session` (stale runs are reclaimed first).
    pub fn start(
        &mut self,
        session: &SessionId,
        run: RunId,
        started_by: Option<OperationId>,
        access: Option<AccessLevel>,
        now: Millis,
        veto: &dyn Fn(&SessionId, &RunId) -> bool,
    ) -> Result<(), RunError> {
        self.reclaim_stale(now, veto);
        if self.cancellation_pending(session) {
            return Err(RunError::CancellationPending);
        }
        if self.active.contains_key(session) {
            return Err(RunError::InProgress);
        }
        self.active.insert(
            session.clone(),
            ActiveRun {
                run_id: run,
                started_by,
                last_session_message: None,
                access,
                last_activity: now,
                finalizing: false,
            },
        );
        Ok(())
    }

    /// Puts `run` back after its predecessor turn removed it; refused when a different
    /// run is active.
    pub fn restore(&mut self, session: &SessionId, run: ActiveRun) -> Result<(), RunError> {
        match self.active.get(session) {
            Some(active) if active.run_id != run.run_id => Err(RunError::RestoreRefused),
            Some(_) => Ok(()),
            None => {
                self.active.insert(session.clone(), run);
                Ok(())
            }
        }
    }

    /// Ends `run`; false when it was not the active run.
    pub fn end(&mut self, session: &SessionId, run: &RunId) -> bool {
        if self.active.get(session).is_some_and(|a| &a.run_id == run) {
            self.active.remove(session);
            return true;
        }
        false
    }

    /// Claims the finalizer of `run` once.
    pub fn claim_finalizing(&mut self, session: &SessionId, run: &RunId) -> bool {
        match self.active.get_mut(session) {
            Some(a) if &a.run_id == run && !a.finalizing => {
                a.finalizing = true;
                true
            }
            _ => false,
        }
    }

    /// Records activity of `run`.
    pub fn touch(&mut self, session: &SessionId, run: &RunId, now: Millis) {
        if let Some(a) = self.active.get_mut(session) {
            if &a.run_id == run {
                a.last_activity = a.last_activity.max(now);
            }
        }
    }

    /// Records the session message that joined `run`.
    pub fn joined_by(&mut self, session: &SessionId, run: &RunId, op: &OperationId) {
        if let Some(a) = self.active.get_mut(session) {
            if &a.run_id == run {
                a.last_session_message = Some(op.clone());
            }
        }
    }

    /// The active run of a session.
    pub fn active(&self, session: &SessionId) -> Option<&ActiveRun> {
        self.active.get(session)
    }

    /// Every active run, as held (nothing is reclaimed).
    pub fn active_iter(&self) -> impl Iterator<Item = (&SessionId, &ActiveRun)> {
        self.active.iter()
    }

    /// Every active run, after reclaiming stale ones.
    pub fn active_runs(
        &mut self,
        now: Millis,
        veto: &dyn Fn(&SessionId, &RunId) -> bool,
    ) -> Vec<(SessionId, ActiveRun)> {
        self.reclaim_stale(now, veto);
        self.active
            .iter()
            .map(|(s, r)| (s.clone(), r.clone()))
            .collect()
    }

    /// Active runs in the scope of `session` (its base and every alias).
    pub fn scope_runs(&self, session: &SessionId) -> Vec<(SessionId, RunId)> {
        let base = base_session(session);
        self.active
            .iter()
            .filter(|(s, _)| base_session(s) == base)
            .map(|(s, r)| (s.clone(), r.run_id.clone()))
            .collect()
    }

    /// Marks a cancellation of `run` pending.
    pub fn begin_cancellation(&mut self, session: &SessionId, run: &RunId) {
        self.cancelling.insert((session.clone(), run.clone()));
    }

    /// Clears a pending cancellation.
    pub fn end_cancellation(&mut self, session: &SessionId, run: &RunId) {
        self.cancelling.remove(&(session.clone(), run.clone()));
    }

    /// True while a cancellation is pending anywhere in the scope of `session`.
    pub fn cancellation_pending(&self, session: &SessionId) -> bool {
        let base = base_session(session);
        self.cancelling.iter().any(|(s, _)| base_session(s) == base)
    }

    /// Forgets every run and pending cancellation of the scope whose base is `base`
    /// (custody let the scope go: another host serves it now).
    pub fn release_scope(&mut self, base: &SessionId) {
        self.active.retain(|s, _| base_session(s) != *base);
        self.cancelling.retain(|(s, _)| base_session(s) != *base);
    }

    /// True when the scope of `session` must not drain: more than one active run, or a
    /// pending cancellation (OB-06).
    pub fn scope_ambiguous(&self, session: &SessionId) -> bool {
        self.scope_runs(session).len() > 1 || self.cancellation_pending(session)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(id: &str) -> SessionId {
        SessionId::new(id).unwrap()
    }
    fn r(id: &str) -> RunId {
        RunId::new(id).unwrap()
    }
    fn no_veto(_: &SessionId, _: &RunId) -> bool {
        false
    }

    // OB-14
    #[test]
    fn one_active_run_per_session_with_the_seed_texts() {
        let mut reg = RunRegistry::new();
        reg.start(&s("a"), r("run-1"), None, None, Millis(0), &no_veto)
            .unwrap();
        let err = reg
            .start(&s("a"), r("run-2"), None, None, Millis(1), &no_veto)
            .unwrap_err();
        assert_eq!(err.to_string(), RUN_IN_PROGRESS_TEXT);
        reg.begin_cancellation(&s("a"), &r("run-1"));
        reg.end(&s("a"), &r("run-1"));
        let err = reg
            .start(
                &s("a::skills-agent"),
                r("run-3"),
                None,
                None,
                Millis(2),
                &no_veto,
            )
            .unwrap_err();
        assert_eq!(err.to_string(), CANCELLATION_PENDING_TEXT);
        reg.end_cancellation(&s("a"), &r("run-1"));
        reg.start(&s("a"), r("run-3"), None, None, Millis(3), &no_veto)
            .unwrap();
    }

    // OB-14
    #[test]
    fn finalizing_is_claimed_once_and_restore_never_replaces() {
        let mut reg = RunRegistry::new();
        reg.start(&s("a"), r("run-1"), None, None, Millis(0), &no_veto)
            .unwrap();
        assert!(reg.claim_finalizing(&s("a"), &r("run-1")));
        assert!(!reg.claim_finalizing(&s("a"), &r("run-1")));
        let saved = reg.active(&s("a")).unwrap().clone();
        reg.end(&s("a"), &r("run-1"));
        reg.restore(&s("a"), saved.clone()).unwrap();
        assert_eq!(reg.active(&s("a")).unwrap().run_id, r("run-1"));
        reg.end(&s("a"), &r("run-1"));
        reg.start(&s("a"), r("run-2"), None, None, Millis(0), &no_veto)
            .unwrap();
        assert_eq!(reg.restore(&s("a"), saved), Err(RunError::RestoreRefused));
        assert_eq!(reg.active(&s("a")).unwrap().run_id, r("run-2"));
    }

    // OB-14: 45 s, at the limit and one past it; the adapter's veto.
    #[test]
    fn stale_runs_are_reclaimed_after_45_seconds_unless_vetoed() {
        let mut reg = RunRegistry::new();
        reg.start(&s("a"), r("run-1"), None, None, Millis(0), &no_veto)
            .unwrap();
        assert!(
            reg.active_runs(Millis(45_000), &no_veto).len() == 1,
            "45 s is not older than 45 s"
        );
        assert!(
            reg.active_runs(Millis(45_001), &|_, _| true).len() == 1,
            "vetoed"
        );
        assert!(reg.active_runs(Millis(45_001), &no_veto).is_empty());
        reg.start(&s("a"), r("run-2"), None, None, Millis(50_000), &no_veto)
            .unwrap();
        reg.touch(&s("a"), &r("run-2"), Millis(90_000));
        // A start reclaims too.
        reg.start(&s("a"), r("run-3"), None, None, Millis(135_001), &no_veto)
            .unwrap();
    }

    // OB-06
    #[test]
    fn two_active_runs_in_one_scope_or_a_pending_cancellation_is_ambiguous() {
        let mut reg = RunRegistry::new();
        reg.start(&s("a"), r("run-1"), None, None, Millis(0), &no_veto)
            .unwrap();
        assert!(!reg.scope_ambiguous(&s("a")));
        reg.start(
            &s("a::skills-agent"),
            r("run-2"),
            None,
            None,
            Millis(0),
            &no_veto,
        )
        .unwrap();
        assert!(reg.scope_ambiguous(&s("a")));
        assert!(reg.scope_ambiguous(&s("a::skills-agent")));
        assert!(!reg.scope_ambiguous(&s("b")));
    }
}
