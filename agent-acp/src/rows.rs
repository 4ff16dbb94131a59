//! ACP session updates into rows: one projection for live turns and for the replay of
//! `session/load`, so both give a turn's rows the same keys.
//!
//! Keys, per session: the user message of turn `n` is `acp-user-<n>`; consecutive agent
//! message chunks are one reply row `acp-reply-<n>-<k>` (a tool call or a thought
//! between them starts segment `k + 1`); thought chunks are one thinking row
//! `acp-thought-<n>-<k>`; a tool call is the activity row `acp-tool-<toolCallId>`, its
//! updates merged in; the plan of a turn is the activity row `acp-plan-<n>` (each plan
//! replaces the one before, as ACP says). Updates that are not conversation (commands,
//! modes, usage, configuration, session info) give no row and are counted, as are the
//! records of local commands Claude Code ran that `claude-agent-acp` replays as user
//! chunks (`<command-name>`, `<local-command-stdout>`).

use std::collections::BTreeMap;

use agent_client_protocol::v1::schema::{
    ContentBlock, Plan, PlanEntryStatus, SessionUpdate, ToolCall, ToolCallContent, ToolCallStatus,
    ToolCallUpdate, ToolKind,
};
use serde_json::{json, Value};
use timeline_core::block::Block;
use timeline_core::key::{BlockKey, BlockType, OperationId};
use timeline_core::time::Millis;

/// The words of a content block: its text, or what it names.
pub fn content_text(c: &ContentBlock) -> String {
    match c {
        ContentBlock::Text(t) => t.text.clone(),
        ContentBlock::ResourceLink(l) => format!("[{}]({})", l.name, l.uri),
        ContentBlock::Image(_) => "[image]".to_owned(),
        ContentBlock::Audio(_) => "[audio]".to_owned(),
        ContentBlock::Resource(_) => "[resource]".to_owned(),
        _ => "[content]".to_owned(),
    }
}

fn tool_content_text(c: &[ToolCallContent]) -> String {
    let mut out = Vec::new();
    for part in c {
        match part {
            ToolCallContent::Content(c) => out.push(content_text(&c.content)),
            ToolCallContent::Diff(d) => out.push(format!("diff {}", d.path.display())),
            ToolCallContent::Terminal(t) => out.push(format!("terminal {}", t.terminal_id)),
            _ => out.push("[content]".to_owned()),
        }
    }
    out.join("\n")
}

/// The wire word of a tool kind (`execute`, `edit`, ...).
pub fn kind_word(k: ToolKind) -> String {
    serde_json::to_value(k)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| "other".to_owned())
}

fn status_word(s: ToolCallStatus) -> String {
    serde_json::to_value(s)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| "pending".to_owned())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Last {
    User,
    Reply,
    Thought,
    Other,
}

/// What one update did to the rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// This row was added or changed (the key of the projector's row).
    Row(BlockKey),
    /// Not conversation: no row.
    Skipped,
}

/// The projection of one session's updates. See the module doc.
#[derive(Clone, Debug)]
pub struct Projector {
    /// The turn the next rows belong to.
    turn: u64,
    segment: u64,
    last: Last,
    /// Whether any turn started (a replay's first user chunk starts turn 0).
    started: bool,
    rows: BTreeMap<BlockKey, Block>,
    order: Vec<BlockKey>,
}

impl Projector {
    /// A projector whose next turn is `turn`.
    pub fn new(turn: u64) -> Projector {
        Projector {
            turn,
            segment: 0,
            last: Last::Other,
            started: false,
            rows: BTreeMap::new(),
            order: Vec::new(),
        }
    }

    /// The turns begun so far (the next live turn's number).
    pub fn turns(&self) -> u64 {
        if self.started {
            self.turn + 1
        } else {
            self.turn
        }
    }

    /// Starts a live turn for the user's message `text` (its operation, when the host
    /// sent it): the user row.
    pub fn start_turn(&mut self, text: &str, op: Option<&OperationId>, now: Millis) -> BlockKey {
        if self.started {
            self.turn += 1;
        }
        self.started = true;
        self.segment = 0;
        self.last = Last::User;
        let key = key(BlockType::User, &format!("acp-user-{}", self.turn));
        let mut block = Block::new(key.clone(), now).with_data(json!({ "text": text }));
        if let Some(op) = op {
            block = block.with_operation(op.clone());
        }
        self.put(block);
        key
    }

    /// One update. `live`: the host's own prompt opened the turn, so a user chunk is
    /// the agent's echo of it (no new turn); in a replay a user chunk after anything
    /// else starts the next turn.
    pub fn update(&mut self, u: &SessionUpdate, live: bool, now: Millis) -> Step {
        match u {
            SessionUpdate::UserMessageChunk(c) => {
                if live {
                    // The echo of the prompt the host wrote: the user row is already
                    // there.
                    return Step::Skipped;
                }
                let text = content_text(&c.content);
                if is_local_command(&text) {
                    return Step::Skipped;
                }
                if self.last != Last::User {
                    if self.started {
                        self.turn += 1;
                    }
                    self.started = true;
                    self.segment = 0;
                }
                self.last = Last::User;
                let k = key(BlockType::User, &format!("acp-user-{}", self.turn));
                Step::Row(self.append(k, &text, now))
            }
            SessionUpdate::AgentMessageChunk(c) => {
                let text = content_text(&c.content);
                if text.is_empty() {
                    // An empty chunk (claude-agent-acp opens each reply with one): no row.
                    return Step::Skipped;
                }
                self.begin(Last::Reply);
                let k = key(
                    BlockType::AgentReply,
                    &format!("acp-reply-{}-{}", self.turn, self.segment),
                );
                Step::Row(self.append(k, &text, now))
            }
            SessionUpdate::AgentThoughtChunk(c) => {
                let text = content_text(&c.content);
                if text.is_empty() {
                    // An empty chunk (claude-agent-acp opens each reply with one): no row.
                    return Step::Skipped;
                }
                self.begin(Last::Thought);
                let k = key(
                    BlockType::Thinking,
                    &format!("acp-thought-{}-{}", self.turn, self.segment),
                );
                Step::Row(self.append(k, &text, now))
            }
            SessionUpdate::ToolCall(t) => {
                self.begin(Last::Other);
                Step::Row(self.tool_call(t, now))
            }
            SessionUpdate::ToolCallUpdate(t) => {
                self.begin(Last::Other);
                Step::Row(self.tool_update(t, now))
            }
            SessionUpdate::Plan(p) => {
                self.begin(Last::Other);
                Step::Row(self.plan(p, now))
            }
            _ => Step::Skipped,
        }
    }

    fn begin(&mut self, now: Last) {
        self.started = true;
        if self.last != now && matches!(self.last, Last::Reply | Last::Thought) {
            self.segment += 1;
        }
        self.last = now;
    }

    fn put(&mut self, block: Block) {
        let k = block.key();
        if self.rows.insert(k.clone(), block).is_none() {
            self.order.push(k);
        }
    }

    fn append(&mut self, k: BlockKey, text: &str, now: Millis) -> BlockKey {
        // The text grows in place: a chunk costs its own length, not the row's.
        match self.rows.get_mut(&k).map(|b| b.data.get_mut("text")) {
            Some(Some(Value::String(t))) => t.push_str(text),
            _ => self.put(Block::new(k.clone(), now).with_data(json!({ "text": text }))),
        }
        k
    }

    fn tool_call(&mut self, t: &ToolCall, now: Millis) -> BlockKey {
        let k = key(
            BlockType::Activity,
            &format!("acp-tool-{}", t.tool_call_id.0),
        );
        let data = json!({
            "text": t.title,
            "title": t.title,
            "kind": kind_word(t.kind),
            "status": status_word(t.status),
            "output": tool_content_text(&t.content),
        });
        let at = self.rows.get(&k).map_or(now, |b| b.timestamp);
        self.put(Block::new(k.clone(), at).with_data(data));
        k
    }

    fn tool_update(&mut self, t: &ToolCallUpdate, now: Millis) -> BlockKey {
        let k = key(
            BlockType::Activity,
            &format!("acp-tool-{}", t.tool_call_id.0),
        );
        let mut b = self.rows.get(&k).cloned().unwrap_or_else(|| {
            Block::new(k.clone(), now).with_data(json!({
                "text": "", "title": "", "kind": "other", "status": "pending", "output": "",
            }))
        });
        let f = &t.fields;
        if let Some(title) = &f.title {
            b.data["title"] = json!(title);
            b.data["text"] = json!(title);
        }
        if let Some(kind) = f.kind {
            b.data["kind"] = json!(kind_word(kind));
        }
        if let Some(status) = f.status {
            b.data["status"] = json!(status_word(status));
        }
        if let Some(content) = &f.content {
            b.data["output"] = json!(tool_content_text(content));
        }
        self.put(b);
        k
    }

    fn plan(&mut self, p: &Plan, now: Millis) -> BlockKey {
        let k = key(BlockType::Activity, &format!("acp-plan-{}", self.turn));
        let entries: Vec<Value> = p
            .entries
            .iter()
            .map(|e| {
                let done = matches!(e.status, PlanEntryStatus::Completed);
                json!({ "content": e.content, "done": done })
            })
            .collect();
        let text = p
            .entries
            .iter()
            .map(|e| e.content.as_str())
            .collect::<Vec<_>>()
            .join("\n");
        let at = self.rows.get(&k).map_or(now, |b| b.timestamp);
        self.put(Block::new(k.clone(), at).with_data(json!({
            "text": text, "title": "Plan", "kind": "plan", "entries": entries,
        })));
        k
    }

    /// The row under `key`.
    pub fn row(&self, k: &BlockKey) -> Option<&Block> {
        self.rows.get(k)
    }

    /// Every row in the order first seen, and forgets them (the turn's rows went to
    /// history); the turn count stays.
    pub fn take_rows(&mut self) -> Vec<Block> {
        let order = std::mem::take(&mut self.order);
        let mut rows = std::mem::take(&mut self.rows);
        order.into_iter().filter_map(|k| rows.remove(&k)).collect()
    }
}

/// Claude Code's record of a local command it ran (`/model` when its agent SDK opens a
/// session), which `claude-agent-acp` 0.23 replays as user message chunks: not the
/// user's words.
fn is_local_command(text: &str) -> bool {
    let t = text.trim_start();
    t.starts_with("<command-name>") || t.starts_with("<local-command-")
}

fn key(t: BlockType, id: &str) -> BlockKey {
    BlockKey::parse(t, id).expect("the IDs built here are never blank")
}
