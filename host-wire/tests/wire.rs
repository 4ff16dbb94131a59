//! The wire against a real `Host`: frames in, the host's answers and events out, each
//! valid against the checked-in schemas (WI-01 to WI-06).
#![allow(clippy::unwrap_used, clippy::expect_used)]
// The tests read the checked-in schema files; the library itself does no IO.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::path::Path;

use host_core::{
    AgentCall, AgentInput, ClientRequest, Host, HostConfig, HostEffect, NewSessionError, Reply,
    ReplyTo,
};
use host_wire::idempotency::{KEPT_FOR, MAX_KEYS};
use host_wire::method::MAX_CURSOR_CHARS;
use host_wire::{
    decode_request, relay_frame, reply_frames, Admission, Call, Idempotency, Outcome, RequestId,
    StructuredReplay, TimelineUpdated, WireError, ERROR_CODES, METHODS,
};
use outbox_core::adapter::SendKind;
use outbox_core::entry::Acceptance;
use outbox_core::ids::{ThreadId, TurnId};
use outbox_core::{Capabilities, MemoryOutboxStore, SendResult, SessionInfo};
use overlay_core::live::Delivery;
use overlay_core::store::RowClass;
use overlay_core::{MemoryOverlayStore, MemorySource, SourceKind, StoredBlock};
use timeline_core::policy::{RECONCILE_MAX_SESSIONS, RPC_DECODER_MAX_PAGE_SIZE};
use timeline_core::{Block, BlockKey, BlockType, BoundaryToken, HostKey, Millis};
use timeline_core::{SessionId, TargetId};

type TestHost = Host<MemoryOutboxStore, MemoryOverlayStore>;

fn sid(s: &str) -> SessionId {
    SessionId::new(s).unwrap()
}

fn history(kind: SourceKind, token: BoundaryToken, rows: usize) -> MemorySource {
    let mut source = MemorySource::new(kind, token);
    for i in 0..rows {
        let key = BlockKey::parse(BlockType::AgentReply, &format!("item-{i}")).unwrap();
        source.push(vec![Block::new(key, Millis(i as u64 + 1))
            .with_data(serde_json::json!({ "text": format!("reply {i}") }))]);
    }
    source
}

/// A host with a Codex session `s1` (30 saved rows) and a Claude session `c1`.
fn host() -> TestHost {
    let mut n = 0u64;
    let uuids = Box::new(move || {
        n += 1;
        format!("00000000-0000-4000-8000-{n:012x}")
    });
    let mut host = Host::new(
        MemoryOutboxStore::new(),
        MemoryOverlayStore::new(),
        HostConfig::new(HostKey::from_bytes([5; 32]), uuids),
    );
    let codex = history(
        SourceKind::Codex {
            thread_id: "thread-1".into(),
            generation: 1,
        },
        BoundaryToken::codex_rollout("/sessions/rollout-1.jsonl"),
        30,
    );
    host.add_session(
        &sid("s1"),
        SessionInfo::new(Capabilities::codex()),
        Box::new(codex),
    );
    let claude = history(
        SourceKind::Claude {
            session: "claude-1".into(),
        },
        BoundaryToken::claude("claude-1"),
        3,
    );
    host.add_session(
        &sid("c1"),
        SessionInfo::new(Capabilities::claude()),
        Box::new(claude),
    );
    host.start(Millis(0)).unwrap();
    host
}

fn validator(file: &str) -> jsonschema::Validator {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("schema")
        .join(host_wire::WIRE_VERSION.to_string())
        .join(file);
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    jsonschema::draft202012::new(&schema).unwrap()
}

fn assert_valid(v: &jsonschema::Validator, value: &serde_json::Value, what: &str) {
    let errors: Vec<String> = v.iter_errors(value).map(|e| e.to_string()).collect();
    assert!(
        errors.is_empty(),
        "{what} is not valid: {errors:?}\n{value}"
    );
}

/// Drives the wire as a server would: frames in, the frames out, the agent answered by
/// `agent`.
struct Rig {
    host: TestHost,
    now: Millis,
    next: u64,
    /// Frames out, in order (responses and notifications).
    out: Vec<String>,
    /// Methods of the requests still waiting, by host reply address.
    waiting: BTreeMap<u64, (RequestId, &'static str)>,
    /// Agent calls seen.
    calls: Vec<AgentCall>,
    response: jsonschema::Validator,
    notification: jsonschema::Validator,
    results: BTreeMap<&'static str, jsonschema::Validator>,
}

impl Rig {
    fn new() -> Rig {
        Rig {
            host: host(),
            now: Millis(1_000),
            next: 0,
            out: Vec::new(),
            waiting: BTreeMap::new(),
            calls: Vec::new(),
            response: validator("response.json"),
            notification: validator("notification.json"),
            results: METHODS
                .iter()
                .map(|m| (*m, validator(&format!("results/{m}.json"))))
                .collect(),
        }
    }

    /// Sends one request frame; returns the response frame's JSON once it came.
    fn call(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        self.next += 1;
        let frame = serde_json::json!({
            "jsonrpc": "2.0", "id": self.next, "method": method, "params": params,
        })
        .to_string();
        let request = decode_request(&frame).unwrap_or_else(|r| panic!("{method}: {r}"));
        let ask = request.call.clone().into_client_request().unwrap();
        self.waiting
            .insert(self.next, (request.id.clone(), request.call.method()));
        self.host.handle_client(ReplyTo(self.next), ask, self.now);
        self.pump();
        self.response_to(self.next)
    }

    fn response_to(&self, id: u64) -> serde_json::Value {
        self.out
            .iter()
            .map(|f| serde_json::from_str::<serde_json::Value>(f).unwrap())
            .find(|v| v["id"] == serde_json::json!(id))
            .unwrap_or_else(|| panic!("no response to {id}"))
    }

    fn pump(&mut self) {
        while let Some(effect) = self.host.poll_effect() {
            match effect {
                HostEffect::Reply { to, reply } => {
                    let (id, method) = self.waiting.remove(&to.0).expect("a reply to a request");
                    for frame in reply_frames(id, &reply) {
                        let value: serde_json::Value = serde_json::from_str(&frame).unwrap();
                        if value.get("method").is_some() {
                            assert_valid(&self.notification, &value, "a replay notification");
                        } else {
                            assert_valid(&self.response, &value, method);
                            if let Some(result) = value.get("result") {
                                assert_valid(&self.results[method], result, method);
                            } else {
                                let code = value["error"]["data"]["errorCode"].as_str().unwrap();
                                assert!(ERROR_CODES.contains(&code), "{code}");
                            }
                        }
                        self.out.push(frame);
                    }
                }
                HostEffect::Deliver(Delivery::Relay(event)) => {
                    let frame = relay_frame(&event);
                    let value: serde_json::Value = serde_json::from_str(&frame).unwrap();
                    assert_valid(&self.notification, &value, "a relay notification");
                    // The typed form reads it and writes it back the same (WI-06).
                    let typed = TimelineUpdated::from_relay(&event).unwrap();
                    assert_eq!(serde_json::to_value(&typed).unwrap(), event.json);
                    self.out.push(frame);
                }
                HostEffect::Agent(call) => self.calls.push(call),
                // The embedder: it makes a Codex session named for its title, names
                // one it does not add when asked to, and refuses any other.
                HostEffect::OpenSession { to, request } => {
                    let result = match request.title.as_deref() {
                        Some("refuse") => Err(NewSessionError::Refused("no more sessions".into())),
                        Some("forget") => Ok(sid("never-added")),
                        Some(title) => {
                            let session = sid(title);
                            let mut info = SessionInfo::new(Capabilities::codex());
                            info.title = title.to_owned();
                            let source = history(
                                SourceKind::Codex {
                                    thread_id: format!("thread-{title}"),
                                    generation: 1,
                                },
                                BoundaryToken::codex_rollout("/sessions/rollout-new.jsonl"),
                                0,
                            );
                            self.host.add_session(&session, info, Box::new(source));
                            Ok(session)
                        }
                        None => Err(NewSessionError::NotOffered),
                    };
                    self.host.handle_session_opened(to, result, self.now);
                }
                _ => {}
            }
        }
    }

    fn agent(&mut self, input: AgentInput) {
        self.host.handle_agent(input, self.now);
        self.pump();
    }

    fn notifications(&self, method: &str) -> Vec<serde_json::Value> {
        self.out
            .iter()
            .map(|f| serde_json::from_str::<serde_json::Value>(f).unwrap())
            .filter(|v| v["method"] == method)
            .collect()
    }

    fn take_send(&mut self) -> outbox_core::adapter::SendRequest {
        let i = self
            .calls
            .iter()
            .position(|c| matches!(c, AgentCall::Send(_)))
            .expect("a send");
        let AgentCall::Send(req) = self.calls.remove(i) else {
            unreachable!()
        };
        req
    }
}

fn submit_params(op: &str, intent: &str, key: &str) -> serde_json::Value {
    serde_json::json!({
        "appSessionId": "s1", "queueId": format!("q-{op}"), "operationId": op,
        "userText": format!("message {op}"), "source": "phone", "createdAt": 1_000,
        "intent": intent, "sendMode": "queue", "idempotencyKey": key,
    })
}

fn error_code(response: &serde_json::Value) -> &str {
    response["error"]["data"]["errorCode"]
        .as_str()
        .unwrap_or("")
}

// WI-01, WI-04, WI-06: every method through the host; every answer and event valid.
#[test]
fn every_method_reaches_the_host_and_every_answer_validates() {
    let mut rig = Rig::new();
    // A phone joins s1: the replay chunks, then the answer.
    let joined = rig.call("run.chatJoin", serde_json::json!({ "appSessionId": "s1" }));
    let chunks = rig.notifications("structured_replay");
    assert_eq!(joined["result"]["chunks"], serde_json::json!(chunks.len()));
    assert!(!chunks.is_empty());
    let first: StructuredReplay = serde_json::from_value(chunks[0]["params"].clone()).unwrap();
    assert_eq!(first.seq, 0);

    // Loads.
    let window = rig.call("run.chatLoad", serde_json::json!({ "appSessionId": "s1" }));
    assert_eq!(window["result"]["blocks"].as_array().unwrap().len(), 12);
    let cursor = window["result"]["oldestCursor"]
        .as_str()
        .unwrap()
        .to_owned();
    let token = window["result"]["boundaryToken"].clone();
    let older = rig.call(
        "run.chatLoadPageBefore",
        serde_json::json!({ "appSessionId": "s1", "beforeCursor": cursor, "pageSize": 5,
            "expectedBoundaryToken": token }),
    );
    assert_eq!(older["result"]["blocks"].as_array().unwrap().len(), 5);
    let thread = rig.call(
        "run.chatLoadThread",
        serde_json::json!({ "appSessionId": "s1", "threadId": "no-such-thread" }),
    );
    assert_eq!(error_code(&thread), "UNKNOWN_TARGET");
    let thread_page = rig.call(
        "run.chatLoadThreadPageBefore",
        serde_json::json!({ "appSessionId": "s1", "threadId": "s1", "beforeCursor": "not-ours" }),
    );
    assert_eq!(error_code(&thread_page), "INVALID_CURSOR");
    let anchored = rig.call(
        "run.chatLoad",
        serde_json::json!({ "appSessionId": "s1",
            "anchor": { "kind": "row", "row": { "type": "agent-reply", "id": "item-3" } } }),
    );
    assert_eq!(anchored["result"]["anchorRow"]["id"], "item-3");

    // A message: saved, then the agent takes it and a run starts.
    let receipt = rig.call(
        "run.chatOutboxSubmit",
        submit_params("op-1", "automatic", "k1"),
    );
    assert_eq!(receipt["result"]["operationId"], "op-1");
    let send = rig.take_send();
    let SendKind::Start { run } = send.kind.clone() else {
        panic!("a start")
    };
    rig.agent(AgentInput::SendResult {
        attempt: send.attempt,
        result: SendResult::Accepted(Acceptance {
            run_id: run.clone(),
            thread_id: ThreadId::new("thread-1").unwrap(),
            turn_id: TurnId::new("turn-1").unwrap(),
            accepted_at: rig.now,
        }),
    });
    rig.agent(AgentInput::Rows {
        session: sid("s1"),
        target: TargetId::main(&sid("s1")),
        rows: vec![StoredBlock {
            block: Block::new(
                BlockKey::parse(BlockType::AgentReply, "live-1").unwrap(),
                Millis(2_000),
            )
            .with_data(serde_json::json!({ "text": "hello" })),
            class: RowClass::Ordinary,
            run_id: Some(run.clone()),
        }],
    });
    let runs = rig.call("run.list", serde_json::json!({}));
    assert_eq!(runs["result"]["runs"][0]["runId"], run.as_str());
    // Every session the host serves, with its agent and its active run.
    let listed = rig.call("run.chatListSessions", serde_json::json!({}));
    assert_eq!(
        listed["result"]["sessions"],
        serde_json::json!([
            { "appSessionId": "c1", "agent": "claude", "title": "" },
            { "appSessionId": "s1", "agent": "codex", "title": "", "activeRunId": run.as_str() },
        ])
    );

    // A new session the embedder makes: served, listed, and sent to at once.
    let made = rig.call(
        "run.chatNewSession",
        serde_json::json!({ "agent": "codex", "cwd": "/work", "title": "n1",
            "idempotencyKey": "k-new" }),
    );
    assert_eq!(made["result"]["appSessionId"], "n1", "{made}");
    let listed = rig.call("run.chatListSessions", serde_json::json!({}));
    assert_eq!(listed["result"]["sessions"][1]["appSessionId"], "n1");
    assert_eq!(listed["result"]["sessions"][1]["title"], "n1");
    let mut first = submit_params("op-n1", "automatic", "k-n1");
    first["appSessionId"] = serde_json::json!("n1");
    let sent = rig.call("run.chatOutboxSubmit", first);
    assert_eq!(sent["result"]["operationId"], "op-n1", "{sent}");
    assert!(rig
        .calls
        .iter()
        .any(|c| matches!(c, AgentCall::Send(r) if r.session == sid("n1"))));
    for (title, code_text) in [
        (serde_json::json!("refuse"), "no more sessions"),
        (serde_json::json!("forget"), "never-added"),
        (serde_json::Value::Null, "does not make new sessions"),
    ] {
        let mut params = serde_json::json!({ "idempotencyKey": "k-none" });
        if !title.is_null() {
            params["title"] = title;
        }
        let refused = rig.call("run.chatNewSession", params);
        assert_eq!(error_code(&refused), "SESSION_NOT_CREATED", "{refused}");
        let message = refused["error"]["message"].as_str().unwrap();
        assert!(message.contains(code_text), "{message}");
    }

    // A second message queues behind the run: edit it, send it now, remove it.
    rig.call(
        "run.chatOutboxSubmit",
        submit_params("op-2", "enqueue", "k2"),
    );
    let edited = rig.call(
        "run.chatOutboxEdit",
        serde_json::json!({ "appSessionId": "s1", "queueId": "q-op-2", "newOperationId": "op-3",
            "userText": "message op-3", "source": "phone", "createdAt": 1_100,
            "idempotencyKey": "k3" }),
    );
    assert_eq!(edited["result"]["operationId"], "op-3");
    let steer = rig.call(
        "run.chatOutboxStopAndSendNow",
        serde_json::json!({ "appSessionId": "s1", "queueId": "q-op-2", "idempotencyKey": "k4" }),
    );
    assert_eq!(error_code(&steer), "NOT_AN_ACCEPTED_STEER");
    let removed = rig.call(
        "run.chatOutboxRemove",
        serde_json::json!({ "appSessionId": "s1", "queueId": "q-op-2", "idempotencyKey": "k5" }),
    );
    assert_eq!(removed["result"], serde_json::json!({}));
    let gone = rig.call(
        "run.chatOutboxSendNow",
        serde_json::json!({ "appSessionId": "s1", "queueId": "q-op-2", "idempotencyKey": "k6" }),
    );
    assert_eq!(error_code(&gone), "ENTRY_NOT_FOUND");

    // Reconcile both sessions.
    let reconciled = rig.call(
        "run.chatReconcileSessions",
        serde_json::json!({ "appSessionIds": ["s1", "c1"] }),
    );
    let sessions = reconciled["result"]["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 2);
    assert_eq!(sessions[0]["activeRun"], run.as_str());

    // An unknown approval; then the run ends.
    let approval = rig.call(
        "run.chatResolveApproval",
        serde_json::json!({ "requestId": "r", "threadId": "t", "turnId": "u", "itemId": "i",
            "decision": "accept", "idempotencyKey": "k7" }),
    );
    assert_eq!(error_code(&approval), "APPROVAL_UNKNOWN");
    rig.agent(AgentInput::RunEnded {
        session: sid("s1"),
        run: run.clone(),
        outcome: overlay_core::RunEventKind::Completed,
        untaken: Vec::new(),
    });
    let cancel = rig.call(
        "run.cancel",
        serde_json::json!({ "appSessionId": "s1", "idempotencyKey": "k8" }),
    );
    assert_eq!(cancel["result"]["status"], "stopped");
    let left = rig.call("run.chatLeave", serde_json::json!({ "appSessionId": "s1" }));
    assert_eq!(left["result"], serde_json::json!({}));

    // The relay carried the run's events and its rows, each valid and typed.
    let events: Vec<String> = rig
        .notifications("chat:timeline-updated")
        .iter()
        .map(|v| v["params"]["event"].as_str().unwrap().to_owned())
        .collect();
    for kind in ["started", "blocks", "completed"] {
        assert!(events.iter().any(|e| e == kind), "{kind} in {events:?}");
    }
}

fn frame(method: &str, params: serde_json::Value) -> String {
    serde_json::json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params }).to_string()
}

fn refused(text: &str) -> WireError {
    decode_request(text).expect_err(text).error
}

// WI-02: pageSize decoded up to 640, 0 and 641 refused; served up to 100 by the host.
#[test]
fn page_size_at_the_decoder_limit_and_one_past() {
    let at = frame(
        "run.chatLoad",
        serde_json::json!({ "appSessionId": "s1", "pageSize": RPC_DECODER_MAX_PAGE_SIZE }),
    );
    let call = decode_request(&at).unwrap().call;
    let ClientRequest::LatestWindow { page_size, .. } = call.into_client_request().unwrap() else {
        panic!("a latest window")
    };
    assert_eq!(page_size, 640);
    for past in [RPC_DECODER_MAX_PAGE_SIZE as u64 + 1, 0, u64::MAX] {
        for method in [
            "run.chatLoad",
            "run.chatLoadThread",
            "run.chatLoadPageBefore",
            "run.chatLoadThreadPageBefore",
        ] {
            let text = frame(
                method,
                serde_json::json!({ "appSessionId": "s1", "threadId": "t", "beforeCursor": "c",
                    "pageSize": past }),
            );
            assert_eq!(
                refused(&text).error_code(),
                "INVALID_PARAMS",
                "{method} {past}"
            );
        }
    }
    // Served: 640 asks get the host's 100 at most.
    let mut rig = Rig::new();
    let w = rig.call(
        "run.chatLoad",
        serde_json::json!({ "appSessionId": "s1", "pageSize": 640 }),
    );
    assert_eq!(w["result"]["blocks"].as_array().unwrap().len(), 30);
}

// WI-02: at most 16 sessions per reconcile.
#[test]
fn reconcile_sessions_at_the_limit_and_one_past() {
    let ids = |n: usize| -> Vec<String> { (0..n).map(|i| format!("s{i}")).collect() };
    let at = frame(
        "run.chatReconcileSessions",
        serde_json::json!({ "appSessionIds": ids(RECONCILE_MAX_SESSIONS) }),
    );
    assert!(decode_request(&at).is_ok());
    let past = frame(
        "run.chatReconcileSessions",
        serde_json::json!({ "appSessionIds": ids(RECONCILE_MAX_SESSIONS + 1) }),
    );
    let e = refused(&past);
    assert_eq!((e.code, e.error_code()), (-32602, "INVALID_PARAMS"));
}

// WI-02: the decoder's cursor bound, and the host's 4,096-character Claude cursor.
#[test]
fn cursors_at_the_limits_and_one_past() {
    let page = |cursor: String| {
        frame(
            "run.chatLoadPageBefore",
            serde_json::json!({ "appSessionId": "c1", "beforeCursor": cursor }),
        )
    };
    // Characters count, not bytes.
    assert!(decode_request(&page("é".repeat(MAX_CURSOR_CHARS))).is_ok());
    assert_eq!(
        refused(&page("é".repeat(MAX_CURSOR_CHARS + 1))).error_code(),
        "INVALID_PARAMS"
    );
    assert_eq!(refused(&page("  ".into())).error_code(), "INVALID_PARAMS");
    // The Claude cursor: 4,096 characters reach the cursor check (not ours: refused as
    // a cursor); 4,097 are invalid params.
    let mut rig = Rig::new();
    let at = rig.call(
        "run.chatLoadPageBefore",
        serde_json::json!({ "appSessionId": "c1", "beforeCursor": "x".repeat(4_096) }),
    );
    assert_eq!(error_code(&at), "INVALID_CURSOR");
    let past = rig.call(
        "run.chatLoadPageBefore",
        serde_json::json!({ "appSessionId": "c1", "beforeCursor": "x".repeat(4_097) }),
    );
    assert_eq!(error_code(&past), "INVALID_PARAMS");
    assert_eq!(past["error"]["code"], -32602);
}

// WI-02: the frame bound, at the limit and one past.
#[test]
fn frames_at_the_size_limit_and_one_past() {
    let base = frame("run.list", serde_json::json!({}));
    let pad = host_wire::frame::MAX_FRAME_BYTES - base.len();
    let at = format!("{base}{}", " ".repeat(pad));
    assert_eq!(at.len(), host_wire::frame::MAX_FRAME_BYTES);
    assert!(decode_request(&at).is_ok());
    let past = format!("{at} ");
    let e = decode_request(&past).unwrap_err();
    assert_eq!((e.id, e.error.error_code()), (None, "FRAME_TOO_LARGE"));
}

// WI-01, WI-02: malformed frames get typed errors with the ID when it could be read.
#[test]
fn malformed_frames_get_typed_errors() {
    let cases: [(&str, Option<RequestId>, i64, &str); 9] = [
        ("{", None, -32700, "PARSE_ERROR"),
        ("[1,2]", None, -32600, "INVALID_REQUEST"),
        (
            r#"{"jsonrpc":"2.0","method":"run.list"}"#,
            None,
            -32600,
            "INVALID_REQUEST",
        ),
        (
            r#"{"jsonrpc":"1.0","id":3,"method":"run.list"}"#,
            Some(RequestId::Number(3)),
            -32600,
            "INVALID_REQUEST",
        ),
        (
            r#"{"jsonrpc":"2.0","id":"a","method":"run.nope"}"#,
            Some(RequestId::Text("a".into())),
            -32601,
            "METHOD_NOT_FOUND",
        ),
        (
            r#"{"jsonrpc":"2.0","id":4,"method":"run.chatLoad","params":{}}"#,
            Some(RequestId::Number(4)),
            -32602,
            "INVALID_PARAMS",
        ),
        (
            r#"{"jsonrpc":"2.0","id":5,"method":"run.chatLoad","params":{"appSessionId":" "}}"#,
            Some(RequestId::Number(5)),
            -32602,
            "INVALID_PARAMS",
        ),
        // "A blank token or a blank row key fails as invalid params on the relay."
        (
            r#"{"jsonrpc":"2.0","id":6,"method":"run.chatLoad","params":{"appSessionId":"s","anchor":{"kind":"link","token":" "}}}"#,
            Some(RequestId::Number(6)),
            -32602,
            "INVALID_PARAMS",
        ),
        (
            r#"{"jsonrpc":"2.0","id":7,"method":"run.chatLoad","params":{"appSessionId":"s","anchor":{"kind":"row","row":{"type":"user","id":""}}}}"#,
            Some(RequestId::Number(7)),
            -32602,
            "INVALID_PARAMS",
        ),
    ];
    for (text, id, code, error_code) in cases {
        let r = decode_request(text).expect_err(text);
        assert_eq!(r.id, id, "{text}");
        assert_eq!(
            (r.error.code, r.error.error_code()),
            (code, error_code),
            "{text}"
        );
        let response: serde_json::Value = serde_json::from_str(&r.response().to_json()).unwrap();
        assert_valid(&validator("response.json"), &response, text);
    }
    // A mutation without its idempotency key is invalid params.
    let mut p = submit_params("op", "automatic", "k");
    p.as_object_mut().unwrap().remove("idempotencyKey");
    assert_eq!(
        refused(&frame("run.chatOutboxSubmit", p)).error_code(),
        "INVALID_PARAMS"
    );
}

// WI-04: every error variant has a stable code this version lists, and the seed's text.
#[test]
fn every_error_variant_has_a_listed_code() {
    use host_core::{ApprovalError, LoadError};
    use outbox_core::custody::{ActionError, ConflictKind, SubmitError, ValidationError};
    use overlay_core::window::WindowError;
    use timeline_core::rows::Decision;
    let store = || outbox_core::store::OutboxError::Unavailable {
        message: "down".into(),
        source: None,
    };
    let errors: Vec<WireError> = vec![
        (&LoadError::UnknownTarget {
            session: sid("s"),
            target: TargetId::new("t").unwrap(),
        })
            .into(),
        (&LoadError::Window(WindowError::TooLarge { bytes: 9 })).into(),
        (&LoadError::Window(WindowError::InvalidParams("x".into()))).into(),
        (&LoadError::Outbox {
            session: sid("s"),
            error: store(),
        })
            .into(),
        (&SubmitError::Invalid(ValidationError::SteerNeedsRun)).into(),
        (&SubmitError::Invalid(ValidationError::UnknownSession)).into(),
        (&SubmitError::Invalid(ValidationError::Unsupported("replace-latest"))).into(),
        (&SubmitError::Conflict(ConflictKind::DifferentRequest)).into(),
        (&SubmitError::Conflict(ConflictKind::Removed)).into(),
        (&SubmitError::Conflict(ConflictKind::SteerRetargeted)).into(),
        (&SubmitError::Store(store())).into(),
        (&ActionError::NotFound).into(),
        (&ActionError::Blocked).into(),
        (&ActionError::NotAnAcceptedSteer).into(),
        (&ActionError::ModelChanged).into(),
        (&ActionError::RunMayStillTakeIt).into(),
        (&ActionError::OperationTaken).into(),
        (&ActionError::Store(store())).into(),
        (&ApprovalError::Unknown).into(),
        (&ApprovalError::NotAllowed(Decision::Accept)).into(),
        (&ApprovalError::AlreadyResolved { result: None }).into(),
        (&ApprovalError::Refused("no".into())).into(),
        (&ApprovalError::Unsaved("down".into())).into(),
    ];
    let mut codes = std::collections::BTreeSet::new();
    for e in &errors {
        assert!(ERROR_CODES.contains(&e.error_code()), "{e}");
        assert!(!e.message.is_empty());
        codes.insert(e.error_code().to_owned());
    }
    // The too-large code is the seed's, with the host's words.
    assert!(codes.contains("TIMELINE_SNAPSHOT_TOO_LARGE"));
    let conflict: WireError = (&SubmitError::Conflict(ConflictKind::DifferentRequest)).into();
    assert_eq!(
        conflict.message,
        "This operation ID was already used for another message. Send it with a new operationId."
    );
    // Distinct variants, distinct codes (but the three store failures share theirs).
    assert_eq!(codes.len(), errors.len() - 2);
}

fn call_of(text: &str) -> Call {
    decode_request(text).unwrap().call
}

// WI-05: the same key gets the same answer and one effect; another request under the
// key is refused; answers are kept for their time, and the table stays bounded.
#[test]
fn an_idempotency_key_gets_one_effect_and_the_same_answer() {
    let mut table = Idempotency::new();
    let submit = call_of(&frame(
        "run.chatOutboxSubmit",
        submit_params("op-1", "automatic", "k1"),
    ));
    let key = submit.idempotency_key().unwrap().clone();
    let (a, b) = (RequestId::Number(1), RequestId::Number(2));
    assert_eq!(
        table.admit("phone", &key, &submit, &a, Millis(0)),
        Admission::Run
    );
    assert_eq!(
        table.admit("phone", &key, &submit, &b, Millis(1)),
        Admission::Wait
    );
    // Another device's key of the same text is its own.
    assert_eq!(
        table.admit("desktop", &key, &submit, &a, Millis(1)),
        Admission::Run
    );
    let other = call_of(&frame(
        "run.chatOutboxSubmit",
        submit_params("op-2", "automatic", "k1"),
    ));
    let Admission::Refused(e) = table.admit("phone", &key, &other, &b, Millis(2)) else {
        panic!("another request under the key")
    };
    assert_eq!(e.error_code(), "IDEMPOTENCY_KEY_REUSED");
    let answer = Outcome::Result(serde_json::json!({ "operationId": "op-1" }));
    assert_eq!(
        table.complete("phone", &key, answer.clone(), Millis(3)),
        vec![b.clone()]
    );
    assert_eq!(
        table.admit("phone", &key, &submit, &b, Millis(3)),
        Admission::Replay(answer.clone())
    );
    // Kept for KEPT_FOR, then the key is free.
    let last = Millis(3 + KEPT_FOR.as_u64() - 1);
    assert_eq!(
        table.admit("phone", &key, &submit, &b, last),
        Admission::Replay(answer)
    );
    assert_eq!(
        table.admit("phone", &key, &submit, &b, Millis(3 + KEPT_FOR.as_u64())),
        Admission::Run
    );
    // An abandoned run frees its key and names who waited.
    assert_eq!(
        table.admit("phone", &key, &submit, &a, Millis(5)),
        Admission::Wait
    );
    assert_eq!(table.abandon("phone", &key), vec![a.clone()]);
    assert_eq!(
        table.admit("phone", &key, &submit, &a, Millis(5)),
        Admission::Run
    );
}

// WI-05, MH-04: an answer that the session is served elsewhere did nothing: it reaches
// whoever waited and is not kept, so the same key runs again (here, once the session is
// served here), and then its answer is kept.
#[test]
fn an_answer_that_the_session_is_elsewhere_is_not_kept_for_its_key() {
    let mut table = Idempotency::new();
    let submit = call_of(&frame(
        "run.chatOutboxSubmit",
        submit_params("op-1", "automatic", "k1"),
    ));
    let key = submit.idempotency_key().unwrap().clone();
    let (a, b) = (RequestId::Number(1), RequestId::Number(2));
    assert_eq!(
        table.admit("phone", &key, &submit, &a, Millis(0)),
        Admission::Run
    );
    assert_eq!(
        table.admit("phone", &key, &submit, &b, Millis(0)),
        Admission::Wait
    );
    let elsewhere = Outcome::Error(host_wire::WireError::elsewhere("served by h2", None));
    assert_eq!(
        table.complete("phone", &key, elsewhere, Millis(1)),
        vec![b.clone()]
    );
    assert!(table.is_empty());
    assert_eq!(
        table.admit("phone", &key, &submit, &a, Millis(2)),
        Admission::Run
    );
    let answer = Outcome::Result(serde_json::json!({ "operationId": "op-1" }));
    table.complete("phone", &key, answer.clone(), Millis(3));
    assert_eq!(
        table.admit("phone", &key, &submit, &b, Millis(4)),
        Admission::Replay(answer)
    );
    // Any other refusal is kept as it is: the same key gets the same answer.
    let other = call_of(&frame(
        "run.chatOutboxSubmit",
        submit_params("op-2", "automatic", "k2"),
    ));
    let key2 = other.idempotency_key().unwrap().clone();
    assert_eq!(
        table.admit("phone", &key2, &other, &a, Millis(5)),
        Admission::Run
    );
    let refused = Outcome::Error(host_wire::WireError::new(
        host_wire::error::SERVER_ERROR,
        "OPERATION_CONFLICT",
        "conflict",
    ));
    table.complete("phone", &key2, refused.clone(), Millis(6));
    assert_eq!(
        table.admit("phone", &key2, &other, &a, Millis(7)),
        Admission::Replay(refused)
    );
}

// WI-05: at most MAX_KEYS keys: the oldest answer goes first; a table full of running
// mutations refuses a new one.
#[test]
fn the_idempotency_table_is_bounded() {
    let mut table = Idempotency::new();
    let key = |i: usize| outbox_core::ids::IdempotencyKey::new(format!("k{i}")).unwrap();
    let call = |i: usize| {
        call_of(&frame(
            "run.cancel",
            serde_json::json!({ "appSessionId": "s1", "idempotencyKey": format!("k{i}") }),
        ))
    };
    let id = RequestId::Number(0);
    for i in 0..MAX_KEYS {
        assert_eq!(
            table.admit("p", &key(i), &call(i), &id, Millis(0)),
            Admission::Run
        );
    }
    let Admission::Refused(e) = table.admit("p", &key(MAX_KEYS), &call(MAX_KEYS), &id, Millis(0))
    else {
        panic!("full of running mutations")
    };
    assert_eq!(e.error_code(), "INTERNAL_ERROR");
    assert_eq!(table.len(), MAX_KEYS);
    let done = Outcome::Result(serde_json::json!({ "status": "stopped" }));
    table.complete("p", &key(0), done.clone(), Millis(1));
    table.complete("p", &key(1), done, Millis(2));
    assert_eq!(
        table.admit("p", &key(MAX_KEYS), &call(MAX_KEYS), &id, Millis(3)),
        Admission::Run
    );
    assert_eq!(table.len(), MAX_KEYS);
    // The oldest answer (k0) went; k1's is still kept.
    assert_eq!(
        table.admit("p", &key(0), &call(0), &id, Millis(3)),
        Admission::Run
    );
    assert!(matches!(
        table.admit("p", &key(1), &call(1), &id, Millis(3)),
        Admission::Refused(_) | Admission::Replay(_)
    ));
}

// WI-05 with the host: a submit sent twice under one key is saved once and both get
// the one receipt.
#[test]
fn a_submit_repeated_under_its_key_is_one_message() {
    let mut rig = Rig::new();
    let mut table = Idempotency::new();
    let text = frame(
        "run.chatOutboxSubmit",
        submit_params("op-1", "automatic", "k1"),
    );
    let mut answers = Vec::new();
    for n in 0..2u64 {
        let request = decode_request(&text).unwrap();
        let key = request.call.idempotency_key().unwrap().clone();
        let id = RequestId::Number(n as i64);
        match table.admit("phone", &key, &request.call, &id, rig.now) {
            Admission::Run => {
                rig.host.handle_client(
                    ReplyTo(100 + n),
                    request.call.into_client_request().unwrap(),
                    rig.now,
                );
                let mut reply = None;
                while let Some(effect) = rig.host.poll_effect() {
                    match effect {
                        HostEffect::Reply { reply: r, .. } => reply = Some(r),
                        HostEffect::Agent(call) => rig.calls.push(call),
                        _ => {}
                    }
                }
                let reply = reply.unwrap();
                let Reply::Submitted(Ok(receipt)) = &reply else {
                    panic!("{reply:?}")
                };
                let outcome = Outcome::Result(serde_json::to_value(receipt).unwrap());
                table.complete("phone", &key, outcome.clone(), rig.now);
                answers.push(outcome);
            }
            Admission::Replay(outcome) => answers.push(outcome),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(answers[0], answers[1]);
    let sends = rig
        .calls
        .iter()
        .filter(|c| matches!(c, AgentCall::Send(_)))
        .count();
    assert_eq!(sends, 1, "one message handed to the agent");
}

// OB-11, WI-01: `run.chatOutboxReorder` moves queued messages before another or to the
// back; the agent is then given them in the new order, and a move past the message
// the agent is being given is refused.
#[test]
fn a_reorder_on_the_wire_changes_which_message_goes_next() {
    let mut rig = Rig::new();
    rig.call(
        "run.chatOutboxSubmit",
        submit_params("op-1", "automatic", "k1"),
    );
    let first = rig.take_send();
    let SendKind::Start { run } = first.kind.clone() else {
        panic!("a start")
    };
    rig.agent(AgentInput::SendResult {
        attempt: first.attempt,
        result: SendResult::Accepted(Acceptance {
            run_id: run.clone(),
            thread_id: ThreadId::new("thread-1").unwrap(),
            turn_id: TurnId::new("turn-1").unwrap(),
            accepted_at: rig.now,
        }),
    });
    for (op, key) in [("op-2", "k2"), ("op-3", "k3"), ("op-4", "k4")] {
        rig.call("run.chatOutboxSubmit", submit_params(op, "enqueue", key));
    }
    let reorder = |queue: &str, before: Option<&str>, key: &str| {
        let mut params = serde_json::json!({
            "appSessionId": "s1", "queueId": queue, "idempotencyKey": key,
        });
        if let Some(b) = before {
            params["beforeQueueId"] = serde_json::json!(b);
        }
        params
    };
    // 2, 3, 4 → 4, 2, 3 → 4, 3, 2.
    let moved = rig.call(
        "run.chatOutboxReorder",
        reorder("q-op-4", Some("q-op-2"), "k5"),
    );
    assert_eq!(moved["result"], serde_json::json!({}));
    let moved = rig.call("run.chatOutboxReorder", reorder("q-op-2", None, "k6"));
    assert_eq!(moved["result"], serde_json::json!({}));
    let unknown = rig.call(
        "run.chatOutboxReorder",
        reorder("q-op-9", Some("q-op-3"), "k7"),
    );
    assert_eq!(error_code(&unknown), "ENTRY_NOT_FOUND");
    let before_unknown = rig.call(
        "run.chatOutboxReorder",
        reorder("q-op-3", Some("q-op-9"), "k8"),
    );
    assert_eq!(error_code(&before_unknown), "ENTRY_NOT_FOUND");

    let mut order = Vec::new();
    let mut run = run;
    for turn in 2..=4 {
        rig.agent(AgentInput::RunEnded {
            session: sid("s1"),
            run: run.clone(),
            outcome: overlay_core::RunEventKind::Completed,
            untaken: Vec::new(),
        });
        let send = rig.take_send();
        order.push(send.operation_id.as_str().to_owned());
        let SendKind::Start { run: next } = send.kind.clone() else {
            panic!("a start")
        };
        if turn == 2 {
            // The message being given to the agent is neither moved nor passed.
            let sending = rig.call("run.chatOutboxReorder", reorder("q-op-4", None, "k9"));
            assert_eq!(error_code(&sending), "ENTRY_BLOCKED");
            let past = rig.call(
                "run.chatOutboxReorder",
                reorder("q-op-2", Some("q-op-4"), "k10"),
            );
            assert_eq!(error_code(&past), "ENTRY_BLOCKED");
        }
        rig.agent(AgentInput::SendResult {
            attempt: send.attempt,
            result: SendResult::Accepted(Acceptance {
                run_id: next.clone(),
                thread_id: ThreadId::new("thread-1").unwrap(),
                turn_id: TurnId::new(format!("turn-{turn}")).unwrap(),
                accepted_at: rig.now,
            }),
        });
        run = next;
    }
    assert_eq!(order, ["op-4", "op-3", "op-2"]);
}

// MH-01: the frame a server writes for `chat:session-moved` is the notification the
// schema describes, and decodes as one.
#[test]
fn a_session_moved_frame_is_its_notification() {
    let served = host_wire::ServedBy {
        host: "b".into(),
        address: Some("127.0.0.1:7002".into()),
    };
    let moved = host_wire::SessionMoved::new(sid("s1"), "the lease moved", Some(served));
    let frame: serde_json::Value = serde_json::from_str(&moved.frame()).unwrap();
    let typed = host_wire::Notification::new(host_wire::Event::SessionMoved(moved.clone()));
    assert_eq!(frame, serde_json::to_value(&typed).unwrap());
    assert_valid(
        &validator("notification.json"),
        &frame,
        "chat:session-moved",
    );
    let back: host_wire::Notification = serde_json::from_value(frame).unwrap();
    assert_eq!(back, typed);
}

// WI-02: a new session's cwd (4,096 bytes) and title (1,024 characters) at the limit
// and one past.
#[test]
fn new_session_fields_at_the_limit_and_one_past() {
    use host_wire::method::{MAX_NEW_SESSION_CWD_BYTES, MAX_NEW_SESSION_TITLE_CHARS};
    let new = |cwd: String, title: String| {
        frame(
            "run.chatNewSession",
            serde_json::json!({ "cwd": cwd, "title": title, "idempotencyKey": "k" }),
        )
    };
    let at = new(
        "/".repeat(MAX_NEW_SESSION_CWD_BYTES),
        "é".repeat(MAX_NEW_SESSION_TITLE_CHARS),
    );
    let ClientRequest::NewSession(request) = decode_request(&at)
        .unwrap()
        .call
        .into_client_request()
        .unwrap()
    else {
        panic!("a new session")
    };
    assert_eq!(request.cwd.unwrap().len(), MAX_NEW_SESSION_CWD_BYTES);
    // Bytes count for the path, characters for the title.
    for past in [
        new("é".repeat(MAX_NEW_SESSION_CWD_BYTES / 2 + 1), String::new()),
        new(String::new(), "é".repeat(MAX_NEW_SESSION_TITLE_CHARS + 1)),
    ] {
        let e = refused(&past);
        assert_eq!((e.code, e.error_code()), (-32602, "INVALID_PARAMS"), "{e}");
    }
}

// PK-06, PK-01, PK-03 on the wire (version 4): `maxEvents` from 1 to 500,000, 0 and one past
// refused; fragments go out as `session-event`s the schema and the typed form accept,
// and `session.page` answers them packed, with the numbers a journal joins on.
#[test]
fn session_page_at_its_limits_and_the_live_events_it_joins() {
    use host_wire::method::MAX_SESSION_PAGE_EVENTS;
    use timeline_core::history::{unpack_records, DeltaKind, SessionHistoryRecord};
    let at = frame(
        "session.page",
        serde_json::json!({ "appSessionId": "s1", "maxEvents": MAX_SESSION_PAGE_EVENTS }),
    );
    let ClientRequest::SessionPage { max_events, .. } = decode_request(&at)
        .unwrap()
        .call
        .into_client_request()
        .unwrap()
    else {
        panic!("a session page")
    };
    assert_eq!(max_events, 500_000);
    for past in [MAX_SESSION_PAGE_EVENTS as u64 + 1, 0, u64::MAX] {
        let text = frame(
            "session.page",
            serde_json::json!({ "appSessionId": "s1", "maxEvents": past }),
        );
        assert_eq!(refused(&text).error_code(), "INVALID_PARAMS", "{past}");
    }

    let mut rig = Rig::new();
    rig.call(
        "run.chatJoin",
        serde_json::json!({ "appSessionId": "s1", "liveUpdates": "snapshots" }),
    );
    let empty = rig.call("session.page", serde_json::json!({ "appSessionId": "s1" }));
    assert_eq!(empty["result"]["logId"], serde_json::Value::Null);
    assert_eq!(empty["result"]["nextSeq"], 1);
    for text in ["Hel", "lo", " world"] {
        rig.agent(AgentInput::Delta {
            session: sid("s1"),
            fragment: host_core::Fragment::new(DeltaKind::Text, "item-1", text).turn("turn-1"),
        });
    }
    let live: Vec<serde_json::Value> = rig
        .notifications("chat:timeline-updated")
        .into_iter()
        .filter(|n| n["params"]["event"] == "session-event")
        .map(|n| n["params"].clone())
        .collect();
    assert_eq!(live.len(), 3);
    assert_eq!(live[2]["sessionEvent"]["seq"], 3);
    assert_eq!(live[2]["sessionEvent"]["turnId"], "turn-1");
    let page = rig.call(
        "session.page",
        serde_json::json!({ "appSessionId": "s1", "maxEvents": 10 }),
    );
    let result = &page["result"];
    assert_eq!(result["logId"], live[0]["logId"]);
    assert_eq!(
        (&result["firstSeq"], &result["nextSeq"]),
        (&1.into(), &4.into())
    );
    assert_eq!(result["records"][0]["type"], "chunks");
    assert_eq!(
        result["records"][0]["event"]["type"],
        "chunkrow/text-chunks"
    );
    let records: Vec<SessionHistoryRecord> =
        serde_json::from_value(result["records"].clone()).unwrap();
    let events = unpack_records(&records).unwrap();
    let sent: Vec<serde_json::Value> = live.iter().map(|l| l["sessionEvent"].clone()).collect();
    assert_eq!(
        serde_json::to_value(&events).unwrap(),
        serde_json::Value::Array(sent)
    );
}
