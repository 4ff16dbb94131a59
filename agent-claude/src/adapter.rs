//! The Claude agent adapter (`outbox_core::adapter::AgentAdapter`) at the edge: one
//! `claude -p` process per run ([`crate::driver`]), the run's lines read by
//! [`crate::run::ClaudeRun`], history reads on the session's transcript file.
//!
//! | step | what the adapter does |
//! |---|---|
//! | send, start | starts Claude (`--resume <Claude session>` once the session has one), writes the user line whose `uuid` is the operation ID, reads lines until one names it or the reply deadline passes |
//! | send, steer | writes the user line into the run's open input; Claude reads it after its current step |
//! | result | a line naming the UUID delivers (the echo, `command_lifecycle` started/completed, `result.user_message_uuid`); `queued` accepts it; `refused` proves it was not admitted; Claude exiting, the deadline, a failed write or a turn that ends without naming it is uncertain (OB-08, OB-09) |
//! | history read | looks for a user entry with the UUID in the transcript (`<projects>/<slug of cwd>/<Claude session>.jsonl`), streamed in blocks |
//! | stop | writes an `interrupt` control request with `cancel_queued`, waits for the turn to end or Claude to exit, closes its input; the messages Claude cancelled before they started are untaken |
//! | take back | Claude Code offers no way to take one queued message back: not detached |
//! | reclaim veto | while the run's process lives |
//! | approvals | `can_use_tool` prompts become [`ApprovalRequest`]s and cards; [`ClaudeAdapter::resolve_approval`] answers one it holds, and says when it holds none (the seed: dispatch asks the Claude adapter first) |
//!
//! After a send, the run goes on: the host calls [`ClaudeAdapter::pump`] to read what
//! Claude prints and drains [`ClaudeAdapter::poll_effect`] (rows, deltas, cards, turn
//! ends). A run whose turn ended with nothing waiting has its input closed, so the
//! process ends.

#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // the module that drives processes and reads the clock

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use outbox_core::adapter::{
    AgentAdapter, Capabilities, HistoryRead, SendKind, SendRequest, SendResult, StopResult,
    TakeBackResult,
};
use outbox_core::entry::Acceptance;
use outbox_core::ids::{OperationId, RunId, SessionId};
use timeline_core::rows::{ApprovalRequest, ApprovalResult, Decision};
use timeline_core::time::Millis;

use crate::driver::{ClaudeCommand, Driver, DriverError, DriverEvent};
use crate::file::{transcript_path, FileError};
use crate::project::Output;
use crate::run::{send_result, ClaudeRun, ResolveError, SendState, WaitEnd};
use crate::stream::{MessageUuid, UserMessage};

/// The reply deadline of a send (OB-09: "the 30 s reply deadline").
pub const REPLY_DEADLINE: Duration = Duration::from_secs(30);

/// How long a stop waits for the run to end after the interrupt before it kills it.
pub const STOP_DEADLINE: Duration = Duration::from_secs(10);

/// How the adapter starts Claude and finds its transcripts.
#[derive(Clone, Debug)]
pub struct AdapterConfig {
    /// The command ([`ClaudeCommand::claude`] by default).
    pub command: ClaudeCommand,
    /// `~/.claude/projects`.
    pub projects: PathBuf,
    /// The project directory as Claude sees it (its transcripts live under its slug).
    pub cwd: String,
    /// How long a send waits for a line naming the message.
    pub reply_deadline: Duration,
    /// How long a stop waits after the interrupt.
    pub stop_deadline: Duration,
    /// The clock of acceptances and rows.
    pub clock: fn() -> Millis,
}

/// Milliseconds since 1970 by the system clock (0 before 1970).
pub fn system_clock() -> Millis {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    Millis(u64::try_from(since).unwrap_or(u64::MAX))
}

impl AdapterConfig {
    /// Claude in `cwd`, transcripts under `projects`, the seed's deadlines.
    pub fn new(projects: impl Into<PathBuf>, cwd: impl Into<String>) -> AdapterConfig {
        let cwd = cwd.into();
        AdapterConfig {
            command: ClaudeCommand::claude().current_dir(&cwd),
            projects: projects.into(),
            cwd,
            reply_deadline: REPLY_DEADLINE,
            stop_deadline: STOP_DEADLINE,
            clock: system_clock,
        }
    }
}

/// Why an approval was not answered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApprovalError {
    /// The run refused it: not this adapter's request, or not an allowed decision.
    #[error(transparent)]
    Refused(#[from] ResolveError),
    /// The answer could not be written (Claude exited).
    #[error("writing the answer to Claude: {0}")]
    Write(String),
}

struct Live {
    driver: Driver,
    run: ClaudeRun,
}

impl Live {
    /// Takes one line Claude printed and writes what the run owes Claude in answer. An
    /// answer that cannot be written stays owed: Claude's input is gone, and the next
    /// event is its exit.
    fn take(&mut self, line: &[u8], now: Millis) {
        self.run.handle_line(line, now);
        while let Some(answer) = self.run.next_answer() {
            if self.driver.write_line(answer).is_err() {
                break;
            }
            self.run.answered();
        }
    }
}

/// The Claude adapter; see the module doc.
pub struct ClaudeAdapter {
    config: AdapterConfig,
    live: HashMap<SessionId, Live>,
    claude_sessions: HashMap<SessionId, String>,
    /// The operation of every UUID written (a UUID is kept in lower case).
    ops: HashMap<String, OperationId>,
    out: VecDeque<(SessionId, Output)>,
}

impl ClaudeAdapter {
    /// An adapter with no run.
    pub fn new(config: AdapterConfig) -> ClaudeAdapter {
        ClaudeAdapter {
            config,
            live: HashMap::new(),
            claude_sessions: HashMap::new(),
            ops: HashMap::new(),
            out: VecDeque::new(),
        }
    }

    /// Sets the Claude session of `session` (what the host saved from an earlier run):
    /// the next run resumes it and history reads look in its transcript.
    pub fn set_claude_session(&mut self, session: &SessionId, claude_session: &str) {
        self.claude_sessions
            .insert(session.clone(), claude_session.to_owned());
    }

    /// The Claude session of `session`, once known.
    pub fn claude_session(&self, session: &SessionId) -> Option<&str> {
        self.claude_sessions.get(session).map(String::as_str)
    }

    /// The transcript of `session`, once its Claude session is known.
    pub fn transcript_of(&self, session: &SessionId) -> Option<PathBuf> {
        let claude = self.claude_sessions.get(session)?;
        Some(transcript_path(
            &self.config.projects,
            &self.config.cwd,
            claude,
        ))
    }

    /// The next output of a run, oldest first, with its session.
    #[must_use]
    pub fn poll_effect(&mut self) -> Option<(SessionId, Output)> {
        self.out.pop_front()
    }

    /// The old name of [`Self::poll_effect`].
    #[deprecated(note = "renamed poll_effect: one name for every machine's output")]
    #[must_use]
    pub fn poll_output(&mut self) -> Option<(SessionId, Output)> {
        self.poll_effect()
    }

    /// Every prompt that waits for a decision, in every run.
    pub fn open_approvals(&self) -> Vec<ApprovalRequest> {
        self.live
            .values()
            .flat_map(|l| l.run.open_approvals().cloned())
            .collect()
    }

    /// Answers the prompt `request_id` with `decision`, when a run of this adapter
    /// holds it ([`ResolveError::NotOpen`] otherwise: ask the next adapter).
    pub fn resolve_approval(
        &mut self,
        request_id: &str,
        decision: Decision,
    ) -> Result<ApprovalResult, ApprovalError> {
        let now = (self.config.clock)();
        let (session, live) = self
            .live
            .iter_mut()
            .find(|(_, l)| l.run.open_approvals().any(|a| a.request_id == request_id))
            .ok_or_else(|| ResolveError::NotOpen(request_id.to_owned()))?;
        let (line, result) = live.run.resolve(request_id, decision, now)?;
        let session = session.clone();
        let written = live.driver.write_line(&line);
        self.drain(&session);
        written.map_err(|e| ApprovalError::Write(e.to_string()))?;
        Ok(result)
    }

    /// Reads what the run of `session` prints for up to `wait` (returning early when
    /// its process ends), queueing the outputs. Returns true while the process lives.
    pub fn pump(&mut self, session: &SessionId, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        let clock = self.config.clock;
        let Some(live) = self.live.get_mut(session) else {
            return false;
        };
        let alive = loop {
            match live.driver.next_event(deadline) {
                DriverEvent::Line(l) => live.take(&l, clock()),
                DriverEvent::Exited { .. } => {
                    live.run.flush(clock());
                    break false;
                }
                DriverEvent::TimedOut => break true,
            }
            if live.run.is_finished() {
                live.driver.close_input();
            }
        };
        self.drain(session);
        if !alive {
            self.live.remove(session);
        }
        alive
    }

    /// Moves the run's outputs to the adapter's queue and learns its Claude session.
    fn drain(&mut self, session: &SessionId) {
        let Some(live) = self.live.get_mut(session) else {
            return;
        };
        if let Some(claude) = live.run.claude_session() {
            self.claude_sessions
                .insert(session.clone(), claude.to_owned());
        }
        while let Some(o) = live.run.poll_effect() {
            self.out.push_back((session.clone(), o));
        }
    }

    /// Waits for a line naming `uuid`; `start` says whether a turn that ends without
    /// naming it ends the wait. Returns what is known, why the wait ended, and the
    /// acceptance a queued message gets.
    fn wait_for(
        &mut self,
        session: &SessionId,
        uuid: &MessageUuid,
        start: bool,
    ) -> (Option<SendState>, WaitEnd, Option<Acceptance>) {
        let began = Instant::now();
        let deadline = began + self.config.reply_deadline;
        let clock = self.config.clock;
        let Some(live) = self.live.get_mut(session) else {
            let end = WaitEnd::Exited {
                code: None,
                stderr: String::new(),
            };
            return (None, end, None);
        };
        let (state, end) = loop {
            let state = live.run.state_of(uuid);
            if state.is_some_and(|s| s != SendState::Written) {
                break (state, WaitEnd::Settled);
            }
            if start && live.run.last_result().is_some() {
                break (state, WaitEnd::TurnEnded);
            }
            match live.driver.next_event(deadline) {
                DriverEvent::Line(l) => live.take(&l, clock()),
                DriverEvent::Exited { code, stderr } => {
                    live.run.flush(clock());
                    break (live.run.state_of(uuid), WaitEnd::Exited { code, stderr });
                }
                DriverEvent::TimedOut => {
                    let waited_ms = u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX);
                    break (state, WaitEnd::TimedOut { waited_ms });
                }
            }
        };
        let acceptance = live.run.acceptance(clock());
        if live.run.is_finished() {
            live.driver.close_input();
        }
        self.drain(session);
        if matches!(end, WaitEnd::Exited { .. }) {
            self.live.remove(session);
        }
        (state, end, acceptance)
    }

    /// Closes the input of a finished run and waits for its process to end (killing
    /// it at the stop deadline), reading what it still prints.
    fn retire(&mut self, session: &SessionId) -> bool {
        let deadline = Instant::now() + self.config.stop_deadline;
        let clock = self.config.clock;
        let Some(live) = self.live.get_mut(session) else {
            return true;
        };
        live.driver.close_input();
        let exited = loop {
            match live.driver.next_event(deadline) {
                DriverEvent::Line(l) => live.take(&l, clock()),
                DriverEvent::Exited { .. } => {
                    live.run.flush(clock());
                    break true;
                }
                DriverEvent::TimedOut => break false,
            }
        };
        let ended = exited || live.driver.kill().is_ok() || !live.driver.is_alive();
        self.drain(session);
        if ended {
            self.live.remove(session);
        }
        ended
    }

    fn unadmitted(error: impl Into<String>) -> SendResult {
        SendResult::ProvenUnadmitted {
            error: error.into(),
        }
    }

    fn start(
        &mut self,
        request: &SendRequest,
        run: &RunId,
        uuid: &MessageUuid,
    ) -> Result<(), SendResult> {
        let session = &request.session;
        if self
            .live
            .get(session)
            .is_some_and(|l| !l.driver.output_open())
        {
            // The previous run's process is gone: read its end, then start anew.
            if !self.retire(session) {
                return Err(Self::unadmitted("The previous Claude run did not end"));
            }
        }
        if let Some(old) = self.live.get(session) {
            if !old.run.is_finished() {
                return Err(Self::unadmitted(
                    "A Claude run is still active in this session",
                ));
            }
            // A finished run whose process lingers: end it before the next one.
            if !self.retire(session) {
                return Err(Self::unadmitted("The previous Claude run did not end"));
            }
        }
        let mut command = self.config.command.clone();
        if let Some(claude) = self.claude_sessions.get(session) {
            command = command.args(["--resume", claude.as_str()]);
        }
        let driver = Driver::spawn(&command).map_err(|e| Self::unadmitted(e.to_string()))?;
        let run = ClaudeRun::new(run.clone(), uuid, session.as_str(), 0);
        self.live.insert(session.clone(), Live { driver, run });
        Ok(())
    }

    fn write(&mut self, request: &SendRequest, uuid: &MessageUuid) -> Result<(), SendResult> {
        let text = request
            .request
            .prompt_text
            .clone()
            .unwrap_or_else(|| request.request.user_text.clone());
        let mut message = UserMessage::new(uuid.clone(), text);
        message.session_id = self.claude_sessions.get(&request.session).cloned();
        let live = self
            .live
            .get_mut(&request.session)
            .ok_or_else(|| Self::unadmitted("The Claude run ended before the message was sent"))?;
        let written = live.driver.write_line(&message.encode());
        if !matches!(written, Err(DriverError::InputClosed)) {
            live.run.written(uuid);
            self.ops
                .insert(uuid.as_str().to_owned(), request.operation_id.clone());
        }
        written.map_err(|e| match e {
            // Nothing was written.
            DriverError::InputClosed => {
                Self::unadmitted("The Claude run ended before the message was sent")
            }
            // After the hand-off: Claude may have read part of it (OB-09).
            e => send_result(
                Some(SendState::Written),
                &WaitEnd::WriteFailed(e.to_string()),
                None,
            ),
        })
    }
}

impl AgentAdapter for ClaudeAdapter {
    fn capabilities(&self) -> Capabilities {
        Capabilities::claude()
    }

    fn send(&mut self, request: &SendRequest) -> SendResult {
        let Ok(uuid) = MessageUuid::from_operation(&request.operation_id) else {
            return Self::unadmitted("The operation ID is not a UUID, which Claude needs");
        };
        if !request.request.attachments.is_empty() {
            return Self::unadmitted("This Claude adapter sends text only; remove the attachments");
        }
        let (run, start) = match &request.kind {
            SendKind::Start { run } => (run, true),
            SendKind::Steer { run } => (run, false),
        };
        if start {
            if let Err(r) = self.start(request, run, &uuid) {
                return r;
            }
        } else if self
            .live
            .get(&request.session)
            .is_none_or(|l| l.run.run() != run || l.run.is_finished() || !l.driver.output_open())
        {
            return Self::unadmitted("The active run ended before the message was sent");
        }
        if let Err(r) = self.write(request, &uuid) {
            self.drain(&request.session);
            return r;
        }
        let (state, end, acceptance) = self.wait_for(&request.session, &uuid, start);
        send_result(state, &end, acceptance)
    }

    fn read_history(&mut self, session: &SessionId, op: &OperationId) -> HistoryRead {
        let Ok(uuid) = MessageUuid::from_operation(op) else {
            return HistoryRead::Missing;
        };
        let Some(path) = self.transcript_of(session) else {
            return HistoryRead::Unreadable;
        };
        match crate::file::has_user_entry(&path, &uuid) {
            Ok(true) => HistoryRead::Found,
            Ok(false) => HistoryRead::Missing,
            Err(FileError::Io { .. } | FileError::Page(_)) => HistoryRead::Unreadable,
        }
    }

    fn stop(&mut self, session: &SessionId, run: &RunId) -> StopResult {
        let Some(live) = self.live.get_mut(session).filter(|l| l.run.run() == run) else {
            // No process of that run: it is over.
            return StopResult::Stopped {
                untaken: Vec::new(),
            };
        };
        let interrupt = format!(
            "{}\n",
            serde_json::json!({
                "type": "control_request",
                "request_id": format!("interrupt-{}", run.as_str()),
                // Drop what waits in Claude's queue (2.1.328 keeps it otherwise, and
                // runs it as the next turn): what it cancels is what was not taken.
                "request": {"subtype": "interrupt", "cancel_queued": true},
            })
        );
        let clock = self.config.clock;
        // A failed write means Claude's input is gone: the run is ending, and the
        // retire below waits for it or kills it.
        if live.driver.write_line(&interrupt).is_ok() {
            let deadline = Instant::now() + self.config.stop_deadline;
            let before = live.run.last_result().cloned();
            // Until the turn's result, Claude's exit or the deadline.
            while let DriverEvent::Line(l) = live.driver.next_event(deadline) {
                live.take(&l, clock());
                if live.run.last_result() != before.as_ref() {
                    break;
                }
            }
        }
        let untaken: Vec<OperationId> = live
            .run
            .untaken()
            .into_iter()
            .filter_map(|u| self.ops.get(&u).cloned())
            .collect();
        if !self.retire(session) {
            return StopResult::Failed {
                error: "Claude did not stop".to_owned(),
            };
        }
        StopResult::Stopped { untaken }
    }

    fn take_back(
        &mut self,
        _session: &SessionId,
        _op: &OperationId,
        _acceptance: &Acceptance,
    ) -> TakeBackResult {
        TakeBackResult::NotDetached {
            reason: "Claude Code cannot take back one queued message; stop the run instead"
                .to_owned(),
        }
    }

    fn vetoes_reclaim(&self, session: &SessionId, run: &RunId) -> bool {
        self.live
            .get(session)
            .is_some_and(|l| l.run.run() == run && l.driver.output_open())
    }
}
