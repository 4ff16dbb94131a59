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
//! `events`), in order. Approval events already decided are stamped with their outcome
//! (`"outcome": "allowed" | "denied"`), so no old card looks actionable.
//!
//! # Events are checked at the boundary
//!
//! [`ReplayBuffers::append`] takes exactly one JSON object and refuses anything else
//! with [`AppendError::InvalidEvent`], handing the text back and leaving the buffer as
//! it was: empty text, invalid JSON, a value that is not an object (array, number,
//! string, ...), an object followed by more text (`{"a":1}{"b":2}`: a second event
//! must never ride in on the first), an object nested deeper than [`MAX_EVENT_DEPTH`]
//! (a replay envelope adds two levels and a client's JSON parser has a recursion
//! limit), and an object with a top-level `"seq"` key (the buffer assigns `seq`; a
//! second one would override it in a client's parse). "JSON" means what a client's
//! `serde_json` parse into a value accepts: numbers out of the `f64` range and lone
//! UTF-16 surrogates in escapes are refused too, since one such event would make every
//! later replay chunk carrying it unreadable. JSON whitespace around the object is
//! allowed and removed (in place); whitespace inside is kept.
//!
//! The check reads the text once and allocates nothing: a byte-level reader of the JSON
//! grammar takes the events producers write, string content 64 and 8 bytes at a time.
//! What it is not sure of (an error of any kind, a `\u` escape of a UTF-16 surrogate, a
//! number that might pass the `f64` range, a top-level key with an escape) goes to
//! `serde_json`'s parser, which decides and names the problem; so what is accepted and
//! the problem a refusal names are `serde_json`'s, and only such texts are read twice.
//!
//! # Every replay ends
//!
//! A chunk is at most [`ReplayConfig::chunk_bytes`] serialized (256 KB by default: iOS
//! WebSocket frames stop near 1 MiB). The parts of a chunk are the envelope (with the
//! running state) and the events, and none of them can make a replay loop or pass the
//! limit unannounced:
//!
//! - An event whose replayed form (stamped, with its `seq`) does not fit in a chunk
//!   beside the envelope is replaced, in its place, by
//!   `{"seq":N,"type":"replay_event_omitted","bytes":B}`, and the replay is marked
//!   truncated. It is never dropped silently and never split.
//! - A running state is refused when it is set ([`RunningStateError::TooLarge`]) if an
//!   envelope carrying it would have no room left for one such marker; the previous
//!   state stays.
//! - Only a `chunk_bytes` too small for an envelope with one marker (under 214 bytes
//!   plus the serialized running state, 231 with the default state: a configuration
//!   mistake) makes a chunk pass the limit: then each chunk carries exactly one event
//!   (a marker when the event does not fit either), or none when there are none. Such a
//!   configuration refuses every [`ReplayBuffers::set_running`].
//!
//! Every chunk but the last carries at least one event, so a replay of `n` kept events
//! has at most `max(1, n)` chunks, and together they carry every kept event exactly
//! once, in order.
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
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let s = SessionId::new("s")?;
//! let mut buffers = ReplayBuffers::new(ReplayConfig::default());
//! buffers.append(&s, EventKind::Init, r#"{"type":"session_init"}"#.into(), Millis(0))?;
//! buffers.append_user_message(&s, "hi", Some("client-1"), Millis(1));
//! // Two objects in one append are refused; nothing is stored.
//! let smuggled = r#"{"type":"x"}{"type":"approval_request"}"#;
//! assert!(buffers.append(&s, EventKind::Other, smuggled.into(), Millis(2)).is_err());
//! let chunks = buffers.replay(&s);
//! assert_eq!(chunks.len(), 1);
//! assert!(chunks[0].json.starts_with(r#"{"type":"structured_replay","seq":0,"last":true"#));
//! # Ok(())
//! # }
//! ```

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use timeline_core::key::SessionId;
use timeline_core::time::Millis;

/// The largest serialized replay chunk (iOS WebSocket frames stop near 1 MiB).
pub const MAX_CHUNK_BYTES: usize = 256 * 1024;

/// The deepest nesting an appended event may have (the event object itself is level 1).
/// A replay envelope adds two levels, and `serde_json` refuses more than 127.
pub const MAX_EVENT_DEPTH: usize = 100;

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
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct RunningState {
    /// True while a run works.
    pub running: bool,
    /// The run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
}

/// Why [`ReplayBuffers::append`] refused an event. Nothing was stored.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AppendError {
    /// The text is not exactly one JSON object a replay can carry. The producer is at
    /// fault; appending the same text again is refused again.
    #[error("replay event refused: {problem}")]
    InvalidEvent {
        /// What is wrong with the text.
        problem: EventProblem,
        /// The refused text, handed back unchanged.
        json: String,
    },
}

/// What is wrong with a refused event's text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EventProblem {
    /// Empty text, or JSON whitespace only.
    #[error("the text is empty")]
    Empty,
    /// Not JSON a client can parse (syntax, a number out of range, a lone surrogate).
    #[error("not valid JSON: {message}")]
    Syntax {
        /// 1-based line of the fault.
        line: usize,
        /// 1-based column of the fault.
        column: usize,
        /// The parser's message (with the position).
        message: String,
    },
    /// Valid JSON, but not an object.
    #[error("the JSON value is not an object")]
    NotAnObject,
    /// More text follows the object (a second object, a comma, ...).
    #[error("text follows the object at line {line}, column {column}")]
    TrailingText {
        /// 1-based line where the extra text starts.
        line: usize,
        /// 1-based column where the extra text starts.
        column: usize,
    },
    /// The object nests deeper than [`MAX_EVENT_DEPTH`].
    #[error("the object nests deeper than {limit} levels")]
    TooDeep {
        /// The limit ([`MAX_EVENT_DEPTH`]).
        limit: usize,
    },
    /// The object has its own top-level `"seq"`; only the buffer assigns one.
    #[error(r#"the object has a top-level "seq", which only the replay buffer assigns"#)]
    ReservedSeq,
}

/// Why [`ReplayBuffers::set_running`] refused a running state. The previous state stays.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RunningStateError {
    /// Serialized, the running state would leave a replay chunk no room for one event.
    #[error("running state of {bytes} bytes passes the {limit} bytes a replay chunk leaves it")]
    TooLarge {
        /// Its serialized size.
        bytes: usize,
        /// The largest serialized running state the configured chunk size allows.
        limit: usize,
        /// The refused state, handed back.
        running: RunningState,
    },
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
        let reclaimed = &mut self.reclaimed;
        let log = self
            .sessions
            .entry(session.clone())
            .or_insert_with(|| SessionLog {
                idle_since: Some(now),
                // A session resumed after a reclaim starts empty and says so.
                reclaimed: reclaimed.remove(session).is_some(),
                ..SessionLog::default()
            });
        if log.subscribers == 0 && log.idle_since.is_none() {
            log.idle_since = Some(now);
        }
        log
    }

    /// Appends a serialized event, which must be exactly one JSON object (see the module
    /// docs); returns its sequence number. Surrounding JSON whitespace is removed. The
    /// stored and broadcast form carries `"seq"` first ([`ReplayBuffers::event`]). Trims
    /// the oldest events (never the init event) past either cap. One validating pass
    /// over the text (see the module docs), then O(1) amortized.
    ///
    /// # Errors
    ///
    /// [`AppendError::InvalidEvent`] for anything but one object a replay can carry;
    /// the buffer is unchanged and the text is handed back.
    pub fn append(
        &mut self,
        session: &SessionId,
        kind: EventKind,
        json: String,
        now: Millis,
    ) -> Result<u64, AppendError> {
        let json = checked_event(json)?;
        Ok(self.store(session, kind, json, now))
    }

    /// Stores an event already known to be one object a replay can carry.
    fn store(&mut self, session: &SessionId, kind: EventKind, json: String, now: Millis) -> u64 {
        let (max_events, max_bytes) = (self.config.max_events, self.config.max_bytes);
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
                let guess = usize::try_from(seq.checked_sub(first)?).ok()?;
                let start = guess.saturating_sub(1).min(log.events.len());
                log.events.range(start..).take(3).find(|e| e.seq == seq)?
            }
        };
        let mut out = String::with_capacity(stored.len());
        write_with_seq(&mut out, stored.seq, &stored.json);
        Some(out)
    }

    /// Appends a serialized event built from a value, checked like
    /// [`ReplayBuffers::append`].
    ///
    /// # Errors
    ///
    /// [`AppendError::InvalidEvent`] when the value is not an object, nests deeper than
    /// [`MAX_EVENT_DEPTH`] or has a top-level `"seq"`; the buffer is unchanged.
    pub fn append_value(
        &mut self,
        session: &SessionId,
        kind: EventKind,
        event: &serde_json::Value,
        now: Millis,
    ) -> Result<u64, AppendError> {
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
        // Always one flat object without "seq": nothing to check.
        let event =
            serde_json::json!({ "type": "user_message", "text": text, "clientId": client_id });
        self.store(session, EventKind::Other, event.to_string(), now)
    }

    /// Records an approval decision; replays stamp the request with it.
    pub fn decide_approval(&mut self, session: &SessionId, request_id: &str, allowed: bool) {
        if let Some(log) = self.sessions.get_mut(session) {
            log.decided.insert(request_id.to_owned(), allowed);
        }
    }

    /// Sets the running state a replay carries.
    ///
    /// # Errors
    ///
    /// [`RunningStateError::TooLarge`] when an envelope carrying it would leave a chunk
    /// no room for one event; the previous state stays and the state is handed back.
    pub fn set_running(
        &mut self,
        session: &SessionId,
        running: RunningState,
        now: Millis,
    ) -> Result<(), RunningStateError> {
        let bytes = running_json(&running).len();
        let limit = self.running_limit();
        if bytes > limit {
            return Err(RunningStateError::TooLarge {
                bytes,
                limit,
                running,
            });
        }
        self.log(session, now).running = running;
        Ok(())
    }

    /// The largest serialized running state that leaves a chunk room for one event
    /// marker beside the envelope.
    fn running_limit(&self) -> usize {
        self.config
            .chunk_bytes
            .saturating_sub(frame_len(u64::MAX, "") + max_marker_len())
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
    #[must_use]
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

    /// Drops the replay of `session` now, as an idle reclaim does: its next replay starts
    /// empty and says it was reclaimed. For a session this host let go (another host
    /// serves it): what it recorded would show a gap if it came back here.
    pub fn reclaim(&mut self, session: &SessionId) {
        if self.sessions.remove(session).is_some() {
            self.reclaimed.insert(session.clone(), ());
        }
    }

    /// True when the session was reclaimed and nothing was appended since.
    pub fn was_reclaimed(&self, session: &SessionId) -> bool {
        self.reclaimed.contains_key(session)
            || self.sessions.get(session).is_some_and(|l| l.reclaimed)
    }

    /// The replay of a session, in chunks of at most `chunk_bytes` serialized each
    /// (except in the one documented case of the module docs). Always ends: at most
    /// `max(1, n)` chunks for `n` kept events.
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
    /// 256 KB at a time without allocating a buffer per chunk. `send` is called at most
    /// `max(1, n)` times for `n` kept events, the last time with `last == true`.
    pub fn replay_with(
        &self,
        session: &SessionId,
        buf: &mut String,
        mut send: impl FnMut(u64, bool, &str),
    ) {
        let empty = SessionLog::default();
        let log = self.sessions.get(session).unwrap_or(&empty);
        let reclaimed = self.was_reclaimed(session);
        let running = running_json(&log.running);
        let chunk_bytes = self.config.chunk_bytes;
        // Room for events in any chunk: the longest envelope has a 20-digit chunk seq.
        let budget = chunk_bytes.saturating_sub(frame_len(u64::MAX, &running));
        // Events in order, decided approvals stamped, oversize ones replaced.
        let mut truncated = log.truncated || reclaimed;
        let mut events: Vec<(u64, Cow<'_, str>)> = Vec::with_capacity(log.events.len() + 1);
        for e in log.init.iter().chain(log.events.iter()) {
            let json: Cow<'_, str> = match e.approval.as_ref().and_then(|id| log.decided.get(id)) {
                Some(allowed) => stamp(&e.json, *allowed).into(),
                None => e.json.as_str().into(),
            };
            let len = seq_len(e.seq, &json);
            if len > budget {
                truncated = true;
                events.push((e.seq, omitted(len).into()));
            } else {
                events.push((e.seq, json));
            }
        }
        // Pack: a chunk closes when the next event would pass the cap. Its first event
        // is always taken, so every chunk but the last makes progress; it fits unless
        // `chunk_bytes` cannot hold an envelope with one marker.
        let mut rest = events.as_slice();
        let mut seq = 0u64;
        loop {
            let room = chunk_bytes.saturating_sub(frame_len(seq, &running));
            let mut take = 0;
            let mut used = 0usize;
            for (i, (event_seq, json)) in rest.iter().enumerate() {
                let add = seq_len(*event_seq, json).saturating_add(usize::from(i > 0));
                if i > 0 && used.saturating_add(add) > room {
                    break;
                }
                used = used.saturating_add(add);
                take = i + 1;
            }
            let (these, later) = rest.split_at(take);
            let last = later.is_empty();
            buf.clear();
            buf.push_str(&header(seq, last, truncated, reclaimed, &running));
            for (i, (event_seq, json)) in these.iter().enumerate() {
                if i > 0 {
                    buf.push(',');
                }
                write_with_seq(buf, *event_seq, json);
            }
            buf.push_str("]}");
            send(seq, last, buf);
            if last {
                break;
            }
            rest = later;
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

/// JSON whitespace (RFC 8259): narrower than [`char::is_whitespace`].
fn is_json_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r')
}

/// The event text if it is exactly one JSON object a replay can carry, with the JSON
/// whitespace around it removed in place.
///
/// One pass: [`plain_object`] reads the text once and accepts the events producers
/// write; a text it is not sure of (an error, a surrogate or a number near the `f64`
/// range, a top-level key with escapes) goes to [`check_object`], serde_json's own
/// parser, which decides and names the problem. So what is accepted and the problem a
/// refusal names are exactly [`check_object`]'s.
fn checked_event(mut json: String) -> Result<String, AppendError> {
    let (start, end) = match plain_object(json.as_bytes()) {
        Some(range) => range,
        None => {
            if let Err(problem) = check_object(&json) {
                return Err(AppendError::InvalidEvent { problem, json });
            }
            let end = json.trim_end_matches(is_json_space).len();
            let start = json.len() - json.trim_start_matches(is_json_space).len();
            (start, end)
        }
    };
    json.truncate(end);
    if start > 0 {
        json.drain(..start);
    }
    Ok(json)
}

/// Where [`plain_object`] is in the grammar.
#[derive(Clone, Copy)]
enum Expect {
    /// Just after `{`: a key or `}`.
    ObjectStart,
    /// A key (the `"` next).
    Key,
    /// Just after `[`: a value or `]`.
    ArrayStart,
    /// A value.
    Value,
    /// After a value: `,` or the container's close.
    After,
}

/// The most digits before the exponent plus a positive exponent a number may have for
/// [`plain_object`] to take it: every such number is below 10^300, far inside the `f64`
/// range, so serde_json parses it whatever its features. Others go to [`check_object`].
const PLAIN_NUMBER_MAGNITUDE: usize = 300;

/// The byte range of the object, without the JSON whitespace around it, when `text` is
/// certainly exactly one JSON object a replay can carry (what [`check_object`] accepts);
/// `None` when it is not certain. One pass, no allocation.
///
/// It follows the JSON grammar (RFC 8259) with an explicit stack of at most
/// [`MAX_EVENT_DEPTH`] levels. It answers `None`, leaving the verdict to
/// [`check_object`], at the first byte the grammar does not allow and also for what
/// only serde_json's parser decides exactly: a `\u` escape of a UTF-16 surrogate (a
/// valid pair or a lone one), a number of more than [`PLAIN_NUMBER_MAGNITUDE`] digits
/// and positive exponent together (it might pass the `f64` range), a top-level key that
/// holds an escape or is `seq`, nesting past the limit. So it accepts only texts that
/// [`check_object`] accepts, with the same range; the unit tests check that on random
/// texts.
fn plain_object(text: &[u8]) -> Option<(usize, usize)> {
    let mut at = skip_space(text, 0);
    let start = at;
    if text.get(at) != Some(&b'{') {
        return None;
    }
    at += 1;
    // Bit d of `arrays` is set while the container at depth d is an array (the event
    // object is depth 1); MAX_EVENT_DEPTH < 128.
    let mut depth = 1usize;
    let mut arrays = 0u128;
    let mut expect = Expect::ObjectStart;
    loop {
        at = skip_space(text, at);
        let byte = *text.get(at)?;
        expect = match expect {
            Expect::ObjectStart if byte == b'}' => {
                at += 1;
                depth -= 1;
                if depth == 0 {
                    break;
                }
                Expect::After
            }
            Expect::ObjectStart | Expect::Key => {
                if byte != b'"' {
                    return None;
                }
                let key = at + 1;
                let (end, escaped) = string_end(text, key)?;
                if depth == 1 && (escaped || text.get(key..end - 1) == Some(b"seq".as_slice())) {
                    return None;
                }
                at = skip_space(text, end);
                if text.get(at) != Some(&b':') {
                    return None;
                }
                at += 1;
                Expect::Value
            }
            Expect::ArrayStart if byte == b']' => {
                at += 1;
                depth -= 1;
                Expect::After
            }
            Expect::ArrayStart | Expect::Value => match byte {
                b'{' | b'[' => {
                    if depth >= MAX_EVENT_DEPTH {
                        return None;
                    }
                    depth += 1;
                    at += 1;
                    if byte == b'[' {
                        arrays |= 1 << depth;
                        Expect::ArrayStart
                    } else {
                        arrays &= !(1 << depth);
                        Expect::ObjectStart
                    }
                }
                b'"' => {
                    at = string_end(text, at + 1)?.0;
                    Expect::After
                }
                b'-' | b'0'..=b'9' => {
                    at = number_end(text, at)?;
                    Expect::After
                }
                b't' | b'f' | b'n' => {
                    let word: &[u8] = match byte {
                        b't' => b"true",
                        b'f' => b"false",
                        _ => b"null",
                    };
                    if !text.get(at..)?.starts_with(word) {
                        return None;
                    }
                    at += word.len();
                    Expect::After
                }
                _ => return None,
            },
            Expect::After => {
                let in_array = arrays & (1 << depth) != 0;
                match (byte, in_array) {
                    (b',', false) => {
                        at += 1;
                        Expect::Key
                    }
                    (b',', true) => {
                        at += 1;
                        Expect::Value
                    }
                    (b'}', false) | (b']', true) => {
                        at += 1;
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                        Expect::After
                    }
                    _ => return None,
                }
            }
        };
    }
    // Nothing but JSON whitespace after the object.
    (skip_space(text, at) == text.len()).then_some((start, at))
}

/// The index of the first byte at or after `at` that is not JSON whitespace.
fn skip_space(text: &[u8], mut at: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = text.get(at) {
        at += 1;
    }
    at
}

/// True for the bytes that end a run of plain string content: `"`, `\` and the
/// control characters JSON does not allow unescaped.
fn ends_plain(byte: u8) -> bool {
    byte == b'"' || byte == b'\\' || byte < 0x20
}

/// True when one of the `N` bytes from `at` [`ends_plain`], or fewer than `N` remain.
/// Written so the compiler checks all `N` at once (SSE2 on x86-64): a byte ends plain
/// content exactly when `(byte ^ 2).saturating_sub(0x20)` is 0 (`"` is 0x22, controls
/// are below 0x20) or `byte ^ b'\\'` is 0, so the smallest of those over the chunk is 0.
fn stops_within<const N: usize>(text: &[u8], at: usize) -> bool {
    match text.get(at..).and_then(<[u8]>::first_chunk::<N>) {
        Some(chunk) => {
            let mut least = u8::MAX;
            for &byte in chunk {
                least = least
                    .min((byte ^ 0x02).saturating_sub(0x20))
                    .min(byte ^ b'\\');
            }
            least == 0
        }
        None => true,
    }
}

/// `0x0101...01`: one in every byte of a word.
const ONES: u64 = u64::MAX / 255;

/// The index within the 8 bytes of `word` (little-endian) of the first one that
/// [`ends_plain`], if any. The bit tricks flag a byte that is zero after the XOR (`"`,
/// `\`) or below `0x20`; a borrow can only flag bytes after a flagged one, so the first
/// flag is exact.
fn first_stop(word: u64) -> Option<usize> {
    let control = word.wrapping_sub(ONES * 0x20) & !word;
    let quote = word ^ (ONES * u64::from(b'"'));
    let quote = quote.wrapping_sub(ONES) & !quote;
    let backslash = word ^ (ONES * u64::from(b'\\'));
    let backslash = backslash.wrapping_sub(ONES) & !backslash;
    let flags = (control | quote | backslash) & (ONES << 7);
    // trailing_zeros < 64, so the index is below 8.
    (flags != 0).then(|| (flags.trailing_zeros() / 8) as usize)
}

/// The 8 bytes from `at` as a little-endian word, if 8 remain.
fn word_at(text: &[u8], at: usize) -> Option<u64> {
    text.get(at..)
        .and_then(<[u8]>::first_chunk::<8>)
        .map(|bytes| u64::from_le_bytes(*bytes))
}

/// The index of the first byte at or after `at` that [`ends_plain`], or `text.len()`.
/// The text of an event is mostly string content: a short run (a key, a type name) is
/// read 8 bytes at a time; past 16 bytes (a text) 64 at a time, then 8 again for the
/// exact place.
fn plain_run_end(text: &[u8], mut at: usize) -> usize {
    let mut words = 0;
    loop {
        let Some(word) = word_at(text, at) else {
            // Fewer than 8 bytes left: one at a time.
            while text.get(at).is_some_and(|&b| !ends_plain(b)) {
                at += 1;
            }
            return at;
        };
        if let Some(i) = first_stop(word) {
            return at + i;
        }
        at += 8;
        words += 1;
        if words == 2 {
            while !stops_within::<64>(text, at) {
                at += 64;
            }
        }
    }
}

/// For a string whose content starts at `at` (just after its `"`): the index just after
/// its closing `"`, and whether it holds an escape. `None` for what the grammar does not
/// allow and for a `\u` escape of a UTF-16 surrogate (see [`plain_object`]).
fn string_end(text: &[u8], mut at: usize) -> Option<(usize, bool)> {
    let mut escaped = false;
    loop {
        at = plain_run_end(text, at);
        match *text.get(at)? {
            b'"' => return Some((at + 1, escaped)),
            b'\\' => {
                escaped = true;
                match *text.get(at + 1)? {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => at += 2,
                    b'u' => {
                        let mut unit = 0u32;
                        for &digit in text.get(at + 2..at + 6)? {
                            unit = unit * 16 + char::from(digit).to_digit(16)?;
                        }
                        if (0xD800..=0xDFFF).contains(&unit) {
                            return None;
                        }
                        at += 6;
                    }
                    _ => return None,
                }
            }
            // A control character.
            _ => return None,
        }
    }
}

/// The index of the first digit at or after `at` that is not one.
fn digits_end(text: &[u8], mut at: usize) -> usize {
    while text.get(at).is_some_and(u8::is_ascii_digit) {
        at += 1;
    }
    at
}

/// For a number starting at `at`: the index just after it. `None` for what the grammar
/// does not allow and for a number that might pass the `f64` range (more than
/// [`PLAIN_NUMBER_MAGNITUDE`] integer digits and positive exponent).
fn number_end(text: &[u8], mut at: usize) -> Option<usize> {
    if text.get(at) == Some(&b'-') {
        at += 1;
    }
    let integer = at;
    at = match *text.get(at)? {
        b'0' => at + 1,
        b'1'..=b'9' => digits_end(text, at + 1),
        _ => return None,
    };
    let integer_digits = at - integer;
    if text.get(at) == Some(&b'.') {
        let fraction = at + 1;
        at = digits_end(text, fraction);
        if at == fraction {
            return None;
        }
    }
    let mut magnitude = integer_digits;
    if let Some(b'e' | b'E') = text.get(at) {
        at += 1;
        let positive = match text.get(at) {
            Some(b'-') => {
                at += 1;
                false
            }
            Some(b'+') => {
                at += 1;
                true
            }
            _ => true,
        };
        let exponent = at;
        at = digits_end(text, exponent);
        if at == exponent {
            return None;
        }
        if positive {
            // Past PLAIN_NUMBER_MAGNITUDE anyway once it has more than 3 digits.
            let digits = text.get(exponent..at)?;
            let value = if digits.len() > 3 {
                usize::MAX
            } else {
                digits
                    .iter()
                    .fold(0usize, |v, &d| v * 10 + usize::from(d - b'0'))
            };
            magnitude = magnitude.saturating_add(value);
        }
    }
    (magnitude <= PLAIN_NUMBER_MAGNITUDE).then_some(at)
}

/// One pass over `text` with `serde_json`'s own parser (the one clients use), building
/// nothing: accepts exactly the texts that parse into one object value, no deeper than
/// [`MAX_EVENT_DEPTH`], without a top-level `"seq"`.
fn check_object(text: &str) -> Result<(), EventProblem> {
    if text.trim_matches(is_json_space).is_empty() {
        return Err(EventProblem::Empty);
    }
    let found = Cell::new(None);
    let mut de = serde_json::Deserializer::from_str(text);
    let part = Part {
        level: 1,
        found: &found,
    };
    if let Err(e) = part.deserialize(&mut de) {
        return Err(found.take().unwrap_or_else(|| EventProblem::Syntax {
            line: e.line(),
            column: e.column(),
            message: e.to_string(),
        }));
    }
    de.end().map_err(|e| EventProblem::TrailingText {
        line: e.line(),
        column: e.column(),
    })
}

/// A JSON value at nesting `level` (the event object is level 1). Records why it
/// refused in `found`, so the refusal keeps its type through `serde_json`'s error.
#[derive(Clone, Copy)]
struct Part<'a> {
    level: usize,
    found: &'a Cell<Option<EventProblem>>,
}

impl Part<'_> {
    fn refuse<E: de::Error>(self, problem: EventProblem) -> Result<(), E> {
        self.found.set(Some(problem));
        Err(E::custom("refused replay event"))
    }

    /// A scalar: fine inside the object, refused in its place.
    fn scalar<E: de::Error>(self) -> Result<(), E> {
        if self.level == 1 {
            return self.refuse(EventProblem::NotAnObject);
        }
        Ok(())
    }

    fn child(self) -> Self {
        Part {
            level: self.level + 1,
            found: self.found,
        }
    }
}

impl<'de> DeserializeSeed<'de> for Part<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Part<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.scalar()
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.scalar()
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.scalar()
    }

    fn visit_i128<E: de::Error>(self, _: i128) -> Result<(), E> {
        self.scalar()
    }

    fn visit_u128<E: de::Error>(self, _: u128) -> Result<(), E> {
        self.scalar()
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.scalar()
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        self.scalar()
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.scalar()
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.scalar()
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        if self.level == 1 {
            return self.refuse(EventProblem::NotAnObject);
        }
        if self.level > MAX_EVENT_DEPTH {
            return self.refuse(EventProblem::TooDeep {
                limit: MAX_EVENT_DEPTH,
            });
        }
        while seq.next_element_seed(self.child())?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        if self.level > MAX_EVENT_DEPTH {
            return self.refuse(EventProblem::TooDeep {
                limit: MAX_EVENT_DEPTH,
            });
        }
        let key = Key {
            top: self.level == 1,
            found: self.found,
        };
        while map.next_key_seed(key)?.is_some() {
            map.next_value_seed(self.child())?;
        }
        Ok(())
    }
}

/// An object key; at the top level `"seq"` (escaped or not) is refused.
#[derive(Clone, Copy)]
struct Key<'a> {
    top: bool,
    found: &'a Cell<Option<EventProblem>>,
}

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<(), E> {
        if self.top && key == "seq" {
            self.found.set(Some(EventProblem::ReservedSeq));
            return Err(E::custom("refused replay event"));
        }
        Ok(())
    }
}

/// The running state as every envelope carries it.
fn running_json(running: &RunningState) -> String {
    // Serializing a bool and a string cannot fail; the fallback keeps the field clients
    // require.
    serde_json::to_string(running)
        .unwrap_or_else(|_| format!(r#"{{"running":{}}}"#, running.running))
}

/// The marker that stands in for an event of `bytes` bytes too large for a chunk.
fn omitted(bytes: usize) -> String {
    format!(r#"{{"type":"replay_event_omitted","bytes":{bytes}}}"#)
}

/// The longest marker as replayed (20-digit seq and size).
fn max_marker_len() -> usize {
    seq_len(u64::MAX, &omitted(usize::MAX)).max(seq_len(u64::MAX, &omitted(0)))
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
    json.strip_prefix('{')
        .and_then(|j| j.strip_suffix('}'))
        .is_some_and(|inner| inner.trim_matches(is_json_space).is_empty())
}

/// The size of `json` with `"seq":N` put first.
fn seq_len(seq: u64, json: &str) -> usize {
    if empty_object(json) {
        8 + digits(seq)
    } else {
        json.len() + 7 + digits(seq)
    }
}

/// Writes `n` in decimal without allocating.
fn push_u64(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        // n % 10 < 10, so the cast keeps the value.
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for d in &digits[at..] {
        out.push(char::from(*d));
    }
}

/// Writes `json` with `"seq":N` put first.
fn write_with_seq(out: &mut String, seq: u64, json: &str) {
    out.push_str(r#"{"seq":"#);
    push_u64(out, seq);
    if empty_object(json) {
        out.push('}');
    } else {
        out.push(',');
        out.push_str(json.strip_prefix('{').unwrap_or(json));
    }
}

fn header(seq: u64, last: bool, truncated: bool, reclaimed: bool, running: &str) -> String {
    format!(
        r#"{{"type":"structured_replay","seq":{seq},"last":{last},"truncated":{truncated},"reclaimed":{reclaimed},"running":{running},"events":["#
    )
}

/// The most an envelope of chunk `seq` adds around its events: the longest header
/// (`false` is longer than `true`) and the closing `]}`.
fn frame_len(seq: u64, running: &str) -> usize {
    header(seq, false, false, false, running).len() + 2
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What the full check accepts, as a range without the whitespace around the object.
    fn slow(text: &str) -> Option<(usize, usize)> {
        check_object(text).ok()?;
        let end = text.trim_end_matches(is_json_space).len();
        let start = text.len() - text.trim_start_matches(is_json_space).len();
        Some((start, end))
    }

    /// The fast check accepts only what the full check accepts, with the same range.
    fn pinned(text: &str) -> Result<(), TestCaseError> {
        if let Some(range) = plain_object(text.as_bytes()) {
            prop_assert_eq!(Some(range), slow(text), "fast accepted {:?}", text);
        }
        Ok(())
    }

    #[test]
    fn the_fast_check_takes_the_events_producers_write() {
        for text in [
            r#"{"type":"assistant_delta","itemId":"item-1","text":"hello"}"#,
            " \n{ \"a\" : [1, -2.5e-3, 0, true, false, null, {\"seq\":1}, []], \"b\":{} }\t",
            r#"{"t":"\u00e9\n\"\\\/\b\f\r\t","u":"é😀"}"#,
            "{}",
            &format!(r#"{{"text":"{}"}}"#, "x".repeat(1_000)),
            &format!(r#"{{"n":1{}}}"#, "0".repeat(299)),
            r#"{"n":1e299,"m":123e-99999}"#,
        ] {
            assert_eq!(plain_object(text.as_bytes()), slow(text), "{text:?}");
            assert!(plain_object(text.as_bytes()).is_some(), "{text:?}");
        }
    }

    #[test]
    fn the_fast_check_leaves_what_only_serde_json_decides_to_it() {
        for text in [
            r#"{"t":"\ud83d\ude00"}"#, // a valid pair: accepted by the full check
            r#"{"t":"\udc00"}"#,
            r#"{"n":1e400}"#,
            r#"{"n":1e300}"#, // fine, but past what the fast check takes
            r#"{"\u0073eq":1}"#,
            r#"{"seq":1}"#,
            r#"{"a":1}{"b":2}"#,
            r#"{"a":1,}"#,
            r#"{"a":01}"#,
            r#"{"a":1.}"#,
            "{\"a\":\"\u{1}\"}",
            "[1]",
            "",
            "\u{a0}{}",
        ] {
            assert_eq!(plain_object(text.as_bytes()), None, "{text:?}");
        }
        let deep = |n: usize| format!("{{\"v\":{}0{}}}", "[".repeat(n - 1), "]".repeat(n - 1));
        assert!(plain_object(deep(MAX_EVENT_DEPTH).as_bytes()).is_some());
        assert_eq!(plain_object(deep(MAX_EVENT_DEPTH + 1).as_bytes()), None);
        assert!(slow(&deep(MAX_EVENT_DEPTH)).is_some());
    }

    #[test]
    fn first_stop_finds_the_first_byte_that_ends_plain_content() {
        for at in 0..8 {
            for stop in [b'"', b'\\', 0x00, 0x1f] {
                let mut bytes = [b'a'; 8];
                bytes[at] = stop;
                // Later bytes that also end a run do not move the answer.
                if at < 7 {
                    bytes[7] = b'"';
                }
                assert_eq!(first_stop(u64::from_le_bytes(bytes)), Some(at));
            }
        }
        for plain in [0x20u8, 0x21, 0x23, 0x5b, 0x5d, 0x7f, 0x80, 0xa2, 0xdc, 0xff] {
            assert_eq!(
                first_stop(u64::from_le_bytes([plain; 8])),
                None,
                "{plain:#x}"
            );
        }
    }

    #[test]
    fn stops_within_sees_every_byte_that_ends_plain_content_anywhere_in_the_chunk() {
        for byte in 0..=u8::MAX {
            for at in [0, 7, 31, 63] {
                let mut chunk = [b'a'; 64];
                chunk[at] = byte;
                assert_eq!(stops_within::<64>(&chunk, 0), ends_plain(byte), "{byte:#x}");
                assert_eq!(
                    plain_run_end(&chunk, 0),
                    if ends_plain(byte) { at } else { 64 }
                );
            }
        }
        // Fewer than 64 bytes left: the caller goes on 8 (then 1) at a time.
        assert!(stops_within::<64>(&[b'a'; 63], 0));
    }

    /// Texts near valid events: pieces of JSON in random order, long runs of plain text,
    /// escapes, numbers at the edge of what the fast check takes, deep nesting.
    fn near_json() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("{".to_owned()),
            Just("}".to_owned()),
            Just("[".to_owned()),
            Just("]".to_owned()),
            Just(",".to_owned()),
            Just(":".to_owned()),
            Just("\"".to_owned()),
            Just(" ".to_owned()),
            Just("\n".to_owned()),
            Just("\"seq\"".to_owned()),
            Just("\"s\\u0065q\"".to_owned()),
            Just("\\".to_owned()),
            Just("\\u".to_owned()),
            Just("\\ud800".to_owned()),
            Just("\\udfff".to_owned()),
            Just("\\u00e9".to_owned()),
            Just("\\n".to_owned()),
            Just("\\x".to_owned()),
            Just("\u{1}".to_owned()),
            Just("\u{a0}".to_owned()),
            Just("é😀".to_owned()),
            Just("true".to_owned()),
            Just("nul".to_owned()),
            Just("-".to_owned()),
            Just("0".to_owned()),
            Just("1e".to_owned()),
            Just("e-".to_owned()),
            Just(".5".to_owned()),
            Just("1e299".to_owned()),
            Just("1e301".to_owned()),
            Just("9".repeat(301)),
            (0usize..200).prop_map(|n| "x".repeat(n)),
            "[a-z0-9\"\\\\ ]{0,20}",
        ];
        let random = prop::collection::vec(piece, 0..40).prop_map(|p| p.concat());
        // A valid object with a random value, perhaps cut short or extended.
        let object = (
            "[a-z]{0,4}|seq",
            prop::collection::vec(
                prop_oneof![
                    "[a-zé\"\\\\\n]{0,70}",
                    "-?[0-9]{1,5}(\\.[0-9]{1,3})?(e[+-]?[0-9]{1,3})?"
                ],
                0..4,
            ),
            0usize..3,
            "|,|\\}|\\]| |x",
        )
            .prop_map(|(k, values, cut, tail)| {
                let values: Vec<String> = values
                    .iter()
                    .map(|v| match v.chars().next() {
                        Some('-' | '0'..='9') => v.clone(),
                        _ => serde_json::Value::String(v.clone()).to_string(),
                    })
                    .collect();
                let mut text = format!("{{\"{k}\":[{}],\"b\":{{}}}}{tail}", values.join(","));
                text.truncate(text.len().saturating_sub(cut));
                text
            });
        prop_oneof![2 => random, 3 => object]
    }

    proptest! {
        #[test]
        fn the_fast_check_accepts_only_what_the_full_check_accepts(text in near_json()) {
            pinned(&text)?;
        }

        #[test]
        fn the_fast_check_takes_every_value_serde_json_writes(
            value in prop::collection::btree_map(
                "[a-z]{1,5}",
                prop_oneof![
                    any::<i64>().prop_map(serde_json::Value::from),
                    any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(serde_json::Value::from),
                    any::<bool>().prop_map(serde_json::Value::from),
                    ".{0,100}".prop_map(serde_json::Value::from),
                    prop::collection::vec(".{0,20}", 0..4).prop_map(serde_json::Value::from),
                ],
                0..6,
            ),
        ) {
            let text = serde_json::to_string(&value).map_err(|e| TestCaseError::fail(e.to_string()))?;
            pinned(&text)?;
            // Taken unless it holds something only the full check decides: a surrogate
            // pair is written as raw UTF-8, so that leaves large numbers and `seq`.
            let big = text.contains("e30") || text.contains("e+30");
            if !big && !value.contains_key("seq") {
                prop_assert!(plain_object(text.as_bytes()).is_some(), "{}", text);
            }
        }
    }
}
