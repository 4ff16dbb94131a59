//! The run registry several hosts share (OB-14 across hosts), as one host's store
//! offers it ([`super::OutboxStore::shared_runs`]): a store trait, beside the outbox
//! store it extends.

use timeline_core::time::Millis;

use super::OutboxError;
use crate::ids::{OperationId, RunId, SessionId};
use crate::runs::{ActiveRun, RunError};

/// A run as a registry shared by several hosts holds it ([`SharedRuns::scope`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SharedRun {
    /// Its session.
    pub session: SessionId,
    /// The run. Its `last_activity` is the registry's own clock and means nothing to
    /// another host's; [`SharedRun::reclaimable_in`] is what a host goes by.
    pub run: ActiveRun,
    /// The host asking started it.
    pub mine: bool,
    /// How long until a host that did not start it may reclaim it, by the registry's
    /// clock: the run has had no activity for the stale limit and its host stopped
    /// renewing it. Zero once it may.
    pub reclaimable_in: Millis,
}

impl SharedRun {
    /// `run` of `session`, another host's, reclaimable now.
    pub fn new(session: SessionId, run: ActiveRun) -> Self {
        SharedRun {
            session,
            run,
            mine: false,
            reclaimable_in: Millis(0),
        }
    }
}

/// A pending cancellation as the shared registry holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SharedCancellation {
    /// Its session.
    pub session: SessionId,
    /// The run being stopped.
    pub run: RunId,
    /// The host asking began it.
    pub mine: bool,
}

impl SharedCancellation {
    /// A stop of `run` of `session`, another host's.
    pub fn new(session: SessionId, run: RunId) -> Self {
        SharedCancellation {
            session,
            run,
            mine: false,
        }
    }
}

/// What the shared registry holds of one session scope.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SharedScope {
    /// Its active runs.
    pub runs: Vec<SharedRun>,
    /// Its pending cancellations.
    pub cancellations: Vec<SharedCancellation>,
}

/// The run registry several hosts share (OB-14 across hosts), seen by one of them.
///
/// Custody keeps its own [`RunRegistry`](crate::runs::RunRegistry) for the scopes it serves and writes each change
/// through to this one when its store offers it
/// ([`crate::store::OutboxStore::shared_runs`]): a start here is refused while another
/// host's run is active in the session or a cancellation is pending in its scope, a run
/// a host stops renewing passes to the next owner of its session (which adopts it,
/// waits for it and reclaims it when it may), and a stop a host began and did not end is
/// resumed by that owner. Every method is one transaction.
pub trait SharedRuns {
    /// Starts `run` in `session` for this host. `Ok(Err(_))`, with nothing written, while
    /// another run is active in the session and may not be reclaimed yet
    /// ([`RunError::InProgress`]; also a run of this host's own from before it let the
    /// scope go, which its agent may still be working), or a cancellation another host
    /// began is pending in the scope ([`RunError::CancellationPending`]). The same run of
    /// this host's written again (a restore) is taken as it is.
    fn start_run(
        &mut self,
        session: &SessionId,
        run: &ActiveRun,
    ) -> Result<Result<(), RunError>, OutboxError>;

    /// Ends `run` of `session`, whichever host started it.
    fn end_run(&mut self, session: &SessionId, run: &RunId) -> Result<(), OutboxError>;

    /// Records that the session message `op` joined `run` of `session` (the run's
    /// `last_session_message`, which a host that adopts the run continues from).
    fn joined_by(
        &mut self,
        session: &SessionId,
        run: &RunId,
        op: &OperationId,
    ) -> Result<(), OutboxError>;

    /// Renews this host's claim on `runs` (a run listed with `true` had activity since
    /// the last renewal) and on the pending cancellations `stops`; a claim of this host's
    /// not listed is left to lapse.
    fn renew(
        &mut self,
        runs: &[(SessionId, RunId, bool)],
        stops: &[(SessionId, RunId)],
    ) -> Result<(), OutboxError>;

    /// How often [`SharedRuns::renew`] must be called for the claims to hold.
    fn renew_every(&self) -> Millis;

    /// Marks a cancellation of `run` pending for this host.
    fn begin_cancellation(&mut self, session: &SessionId, run: &RunId) -> Result<(), OutboxError>;

    /// Clears a pending cancellation of `run`, whichever host began it.
    fn end_cancellation(&mut self, session: &SessionId, run: &RunId) -> Result<(), OutboxError>;

    /// The active runs and pending cancellations of the scope whose base is `base`.
    fn scope(&mut self, base: &SessionId) -> Result<SharedScope, OutboxError>;
}
