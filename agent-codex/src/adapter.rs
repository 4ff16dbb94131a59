//! The Codex [`AgentAdapter`]: `codex app-server` driven through a [`Driver`], the
//! codec ([`Codec`]) in between, delivery proofs watched live ([`DeliveryWatch`]) and
//! read from the rollout ([`crate::edge::rollout_holds`]).
//!
//! ```no_run
//! use agent_codex::adapter::CodexAdapter;
//! use agent_codex::driver::DriverConfig;
//! use agent_codex::protocol::ClientRequest;
//! use timeline_core::key::SessionId;
//!
//! let mut codex = CodexAdapter::start(DriverConfig::codex(), "my-host", "1.0")?;
//! let session = SessionId::new("s-1")?;
//! codex.open_thread(&session, ClientRequest::ThreadStart {
//!     cwd: Some("/work".into()),
//!     approval_policy: Some("on-request".into()),
//!     sandbox: Some("workspace-write".into()),
//!     model: None,
//!     model_provider: None,
//! })?;
//! // Then: `send`, `pump` for notifications, approvals and proofs, `stop`.
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! What each step answers (OB-08, OB-09):
//!
//! - [`AgentAdapter::send`]: `turn/start` (a new run) or `turn/steer` with the run's turn
//!   as `expectedTurnId`, the operation as `clientUserMessageId`. The answer is
//!   [`SendResult::Accepted`] with the turn it names; every failure goes through the one
//!   table of [`crate::send`]: nothing written is proven unadmitted, and after the write
//!   an error answer, a broken pipe, the reply deadline or the process's end is
//!   uncertain (except the refusals the table proves). Only the echo proves delivery:
//!   [`CodexAdapter::pump`] reports it ([`AdapterEvent::Delivery`]).
//! - [`AgentAdapter::read_history`]: the rollout of the session's thread (the path the
//!   thread names, or the one the host set), searched for the operation's client ID; a
//!   rollout that cannot be read is `Unreadable`.
//! - [`AgentAdapter::stop`]: `turn/interrupt`, then the turn's end; the accepted
//!   messages the interruption proved not delivered (no echo before it) are `untaken`.
//!   A run whose process ended is stopped with nothing claimed untaken: a message that
//!   waited then is uncertain, and its history read decides.
//! - [`AgentAdapter::take_back`]: Codex has no request that takes accepted input back
//!   out of a running turn, so nothing is taken back (`NotDetached`).
//! - A send to a fresh thread first opens one with the `thread/start` the session's
//!   thread was opened with (a failure there is before the message: proven unadmitted).
//! - Capabilities: Codex's, without replace latest (a send that asks to roll back first
//!   is proven unadmitted: `thread/rollback` is deprecated and not sent by this adapter).
//!
//! Invariant: every line read while waiting for an answer is handled in order
//! (notifications update the runs and the delivery watches and are queued for
//! [`CodexAdapter::pump`]), so nothing the process says is lost while a step waits.

#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // drives a process, reads the clock

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use outbox_core::adapter::{
    AgentAdapter, Capabilities, HistoryRead, SendKind, SendRequest, SendResult, StopResult,
    TakeBackResult,
};
use outbox_core::entry::Acceptance;
use timeline_core::key::{OperationId, RunId, SessionId};
use timeline_core::rows::Decision;
use timeline_core::time::Millis;

use crate::codec::{AnswerError, Codec, Incoming, LineError, Response, RpcError};
use crate::diag::Diagnostics;
use crate::driver::{Driver, DriverConfig, ReadLine, SpawnError, WriteError};
use crate::proof::{DeliveryWatch, Verdict};
use crate::protocol::{
    ApprovalAsk, ClientRequest, Notification, RequestId, ServerNotification, ServerRequest, Thread,
};
use crate::send::{self, SendFailure, SendMethod};

/// Why a step outside the adapter trait (start, open a thread, answer) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdapterError {
    /// The process could not be started.
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    /// The request could not be written.
    #[error(transparent)]
    Write(#[from] WriteError),
    /// Codex answered with an error.
    #[error("codex answered {code}: {message}")]
    Rpc {
        /// The code.
        code: i64,
        /// The message.
        message: String,
    },
    /// No answer within the reply deadline.
    #[error("codex did not answer {0} in time")]
    Timeout(&'static str),
    /// The process ended.
    #[error("{0}")]
    Exited(String),
    /// Codex answered something this crate cannot read.
    #[error("codex answered {method} with a line this version cannot read: {error}")]
    Unreadable {
        /// The request.
        method: &'static str,
        /// What the line reader said.
        error: LineError,
    },
    /// Codex answered with another kind of answer than the request's.
    #[error("codex answered {method} with {answer}")]
    UnexpectedAnswer {
        /// The request.
        method: &'static str,
        /// What came.
        answer: String,
    },
    /// The request cannot be made this way (nothing was written).
    #[error("{0}")]
    BadRequest(&'static str),
    /// The approval cannot be answered so.
    #[error(transparent)]
    Answer(#[from] AnswerError),
}

/// What the process said that the host should see.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum AdapterEvent {
    /// A notification of a session's thread (project it with
    /// [`crate::project::Projector`]).
    Notification {
        /// The session, when the thread is one of the adapter's.
        session: Option<SessionId>,
        /// The notification.
        notification: Notification,
    },
    /// An approval Codex waits for: answer it with [`CodexAdapter::answer_approval`].
    Approval {
        /// The session, when the thread is one of the adapter's.
        session: Option<SessionId>,
        /// The request.
        ask: ApprovalAsk,
    },
    /// What the live stream proved about an accepted operation.
    Delivery {
        /// The operation.
        operation_id: OperationId,
        /// Delivered in a turn, or not delivered (its turn was interrupted first).
        delivery: Verdict,
    },
    /// The process ended.
    Exited {
        /// What it said last.
        reason: String,
    },
}

#[derive(Debug)]
struct SessionThread {
    thread_id: String,
    rollout: Option<PathBuf>,
    /// The `thread/start` that opened it, to open a fresh thread the same way.
    start: Option<ClientRequest>,
}

#[derive(Debug)]
struct RunState {
    session: SessionId,
    thread_id: String,
    turn_id: String,
    ended: bool,
    /// Operations this run accepted.
    accepted: Vec<OperationId>,
}

/// How a wait for an answer ended.
enum Answer {
    Ok(Response),
    Rpc(RpcError),
    Unreadable(LineError),
    Timeout,
    Exited(String),
}

/// The Codex adapter. See the module doc.
#[derive(Debug)]
pub struct CodexAdapter {
    config: DriverConfig,
    driver: Driver,
    codec: Codec,
    sessions: BTreeMap<SessionId, SessionThread>,
    runs: BTreeMap<RunId, RunState>,
    /// Accepted operations not proven either way yet.
    watches: Vec<(OperationId, DeliveryWatch)>,
    /// Operations the live stream proved (delivered or not).
    settled: BTreeMap<OperationId, Verdict>,
    events: VecDeque<AdapterEvent>,
    exit_reported: bool,
}

fn now_millis() -> Millis {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    Millis(u64::try_from(ms).unwrap_or(u64::MAX))
}

impl CodexAdapter {
    /// Starts the process and initializes the connection (`initialize`, then
    /// `initialized`) as client `name` `version`.
    pub fn start(
        config: DriverConfig,
        name: &str,
        version: &str,
    ) -> Result<CodexAdapter, AdapterError> {
        let driver = Driver::spawn(&config)?;
        let mut adapter = CodexAdapter {
            config,
            driver,
            codec: Codec::new(),
            sessions: BTreeMap::new(),
            runs: BTreeMap::new(),
            watches: Vec::new(),
            settled: BTreeMap::new(),
            events: VecDeque::new(),
            exit_reported: false,
        };
        adapter.call(
            &ClientRequest::Initialize {
                name: name.to_owned(),
                version: version.to_owned(),
            },
            "initialize",
        )?;
        let initialized = adapter.codec.initialized();
        adapter.driver.write_line(&initialized)?;
        Ok(adapter)
    }

    /// What the codec skipped so far, and the Codex version.
    pub fn diagnostics(&self) -> &Diagnostics {
        self.codec.diagnostics()
    }

    /// Opens `session`'s thread with `thread/start` or `thread/resume` (other requests
    /// are refused as a bad request before anything is written): the thread, whose
    /// rollout path the adapter keeps for history reads.
    pub fn open_thread(
        &mut self,
        session: &SessionId,
        request: ClientRequest,
    ) -> Result<Thread, AdapterError> {
        let what = match &request {
            ClientRequest::ThreadStart { .. } => "thread/start",
            ClientRequest::ThreadResume { .. } => "thread/resume",
            _ => {
                return Err(AdapterError::BadRequest(
                    "a thread is opened with thread/start or thread/resume",
                ))
            }
        };
        let thread = match self.call(&request, what)? {
            Response::ThreadStart { thread } | Response::ThreadResume { thread } => thread,
            other => {
                return Err(AdapterError::UnexpectedAnswer {
                    method: what,
                    answer: format!("{other:?}"),
                })
            }
        };
        self.sessions.insert(
            session.clone(),
            SessionThread {
                thread_id: thread.id.clone(),
                rollout: thread.path.as_ref().map(PathBuf::from),
                start: matches!(request, ClientRequest::ThreadStart { .. })
                    .then_some(request.clone()),
            },
        );
        Ok(thread)
    }

    /// Names the rollout of `session`'s thread (when the host knows it better than the
    /// thread's `path`, e.g. another `CODEX_HOME`).
    pub fn set_rollout(&mut self, session: &SessionId, path: &Path) {
        if let Some(s) = self.sessions.get_mut(session) {
            s.rollout = Some(path.to_path_buf());
        }
    }

    /// The thread of `session`, if open.
    pub fn thread_of(&self, session: &SessionId) -> Option<&str> {
        self.sessions.get(session).map(|s| s.thread_id.as_str())
    }

    /// The next event: queued ones first, then lines read until `timeout` passes.
    pub fn pump(&mut self, timeout: Duration) -> Option<AdapterEvent> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = self.events.pop_front() {
                return Some(e);
            }
            match self.driver.read_line(deadline) {
                ReadLine::Line(line) => {
                    // Nothing is awaited: no answer comes back.
                    self.take_line(&line, None);
                }
                ReadLine::Timeout => return None,
                ReadLine::Exited { reason } => {
                    self.exit(reason);
                    return self.events.pop_front();
                }
            }
        }
    }

    /// Answers approval `id` with `decision`.
    pub fn answer_approval(
        &mut self,
        id: &RequestId,
        decision: Decision,
    ) -> Result<(), AdapterError> {
        let line = self.codec.answer_approval(id, decision)?;
        self.driver.write_line(&line)?;
        Ok(())
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        self.driver.is_running()
    }

    fn session_of_thread(&self, thread_id: &str) -> Option<SessionId> {
        self.sessions
            .iter()
            .find(|(_, t)| t.thread_id == thread_id)
            .map(|(s, _)| s.clone())
    }

    fn exit(&mut self, reason: String) {
        self.codec.abandon();
        for run in self.runs.values_mut() {
            run.ended = true;
        }
        if !self.exit_reported {
            self.exit_reported = true;
            self.events.push_back(AdapterEvent::Exited { reason });
        }
    }

    /// Handles one line; returns the answer when it is the one `awaited`.
    fn take_line(&mut self, line: &[u8], awaited: Option<u64>) -> Option<Answer> {
        let incoming = match self.codec.handle_line(line) {
            Ok(i) => i,
            // Counted by the codec. When it was the answer waited for (the codec no
            // longer waits for it), the answer is unreadable.
            Err(error) => {
                let answered =
                    awaited.is_some_and(|id| !self.codec.pending().any(|(p, _)| p == id));
                return answered.then_some(Answer::Unreadable(error));
            }
        };
        match incoming {
            Incoming::Response { id, response } if Some(id) == awaited => {
                Some(Answer::Ok(response))
            }
            Incoming::Error { id, error, .. } if id.is_some() && id == awaited => {
                Some(Answer::Rpc(error))
            }
            Incoming::Notification(n) => {
                self.note(&n.body);
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
                self.events.push_back(AdapterEvent::Notification {
                    session,
                    notification: n,
                });
                None
            }
            Incoming::Request { request, reply } => {
                if let Some(reply) = reply {
                    // An unsupported request, answered at once; a failed write shows
                    // as the process's end on the next read.
                    if let Err(e) = self.driver.write_line(&reply) {
                        self.events.push_back(AdapterEvent::Exited {
                            reason: format!("answering a request of codex failed: {e}"),
                        });
                    }
                }
                if let ServerRequest::Approval(ask) = request {
                    let session = self.session_of_thread(&ask.thread_id);
                    self.events
                        .push_back(AdapterEvent::Approval { session, ask });
                }
                None
            }
            // Answers for nobody (counted by the codec) and errors of other requests.
            _ => None,
        }
    }

    /// Updates runs and watches from a notification.
    fn note(&mut self, n: &ServerNotification) {
        if let ServerNotification::TurnCompleted { turn, .. } = n {
            let settled = &self.settled;
            // A run ends with its turn, and so does a run whose messages all landed in
            // the turn that ended (a `turn/start` sent while a turn ran names a turn
            // that never runs).
            let landed_here = |r: &RunState| {
                !r.accepted.is_empty()
                    && r.accepted.iter().all(|op| {
                        matches!(settled.get(op), Some(Verdict::Delivered { turn_id }) if *turn_id == turn.id)
                    })
            };
            for run in self.runs.values_mut() {
                if run.turn_id == turn.id || landed_here(run) {
                    run.ended = true;
                }
            }
        }
        for (op, watch) in &mut self.watches {
            if watch.state() != &Verdict::Pending {
                continue;
            }
            let state = watch.handle(n).clone();
            if state != Verdict::Pending {
                self.settled.insert(op.clone(), state.clone());
                self.events.push_back(AdapterEvent::Delivery {
                    operation_id: op.clone(),
                    delivery: state,
                });
            }
        }
        self.watches.retain(|(_, w)| w.state() == &Verdict::Pending);
    }

    /// Writes `request` and waits for its answer, handling every other line meanwhile.
    fn request(&mut self, request: &ClientRequest) -> Result<Answer, WriteError> {
        let (id, line) = self.codec.request(request);
        self.driver.write_line(&line)?;
        Ok(self.await_answer(id))
    }

    fn await_answer(&mut self, id: u64) -> Answer {
        let deadline = Instant::now() + self.config.reply_timeout;
        loop {
            match self.driver.read_line(deadline) {
                ReadLine::Line(line) => {
                    if let Some(answer) = self.take_line(&line, Some(id)) {
                        return answer;
                    }
                }
                ReadLine::Timeout => return Answer::Timeout,
                ReadLine::Exited { reason } => {
                    self.exit(reason.clone());
                    return Answer::Exited(reason);
                }
            }
        }
    }

    fn call(
        &mut self,
        request: &ClientRequest,
        what: &'static str,
    ) -> Result<Response, AdapterError> {
        match self.request(request)? {
            Answer::Ok(r) => Ok(r),
            Answer::Rpc(e) => Err(AdapterError::Rpc {
                code: e.code,
                message: e.message,
            }),
            Answer::Unreadable(error) => Err(AdapterError::Unreadable {
                method: what,
                error,
            }),
            Answer::Timeout => Err(AdapterError::Timeout(what)),
            Answer::Exited(reason) => Err(AdapterError::Exited(reason)),
        }
    }
}

impl AgentAdapter for CodexAdapter {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            replace_latest: false,
            ..Capabilities::codex()
        }
    }

    fn send(&mut self, request: &SendRequest) -> SendResult {
        let method = match request.kind {
            SendKind::Start { .. } => SendMethod::TurnStart,
            SendKind::Steer { .. } => SendMethod::TurnSteer,
        };
        let not_written =
            |reason: String| send::failed(method, &SendFailure::NotWritten { reason });
        if request.rollback_before_send {
            return not_written(
                "this adapter does not roll back a turn (replace latest)".to_owned(),
            );
        }
        if request.fresh_thread {
            // The old thread is gone: open a new one the way the session's was opened,
            // before anything of the message is written.
            let Some(start) = self
                .sessions
                .get(&request.session)
                .and_then(|s| s.start.clone())
            else {
                return not_written(format!(
                    "session {} has no thread/start to open a fresh thread with",
                    request.session.as_str()
                ));
            };
            if let Err(e) = self.open_thread(&request.session, start) {
                return not_written(format!("opening a fresh thread failed: {e}"));
            }
        }
        let Some(thread_id) = self
            .sessions
            .get(&request.session)
            .map(|s| s.thread_id.clone())
        else {
            return not_written(format!(
                "no thread is open for session {}",
                request.session.as_str()
            ));
        };
        let op = request.operation_id.as_str().to_owned();
        let (run, wire) = match &request.kind {
            SendKind::Start { run } => (
                run.clone(),
                ClientRequest::TurnStart {
                    thread_id: thread_id.clone(),
                    client_user_message_id: op.clone(),
                    input: crate::seam::inputs(request),
                },
            ),
            SendKind::Steer { run } => {
                let Some(turn) = self
                    .runs
                    .get(run)
                    .filter(|r| !r.ended)
                    .map(|r| r.turn_id.clone())
                else {
                    return not_written(format!("run {} has no running turn", run.as_str()));
                };
                (
                    run.clone(),
                    ClientRequest::TurnSteer {
                        thread_id: thread_id.clone(),
                        expected_turn_id: turn,
                        client_user_message_id: op.clone(),
                        input: crate::seam::inputs(request),
                    },
                )
            }
        };
        // Watch from before the write: the echo may come before the answer.
        self.watches.push((
            request.operation_id.clone(),
            DeliveryWatch::new(&op, &thread_id),
        ));
        let answer = match self.request(&wire) {
            Ok(a) => a,
            Err(WriteError::NotWritten(reason)) => {
                self.watches.pop();
                return not_written(reason);
            }
            Err(WriteError::Broken(reason)) => {
                return send::failed(method, &SendFailure::TransportAfterWrite { reason })
            }
        };
        let turn_id = match answer {
            Answer::Ok(Response::TurnStart { turn }) => turn.id,
            Answer::Ok(Response::TurnSteer { turn_id }) => turn_id,
            Answer::Ok(other) => {
                return SendResult::AdmissionUncertain {
                    error: format!("Codex answered the send with {other:?}."),
                }
            }
            Answer::Rpc(e) => {
                let result = send::failed(method, &SendFailure::Rpc(e));
                if matches!(result, SendResult::ProvenUnadmitted { .. }) {
                    // Refused: no echo will come.
                    self.watches.retain(|(o, _)| o != &request.operation_id);
                }
                return result;
            }
            Answer::Unreadable(e) => {
                return send::failed(
                    method,
                    &SendFailure::TransportAfterWrite {
                        reason: e.to_string(),
                    },
                )
            }
            Answer::Timeout => return send::failed(method, &SendFailure::ReplyTimeout),
            Answer::Exited(_) => return send::failed(method, &SendFailure::ProcessExited),
        };
        let result = send::accepted(run.clone(), &thread_id, &turn_id, now_millis());
        if let SendResult::Accepted(Acceptance { .. }) = &result {
            match &request.kind {
                SendKind::Start { .. } => {
                    self.runs.insert(
                        run,
                        RunState {
                            session: request.session.clone(),
                            thread_id,
                            turn_id,
                            ended: false,
                            accepted: vec![request.operation_id.clone()],
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
        result
    }

    fn read_history(&mut self, session: &SessionId, op: &OperationId) -> HistoryRead {
        let Some(path) = self.sessions.get(session).and_then(|s| s.rollout.clone()) else {
            return HistoryRead::Unreadable;
        };
        match crate::edge::rollout_holds(&path, op.as_str()) {
            Ok(true) => HistoryRead::Found,
            Ok(false) => HistoryRead::Missing,
            Err(_) => HistoryRead::Unreadable,
        }
    }

    fn stop(&mut self, session: &SessionId, run: &RunId) -> StopResult {
        let Some((thread_id, turn_id, ended)) = self
            .runs
            .get(run)
            .filter(|r| &r.session == session)
            .map(|r| (r.thread_id.clone(), r.turn_id.clone(), r.ended))
        else {
            return StopResult::Failed {
                error: format!("run {} is not a run of this adapter", run.as_str()),
            };
        };
        // The run's operations the interruption proved not delivered. One still waiting
        // (the process ended first) is not claimed: its history read decides.
        let untaken = |me: &CodexAdapter| -> Vec<OperationId> {
            me.runs
                .get(run)
                .map(|r| {
                    r.accepted
                        .iter()
                        .filter(|op| {
                            matches!(me.settled.get(*op), Some(Verdict::NotDelivered { .. }))
                        })
                        .cloned()
                        .collect()
                })
                .unwrap_or_default()
        };
        if !ended {
            let interrupt = ClientRequest::TurnInterrupt {
                thread_id,
                turn_id: turn_id.clone(),
            };
            match self.request(&interrupt) {
                Ok(Answer::Ok(_)) => {}
                Ok(Answer::Rpc(e)) => {
                    return StopResult::Failed {
                        error: format!(
                            "Codex refused to interrupt the turn ({}: {}).",
                            e.code, e.message
                        ),
                    }
                }
                Ok(Answer::Exited(reason)) => {
                    return StopResult::Failed {
                        error: format!("Codex exited: {reason}"),
                    }
                }
                Ok(Answer::Timeout | Answer::Unreadable(_)) | Err(_) => return StopResult::Crashed,
            }
            // The turn ends with `turn/completed` (interrupted): its pending input goes
            // with it.
            let deadline = Instant::now() + self.config.reply_timeout;
            while !self.runs.get(run).is_none_or(|r| r.ended) {
                match self.driver.read_line(deadline) {
                    ReadLine::Line(line) => {
                        self.take_line(&line, None);
                    }
                    ReadLine::Timeout => return StopResult::Crashed,
                    ReadLine::Exited { reason } => {
                        self.exit(reason);
                        break;
                    }
                }
            }
        }
        StopResult::Stopped {
            untaken: untaken(self),
        }
    }

    fn take_back(
        &mut self,
        _session: &SessionId,
        _op: &OperationId,
        _acceptance: &Acceptance,
    ) -> TakeBackResult {
        TakeBackResult::NotDetached {
            reason: "Codex cannot take accepted input back out of a running turn.".to_owned(),
        }
    }

    fn vetoes_reclaim(&self, session: &SessionId, run: &RunId) -> bool {
        !self.exit_reported
            && self
                .runs
                .get(run)
                .is_some_and(|r| &r.session == session && !r.ended)
    }
}
