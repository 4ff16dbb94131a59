//! The per-session transcript the server replays to a joining client (RB-01 to RB-05).
//!
//! Every event the server broadcasts for a session is appended, in order, to a ring
//! buffer with an event-count cap and a byte cap. Past either cap the oldest events go,
//! except the session-initialization event, which is never trimmed; any trim sets
//! `truncated`. User messages, steers included, are appended by the server at their
//! true position ([`ReplayBuffers::append_user_message`]).
//!
//! Events are kept in their serialized form, so the byte total is exact (it is the size
//! of what is replayed) and a replay is mostly a copy. A replay is a series of
//! `structured_replay` envelopes (`seq`, `last`, `truncated`, `reclaimed`, `running`,
//! `events`), each at most 256 KB serialized, in order. Approval events already decided
//! are stamped with their outcome (`"outcome": "allowed" | "denied"`), so no old card
//! looks actionable.
//!
//! A single event larger than a chunk cannot travel in one: it is replaced, in its
//! place, by `{"type":"replay_event_omitted","seq":N,"bytes":B}`, and the replay is
//! marked truncated. It is never dropped silently and never splits or loops.
//!
//! Sessions nobody subscribes to for longer than the idle time are reclaimed (bounded
//! memory) at the deadline [`ReplayBuffers::poll_timeout`] returns; a session resumed
//! after that starts empty and its replay says `reclaimed: true`.
//!
//! ```
//! use overlay_core::replay::{ReplayBuffers, ReplayConfig, EventKind};
//! use timeline_core::key::SessionId;
//! use timeline_core::time::Millis;
//!
//! let s = SessionId::new("s").unwrap();
//! let mut buffers = ReplayBuffers::new(ReplayConfig::default());
//! buffers.append(&s, EventKind::Init, r#"{"type":"session_init"}"#.into(), Millis(0));
//! buffers.append_user_message(&s, "hi", Some("client-1"), Millis(1));
//! let chunks = buffers.replay(&s);
//! assert_eq!(chunks.len(), 1);
//! assert!(chunks[0].json.starts_with(r#"{"type":"structured_replay","seq":0,"last":true"#));
//! ```

use std::collections::{BTreeMap, HashMap, VecDeque};

use serde::{Deserialize, Serialize};
use timeline_core::key::SessionId;
use timeline_core::time::Millis;

/// The largest serialized replay chunk (iOS WebSocket frames stop near 1 MiB).
pub const MAX_CHUNK_BYTES: usize = 256 * 1024;

/// Caps and timers of the buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplayConfig {
    /// Most events kept per session (the init event not counted).
    pub max_events: usize,
    /// Most bytes of serialized events kept per session (the init event counted).
    pub max_bytes: usize,
    /// A session with no subscriber for this long is reclaimed.
    pub idle_reclaim: Millis,
    /// The largest serialized chunk.
    pub chunk_bytes: usize,
}

impl Default for ReplayConfig {
    fn default() -> Self {
        ReplayConfig {
            max_events: 10_000,
            max_bytes: 16 * 1024 * 1024,
            idle_reclaim: Millis::from_secs(30 * 60),
            chunk_bytes: MAX_CHUNK_BYTES,
        }
    }
}

/// What kind of event an appended event is (the buffer needs only this much).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EventKind {
    /// The session-initialization event: the anchor of a replay, never trimmed.
    Init,
    /// An approval request; its outcome is stamped in replays once decided.
    Approval {
        /// The request ID.
        request_id: String,
    },
    /// Anything else.
    Other,
}

/// The running state a replay's client adopts after its last chunk.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunningState {
    /// True while a run works.
    pub running: bool,
    /// The run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
}

/// An event as kept: its object JSON without `seq`, which replays and broadcasts put
/// first (`{"seq":N,...}`), so appending copies nothing.
#[derive(Clone, Debug)]
struct Stored {
    seq: u64,
    json: String,
    approval: Option<String>,
}

impl Stored {
    /// The exact size of the event as replayed.
    fn len(&self) -> usize {
        seq_len(self.seq, &self.json)
    }
}

#[derive(Debug, Default)]
struct SessionLog {
    init: Option<Stored>,
    events: VecDeque<Stored>,
    bytes: usize,
    truncated: bool,
    reclaimed: bool,
    next_seq: u64,
    decided: HashMap<String, bool>,
    running: RunningState,
    subscribers: usize,
    idle_since: Option<Millis>,
}

/// One `structured_replay` envelope, serialized.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayChunk {
    /// Chunk number (0 clears and rebuilds).
    pub seq: u64,
    /// True on the last chunk.
    pub last: bool,
    /// The envelope JSON.
    pub json: String,
}

/// The replay buffers of every session.
#[derive(Debug)]
pub struct ReplayBuffers {
    config: ReplayConfig,
    sessions: BTreeMap<SessionId, SessionLog>,
    reclaimed: BTreeMap<SessionId, ()>,
}

impl ReplayBuffers {
    /// Empty buffers.
    pub fn new(config: ReplayConfig) -> Self {
        ReplayBuffers {
            config,
            sessions: BTreeMap::new(),
            reclaimed: BTreeMap::new(),
        }
    }

    fn log(&mut self, session: &SessionId, now: Millis) -> &mut SessionLog {
        if !self.sessions.contains_key(session) {
            let mut log = SessionLog {
                idle_since: Some(now),
                ..SessionLog::default()
            };
            // A session resumed after a reclaim starts empty and says so.
            log.reclaimed = self.reclaimed.remove(session).is_some();
            self.sessions.insert(session.clone(), log);
        }
        let log = self.sessions.get_mut(session).expect("inserted above");
        if log.subscribers == 0 && log.idle_since.is_none() {
            log.idle_since = Some(now);
        }
        log
    }

    /// Appends a serialized event (a JSON object); returns its sequence number. The
    /// stored and broadcast form carries `"seq"` first ([`ReplayBuffers::event`]). Trims
    /// the oldest events (never the init event) past either cap. O(1) amortized.
    pub fn append(
        &mut self,
        session: &SessionId,
        kind: EventKind,
        json: String,
        now: Millis,
    ) -> u64 {
        let (max_events, max_bytes) = (self.config.max_events, self.config.max_bytes);
        let json = object_form(json);
        // One lookup on the hot path; a new session takes the slow one.
        let log = match self.sessions.get_mut(session) {
            Some(log) => log,
            None => self.log(session, now),
        };
        if log.subscribers == 0 && log.idle_since.is_none() {
            log.idle_since = Some(now);
        }
        push(log, max_events, max_bytes, kind, json)
    }

    /// The broadcast form of event `seq` (`{"seq":N,...}`), while it is kept.
    pub fn event(&self, session: &SessionId, seq: u64) -> Option<String> {
        let log = self.sessions.get(session)?;
        let stored = match log.init.as_ref().filter(|i| i.seq == seq) {
            Some(init) => init,
            None => {
                let first = log.events.front()?.seq;
                // Sequence numbers are dense among kept events, except where the init
                // event sits.
                let guess = seq.checked_sub(first)? as usize;
                let start = guess.saturating_sub(1).min(log.events.len());
                log.events.range(start..).take(3).find(|e| e.seq == seq)?
            }
        };
        let mut out = String::with_capacity(stored.len());
        write_with_seq(&mut out, stored.seq, &stored.json);
        Some(out)
    }

    /// Appends a serialized event built from a value.
    pub fn append_value(
        &mut self,
        session: &SessionId,
        kind: EventKind,
        event: &serde_json::Value,
        now: Millis,
    ) -> u64 {
        self.append(session, kind, event.to_string(), now)
    }

    /// The server records a user message (a steer too) at its true position (RB-02).
    pub fn append_user_message(
        &mut self,
        session: &SessionId,
        text: &str,
        client_id: Option<&str>,
        now: Millis,
    ) -> u64 {
        let event =
            serde_json::json!({ "type": "user_message", "text": text, "clientId": client_id });
        self.append_value(session, EventKind::Other, &event, now)
    }

    /// Records an approval decision; replays stamp the request with it.
    pub fn decide_approval(&mut self, session: &SessionId, request_id: &str, allowed: bool) {
        if let Some(log) = self.sessions.get_mut(session) {
            log.decided.insert(request_id.to_owned(), allowed);
        }
    }

    /// Sets the running state a replay carries.
    pub fn set_running(&mut self, session: &SessionId, running: RunningState, now: Millis) {
        self.log(session, now).running = running;
    }

    /// Exact serialized bytes of the events kept (init included).
    pub fn bytes(&self, session: &SessionId) -> usize {
        self.sessions.get(session).map_or(0, |l| l.bytes)
    }

    /// Events kept (init excluded).
    pub fn len(&self, session: &SessionId) -> usize {
        self.sessions.get(session).map_or(0, |l| l.events.len())
    }

    /// True when no events are kept for the session.
    pub fn is_empty(&self, session: &SessionId) -> bool {
        self.len(session) == 0
    }

    /// A client subscribed.
    pub fn subscribe(&mut self, session: &SessionId, now: Millis) {
        let log = self.log(session, now);
        log.subscribers += 1;
        log.idle_since = None;
    }

    /// A client unsubscribed; the idle clock starts when the last one leaves.
    pub fn unsubscribe(&mut self, session: &SessionId, now: Millis) {
        if let Some(log) = self.sessions.get_mut(session) {
            log.subscribers = log.subscribers.saturating_sub(1);
            if log.subscribers == 0 {
                log.idle_since = Some(now);
            }
        }
    }

    /// The next reclaim deadline.
    pub fn poll_timeout(&self) -> Option<Millis> {
        self.sessions
            .values()
            .filter_map(|l| l.idle_since)
            .map(|t| t.saturating_add(self.config.idle_reclaim))
            .min()
    }

    /// Reclaims sessions idle past the limit. Safe to call early or twice.
    pub fn handle_timeout(&mut self, now: Millis) {
        let idle = self.config.idle_reclaim;
        let gone: Vec<SessionId> = self
            .sessions
            .iter()
            .filter(|(_, l)| l.idle_since.is_some_and(|t| t.saturating_add(idle) <= now))
            .map(|(s, _)| s.clone())
            .collect();
        for s in gone {
            self.sessions.remove(&s);
            self.reclaimed.insert(s, ());
        }
    }

    /// True when the session was reclaimed and nothing was appended since.
    pub fn was_reclaimed(&self, session: &SessionId) -> bool {
        self.reclaimed.contains_key(session)
            || self.sessions.get(session).is_some_and(|l| l.reclaimed)
    }

    /// The replay of a session, in chunks of at most `chunk_bytes` serialized each.
    pub fn replay(&self, session: &SessionId) -> Vec<ReplayChunk> {
        let mut chunks = Vec::new();
        let mut buf = String::new();
        self.replay_with(session, &mut buf, |seq, last, json| {
            chunks.push(ReplayChunk {
                seq,
                last,
                json: json.to_owned(),
            })
        });
        chunks
    }

    /// Streams the replay: each chunk is built in `buf` (reused across chunks and
    /// calls) and handed to `send` before the next one is built, so a server sends
    /// 256 KB at a time without allocating a buffer per chunk.
    pub fn replay_with(
        &self,
        session: &SessionId,
        buf: &mut String,
        mut send: impl FnMut(u64, bool, &str),
    ) {
        let empty = SessionLog::default();
        let log = self.sessions.get(session).unwrap_or(&empty);
        let reclaimed = self.was_reclaimed(session);
        let running = serde_json::to_string(&log.running).unwrap_or_else(|_| "{}".into());
        let budget = self
            .config
            .chunk_bytes
            .saturating_sub(header_len(u64::MAX, &running) + 2);
        // Events in order, decided approvals stamped, oversize ones replaced.
        let mut truncated = log.truncated || reclaimed;
        let mut events: Vec<(u64, std::borrow::Cow<'_, str>)> =
            Vec::with_capacity(log.events.len() + 1);
        for e in log.init.iter().chain(log.events.iter()) {
            let json: std::borrow::Cow<'_, str> =
                match e.approval.as_ref().and_then(|id| log.decided.get(id)) {
                    Some(allowed) => stamp(&e.json, *allowed).into(),
                    None => e.json.as_str().into(),
                };
            let len = seq_len(e.seq, &json);
            if len > budget {
                truncated = true;
                let marker = format!(r#"{{"type":"replay_event_omitted","bytes":{len}}}"#);
                events.push((e.seq, marker.into()));
            } else {
                events.push((e.seq, json));
            }
        }
        // Pack: a chunk closes when the next event would pass the cap.
        let mut start = 0;
        let mut seq = 0u64;
        loop {
            let room = self.config.chunk_bytes - header_len(seq, &running) - 2;
            let mut end = start;
            let mut used = 0;
            while end < events.len() {
                let add = seq_len(events[end].0, &events[end].1) + usize::from(end > start);
                if used + add > room {
                    break;
                }
                used += add;
                end += 1;
            }
            let last = end >= events.len();
            buf.clear();
            buf.push_str(&header(seq, last, truncated, reclaimed, &running));
            for (i, (seq, json)) in events[start..end].iter().enumerate() {
                if i > 0 {
                    buf.push(',');
                }
                write_with_seq(buf, *seq, json);
            }
            buf.push_str("]}");
            send(seq, last, buf);
            if last {
                break;
            }
            start = end;
            seq += 1;
        }
    }
}

/// Appends to one session's log and trims past either cap; returns the seq.
fn push(
    log: &mut SessionLog,
    max_events: usize,
    max_bytes: usize,
    kind: EventKind,
    json: String,
) -> u64 {
    let seq = log.next_seq;
    log.next_seq = seq + 1;
    log.bytes += seq_len(seq, &json);
    let (is_init, approval) = match kind {
        EventKind::Init => (true, None),
        EventKind::Approval { request_id } => (false, Some(request_id)),
        EventKind::Other => (false, None),
    };
    let stored = Stored {
        seq,
        json,
        approval,
    };
    if is_init {
        if let Some(old) = log.init.replace(stored) {
            log.bytes -= old.len();
        }
    } else {
        log.events.push_back(stored);
    }
    while log.events.len() > max_events || (log.bytes > max_bytes && !log.events.is_empty()) {
        if let Some(old) = log.events.pop_front() {
            log.bytes -= old.len();
            log.truncated = true;
            if let Some(id) = &old.approval {
                log.decided.remove(id);
            }
        }
    }
    seq
}

/// An event as an object: serialized objects are kept as they are; anything else is
/// wrapped as `{"event":...}`.
fn object_form(json: String) -> String {
    let trimmed = json.trim();
    if trimmed.starts_with('{') && trimmed.ends_with('}') {
        if trimmed.len() == json.len() {
            return json;
        }
        return trimmed.to_owned();
    }
    format!(r#"{{"event":{trimmed}}}"#)
}

fn digits(n: u64) -> usize {
    if n == 0 {
        1
    } else {
        n.ilog10() as usize + 1
    }
}

/// True for `{}` (with any inner whitespace).
fn empty_object(json: &str) -> bool {
    json[1..json.len() - 1].trim().is_empty()
}

/// The size of `json` with `"seq":N` put first.
fn seq_len(seq: u64, json: &str) -> usize {
    if empty_object(json) {
        8 + digits(seq)
    } else {
        json.len() + 7 + digits(seq)
    }
}

/// Writes `json` with `"seq":N` put first.
fn write_with_seq(out: &mut String, seq: u64, json: &str) {
    use std::fmt::Write as _;
    out.push_str(r#"{"seq":"#);
    let _ = write!(out, "{seq}");
    if empty_object(json) {
        out.push('}');
    } else {
        out.push(',');
        out.push_str(&json[1..]);
    }
}

fn header(seq: u64, last: bool, truncated: bool, reclaimed: bool, running: &str) -> String {
    format!(
        r#"{{"type":"structured_replay","seq":{seq},"last":{last},"truncated":{truncated},"reclaimed":{reclaimed},"running":{running},"events":["#
    )
}

/// The longest header of chunk `seq` (`false` is longer than `true`).
fn header_len(seq: u64, running: &str) -> usize {
    header(seq, false, false, false, running).len()
}

/// Adds `"outcome"` to a serialized approval event.
fn stamp(json: &str, allowed: bool) -> String {
    match serde_json::from_str::<serde_json::Value>(json) {
        Ok(serde_json::Value::Object(mut map)) => {
            map.insert(
                "outcome".into(),
                serde_json::Value::String(if allowed { "allowed" } else { "denied" }.into()),
            );
            serde_json::Value::Object(map).to_string()
        }
        _ => json.to_owned(),
    }
}
