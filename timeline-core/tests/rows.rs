//! Row wording (RW-01 to RW-07), over the shared sample table in `fixtures`.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;

use fixtures::rows::{broken_samples, render_all, samples};
use proptest::prelude::*;
use timeline_core::key::RunId;
use timeline_core::order::SourceOrder;
use timeline_core::rows::{
    detect_language, parse_card_id, phase_label, status_row, validate, ActivityKind, ApprovalKind,
    ApprovalRequest, ApprovalResult, Decision, DecisionNotAllowed, Delivery, LanguageHint,
    MessageFact, MessageRule, OtherEnd, RuleViolation, DECLINED_REASON,
};
use timeline_core::time::Millis;

// RW-07: the wording of every sample, snapshot-tested (CI never writes snapshots).
#[test]
fn row_wording_samples_snapshot() {
    insta::assert_snapshot!("row_wording_samples", render_all());
}

// RW-07: at least 40 named samples, names unique.
#[test]
fn the_sample_table_has_forty_named_rows() {
    let all = samples();
    assert!(all.len() >= 40, "{}", all.len());
    let names: HashSet<&str> = all.iter().map(|s| s.name).collect();
    assert_eq!(names.len(), all.len());
}

// RW-01, RW-02, RW-04: rows built by the constructors are valid; each broken sample
// breaks the rule it is named after, and every rule has a failing sample.
#[test]
fn every_rule_has_a_passing_and_a_failing_sample() {
    for s in samples().iter().filter(|s| !s.name.starts_with("broken_")) {
        assert_eq!(validate(&s.row), vec![], "{} should be valid", s.name);
    }
    let mut seen: HashSet<String> = HashSet::new();
    for s in broken_samples() {
        let v = validate(&s.row);
        assert!(!v.is_empty(), "{} should break a rule", s.name);
        for x in v {
            let name = match x {
                RuleViolation::Message(rule) => format!("Message({rule:?})"),
                other => format!("{other:?}")
                    .split(['(', ' '])
                    .next()
                    .unwrap()
                    .to_owned(),
            };
            seen.insert(name);
        }
    }
    for rule in [
        "BlankTitle",
        "SubtitleRepeatsTitle",
        "StatusWordInSubtitle",
        "StatusWordInSignal",
        "SignalRepeatsTitle",
        "SignalRepeatsSubtitle",
        "CommandWithSubtitle",
        "MessageWithDetail",
        "MessageWithoutFact",
        "WrongLanguageHint",
        "FileReadWithoutSourcePath",
        "Message(BlankWords)",
        "Message(IdAsWords)",
        "Message(TaskOnSentRow)",
        "Message(DeliveryWhereNone)",
        "Message(ReasonWithoutNotSent)",
        "Message(ReasonTooLong)",
        "Message(TitleNotFromFact)",
        "Message(SignalNotFromDelivery)",
    ] {
        assert!(
            seen.contains(rule),
            "no failing sample for {rule}: {seen:?}"
        );
    }
}

// RW-01: the language hint is a real check of the text, on true and near-miss inputs.
#[test]
fn language_hints_are_detected_from_the_text() {
    let cases: &[(&str, Option<LanguageHint>)] = &[
        ("{\"a\": [1, 2]}", Some(LanguageHint::Json)),
        ("  [1, 2, 3]\n", Some(LanguageHint::Json)),
        ("{\"a\": 1,}", None),
        ("{\"a\": 1", None),
        ("42", None),
        ("\"just a string\"", None),
        ("{\"a\":1}\n{\"b\":2}\n", Some(LanguageHint::Jsonl)),
        ("{\"a\":1}\n{\"b\":2\n", None),
        ("{\"a\":1}\nnot json\n", None),
        (
            "--- a/x\n+++ b/x\n@@ -1,2 +1,3 @@\n line\n-old\n+new\n+more\n",
            Some(LanguageHint::Diff),
        ),
        (
            "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n",
            Some(LanguageHint::Diff),
        ),
        ("--- a/x\n+++ b/x\n@@ -x,2 +1 @@\n-a\n", None),
        ("--- a/x\n+++ b/x\n-a\n+b\n", None),
        ("--- a/x\n@@ -1 +1 @@\n-a\n+b\n", None),
        ("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n*b\n", None),
        ("FILE src/main.rs\nfn main() {}\n", Some(LanguageHint::File)),
        ("FILE \nfn main() {}\n", None),
        ("file src/main.rs\n", None),
        ("plain words", None),
    ];
    for (text, hint) in cases {
        assert_eq!(detect_language(text), *hint, "{text:?}");
    }
}

// RW-03: the words for the other end.
#[test]
fn words_for_the_other_end() {
    let cases = [
        (
            OtherEnd::Session {
                title: "Android landing".into(),
            },
            "Android landing",
        ),
        (
            OtherEnd::Session {
                title: "   ".into(),
            },
            "Untitled session",
        ),
        (OtherEnd::NoSession, "Unknown session"),
        (OtherEnd::ClaudeLead, "Claude"),
        (
            OtherEnd::ClaudeSubagent {
                title: Some("Code reviewer".into()),
            },
            "Code reviewer",
        ),
        (OtherEnd::ClaudeSubagent { title: None }, "Subagent"),
        (
            OtherEnd::OutsideClaude {
                name: Some("infra-notes".into()),
            },
            "infra-notes",
        ),
        (
            OtherEnd::OutsideClaude {
                name: Some(" ".into()),
            },
            "Another Claude session",
        ),
        (OtherEnd::CodexRoot, "Codex"),
        (
            OtherEnd::CodexAgent {
                path: vec!["root".into(), "android_landing".into()],
            },
            "Android landing",
        ),
    ];
    for (end, words) in cases {
        assert_eq!(end.words(), words, "{end:?}");
    }
}

// RW-02, RW-04: titles, signals, the declined reason, the 220-character cut.
#[test]
fn message_titles_signals_and_reasons() {
    let to = OtherEnd::Session {
        title: "Docs".into(),
    };
    let sent = MessageFact::sent("This session", &to, Some(Delivery::NeedsApproval), None);
    assert_eq!(
        (sent.title(), sent.signal()),
        ("Message to Docs".into(), Some("Needs approval"))
    );
    let declined = MessageFact::declined("This session", &to);
    assert_eq!(
        (declined.signal(), declined.failure_reason.as_deref()),
        (Some("Not sent"), Some(DECLINED_REASON))
    );
    let running = MessageFact {
        call_running: true,
        ..MessageFact::sent("This session", &to, None, None)
    };
    assert_eq!(
        (running.title(), running.signal()),
        ("Send message to session".into(), None)
    );
    let reason = format!("{}\nsecond line", "é".repeat(219));
    let at = MessageFact::sent("This session", &to, Some(Delivery::NotSent), Some(&reason));
    assert_eq!(at.failure_reason.as_deref().unwrap().chars().count(), 219);
    let long = MessageFact::sent(
        "This session",
        &to,
        Some(Delivery::NotSent),
        Some(&"é".repeat(221)),
    );
    let cut = long.failure_reason.unwrap();
    assert_eq!(cut.chars().count(), 220, "characters, not bytes");
    assert!(cut.len() > 220 && cut.ends_with('…'));
    let exactly = MessageFact::sent(
        "This session",
        &to,
        Some(Delivery::NotSent),
        Some(&"a".repeat(220)),
    );
    assert_eq!(exactly.failure_reason.unwrap(), "a".repeat(220));
    // A sent reason without not-sent never appears.
    assert_eq!(
        MessageFact::sent("This session", &to, Some(Delivery::Sent), Some("x")).failure_reason,
        None
    );
    let received = MessageFact::received(
        "This agent",
        &OtherEnd::ClaudeLead,
        timeline_core::rows::MessageKind::Task,
    );
    assert_eq!(received.title(), "Task from Claude");
    assert_eq!(received.violations(), Vec::<MessageRule>::new());
}

// RW-05: the status row.
#[test]
fn the_status_row_is_named_after_the_run_and_labeled_by_the_newest_activity() {
    let run = RunId::new("run-0b7c-1700").unwrap();
    let row = status_row(&run, Millis(1_700), Some(ActivityKind::Command));
    assert_eq!(row.key().encoded(), "thinking\0thinking-run-0b7c-1700");
    assert_eq!(
        row.source_order,
        Some(SourceOrder::active_run_status(Millis(1_700)))
    );
    assert_eq!(row.data["label"], "Running command");
    let labels = [
        (Some(ActivityKind::Reasoning), "Reasoning"),
        (Some(ActivityKind::Command), "Running command"),
        (Some(ActivityKind::FileChange), "Editing files"),
        (Some(ActivityKind::FileRead), "Reading"),
        (Some(ActivityKind::Search), "Reading"),
        (Some(ActivityKind::ToolCall), "Using tool"),
        (Some(ActivityKind::Plan), "Planning"),
        (Some(ActivityKind::Message), "Working"),
        (None, "Working"),
    ];
    for (kind, label) in labels {
        assert_eq!(phase_label(kind), label);
    }
}

fn request(ids: [&str; 4]) -> ApprovalRequest {
    ApprovalRequest {
        request_id: ids[0].into(),
        thread_id: ids[1].into(),
        turn_id: ids[2].into(),
        item_id: ids[3].into(),
        kind: ApprovalKind::CommandExecution,
        allowed: vec![Decision::Accept, Decision::Decline],
    }
}

// RW-06: decisions outside the allowed list are refused; results and the expired label.
#[test]
fn approvals_check_the_allowed_decisions() {
    let r = request(["req-1", "t", "u", "i"]);
    assert_eq!(r.decide(Decision::Accept), Ok(ApprovalResult::Accepted));
    assert_eq!(r.decide(Decision::Decline), Ok(ApprovalResult::Declined));
    assert_eq!(
        r.decide(Decision::AcceptBroadly),
        Err(DecisionNotAllowed(Decision::AcceptBroadly))
    );
    assert_eq!(
        r.decide(Decision::Cancel),
        Err(DecisionNotAllowed(Decision::Cancel))
    );
    assert_eq!(ApprovalResult::ResolvedExternally.label(), "Expired");
    // Pending and decided cards share the ID, so the decision replaces the card.
    assert_eq!(r.card_id(), request(["req-1", "t", "u", "i"]).card_id());
    assert_eq!(r.card_id(), "approval:5:req-11:t1:u1:i");
}

// RW-06: malformed card IDs are refused.
#[test]
fn malformed_card_ids_are_refused() {
    for bad in [
        "approval:",
        "approval:3:ab",
        "approval:1:a1:b1:c",
        "approval:1:a1:b1:c1:dX",
        "approval:01:a1:b1:c1:d",
        "card:1:a1:b1:c1:d",
        "approval:x:a1:b1:c1:d",
        // A length that ends inside a multi-byte character.
        "approval:1:\u{e9}1:a1:b1:c",
        "approval:99999999999999999999999:a",
    ] {
        assert!(parse_card_id(bad).is_err(), "{bad}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fixtures::proptest_cases()))]

    // RW-06: the card ID round-trips, IDs with the separators and digits included.
    #[test]
    fn card_ids_round_trip(ids in prop::array::uniform4("[a-z0-9:é🙂_-]{0,12}")) {
        let r = request([&ids[0], &ids[1], &ids[2], &ids[3]]);
        let (a, b, c, d) = parse_card_id(&r.card_id()).unwrap();
        prop_assert_eq!([a, b, c, d], ids);
    }

    // RW-06: a card ID whose lengths may be off by one is either refused or parses to IDs
    // that write back exactly the same text; with every length right it always parses.
    #[test]
    fn card_id_parsing_is_canonical(
        parts in prop::array::uniform4(("[a-z0-9:é]{0,6}", -1i64..=1)),
        tail in "[a-z:]{0,2}",
    ) {
        let mut text = String::from("approval:");
        for (id, delta) in &parts {
            let len = (id.len() as i64 + delta).max(0);
            text.push_str(&format!("{len}:{id}"));
        }
        text.push_str(&tail);
        match parse_card_id(&text) {
            Ok((a, b, c, d)) => {
                prop_assert_eq!(request([&a, &b, &c, &d]).card_id(), text);
            }
            Err(_) => prop_assert!(
                !tail.is_empty() || parts.iter().any(|(_, delta)| *delta != 0),
                "a well-formed card ID was refused: {}", text
            ),
        }
    }
}
