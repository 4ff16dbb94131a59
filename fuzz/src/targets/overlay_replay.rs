//! Target `overlay_replay`: the host's replay buffers (RB-01 to RB-03, RB-05) under
//! arbitrary appended text, arbitrary caps and arbitrary chunk sizes.
//!
//! Checks on every replay:
//!
//! - it terminates: at most one chunk per kept event plus one; more chunks than that
//!   is a crash ("replay did not terminate");
//! - chunks are numbered 0, 1, 2, ... and only the final one says `last`;
//! - with a chunk size that leaves room for a header and an omission marker, no chunk is
//!   larger than the chunk size (RB-03);
//! - while every appended text of the session was valid JSON, every chunk is valid JSON
//!   and the client side ([`ConversationClient`]) takes the chunks in order: progress on
//!   each, complete on the last (RB-04 against RB-03).
//!
//! Script: the configuration (event cap byte, byte cap `u32`, chunk size form), then
//! operations (see [`Op`]).

use overlay_core::replay::{
    AppendError, EventKind, ReplayBuffers, ReplayConfig, RunningState, MAX_CHUNK_BYTES,
};
use timeline_core::key::SessionId;
use timeline_core::replay::{ConversationClient, ReplayOutcome};
use timeline_core::time::Millis;

use crate::script::{Script, ScriptWriter};

/// The sessions a script appends to.
pub const SESSIONS: [&str; 2] = ["s1", "s2"];

/// The operations, in the order of the operation byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    /// Session byte, kind byte (0 init, 1 approval, other), request ID byte if an
    /// approval, then the event text.
    Append = 0,
    /// Session byte, client-ID byte (0: none), then the text.
    UserMessage = 1,
    /// Session byte, request ID byte, allowed flag.
    Decide = 2,
    /// Session byte, running flag, run ID text.
    SetRunning = 3,
    /// Session byte.
    Subscribe = 4,
    /// Session byte.
    Unsubscribe = 5,
    /// A `u32` of seconds to advance.
    Timeout = 6,
    /// Session byte: replay and check.
    Replay = 7,
    /// Session byte, sequence byte: look one event up.
    Event = 8,
}

impl Op {
    const ALL: [Op; 9] = [
        Op::Append,
        Op::UserMessage,
        Op::Decide,
        Op::SetRunning,
        Op::Subscribe,
        Op::Unsubscribe,
        Op::Timeout,
        Op::Replay,
        Op::Event,
    ];

    fn read(s: &mut Script<'_>) -> Op {
        let i = usize::from(s.pick(Op::ALL.len() as u8));
        Op::ALL.get(i).copied().unwrap_or(Op::Replay)
    }
}

/// Writes a configuration: the default caps and chunk size.
pub fn write_default_config(w: &mut ScriptWriter) {
    w.byte(0).u32(0).byte(0);
}

/// Writes a configuration with small caps and a small chunk size (`chunk` + 512 bytes).
pub fn write_small_config(w: &mut ScriptWriter, max_events: u8, max_bytes: u32, chunk: u16) {
    w.byte(max_events).u32(max_bytes).byte(2).u16(chunk);
}

/// Writes an append of `json` to session `s1` (`kind`: 0 init, 1 approval, 2 other).
pub fn write_append(w: &mut ScriptWriter, kind: u8, json: &str) {
    w.byte(Op::Append as u8).byte(0).byte(kind);
    if kind == 1 {
        w.byte(0);
    }
    w.text(json);
}

/// Writes a replay of session `s1`.
pub fn write_replay(w: &mut ScriptWriter) {
    w.byte(Op::Replay as u8).byte(0);
}

fn config(s: &mut Script<'_>) -> ReplayConfig {
    let d = ReplayConfig::default();
    let max_events = match s.byte() {
        0 => d.max_events,
        n => usize::from(n),
    };
    let max_bytes = match s.u32() {
        0 => d.max_bytes,
        n => n as usize,
    };
    let chunk_bytes = match s.pick(4) {
        0 => MAX_CHUNK_BYTES,
        // Any size at all, however small.
        1 => usize::from(s.u16()),
        2 => 512 + usize::from(s.u16()),
        _ => s.u32() as usize,
    };
    ReplayConfig {
        max_events,
        max_bytes,
        idle_reclaim: d.idle_reclaim,
        chunk_bytes,
    }
}

/// True when `text` is JSON that still parses inside a replay envelope (the envelope
/// adds nesting levels, and the JSON reader stops at 128).
fn replayable_json(text: &str) -> bool {
    let alone = serde_json::from_str::<serde_json::Value>(text).is_ok();
    let nested = format!(r#"{{"events":[{{"event":{text}}}]}}"#);
    alone && serde_json::from_str::<serde_json::Value>(&nested).is_ok()
}

struct World {
    buffers: ReplayBuffers,
    config: ReplayConfig,
    now: Millis,
    /// Per session: every text appended since the session's log began was JSON.
    all_json: [bool; 2],
    /// Per session: the serialized running state.
    running_len: [usize; 2],
}

fn session(i: u8) -> (usize, SessionId) {
    let i = usize::from(i) % SESSIONS.len();
    (
        i,
        SessionId::new(SESSIONS[i]).expect("session IDs are not blank"),
    )
}

impl World {
    fn step(&mut self, s: &mut Script<'_>) {
        match Op::read(s) {
            Op::Append => {
                let (i, id) = session(s.byte());
                let kind = match s.pick(3) {
                    0 => EventKind::Init,
                    1 => EventKind::Approval {
                        request_id: format!("req-{}", s.pick(4)),
                    },
                    _ => EventKind::Other,
                };
                let text = s.text().into_owned();
                let replayable = replayable_json(&text);
                let before = self.buffers.len(&id);
                match self.buffers.append(&id, kind, text, self.now) {
                    Ok(_seq) if !replayable => self.all_json[i] = false,
                    Ok(_seq) => {}
                    Err(AppendError::InvalidEvent { .. }) | Err(_) => {
                        assert_eq!(self.buffers.len(&id), before, "a refused event was kept");
                    }
                }
            }
            Op::UserMessage => {
                let (_, id) = session(s.byte());
                let client = match s.byte() {
                    0 => None,
                    n => Some(format!("c-{n}")),
                };
                let text = s.text();
                let _seq =
                    self.buffers
                        .append_user_message(&id, &text, client.as_deref(), self.now);
            }
            Op::Decide => {
                let (_, id) = session(s.byte());
                let request = format!("req-{}", s.pick(4));
                let allowed = s.flag();
                self.buffers.decide_approval(&id, &request, allowed);
            }
            Op::SetRunning => {
                let (i, id) = session(s.byte());
                let running = s.flag();
                let run_id = match s.text() {
                    t if t.is_empty() => None,
                    t => Some(t.into_owned()),
                };
                let state = RunningState { running, run_id };
                let len = serde_json::to_string(&state).map_or(0, |j| j.len());
                if self.buffers.set_running(&id, state, self.now).is_ok() {
                    self.running_len[i] = len;
                }
            }
            Op::Subscribe => {
                let (_, id) = session(s.byte());
                self.buffers.subscribe(&id, self.now);
            }
            Op::Unsubscribe => {
                let (_, id) = session(s.byte());
                self.buffers.unsubscribe(&id, self.now);
            }
            Op::Timeout => {
                self.now = self
                    .now
                    .saturating_add(Millis::from_secs(u64::from(s.u32())));
                self.buffers.handle_timeout(self.now);
                let before = self.buffers.poll_timeout();
                self.buffers.handle_timeout(self.now);
                assert_eq!(
                    before,
                    self.buffers.poll_timeout(),
                    "a second timeout acted"
                );
                for i in 0..SESSIONS.len() {
                    let (_, id) = session(i as u8);
                    if self.buffers.was_reclaimed(&id) && self.buffers.is_empty(&id) {
                        // A reclaimed session starts a new log.
                        self.all_json[i] = true;
                        self.running_len[i] = 0;
                    }
                }
            }
            Op::Replay => {
                let (i, id) = session(s.byte());
                self.replay(i, &id);
            }
            Op::Event => {
                let (_, id) = session(s.byte());
                if let Some(json) = self.buffers.event(&id, u64::from(s.byte())) {
                    assert!(json.starts_with(r#"{"seq":"#));
                }
            }
        }
    }

    // RB-03
    fn replay(&self, i: usize, id: &SessionId) {
        let kept = self.buffers.len(id) + 1;
        let cap = kept + 1;
        let mut chunks: Vec<(u64, bool, String)> = Vec::new();
        let mut buf = String::new();
        self.buffers.replay_with(id, &mut buf, |seq, last, json| {
            assert!(
                chunks.len() < cap,
                "replay did not terminate: more than {cap} chunks for {kept} events"
            );
            chunks.push((seq, last, json.to_owned()));
        });
        assert!(!chunks.is_empty(), "a replay without chunks");
        for (n, (seq, last, json)) in chunks.iter().enumerate() {
            assert_eq!(*seq, n as u64, "chunks out of order");
            assert_eq!(*last, n + 1 == chunks.len(), "`last` on the wrong chunk");
            // A header is about 120 bytes plus the running state; an omission marker
            // about 60.
            if self.config.chunk_bytes >= 1024 + 2 * self.running_len[i] {
                assert!(
                    json.len() <= self.config.chunk_bytes,
                    "chunk of {} bytes past the {} cap",
                    json.len(),
                    self.config.chunk_bytes
                );
            }
        }
        if !self.all_json[i] {
            return;
        }
        let mut client = ConversationClient::new();
        for (n, (_, last, json)) in chunks.iter().enumerate() {
            assert!(
                serde_json::from_str::<serde_json::Value>(json).is_ok(),
                "chunk {n} is not JSON: {json}"
            );
            let outcome = client.handle_replay_chunk(json, Millis(0));
            let expected = if *last {
                ReplayOutcome::Complete
            } else {
                ReplayOutcome::Progress
            };
            assert_eq!(outcome, expected, "the client refused chunk {n}: {json}");
        }
    }
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let mut s = Script::new(data);
    let config = config(&mut s);
    let mut w = World {
        buffers: ReplayBuffers::new(config),
        config,
        now: Millis(0),
        all_json: [true; 2],
        running_len: [0; 2],
    };
    let mut steps = 0;
    while !s.is_empty() && steps < 256 {
        w.step(&mut s);
        steps += 1;
    }
    for i in 0..SESSIONS.len() {
        let (i, id) = session(i as u8);
        w.replay(i, &id);
    }
}
