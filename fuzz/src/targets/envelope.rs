//! Target `envelope`: the session-message envelope (OB-17).
//!
//! Checks:
//!
//! - parsing arbitrary text never panics; when it gives a sender and a body, building the
//!   envelope from them parses back to the same sender and body;
//! - a saved row is read as a session message only under an operation the host created
//!   as one, and then exactly as the parser reads it;
//! - building an envelope from arbitrary fields (any product without a line break, any
//!   non-blank session ID, any title and body) and parsing it is the identity.
//!
//! Script: one mode byte; mode 0 reads the rest as the text, mode 1 reads the product,
//! session ID, title and body texts and an agent byte.

use outbox_core::adapter::AgentKind;
use outbox_core::envelope::{
    envelope, first_line, parse_envelope, read_session_message, EnvelopeSender,
};
use outbox_core::ids::{OperationId, SessionId};
use outbox_core::session_message::SESSION_MESSAGE_PREFIX;

use crate::script::{Script, ScriptWriter};

/// The product name the round trips build with.
pub const PRODUCT: &str = "HB Code";

/// Writes a parse script for `text`.
pub fn write_parse(w: &mut ScriptWriter, text: &str) {
    w.byte(0).raw(text);
}

/// Writes a build script.
pub fn write_build(
    w: &mut ScriptWriter,
    product: &str,
    session: &str,
    title: &str,
    body: &str,
    claude: bool,
) {
    w.byte(1)
        .text(product)
        .text(session)
        .text(title)
        .text(body)
        .byte(u8::from(claude));
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let mut s = Script::new(data);
    if s.pick(2) == 0 {
        if let Ok(text) = std::str::from_utf8(s.rest()) {
            parse(text);
        }
        return;
    }
    let product = s.text().replace(['\n'], " ");
    let session = s.text().into_owned();
    let title = s.text().into_owned();
    let body = s.text().into_owned();
    let agent = if s.flag() {
        AgentKind::Claude
    } else {
        AgentKind::Codex
    };
    let Ok(session_id) = SessionId::new(session) else {
        return;
    };
    let sender = EnvelopeSender {
        session_id,
        title,
        agent,
    };
    build(&product, &sender, &body);
}

// OB-17
fn parse(text: &str) {
    let parsed = parse_envelope(text);
    let host_op = OperationId::new(format!("{SESSION_MESSAGE_PREFIX}0001")).expect("not blank");
    let user_op = OperationId::new("op-1").expect("not blank");
    assert_eq!(read_session_message(&host_op, text), parsed);
    assert_eq!(
        read_session_message(&user_op, text),
        None,
        "a row with the user's own operation was read as a session message"
    );
    if let Some((sender, body)) = parsed {
        let again = envelope(PRODUCT, &sender, &body);
        assert_eq!(
            parse_envelope(&again),
            Some((sender, body)),
            "encode(parse(x)) does not parse back to the same value"
        );
    }
}

// OB-17
fn build(product: &str, sender: &EnvelopeSender, body: &str) {
    let text = envelope(product, sender, body);
    assert!(text.starts_with(&first_line(product)));
    assert_eq!(
        parse_envelope(&text),
        Some((sender.clone(), body.to_owned())),
        "encode then parse is not the identity"
    );
}
