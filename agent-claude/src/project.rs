//! Live projection (sans-IO): stream-json lines into timeline rows, packed-history
//! delta events and delivery evidence.
//!
//! Drive loop, in order:
//! 1. the host decodes a line with [`crate::stream::StreamDecoder::decode`];
//! 2. [`Projector::handle_line`] takes it with `now` (the time the host read it);
//! 3. the host drains [`Projector::poll_effect`] until `None`: rows to write to the
//!    live overlay ([`Output::Row`], a whole row each time, keyed like its saved twin in
//!    the transcript: both paths build rows alike), delta events for the packed-history path
//!    ([`Output::Event`], one `assistant/*-delta` [`SessionEvent`] per fragment),
//!    delivery evidence ([`Output::Proof`]), the turn's end, permission requests.
//!
//! Rows come from the authoritative frames only (`assistant` carries each content block
//! whole, `user` carries tool results, the replayed echo and the interruption marker,
//! which is the interrupted-turn system row and not a user row); fragments come from
//! `stream_event` deltas only, so a stream without partial messages still gives every
//! row. Frames of a subagent (`parent_tool_use_id` set) belong to another timeline
//! target and are counted in [`Projector::subagent_frames`], not projected here.
//!
//! Merged messages: Claude Code 2.1.328 merges the messages queued behind a turn into
//! one user turn when it takes them (B, C and D become one entry under D's UUID, its
//! text their texts joined by newlines, `mergedSendUuids` naming B and C). It first
//! replays B and C on their own, without a `timestamp` (every other echo has one), then
//! D with the merged text. The transcript keeps only D's entry, so the live rows must
//! show only D's row, with the merged words, once. An echo without a `timestamp` is
//! therefore held back: the echo that merges it (its text starts with the held texts,
//! each followed by a newline) drops it; anything else of the turn (another echo, a
//! reply, a tool result, the turn's end, a prompt) or [`Projector::flush`] shows it
//! first, so no message is ever left without its row.
//!
//! Invariants: a row keeps the timestamp and live sequence (`[2, sequence]`) it got when
//! it first appeared, so every later upsert places it the same way; delta sequence
//! numbers increase by one from the host's base; a held echo is shown before any later
//! row, or dropped for the merged row that carries its words.
//!
//! ```
//! use agent_claude::project::{Output, Projector};
//! use agent_claude::stream::StreamDecoder;
//! use timeline_core::time::Millis;
//!
//! let mut dec = StreamDecoder::new();
//! let mut p = Projector::new("session-1", 1);
//! for line in [
//!     r#"{"type":"stream_event","event":{"type":"message_start","message":{"id":"msg_1"}}}"#,
//!     r#"{"type":"stream_event","event":{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}}"#,
//!     r#"{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"po"}}}"#,
//!     r#"{"type":"assistant","uuid":"a1","message":{"id":"msg_1","content":[{"type":"text","text":"pong"}]}}"#,
//! ] {
//!     if let Some(l) = dec.decode(line.as_bytes()) {
//!         p.handle_line(&l, Millis(5));
//!     }
//! }
//! let out: Vec<Output> = std::iter::from_fn(|| p.poll_effect()).collect();
//! assert!(matches!(&out[0], Output::Event(e) if e.text.as_deref() == Some("po")));
//! assert!(matches!(&out[1], Output::Row(b) if b.data["text"] == "pong"));
//! ```

use std::collections::{HashMap, VecDeque};

use timeline_core::block::Block;
use timeline_core::history::{DeltaKind, SessionEvent};
use timeline_core::key::BlockKey;
use timeline_core::order::SourceOrder;
use timeline_core::time::Millis;

use crate::blocks::{self, ToolCall, ToolResult};
use crate::content::ContentBlock;
use crate::proof::{evidence, Evidence};
use crate::stream::{ControlRequest, Delta, ResultFrame, StreamEvent, StreamLine};

/// What the projection asks the host to do.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Output {
    /// Claude started (`system/init`).
    Started {
        /// Claude's session ID.
        claude_session: String,
        /// The Claude Code version it states.
        version: Option<String>,
    },
    /// Write this row to the live overlay (it replaces the row with the same key).
    Row(Block),
    /// A delta for the packed-history path.
    Event(SessionEvent),
    /// A line named a sent message.
    Proof(Evidence),
    /// The turn ended.
    TurnEnded(ResultFrame),
    /// Claude asks the host (a tool permission).
    Permission(ControlRequest),
    /// Claude withdrew the request with this ID (`control_cancel_request`).
    PermissionWithdrawn(String),
}

/// What a content block index of the current message feeds.
#[derive(Clone, Debug)]
struct Target {
    kind: DeltaKind,
    block: String,
}

/// A replayed echo held back until it is known whether a merged message carries it.
struct HeldEcho {
    uuid: String,
    text: String,
    at: Millis,
}

#[derive(Default)]
struct MessageRows {
    text: Vec<String>,
    thinking: Vec<String>,
}

/// The live projection of one Claude run.
pub struct Projector {
    session: String,
    next_seq: u64,
    next_live: u64,
    placed: HashMap<BlockKey, (Millis, u64)>,
    message_id: Option<String>,
    /// Content block index → what its deltas feed (a message has a handful of
    /// blocks: a list is faster than a map).
    targets: Vec<(u64, Target)>,
    messages: HashMap<String, MessageRows>,
    tools: HashMap<String, ToolCall>,
    subagent_frames: u64,
    /// Echoes that may be merged into the next one (see the module doc), oldest first.
    held: Vec<HeldEcho>,
    out: VecDeque<Output>,
}

impl Projector {
    /// A projection for the host session `session`; delta events are numbered from
    /// `first_seq`.
    pub fn new(session: &str, first_seq: u64) -> Projector {
        Projector {
            session: session.to_owned(),
            next_seq: first_seq,
            next_live: 0,
            placed: HashMap::new(),
            message_id: None,
            targets: Vec::new(),
            messages: HashMap::new(),
            tools: HashMap::new(),
            subagent_frames: 0,
            held: Vec::new(),
            out: VecDeque::new(),
        }
    }

    /// True while an echo is held back (see the module doc).
    pub fn holds_echo(&self) -> bool {
        !self.held.is_empty()
    }

    /// Shows the echoes held back (the run's process ended, nothing more comes).
    pub fn flush(&mut self) {
        for h in std::mem::take(&mut self.held) {
            self.user_row(&h.uuid, &h.text, h.at);
        }
    }

    /// The next output, oldest first.
    #[must_use]
    pub fn poll_effect(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    /// The old name of [`Self::poll_effect`].
    #[deprecated(note = "renamed poll_effect: one name for every machine's output")]
    #[must_use]
    pub fn poll_output(&mut self) -> Option<Output> {
        self.poll_effect()
    }

    /// Frames of subagents seen (not projected into this target).
    pub fn subagent_frames(&self) -> u64 {
        self.subagent_frames
    }

    /// The sequence number the next delta event gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Takes one decoded line read at `now`.
    pub fn handle_line(&mut self, line: &StreamLine, now: Millis) {
        let sub = match line {
            StreamLine::Assistant(a) => a.parent_tool_use_id.is_some(),
            StreamLine::User(u) => u.parent_tool_use_id.is_some(),
            StreamLine::Event(e) => e.parent_tool_use_id.is_some(),
            _ => false,
        };
        if sub {
            self.subagent_frames = self.subagent_frames.saturating_add(1);
            return;
        }
        if let Some(ev) = evidence(line) {
            self.out.push_back(Output::Proof(ev));
        }
        match line {
            StreamLine::Init(i) => self.out.push_back(Output::Started {
                claude_session: i.session_id.clone(),
                version: i.version.clone(),
            }),
            StreamLine::Event(e) => {
                // The reply starting shows the held echoes (no merge comes after it);
                // a streamed fragment is no row and shows nothing early.
                if matches!(e.event, StreamEvent::MessageStart { .. }) {
                    self.flush();
                }
                self.event(&e.event, now);
            }
            StreamLine::Assistant(a) => {
                self.flush();
                let Some(id) = a.message.id.clone() else {
                    return;
                };
                for b in a.message.content.blocks() {
                    self.assistant_block(&id, b, now);
                }
            }
            StreamLine::User(u) => match &u.message.content {
                c if c.has_tool_results() => {
                    self.flush();
                    for b in c.blocks() {
                        if let ContentBlock::ToolResult {
                            tool_use_id,
                            content,
                            is_error,
                        } = b
                        {
                            self.tool_result(tool_use_id, content, *is_error, u.uuid.clone(), now);
                        }
                    }
                }
                // The interruption marker: the interrupted-turn row, keyed by the
                // marker's UUID like its transcript twin, not a user row.
                c if c.is_interruption_marker() => {
                    self.flush();
                    if let Some(uuid) = &u.uuid {
                        self.interrupted(uuid, now);
                    }
                }
                c => {
                    if let (Some(uuid), Some(text)) = (&u.uuid, c.user_text()) {
                        if u.is_replay && u.timestamp.is_none() {
                            // Perhaps merged into the next echo: wait for it.
                            self.held.push(HeldEcho {
                                uuid: uuid.clone(),
                                text,
                                at: now,
                            });
                        } else {
                            self.merge_held(&text);
                            self.user_row(uuid, &text, now);
                        }
                    }
                }
            },
            StreamLine::Result(r) => {
                self.flush();
                self.targets.clear();
                self.message_id = None;
                self.out.push_back(Output::TurnEnded(r.clone()));
            }
            StreamLine::ControlRequest(c) => {
                self.flush();
                self.out.push_back(Output::Permission(c.clone()));
            }
            StreamLine::ControlCancel(id) => {
                self.out.push_back(Output::PermissionWithdrawn(id.clone()));
            }
            _ => {}
        }
    }

    /// Where a row with `key` is placed: the time and live sequence it got when it
    /// first appeared in this run (given now if it is new). Rows the host adds to the
    /// run (an approval card) take their place from here too.
    pub fn placement(&mut self, key: BlockKey, now: Millis) -> (Millis, u64) {
        self.place(key, now)
    }

    fn place(&mut self, key: BlockKey, now: Millis) -> (Millis, u64) {
        let next = &mut self.next_live;
        *self.placed.entry(key).or_insert_with(|| {
            let seq = *next;
            *next = next.saturating_add(1);
            (now, seq)
        })
    }

    fn place_user(&mut self, uuid: &str, now: Millis) -> (Millis, u64) {
        match timeline_core::key::OperationId::new(uuid) {
            Ok(op) => self.place(BlockKey::user_message(&op), now),
            Err(_) => (now, self.next_live),
        }
    }

    fn user_row(&mut self, uuid: &str, text: &str, now: Millis) {
        let (at, seq) = self.place_user(uuid, now);
        if let Some(b) = blocks::user_block(uuid, at, SourceOrder::live(seq), text) {
            self.out.push_back(Output::Row(b));
        }
    }

    /// The echo with `text` came: the held echoes it merged (the last ones, whose texts
    /// it starts with, each followed by a newline) are dropped; the older ones are
    /// shown first.
    fn merge_held(&mut self, text: &str) {
        let merged_from = (0..self.held.len()).find(|&from| {
            let mut rest = text;
            self.held[from..].iter().all(|h| {
                match rest
                    .strip_prefix(h.text.as_str())
                    .and_then(|r| r.strip_prefix('\n'))
                {
                    Some(r) => {
                        rest = r;
                        true
                    }
                    None => false,
                }
            })
        });
        let held = std::mem::take(&mut self.held);
        let keep = merged_from.unwrap_or(held.len());
        for h in held.into_iter().take(keep) {
            self.user_row(&h.uuid, &h.text, h.at);
        }
    }

    fn interrupted(&mut self, uuid: &str, now: Millis) {
        let Ok(key) = BlockKey::parse(timeline_core::key::BlockType::System, uuid) else {
            return;
        };
        let (at, seq) = self.place(key, now);
        self.out
            .extend(blocks::interrupted_block(uuid, at, SourceOrder::live(seq)).map(Output::Row));
    }

    fn event(&mut self, event: &StreamEvent, now: Millis) {
        match event {
            StreamEvent::MessageStart { message_id } => {
                self.message_id = Some(message_id.clone());
                self.targets.clear();
            }
            StreamEvent::BlockStart { index, block } => {
                let Some(msg) = self.message_id.clone() else {
                    return;
                };
                let target = match block {
                    ContentBlock::Text { .. } => Target {
                        kind: DeltaKind::Text,
                        block: msg,
                    },
                    ContentBlock::Thinking { .. } => Target {
                        kind: DeltaKind::Reasoning,
                        block: msg,
                    },
                    ContentBlock::ToolUse { id, .. } => Target {
                        kind: DeltaKind::ToolCall,
                        block: id.clone(),
                    },
                    _ => return,
                };
                self.targets.retain(|(i, _)| i != index);
                self.targets.push((*index, target));
            }
            StreamEvent::BlockDelta { index, delta } => {
                let text = match delta {
                    Delta::Text(t) | Delta::Thinking(t) | Delta::InputJson(t) => t,
                    _ => return,
                };
                let Some((_, t)) = self.targets.iter().find(|(i, _)| i == index) else {
                    return;
                };
                let ev = SessionEvent::delta(
                    self.next_seq,
                    now.as_u64(),
                    &self.session,
                    t.kind,
                    &t.block,
                    text,
                );
                self.next_seq = self.next_seq.saturating_add(1);
                self.out.push_back(Output::Event(ev));
            }
            StreamEvent::BlockStop { index } => {
                self.targets.retain(|(i, _)| i != index);
            }
            StreamEvent::MessageStop => self.message_id = None,
            _ => {}
        }
    }

    fn assistant_block(&mut self, message_id: &str, block: &ContentBlock, now: Millis) {
        let rows = self.messages.entry(message_id.to_owned()).or_default();
        let (ty, text) = match block {
            ContentBlock::Text { text } => {
                rows.text.push(text.clone());
                (timeline_core::key::BlockType::AgentReply, join(&rows.text))
            }
            ContentBlock::Thinking { thinking } => {
                rows.thinking.push(thinking.clone());
                (
                    timeline_core::key::BlockType::Thinking,
                    join(&rows.thinking),
                )
            }
            ContentBlock::ToolUse { id, name, input } => {
                let call = ToolCall {
                    id: id.clone(),
                    name: name.clone(),
                    input: input.clone(),
                    result: None,
                };
                self.tools.insert(id.clone(), call.clone());
                self.emit_tool(&call, now);
                return;
            }
            _ => return,
        };
        if text.is_empty() {
            return;
        }
        let Ok(key) = BlockKey::parse(ty, message_id) else {
            return;
        };
        let (at, seq) = self.place(key, now);
        let order = SourceOrder::live(seq);
        let block = match ty {
            timeline_core::key::BlockType::AgentReply => {
                blocks::reply_block(message_id, at, order, &text)
            }
            _ => blocks::thinking_block(message_id, at, order, &text),
        };
        self.out.extend(block.map(Output::Row));
    }

    fn emit_tool(&mut self, call: &ToolCall, now: Millis) {
        let Ok(key) = BlockKey::parse(timeline_core::key::BlockType::Activity, &call.id) else {
            return;
        };
        let (at, seq) = self.place(key, now);
        self.out
            .extend(blocks::tool_block(call, at, SourceOrder::live(seq)).map(Output::Row));
    }

    fn tool_result(
        &mut self,
        id: &str,
        text: &str,
        is_error: bool,
        uuid: Option<String>,
        now: Millis,
    ) {
        let Some(call) = self.tools.get_mut(id) else {
            return;
        };
        call.result = Some(ToolResult {
            text: text.to_owned(),
            is_error,
            uuid,
        });
        let call = call.clone();
        self.emit_tool(&call, now);
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
