//! Send results, the admission boundary, history reads, drain lanes and start-up
//! (OB-08 to OB-12).
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use fixtures::adapters::{Step, WhenUnscripted};
use outbox_core::adapter::{HistoryRead, SendResult};
use outbox_core::adapter::{ReadHistoryRequest, StopRequest, TakeBackRequest};
use outbox_core::custody::{Custody, CustodyEffect, SENDING_WRITE_FAILED_TEXT};
use outbox_core::entry::{Controls, EntryStatus, HandoffPhase, UNCONFIRMED_TEXT};
use outbox_core::ids::ScopeId;

use outbox_core::adapter::Capabilities;
use outbox_core::ledger::LedgerStatus;
use outbox_core::store::OutboxStore;
use timeline_core::time::Millis;

fn ledger(b: &mut Bench, n: &str) -> Option<LedgerStatus> {
    b.c.store()
        .ledger(&ScopeId::of(&s("s1")), &op(&format!("op-{n}")))
        .unwrap()
        .map(|l| l.status)
}

// OB-08: delivered → ledger sent, then removed.
#[test]
fn delivered_records_sent_then_removes_the_entry() {
    let mut b = Bench::codex(&["s1"]);
    b.submit("s1", "1", Controls::automatic());
    assert!(b.entries("s1").is_empty());
    assert_eq!(ledger(&mut b, "1"), Some(LedgerStatus::Sent));
    assert_eq!(b.agent.send_count(&op("op-1")), 1);
}

// OB-08: an accepted message stays sending with its acceptance until the echo.
#[test]
fn accepted_stays_sending_with_its_acceptance_until_the_echo() {
    let mut b = Bench::codex(&["s1"]);
    b.agent.default = WhenUnscripted::Accept;
    b.submit("s1", "1", Controls::automatic());
    let e = b.entry("s1", "1").unwrap();
    assert_eq!(e.state.status(), EntryStatus::Sending);
    assert!(e.state.acceptance().is_some());
    let l =
        b.c.store()
            .ledger(&ScopeId::of(&s("s1")), &op("op-1"))
            .unwrap()
            .unwrap();
    assert_eq!(
        (
            l.status,
            l.acceptance.is_some(),
            l.admission_input_digest.is_some()
        ),
        (LedgerStatus::Sending, true, true)
    );
    b.c.handle_delivery_proof(&s("s1"), &op("op-1"), b.now);
    assert!(b.entry("s1", "1").is_none());
    assert_eq!(ledger(&mut b, "1"), Some(LedgerStatus::Sent));
}

// OB-08: deferred → queued, auto-drain on, hold reason; the next drain tries again.
#[test]
fn deferred_goes_back_with_auto_drain_on() {
    let mut b = Bench::codex(&["s1"]);
    b.agent.default = WhenUnscripted::Accept;
    b.submit("s1", "run", Controls::automatic());
    let run = b.active_run("s1").unwrap();
    b.c.submit(submit_req("s1", "1", Controls::steer(run.clone())), b.now)
        .unwrap();
    let Some(CustodyEffect::Send(req)) = b.c.poll_effect() else {
        panic!()
    };
    // While the steer is in flight the run is being stopped; the host defers the steer.
    b.c.stop(&s("s1"), &run, None, b.now);
    let Some(CustodyEffect::Stop(StopRequest { attempt: stop, .. })) = b.c.poll_effect() else {
        panic!()
    };
    b.c.handle_send_result(
        req.attempt,
        SendResult::Deferred {
            reason: "the interrupted run still settles".into(),
        },
        b.now,
    );
    let e = b.entry("s1", "1").unwrap();
    assert_eq!(
        (
            e.state.status(),
            e.state.auto_drain(),
            e.state.hold_reason()
        ),
        (
            EntryStatus::Queued,
            true,
            Some("the interrupted run still settles")
        )
    );
    assert!(
        b.c.poll_effect().is_none(),
        "a pending cancellation drains nothing"
    );
    // The stop settles: the next drain tries again (as its own run, since the steer's
    // run ended).
    b.c.handle_stop_result(
        stop,
        outbox_core::adapter::StopResult::Stopped { untaken: vec![] },
        b.now,
    );
    b.drive();
    // (The first attempt was answered by hand above; the adapter sees the retry.)
    assert_eq!(b.agent.send_count(&op("op-1")), 1);
    assert!(matches!(
        b.agent.sends.last().unwrap().kind,
        outbox_core::adapter::SendKind::Start { .. }
    ));
}

// OB-08: canceled → queued, auto-drain off, no error; proven unadmitted → with error.
#[test]
fn canceled_and_proven_unadmitted_go_back_with_auto_drain_off() {
    let mut b = Bench::claude(&["s1"]);
    b.agent.then(Step::result(SendResult::Canceled));
    b.agent.then(Step::result(SendResult::ProvenUnadmitted {
        error: "the actor is closed".into(),
    }));
    b.submit("s1", "1", Controls::automatic());
    let e = b.entry("s1", "1").unwrap();
    assert_eq!(
        (e.state.status(), e.state.auto_drain(), e.state.error()),
        (EntryStatus::Queued, false, None)
    );
    assert_eq!(ledger(&mut b, "1"), Some(LedgerStatus::Canceled));
    b.submit("s1", "2", Controls::automatic());
    let e = b.entry("s1", "2").unwrap();
    assert_eq!(
        (e.state.status(), e.state.auto_drain(), e.state.error()),
        (EntryStatus::Queued, false, Some("the actor is closed"))
    );
    // "failed cannot replace sending": the ledger keeps the attempt's record.
    assert_eq!(ledger(&mut b, "2"), Some(LedgerStatus::Sending));
    assert!(b.active_run("s1").is_none(), "no run stays behind");
    // Nothing is retried automatically.
    b.advance(120_000);
    assert_eq!(b.agent.sends.len(), 2);
}

// OB-08: uncertain → the history read decides: found, missing, unreadable.
#[test]
fn an_uncertain_send_is_settled_by_the_history_read() {
    // Found: sent and removed.
    let mut b = Bench::codex(&["s1"]);
    b.agent.then(Step::lost_reply_but_recorded());
    b.submit("s1", "1", Controls::automatic());
    assert!(b.entry("s1", "1").is_none());
    assert_eq!(ledger(&mut b, "1"), Some(LedgerStatus::Sent));
    // Missing: held, auto-drain off, the seed's text.
    let mut b = Bench::codex(&["s1"]);
    b.agent.then(Step::lost_reply_not_recorded());
    b.submit("s1", "1", Controls::automatic());
    let e = b.entry("s1", "1").unwrap();
    assert_eq!(
        (e.state.status(), e.state.auto_drain(), e.state.error()),
        (EntryStatus::Queued, false, Some(UNCONFIRMED_TEXT))
    );
    // Unreadable: held the same way.
    let mut b = Bench::claude(&["s1"]);
    b.agent.then(Step::lost_reply_but_recorded());
    b.agent.unreadable = true;
    b.submit("s1", "1", Controls::automatic());
    let e = b.entry("s1", "1").unwrap();
    assert_eq!(e.state.error(), Some(UNCONFIRMED_TEXT));
    assert!(!e.state.auto_drain());
    // No automatic retry.
    b.advance(600_000);
    assert_eq!(b.agent.send_count(&op("op-1")), 1);
}

// OB-09: after the hand-off the send path waits 31 s, then the send is uncertain.
#[test]
fn the_send_path_gives_up_after_31_seconds_as_uncertain() {
    let mut b = Bench::codex(&["s1"]);
    b.c.submit(submit_req("s1", "1", Controls::automatic()), Millis(0))
        .unwrap();
    let Some(CustodyEffect::Send(send)) = b.c.poll_effect() else {
        panic!()
    };
    assert_eq!(b.c.poll_timeout(), Some(Millis(31_000)));
    b.c.handle_timeout(Millis(30_999));
    assert!(b.c.poll_effect().is_none());
    b.c.handle_timeout(Millis(31_000));
    let effects: Vec<CustodyEffect> = std::iter::from_fn(|| b.c.poll_effect()).collect();
    assert_eq!(effects.len(), 1);
    let read = history_read(&effects, "s1", "op-1").expect("the history read");
    // The late reply after the deadline changes nothing.
    b.c.handle_send_result(send.attempt, SendResult::Delivered, Millis(40_000));
    assert_eq!(
        b.entry("s1", "1").unwrap().state.status(),
        EntryStatus::Sending
    );
    b.c.handle_history_read(read, HistoryRead::Missing, Millis(41_000));
    assert_eq!(
        b.entry("s1", "1").unwrap().state.error(),
        Some(UNCONFIRMED_TEXT)
    );
}

// OB-09, OB-07: a failure before the hand-off (the sending write) is proven unadmitted:
// the ledger memory fallback takes the record while the store cannot; when the fallback
// refuses too, nothing reaches the agent and the entry comes back with the error.
#[test]
fn a_failed_sending_write_is_proven_unadmitted_and_nothing_is_sent() {
    let mut b = Bench::codex(&["s1", "s2"]);
    b.agent.default = WhenUnscripted::Accept;
    b.c.store().with_plan(|p| {
        p.only = LEDGER_WRITES.to_vec();
        p.writes_off = true;
    });
    // The store cannot write its ledger: the fallback holds the record and the send goes.
    b.submit("s1", "0", Controls::automatic());
    assert_eq!(b.agent.send_count(&op("op-0")), 1);
    assert_eq!(
        b.c.fallback()
            .get(&ScopeId::of(&s("s1")), &op("op-0"))
            .map(|r| r.status),
        Some(LedgerStatus::Sending)
    );
    // Fill the fallback with sent proofs.
    for i in 0..256 {
        b.c.handle_delivery_proof(&s("s2"), &op(&format!("gone-{i}")), b.now);
    }
    assert_eq!(b.c.fallback().len(), 256);
    b.submit("s2", "1", Controls::automatic());
    assert_eq!(
        b.agent.send_count(&op("op-1")),
        0,
        "nothing was handed to the agent"
    );
    let e = b.entry("s2", "1").unwrap();
    assert_eq!(
        (e.state.status(), e.state.auto_drain(), e.state.error()),
        (EntryStatus::Queued, false, Some(SENDING_WRITE_FAILED_TEXT))
    );
    assert!(b.active_run("s2").is_none());
}

// OB-09: a late result changes the entry only while it equals the sending snapshot.
#[test]
fn a_late_result_never_overwrites_a_newer_decision() {
    let mut b = Bench::codex(&["s1"]);
    b.c.submit(submit_req("s1", "1", Controls::automatic()), b.now)
        .unwrap();
    let Some(CustodyEffect::Send(req)) = b.c.poll_effect() else {
        panic!()
    };
    // The deadline passes; the read finds nothing; the entry is held for the user.
    b.c.handle_timeout(b.now.saturating_add(Millis(31_000)));
    let effects: Vec<CustodyEffect> = std::iter::from_fn(|| b.c.poll_effect()).collect();
    let read = history_read(&effects, "s1", "op-1").expect("the history read");
    b.c.handle_history_read(read, HistoryRead::Missing, b.now);
    let held = b.entry("s1", "1").unwrap();
    // The old attempt's result arrives now: ignored, the held entry stays as it is.
    b.c.handle_send_result(
        req.attempt,
        SendResult::ProvenUnadmitted {
            error: "late".into(),
        },
        b.now,
    );
    assert_eq!(b.entry("s1", "1").unwrap(), held);
}

// OB-10: a wake-up while a lane is busy sets a follow-up; the finishing pass runs it.
#[test]
fn a_wake_up_while_busy_is_not_lost() {
    let mut b = Bench::codex(&["s1"]);
    b.c.submit(submit_req("s1", "1", Controls::automatic()), b.now)
        .unwrap();
    let Some(CustodyEffect::Send(req)) = b.c.poll_effect() else {
        panic!()
    };
    assert_eq!(b.c.lane_busy(&s("s1")), (true, false));
    // A second message lands while the first is at the settlement boundary.
    b.c.submit(submit_req("s1", "2", Controls::automatic()), b.now)
        .unwrap();
    assert!(b.c.poll_effect().is_none(), "the lane is busy");
    b.c.handle_send_result(
        req.attempt,
        SendResult::ProvenUnadmitted { error: "x".into() },
        b.now,
    );
    let Some(CustodyEffect::Send(next)) = b.c.poll_effect() else {
        panic!("the follow-up pass sent the next entry")
    };
    assert_eq!(next.operation_id, op("op-2"));
}

// OB-10: the steer lane admits only the queued head, as an exact active-run steer, and
// never starts a turn; a steer whose run ended waits, then starts as a new run.
#[test]
fn the_steer_lane_admits_only_an_exact_head_steer() {
    let mut b = Bench::codex(&["s1"]);
    b.agent.default = WhenUnscripted::Accept;
    b.submit("s1", "run", Controls::automatic());
    let run = b.active_run("s1").unwrap();
    b.submit("s1", "steer", Controls::steer(run.clone()));
    assert_eq!(
        b.agent.sends.last().unwrap().kind,
        outbox_core::adapter::SendKind::Steer { run: run.clone() }
    );
    // A steer for a run that is not active waits at the head.
    let old = outbox_core::ids::RunId::new("run-old").unwrap();
    b.submit("s1", "late-steer", Controls::steer(old));
    assert_eq!(b.agent.send_count(&op("op-late-steer")), 0);
    // The running turn ends (steer and start confirmed); then it starts as a new run.
    b.c.handle_delivery_proof(&s("s1"), &op("op-run"), b.now);
    b.c.handle_delivery_proof(&s("s1"), &op("op-steer"), b.now);
    b.c.handle_run_ended(&s("s1"), &run, &[], b.now);
    b.drive();
    let last = b.agent.sends.last().unwrap();
    assert_eq!(last.operation_id, op("op-late-steer"));
    assert!(matches!(
        last.kind,
        outbox_core::adapter::SendKind::Start { .. }
    ));
}

// OB-10: at start-up both lanes start and every sending entry is read from history; an
// unreadable ledger holds them.
#[test]
fn start_up_confirms_sending_entries_from_history() {
    let mut b = Bench::codex(&["s1"]);
    b.agent.default = WhenUnscripted::Accept;
    b.submit("s1", "1", Controls::automatic());
    b.submit("s1", "2", Controls::enqueue());
    // The app quits: a new machine over the same store.
    let store = std::mem::replace(
        &mut b.c,
        custody(
            Default::default(),
            outbox_core::adapter::Capabilities::codex(),
            &[],
        ),
    )
    .into_store();
    let mut c: Custody<_> = custody(store, outbox_core::adapter::Capabilities::codex(), &["s1"]);
    c.start_up(b.now).unwrap();
    let effects: Vec<CustodyEffect> = std::iter::from_fn(|| c.poll_effect()).collect();
    let read = history_read(&effects, "s1", "op-1").expect("the history read");
    assert!(
        matches!(
            &effects[0],
            CustodyEffect::ReadHistory(ReadHistoryRequest { .. })
        ),
        "the read comes first"
    );
    // The accepted entry does not hold the queue: the entry behind it starts.
    let Some(CustodyEffect::Send(next)) = effects.get(1) else {
        panic!("{effects:?}")
    };
    assert_eq!(next.operation_id, op("op-2"));
    c.handle_history_read(read, HistoryRead::Found, b.now);
    assert!(c
        .entries(&s("s1"))
        .unwrap()
        .iter()
        .all(|e| e.entry().is_some_and(|e| e.operation_id != op("op-1"))));

    // An unreadable ledger at load time holds the sending entry with the same text.
    let mut b = Bench::codex(&["s1"]);
    b.agent.default = WhenUnscripted::Accept;
    b.submit("s1", "1", Controls::automatic());
    let store = b.c.into_store();
    store.with_plan(|p| {
        p.only = vec!["ledger"];
        p.reads_off = true;
    });
    let mut c = custody(store, outbox_core::adapter::Capabilities::codex(), &["s1"]);
    let loaded = c.load_outbox(&s("s1"), Millis(0)).unwrap();
    let e = loaded[0].entry().unwrap();
    assert_eq!(
        (e.state.status(), e.state.auto_drain(), e.state.error()),
        (EntryStatus::Queued, false, Some(UNCONFIRMED_TEXT))
    );
}

// OB-12: reopening a canceled operation that had an acceptance reads history first.
#[test]
fn reopening_a_canceled_accepted_operation_reads_history_first() {
    for (read, expect_ledger, expect_sends) in [
        (HistoryRead::Found, LedgerStatus::Sent, 1),
        (HistoryRead::Missing, LedgerStatus::Sending, 2),
        (HistoryRead::Unreadable, LedgerStatus::Canceled, 1),
    ] {
        let mut b = canceled_accepted_steer();
        assert_eq!(ledger(&mut b, "1"), Some(LedgerStatus::Canceled));
        // The user sends it again: the history read comes first.
        b.c.send_now(&s("s1"), &q("q-1"), b.now).unwrap();
        let effects: Vec<CustodyEffect> = std::iter::from_fn(|| b.c.poll_effect()).collect();
        let attempt = history_read(&effects, "s1", "op-1").expect("the history read");
        b.c.handle_history_read(attempt, read, b.now);
        b.drive();
        assert_eq!(b.agent.send_count(&op("op-1")), expect_sends, "{read:?}");
        assert_eq!(ledger(&mut b, "1"), Some(expect_ledger), "{read:?}");
        if read == HistoryRead::Unreadable {
            assert_eq!(
                b.entry("s1", "1").unwrap().state.error(),
                Some(UNCONFIRMED_TEXT)
            );
        }
    }
}

// OB-11: editing keeps queue ID and place and takes a new operation; removing a queued
// entry leaves the run alone; a sending entry cannot be removed.
#[test]
fn edit_and_remove_follow_the_composer_rules() {
    let mut b = Bench::codex(&["s1"]);
    b.agent.default = WhenUnscripted::Accept;
    b.submit("s1", "run", Controls::automatic());
    let run = b.active_run("s1").unwrap();
    b.submit("s1", "1", Controls::enqueue());
    b.submit("s1", "2", Controls::enqueue());
    let before = b.entry("s1", "1").unwrap();
    b.c.edit(&s("s1"), &q("q-1"), op("op-1b"), request("edited"), b.now)
        .unwrap();
    let order: Vec<String> = b
        .entries("s1")
        .iter()
        .map(|e| e.operation_id.to_string())
        .collect();
    assert_eq!(order, ["op-run", "op-1b", "op-2"]);
    let after = b.entries("s1")[1].clone();
    assert_eq!(
        (after.queue_id.clone(), after.position),
        (before.queue_id, before.position)
    );
    // The old operation can never be created again.
    assert!(b
        .c
        .submit(submit_req("s1", "1", Controls::enqueue()), b.now)
        .is_err());
    b.c.remove(&s("s1"), &q("q-2"), b.now).unwrap();
    assert_eq!(b.active_run("s1"), Some(run), "the run is untouched");
    assert_eq!(
        b.c.remove(&s("s1"), &q("q-run"), b.now),
        Err(outbox_core::custody::ActionError::Blocked)
    );
    assert!(b.entry("s1", "run").is_some());
}

// OB-13: stop and send now: detach, revoke, stop, dedicated with the same operation.
#[test]
fn stop_and_send_now_replays_only_after_a_confirmed_detach() {
    let mut b = Bench::codex(&["s1"]);
    b.agent.default = WhenUnscripted::Accept;
    b.submit("s1", "run", Controls::automatic());
    let run = b.active_run("s1").unwrap();
    b.submit("s1", "1", Controls::steer(run.clone()));
    assert_eq!(b.agent.send_count(&op("op-1")), 1);
    b.c.stop_and_send_now(&s("s1"), &q("q-1"), b.now).unwrap();
    assert_eq!(
        b.entry("s1", "1").unwrap().state.handoff().unwrap().phase,
        HandoffPhase::Requested
    );
    b.drive();
    // Detached, revoked, the run stopped; the message started its own turn.
    assert_eq!(b.agent.send_count(&op("op-1")), 2);
    let last = b.agent.sends.last().unwrap();
    assert!(matches!(&last.kind, outbox_core::adapter::SendKind::Start { run: r } if r != &run));
    assert_eq!(last.operation_id, op("op-1"), "the same operation ID");
    let e = b.entry("s1", "1").unwrap();
    assert_eq!(e.state.handoff().unwrap().phase, HandoffPhase::Dedicated);

    // A refused detach replays nothing.
    let mut b = Bench::claude(&["s1"]);
    b.agent.default = WhenUnscripted::Accept;
    b.submit("s1", "run", Controls::automatic());
    let run = b.active_run("s1").unwrap();
    b.submit("s1", "1", Controls::steer(run.clone()));
    b.agent
        .detaches
        .push_back(outbox_core::adapter::TakeBackResult::NotDetached {
            reason: "already started".into(),
        });
    b.c.stop_and_send_now(&s("s1"), &q("q-1"), b.now).unwrap();
    b.drive();
    assert_eq!(b.agent.send_count(&op("op-1")), 1);
    assert_eq!(b.active_run("s1"), Some(run));
    assert!(b
        .notes
        .iter()
        .any(|n| matches!(n, CustodyEffect::TakeBackRefused { .. })));

    // Already sent in the ledger: nothing is replayed.
    let mut b = Bench::codex(&["s1"]);
    b.agent.default = WhenUnscripted::Accept;
    b.submit("s1", "run", Controls::automatic());
    let run = b.active_run("s1").unwrap();
    b.submit("s1", "1", Controls::steer(run));
    b.c.stop_and_send_now(&s("s1"), &q("q-1"), b.now).unwrap();
    let Some(CustodyEffect::TakeBack(TakeBackRequest { attempt, .. })) = b.c.poll_effect() else {
        panic!()
    };
    // The echo arrives before the detach answer.
    b.c.handle_delivery_proof(&s("s1"), &op("op-1"), b.now);
    b.c.handle_take_back(
        attempt,
        outbox_core::adapter::TakeBackResult::DetachedForReplay,
        b.now,
    );
    b.drive();
    assert_eq!(b.agent.send_count(&op("op-1")), 1);
    assert!(b.entry("s1", "1").is_none());
}

// OB-11: replace latest (Codex): rollback first; a gone thread clears the link and the
// message goes to a fresh thread.
#[test]
fn replace_latest_rolls_back_and_recovers_from_a_gone_thread() {
    let mut b = Bench::codex(&["s1"]);
    b.agent.then(Step::result(SendResult::ThreadGone));
    let mut req = submit_req("s1", "1", Controls::replace_latest());
    req.request.rollback_before_send = true;
    b.c.submit(req, b.now).unwrap();
    b.drive();
    assert_eq!(b.agent.sends.len(), 2);
    assert!(b.agent.sends[0].rollback_before_send);
    assert!(b.agent.sends[1].fresh_thread && !b.agent.sends[1].rollback_before_send);
    assert!(b
        .notes
        .contains(&CustodyEffect::ClearThreadLink { session: s("s1") }));
    assert!(
        b.entry("s1", "1").is_none(),
        "delivered to the fresh thread"
    );
}

// OB-08, OB-12: a canceled steer that a turn had accepted is held without that
// acceptance (the ledger keeps it for the reopen check), and when it is sent again the
// new attempt carries no acceptance until its own turn answers, so the queue behind it
// waits for that answer.
#[test]
fn a_resent_steer_carries_no_acceptance_of_its_earlier_attempt() {
    let mut b = canceled_accepted_steer();
    let held = b.entry("s1", "1").unwrap();
    assert_eq!(
        (held.state.status(), held.state.acceptance()),
        (EntryStatus::Queued, None)
    );
    assert!(
        ledger_acceptance(&mut b, "1"),
        "the ledger keeps the acceptance"
    );
    // Sent again: the history read says missing, then the new attempt goes out.
    b.c.send_now(&s("s1"), &q("q-1"), b.now).unwrap();
    let effects: Vec<CustodyEffect> = std::iter::from_fn(|| b.c.poll_effect()).collect();
    let read = history_read(&effects, "s1", "op-1").expect("the reopen check reads first");
    b.c.handle_history_read(read, HistoryRead::Missing, b.now);
    let Some(CustodyEffect::Send(send)) = b.c.poll_effect() else {
        panic!("sent again")
    };
    assert_eq!(send.operation_id, op("op-1"));
    let sending = b.entry("s1", "1").unwrap();
    assert_eq!(
        (sending.state.status(), sending.state.acceptance()),
        (EntryStatus::Sending, None)
    );
    // A message queued behind it waits for this attempt's answer.
    b.c.submit(submit_req("s1", "2", Controls::automatic()), b.now)
        .unwrap();
    assert!(
        std::iter::from_fn(|| b.c.poll_effect()).all(|e| !matches!(e, CustodyEffect::Send(_))),
        "nothing else is sent while the attempt is unanswered"
    );
}

fn ledger_acceptance(b: &mut Bench, n: &str) -> bool {
    b.c.ledger_of(&ScopeId::of(&s("s1")), &op(&format!("op-{n}")))
        .unwrap()
        .is_some_and(|l| l.acceptance.is_some())
}

/// A steer (`op-1`) that a turn accepted, then the run stopped before taking it: the
/// ledger says canceled, with the acceptance.
fn canceled_accepted_steer() -> Bench {
    let mut b = Bench::codex(&["s1"]);
    b.agent.default = WhenUnscripted::Accept;
    b.submit("s1", "run", Controls::automatic());
    let run = b.active_run("s1").unwrap();
    b.submit("s1", "1", Controls::steer(run.clone()));
    b.agent
        .stops
        .push_back(outbox_core::adapter::StopResult::Stopped {
            untaken: vec![op("op-1")],
        });
    b.c.stop(&s("s1"), &run, Some(7), b.now);
    b.drive();
    b
}

/// The replace latest `op-1` submitted in `s1`, and its first send (with the rollback).
fn replace_latest_sent(b: &mut Bench) -> outbox_core::adapter::SendRequest {
    let mut req = submit_req("s1", "1", Controls::replace_latest());
    req.request.rollback_before_send = true;
    b.c.submit(req, b.now).unwrap();
    let sends: Vec<_> = b
        .effects()
        .into_iter()
        .filter_map(|e| match e {
            CustodyEffect::Send(r) => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(sends.len(), 1);
    assert!(sends[0].rollback_before_send);
    sends[0].clone()
}

fn next_send(b: &mut Bench) -> Option<outbox_core::adapter::SendRequest> {
    b.effects().into_iter().find_map(|e| match e {
        CustodyEffect::Send(r) => Some(r),
        _ => None,
    })
}

// OB-11: a message rolls back at most once. The agent said it rolled back (or asked
// to), then held the start back: the next attempt, and a custody started again over
// the same store, send it without a rollback, so no second turn is lost. The seed's
// refusals after the rollback took (a deferral, a refusal, a lost answer) are what
// made custody ask again on every attempt.
#[test]
fn a_replace_latest_rolls_back_once_whatever_follows() {
    for result in [
        SendResult::Deferred {
            reason: "busy".into(),
        },
        SendResult::ProvenUnadmitted {
            error: "refused".into(),
        },
    ] {
        let mut b = Bench::codex(&["s1"]);
        let first = replace_latest_sent(&mut b);
        b.c.handle_rolled_back(&s("s1"), &op("op-1"), b.now);
        let stored = b.entry("s1", "1").unwrap();
        assert!(
            !stored.request.rollback_before_send,
            "the store holds the entry without its rollback"
        );
        b.c.handle_send_result(first.attempt, result.clone(), b.now);
        if matches!(result, SendResult::ProvenUnadmitted { .. }) {
            // Held for the user; their send goes without a rollback too.
            assert_eq!(
                b.entry("s1", "1").unwrap().state.status(),
                EntryStatus::Queued
            );
            b.c.send_now(&s("s1"), &q("q-1"), b.now).unwrap();
        }
        let again = next_send(&mut b).expect("sent again");
        assert_eq!(again.operation_id, op("op-1"));
        assert!(
            !again.rollback_before_send,
            "{result:?}: no second rollback"
        );
        // A restart reads the entry without its rollback.
        let store = std::mem::replace(
            &mut b.c,
            custody(TestStore::default(), Capabilities::codex(), &[]),
        )
        .into_store();
        let mut c = custody(store, Capabilities::codex(), &["s1"]);
        let stored = c.entries(&s("s1")).unwrap();
        let entry = stored
            .iter()
            .filter_map(|e| e.entry())
            .find(|e| e.operation_id == op("op-1"))
            .unwrap();
        assert!(!entry.request.rollback_before_send);
    }
}

// OB-11: the rollback is remembered while the store refuses to take it, so an attempt
// made meanwhile does not roll back again.
#[test]
fn a_rollback_the_store_refused_to_record_is_not_asked_again() {
    let mut b = Bench::codex(&["s1"]);
    let first = replace_latest_sent(&mut b);
    b.c.store().with_plan(|p| p.writes_off = true);
    b.c.handle_rolled_back(&s("s1"), &op("op-1"), b.now);
    assert!(b.c.store_failure(&s("s1")).is_some(), "the failure is said");
    b.c.store().with_plan(|p| p.writes_off = false);
    // The deferral is written before the rollback's retry is due: the entry goes back
    // to the queue still saying rollback, and is sent again at once.
    b.c.handle_send_result(
        first.attempt,
        SendResult::Deferred {
            reason: "busy".into(),
        },
        b.now,
    );
    let again = next_send(&mut b).expect("sent again");
    assert_eq!(again.operation_id, op("op-1"));
    assert!(!again.rollback_before_send);
}

// OB-11: when the thread is gone, every waiting replace latest of the session lost the
// turn it meant to roll back (the fresh thread has none): none of them rolls back later.
#[test]
fn a_gone_thread_makes_every_waiting_rollback_moot() {
    let mut b = Bench::codex(&["s1"]);
    let first = replace_latest_sent(&mut b);
    let mut second = submit_req("s1", "2", Controls::replace_latest());
    second.request.rollback_before_send = true;
    b.c.submit(second, b.now).unwrap();
    b.c.handle_send_result(first.attempt, SendResult::ThreadGone, b.now);
    let fresh = next_send(&mut b).expect("sent to a fresh thread");
    assert!(fresh.fresh_thread && !fresh.rollback_before_send);
    let waiting = b.entry("s1", "2").unwrap();
    assert!(!waiting.request.rollback_before_send);
    assert_eq!(
        waiting.controls,
        Controls::replace_latest(),
        "still an interrupt"
    );
}
