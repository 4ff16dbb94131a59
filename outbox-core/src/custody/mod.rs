//! The custody machine: submit, drain lanes, send results, history reads, runs, stop,
//! interrupt, stop and send now (OB-03 to OB-15).
//!
//! The promise: a message is saved, accepted and confirmed at three separate moments; it
//! is never lost; it is never sent to the agent twice unless the agent confirmed that
//! the first copy was not applied.
//!
//! [`Custody`] owns an [`OutboxStore`] and is sans-IO: it never calls an agent. Each
//! step an agent must take comes out as a [`CustodyEffect`] (send, read history, stop, take
//! back) carrying an [`AttemptId`]; the embedding performs it and feeds the answer back,
//! with the same attempt, through the matching `handle_*` method. Deadlines come out of
//! [`Custody::poll_timeout`] and are driven by [`Custody::handle_timeout`]:
//!
//! | wait | value |
//! |---|---|
//! | send path after the hand-off (then the send is uncertain) | 31 s |
//! | interrupt: poll for the old run to leave the registry | every 25 ms, up to 10 s |
//! | a stop caller waits for the result (then "still settling") | 5 s |
//! | a successful stop is kept for repeated requests | 60 s |
//! | a crashed stop attempt is retried | after 250 ms |
//! | a change the store refused is tried again | after 1 s |
//!
//! The 30-second reply wait of a Codex `turn/start` belongs to the adapter: when it
//! passes, the adapter answers [`SendResult::AdmissionUncertain`].
//!
//! # State ownership
//!
//! Custody reads a session's outbox from the store once (at [`Custody::start_up`] or on
//! first touch) and keeps it in memory with the indexes a drain pass needs, together
//! with the ledger rows of the operations in it. Every change is written to the store
//! first and applied to memory only when the store took it, so memory always equals the
//! store and a drain pass reads nothing: its cost does not grow with entries that sit in
//! the queue. Whoever changes the store behind custody's back calls [`Custody::store`],
//! which forgets everything held in memory.
//!
//! A message that finds its session idle costs three commits on a durable store: the
//! submit saves it and records the hand-off in one transaction
//! ([`OutboxStore::claim_sending`]), the turn's acceptance is the second, and the sent
//! proof (ledger sent, entry removed) the third. One that waits in the queue first pays
//! a fourth: its hand-off is a commit of its own.
//!
//! # Failures are state
//!
//! No store result is dropped. A call that changes the outbox for a caller (submit, the
//! composer actions) returns the store's error. Anything else (a drain pass, an agent's
//! answer, a timer) that meets a failed write:
//!
//! - leaves the entry as the store holds it and forgets the session's memory (the next
//!   touch reads the store again; a write whose outcome is unknown is never believed);
//! - emits [`CustodyEffect::StoreFailed`] naming the session and the operation, so the user
//!   sees that the message is stuck and why ([`Custody::store_failure`] keeps it until
//!   the session's retries succeed and no work is kept for it);
//! - keeps what it was doing (the agent's answer, the wake-up) and does it again at the
//!   deadline [`STORE_RETRY`] later, from [`Custody::poll_timeout`]. Every step is
//!   idempotent (the ledger lattice, compare-and-set entry writes), so doing it again is
//!   safe. The lane stays busy meanwhile: nothing else of that lane is sent until the
//!   answer is recorded (or a newer attempt of the same message replaces it, which
//!   frees the lane);
//! - repairs the session at that deadline, as a restart does: a write reported as
//!   failed may have been made (a lost commit reply), so the session is read again, and
//!   every entry found out with nothing under way for it as it is now (no send in
//!   flight, read or take-back pending, or answer kept for a retry that was taken for
//!   the entry in this state) is confirmed from the agent's history, never sent again
//!   blindly; a detached stop and send now whose run is gone goes on to its own turn,
//!   and a reopen check whose read is not pending is asked again. The repair runs after
//!   the answers due at the same moment, and what a run that still works accepted waits
//!   for that run's end. Every write failure, a caller's included, schedules it.
//!
//! A failed hand-off write is the seed's "failed sending write": nothing is sent, and the
//! entry is held with [`SENDING_WRITE_FAILED_TEXT`] (when even that cannot be written,
//! the wake-up is retried). Ledger writes outside a transaction with the entry fall back
//! to the 256-record memory ledger (OB-07), and say so with [`CustodyEffect::StoreFailed`].
//!
//! # Attempts
//!
//! Every send, history read, stop and take-back is an attempt with its own
//! [`AttemptId`], and only the answer of the current attempt is applied. An answer for an
//! attempt that passed its deadline, was answered already, or was replaced by a newer
//! one is ignored and counted ([`CustodyStats::stale_answers`]): a late `Accepted` of an
//! attempt whose history read said "missing" never lands on the user's next send, and a
//! duplicated `Deferred` or `ThreadGone` never sends again.
//!
//! # Choices where the seed is silent
//!
//! - A queued entry with auto-drain off (held, failed, canceled) does not block the
//!   entries behind it; it waits for the user while the queue moves on.
//! - Resubmitting a delivered operation with the same fingerprint returns the original
//!   receipt (marked replayed) instead of a conflict, so a client whose receipt was lost
//!   never makes a second operation for a message that already arrived. Any other
//!   removed operation is a conflict.
//! - A submit that names a queue ID already queued under another operation is an edit:
//!   the entry keeps its queue ID and place and takes the new operation.
//! - "Sending" without an acceptance is reported by adapters as
//!   [`SendResult::AdmissionUncertain`].
//! - An operation ID is one message in its whole scope: submitting it under another
//!   alias of the same base session is a conflict.
//! - Before a send, a ledger row that a turn accepted and nothing settled since
//!   (status `sending` with an acceptance) means the agent may hold the message: the
//!   entry is confirmed from history instead of being sent again.
//! - The seed says both that a steer reply proving the guidance was not admitted
//!   "returns the operation to automatic queue custody" and that "only a deferred send
//!   goes back to the queue with auto-drain on". Custody follows the second: a steer
//!   proven unadmitted is held with its error and auto-drain off like any other send,
//!   because sending again without the user is the one thing custody must never guess.
//! - A run that fails to start (the registry's two texts) is told to the embedding as
//!   [`CustodyEffect::RunRefused`]; the entry stays queued and drains when the run ends.
//! - A send answered canceled returns "with autoDrain off and no error", as the seed
//!   says, and shows the seed's meaning of canceled as its hold reason
//!   ([`crate::entry::CANCELED_TEXT`]), so no held entry waits without a reason.
//! - The stop's text ([`crate::entry::STOPPED_BEFORE_DELIVERY_TEXT`]) is given to every
//!   message a run accepted and did not take before it ended, whether a stop ended it or
//!   not: the agent said so, or the history read after the run does not hold it. A
//!   steer whose `Accepted` arrives after its run ended is settled the same way, from
//!   history.
//! - A history read does not see a running turn's pending input. While the run a
//!   message waits in (the run that accepted it, or the run a steer was sent to) works,
//!   "missing" or "unreadable" proves nothing: the entry stays out, and the end of that
//!   run settles it. A run works while the registry holds it, or, when the registry
//!   does not (a run from before a restart), while the agent reports its activity
//!   ([`Custody::touch_run`]) and has not ended it; one silent for
//!   [`crate::runs::STALE_RUN_AFTER`] counts as gone, and what it accepted is confirmed
//!   from history.
//! - Stop and send now applies only while the turn that accepted the steer runs
//!   ([`ActionError::NotAnAcceptedSteer`] otherwise). When that run ends before the
//!   take-back is answered, the `handoff` goes on without it: a steer the run did not
//!   take (the agent said so, or its history does not hold it) is dedicated to its own
//!   turn, with the acceptance revoked.
//! - An answer matches its attempt's snapshot of the entry in everything but the
//!   position: a submit that renumbers the queue moves the entries that are out, and
//!   their answers still apply.
//! - The reopen check of a canceled operation that a turn accepted shows
//!   [`crate::entry::REOPEN_CHECK_TEXT`] while it reads history, and is asked again
//!   when its read is lost with the host.
//!
//! # Drive loop
//!
//! ```
//! use outbox_core::adapter::{Capabilities, SendResult};
//! use outbox_core::custody::{Custody, CustodyEffect, SessionInfo, SubmitRequest};
//! use outbox_core::entry::{Controls, MessageRequest};
//! use outbox_core::ids::{OperationId, QueueId, SessionId};
//! use outbox_core::store::memory::MemoryOutboxStore;
//! use timeline_core::time::Millis;
//!
//! let mut n = 0;
//! let mut custody = Custody::new(MemoryOutboxStore::new(), Box::new(move || { n += 1; format!("uuid-{n}") }));
//! let s = SessionId::new("s1").unwrap();
//! custody.set_session(&s, SessionInfo::new(Capabilities::codex()));
//! // 1. Take custody: the receipt means the message is saved.
//! let receipt = custody.submit(SubmitRequest {
//!     session: s.clone(),
//!     queue_id: QueueId::new("q1").unwrap(),
//!     operation_id: OperationId::new("op-1").unwrap(),
//!     request: MessageRequest::text("npm test", "composer", Millis(0)),
//!     controls: Controls::automatic(),
//! }, Millis(0)).unwrap();
//! assert!(!receipt.replayed);
//! // 2. Carry out the effects; answer each with its attempt.
//! let Some(CustodyEffect::Send(send)) = custody.poll_effect() else { panic!() };
//! custody.handle_send_result(send.attempt, SendResult::Delivered, Millis(5));
//! // 3. Wake up at `poll_timeout()` and call `handle_timeout(now)`.
//! assert_eq!(custody.poll_timeout(), None);
//! assert!(custody.entries(&s).unwrap().is_empty(), "confirmed, then removed");
//! ```

use crate::adapter::{ReadHistoryRequest, StopRequest, TakeBackRequest};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use timeline_core::time::Millis;

pub use crate::adapter::AttemptId;
use crate::adapter::{Capabilities, SendRequest, SendResult};
use crate::entry::{AccessLevel, Controls, MessageRequest, StoredEntry};
use crate::ids::{OperationId, QueueId, RunId, ScopeId, SessionId};
use crate::ledger::MemoryFallback;
use crate::runs::{RunError, RunRegistry};
use crate::store::{OutboxError, OutboxStore, RouteDelivery};

mod actions;
mod drain;
mod drive;
mod lanes;
mod ledger;
mod mirror;
mod results;
mod run_life;
mod shared;
mod startup;
mod state;
mod stop;
pub(crate) mod submit;
mod work;

use lanes::{
    Asked, InFlight, Interrupt, LaneKind, PendingRead, PendingTakeBack, ReadPurpose, StopWorker,
};
use mirror::Mirror;
use run_life::foreign_stale_at;
pub use submit::validate_controls;
use work::Work;

/// The send path stops waiting this long after the hand-off; the send is uncertain.
pub const SEND_PATH_DEADLINE: Millis = Millis(31_000);
/// How often an interrupt checks that the old run left the registry.
pub const INTERRUPT_POLL: Millis = Millis(25);
/// How long an interrupt waits for the old run to settle.
pub const INTERRUPT_WAIT: Millis = Millis(10_000);
/// How long a stop caller waits before "still settling".
pub const STOP_CALLER_WAIT: Millis = Millis(5_000);
/// How long a successful stop answers repeated requests.
pub const STOP_SUCCESS_CACHE: Millis = Millis(60_000);
/// When a crashed stop attempt is retried.
pub const STOP_RETRY: Millis = Millis(250);
/// The hold text when the model changed between writing and an interrupt or hand-off.
pub const MODEL_CHANGED_TEXT: &str =
    "The model changed since this message was written. Review and send it again.";
/// A change the store refused is tried again this long after.
pub const STORE_RETRY: Millis = Millis(1_000);
/// The error text when the ledger could not record the sending attempt.
pub const SENDING_WRITE_FAILED_TEXT: &str =
    "The desktop could not record this send attempt, so nothing was sent. Send it again.";

/// What the host knows about a session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionInfo {
    /// What its agent supports.
    pub capabilities: Capabilities,
    /// The model it runs now.
    pub model: Option<String>,
    /// Its access level now; `None` when it cannot be read.
    pub access: Option<AccessLevel>,
    /// Its title.
    pub title: String,
    /// The directory its agent works in, when the embedder knows it (listed to clients,
    /// and what an ACP client's `session/list` filters on).
    pub cwd: Option<String>,
}

impl SessionInfo {
    /// A session of an agent with `capabilities`, no model check, workspace-write access.
    pub fn new(capabilities: Capabilities) -> SessionInfo {
        SessionInfo {
            capabilities,
            model: None,
            access: Some(AccessLevel::WorkspaceWrite),
            title: String::new(),
            cwd: None,
        }
    }
}

/// A submit (OB-03, OB-04).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubmitRequest {
    /// The session that owns the outbox.
    pub session: SessionId,
    /// The visible entry.
    pub queue_id: QueueId,
    /// The operation.
    pub operation_id: OperationId,
    /// The message.
    pub request: MessageRequest,
    /// The controls.
    pub controls: Controls,
}

/// A submit that breaks the control rules (OB-04). No receipt exists.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ValidationError {
    /// `enqueue` with a send mode other than `queue`.
    #[error("intent enqueue requires sendMode queue")]
    EnqueueNeedsQueue,
    /// `replace-latest` with a send mode other than `interrupt-running`.
    #[error("intent replace-latest requires sendMode interrupt-running")]
    ReplaceLatestNeedsInterrupt,
    /// `steer-running` without `expectedActiveRunId`.
    #[error("sendMode steer-running requires expectedActiveRunId")]
    SteerNeedsRun,
    /// `expectedActiveRunId` with another send mode.
    #[error("expectedActiveRunId is only allowed with sendMode steer-running")]
    RunIdOnlyForSteer,
    /// `rollbackBeforeSend` without `replace-latest`, or the reverse.
    #[error("rollbackBeforeSend goes with intent replace-latest and only with it")]
    RollbackNeedsReplaceLatest,
    /// A control the session's agent does not support.
    #[error("{0} is not available for this agent")]
    Unsupported(&'static str),
    /// The session is not known.
    #[error("unknown session")]
    UnknownSession,
    /// A client tried to create a session message.
    #[error("a session-message operation can only be sent from the queue")]
    ClientSessionMessage,
}

/// Why a submit conflicts with what custody holds (OB-03).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConflictKind {
    /// The operation was claimed with a different request fingerprint.
    DifferentRequest,
    /// The operation's entry was removed; it can never be created again.
    Removed,
    /// A steer for another run than the one its operation was submitted for.
    SteerRetargeted,
}

/// A submit failure.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitError {
    /// Invalid params.
    #[error("invalid params: {0}")]
    Invalid(#[from] ValidationError),
    /// Conflict: ask for a new operation ID.
    #[error(
        "This operation ID was already used for another message. Send it with a new operationId."
    )]
    Conflict(ConflictKind),
    /// The store failed; retry.
    #[error(transparent)]
    Store(#[from] OutboxError),
}

impl SubmitError {
    /// The stable `errorCode` a client receives.
    pub fn error_code(&self) -> &'static str {
        match self {
            SubmitError::Invalid(ValidationError::UnknownSession) => "UNKNOWN_SESSION",
            SubmitError::Invalid(ValidationError::Unsupported(_)) => "UNSUPPORTED_CONTROL",
            SubmitError::Invalid(_) => "INVALID_PARAMS",
            SubmitError::Conflict(ConflictKind::DifferentRequest) => "OPERATION_CONFLICT",
            SubmitError::Conflict(ConflictKind::Removed) => "OPERATION_REMOVED",
            SubmitError::Conflict(ConflictKind::SteerRetargeted) => "STEER_RETARGETED",
            SubmitError::Store(OutboxError::LeaseLost { .. }) => "SESSION_ELSEWHERE",
            SubmitError::Store(_) => "STORE_UNAVAILABLE",
        }
    }
}

/// A composer action that cannot be done.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ActionError {
    /// No such entry.
    #[error("no such outbox entry")]
    NotFound,
    /// The entry is sending: it stays until the ledger or the history settles it.
    #[error("the message is being sent and cannot be changed now")]
    Blocked,
    /// Stop and send now needs an accepted steer.
    #[error("only a message a running turn accepted can be stopped and sent now")]
    NotAnAcceptedSteer,
    /// The model changed.
    #[error("{}", MODEL_CHANGED_TEXT)]
    ModelChanged,
    /// A steer custody could not confirm was sent to a run that still works: the run may
    /// yet take it from its pending input, which no history shows, so sending it again
    /// now could give it to the agent twice. It can be sent once the run has ended, or
    /// stopped (OB-08).
    #[error("{}", crate::entry::RUN_MAY_STILL_TAKE_IT_TEXT)]
    RunMayStillTakeIt,
    /// The new operation ID was used before.
    #[error(
        "This operation ID was already used for another message. Send it with a new operationId."
    )]
    OperationTaken,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] OutboxError),
}

impl ActionError {
    /// The stable `errorCode` a client receives.
    pub fn error_code(&self) -> &'static str {
        match self {
            ActionError::NotFound => "ENTRY_NOT_FOUND",
            ActionError::Blocked => "ENTRY_BLOCKED",
            ActionError::NotAnAcceptedSteer => "NOT_AN_ACCEPTED_STEER",
            ActionError::ModelChanged => "MODEL_CHANGED",
            ActionError::RunMayStillTakeIt => "RUN_MAY_STILL_TAKE_IT",
            ActionError::OperationTaken => "OPERATION_TAKEN",
            ActionError::Store(OutboxError::LeaseLost { .. }) => "SESSION_ELSEWHERE",
            ActionError::Store(_) => "STORE_UNAVAILABLE",
        }
    }
}

/// Who waits for a stop.
pub type CallerId = u64;

/// The answer a stop caller gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopAnswer {
    /// The run stopped.
    Stopped,
    /// No result within 5 s; the worker goes on and keeps new runs blocked.
    StillSettling,
    /// The stop failed.
    Failed(String),
}

/// What the machine wants done outside.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CustodyEffect {
    /// Hand the message to the agent; answer with [`Custody::handle_send_result`] and
    /// the request's attempt.
    Send(SendRequest),
    /// Look for the operation in the agent's history; answer with
    /// [`Custody::handle_history_read`].
    ReadHistory(ReadHistoryRequest),
    /// Stop the run; answer with [`Custody::handle_stop_result`].
    Stop(StopRequest),
    /// Take back an accepted steer; answer with [`Custody::handle_take_back`].
    TakeBack(TakeBackRequest),
    /// Tell a stop caller the result.
    StopAnswer {
        /// The caller.
        caller: CallerId,
        /// The answer.
        answer: StopAnswer,
    },
    /// Replace latest found the thread gone: delete the session's thread link.
    ClearThreadLink {
        /// The app session it concerns.
        session: SessionId,
    },
    /// A session message's delivery changed: publish the sender's row again.
    RouteDeliveryChanged {
        /// The message.
        operation_id: OperationId,
        /// The sender's session.
        sender_session: SessionId,
        /// The sender's tool call: its row shows the delivery.
        sender_call_id: crate::ids::CallId,
        /// The new delivery.
        delivery: RouteDelivery,
    },
    /// Take-back refused: the entry stays with the run.
    TakeBackRefused {
        /// The app session it concerns.
        session: SessionId,
        /// The operation of the message.
        operation_id: OperationId,
        /// Why, in words for the user or the log.
        reason: String,
    },
    /// The run registry refused to start a run for the queue's head; the entry stays
    /// queued and drains when the registry allows. The error's text is the seed's.
    RunRefused {
        /// The app session it concerns.
        session: SessionId,
        /// The operation that would have started the run.
        operation_id: OperationId,
        /// Why ([`crate::entry::RUN_IN_PROGRESS_TEXT`] or
        /// [`crate::entry::CANCELLATION_PENDING_TEXT`]).
        error: RunError,
    },
    /// The store refused a change; see "Failures are state" in the module docs.
    StoreFailed(StoreFailure),
    /// Custody let a session scope go (see "Several hosts" in the module docs): its
    /// lease was lost or [`Custody::release_scope`] was called. Nothing of the scope is
    /// kept in memory and no work of it waits; tell its clients where it is served now.
    ScopeReleased {
        /// The base session of the scope.
        session: SessionId,
        /// Why, in words for the user or the log.
        reason: String,
    },
}

/// A store failure custody met outside a caller's request, as the user sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreFailure {
    /// The session whose outbox it concerns.
    pub session: SessionId,
    /// The operation it concerns, when one.
    pub operation_id: Option<OperationId>,
    /// What the store said.
    pub error: OutboxError,
    /// When custody tries again; `None` when the memory ledger took the record instead.
    pub retry_at: Option<Millis>,
}

/// Counters for diagnostics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CustodyStats {
    /// Answers ignored because their attempt was not the current one.
    pub stale_answers: u64,
    /// Store failures met outside a caller's request.
    pub store_failures: u64,
    /// Whole-outbox reads of the store (one per session load).
    pub outbox_loads: u64,
}

/// An operation of a session.
type SessionOp = (SessionId, OperationId);

/// The custody machine. See the module docs.
pub struct Custody<S> {
    /// The store and what custody keeps of it in memory.
    pub(crate) mirror: Mirror<S>,
    fallback: MemoryFallback,
    runs: RunRegistry,
    sessions: BTreeMap<SessionId, SessionInfo>,
    /// What custody asked of the agent and has not had answered.
    asked: Asked,
    /// Operations whose rollback the agent did (OB-11), the last [`ROLLED_BACK_KEPT`]:
    /// no attempt rolls back again, also while the store has not taken the entry
    /// without its `rollback_before_send` yet.
    rolled_back: (BTreeSet<SessionOp>, VecDeque<SessionOp>),
    vetoes: BTreeSet<(SessionId, RunId)>,
    retries: Vec<(Millis, Work)>,
    failures: BTreeMap<SessionId, StoreFailure>,
    /// Runs the agent reports working that the registry does not hold (a run from
    /// before a restart, or one the registry let go), with their latest activity. What
    /// they accepted waits for their end, as with a registered run.
    foreign_runs: BTreeMap<(SessionId, RunId), Millis>,
    /// The runs written through to a registry several hosts share.
    shared: shared::SharedMirror,
    stats: CustodyStats,
    uuids: Box<dyn FnMut() -> String + Send>,
    effects: VecDeque<CustodyEffect>,
    /// The base sessions of the scopes custody works, when it works only those it was
    /// granted ([`Custody::grant_only`]); `None`: every scope.
    granted: Option<BTreeSet<ScopeId>>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for Custody<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Custody")
            .field("store", &self.mirror.store)
            .field("runs", &self.runs)
            .field(
                "in_flight",
                &self.asked.in_flight.keys().collect::<Vec<_>>(),
            )
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<S: OutboxStore> Custody<S> {
    /// A machine over `store`. `uuids` hands out fresh UUIDs (run IDs, session-message
    /// IDs, chain IDs); the machine draws no randomness itself.
    pub fn new(store: S, mut uuids: Box<dyn FnMut() -> String + Send>) -> Self {
        // Attempts of this machine are numbered from a base drawn from its first UUID,
        // so the answer to an attempt of a machine before a restart never names one of
        // this machine's attempts (2^32 attempts per machine; two machines share a base
        // with probability 2^-32).
        let base = attempt_base(&uuids());
        Custody {
            mirror: Mirror::new(store),
            fallback: MemoryFallback::new(),
            runs: RunRegistry::new(),
            sessions: BTreeMap::new(),
            asked: Asked::new(base),
            rolled_back: (BTreeSet::new(), VecDeque::new()),
            vetoes: BTreeSet::new(),
            retries: Vec::new(),
            failures: BTreeMap::new(),
            foreign_runs: BTreeMap::new(),
            shared: shared::SharedMirror::default(),
            stats: CustodyStats::default(),
            uuids,
            effects: VecDeque::new(),
            granted: None,
        }
    }

    /// From now on custody works only the session scopes granted with
    /// [`Custody::grant_scope`], for a host among several on one database that serves
    /// only the scopes whose lease it holds. Memory of every scope is dropped; a scope
    /// not granted reads as [`OutboxError::LeaseLost`] and nothing of it is written.
    pub fn grant_only(&mut self) {
        self.mirror.forget_all();
        self.granted = Some(BTreeSet::new());
    }

    /// Whether custody works the scope of `session` now.
    pub fn scope_granted(&self, session: &SessionId) -> bool {
        self.granted
            .as_ref()
            .is_none_or(|g| g.contains(&ScopeId::of(session)))
    }

    /// Takes up the scope of `session` (its lease was acquired), or reads it again when
    /// held already (another host wrote into it: a session message). What memory held of
    /// the scope is dropped and each of its saved outboxes is read and checked as at a
    /// restart: an entry found out with nothing under way is confirmed from the agent's
    /// history (a host that died mid-send), never sent again blindly; then both lanes
    /// drain. Without [`Custody::grant_only`] every scope is worked and this only reads
    /// the scope again.
    pub fn grant_scope(&mut self, session: &SessionId, now: Millis) {
        let scope = ScopeId::of(session);
        if let Some(granted) = &mut self.granted {
            granted.insert(scope.clone());
        }
        self.mirror.forget_scope(&scope);
        let members: BTreeSet<SessionId> = match self.mirror.outbox_sessions() {
            Ok(saved) => saved
                .iter()
                .filter(|s| scope.contains(s))
                .cloned()
                .collect(),
            Err(error) => {
                self.retry_later(Work::Repair(session.clone()), error, now);
                return;
            }
        };
        let registered = self.sessions.keys().filter(|s| scope.contains(s)).cloned();
        let members: BTreeSet<SessionId> = members.into_iter().chain(registered).collect();
        // Runs another host left in the shared registry hold the scope before anything
        // of it drains.
        self.adopt_shared(scope.base(), now);
        for member in members {
            self.run_work(Work::Repair(member), now);
        }
    }

    /// Lets the scope of `session` go (its lease was lost, or the host hands it over):
    /// memory of the scope, its runs, attempts, reads, stops and retries are dropped, and
    /// [`CustodyEffect::ScopeReleased`] says so. Answers that still come for its attempts are
    /// ignored. False when the scope was not granted (nothing is done then). Without
    /// [`Custody::grant_only`] this only drops memory and work of the scope, which the
    /// next touch reads again.
    pub fn release_scope(&mut self, session: &SessionId, reason: &str) -> bool {
        let scope = ScopeId::of(session);
        if let Some(granted) = &mut self.granted {
            if !granted.remove(&scope) {
                return false;
            }
        }
        let ours = |s: &SessionId| scope.contains(s);
        self.mirror.forget_scope(&scope);
        self.asked.lanes.retain(|s, _| !ours(s));
        self.asked
            .in_flight
            .retain(|_, f| !ours(&f.request.session));
        self.asked.reads.retain(|_, p| !ours(&p.session));
        self.asked.interrupts.retain(|s, _| !ours(s));
        self.asked.interrupt_spent.retain(|(s, _)| !ours(s));
        self.asked.stops.retain(|(s, _), _| !ours(s));
        self.asked.stop_cache.retain(|(s, _), _| !ours(s));
        self.asked.take_backs.retain(|_, t| !ours(&t.session));
        self.vetoes.retain(|(s, _)| !ours(s));
        self.retries.retain(|(_, r)| !ours(r.session()));
        self.failures.retain(|s, _| !ours(s));
        self.foreign_runs.retain(|(s, _), _| !ours(s));
        let base = scope.into_base();
        self.runs.release_scope(&base);
        self.shared.forget_scope(&base);
        self.effects.push_back(CustodyEffect::ScopeReleased {
            session: base,
            reason: reason.to_owned(),
        });
        true
    }

    /// A store error that says the scope's lease is lost lets the scope go; true when it
    /// did (the error must not be retried).
    pub(crate) fn lease_lost(&mut self, error: &OutboxError) -> bool {
        let OutboxError::LeaseLost { session, message } = error else {
            return false;
        };
        let session = session.clone();
        let message = message.clone();
        self.release_scope(&session, &message);
        true
    }

    /// The store. Custody forgets what it holds in memory, since the caller may change
    /// the store; the next touch of a session reads it again.
    pub fn store(&mut self) -> &mut S {
        self.mirror.forget_all();
        &mut self.mirror.store
    }

    /// Gives the store back (a restart drops every in-memory state).
    pub fn into_store(self) -> S {
        self.mirror.store
    }

    /// The run registry.
    pub fn runs(&self) -> &RunRegistry {
        &self.runs
    }

    /// The ledger memory fallback.
    pub fn fallback(&self) -> &MemoryFallback {
        &self.fallback
    }

    /// Counters for diagnostics.
    pub fn stats(&self) -> CustodyStats {
        self.stats
    }

    /// The store failure that holds `session` up now: it stays until the session's
    /// retries succeed and no work waits for a retry any more.
    pub fn store_failure(&self, session: &SessionId) -> Option<&StoreFailure> {
        self.failures.get(session)
    }

    /// Registers or updates what the host knows about a session.
    pub fn set_session(&mut self, session: &SessionId, info: SessionInfo) {
        self.sessions.insert(session.clone(), info);
    }

    /// What the host knows about a session.
    pub fn session(&self, session: &SessionId) -> Option<&SessionInfo> {
        self.sessions.get(session)
    }

    /// Sets whether the adapter vetoes the stale reclaim of `run`.
    pub fn set_veto(&mut self, session: &SessionId, run: &RunId, veto: bool) {
        if veto {
            self.vetoes.insert((session.clone(), run.clone()));
        } else {
            self.vetoes.remove(&(session.clone(), run.clone()));
        }
    }

    pub(crate) fn next_uuid(&mut self) -> String {
        (self.uuids)()
    }

    /// A fresh UUID from the generator the machine was given, for an embedder that
    /// names its own things from the same source (the host names its session logs).
    pub fn fresh_uuid(&mut self) -> String {
        self.next_uuid()
    }

    fn next_attempt(&mut self) -> AttemptId {
        self.asked.next_attempt = self.asked.next_attempt.wrapping_add(1);
        AttemptId(self.asked.next_attempt)
    }

    /// The session's outbox in queue order, blocked entries included.
    pub fn entries(&mut self, session: &SessionId) -> Result<Vec<StoredEntry>, OutboxError> {
        Ok(self.state(session)?.stored())
    }

    /// Next effect to carry out.
    #[must_use]
    pub fn poll_effect(&mut self) -> Option<CustodyEffect> {
        self.effects.pop_front()
    }

    // ----- timers ----------------------------------------------------------------------

    /// The earliest deadline.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Millis> {
        let sends = self.asked.in_flight.values().map(|f| f.deadline);
        let interrupts = self.asked.interrupts.values().map(|i| i.next_poll);
        let callers = self
            .asked
            .stops
            .values()
            .flat_map(|w| w.callers.iter().map(|(_, d)| *d));
        let stop_retries = self.asked.stops.values().filter_map(|w| w.retry_at);
        let retries = self.retries.iter().map(|(at, _)| *at);
        let foreign = self
            .foreign_runs
            .values()
            .map(|last| foreign_stale_at(*last));
        sends
            .chain(interrupts)
            .chain(callers)
            .chain(stop_retries)
            .chain(retries)
            .chain(foreign)
            .chain(self.shared.deadlines())
            .min()
    }

    /// Handles every deadline that passed. Safe to call early or twice.
    pub fn handle_timeout(&mut self, now: Millis) {
        let expired: Vec<AttemptId> = self
            .asked
            .in_flight
            .iter()
            .filter(|(_, f)| f.deadline <= now)
            .map(|(k, _)| *k)
            .collect();
        for attempt in expired {
            if let Some(f) = self.asked.in_flight.remove(&attempt) {
                let error = "the send path stopped waiting 31 s after the hand-off".to_owned();
                self.run_work(
                    Work::Send(Box::new(f), SendResult::AdmissionUncertain { error }),
                    now,
                );
            }
        }
        self.poll_interrupts(now);
        self.poll_stops(now);
        self.shared_timeout(now);
        // A run the agent stopped reporting is gone: what it accepted is confirmed from
        // history, as in the repair after a failed write.
        let gone: Vec<(SessionId, RunId)> = self
            .foreign_runs
            .iter()
            .filter(|(_, last)| foreign_stale_at(**last) <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for key in gone {
            self.foreign_runs.remove(&key);
            self.run_work(Work::Repair(key.0), now);
        }
        self.asked.stop_cache.retain(|_, until| now < *until);
        self.run_due_work(now);
    }
}

/// The first attempt number of a machine whose first UUID is `uuid`: its FNV-1a hash in
/// the upper 32 bits.
fn attempt_base(uuid: &str) -> u64 {
    let hash = uuid.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    (hash >> 32) << 32
}
