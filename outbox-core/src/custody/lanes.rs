//! What custody has asked of the agent and not had answered: the two send lanes of a
//! session, the send in flight, the history reads, take-backs, interrupts and stops
//! waiting for their answers. Custody keeps these by attempt; each answer finds its
//! record here or is stale.

use super::CallerId;
use std::collections::{BTreeMap, BTreeSet};

use crate::adapter::AttemptId;
use crate::adapter::SendRequest;
use crate::entry::OutboxEntry;
use crate::ids::{OperationId, RunId, SessionId};
use timeline_core::time::Millis;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LaneKind {
    Normal,
    Steer,
}

#[derive(Clone, Debug, Default)]
pub(super) struct Lane {
    pub(super) busy: bool,
    pub(super) follow_up: bool,
}

#[derive(Clone, Debug, Default)]
pub(super) struct Lanes {
    pub(super) normal: Lane,
    pub(super) steer: Lane,
}

impl Lanes {
    pub(super) fn get(&mut self, kind: LaneKind) -> &mut Lane {
        match kind {
            LaneKind::Normal => &mut self.normal,
            LaneKind::Steer => &mut self.steer,
        }
    }
}

/// A send handed to the agent and not answered yet.
#[derive(Clone, Debug)]
pub(super) struct InFlight {
    pub(super) snapshot: OutboxEntry,
    pub(super) lane: LaneKind,
    pub(super) deadline: Millis,
    pub(super) request: SendRequest,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ReadPurpose {
    /// After an uncertain send, at start-up, or in the repair after a failed write.
    Confirm,
    /// After the run that accepted the message (or that a steer was sent to) ended: the
    /// turn is over, so a readable history without the message proves the run did not
    /// take it (OB-11, OB-15).
    Settle,
    /// Before reopening a canceled operation that had an acceptance.
    Reopen,
    /// Before the user's own send of a message held because custody could not confirm
    /// whether the agent has it: found settles it as sent; otherwise it goes, once, since
    /// the user was asked to check the timeline first and chose to send (OB-08).
    UserSend,
}

/// A history read asked for and not answered yet.
#[derive(Clone, Debug)]
pub(super) struct PendingRead {
    pub(super) session: SessionId,
    pub(super) purpose: ReadPurpose,
    pub(super) snapshot: OutboxEntry,
}

/// A take-back asked for and not answered yet.
#[derive(Clone, Debug)]
pub(super) struct PendingTakeBack {
    pub(super) session: SessionId,
    pub(super) snapshot: OutboxEntry,
}

#[derive(Clone, Debug)]
pub(super) struct Interrupt {
    pub(super) op: OperationId,
    pub(super) old_run: RunId,
    pub(super) deadline: Millis,
    pub(super) next_poll: Millis,
}

#[derive(Clone, Debug)]
pub(super) struct StopWorker {
    pub(super) callers: Vec<(CallerId, Millis)>,
    pub(super) retry_at: Option<Millis>,
    /// The attempt of the stop in flight, if one is.
    pub(super) attempt: Option<AttemptId>,
}

/// What custody asked of the agent and has not had answered, by attempt, and the lanes
/// those asks hold.
#[derive(Debug)]
pub(super) struct Asked {
    /// The two send lanes of each session.
    pub(super) lanes: BTreeMap<SessionId, Lanes>,
    /// The last attempt number handed out.
    pub(super) next_attempt: u64,
    /// Sends handed to the agent.
    pub(super) in_flight: BTreeMap<AttemptId, InFlight>,
    /// History reads.
    pub(super) reads: BTreeMap<AttemptId, PendingRead>,
    /// Take-backs of accepted steers.
    pub(super) take_backs: BTreeMap<AttemptId, PendingTakeBack>,
    /// The interrupt under way in each session.
    pub(super) interrupts: BTreeMap<SessionId, Interrupt>,
    /// Operations an interrupt was spent on.
    pub(super) interrupt_spent: BTreeSet<(SessionId, OperationId)>,
    /// The stop worker of each run being stopped.
    pub(super) stops: BTreeMap<(SessionId, RunId), StopWorker>,
    /// Runs stopped lately, until when their stop answers from the cache.
    pub(super) stop_cache: BTreeMap<(SessionId, RunId), Millis>,
}

impl Asked {
    /// The `kind` lane of `session` (idle until first used).
    pub(super) fn lane(&mut self, session: &SessionId, kind: LaneKind) -> &mut Lane {
        self.lanes.entry(session.clone()).or_default().get(kind)
    }

    /// Whether the normal and the steer lane of `session` are busy.
    pub(super) fn busy(&self, session: &SessionId) -> (bool, bool) {
        self.lanes
            .get(session)
            .map_or((false, false), |l| (l.normal.busy, l.steer.busy))
    }

    /// Nothing asked yet; attempts are numbered from `base`.
    pub(super) fn new(base: u64) -> Self {
        Asked {
            lanes: BTreeMap::new(),
            next_attempt: base,
            in_flight: BTreeMap::new(),
            reads: BTreeMap::new(),
            take_backs: BTreeMap::new(),
            interrupts: BTreeMap::new(),
            interrupt_spent: BTreeSet::new(),
            stops: BTreeMap::new(),
            stop_cache: BTreeMap::new(),
        }
    }
}
