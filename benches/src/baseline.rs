//! The code of two hot paths as it was before the changes that slowed them (issue 25,
//! item 7), kept as baselines so `benches/overlay.rs` and `benches/replay.rs` measure the
//! old and the new code side by side in one run:
//!
//! - [`baseline_latest_window`]: the latest window as it was built over the memory store
//!   that kept each target's overlay as one whole [`StoredOverlay`] (before the indexed
//!   overlay, commit `25e4dd1`): the store's `load` cloned the overlay, the naive `apply`
//!   (`fixtures::naive_overlay`) scanned every row, and the answer cloned
//!   every block again. [`BaselineOverlayStore`] is that store.
//! - [`BaselineReplay`]: `ReplayBuffers::append` as it was before it checked its text
//!   (commit `b29de5d`): the text trusted to be an object, trimmed of whitespace, pushed
//!   into the ring, the oldest events trimmed.
//!
//! And the code this change replaced (commit `6eaa26a`), to show what the change itself
//! gained: [`previous_latest_window`] (today's indexed store, the whole stored form built
//! for the answer) and [`BaselineReplay::append_checked`] (the check by serde_json's
//! parser with a visitor).
//!
//! The tests below pin the baselines to today's code: the same window, the same stored
//! bytes, the same verdicts.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use fixtures::naive_overlay::apply;
use overlay_core::overlay::Change;
use overlay_core::replay::AppendError;
use overlay_core::source::{HistorySource, SourceItem, SourceKind};
use overlay_core::store::memory::MemoryOverlayStore;
use overlay_core::store::{write, WriteResult};
use overlay_core::store::{OverlayStore, StoredBlock, StoredOverlay, FORMAT_VERSION};
use overlay_core::window::WindowError;
use timeline_core::block::Block;
use timeline_core::cursor::{ClaudeCursor, CodexCursor};
use timeline_core::key::{RunId, SessionId, TargetId};
use timeline_core::policy::{effective_page_size, RESPONSE_CAP_BYTES};
use timeline_core::seal::HostKey;
use timeline_core::wire::{LiveOverlay, TimelineWindow};

/// The memory overlay store as it was before the indexed overlay: each target's whole
/// overlay, one global counter. (Its compare-and-set checks only the revision; the naive
/// `apply` hands it rows in canonical order.)
#[derive(Clone, Debug, Default)]
pub struct BaselineOverlayStore {
    overlays: BTreeMap<(SessionId, TargetId), StoredOverlay>,
    revision: u64,
}

impl BaselineOverlayStore {
    /// An empty store whose counter starts at 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// The old `load`: a clone of the whole overlay.
    pub fn load(&self, session: &SessionId, target: &TargetId) -> Option<StoredOverlay> {
        self.overlays
            .get(&(session.clone(), target.clone()))
            .cloned()
    }

    /// The old `compare_and_set` (the stored overlay is kept and a clone returned).
    ///
    /// # Errors
    ///
    /// A stale `expected`, as [`WindowError::Store`].
    pub fn compare_and_set(
        &mut self,
        session: &SessionId,
        target: &TargetId,
        expected: Option<u64>,
        epoch: u64,
        blocks: Vec<StoredBlock>,
    ) -> Result<StoredOverlay, WindowError> {
        let k = (session.clone(), target.clone());
        let current = self.overlays.get(&k);
        if current.map(|o| o.revision) != expected {
            return Err(WindowError::Store(
                overlay_core::store::OverlayError::Stale {
                    current: current.cloned().map(Box::new),
                },
            ));
        }
        self.revision += 1;
        let stored = StoredOverlay {
            format_version: FORMAT_VERSION,
            settlement_epoch: epoch,
            revision: self.revision,
            blocks,
        };
        self.overlays.insert(k, stored.clone());
        Ok(stored)
    }

    /// The old `write` of one change: load, the naive `apply`, compare-and-set.
    ///
    /// # Errors
    ///
    /// As [`BaselineOverlayStore::compare_and_set`].
    pub fn write(
        &mut self,
        session: &SessionId,
        target: &TargetId,
        change: &Change,
    ) -> Result<(Option<StoredOverlay>, Option<StoredOverlay>), WindowError> {
        let current = self.load(session, target);
        match apply(current.as_ref(), change) {
            None => Ok((current, None)),
            Some((epoch, blocks)) => {
                let expected = current.as_ref().map(|c| c.revision);
                let written = self.compare_and_set(session, target, expected, epoch, blocks)?;
                Ok((Some(written.clone()), Some(written)))
            }
        }
    }

    /// The last revision the counter handed out.
    pub fn current_revision(&self) -> u64 {
        self.revision
    }
}

/// The latest window of `page_size` rows over the old whole-overlay store, as
/// `overlay_core::window::latest_window` built it before the indexed overlay: read the
/// newest page (until a visible row), settle the overlay against its keys (the store's
/// `load` clones the whole overlay, the naive `apply` looks at every row), answer with
/// every overlay block cloned, and check the 8 MiB cap by serializing the answer. Returns
/// the window and what the settlement stored, if it wrote.
///
/// # Errors
///
/// What the old builder returned: a refused page size, a source or store failure, an
/// answer past 8 MiB.
pub fn baseline_latest_window(
    store: &mut BaselineOverlayStore,
    source: &mut dyn HistorySource,
    key: &HostKey,
    session: &SessionId,
    target: &TargetId,
    current_run: Option<&RunId>,
    page_size: usize,
) -> Result<(TimelineWindow, Option<StoredOverlay>), WindowError> {
    window_with(source, key, current_run, page_size, |change| {
        // settle_against, over the old store's update: load (a clone), apply, store.
        let (stored, settled) = store.write(session, target, change)?;
        let overlay = stored.as_ref().map_or(
            LiveOverlay {
                settlement_epoch: 0,
                revision: 0,
                blocks: Vec::new(),
            },
            StoredOverlay::client_form,
        );
        Ok((overlay, settled, store.current_revision()))
    })
}

/// The latest window over today's memory store as it was built before this change
/// (commit `6eaa26a`): the settlement write, then the whole stored form built from the
/// indexed rows (cloned once more into `settled` when the window wrote), every block
/// copied again from it for the answer, and the 8 MiB check by serializing the answer
/// into a buffer.
///
/// # Errors
///
/// As [`baseline_latest_window`].
pub fn previous_latest_window(
    store: &mut MemoryOverlayStore,
    source: &mut dyn HistorySource,
    key: &HostKey,
    session: &SessionId,
    target: &TargetId,
    current_run: Option<&RunId>,
    page_size: usize,
) -> Result<(TimelineWindow, Option<StoredOverlay>), WindowError> {
    window_with(source, key, current_run, page_size, |change| {
        let result = write(store, session, target, change)?;
        let settled = match &result {
            WriteResult::Written { stored, .. } => Some(stored.stored().clone()),
            WriteResult::Unchanged(_) => None,
        };
        let overlay = result.stored().map_or(
            LiveOverlay {
                settlement_epoch: 0,
                revision: 0,
                blocks: Vec::new(),
            },
            StoredOverlay::client_form,
        );
        Ok((overlay, settled, store.current_revision()?))
    })
}

/// What a settlement step hands the builder: the client overlay, what it stored (when
/// it wrote), the revision counter.
type Settled = (LiveOverlay, Option<StoredOverlay>, u64);

/// The latest-window builder around a settlement step, as both old versions had it:
/// the page, `settle`, the cursor, the answer and its size check by
/// `serde_json::to_vec`.
fn window_with(
    source: &mut dyn HistorySource,
    key: &HostKey,
    current_run: Option<&RunId>,
    page_size: usize,
    settle: impl FnOnce(&Change) -> Result<Settled, WindowError>,
) -> Result<(TimelineWindow, Option<StoredOverlay>), WindowError> {
    let page_size =
        effective_page_size(page_size).map_err(|e| WindowError::InvalidParams(e.to_string()))?;
    // scan_back: read until a visible row shows (or history ends).
    let mut items: Vec<SourceItem> = Vec::new();
    let mut position = None;
    let mut more = true;
    for _ in 0..overlay_core::window::MAX_SOURCE_READS_PER_SCAN {
        let p = source.read(position.as_ref(), page_size)?;
        more = p.more;
        items.extend(p.items);
        if items.iter().map(|i| i.blocks.len()).sum::<usize>() > 0 || !more {
            break;
        }
        match items.last() {
            Some(last) => position = Some(last.position.clone()),
            None => {
                more = false;
                break;
            }
        }
    }
    // rows_of
    let mut rows: Vec<Block> = items
        .iter()
        .flat_map(|i| i.blocks.iter().cloned())
        .collect();
    rows.sort_by_cached_key(Block::order_key);
    let change = Change::LatestWindow {
        history_keys: rows.iter().map(Block::key).collect::<HashSet<_>>(),
        current_run: current_run.cloned(),
    };
    let (overlay, settled, revision) = settle(&change)?;
    let token = source.boundary_token();
    let oldest_cursor = match (more, items.last(), rows.first()) {
        (true, Some(item), Some(top)) => Some(match source.kind() {
            SourceKind::Codex {
                thread_id,
                generation,
            } => CodexCursor {
                thread_id,
                sidecar_cursor: Some(item.position.0.clone()),
                generation,
                source_token: token.clone(),
                seam: top.key(),
                window_revision: revision,
            }
            .encode(key),
            SourceKind::Claude { session } => ClaudeCursor {
                session,
                before: item.position.0.clone(),
                anchor: top.key(),
                revision,
            }
            .encode(key),
            _ => return Err(WindowError::InvalidParams("unknown source kind".into())),
        }),
        _ => None,
    };
    let window = TimelineWindow {
        blocks: rows,
        oldest_cursor,
        boundary_token: token,
        window_revision: revision,
        live_overlay: Some(overlay),
        anchor_row: None,
        anchor_notice: None,
        newer_cursor: None,
    };
    // check_size
    let bytes = serde_json::to_vec(&window)
        .map(|v| v.len())
        .map_err(|e| WindowError::InvalidParams(e.to_string()))?;
    if bytes > RESPONSE_CAP_BYTES {
        return Err(WindowError::TooLarge { bytes });
    }
    Ok((window, settled))
}

/// An event as the old buffer kept it.
#[derive(Debug)]
struct Stored {
    seq: u64,
    json: String,
    approval: Option<String>,
}

#[derive(Debug, Default)]
struct SessionLog {
    init: Option<Stored>,
    events: VecDeque<Stored>,
    bytes: usize,
    truncated: bool,
    next_seq: u64,
    decided: HashMap<String, bool>,
    subscribers: usize,
    idle_since: Option<u64>,
}

/// The kind of a baseline event (the old `EventKind`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BaselineKind {
    /// The session-initialization event, never trimmed.
    Init,
    /// An approval request.
    Approval(String),
    /// Anything else.
    Other,
}

/// The replay ring buffer's append path before `append` checked its text: the event
/// trusted to be one object (wrapped as `{"event":...}` when it does not look like one),
/// one lookup, a push, the trim past either cap.
#[derive(Debug)]
pub struct BaselineReplay {
    max_events: usize,
    max_bytes: usize,
    sessions: BTreeMap<SessionId, SessionLog>,
}

impl BaselineReplay {
    /// Empty buffers with these caps.
    pub fn new(max_events: usize, max_bytes: usize) -> Self {
        BaselineReplay {
            max_events,
            max_bytes,
            sessions: BTreeMap::new(),
        }
    }

    /// The old `append`: returns the event's seq.
    pub fn append(
        &mut self,
        session: &SessionId,
        kind: BaselineKind,
        json: String,
        now: u64,
    ) -> u64 {
        let json = object_form(json);
        let log = self
            .sessions
            .entry(session.clone())
            .or_insert_with(|| SessionLog {
                idle_since: Some(now),
                ..SessionLog::default()
            });
        if log.subscribers == 0 && log.idle_since.is_none() {
            log.idle_since = Some(now);
        }
        let seq = log.next_seq;
        log.next_seq = seq + 1;
        log.bytes += seq_len(seq, &json);
        let (is_init, approval) = match kind {
            BaselineKind::Init => (true, None),
            BaselineKind::Approval(id) => (false, Some(id)),
            BaselineKind::Other => (false, None),
        };
        let stored = Stored {
            seq,
            json,
            approval,
        };
        if is_init {
            if let Some(old) = log.init.replace(stored) {
                log.bytes -= seq_len(old.seq, &old.json);
            }
        } else {
            log.events.push_back(stored);
        }
        while log.events.len() > self.max_events
            || (log.bytes > self.max_bytes && !log.events.is_empty())
        {
            if let Some(old) = log.events.pop_front() {
                log.bytes -= seq_len(old.seq, &old.json);
                log.truncated = true;
                if let Some(id) = &old.approval {
                    log.decided.remove(id);
                }
            }
        }
        seq
    }

    /// `append` as it was before this change (commit `6eaa26a`): the text checked by
    /// serde_json's parser (the private `previous_check` module), then the same push and trim.
    ///
    /// # Errors
    ///
    /// The refusal, as `ReplayBuffers::append` gave it; nothing is stored.
    pub fn append_checked(
        &mut self,
        session: &SessionId,
        kind: BaselineKind,
        json: String,
        now: u64,
    ) -> Result<u64, AppendError> {
        let json = previous_check::checked_event(json)?;
        Ok(self.append(session, kind, json, now))
    }

    /// Exact serialized bytes of the events kept (init included).
    pub fn bytes(&self, session: &SessionId) -> usize {
        self.sessions.get(session).map_or(0, |l| l.bytes)
    }

    /// The stored text of event `seq` (without its `seq`), while it is kept.
    pub fn stored_json(&self, session: &SessionId, seq: u64) -> Option<&str> {
        let log = self.sessions.get(session)?;
        log.init
            .iter()
            .chain(log.events.iter())
            .find(|e| e.seq == seq)
            .map(|e| e.json.as_str())
    }
}

/// `ReplayBuffers::append`'s check as it was before this change (commit `6eaa26a`),
/// copied: one pass of serde_json's parser with a visitor that builds nothing.
mod previous_check {
    use std::cell::Cell;
    use std::fmt;

    use overlay_core::replay::{AppendError, EventProblem, MAX_EVENT_DEPTH};
    use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

    /// JSON whitespace (RFC 8259): narrower than [`char::is_whitespace`].
    fn is_json_space(c: char) -> bool {
        matches!(c, ' ' | '\t' | '\n' | '\r')
    }

    /// The event text if it is exactly one JSON object a replay can carry, with the JSON
    /// whitespace around it removed in place.
    pub(super) fn checked_event(mut json: String) -> Result<String, AppendError> {
        if let Err(problem) = check_object(&json) {
            return Err(AppendError::InvalidEvent { problem, json });
        }
        let end = json.trim_end_matches(is_json_space).len();
        json.truncate(end);
        let start = json.len() - json.trim_start_matches(is_json_space).len();
        if start > 0 {
            json.drain(..start);
        }
        Ok(json)
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
}

/// The old `object_form`: objects kept as they are; anything else wrapped.
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

/// The size of `json` with `"seq":N` put first.
fn seq_len(seq: u64, json: &str) -> usize {
    let inner = json.get(1..json.len().saturating_sub(1)).unwrap_or("");
    if inner.trim().is_empty() {
        8 + digits(seq)
    } else {
        json.len() + 7 + digits(seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use overlay_core::replay::{EventKind, ReplayBuffers, ReplayConfig};
    use overlay_core::source::MemorySource;
    use overlay_core::store::RowClass;
    use overlay_core::window::{latest_window, Target};
    use timeline_core::cursor::BoundaryToken;
    use timeline_core::key::{BlockKey, BlockType};
    use timeline_core::order::SourceOrder;
    use timeline_core::time::Millis;

    fn row(id: String, t: u64) -> Block {
        Block::new(
            BlockKey::parse(BlockType::AgentReply, &id).unwrap(),
            Millis(t),
        )
        .with_data(serde_json::json!({ "text": "streaming reply text" }))
    }

    #[test]
    fn the_baseline_window_is_todays_window() {
        let session = SessionId::new("s").unwrap();
        let target = TargetId::main(&session);
        let run = RunId::new("run-1").unwrap();
        let mut live: Vec<StoredBlock> = (0..30)
            .map(|i| StoredBlock {
                block: row(format!("live-{i}"), 1_000 + i).with_source_order(SourceOrder::live(i)),
                class: RowClass::Ordinary,
                run_id: Some(run.clone()),
            })
            .collect();
        // Two rows the page settles, and a status row of another run that the window
        // drops: both builders write.
        live.push(StoredBlock {
            block: row("h-3".into(), 3).with_source_order(SourceOrder::live(90)),
            class: RowClass::Ordinary,
            run_id: Some(run.clone()),
        });
        live.push(StoredBlock {
            block: Block::new(
                BlockKey::parse(BlockType::Thinking, "thinking-old").unwrap(),
                Millis(5),
            ),
            class: RowClass::Status,
            run_id: Some(RunId::new("run-0").unwrap()),
        });
        let mut store = MemoryOverlayStore::new();
        write(
            &mut store,
            &session,
            &target,
            &Change::Publish(live.clone()),
        )
        .unwrap();
        let mut previous = store.clone();
        let mut reference = BaselineOverlayStore::new();
        let (_, written) = reference
            .write(&session, &target, &Change::Publish(live))
            .unwrap();
        assert!(written.is_some());
        let mut source = MemorySource::new(
            SourceKind::Claude {
                session: "c".into(),
            },
            BoundaryToken::claude("c"),
        );
        for i in 0..50u64 {
            source.push(vec![
                row(format!("h-{i}"), i).with_source_order(SourceOrder::history(i, 0))
            ]);
        }
        let key = HostKey::from_bytes([1; 32]);
        let t = Target {
            session: &session,
            target: &target,
            current_run: Some(&run),
        };
        for round in 0..2 {
            let new = latest_window(&mut store, &mut source, &key, t, 20).unwrap();
            let (old, settled) = baseline_latest_window(
                &mut reference,
                &mut source,
                &key,
                &session,
                &target,
                Some(&run),
                20,
            )
            .unwrap();
            let (before, before_settled) = previous_latest_window(
                &mut previous,
                &mut source,
                &key,
                &session,
                &target,
                Some(&run),
                20,
            )
            .unwrap();
            assert_eq!(new.window, old, "round {round}");
            assert_eq!(new.settled, settled, "round {round}");
            assert_eq!(before, old, "round {round}");
            assert_eq!(before_settled, settled, "round {round}");
            assert_eq!(settled.is_some(), round == 0);
        }
    }

    #[test]
    fn the_baseline_append_stores_what_append_stores() {
        let s = SessionId::new("s").unwrap();
        let mut new = ReplayBuffers::new(ReplayConfig {
            max_events: 3,
            ..ReplayConfig::default()
        });
        let mut old = BaselineReplay::new(3, ReplayConfig::default().max_bytes);
        let texts = [
            r#"{"type":"session_init"}"#,
            r#"  {"type":"a","text":"x"}"#,
            r#"{}"#,
            r#"{"type":"b"}  "#,
            r#"{"type":"c","n":[1,2,{"d":null}]}"#,
        ];
        let mut checked = BaselineReplay::new(3, ReplayConfig::default().max_bytes);
        for (i, text) in texts.iter().enumerate() {
            let (kind, old_kind) = if i == 0 {
                (EventKind::Init, BaselineKind::Init)
            } else {
                (EventKind::Other, BaselineKind::Other)
            };
            let seq = new.append(&s, kind, (*text).into(), Millis(0)).unwrap();
            assert_eq!(old.append(&s, old_kind.clone(), (*text).into(), 0), seq);
            assert_eq!(
                checked.append_checked(&s, old_kind, (*text).into(), 0),
                Ok(seq)
            );
            let old_json = old.stored_json(&s, seq).unwrap();
            let expected = match old_json.strip_prefix('{') {
                Some("}") => format!(r#"{{"seq":{seq}}}"#),
                Some(rest) => format!(r#"{{"seq":{seq},{rest}"#),
                None => unreachable!("stored events are objects"),
            };
            assert_eq!(new.event(&s, seq).unwrap(), expected);
            assert_eq!(new.bytes(&s), old.bytes(&s));
        }
        assert_eq!(new.bytes(&s), old.bytes(&s));
        assert_eq!(checked.bytes(&s), old.bytes(&s));
        for refused in [
            r#"{"a":1}{"b":2}"#,
            "[1]",
            r#"{"seq":1}"#,
            r#"{"n":1e400}"#,
            "",
        ] {
            let new = new.append(&s, EventKind::Other, refused.into(), Millis(0));
            let old = checked.append_checked(&s, BaselineKind::Other, refused.into(), 0);
            assert!(new.is_err());
            assert_eq!(new, old, "{refused:?}");
        }
    }
}
