//! The WebSocket server with real WebSocket clients on loopback: pairing, tokens, the
//! wire through the host, relay events after the replay, slow phones cut off, dispatch
//! caps (WI-01, WI-05, WI-06, SV-01 to SV-03).
#![cfg(feature = "server")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use host_core::{
    Agent, AgentCall, AgentEffect, AgentInput, FileError, Host, HostConfig, ProcessId, ReadId,
    WriteFailure, WriteId,
};
use host_runtime::server::{Devices, Server, ServerConfig, MAX_FAILURES};
use host_runtime::Runtime;
use outbox_core::adapter::{Capabilities, SendKind, SendResult};
use outbox_core::entry::Acceptance;
use outbox_core::ids::{RunId, ThreadId, TurnId};
use outbox_core::{MemoryOutboxStore, SessionInfo};
use overlay_core::live::RunEventKind;
use overlay_core::store::{RowClass, StoredBlock};
use overlay_core::{MemoryOverlayStore, MemorySource, SourceKind};
use timeline_core::{Block, BlockKey, BlockType, BoundaryToken, HostKey, Millis, SessionId};
use timeline_core::{OperationId, TargetId};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

fn sid() -> SessionId {
    SessionId::new("s1").unwrap()
}

/// An in-process agent: accepts each send as a new run and proves it; publishes the
/// user's row and a reply row (`flood:N` in the text: N reply rows of 32 KB, one write
/// each); ends the run 50 ms later. It never answers a stop.
struct Scripted {
    out: VecDeque<AgentEffect>,
    end_at: Option<(Millis, RunId)>,
    /// Flood rows still to publish, one every 5 ms.
    flood: VecDeque<StoredBlock>,
    flood_at: Option<Millis>,
    /// Sends handed to it.
    sends: Arc<AtomicUsize>,
}

impl Agent for Scripted {
    fn capabilities(&self) -> Capabilities {
        Capabilities::codex()
    }
    fn serves(&self, session: &SessionId) -> bool {
        *session == sid()
    }
    fn handle_call(&mut self, call: AgentCall, now: Millis) {
        let AgentCall::Send(request) = call else {
            return;
        };
        self.sends.fetch_add(1, Ordering::SeqCst);
        let SendKind::Start { run } = request.kind.clone() else {
            return;
        };
        let acceptance = Acceptance {
            run_id: run.clone(),
            thread_id: ThreadId::new("thread-1").unwrap(),
            turn_id: TurnId::new(format!("turn-{}", request.operation_id)).unwrap(),
            accepted_at: now,
        };
        self.out
            .push_back(AgentEffect::Input(AgentInput::SendResult {
                attempt: request.attempt,
                result: SendResult::Accepted(acceptance),
            }));
        let text = request.request.user_text.clone();
        let user = row(
            BlockType::User,
            &format!("user-message::{}", request.operation_id),
            &text,
            &run,
            Some(request.operation_id.clone()),
        );
        self.publish(vec![user]);
        self.out
            .push_back(AgentEffect::Input(AgentInput::DeliveryProof {
                session: request.session.clone(),
                operation_id: request.operation_id.clone(),
            }));
        let flood: usize = text
            .strip_prefix("flood:")
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        if flood == 0 {
            let reply = row(
                BlockType::AgentReply,
                &format!("reply-{}", request.operation_id),
                &format!("echo: {text}"),
                &run,
                None,
            );
            self.publish(vec![reply]);
        }
        for i in 0..flood {
            let big = "x".repeat(32 * 1024);
            self.flood.push_back(row(
                BlockType::AgentReply,
                &format!("flood-{i}"),
                &big,
                &run,
                None,
            ));
        }
        if flood > 0 {
            self.flood_at = Some(now.saturating_add(Millis(5)));
        }
        if !text.starts_with("hold") {
            let end = Millis(50 + 5 * flood as u64);
            self.end_at = Some((now.saturating_add(end), run));
        }
    }
    fn handle_line(&mut self, _: ProcessId, _: &[u8], _: Millis) {}
    fn handle_line_too_long(&mut self, _: ProcessId, _: Millis) {}
    fn handle_exit(&mut self, _: ProcessId, _: String, _: Millis) {}
    fn handle_written(&mut self, _: ProcessId, _: WriteId, _: Result<(), WriteFailure>, _: Millis) {
    }
    fn handle_file(&mut self, _: ReadId, _: Result<Vec<u8>, FileError>, _: Millis) {}
    fn poll_effect(&mut self) -> Option<AgentEffect> {
        self.out.pop_front()
    }
    fn poll_timeout(&self) -> Option<Millis> {
        let end = self.end_at.as_ref().map(|(at, _)| *at);
        end.into_iter().chain(self.flood_at).min()
    }
    fn handle_timeout(&mut self, now: Millis) {
        if self.flood_at.is_some_and(|at| now >= at) {
            if let Some(row) = self.flood.pop_front() {
                self.publish(vec![row]);
            }
            self.flood_at = (!self.flood.is_empty()).then(|| now.saturating_add(Millis(5)));
        }
        if let Some((at, run)) = self.end_at.take() {
            if now < at {
                self.end_at = Some((at, run));
                return;
            }
            self.out.push_back(AgentEffect::Input(AgentInput::RunEnded {
                session: sid(),
                run,
                outcome: RunEventKind::Completed,
                untaken: Vec::new(),
            }));
        }
    }
}

impl Scripted {
    fn publish(&mut self, rows: Vec<StoredBlock>) {
        self.out.push_back(AgentEffect::Input(AgentInput::Rows {
            session: sid(),
            target: TargetId::main(&sid()),
            rows,
        }));
    }
}

fn row(t: BlockType, id: &str, text: &str, run: &RunId, op: Option<OperationId>) -> StoredBlock {
    let mut block = Block::new(BlockKey::parse(t, id).unwrap(), Millis(1_000))
        .with_data(serde_json::json!({ "text": text }));
    if let Some(op) = op {
        block = block.with_operation(op);
    }
    StoredBlock {
        block,
        class: RowClass::Ordinary,
        run_id: Some(run.clone()),
    }
}

async fn serve(config: ServerConfig) -> (Runtime, Server) {
    let (runtime, server, _) = serve_counted(config).await;
    (runtime, server)
}

/// A server, and the count of sends its agent was handed.
async fn serve_counted(config: ServerConfig) -> (Runtime, Server, Arc<AtomicUsize>) {
    let mut n = 0u64;
    let uuids = Box::new(move || {
        n += 1;
        format!("00000000-0000-4000-8000-{n:012x}")
    });
    let mut host = Host::new(
        MemoryOutboxStore::new(),
        MemoryOverlayStore::new(),
        HostConfig::new(HostKey::from_bytes([9; 32]), uuids),
    );
    host.add_session(
        &sid(),
        SessionInfo::new(Capabilities::codex()),
        Box::new(MemorySource::new(
            SourceKind::Codex {
                thread_id: "thread-1".into(),
                generation: 1,
            },
            BoundaryToken::codex_rollout("/sessions/rollout-1.jsonl"),
        )),
    );
    let agent = Scripted {
        out: VecDeque::new(),
        end_at: None,
        flood: VecDeque::new(),
        flood_at: None,
        sends: Arc::new(AtomicUsize::new(0)),
    };
    let sends = Arc::clone(&agent.sends);
    let mut runtime = Runtime::builder(host).agent(agent).start().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = Server::start(&mut runtime, listener, config, Devices::default(), None)
        .await
        .unwrap();
    (runtime, server, sends)
}

/// A minimal HTTP/1.1 POST on loopback: the status and the JSON body.
async fn post(addr: SocketAddr, path: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = body.to_string();
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    stream.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8(out).unwrap();
    let status: u16 = text.split(' ').nth(1).unwrap().parse().unwrap();
    let json = text
        .split("\r\n\r\n")
        .nth(1)
        .and_then(|b| serde_json::from_str(b).ok())
        .unwrap_or(serde_json::Value::Null);
    (status, json)
}

async fn pair(server: &Server, name: &str) -> String {
    let code = server.pairing_code().unwrap();
    let (status, body) = post(
        server.local_addr(),
        "/pair",
        &serde_json::json!({ "code": code, "deviceName": name }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body["token"].as_str().unwrap().to_owned()
}

/// Connects with `token`: the socket, or the HTTP status of the refusal.
async fn connect(addr: SocketAddr, token: &str) -> Result<Ws, u16> {
    match tokio_tungstenite::connect_async(format!("ws://{addr}/ws?token={token}")).await {
        Ok((ws, _)) => Ok(ws),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            Err(response.status().as_u16())
        }
        Err(e) => panic!("connect: {e}"),
    }
}

struct Phone {
    ws: Ws,
    next: u64,
    /// Frames read, in order.
    seen: Vec<serde_json::Value>,
}

impl Phone {
    fn new(ws: Ws) -> Phone {
        Phone {
            ws,
            next: 0,
            seen: Vec::new(),
        }
    }

    async fn send(&mut self, method: &str, params: serde_json::Value) -> u64 {
        self.next += 1;
        let frame = serde_json::json!({
            "jsonrpc": "2.0", "id": self.next, "method": method, "params": params,
        });
        self.ws
            .send(Message::Text(frame.to_string().into()))
            .await
            .unwrap();
        self.next
    }

    /// Reads frames until `done` says the last one is what was waited for.
    async fn read_until(&mut self, what: &str, mut done: impl FnMut(&serde_json::Value) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let msg = tokio::time::timeout_at(deadline, self.ws.next())
                .await
                .unwrap_or_else(|_| panic!("{what}: nothing within 10 s; saw {:?}", self.seen))
                .unwrap_or_else(|| panic!("{what}: the socket closed"))
                .unwrap();
            if let Message::Text(text) = msg {
                let value: serde_json::Value = serde_json::from_str(&text).unwrap();
                let hit = done(&value);
                self.seen.push(value);
                if hit {
                    return;
                }
            }
        }
    }

    async fn call(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        let id = self.send(method, params).await;
        self.read_until(method, |v| v["id"] == serde_json::json!(id))
            .await;
        self.seen.last().unwrap().clone()
    }

    fn events(&self, event: &str) -> Vec<&serde_json::Value> {
        self.seen
            .iter()
            .filter(|v| v["method"] == "chat:timeline-updated" && v["params"]["event"] == event)
            .collect()
    }
}

fn submit(op: &str, text: &str, key: &str) -> serde_json::Value {
    serde_json::json!({
        "appSessionId": "s1", "queueId": format!("q-{op}"), "operationId": op,
        "userText": text, "source": "phone", "createdAt": 1_000,
        "intent": "automatic", "sendMode": "queue", "idempotencyKey": key,
    })
}

// SV-01, WI-06: a paired phone joins (replay, then its answer), sends, and sees the run
// start, its rows and the run's end on the relay; a second phone sees the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paired_phone_sends_and_both_phones_see_the_rows_once() {
    let (runtime, server) = serve(ServerConfig::default()).await;
    let (a, b) = (pair(&server, "phone").await, pair(&server, "desktop").await);
    let mut phone = Phone::new(connect(server.local_addr(), &a).await.unwrap());
    let mut desk = Phone::new(connect(server.local_addr(), &b).await.unwrap());
    for p in [&mut phone, &mut desk] {
        let joined = p
            .call("run.chatJoin", serde_json::json!({ "appSessionId": "s1" }))
            .await;
        let chunks = joined["result"]["chunks"].as_u64().unwrap();
        let replayed = p
            .seen
            .iter()
            .filter(|v| v["method"] == "structured_replay")
            .count();
        assert_eq!(replayed as u64, chunks, "the replay came before the answer");
    }
    let receipt = phone
        .call("run.chatOutboxSubmit", submit("op-1", "hello", "k-1"))
        .await;
    assert_eq!(receipt["result"]["operationId"], "op-1", "{receipt}");
    for p in [&mut phone, &mut desk] {
        p.read_until("completed", |v| v["params"]["event"] == "completed")
            .await;
        assert_eq!(p.events("started").len(), 1);
        let blocks = p.events("blocks");
        let last = blocks.last().unwrap();
        let ids: Vec<&str> = last["params"]["liveOverlay"]["blocks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["id"].as_str().unwrap())
            .collect();
        assert!(ids.contains(&"reply-op-1"), "{ids:?}");
        let unique: std::collections::BTreeSet<&&str> = ids.iter().collect();
        assert_eq!(unique.len(), ids.len(), "one row per key");
    }
    // The same submit again under its key: the same receipt, no second message.
    let again = phone
        .call("run.chatOutboxSubmit", submit("op-1", "hello", "k-1"))
        .await;
    assert_eq!(again["result"], receipt["result"]);
    let runs = phone.call("run.list", serde_json::json!({})).await;
    assert_eq!(runs["result"]["runs"], serde_json::json!([]));
    assert_eq!(server.stats().connections, 2);
    server.shutdown().await.unwrap();
    runtime.shutdown().await.unwrap();
}

// SV-02: no token, a wrong one, a revoked one: 401 UNAUTHORIZED; five failures from one
// address within the window: 429 without a check, even for a good token; a pairing code
// works once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_and_revoked_tokens_are_refused_and_failures_are_rate_limited() {
    let (runtime, server) = serve(ServerConfig::default()).await;
    let addr = server.local_addr();
    let token = pair(&server, "phone").await;
    assert!(connect(addr, &token).await.is_ok());
    let device = server.devices().list()[0].device_id.clone();
    assert!(server.revoke(&device));
    assert_eq!(connect(addr, &token).await.err(), Some(401));
    // A used code, then a wrong one.
    let code = server.pairing_code().unwrap();
    let body = serde_json::json!({ "code": code, "deviceName": "x" });
    assert_eq!(post(addr, "/pair", &body).await.0, 200);
    let (status, refused) = post(addr, "/pair", &body).await;
    assert_eq!(
        (status, refused["errorCode"].as_str()),
        (401, Some("PAIRING_CODE_INVALID"))
    );
    // Three failures so far (the revoked token, the used code... and this one).
    let good = pair(&server, "good").await;
    let mut failures = 2;
    while failures < MAX_FAILURES {
        assert_eq!(connect(addr, "0000").await.err(), Some(401));
        failures += 1;
    }
    assert_eq!(
        connect(addr, &good).await.err(),
        Some(429),
        "limited, unread"
    );
    let (status, limited) = post(addr, "/pair", &body).await;
    assert_eq!(
        (status, limited["errorCode"].as_str()),
        (429, Some("TOO_MANY_ATTEMPTS"))
    );
    assert!(server.stats().refused >= MAX_FAILURES as u64);
    server.shutdown().await.unwrap();
    runtime.shutdown().await.unwrap();
}

// SV-03: a phone that does not read is cut off when its send queue is full; the other
// phone gets every event up to the last snapshot, and the slow one comes back through
// its replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_phone_is_cut_off_and_the_other_keeps_up() {
    let (runtime, server) = serve(ServerConfig::default().send_queue(16)).await;
    let (a, b) = (pair(&server, "slow").await, pair(&server, "fast").await);
    let mut slow = Phone::new(connect(server.local_addr(), &a).await.unwrap());
    let mut fast = Phone::new(connect(server.local_addr(), &b).await.unwrap());
    slow.call("run.chatJoin", serde_json::json!({ "appSessionId": "s1" }))
        .await;
    fast.call("run.chatJoin", serde_json::json!({ "appSessionId": "s1" }))
        .await;
    // 60 writes of a growing overlay, 5 ms apart (about 60 MB of snapshots in all): more
    // than the socket buffers hold for a phone that stops reading, and a pace a phone
    // that reads keeps up with.
    fast.call("run.chatOutboxSubmit", submit("op-1", "flood:60", "k-1"))
        .await;
    fast.read_until("the last snapshot", |v| {
        v["params"]["event"] == "blocks"
            && v["params"]["liveOverlay"]["blocks"]
                .as_array()
                .is_some_and(|b| b.iter().any(|r| r["id"] == "flood-59"))
    })
    .await;
    // The slow phone's connection was closed with 1013.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut closed = None;
    while let Ok(Some(msg)) = tokio::time::timeout_at(deadline, slow.ws.next()).await {
        match msg {
            Ok(Message::Close(frame)) => {
                closed = Some(frame.map(|f| u16::from(f.code)));
                break;
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    assert_eq!(closed, Some(Some(1013)));
    assert_eq!(server.stats().cut_off, 1);
    // Back through replay: it joins again and the replay carries the last snapshot.
    let mut back = Phone::new(connect(server.local_addr(), &a).await.unwrap());
    back.call("run.chatJoin", serde_json::json!({ "appSessionId": "s1" }))
        .await;
    assert!(back.seen.iter().any(|v| v["method"] == "structured_replay"));
    server.shutdown().await.unwrap();
    runtime.shutdown().await.unwrap();
}

// SV-01: past its dispatch cap a request is answered DISPATCH_TIMEOUT and the host goes
// on: the stop's answer settles its idempotency key, so the same key later gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_past_its_cap_times_out_and_its_key_gets_the_late_answer() {
    let config =
        ServerConfig::default().dispatch_caps(Duration::from_secs(95), Duration::from_millis(300));
    let (runtime, server) = serve(config).await;
    let token = pair(&server, "phone").await;
    let mut phone = Phone::new(connect(server.local_addr(), &token).await.unwrap());
    // A run that never ends, whose stop the agent never answers.
    phone
        .call("run.chatOutboxSubmit", submit("op-1", "hold", "k-1"))
        .await;
    let cancel = serde_json::json!({ "appSessionId": "s1", "idempotencyKey": "k-stop" });
    let first = phone.call("run.cancel", cancel.clone()).await;
    assert_eq!(
        first["error"]["data"]["errorCode"], "DISPATCH_TIMEOUT",
        "{first}"
    );
    assert!(host_wire::ERROR_CODES.contains(&"DISPATCH_TIMEOUT"));
    // The host answers "still settling" after 5 s; the key then holds that answer.
    tokio::time::sleep(Duration::from_millis(5_500)).await;
    let again = phone.call("run.cancel", cancel).await;
    assert_eq!(again["result"]["status"], "stillSettling", "{again}");
    assert_eq!(server.stats().timed_out, 1);
    server.shutdown().await.unwrap();
    runtime.shutdown().await.unwrap();
}

// WI-01 over the socket: a malformed frame gets its typed error on the same connection,
// which stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_frame_is_answered_and_the_connection_stays() {
    let (runtime, server) = serve(ServerConfig::default()).await;
    let token = pair(&server, "phone").await;
    let mut phone = Phone::new(connect(server.local_addr(), &token).await.unwrap());
    phone.ws.send(Message::Text("{".into())).await.unwrap();
    phone
        .read_until("the parse error", |v| v["error"]["code"] == -32700)
        .await;
    let runs = phone.call("run.list", serde_json::json!({})).await;
    assert!(runs["result"]["runs"].is_array());
    server.shutdown().await.unwrap();
    runtime.shutdown().await.unwrap();
}

// WI-05, SV-01: a phone that lost its connection right after a submit sends it again
// under the same key from a new connection: the same receipt, one message to the agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_retried_after_a_reconnect_is_one_message() {
    let (runtime, server, sends) = serve_counted(ServerConfig::default()).await;
    let token = pair(&server, "phone").await;
    let mut first = Phone::new(connect(server.local_addr(), &token).await.unwrap());
    first
        .send("run.chatOutboxSubmit", submit("op-1", "hello", "k-1"))
        .await;
    // Gone before reading the answer.
    first.ws.close(None).await.unwrap();
    drop(first);
    let mut again = Phone::new(connect(server.local_addr(), &token).await.unwrap());
    let receipt = again
        .call("run.chatOutboxSubmit", submit("op-1", "hello", "k-1"))
        .await;
    assert_eq!(receipt["result"]["operationId"], "op-1", "{receipt}");
    let reconciled = again
        .call(
            "run.chatReconcileSessions",
            serde_json::json!({ "appSessionIds": ["s1"] }),
        )
        .await;
    // Delivered once and let go: the outbox is empty, and no second run started.
    let session = &reconciled["result"]["sessions"][0];
    assert_eq!(session["outbox"], serde_json::json!([]), "{session}");
    assert_eq!(sends.load(Ordering::SeqCst), 1, "one send to the agent");
    server.shutdown().await.unwrap();
    runtime.shutdown().await.unwrap();
}
