//! Submit, fingerprints, controls and scope (OB-02 to OB-07).
#![allow(clippy::unwrap_used, clippy::type_complexity)]

mod common;

use common::*;
use outbox_core::adapter::Capabilities;
use outbox_core::custody::{ActionError, ConflictKind, SubmitError, ValidationError};
use outbox_core::entry::{
    Attachment, Controls, EntryState, EntryStatus, Intent, MessageRequest, SendMode, StoredEntry,
};
use outbox_core::fingerprint::{admission_input_digest, request_fingerprint};
use outbox_core::ids::RunId;
use outbox_core::ids::ScopeId;
use outbox_core::ledger::{
    reopen, transition, LedgerRecord, LedgerStatus, MemoryFallback, Transition, FALLBACK_CAPACITY,
};
use outbox_core::store::memory::MemoryOutboxStore;
use outbox_core::store::OutboxStore;
use proptest::prelude::*;
use timeline_core::time::Millis;

// OB-02: fields whose naive concatenations collide still fingerprint apart.
#[test]
fn requests_whose_naive_concatenations_collide_get_different_fingerprints() {
    let mut a = request("ab");
    a.prompt_text = Some("c".into());
    let mut b = request("a");
    b.prompt_text = Some("bc".into());
    assert_eq!(
        format!("{}{}", a.user_text, a.prompt_text.clone().unwrap()),
        format!("{}{}", b.user_text, b.prompt_text.clone().unwrap())
    );
    assert_ne!(
        request_fingerprint(&s("s"), &q("q"), &a),
        request_fingerprint(&s("s"), &q("q"), &b)
    );
    // Session and queue: "s1"+"2q" vs "s12"+"q".
    assert_ne!(
        request_fingerprint(&s("s1"), &q("2q"), &a),
        request_fingerprint(&s("s12"), &q("q"), &a)
    );
    // Absent vs empty prompt.
    let mut c = request("x");
    c.prompt_text = Some(String::new());
    assert_ne!(
        request_fingerprint(&s("s"), &q("q"), &c),
        request_fingerprint(&s("s"), &q("q"), &request("x"))
    );
    // Attachments: one ["a b"] vs two ["a", "b"] paths.
    let mut one = request("x");
    one.attachments = vec![Attachment {
        path: "ab".into(),
        kind: "image".into(),
    }];
    let mut two = request("x");
    two.attachments = vec![
        Attachment {
            path: "a".into(),
            kind: "".into(),
        },
        Attachment {
            path: "b".into(),
            kind: "image".into(),
        },
    ];
    assert_ne!(
        request_fingerprint(&s("s"), &q("q"), &one),
        request_fingerprint(&s("s"), &q("q"), &two)
    );
}

// OB-02: every listed field counts.
#[test]
fn every_fingerprinted_field_changes_the_fingerprint() {
    let base = request("hello");
    let fp = |r: &MessageRequest| request_fingerprint(&s("s"), &q("q"), r);
    let variants: Vec<Box<dyn Fn(&mut MessageRequest)>> = vec![
        Box::new(|r| r.user_text.push('!')),
        Box::new(|r| r.prompt_text = Some("p".into())),
        Box::new(|r| {
            r.attachments.push(Attachment {
                path: "/i.png".into(),
                kind: "image".into(),
            })
        }),
        Box::new(|r| r.thread_id = Some(outbox_core::ids::ThreadId::new("t").unwrap())),
        Box::new(|r| r.speed_mode = Some("fast".into())),
        Box::new(|r| r.access_mode = Some(outbox_core::entry::AccessLevel::ReadOnly)),
        Box::new(|r| r.expected_model = Some("m".into())),
        Box::new(|r| r.expected_effort = Some("high".into())),
        Box::new(|r| r.rollback_before_send = true),
        Box::new(|r| r.source = "phone".into()),
        Box::new(|r| r.created_at = Millis(2)),
    ];
    for change in variants {
        let mut r = base.clone();
        change(&mut r);
        assert_ne!(fp(&r), fp(&base), "{r:?}");
    }
}

// OB-07
#[test]
fn the_admission_digest_normalizes_line_ends_and_keeps_image_order() {
    assert_eq!(
        admission_input_digest("a\r\nb\rc", &[]),
        admission_input_digest("a\nb\nc", &[])
    );
    assert_ne!(
        admission_input_digest("x", &["1.png", "2.png"]),
        admission_input_digest("x", &["2.png", "1.png"])
    );
    assert_eq!(admission_input_digest("x", &["1.png"]).as_str().len(), 64);
}

// OB-03
#[test]
fn the_same_operation_and_fingerprint_returns_the_original_receipt() {
    let mut b = Bench::codex(&["s1"]);
    b.agent.default = fixtures::adapters::WhenUnscripted::Accept;
    let first = b.submit("s1", "1", Controls::automatic());
    assert!(!first.replayed);
    let again =
        b.c.submit(submit_req("s1", "1", Controls::automatic()), b.now)
            .unwrap();
    assert!(again.replayed);
    assert_eq!(
        (again.queue_id, again.operation_id),
        (first.queue_id, first.operation_id)
    );
    assert_eq!(b.entries("s1").len(), 1);
    assert_eq!(
        b.agent.send_count(&op("op-1")),
        1,
        "a replay never sends again"
    );
}

// OB-03
#[test]
fn a_different_fingerprint_under_one_operation_is_a_conflict_and_never_overwrites() {
    let mut b = Bench::codex(&["s1"]);
    b.agent.default = fixtures::adapters::WhenUnscripted::Accept;
    b.submit("s1", "1", Controls::automatic());
    let mut other = submit_req("s1", "1", Controls::automatic());
    other.request.user_text = "something else".into();
    let err = b.c.submit(other, b.now).unwrap_err();
    assert_eq!(err, SubmitError::Conflict(ConflictKind::DifferentRequest));
    assert!(err.to_string().contains("new operationId"));
    assert_eq!(b.entry("s1", "1").unwrap().request.user_text, "message 1");
}

// OB-03: a removed operation can never be created again; a delivered one replays.
#[test]
fn a_removed_operation_is_never_created_again() {
    let mut b = Bench::codex(&["s1"]);
    // Keep it queued behind a run so it can be removed.
    b.agent.default = fixtures::adapters::WhenUnscripted::Accept;
    b.submit("s1", "0", Controls::automatic());
    b.submit("s1", "1", Controls::enqueue());
    b.c.remove(&s("s1"), &q("q-1"), b.now).unwrap();
    let err =
        b.c.submit(submit_req("s1", "1", Controls::enqueue()), b.now)
            .unwrap_err();
    assert_eq!(err, SubmitError::Conflict(ConflictKind::Removed));
    assert!(b.entry("s1", "1").is_none());
    // A delivered operation resubmitted with the same request replays its receipt.
    b.c.handle_delivery_proof(&s("s1"), &op("op-0"), b.now);
    let r =
        b.c.submit(submit_req("s1", "0", Controls::automatic()), b.now)
            .unwrap();
    assert!(r.replayed);
    assert_eq!(b.agent.send_count(&op("op-0")), 1);
}

// OB-04: every control combination, allowed and refused.
#[test]
fn control_combinations_are_validated() {
    let run = || Some(RunId::new("run-1").unwrap());
    let cases: Vec<(
        Intent,
        SendMode,
        Option<RunId>,
        bool,
        Result<(), ValidationError>,
    )> = vec![
        (Intent::Automatic, SendMode::Queue, None, false, Ok(())),
        (
            Intent::Automatic,
            SendMode::SteerRunning,
            run(),
            false,
            Ok(()),
        ),
        (
            Intent::Automatic,
            SendMode::InterruptRunning,
            None,
            false,
            Ok(()),
        ),
        (Intent::Enqueue, SendMode::Queue, None, false, Ok(())),
        (
            Intent::Enqueue,
            SendMode::SteerRunning,
            run(),
            false,
            Err(ValidationError::EnqueueNeedsQueue),
        ),
        (
            Intent::Enqueue,
            SendMode::InterruptRunning,
            None,
            false,
            Err(ValidationError::EnqueueNeedsQueue),
        ),
        (
            Intent::ReplaceLatest,
            SendMode::InterruptRunning,
            None,
            true,
            Ok(()),
        ),
        (
            Intent::ReplaceLatest,
            SendMode::Queue,
            None,
            true,
            Err(ValidationError::ReplaceLatestNeedsInterrupt),
        ),
        (
            Intent::ReplaceLatest,
            SendMode::SteerRunning,
            run(),
            true,
            Err(ValidationError::ReplaceLatestNeedsInterrupt),
        ),
        (
            Intent::Automatic,
            SendMode::SteerRunning,
            None,
            false,
            Err(ValidationError::SteerNeedsRun),
        ),
        (
            Intent::Automatic,
            SendMode::Queue,
            run(),
            false,
            Err(ValidationError::RunIdOnlyForSteer),
        ),
        (
            Intent::Automatic,
            SendMode::InterruptRunning,
            run(),
            false,
            Err(ValidationError::RunIdOnlyForSteer),
        ),
        (
            Intent::Automatic,
            SendMode::Queue,
            None,
            true,
            Err(ValidationError::RollbackNeedsReplaceLatest),
        ),
        (
            Intent::ReplaceLatest,
            SendMode::InterruptRunning,
            None,
            false,
            Err(ValidationError::RollbackNeedsReplaceLatest),
        ),
    ];
    for (i, (intent, mode, run_id, rollback, expected)) in cases.into_iter().enumerate() {
        let mut c = custody(MemoryOutboxStore::new(), Capabilities::codex(), &["s1"]);
        let mut req = submit_req(
            "s1",
            &i.to_string(),
            Controls {
                intent,
                send_mode: mode,
                expected_active_run_id: run_id,
            },
        );
        req.request.rollback_before_send = rollback;
        let got = c.submit(req, Millis(0)).map(|_| ()).map_err(|e| match e {
            SubmitError::Invalid(v) => v,
            other => panic!("{other:?}"),
        });
        assert_eq!(got, expected, "case {i}: {intent:?} {mode:?}");
        if expected.is_err() {
            assert!(
                c.entries(&s("s1")).unwrap().is_empty(),
                "no receipt, nothing saved"
            );
        }
    }
}

// OB-04: controls a Claude session does not support fail with no receipt.
#[test]
fn replace_latest_and_speed_mode_are_refused_for_claude() {
    let mut c = custody(MemoryOutboxStore::new(), Capabilities::claude(), &["s1"]);
    let mut req = submit_req("s1", "1", Controls::replace_latest());
    req.request.rollback_before_send = true;
    assert_eq!(
        c.submit(req, Millis(0)),
        Err(SubmitError::Invalid(ValidationError::Unsupported(
            "replace-latest"
        )))
    );
    let mut req = submit_req("s1", "2", Controls::automatic());
    req.request.speed_mode = Some("fast".into());
    assert_eq!(
        c.submit(req, Millis(0)),
        Err(SubmitError::Invalid(ValidationError::Unsupported(
            "speedMode"
        )))
    );
    assert!(c.entries(&s("s1")).unwrap().is_empty());
}

// OB-04, AG-03: an ACP agent has no steer and no replace latest: a message into the
// running turn is refused with no receipt, as replace latest is; a queued or automatic
// one is taken.
#[test]
fn steer_and_replace_latest_are_refused_for_an_acp_agent() {
    let mut c = custody(MemoryOutboxStore::new(), Capabilities::acp(), &["s1"]);
    let run = RunId::new("run-1").unwrap();
    assert_eq!(
        c.submit(submit_req("s1", "1", Controls::steer(run)), Millis(0)),
        Err(SubmitError::Invalid(ValidationError::Unsupported(
            "steer-running"
        )))
    );
    let mut req = submit_req("s1", "2", Controls::replace_latest());
    req.request.rollback_before_send = true;
    assert_eq!(
        c.submit(req, Millis(0)),
        Err(SubmitError::Invalid(ValidationError::Unsupported(
            "replace-latest"
        )))
    );
    assert!(c.entries(&s("s1")).unwrap().is_empty());
    assert!(c
        .submit(submit_req("s1", "3", Controls::automatic()), Millis(0))
        .is_ok());
    assert_eq!(c.entries(&s("s1")).unwrap().len(), 1);
}

// OB-04: enqueue goes to the back, automatic to the front behind sending entries; the
// outbox has no entry limit.
#[test]
fn queue_positions_follow_the_intent() {
    let mut b = Bench::codex(&["s1"]);
    b.agent.default = fixtures::adapters::WhenUnscripted::Accept;
    b.submit("s1", "run", Controls::automatic()); // starts a run, stays sending (accepted)
    for i in 0..300 {
        b.submit("s1", &format!("e{i}"), Controls::enqueue());
    }
    b.submit("s1", "front", Controls::automatic());
    let order: Vec<String> = b
        .entries("s1")
        .iter()
        .map(|e| e.operation_id.to_string())
        .collect();
    assert_eq!(order.len(), 302, "no entry limit");
    assert_eq!(order[0], "op-run", "the sending entry stays first");
    assert_eq!(
        order[1], "op-front",
        "automatic goes to the front, behind sending entries"
    );
    assert_eq!(order[2], "op-e0");
    assert_eq!(order[301], "op-e299");
    assert_eq!(b.entries("s1")[0].state.status(), EntryStatus::Sending);
}

// OB-04: queueing then sending now converges on one operation.
#[test]
fn queue_then_send_now_converges_and_retargeting_a_steer_conflicts() {
    let mut b = Bench::codex(&["s1"]);
    b.agent.default = fixtures::adapters::WhenUnscripted::Accept;
    b.submit("s1", "run", Controls::automatic());
    let run = b.active_run("s1").unwrap();
    b.submit("s1", "1", Controls::enqueue());
    b.submit("s1", "2", Controls::enqueue());
    let r =
        b.c.submit(submit_req("s1", "2", Controls::automatic()), b.now)
            .unwrap();
    assert!(r.replayed);
    let order: Vec<String> = b
        .entries("s1")
        .iter()
        .map(|e| e.operation_id.to_string())
        .collect();
    assert_eq!(order, ["op-run", "op-2", "op-1"]);
    // A steer for one run, then the same operation for another run: conflict.
    let other = RunId::new("run-other").unwrap();
    b.c.submit(submit_req("s1", "3", Controls::steer(other.clone())), b.now)
        .unwrap();
    let err =
        b.c.submit(submit_req("s1", "3", Controls::steer(run)), b.now)
            .unwrap_err();
    assert_eq!(err, SubmitError::Conflict(ConflictKind::SteerRetargeted));
}

// OB-05: an undecodable saved entry is shown as blocked, never dropped or drained.
#[test]
fn an_undecodable_entry_is_blocked_not_dropped() {
    let mut store = MemoryOutboxStore::new();
    store.insert_raw_entry(
        &s("s1"),
        "q-bad",
        "op-bad",
        -5,
        "{\"queueId\":\"q-bad\",\"status\":\"flying\"}",
    );
    let mut b = Bench {
        c: custody(TestStore::new(store), Capabilities::codex(), &["s1"]),
        ..Bench::codex(&[])
    };
    b.submit("s1", "1", Controls::automatic());
    let all = b.c.entries(&s("s1")).unwrap();
    assert_eq!(
        all.len(),
        1,
        "the good entry was delivered; the blocked one stays"
    );
    match &all[0] {
        StoredEntry::Blocked(blocked) => {
            assert_eq!(blocked.queue_id, "q-bad");
            assert_eq!(blocked.operation_id.as_deref(), Some("op-bad"));
            assert!(!blocked.reason.is_empty());
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(b.agent.sends.len(), 1);
}

// OB-06: a sent proof under one alias removes the operation from every alias.
#[test]
fn a_sent_proof_under_one_alias_removes_the_operation_everywhere() {
    let mut store = MemoryOutboxStore::new();
    // The same operation saved under the base session and its alias.
    for session in ["s1", "s1::skills-agent"] {
        let e = outbox_core::entry::OutboxEntry {
            state: EntryState::queued().hold(None),
            ..outbox_core::entry::OutboxEntry::queued(
                q("q-1"),
                op("op-1"),
                request("hi"),
                Controls::enqueue(),
                0,
            )
        };
        let fp = request_fingerprint(&s(session), &q("q-1"), &e.request);
        store.claim(&s(session), &fp, &e).unwrap();
    }
    let mut b = Bench {
        c: custody(
            TestStore::new(store),
            Capabilities::codex(),
            &["s1", "s1::skills-agent"],
        ),
        ..Bench::codex(&[])
    };
    b.c.handle_delivery_proof(&s("s1::skills-agent"), &op("op-1"), b.now);
    assert!(b.entries("s1").is_empty());
    assert!(b.entries("s1::skills-agent").is_empty());
    let ledger =
        b.c.store()
            .ledger(&ScopeId::of(&s("s1")), &op("op-1"))
            .unwrap()
            .unwrap();
    assert_eq!(ledger.status, LedgerStatus::Sent);
}

// OB-16: a client cannot create a session message.
#[test]
fn a_client_cannot_submit_a_session_message_operation() {
    let mut c = custody(MemoryOutboxStore::new(), Capabilities::codex(), &["s1"]);
    let mut req = submit_req("s1", "x", Controls::enqueue());
    req.operation_id = op("session-message-123");
    assert_eq!(
        c.submit(req, Millis(0)),
        Err(SubmitError::Invalid(ValidationError::ClientSessionMessage))
    );
}

fn status() -> impl Strategy<Value = LedgerStatus> {
    prop::sample::select(vec![
        LedgerStatus::Failed,
        LedgerStatus::Sending,
        LedgerStatus::Canceled,
        LedgerStatus::Sent,
    ])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fixtures::proptest_cases()))]

    // OB-07: the transition is total and monotone: the stored status never gets weaker.
    #[test]
    fn the_ledger_only_moves_toward_stronger_proof(steps in prop::collection::vec(status(), 1..20)) {
        let mut current: Option<LedgerRecord> = None;
        for (i, st) in steps.into_iter().enumerate() {
            let before = current.as_ref().map(|c| c.status);
            match transition(current.as_ref(), LedgerRecord::new(st, Millis(i as u64))) {
                Transition::Apply(r) => {
                    if let Some(b) = before {
                        prop_assert!(r.status.strength() >= b.strength());
                        prop_assert!(b != LedgerStatus::Sent, "sent is final");
                        prop_assert!(!(b == LedgerStatus::Canceled && st == LedgerStatus::Sending));
                        prop_assert!(!(b == LedgerStatus::Sending && st == LedgerStatus::Failed));
                    }
                    current = Some(r);
                }
                Transition::Keep => {
                    let b = before.unwrap();
                    prop_assert!(st.strength() < b.strength() || b == LedgerStatus::Sent || (b == LedgerStatus::Canceled && st == LedgerStatus::Canceled));
                }
            }
        }
    }
}

// OB-07: the table, pair by pair.
#[test]
fn ledger_replacement_table() {
    use LedgerStatus::*;
    let table = [
        (Sending, Failed, false),
        (Sending, Sent, true),
        (Sending, Canceled, true),
        (Sending, Sending, true),
        (Sent, Failed, false),
        (Sent, Sending, false),
        (Sent, Canceled, false),
        (Sent, Sent, false),
        (Canceled, Sending, false),
        (Canceled, Sent, true),
        (Canceled, Failed, false),
        (Canceled, Canceled, false),
        (Failed, Sending, true),
        (Failed, Sent, true),
        (Failed, Canceled, true),
        (Failed, Failed, true),
    ];
    for (from, to, applies) in table {
        let got = transition(
            Some(&LedgerRecord::new(from, Millis(0))),
            LedgerRecord::new(to, Millis(1)),
        );
        assert_eq!(
            matches!(got, Transition::Apply(_)),
            applies,
            "{from:?} -> {to:?}"
        );
    }
    // Only the reopen check restarts a canceled record.
    assert_eq!(
        reopen(&LedgerRecord::new(Canceled, Millis(0)), Millis(1))
            .unwrap()
            .status,
        Failed
    );
    assert!(reopen(&LedgerRecord::new(Sent, Millis(0)), Millis(1)).is_none());
}

// OB-07: the fallback holds 256 records, drops its oldest non-sent one, refuses when all
// 256 are sent proofs.
#[test]
fn the_memory_fallback_holds_256_records() {
    let mut f = MemoryFallback::new();
    for i in 0..FALLBACK_CAPACITY {
        let status = if i == 3 {
            LedgerStatus::Sending
        } else {
            LedgerStatus::Sent
        };
        f.record(
            &ScopeId::of(&s("s")),
            &op(&format!("op-{i}")),
            LedgerRecord::new(status, Millis(0)),
        )
        .unwrap();
    }
    assert_eq!(f.len(), 256);
    f.record(
        &ScopeId::of(&s("s")),
        &op("op-256"),
        LedgerRecord::new(LedgerStatus::Sent, Millis(0)),
    )
    .unwrap();
    assert_eq!(f.len(), 256);
    assert!(
        f.get(&ScopeId::of(&s("s")), &op("op-3")).is_none(),
        "the oldest non-sent record went"
    );
    assert!(f.get(&ScopeId::of(&s("s")), &op("op-0")).is_some());
    let full = f.record(
        &ScopeId::of(&s("s")),
        &op("op-257"),
        LedgerRecord::new(LedgerStatus::Sending, Millis(0)),
    );
    assert!(full.is_err(), "all 256 are sent proofs");
    // Updating a held record still works when full.
    f.record(
        &ScopeId::of(&s("s")),
        &op("op-256"),
        LedgerRecord::new(LedgerStatus::Sent, Millis(1)),
    )
    .unwrap();
}

// OB-11: reorder moves a queued entry before another or to the back, keeping its
// operation; a sending entry is neither moved nor passed; when no position is free
// between two neighbours the queue is renumbered and the order is still the one asked.
#[test]
fn reorder_moves_queued_entries_and_renumbers_when_the_gap_closes() {
    let mut b = Bench::codex(&["s1"]);
    b.agent.default = fixtures::adapters::WhenUnscripted::Accept;
    b.submit("s1", "run", Controls::automatic());
    for n in ["1", "2", "3"] {
        b.submit("s1", n, Controls::enqueue());
    }
    let order = |b: &mut Bench| -> Vec<String> {
        b.entries("s1")
            .iter()
            .map(|e| e.operation_id.to_string())
            .collect()
    };
    let now = b.now;
    b.c.reorder(&s("s1"), &q("q-3"), Some(&q("q-1")), now)
        .unwrap();
    assert_eq!(order(&mut b), ["op-run", "op-3", "op-1", "op-2"]);
    b.c.reorder(&s("s1"), &q("q-3"), None, now).unwrap();
    assert_eq!(order(&mut b), ["op-run", "op-1", "op-2", "op-3"]);
    b.c.reorder(&s("s1"), &q("q-2"), Some(&q("q-2")), now)
        .unwrap();
    assert_eq!(order(&mut b), ["op-run", "op-1", "op-2", "op-3"]);

    assert_eq!(b.entries("s1")[0].state.status(), EntryStatus::Sending);
    let sending = b.c.reorder(&s("s1"), &q("q-run"), None, now);
    assert_eq!(sending, Err(ActionError::Blocked));
    let passing = b.c.reorder(&s("s1"), &q("q-1"), Some(&q("q-run")), now);
    assert_eq!(passing, Err(ActionError::Blocked));
    let missing = b.c.reorder(&s("s1"), &q("q-9"), None, now);
    assert_eq!(missing, Err(ActionError::NotFound));
    let missing = b.c.reorder(&s("s1"), &q("q-1"), Some(&q("q-9")), now);
    assert_eq!(missing, Err(ActionError::NotFound));

    // Always the back entry before the second queued one: the gap after the first
    // queued entry halves each time, until the queue is renumbered (the position step
    // is 2^20, so well within 40 moves).
    let mut model = order(&mut b);
    for _ in 0..40 {
        let last = model.pop().unwrap();
        model.insert(2, last.clone());
        let last_q = last.replace("op-", "q-");
        let second_q = model[3].replace("op-", "q-");
        b.c.reorder(&s("s1"), &q(&last_q), Some(&q(&second_q)), now)
            .unwrap();
        assert_eq!(order(&mut b), model);
    }
    // What the store holds is that order too, not only memory.
    let stored: Vec<String> =
        b.c.store()
            .entries(&s("s1"))
            .unwrap()
            .into_iter()
            .filter_map(|e| match e {
                StoredEntry::Entry(e) => Some(e.operation_id.to_string()),
                _ => None,
            })
            .collect();
    assert_eq!(stored, model);
    assert_eq!(b.agent.sends.len(), 1, "reordering sent nothing");
}
