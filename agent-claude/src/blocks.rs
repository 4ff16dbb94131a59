//! The timeline blocks a Claude conversation projects to, shared by the live projection
//! and the transcript reader, so a live row and its saved twin have the same key and
//! the latest window settles the live one (TL-01, TL-03).
//!
//! | what | block key | `data` |
//! |---|---|---|
//! | a user prompt with UUID `u` | `user` / `user-message::<u>`, operation `u` | `{"text"}` |
//! | the reply text of message `msg_…` | `agent-reply` / `msg_…` | `{"text"}` |
//! | the reasoning of message `msg_…` | `thinking` / `msg_…` | `{"text"}` |
//! | a tool call `toolu_…` with its result | `activity` / `toolu_…` | an [`ActivityRow`] |
//! | a compaction or an API error line `u` | `system` / `u` | `{"text"}` |
//! | an interruption marker `u` (`[Request interrupted by user…]`) | `system` / `u` | `{"text": "Interrupted"}` |
//! | a message absorbed mid-turn (`queued_command`, `source_uuid` `u`) | `user` / `user-message::<u>`, operation `u` | `{"text"}` |
//!
//! Invariant: the key depends only on IDs Claude wrote (a UUID, a message ID, a tool
//! call ID), never on text or time; all the text of one message lands in one row.

use timeline_core::block::Block;
use timeline_core::key::{BlockId, BlockKey, BlockType, OperationId};
use timeline_core::order::SourceOrder;
use timeline_core::rows::{ActivityRow, RowStatus};
use timeline_core::time::Millis;

/// A tool call and, once it came, its result.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    /// `toolu_…`.
    pub id: String,
    /// The tool.
    pub name: String,
    /// The arguments.
    pub input: serde_json::Value,
    /// The result: its text and whether it failed.
    pub result: Option<ToolResult>,
}

/// A tool's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolResult {
    /// The result text.
    pub text: String,
    /// True when the tool failed.
    pub is_error: bool,
    /// The UUID of the user line that carried it, when known.
    pub uuid: Option<String>,
}

fn text_data(text: &str) -> serde_json::Value {
    serde_json::json!({ "text": text })
}

fn str_field<'a>(input: &'a serde_json::Value, name: &str) -> Option<&'a str> {
    input
        .get(name)
        .and_then(|v| v.as_str())
        .filter(|s| !s.trim().is_empty())
}

/// The words of a tool call's row.
pub(crate) fn tool_row(call: &ToolCall) -> ActivityRow {
    let status = match &call.result {
        None => RowStatus::InProgress,
        Some(r) if r.is_error => RowStatus::Failed,
        Some(_) => RowStatus::Completed,
    };
    let output = call.result.as_ref().map(|r| r.text.as_str()).unwrap_or("");
    let path = str_field(&call.input, "file_path");
    match (call.name.as_str(), path) {
        ("Bash", _) if str_field(&call.input, "command").is_some() => ActivityRow::command(
            str_field(&call.input, "command").unwrap_or_default(),
            status,
            None,
            output,
        ),
        ("Read", Some(p)) => ActivityRow::file_read(p, status, output),
        ("Write", Some(p)) => ActivityRow::file_change(p, true, status, ""),
        ("Edit" | "MultiEdit", Some(p)) => ActivityRow::file_change(p, false, status, ""),
        (name, _) => {
            let summary = ["description", "pattern", "query", "url", "prompt"]
                .iter()
                .find_map(|f| str_field(&call.input, f))
                .map(timeline_core::rows::first_line);
            let detail = if output.is_empty() {
                serde_json::to_string_pretty(&call.input).unwrap_or_default()
            } else {
                output.to_owned()
            };
            let name = if name.trim().is_empty() {
                "a tool"
            } else {
                name
            };
            ActivityRow::tool_call(name, summary, status, &detail)
        }
    }
}

/// The user row of prompt `uuid`; `None` for a blank UUID.
pub(crate) fn user_block(uuid: &str, at: Millis, order: SourceOrder, text: &str) -> Option<Block> {
    let op = OperationId::new(uuid).ok()?;
    Some(
        Block::new(BlockKey::user_message(&op), at)
            .with_source_order(order)
            .with_operation(op)
            .with_data(text_data(text)),
    )
}

fn keyed(ty: BlockType, id: &str, at: Millis, order: SourceOrder) -> Option<Block> {
    Some(Block::new(BlockKey::new(ty, BlockId::new(id).ok()?), at).with_source_order(order))
}

/// The reply row of message `message_id`.
pub(crate) fn reply_block(
    message_id: &str,
    at: Millis,
    order: SourceOrder,
    text: &str,
) -> Option<Block> {
    Some(keyed(BlockType::AgentReply, message_id, at, order)?.with_data(text_data(text)))
}

/// The reasoning row of message `message_id`.
pub(crate) fn thinking_block(
    message_id: &str,
    at: Millis,
    order: SourceOrder,
    text: &str,
) -> Option<Block> {
    Some(keyed(BlockType::Thinking, message_id, at, order)?.with_data(text_data(text)))
}

/// The activity row of a tool call.
pub(crate) fn tool_block(call: &ToolCall, at: Millis, order: SourceOrder) -> Option<Block> {
    // An ActivityRow is plain strings and enums: serializing it cannot fail.
    let data = serde_json::to_value(tool_row(call)).unwrap_or_default();
    Some(keyed(BlockType::Activity, &call.id, at, order)?.with_data(data))
}

/// A system row.
pub(crate) fn system_block(
    uuid: &str,
    at: Millis,
    order: SourceOrder,
    text: &str,
) -> Option<Block> {
    Some(keyed(BlockType::System, uuid, at, order)?.with_data(text_data(text)))
}

/// The words of the row an interrupted turn shows: the words of the row Codex shows
/// for the same event (`agent-codex` history, `turn_aborted` `interrupted`).
pub(crate) const INTERRUPTED_TEXT: &str = "Interrupted";

/// The row of an interruption marker `uuid`: a system row, keyed by the marker's UUID
/// (the stream-json line and the transcript entry carry the same one), so the live row
/// and its saved twin share the key.
pub(crate) fn interrupted_block(uuid: &str, at: Millis, order: SourceOrder) -> Option<Block> {
    system_block(uuid, at, order, INTERRUPTED_TEXT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_rows_use_the_row_constructors() {
        let mut call = ToolCall {
            id: "toolu_1".into(),
            name: "Bash".into(),
            input: serde_json::json!({"command": "mix test", "description": "Run tests"}),
            result: None,
        };
        let row = tool_row(&call);
        assert_eq!(row.title, "mix test");
        assert_eq!(row.status, RowStatus::InProgress);
        call.result = Some(ToolResult {
            text: "boom".into(),
            is_error: true,
            uuid: None,
        });
        assert_eq!(tool_row(&call).status, RowStatus::Failed);
        call.name = "Glob".into();
        call.input = serde_json::json!({"pattern": "**/*.ex"});
        let row = tool_row(&call);
        assert_eq!(row.title, "Used Glob");
        assert_eq!(row.subtitle.as_deref(), Some("**/*.ex"));
        assert!(
            timeline_core::rows::validate(&row).is_empty(),
            "{:?}",
            timeline_core::rows::validate(&row)
        );
    }
}
