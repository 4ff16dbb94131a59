//! The host in an unkind world: agent answers late, twice, for old attempts or never;
//! time jumps; clients ask at any moment. Checked after every step.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use outbox_core::adapter::{ReadHistoryRequest, StopRequest};
use std::collections::{HashMap, HashSet};

use host_core::{
    AgentCall, AgentInput, ClientRequest, Host, HostConfig, HostEffect, Reply, ReplyTo,
};
use outbox_core::adapter::{AttemptId, SendKind};
use outbox_core::entry::Acceptance;
use outbox_core::ids::{ThreadId, TurnId};
use outbox_core::{Capabilities, Controls, HistoryRead, MemoryOutboxStore, MessageRequest};
use outbox_core::{OperationId, QueueId, SendResult, SessionInfo, SubmitRequest};
use overlay_core::{MemoryOverlayStore, MemorySource, RunEventKind, SourceKind};
use proptest::prelude::*;
use timeline_core::{BoundaryToken, HostKey, Millis, RunId, SessionId, TargetId};

#[derive(Clone, Debug)]
enum Step {
    Submit,
    /// Answer the pending call at this index (modulo) with this result kind.
    Answer(usize, u8),
    /// Answer an old call again.
    Repeat(usize, u8),
    EndRun(u8),
    LatestWindow,
    Stop,
    Wait(u32),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => Just(Step::Submit),
        4 => (any::<usize>(), 0u8..6).prop_map(|(i, k)| Step::Answer(i, k)),
        1 => (any::<usize>(), 0u8..6).prop_map(|(i, k)| Step::Repeat(i, k)),
        1 => (0u8..3).prop_map(Step::EndRun),
        1 => Just(Step::LatestWindow),
        1 => Just(Step::Stop),
        2 => (0u32..40_000).prop_map(Step::Wait),
    ]
}

fn result_of(kind: u8, run: &RunId, now: Millis) -> SendResult {
    match kind {
        0 => SendResult::Delivered,
        1 => SendResult::Accepted(Acceptance {
            run_id: run.clone(),
            thread_id: ThreadId::new("thread-1").unwrap(),
            turn_id: TurnId::new("turn-1").unwrap(),
            accepted_at: now,
        }),
        2 => SendResult::AdmissionUncertain {
            error: "the reply was lost".into(),
        },
        3 => SendResult::ProvenUnadmitted {
            error: "overloaded".into(),
        },
        4 => SendResult::Deferred {
            reason: "busy".into(),
        },
        _ => SendResult::Canceled,
    }
}

proptest! {
    // 256 cases by default; PROPTEST_CASES raises it for longer runs.
    #![proptest_config(ProptestConfig::default())]

    // OB-08, OB-09: a message goes to the agent again only after the agent said the
    // previous attempt did not take it (proven unadmitted, deferred, canceled) or
    // history said it is missing; every client request gets exactly one reply; the
    // host's deadline is never in the past after it handled its timeouts.
    #[test]
    fn the_host_keeps_its_promises_in_an_unkind_world(steps in proptest::collection::vec(step(), 1..60)) {
        let session = SessionId::new("s").unwrap();
        let mut n = 0u64;
        let uuids = Box::new(move || { n += 1; format!("00000000-0000-4000-8000-{n:012x}") });
        let mut host = Host::new(
            MemoryOutboxStore::new(),
            MemoryOverlayStore::new(),
            HostConfig::new(HostKey::from_bytes([9; 32]), uuids),
        );
        let source = MemorySource::new(
            SourceKind::Codex { thread_id: "t".into(), generation: 1 },
            BoundaryToken::codex_rollout("/r.jsonl"),
        );
        host.add_session(&session, SessionInfo::new(Capabilities::codex()), Box::new(source));
        host.start(Millis(0)).unwrap();

        let mut now = Millis(1_000);
        let mut next_reply = 0u64;
        let mut asked: HashSet<ReplyTo> = HashSet::new();
        let mut answered: HashMap<ReplyTo, usize> = HashMap::new();
        let mut pending: Vec<AgentCall> = Vec::new();
        let mut old: Vec<(AttemptId, RunId)> = Vec::new();
        // Operations the agent may get again: its last answer said it did not take them.
        let mut resend_ok: HashSet<OperationId> = HashSet::new();
        let mut sent: HashSet<OperationId> = HashSet::new();
        let mut submitted = 0u32;
        let mut stops: HashSet<ReplyTo> = HashSet::new();

        for step in steps {
            match step {
                Step::Submit => {
                    submitted += 1;
                    next_reply += 1;
                    asked.insert(ReplyTo(next_reply));
                    host.handle_client(ReplyTo(next_reply), ClientRequest::Submit(SubmitRequest {
                        session: session.clone(),
                        queue_id: QueueId::new(format!("q-{submitted}")).unwrap(),
                        operation_id: OperationId::new(format!("op-{submitted}")).unwrap(),
                        request: MessageRequest::text("hi", "phone", now),
                        controls: Controls::automatic(),
                    }), now);
                }
                Step::Answer(i, kind) if !pending.is_empty() => {
                    let call = pending.remove(i % pending.len());
                    match call {
                        AgentCall::Send(req) => {
                            let run = match &req.kind { SendKind::Start { run } | SendKind::Steer { run } => run.clone() };
                            let result = result_of(kind, &run, now);
                            if matches!(result, SendResult::ProvenUnadmitted { .. } | SendResult::Deferred { .. } | SendResult::Canceled) {
                                resend_ok.insert(req.operation_id.clone());
                            }
                            old.push((req.attempt, run));
                            host.handle_agent(AgentInput::SendResult { attempt: req.attempt, result }, now);
                        }
                        AgentCall::ReadHistory(ReadHistoryRequest { attempt, operation_id, .. }) => {
                            let read = if kind % 2 == 0 { HistoryRead::Missing } else { HistoryRead::Unreadable };
                            if read == HistoryRead::Missing {
                                resend_ok.insert(operation_id);
                            }
                            host.handle_agent(AgentInput::HistoryRead { attempt, read }, now);
                        }
                        AgentCall::Stop(StopRequest { attempt, .. }) => {
                            host.handle_agent(AgentInput::StopResult { attempt, result: outbox_core::adapter::StopResult::Stopped { untaken: Vec::new() } }, now);
                        }
                        _ => {}
                    }
                }
                Step::Repeat(i, kind) if !old.is_empty() => {
                    let (attempt, run) = old[i % old.len()].clone();
                    host.handle_agent(AgentInput::SendResult { attempt, result: result_of(kind, &run, now) }, now);
                }
                Step::EndRun(k) => {
                    if let Some(run) = host.custody().runs().active(&session).map(|r| r.run_id.clone()) {
                        let outcome = [RunEventKind::Completed, RunEventKind::Failed, RunEventKind::Aborted][usize::from(k)];
                        host.handle_agent(AgentInput::RunEnded { session: session.clone(), run, outcome, untaken: Vec::new() }, now);
                    }
                }
                Step::LatestWindow => {
                    next_reply += 1;
                    asked.insert(ReplyTo(next_reply));
                    host.handle_client(ReplyTo(next_reply), ClientRequest::LatestWindow {
                        session: session.clone(), target: TargetId::main(&session), page_size: 50,
                    }, now);
                }
                Step::Stop => {
                    next_reply += 1;
                    asked.insert(ReplyTo(next_reply));
                    stops.insert(ReplyTo(next_reply));
                    host.handle_client(ReplyTo(next_reply), ClientRequest::Stop { session: session.clone() }, now);
                }
                Step::Wait(ms) => {
                    now = now.saturating_add(Millis(u64::from(ms)));
                    host.handle_timeout(now);
                }
                _ => {}
            }
            while let Some(effect) = host.poll_effect() {
                match effect {
                    HostEffect::Agent(AgentCall::Send(req)) => {
                        let op = req.operation_id.clone();
                        prop_assert!(!sent.contains(&op) || resend_ok.remove(&op),
                            "{op} sent again without the agent saying it did not take it");
                        sent.insert(op);
                        pending.push(AgentCall::Send(req));
                    }
                    HostEffect::Agent(call) => pending.push(call),
                    HostEffect::Reply { to, reply } => {
                        prop_assert!(asked.contains(&to), "a reply nobody asked for: {to:?} {reply:?}");
                        *answered.entry(to).or_default() += 1;
                        prop_assert!(answered[&to] == 1, "two replies to {to:?}");
                        if let Reply::Submitted(r) = reply { prop_assert!(r.is_ok()); }
                    }
                    _ => {}
                }
            }
            // After the host handled its timeouts, its deadline lies ahead.
            host.handle_timeout(now);
            while let Some(effect) = host.poll_effect() {
                match effect {
                    HostEffect::Agent(AgentCall::Send(req)) => {
                        let op = req.operation_id.clone();
                        prop_assert!(!sent.contains(&op) || resend_ok.remove(&op),
                            "{op} sent again without the agent saying it did not take it");
                        sent.insert(op);
                        pending.push(AgentCall::Send(req));
                    }
                    HostEffect::Agent(call) => pending.push(call),
                    HostEffect::Reply { to, .. } => {
                        *answered.entry(to).or_default() += 1;
                        prop_assert!(answered[&to] == 1, "two replies to {to:?}");
                    }
                    _ => {}
                }
            }
            if let Some(deadline) = host.poll_timeout() {
                prop_assert!(deadline > now, "deadline {deadline:?} not after {now:?}");
            }
        }
        // Every request except a stop still settling got its reply.
        for to in asked.difference(&stops) {
            prop_assert!(answered.contains_key(to), "{to:?} unanswered");
        }
    }
}
