//! The Claude adapter and its process driver against `fake-claude`, a program built
//! with this crate that prints the lines of the real recording
//! `anyagent-rs/claude-stream-json/01-single-prompt.jsonl` (Claude Code 2.1.241) as
//! recorded, and can be told to die mid-turn (OB-08, OB-09, OB-15, RW-06).
//!
//! Where a test needs lines the recording lacks (a `result` naming the message, a
//! permission prompt), it writes a recording of its own from the real lines plus
//! lines in the documented shapes (FORMATS.md §4), and says so.

#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // runs a process, writes files

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use agent_claude::adapter::{AdapterConfig, ApprovalError, ClaudeAdapter};
use agent_claude::driver::ClaudeCommand;
use agent_claude::file::transcript_path;
use agent_claude::project::Output;
use agent_claude::run::ResolveError;
use outbox_core::adapter::{
    AgentAdapter, AttemptId, HistoryRead, SendKind, SendRequest, SendResult, StopResult,
    TakeBackResult,
};
use outbox_core::entry::MessageRequest;
use outbox_core::ids::{OperationId, RunId, SessionId};
use timeline_core::key::BlockType;
use timeline_core::rows::{ApprovalKind, ApprovalResult, Decision};
use timeline_core::time::Millis;

const RECORDING: &str = "anyagent-rs/claude-stream-json/01-single-prompt.jsonl";
/// The Claude session of the recording (its `system/init`).
const CLAUDE_SESSION: &str = "194b28b7-726f-409a-ad92-33a1605dfa8b";
/// The working directory of the recording.
const CWD: &str = "/work";
const OP: &str = "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b";
const OP2: &str = "7a2d3b9f-4c5e-4f60-9bac-1d2e3f4a5b6c";

fn fake() -> &'static str {
    env!("CARGO_BIN_EXE_fake-claude")
}

fn session() -> SessionId {
    SessionId::new("app-session").expect("test set-up")
}

fn run_id() -> RunId {
    RunId::new("run-1").expect("test set-up")
}

fn clock() -> Millis {
    Millis(1_000)
}

struct Setup {
    dir: tempfile::TempDir,
    adapter: ClaudeAdapter,
}

impl Setup {
    fn transcript(&self) -> PathBuf {
        transcript_path(&self.dir.path().join("projects"), CWD, CLAUDE_SESSION)
    }
}

/// An adapter whose Claude is `fake-claude` with `flags`, replaying `recording`, with
/// its transcript where the adapter will look for it.
fn setup(recording: &Path, flags: &[&str], deadline: Duration) -> Setup {
    let dir = tempfile::tempdir().expect("test set-up");
    let projects = dir.path().join("projects");
    let transcript = transcript_path(&projects, CWD, CLAUDE_SESSION);
    std::fs::create_dir_all(transcript.parent().expect("test set-up")).expect("test set-up");
    let mut command = ClaudeCommand::claude();
    command.program = fake().into();
    let command = command
        .args(["--recording".as_ref(), recording.as_os_str()])
        .args(["--transcript".as_ref(), transcript.as_os_str()])
        .args(["--log".as_ref(), dir.path().join("control.log").as_os_str()])
        .args(flags.iter().copied());
    let mut config = AdapterConfig::new(projects, CWD);
    config.command = command;
    config.reply_deadline = deadline;
    config.stop_deadline = Duration::from_secs(2);
    config.clock = clock;
    Setup {
        dir,
        adapter: ClaudeAdapter::new(config),
    }
}

fn real_recording() -> PathBuf {
    common::data_dir().join(RECORDING)
}

/// A recording written by the test: the real lines, with `edit` applied to each.
fn written_recording(
    dir: &Path,
    edit: impl Fn(serde_json::Value) -> Vec<serde_json::Value>,
) -> PathBuf {
    let bytes = common::data(RECORDING);
    let mut out = String::new();
    for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        for v in edit(serde_json::from_slice(line).expect("test set-up")) {
            out.push_str(&v.to_string());
            out.push('\n');
        }
    }
    let path = dir.join("recording.jsonl");
    std::fs::write(&path, out).expect("test set-up");
    path
}

fn send(op: &str, kind: SendKind) -> SendRequest {
    SendRequest {
        attempt: AttemptId(1),
        session: session(),
        operation_id: OperationId::new(op).expect("test set-up"),
        request: MessageRequest::text("ping", "composer", Millis(1)),
        kind,
        rollback_before_send: false,
        fresh_thread: false,
    }
}

fn start(op: &str) -> SendRequest {
    send(op, SendKind::Start { run: run_id() })
}

fn outputs(adapter: &mut ClaudeAdapter) -> Vec<Output> {
    std::iter::from_fn(|| adapter.poll_effect())
        .map(|(_, o)| o)
        .collect()
}

fn pump_to_end(adapter: &mut ClaudeAdapter) {
    for _ in 0..200 {
        if !adapter.pump(&session(), Duration::from_millis(50)) {
            return;
        }
    }
    panic!("the run did not end");
}

// OB-08: the replayed echo of the line the adapter wrote proves delivery; the rest of
// the recorded turn projects to the reply row, and the run ends with the turn.
#[test]
fn the_replayed_echo_delivers_and_the_turn_projects() {
    let mut s = setup(&real_recording(), &["--echo"], Duration::from_secs(20));
    assert_eq!(s.adapter.send(&start(OP)), SendResult::Delivered);
    assert_eq!(s.adapter.claude_session(&session()), Some(CLAUDE_SESSION));
    pump_to_end(&mut s.adapter);
    let out = outputs(&mut s.adapter);
    let rows: Vec<_> = out
        .iter()
        .filter_map(|o| match o {
            Output::Row(b) => Some(b),
            _ => None,
        })
        .collect();
    assert_eq!(
        rows[0].block_type,
        BlockType::User,
        "the echo is the user row"
    );
    assert_eq!(rows[0].operation_id.as_ref().map(|o| o.as_str()), Some(OP));
    assert!(rows
        .iter()
        .any(|b| b.block_type == BlockType::AgentReply && b.data["text"] == "pong"));
    assert!(out
        .iter()
        .any(|o| matches!(o, Output::TurnEnded(r) if r.result.as_deref() == Some("pong"))));
    assert!(
        !s.adapter.vetoes_reclaim(&session(), &run_id()),
        "the process ended"
    );
    // The transcript holds the message: a history read finds it.
    assert_eq!(
        s.adapter
            .read_history(&session(), &OperationId::new(OP).unwrap()),
        HistoryRead::Found
    );
}

// The next run of the session resumes the Claude session the first one named, and
// starts only once the first one ended.
#[test]
fn the_next_run_resumes_the_claude_session() {
    let mut s = setup(&real_recording(), &["--echo"], Duration::from_secs(20));
    assert_eq!(s.adapter.send(&start(OP)), SendResult::Delivered);
    pump_to_end(&mut s.adapter);
    let second = send(
        OP2,
        SendKind::Start {
            run: RunId::new("run-2").unwrap(),
        },
    );
    assert_eq!(s.adapter.send(&second), SendResult::Delivered);
    let log = std::fs::read_to_string(s.dir.path().join("control.log")).unwrap();
    let argv: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("argv").is_some())
        .collect();
    assert_eq!(argv.len(), 2, "one process per run");
    let resumes = |v: &serde_json::Value| {
        let a: Vec<&str> = v["argv"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|x| x.as_str())
            .collect();
        a.windows(2).any(|w| w == ["--resume", CLAUDE_SESSION])
    };
    assert!(!resumes(&argv[0]));
    assert!(resumes(&argv[1]));
    for flag in ["-p", "--replay-user-messages", "--permission-prompt-tool"] {
        assert!(
            argv[0]["argv"]
                .as_array()
                .unwrap()
                .iter()
                .any(|x| x == flag),
            "{flag}"
        );
    }
}

// OB-08: without the echo, a `result` naming the message in `user_message_uuid`
// delivers. The recording's result line is given that field by this test (the shape
// FORMATS.md §4 documents); the other lines are the real ones.
#[test]
fn a_result_naming_the_message_delivers() {
    let dir = tempfile::tempdir().unwrap();
    let rec = written_recording(dir.path(), |mut v| {
        if v["type"] == "result" {
            v["user_message_uuid"] = "{{uuid}}".into();
        }
        vec![v]
    });
    let mut s = setup(&rec, &[], Duration::from_secs(20));
    assert_eq!(s.adapter.send(&start(OP)), SendResult::Delivered);
}

// OB-09: Claude dies mid-turn before any line names the message: uncertain. The history
// read then decides: the transcript holds the message (Claude took it before dying).
#[test]
fn a_death_mid_turn_is_uncertain_and_the_transcript_finds_it() {
    let mut s = setup(
        &real_recording(),
        &["--die-after", "5"],
        Duration::from_secs(20),
    );
    let SendResult::AdmissionUncertain { error } = s.adapter.send(&start(OP)) else {
        panic!("not uncertain");
    };
    assert!(error.contains("137"), "{error}");
    assert!(!s.adapter.vetoes_reclaim(&session(), &run_id()));
    assert_eq!(
        s.adapter
            .read_history(&session(), &OperationId::new(OP).unwrap()),
        HistoryRead::Found
    );
    assert!(s.transcript().exists());
}

// OB-09: Claude dies before it took the message: uncertain, and the history read finds
// nothing (missing), so the entry is held for the user.
#[test]
fn a_death_before_the_transcript_is_uncertain_and_missing() {
    let mut s = setup(
        &real_recording(),
        &["--die-before-transcript"],
        Duration::from_secs(20),
    );
    // The Claude session is known from an earlier run.
    s.adapter.set_claude_session(&session(), CLAUDE_SESSION);
    assert!(matches!(
        s.adapter.send(&start(OP)),
        SendResult::AdmissionUncertain { .. }
    ));
    assert_eq!(
        s.adapter
            .read_history(&session(), &OperationId::new(OP).unwrap()),
        HistoryRead::Missing
    );
    // A session whose Claude session is not known cannot be read.
    let other = SessionId::new("other").unwrap();
    assert_eq!(
        s.adapter
            .read_history(&other, &OperationId::new(OP).unwrap()),
        HistoryRead::Unreadable
    );
}

// OB-09: Claude prints nothing naming the message before the reply deadline:
// uncertain; the process still runs (it vetoes the stale reclaim) until a stop ends it.
// The recording here keeps only the real `system/init` line, so nothing names the
// message.
#[test]
fn the_reply_deadline_is_uncertain() {
    let dir = tempfile::tempdir().unwrap();
    let silent = written_recording(dir.path(), |v| {
        if v["type"] == "system" && v["subtype"] == "init" {
            vec![v]
        } else {
            vec![]
        }
    });
    let mut s = setup(&silent, &[], Duration::from_millis(300));
    let SendResult::AdmissionUncertain { error } = s.adapter.send(&start(OP)) else {
        panic!("not uncertain");
    };
    assert!(error.contains("did not confirm"), "{error}");
    assert!(
        s.adapter.vetoes_reclaim(&session(), &run_id()),
        "the process still runs"
    );
    assert_eq!(
        s.adapter.stop(&session(), &run_id()),
        StopResult::Stopped {
            untaken: Vec::new()
        }
    );
    assert!(!s.adapter.vetoes_reclaim(&session(), &run_id()));
}

// A run that delivered and then prints nothing more still delivered (the echo came
// first); the adapter's end kills the process.
#[test]
fn a_hanging_run_after_the_echo_is_delivered() {
    let mut s = setup(
        &real_recording(),
        &["--echo", "--hang"],
        Duration::from_secs(20),
    );
    assert_eq!(s.adapter.send(&start(OP)), SendResult::Delivered);
    assert!(s.adapter.vetoes_reclaim(&session(), &run_id()));
    assert!(
        s.adapter.pump(&session(), Duration::from_millis(100)),
        "still running"
    );
}

// OB-09: a program that cannot start proves nothing reached Claude; an operation ID
// that is not a UUID is refused before anything is written.
#[test]
fn failures_before_the_hand_off_are_proven_unadmitted() {
    let mut s = setup(&real_recording(), &[], Duration::from_secs(5));
    assert!(matches!(
        s.adapter.send(&start("op-1")),
        SendResult::ProvenUnadmitted { .. }
    ));
    let mut config = AdapterConfig::new(s.dir.path().join("projects"), CWD);
    config.command = ClaudeCommand::new(s.dir.path().join("no-such-claude"));
    let mut a = ClaudeAdapter::new(config);
    let SendResult::ProvenUnadmitted { error } = a.send(&start(OP)) else {
        panic!("not unadmitted");
    };
    assert!(error.contains("no-such-claude"), "{error}");
    // A steer needs the active run.
    assert!(matches!(
        a.send(&send(OP2, SendKind::Steer { run: run_id() })),
        SendResult::ProvenUnadmitted { .. }
    ));
    // Claude Code cannot take one queued message back.
    assert!(matches!(
        a.take_back(
            &session(),
            &OperationId::new(OP).unwrap(),
            &outbox_core::entry::Acceptance {
                run_id: run_id(),
                thread_id: outbox_core::ids::ThreadId::new("t").unwrap(),
                turn_id: outbox_core::ids::TurnId::new("u").unwrap(),
                accepted_at: Millis(1),
            }
        ),
        TakeBackResult::NotDetached { .. }
    ));
}

// OB-08: a steer written into the running turn is delivered by its echo; both messages
// are in the transcript.
#[test]
fn a_steer_joins_the_running_turn() {
    let mut s = setup(
        &real_recording(),
        &["--echo", "--pause-before", "6"],
        Duration::from_secs(20),
    );
    assert_eq!(s.adapter.send(&start(OP)), SendResult::Delivered);
    assert_eq!(
        s.adapter
            .send(&send(OP2, SendKind::Steer { run: run_id() })),
        SendResult::Delivered
    );
    pump_to_end(&mut s.adapter);
    for op in [OP, OP2] {
        assert_eq!(
            s.adapter
                .read_history(&session(), &OperationId::new(op).unwrap()),
            HistoryRead::Found
        );
    }
    // A steer for another run is refused before it is written.
    assert!(matches!(
        s.adapter.send(&send(
            OP2,
            SendKind::Steer {
                run: RunId::new("run-2").unwrap()
            }
        )),
        SendResult::ProvenUnadmitted { .. }
    ));
}

// OB-15: a stop writes the interrupt; the run ends and nothing was left queued.
#[test]
fn a_stop_interrupts_the_run() {
    let mut s = setup(
        &real_recording(),
        &["--echo", "--pause-before", "6"],
        Duration::from_secs(20),
    );
    assert_eq!(s.adapter.send(&start(OP)), SendResult::Delivered);
    assert!(s.adapter.vetoes_reclaim(&session(), &run_id()));
    assert_eq!(
        s.adapter.stop(&session(), &run_id()),
        StopResult::Stopped {
            untaken: Vec::new()
        }
    );
    assert!(!s.adapter.vetoes_reclaim(&session(), &run_id()));
    // A stop of a run that is over stops nothing.
    assert_eq!(
        s.adapter.stop(&session(), &run_id()),
        StopResult::Stopped {
            untaken: Vec::new()
        }
    );
}

// RW-06: Claude's permission prompt becomes the shared approval request and a pending
// card; the decision is written back as Claude's `control_response` and decides the
// card. The prompt line is written by this test in the documented shape (FORMATS.md
// §4: `can_use_tool{tool_name,input,tool_use_id,permission_suggestions}`), placed
// before the recorded reply.
#[test]
fn a_permission_prompt_is_answered_through_the_shared_model() {
    let dir = tempfile::tempdir().unwrap();
    let rec = written_recording(dir.path(), |v| {
        if v["type"] == "assistant" {
            let prompt = serde_json::json!({
                "type": "control_request",
                "request_id": "req-perm-1",
                "request": {
                    "subtype": "can_use_tool",
                    "tool_name": "Bash",
                    "input": {"command": "rm -rf build", "description": "Clean"},
                    "tool_use_id": "toolu_01perm",
                    "permission_suggestions": [{"type": "addRules", "rules": [{"toolName": "Bash"}], "behavior": "allow", "destination": "session"}],
                },
            });
            vec![prompt, v]
        } else {
            vec![v]
        }
    });
    let mut s = setup(
        &rec,
        &["--echo", "--await-control"],
        Duration::from_secs(20),
    );
    assert_eq!(s.adapter.send(&start(OP)), SendResult::Delivered);
    let mut approvals = Vec::new();
    for _ in 0..100 {
        s.adapter.pump(&session(), Duration::from_millis(50));
        approvals = s.adapter.open_approvals();
        if !approvals.is_empty() {
            break;
        }
    }
    assert_eq!(approvals.len(), 1);
    let a = &approvals[0];
    assert_eq!(a.kind, ApprovalKind::CommandExecution);
    assert_eq!(
        (a.thread_id.as_str(), a.turn_id.as_str(), a.item_id.as_str()),
        (CLAUDE_SESSION, OP, "toolu_01perm")
    );
    assert!(a.allowed.contains(&Decision::AcceptForSession));
    assert!(matches!(
        s.adapter.resolve_approval("someone-else", Decision::Accept),
        Err(ApprovalError::Refused(ResolveError::NotOpen(_)))
    ));
    assert_eq!(
        s.adapter
            .resolve_approval("req-perm-1", Decision::AcceptForSession)
            .unwrap(),
        ApprovalResult::AcceptedForSession
    );
    pump_to_end(&mut s.adapter);
    let cards: Vec<String> = outputs(&mut s.adapter)
        .into_iter()
        .filter_map(|o| match o {
            Output::Row(b) if b.data.get("approval").is_some() => {
                b.data["approval"]["status"].as_str().map(str::to_owned)
            }
            _ => None,
        })
        .collect();
    assert_eq!(cards, ["pending", "acceptedForSession"]);
    let log = std::fs::read_to_string(s.dir.path().join("control.log")).unwrap();
    let answer: serde_json::Value = log
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["type"] == "control_response")
        .expect("the answer reached Claude");
    assert_eq!(answer["response"]["request_id"], "req-perm-1");
    assert_eq!(answer["response"]["response"]["behavior"], "allow");
    assert_eq!(
        answer["response"]["response"]["updatedInput"]["command"],
        "rm -rf build"
    );
    assert_eq!(
        answer["response"]["response"]["updatedPermissions"][0]["type"],
        "addRules"
    );
}
