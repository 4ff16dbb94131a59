//! The client timeline for browsers: [`timeline_core::Timeline`] behind one JSON-in,
//! JSON-out call.
//!
//! Each command is a JSON object with a `cmd`; the answer says what the command did
//! (`outcome`), what the timeline wants done (`effects`: loads to send, receipts
//! overdue), when to call `timeout` next (`timeout`, milliseconds on the caller's clock,
//! or `null`), and, when the visible rows may have changed, the rows in order (`rows`:
//! `{origin, block}` with `origin` `history`, `live` or `pending`). Time always comes in
//! as `now`: the timeline reads no clock.
//!
//! A timeline made with `{"cmd": "new", ..., "changes": true}` answers with only what
//! changed, so a streamed token costs the rows it touched, not every row: `changes`
//! instead of `rows`, each `{key, row, after}` (`row` `null` when the key no longer
//! shows; otherwise put it after the row `after` names, or first when `after` is
//! `null`), the keys no longer shown first and then the shown ones in order, so each
//! `after` is already in place. An answer after which any row may have changed (a
//! window, a target opened), and the `rows` command, still carry every row as `rows`.
//!
//! | `cmd` | fields | what it does |
//! |---|---|---|
//! | `new` | `mode` (`phone` or `desktop`), `changes` | a fresh timeline (and conversation) |
//! | `open` | `target`, `now` | opens a target (the session for the main conversation) |
//! | `window` | `tag`, `answer`, `now` | a `run.chatLoad` answer |
//! | `older` | `tag`, `answer`, `now` | a `run.chatLoadPageBefore` answer |
//! | `anchored` | `tag`, `answer`, `now` | an anchored load's answer |
//! | `live` | `target`, `overlay`, `now` | a relay `blocks` payload's `liveOverlay` |
//! | `patch` | `target`, `patch`, `now` | a relay `blocks-patch` payload's `livePatch` |
//! | `pending` | `operationId`, `createdAt`, `data` | the echo of a send |
//! | `awaitReceipt` | `operationId`, `now` | the send went out; its receipt is due |
//! | `confirm` | `operationId` | the receipt came |
//! | `delivered` | `operationId` | the sent proof came |
//! | `removePending` | `operationId` | the user removed the message |
//! | `loadAnchored` | `anchor`, `now` | a window at an anchor (`{kind, token}` or `{kind:"row", row}`) |
//! | `loadOlder`, `loadNewer`, `reload`, `recover` | `now` | as the timeline's methods |
//! | `readingRow` | `row` (`{type, id}` or `null`) | the row the reader reads, for `recover` |
//! | `timeout` | `now` | the timeline's and the conversation's timers |
//! | `rows` | | the rows |
//!
//! A phone also keeps the conversation the host's record replays on join (RB-04,
//! [`timeline_core::replay::ConversationClient`]). Its commands answer with its `rows`
//! instead: `{origin: "record", seq, kind, text, ...}` for each entry in the server's
//! order (`kind` `init`, `user` with its `clientId`, `assistant`, `approval` with its
//! `requestId` and `outcome`, `omitted` with its `bytes`), then `{origin: "pending",
//! clientId, text}` for each send the server has not acknowledged; and with `running`,
//! `truncated`, `reclaimed` and `rebuilding`. A client made with `changes: true` gets
//! the conversation's rows only from `view`, so a live event costs the event, not the
//! whole conversation.
//!
//! | `cmd` | fields | what it does |
//! |---|---|---|
//! | `replayChunk` | `chunk`, `now` | one `structured_replay` chunk (the notification's params) |
//! | `relayEvent` | `event` | one live event of the record (with its `seq`) |
//! | `sendPending` | `clientId`, `text` | an optimistic send's placeholder |
//! | `queued` | `queued` | how many messages this client holds queued |
//! | `newConversation` | | a fresh conversation (another session opened) |
//! | `view` | | the conversation's rows |
//!
//! An `answer` is `{"ok": <result>}` or `{"errorCode": <code>}` (the wire's
//! `data.errorCode`, or `TIMED_OUT` when the caller gave up waiting). A `tag` is given
//! back exactly as an effect carried it. A command that does not decode is answered with
//! `{"error": <text>}` and changes nothing.
//!
//! Built for `wasm32`, the crate exports `input(len) -> ptr` (a buffer of `len` bytes
//! for the command), `call() -> len` (runs it; the answer is `len` bytes at
//! `output()`), and `output() -> ptr`.
#![warn(unreachable_pub)]

use std::cell::RefCell;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use timeline_core::anchor::Anchor;
use timeline_core::key::{BlockKey, OperationId, TargetId};
use timeline_core::replay::{
    ClientEffect, ConversationClient, EntryKind, ReplayOutcome, ReplayProblem, ViewRow,
};
use timeline_core::time::Millis;
use timeline_core::timeline::{
    ClientMode, LoadFailure, LoadReason, LoadState, Origin, Outcome, PendingSend, RequestTag,
    RowChanges, TimelineEffect,
};
use timeline_core::wire::{LiveOverlay, LivePatch, OlderPage, TimelineWindow};
use timeline_core::Timeline;

/// A request tag as JSON: given back with the answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Tag {
    target: TargetId,
    generation: u64,
    request: u64,
}

impl From<&RequestTag> for Tag {
    fn from(t: &RequestTag) -> Tag {
        Tag {
            target: t.target.clone(),
            generation: t.generation,
            request: t.request,
        }
    }
}

impl From<Tag> for RequestTag {
    fn from(t: Tag) -> RequestTag {
        RequestTag {
            target: t.target,
            generation: t.generation,
            request: t.request,
        }
    }
}

/// A load's answer as the caller got it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Answer {
    /// Kept as its text: decoded once, straight into the answer's type.
    #[serde(default)]
    ok: Option<Box<serde_json::value::RawValue>>,
    #[serde(default)]
    error_code: Option<String>,
}

impl Answer {
    fn into_result<T: serde::de::DeserializeOwned>(
        self,
        validate: impl Fn(&T) -> Result<(), timeline_core::wire::ResponseError>,
    ) -> Result<T, LoadFailure> {
        match (self.ok, self.error_code) {
            (Some(value), None) => {
                let decoded: T = serde_json::from_str(value.get()).map_err(|e| {
                    LoadFailure::Malformed(timeline_core::wire::ResponseError::Decode(
                        e.to_string(),
                    ))
                })?;
                validate(&decoded).map_err(LoadFailure::Malformed)?;
                Ok(decoded)
            }
            (_, Some(code)) => Err(match code.as_str() {
                timeline_core::policy::SNAPSHOT_TOO_LARGE_CODE => LoadFailure::SnapshotTooLarge,
                "INVALID_CURSOR" => LoadFailure::Invalid,
                "TIMED_OUT" | "DISPATCH_TIMEOUT" => LoadFailure::TimedOut,
                _ => LoadFailure::Unavailable,
            }),
            (None, None) => Err(LoadFailure::Unavailable),
        }
    }
}

/// The `cmd` of a command, read first: a load's answer is decoded on its own path, once,
/// straight into its type.
#[derive(Debug, Deserialize)]
struct Head<'a> {
    #[serde(borrow)]
    cmd: std::borrow::Cow<'a, str>,
}

/// `window`, `older` and `anchored`: a load's answer.
#[derive(Debug, Deserialize)]
struct AnswerCommand {
    tag: Tag,
    answer: Answer,
    now: Millis,
}

/// Every other command.
#[derive(Debug, Deserialize)]
#[serde(tag = "cmd", rename_all = "camelCase")]
enum Command {
    New {
        mode: Mode,
        /// Answer with the changed rows only (see the crate docs).
        #[serde(default)]
        changes: bool,
    },
    Open {
        target: TargetId,
        now: Millis,
    },
    Live {
        target: TargetId,
        overlay: LiveOverlay,
        now: Millis,
    },
    Patch {
        target: TargetId,
        patch: LivePatch,
        now: Millis,
    },
    #[serde(rename_all = "camelCase")]
    Pending {
        operation_id: OperationId,
        created_at: Millis,
        #[serde(default)]
        data: Value,
    },
    #[serde(rename_all = "camelCase")]
    AwaitReceipt {
        operation_id: OperationId,
        now: Millis,
    },
    #[serde(rename_all = "camelCase")]
    Confirm {
        operation_id: OperationId,
    },
    #[serde(rename_all = "camelCase")]
    Delivered {
        operation_id: OperationId,
    },
    #[serde(rename_all = "camelCase")]
    RemovePending {
        operation_id: OperationId,
    },
    LoadOlder {
        now: Millis,
    },
    LoadNewer {
        now: Millis,
    },
    LoadAnchored {
        anchor: Anchor,
        now: Millis,
    },
    ReadingRow {
        row: Option<timeline_core::key::BlockKey>,
    },
    Reload {
        now: Millis,
    },
    Recover {
        now: Millis,
    },
    Timeout {
        now: Millis,
    },
    Rows,
}

/// The conversation's commands.
#[derive(Debug, Deserialize)]
#[serde(tag = "cmd", rename_all = "camelCase")]
enum ConversationCommand {
    // Values, not raw text: an internally tagged enum buffers its fields anyway.
    ReplayChunk {
        chunk: Value,
        now: Millis,
    },
    RelayEvent {
        event: Value,
    },
    #[serde(rename_all = "camelCase")]
    SendPending {
        client_id: String,
        text: String,
    },
    Queued {
        queued: usize,
    },
    NewConversation,
    View,
}

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
enum Mode {
    Phone,
    Desktop,
}

/// One client timeline driven by JSON commands.
#[derive(Debug)]
pub struct Client {
    timeline: Timeline,
    conversation: ConversationClient,
    /// Answer with `changes` instead of every row.
    changes: bool,
}

impl Default for Client {
    fn default() -> Client {
        Client {
            timeline: Timeline::new(ClientMode::Phone),
            conversation: ConversationClient::new(),
            changes: false,
        }
    }
}

impl Client {
    /// A phone's timeline.
    pub fn new() -> Client {
        Client::default()
    }

    /// Runs one command (JSON text); the answer's JSON text.
    pub fn handle(&mut self, command: &str) -> String {
        let refused = |e: serde_json::Error| json!({ "error": e.to_string() }).to_string();
        let head: Head<'_> = match serde_json::from_str(command) {
            Ok(h) => h,
            Err(e) => return refused(e),
        };
        let (outcome, rows_changed) = match head.cmd.as_ref() {
            "replayChunk" | "relayEvent" | "sendPending" | "queued" | "newConversation"
            | "view" => {
                return match serde_json::from_str::<ConversationCommand>(command) {
                    Ok(c) => self.converse(c),
                    Err(e) => refused(e),
                };
            }
            kind @ ("window" | "older" | "anchored") => {
                match serde_json::from_str::<AnswerCommand>(command) {
                    Ok(c) => self.answer(kind, c),
                    Err(e) => return refused(e),
                }
            }
            _ => match serde_json::from_str::<Command>(command) {
                Ok(c) => self.run(c),
                Err(e) => return refused(e),
            },
        };
        let mut answer = json!({
            "outcome": outcome,
            "effects": self.effects(),
            "timeout": self.timeout(),
            "loadState": load_state(self.timeline.load_state()),
        });
        if rows_changed {
            answer["olderCursor"] = json!(self.timeline.oldest_cursor().is_some());
            // The rows go in as text: the answer's other fields are small, the rows not.
            // `rows` asks for every row: the changes so far are in them.
            let changes = self.changes && head.cmd != "rows";
            let (field, rows) = match changes.then(|| self.timeline.take_row_changes()) {
                Some(RowChanges::Keys(keys)) => ("changes", self.changed_rows(&keys)),
                _ => ("rows", self.rows()),
            };
            let head = answer.to_string();
            let mut out = String::with_capacity(head.len() + rows.get().len() + 14);
            out.push_str(&head[..head.len() - 1]);
            out.push_str(",\"");
            out.push_str(field);
            out.push_str("\":");
            out.push_str(rows.get());
            out.push('}');
            return out;
        }
        answer.to_string()
    }

    /// Every effect waiting: the timeline's, then the conversation's.
    fn effects(&mut self) -> Vec<Value> {
        let mut effects = Vec::new();
        while let Some(effect) = self.timeline.poll_effect() {
            effects.push(effect_json(&effect));
        }
        while let Some(effect) = self.conversation.poll_effect() {
            effects.push(conversation_effect_json(&effect));
        }
        effects
    }

    /// The earlier of the two machines' deadlines.
    fn timeout(&self) -> Option<u64> {
        [
            self.timeline.poll_timeout(),
            self.conversation.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
        .map(Millis::as_u64)
    }

    /// A command of the conversation; its whole answer.
    fn converse(&mut self, command: ConversationCommand) -> String {
        let viewing = matches!(command, ConversationCommand::View);
        let c = &mut self.conversation;
        let outcome = match command {
            ConversationCommand::ReplayChunk { chunk, now } => {
                replay_outcome_json(&c.handle_replay_chunk(&chunk.to_string(), now))
            }
            ConversationCommand::RelayEvent { event } => {
                replay_outcome_json(&c.handle_live(&event.to_string()))
            }
            ConversationCommand::SendPending { client_id, text } => {
                c.send(&client_id, &text);
                json!("applied")
            }
            ConversationCommand::Queued { queued } => {
                c.set_queued(queued);
                json!("applied")
            }
            ConversationCommand::NewConversation => {
                *c = ConversationClient::new();
                json!("applied")
            }
            ConversationCommand::View => json!("unchanged"),
        };
        let mut answer = json!({
            "outcome": outcome,
            "effects": self.effects(),
            "timeout": self.timeout(),
            "running": self.conversation.running(),
            "truncated": self.conversation.truncated(),
            "reclaimed": self.conversation.reclaimed(),
            "rebuilding": self.conversation.rebuilding(),
        });
        // Every row costs the whole conversation: a client that takes changes asks for
        // them with `view`, so a live event costs the event.
        if !self.changes || viewing {
            answer["rows"] = self
                .conversation
                .view()
                .iter()
                .map(view_row_json)
                .collect::<Vec<_>>()
                .into();
        }
        answer.to_string()
    }

    /// A load's answer.
    fn answer(&mut self, kind: &str, c: AnswerCommand) -> (Value, bool) {
        let t = &mut self.timeline;
        let tag = c.tag.into();
        let outcome = match kind {
            "older" => t.handle_older_page(&tag, c.answer.into_result(OlderPage::validate), c.now),
            "anchored" => {
                t.handle_anchored(&tag, c.answer.into_result(TimelineWindow::validate), c.now)
            }
            _ => {
                t.handle_latest_window(&tag, c.answer.into_result(TimelineWindow::validate), c.now)
            }
        };
        let changed = !matches!(outcome, Outcome::Unchanged | Outcome::Ignored(_));
        (outcome_json(&outcome), changed)
    }

    fn run(&mut self, command: Command) -> (Value, bool) {
        let t = &mut self.timeline;
        let outcome = match command {
            Command::New { mode, changes } => {
                self.changes = changes;
                let t = &mut self.timeline;
                *t = Timeline::new(match mode {
                    Mode::Phone => ClientMode::Phone,
                    Mode::Desktop => ClientMode::Desktop,
                });
                self.conversation = ConversationClient::new();
                return (json!("applied"), true);
            }
            Command::Open { target, now } => {
                t.open_target(target, now);
                return (json!("applied"), true);
            }
            Command::Live {
                target,
                overlay,
                now,
            } => t.handle_live_update(&target, overlay, now),
            Command::Patch { target, patch, now } => t.handle_live_patch(&target, patch, now),
            Command::Pending {
                operation_id,
                created_at,
                data,
            } => t.add_pending(PendingSend {
                operation_id,
                created_at,
                data,
            }),
            Command::AwaitReceipt { operation_id, now } => t.await_receipt(&operation_id, now),
            Command::Confirm { operation_id } => t.confirm_pending(&operation_id),
            Command::Delivered { operation_id } => t.mark_delivered(&operation_id),
            Command::RemovePending { operation_id } => t.remove_pending(&operation_id),
            Command::LoadOlder { now } => {
                let asked = t.load_older(now);
                return (json!(if asked { "applied" } else { "unchanged" }), false);
            }
            Command::LoadNewer { now } => {
                let asked = t.load_newer(now);
                return (json!(if asked { "applied" } else { "unchanged" }), false);
            }
            Command::ReadingRow { row } => {
                t.set_reading_row(row);
                return (json!("applied"), false);
            }
            Command::LoadAnchored { anchor, now } => {
                return match t.load_anchored(anchor, now) {
                    Ok(()) => (json!("applied"), false),
                    Err(e) => (json!({ "refused": e.to_string() }), false),
                };
            }
            Command::Reload { now } => {
                t.reload(now);
                return (json!("applied"), false);
            }
            Command::Recover { now } => {
                t.recover(now);
                return (json!("applied"), false);
            }
            Command::Timeout { now } => {
                t.handle_timeout(now);
                self.conversation.handle_timeout(now);
                return (json!("applied"), true);
            }
            Command::Rows => return (json!("unchanged"), true),
        };
        let changed = !matches!(outcome, Outcome::Unchanged | Outcome::Ignored(_));
        (outcome_json(&outcome), changed)
    }

    /// The rows of `keys` as `{key, row, after}` (`row` `null` for a key no longer
    /// shown), as JSON text.
    fn changed_rows(&self, keys: &[BlockKey]) -> Box<serde_json::value::RawValue> {
        #[derive(Serialize)]
        struct Change<'a> {
            key: &'a BlockKey,
            row: Option<RowOut<'a>>,
            after: Option<&'a BlockKey>,
        }
        let changes: Vec<Change<'_>> = keys
            .iter()
            .map(|key| Change {
                key,
                row: self.timeline.row(key).map(row_out),
                after: self.timeline.row_before(key),
            })
            .collect();
        serde_json::value::to_raw_value(&changes).unwrap_or_else(|_| {
            serde_json::value::RawValue::from_string("[]".into()).unwrap_or_default()
        })
    }

    /// The visible rows, in order, as JSON text (written once, with no value built).
    fn rows(&self) -> Box<serde_json::value::RawValue> {
        let rows: Vec<RowOut<'_>> = self.timeline.rows().map(row_out).collect();
        serde_json::value::to_raw_value(&rows).unwrap_or_else(|_| {
            serde_json::value::RawValue::from_string("[]".into()).unwrap_or_default()
        })
    }
}

/// A visible row as the answers carry it.
#[derive(Serialize)]
struct RowOut<'a> {
    origin: &'static str,
    block: &'a timeline_core::Block,
}

fn row_out(row: timeline_core::Row<'_>) -> RowOut<'_> {
    RowOut {
        origin: match row.origin {
            Origin::History => "history",
            Origin::Live => "live",
            Origin::Pending => "pending",
        },
        block: row.block,
    }
}

fn outcome_json(outcome: &Outcome) -> Value {
    match outcome {
        Outcome::Applied => json!("applied"),
        Outcome::Unchanged => json!("unchanged"),
        Outcome::Ignored(why) => json!({ "ignored": format!("{why:?}") }),
        Outcome::ReloadRequired(why) => json!({ "reloadRequired": reason(*why) }),
        Outcome::Dropped(why) => json!({ "dropped": format!("{why:?}") }),
        Outcome::Failed(why) => json!({ "failed": format!("{why:?}") }),
        other => json!({ "other": format!("{other:?}") }),
    }
}

fn reason(r: LoadReason) -> String {
    format!("{r:?}")
}

fn load_state(state: &LoadState) -> Value {
    match state {
        LoadState::Closed => json!("closed"),
        LoadState::Loading { retry } => json!({ "loading": retry }),
        LoadState::Ready => json!("ready"),
        LoadState::Failed(why) => json!({ "failed": format!("{why:?}") }),
        LoadState::ReloadFailed { reason, retries } => {
            json!({ "reloadFailed": format!("{reason:?}"), "retries": retries })
        }
        other => json!({ "other": format!("{other:?}") }),
    }
}

fn effect_json(effect: &TimelineEffect) -> Value {
    match effect {
        TimelineEffect::LoadLatestWindow {
            tag,
            page_size,
            reason: why,
        } => json!({
            "kind": "loadLatestWindow", "tag": Tag::from(tag), "pageSize": page_size,
            "reason": reason(*why),
        }),
        TimelineEffect::LoadOlderPage {
            tag,
            cursor,
            page_size,
            expected_boundary_token,
        } => json!({
            "kind": "loadOlderPage", "tag": Tag::from(tag), "beforeCursor": cursor,
            "pageSize": page_size, "expectedBoundaryToken": expected_boundary_token,
        }),
        TimelineEffect::LoadAnchored {
            tag,
            anchor,
            page_size,
        } => json!({
            "kind": "loadAnchored", "tag": Tag::from(tag), "anchor": anchor_json(anchor),
            "pageSize": page_size,
        }),
        TimelineEffect::StopPaging { cursor } => json!({ "kind": "stopPaging", "cursor": cursor }),
        TimelineEffect::ReceiptOverdue { operation_id } => {
            json!({ "kind": "receiptOverdue", "operationId": operation_id })
        }
        other => json!({ "kind": "other", "debug": format!("{other:?}") }),
    }
}

fn replay_outcome_json(outcome: &ReplayOutcome) -> Value {
    match outcome {
        ReplayOutcome::Progress => json!("progress"),
        ReplayOutcome::Complete => json!("complete"),
        ReplayOutcome::Applied => json!("applied"),
        ReplayOutcome::Ignored => json!("ignored"),
        ReplayOutcome::RequestReplay(why) => json!({ "requestReplay": match why {
            ReplayProblem::Malformed => "malformed",
            ReplayProblem::OutOfOrder => "outOfOrder",
            ReplayProblem::MissingLastChunk => "missingLastChunk",
            ReplayProblem::Gap => "gap",
            other => return json!({ "requestReplay": format!("{other:?}") }),
        } }),
        other => json!({ "other": format!("{other:?}") }),
    }
}

fn conversation_effect_json(effect: &ClientEffect) -> Value {
    match effect {
        ClientEffect::DispatchQueued => json!({ "kind": "dispatchQueued" }),
        ClientEffect::StartWatchdog => json!({ "kind": "startWatchdog" }),
        ClientEffect::StopWatchdog => json!({ "kind": "stopWatchdog" }),
        ClientEffect::RunningChanged(running) => {
            json!({ "kind": "runningChanged", "running": running })
        }
        ClientEffect::ApprovalReady { request_id } => {
            json!({ "kind": "approvalReady", "requestId": request_id })
        }
        ClientEffect::RequestReplay => json!({ "kind": "requestReplay" }),
        other => json!({ "kind": "other", "debug": format!("{other:?}") }),
    }
}

fn view_row_json(row: &ViewRow) -> Value {
    match row {
        ViewRow::Entry(e) => {
            let mut out = json!({ "origin": "record", "seq": e.seq, "text": e.text });
            match &e.kind {
                EntryKind::Init => out["kind"] = json!("init"),
                EntryKind::User { client_id } => {
                    out["kind"] = json!("user");
                    out["clientId"] = json!(client_id);
                }
                EntryKind::Assistant => out["kind"] = json!("assistant"),
                EntryKind::Approval {
                    request_id,
                    outcome,
                } => {
                    out["kind"] = json!("approval");
                    out["requestId"] = json!(request_id);
                    out["outcome"] = json!(outcome);
                }
                EntryKind::Omitted { bytes } => {
                    out["kind"] = json!("omitted");
                    out["bytes"] = json!(bytes);
                }
                other => out["kind"] = json!(format!("{other:?}")),
            }
            out
        }
        ViewRow::Pending { client_id, text } => {
            json!({ "origin": "pending", "clientId": client_id, "text": text })
        }
    }
}

fn anchor_json(anchor: &Anchor) -> Value {
    serde_json::to_value(anchor).unwrap_or(Value::Null)
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

#[derive(Default)]
struct State {
    client: Client,
    input: Vec<u8>,
    output: Vec<u8>,
}

/// Runs one command on the one client of this module (what the wasm exports call).
pub fn handle(command: &str) -> String {
    STATE.with(|s| s.borrow_mut().client.handle(command))
}

/// A buffer of `len` zero bytes for the next command; its address in linear memory.
#[allow(unsafe_code)] // `no_mangle` only: the export's name is its ABI
#[no_mangle]
pub extern "C" fn input(len: u32) -> u32 {
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        s.input.clear();
        s.input.resize(len as usize, 0);
        s.input.as_mut_ptr() as usize as u32
    })
}

/// Runs the command in the input buffer; the length of the answer at [`output`]. A
/// command that is not UTF-8 is answered with an error.
#[allow(unsafe_code)] // `no_mangle` only
#[no_mangle]
pub extern "C" fn call() -> u32 {
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        let s = &mut *s;
        let answer = match std::str::from_utf8(&s.input) {
            Ok(text) => s.client.handle(text),
            Err(_) => json!({ "error": "the command is not UTF-8" }).to_string(),
        };
        s.output = answer.into_bytes();
        s.output.len() as u32
    })
}

/// The address of the last answer.
#[allow(unsafe_code)] // `no_mangle` only
#[no_mangle]
pub extern "C" fn output() -> u32 {
    STATE.with(|s| s.borrow().output.as_ptr() as usize as u32)
}
