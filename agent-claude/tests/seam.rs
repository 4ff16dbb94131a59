//! `ClaudeAgent` behind the agent seam, driven with lines Claude Code 2.1.328 printed
//! (shortened): what it starts and writes, and what each line becomes for the host.

#![allow(clippy::unwrap_used)] // a test: a bad ID or line is a failed test

use agent_claude::seam::{REPLY_DEADLINE, STOP_DEADLINE};
use agent_claude::{ClaudeAgent, ClaudeConfig};
use host_core::{Agent, AgentCall, AgentEffect, AgentInput, ProcessId, ProcessSpec, WriteFailure};
use outbox_core::adapter::{
    AttemptId, ProofKind, SendKind, SendRequest, SendResult, StopResult, TakeBackResult,
};
use outbox_core::adapter::{ReadHistoryRequest, StopRequest, TakeBackRequest};
use outbox_core::{HistoryRead, MessageRequest, OperationId};
use overlay_core::live::RunEventKind;
use serde_json::{json, Value};
use timeline_core::key::{RunId, SessionId};
use timeline_core::time::Millis;

const CLAUDE: &str = "06eafd0e-6b42-4190-908b-f052c59225bb";
const A: &str = "aaaaaaaa-0000-4000-8000-00000000000a";
const B: &str = "bbbbbbbb-0000-4000-8000-00000000000b";
const C: &str = "cccccccc-0000-4000-8000-00000000000c";

struct Rig {
    agent: ClaudeAgent,
    session: SessionId,
    inputs: Vec<AgentInput>,
    writes: Vec<Value>,
    spawned: Vec<(ProcessId, Vec<String>)>,
    closed: usize,
    killed: usize,
    reads: Vec<host_core::ReadId>,
    /// Answers the look for the transcript before a start, when set.
    transcript: Option<bool>,
}

impl Rig {
    fn new(resume: bool) -> Rig {
        let session = SessionId::new("s-1").unwrap();
        let mut agent = ClaudeAgent::new(ClaudeConfig::new(
            ProcessSpec::new("claude"),
            "/home/u/.claude/projects",
            "/work/p",
        ));
        agent.add_session(&session, CLAUDE, resume);
        Rig {
            agent,
            session,
            inputs: Vec::new(),
            writes: Vec::new(),
            spawned: Vec::new(),
            closed: 0,
            killed: 0,
            reads: Vec::new(),
            transcript: Some(resume),
        }
    }

    fn drain_with(&mut self, now: Millis, fail: Option<WriteFailure>) {
        while let Some(e) = self.agent.poll_effect() {
            match e {
                AgentEffect::Input(i) => self.inputs.push(i),
                AgentEffect::Spawn { process, spec } => self.spawned.push((
                    process,
                    spec.args
                        .iter()
                        .map(|a| a.to_string_lossy().into_owned())
                        .collect(),
                )),
                AgentEffect::Write {
                    process,
                    write,
                    line,
                } => {
                    self.writes.push(serde_json::from_slice(&line).unwrap());
                    let r = match &fail {
                        Some(f) => Err(f.clone()),
                        None => Ok(()),
                    };
                    self.agent.handle_written(process, write, r, now);
                }
                AgentEffect::CloseInput { .. } => self.closed += 1,
                AgentEffect::Kill { .. } => self.killed += 1,
                AgentEffect::ReadFile { read, limit: 0, .. } if self.transcript.is_some() => {
                    let r = if self.transcript == Some(true) {
                        Ok(Vec::new())
                    } else {
                        Err(host_core::FileError::NotFound("t.jsonl".into()))
                    };
                    self.agent.handle_file(read, r, now);
                }
                AgentEffect::ReadFile { read, .. } => self.reads.push(read),
                _ => {}
            }
        }
    }

    fn drain(&mut self, now: Millis) {
        self.drain_with(now, None);
    }

    fn call(&mut self, call: AgentCall, now: Millis) {
        self.agent.handle_call(call, now);
        self.drain(now);
    }

    fn line(&mut self, v: Value, now: Millis) {
        let p = self.spawned.last().unwrap().0;
        self.agent.handle_line(p, v.to_string().as_bytes(), now);
        self.drain(now);
    }

    fn take(&mut self) -> Vec<AgentInput> {
        std::mem::take(&mut self.inputs)
    }
}

fn run() -> RunId {
    RunId::new("run-1").unwrap()
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

fn lifecycle(uuid: &str, state: &str) -> Value {
    json!({"type": "command_lifecycle", "command_uuid": uuid, "state": state,
           "uuid": "l-1", "session_id": CLAUDE})
}

fn result(uuid: &str, error: bool) -> Value {
    json!({"type": "result", "subtype": if error { "error_during_execution" } else { "success" },
           "is_error": error, "session_id": CLAUDE, "user_message_uuid": uuid})
}

/// A run started with A, accepted.
fn running() -> Rig {
    let mut r = Rig::new(false);
    let s = r.session.clone();
    r.call(send(&s, A, SendKind::Start { run: run() }, 1), Millis(1));
    r.line(lifecycle(A, "queued"), Millis(2));
    r.take();
    r
}

#[test]
fn a_first_send_starts_claude_with_its_session_and_its_acceptance_names_that_session() {
    // AG-01
    // OB-08: the Claude session is the thread from the first line on (not the message).
    let mut r = Rig::new(false);
    let s = r.session.clone();
    r.call(send(&s, A, SendKind::Start { run: run() }, 7), Millis(1));
    let args = &r.spawned[0].1;
    let at = args.iter().position(|a| a == "--session-id").unwrap();
    assert_eq!(args[at + 1], CLAUDE);
    assert!(args.contains(&"--replay-user-messages".to_owned()));
    assert_eq!(r.writes[0]["uuid"], A);
    assert_eq!(r.writes[0]["type"], "user");
    // `command_lifecycle` queued comes before `system/init`.
    r.line(lifecycle(A, "queued"), Millis(2));
    let inputs = r.take();
    let [AgentInput::SendResult {
        attempt: AttemptId(7),
        result: SendResult::Accepted(a),
    }] = inputs.as_slice()
    else {
        panic!("{inputs:?}");
    };
    assert_eq!(a.thread_id.as_str(), CLAUDE);
    // Started proves it; the turn's end with nothing waiting ends the run.
    r.line(lifecycle(A, "started"), Millis(3));
    assert!(matches!(
        r.take().as_slice(),
        [AgentInput::DeliveryProof { .. }]
    ));
    r.line(result(A, false), Millis(4));
    let inputs = r.take();
    assert!(
        inputs.iter().any(|i| matches!(i,
            AgentInput::RunEnded { outcome: RunEventKind::Completed, untaken, .. } if untaken.is_empty())),
        "{inputs:?}"
    );
    assert_eq!(
        r.closed, 1,
        "its input is closed: the process ends by itself"
    );
}

#[test]
fn a_session_that_exists_is_resumed() {
    let mut r = Rig::new(true);
    let s = r.session.clone();
    r.call(send(&s, A, SendKind::Start { run: run() }, 1), Millis(1));
    let args = &r.spawned[0].1;
    let at = args.iter().position(|a| a == "--resume").unwrap();
    assert_eq!(args[at + 1], CLAUDE);
}

#[test]
fn a_stop_cancels_what_waits_and_names_only_what_claude_cancelled_as_untaken() {
    // AG-01
    // OB-08, from the real 2.1.328 lines: B queued behind A; the interrupt with
    // `cancel_queued` cancels B (lifecycle `cancelled`, receipt `cancelled: [B]`).
    let mut r = running();
    let s = r.session.clone();
    r.line(lifecycle(A, "started"), Millis(3));
    r.call(send(&s, B, SendKind::Steer { run: run() }, 2), Millis(4));
    r.line(lifecycle(B, "queued"), Millis(5));
    r.take();
    r.call(
        AgentCall::Stop(StopRequest {
            attempt: AttemptId(9),
            session: s,
            run: run(),
        }),
        Millis(6),
    );
    let interrupt = r.writes.last().unwrap().clone();
    assert_eq!(interrupt["request"]["subtype"], "interrupt");
    assert_eq!(interrupt["request"]["cancel_queued"], true);
    let id = interrupt["request_id"].as_str().unwrap().to_owned();
    r.line(lifecycle(B, "cancelled"), Millis(7));
    r.line(
        json!({"type": "control_response", "response": {"subtype": "success", "request_id": id,
            "response": {"still_queued": [], "cancelled": [B]}}}),
        Millis(8),
    );
    assert!(
        r.take()
            .iter()
            .all(|i| !matches!(i, AgentInput::StopResult { .. })),
        "the interrupted turn has not ended yet"
    );
    r.line(
        json!({"type": "user", "message": {"role": "user",
            "content": [{"type": "text", "text": "[Request interrupted by user]"}]},
            "session_id": CLAUDE, "uuid": "d26eff5c-a7b5-4adc-b434-4dea95da5b58"}),
        Millis(9),
    );
    r.line(result(A, true), Millis(10));
    r.line(lifecycle(A, "cancelled"), Millis(11));
    let inputs = r.take();
    let untaken = inputs
        .iter()
        .find_map(|i| match i {
            AgentInput::StopResult {
                attempt: AttemptId(9),
                result: StopResult::Stopped { untaken },
            } => Some(untaken.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{inputs:?}"));
    assert_eq!(
        untaken,
        vec![OperationId::new(B).unwrap()],
        "A started: it stays delivered"
    );
    assert!(
        inputs
            .iter()
            .any(|i| matches!(i, AgentInput::RunEnded { .. })),
        "{inputs:?}"
    );
}

#[test]
fn a_message_claude_keeps_through_an_interrupt_is_not_untaken() {
    // OB-08: an older Claude that ignores `cancel_queued` answers `still_queued: [B]`
    // and runs B next: B is not untaken, so custody never sends it a second time.
    let mut r = running();
    let s = r.session.clone();
    r.line(lifecycle(A, "started"), Millis(3));
    r.call(send(&s, B, SendKind::Steer { run: run() }, 2), Millis(4));
    r.line(lifecycle(B, "queued"), Millis(5));
    r.call(
        AgentCall::Stop(StopRequest {
            attempt: AttemptId(9),
            session: s,
            run: run(),
        }),
        Millis(6),
    );
    let id = r.writes.last().unwrap()["request_id"]
        .as_str()
        .unwrap()
        .to_owned();
    r.line(
        json!({"type": "control_response", "response": {"subtype": "success", "request_id": id,
            "response": {"still_queued": [B]}}}),
        Millis(7),
    );
    r.line(result(A, true), Millis(8));
    let inputs = r.take();
    assert!(
        inputs.iter().any(|i| matches!(i,
            AgentInput::StopResult { result: StopResult::Stopped { untaken }, .. } if untaken.is_empty())),
        "{inputs:?}"
    );
    assert!(
        !inputs
            .iter()
            .any(|i| matches!(i, AgentInput::RunEnded { .. })),
        "B still runs"
    );
    r.line(lifecycle(B, "started"), Millis(9));
    r.line(result(B, false), Millis(10));
    let inputs = r.take();
    assert!(inputs.iter().any(|i| matches!(i, AgentInput::DeliveryProof { operation_id, .. } if operation_id.as_str() == B)));
    assert!(inputs
        .iter()
        .any(|i| matches!(i, AgentInput::RunEnded { .. })));
}

#[test]
fn a_stop_claude_never_answers_kills_the_run_and_its_end_answers() {
    let mut r = running();
    let s = r.session.clone();
    r.call(
        AgentCall::Stop(StopRequest {
            attempt: AttemptId(9),
            session: s.clone(),
            run: run(),
        }),
        Millis(10),
    );
    assert_eq!(
        r.agent.poll_timeout(),
        Some(
            Millis(10)
                .saturating_add(STOP_DEADLINE)
                .min(Millis(2).saturating_add(REPLY_DEADLINE))
        )
    );
    let at = Millis(10).saturating_add(STOP_DEADLINE);
    r.agent.handle_timeout(at);
    r.drain(at);
    assert_eq!(r.killed, 1);
    let p = r.spawned[0].0;
    r.agent.handle_exit(p, "claude ended: signal 9".into(), at);
    r.drain(at);
    let inputs = r.take();
    assert!(
        inputs.iter().any(|i| matches!(
            i,
            AgentInput::StopResult {
                attempt: AttemptId(9),
                result: StopResult::Stopped { .. }
            }
        )),
        "{inputs:?}"
    );
    assert!(
        inputs.iter().any(|i| matches!(
            i,
            AgentInput::RunEnded {
                outcome: RunEventKind::Failed,
                ..
            }
        )),
        "{inputs:?}"
    );
}

#[test]
fn a_take_back_asks_claude_to_cancel_the_message_and_reports_what_it_did() {
    // AG-01
    // OB-08: detached only when Claude cancelled it.
    for (cancelled, detached) in [(true, true), (false, false)] {
        let mut r = running();
        let s = r.session.clone();
        r.call(send(&s, B, SendKind::Steer { run: run() }, 2), Millis(4));
        r.line(lifecycle(B, "queued"), Millis(5));
        r.take();
        let acceptance = outbox_core::entry::Acceptance {
            run_id: run(),
            thread_id: outbox_core::ids::ThreadId::new(CLAUDE).unwrap(),
            turn_id: outbox_core::ids::TurnId::new(A).unwrap(),
            accepted_at: Millis(5),
        };
        r.call(
            AgentCall::TakeBack(TakeBackRequest {
                attempt: AttemptId(3),
                session: s,
                operation_id: OperationId::new(B).unwrap(),
                acceptance,
            }),
            Millis(6),
        );
        let w = r.writes.last().unwrap().clone();
        assert_eq!(w["request"]["subtype"], "cancel_async_message");
        assert_eq!(w["request"]["message_uuid"], B);
        let body = if cancelled {
            json!({"cancelled": true, "message_uuid": B})
        } else {
            json!({"cancelled": false})
        };
        r.line(
            json!({"type": "control_response", "response": {"subtype": "success",
                "request_id": w["request_id"], "response": body}}),
            Millis(7),
        );
        let inputs = r.take();
        let got = inputs.iter().find_map(|i| match i {
            AgentInput::TakeBack { result, .. } => {
                Some(matches!(result, TakeBackResult::DetachedForReplay))
            }
            _ => None,
        });
        assert_eq!(got, Some(detached), "{inputs:?}");
    }
}

#[test]
fn a_send_with_no_line_naming_it_is_uncertain_at_the_deadline_and_a_failed_write_is_not_sent() {
    // OB-09
    let mut r = running();
    let s = r.session.clone();
    r.call(send(&s, B, SendKind::Steer { run: run() }, 2), Millis(100));
    let due = Millis(100).saturating_add(REPLY_DEADLINE);
    r.agent.handle_timeout(Millis(due.as_u64() - 1));
    r.drain(due);
    assert!(r.take().is_empty());
    r.agent.handle_timeout(due);
    r.drain(due);
    assert!(matches!(
        r.take().as_slice(),
        [AgentInput::SendResult {
            result: SendResult::AdmissionUncertain { .. },
            ..
        }]
    ));
    // A write that took no byte: proven unadmitted.
    let mut r = running();
    let s = r.session.clone();
    r.agent
        .handle_call(send(&s, B, SendKind::Steer { run: run() }, 3), Millis(5));
    r.drain_with(
        Millis(5),
        Some(WriteFailure::NotWritten("input closed".into())),
    );
    assert!(matches!(
        r.take().as_slice(),
        [AgentInput::SendResult {
            result: SendResult::ProvenUnadmitted { .. },
            ..
        }]
    ));
}

#[test]
fn claude_ending_mid_send_leaves_it_uncertain_and_ends_the_run() {
    // OB-08
    let mut r = running();
    let s = r.session.clone();
    r.call(send(&s, B, SendKind::Steer { run: run() }, 2), Millis(4));
    let p = r.spawned[0].0;
    r.agent
        .handle_exit(p, "claude ended: exit status 1".into(), Millis(5));
    r.drain(Millis(5));
    let inputs = r.take();
    assert!(
        inputs.iter().any(|i| matches!(
            i,
            AgentInput::SendResult {
                attempt: AttemptId(2),
                result: SendResult::AdmissionUncertain { .. }
            }
        )),
        "{inputs:?}"
    );
    assert!(
        inputs.iter().any(|i| matches!(
            i,
            AgentInput::RunEnded {
                outcome: RunEventKind::Failed,
                ..
            }
        )),
        "{inputs:?}"
    );
    // The next start looks for the transcript first. There: resumed; not there (Claude
    // writes it well after a message started): created again under its ID.
    for (found, flag) in [(true, "--resume"), (false, "--session-id")] {
        let mut r2 = running();
        r2.line(lifecycle(A, "started"), Millis(3));
        let p = r2.spawned[0].0;
        r2.agent
            .handle_exit(p, "claude ended: signal 9".into(), Millis(5));
        r2.drain(Millis(5));
        r2.transcript = None;
        r2.call(
            send(
                &s,
                B,
                SendKind::Start {
                    run: RunId::new("run-2").unwrap(),
                },
                3,
            ),
            Millis(6),
        );
        assert_eq!(r2.spawned.len(), 1, "nothing starts before the look");
        let read = *r2.reads.last().unwrap();
        let answer = if found {
            Ok(Vec::new())
        } else {
            Err(host_core::FileError::NotFound("t.jsonl".into()))
        };
        r2.agent.handle_file(read, answer, Millis(7));
        r2.drain(Millis(7));
        assert_eq!(r2.spawned.len(), 2);
        assert!(
            r2.spawned[1].1.contains(&flag.to_owned()),
            "{:?}",
            r2.spawned[1].1
        );
    }
}

#[test]
fn a_history_read_searches_the_sessions_transcript() {
    // OB-08
    let mut r = Rig::new(true);
    let s = r.session.clone();
    r.call(
        AgentCall::ReadHistory(ReadHistoryRequest {
            attempt: AttemptId(4),
            session: s,
            operation_id: OperationId::new(A).unwrap(),
            proof: ProofKind::TranscriptUuid,
        }),
        Millis(1),
    );
    let read = r.reads[0];
    let transcript = format!(
        "{}\n{}\n",
        json!({"type": "queue-operation", "operation": "enqueue", "content": "x"}),
        json!({"type": "user", "uuid": A, "message": {"role": "user", "content": "hi"}, "sessionId": CLAUDE})
    );
    r.agent
        .handle_file(read, Ok(transcript.into_bytes()), Millis(2));
    r.drain(Millis(2));
    assert!(matches!(
        r.take().as_slice(),
        [AgentInput::HistoryRead {
            attempt: AttemptId(4),
            read: HistoryRead::Found
        }]
    ));
}

#[test]
fn a_message_id_that_is_not_a_uuid_or_a_rollback_is_refused_before_anything_starts() {
    let mut r = Rig::new(false);
    let s = r.session.clone();
    r.call(
        send(&s, "op-1", SendKind::Start { run: run() }, 1),
        Millis(1),
    );
    let mut rollback = send(&s, A, SendKind::Start { run: run() }, 2);
    if let AgentCall::Send(req) = &mut rollback {
        req.rollback_before_send = true;
    }
    r.call(rollback, Millis(1));
    assert!(r.spawned.is_empty());
    let inputs = r.take();
    assert_eq!(inputs.len(), 2);
    assert!(inputs.iter().all(|i| matches!(
        i,
        AgentInput::SendResult {
            result: SendResult::ProvenUnadmitted { .. },
            ..
        }
    )));
}

#[test]
fn a_send_whose_run_ends_before_its_write_is_reported_is_answered_by_the_report() {
    // OB-08, AG-01
    for (report, proven) in [
        (Err(WriteFailure::NotWritten("gone".into())), true),
        (Ok(()), false),
    ] {
        let mut r = running();
        let s = r.session.clone();
        r.agent
            .handle_call(send(&s, B, SendKind::Steer { run: run() }, 2), Millis(4));
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
        r.agent.handle_exit(p, "claude ended".into(), Millis(5));
        r.drain(Millis(5));
        assert!(!r.take().iter().any(|i| matches!(
            i,
            AgentInput::SendResult {
                attempt: AttemptId(2),
                ..
            }
        )));
        r.agent.handle_written(p, w, report.clone(), Millis(6));
        r.drain(Millis(6));
        let inputs = r.take();
        let [AgentInput::SendResult { result, .. }] = inputs.as_slice() else {
            panic!("{inputs:?}");
        };
        assert_eq!(
            matches!(result, SendResult::ProvenUnadmitted { .. }),
            proven,
            "{result:?}"
        );
    }
}

#[test]
fn a_stop_while_the_start_looks_for_its_transcript_means_it_never_starts() {
    // OB-08: the stop's answer is true: nothing was started, the send is not admitted.
    let mut r = Rig::new(false);
    r.transcript = None;
    let s = r.session.clone();
    r.call(send(&s, A, SendKind::Start { run: run() }, 1), Millis(1));
    let read = *r.reads.last().unwrap();
    r.call(
        AgentCall::Stop(StopRequest {
            attempt: AttemptId(9),
            session: s,
            run: run(),
        }),
        Millis(2),
    );
    r.agent.handle_file(
        read,
        Err(host_core::FileError::NotFound("t".into())),
        Millis(3),
    );
    r.drain(Millis(3));
    assert!(r.spawned.is_empty(), "it started after the stop");
    let inputs = r.take();
    assert!(
        inputs.iter().any(|i| matches!(
            i,
            AgentInput::SendResult {
                attempt: AttemptId(1),
                result: SendResult::ProvenUnadmitted { .. }
            }
        )),
        "{inputs:?}"
    );
    assert!(
        inputs.iter().any(|i| matches!(
            i,
            AgentInput::StopResult {
                attempt: AttemptId(9),
                result: StopResult::Stopped { .. }
            }
        )),
        "{inputs:?}"
    );
}

fn stop(session: &SessionId, attempt: u64) -> AgentCall {
    AgentCall::Stop(StopRequest {
        attempt: AttemptId(attempt),
        session: session.clone(),
        run: run(),
    })
}

fn interrupts(r: &Rig) -> usize {
    r.writes
        .iter()
        .filter(|w| w["request"]["subtype"] == "interrupt")
        .count()
}

fn stop_results(inputs: &[AgentInput]) -> Vec<(AttemptId, StopResult)> {
    inputs
        .iter()
        .filter_map(|i| match i {
            AgentInput::StopResult { attempt, result } => Some((*attempt, result.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_second_stop_while_the_first_waits_shares_its_interrupt_and_its_result() {
    // AG-01, OB-15: two stops of one run write one interrupt; both are answered with
    // the one result, once the receipt came and the interrupted turn ended.
    let mut r = running();
    let s = r.session.clone();
    r.line(lifecycle(A, "started"), Millis(3));
    r.call(send(&s, B, SendKind::Steer { run: run() }, 2), Millis(4));
    r.line(lifecycle(B, "queued"), Millis(5));
    r.take();
    r.call(stop(&s, 9), Millis(6));
    r.call(stop(&s, 10), Millis(7));
    assert_eq!(interrupts(&r), 1, "Claude is asked once");
    assert!(r.take().is_empty(), "neither is answered before Claude");
    let id = r.writes.last().unwrap()["request_id"]
        .as_str()
        .unwrap()
        .to_owned();
    r.line(lifecycle(B, "cancelled"), Millis(8));
    r.line(
        json!({"type": "control_response", "response": {"subtype": "success", "request_id": id,
            "response": {"still_queued": [], "cancelled": [B]}}}),
        Millis(9),
    );
    r.line(result(A, true), Millis(10));
    let inputs = r.take();
    let b = vec![OperationId::new(B).unwrap()];
    assert_eq!(
        stop_results(&inputs),
        vec![
            (AttemptId(9), StopResult::Stopped { untaken: b.clone() }),
            (AttemptId(10), StopResult::Stopped { untaken: b }),
        ],
        "{inputs:?}"
    );
    assert_eq!(interrupts(&r), 1);
}

#[test]
fn a_stop_after_the_first_gave_up_waiting_is_answered_by_the_runs_end_with_it() {
    // AG-01: the first stop's deadline killed the run; a second stop before the end
    // comes joins it: no new interrupt, no second kill, both answered by the end.
    let mut r = running();
    let s = r.session.clone();
    r.call(stop(&s, 9), Millis(10));
    let at = Millis(10).saturating_add(STOP_DEADLINE);
    r.agent.handle_timeout(at);
    r.drain(at);
    assert_eq!(r.killed, 1);
    r.call(stop(&s, 10), at);
    assert_eq!(interrupts(&r), 1);
    let p = r.spawned[0].0;
    r.agent.handle_exit(p, "claude ended: signal 9".into(), at);
    r.drain(at);
    let inputs = r.take();
    let attempts: Vec<AttemptId> = stop_results(&inputs).into_iter().map(|(a, _)| a).collect();
    assert_eq!(attempts, [AttemptId(9), AttemptId(10)], "{inputs:?}");
    assert_eq!(r.killed, 1);
    assert_eq!(r.agent.poll_timeout(), None, "nothing waits");
}

fn echo(uuid: &str, text: &str, timestamp: Option<&str>) -> Value {
    let mut v = json!({"type": "user", "message": {"role": "user", "content": text},
        "session_id": CLAUDE, "parent_tool_use_id": null, "uuid": uuid, "isReplay": true});
    if let Some(t) = timestamp {
        v["timestamp"] = json!(t);
    }
    v
}

fn reply(id: &str, text: &str) -> Value {
    json!({"type": "assistant", "message": {"content": [{"text": text, "type": "text"}],
        "id": id, "role": "assistant", "type": "message"},
        "parent_tool_use_id": null, "session_id": CLAUDE, "uuid": format!("u-{id}")})
}

/// The user rows the host was given, last version of each: key and words.
fn user_rows(inputs: &[AgentInput]) -> Vec<(String, Value)> {
    let mut rows = std::collections::BTreeMap::new();
    for i in inputs {
        if let AgentInput::Rows { rows: r, .. } = i {
            for row in r.iter().filter(|r| r.block.operation_id.is_some()) {
                rows.insert(
                    row.block.id.as_str().to_owned(),
                    row.block.data["text"].clone(),
                );
            }
        }
    }
    rows.into_iter().collect()
}

/// A run of A with B and C queued behind it, A's turn over (its echo `first`, its
/// reply, its result), as Claude Code 2.1.328 prints them.
fn b_and_c_queued_behind_a_that_ended(first: &str) -> Rig {
    let mut r = running();
    let s = r.session.clone();
    r.call(send(&s, B, SendKind::Steer { run: run() }, 2), Millis(3));
    r.call(send(&s, C, SendKind::Steer { run: run() }, 3), Millis(3));
    r.line(lifecycle(B, "queued"), Millis(4));
    r.line(lifecycle(C, "queued"), Millis(4));
    r.line(lifecycle(A, "started"), Millis(5));
    r.line(echo(A, first, Some("2026-12-02T20:39:39.653Z")), Millis(6));
    r.line(reply("msg_1", "Reply to: First."), Millis(7));
    r.line(result(A, false), Millis(8));
    r
}

#[test]
fn messages_claude_merges_are_one_row_and_their_turn_keeps_the_run_open() {
    // AG-01, TL-02: the order of lines Claude Code 2.1.328 printed for B and C queued
    // behind A and merged into one turn under C (shortened): B's own echo, without a
    // `timestamp`, gives no row; C's echo carries both texts. The run goes on until
    // the merged turn's result.
    let mut r = b_and_c_queued_behind_a_that_ended("First. [[slow]]");
    r.line(lifecycle(A, "completed"), Millis(8));
    r.line(echo(B, "Second, queued. [[text]]", None), Millis(9));
    r.line(lifecycle(B, "started"), Millis(9));
    r.line(lifecycle(C, "started"), Millis(9));
    assert!(
        !r.inputs
            .iter()
            .any(|i| matches!(i, AgentInput::RunEnded { .. })),
        "the merged turn still runs: {:?}",
        r.inputs
    );
    assert_eq!(r.closed, 0, "Claude's input stays open");
    r.line(
        echo(
            C,
            "Second, queued. [[text]]\nThird, queued. [[text]]",
            Some("2026-12-02T20:39:45.977Z"),
        ),
        Millis(10),
    );
    r.line(
        reply("msg_2", "Reply to: Second, queued. Third, queued. [[text]]"),
        Millis(11),
    );
    r.line(result(C, false), Millis(12));
    let inputs = r.take();
    assert!(
        inputs
            .iter()
            .any(|i| matches!(i, AgentInput::RunEnded { .. })),
        "{inputs:?}"
    );
    assert_eq!(
        user_rows(&inputs),
        [
            (format!("user-message::{A}"), json!("First. [[slow]]")),
            (
                format!("user-message::{C}"),
                json!("Second, queued. [[text]]\nThird, queued. [[text]]")
            ),
        ]
    );
    for op in [B, C] {
        assert!(
            inputs.iter().any(|i| matches!(i,
                AgentInput::DeliveryProof { operation_id, .. } if operation_id.as_str() == op)),
            "{op}: {inputs:?}"
        );
    }
}

#[test]
fn an_echo_held_for_a_merge_is_shown_when_claude_ends() {
    // AG-01, TL-02: the process ends after an echo without a `timestamp`: its row is
    // still given.
    let mut r = running();
    let s = r.session.clone();
    r.call(send(&s, B, SendKind::Steer { run: run() }, 2), Millis(3));
    r.line(lifecycle(B, "queued"), Millis(4));
    r.line(echo(B, "Second, queued. [[text]]", None), Millis(5));
    assert!(user_rows(&r.inputs).is_empty());
    let p = r.spawned[0].0;
    r.agent
        .handle_exit(p, "claude ended: signal 9".into(), Millis(6));
    r.drain(Millis(6));
    assert_eq!(
        user_rows(&r.take()),
        [(
            format!("user-message::{B}"),
            json!("Second, queued. [[text]]")
        )]
    );
}

fn stream_event(event: Value) -> Value {
    json!({"type": "stream_event", "event": event, "session_id": CLAUDE, "uuid": "e-1"})
}

// PK-06: Claude's streamed text, thinking and tool input are host inputs of the
// session: text and thinking by message, a tool call's input by its tool use.
#[test]
fn streamed_blocks_are_deltas_of_the_session() {
    use timeline_core::history::DeltaKind;
    let mut r = running();
    r.line(lifecycle(A, "started"), Millis(3));
    r.line(
        stream_event(
            json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
            "role": "assistant", "content": [], "model": "m"}}),
        ),
        Millis(4),
    );
    r.line(
        stream_event(json!({"type": "content_block_start", "index": 0,
            "content_block": {"type": "text", "text": ""}})),
        Millis(5),
    );
    r.line(
        stream_event(json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": "Hi"}})),
        Millis(6),
    );
    r.line(
        stream_event(json!({"type": "content_block_start", "index": 1,
            "content_block": {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}})),
        Millis(7),
    );
    r.line(
        stream_event(json!({"type": "content_block_delta", "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": "{\"command\""}})),
        Millis(8),
    );
    let fragments: Vec<host_core::Fragment> = r
        .take()
        .into_iter()
        .filter_map(|i| match i {
            AgentInput::Delta { fragment, .. } => Some(fragment),
            _ => None,
        })
        .collect();
    assert_eq!(
        fragments,
        [
            host_core::Fragment::new(DeltaKind::Text, "msg_1", "Hi"),
            host_core::Fragment::new(DeltaKind::ToolCall, "toolu_1", "{\"command\""),
        ]
    );
}

// AG-01, TL-02: with partial messages on, a streamed fragment between a held echo and
// the echo that merges it shows nothing early: the merged message is still one row.
#[test]
fn a_streamed_fragment_does_not_show_an_echo_held_for_a_merge() {
    let mut r = b_and_c_queued_behind_a_that_ended("First.");
    r.line(echo(B, "Second.", None), Millis(9));
    r.line(
        stream_event(json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": "late"}})),
        Millis(9),
    );
    r.line(
        echo(C, "Second.\nThird.", Some("2026-12-02T20:39:45.977Z")),
        Millis(10),
    );
    r.line(
        stream_event(json!({"type": "message_start", "message": {"id": "msg_2",
            "type": "message", "role": "assistant", "content": [], "model": "m"}})),
        Millis(11),
    );
    r.line(reply("msg_2", "Reply to: Second. Third."), Millis(12));
    r.line(result(C, false), Millis(13));
    let inputs = r.take();
    assert_eq!(
        user_rows(&inputs),
        [
            (format!("user-message::{A}"), json!("First.")),
            (format!("user-message::{C}"), json!("Second.\nThird.")),
        ]
    );
}
