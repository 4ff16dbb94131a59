//! What the host sends without being asked: the relay event `chat:timeline-updated`
//! with every payload the seed names, and `structured_replay` chunks.
//!
//! The host builds both as JSON ([`overlay_core::live::RelayEvent`],
//! [`overlay_core::replay::ReplayChunk`]); the frames here carry that JSON unchanged
//! ([`relay_frame`], [`replay_frame`]), and the typed forms decode it for a client or a
//! test.

use overlay_core::live::RelayEvent;
use overlay_core::replay::{ReplayChunk, RunningState};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use timeline_core::key::{OperationId, RunId, SessionId, TargetId};
use timeline_core::time::Millis;
use timeline_core::wire::{LiveOverlay, LivePatch};

/// The notification method of relay events.
pub const TIMELINE_UPDATED: &str = "chat:timeline-updated";
/// The notification method of replay chunks.
pub const STRUCTURED_REPLAY: &str = "structured_replay";

/// The method of [`SessionMoved`].
pub const SESSION_MOVED: &str = "chat:session-moved";

/// A notification's method and params.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "method", content = "params")]
#[non_exhaustive]
pub enum Event {
    /// `chat:timeline-updated`.
    #[serde(rename = "chat:timeline-updated")]
    TimelineUpdated(TimelineUpdated),
    /// `structured_replay`.
    #[serde(rename = "structured_replay")]
    StructuredReplay(StructuredReplay),
    /// `chat:session-moved`: this host no longer serves a session the connection joined
    /// (several hosts on one database: its lease passed to another host). The join is
    /// over; load and join again where `servedBy` says (or ask any host).
    #[serde(rename = "chat:session-moved")]
    SessionMoved(SessionMoved),
}

/// The params of `chat:session-moved`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct SessionMoved {
    /// The base session of the scope that moved.
    pub app_session_id: SessionId,
    /// Why, in words for the user or the log.
    pub reason: String,
    /// The host that serves it now, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_by: Option<crate::error::ServedBy>,
}

impl SessionMoved {
    /// The event for `session`, moved for `reason`, served now by `served_by`.
    pub fn new(
        session: SessionId,
        reason: impl Into<String>,
        served_by: Option<crate::error::ServedBy>,
    ) -> SessionMoved {
        SessionMoved {
            app_session_id: session,
            reason: reason.into(),
            served_by,
        }
    }

    /// Its notification frame (what [`crate::Notification`] writes for it).
    pub fn frame(&self) -> String {
        // Values built by this crate: writing them to a string cannot fail.
        notification_frame(
            SESSION_MOVED,
            &serde_json::to_string(self).unwrap_or_default(),
        )
    }
}

/// The fields of a run event (`started`, `completed`, `failed`, `aborted`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunEventFields {
    /// The app session.
    pub app_session_id: SessionId,
    /// The run.
    pub run_id: RunId,
    /// When it happened.
    pub timestamp: Millis,
    /// The operation that started the run (`null` when none did).
    pub operation_id: Option<OperationId>,
    /// Why it failed: only on `failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_error_info: Option<serde_json::Value>,
}

/// The payload of `chat:timeline-updated`, by its `event`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "event")]
#[non_exhaustive]
pub enum TimelineUpdated {
    /// The whole saved overlay of one target after a write.
    #[serde(rename = "blocks", rename_all = "camelCase")]
    Blocks {
        /// The app session.
        app_session_id: SessionId,
        /// The timeline target.
        timeline_target_id: TargetId,
        /// Exactly `settlementEpoch`, `revision` (above 0) and `blocks`.
        live_overlay: LiveOverlay,
    },
    /// The changes from a snapshot the phone holds (phones that asked for patches).
    #[serde(rename = "blocks-patch", rename_all = "camelCase")]
    BlocksPatch {
        /// The app session.
        app_session_id: SessionId,
        /// The timeline target.
        timeline_target_id: TargetId,
        /// The patch.
        live_patch: LivePatch,
    },
    /// A run started.
    #[serde(rename = "started")]
    Started(RunEventFields),
    /// A run completed.
    #[serde(rename = "completed")]
    Completed(RunEventFields),
    /// A run failed (with `agentErrorInfo`).
    #[serde(rename = "failed")]
    Failed(RunEventFields),
    /// A run was stopped.
    #[serde(rename = "aborted")]
    Aborted(RunEventFields),
    /// A runtime event of a session.
    #[serde(rename = "runtime", rename_all = "camelCase")]
    Runtime {
        /// The app session.
        app_session_id: SessionId,
        /// The event.
        data: serde_json::Value,
    },
    /// One event of the session's log, live and scalar (wire version 4): a streamed
    /// fragment (`assistant/text-delta`, `assistant/reasoning-delta` or
    /// `assistant/tool-call-delta`), to a join that asked (`sessionEvents`). Its `seq`
    /// follows the `nextSeq` of the `session.page` a client opened with, in the log
    /// `logId`; a gap is a fragment the connection had no room for: page it.
    #[serde(rename = "session-event", rename_all = "camelCase")]
    SessionEvent {
        /// The app session.
        app_session_id: SessionId,
        /// The log the event's `seq` belongs to.
        log_id: String,
        /// The event: `seq`, `time`, `type`, `sessionId`, `block`, `text`, and
        /// `turnId` when the agent named its turn.
        #[schemars(with = "serde_json::Value")]
        session_event: timeline_core::history::SessionEvent,
    },
    /// The agents list of the session changed: load it again.
    #[serde(rename = "agent-threads", rename_all = "camelCase")]
    AgentThreads {
        /// The app session.
        app_session_id: SessionId,
        /// When it happened.
        timestamp: Millis,
        /// Always `null`.
        thread_id: Option<String>,
    },
}

impl TimelineUpdated {
    /// The typed form of a relay event the host built.
    pub fn from_relay(event: &RelayEvent) -> Result<TimelineUpdated, serde_json::Error> {
        TimelineUpdated::deserialize(&event.json)
    }

    /// The app session it concerns.
    pub fn app_session_id(&self) -> &SessionId {
        match self {
            TimelineUpdated::Blocks { app_session_id, .. }
            | TimelineUpdated::BlocksPatch { app_session_id, .. }
            | TimelineUpdated::Runtime { app_session_id, .. }
            | TimelineUpdated::SessionEvent { app_session_id, .. }
            | TimelineUpdated::AgentThreads { app_session_id, .. } => app_session_id,
            TimelineUpdated::Started(e)
            | TimelineUpdated::Completed(e)
            | TimelineUpdated::Failed(e)
            | TimelineUpdated::Aborted(e) => &e.app_session_id,
        }
    }
}

/// `"structured_replay"`, the `type` of a replay envelope.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[schemars(schema_with = "replay_type_schema")]
pub struct ReplayType;

fn replay_type_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "const": "structured_replay" })
}

impl Serialize for ReplayType {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(STRUCTURED_REPLAY)
    }
}

impl<'de> Deserialize<'de> for ReplayType {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ReplayType, D::Error> {
        let v = String::deserialize(d)?;
        if v == STRUCTURED_REPLAY {
            Ok(ReplayType)
        } else {
            Err(serde::de::Error::custom(
                "type must be \"structured_replay\"",
            ))
        }
    }
}

/// One replay chunk (RB-01 to RB-05): chunk 0 clears the conversation and rebuilds it;
/// the client adopts `running` after the chunk with `last`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StructuredReplay {
    /// Always `structured_replay`.
    #[serde(rename = "type")]
    pub kind: ReplayType,
    /// The chunk's number.
    pub seq: u64,
    /// True on the last chunk.
    pub last: bool,
    /// Earlier events were trimmed: show "earlier messages not shown".
    pub truncated: bool,
    /// The session was reclaimed and started fresh.
    pub reclaimed: bool,
    /// The running state to adopt after the last chunk.
    pub running: RunningState,
    /// The events, in order: relay payloads, `user_message` rows, and
    /// `replay_event_omitted` markers for an event too large for a chunk. Each has its
    /// `seq`; decided approvals carry their `outcome`.
    pub events: Vec<serde_json::Value>,
}

impl StructuredReplay {
    /// The typed form of a chunk the host built.
    pub fn from_chunk(chunk: &ReplayChunk) -> Result<StructuredReplay, serde_json::Error> {
        serde_json::from_str(&chunk.json)
    }
}

/// The notification frame of a relay event, its JSON carried as the host built it.
pub fn relay_frame(event: &RelayEvent) -> String {
    notification_frame(TIMELINE_UPDATED, &event.json.to_string())
}

/// The notification frame of a replay chunk, its JSON carried unchanged (a chunk is at
/// most 256 KB; the frame adds 56 bytes).
pub fn replay_frame(chunk: &ReplayChunk) -> String {
    notification_frame(STRUCTURED_REPLAY, &chunk.json)
}

fn notification_frame(method: &str, params: &str) -> String {
    let mut frame = String::with_capacity(params.len() + 64);
    frame.push_str(r#"{"jsonrpc":"2.0","method":""#);
    frame.push_str(method);
    frame.push_str(r#"","params":"#);
    frame.push_str(params);
    frame.push('}');
    frame
}
