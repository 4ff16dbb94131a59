//! Target `rows`: row wording read from the wire and approval card IDs (RW-01 to
//! RW-06).
//!
//! Checks:
//!
//! - [`validate`] on an arbitrary JSON row never panics, and a row survives its JSON
//!   round trip with the same violations;
//! - rows from the constructors never break the rules the constructors own: a language
//!   hint only where [`detect_language`] proves it, no subtitle on a command, a file read
//!   with its `sourcePath`, a message row worded from its fact and without a detail;
//! - the words for the other end of a message are never blank and always one line;
//! - a card ID that parses is exactly the card ID of its four parts, and any four parts
//!   parse back from their card ID;
//! - an approval decision is allowed exactly when the request lists it.
//!
//! Script: one mode byte, then the mode's fields (see [`Mode`]).

use timeline_core::rows::{
    approval_card, detect_language, parse_card_id, validate, ActivityKind, ActivityRow,
    ApprovalKind, ApprovalRequest, ApprovalResult, Decision, Detail, MessageDelivery, MessageFact,
    MessageKind, MessageRule, OtherEnd, RowStatus, RuleViolation,
};

use crate::script::{Script, ScriptWriter};

/// The modes of this target, in the order of the mode byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    /// The rest as an activity row JSON.
    RowJson = 0,
    /// Status byte, exit-code byte, then three texts for the constructors.
    Constructors = 1,
    /// The rest as a card ID text.
    CardParse = 2,
    /// Four texts: request, thread, turn, item.
    CardBuild = 3,
    /// The rest as an approval request JSON.
    ApprovalJson = 4,
    /// Other-end byte, delivery byte, then name, reason and summary texts.
    Message = 5,
    /// The rest as a message fact JSON.
    FactJson = 6,
}

impl Mode {
    const ALL: [Mode; 7] = [
        Mode::RowJson,
        Mode::Constructors,
        Mode::CardParse,
        Mode::CardBuild,
        Mode::ApprovalJson,
        Mode::Message,
        Mode::FactJson,
    ];

    fn read(s: &mut Script<'_>) -> Mode {
        let i = usize::from(s.pick(Mode::ALL.len() as u8));
        Mode::ALL.get(i).copied().unwrap_or(Mode::RowJson)
    }
}

/// Writes a script of `mode` whose rest is `text`.
pub fn write_rest(w: &mut ScriptWriter, mode: Mode, text: &[u8]) {
    w.byte(mode as u8).raw(text);
}

/// Writes a constructors script.
pub fn write_constructors(w: &mut ScriptWriter, a: &str, b: &str, c: &str) {
    w.byte(Mode::Constructors as u8)
        .byte(1)
        .byte(0)
        .text(a)
        .text(b)
        .text(c);
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let mut s = Script::new(data);
    match Mode::read(&mut s) {
        Mode::RowJson => {
            if let Ok(row) = serde_json::from_slice::<ActivityRow>(s.rest()) {
                wire_row(&row);
            }
        }
        Mode::Constructors => constructors(&mut s),
        Mode::CardParse => {
            if let Ok(text) = std::str::from_utf8(s.rest()) {
                card_parse(text);
            }
        }
        Mode::CardBuild => {
            let parts = [s.text(), s.text(), s.text(), s.text()].map(|p| p.into_owned());
            card_build(parts);
        }
        Mode::ApprovalJson => {
            if let Ok(req) = serde_json::from_slice::<ApprovalRequest>(s.rest()) {
                approval(&req);
            }
        }
        Mode::Message => message(&mut s),
        Mode::FactJson => {
            if let Ok(fact) = serde_json::from_slice::<MessageFact>(s.rest()) {
                let _violations = fact.violations();
                let row = ActivityRow::message(fact, None);
                message_row_rules(&row);
            }
        }
    }
}

// RW-01, RW-02, RW-04
fn wire_row(row: &ActivityRow) {
    let violations = validate(row);
    let json = serde_json::to_string(row).unwrap_or_default();
    let back: Option<ActivityRow> = serde_json::from_str(&json).ok();
    assert_eq!(back.as_ref(), Some(row), "activity row JSON round trip");
    if let Some(back) = back {
        assert_eq!(validate(&back), violations);
    }
    if let Some(d) = &row.detail {
        hint_is_proven(&d.text);
    }
}

// RW-01
fn hint_is_proven(text: &str) {
    let hint = detect_language(text);
    assert_eq!(
        detect_language(text),
        hint,
        "detect_language is not a function"
    );
    assert_eq!(Detail::plaintext(text).language_hint, hint);
}

fn status(b: u8) -> RowStatus {
    [
        RowStatus::InProgress,
        RowStatus::Completed,
        RowStatus::Failed,
        RowStatus::Declined,
    ][usize::from(b % 4)]
}

fn has(violations: &[RuleViolation], f: impl Fn(&RuleViolation) -> bool) -> bool {
    violations.iter().any(f)
}

// RW-01, RW-04
fn constructors(s: &mut Script<'_>) {
    let st = status(s.byte());
    let exit = match s.byte() {
        0 => None,
        n => Some(i32::from(n) - 128),
    };
    let (a, b, c) = (s.text(), s.text(), s.text());
    hint_is_proven(&c);
    let rows = [
        ActivityRow::command(&a, st, exit, &c),
        ActivityRow::file_read(&a, st, &c),
        ActivityRow::file_change(&a, st == RowStatus::Completed, st, &c),
        ActivityRow::tool_call(&a, Some(&b), st, &c),
        ActivityRow::tool_call(&a, None, st, &c),
    ];
    for row in &rows {
        let v = validate(row);
        assert!(
            !has(&v, |x| matches!(x, RuleViolation::WrongLanguageHint { .. })),
            "a constructor gave an unproven language hint: {v:?}"
        );
        assert!(!has(&v, |x| *x == RuleViolation::CommandWithSubtitle));
        assert!(!has(&v, |x| *x == RuleViolation::FileReadWithoutSourcePath));
        wire_row(row);
    }
    if let Some(d) = &rows[1].detail {
        assert_eq!(d.source_path.as_deref(), Some(&*a));
    }
}

// RW-06
fn card_parse(text: &str) {
    let Ok((request_id, thread_id, turn_id, item_id)) = parse_card_id(text) else {
        return;
    };
    let req = ApprovalRequest {
        request_id,
        thread_id,
        turn_id,
        item_id,
        kind: ApprovalKind::CommandExecution,
        allowed: Vec::new(),
    };
    assert_eq!(
        req.card_id(),
        text,
        "a card ID parsed that is not its parts' card ID"
    );
}

// RW-06
fn card_build(parts: [String; 4]) {
    let [request_id, thread_id, turn_id, item_id] = parts;
    let req = ApprovalRequest {
        request_id,
        thread_id,
        turn_id,
        item_id,
        kind: ApprovalKind::FileChange,
        allowed: Vec::new(),
    };
    let id = req.card_id();
    assert_eq!(
        parse_card_id(&id),
        Ok((
            req.request_id.clone(),
            req.thread_id.clone(),
            req.turn_id.clone(),
            req.item_id.clone()
        )),
        "card ID does not parse back to its parts"
    );
}

// RW-06
fn approval(req: &ApprovalRequest) {
    for d in [
        Decision::Accept,
        Decision::AcceptForSession,
        Decision::AcceptBroadly,
        Decision::Decline,
        Decision::Cancel,
    ] {
        assert_eq!(req.decide(d).is_ok(), req.allowed.contains(&d));
    }
    for result in [
        None,
        Some(ApprovalResult::Accepted),
        Some(ApprovalResult::Declined),
        Some(ApprovalResult::ResolvedExternally),
    ] {
        let card = approval_card(req, &req.item_id, result);
        assert_eq!(card.kind, ActivityKind::Event);
        assert_eq!(
            card.display.signal.as_deref(),
            result.map(ApprovalResult::label)
        );
        let _violations = validate(&card);
    }
    card_build([
        req.request_id.clone(),
        req.thread_id.clone(),
        req.turn_id.clone(),
        req.item_id.clone(),
    ]);
}

fn other_end(s: &mut Script<'_>) -> OtherEnd {
    let pick = s.pick(7);
    let name = s.text().into_owned();
    let some = |n: String| (!n.is_empty()).then_some(n);
    match pick {
        0 => OtherEnd::Session {
            title: name,
            agent: timeline_core::key::AgentKind::Codex,
        },
        1 => OtherEnd::NoSession,
        2 => OtherEnd::ClaudeLead,
        3 => OtherEnd::ClaudeSubagent { title: some(name) },
        4 => OtherEnd::OutsideClaude { name: some(name) },
        5 => OtherEnd::CodexRoot,
        _ => OtherEnd::CodexAgent {
            path: name.split('/').map(str::to_owned).collect(),
        },
    }
}

// RW-03
fn words_rules(end: &OtherEnd) {
    let w = end.words();
    assert!(!w.trim().is_empty(), "blank words for {end:?}");
    assert!(
        !w.contains(['\n', '\r']),
        "words of more than one line: {w:?}"
    );
}

// RW-02, RW-04
fn message_row_rules(row: &ActivityRow) {
    let v = validate(row);
    for bad in [
        RuleViolation::MessageWithDetail,
        RuleViolation::MessageWithoutFact,
        RuleViolation::Message(MessageRule::TitleNotFromFact),
        RuleViolation::Message(MessageRule::SignalNotFromDelivery),
    ] {
        assert!(
            !v.contains(&bad),
            "a message row built from its fact breaks {bad:?}"
        );
    }
    wire_row(row);
}

// RW-02, RW-03, RW-04
fn message(s: &mut Script<'_>) {
    let end = other_end(s);
    words_rules(&end);
    let delivery = match s.pick(4) {
        0 => None,
        1 => Some(MessageDelivery::Sent),
        2 => Some(MessageDelivery::NeedsApproval),
        _ => Some(MessageDelivery::NotSent),
    };
    let reason = s.text();
    let summary = s.text();
    let facts = [
        MessageFact::sent("This session", &end, delivery, Some(&reason)),
        MessageFact::declined("This agent", &end),
        MessageFact::received("This session", &end, MessageKind::Message),
        MessageFact::received("This agent", &end, MessageKind::Task),
    ];
    for fact in facts {
        let v = fact.violations();
        for bad in [
            MessageRule::BlankWords,
            MessageRule::TaskOnSentRow,
            MessageRule::DeliveryWhereNone,
            MessageRule::ReasonWithoutNotSent,
            MessageRule::ReasonTooLong,
        ] {
            assert!(
                !v.contains(&bad),
                "a fact from the constructors breaks {bad:?}: {fact:?}"
            );
        }
        message_row_rules(&ActivityRow::message(fact.clone(), Some(&summary)));
        message_row_rules(&ActivityRow::message(fact, None));
    }
}
