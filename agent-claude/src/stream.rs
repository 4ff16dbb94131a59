//! The stream-json codec (sans-IO) for `claude -p --input-format stream-json
//! --output-format stream-json --replay-user-messages [--include-partial-messages]`.
//!
//! - Out: [`UserMessage::encode`] writes the one line the host sends for a message; its
//!   `uuid` is the message's [`MessageUuid`] (the operation's UUID), which Claude keeps
//!   as the transcript entry's `uuid` and echoes back.
//! - In: [`StreamDecoder::decode`] reads one line Claude printed into a [`StreamLine`].
//!
//! Invariant: no input line is fatal and none is lost silently. A line of an unknown
//! type, a system line of an unknown subtype, an unknown stream event or delta type, and
//! (with [`StreamDecoder::audit_fields`]) an unknown top-level field are counted in
//! [`Diagnostics`] and skipped; a line that is not a JSON object, or whose known fields
//! have the wrong shape, is counted as malformed and its error kept for the log. Every
//! line is counted exactly once.
//!
//! Speed: a `stream_event` line that starts with its type (as Claude writes every one)
//! is read by a fast path that looks only at the fields a stream event has (`event`,
//! `session_id`, `parent_tool_use_id`) and borrows its strings from the line; it gives
//! the same typed line and the same counts as the general path
//! (`the_event_fast_path_reads_like_the_general_path`). Field auditing takes the general
//! path for every line.
//!
//! ```
//! use agent_claude::stream::{MessageUuid, StreamDecoder, StreamLine, UserMessage};
//!
//! let uuid = MessageUuid::parse("6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b").unwrap();
//! let line = UserMessage::new(uuid.clone(), "run the tests").encode();
//! assert!(line.ends_with('\n'));
//!
//! let mut decoder = StreamDecoder::new();
//! let echo = r#"{"type":"user","isReplay":true,"uuid":"6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b","session_id":"s","message":{"role":"user","content":"run the tests"}}"#;
//! let Some(StreamLine::User(user)) = decoder.decode(echo.as_bytes()) else { panic!() };
//! assert!(user.is_replay);
//! assert_eq!(user.uuid.as_deref(), Some(uuid.as_str()));
//! ```

use std::borrow::Cow;
use std::sync::Arc;

use serde::Deserialize;
use timeline_core::key::OperationId;

use crate::content::{ContentBlock, Message};
use crate::diag::Diagnostics;

/// A UUID in its 36-character text form (`8-4-4-4-12` hex digits). Claude takes it as
/// the `uuid` of a streamed user message and keeps it as the transcript entry's `uuid`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageUuid(String);

/// A text that is not a UUID.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UuidError {
    /// Not 36 characters of hex digits with hyphens at 8, 13, 18 and 23.
    #[error("a Claude message UUID must have the form xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")]
    NotAUuid,
}

impl MessageUuid {
    /// Checks the form and keeps the text in lower case.
    pub fn parse(text: &str) -> Result<MessageUuid, UuidError> {
        let ok = text.len() == 36
            && text.bytes().enumerate().all(|(i, b)| match i {
                8 | 13 | 18 | 23 => b == b'-',
                _ => b.is_ascii_hexdigit(),
            });
        if ok {
            Ok(MessageUuid(text.to_ascii_lowercase()))
        } else {
            Err(UuidError::NotAUuid)
        }
    }

    /// The operation's ID as the message UUID, when the operation ID is a UUID.
    pub fn from_operation(op: &OperationId) -> Result<MessageUuid, UuidError> {
        MessageUuid::parse(op.as_str())
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// When a streamed message should be taken (`priority`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priority {
    /// Interrupt the current step.
    Now,
    /// After the current step.
    Next,
    /// When the turn ends.
    Later,
}

impl Priority {
    fn as_str(self) -> &'static str {
        match self {
            Priority::Now => "now",
            Priority::Next => "next",
            Priority::Later => "later",
        }
    }
}

/// A user message the host writes to Claude's stdin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserMessage {
    /// The UUID that will prove delivery.
    pub uuid: MessageUuid,
    /// The prompt text (for a session message, the envelope).
    pub text: String,
    /// The Claude session, when known.
    pub session_id: Option<String>,
    /// When to take it; `None` leaves Claude's default.
    pub priority: Option<Priority>,
}

impl UserMessage {
    /// A message with text and UUID only.
    pub fn new(uuid: MessageUuid, text: impl Into<String>) -> UserMessage {
        UserMessage {
            uuid,
            text: text.into(),
            session_id: None,
            priority: None,
        }
    }

    /// The JSON line, newline included:
    /// `{"type":"user","uuid":..,"session_id":..,"message":{"role":"user","content":..},"parent_tool_use_id":null}`.
    pub fn encode(&self) -> String {
        let mut v = serde_json::json!({
            "type": "user",
            "uuid": self.uuid.as_str(),
            "session_id": self.session_id.as_deref().unwrap_or(""),
            "message": { "role": "user", "content": self.text },
            "parent_tool_use_id": null,
        });
        if let (Some(p), Some(obj)) = (self.priority, v.as_object_mut()) {
            obj.insert("priority".into(), p.as_str().into());
        }
        let mut line = v.to_string();
        line.push('\n');
        line
    }
}

/// One line Claude printed, typed.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum StreamLine {
    /// `system`/`init`: the session starts.
    Init(Init),
    /// Another known `system` line (`status`, hooks, `compact_boundary`, tasks).
    System(SystemNotice),
    /// `assistant`: one content block of a message, whole.
    Assistant(AssistantFrame),
    /// `user`: the replayed echo of a sent message, or tool results.
    User(UserFrame),
    /// `stream_event`: a raw Messages API stream event.
    Event(EventFrame),
    /// `result`: the turn ended.
    Result(ResultFrame),
    /// `command_lifecycle`: a sent message was queued, started, completed or refused.
    Lifecycle(Lifecycle),
    /// `control_request`: Claude asks the host (a tool permission, for example).
    ControlRequest(ControlRequest),
    /// `control_cancel_request`: Claude withdraws a request it made (the `request_id`).
    ControlCancel(String),
}

/// `system`/`init`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Init {
    /// The Claude session.
    pub session_id: String,
    /// `claude_code_version`.
    pub version: Option<String>,
    /// The model.
    pub model: Option<String>,
    /// The working directory.
    pub cwd: Option<String>,
    /// The capabilities (`msg_lifecycle_v1`, `interrupt_receipt_v1`).
    pub capabilities: Vec<String>,
}

impl Init {
    /// True when Claude reports `command_lifecycle` lines (`msg_lifecycle_v1`).
    pub fn reports_lifecycle(&self) -> bool {
        self.capabilities.iter().any(|c| c == "msg_lifecycle_v1")
    }
}

/// A known `system` line other than `init`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SystemNotice {
    /// Its subtype.
    pub subtype: String,
    /// Its UUID.
    pub uuid: Option<String>,
    /// `status` of a `status` line (`requesting`).
    pub status: Option<String>,
}

/// `assistant`.
#[derive(Clone, Debug, PartialEq)]
pub struct AssistantFrame {
    /// The line's UUID (the transcript entry's UUID).
    pub uuid: Option<String>,
    /// The Claude session.
    pub session_id: Option<String>,
    /// The tool call of a subagent this frame belongs to, if any.
    pub parent_tool_use_id: Option<String>,
    /// The message (one content block).
    pub message: Message,
    /// When, as Claude wrote it.
    pub timestamp: Option<String>,
}

/// `user`.
#[derive(Clone, Debug, PartialEq)]
pub struct UserFrame {
    /// The UUID: for an echo, the one the host sent.
    pub uuid: Option<String>,
    /// The Claude session.
    pub session_id: Option<String>,
    /// True for the replayed echo of a message the host sent.
    pub is_replay: bool,
    /// True for a message Claude made itself.
    pub is_synthetic: bool,
    /// The tool call of a subagent this frame belongs to, if any.
    pub parent_tool_use_id: Option<String>,
    /// The message.
    pub message: Message,
    /// When, as Claude wrote it.
    pub timestamp: Option<String>,
}

/// `stream_event`.
#[derive(Clone, Debug, PartialEq)]
pub struct EventFrame {
    /// The Claude session (shared by the events of one session: no copy per event).
    pub session_id: Option<Arc<str>>,
    /// The tool call of a subagent this event belongs to, if any.
    pub parent_tool_use_id: Option<String>,
    /// The event.
    pub event: StreamEvent,
}

/// A Messages API stream event.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum StreamEvent {
    /// A message begins.
    MessageStart {
        /// `msg_…`.
        message_id: String,
    },
    /// A content block begins.
    BlockStart {
        /// Its index in the message.
        index: u64,
        /// The block as it starts (empty text, a tool's name and ID).
        block: ContentBlock,
    },
    /// A fragment of a content block.
    BlockDelta {
        /// The block's index.
        index: u64,
        /// The fragment.
        delta: Delta,
    },
    /// A content block ends.
    BlockStop {
        /// Its index.
        index: u64,
    },
    /// The message's stop reason.
    MessageDelta {
        /// `end_turn`, `tool_use`, …
        stop_reason: Option<String>,
    },
    /// The message ends.
    MessageStop,
    /// A keep-alive line with nothing to project.
    Ping,
    /// An API error inside the stream.
    Error,
}

/// A fragment of a content block.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Delta {
    /// `text_delta`.
    Text(String),
    /// `thinking_delta` (may be empty).
    Thinking(String),
    /// `input_json_delta`: a fragment of a tool call's JSON arguments.
    InputJson(String),
    /// `signature_delta` (not kept).
    Signature,
    /// `citations_delta` (not kept).
    Citations,
}

/// `result`.
#[derive(Clone, Debug, PartialEq)]
pub struct ResultFrame {
    /// `success`, `error_during_execution`, `error_max_turns`, …
    pub subtype: String,
    /// True when the turn failed.
    pub is_error: bool,
    /// The final text.
    pub result: Option<String>,
    /// The UUID of the user message this turn answered, when Claude states it.
    pub user_message_uuid: Option<String>,
    /// `completed`, `aborted_streaming`, `aborted_tools`, …
    pub terminal_reason: Option<String>,
    /// The Claude session.
    pub session_id: Option<String>,
    /// Turns taken.
    pub num_turns: Option<u64>,
    /// Duration in milliseconds.
    pub duration_ms: Option<u64>,
}

/// The state of a sent message (`command_lifecycle`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LifecycleState {
    /// Waiting for the current step to end.
    Queued,
    /// Taken into the conversation.
    Started,
    /// The command completed.
    Completed,
    /// The command was refused.
    Refused,
    /// The command was cancelled: before it started (an interrupt with
    /// `cancel_queued`, `cancel_async_message`) it was never taken; after `started` its
    /// turn was interrupted or gave up.
    Cancelled,
    /// A state this crate does not know.
    Other(String),
}

/// `command_lifecycle`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lifecycle {
    /// The UUID of the sent message.
    pub command_uuid: String,
    /// Its state.
    pub state: LifecycleState,
}

/// `control_request`.
#[derive(Clone, Debug, PartialEq)]
pub struct ControlRequest {
    /// The ID the answer must name.
    pub request_id: String,
    /// `can_use_tool`, `initialize`, …
    pub subtype: String,
    /// The tool of a `can_use_tool` request.
    pub tool_name: Option<String>,
    /// The tool call of a `can_use_tool` request.
    pub tool_use_id: Option<String>,
    /// The tool's arguments.
    pub input: Option<serde_json::Value>,
    /// The permission rules Claude suggests for an "allow for this session" answer.
    pub permission_suggestions: Option<serde_json::Value>,
}

/// The union of every top-level field the decoder reads; one pass, no buffering.
#[derive(Deserialize)]
struct RawLine<'a> {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    subtype: Option<String>,
    #[serde(default)]
    uuid: Option<String>,
    #[serde(default)]
    session_id: Option<String>,
    #[serde(default)]
    parent_tool_use_id: Option<String>,
    #[serde(default)]
    message: Option<Message>,
    #[serde(default, borrow)]
    event: Option<RawEvent<'a>>,
    #[serde(default, rename = "isReplay")]
    is_replay: Option<bool>,
    #[serde(default, rename = "isSynthetic")]
    is_synthetic: Option<bool>,
    #[serde(default)]
    timestamp: Option<String>,
    #[serde(default)]
    claude_code_version: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    capabilities: Option<Vec<serde_json::Value>>,
    #[serde(default)]
    status: Option<serde_json::Value>,
    #[serde(default)]
    is_error: Option<bool>,
    #[serde(default)]
    result: Option<serde_json::Value>,
    #[serde(default)]
    user_message_uuid: Option<String>,
    #[serde(default)]
    terminal_reason: Option<String>,
    #[serde(default)]
    num_turns: Option<u64>,
    #[serde(default)]
    duration_ms: Option<u64>,
    #[serde(default)]
    command_uuid: Option<String>,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    request_id: Option<String>,
    #[serde(default)]
    request: Option<RawControl>,
}

#[derive(Deserialize)]
struct RawControl {
    #[serde(default)]
    subtype: Option<String>,
    #[serde(default)]
    tool_name: Option<String>,
    #[serde(default)]
    tool_use_id: Option<String>,
    #[serde(default)]
    input: Option<serde_json::Value>,
    #[serde(default)]
    permission_suggestions: Option<serde_json::Value>,
}

/// A string of the line, borrowed when it has no escapes.
struct Text<'a>(Cow<'a, str>);

impl Text<'_> {
    fn into_string(self) -> String {
        self.0.into_owned()
    }

    fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

fn own(t: Option<Text<'_>>) -> Option<String> {
    t.map(Text::into_string)
}

#[derive(Deserialize)]
struct RawEvent<'a> {
    #[serde(rename = "type", default, borrow)]
    kind: Option<Text<'a>>,
    #[serde(default)]
    index: Option<u64>,
    /// Boxed: only `content_block_start` has one, and a small event moves cheaply.
    #[serde(default)]
    content_block: Option<Box<ContentBlock>>,
    #[serde(default, borrow)]
    delta: Option<RawDelta<'a>>,
    #[serde(default, borrow)]
    message: Option<EventMessage<'a>>,
}

/// The `message` of a `message_start` event: only its ID is read.
#[derive(Deserialize)]
struct EventMessage<'a> {
    #[serde(default, borrow)]
    id: Option<Text<'a>>,
}

#[derive(Deserialize)]
struct RawDelta<'a> {
    #[serde(rename = "type", default, borrow)]
    kind: Option<Text<'a>>,
    #[serde(default, borrow)]
    text: Option<Text<'a>>,
    #[serde(default, borrow)]
    thinking: Option<Text<'a>>,
    #[serde(default, borrow)]
    partial_json: Option<Text<'a>>,
    #[serde(default, borrow)]
    stop_reason: Option<Text<'a>>,
}

/// A `stream_event` line as the fast path reads it: only the fields a stream event
/// uses.
#[derive(Deserialize)]
struct EventLine<'a> {
    #[serde(rename = "type", default, borrow)]
    kind: Option<Text<'a>>,
    #[serde(default, borrow)]
    event: Option<RawEvent<'a>>,
    #[serde(default, borrow)]
    session_id: Option<Text<'a>>,
    #[serde(default, borrow)]
    parent_tool_use_id: Option<Text<'a>>,
}

/// How a `stream_event` line starts when Claude writes it (its type first).
const EVENT_PREFIX: &[u8] = br#"{"type":"stream_event""#;

/// Top-level fields of known lines that the decoder knows (read or deliberately
/// ignored); with auditing on, any other field is counted in
/// [`Diagnostics::unknown_fields`].
pub const KNOWN_FIELDS: &[&str] = &[
    "type",
    "subtype",
    "uuid",
    "session_id",
    "parent_tool_use_id",
    "message",
    "event",
    "isReplay",
    "isSynthetic",
    "timestamp",
    "claude_code_version",
    "model",
    "cwd",
    "capabilities",
    "status",
    "is_error",
    "result",
    "user_message_uuid",
    "terminal_reason",
    "num_turns",
    "duration_ms",
    "command_uuid",
    "state",
    "request_id",
    "request",
    "response",
    "priority",
    "tool_use_result",
    "error",
    "ttft_ms",
    "ttft_stream_ms",
    "time_to_request_ms",
    "hook_id",
    "hook_name",
    "hook_event",
    "output",
    "stdout",
    "stderr",
    "exit_code",
    "outcome",
    "tools",
    "mcp_servers",
    "permissionMode",
    "slash_commands",
    "terminal_slash_commands",
    "apiKeySource",
    "output_style",
    "agents",
    "skills",
    "plugins",
    "analytics_disabled",
    "product_feedback_disabled",
    "memory_paths",
    "messaging_socket_path",
    "fast_mode_state",
    "fast_mode_disabled_reason",
    "rate_limit_info",
    "duration_api_ms",
    "stop_reason",
    "total_cost_usd",
    "usage",
    "modelUsage",
    "permission_denials",
    "subagent_stats",
    "api_error_status",
    "estimated_tokens",
    "estimated_tokens_delta",
    "compact_metadata",
];

/// Line types that are known and skipped on purpose.
const SKIPPED_TYPES: &[&str] = &["rate_limit_event", "control_response", "keep_alive"];

/// System subtypes the decoder knows besides `init`.
const SYSTEM_SUBTYPES: &[&str] = &[
    "status",
    "hook_started",
    "hook_response",
    "hook_progress",
    "thinking_tokens",
    "compact_boundary",
    "task_started",
    "task_notification",
    "task_progress",
    "api_retry",
    "local_command_output",
];

/// Decodes lines Claude printed, counting what it saw.
#[derive(Clone, Debug, Default)]
pub struct StreamDecoder {
    diagnostics: Diagnostics,
    audit: bool,
    /// The session of the last stream event, shared with the next ones.
    session: Option<Arc<str>>,
}

impl StreamDecoder {
    /// A decoder with empty diagnostics and field auditing off.
    pub fn new() -> StreamDecoder {
        StreamDecoder::default()
    }

    /// Also counts unknown top-level fields of known lines (each audited line is parsed
    /// twice: use it in tests and when diagnosing a new agent version).
    #[must_use]
    pub fn audit_fields(mut self, on: bool) -> StreamDecoder {
        self.audit = on;
        self
    }

    /// What the decoder saw so far.
    pub fn diagnostics(&self) -> &Diagnostics {
        &self.diagnostics
    }

    /// Decodes one line (with or without its newline). `None` when the line is blank,
    /// malformed, of an unknown type, or known and skipped on purpose; the diagnostics
    /// say which.
    pub fn decode(&mut self, line: &[u8]) -> Option<StreamLine> {
        let d = &mut self.diagnostics;
        d.lines = d.lines.saturating_add(1);
        if line.iter().all(u8::is_ascii_whitespace) {
            d.blank = d.blank.saturating_add(1);
            return None;
        }
        if !self.audit && line.trim_ascii_start().starts_with(EVENT_PREFIX) {
            if let Ok(fast) = serde_json::from_slice::<EventLine<'_>>(line) {
                if fast.kind.as_ref().map(Text::as_str) == Some("stream_event") {
                    let session = share(
                        &mut self.session,
                        fast.session_id.as_ref().map(Text::as_str),
                    );
                    return event_line(fast.event, session, fast.parent_tool_use_id, d);
                }
            }
        }
        let value: serde_json::Value;
        let raw: RawLine = if self.audit {
            value = match serde_json::from_slice(line) {
                Ok(v) => v,
                Err(e) => {
                    d.malformed(&e.to_string());
                    return None;
                }
            };
            match RawLine::deserialize(&value) {
                Ok(raw) => {
                    if let Some(obj) = value.as_object() {
                        if is_known_type(raw.kind.as_deref()) {
                            for k in obj.keys().filter(|k| !KNOWN_FIELDS.contains(&k.as_str())) {
                                d.unknown_fields.add(k);
                            }
                        }
                    }
                    raw
                }
                Err(e) => {
                    d.malformed(&e.to_string());
                    return None;
                }
            }
        } else {
            match serde_json::from_slice(line) {
                Ok(raw) => raw,
                Err(e) => {
                    d.malformed(&e.to_string());
                    return None;
                }
            }
        };
        classify(raw, d)
    }
}

fn is_known_type(kind: Option<&str>) -> bool {
    matches!(
        kind,
        Some(
            "system"
                | "assistant"
                | "user"
                | "stream_event"
                | "result"
                | "command_lifecycle"
                | "control_request"
                | "control_cancel_request"
        )
    ) || kind.is_some_and(|k| SKIPPED_TYPES.contains(&k))
}

fn count_unknown_blocks(message: &Message, d: &mut Diagnostics) {
    for b in message.content.blocks() {
        if let Some(label) = b.unknown_label() {
            d.unknown_parts.add(&label);
        }
    }
}

fn classify(raw: RawLine, d: &mut Diagnostics) -> Option<StreamLine> {
    let kind = raw.kind.clone().unwrap_or_default();
    match kind.as_str() {
        "system" => {
            let subtype = raw.subtype.unwrap_or_default();
            if subtype == "init" {
                let Some(session_id) = raw.session_id else {
                    d.malformed("system/init without session_id");
                    return None;
                };
                if let Some(v) = &raw.claude_code_version {
                    d.version(v);
                }
                d.parsed.add("system/init");
                return Some(StreamLine::Init(Init {
                    session_id,
                    version: raw.claude_code_version,
                    model: raw.model,
                    cwd: raw.cwd,
                    capabilities: raw
                        .capabilities
                        .unwrap_or_default()
                        .into_iter()
                        .filter_map(|c| c.as_str().map(str::to_owned))
                        .collect(),
                }));
            }
            if SYSTEM_SUBTYPES.contains(&subtype.as_str()) {
                d.parsed.add(&format!("system/{subtype}"));
                Some(StreamLine::System(SystemNotice {
                    subtype,
                    uuid: raw.uuid,
                    status: raw.status.and_then(|s| s.as_str().map(str::to_owned)),
                }))
            } else {
                d.unknown.add(&format!("system/{subtype}"));
                None
            }
        }
        "assistant" => {
            let Some(message) = raw.message else {
                d.malformed("assistant line without message");
                return None;
            };
            count_unknown_blocks(&message, d);
            d.parsed.add("assistant");
            Some(StreamLine::Assistant(AssistantFrame {
                uuid: raw.uuid,
                session_id: raw.session_id,
                parent_tool_use_id: raw.parent_tool_use_id,
                message,
                timestamp: raw.timestamp,
            }))
        }
        "user" => {
            let message = raw.message.unwrap_or_default();
            count_unknown_blocks(&message, d);
            d.parsed.add("user");
            Some(StreamLine::User(UserFrame {
                uuid: raw.uuid,
                session_id: raw.session_id,
                is_replay: raw.is_replay.unwrap_or(false),
                is_synthetic: raw.is_synthetic.unwrap_or(false),
                parent_tool_use_id: raw.parent_tool_use_id,
                message,
                timestamp: raw.timestamp,
            }))
        }
        "stream_event" => event_line(raw.event, None, None, d).map(|line| match line {
            StreamLine::Event(mut e) => {
                e.session_id = raw.session_id.map(Arc::from);
                e.parent_tool_use_id = raw.parent_tool_use_id;
                StreamLine::Event(e)
            }
            other => other,
        }),
        "result" => {
            d.parsed.add(&format!(
                "result/{}",
                raw.subtype.as_deref().unwrap_or_default()
            ));
            Some(StreamLine::Result(ResultFrame {
                subtype: raw.subtype.unwrap_or_default(),
                is_error: raw.is_error.unwrap_or(false),
                result: raw.result.and_then(|r| r.as_str().map(str::to_owned)),
                user_message_uuid: raw.user_message_uuid,
                terminal_reason: raw.terminal_reason,
                session_id: raw.session_id,
                num_turns: raw.num_turns,
                duration_ms: raw.duration_ms,
            }))
        }
        "command_lifecycle" => {
            let Some(command_uuid) = raw.command_uuid else {
                d.malformed("command_lifecycle without command_uuid");
                return None;
            };
            let state = match raw.state.as_deref().unwrap_or_default() {
                "queued" => LifecycleState::Queued,
                "started" => LifecycleState::Started,
                "completed" => LifecycleState::Completed,
                "refused" => LifecycleState::Refused,
                "cancelled" => LifecycleState::Cancelled,
                other => {
                    d.unknown_parts.add(&format!("command_lifecycle/{other}"));
                    LifecycleState::Other(other.to_owned())
                }
            };
            d.parsed.add("command_lifecycle");
            Some(StreamLine::Lifecycle(Lifecycle {
                command_uuid,
                state,
            }))
        }
        "control_request" => {
            let (Some(request_id), Some(req)) = (raw.request_id, raw.request) else {
                d.malformed("control_request without request_id or request");
                return None;
            };
            d.parsed.add("control_request");
            Some(StreamLine::ControlRequest(ControlRequest {
                request_id,
                subtype: req.subtype.unwrap_or_default(),
                tool_name: req.tool_name,
                tool_use_id: req.tool_use_id,
                input: req.input,
                permission_suggestions: req.permission_suggestions,
            }))
        }
        "control_cancel_request" => {
            let Some(request_id) = raw.request_id else {
                d.malformed("control_cancel_request without request_id");
                return None;
            };
            d.parsed.add("control_cancel_request");
            Some(StreamLine::ControlCancel(request_id))
        }
        k if SKIPPED_TYPES.contains(&k) => {
            d.skipped.add(k);
            None
        }
        other => {
            d.unknown.add(other);
            None
        }
    }
}

/// `session` as a shared string: the cached one when it is the same.
fn share(cache: &mut Option<Arc<str>>, session: Option<&str>) -> Option<Arc<str>> {
    let session = session?;
    match cache {
        Some(c) if **c == *session => Some(Arc::clone(c)),
        _ => {
            let fresh: Arc<str> = Arc::from(session);
            *cache = Some(Arc::clone(&fresh));
            Some(fresh)
        }
    }
}

/// A `stream_event` line's event, counted.
fn event_line(
    event: Option<RawEvent<'_>>,
    session_id: Option<Arc<str>>,
    parent_tool_use_id: Option<Text<'_>>,
    d: &mut Diagnostics,
) -> Option<StreamLine> {
    let Some(ev) = event else {
        d.malformed("stream_event without event");
        return None;
    };
    let label = event_label(ev.kind.as_ref().map_or("", Text::as_str));
    let event = match stream_event(ev, d) {
        Ok(e) => e,
        Err(part) => {
            // The line is known; the event inside it is not.
            d.unknown_parts.add(&part);
            d.skipped.add(&label);
            return None;
        }
    };
    d.parsed.add(&label);
    Some(StreamLine::Event(EventFrame {
        session_id,
        parent_tool_use_id: own(parent_tool_use_id),
        event,
    }))
}

/// The tally label of a stream event of type `kind`.
fn event_label(kind: &str) -> Cow<'static, str> {
    match kind {
        "message_start" => Cow::Borrowed("stream_event/message_start"),
        "content_block_start" => Cow::Borrowed("stream_event/content_block_start"),
        "content_block_delta" => Cow::Borrowed("stream_event/content_block_delta"),
        "content_block_stop" => Cow::Borrowed("stream_event/content_block_stop"),
        "message_delta" => Cow::Borrowed("stream_event/message_delta"),
        "message_stop" => Cow::Borrowed("stream_event/message_stop"),
        "ping" => Cow::Borrowed("stream_event/ping"),
        "error" => Cow::Borrowed("stream_event/error"),
        other => Cow::Owned(format!("stream_event/{other}")),
    }
}

/// The typed event, or the label of the unknown part.
fn stream_event(ev: RawEvent<'_>, d: &mut Diagnostics) -> Result<StreamEvent, String> {
    let kind = ev.kind.map_or(Cow::Borrowed(""), |k| k.0);
    let index = ev.index;
    let need_index = || index.ok_or_else(|| format!("stream_event/{kind}/without-index"));
    Ok(match kind.as_ref() {
        "message_start" => StreamEvent::MessageStart {
            message_id: ev
                .message
                .and_then(|m| own(m.id))
                .ok_or_else(|| "stream_event/message_start/without-id".to_owned())?,
        },
        "content_block_start" => {
            let block = ev
                .content_block
                .ok_or_else(|| "stream_event/content_block_start/without-block".to_owned())?;
            if let Some(label) = block.unknown_label() {
                d.unknown_parts.add(&label);
            }
            StreamEvent::BlockStart {
                index: need_index()?,
                block: *block,
            }
        }
        "content_block_delta" => {
            let index = need_index()?;
            let delta = ev
                .delta
                .ok_or_else(|| "stream_event/content_block_delta/without-delta".to_owned())?;
            let text = |t: Option<Text<'_>>| own(t).unwrap_or_default();
            let delta = match delta.kind.as_ref().map_or("", Text::as_str) {
                "text_delta" => Delta::Text(text(delta.text)),
                "thinking_delta" => Delta::Thinking(text(delta.thinking)),
                "input_json_delta" => Delta::InputJson(text(delta.partial_json)),
                "signature_delta" => Delta::Signature,
                "citations_delta" => Delta::Citations,
                other => return Err(format!("delta/{other}")),
            };
            StreamEvent::BlockDelta { index, delta }
        }
        "content_block_stop" => StreamEvent::BlockStop {
            index: need_index()?,
        },
        "message_delta" => StreamEvent::MessageDelta {
            stop_reason: ev.delta.and_then(|d| own(d.stop_reason)),
        },
        "message_stop" => StreamEvent::MessageStop,
        "ping" => StreamEvent::Ping,
        "error" => StreamEvent::Error,
        other => return Err(format!("stream_event/{other}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diag::Tally;

    #[test]
    fn uuids_are_checked() {
        assert!(MessageUuid::parse("6F1C2A8E-3B4D-4E5F-8A9B-0C1D2E3F4A5B").is_ok());
        for bad in [
            "",
            "op-1",
            "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5",
            "6f1c2a8e_3b4d-4e5f-8a9b-0c1d2e3f4a5b",
            "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5g",
        ] {
            assert_eq!(MessageUuid::parse(bad), Err(UuidError::NotAUuid), "{bad}");
        }
    }

    #[test]
    fn the_sent_line_carries_the_uuid_and_the_text() {
        let uuid = MessageUuid::parse("6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b").unwrap();
        let mut m = UserMessage::new(uuid, "a \"quoted\"\nline");
        m.priority = Some(Priority::Next);
        let line = m.encode();
        assert_eq!(line.matches('\n').count(), 1, "one line");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["type"], "user");
        assert_eq!(v["uuid"], "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b");
        assert_eq!(v["message"]["content"], "a \"quoted\"\nline");
        assert_eq!(v["priority"], "next");
    }

    // The fast path of `stream_event` lines reads them as the general path does: the
    // same typed line and the same counts, escapes and unknown parts included.
    #[test]
    fn the_event_fast_path_reads_like_the_general_path() {
        let lines = [
            r#"{"type":"stream_event","event":{"type":"message_start","message":{"id":"msg_1","content":[],"usage":{"x":1}}},"session_id":"s","parent_tool_use_id":null,"uuid":"u"}"#,
            r#"{"type":"stream_event","event":{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"Bash","input":{}}},"session_id":"s"}"#,
            r#"{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"\u2019ll \"q\""}},"session_id":"s","parent_tool_use_id":"toolu_9"}"#,
            r#"{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"a\":"}}}"#,
            r#"{"type":"stream_event","event":{"type":"content_block_delta","index":1,"delta":{"type":"future_delta"}}}"#,
            r#"{"type":"stream_event","event":{"type":"content_block_delta","delta":{"type":"text_delta","text":"x"}}}"#,
            r#"{"type":"stream_event","event":{"type":"future_event"}}"#,
            r#"{"type":"stream_event"}"#,
            r#"{"type":"stream_event","event":{"type":"message_delta","delta":{"stop_reason":"end_turn"}}}"#,
            r#"{"type":"stream_event","event":{"type":"content_block_stop","index":0}}"#,
            r#"{"type":"stream_event","event":5}"#,
        ];
        let mut fast = StreamDecoder::new();
        let mut general = StreamDecoder::new().audit_fields(true);
        for line in lines {
            assert_eq!(
                fast.decode(line.as_bytes()),
                general.decode(line.as_bytes()),
                "{line}"
            );
        }
        let mut a = fast.diagnostics().clone();
        let mut b = general.diagnostics().clone();
        a.unknown_fields = Tally::default();
        b.unknown_fields = Tally::default();
        a.first_malformed = None;
        b.first_malformed = None;
        assert_eq!(a, b);
        assert_eq!(a.malformed, 2);
        assert_eq!(a.parsed.get("stream_event/content_block_delta"), 2);
        assert_eq!(a.skipped.get("stream_event/content_block_delta"), 2);
    }

    #[test]
    fn unknown_and_malformed_lines_are_counted_never_fatal() {
        let mut dec = StreamDecoder::new().audit_fields(true);
        let lines = [
            "",
            "not json",
            r#"{"type":"future_kind","x":1}"#,
            r#"{"type":"system","subtype":"future_sub"}"#,
            r#"{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"future_delta"}}}"#,
            r#"{"type":"stream_event","event":{"type":"future_event"}}"#,
            r#"{"type":"assistant","message":{"id":"m","content":[{"type":"text","text":5}]}}"#,
            r#"{"type":"assistant","message":{"id":"m","content":[{"type":"text","text":"ok"}]},"brand_new":true}"#,
            r#"{"type":"rate_limit_event"}"#,
        ];
        let parsed: Vec<_> = lines
            .iter()
            .filter_map(|l| dec.decode(l.as_bytes()))
            .collect();
        assert_eq!(parsed.len(), 1);
        let d = dec.diagnostics();
        assert_eq!(d.lines, 9);
        assert_eq!(d.accounted(), d.lines);
        assert_eq!(d.blank, 1);
        assert_eq!(d.malformed, 2);
        assert_eq!(d.unknown.get("future_kind"), 1);
        assert_eq!(d.unknown.get("system/future_sub"), 1);
        assert_eq!(d.unknown_parts.get("delta/future_delta"), 1);
        assert_eq!(d.unknown_parts.get("stream_event/future_event"), 1);
        assert_eq!(d.unknown_fields.get("brand_new"), 1);
        assert_eq!(d.skipped.get("rate_limit_event"), 1);
    }
}
