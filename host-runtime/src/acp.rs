//! The ACP face: an Agent Client Protocol client (an editor, `acpx`) attaches to a
//! session the host keeps custody of, as one more device.
//!
//! [`AcpFace`] is sans-IO: ACP lines from the client and wire frames from the host's
//! server go in, ACP lines and wire frames come out. [`serve_stdio`] runs it between
//! stdin/stdout and the server's WebSocket (`ws://.../ws?token=...`), which is what the
//! `custody-acp` program does: an editor starts it as its agent ([`serve_stdio_tls`] for
//! a server over TLS, `wss://`, feature `tls`). The client sees what the
//! phones see, because it is a device of the same host:
//!
//! | ACP | the host |
//! |---|---|
//! | `initialize` | nothing: protocol 1, `loadSession`, `sessionCapabilities.list`, no authentication |
//! | `session/list` | `run.chatListSessions`: every session the host serves, with its title and its `cwd` (the directory its agent works in, when the embedder said, `SessionInfo::cwd`; else the face's directory, [`AcpFace::cwd`], which `custody-acp` sets to its working directory); a `cwd` filter keeps the sessions listed with that directory, so one equal to the face's directory keeps every session whose own is not known |
//! | `session/new` | the first: `run.chatJoin` of the session the face was started for (its ACP session ID is the app session ID); each later one: `run.chatNewSession` with the client's `cwd` (a session the host's embedder makes, `host_runtime::RuntimeBuilder::sessions`), then `run.chatJoin` of it. A host that makes no sessions refuses it: `-32603`, the host's `SESSION_NOT_CREATED` error as its data |
//! | `session/load` | `run.chatJoin`, then `run.chatLoad` of the latest 100 rows, replayed as `session/update` before the answer |
//! | `session/prompt` | `run.chatOutboxSubmit` (automatic, with an idempotency key); answered when the run its message started ends (`completed`: `end_turn`, `aborted`: `cancelled`, `failed`: an error) |
//! | `session/cancel` | every unanswered prompt of the session answers `cancelled` (whatever its run's end): a message still in the outbox is removed (`run.chatOutboxRemove`), a run a prompt started is stopped (`run.cancel`) and its prompt answers when the run ends, after its last update |
//! | `session/update` | the rows of each `blocks` snapshot that are new or changed: reply text as `agent_message_chunk` (only what was not sent yet), reasoning as `agent_thought_chunk`, another device's message as `user_message_chunk`, activity rows as `tool_call` and `tool_call_update` |
//! | `session/request_permission` | a pending approval card; the client's option is `run.chatResolveApproval` (decided once across devices: a card decided elsewhere first refuses it) |
//!
//! A submit the host refuses answers the prompt with the host's error code and text. A
//! message custody holds for the user leaves the prompt waiting until the user decides on
//! another device, or the client cancels.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, ContentBlock, ContentChunk, Implementation, InitializeResponse,
    ListSessionsResponse, LoadSessionResponse, NewSessionResponse, PermissionOption,
    PermissionOptionKind, PromptResponse, RequestPermissionRequest, SessionCapabilities,
    SessionInfo, SessionListCapabilities, SessionNotification, SessionUpdate, StopReason, ToolCall,
    ToolCallStatus, ToolCallUpdate, ToolCallUpdateFields,
};
use serde_json::{json, Value};

/// The rows a `session/load` replays.
pub const LOAD_ROWS: u64 = 100;

/// What a wire request of the face was for.
#[derive(Debug)]
enum Wire {
    Join,
    Load {
        acp_id: Value,
        session: String,
    },
    List {
        acp_id: Value,
        /// The client's `cwd` filter.
        cwd: Option<std::path::PathBuf>,
    },
    NewSession {
        acp_id: Value,
    },
    Submit {
        op: String,
    },
    Remove {
        op: String,
    },
    Other,
}

/// A prompt waiting for the run its message starts.
#[derive(Debug)]
struct Prompt {
    acp_id: Value,
    session: String,
    /// The run its message started, once the host says.
    run: Option<String>,
    /// The host took the message into the outbox.
    submitted: bool,
    /// The client cancelled it: it answers `cancelled` however its run ends.
    cancelled: bool,
    /// Its removal from the outbox is asked for.
    removing: bool,
}

#[derive(Debug, Default)]
struct Sent {
    /// Characters of a text row already sent.
    chars: usize,
    /// The activity row's status last sent.
    status: Option<String>,
}

/// The face. See the module doc.
pub struct AcpFace {
    session: String,
    /// The directory `session/list` names for a session whose own the host does not
    /// know.
    cwd: std::path::PathBuf,
    new_id: Box<dyn FnMut() -> String + Send>,
    next_wire: u64,
    next_acp: u64,
    wire: BTreeMap<u64, Wire>,
    joined: BTreeSet<String>,
    /// Rows sent to the client, by row key.
    sent: BTreeMap<String, Sent>,
    /// Prompts not answered yet, by the operation of their message.
    prompts: BTreeMap<String, Prompt>,
    /// A `session/new` was answered with the face's own session: a later one asks the
    /// host for a new session.
    opened: bool,
    /// Sessions whose run is stopped once the cancelled messages still in their
    /// outbox are removed (so the stop does not start them).
    stopping: BTreeSet<String>,
    /// Permission requests of ours: ACP id to the card's four IDs.
    asked: BTreeMap<u64, Value>,
    /// Cards already asked about.
    cards: BTreeSet<String>,
    /// The operations of the client's own messages.
    own: BTreeSet<String>,
    to_client: VecDeque<String>,
    to_wire: VecDeque<String>,
}

impl std::fmt::Debug for AcpFace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AcpFace")
            .field("session", &self.session)
            .field("prompts", &self.prompts.len())
            .finish_non_exhaustive()
    }
}

impl AcpFace {
    /// A face for `session` (what `session/new` attaches to), naming the messages it
    /// submits with `new_id` (a UUID each call).
    pub fn new(session: impl Into<String>, new_id: Box<dyn FnMut() -> String + Send>) -> AcpFace {
        AcpFace {
            session: session.into(),
            cwd: std::path::PathBuf::from("/"),
            new_id,
            next_wire: 0,
            next_acp: 0,
            wire: BTreeMap::new(),
            joined: BTreeSet::new(),
            sent: BTreeMap::new(),
            prompts: BTreeMap::new(),
            opened: false,
            stopping: BTreeSet::new(),
            asked: BTreeMap::new(),
            cards: BTreeSet::new(),
            own: BTreeSet::new(),
            to_client: VecDeque::new(),
            to_wire: VecDeque::new(),
        }
    }

    /// The directory `session/list` names as the `cwd` of a session whose own the host
    /// does not know (`/` unless set; [`serve_stdio`] gives the face's own working
    /// directory).
    #[must_use]
    pub fn cwd(mut self, cwd: impl Into<std::path::PathBuf>) -> AcpFace {
        self.cwd = cwd.into();
        self
    }

    /// The next ACP line for the client.
    pub fn poll_client(&mut self) -> Option<String> {
        self.to_client.pop_front()
    }

    /// The next frame for the host's server.
    pub fn poll_wire(&mut self) -> Option<String> {
        self.to_wire.pop_front()
    }

    fn reply(&mut self, id: &Value, result: Value) {
        self.to_client
            .push_back(json!({ "jsonrpc": "2.0", "id": id, "result": result }).to_string());
    }

    fn error(&mut self, id: &Value, code: i64, message: &str, data: Option<Value>) {
        let mut e = json!({ "code": code, "message": message });
        if let Some(d) = data {
            e["data"] = d;
        }
        self.to_client
            .push_back(json!({ "jsonrpc": "2.0", "id": id, "error": e }).to_string());
    }

    fn update(&mut self, session: &str, update: SessionUpdate) {
        let n = SessionNotification::new(session.to_owned(), update);
        self.to_client.push_back(
            json!({ "jsonrpc": "2.0", "method": "session/update", "params": to_value(&n) })
                .to_string(),
        );
    }

    fn call(&mut self, method: &str, params: Value, what: Wire) {
        self.next_wire += 1;
        let id = self.next_wire;
        self.wire.insert(id, what);
        self.to_wire.push_back(
            json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }).to_string(),
        );
    }

    fn key(&mut self) -> String {
        (self.new_id)()
    }

    fn join(&mut self, session: &str) {
        if self.joined.insert(session.to_owned()) {
            self.call(
                "run.chatJoin",
                json!({ "appSessionId": session }),
                Wire::Join,
            );
        }
    }

    /// One line the ACP client wrote.
    pub fn handle_client_line(&mut self, line: &[u8]) {
        let Ok(v) = serde_json::from_slice::<Value>(line) else {
            self.error(&Value::Null, -32700, "Parse error", None);
            return;
        };
        let method = v["method"].as_str().map(str::to_owned);
        let id = v.get("id").cloned();
        let params = v.get("params").cloned().unwrap_or(Value::Null);
        match (method.as_deref(), id) {
            (Some(m), Some(id)) => self.client_request(m, &id, &params),
            (Some("session/cancel"), None) => {
                let session = params["sessionId"]
                    .as_str()
                    .unwrap_or(&self.session)
                    .to_owned();
                self.cancel(&session);
            }
            (Some(_), None) => {}
            (None, Some(id)) => self.client_answer(&id, &v),
            (None, None) => {}
        }
    }

    /// `session/cancel`: every prompt of the session answers `cancelled`. A message
    /// still in the outbox is removed (its prompt answers when the host confirms); a
    /// message that started a run stops it, after those removals, and its prompt
    /// answers when the run ends.
    fn cancel(&mut self, session: &str) {
        for p in self.prompts.values_mut().filter(|p| p.session == session) {
            if p.run.is_some() && !p.cancelled {
                self.stopping.insert(session.to_owned());
            }
            p.cancelled = true;
        }
        self.advance_cancel(session);
    }

    /// Asks for the removals a cancel needs, then the stop once none is outstanding.
    fn advance_cancel(&mut self, session: &str) {
        let mut remove = Vec::new();
        let mut outstanding = false;
        for (op, p) in self.prompts.iter_mut() {
            if p.session != session || !p.cancelled || p.run.is_some() {
                continue;
            }
            if p.submitted && !p.removing {
                p.removing = true;
                remove.push(op.clone());
            }
            outstanding |= !p.submitted || p.removing;
        }
        for op in remove {
            let key = self.key();
            self.call(
                "run.chatOutboxRemove",
                json!({ "appSessionId": session, "queueId": format!("acp-{op}"),
                    "idempotencyKey": key }),
                Wire::Remove { op },
            );
        }
        if !outstanding && self.stopping.remove(session) {
            self.stop(session);
        }
    }

    fn stop(&mut self, session: &str) {
        let key = self.key();
        self.call(
            "run.cancel",
            json!({ "appSessionId": session, "idempotencyKey": key }),
            Wire::Other,
        );
    }

    fn client_request(&mut self, method: &str, id: &Value, params: &Value) {
        match method {
            "initialize" => {
                let r = InitializeResponse::new(ProtocolVersion::V1)
                    .agent_capabilities(
                        AgentCapabilities::new()
                            .load_session(true)
                            .session_capabilities(
                                SessionCapabilities::new().list(SessionListCapabilities::new()),
                            ),
                    )
                    .agent_info(Implementation::new("custody", env!("CARGO_PKG_VERSION")));
                self.reply(id, to_value(&r));
            }
            "session/new" if self.opened => {
                let key = self.key();
                let mut ask = json!({ "idempotencyKey": key });
                if let Some(cwd) = params["cwd"].as_str() {
                    ask["cwd"] = json!(cwd);
                }
                self.call(
                    "run.chatNewSession",
                    ask,
                    Wire::NewSession { acp_id: id.clone() },
                );
            }
            "session/new" => {
                self.opened = true;
                let session = self.session.clone();
                self.join(&session);
                self.reply(id, to_value(&NewSessionResponse::new(session)));
            }
            "session/list" => self.call(
                "run.chatListSessions",
                json!({}),
                Wire::List {
                    acp_id: id.clone(),
                    cwd: params["cwd"].as_str().map(std::path::PathBuf::from),
                },
            ),
            "session/load" => {
                let Some(session) = params["sessionId"].as_str().map(str::to_owned) else {
                    self.error(id, -32602, "Invalid params: no sessionId", None);
                    return;
                };
                self.join(&session);
                self.call(
                    "run.chatLoad",
                    json!({ "appSessionId": session, "pageSize": LOAD_ROWS }),
                    Wire::Load {
                        acp_id: id.clone(),
                        session: session.clone(),
                    },
                );
            }
            "session/prompt" => {
                let (Some(session), Some(parts)) =
                    (params["sessionId"].as_str(), params["prompt"].as_array())
                else {
                    self.error(
                        id,
                        -32602,
                        "Invalid params: sessionId and prompt are required",
                        None,
                    );
                    return;
                };
                let session = session.to_owned();
                let text = parts
                    .iter()
                    .filter_map(|p| p["text"].as_str())
                    .collect::<Vec<_>>()
                    .join("\n");
                let op = self.key();
                let key = self.key();
                self.own.insert(op.clone());
                self.prompts.insert(
                    op.clone(),
                    Prompt {
                        acp_id: id.clone(),
                        session: session.clone(),
                        run: None,
                        submitted: false,
                        cancelled: false,
                        removing: false,
                    },
                );
                self.call(
                    "run.chatOutboxSubmit",
                    json!({
                        "appSessionId": session, "queueId": format!("acp-{op}"),
                        "operationId": op, "userText": text,
                        "source": "acp", "createdAt": 0,
                        "intent": "automatic", "sendMode": "queue",
                        "idempotencyKey": key,
                    }),
                    Wire::Submit { op: op.clone() },
                );
            }
            _ => self.error(id, -32601, &format!("Method not found: {method}"), None),
        }
    }

    /// The client answered a permission request.
    fn client_answer(&mut self, id: &Value, v: &Value) {
        let Some(card) = id.as_u64().and_then(|n| self.asked.remove(&n)) else {
            return;
        };
        let decision = match v
            .pointer("/result/outcome/optionId")
            .and_then(Value::as_str)
        {
            Some("allow_once") => "accept",
            Some("allow_always") => "acceptForSession",
            Some("reject_once") => "decline",
            _ => "cancel",
        };
        let key = self.key();
        let mut params = card;
        params["decision"] = json!(decision);
        params["idempotencyKey"] = json!(key);
        self.call("run.chatResolveApproval", params, Wire::Other);
    }

    /// One frame the host's server sent.
    pub fn handle_wire_frame(&mut self, frame: &str) {
        let Ok(v) = serde_json::from_str::<Value>(frame) else {
            return;
        };
        if let Some(id) = v.get("id").and_then(Value::as_u64) {
            if let Some(what) = self.wire.remove(&id) {
                self.wire_answer(what, &v);
            }
            return;
        }
        if v["method"] == "chat:timeline-updated" {
            self.event(&v["params"]);
        }
    }

    /// When the host's answer `v` is an error, answers the client's request `acp_id`
    /// with `message` and the host's error as its data, and says so.
    fn host_refused(&mut self, acp_id: &Value, v: &Value, message: &str) -> bool {
        let Some(e) = v.get("error") else {
            return false;
        };
        self.error(acp_id, -32603, message, Some(e.clone()));
        true
    }

    fn wire_answer(&mut self, what: Wire, v: &Value) {
        match what {
            Wire::Load { acp_id, session } => {
                if self.host_refused(&acp_id, v, "the host could not load the session") {
                    return;
                }
                let blocks = v["result"]["blocks"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                let overlay = v["result"]["liveOverlay"]["blocks"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                for b in blocks.iter().chain(overlay.iter()) {
                    self.row(&session, b, true);
                }
                self.reply(&acp_id, to_value(&LoadSessionResponse::new()));
            }
            Wire::List {
                acp_id,
                cwd: filter,
            } => {
                if self.host_refused(&acp_id, v, "the host could not list its sessions") {
                    return;
                }
                let sessions = v["result"]["sessions"]
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|s| {
                        let id = s["appSessionId"].as_str()?;
                        let title = s["title"].as_str().filter(|t| !t.is_empty());
                        let cwd = s["cwd"]
                            .as_str()
                            .map_or_else(|| self.cwd.clone(), std::path::PathBuf::from);
                        if filter.as_ref().is_some_and(|f| *f != cwd) {
                            return None;
                        }
                        Some(SessionInfo::new(id.to_owned(), cwd).title(title.map(str::to_owned)))
                    })
                    .collect();
                self.reply(&acp_id, to_value(&ListSessionsResponse::new(sessions)));
            }
            Wire::NewSession { acp_id } => {
                if self.host_refused(&acp_id, v, "the host made no new session") {
                    return;
                }
                let Some(session) = v["result"]["appSessionId"].as_str().map(str::to_owned) else {
                    self.error(
                        &acp_id,
                        -32603,
                        "the host's answer named no session",
                        Some(v.clone()),
                    );
                    return;
                };
                self.join(&session);
                self.reply(&acp_id, to_value(&NewSessionResponse::new(session)));
            }
            Wire::Submit { op } => {
                let Some(p) = self.prompts.get_mut(&op) else {
                    return;
                };
                if let Some(e) = v.get("error") {
                    let acp_id = p.acp_id.clone();
                    let session = p.session.clone();
                    self.prompts.remove(&op);
                    let message = e["message"].as_str().unwrap_or("refused").to_owned();
                    self.error(&acp_id, -32603, &message, e.get("data").cloned());
                    self.advance_cancel(&session);
                } else {
                    p.submitted = true;
                    let session = p.session.clone();
                    self.advance_cancel(&session);
                }
            }
            Wire::Remove { op } => {
                let Some(p) = self.prompts.get_mut(&op) else {
                    return;
                };
                p.removing = false;
                let session = p.session.clone();
                // Refused: the message was handed to the agent meanwhile; its run is
                // stopped when it starts, and the prompt answers when it ends.
                if v.get("error").is_none() && p.run.is_none() {
                    let acp_id = p.acp_id.clone();
                    self.prompts.remove(&op);
                    self.reply(
                        &acp_id,
                        to_value(&PromptResponse::new(StopReason::Cancelled)),
                    );
                }
                self.advance_cancel(&session);
            }
            Wire::Join | Wire::Other => {}
        }
    }

    fn event(&mut self, p: &Value) {
        let session = p["appSessionId"].as_str().unwrap_or_default().to_owned();
        match p["event"].as_str() {
            Some("blocks") => {
                let rows = p["liveOverlay"]["blocks"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                for b in &rows {
                    self.row(&session, b, false);
                }
            }
            Some("started") => {
                let (Some(op), Some(run)) = (p["operationId"].as_str(), p["runId"].as_str()) else {
                    return;
                };
                let Some(prompt) = self.prompts.get_mut(op) else {
                    return;
                };
                prompt.run = Some(run.to_owned());
                // Cancelled before it started: the run is stopped now.
                if prompt.cancelled {
                    self.stopping.insert(session.clone());
                    self.advance_cancel(&session);
                }
            }
            Some(end @ ("completed" | "aborted" | "failed")) => {
                let run = p["runId"].as_str();
                let by_run = self
                    .prompts
                    .iter()
                    .find(|(_, q)| run.is_some() && q.run.as_deref() == run)
                    .map(|(op, _)| op.clone());
                let op = by_run.or_else(|| p["operationId"].as_str().map(str::to_owned));
                let Some(prompt) = op.and_then(|op| self.prompts.remove(&op)) else {
                    return;
                };
                let acp_id = prompt.acp_id;
                match end {
                    _ if prompt.cancelled => self.reply(
                        &acp_id,
                        to_value(&PromptResponse::new(StopReason::Cancelled)),
                    ),
                    "completed" => {
                        self.reply(&acp_id, to_value(&PromptResponse::new(StopReason::EndTurn)))
                    }
                    "aborted" => self.reply(
                        &acp_id,
                        to_value(&PromptResponse::new(StopReason::Cancelled)),
                    ),
                    _ => self.error(
                        &acp_id,
                        -32603,
                        "the agent's run failed",
                        p.get("agentErrorInfo").cloned(),
                    ),
                }
            }
            _ => {}
        }
    }

    /// One row of the session: what the client has not seen of it.
    fn row(&mut self, session: &str, b: &Value, history: bool) {
        let (Some(t), Some(id)) = (b["type"].as_str(), b["id"].as_str()) else {
            return;
        };
        let key = format!("{t}\u{0}{id}");
        let text = b["data"]["text"].as_str().unwrap_or_default().to_owned();
        let sent = self.sent.entry(key.clone()).or_default();
        match t {
            "agent-reply" | "thinking" | "user" => {
                let chars = text.chars().count();
                if chars <= sent.chars {
                    return;
                }
                let new: String = text.chars().skip(sent.chars).collect();
                sent.chars = chars;
                // The client's own message is not told back to it live.
                let own = t == "user"
                    && !history
                    && b["operationId"]
                        .as_str()
                        .is_some_and(|op| self.own.contains(op));
                if own {
                    return;
                }
                let chunk = ContentChunk::new(ContentBlock::from(new));
                let update = match t {
                    "agent-reply" => SessionUpdate::AgentMessageChunk(chunk),
                    "thinking" => SessionUpdate::AgentThoughtChunk(chunk),
                    _ => SessionUpdate::UserMessageChunk(chunk),
                };
                self.update(session, update);
            }
            "activity" => {
                let status = b["data"]["status"]
                    .as_str()
                    .unwrap_or("inProgress")
                    .to_owned();
                let title = b["data"]["title"].as_str().unwrap_or("Activity").to_owned();
                let first = sent.status.is_none();
                if sent.status.as_deref() == Some(status.as_str()) {
                    return;
                }
                sent.status = Some(status.clone());
                let acp_status = match status.as_str() {
                    "completed" => ToolCallStatus::Completed,
                    "failed" | "declined" => ToolCallStatus::Failed,
                    _ => ToolCallStatus::InProgress,
                };
                let update = if first {
                    SessionUpdate::ToolCall(
                        ToolCall::new(id.to_owned(), title.clone()).status(acp_status),
                    )
                } else {
                    SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(
                        id.to_owned(),
                        ToolCallUpdateFields::new().status(acp_status),
                    ))
                };
                self.update(session, update);
                let card = &b["data"]["approval"];
                let pending = card.is_object() && card.get("result").is_none_or(Value::is_null);
                if pending && !history && self.cards.insert(id.to_owned()) {
                    self.permission(session, id, &title, card);
                }
            }
            _ => {}
        }
    }

    fn permission(&mut self, session: &str, id: &str, title: &str, card: &Value) {
        let allowed: Vec<&str> = card["allowed"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut options = Vec::new();
        for (d, option, name, kind) in [
            (
                "accept",
                "allow_once",
                "Allow",
                PermissionOptionKind::AllowOnce,
            ),
            (
                "acceptForSession",
                "allow_always",
                "Allow for this session",
                PermissionOptionKind::AllowAlways,
            ),
            (
                "decline",
                "reject_once",
                "Decline",
                PermissionOptionKind::RejectOnce,
            ),
        ] {
            if allowed.contains(&d) {
                options.push(PermissionOption::new(
                    option.to_owned(),
                    name.to_owned(),
                    kind,
                ));
            }
        }
        let subtitle = card["subtitle"].as_str().unwrap_or(title).to_owned();
        let request = RequestPermissionRequest::new(
            session.to_owned(),
            ToolCallUpdate::new(id.to_owned(), ToolCallUpdateFields::new().title(subtitle)),
            options,
        );
        self.next_acp += 1;
        let n = self.next_acp;
        self.asked.insert(
            n,
            json!({
                "requestId": card["requestId"], "threadId": card["threadId"],
                "turnId": card["turnId"], "itemId": card["itemId"],
            }),
        );
        self.to_client.push_back(
            json!({ "jsonrpc": "2.0", "id": n, "method": "session/request_permission",
                "params": to_value(&request) })
            .to_string(),
        );
    }
}

fn to_value<T: serde::Serialize>(t: &T) -> Value {
    // The protocol's own types always serialize.
    serde_json::to_value(t).unwrap_or(Value::Null)
}

/// Runs a face for `session` between this process's stdin/stdout and the host's server
/// at `url` (`ws://127.0.0.1:PORT/ws?token=...`), until either side closes.
///
/// # Errors
///
/// The server could not be reached, or a read or write failed.
pub async fn serve_stdio(url: &str, session: &str) -> std::io::Result<()> {
    let (ws, _) = tokio_tungstenite::connect_async(url)
        .await
        .map_err(|e| std::io::Error::other(format!("the host at {url}: {e}")))?;
    face_stdio(ws, session).await
}

/// [`serve_stdio`] to a server over TLS (feature `tls`): `url` is
/// `wss://HOST:PORT/ws?token=...`, and the server's certificate must chain to one of
/// the PEM certificates in `roots` (its own self-signed certificate, or a CA bundle such
/// as `/etc/ssl/certs/ca-certificates.crt`), for the name `HOST`.
///
/// # Errors
///
/// `roots` holds no usable certificate, the URL has no host, the server could not be
/// reached or its certificate is not trusted, or a read or write failed.
#[cfg(feature = "tls")]
pub async fn serve_stdio_tls(url: &str, session: &str, roots: &[u8]) -> std::io::Result<()> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};

    let bad = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, what);
    let mut store = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(roots) {
        let cert = cert.map_err(|e| bad(format!("unreadable PEM in the roots: {e}")))?;
        store
            .add(cert)
            .map_err(|e| bad(format!("a root certificate was refused: {e}")))?;
    }
    if store.is_empty() {
        return Err(bad("the roots hold no certificate".into()));
    }
    let uri: tokio_tungstenite::tungstenite::http::Uri = url
        .parse()
        .map_err(|e| bad(format!("not a URL: {url}: {e}")))?;
    let (Some("wss"), Some(host)) = (uri.scheme_str(), uri.host()) else {
        return Err(bad(format!("not a wss:// URL with a host: {url}")));
    };
    let port = uri.port_u16().unwrap_or(443);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = ServerName::try_from(host.to_owned())
        .map_err(|e| bad(format!("the host of {url}: {e}")))?;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_root_certificates(store)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect((host, port)).await?;
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| std::io::Error::other(format!("the host at {url}: {e}")))?;
    let (ws, _) = tokio_tungstenite::client_async(url, tls)
        .await
        .map_err(|e| std::io::Error::other(format!("the host at {url}: {e}")))?;
    face_stdio(ws, session).await
}

async fn face_stdio<S>(
    ws: tokio_tungstenite::WebSocketStream<S>,
    session: &str,
) -> std::io::Result<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use futures_util::{SinkExt, StreamExt};
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    use tokio_tungstenite::tungstenite::Message;

    let (mut tx, mut rx) = ws.split();
    let new_id = Box::new(|| uuid::Uuid::new_v4().to_string());
    let mut face = AcpFace::new(session, new_id);
    if let Ok(dir) = std::env::current_dir() {
        face = face.cwd(dir);
    }
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    let mut stdout = tokio::io::stdout();
    loop {
        while let Some(f) = face.poll_wire() {
            tx.send(Message::Text(f.into()))
                .await
                .map_err(std::io::Error::other)?;
        }
        while let Some(l) = face.poll_client() {
            stdout.write_all(l.as_bytes()).await?;
            stdout.write_all(b"\n").await?;
        }
        stdout.flush().await?;
        tokio::select! {
            line = stdin.next_line() => match line? {
                Some(l) => face.handle_client_line(l.as_bytes()),
                None => return Ok(()),
            },
            msg = rx.next() => match msg {
                Some(Ok(Message::Text(t))) => face.handle_wire_frame(&t),
                Some(Ok(Message::Close(_))) | None => return Ok(()),
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(std::io::Error::other(e)),
            },
        }
    }
}
