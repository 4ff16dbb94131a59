//! Message content as both Claude formats carry it (the stream-json wire and the
//! transcript): a plain string or a list of content blocks, each typed.
//!
//! Invariant: decoding content never fails on an unknown block type or an unknown
//! field: an unknown block becomes [`ContentBlock::Other`] with its type name, which
//! callers count as an unknown part. Only a known field of the wrong shape (a `text`
//! that is not a string) makes the line malformed.

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

/// The texts Claude Code writes as a user message when the user interrupts a turn:
/// during a stream (or a hang, or a denial that interrupts), and while a permission
/// prompt or a tool was pending (Claude Code 2.1.38 and 2.1.328 alike).
pub(crate) const INTERRUPTION_MARKERS: &[&str] = &[
    "[Request interrupted by user]",
    "[Request interrupted by user for tool use]",
];

/// The content of a message.
#[derive(Clone, Debug, PartialEq)]
pub enum Content {
    /// A plain string (a typed prompt).
    Text(String),
    /// Content blocks.
    Blocks(Vec<ContentBlock>),
}

impl Default for Content {
    fn default() -> Self {
        Content::Blocks(Vec::new())
    }
}

impl Content {
    /// The blocks (a plain string reads as one text block).
    pub fn blocks(&self) -> Vec<&ContentBlock> {
        match self {
            Content::Text(_) => Vec::new(),
            Content::Blocks(b) => b.iter().collect(),
        }
    }

    /// The text a user row shows: the plain string, or the text blocks joined by a
    /// blank line. `None` when the content holds no text (only tool results, images).
    pub fn user_text(&self) -> Option<String> {
        match self {
            Content::Text(t) => Some(t.clone()),
            Content::Blocks(blocks) => {
                let texts: Vec<&str> = blocks
                    .iter()
                    .filter_map(|b| match b {
                        ContentBlock::Text { text } => Some(text.as_str()),
                        _ => None,
                    })
                    .collect();
                (!texts.is_empty()).then(|| texts.join("\n\n"))
            }
        }
    }

    /// True when the content is one of Claude's interruption markers,
    /// `[Request interrupted by user]` or `[Request interrupted by user for tool use]`:
    /// a plain user line or entry (no `isMeta`, no `isReplay`, a fresh UUID) that says
    /// the user interrupted the turn. It is not the user's words: the live projection
    /// and the transcript reader both show it as the system row "Interrupted".
    pub fn is_interruption_marker(&self) -> bool {
        self.user_text()
            .is_some_and(|t| INTERRUPTION_MARKERS.contains(&t.trim()))
    }

    /// True when the content carries tool results.
    pub fn has_tool_results(&self) -> bool {
        matches!(self, Content::Blocks(b) if b.iter().any(|b| matches!(b, ContentBlock::ToolResult { .. })))
    }
}

/// One content block.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum ContentBlock {
    /// A text block.
    Text {
        /// The text.
        text: String,
    },
    /// Reasoning (its signature is not kept).
    Thinking {
        /// The reasoning text.
        thinking: String,
    },
    /// A tool call.
    ToolUse {
        /// `toolu_…`.
        id: String,
        /// The tool name (`Bash`, `Read`, `mcp__server__tool`).
        name: String,
        /// The arguments.
        input: serde_json::Value,
    },
    /// A tool's result (user messages).
    ToolResult {
        /// The call it answers.
        tool_use_id: String,
        /// The result text (text parts joined; other parts named in brackets).
        content: String,
        /// True when the tool failed.
        is_error: bool,
    },
    /// An image (its bytes are not kept).
    Image,
    /// A block type this crate does not know.
    Other {
        /// Its `type`.
        kind: String,
    },
}

impl ContentBlock {
    /// The label of an unknown block, for the diagnostics.
    pub fn unknown_label(&self) -> Option<String> {
        match self {
            ContentBlock::Other { kind } => Some(format!("content/{kind}")),
            _ => None,
        }
    }
}

/// The union of every known block field; decoded in one pass.
#[derive(Deserialize)]
struct RawBlock {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    thinking: Option<String>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    input: Option<serde_json::Value>,
    #[serde(default)]
    tool_use_id: Option<String>,
    #[serde(default)]
    content: Option<serde_json::Value>,
    #[serde(default)]
    is_error: Option<bool>,
}

/// The text of a tool result's `content`: a string, or parts whose text is joined.
fn result_text(v: Option<serde_json::Value>) -> String {
    match v {
        None | Some(serde_json::Value::Null) => String::new(),
        Some(serde_json::Value::String(s)) => s,
        Some(serde_json::Value::Array(parts)) => parts
            .iter()
            .map(|p| match p.get("type").and_then(|t| t.as_str()) {
                Some("text") => p
                    .get("text")
                    .and_then(|t| t.as_str())
                    .unwrap_or_default()
                    .to_owned(),
                Some(other) => format!("[{other}]"),
                None => String::new(),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Some(other) => other.to_string(),
    }
}

impl From<RawBlock> for ContentBlock {
    fn from(r: RawBlock) -> Self {
        match r.kind.as_deref().unwrap_or("") {
            "text" => ContentBlock::Text {
                text: r.text.unwrap_or_default(),
            },
            "thinking" | "redacted_thinking" => ContentBlock::Thinking {
                thinking: r.thinking.unwrap_or_default(),
            },
            "tool_use" | "server_tool_use" => ContentBlock::ToolUse {
                id: r.id.unwrap_or_default(),
                name: r.name.unwrap_or_default(),
                input: r.input.unwrap_or(serde_json::Value::Null),
            },
            "tool_result" => ContentBlock::ToolResult {
                tool_use_id: r.tool_use_id.unwrap_or_default(),
                content: result_text(r.content),
                is_error: r.is_error.unwrap_or(false),
            },
            "image" => ContentBlock::Image,
            other => ContentBlock::Other {
                kind: other.to_owned(),
            },
        }
    }
}

impl<'de> Deserialize<'de> for ContentBlock {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        RawBlock::deserialize(d).map(ContentBlock::from)
    }
}

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Content;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string or a list of content blocks")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Content, E> {
                Ok(Content::Text(v.to_owned()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Content, E> {
                Ok(Content::Text(v))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Content, E> {
                Ok(Content::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Content, A::Error> {
                let mut blocks = Vec::new();
                while let Some(b) = seq.next_element::<ContentBlock>()? {
                    blocks.push(b);
                }
                Ok(Content::Blocks(blocks))
            }
        }
        d.deserialize_any(V)
    }
}

/// The `message` object of an assistant or user line (both formats).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Message {
    /// `msg_…` (assistant messages).
    #[serde(default)]
    pub id: Option<String>,
    /// The model.
    #[serde(default)]
    pub model: Option<String>,
    /// `user` or `assistant`.
    #[serde(default)]
    pub role: Option<String>,
    /// The content.
    #[serde(default)]
    pub content: Content,
    /// Why the model stopped, when it did.
    #[serde(default)]
    pub stop_reason: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_blocks_and_fields_are_kept_as_other() {
        let c: Content = serde_json::from_str(
            r#"[{"type":"text","text":"a","future":1},{"type":"fallback","x":2},
                {"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"ok"},{"type":"image"}]}]"#,
        )
        .unwrap();
        let Content::Blocks(b) = c else { panic!() };
        assert_eq!(b[0], ContentBlock::Text { text: "a".into() });
        assert_eq!(b[1].unknown_label().as_deref(), Some("content/fallback"));
        assert_eq!(
            b[2],
            ContentBlock::ToolResult {
                tool_use_id: "t".into(),
                content: "ok\n[image]".into(),
                is_error: false
            }
        );
        let s: Content = serde_json::from_str(r#""hi""#).unwrap();
        assert_eq!(s.user_text().as_deref(), Some("hi"));
        assert!(serde_json::from_str::<Content>(r#"[{"type":"text","text":5}]"#).is_err());
    }
}
