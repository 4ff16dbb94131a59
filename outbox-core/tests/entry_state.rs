//! The entry state against the persisted format it replaced (OB-05): every state
//! encodes exactly as the loose fields did, a saved combination decodes to the same
//! state and encodes back to the same bytes, one that no state has is a typed error and
//! a blocked entry, and every transition changes the fields exactly as custody's field
//! edits did.
#![allow(clippy::unwrap_used)]

use fixtures::strategies::{acceptance, entry_state, handoff};
use outbox_core::entry::{
    Acceptance, Controls, EntryNotice, EntryState, EntryStatus, Handoff, HandoffPhase,
    InvalidEntryState, MessageRequest, OutboxEntry, SessionMessageOrigin, StateFields, StoredEntry,
    CANCELED_TEXT, REOPEN_CHECK_TEXT,
};
use outbox_core::ids::{OperationId, QueueId, SessionId};
use outbox_core::store::memory::MemoryOutboxStore;
use outbox_core::store::OutboxStore;
use proptest::prelude::*;
use serde::{Deserialize, Serialize};
use timeline_core::time::Millis;

/// The entry as it was declared before the state existed: the reference layout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LegacyEntry {
    queue_id: QueueId,
    operation_id: OperationId,
    request: MessageRequest,
    controls: Controls,
    status: LegacyStatus,
    auto_drain: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hold_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    acceptance: Option<Acceptance>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    handoff: Option<Handoff>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    session_message: Option<SessionMessageOrigin>,
    position: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
enum LegacyStatus {
    Queued,
    Sending,
}

/// The six loose fields of a state.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Flags {
    status: LegacyStatus,
    auto_drain: bool,
    error: Option<String>,
    hold_reason: Option<String>,
    acceptance: Option<Acceptance>,
    handoff: Option<Handoff>,
}

/// What the code before the state wrote for each state: the table of the module docs,
/// written out here on its own so a mistake in `EntryState::wire` cannot hide.
fn flags_of(state: &EntryState) -> Flags {
    let queued = |auto_drain, n: &EntryNotice, h: &Option<Handoff>| Flags {
        status: LegacyStatus::Queued,
        auto_drain,
        error: n.error.clone(),
        hold_reason: n.hold_reason.clone(),
        acceptance: None,
        handoff: h.clone(),
    };
    match state {
        EntryState::Ready { notice, handoff } => queued(true, notice, handoff),
        EntryState::Held { notice, handoff } => queued(false, notice, handoff),
        EntryState::Sending { notice, handoff } => Flags {
            status: LegacyStatus::Sending,
            ..queued(true, notice, handoff)
        },
        EntryState::Accepted {
            acceptance,
            handoff,
        } => Flags {
            status: LegacyStatus::Sending,
            auto_drain: true,
            error: None,
            hold_reason: None,
            acceptance: Some(acceptance.clone()),
            handoff: handoff.clone(),
        },
        EntryState::HandingOff { acceptance } => Flags {
            status: LegacyStatus::Sending,
            auto_drain: false,
            error: None,
            hold_reason: None,
            acceptance: Some(acceptance.clone()),
            handoff: Some(Handoff {
                phase: HandoffPhase::Requested,
                acceptance: acceptance.clone(),
            }),
        },
    }
}

/// True for the loose fields the code before the state could write, by the rules of
/// the module docs.
fn representable(f: &Flags) -> bool {
    let no_notice = f.error.is_none() && f.hold_reason.is_none();
    match (f.status, f.auto_drain, &f.acceptance) {
        (LegacyStatus::Queued, _, None) | (LegacyStatus::Sending, true, None) => true,
        (LegacyStatus::Queued, _, Some(_)) | (LegacyStatus::Sending, false, None) => false,
        (LegacyStatus::Sending, true, Some(_)) => no_notice,
        (LegacyStatus::Sending, false, Some(a)) => {
            no_notice
                && f.handoff
                    .as_ref()
                    .is_some_and(|h| h.phase == HandoffPhase::Requested && &h.acceptance == a)
        }
    }
}

fn base_entry() -> OutboxEntry {
    let mut request = MessageRequest::text("npm test \u{e9}", "composer", Millis(3));
    request.prompt_text = Some("prompt".into());
    OutboxEntry::queued(
        QueueId::new("q-1").unwrap(),
        OperationId::new("op-1").unwrap(),
        request,
        Controls::automatic(),
        -7,
    )
}

fn legacy(entry: &OutboxEntry, f: Flags) -> LegacyEntry {
    LegacyEntry {
        queue_id: entry.queue_id.clone(),
        operation_id: entry.operation_id.clone(),
        request: entry.request.clone(),
        controls: entry.controls.clone(),
        status: f.status,
        auto_drain: f.auto_drain,
        error: f.error,
        hold_reason: f.hold_reason,
        acceptance: f.acceptance,
        handoff: f.handoff,
        session_message: entry.session_message.clone(),
        position: entry.position,
    }
}

fn state_fields(f: &Flags) -> StateFields {
    StateFields {
        status: match f.status {
            LegacyStatus::Queued => EntryStatus::Queued,
            LegacyStatus::Sending => EntryStatus::Sending,
        },
        auto_drain: f.auto_drain,
        error: f.error.clone(),
        hold_reason: f.hold_reason.clone(),
        acceptance: f.acceptance.clone(),
        handoff: f.handoff.clone(),
    }
}

/// Any combination of the loose fields, most of which no state has.
fn any_flags() -> impl Strategy<Value = Flags> {
    let text = || prop::option::of(prop::sample::select(vec!["", "held"]).prop_map(String::from));
    (
        any::<bool>(),
        any::<bool>(),
        text(),
        text(),
        prop::option::of(acceptance()),
        prop::option::of(handoff()),
    )
        .prop_map(
            |(sending, auto_drain, error, hold_reason, acceptance, handoff)| Flags {
                status: if sending {
                    LegacyStatus::Sending
                } else {
                    LegacyStatus::Queued
                },
                auto_drain,
                error,
                hold_reason,
                acceptance,
                handoff,
            },
        )
}

/// The field edit custody made before the state existed, applied to the loose fields.
fn edit(f: &Flags, change: impl FnOnce(&mut Flags)) -> Flags {
    let mut f = f.clone();
    change(&mut f);
    f
}

fn is_queued(s: &EntryState) -> bool {
    matches!(s, EntryState::Ready { .. } | EntryState::Held { .. })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fixtures::proptest_cases()))]

    // OB-05: every state encodes to the bytes the loose fields encoded to, decodes back
    // to itself, and encodes again to the same bytes; `wire` names the same fields.
    #[test]
    fn every_state_encodes_as_the_loose_fields_did(state in entry_state(), origin in any::<bool>()) {
        let mut entry = base_entry().with_state(state.clone());
        if origin {
            entry.session_message = Some(SessionMessageOrigin {
                sender_session_id: SessionId::new("s9").unwrap(),
                sender_call_id: outbox_core::ids::CallId::new("call-9").unwrap(),
                sender_run_id: None,
                sender_thread_id: None,
                sender_access: outbox_core::entry::AccessLevel::ReadOnly,
                sender_project: None,
                chain_id: "chain-1".into(),
                hop: 1,
                approved: false,
            });
        }
        let reference = serde_json::to_string(&legacy(&entry, flags_of(&state))).unwrap();
        let written = serde_json::to_string(&entry).unwrap();
        prop_assert_eq!(&written, &reference);
        // A client sees the same fields under the stored entry's tag.
        let shown = serde_json::to_string(&StoredEntry::Entry(Box::new(entry.clone()))).unwrap();
        prop_assert_eq!(shown, format!("{{\"kind\":\"entry\",{}", &reference[1..]));
        let read: OutboxEntry = serde_json::from_str(&reference).unwrap();
        prop_assert_eq!(&read, &entry);
        prop_assert_eq!(serde_json::to_string(&read).unwrap(), reference);
        let wire = serde_json::to_value(state.wire()).unwrap();
        let fields = serde_json::to_value(legacy(&base_entry(), flags_of(&state))).unwrap();
        for (k, v) in wire.as_object().unwrap() {
            prop_assert_eq!(Some(v), fields.get(k), "{}", k);
        }
        prop_assert_eq!(state.status() == EntryStatus::Queued, is_queued(&state));
        prop_assert_eq!(entry.drainable(), matches!(state, EntryState::Ready { .. }));
    }

    // OB-05: a saved combination decodes exactly when a state has it; then it encodes
    // back to the same bytes, otherwise it is a typed error and never a panic.
    #[test]
    fn a_saved_combination_decodes_or_is_a_typed_error(f in any_flags()) {
        let base = base_entry();
        let saved = serde_json::to_string(&legacy(&base, f.clone())).unwrap();
        let typed = EntryState::try_from(state_fields(&f));
        let read = serde_json::from_str::<OutboxEntry>(&saved);
        prop_assert_eq!(typed.is_ok(), representable(&f), "{:?}", f);
        match (typed, read) {
            (Ok(state), Ok(entry)) => {
                prop_assert_eq!(&entry.state, &state);
                prop_assert_eq!(flags_of(&state), f);
                prop_assert_eq!(serde_json::to_string(&entry).unwrap(), saved);
            }
            (Err(error), Err(refused)) => {
                prop_assert!(refused.to_string().starts_with(&error.to_string()), "{}", refused);
            }
            (typed, read) => prop_assert!(false, "{:?} but {:?}", typed, read),
        }
    }

    // OB-08, OB-09, OB-11, OB-12, OB-13, OB-15, OB-16: each transition changes the loose
    // fields exactly as custody's field edits did, on the states custody applies it to,
    // and applies to exactly those states.
    #[test]
    fn transitions_make_the_old_field_edits(state in entry_state(), a in acceptance(), text in "[a-z]{0,3}") {
        let f = flags_of(&state);
        let queued = is_queued(&state);
        let error = Some(text.clone()).filter(|t| !t.is_empty());

        // Held for the user with `error` (canceled, unadmitted, unconfirmed, ...).
        // A hand-off whose take-back was never confirmed leaves its mark behind (OB-13).
        let unconfirmed_handoff = matches!(state, EntryState::HandingOff { .. });
        prop_assert_eq!(flags_of(&state.hold(error.clone())), edit(&f, |f| {
            f.status = LegacyStatus::Queued;
            f.auto_drain = false;
            f.error = error.clone();
            f.acceptance = None;
            if unconfirmed_handoff {
                f.handoff = None;
            }
        }));
        // Canceled (OB-08): held with no error and the seed's text as hold reason.
        prop_assert_eq!(flags_of(&state.cancel()), edit(&f, |f| {
            f.status = LegacyStatus::Queued;
            f.auto_drain = false;
            f.error = None;
            f.hold_reason = Some(CANCELED_TEXT.to_owned());
            f.acceptance = None;
            if unconfirmed_handoff {
                f.handoff = None;
            }
        }));
        // The reopen check's wait (OB-12): held with its text, an error kept.
        let checking = state.await_reopen_check();
        prop_assert_eq!(checking.is_some(), queued);
        if let Some(checking) = checking {
            prop_assert_eq!(flags_of(&checking), edit(&f, |f| {
                f.auto_drain = false;
                f.hold_reason = Some(REOPEN_CHECK_TEXT.to_owned());
            }));
        }
        // The hold check of a session message.
        let held = state.hold_for_approval(text.clone());
        prop_assert_eq!(held.is_some(), queued);
        if let Some(held) = held {
            prop_assert_eq!(flags_of(&held), edit(&f, |f| {
                f.auto_drain = false;
                f.hold_reason = Some(text.clone());
            }));
        }
        // The reopen check's wait, send now, a repeated submit.
        let paused = state.pause_for_reopen();
        prop_assert_eq!(paused.is_some(), queued);
        if let Some(paused) = paused {
            prop_assert_eq!(flags_of(&paused), edit(&f, |f| f.auto_drain = false));
        }
        let released = state.release();
        prop_assert_eq!(released.is_some(), queued);
        if let Some(released) = released {
            prop_assert_eq!(flags_of(&released), edit(&f, |f| {
                f.auto_drain = true;
                f.error = None;
                f.hold_reason = None;
            }));
        }
        let resubmitted = state.resubmit();
        prop_assert_eq!(resubmitted.is_some(), queued);
        if let Some(resubmitted) = resubmitted {
            prop_assert_eq!(flags_of(&resubmitted), edit(&f, |f| {
                if f.error.is_none() {
                    f.auto_drain = true;
                    f.hold_reason = None;
                }
            }));
        }
        // The hand-off, and the history read before a send (custody does both only to
        // an entry the drain may send).
        let sending = state.mark_sending();
        prop_assert_eq!(sending.is_some(), queued);
        let confirming = state.mark_confirming();
        prop_assert_eq!(confirming.is_some(), queued);
        if let (EntryState::Ready { .. }, Some(sending), Some(confirming)) = (&state, sending, confirming) {
            prop_assert_eq!(flags_of(&sending), edit(&f, |f| {
                f.status = LegacyStatus::Sending;
                f.error = None;
                f.hold_reason = None;
                f.acceptance = None;
            }));
            prop_assert_eq!(flags_of(&confirming), edit(&f, |f| f.status = LegacyStatus::Sending));
        }
        // Send results on the entry as it went sending.
        let accepted = state.accept(a.clone());
        prop_assert_eq!(
            accepted.is_some(),
            matches!(state, EntryState::Sending { .. } | EntryState::Accepted { .. })
        );
        if let Some(accepted) = accepted {
            if state.notice().is_none_or(EntryNotice::is_empty) {
                prop_assert_eq!(flags_of(&accepted), edit(&f, |f| f.acceptance = Some(a.clone())));
            }
        }
        let deferred = state.defer(text.clone());
        prop_assert_eq!(deferred.is_some(), matches!(state, EntryState::Sending { .. }));
        if let Some(deferred) = deferred {
            prop_assert_eq!(flags_of(&deferred), edit(&f, |f| {
                let dedicated = f.handoff.as_ref().is_some_and(|h| h.phase == HandoffPhase::Dedicated);
                f.status = LegacyStatus::Queued;
                f.auto_drain = !dedicated;
                f.hold_reason = Some(text.clone());
            }));
        }
        // Stop and send now.
        let requested = state.request_handoff();
        prop_assert_eq!(
            requested.is_some(),
            f.acceptance.is_some() && f.status == LegacyStatus::Sending && f.handoff.is_none()
        );
        if let Some(requested) = requested {
            prop_assert_eq!(flags_of(&requested), edit(&f, |f| {
                f.auto_drain = false;
                f.handoff = Some(Handoff::requested(f.acceptance.clone().unwrap()));
            }));
        }
        let handing_off = matches!(state, EntryState::HandingOff { .. });
        let taken = state.take_back();
        prop_assert_eq!(taken.is_some(), handing_off);
        if let Some(taken) = taken {
            prop_assert_eq!(flags_of(&taken), edit(&f, |f| {
                f.acceptance = None;
                f.status = LegacyStatus::Queued;
            }));
        }
        let kept = state.keep_accepted();
        prop_assert_eq!(kept.is_some(), handing_off);
        if let Some(kept) = kept {
            prop_assert_eq!(flags_of(&kept), edit(&f, |f| {
                f.handoff = None;
                f.auto_drain = true;
            }));
        }
        let dedicated = state.dedicate();
        prop_assert_eq!(dedicated.is_some(), queued && f.handoff.is_some());
        if let Some(dedicated) = dedicated {
            prop_assert_eq!(flags_of(&dedicated), edit(&f, |f| {
                f.status = LegacyStatus::Queued;
                f.auto_drain = true;
                f.acceptance = None;
                f.handoff = Some(Handoff::dedicated(f.handoff.clone().unwrap().acceptance));
            }));
        }
    }
}

fn turn(n: u8) -> Acceptance {
    Acceptance {
        run_id: outbox_core::ids::RunId::new(format!("run-{n}")).unwrap(),
        thread_id: outbox_core::ids::ThreadId::new("thread-1").unwrap(),
        turn_id: outbox_core::ids::TurnId::new(format!("turn-{n}")).unwrap(),
        accepted_at: Millis(1),
    }
}

fn saved(f: Flags) -> String {
    serde_json::to_string(&legacy(&base_entry(), f)).unwrap()
}

// OB-05: the combinations no state has, each with its typed error.
#[test]
fn combinations_no_state_has_are_named() {
    let queued = Flags {
        status: LegacyStatus::Queued,
        auto_drain: true,
        error: None,
        hold_reason: None,
        acceptance: None,
        handoff: None,
    };
    let sending = Flags {
        status: LegacyStatus::Sending,
        ..queued.clone()
    };
    let cases = [
        (
            Flags {
                acceptance: Some(turn(1)),
                ..queued.clone()
            },
            InvalidEntryState::QueuedWithAcceptance,
        ),
        (
            Flags {
                acceptance: Some(turn(1)),
                error: Some("failed".into()),
                ..sending.clone()
            },
            InvalidEntryState::AcceptedWithNotice,
        ),
        (
            Flags {
                auto_drain: false,
                ..sending.clone()
            },
            InvalidEntryState::SendingWithoutAutoDrain,
        ),
        (
            Flags {
                auto_drain: false,
                acceptance: Some(turn(1)),
                handoff: Some(Handoff::dedicated(turn(1))),
                ..sending.clone()
            },
            InvalidEntryState::SendingWithoutAutoDrain,
        ),
        (
            Flags {
                auto_drain: false,
                acceptance: Some(turn(1)),
                handoff: Some(Handoff::requested(turn(2))),
                ..sending.clone()
            },
            InvalidEntryState::HandoffOfAnotherTurn,
        ),
        (
            Flags {
                auto_drain: false,
                acceptance: Some(turn(1)),
                handoff: Some(Handoff::requested(turn(1))),
                hold_reason: Some("held".into()),
                ..sending.clone()
            },
            InvalidEntryState::AcceptedWithNotice,
        ),
    ];
    for (flags, expected) in cases {
        assert_eq!(
            EntryState::try_from(state_fields(&flags)),
            Err(expected.clone()),
            "{flags:?}"
        );
        let refused = serde_json::from_str::<OutboxEntry>(&saved(flags)).unwrap_err();
        assert!(
            refused.to_string().starts_with(&expected.to_string()),
            "{refused}"
        );
    }
}

// OB-05: a saved entry whose state fields no state has shows as blocked with the
// reason, is never dropped, and the queue drains around it.
#[test]
fn an_entry_no_state_has_shows_blocked_and_the_queue_drains_around_it() {
    let session = SessionId::new("s1").unwrap();
    let mut store = MemoryOutboxStore::new();
    let queued_with_acceptance = saved(Flags {
        status: LegacyStatus::Queued,
        auto_drain: true,
        error: None,
        hold_reason: None,
        acceptance: Some(turn(1)),
        handoff: None,
    });
    store.insert_raw_entry(&session, "q-1", "op-1", -7, &queued_with_acceptance);
    let fine = OutboxEntry {
        queue_id: QueueId::new("q-2").unwrap(),
        operation_id: OperationId::new("op-2").unwrap(),
        position: 0,
        ..base_entry()
    };
    let fp = outbox_core::fingerprint::request_fingerprint(&session, &fine.queue_id, &fine.request);
    store.claim(&session, &fp, &fine).unwrap();
    let entries = store.entries(&session).unwrap();
    let StoredEntry::Blocked(blocked) = &entries[0] else {
        panic!("{entries:?}")
    };
    assert_eq!(
        (
            blocked.queue_id.as_str(),
            blocked.operation_id.as_deref(),
            blocked.position
        ),
        ("q-1", Some("op-1"), -7)
    );
    assert!(
        blocked
            .reason
            .starts_with(&InvalidEntryState::QueuedWithAcceptance.to_string()),
        "{}",
        blocked.reason
    );
    let mut c = outbox_core::custody::Custody::new(store, Box::new(|| "u".to_owned()));
    c.set_session(
        &session,
        outbox_core::custody::SessionInfo::new(outbox_core::adapter::Capabilities::codex()),
    );
    c.wake(&session, Millis(1));
    let Some(outbox_core::custody::CustodyEffect::Send(send)) = c.poll_effect() else {
        panic!("the entry behind it is sent")
    };
    assert_eq!(send.operation_id.as_str(), "op-2");
    assert_eq!(c.entries(&session).unwrap().len(), 2, "nothing is dropped");
}

// OB-05: the fields a file written before the state holds for each stage read back as
// the states the module docs name.
#[test]
fn saved_stages_read_back_as_their_states() {
    let read = |json: &str| {
        let mut v = serde_json::to_value(base_entry()).unwrap();
        let o = v.as_object_mut().unwrap();
        for k in ["status", "autoDrain"] {
            o.remove(k);
        }
        let extra: serde_json::Value = serde_json::from_str(json).unwrap();
        o.extend(extra.as_object().unwrap().clone());
        serde_json::from_value::<OutboxEntry>(v).unwrap().state
    };
    let t = serde_json::to_value(turn(1)).unwrap();
    assert_eq!(
        read(r#"{"status":"queued","autoDrain":true,"holdReason":"the run settles"}"#),
        EntryState::Ready {
            notice: EntryNotice {
                error: None,
                hold_reason: Some("the run settles".into())
            },
            handoff: None
        }
    );
    assert_eq!(
        read(r#"{"status":"queued","autoDrain":false}"#),
        EntryState::queued().hold(None)
    );
    assert_eq!(
        read(&format!(
            r#"{{"status":"sending","autoDrain":false,"acceptance":{t},"handoff":{{"phase":"requested","acceptance":{t}}}}}"#
        )),
        EntryState::HandingOff {
            acceptance: turn(1)
        }
    );
    assert_eq!(
        read(&format!(
            r#"{{"status":"queued","autoDrain":false,"handoff":{{"phase":"requested","acceptance":{t}}}}}"#
        )),
        EntryState::HandingOff {
            acceptance: turn(1)
        }
        .take_back()
        .unwrap()
    );
    assert_eq!(
        read(&format!(
            r#"{{"status":"queued","autoDrain":true,"handoff":{{"phase":"dedicated","acceptance":{t}}}}}"#
        )),
        EntryState::Ready {
            notice: EntryNotice::default(),
            handoff: Some(Handoff::dedicated(turn(1)))
        }
    );
}
