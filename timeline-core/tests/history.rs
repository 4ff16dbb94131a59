//! Packed history transport (PK-01 to PK-05).
#![allow(clippy::unwrap_used)]

use fixtures::history::{
    claude_delta, codex_delta, convert_sample, event_stream, synthetic_tail_page, CLAUDE_SAMPLE,
    CODEX_SAMPLE, SEED_LOGICAL_EVENTS, SEED_RECORDS, SEED_ROWS,
};
use proptest::prelude::*;
use timeline_core::history::{
    pack, select_page, unpack, unpack_records, validate_row, write_packed_page, AssistantFold,
    DeltaKind, HistoryPage, Journal, JournalOutcome, RowError, SessionEvent, SessionHistoryRecord,
    Side,
};

fn rows(records: &[SessionHistoryRecord]) -> usize {
    records
        .iter()
        .filter(|r| matches!(r, SessionHistoryRecord::Chunks(_)))
        .count()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fixtures::proptest_cases()))]

    // PK-01: pack then unpack is the identity (seq, time, block, fragment), empty
    // fragments, multi-byte text, huge gaps and runs of one included.
    #[test]
    fn unpacking_a_packed_page_gives_back_every_event(events in event_stream()) {
        let records = pack(&events).unwrap();
        prop_assert_eq!(unpack_records(&records).unwrap(), events.clone());
        // Through JSON too, and the direct writer writes exactly what serde writes.
        let page = HistoryPage { records: records.clone() };
        let via_serde = serde_json::to_vec(&page).unwrap();
        let mut direct = Vec::new();
        write_packed_page(&events, &mut direct).unwrap();
        prop_assert_eq!(String::from_utf8(direct.clone()).unwrap(), String::from_utf8(via_serde).unwrap());
        let back: HistoryPage = serde_json::from_slice(&direct).unwrap();
        prop_assert_eq!(unpack_records(&back.records).unwrap(), events);
    }

    // PK-04: folding scalar deltas and packed rows reaches the same state, and one row
    // is one entry.
    #[test]
    fn scalar_and_packed_folds_agree(events in event_stream()) {
        let mut scalar = AssistantFold::new();
        for e in &events { scalar.fold_event(e); }
        let records = pack(&events).unwrap();
        let mut packed = AssistantFold::new();
        for r in &records { packed.fold_record(r).unwrap(); }
        prop_assert_eq!(packed.entries, records.len() as u64);
        packed.entries = scalar.entries;
        prop_assert_eq!(packed, scalar);
    }

    // PK-03: for any cut into pages and live events, delivered with duplicates,
    // overlaps and reordering, the journal publishes exactly the stream once, in order,
    // or answers a typed outcome.
    #[test]
    fn the_journal_publishes_the_stream_once_in_order_or_says_why_not(
        events in event_stream(),
        cuts in prop::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>()), 1..12),
        live in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
        order in prop::collection::vec(any::<prop::sample::Index>(), 0..30),
    ) {
        prop_assume!(!events.is_empty());
        let n = events.len();
        // Deliveries: pages of random slices (each packed on its own) and live events.
        enum D { Page(Vec<SessionHistoryRecord>), Live(SessionEvent) }
        let mut deliveries: Vec<D> = Vec::new();
        for (a, b) in cuts {
            let (x, y) = (a.index(n), b.index(n));
            let (lo, hi) = (x.min(y), x.max(y) + 1);
            deliveries.push(D::Page(pack(&events[lo..hi]).unwrap()));
        }
        for l in live { deliveries.push(D::Live(events[l.index(n)].clone())); }
        let mut journal = Journal::new();
        let mut published: std::collections::VecDeque<SessionEvent> = Default::default();
        let picks: Vec<usize> = if order.is_empty() { (0..deliveries.len()).collect() } else { order.iter().map(|i| i.index(deliveries.len())).collect() };
        for i in picks {
            let outcome = match &deliveries[i] {
                D::Page(records) => journal.accept_page(records),
                D::Live(e) => journal.accept_live(e),
            };
            if let JournalOutcome::Published { side, records } = outcome {
                let got = unpack_records(&records).unwrap();
                match side {
                    Side::Newer => published.extend(got),
                    Side::Older => for e in got.into_iter().rev() { published.push_front(e) },
                }
            }
            // What is published is exactly a contiguous slice of the stream.
            let published_vec: Vec<_> = published.iter().cloned().collect();
            if let Some(first) = published_vec.first() {
                let start = (first.seq - 1) as usize;
                prop_assert_eq!(&published_vec[..], &events[start..start + published_vec.len()]);
                let span = journal.span().unwrap();
                prop_assert_eq!((*span.start(), *span.end()), (first.seq, published_vec.last().unwrap().seq));
            }
        }
    }
}

// PK-01: the wire shape.
#[test]
fn records_have_the_seed_wire_shape() {
    let events: Vec<SessionEvent> = ["a", "bc"]
        .iter()
        .enumerate()
        .map(|(i, t)| {
            SessionEvent::delta(
                7 + i as u64,
                100 + 5 * i as u64,
                "s",
                DeltaKind::Reasoning,
                "r1",
                t,
            )
        })
        .chain([SessionEvent::other(
            9,
            200,
            "s",
            "tool/result",
            serde_json::json!({"ok": true}),
        )])
        .collect();
    let json = serde_json::to_value(HistoryPage {
        records: pack(&events).unwrap(),
    })
    .unwrap();
    assert_eq!(
        json,
        serde_json::json!({"records": [
            {"type": "chunks", "event": {"type": "chunkrow/reasoning-chunks", "seq": 7, "time": 100, "sessionId": "s",
                "data": {"block": "r1", "text": "abc", "lengths": [1, 2], "gaps": [5]}}},
            {"type": "event", "event": {"seq": 9, "time": 200, "type": "tool/result", "sessionId": "s", "data": {"ok": true}}}
        ]})
    );
}

// PK-01: unknown record types from a newer peer are skipped; key order does not matter.
#[test]
fn unknown_record_types_are_skipped() {
    let json = r#"{"records":[
        {"type":"event","event":{"seq":1,"time":1,"type":"x","sessionId":"s"}},
        {"type":"summary-v2","event":{"anything":[1,2,3]},"extra":true},
        {"event":{"seq":2,"time":2,"type":"y","sessionId":"s"},"type":"event"}
    ]}"#;
    let page: HistoryPage = serde_json::from_str(json).unwrap();
    assert_eq!(page.records.len(), 3);
    assert_eq!(page.records[1], SessionHistoryRecord::Unknown);
    assert_eq!(unpack_records(&page.records).unwrap().len(), 2);
    assert!(
        serde_json::from_str::<HistoryPage>(r#"{"records":[{"event":{}}]}"#).is_err(),
        "a record without a type is malformed"
    );
}

// PK-01: a row that does not decode is a typed error, never a panic or a guess.
#[test]
fn malformed_rows_are_typed_errors() {
    let events: Vec<SessionEvent> = ["é", "ab"]
        .iter()
        .enumerate()
        .map(|(i, t)| SessionEvent::delta(1 + i as u64, 1, "s", DeltaKind::Text, "b", t))
        .collect();
    let SessionHistoryRecord::Chunks(row) = pack(&events).unwrap().remove(0) else {
        panic!()
    };
    let mut cut_char = row.clone();
    cut_char.data.lengths = vec![1, 3];
    assert_eq!(validate_row(&cut_char), Err(RowError::Lengths));
    let mut short = row.clone();
    short.data.lengths = vec![2];
    assert_eq!(validate_row(&short), Err(RowError::Shape));
    let mut kind = row.clone();
    kind.kind = "chunkrow/image-chunks".into();
    assert!(matches!(unpack(&kind), Err(RowError::UnknownKind(_))));
    let mut before_zero = row.clone();
    before_zero.time = 0;
    before_zero.data.gaps = vec![-1];
    assert_eq!(validate_row(&before_zero), Err(RowError::Time));
    assert_eq!(unpack(&row).unwrap(), events);
}

// PK-02: a page is chosen from logical events, aligned to a message, then packed.
#[test]
fn pages_are_chosen_from_logical_events_at_message_boundaries() {
    let mut events = Vec::new();
    for i in 0..10u64 {
        events.push(SessionEvent::delta(
            i + 1,
            i,
            "s",
            DeltaKind::Text,
            "m1",
            "x",
        ));
    }
    events.push(SessionEvent::other(
        11,
        20,
        "s",
        "tool/result",
        serde_json::Value::Null,
    ));
    for i in 0..10u64 {
        events.push(SessionEvent::delta(
            12 + i,
            30 + i,
            "s",
            DeltaKind::Text,
            "m2",
            "y",
        ));
    }
    // A page of 15 would start inside m1's run: it moves back to m1's first delta.
    assert_eq!(select_page(&events, None, 15), 0..21);
    assert_eq!(select_page(&events, None, 10), 11..21, "exactly m2");
    assert_eq!(select_page(&events, Some(11), 3), 0..11);
    let page = &events[select_page(&events, None, 15)];
    assert_eq!(pack(page).unwrap().len(), 3);
    // A page of no events is empty wherever it ends, and cuts nothing (found by the
    // `history` fuzz target: it used to index one past the end).
    assert_eq!(select_page(&events, None, 0), 21..21);
    assert_eq!(select_page(&events, Some(15), 0), 15..15);
    assert_eq!(select_page(&events, Some(99), 0), 21..21);
    assert_eq!(select_page(&[], None, 0), 0..0);
}

// PK-03: each outcome, by name.
#[test]
fn journal_outcomes() {
    let events: Vec<SessionEvent> = (1..=20u64)
        .map(|i| {
            if i % 7 == 0 {
                SessionEvent::other(i, i, "s", "tool/result", serde_json::Value::Null)
            } else {
                SessionEvent::delta(i, i, "s", DeltaKind::Text, &format!("b{}", i / 7), "t")
            }
        })
        .collect();
    let page = |a: usize, b: usize| pack(&events[a..b]).unwrap();
    let mut j = Journal::new();
    assert!(matches!(
        j.accept_page(&page(10, 14)),
        JournalOutcome::Published {
            side: Side::Newer,
            ..
        }
    ));
    // Pagination join: the older page ends right below.
    assert!(matches!(
        j.accept_page(&page(5, 10)),
        JournalOutcome::Published {
            side: Side::Older,
            ..
        }
    ));
    // An older page that does not reach the span: a gap.
    assert_eq!(
        j.accept_page(&page(0, 3)),
        JournalOutcome::Gap { missing: 4..=5 }
    );
    // A complete duplicate.
    assert_eq!(j.accept_page(&page(6, 12)), JournalOutcome::Duplicate);
    // Reconnect repair: overlapping records are skipped, the rest published.
    let JournalOutcome::Published {
        side: Side::Newer,
        records,
    } = j.accept_page(&page(12, 18))
    else {
        panic!()
    };
    assert_eq!(unpack_records(&records).unwrap().first().unwrap().seq, 15);
    // A row across the published end is a partial overlap, not split silently.
    let mut straddle_run: Vec<SessionEvent> = (15..=19u64)
        .map(|i| SessionEvent::delta(i, i, "s", DeltaKind::Text, "same", "x"))
        .collect();
    straddle_run.truncate(5);
    assert_eq!(
        j.accept_page(&pack(&straddle_run).unwrap()),
        JournalOutcome::PartialOverlap { record: 15..=19 }
    );
    // Live dedup and gaps.
    assert_eq!(j.accept_live(&events[10]), JournalOutcome::Duplicate);
    assert_eq!(
        j.accept_live(&events[19]),
        JournalOutcome::Gap { missing: 19..=19 }
    );
    assert!(matches!(
        j.accept_live(&events[18]),
        JournalOutcome::Published { .. }
    ));
    // A page that is not continuous in itself.
    let mut broken = page(0, 3);
    broken.extend(page(4, 5));
    assert_eq!(
        Journal::new().accept_page(&broken),
        JournalOutcome::BrokenPage { at: 5 }
    );
    // A page reaching below the span and into it.
    assert_eq!(
        j.accept_page(&page(2, 8)),
        JournalOutcome::Straddling { page: 3..=8 }
    );
    assert_eq!(j.span(), Some(6..=19));
}

// PK-04: real delta shapes (Codex app-server, Claude stream-json), converted, packed and
// folded both ways.
#[test]
fn real_delta_shapes_fold_the_same_scalar_and_packed() {
    let codex = convert_sample(CODEX_SAMPLE, |v, seq| codex_delta(v, seq, "codex-session"));
    let claude = convert_sample(CLAUDE_SAMPLE, |v, seq| {
        claude_delta(v, seq, 1_000 + seq, "msg_1")
    });
    for (events, expect_blocks) in [
        (
            codex,
            vec![
                ("msg_a", "I\u{2019}ll run them."),
                ("rs_a", "Checking the tests"),
            ],
        ),
        (
            claude,
            vec![
                ("msg_1:0", "The user wants a ping."),
                ("msg_1:1", "pong"),
                ("msg_1:2", "{\"command\": \"ls -la\"}"),
            ],
        ),
    ] {
        let mut scalar = AssistantFold::new();
        for e in &events {
            scalar.fold_event(e);
        }
        let records = pack(&events).unwrap();
        assert!(rows(&records) >= 2);
        let mut packed = AssistantFold::new();
        for r in &records {
            packed.fold_record(r).unwrap();
        }
        assert_eq!(packed.entries as usize, records.len());
        assert!(packed.entries < scalar.entries);
        packed.entries = scalar.entries;
        assert_eq!(packed, scalar);
        for (block, text) in expect_blocks {
            assert_eq!(scalar.blocks[block].text, text);
        }
        assert_eq!(unpack_records(&records).unwrap(), events);
    }
}

// PK-05: the synthetic page has the seed's cardinalities.
#[test]
fn the_synthetic_tail_page_has_the_seed_cardinalities() {
    let events = synthetic_tail_page(1);
    assert_eq!(events.len(), SEED_LOGICAL_EVENTS);
    let records = pack(&events).unwrap();
    assert_eq!(records.len(), SEED_RECORDS);
    assert_eq!(rows(&records), SEED_ROWS);
    let lens: Vec<usize> = events
        .iter()
        .filter_map(|e| e.text.as_deref())
        .map(|t| t.chars().count())
        .collect();
    assert!(
        lens.iter().all(|l| (1..=6).contains(l)),
        "token fragments of 1 to 6 characters"
    );
    assert_eq!(events, synthetic_tail_page(1), "deterministic");
}
