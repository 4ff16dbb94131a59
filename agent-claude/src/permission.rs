//! Claude's permission prompts as the shared approval model (RW-06), sans-IO.
//!
//! With `--permission-prompt-tool stdio`, Claude asks the host before a tool runs: a
//! `control_request` whose `request.subtype` is `can_use_tool`, naming the tool, its
//! input, the tool call (`tool_use_id`) and, when Claude has one, rule suggestions
//! (`permission_suggestions`). The host answers with one `control_response`:
//! `{"behavior":"allow","updatedInput":…}` or `{"behavior":"deny","message":…}`
//! (FORMATS.md §4). A `control_cancel_request` withdraws an unanswered prompt.
//!
//! | shared | Claude |
//! |---|---|
//! | request ID | `request_id` |
//! | thread ID | the Claude session |
//! | turn ID | the UUID of the message that started the run (the seed: "The turn ID is the Claude ID of that message.") |
//! | item ID | `tool_use_id` |
//! | kind | `Bash` → `commandExecution`; `Edit`, `MultiEdit`, `Write`, `NotebookEdit` → `fileChange`; any other tool → `permissions` |
//! | `accept` | allow with the input as asked |
//! | `acceptForSession` | allow and add Claude's suggested rules for this session only (`updatedPermissions`, see below); offered only when Claude suggests a rule |
//! | `decline` | deny; the agent goes on without the tool |
//! | `cancel` | deny and interrupt the turn |
//! | `resolvedExternally` | Claude withdrew the prompt (`control_cancel_request`) |
//!
//! What `acceptForSession` forwards ([`session_rules`]): only what the decision covers,
//! the rules Claude suggests allowing (`addRules` with `behavior: "allow"`), each for
//! this session (`destination: "session"`). Claude Code 2.1.328 suggests, for a Bash
//! call, `addRules` for `localSettings` (it would write `.claude/settings.local.json`),
//! `addDirectories` and `setMode` `acceptEdits` for the session (every later edit
//! allowed without asking); forwarding them as they come would persist the rule to a
//! settings file and switch the session's mode. So a rule meant for a settings file is
//! kept for this session only, and nothing else goes: no mode change, no directory, no
//! settings file destination, no rule that denies or asks.
//!
//! Invariant: the answer names the prompt's `request_id`, and only a decision the
//! request allows is written ([`ApprovalRequest::decide`]).
//!
//! ```
//! use agent_claude::permission::{answer_line, approval_request};
//! use agent_claude::stream::{StreamDecoder, StreamLine};
//! use timeline_core::rows::{ApprovalKind, Decision};
//!
//! let line = r#"{"type":"control_request","request_id":"req-1","request":{"subtype":"can_use_tool","tool_name":"Bash","input":{"command":"ls"},"tool_use_id":"toolu_1"}}"#;
//! let Some(StreamLine::ControlRequest(prompt)) = StreamDecoder::new().decode(line.as_bytes()) else { panic!() };
//! let request = approval_request(&prompt, "claude-session", "turn-uuid").unwrap();
//! assert_eq!(request.kind, ApprovalKind::CommandExecution);
//! let answer = answer_line(&prompt, &request, Decision::Accept).unwrap();
//! assert!(answer.contains(r#""behavior":"allow""#) && answer.ends_with('\n'));
//! ```

use timeline_core::block::Block;
use timeline_core::key::{BlockId, BlockKey, BlockType};
use timeline_core::order::SourceOrder;
use timeline_core::rows::{
    approval_card, ApprovalKind, ApprovalRequest, ApprovalResult, Decision, DecisionNotAllowed,
};
use timeline_core::time::Millis;

use crate::stream::ControlRequest;

/// The subtype of a permission prompt.
pub const CAN_USE_TOOL: &str = "can_use_tool";

/// What a tool's approval is for.
pub fn approval_kind(tool_name: &str) -> ApprovalKind {
    match tool_name {
        "Bash" => ApprovalKind::CommandExecution,
        "Edit" | "MultiEdit" | "Write" | "NotebookEdit" => ApprovalKind::FileChange,
        _ => ApprovalKind::Permissions,
    }
}

/// The permission updates an `acceptForSession` answer to `prompt` carries: each rule
/// suggestion that allows (`addRules`, `behavior: "allow"`, with rules), for this session
/// only (`destination: "session"`, whatever destination Claude suggested). Mode changes
/// (`setMode`), directories (`addDirectories`), replaced or removed rules and rules that
/// deny or ask are left out: the user's decision does not cover them.
pub fn session_rules(prompt: &ControlRequest) -> Vec<serde_json::Value> {
    let Some(suggestions) = prompt
        .permission_suggestions
        .as_ref()
        .and_then(serde_json::Value::as_array)
    else {
        return Vec::new();
    };
    suggestions
        .iter()
        .filter(|s| s["type"] == "addRules" && s["behavior"] == "allow")
        .filter_map(|s| {
            let rules = s["rules"].as_array().filter(|r| !r.is_empty())?;
            Some(serde_json::json!({
                "type": "addRules",
                "rules": rules,
                "behavior": "allow",
                "destination": "session",
            }))
        })
        .collect()
}

/// The shared request of a `can_use_tool` prompt in Claude session `thread` during
/// the turn `turn`; `None` for any other control request or one without a tool call.
pub fn approval_request(
    prompt: &ControlRequest,
    thread: &str,
    turn: &str,
) -> Option<ApprovalRequest> {
    if prompt.subtype != CAN_USE_TOOL {
        return None;
    }
    let item = prompt
        .tool_use_id
        .clone()
        .filter(|id| !id.trim().is_empty())?;
    let mut allowed = vec![Decision::Accept];
    if !session_rules(prompt).is_empty() {
        allowed.push(Decision::AcceptForSession);
    }
    allowed.extend([Decision::Decline, Decision::Cancel]);
    Some(ApprovalRequest {
        request_id: prompt.request_id.clone(),
        thread_id: thread.to_owned(),
        turn_id: turn.to_owned(),
        item_id: item,
        kind: approval_kind(prompt.tool_name.as_deref().unwrap_or_default()),
        allowed,
    })
}

/// The `control_response` line (newline included) that answers `prompt` with
/// `decision`, or the refusal of a decision `request` does not allow.
pub fn answer_line(
    prompt: &ControlRequest,
    request: &ApprovalRequest,
    decision: Decision,
) -> Result<String, DecisionNotAllowed> {
    request.decide(decision)?;
    let input = prompt.input.clone().unwrap_or(serde_json::Value::Null);
    let answer = match decision {
        Decision::Accept | Decision::AcceptBroadly => {
            serde_json::json!({ "behavior": "allow", "updatedInput": input })
        }
        Decision::AcceptForSession => serde_json::json!({
            "behavior": "allow",
            "updatedInput": input,
            "updatedPermissions": session_rules(prompt),
        }),
        Decision::Decline => serde_json::json!({
            "behavior": "deny",
            "message": "The user declined this tool call.",
        }),
        Decision::Cancel => serde_json::json!({
            "behavior": "deny",
            "message": "The user cancelled the turn.",
            "interrupt": true,
        }),
    };
    let mut line = serde_json::json!({
        "type": "control_response",
        "response": {
            "subtype": "success",
            "request_id": prompt.request_id,
            "response": answer,
        },
    })
    .to_string();
    line.push('\n');
    Ok(line)
}

/// What the card of a prompt says about it: the tool and the first line of what it
/// would do.
pub fn summary(prompt: &ControlRequest) -> String {
    let input = prompt.input.as_ref();
    let field = |name: &str| {
        input
            .and_then(|i| i.get(name))
            .and_then(|v| v.as_str())
            .filter(|s| !s.trim().is_empty())
    };
    let what = [
        "command",
        "file_path",
        "path",
        "url",
        "pattern",
        "description",
    ]
    .iter()
    .find_map(|f| field(f));
    let tool = prompt.tool_name.as_deref().unwrap_or("a tool");
    match what {
        Some(w) => format!("{tool}: {}", timeline_core::rows::first_line(w)),
        None => tool.to_owned(),
    }
}

/// The card row of `request` (RW-06): an activity row keyed by the card ID, placed at
/// the live sequence `seq`; the pending and the decided card share the key.
pub fn card_block(
    request: &ApprovalRequest,
    summary: &str,
    result: Option<ApprovalResult>,
    at: Millis,
    seq: u64,
) -> Option<Block> {
    let row = approval_card(request, summary, result);
    let data = serde_json::to_value(row).ok()?;
    let key = BlockKey::new(BlockType::Activity, BlockId::new(request.card_id()).ok()?);
    Some(
        Block::new(key, at)
            .with_source_order(SourceOrder::live(seq))
            .with_data(data),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(tool: &str, suggestions: Option<serde_json::Value>) -> ControlRequest {
        ControlRequest {
            request_id: "req-9".into(),
            subtype: CAN_USE_TOOL.into(),
            tool_name: Some(tool.into()),
            tool_use_id: Some("toolu_9".into()),
            input: Some(serde_json::json!({"file_path": "/w/a.rs", "content": "x"})),
            permission_suggestions: suggestions,
        }
    }

    // RW-06: the decisions a prompt allows, each answered the way Claude reads it.
    #[test]
    fn decisions_map_to_claude_answers() {
        let p = prompt("Write", None);
        let r = approval_request(&p, "s", "t").unwrap();
        assert_eq!(r.kind, ApprovalKind::FileChange);
        assert_eq!(
            r.allowed,
            [Decision::Accept, Decision::Decline, Decision::Cancel]
        );
        assert_eq!(r.card_id(), "approval:5:req-91:s1:t7:toolu_9");
        assert_eq!(
            answer_line(&p, &r, Decision::AcceptForSession),
            Err(DecisionNotAllowed(Decision::AcceptForSession))
        );
        let v: serde_json::Value =
            serde_json::from_str(&answer_line(&p, &r, Decision::Cancel).unwrap()).unwrap();
        assert_eq!(v["type"], "control_response");
        assert_eq!(v["response"]["request_id"], "req-9");
        assert_eq!(v["response"]["response"]["behavior"], "deny");
        assert_eq!(v["response"]["response"]["interrupt"], true);

        let rules = serde_json::json!([{"type": "addRules", "rules": [{"toolName": "Write"}],
            "behavior": "allow", "destination": "session"}]);
        let p = prompt("Write", Some(rules.clone()));
        let r = approval_request(&p, "s", "t").unwrap();
        assert!(r.allowed.contains(&Decision::AcceptForSession));
        let v: serde_json::Value =
            serde_json::from_str(&answer_line(&p, &r, Decision::AcceptForSession).unwrap())
                .unwrap();
        assert_eq!(v["response"]["response"]["behavior"], "allow");
        assert_eq!(v["response"]["response"]["updatedPermissions"], rules);
        assert_eq!(
            v["response"]["response"]["updatedInput"]["file_path"],
            "/w/a.rs"
        );

        assert_eq!(approval_kind("Bash"), ApprovalKind::CommandExecution);
        assert_eq!(approval_kind("mcp__x__y"), ApprovalKind::Permissions);
        let mut other = prompt("Bash", None);
        other.subtype = "initialize".into();
        assert_eq!(approval_request(&other, "s", "t"), None);
    }

    /// The `can_use_tool` prompt Claude Code 2.1.328 printed for a Bash call (its
    /// `blocked_path` and directory shortened).
    const BASH_2_1_328: &str = r#"{"type":"control_request","request_id":"b24d07eb-1847-42e8-9718-fd5cf3820218","request":{"subtype":"can_use_tool","tool_name":"Bash","display_name":"Bash","input":{"command":"touch scripted-model-ran.txt && echo ran","description":"Make a file"},"description":"Make a file","permission_suggestions":[{"type":"addRules","rules":[{"toolName":"Bash","ruleContent":"touch scripted-model-ran.txt && echo ran"}],"behavior":"allow","destination":"localSettings"},{"type":"addDirectories","directories":["/tmp/p/project"],"destination":"session"},{"type":"setMode","mode":"acceptEdits","destination":"session"}],"blocked_path":"/tmp/p/project/scripted-model-ran.txt","tool_use_id":"toolu_scripted_1"}}"#;

    // RW-06: accepting for the session forwards only what the decision covers: the
    // suggested rule, for this session; never the mode change, the directory or the
    // settings file Claude 2.1.328 suggests beside it. Accepting once forwards nothing.
    #[test]
    fn accept_for_session_forwards_only_the_suggested_rules_for_this_session() {
        let decoded = crate::stream::StreamDecoder::new().decode(BASH_2_1_328.as_bytes());
        let Some(crate::stream::StreamLine::ControlRequest(p)) = decoded else {
            panic!("{decoded:?}");
        };
        let r = approval_request(&p, "s", "t").unwrap();
        assert!(r.allowed.contains(&Decision::AcceptForSession));
        let v: serde_json::Value =
            serde_json::from_str(&answer_line(&p, &r, Decision::AcceptForSession).unwrap())
                .unwrap();
        let answer = &v["response"]["response"];
        assert_eq!(answer["behavior"], "allow");
        assert_eq!(
            answer["updatedPermissions"],
            serde_json::json!([{
                "type": "addRules",
                "rules": [{"toolName": "Bash", "ruleContent": "touch scripted-model-ran.txt && echo ran"}],
                "behavior": "allow",
                "destination": "session",
            }])
        );
        let v: serde_json::Value =
            serde_json::from_str(&answer_line(&p, &r, Decision::Accept).unwrap()).unwrap();
        assert!(v["response"]["response"]
            .get("updatedPermissions")
            .is_none());

        // Without a rule to allow, the decision is not offered.
        let only_mode = serde_json::json!([
            {"type": "setMode", "mode": "acceptEdits", "destination": "session"},
            {"type": "addDirectories", "directories": ["/w"], "destination": "session"},
            {"type": "addRules", "rules": [{"toolName": "Bash"}], "behavior": "deny",
             "destination": "session"},
            {"type": "addRules", "rules": [], "behavior": "allow", "destination": "session"},
        ]);
        let p = prompt("Bash", Some(only_mode));
        assert!(session_rules(&p).is_empty());
        let r = approval_request(&p, "s", "t").unwrap();
        assert!(!r.allowed.contains(&Decision::AcceptForSession));
        assert_eq!(
            answer_line(&p, &r, Decision::AcceptForSession),
            Err(DecisionNotAllowed(Decision::AcceptForSession))
        );
    }

    // RW-06: "The card is a live activity row of kind event." Pending, then the result,
    // in place under one key.
    #[test]
    fn the_card_is_an_event_row_keyed_by_its_card_id() {
        let p = prompt("Write", None);
        let r = approval_request(&p, "s", "t").unwrap();
        let pending = card_block(&r, &summary(&p), None, Millis(5), 3).unwrap();
        let decided = card_block(
            &r,
            &summary(&p),
            Some(ApprovalResult::Declined),
            Millis(6),
            3,
        )
        .unwrap();
        assert_eq!(pending.key(), decided.key());
        assert_eq!(pending.id.as_str(), r.card_id());
        assert_eq!(pending.data["kind"], "event");
        assert_eq!(pending.data["approval"]["status"], "pending");
        assert_eq!(decided.data["approval"]["status"], "declined");
        assert_eq!(pending.data["subtitle"], "Write: /w/a.rs");
    }
}
