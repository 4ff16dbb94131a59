//! Target `client_replay`: the client side of replay on join (RB-04), fed arbitrary
//! chunks and live events.
//!
//! Checks after every step:
//!
//! - the visible entries change only when a rebuild completes, or when a live event is
//!   applied while no rebuild is staged: a chunk in progress, a malformed or out-of-order
//!   chunk, a timeout and a live event that waits for a rebuild leave them as they were
//!   (never a half-built timeline);
//! - entries are in strictly increasing server sequence order;
//! - a deadline is reported exactly while a rebuild is staged;
//! - the view is the entries followed by the pending placeholders.
//!
//! Script: operations (see [`Op`]).

use arbitrary::Arbitrary;
use timeline_core::replay::{ConversationClient, Entry, ReplayOutcome, ViewRow};
use timeline_core::time::Millis;

use crate::script::{Script, ScriptWriter};

/// The operations, in the order of the operation byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    /// A chunk JSON text.
    ChunkRaw = 0,
    /// A chunk built from fuzzed numbers.
    ChunkBuilt = 1,
    /// A live event JSON text.
    LiveRaw = 2,
    /// A live event built from fuzzed numbers.
    LiveBuilt = 3,
    /// Client-ID byte, then the text: an optimistic send.
    Send = 4,
    /// Queued count byte.
    SetQueued = 5,
    /// A `u16` of milliseconds to advance.
    Timeout = 6,
}

impl Op {
    const ALL: [Op; 7] = [
        Op::ChunkRaw,
        Op::ChunkBuilt,
        Op::LiveRaw,
        Op::LiveBuilt,
        Op::Send,
        Op::SetQueued,
        Op::Timeout,
    ];

    fn read(s: &mut Script<'_>) -> Op {
        let i = usize::from(s.pick(Op::ALL.len() as u8));
        Op::ALL.get(i).copied().unwrap_or(Op::Timeout)
    }
}

/// Writes a raw chunk.
pub fn write_chunk(w: &mut ScriptWriter, json: &str) {
    w.byte(Op::ChunkRaw as u8).text(json);
}

/// Writes a raw live event.
pub fn write_live(w: &mut ScriptWriter, json: &str) {
    w.byte(Op::LiveRaw as u8).text(json);
}

/// Writes an optimistic send with client ID `c-<id>`.
pub fn write_send(w: &mut ScriptWriter, id: u8, text: &str) {
    w.byte(Op::Send as u8).byte(id).text(text);
}

const TYPES: [&str; 9] = [
    "session_init",
    "user_message",
    "assistant_delta",
    "approval_request",
    "approval_decided",
    "run_state",
    "replay_event_omitted",
    "tool_use",
    "",
];

/// One event from a few numbers.
#[derive(Arbitrary, Clone, Copy, Debug, Default)]
struct ArbEvent {
    seq: u8,
    ty: u8,
    text: u8,
    client: u8,
    request: u8,
    flags: u8,
}

impl ArbEvent {
    fn json(self, base: u64) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        if self.flags & 1 == 0 {
            m.insert(
                "seq".into(),
                (base.saturating_add(u64::from(self.seq % 8))).into(),
            );
        } else if self.flags & 2 != 0 {
            m.insert("seq".into(), u64::MAX.into());
        }
        let ty = TYPES[usize::from(self.ty) % TYPES.len()];
        if !ty.is_empty() {
            m.insert("type".into(), ty.into());
        }
        m.insert(
            "text".into(),
            ["hi", "", "é→", "x"][usize::from(self.text % 4)].into(),
        );
        match self.client % 3 {
            0 => {}
            n => {
                m.insert("clientId".into(), format!("c-{n}").into());
            }
        }
        m.insert(
            "requestId".into(),
            format!("req-{}", self.request % 3).into(),
        );
        if self.flags & 4 != 0 {
            m.insert("outcome".into(), "allowed".into());
        }
        m.insert("allowed".into(), (self.flags & 8 != 0).into());
        m.insert("running".into(), (self.flags & 16 != 0).into());
        m.insert("bytes".into(), u64::from(self.request).into());
        serde_json::Value::Object(m)
    }
}

fn built_chunk(s: &mut Script<'_>) -> String {
    let flags = s.byte();
    let seq = u64::from(s.pick(4));
    let base = u64::from(s.byte());
    let n = s.pick(6);
    let events: Vec<serde_json::Value> = (0..n).map(|_| s.value::<ArbEvent>().json(base)).collect();
    let mut chunk = serde_json::json!({
        "type": if flags & 32 == 0 { "structured_replay" } else { "other" },
        "seq": seq,
        "last": flags & 1 != 0,
        "truncated": flags & 2 != 0,
        "reclaimed": flags & 4 != 0,
        "running": { "running": flags & 8 != 0 },
        "events": events,
    });
    if flags & 16 != 0 {
        if let Some(m) = chunk.as_object_mut() {
            m.remove("running");
        }
    }
    chunk.to_string()
}

struct World {
    c: ConversationClient,
    now: Millis,
    pending: usize,
}

impl World {
    /// One step; returns whether the step may change the visible entries.
    fn step(&mut self, s: &mut Script<'_>) -> bool {
        let rebuilding = self.c.rebuilding();
        match Op::read(s) {
            Op::ChunkRaw => {
                let text = s.text();
                self.c.handle_replay_chunk(&text, self.now) == ReplayOutcome::Complete
            }
            Op::ChunkBuilt => {
                let text = built_chunk(s);
                self.c.handle_replay_chunk(&text, self.now) == ReplayOutcome::Complete
            }
            Op::LiveRaw => {
                let text = s.text();
                let outcome = self.c.handle_live(&text);
                !rebuilding && outcome == ReplayOutcome::Applied
            }
            Op::LiveBuilt => {
                let base = u64::from(s.byte());
                let text = s.value::<ArbEvent>().json(base).to_string();
                let outcome = self.c.handle_live(&text);
                !rebuilding && outcome == ReplayOutcome::Applied
            }
            Op::Send => {
                let id = format!("c-{}", s.pick(3));
                let text = s.text();
                self.c.send(&id, &text);
                self.pending += 1;
                false
            }
            Op::SetQueued => {
                self.c.set_queued(usize::from(s.pick(3)));
                false
            }
            Op::Timeout => {
                self.now = self.now.saturating_add(Millis(u64::from(s.u16()) * 16));
                self.c.handle_timeout(self.now);
                false
            }
        }
    }

    fn check(&mut self, before: &[Entry], may_change: bool) {
        let entries = self.c.entries();
        if !may_change {
            assert_eq!(
                entries, before,
                "visible entries changed without a completed rebuild"
            );
        }
        for pair in entries.windows(2) {
            if let [a, b] = pair {
                assert!(
                    a.seq < b.seq,
                    "entries out of server order: {} then {}",
                    a.seq,
                    b.seq
                );
            }
        }
        assert_eq!(
            self.c.poll_timeout().is_some(),
            self.c.rebuilding(),
            "a deadline without a rebuild, or a rebuild without one"
        );
        let view = self.c.view();
        let (head, tail) = view.split_at(entries.len().min(view.len()));
        assert!(head
            .iter()
            .zip(entries)
            .all(|(v, e)| matches!(v, ViewRow::Entry(x) if x == e)));
        assert!(tail.iter().all(|v| matches!(v, ViewRow::Pending { .. })));
        assert!(tail.len() <= self.pending);
        while self.c.poll_effect().is_some() {}
    }
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let mut s = Script::new(data);
    let mut w = World {
        c: ConversationClient::new(),
        now: Millis(0),
        pending: 0,
    };
    let mut steps = 0;
    while !s.is_empty() && steps < 256 {
        let before = w.c.entries().to_vec();
        let may_change = w.step(&mut s);
        w.check(&before, may_change);
        steps += 1;
    }
}
