//! The session-message envelope (OB-17): what the receiving agent reads, and the codec
//! that reads the sender back.
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
//!
//! Invariant: [`decode_envelope`] gives back exactly the sender and body that
//! [`envelope`] wrote, for every session ID, title and body. Attribute values are escaped
//! (`&amp;`, `&quot;`, `&lt;`, `&gt;`, `&#10;`), so a value never holds a quote, a
//! bracket or a line break, and the tag line is read by a tokenizer (the tag name, then
//! `name="value"` attributes separated by whitespace), never by searching the line for
//! an attribute's name. An unknown, repeated or missing attribute, or a value the writer
//! could not have written, is a typed [`EnvelopeError`]. The body is written as is: it is
//! everything between the tag line and the final `\n</session_message>`.
//!
//! This module is a leaf of the crate's message side: it depends on the identities and
//! [`AgentKind`] only, never on `custody` or `session_message`.
//!
//! ```
//! use outbox_core::adapter::AgentKind;
//! use outbox_core::envelope::{decode_envelope, envelope, EnvelopeSender};
//! use outbox_core::ids::SessionId;
//!
//! let sender = EnvelopeSender {
//!     session_id: SessionId::new("abc from_title=").unwrap(),
//!     title: "x from_session_id=\"y\"".into(),
//!     agent: AgentKind::Codex,
//! };
//! let text = envelope("HB Code", &sender, "Run the build.");
//! assert_eq!(decode_envelope(&text), Ok((sender, "Run the build.".to_owned())));
//! ```

use crate::adapter::AgentKind;
use crate::ids::{OperationId, SessionId};

/// The prefix of session-message operation and queue IDs: only a row whose operation ID
/// starts with it is read as a session message.
pub const SESSION_MESSAGE_PREFIX: &str = "session-message-";
/// The answer rule of the first line.
pub const ANSWER_RULE: &str =
    "Answer this message in one of three ways: do it, ask one question, or object with the reason.";
/// The name of the envelope's tag.
pub const TAG_NAME: &str = "session_message";

const FIRST_LINE_START: &str = "Message from another ";
const CLOSE: &str = "</session_message>";
const SESSION_ID_ATTRIBUTE: &str = "from_session_id";
const TITLE_ATTRIBUTE: &str = "from_title";
const AGENT_ATTRIBUTE: &str = "from_agent";

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

/// Why a text is not an envelope the host wrote.
///
/// Two groups, by what the reader does: [`EnvelopeError::Layout`] means the text is not
/// laid out as an envelope at all (read it as an ordinary message); every other variant
/// means the text has the envelope's layout but its tag line is malformed (the saved
/// text was changed after the host wrote it; it names no sender). Byte offsets count from
/// the start of the tag line.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EnvelopeError {
    /// The first sentence, the tag line or the closing tag is missing.
    #[error("not a session-message envelope: {missing} is missing")]
    Layout {
        /// The missing part.
        missing: &'static str,
    },
    /// The tag line does not follow `<session_message name="value" ...>`.
    #[error("malformed session_message tag at byte {at}: expected {expected}")]
    Syntax {
        /// The byte offset in the text where it was found.
        at: usize,
        /// What the tokenizer expected there.
        expected: &'static str,
    },
    /// The tag line opens another tag.
    #[error("the envelope tag is {name:?}, not session_message")]
    UnknownTag {
        /// The tag name found.
        name: String,
    },
    /// An attribute the envelope does not write.
    #[error("unknown session_message attribute {name:?}")]
    UnknownAttribute {
        /// Its name.
        name: String,
    },
    /// An attribute given twice.
    #[error("session_message attribute {name} appears twice")]
    DuplicateAttribute {
        /// Its name.
        name: &'static str,
    },
    /// An attribute the envelope always writes is absent.
    #[error("session_message attribute {name} is missing")]
    MissingAttribute {
        /// Its name.
        name: &'static str,
    },
    /// A value holds a character the envelope always escapes, or an `&` that starts no
    /// entity the envelope writes.
    #[error("bad escape in a session_message attribute at byte {at}")]
    Escape {
        /// The byte offset in the text where it was found.
        at: usize,
    },
    /// `from_agent` names no known agent.
    #[error("unknown agent {value:?} in session_message")]
    UnknownAgent {
        /// The value found.
        value: String,
    },
    /// `from_session_id` is blank.
    #[error("session_message from_session_id is blank")]
    BlankSessionId,
}

fn agent_name(a: AgentKind) -> &'static str {
    match a {
        AgentKind::Codex => "codex",
        AgentKind::Claude => "claude",
        AgentKind::Acp => "acp",
    }
}

/// The entities the envelope writes, and the character each stands for.
const ENTITIES: [(&str, char); 5] = [
    ("&amp;", '&'),
    ("&quot;", '"'),
    ("&lt;", '<'),
    ("&gt;", '>'),
    ("&#10;", '\n'),
];

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match ENTITIES.iter().find(|(_, raw)| *raw == c) {
            Some((entity, _)) => out.push_str(entity),
            None => out.push(c),
        }
    }
    out
}

/// The value behind escaped text `raw` that starts at byte `offset` of the tag line.
/// Accepts exactly what [`escape`] writes, so `unescape(escape(v)) == v` and nothing
/// else decodes to `v`.
fn unescape(raw: &str, offset: usize) -> Result<String, EnvelopeError> {
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(c) = rest.chars().next() {
        let at = offset + (raw.len() - rest.len());
        match c {
            '&' => {
                let (entity, value) = ENTITIES
                    .iter()
                    .find(|(entity, _)| rest.starts_with(entity))
                    .ok_or(EnvelopeError::Escape { at })?;
                out.push(*value);
                rest = rest.get(entity.len()..).unwrap_or_default();
            }
            '"' | '<' | '>' | '\n' => return Err(EnvelopeError::Escape { at }),
            _ => {
                out.push(c);
                rest = rest.get(c.len_utf8()..).unwrap_or_default();
            }
        }
    }
    Ok(out)
}

/// The first line for `product` ("Message from another HB Code session. Answer ...").
pub fn first_line(product: &str) -> String {
    format!("{FIRST_LINE_START}{product} session. {ANSWER_RULE}")
}

/// Builds the envelope.
pub fn envelope(product: &str, sender: &EnvelopeSender, body: &str) -> String {
    format!(
        "{}\n<{TAG_NAME} {SESSION_ID_ATTRIBUTE}=\"{}\" {TITLE_ATTRIBUTE}=\"{}\" {AGENT_ATTRIBUTE}=\"{}\">\n{body}\n{CLOSE}",
        first_line(product),
        escape(sender.session_id.as_str()),
        escape(&sender.title),
        agent_name(sender.agent),
    )
}

/// A tokenizer over one tag line.
struct Tokens<'a> {
    line: &'a str,
    at: usize,
}

impl<'a> Tokens<'a> {
    fn rest(&self) -> &'a str {
        self.line.get(self.at..).unwrap_or_default()
    }

    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.at += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: char, expected: &'static str) -> Result<(), EnvelopeError> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(EnvelopeError::Syntax {
                at: self.at,
                expected,
            })
        }
    }

    /// The longest run at the cursor whose characters satisfy `keep`, consumed.
    fn take_while(&mut self, keep: impl Fn(char) -> bool) -> (usize, &'a str) {
        let start = self.at;
        let rest = self.rest();
        let len = rest.find(|c: char| !keep(c)).unwrap_or(rest.len());
        self.at += len;
        (start, rest.get(..len).unwrap_or_default())
    }
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | ':' | '.')
}

fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t')
}

/// The three attributes of a tag line, each read once.
#[derive(Default)]
struct Attributes {
    session_id: Option<String>,
    title: Option<String>,
    agent: Option<String>,
}

impl Attributes {
    fn set(&mut self, name: &str, value: String) -> Result<(), EnvelopeError> {
        let (slot, name) = match name {
            SESSION_ID_ATTRIBUTE => (&mut self.session_id, SESSION_ID_ATTRIBUTE),
            TITLE_ATTRIBUTE => (&mut self.title, TITLE_ATTRIBUTE),
            AGENT_ATTRIBUTE => (&mut self.agent, AGENT_ATTRIBUTE),
            other => {
                return Err(EnvelopeError::UnknownAttribute {
                    name: other.to_owned(),
                })
            }
        };
        if slot.is_some() {
            return Err(EnvelopeError::DuplicateAttribute { name });
        }
        *slot = Some(value);
        Ok(())
    }

    fn sender(self) -> Result<EnvelopeSender, EnvelopeError> {
        let missing = |name| EnvelopeError::MissingAttribute { name };
        let session_id = self.session_id.ok_or(missing(SESSION_ID_ATTRIBUTE))?;
        let title = self.title.ok_or(missing(TITLE_ATTRIBUTE))?;
        let agent = self.agent.ok_or(missing(AGENT_ATTRIBUTE))?;
        let agent = match agent.as_str() {
            "codex" => AgentKind::Codex,
            "claude" => AgentKind::Claude,
            "acp" => AgentKind::Acp,
            _ => return Err(EnvelopeError::UnknownAgent { value: agent }),
        };
        Ok(EnvelopeSender {
            session_id: SessionId::new(session_id).map_err(|_| EnvelopeError::BlankSessionId)?,
            title,
            agent,
        })
    }
}

/// Reads the tag line `<session_message name="value" ...>`: the tag name, then the
/// attributes one after another (each once, in any order, each after whitespace), then
/// `>` and the end of the line.
fn read_tag(line: &str) -> Result<EnvelopeSender, EnvelopeError> {
    let mut tokens = Tokens { line, at: 0 };
    tokens.expect('<', "'<'")?;
    let (_, name) = tokens.take_while(is_name_char);
    if name != TAG_NAME {
        return Err(EnvelopeError::UnknownTag {
            name: name.to_owned(),
        });
    }
    let mut attributes = Attributes::default();
    loop {
        let (_, space) = tokens.take_while(is_space);
        if tokens.eat('>') {
            break;
        }
        if space.is_empty() {
            return Err(EnvelopeError::Syntax {
                at: tokens.at,
                expected: "whitespace or '>'",
            });
        }
        let (at, name) = tokens.take_while(is_name_char);
        if name.is_empty() {
            return Err(EnvelopeError::Syntax {
                at,
                expected: "an attribute name or '>'",
            });
        }
        tokens.expect('=', "'=' after the attribute name")?;
        tokens.expect('"', "'\"' opening the attribute value")?;
        let (value_at, raw) = tokens.take_while(|c| c != '"');
        tokens.expect('"', "'\"' closing the attribute value")?;
        attributes.set(name, unescape(raw, value_at)?)?;
    }
    if tokens.at != line.len() {
        return Err(EnvelopeError::Syntax {
            at: tokens.at,
            expected: "the end of the tag line after '>'",
        });
    }
    attributes.sender()
}

/// Decodes an envelope into its sender and body, with a typed error for a text the
/// envelope writer could not have written.
pub fn decode_envelope(text: &str) -> Result<(EnvelopeSender, String), EnvelopeError> {
    let layout = |missing| EnvelopeError::Layout { missing };
    // The first line ends at the answer rule: a product name can hold any text but that
    // sentence, so the line is found even when the name holds a line break.
    let first_end = format!(" session. {ANSWER_RULE}\n");
    let after_first = text
        .strip_prefix(FIRST_LINE_START)
        .and_then(|rest| rest.split_once(first_end.as_str()))
        .map(|(_product, rest)| rest)
        .ok_or(layout("the first sentence"))?;
    let (tag, rest) = after_first.split_once('\n').ok_or(layout("the tag line"))?;
    let body = rest
        .strip_suffix(CLOSE)
        .and_then(|rest| rest.strip_suffix('\n'))
        .ok_or(layout("the closing tag"))?;
    let sender = read_tag(tag)?;
    Ok((sender, body.to_owned()))
}

/// Parses an envelope back into its sender and body; `None` for any text
/// [`decode_envelope`] refuses.
pub fn parse_envelope(text: &str) -> Option<(EnvelopeSender, String)> {
    decode_envelope(text).ok()
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

#[cfg(test)]
mod tests {
    use super::*;

    // OB-17: the escape is a bijection onto the values the tokenizer accepts.
    #[test]
    fn unescape_reads_exactly_what_escape_writes() {
        let value = "a&b\"c<d>e\nf &amp; &#10; é";
        assert_eq!(unescape(&escape(value), 0), Ok(value.to_owned()));
        for (raw, at) in [("&", 0), ("x&amp", 1), ("&#13;", 0), ("<", 0), ("a>", 1)] {
            assert_eq!(unescape(raw, 0), Err(EnvelopeError::Escape { at }), "{raw}");
        }
    }
}
