//! The Claude transcript reader (sans-IO): `~/.claude/projects/<slug>/<sessionId>.jsonl`
//! and the subagent files beside it, read from bytes into items a timeline pages.
//!
//! - [`Transcript::feed`] takes the unread bytes of the file and returns how many it
//!   used: every line that ends with a newline. The last line without its newline is
//!   left for the next read, whatever it looks like (a torn `{"type":"user","mes` is
//!   not counted malformed: the caller keeps the unused tail and feeds it again with
//!   what follows). A complete line that is not an entry is counted malformed and
//!   skipped. [`Transcript::finish`] says the file is complete: its last line without a
//!   newline is read as a line (an entry, or one counted malformed line).
//! - Claude writes one line per content block; lines that share `message.id` become one
//!   [`ItemKind::Reply`] (its text in one reply row, its reasoning in one thinking row,
//!   each tool call one activity row). A tool result (`tool_result` in a later user
//!   line) joins its call by `tool_use_id`.
//! - Metadata lines (`summary`, `file-history-snapshot`, `queue-operation`, …) and the
//!   chain lines without rows (`progress`, `attachment`) are skipped and counted; a line
//!   of an unknown type is skipped and counted as unknown; a line that is not JSON is
//!   counted as malformed. Nothing is fatal ([`Diagnostics`]).
//! - Two kinds of line are not what their type suggests. A `queued_command`
//!   attachment is a message that joined a running turn (Claude Code 2.1.328 writes no
//!   `user` entry for it): it is the user's message row ([`ItemKind::Absorbed`]), keyed
//!   by the message's UUID like its live echo. A plain user entry whose text is an
//!   interruption marker (`[Request interrupted by user]`) is not the user's words: it
//!   is the interrupted-turn row ([`ItemKind::Interrupted`]).
//!
//! ## Which items are the conversation
//!
//! Every chain line names its parent (`parentUuid`); a user who edits a prompt and runs
//! it again, or rewinds, starts a second branch from an older line, and the old branch
//! stays in the file. The conversation is the branch that leads to the newest item
//! (FORMATS.md §1.5, the reconstruction of Anthropic's SDK): from the newest item,
//! follow each item's parent up to the root. Items are linked through the lines they
//! are made of, so the tool results and the rowless `progress` lines between the lines
//! of one reply never look like a branch. Three choices, each tested:
//!
//! - The newest item is the newest one that is not a sidechain, unless the file is a
//!   subagent file (its first entry is a sidechain entry): Claude Code 1.0 wrote a
//!   subagent's lines into the main file, and they are not part of the main
//!   conversation.
//! - `logicalParentUuid` is not followed: a compaction (`compact_boundary`, whose parent
//!   is null) is a root, so the saved history starts at the last compaction on the live
//!   branch (the seed: "Saved Claude history starts after the last compaction, because
//!   the SDK returns only that part").
//! - A parent is followed only when it was read before its child (Claude writes a parent
//!   first); a line whose parent is not in the file starts a root too.
//!
//! Every user UUID of the file, on any branch, stays a delivery proof: a message that an
//! edit later replaced was still delivered. So do the UUIDs a merged user entry lists
//! (`mergedSendUuids`) and those of messages absorbed mid-turn (the rule is
//! [`crate::proof`]'s).
//!
//! Pages ([`Transcript::page_before`], [`Transcript::page_after`]) walk the conversation
//! newest first by the UUID of an item ([`Item::position`]); that UUID is the `before` of
//! a Claude cursor (TL-09). An item is placed by the byte offset of its first line in the
//! file ([`Item::offset`], the ordinal of `[0, 1, ordinal, entryIndex]`, TL-05), so a
//! reader that starts in the middle of the file ([`crate::tail`]) places it the same way.
//!
//! Invariants: feeding a file in any split gives the same items, conversation and
//! diagnostics as feeding it whole (`tests/transcript_props.rs`); every line is counted
//! once; one `message.id` is one item.
//!
//! ```
//! use agent_claude::transcript::Transcript;
//!
//! let file = concat!(
//!     r#"{"type":"user","uuid":"u1","timestamp":"2026-01-01T00:00:00Z","message":{"role":"user","content":"hi"}}"#, "\n",
//!     r#"{"type":"assistant","uuid":"a1","parentUuid":"u1","timestamp":"2026-01-01T00:00:01Z","message":{"id":"msg_1","content":[{"type":"thinking","thinking":"hm"}]}}"#, "\n",
//!     r#"{"type":"assistant","uuid":"a2","parentUuid":"a1","timestamp":"2026-01-01T00:00:02Z","message":{"id":"msg_1","content":[{"type":"text","text":"hello"}]}}"#, "\n",
//!     r#"{"type":"assistant","uuid":"a3","#, // torn: still being written
//! );
//! let mut t = Transcript::new();
//! let used = t.feed(file.as_bytes());
//! assert_eq!(&file[used..], r#"{"type":"assistant","uuid":"a3","#);
//! assert_eq!(t.items().len(), 2, "one prompt, one reply for msg_1");
//! assert_eq!(t.diagnostics().malformed, 0, "a torn line is not malformed");
//! assert!(t.has_user_message("u1"));
//!
//! // The file is known complete: the torn line is one malformed line.
//! t.finish(&file.as_bytes()[used..]);
//! assert_eq!(t.diagnostics().malformed, 1);
//! ```

use std::collections::{HashMap, HashSet};

use serde::Deserialize;
use timeline_core::block::Block;
use timeline_core::order::SourceOrder;
use timeline_core::time::Millis;

use crate::blocks::{self, ToolCall, ToolResult};
use crate::content::{Content, ContentBlock, Message};
use crate::diag::Diagnostics;
use crate::marks::{Attachment, Marks};
use timeline_core::time::parse_timestamp;

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
    // Claude Code 2.1.328: request bookkeeping and tool usage, no conversation.
    "atis-latch",
    "api-request-shape",
    "api-request-blob",
    "api-request",
    "tools-used",
];

/// Chain lines that project to no row: skipped on purpose (their place in the chain is
/// kept, so a child of one links through it). A `queued_command` attachment is the
/// exception: it is the message of an [`ItemKind::Absorbed`] item.
pub const ROWLESS_CHAIN_TYPES: &[&str] = &["progress", "attachment"];

/// System subtypes that show as a system row; other system lines are read and hidden.
const SHOWN_SYSTEM: &[&str] = &["compact_boundary", "api_error", "error"];

/// One saved item: what one page position stands for.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Item {
    /// The UUID of its first line: its position.
    pub position: String,
    /// When its first line was written (the previous line's time when unreadable).
    pub timestamp: Millis,
    /// The byte offset of its first line in the file: the item's ordinal.
    pub offset: u64,
    /// True when its first line is a sidechain entry (`isSidechain`).
    pub sidechain: bool,
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
    /// A message that joined a running turn: a `queued_command` attachment (the item's
    /// position is the attachment's UUID). One user row, keyed by the message's UUID,
    /// so it is the twin of the message's live echo.
    Absorbed {
        /// The message's UUID (`source_uuid`: the operation's UUID for a message the
        /// host sent); the attachment's UUID when it names none; `<uuid>#<offset>` when
        /// the file already used that UUID for a user row.
        uuid: String,
        /// The text.
        text: String,
    },
    /// An interruption marker (a plain user entry `[Request interrupted by user]` or
    /// `[Request interrupted by user for tool use]`): the interrupted-turn system row,
    /// not a user row.
    Interrupted {
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
    /// The rows of this item, placed at `[0, 1, ordinal, entryIndex]` (TL-05); the
    /// readers of this crate pass [`Item::offset`] as the ordinal.
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
            // Keyed by the message's UUID: the key of its live echo.
            ItemKind::Absorbed { uuid, text } => {
                out.extend(blocks::user_block(uuid, at, order(), text));
            }
            ItemKind::Interrupted { .. } => {
                out.extend(blocks::interrupted_block(&self.position, at, order()));
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

    /// The rows of this item at its own offset.
    pub fn rows(&self) -> Vec<Block> {
        self.blocks(self.offset)
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
    #[serde(default, rename = "parentUuid")]
    parent_uuid: Option<String>,
    #[serde(default, rename = "isSidechain")]
    is_sidechain: Option<bool>,
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
    #[serde(default, rename = "mergedSendUuids")]
    merged_send_uuids: Option<serde_json::Value>,
    #[serde(default)]
    operation: Option<serde_json::Value>,
    #[serde(default)]
    reason: Option<serde_json::Value>,
    #[serde(default, rename = "commandUuid")]
    command_uuid: Option<serde_json::Value>,
    #[serde(default)]
    attachment: Option<Attachment>,
}

impl RawEntry {
    fn marks<'a>(&'a self, kind: &'a str) -> Marks<'a> {
        Marks {
            kind,
            uuid: self.uuid.as_deref(),
            merged_send_uuids: self.merged_send_uuids.as_ref(),
            operation: self.operation.as_ref(),
            reason: self.reason.as_ref(),
            command_uuid: self.command_uuid.as_ref(),
            attachment: self.attachment.as_ref(),
        }
    }
}

/// A page position the transcript does not hold (any more).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PageError {
    /// The `before` message is not in the saved history (gone, on an abandoned branch,
    /// or before the last compaction): answer with an empty page and `reloadRequired`.
    #[error("the transcript no longer holds the message {0:?}")]
    PositionGone(String),
}

/// A page of items.
#[derive(Clone, Debug, PartialEq)]
pub struct Page<'a> {
    /// `(ordinal, item)`: newest first from [`Transcript::page_before`], oldest first
    /// from [`Transcript::page_after`]; the ordinal is the item's [`Item::offset`].
    pub items: Vec<(u64, &'a Item)>,
    /// True when the conversation goes on past the last item in the direction read.
    pub more: bool,
}

/// Where a line leads when its children follow their `parentUuid` to an item; fixed
/// when the line is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Link {
    /// The start of a chain (`parentUuid` null or absent).
    Root,
    /// An item.
    Item(usize),
    /// A line this reader has not read: not in the file (a root for a whole file), or
    /// before the part a window read holds (unknown).
    Unread,
}

/// What the reader keeps per item besides the item itself.
#[derive(Clone, Copy, Debug)]
struct Node {
    /// Where the item's first line points.
    parent: Link,
    /// A tool-result item some of whose calls were not read: in a window read, it may
    /// belong to a reply before the window.
    orphan: bool,
    /// Its index in the conversation, when it is on it.
    on_path: Option<usize>,
}

/// Where a window page starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Anchor<'a> {
    /// The newest items.
    Latest,
    /// The items older than the item holding this UUID.
    Before(&'a str),
    /// The items newer than the item holding this UUID.
    After(&'a str),
}

/// The answer of a walk over a window of the file.
#[derive(Debug, PartialEq)]
pub(crate) enum Walk {
    /// The page: item indices newest first, and whether older items exist.
    Page(Vec<usize>, bool),
    /// The window does not show enough of the file to answer: read further back.
    NeedMore,
    /// The conversation does not hold the anchor.
    Gone,
}

/// A transcript read so far.
#[derive(Clone, Debug)]
pub struct Transcript {
    items: Vec<Item>,
    nodes: Vec<Node>,
    /// Every chain line read (and every item position) → where its children lead.
    lines: HashMap<String, Link>,
    /// `message.id` → its reply item.
    by_message: HashMap<String, usize>,
    /// `toolu_…` → (reply item, tool index).
    by_tool: HashMap<String, (usize, usize)>,
    /// UUIDs of the messages the file proves delivered ([`crate::proof`]), on every
    /// branch.
    user_uuids: HashSet<String>,
    /// The UUIDs that key the rows of messages absorbed mid-turn.
    absorbed_ids: HashSet<String>,
    /// The conversation: item indices from its root to its newest item.
    path: Vec<usize>,
    /// True when the first entry of the file is a sidechain entry (a subagent file).
    sidechain_file: Option<bool>,
    /// The newest item that is not a sidechain item.
    last_main: Option<usize>,
    /// The file offset of the first byte not read yet.
    read_to: u64,
    /// This reader starts at the file's first byte: a line it has not read is not in
    /// the file.
    from_start: bool,
    session_id: Option<String>,
    agent_id: Option<String>,
    last_time: Millis,
    diagnostics: Diagnostics,
}

impl Transcript {
    /// An empty transcript (a file that does not exist reads as this: an empty
    /// conversation).
    pub fn new() -> Transcript {
        Transcript::starting_at(0, None)
    }

    /// A reader of the part of a file that starts at `offset` (a line start), for a
    /// file whose first entry is a sidechain entry when `sidechain_file`. What it reads
    /// is placed as the whole file's reader places it; what its part cannot show (a
    /// parent before `offset`) is [`Link::Unread`].
    pub(crate) fn window(offset: u64, sidechain_file: bool) -> Transcript {
        Transcript::starting_at(offset, Some(sidechain_file))
    }

    fn starting_at(offset: u64, sidechain_file: Option<bool>) -> Transcript {
        Transcript {
            items: Vec::new(),
            nodes: Vec::new(),
            lines: HashMap::new(),
            by_message: HashMap::new(),
            by_tool: HashMap::new(),
            user_uuids: HashSet::new(),
            absorbed_ids: HashSet::new(),
            path: Vec::new(),
            sidechain_file,
            last_main: None,
            read_to: offset,
            from_start: offset == 0,
            session_id: None,
            agent_id: None,
            last_time: Millis(0),
            diagnostics: Diagnostics::default(),
        }
    }

    /// Reads `bytes`, the unread part of the file, and returns how many bytes it used:
    /// every line that ends with a newline. The rest (a last line still being written)
    /// is for the next call, together with what follows it.
    pub fn feed(&mut self, bytes: &[u8]) -> usize {
        let mut consumed = 0usize;
        let mut rest = bytes;
        while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
            let (line, tail) = rest.split_at(nl);
            let at = self.read_to.saturating_add(consumed as u64);
            self.line(line, at);
            consumed = consumed.saturating_add(nl + 1);
            rest = tail.get(1..).unwrap_or_default();
        }
        self.read_to = self.read_to.saturating_add(consumed as u64);
        self.refresh_path();
        consumed
    }

    /// Reads `bytes`, the unread part of a file that is complete: like
    /// [`Transcript::feed`], and a last line without its newline is read as a line
    /// too (one malformed line when it is not a whole entry). Returns `bytes.len()`.
    pub fn finish(&mut self, bytes: &[u8]) -> usize {
        let used = self.feed(bytes);
        let rest = bytes.get(used..).unwrap_or_default();
        if !rest.is_empty() {
            self.line(rest, self.read_to);
            self.read_to = self.read_to.saturating_add(rest.len() as u64);
            self.refresh_path();
        }
        bytes.len()
    }

    /// The file offset of the first byte not read yet.
    pub fn read_to(&self) -> u64 {
        self.read_to
    }

    /// Every item read, oldest first, on every branch (including those before the last
    /// compaction and the sidechain items of an old main file).
    pub fn items(&self) -> &[Item] {
        &self.items
    }

    /// The conversation (see the module doc), oldest first, with ordinals.
    pub fn visible_items(&self) -> impl DoubleEndedIterator<Item = (u64, &Item)> {
        self.path
            .iter()
            .filter_map(|&i| self.items.get(i))
            .map(|it| (it.offset, it))
    }

    /// The rows of the conversation, oldest first.
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

    /// True when the file's first entry is a sidechain entry (a subagent file); `None`
    /// before an entry was read.
    pub fn is_sidechain_file(&self) -> Option<bool> {
        self.sidechain_file
    }

    /// True when the file proves the message with this UUID delivered, on any branch
    /// (the Claude delivery proof): a `user` entry with it, a merged entry listing it in
    /// `mergedSendUuids`, or the message absorbed into a running turn (see
    /// [`crate::proof`]).
    pub fn has_user_message(&self, uuid: &str) -> bool {
        self.user_uuids.contains(uuid) || self.user_uuids.contains(&uuid.to_ascii_lowercase())
    }

    /// The index (in [`Transcript::items`]) of the item holding the chain line `uuid`.
    pub fn item_of(&self, uuid: &str) -> Option<usize> {
        match self.lines.get(uuid) {
            Some(Link::Item(i)) => Some(*i),
            _ => None,
        }
    }

    /// The place in the conversation of the item holding `uuid`.
    fn place(&self, uuid: &str) -> Result<usize, PageError> {
        self.item_of(uuid)
            .and_then(|i| self.nodes.get(i))
            .and_then(|n| n.on_path)
            .ok_or_else(|| PageError::PositionGone(uuid.to_owned()))
    }

    /// Up to `limit` items older than the item holding `before` (`None`: the newest),
    /// newest first, from the conversation only. A `before` the conversation does not
    /// hold is [`PageError::PositionGone`].
    pub fn page_before(&self, before: Option<&str>, limit: usize) -> Result<Page<'_>, PageError> {
        let end = match before {
            None => self.path.len(),
            Some(uuid) => self.place(uuid)?,
        };
        let start = end.saturating_sub(limit);
        let items = self
            .path
            .get(start..end)
            .unwrap_or_default()
            .iter()
            .rev()
            .filter_map(|&i| self.items.get(i))
            .map(|it| (it.offset, it))
            .collect();
        Ok(Page {
            items,
            more: start > 0,
        })
    }

    /// Up to `limit` items newer than the item holding `after`, oldest first, and
    /// whether newer ones follow.
    pub fn page_after(&self, after: &str, limit: usize) -> Result<Page<'_>, PageError> {
        let start = self.place(after)?.saturating_add(1);
        let end = start.saturating_add(limit).min(self.path.len());
        let items = self
            .path
            .get(start..end)
            .unwrap_or_default()
            .iter()
            .filter_map(|&i| self.items.get(i))
            .map(|it| (it.offset, it))
            .collect();
        Ok(Page {
            items,
            more: end < self.path.len(),
        })
    }

    /// The newest item of the conversation.
    fn head(&self) -> Option<usize> {
        match self.sidechain_file {
            Some(true) => self.items.len().checked_sub(1),
            _ => self.last_main,
        }
    }

    /// Brings the conversation up to date: from the newest item up to the first item
    /// already on it (parents are read before children, so this equals a walk from
    /// scratch).
    fn refresh_path(&mut self) {
        let head = self.head();
        if head == self.path.last().copied() {
            return;
        }
        let mut segment = Vec::new();
        let mut junction = None;
        let mut cur = head;
        while let Some(i) = cur {
            let Some(node) = self.nodes.get(i) else {
                break;
            };
            if let Some(p) = node.on_path {
                junction = Some(p);
                break;
            }
            segment.push(i);
            cur = match node.parent {
                Link::Item(p) => Some(p),
                Link::Root | Link::Unread => None,
            };
        }
        let keep = junction.map_or(0, |p| p.saturating_add(1));
        for &i in self.path.get(keep..).unwrap_or_default() {
            if let Some(n) = self.nodes.get_mut(i) {
                n.on_path = None;
            }
        }
        self.path.truncate(keep);
        for i in segment.into_iter().rev() {
            if let Some(n) = self.nodes.get_mut(i) {
                n.on_path = Some(self.path.len());
            }
            self.path.push(i);
        }
    }

    /// The page of a window read: walks the conversation from its newest item like
    /// [`Transcript::page_before`] and [`Transcript::page_after`] do, but says
    /// [`Walk::NeedMore`] wherever the window cannot show what a read of the whole file
    /// shows (a parent before the window, a tool result whose call may be before it, no
    /// main item at all). Pages of [`Anchor::After`] come oldest first.
    pub(crate) fn walk(&self, anchor: Anchor<'_>, limit: usize) -> Walk {
        let whole = self.from_start;
        let Some(head) = self.head() else {
            return match (whole, anchor) {
                (false, _) => Walk::NeedMore,
                (true, Anchor::Latest) => Walk::Page(Vec::new(), false),
                (true, _) => Walk::Gone,
            };
        };
        let target = match anchor {
            Anchor::Latest => None,
            Anchor::Before(uuid) | Anchor::After(uuid) => match self.item_of(uuid) {
                Some(i) => Some(i),
                None if whole => return Walk::Gone,
                None => return Walk::NeedMore,
            },
        };
        let after = matches!(anchor, Anchor::After(_));
        // Before: skip down to the target, then collect. After: collect (keeping the
        // `limit + 1` nearest) down to the target.
        let mut skipping = target.is_some() && !after;
        let mut out: std::collections::VecDeque<usize> = std::collections::VecDeque::new();
        let mut dropped = false;
        let mut cur = Some(head);
        while let Some(i) = cur {
            let Some(node) = self.nodes.get(i) else {
                break;
            };
            if after && Some(i) == target {
                let more = dropped || out.len() > limit;
                return Walk::Page(out.into_iter().rev().take(limit).collect(), more);
            }
            if !whole && node.orphan {
                // Its result may belong to a reply before the window, and the item
                // that leads here may be the rest of that reply.
                return Walk::NeedMore;
            }
            if skipping {
                skipping = Some(i) != target;
            } else if !after && out.len() == limit {
                return Walk::Page(out.into(), true);
            } else {
                out.push_back(i);
                if after && out.len() > limit.saturating_add(1) {
                    out.pop_front();
                    dropped = true;
                }
            }
            cur = match node.parent {
                Link::Item(p) => Some(p),
                Link::Root => None,
                Link::Unread if whole => None,
                Link::Unread => return Walk::NeedMore,
            };
        }
        if skipping || after {
            Walk::Gone
        } else {
            Walk::Page(out.into(), false)
        }
    }

    /// Takes the items out (for a window read that built its page).
    pub(crate) fn into_items(self) -> Vec<Item> {
        self.items
    }

    /// Where the children of a line whose parent is `parent` lead.
    fn resolve(&self, parent: Option<&str>) -> Link {
        match parent.filter(|p| !p.trim().is_empty()) {
            None => Link::Root,
            Some(p) => self.lines.get(p).copied().unwrap_or(Link::Unread),
        }
    }

    /// Appends an item whose first line has UUID `item.position` and parent `parent`.
    /// Positions are unique: a UUID already used (Claude writes each once; hand-made
    /// files may not) becomes `<uuid>#<offset>`.
    fn push_item(&mut self, mut item: Item, parent: Link, orphan: bool) -> usize {
        let idx = self.items.len();
        if self.lines.contains_key(&item.position) {
            item.position = format!("{}#{}", item.position, item.offset);
        }
        self.lines.insert(item.position.clone(), Link::Item(idx));
        if !item.sidechain {
            self.last_main = Some(idx);
        }
        self.items.push(item);
        self.nodes.push(Node {
            parent,
            orphan,
            on_path: None,
        });
        idx
    }

    fn line(&mut self, line: &[u8], offset: u64) {
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
        let proofs = &mut self.user_uuids;
        raw.marks(&kind).delivered(|u| {
            proofs.insert(u.to_owned());
        });
        if METADATA_TYPES.contains(&kind.as_str()) {
            d.skipped.add(&kind);
            return;
        }
        let users_message = raw.is_meta != Some(true)
            && raw
                .attachment
                .as_ref()
                .is_some_and(Attachment::is_users_message);
        if kind == "attachment" && users_message && self.absorbed(&raw, offset) {
            return;
        }
        let d = &mut self.diagnostics;
        if ROWLESS_CHAIN_TYPES.contains(&kind.as_str()) {
            d.skipped.add(&kind);
            if let Some(uuid) = raw.uuid.filter(|u| !u.trim().is_empty()) {
                let link = self.resolve(raw.parent_uuid.as_deref());
                self.lines.entry(uuid).or_insert(link);
            }
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
        if self.sidechain_file.is_none() {
            self.sidechain_file = Some(raw.is_sidechain == Some(true));
        }
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
        let head = Head {
            uuid,
            at,
            offset,
            parent: self.resolve(raw.parent_uuid.as_deref()),
            sidechain: raw.is_sidechain == Some(true),
        };
        match kind.as_str() {
            "user" => self.user(raw, head),
            "assistant" => self.assistant(raw, head),
            _ => self.system(raw, head),
        }
    }

    fn user(&mut self, raw: RawEntry, head: Head) {
        let Head {
            uuid,
            at,
            offset,
            parent,
            sidechain,
        } = head;
        self.diagnostics.parsed.add("user");
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
            let mut orphans = 0usize;
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
                        orphans = orphans.saturating_add(1);
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
            // In a window read, a result whose call was not read may belong to a reply
            // before the window: where this line leads is unknown there.
            let unsure = orphans > 0 && !self.from_start;
            match home {
                Some(item) => {
                    let link = if unsure {
                        Link::Unread
                    } else {
                        Link::Item(item)
                    };
                    self.lines.entry(uuid).or_insert(link);
                }
                None => {
                    let item = Item {
                        position: uuid.clone(),
                        timestamp: at,
                        offset,
                        sidechain,
                        kind: ItemKind::Hidden { uuid },
                    };
                    self.push_item(item, parent, unsure);
                }
            }
            return;
        }
        let kind = match (hidden, content.user_text()) {
            (false, Some(_)) if content.is_interruption_marker() => {
                ItemKind::Interrupted { uuid: uuid.clone() }
            }
            (false, Some(text)) => ItemKind::Prompt {
                uuid: uuid.clone(),
                text,
            },
            _ => ItemKind::Hidden { uuid: uuid.clone() },
        };
        let item = Item {
            position: uuid,
            timestamp: at,
            offset,
            sidechain,
            kind,
        };
        self.push_item(item, parent, false);
    }

    /// Reads a `queued_command` attachment that is the user's message as an
    /// [`ItemKind::Absorbed`] item; false (nothing done) when it has no UUID or no text,
    /// and it is then read as a rowless chain line.
    fn absorbed(&mut self, raw: &RawEntry, offset: u64) -> bool {
        let Some(position) = raw.uuid.clone().filter(|u| !u.trim().is_empty()) else {
            return false;
        };
        let Some(attachment) = raw.attachment.as_ref() else {
            return false;
        };
        let text = attachment
            .prompt
            .clone()
            .and_then(|p| serde_json::from_value::<Content>(p).ok())
            .and_then(|c| c.user_text());
        let Some(text) = text else {
            return false;
        };
        self.diagnostics.parsed.add("attachment");
        let at = raw
            .timestamp
            .as_deref()
            .and_then(parse_timestamp)
            .unwrap_or(self.last_time);
        self.last_time = at;
        // A UUID the file already used for a user row (hand-made or trimmed files
        // repeat them; Claude does not) becomes `<uuid>#<offset>`, as a position does.
        let mut uuid = attachment
            .source_uuid()
            .map_or_else(|| position.clone(), str::to_owned);
        if self.lines.contains_key(&uuid) || !self.absorbed_ids.insert(uuid.clone()) {
            uuid = format!("{uuid}#{offset}");
        }
        let parent = self.resolve(raw.parent_uuid.as_deref());
        let item = Item {
            position,
            timestamp: at,
            offset,
            sidechain: raw.is_sidechain == Some(true),
            kind: ItemKind::Absorbed { uuid, text },
        };
        self.push_item(item, parent, false);
        true
    }

    fn assistant(&mut self, raw: RawEntry, head: Head) {
        let Head {
            uuid,
            at,
            offset,
            parent,
            sidechain,
        } = head;
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
                let item = Item {
                    position: uuid.clone(),
                    timestamp: at,
                    offset,
                    sidechain,
                    kind: ItemKind::Reply(Reply {
                        message_id: message_id.clone(),
                        ..Reply::default()
                    }),
                };
                let i = self.push_item(item, parent, false);
                self.by_message.insert(message_id, i);
                i
            }
        };
        self.lines.entry(uuid.clone()).or_insert(Link::Item(idx));
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

    fn system(&mut self, raw: RawEntry, head: Head) {
        let Head {
            uuid,
            at,
            offset,
            parent,
            sidechain,
        } = head;
        let subtype = raw.subtype.unwrap_or_default();
        self.diagnostics.parsed.add(&format!("system/{subtype}"));
        let text = raw.content.and_then(|c| c.as_str().map(str::to_owned));
        let item = Item {
            position: uuid.clone(),
            timestamp: at,
            offset,
            sidechain,
            kind: ItemKind::System {
                uuid,
                subtype,
                text,
            },
        };
        self.push_item(item, parent, false);
    }
}

impl Default for Transcript {
    fn default() -> Transcript {
        Transcript::new()
    }
}

/// What every entry line gives its item.
struct Head {
    uuid: String,
    at: Millis,
    offset: u64,
    parent: Link,
    sidechain: bool,
}
