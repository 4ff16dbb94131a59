//! Row wording (RW-01 to RW-07), over the shared sample table in `fixtures`.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;

use fixtures::rows::{broken_samples, render_all, samples};
use proptest::prelude::*;
use timeline_core::key::AgentKind;
use timeline_core::key::RunId;
use timeline_core::order::SourceOrder;
use timeline_core::rows::{
    approval_card, detect_language, parse_card_id, phase_label, status_row, validate, ActivityKind,
    ActivityRow, ApprovalKind, ApprovalRequest, ApprovalResult, CardStatus, Decision,
    DecisionNotAllowed, LanguageHint, MessageDelivery, MessageFact, MessageKind, MessageRule,
    OtherEnd, PeerKind, RowStatus, RuleViolation, SendCall, DECLINED_REASON, RUNNING_SEND_TITLE,
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
        "Message(AgentAbsent)",
        "CardNotAnEvent",
        "CardSignalNotFromStatus",
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

fn codex_session(title: &str) -> OtherEnd {
    OtherEnd::Session {
        title: title.into(),
        agent: AgentKind::Codex,
    }
}

// RW-03: the words for the other end.
#[test]
fn words_for_the_other_end() {
    let cases = [
        (codex_session("Android landing"), "Android landing"),
        (codex_session("   "), "Untitled session"),
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
    let to = codex_session("Docs");
    let sent = MessageFact::sent(
        "This session",
        &to,
        Some(MessageDelivery::NeedsApproval),
        None,
    );
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
        running_call: Some(SendCall::SessionMessage),
        ..MessageFact::sent("This session", &to, None, None)
    };
    assert_eq!(
        (running.title(), running.signal()),
        ("Message to Docs".into(), None)
    );
    let reason = format!("{}\nsecond line", "é".repeat(219));
    let at = MessageFact::sent(
        "This session",
        &to,
        Some(MessageDelivery::NotSent),
        Some(&reason),
    );
    assert_eq!(at.failure_reason.as_deref().unwrap().chars().count(), 219);
    let long = MessageFact::sent(
        "This session",
        &to,
        Some(MessageDelivery::NotSent),
        Some(&"é".repeat(221)),
    );
    let cut = long.failure_reason.unwrap();
    assert_eq!(cut.chars().count(), 220, "characters, not bytes");
    assert!(cut.len() > 220 && cut.ends_with('…'));
    let exactly = MessageFact::sent(
        "This session",
        &to,
        Some(MessageDelivery::NotSent),
        Some(&"a".repeat(220)),
    );
    assert_eq!(exactly.failure_reason.unwrap(), "a".repeat(220));
    // A sent reason without not-sent never appears.
    assert_eq!(
        MessageFact::sent("This session", &to, Some(MessageDelivery::Sent), Some("x"))
            .failure_reason,
        None
    );
    let received = MessageFact::received("This agent", &OtherEnd::ClaudeLead, MessageKind::Task);
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

// RW-06: "The card is a live activity row of kind event." and "Card status: pending,
// then the result. resolvedExternally shows as expired."
#[test]
fn an_approval_card_is_an_event_row_with_its_card_status() {
    let r = request(["req-1", "t", "u", "i"]);
    let cases = [
        (None, "pending", None),
        (Some(ApprovalResult::Accepted), "accepted", Some("Allowed")),
        (
            Some(ApprovalResult::AcceptedForSession),
            "acceptedForSession",
            Some("Allowed for this session"),
        ),
        (
            Some(ApprovalResult::AcceptedBroadly),
            "acceptedBroadly",
            Some("Allowed broadly"),
        ),
        (Some(ApprovalResult::Declined), "declined", Some("Denied")),
        (
            Some(ApprovalResult::Cancelled),
            "cancelled",
            Some("Cancelled"),
        ),
        (
            Some(ApprovalResult::ResolvedExternally),
            "expired",
            Some("Expired"),
        ),
    ];
    for (result, status, signal) in cases {
        let card = approval_card(&r, "npm test", result);
        assert_eq!(card.kind, ActivityKind::Event, "{result:?}");
        assert_eq!(validate(&card), vec![], "{result:?}");
        assert_eq!(card.display.signal.as_deref(), signal, "{result:?}");
        let approval = card.approval.as_ref().unwrap();
        assert_eq!(approval.status, CardStatus::of(result));
        assert_eq!(approval.request, r);
        let json = serde_json::to_value(&card).unwrap();
        assert_eq!(json["kind"], "event", "not a kind of its own");
        assert_eq!(json["approval"]["status"], status, "{result:?}");
        assert_eq!(json["approval"]["requestId"], "req-1");
        assert_eq!(json["approval"]["itemId"], "i");
        assert_eq!(json["approval"]["kind"], "commandExecution");
        assert_eq!(
            serde_json::from_value::<ActivityRow>(json).unwrap(),
            card,
            "the card survives the wire"
        );
    }
    // The pending and the decided card are the same row with the same ID.
    let pending = approval_card(&r, "npm test", None);
    let decided = approval_card(&r, "npm test", Some(ApprovalResult::Accepted));
    assert_eq!(
        pending.approval.unwrap().request.card_id(),
        decided.approval.unwrap().request.card_id()
    );
    // A card that is not an event row, or whose signal is not its status, is refused.
    let card = approval_card(&r, "npm test", Some(ApprovalResult::ResolvedExternally));
    let wrong_kind = ActivityRow {
        kind: ActivityKind::ToolCall,
        ..card.clone()
    };
    assert_eq!(validate(&wrong_kind), [RuleViolation::CardNotAnEvent]);
    let mut wrong_signal = card;
    wrong_signal.display.signal = Some("Allowed".into());
    assert_eq!(
        validate(&wrong_signal),
        [RuleViolation::CardSignalNotFromStatus]
    );
}

// RW-02: "The agent is absent only when the call named a session that does not exist."
#[test]
fn the_peer_of_an_existing_session_carries_its_agent() {
    let claude = OtherEnd::Session {
        title: "Infra notes".into(),
        agent: AgentKind::Claude,
    };
    assert_eq!(claude.peer().kind, PeerKind::Session);
    assert_eq!(claude.peer().agent, Some(AgentKind::Claude));
    assert_eq!(
        codex_session("Android landing").peer().agent,
        Some(AgentKind::Codex)
    );
    // An untitled session exists all the same.
    assert_eq!(codex_session(" ").peer().agent, Some(AgentKind::Codex));
    for end in [
        OtherEnd::ClaudeLead,
        OtherEnd::ClaudeSubagent { title: None },
        OtherEnd::OutsideClaude { name: None },
        OtherEnd::CodexRoot,
        OtherEnd::CodexAgent {
            path: vec!["android_landing".into()],
        },
    ] {
        assert!(end.peer().agent.is_some(), "{end:?}");
    }
    assert_eq!(OtherEnd::NoSession.peer().agent, None);
    let unknown = MessageFact::sent(
        "This session",
        &OtherEnd::NoSession,
        Some(MessageDelivery::NotSent),
        None,
    );
    assert_eq!(unknown.violations(), vec![]);
    // A stored fact that drops the agent of an existing session is refused.
    let mut docs = MessageFact::sent("This session", &claude, Some(MessageDelivery::Sent), None);
    assert_eq!(docs.violations(), vec![]);
    docs.peer.agent = None;
    assert_eq!(docs.violations(), [MessageRule::AgentAbsent]);
    let mut lead = MessageFact::received("This agent", &OtherEnd::ClaudeLead, MessageKind::Task);
    lead.peer.agent = None;
    assert_eq!(lead.violations(), [MessageRule::AgentAbsent]);
}

// RW-04: "“Message to <to>” on a sent row" and "A send_session_message call that still
// runs stays the plain call row “Send message to session”." Only that call does.
#[test]
fn a_sent_row_is_titled_message_to_and_only_a_running_session_call_stays_plain() {
    let teammate = OtherEnd::ClaudeSubagent {
        title: Some("Code reviewer".into()),
    };
    let running = ActivityRow::message(
        MessageFact {
            running_call: Some(SendCall::AgentMessage),
            ..MessageFact::sent("This session", &teammate, None, None)
        },
        Some("Please review the parser change."),
    );
    assert_eq!(running.kind, ActivityKind::Message);
    assert_eq!(running.title, "Message to Code reviewer");
    assert_eq!(
        running.display.signal, None,
        "no signal while its call runs"
    );
    assert_eq!(running.status, RowStatus::InProgress);
    assert!(running.message.is_some());
    assert_eq!(validate(&running), vec![]);
    // The same row once the call ended.
    let ended = ActivityRow::message(
        MessageFact::sent("This session", &teammate, Some(MessageDelivery::Sent), None),
        None,
    );
    assert_eq!(
        (ended.title.as_str(), ended.display.signal.as_deref()),
        ("Message to Code reviewer", Some("Sent"))
    );
    // A running send_session_message call: the plain call row, no message fact yet.
    let plain = ActivityRow::message(
        MessageFact {
            running_call: Some(SendCall::SessionMessage),
            ..MessageFact::sent("This session", &codex_session("Docs"), None, None)
        },
        Some("Please review the docs."),
    );
    assert_eq!(plain.kind, ActivityKind::ToolCall);
    assert_eq!(plain.title, RUNNING_SEND_TITLE);
    assert_eq!(plain.title, "Send message to session");
    assert_eq!(plain.message, None);
    assert_eq!(plain.display.signal, None);
    assert_eq!(plain.status, RowStatus::InProgress);
    assert_eq!(validate(&plain), vec![]);
}

// RW-01: subtitle "never repeats the title"; display.signal "never repeats the title or
// the context line"; "The context line and the signal never say a status word."
#[test]
fn a_context_line_never_repeats_the_title_and_a_signal_never_repeats_either() {
    let docs = || {
        MessageFact::sent(
            "This session",
            &codex_session("Docs"),
            Some(MessageDelivery::Sent),
            None,
        )
    };
    for summary in [
        "Message to Docs",
        "message to  DOCS",
        "\nMESSAGE TO DOCS\nmore",
    ] {
        let row = ActivityRow::message(docs(), Some(summary));
        assert_eq!(row.subtitle, None, "{summary:?}");
        assert_eq!(validate(&row), vec![], "{summary:?}");
    }
    let sent = ActivityRow::message(docs(), Some("Sent"));
    assert_eq!(
        (sent.subtitle.as_deref(), sent.display.signal.as_deref()),
        (None, Some("Sent"))
    );
    assert_eq!(validate(&sent), vec![]);
    let not_sent = ActivityRow::message(
        MessageFact::declined("This session", &codex_session("Docs")),
        Some(" not  SENT "),
    );
    assert_eq!(not_sent.subtitle, None);
    assert_eq!(validate(&not_sent), vec![]);
    let status_word = ActivityRow::message(docs(), Some("The deploy failed, can you look?"));
    assert_eq!(status_word.subtitle, None);
    assert_eq!(validate(&status_word), vec![]);
    // A context line that says something else stays.
    let kept = ActivityRow::message(docs(), Some("Please review the docs.\nThanks"));
    assert_eq!(kept.subtitle.as_deref(), Some("Please review the docs."));
    // A tool call and an approval card keep no summary that repeats their title.
    let tool = ActivityRow::tool_call("grep", Some("used  GREP"), RowStatus::Completed, "x");
    assert_eq!(tool.subtitle, None);
    assert_eq!(validate(&tool), vec![]);
    let card = approval_card(&request(["r", "t", "u", "i"]), "approve COMMAND", None);
    assert_eq!(card.subtitle, None);
    assert_eq!(validate(&card), vec![]);
    // A command `exit 1` that exits with 1 shows no "Exit 1" beside itself.
    let exit = ActivityRow::command("exit 1", RowStatus::Failed, Some(1), "");
    assert_eq!(exit.display.signal, None);
    assert_eq!(validate(&exit), vec![]);
    let other = ActivityRow::command("exit 1", RowStatus::Failed, Some(2), "");
    assert_eq!(other.display.signal.as_deref(), Some("Exit 2"));
    // A folder named like a status word is no context line either.
    let read = ActivityRow::file_read("/repo/failed/x.txt", RowStatus::Completed, "x");
    assert_eq!(read.subtitle, None);
    assert_eq!(validate(&read), vec![]);
}

/// Text that tends to collide with titles, signals and status words.
fn tricky_text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("Sent".to_owned()),
        Just("Not sent".to_owned()),
        Just("Needs approval".to_owned()),
        Just("Message to Docs".to_owned()),
        Just("Approve command".to_owned()),
        Just("Used grep".to_owned()),
        Just("exit 1".to_owned()),
        Just("Allowed".to_owned()),
        Just("Expired".to_owned()),
        Just("completed".to_owned()),
        "(sent|docs|message|to|exit|1|failed|running|grep|used|approve|command|[g-z]{1,4}|[ \n\r\u{2028}]){0,8}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fixtures::proptest_cases()))]

    // RW-01, RW-02, RW-04, RW-06: every row the constructors build validates clean,
    // whatever the summary, command, path, tool, title or result.
    #[test]
    fn constructed_rows_validate_clean(
        summary in tricky_text(),
        command in tricky_text().prop_filter("a command has words", |c| !c.trim().is_empty()),
        path in "(/(repo|failed|sent|docs|exit 1|[g-z]{1,6})){1,4}",
        tool in "(grep|exit|sent|[g-z]{1,6})",
        title in "(Docs|Sent|[g-z ]{0,12})",
        claude in any::<bool>(),
        running in prop::option::of(prop_oneof![Just(SendCall::SessionMessage), Just(SendCall::AgentMessage)]),
        delivery in prop::option::of(prop_oneof![Just(MessageDelivery::Sent), Just(MessageDelivery::NeedsApproval), Just(MessageDelivery::NotSent)]),
        exit in prop::option::of(-2i32..3),
        result in prop::option::of(prop_oneof![
            Just(ApprovalResult::Accepted),
            Just(ApprovalResult::AcceptedForSession),
            Just(ApprovalResult::AcceptedBroadly),
            Just(ApprovalResult::Declined),
            Just(ApprovalResult::Cancelled),
            Just(ApprovalResult::ResolvedExternally),
        ]),
    ) {
        let agent = if claude { AgentKind::Claude } else { AgentKind::Codex };
        let ends = [
            OtherEnd::Session { title: title.clone(), agent },
            OtherEnd::NoSession,
            OtherEnd::ClaudeSubagent { title: Some(title.clone()) },
            OtherEnd::CodexRoot,
        ];
        let mut rows = vec![
            ActivityRow::command(&command, RowStatus::Failed, exit, &summary),
            ActivityRow::file_read(&path, RowStatus::Completed, &summary),
            ActivityRow::file_change(&path, claude, RowStatus::Completed, &summary),
            ActivityRow::tool_call(&tool, Some(&summary), RowStatus::Completed, &summary),
            approval_card(&request(["r", "t", "u", "i"]), &summary, result),
        ];
        for end in &ends {
            let sent = MessageFact::sent("This session", end, delivery.filter(|_| running.is_none()), Some(&summary));
            rows.push(ActivityRow::message(MessageFact { running_call: running, ..sent }, Some(&summary)));
            rows.push(ActivityRow::message(MessageFact::received("This agent", end, MessageKind::Message), Some(&summary)));
        }
        for row in rows {
            prop_assert_eq!(validate(&row), vec![], "{:?}", row);
        }
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

// RW-01 / RW-07: a row as one line of plain text keeps the row's own words: the
// speaker, the title, the first line of the context line and the signal.
#[test]
fn rows_as_plain_text_snapshot() {
    use timeline_core::block::Block;
    use timeline_core::key::{BlockKey, BlockType};
    let block = |t: BlockType, id: &str, data: serde_json::Value| {
        Block::new(BlockKey::parse(t, id).unwrap(), Millis(1)).with_data(data)
    };
    let mut lines = vec![
        timeline_core::rows::plain_text(&block(
            BlockType::User,
            "u",
            serde_json::json!({ "text": "Run the tests\nand report" }),
        )),
        timeline_core::rows::plain_text(&block(
            BlockType::AgentReply,
            "a",
            serde_json::json!({ "text": "412 passed" }),
        )),
        timeline_core::rows::plain_text(&block(
            BlockType::System,
            "s",
            serde_json::json!({ "text": "Context compacted" }),
        )),
        timeline_core::rows::plain_text(&block(
            BlockType::Thinking,
            "t",
            serde_json::json!({ "text": "Planning" }),
        )),
    ];
    for sample in samples() {
        let data = serde_json::to_value(&sample.row).unwrap();
        let line = timeline_core::rows::plain_text(&block(BlockType::Activity, sample.name, data));
        lines.push(format!("{:<40} {line}", sample.name));
    }
    insta::assert_snapshot!("rows_as_plain_text", lines.join("\n"));
}
