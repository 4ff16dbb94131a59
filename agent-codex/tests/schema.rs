//! The protocol contract: every line the codec can write validates against the JSON
//! Schema the pinned Codex prints (`codex app-server generate-json-schema`), checked in
//! under `agent-codex/schema/<version>/`; the notifications the seam acts on without a
//! recording of them (`thread/closed`) are read in the schema's shape; and the pinned
//! binary still prints that schema.

#![allow(clippy::unwrap_used)] // a test: a bad schema or line is a failed test
#![allow(clippy::disallowed_methods)] // reads the checked-in schema and runs the binary

use agent_codex::codec::Codec;
use agent_codex::protocol::{ClientRequest, RequestId, UserInput};
use serde_json::{json, Value};
use timeline_core::rows::Decision;

const VERSION: &str = "0.169.0";
const FILES: [&str; 5] = [
    "ClientRequest.json",
    "ClientNotification.json",
    "ServerNotification.json",
    "CommandExecutionRequestApprovalResponse.json",
    "FileChangeRequestApprovalResponse.json",
];

fn schema(name: &str) -> Value {
    let path = format!("{}/schema/{VERSION}/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn check(schema_name: &str, instance: &Value) {
    let s = schema(schema_name);
    let v = jsonschema::validator_for(&s).unwrap();
    let errors: Vec<String> = v.iter_errors(instance).map(|e| e.to_string()).collect();
    assert!(
        errors.is_empty(),
        "{instance} does not validate against {schema_name}: {errors:?}"
    );
}

/// Every request the codec writes, in each of its shapes.
fn requests() -> Vec<ClientRequest> {
    let thread = "019a0000-0000-7000-8000-000000000001".to_owned();
    let inputs = vec![
        UserInput::Text("Run the tests".into()),
        UserInput::Image("https://example.com/a.png".into()),
        UserInput::LocalImage("/tmp/a.png".into()),
    ];
    vec![
        ClientRequest::Initialize {
            name: "custody".into(),
            version: "0.1.0".into(),
        },
        ClientRequest::ThreadStart {
            cwd: None,
            approval_policy: None,
            sandbox: None,
            model: None,
            model_provider: None,
        },
        ClientRequest::ThreadStart {
            cwd: Some("/work".into()),
            approval_policy: Some("untrusted".into()),
            sandbox: Some("workspace-write".into()),
            model: Some("gpt-5.5".into()),
            model_provider: Some("scripted".into()),
        },
        ClientRequest::ThreadStart {
            cwd: Some("/work".into()),
            approval_policy: Some("on-request".into()),
            sandbox: Some("danger-full-access".into()),
            model: None,
            model_provider: None,
        },
        ClientRequest::ThreadStart {
            cwd: None,
            approval_policy: Some("never".into()),
            sandbox: Some("read-only".into()),
            model: Some("gpt-5.5".into()),
            model_provider: None,
        },
        ClientRequest::ThreadResume {
            thread_id: thread.clone(),
        },
        ClientRequest::ThreadRead {
            thread_id: thread.clone(),
            include_turns: true,
        },
        ClientRequest::ThreadItemsList {
            thread_id: thread.clone(),
            cursor: None,
            limit: 100,
            newest_first: true,
        },
        ClientRequest::ThreadItemsList {
            thread_id: thread.clone(),
            cursor: Some("{\"rolloutOrdinal\":8}".into()),
            limit: 25,
            newest_first: false,
        },
        ClientRequest::TurnStart {
            thread_id: thread.clone(),
            client_user_message_id: "op-1".into(),
            input: inputs.clone(),
        },
        ClientRequest::TurnSteer {
            thread_id: thread.clone(),
            expected_turn_id: "019a0000-0000-7000-8000-000000000002".into(),
            client_user_message_id: "op-2".into(),
            input: inputs,
        },
        ClientRequest::TurnInterrupt {
            thread_id: thread,
            turn_id: "019a0000-0000-7000-8000-000000000002".into(),
        },
    ]
}

#[test]
fn every_request_the_codec_writes_validates_against_the_pinned_schema() {
    // AG-02
    let mut codec = Codec::new();
    for request in requests() {
        let (_, line) = codec.request(&request);
        let v: Value = serde_json::from_slice(&line).unwrap();
        check("ClientRequest.json", &v);
    }
    let initialized: Value = serde_json::from_slice(&codec.initialized()).unwrap();
    check("ClientNotification.json", &initialized);
}

#[test]
fn every_approval_answer_the_codec_writes_validates_against_the_pinned_schema() {
    for (method, file, amendment) in [
        (
            "item/commandExecution/requestApproval",
            "CommandExecutionRequestApprovalResponse.json",
            true,
        ),
        (
            "item/fileChange/requestApproval",
            "FileChangeRequestApprovalResponse.json",
            false,
        ),
    ] {
        for decision in [
            Decision::Accept,
            Decision::AcceptForSession,
            Decision::AcceptBroadly,
            Decision::Decline,
            Decision::Cancel,
        ] {
            let mut codec = Codec::new();
            let mut params =
                json!({"threadId": "t", "turnId": "u", "itemId": "i", "command": "touch x"});
            if amendment {
                params["proposedExecpolicyAmendment"] = json!(["touch", "x"]);
            }
            let ask = json!({"id": 0, "method": method, "params": params});
            codec.handle_line(ask.to_string().as_bytes()).unwrap();
            let Ok(line) = codec.answer_approval(&RequestId::Number(0), decision) else {
                // Not allowed for this request (acceptBroadly without an amendment).
                assert!(
                    !amendment && decision == Decision::AcceptBroadly,
                    "{decision:?}"
                );
                continue;
            };
            let v: Value = serde_json::from_slice(&line).unwrap();
            check(file, &v["result"]);
        }
    }
}

#[test]
fn the_pinned_codex_prints_the_schema_that_is_checked_in() {
    // AG-02
    let bin = scripted_model::agents::codex_bin().unwrap_or_else(|e| panic!("{e}"));
    let out = std::env::temp_dir().join(format!("custody-codex-schema-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let home = out.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let status = std::process::Command::new(&bin)
        .args(["app-server", "generate-json-schema", "--out"])
        .arg(&out)
        .env("CODEX_HOME", &home)
        .status()
        .unwrap();
    assert!(
        status.success(),
        "{} generate-json-schema failed",
        bin.display()
    );
    for name in FILES {
        let printed: Value =
            serde_json::from_str(&std::fs::read_to_string(out.join(name)).unwrap()).unwrap();
        assert!(
            printed == schema(name),
            "{name} differs from agent-codex/schema/{VERSION}/{name}: the pinned Codex \
             changed its protocol; check it in again and look at what changed"
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn the_schema_refuses_a_request_codex_would_refuse() {
    // The check can fail: a turn/start without its input, a thread/start with a sandbox
    // this version does not know.
    let s = schema("ClientRequest.json");
    let v = jsonschema::validator_for(&s).unwrap();
    for bad in [
        json!({"jsonrpc": "2.0", "id": 1, "method": "turn/start", "params": {"threadId": "t"}}),
        json!({"jsonrpc": "2.0", "id": 1, "method": "thread/start", "params": {"sandbox": "no-such-mode"}}),
        json!({"jsonrpc": "2.0", "id": 1, "method": "turn/frobnicate", "params": {}}),
    ] {
        assert!(!v.is_valid(&bad), "{bad} validated");
    }
}

#[test]
fn the_thread_closed_codex_sends_is_the_one_the_codec_reads() {
    // AG-02: the notification that says a thread was unloaded, as the pinned schema has
    // it (`ThreadClosedNotification`: its `threadId` only), reads as `ThreadClosed`; one
    // without its thread is refused by the schema and not read as one.
    use agent_codex::codec::Incoming;
    use agent_codex::protocol::ServerNotification;
    let line = json!({"method": "thread/closed", "params": {"threadId": "019a-t"}});
    check("ServerNotification.json", &line);
    let mut codec = Codec::new();
    let read = codec.handle_line(line.to_string().as_bytes()).unwrap();
    let Incoming::Notification(n) = read else {
        panic!("{read:?}");
    };
    assert_eq!(
        n.body,
        ServerNotification::ThreadClosed {
            thread_id: "019a-t".into()
        }
    );
    let bad = json!({"method": "thread/closed", "params": {}});
    let s = schema("ServerNotification.json");
    assert!(!jsonschema::validator_for(&s).unwrap().is_valid(&bad));
    assert!(Codec::new()
        .handle_line(bad.to_string().as_bytes())
        .is_err());
}
