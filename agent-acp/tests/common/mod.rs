//! The rig of the real-ACP-agent tests: one [`AcpAgent`] driven by the blocking
//! driver against a real agent program, offline against the scripted model server.

#![allow(dead_code, clippy::unwrap_used, clippy::disallowed_methods)]

use outbox_core::adapter::{ReadHistoryRequest, StopRequest};
use std::path::PathBuf;
use std::time::Duration;

use agent_acp::{AcpAgent, AcpConfig, AcpHistory};
use host_core::{AgentCall, AgentInput, ProcessSpec};
use outbox_core::adapter::{HistoryRead, ProofKind, SendKind, SendRequest, SendResult, StopResult};
use outbox_core::entry::MessageRequest;
use outbox_core::ids::{OperationId, RunId, SessionId};
use outbox_core::AttemptId;
use overlay_core::live::RunEventKind;
use overlay_core::source::HistorySource;
use scripted_model::agents::{claude_agent_acp_bin, codex_acp_bin, write_codex_acp_home};
use scripted_model::drive::Blocking;
use scripted_model::ModelServer;
use timeline_core::key::BlockType;
use timeline_core::rows::{ApprovalKind, ApprovalResult, Decision};
use timeline_core::time::Millis;

pub const MINUTE: Duration = Duration::from_secs(60);

pub struct Rig {
    pub d: Blocking<AcpAgent>,
    pub session: SessionId,
    pub history: AcpHistory,
}

/// A send of `text` as operation `op`, attempt `attempt`.
pub fn send_call(
    session: &SessionId,
    op: &str,
    text: &str,
    attempt: u64,
    kind: SendKind,
) -> AgentCall {
    AgentCall::Send(SendRequest {
        attempt: AttemptId(attempt),
        session: session.clone(),
        operation_id: OperationId::new(op).unwrap(),
        request: MessageRequest::text(text, "phone", Millis(0)),
        kind,
        rollback_before_send: false,
        fresh_thread: false,
    })
}

/// A start of the run `run-<op>`.
pub fn start(op: &str) -> SendKind {
    SendKind::Start {
        run: RunId::new(format!("run-{op}")).unwrap(),
    }
}

/// Which real ACP agent a rig runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    /// `codex-acp`.
    Codex,
    /// `claude-agent-acp`.
    Claude,
}

/// A home and a working directory, with the model server the home points at.
pub struct World {
    pub tmp: tempfile::TempDir,
    pub home: PathBuf,
    pub work: PathBuf,
    pub model: ModelServer,
    pub which: Which,
}

pub fn world(which: Which) -> World {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::create_dir_all(&home).unwrap();
    let model = ModelServer::start().unwrap();
    if which == Which::Codex {
        write_codex_acp_home(&home, &model).unwrap();
    }
    World {
        tmp,
        home,
        work,
        model,
        which,
    }
}

fn agent(w: &World, history: &AcpHistory) -> AcpAgent {
    let spec = match w.which {
        Which::Codex => ProcessSpec::new(codex_acp_bin().unwrap_or_else(|e| panic!("{e}")))
            .env("CODEX_HOME", &w.home)
            .env("SCRIPTED_MODEL_KEY", "scripted")
            .env("RUST_LOG", "error"),
        // `IS_SANDBOX`: the adapter runs Claude Code with a flag that refuses root
        // otherwise (CI runs as root).
        Which::Claude => ProcessSpec::new(claude_agent_acp_bin().unwrap_or_else(|e| panic!("{e}")))
            .env("ANTHROPIC_BASE_URL", w.model.anthropic_base_url())
            .env("ANTHROPIC_API_KEY", "scripted")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .env("IS_SANDBOX", "1"),
    };
    let spec = spec.env("HOME", &w.home).cwd(&w.work);
    AcpAgent::new(AcpConfig::new(spec, &w.work), history.clone())
}

pub fn rig(w: &World, acp_session: Option<&str>) -> Rig {
    let history = AcpHistory::new();
    let mut a = agent(w, &history);
    let session = SessionId::new("s1").unwrap();
    a.add_session(&session, acp_session);
    Rig {
        d: Blocking::new(a),
        session,
        history,
    }
}

impl Rig {
    pub fn send(&mut self, op: &str, text: &str, attempt: u64) {
        self.d
            .call(send_call(&self.session, op, text, attempt, start(op)));
    }

    pub fn until_run_ended(&mut self, op: &str) -> RunEventKind {
        let run = RunId::new(format!("run-{op}")).unwrap();
        self.d.until("the run's end", MINUTE, |i| {
            i.iter()
                .any(|i| matches!(i, AgentInput::RunEnded { run: r, .. } if *r == run))
        });
        self.d
            .inputs
            .iter()
            .find_map(|i| match i {
                AgentInput::RunEnded {
                    run: r, outcome, ..
                } if *r == run => Some(*outcome),
                _ => None,
            })
            .unwrap()
    }

    pub fn send_result(&self, attempt: u64) -> Option<SendResult> {
        self.d.inputs.iter().find_map(|i| match i {
            AgentInput::SendResult { attempt: a, result } if *a == AttemptId(attempt) => {
                Some(result.clone())
            }
            _ => None,
        })
    }

    pub fn read_history(&mut self, op: &str, attempt: u64) -> HistoryRead {
        self.d.call(AgentCall::ReadHistory(ReadHistoryRequest {
            attempt: AttemptId(attempt),
            session: self.session.clone(),
            operation_id: OperationId::new(op).unwrap(),
            proof: ProofKind::Unprovable,
        }));
        self.d.until("the history read", MINUTE, |i| {
            i.iter().any(
                |i| matches!(i, AgentInput::HistoryRead { attempt: a, .. } if *a == AttemptId(attempt)),
            )
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

    /// The text of every live reply row published, in order.
    pub fn live_replies(&self) -> Vec<String> {
        self.d
            .inputs
            .iter()
            .filter_map(|i| match i {
                AgentInput::Rows { rows, .. } => Some(rows),
                _ => None,
            })
            .flatten()
            .filter(|r| r.block.block_type == BlockType::AgentReply)
            .map(|r| r.block.data["text"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    pub fn history_text(&self) -> Vec<(BlockType, String)> {
        self.history
            .rows(&self.session)
            .iter()
            .map(|b| {
                (
                    b.block_type,
                    b.data["text"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }
}

// AG-03: a send through session/prompt, its reply streamed into one row, the turn's
// rows into history; the answer proves the message (history read: found).
pub fn a_message_streams_its_reply_and_the_turn_goes_to_history(which: Which) {
    let w = world(which);
    let mut r = rig(&w, None);
    r.send("op-1", "hello there", 1);
    assert_eq!(r.until_run_ended("op-1"), RunEventKind::Completed);
    assert!(
        matches!(r.send_result(1), Some(SendResult::Accepted(_))),
        "{:?}",
        r.send_result(1)
    );
    assert!(r.d.inputs.iter().any(|i| matches!(i,
        AgentInput::DeliveryProof { operation_id, .. } if operation_id.as_str() == "op-1")));
    let replies = r.live_replies();
    assert!(replies.len() >= 2, "the reply streams: {replies:?}");
    assert!(
        replies.last().unwrap().starts_with("Reply to: "),
        "{replies:?}"
    );
    assert!(
        replies.last().unwrap().ends_with("hello there"),
        "{replies:?}"
    );
    assert!(r.d.agent.acp_session_of(&r.session).is_some());
    let h = r.history_text();
    assert_eq!(h[0], (BlockType::User, "hello there".to_owned()), "{h:?}");
    let replies_saved: Vec<_> = h
        .iter()
        .filter(|(t, _)| *t == BlockType::AgentReply)
        .collect();
    assert_eq!(replies_saved.len(), 1, "{h:?}");
    assert_eq!(&replies_saved[0].1, replies.last().unwrap());
    // The user row carries the operation, so the history read finds it.
    assert_eq!(r.read_history("op-1", 2), HistoryRead::Found);
    assert_eq!(r.read_history("op-other", 3), HistoryRead::Unreadable);
    // The history as the host reads it: newest first.
    let mut source = r.history.source(&r.session);
    let page = source.read(None, 10).unwrap();
    assert_eq!(page.items.len(), h.len());
    assert_eq!(
        page.items.last().unwrap().blocks[0].block_type,
        BlockType::User
    );
}

// AG-03: a stop is session/cancel; the prompt is answered cancelled, the stop stopped.
pub fn a_stop_cancels_the_turn(which: Which) {
    let w = world(which);
    let mut r = rig(&w, None);
    r.send("op-slow", "[[slow]] count slowly", 1);
    r.d.until("the first words", MINUTE, |i| {
        i.iter().any(|i| {
            matches!(i, AgentInput::Rows { rows, .. }
            if rows.iter().any(|r| r.block.block_type == BlockType::AgentReply))
        })
    });
    r.d.call(AgentCall::Stop(StopRequest {
        attempt: AttemptId(2),
        session: r.session.clone(),
        run: RunId::new("run-op-slow").unwrap(),
    }));
    assert_eq!(r.until_run_ended("op-slow"), RunEventKind::Aborted);
    let stop = r.d.inputs.iter().find_map(|i| match i {
        AgentInput::StopResult { attempt, result } if *attempt == AttemptId(2) => Some(result),
        _ => None,
    });
    assert_eq!(
        stop,
        Some(&StopResult::Stopped {
            untaken: Vec::new()
        })
    );
    // The slow reply has eight parts; the stop came after the first.
    let last = r.live_replies().pop().unwrap();
    assert!(last.split_whitespace().count() < 8, "{last}");
}

// AG-03, RW-06: a permission request is an approval card of the shared model; the
// decision goes back as the agent's option.
pub fn a_permission_request_is_a_card_and_its_decision_runs_the_command(which: Which) {
    let w = world(which);
    let mut r = rig(&w, None);
    r.send("op-tool", "[[tool]] run it", 1);
    r.d.until("the card", MINUTE, |i| {
        i.iter()
            .any(|i| matches!(i, AgentInput::ApprovalAsked { .. }))
    });
    let (request, summary) =
        r.d.inputs
            .iter()
            .find_map(|i| match i {
                AgentInput::ApprovalAsked {
                    request, summary, ..
                } => Some((request.clone(), summary.clone())),
                _ => None,
            })
            .unwrap();
    assert_eq!(request.kind, ApprovalKind::CommandExecution);
    assert!(request.allowed.contains(&Decision::Accept), "{request:?}");
    assert!(request.allowed.contains(&Decision::Cancel));
    assert!(
        summary.contains("touch scripted-model-ran.txt"),
        "{summary}"
    );
    r.d.call(AgentCall::ResolveApproval {
        session: r.session.clone(),
        request: request.clone(),
        decision: Decision::Accept,
    });
    assert_eq!(r.until_run_ended("op-tool"), RunEventKind::Completed);
    let resolved = r.d.inputs.iter().find_map(|i| match i {
        AgentInput::ApprovalResolved {
            request_id, result, ..
        } if *request_id == request.request_id => Some(result.clone()),
        _ => None,
    });
    assert_eq!(resolved, Some(Ok(ApprovalResult::Accepted)));
    assert!(
        w.work.join("scripted-model-ran.txt").exists(),
        "the command ran"
    );
    let tools: Vec<_> = r
        .history_text()
        .into_iter()
        .filter(|(t, _)| *t == BlockType::Activity)
        .collect();
    assert_eq!(tools.len(), 1, "{tools:?}");
}

// AG-03: after a restart the session is loaded (session/load): its replay is history,
// never live output, and the next turn follows it with keys of its own.
pub fn a_loaded_session_replays_into_history_not_live(which: Which) {
    let w = world(which);
    let mut first = rig(&w, None);
    first.send("op-1", "first words", 1);
    assert_eq!(first.until_run_ended("op-1"), RunEventKind::Completed);
    let acp = first
        .d
        .agent
        .acp_session_of(&first.session)
        .unwrap()
        .to_owned();
    drop(first);

    let mut r = rig(&w, Some(&acp));
    r.send("op-2", "second words", 1);
    assert_eq!(r.until_run_ended("op-2"), RunEventKind::Completed);
    let live = r.live_replies();
    assert!(
        live.iter().all(|t| !t.contains("first words")),
        "the replay came live: {live:?}"
    );
    assert!(live.last().unwrap().ends_with("second words"), "{live:?}");
    let h = r.history_text();
    let users: Vec<_> = h.iter().filter(|(t, _)| *t == BlockType::User).collect();
    assert_eq!(users.len(), 2, "{h:?}");
    assert_eq!(users[0].1, "first words");
    assert_eq!(users[1].1, "second words");
    assert!(
        h.contains(&(BlockType::AgentReply, "Reply to: first words".to_owned())),
        "{h:?}"
    );
    // Each row once: the replayed turn and the new one have keys of their own.
    let rows = r.history.rows(&r.session);
    let mut keys: Vec<_> = rows.iter().map(|b| b.key()).collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), rows.len());
}

// AG-03, OB-08: the agent's process killed before it said a word about the message: the
// outcome is unknown, and nothing can prove it afterwards (held for the user, never sent
// again by itself).
pub fn a_message_whose_agent_died_before_a_word_is_uncertain_and_unprovable(which: Which) {
    let w = world(which);
    let mut r = rig(&w, None);
    r.send("op-hang", "[[hang]] wait", 1);
    // The user row is published when the prompt is written.
    r.d.until("the prompt written", MINUTE, |i| {
        i.iter().any(|i| matches!(i, AgentInput::Rows { .. }))
    });
    std::thread::sleep(Duration::from_millis(500));
    let p = r.d.agent.process().unwrap();
    let pid = r.d.pid(p).unwrap();
    let status = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(r.until_run_ended("op-hang"), RunEventKind::Failed);
    assert!(
        matches!(
            r.send_result(1),
            Some(SendResult::AdmissionUncertain { .. })
        ),
        "{:?}",
        r.send_result(1)
    );
    assert_eq!(r.read_history("op-hang", 2), HistoryRead::Unreadable);
}
