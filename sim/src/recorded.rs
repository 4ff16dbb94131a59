//! A client's reducers with their inputs written down: every call that changes the
//! timeline or the conversation, as the command `timeline-wasm` takes for it. A run
//! recorded this way is a language-neutral vector made by the simulator
//! (`Config::record`): a client in another language given the same commands must show
//! the same rows.
//!
//! Reads go through `Deref`; every call that changes state has its own method here, so
//! nothing changes a recorded reducer unwritten (the vector test replays the commands
//! and compares the rows the simulator's client ended with).

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, PoisonError};

use serde::Serialize;
use serde_json::{json, Value};
use timeline_core::anchor::{Anchor, AnchorError};
use timeline_core::key::{BlockKey, OperationId, TargetId};
use timeline_core::replay::{ConversationClient, ReplayOutcome};
use timeline_core::time::Millis;
use timeline_core::timeline::{LoadFailure, Outcome, PendingSend, RequestTag};
use timeline_core::wire::{LiveOverlay, LivePatch, OlderPage, TimelineWindow};
use timeline_core::Timeline;

/// The commands written so far, shared by a client's two reducers (one order).
#[derive(Clone, Debug, Default)]
pub struct Log(Arc<Mutex<Vec<Value>>>);

impl Log {
    pub(crate) fn push(&self, command: Value) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(command);
    }

    /// The commands, in order.
    pub fn commands(&self) -> Vec<Value> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// A reducer whose changes are written to a [`Log`] when one is set.
#[derive(Debug)]
pub struct Recorded<T> {
    inner: T,
    log: Option<Log>,
}

impl<T> Recorded<T> {
    /// `inner`, recorded into `log` when there is one.
    pub fn new(inner: T, log: Option<Log>) -> Self {
        Recorded { inner, log }
    }

    fn note(&self, command: impl FnOnce() -> Value) {
        if let Some(log) = &self.log {
            log.push(command());
        }
    }
}

impl<T> Deref for Recorded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T> DerefMut for Recorded<T> {
    /// For effects only (`poll_effect`): every change of state has a method here.
    fn deref_mut(&mut self) -> &mut T {
        &mut self.inner
    }
}

fn tag(t: &RequestTag) -> Value {
    json!({ "target": t.target, "generation": t.generation, "request": t.request })
}

/// A load's answer as a client got it: `{"ok": ...}` or `{"errorCode": ...}` (the code
/// the wasm client reads back as the same failure). An answer that did not validate
/// cannot be written as the host's JSON; the command says so and the vector test
/// refuses the run.
fn answer<T: Serialize>(result: &Result<T, LoadFailure>) -> Value {
    match result {
        Ok(v) => json!({ "ok": v }),
        Err(LoadFailure::SnapshotTooLarge) => {
            json!({ "errorCode": timeline_core::policy::SNAPSHOT_TOO_LARGE_CODE })
        }
        Err(LoadFailure::Invalid) => json!({ "errorCode": "INVALID_CURSOR" }),
        Err(LoadFailure::TimedOut) => json!({ "errorCode": "TIMED_OUT" }),
        Err(LoadFailure::Unavailable) => json!({ "errorCode": "HISTORY_UNAVAILABLE" }),
        Err(other) => json!({ "unrecordable": format!("{other:?}") }),
    }
}

fn now_of(now: Millis) -> u64 {
    now.as_u64()
}

/// The command of a load's answer: `window`, `older` or `anchored`.
fn load<T: Serialize>(
    cmd: &str,
    t: &RequestTag,
    result: &Result<T, LoadFailure>,
    now: Millis,
) -> Value {
    json!({ "cmd": cmd, "tag": tag(t), "answer": answer(result), "now": now_of(now) })
}

impl Recorded<Timeline> {
    /// [`Timeline::open_target`].
    pub fn open_target(&mut self, target: TargetId, now: Millis) {
        self.note(|| json!({ "cmd": "open", "target": target, "now": now_of(now) }));
        self.inner.open_target(target, now);
    }

    /// [`Timeline::reload`].
    pub fn reload(&mut self, now: Millis) {
        self.note(|| json!({ "cmd": "reload", "now": now_of(now) }));
        self.inner.reload(now);
    }

    /// [`Timeline::recover`].
    pub fn recover(&mut self, now: Millis) {
        self.note(|| json!({ "cmd": "recover", "now": now_of(now) }));
        self.inner.recover(now);
    }

    /// [`Timeline::load_older`].
    pub fn load_older(&mut self, now: Millis) -> bool {
        self.note(|| json!({ "cmd": "loadOlder", "now": now_of(now) }));
        self.inner.load_older(now)
    }

    /// [`Timeline::load_newer`].
    pub fn load_newer(&mut self, now: Millis) -> bool {
        self.note(|| json!({ "cmd": "loadNewer", "now": now_of(now) }));
        self.inner.load_newer(now)
    }

    /// [`Timeline::load_anchored`].
    pub fn load_anchored(&mut self, anchor: Anchor, now: Millis) -> Result<(), AnchorError> {
        self.note(|| json!({ "cmd": "loadAnchored", "anchor": anchor, "now": now_of(now) }));
        self.inner.load_anchored(anchor, now)
    }

    /// [`Timeline::set_reading_row`].
    pub fn set_reading_row(&mut self, key: Option<BlockKey>) {
        self.note(|| json!({ "cmd": "readingRow", "row": key }));
        self.inner.set_reading_row(key);
    }

    /// [`Timeline::handle_latest_window`].
    pub fn handle_latest_window(
        &mut self,
        t: &RequestTag,
        result: Result<TimelineWindow, LoadFailure>,
        now: Millis,
    ) -> Outcome {
        self.note(|| load("window", t, &result, now));
        self.inner.handle_latest_window(t, result, now)
    }

    /// [`Timeline::handle_older_page`].
    pub fn handle_older_page(
        &mut self,
        t: &RequestTag,
        result: Result<OlderPage, LoadFailure>,
        now: Millis,
    ) -> Outcome {
        self.note(|| load("older", t, &result, now));
        self.inner.handle_older_page(t, result, now)
    }

    /// [`Timeline::handle_anchored`].
    pub fn handle_anchored(
        &mut self,
        t: &RequestTag,
        result: Result<TimelineWindow, LoadFailure>,
        now: Millis,
    ) -> Outcome {
        self.note(|| load("anchored", t, &result, now));
        self.inner.handle_anchored(t, result, now)
    }

    /// [`Timeline::handle_live_update`].
    pub fn handle_live_update(
        &mut self,
        target: &TargetId,
        overlay: LiveOverlay,
        now: Millis,
    ) -> Outcome {
        self.note(
            || json!({ "cmd": "live", "target": target, "overlay": overlay, "now": now_of(now) }),
        );
        self.inner.handle_live_update(target, overlay, now)
    }

    /// [`Timeline::handle_live_patch`].
    pub fn handle_live_patch(
        &mut self,
        target: &TargetId,
        patch: LivePatch,
        now: Millis,
    ) -> Outcome {
        self.note(
            || json!({ "cmd": "patch", "target": target, "patch": patch, "now": now_of(now) }),
        );
        self.inner.handle_live_patch(target, patch, now)
    }

    /// [`Timeline::handle_timeout`].
    pub fn handle_timeout(&mut self, now: Millis) {
        self.note(|| json!({ "cmd": "timeout", "now": now_of(now) }));
        self.inner.handle_timeout(now);
    }

    /// [`Timeline::add_pending`].
    pub fn add_pending(&mut self, send: PendingSend) -> Outcome {
        self.note(|| {
            json!({ "cmd": "pending", "operationId": send.operation_id,
                "createdAt": now_of(send.created_at), "data": send.data })
        });
        self.inner.add_pending(send)
    }

    /// [`Timeline::await_receipt`].
    pub fn await_receipt(&mut self, op: &OperationId, now: Millis) -> Outcome {
        self.note(|| json!({ "cmd": "awaitReceipt", "operationId": op, "now": now_of(now) }));
        self.inner.await_receipt(op, now)
    }

    /// [`Timeline::confirm_pending`].
    pub fn confirm_pending(&mut self, op: &OperationId) -> Outcome {
        self.note(|| json!({ "cmd": "confirm", "operationId": op }));
        self.inner.confirm_pending(op)
    }

    /// [`Timeline::mark_delivered`].
    pub fn mark_delivered(&mut self, op: &OperationId) -> Outcome {
        self.note(|| json!({ "cmd": "delivered", "operationId": op }));
        self.inner.mark_delivered(op)
    }

    /// [`Timeline::remove_pending`].
    pub fn remove_pending(&mut self, op: &OperationId) -> Outcome {
        self.note(|| json!({ "cmd": "removePending", "operationId": op }));
        self.inner.remove_pending(op)
    }
}

/// A chunk or event as the command carries it: its JSON, or its text when it is not
/// JSON (both readers refuse it the same way).
fn event_value(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

impl Recorded<ConversationClient> {
    /// A fresh conversation (the client opened another session).
    pub fn restart(&mut self) {
        self.note(|| json!({ "cmd": "newConversation" }));
        self.inner = ConversationClient::new();
    }

    /// [`ConversationClient::send`].
    pub fn send(&mut self, client_id: &str, text: &str) {
        self.note(|| json!({ "cmd": "sendPending", "clientId": client_id, "text": text }));
        self.inner.send(client_id, text);
    }

    /// [`ConversationClient::set_queued`].
    pub fn set_queued(&mut self, queued: usize) {
        self.note(|| json!({ "cmd": "queued", "queued": queued }));
        self.inner.set_queued(queued);
    }

    /// [`ConversationClient::handle_live`].
    pub fn handle_live(&mut self, json: &str) -> ReplayOutcome {
        self.note(|| json!({ "cmd": "relayEvent", "event": event_value(json) }));
        self.inner.handle_live(json)
    }

    /// [`ConversationClient::handle_replay_chunk`].
    pub fn handle_replay_chunk(&mut self, json: &str, now: Millis) -> ReplayOutcome {
        self.note(
            || json!({ "cmd": "replayChunk", "chunk": event_value(json), "now": now_of(now) }),
        );
        self.inner.handle_replay_chunk(json, now)
    }

    /// [`ConversationClient::handle_timeout`].
    pub fn handle_timeout(&mut self, now: Millis) {
        self.note(|| json!({ "cmd": "timeout", "now": now_of(now) }));
        self.inner.handle_timeout(now);
    }
}
