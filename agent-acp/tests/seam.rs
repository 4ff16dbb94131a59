//! The ACP agent driven by hand, line by line, with no process: what an agent may say
//! that the real ones did not (an unknown update, a refused prompt, a permission of a
//! kind the library does not know, a broken write, a steer).

#![allow(clippy::unwrap_used)]

mod common;

use agent_acp::{AcpAgent, AcpConfig, AcpHistory};
use host_core::{
    Agent, AgentCall, AgentEffect, AgentInput, ProcessId, ProcessSpec, WriteFailure, WriteId,
};
use outbox_core::adapter::{SendKind, SendResult};
use outbox_core::ids::{RunId, SessionId};
use outbox_core::AttemptId;
use overlay_core::live::RunEventKind;
use serde_json::{json, Value};
use timeline_core::key::BlockType;
use timeline_core::rows::{ApprovalKind, Decision};
use timeline_core::time::Millis;

struct Hand {
    a: AcpAgent,
    session: SessionId,
    /// Every line written, with its write.
    written: Vec<(WriteId, Value)>,
    inputs: Vec<AgentInput>,
    process: Option<ProcessId>,
}

impl Hand {
    fn new() -> Hand {
        let mut a = AcpAgent::new(
            AcpConfig::new(ProcessSpec::new("acp-agent"), "/work"),
            AcpHistory::new(),
        );
        let session = SessionId::new("s1").unwrap();
        a.add_session(&session, None);
        Hand {
            a,
            session,
            written: Vec::new(),
            inputs: Vec::new(),
            process: None,
        }
    }

    fn pump(&mut self) {
        while let Some(e) = self.a.poll_effect() {
            match e {
                AgentEffect::Input(i) => self.inputs.push(i),
                AgentEffect::Spawn { process, .. } => self.process = Some(process),
                AgentEffect::Write { write, line, .. } => {
                    self.written
                        .push((write, serde_json::from_slice(&line).unwrap()));
                }
                _ => {}
            }
        }
    }

    fn line(&mut self, v: Value) {
        let p = self.process.unwrap();
        self.a.handle_line(p, v.to_string().as_bytes(), Millis(10));
        self.pump();
    }

    fn last_request(&self, method: &str) -> (WriteId, Value) {
        self.written
            .iter()
            .rev()
            .find(|(_, v)| v["method"] == method)
            .cloned()
            .unwrap_or_else(|| panic!("no {method} written: {:?}", self.written))
    }

    fn send(&mut self, op: &str, attempt: u64, kind: SendKind) {
        self.a.handle_call(
            common::send_call(&self.session, op, "hello", attempt, kind),
            Millis(0),
        );
        self.pump();
    }

    fn start(op: &str) -> SendKind {
        common::start(op)
    }

    /// Starts the process and opens the session `acp-1`.
    fn open(&mut self) {
        self.send("op-1", 1, Hand::start("op-1"));
        let (_, init) = self.last_request("initialize");
        self.line(json!({ "jsonrpc": "2.0", "id": init["id"], "result": {
            "protocolVersion": 1, "agentCapabilities": { "loadSession": false } } }));
        let (_, new) = self.last_request("session/new");
        assert_eq!(new["params"]["cwd"], "/work");
        self.line(json!({ "jsonrpc": "2.0", "id": new["id"], "result": { "sessionId": "acp-1" } }));
    }

    fn send_result(&self, attempt: u64) -> Option<&SendResult> {
        self.inputs.iter().find_map(|i| match i {
            AgentInput::SendResult { attempt: a, result } if *a == AttemptId(attempt) => {
                Some(result)
            }
            _ => None,
        })
    }

    fn update(&mut self, update: Value) {
        self.line(json!({ "jsonrpc": "2.0", "method": "session/update",
            "params": { "sessionId": "acp-1", "update": update } }));
    }
}

// AG-03: the prompt goes out once the session is open; an update of a type this library
// does not know is counted, never a row and never fatal; the reply chunks are one row.
#[test]
fn a_send_waits_for_the_session_and_an_unknown_update_is_counted() {
    let mut h = Hand::new();
    h.open();
    assert_eq!(h.a.acp_session_of(&h.session), Some("acp-1"));
    let (_, prompt) = h.last_request("session/prompt");
    assert_eq!(prompt["params"]["sessionId"], "acp-1");
    assert_eq!(prompt["params"]["prompt"][0]["text"], "hello");
    let skipped = h.a.skipped();
    h.update(json!({ "sessionUpdate": "something_newer", "x": 1 }));
    h.line(json!({ "not": "json-rpc" }));
    h.a.handle_line(h.process.unwrap(), b"not json at all", Millis(10));
    assert_eq!(h.a.skipped(), skipped + 3);
    assert!(h.send_result(1).is_none(), "no word about the message yet");
    // An empty chunk (claude-agent-acp opens each reply with one) is the agent's answer
    // but no row.
    h.update(json!({ "sessionUpdate": "agent_message_chunk", "content": { "type": "text", "text": "" } }));
    assert!(matches!(h.send_result(1), Some(SendResult::Accepted(_))));
    assert!(!h
        .inputs
        .iter()
        .any(|i| matches!(i, AgentInput::Rows { rows, .. }
        if rows.iter().any(|r| r.block.block_type == BlockType::AgentReply))));
    h.update(json!({ "sessionUpdate": "agent_message_chunk", "content": { "type": "text", "text": "Hi " } }));
    assert!(matches!(h.send_result(1), Some(SendResult::Accepted(_))));
    h.update(json!({ "sessionUpdate": "agent_message_chunk", "content": { "type": "text", "text": "there" } }));
    h.line(json!({ "jsonrpc": "2.0", "id": prompt["id"], "result": { "stopReason": "end_turn" } }));
    let rows = h.a.history().rows(&h.session);
    let replies: Vec<_> = rows
        .iter()
        .filter(|b| b.block_type == BlockType::AgentReply)
        .map(|b| b.data["text"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(replies, vec!["Hi there".to_owned()]);
    assert!(h.inputs.iter().any(|i| matches!(
        i,
        AgentInput::RunEnded {
            outcome: RunEventKind::Completed,
            ..
        }
    )));
}

// AG-03: a prompt the agent refuses as sent (invalid params) was not taken: proven
// unadmitted, and no run ends that never began; another error leaves the outcome
// unknown.
#[test]
fn a_refused_prompt_is_unadmitted_and_an_internal_error_is_uncertain() {
    let mut h = Hand::new();
    h.open();
    let (_, prompt) = h.last_request("session/prompt");
    h.line(json!({ "jsonrpc": "2.0", "id": prompt["id"],
        "error": { "code": -32602, "message": "Invalid params" } }));
    assert!(
        matches!(h.send_result(1), Some(SendResult::ProvenUnadmitted { .. })),
        "{:?}",
        h.inputs
    );
    assert!(!h
        .inputs
        .iter()
        .any(|i| matches!(i, AgentInput::RunEnded { .. })));

    h.send("op-2", 2, Hand::start("op-2"));
    let (_, prompt) = h.last_request("session/prompt");
    h.line(json!({ "jsonrpc": "2.0", "id": prompt["id"],
        "error": { "code": -32603, "message": "Internal error", "data": { "message": "model down" } } }));
    match h.send_result(2) {
        Some(SendResult::AdmissionUncertain { error }) => assert!(error.contains("model down")),
        other => panic!("{other:?}"),
    }
    assert!(h.inputs.iter().any(|i| matches!(
        i,
        AgentInput::RunEnded {
            outcome: RunEventKind::Failed,
            ..
        }
    )));
}

// AG-03: ACP v1 has no steer: a steer that reaches the agent is refused, nothing written.
#[test]
fn a_steer_is_refused_and_nothing_is_written() {
    let mut h = Hand::new();
    h.open();
    let before = h.written.len();
    h.send(
        "op-2",
        2,
        SendKind::Steer {
            run: RunId::new("run-op-1").unwrap(),
        },
    );
    assert!(matches!(
        h.send_result(2),
        Some(SendResult::ProvenUnadmitted { .. })
    ));
    assert_eq!(h.written.len(), before);
}

// AG-03, RW-06: a permission of a kind the library does not know is kept and shown (its
// title is the card's line), its options mapped; the decision is the option of its kind.
#[test]
fn a_permission_of_an_unknown_kind_is_shown_and_answered_with_its_option() {
    let mut h = Hand::new();
    h.open();
    h.line(json!({ "jsonrpc": "2.0", "id": "perm-7", "method": "session/request_permission",
        "params": { "sessionId": "acp-1",
            "toolCall": { "toolCallId": "call-9", "title": "Teleport the repository", "kind": "teleport" },
            "options": [
                { "optionId": "yes", "name": "Allow", "kind": "allow_once" },
                { "optionId": "no", "name": "Reject", "kind": "reject_once" } ] } }));
    let (request, summary) = h
        .inputs
        .iter()
        .find_map(|i| match i {
            AgentInput::ApprovalAsked {
                request, summary, ..
            } => Some((request.clone(), summary.clone())),
            _ => None,
        })
        .unwrap();
    assert_eq!(request.kind, ApprovalKind::Permissions);
    assert_eq!(summary, "Teleport the repository");
    assert_eq!(request.item_id, "call-9");
    assert_eq!(
        request.allowed,
        vec![Decision::Accept, Decision::Decline, Decision::Cancel]
    );
    h.a.handle_call(
        AgentCall::ResolveApproval {
            session: h.session.clone(),
            request: request.clone(),
            decision: Decision::Decline,
        },
        Millis(20),
    );
    h.pump();
    let (write, answer) = h.written.last().cloned().unwrap();
    assert_eq!(answer["id"], "perm-7");
    assert_eq!(
        answer["result"]["outcome"],
        json!({ "outcome": "selected", "optionId": "no" })
    );
    // A write that broke leaves the card pending: deciding again is possible.
    h.a.handle_written(
        h.process.unwrap(),
        write,
        Err(WriteFailure::Broken("pipe".into())),
        Millis(21),
    );
    h.pump();
    assert!(h
        .inputs
        .iter()
        .any(|i| matches!(i, AgentInput::ApprovalResolved { result: Err(_), .. })));
    h.a.handle_call(
        AgentCall::ResolveApproval {
            session: h.session.clone(),
            request,
            decision: Decision::Cancel,
        },
        Millis(22),
    );
    h.pump();
    let (_, answer) = h.written.last().cloned().unwrap();
    assert_eq!(
        answer["result"]["outcome"],
        json!({ "outcome": "cancelled" })
    );
}

// AG-03: an agent request the host did not offer (files, terminals) is answered "method
// not found", never left waiting.
#[test]
fn a_request_the_host_did_not_offer_is_answered_method_not_found() {
    let mut h = Hand::new();
    h.open();
    h.line(
        json!({ "jsonrpc": "2.0", "id": 41, "method": "fs/read_text_file",
        "params": { "sessionId": "acp-1", "path": "/etc/passwd" } }),
    );
    let (_, answer) = h.written.last().cloned().unwrap();
    assert_eq!(answer["id"], 41);
    assert_eq!(answer["error"]["code"], -32601);
}

// AG-03, OB-08: the process ends while the prompt is out and unanswered: the outcome is
// unknown, the run fails, and a later send starts the agent again and loads nothing
// (`session/new` was offered no load): it opens a new session.
#[test]
fn the_process_ending_mid_prompt_leaves_the_outcome_unknown() {
    let mut h = Hand::new();
    h.open();
    let p = h.process.unwrap();
    h.a.handle_exit(p, "killed by signal 9".into(), Millis(30));
    h.pump();
    assert!(matches!(
        h.send_result(1),
        Some(SendResult::AdmissionUncertain { .. })
    ));
    assert!(h.inputs.iter().any(|i| matches!(
        i,
        AgentInput::RunEnded {
            outcome: RunEventKind::Failed,
            ..
        }
    )));
    h.send("op-2", 2, Hand::start("op-2"));
    assert_ne!(h.process, Some(p), "a new process");
}
