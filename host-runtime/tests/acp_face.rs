//! The ACP face (`custody-acp`) between ACP clients and a host on loopback: the real
//! `acpx` (the pinned npm package) sends through it, and a scripted ACP client loads a
//! session's history and meets an approval card another device decides (AG-04).
#![cfg(all(feature = "server", feature = "acp"))]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod page;

use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use host_runtime::server::ServerConfig;
use page::{pair, serve};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio_tungstenite::tungstenite::Message;

const FACE: &str = env!("CARGO_BIN_EXE_custody-acp");

fn url(addr: std::net::SocketAddr, token: &str) -> String {
    format!("ws://{addr}/ws?token={token}")
}

// AG-04: the real `acpx` starts the face as its agent, opens a session, sends a prompt
// and prints the reply the host's agent gave; the host took the message once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acpx_sends_through_the_face_and_prints_the_reply() {
    let (runtime, server, sends) = serve(ServerConfig::default(), 0).await;
    let token = pair(&server, "acpx").await;
    let acpx = scripted_model::agents::acpx_bin().unwrap_or_else(|e| panic!("{e}"));
    let work = tempfile::tempdir().unwrap();
    let agent = format!(
        "{FACE} --url {} --session s1",
        url(server.local_addr(), &token)
    );
    let out = tokio::time::timeout(
        Duration::from_secs(90),
        tokio::process::Command::new(&acpx)
            .args(["--agent", &agent, "--format", "json", "--approve-all"])
            .args(["--cwd", &work.path().display().to_string()])
            .args(["exec", "hello face"])
            .env("HOME", work.path())
            .output(),
    )
    .await
    .expect("acpx did not finish in 90 s")
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "acpx failed: {stderr}\n{stdout}");
    assert!(stdout.contains("echo: hello face"), "{stdout}\n{stderr}");
    assert_eq!(
        sends.load(Ordering::SeqCst),
        1,
        "the host's agent got it once"
    );
    drop(server);
    runtime.shutdown().await.unwrap();
}

struct AcpClient {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    seen: Vec<Value>,
}

impl AcpClient {
    fn start(url: &str) -> AcpClient {
        let mut child = tokio::process::Command::new(FACE)
            .args(["--url", url, "--session", "s1"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        AcpClient {
            child,
            stdin,
            lines,
            seen: Vec::new(),
        }
    }

    async fn write(&mut self, v: Value) {
        self.stdin
            .write_all(format!("{v}\n").as_bytes())
            .await
            .unwrap();
    }

    /// Reads lines until `done`; the line that satisfied it.
    async fn until(&mut self, what: &str, mut done: impl FnMut(&Value) -> bool) -> Value {
        loop {
            let line = tokio::time::timeout(Duration::from_secs(60), self.lines.next_line())
                .await
                .unwrap_or_else(|_| panic!("{what}: nothing in 60 s; saw {:#?}", self.seen))
                .unwrap()
                .unwrap_or_else(|| panic!("{what}: the face ended"));
            let v: Value = serde_json::from_str(&line).unwrap();
            self.seen.push(v.clone());
            if done(&v) {
                return v;
            }
        }
    }

    fn updates(&self, kind: &str) -> Vec<String> {
        self.seen
            .iter()
            .filter(|v| {
                v["method"] == "session/update" && v["params"]["update"]["sessionUpdate"] == kind
            })
            .map(|v| {
                v["params"]["update"]["content"]["text"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect()
    }
}

// AG-04, RW-06: `session/load` replays the saved rows before its answer; a prompt's
// approval card reaches the client as `session/request_permission`; a phone decides it
// first, so the client's late answer changes nothing (decided once), and the prompt
// ends when the run does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loaded_session_replays_history_and_a_card_is_decided_once_across_devices() {
    let (runtime, server, sends) = serve(ServerConfig::default(), 3).await;
    let face_token = pair(&server, "editor").await;
    let phone_token = pair(&server, "phone").await;
    let mut c = AcpClient::start(&url(server.local_addr(), &face_token));
    c.write(json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": { "protocolVersion": 1, "clientCapabilities": {} } }))
        .await;
    let init = c.until("initialize", |v| v["id"] == 1).await;
    assert_eq!(init["result"]["protocolVersion"], 1);
    assert_eq!(init["result"]["agentCapabilities"]["loadSession"], true);
    assert_eq!(
        init["result"]["agentCapabilities"]["sessionCapabilities"]["list"],
        json!({})
    );
    // AG-04: `session/list` names every session the host serves, in the face's
    // directory.
    c.write(json!({ "jsonrpc": "2.0", "id": 8, "method": "session/list", "params": {} }))
        .await;
    let listed = c.until("the list", |v| v["id"] == 8).await;
    let sessions = listed["result"]["sessions"].as_array().unwrap();
    let ids: Vec<&str> = sessions
        .iter()
        .map(|s| s["sessionId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["s1"], "{listed}");
    let cwd = std::env::current_dir().unwrap();
    assert_eq!(sessions[0]["cwd"], json!(cwd), "{listed}");
    // A prompt without its session or its content is refused as sent, nothing submitted.
    c.write(json!({ "jsonrpc": "2.0", "id": 9, "method": "session/prompt", "params": {} }))
        .await;
    let bad = c.until("the refusal", |v| v["id"] == 9).await;
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
    c.write(json!({ "jsonrpc": "2.0", "id": 2, "method": "session/load",
        "params": { "sessionId": "s1", "cwd": "/", "mcpServers": [] } }))
        .await;
    c.until("the load's answer", |v| v["id"] == 2).await;
    assert_eq!(
        c.updates("agent_message_chunk"),
        vec!["saved reply 0", "saved reply 1", "saved reply 2"],
        "history replayed before the answer"
    );

    c.write(
        json!({ "jsonrpc": "2.0", "id": 3, "method": "session/prompt",
        "params": { "sessionId": "s1", "prompt": [{ "type": "text", "text": "approve this" }] } }),
    )
    .await;
    let ask = c
        .until("the permission request", |v| {
            v["method"] == "session/request_permission"
        })
        .await;
    let options: Vec<&str> = ask["params"]["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["optionId"].as_str().unwrap())
        .collect();
    assert_eq!(options, vec!["allow_once", "reject_once"]);

    // A phone decides the card first.
    let (mut phone, _) = tokio_tungstenite::connect_async(url(server.local_addr(), &phone_token))
        .await
        .unwrap();
    let item = ask["params"]["toolCall"]["toolCallId"]
        .as_str()
        .unwrap()
        .to_owned();
    let (request, thread, turn, item_id) = timeline_core::rows::parse_card_id(&item).unwrap();
    phone
        .send(Message::Text(
            json!({ "jsonrpc": "2.0", "id": 1, "method": "run.chatResolveApproval", "params": {
                "requestId": request, "threadId": thread, "turnId": turn, "itemId": item_id,
                "decision": "decline", "idempotencyKey": "phone-1" } })
            .to_string()
            .into(),
        ))
        .await
        .unwrap();
    loop {
        let Some(Ok(Message::Text(t))) = phone.next().await else {
            panic!("the phone's socket ended");
        };
        let v: Value = serde_json::from_str(&t).unwrap();
        if v["id"] == 1 {
            assert!(v.get("error").is_none(), "{v}");
            break;
        }
    }
    // The editor answers later: refused by the host, the phone's decision stands.
    c.write(json!({ "jsonrpc": "2.0", "id": ask["id"],
        "result": { "outcome": { "outcome": "selected", "optionId": "allow_once" } } }))
        .await;
    let end = c.until("the prompt's answer", |v| v["id"] == 3).await;
    assert_eq!(end["result"]["stopReason"], "end_turn", "{end}");
    let replies = c.updates("agent_message_chunk").join("");
    assert!(replies.contains("the command ran: Denied"), "{replies}");
    assert!(!replies.contains("Allowed"), "{replies}");
    assert_eq!(sends.load(Ordering::SeqCst), 1);
    c.child.kill().await.unwrap();
    drop(server);
    runtime.shutdown().await.unwrap();
}

// AG-04: `session/cancel` during a prompt stops the run and removes the client's message
// still queued behind it; both prompts answer `cancelled` (the protocol's rule whatever
// the run's end), the queued one never reaches the agent, and the next prompt on the
// same host session runs and answers `end_turn`. A second `session/new` is a new host
// session (its own ID, its prompt answered by the host's agent, listed with the
// directory it was made for), and one the host refuses answers `-32603` with the host's
// error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_prompt_answers_cancelled_and_the_next_prompt_runs() {
    let (runtime, server, sends) = serve(ServerConfig::default(), 0).await;
    let token = pair(&server, "editor").await;
    let mut c = AcpClient::start(&url(server.local_addr(), &token));
    c.write(json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": { "protocolVersion": 1, "clientCapabilities": {} } }))
        .await;
    c.until("initialize", |v| v["id"] == 1).await;
    c.write(json!({ "jsonrpc": "2.0", "id": 2, "method": "session/new",
        "params": { "cwd": "/", "mcpServers": [] } }))
        .await;
    let new = c.until("session/new", |v| v["id"] == 2).await;
    let session = new["result"]["sessionId"].as_str().unwrap().to_owned();
    c.write(json!({ "jsonrpc": "2.0", "id": 6, "method": "session/new",
        "params": { "cwd": "/", "mcpServers": [] } }))
        .await;
    let again = c.until("the second session/new", |v| v["id"] == 6).await;
    let other = again["result"]["sessionId"].as_str().unwrap().to_owned();
    assert_ne!(other, session, "{again}");
    assert_eq!(other, "made-1");
    // AG-04: `session/list` names each session's own directory where the host knows it
    // (the made one's), and a `cwd` filter keeps only those listed with it.
    c.write(
        json!({ "jsonrpc": "2.0", "id": 10, "method": "session/list",
        "params": { "cwd": "/" } }),
    )
    .await;
    let listed = c.until("the filtered list", |v| v["id"] == 10).await;
    assert_eq!(
        listed["result"]["sessions"],
        json!([{ "sessionId": "made-1", "cwd": "/" }]),
        "{listed}"
    );
    c.write(
        json!({ "jsonrpc": "2.0", "id": 11, "method": "session/list",
        "params": { "cwd": "/no-session-here" } }),
    )
    .await;
    let none = c.until("the empty list", |v| v["id"] == 11).await;
    assert_eq!(none["result"]["sessions"], json!([]), "{none}");
    c.write(json!({ "jsonrpc": "2.0", "id": 7, "method": "session/new",
        "params": { "cwd": "/refuse", "mcpServers": [] } }))
        .await;
    let refused = c.until("the refused session/new", |v| v["id"] == 7).await;
    assert_eq!(refused["error"]["code"], -32603, "{refused}");
    assert_eq!(
        refused["error"]["data"]["data"]["errorCode"], "SESSION_NOT_CREATED",
        "{refused}"
    );
    c.write(
        json!({ "jsonrpc": "2.0", "id": 3, "method": "session/prompt",
        "params": { "sessionId": session, "prompt": [{ "type": "text", "text": "slow one" }] } }),
    )
    .await;
    c.until("the first streamed word", |v| {
        v["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
    })
    .await;
    c.write(
        json!({ "jsonrpc": "2.0", "id": 5, "method": "session/prompt",
        "params": { "sessionId": session, "prompt": [{ "type": "text", "text": "queued" }] } }),
    )
    .await;
    c.write(json!({ "jsonrpc": "2.0", "method": "session/cancel",
        "params": { "sessionId": session } }))
        .await;
    let mut answered = Vec::new();
    while answered.len() < 2 {
        let end = c
            .until("the cancelled prompts' answers", |v| {
                v["id"] == 3 || v["id"] == 5
            })
            .await;
        assert_eq!(end["result"]["stopReason"], "cancelled", "{end}");
        answered.push(end["id"].clone());
    }
    assert_eq!(
        sends.load(Ordering::SeqCst),
        1,
        "the queued message was not sent"
    );
    let streamed = c.updates("agent_message_chunk").join("");
    assert!(
        !streamed.contains("word39"),
        "the stop cut the reply: {streamed}"
    );

    c.write(
        json!({ "jsonrpc": "2.0", "id": 4, "method": "session/prompt",
        "params": { "sessionId": session, "prompt": [{ "type": "text", "text": "after" }] } }),
    )
    .await;
    let seen = c.seen.len();
    let end = c.until("the next prompt's answer", |v| v["id"] == 4).await;
    assert_eq!(end["result"]["stopReason"], "end_turn", "{end}");
    let after: String = c.seen[seen..]
        .iter()
        .filter_map(|v| v["params"]["update"]["content"]["text"].as_str())
        .collect();
    assert_eq!(after, "echo: after", "only the new run's reply, once");
    assert_eq!(sends.load(Ordering::SeqCst), 2);

    // The new session's prompt goes to the host's agent in that session.
    c.write(
        json!({ "jsonrpc": "2.0", "id": 8, "method": "session/prompt",
        "params": { "sessionId": other, "prompt": [{ "type": "text", "text": "in the new one" }] } }),
    )
    .await;
    let end = c.until("the new session's prompt", |v| v["id"] == 8).await;
    assert_eq!(end["result"]["stopReason"], "end_turn", "{end}");
    let in_new: Vec<&Value> = c
        .seen
        .iter()
        .filter(|v| {
            v["method"] == "session/update"
                && v["params"]["sessionId"] == other.as_str()
                && v["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
        })
        .collect();
    assert!(
        in_new
            .iter()
            .any(|v| v["params"]["update"]["content"]["text"]
                .as_str()
                .is_some_and(|t| t.contains("in the new one"))),
        "the reply came to the new session: {in_new:?}"
    );
    assert_eq!(sends.load(Ordering::SeqCst), 3);
    c.child.kill().await.unwrap();
    drop(server);
    runtime.shutdown().await.unwrap();
}
