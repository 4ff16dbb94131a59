//! `ClaudeAgent` against the real Claude Code of the pinned
//! `@anthropic-ai/claude-code`, offline against the scripted model on loopback, driven
//! by `scripted_model::drive::Blocking`. Needs the binary: `.ci/run` installs it;
//! without it these tests fail saying what to install.

#![allow(clippy::unwrap_used)] // a test: a failed step is a failed test
#![allow(clippy::disallowed_methods)] // reads the transcript and the temp dir

use std::time::Duration;

use agent_claude::{ClaudeAgent, ClaudeConfig};
use host_core::{AgentCall, AgentInput, ProcessSpec};
use outbox_core::adapter::{AttemptId, HistoryRead, ProofKind, SendKind, SendRequest, SendResult};
use outbox_core::{MessageRequest, OperationId};
use scripted_model::drive::Blocking;
use scripted_model::ModelServer;
use timeline_core::key::{RunId, SessionId};
use timeline_core::rows::Decision;
use timeline_core::time::Millis;

const CLAUDE_SESSION: &str = "7c2e9a41-3b5d-4f60-8a1b-2c3d4e5f6a7b";
const A: &str = "aaaaaaaa-0000-4000-8000-00000000000a";
const B: &str = "bbbbbbbb-0000-4000-8000-00000000000b";
const MINUTE: Duration = Duration::from_secs(60);

struct Rig {
    d: Blocking<ClaudeAgent>,
    session: SessionId,
    home: std::path::PathBuf,
    _model: ModelServer,
}

impl Rig {
    fn new() -> Rig {
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
            d: Blocking::new(agent),
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
        self.d.call(AgentCall::ReadHistory {
            attempt: AttemptId(attempt),
            session: self.session.clone(),
            operation_id: OperationId::new(op).unwrap(),
            proof: ProofKind::TranscriptUuid,
        });
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

impl Drop for Rig {
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
    r.d.call(AgentCall::Stop {
        attempt: AttemptId(5),
        session: r.session.clone(),
        run: run(),
    });
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
