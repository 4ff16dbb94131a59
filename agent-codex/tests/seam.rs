//! `CodexAgent` behind the agent seam, driven line by line: what it writes for each
//! host call, what each Codex line becomes, and every way an answer fails to come.

#![allow(clippy::unwrap_used)] // a test: a bad ID or line is a failed test

use agent_codex::seam::REPLY_DEADLINE;
use agent_codex::{CodexAgent, ThreadConfig};
use host_core::{Agent, AgentCall, AgentEffect, AgentInput, ProcessId, ProcessSpec, WriteFailure};
use outbox_core::adapter::{
    AttemptId, HistoryRead, ProofKind, SendKind, SendRequest, SendResult, StopResult,
};
use outbox_core::adapter::{ReadHistoryRequest, StopRequest};
use outbox_core::{MessageRequest, OperationId};
use overlay_core::live::RunEventKind;
use serde_json::{json, Value};
use timeline_core::key::{RunId, SessionId};
use timeline_core::rows::{ApprovalKind, ApprovalRequest, ApprovalResult, Decision};
use timeline_core::time::Millis;

const THREAD: &str = "thr-1";
const TURN: &str = "turn-1";

/// The agent and what it asked for, with the writes it made read back as JSON.
struct Rig {
    agent: CodexAgent,
    session: SessionId,
    inputs: Vec<AgentInput>,
    /// Lines written, as JSON, with the write's ID.
    writes: Vec<(host_core::WriteId, Value)>,
    spawned: Vec<ProcessId>,
    killed: usize,
}

impl Rig {
    fn new() -> Rig {
        let session = SessionId::new("s-1").unwrap();
        let mut agent = CodexAgent::new(
            ProcessSpec::new("codex").args(["app-server"]),
            "test-host",
            "1.0",
        );
        agent.add_session(
            &session,
            ThreadConfig::new("/work").approval_policy("untrusted"),
        );
        Rig {
            agent,
            session,
            inputs: Vec::new(),
            writes: Vec::new(),
            spawned: Vec::new(),
            killed: 0,
        }
    }

    /// Drains the effects; every write succeeds unless `fail` says otherwise.
    fn drain_with(&mut self, now: Millis, mut fail: impl FnMut(&Value) -> Option<WriteFailure>) {
        while let Some(e) = self.agent.poll_effect() {
            match e {
                AgentEffect::Input(i) => self.inputs.push(i),
                AgentEffect::Spawn { process, .. } => self.spawned.push(process),
                AgentEffect::Write {
                    process,
                    write,
                    line,
                } => {
                    let v: Value = serde_json::from_slice(&line).unwrap();
                    let result = match fail(&v) {
                        Some(f) => Err(f),
                        None => Ok(()),
                    };
                    self.writes.push((write, v));
                    self.agent.handle_written(process, write, result, now);
                }
                AgentEffect::Kill { .. } => self.killed += 1,
                _ => {}
            }
        }
    }

    fn drain(&mut self, now: Millis) {
        self.drain_with(now, |_| None);
    }

    fn process(&self) -> ProcessId {
        *self.spawned.last().unwrap()
    }

    fn line(&mut self, v: Value, now: Millis) {
        let p = self.process();
        self.agent
            .handle_line(p, serde_json::to_string(&v).unwrap().as_bytes(), now);
        self.drain(now);
    }

    /// The last request written with `method`: its ID.
    fn request_id(&self, method: &str) -> u64 {
        self.writes
            .iter()
            .rev()
            .find(|(_, v)| v["method"] == method)
            .map(|(_, v)| v["id"].as_u64().unwrap())
            .unwrap_or_else(|| panic!("no {method} written: {:?}", self.writes))
    }

    fn answer(&mut self, method: &str, result: Value, now: Millis) {
        let id = self.request_id(method);
        self.line(json!({"id": id, "result": result}), now);
    }

    fn refuse(&mut self, method: &str, code: i64, message: &str, now: Millis) {
        let id = self.request_id(method);
        self.line(
            json!({"id": id, "error": {"code": code, "message": message}}),
            now,
        );
    }

    fn call(&mut self, call: AgentCall, now: Millis) {
        self.agent.handle_call(call, now);
        self.drain(now);
    }

    /// Initialize answered and the thread opened.
    fn ready(&mut self, now: Millis) {
        self.answer(
            "initialize",
            json!({"userAgent": "test/0.169.0 (linux)"}),
            now,
        );
        assert!(
            self.writes
                .iter()
                .any(|(_, v)| v["method"] == "initialized"),
            "initialized follows the answer"
        );
        self.answer(
            "thread/start",
            json!({"thread": {"id": THREAD, "path": "/tmp/rollout.jsonl", "turns": []}}),
            now,
        );
    }

    fn take_inputs(&mut self) -> Vec<AgentInput> {
        std::mem::take(&mut self.inputs)
    }
}

fn send(session: &SessionId, op: &str, kind: SendKind, attempt: u64) -> AgentCall {
    AgentCall::Send(SendRequest {
        attempt: AttemptId(attempt),
        session: session.clone(),
        operation_id: OperationId::new(op).unwrap(),
        request: MessageRequest::text(format!("text of {op}"), "phone", Millis(0)),
        kind,
        rollback_before_send: false,
        fresh_thread: false,
    })
}

fn run() -> RunId {
    RunId::new("run-1").unwrap()
}

fn start(session: &SessionId, op: &str, attempt: u64) -> AgentCall {
    send(session, op, SendKind::Start { run: run() }, attempt)
}

fn user_message_started(op: &str) -> Value {
    json!({"method": "item/started", "params": {
        "item": {"type": "userMessage", "id": format!("item-{op}"), "clientId": op,
                 "content": [{"type": "text", "text": "x", "text_elements": []}]},
        "threadId": THREAD, "turnId": TURN}})
}

fn turn_completed(status: &str) -> Value {
    json!({"method": "turn/completed", "params": {"threadId": THREAD,
        "turn": {"id": TURN, "items": [], "itemsView": "summary", "status": status,
                 "error": null}}})
}

/// A session with a run started and accepted.
fn running() -> Rig {
    let mut r = Rig::new();
    let s = r.session.clone();
    r.call(start(&s, "op-1", 1), Millis(1));
    r.ready(Millis(2));
    r.answer(
        "turn/start",
        json!({"turn": {"id": TURN, "items": [], "status": "inProgress"}}),
        Millis(3),
    );
    r.take_inputs();
    r
}

#[test]
fn a_first_send_starts_codex_opens_the_thread_and_is_accepted_then_proven() {
    // AG-01
    // OB-08, OB-09
    let mut r = Rig::new();
    let s = r.session.clone();
    r.call(start(&s, "op-1", 7), Millis(1_000));
    assert_eq!(r.spawned.len(), 1, "the first call starts Codex");
    assert_eq!(r.writes[0].1["method"], "initialize");
    r.ready(Millis(1_001));
    let turn_start = &r.writes.last().unwrap().1;
    assert_eq!(turn_start["method"], "turn/start");
    assert_eq!(turn_start["params"]["threadId"], THREAD);
    assert_eq!(turn_start["params"]["clientUserMessageId"], "op-1");
    assert!(
        r.inputs.is_empty(),
        "nothing is claimed before Codex answers"
    );
    r.answer(
        "turn/start",
        json!({"turn": {"id": TURN, "items": [], "status": "inProgress"}}),
        Millis(1_002),
    );
    let inputs = r.take_inputs();
    let [AgentInput::SendResult {
        attempt,
        result: SendResult::Accepted(a),
    }] = inputs.as_slice()
    else {
        panic!("{inputs:?}");
    };
    assert_eq!(*attempt, AttemptId(7));
    assert_eq!(a.turn_id.as_str(), TURN);
    assert_eq!(a.thread_id.as_str(), THREAD);
    assert_eq!(a.accepted_at, Millis(1_002));
    // The echo proves it; its row goes to the session's main target.
    r.line(user_message_started("op-1"), Millis(1_003));
    let inputs = r.take_inputs();
    assert!(inputs.iter().any(|i| matches!(i,
        AgentInput::DeliveryProof { operation_id, .. } if operation_id.as_str() == "op-1")));
    r.line(turn_completed("completed"), Millis(1_004));
    let inputs = r.take_inputs();
    assert!(
        inputs.iter().any(|i| matches!(i,
            AgentInput::RunEnded { run: rr, outcome: RunEventKind::Completed, untaken, .. }
                if *rr == run() && untaken.is_empty())),
        "{inputs:?}"
    );
}

#[test]
fn a_steer_names_the_runs_turn_and_a_refused_steer_is_proven_unadmitted() {
    // OB-09
    let mut r = running();
    let s = r.session.clone();
    r.call(
        send(&s, "op-2", SendKind::Steer { run: run() }, 2),
        Millis(10),
    );
    let steer = &r.writes.last().unwrap().1;
    assert_eq!(steer["method"], "turn/steer");
    assert_eq!(steer["params"]["expectedTurnId"], TURN);
    r.refuse(
        "turn/steer",
        -32600,
        "expected turn turn-1 is not the active turn",
        Millis(11),
    );
    let inputs = r.take_inputs();
    assert!(
        matches!(
            inputs.as_slice(),
            [AgentInput::SendResult {
                result: SendResult::ProvenUnadmitted { .. },
                ..
            }]
        ),
        "{inputs:?}"
    );
}

#[test]
fn a_send_that_gets_no_answer_within_the_reply_deadline_is_uncertain() {
    // OB-09: the 30 s reply deadline, from the write.
    let mut r = running();
    let s = r.session.clone();
    r.call(
        send(&s, "op-2", SendKind::Steer { run: run() }, 2),
        Millis(100),
    );
    assert_eq!(
        r.agent.poll_timeout(),
        Some(Millis(100).saturating_add(REPLY_DEADLINE))
    );
    r.agent.handle_timeout(Millis(100 + 29_999));
    r.drain(Millis(100 + 29_999));
    assert!(r.inputs.is_empty(), "one millisecond early: still waiting");
    r.agent.handle_timeout(Millis(100 + 30_000));
    r.drain(Millis(100 + 30_000));
    let inputs = r.take_inputs();
    assert!(
        matches!(
            inputs.as_slice(),
            [AgentInput::SendResult {
                result: SendResult::AdmissionUncertain { .. },
                ..
            }]
        ),
        "{inputs:?}"
    );
    // A late answer for it changes nothing.
    r.answer("turn/steer", json!({"turnId": TURN}), Millis(40_000));
    assert!(r.take_inputs().is_empty());
}

#[test]
fn a_write_that_took_no_byte_is_proven_unadmitted_and_a_broken_one_uncertain() {
    // OB-08: nothing written is proven unadmitted; a break after the first byte is not.
    for (failure, proven) in [
        (WriteFailure::NotWritten("pipe closed".into()), true),
        (WriteFailure::Broken("broken pipe".into()), false),
    ] {
        let mut r = running();
        let s = r.session.clone();
        r.agent.handle_call(
            send(&s, "op-2", SendKind::Steer { run: run() }, 2),
            Millis(10),
        );
        let f = failure.clone();
        r.drain_with(Millis(10), move |v| {
            (v["method"] == "turn/steer").then(|| f.clone())
        });
        let inputs = r.take_inputs();
        let [AgentInput::SendResult { result, .. }] = inputs.as_slice() else {
            panic!("{inputs:?}");
        };
        assert_eq!(
            matches!(result, SendResult::ProvenUnadmitted { .. }),
            proven,
            "{failure:?} gave {result:?}"
        );
        assert_eq!(r.agent.poll_timeout(), None, "answered once, nothing waits");
    }
}

#[test]
fn a_stop_that_races_the_turns_end_is_stopped_not_failed() {
    // AG-01
    // The real Codex 0.169 answers `turn/interrupt` for a turn that already ended with
    // -32600 "no active turn to interrupt".
    let mut r = running();
    let s = r.session.clone();
    r.call(
        AgentCall::Stop(StopRequest {
            attempt: AttemptId(5),
            session: s,
            run: run(),
        }),
        Millis(10),
    );
    assert_eq!(r.writes.last().unwrap().1["method"], "turn/interrupt");
    r.refuse(
        "turn/interrupt",
        -32600,
        "no active turn to interrupt",
        Millis(11),
    );
    let inputs = r.take_inputs();
    assert!(
        inputs.iter().any(|i| matches!(
            i,
            AgentInput::StopResult {
                attempt: AttemptId(5),
                result: StopResult::Stopped { .. }
            }
        )),
        "{inputs:?}"
    );
    assert!(
        !inputs.iter().any(|i| matches!(
            i,
            AgentInput::StopResult {
                result: StopResult::Failed { .. },
                ..
            }
        )),
        "{inputs:?}"
    );
    // The answer may come before the turn's end: the run ends with its real status.
    assert!(!inputs
        .iter()
        .any(|i| matches!(i, AgentInput::RunEnded { .. })));
    r.line(turn_completed("completed"), Millis(12));
    let inputs = r.take_inputs();
    assert!(
        matches!(
            inputs.as_slice(),
            [AgentInput::RunEnded {
                outcome: RunEventKind::Completed,
                ..
            }]
        ),
        "{inputs:?}"
    );
}

#[test]
fn a_turn_codex_calls_not_running_ends_after_the_grace_when_its_end_never_comes() {
    use agent_codex::seam::END_GRACE;
    for message in [
        "no active turn to interrupt",
        "expected active turn id turn-1 but found turn-2",
        "thread not found: thr-1",
    ] {
        let mut r = running();
        let s = r.session.clone();
        r.call(
            AgentCall::Stop(StopRequest {
                attempt: AttemptId(5),
                session: s,
                run: run(),
            }),
            Millis(10),
        );
        r.refuse("turn/interrupt", -32600, message, Millis(11));
        let inputs = r.take_inputs();
        assert!(
            matches!(
                inputs.as_slice(),
                [AgentInput::StopResult {
                    result: StopResult::Stopped { .. },
                    ..
                }]
            ),
            "{message}: {inputs:?}"
        );
        let due = Millis(11).saturating_add(END_GRACE);
        assert_eq!(r.agent.poll_timeout(), Some(due));
        r.agent.handle_timeout(due);
        r.drain(due);
        assert!(
            matches!(r.take_inputs().as_slice(), [AgentInput::RunEnded { .. }]),
            "{message}"
        );
        assert_eq!(r.agent.poll_timeout(), None);
    }
}

#[test]
fn a_stop_waits_for_the_interrupted_turn_and_names_the_steer_it_dropped() {
    // OB-08: an accepted steer the interrupted turn never echoed is untaken.
    let mut r = running();
    let s = r.session.clone();
    r.line(user_message_started("op-1"), Millis(4));
    r.call(
        send(&s, "op-2", SendKind::Steer { run: run() }, 2),
        Millis(5),
    );
    r.answer("turn/steer", json!({"turnId": TURN}), Millis(6));
    r.take_inputs();
    r.call(
        AgentCall::Stop(StopRequest {
            attempt: AttemptId(9),
            session: s,
            run: run(),
        }),
        Millis(10),
    );
    r.answer("turn/interrupt", json!({}), Millis(11));
    assert!(
        r.take_inputs().is_empty(),
        "the stop waits for the turn's end"
    );
    r.line(turn_completed("interrupted"), Millis(12));
    let inputs = r.take_inputs();
    let untaken: Vec<&str> = inputs
        .iter()
        .find_map(|i| match i {
            AgentInput::StopResult {
                result: StopResult::Stopped { untaken },
                ..
            } => Some(untaken.iter().map(OperationId::as_str).collect()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{inputs:?}"));
    assert_eq!(untaken, vec!["op-2"]);
    assert!(inputs.iter().any(|i| matches!(
        i,
        AgentInput::RunEnded {
            outcome: RunEventKind::Aborted,
            ..
        }
    )));
}

fn approval_asked(r: &mut Rig) -> ApprovalRequest {
    r.line(
        json!({"id": 77, "method": "item/commandExecution/requestApproval", "params": {
            "threadId": THREAD, "turnId": TURN, "itemId": "call-1",
            "reason": "needs approval", "command": "touch x"}}),
        Millis(20),
    );
    let inputs = r.take_inputs();
    let Some(AgentInput::ApprovalAsked {
        request,
        summary,
        run: asked_run,
        ..
    }) = inputs.into_iter().next()
    else {
        panic!("no approval asked");
    };
    assert_eq!(request.kind, ApprovalKind::CommandExecution);
    assert_eq!(summary, "touch x");
    assert_eq!(asked_run, Some(run()));
    request
}

#[test]
fn an_approval_is_answered_once_with_the_decision() {
    // RW-06
    let mut r = running();
    let s = r.session.clone();
    let request = approval_asked(&mut r);
    let decide = |d| AgentCall::ResolveApproval {
        session: s.clone(),
        request: request.clone(),
        decision: d,
    };
    r.call(decide(Decision::Accept), Millis(21));
    let (_, answer) = r.writes.last().unwrap();
    assert_eq!(answer["id"], 77);
    assert_eq!(answer["result"]["decision"], "accept");
    let inputs = r.take_inputs();
    assert!(
        matches!(
            inputs.as_slice(),
            [AgentInput::ApprovalResolved {
                result: Ok(ApprovalResult::Accepted),
                ..
            }]
        ),
        "{inputs:?}"
    );
    // A second decision is not written.
    let written = r.writes.len();
    r.call(decide(Decision::Decline), Millis(22));
    assert_eq!(r.writes.len(), written);
    assert!(matches!(
        r.take_inputs().as_slice(),
        [AgentInput::ApprovalResolved { result: Err(_), .. }]
    ));
}

#[test]
fn an_approval_codex_settled_takes_no_answer_and_shows_as_settled_elsewhere() {
    // AG-01
    // RW-06: after an interrupt Codex sends `serverRequest/resolved`; a decision after
    // it must not be written and reported as taken.
    let mut r = running();
    let s = r.session.clone();
    let request = approval_asked(&mut r);
    r.line(
        json!({"method": "serverRequest/resolved", "params": {"threadId": THREAD, "requestId": 77}}),
        Millis(21),
    );
    let inputs = r.take_inputs();
    assert!(
        matches!(
            inputs.as_slice(),
            [AgentInput::ApprovalResolved {
                result: Ok(ApprovalResult::ResolvedExternally),
                ..
            }]
        ),
        "{inputs:?}"
    );
    let written = r.writes.len();
    r.call(
        AgentCall::ResolveApproval {
            session: s,
            request,
            decision: Decision::Accept,
        },
        Millis(22),
    );
    assert_eq!(r.writes.len(), written, "no answer is written");
    assert!(matches!(
        r.take_inputs().as_slice(),
        [AgentInput::ApprovalResolved { result: Err(_), .. }]
    ));
}

#[test]
fn codex_ending_mid_send_leaves_it_uncertain_ends_the_run_and_starts_again_on_the_next_call() {
    // OB-08: after the write, the process's end is uncertain.
    let mut r = running();
    let s = r.session.clone();
    r.call(
        send(&s, "op-2", SendKind::Steer { run: run() }, 2),
        Millis(10),
    );
    let p = r.process();
    r.agent
        .handle_exit(p, "codex ended: signal 9".into(), Millis(11));
    r.drain(Millis(11));
    let inputs = r.take_inputs();
    assert!(
        inputs.iter().any(|i| matches!(
            i,
            AgentInput::SendResult {
                result: SendResult::AdmissionUncertain { .. },
                ..
            }
        )),
        "{inputs:?}"
    );
    assert!(
        inputs.iter().any(|i| matches!(i,
        AgentInput::RunEnded { outcome: RunEventKind::Failed, untaken, .. } if untaken.is_empty())),
        "{inputs:?}"
    );
    // The history read after a restart: a new process, the thread resumed, then read.
    r.call(
        AgentCall::ReadHistory(ReadHistoryRequest {
            attempt: AttemptId(3),
            session: s,
            operation_id: OperationId::new("op-2").unwrap(),
            proof: ProofKind::ClientIdEcho,
        }),
        Millis(20),
    );
    assert_eq!(r.spawned.len(), 2, "Codex is started again");
    r.answer(
        "initialize",
        json!({"userAgent": "test/0.169.0"}),
        Millis(21),
    );
    let read = &r.writes.last().unwrap().1;
    assert_eq!(read["method"], "thread/items/list");
    assert_eq!(read["params"]["threadId"], THREAD);
    assert_eq!(read["params"]["sortDirection"], "desc");
    assert_eq!(read["params"]["limit"], 100);
    r.answer(
        "thread/items/list",
        json!({"data": [{"turnId": TURN, "item": {"type": "userMessage", "id": "u2",
            "clientId": "op-2", "content": []}}], "nextCursor": null, "backwardsCursor": null}),
        Millis(22),
    );
    assert!(matches!(
        r.take_inputs().as_slice(),
        [AgentInput::HistoryRead {
            attempt: AttemptId(3),
            read: HistoryRead::Found
        }]
    ));
}

#[test]
fn a_send_waiting_for_its_thread_when_codex_ends_was_never_written() {
    // OB-08: nothing of the message was written: proven unadmitted.
    let mut r = Rig::new();
    let s = r.session.clone();
    r.call(start(&s, "op-1", 1), Millis(1));
    r.answer("initialize", json!({"userAgent": "x"}), Millis(2));
    let p = r.process();
    r.agent
        .handle_exit(p, "codex ended: exit status 1".into(), Millis(3));
    r.drain(Millis(3));
    let inputs = r.take_inputs();
    assert!(
        matches!(
            inputs.as_slice(),
            [AgentInput::SendResult {
                attempt: AttemptId(1),
                result: SendResult::ProvenUnadmitted { .. }
            }]
        ),
        "{inputs:?}"
    );
    assert!(!r.writes.iter().any(|(_, v)| v["method"] == "turn/start"));
}

#[test]
fn a_thread_codex_will_not_open_refuses_the_sends_that_waited_for_it() {
    let mut r = Rig::new();
    let s = r.session.clone();
    r.call(start(&s, "op-1", 1), Millis(1));
    r.answer("initialize", json!({"userAgent": "x"}), Millis(2));
    r.refuse(
        "thread/start",
        -32603,
        "model provider stub is not configured",
        Millis(3),
    );
    let inputs = r.take_inputs();
    let [AgentInput::SendResult {
        result: SendResult::ProvenUnadmitted { error },
        ..
    }] = inputs.as_slice()
    else {
        panic!("{inputs:?}");
    };
    assert!(
        error.contains("model provider stub is not configured"),
        "{error}"
    );
}

#[test]
fn a_call_for_a_session_it_does_not_serve_is_not_its_own() {
    let r = Rig::new();
    assert!(r.agent.serves(&r.session));
    assert!(!r.agent.serves(&SessionId::new("other").unwrap()));
}

#[test]
fn a_codex_0_169_command_approval_allows_decline_though_its_list_leaves_it_out() {
    // RW-06, from the real 0.169 request: `availableDecisions` lists accept, the
    // execpolicy amendment and cancel; Codex takes decline and acceptForSession too.
    let mut r = running();
    r.line(
        json!({"method": "item/commandExecution/requestApproval", "id": 0, "params": {
            "kind": "command", "threadId": THREAD, "turnId": TURN, "itemId": "call_2",
            "command": "/bin/bash -lc \"touch x\"",
            "proposedExecpolicyAmendment": ["touch", "x"],
            "availableDecisions": ["accept",
                {"acceptWithExecpolicyAmendment": {"execpolicy_amendment": ["touch", "x"]}},
                "cancel"]}}),
        Millis(20),
    );
    let inputs = r.take_inputs();
    let Some(AgentInput::ApprovalAsked { request, .. }) = inputs.into_iter().next() else {
        panic!("no approval asked");
    };
    for d in [
        Decision::Accept,
        Decision::AcceptForSession,
        Decision::AcceptBroadly,
        Decision::Decline,
        Decision::Cancel,
    ] {
        assert!(request.allowed.contains(&d), "{d:?} is not allowed");
    }
    assert_eq!(request.request_id, "0");
}

fn read_history(r: &mut Rig, attempt: u64, op: &str) {
    let s = r.session.clone();
    r.call(
        AgentCall::ReadHistory(ReadHistoryRequest {
            attempt: AttemptId(attempt),
            session: s,
            operation_id: OperationId::new(op).unwrap(),
            proof: ProofKind::ClientIdEcho,
        }),
        Millis(30),
    );
}

fn page(ops: &[&str], next: Option<&str>) -> Value {
    let data: Vec<Value> = ops
        .iter()
        .map(|op| {
            json!({"turnId": TURN, "item": {"type": "userMessage", "id": format!("u-{op}"),
            "clientId": op, "content": []}})
        })
        .collect();
    json!({"data": data, "nextCursor": next, "backwardsCursor": null})
}

#[test]
fn a_history_read_pages_newest_first_until_it_finds_the_message_or_the_last_page() {
    // AG-01
    // OB-08: `thread/items/list` pages, newest first; found on a later page; missing
    // only when the last page was read.
    let mut r = running();
    read_history(&mut r, 4, "op-old");
    r.answer(
        "thread/items/list",
        page(&["op-9", "op-8"], Some("c1")),
        Millis(31),
    );
    assert!(r.take_inputs().is_empty(), "the next page is asked first");
    let next = &r.writes.last().unwrap().1;
    assert_eq!(next["params"]["cursor"], "c1");
    r.answer(
        "thread/items/list",
        page(&["op-old"], Some("c2")),
        Millis(32),
    );
    assert!(matches!(
        r.take_inputs().as_slice(),
        [AgentInput::HistoryRead {
            attempt: AttemptId(4),
            read: HistoryRead::Found
        }]
    ));
    read_history(&mut r, 5, "op-never");
    r.answer("thread/items/list", page(&["op-9"], None), Millis(33));
    assert!(matches!(
        r.take_inputs().as_slice(),
        [AgentInput::HistoryRead {
            attempt: AttemptId(5),
            read: HistoryRead::Missing
        }]
    ));
}

#[test]
fn a_malformed_page_or_a_refused_read_is_unreadable_and_an_old_codex_is_read_whole() {
    // OB-08: an entry without its item fails the page: unreadable, never missing.
    let mut r = running();
    read_history(&mut r, 6, "op-1");
    r.answer(
        "thread/items/list",
        json!({"data": [{"turnId": TURN}], "nextCursor": null}),
        Millis(31),
    );
    assert!(matches!(
        r.take_inputs().as_slice(),
        [AgentInput::HistoryRead {
            read: HistoryRead::Unreadable,
            ..
        }]
    ));
    read_history(&mut r, 7, "op-1");
    r.refuse(
        "thread/items/list",
        -32600,
        "invalid cursor: garbage",
        Millis(32),
    );
    assert!(matches!(
        r.take_inputs().as_slice(),
        [AgentInput::HistoryRead {
            read: HistoryRead::Unreadable,
            ..
        }]
    ));
    // A Codex without the method: `thread/read` with the turns.
    read_history(&mut r, 8, "op-1");
    r.refuse(
        "thread/items/list",
        -32601,
        "thread/items/list is not supported yet",
        Millis(33),
    );
    assert_eq!(r.writes.last().unwrap().1["method"], "thread/read");
    r.answer(
        "thread/read",
        json!({"thread": {"id": THREAD, "turns": [{"id": TURN, "status": "completed", "items": []}]}}),
        Millis(34),
    );
    assert!(matches!(
        r.take_inputs().as_slice(),
        [AgentInput::HistoryRead {
            attempt: AttemptId(8),
            read: HistoryRead::Missing
        }]
    ));
}

#[test]
fn a_send_whose_process_ends_before_its_write_is_reported_is_answered_by_the_report() {
    // OB-08, AG-01: the end and the write's report come from two tasks; the send is
    // answered once, by what the report says.
    for (report, proven) in [
        (Err(WriteFailure::NotWritten("gone".into())), true),
        (Ok(()), false),
    ] {
        let mut r = running();
        let s = r.session.clone();
        r.agent.handle_call(
            send(&s, "op-2", SendKind::Steer { run: run() }, 2),
            Millis(10),
        );
        // Take the write without reporting it.
        let mut write = None;
        while let Some(e) = r.agent.poll_effect() {
            if let AgentEffect::Write {
                process, write: w, ..
            } = e
            {
                write = Some((process, w));
            }
        }
        let (p, w) = write.unwrap();
        r.agent.handle_exit(p, "codex ended".into(), Millis(11));
        r.drain(Millis(11));
        assert!(
            !r.take_inputs().iter().any(|i| matches!(
                i,
                AgentInput::SendResult {
                    attempt: AttemptId(2),
                    ..
                }
            )),
            "answered before its write's outcome is known"
        );
        r.agent.handle_written(p, w, report.clone(), Millis(12));
        r.drain(Millis(12));
        let inputs = r.take_inputs();
        let [AgentInput::SendResult { result, .. }] = inputs.as_slice() else {
            panic!("{inputs:?}");
        };
        assert_eq!(
            matches!(result, SendResult::ProvenUnadmitted { .. }),
            proven,
            "{report:?}: {result:?}"
        );
    }
}

#[test]
fn a_decision_the_request_does_not_allow_leaves_it_open_for_an_allowed_one() {
    // RW-06
    let mut r = running();
    let s = r.session.clone();
    let request = approval_asked(&mut r);
    let decide = |d| AgentCall::ResolveApproval {
        session: s.clone(),
        request: request.clone(),
        decision: d,
    };
    // No execpolicy amendment was proposed: accept-broadly is not allowed.
    r.call(decide(Decision::AcceptBroadly), Millis(21));
    assert!(matches!(
        r.take_inputs().as_slice(),
        [AgentInput::ApprovalResolved { result: Err(_), .. }]
    ));
    r.call(decide(Decision::Decline), Millis(22));
    assert!(matches!(
        r.take_inputs().as_slice(),
        [AgentInput::ApprovalResolved {
            result: Ok(ApprovalResult::Declined),
            ..
        }]
    ));
    assert_eq!(r.writes.last().unwrap().1["result"]["decision"], "decline");
}

#[test]
fn a_long_session_keeps_only_the_last_ended_runs() {
    // AG-01: memory follows the runs in flight, not the session's history.
    use agent_codex::seam::ENDED_KEPT;
    let mut r = Rig::new();
    let s = r.session.clone();
    let n = ENDED_KEPT + 10;
    for i in 0..n {
        let run = RunId::new(format!("run-{i}")).unwrap();
        let op = format!("op-{i}");
        let turn = format!("turn-{i}");
        r.call(
            send(&s, &op, SendKind::Start { run: run.clone() }, i as u64 + 1),
            Millis(1),
        );
        if i == 0 {
            r.ready(Millis(2));
        }
        r.answer(
            "turn/start",
            json!({"turn": {"id": turn, "items": [], "status": "inProgress"}}),
            Millis(3),
        );
        r.line(
            json!({"method": "turn/completed", "params": {"threadId": THREAD,
                "turn": {"id": turn, "items": [], "status": "completed", "error": null}}}),
            Millis(4),
        );
    }
    let ended = r
        .take_inputs()
        .iter()
        .filter(|i| matches!(i, AgentInput::RunEnded { .. }))
        .count();
    assert_eq!(ended, n);
    // A late stop of a recent run is answered stopped; one long gone is not this
    // agent's any more.
    let stop = |run: &str| {
        AgentCall::Stop(StopRequest {
            attempt: AttemptId(999),
            session: s.clone(),
            run: RunId::new(run).unwrap(),
        })
    };
    r.call(stop(&format!("run-{}", n - 1)), Millis(5));
    assert!(matches!(
        r.take_inputs().as_slice(),
        [AgentInput::StopResult {
            result: StopResult::Stopped { .. },
            ..
        }]
    ));
    r.call(stop("run-0"), Millis(6));
    assert!(matches!(
        r.take_inputs().as_slice(),
        [AgentInput::StopResult {
            result: StopResult::Failed { .. },
            ..
        }]
    ));
}

fn stop_call(session: &SessionId, attempt: u64) -> AgentCall {
    AgentCall::Stop(StopRequest {
        attempt: AttemptId(attempt),
        session: session.clone(),
        run: run(),
    })
}

/// The attempts of the stop results in `inputs`, with their results, in order.
fn stop_results(inputs: &[AgentInput]) -> Vec<(AttemptId, StopResult)> {
    inputs
        .iter()
        .filter_map(|i| match i {
            AgentInput::StopResult { attempt, result } => Some((*attempt, result.clone())),
            _ => None,
        })
        .collect()
}

fn writes_of(r: &Rig, method: &str) -> usize {
    r.writes
        .iter()
        .filter(|(_, v)| v["method"] == method)
        .count()
}

#[test]
fn a_thread_open_that_times_out_fails_only_its_sessions_sends_and_keeps_codex() {
    // AG-01, OB-08, OB-09: the thread of one session not opening in time fails the sends
    // that waited for it as proven unadmitted (no `turn/start` was written), and
    // nothing else: the one Codex process and the other sessions go on; a late answer
    // records no thread, and the session's next send opens its thread again.
    for resume in [None, Some("thr-old")] {
        let mut r = running();
        let s1 = r.session.clone();
        let s2 = SessionId::new("s-2").unwrap();
        let config = ThreadConfig::new("/work");
        r.agent.add_session(
            &s2,
            match resume {
                Some(t) => config.resume(t),
                None => config,
            },
        );
        let open = if resume.is_some() {
            "thread/resume"
        } else {
            "thread/start"
        };
        let p = r.process();
        let run2 = RunId::new("run-2").unwrap();
        r.call(
            send(&s2, "op-2", SendKind::Start { run: run2.clone() }, 2),
            Millis(100),
        );
        let late = r.request_id(open);
        // The other session's steer is written later and waits still.
        r.call(
            send(&s1, "op-3", SendKind::Steer { run: run() }, 3),
            Millis(20_000),
        );
        let due = Millis(100).saturating_add(REPLY_DEADLINE);
        assert_eq!(r.agent.poll_timeout(), Some(due));
        r.agent.handle_timeout(due);
        r.drain(due);
        let inputs = r.take_inputs();
        assert!(
            matches!(
                inputs.as_slice(),
                [AgentInput::SendResult {
                    attempt: AttemptId(2),
                    result: SendResult::ProvenUnadmitted { .. }
                }]
            ),
            "{open}: {inputs:?}"
        );
        assert_eq!(r.killed, 0, "{open}: Codex is not killed");
        assert_eq!(r.spawned.len(), 1, "{open}: nor started again");
        assert_eq!(r.agent.process(), Some(p));
        assert_eq!(writes_of(&r, "turn/start"), 1, "{open}: only s-1's turn");
        // The other session's run and steer are untouched.
        r.answer("turn/steer", json!({"turnId": TURN}), Millis(30_200));
        let inputs = r.take_inputs();
        assert!(
            matches!(
                inputs.as_slice(),
                [AgentInput::SendResult {
                    attempt: AttemptId(3),
                    result: SendResult::Accepted(_)
                }]
            ),
            "{open}: {inputs:?}"
        );
        // The late answer is dropped: no thread is recorded for it.
        r.line(
            json!({"id": late, "result": {"thread": {"id": "thr-late", "turns": []}}}),
            Millis(31_000),
        );
        assert!(r.take_inputs().is_empty());
        assert_eq!(r.agent.thread_of(&s2), resume);
        assert_eq!(writes_of(&r, "turn/start"), 1, "{open}: nothing was sent");
        // The next send opens the thread again, then starts its turn on it.
        let opened = writes_of(&r, open);
        r.call(
            send(&s2, "op-4", SendKind::Start { run: run2.clone() }, 4),
            Millis(32_000),
        );
        assert_eq!(writes_of(&r, open), opened + 1, "{open}: opened again");
        assert_ne!(r.request_id(open), late);
        r.answer(
            open,
            json!({"thread": {"id": "thr-2", "path": "/tmp/r2.jsonl", "turns": []}}),
            Millis(32_001),
        );
        let turn_start = &r.writes.last().unwrap().1;
        assert_eq!(turn_start["method"], "turn/start");
        assert_eq!(turn_start["params"]["threadId"], "thr-2");
        assert_eq!(turn_start["params"]["clientUserMessageId"], "op-4");
        // A notification of the thread the late answer named is no one's.
        r.line(
            json!({"method": "turn/completed", "params": {"threadId": "thr-late",
                "turn": {"id": "t-late", "items": [], "status": "completed", "error": null}}}),
            Millis(32_002),
        );
        assert!(r.take_inputs().is_empty(), "{open}");
    }
}

fn thread_closed(thread: &str) -> Value {
    json!({"method": "thread/closed", "params": {"threadId": thread}, "emittedAtMs": 1})
}

/// `thread/status/changed` of `thread` to a status of type `status`.
fn thread_status(thread: &str, status: &str) -> Value {
    json!({"method": "thread/status/changed", "params": {"threadId": thread,
        "status": {"type": status}}, "emittedAtMs": 1})
}

/// The inputs of a closed thread: the run on it ended failed with nothing untaken, and
/// its open approval `request` settled elsewhere.
fn assert_closed(inputs: &[AgentInput], request: &ApprovalRequest) {
    assert!(
        inputs.iter().any(|i| matches!(i,
            AgentInput::RunEnded { run: rr, outcome: RunEventKind::Failed, untaken, .. }
                if *rr == run() && untaken.is_empty())),
        "{inputs:?}"
    );
    assert!(
        inputs.iter().any(|i| matches!(i,
            AgentInput::ApprovalResolved { request_id, result: Ok(ApprovalResult::ResolvedExternally), .. }
                if *request_id == request.request_id)),
        "{inputs:?}"
    );
}

#[test]
fn a_thread_codex_closed_ends_its_run_and_is_resumed_before_the_next_turn() {
    // AG-01: Codex 0.169 unloads a thread and says `thread/closed` (its schema:
    // `ThreadClosedNotification {threadId}`); a `turn/start` on it would be refused
    // ("thread not found"). The run on it ends (failed: Codex told no outcome), its
    // open approval closes, and the next send resumes the thread first.
    let mut r = running();
    let s = r.session.clone();
    let request = approval_asked(&mut r);
    // Another thread's closing is not this session's.
    r.line(thread_closed("thr-other"), Millis(29));
    assert!(r.take_inputs().is_empty());
    r.line(thread_status(THREAD, "notLoaded"), Millis(30));
    r.line(thread_closed(THREAD), Millis(30));
    assert_closed(&r.take_inputs(), &request);
    // A decision after it is refused, nothing written.
    let writes = r.writes.len();
    r.call(
        AgentCall::ResolveApproval {
            session: s.clone(),
            request,
            decision: Decision::Accept,
        },
        Millis(31),
    );
    assert_eq!(r.writes.len(), writes);
    assert!(matches!(
        r.take_inputs().as_slice(),
        [AgentInput::ApprovalResolved { result: Err(_), .. }]
    ));
    // The next send resumes the same thread, then starts its turn.
    let run2 = RunId::new("run-2").unwrap();
    r.call(
        send(&s, "op-2", SendKind::Start { run: run2 }, 2),
        Millis(40),
    );
    let resume = &r.writes.last().unwrap().1;
    assert_eq!(resume["method"], "thread/resume");
    assert_eq!(resume["params"]["threadId"], THREAD);
    assert_eq!(
        writes_of(&r, "turn/start"),
        1,
        "no turn/start before the resume"
    );
    r.answer(
        "thread/resume",
        json!({"thread": {"id": THREAD, "path": "/tmp/rollout.jsonl", "turns": []}}),
        Millis(41),
    );
    let turn_start = &r.writes.last().unwrap().1;
    assert_eq!(turn_start["method"], "turn/start");
    assert_eq!(turn_start["params"]["threadId"], THREAD);
    assert_eq!(r.agent.thread_of(&s), Some(THREAD));
}

#[test]
fn a_thread_codex_reports_not_loaded_is_closed_even_when_thread_closed_never_comes() {
    // AG-01: `thread/status/changed` with `notLoaded` says Codex unloaded the thread (its
    // schema: `NotLoadedThreadStatus`). Without the `thread/closed` that 0.169 sends
    // next, the run on it still ends, its approval closes, and the next send resumes the
    // thread before its `turn/start`; the `thread/closed` that may follow changes nothing.
    let mut r = running();
    let s = r.session.clone();
    let request = approval_asked(&mut r);
    // An idle status of the thread is no closing.
    r.line(thread_status(THREAD, "idle"), Millis(29));
    assert!(
        !r.take_inputs()
            .iter()
            .any(|i| matches!(i, AgentInput::RunEnded { .. })),
        "idle is not notLoaded"
    );
    r.line(thread_status(THREAD, "notLoaded"), Millis(30));
    assert_closed(&r.take_inputs(), &request);
    // The close that follows finds nothing left to end.
    r.line(thread_closed(THREAD), Millis(31));
    assert!(r.take_inputs().is_empty());
    let run2 = RunId::new("run-2").unwrap();
    r.call(
        send(&s, "op-2", SendKind::Start { run: run2 }, 2),
        Millis(40),
    );
    let resume = &r.writes.last().unwrap().1;
    assert_eq!(resume["method"], "thread/resume");
    assert_eq!(resume["params"]["threadId"], THREAD);
}

#[test]
fn a_thread_closed_under_a_stop_aborts_its_run_and_answers_the_stop() {
    // AG-01: a stop that waits for the turn's end is answered when the thread closes;
    // the run ends aborted.
    let mut r = running();
    let s = r.session.clone();
    r.call(stop_call(&s, 5), Millis(10));
    r.answer("turn/interrupt", json!({}), Millis(11));
    assert!(r.take_inputs().is_empty());
    r.line(thread_closed(THREAD), Millis(12));
    let inputs = r.take_inputs();
    assert!(
        matches!(
            stop_results(&inputs).as_slice(),
            [(AttemptId(5), StopResult::Stopped { .. })]
        ),
        "{inputs:?}"
    );
    assert!(
        inputs.iter().any(|i| matches!(
            i,
            AgentInput::RunEnded {
                outcome: RunEventKind::Aborted,
                ..
            }
        )),
        "{inputs:?}"
    );
    assert_eq!(r.agent.poll_timeout(), None, "nothing waits");
}

#[test]
fn a_second_stop_while_the_first_waits_is_answered_with_it_and_interrupts_once() {
    // AG-01, OB-15: two stops of one run share one `turn/interrupt`, and both get the
    // one result, whichever way it comes.
    for how in ["the turn's end", "not running", "no answer", "a refusal"] {
        let mut r = running();
        let s = r.session.clone();
        r.call(stop_call(&s, 5), Millis(10));
        r.call(stop_call(&s, 6), Millis(11));
        assert_eq!(
            writes_of(&r, "turn/interrupt"),
            1,
            "{how}: interrupted once"
        );
        assert!(r.take_inputs().is_empty(), "{how}");
        let want: fn(&StopResult) -> bool = match how {
            "the turn's end" => {
                r.answer("turn/interrupt", json!({}), Millis(12));
                // A third stop while the turn's end is awaited joins too.
                r.call(stop_call(&s, 7), Millis(13));
                assert_eq!(writes_of(&r, "turn/interrupt"), 1);
                r.line(turn_completed("interrupted"), Millis(14));
                |x| matches!(x, StopResult::Stopped { .. })
            }
            "not running" => {
                r.refuse(
                    "turn/interrupt",
                    -32600,
                    "no active turn to interrupt",
                    Millis(12),
                );
                |x| matches!(x, StopResult::Stopped { .. })
            }
            "no answer" => {
                let due = Millis(10).saturating_add(REPLY_DEADLINE);
                r.agent.handle_timeout(due);
                r.drain(due);
                |x| matches!(x, StopResult::Crashed)
            }
            _ => {
                r.refuse("turn/interrupt", -32603, "internal", Millis(12));
                |x| matches!(x, StopResult::Failed { .. })
            }
        };
        let inputs = r.take_inputs();
        let results = stop_results(&inputs);
        let attempts: Vec<AttemptId> = results.iter().map(|(a, _)| *a).collect();
        let expected = if how == "the turn's end" {
            vec![AttemptId(5), AttemptId(6), AttemptId(7)]
        } else {
            vec![AttemptId(5), AttemptId(6)]
        };
        assert_eq!(attempts, expected, "{how}: {inputs:?}");
        assert!(results.iter().all(|(_, x)| want(x)), "{how}: {results:?}");
        assert!(
            results.windows(2).all(|w| w[0].1 == w[1].1),
            "{how}: one result"
        );
    }
}

// PK-06: a streamed fragment of the agent's message is a host input of its session,
// with the item as its block and the turn named; command output is not logged.
#[test]
fn streamed_message_fragments_are_deltas_of_the_session() {
    let mut r = running();
    let s = r.session.clone();
    for text in ["Hel", "lo"] {
        r.line(
            json!({"method": "item/agentMessage/delta", "params": {"threadId": THREAD,
                "turnId": TURN, "itemId": "msg-1", "delta": text}}),
            Millis(10),
        );
    }
    r.line(
        json!({"method": "item/commandExecution/outputDelta", "params": {"threadId": THREAD,
            "turnId": TURN, "itemId": "cmd-1", "delta": "ok\n"}}),
        Millis(11),
    );
    let fragments: Vec<host_core::Fragment> = r
        .take_inputs()
        .into_iter()
        .filter_map(|i| match i {
            AgentInput::Delta { session, fragment } if session == s => Some(fragment),
            _ => None,
        })
        .collect();
    let want = ["Hel", "lo"].map(|t| {
        host_core::Fragment::new(timeline_core::history::DeltaKind::Text, "msg-1", t).turn(TURN)
    });
    assert_eq!(fragments, want);
}
