//! The Codex adapter and its process driver against `fake-codex`, which replays the real
//! app-server recordings of `tests/data` (the bytes Codex 0.147.0 wrote) and can be
//! told to die part way (see `src/bin/fake-codex.rs`).

#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // runs a process, reads files

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agent_codex::adapter::{AdapterEvent, CodexAdapter};
use agent_codex::driver::{Driver, DriverConfig, ReadLine};
use agent_codex::proof::Verdict;
use agent_codex::protocol::{ClientRequest, ServerNotification};
use outbox_core::adapter::{
    AgentAdapter, AttemptId, HistoryRead, SendKind, SendRequest, SendResult, StopResult,
};
use outbox_core::entry::MessageRequest;
use timeline_core::key::{OperationId, RunId, SessionId};
use timeline_core::rows::Decision;
use timeline_core::time::Millis;

const REC_02: &str = "anyagent-rs/codex-app-server/02-approvals-and-tools.jsonl";
const REC_03: &str = "anyagent-rs/codex-app-server/03-steer-and-queue.jsonl";

fn recording(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(rel)
}

fn fake(rel: &str, rollout: &Path, die: Option<&str>) -> DriverConfig {
    let mut c = DriverConfig::command(env!("CARGO_BIN_EXE_fake-codex"), Vec::<String>::new())
        .with_env("FAKE_CODEX_RECORDING", recording(rel))
        .with_env("FAKE_CODEX_ROLLOUT", rollout)
        .with_reply_timeout(Duration::from_secs(20));
    if let Some(d) = die {
        c = c.with_env("FAKE_CODEX_DIE", d);
    }
    c
}

fn session() -> SessionId {
    SessionId::new("session-1").expect("a session ID")
}

fn run(n: u32) -> RunId {
    RunId::new(format!("run-{n}")).expect("a run ID")
}

fn op(id: &str) -> OperationId {
    OperationId::new(id).expect("an operation ID")
}

fn send_request(attempt: u64, id: &str, text: &str, kind: SendKind) -> SendRequest {
    SendRequest {
        attempt: AttemptId(attempt),
        session: session(),
        operation_id: op(id),
        request: MessageRequest::text(text, "composer", Millis(1)),
        kind,
        rollback_before_send: false,
        fresh_thread: false,
    }
}

fn open(
    rel: &str,
    rollout: &Path,
    die: Option<&str>,
    approval: &str,
    sandbox: &str,
) -> CodexAdapter {
    let mut codex = CodexAdapter::start(fake(rel, rollout, die), "anyagent-probe", "0.0.1")
        .expect("the fake starts and answers initialize");
    let thread = codex
        .open_thread(
            &session(),
            ClientRequest::ThreadStart {
                cwd: Some("/tmp/probe/cwd".into()),
                approval_policy: Some(approval.into()),
                sandbox: Some(sandbox.into()),
                model: None,
                model_provider: None,
            },
        )
        .expect("thread/start is answered");
    assert_eq!(thread.cli_version.as_deref(), Some("0.147.0"));
    // The recording names a rollout under its own CODEX_HOME; the fake writes this one.
    codex.set_rollout(&session(), rollout);
    codex
}

/// Pumps events until `done` says so (or the deadline), returning them all.
fn pump_until(
    codex: &mut CodexAdapter,
    mut done: impl FnMut(&AdapterEvent) -> bool,
) -> Vec<AdapterEvent> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        if let Some(e) = codex.pump(Duration::from_millis(200)) {
            let stop = done(&e);
            seen.push(e);
            if stop {
                return seen;
            }
        }
    }
    panic!("no such event; seen: {seen:#?}");
}

fn turn_completed(e: &AdapterEvent) -> bool {
    matches!(e, AdapterEvent::Notification { notification, .. }
        if matches!(notification.body, ServerNotification::TurnCompleted { .. }))
}

fn delivered(events: &[AdapterEvent], id: &str) -> Option<Verdict> {
    events.iter().find_map(|e| match e {
        AdapterEvent::Delivery {
            operation_id,
            delivery,
        } if operation_id.as_str() == id => Some(delivery.clone()),
        _ => None,
    })
}

// OB-08: a send is accepted by its turn and proven by the replayed `userMessage` whose
// clientId is the operation; approvals are asked and answered; the rollout holds what
// was delivered.
#[test]
fn sends_are_accepted_then_proven_by_the_echo() {
    let dir = tempfile::tempdir().unwrap();
    let rollout = dir.path().join("rollout.jsonl");
    let mut codex = open(REC_02, &rollout, None, "untrusted", "read-only");
    assert_eq!(
        codex.diagnostics().agent_version.as_deref(),
        Some("0.147.0")
    );
    assert!(!codex.capabilities().replace_latest);

    let r = codex.send(&send_request(
        1,
        "m1",
        "Run the shell command `echo PEAR`, then reply DONE.",
        SendKind::Start { run: run(1) },
    ));
    let SendResult::Accepted(a) = r else {
        panic!("{r:?}")
    };
    assert_eq!(a.turn_id.as_str(), "01a04657-91bc-7371-9f8a-8f553c5ceb08");
    assert!(codex.vetoes_reclaim(&session(), &run(1)));
    let events = pump_until(&mut codex, turn_completed);
    assert_eq!(
        delivered(&events, "m1"),
        Some(Verdict::Delivered {
            turn_id: a.turn_id.as_str().to_owned()
        })
    );
    assert!(!codex.vetoes_reclaim(&session(), &run(1)), "the turn ended");

    // Turn 2: an approval, accepted.
    let r = codex.send(&send_request(
        2,
        "m2",
        "Write the single word PEAR into fruit.txt.",
        SendKind::Start { run: run(2) },
    ));
    assert!(matches!(r, SendResult::Accepted(_)), "{r:?}");
    let events = pump_until(&mut codex, |e| matches!(e, AdapterEvent::Approval { .. }));
    let Some(AdapterEvent::Approval { session: s, ask }) = events.last().cloned() else {
        panic!()
    };
    assert_eq!(s, Some(session()));
    codex
        .answer_approval(&ask.request_id, Decision::Accept)
        .unwrap();
    assert!(
        codex
            .answer_approval(&ask.request_id, Decision::Accept)
            .is_err(),
        "one answer per approval"
    );
    let mut events_2 = events;
    events_2.extend(pump_until(&mut codex, turn_completed));
    assert!(matches!(
        delivered(&events_2, "m2"),
        Some(Verdict::Delivered { .. })
    ));

    // Turn 3: an approval, declined.
    let r = codex.send(&send_request(
        3,
        "m3",
        "Write the single word BERRY into berry.txt.",
        SendKind::Start { run: run(3) },
    ));
    assert!(matches!(r, SendResult::Accepted(_)), "{r:?}");
    let events = pump_until(&mut codex, |e| matches!(e, AdapterEvent::Approval { .. }));
    let Some(AdapterEvent::Approval { ask, .. }) = events.last().cloned() else {
        panic!()
    };
    codex
        .answer_approval(&ask.request_id, Decision::Decline)
        .unwrap();
    let events = pump_until(&mut codex, turn_completed);
    let declined = events.iter().any(|e| matches!(e, AdapterEvent::Notification { notification, .. }
        if matches!(&notification.body, ServerNotification::ItemCompleted { item: agent_codex::protocol::ThreadItem::FileChange { status: agent_codex::protocol::ItemStatus::Declined, .. }, .. })));
    assert!(declined, "the file change is declined");

    // The recording ends: the process exits, and says so once.
    let end = pump_until(&mut codex, |e| matches!(e, AdapterEvent::Exited { .. }));
    assert!(matches!(end.last(), Some(AdapterEvent::Exited { .. })));
    assert!(!codex.is_running());
    // After the end, a send writes nothing: proven unadmitted.
    let r = codex.send(&send_request(4, "m4", "x", SendKind::Start { run: run(4) }));
    assert!(matches!(r, SendResult::ProvenUnadmitted { .. }), "{r:?}");

    // The rollout (written as Codex writes it) holds the delivered messages only.
    for id in ["m1", "m2", "m3"] {
        assert_eq!(
            codex.read_history(&session(), &op(id)),
            HistoryRead::Found,
            "{id}"
        );
    }
    assert_eq!(
        codex.read_history(&session(), &op("m4")),
        HistoryRead::Missing
    );
    let other = SessionId::new("no-such-session").unwrap();
    assert_eq!(
        codex.read_history(&other, &op("m1")),
        HistoryRead::Unreadable
    );
}

// OB-08, OB-09: a steer and a mid-turn turn/start land in the running turn; a steer
// for a turn that is not running is proven unadmitted (-32600, the recorded answer).
#[test]
fn steers_land_in_the_running_turn() {
    let dir = tempfile::tempdir().unwrap();
    let rollout = dir.path().join("rollout.jsonl");
    let mut codex = open(REC_03, &rollout, None, "never", "workspace-write");
    let r = codex.send(&send_request(
        1,
        "m1",
        "Run the shell command `sleep 12`, then reply DONE.",
        SendKind::Start { run: run(1) },
    ));
    let SendResult::Accepted(first) = r else {
        panic!("{r:?}")
    };
    let mut events = pump_until(&mut codex, |e| matches!(e, AdapterEvent::Delivery { .. }));
    let r = codex.send(&send_request(
        2,
        "m2",
        "Also say KIWI.",
        SendKind::Steer { run: run(1) },
    ));
    assert!(
        matches!(&r, SendResult::Accepted(a) if a.turn_id == first.turn_id),
        "{r:?}"
    );
    let r = codex.send(&send_request(
        3,
        "m3",
        "Say FIG.",
        SendKind::Start { run: run(2) },
    ));
    let SendResult::Accepted(phantom) = r else {
        panic!("{r:?}")
    };
    assert_ne!(phantom.turn_id, first.turn_id, "a turn that never runs");
    let r = codex.send(&send_request(
        4,
        "m4",
        "Stale.",
        SendKind::Steer { run: run(2) },
    ));
    assert!(
        matches!(&r, SendResult::ProvenUnadmitted { error } if error.contains("-32600")),
        "{r:?}"
    );
    events.extend(pump_until(&mut codex, turn_completed));
    for id in ["m1", "m2", "m3"] {
        assert_eq!(
            delivered(&events, id),
            Some(Verdict::Delivered {
                turn_id: first.turn_id.as_str().to_owned()
            }),
            "{id}"
        );
    }
    assert_eq!(delivered(&events, "m4"), None);
    // Both runs are over: the running turn ended, and the mid-turn start landed in it.
    assert!(!codex.vetoes_reclaim(&session(), &run(1)));
    assert!(!codex.vetoes_reclaim(&session(), &run(2)));
}

// OB-09: the process dies while a steer waits for its answer: admission uncertain; the
// history read on the rollout then decides (Codex recorded it, or not).
#[test]
fn a_process_that_dies_mid_turn_leaves_the_send_uncertain_and_the_rollout_decides() {
    for (die, expected) in [
        ("after-record:2", HistoryRead::Found),
        ("before-answer:2", HistoryRead::Missing),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let rollout = dir.path().join("rollout.jsonl");
        let mut codex = open(REC_03, &rollout, Some(die), "never", "workspace-write");
        let r = codex.send(&send_request(
            1,
            "m1",
            "Run the shell command `sleep 12`, then reply DONE.",
            SendKind::Start { run: run(1) },
        ));
        assert!(matches!(r, SendResult::Accepted(_)), "{die}: {r:?}");
        pump_until(&mut codex, |e| matches!(e, AdapterEvent::Delivery { .. }));
        assert!(
            codex.vetoes_reclaim(&session(), &run(1)),
            "{die}: the turn runs"
        );
        let r = codex.send(&send_request(
            2,
            "m2",
            "Also say KIWI.",
            SendKind::Steer { run: run(1) },
        ));
        let SendResult::AdmissionUncertain { error } = &r else {
            panic!("{die}: {r:?}")
        };
        assert!(error.contains("exited"), "{die}: {error}");
        assert!(
            !codex.vetoes_reclaim(&session(), &run(1)),
            "{die}: the process is gone"
        );
        assert_eq!(codex.read_history(&session(), &op("m2")), expected, "{die}");
        assert_eq!(
            codex.read_history(&session(), &op("m1")),
            HistoryRead::Found,
            "{die}"
        );
        // A stop of a run whose process is gone: nothing to interrupt, and the steer is
        // not claimed as dropped (its history read decides).
        let stopped = codex.stop(&session(), &run(1));
        assert_eq!(stopped, StopResult::Stopped { untaken: vec![] }, "{die}");
    }
}

// The driver alone: lines in order, a deadline, the end of the process.
#[test]
fn the_driver_reads_lines_until_the_process_ends() {
    let dir = tempfile::tempdir().unwrap();
    let rollout = dir.path().join("rollout.jsonl");
    let mut d = Driver::spawn(&fake(REC_02, &rollout, Some("after-line:1"))).unwrap();
    // Nothing is printed before the first request.
    assert_eq!(
        d.read_line(Instant::now() + Duration::from_millis(100)),
        ReadLine::Timeout
    );
    d.write_line(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{}}\n")
        .unwrap();
    let ReadLine::Line(first) = d.read_line(Instant::now() + Duration::from_secs(20)) else {
        panic!()
    };
    let v: serde_json::Value = serde_json::from_slice(&first).unwrap();
    assert_eq!(v["id"], 1);
    assert!(v.get("_t").is_none(), "the recorder's field is not Codex's");
    let end = d.read_line(Instant::now() + Duration::from_secs(20));
    let ReadLine::Exited { reason } = end else {
        panic!("{end:?}")
    };
    assert!(reason.contains("exit status: 1"), "{reason}");
    assert!(!d.is_running());
    assert!(matches!(
        d.write_line(b"{}\n"),
        Err(agent_codex::driver::WriteError::NotWritten(_))
    ));
    assert!(matches!(
        d.read_line(Instant::now()),
        ReadLine::Exited { .. }
    ));
    // A program that does not exist does not start.
    assert!(Driver::spawn(&DriverConfig::command("/nonexistent/codex", ["app-server"])).is_err());
}
