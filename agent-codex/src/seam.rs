//! Codex behind the host's agent seam ([`host_core::Agent`]): `codex app-server` as one
//! process serving every session given to it, driven without blocking and without IO.
//!
//! [`CodexAgent`] turns each [`AgentCall`] into JSON-RPC lines ([`crate::codec`]) and
//! each line Codex prints into [`AgentInput`]s for the host. The runtime that carries
//! out its [`AgentEffect`]s starts the process, writes the lines and reports what
//! became of them.
//!
//! | host call | what Codex is sent | what the host gets |
//! |---|---|---|
//! | send, start | `thread/start` (or `thread/resume` after a restart or after Codex closed the thread) when the session has no loaded thread, then `turn/start` with the operation as `clientUserMessageId` | [`AgentInput::SendResult`] through the one table of [`crate::send`]; the echo later proves delivery ([`AgentInput::DeliveryProof`]) |
//! | send, steer | `turn/steer` with the run's turn as `expectedTurnId` | the same |
//! | history read | `thread/items/list`, newest first, [`HISTORY_PAGE`] items a page, searched for the client ID (`thread/read` with its turns on a Codex without it) | [`AgentInput::HistoryRead`]: found, missing once the last page is read, `Unreadable` when a read fails or [`HISTORY_READ_PAGES`] pages pass |
//! | stop | `turn/interrupt`, then the turn's end | [`AgentInput::StopResult`] with the steers the interruption proved undelivered as untaken; a turn Codex calls not running (`-32600`: no active turn, another turn's ID, thread not found) is stopped, not failed, and its run ends with its `turn/completed` or [`END_GRACE`] later; a stop that comes while another of the same run waits joins it (Codex is asked once, every stop gets the one result) |
//! | take back | nothing: Codex cannot take input back out of a running turn | `NotDetached` |
//! | approval decision | the answer to Codex's request, once | [`AgentInput::ApprovalResolved`]; a request Codex already settled (`serverRequest/resolved`) is refused, never answered as taken |
//! | clear thread link | nothing; the next send opens a fresh thread | |
//!
//! What Codex says on its own: item notifications become [`AgentInput::Rows`] of the
//! session's main target ([`crate::project::Projector`]); a turn's end is
//! [`AgentInput::RunEnded`] for the run it belongs to; an approval request is
//! [`AgentInput::ApprovalAsked`]; the process's end is uncertain for every send that
//! waits and ends every run (a later call starts Codex again). `thread/closed` (Codex
//! 0.169 unloads a thread nobody subscribes to about a minute after it went idle; a
//! `turn/start` on it is refused, "thread not found"), or the `thread/status/changed`
//! with `notLoaded` just before it, marks the session's thread not
//! loaded, so its next send resumes it first; every run still open on the thread ends
//! (aborted when a stop waits for it, failed otherwise: no turn end will come), its
//! stops are answered, and its open approvals close as settled elsewhere.
//!
//! Every request waits at most the reply deadline ([`REPLY_DEADLINE`], the seed's 30 s)
//! from its write; a send that passes it is uncertain. A `thread/start` or
//! `thread/resume` that passes it fails only the sends that wait for that session's
//! thread, as proven unadmitted (no `turn/start` or `turn/steer` of theirs was
//! written); the one process and the other sessions go on. Its late answer finds
//! nothing waiting and is dropped: no thread is recorded for a request given up, and
//! the session's next send opens its thread again. Only an `initialize` that passes the
//! deadline takes Codex down.

use outbox_core::adapter::{ReadHistoryRequest, StopRequest, TakeBackRequest};
use std::collections::{BTreeMap, VecDeque};

use crate::items::ThreadLink;
use host_core::{
    Agent, AgentCall, AgentEffect, AgentInput, FileError, ProcessId, ProcessSpec, ReadId,
    WriteFailure, WriteId,
};
use outbox_core::adapter::{
    Capabilities, HistoryRead, SendKind, SendRequest, SendResult, StopResult, TakeBackResult,
};
use overlay_core::live::RunEventKind;
use overlay_core::store::StoredBlock;
use timeline_core::key::{OperationId, RunId, SessionId, TargetId};
use timeline_core::rows::{ApprovalKind, ApprovalRequest, ApprovalResult};
use timeline_core::time::Millis;

use crate::codec::{allowed_decisions, Codec, Incoming, Response, RpcError};
use crate::project::{Projected, Projector};
use crate::proof::{self, DeliveryWatch, Verdict};
use crate::protocol::{
    ApprovalAsk, ApprovalMethod, ClientRequest, RequestId, ServerNotification, ServerRequest,
    TurnStatus, UserInput,
};
use crate::send::{self, SendFailure, SendMethod};

/// The reply deadline of every request, in milliseconds (OB-09: "the 30 s reply
/// deadline").
pub const REPLY_DEADLINE: Millis = Millis(30_000);

/// The JSON-RPC error code Codex answers `turn/interrupt` with when no turn runs.
const INVALID_REQUEST: i64 = -32600;

/// Ended runs kept (with what their messages proved) for a late stop; older ones are
/// forgotten, so the agent's memory follows the runs in flight, not the history.
pub const ENDED_KEPT: usize = 64;

/// Items per `thread/items/list` page of a history read (Codex's most).
pub const HISTORY_PAGE: u32 = 100;

/// Pages a history read goes through, newest first, before it answers `Unreadable`
/// (the operation would be older than 10,000 items: not known either way).
pub const HISTORY_READ_PAGES: u32 = 100;

/// The JSON-RPC code of a method the server does not have.
const METHOD_NOT_FOUND: i64 = -32601;

/// How long a run Codex called not running waits for its `turn/completed`.
pub const END_GRACE: Millis = Millis(5_000);

/// True when an interrupt's refusal says the turn is not running: Codex 0.169 answers
/// `-32600` with "no active turn to interrupt" (it ended), "expected active turn id X but
/// found Y" (another turn runs) or "thread not found: X" (the thread is not loaded).
fn not_running(e: &RpcError) -> bool {
    e.code == INVALID_REQUEST
        && [
            "no active turn",
            "expected active turn id",
            "thread not found",
        ]
        .iter()
        .any(|m| e.message.contains(m))
}

/// How the connection stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Conn {
    /// No process (never started, or it ended).
    Down,
    /// Started; `initialize` written, its answer awaited.
    Initializing,
    /// `initialized` sent: requests may go.
    Ready,
}

/// A session's thread.
struct SessionThread {
    /// The thread, once known.
    thread_id: Option<String>,
    /// True when the current process has the thread loaded (started or resumed).
    loaded: bool,
    /// The `thread/start` a fresh thread opens with.
    start: ClientRequest,
    /// The request opening the thread, while it waits.
    opening: Option<u64>,
    /// Calls waiting for the thread to open.
    queued: Vec<(AgentCall, Millis)>,
    projector: Projector,
    /// The thread, shared with the history source that reads it.
    link: ThreadLink,
}

impl SessionThread {
    fn set_thread(&mut self, thread: Option<String>) {
        self.link.set(thread.clone());
        self.thread_id = thread;
    }
}

impl std::fmt::Debug for SessionThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionThread")
            .field("thread_id", &self.thread_id)
            .field("loaded", &self.loaded)
            .field("opening", &self.opening)
            .field("queued", &self.queued.len())
            .finish_non_exhaustive()
    }
}

/// What a request waits for.
#[derive(Debug)]
enum Pending {
    Initialize,
    OpenThread {
        session: SessionId,
    },
    Send {
        request: Box<SendRequest>,
        method: SendMethod,
        thread_id: String,
    },
    Read {
        attempt: outbox_core::AttemptId,
        operation_id: OperationId,
        thread_id: String,
        /// Pages of `thread/items/list` read so far (`None`: the `thread/read` of a
        /// Codex without it).
        pages: Option<u32>,
    },
    /// The run's `turn/interrupt`; the stops it answers wait in the run
    /// ([`RunState::stop`]).
    Interrupt {
        run: RunId,
    },
}

#[derive(Debug)]
struct Waiting {
    what: Pending,
    /// The reply deadline; `None` until the line is written.
    deadline: Option<Millis>,
}

#[derive(Debug)]
struct RunState {
    session: SessionId,
    thread_id: String,
    turn_id: String,
    ended: bool,
    /// Operations this run accepted.
    accepted: Vec<OperationId>,
    /// The stops of this run waiting for their answer (one interrupt for all).
    stop: Option<Stopping>,
    /// Codex said the turn is not running: it ends by then if its end is not read.
    end_by: Option<Millis>,
}

/// The stops of a run that wait, answered together with one result: a stop that comes
/// while another waits joins it, and Codex is asked to interrupt the turn once.
#[derive(Debug)]
struct Stopping {
    /// Every stop attempt waiting, oldest first.
    attempts: Vec<outbox_core::AttemptId>,
    /// `None` while the interrupt waits for Codex's answer (its own reply deadline
    /// runs); then the deadline of the turn's end.
    until: Option<Millis>,
}

/// An approval Codex asked, until it is answered or settled.
#[derive(Debug)]
struct OpenApproval {
    id: RequestId,
    request: ApprovalRequest,
}

/// Codex behind the agent seam. See the module doc.
#[derive(Debug)]
pub struct CodexAgent {
    spec: ProcessSpec,
    client: (String, String),
    process: ProcessId,
    conn: Conn,
    codec: Codec,
    sessions: BTreeMap<SessionId, SessionThread>,
    /// The session of each thread Codex named, so a notification finds its session in
    /// O(log n) whatever the number of sessions; checked against `sessions` on use (a
    /// session that went on in a fresh thread leaves its old entry behind, removed when
    /// it is met).
    threads: BTreeMap<String, SessionId>,
    waiting: BTreeMap<u64, Waiting>,
    /// The request each write carries.
    writes: BTreeMap<WriteId, u64>,
    next_write: u64,
    /// Calls that wait for the connection.
    parked: Vec<(AgentCall, Millis)>,
    runs: BTreeMap<RunId, RunState>,
    /// Runs that ended, oldest first (at most [`ENDED_KEPT`]).
    ended: VecDeque<RunId>,
    watches: Vec<(OperationId, SessionId, DeliveryWatch)>,
    settled: BTreeMap<OperationId, Verdict>,
    approvals: BTreeMap<String, OpenApproval>,
    /// Sends of a process that ended before their write was reported, by that write.
    orphans: BTreeMap<(ProcessId, WriteId), (Box<SendRequest>, SendMethod)>,
    out: VecDeque<AgentEffect>,
    exits: u64,
}

/// A thread as Codex opens it for a session.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ThreadConfig {
    /// The working directory.
    pub cwd: Option<String>,
    /// `untrusted`, `on-failure`, `on-request`, `never`.
    pub approval_policy: Option<String>,
    /// `read-only`, `workspace-write`, `danger-full-access`.
    pub sandbox: Option<String>,
    /// The thread to resume instead of starting one (a session that has one).
    pub resume: Option<String>,
    /// The model (Codex's `config.toml` default when `None`).
    pub model: Option<String>,
    /// The model provider, by its `config.toml` name (the default when `None`).
    pub model_provider: Option<String>,
}

impl ThreadConfig {
    /// A new thread in `cwd`, with Codex's defaults otherwise.
    pub fn new(cwd: impl Into<String>) -> ThreadConfig {
        ThreadConfig {
            cwd: Some(cwd.into()),
            approval_policy: None,
            sandbox: None,
            resume: None,
            model: None,
            model_provider: None,
        }
    }

    /// Sets the approval policy.
    #[must_use]
    pub fn approval_policy(mut self, policy: impl Into<String>) -> ThreadConfig {
        self.approval_policy = Some(policy.into());
        self
    }

    /// Sets the sandbox.
    #[must_use]
    pub fn sandbox(mut self, sandbox: impl Into<String>) -> ThreadConfig {
        self.sandbox = Some(sandbox.into());
        self
    }

    /// Sets the model and, when `Some`, its provider (by its `config.toml` name).
    #[must_use]
    pub fn model(mut self, model: impl Into<String>, provider: Option<&str>) -> ThreadConfig {
        self.model = Some(model.into());
        self.model_provider = provider.map(str::to_owned);
        self
    }

    /// Resumes `thread_id` instead of starting a thread.
    #[must_use]
    pub fn resume(mut self, thread_id: impl Into<String>) -> ThreadConfig {
        self.resume = Some(thread_id.into());
        self
    }
}

/// The inputs of a message: its text (the prompt text when it has one) and its image
/// attachments.
pub(crate) fn inputs(request: &SendRequest) -> Vec<UserInput> {
    let text = request
        .request
        .prompt_text
        .clone()
        .unwrap_or_else(|| request.request.user_text.clone());
    let mut inputs = vec![UserInput::Text(text)];
    inputs.extend(
        request
            .request
            .attachments
            .iter()
            .filter(|a| a.kind == "image")
            .map(|a| UserInput::LocalImage(a.path.clone())),
    );
    inputs
}

fn outcome(status: &TurnStatus) -> RunEventKind {
    match status {
        TurnStatus::Completed | TurnStatus::InProgress => RunEventKind::Completed,
        TurnStatus::Interrupted => RunEventKind::Aborted,
        TurnStatus::Failed | TurnStatus::Other(_) => RunEventKind::Failed,
    }
}

fn approval_request(ask: &ApprovalAsk) -> ApprovalRequest {
    ApprovalRequest {
        request_id: ask.request_id.to_string(),
        thread_id: ask.thread_id.clone(),
        turn_id: ask.turn_id.clone(),
        item_id: ask.item_id.clone(),
        kind: match ask.method {
            ApprovalMethod::CommandExecution => ApprovalKind::CommandExecution,
            ApprovalMethod::FileChange => ApprovalKind::FileChange,
        },
        allowed: allowed_decisions(ask),
    }
}

impl CodexAgent {
    /// Codex started as `spec` (`codex app-server`), introducing itself as client `name`
    /// `version`. Nothing starts until the first call.
    pub fn new(spec: ProcessSpec, name: &str, version: &str) -> CodexAgent {
        CodexAgent {
            spec,
            client: (name.to_owned(), version.to_owned()),
            process: ProcessId(0),
            conn: Conn::Down,
            codec: Codec::new(),
            sessions: BTreeMap::new(),
            threads: BTreeMap::new(),
            waiting: BTreeMap::new(),
            writes: BTreeMap::new(),
            next_write: 1,
            parked: Vec::new(),
            runs: BTreeMap::new(),
            ended: VecDeque::new(),
            watches: Vec::new(),
            settled: BTreeMap::new(),
            approvals: BTreeMap::new(),
            orphans: BTreeMap::new(),
            out: VecDeque::new(),
            exits: 0,
        }
    }

    /// Serves `session` on the thread `thread` describes (opened at its first send).
    pub fn add_session(&mut self, session: &SessionId, thread: ThreadConfig) {
        let start = ClientRequest::ThreadStart {
            cwd: thread.cwd,
            approval_policy: thread.approval_policy,
            sandbox: thread.sandbox,
            model: thread.model,
            model_provider: thread.model_provider,
        };
        if let Some(id) = &thread.resume {
            self.threads.insert(id.clone(), session.clone());
        }
        let link = ThreadLink::default();
        link.set(thread.resume.clone());
        self.sessions.insert(
            session.clone(),
            SessionThread {
                thread_id: thread.resume,
                loaded: false,
                start,
                opening: None,
                queued: Vec::new(),
                projector: Projector::new(session.as_str(), None, 1),
                link,
            },
        );
    }

    /// The thread of `session`, once Codex named it.
    pub fn thread_of(&self, session: &SessionId) -> Option<&str> {
        self.sessions.get(session)?.thread_id.as_deref()
    }

    /// The thread of `session` as a link that follows it (a new thread after the old
    /// one was lost): what [`crate::items::ItemsSource`] reads the history of.
    pub fn thread_link(&self, session: &SessionId) -> Option<ThreadLink> {
        Some(self.sessions.get(session)?.link.clone())
    }

    /// The process Codex runs as now, if one runs.
    pub fn process(&self) -> Option<ProcessId> {
        (self.conn != Conn::Down).then_some(self.process)
    }

    /// What the codec skipped so far, and the Codex version.
    pub fn diagnostics(&self) -> &crate::diag::Diagnostics {
        self.codec.diagnostics()
    }

    fn input(&mut self, input: AgentInput) {
        self.out.push_back(AgentEffect::Input(input));
    }

    /// Writes `request`; its answer goes to `what`.
    fn request(&mut self, request: &ClientRequest, what: Pending) -> u64 {
        let (id, mut line) = self.codec.request(request);
        if line.last() == Some(&b'\n') {
            line.pop();
        }
        let write = WriteId(self.next_write);
        self.next_write += 1;
        self.writes.insert(write, id);
        self.waiting.insert(
            id,
            Waiting {
                what,
                deadline: None,
            },
        );
        self.out.push_back(AgentEffect::Write {
            process: self.process,
            write,
            line,
        });
        id
    }

    /// A line that needs no answer.
    fn write(&mut self, mut line: Vec<u8>) {
        if line.last() == Some(&b'\n') {
            line.pop();
        }
        let write = WriteId(self.next_write);
        self.next_write += 1;
        self.out.push_back(AgentEffect::Write {
            process: self.process,
            write,
            line,
        });
    }

    fn start_process(&mut self) {
        self.process = ProcessId(self.exits + 1);
        self.codec = Codec::new();
        self.conn = Conn::Initializing;
        self.out.push_back(AgentEffect::Spawn {
            process: self.process,
            spec: self.spec.clone(),
        });
        let init = ClientRequest::Initialize {
            name: self.client.0.clone(),
            version: self.client.1.clone(),
        };
        self.request(&init, Pending::Initialize);
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
                let Some(thread_id) = self.thread_of(&session).map(str::to_owned) else {
                    self.input(AgentInput::HistoryRead {
                        attempt,
                        read: HistoryRead::Unreadable,
                    });
                    return;
                };
                self.read_page(attempt, operation_id, thread_id, None, 0);
            }
            AgentCall::Stop(StopRequest {
                attempt,
                session,
                run,
            }) => self.stop(attempt, &session, run),
            AgentCall::TakeBack(TakeBackRequest { attempt, .. }) => {
                self.input(AgentInput::TakeBack {
                    attempt,
                    result: TakeBackResult::NotDetached {
                        reason: "Codex cannot take accepted input back out of a running turn."
                            .to_owned(),
                    },
                })
            }
            AgentCall::ResolveApproval {
                request, decision, ..
            } => {
                // The request stays open until an allowed decision is written: a refused
                // one may be followed by another.
                let answered = match self.approvals.get(&request.request_id) {
                    None => Err("Codex no longer waits for this decision.".to_owned()),
                    Some(open) => open
                        .request
                        .decide(decision)
                        .map_err(|e| e.to_string())
                        .and_then(|result| {
                            let line = self
                                .codec
                                .answer_approval(&open.id, decision)
                                .map_err(|e| e.to_string())?;
                            Ok((line, result))
                        }),
                };
                if answered.is_ok() {
                    self.approvals.remove(&request.request_id);
                }
                let result = match answered {
                    Ok((line, result)) => {
                        self.write(line);
                        Ok(result)
                    }
                    Err(e) => Err(e),
                };
                self.input(AgentInput::ApprovalResolved {
                    request_id: request.request_id,
                    thread_id: request.thread_id,
                    turn_id: request.turn_id,
                    item_id: request.item_id,
                    result,
                });
            }
            // Codex's tool calls are answered by the codec; none waits for this.
            AgentCall::SessionMessageResult { .. } => {}
            AgentCall::ClearThreadLink { session } => {
                if let Some(s) = self.sessions.get_mut(&session) {
                    s.set_thread(None);
                    s.loaded = false;
                }
            }
            _ => {}
        }
    }

    fn send(&mut self, request: SendRequest, now: Millis) {
        let method = match request.kind {
            SendKind::Start { .. } => SendMethod::TurnStart,
            SendKind::Steer { .. } => SendMethod::TurnSteer,
        };
        let refuse = |me: &mut CodexAgent, reason: String| {
            let result = send::failed(method, &SendFailure::NotWritten { reason });
            me.input(AgentInput::SendResult {
                attempt: request.attempt,
                result,
            });
        };
        if request.rollback_before_send {
            return refuse(
                self,
                "this agent does not roll back a turn (replace latest)".to_owned(),
            );
        }
        let Some(s) = self.sessions.get_mut(&request.session) else {
            let reason = format!("session {} is not served by this agent", request.session);
            return refuse(self, reason);
        };
        if request.fresh_thread {
            s.set_thread(None);
            s.loaded = false;
        }
        if !s.loaded {
            // Open the thread first; the send waits for it.
            s.queued.push((AgentCall::Send(request.clone()), now));
            if s.opening.is_none() {
                let open = match &s.thread_id {
                    Some(thread_id) => ClientRequest::ThreadResume {
                        thread_id: thread_id.clone(),
                    },
                    None => s.start.clone(),
                };
                let session = request.session.clone();
                let id = self.request(&open, Pending::OpenThread { session });
                if let Some(s) = self.sessions.get_mut(&request.session) {
                    s.opening = Some(id);
                }
            }
            return;
        }
        let Some(thread_id) = s.thread_id.clone() else {
            return refuse(self, "the session's thread is not open".to_owned());
        };
        let op = request.operation_id.as_str().to_owned();
        let wire = match &request.kind {
            SendKind::Start { .. } => ClientRequest::TurnStart {
                thread_id: thread_id.clone(),
                client_user_message_id: op.clone(),
                input: inputs(&request),
            },
            SendKind::Steer { run } => {
                let Some(turn) = self
                    .runs
                    .get(run)
                    .filter(|r| !r.ended)
                    .map(|r| r.turn_id.clone())
                else {
                    return refuse(self, format!("run {} has no running turn", run.as_str()));
                };
                ClientRequest::TurnSteer {
                    thread_id: thread_id.clone(),
                    expected_turn_id: turn,
                    client_user_message_id: op.clone(),
                    input: inputs(&request),
                }
            }
        };
        // Watch from before the write: the echo may come before the answer.
        self.watches.push((
            request.operation_id.clone(),
            request.session.clone(),
            DeliveryWatch::new(&op, &thread_id),
        ));
        self.request(
            &wire,
            Pending::Send {
                request: Box::new(request),
                method,
                thread_id,
            },
        );
    }

    /// Asks for the next page of the thread's items, newest first, for a history read.
    fn read_page(
        &mut self,
        attempt: outbox_core::AttemptId,
        operation_id: OperationId,
        thread_id: String,
        cursor: Option<String>,
        pages: u32,
    ) {
        let page = ClientRequest::ThreadItemsList {
            thread_id: thread_id.clone(),
            cursor,
            limit: HISTORY_PAGE,
            newest_first: true,
        };
        self.request(
            &page,
            Pending::Read {
                attempt,
                operation_id,
                thread_id,
                pages: Some(pages),
            },
        );
    }

    fn stop(&mut self, attempt: outbox_core::AttemptId, session: &SessionId, run: RunId) {
        let Some(r) = self.runs.get(&run).filter(|r| &r.session == session) else {
            self.input(AgentInput::StopResult {
                attempt,
                result: StopResult::Failed {
                    error: format!("run {} is not a run of this agent", run.as_str()),
                },
            });
            return;
        };
        if r.ended {
            let untaken = self.untaken(&run);
            self.input(AgentInput::StopResult {
                attempt,
                result: StopResult::Stopped { untaken },
            });
            return;
        }
        let interrupt = ClientRequest::TurnInterrupt {
            thread_id: r.thread_id.clone(),
            turn_id: r.turn_id.clone(),
        };
        let Some(r) = self.runs.get_mut(&run) else {
            return;
        };
        // A stop while another of the run waits joins it: one interrupt, one result
        // for both.
        if let Some(waiting) = r.stop.as_mut() {
            waiting.attempts.push(attempt);
            return;
        }
        r.stop = Some(Stopping {
            attempts: vec![attempt],
            until: None,
        });
        self.request(&interrupt, Pending::Interrupt { run });
    }

    /// Answers every stop of `run` that waits with `result`.
    fn answer_stops(&mut self, run: &RunId, result: &StopResult) {
        let Some(stopping) = self.runs.get_mut(run).and_then(|r| r.stop.take()) else {
            return;
        };
        for attempt in stopping.attempts {
            self.input(AgentInput::StopResult {
                attempt,
                result: result.clone(),
            });
        }
    }

    /// The run's operations the interruption proved not delivered. One still waiting
    /// (the process ended first) is not claimed: its history read decides.
    fn untaken(&self, run: &RunId) -> Vec<OperationId> {
        self.runs
            .get(run)
            .map(|r| {
                r.accepted
                    .iter()
                    .filter(|op| {
                        matches!(self.settled.get(*op), Some(Verdict::NotDelivered { .. }))
                    })
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    fn answer(&mut self, id: u64, answer: Result<Response, RpcError>, now: Millis) {
        let Some(waiting) = self.waiting.remove(&id) else {
            return;
        };
        match waiting.what {
            Pending::Initialize => match answer {
                Ok(_) => {
                    let line = self.codec.initialized();
                    self.write(line);
                    self.conn = Conn::Ready;
                    for (call, at) in std::mem::take(&mut self.parked) {
                        self.call(call, at.max(now));
                    }
                }
                Err(e) => {
                    let reason = format!("Codex refused initialize ({}: {})", e.code, e.message);
                    self.out.push_back(AgentEffect::Kill {
                        process: self.process,
                    });
                    self.gone(reason);
                }
            },
            Pending::OpenThread { session } => match answer {
                Ok(Response::ThreadStart { thread } | Response::ThreadResume { thread }) => {
                    let Some(s) = self.sessions.get_mut(&session) else {
                        return;
                    };
                    s.opening = None;
                    let queued = std::mem::take(&mut s.queued);
                    self.threads.insert(thread.id.clone(), session.clone());
                    s.set_thread(Some(thread.id));
                    s.loaded = true;
                    for (call, at) in queued {
                        self.call(call, at.max(now));
                    }
                }
                other => {
                    let why = match other {
                        Err(e) => format!("({}: {})", e.code, e.message),
                        Ok(r) => format!("with {r:?}"),
                    };
                    self.not_opened(&session, &format!("Codex did not open the thread {why}"));
                }
            },
            Pending::Send {
                request,
                method,
                thread_id,
            } => {
                let result = match answer {
                    Ok(Response::TurnStart { turn }) => Ok(turn.id),
                    Ok(Response::TurnSteer { turn_id }) => Ok(turn_id),
                    Ok(other) => Err(SendResult::AdmissionUncertain {
                        error: format!("Codex answered the send with {other:?}."),
                    }),
                    Err(e) => {
                        let result = send::failed(method, &SendFailure::Rpc(e));
                        if matches!(result, SendResult::ProvenUnadmitted { .. }) {
                            // Refused: no echo will come.
                            self.watches.retain(|(o, _, _)| o != &request.operation_id);
                        }
                        Err(result)
                    }
                };
                let result = match result {
                    Err(r) => r,
                    Ok(turn_id) => {
                        let run = match &request.kind {
                            SendKind::Start { run } | SendKind::Steer { run } => run.clone(),
                        };
                        let result = send::accepted(run.clone(), &thread_id, &turn_id, now);
                        if matches!(result, SendResult::Accepted(_)) {
                            self.accepted(&request, run, thread_id, turn_id);
                        }
                        result
                    }
                };
                self.input(AgentInput::SendResult {
                    attempt: request.attempt,
                    result,
                });
            }
            Pending::Read {
                attempt,
                operation_id,
                thread_id,
                pages,
            } => {
                let read = match (answer, pages) {
                    (Ok(Response::ThreadItemsList { items, next_cursor }), Some(pages)) => {
                        let op = operation_id.as_str();
                        let found = items.iter().any(|listed| {
                            matches!(
                                crate::protocol::ThreadItem::from_value(&listed.item),
                                Ok(crate::protocol::ThreadItem::UserMessage { client_id: Some(c), .. })
                                    if c == op
                            )
                        });
                        match next_cursor {
                            _ if found => HistoryRead::Found,
                            None => HistoryRead::Missing,
                            Some(cursor) if pages + 1 < HISTORY_READ_PAGES => {
                                return self.read_page(
                                    attempt,
                                    operation_id,
                                    thread_id,
                                    Some(cursor),
                                    pages + 1,
                                );
                            }
                            // Older than any read goes: not known either way.
                            Some(_) => HistoryRead::Unreadable,
                        }
                    }
                    // A Codex without `thread/items/list`: the thread with its turns.
                    (Err(e), Some(_))
                        if e.code == METHOD_NOT_FOUND && e.message.contains("not supported")
                            || e.code == INVALID_REQUEST
                                && e.message.contains("thread/items/list") =>
                    {
                        let read = ClientRequest::ThreadRead {
                            thread_id: thread_id.clone(),
                            include_turns: true,
                        };
                        self.request(
                            &read,
                            Pending::Read {
                                attempt,
                                operation_id,
                                thread_id,
                                pages: None,
                            },
                        );
                        return;
                    }
                    (Ok(Response::ThreadRead { thread }), None) => {
                        proof::in_thread(&thread, operation_id.as_str())
                    }
                    _ => HistoryRead::Unreadable,
                };
                self.input(AgentInput::HistoryRead { attempt, read });
            }
            Pending::Interrupt { run } => match answer {
                Ok(_) => {
                    // The turn ends with `turn/completed` (interrupted); a run that
                    // ended first answered its stops then.
                    if let Some(stopping) = self.runs.get_mut(&run).and_then(|r| r.stop.as_mut()) {
                        stopping.until = Some(now.saturating_add(REPLY_DEADLINE));
                    }
                }
                // The turn is not running (it ended before the interrupt reached it, or
                // the thread runs another turn, or is not loaded): stopped, not failed.
                // Its `turn/completed` may still be on its way (Codex 0.169 can answer
                // before it): the run ends with it, or after a short grace.
                Err(e) if not_running(&e) => {
                    let untaken = self.untaken(&run);
                    if let Some(r) = self.runs.get_mut(&run) {
                        if !r.ended {
                            r.end_by = Some(now.saturating_add(END_GRACE));
                        }
                    }
                    self.answer_stops(&run, &StopResult::Stopped { untaken });
                }
                Err(e) => self.answer_stops(
                    &run,
                    &StopResult::Failed {
                        error: format!(
                            "Codex refused to interrupt the turn ({}: {}).",
                            e.code, e.message
                        ),
                    },
                ),
            },
        }
    }

    /// The thread of `session` did not open (refused, or no answer in time): the sends
    /// that waited for it are answered; none of them was written (no `turn/start` or
    /// `turn/steer` goes before the thread is open), so none was admitted. The process
    /// and the other sessions are left alone, and the session's next send opens the
    /// thread again.
    fn not_opened(&mut self, session: &SessionId, reason: &str) {
        let Some(s) = self.sessions.get_mut(session) else {
            return;
        };
        s.opening = None;
        for (call, _) in std::mem::take(&mut s.queued) {
            if let AgentCall::Send(request) = call {
                let method = match request.kind {
                    SendKind::Start { .. } => SendMethod::TurnStart,
                    SendKind::Steer { .. } => SendMethod::TurnSteer,
                };
                self.input(AgentInput::SendResult {
                    attempt: request.attempt,
                    result: send::failed(
                        method,
                        &SendFailure::NotWritten {
                            reason: reason.to_owned(),
                        },
                    ),
                });
            }
        }
    }

    fn accepted(&mut self, request: &SendRequest, run: RunId, thread_id: String, turn_id: String) {
        match &request.kind {
            SendKind::Start { .. } => {
                if let Some(s) = self.sessions.get_mut(&request.session) {
                    s.projector.set_run(Some(run.clone()));
                }
                self.runs.insert(
                    run,
                    RunState {
                        session: request.session.clone(),
                        thread_id,
                        turn_id,
                        ended: false,
                        accepted: vec![request.operation_id.clone()],
                        stop: None,
                        end_by: None,
                    },
                );
            }
            SendKind::Steer { .. } => {
                if let Some(r) = self.runs.get_mut(&run) {
                    r.accepted.push(request.operation_id.clone());
                }
            }
        }
    }

    /// Ends `run` once: the host hears of it, a stop waiting for it is answered.
    fn end_run(&mut self, run: &RunId, kind: RunEventKind) {
        let Some(r) = self.runs.get_mut(run) else {
            return;
        };
        if r.ended {
            return;
        }
        r.ended = true;
        let session = r.session.clone();
        let untaken = self.untaken(run);
        self.answer_stops(
            run,
            &StopResult::Stopped {
                untaken: untaken.clone(),
            },
        );
        self.input(AgentInput::RunEnded {
            session,
            run: run.clone(),
            outcome: kind,
            untaken,
        });
        // Keep the last runs that ended (a late stop of one is answered from them);
        // older ones go, with what their messages proved.
        self.ended.push_back(run.clone());
        while self.ended.len() > ENDED_KEPT {
            let Some(old) = self.ended.pop_front() else {
                break;
            };
            if let Some(r) = self.runs.remove(&old) {
                for op in &r.accepted {
                    self.settled.remove(op);
                }
            }
        }
    }

    fn line(&mut self, line: &[u8], now: Millis) {
        let incoming = match self.codec.handle_line(line) {
            Ok(i) => i,
            Err(_) => {
                // Counted by the codec. An answer the codec no longer waits for is
                // unreadable: the request that waited gets it as a failure.
                let gone: Vec<u64> = self
                    .waiting
                    .keys()
                    .copied()
                    .filter(|id| !self.codec.pending().any(|(p, _)| p == *id))
                    .filter(|id| self.waiting.get(id).is_some_and(|w| w.deadline.is_some()))
                    .collect();
                for id in gone {
                    self.answer(
                        id,
                        Err(RpcError {
                            code: 0,
                            message: "Codex answered with a line this version cannot read"
                                .to_owned(),
                        }),
                        now,
                    );
                }
                return;
            }
        };
        match incoming {
            Incoming::Response { id, response } => self.answer(id, Ok(response), now),
            Incoming::Error {
                id: Some(id),
                error,
                ..
            } => self.answer(id, Err(error), now),
            Incoming::Error { .. } | Incoming::Skipped => {}
            Incoming::Notification(n) => self.notification(n, now),
            Incoming::Request { request, reply } => {
                if let Some(reply) = reply {
                    self.write(reply);
                }
                if let ServerRequest::Approval(ask) = request {
                    self.approval(ask);
                }
            }
        }
    }

    fn session_of_thread(&mut self, thread_id: &str) -> Option<SessionId> {
        let session = self.threads.get(thread_id)?;
        let current = self
            .sessions
            .get(session)
            .is_some_and(|t| t.thread_id.as_deref() == Some(thread_id));
        if current {
            return Some(session.clone());
        }
        // The session went on in another thread (or is gone): this one is no one's.
        self.threads.remove(thread_id);
        None
    }

    fn approval(&mut self, ask: ApprovalAsk) {
        let Some(session) = self.session_of_thread(&ask.thread_id) else {
            return;
        };
        let request = approval_request(&ask);
        let summary = ask
            .command
            .clone()
            .or_else(|| ask.reason.clone())
            .unwrap_or_default();
        let run = self
            .runs
            .iter()
            .find(|(_, r)| r.session == session && r.turn_id == ask.turn_id)
            .or_else(|| {
                self.runs
                    .iter()
                    .find(|(_, r)| r.session == session && !r.ended)
            })
            .map(|(id, _)| id.clone());
        self.approvals.insert(
            request.request_id.clone(),
            OpenApproval {
                id: ask.request_id.clone(),
                request: request.clone(),
            },
        );
        self.input(AgentInput::ApprovalAsked {
            target: TargetId::main(&session),
            session,
            run,
            request,
            summary,
        });
    }

    fn notification(&mut self, n: crate::protocol::Notification, now: Millis) {
        // Delivery proofs.
        let mut proofs = Vec::new();
        for (op, session, watch) in &mut self.watches {
            if watch.state() != &Verdict::Pending {
                continue;
            }
            let state = watch.handle(&n.body).clone();
            if state != Verdict::Pending {
                if matches!(state, Verdict::Delivered { .. }) {
                    proofs.push((session.clone(), op.clone()));
                }
                self.settled.insert(op.clone(), state);
            }
        }
        self.watches
            .retain(|(_, _, w)| w.state() == &Verdict::Pending);
        for (session, operation_id) in proofs {
            self.input(AgentInput::DeliveryProof {
                session,
                operation_id,
            });
        }
        // A request settled without (or after) our answer.
        if let ServerNotification::ServerRequestResolved { request_id, .. } = &n.body {
            if let Some(open) = self.approvals.remove(&request_id.to_string()) {
                let r = open.request;
                self.input(AgentInput::ApprovalResolved {
                    request_id: r.request_id,
                    thread_id: r.thread_id,
                    turn_id: r.turn_id,
                    item_id: r.item_id,
                    result: Ok(ApprovalResult::ResolvedExternally),
                });
            }
        }
        if let ServerNotification::ThreadClosed { thread_id } = &n.body {
            return self.thread_closed(thread_id);
        }
        // `notLoaded`: Codex unloaded the thread. 0.169 says so right before
        // `thread/closed`, which a connection that ends meanwhile never brings: the thread
        // is treated as closed from this status on (closing twice changes nothing).
        if let ServerNotification::ThreadStatusChanged {
            thread_id, status, ..
        } = &n.body
        {
            if status == "notLoaded" {
                self.thread_closed(thread_id);
            }
        }
        let session = match &n.body {
            ServerNotification::ItemStarted { thread_id, .. }
            | ServerNotification::ItemCompleted { thread_id, .. }
            | ServerNotification::ItemDelta { thread_id, .. }
            | ServerNotification::TurnStarted { thread_id, .. }
            | ServerNotification::TurnCompleted { thread_id, .. }
            | ServerNotification::TurnDiffUpdated { thread_id, .. }
            | ServerNotification::ServerRequestResolved { thread_id, .. }
            | ServerNotification::ThreadStatusChanged { thread_id, .. } => {
                self.session_of_thread(thread_id)
            }
            _ => None,
        };
        let Some(session) = session else {
            return;
        };
        // A run ends with its turn, and so does a run whose messages all landed in the
        // turn that ended (a `turn/start` sent while a turn ran names a turn that never
        // runs).
        let ended_turn = match &n.body {
            ServerNotification::TurnCompleted { turn, .. } => {
                Some((turn.id.clone(), outcome(&turn.status)))
            }
            _ => None,
        };
        let projected = match self.sessions.get_mut(&session) {
            Some(s) => s.projector.handle_owned(n, now),
            None => Vec::new(),
        };
        let mut rows: Vec<StoredBlock> = Vec::new();
        for p in projected {
            match p {
                Projected::Row(row) => rows.push(row),
                Projected::Delta(e) => {
                    if let Some(delta) = AgentInput::delta(&session, e) {
                        self.input(delta);
                    }
                }
                _ => {}
            }
        }
        if !rows.is_empty() {
            self.input(AgentInput::Rows {
                target: TargetId::main(&session),
                session: session.clone(),
                rows,
            });
        }
        if let Some((turn_id, kind)) = ended_turn {
            let settled = &self.settled;
            let landed_here = |r: &RunState| {
                !r.accepted.is_empty()
                    && r.accepted.iter().all(|op| {
                        matches!(settled.get(op), Some(Verdict::Delivered { turn_id: t }) if *t == turn_id)
                    })
            };
            let ended: Vec<RunId> = self
                .runs
                .iter()
                .filter(|(_, r)| {
                    r.session == session && !r.ended && (r.turn_id == turn_id || landed_here(r))
                })
                .map(|(id, _)| id.clone())
                .collect();
            for run in ended {
                self.end_run(&run, kind);
            }
        }
    }

    /// Codex closed (unloaded) `thread_id`: nothing more of it comes. Its session's
    /// next send resumes it (`thread/resume`) before its `turn/start`; every run still
    /// open on it ends (aborted when a stop waits for it, failed otherwise: Codex told
    /// no outcome), its stops are answered, what its messages proved stays (nothing
    /// else is claimed untaken: a history read decides), and its open approvals close
    /// as settled elsewhere. A send or interrupt already written gets Codex's own
    /// answer.
    fn thread_closed(&mut self, thread_id: &str) {
        let Some(session) = self.session_of_thread(thread_id) else {
            return;
        };
        if let Some(s) = self.sessions.get_mut(&session) {
            s.loaded = false;
        }
        let open: Vec<(RunId, RunEventKind)> = self
            .runs
            .iter()
            .filter(|(_, r)| !r.ended && r.session == session && r.thread_id == thread_id)
            .map(|(id, r)| {
                let kind = if r.stop.is_some() {
                    RunEventKind::Aborted
                } else {
                    RunEventKind::Failed
                };
                (id.clone(), kind)
            })
            .collect();
        for (run, kind) in open {
            // No echo of the thread comes any more.
            let ops: Vec<OperationId> = self
                .runs
                .get(&run)
                .map(|r| r.accepted.clone())
                .unwrap_or_default();
            self.watches.retain(|(op, _, _)| !ops.contains(op));
            self.end_run(&run, kind);
        }
        let closed: Vec<String> = self
            .approvals
            .iter()
            .filter(|(_, a)| a.request.thread_id == thread_id)
            .map(|(id, _)| id.clone())
            .collect();
        for id in closed {
            if let Some(open) = self.approvals.remove(&id) {
                let r = open.request;
                self.input(AgentInput::ApprovalResolved {
                    request_id: r.request_id,
                    thread_id: r.thread_id,
                    turn_id: r.turn_id,
                    item_id: r.item_id,
                    result: Ok(ApprovalResult::ResolvedExternally),
                });
            }
        }
    }

    /// The process is gone: every request waiting fails as the table says, every run
    /// ends, open approvals close.
    fn gone(&mut self, reason: String) {
        self.conn = Conn::Down;
        self.exits += 1;
        self.codec.abandon();
        self.approvals.clear();
        let writes = std::mem::take(&mut self.writes);
        let write_of: BTreeMap<u64, WriteId> = writes.into_iter().map(|(w, id)| (id, w)).collect();
        for s in self.sessions.values_mut() {
            s.loaded = false;
            s.opening = None;
        }
        let waiting = std::mem::take(&mut self.waiting);
        for (id, w) in waiting {
            match w.what {
                Pending::Send {
                    request, method, ..
                } => {
                    // A write whose outcome is not reported yet may have reached Codex:
                    // its report decides (never written: proven unadmitted; else
                    // uncertain).
                    if let (None, Some(write)) = (w.deadline, write_of.get(&id)) {
                        self.orphans
                            .insert((self.process, *write), (request, method));
                        continue;
                    }
                    let failure = if w.deadline.is_some() {
                        SendFailure::ProcessExited
                    } else {
                        SendFailure::NotWritten {
                            reason: reason.clone(),
                        }
                    };
                    self.input(AgentInput::SendResult {
                        attempt: request.attempt,
                        result: send::failed(method, &failure),
                    });
                }
                Pending::Read { attempt, .. } => self.input(AgentInput::HistoryRead {
                    attempt,
                    read: HistoryRead::Unreadable,
                }),
                // The turn went with the process: its run ends below, which answers
                // its stops (stopped, nothing claimed untaken).
                Pending::Interrupt { .. } | Pending::Initialize | Pending::OpenThread { .. } => {}
            }
        }
        // Sends that waited for a thread: nothing of them was written.
        let mut queued = Vec::new();
        for s in self.sessions.values_mut() {
            queued.append(&mut s.queued);
        }
        queued.append(&mut self.parked);
        for (call, at) in queued {
            match call {
                AgentCall::Send(request) => {
                    let method = match request.kind {
                        SendKind::Start { .. } => SendMethod::TurnStart,
                        SendKind::Steer { .. } => SendMethod::TurnSteer,
                    };
                    self.input(AgentInput::SendResult {
                        attempt: request.attempt,
                        result: send::failed(
                            method,
                            &SendFailure::NotWritten {
                                reason: reason.clone(),
                            },
                        ),
                    });
                }
                other => self.call_while_down(other, at),
            }
        }
        // Every run ends; what waited in them is uncertain (its history read decides).
        self.watches.clear();
        let open: Vec<RunId> = self
            .runs
            .iter()
            .filter(|(_, r)| !r.ended)
            .map(|(id, _)| id.clone())
            .collect();
        for run in open {
            if let Some(r) = self.runs.get_mut(&run) {
                r.accepted.clear();
            }
            self.end_run(&run, RunEventKind::Failed);
        }
    }

    /// A request other than a send whose line could not be written.
    fn unwritten(&mut self, what: Pending, why: &str) {
        match what {
            Pending::Read { attempt, .. } => self.input(AgentInput::HistoryRead {
                attempt,
                read: HistoryRead::Unreadable,
            }),
            Pending::Interrupt { run } => self.answer_stops(
                &run,
                &StopResult::Failed {
                    error: format!("The interrupt could not be written to Codex: {why}"),
                },
            ),
            // Without the connection or the thread nothing else can go: take Codex
            // down, so what waits is answered as at its end, and the next call starts
            // it again.
            Pending::Initialize | Pending::OpenThread { .. } => {
                self.out.push_back(AgentEffect::Kill {
                    process: self.process,
                });
                self.gone(format!("a line could not be written to Codex: {why}"));
            }
            Pending::Send { .. } => {}
        }
    }

    /// A call other than a send that waited when the process ended.
    fn call_while_down(&mut self, call: AgentCall, _at: Millis) {
        match call {
            AgentCall::ReadHistory(ReadHistoryRequest { attempt, .. }) => {
                self.input(AgentInput::HistoryRead {
                    attempt,
                    read: HistoryRead::Unreadable,
                })
            }
            AgentCall::Stop(StopRequest { attempt, .. }) => self.input(AgentInput::StopResult {
                attempt,
                result: StopResult::Stopped {
                    untaken: Vec::new(),
                },
            }),
            AgentCall::TakeBack(TakeBackRequest { attempt, .. }) => {
                self.input(AgentInput::TakeBack {
                    attempt,
                    result: TakeBackResult::NotDetached {
                        reason: "Codex ended.".to_owned(),
                    },
                })
            }
            AgentCall::ResolveApproval { request, .. } => {
                self.input(AgentInput::ApprovalResolved {
                    request_id: request.request_id,
                    thread_id: request.thread_id,
                    turn_id: request.turn_id,
                    item_id: request.item_id,
                    result: Err("Codex ended before the decision reached it.".to_owned()),
                })
            }
            AgentCall::ClearThreadLink { session } => {
                if let Some(s) = self.sessions.get_mut(&session) {
                    s.set_thread(None);
                    s.loaded = false;
                }
            }
            _ => {}
        }
    }
}

impl Agent for CodexAgent {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            replace_latest: false,
            ..Capabilities::codex()
        }
    }

    fn serves(&self, session: &SessionId) -> bool {
        self.sessions.contains_key(session)
    }

    fn handle_call(&mut self, call: AgentCall, now: Millis) {
        match self.conn {
            Conn::Ready => self.call(call, now),
            Conn::Initializing => self.parked.push((call, now)),
            Conn::Down => {
                self.parked.push((call, now));
                self.start_process();
            }
        }
    }

    fn handle_line(&mut self, process: ProcessId, line: &[u8], now: Millis) {
        if process == self.process && self.conn != Conn::Down {
            self.line(line, now);
        }
    }

    fn handle_line_too_long(&mut self, process: ProcessId, now: Millis) {
        // Counted like any unreadable line: an answer it carried fails its request at
        // the deadline.
        if process == self.process {
            self.line(b"", now);
        }
    }

    fn handle_exit(&mut self, process: ProcessId, reason: String, _now: Millis) {
        if process == self.process && self.conn != Conn::Down {
            self.gone(reason);
        }
    }

    fn handle_written(
        &mut self,
        process: ProcessId,
        write: WriteId,
        result: Result<(), WriteFailure>,
        now: Millis,
    ) {
        if let Some((request, method)) = self.orphans.remove(&(process, write)) {
            // A send whose process ended before its write was reported.
            let failure = match result {
                Err(WriteFailure::NotWritten(reason)) => SendFailure::NotWritten { reason },
                _ => SendFailure::ProcessExited,
            };
            self.input(AgentInput::SendResult {
                attempt: request.attempt,
                result: send::failed(method, &failure),
            });
            return;
        }
        if process != self.process {
            return;
        }
        let Some(id) = self.writes.remove(&write) else {
            return;
        };
        match result {
            Ok(()) => {
                if let Some(w) = self.waiting.get_mut(&id) {
                    w.deadline = Some(now.saturating_add(REPLY_DEADLINE));
                }
            }
            Err(failure) => {
                let Some(w) = self.waiting.remove(&id) else {
                    return;
                };
                if let Pending::Send {
                    request, method, ..
                } = w.what
                {
                    let f = match failure {
                        WriteFailure::NotWritten(reason) => {
                            self.watches.retain(|(o, _, _)| o != &request.operation_id);
                            SendFailure::NotWritten { reason }
                        }
                        WriteFailure::Broken(reason) => SendFailure::TransportAfterWrite { reason },
                        other => SendFailure::TransportAfterWrite {
                            reason: other.to_string(),
                        },
                    };
                    self.input(AgentInput::SendResult {
                        attempt: request.attempt,
                        result: send::failed(method, &f),
                    });
                } else {
                    // Answered now: a request that never reached Codex waits for nothing.
                    self.unwritten(w.what, &failure.to_string());
                }
            }
        }
    }

    fn handle_file(&mut self, _read: ReadId, _result: Result<Vec<u8>, FileError>, _now: Millis) {}

    fn poll_effect(&mut self) -> Option<AgentEffect> {
        self.out.pop_front()
    }

    fn poll_timeout(&self) -> Option<Millis> {
        let requests = self.waiting.values().filter_map(|w| w.deadline);
        let stops = self
            .runs
            .values()
            .filter_map(|r| r.stop.as_ref().and_then(|s| s.until));
        let ends = self
            .runs
            .values()
            .filter(|r| !r.ended)
            .filter_map(|r| r.end_by);
        requests.chain(stops).chain(ends).min()
    }

    fn handle_timeout(&mut self, now: Millis) {
        let due: Vec<u64> = self
            .waiting
            .iter()
            .filter(|(_, w)| w.deadline.is_some_and(|d| d <= now))
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            let Some(w) = self.waiting.remove(&id) else {
                continue;
            };
            match w.what {
                Pending::Send {
                    request, method, ..
                } => self.input(AgentInput::SendResult {
                    attempt: request.attempt,
                    result: send::failed(method, &SendFailure::ReplyTimeout),
                }),
                Pending::Read { attempt, .. } => self.input(AgentInput::HistoryRead {
                    attempt,
                    read: HistoryRead::Unreadable,
                }),
                Pending::Interrupt { run } => self.answer_stops(&run, &StopResult::Crashed),
                // The thread of one session did not open in time: only its sends fail.
                // A late answer finds nothing waiting and is dropped (no thread is
                // recorded for it; the next send opens the thread again).
                Pending::OpenThread { session } => self.not_opened(
                    &session,
                    "Codex did not open the thread within the reply deadline",
                ),
                Pending::Initialize => {
                    // Codex does not answer: take it down; what waits fails as at an end.
                    self.out.push_back(AgentEffect::Kill {
                        process: self.process,
                    });
                    self.gone("Codex did not answer in time".to_owned());
                }
            }
        }
        let overdue: Vec<RunId> = self
            .runs
            .iter()
            .filter(|(_, r)| !r.ended && r.end_by.is_some_and(|d| d <= now))
            .map(|(id, _)| id.clone())
            .collect();
        for run in overdue {
            self.end_run(&run, RunEventKind::Completed);
        }
        let stops: Vec<RunId> = self
            .runs
            .iter()
            .filter(|(_, r)| {
                r.stop
                    .as_ref()
                    .is_some_and(|s| s.until.is_some_and(|d| d <= now))
            })
            .map(|(id, _)| id.clone())
            .collect();
        for run in stops {
            let ended = self.runs.get(&run).is_some_and(|r| r.ended);
            let result = if ended || self.conn == Conn::Down {
                StopResult::Stopped {
                    untaken: self.untaken(&run),
                }
            } else {
                StopResult::Crashed
            };
            self.answer_stops(&run, &result);
        }
    }
}
