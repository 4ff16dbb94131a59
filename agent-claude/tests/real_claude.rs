//! `ClaudeAgent` against the real Claude Code of the pinned
//! `@anthropic-ai/claude-code`, offline against the scripted model on loopback, driven
//! by `scripted_model::drive::Blocking`. Needs the binary: `.ci/run` installs it;
//! without it these tests fail saying what to install.

#![allow(clippy::unwrap_used)] // a test: a failed step is a failed test
#![allow(clippy::disallowed_methods)] // reads the transcript and the temp dir

use outbox_core::adapter::{ReadHistoryRequest, StopRequest};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use agent_claude::{ClaudeAgent, ClaudeConfig, Transcript};
use host_core::{
    Agent, AgentCall, AgentEffect, AgentInput, FileError, ProcessId, ProcessSpec, ReadId,
    WriteFailure, WriteId,
};
use outbox_core::adapter::{
    AttemptId, Capabilities, HistoryRead, ProofKind, SendKind, SendRequest, SendResult,
};
use outbox_core::{MessageRequest, OperationId};
use scripted_model::drive::Blocking;
use scripted_model::ModelServer;
use timeline_core::key::{RunId, SessionId};
use timeline_core::rows::{ApprovalResult, Decision};
use timeline_core::time::Millis;

const CLAUDE_SESSION: &str = "7c2e9a41-3b5d-4f60-8a1b-2c3d4e5f6a7b";
const A: &str = "aaaaaaaa-0000-4000-8000-00000000000a";
const B: &str = "bbbbbbbb-0000-4000-8000-00000000000b";
const MINUTE: Duration = Duration::from_secs(60);

struct Rig<A: Agent = ClaudeAgent> {
    d: Blocking<A>,
    session: SessionId,
    home: std::path::PathBuf,
    _model: ModelServer,
}

impl Rig {
    fn new() -> Rig {
        Rig::with(|claude| claude)
    }
}

impl<A: Agent> Rig<A> {
    /// Claude as `wrap` makes it.
    fn with(wrap: impl FnOnce(ClaudeAgent) -> A) -> Rig<A> {
        let model = ModelServer::start().unwrap();
        let home = std::env::temp_dir().join(format!(
            "custody-agent-claude-real-{}-{}",
            std::process::id(),
            model.port()
        ));
        let project = home.join("project");
        std::fs::create_dir_all(&project).unwrap();
        let bin = scripted_model::agents::claude_bin().unwrap_or_else(|e| panic!("{e}"));
        let spec = ProcessSpec::new(bin)
            .env("HOME", home.as_os_str())
            .env("ANTHROPIC_BASE_URL", model.anthropic_base_url())
            .env("ANTHROPIC_API_KEY", "sk-ant-scripted")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .cwd(&project);
        let session = SessionId::new("s-1").unwrap();
        let mut agent = ClaudeAgent::new(ClaudeConfig::new(
            spec,
            home.join(".claude/projects"),
            project.display().to_string(),
        ));
        agent.add_session(&session, CLAUDE_SESSION, false);
        Rig {
            d: Blocking::new(wrap(agent)),
            session,
            home,
            _model: model,
        }
    }

    fn send(&mut self, op: &str, text: &str, kind: SendKind, attempt: u64) {
        self.d.call(AgentCall::Send(SendRequest {
            attempt: AttemptId(attempt),
            session: self.session.clone(),
            operation_id: OperationId::new(op).unwrap(),
            request: MessageRequest::text(text, "phone", Millis(0)),
            kind,
            rollback_before_send: false,
            fresh_thread: false,
        }));
    }

    fn read_history(&mut self, op: &str, attempt: u64) -> HistoryRead {
        self.d.call(AgentCall::ReadHistory(ReadHistoryRequest {
            attempt: AttemptId(attempt),
            session: self.session.clone(),
            operation_id: OperationId::new(op).unwrap(),
            proof: ProofKind::TranscriptUuid,
        }));
        self.d.until("the history read", MINUTE, |i| {
            i.iter().any(|i| matches!(i, AgentInput::HistoryRead { attempt: a, .. } if *a == AttemptId(attempt)))
        });
        self.d
            .inputs
            .iter()
            .find_map(|i| match i {
                AgentInput::HistoryRead { attempt: a, read } if *a == AttemptId(attempt) => {
                    Some(*read)
                }
                _ => None,
            })
            .unwrap()
    }
}

impl<A: Agent> Drop for Rig<A> {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.home);
    }
}

fn run() -> RunId {
    RunId::new("run-1").unwrap()
}

#[test]
fn a_message_real_claude_absorbs_mid_turn_is_found_in_its_history() {
    // AG-01, AG-02
    // OB-08: a message sent while a permission prompt waits joins the running turn;
    // Claude 2.1.328 records it as a `queued_command` attachment, not a user entry.
    let mut r = Rig::new();
    r.send(
        A,
        "Make the file [[tool]]",
        SendKind::Start { run: run() },
        1,
    );
    r.d.until("the permission prompt", MINUTE, |i| {
        i.iter()
            .any(|i| matches!(i, AgentInput::ApprovalAsked { .. }))
    });
    let request =
        r.d.inputs
            .iter()
            .find_map(|i| match i {
                AgentInput::ApprovalAsked { request, .. } => Some(request.clone()),
                _ => None,
            })
            .unwrap();
    r.send(B, "Also say done", SendKind::Steer { run: run() }, 2);
    r.d.until("the steer's acceptance", MINUTE, |i| {
        i.iter().any(|i| {
            matches!(
                i,
                AgentInput::SendResult {
                    attempt: AttemptId(2),
                    ..
                }
            )
        })
    });
    r.d.call(AgentCall::ResolveApproval {
        session: r.session.clone(),
        request,
        decision: Decision::Accept,
    });
    r.d.until("the run's end", MINUTE, |i| {
        i.iter().any(|i| matches!(i, AgentInput::RunEnded { .. }))
    });
    assert!(
        r.d.inputs.iter().any(|i| matches!(
            i,
            AgentInput::SendResult {
                attempt: AttemptId(2),
                result: SendResult::Accepted(_) | SendResult::Delivered
            }
        )),
        "{:?}",
        r.d.inputs
    );
    assert_eq!(r.read_history(A, 10), HistoryRead::Found);
    assert_eq!(
        r.read_history(B, 11),
        HistoryRead::Found,
        "the absorbed message"
    );
    assert_eq!(
        r.read_history("cccccccc-0000-4000-8000-00000000000c", 12),
        HistoryRead::Missing
    );
}

#[test]
fn real_claudes_interruption_marker_is_not_a_user_row() {
    // AG-01, AG-02
    // TL-01: `[Request interrupted by user]` is the Interrupted row, not the user's.
    let mut r = Rig::new();
    r.send(
        A,
        "Count slowly [[slow]]",
        SendKind::Start { run: run() },
        1,
    );
    r.d.until("the delivery", MINUTE, |i| {
        i.iter()
            .any(|i| matches!(i, AgentInput::DeliveryProof { .. }))
    });
    std::thread::sleep(Duration::from_millis(800));
    r.d.call(AgentCall::Stop(StopRequest {
        attempt: AttemptId(5),
        session: r.session.clone(),
        run: run(),
    }));
    r.d.until("the stop and the run's end", MINUTE, |i| {
        i.iter().any(|i| matches!(i, AgentInput::StopResult { .. }))
            && i.iter().any(|i| matches!(i, AgentInput::RunEnded { .. }))
    });
    let rows: Vec<&timeline_core::Block> =
        r.d.inputs
            .iter()
            .filter_map(|i| match i {
                AgentInput::Rows { rows, .. } => Some(rows.iter().map(|s| &s.block)),
                _ => None,
            })
            .flatten()
            .collect();
    let marker: Vec<_> = rows
        .iter()
        .filter(|b| b.data.to_string().contains("interrupted"))
        .collect();
    assert!(
        marker
            .iter()
            .all(|b| b.operation_id.is_none() && !b.id.as_str().starts_with("user-message")),
        "the marker became a user row: {marker:?}"
    );
    assert!(
        rows.iter().any(|b| b.data["text"] == "Interrupted"),
        "no Interrupted row among {rows:?}"
    );
}

/// `ClaudeAgent` with every line its processes print kept, to see what Claude said
/// beyond what the agent tells the host.
struct Recorder {
    claude: ClaudeAgent,
    lines: Rc<RefCell<Vec<String>>>,
}

impl Recorder {
    fn new(claude: ClaudeAgent) -> Recorder {
        Recorder {
            claude,
            lines: Rc::new(RefCell::new(Vec::new())),
        }
    }
}

impl Agent for Recorder {
    fn capabilities(&self) -> Capabilities {
        self.claude.capabilities()
    }
    fn serves(&self, session: &SessionId) -> bool {
        self.claude.serves(session)
    }
    fn handle_call(&mut self, call: AgentCall, now: Millis) {
        self.claude.handle_call(call, now);
    }
    fn handle_line(&mut self, process: ProcessId, line: &[u8], now: Millis) {
        self.lines
            .borrow_mut()
            .push(String::from_utf8_lossy(line).into_owned());
        self.claude.handle_line(process, line, now);
    }
    fn handle_line_too_long(&mut self, process: ProcessId, now: Millis) {
        self.claude.handle_line_too_long(process, now);
    }
    fn handle_exit(&mut self, process: ProcessId, reason: String, now: Millis) {
        self.claude.handle_exit(process, reason, now);
    }
    fn handle_written(
        &mut self,
        process: ProcessId,
        write: WriteId,
        result: Result<(), WriteFailure>,
        now: Millis,
    ) {
        self.claude.handle_written(process, write, result, now);
    }
    fn handle_file(&mut self, read: ReadId, result: Result<Vec<u8>, FileError>, now: Millis) {
        self.claude.handle_file(read, result, now);
    }
    fn poll_effect(&mut self) -> Option<AgentEffect> {
        self.claude.poll_effect()
    }
    fn poll_timeout(&self) -> Option<Millis> {
        self.claude.poll_timeout()
    }
    fn handle_timeout(&mut self, now: Millis) {
        self.claude.handle_timeout(now);
    }
}

#[test]
fn accepting_for_the_session_gives_real_claude_only_the_rule_for_this_session() {
    // AG-01, AG-02
    // RW-06: for a Bash call Claude Code 2.1.328 suggests a rule for
    // `.claude/settings.local.json`, a directory and the `acceptEdits` mode. The
    // decision covers the rule, for this session: no settings file is written and the
    // session's mode stays as it was.
    let mut r = Rig::with(Recorder::new);
    let lines = Rc::clone(&r.d.agent.lines);
    r.send(
        A,
        "Make the file [[tool]]",
        SendKind::Start { run: run() },
        1,
    );
    r.d.until("the permission prompt", MINUTE, |i| {
        i.iter()
            .any(|i| matches!(i, AgentInput::ApprovalAsked { .. }))
    });
    let request =
        r.d.inputs
            .iter()
            .find_map(|i| match i {
                AgentInput::ApprovalAsked { request, .. } => Some(request.clone()),
                _ => None,
            })
            .unwrap();
    assert!(
        request.allowed.contains(&Decision::AcceptForSession),
        "{request:?}"
    );
    let prompt = lines
        .borrow()
        .iter()
        .find(|l| l.contains("can_use_tool"))
        .cloned()
        .unwrap();
    assert!(
        prompt.contains("localSettings") && prompt.contains("acceptEdits"),
        "2.1.328 suggests a settings file and a mode: {prompt}"
    );
    r.d.call(AgentCall::ResolveApproval {
        session: r.session.clone(),
        request,
        decision: Decision::AcceptForSession,
    });
    r.d.until("the run's end", MINUTE, |i| {
        i.iter().any(|i| matches!(i, AgentInput::RunEnded { .. }))
    });
    assert!(
        r.d.inputs.iter().any(|i| matches!(
            i,
            AgentInput::ApprovalResolved {
                result: Ok(ApprovalResult::AcceptedForSession),
                ..
            }
        )),
        "{:?}",
        r.d.inputs
    );
    let answer =
        r.d.written
            .iter()
            .find(|w| w["type"] == "control_response")
            .unwrap();
    let updates = answer["response"]["response"]["updatedPermissions"]
        .as_array()
        .unwrap();
    assert!(!updates.is_empty(), "{answer}");
    assert!(
        updates
            .iter()
            .all(|u| u["type"] == "addRules" && u["destination"] == "session"),
        "{answer}"
    );
    let project = r.home.join("project");
    assert!(
        project.join("scripted-model-ran.txt").exists(),
        "the call ran"
    );
    assert!(
        !project.join(".claude/settings.local.json").exists(),
        "a settings file was written"
    );
    assert!(!r.home.join(".claude/settings.json").exists());
    let lines = lines.borrow();
    assert!(
        !lines
            .iter()
            .any(|l| l.contains(r#""permissionMode":"acceptEdits""#)),
        "the session's mode changed: {:?}",
        lines
            .iter()
            .filter(|l| l.contains("permissionMode"))
            .collect::<Vec<_>>()
    );
}

/// The user rows in `rows`, by key: the operation and the words.
fn user_rows<'a>(
    rows: impl Iterator<Item = &'a timeline_core::Block>,
) -> BTreeMap<String, (Option<String>, serde_json::Value)> {
    rows.filter(|b| b.operation_id.is_some())
        .map(|b| {
            (
                b.key().encoded(),
                (
                    b.operation_id.as_ref().map(|o| o.as_str().to_owned()),
                    b.data["text"].clone(),
                ),
            )
        })
        .collect()
}

#[test]
fn messages_real_claude_merges_are_one_user_row_live_as_in_its_transcript() {
    // AG-01, AG-02
    // TL-01, TL-02: B and C queued behind A's slow reply are merged by Claude 2.1.328
    // into one turn under C; its transcript has one user entry for them. The live rows
    // are the same: C's key, both texts, once.
    const C: &str = "cccccccc-0000-4000-8000-00000000000c";
    let mut r = Rig::new();
    r.send(A, "First. [[slow]]", SendKind::Start { run: run() }, 1);
    r.d.until("A's delivery", MINUTE, |i| {
        i.iter()
            .any(|i| matches!(i, AgentInput::DeliveryProof { .. }))
    });
    r.send(
        B,
        "Second, queued. [[text]]",
        SendKind::Steer { run: run() },
        2,
    );
    r.send(
        C,
        "Third, queued. [[text]]",
        SendKind::Steer { run: run() },
        3,
    );
    r.d.until("the run's end", MINUTE, |i| {
        i.iter().any(|i| matches!(i, AgentInput::RunEnded { .. }))
    });
    let mut live: BTreeMap<String, timeline_core::Block> = BTreeMap::new();
    for i in &r.d.inputs {
        if let AgentInput::Rows { rows, .. } = i {
            for row in rows {
                live.insert(row.block.key().encoded(), row.block.clone());
            }
        }
    }
    let path = r.d.agent.transcript_of(&r.session).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let mut t = Transcript::new();
    let used = t.feed(&bytes);
    t.finish(&bytes[used..]);
    let saved = t.blocks();
    let merged = saved.iter().any(|b| {
        b.operation_id.as_ref().map(|o| o.as_str()) == Some(C)
            && b.data["text"] == "Second, queued. [[text]]\nThird, queued. [[text]]"
    });
    assert!(
        merged,
        "Claude did not merge B into C: {saved:?} {:#?}",
        r.d.inputs
    );
    assert_eq!(user_rows(live.values()), user_rows(saved.iter()));
    assert_eq!(r.read_history(B, 10), HistoryRead::Found);
}
