//! Claude Code behind the host's agent seam ([`host_core::Agent`]): one `claude -p`
//! process per run, driven without blocking and without IO.
//!
//! [`ClaudeAgent`] starts each run as `claude -p --input-format stream-json
//! --output-format stream-json --verbose --replay-user-messages --include-partial-messages
//! --permission-prompt-tool stdio` (the partial messages are the streamed fragments the
//! host logs, [`AgentInput::Delta`]), with `--session-id <the session's Claude session>` while Claude has no
//! transcript of it and `--resume <it>` once it has, so the Claude session (the
//! acceptance's thread, the transcript's name) is known before Claude prints anything. Each line Claude prints goes through
//! [`crate::run::ClaudeRun`]; what it proves and projects becomes [`AgentInput`]s.
//! Which of the two flags a run gets is decided by looking for the session's transcript
//! just before it starts ([`AgentEffect::ReadFile`] with a limit of 0): Claude 2.1.328
//! writes it well after a message started, so a run killed early leaves none, and a
//! `--resume` of it would fail at once.
//!
//! | host call | what Claude is sent | what the host gets |
//! |---|---|---|
//! | send, start | a new process, then the user line whose `uuid` is the operation | [`AgentInput::SendResult`] once a line names the UUID (`command_lifecycle` queued: accepted; started, the echo or a result: delivered) or the wait ends (the process's end, the 30 s deadline, a turn that ended without naming it: uncertain); later proof is [`AgentInput::DeliveryProof`] |
//! | send, steer | the user line into the run's open input | the same |
//! | history read | nothing: the session's transcript is read ([`AgentEffect::ReadFile`]) and searched for the UUID | [`AgentInput::HistoryRead`] |
//! | stop | an `interrupt` control request with `cancel_queued` | [`AgentInput::StopResult`] once Claude's receipt came and the interrupted turn ended: the messages Claude cancelled before they started are untaken (a message that had started stays delivered); a stop that comes while another of the run waits joins it (one interrupt is written, every stop gets the one result) |
//! | take back | a `cancel_async_message` control request | `DetachedForReplay` when Claude cancelled it, `NotDetached` when it had already taken it |
//! | approval decision | the `control_response` to the `can_use_tool` prompt | [`AgentInput::ApprovalResolved`] |
//!
//! A run ends ([`AgentInput::RunEnded`]) when its turn ended with nothing waiting (its
//! input is then closed and the process ends by itself) or when its process ends.
//! Claude 2.1.328 keeps messages queued behind a turn through a plain interrupt and runs
//! them as the next turn, which is why the stop asks it to cancel them and counts only
//! what it cancelled as untaken.

use outbox_core::adapter::{ReadHistoryRequest, StopRequest, TakeBackRequest};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;

use host_core::{
    Agent, AgentCall, AgentEffect, AgentInput, FileError, ProcessId, ProcessSpec, ReadId,
    WriteFailure, WriteId,
};
use outbox_core::adapter::{
    Capabilities, HistoryRead, SendKind, SendRequest, SendResult, StopResult, TakeBackResult,
};
use outbox_core::ids::{OperationId, RunId, SessionId};
use outbox_core::AttemptId;
use overlay_core::live::RunEventKind;
use overlay_core::store::{RowClass, StoredBlock};
use timeline_core::key::TargetId;
use timeline_core::rows::{ApprovalRequest, ApprovalResult};
use timeline_core::time::Millis;

use crate::file::transcript_path;
use crate::project::Output;
use crate::run::{send_result, ClaudeRun, SendState, WaitEnd};
use crate::stream::{MessageUuid, UserMessage};

/// The reply deadline of a send (OB-09: "the 30 s reply deadline").
pub const REPLY_DEADLINE: Millis = Millis(30_000);

/// How long a stop or a take-back waits for Claude's answer before it gives up (a stop
/// then kills the run's process).
pub const STOP_DEADLINE: Millis = Millis(10_000);

/// The largest transcript a history read loads.
pub const TRANSCRIPT_LIMIT: u64 = 256 * 1024 * 1024;

/// How [`ClaudeAgent`] starts Claude and finds its transcripts.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ClaudeConfig {
    /// The `claude` program with its environment (`HOME`, `ANTHROPIC_BASE_URL`, ...)
    /// and working directory; the stream-json arguments are added to it.
    pub spec: ProcessSpec,
    /// `~/.claude/projects` of the `HOME` Claude runs with.
    pub projects: PathBuf,
    /// The project directory as Claude sees it (its transcripts live under its slug).
    pub cwd: String,
}

impl ClaudeConfig {
    /// Claude started as `spec` in `cwd`, its transcripts under `projects`.
    pub fn new(spec: ProcessSpec, projects: impl Into<PathBuf>, cwd: impl Into<String>) -> Self {
        ClaudeConfig {
            spec,
            projects: projects.into(),
            cwd: cwd.into(),
        }
    }
}

/// A send waiting for a line that names it.
#[derive(Debug)]
struct PendingSend {
    attempt: AttemptId,
    uuid: MessageUuid,
    operation_id: OperationId,
    start: bool,
    /// The reply deadline, once written.
    deadline: Option<Millis>,
    /// Turn ends seen when it was written.
    results_at_write: u64,
}

/// The interrupt of a run and the stops waiting for it: a stop that comes while one
/// waits joins it (one interrupt is written), and every one gets the one result.
#[derive(Debug)]
struct PendingStop {
    /// Every stop attempt waiting, oldest first.
    attempts: Vec<AttemptId>,
    request_id: String,
    deadline: Millis,
    /// Whether a turn ran when the interrupt was written.
    was_busy: bool,
    /// Turn ends seen when it was written.
    results_at_write: u64,
    /// Claude's receipt: the UUIDs it cancelled.
    receipt: Option<Vec<String>>,
}

#[derive(Debug)]
struct PendingTakeBack {
    attempt: AttemptId,
    deadline: Millis,
}

/// One run's process and what waits on it.
struct Live {
    process: ProcessId,
    run_id: RunId,
    run: ClaudeRun,
    sends: Vec<PendingSend>,
    /// Messages accepted (or delivered) in this run, by UUID: their operation, and
    /// whether their delivery was told.
    accepted: BTreeMap<String, (OperationId, bool)>,
    stop: Option<PendingStop>,
    take_backs: BTreeMap<String, PendingTakeBack>,
    /// Prompts told to the host, by request ID.
    asked: BTreeMap<String, ApprovalRequest>,
    /// Prompts the host decided.
    decided: BTreeSet<String>,
    results: u64,
    last_failed: bool,
    ended: bool,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live")
            .field("process", &self.process)
            .field("run_id", &self.run_id)
            .field("sends", &self.sends)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct ClaudeSession {
    claude_session: String,
    /// Whether Claude has a transcript of it, as the look before this start found.
    /// Every start looks first: `--resume` of a session Claude never wrote fails at
    /// once ("No conversation found"), and Claude 2.1.328 writes the transcript well
    /// after a message started (a run killed half a second in leaves none).
    started: Option<bool>,
    /// What to assume when the look fails (the session existed when it was added).
    resume: bool,
    live: Option<Live>,
}

/// Claude Code behind the agent seam. See the module doc.
#[derive(Debug)]
pub struct ClaudeAgent {
    config: ClaudeConfig,
    sessions: BTreeMap<SessionId, ClaudeSession>,
    /// What each write carries: its session, and the send it is, if one.
    writes: BTreeMap<WriteId, (SessionId, Option<String>)>,
    reads: BTreeMap<ReadId, (AttemptId, MessageUuid)>,
    /// Starts waiting to learn whether their session's transcript exists.
    probes: BTreeMap<ReadId, SendRequest>,
    /// Sends of a run whose process ended before their write was reported, by that
    /// write.
    orphans: BTreeMap<WriteId, AttemptId>,
    next_id: u64,
    out: VecDeque<AgentEffect>,
}

fn unadmitted(error: impl Into<String>) -> SendResult {
    SendResult::ProvenUnadmitted {
        error: error.into(),
    }
}

fn stored(block: timeline_core::Block, run: &RunId) -> StoredBlock {
    let class = if block.id.as_str().starts_with("thinking-") {
        RowClass::Status
    } else {
        RowClass::Ordinary
    };
    StoredBlock {
        block,
        class,
        run_id: Some(run.clone()),
    }
}

impl ClaudeAgent {
    /// An agent with no session.
    pub fn new(config: ClaudeConfig) -> ClaudeAgent {
        ClaudeAgent {
            config,
            sessions: BTreeMap::new(),
            writes: BTreeMap::new(),
            reads: BTreeMap::new(),
            probes: BTreeMap::new(),
            orphans: BTreeMap::new(),
            next_id: 1,
            out: VecDeque::new(),
        }
    }

    /// Serves `session` as the Claude session `claude_session` (a UUID). Before each run
    /// the agent looks for the session's transcript: a run resumes it (`--resume`) when
    /// it is there and creates it under that ID (`--session-id`) when it is not; `resume`
    /// is what it assumes when the look fails.
    pub fn add_session(&mut self, session: &SessionId, claude_session: &str, resume: bool) {
        self.sessions.insert(
            session.clone(),
            ClaudeSession {
                claude_session: claude_session.to_owned(),
                started: None,
                resume,
                live: None,
            },
        );
    }

    /// The transcript of `session`.
    pub fn transcript_of(&self, session: &SessionId) -> Option<PathBuf> {
        let s = self.sessions.get(session)?;
        Some(transcript_path(
            &self.config.projects,
            &self.config.cwd,
            &s.claude_session,
        ))
    }

    /// The process of `session`'s run, while one runs.
    pub fn process_of(&self, session: &SessionId) -> Option<ProcessId> {
        Some(self.sessions.get(session)?.live.as_ref()?.process)
    }

    fn id(&mut self) -> u64 {
        let n = self.next_id;
        self.next_id += 1;
        n
    }

    fn input(&mut self, input: AgentInput) {
        self.out.push_back(AgentEffect::Input(input));
    }

    fn write(
        &mut self,
        session: &SessionId,
        process: ProcessId,
        line: String,
        send: Option<String>,
    ) {
        let write = WriteId(self.id());
        let mut bytes = line.into_bytes();
        if bytes.last() == Some(&b'\n') {
            bytes.pop();
        }
        self.writes.insert(write, (session.clone(), send));
        self.out.push_back(AgentEffect::Write {
            process,
            write,
            line: bytes,
        });
    }

    fn send(&mut self, request: SendRequest) {
        // A start whose session's transcript may or may not exist: look first.
        if matches!(request.kind, SendKind::Start { .. }) {
            let probe = self
                .sessions
                .get(&request.session)
                .is_some_and(|s| s.started.is_none());
            if probe {
                let Some(path) = self.transcript_of(&request.session) else {
                    return;
                };
                let read = ReadId(self.id());
                self.probes.insert(read, request);
                // Limit 0: only whether the file is there.
                self.out.push_back(AgentEffect::ReadFile {
                    read,
                    path,
                    limit: 0,
                });
                return;
            }
        }
        self.send_now(request);
    }

    fn send_now(&mut self, request: SendRequest) {
        let result = |r: SendResult| AgentInput::SendResult {
            attempt: request.attempt,
            result: r,
        };
        let Ok(uuid) = MessageUuid::from_operation(&request.operation_id) else {
            return self.input(result(unadmitted(
                "The operation ID is not a UUID, which Claude needs",
            )));
        };
        if !request.request.attachments.is_empty() {
            return self.input(result(unadmitted(
                "Claude is sent text only; remove the attachments",
            )));
        }
        if request.rollback_before_send {
            return self.input(result(unadmitted(
                "Claude Code cannot replace its latest turn",
            )));
        }
        let Some(s) = self.sessions.get_mut(&request.session) else {
            return self.input(result(unadmitted(format!(
                "session {} is not served by this agent",
                request.session
            ))));
        };
        let claude_session = s.claude_session.clone();
        match &request.kind {
            SendKind::Start { run } => {
                if let Some(live) = &s.live {
                    if !live.ended {
                        return self.input(result(unadmitted(
                            "A Claude run is still active in this session",
                        )));
                    }
                    // A finished run whose process lingers: end it first, answering what
                    // still waited on it.
                    let process = live.process;
                    let waiting: Vec<AgentInput> = live
                        .take_backs
                        .values()
                        .map(|t| AgentInput::TakeBack {
                            attempt: t.attempt,
                            result: TakeBackResult::NotDetached {
                                reason: "The Claude run ended before it answered.".to_owned(),
                            },
                        })
                        .chain(live.asked.values().map(|r| AgentInput::ApprovalResolved {
                            request_id: r.request_id.clone(),
                            thread_id: r.thread_id.clone(),
                            turn_id: r.turn_id.clone(),
                            item_id: r.item_id.clone(),
                            result: Ok(ApprovalResult::ResolvedExternally),
                        }))
                        .collect();
                    for i in waiting {
                        self.out.push_back(AgentEffect::Input(i));
                    }
                    self.out.push_back(AgentEffect::Kill { process });
                }
                let flag = if s.started == Some(true) {
                    "--resume"
                } else {
                    "--session-id"
                };
                // The next start looks again.
                s.started = None;
                let process = ProcessId(self.next_id);
                self.next_id += 1;
                let spec = self.config.spec.clone().args([
                    "-p",
                    "--input-format",
                    "stream-json",
                    "--output-format",
                    "stream-json",
                    "--verbose",
                    "--replay-user-messages",
                    "--include-partial-messages",
                    "--permission-prompt-tool",
                    "stdio",
                    flag,
                    claude_session.as_str(),
                ]);
                let mut claude = ClaudeRun::new(run.clone(), &uuid, request.session.as_str(), 0);
                claude.set_claude_session(&claude_session);
                if let Some(s) = self.sessions.get_mut(&request.session) {
                    s.live = Some(Live {
                        process,
                        run_id: run.clone(),
                        run: claude,
                        sends: Vec::new(),
                        accepted: BTreeMap::new(),
                        stop: None,
                        take_backs: BTreeMap::new(),
                        asked: BTreeMap::new(),
                        decided: BTreeSet::new(),
                        results: 0,
                        last_failed: false,
                        ended: false,
                    });
                }
                self.out.push_back(AgentEffect::Spawn { process, spec });
            }
            SendKind::Steer { run } => {
                let open = s
                    .live
                    .as_ref()
                    .is_some_and(|l| &l.run_id == run && !l.ended && l.stop.is_none());
                if !open {
                    return self.input(result(unadmitted(
                        "The active run ended before the message was sent",
                    )));
                }
            }
        }
        let text = request.request.agent_text().to_owned();
        let mut message = UserMessage::new(uuid.clone(), text);
        message.session_id = Some(claude_session);
        let Some(live) = self
            .sessions
            .get_mut(&request.session)
            .and_then(|s| s.live.as_mut())
        else {
            return;
        };
        live.run.written(&uuid);
        let process = live.process;
        live.sends.push(PendingSend {
            attempt: request.attempt,
            uuid: uuid.clone(),
            operation_id: request.operation_id.clone(),
            start: matches!(request.kind, SendKind::Start { .. }),
            deadline: None,
            results_at_write: live.results,
        });
        self.write(
            &request.session,
            process,
            message.encode(),
            Some(uuid.as_str().to_owned()),
        );
    }

    fn stop(&mut self, attempt: AttemptId, session: &SessionId, run: &RunId, now: Millis) {
        // A start still looking for its transcript: it never starts.
        let probing: Vec<ReadId> = self
            .probes
            .iter()
            .filter(|(_, r)| {
                &r.session == session && matches!(&r.kind, SendKind::Start { run: x } if x == run)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in probing {
            if let Some(request) = self.probes.remove(&id) {
                self.input(AgentInput::SendResult {
                    attempt: request.attempt,
                    result: unadmitted("The run was stopped before Claude started"),
                });
            }
        }
        let id = self.id();
        let Some(live) = self
            .sessions
            .get_mut(session)
            .and_then(|s| s.live.as_mut())
            .filter(|l| &l.run_id == run && !l.ended)
        else {
            // No process of that run: it is over.
            return self.input(AgentInput::StopResult {
                attempt,
                result: StopResult::Stopped {
                    untaken: Vec::new(),
                },
            });
        };
        if let Some(waiting) = live.stop.as_mut() {
            // The interrupt is on its way: this stop waits for the same answer.
            waiting.attempts.push(attempt);
            return;
        }
        let request_id = format!("stop-{id}");
        let line = serde_json::json!({
            "type": "control_request",
            "request_id": request_id,
            "request": {"subtype": "interrupt", "cancel_queued": true},
        })
        .to_string();
        live.stop = Some(PendingStop {
            attempts: vec![attempt],
            request_id,
            deadline: now.saturating_add(STOP_DEADLINE),
            was_busy: live.run.is_busy(),
            results_at_write: live.results,
            receipt: None,
        });
        let process = live.process;
        self.write(session, process, line, None);
    }

    fn take_back(
        &mut self,
        attempt: AttemptId,
        session: &SessionId,
        op: &OperationId,
        now: Millis,
    ) {
        let id = self.id();
        let not = |reason: &str| AgentInput::TakeBack {
            attempt,
            result: TakeBackResult::NotDetached {
                reason: reason.to_owned(),
            },
        };
        let Ok(uuid) = MessageUuid::from_operation(op) else {
            return self.input(not("The operation ID is not a UUID"));
        };
        let Some(live) = self
            .sessions
            .get_mut(session)
            .and_then(|s| s.live.as_mut())
            .filter(|l| !l.ended)
        else {
            return self.input(not("No Claude run holds the message"));
        };
        let request_id = format!("take-back-{id}");
        let line = serde_json::json!({
            "type": "control_request",
            "request_id": request_id,
            "request": {"subtype": "cancel_async_message", "message_uuid": uuid.as_str()},
        })
        .to_string();
        live.take_backs.insert(
            request_id,
            PendingTakeBack {
                attempt,
                deadline: now.saturating_add(STOP_DEADLINE),
            },
        );
        let process = live.process;
        self.write(session, process, line, None);
    }

    fn read_history(&mut self, attempt: AttemptId, session: &SessionId, op: &OperationId) {
        let Ok(uuid) = MessageUuid::from_operation(op) else {
            return self.input(AgentInput::HistoryRead {
                attempt,
                read: HistoryRead::Missing,
            });
        };
        let Some(path) = self.transcript_of(session) else {
            return self.input(AgentInput::HistoryRead {
                attempt,
                read: HistoryRead::Unreadable,
            });
        };
        let read = ReadId(self.id());
        self.reads.insert(read, (attempt, uuid));
        self.out.push_back(AgentEffect::ReadFile {
            read,
            path,
            limit: TRANSCRIPT_LIMIT,
        });
    }

    fn resolve(
        &mut self,
        request: ApprovalRequest,
        decision: timeline_core::rows::Decision,
        now: Millis,
    ) {
        let holder = self.sessions.iter_mut().find_map(|(id, s)| {
            let live = s.live.as_mut()?;
            let holds = live
                .run
                .open_approvals()
                .any(|a| a.request_id == request.request_id);
            holds.then_some((id.clone(), live))
        });
        let answer = match holder {
            None => Err("Claude no longer waits for this decision.".to_owned()),
            Some((session, live)) => match live.run.resolve(&request.request_id, decision, now) {
                Ok((line, result)) => {
                    live.decided.insert(request.request_id.clone());
                    live.asked.remove(&request.request_id);
                    let process = live.process;
                    self.write(&session, process, line, None);
                    Ok(result)
                }
                Err(e) => Err(e.to_string()),
            },
        };
        self.input(AgentInput::ApprovalResolved {
            request_id: request.request_id,
            thread_id: request.thread_id,
            turn_id: request.turn_id,
            item_id: request.item_id,
            result: answer,
        });
    }

    /// A control response for one of our requests (a stop's receipt, a take-back's
    /// answer), if the line is one.
    fn control_response(&mut self, session: &SessionId, line: &[u8]) -> bool {
        if !line.windows(16).any(|w| w == b"control_response") {
            return false;
        }
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(line) else {
            return false;
        };
        if v["type"] != "control_response" {
            return false;
        }
        let id = v["response"]["request_id"].as_str().unwrap_or_default();
        let body = &v["response"]["response"];
        let Some(live) = self.sessions.get_mut(session).and_then(|s| s.live.as_mut()) else {
            return false;
        };
        if let Some(stop) = live.stop.as_mut().filter(|s| s.request_id == id) {
            let cancelled = body["cancelled"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|u| u.as_str().map(str::to_ascii_lowercase))
                        .collect()
                })
                .unwrap_or_default();
            stop.receipt = Some(cancelled);
            return true;
        }
        if let Some(t) = live.take_backs.remove(id) {
            let result = if body["cancelled"] == true {
                TakeBackResult::DetachedForReplay
            } else {
                TakeBackResult::NotDetached {
                    reason: "Claude had already taken the message.".to_owned(),
                }
            };
            self.input(AgentInput::TakeBack {
                attempt: t.attempt,
                result,
            });
            return true;
        }
        false
    }

    /// After a line or a write: outputs, settled sends, proofs, prompts, the stop, the
    /// run's end.
    fn settle(&mut self, session: &SessionId, now: Millis) {
        let Some(live) = self.sessions.get_mut(session).and_then(|s| s.live.as_mut()) else {
            return;
        };
        let mut inputs = Vec::new();
        let mut rows = Vec::new();
        while let Some(o) = live.run.poll_effect() {
            match o {
                // The host keeps the cards (from `ApprovalAsked`).
                Output::Row(b) if b.data.get("approval").is_some() => {}
                Output::Row(b) => rows.push(stored(b, &live.run_id)),
                Output::TurnEnded(r) => {
                    live.results += 1;
                    live.last_failed = r.is_error;
                }
                Output::Event(e) => inputs.extend(AgentInput::delta(session, e)),
                _ => {}
            }
        }
        if !rows.is_empty() {
            inputs.push(AgentInput::Rows {
                session: session.clone(),
                target: TargetId::main(session),
                rows,
            });
        }
        // Sends a line settled, or whose turn ended without naming them.
        let acceptance = live.run.acceptance(now);
        let mut still = Vec::new();
        for send in std::mem::take(&mut live.sends) {
            let state = live.run.state_of(&send.uuid);
            let turn_ended =
                send.start && send.deadline.is_some() && live.results > send.results_at_write;
            let settled = state.is_some_and(|s| s != SendState::Written);
            if !settled && !turn_ended {
                still.push(send);
                continue;
            }
            let end = if settled {
                WaitEnd::Settled
            } else {
                WaitEnd::TurnEnded
            };
            let result = send_result(state, &end, acceptance.clone());
            if matches!(result, SendResult::Accepted(_) | SendResult::Delivered) {
                let told = matches!(result, SendResult::Delivered);
                live.accepted.insert(
                    send.uuid.as_str().to_owned(),
                    (send.operation_id.clone(), told),
                );
            }
            inputs.push(AgentInput::SendResult {
                attempt: send.attempt,
                result,
            });
        }
        live.sends = still;
        // Accepted messages a later line proved.
        for (uuid, (op, told)) in &mut live.accepted {
            let delivered = MessageUuid::parse(uuid)
                .ok()
                .and_then(|u| live.run.state_of(&u))
                == Some(SendState::Delivered);
            if delivered && !*told {
                *told = true;
                inputs.push(AgentInput::DeliveryProof {
                    session: session.clone(),
                    operation_id: op.clone(),
                });
            }
        }
        // Prompts: new ones are asked, withdrawn ones settled elsewhere.
        let open: Vec<(ApprovalRequest, String)> = live
            .run
            .open_prompts()
            .map(|(r, s)| (r.clone(), s))
            .collect();
        for (request, summary) in &open {
            if !live.asked.contains_key(&request.request_id) {
                live.asked
                    .insert(request.request_id.clone(), request.clone());
                inputs.push(AgentInput::ApprovalAsked {
                    session: session.clone(),
                    target: TargetId::main(session),
                    run: Some(live.run_id.clone()),
                    request: request.clone(),
                    summary: summary.clone(),
                });
            }
        }
        let gone: Vec<String> = live
            .asked
            .keys()
            .filter(|id| !open.iter().any(|(r, _)| &r.request_id == *id))
            .cloned()
            .collect();
        for id in gone {
            if let Some(r) = live.asked.remove(&id) {
                inputs.push(AgentInput::ApprovalResolved {
                    request_id: r.request_id,
                    thread_id: r.thread_id,
                    turn_id: r.turn_id,
                    item_id: r.item_id,
                    result: Ok(ApprovalResult::ResolvedExternally),
                });
            }
        }
        // The stop: Claude's receipt came, and the interrupted turn ended (or none ran).
        let stop_done = live.stop.as_ref().is_some_and(|s| {
            s.receipt.is_some() && (!s.was_busy || live.results > s.results_at_write)
        });
        let mut close = false;
        if stop_done {
            if let Some(stop) = live.stop.take() {
                let mut untaken = untaken_ops(live, stop.receipt.as_deref().unwrap_or_default());
                untaken.dedup();
                for attempt in stop.attempts {
                    inputs.push(AgentInput::StopResult {
                        attempt,
                        result: StopResult::Stopped {
                            untaken: untaken.clone(),
                        },
                    });
                }
            }
        }
        // The run ends when its turn ended with nothing waiting.
        if !live.ended && live.stop.is_none() && live.sends.is_empty() && live.run.is_finished() {
            live.ended = true;
            close = true;
            let outcome = if live.last_failed {
                RunEventKind::Failed
            } else {
                RunEventKind::Completed
            };
            inputs.push(AgentInput::RunEnded {
                session: session.clone(),
                run: live.run_id.clone(),
                outcome,
                untaken: untaken_ops(live, &[]),
            });
        }
        let process = live.process;
        for i in inputs {
            self.input(i);
        }
        if close {
            self.out.push_back(AgentEffect::CloseInput { process });
        }
    }

    /// The run's process ended: what waits on it ends as the table says.
    fn exited(&mut self, session: &SessionId, reason: &str, now: Millis) {
        let Some(mut live) = self.sessions.get_mut(session).and_then(|s| s.live.take()) else {
            return;
        };
        // Lines read before the end count first, and what the projection held back.
        live.run.flush(now);
        if let Some(s) = self.sessions.get_mut(session) {
            s.live = Some(live);
        }
        self.settle(session, now);
        let Some(taken) = self.sessions.get_mut(session).and_then(|s| s.live.take()) else {
            return;
        };
        live = taken;
        let acceptance = live.run.acceptance(now);
        for send in std::mem::take(&mut live.sends) {
            let end = if send.deadline.is_some() {
                WaitEnd::Exited {
                    code: exit_code(reason),
                    stderr: reason.to_owned(),
                }
            } else {
                // Its write is not reported yet: the report answers it (never written:
                // proven unadmitted; else uncertain).
                let write = self
                    .writes
                    .iter()
                    .find(|(_, (s, u))| s == session && u.as_deref() == Some(send.uuid.as_str()))
                    .map(|(w, _)| *w);
                if let Some(write) = write {
                    self.writes.remove(&write);
                    self.orphans.insert(write, send.attempt);
                }
                continue;
            };
            let result = send_result(live.run.state_of(&send.uuid), &end, acceptance.clone());
            self.input(AgentInput::SendResult {
                attempt: send.attempt,
                result,
            });
        }
        if let Some(stop) = live.stop.take() {
            let untaken = untaken_ops(&live, stop.receipt.as_deref().unwrap_or_default());
            for attempt in stop.attempts {
                self.input(AgentInput::StopResult {
                    attempt,
                    result: StopResult::Stopped {
                        untaken: untaken.clone(),
                    },
                });
            }
        }
        for (_, t) in std::mem::take(&mut live.take_backs) {
            self.input(AgentInput::TakeBack {
                attempt: t.attempt,
                result: TakeBackResult::NotDetached {
                    reason: "Claude ended before it answered.".to_owned(),
                },
            });
        }
        for (_, r) in std::mem::take(&mut live.asked) {
            self.input(AgentInput::ApprovalResolved {
                request_id: r.request_id,
                thread_id: r.thread_id,
                turn_id: r.turn_id,
                item_id: r.item_id,
                result: Ok(ApprovalResult::ResolvedExternally),
            });
        }
        if !live.ended {
            // What waited in the run is uncertain: its history read decides.
            self.input(AgentInput::RunEnded {
                session: session.clone(),
                run: live.run_id.clone(),
                outcome: RunEventKind::Failed,
                untaken: Vec::new(),
            });
        }
    }

    fn session_of_process(&self, process: ProcessId) -> Option<SessionId> {
        self.sessions
            .iter()
            .find(|(_, s)| s.live.as_ref().is_some_and(|l| l.process == process))
            .map(|(id, _)| id.clone())
    }
}

/// The exit code a runtime's words for a process's end name (`... exit status: 1`,
/// `... exit code: 1`), if they name one; a signal or other words name none.
fn exit_code(reason: &str) -> Option<i32> {
    ["exit status: ", "exit code: "].iter().find_map(|k| {
        let at = reason.find(k)? + k.len();
        let digits: String = reason[at..]
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '-')
            .collect();
        digits.parse().ok()
    })
}

/// The operations of `cancelled` UUIDs (from a stop's receipt) and of the run's messages
/// Claude cancelled before they started.
fn untaken_ops(live: &Live, cancelled: &[String]) -> Vec<OperationId> {
    let mut uuids: BTreeSet<String> = cancelled.iter().cloned().collect();
    uuids.extend(live.run.untaken());
    uuids
        .iter()
        .filter_map(|u| live.accepted.get(u).map(|(op, _)| op.clone()))
        .collect()
}

impl Agent for ClaudeAgent {
    fn capabilities(&self) -> Capabilities {
        Capabilities::claude()
    }

    fn serves(&self, session: &SessionId) -> bool {
        self.sessions.contains_key(session)
    }

    fn handle_call(&mut self, call: AgentCall, now: Millis) {
        match call {
            AgentCall::Send(request) => self.send(request),
            AgentCall::ReadHistory(ReadHistoryRequest {
                attempt,
                session,
                operation_id,
                ..
            }) => self.read_history(attempt, &session, &operation_id),
            AgentCall::Stop(StopRequest {
                attempt,
                session,
                run,
            }) => self.stop(attempt, &session, &run, now),
            AgentCall::TakeBack(TakeBackRequest {
                attempt,
                session,
                operation_id,
                ..
            }) => self.take_back(attempt, &session, &operation_id, now),
            AgentCall::ResolveApproval {
                request, decision, ..
            } => self.resolve(request, decision, now),
            // Claude's tool calls do not wait on the host; Claude has no thread link.
            _ => {}
        }
    }

    fn handle_line(&mut self, process: ProcessId, line: &[u8], now: Millis) {
        let Some(session) = self.session_of_process(process) else {
            return;
        };
        if !self.control_response(&session, line) {
            if let Some(live) = self
                .sessions
                .get_mut(&session)
                .and_then(|s| s.live.as_mut())
            {
                live.run.handle_line(line, now);
                // Answers Claude is owed (refusals of requests this host does not serve).
                let mut owed = Vec::new();
                while let Some(a) = live.run.next_answer() {
                    owed.push(a.to_owned());
                    live.run.answered();
                }
                for a in owed {
                    self.write(&session, process, a, None);
                }
            }
        }
        self.settle(&session, now);
    }

    fn handle_line_too_long(&mut self, _process: ProcessId, _now: Millis) {}

    fn handle_exit(&mut self, process: ProcessId, reason: String, now: Millis) {
        if let Some(session) = self.session_of_process(process) {
            self.exited(&session, &reason, now);
        }
    }

    fn handle_written(
        &mut self,
        process: ProcessId,
        write: WriteId,
        result: Result<(), WriteFailure>,
        now: Millis,
    ) {
        if let Some(attempt) = self.orphans.remove(&write) {
            // A send whose run's process ended before its write was reported.
            let result = match result {
                Err(WriteFailure::NotWritten(reason)) => unadmitted(format!(
                    "The message could not be written to Claude: {reason}"
                )),
                _ => send_result(
                    Some(SendState::Written),
                    &WaitEnd::Exited {
                        code: None,
                        stderr: String::new(),
                    },
                    None,
                ),
            };
            self.input(AgentInput::SendResult { attempt, result });
            return;
        }
        let Some((session, send)) = self.writes.remove(&write) else {
            return;
        };
        let Some(live) = self
            .sessions
            .get_mut(&session)
            .and_then(|s| s.live.as_mut())
            .filter(|l| l.process == process)
        else {
            return;
        };
        let Some(uuid) = send else {
            return;
        };
        let Some(i) = live.sends.iter().position(|s| s.uuid.as_str() == uuid) else {
            return;
        };
        match result {
            Ok(()) => {
                live.sends[i].deadline = Some(now.saturating_add(REPLY_DEADLINE));
                self.settle(&session, now);
            }
            Err(failure) => {
                let send = live.sends.remove(i);
                let result = match failure {
                    WriteFailure::NotWritten(reason) => unadmitted(format!(
                        "The message could not be written to Claude: {reason}"
                    )),
                    other => send_result(
                        Some(SendState::Written),
                        &WaitEnd::WriteFailed(other.to_string()),
                        None,
                    ),
                };
                self.input(AgentInput::SendResult {
                    attempt: send.attempt,
                    result,
                });
            }
        }
    }

    fn handle_file(&mut self, read: ReadId, result: Result<Vec<u8>, FileError>, _now: Millis) {
        if let Some(request) = self.probes.remove(&read) {
            // Not there: a new session; there (any size): resume it; unreadable: as the
            // session was added.
            let exists = match &result {
                Ok(_) | Err(FileError::TooLarge { .. }) => true,
                Err(FileError::NotFound(_)) => false,
                Err(_) => self
                    .sessions
                    .get(&request.session)
                    .is_some_and(|s| s.resume),
            };
            if let Some(s) = self.sessions.get_mut(&request.session) {
                s.started = Some(exists);
            }
            return self.send_now(request);
        }
        let Some((attempt, uuid)) = self.reads.remove(&read) else {
            return;
        };
        let read = match result {
            Ok(bytes) => {
                if bytes
                    .split(|&b| b == b'\n')
                    .any(|l| crate::proof::is_user_entry(l, &uuid))
                {
                    HistoryRead::Found
                } else {
                    HistoryRead::Missing
                }
            }
            Err(_) => HistoryRead::Unreadable,
        };
        self.input(AgentInput::HistoryRead { attempt, read });
    }

    fn poll_effect(&mut self) -> Option<AgentEffect> {
        self.out.pop_front()
    }

    fn poll_timeout(&self) -> Option<Millis> {
        self.sessions
            .values()
            .filter_map(|s| s.live.as_ref())
            .flat_map(|l| {
                let sends = l.sends.iter().filter_map(|s| s.deadline);
                let stop = l.stop.as_ref().map(|s| s.deadline);
                let takes = l.take_backs.values().map(|t| t.deadline);
                sends.chain(stop).chain(takes)
            })
            .min()
    }

    fn handle_timeout(&mut self, now: Millis) {
        let sessions: Vec<SessionId> = self.sessions.keys().cloned().collect();
        for session in sessions {
            let Some(live) = self
                .sessions
                .get_mut(&session)
                .and_then(|s| s.live.as_mut())
            else {
                continue;
            };
            let mut inputs = Vec::new();
            let acceptance = live.run.acceptance(now);
            let (due, still): (Vec<_>, Vec<_>) = std::mem::take(&mut live.sends)
                .into_iter()
                .partition(|s| s.deadline.is_some_and(|d| d <= now));
            live.sends = still;
            for send in due {
                let waited = send.deadline.map_or(0, |d| {
                    now.as_u64()
                        .saturating_sub(d.as_u64())
                        .saturating_add(REPLY_DEADLINE.as_u64())
                });
                let result = send_result(
                    live.run.state_of(&send.uuid),
                    &WaitEnd::TimedOut { waited_ms: waited },
                    acceptance.clone(),
                );
                inputs.push(AgentInput::SendResult {
                    attempt: send.attempt,
                    result,
                });
            }
            let due_takes: Vec<String> = live
                .take_backs
                .iter()
                .filter(|(_, t)| t.deadline <= now)
                .map(|(id, _)| id.clone())
                .collect();
            for id in due_takes {
                if let Some(t) = live.take_backs.remove(&id) {
                    inputs.push(AgentInput::TakeBack {
                        attempt: t.attempt,
                        result: TakeBackResult::NotDetached {
                            reason: "Claude did not answer in time.".to_owned(),
                        },
                    });
                }
            }
            // A stop Claude did not settle in time: the run's process is killed; its
            // end answers the stop.
            let kill = live.stop.as_ref().is_some_and(|s| s.deadline <= now);
            let process = live.process;
            for i in inputs {
                self.input(i);
            }
            if kill {
                self.out.push_back(AgentEffect::Kill { process });
                if let Some(stop) = self
                    .sessions
                    .get_mut(&session)
                    .and_then(|s| s.live.as_mut())
                    .and_then(|l| l.stop.as_mut())
                {
                    // Answered when the process's end comes; not again by the clock.
                    stop.deadline = Millis(u64::MAX);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::exit_code;

    #[test]
    fn an_exit_code_is_read_from_the_words_only_when_they_name_one() {
        assert_eq!(exit_code("claude ended: exit status: 1"), Some(1));
        assert_eq!(exit_code("claude ended: exit code: 137"), Some(137));
        assert_eq!(exit_code("claude ended: signal: 9 (SIGKILL)"), None);
        assert_eq!(exit_code("ended"), None);
    }
}
