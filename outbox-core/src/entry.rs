//! The outbox entry model (OB-04, OB-05) and the texts the seed fixes.
//!
//! A persisted entry has two statuses, `queued` and `sending`; everything else is a flag:
//! `autoDrain`, `error`, `holdReason`, `acceptance` (the run, thread and turn of an
//! accepted steer), `handoff` (the stage of stop and send now) and `sessionMessage`
//! (the origin of a message from another session). Sent, canceled and blocked are
//! results of commands, not statuses. A saved entry that cannot be decoded is a
//! [`StoredEntry::Blocked`], shown and never dropped.

use serde::{Deserialize, Serialize};
use timeline_core::time::Millis;

use crate::ids::{CallId, OperationId, QueueId, RunId, SessionId, ThreadId, TurnId};

/// The hold text after an uncertain send whose history read did not find the message
/// (OB-08, OB-10).
pub const UNCONFIRMED_TEXT: &str = "The desktop could not confirm whether this message reached the agent. Check the timeline before sending it again.";
/// The text of an accepted steer that a stop returned (OB-15).
pub const STOPPED_BEFORE_DELIVERY_TEXT: &str =
    "The active run stopped before this message reached the agent. Review and send it again.";
/// A second start in a session with an active run (OB-14).
pub const RUN_IN_PROGRESS_TEXT: &str =
    "Chat send already in progress for this session. Please wait or stop current run.";
/// A start while a cancellation is pending (OB-14).
pub const CANCELLATION_PENDING_TEXT: &str = "Run cancellation is in progress. Please wait.";

/// Where a submit puts the message (OB-04).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Intent {
    /// Front of the queue, behind entries that are sending; the drain lane of its mode
    /// starts.
    Automatic,
    /// Back of the queue; an already-queued queue ID keeps its place.
    Enqueue,
    /// Codex only: front, with `rollbackBeforeSend`.
    ReplaceLatest,
}

/// How the message meets an active run (OB-04).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SendMode {
    /// Wait for the active run to end.
    Queue,
    /// Join the run named by `expectedActiveRunId` (steer lane).
    SteerRunning,
    /// Stop the active run, wait until it settled, then start as its own run.
    InterruptRunning,
}

/// The four ordered access levels, the same scale for both agents (OB-16).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AccessLevel {
    /// Reads only.
    ReadOnly,
    /// Writes inside the workspace.
    WorkspaceWrite,
    /// Writes anywhere, asks before risky commands.
    FullAccess,
    /// No limits.
    Unrestricted,
}

impl AccessLevel {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            AccessLevel::ReadOnly => "read-only",
            AccessLevel::WorkspaceWrite => "workspace-write",
            AccessLevel::FullAccess => "full-access",
            AccessLevel::Unrestricted => "unrestricted",
        }
    }
}

/// An attachment of a message.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Attachment {
    /// Its path.
    pub path: String,
    /// Its kind (`image`, `file`, ...).
    pub kind: String,
}

/// The fingerprinted content of a message (OB-02).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageRequest {
    /// What the user wrote (for a session message: the body).
    pub user_text: String,
    /// What the agent receives when it differs (for a session message: the envelope).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_text: Option<String>,
    /// Attachments, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<Attachment>,
    /// The thread the message is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<ThreadId>,
    /// Speed mode (Codex only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed_mode: Option<String>,
    /// Access mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_mode: Option<AccessLevel>,
    /// The model the user saw when writing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_model: Option<String>,
    /// The effort the user saw when writing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_effort: Option<String>,
    /// Roll back the latest turn before sending (replace latest).
    #[serde(default, skip_serializing_if = "is_false")]
    pub rollback_before_send: bool,
    /// Where the message came from (`composer`, `phone`, `session-message`, ...).
    pub source: String,
    /// When it was written.
    pub created_at: Millis,
}

impl MessageRequest {
    /// A plain message from `source` with only text.
    pub fn text(user_text: impl Into<String>, source: &str, created_at: Millis) -> Self {
        MessageRequest {
            user_text: user_text.into(),
            prompt_text: None,
            attachments: Vec::new(),
            thread_id: None,
            speed_mode: None,
            access_mode: None,
            expected_model: None,
            expected_effort: None,
            rollback_before_send: false,
            source: source.to_owned(),
            created_at,
        }
    }

    /// The text the agent receives.
    pub fn agent_text(&self) -> &str {
        self.prompt_text.as_deref().unwrap_or(&self.user_text)
    }
}

/// The submission controls (OB-04).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Controls {
    /// Where the message goes.
    pub intent: Intent,
    /// How it meets an active run.
    pub send_mode: SendMode,
    /// The run a steer joins (steer-running only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_active_run_id: Option<RunId>,
}

impl Controls {
    /// `automatic` + `queue`.
    pub fn automatic() -> Controls {
        Controls {
            intent: Intent::Automatic,
            send_mode: SendMode::Queue,
            expected_active_run_id: None,
        }
    }

    /// `enqueue` + `queue`.
    pub fn enqueue() -> Controls {
        Controls {
            intent: Intent::Enqueue,
            send_mode: SendMode::Queue,
            expected_active_run_id: None,
        }
    }

    /// `automatic` + `steer-running` for `run`.
    pub fn steer(run: RunId) -> Controls {
        Controls {
            intent: Intent::Automatic,
            send_mode: SendMode::SteerRunning,
            expected_active_run_id: Some(run),
        }
    }

    /// `automatic` + `interrupt-running`.
    pub fn interrupt() -> Controls {
        Controls {
            intent: Intent::Automatic,
            send_mode: SendMode::InterruptRunning,
            expected_active_run_id: None,
        }
    }

    /// `replace-latest` + `interrupt-running` (Codex only).
    pub fn replace_latest() -> Controls {
        Controls {
            intent: Intent::ReplaceLatest,
            send_mode: SendMode::InterruptRunning,
            expected_active_run_id: None,
        }
    }
}

/// The run, thread and turn that accepted an operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Acceptance {
    /// The run.
    pub run_id: RunId,
    /// The thread.
    pub thread_id: ThreadId,
    /// The turn.
    pub turn_id: TurnId,
    /// When.
    pub accepted_at: Millis,
}

/// The stage of stop and send now (OB-13).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum HandoffPhase {
    /// The user asked; run, thread and turn recorded; auto-drain off.
    Requested,
    /// Detached and revoked: queued again for its own turn.
    Dedicated,
}

/// Stop and send now in progress for an entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Handoff {
    /// The stage.
    pub phase: HandoffPhase,
    /// The accepting run, thread and turn.
    pub acceptance: Acceptance,
}

/// The origin of a message from another session (OB-16).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionMessageOrigin {
    /// The sending session.
    pub sender_session_id: SessionId,
    /// Its tool call.
    pub sender_call_id: CallId,
    /// Its run.
    pub sender_run_id: Option<RunId>,
    /// Its agent thread.
    pub sender_thread_id: Option<ThreadId>,
    /// Its access level when it sent.
    pub sender_access: AccessLevel,
    /// Its project.
    pub sender_project: Option<String>,
    /// The exchange.
    pub chain_id: String,
    /// Hop in the exchange (1 for a new exchange).
    pub hop: u32,
    /// The user approved it (sent it from the queue): no hold rule applies any more.
    #[serde(default, skip_serializing_if = "is_false")]
    pub approved: bool,
}

/// The persisted status (OB-05).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum EntryStatus {
    /// Waiting in the queue.
    Queued,
    /// A send attempt started.
    Sending,
}

/// One outbox entry (OB-05).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutboxEntry {
    /// The visible entry.
    pub queue_id: QueueId,
    /// The operation.
    pub operation_id: OperationId,
    /// The message.
    pub request: MessageRequest,
    /// The controls it was submitted (or last sent) with.
    pub controls: Controls,
    /// Queued or sending.
    pub status: EntryStatus,
    /// The drain may send it by itself.
    pub auto_drain: bool,
    /// Why it waits, as an error for the user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Why it waits, held on purpose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_reason: Option<String>,
    /// An accepted steer's run, thread and turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acceptance: Option<Acceptance>,
    /// Stop and send now in progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoff: Option<Handoff>,
    /// The origin of a session message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_message: Option<SessionMessageOrigin>,
    /// Its place: lower goes first.
    pub position: i64,
}

impl OutboxEntry {
    /// A new entry as submit saves it: queued, auto-drain on, nothing holding it.
    pub fn queued(
        queue_id: QueueId,
        operation_id: OperationId,
        request: MessageRequest,
        controls: Controls,
        position: i64,
    ) -> OutboxEntry {
        OutboxEntry {
            queue_id,
            operation_id,
            request,
            controls,
            status: EntryStatus::Queued,
            auto_drain: true,
            error: None,
            hold_reason: None,
            acceptance: None,
            handoff: None,
            session_message: None,
            position,
        }
    }

    /// True for an entry queued with auto-drain on and nothing holding it.
    pub fn drainable(&self) -> bool {
        self.status == EntryStatus::Queued && self.auto_drain
    }
}

/// A saved entry that could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BlockedEntry {
    /// The queue ID as stored.
    pub queue_id: String,
    /// The operation ID as stored, if readable.
    pub operation_id: Option<String>,
    /// Its place.
    pub position: i64,
    /// Why it could not be decoded.
    pub reason: String,
}

/// A saved entry as read back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum StoredEntry {
    /// A decoded entry.
    Entry(Box<OutboxEntry>),
    /// An entry shown as blocked: it is kept, never dropped, and never drained.
    Blocked(BlockedEntry),
}

impl StoredEntry {
    /// The decoded entry, if any.
    pub fn entry(&self) -> Option<&OutboxEntry> {
        match self {
            StoredEntry::Entry(e) => Some(e.as_ref()),
            StoredEntry::Blocked(_) => None,
        }
    }

    /// The position.
    pub fn position(&self) -> i64 {
        match self {
            StoredEntry::Entry(e) => e.position,
            StoredEntry::Blocked(b) => b.position,
        }
    }
}

/// What a submit returns: custody is taken.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Receipt {
    /// The session.
    pub session_id: SessionId,
    /// The entry.
    pub queue_id: QueueId,
    /// The operation.
    pub operation_id: OperationId,
    /// True when this repeats an earlier submit of the same operation.
    pub replayed: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}
