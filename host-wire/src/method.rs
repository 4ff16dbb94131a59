//! The methods a client calls, with the seed's names and parameter names, and what each
//! becomes for the host ([`Call::into_client_request`]).
//!
//! The seed names the loads, the reconcile, stop and send now, `run.cancel`, `run.list`
//! and `run.chatResolveApproval`. It leaves the other outbox commands and a phone's join
//! and leave unnamed; they are named here in the same style: `run.chatOutboxSubmit`,
//! `run.chatOutboxEdit`, `run.chatOutboxRemove`, `run.chatOutboxReorder`,
//! `run.chatOutboxSendNow`, `run.chatJoin`, `run.chatLeave`, `run.chatListSessions`,
//! `run.chatNewSession`. Seed 002 names `session.page`, which is served under that name
//! (wire version 4); its opening `session.follow` snapshot is `session.page` without
//! `beforeSeq`, and the live events come as `session-event`s on the stream the client
//! already holds.

use outbox_core::entry::{Controls, Intent, MessageRequest, SendMode};
use outbox_core::ids::{IdempotencyKey, OperationId, QueueId};
use overlay_core::live::LiveProtocol;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use timeline_core::anchor::Anchor;
use timeline_core::cursor::BoundaryToken;
use timeline_core::key::{RunId, SessionId, TargetId};
use timeline_core::policy::{
    INITIAL_PAGE_SIZE, OLDER_PAGE_SIZE, RECONCILE_MAX_SESSIONS, RPC_DECODER_MAX_PAGE_SIZE,
};
use timeline_core::rows::Decision;

use crate::error::WireError;

/// The longest `beforeCursor` the decoder takes, in characters. The host refuses a
/// Claude cursor past 4,096 characters itself (`INVALID_PARAMS`); this bound keeps any
/// cursor from costing more than a small, fixed amount before the host reads it.
pub const MAX_CURSOR_CHARS: usize = 16_384;

/// `run.chatLoad`: the latest window of a session's main conversation, or an anchored
/// window when `anchor` is set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChatLoadParams {
    /// The app session.
    pub app_session_id: SessionId,
    /// Rows asked for: decoded up to 640, served up to 100; 12 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_size: Option<u64>,
    /// Where to open (an anchored load opens 40 rows whatever `pageSize` says).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anchor: Option<Anchor>,
}

/// `run.chatLoadThread`: as `run.chatLoad`, for a child thread or subagent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChatLoadThreadParams {
    /// The app session.
    pub app_session_id: SessionId,
    /// The thread or subagent: the timeline target.
    pub thread_id: TargetId,
    /// Rows asked for: decoded up to 640, served up to 100; 12 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_size: Option<u64>,
    /// Where to open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anchor: Option<Anchor>,
}

/// `run.chatLoadPageBefore`: the page older than a cursor, in the main conversation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChatLoadPageBeforeParams {
    /// The app session.
    pub app_session_id: SessionId,
    /// Rows asked for: decoded up to 640, served up to 100; 100 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_size: Option<u64>,
    /// The `oldestCursor` of the previous answer.
    pub before_cursor: String,
    /// The `boundaryToken` the client holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_boundary_token: Option<BoundaryToken>,
}

/// `run.chatLoadThreadPageBefore`: as `run.chatLoadPageBefore`, for a child thread.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChatLoadThreadPageBeforeParams {
    /// The app session.
    pub app_session_id: SessionId,
    /// The thread or subagent: the timeline target.
    pub thread_id: TargetId,
    /// Rows asked for: decoded up to 640, served up to 100; 100 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_size: Option<u64>,
    /// The `oldestCursor` of the previous answer.
    pub before_cursor: String,
    /// The `boundaryToken` the client holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_boundary_token: Option<BoundaryToken>,
}

/// `run.chatReconcileSessions`: at most 16 sessions, each answered with its latest
/// window, overlay, outbox and active run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChatReconcileSessionsParams {
    /// The app sessions, in the order of the answer.
    pub app_session_ids: Vec<SessionId>,
}

/// `run.chatOutboxSubmit`: save a message (the receipt is custody, not a turn).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChatOutboxSubmitParams {
    /// The app session that owns the outbox.
    pub app_session_id: SessionId,
    /// The visible entry.
    pub queue_id: QueueId,
    /// The message operation.
    pub operation_id: OperationId,
    /// The message: `userText`, `promptText`, `attachments`, `threadId`, `speedMode`,
    /// `accessMode`, `expectedModel`, `expectedEffort`, `rollbackBeforeSend`, `source`,
    /// `createdAt`.
    #[serde(flatten)]
    pub message: MessageRequest,
    /// Where the message goes.
    pub intent: Intent,
    /// How it meets an active run.
    pub send_mode: SendMode,
    /// The run a steer joins (`steer-running` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_active_run_id: Option<RunId>,
    /// The remote mutation request: the same key again gets the same answer.
    pub idempotency_key: IdempotencyKey,
}

/// `run.chatOutboxEdit`: replace a queued message's text; it keeps its `queueId` and its
/// place and takes a new `operationId`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChatOutboxEditParams {
    /// The app session that owns the outbox.
    pub app_session_id: SessionId,
    /// The entry.
    pub queue_id: QueueId,
    /// The operation of the edited message.
    pub new_operation_id: OperationId,
    /// The edited message.
    #[serde(flatten)]
    pub message: MessageRequest,
    /// The remote mutation request.
    pub idempotency_key: IdempotencyKey,
}

/// `run.chatOutboxRemove`, `run.chatOutboxSendNow` and `run.chatOutboxStopAndSendNow`:
/// a command on one entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OutboxEntryParams {
    /// The app session that owns the outbox.
    pub app_session_id: SessionId,
    /// The entry.
    pub queue_id: QueueId,
    /// The remote mutation request.
    pub idempotency_key: IdempotencyKey,
}

/// `run.chatOutboxReorder` (wire version 2): move a queued entry just before another
/// queued entry, or to the back of the queue; its text, operation and controls stay.
/// A sending entry is neither moved nor passed (`ENTRY_BLOCKED`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChatOutboxReorderParams {
    /// The app session that owns the outbox.
    pub app_session_id: SessionId,
    /// The entry moved.
    pub queue_id: QueueId,
    /// The queued entry it goes before; absent for the back of the queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_queue_id: Option<QueueId>,
    /// The remote mutation request.
    pub idempotency_key: IdempotencyKey,
}

/// `run.cancel`: stop the session's active run (queued messages stay).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CancelParams {
    /// The app session.
    pub app_session_id: SessionId,
    /// The remote mutation request.
    pub idempotency_key: IdempotencyKey,
}

/// `run.list`: no parameters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ListParams {}

/// `run.chatListSessions` (wire version 2): every session the host serves; no
/// parameters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ChatListSessionsParams {}

/// `session.page` (wire version 4): a page of the session's event log, packed into
/// records (PK-01, PK-02). Without `beforeSeq` it is the newest page: the opening
/// snapshot of a client that then follows the `session-event`s of `chat:timeline-updated`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionPageParams {
    /// The app session.
    pub app_session_id: SessionId,
    /// The page ends right before this sequence number (the first record's `seq` of
    /// the page before it); the newest page when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_seq: Option<u64>,
    /// About how many logical events, from 1 to [`MAX_SESSION_PAGE_EVENTS`]
    /// ([`SESSION_PAGE_EVENTS`] when absent); the page widens back to the start of the
    /// message it would cut.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 500_000))]
    pub max_events: Option<u64>,
}

/// The most logical events one `session.page` may ask for.
pub const MAX_SESSION_PAGE_EVENTS: usize = host_core::MAX_PAGE_EVENTS;

/// The events of a `session.page` that names no `maxEvents`.
pub const SESSION_PAGE_EVENTS: usize = 10_000;

/// The longest `cwd` of `run.chatNewSession`, in bytes (Linux's `PATH_MAX`).
pub const MAX_NEW_SESSION_CWD_BYTES: usize = 4_096;

/// The longest `title` of `run.chatNewSession`, in characters.
pub const MAX_NEW_SESSION_TITLE_CHARS: usize = 1_024;

/// `run.chatNewSession` (wire version 3): a new session, made by the host's embedder,
/// which decides what each field becomes. The answer names its `appSessionId`; a host
/// that makes no sessions on request answers `SESSION_NOT_CREATED`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChatNewSessionParams {
    /// The agent to run it: `codex`, `claude` or `acp`; the host's choice when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<timeline_core::key::AgentKind>,
    /// Where its agent is to work: at most 4,096 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Its title: at most 1,024 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The remote mutation request: a retry answers with the same session.
    pub idempotency_key: IdempotencyKey,
}

/// `run.chatResolveApproval`: a decision for an approval card. It carries no session ID.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChatResolveApprovalParams {
    /// The approval request.
    pub request_id: String,
    /// The thread that asked.
    pub thread_id: String,
    /// The turn that asked.
    pub turn_id: String,
    /// The item the approval is for.
    pub item_id: String,
    /// The decision (one the request allows).
    pub decision: Decision,
    /// The remote mutation request.
    pub idempotency_key: IdempotencyKey,
}

/// How a phone takes `blocks` updates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum LiveUpdates {
    /// Whole snapshots only (the seed's protocol).
    #[default]
    Snapshots,
    /// Whole snapshots, and `blocks-patch` from a snapshot the phone holds.
    Patches,
}

/// `run.chatJoin`: a phone holds interest in a session and gets its replay.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChatJoinParams {
    /// The app session.
    pub app_session_id: SessionId,
    /// How the phone takes `blocks` updates; snapshots when absent.
    #[serde(default)]
    pub live_updates: LiveUpdates,
    /// Wire version 4: also take the streamed fragments as they come (`session-event`
    /// of `chat:timeline-updated`; off when absent; once a join of the connection asked,
    /// until it leaves the session). A fragment is queued only while the connection's
    /// queue is under half its bounds, and one with no room is not sent: the client's
    /// journal, seeing the gap in `seq`, pages it with `session.page` (fragments missed
    /// at a reply's end show no gap; the reply's row carries their words).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub session_events: bool,
}

/// `run.chatLeave`: a phone leaves a session.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChatLeaveParams {
    /// The app session.
    pub app_session_id: SessionId,
}

/// One request a client sends: the method and its params (JSON-RPC `method` and
/// `params`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "method", content = "params")]
#[non_exhaustive]
pub enum Call {
    /// `run.chatLoad`.
    #[serde(rename = "run.chatLoad")]
    ChatLoad(ChatLoadParams),
    /// `run.chatLoadThread`.
    #[serde(rename = "run.chatLoadThread")]
    ChatLoadThread(ChatLoadThreadParams),
    /// `run.chatLoadPageBefore`.
    #[serde(rename = "run.chatLoadPageBefore")]
    ChatLoadPageBefore(ChatLoadPageBeforeParams),
    /// `run.chatLoadThreadPageBefore`.
    #[serde(rename = "run.chatLoadThreadPageBefore")]
    ChatLoadThreadPageBefore(ChatLoadThreadPageBeforeParams),
    /// `run.chatReconcileSessions`.
    #[serde(rename = "run.chatReconcileSessions")]
    ChatReconcileSessions(ChatReconcileSessionsParams),
    /// `run.chatOutboxSubmit`.
    #[serde(rename = "run.chatOutboxSubmit")]
    ChatOutboxSubmit(ChatOutboxSubmitParams),
    /// `run.chatOutboxEdit`.
    #[serde(rename = "run.chatOutboxEdit")]
    ChatOutboxEdit(ChatOutboxEditParams),
    /// `run.chatOutboxRemove`.
    #[serde(rename = "run.chatOutboxRemove")]
    ChatOutboxRemove(OutboxEntryParams),
    /// `run.chatOutboxReorder`.
    #[serde(rename = "run.chatOutboxReorder")]
    ChatOutboxReorder(ChatOutboxReorderParams),
    /// `run.chatOutboxSendNow`.
    #[serde(rename = "run.chatOutboxSendNow")]
    ChatOutboxSendNow(OutboxEntryParams),
    /// `run.chatOutboxStopAndSendNow`.
    #[serde(rename = "run.chatOutboxStopAndSendNow")]
    ChatOutboxStopAndSendNow(OutboxEntryParams),
    /// `run.cancel`.
    #[serde(rename = "run.cancel")]
    Cancel(CancelParams),
    /// `run.list`.
    #[serde(rename = "run.list")]
    List(ListParams),
    /// `run.chatResolveApproval`.
    #[serde(rename = "run.chatResolveApproval")]
    ChatResolveApproval(ChatResolveApprovalParams),
    /// `run.chatJoin`.
    #[serde(rename = "run.chatJoin")]
    ChatJoin(ChatJoinParams),
    /// `run.chatLeave`.
    #[serde(rename = "run.chatLeave")]
    ChatLeave(ChatLeaveParams),
    /// `run.chatListSessions`.
    #[serde(rename = "run.chatListSessions")]
    ChatListSessions(ChatListSessionsParams),
    /// `session.page`.
    #[serde(rename = "session.page")]
    SessionPage(SessionPageParams),
    /// `run.chatNewSession`.
    #[serde(rename = "run.chatNewSession")]
    ChatNewSession(ChatNewSessionParams),
}

/// Every method name, in the order of [`Call`].
pub const METHODS: &[&str] = &[
    "run.chatLoad",
    "run.chatLoadThread",
    "run.chatLoadPageBefore",
    "run.chatLoadThreadPageBefore",
    "run.chatReconcileSessions",
    "run.chatOutboxSubmit",
    "run.chatOutboxEdit",
    "run.chatOutboxRemove",
    "run.chatOutboxReorder",
    "run.chatOutboxSendNow",
    "run.chatOutboxStopAndSendNow",
    "run.cancel",
    "run.list",
    "run.chatResolveApproval",
    "run.chatJoin",
    "run.chatLeave",
    "run.chatListSessions",
    "run.chatNewSession",
    "session.page",
];

/// Which dispatch cap a method has (the seed: 95 s around the 90 s handler deadline for
/// the two loads, 45 s for every other method, older pages included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DispatchClass {
    /// `run.chatLoad` and `run.chatLoadThread`.
    Load,
    /// Every other method.
    Other,
}

impl Call {
    /// The sessions the call is about, for a server that routes by session (several
    /// hosts): none for `run.list` and `run.chatResolveApproval`.
    pub fn sessions(&self) -> Vec<&SessionId> {
        match self {
            Call::ChatLoad(p) => vec![&p.app_session_id],
            Call::ChatLoadThread(p) => vec![&p.app_session_id],
            Call::ChatLoadPageBefore(p) => vec![&p.app_session_id],
            Call::ChatLoadThreadPageBefore(p) => vec![&p.app_session_id],
            Call::ChatReconcileSessions(p) => p.app_session_ids.iter().collect(),
            Call::ChatOutboxSubmit(p) => vec![&p.app_session_id],
            Call::ChatOutboxEdit(p) => vec![&p.app_session_id],
            Call::ChatOutboxReorder(p) => vec![&p.app_session_id],
            Call::ChatOutboxRemove(p)
            | Call::ChatOutboxSendNow(p)
            | Call::ChatOutboxStopAndSendNow(p) => vec![&p.app_session_id],
            Call::Cancel(p) => vec![&p.app_session_id],
            Call::ChatJoin(p) => vec![&p.app_session_id],
            Call::ChatLeave(p) => vec![&p.app_session_id],
            Call::SessionPage(p) => vec![&p.app_session_id],
            Call::List(_)
            | Call::ChatResolveApproval(_)
            | Call::ChatListSessions(_)
            | Call::ChatNewSession(_) => Vec::new(),
        }
    }

    /// The method name.
    pub fn method(&self) -> &'static str {
        match self {
            Call::ChatLoad(_) => "run.chatLoad",
            Call::ChatLoadThread(_) => "run.chatLoadThread",
            Call::ChatLoadPageBefore(_) => "run.chatLoadPageBefore",
            Call::ChatLoadThreadPageBefore(_) => "run.chatLoadThreadPageBefore",
            Call::ChatReconcileSessions(_) => "run.chatReconcileSessions",
            Call::ChatOutboxSubmit(_) => "run.chatOutboxSubmit",
            Call::ChatOutboxEdit(_) => "run.chatOutboxEdit",
            Call::ChatOutboxRemove(_) => "run.chatOutboxRemove",
            Call::ChatOutboxReorder(_) => "run.chatOutboxReorder",
            Call::ChatOutboxSendNow(_) => "run.chatOutboxSendNow",
            Call::ChatOutboxStopAndSendNow(_) => "run.chatOutboxStopAndSendNow",
            Call::Cancel(_) => "run.cancel",
            Call::List(_) => "run.list",
            Call::ChatResolveApproval(_) => "run.chatResolveApproval",
            Call::ChatJoin(_) => "run.chatJoin",
            Call::ChatLeave(_) => "run.chatLeave",
            Call::ChatListSessions(_) => "run.chatListSessions",
            Call::ChatNewSession(_) => "run.chatNewSession",
            Call::SessionPage(_) => "session.page",
        }
    }

    /// The dispatch cap that applies.
    pub fn dispatch_class(&self) -> DispatchClass {
        match self {
            Call::ChatLoad(_) | Call::ChatLoadThread(_) => DispatchClass::Load,
            _ => DispatchClass::Other,
        }
    }

    /// The idempotency key of a mutation; `None` for a read.
    pub fn idempotency_key(&self) -> Option<&IdempotencyKey> {
        match self {
            Call::ChatOutboxSubmit(p) => Some(&p.idempotency_key),
            Call::ChatOutboxEdit(p) => Some(&p.idempotency_key),
            Call::ChatOutboxReorder(p) => Some(&p.idempotency_key),
            Call::ChatOutboxRemove(p)
            | Call::ChatOutboxSendNow(p)
            | Call::ChatOutboxStopAndSendNow(p) => Some(&p.idempotency_key),
            Call::Cancel(p) => Some(&p.idempotency_key),
            Call::ChatResolveApproval(p) => Some(&p.idempotency_key),
            Call::ChatNewSession(p) => Some(&p.idempotency_key),
            _ => None,
        }
    }

    /// Checks the seed's limits the decoder owns: `pageSize` from 1 to 640, at most 16
    /// sessions per reconcile, a `beforeCursor` of at most [`MAX_CURSOR_CHARS`], no
    /// blank anchor token or row key, a new session's `cwd` and `title` within
    /// [`MAX_NEW_SESSION_CWD_BYTES`] and [`MAX_NEW_SESSION_TITLE_CHARS`]. Each refusal
    /// is `INVALID_PARAMS`.
    pub fn check_limits(&self) -> Result<(), WireError> {
        match self {
            Call::ChatLoad(p) => {
                check_page_size(p.page_size)?;
                check_anchor(p.anchor.as_ref())
            }
            Call::ChatLoadThread(p) => {
                check_page_size(p.page_size)?;
                check_anchor(p.anchor.as_ref())
            }
            Call::ChatLoadPageBefore(p) => {
                check_page_size(p.page_size)?;
                check_cursor(&p.before_cursor)
            }
            Call::ChatLoadThreadPageBefore(p) => {
                check_page_size(p.page_size)?;
                check_cursor(&p.before_cursor)
            }
            Call::SessionPage(p) => match p.max_events {
                Some(0) => Err(WireError::invalid_params("maxEvents must be at least 1")),
                Some(n) if n > MAX_SESSION_PAGE_EVENTS as u64 => Err(WireError::invalid_params(
                    format!("maxEvents must be at most {MAX_SESSION_PAGE_EVENTS}"),
                )),
                _ => Ok(()),
            },
            Call::ChatReconcileSessions(p) if p.app_session_ids.len() > RECONCILE_MAX_SESSIONS => {
                Err(WireError::invalid_params(format!(
                    "at most {RECONCILE_MAX_SESSIONS} sessions per call"
                )))
            }
            Call::ChatNewSession(p)
                if p.cwd
                    .as_ref()
                    .is_some_and(|c| c.len() > MAX_NEW_SESSION_CWD_BYTES) =>
            {
                Err(WireError::invalid_params(format!(
                    "cwd: at most {MAX_NEW_SESSION_CWD_BYTES} bytes"
                )))
            }
            Call::ChatNewSession(p)
                if p.title
                    .as_ref()
                    .is_some_and(|t| t.chars().count() > MAX_NEW_SESSION_TITLE_CHARS) =>
            {
                Err(WireError::invalid_params(format!(
                    "title: at most {MAX_NEW_SESSION_TITLE_CHARS} characters"
                )))
            }
            _ => Ok(()),
        }
    }

    /// What the host is asked. The limits are checked first ([`Call::check_limits`]);
    /// the host enforces its own (100 rows served, 256 outbox entries per reconciled
    /// session, 8 MiB, the Claude cursor's 4,096 characters).
    pub fn into_client_request(self) -> Result<host_core::ClientRequest, WireError> {
        use host_core::ClientRequest as R;
        self.check_limits()?;
        Ok(match self {
            Call::ChatLoad(p) => {
                let target = TargetId::main(&p.app_session_id);
                load(p.app_session_id, target, p.page_size, p.anchor)
            }
            Call::ChatLoadThread(p) => load(p.app_session_id, p.thread_id, p.page_size, p.anchor),
            Call::ChatLoadPageBefore(p) => R::OlderPage {
                target: TargetId::main(&p.app_session_id),
                session: p.app_session_id,
                cursor: p.before_cursor,
                page_size: page_size(p.page_size, OLDER_PAGE_SIZE),
                expected_boundary_token: p.expected_boundary_token,
            },
            Call::ChatLoadThreadPageBefore(p) => R::OlderPage {
                session: p.app_session_id,
                target: p.thread_id,
                cursor: p.before_cursor,
                page_size: page_size(p.page_size, OLDER_PAGE_SIZE),
                expected_boundary_token: p.expected_boundary_token,
            },
            Call::ChatReconcileSessions(p) => R::ReconcileSessions {
                sessions: p.app_session_ids,
            },
            Call::ChatOutboxSubmit(p) => R::Submit(outbox_core::custody::SubmitRequest {
                session: p.app_session_id,
                queue_id: p.queue_id,
                operation_id: p.operation_id,
                request: p.message,
                controls: Controls {
                    intent: p.intent,
                    send_mode: p.send_mode,
                    expected_active_run_id: p.expected_active_run_id,
                },
            }),
            Call::ChatOutboxEdit(p) => R::Edit {
                session: p.app_session_id,
                queue_id: p.queue_id,
                new_operation: p.new_operation_id,
                request: p.message,
            },
            Call::ChatOutboxRemove(p) => R::Remove {
                session: p.app_session_id,
                queue_id: p.queue_id,
            },
            Call::ChatOutboxReorder(p) => R::Reorder {
                session: p.app_session_id,
                queue_id: p.queue_id,
                before: p.before_queue_id,
            },
            Call::ChatOutboxSendNow(p) => R::SendNow {
                session: p.app_session_id,
                queue_id: p.queue_id,
            },
            Call::ChatOutboxStopAndSendNow(p) => R::StopAndSendNow {
                session: p.app_session_id,
                queue_id: p.queue_id,
            },
            Call::Cancel(p) => R::Stop {
                session: p.app_session_id,
            },
            Call::List(_) => R::ListRuns,
            Call::ChatListSessions(_) => R::ListSessions,
            Call::SessionPage(p) => R::SessionPage {
                session: p.app_session_id,
                before: p.before_seq,
                max_events: p.max_events.map_or(SESSION_PAGE_EVENTS, |n| {
                    usize::try_from(n).unwrap_or(MAX_SESSION_PAGE_EVENTS)
                }),
            },
            Call::ChatNewSession(p) => {
                let mut request = host_core::NewSession::new();
                request.agent = p.agent;
                request.cwd = p.cwd;
                request.title = p.title;
                R::NewSession(request)
            }
            Call::ChatResolveApproval(p) => R::ResolveApproval {
                request_id: p.request_id,
                thread_id: p.thread_id,
                turn_id: p.turn_id,
                item_id: p.item_id,
                decision: p.decision,
            },
            Call::ChatJoin(p) => R::Join {
                session: p.app_session_id,
                protocol: match p.live_updates {
                    LiveUpdates::Snapshots => LiveProtocol::Snapshots,
                    LiveUpdates::Patches => LiveProtocol::Patches,
                },
            },
            Call::ChatLeave(p) => R::Leave {
                session: p.app_session_id,
            },
        })
    }
}

fn load(
    session: SessionId,
    target: TargetId,
    size: Option<u64>,
    anchor: Option<Anchor>,
) -> host_core::ClientRequest {
    match anchor {
        Some(anchor) => host_core::ClientRequest::Anchored {
            session,
            target,
            anchor,
        },
        None => host_core::ClientRequest::LatestWindow {
            session,
            target,
            page_size: page_size(size, INITIAL_PAGE_SIZE),
        },
    }
}

/// A checked page size (at most 640, so it fits every `usize`).
fn page_size(size: Option<u64>, default: usize) -> usize {
    size.map_or(default, |n| {
        usize::try_from(n).unwrap_or(RPC_DECODER_MAX_PAGE_SIZE)
    })
}

fn check_page_size(size: Option<u64>) -> Result<(), WireError> {
    match size {
        Some(0) => Err(WireError::invalid_params("pageSize must be at least 1")),
        Some(n) if n > RPC_DECODER_MAX_PAGE_SIZE as u64 => Err(WireError::invalid_params(format!(
            "pageSize must be at most {RPC_DECODER_MAX_PAGE_SIZE}"
        ))),
        _ => Ok(()),
    }
}

fn check_cursor(cursor: &str) -> Result<(), WireError> {
    // A byte length within the bound needs no count; past four bytes a character, no
    // count can be within it.
    if cursor.len() > MAX_CURSOR_CHARS && cursor.chars().count() > MAX_CURSOR_CHARS {
        return Err(WireError::invalid_params(format!(
            "beforeCursor is longer than {MAX_CURSOR_CHARS} characters"
        )));
    }
    if cursor.trim().is_empty() {
        return Err(WireError::invalid_params("beforeCursor must not be blank"));
    }
    Ok(())
}

/// "A blank token or a blank row key fails as invalid params on the relay."
fn check_anchor(anchor: Option<&Anchor>) -> Result<(), WireError> {
    match anchor {
        Some(a) => a
            .check_params()
            .map_err(|e| WireError::invalid_params(e.to_string())),
        None => Ok(()),
    }
}
