//! What goes into a [`crate::Host`] and what comes out of it.

use outbox_core::adapter::{AttemptId, HistoryRead, SendRequest, TakeBackResult};
use outbox_core::adapter::{ReadHistoryRequest, StopRequest, TakeBackRequest};
use outbox_core::adapter::{SendResult, StopResult};
use outbox_core::custody::{ActionError, StopAnswer, StoreFailure, SubmitError, SubmitRequest};
use outbox_core::entry::{MessageRequest, Receipt};
use outbox_core::ids::{CallId, OperationId, QueueId};
use outbox_core::runs::RunError;
use outbox_core::session_message::{SessionMessageCall, ToolResult};
use outbox_core::store::RouteDelivery;
use overlay_core::live::{Delivery, LiveProtocol, RelayError, RunEventKind, WindowId};
use overlay_core::replay::ReplayChunk;
use overlay_core::store::{OverlayError, StoredBlock};
use overlay_core::window::WindowError;
use timeline_core::anchor::Anchor;
use timeline_core::cursor::BoundaryToken;
use timeline_core::key::{RunId, SessionId, TargetId};
use timeline_core::rows::{ApprovalRequest, ApprovalResult, Decision};
use timeline_core::wire::{OlderPage, TimelineWindow};

/// Names the caller of a client request; its [`Reply`] comes back with it. The embedder
/// chooses the numbers (for example its wire request IDs) and routes replies by them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReplyTo(pub u64);

/// A request from a client (a desktop window or a phone through the relay).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum ClientRequest {
    /// Save a message (OB-03): answered with [`Reply::Submitted`].
    Submit(SubmitRequest),
    /// Replace a queued message's text (a new operation): [`Reply::Edited`].
    Edit {
        /// The app session it concerns.
        session: SessionId,
        /// The entry.
        queue_id: QueueId,
        /// The operation of the edited message.
        new_operation: OperationId,
        /// The new message.
        request: MessageRequest,
    },
    /// Remove a queued message: [`Reply::Done`].
    Remove {
        /// The app session it concerns.
        session: SessionId,
        /// The entry.
        queue_id: QueueId,
    },
    /// Move a queued message just before another queued one, or to the back of the
    /// queue (OB-11): [`Reply::Done`].
    Reorder {
        /// The app session it concerns.
        session: SessionId,
        /// The entry moved.
        queue_id: QueueId,
        /// The queued entry it goes before; `None` for the back of the queue.
        before: Option<QueueId>,
    },
    /// Send a queued message now: [`Reply::Done`].
    SendNow {
        /// The app session it concerns.
        session: SessionId,
        /// The entry.
        queue_id: QueueId,
    },
    /// Stop the session's active run: [`Reply::Stop`] once the stop settles (or after 5 s,
    /// still settling).
    Stop {
        /// The app session it concerns.
        session: SessionId,
    },
    /// Take an accepted steer back and send it as a turn of its own: [`Reply::Done`].
    StopAndSendNow {
        /// The app session it concerns.
        session: SessionId,
        /// The entry.
        queue_id: QueueId,
    },
    /// `run.chatLoad`: the latest window of a target: [`Reply::LatestWindow`].
    LatestWindow {
        /// The app session it concerns.
        session: SessionId,
        /// The timeline target: the session's main conversation or a child thread.
        target: TargetId,
        /// Rows asked for.
        page_size: usize,
    },
    /// `run.chatLoadPageBefore`: [`Reply::OlderPage`].
    OlderPage {
        /// The app session it concerns.
        session: SessionId,
        /// The timeline target: the session's main conversation or a child thread.
        target: TargetId,
        /// `beforeCursor`: where the older page ends, from the previous answer.
        cursor: String,
        /// `pageSize`: the rows asked for.
        page_size: usize,
        /// `expectedBoundaryToken`, as the client holds it.
        expected_boundary_token: Option<BoundaryToken>,
    },
    /// A load at an anchor: [`Reply::LatestWindow`] (an anchored window has the same form).
    Anchored {
        /// The app session it concerns.
        session: SessionId,
        /// The timeline target: the session's main conversation or a child thread.
        target: TargetId,
        /// The anchor.
        anchor: Anchor,
    },
    /// `run.chatResolveApproval`: [`Reply::Approval`]. It carries no session ID.
    ResolveApproval {
        /// `requestId`: the approval request.
        request_id: String,
        /// `threadId`: the thread that asked.
        thread_id: String,
        /// `turnId`: the turn that asked.
        turn_id: String,
        /// `itemId`: the item the approval is for.
        item_id: String,
        /// The decision.
        decision: Decision,
    },
    /// `run.chatReconcileSessions` (OV-05): each session's latest window with its overlay,
    /// outbox and active run, in request order: [`Reply::Reconciled`]. At most 16
    /// sessions and 256 outbox entries per session (invalid params past either), the
    /// answer at most 8 MiB. What settlement saved is sent to the live recipients, as
    /// every load's is ("save, then send").
    ReconcileSessions {
        /// The app sessions, each read at its main conversation.
        sessions: Vec<SessionId>,
    },
    /// A desktop window subscribes to one target: [`Reply::Subscribed`].
    Subscribe {
        /// The window.
        window: WindowId,
        /// The app session it concerns.
        session: SessionId,
        /// The timeline target: the session's main conversation or a child thread.
        target: TargetId,
        /// What the window takes.
        protocol: LiveProtocol,
    },
    /// A window closes: [`Reply::Done`].
    Unsubscribe {
        /// The window.
        window: WindowId,
    },
    /// A phone joins a session: it holds interest, and gets the session's replay
    /// ([`Reply::Replay`]).
    Join {
        /// The app session it concerns.
        session: SessionId,
        /// What the relay's phones take.
        protocol: LiveProtocol,
    },
    /// A phone leaves a session: [`Reply::Done`]. The session keeps the relay's interest
    /// while another phone that joined it has not left.
    Leave {
        /// The app session it concerns.
        session: SessionId,
    },
    /// `run.list`: every active run, after the stale reclaim (OB-14): [`Reply::Runs`].
    ListRuns,
    /// `run.chatListSessions`: every session this host serves: [`Reply::Sessions`].
    ListSessions,
    /// `session.page`: a page of the session's event log, packed (PK-01, PK-02):
    /// [`Reply::SessionPage`]. Without `before` it is the newest page, the opening
    /// snapshot of a client that then follows the session's live events.
    SessionPage {
        /// The app session it concerns.
        session: SessionId,
        /// `beforeSeq`: the page ends right before this sequence number (`None`: the
        /// newest page).
        before: Option<u64>,
        /// `maxEvents`: about how many logical events (the page widens to the start
        /// of the message it would cut); at most [`crate::MAX_PAGE_EVENTS`].
        max_events: usize,
    },
    /// `run.chatNewSession`: a new session, made by the embedder
    /// ([`HostEffect::OpenSession`]): [`Reply::SessionOpened`].
    NewSession(NewSession),
}

/// A new session a client asks for ([`ClientRequest::NewSession`]). Every field is what
/// the client would like; the embedder that makes the session decides.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct NewSession {
    /// The agent to run it, when the client names one.
    pub agent: Option<timeline_core::key::AgentKind>,
    /// Where its agent is to work, when the client names it.
    pub cwd: Option<String>,
    /// Its title, when the client gives one.
    pub title: Option<String>,
}

impl NewSession {
    /// A request that leaves every choice to the embedder.
    pub fn new() -> NewSession {
        NewSession::default()
    }

    /// Names the agent.
    #[must_use]
    pub fn agent(mut self, agent: timeline_core::key::AgentKind) -> NewSession {
        self.agent = Some(agent);
        self
    }

    /// Names the directory its agent works in.
    #[must_use]
    pub fn cwd(mut self, cwd: impl Into<String>) -> NewSession {
        self.cwd = Some(cwd.into());
        self
    }

    /// Gives it a title.
    #[must_use]
    pub fn title(mut self, title: impl Into<String>) -> NewSession {
        self.title = Some(title.into());
        self
    }
}

/// Why no new session was made ([`Reply::SessionOpened`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NewSessionError {
    /// This host makes no sessions on request: its sessions are the embedder's.
    #[error("this host does not make new sessions on request")]
    NotOffered,
    /// The embedder refused, in its words.
    #[error("the new session was refused: {0}")]
    Refused(String),
    /// The embedder named a session it did not add to the host.
    #[error("session {0} was named but not added to the host")]
    NotAdded(SessionId),
}

/// An answer from the agent, or something the agent did.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum AgentInput {
    /// The result of [`AgentCall::Send`].
    SendResult {
        /// The attempt the call named.
        attempt: AttemptId,
        /// The result.
        result: SendResult,
    },
    /// The result of [`AgentCall::ReadHistory`].
    HistoryRead {
        /// The attempt the call named.
        attempt: AttemptId,
        /// What the read found.
        read: HistoryRead,
    },
    /// The result of [`AgentCall::Stop`].
    StopResult {
        /// The attempt the call named.
        attempt: AttemptId,
        /// The result.
        result: StopResult,
    },
    /// The result of [`AgentCall::TakeBack`].
    TakeBack {
        /// The attempt the call named.
        attempt: AttemptId,
        /// The result.
        result: TakeBackResult,
    },
    /// The agent's stream proved an operation delivered (Codex: the `userMessage` echo
    /// with its `clientId`; Claude: the replayed echo).
    DeliveryProof {
        /// The app session it concerns.
        session: SessionId,
        /// The operation.
        operation_id: OperationId,
    },
    /// The agent rolled back its latest turn for a replace latest (OB-11, OV-10), or
    /// asked to and may have: said when the rollback is written, before the send's
    /// result. Custody sends the message without a rollback from then on, and the host
    /// tells every client that history lost rows.
    RolledBack {
        /// The app session it concerns.
        session: SessionId,
        /// The operation of the replace latest.
        operation_id: OperationId,
    },
    /// The agent published live rows of a target (new or updated; same key replaces).
    Rows {
        /// The app session it concerns.
        session: SessionId,
        /// The timeline target: the session's main conversation or a child thread.
        target: TargetId,
        /// The rows.
        rows: Vec<StoredBlock>,
    },
    /// The agent still works on a run (the stale reclaim leaves it alone).
    RunActive {
        /// The app session it concerns.
        session: SessionId,
        /// The run it concerns.
        run: RunId,
    },
    /// A fragment the agent streamed (text, reasoning, a tool call's input): logged
    /// with the session's next sequence number for `session.page` (PK-01) and sent on
    /// live, scalar, to the session's windows and the relay.
    Delta {
        /// The app session it concerns.
        session: SessionId,
        /// The fragment.
        fragment: crate::Fragment,
    },
    /// A run ended.
    RunEnded {
        /// The app session it concerns.
        session: SessionId,
        /// The run it concerns.
        run: RunId,
        /// Completed, failed or aborted.
        outcome: RunEventKind,
        /// Accepted steers the run did not take.
        untaken: Vec<OperationId>,
    },
    /// The agent called `send_session_message` (OB-16): the message is saved in the
    /// recipient's outbox and the tool's result goes back as
    /// [`AgentCall::SessionMessageResult`].
    SessionMessage(SessionMessageCall),
    /// The agent asks for an approval (RW-06).
    ApprovalAsked {
        /// The app session it concerns.
        session: SessionId,
        /// The target whose timeline shows the card.
        target: TargetId,
        /// The run that asks.
        run: Option<RunId>,
        /// The request.
        request: ApprovalRequest,
        /// The context line of the card (the command, the reason).
        summary: String,
    },
    /// The agent's answer to [`AgentCall::ResolveApproval`], or a request settled
    /// elsewhere (`serverRequest/resolved` with no decision from here:
    /// [`ApprovalResult::ResolvedExternally`]).
    ApprovalResolved {
        /// `requestId`: the approval request.
        request_id: String,
        /// `threadId`: the thread that asked.
        thread_id: String,
        /// `turnId`: the turn that asked.
        turn_id: String,
        /// `itemId`: the item the approval is for.
        item_id: String,
        /// `Ok`: the result the agent took. `Err`: the agent did not take the decision
        /// (its text); the card stays pending and may be decided again.
        result: Result<ApprovalResult, String>,
    },
}

impl AgentInput {
    /// The [`AgentInput::Delta`] of a delta event an agent's projector built (the host
    /// numbers and times what it logs; the event's own `seq` and `time` are not kept).
    /// `None` for an event that is not a delta.
    pub fn delta(
        session: &SessionId,
        event: timeline_core::history::SessionEvent,
    ) -> Option<AgentInput> {
        crate::Fragment::of_event(event).map(|fragment| AgentInput::Delta {
            session: session.clone(),
            fragment,
        })
    }
}

/// Work for the agent. Each is answered with the [`AgentInput`] its doc names.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AgentCall {
    /// Hand a message to the agent: [`AgentInput::SendResult`].
    Send(SendRequest),
    /// Look for an operation in the agent's history: [`AgentInput::HistoryRead`].
    ReadHistory(ReadHistoryRequest),
    /// Stop a run: [`AgentInput::StopResult`].
    Stop(StopRequest),
    /// Take back an accepted steer: [`AgentInput::TakeBack`].
    TakeBack(TakeBackRequest),
    /// Answer an approval with a decision: [`AgentInput::ApprovalResolved`].
    ResolveApproval {
        /// The app session it concerns.
        session: SessionId,
        /// The request.
        request: ApprovalRequest,
        /// The decision (allowed by the request).
        decision: Decision,
    },
    /// The result of the agent's `send_session_message` call, to return to the tool call.
    /// A store failure is [`ToolResult::Error`] with the store's words: the message was
    /// not saved, and the model learns it.
    SessionMessageResult {
        /// The calling session.
        session: SessionId,
        /// The tool call.
        call_id: CallId,
        /// What the tool returns.
        result: ToolResult,
    },
    /// Replace latest found the thread gone: forget the session's thread link.
    ClearThreadLink {
        /// The app session it concerns.
        session: SessionId,
    },
}

/// The answer to one [`ClientRequest`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Reply {
    /// [`ClientRequest::Submit`].
    Submitted(Result<Receipt, SubmitError>),
    /// [`ClientRequest::Edit`].
    Edited(Result<Receipt, ActionError>),
    /// Remove, reorder, send now, stop and send now, unsubscribe, leave.
    Done(Result<(), ActionError>),
    /// [`ClientRequest::Stop`].
    Stop(StopAnswer),
    /// [`ClientRequest::LatestWindow`] and [`ClientRequest::Anchored`].
    LatestWindow(Result<TimelineWindow, LoadError>),
    /// [`ClientRequest::OlderPage`].
    OlderPage(Result<OlderPage, LoadError>),
    /// [`ClientRequest::ResolveApproval`]: the result the agent took.
    Approval(Result<ApprovalResult, ApprovalError>),
    /// [`ClientRequest::Subscribe`]: the saved overlay the window starts from, tagged.
    Subscribed(Result<overlay_core::live::Subscription, OverlayError>),
    /// [`ClientRequest::Join`]: the session's replay, in order.
    Replay(Vec<ReplayChunk>),
    /// [`ClientRequest::ReconcileSessions`]: one snapshot per session, in request order.
    Reconciled(Result<Vec<overlay_core::window::SessionSnapshot>, LoadError>),
    /// [`ClientRequest::ListRuns`]: each active run with its session.
    Runs(Vec<(SessionId, RunId)>),
    /// [`ClientRequest::ListSessions`]: each session served here, in session order.
    Sessions(Vec<SessionSummary>),
    /// [`ClientRequest::SessionPage`].
    SessionPage(Result<crate::SessionPage, LoadError>),
    /// [`ClientRequest::NewSession`]: the session made, served here from now on.
    SessionOpened(Result<SessionId, NewSessionError>),
}

/// A session as [`ClientRequest::ListSessions`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionSummary {
    /// The app session.
    pub session: SessionId,
    /// Its agent.
    pub agent: timeline_core::key::AgentKind,
    /// Its title (empty when it has none).
    pub title: String,
    /// The directory its agent works in, when the embedder said
    /// ([`outbox_core::custody::SessionInfo::cwd`]).
    pub cwd: Option<String>,
    /// Its active run, if one runs.
    pub active_run: Option<RunId>,
}

/// Why a load failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The host knows no history source for this target.
    #[error("no history source for target {target} of session {session}")]
    UnknownTarget {
        /// The app session it concerns.
        session: SessionId,
        /// The timeline target: the session's main conversation or a child thread.
        target: TargetId,
    },
    /// The builder's error (its `errorCode` is [`WindowError::error_code`]).
    #[error(transparent)]
    Window(#[from] WindowError),
    /// A page of the session's event log could not be packed (a sequence number or a
    /// time past `2^53 - 1`): `HISTORY_UNAVAILABLE`.
    #[error("the event log of session {session} could not be paged: {error}")]
    Events {
        /// The app session it concerns.
        session: SessionId,
        /// Why the page was refused.
        error: timeline_core::history::RowError,
    },
    /// The outbox of a session could not be read (a reconcile answers no session then).
    #[error("the outbox of session {session} could not be read: {error}")]
    Outbox {
        /// The app session it concerns.
        session: SessionId,
        /// What the store said.
        error: outbox_core::store::OutboxError,
    },
}

impl LoadError {
    /// The stable `errorCode` a client receives: the builder's own code, or
    /// `UNKNOWN_TARGET` and `OUTBOX_UNAVAILABLE`.
    pub fn error_code(&self) -> &'static str {
        match self {
            LoadError::UnknownTarget { .. } => "UNKNOWN_TARGET",
            LoadError::Window(e) => e.error_code(),
            LoadError::Outbox { .. } => "OUTBOX_UNAVAILABLE",
            LoadError::Events { .. } => "HISTORY_UNAVAILABLE",
        }
    }

    /// What a client's timeline is told ([`timeline_core::timeline::LoadFailure`]): too
    /// large, a refused cursor or anchor, or unavailable.
    pub fn load_failure(&self) -> timeline_core::timeline::LoadFailure {
        use timeline_core::timeline::LoadFailure;
        match self {
            LoadError::Window(e) => match e.error_code() {
                timeline_core::policy::SNAPSHOT_TOO_LARGE_CODE => LoadFailure::SnapshotTooLarge,
                overlay_core::window::INVALID_CURSOR_CODE => LoadFailure::Invalid,
                _ => LoadFailure::Unavailable,
            },
            _ => LoadFailure::Unavailable,
        }
    }
}

/// Why an approval decision was not taken.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ApprovalError {
    /// No open request has this identity (never asked, or asked before a restart whose
    /// card the overlay store did not keep).
    #[error("no open approval request has this ID")]
    Unknown,
    /// "The desktop refuses a decision that is not in that list." (RW-06)
    #[error("the decision {0:?} is not allowed for this request")]
    NotAllowed(Decision),
    /// Another device decided first. `result` is the decision taken, or `None` while
    /// the agent is still taking it; the decided card follows on the live path.
    #[error("this approval request was already resolved")]
    AlreadyResolved {
        /// The result taken, once the agent took it.
        result: Option<ApprovalResult>,
    },
    /// The agent did not take the decision (its text); the card stays pending.
    #[error("the agent did not take the decision: {0}")]
    Refused(String),
    /// The card with the decision could not be saved, so the decision was not sent;
    /// the card stays pending and any device may decide again.
    #[error("the decision could not be saved, so it was not sent: {0}")]
    Unsaved(String),
}

impl ApprovalError {
    /// The stable `errorCode` a client receives.
    pub fn error_code(&self) -> &'static str {
        match self {
            ApprovalError::Unknown => "APPROVAL_UNKNOWN",
            ApprovalError::NotAllowed(_) => "DECISION_NOT_ALLOWED",
            ApprovalError::AlreadyResolved { .. } => "APPROVAL_ALREADY_RESOLVED",
            ApprovalError::Refused(_) => "AGENT_REFUSED",
            ApprovalError::Unsaved(_) => "DECISION_UNSAVED",
        }
    }
}

/// Something the user should see, or the embedder should log: failures the host met
/// outside a caller's request, and refusals from the agent side. No failure is dropped.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Notice {
    /// The outbox store refused a change; custody retries it (see
    /// `outbox_core::custody`).
    OutboxStoreFailed(StoreFailure),
    /// The overlay store refused a live write: the rows were not saved, so they were not
    /// sent either ("the producer saves first and sends the saved snapshot"). They reach
    /// clients from history once the agent saves them.
    OverlayWriteFailed {
        /// The app session it concerns.
        session: SessionId,
        /// The timeline target: the session's main conversation or a child thread.
        target: TargetId,
        /// What the store said.
        error: OverlayError,
    },
    /// The write that tells a session's clients its history lost rows (OV-10) was
    /// refused: the rows of the turn that left stay until it is tried again after a
    /// second (a restart meanwhile forgets it; the rows then stay in the overlay).
    HistoryRewriteFailed {
        /// The app session it concerns.
        session: SessionId,
        /// The timeline target: the session's main conversation or a child thread.
        target: TargetId,
        /// What the store said.
        error: OverlayError,
    },
    /// The cleanup journal could not be written or read; the exact scans of the run go
    /// on, but a restart will not repeat them. At start (no session, no run): the
    /// journal could not be read, so no restart repair runs.
    JournalFailed {
        /// The app session it concerns.
        session: Option<SessionId>,
        /// The run it concerns.
        run: Option<RunId>,
        /// What the store said.
        error: OverlayError,
    },
    /// An exact scan could not read or settle the overlays; it counts as a miss and the
    /// next scan of the schedule tries again (OV-06). Snapshots saved before the failure
    /// were sent.
    ScanFailed {
        /// The app session it concerns.
        session: SessionId,
        /// The run it concerns.
        run: RunId,
        /// What the store said.
        error: OverlayError,
    },
    /// The replay buffer refused an event or running state the host built (a defect:
    /// reported, not hidden); the replay goes without it.
    ReplayRefused {
        /// The app session it concerns.
        session: SessionId,
        /// Why, in words for the user or the log.
        error: String,
    },
    /// An effect of an inner machine this version of the host does not know.
    Unknown(String),
    /// The exact scans of a run ended with rows still unsettled; they settle at the next
    /// latest window or restart repair.
    ScanGaveUp {
        /// The app session it concerns.
        session: SessionId,
        /// The run it concerns.
        run: RunId,
    },
    /// The relay refused a payload the host built (a defect: reported, not hidden).
    RelayRefused {
        /// The app session it concerns.
        session: SessionId,
        /// Why, in words for the user or the log.
        error: RelayError,
    },
    /// The run registry refused to start a run for the queue's head.
    RunRefused {
        /// The app session it concerns.
        session: SessionId,
        /// The operation that would have started it.
        operation_id: OperationId,
        /// The seed's text.
        error: RunError,
    },
    /// A take-back was refused: the entry stays with its run.
    TakeBackRefused {
        /// The app session it concerns.
        session: SessionId,
        /// The operation of the message.
        operation_id: OperationId,
        /// Why, in words for the user or the log.
        reason: String,
    },
    /// The approval cards of a target could not be read at start: a card asked before
    /// the restart is not known again, so deciding it answers
    /// [`ApprovalError::Unknown`] and the agent's resolution leaves it as it shows.
    CardsUnread {
        /// Session.
        session: SessionId,
        /// Target.
        target: TargetId,
        /// What the store said.
        error: OverlayError,
    },
    /// A session message's delivery changed: the sender's row shows it.
    RouteDeliveryChanged {
        /// The message.
        operation_id: OperationId,
        /// The sender's session.
        sender_session: SessionId,
        /// The new delivery.
        delivery: RouteDelivery,
    },
    /// This host let a session scope go: its lease was lost (expired, or another host
    /// took the scope over) or [`crate::Host::release_session`] was called. Its clients
    /// must be told to load it from the host that serves it now.
    SessionReleased {
        /// The base session of the scope.
        session: SessionId,
        /// Why, in words for the user or the log.
        reason: String,
    },
}

/// How much a [`Notice`] matters, for a log level or what a user is shown. Ordered:
/// `Info < Warning < Error < Defect`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Severity {
    /// News, nothing failed (a session message's delivery changed).
    Info,
    /// The agent side refused or gave up on something the host goes on without (a run
    /// refused, a take-back refused, scans that ended with rows unsettled).
    Warning,
    /// A store failed: something is not saved yet, or will not be repeated after a
    /// restart. The host retries what it can.
    Error,
    /// The host built something an inner machine refused, or met an effect it does not
    /// know: a defect of this library, reported rather than hidden.
    Defect,
}

impl Notice {
    /// How much it matters.
    pub fn severity(&self) -> Severity {
        match self {
            Notice::RouteDeliveryChanged { .. } => Severity::Info,
            Notice::ScanGaveUp { .. }
            | Notice::RunRefused { .. }
            | Notice::TakeBackRefused { .. }
            | Notice::SessionReleased { .. } => Severity::Warning,
            Notice::OutboxStoreFailed(_)
            | Notice::OverlayWriteFailed { .. }
            | Notice::HistoryRewriteFailed { .. }
            | Notice::JournalFailed { .. }
            | Notice::ScanFailed { .. }
            | Notice::CardsUnread { .. } => Severity::Error,
            Notice::ReplayRefused { .. } | Notice::RelayRefused { .. } | Notice::Unknown(_) => {
                Severity::Defect
            }
        }
    }

    /// The app session it concerns, when one.
    pub fn session(&self) -> Option<&SessionId> {
        match self {
            Notice::OutboxStoreFailed(f) => Some(&f.session),
            Notice::OverlayWriteFailed { session, .. }
            | Notice::HistoryRewriteFailed { session, .. }
            | Notice::ScanFailed { session, .. }
            | Notice::ReplayRefused { session, .. }
            | Notice::ScanGaveUp { session, .. }
            | Notice::RelayRefused { session, .. }
            | Notice::RunRefused { session, .. }
            | Notice::TakeBackRefused { session, .. }
            | Notice::CardsUnread { session, .. }
            | Notice::SessionReleased { session, .. } => Some(session),
            Notice::RouteDeliveryChanged { sender_session, .. } => Some(sender_session),
            Notice::JournalFailed { session, .. } => session.as_ref(),
            Notice::Unknown(_) => None,
        }
    }
}

/// One line for a log: what happened, where, and what the store or agent said. Says
/// only what is known (a retry is "will be tried again", never "saved").
impl std::fmt::Display for Notice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Notice::OutboxStoreFailed(failure) => {
                write!(f, "the outbox of session {} could not be written", failure.session)?;
                if let Some(op) = &failure.operation_id {
                    write!(f, " (operation {op})")?;
                }
                write!(f, ": {}", failure.error)?;
                match failure.retry_at {
                    Some(at) => write!(f, "; tried again at {} ms", at.as_u64()),
                    None => write!(f, "; kept in memory until the store takes it"),
                }
            }
            Notice::OverlayWriteFailed {
                session,
                target,
                error,
            } => write!(
                f,
                "live rows of session {session}, target {target} were not saved (so not sent): {error}"
            ),
            Notice::HistoryRewriteFailed {
                session,
                target,
                error,
            } => write!(
                f,
                "the rows that left the history of session {session}, target {target} are still shown (tried again in 1 s): {error}"
            ),
            Notice::JournalFailed {
                session: Some(session),
                run,
                error,
            } => {
                write!(f, "the cleanup journal of session {session}")?;
                if let Some(run) = run {
                    write!(f, ", run {run}")?;
                }
                write!(f, " could not be written; a restart will not repeat its scans: {error}")
            }
            Notice::JournalFailed { error, .. } => write!(
                f,
                "the cleanup journal could not be read at start; no restart repair runs: {error}"
            ),
            Notice::ScanFailed {
                session,
                run,
                error,
            } => write!(
                f,
                "an exact scan of session {session}, run {run} failed and counts as a miss: {error}"
            ),
            Notice::ReplayRefused { session, error } => write!(
                f,
                "defect: the replay of session {session} refused an event the host built: {error}"
            ),
            Notice::Unknown(what) => write!(f, "defect: an effect the host does not know: {what}"),
            Notice::SessionReleased { session, reason } => write!(
                f,
                "this host no longer serves session {session}; another host does: {reason}"
            ),
            Notice::ScanGaveUp { session, run } => write!(
                f,
                "the exact scans of session {session}, run {run} ended with rows unsettled; the next latest window settles them"
            ),
            Notice::RelayRefused { session, error } => write!(
                f,
                "defect: the relay refused a payload of session {session}: {error}"
            ),
            Notice::RunRefused {
                session,
                operation_id,
                error,
            } => write!(
                f,
                "no run was started in session {session} for operation {operation_id}: {error}"
            ),
            Notice::TakeBackRefused {
                session,
                operation_id,
                reason,
            } => write!(
                f,
                "the agent of session {session} did not give back operation {operation_id}: {reason}"
            ),
            Notice::CardsUnread {
                session,
                target,
                error,
            } => write!(
                f,
                "the approval cards of session {session}, target {target} could not be read at start: {error}"
            ),
            Notice::RouteDeliveryChanged {
                operation_id,
                sender_session,
                delivery,
            } => {
                let shown = match delivery {
                    RouteDelivery::Sent => "sent",
                    RouteDelivery::NeedsApproval => "waiting for approval",
                    RouteDelivery::Declined => "declined",
                };
                write!(
                    f,
                    "the session message {operation_id} from session {sender_session} is {shown}"
                )
            }
        }
    }
}

/// What the host wants done outside. Drain with [`crate::Host::poll_effect`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum HostEffect {
    /// Work for the agent of a session.
    Agent(AgentCall),
    /// Live delivery to a desktop window, the progress sink or the relay.
    Deliver(Delivery),
    /// The answer to a client request.
    Reply {
        /// Who asked.
        to: ReplyTo,
        /// The answer.
        reply: Reply,
    },
    /// A failure or refusal to show or log.
    Notice(Notice),
    /// A client asks for a new session ([`ClientRequest::NewSession`]). The embedder
    /// makes it (its agent, its history source, [`crate::Host::add_session`]) or
    /// refuses, then answers with [`crate::Host::handle_session_opened`]. An embedder
    /// that makes no sessions answers [`NewSessionError::NotOffered`].
    OpenSession {
        /// Who asked.
        to: ReplyTo,
        /// What was asked for.
        request: NewSession,
    },
}
