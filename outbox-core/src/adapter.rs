//! The agent-adapter boundary: the four steps that differ by agent (send, read history
//! after an uncertain send, stop, take back an accepted steer), and what each agent can
//! do, as data ([`Capabilities`]).
//!
//! The custody machine never calls an adapter: it returns [`crate::custody::CustodyEffect`]s
//! and takes the adapter's answers through its `handle_*` methods. [`AgentAdapter`] is
//! the synchronous shape of an adapter for embeddings and tests that answer at once;
//! [`crate::custody::Custody::drive`] connects the two.

use serde::{Deserialize, Serialize};

pub use timeline_core::key::AgentKind;

use crate::entry::{Acceptance, MessageRequest};
use crate::ids::{OperationId, RunId, SessionId};

/// How an agent proves delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ProofKind {
    /// Codex: a user message whose `clientId` equals the operation ID.
    ClientIdEcho,
    /// Claude: the transcript holds a user message with the saved UUID.
    TranscriptUuid,
    /// An ACP v1 agent: a client gives no message ID, so nothing proves a delivery
    /// afterwards. A history read answers [`HistoryRead::Unreadable`], and a send
    /// whose outcome is unknown is held for the user, never sent again by itself.
    Unprovable,
}

/// What an adapter supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Capabilities {
    /// The agent.
    pub agent: AgentKind,
    /// `replace-latest` (and `rollbackBeforeSend`).
    pub replace_latest: bool,
    /// Whether the agent takes `speedMode`.
    pub speed_mode: bool,
    /// The exact scan after a run (overlay settlement).
    pub exact_scan: bool,
    /// The restart repair of that scan.
    pub restart_repair: bool,
    /// The delivery proof.
    pub proof: ProofKind,
    /// Whether the agent takes a message into a running turn (`steer-running`). An
    /// agent without it is refused such a message at submit, as replace latest is.
    #[serde(default = "steer_default")]
    pub steer: bool,
}

const fn steer_default() -> bool {
    true
}

impl Capabilities {
    /// Codex: replace latest, speed mode, exact scan, restart repair, clientId echo.
    pub const fn codex() -> Capabilities {
        Capabilities {
            agent: AgentKind::Codex,
            replace_latest: true,
            speed_mode: true,
            exact_scan: true,
            restart_repair: true,
            proof: ProofKind::ClientIdEcho,
            steer: true,
        }
    }

    /// Claude: none of those; the transcript UUID proves delivery.
    pub const fn claude() -> Capabilities {
        Capabilities {
            agent: AgentKind::Claude,
            replace_latest: false,
            speed_mode: false,
            exact_scan: false,
            restart_repair: false,
            proof: ProofKind::TranscriptUuid,
            steer: true,
        }
    }

    /// An Agent Client Protocol (v1) agent: no replace latest, no speed mode, no exact
    /// scan, no steer, no delivery proof.
    pub const fn acp() -> Capabilities {
        Capabilities {
            agent: AgentKind::Acp,
            replace_latest: false,
            speed_mode: false,
            exact_scan: false,
            restart_repair: false,
            proof: ProofKind::Unprovable,
            steer: false,
        }
    }
}

/// One attempt of a send, history read, stop or take-back. Its answer names it; an
/// answer for an attempt that is no longer current is ignored. Attempts of one machine
/// are unique and increase from a base drawn from the machine's first UUID, so the
/// answers meant for a machine before a restart do not name the new machine's attempts;
/// they are not persisted (a restart asks again for what it needs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AttemptId(pub u64);

impl std::fmt::Display for AttemptId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "attempt-{}", self.0)
    }
}

/// Whether a send starts a run or joins one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SendKind {
    /// Start a turn as run `run`.
    Start {
        /// The new run.
        run: RunId,
    },
    /// Add the message to the running turn of `run`.
    Steer {
        /// The active run.
        run: RunId,
    },
}

/// A look for an operation in the agent's history, for one attempt: what custody asks
/// ([`crate::custody::CustodyEffect::ReadHistory`]) and the host hands the agent
/// (`host_core::AgentCall::ReadHistory`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadHistoryRequest {
    /// The attempt the answer names.
    pub attempt: AttemptId,
    /// The app session it concerns.
    pub session: SessionId,
    /// The operation of the message.
    pub operation_id: OperationId,
    /// What proves delivery in this agent's history (from its capabilities).
    pub proof: ProofKind,
}

/// A stop of a run, for one attempt ([`crate::custody::CustodyEffect::Stop`],
/// `host_core::AgentCall::Stop`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StopRequest {
    /// The attempt the answer names.
    pub attempt: AttemptId,
    /// The app session it concerns.
    pub session: SessionId,
    /// The run it concerns.
    pub run: RunId,
}

/// A take-back of an accepted steer, for one attempt
/// ([`crate::custody::CustodyEffect::TakeBack`], `host_core::AgentCall::TakeBack`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TakeBackRequest {
    /// The attempt the answer names.
    pub attempt: AttemptId,
    /// The app session it concerns.
    pub session: SessionId,
    /// The operation of the message.
    pub operation_id: OperationId,
    /// The accepting run, thread and turn.
    pub acceptance: Acceptance,
}

/// One send attempt handed to an adapter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendRequest {
    /// The attempt its result must name.
    pub attempt: AttemptId,
    /// The session.
    pub session: SessionId,
    /// The operation (Codex sends it as `clientUserMessageId`).
    pub operation_id: OperationId,
    /// The message.
    pub request: MessageRequest,
    /// Start or steer.
    pub kind: SendKind,
    /// Roll back the latest turn first (replace latest).
    pub rollback_before_send: bool,
    /// Send to a fresh thread (the old one is gone).
    pub fresh_thread: bool,
}

/// The six send results (OB-08), plus the replace-latest case of a thread that is gone.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SendResult {
    /// The agent's history holds the message.
    Delivered,
    /// A turn took the message (`turn/start` answered, or a steer was accepted as
    /// pending input); the echo will confirm it.
    Accepted(Acceptance),
    /// The host held the message back on purpose; the next drain tries again.
    Deferred {
        /// Why, in words for the user or the log.
        reason: String,
    },
    /// The run was stopped before the message was confirmed.
    Canceled,
    /// The agent did not take the message (a failure before the hand-off).
    ProvenUnadmitted {
        /// The error text for the user.
        error: String,
    },
    /// The agent may have taken the message (a failure after the hand-off). A result
    /// that says "sending" without an acceptance is this too.
    AdmissionUncertain {
        /// What happened.
        error: String,
    },
    /// Replace latest: the agent no longer knows the thread.
    ThreadGone,
}

/// What a history read after an uncertain send found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HistoryRead {
    /// The operation is in the agent's history.
    Found,
    /// The history was read and does not hold it.
    Missing,
    /// The history could not be read (or the route does not match).
    Unreadable,
}

/// The answer to a stop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopResult {
    /// The run stopped; these accepted steers had not been taken.
    Stopped {
        /// Operations the run dropped.
        untaken: Vec<OperationId>,
    },
    /// The stop failed; the run may still be active.
    Failed {
        /// Why, in words for the user or the log.
        error: String,
    },
    /// The stop attempt itself crashed; it is retried after 250 ms.
    Crashed,
}

/// The answer to taking back an accepted steer (`turn/detachPendingInputForReplay`,
/// Claude's cancel).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TakeBackResult {
    /// Taken out of the run's pending input.
    DetachedForReplay,
    /// Taken out before.
    AlreadyDetachedForReplay,
    /// Not taken back (the agent started it, or the run is gone).
    NotDetached {
        /// Why, in words for the user or the log.
        reason: String,
    },
}

/// A synchronous agent adapter.
pub trait AgentAdapter {
    /// What the agent supports.
    fn capabilities(&self) -> Capabilities;
    /// Hands the message to the agent and returns what happened (the six send results).
    fn send(&mut self, request: &SendRequest) -> SendResult;
    /// Looks for the operation in the agent's saved history.
    fn read_history(&mut self, session: &SessionId, op: &OperationId) -> HistoryRead;
    /// Stops a run.
    fn stop(&mut self, session: &SessionId, run: &RunId) -> StopResult;
    /// Takes back an accepted steer.
    fn take_back(
        &mut self,
        session: &SessionId,
        op: &OperationId,
        acceptance: &Acceptance,
    ) -> TakeBackResult;
    /// True while the agent still works on `run` (a registered Codex turn, a live Claude
    /// host process): the stale reclaim leaves it alone.
    fn vetoes_reclaim(&self, session: &SessionId, run: &RunId) -> bool;
}
