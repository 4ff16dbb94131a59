//! Codex rollout files (`~/.codex/sessions/YYYY/MM/DD/rollout-<ts>-<threadId>.jsonl`),
//! read sans-IO from bytes.
//!
//! A line is `{timestamp, ordinal?, type, payload}` (`RolloutLine`); `type` is one of
//! `session_meta`, `turn_context`, `response_item`, `event_msg`, `compacted`,
//! `world_state`, `inter_agent_communication(_metadata)`. The records this crate uses
//! are typed ([`RolloutRecord`]); the ones it knows and does not use are
//! [`RolloutRecord::Skipped`]; everything else is [`RolloutRecord::Unknown`] and
//! counted. Both history modes are read: `legacy` (`event_msg` `user_message`,
//! `agent_message`, ...) and `paginated` (`event_msg` `item_completed` with a turn item).
//! Versions present in the data: 0.58.0 (real) and 0.146.0 (synthetic coverage).
//!
//! Invariants of [`RolloutReader::read`]:
//! - Only complete lines (ending in `\n`) are read; the bytes after the last newline are
//!   left for the next read (a line Codex is still writing), and `consumed` says how far
//!   the caller may advance. [`RolloutReader::read_to_end`] reads a final line without a
//!   newline only when it is whole JSON.
//! - No line is fatal: a line that is not JSON, or a known type without what this crate
//!   needs, is counted as malformed and skipped; blank lines are skipped.
//!
//! ```
//! use agent_codex::rollout::{RolloutReader, RolloutRecord, EventMsg};
//!
//! let bytes = b"{\"timestamp\":\"t\",\"type\":\"event_msg\",\"payload\":{\"type\":\"user_message\",\"message\":\"hi\",\"client_id\":\"op-1\"}}\n{\"timestamp\":\"t\",\"type\":\"event";
//! let mut reader = RolloutReader::new();
//! let batch = reader.read(bytes);
//! assert_eq!(batch.lines.len(), 1);
//! assert!(matches!(
//!     &batch.lines[0].record,
//!     RolloutRecord::EventMsg(EventMsg::UserMessage { client_id: Some(id), .. }) if id == "op-1"
//! ));
//! // The torn tail is left for the next read.
//! assert_eq!(&bytes[batch.consumed..], b"{\"timestamp\":\"t\",\"type\":\"event");
//! ```

use serde_json::Value;

use crate::diag::{Diagnostics, Skip};
use crate::protocol::{opt_str, opt_u64};

/// `session_meta`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionMeta {
    /// The thread ID.
    pub id: String,
    /// The Codex version that wrote the file.
    pub cli_version: Option<String>,
    /// `codex_cli_rs`, `codex_exec`, `Codex Desktop`, ...
    pub originator: Option<String>,
    /// `legacy` (default) or `paginated`.
    pub history_mode: Option<String>,
    /// The thread this one was forked from.
    pub forked_from_id: Option<String>,
}

/// `response_item` payloads.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResponseItem {
    /// A model message (`user` messages include injected context).
    Message {
        /// `user`, `assistant`, `developer`, `system`.
        role: String,
        /// Its text parts, joined by newlines.
        text: String,
    },
    /// Reasoning with its summary.
    Reasoning {
        /// Summary parts.
        summary: Vec<String>,
    },
    /// A function call (`shell`, `exec_command`, `apply_patch`, `mcp__server__tool`).
    FunctionCall {
        /// The function.
        name: String,
        /// The arguments (a JSON string).
        arguments: String,
        /// The call.
        call_id: String,
    },
    /// The output of a function call.
    FunctionCallOutput {
        /// The call.
        call_id: String,
        /// The output text.
        output: String,
    },
    /// A freeform tool call (`apply_patch` text).
    CustomToolCall {
        /// The tool.
        name: String,
        /// Its input.
        input: String,
        /// The call.
        call_id: String,
    },
    /// The output of a custom tool call.
    CustomToolCallOutput {
        /// The call.
        call_id: String,
        /// The output text.
        output: String,
    },
    /// A web search.
    WebSearchCall {
        /// The query, when the action names one.
        query: Option<String>,
    },
    /// A response item type known and not used here (`ghost_snapshot`,
    /// `tool_search_call`, `image_generation_call`, ...).
    Other {
        /// Its `type`.
        item_type: String,
    },
}

/// A turn item of a paginated-mode `item_completed`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TurnItem {
    /// `UserMessage` with its client ID.
    UserMessage {
        /// The item ID.
        id: Option<String>,
        /// The client ID (the operation ID).
        client_id: Option<String>,
        /// Its text parts, joined by newlines.
        text: String,
    },
    /// `AgentMessage`.
    AgentMessage {
        /// The item ID.
        id: Option<String>,
        /// The text.
        text: String,
        /// `commentary`, `final_answer`, ...
        phase: Option<String>,
    },
    /// `Reasoning`, with its summary.
    Reasoning {
        /// The item ID.
        id: Option<String>,
        /// The summary parts (or, without any, the raw parts), joined by blank lines.
        text: String,
    },
    /// `Plan`.
    Plan {
        /// The item ID.
        id: Option<String>,
        /// The plan text.
        text: String,
    },
    /// Any other turn item (`Reasoning`, `CommandExecution`, `Extension`, ...).
    Other {
        /// Its `type`.
        item_type: String,
    },
}

/// `event_msg` payloads.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EventMsg {
    /// A user message (legacy mode) with its client ID (0.136 and later).
    UserMessage {
        /// The text.
        message: String,
        /// The client ID (the operation ID).
        client_id: Option<String>,
    },
    /// Reply text (legacy mode).
    AgentMessage {
        /// The text.
        message: String,
        /// `commentary`, `final_answer`, ...
        phase: Option<String>,
    },
    /// Reasoning text (legacy mode).
    AgentReasoning {
        /// The text.
        text: String,
    },
    /// A turn started (alias `turn_started`).
    TaskStarted {
        /// The turn.
        turn_id: Option<String>,
    },
    /// A turn ended (alias `turn_complete`).
    TaskComplete {
        /// The turn.
        turn_id: Option<String>,
    },
    /// A turn was aborted.
    TurnAborted {
        /// The turn.
        turn_id: Option<String>,
        /// `interrupted`, `replaced`, ...
        reason: Option<String>,
    },
    /// The latest `num_turns` turns were rolled back.
    ThreadRolledBack {
        /// How many.
        num_turns: u64,
    },
    /// A completed turn item (paginated mode).
    ItemCompleted {
        /// The turn.
        turn_id: Option<String>,
        /// The item.
        item: TurnItem,
    },
    /// An error Codex reported to the user.
    Error {
        /// The message.
        message: String,
    },
    /// The end of a command (persisted by some versions): the outcome of call `call_id`.
    ExecCommandEnd {
        /// The call.
        call_id: String,
        /// The output (aggregated, else stdout and stderr).
        output: String,
        /// The exit code.
        exit_code: Option<i64>,
    },
    /// The end of a patch: the outcome of call `call_id`.
    PatchApplyEnd {
        /// The call.
        call_id: String,
        /// Whether it applied.
        success: bool,
        /// What it printed.
        output: String,
    },
    /// The end of an MCP tool call: the outcome of call `call_id`.
    McpToolCallEnd {
        /// The call.
        call_id: String,
        /// The result's text parts, or the error.
        output: String,
        /// True when the call failed.
        failed: bool,
    },
    /// An event type known and not used here (`token_count`, ...).
    Other {
        /// Its `type`.
        event_type: String,
    },
}

/// What one rollout line holds.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RolloutRecord {
    /// `session_meta`.
    SessionMeta(SessionMeta),
    /// `turn_context`.
    TurnContext {
        /// The turn (0.9x and later).
        turn_id: Option<String>,
        /// The model.
        model: Option<String>,
    },
    /// `response_item`.
    ResponseItem(ResponseItem),
    /// `event_msg`.
    EventMsg(EventMsg),
    /// `compacted`.
    Compacted {
        /// The summary message.
        message: String,
    },
    /// A line type known and deliberately not read (`world_state`,
    /// `inter_agent_communication`, `inter_agent_communication_metadata`).
    Skipped {
        /// Its `type`.
        line_type: String,
    },
    /// A line type this version does not know (counted).
    Unknown {
        /// Its `type` (empty when it has none).
        line_type: String,
    },
}

/// One rollout line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutLine {
    /// `timestamp` as written (ISO-8601; fixtures may hold anything).
    pub timestamp: Option<String>,
    /// `ordinal` (newer files).
    pub ordinal: Option<u64>,
    /// What it holds.
    pub record: RolloutRecord,
    /// The census label: the line `type`, and for `event_msg` / `response_item` the
    /// payload `type` after a slash (`event_msg/user_message`).
    pub label: String,
}

/// Event types this crate knows and does not type (persisted by some version).
pub const KNOWN_EVENTS: &[&str] = &[
    "token_count",
    "agent_reasoning_raw_content",
    "exec_command_end",
    "patch_apply_end",
    "mcp_tool_call_end",
    "web_search_end",
    "image_generation_end",
    "view_image_tool_call",
    "context_compacted",
    "entered_review_mode",
    "exited_review_mode",
    "sub_agent_activity",
    "thread_goal_updated",
    "thread_settings_applied",
    "thread_name_updated",
    "undo_completed",
    "error",
    "guardian_assessment",
    "dynamic_tool_call_request",
    "dynamic_tool_call_response",
    "collab_agent_spawn_end",
    "collab_agent_interaction_end",
    "collab_waiting_end",
    "collab_close_end",
];

/// Response item types this crate knows and does not type.
pub const KNOWN_RESPONSE_ITEMS: &[&str] = &[
    "ghost_snapshot",
    "local_shell_call",
    "tool_search_call",
    "tool_search_output",
    "image_generation_call",
    "agent_message",
    "compaction",
    "context_compaction",
];

/// Line types this crate knows and does not read.
pub const SKIPPED_LINES: &[&str] = &[
    "world_state",
    "inter_agent_communication",
    "inter_agent_communication_metadata",
];

fn text_of(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| opt_str(p, "text"))
            .collect::<Vec<_>>()
            .join("\n"),
        Some(Value::Object(_)) => v
            .and_then(|o| opt_str(o, "text"))
            .unwrap_or_default()
            .to_owned(),
        _ => String::new(),
    }
}

fn strings_of(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|p| p.as_str().or_else(|| opt_str(p, "text")))
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

fn owned(v: &Value, f: &str) -> Option<String> {
    opt_str(v, f).map(str::to_owned)
}

/// Why a line was not read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LineError {
    /// Not JSON (or not an object).
    #[error("the line is not a JSON object")]
    NotJson,
    /// A known type without a field this crate needs.
    #[error("`{label}` has no usable `{field}`")]
    Shape {
        /// The census label.
        label: String,
        /// The field.
        field: &'static str,
    },
}

/// Reads one line (without its newline).
pub fn parse_line(bytes: &[u8]) -> Result<RolloutLine, LineError> {
    let v: Value = serde_json::from_slice(bytes).map_err(|_| LineError::NotJson)?;
    if !v.is_object() {
        return Err(LineError::NotJson);
    }
    let line_type = opt_str(&v, "type").unwrap_or_default().to_owned();
    let payload = v.get("payload").unwrap_or(&Value::Null);
    let sub = opt_str(payload, "type").unwrap_or_default();
    let label = match line_type.as_str() {
        "event_msg" | "response_item" => format!("{line_type}/{sub}"),
        _ => line_type.clone(),
    };
    let shape = |field| LineError::Shape {
        label: label.clone(),
        field,
    };
    let record = match line_type.as_str() {
        "session_meta" => RolloutRecord::SessionMeta(SessionMeta {
            id: owned(payload, "id").ok_or_else(|| shape("id"))?,
            cli_version: owned(payload, "cli_version"),
            originator: owned(payload, "originator"),
            history_mode: owned(payload, "history_mode"),
            forked_from_id: owned(payload, "forked_from_id"),
        }),
        "turn_context" => RolloutRecord::TurnContext {
            turn_id: owned(payload, "turn_id"),
            model: owned(payload, "model"),
        },
        "compacted" => RolloutRecord::Compacted {
            message: owned(payload, "message").unwrap_or_default(),
        },
        "response_item" => RolloutRecord::ResponseItem(match sub {
            "message" => ResponseItem::Message {
                role: owned(payload, "role").ok_or_else(|| shape("role"))?,
                text: text_of(payload.get("content")),
            },
            "reasoning" => ResponseItem::Reasoning {
                summary: payload
                    .get("summary")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|s| opt_str(s, "text"))
                            .map(str::to_owned)
                            .collect()
                    })
                    .unwrap_or_default(),
            },
            "function_call" => ResponseItem::FunctionCall {
                name: owned(payload, "name").ok_or_else(|| shape("name"))?,
                arguments: owned(payload, "arguments").unwrap_or_default(),
                call_id: owned(payload, "call_id").ok_or_else(|| shape("call_id"))?,
            },
            "function_call_output" => ResponseItem::FunctionCallOutput {
                call_id: owned(payload, "call_id").ok_or_else(|| shape("call_id"))?,
                output: text_of(payload.get("output")),
            },
            "custom_tool_call" => ResponseItem::CustomToolCall {
                name: owned(payload, "name").ok_or_else(|| shape("name"))?,
                input: owned(payload, "input").unwrap_or_default(),
                call_id: owned(payload, "call_id").ok_or_else(|| shape("call_id"))?,
            },
            "custom_tool_call_output" => ResponseItem::CustomToolCallOutput {
                call_id: owned(payload, "call_id").ok_or_else(|| shape("call_id"))?,
                output: text_of(payload.get("output")),
            },
            "web_search_call" => ResponseItem::WebSearchCall {
                query: payload
                    .get("action")
                    .and_then(|a| opt_str(a, "query"))
                    .or_else(|| opt_str(payload, "query"))
                    .map(str::to_owned),
            },
            t if KNOWN_RESPONSE_ITEMS.contains(&t) => ResponseItem::Other {
                item_type: t.to_owned(),
            },
            _ => {
                return Ok(RolloutLine {
                    timestamp: owned(&v, "timestamp"),
                    ordinal: opt_u64(&v, "ordinal"),
                    record: RolloutRecord::Unknown {
                        line_type: label.clone(),
                    },
                    label,
                })
            }
        }),
        "event_msg" => RolloutRecord::EventMsg(match sub {
            "user_message" => EventMsg::UserMessage {
                message: owned(payload, "message").ok_or_else(|| shape("message"))?,
                client_id: owned(payload, "client_id"),
            },
            "agent_message" => EventMsg::AgentMessage {
                message: owned(payload, "message").ok_or_else(|| shape("message"))?,
                phase: owned(payload, "phase"),
            },
            "agent_reasoning" => EventMsg::AgentReasoning {
                text: owned(payload, "text").unwrap_or_default(),
            },
            "task_started" | "turn_started" => EventMsg::TaskStarted {
                turn_id: owned(payload, "turn_id"),
            },
            "task_complete" | "turn_complete" => EventMsg::TaskComplete {
                turn_id: owned(payload, "turn_id"),
            },
            "turn_aborted" => EventMsg::TurnAborted {
                turn_id: owned(payload, "turn_id"),
                reason: owned(payload, "reason"),
            },
            "thread_rolled_back" => EventMsg::ThreadRolledBack {
                num_turns: opt_u64(payload, "num_turns").ok_or_else(|| shape("num_turns"))?,
            },
            "item_completed" => {
                let item = payload.get("item").ok_or_else(|| shape("item"))?;
                let item_type = opt_str(item, "type").ok_or_else(|| shape("item.type"))?;
                EventMsg::ItemCompleted {
                    turn_id: owned(payload, "turn_id"),
                    item: match item_type {
                        "UserMessage" => TurnItem::UserMessage {
                            id: owned(item, "id"),
                            client_id: owned(item, "client_id"),
                            text: text_of(item.get("content")),
                        },
                        "AgentMessage" => TurnItem::AgentMessage {
                            id: owned(item, "id"),
                            text: text_of(item.get("content")),
                            phase: owned(item, "phase"),
                        },
                        "Reasoning" => TurnItem::Reasoning {
                            id: owned(item, "id"),
                            text: {
                                let summary = strings_of(item.get("summary_text"));
                                let parts = if summary.is_empty() {
                                    strings_of(item.get("raw_content"))
                                } else {
                                    summary
                                };
                                parts.join("\n\n")
                            },
                        },
                        "Plan" => TurnItem::Plan {
                            id: owned(item, "id"),
                            text: owned(item, "text").unwrap_or_default(),
                        },
                        other => TurnItem::Other {
                            item_type: other.to_owned(),
                        },
                    },
                }
            }
            "error" => EventMsg::Error {
                message: owned(payload, "message").unwrap_or_default(),
            },
            "exec_command_end" => EventMsg::ExecCommandEnd {
                call_id: owned(payload, "call_id").ok_or_else(|| shape("call_id"))?,
                output: owned(payload, "aggregated_output")
                    .or_else(|| owned(payload, "formatted_output"))
                    .unwrap_or_else(|| {
                        let out = opt_str(payload, "stdout").unwrap_or_default();
                        let err = opt_str(payload, "stderr").unwrap_or_default();
                        format!("{out}{err}")
                    }),
                exit_code: payload.get("exit_code").and_then(Value::as_i64),
            },
            "patch_apply_end" => EventMsg::PatchApplyEnd {
                call_id: owned(payload, "call_id").ok_or_else(|| shape("call_id"))?,
                success: payload
                    .get("success")
                    .and_then(Value::as_bool)
                    .unwrap_or(true),
                output: {
                    let out = opt_str(payload, "stdout").unwrap_or_default();
                    let err = opt_str(payload, "stderr").unwrap_or_default();
                    format!("{out}{err}")
                },
            },
            "mcp_tool_call_end" => {
                let result = payload.get("result").unwrap_or(&Value::Null);
                let (output, failed) = match (result.get("Ok"), result.get("Err")) {
                    (Some(ok), _) => (
                        text_of(ok.get("content")),
                        ok.get("isError").and_then(Value::as_bool).unwrap_or(false),
                    ),
                    (None, Some(err)) => (
                        err.as_str()
                            .map(str::to_owned)
                            .unwrap_or_else(|| err.to_string()),
                        true,
                    ),
                    (None, None) => (String::new(), false),
                };
                EventMsg::McpToolCallEnd {
                    call_id: owned(payload, "call_id").ok_or_else(|| shape("call_id"))?,
                    output,
                    failed,
                }
            }
            t if KNOWN_EVENTS.contains(&t) => EventMsg::Other {
                event_type: t.to_owned(),
            },
            _ => {
                return Ok(RolloutLine {
                    timestamp: owned(&v, "timestamp"),
                    ordinal: opt_u64(&v, "ordinal"),
                    record: RolloutRecord::Unknown {
                        line_type: label.clone(),
                    },
                    label,
                })
            }
        }),
        t if SKIPPED_LINES.contains(&t) => RolloutRecord::Skipped {
            line_type: t.to_owned(),
        },
        _ => RolloutRecord::Unknown {
            line_type: label.clone(),
        },
    };
    Ok(RolloutLine {
        timestamp: owned(&v, "timestamp"),
        ordinal: opt_u64(&v, "ordinal"),
        record,
        label,
    })
}

/// What one read produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadBatch {
    /// The lines read, in file order (malformed lines left out, and counted).
    pub lines: Vec<RolloutLine>,
    /// How many bytes of the input were read: the caller's next read starts there.
    pub consumed: usize,
    /// True when bytes after the last line were left (a line being written).
    pub torn_tail: bool,
}

/// The rollout reader: counts what it skips and reads the Codex version from the
/// first `session_meta`. See the module doc for the drive loop.
#[derive(Clone, Debug, Default)]
pub struct RolloutReader {
    diagnostics: Diagnostics,
}

impl RolloutReader {
    /// A reader with no counts.
    pub fn new() -> RolloutReader {
        RolloutReader::default()
    }

    /// What was skipped so far, and the Codex version the file states.
    pub fn diagnostics(&self) -> &Diagnostics {
        &self.diagnostics
    }

    /// Reads every complete line of `buf`; the tail after the last newline is left.
    pub fn read(&mut self, buf: &[u8]) -> ReadBatch {
        let mut batch = ReadBatch::default();
        let mut start = 0;
        while let Some(rel) = buf
            .get(start..)
            .and_then(|rest| rest.iter().position(|&b| b == b'\n'))
        {
            let end = start + rel;
            if let Some(line) = buf.get(start..end) {
                self.take(line, &mut batch.lines);
            }
            start = end + 1;
        }
        batch.consumed = start;
        batch.torn_tail = start < buf.len();
        batch
    }

    /// Reads `buf` to its end: like [`RolloutReader::read`], and a final line without a
    /// newline is read too when it is whole JSON (a file that ended without one);
    /// otherwise it stays unconsumed.
    pub fn read_to_end(&mut self, buf: &[u8]) -> ReadBatch {
        let mut batch = self.read(buf);
        if batch.torn_tail {
            let tail = buf.get(batch.consumed..).unwrap_or_default();
            let body = tail.strip_suffix(b"\r").unwrap_or(tail);
            if serde_json::from_slice::<Value>(body).is_ok() {
                self.take(tail, &mut batch.lines);
                batch.consumed = buf.len();
                batch.torn_tail = false;
            }
        }
        batch
    }

    fn take(&mut self, line: &[u8], out: &mut Vec<RolloutLine>) {
        out.extend(self.line(line));
    }

    /// Reads one line (without its newline; a trailing `\r` is dropped): the typed line,
    /// or `None` for a blank line and for a line that is counted as malformed.
    pub fn line(&mut self, line: &[u8]) -> Option<RolloutLine> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            return None;
        }
        match parse_line(line) {
            Ok(l) => {
                match &l.record {
                    // The first `session_meta` is the file's own session; a forked
                    // rollout repeats its ancestors' after it.
                    RolloutRecord::SessionMeta(m) if self.diagnostics.agent_version.is_none() => {
                        if let Some(v) = &m.cli_version {
                            self.diagnostics.set_version(v);
                        }
                    }
                    RolloutRecord::Unknown { line_type } => {
                        self.diagnostics
                            .count(Skip::Unknown, format!("line:{line_type}"));
                    }
                    RolloutRecord::Skipped { line_type } => {
                        self.diagnostics
                            .count(Skip::Ignored, format!("line:{line_type}"));
                    }
                    _ => {}
                }
                Some(l)
            }
            Err(LineError::NotJson) => {
                self.diagnostics.count(Skip::Malformed, "line:not-json");
                None
            }
            Err(LineError::Shape { label, .. }) => {
                self.diagnostics
                    .count(Skip::Malformed, format!("line:{label}"));
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const USER: &[u8] =
        br#"{"timestamp":"t","type":"event_msg","payload":{"type":"user_message","message":"hi"}}"#;

    #[test]
    fn a_torn_last_line_is_left_for_the_next_read() {
        let mut file = USER.to_vec();
        file.push(b'\n');
        let half = USER.len() / 2;
        file.extend_from_slice(&USER[..half]);
        let mut r = RolloutReader::new();
        let b = r.read(&file);
        assert_eq!(b.lines.len(), 1);
        assert!(b.torn_tail);
        assert_eq!(b.consumed, USER.len() + 1);
        // The writer finishes the line: the next read starts at `consumed`.
        file.extend_from_slice(&USER[half..]);
        file.push(b'\n');
        let b2 = r.read(&file[b.consumed..]);
        assert_eq!(b2.lines.len(), 1);
        assert!(!b2.torn_tail);
        assert_eq!(r.diagnostics().total(Skip::Malformed), 0);
    }

    #[test]
    fn read_to_end_takes_a_whole_last_line_without_newline_only() {
        let mut r = RolloutReader::new();
        let b = r.read_to_end(USER);
        assert_eq!(
            (b.lines.len(), b.consumed, b.torn_tail),
            (1, USER.len(), false)
        );
        let torn = &USER[..10];
        let b = r.read_to_end(torn);
        assert_eq!((b.lines.len(), b.consumed, b.torn_tail), (0, 0, true));
    }

    #[test]
    fn bad_and_unknown_lines_are_counted_not_fatal() {
        let input = b"not json\n\n{\"type\":\"future_line\",\"payload\":{}}\r\n{\"type\":\"event_msg\",\"payload\":{\"type\":\"user_message\"}}\n{\"type\":\"event_msg\",\"payload\":{\"type\":\"brand_new\"}}\n";
        let mut r = RolloutReader::new();
        let b = r.read(input);
        assert_eq!(b.consumed, input.len());
        assert_eq!(b.lines.len(), 2);
        let d = r.diagnostics();
        assert_eq!(d.get(Skip::Malformed, "line:not-json"), 1);
        assert_eq!(d.get(Skip::Malformed, "line:event_msg/user_message"), 1);
        assert_eq!(d.get(Skip::Unknown, "line:future_line"), 1);
        assert_eq!(d.get(Skip::Unknown, "line:event_msg/brand_new"), 1);
    }
}
