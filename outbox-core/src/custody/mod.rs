//! The custody machine: submit, drain lanes, send results, history reads, runs, stop,
//! interrupt, stop and send now (OB-03 to OB-15).
//!
//! The promise: a message is saved, accepted and confirmed at three separate moments; it
//! is never lost; it is never sent to the agent twice unless the agent confirmed that
//! the first copy was not applied.
//!
//! [`Custody`] owns an [`OutboxStore`] and is sans-IO: it never calls an agent. Each
//! step an agent must take comes out as an [`Effect`] (send, read history, stop, take
//! back); the embedding performs it and feeds the answer back through the matching
//! `handle_*` method. Deadlines come out of [`Custody::poll_timeout`] and are driven by
//! [`Custody::handle_timeout`]:
//!
//! | wait | value |
//! |---|---|
//! | send path after the hand-off (then the send is uncertain) | 31 s |
//! | interrupt: poll for the old run to leave the registry | every 25 ms, up to 10 s |
//! | a stop caller waits for the result (then "still settling") | 5 s |
//! | a successful stop is kept for repeated requests | 60 s |
//! | a crashed stop attempt is retried | after 250 ms |
//!
//! The 30-second reply wait of a Codex `turn/start` belongs to the adapter: when it
//! passes, the adapter answers [`SendResult::AdmissionUncertain`].
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
//!
//! # Drive loop
//!
//! ```
//! use outbox_core::adapter::{Capabilities, SendResult};
//! use outbox_core::custody::{Custody, Effect, SessionInfo, SubmitRequest};
//! use outbox_core::entry::{Controls, MessageRequest};
//! use outbox_core::ids::{OperationId, QueueId, SessionId};
//! use outbox_core::store::memory::MemoryOutboxStore;
//! use timeline_core::time::Millis;
//!
//! let mut n = 0;
//! let mut custody = Custody::new(MemoryOutboxStore::new(), Box::new(move || { n += 1; format!("uuid-{n}") }));
//! let s = SessionId::new("s1").unwrap();
//! custody.set_session(&s, SessionInfo::new(Capabilities::codex()));
//! let receipt = custody.submit(SubmitRequest {
//!     session: s.clone(),
//!     queue_id: QueueId::new("q1").unwrap(),
//!     operation_id: OperationId::new("op-1").unwrap(),
//!     request: MessageRequest::text("npm test", "composer", Millis(0)),
//!     controls: Controls::automatic(),
//! }, Millis(0)).unwrap();
//! assert!(!receipt.replayed);
//! let Some(Effect::Send(send)) = custody.poll_effect() else { panic!() };
//! custody.handle_send_result(&s, &send.operation_id, SendResult::Delivered, Millis(5));
//! assert!(custody.entries(&s).unwrap().is_empty(), "confirmed, then removed");
//! ```

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use timeline_core::time::Millis;

use crate::adapter::{
    AgentAdapter, Capabilities, DetachResult, HistoryRead, SendKind, SendRequest, SendResult,
    StopResult,
};
use crate::entry::{
    Acceptance, AccessLevel, Controls, EntryStatus, Handoff, HandoffPhase, Intent, MessageRequest,
    OutboxEntry, Receipt, SendMode, StoredEntry, STOPPED_BEFORE_DELIVERY_TEXT, UNCONFIRMED_TEXT,
};
use crate::fingerprint::{admission_input_digest, request_fingerprint};
use crate::ids::{base_session, OperationId, QueueId, RunId, SessionId};
use crate::ledger::{reopen, transition, LedgerRecord, LedgerStatus, MemoryFallback, Transition};
use crate::runs::RunRegistry;
use crate::store::{Claim, OutboxStore, RouteDelivery, StoreError};

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
/// The error text when the ledger could not record the sending attempt.
pub const SENDING_WRITE_FAILED_TEXT: &str =
    "The desktop could not record this send attempt, so nothing was sent. Send it again.";

const POSITION_STEP: i64 = 1 << 20;

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
}

impl SessionInfo {
    /// A session of an agent with `capabilities`, no model check, workspace-write access.
    pub fn new(capabilities: Capabilities) -> SessionInfo {
        SessionInfo {
            capabilities,
            model: None,
            access: Some(AccessLevel::WorkspaceWrite),
            title: String::new(),
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
    Store(#[from] StoreError),
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
    /// The new operation ID was used before.
    #[error(
        "This operation ID was already used for another message. Send it with a new operationId."
    )]
    OperationTaken,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
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
pub enum Effect {
    /// Hand the message to the agent; answer with [`Custody::handle_send_result`].
    Send(SendRequest),
    /// Look for the operation in the agent's history; answer with
    /// [`Custody::handle_history_read`].
    ReadHistory {
        /// Session.
        session: SessionId,
        /// Operation.
        operation_id: OperationId,
    },
    /// Stop the run; answer with [`Custody::handle_stop_result`].
    StopRun {
        /// Session.
        session: SessionId,
        /// Run.
        run: RunId,
    },
    /// Take back an accepted steer; answer with [`Custody::handle_take_back`].
    TakeBack {
        /// Session.
        session: SessionId,
        /// Operation.
        operation_id: OperationId,
        /// The accepting run, thread and turn.
        acceptance: Acceptance,
    },
    /// Tell a stop caller the result.
    StopAnswer {
        /// The caller.
        caller: CallerId,
        /// The answer.
        answer: StopAnswer,
    },
    /// Replace latest found the thread gone: delete the session's thread link.
    ClearThreadLink {
        /// Session.
        session: SessionId,
    },
    /// A session message's delivery changed: publish the sender's row again.
    RouteDeliveryChanged {
        /// The message.
        operation_id: OperationId,
        /// The sender's session.
        sender_session: SessionId,
        /// The new delivery.
        delivery: RouteDelivery,
    },
    /// Take-back refused: the entry stays with the run.
    HandoffRefused {
        /// Session.
        session: SessionId,
        /// Operation.
        operation_id: OperationId,
        /// Why.
        reason: String,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LaneKind {
    Normal,
    Steer,
}

#[derive(Clone, Debug, Default)]
struct Lane {
    busy: bool,
    follow_up: bool,
}

#[derive(Clone, Debug, Default)]
struct Lanes {
    normal: Lane,
    steer: Lane,
}

impl Lanes {
    fn get(&mut self, kind: LaneKind) -> &mut Lane {
        match kind {
            LaneKind::Normal => &mut self.normal,
            LaneKind::Steer => &mut self.steer,
        }
    }
}

#[derive(Clone, Debug)]
struct InFlight {
    snapshot: OutboxEntry,
    lane: LaneKind,
    deadline: Millis,
    request: SendRequest,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReadPurpose {
    /// After an uncertain send, a run end, or at start-up.
    Confirm,
    /// Before reopening a canceled operation that had an acceptance.
    Reopen,
}

#[derive(Clone, Debug)]
struct PendingRead {
    purpose: ReadPurpose,
    snapshot: OutboxEntry,
}

#[derive(Clone, Debug)]
struct Interrupt {
    op: OperationId,
    old_run: RunId,
    deadline: Millis,
    next_poll: Millis,
}

#[derive(Clone, Debug)]
struct StopWorker {
    callers: Vec<(CallerId, Millis)>,
    retry_at: Option<Millis>,
}

/// The custody machine. See the module docs.
pub struct Custody<S> {
    store: S,
    fallback: MemoryFallback,
    runs: RunRegistry,
    sessions: BTreeMap<SessionId, SessionInfo>,
    lanes: BTreeMap<SessionId, Lanes>,
    in_flight: BTreeMap<(SessionId, OperationId), InFlight>,
    reads: BTreeMap<(SessionId, OperationId), PendingRead>,
    interrupts: BTreeMap<SessionId, Interrupt>,
    interrupt_spent: BTreeSet<(SessionId, OperationId)>,
    stops: BTreeMap<(SessionId, RunId), StopWorker>,
    stop_cache: BTreeMap<(SessionId, RunId), Millis>,
    take_backs: BTreeMap<(SessionId, OperationId), OutboxEntry>,
    vetoes: BTreeSet<(SessionId, RunId)>,
    uuids: Box<dyn FnMut() -> String + Send>,
    effects: VecDeque<Effect>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for Custody<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Custody")
            .field("store", &self.store)
            .field("runs", &self.runs)
            .field("in_flight", &self.in_flight.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl<S: OutboxStore> Custody<S> {
    /// A machine over `store`. `uuids` hands out fresh UUIDs (run IDs, session-message
    /// IDs, chain IDs); the machine draws no randomness itself.
    pub fn new(store: S, uuids: Box<dyn FnMut() -> String + Send>) -> Self {
        Custody {
            store,
            fallback: MemoryFallback::new(),
            runs: RunRegistry::new(),
            sessions: BTreeMap::new(),
            lanes: BTreeMap::new(),
            in_flight: BTreeMap::new(),
            reads: BTreeMap::new(),
            interrupts: BTreeMap::new(),
            interrupt_spent: BTreeSet::new(),
            stops: BTreeMap::new(),
            stop_cache: BTreeMap::new(),
            take_backs: BTreeMap::new(),
            vetoes: BTreeSet::new(),
            uuids,
            effects: VecDeque::new(),
        }
    }

    /// The store (for reads, and to hand it to a new machine after a restart).
    pub fn store(&mut self) -> &mut S {
        &mut self.store
    }

    /// Gives the store back (a restart drops every in-memory state).
    pub fn into_store(self) -> S {
        self.store
    }

    /// The run registry.
    pub fn runs(&self) -> &RunRegistry {
        &self.runs
    }

    /// The ledger memory fallback.
    pub fn fallback(&self) -> &MemoryFallback {
        &self.fallback
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

    /// The session's outbox in queue order.
    pub fn entries(&mut self, session: &SessionId) -> Result<Vec<StoredEntry>, StoreError> {
        self.store.entries(session)
    }

    /// Next effect to carry out.
    #[must_use]
    pub fn poll_effect(&mut self) -> Option<Effect> {
        self.effects.pop_front()
    }

    /// Every active run, after the stale reclaim (OB-14).
    pub fn active_runs(&mut self, now: Millis) -> Vec<(SessionId, RunId)> {
        let vetoes = self.vetoes.clone();
        let veto = move |s: &SessionId, r: &RunId| vetoes.contains(&(s.clone(), r.clone()));
        self.runs
            .active_runs(now, &veto)
            .into_iter()
            .map(|(s, r)| (s, r.run_id))
            .collect()
    }

    // ----- submit ----------------------------------------------------------------------

    /// Takes custody of a message (OB-03, OB-04): validation, the claim in one
    /// transaction, idempotent replay, conflicts.
    pub fn submit(&mut self, req: SubmitRequest, now: Millis) -> Result<Receipt, SubmitError> {
        let info = self
            .sessions
            .get(&req.session)
            .ok_or(ValidationError::UnknownSession)?;
        validate_controls(&req.controls, &req.request, &info.capabilities)?;
        let fp = request_fingerprint(&req.session, &req.queue_id, &req.request);
        let entries = self.decoded(&req.session)?;
        let is_session_message = req
            .operation_id
            .as_str()
            .starts_with(crate::session_message::SESSION_MESSAGE_PREFIX);
        if let Some(existing) = self.store.identity(&req.session, &req.operation_id)? {
            return self.resubmit(req, existing, entries, now);
        }
        if is_session_message {
            return Err(ValidationError::ClientSessionMessage.into());
        }
        // An operation is one message in its whole scope: the same ID under another
        // alias is another message, a conflict.
        let base = base_session(&req.session);
        let others: Vec<SessionId> = self
            .sessions
            .keys()
            .filter(|s| base_session(s) == base && *s != &req.session)
            .cloned()
            .collect();
        for other in others {
            if self.store.identity(&other, &req.operation_id)?.is_some() {
                return Err(SubmitError::Conflict(ConflictKind::DifferentRequest));
            }
        }
        // A new operation for a queue ID already queued: an edit.
        if let Some(current) = entries.iter().find(|e| e.queue_id == req.queue_id) {
            if current.status == EntryStatus::Sending {
                return Err(SubmitError::Conflict(ConflictKind::DifferentRequest));
            }
            let mut new = current.clone();
            new.operation_id = req.operation_id.clone();
            new.request = req.request.clone();
            new.controls = req.controls.clone();
            return match self.store.rekey_entry(&req.session, current, &fp, &new) {
                Ok(_) => {
                    self.wake(&req.session, now);
                    Ok(receipt(&req, false))
                }
                Err(StoreError::OperationTaken(_)) => {
                    Err(SubmitError::Conflict(ConflictKind::DifferentRequest))
                }
                Err(e) => Err(e.into()),
            };
        }
        let position = self.place(&req.session, req.controls.intent, &entries)?;
        let entry = OutboxEntry::queued(
            req.queue_id.clone(),
            req.operation_id.clone(),
            req.request.clone(),
            req.controls.clone(),
            position,
        );
        match self.store.claim(&req.session, &fp, &entry)? {
            Claim::Claimed => {
                self.wake(&req.session, now);
                Ok(receipt(&req, false))
            }
            Claim::Existing(existing) => self.resubmit(req, existing, entries, now),
        }
    }

    fn resubmit(
        &mut self,
        req: SubmitRequest,
        existing: crate::store::Identity,
        entries: Vec<OutboxEntry>,
        now: Millis,
    ) -> Result<Receipt, SubmitError> {
        let fp = request_fingerprint(&req.session, &req.queue_id, &req.request);
        if existing.fingerprint != fp {
            return Err(SubmitError::Conflict(ConflictKind::DifferentRequest));
        }
        let Some(current) = entries
            .iter()
            .find(|e| e.operation_id == req.operation_id)
            .cloned()
        else {
            let base = base_session(&req.session);
            let sent = self
                .ledger_of(&base, &req.operation_id)
                .ok()
                .flatten()
                .is_some_and(|l| l.status == LedgerStatus::Sent);
            return if sent {
                Ok(receipt(&req, true))
            } else {
                Err(SubmitError::Conflict(ConflictKind::Removed))
            };
        };
        let (old, new) = (&current.controls, &req.controls);
        if old.send_mode == SendMode::SteerRunning
            && new.send_mode == SendMode::SteerRunning
            && old.expected_active_run_id != new.expected_active_run_id
        {
            return Err(SubmitError::Conflict(ConflictKind::SteerRetargeted));
        }
        // Queue, then send now: the same operation converges on the new controls.
        if current.status == EntryStatus::Queued && new.intent != Intent::Enqueue {
            let mut updated = current.clone();
            updated.controls = new.clone();
            // An entry held with an error waits for the user's explicit send
            // ([`Custody::send_now`]); a repeated submit does not release it.
            if current.error.is_none() {
                updated.auto_drain = true;
                updated.hold_reason = None;
            }
            if let Some(origin) = &mut updated.session_message {
                origin.approved = true;
            }
            let others: Vec<OutboxEntry> = entries
                .into_iter()
                .filter(|e| e.queue_id != current.queue_id)
                .collect();
            updated.position = self.place(&req.session, new.intent, &others)?;
            if self.store.replace_entry(&req.session, &current, &updated)? {
                if updated.session_message.is_some() {
                    self.set_delivery(&updated.operation_id, RouteDelivery::Sent)?;
                }
                self.wake(&req.session, now);
            }
        }
        Ok(receipt(&req, true))
    }

    /// A queue position for `intent`: `enqueue` at the back; `automatic` and
    /// `replace-latest` at the front, behind entries that are sending.
    pub(crate) fn place(
        &mut self,
        session: &SessionId,
        intent: Intent,
        entries: &[OutboxEntry],
    ) -> Result<i64, StoreError> {
        let max = entries.iter().map(|e| e.position).max();
        if intent == Intent::Enqueue {
            return Ok(max.map_or(0, |m| m + POSITION_STEP));
        }
        let sending_max = entries
            .iter()
            .filter(|e| e.status == EntryStatus::Sending)
            .map(|e| e.position)
            .max();
        let queued_min = entries
            .iter()
            .filter(|e| {
                e.status == EntryStatus::Queued && sending_max.is_none_or(|s| e.position > s)
            })
            .map(|e| e.position)
            .min();
        match (sending_max, queued_min) {
            (_, None) => Ok(max.map_or(0, |m| m + POSITION_STEP)),
            (None, Some(q)) => Ok(q - POSITION_STEP),
            (Some(s), Some(q)) if q - s >= 2 => Ok(s + (q - s) / 2),
            (Some(_), Some(_)) => {
                // No room: renumber the queue with wide gaps and place again.
                let mut ordered = entries.to_vec();
                ordered.sort_by_key(|e| e.position);
                let positions: Vec<(QueueId, i64)> = ordered
                    .iter()
                    .enumerate()
                    .map(|(i, e)| (e.queue_id.clone(), (i as i64 + 1) * POSITION_STEP))
                    .collect();
                self.store.set_positions(session, &positions)?;
                for e in &mut ordered {
                    if let Some((_, p)) = positions.iter().find(|(q, _)| q == &e.queue_id) {
                        e.position = *p;
                    }
                }
                self.place(session, intent, &ordered)
            }
        }
    }

    // ----- composer actions (OB-11) ----------------------------------------------------

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
        let current = self.queued_entry(session, queue_id)?;
        let mut new = current.clone();
        new.operation_id = new_operation.clone();
        new.request = request;
        let fp = request_fingerprint(session, queue_id, &new.request);
        match self.store.rekey_entry(session, &current, &fp, &new) {
            Ok(true) => {
                self.wake(session, now);
                Ok(Receipt {
                    session_id: session.clone(),
                    queue_id: queue_id.clone(),
                    operation_id: new_operation,
                    replayed: false,
                })
            }
            Ok(false) => Err(ActionError::Blocked),
            Err(StoreError::OperationTaken(_)) => Err(ActionError::OperationTaken),
            Err(e) => Err(e.into()),
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
        let current = self.queued_entry(session, queue_id)?;
        self.store.remove_entry(session, queue_id)?;
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
        let current = self.queued_entry(session, queue_id)?;
        self.release_to_front(session, &current, now)?;
        Ok(())
    }

    fn release_to_front(
        &mut self,
        session: &SessionId,
        current: &OutboxEntry,
        now: Millis,
    ) -> Result<(), StoreError> {
        let others: Vec<OutboxEntry> = self
            .decoded(session)?
            .into_iter()
            .filter(|e| e.queue_id != current.queue_id)
            .collect();
        let mut new = current.clone();
        new.auto_drain = true;
        new.error = None;
        new.hold_reason = None;
        if new.controls.intent == Intent::Enqueue {
            new.controls.intent = Intent::Automatic;
        }
        if let Some(origin) = &mut new.session_message {
            origin.approved = true;
        }
        self.interrupt_spent
            .remove(&(session.clone(), new.operation_id.clone()));
        new.position = self.place(session, Intent::Automatic, &others)?;
        if self.store.replace_entry(session, current, &new)? {
            if new.session_message.is_some() {
                self.set_delivery(&new.operation_id, RouteDelivery::Sent)?;
            }
            self.wake(session, now);
        }
        Ok(())
    }

    // ----- drain lanes (OB-10) ---------------------------------------------------------

    /// Wakes both drain lanes of a session. A lane that is busy records a follow-up that
    /// its finishing pass runs, so no wake-up is lost.
    pub fn wake(&mut self, session: &SessionId, now: Millis) {
        self.pass(session, LaneKind::Normal, now);
        self.pass(session, LaneKind::Steer, now);
    }

    /// Wakes every session of the scope of `session`.
    fn wake_scope(&mut self, session: &SessionId, now: Millis) {
        let base = base_session(session);
        let mut members: Vec<SessionId> = self
            .sessions
            .keys()
            .filter(|s| base_session(s) == base)
            .cloned()
            .collect();
        if !members.contains(session) {
            members.push(session.clone());
        }
        for s in members {
            self.wake(&s, now);
        }
    }

    /// True while a lane of `session` is busy (for tests of lost wake-ups).
    pub fn lane_busy(&self, session: &SessionId) -> (bool, bool) {
        self.lanes
            .get(session)
            .map_or((false, false), |l| (l.normal.busy, l.steer.busy))
    }

    fn pass(&mut self, session: &SessionId, kind: LaneKind, now: Millis) {
        let lane = self.lanes.entry(session.clone()).or_default().get(kind);
        if lane.busy {
            lane.follow_up = true;
            return;
        }
        lane.follow_up = false;
        if self.runs.scope_ambiguous(session) || !self.sessions.contains_key(session) {
            return;
        }
        // The steer lane only ever joins this session's active run.
        if kind == LaneKind::Steer && self.runs.active(session).is_none() {
            return;
        }
        let Ok(entries) = self.decoded(session) else {
            return;
        };
        match kind {
            LaneKind::Normal => self.normal_pass(session, entries, now),
            LaneKind::Steer => self.steer_pass(session, entries, now),
        }
    }

    fn finish(&mut self, session: &SessionId, kind: LaneKind, now: Millis) {
        let lane = self.lanes.entry(session.clone()).or_default().get(kind);
        lane.busy = false;
        // The finishing pass returns the follow-up; wake both lanes of every session of
        // the scope, since any result (a run that ended, an entry that left) can free
        // the queue of an alias too.
        lane.follow_up = false;
        self.wake_scope(session, now);
    }

    fn scope_run(&self, session: &SessionId) -> Option<(SessionId, RunId)> {
        self.runs.scope_runs(session).into_iter().next()
    }

    fn normal_pass(&mut self, session: &SessionId, entries: Vec<OutboxEntry>, now: Millis) {
        if self.interrupts.contains_key(session) {
            return;
        }
        // An entry that is sending without an acceptance is a send in flight or a read
        // pending: the queue waits for it.
        if entries
            .iter()
            .any(|e| e.status == EntryStatus::Sending && e.acceptance.is_none())
        {
            return;
        }
        let Some(head) = self.next_drainable(session, &entries, now) else {
            return;
        };
        if self.scope_run(session).is_none() {
            if !self.start_entry(session, head.clone(), now) {
                // The head was held back (a reopen check, a hold, a failed write): the
                // next entry may go. A head that is unchanged means nothing can start.
                let changed = self
                    .decoded(session)
                    .map(|now_entries| !now_entries.contains(&head))
                    .unwrap_or(false);
                if changed && self.scope_run(session).is_none() {
                    self.pass(session, LaneKind::Normal, now);
                }
            }
            return;
        }
        // A run is active in the scope: a steer for it goes through the steer lane, an
        // interrupt stops it, anything else waits for it to end.
        let Some((run_session, run)) = self.scope_run(session) else {
            return;
        };
        let spent = self
            .interrupt_spent
            .contains(&(session.clone(), head.operation_id.clone()));
        match head.controls.send_mode {
            SendMode::SteerRunning
                if head.controls.expected_active_run_id.as_ref() == Some(&run)
                    && &run_session == session =>
            {
                self.pass(session, LaneKind::Steer, now)
            }
            SendMode::InterruptRunning if !spent && &run_session == session => {
                self.begin_interrupt(session, head, run, now)
            }
            _ => {}
        }
    }

    fn steer_pass(&mut self, session: &SessionId, entries: Vec<OutboxEntry>, now: Millis) {
        // Only the queued head, only as an exact active-run steer; never a new turn.
        let Some(head) = entries
            .iter()
            .find(|e| e.status == EntryStatus::Queued)
            .cloned()
        else {
            return;
        };
        let Some(active) = self.runs.active(session).map(|a| a.run_id.clone()) else {
            return;
        };
        if !head.drainable()
            || head.controls.send_mode != SendMode::SteerRunning
            || head.controls.expected_active_run_id.as_ref() != Some(&active)
        {
            return;
        }
        if self.hold_check(session, &head).is_some() {
            return;
        }
        if let Some(origin) = &head.session_message {
            let op = head.operation_id.clone();
            let _ = origin;
            self.runs.joined_by(session, &active, &op);
        }
        self.hand_off(
            session,
            head,
            SendKind::Steer { run: active },
            LaneKind::Steer,
            now,
        );
    }

    /// The first queued entry with auto-drain on that no hold rule keeps back.
    fn next_drainable(
        &mut self,
        session: &SessionId,
        entries: &[OutboxEntry],
        now: Millis,
    ) -> Option<OutboxEntry> {
        let _ = now;
        for e in entries.iter().filter(|e| e.drainable()) {
            if self.hold_check(session, e).is_none() {
                return Some(e.clone());
            }
        }
        None
    }

    /// Session messages are checked again before each drain: a hold turns auto-drain off
    /// and marks the route needs-approval. Returns the reason when held.
    fn hold_check(&mut self, session: &SessionId, e: &OutboxEntry) -> Option<String> {
        let origin = e.session_message.as_ref()?;
        if origin.approved {
            return None;
        }
        let reason = crate::session_message::hold_reason(self, session, origin.sender_access)?;
        let mut held = e.clone();
        held.auto_drain = false;
        held.hold_reason = Some(reason.clone());
        if self.store.replace_entry(session, e, &held).unwrap_or(false) {
            let _ = self.set_delivery(&e.operation_id, RouteDelivery::NeedsApproval);
        }
        Some(reason)
    }

    /// Starts `head` as a new run; false when it did not go.
    fn start_entry(&mut self, session: &SessionId, head: OutboxEntry, now: Millis) -> bool {
        let uuid = self.next_uuid();
        let run = RunId::generate(&uuid, now);
        let access = self.sessions.get(session).and_then(|i| i.access);
        let vetoes = self.vetoes.clone();
        let veto = move |s: &SessionId, r: &RunId| vetoes.contains(&(s.clone(), r.clone()));
        if self
            .runs
            .start(
                session,
                run.clone(),
                Some(head.operation_id.clone()),
                access,
                now,
                &veto,
            )
            .is_err()
        {
            return false;
        }
        // A session message that starts a run continues its exchange.
        if head.session_message.is_some() {
            self.runs.joined_by(session, &run, &head.operation_id);
        }
        let sent = self.hand_off(
            session,
            head,
            SendKind::Start { run: run.clone() },
            LaneKind::Normal,
            now,
        );
        if !sent {
            self.runs.end(session, &run);
        }
        sent
    }

    /// The steps before the hand-off: the ledger says sending, the entry goes sending,
    /// then the send effect. A failure here is proven unadmitted (OB-09).
    fn hand_off(
        &mut self,
        session: &SessionId,
        head: OutboxEntry,
        kind: SendKind,
        lane: LaneKind,
        now: Millis,
    ) -> bool {
        let base = base_session(session);
        match self.ledger_of(&base, &head.operation_id) {
            Ok(Some(l)) if l.status == LedgerStatus::Sent => {
                // Already proven delivered: never send twice.
                let _ = self.confirm_sent(session, &head.operation_id, now);
                return false;
            }
            Ok(Some(l)) if l.status == LedgerStatus::Sending && l.acceptance.is_some() => {
                // A turn accepted an earlier attempt and nothing settled it: read history
                // instead of sending again.
                let k = (session.clone(), head.operation_id.clone());
                if !self.reads.contains_key(&k) {
                    let mut waiting = head.clone();
                    waiting.status = EntryStatus::Sending;
                    self.read_after_replace(session, &head, waiting, ReadPurpose::Confirm);
                }
                return false;
            }
            Ok(Some(l)) if l.status == LedgerStatus::Canceled => {
                // The reopen check (OB-12): a canceled attempt that a turn accepted is
                // read from history first; one that no turn accepted reopens at once.
                if l.acceptance.is_some() {
                    let mut waiting = head.clone();
                    waiting.auto_drain = false;
                    self.read_after_replace(session, &head, waiting, ReadPurpose::Reopen);
                    return false;
                }
                if let Some(r) = reopen(&l, now) {
                    if self
                        .write_ledger_raw(&base, &head.operation_id, &r)
                        .is_err()
                    {
                        return false;
                    }
                }
            }
            _ => {}
        }
        let images: Vec<&str> = head
            .request
            .attachments
            .iter()
            .filter(|a| a.kind == "image")
            .map(|a| a.path.as_str())
            .collect();
        let mut record = LedgerRecord::new(LedgerStatus::Sending, now);
        record.admission_input_digest =
            Some(admission_input_digest(head.request.agent_text(), &images));
        if !self.record_ledger(&base, &head.operation_id, record) {
            let mut failed = head.clone();
            failed.auto_drain = false;
            failed.error = Some(SENDING_WRITE_FAILED_TEXT.to_owned());
            let _ = self.store.replace_entry(session, &head, &failed);
            return false;
        }
        let mut sending = head.clone();
        sending.status = EntryStatus::Sending;
        sending.error = None;
        sending.hold_reason = None;
        match self.store.replace_entry(session, &head, &sending) {
            Ok(true) => {}
            _ => return false,
        }
        let request = SendRequest {
            session: session.clone(),
            operation_id: head.operation_id.clone(),
            request: head.request.clone(),
            kind,
            rollback_before_send: head.request.rollback_before_send,
            fresh_thread: false,
        };
        self.in_flight.insert(
            (session.clone(), head.operation_id.clone()),
            InFlight {
                snapshot: sending,
                lane,
                deadline: now.saturating_add(SEND_PATH_DEADLINE),
                request: request.clone(),
            },
        );
        self.lanes
            .entry(session.clone())
            .or_default()
            .get(lane)
            .busy = true;
        self.effects.push_back(Effect::Send(request));
        true
    }

    // ----- send results (OB-08, OB-09) -------------------------------------------------

    /// The result of a send. A result nobody waits for (after the deadline, or twice) is
    /// ignored. A result changes the entry only while it still equals the snapshot taken
    /// when it went sending; the ledger moves only toward stronger proof either way.
    pub fn handle_send_result(
        &mut self,
        session: &SessionId,
        op: &OperationId,
        result: SendResult,
        now: Millis,
    ) {
        let Some(f) = self.in_flight.remove(&(session.clone(), op.clone())) else {
            return;
        };
        self.apply_send_result(session, op, f, result, now);
    }

    fn apply_send_result(
        &mut self,
        session: &SessionId,
        op: &OperationId,
        f: InFlight,
        result: SendResult,
        now: Millis,
    ) {
        let base = base_session(session);
        let started = match &f.request.kind {
            SendKind::Start { run } => Some(run.clone()),
            SendKind::Steer { .. } => None,
        };
        let current = self
            .entry_by_queue(session, &f.snapshot.queue_id)
            .ok()
            .filter(|e| e == &f.snapshot);
        match result {
            SendResult::Delivered => {
                let _ = self.confirm_sent(session, op, now);
            }
            SendResult::Accepted(acceptance) => {
                let mut record = LedgerRecord::new(LedgerStatus::Sending, now);
                record.acceptance = Some(acceptance.clone());
                self.record_ledger(&base, op, record);
                if let Some(run) = &started {
                    self.runs.touch(session, run, now);
                }
                if let Some(e) = current {
                    let mut accepted = e.clone();
                    accepted.acceptance = Some(acceptance);
                    let _ = self.store.replace_entry(session, &e, &accepted);
                }
            }
            SendResult::Deferred { reason } => {
                if let Some(run) = &started {
                    self.runs.end(session, run);
                }
                if let Some(e) = current {
                    let dedicated = e
                        .handoff
                        .as_ref()
                        .is_some_and(|h| h.phase == HandoffPhase::Dedicated);
                    let mut back = e.clone();
                    back.status = EntryStatus::Queued;
                    back.auto_drain = !dedicated;
                    back.hold_reason = Some(reason);
                    let _ = self.store.replace_entry(session, &e, &back);
                }
            }
            SendResult::Canceled => {
                self.record_ledger(&base, op, LedgerRecord::new(LedgerStatus::Canceled, now));
                if let Some(run) = &started {
                    self.runs.end(session, run);
                }
                if let Some(e) = current {
                    self.hold(session, &e, None);
                }
            }
            SendResult::ProvenUnadmitted { error } => {
                self.record_ledger(&base, op, LedgerRecord::new(LedgerStatus::Failed, now));
                if let Some(run) = &started {
                    self.runs.end(session, run);
                }
                if let Some(e) = current {
                    self.hold(session, &e, Some(error));
                }
            }
            SendResult::AdmissionUncertain { .. } => {
                self.read_history(session, ReadPurpose::Confirm, f.snapshot.clone());
            }
            SendResult::ThreadGone => {
                // Nothing reached the old thread: clear the link and send to a fresh one.
                self.effects.push_back(Effect::ClearThreadLink {
                    session: session.clone(),
                });
                let mut request = f.request.clone();
                request.fresh_thread = true;
                request.rollback_before_send = false;
                self.in_flight.insert(
                    (session.clone(), op.clone()),
                    InFlight {
                        request: request.clone(),
                        deadline: now.saturating_add(SEND_PATH_DEADLINE),
                        ..f
                    },
                );
                self.effects.push_back(Effect::Send(request));
                return;
            }
        }
        self.finish(session, f.lane, now);
    }

    /// The agent echoed the operation (Codex `clientId`, Claude transcript UUID): the
    /// ledger says sent, then the entry leaves every alias.
    pub fn handle_delivery_proof(&mut self, session: &SessionId, op: &OperationId, now: Millis) {
        let _ = self.confirm_sent(session, op, now);
        self.wake_scope(session, now);
    }

    /// The answer to [`Effect::ReadHistory`].
    pub fn handle_history_read(
        &mut self,
        session: &SessionId,
        op: &OperationId,
        read: HistoryRead,
        now: Millis,
    ) {
        let Some(p) = self.reads.remove(&(session.clone(), op.clone())) else {
            return;
        };
        let base = base_session(session);
        let current = self
            .entry_by_queue(session, &p.snapshot.queue_id)
            .ok()
            .filter(|e| e == &p.snapshot);
        match (p.purpose, read) {
            (_, HistoryRead::Found) => {
                let _ = self.confirm_sent(session, op, now);
            }
            (ReadPurpose::Reopen, HistoryRead::Missing) => {
                if let Ok(Some(l)) = self.ledger_of(&base, op) {
                    if let Some(r) = reopen(&l, now) {
                        let _ = self.write_ledger_raw(&base, op, &r);
                    }
                }
                if let Some(e) = current {
                    let _ = self.release_to_front(session, &e, now);
                }
            }
            (_, HistoryRead::Missing) => {
                // Readable and not there: whatever turn accepted it did not apply it.
                if let Ok(Some(mut l)) = self.ledger_of(&base, op) {
                    if l.acceptance.take().is_some() {
                        l.updated_at = now;
                        let _ = self.write_ledger_raw(&base, op, &l);
                    }
                }
                if let Some(e) = current {
                    self.hold_unconfirmed(session, &e);
                }
            }
            (_, HistoryRead::Unreadable) => {
                if let Some(e) = current {
                    self.hold_unconfirmed(session, &e);
                }
            }
        }
        self.wake_scope(session, now);
    }

    /// Asks the adapter to read the agent's history for `snapshot`'s operation, and
    /// remembers what the answer is for.
    fn read_history(&mut self, session: &SessionId, purpose: ReadPurpose, snapshot: OutboxEntry) {
        let operation_id = snapshot.operation_id.clone();
        self.reads.insert(
            (session.clone(), operation_id.clone()),
            PendingRead { purpose, snapshot },
        );
        self.effects.push_back(Effect::ReadHistory {
            session: session.clone(),
            operation_id,
        });
    }

    /// Saves `waiting` in place of `head` and, when that took (nobody changed the entry
    /// meanwhile), asks for the history read of `purpose`.
    fn read_after_replace(
        &mut self,
        session: &SessionId,
        head: &OutboxEntry,
        waiting: OutboxEntry,
        purpose: ReadPurpose,
    ) {
        if self
            .store
            .replace_entry(session, head, &waiting)
            .unwrap_or(false)
        {
            self.read_history(session, purpose, waiting);
        }
    }

    fn hold_unconfirmed(&mut self, session: &SessionId, e: &OutboxEntry) {
        self.hold(session, e, Some(UNCONFIRMED_TEXT.to_owned()));
    }

    /// Puts `e` back in the queue, out of automatic draining, showing `error`. If the
    /// store refuses the write, the entry keeps its saved state.
    fn hold(&mut self, session: &SessionId, e: &OutboxEntry, error: Option<String>) {
        let mut held = e.clone();
        held.status = EntryStatus::Queued;
        held.auto_drain = false;
        held.error = error;
        let _ = self.store.replace_entry(session, e, &held);
    }

    /// A run ended. Accepted messages the agent reported as not taken come back with
    /// auto-drain off; the rest of the run's accepted messages are confirmed from
    /// history.
    pub fn handle_run_ended(
        &mut self,
        session: &SessionId,
        run: &RunId,
        untaken: &[OperationId],
        now: Millis,
    ) {
        self.runs.end(session, run);
        self.settle_run_entries(session, run, untaken, None, now);
        self.wake_scope(session, now);
    }

    fn settle_run_entries(
        &mut self,
        session: &SessionId,
        run: &RunId,
        untaken: &[OperationId],
        untaken_error: Option<&str>,
        now: Millis,
    ) {
        let base = base_session(session);
        let Ok(entries) = self.decoded(session) else {
            return;
        };
        for e in entries {
            if e.handoff
                .as_ref()
                .is_some_and(|h| h.phase == HandoffPhase::Requested && &h.acceptance.run_id == run)
                && e.acceptance.is_none()
            {
                self.dedicate(session, &e);
                continue;
            }
            let Some(acc) = &e.acceptance else { continue };
            if &acc.run_id != run || e.status != EntryStatus::Sending {
                continue;
            }
            if untaken.contains(&e.operation_id) {
                self.record_ledger(
                    &base,
                    &e.operation_id,
                    LedgerRecord::new(LedgerStatus::Canceled, now),
                );
                self.hold(session, &e, untaken_error.map(str::to_owned));
            } else if !self
                .reads
                .contains_key(&(session.clone(), e.operation_id.clone()))
            {
                self.read_history(session, ReadPurpose::Confirm, e);
            }
        }
    }

    /// A turn that starts after its predecessor removed the run puts the run back
    /// (OB-14); refused when a different run is active.
    pub fn restore_run(
        &mut self,
        session: &SessionId,
        run: crate::runs::ActiveRun,
    ) -> Result<(), crate::runs::RunError> {
        self.runs.restore(session, run)
    }

    /// Records agent activity of a run (for the stale reclaim).
    pub fn touch_run(&mut self, session: &SessionId, run: &RunId, now: Millis) {
        self.runs.touch(session, run, now);
    }

    // ----- start-up and outbox loads (OB-10) -------------------------------------------

    /// At start-up: both lanes start for every saved outbox, and every entry still
    /// sending is confirmed from history (held with the unconfirmed text when the ledger
    /// cannot be read).
    pub fn start_up(&mut self, now: Millis) -> Result<(), StoreError> {
        for session in self.store.outbox_sessions()? {
            self.confirm_sending(&session, now);
            self.wake(&session, now);
        }
        Ok(())
    }

    /// A client loads an outbox. With no drain and no run active, every entry still
    /// sending is confirmed from history.
    pub fn load_outbox(
        &mut self,
        session: &SessionId,
        now: Millis,
    ) -> Result<Vec<StoredEntry>, StoreError> {
        let (normal, steer) = self.lane_busy(session);
        if !normal && !steer && self.scope_run(session).is_none() {
            self.confirm_sending(session, now);
        }
        self.store.entries(session)
    }

    fn confirm_sending(&mut self, session: &SessionId, now: Millis) {
        let _ = now;
        let base = base_session(session);
        let Ok(entries) = self.decoded(session) else {
            return;
        };
        for e in entries
            .into_iter()
            .filter(|e| e.status == EntryStatus::Sending)
        {
            let k = (session.clone(), e.operation_id.clone());
            if self.reads.contains_key(&k) || self.in_flight.contains_key(&k) {
                continue;
            }
            if self.store.ledger(&base, &e.operation_id).is_err() {
                self.hold_unconfirmed(session, &e);
                continue;
            }
            self.read_history(session, ReadPurpose::Confirm, e);
        }
    }

    // ----- interrupt (OB-11) -----------------------------------------------------------

    fn model_changed(&self, session: &SessionId, e: &OutboxEntry) -> bool {
        let model = self.sessions.get(session).and_then(|i| i.model.as_ref());
        matches!((model, &e.request.expected_model), (Some(now), Some(then)) if now != then)
    }

    fn begin_interrupt(&mut self, session: &SessionId, head: OutboxEntry, run: RunId, now: Millis) {
        if self.model_changed(session, &head) {
            let mut held = head.clone();
            held.auto_drain = false;
            held.error = Some(MODEL_CHANGED_TEXT.to_owned());
            let _ = self.store.replace_entry(session, &head, &held);
            return;
        }
        self.interrupts.insert(
            session.clone(),
            Interrupt {
                op: head.operation_id.clone(),
                old_run: run.clone(),
                deadline: now.saturating_add(INTERRUPT_WAIT),
                next_poll: now.saturating_add(INTERRUPT_POLL),
            },
        );
        self.stop(session, &run, None, now);
    }

    fn poll_interrupts(&mut self, now: Millis) {
        let due: Vec<(SessionId, Interrupt)> = self
            .interrupts
            .iter()
            .filter(|(_, i)| i.next_poll <= now)
            .map(|(s, i)| (s.clone(), i.clone()))
            .collect();
        for (session, mut i) in due {
            let old_active = self
                .runs
                .active(&session)
                .is_some_and(|a| a.run_id == i.old_run);
            if old_active {
                if now >= i.deadline {
                    // Still settling after 10 s: the message stays queued.
                    self.interrupts.remove(&session);
                    self.interrupt_spent.insert((session.clone(), i.op.clone()));
                } else {
                    while i.next_poll <= now {
                        i.next_poll = i.next_poll.saturating_add(INTERRUPT_POLL);
                    }
                    self.interrupts.insert(session.clone(), i);
                }
                continue;
            }
            self.interrupts.remove(&session);
            if self.scope_run(&session).is_some() {
                // A newer turn appeared during the wait: keep the message queued.
                self.interrupt_spent.insert((session.clone(), i.op.clone()));
                continue;
            }
            self.wake(&session, now);
        }
    }

    // ----- stop (OB-15) ----------------------------------------------------------------

    /// Stops `run`. One worker per (session, run) serves every caller; a caller (if any)
    /// gets [`StopAnswer::StillSettling`] after 5 s while the worker goes on and keeps
    /// new runs blocked. A success answers repeated requests for 60 s. Stop removes no
    /// message.
    pub fn stop(
        &mut self,
        session: &SessionId,
        run: &RunId,
        caller: Option<CallerId>,
        now: Millis,
    ) {
        let k = (session.clone(), run.clone());
        if self.stop_cache.get(&k).is_some_and(|until| now < *until) {
            if let Some(c) = caller {
                self.effects.push_back(Effect::StopAnswer {
                    caller: c,
                    answer: StopAnswer::Stopped,
                });
            }
            return;
        }
        let new = !self.stops.contains_key(&k);
        let worker = self.stops.entry(k).or_insert(StopWorker {
            callers: Vec::new(),
            retry_at: None,
        });
        if let Some(c) = caller {
            worker
                .callers
                .push((c, now.saturating_add(STOP_CALLER_WAIT)));
        }
        if new {
            self.runs.begin_cancellation(session, run);
            self.effects.push_back(Effect::StopRun {
                session: session.clone(),
                run: run.clone(),
            });
        }
    }

    /// The answer to [`Effect::StopRun`].
    pub fn handle_stop_result(
        &mut self,
        session: &SessionId,
        run: &RunId,
        result: StopResult,
        now: Millis,
    ) {
        let k = (session.clone(), run.clone());
        let Some(mut worker) = self.stops.remove(&k) else {
            return;
        };
        let answer = match result {
            StopResult::Crashed => {
                worker.retry_at = Some(now.saturating_add(STOP_RETRY));
                self.stops.insert(k, worker);
                return;
            }
            StopResult::Stopped { untaken } => {
                self.stop_cache
                    .insert(k, now.saturating_add(STOP_SUCCESS_CACHE));
                self.runs.end_cancellation(session, run);
                self.runs.end(session, run);
                self.settle_run_entries(
                    session,
                    run,
                    &untaken,
                    Some(STOPPED_BEFORE_DELIVERY_TEXT),
                    now,
                );
                StopAnswer::Stopped
            }
            StopResult::Failed { error } => {
                self.runs.end_cancellation(session, run);
                StopAnswer::Failed(error)
            }
        };
        for (caller, _) in worker.callers {
            self.effects.push_back(Effect::StopAnswer {
                caller,
                answer: answer.clone(),
            });
        }
        // After the result every outbox in the scope drains.
        self.wake_scope(session, now);
    }

    // ----- stop and send now (OB-13) ---------------------------------------------------

    /// Stop and send now: take back an accepted steer, revoke its acceptance, stop the
    /// run, and queue the message again for its own turn with the same operation ID.
    pub fn stop_and_send_now(
        &mut self,
        session: &SessionId,
        queue_id: &QueueId,
        now: Millis,
    ) -> Result<(), ActionError> {
        let _ = now;
        let current = self.entry_by_queue(session, queue_id)?;
        let Some(acceptance) = current.acceptance.clone() else {
            return Err(ActionError::NotAnAcceptedSteer);
        };
        if current.status != EntryStatus::Sending || current.handoff.is_some() {
            return Err(ActionError::NotAnAcceptedSteer);
        }
        if self.model_changed(session, &current) {
            return Err(ActionError::ModelChanged);
        }
        let mut requested = current.clone();
        requested.auto_drain = false;
        requested.handoff = Some(Handoff {
            phase: HandoffPhase::Requested,
            acceptance: acceptance.clone(),
        });
        if !self.store.replace_entry(session, &current, &requested)? {
            return Err(ActionError::Blocked);
        }
        self.take_backs
            .insert((session.clone(), current.operation_id.clone()), requested);
        self.effects.push_back(Effect::TakeBack {
            session: session.clone(),
            operation_id: current.operation_id.clone(),
            acceptance,
        });
        Ok(())
    }

    /// The answer to [`Effect::TakeBack`]. Only a confirmed detach lets the hand-off go
    /// on; if the ledger already says sent, nothing is replayed.
    pub fn handle_take_back(
        &mut self,
        session: &SessionId,
        op: &OperationId,
        result: DetachResult,
        now: Millis,
    ) {
        let Some(snapshot) = self.take_backs.remove(&(session.clone(), op.clone())) else {
            return;
        };
        let Ok(current) = self.entry_by_queue(session, &snapshot.queue_id) else {
            return;
        };
        if current != snapshot {
            return;
        }
        let Some(handoff) = snapshot.handoff.clone() else {
            return;
        };
        match result {
            DetachResult::DetachedForReplay | DetachResult::AlreadyDetachedForReplay => {
                let base = base_session(session);
                let ledger = self.ledger_of(&base, op).ok().flatten();
                if ledger
                    .as_ref()
                    .is_some_and(|l| l.status == LedgerStatus::Sent)
                {
                    let _ = self.confirm_sent(session, op, now);
                    return;
                }
                // Revoke only the acceptance of that exact run, thread and turn.
                if let Some(mut l) = ledger {
                    if l.acceptance.as_ref() == Some(&handoff.acceptance) {
                        l.acceptance = None;
                        l.updated_at = now;
                        let _ = self.write_ledger_raw(&base, op, &l);
                    }
                }
                let mut detached = current.clone();
                detached.acceptance = None;
                detached.status = EntryStatus::Queued;
                if !self
                    .store
                    .replace_entry(session, &current, &detached)
                    .unwrap_or(false)
                {
                    return;
                }
                let run = handoff.acceptance.run_id.clone();
                if self.runs.active(session).is_some_and(|a| a.run_id == run) {
                    self.stop(session, &run, None, now);
                } else {
                    self.dedicate(session, &detached);
                    self.wake(session, now);
                }
            }
            DetachResult::NotDetached { reason } => {
                let mut back = current.clone();
                back.handoff = None;
                back.auto_drain = true;
                let _ = self.store.replace_entry(session, &current, &back);
                self.effects.push_back(Effect::HandoffRefused {
                    session: session.clone(),
                    operation_id: op.clone(),
                    reason,
                });
            }
        }
    }

    fn dedicate(&mut self, session: &SessionId, e: &OutboxEntry) {
        let Some(h) = &e.handoff else { return };
        let mut dedicated = e.clone();
        dedicated.status = EntryStatus::Queued;
        dedicated.auto_drain = true;
        dedicated.acceptance = None;
        dedicated.handoff = Some(Handoff {
            phase: HandoffPhase::Dedicated,
            acceptance: h.acceptance.clone(),
        });
        dedicated.controls = Controls::automatic();
        let _ = self.store.replace_entry(session, e, &dedicated);
    }

    // ----- timers ----------------------------------------------------------------------

    /// The earliest deadline.
    pub fn poll_timeout(&self) -> Option<Millis> {
        let sends = self.in_flight.values().map(|f| f.deadline);
        let interrupts = self.interrupts.values().map(|i| i.next_poll);
        let callers = self
            .stops
            .values()
            .flat_map(|w| w.callers.iter().map(|(_, d)| *d));
        let retries = self.stops.values().filter_map(|w| w.retry_at);
        sends.chain(interrupts).chain(callers).chain(retries).min()
    }

    /// Handles every deadline that passed. Safe to call early or twice.
    pub fn handle_timeout(&mut self, now: Millis) {
        let expired: Vec<(SessionId, OperationId)> = self
            .in_flight
            .iter()
            .filter(|(_, f)| f.deadline <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for (s, op) in expired {
            if let Some(f) = self.in_flight.remove(&(s.clone(), op.clone())) {
                let error = "the send path stopped waiting 31 s after the hand-off".to_owned();
                self.apply_send_result(&s, &op, f, SendResult::AdmissionUncertain { error }, now);
            }
        }
        self.poll_interrupts(now);
        let keys: Vec<(SessionId, RunId)> = self.stops.keys().cloned().collect();
        for k in keys {
            let Some(w) = self.stops.get_mut(&k) else {
                continue;
            };
            let (late, waiting): (Vec<_>, Vec<_>) =
                w.callers.drain(..).partition(|(_, d)| *d <= now);
            w.callers = waiting;
            let retry = w.retry_at.filter(|at| *at <= now).is_some();
            if retry {
                w.retry_at = None;
            }
            for (caller, _) in late {
                self.effects.push_back(Effect::StopAnswer {
                    caller,
                    answer: StopAnswer::StillSettling,
                });
            }
            if retry {
                self.effects.push_back(Effect::StopRun {
                    session: k.0.clone(),
                    run: k.1.clone(),
                });
            }
        }
        self.stop_cache.retain(|_, until| now < *until);
    }

    // ----- the synchronous driver -----------------------------------------------------

    /// Carries out every pending effect against a synchronous `adapter` (answers at
    /// once) and returns the effects meant for the embedding itself (stop answers,
    /// thread-link clears, delivery republishes, refused hand-offs).
    pub fn drive<A: AgentAdapter + ?Sized>(&mut self, adapter: &mut A, now: Millis) -> Vec<Effect> {
        let mut out = Vec::new();
        while let Some(effect) = self.poll_effect() {
            match effect {
                Effect::Send(req) => {
                    let result = adapter.send(&req);
                    self.handle_send_result(&req.session, &req.operation_id, result, now);
                }
                Effect::ReadHistory {
                    session,
                    operation_id,
                } => {
                    let read = adapter.read_history(&session, &operation_id);
                    self.handle_history_read(&session, &operation_id, read, now);
                }
                Effect::StopRun { session, run } => {
                    let result = adapter.stop(&session, &run);
                    self.handle_stop_result(&session, &run, result, now);
                }
                Effect::TakeBack {
                    session,
                    operation_id,
                    acceptance,
                } => {
                    let result = adapter.take_back(&session, &operation_id, &acceptance);
                    self.handle_take_back(&session, &operation_id, result, now);
                }
                other => out.push(other),
            }
        }
        out
    }

    // ----- helpers ---------------------------------------------------------------------

    pub(crate) fn decoded(&mut self, session: &SessionId) -> Result<Vec<OutboxEntry>, StoreError> {
        Ok(self
            .store
            .entries(session)?
            .into_iter()
            .filter_map(|e| match e {
                StoredEntry::Entry(e) => Some(*e),
                StoredEntry::Blocked(_) => None,
            })
            .collect())
    }

    /// The entry `queue_id` while it is queued; a sending entry is
    /// [`ActionError::Blocked`] (the ledger or the history settles it first).
    fn queued_entry(
        &mut self,
        session: &SessionId,
        queue_id: &QueueId,
    ) -> Result<OutboxEntry, ActionError> {
        let current = self.entry_by_queue(session, queue_id)?;
        if current.status == EntryStatus::Sending {
            return Err(ActionError::Blocked);
        }
        Ok(current)
    }

    fn entry_by_queue(
        &mut self,
        session: &SessionId,
        queue_id: &QueueId,
    ) -> Result<OutboxEntry, ActionError> {
        self.decoded(session)?
            .into_iter()
            .find(|e| &e.queue_id == queue_id)
            .ok_or(ActionError::NotFound)
    }

    /// The ledger record, from the store or the memory fallback.
    pub fn ledger_of(
        &mut self,
        base: &SessionId,
        op: &OperationId,
    ) -> Result<Option<LedgerRecord>, StoreError> {
        let stored = self.store.ledger(base, op)?;
        let fallback = self.fallback.get(base, op).cloned();
        Ok(match (stored, fallback) {
            (Some(a), Some(b)) => Some(if b.status.strength() > a.status.strength() {
                b
            } else {
                a
            }),
            (a, b) => a.or(b),
        })
    }

    /// Applies the ledger lattice and stores the result (store first, memory fallback
    /// when the store cannot be written). False when neither could record it.
    fn record_ledger(
        &mut self,
        base: &SessionId,
        op: &OperationId,
        proposed: LedgerRecord,
    ) -> bool {
        let current = self.ledger_of(base, op).ok().flatten();
        match transition(current.as_ref(), proposed) {
            Transition::Keep => true,
            Transition::Apply(record) => self.write_ledger_raw(base, op, &record).is_ok(),
        }
    }

    fn write_ledger_raw(
        &mut self,
        base: &SessionId,
        op: &OperationId,
        record: &LedgerRecord,
    ) -> Result<(), StoreError> {
        match self.store.put_ledger(base, op, record) {
            Ok(()) => Ok(()),
            Err(e) => {
                // The fallback keeps the rules too; a forced write (reopen, revoke) goes
                // through as the current record when the lattice keeps it.
                let forced = LedgerRecord { ..record.clone() };
                match self.fallback.record(base, op, forced) {
                    Ok(_) => Ok(()),
                    Err(_) => Err(e),
                }
            }
        }
    }

    /// Ledger sent, then the operation leaves the outbox of every alias (one store
    /// transaction).
    pub(crate) fn confirm_sent(
        &mut self,
        session: &SessionId,
        op: &OperationId,
        now: Millis,
    ) -> Result<(), StoreError> {
        let base = base_session(session);
        let mut scope = vec![base.clone()];
        for s in self
            .sessions
            .keys()
            .chain(self.store.outbox_sessions()?.iter())
        {
            if base_session(s) == base && !scope.contains(s) {
                scope.push(s.clone());
            }
        }
        let current = self.ledger_of(&base, op)?;
        let record = match transition(current.as_ref(), LedgerRecord::new(LedgerStatus::Sent, now))
        {
            Transition::Apply(r) => r,
            Transition::Keep => {
                current.unwrap_or_else(|| LedgerRecord::new(LedgerStatus::Sent, now))
            }
        };
        match self.store.confirm_sent(&scope, op, &record) {
            Ok(_) => Ok(()),
            Err(e) => {
                let _ = self.fallback.record(&base, op, record);
                Err(e)
            }
        }
    }

    pub(crate) fn set_delivery(
        &mut self,
        op: &OperationId,
        delivery: RouteDelivery,
    ) -> Result<(), StoreError> {
        let Some(route) = self.store.route(op)? else {
            return Ok(());
        };
        if route.delivery == delivery {
            return Ok(());
        }
        self.store.set_route_delivery(op, delivery)?;
        self.effects.push_back(Effect::RouteDeliveryChanged {
            operation_id: op.clone(),
            sender_session: route.sender_session_id,
            delivery,
        });
        Ok(())
    }
}

fn receipt(req: &SubmitRequest, replayed: bool) -> Receipt {
    Receipt {
        session_id: req.session.clone(),
        queue_id: req.queue_id.clone(),
        operation_id: req.operation_id.clone(),
        replayed,
    }
}

/// The control rules of OB-04 and the agent's capabilities.
pub fn validate_controls(
    controls: &Controls,
    request: &MessageRequest,
    caps: &Capabilities,
) -> Result<(), ValidationError> {
    match (controls.intent, controls.send_mode) {
        (Intent::Enqueue, m) if m != SendMode::Queue => {
            return Err(ValidationError::EnqueueNeedsQueue)
        }
        (Intent::ReplaceLatest, m) if m != SendMode::InterruptRunning => {
            return Err(ValidationError::ReplaceLatestNeedsInterrupt)
        }
        _ => {}
    }
    match (controls.send_mode, &controls.expected_active_run_id) {
        (SendMode::SteerRunning, None) => return Err(ValidationError::SteerNeedsRun),
        (m, Some(_)) if m != SendMode::SteerRunning => {
            return Err(ValidationError::RunIdOnlyForSteer)
        }
        _ => {}
    }
    if (controls.intent == Intent::ReplaceLatest) != request.rollback_before_send {
        return Err(ValidationError::RollbackNeedsReplaceLatest);
    }
    if controls.intent == Intent::ReplaceLatest && !caps.replace_latest {
        return Err(ValidationError::Unsupported("replace-latest"));
    }
    if request.speed_mode.is_some() && !caps.speed_mode {
        return Err(ValidationError::Unsupported("speedMode"));
    }
    Ok(())
}
