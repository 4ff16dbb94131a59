//! The Claude transcript reader (sans-IO): `~/.claude/projects/<slug>/<sessionId>.jsonl`
//! and the subagent files beside it, read from bytes into items a timeline pages.
//!
//! - [`Transcript::feed`] takes the bytes read so far and returns how many it consumed:
//!   every complete line, and a last line without its newline only when it is a
//!   complete JSON value. A torn last line (the file is being written) is left for the
//!   next read; the caller keeps the unconsumed tail and feeds it again with what
//!   follows.
//! - Claude writes one line per content block; lines that share `message.id` become one
//!   [`ItemKind::Reply`] (its text in one reply row, its reasoning in one thinking row,
//!   each tool call one activity row). A tool result (`tool_result` in a later user
//!   line) joins its call by `tool_use_id`.
//! - Metadata lines (`summary`, `file-history-snapshot`, `queue-operation`, …) and the
//!   chain lines without rows (`progress`, `attachment`) are skipped and counted; a line
//!   of an unknown type is skipped and counted as unknown; a line that is not JSON is
//!   counted as malformed. Nothing is fatal ([`Diagnostics`]).
//! - Saved history starts at the last compaction (the seed: "Saved Claude history
//!   starts after the last compaction, because the SDK returns only that part"):
//!   [`Transcript::page_before`] pages only from the last `compact_boundary` on, newest
//!   first, by the UUID of an item ([`Item::position`]); that UUID is the `before`
//!   of a Claude cursor (TL-09). Every user UUID of the file stays a delivery proof.
//!
//! Invariants: feeding a file in any split gives the same items and diagnostics as
//! feeding it whole (`tests/transcript_props.rs`); every line is counted once; one
//! `message.id` is one item.
//!
//! ```
//! use agent_claude::transcript::Transcript;
//!
//! let file = concat!(
//!     r#"{"type":"user","uuid":"u1","timestamp":"2026-01-01T00:00:00Z","message":{"role":"user","content":"hi"}}"#, "\n",
//!     r#"{"type":"assistant","uuid":"a1","timestamp":"2026-01-01T00:00:01Z","message":{"id":"msg_1","content":[{"type":"thinking","thinking":"hm"}]}}"#, "\n",
//!     r#"{"type":"assistant","uuid":"a2","timestamp":"2026-01-01T00:00:02Z","message":{"id":"msg_1","content":[{"type":"text","text":"hello"}]}}"#, "\n",
//!     r#"{"type":"assistant","uuid":"a3","#, // torn: still being written
//! );
//! let mut t = Transcript::new();
//! let used = t.feed(file.as_bytes());
//! assert_eq!(&file[used..], r#"{"type":"assistant","uuid":"a3","#);
//! assert_eq!(t.items().len(), 2, "one prompt, one reply for msg_1");
//! assert!(t.has_user_message("u1"));
//! ```

use std::collections::HashMap;

use serde::Deserialize;
use timeline_core::block::Block;
use timeline_core::order::SourceOrder;
use timeline_core::time::Millis;

use crate::blocks::{self, ToolCall, ToolResult};
use crate::content::{Content, ContentBlock, Message};
use crate::diag::Diagnostics;
use crate::time::parse_timestamp;

/// Metadata line types (no `uuid` chain, no rows): skipped on purpose.
pub const METADATA_TYPES: &[&str] = &[
    "summary",
    "file-history-snapshot",
    "file-history-delta",
    "queue-operation",
    "custom-title",
    "ai-title",
    "last-prompt",
    "tag",
    "content-replacement",
    "mode",
    "permission-mode",
    "worktree-state",
    "agent-name",
    "bridge-session",
    "cost-state",
    "frame-link",
    "pr-link",
];

/// Chain lines that project to no row: skipped on purpose.
pub const ROWLESS_CHAIN_TYPES: &[&str] = &["progress", "attachment"];

/// System subtypes that show as a system row; other system lines are read and hidden.
const SHOWN_SYSTEM: &[&str] = &["compact_boundary", "api_error", "error"];

/// One saved item: what one page position stands for.
#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    /// The UUID of its first line: its position.
    pub position: String,
    /// When its first line was written (the previous item's time when unreadable).
    pub timestamp: Millis,
    /// What it is.
    pub kind: ItemKind,
}

/// What an item is.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum ItemKind {
    /// A user prompt: one user row.
    Prompt {
        /// The entry's UUID (the operation's UUID for a message the host sent).
        uuid: String,
        /// The text.
        text: String,
    },
    /// A user entry that shows no row: injected meta text (`isMeta`), the compaction
    /// summary, or tool results whose call is not in the file.
    Hidden {
        /// The entry's UUID.
        uuid: String,
    },
    /// All lines of one assistant message (`message.id`).
    Reply(Reply),
    /// A `system` line.
    System {
        /// Its UUID.
        uuid: String,
        /// Its subtype.
        subtype: String,
        /// Its content text, if any.
        text: Option<String>,
    },
}

/// One assistant message, merged from its lines.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reply {
    /// `msg_…` (the first line's UUID when a line has no message ID).
    pub message_id: String,
    /// The UUIDs of its lines, in file order.
    pub uuids: Vec<String>,
    /// Text blocks, in order.
    pub text: Vec<String>,
    /// Reasoning blocks, in order.
    pub thinking: Vec<String>,
    /// Tool calls, in order, with their results once read.
    pub tools: Vec<ToolCall>,
    /// The order in which text, reasoning and each tool first appeared.
    parts: Vec<Part>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    Text,
    Thinking,
    Tool(usize),
}

impl Reply {
    fn add(&mut self, block: &ContentBlock) -> bool {
        match block {
            ContentBlock::Text { text } => {
                if !self.parts.contains(&Part::Text) {
                    self.parts.push(Part::Text);
                }
                self.text.push(text.clone());
            }
            ContentBlock::Thinking { thinking } => {
                if !self.parts.contains(&Part::Thinking) {
                    self.parts.push(Part::Thinking);
                }
                self.thinking.push(thinking.clone());
            }
            ContentBlock::ToolUse { id, name, input } => {
                self.parts.push(Part::Tool(self.tools.len()));
                self.tools.push(ToolCall {
                    id: id.clone(),
                    name: name.clone(),
                    input: input.clone(),
                    result: None,
                });
            }
            _ => return false,
        }
        true
    }

    /// The reply text: its text blocks, trimmed, blank ones dropped, joined by a blank
    /// line.
    pub fn joined_text(&self) -> String {
        join(&self.text)
    }

    /// The reasoning text, joined the same way.
    pub fn joined_thinking(&self) -> String {
        join(&self.thinking)
    }
}

fn join(parts: &[String]) -> String {
    parts
        .iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("\n\n")
}

impl Item {
    /// The rows of this item, placed at `[0, 1, ordinal, entryIndex]` (TL-05).
    pub fn blocks(&self, ordinal: u64) -> Vec<Block> {
        let at = self.timestamp;
        let mut out = Vec::new();
        let mut next = 0u64;
        let mut order = || {
            let o = SourceOrder::history(ordinal, next);
            next = next.saturating_add(1);
            o
        };
        match &self.kind {
            // Keyed by the position: the entry's UUID, unique even in a file that
            // repeats a UUID.
            ItemKind::Prompt { text, .. } => {
                out.extend(blocks::user_block(&self.position, at, order(), text));
            }
            ItemKind::Hidden { .. } => {}
            ItemKind::System { subtype, text, .. } => {
                if SHOWN_SYSTEM.contains(&subtype.as_str()) {
                    let text = match (subtype.as_str(), text) {
                        ("compact_boundary", _) => "Conversation compacted".to_owned(),
                        (_, Some(t)) if !t.trim().is_empty() => t.clone(),
                        _ => "The agent reported an error".to_owned(),
                    };
                    out.extend(blocks::system_block(&self.position, at, order(), &text));
                }
            }
            ItemKind::Reply(r) => {
                for part in &r.parts {
                    let block = match part {
                        Part::Text => {
                            let text = r.joined_text();
                            if text.is_empty() {
                                continue;
                            }
                            blocks::reply_block(&r.message_id, at, order(), &text)
                        }
                        Part::Thinking => {
                            let text = r.joined_thinking();
                            if text.is_empty() {
                                continue;
                            }
                            blocks::thinking_block(&r.message_id, at, order(), &text)
                        }
                        Part::Tool(i) => match r.tools.get(*i) {
                            Some(call) => blocks::tool_block(call, at, order()),
                            None => None,
                        },
                    };
                    out.extend(block);
                }
            }
        }
        out
    }
}

/// The union of every entry field the reader uses.
#[derive(Deserialize)]
struct RawEntry {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    subtype: Option<String>,
    #[serde(default)]
    uuid: Option<String>,
    #[serde(default, rename = "sessionId")]
    session_id: Option<String>,
    #[serde(default, rename = "agentId")]
    agent_id: Option<String>,
    #[serde(default)]
    timestamp: Option<String>,
    #[serde(default)]
    version: Option<String>,
    #[serde(default, rename = "isMeta")]
    is_meta: Option<bool>,
    #[serde(default, rename = "isCompactSummary")]
    is_compact_summary: Option<bool>,
    #[serde(default)]
    message: Option<Message>,
    #[serde(default)]
    content: Option<serde_json::Value>,
}

/// A page position the transcript does not hold (any more).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PageError {
    /// The `before` message is not in the saved history (gone, or before the last
    /// compaction): answer with an empty page and `reloadRequired`.
    #[error("the transcript no longer holds the message {0:?}")]
    PositionGone(String),
}

/// A page of items, newest first.
#[derive(Clone, Debug, PartialEq)]
pub struct Page<'a> {
    /// `(ordinal, item)`, newest first.
    pub items: Vec<(u64, &'a Item)>,
    /// True when older items exist.
    pub more: bool,
}

/// A transcript read so far.
#[derive(Clone, Debug, Default)]
pub struct Transcript {
    items: Vec<Item>,
    /// Every chain UUID read → the item it belongs to (the first one wins).
    by_uuid: HashMap<String, usize>,
    /// `message.id` → its reply item.
    by_message: HashMap<String, usize>,
    /// `toolu_…` → (reply item, tool index).
    by_tool: HashMap<String, (usize, usize)>,
    /// UUIDs of user entries (delivery proofs).
    user_uuids: std::collections::HashSet<String>,
    /// The item of the last `compact_boundary`: saved history starts there.
    visible_from: usize,
    session_id: Option<String>,
    agent_id: Option<String>,
    last_time: Millis,
    /// The last line was taken without its newline: a newline that opens the next
    /// read ends that line and is not a line of its own.
    owes_newline: bool,
    diagnostics: Diagnostics,
}

impl Transcript {
    /// An empty transcript (a file that does not exist reads as this: an empty
    /// conversation).
    pub fn new() -> Transcript {
        Transcript::default()
    }

    /// Reads `bytes`, the unread part of the file, and returns how many bytes it used
    /// (see the module doc for the torn last line).
    pub fn feed(&mut self, bytes: &[u8]) -> usize {
        if bytes.is_empty() {
            return 0;
        }
        let mut consumed = 0usize;
        let mut rest = bytes;
        if std::mem::take(&mut self.owes_newline) {
            let skip = if bytes.starts_with(b"\r\n") {
                2
            } else {
                usize::from(bytes.starts_with(b"\n"))
            };
            rest = bytes.get(skip..).unwrap_or_default();
            consumed = skip;
        }
        while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
            let (line, tail) = rest.split_at(nl);
            self.line(line);
            consumed = consumed.saturating_add(nl + 1);
            rest = tail.get(1..).unwrap_or_default();
        }
        // A last line without its newline is taken only when it is a whole JSON object
        // (a cut object never parses; a bare value such as a number could still grow).
        if rest.trim_ascii_end().last() == Some(&b'}')
            && serde_json::from_slice::<serde::de::IgnoredAny>(rest).is_ok()
        {
            self.line(rest);
            consumed = consumed.saturating_add(rest.len());
            self.owes_newline = true;
        }
        consumed
    }

    /// Every item read, oldest first (including those before the last compaction).
    pub fn items(&self) -> &[Item] {
        &self.items
    }

    /// The items of the saved history (from the last compaction on), with ordinals.
    pub fn visible_items(&self) -> impl DoubleEndedIterator<Item = (u64, &Item)> {
        self.items
            .iter()
            .enumerate()
            .skip(self.visible_from)
            .map(|(i, it)| (i as u64, it))
    }

    /// The rows of the saved history, oldest first.
    pub fn blocks(&self) -> Vec<Block> {
        self.visible_items()
            .flat_map(|(o, it)| it.blocks(o))
            .collect()
    }

    /// What the reader saw.
    pub fn diagnostics(&self) -> &Diagnostics {
        &self.diagnostics
    }

    /// The `sessionId` of the first entry that states one (a subagent file states its
    /// parent's).
    pub fn session_id(&self) -> Option<&str> {
        self.session_id.as_deref()
    }

    /// The `agentId` of a subagent file.
    pub fn agent_id(&self) -> Option<&str> {
        self.agent_id.as_deref()
    }

    /// True when a `user` entry with this UUID was read (the Claude delivery proof).
    pub fn has_user_message(&self, uuid: &str) -> bool {
        self.user_uuids.contains(uuid) || self.user_uuids.contains(&uuid.to_ascii_lowercase())
    }

    /// The index of the item holding the chain line `uuid`.
    pub fn item_of(&self, uuid: &str) -> Option<usize> {
        self.by_uuid.get(uuid).copied()
    }

    /// Up to `limit` items older than the item holding `before` (`None`: the newest),
    /// newest first, from the saved history only. A `before` the saved history does not
    /// hold is [`PageError::PositionGone`].
    pub fn page_before(&self, before: Option<&str>, limit: usize) -> Result<Page<'_>, PageError> {
        let end = match before {
            None => self.items.len(),
            Some(uuid) => match self.item_of(uuid) {
                Some(i) if i >= self.visible_from => i,
                _ => return Err(PageError::PositionGone(uuid.to_owned())),
            },
        };
        let start = end.saturating_sub(limit).max(self.visible_from);
        let items = self
            .items
            .get(start..end)
            .unwrap_or_default()
            .iter()
            .enumerate()
            .rev()
            .map(|(i, it)| ((start + i) as u64, it))
            .collect();
        Ok(Page {
            items,
            more: start > self.visible_from,
        })
    }

    /// Up to `limit` items newer than the item holding `after`, oldest first, and
    /// whether newer ones follow.
    pub fn page_after(&self, after: &str, limit: usize) -> Result<Page<'_>, PageError> {
        let start = match self.item_of(after) {
            Some(i) if i >= self.visible_from => i.saturating_add(1),
            _ => return Err(PageError::PositionGone(after.to_owned())),
        };
        let end = start.saturating_add(limit).min(self.items.len());
        let items = self
            .items
            .get(start..end)
            .unwrap_or_default()
            .iter()
            .enumerate()
            .map(|(i, it)| ((start + i) as u64, it))
            .collect();
        Ok(Page {
            items,
            more: end < self.items.len(),
        })
    }

    /// Appends an item whose first line has UUID `item.position`. Positions are unique:
    /// a UUID already used (Claude writes each once; hand-made files may not) becomes
    /// `<uuid>#<ordinal>`.
    fn push_item(&mut self, mut item: Item) -> usize {
        let idx = self.items.len();
        if self.by_uuid.contains_key(&item.position) {
            item.position = format!("{}#{idx}", item.position);
        }
        self.by_uuid.insert(item.position.clone(), idx);
        self.items.push(item);
        idx
    }

    fn line(&mut self, line: &[u8]) {
        let d = &mut self.diagnostics;
        d.lines = d.lines.saturating_add(1);
        if line.iter().all(u8::is_ascii_whitespace) {
            d.blank = d.blank.saturating_add(1);
            return;
        }
        let raw: RawEntry = match serde_json::from_slice(line) {
            Ok(r) => r,
            Err(e) => {
                d.malformed(&e.to_string());
                return;
            }
        };
        if let Some(v) = &raw.version {
            d.version(v);
        }
        let kind = raw.kind.clone().unwrap_or_default();
        if METADATA_TYPES.contains(&kind.as_str()) || ROWLESS_CHAIN_TYPES.contains(&kind.as_str()) {
            d.skipped.add(&kind);
            return;
        }
        if !matches!(kind.as_str(), "user" | "assistant" | "system") {
            d.unknown.add(&kind);
            return;
        }
        let Some(uuid) = raw.uuid.clone().filter(|u| !u.trim().is_empty()) else {
            d.malformed(&format!("a {kind} entry without uuid"));
            return;
        };
        if self.session_id.is_none() {
            self.session_id.clone_from(&raw.session_id);
        }
        if self.agent_id.is_none() {
            self.agent_id.clone_from(&raw.agent_id);
        }
        let at = raw
            .timestamp
            .as_deref()
            .and_then(parse_timestamp)
            .unwrap_or(self.last_time);
        self.last_time = at;
        match kind.as_str() {
            "user" => self.user(raw, uuid, at),
            "assistant" => self.assistant(raw, uuid, at),
            _ => self.system(raw, uuid, at),
        }
    }

    fn user(&mut self, raw: RawEntry, uuid: String, at: Millis) {
        self.diagnostics.parsed.add("user");
        self.user_uuids.insert(uuid.clone());
        let content = raw.message.map(|m| m.content).unwrap_or_default();
        for b in content.blocks() {
            if let Some(label) = b.unknown_label() {
                self.diagnostics.unknown_parts.add(&label);
            }
        }
        let hidden = raw.is_meta == Some(true) || raw.is_compact_summary == Some(true);
        if content.has_tool_results() {
            // Join each result to its call; the line belongs to the call's item.
            let mut home = None;
            for b in content.blocks() {
                if let ContentBlock::ToolResult {
                    tool_use_id,
                    content,
                    is_error,
                } = b
                {
                    let call = Some(tool_use_id)
                        .filter(|id| !id.trim().is_empty())
                        .and_then(|id| self.by_tool.get(id));
                    let Some(&(item, tool)) = call else {
                        self.diagnostics
                            .unknown_parts
                            .add("tool_result/without-call");
                        continue;
                    };
                    if let Some(ItemKind::Reply(r)) = self.items.get_mut(item).map(|i| &mut i.kind)
                    {
                        if let Some(call) = r.tools.get_mut(tool) {
                            call.result = Some(ToolResult {
                                text: content.clone(),
                                is_error: *is_error,
                                uuid: Some(uuid.clone()),
                            });
                            home.get_or_insert(item);
                        }
                    }
                }
            }
            match home {
                Some(item) => {
                    self.by_uuid.entry(uuid).or_insert(item);
                }
                None => {
                    self.push_item(Item {
                        position: uuid.clone(),
                        timestamp: at,
                        kind: ItemKind::Hidden { uuid },
                    });
                }
            }
            return;
        }
        let kind = match (hidden, content.user_text()) {
            (false, Some(text)) => ItemKind::Prompt {
                uuid: uuid.clone(),
                text,
            },
            _ => ItemKind::Hidden { uuid: uuid.clone() },
        };
        self.push_item(Item {
            position: uuid,
            timestamp: at,
            kind,
        });
    }

    fn assistant(&mut self, raw: RawEntry, uuid: String, at: Millis) {
        self.diagnostics.parsed.add("assistant");
        let message = raw.message.unwrap_or_default();
        let message_id = message
            .id
            .clone()
            .filter(|m| !m.trim().is_empty())
            .unwrap_or_else(|| uuid.clone());
        let idx = match self.by_message.get(&message_id) {
            Some(&i) => i,
            None => {
                let i = self.push_item(Item {
                    position: uuid.clone(),
                    timestamp: at,
                    kind: ItemKind::Reply(Reply {
                        message_id: message_id.clone(),
                        ..Reply::default()
                    }),
                });
                self.by_message.insert(message_id, i);
                i
            }
        };
        self.by_uuid.entry(uuid.clone()).or_insert(idx);
        let Some(ItemKind::Reply(reply)) = self.items.get_mut(idx).map(|i| &mut i.kind) else {
            return;
        };
        reply.uuids.push(uuid);
        let mut new_tools = Vec::new();
        for (n, b) in message.content.blocks().into_iter().enumerate() {
            // A tool call without an ID (hand-made files) still gets a row of its own.
            let named;
            let b = match b {
                ContentBlock::ToolUse { id, name, input } if id.trim().is_empty() => {
                    named = ContentBlock::ToolUse {
                        id: format!("{}#tool-{n}", reply.uuids.last().map_or("", |u| u.as_str())),
                        name: name.clone(),
                        input: input.clone(),
                    };
                    &named
                }
                b => b,
            };
            if !reply.add(b) {
                if let Some(label) = b.unknown_label() {
                    self.diagnostics.unknown_parts.add(&label);
                }
                continue;
            }
            if let ContentBlock::ToolUse { id, .. } = b {
                new_tools.push((id.clone(), reply.tools.len().saturating_sub(1)));
            }
        }
        if let Content::Text(text) = &message.content {
            reply.add(&ContentBlock::Text { text: text.clone() });
        }
        for (id, t) in new_tools {
            self.by_tool.entry(id).or_insert((idx, t));
        }
    }

    fn system(&mut self, raw: RawEntry, uuid: String, at: Millis) {
        let subtype = raw.subtype.unwrap_or_default();
        self.diagnostics.parsed.add(&format!("system/{subtype}"));
        let text = raw.content.and_then(|c| c.as_str().map(str::to_owned));
        let idx = self.push_item(Item {
            position: uuid.clone(),
            timestamp: at,
            kind: ItemKind::System {
                uuid,
                subtype: subtype.clone(),
                text,
            },
        });
        if subtype == "compact_boundary" {
            self.visible_from = idx;
        }
    }
}
