//! An ACP agent behind the host's agent seam ([`host_core::Agent`]): one agent process
//! serves every session, driven without blocking and without IO.
//!
//! | host call | what the agent is sent | what the host gets |
//! |---|---|---|
//! | first call | the process, `initialize` (protocol 1, no file system, no terminal) | nothing yet |
//! | a session's first call | `session/load` of its ACP session when the agent offers it (the replay goes to [`AcpHistory`], never live), else `session/resume`; `session/new` when it has none | nothing yet |
//! | send, start | `session/prompt` with the message's text; the user row is published | [`SendResult::Accepted`] and a [`AgentInput::DeliveryProof`] at the first conversation update or the prompt's answer; `ProvenUnadmitted` when the write failed whole or the agent refused the request (`-32700`, `-32600`, `-32601`, `-32602`); `AdmissionUncertain` when the write broke, the process ended, the agent failed otherwise or 30 s passed without a word |
//! | send, steer | nothing | `ProvenUnadmitted`: ACP v1 has no steer (custody refuses such a message at submit) |
//! | history read | nothing | `Found` when the prompt's answer came (its turn is in [`AcpHistory`]), else `Unreadable`: ACP v1 gives no message ID, so the message is held for the user, never sent again by itself |
//! | stop | `session/cancel` | `Stopped` when the prompt is answered; after 10 s the process is killed, and its end stops the run |
//! | take back | nothing | `NotDetached` (there are no steers to take back) |
//! | approval decision | the answer to `session/request_permission`: the option of the decision's kind, or `cancelled` | [`AgentInput::ApprovalResolved`] once the answer is written |
//!
//! A run ends ([`AgentInput::RunEnded`]) when its prompt is answered (completed;
//! `cancelled`: aborted; `refusal` or an error: failed) or when the process ends.
//!
//! A permission request becomes an approval card: `execute` is a command,
//! `edit`/`delete`/`move` a file change, any other kind a permission, with the tool
//! call's title as the card's line (a kind the library does not know is kept in that
//! line, never dropped). `allow_once` is accept, `allow_always` accept for the session,
//! `reject_once` (else `reject_always`) decline; cancel is always allowed.
//!
//! Requests of the agent the host did not offer (files, terminals) are answered with
//! the JSON-RPC error "method not found"; notifications and updates it does not know are
//! counted ([`AcpAgent::skipped`]).

use outbox_core::adapter::{ReadHistoryRequest, StopRequest, TakeBackRequest};
use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    CancelNotification, ClientCapabilities, ContentBlock, InitializeRequest, InitializeResponse,
    LoadSessionRequest, NewSessionRequest, NewSessionResponse, PermissionOption,
    PermissionOptionKind, PromptRequest, PromptResponse, RequestPermissionOutcome,
    RequestPermissionRequest, RequestPermissionResponse, ResumeSessionRequest,
    SelectedPermissionOutcome, SessionNotification, SessionUpdate, StopReason, ToolKind,
};
use host_core::{
    Agent, AgentCall, AgentEffect, AgentInput, FileError, ProcessId, ProcessSpec, ReadId,
    WriteFailure, WriteId,
};
use outbox_core::adapter::{
    Capabilities, HistoryRead, SendKind, SendRequest, SendResult, StopResult, TakeBackResult,
};
use outbox_core::entry::Acceptance;
use outbox_core::ids::{OperationId, RunId, SessionId, ThreadId, TurnId};
use outbox_core::AttemptId;
use overlay_core::live::RunEventKind;
use overlay_core::store::{RowClass, StoredBlock};
use serde_json::{json, Value};
use timeline_core::key::TargetId;
use timeline_core::rows::{ApprovalKind, ApprovalRequest, ApprovalResult, Decision};
use timeline_core::time::Millis;

use crate::history::AcpHistory;
use crate::rows::{kind_word, Projector, Step};

/// The reply deadline of a send (OB-09: "the 30 s reply deadline"): no word of the
/// agent on the prompt by then makes its outcome unknown.
pub const REPLY_DEADLINE: Millis = Millis(30_000);

/// How long `initialize` and opening a session may take.
pub const OPEN_DEADLINE: Millis = Millis(30_000);

/// How long a stop waits for the prompt's answer before the process is killed.
pub const STOP_DEADLINE: Millis = Millis(10_000);

/// The JSON-RPC codes that say the agent refused the request as it came (it did not
/// take the message).
const REFUSED: [i64; 4] = [-32700, -32600, -32601, -32602];

/// How [`AcpAgent`] starts its agent.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct AcpConfig {
    /// The agent program, its arguments and its environment.
    pub spec: ProcessSpec,
    /// The working directory of its sessions (`cwd` of `session/new`).
    pub cwd: PathBuf,
}

impl AcpConfig {
    /// The agent started as `spec`, its sessions in `cwd`.
    pub fn new(spec: ProcessSpec, cwd: impl Into<PathBuf>) -> AcpConfig {
        AcpConfig {
            spec,
            cwd: cwd.into(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Conn {
    Down,
    Initializing,
    Ready,
}

/// What a request of ours was.
#[derive(Clone, Debug)]
enum Asked {
    Initialize,
    Open { session: SessionId, load: bool },
    Prompt { session: SessionId },
}

#[derive(Debug)]
struct Turn {
    run: RunId,
    attempt: AttemptId,
    op: OperationId,
    prompt: u64,
    /// The write of the prompt, until its outcome came.
    write: Option<WriteId>,
    /// The send was answered.
    answered: bool,
    /// Evidence came (a conversation update or the answer): the proof was given.
    proven: bool,
    deadline: Option<Millis>,
    stops: Vec<AttemptId>,
    stop_deadline: Option<Millis>,
}

#[derive(Debug)]
struct Sess {
    acp: Option<String>,
    opening: bool,
    open: bool,
    waiting: VecDeque<AgentCall>,
    projector: Projector,
    /// Rows of a `session/load` replay, while it runs.
    replay: Option<Projector>,
    turn: Option<Turn>,
}

#[derive(Debug)]
struct Permission {
    /// The JSON-RPC id, as the agent wrote it.
    id: Value,
    request: ApprovalRequest,
    options: Vec<PermissionOption>,
}

#[derive(Debug)]
enum Writing {
    Prompt(SessionId),
    Answer {
        request_id: String,
        result: ApprovalResult,
    },
    Other,
}

/// An ACP agent. See the module doc.
#[derive(Debug)]
pub struct AcpAgent {
    config: AcpConfig,
    history: AcpHistory,
    conn: Conn,
    process: ProcessId,
    next_process: u64,
    next_id: u64,
    next_write: u64,
    open_deadline: Option<Millis>,
    load_session: bool,
    resume_session: bool,
    agent_name: Option<String>,
    sessions: BTreeMap<SessionId, Sess>,
    by_acp: BTreeMap<String, SessionId>,
    asked: BTreeMap<u64, Asked>,
    writes: BTreeMap<WriteId, Writing>,
    permissions: BTreeMap<String, Permission>,
    out: VecDeque<AgentEffect>,
    /// Calls taken from a session's waiting line, to run at the next flush.
    pending: VecDeque<AgentCall>,
    skipped: u64,
}

impl AcpAgent {
    /// An agent started as `config` says, keeping its sessions' history in `history`.
    pub fn new(config: AcpConfig, history: AcpHistory) -> AcpAgent {
        AcpAgent {
            config,
            history,
            conn: Conn::Down,
            process: ProcessId(0),
            next_process: 0,
            next_id: 0,
            next_write: 0,
            open_deadline: None,
            load_session: false,
            resume_session: false,
            agent_name: None,
            sessions: BTreeMap::new(),
            by_acp: BTreeMap::new(),
            asked: BTreeMap::new(),
            writes: BTreeMap::new(),
            permissions: BTreeMap::new(),
            out: VecDeque::new(),
            pending: VecDeque::new(),
            skipped: 0,
        }
    }

    /// Serves `session`, on the ACP session `acp_session` when the agent already has
    /// one for it (saved by the embedder from [`AcpAgent::acp_session_of`]), else on a
    /// new one.
    pub fn add_session(&mut self, session: &SessionId, acp_session: Option<&str>) {
        if let Some(a) = acp_session {
            self.by_acp.insert(a.to_owned(), session.clone());
        }
        self.sessions.insert(
            session.clone(),
            Sess {
                acp: acp_session.map(str::to_owned),
                opening: false,
                open: false,
                waiting: VecDeque::new(),
                projector: Projector::new(0),
                replay: None,
                turn: None,
            },
        );
    }

    /// The ACP session of `session`, once the agent named it.
    pub fn acp_session_of(&self, session: &SessionId) -> Option<&str> {
        self.sessions.get(session)?.acp.as_deref()
    }

    /// The process the agent runs as now, if one runs.
    pub fn process(&self) -> Option<ProcessId> {
        (self.conn != Conn::Down).then_some(self.process)
    }

    /// The agent's name, from its `initialize` answer.
    pub fn agent_name(&self) -> Option<&str> {
        self.agent_name.as_deref()
    }

    /// Updates and notifications that gave no row, and lines that were not JSON-RPC.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// The shared history this agent writes.
    pub fn history(&self) -> &AcpHistory {
        &self.history
    }

    fn turn(&self, session: &SessionId) -> Option<&Turn> {
        self.sessions.get(session)?.turn.as_ref()
    }

    fn turn_mut(&mut self, session: &SessionId) -> Option<&mut Turn> {
        self.sessions.get_mut(session)?.turn.as_mut()
    }

    fn input(&mut self, i: AgentInput) {
        self.out.push_back(AgentEffect::Input(i));
    }

    fn write(&mut self, line: &Value, what: Writing) {
        let write = WriteId(self.next_write);
        self.next_write += 1;
        self.writes.insert(write, what);
        self.out.push_back(AgentEffect::Write {
            process: self.process,
            write,
            line: line.to_string().into_bytes(),
        });
    }

    fn request(&mut self, method: &str, params: Value, asked: Asked) -> (u64, WriteId) {
        let id = self.next_id;
        self.next_id += 1;
        let what = match &asked {
            Asked::Prompt { session } => Writing::Prompt(session.clone()),
            _ => Writing::Other,
        };
        self.asked.insert(id, asked);
        let write = WriteId(self.next_write);
        self.write(
            &json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }),
            what,
        );
        (id, write)
    }

    fn start(&mut self, now: Millis) {
        self.next_process += 1;
        self.process = ProcessId(self.next_process);
        self.conn = Conn::Initializing;
        self.out.push_back(AgentEffect::Spawn {
            process: self.process,
            spec: self.config.spec.clone(),
        });
        let init = InitializeRequest::new(ProtocolVersion::V1)
            .client_capabilities(ClientCapabilities::new());
        self.request("initialize", to_value(&init), Asked::Initialize);
        self.open_deadline = Some(now.saturating_add(OPEN_DEADLINE));
    }

    fn open(&mut self, session: &SessionId, now: Millis) {
        let cwd = self.config.cwd.clone();
        let Some(s) = self.sessions.get_mut(session) else {
            return;
        };
        if s.opening || s.open {
            return;
        }
        s.opening = true;
        let (method, params, load) = match s.acp.clone() {
            Some(a) if self.load_session => {
                s.replay = Some(Projector::new(0));
                (
                    "session/load",
                    to_value(&LoadSessionRequest::new(a, cwd)),
                    true,
                )
            }
            Some(a) if self.resume_session => (
                "session/resume",
                to_value(&ResumeSessionRequest::new(a, cwd)),
                false,
            ),
            _ => ("session/new", to_value(&NewSessionRequest::new(cwd)), false),
        };
        let session = session.clone();
        self.request(method, params, Asked::Open { session, load });
        self.open_deadline = Some(now.saturating_add(OPEN_DEADLINE));
    }

    fn call(&mut self, call: AgentCall, now: Millis) {
        match call {
            AgentCall::Send(request) => self.send(request, now),
            AgentCall::ReadHistory(ReadHistoryRequest {
                attempt,
                session,
                operation_id,
                ..
            }) => {
                let read = if self.history.holds(&session, &operation_id) {
                    HistoryRead::Found
                } else {
                    HistoryRead::Unreadable
                };
                self.input(AgentInput::HistoryRead { attempt, read });
            }
            AgentCall::Stop(StopRequest {
                attempt, session, ..
            }) => self.stop(attempt, &session, now),
            AgentCall::TakeBack(TakeBackRequest { attempt, .. }) => {
                self.input(AgentInput::TakeBack {
                    attempt,
                    result: TakeBackResult::NotDetached {
                        reason: "an ACP agent takes no message into a running turn".into(),
                    },
                })
            }
            AgentCall::ResolveApproval {
                request, decision, ..
            } => self.resolve(&request, decision),
            AgentCall::ClearThreadLink { session } => {
                if let Some(s) = self.sessions.get_mut(&session) {
                    if let Some(a) = s.acp.take() {
                        self.by_acp.remove(&a);
                    }
                    s.open = false;
                    self.history.forget(&session);
                }
            }
            // ACP has no session-message tool: nothing asked for this.
            AgentCall::SessionMessageResult { .. } => {}
            _ => {}
        }
    }

    fn send(&mut self, request: SendRequest, now: Millis) {
        let run = match &request.kind {
            SendKind::Start { run } => run.clone(),
            SendKind::Steer { .. } => {
                self.input(AgentInput::SendResult {
                    attempt: request.attempt,
                    result: SendResult::ProvenUnadmitted {
                        error: "an ACP agent takes no message into a running turn".into(),
                    },
                });
                return;
            }
        };
        let session = request.session.clone();
        let Some(acp) = self.sessions.get(&session).and_then(|s| s.acp.clone()) else {
            // Only an open session reaches here; answered all the same, never dropped.
            self.input(AgentInput::SendResult {
                attempt: request.attempt,
                result: SendResult::ProvenUnadmitted {
                    error: format!("the agent has no session open for {session}"),
                },
            });
            return;
        };
        let Some(s) = self.sessions.get_mut(&session) else {
            return;
        };
        if s.turn.is_some() {
            self.input(AgentInput::SendResult {
                attempt: request.attempt,
                result: SendResult::ProvenUnadmitted {
                    error: "a turn of this session still runs".into(),
                },
            });
            return;
        }
        let text = request.request.user_text.clone();
        let key = s
            .projector
            .start_turn(&text, Some(&request.operation_id), now);
        let row = s.projector.row(&key).cloned();
        let prompt = PromptRequest::new(acp, vec![ContentBlock::from(text)]);
        let (id, write) = self.request(
            "session/prompt",
            to_value(&prompt),
            Asked::Prompt {
                session: session.clone(),
            },
        );
        if let Some(s) = self.sessions.get_mut(&session) {
            s.turn = Some(Turn {
                run: run.clone(),
                attempt: request.attempt,
                op: request.operation_id.clone(),
                prompt: id,
                write: Some(write),
                answered: false,
                proven: false,
                deadline: Some(now.saturating_add(REPLY_DEADLINE)),
                stops: Vec::new(),
                stop_deadline: None,
            });
        }
        if let Some(b) = row {
            self.rows(&session, &run, vec![b]);
        }
    }

    fn rows(&mut self, session: &SessionId, run: &RunId, blocks: Vec<timeline_core::Block>) {
        let rows = blocks
            .into_iter()
            .map(|block| StoredBlock {
                block,
                class: RowClass::Ordinary,
                run_id: Some(run.clone()),
            })
            .collect();
        self.input(AgentInput::Rows {
            session: session.clone(),
            target: TargetId::main(session),
            rows,
        });
    }

    fn acceptance(&self, session: &SessionId, t: &Turn, now: Millis) -> Option<Acceptance> {
        let acp = self.sessions.get(session)?.acp.clone()?;
        Some(Acceptance {
            run_id: t.run.clone(),
            thread_id: ThreadId::new(acp).ok()?,
            turn_id: TurnId::new(format!("prompt-{}", t.prompt)).ok()?,
            accepted_at: now,
        })
    }

    /// The agent answered the prompt, or spoke about it: the send is accepted and proven.
    fn prove(&mut self, session: &SessionId, now: Millis) {
        let Some(t) = self.turn(session) else {
            return;
        };
        if t.proven {
            return;
        }
        let (answered, attempt, op) = (t.answered, t.attempt, t.op.clone());
        let acceptance = self.acceptance(session, t, now);
        if !answered {
            let result = match acceptance {
                Some(a) => SendResult::Accepted(a),
                None => SendResult::Delivered,
            };
            self.input(AgentInput::SendResult { attempt, result });
        }
        self.input(AgentInput::DeliveryProof {
            session: session.clone(),
            operation_id: op,
        });
        if let Some(t) = self.turn_mut(session) {
            t.answered = true;
            t.proven = true;
            t.deadline = None;
        }
    }

    /// Ends the turn of `session`: its rows go to history when the agent answered the
    /// prompt (`saved`), the run ends, its stops are answered.
    fn end_turn(&mut self, session: &SessionId, outcome: RunEventKind, saved: bool) {
        let Some(s) = self.sessions.get_mut(session) else {
            return;
        };
        let Some(t) = s.turn.take() else {
            return;
        };
        let rows = s.projector.take_rows();
        if saved {
            self.history.append(session, rows);
        }
        for attempt in t.stops {
            self.input(AgentInput::StopResult {
                attempt,
                result: StopResult::Stopped {
                    untaken: Vec::new(),
                },
            });
        }
        self.input(AgentInput::RunEnded {
            session: session.clone(),
            run: t.run,
            outcome,
            untaken: Vec::new(),
        });
        self.drain_waiting(session);
    }

    fn stop(&mut self, attempt: AttemptId, session: &SessionId, now: Millis) {
        let acp = self.sessions.get(session).and_then(|s| s.acp.clone());
        let turn = self.turn_mut(session);
        let (Some(t), Some(acp)) = (turn, acp) else {
            self.input(AgentInput::StopResult {
                attempt,
                result: StopResult::Stopped {
                    untaken: Vec::new(),
                },
            });
            return;
        };
        t.stops.push(attempt);
        if t.stop_deadline.is_some() {
            // A stop already waits: this one joins it.
            return;
        }
        t.stop_deadline = Some(now.saturating_add(STOP_DEADLINE));
        let cancel = CancelNotification::new(acp);
        self.write(
            &json!({ "jsonrpc": "2.0", "method": "session/cancel", "params": to_value(&cancel) }),
            Writing::Other,
        );
    }

    fn resolve(&mut self, request: &ApprovalRequest, decision: Decision) {
        let Some(p) = self.permissions.remove(&request.request_id) else {
            self.input(AgentInput::ApprovalResolved {
                request_id: request.request_id.clone(),
                thread_id: request.thread_id.clone(),
                turn_id: request.turn_id.clone(),
                item_id: request.item_id.clone(),
                result: Err("the agent no longer waits for this decision".into()),
            });
            return;
        };
        let chosen = option_for(&p.options, decision);
        let (outcome, result) = match chosen {
            Some((o, r)) => (
                RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(
                    o.option_id.clone(),
                )),
                r,
            ),
            None => (
                RequestPermissionOutcome::Cancelled,
                ApprovalResult::Cancelled,
            ),
        };
        let answer = RequestPermissionResponse::new(outcome);
        self.write(
            &json!({ "jsonrpc": "2.0", "id": p.id, "result": to_value(&answer) }),
            Writing::Answer {
                request_id: request.request_id.clone(),
                result,
            },
        );
        // Kept until the write's outcome: a failed write leaves the card pending.
        self.permissions.insert(request.request_id.clone(), p);
    }

    fn drain_waiting(&mut self, session: &SessionId) {
        let ready = self.conn == Conn::Ready
            && self
                .sessions
                .get(session)
                .is_some_and(|s| s.open && s.turn.is_none());
        if !ready {
            return;
        }
        if let Some(call) = self
            .sessions
            .get_mut(session)
            .and_then(|s| s.waiting.pop_front())
        {
            // One call at a time: a send opens a turn, the rest wait behind it.
            self.pending.push_back(call);
        }
    }

    /// Runs the calls taken from waiting lines.
    fn flush(&mut self, now: Millis) {
        while let Some(call) = self.pending.pop_front() {
            self.handle_call(call, now);
        }
    }

    fn fail_waiting(&mut self, session: &SessionId, why: &str) {
        let calls: Vec<AgentCall> = self
            .sessions
            .get_mut(session)
            .map(|s| s.waiting.drain(..).collect())
            .unwrap_or_default();
        for call in calls {
            if let Some(i) = host_core::unserved(call) {
                self.input(with_reason(i, why));
            }
        }
    }

    fn on_line(&mut self, line: &[u8], now: Millis) {
        let Ok(v) = serde_json::from_slice::<Value>(line) else {
            self.skipped += 1;
            return;
        };
        let method = v.get("method").and_then(Value::as_str).map(str::to_owned);
        match (method, v.get("id").cloned()) {
            (Some(m), Some(id)) => self.on_request(&m, id, v.get("params"), now),
            (Some(m), None) => self.on_notification(&m, v.get("params"), now),
            (None, Some(id)) => {
                let Some(n) = id.as_u64() else {
                    self.skipped += 1;
                    return;
                };
                let result = match (v.get("result"), v.get("error")) {
                    (_, Some(e)) => Err(e.clone()),
                    (Some(r), None) => Ok(r.clone()),
                    (None, None) => Ok(Value::Null),
                };
                self.on_response(n, result, now);
            }
            (None, None) => self.skipped += 1,
        }
    }

    fn on_response(&mut self, id: u64, result: Result<Value, Value>, now: Millis) {
        let Some(asked) = self.asked.remove(&id) else {
            // An answer for a request of an earlier process, or none of ours.
            self.skipped += 1;
            return;
        };
        match asked {
            Asked::Initialize => match result.ok().and_then(|r| {
                serde_json::from_value::<InitializeResponse>(r.clone())
                    .ok()
                    .map(|t| (t, r))
            }) {
                Some((init, raw)) => {
                    self.conn = Conn::Ready;
                    self.open_deadline = None;
                    self.load_session = init.agent_capabilities.load_session;
                    self.resume_session = raw
                        .pointer("/agentCapabilities/sessionCapabilities/resume")
                        .is_some_and(|r| !r.is_null());
                    self.agent_name = init.agent_info.map(|i| i.name);
                    let waiting: Vec<SessionId> = self
                        .sessions
                        .iter()
                        .filter(|(_, s)| !s.waiting.is_empty())
                        .map(|(k, _)| k.clone())
                        .collect();
                    for s in waiting {
                        self.open(&s, now);
                    }
                }
                None => {
                    self.out.push_back(AgentEffect::Kill {
                        process: self.process,
                    });
                }
            },
            Asked::Open { session, load } => {
                self.open_deadline = None;
                let replay = self
                    .sessions
                    .get_mut(&session)
                    .and_then(|s| s.replay.take());
                match result {
                    Ok(r) => {
                        let acp = if load {
                            self.sessions.get(&session).and_then(|s| s.acp.clone())
                        } else {
                            serde_json::from_value::<NewSessionResponse>(r)
                                .ok()
                                .map(|n| n.session_id.0.to_string())
                                .or_else(|| self.sessions.get(&session).and_then(|s| s.acp.clone()))
                        };
                        let Some(acp) = acp else {
                            self.opened_failed(&session, "the agent named no session");
                            return;
                        };
                        self.by_acp.insert(acp.clone(), session.clone());
                        match replay {
                            Some(mut p) => {
                                let turns = p.turns();
                                self.history.replace(&session, &acp, p.take_rows());
                                if let Some(s) = self.sessions.get_mut(&session) {
                                    s.projector = Projector::new(turns);
                                }
                            }
                            None if !self.history.known(&session) => {
                                self.history.begin(&session, &acp);
                            }
                            None => {}
                        }
                        if let Some(s) = self.sessions.get_mut(&session) {
                            s.acp = Some(acp);
                            s.opening = false;
                            s.open = true;
                        }
                        self.drain_waiting(&session);
                    }
                    Err(e) => {
                        let why = format!("the agent could not open the session: {}", words(&e));
                        self.opened_failed(&session, &why);
                    }
                }
            }
            Asked::Prompt { session } => match result {
                Ok(r) => {
                    self.prove(&session, now);
                    let outcome = match serde_json::from_value::<PromptResponse>(r) {
                        Ok(p) => match p.stop_reason {
                            StopReason::Cancelled => RunEventKind::Aborted,
                            StopReason::Refusal => RunEventKind::Failed,
                            _ => RunEventKind::Completed,
                        },
                        Err(_) => RunEventKind::Completed,
                    };
                    self.end_turn(&session, outcome, true);
                }
                Err(e) => {
                    let Some(t) = self.turn(&session) else {
                        return;
                    };
                    if !t.answered {
                        let (attempt, code) = (t.attempt, e.get("code").and_then(Value::as_i64));
                        let error = words(&e);
                        let refused = code.is_some_and(|c| REFUSED.contains(&c));
                        let result = if refused {
                            SendResult::ProvenUnadmitted { error }
                        } else {
                            SendResult::AdmissionUncertain { error }
                        };
                        self.input(AgentInput::SendResult { attempt, result });
                        if refused {
                            // Nothing ran: no run to end, the user row goes.
                            if let Some(s) = self.sessions.get_mut(&session) {
                                s.turn = None;
                                s.projector.take_rows();
                            }
                            self.drain_waiting(&session);
                            return;
                        }
                    }
                    if let Some(t) = self.turn_mut(&session) {
                        t.answered = true;
                    }
                    let aborted = self.turn(&session).is_some_and(|t| !t.stops.is_empty());
                    let outcome = if aborted {
                        RunEventKind::Aborted
                    } else {
                        RunEventKind::Failed
                    };
                    self.end_turn(&session, outcome, false);
                }
            },
        }
    }

    fn opened_failed(&mut self, session: &SessionId, why: &str) {
        if let Some(s) = self.sessions.get_mut(session) {
            s.opening = false;
            s.replay = None;
        }
        self.fail_waiting(session, why);
    }

    fn on_notification(&mut self, method: &str, params: Option<&Value>, now: Millis) {
        if method != "session/update" {
            self.skipped += 1;
            return;
        }
        let Some(n) =
            params.and_then(|p| serde_json::from_value::<SessionNotification>(p.clone()).ok())
        else {
            self.skipped += 1;
            return;
        };
        let Some(session) = self.by_acp.get(n.session_id.0.as_ref()).cloned() else {
            self.skipped += 1;
            return;
        };
        let Some(s) = self.sessions.get_mut(&session) else {
            return;
        };
        if let Some(replay) = s.replay.as_mut() {
            // The replay of `session/load`: history, never live output.
            if replay.update(&n.update, false, now) == Step::Skipped {
                self.skipped += 1;
            }
            return;
        }
        let Some(run) = s.turn.as_ref().map(|t| t.run.clone()) else {
            // Between turns: nothing the host asked for is running.
            self.skipped += 1;
            return;
        };
        let conversation = matches!(
            n.update,
            SessionUpdate::AgentMessageChunk(_)
                | SessionUpdate::AgentThoughtChunk(_)
                | SessionUpdate::ToolCall(_)
                | SessionUpdate::ToolCallUpdate(_)
                | SessionUpdate::Plan(_)
                | SessionUpdate::UserMessageChunk(_)
        );
        match s.projector.update(&n.update, true, now) {
            Step::Row(key) => {
                let rows: Vec<_> = s.projector.row(&key).cloned().into_iter().collect();
                if conversation {
                    self.prove(&session, now);
                }
                self.rows(&session, &run, rows);
            }
            Step::Skipped => {
                if conversation {
                    self.prove(&session, now);
                } else {
                    self.skipped += 1;
                }
            }
        }
    }

    fn on_request(&mut self, method: &str, id: Value, params: Option<&Value>, _now: Millis) {
        if method != "session/request_permission" {
            self.write(
                &json!({ "jsonrpc": "2.0", "id": id,
                    "error": { "code": -32601, "message": format!("method not found: {method}") } }),
                Writing::Other,
            );
            return;
        }
        let parsed =
            params.and_then(|p| serde_json::from_value::<RequestPermissionRequest>(p.clone()).ok());
        let session = parsed
            .as_ref()
            .and_then(|r| self.by_acp.get(r.session_id.0.as_ref()).cloned());
        let (Some(r), Some(session)) = (parsed, session) else {
            self.write(
                &json!({ "jsonrpc": "2.0", "id": id,
                    "error": { "code": -32602, "message": "invalid params: not a permission request of a session the host serves" } }),
                Writing::Other,
            );
            return;
        };
        let request_id = match &id {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let turn = self.turn(&session).map(|t| (t.run.clone(), t.prompt));
        let kind = r.tool_call.fields.kind.unwrap_or_default();
        let title = r.tool_call.fields.title.clone().unwrap_or_default();
        let summary = match (kind, title.is_empty()) {
            (ToolKind::Other, true) => {
                format!("{} ({})", r.tool_call.tool_call_id.0, kind_word(kind))
            }
            (ToolKind::Other, false) => title,
            (_, true) => kind_word(kind),
            (_, false) => title,
        };
        let mut allowed = Vec::new();
        for (d, k) in [
            (Decision::Accept, PermissionOptionKind::AllowOnce),
            (
                Decision::AcceptForSession,
                PermissionOptionKind::AllowAlways,
            ),
        ] {
            if r.options.iter().any(|o| o.kind == k) {
                allowed.push(d);
            }
        }
        if r.options.iter().any(|o| {
            matches!(
                o.kind,
                PermissionOptionKind::RejectOnce | PermissionOptionKind::RejectAlways
            )
        }) {
            allowed.push(Decision::Decline);
        }
        allowed.push(Decision::Cancel);
        let request = ApprovalRequest {
            request_id: request_id.clone(),
            thread_id: r.session_id.0.to_string(),
            turn_id: turn
                .as_ref()
                .map_or_else(String::new, |(_, p)| format!("prompt-{p}")),
            item_id: r.tool_call.tool_call_id.0.to_string(),
            kind: match kind {
                ToolKind::Execute => ApprovalKind::CommandExecution,
                ToolKind::Edit | ToolKind::Delete | ToolKind::Move => ApprovalKind::FileChange,
                _ => ApprovalKind::Permissions,
            },
            allowed,
        };
        self.permissions.insert(
            request_id,
            Permission {
                id,
                request: request.clone(),
                options: r.options,
            },
        );
        self.input(AgentInput::ApprovalAsked {
            session: session.clone(),
            target: TargetId::main(&session),
            run: turn.map(|(run, _)| run),
            request,
            summary,
        });
    }

    fn process_gone(&mut self, reason: &str) {
        self.conn = Conn::Down;
        self.open_deadline = None;
        self.asked.clear();
        self.writes.clear();
        let sessions: Vec<SessionId> = self.sessions.keys().cloned().collect();
        for session in sessions {
            let why = format!("the agent's process ended: {reason}");
            let turn = self.sessions.get_mut(&session).and_then(|s| {
                s.open = false;
                s.opening = false;
                s.replay = None;
                s.turn
                    .as_ref()
                    .map(|t| (t.answered, t.attempt, !t.stops.is_empty()))
            });
            if let Some((answered, attempt, stopped)) = turn {
                if !answered {
                    self.input(AgentInput::SendResult {
                        attempt,
                        result: SendResult::AdmissionUncertain { error: why.clone() },
                    });
                }
                let outcome = if stopped {
                    RunEventKind::Aborted
                } else {
                    RunEventKind::Failed
                };
                self.end_turn(&session, outcome, false);
            }
            self.fail_waiting(&session, &why);
        }
        // Cards the agent can no longer take: their decision would reach nobody.
        self.permissions.clear();
    }
}

/// The decision's option, and what the agent takes it as.
fn option_for(
    options: &[PermissionOption],
    decision: Decision,
) -> Option<(&PermissionOption, ApprovalResult)> {
    let find = |k: PermissionOptionKind| options.iter().find(|o| o.kind == k);
    match decision {
        Decision::Accept => {
            find(PermissionOptionKind::AllowOnce).map(|o| (o, ApprovalResult::Accepted))
        }
        Decision::AcceptForSession | Decision::AcceptBroadly => {
            find(PermissionOptionKind::AllowAlways).map(|o| (o, ApprovalResult::AcceptedForSession))
        }
        Decision::Decline => find(PermissionOptionKind::RejectOnce)
            .or_else(|| find(PermissionOptionKind::RejectAlways))
            .map(|o| (o, ApprovalResult::Declined)),
        _ => None,
    }
}

fn to_value<T: serde::Serialize>(t: &T) -> Value {
    // The protocol's own types always serialize.
    serde_json::to_value(t).unwrap_or(Value::Null)
}

fn words(e: &Value) -> String {
    let message = e.get("message").and_then(Value::as_str).unwrap_or("error");
    match e.pointer("/data/message").and_then(Value::as_str) {
        Some(d) => format!("{message}: {d}"),
        None => message.to_owned(),
    }
}

fn with_reason(i: AgentInput, why: &str) -> AgentInput {
    match i {
        AgentInput::SendResult {
            attempt,
            result: SendResult::ProvenUnadmitted { .. },
        } => AgentInput::SendResult {
            attempt,
            result: SendResult::ProvenUnadmitted { error: why.into() },
        },
        other => other,
    }
}

impl Agent for AcpAgent {
    fn capabilities(&self) -> Capabilities {
        Capabilities::acp()
    }

    fn serves(&self, session: &SessionId) -> bool {
        self.sessions.contains_key(session)
    }

    fn handle_call(&mut self, call: AgentCall, now: Millis) {
        let session = call.session().clone();
        let Some(s) = self.sessions.get_mut(&session) else {
            if let Some(i) = host_core::unserved(call) {
                self.input(i);
            }
            return;
        };
        // A steer is refused at once (ACP v1 has none); only a start waits.
        let is_send =
            matches!(&call, AgentCall::Send(r) if matches!(r.kind, SendKind::Start { .. }));
        if !is_send || (self.conn == Conn::Ready && s.open && s.turn.is_none()) {
            self.call(call, now);
            self.flush(now);
            return;
        }
        // A send waits for the process, the session's opening, or the end of the turn
        // that runs (custody asks for no steer, ACP has none: this is a start that
        // overtook the end of the last run).
        s.waiting.push_back(call);
        let open = s.open;
        match self.conn {
            Conn::Down => self.start(now),
            Conn::Initializing => {}
            Conn::Ready if !open => self.open(&session, now),
            Conn::Ready => {}
        }
        self.flush(now);
    }

    fn handle_line(&mut self, process: ProcessId, line: &[u8], now: Millis) {
        if process != self.process || self.conn == Conn::Down {
            return;
        }
        self.on_line(line, now);
        self.flush(now);
    }

    fn handle_line_too_long(&mut self, process: ProcessId, _now: Millis) {
        if process == self.process {
            self.skipped += 1;
        }
    }

    fn handle_exit(&mut self, process: ProcessId, reason: String, now: Millis) {
        if process != self.process || self.conn == Conn::Down {
            return;
        }
        self.process_gone(&reason);
        self.flush(now);
    }

    fn handle_written(
        &mut self,
        process: ProcessId,
        write: WriteId,
        result: Result<(), WriteFailure>,
        now: Millis,
    ) {
        if process != self.process {
            return;
        }
        match (self.writes.remove(&write), result) {
            (Some(Writing::Prompt(session)), Err(f)) => {
                let Some(t) = self.turn(&session) else {
                    return;
                };
                if t.write != Some(write) || t.answered {
                    return;
                }
                let attempt = t.attempt;
                let prompt = t.prompt;
                match f {
                    WriteFailure::NotWritten(e) => {
                        self.asked.remove(&prompt);
                        self.input(AgentInput::SendResult {
                            attempt,
                            result: SendResult::ProvenUnadmitted { error: e },
                        });
                        if let Some(s) = self.sessions.get_mut(&session) {
                            s.turn = None;
                            s.projector.take_rows();
                        }
                    }
                    WriteFailure::Broken(e) => {
                        self.input(AgentInput::SendResult {
                            attempt,
                            result: SendResult::AdmissionUncertain { error: e },
                        });
                        if let Some(t) = self.turn_mut(&session) {
                            t.answered = true;
                        }
                        self.end_turn(&session, RunEventKind::Failed, false);
                    }
                    _ => {}
                }
            }
            (Some(Writing::Prompt(session)), Ok(())) => {
                if let Some(t) = self.turn_mut(&session) {
                    if t.write == Some(write) {
                        t.write = None;
                    }
                }
            }
            (Some(Writing::Answer { request_id, result }), r) => {
                let Some(p) = self.permissions.remove(&request_id) else {
                    return;
                };
                let asked = p.request.clone();
                let result = match r {
                    Ok(()) => Ok(result),
                    Err(e) => {
                        // The agent did not get the decision: the card stays pending.
                        self.permissions.insert(request_id, p);
                        Err(e.to_string())
                    }
                };
                self.input(AgentInput::ApprovalResolved {
                    request_id: asked.request_id,
                    thread_id: asked.thread_id,
                    turn_id: asked.turn_id,
                    item_id: asked.item_id,
                    result,
                });
            }
            _ => {}
        }
        self.flush(now);
    }

    fn handle_file(&mut self, _: ReadId, _: Result<Vec<u8>, FileError>, _: Millis) {}

    fn poll_effect(&mut self) -> Option<AgentEffect> {
        self.out.pop_front()
    }

    fn poll_timeout(&self) -> Option<Millis> {
        let turns = self.sessions.values().filter_map(|s| s.turn.as_ref());
        let mut at = self.open_deadline;
        for t in turns {
            for d in [t.deadline, t.stop_deadline].into_iter().flatten() {
                at = Some(at.map_or(d, |a| a.min(d)));
            }
        }
        at
    }

    fn handle_timeout(&mut self, now: Millis) {
        if self.open_deadline.is_some_and(|d| d <= now) {
            self.open_deadline = None;
            self.out.push_back(AgentEffect::Kill {
                process: self.process,
            });
            self.process_gone("no answer to initialize or to opening a session in 30 s");
        }
        let sessions: Vec<SessionId> = self.sessions.keys().cloned().collect();
        for session in sessions {
            let Some(t) = self.turn_mut(&session) else {
                continue;
            };
            if t.deadline.is_some_and(|d| d <= now) {
                t.deadline = None;
                if !t.answered {
                    t.answered = true;
                    let attempt = t.attempt;
                    self.input(AgentInput::SendResult {
                        attempt,
                        result: SendResult::AdmissionUncertain {
                            error: "the agent said nothing about the message in 30 s".into(),
                        },
                    });
                }
            }
            let Some(t) = self.turn_mut(&session) else {
                continue;
            };
            if t.stop_deadline.is_some_and(|d| d <= now) {
                t.stop_deadline = None;
                // The agent did not end the turn: its process goes, which ends the run.
                self.out.push_back(AgentEffect::Kill {
                    process: self.process,
                });
            }
        }
        self.flush(now);
    }
}
