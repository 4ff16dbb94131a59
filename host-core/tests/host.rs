//! The host machine through its public loop, as an embedder drives it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::flaky;

use std::collections::HashSet;

use host_core::{
    AgentCall, AgentInput, ApprovalError, ClientRequest, Host, HostConfig, HostEffect, Notice,
    Reply, ReplyTo,
};
use outbox_core::store::OutboxStore;
use outbox_core::{Capabilities, Controls, MemoryOutboxStore, MessageRequest, OperationId};
use outbox_core::{QueueId, SendResult, SessionInfo, SubmitRequest};
use overlay_core::{
    CleanupJournal, Delivery, LiveProtocol, MemoryOverlayStore, MemorySource, OverlayStore,
    RowClass, RunEventKind, SourceKind, StoredBlock, WindowId,
};
use timeline_core::rows::{ApprovalKind, ApprovalResult, CardStatus, Decision};
use timeline_core::{
    ApprovalRequest, Block, BlockKey, BlockType, BoundaryToken, HostKey, Millis, RunId, SessionId,
    SourceOrder, TargetId,
};

fn session() -> SessionId {
    SessionId::new("session-1").unwrap()
}

fn source() -> MemorySource {
    MemorySource::new(
        SourceKind::Codex {
            thread_id: "thread-1".into(),
            generation: 1,
        },
        BoundaryToken::codex_rollout("/sessions/rollout-1.jsonl"),
    )
}

fn host_with<V: OverlayStore + CleanupJournal>(
    overlays: V,
    source: MemorySource,
) -> Host<MemoryOutboxStore, V> {
    let mut n = 0u64;
    let uuids = Box::new(move || {
        n += 1;
        format!("00000000-0000-4000-8000-{n:012x}")
    });
    let mut host = Host::new(
        MemoryOutboxStore::new(),
        overlays,
        HostConfig::new(HostKey::from_bytes([3; 32]), uuids),
    );
    host.add_session(
        &session(),
        SessionInfo::new(Capabilities::codex()),
        Box::new(source),
    );
    host.start(Millis(0)).unwrap();
    host
}

fn host() -> Host<MemoryOutboxStore, MemoryOverlayStore> {
    host_with(MemoryOverlayStore::new(), source())
}

fn drain<O: OutboxStore, V: OverlayStore + CleanupJournal>(
    host: &mut Host<O, V>,
) -> Vec<HostEffect> {
    std::iter::from_fn(|| host.poll_effect()).collect()
}

/// A phone joins the session: the text of every replay chunk it gets, in order.
fn join_text<O: OutboxStore, V: OverlayStore + CleanupJournal>(
    host: &mut Host<O, V>,
    now: Millis,
) -> String {
    host.handle_client(
        ReplyTo(4_000),
        ClientRequest::Join {
            session: session(),
            protocol: LiveProtocol::Snapshots,
        },
        now,
    );
    let replay = drain(host)
        .into_iter()
        .find_map(|e| match e {
            HostEffect::Reply {
                reply: Reply::Replay(chunks),
                ..
            } => Some(chunks),
            _ => None,
        })
        .expect("a join is answered with the replay");
    replay.iter().map(|c| c.json.as_str()).collect()
}

fn request() -> ApprovalRequest {
    ApprovalRequest {
        request_id: "7".into(),
        thread_id: "thread-1".into(),
        turn_id: "turn-1".into(),
        item_id: "item-1".into(),
        kind: ApprovalKind::CommandExecution,
        allowed: vec![Decision::Accept, Decision::Decline],
    }
}

fn decide(decision: Decision) -> ClientRequest {
    ClientRequest::ResolveApproval {
        request_id: "7".into(),
        thread_id: "thread-1".into(),
        turn_id: "turn-1".into(),
        item_id: "item-1".into(),
        decision,
    }
}

fn resolved(result: Result<ApprovalResult, String>) -> AgentInput {
    AgentInput::ApprovalResolved {
        request_id: "7".into(),
        thread_id: "thread-1".into(),
        turn_id: "turn-1".into(),
        item_id: "item-1".into(),
        result,
    }
}

fn ask<O: OutboxStore, V: OverlayStore + CleanupJournal>(host: &mut Host<O, V>) {
    let s = session();
    host.handle_agent(
        AgentInput::ApprovalAsked {
            session: s.clone(),
            target: TargetId::main(&s),
            run: None,
            request: request(),
            summary: "rm -rf build".into(),
        },
        Millis(10),
    );
}

fn approval_reply(
    effects: &[HostEffect],
    to: ReplyTo,
) -> Option<Result<ApprovalResult, ApprovalError>> {
    effects.iter().find_map(|e| match e {
        HostEffect::Reply {
            to: t,
            reply: Reply::Approval(r),
        } if *t == to => Some(r.clone()),
        _ => None,
    })
}

fn card_status<V: OverlayStore + CleanupJournal>(
    host: &mut Host<MemoryOutboxStore, V>,
) -> CardStatus {
    let s = session();
    let key = BlockKey::parse(BlockType::Activity, &request().card_id()).unwrap();
    let stored = host
        .overlays()
        .load(&s, &TargetId::main(&s))
        .unwrap()
        .unwrap();
    let row = stored.blocks.iter().find(|b| b.block.key() == key).unwrap();
    assert_eq!(row.class, RowClass::ApprovalCard);
    serde_json::from_value(row.block.data["approval"]["status"].clone()).unwrap()
}

// RW-06: the first decision the agent takes wins, on any device; a concurrent or later
// one from another device is "already resolved" and sees the decided card.
#[test]
fn an_approval_is_decided_once_across_devices() {
    let mut host = host();
    ask(&mut host);
    drain(&mut host);
    assert_eq!(card_status(&mut host), CardStatus::Pending);

    let (phone, desktop, tablet) = (ReplyTo(1), ReplyTo(2), ReplyTo(3));
    host.handle_client(phone, decide(Decision::Accept), Millis(20));
    host.handle_client(desktop, decide(Decision::Decline), Millis(21));
    let effects = drain(&mut host);
    let calls: Vec<_> = effects
        .iter()
        .filter(|e| matches!(e, HostEffect::Agent(AgentCall::ResolveApproval { .. })))
        .collect();
    assert_eq!(calls.len(), 1, "one decision goes to the agent");
    assert!(matches!(
        calls[0],
        HostEffect::Agent(AgentCall::ResolveApproval {
            decision: Decision::Accept,
            ..
        })
    ));
    assert_eq!(
        approval_reply(&effects, desktop),
        Some(Err(ApprovalError::AlreadyResolved { result: None })),
        "a concurrent decision from another device is refused"
    );
    assert_eq!(
        approval_reply(&effects, phone),
        None,
        "the phone waits for the agent"
    );

    host.handle_agent(resolved(Ok(ApprovalResult::Accepted)), Millis(30));
    let effects = drain(&mut host);
    assert_eq!(
        approval_reply(&effects, phone),
        Some(Ok(ApprovalResult::Accepted))
    );
    assert_eq!(
        card_status(&mut host),
        CardStatus::Accepted,
        "decided in place"
    );

    // A late decision, and a repeated answer from the agent, change nothing.
    host.handle_client(tablet, decide(Decision::Decline), Millis(40));
    host.handle_agent(resolved(Ok(ApprovalResult::Declined)), Millis(41));
    let effects = drain(&mut host);
    assert_eq!(
        approval_reply(&effects, tablet),
        Some(Err(ApprovalError::AlreadyResolved {
            result: Some(ApprovalResult::Accepted)
        }))
    );
    assert_eq!(card_status(&mut host), CardStatus::Accepted);

    // A phone that joins later replays the request stamped with its outcome.
    let text = join_text(&mut host, Millis(50));
    assert!(text.contains(r#""type":"approval_request""#), "{text}");
    assert!(text.contains(r#""outcome":"allowed""#), "{text}");
}

// RW-06: "The desktop refuses a decision that is not in that list."
#[test]
fn a_decision_outside_the_allowed_list_or_for_no_request_is_refused() {
    let mut host = host();
    host.handle_client(ReplyTo(1), decide(Decision::Accept), Millis(5));
    assert_eq!(
        approval_reply(&drain(&mut host), ReplyTo(1)),
        Some(Err(ApprovalError::Unknown))
    );
    ask(&mut host);
    drain(&mut host);
    host.handle_client(ReplyTo(2), decide(Decision::AcceptForSession), Millis(20));
    let effects = drain(&mut host);
    assert_eq!(
        approval_reply(&effects, ReplyTo(2)),
        Some(Err(ApprovalError::NotAllowed(Decision::AcceptForSession)))
    );
    assert!(!effects.iter().any(|e| matches!(e, HostEffect::Agent(_))));
    // The refusal did not use up the request.
    host.handle_client(ReplyTo(3), decide(Decision::Decline), Millis(21));
    assert!(drain(&mut host)
        .iter()
        .any(|e| matches!(e, HostEffect::Agent(AgentCall::ResolveApproval { .. }))));
}

// RW-06: a decision the agent did not take leaves the card pending for any device; a
// request settled elsewhere shows as expired.
#[test]
fn a_refused_decision_reopens_the_card_and_an_external_one_expires_it() {
    let mut host = host();
    ask(&mut host);
    host.handle_client(ReplyTo(1), decide(Decision::Accept), Millis(20));
    drain(&mut host);
    host.handle_agent(resolved(Err("the turn is gone".into())), Millis(21));
    assert_eq!(
        approval_reply(&drain(&mut host), ReplyTo(1)),
        Some(Err(ApprovalError::Refused("the turn is gone".into())))
    );
    assert_eq!(card_status(&mut host), CardStatus::Pending);

    host.handle_client(ReplyTo(2), decide(Decision::Decline), Millis(30));
    drain(&mut host);
    host.handle_agent(resolved(Ok(ApprovalResult::ResolvedExternally)), Millis(31));
    assert_eq!(
        approval_reply(&drain(&mut host), ReplyTo(2)),
        Some(Err(ApprovalError::AlreadyResolved {
            result: Some(ApprovalResult::ResolvedExternally)
        }))
    );
    assert_eq!(card_status(&mut host), CardStatus::Expired);
}

fn row(key: &str, run: &RunId) -> StoredBlock {
    StoredBlock {
        block: Block::new(
            BlockKey::parse(BlockType::AgentReply, key).unwrap(),
            Millis(100),
        )
        .with_data(serde_json::json!({ "text": key })),
        class: RowClass::Ordinary,
        run_id: Some(run.clone()),
    }
}

fn rows_input(rows: Vec<StoredBlock>) -> AgentInput {
    let s = session();
    AgentInput::Rows {
        session: s.clone(),
        target: TargetId::main(&s),
        rows,
    }
}

fn submit(
    host: &mut Host<MemoryOutboxStore, impl OverlayStore + CleanupJournal>,
    n: u32,
    now: Millis,
) -> Vec<HostEffect> {
    host.handle_client(
        ReplyTo(u64::from(n)),
        ClientRequest::Submit(SubmitRequest {
            session: session(),
            queue_id: QueueId::new(format!("q-{n}")).unwrap(),
            operation_id: OperationId::new(format!("op-{n}")).unwrap(),
            request: MessageRequest::text(format!("message {n}"), "phone", now),
            controls: Controls::automatic(),
        }),
        now,
    );
    drain(host)
}

fn window_subscription(host: &mut Host<MemoryOutboxStore, impl OverlayStore + CleanupJournal>) {
    let s = session();
    host.handle_client(
        ReplyTo(900),
        ClientRequest::Subscribe {
            window: WindowId(1),
            session: s.clone(),
            target: TargetId::main(&s),
            protocol: LiveProtocol::Snapshots,
        },
        Millis(1),
    );
    drain(host);
}

// OV-07 / OV-08: "the producer saves first and sends the saved snapshot": a write the
// store refused sends nothing and says so; the next saved write is sent.
#[test]
fn rows_the_store_refused_are_not_sent_and_the_failure_is_a_notice() {
    let mut host = host_with(flaky(), source());
    window_subscription(&mut host);
    let run = RunId::new("run-1").unwrap();
    host.overlays().with_plan(|p| p.writes_off = true);
    host.handle_agent(rows_input(vec![row("a", &run)]), Millis(10));
    host.handle_timeout(Millis(100));
    host.handle_timeout(Millis(100));
    let effects = drain(&mut host);
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, HostEffect::Notice(Notice::OverlayWriteFailed { .. }))),
        "{effects:?}"
    );
    assert!(!effects.iter().any(|e| matches!(e, HostEffect::Deliver(_))));

    host.overlays().with_plan(|p| p.writes_off = false);
    host.handle_agent(rows_input(vec![row("b", &run)]), Millis(200));
    host.handle_timeout(Millis(300));
    let delivered: Vec<_> = drain(&mut host)
        .into_iter()
        .filter_map(|e| match e {
            HostEffect::Deliver(Delivery::Window { payload, .. }) => Some(payload),
            _ => None,
        })
        .collect();
    assert_eq!(delivered.len(), 1);
    let overlay_core::Payload::Blocks { overlay, .. } = &delivered[0] else {
        panic!("blocks payload")
    };
    let keys: Vec<String> = overlay.blocks.iter().map(|b| b.id.to_string()).collect();
    assert_eq!(keys, ["b"], "only what was saved");
}

// OV-06: a Codex run's end writes the journal row, scans history for the run's exact
// keys, settles what it found, sends the saved overlay and removes the journal row.
#[test]
fn a_codex_run_end_settles_its_rows_found_in_history() {
    let mut host_source = source();
    let run = RunId::new("run-1").unwrap();
    host_source.push(vec![row("a", &run)
        .block
        .with_source_order(SourceOrder::history(0, 0))]);
    let mut host = host_with(MemoryOverlayStore::new(), host_source);
    window_subscription(&mut host);
    host.handle_agent(rows_input(vec![row("a", &run), row("b", &run)]), Millis(10));
    drain(&mut host);
    host.handle_agent(
        AgentInput::RunEnded {
            session: session(),
            run: run.clone(),
            outcome: RunEventKind::Completed,
            untaken: Vec::new(),
        },
        Millis(20),
    );
    // Three scans at +0, +100 and +250 ms; "b" is never found.
    for t in [20, 120, 270, 400] {
        host.handle_timeout(Millis(t));
    }
    let effects = drain(&mut host);
    let s = session();
    let stored = host
        .overlays()
        .load(&s, &TargetId::main(&s))
        .unwrap()
        .unwrap();
    let keys: HashSet<String> = stored
        .blocks
        .iter()
        .map(|b| b.block.id.to_string())
        .collect();
    assert_eq!(
        keys,
        HashSet::from(["b".to_owned()]),
        "only the found key settled"
    );
    assert_eq!(stored.settlement_epoch, 1, "a settled row raises the epoch");
    assert!(effects
        .iter()
        .any(|e| matches!(e, HostEffect::Notice(Notice::ScanGaveUp { .. }))));
    assert_eq!(
        host.overlays().pending_cleanups(None).unwrap(),
        vec![(s.clone(), run.clone())],
        "unsettled: the journal row stays for the restart repair"
    );
}

// OV-06 restart repair: a journal row left at a restart is scanned again when its
// session is first opened.
#[test]
fn journal_rows_left_at_a_restart_are_scanned_when_the_session_opens() {
    let run = RunId::new("run-1").unwrap();
    let s = session();
    let mut overlays = MemoryOverlayStore::new();
    overlay_core::store::write(
        &mut overlays,
        &s,
        &TargetId::main(&s),
        &overlay_core::Change::Publish(vec![row("a", &run)]),
    )
    .unwrap();
    overlays.add_cleanup(&s, &run).unwrap();
    let mut history = source();
    history.push(vec![row("a", &run)
        .block
        .with_source_order(SourceOrder::history(0, 0))]);
    let mut host = host_with(overlays, history);
    assert_eq!(host.overlays().pending_cleanups(None).unwrap().len(), 1);
    window_subscription(&mut host);
    host.handle_timeout(Millis(5));
    drain(&mut host);
    assert!(
        host.overlays().pending_cleanups(None).unwrap().is_empty(),
        "settled"
    );
    let stored = host
        .overlays()
        .load(&s, &TargetId::main(&s))
        .unwrap()
        .unwrap();
    assert!(stored.blocks.is_empty());
}

// OB-03 / OV-07: a run starts when custody hands the message to the agent as a turn, and
// the progress sink hears of its start and end; the host's deadline is the earliest of
// every inner machine.
#[test]
fn runs_reach_the_progress_sink_and_the_deadline_is_the_earliest() {
    let mut host = host();
    let effects = submit(&mut host, 1, Millis(1_000));
    let send = effects
        .iter()
        .find_map(|e| match e {
            HostEffect::Agent(AgentCall::Send(req)) => Some(req.clone()),
            _ => None,
        })
        .expect("the message goes to the agent");
    assert!(effects.iter().any(|e| matches!(
        e,
        HostEffect::Deliver(Delivery::Progress(ev)) if ev.event == RunEventKind::Started
    )));
    // Custody waits 31 s for the send; the deadline is never later than that.
    let deadline = host
        .poll_timeout()
        .expect("a deadline while a send is in flight");
    assert!(deadline <= Millis(1_000 + 31_000), "{deadline:?}");
    let run = host
        .custody()
        .runs()
        .active(&session())
        .unwrap()
        .run_id
        .clone();
    host.handle_agent(
        AgentInput::SendResult {
            attempt: send.attempt,
            result: SendResult::Delivered,
        },
        Millis(1_100),
    );
    host.handle_agent(
        AgentInput::RunEnded {
            session: session(),
            run,
            outcome: RunEventKind::Completed,
            untaken: Vec::new(),
        },
        Millis(1_200),
    );
    let effects = drain(&mut host);
    assert!(effects.iter().any(|e| matches!(
        e,
        HostEffect::Deliver(Delivery::Progress(ev)) if ev.event == RunEventKind::Completed
    )));
}

// OB-08: an answer for an old attempt, delivered twice and late, never makes the host
// send the message again, and the receipt reaches the caller once.
#[test]
fn late_and_repeated_answers_send_nothing_twice() {
    let mut host = host();
    let effects = submit(&mut host, 1, Millis(1_000));
    let receipts = effects
        .iter()
        .filter(|e| {
            matches!(
                e,
                HostEffect::Reply {
                    to: ReplyTo(1),
                    reply: Reply::Submitted(Ok(_))
                }
            )
        })
        .count();
    assert_eq!(receipts, 1);
    let send = effects
        .iter()
        .find_map(|e| match e {
            HostEffect::Agent(AgentCall::Send(req)) => Some(req.clone()),
            _ => None,
        })
        .unwrap();
    let mut sends = 1;
    for (t, result) in [
        (1_100, SendResult::Delivered),
        (1_200, SendResult::Delivered),
        (
            40_000,
            SendResult::AdmissionUncertain {
                error: "late".into(),
            },
        ),
    ] {
        host.handle_agent(
            AgentInput::SendResult {
                attempt: send.attempt,
                result,
            },
            Millis(t),
        );
        host.handle_timeout(Millis(t));
        sends += drain(&mut host)
            .iter()
            .filter(|e| matches!(e, HostEffect::Agent(AgentCall::Send(_))))
            .count();
    }
    assert_eq!(sends, 1);
    assert!(host.entries(&session()).unwrap().is_empty());
}

// RB-02: the replay records a user message once, even when custody sends it again (a
// deferred send goes out again as a new attempt of the same message).
#[test]
fn a_message_sent_again_is_recorded_once_in_the_replay() {
    let mut host = host();
    let effects = submit(&mut host, 1, Millis(1_000));
    let first = effects
        .iter()
        .find_map(|e| match e {
            HostEffect::Agent(AgentCall::Send(req)) => Some(req.clone()),
            _ => None,
        })
        .unwrap();
    host.handle_agent(
        AgentInput::SendResult {
            attempt: first.attempt,
            result: SendResult::Deferred {
                reason: "the agent is busy".into(),
            },
        },
        Millis(1_100),
    );
    host.handle_timeout(Millis(1_100));
    let again = drain(&mut host)
        .into_iter()
        .find_map(|e| match e {
            HostEffect::Agent(AgentCall::Send(req)) => Some(req),
            _ => None,
        })
        .expect("a deferred send goes out again");
    assert_eq!(again.operation_id, first.operation_id);
    assert_ne!(again.attempt, first.attempt);
    let text = join_text(&mut host, Millis(1_200));
    assert_eq!(
        text.matches(r#""type":"user_message""#).count(),
        1,
        "{text}"
    );
    assert!(text.contains(r#""clientId":"op-1""#), "{text}");
}

// OV-07, live patches: a patch the window refused (or that was never delivered) is
// reported through the host; the window's next update is a whole snapshot, never a
// patch on a base it does not hold.
#[test]
fn a_lost_patch_reported_to_the_host_makes_the_next_update_whole() {
    let mut host = host();
    let s = session();
    host.handle_client(
        ReplyTo(900),
        ClientRequest::Subscribe {
            window: WindowId(1),
            session: s.clone(),
            target: TargetId::main(&s),
            protocol: LiveProtocol::Patches,
        },
        Millis(1),
    );
    drain(&mut host);
    let run = RunId::new("run-1").unwrap();
    let window_deliveries = |effects: Vec<HostEffect>| -> Vec<Delivery> {
        effects
            .into_iter()
            .filter_map(|e| match e {
                HostEffect::Deliver(
                    d @ (Delivery::Window { .. } | Delivery::WindowPatch { .. }),
                ) => Some(d),
                _ => None,
            })
            .collect()
    };
    host.handle_agent(rows_input(vec![row("a", &run)]), Millis(10));
    settle(&mut host, Millis(10));
    let first = window_deliveries(drain(&mut host));
    assert!(!first.is_empty());
    host.handle_agent(rows_input(vec![row("b", &run)]), Millis(200));
    settle(&mut host, Millis(200));
    let second = window_deliveries(drain(&mut host));
    let patch = second
        .iter()
        .find(|d| matches!(d, Delivery::WindowPatch { .. }))
        .cloned()
        .expect("the window holds the base: a patch");
    // The window refused it.
    host.handle_delivery_lost(&patch, Millis(301));
    host.handle_agent(rows_input(vec![row("c", &run)]), Millis(400));
    settle(&mut host, Millis(400));
    let third = window_deliveries(drain(&mut host));
    assert!(!third.is_empty());
    assert!(
        third.iter().all(|d| matches!(d, Delivery::Window { .. })),
        "a whole snapshot after the loss: {third:?}"
    );
}

/// Runs the host's deadlines due within a second of `from` (the live stream's throttle).
fn settle<O: OutboxStore, V: OverlayStore + CleanupJournal>(host: &mut Host<O, V>, from: Millis) {
    let until = from.saturating_add(Millis(1_000));
    while let Some(at) = host.poll_timeout().filter(|at| *at <= until) {
        host.handle_timeout(at);
    }
}

// OV-05: `run.chatReconcileSessions` through the host: each session's latest window,
// outbox and active run in request order; at most 16 sessions (invalid params past it);
// a session named twice is invalid params too; a session the host does not serve is an
// unknown target.
#[test]
fn reconcile_sessions_answers_through_the_host() {
    let mut host = host();
    submit(&mut host, 1, Millis(1_000));
    let reconcile = |host: &mut Host<MemoryOutboxStore, MemoryOverlayStore>,
                     sessions: Vec<SessionId>| {
        host.handle_client(
            ReplyTo(77),
            ClientRequest::ReconcileSessions { sessions },
            Millis(2_000),
        );
        drain(host)
            .into_iter()
            .find_map(|e| match e {
                HostEffect::Reply {
                    to: ReplyTo(77),
                    reply: Reply::Reconciled(r),
                } => Some(r),
                _ => None,
            })
            .expect("answered")
    };
    let snapshots = reconcile(&mut host, vec![session()]).unwrap();
    assert_eq!(snapshots.len(), 1);
    assert_eq!(snapshots[0].app_session_id, session());
    assert_eq!(snapshots[0].outbox.len(), 1, "{:?}", snapshots[0].outbox);
    assert!(snapshots[0].active_run.is_some(), "op-1 started a run");
    let too_many = reconcile(&mut host, vec![session(); 17]).unwrap_err();
    assert!(
        matches!(
            &too_many,
            host_core::LoadError::Window(overlay_core::window::WindowError::InvalidParams(_))
        ),
        "{too_many:?}"
    );
    let twice = reconcile(&mut host, vec![session(); 2]).unwrap_err();
    assert!(
        matches!(
            &twice,
            host_core::LoadError::Window(overlay_core::window::WindowError::InvalidParams(_))
        ),
        "a session named twice: {twice:?}"
    );
    let unknown = reconcile(&mut host, vec![SessionId::new("nobody").unwrap()]).unwrap_err();
    assert!(
        matches!(unknown, host_core::LoadError::UnknownTarget { .. }),
        "{unknown:?}"
    );
}

// OB-16, RW-04: an agent's `send_session_message` goes through the host into the
// recipient's outbox and its tool result back to the agent; "Each change of the queue
// publishes the row of the sender again": the user's send of the held message turns the
// sender's row from "Needs approval" to "Sent", saved and sent like every live row.
#[test]
fn a_session_message_goes_through_the_host_and_its_delivery_republishes_the_senders_row() {
    use outbox_core::entry::AccessLevel;
    use outbox_core::ids::CallId;
    use outbox_core::session_message::{SessionMessageCall, ToolResult};
    use timeline_core::rows::{ActivityRow, MessageDelivery, MessageFact, OtherEnd};
    use timeline_core::AgentKind;

    let mut host = host();
    let sender = SessionId::new("session-a").unwrap();
    let mut info = SessionInfo::new(Capabilities::codex());
    info.access = Some(AccessLevel::ReadOnly);
    host.add_session(&sender, info, Box::new(source()));
    let mut recipient = SessionInfo::new(Capabilities::codex());
    recipient.access = Some(AccessLevel::FullAccess);
    host.add_session(&session(), recipient, Box::new(source()));
    // The sender's call row, as its agent's projection shows it once the call ended.
    let to = OtherEnd::Session {
        title: "Payments API".into(),
        agent: AgentKind::Codex,
    };
    let fact = MessageFact::sent(
        "This session",
        &to,
        Some(MessageDelivery::NeedsApproval),
        None,
    );
    let call_row = StoredBlock {
        block: Block::new(
            BlockKey::parse(BlockType::Activity, "call-1").unwrap(),
            Millis(100),
        )
        .with_data(serde_json::to_value(ActivityRow::message(fact, None)).unwrap()),
        class: RowClass::Ordinary,
        run_id: None,
    };
    host.handle_agent(
        AgentInput::Rows {
            session: sender.clone(),
            target: TargetId::main(&sender),
            rows: vec![call_row],
        },
        Millis(200),
    );
    drain(&mut host);
    host.handle_agent(
        AgentInput::SessionMessage(SessionMessageCall {
            sender_session: sender.clone(),
            sender_run: None,
            sender_thread: None,
            call_id: CallId::new("call-1").unwrap(),
            recipient: Some(session()),
            body: "Please run the Android build.".into(),
            sender_title: "Web landing".into(),
            sender_agent: AgentKind::Codex,
            sender_access: AccessLevel::ReadOnly,
            sender_project: None,
            product: "HB Code".into(),
        }),
        Millis(300),
    );
    let effects = drain(&mut host);
    let result = effects
        .iter()
        .find_map(|e| match e {
            HostEffect::Agent(AgentCall::SessionMessageResult {
                session,
                call_id,
                result,
            }) if session == &sender && call_id.as_str() == "call-1" => Some(result.clone()),
            _ => None,
        })
        .expect("the tool result goes back to the sender's agent");
    assert!(
        matches!(result, ToolResult::WaitingForApproval { .. }),
        "{result:?}"
    );
    let entry = host.entries(&session()).unwrap();
    let queue_id = entry[0].entry().unwrap().queue_id.clone();
    host.handle_client(
        ReplyTo(5),
        ClientRequest::SendNow {
            session: session(),
            queue_id,
        },
        Millis(400),
    );
    drain(&mut host);
    let saved = host
        .overlays()
        .load(&sender, &TargetId::main(&sender))
        .unwrap()
        .unwrap();
    let row = saved
        .blocks
        .iter()
        .find(|b| b.block.key().to_string().contains("call-1"))
        .unwrap();
    let shown: ActivityRow = serde_json::from_value(row.block.data.clone()).unwrap();
    let fact = shown.message.unwrap();
    assert_eq!(fact.delivery, Some(MessageDelivery::Sent));
    assert_eq!(shown.display.signal.as_deref(), Some("Sent"));
}

// A notice reads as one line that says what is known, and carries a severity; the
// host's counters follow what it did (failures, retries, deliveries, relay bytes,
// replays).
#[test]
fn notices_read_as_lines_with_a_severity_and_the_host_counts_what_it_did() {
    use host_core::Severity;
    let mut host = host_with(flaky(), source());
    window_subscription(&mut host);
    host.handle_client(
        ReplyTo(901),
        ClientRequest::Join {
            session: session(),
            protocol: LiveProtocol::Snapshots,
        },
        Millis(2),
    );
    drain(&mut host);
    assert_eq!((host.stats().replays, host.stats().deliveries), (1, 0));
    let run = RunId::new("run-1").unwrap();
    host.overlays().with_plan(|p| p.writes_off = true);
    host.handle_agent(rows_input(vec![row("a", &run)]), Millis(10));
    let notice = drain(&mut host)
        .into_iter()
        .find_map(|e| match e {
            HostEffect::Notice(n) => Some(n),
            _ => None,
        })
        .expect("the refused write is said");
    assert_eq!(notice.severity(), Severity::Error);
    assert_eq!(notice.session(), Some(&session()));
    let line = notice.to_string();
    assert!(
        line.contains("were not saved (so not sent)")
            && line.contains("injected failure of update"),
        "{line}"
    );
    assert_eq!(host.stats().overlay_write_failures, 1);
    assert_eq!(host.stats().deliveries, 0, "nothing unsaved is sent");

    host.overlays().with_plan(|p| p.writes_off = false);
    host.handle_timeout(Millis(1_010));
    let relayed: u64 = drain(&mut host)
        .iter()
        .filter_map(|e| match e {
            HostEffect::Deliver(Delivery::Relay(r)) => {
                Some(serde_json::to_string(&r.json).unwrap().len() as u64)
            }
            _ => None,
        })
        .sum();
    // The window's event waits for its 50 ms timer.
    host.handle_timeout(Millis(1_100));
    drain(&mut host);
    let stats = host.stats();
    assert_eq!(stats.write_retries, 1);
    assert_eq!(stats.deliveries, 2, "the relay and the window: {stats:?}");
    assert_eq!(stats.relay_events, 1);
    assert_eq!(stats.relay_bytes, relayed);
    assert!(Severity::Info < Severity::Warning && Severity::Error < Severity::Defect);
    assert_eq!(Notice::Unknown("x".into()).severity(), Severity::Defect);
}

// MH-05, OV-06: a scope taken over after its host died repeats the scans of the journal
// rows that host left (written after this host started), when the session next opens;
// a scope let go forgets its scans and journal rows (the next owner repeats them).
#[test]
fn a_scope_taken_over_repeats_the_scans_its_last_host_left_in_the_journal() {
    let run = RunId::new("run-1").unwrap();
    let s = session();
    let mut history = source();
    history.push(vec![row("a", &run)
        .block
        .with_source_order(SourceOrder::history(0, 0))]);
    let mut host = granted_host(history);
    // The host that served the scope wrote a live row and the run's journal row, then
    // died before its scans settled it.
    overlay_core::store::write(
        host.overlays(),
        &s,
        &TargetId::main(&s),
        &overlay_core::Change::Publish(vec![row("a", &run)]),
    )
    .unwrap();
    host.overlays().add_cleanup(&s, &run).unwrap();

    // Granted, then let go before the session opened: nothing is scanned here.
    host.grant_session(&s, Millis(1));
    host.release_session(&s, "taken over", Millis(2));
    host.grant_session(&s, Millis(3));
    host.release_session(&s, "taken over", Millis(4));
    drain(&mut host);
    host.grant_session(&s, Millis(5));
    window_subscription(&mut host);
    host.handle_timeout(Millis(10));
    drain(&mut host);
    assert!(
        host.overlays().pending_cleanups(None).unwrap().is_empty(),
        "the scan the last host left settled the row"
    );
    let stored = host
        .overlays()
        .load(&s, &TargetId::main(&s))
        .unwrap()
        .unwrap();
    assert!(stored.blocks.is_empty(), "{:?}", stored.blocks);
    assert_eq!(
        host.stats().exact_scans,
        1,
        "scanned once, not once per grant"
    );
}

/// A host among several: it serves only the sessions granted to it.
fn granted_host(history: MemorySource) -> Host<MemoryOutboxStore, MemoryOverlayStore> {
    let mut n = 0u64;
    let uuids = Box::new(move || {
        n += 1;
        format!("00000000-0000-4000-8000-{n:012x}")
    });
    let mut config = HostConfig::new(HostKey::from_bytes([3; 32]), uuids);
    config.granted_only = true;
    let mut host = Host::new(MemoryOutboxStore::new(), MemoryOverlayStore::new(), config);
    host.add_session(
        &session(),
        SessionInfo::new(Capabilities::codex()),
        Box::new(history),
    );
    host.start(Millis(0)).unwrap();
    host
}

// MH-01, RB-02: a session this host let go drops its replay: were the scope to come back
// here, a phone joining would get an empty replay that says so (it reloads), never
// events with the other host's part missing.
#[test]
fn a_session_let_go_starts_its_replay_again_empty() {
    let mut host = granted_host(source());
    host.grant_session(&session(), Millis(1));
    let sent = submit(&mut host, 1, Millis(1_000));
    assert!(sent
        .iter()
        .any(|e| matches!(e, HostEffect::Agent(AgentCall::Send(_)))));
    let before = join_text(&mut host, Millis(1_100));
    assert!(before.contains(r#""type":"user_message""#), "{before}");
    host.release_session(&session(), "taken over", Millis(1_200));
    host.grant_session(&session(), Millis(5_000));
    drain(&mut host);
    let after = join_text(&mut host, Millis(5_100));
    assert!(!after.contains(r#""type":"user_message""#), "{after}");
    assert!(after.contains(r#""reclaimed":true"#), "{after}");
}

fn delta(block: &str, text: &str) -> AgentInput {
    AgentInput::Delta {
        session: session(),
        fragment: host_core::Fragment::new(timeline_core::history::DeltaKind::Text, block, text),
    }
}

fn session_page(
    host: &mut Host<MemoryOutboxStore, MemoryOverlayStore>,
    before: Option<u64>,
    max_events: usize,
) -> Result<host_core::SessionPage, host_core::LoadError> {
    host.handle_client(
        ReplyTo(77),
        ClientRequest::SessionPage {
            session: session(),
            before,
            max_events,
        },
        Millis(9_000),
    );
    drain(host)
        .into_iter()
        .find_map(|e| match e {
            HostEffect::Reply {
                to: ReplyTo(77),
                reply: Reply::SessionPage(page),
            } => Some(page),
            _ => None,
        })
        .expect("a page request is answered")
}

// PK-06, PK-01, PK-02, PK-04: the agent's streamed fragments go to the session's windows and
// the relay one by one, scalar, numbered from 1; a page of the log packs each reply
// into one row that unpacks to exactly the events sent live.
#[test]
fn streamed_fragments_go_out_live_and_come_back_packed_in_a_page() {
    use timeline_core::history::{unpack_records, SessionHistoryRecord};
    let mut host = host();
    window_subscription(&mut host);
    join_text(&mut host, Millis(2));
    let mut live = Vec::new();
    let mut relayed = 0;
    for (i, (block, text)) in [("m1", "Hel"), ("m1", "lo"), ("m2", "Done"), ("m2", ".")]
        .into_iter()
        .enumerate()
    {
        host.handle_agent(delta(block, text), Millis(3_000 + i as u64));
        for effect in drain(&mut host) {
            match effect {
                HostEffect::Deliver(Delivery::Window {
                    window: WindowId(1),
                    payload: overlay_core::live::Payload::SessionEvent { event, .. },
                    ..
                }) => live.push(event),
                HostEffect::Deliver(Delivery::Relay(e)) => {
                    assert_eq!(e.json["event"], "session-event");
                    assert_eq!(e.json["sessionEvent"]["text"], text);
                    relayed += 1;
                }
                _ => {}
            }
        }
    }
    assert_eq!(live.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3, 4]);
    assert_eq!(relayed, 4, "every fragment reaches the relay");
    // RB-02: fragments are not kept for a joining phone; it pages them.
    let replay = join_text(&mut host, Millis(4_000));
    assert!(!replay.contains("session-event"), "{replay}");

    let page = session_page(&mut host, None, 100).unwrap();
    assert_eq!(page.records.len(), 2, "one packed row per reply");
    assert!(page
        .records
        .iter()
        .all(|r| matches!(r, SessionHistoryRecord::Chunks(_))));
    assert_eq!(unpack_records(&page.records).unwrap(), live);
    assert_eq!(
        (page.first_seq, page.next_seq, page.has_older),
        (1, 5, false)
    );
    assert!(page.log_id.is_some());

    // The newest page of one event widens to the whole last reply; the page before it
    // is the first reply.
    let newest = session_page(&mut host, None, 1).unwrap();
    assert_eq!(unpack_records(&newest.records).unwrap(), live[2..]);
    assert!(newest.has_older);
    let older = session_page(&mut host, Some(3), 1).unwrap();
    assert_eq!(unpack_records(&older.records).unwrap(), live[..2]);
    assert!(!older.has_older);
}

// A fragment for a session the host does not serve is not logged, and a page of it is
// refused with the target's error.
#[test]
fn fragments_and_pages_of_an_unknown_session_are_refused() {
    let mut host = host();
    host.handle_agent(
        AgentInput::Delta {
            session: SessionId::new("elsewhere").unwrap(),
            fragment: host_core::Fragment::new(timeline_core::history::DeltaKind::Text, "m1", "x"),
        },
        Millis(5),
    );
    assert!(drain(&mut host)
        .iter()
        .all(|e| !matches!(e, HostEffect::Deliver(_))));
    host.handle_client(
        ReplyTo(78),
        ClientRequest::SessionPage {
            session: SessionId::new("elsewhere").unwrap(),
            before: None,
            max_events: 10,
        },
        Millis(6),
    );
    let refused = drain(&mut host).into_iter().any(|e| {
        matches!(
            e,
            HostEffect::Reply {
                reply: Reply::SessionPage(Err(host_core::LoadError::UnknownTarget { .. })),
                ..
            }
        )
    });
    assert!(refused);
    let empty = session_page(&mut host, None, 10).unwrap();
    assert_eq!((empty.log_id, empty.records.len()), (None, 0));
}
