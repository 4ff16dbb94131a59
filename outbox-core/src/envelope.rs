//! The session-message envelope (OB-17): what the receiving agent reads.
//!
//! ```text
//! Message from another <Product> session. Answer this message in one of three ways: do it, ask one question, or object with the reason.
//! <session_message from_session_id="..." from_title="..." from_agent="...">
//! <body>
//! </session_message>
//! ```
//!
//! The plain first sentence exists because Claude's saved-session index skips a first
//! message that starts with a tag. The product name comes from the host. The timeline
//! reads the sender back from the saved text ([`read_session_message`]), but only for an
//! operation the host created as a session message: an envelope a user typed names no
//! sender.

use crate::adapter::AgentKind;
use crate::ids::{OperationId, SessionId};
use crate::session_message::SESSION_MESSAGE_PREFIX;

/// The answer rule of the first line.
pub const ANSWER_RULE: &str =
    "Answer this message in one of three ways: do it, ask one question, or object with the reason.";
const OPEN: &str = "<session_message ";
const CLOSE: &str = "</session_message>";

/// Who sent a session message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvelopeSender {
    /// The sending session.
    pub session_id: SessionId,
    /// Its title.
    pub title: String,
    /// Its agent.
    pub agent: AgentKind,
}

fn agent_name(a: AgentKind) -> &'static str {
    match a {
        AgentKind::Codex => "codex",
        AgentKind::Claude => "claude",
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('"', "&quot;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('\n', "&#10;")
}

fn unescape(s: &str) -> String {
    s.replace("&#10;", "\n")
        .replace("&gt;", ">")
        .replace("&lt;", "<")
        .replace("&quot;", "\"")
        .replace("&amp;", "&")
}

/// The first line for `product` ("Message from another HB Code session. Answer ...").
pub fn first_line(product: &str) -> String {
    format!("Message from another {product} session. {ANSWER_RULE}")
}

/// Builds the envelope.
pub fn envelope(product: &str, sender: &EnvelopeSender, body: &str) -> String {
    format!(
        "{}\n{OPEN}from_session_id=\"{}\" from_title=\"{}\" from_agent=\"{}\">\n{body}\n{CLOSE}",
        first_line(product),
        escape(sender.session_id.as_str()),
        escape(&sender.title),
        agent_name(sender.agent),
    )
}

fn attribute(tag: &str, name: &str) -> Option<String> {
    let start = tag.find(&format!("{name}=\""))? + name.len() + 2;
    let len = tag[start..].find('"')?;
    Some(unescape(&tag[start..start + len]))
}

/// Parses an envelope back into its sender and body.
pub fn parse_envelope(text: &str) -> Option<(EnvelopeSender, String)> {
    let (first, rest) = text.split_once('\n')?;
    if !(first.starts_with("Message from another ") && first.ends_with(ANSWER_RULE)) {
        return None;
    }
    let (tag, rest) = rest.split_once('\n')?;
    let tag = tag.strip_prefix(OPEN)?.strip_suffix('>')?;
    let body = rest.strip_suffix(CLOSE)?.strip_suffix('\n')?;
    let agent = match attribute(tag, "from_agent")?.as_str() {
        "codex" => AgentKind::Codex,
        "claude" => AgentKind::Claude,
        _ => return None,
    };
    let sender = EnvelopeSender {
        session_id: SessionId::new(attribute(tag, "from_session_id")?).ok()?,
        title: attribute(tag, "from_title")?,
        agent,
    };
    Some((sender, body.to_owned()))
}

/// Reads a saved user row as a session message: only when its operation is one the host
/// created as a session message; a row with the user's own operation ID never is.
pub fn read_session_message(
    operation_id: &OperationId,
    text: &str,
) -> Option<(EnvelopeSender, String)> {
    if !operation_id.as_str().starts_with(SESSION_MESSAGE_PREFIX) {
        return None;
    }
    parse_envelope(text)
}
