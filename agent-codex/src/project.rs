//! Projection of the app-server stream into the library's blocks: overlay rows
//! ([`overlay_core::store::StoredBlock`]) for items, approval cards and the run's status
//! row, and packed-history events ([`timeline_core::history::SessionEvent`]) for deltas.
//!
//! - `item/started` places a row; `item/completed` rewrites it with the authoritative
//!   item. A row keeps the timestamp and live source order (`[2, sequence]`) it got when
//!   it first appeared, so updates never move it (TL-05).
//! - A user message that carries a client ID is the row `user-message::<operationId>`
//!   with that operation (TL-03), so the pending echo hides exactly while it shows.
//! - `item/agentMessage/delta` and the reasoning deltas become scalar delta events of
//!   the item's block (`assistant/text-delta`, `assistant/reasoning-delta`) with
//!   increasing sequence numbers, ready for [`timeline_core::history::pack`] (PK-01).
//!   Command output deltas are skipped (counted): `item/completed` carries the output.
//! - An approval request is a card (RW-06) keyed by its length-prefixed card ID, class
//!   approval card: pending, then the decision the host answered with
//!   ([`Projector::decided`]); `serverRequest/resolved` without an answer of ours shows
//!   it as resolved elsewhere (expired).
//! - `turn/started` writes the run's status row (`thinking-<runId>`, when the host named
//!   the run), relabelled by each new activity; `turn/completed` is handed to the host
//!   ([`Projected::TurnEnded`]), which runs the cleanup of the run's ephemeral rows.
//!
//! Unknown item types and notifications are not projected (the codec counts them).

use std::collections::BTreeMap;

use overlay_core::store::{RowClass, StoredBlock};
use serde_json::{json, Value};
use timeline_core::block::Block;
use timeline_core::history::{DeltaKind, SessionEvent};
use timeline_core::key::{BlockKey, BlockType, OperationId, RunId};
use timeline_core::order::SourceOrder;
use timeline_core::rows::{
    approval_card, status_row, ActivityKind, ActivityRow, ApprovalKind, ApprovalRequest,
    ApprovalResult, Detail, Display, RowStatus,
};
use timeline_core::time::Millis;

use crate::codec::allowed_decisions;
use crate::diag::{Diagnostics, Skip};
use crate::protocol::{
    ApprovalAsk, ApprovalMethod, DeltaStream, ItemStatus, Notification, RequestId,
    ServerNotification, ServerRequest, ThreadItem, TurnStatus,
};

/// What the projection hands the host.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Projected {
    /// Write this row into the target's overlay (insert or replace by key).
    Row(StoredBlock),
    /// A scalar delta event for the session's history stream.
    Delta(SessionEvent),
    /// A turn ended: the host settles the run (status row, ephemeral rows, exact scan).
    TurnEnded {
        /// The turn.
        turn_id: String,
        /// How it ended.
        status: TurnStatus,
    },
    /// Codex reported an error; the host decides how to show it.
    Notice {
        /// The message.
        message: String,
        /// The turn, if named.
        turn_id: Option<String>,
    },
}

struct Card {
    request: ApprovalRequest,
    summary: String,
    decided: bool,
}

/// The projection of one thread's live stream. Drive it with every notification and
/// server request, in order, and with the decisions the host answered.
pub struct Projector {
    session: String,
    run: Option<RunId>,
    run_started: Option<Millis>,
    next_live: u64,
    next_seq: u64,
    placed: BTreeMap<BlockKey, (Millis, SourceOrder)>,
    cards: BTreeMap<RequestId, Card>,
    diagnostics: Diagnostics,
}

/// The row one item shows: its key, its data and the operation it carries.
struct ItemRow {
    key: BlockKey,
    data: Value,
    op: Option<OperationId>,
}

/// The row of `item` (none for an item that shows none), and what a run that is still
/// on it is busy with (the status row's activity).
fn item_row(item: &ThreadItem) -> (Option<ItemRow>, Option<ActivityKind>) {
    let Some(id) = item
        .id()
        .and_then(|i| timeline_core::key::BlockId::new(i).ok())
    else {
        return (None, None);
    };
    let row = |key: BlockKey, data: Value| ItemRow {
        key,
        data,
        op: None,
    };
    match item {
        ThreadItem::UserMessage {
            client_id, text, ..
        } => {
            let op = client_id.as_deref().and_then(|c| OperationId::new(c).ok());
            let key = match &op {
                Some(op) => BlockKey::user_message(op),
                None => BlockKey::new(BlockType::User, id),
            };
            let data = json!({ "text": text });
            (Some(ItemRow { key, data, op }), None)
        }
        ThreadItem::AgentMessage { text, phase, .. } => (
            Some(row(
                BlockKey::new(BlockType::AgentReply, id),
                json!({ "text": text, "phase": phase }),
            )),
            None,
        ),
        ThreadItem::Reasoning {
            summary, content, ..
        } => {
            let text = if summary.is_empty() { content } else { summary };
            let text = text.join("\n\n");
            // Reasoning without words (encrypted only, or not streamed yet) is no row;
            // the status row still says the run reasons.
            let shown = (!text.trim().is_empty()).then(|| {
                row(
                    BlockKey::new(BlockType::Thinking, id),
                    json!({ "text": text }),
                )
            });
            (shown, Some(ActivityKind::Reasoning))
        }
        ThreadItem::ContextCompaction { .. } => (
            Some(row(
                BlockKey::new(BlockType::System, id),
                json!({ "text": "Context compacted" }),
            )),
            None,
        ),
        other => match activity_row(other) {
            Some(activity) => {
                let kind = activity.kind;
                let data = serde_json::to_value(&activity).unwrap_or(Value::Null);
                (
                    Some(row(BlockKey::new(BlockType::Activity, id), data)),
                    Some(kind),
                )
            }
            None => (None, None),
        },
    }
}

/// The history row of a saved item (a `thread/items/list` entry) seen at `at`: the key,
/// data and operation of the row the live stream showed for it (TL-03), so history
/// settles that row in place. An item type this crate does not project shows no row;
/// the history source shows it as a diagnostic row ([`unsupported_block`]).
pub fn history_block(item: &ThreadItem, at: Millis) -> Option<Block> {
    let r = item_row(item).0?;
    let mut block = Block::new(r.key, at).with_data(r.data);
    block.operation_id = r.op;
    Some(block)
}

/// The diagnostic row of a saved item Codex could not describe (`unsupportedItem`) or
/// this crate does not project: a system row that names its type, keyed by its ID (or
/// by `fallback` when it has none), so the page still advances past it.
pub fn unsupported_block(item: &Value, fallback: &str, at: Millis) -> Option<Block> {
    let item_type = item
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("unknown");
    let id = item.get("id").and_then(Value::as_str).unwrap_or(fallback);
    let id = timeline_core::key::BlockId::new(id).ok()?;
    let data = json!({
        "text": format!("An item this host cannot show ({item_type})"),
        "diagnostic": { "unsupportedItem": item_type },
    });
    Some(Block::new(BlockKey::new(BlockType::System, id), at).with_data(data))
}

fn row_status(s: &ItemStatus) -> RowStatus {
    match s {
        ItemStatus::InProgress => RowStatus::InProgress,
        ItemStatus::Completed | ItemStatus::Other(_) => RowStatus::Completed,
        ItemStatus::Failed => RowStatus::Failed,
        ItemStatus::Declined => RowStatus::Declined,
    }
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').find(|s| !s.is_empty()).unwrap_or(path)
}

/// The activity row of an item, if it is an activity.
pub fn activity_row(item: &ThreadItem) -> Option<ActivityRow> {
    Some(match item {
        ThreadItem::CommandExecution {
            command,
            status,
            aggregated_output,
            exit_code,
            ..
        } => ActivityRow::command(
            command,
            row_status(status),
            exit_code.and_then(|c| i32::try_from(c).ok()),
            aggregated_output.as_deref().unwrap_or_default(),
        ),
        ThreadItem::FileChange {
            changes, status, ..
        } => match changes.as_slice() {
            [one] => ActivityRow::file_change(
                &one.path,
                one.kind == "add",
                row_status(status),
                &one.diff,
            ),
            many => ActivityRow {
                kind: ActivityKind::FileChange,
                title: format!("Edited {} files", many.len()),
                subtitle: Some(
                    many.iter()
                        .map(|c| file_name(&c.path))
                        .collect::<Vec<_>>()
                        .join(", "),
                )
                .filter(|s| !s.is_empty()),
                display: Display::default(),
                status: row_status(status),
                detail: Some(many.iter().map(|c| c.diff.as_str()).collect::<String>())
                    .filter(|d| !d.is_empty())
                    .map(Detail::plaintext),
                message: None,
                approval: None,
            },
        },
        ThreadItem::McpToolCall {
            server,
            tool,
            status,
            arguments,
            ..
        } => ActivityRow::tool_call(tool, Some(server), row_status(status), arguments),
        ThreadItem::WebSearch { query, .. } => ActivityRow {
            kind: ActivityKind::Search,
            title: "Searched the web".to_owned(),
            subtitle: Some(timeline_core::rows::first_line_chars(query, 120))
                .filter(|s| !s.is_empty()),
            display: Display::default(),
            status: RowStatus::Completed,
            detail: None,
            message: None,
            approval: None,
        },
        ThreadItem::Plan { text, .. } => ActivityRow {
            kind: ActivityKind::Plan,
            title: "Updated the plan".to_owned(),
            subtitle: None,
            display: Display::default(),
            status: RowStatus::Completed,
            detail: (!text.is_empty()).then(|| Detail::markdown(text)),
            message: None,
            approval: None,
        },
        _ => return None,
    })
}

impl Projector {
    /// The projection of `session`'s stream; `run` names the host's run when known
    /// (status row, and the run each ephemeral row belongs to). `first_seq` is the
    /// sequence number of the first delta event.
    pub fn new(session: &str, run: Option<RunId>, first_seq: u64) -> Projector {
        Projector {
            session: session.to_owned(),
            run,
            run_started: None,
            next_live: 1,
            next_seq: first_seq,
            placed: BTreeMap::new(),
            cards: BTreeMap::new(),
            diagnostics: Diagnostics::new(),
        }
    }

    /// The run the following rows belong to.
    pub fn set_run(&mut self, run: Option<RunId>) {
        self.run = run;
        self.run_started = None;
    }

    /// What the projection skipped.
    pub fn diagnostics(&self) -> &Diagnostics {
        &self.diagnostics
    }

    fn row(&mut self, key: BlockKey, at: Millis, class: RowClass, data: Value) -> Projected {
        self.row_with(key, at, class, data, None)
    }

    fn row_with(
        &mut self,
        key: BlockKey,
        at: Millis,
        class: RowClass,
        data: Value,
        op: Option<OperationId>,
    ) -> Projected {
        let next_live = &mut self.next_live;
        let (ts, order) = self
            .placed
            .entry(key.clone())
            .or_insert_with(|| {
                let o = SourceOrder::live(*next_live);
                *next_live = next_live.saturating_add(1);
                (at, o)
            })
            .clone();
        let mut block = Block::new(key, ts).with_source_order(order).with_data(data);
        block.operation_id = op;
        Projected::Row(StoredBlock {
            block,
            class,
            run_id: self.run.clone(),
        })
    }

    fn status(&mut self, newest: Option<ActivityKind>) -> Option<Projected> {
        let (run, started) = (self.run.clone()?, self.run_started?);
        Some(Projected::Row(StoredBlock {
            block: status_row(&run, started, newest),
            class: RowClass::Status,
            run_id: Some(run),
        }))
    }

    fn item_rows(
        &mut self,
        item: &ThreadItem,
        at: Millis,
        completed: bool,
        out: &mut Vec<Projected>,
    ) {
        let (row, busy) = item_row(item);
        if let Some(r) = row {
            let p = self.row_with(r.key, at, RowClass::Ordinary, r.data, r.op);
            out.push(p);
        }
        if !completed && busy.is_some() {
            out.extend(self.status(busy));
        }
    }

    fn card(
        &mut self,
        id: &RequestId,
        result: Option<ApprovalResult>,
        at: Millis,
    ) -> Option<Projected> {
        let card = self.cards.get(id)?;
        // The row carries its card (request, status, result) as the rows module words
        // it: pending, then the result; resolved elsewhere shows as expired (RW-06).
        let data = serde_json::to_value(approval_card(&card.request, &card.summary, result))
            .unwrap_or(Value::Null);
        let key = BlockKey::parse(BlockType::Activity, &card.request.card_id()).ok()?;
        Some(self.row(key, at, RowClass::ApprovalCard, data))
    }

    /// Projects a server request (approvals; other requests project nothing).
    pub fn handle_request(&mut self, request: &ServerRequest, now: Millis) -> Vec<Projected> {
        let ServerRequest::Approval(ask) = request else {
            return Vec::new();
        };
        let ApprovalAsk {
            request_id,
            method,
            thread_id,
            turn_id,
            item_id,
            reason,
            command,
            ..
        } = ask;
        let summary = command
            .clone()
            .or_else(|| reason.clone())
            .unwrap_or_default();
        self.cards.insert(
            request_id.clone(),
            Card {
                request: ApprovalRequest {
                    request_id: request_id.to_string(),
                    thread_id: thread_id.clone(),
                    turn_id: turn_id.clone(),
                    item_id: item_id.clone(),
                    kind: match method {
                        ApprovalMethod::CommandExecution => ApprovalKind::CommandExecution,
                        ApprovalMethod::FileChange => ApprovalKind::FileChange,
                    },
                    allowed: allowed_decisions(ask),
                },
                summary,
                decided: false,
            },
        );
        self.card(request_id, None, now).into_iter().collect()
    }

    /// The host answered approval `id` with a decision whose result is `result`.
    pub fn decided(
        &mut self,
        id: &RequestId,
        result: ApprovalResult,
        now: Millis,
    ) -> Vec<Projected> {
        if let Some(c) = self.cards.get_mut(id) {
            c.decided = true;
        }
        self.card(id, Some(result), now).into_iter().collect()
    }

    /// The delta event of a fragment of item `item_id` (none for command output, which
    /// `item/completed` carries whole).
    fn delta(
        &mut self,
        stream: DeltaStream,
        emitted: Millis,
        turn_id: String,
        item_id: String,
        delta: String,
    ) -> Option<Projected> {
        let kind = match stream {
            DeltaStream::AgentMessage => DeltaKind::Text,
            DeltaStream::ReasoningSummary | DeltaStream::ReasoningText => DeltaKind::Reasoning,
            DeltaStream::CommandOutput => {
                self.diagnostics
                    .count(Skip::Ignored, "delta:commandExecution/outputDelta");
                return None;
            }
        };
        let e = SessionEvent {
            seq: self.next_seq,
            time: emitted.as_u64(),
            kind: kind.event_type().to_owned(),
            session_id: self.session.clone(),
            turn_id: Some(turn_id),
            block: Some(item_id),
            text: Some(delta),
            data: Value::Null,
        };
        self.next_seq = self.next_seq.saturating_add(1);
        Some(Projected::Delta(e))
    }

    /// [`Projector::handle`] for a notification the caller owns: a delta's strings move
    /// into its event instead of being copied (the stream's hot path).
    pub fn handle_owned(&mut self, n: Notification, now: Millis) -> Vec<Projected> {
        match n.body {
            ServerNotification::ItemDelta {
                stream,
                turn_id,
                item_id,
                delta,
                ..
            } => {
                let emitted = n.emitted_at_ms.map(Millis).unwrap_or(now);
                self.delta(stream, emitted, turn_id, item_id, delta)
                    .into_iter()
                    .collect()
            }
            _ => self.handle(&n, now),
        }
    }

    /// Projects one notification.
    pub fn handle(&mut self, n: &Notification, now: Millis) -> Vec<Projected> {
        let emitted = n.emitted_at_ms.map(Millis).unwrap_or(now);
        let mut out = Vec::new();
        match &n.body {
            ServerNotification::TurnStarted { .. } => {
                if self.run_started.is_none() {
                    self.run_started = Some(emitted);
                }
                out.extend(self.status(None));
            }
            ServerNotification::TurnCompleted { turn, .. } => out.push(Projected::TurnEnded {
                turn_id: turn.id.clone(),
                status: turn.status.clone(),
            }),
            ServerNotification::ItemStarted { item, at_ms, .. } => {
                self.item_rows(item, at_ms.map(Millis).unwrap_or(emitted), false, &mut out)
            }
            ServerNotification::ItemCompleted { item, at_ms, .. } => {
                self.item_rows(item, at_ms.map(Millis).unwrap_or(emitted), true, &mut out)
            }
            ServerNotification::ItemDelta {
                stream,
                turn_id,
                item_id,
                delta,
                ..
            } => out.extend(self.delta(
                *stream,
                emitted,
                turn_id.clone(),
                item_id.clone(),
                delta.clone(),
            )),
            ServerNotification::ServerRequestResolved { request_id, .. } => {
                let external = self.cards.get(request_id).is_some_and(|c| !c.decided);
                if external {
                    out.extend(self.card(
                        request_id,
                        Some(ApprovalResult::ResolvedExternally),
                        emitted,
                    ));
                }
                self.cards.remove(request_id);
            }
            ServerNotification::Error { message, turn_id } => out.push(Projected::Notice {
                message: message.clone(),
                turn_id: turn_id.clone(),
            }),
            ServerNotification::TurnDiffUpdated { .. } => self
                .diagnostics
                .count(Skip::Ignored, "notification:turn/diff/updated"),
            _ => {}
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::ApprovalMethod;

    fn ask(id: i64) -> ServerRequest {
        ServerRequest::Approval(ApprovalAsk {
            request_id: RequestId::Number(id),
            method: ApprovalMethod::CommandExecution,
            thread_id: "th".into(),
            turn_id: "tu".into(),
            item_id: "it".into(),
            reason: None,
            command: Some("rm -rf build".into()),
            proposed_execpolicy_amendment: None,
            available_decisions: None,
        })
    }

    fn resolved(id: i64) -> Notification {
        Notification {
            emitted_at_ms: Some(9),
            body: ServerNotification::ServerRequestResolved {
                thread_id: "th".into(),
                request_id: RequestId::Number(id),
            },
        }
    }

    fn status_of(p: &[Projected]) -> Vec<String> {
        p.iter()
            .filter_map(|p| match p {
                Projected::Row(b) => b.block.data["approval"]["status"]
                    .as_str()
                    .map(str::to_owned),
                _ => None,
            })
            .collect()
    }

    // RW-06: pending, then the result; resolved elsewhere shows as expired.
    #[test]
    fn a_card_resolved_without_our_answer_shows_as_expired() {
        let mut p = Projector::new("s", None, 1);
        assert_eq!(
            status_of(&p.handle_request(&ask(3), Millis(1))),
            ["pending"]
        );
        let out = p.handle(&resolved(3), Millis(2));
        assert_eq!(status_of(&out), ["expired"]);
        let Some(Projected::Row(b)) = out.first() else {
            panic!()
        };
        assert_eq!(b.class, RowClass::ApprovalCard);
        assert_eq!(b.block.data["display"]["signal"], "Expired");
        // Our own answer is not overwritten by the resolution that follows it.
        p.handle_request(&ask(4), Millis(3));
        assert_eq!(
            status_of(&p.decided(&RequestId::Number(4), ApprovalResult::Accepted, Millis(4))),
            ["accepted"]
        );
        assert!(p.handle(&resolved(4), Millis(5)).is_empty());
    }

    // PK-01: deltas are scalar events with consecutive sequence numbers per session.
    #[test]
    fn deltas_get_consecutive_sequence_numbers() {
        let mut p = Projector::new("s", None, 41);
        let d = |text: &str| Notification {
            emitted_at_ms: None,
            body: ServerNotification::ItemDelta {
                stream: DeltaStream::AgentMessage,
                thread_id: "th".into(),
                turn_id: "tu".into(),
                item_id: "msg_1".into(),
                delta: text.into(),
            },
        };
        let mut seqs = Vec::new();
        for t in ["a", "b"] {
            for out in p.handle(&d(t), Millis(7)) {
                let Projected::Delta(e) = out else { panic!() };
                assert_eq!(e.turn_id.as_deref(), Some("tu"));
                assert_eq!(e.time, 7);
                seqs.push(e.seq);
            }
        }
        assert_eq!(seqs, [41, 42]);
    }
}
