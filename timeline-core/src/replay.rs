//! The client side of replay on join (RB-04): one reducer for live events and
//! `structured_replay` chunks.
//!
//! - A chunk with `seq 0` starts a rebuild. Its events go through the same reducer as
//!   live events, into a staged conversation; the visible one changes only when the last
//!   chunk arrives, so a client never shows a half-rebuilt timeline.
//! - Live-only side effects (queue auto-dispatch, watchdogs, running-state transitions,
//!   approval readiness) are suppressed while replaying; after the last chunk the
//!   envelope's running state is adopted.
//! - Live events carry the server's `seq`: a duplicate is ignored, a gap asks for a new
//!   replay. Live events that arrive during a rebuild wait and apply after it.
//! - A malformed chunk, a chunk out of order, or a last chunk that never comes (the
//!   deadline from [`ConversationClient::poll_timeout`]) is a typed outcome that asks for
//!   a new replay and leaves the visible conversation as it was.
//! - An optimistic send is a pending placeholder at the end; the server's user message
//!   with the same client ID replaces it at its authoritative position, so the user's
//!   bubble can never end up below the agent's reply.
//! - Unknown event types are ignored (additive protocol).
//!
//! ```
//! use timeline_core::replay::{ConversationClient, ReplayOutcome};
//! use timeline_core::time::Millis;
//!
//! let mut c = ConversationClient::new();
//! c.send("c-1", "hello");
//! let chunk = r#"{"type":"structured_replay","seq":0,"last":true,"truncated":false,
//!   "reclaimed":false,"running":{"running":false},
//!   "events":[{"seq":0,"type":"session_init"},{"seq":1,"type":"user_message","text":"hello","clientId":"c-1"}]}"#;
//! assert_eq!(c.handle_replay_chunk(chunk, Millis(0)), ReplayOutcome::Complete);
//! assert_eq!(c.view().len(), 2, "init and the acknowledged message; no placeholder left");
//! ```

use std::collections::VecDeque;

use serde::Deserialize;

use crate::time::Millis;

/// How long a rebuild waits for its next chunk before it asks for a new replay.
pub const CHUNK_TIMEOUT: Millis = Millis::from_secs(15);

/// What a conversation entry is.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EntryKind {
    /// The session-initialization event.
    Init,
    /// A user message (the server recorded it).
    User {
        /// The client's ID for it, if one sent it.
        client_id: Option<String>,
    },
    /// Agent text.
    Assistant,
    /// An approval card.
    Approval {
        /// The request.
        request_id: String,
        /// `allowed` / `denied` once decided.
        outcome: Option<String>,
    },
    /// An event the server could not fit in a replay chunk.
    Omitted {
        /// Its size.
        bytes: u64,
    },
}

/// One entry of the conversation, at the server's position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The server's sequence number.
    pub seq: u64,
    /// What it is.
    pub kind: EntryKind,
    /// Its text.
    pub text: String,
}

/// One row of the view: an entry, or a pending placeholder at the end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ViewRow {
    /// A server entry.
    Entry(Entry),
    /// An optimistic send the server has not acknowledged.
    Pending {
        /// The client's ID.
        client_id: String,
        /// The text.
        text: String,
    },
}

/// A side effect that only makes sense live.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientEffect {
    /// The run ended with messages queued on the client: send the next.
    DispatchQueued,
    /// Start the run watchdog.
    StartWatchdog,
    /// Stop the run watchdog.
    StopWatchdog,
    /// The running state changed.
    RunningChanged(bool),
    /// An approval card became actionable.
    ApprovalReady {
        /// The request.
        request_id: String,
    },
    /// Ask the server for a new replay.
    RequestReplay,
}

/// Why a replay (or a live event) was not applied.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReplayProblem {
    /// The JSON did not decode.
    Malformed,
    /// A chunk other than the expected next one.
    OutOfOrder,
    /// The last chunk did not arrive in time.
    MissingLastChunk,
    /// A live event skipped sequence numbers.
    Gap,
}

/// What a chunk or live event did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReplayOutcome {
    /// A chunk was staged; more are expected.
    Progress,
    /// The rebuild finished and is visible.
    Complete,
    /// A live event was applied (or buffered during a rebuild).
    Applied,
    /// A duplicate or an unknown event type: nothing changed.
    Ignored,
    /// Nothing visible changed; a new replay was requested.
    RequestReplay(ReplayProblem),
}

#[derive(Clone, Debug, Default)]
struct State {
    entries: Vec<Entry>,
    last_seq: Option<u64>,
    running: bool,
    truncated: bool,
}

#[derive(Debug)]
struct Rebuild {
    next_chunk: u64,
    staged: State,
    deadline: Millis,
}

#[derive(Deserialize)]
struct Envelope {
    #[serde(rename = "type")]
    kind: String,
    seq: u64,
    last: bool,
    truncated: bool,
    #[serde(default)]
    reclaimed: bool,
    running: RunningEnvelope,
    events: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
struct RunningEnvelope {
    running: bool,
}

/// The client conversation. See the module docs.
#[derive(Debug, Default)]
pub struct ConversationClient {
    state: State,
    pending: Vec<(String, String)>,
    queued: usize,
    rebuild: Option<Rebuild>,
    buffered: Vec<serde_json::Value>,
    reclaimed: bool,
    effects: VecDeque<ClientEffect>,
}

impl ConversationClient {
    /// An empty conversation.
    pub fn new() -> Self {
        Self::default()
    }

    /// An optimistic send: a pending placeholder until the server acknowledges it.
    pub fn send(&mut self, client_id: &str, text: &str) {
        self.pending.push((client_id.to_owned(), text.to_owned()));
    }

    /// Messages the user queued on this client while a run works.
    pub fn set_queued(&mut self, queued: usize) {
        self.queued = queued;
    }

    /// The entries in server order, then pending placeholders.
    pub fn view(&self) -> Vec<ViewRow> {
        self.state
            .entries
            .iter()
            .cloned()
            .map(ViewRow::Entry)
            .chain(self.pending.iter().map(|(c, t)| ViewRow::Pending {
                client_id: c.clone(),
                text: t.clone(),
            }))
            .collect()
    }

    /// The entries in server order.
    pub fn entries(&self) -> &[Entry] {
        &self.state.entries
    }

    /// True when earlier events were trimmed from the server's record.
    pub fn truncated(&self) -> bool {
        self.state.truncated
    }

    /// True when the server reclaimed the session and this is a fresh start.
    pub fn reclaimed(&self) -> bool {
        self.reclaimed
    }

    /// The running state.
    pub fn running(&self) -> bool {
        self.state.running
    }

    /// True while a rebuild is staged.
    pub fn rebuilding(&self) -> bool {
        self.rebuild.is_some()
    }

    /// Next side effect.
    #[must_use]
    pub fn poll_effect(&mut self) -> Option<ClientEffect> {
        self.effects.pop_front()
    }

    /// The deadline of the next chunk of a rebuild.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Millis> {
        self.rebuild.as_ref().map(|r| r.deadline)
    }

    /// A rebuild whose last chunk never came is dropped
    /// ([`ReplayProblem::MissingLastChunk`]); a new replay is requested
    /// ([`ClientEffect::RequestReplay`] from [`ConversationClient::poll_effect`]).
    pub fn handle_timeout(&mut self, now: Millis) {
        if self.rebuild.as_ref().is_some_and(|r| r.deadline <= now) {
            self.abandon(ReplayProblem::MissingLastChunk);
        }
    }

    fn abandon(&mut self, why: ReplayProblem) -> ReplayOutcome {
        self.rebuild = None;
        self.buffered.clear();
        self.effects.push_back(ClientEffect::RequestReplay);
        ReplayOutcome::RequestReplay(why)
    }

    /// A live event (JSON with the server's `seq`).
    pub fn handle_live(&mut self, json: &str) -> ReplayOutcome {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(json) else {
            return ReplayOutcome::Ignored;
        };
        if self.rebuild.is_some() {
            self.buffered.push(event);
            return ReplayOutcome::Applied;
        }
        self.apply_live(event)
    }

    fn apply_live(&mut self, event: serde_json::Value) -> ReplayOutcome {
        // A sequence number outside the wire's range (0 to 2^53-1) is malformed.
        let Some(seq) = wire_seq(&event) else {
            return ReplayOutcome::Ignored;
        };
        match self.state.last_seq {
            Some(last) if seq <= last => return ReplayOutcome::Ignored,
            Some(last) if seq > last.saturating_add(1) => return self.abandon(ReplayProblem::Gap),
            _ => {}
        }
        let mut effects = Vec::new();
        apply(
            &mut self.state,
            &mut self.pending,
            &event,
            Some(&mut effects),
            self.queued,
        );
        self.effects.extend(effects);
        ReplayOutcome::Applied
    }

    /// One `structured_replay` chunk.
    pub fn handle_replay_chunk(&mut self, json: &str, now: Millis) -> ReplayOutcome {
        let envelope = match serde_json::from_str::<Envelope>(json) {
            Ok(e) if e.kind == "structured_replay" => e,
            _ => {
                if self.rebuild.is_some() {
                    return self.abandon(ReplayProblem::Malformed);
                }
                self.effects.push_back(ClientEffect::RequestReplay);
                return ReplayOutcome::RequestReplay(ReplayProblem::Malformed);
            }
        };
        if envelope.seq == 0 {
            // Clear and rebuild (into a staged copy).
            self.rebuild = Some(Rebuild {
                next_chunk: 0,
                staged: State::default(),
                deadline: now,
            });
        }
        let Some(rebuild) = self.rebuild.as_mut() else {
            return ReplayOutcome::Ignored;
        };
        if envelope.seq != rebuild.next_chunk {
            return self.abandon(ReplayProblem::OutOfOrder);
        }
        rebuild.next_chunk = rebuild.next_chunk.saturating_add(1);
        rebuild.deadline = now.saturating_add(CHUNK_TIMEOUT);
        let mut pending = self.pending.clone();
        for event in &envelope.events {
            let Some(seq) = wire_seq(event) else {
                continue;
            };
            if rebuild.staged.last_seq.is_some_and(|l| seq <= l) {
                continue;
            }
            // Live-only side effects are suppressed: no effect sink.
            apply(&mut rebuild.staged, &mut pending, event, None, 0);
        }
        if !envelope.last {
            return ReplayOutcome::Progress;
        }
        let Some(mut done) = self.rebuild.take() else {
            return ReplayOutcome::Progress;
        };
        done.staged.truncated = envelope.truncated;
        let was_running = self.state.running;
        done.staged.running = envelope.running.running;
        self.state = done.staged;
        self.pending = pending;
        self.reclaimed = envelope.reclaimed;
        if was_running != self.state.running {
            self.effects
                .push_back(ClientEffect::RunningChanged(self.state.running));
        }
        for event in std::mem::take(&mut self.buffered) {
            if let ReplayOutcome::RequestReplay(_) = self.apply_live(event) {
                break;
            }
        }
        ReplayOutcome::Complete
    }
}

/// The one reducer for live and replayed events. `effects` is `None` while replaying.
fn apply(
    state: &mut State,
    pending: &mut Vec<(String, String)>,
    event: &serde_json::Value,
    mut effects: Option<&mut Vec<ClientEffect>>,
    queued: usize,
) {
    let seq = wire_seq(event).unwrap_or(0);
    state.last_seq = Some(state.last_seq.map_or(seq, |l| l.max(seq)));
    let text = |k: &str| {
        event
            .get(k)
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let mut emit = |e: ClientEffect| {
        if let Some(out) = effects.as_deref_mut() {
            out.push(e);
        }
    };
    match event.get("type").and_then(serde_json::Value::as_str) {
        Some("session_init") => state.entries.push(Entry {
            seq,
            kind: EntryKind::Init,
            text: String::new(),
        }),
        Some("user_message") => {
            let client_id = event
                .get("clientId")
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned);
            if let Some(c) = &client_id {
                pending.retain(|(id, _)| id != c);
            }
            state.entries.push(Entry {
                seq,
                kind: EntryKind::User { client_id },
                text: text("text"),
            });
        }
        Some("assistant_delta") => match state.entries.last_mut() {
            Some(last) if last.kind == EntryKind::Assistant => last.text.push_str(&text("text")),
            _ => state.entries.push(Entry {
                seq,
                kind: EntryKind::Assistant,
                text: text("text"),
            }),
        },
        Some("approval_request") => {
            let request_id = text("requestId");
            let outcome = event
                .get("outcome")
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned);
            if outcome.is_none() {
                emit(ClientEffect::ApprovalReady {
                    request_id: request_id.clone(),
                });
            }
            state.entries.push(Entry {
                seq,
                kind: EntryKind::Approval {
                    request_id,
                    outcome,
                },
                text: text("text"),
            });
        }
        Some("approval_decided") => {
            let id = text("requestId");
            let outcome = if event.get("allowed").and_then(serde_json::Value::as_bool) == Some(true)
            {
                "allowed"
            } else {
                "denied"
            };
            for e in state.entries.iter_mut() {
                if let EntryKind::Approval {
                    request_id,
                    outcome: o,
                } = &mut e.kind
                {
                    if *request_id == id {
                        *o = Some(outcome.to_owned());
                    }
                }
            }
        }
        Some("run_state") => {
            let running = event.get("running").and_then(serde_json::Value::as_bool) == Some(true);
            if running != state.running {
                state.running = running;
                emit(ClientEffect::RunningChanged(running));
                emit(if running {
                    ClientEffect::StartWatchdog
                } else {
                    ClientEffect::StopWatchdog
                });
                if !running && queued > 0 {
                    emit(ClientEffect::DispatchQueued);
                }
            }
        }
        Some("replay_event_omitted") => state.entries.push(Entry {
            seq: event
                .get("seq")
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(seq),
            kind: EntryKind::Omitted {
                bytes: event
                    .get("bytes")
                    .and_then(serde_json::Value::as_u64)
                    .unwrap_or(0),
            },
            text: String::new(),
        }),
        // Unknown event types are ignored (additive protocol).
        _ => {}
    }
}

/// An event's `seq`, when it is a wire integer (0 to 2^53-1).
fn wire_seq(event: &serde_json::Value) -> Option<u64> {
    event
        .get("seq")
        .and_then(serde_json::Value::as_u64)
        .filter(|n| crate::wire::WireInt::new(*n).is_ok())
}
