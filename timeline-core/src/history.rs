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
//!   the logical events into a reused buffer without cloning fragments.
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

/// True when `b` may join the run that `a` ends: same kind, block, session and turn,
/// the next sequence number, and no `data` (`a` is known to be a packable delta).
fn joins(a: &SessionEvent, b: &SessionEvent) -> bool {
    a.seq.checked_add(1) == Some(b.seq)
        && a.kind == b.kind
        && a.block == b.block
        && b.text.is_some()
        && b.data.is_null()
        && a.session_id == b.session_id
        && a.turn_id == b.turn_id
}

/// The runs of a page: `(start, end)` index ranges; a run of one event stays an event.
fn runs(events: &[SessionEvent]) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        let first = events.get(i)?;
        let start = i;
        i += 1;
        if first.as_packable_delta().is_some() {
            while let (Some(a), Some(b)) = (events.get(i - 1), events.get(i)) {
                if !joins(a, b) {
                    break;
                }
                i += 1;
            }
        }
        Some((start, i))
    })
}

/// The gap from `prev`'s time to `next`'s, both checked to be wire integers.
fn gap(prev: &SessionEvent, next: &SessionEvent) -> Result<i64, RowError> {
    let (_, p) = prev.numbers()?;
    let (_, n) = next.numbers()?;
    Ok(p.signed_diff(n))
}

/// A fragment's length as a chunk row records it.
fn fragment_len(e: &SessionEvent) -> Result<u32, RowError> {
    u32::try_from(e.text.as_deref().map_or(0, str::len)).map_err(|_| RowError::FragmentTooLong)
}

/// The row of a run of two or more packable deltas.
fn row_of(run: &[SessionEvent]) -> Result<ChunkRowEvent, RowError> {
    let Some(first) = run.first() else {
        return Err(RowError::Shape);
    };
    let (kind, block, _) = first.as_packable_delta().ok_or(RowError::Shape)?;
    first.check_numbers()?;
    let mut text = String::new();
    let mut lengths = Vec::with_capacity(run.len());
    let mut gaps = Vec::with_capacity(run.len().saturating_sub(1));
    let mut prev: Option<&SessionEvent> = None;
    for e in run {
        lengths.push(fragment_len(e)?);
        text.push_str(e.text.as_deref().unwrap_or_default());
        if let Some(p) = prev {
            gaps.push(gap(p, e)?);
        }
        prev = Some(e);
    }
    Ok(ChunkRowEvent {
        kind: kind.row_type().to_owned(),
        seq: first.seq,
        time: first.time,
        session_id: first.session_id.clone(),
        turn_id: first.turn_id.clone(),
        data: ChunkData {
            block: block.to_owned(),
            text,
            lengths,
            gaps,
        },
    })
}

/// Packs a page of logical events: consecutive deltas of one block and kind (and
/// session and turn, with consecutive sequence numbers, and no `data`) become one row;
/// everything else stays an event.
///
/// Refuses, whole, what [`unpack_records`] would refuse, so unpacking the result gives
/// back exactly `events`: a `seq` past 2^53 - 1 ([`RowError::Seq`]), a `time` past it
/// ([`RowError::Time`]), a fragment in a row longer than 2^32 - 1 bytes
/// ([`RowError::FragmentTooLong`]).
pub fn pack(events: &[SessionEvent]) -> Result<Vec<SessionHistoryRecord>, RowError> {
    for e in events {
        e.check_numbers()?;
    }
    runs(events)
        .map(|(a, b)| match events.get(a..b) {
            Some([one]) => Ok(SessionHistoryRecord::Event(one.clone())),
            Some(run) => row_of(run).map(SessionHistoryRecord::Chunks),
            None => Err(RowError::Shape),
        })
        .collect()
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
/// into `out` (cleared first), without building rows or cloning fragments. Writes
/// exactly what serializing [`pack`]'s records writes, and refuses what it refuses; on
/// an error `out` is left empty.
pub fn write_packed_page(events: &[SessionEvent], out: &mut Vec<u8>) -> Result<(), PackError> {
    out.clear();
    let written = write_records(events, out);
    if written.is_err() {
        out.clear();
    }
    written
}

fn write_records(events: &[SessionEvent], out: &mut Vec<u8>) -> Result<(), PackError> {
    for e in events {
        e.check_numbers()?;
    }
    out.extend_from_slice(br#"{"records":["#);
    for (n, (a, b)) in runs(events).enumerate() {
        if n > 0 {
            out.push(b',');
        }
        let run = events.get(a..b).ok_or(RowError::Shape)?;
        let first = match run {
            [one] => {
                out.extend_from_slice(br#"{"type":"event","event":"#);
                serde_json::to_writer(&mut *out, one)?;
                out.push(b'}');
                continue;
            }
            [first, ..] => first,
            [] => return Err(RowError::Shape.into()),
        };
        let (kind, block, _) = first.as_packable_delta().ok_or(RowError::Shape)?;
        out.extend_from_slice(br#"{"type":"chunks","event":{"type":""#);
        out.extend_from_slice(kind.row_type().as_bytes());
        out.extend_from_slice(br#"","seq":"#);
        push_u64(out, first.seq);
        out.extend_from_slice(br#","time":"#);
        push_u64(out, first.time);
        out.extend_from_slice(br#","sessionId":"#);
        escape_into(out, &first.session_id);
        if let Some(turn) = &first.turn_id {
            out.extend_from_slice(br#","turnId":"#);
            escape_into(out, turn);
        }
        out.extend_from_slice(br#","data":{"block":"#);
        escape_into(out, block);
        out.extend_from_slice(br#","text":""#);
        for e in run {
            escape_contents(out, e.text.as_deref().unwrap_or_default());
        }
        out.extend_from_slice(br#"","lengths":["#);
        for (i, e) in run.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            push_u64(out, u64::from(fragment_len(e)?));
        }
        out.extend_from_slice(br#"],"gaps":["#);
        for (i, pair) in run.windows(2).enumerate() {
            if i > 0 {
                out.push(b',');
            }
            let [prev, next] = pair else {
                return Err(RowError::Shape.into());
            };
            let gap = gap(prev, next)?;
            if gap < 0 {
                out.push(b'-');
            }
            push_u64(out, gap.unsigned_abs());
        }
        out.extend_from_slice(b"]}}}");
    }
    out.extend_from_slice(b"]}");
    Ok(())
}

/// Decimal digits of `n`, without the formatting machinery.
fn push_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

fn escape_into(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    escape_contents(out, s);
    out.push(b'"');
}

/// JSON string contents (RFC 8259 escapes).
fn escape_contents(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let esc: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f => {
                out.extend_from_slice(&bytes[start..i]);
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(&[
                    b'\\',
                    b'u',
                    b'0',
                    b'0',
                    HEX[(b >> 4) as usize],
                    HEX[(b & 15) as usize],
                ]);
                start = i + 1;
                continue;
            }
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        out.extend_from_slice(esc);
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
}

/// A message boundary: the event starts a new message (it is not a delta that
/// continues the previous event's block).
fn starts_message(events: &[SessionEvent], i: usize) -> bool {
    i == 0
        || match (events[i - 1].as_delta(), events[i].as_delta()) {
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
    while start > 0 && !starts_message(events, start) {
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
