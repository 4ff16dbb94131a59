//! The WebSocket server with real WebSocket clients on loopback: pairing, tokens, the
//! wire through the host, relay events after the replay, slow phones cut off, dispatch
//! caps (WI-01, WI-05, WI-06, SV-01 to SV-03).
#![cfg(feature = "server")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod page;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use host_runtime::server::{ServerConfig, MAX_FAILURES};
use page::{pair, post, serve};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

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
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let msg = tokio::time::timeout_at(deadline, self.ws.next())
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "{what}: nothing within 60 s; saw {} frames",
                        self.seen.len()
                    )
                })
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

    /// Reads frames until one's text passes `done`, without parsing them.
    async fn read_text_until(&mut self, what: &str, mut done: impl FnMut(&str) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let msg = tokio::time::timeout_at(deadline, self.ws.next())
                .await
                .unwrap_or_else(|_| panic!("{what}: nothing within 60 s"))
                .unwrap_or_else(|| panic!("{what}: the socket closed"))
                .unwrap();
            if let Message::Text(text) = msg {
                if done(&text) {
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
    let (runtime, server, _) = serve(ServerConfig::default(), 0).await;
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
    let (runtime, server, _) = serve(ServerConfig::default(), 0).await;
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

// SV-03: snapshots for a phone that does not read take each other's place, so its queue
// stays small while its socket is full; the answers it then asks for cannot, and past
// the bound it is cut off. The other phone gets every snapshot up to the last, and the
// slow one comes back through its replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_phone_is_cut_off_and_the_other_keeps_up() {
    let (runtime, server, _) = serve(ServerConfig::default().send_queue(16), 0).await;
    let (a, b) = (pair(&server, "slow").await, pair(&server, "fast").await);
    let mut slow = Phone::new(connect(server.local_addr(), &a).await.unwrap());
    let mut fast = Phone::new(connect(server.local_addr(), &b).await.unwrap());
    fast.call("run.chatJoin", serde_json::json!({ "appSessionId": "s1" }))
        .await;
    slow.call("run.chatJoin", serde_json::json!({ "appSessionId": "s1" }))
        .await;
    // 300 snapshots of 64 KB, 10 ms apart (about 20 MB in all): more than the socket
    // buffers hold for a phone that stops reading, at a pace a phone that reads keeps
    // up with.
    fast.call("run.chatOutboxSubmit", submit("op-1", "stream:300", "k-1"))
        .await;
    // Read as a phone with little time would: the frames' text, not parsed.
    fast.read_text_until("the last snapshot", |text| text.contains(r#""text":"0299"#))
        .await;
    assert_eq!(
        server.stats().cut_off,
        0,
        "snapshots took each other's place"
    );
    // The slow phone asks, and reads nothing: 40 answers for a queue of 16.
    for _ in 0..40 {
        slow.send("run.list", serde_json::json!({})).await;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while server.stats().cut_off == 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The slow phone's connection was cut: it reads what its socket held, then the end
    // (with the close frame 1013 when the socket still had room for it).
    assert_eq!(server.stats().cut_off, 1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut ended = false;
    while let Ok(next) = tokio::time::timeout_at(deadline, slow.ws.next()).await {
        match next {
            Some(Ok(Message::Close(frame))) => {
                assert_eq!(frame.map(|f| u16::from(f.code)), Some(1013));
                ended = true;
                break;
            }
            Some(Ok(_)) => {}
            Some(Err(_)) | None => {
                ended = true;
                break;
            }
        }
    }
    assert!(ended, "the slow phone's connection ended");
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
    let (runtime, server, _) = serve(config, 0).await;
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
    let (runtime, server, _) = serve(ServerConfig::default(), 0).await;
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
    let (runtime, server, sends) = serve(ServerConfig::default(), 0).await;
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

// PK-06, SV-01: streamed fragments reach only the joins that asked for them
// (`sessionEvents`), in order, and a phone too slow for them loses fragments (it pages
// them with `session.page`), never its connection; the page gives them all back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_fragments_go_to_the_joins_that_ask_and_never_cut_a_slow_phone() {
    use timeline_core::history::{unpack_records, SessionHistoryRecord};
    let (runtime, server, _) = serve(ServerConfig::default(), 0).await;
    let (a, b, c) = (
        pair(&server, "follows").await,
        pair(&server, "plain").await,
        pair(&server, "slow").await,
    );
    let mut follows = Phone::new(connect(server.local_addr(), &a).await.unwrap());
    let mut plain = Phone::new(connect(server.local_addr(), &b).await.unwrap());
    let mut slow = Phone::new(connect(server.local_addr(), &c).await.unwrap());
    let join = |events: bool| serde_json::json!({ "appSessionId": "s1", "sessionEvents": events });
    follows.call("run.chatJoin", join(true)).await;
    plain.call("run.chatJoin", join(false)).await;
    slow.call("run.chatJoin", join(true)).await;
    // 20,000 fragments at once (about 7 MB of frames): more than a phone that reads
    // nothing has room for, in its queue and its socket together.
    follows
        .call(
            "run.chatOutboxSubmit",
            submit("op-1", "deltas:20000", "k-1"),
        )
        .await;
    for phone in [&mut follows, &mut plain] {
        phone
            .read_text_until("the reply row", |t| {
                t.contains(r#""event":"blocks""#) && t.contains("t19999 ")
            })
            .await;
    }
    assert!(
        plain.events("session-event").is_empty(),
        "plain did not ask"
    );
    let got: Vec<u64> = follows
        .events("session-event")
        .iter()
        .map(|e| e["params"]["sessionEvent"]["seq"].as_u64().unwrap())
        .collect();
    assert!(got.windows(2).all(|w| w[0] < w[1]), "in order");
    assert!(
        server.stats().events_dropped > 0,
        "the slow phone had no room"
    );
    assert_eq!(server.stats().cut_off, 0, "fragments cut nobody off");
    // What the slow phone missed, the page gives back whole, as one packed row.
    let page = slow
        .call("session.page", serde_json::json!({ "appSessionId": "s1" }))
        .await;
    let records: Vec<SessionHistoryRecord> =
        serde_json::from_value(page["result"]["records"].clone()).unwrap();
    let events = unpack_records(&records).unwrap();
    assert_eq!((events.len(), records.len()), (20_000, 1));
    assert_eq!(events[19_999].text.as_deref(), Some("t19999 "));
    server.shutdown().await.unwrap();
    runtime.shutdown().await.unwrap();
}
