//! Messages between sessions (OB-16), the envelope (OB-17) and titles (OB-18).
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use fixtures::adapters::WhenUnscripted;
use outbox_core::adapter::StopRequest;
use outbox_core::adapter::{AgentKind, Capabilities, SendKind};
use outbox_core::custody::{CustodyEffect, SessionInfo};
use outbox_core::entry::{AccessLevel, Controls, Intent, SendMode};
use outbox_core::envelope::{
    decode_envelope, envelope, first_line, parse_envelope, read_session_message, EnvelopeError,
    EnvelopeSender,
};
use outbox_core::ids::CallId;
use outbox_core::session_message::{
    SessionMessageCall, ToolResult, ACCESS_UNCONFIRMED_REASON, ONE_SEND_PER_CALL_TEXT,
    OWN_SESSION_TEXT, UNKNOWN_SESSION_TEXT,
};
use outbox_core::store::{OutboxStore, RouteDelivery};
use outbox_core::titles::{
    final_title, provisional_title, title_after_first_message, TitleError, TitleGenerations,
    FRESH_CHAT,
};
use proptest::prelude::*;

fn call(from: &str, to: Option<&str>, call_id: &str, access: AccessLevel) -> SessionMessageCall {
    SessionMessageCall {
        sender_session: s(from),
        sender_run: None,
        sender_thread: None,
        call_id: CallId::new(call_id).unwrap(),
        recipient: to.map(s),
        body: "Please run the Android build.".into(),
        sender_title: "Web \"landing\" & co".into(),
        sender_agent: AgentKind::Claude,
        sender_access: access,
        sender_project: None,
        product: "HB Code".into(),
    }
}

fn set_access(b: &mut Bench, session: &str, access: Option<AccessLevel>) {
    let mut info = SessionInfo::new(Capabilities::codex());
    info.access = access;
    b.c.set_session(&s(session), info);
}

// OB-16: an idle recipient gets enqueue + queue at the back; the route is written with
// the entry; the message starts a run.
#[test]
fn an_idle_recipient_queues_the_message_and_a_run_starts() {
    let mut b = Bench::codex(&["a", "b"]);
    let r =
        b.c.send_session_message(
            call("a", Some("b"), "call-1", AccessLevel::WorkspaceWrite),
            b.now,
        )
        .unwrap();
    assert_eq!(r, ToolResult::Queued);
    let sent = b.c.poll_effect();
    let Some(CustodyEffect::Send(req)) = sent else {
        panic!("{sent:?}")
    };
    assert!(req.operation_id.as_str().starts_with("session-message-"));
    assert!(matches!(req.kind, SendKind::Start { .. }));
    assert!(req.request.agent_text().starts_with(&first_line("HB Code")));
    assert_eq!(req.request.user_text, "Please run the Android build.");
    let route = b.c.store().route(&req.operation_id).unwrap().unwrap();
    assert_eq!(
        (
            route.sender_session_id.as_str(),
            route.sender_call_id.as_str(),
            route.hop,
            route.delivery
        ),
        ("a", "call-1", 1, RouteDelivery::Sent)
    );
    let entry = b.entries("b").into_iter().next().unwrap();
    assert_eq!(entry.controls, Controls::enqueue());
    assert_eq!(entry.queue_id.as_str(), entry.operation_id.as_str());
}

// OB-16: a running recipient with no hold gets automatic + steer-running with its run.
#[test]
fn a_running_recipient_gets_a_steer_for_its_run() {
    let mut b = Bench::codex(&["a", "b"]);
    b.agent.default = WhenUnscripted::Accept;
    b.submit("b", "run", Controls::automatic());
    let run = b.active_run("b").unwrap();
    let r =
        b.c.send_session_message(
            call("a", Some("b"), "call-1", AccessLevel::WorkspaceWrite),
            b.now,
        )
        .unwrap();
    assert_eq!(r, ToolResult::Queued);
    b.drive();
    let last = b.agent.sends.last().unwrap();
    assert_eq!(last.kind, SendKind::Steer { run: run.clone() });
    let e = b
        .entries("b")
        .into_iter()
        .find(|e| e.session_message.is_some())
        .unwrap();
    assert_eq!(
        (
            e.controls.intent,
            e.controls.send_mode,
            e.controls.expected_active_run_id.clone()
        ),
        (Intent::Automatic, SendMode::SteerRunning, Some(run.clone()))
    );
    assert_eq!(
        b.c.runs().active(&s("b")).unwrap().last_session_message,
        Some(e.operation_id.clone())
    );
}

// OB-16: the hold rule across the four access levels; a held message waits for
// approval, and sending it from the queue approves it.
#[test]
fn a_recipient_with_higher_access_holds_the_message_until_approved() {
    let levels = [
        AccessLevel::ReadOnly,
        AccessLevel::WorkspaceWrite,
        AccessLevel::FullAccess,
        AccessLevel::Unrestricted,
    ];
    for sender in levels {
        for recipient in levels {
            let mut b = Bench::codex(&["a", "b"]);
            set_access(&mut b, "b", Some(recipient));
            let r =
                b.c.send_session_message(call("a", Some("b"), "c", sender), b.now)
                    .unwrap();
            b.drive();
            if recipient > sender {
                let ToolResult::WaitingForApproval { reason } = &r else {
                    panic!("{sender:?} -> {recipient:?}: {r:?}")
                };
                assert!(reason.contains(recipient.as_str()) && reason.contains(sender.as_str()));
                assert!(b.agent.sends.is_empty());
                let e = b.entries("b").remove(0);
                assert!(!e.state.auto_drain());
                let route = b.c.store().route(&e.operation_id).unwrap().unwrap();
                assert_eq!(route.delivery, RouteDelivery::NeedsApproval);
                // The user sends it from the queue: approved, no hold rule applies.
                b.c.send_now(&s("b"), &e.queue_id, b.now).unwrap();
                b.drive();
                assert_eq!(b.agent.sends.len(), 1);
                assert!(b.notes.iter().any(|n| matches!(
                    n,
                    CustodyEffect::RouteDeliveryChanged {
                        delivery: RouteDelivery::Sent,
                        ..
                    }
                )));
            } else {
                assert_eq!(r, ToolResult::Queued, "{sender:?} -> {recipient:?}");
                assert_eq!(b.agent.sends.len(), 1);
            }
        }
    }
}

// OB-16: a recipient whose level cannot be confirmed holds; the running turn's level
// counts when it runs; the rule is checked again before each drain.
#[test]
fn unconfirmed_access_holds_and_the_rule_is_checked_again_before_draining() {
    let mut b = Bench::codex(&["a", "b"]);
    set_access(&mut b, "b", None);
    let r =
        b.c.send_session_message(call("a", Some("b"), "c1", AccessLevel::Unrestricted), b.now)
            .unwrap();
    assert_eq!(
        r,
        ToolResult::WaitingForApproval {
            reason: ACCESS_UNCONFIRMED_REASON.into()
        }
    );

    // Saved with no hold while the recipient's run is being stopped (nothing drains);
    // the recipient raises its level; the check before the drain holds it.
    let mut b = Bench::codex(&["a", "b"]);
    b.agent.default = WhenUnscripted::Accept;
    set_access(&mut b, "b", Some(AccessLevel::ReadOnly));
    b.submit("b", "run", Controls::automatic());
    let run = b.active_run("b").unwrap();
    b.c.stop(&s("b"), &run, None, b.now);
    let Some(CustodyEffect::Stop(StopRequest { attempt, .. })) = b.c.poll_effect() else {
        panic!()
    };
    let r =
        b.c.send_session_message(call("a", Some("b"), "c2", AccessLevel::ReadOnly), b.now)
            .unwrap();
    assert_eq!(r, ToolResult::Queued);
    assert!(
        b.c.poll_effect().is_none(),
        "a pending cancellation drains nothing"
    );
    set_access(&mut b, "b", Some(AccessLevel::FullAccess));
    let sends = b.agent.sends.len();
    b.c.handle_stop_result(
        attempt,
        outbox_core::adapter::StopResult::Stopped { untaken: vec![] },
        b.now,
    );
    b.drive();
    let e = b
        .entries("b")
        .into_iter()
        .find(|e| e.session_message.is_some())
        .unwrap();
    assert!(
        !e.state.auto_drain() && e.state.hold_reason().is_some(),
        "held at drain time"
    );
    assert_eq!(b.agent.sends.len(), sends, "not sent");
    assert_eq!(
        b.c.store()
            .route(&e.operation_id)
            .unwrap()
            .unwrap()
            .delivery,
        RouteDelivery::NeedsApproval
    );
}

// OB-16: repeats, another recipient, the sender's own session, no session.
#[test]
fn tool_results_for_repeats_and_bad_recipients() {
    let mut b = Bench::codex(&["a", "a::skills-agent", "b", "c"]);
    assert_eq!(
        b.c.send_session_message(
            call("a", Some("b"), "c1", AccessLevel::WorkspaceWrite),
            b.now
        )
        .unwrap(),
        ToolResult::Queued
    );
    assert_eq!(
        b.c.send_session_message(
            call("a", Some("b"), "c1", AccessLevel::WorkspaceWrite),
            b.now
        )
        .unwrap(),
        ToolResult::AlreadySent
    );
    assert_eq!(
        b.c.send_session_message(
            call("a", Some("c"), "c1", AccessLevel::WorkspaceWrite),
            b.now
        )
        .unwrap(),
        ToolResult::Error {
            message: ONE_SEND_PER_CALL_TEXT.into()
        }
    );
    assert_eq!(
        b.c.send_session_message(
            call(
                "a",
                Some("a::skills-agent"),
                "c2",
                AccessLevel::WorkspaceWrite
            ),
            b.now
        )
        .unwrap(),
        ToolResult::Error {
            message: OWN_SESSION_TEXT.into()
        }
    );
    assert_eq!(
        b.c.send_session_message(call("a", None, "c3", AccessLevel::WorkspaceWrite), b.now)
            .unwrap(),
        ToolResult::Error {
            message: UNKNOWN_SESSION_TEXT.into()
        }
    );
    assert_eq!(
        b.c.send_session_message(
            call("a", Some("nobody"), "c4", AccessLevel::WorkspaceWrite),
            b.now
        )
        .unwrap(),
        ToolResult::Error {
            message: UNKNOWN_SESSION_TEXT.into()
        }
    );
    b.drive();
    assert_eq!(b.agent.sends.len(), 1, "one message for one call");
}

// OB-16: the answer continues the exchange with hop + 1; any other run starts hop 1.
#[test]
fn an_answer_from_a_run_the_message_started_is_the_next_hop() {
    let mut b = Bench::codex(&["a", "b"]);
    b.agent.default = WhenUnscripted::Accept;
    b.c.send_session_message(
        call("a", Some("b"), "c1", AccessLevel::WorkspaceWrite),
        b.now,
    )
    .unwrap();
    b.drive();
    let run_b = b.active_run("b").unwrap();
    let first = b.entries("b").remove(0);
    let chain = first.session_message.clone().unwrap().chain_id;
    let mut answer = call("b", Some("a"), "c9", AccessLevel::WorkspaceWrite);
    answer.sender_run = Some(run_b);
    b.c.send_session_message(answer, b.now).unwrap();
    let reply = b.entries("a").remove(0);
    let origin = reply.session_message.unwrap();
    assert_eq!((origin.chain_id.clone(), origin.hop), (chain.clone(), 2));
    // A message from a run nobody messaged starts a new exchange.
    let fresh = call("b", Some("a"), "c10", AccessLevel::WorkspaceWrite);
    b.c.send_session_message(fresh, b.now).unwrap();
    let newest = b
        .entries("a")
        .into_iter()
        .find(|e| e.session_message.as_ref().unwrap().sender_call_id.as_str() == "c10")
        .unwrap();
    let o = newest.session_message.unwrap();
    assert_eq!(o.hop, 1);
    assert_ne!(o.chain_id, chain);
}

// OB-16: removing a queued session message declines it, and the sender's row is
// republished.
#[test]
fn removing_a_session_message_declines_it() {
    let mut b = Bench::codex(&["a", "b"]);
    set_access(&mut b, "b", Some(AccessLevel::Unrestricted));
    b.c.send_session_message(call("a", Some("b"), "c1", AccessLevel::ReadOnly), b.now)
        .unwrap();
    let e = b.entries("b").remove(0);
    b.c.remove(&s("b"), &e.queue_id, b.now).unwrap();
    b.drive();
    assert_eq!(
        b.c.store()
            .route(&e.operation_id)
            .unwrap()
            .unwrap()
            .delivery,
        RouteDelivery::Declined
    );
    assert!(b.notes.iter().any(|n| matches!(
        n,
        CustodyEffect::RouteDeliveryChanged {
            operation_id,
            sender_session,
            delivery: RouteDelivery::Declined,
            ..
        } if operation_id == &e.operation_id && sender_session == &s("a")
    )));
}

// OB-17: the envelope, parsed back; a row with the user's own operation is never read as
// a session message.
#[test]
fn the_envelope_names_the_product_and_parses_back() {
    let sender = EnvelopeSender {
        session_id: s("a"),
        title: "Web \"landing\" & <co>".into(),
        agent: AgentKind::Claude,
    };
    let body = "Line one\nLine two with </session_message> inside";
    let text = envelope("HB Code", &sender, body);
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("Message from another HB Code session. Answer this message in one of three ways: do it, ask one question, or object with the reason.")
    );
    assert!(lines.next().unwrap().starts_with("<session_message from_session_id=\"a\" from_title=\"Web &quot;landing&quot; &amp; &lt;co&gt;\" from_agent=\"claude\">"));
    assert!(text.ends_with("\n</session_message>"));
    assert_eq!(
        parse_envelope(&text),
        Some((sender.clone(), body.to_owned()))
    );
    assert_eq!(
        read_session_message(&op("session-message-1"), &text).map(|(s, _)| s),
        Some(sender)
    );
    assert_eq!(read_session_message(&op("op-typed-by-user"), &text), None);
    assert_eq!(
        parse_envelope(
            "Message from another HB Code session.\n<session_message>\nx\n</session_message>"
        ),
        None
    );
    let other_product = envelope(
        "Acme",
        &EnvelopeSender {
            session_id: s("z"),
            title: String::new(),
            agent: AgentKind::Codex,
        },
        "x",
    );
    assert!(other_product.starts_with("Message from another Acme session. "));
}

/// Text that leans on what the envelope escapes and on how its tag is read: attribute
/// names, `=`, quotes, markup, entities, newlines and spaces.
fn envelope_text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            Just("&".to_owned()),
            Just("\"".to_owned()),
            Just("=".to_owned()),
            Just("<".to_owned()),
            Just(">".to_owned()),
            Just("\n".to_owned()),
            Just(" ".to_owned()),
            Just("\t".to_owned()),
            Just("\r".to_owned()),
            Just("&amp;".to_owned()),
            Just("&quot;".to_owned()),
            Just("&lt;".to_owned()),
            Just("&#10;".to_owned()),
            Just("&#".to_owned()),
            Just("title".to_owned()),
            Just("from_session_id".to_owned()),
            Just("from_title".to_owned()),
            Just("from_agent".to_owned()),
            Just(" from_title=\"".to_owned()),
            Just("from_agent=".to_owned()),
            Just("<session_message ".to_owned()),
            Just("</session_message>".to_owned()),
            Just("\n</session_message>".to_owned()),
            Just("claude".to_owned()),
            any::<char>().prop_map(String::from),
        ],
        0..12,
    )
    .prop_map(|parts| parts.concat())
}

fn sender(session: &str, title: &str, agent: AgentKind) -> EnvelopeSender {
    EnvelopeSender {
        session_id: s(session),
        title: title.to_owned(),
        agent,
    }
}

/// The envelope of the two-sender test with its tag line replaced by `tag`.
fn with_tag(tag: &str) -> String {
    format!("{}\n{tag}\nbody\n</session_message>", first_line("HB Code"))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fixtures::proptest_cases()))]

    // OB-17: every sender and body parses back exactly as it went in, whatever attribute
    // names, quotes, entities or line breaks they hold.
    #[test]
    fn any_envelope_parses_back(
        session in envelope_text().prop_filter("not blank", |s| !s.trim().is_empty()),
        title in envelope_text(),
        claude in any::<bool>(),
        body in envelope_text(),
        product in prop_oneof![Just("HB Code".to_owned()), envelope_text()],
    ) {
        let agent = if claude { AgentKind::Claude } else { AgentKind::Codex };
        let sender = sender(&session, &title, agent);
        let text = envelope(&product, &sender, &body);
        prop_assert!(text.starts_with(&first_line(&product)));
        prop_assert_eq!(decode_envelope(&text), Ok((sender.clone(), body.clone())));
        prop_assert_eq!(parse_envelope(&text), Some((sender, body)));
    }
}

// OB-17: a sender title that ends in another attribute's name (and `=`) is read as the
// title, not as that attribute. Finding attributes by their first `name="` read the
// agent from inside the title and refused the envelope.
#[test]
fn a_title_ending_in_an_attribute_name_parses_back() {
    for title in [
        "x from_agent=",
        "x from_session_id=",
        "x from_title=",
        "abc title",
    ] {
        let sender = sender("a", title, AgentKind::Codex);
        let text = envelope("HB Code", &sender, "body");
        assert_eq!(
            decode_envelope(&text),
            Ok((sender, "body".to_owned())),
            "{title}"
        );
    }
}

// OB-17: a session ID that ends in another attribute's name is read as the session ID,
// and the title after it keeps its own value. Finding attributes by their first
// `name="` read the title from inside the session ID.
#[test]
fn a_session_id_ending_in_an_attribute_name_parses_back() {
    for session in [
        "abc title",
        "x from_title=",
        "x from_agent=",
        "from_session_id=",
    ] {
        let sender = sender(session, "Real title", AgentKind::Claude);
        let text = envelope("HB Code", &sender, "body");
        assert_eq!(
            parse_envelope(&text),
            Some((sender, "body".to_owned())),
            "{session}"
        );
    }
}

// OB-17: the written bytes are the seed's: the first sentence, the tag with
// from_session_id, from_title and from_agent in that order, the body, the closing tag.
#[test]
fn the_envelope_bytes_follow_the_seed() {
    let text = envelope(
        "HB Code",
        &sender("s-1", "a \"b\" & <c>\nd", AgentKind::Codex),
        "Hello\nworld",
    );
    assert_eq!(
        text,
        "Message from another HB Code session. Answer this message in one of three ways: do it, ask one question, or object with the reason.\n\
         <session_message from_session_id=\"s-1\" from_title=\"a &quot;b&quot; &amp; &lt;c&gt;&#10;d\" from_agent=\"codex\">\n\
         Hello\nworld\n\
         </session_message>"
    );
}

// OB-17: the tag is read by a tokenizer; every way the tag line can be wrong is its own
// typed error, and attributes in another order or with more whitespace still read.
#[test]
fn a_malformed_tag_is_a_typed_error() {
    let ok = "from_session_id=\"a\" from_title=\"t\" from_agent=\"codex\"";
    assert_eq!(
        decode_envelope(&with_tag(&format!("<session_message {ok}>"))),
        Ok((sender("a", "t", AgentKind::Codex), "body".to_owned()))
    );
    assert_eq!(
        decode_envelope(&with_tag(
            "<session_message\tfrom_agent=\"codex\"  from_title=\"t\" from_session_id=\"a\" >"
        )),
        Ok((sender("a", "t", AgentKind::Codex), "body".to_owned()))
    );
    let cases: &[(&str, EnvelopeError)] = &[
        (
            "<session_message from_session_id=\"a\" from_title=\"t\" from_agent=\"codex\" from_x=\"1\">",
            EnvelopeError::UnknownAttribute { name: "from_x".into() },
        ),
        (
            "<session_message from_session_id=\"a\" from_title=\"t\" from_title=\"u\" from_agent=\"codex\">",
            EnvelopeError::DuplicateAttribute { name: "from_title" },
        ),
        (
            "<session_message from_session_id=\"a\" from_agent=\"codex\">",
            EnvelopeError::MissingAttribute { name: "from_title" },
        ),
        (
            "<session_message>",
            EnvelopeError::MissingAttribute { name: "from_session_id" },
        ),
        (
            "<session_message from_session_id=\"a\" from_title=\"t\" from_agent=\"gemini\">",
            EnvelopeError::UnknownAgent { value: "gemini".into() },
        ),
        (
            "<session_message from_session_id=\" \" from_title=\"t\" from_agent=\"codex\">",
            EnvelopeError::BlankSessionId,
        ),
        (
            "<session_messages from_session_id=\"a\" from_title=\"t\" from_agent=\"codex\">",
            EnvelopeError::UnknownTag { name: "session_messages".into() },
        ),
        (
            "<session_message from_session_id=\"a\"from_title=\"t\" from_agent=\"codex\">",
            EnvelopeError::Syntax { at: 36, expected: "whitespace or '>'" },
        ),
        (
            "<session_message from_session_id=a from_title=\"t\" from_agent=\"codex\">",
            EnvelopeError::Syntax { at: 33, expected: "'\"' opening the attribute value" },
        ),
        (
            "<session_message from_session_id=\"a\" from_title=\"t\" from_agent=\"codex\"",
            EnvelopeError::Syntax { at: 70, expected: "whitespace or '>'" },
        ),
        (
            "<session_message from_session_id=\"a\" from_title=\"t\" from_agent=\"codex\">x",
            EnvelopeError::Syntax { at: 71, expected: "the end of the tag line after '>'" },
        ),
        (
            "<session_message from_session_id=\"a\" from_title=\"t&x\" from_agent=\"codex\">",
            EnvelopeError::Escape { at: 50 },
        ),
        (
            "<session_message from_session_id=\"a\" from_title=\"t<\" from_agent=\"codex\">",
            EnvelopeError::Escape { at: 50 },
        ),
    ];
    for (tag, error) in cases {
        assert_eq!(
            decode_envelope(&with_tag(tag)).as_ref(),
            Err(error),
            "{tag}"
        );
        assert_eq!(parse_envelope(&with_tag(tag)), None, "{tag}");
    }
    // Not laid out as an envelope at all.
    assert_eq!(
        decode_envelope("Hello"),
        Err(EnvelopeError::Layout {
            missing: "the first sentence"
        })
    );
    assert_eq!(
        decode_envelope(&format!(
            "{}\n<session_message {ok}>",
            first_line("HB Code")
        )),
        Err(EnvelopeError::Layout {
            missing: "the tag line"
        })
    );
    assert_eq!(
        decode_envelope(&format!(
            "{}\n<session_message {ok}>\nbody\n</session_message>\n",
            first_line("HB Code")
        )),
        Err(EnvelopeError::Layout {
            missing: "the closing tag"
        })
    );
}

// OB-17: a message the host created from another session is read back as one from its
// own operation and prompt: the sender and the body, exactly.
#[test]
fn a_saved_session_message_reads_back_as_one() {
    let mut b = Bench::codex(&["a", "b"]);
    b.agent.default = WhenUnscripted::Accept;
    b.c.send_session_message(call("a", Some("b"), "c1", AccessLevel::FullAccess), b.now)
        .unwrap();
    let entries = b.entries("b");
    let [e] = entries.as_slice() else {
        panic!("one queued message: {entries:?}")
    };
    let prompt = e.request.prompt_text.as_deref().expect("the envelope");
    let (sender, body) = read_session_message(&e.operation_id, prompt).expect("a session message");
    assert_eq!(sender.session_id, s("a"));
    assert_eq!(sender.title, "Web \"landing\" & co");
    assert_eq!(body, "Please run the Android build.");
}

// OB-18: titles.
#[test]
fn titles_follow_the_seed() {
    assert_eq!(
        provisional_title("\n   \n  Fix the flaky login test on CI please\nmore"),
        "Fix the flaky login"
    );
    assert_eq!(provisional_title("  \n\t\n"), FRESH_CHAT);
    assert_eq!(provisional_title("Hi"), "Hi");
    assert_eq!(
        final_title("  Android   landing page "),
        Ok("Android landing page".into())
    );
    assert_eq!(final_title("Landing"), Err(TitleError::WordCount));
    assert_eq!(
        final_title("one two three four five"),
        Err(TitleError::WordCount)
    );
    let at_limit = "abcdefghijklmnop qrstuvwxyzabcdefghi"; // 36 characters
    assert_eq!(at_limit.chars().count(), 36);
    assert!(final_title(at_limit).is_ok());
    assert_eq!(
        final_title(&format!("{at_limit}j")),
        Err(TitleError::TooLong)
    );
    assert!(
        final_title("éééééééééééééééééé ééééééééééééééééé").is_ok(),
        "characters, not bytes"
    );
    let mut g = TitleGenerations::new();
    assert!(g.begin(&s("a")));
    assert!(!g.begin(&s("a")), "one generation per session at a time");
    assert!(g.begin(&s("b")));
    assert_eq!(
        g.finish(&s("a"), "Fix the flaky login", Err("model down".into())),
        "Fix the flaky login"
    );
    assert_eq!(
        g.finish(&s("b"), "x", Ok("Flaky login fix".into())),
        "Flaky login fix"
    );
    assert_eq!(
        g.finish(
            &s("b"),
            "Provisional one",
            Ok("Way too long a title for this".into())
        ),
        "Provisional one"
    );
    assert!(g.begin(&s("a")));
}

// OB-18: a placeholder only; a session started by a session message is named from the
// body, not the envelope.
#[test]
fn the_first_title_replaces_a_placeholder_and_uses_a_session_messages_body() {
    let mut b = Bench::codex(&["a", "b"]);
    b.c.send_session_message(
        call("a", Some("b"), "c1", AccessLevel::WorkspaceWrite),
        b.now,
    )
    .unwrap();
    let first = b.entries("b").remove(0);
    assert_eq!(
        title_after_first_message("", &first),
        "Please run the Android"
    );
    assert_eq!(
        title_after_first_message("My own title", &first),
        "My own title"
    );
}

// OB-17: the prefix custody gives a session message's operation is the one the reader
// of saved rows asks for, so the message the agent got reads back as a session message
// with its sender, and the same text under one of the user's own operation IDs never
// does.
#[test]
fn the_session_message_prefix_is_shared() {
    use outbox_core::session_message::SESSION_MESSAGE_PREFIX;
    let mut b = Bench::codex(&["a", "b"]);
    b.c.send_session_message(
        call("a", Some("b"), "call-1", AccessLevel::WorkspaceWrite),
        b.now,
    )
    .unwrap();
    let Some(CustodyEffect::Send(req)) = b.c.poll_effect() else {
        panic!("sent")
    };
    assert!(req
        .operation_id
        .as_str()
        .starts_with(SESSION_MESSAGE_PREFIX));
    let text = req.request.agent_text();
    let (sender, body) = read_session_message(&req.operation_id, text).expect("read back");
    assert_eq!(sender.session_id, s("a"));
    assert_eq!(body, "Please run the Android build.");
    let own = op(req
        .operation_id
        .as_str()
        .trim_start_matches(SESSION_MESSAGE_PREFIX));
    assert_eq!(read_session_message(&own, text), None);
}
