//! Delivery proofs on the live stream (OB-08, the Claude column of the seed's table) and
//! the sent line that carries the operation's UUID.
//!
//! The lines follow the shapes documented for Claude Code 2.1.x stream-json
//! (`isReplay` echo, `command_lifecycle`, `result.user_message_uuid`); no public
//! recording of them could be copied, so they are written here by hand.

use agent_claude::project::{Output, Projector};
use agent_claude::proof::{evidence, ProofSource, Verdict};
use agent_claude::stream::{LifecycleState, MessageUuid, StreamDecoder, StreamLine, UserMessage};
use timeline_core::key::{BlockKey, OperationId};
use timeline_core::time::Millis;

const OP: &str = "0b7e2f4c-9d1a-4c3b-8e5f-6a7b8c9d0e1f";

fn lines() -> Vec<String> {
    vec![
        format!(r#"{{"type":"command_lifecycle","command_uuid":"{OP}","state":"queued","uuid":"l1","session_id":"s"}}"#),
        format!(r#"{{"type":"user","isReplay":true,"uuid":"{OP}","timestamp":"2026-08-23T05:53:55.614Z","session_id":"s","parent_tool_use_id":null,"message":{{"role":"user","content":"run it"}}}}"#),
        format!(r#"{{"type":"command_lifecycle","command_uuid":"{OP}","state":"started","uuid":"l2","session_id":"s"}}"#),
        format!(r#"{{"type":"command_lifecycle","command_uuid":"{OP}","state":"completed","uuid":"l3","session_id":"s"}}"#),
        format!(r#"{{"type":"result","subtype":"success","is_error":false,"result":"done","user_message_uuid":"{OP}","terminal_reason":"completed","session_id":"s","uuid":"r1"}}"#),
        r#"{"type":"command_lifecycle","command_uuid":"11111111-2222-4333-8444-555555555555","state":"refused","uuid":"l4","session_id":"s"}"#.to_owned(),
    ]
}

// OB-08: the echo, the lifecycle and the result name the operation's UUID; queued is an
// acceptance, started/completed/echo/result deliver, refused does not.
#[test]
fn live_lines_naming_the_uuid_prove_delivery() {
    let uuid = MessageUuid::parse(OP).unwrap();
    let mut dec = StreamDecoder::new().audit_fields(true);
    let decoded: Vec<StreamLine> = lines()
        .iter()
        .filter_map(|l| dec.decode(l.as_bytes()))
        .collect();
    assert_eq!(decoded.len(), 6);
    assert!(
        dec.diagnostics().all_understood(),
        "{:?}",
        dec.diagnostics()
    );
    assert!(dec.diagnostics().unknown_fields.is_empty());
    let proofs: Vec<(ProofSource, Verdict, bool)> = decoded
        .iter()
        .filter_map(evidence)
        .map(|e| (e.source.clone(), e.verdict(), e.is_for(&uuid)))
        .collect();
    assert_eq!(
        proofs,
        [
            (
                ProofSource::Lifecycle(LifecycleState::Queued),
                Verdict::Queued,
                true
            ),
            (ProofSource::ReplayedEcho, Verdict::Delivered, true),
            (
                ProofSource::Lifecycle(LifecycleState::Started),
                Verdict::Delivered,
                true
            ),
            (
                ProofSource::Lifecycle(LifecycleState::Completed),
                Verdict::Delivered,
                true
            ),
            (ProofSource::ResultNamed, Verdict::Delivered, true),
            (
                ProofSource::Lifecycle(LifecycleState::Refused),
                Verdict::Refused,
                false
            ),
        ]
    );
}

// TL-03: the echo becomes the user row with the key the pending send already has
// (`user-message::<operationId>`) and carries the operation, so the pending echo hides.
#[test]
fn the_echo_is_the_user_row_of_the_operation() {
    let mut dec = StreamDecoder::new();
    let mut p = Projector::new("s", 0);
    for l in lines() {
        if let Some(line) = dec.decode(l.as_bytes()) {
            p.handle_line(&line, Millis(7));
        }
    }
    let rows: Vec<_> = std::iter::from_fn(|| p.poll_effect())
        .filter_map(|o| match o {
            Output::Row(b) => Some(b),
            _ => None,
        })
        .collect();
    let op = OperationId::new(OP).unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].key(), BlockKey::user_message(&op));
    assert_eq!(rows[0].operation_id.as_ref(), Some(&op));
    assert_eq!(rows[0].data["text"], "run it");
}

// The line the host writes carries the operation's UUID, and Claude's echo of it
// decodes back to the same UUID.
#[test]
fn the_sent_uuid_comes_back_in_the_echo() {
    let op = OperationId::new(OP).unwrap();
    let uuid = MessageUuid::from_operation(&op).unwrap();
    let sent = UserMessage::new(uuid.clone(), "run it").encode();
    let mut v: serde_json::Value = serde_json::from_str(&sent).unwrap();
    v["isReplay"] = true.into();
    let mut dec = StreamDecoder::new();
    let line = dec.decode(v.to_string().as_bytes()).unwrap();
    assert!(evidence(&line).unwrap().is_for(&uuid));
    assert!(MessageUuid::from_operation(&OperationId::new("op-1").unwrap()).is_err());
}
