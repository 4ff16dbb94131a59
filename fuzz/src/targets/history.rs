//! Target `history`: packed history transport (PK-01 to PK-04).
//!
//! Checks, for every input the decoders accept:
//!
//! - a chunk row that validates unpacks into exactly its member count of events, and
//!   packing those events gives the row back (PK-01);
//! - pack then unpack is the identity on logical events; [`pack`] and
//!   [`write_packed_page`] refuse the same inputs, and otherwise the page written is
//!   byte for byte the serialization of the records [`pack`] builds;
//! - [`AssistantFold`] reaches the same state from scalar events and from packed rows, and
//!   from a page as received (PK-04); one row stays one entry;
//! - [`select_page`] returns a range inside the events that starts a message (PK-02);
//! - the [`Journal`] fed arbitrary pages and live events never panics, its span only
//!   grows, and it publishes records only inside the span it reports (PK-03).
//!
//! Script: one mode byte, then the mode's fields (see [`Mode`]).

use timeline_core::history::{
    pack, select_page, unpack, unpack_records, validate_row, write_packed_page, AssistantFold,
    ChunkRowEvent, DeltaKind, HistoryPage, Journal, JournalOutcome, SessionEvent,
    SessionHistoryRecord,
};

use crate::script::{Script, ScriptWriter};

/// The modes of this target, in the order of the mode byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    /// The rest as a history page JSON (`{"records":[...]}`).
    PageJson = 0,
    /// The rest as a JSON array of logical events.
    EventsJson = 1,
    /// The rest as one chunk row JSON (the `event` of a `chunks` record).
    RowJson = 2,
    /// Journal steps: page JSON texts, live event JSON texts, built pages.
    Journal = 3,
    /// Logical events built from fuzzed numbers (sequence numbers and times anywhere in
    /// `u64`, fragments with multi-byte characters).
    BuiltEvents = 4,
}

impl Mode {
    const ALL: [Mode; 5] = [
        Mode::PageJson,
        Mode::EventsJson,
        Mode::RowJson,
        Mode::Journal,
        Mode::BuiltEvents,
    ];

    fn read(s: &mut Script<'_>) -> Mode {
        let i = usize::from(s.pick(Mode::ALL.len() as u8));
        Mode::ALL.get(i).copied().unwrap_or(Mode::PageJson)
    }
}

/// How [`select_page`] is asked, from one byte: where the page ends (the newest, the
/// middle, past the end, or an index) and how many events it holds at most (0 to 15).
#[derive(Clone, Copy, Debug)]
struct Select {
    before: u8,
    max: usize,
}

impl Select {
    fn read(s: &mut Script<'_>) -> Select {
        let b = s.byte();
        Select {
            before: b & 15,
            max: usize::from(b >> 4),
        }
    }

    fn before(self, len: usize) -> Option<usize> {
        match self.before % 4 {
            0 => None,
            1 => Some(len / 2),
            2 => Some(usize::MAX),
            _ => Some(usize::from(self.before / 4)),
        }
    }
}

/// The select byte the generator writes: the newest page of at most 3 events.
pub const SELECT_NEWEST_3: u8 = 3 << 4;

/// Writes a script of `mode` whose rest is `json`.
pub fn write_json(w: &mut ScriptWriter, mode: Mode, json: &[u8]) {
    w.byte(mode as u8).byte(SELECT_NEWEST_3).raw(json);
}

/// Writes the start of a journal script.
pub fn write_journal_start(w: &mut ScriptWriter) {
    w.byte(Mode::Journal as u8).byte(SELECT_NEWEST_3);
}

/// Writes a journal step that feeds a page JSON.
pub fn write_journal_page(w: &mut ScriptWriter, json: &[u8]) {
    w.byte(0).text(json);
}

/// Writes a journal step that feeds a live event JSON.
pub fn write_journal_live(w: &mut ScriptWriter, json: &[u8]) {
    w.byte(1).text(json);
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let mut s = Script::new(data);
    let mode = Mode::read(&mut s);
    let sel = Select::read(&mut s);
    match mode {
        Mode::PageJson => {
            if let Ok(page) = serde_json::from_slice::<HistoryPage>(s.rest()) {
                check_page(&page.records, sel);
                let mut j = Journal::new();
                feed_page(&mut j, &page.records);
            }
        }
        Mode::EventsJson => {
            if let Ok(events) = serde_json::from_slice::<Vec<SessionEvent>>(s.rest()) {
                check_events(&events, sel);
            }
        }
        Mode::RowJson => {
            if let Ok(row) = serde_json::from_slice::<ChunkRowEvent>(s.rest()) {
                check_row(&row);
            }
        }
        Mode::Journal => journal(&mut s),
        Mode::BuiltEvents => {
            let events = built_events(&mut s);
            check_events(&events, sel);
            let mut j = Journal::new();
            for e in &events {
                feed_live(&mut j, e);
            }
        }
    }
}

/// The fold state that must not depend on packing (everything but the entry count).
fn fold_state(f: &AssistantFold) -> impl PartialEq + std::fmt::Debug + '_ {
    (
        &f.blocks,
        f.first_token_time,
        f.delta_count,
        f.last_delta_seq,
    )
}

fn fold_events(events: &[SessionEvent]) -> AssistantFold {
    let mut f = AssistantFold::new();
    for e in events {
        f.fold_event(e);
    }
    f
}

// PK-01, PK-04
fn check_row(row: &ChunkRowEvent) {
    let valid = validate_row(row);
    let members = unpack(row);
    assert_eq!(
        valid.is_ok(),
        members.is_ok(),
        "validate and unpack disagree"
    );
    let mut folded = AssistantFold::new();
    assert_eq!(folded.fold_row(row).is_ok(), valid.is_ok());
    let (Ok(kind), Ok(members)) = (valid, members) else {
        assert_eq!(folded, AssistantFold::new(), "an invalid row was folded");
        return;
    };
    assert_eq!(members.len(), row.member_count());
    assert!(members
        .iter()
        .all(|e| e.as_delta().map(|(k, _, _)| k) == Some(kind)));
    let repacked = pack(&members);
    if members.len() > 1 {
        assert_eq!(
            repacked,
            Ok(vec![SessionHistoryRecord::Chunks(row.clone())]),
            "unpack then pack does not give the row back"
        );
    }
    assert_eq!(folded.entries, 1, "one row is one entry");
    let scalar = fold_events(&members);
    assert_eq!(
        fold_state(&folded),
        fold_state(&scalar),
        "row fold != scalar fold"
    );
}

// PK-01, PK-04
fn check_page(records: &[SessionHistoryRecord], sel: Select) {
    for r in records {
        if let SessionHistoryRecord::Chunks(row) = r {
            check_row(row);
        }
    }
    let Ok(events) = unpack_records(records) else {
        return;
    };
    // The page as received folds like its logical events.
    let mut received = AssistantFold::new();
    for r in records {
        assert!(
            received.fold_record(r).is_ok(),
            "a valid record did not fold"
        );
    }
    let scalar = fold_events(&events);
    assert_eq!(
        fold_state(&received),
        fold_state(&scalar),
        "page fold != scalar fold"
    );
    check_events(&events, sel);
}

// PK-01, PK-02, PK-04
fn check_events(events: &[SessionEvent], sel: Select) {
    let packed = pack(events);
    let mut buf = Vec::new();
    let written = write_packed_page(events, &mut buf);
    assert_eq!(
        written.is_ok(),
        packed.is_ok(),
        "write_packed_page and pack disagree on what they refuse"
    );
    if let Ok(records) = packed {
        assert_eq!(
            unpack_records(&records).as_deref(),
            Ok(events),
            "pack then unpack is not the identity"
        );
        // Byte for byte: decoding would compare floats in `data` through a lossy
        // parse.
        let serialized = serde_json::to_vec(&HistoryPage {
            records: records.clone(),
        })
        .unwrap_or_default();
        assert!(
            buf == serialized,
            "write_packed_page differs from serializing pack:\n{}\n{}",
            String::from_utf8_lossy(&buf),
            String::from_utf8_lossy(&serialized)
        );
        let mut folded = AssistantFold::new();
        for r in &records {
            assert!(
                folded.fold_record(r).is_ok(),
                "a packed record did not fold"
            );
        }
        assert_eq!(
            folded.entries as usize,
            records.len(),
            "one record, one entry"
        );
        let scalar = fold_events(events);
        assert_eq!(
            fold_state(&folded),
            fold_state(&scalar),
            "packed fold != scalar fold"
        );
    } else {
        assert!(buf.is_empty(), "a refused page left bytes behind");
    }
    let before = sel.before(events.len());
    let range = select_page(events, before, sel.max);
    assert!(range.start <= range.end && range.end <= events.len());
    assert_eq!(range.end, before.unwrap_or(events.len()).min(events.len()));
    if range.start > 0 && range.start < range.end {
        // PK-02: a page never starts inside a run of one block.
        let (a, b) = (&events[range.start - 1], &events[range.start]);
        let same = match (a.as_delta(), b.as_delta()) {
            (Some((ka, ba, _)), Some((kb, bb, _))) => ka == kb && ba == bb,
            _ => false,
        };
        assert!(!same, "select_page cut a message");
    }
}

fn span_grows(before: Option<std::ops::RangeInclusive<u64>>, j: &Journal) {
    let after = j.span();
    if let (Some(b), Some(a)) = (&before, &after) {
        assert!(
            a.start() <= b.start() && a.end() >= b.end(),
            "journal span shrank"
        );
    }
    if before.is_some() {
        assert!(after.is_some(), "journal span vanished");
    }
}

fn published_inside(
    outcome: &JournalOutcome,
    before: &Option<std::ops::RangeInclusive<u64>>,
    j: &Journal,
) {
    match outcome {
        JournalOutcome::Published { records, .. } => {
            let span = j.span();
            assert!(span.is_some(), "published without a span");
            for r in records {
                if let (Ok(Some(range)), Some(span)) = (r.seq_range(), &span) {
                    assert!(
                        span.contains(range.start()) && span.contains(range.end()),
                        "published a record outside the span"
                    );
                }
            }
        }
        _ => assert_eq!(&j.span(), before, "the span moved without a publish"),
    }
}

// PK-03
fn feed_page(j: &mut Journal, records: &[SessionHistoryRecord]) {
    let before = j.span();
    let outcome = j.accept_page(records);
    span_grows(before.clone(), j);
    published_inside(&outcome, &before, j);
}

// PK-03
fn feed_live(j: &mut Journal, e: &SessionEvent) {
    let before = j.span();
    let outcome = j.accept_live(e);
    span_grows(before.clone(), j);
    published_inside(&outcome, &before, j);
}

fn journal(s: &mut Script<'_>) {
    let mut j = Journal::new();
    let mut steps = 0;
    while !s.is_empty() && steps < 128 {
        steps += 1;
        match s.pick(3) {
            0 => {
                if let Ok(page) = serde_json::from_slice::<HistoryPage>(s.bytes()) {
                    feed_page(&mut j, &page.records);
                }
            }
            1 => {
                if let Ok(e) = serde_json::from_slice::<SessionEvent>(s.bytes()) {
                    feed_live(&mut j, &e);
                }
            }
            _ => {
                let events = built_events(s);
                if s.flag() {
                    if let Ok(records) = pack(&events) {
                        feed_page(&mut j, &records);
                    }
                } else {
                    let records: Vec<SessionHistoryRecord> = events
                        .into_iter()
                        .map(SessionHistoryRecord::Event)
                        .collect();
                    feed_page(&mut j, &records);
                }
            }
        }
    }
}

const FRAGMENTS: [&str; 8] = ["", "a", "é", "→x", "\"", "\\n", "\u{1F600}", "ok "];

/// Logical events from fuzzed numbers: a base sequence number anywhere in `u64`, mostly
/// consecutive numbers, time steps forward and back, deltas of two blocks and three
/// kinds between other events.
fn built_events(s: &mut Script<'_>) -> Vec<SessionEvent> {
    let n = s.pick(24);
    let mut seq = s.edgy_u64();
    let mut time = s.edgy_u64();
    let mut out = Vec::with_capacity(usize::from(n));
    for _ in 0..n {
        let shape = s.byte();
        let step = match shape % 8 {
            0 => s.edgy_u64(),
            1 => 0,
            _ => 1,
        };
        seq = if out.is_empty() {
            seq
        } else {
            seq.wrapping_add(step)
        };
        let dt = s.edgy_u64();
        time = if shape & 8 != 0 {
            time.wrapping_sub(dt)
        } else {
            time.wrapping_add(dt)
        };
        let kind = [DeltaKind::Text, DeltaKind::Reasoning, DeltaKind::ToolCall]
            [usize::from((shape >> 4) % 3)];
        let block = ["msg-1", "msg-2"][usize::from(shape >> 6) & 1];
        let mut e = if shape >> 4 == 15 {
            SessionEvent::other(
                seq,
                time,
                "s1",
                "item/completed",
                serde_json::json!({"n": n}),
            )
        } else {
            let text = FRAGMENTS[usize::from(s.pick(FRAGMENTS.len() as u8))];
            SessionEvent::delta(seq, time, "s1", kind, block, text)
        };
        if shape & 4 != 0 && shape & 2 != 0 {
            e.turn_id = Some("turn-1".into());
        }
        out.push(e);
    }
    out
}
