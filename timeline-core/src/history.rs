//! Packed history transport (PK-01 to PK-04): lossless chunk rows in history pages, the
//! client journal, and folds that take scalar deltas and packed rows alike.
//!
//! A history page is `records: SessionHistoryRecord[]`, each `{type:"event", event}` or
//! `{type:"chunks", event: ChunkRowEvent}`. A chunk row packs a run of consecutive
//! delta events of one block and kind (`chunkrow/text-chunks`,
//! `chunkrow/reasoning-chunks`, `chunkrow/tool-call-chunks`). Its `seq` and `time` are
//! the first member's; its data keeps every fragment as one concatenated `text` plus
//! `lengths` (UTF-8 bytes per fragment) and every timestamp as `gaps` (milliseconds
//! from the previous member), so [`unpack`] gives back exactly the original events.
//!
//! - [`select_page`] picks a page from logical events (message-aligned) before packing,
//!   so how events are stored never decides a page cut (PK-02).
//! - [`pack`] builds records; [`write_packed_page`] serializes a page straight from
//!   the logical events into a reused buffer, byte for byte what `serde_json` writes
//!   for [`pack`]'s records. Both are the same single pass over the events (one run
//!   cutting, one set of refusals): each event is read once, nothing is allocated per
//!   fragment, and the writer escapes a row's text in bulk when the row ends.
//! - [`Journal`] checks every record's inclusive sequence range before publishing it
//!   (PK-03): continuity, pagination joins, reconnect repair, duplicates, overlaps.
//! - [`AssistantFold`] reaches the same state from scalar deltas and packed rows (PK-04);
//!   one row stays one entry. Live events stay scalar.
//!
//! Unknown record types from a newer peer decode as [`SessionHistoryRecord::Unknown`]
//! and are skipped.
//!
//! Every sequence number and time is an integer in `0..=2^53 - 1` ([`WireInt`]), like
//! every number on the wire. Decoding refuses anything else (a negative, a fraction,
//! 2^53 and above, a gap whose magnitude is past the range). Values built in memory are
//! checked where they are used: [`pack`], [`write_packed_page`], [`unpack`],
//! [`SessionHistoryRecord::seq_range`], the [`Journal`] and [`AssistantFold::fold_record`]
//! answer [`RowError::Seq`] or [`RowError::Time`] instead of overflowing. So no
//! arithmetic here can overflow, and [`pack`] refuses exactly what [`unpack`] would
//! refuse: pack then unpack is the identity for every page `pack` accepts.
//!
//! ```
//! use timeline_core::history::{pack, unpack_records, SessionEvent, DeltaKind, RowError};
//!
//! let events: Vec<SessionEvent> = ["Hel", "lo", " wörld"]
//!     .iter()
//!     .enumerate()
//!     .map(|(i, t)| SessionEvent::delta(i as u64 + 1, 1_000 + 7 * i as u64, "s1", DeltaKind::Text, "msg-1", t))
//!     .collect();
//! let records = pack(&events).unwrap();
//! assert_eq!(records.len(), 1, "one row for the run");
//! assert_eq!(unpack_records(&records).unwrap(), events);
//!
//! // A time past 2^53 - 1 is refused, not packed into a row that cannot be read back.
//! let late = SessionEvent::delta(1, 1 << 53, "s1", DeltaKind::Text, "msg-1", "x");
//! assert_eq!(pack(&[late]), Err(RowError::Time));
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::ops::RangeInclusive;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::wire::WireInt;

/// The three kinds of assistant deltas.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeltaKind {
    /// Reply text.
    Text,
    /// Reasoning text.
    Reasoning,
    /// Tool-call argument text.
    ToolCall,
}

impl DeltaKind {
    /// The event type of a scalar delta.
    pub const fn event_type(self) -> &'static str {
        match self {
            DeltaKind::Text => "assistant/text-delta",
            DeltaKind::Reasoning => "assistant/reasoning-delta",
            DeltaKind::ToolCall => "assistant/tool-call-delta",
        }
    }

    /// The type of a chunk row of this kind.
    pub const fn row_type(self) -> &'static str {
        match self {
            DeltaKind::Text => "chunkrow/text-chunks",
            DeltaKind::Reasoning => "chunkrow/reasoning-chunks",
            DeltaKind::ToolCall => "chunkrow/tool-call-chunks",
        }
    }

    /// The kind of a scalar event type, if it is a delta.
    pub fn of_event_type(t: &str) -> Option<DeltaKind> {
        [DeltaKind::Text, DeltaKind::Reasoning, DeltaKind::ToolCall]
            .into_iter()
            .find(|k| k.event_type() == t)
    }

    /// The kind of a row type.
    pub fn of_row_type(t: &str) -> Option<DeltaKind> {
        [DeltaKind::Text, DeltaKind::Reasoning, DeltaKind::ToolCall]
            .into_iter()
            .find(|k| k.row_type() == t)
    }
}

/// A logical session event. Deltas carry `block` and `text`; other events carry
/// `data`. Unknown fields are ignored; `seq` and `time` decode only in `0..=2^53 - 1`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionEvent {
    /// The session's sequence number (at most 2^53 - 1 to be packed or published).
    #[serde(deserialize_with = "WireInt::deserialize_u64")]
    pub seq: u64,
    /// When, in milliseconds (at most 2^53 - 1 to be packed or published).
    #[serde(deserialize_with = "WireInt::deserialize_u64")]
    pub time: u64,
    /// The event type.
    #[serde(rename = "type")]
    pub kind: String,
    /// The session.
    pub session_id: String,
    /// The turn, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
    /// The block a delta belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<String>,
    /// A delta's fragment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Anything else.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub data: serde_json::Value,
}

impl SessionEvent {
    /// A delta event.
    pub fn delta(
        seq: u64,
        time: u64,
        session: &str,
        kind: DeltaKind,
        block: &str,
        text: &str,
    ) -> Self {
        SessionEvent {
            seq,
            time,
            kind: kind.event_type().to_owned(),
            session_id: session.to_owned(),
            turn_id: None,
            block: Some(block.to_owned()),
            text: Some(text.to_owned()),
            data: serde_json::Value::Null,
        }
    }

    /// Any other event.
    pub fn other(seq: u64, time: u64, session: &str, kind: &str, data: serde_json::Value) -> Self {
        SessionEvent {
            seq,
            time,
            kind: kind.to_owned(),
            session_id: session.to_owned(),
            turn_id: None,
            block: None,
            text: None,
            data,
        }
    }

    /// The delta kind, block and fragment, when this is a delta.
    pub fn as_delta(&self) -> Option<(DeltaKind, &str, &str)> {
        let kind = DeltaKind::of_event_type(&self.kind)?;
        Some((kind, self.block.as_deref()?, self.text.as_deref()?))
    }

    /// Checks that `seq` and `time` are wire integers (`0..=2^53 - 1`):
    /// [`RowError::Seq`] or [`RowError::Time`] otherwise.
    pub fn check_numbers(&self) -> Result<(), RowError> {
        self.numbers().map(drop)
    }

    fn numbers(&self) -> Result<(WireInt, WireInt), RowError> {
        let seq = WireInt::new(self.seq).map_err(|_| RowError::Seq)?;
        let time = WireInt::new(self.time).map_err(|_| RowError::Time)?;
        Ok((seq, time))
    }

    /// A delta that a chunk row can carry without loss: a delta with no `data` (a row
    /// keeps fragments, not per-member data).
    fn as_packable_delta(&self) -> Option<(DeltaKind, &str, &str)> {
        if self.data.is_null() {
            self.as_delta()
        } else {
            None
        }
    }
}

/// The data of a chunk row.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChunkData {
    /// The block of every member.
    pub block: String,
    /// Every fragment, concatenated.
    pub text: String,
    /// Each fragment's length in UTF-8 bytes.
    pub lengths: Vec<u32>,
    /// Each member's time minus the previous member's (one fewer than the members);
    /// each magnitude at most 2^53 - 1.
    #[serde(deserialize_with = "WireInt::deserialize_signed_vec")]
    pub gaps: Vec<i64>,
}

/// A packed run of delta events: the event-shaped value of a `chunks` record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChunkRowEvent {
    /// `chunkrow/text-chunks`, `chunkrow/reasoning-chunks` or `chunkrow/tool-call-chunks`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The first member's sequence number; the last member's is at most 2^53 - 1.
    #[serde(deserialize_with = "WireInt::deserialize_u64")]
    pub seq: u64,
    /// The first member's time; every member's time is in `0..=2^53 - 1`.
    #[serde(deserialize_with = "WireInt::deserialize_u64")]
    pub time: u64,
    /// The session of every member.
    pub session_id: String,
    /// The turn of every member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
    /// The members.
    pub data: ChunkData,
}

impl ChunkRowEvent {
    /// Members in the row.
    pub fn member_count(&self) -> usize {
        self.data.lengths.len()
    }

    /// The inclusive sequence range of the members, `[seq, seq + memberCount - 1]`
    /// (PK-03): [`RowError::Shape`] for a row without members, [`RowError::Seq`] when
    /// the range reaches past 2^53 - 1.
    pub fn seq_range(&self) -> Result<RangeInclusive<u64>, RowError> {
        let extra = self.member_count().checked_sub(1).ok_or(RowError::Shape)?;
        let first = WireInt::new(self.seq).map_err(|_| RowError::Seq)?;
        let last = u64::try_from(extra)
            .ok()
            .and_then(|extra| first.checked_add(extra))
            .ok_or(RowError::Seq)?;
        Ok(first.get()..=last.get())
    }
}

/// One record of a history page.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum SessionHistoryRecord {
    /// `{type:"event", event}`.
    Event(SessionEvent),
    /// `{type:"chunks", event}`.
    Chunks(ChunkRowEvent),
    /// A record type this client does not know (skipped).
    Unknown,
}

impl SessionHistoryRecord {
    /// The inclusive logical sequence range the record covers (PK-03): `[seq, seq]` for
    /// an event, `[seq, seq + memberCount - 1]` for a row, `None` for an unknown record.
    /// A range that reaches past 2^53 - 1 is [`RowError::Seq`]; a row without members is
    /// [`RowError::Shape`].
    pub fn seq_range(&self) -> Result<Option<RangeInclusive<u64>>, RowError> {
        match self {
            SessionHistoryRecord::Event(e) => {
                let seq = WireInt::new(e.seq).map_err(|_| RowError::Seq)?.get();
                Ok(Some(seq..=seq))
            }
            SessionHistoryRecord::Chunks(r) => r.seq_range().map(Some),
            SessionHistoryRecord::Unknown => Ok(None),
        }
    }
}

impl Serialize for SessionHistoryRecord {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("SessionHistoryRecord", 2)?;
        match self {
            SessionHistoryRecord::Event(e) => {
                st.serialize_field("type", "event")?;
                st.serialize_field("event", e)?;
            }
            SessionHistoryRecord::Chunks(r) => {
                st.serialize_field("type", "chunks")?;
                st.serialize_field("event", r)?;
            }
            SessionHistoryRecord::Unknown => st.serialize_field("type", "unknown")?,
        }
        st.end()
    }
}

impl<'de> Deserialize<'de> for SessionHistoryRecord {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = SessionHistoryRecord;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a history record")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                // Writers put "type" first, so the event decodes straight into its type;
                // an "event" before "type" is buffered and decoded after.
                let mut kind: Option<String> = None;
                let mut buffered: Option<serde_json::Value> = None;
                let mut out: Option<SessionHistoryRecord> = None;
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    match key.as_ref() {
                        "type" => kind = Some(map.next_value()?),
                        "event" => match kind.as_deref() {
                            Some("event") => {
                                out = Some(SessionHistoryRecord::Event(map.next_value()?))
                            }
                            Some("chunks") => {
                                out = Some(SessionHistoryRecord::Chunks(map.next_value()?))
                            }
                            Some(_) => {
                                map.next_value::<de::IgnoredAny>()?;
                            }
                            None => buffered = Some(map.next_value()?),
                        },
                        _ => {
                            map.next_value::<de::IgnoredAny>()?;
                        }
                    }
                }
                if let Some(r) = out {
                    return Ok(r);
                }
                let Some(kind) = kind else {
                    return Err(de::Error::missing_field("type"));
                };
                match (kind.as_str(), buffered) {
                    ("event", Some(v)) => serde_json::from_value(v)
                        .map(SessionHistoryRecord::Event)
                        .map_err(de::Error::custom),
                    ("chunks", Some(v)) => serde_json::from_value(v)
                        .map(SessionHistoryRecord::Chunks)
                        .map_err(de::Error::custom),
                    ("event" | "chunks", None) => Err(de::Error::missing_field("event")),
                    _ => Ok(SessionHistoryRecord::Unknown),
                }
            }
        }
        d.deserialize_map(V)
    }
}

/// A history page.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HistoryPage {
    /// The records, oldest first.
    pub records: Vec<SessionHistoryRecord>,
}

/// A record that does not decode into logical events, or events that cannot be packed
/// so that unpacking gives them back: the input is invalid and is refused whole.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RowError {
    /// `type` is not a chunk row kind.
    #[error("unknown chunk row type {0:?}")]
    UnknownKind(String),
    /// No members, or `gaps` not one shorter than `lengths`.
    #[error("a chunk row needs one length per member and one gap between members")]
    Shape,
    /// The lengths do not add up to the text, or a length cuts a character.
    #[error("chunk row lengths do not split the text into whole characters")]
    Lengths,
    /// A time outside `0..=2^53 - 1`: an event's time, a row's time, or a member's
    /// time (the row's time plus the gaps before it).
    #[error("a time leaves the exact integer range 0..=2^53-1")]
    Time,
    /// A sequence number past 2^53 - 1: an event's, or a row's first or last member's.
    #[error("a sequence number is past the exact integer range (2^53 - 1)")]
    Seq,
    /// A fragment longer than a chunk row's lengths can say (2^32 - 1 bytes).
    #[error("a fragment is longer than a chunk row length can say")]
    FragmentTooLong,
}

/// Checks a row: kind, shape, lengths against the text, the sequence range and every
/// member's time inside `0..=2^53 - 1`.
pub fn validate_row(row: &ChunkRowEvent) -> Result<DeltaKind, RowError> {
    let kind =
        DeltaKind::of_row_type(&row.kind).ok_or_else(|| RowError::UnknownKind(row.kind.clone()))?;
    let d = &row.data;
    if d.lengths.is_empty() || d.gaps.len() + 1 != d.lengths.len() {
        return Err(RowError::Shape);
    }
    let mut at = 0usize;
    for &len in &d.lengths {
        at = at.checked_add(len as usize).ok_or(RowError::Lengths)?;
        if at > d.text.len() || !d.text.is_char_boundary(at) {
            return Err(RowError::Lengths);
        }
    }
    if at != d.text.len() {
        return Err(RowError::Lengths);
    }
    row.seq_range()?;
    let mut t = WireInt::new(row.time).map_err(|_| RowError::Time)?;
    for &g in &d.gaps {
        t = t.checked_add_signed(g).ok_or(RowError::Time)?;
    }
    Ok(kind)
}

/// The members of a row, exactly as they were before packing.
pub fn unpack(row: &ChunkRowEvent) -> Result<Vec<SessionEvent>, RowError> {
    let kind = validate_row(row)?;
    let d = &row.data;
    let mut out = Vec::with_capacity(d.lengths.len());
    let mut at = 0usize;
    let mut seq = WireInt::new(row.seq).map_err(|_| RowError::Seq)?;
    let mut time = WireInt::new(row.time).map_err(|_| RowError::Time)?;
    // The first member sits at the row's time; each later one a gap after the previous.
    let gaps = std::iter::once(0).chain(d.gaps.iter().copied());
    for (i, (&len, gap)) in d.lengths.iter().zip(gaps).enumerate() {
        if i > 0 {
            seq = seq.next().ok_or(RowError::Seq)?;
        }
        time = time.checked_add_signed(gap).ok_or(RowError::Time)?;
        let end = at.checked_add(len as usize).ok_or(RowError::Lengths)?;
        let text = d.text.get(at..end).ok_or(RowError::Lengths)?;
        out.push(SessionEvent {
            seq: seq.get(),
            time: time.get(),
            kind: kind.event_type().to_owned(),
            session_id: row.session_id.clone(),
            turn_id: row.turn_id.clone(),
            block: Some(d.block.clone()),
            text: Some(text.to_owned()),
            data: serde_json::Value::Null,
        });
        at = end;
    }
    Ok(out)
}

/// Every logical event of a page (rows unpacked; unknown records skipped). An event
/// whose `seq` or `time` is past 2^53 - 1 is refused like a row that does not decode.
pub fn unpack_records(records: &[SessionHistoryRecord]) -> Result<Vec<SessionEvent>, RowError> {
    let mut out = Vec::new();
    for r in records {
        match r {
            SessionHistoryRecord::Event(e) => {
                e.check_numbers()?;
                out.push(e.clone());
            }
            SessionHistoryRecord::Chunks(row) => out.extend(unpack(row)?),
            SessionHistoryRecord::Unknown => {}
        }
    }
    Ok(out)
}

// ----- packing (PK-01): one pass, shared by `pack` and `write_packed_page` --------------

/// What one pass over a page hands out, in page order: events that stay events, and
/// rows member by member. [`pack`] builds records from it and [`write_packed_page`]
/// writes JSON from it, so the two cut the same runs and refuse the same pages.
trait PageSink {
    /// What the sink refuses with.
    type Error: From<RowError>;
    /// An event that stays an event.
    fn event(&mut self, e: &SessionEvent) -> Result<(), Self::Error>;
    /// A row of `kind` in `block` starts at `first` (its first member).
    fn row_start(&mut self, kind: DeltaKind, first: &SessionEvent, block: &str);
    /// The next member's fragment and its length in UTF-8 bytes.
    fn member(&mut self, text: &str, len: u32);
    /// The time from the previous member to the one [`PageSink::member`] hands out next.
    fn gap(&mut self, gap: i64);
    /// The open row's last member has been handed out.
    fn row_end(&mut self);
}

/// The one pass over a page (PK-01). Each event is read once, in page order, and its
/// `seq` and `time` are checked when it is reached, before it is handed out or used in
/// any arithmetic. A packable delta followed by a delta that joins it opens a row that
/// takes every following delta that joins; everything else stays an event.
fn scan<S: PageSink>(events: &[SessionEvent], sink: &mut S) -> Result<(), S::Error> {
    let mut rest = events;
    while let Some((first, tail)) = rest.split_first() {
        rest = tail;
        let (mut seq, mut time) = first.numbers()?;
        let (kind, block, text) = match first.as_packable_delta() {
            Some(delta)
                if rest
                    .first()
                    .and_then(|next| member_text(first, seq, next))
                    .is_some() =>
            {
                delta
            }
            _ => {
                sink.event(first)?;
                continue;
            }
        };
        sink.row_start(kind, first, block);
        sink.member(text, fragment_len(text)?);
        while let Some((next, tail)) = rest.split_first() {
            let Some(text) = member_text(first, seq, next) else {
                break;
            };
            let (next_seq, next_time) = next.numbers()?;
            sink.gap(time.signed_diff(next_time));
            sink.member(text, fragment_len(text)?);
            (seq, time) = (next_seq, next_time);
            rest = tail;
        }
        sink.row_end();
    }
    Ok(())
}

/// `next`'s fragment when `next` may join the row that `first` (a packable delta)
/// opened and whose last member has sequence number `last`: the next sequence number,
/// the same kind, block, session and turn, a fragment and no `data`. The cheap checks
/// on the event itself come before the ones that read its strings.
fn member_text<'e>(first: &SessionEvent, last: WireInt, next: &'e SessionEvent) -> Option<&'e str> {
    let text = next.text.as_deref()?;
    let joins = last.get().checked_add(1) == Some(next.seq)
        && next.data.is_null()
        && same(&next.kind, &first.kind)
        && same_opt(next.block.as_deref(), first.block.as_deref())
        && same(&next.session_id, &first.session_id)
        && same_opt(next.turn_id.as_deref(), first.turn_id.as_deref());
    joins.then_some(text)
}

/// String equality for the short identifiers a row shares, inline and without a loop
/// up to 32 bytes (a call per comparison costs more than the comparison): the first and
/// the last `N` bytes together cover a string of `N..=2N` bytes.
fn same(a: &str, b: &str) -> bool {
    fn ends<const N: usize>(a: &[u8], b: &[u8]) -> bool {
        a.first_chunk::<N>() == b.first_chunk::<N>() && a.last_chunk::<N>() == b.last_chunk::<N>()
    }
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    match a.len() {
        0..=3 => a.iter().zip(b).all(|(x, y)| x == y),
        4..=7 => ends::<4>(a, b),
        8..=16 => ends::<8>(a, b),
        17..=32 => ends::<16>(a, b),
        _ => a == b,
    }
}

/// [`same`] for optional strings: both absent, or both present and equal.
fn same_opt(a: Option<&str>, b: Option<&str>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => same(a, b),
        (None, None) => true,
        _ => false,
    }
}

/// A fragment's length as a chunk row records it.
fn fragment_len(text: &str) -> Result<u32, RowError> {
    u32::try_from(text.len()).map_err(|_| RowError::FragmentTooLong)
}

/// The refusal a page gets: a number past 2^53 - 1 anywhere in it wins over any other
/// refusal, and the first such event in page order decides (its `seq` before its
/// `time`). The pass stops at its first refusal; this keeps the answer independent of
/// where in the page the pass was when it stopped.
fn number_refusal(events: &[SessionEvent]) -> Option<RowError> {
    events.iter().find_map(|e| e.check_numbers().err())
}

/// Builds [`pack`]'s records as the pass hands them out.
#[derive(Default)]
struct RecordSink {
    records: Vec<SessionHistoryRecord>,
    row: Option<ChunkRowEvent>,
}

impl PageSink for RecordSink {
    type Error = RowError;

    fn event(&mut self, e: &SessionEvent) -> Result<(), RowError> {
        self.records.push(SessionHistoryRecord::Event(e.clone()));
        Ok(())
    }

    fn row_start(&mut self, kind: DeltaKind, first: &SessionEvent, block: &str) {
        self.row = Some(ChunkRowEvent {
            kind: kind.row_type().to_owned(),
            seq: first.seq,
            time: first.time,
            session_id: first.session_id.clone(),
            turn_id: first.turn_id.clone(),
            data: ChunkData {
                block: block.to_owned(),
                text: String::new(),
                lengths: Vec::new(),
                gaps: Vec::new(),
            },
        });
    }

    fn member(&mut self, text: &str, len: u32) {
        if let Some(row) = &mut self.row {
            row.data.text.push_str(text);
            row.data.lengths.push(len);
        }
    }

    fn gap(&mut self, gap: i64) {
        if let Some(row) = &mut self.row {
            row.data.gaps.push(gap);
        }
    }

    fn row_end(&mut self) {
        if let Some(row) = self.row.take() {
            self.records.push(SessionHistoryRecord::Chunks(row));
        }
    }
}

/// Packs a page of logical events: consecutive deltas of one block and kind (and
/// session and turn, with consecutive sequence numbers, and no `data`) become one row;
/// everything else stays an event. One pass; nothing is allocated per fragment.
///
/// Refuses, whole, what [`unpack_records`] would refuse, so unpacking the result gives
/// back exactly `events`: a `seq` past 2^53 - 1 ([`RowError::Seq`]), a `time` past it
/// ([`RowError::Time`]), a fragment in a row longer than 2^32 - 1 bytes
/// ([`RowError::FragmentTooLong`]).
pub fn pack(events: &[SessionEvent]) -> Result<Vec<SessionHistoryRecord>, RowError> {
    let mut sink = RecordSink::default();
    match scan(events, &mut sink) {
        Ok(()) => Ok(sink.records),
        Err(e) => Err(number_refusal(events).unwrap_or(e)),
    }
}

/// Why [`write_packed_page`] wrote no page.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PackError {
    /// The events cannot be packed so that unpacking gives them back (the same refusal
    /// as [`pack`]); the input is invalid.
    #[error(transparent)]
    Row(#[from] RowError),
    /// An event did not serialize.
    #[error("an event did not serialize: {0}")]
    Json(#[from] serde_json::Error),
}

/// Serializes `{"records":[...]}` of the packed page straight from the logical events
/// into `out` (cleared first), in one pass, without building rows or cloning fragments.
/// Writes exactly what serializing [`pack`]'s records with `serde_json` writes (the
/// same escapes), and refuses what it refuses; on an error `out` is left empty.
pub fn write_packed_page(events: &[SessionEvent], out: &mut Vec<u8>) -> Result<(), PackError> {
    out.clear();
    out.extend_from_slice(br#"{"records":["#);
    let mut sink = JsonSink {
        out: &mut *out,
        text_at: 0,
        tail: Vec::new(),
        lengths: Vec::new(),
        gaps: Vec::new(),
        records: 0,
    };
    let written =
        scan(events, &mut sink).map_err(|e| number_refusal(events).map_or(e, PackError::Row));
    match written {
        Ok(()) => {
            out.extend_from_slice(b"]}");
            Ok(())
        }
        Err(e) => {
            out.clear();
            Err(e)
        }
    }
}

/// Writes the packed page's JSON as the pass hands it out. A row's fragments are copied
/// raw behind its `"text":"` and escaped in bulk when the row ends (most text needs no
/// escape, and what does is found eight bytes at a time); its lengths and gaps collect
/// as digits in two buffers reused from row to row. Nothing is allocated per fragment.
struct JsonSink<'o> {
    out: &'o mut Vec<u8>,
    /// Where the open row's text starts in `out`.
    text_at: usize,
    /// The open row's text from its first byte that needs an escape (reused).
    tail: Vec<u8>,
    /// The open row's `lengths`, as written (reused).
    lengths: Vec<u8>,
    /// The open row's `gaps`, as written (reused).
    gaps: Vec<u8>,
    /// Records written so far.
    records: usize,
}

impl JsonSink<'_> {
    fn next_record(&mut self) {
        if self.records > 0 {
            self.out.push(b',');
        }
        self.records = self.records.saturating_add(1);
    }
}

impl PageSink for JsonSink<'_> {
    type Error = PackError;

    fn event(&mut self, e: &SessionEvent) -> Result<(), PackError> {
        self.next_record();
        self.out.extend_from_slice(br#"{"type":"event","event":"#);
        serde_json::to_writer(&mut *self.out, e)?;
        self.out.push(b'}');
        Ok(())
    }

    fn row_start(&mut self, kind: DeltaKind, first: &SessionEvent, block: &str) {
        self.next_record();
        let out = &mut *self.out;
        out.extend_from_slice(br#"{"type":"chunks","event":{"type":""#);
        out.extend_from_slice(kind.row_type().as_bytes());
        out.extend_from_slice(br#"","seq":"#);
        push_u64(out, first.seq);
        out.extend_from_slice(br#","time":"#);
        push_u64(out, first.time);
        out.extend_from_slice(br#","sessionId":"#);
        push_json_string(out, &first.session_id);
        if let Some(turn) = &first.turn_id {
            out.extend_from_slice(br#","turnId":"#);
            push_json_string(out, turn);
        }
        out.extend_from_slice(br#","data":{"block":"#);
        push_json_string(out, block);
        out.extend_from_slice(br#","text":""#);
        self.text_at = out.len();
        self.lengths.clear();
        self.gaps.clear();
    }

    fn member(&mut self, text: &str, len: u32) {
        self.out.extend_from_slice(text.as_bytes());
        push_item(&mut self.lengths, u64::from(len));
    }

    fn gap(&mut self, gap: i64) {
        if gap < 0 {
            self.gaps.extend_from_slice(b",-");
            push_u64(&mut self.gaps, gap.unsigned_abs());
        } else {
            push_item(&mut self.gaps, gap.unsigned_abs());
        }
    }

    fn row_end(&mut self) {
        escape_from(self.out, self.text_at, &mut self.tail);
        let out = &mut *self.out;
        // Every item was written after a comma; the first comma is not part of the list.
        out.extend_from_slice(br#"","lengths":["#);
        out.extend_from_slice(self.lengths.get(1..).unwrap_or_default());
        out.extend_from_slice(br#"],"gaps":["#);
        out.extend_from_slice(self.gaps.get(1..).unwrap_or_default());
        out.extend_from_slice(b"]}}}");
    }
}

/// A comma and the decimal digits of `n`: one and two digits (the common lengths and
/// gaps) in one append, without a loop.
#[inline]
fn push_item(out: &mut Vec<u8>, n: u64) {
    if n < 10 {
        out.extend_from_slice(&[b',', b'0' + n as u8]);
    } else if n < 100 {
        out.extend_from_slice(&[b',', b'0' + (n / 10) as u8, b'0' + (n % 10) as u8]);
    } else {
        out.push(b',');
        push_u64(out, n);
    }
}

/// Decimal digits of `n`, without the formatting machinery.
fn push_u64(out: &mut Vec<u8>, n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    let mut n = n;
    while let Some(slot) = i.checked_sub(1).and_then(|j| buf.get_mut(j)) {
        *slot = b'0' + (n % 10) as u8;
        i -= 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(buf.get(i..).unwrap_or_default());
}

/// `s` as a JSON string, quotes included.
fn push_json_string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    escape_contents(out, s.as_bytes());
    out.push(b'"');
}

/// Escapes, in place, the raw text written to `out` from `from` on: finds its first
/// byte that needs an escape and rewrites only from there (through `tail`, reused).
fn escape_from(out: &mut Vec<u8>, from: usize, tail: &mut Vec<u8>) {
    let Some(raw) = out.get(from..) else {
        return;
    };
    let first = from.saturating_add(clean_prefix(raw));
    let Some(rest) = out.get(first..).filter(|rest| !rest.is_empty()) else {
        return;
    };
    tail.clear();
    tail.extend_from_slice(rest);
    out.truncate(first);
    escape_contents(out, tail);
}

/// JSON string contents, escaped as `serde_json` escapes them (RFC 8259): `\"`, `\\`,
/// `\b`, `\f`, `\n`, `\r`, `\t`, and `\u00XX` for the other control characters. Clean
/// spans are copied whole.
fn escape_contents(out: &mut Vec<u8>, mut bytes: &[u8]) {
    loop {
        let (clean, rest) = bytes.split_at(clean_prefix(bytes));
        out.extend_from_slice(clean);
        let Some((&b, rest)) = rest.split_first() else {
            return;
        };
        const HEX: &[u8; 16] = b"0123456789abcdef";
        match b {
            b'"' => out.extend_from_slice(br#"\""#),
            b'\\' => out.extend_from_slice(br"\\"),
            0x08 => out.extend_from_slice(br"\b"),
            0x0c => out.extend_from_slice(br"\f"),
            b'\n' => out.extend_from_slice(br"\n"),
            b'\r' => out.extend_from_slice(br"\r"),
            b'\t' => out.extend_from_slice(br"\t"),
            _ => out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 15)],
            ]),
        }
        bytes = rest;
    }
}

/// Whether a byte needs an escape inside a JSON string.
const fn needs_escape(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\'
}

/// The length of the longest prefix of `bytes` that needs no escape, checked eight
/// bytes at a time: a byte below 0x20, a quote or a backslash sets the high bit of its
/// lane. Borrows only run upward from a lane that matches, so the lowest marked lane
/// is the first byte that needs an escape.
fn clean_prefix(bytes: &[u8]) -> usize {
    const ONES: u64 = u64::from_le_bytes([1; 8]);
    const HIGH: u64 = ONES << 7;
    const QUOTES: u64 = ONES * b'"' as u64;
    const BACKSLASHES: u64 = ONES * b'\\' as u64;
    let mut at = 0;
    let mut words = bytes.chunks_exact(8);
    for chunk in &mut words {
        let Ok(word) = <[u8; 8]>::try_from(chunk) else {
            break;
        };
        let w = u64::from_le_bytes(word);
        let (q, b) = (w ^ QUOTES, w ^ BACKSLASHES);
        let marks = (w.wrapping_sub(ONES * 0x20) & !w
            | q.wrapping_sub(ONES) & !q
            | b.wrapping_sub(ONES) & !b)
            & HIGH;
        if marks != 0 {
            return at + (marks.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    let rest = bytes.get(at..).unwrap_or_default();
    at + rest
        .iter()
        .position(|&b| needs_escape(b))
        .unwrap_or(rest.len())
}

/// A message boundary: the event starts a new message (it is not a delta that
/// continues the previous event's block).
fn starts_message(events: &[SessionEvent], i: usize) -> bool {
    let (Some(before), Some(at)) = (i.checked_sub(1).and_then(|b| events.get(b)), events.get(i))
    else {
        return true;
    };
    match (before.as_delta(), at.as_delta()) {
        (Some((ka, ba, _)), Some((kb, bb, _))) => !(ka == kb && ba == bb),
        _ => true,
    }
}

/// Chooses a page of about `max_events` logical events ending before index `before`
/// (`None`: the newest), moved back to the start of the message it would cut (PK-02).
/// Returns the index range into `events`.
pub fn select_page(
    events: &[SessionEvent],
    before: Option<usize>,
    max_events: usize,
) -> std::ops::Range<usize> {
    let end = before.unwrap_or(events.len()).min(events.len());
    let mut start = end.saturating_sub(max_events);
    // An empty page cuts no message.
    while start > 0 && start < end && !starts_message(events, start) {
        start -= 1;
    }
    start..end
}

// ----- the client journal (PK-03) --------------------------------------------------------

/// Where published records go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// Before everything published (an older page).
    Older,
    /// After everything published (newer records, live events).
    Newer,
}

/// What the journal did with a page or a live event.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum JournalOutcome {
    /// Records published (in order), and where.
    Published {
        /// Where they go.
        side: Side,
        /// The records.
        records: Vec<SessionHistoryRecord>,
    },
    /// Everything was published before.
    Duplicate,
    /// Sequence numbers are missing between what is published and what arrived.
    Gap {
        /// The range that is missing.
        missing: RangeInclusive<u64>,
    },
    /// A record covers both published and unpublished numbers; it is not split.
    PartialOverlap {
        /// The record's range.
        record: RangeInclusive<u64>,
    },
    /// A page that reaches below what is published and into it.
    Straddling {
        /// The page's range.
        page: RangeInclusive<u64>,
    },
    /// The page itself is not continuous.
    BrokenPage {
        /// Where it breaks.
        at: u64,
    },
    /// A record that does not decode: a packed row that does not split into its
    /// members, or an event or row whose sequence numbers or times leave
    /// `0..=2^53 - 1`. Nothing of the page is published.
    BadRow(RowError),
}

/// Publishes records only when their sequence ranges continue what it holds.
///
/// Every range it holds or compares lies in `0..=2^53 - 1` (records outside are refused
/// with [`JournalOutcome::BadRow`] first), so the `± 1` of its continuity checks never
/// overflows.
#[derive(Clone, Debug, Default)]
pub struct Journal {
    span: Option<RangeInclusive<u64>>,
}

impl Journal {
    /// An empty journal.
    pub fn new() -> Self {
        Self::default()
    }

    /// The inclusive range published so far.
    pub fn span(&self) -> Option<RangeInclusive<u64>> {
        self.span.clone()
    }

    /// A page (the opening snapshot, an older page, a reconnect repair).
    pub fn accept_page(&mut self, records: &[SessionHistoryRecord]) -> JournalOutcome {
        let mut ranged: Vec<(RangeInclusive<u64>, &SessionHistoryRecord)> =
            Vec::with_capacity(records.len());
        for r in records {
            let checked = match r {
                SessionHistoryRecord::Event(e) => e.check_numbers(),
                SessionHistoryRecord::Chunks(row) => validate_row(row).map(drop),
                SessionHistoryRecord::Unknown => Ok(()),
            };
            let range = match checked.and_then(|()| r.seq_range()) {
                Ok(Some(range)) => range,
                Ok(None) => continue,
                Err(e) => return JournalOutcome::BadRow(e),
            };
            if let Some((prev, _)) = ranged.last() {
                if prev.end().checked_add(1) != Some(*range.start()) {
                    return JournalOutcome::BrokenPage { at: *range.start() };
                }
            }
            ranged.push((range, r));
        }
        let (Some(first), Some(last)) = (ranged.first(), ranged.last()) else {
            return JournalOutcome::Duplicate;
        };
        let (page_start, page_end) = (*first.0.start(), *last.0.end());
        let Some(span) = self.span.clone() else {
            self.span = Some(page_start..=page_end);
            return JournalOutcome::Published {
                side: Side::Newer,
                records: ranged.into_iter().map(|(_, r)| r.clone()).collect(),
            };
        };
        let (start, end) = (*span.start(), *span.end());
        // Every bound is at most 2^53 - 1, so `+ 1` below never saturates, and every
        // `- 1` is of a number known to be above another.
        if page_end < start {
            // An older page must join right below what is published.
            if page_end.saturating_add(1) < start {
                return JournalOutcome::Gap {
                    missing: page_end.saturating_add(1)..=start.saturating_sub(1),
                };
            }
            self.span = Some(page_start..=end);
            return JournalOutcome::Published {
                side: Side::Older,
                records: ranged.into_iter().map(|(_, r)| r.clone()).collect(),
            };
        }
        if page_start > end.saturating_add(1) {
            return JournalOutcome::Gap {
                missing: end.saturating_add(1)..=page_start.saturating_sub(1),
            };
        }
        if page_start < start {
            // Reaches below and into the span: ask for the two parts separately.
            return JournalOutcome::Straddling {
                page: page_start..=page_end,
            };
        }
        let mut fresh = Vec::new();
        for (range, r) in &ranged {
            if *range.end() <= end {
                continue; // complete duplicate
            }
            if *range.start() <= end {
                return JournalOutcome::PartialOverlap {
                    record: range.clone(),
                };
            }
            fresh.push((*r).clone());
        }
        if fresh.is_empty() {
            return JournalOutcome::Duplicate;
        }
        self.span = Some(start.min(page_start)..=page_end);
        JournalOutcome::Published {
            side: Side::Newer,
            records: fresh,
        }
    }

    /// A live event. One whose `seq` or `time` is past 2^53 - 1 is
    /// [`JournalOutcome::BadRow`] and is not published.
    pub fn accept_live(&mut self, event: &SessionEvent) -> JournalOutcome {
        if let Err(e) = event.check_numbers() {
            return JournalOutcome::BadRow(e);
        }
        match self.span.clone() {
            None => {
                self.span = Some(event.seq..=event.seq);
            }
            Some(span) if event.seq <= *span.end() => return JournalOutcome::Duplicate,
            Some(span) if event.seq > span.end().saturating_add(1) => {
                return JournalOutcome::Gap {
                    missing: span.end().saturating_add(1)..=event.seq.saturating_sub(1),
                }
            }
            Some(span) => self.span = Some(*span.start()..=event.seq),
        }
        JournalOutcome::Published {
            side: Side::Newer,
            records: vec![SessionHistoryRecord::Event(event.clone())],
        }
    }
}

// ----- dual-path folds (PK-04) -----------------------------------------------------------

/// The text of one block.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockText {
    /// Its kind.
    pub kind: Option<DeltaKind>,
    /// Everything streamed into it.
    pub text: String,
}

/// An assistant-message reducer that takes scalar deltas and packed rows alike and
/// reaches the same state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AssistantFold {
    /// Text per block (tool-call blocks hold the argument text).
    pub blocks: BTreeMap<String, BlockText>,
    /// The time of the first delta.
    pub first_token_time: Option<u64>,
    /// Deltas folded.
    pub delta_count: u64,
    /// The sequence number of the last delta.
    pub last_delta_seq: Option<u64>,
    /// Entries folded (one per scalar event or row).
    pub entries: u64,
}

impl AssistantFold {
    /// A fresh fold.
    pub fn new() -> Self {
        Self::default()
    }

    /// Folds one scalar event (non-deltas count as entries only). It does no arithmetic
    /// on the event's numbers; [`AssistantFold::fold_record`] and the [`Journal`] refuse
    /// events whose numbers are past 2^53 - 1.
    pub fn fold_event(&mut self, e: &SessionEvent) {
        self.entries = self.entries.saturating_add(1);
        let Some((kind, block, text)) = e.as_delta() else {
            return;
        };
        self.push(kind, block, text, e.time, e.seq, 1);
    }

    /// Folds one packed row as one entry. The row must have been validated
    /// ([`validate_row`]); an invalid row is not folded.
    pub fn fold_row(&mut self, row: &ChunkRowEvent) -> Result<(), RowError> {
        let kind = validate_row(row)?;
        let last_seq = *row.seq_range()?.end();
        let n = u64::try_from(row.member_count()).map_err(|_| RowError::Shape)?;
        self.entries = self.entries.saturating_add(1);
        self.push(kind, &row.data.block, &row.data.text, row.time, last_seq, n);
        Ok(())
    }

    /// Folds a record. An event or row whose numbers are past 2^53 - 1 is refused and
    /// not folded.
    pub fn fold_record(&mut self, r: &SessionHistoryRecord) -> Result<(), RowError> {
        match r {
            SessionHistoryRecord::Event(e) => {
                e.check_numbers()?;
                self.fold_event(e);
            }
            SessionHistoryRecord::Chunks(row) => self.fold_row(row)?,
            SessionHistoryRecord::Unknown => {}
        }
        Ok(())
    }

    fn push(
        &mut self,
        kind: DeltaKind,
        block: &str,
        text: &str,
        first_time: u64,
        last_seq: u64,
        count: u64,
    ) {
        match self.blocks.get_mut(block) {
            Some(b) => b.text.push_str(text),
            None => {
                self.blocks.insert(
                    block.to_owned(),
                    BlockText {
                        kind: Some(kind),
                        text: text.to_owned(),
                    },
                );
            }
        }
        self.first_token_time.get_or_insert(first_time);
        self.delta_count = self.delta_count.saturating_add(count);
        self.last_delta_seq = Some(last_seq);
    }
}

#[cfg(test)]
mod tests {
    //! The writer's fast paths pinned to the naive truth: string equality against `==`,
    //! the eight-byte escape scan against a byte-by-byte scan, the bulk escape against
    //! `serde_json`, and the one-pass writer against serializing [`pack`]'s records.

    use super::*;
    use proptest::prelude::*;

    fn page_json(records: Vec<SessionHistoryRecord>) -> String {
        serde_json::to_string(&HistoryPage { records }).unwrap()
    }

    fn written(events: &[SessionEvent]) -> String {
        let mut out = Vec::new();
        write_packed_page(events, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    // PK-01: every ASCII byte a fragment or an identifier can hold (every control
    // character, `\b` and `\f` among them, the quote, the backslash, DEL) and multi-byte
    // text is written exactly as serde_json writes it. (`\b` and `\f` used to be
    // written as `\u0008` and `\u000c`.)
    #[test]
    fn every_escape_is_written_as_serde_json_writes_it() {
        let mut fragments: Vec<String> = (0u8..0x80).map(|b| char::from(b).to_string()).collect();
        fragments.extend(
            [
                "é",
                "漢",
                "🙂",
                "\u{2028}",
                "a\u{8}b\u{c}c\"d\\e\u{1f}f\u{7f}g",
            ]
            .map(str::to_owned),
        );
        let events: Vec<SessionEvent> = fragments
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let mut e = SessionEvent::delta(
                    i as u64 + 1,
                    5,
                    "s\u{8}\"",
                    DeltaKind::Text,
                    "b\u{c}\\",
                    t,
                );
                e.turn_id = Some("t\u{1}".to_owned());
                e
            })
            .collect();
        let records = pack(&events).unwrap();
        assert_eq!(records.len(), 1, "one row");
        assert_eq!(written(&events), page_json(records.clone()));
        assert_eq!(unpack_records(&records).unwrap(), events);
    }

    // PK-01: the inline equality that decides which deltas share a row is string
    // equality, at every length (each of its branches) and for a difference at every
    // position.
    #[test]
    fn same_is_string_equality_at_every_length_and_position() {
        for len in 0..=70u8 {
            let a: String = (0..len).map(|i| char::from(b'a' + i % 26)).collect();
            assert!(same(&a, &a.clone()), "{len}");
            for at in 0..usize::from(len) {
                let mut b = a.clone().into_bytes();
                b[at] = b'_';
                let b = String::from_utf8(b).unwrap();
                assert!(!same(&a, &b), "{len} {at}");
            }
            assert!(!same(&a, &format!("{a}_")), "{len}");
            assert!(!same(&format!("{a}_"), &a), "{len}");
        }
        assert!(same_opt(None, None));
        assert!(!same_opt(Some(""), None));
        assert!(!same_opt(None, Some("")));
    }

    // PK-01: the eight-byte scan finds the first byte that needs an escape wherever it
    // sits in a word or the tail, whatever follows it.
    #[test]
    fn the_escape_scan_finds_the_first_escape_at_every_position() {
        let escapes = (0u8..0x20).chain([b'"', b'\\']);
        for e in escapes {
            for len in 1..=40 {
                for at in 0..len {
                    let mut bytes = vec![b'a'; len];
                    bytes[at] = e;
                    if at + 1 < len {
                        bytes[at + 1] = b'"';
                    }
                    assert_eq!(clean_prefix(&bytes), at, "{e:#x} {len} {at}");
                }
            }
        }
        let clean: Vec<u8> = (0x20u8..=0xff).filter(|&b| !needs_escape(b)).collect();
        assert_eq!(clean_prefix(&clean), clean.len());
        assert_eq!(clean_prefix(&[]), 0);
    }

    /// A page of deltas and other events whose runs break on every field the join
    /// compares: kind, block, session, turn, a missing fragment, `data`, a skipped
    /// sequence number; fragments of any text.
    fn pages() -> impl Strategy<Value = Vec<SessionEvent>> {
        let event = (
            0usize..5,
            prop::sample::select(vec!["b", "b2", "\"b\""]),
            prop::sample::select(vec!["s", "s\n"]),
            proptest::option::of(prop::sample::select(vec!["t", "turn-\u{8}"])),
            ".{0,6}",
            0u64..3,
            0u64..40,
            any::<bool>(),
        );
        proptest::collection::vec(event, 0..40).prop_map(|specs| {
            let (mut seq, mut time) = (1u64, 1_000u64);
            specs
                .into_iter()
                .map(|(kind, block, session, turn, text, step, dt, back)| {
                    seq += step.min(1) + u64::from(step == 2);
                    time = if back {
                        time.saturating_sub(dt)
                    } else {
                        time + dt
                    };
                    let mut e = match kind {
                        0..=2 => {
                            let k = [DeltaKind::Text, DeltaKind::Reasoning, DeltaKind::ToolCall];
                            SessionEvent::delta(seq, time, session, k[kind], block, &text)
                        }
                        3 => {
                            let mut e =
                                SessionEvent::delta(seq, time, session, DeltaKind::Text, block, "");
                            e.text = None;
                            e
                        }
                        _ => SessionEvent::other(
                            seq,
                            time,
                            session,
                            "tool/result",
                            serde_json::json!({ "t": text }),
                        ),
                    };
                    e.turn_id = turn.map(str::to_owned);
                    e
                })
                .collect()
        })
    }

    proptest! {
        // PK-01: any text is escaped exactly as serde_json escapes it.
        #[test]
        fn escaping_matches_serde_json(s in any::<String>()) {
            let mut out = vec![b'"'];
            escape_contents(&mut out, s.as_bytes());
            out.push(b'"');
            prop_assert_eq!(String::from_utf8(out).unwrap(), serde_json::to_string(&s).unwrap());
        }

        // PK-01: the eight-byte scan agrees with a byte-by-byte scan.
        #[test]
        fn the_escape_scan_agrees_with_a_byte_scan(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let naive = bytes.iter().position(|&b| needs_escape(b)).unwrap_or(bytes.len());
            prop_assert_eq!(clean_prefix(&bytes), naive);
        }

        // PK-01: the one-pass writer writes exactly what serializing `pack`'s records
        // writes, and pack then unpack is the identity, for pages whose runs break on
        // every field.
        #[test]
        fn the_writer_writes_what_serde_writes(events in pages()) {
            let records = pack(&events).unwrap();
            prop_assert_eq!(unpack_records(&records).unwrap(), events.clone());
            prop_assert_eq!(written(&events), page_json(records));
        }
    }
}
