//! Rollout lines into history rows, sans-IO: what each line means to the conversation
//! ([`LineRole`]) and the blocks a row-producing line projects to ([`blocks`]). The
//! pagers of [`crate::tail`] call these; nothing here knows about files or pages.
//!
//! Which lines give rows (the rest project to nothing and are read past):
//!
//! | line | row | block key |
//! |---|---|---|
//! | `event_msg` `user_message` / `item_completed` `UserMessage` with client ID `op` | the user's message | `user` / `user-message::<op>`, operation `op` |
//! | the same without a client ID | the user's message | `user` / `rollout-<offset>` |
//! | `event_msg` `agent_message` / `item_completed` `AgentMessage` | the reply | `agent-reply` / `rollout-<offset>` |
//! | `event_msg` `agent_reasoning` / `item_completed` `Reasoning` with words | the reasoning summary | `thinking` / `rollout-<offset>` |
//! | `response_item` `function_call` / `custom_tool_call` | a command, file change (`apply_patch`, also run through the shell), plan or tool call, joined with its output | `activity` / `rollout-<offset>` |
//! | `response_item` `web_search_call` | a web search | `activity` / `rollout-<offset>` |
//! | `item_completed` `Plan` | the plan | `activity` / `rollout-<offset>` |
//! | `compacted`, `event_msg` `turn_aborted` (interrupted), `event_msg` `error` | a system line | `system` / `rollout-<offset>` |
//!
//! The user's words come from `event_msg` lines (the `response_item` user messages also
//! hold injected context), the reply and the reasoning from `event_msg` too (their
//! `response_item` twins are the same text), as Codex rebuilds a thread from its
//! rollout. Calls come from `response_item` lines because no version persists every
//! command's end event; `function_call_output`, `custom_tool_call_output` and the end
//! events (`exec_command_end`, `patch_apply_end`, `mcp_tool_call_end`) are the outputs
//! joined to their call by `call_id` ([`LineRole::Output`]).
//!
//! Invariants: a key depends only on what the file holds (the operation ID, or the
//! line's byte offset, unique in the file), never on the page that read it, so a row
//! read twice has one key; only a user row can share its key with a live row (by its
//! operation, TL-03): Codex does not persist live item IDs. Every row is placed at its
//! line's time and `[0, 0, offset, 0]` (TL-05, the legacy Codex form), so rows order as
//! the file does.

use serde_json::Value;
use timeline_core::block::Block;
use timeline_core::key::{BlockId, BlockKey, BlockType, OperationId};
use timeline_core::order::SourceOrder;
use timeline_core::rows::{
    first_line_chars, ActivityKind, ActivityRow, Detail, Display, RowStatus,
};
use timeline_core::time::Millis;

use crate::rollout::{EventMsg, ResponseItem, RolloutLine, RolloutRecord, TurnItem};

/// The outcome of a call, from a later line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallOutput {
    /// What it printed or returned.
    pub text: String,
    /// The exit code, when the output states one.
    pub exit_code: Option<i64>,
    /// True when the call failed (a non-zero exit, a failed patch, an MCP error).
    pub failed: bool,
}

impl CallOutput {
    /// Reads a `function_call_output` / `custom_tool_call_output` text: the JSON form of
    /// older versions (`{"output": …, "metadata": {"exit_code": …}}`), or the text form
    /// of newer ones (`Exit code: N` / `Process exited with code N`, then `Output:`).
    pub fn from_text(text: &str) -> CallOutput {
        if let Ok(Value::Object(o)) = serde_json::from_str::<Value>(text) {
            if let Some(out) = o.get("output").and_then(Value::as_str) {
                let exit_code = o
                    .get("metadata")
                    .and_then(|m| m.get("exit_code"))
                    .and_then(Value::as_i64);
                return CallOutput {
                    text: out.to_owned(),
                    exit_code,
                    failed: exit_code.is_some_and(|c| c != 0),
                };
            }
        }
        let exit_code = text.lines().find_map(|l| {
            let l = l.trim();
            l.strip_prefix("Exit code: ")
                .or_else(|| l.strip_prefix("Process exited with code "))
                .and_then(|n| n.trim().parse::<i64>().ok())
        });
        let body = match (exit_code, text.split_once("\nOutput:\n")) {
            (Some(_), Some((_, out))) => out,
            _ => text,
        };
        CallOutput {
            text: body.to_owned(),
            exit_code,
            failed: exit_code.is_some_and(|c| c != 0),
        }
    }
}

/// A tool call as the rollout wrote it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// The call ID its output names.
    pub call_id: String,
    /// The function (`shell`, `exec_command`, `apply_patch`, `update_plan`,
    /// `mcp__server__tool`, ...).
    pub name: String,
    /// The arguments (a JSON text) or the freeform input.
    pub input: String,
}

/// A row-producing line.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Entry {
    /// The user's message; it begins a turn.
    User {
        /// The client ID (the operation ID), when sent with one.
        client_id: Option<String>,
        /// The text.
        text: String,
    },
    /// Reply text.
    Reply {
        /// The text.
        text: String,
        /// `commentary`, `final_answer`, ...
        phase: Option<String>,
    },
    /// Reasoning summary text.
    Reasoning {
        /// The text.
        text: String,
    },
    /// A tool call.
    Call(Call),
    /// A web search.
    Search {
        /// The query.
        query: Option<String>,
    },
    /// A plan.
    Plan {
        /// The plan text.
        text: String,
    },
    /// A system line (compaction, an interrupted turn, an error).
    System {
        /// The words.
        text: String,
    },
}

/// What one line means to the history.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LineRole {
    /// A row-producing line.
    Entry(Entry),
    /// The outcome of call `call_id`.
    Output {
        /// The call.
        call_id: String,
        /// Its outcome.
        output: CallOutput,
    },
    /// The latest `turns` turns before this line are not part of the conversation any
    /// more (a turn begins with its user message, as Codex counts turns it rolls back).
    RolledBack {
        /// How many.
        turns: u64,
    },
    /// Nothing a row shows (metadata, token counts, duplicates of other lines, ...).
    Nothing,
}

impl Entry {
    /// True for the user's message, which begins a turn.
    pub fn begins_turn(&self) -> bool {
        matches!(self, Entry::User { .. })
    }

    /// The call ID of a call.
    pub fn call_id(&self) -> Option<&str> {
        match self {
            Entry::Call(c) => Some(c.call_id.as_str()),
            _ => None,
        }
    }
}

/// What `line` means to the history.
pub fn role(line: &RolloutLine) -> LineRole {
    match &line.record {
        RolloutRecord::EventMsg(e) => event_role(e),
        RolloutRecord::ResponseItem(r) => match r {
            ResponseItem::FunctionCall {
                name,
                arguments,
                call_id,
            } => LineRole::Entry(Entry::Call(Call {
                call_id: call_id.clone(),
                name: name.clone(),
                input: arguments.clone(),
            })),
            ResponseItem::CustomToolCall {
                name,
                input,
                call_id,
            } => LineRole::Entry(Entry::Call(Call {
                call_id: call_id.clone(),
                name: name.clone(),
                input: input.clone(),
            })),
            ResponseItem::FunctionCallOutput { call_id, output }
            | ResponseItem::CustomToolCallOutput { call_id, output } => LineRole::Output {
                call_id: call_id.clone(),
                output: CallOutput::from_text(output),
            },
            ResponseItem::WebSearchCall { query } => LineRole::Entry(Entry::Search {
                query: query.clone(),
            }),
            _ => LineRole::Nothing,
        },
        RolloutRecord::Compacted { .. } => LineRole::Entry(Entry::System {
            text: "Context compacted".to_owned(),
        }),
        _ => LineRole::Nothing,
    }
}

fn event_role(e: &EventMsg) -> LineRole {
    let entry = match e {
        EventMsg::UserMessage { message, client_id } => Entry::User {
            client_id: client_id.clone(),
            text: message.clone(),
        },
        EventMsg::AgentMessage { message, phase } => Entry::Reply {
            text: message.clone(),
            phase: phase.clone(),
        },
        // Reasoning without words (only encrypted content) shows nothing.
        EventMsg::AgentReasoning { text } if text.trim().is_empty() => return LineRole::Nothing,
        EventMsg::AgentReasoning { text } => Entry::Reasoning { text: text.clone() },
        EventMsg::ItemCompleted { item, .. } => match item {
            TurnItem::UserMessage {
                client_id, text, ..
            } => Entry::User {
                client_id: client_id.clone(),
                text: text.clone(),
            },
            TurnItem::AgentMessage { text, phase, .. } => Entry::Reply {
                text: text.clone(),
                phase: phase.clone(),
            },
            TurnItem::Reasoning { text, .. } if text.trim().is_empty() => return LineRole::Nothing,
            TurnItem::Reasoning { text, .. } => Entry::Reasoning { text: text.clone() },
            TurnItem::Plan { text, .. } => Entry::Plan { text: text.clone() },
            // Commands, tool calls and file changes come from their `response_item`
            // lines; the rest shows nothing.
            _ => return LineRole::Nothing,
        },
        EventMsg::TurnAborted { reason, .. } if reason.as_deref() == Some("interrupted") => {
            Entry::System {
                text: "Interrupted".to_owned(),
            }
        }
        EventMsg::Error { message } if !message.trim().is_empty() => Entry::System {
            text: message.clone(),
        },
        EventMsg::ThreadRolledBack { num_turns } => {
            return LineRole::RolledBack { turns: *num_turns }
        }
        EventMsg::ExecCommandEnd {
            call_id,
            output,
            exit_code,
        } => {
            return LineRole::Output {
                call_id: call_id.clone(),
                output: CallOutput {
                    text: output.clone(),
                    exit_code: *exit_code,
                    failed: exit_code.is_some_and(|c| c != 0),
                },
            }
        }
        EventMsg::PatchApplyEnd {
            call_id,
            success,
            output,
        } => {
            return LineRole::Output {
                call_id: call_id.clone(),
                output: CallOutput {
                    text: output.clone(),
                    exit_code: None,
                    failed: !success,
                },
            }
        }
        EventMsg::McpToolCallEnd {
            call_id,
            output,
            failed,
        } => {
            return LineRole::Output {
                call_id: call_id.clone(),
                output: CallOutput {
                    text: output.clone(),
                    exit_code: None,
                    failed: *failed,
                },
            }
        }
        _ => return LineRole::Nothing,
    };
    LineRole::Entry(entry)
}

/// The text of a command: the script of `sh -lc <script>`, else the words joined, each
/// quoted when it holds a space or a quote.
pub fn command_text(argv: &[String]) -> String {
    if let [shell, flag, script] = argv {
        if shell.ends_with("sh") && (flag == "-lc" || flag == "-c") {
            return script.clone();
        }
    }
    argv.iter()
        .map(|a| {
            if a.is_empty() || a.contains([' ', '\t', '\n', '\'', '"']) {
                format!("'{}'", a.replace('\'', r"'\''"))
            } else {
                a.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn strings(v: Option<&Value>) -> Option<Vec<String>> {
    v.and_then(Value::as_array).map(|a| {
        a.iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect()
    })
}

/// The files an `apply_patch` text touches: `(path, created)`.
pub fn patch_files(patch: &str) -> Vec<(String, bool)> {
    patch
        .lines()
        .filter_map(|l| {
            let l = l.trim_end();
            if let Some(p) = l.strip_prefix("*** Add File: ") {
                Some((p.to_owned(), true))
            } else {
                l.strip_prefix("*** Update File: ")
                    .or_else(|| l.strip_prefix("*** Delete File: "))
                    .map(|p| (p.to_owned(), false))
            }
        })
        .collect()
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').find(|s| !s.is_empty()).unwrap_or(path)
}

/// The row of a patch: one file changed, or how many (with their names).
pub fn patch_row(patch: &str, status: RowStatus) -> ActivityRow {
    match patch_files(patch).as_slice() {
        [] => ActivityRow::tool_call("apply_patch", None, status, patch),
        [(path, created)] => ActivityRow::file_change(path, *created, status, patch),
        many => ActivityRow {
            kind: ActivityKind::FileChange,
            title: format!("Edited {} files", many.len()),
            subtitle: Some(
                many.iter()
                    .map(|(p, _)| file_name(p))
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
            display: Display::default(),
            status,
            detail: Some(Detail::plaintext(patch)),
            message: None,
            approval: None,
        },
    }
}

/// The row of a call, with its output once one came.
pub fn call_row(call: &Call, output: Option<&CallOutput>) -> ActivityRow {
    let status = match output {
        None => RowStatus::InProgress,
        Some(o) if o.failed => RowStatus::Failed,
        Some(_) => RowStatus::Completed,
    };
    let text = output.map(|o| o.text.as_str()).unwrap_or_default();
    let args: Value = serde_json::from_str(&call.input).unwrap_or(Value::Null);
    let argv = strings(args.get("command")).filter(|a| !a.is_empty());
    let name = call.name.as_str();
    match name {
        "shell" | "container.exec" | "local_shell" | "shell_command" | "exec_command"
            if argv.is_some() || args.get("cmd").is_some() || args.get("command").is_some() =>
        {
            let command = match (&argv, args.get("cmd"), args.get("command")) {
                (Some(argv), _, _) => command_text(argv),
                (None, Some(Value::String(cmd)), _) | (None, None, Some(Value::String(cmd))) => {
                    cmd.clone()
                }
                _ => call.input.clone(),
            };
            // `apply_patch <<'PATCH' … PATCH` run through the shell (older versions)
            // is a file change, as Codex shows it.
            if command.trim_start().starts_with("apply_patch") && !patch_files(&command).is_empty()
            {
                return patch_row(&command, status);
            }
            ActivityRow::command(
                &command,
                status,
                output
                    .and_then(|o| o.exit_code)
                    .and_then(|c| i32::try_from(c).ok()),
                text,
            )
        }
        "apply_patch" => {
            let patch = args
                .get("input")
                .and_then(Value::as_str)
                .unwrap_or(&call.input);
            patch_row(patch, status)
        }
        "update_plan" => {
            let steps = args
                .get("plan")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|s| {
                            let step = s.get("step").and_then(Value::as_str)?;
                            let done = s.get("status").and_then(Value::as_str) == Some("completed");
                            Some(format!("- [{}] {step}", if done { "x" } else { " " }))
                        })
                        .collect::<Vec<_>>()
                        .join("\n")
                })
                .unwrap_or_default();
            ActivityRow {
                kind: ActivityKind::Plan,
                title: "Updated the plan".to_owned(),
                subtitle: args
                    .get("explanation")
                    .and_then(Value::as_str)
                    .map(|e| first_line_chars(e, 120))
                    .filter(|e| !e.is_empty()),
                display: Display::default(),
                status: RowStatus::Completed,
                detail: (!steps.is_empty()).then(|| Detail::markdown(steps)),
                message: None,
                approval: None,
            }
        }
        _ => {
            let (tool, server) = match name.strip_prefix("mcp__").and_then(|r| r.split_once("__")) {
                Some((server, tool)) => (tool, Some(server)),
                None => (name, None),
            };
            let tool = if tool.trim().is_empty() {
                "a tool"
            } else {
                tool
            };
            let detail = if text.is_empty() {
                call.input.as_str()
            } else {
                text
            };
            ActivityRow::tool_call(tool, server, status, detail)
        }
    }
}

/// The block ID of the row of the line at `offset`.
pub fn line_id(offset: u64) -> BlockId {
    BlockId::new(format!("rollout-{offset}")).expect("`rollout-<n>` is never blank")
}

fn text_data(text: &str) -> Value {
    serde_json::json!({ "text": text })
}

/// The blocks of `entry`, the line at `offset` read at `at`; `output` is the outcome of a
/// call, when a later line gave one.
pub fn blocks(entry: &Entry, offset: u64, at: Millis, output: Option<&CallOutput>) -> Vec<Block> {
    let order = SourceOrder::legacy_codex(offset, 0);
    let keyed = |ty: BlockType| {
        Block::new(BlockKey::new(ty, line_id(offset)), at).with_source_order(order.clone())
    };
    let block = match entry {
        Entry::User { client_id, text } => {
            match client_id.as_deref().and_then(|c| OperationId::new(c).ok()) {
                Some(op) => Block::new(BlockKey::user_message(&op), at)
                    .with_source_order(order)
                    .with_operation(op)
                    .with_data(text_data(text)),
                None => keyed(BlockType::User).with_data(text_data(text)),
            }
        }
        Entry::Reply { text, phase } => keyed(BlockType::AgentReply)
            .with_data(serde_json::json!({ "text": text, "phase": phase })),
        Entry::Reasoning { text } => keyed(BlockType::Thinking).with_data(text_data(text)),
        Entry::System { text } => keyed(BlockType::System).with_data(text_data(text)),
        Entry::Call(call) => {
            keyed(BlockType::Activity).with_data(activity_data(&call_row(call, output)))
        }
        Entry::Search { query } => {
            keyed(BlockType::Activity).with_data(activity_data(&ActivityRow {
                kind: ActivityKind::Search,
                title: "Searched the web".to_owned(),
                subtitle: query
                    .as_deref()
                    .map(|q| first_line_chars(q, 120))
                    .filter(|q| !q.is_empty()),
                display: Display::default(),
                status: RowStatus::Completed,
                detail: None,
                message: None,
                approval: None,
            }))
        }
        Entry::Plan { text } => keyed(BlockType::Activity).with_data(activity_data(&ActivityRow {
            kind: ActivityKind::Plan,
            title: "Updated the plan".to_owned(),
            subtitle: None,
            display: Display::default(),
            status: RowStatus::Completed,
            detail: (!text.is_empty()).then(|| Detail::markdown(text)),
            message: None,
            approval: None,
        })),
    };
    vec![block]
}

fn activity_data(row: &ActivityRow) -> Value {
    // An ActivityRow is strings and enums: serializing it cannot fail.
    serde_json::to_value(row).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_of_both_forms_give_the_exit_code() {
        let old = CallOutput::from_text(r#"{"output":"a\n","metadata":{"exit_code":2}}"#);
        assert_eq!(
            (old.text.as_str(), old.exit_code, old.failed),
            ("a\n", Some(2), true)
        );
        let new = CallOutput::from_text("Exit code: 0\nWall time: 1 seconds\nOutput:\nok\n");
        assert_eq!(
            (new.text.as_str(), new.exit_code, new.failed),
            ("ok\n", Some(0), false)
        );
        let plain = CallOutput::from_text("a.txt\n");
        assert_eq!((plain.exit_code, plain.failed), (None, false));
    }

    // RW-01: a command row is titled by its command; the exit code is the signal.
    #[test]
    fn a_shell_call_is_a_command_row_titled_by_its_script() {
        let call = Call {
            call_id: "c".into(),
            name: "shell".into(),
            input: r#"{"command":["bash","-lc","rg -n foo"],"workdir":"/w"}"#.into(),
        };
        let running = call_row(&call, None);
        assert_eq!(
            (running.title.as_str(), running.status),
            ("rg -n foo", RowStatus::InProgress)
        );
        let out = CallOutput::from_text(r#"{"output":"","metadata":{"exit_code":1}}"#);
        let done = call_row(&call, Some(&out));
        assert_eq!(done.status, RowStatus::Failed);
        assert_eq!(done.display.signal.as_deref(), Some("Exit 1"));
        assert!(timeline_core::rows::validate(&done).is_empty());
        assert_eq!(
            command_text(&["git".into(), "commit".into(), "-m".into(), "a b".into()]),
            "git commit -m 'a b'"
        );
    }

    #[test]
    fn a_patch_names_its_files() {
        let patch = "*** Begin Patch\n*** Update File: src/a.rs\n@@\n-x\n+y\n*** Add File: b.txt\n+hi\n*** End Patch\n";
        assert_eq!(
            patch_files(patch),
            [("src/a.rs".to_owned(), false), ("b.txt".to_owned(), true)]
        );
        let call = Call {
            call_id: "c".into(),
            name: "apply_patch".into(),
            input: patch.into(),
        };
        let row = call_row(&call, None);
        assert_eq!(row.title, "Edited 2 files");
        assert_eq!(row.subtitle.as_deref(), Some("a.rs, b.txt"));
        let mcp = Call {
            call_id: "c".into(),
            name: "mcp__github__search".into(),
            input: "{}".into(),
        };
        let row = call_row(&mcp, None);
        assert_eq!(
            (row.title.as_str(), row.subtitle.as_deref()),
            ("Used search", Some("github"))
        );
    }

    // TL-03: a user row with a client ID carries its operation and its key.
    #[test]
    fn a_user_row_is_keyed_by_its_operation() {
        let entry = Entry::User {
            client_id: Some("op-1".into()),
            text: "hi".into(),
        };
        let b = blocks(&entry, 40, Millis(5), None).remove(0);
        let op = OperationId::new("op-1").unwrap();
        assert_eq!(b.key(), BlockKey::user_message(&op));
        assert_eq!(b.operation_id, Some(op));
        assert_eq!(
            b.source_order.as_ref().map(|o| o.as_slice().to_vec()),
            Some(vec![0, 0, 40, 0])
        );
        let anonymous = Entry::User {
            client_id: None,
            text: "hi".into(),
        };
        assert_eq!(
            blocks(&anonymous, 40, Millis(5), None)[0].id.as_str(),
            "rollout-40"
        );
    }
}
