//! Bugs the whole-system simulation (`sim`) found in the host, each pinned by the seed
//! that found it (`cargo run --release -p sim -- --seed N` replays it with the fix, and
//! fails without it).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{flaky, flaky_over, take, Flaky};
use outbox_core::adapter::{ReadHistoryRequest, StopRequest};

use host_core::{AgentCall, AgentInput, ClientRequest, Host, HostConfig, HostEffect, Notice};
use host_core::{Reply, ReplyTo};
use outbox_core::adapter::SendResult;
use outbox_core::{Capabilities, Controls, HistoryRead, MemoryOutboxStore, MessageRequest};
use outbox_core::{OperationId, QueueId, SessionInfo, SubmitRequest};
use overlay_core::{CleanupJournal, MemorySource, OverlayStore};
use overlay_core::{SourceKind, StoredBlock};
use timeline_core::rows::{ApprovalKind, ApprovalResult, CardStatus, Decision};
use timeline_core::{ApprovalRequest, BlockKey, BlockType, BoundaryToken, HostKey, Millis};
use timeline_core::{RunId, SessionId, TargetId};

fn session() -> SessionId {
    SessionId::new("s0").unwrap()
}

fn host_over(
    outbox: MemoryOutboxStore,
    overlays: Flaky,
    caps: Capabilities,
) -> Host<MemoryOutboxStore, Flaky> {
    let mut n = 0u64;
    let uuids = Box::new(move || {
        n += 1;
        format!("00000000-0000-4000-8000-{n:012x}")
    });
    let mut host = Host::new(
        outbox,
        overlays,
        HostConfig::new(HostKey::from_bytes([5; 32]), uuids),
    );
    let source = MemorySource::new(
        SourceKind::Claude {
            session: "claude-s0".into(),
        },
        BoundaryToken::codex_rollout("/claude/s0.jsonl"),
    );
    host.add_session(&session(), SessionInfo::new(caps), Box::new(source));
    host
}

fn drain(host: &mut Host<MemoryOutboxStore, Flaky>) -> Vec<HostEffect> {
    std::iter::from_fn(|| host.poll_effect()).collect()
}

fn request() -> ApprovalRequest {
    ApprovalRequest {
        request_id: "s0-req-1".into(),
        thread_id: "thread-s0".into(),
        turn_id: "turn-1".into(),
        item_id: "item-1".into(),
        kind: ApprovalKind::CommandExecution,
        allowed: vec![Decision::Accept, Decision::Decline],
    }
}

fn ask() -> AgentInput {
    let s = session();
    AgentInput::ApprovalAsked {
        session: s.clone(),
        target: TargetId::main(&s),
        run: None,
        request: request(),
        summary: "cargo test -p crate-1".into(),
    }
}

fn expired() -> AgentInput {
    resolution(Ok(ApprovalResult::ResolvedExternally))
}

/// The agent's answer on `s0-req-1`.
fn resolution(result: Result<ApprovalResult, String>) -> AgentInput {
    AgentInput::ApprovalResolved {
        request_id: "s0-req-1".into(),
        thread_id: "thread-s0".into(),
        turn_id: "turn-1".into(),
        item_id: "item-1".into(),
        result,
    }
}

/// The card's status as the overlay store holds it.
fn card(host: &mut Host<MemoryOutboxStore, Flaky>) -> Option<CardStatus> {
    let s = session();
    let key = BlockKey::parse(BlockType::Activity, &request().card_id()).unwrap();
    let stored = host
        .overlays()
        .inner
        .load(&s, &TargetId::main(&s))
        .unwrap()?;
    let row = stored.blocks.iter().find(|b| b.block.key() == key)?;
    serde_json::from_value(row.block.data["approval"]["status"].clone()).ok()
}

// RW-06, sim seed 12: the agent's resolution came while the overlay store refused
// writes; the decided card was never written, and the card showed pending forever
// (cards never come back from history). The refused card is now written again.
#[test]
fn a_decided_card_the_store_refused_is_written_again() {
    let mut host = host_over(MemoryOutboxStore::new(), flaky(), Capabilities::claude());
    host.start(Millis(0)).unwrap();
    host.handle_client(
        ReplyTo(1),
        ClientRequest::Join {
            session: session(),
            protocol: overlay_core::LiveProtocol::Snapshots,
        },
        Millis(5),
    );
    host.handle_agent(ask(), Millis(10));
    drain(&mut host);
    assert_eq!(card(&mut host), Some(CardStatus::Pending));

    host.overlays().with_plan(|p| p.writes_off = true);
    host.handle_agent(expired(), Millis(20));
    let effects = drain(&mut host);
    assert!(effects
        .iter()
        .any(|e| matches!(e, HostEffect::Notice(Notice::OverlayWriteFailed { .. }))));
    assert_eq!(card(&mut host), Some(CardStatus::Pending), "not saved yet");
    let retry = host.poll_timeout().expect("the card is tried again");
    assert!(retry > Millis(20) && retry <= Millis(1_020), "{retry:?}");

    // Still down at the first retry: it is kept and tried again.
    host.handle_timeout(retry);
    drain(&mut host);
    let again = host.poll_timeout().expect("still kept");
    assert!(again > retry);

    host.overlays().with_plan(|p| p.writes_off = false);
    host.handle_timeout(again);
    let effects = drain(&mut host);
    assert_eq!(card(&mut host), Some(CardStatus::Expired));
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, HostEffect::Deliver(overlay_core::Delivery::Relay(_)))),
        "the saved card is sent"
    );
    assert_eq!(host.poll_timeout(), None, "nothing left to retry");
}

// RW-06, sim seed 1: a card asked before a restart was unknown to the new host, so the
// agent's resolution after the restart was ignored and the card showed pending for ever.
// The new host knows the cards the overlay store kept.
#[test]
fn a_card_kept_across_a_restart_is_decided_by_the_agent_after_it() {
    let mut host = host_over(MemoryOutboxStore::new(), flaky(), Capabilities::claude());
    host.start(Millis(0)).unwrap();
    host.handle_agent(ask(), Millis(10));
    drain(&mut host);
    let overlays = take(host.overlays());
    drop(host);

    let mut host = host_over(MemoryOutboxStore::new(), overlays, Capabilities::claude());
    host.start(Millis(1_000)).unwrap();
    drain(&mut host);
    host.handle_agent(expired(), Millis(1_010));
    drain(&mut host);
    assert_eq!(card(&mut host), Some(CardStatus::Expired));

    // A late decision from a device is answered as already resolved.
    host.handle_client(
        ReplyTo(7),
        ClientRequest::ResolveApproval {
            request_id: "s0-req-1".into(),
            thread_id: "thread-s0".into(),
            turn_id: "turn-1".into(),
            item_id: "item-1".into(),
            decision: Decision::Accept,
        },
        Millis(1_020),
    );
    let effects = drain(&mut host);
    assert!(effects.iter().any(|e| matches!(
        e,
        HostEffect::Reply {
            to: ReplyTo(7),
            reply: Reply::Approval(Err(host_core::ApprovalError::AlreadyResolved {
                result: Some(ApprovalResult::ResolvedExternally)
            })),
        }
    )));
    assert!(!effects.iter().any(|e| matches!(e, HostEffect::Agent(_))));
}

// RW-06, sim seed 24: at the restart the overlay store could not be read, so the cards
// it kept were unknown; they are read again later, and a resolution that came meanwhile
// waits for them.
#[test]
fn cards_the_store_could_not_read_at_start_are_read_again() {
    let mut host = host_over(MemoryOutboxStore::new(), flaky(), Capabilities::claude());
    host.start(Millis(0)).unwrap();
    host.handle_agent(ask(), Millis(10));
    drain(&mut host);
    let overlays = take(host.overlays());
    drop(host);

    overlays.with_plan(|p| p.reads_off = true);
    let mut host = host_over(MemoryOutboxStore::new(), overlays, Capabilities::claude());
    host.start(Millis(1_000)).unwrap();
    let effects = drain(&mut host);
    assert!(effects
        .iter()
        .any(|e| matches!(e, HostEffect::Notice(Notice::CardsUnread { .. }))));
    host.handle_agent(expired(), Millis(1_010));
    drain(&mut host);
    let retry = host.poll_timeout().expect("the cards are read again");

    host.overlays().with_plan(|p| p.reads_off = false);
    host.handle_timeout(retry);
    drain(&mut host);
    assert_eq!(card(&mut host), Some(CardStatus::Expired));
}

fn submit(n: u32, now: Millis) -> ClientRequest {
    ClientRequest::Submit(SubmitRequest {
        session: session(),
        queue_id: QueueId::new(format!("q-{n}")).unwrap(),
        operation_id: OperationId::new(format!("op-{n}")).unwrap(),
        request: MessageRequest::text(format!("message {n}"), "phone", now),
        controls: Controls::automatic(),
    })
}

// OB-14, sim seed 103: a run whose start the agent never answered stayed in the
// registry; custody reclaims a stale run only at the next start or when the active runs
// are read, so with nothing else happening the queue behind it waited for ever. The
// host now reclaims it when it turns stale.
#[test]
fn a_stale_run_is_reclaimed_when_it_turns_stale() {
    let mut host = host_over(MemoryOutboxStore::new(), flaky(), Capabilities::claude());
    host.start(Millis(0)).unwrap();
    host.handle_client(ReplyTo(1), submit(1, Millis(10)), Millis(10));
    let first = drain(&mut host)
        .into_iter()
        .find_map(|e| match e {
            HostEffect::Agent(AgentCall::Send(req)) => Some(req),
            _ => None,
        })
        .expect("the first message goes out");
    // Its answer never comes: after the send path's deadline the history is read, and
    // it says the message is not there. The run it started stays registered.
    let deadline = host.poll_timeout().unwrap();
    host.handle_timeout(deadline);
    let read = drain(&mut host)
        .into_iter()
        .find_map(|e| match e {
            HostEffect::Agent(AgentCall::ReadHistory(ReadHistoryRequest { attempt, .. })) => {
                Some(attempt)
            }
            _ => None,
        })
        .expect("the history is read");
    host.handle_agent(
        AgentInput::HistoryRead {
            attempt: read,
            read: HistoryRead::Missing,
        },
        deadline,
    );
    drain(&mut host);
    assert!(host.custody().runs().active(&session()).is_some());

    let now = deadline.saturating_add(Millis(10));
    host.handle_client(ReplyTo(2), submit(2, now), now);
    let effects = drain(&mut host);
    assert!(
        !effects
            .iter()
            .any(|e| matches!(e, HostEffect::Agent(AgentCall::Send(_)))),
        "the second message waits for the run"
    );
    // Nothing else happens; the run turns stale and is reclaimed; the queue moves on.
    let mut sent = None;
    for _ in 0..10 {
        let Some(at) = host.poll_timeout() else { break };
        host.handle_timeout(at);
        sent = drain(&mut host).into_iter().find_map(|e| match e {
            HostEffect::Agent(AgentCall::Send(req)) => Some(req),
            _ => None,
        });
        if sent.is_some() {
            break;
        }
    }
    let sent = sent.expect("the second message goes out once the run is stale");
    assert_eq!(sent.operation_id.as_str(), "op-2");
    assert!(sent.attempt != first.attempt);
    assert!(host.custody().runs().active(&session()).is_some_and(|r| {
        matches!(&sent.kind, outbox_core::adapter::SendKind::Start { run } if *run == r.run_id)
    }));
    // The answer of the first attempt, should it ever come, is stale.
    host.handle_agent(
        AgentInput::SendResult {
            attempt: first.attempt,
            result: SendResult::Delivered,
        },
        Millis(200_000),
    );
    drain(&mut host);
}

// OV-07, sim seed 81: the agent's user row was published while the overlay store
// refused writes; it was saved to history, but a client whose window had loaded before
// never saw it (nothing reloads a quiet session). A refused row is written again.
#[test]
fn a_live_row_the_store_refused_is_written_again() {
    let mut host = host_over(MemoryOutboxStore::new(), flaky(), Capabilities::claude());
    host.start(Millis(0)).unwrap();
    let s = session();
    let target = TargetId::main(&s);
    let row = |text: &str| StoredBlock {
        block: timeline_core::Block::new(
            BlockKey::parse(BlockType::AgentReply, "reply-1").unwrap(),
            Millis(10),
        )
        .with_data(serde_json::json!({ "text": text })),
        class: overlay_core::RowClass::Ordinary,
        run_id: None,
    };
    host.overlays().with_plan(|p| p.writes_off = true);
    host.handle_agent(
        AgentInput::Rows {
            session: s.clone(),
            target: target.clone(),
            rows: vec![row("Agent: partial")],
        },
        Millis(10),
    );
    drain(&mut host);
    let retry = host.poll_timeout().expect("the row is tried again");
    // A newer copy of the row is refused too: the newest one waits.
    host.handle_agent(
        AgentInput::Rows {
            session: s.clone(),
            target: target.clone(),
            rows: vec![row("Agent: final")],
        },
        Millis(20),
    );
    drain(&mut host);
    host.overlays().with_plan(|p| p.writes_off = false);
    host.handle_timeout(retry);
    drain(&mut host);
    let stored = host.overlays().inner.load(&s, &target).unwrap().unwrap();
    assert_eq!(stored.blocks.len(), 1);
    assert_eq!(stored.blocks[0].block.data["text"], "Agent: final");
    assert_eq!(host.poll_timeout(), None, "nothing left to retry");
}

// OV-07 (run events reach every sink), determinism, sim seed 10410: the host kept its
// runs in a `HashMap`, so the run ends of several sessions went out in an order that
// changed from one host to the next. The same inputs give the same effects, in the same
// order.
#[test]
fn run_ends_of_several_sessions_go_out_in_one_order() {
    let orders: Vec<Vec<String>> = (0..12)
        .map(|_| {
            let mut n = 0u64;
            let uuids = Box::new(move || {
                n += 1;
                format!("00000000-0000-4000-8000-{n:012x}")
            });
            let mut host = Host::new(
                MemoryOutboxStore::new(),
                flaky(),
                HostConfig::new(HostKey::from_bytes([5; 32]), uuids),
            );
            let sessions: Vec<SessionId> = (0..8)
                .map(|i| SessionId::new(format!("s{i}")).unwrap())
                .collect();
            for s in &sessions {
                let source = MemorySource::new(
                    SourceKind::Claude {
                        session: format!("claude-{s}"),
                    },
                    BoundaryToken::codex_rollout("/claude/x.jsonl"),
                );
                host.add_session(
                    s,
                    SessionInfo::new(Capabilities::claude()),
                    Box::new(source),
                );
            }
            host.start(Millis(0)).unwrap();
            for (i, s) in sessions.iter().enumerate() {
                host.handle_client(
                    ReplyTo(i as u64),
                    ClientRequest::Submit(SubmitRequest {
                        session: s.clone(),
                        queue_id: QueueId::new("q-1").unwrap(),
                        operation_id: OperationId::new(format!("op-{s}")).unwrap(),
                        request: MessageRequest::text("hi", "phone", Millis(10)),
                        controls: Controls::automatic(),
                    }),
                    Millis(10),
                );
            }
            drain(&mut host);
            // Nobody answers: every run turns stale at the same moment.
            let mut ends = Vec::new();
            for _ in 0..20 {
                let Some(at) = host.poll_timeout() else { break };
                host.handle_timeout(at);
                for e in drain(&mut host) {
                    if let HostEffect::Deliver(overlay_core::Delivery::Progress(event)) = e {
                        ends.push(format!("{:?} {}", event.event, event.app_session_id));
                    }
                }
            }
            ends
        })
        .collect();
    assert!(!orders[0].is_empty(), "the runs ended");
    assert!(orders.iter().all(|o| o == &orders[0]), "{orders:?}");
}

// OV-07, sim seed 63008: two phones joined a session and one left; the host dropped the
// session's relay interest, and the phone still there got no relay event again.
#[test]
fn a_phone_that_leaves_does_not_cut_off_the_other() {
    let mut host = host_over(MemoryOutboxStore::new(), flaky(), Capabilities::claude());
    host.start(Millis(0)).unwrap();
    let s = session();
    let join = || ClientRequest::Join {
        session: session(),
        protocol: overlay_core::LiveProtocol::Snapshots,
    };
    host.handle_client(ReplyTo(1), join(), Millis(1));
    host.handle_client(ReplyTo(2), join(), Millis(2));
    host.handle_client(
        ReplyTo(3),
        ClientRequest::Leave { session: s.clone() },
        Millis(3),
    );
    drain(&mut host);
    host.handle_agent(ask(), Millis(10));
    let relayed = drain(&mut host)
        .iter()
        .any(|e| matches!(e, HostEffect::Deliver(overlay_core::Delivery::Relay(_))));
    assert!(relayed, "the phone still joined gets the card");

    host.handle_client(
        ReplyTo(4),
        ClientRequest::Leave { session: s.clone() },
        Millis(20),
    );
    drain(&mut host);
    host.handle_agent(expired(), Millis(30));
    let relayed = drain(&mut host)
        .iter()
        .any(|e| matches!(e, HostEffect::Deliver(overlay_core::Delivery::Relay(_))));
    assert!(!relayed, "no phone left: nothing goes to the relay");
}

// OV-07, found in sim traces ("relay failed" right after a user's stop): a run custody
// let go because the user stopped it reached every client as failed. It ends aborted.
#[test]
fn a_stopped_run_ends_aborted_for_the_clients() {
    let mut host = host_over(MemoryOutboxStore::new(), flaky(), Capabilities::claude());
    host.start(Millis(0)).unwrap();
    host.handle_client(ReplyTo(1), submit(1, Millis(10)), Millis(10));
    drain(&mut host);
    host.handle_client(
        ReplyTo(2),
        ClientRequest::Stop { session: session() },
        Millis(20),
    );
    let attempt = drain(&mut host)
        .into_iter()
        .find_map(|e| match e {
            HostEffect::Agent(AgentCall::Stop(StopRequest { attempt, .. })) => Some(attempt),
            _ => None,
        })
        .expect("the stop goes to the agent");
    host.handle_agent(
        AgentInput::StopResult {
            attempt,
            result: outbox_core::adapter::StopResult::Stopped {
                untaken: Vec::new(),
            },
        },
        Millis(30),
    );
    let ends: Vec<overlay_core::RunEventKind> = drain(&mut host)
        .into_iter()
        .filter_map(|e| match e {
            HostEffect::Deliver(overlay_core::Delivery::Progress(event))
                if event.event != overlay_core::RunEventKind::Started =>
            {
                Some(event.event)
            }
            _ => None,
        })
        .collect();
    assert_eq!(ends, vec![overlay_core::RunEventKind::Aborted]);
}

fn decide(to: u64, decision: Decision) -> (ReplyTo, ClientRequest) {
    (
        ReplyTo(to),
        ClientRequest::ResolveApproval {
            request_id: "s0-req-1".into(),
            thread_id: "thread-s0".into(),
            turn_id: "turn-1".into(),
            item_id: "item-1".into(),
            decision,
        },
    )
}

fn decisions_sent(effects: &[HostEffect]) -> Vec<Decision> {
    effects
        .iter()
        .filter_map(|e| match e {
            HostEffect::Agent(AgentCall::ResolveApproval { decision, .. }) => Some(*decision),
            _ => None,
        })
        .collect()
}

fn run(n: u32) -> RunId {
    RunId::new(format!("run-{n}")).unwrap()
}

fn ask_in(run: RunId) -> AgentInput {
    let s = session();
    AgentInput::ApprovalAsked {
        session: s.clone(),
        target: TargetId::main(&s),
        run: Some(run),
        request: request(),
        summary: "cargo test -p crate-1".into(),
    }
}

// RW-06, sim seed 229 (and 124): a device decided, the decision went to the agent, and
// the host died before the agent's answer was saved. The new host showed the card
// pending, and a second device decided it a second time. The decision is now saved on
// the card before it is sent; the new host refuses other devices and sends the same
// decision again.
#[test]
fn a_decision_on_its_way_survives_a_restart_and_is_not_taken_twice() {
    let mut host = host_over(MemoryOutboxStore::new(), flaky(), Capabilities::claude());
    host.start(Millis(0)).unwrap();
    host.handle_agent(ask(), Millis(10));
    drain(&mut host);
    let (to, req) = decide(1, Decision::Accept);
    host.handle_client(to, req, Millis(20));
    let effects = drain(&mut host);
    assert_eq!(decisions_sent(&effects), vec![Decision::Accept]);
    // Saved before it went out: still pending, with the decision on its way.
    assert_eq!(card(&mut host), Some(CardStatus::Pending));
    let overlays = take(host.overlays());
    drop(host);

    let mut host = host_over(MemoryOutboxStore::new(), overlays, Capabilities::claude());
    host.start(Millis(1_000)).unwrap();
    let effects = drain(&mut host);
    assert_eq!(
        decisions_sent(&effects),
        vec![Decision::Accept],
        "the same decision goes to the agent again"
    );
    let (to, req) = decide(2, Decision::Decline);
    host.handle_client(to, req, Millis(1_010));
    let effects = drain(&mut host);
    assert!(
        decisions_sent(&effects).is_empty(),
        "a second device is refused"
    );
    assert!(effects.iter().any(|e| matches!(
        e,
        HostEffect::Reply {
            to: ReplyTo(2),
            reply: Reply::Approval(Err(host_core::ApprovalError::AlreadyResolved {
                result: None
            })),
        }
    )));
    host.handle_agent(resolution(Ok(ApprovalResult::Accepted)), Millis(1_020));
    drain(&mut host);
    assert_eq!(card(&mut host), Some(CardStatus::Accepted));
}

// RW-06: a decision whose card cannot be saved is not sent; the device is told, and the
// request stays open for any device.
#[test]
fn a_decision_that_cannot_be_saved_is_not_sent() {
    let mut host = host_over(MemoryOutboxStore::new(), flaky(), Capabilities::claude());
    host.start(Millis(0)).unwrap();
    host.handle_agent(ask(), Millis(10));
    drain(&mut host);
    host.overlays().with_plan(|p| p.writes_off = true);
    let (to, req) = decide(1, Decision::Accept);
    host.handle_client(to, req, Millis(20));
    let effects = drain(&mut host);
    assert!(decisions_sent(&effects).is_empty());
    assert!(effects.iter().any(|e| matches!(
        e,
        HostEffect::Reply {
            to: ReplyTo(1),
            reply: Reply::Approval(Err(host_core::ApprovalError::Unsaved(_))),
        }
    )));
    host.overlays().with_plan(|p| p.writes_off = false);
    let (to, req) = decide(2, Decision::Decline);
    host.handle_client(to, req, Millis(30));
    assert_eq!(
        decisions_sent(&drain(&mut host)),
        vec![Decision::Decline],
        "the request is open again"
    );
}

// RW-06: a decision the agent refused leaves the card pending without the decision it
// showed on its way, so a restart does not send it again.
#[test]
fn a_refused_decision_leaves_a_plain_pending_card() {
    let mut host = host_over(MemoryOutboxStore::new(), flaky(), Capabilities::claude());
    host.start(Millis(0)).unwrap();
    host.handle_agent(ask(), Millis(10));
    drain(&mut host);
    let (to, req) = decide(1, Decision::Accept);
    host.handle_client(to, req, Millis(20));
    drain(&mut host);
    host.handle_agent(
        resolution(Err("the agent could not take the decision".into())),
        Millis(30),
    );
    drain(&mut host);
    assert_eq!(card(&mut host), Some(CardStatus::Pending));
    let overlays = take(host.overlays());
    drop(host);
    let mut host = host_over(MemoryOutboxStore::new(), overlays, Capabilities::claude());
    host.start(Millis(1_000)).unwrap();
    assert!(decisions_sent(&drain(&mut host)).is_empty());
}

// RW-06, sim seed 124: the agent expired a request as its turn ended; the host could not
// save the expired card and died. The new host showed the card pending for ever. A card
// whose run ended expires, when the host sees the run end and when a restart finds its
// run no longer active.
#[test]
fn a_pending_card_expires_with_its_run() {
    let mut host = host_over(MemoryOutboxStore::new(), flaky(), Capabilities::claude());
    host.start(Millis(0)).unwrap();
    host.handle_agent(ask_in(run(1)), Millis(10));
    drain(&mut host);
    host.handle_agent(
        AgentInput::RunEnded {
            session: session(),
            run: run(1),
            outcome: overlay_core::RunEventKind::Completed,
            untaken: Vec::new(),
        },
        Millis(20),
    );
    drain(&mut host);
    assert_eq!(card(&mut host), Some(CardStatus::Expired));

    // Across a restart: the expiry could not be saved, and the host died.
    let mut host = host_over(MemoryOutboxStore::new(), flaky(), Capabilities::claude());
    host.start(Millis(0)).unwrap();
    host.handle_agent(ask_in(run(2)), Millis(10));
    drain(&mut host);
    host.overlays().with_plan(|p| p.writes_off = true);
    host.handle_agent(expired(), Millis(20));
    drain(&mut host);
    assert_eq!(card(&mut host), Some(CardStatus::Pending));
    let overlays = take(host.overlays());
    overlays.with_plan(|p| p.writes_off = false);
    drop(host);
    let mut host = host_over(MemoryOutboxStore::new(), overlays, Capabilities::claude());
    host.start(Millis(1_000)).unwrap();
    drain(&mut host);
    assert_eq!(card(&mut host), Some(CardStatus::Expired));
}

// RW-06, sim seed 7545: a decision was on its way when the run ended and the host died
// before the expired card was saved; the new host sent the decision again, the agent
// said the request was no longer open, and the card went back to pending for ever. The
// refusal of a request whose run is gone expires it (sim seed 1867: the agent may have
// taken the decision before the run ended, so the decision is sent again first).
#[test]
fn a_decision_on_its_way_to_a_run_that_ended_expires_when_the_agent_refuses_it() {
    let mut host = host_over(MemoryOutboxStore::new(), flaky(), Capabilities::claude());
    host.start(Millis(0)).unwrap();
    host.handle_agent(ask_in(run(3)), Millis(10));
    drain(&mut host);
    let (to, req) = decide(1, Decision::Accept);
    host.handle_client(to, req, Millis(20));
    assert_eq!(decisions_sent(&drain(&mut host)), vec![Decision::Accept]);
    let overlays = take(host.overlays());
    drop(host);

    let mut host = host_over(MemoryOutboxStore::new(), overlays, Capabilities::claude());
    host.start(Millis(1_000)).unwrap();
    assert_eq!(
        decisions_sent(&drain(&mut host)),
        vec![Decision::Accept],
        "the agent may have taken it: asked again"
    );
    host.handle_agent(
        resolution(Err("the request is no longer open".into())),
        Millis(1_010),
    );
    drain(&mut host);
    assert_eq!(card(&mut host), Some(CardStatus::Expired));

    // Sim seed 1977: the refusal answered one of two copies of the decision (the dead
    // host's and the new host's); the other was taken. What the agent took wins over
    // the expiry the host inferred.
    host.handle_agent(resolution(Ok(ApprovalResult::Accepted)), Millis(1_020));
    drain(&mut host);
    assert_eq!(card(&mut host), Some(CardStatus::Accepted));
}

// RW-06, sim seed 24480: a host expired a card at a restart (its run was gone) and saved
// it; the next host restored it as decided, so the agent's later `Accepted` (a decision
// on its way when the run ended) no longer replaced it. A saved expired card still
// yields to what the agent took.
#[test]
fn a_saved_expired_card_yields_to_the_agents_decision_after_a_restart() {
    let mut host = host_over(MemoryOutboxStore::new(), flaky(), Capabilities::claude());
    host.start(Millis(0)).unwrap();
    host.handle_agent(ask_in(run(4)), Millis(10));
    drain(&mut host);
    host.handle_agent(
        AgentInput::RunEnded {
            session: session(),
            run: run(4),
            outcome: overlay_core::RunEventKind::Completed,
            untaken: Vec::new(),
        },
        Millis(20),
    );
    drain(&mut host);
    assert_eq!(card(&mut host), Some(CardStatus::Expired));
    let overlays = take(host.overlays());
    drop(host);

    let mut host = host_over(MemoryOutboxStore::new(), overlays, Capabilities::claude());
    host.start(Millis(1_000)).unwrap();
    drain(&mut host);
    host.handle_agent(resolution(Ok(ApprovalResult::Accepted)), Millis(1_010));
    drain(&mut host);
    assert_eq!(card(&mut host), Some(CardStatus::Accepted));
    // A device is still told the request is settled.
    let (to, req) = decide(9, Decision::Decline);
    host.handle_client(to, req, Millis(1_020));
    assert!(decisions_sent(&drain(&mut host)).is_empty());
}

/// The relay events' kinds while a run works and the agent asks twice, after phones
/// joined with `protocols`.
fn relay_kinds_after_joins(protocols: &[overlay_core::LiveProtocol]) -> Vec<String> {
    let mut host = host_over(MemoryOutboxStore::new(), flaky(), Capabilities::claude());
    host.start(Millis(0)).unwrap();
    for (i, protocol) in protocols.iter().enumerate() {
        host.handle_client(
            ReplyTo(100 + i as u64),
            ClientRequest::Join {
                session: session(),
                protocol: *protocol,
            },
            Millis(1),
        );
    }
    host.handle_client(ReplyTo(1), submit(1, Millis(10)), Millis(10));
    drain(&mut host);
    let mut kinds = Vec::new();
    for n in 1..=3u8 {
        let mut request = request();
        request.request_id = format!("s0-req-{n}");
        let s = session();
        host.handle_agent(
            AgentInput::ApprovalAsked {
                session: s.clone(),
                target: TargetId::main(&s),
                run: None,
                request,
                summary: format!("cargo test -p crate-{n}"),
            },
            Millis(20 + u64::from(n)),
        );
        for e in drain(&mut host) {
            if let HostEffect::Deliver(overlay_core::Delivery::Relay(event)) = e {
                kinds.push(event.json["event"].as_str().unwrap_or_default().to_owned());
            }
        }
    }
    kinds
}

// OV-07, TL-06 (live patches; found reading the host, not by a seed): the relay of a
// session is one stream for all its phones. A phone that asked for patches joined after
// one that knows only snapshots, and the relay switched to patches for both. It speaks
// patches only while every phone that joined does.
#[test]
fn a_relay_speaks_patches_only_when_every_phone_does() {
    use overlay_core::LiveProtocol::{Patches, Snapshots};
    let both = relay_kinds_after_joins(&[Patches, Patches]);
    assert!(
        both.iter().any(|k| k == "blocks-patch"),
        "phones that both speak patches get them: {both:?}"
    );
    let mixed = relay_kinds_after_joins(&[Snapshots, Patches]);
    assert!(
        mixed.iter().any(|k| k == "blocks") && !mixed.iter().any(|k| k == "blocks-patch"),
        "a phone that knows only snapshots never gets a patch: {mixed:?}"
    );
}

fn reply_row(key: &str, run: &RunId) -> StoredBlock {
    StoredBlock {
        block: timeline_core::Block::new(
            BlockKey::parse(BlockType::AgentReply, key).unwrap(),
            Millis(100),
        )
        .with_data(serde_json::json!({ "text": key })),
        class: overlay_core::RowClass::Ordinary,
        run_id: Some(run.clone()),
    }
}

fn main_overlay(host: &mut Host<MemoryOutboxStore, Flaky>) -> (u64, Vec<String>) {
    let s = session();
    let o = host.overlays().inner.load(&s, &TargetId::main(&s)).unwrap();
    o.map_or((0, Vec::new()), |o| {
        let ids = o.blocks.iter().map(|b| b.block.id.to_string()).collect();
        (o.settlement_epoch, ids)
    })
}

/// The run custody starts for the next send, after submitting `op-n`.
fn submit_sent(
    host: &mut Host<MemoryOutboxStore, Flaky>,
    n: u32,
    controls: Controls,
    now: Millis,
) -> (RunId, outbox_core::adapter::AttemptId) {
    let mut request = MessageRequest::text(format!("message {n}"), "phone", now);
    request.rollback_before_send = controls == Controls::replace_latest();
    host.handle_client(
        ReplyTo(u64::from(n)),
        ClientRequest::Submit(SubmitRequest {
            session: session(),
            queue_id: QueueId::new(format!("q-{n}")).unwrap(),
            operation_id: OperationId::new(format!("op-{n}")).unwrap(),
            request,
            controls,
        }),
        now,
    );
    drain(host)
        .into_iter()
        .find_map(|e| match e {
            HostEffect::Agent(AgentCall::Send(req)) => match req.kind {
                outbox_core::adapter::SendKind::Start { run } => Some((run, req.attempt)),
                _ => None,
            },
            _ => None,
        })
        .expect("sent")
}

/// Run 1 of `op-1`: delivered, its reply `r1` live, ended; no scan found `r1` yet.
fn a_run_that_left_a_row(host: &mut Host<MemoryOutboxStore, Flaky>) -> RunId {
    let (run, attempt) = submit_sent(host, 1, Controls::automatic(), Millis(10));
    host.handle_agent(
        AgentInput::SendResult {
            attempt,
            result: SendResult::Delivered,
        },
        Millis(11),
    );
    let s = session();
    host.handle_agent(
        AgentInput::Rows {
            session: s.clone(),
            target: TargetId::main(&s),
            rows: vec![reply_row("r1", &run)],
        },
        Millis(12),
    );
    host.handle_agent(
        AgentInput::RunEnded {
            session: s.clone(),
            run: run.clone(),
            outcome: overlay_core::RunEventKind::Completed,
            untaken: Vec::new(),
        },
        Millis(13),
    );
    run
}

// OV-10, OB-11, sim seeds 19 (rolled-back-rows-unsettled) and 1960
// (rollback-unannounced): a replace latest rolled back the turn of run 1, whose rows no
// scan had settled. They stayed in the saved overlay for good, and clients holding a
// window from before kept showing the replaced turn, since no epoch rose. The agent's
// report of the rollback now takes every ordinary row of the other runs out and raises
// the epoch; a late row of the replaced run is not published; a refused write is said
// and written again.
#[test]
fn a_rolled_back_turn_leaves_the_overlay_and_the_clients_reload() {
    let mut host = host_over(MemoryOutboxStore::new(), flaky(), Capabilities::codex());
    host.start(Millis(0)).unwrap();
    host.handle_client(
        ReplyTo(100),
        ClientRequest::Join {
            session: session(),
            protocol: overlay_core::LiveProtocol::Snapshots,
        },
        Millis(5),
    );
    let first = a_run_that_left_a_row(&mut host);
    let s = session();
    drain(&mut host);
    let (epoch, ids) = main_overlay(&mut host);
    assert_eq!(ids, vec!["r1".to_owned()], "no scan found r1 yet");

    let (second, _) = submit_sent(&mut host, 2, Controls::replace_latest(), Millis(20));
    assert_ne!(second, first);
    host.overlays().with_plan(|p| p.writes_off = true);
    let op2 = OperationId::new("op-2").unwrap();
    host.handle_agent(
        AgentInput::RolledBack {
            session: s.clone(),
            operation_id: op2.clone(),
        },
        Millis(21),
    );
    let effects = drain(&mut host);
    assert!(effects
        .iter()
        .any(|e| matches!(e, HostEffect::Notice(Notice::HistoryRewriteFailed { .. }))));
    assert_eq!(
        main_overlay(&mut host).1,
        vec!["r1".to_owned()],
        "not saved yet"
    );
    host.overlays().with_plan(|p| p.writes_off = false);
    // Tried again a second later.
    let retry = Millis(1_021);
    assert!(host.poll_timeout().is_some_and(|t| t <= retry));
    host.handle_timeout(retry);
    let effects = drain(&mut host);
    let (after, ids) = main_overlay(&mut host);
    assert!(ids.is_empty(), "{ids:?}");
    assert!(after > epoch, "the epoch rose");
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, HostEffect::Deliver(overlay_core::Delivery::Relay(_)))),
        "the saved overlay is sent"
    );
    // A late row of the replaced run is not published; the new run's rows are.
    host.handle_agent(
        AgentInput::Rows {
            session: s.clone(),
            target: TargetId::main(&s),
            rows: vec![reply_row("late", &first), reply_row("r2", &second)],
        },
        retry.saturating_add(Millis(1)),
    );
    assert_eq!(main_overlay(&mut host).1, vec!["r2".to_owned()]);
    // And custody sends the message without the rollback from now on.
    let stored = host.entries(&s).unwrap();
    let entry = stored
        .iter()
        .filter_map(|e| e.entry())
        .find(|e| e.operation_id == op2)
        .expect("still waiting for its answer");
    assert!(!entry.request.rollback_before_send);
}

// OV-10, sim seed 149: the write that announces lost history was refused and the host
// died before its retry in memory; the rows of the replaced turn stayed for good. The
// refusal is now kept in the cleanup journal (`REWRITE_JOURNAL_RUN`): the next host
// does the rewrite when the session's first target opens, and removes the row.
#[test]
fn a_refused_rewrite_survives_a_restart_in_the_journal() {
    let mut host = host_over(MemoryOutboxStore::new(), flaky(), Capabilities::codex());
    host.start(Millis(0)).unwrap();
    a_run_that_left_a_row(&mut host);
    let s = session();
    submit_sent(&mut host, 2, Controls::replace_latest(), Millis(20));
    host.overlays().with_plan(|p| p.writes_off = true);
    host.handle_agent(
        AgentInput::RolledBack {
            session: s.clone(),
            operation_id: OperationId::new("op-2").unwrap(),
        },
        Millis(21),
    );
    drain(&mut host);
    let marker = RunId::new(host_core::REWRITE_JOURNAL_RUN).unwrap();
    let journal = |host: &mut Host<MemoryOutboxStore, Flaky>| {
        host.overlays()
            .inner
            .pending_cleanups(Some(&session()))
            .unwrap()
    };
    assert!(journal(&mut host).contains(&(s.clone(), marker.clone())));
    assert_eq!(main_overlay(&mut host).1, vec!["r1".to_owned()]);

    // The host dies before its retry; the next one opens the same stores.
    let overlays = flaky_over(host.overlays().inner.clone());
    drop(host);
    // (The outbox plays no part in the rewrite.)
    let mut host = host_over(MemoryOutboxStore::new(), overlays, Capabilities::codex());
    host.start(Millis(5_000)).unwrap();
    let (epoch, _) = main_overlay(&mut host);
    host.handle_client(
        ReplyTo(100),
        ClientRequest::Join {
            session: s.clone(),
            protocol: overlay_core::LiveProtocol::Snapshots,
        },
        Millis(5_010),
    );
    drain(&mut host);
    let (after, ids) = main_overlay(&mut host);
    assert!(ids.is_empty(), "{ids:?}");
    assert!(after > epoch);
    assert!(
        !journal(&mut host).contains(&(s, marker)),
        "the row is removed"
    );
}
