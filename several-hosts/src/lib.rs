//! Several hosts on one PostgreSQL database, for the tests that kill them and cut them
//! off: a scripted agent that writes every message it is given into a log all hosts
//! share ([`LogAgent`]), that log read as each session's saved history
//! ([`LogHistory`]), and the host process (`cluster-host`) that runs a
//! [`host_runtime::Runtime`] with the cluster keeper and the WebSocket server.
//!
//! A message `tell:<session>:<body>` also makes the agent call the session-message tool
//! with `body` for `<session>`; the tool's results are appended to the log's path with
//! `.tools` added (`host \t session \t call \t result`, [`read_tools`]).
//!
//! A message `hold:<text>` starts a turn that does not end by itself, and whose stop
//! this agent never answers (a stop that hangs); any other stop is answered stopped at
//! once. Every stop the agent is asked for is appended to the log's path with `.stops`
//! added (`host \t session \t run \t held|stopped`, [`read_stops`]).
//!
//! The log is one file, one line per message given: `host \t session \t operation \t
//! text`, appended with a single write, so a host killed at any moment leaves whole
//! lines. The agent writes the line before it answers the send, as a real agent's
//! history holds a message before the turn is acknowledged: a host that dies between
//! the two leaves a message that the next owner finds in history (the uncertain-delivery
//! read) instead of sending it again.

use outbox_core::adapter::{ReadHistoryRequest, StopRequest};
use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};

use host_core::{
    Agent, AgentCall, AgentEffect, AgentInput, FileError, ProcessId, ReadId, WriteFailure, WriteId,
};
use outbox_core::adapter::{Capabilities, HistoryRead, SendKind, SendResult, StopResult};
use outbox_core::entry::{Acceptance, AccessLevel};
use outbox_core::ids::{RunId, ThreadId, TurnId};
use outbox_core::session_message::SessionMessageCall;
use overlay_core::live::RunEventKind;
use overlay_core::source::{
    HistorySource, SourceError, SourceItem, SourceKind, SourcePage, SourcePosition,
};
use overlay_core::store::{RowClass, StoredBlock};
use timeline_core::key::{BlockKey, BlockType, OperationId, SessionId, TargetId};
use timeline_core::time::Millis;
use timeline_core::{AgentKind, Block, BoundaryToken};

/// One message the agent was given, as the log holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Given {
    /// The host whose agent was given it.
    pub host: String,
    /// Its session.
    pub session: String,
    /// Its operation.
    pub operation: String,
    /// Its text.
    pub text: String,
}

/// Every message given so far, in the order given; a line cut short (none should be)
/// is left out.
///
/// # Errors
///
/// The log could not be read (a log not yet written is empty).
pub fn read_log(path: &Path) -> std::io::Result<Vec<Given>> {
    Ok(lines(path)?
        .into_iter()
        .map(|[host, session, operation, text]| Given {
            host,
            session,
            operation,
            text,
        })
        .collect())
}

/// The session-message tool's results so far: (host, calling session, call, result).
///
/// # Errors
///
/// The file could not be read (none written yet is empty).
pub fn read_tools(log: &Path) -> std::io::Result<Vec<[String; 4]>> {
    lines(&tools_path(log))
}

/// The whole lines of four tab-separated fields of `path` (none when it is not written).
fn lines(path: &Path) -> std::io::Result<Vec<[String; 4]>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e),
    };
    Ok(text
        .split_terminator('\n')
        .filter_map(|line| {
            let mut p = line.splitn(4, '\t').map(str::to_owned);
            Some([p.next()?, p.next()?, p.next()?, p.next()?])
        })
        .collect())
}

/// The stops the agents were asked for so far: (host, session, run, `held` or
/// `stopped`).
///
/// # Errors
///
/// The file could not be read (none written yet is empty).
pub fn read_stops(log: &Path) -> std::io::Result<Vec<[String; 4]>> {
    lines(&stops_path(log))
}

fn stops_path(log: &Path) -> PathBuf {
    let mut path = log.as_os_str().to_owned();
    path.push(".stops");
    PathBuf::from(path)
}

fn tools_path(log: &Path) -> PathBuf {
    let mut path = log.as_os_str().to_owned();
    path.push(".tools");
    PathBuf::from(path)
}

fn append_line(path: &Path, line: &str) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    // One write of the whole line: with O_APPEND, lines of several processes never mix.
    file.write_all(line.as_bytes())
}

fn append(path: &Path, given: &Given) -> std::io::Result<()> {
    let line = format!(
        "{}\t{}\t{}\t{}\n",
        given.host,
        given.session,
        given.operation,
        given.text.replace(['\t', '\n'], " ")
    );
    append_line(path, &line)
}

/// The rows a given message shows: the user's message and the reply.
fn rows_of(given: &Given, at: Millis) -> Result<Vec<Block>, String> {
    let op = OperationId::new(given.operation.clone()).map_err(|e| e.to_string())?;
    let key = |t, id: String| BlockKey::parse(t, &id).map_err(|e| e.to_string());
    Ok(vec![
        Block::new(
            key(
                BlockType::User,
                format!("user-message::{}", given.operation),
            )?,
            at,
        )
        .with_data(serde_json::json!({ "text": given.text }))
        .with_operation(op),
        Block::new(
            key(BlockType::AgentReply, format!("reply-{}", given.operation))?,
            at,
        )
        .with_data(serde_json::json!({ "text": format!("echo: {}", given.text) })),
    ])
}

/// The scripted agent of every host: each send is logged, accepted and proven, its
/// user row and reply published, and its run ends `turn` later (a steer joins the
/// running turn). The history read finds an operation in the log.
#[derive(Debug)]
pub struct LogAgent {
    host: String,
    log: PathBuf,
    turn: Millis,
    out: VecDeque<AgentEffect>,
    /// Runs still going: when each ends.
    ends: Vec<(Millis, SessionId, RunId)>,
    /// Runs of `hold:` messages: they end only when stopped, and their stop hangs.
    held: Vec<RunId>,
}

impl LogAgent {
    /// The agent of `host`, logging into `log`, whose turns last `turn`.
    pub fn new(host: impl Into<String>, log: impl Into<PathBuf>, turn: Millis) -> LogAgent {
        LogAgent {
            host: host.into(),
            log: log.into(),
            turn,
            out: VecDeque::new(),
            ends: Vec::new(),
            held: Vec::new(),
        }
    }

    fn input(&mut self, input: AgentInput) {
        self.out.push_back(AgentEffect::Input(input));
    }

    fn send(&mut self, request: outbox_core::adapter::SendRequest, now: Millis) {
        let (run, starts) = match &request.kind {
            SendKind::Start { run } => (run.clone(), true),
            SendKind::Steer { run } => (run.clone(), false),
        };
        let given = Given {
            host: self.host.clone(),
            session: request.session.as_str().to_owned(),
            operation: request.operation_id.as_str().to_owned(),
            text: request.request.user_text.clone(),
        };
        if let Err(e) = append(&self.log, &given) {
            // Not written, so not given.
            self.input(AgentInput::SendResult {
                attempt: request.attempt,
                result: SendResult::ProvenUnadmitted {
                    error: format!("the agent's log could not be written: {e}"),
                },
            });
            return;
        }
        let ids = (
            ThreadId::new("thread-1"),
            TurnId::new(format!("turn-{}", run.as_str())),
        );
        let (Ok(thread_id), Ok(turn_id)) = ids else {
            self.input(AgentInput::SendResult {
                attempt: request.attempt,
                result: SendResult::AdmissionUncertain {
                    error: "the agent could not name its turn".into(),
                },
            });
            return;
        };
        self.input(AgentInput::SendResult {
            attempt: request.attempt,
            result: SendResult::Accepted(Acceptance {
                run_id: run.clone(),
                thread_id,
                turn_id,
                accepted_at: now,
            }),
        });
        match rows_of(&given, now) {
            Ok(blocks) => {
                let rows = blocks
                    .into_iter()
                    .map(|block| StoredBlock {
                        block,
                        class: RowClass::Ordinary,
                        run_id: Some(run.clone()),
                    })
                    .collect();
                self.input(AgentInput::Rows {
                    session: request.session.clone(),
                    target: TargetId::main(&request.session),
                    rows,
                });
            }
            Err(e) => self.input(AgentInput::SendResult {
                attempt: request.attempt,
                result: SendResult::AdmissionUncertain { error: e },
            }),
        }
        self.input(AgentInput::DeliveryProof {
            session: request.session.clone(),
            operation_id: request.operation_id.clone(),
        });
        if let Some((to, body)) = given
            .text
            .strip_prefix("tell:")
            .and_then(|t| t.split_once(':'))
        {
            let call = outbox_core::ids::CallId::new(format!("call-{}", given.operation));
            if let (Ok(recipient), Ok(call_id)) = (SessionId::new(to), call) {
                self.input(AgentInput::SessionMessage(SessionMessageCall {
                    sender_session: request.session.clone(),
                    sender_run: Some(run.clone()),
                    sender_thread: None,
                    call_id,
                    recipient: Some(recipient),
                    body: body.to_owned(),
                    sender_title: given.session.clone(),
                    sender_agent: AgentKind::Codex,
                    sender_access: AccessLevel::FullAccess,
                    sender_project: None,
                    product: "several-hosts".into(),
                }));
            }
        }
        if starts && given.text.starts_with("hold:") {
            self.held.push(run);
        } else if starts {
            self.ends
                .push((now.saturating_add(self.turn), request.session, run));
        }
    }

    fn read_history(&self, session: &SessionId, operation: &OperationId) -> HistoryRead {
        match read_log(&self.log) {
            Ok(given)
                if given.iter().any(|g| {
                    g.session == session.as_str() && g.operation == operation.as_str()
                }) =>
            {
                HistoryRead::Found
            }
            Ok(_) => HistoryRead::Missing,
            Err(_) => HistoryRead::Unreadable,
        }
    }
}

impl Agent for LogAgent {
    fn capabilities(&self) -> Capabilities {
        Capabilities::codex()
    }
    fn serves(&self, _: &SessionId) -> bool {
        true
    }
    fn handle_call(&mut self, call: AgentCall, now: Millis) {
        match call {
            AgentCall::Send(request) => self.send(request, now),
            AgentCall::ReadHistory(ReadHistoryRequest {
                attempt,
                session,
                operation_id,
                ..
            }) => {
                let read = self.read_history(&session, &operation_id);
                self.input(AgentInput::HistoryRead { attempt, read });
            }
            AgentCall::Stop(StopRequest {
                attempt,
                session,
                run,
            }) => {
                let held = self.held.contains(&run);
                let line = format!(
                    "{}\t{session}\t{run}\t{}\n",
                    self.host,
                    if held { "held" } else { "stopped" }
                );
                if let Err(e) = append_line(&stops_path(&self.log), &line) {
                    eprintln!("a stop could not be recorded: {e}");
                }
                if held {
                    // Never answered: the stop hangs, as an agent's can.
                    return;
                }
                let before = self.ends.len();
                self.ends.retain(|(_, _, r)| *r != run);
                self.input(AgentInput::StopResult {
                    attempt,
                    result: StopResult::Stopped {
                        untaken: Vec::new(),
                    },
                });
                if self.ends.len() < before {
                    self.input(AgentInput::RunEnded {
                        session,
                        run,
                        outcome: RunEventKind::Aborted,
                        untaken: Vec::new(),
                    });
                }
            }
            AgentCall::SessionMessageResult {
                session,
                call_id,
                result,
            } => {
                let line = format!("{}\t{session}\t{call_id}\t{result:?}\n", self.host);
                // The tool's answer is only recorded; a result that could not be written
                // shows as a missing line.
                if let Err(e) = append_line(&tools_path(&self.log), &line) {
                    eprintln!("the session-message tool's result could not be recorded: {e}");
                }
            }
            other => {
                if let Some(input) = host_core::unserved(other) {
                    self.input(input);
                }
            }
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
        self.ends.iter().map(|(at, _, _)| *at).min()
    }
    fn handle_timeout(&mut self, now: Millis) {
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.ends)
            .into_iter()
            .partition(|(at, _, _)| *at <= now);
        self.ends = later;
        for (_, session, run) in due {
            self.input(AgentInput::RunEnded {
                session,
                run,
                outcome: RunEventKind::Completed,
                untaken: Vec::new(),
            });
        }
    }
}

/// One session's saved history: the messages the log holds for it, each an item of its
/// user row and reply, read from the file at every read (so every host reads what every
/// agent wrote).
#[derive(Debug)]
pub struct LogHistory {
    log: PathBuf,
    session: String,
}

impl LogHistory {
    /// The history of `session` in `log`.
    pub fn new(log: impl Into<PathBuf>, session: &SessionId) -> LogHistory {
        LogHistory {
            log: log.into(),
            session: session.as_str().to_owned(),
        }
    }

    fn items(&self) -> Result<Vec<SourceItem>, SourceError> {
        let given = read_log(&self.log).map_err(|e| SourceError::Unavailable(e.to_string()))?;
        given
            .iter()
            .filter(|g| g.session == self.session)
            .enumerate()
            .map(|(i, g)| {
                Ok(SourceItem {
                    position: SourcePosition(i.to_string()),
                    blocks: rows_of(g, Millis(1_000 + i as u64)).map_err(SourceError::Malformed)?,
                })
            })
            .collect()
    }
}

impl HistorySource for LogHistory {
    fn kind(&self) -> SourceKind {
        SourceKind::Codex {
            thread_id: "thread-1".into(),
            generation: 1,
        }
    }
    fn boundary_token(&self) -> BoundaryToken {
        BoundaryToken::codex_rollout(&format!("{}#{}", self.log.display(), self.session))
    }
    fn read(
        &mut self,
        before: Option<&SourcePosition>,
        limit: usize,
    ) -> Result<SourcePage, SourceError> {
        let items = self.items()?;
        let end = match before {
            None => items.len(),
            Some(p) => {
                p.0.parse::<usize>()
                    .ok()
                    .filter(|i| *i < items.len())
                    .ok_or(SourceError::PositionGone)?
            }
        };
        let start = end.saturating_sub(limit);
        Ok(SourcePage {
            items: items[start..end].iter().rev().cloned().collect(),
            more: start > 0,
        })
    }
}
