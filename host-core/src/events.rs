//! The session event log (PK-06): each session's logical events since this host began
//! serving it, from which `session.page` cuts pages and packs them (PK-01, PK-02).
//!
//! The agent's streamed fragments ([`crate::AgentInput::Delta`]) are logged in order,
//! each with the session's next sequence number (from 1). Runs are not logged: their
//! starts and ends reach clients as run events, as before.
//! Live they go out one by one, scalar ([`overlay_core::live::Payload::SessionEvent`]);
//! a page ([`crate::ClientRequest::SessionPage`]) is chosen over the logical events at
//! message boundaries and only then packed, so a long reply is a few chunk rows rather
//! than one record per token.
//!
//! The log is memory only and bounded twice: past [`HostConfig::session_log_bytes`] of
//! one session the oldest events go, whole messages at a time, and a page says where the
//! log now starts; past [`HostConfig::session_logs_bytes`] of every session together,
//! the log appended to longest ago goes whole. The bytes counted are an event's text,
//! IDs and type plus its fixed size; allocator overhead is not counted, so the memory
//! held may pass the bound by about half. A session let go, and one whose history was
//! rewritten (a rollback), loses its log: its next page starts a new one. A restarted host starts new logs with new IDs ([`SessionPage::log_id`]),
//! so a client never joins the sequence numbers of two logs. What a restart keeps is the
//! agent's own history, read as rows.
//!
//! [`HostConfig::session_log_bytes`]: crate::HostConfig::session_log_bytes
//! [`HostConfig::session_logs_bytes`]: crate::HostConfig::session_logs_bytes

use std::collections::{BTreeMap, HashMap};

use timeline_core::history::{pack, DeltaKind, RowError, SessionEvent, SessionHistoryRecord};
use timeline_core::SessionId;

/// The default bound of one session's log: the text, IDs and bookkeeping of its events.
pub const SESSION_LOG_BYTES: usize = 32 * 1024 * 1024;

/// The default bound of every session's log together.
pub const SESSION_LOGS_BYTES: usize = 256 * 1024 * 1024;

/// The most logical events one page request may ask for.
pub const MAX_PAGE_EVENTS: usize = 500_000;

/// One page of a session's log ([`crate::Reply::SessionPage`]).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct SessionPage {
    /// The log the sequence numbers belong to (`None`: the session has no log now). A
    /// new log starts after a restart, a scope let go, a history rewrite, or the log
    /// dropped past the bound of all logs.
    pub log_id: Option<String>,
    /// The records, oldest first: events and packed chunk rows.
    pub records: Vec<SessionHistoryRecord>,
    /// An older page can be asked for (`beforeSeq`: the first record's `seq`).
    pub has_older: bool,
    /// The oldest sequence number the log still holds; older events were dropped past
    /// the log's bound.
    pub first_seq: u64,
    /// The sequence number the next logged event will have: live events from here on
    /// follow this page.
    pub next_seq: u64,
}

/// The logs of every session.
#[derive(Debug)]
pub(crate) struct SessionLogs {
    limit: usize,
    total_limit: usize,
    total: usize,
    /// Appends so far: orders the logs by their last append.
    clock: u64,
    logs: HashMap<SessionId, Log>,
    /// Each log by its last append, oldest first.
    by_last: BTreeMap<u64, SessionId>,
}

#[derive(Debug)]
struct Log {
    id: String,
    /// When it was appended to last ([`SessionLogs::clock`]).
    last: u64,
    /// The sequence number of `events[0]` (or the next one, when empty).
    first_seq: u64,
    events: Vec<SessionEvent>,
    bytes: usize,
}

/// What one event costs the log.
fn cost(e: &SessionEvent) -> usize {
    std::mem::size_of::<SessionEvent>()
        + e.kind.len()
        + e.session_id.len()
        + e.turn_id.as_ref().map_or(0, String::len)
        + e.block.as_ref().map_or(0, String::len)
        + e.text.as_ref().map_or(0, String::len)
        + if e.data.is_null() {
            0
        } else {
            e.data.to_string().len()
        }
}

impl SessionLogs {
    pub(crate) fn new(limit: usize, total_limit: usize) -> Self {
        SessionLogs {
            // One log alone never passes the bound of them all.
            limit: limit.min(total_limit),
            total_limit,
            total: 0,
            clock: 0,
            logs: HashMap::new(),
            by_last: BTreeMap::new(),
        }
    }

    /// Drops the session's log.
    pub(crate) fn forget(&mut self, session: &SessionId) {
        if let Some(log) = self.logs.remove(session) {
            self.total -= log.bytes;
            self.by_last.remove(&log.last);
        }
    }

    /// Logs a fragment; `log_id` names a new log when the session has none. Returns the
    /// event as logged.
    pub(crate) fn delta(
        &mut self,
        session: &SessionId,
        fragment: Fragment,
        now: u64,
        log_id: impl FnOnce() -> String,
    ) -> SessionEvent {
        let mut e = SessionEvent::delta(
            0,
            now,
            session.as_str(),
            fragment.kind,
            &fragment.block,
            &fragment.text,
        );
        e.turn_id = fragment.turn;
        self.append(session, e, log_id)
    }

    /// The ID of the session's log.
    pub(crate) fn id(&self, session: &SessionId) -> Option<&str> {
        self.logs.get(session).map(|l| l.id.as_str())
    }

    fn append(
        &mut self,
        session: &SessionId,
        mut e: SessionEvent,
        log_id: impl FnOnce() -> String,
    ) -> SessionEvent {
        self.clock += 1;
        let log = self.logs.entry(session.clone()).or_insert_with(|| Log {
            id: log_id(),
            last: 0,
            first_seq: 1,
            events: Vec::new(),
            bytes: 0,
        });
        self.by_last.remove(&log.last);
        log.last = self.clock;
        self.by_last.insert(log.last, session.clone());
        e.seq = log.first_seq.saturating_add(log.events.len() as u64);
        let before = log.bytes;
        log.bytes += cost(&e);
        log.events.push(e.clone());
        if log.bytes > self.limit {
            log.trim(self.limit / 4 * 3);
            if log.bytes < log.events.capacity() / 4 * std::mem::size_of::<SessionEvent>() {
                log.events.shrink_to_fit();
            }
        }
        self.total = self.total - before + log.bytes;
        while self.total > self.total_limit {
            // The log appended to longest ago goes whole (never the one just appended
            // to: its own bound, at most the total's, keeps it under).
            let Some(oldest) = self.by_last.values().find(|s| *s != session).cloned() else {
                break;
            };
            self.forget(&oldest);
        }
        e
    }

    /// A page of at most about `max_events` events ending before the event `before`
    /// (`None`: the newest), widened back to the start of the message it would cut.
    pub(crate) fn page(
        &self,
        session: &SessionId,
        before: Option<u64>,
        max_events: usize,
    ) -> Result<SessionPage, RowError> {
        let Some(log) = self.logs.get(session) else {
            return Ok(SessionPage {
                log_id: None,
                records: Vec::new(),
                has_older: false,
                first_seq: 1,
                next_seq: 1,
            });
        };
        let before = before
            .map(|seq| usize::try_from(seq.saturating_sub(log.first_seq)).unwrap_or(usize::MAX));
        let range = timeline_core::history::select_page(&log.events, before, max_events);
        let has_older = range.start > 0;
        let records = pack(log.events.get(range).unwrap_or_default())?;
        Ok(SessionPage {
            log_id: Some(log.id.clone()),
            records,
            has_older,
            first_seq: log.first_seq,
            next_seq: log.first_seq.saturating_add(log.events.len() as u64),
        })
    }
}

impl Log {
    /// Drops the oldest events until at most `to` bytes are held, and then the rest of
    /// the message the cut fell in, so the log starts at a message.
    fn trim(&mut self, to: usize) {
        let mut cut = 0;
        let mut bytes = self.bytes;
        while bytes > to && cut < self.events.len() {
            bytes -= self.events.get(cut).map_or(0, cost);
            cut += 1;
        }
        let block_of = |e: &SessionEvent| e.as_delta().map(|(k, b, _)| (k, b.to_owned()));
        if let Some(last) = cut.checked_sub(1).and_then(|i| self.events.get(i)) {
            if let Some(open) = block_of(last) {
                let (mut whole, mut whole_bytes) = (cut, bytes);
                while self
                    .events
                    .get(whole)
                    .is_some_and(|e| block_of(e).as_ref() == Some(&open))
                {
                    whole_bytes -= self.events.get(whole).map_or(0, cost);
                    whole += 1;
                }
                // A message larger than the bound is still streaming: the log keeps
                // its newest part rather than nothing.
                if whole < self.events.len() {
                    (cut, bytes) = (whole, whole_bytes);
                }
            }
        }
        self.events.drain(..cut);
        self.first_seq = self.first_seq.saturating_add(cut as u64);
        self.bytes = bytes;
    }
}

/// One streamed fragment of the agent's output, before the host numbers it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Fragment {
    /// Text, reasoning or a tool call's input.
    pub kind: DeltaKind,
    /// The block it belongs to (Codex: the item; Claude: the message, or the tool use).
    pub block: String,
    /// The fragment.
    pub text: String,
    /// The agent's turn, when it names one.
    pub turn: Option<String>,
}

impl Fragment {
    /// A fragment of `block`.
    pub fn new(kind: DeltaKind, block: impl Into<String>, text: impl Into<String>) -> Self {
        Fragment {
            kind,
            block: block.into(),
            text: text.into(),
            turn: None,
        }
    }

    /// Names the agent's turn.
    #[must_use]
    pub fn turn(mut self, turn: impl Into<String>) -> Self {
        self.turn = Some(turn.into());
        self
    }

    /// The fragment of a delta event an agent's projector built (its own `seq` and
    /// `time` are not kept: the host numbers and times what it logs). `None` for an
    /// event that is not a delta.
    pub fn of_event(e: SessionEvent) -> Option<Self> {
        let kind = DeltaKind::of_event_type(&e.kind)?;
        Some(Fragment {
            kind,
            block: e.block?,
            text: e.text?,
            turn: e.turn_id,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use timeline_core::history::unpack_records;

    fn s() -> SessionId {
        SessionId::new("s1").unwrap()
    }

    fn id() -> String {
        "log-1".to_owned()
    }

    /// What the log counts for one fragment `x` of block `m1`.
    fn one_fragment() -> usize {
        cost(&SessionEvent::delta(1, 0, "s1", DeltaKind::Text, "m1", "x"))
    }

    // PK-01, PK-02: a page is chosen over logical events and packed: a reply's fragments
    // are one row, and unpacking gives back every event with its sequence number.
    #[test]
    fn a_page_packs_a_reply_into_one_row_and_unpacks_to_every_event() {
        let mut logs = SessionLogs::new(SESSION_LOG_BYTES, SESSION_LOGS_BYTES);
        for (i, t) in ["Hel", "lo", " wörld"].iter().enumerate() {
            let e = logs.delta(
                &s(),
                Fragment::new(DeltaKind::Text, "m1", *t),
                10 + i as u64,
                id,
            );
            assert_eq!(e.seq, i as u64 + 1);
        }
        logs.delta(
            &s(),
            Fragment::new(DeltaKind::Reasoning, "m2", "hm"),
            20,
            id,
        );
        let page = logs.page(&s(), None, 100).unwrap();
        assert_eq!(page.records.len(), 2, "one row per block");
        let events = unpack_records(&page.records).unwrap();
        assert_eq!(
            events.iter().map(|e| e.seq).collect::<Vec<_>>(),
            [1, 2, 3, 4]
        );
        assert_eq!(events[2].text.as_deref(), Some(" wörld"));
        assert_eq!(events[2].time, 12);
        assert_eq!(
            (page.first_seq, page.next_seq, page.has_older),
            (1, 5, false)
        );
        assert_eq!(page.log_id.as_deref(), Some("log-1"));
    }

    // PK-02: a page that would cut a message starts at the message, and the older page
    // ends right before it.
    #[test]
    fn pages_are_cut_at_message_starts() {
        let mut logs = SessionLogs::new(SESSION_LOG_BYTES, SESSION_LOGS_BYTES);
        for i in 0..4 {
            logs.delta(&s(), Fragment::new(DeltaKind::Text, "m1", "a"), i, id);
        }
        for i in 0..4 {
            logs.delta(&s(), Fragment::new(DeltaKind::Text, "m2", "b"), i, id);
        }
        let newest = logs.page(&s(), None, 2).unwrap();
        let events = unpack_records(&newest.records).unwrap();
        assert_eq!(
            events.first().map(|e| e.seq),
            Some(5),
            "m2 whole, from seq 5"
        );
        assert!(newest.has_older);
        let older = logs.page(&s(), Some(5), 2).unwrap();
        let events = unpack_records(&older.records).unwrap();
        assert_eq!(
            events.iter().map(|e| e.seq).collect::<Vec<_>>(),
            [1, 2, 3, 4]
        );
        assert!(!older.has_older);
    }

    // PK-06: the log is bounded: past its bytes the oldest whole messages go, and the page
    // says where the log starts.
    #[test]
    fn the_log_drops_its_oldest_messages_past_its_bound() {
        let one = one_fragment();
        let mut logs = SessionLogs::new(one * 10, SESSION_LOGS_BYTES);
        for i in 0..10 {
            logs.delta(&s(), Fragment::new(DeltaKind::Text, "m1", "x"), i, id);
        }
        let page = logs.page(&s(), None, 100).unwrap();
        assert_eq!(page.first_seq, 1, "at the bound, nothing goes");
        logs.delta(&s(), Fragment::new(DeltaKind::Text, "m2", "x"), 11, id);
        logs.delta(&s(), Fragment::new(DeltaKind::Text, "m2", "x"), 12, id);
        let page = logs.page(&s(), None, 100).unwrap();
        // One past the bound trims to three quarters, and m1's rest goes with it.
        assert_eq!((page.first_seq, page.next_seq), (11, 13));
        let events = unpack_records(&page.records).unwrap();
        assert!(events.iter().all(|e| e.block.as_deref() == Some("m2")));
    }

    // A single message past the bound keeps its newest part.
    #[test]
    fn a_message_larger_than_the_bound_keeps_its_newest_part() {
        let one = one_fragment();
        let mut logs = SessionLogs::new(one * 10, SESSION_LOGS_BYTES);
        for i in 0..11 {
            logs.delta(&s(), Fragment::new(DeltaKind::Text, "m1", "x"), i, id);
        }
        let page = logs.page(&s(), None, 100).unwrap();
        assert_eq!((page.first_seq, page.next_seq), (5, 12));
        assert_eq!(unpack_records(&page.records).unwrap().len(), 7);
    }

    // PK-06: every session's logs together are bounded: past it the log appended to
    // longest ago goes whole, and forgetting a log gives its bytes back.
    #[test]
    fn the_logs_together_are_bounded_and_the_oldest_goes_whole() {
        let one = one_fragment();
        let mut logs = SessionLogs::new(one * 100, one * 10);
        let sid = |n: u32| SessionId::new(format!("s{n}")).unwrap();
        for n in 1..=5 {
            for _ in 0..2 {
                logs.delta(&sid(n), Fragment::new(DeltaKind::Text, "m1", "x"), 1, id);
            }
        }
        assert_eq!(logs.total, one * 10, "at the bound, nothing goes");
        logs.delta(&sid(6), Fragment::new(DeltaKind::Text, "m1", "x"), 1, id);
        assert!(logs.total <= one * 10);
        assert_eq!(
            logs.page(&sid(1), None, 10).unwrap().log_id,
            None,
            "s1 went whole"
        );
        assert!(logs.page(&sid(2), None, 10).unwrap().log_id.is_some());
        logs.forget(&sid(2));
        assert_eq!(logs.total, one * 7);
        // One log alone never passes the bound of all of them.
        let mut alone = SessionLogs::new(one * 100, one * 10);
        for _ in 0..50 {
            alone.delta(&sid(1), Fragment::new(DeltaKind::Text, "m1", "x"), 1, id);
            assert!(alone.total <= one * 10);
        }
    }

    #[test]
    fn a_session_with_no_log_pages_empty() {
        let logs = SessionLogs::new(SESSION_LOG_BYTES, SESSION_LOGS_BYTES);
        let page = logs.page(&s(), None, 10).unwrap();
        assert_eq!(page.log_id, None);
        assert!(page.records.is_empty());
        assert_eq!(page.next_seq, 1);
    }
}
