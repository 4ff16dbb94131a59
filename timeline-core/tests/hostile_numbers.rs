//! Numbers at and past the wire's exact integer range (2^53 - 1), and near `u64::MAX`,
//! through packed history (PK-01, PK-03, PK-04) and the timeline's wire answers (TL-04,
//! TL-05, TL-06, TL-07, TL-08).
//!
//! The invariant: every number a client reads is an integer in `0..=2^53 - 1`. At the
//! limit everything is accepted and round-trips; one past it, and anywhere up to
//! `u64::MAX`, the answer is a typed error, never a panic, a wrap or a lossy round trip.
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use timeline_core::block::Block;
use timeline_core::history::{
    pack, unpack, unpack_records, validate_row, write_packed_page, AssistantFold, ChunkData,
    ChunkRowEvent, DeltaKind, HistoryPage, Journal, JournalOutcome, PackError, RowError,
    SessionEvent, SessionHistoryRecord, Side,
};
use timeline_core::key::{BlockKey, BlockType};
use timeline_core::order::SourceOrder;
use timeline_core::policy::MAX_EXACT_INTEGER;
use timeline_core::time::Millis;
use timeline_core::wire::{
    LiveOverlay, OlderPage, OutOfRange, ResponseError, TimelineWindow, WireInt,
};

/// 2^53 - 1: the largest number on the wire.
const MAX: u64 = MAX_EXACT_INTEGER;
/// 2^53: the first number past it.
const PAST: u64 = MAX + 1;

fn delta(seq: u64, time: u64, text: &str) -> SessionEvent {
    SessionEvent::delta(seq, time, "s", DeltaKind::Text, "b", text)
}

fn row(seq: u64, time: u64, fragments: &[&str], gaps: &[i64]) -> ChunkRowEvent {
    ChunkRowEvent {
        kind: DeltaKind::Text.row_type().to_owned(),
        seq,
        time,
        session_id: "s".to_owned(),
        turn_id: None,
        data: ChunkData {
            block: "b".to_owned(),
            text: fragments.concat(),
            lengths: fragments.iter().map(|f| f.len() as u32).collect(),
            gaps: gaps.to_vec(),
        },
    }
}

/// Pack, then unpack directly and through both JSON writers: all give back `events`.
fn assert_round_trips(events: &[SessionEvent]) {
    let records = pack(events).unwrap();
    assert_eq!(unpack_records(&records).unwrap(), events);
    let via_serde = serde_json::to_string(&HistoryPage {
        records: records.clone(),
    })
    .unwrap();
    let mut direct = Vec::new();
    write_packed_page(events, &mut direct).unwrap();
    assert_eq!(String::from_utf8(direct).unwrap(), via_serde);
    let back: HistoryPage = serde_json::from_str(&via_serde).unwrap();
    assert_eq!(back.records, records);
    assert_eq!(unpack_records(&back.records).unwrap(), events);
}

// ----- the wire integer --------------------------------------------------------------

// PK-01, TL-06: the bound itself.
#[test]
fn wire_int_accepts_the_limit_and_refuses_one_past_it() {
    assert_eq!(WireInt::new(MAX).map(WireInt::get), Ok(MAX));
    assert_eq!(WireInt::MAX.get(), 9_007_199_254_740_991);
    assert_eq!(WireInt::new(PAST), Err(OutOfRange(PAST)));
    assert_eq!(WireInt::new(u64::MAX), Err(OutOfRange(u64::MAX)));
    assert_eq!(WireInt::try_from(PAST), Err(OutOfRange(PAST)));
    assert_eq!(WireInt::MAX.next(), None);
    assert_eq!(WireInt::MAX.checked_add(u64::MAX), None);
    assert_eq!(WireInt::ZERO.checked_add_signed(-1), None);
    assert_eq!(WireInt::ZERO.checked_add_signed(i64::MIN), None);
    assert_eq!(WireInt::MAX.checked_add_signed(i64::MAX), None);
    assert_eq!(
        WireInt::MAX.checked_add_signed(-(MAX as i64)),
        Some(WireInt::ZERO)
    );
    assert_eq!(WireInt::MAX.signed_diff(WireInt::ZERO), -(MAX as i64));
    assert_eq!(WireInt::ZERO.signed_diff(WireInt::MAX), MAX as i64);
    // Decoding: the limit decodes, one past it, negatives and fractions do not.
    assert_eq!(
        serde_json::from_str::<WireInt>("9007199254740991").unwrap(),
        WireInt::MAX
    );
    for bad in [
        "9007199254740992",
        "18446744073709551615",
        "18446744073709551616",
        "-1",
        "1.5",
        "1e3",
    ] {
        assert!(serde_json::from_str::<WireInt>(bad).is_err(), "{bad}");
    }
    assert_eq!(
        serde_json::to_string(&WireInt::MAX).unwrap(),
        "9007199254740991"
    );
}

// TL-13: a deadline built from a huge number of seconds saturates, it does not overflow.
#[test]
fn millis_from_secs_saturates() {
    assert_eq!(Millis::from_secs(u64::MAX), Millis(u64::MAX));
    assert_eq!(Millis::from_secs(7), Millis(7_000));
}

// ----- decoding history records --------------------------------------------------------

// PK-01: sequence numbers, times and gaps decode only inside the range.
#[test]
fn history_records_decode_only_wire_integers() {
    let event = |seq: &str, time: &str| {
        format!(
            r#"{{"records":[{{"type":"event","event":{{"seq":{seq},"time":{time},"type":"x","sessionId":"s"}}}}]}}"#
        )
    };
    let page: HistoryPage =
        serde_json::from_str(&event("9007199254740991", "9007199254740991")).unwrap();
    let SessionHistoryRecord::Event(e) = &page.records[0] else {
        panic!("an event")
    };
    assert_eq!((e.seq, e.time), (MAX, MAX));
    for (seq, time) in [
        ("9007199254740992", "1"),
        ("1", "9007199254740992"),
        ("18446744073709551615", "1"),
        ("1", "18446744073709551615"),
        ("-1", "1"),
        ("1", "-1"),
        ("1.5", "1"),
        ("1", "2.5"),
    ] {
        let json = event(seq, time);
        let err = serde_json::from_str::<HistoryPage>(&json).unwrap_err();
        if seq.starts_with("9007") || time.starts_with("9007") {
            assert!(
                err.to_string().contains("exact integer range"),
                "{json}: {err}"
            );
        }
    }

    let chunks = |seq: &str, time: &str, gap: &str| {
        format!(
            r#"{{"records":[{{"type":"chunks","event":{{"type":"chunkrow/text-chunks","seq":{seq},"time":{time},"sessionId":"s","data":{{"block":"b","text":"ab","lengths":[1,1],"gaps":[{gap}]}}}}}}]}}"#
        )
    };
    let page: HistoryPage = serde_json::from_str(&chunks(
        "9007199254740990",
        "9007199254740991",
        "-9007199254740991",
    ))
    .unwrap();
    assert_eq!(
        unpack_records(&page.records).unwrap(),
        vec![delta(MAX - 1, MAX, "a"), delta(MAX, 0, "b")]
    );
    for (seq, time, gap) in [
        ("9007199254740992", "0", "0"),
        ("0", "9007199254740992", "0"),
        ("0", "0", "9007199254740992"),
        ("0", "9007199254740991", "-9007199254740992"),
        ("0", "0", "9223372036854775808"),
        ("0", "0", "0.5"),
    ] {
        assert!(
            serde_json::from_str::<HistoryPage>(&chunks(seq, time, gap)).is_err(),
            "{seq} {time} {gap}"
        );
    }
    // The "event before type" path decodes through the same checks.
    let late = r#"{"records":[{"event":{"seq":9007199254740992,"time":1,"type":"x","sessionId":"s"},"type":"event"}]}"#;
    assert!(serde_json::from_str::<HistoryPage>(late).is_err());
}

// ----- seq_range ------------------------------------------------------------------------

// PK-03: record ranges at the limit, one past it and near u64::MAX.
#[test]
fn seq_range_at_and_past_the_limit() {
    let ev = |seq| SessionHistoryRecord::Event(delta(seq, 0, "x"));
    let rw = |seq| SessionHistoryRecord::Chunks(row(seq, 0, &["a", "b", "c"], &[0, 0]));
    assert_eq!(ev(MAX).seq_range(), Ok(Some(MAX..=MAX)));
    assert_eq!(rw(MAX - 2).seq_range(), Ok(Some(MAX - 2..=MAX)));
    assert_eq!(ev(PAST).seq_range(), Err(RowError::Seq));
    assert_eq!(
        rw(MAX - 1).seq_range(),
        Err(RowError::Seq),
        "last member at 2^53"
    );
    assert_eq!(ev(u64::MAX).seq_range(), Err(RowError::Seq));
    assert_eq!(rw(u64::MAX - 1).seq_range(), Err(RowError::Seq));
    assert_eq!(rw(u64::MAX).seq_range(), Err(RowError::Seq));
    assert_eq!(SessionHistoryRecord::Unknown.seq_range(), Ok(None));
    assert_eq!(
        SessionHistoryRecord::Chunks(row(u64::MAX, 0, &[], &[])).seq_range(),
        Err(RowError::Shape),
        "a row without members has no range"
    );
}

// ----- unpack -----------------------------------------------------------------------------

// PK-01: a row whose last member sits at the limit unpacks and packs back to itself.
#[test]
fn unpack_at_the_limit_round_trips() {
    let r = row(MAX - 1, MAX - 5, &["a", "é"], &[5]);
    let members = unpack(&r).unwrap();
    assert_eq!(
        members,
        vec![delta(MAX - 1, MAX - 5, "a"), delta(MAX, MAX, "é")]
    );
    assert_eq!(
        pack(&members).unwrap(),
        vec![SessionHistoryRecord::Chunks(r)]
    );
    // The widest gaps there are: from the top of the range to 0 and back.
    let r = row(0, MAX, &["a", "b", "c"], &[-(MAX as i64), MAX as i64]);
    let members = unpack(&r).unwrap();
    assert_eq!(
        members.iter().map(|e| e.time).collect::<Vec<_>>(),
        [MAX, 0, MAX]
    );
    assert_eq!(
        pack(&members).unwrap(),
        vec![SessionHistoryRecord::Chunks(r)]
    );
}

// PK-01: one past the limit and near u64::MAX, a row is a typed error, never a panic.
#[test]
fn unpack_past_the_limit_is_a_typed_error() {
    let cases = [
        (row(MAX, 0, &["a", "b"], &[0]), RowError::Seq),
        (row(PAST, 0, &["a"], &[]), RowError::Seq),
        (row(u64::MAX, 0, &["a", "b", "c"], &[0, 0]), RowError::Seq),
        (
            row(u64::MAX - 1, 0, &["a", "b", "c"], &[0, 0]),
            RowError::Seq,
        ),
        (row(0, PAST, &["a"], &[]), RowError::Time),
        (row(0, MAX, &["a", "b"], &[1]), RowError::Time),
        (row(0, MAX - 1, &["a", "b"], &[i64::MAX]), RowError::Time),
        (row(0, 0, &["a", "b"], &[i64::MIN]), RowError::Time),
        // Was accepted as a u64 time: 2^64 - 2 cannot be read exactly by a client.
        (row(0, u64::MAX, &["a", "b"], &[-1]), RowError::Time),
        (row(0, 1 << 63, &["a", "b"], &[0]), RowError::Time),
    ];
    for (r, err) in cases {
        assert_eq!(validate_row(&r), Err(err.clone()), "{r:?}");
        assert_eq!(unpack(&r), Err(err.clone()), "{r:?}");
        assert_eq!(
            unpack_records(&[SessionHistoryRecord::Chunks(r.clone())]),
            Err(err),
            "{r:?}"
        );
    }
    // A scalar event past the limit is refused the same way.
    assert_eq!(
        unpack_records(&[SessionHistoryRecord::Event(delta(PAST, 0, "x"))]),
        Err(RowError::Seq)
    );
    assert_eq!(
        unpack_records(&[SessionHistoryRecord::Event(delta(0, u64::MAX, "x"))]),
        Err(RowError::Time)
    );
}

// ----- pack and write_packed_page ---------------------------------------------------------

// PK-01: events at the limit pack, write and unpack to themselves.
#[test]
fn pack_at_the_limit_round_trips() {
    assert_round_trips(&[
        delta(MAX - 2, MAX, "a"),
        delta(MAX - 1, 0, "b"),
        delta(MAX, MAX, "c"),
    ]);
    assert_round_trips(&[delta(MAX, MAX, "only")]);
    assert_round_trips(&[
        SessionEvent::other(
            MAX - 1,
            MAX,
            "s",
            "tool/result",
            serde_json::json!({"n": 1}),
        ),
        delta(MAX, MAX, "x"),
    ]);
}

// PK-01: one past the limit and near u64::MAX, pack and write_packed_page refuse the
// page with a typed error (they used to overflow, or pack rows that unpack refused).
#[test]
fn pack_past_the_limit_is_a_typed_error() {
    let cases: Vec<(Vec<SessionEvent>, RowError)> = vec![
        (vec![delta(MAX, 0, "a"), delta(PAST, 0, "b")], RowError::Seq),
        (vec![delta(PAST, 0, "a")], RowError::Seq),
        (
            vec![delta(u64::MAX - 1, 0, "a"), delta(u64::MAX, 0, "b")],
            RowError::Seq,
        ),
        (
            vec![delta(u64::MAX, 0, "a"), delta(0, 0, "b")],
            RowError::Seq,
        ),
        (
            vec![delta(1, MAX, "a"), delta(2, PAST, "b")],
            RowError::Time,
        ),
        (vec![delta(1, PAST, "a")], RowError::Time),
        // Times of 2^63 and more used to pack into a row that unpack refused.
        (
            vec![delta(1, 1 << 63, "a"), delta(2, (1 << 63) + 1, "b")],
            RowError::Time,
        ),
        (
            vec![delta(1, 0, "a"), delta(2, u64::MAX, "b")],
            RowError::Time,
        ),
        (
            vec![delta(1, u64::MAX, "a"), delta(2, 0, "b")],
            RowError::Time,
        ),
    ];
    for (events, err) in cases {
        assert_eq!(pack(&events), Err(err.clone()), "{events:?}");
        let mut out = b"stale".to_vec();
        match write_packed_page(&events, &mut out) {
            Err(PackError::Row(e)) => assert_eq!(e, err, "{events:?}"),
            other => panic!("{events:?}: {other:?}"),
        }
        assert!(out.is_empty(), "no partial page is left behind");
    }
}

// PK-01: a delta that carries `data` stays an event, so packing never drops it.
#[test]
fn a_delta_with_data_is_not_packed_into_a_row() {
    let mut with_data = delta(2, 2, "b");
    with_data.data = serde_json::json!({"keep": true});
    let events = vec![
        delta(1, 1, "a"),
        with_data,
        delta(3, 3, "c"),
        delta(4, 4, "d"),
    ];
    let records = pack(&events).unwrap();
    assert_eq!(records.len(), 3);
    assert_round_trips(&events);
}

// ----- fold_row -----------------------------------------------------------------------------

// PK-04: a row ending at the limit folds; one past it, or near u64::MAX, is refused and
// leaves the fold untouched.
#[test]
fn fold_row_at_and_past_the_limit() {
    let mut fold = AssistantFold::new();
    fold.fold_row(&row(MAX - 1, MAX, &["a", "b"], &[0]))
        .unwrap();
    assert_eq!(fold.last_delta_seq, Some(MAX));
    assert_eq!(fold.first_token_time, Some(MAX));
    assert_eq!(fold.delta_count, 2);
    let before = fold.clone();
    for (r, err) in [
        (row(MAX, 0, &["a", "b"], &[0]), RowError::Seq),
        (row(u64::MAX, 0, &["a", "b"], &[0]), RowError::Seq),
        (row(u64::MAX, 0, &["a"], &[]), RowError::Seq),
        (row(0, u64::MAX, &["a", "b"], &[-1]), RowError::Time),
    ] {
        assert_eq!(fold.fold_row(&r), Err(err.clone()));
        assert_eq!(fold.fold_record(&SessionHistoryRecord::Chunks(r)), Err(err));
        assert_eq!(fold, before);
    }
    assert_eq!(
        fold.fold_record(&SessionHistoryRecord::Event(delta(PAST, 0, "x"))),
        Err(RowError::Seq)
    );
    assert_eq!(fold, before);
}

// ----- the journal ---------------------------------------------------------------------------

// PK-03: a journal reaching the limit publishes up to it, refuses anything past it with
// a typed outcome, and never overflows computing a gap.
#[test]
fn journal_at_and_past_the_limit() {
    let mut j = Journal::new();
    let top = pack(&[
        delta(MAX - 2, 1, "a"),
        delta(MAX - 1, 2, "b"),
        delta(MAX, 3, "c"),
    ])
    .unwrap();
    assert!(matches!(
        j.accept_page(&top),
        JournalOutcome::Published {
            side: Side::Newer,
            ..
        }
    ));
    assert_eq!(j.span(), Some(MAX - 2..=MAX));
    // An older page joining right below.
    let below = pack(&[delta(MAX - 4, 0, "y"), delta(MAX - 3, 0, "z")]).unwrap();
    assert!(matches!(
        j.accept_page(&below),
        JournalOutcome::Published {
            side: Side::Older,
            ..
        }
    ));
    assert_eq!(j.span(), Some(MAX - 4..=MAX));
    assert_eq!(
        j.accept_live(&delta(MAX, 3, "c")),
        JournalOutcome::Duplicate
    );
    assert_eq!(j.accept_page(&top), JournalOutcome::Duplicate);

    // Past the limit: typed, and nothing changes.
    assert_eq!(
        j.accept_live(&delta(PAST, 0, "x")),
        JournalOutcome::BadRow(RowError::Seq)
    );
    assert_eq!(
        j.accept_live(&delta(u64::MAX, 0, "x")),
        JournalOutcome::BadRow(RowError::Seq)
    );
    assert_eq!(
        j.accept_live(&delta(MAX, u64::MAX, "x")),
        JournalOutcome::BadRow(RowError::Time)
    );
    for records in [
        vec![SessionHistoryRecord::Chunks(row(MAX, 0, &["a", "b"], &[0]))],
        vec![SessionHistoryRecord::Chunks(row(
            u64::MAX,
            0,
            &["a", "b"],
            &[0],
        ))],
        vec![SessionHistoryRecord::Event(delta(u64::MAX, 0, "x"))],
        vec![SessionHistoryRecord::Event(delta(PAST, 0, "x"))],
    ] {
        assert_eq!(
            j.accept_page(&records),
            JournalOutcome::BadRow(RowError::Seq),
            "{records:?}"
        );
    }
    assert_eq!(
        j.accept_page(&[SessionHistoryRecord::Event(delta(1, PAST, "x"))]),
        JournalOutcome::BadRow(RowError::Time)
    );
    assert_eq!(j.span(), Some(MAX - 4..=MAX));

    // An empty journal refuses them too, and a gap up to the limit is computed exactly.
    let mut fresh = Journal::new();
    assert_eq!(
        fresh.accept_live(&delta(u64::MAX, 0, "x")),
        JournalOutcome::BadRow(RowError::Seq)
    );
    assert_eq!(fresh.span(), None);
    assert!(matches!(
        fresh.accept_live(&delta(0, 0, "x")),
        JournalOutcome::Published { .. }
    ));
    assert_eq!(
        fresh.accept_live(&delta(MAX, 0, "x")),
        JournalOutcome::Gap {
            missing: 1..=MAX - 1
        }
    );
    assert_eq!(
        fresh.accept_page(&pack(&[delta(MAX, 0, "x")]).unwrap()),
        JournalOutcome::Gap {
            missing: 1..=MAX - 1
        }
    );
    let mut high = Journal::new();
    assert!(matches!(
        high.accept_live(&delta(MAX, 0, "x")),
        JournalOutcome::Published { .. }
    ));
    assert_eq!(
        high.accept_page(&pack(&[delta(0, 0, "x")]).unwrap()),
        JournalOutcome::Gap {
            missing: 1..=MAX - 1
        }
    );
}

// ----- wire answers (TL-04..TL-08) -------------------------------------------------------------

fn block_json(timestamp: &str, source_order: &str) -> String {
    format!(
        r#"{{"type":"agent-reply","id":"r1","timestamp":{timestamp},"sourceOrder":{source_order}}}"#
    )
}

fn window_json(history: &str, live: &str) -> String {
    format!(
        r#"{{"blocks":[{history}],"boundaryToken":"s","windowRevision":1,"liveOverlay":{{"settlementEpoch":1,"revision":1,"blocks":[{live}]}}}}"#
    )
}

fn older_json(block: &str) -> String {
    format!(
        r#"{{"blocks":[{block}],"boundaryBlockKeys":[],"orderedBlockKeys":[{{"type":"agent-reply","id":"r1"}}],"windowRevision":2}}"#
    )
}

// TL-04, TL-05, TL-06, TL-07, TL-08: a block's timestamp and sourceOrder are wire
// numbers: 2^53 - 1 is accepted, 2^53 is NumberOutOfRange, in history blocks, live
// blocks and older pages alike.
#[test]
fn block_numbers_are_checked_on_every_answer() {
    let ok = block_json(
        "9007199254740991",
        "[0,1,9007199254740991,9007199254740991]",
    );
    let w = TimelineWindow::from_json(&window_json(&ok, "")).unwrap();
    assert_eq!(w.blocks[0].timestamp, Millis(MAX));
    let w = TimelineWindow::from_json(&window_json("", &ok)).unwrap();
    assert_eq!(
        w.live_overlay.unwrap().blocks[0].source_order,
        Some(SourceOrder::history(MAX, MAX))
    );
    let p = OlderPage::from_json(&older_json(&ok)).unwrap();
    assert_eq!(p.blocks[0].timestamp, Millis(MAX));

    for (block, field) in [
        (block_json("9007199254740992", "[0,1,1,0]"), "timestamp"),
        (block_json("18446744073709551615", "[0,1,1,0]"), "timestamp"),
        (block_json("1", "[0,1,9007199254740992,0]"), "sourceOrder"),
        (block_json("1", "[2,18446744073709551615]"), "sourceOrder"),
    ] {
        let want = ResponseError::NumberOutOfRange(field);
        assert_eq!(
            TimelineWindow::from_json(&window_json(&block, "")).unwrap_err(),
            want,
            "{block}"
        );
        assert_eq!(
            TimelineWindow::from_json(&window_json("", &block)).unwrap_err(),
            want,
            "{block}"
        );
        assert_eq!(
            OlderPage::from_json(&older_json(&block)).unwrap_err(),
            want,
            "{block}"
        );
    }
    // Negatives and fractions never decode.
    for block in [
        block_json("-1", "[0,1,1,0]"),
        block_json("1.5", "[0,1,1,0]"),
        block_json("1", "[0,1,-1,0]"),
        block_json("1", "[0,1,0.5,0]"),
    ] {
        assert!(matches!(
            TimelineWindow::from_json(&window_json(&block, "")),
            Err(ResponseError::Decode(_))
        ));
        assert!(matches!(
            OlderPage::from_json(&older_json(&block)),
            Err(ResponseError::Decode(_))
        ));
    }
}

// TL-06: a live update built in memory is checked the same way.
#[test]
fn live_overlay_validate_checks_block_numbers() {
    let key = BlockKey::parse(BlockType::Activity, "a").unwrap();
    let at = |ts: u64, order: SourceOrder| LiveOverlay {
        settlement_epoch: 1,
        revision: 1,
        blocks: vec![Block::new(key.clone(), Millis(ts)).with_source_order(order)],
    };
    assert_eq!(at(MAX, SourceOrder::live(MAX)).validate(), Ok(()));
    assert_eq!(
        at(PAST, SourceOrder::live(1)).validate(),
        Err(ResponseError::NumberOutOfRange("timestamp"))
    );
    assert_eq!(
        at(1, SourceOrder::live(PAST)).validate(),
        Err(ResponseError::NumberOutOfRange("sourceOrder"))
    );
    assert_eq!(
        at(1, SourceOrder::active_run_status(Millis(u64::MAX))).validate(),
        Err(ResponseError::NumberOutOfRange("sourceOrder"))
    );
}

// ----- properties ---------------------------------------------------------------------------

/// Numbers drawn around every edge: small, at the limit, just past it, around 2^63,
/// near u64::MAX, and anywhere.
fn edge_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        0u64..64,
        MAX - 64..=MAX,
        PAST..PAST + 64,
        (1u64 << 63) - 32..(1u64 << 63) + 32,
        u64::MAX - 64..=u64::MAX,
        any::<u64>(),
    ]
}

fn edge_i64() -> impl Strategy<Value = i64> {
    prop_oneof![
        -64i64..64,
        (MAX as i64 - 64)..=(MAX as i64 + 64),
        -(MAX as i64 + 64)..=-(MAX as i64 - 64),
        Just(i64::MIN),
        Just(i64::MAX),
        any::<i64>(),
    ]
}

/// `n`, or a number just below 2^53 when `n` is past the range.
fn fold_in(n: u64) -> u64 {
    if n > MAX {
        MAX - n % 64
    } else {
        n
    }
}

/// `g`, or a gap of magnitude just below 2^53 when `g`'s is past the range.
fn fold_in_gap(g: i64) -> i64 {
    if g.unsigned_abs() > MAX {
        g.signum() * (MAX - g.unsigned_abs() % 64) as i64
    } else {
        g
    }
}

fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), "[a-z]{1,4}", "[é漢🙂\"\\\\\n]{1,3}"]
}

/// Pages of events whose sequence numbers and times sit near the edges, with runs of
/// consecutive deltas so rows form.
fn edge_events() -> impl Strategy<Value = Vec<SessionEvent>> {
    let item = (
        0u8..5,
        fragment(),
        0u8..4,
        edge_u64(),
        0u8..3,
        edge_u64(),
        0u64..50,
    );
    (
        any::<bool>(),
        edge_u64(),
        edge_u64(),
        prop::collection::vec(item, 0..40),
    )
        .prop_map(|(clean, seq0, time0, items)| {
            // Half the pages keep every number inside the range (near its top when drawn
            // past it), so accepted pages with numbers at the edges are common too.
            let keep = |n: u64| if clean { fold_in(n) } else { n };
            let (mut seq, mut time) = (keep(seq0), keep(time0));
            let mut out = Vec::with_capacity(items.len());
            for (i, (k, text, seq_mode, seq_edge, time_mode, time_edge, small)) in
                items.into_iter().enumerate()
            {
                if i > 0 {
                    seq = keep(if seq_mode == 0 {
                        seq_edge
                    } else {
                        seq.wrapping_add(1)
                    });
                    time = keep(match time_mode {
                        0 => time_edge,
                        1 => time.saturating_add(small),
                        _ => time.saturating_sub(small),
                    });
                }
                let e = match k {
                    0..=2 => {
                        let kind = [DeltaKind::Text, DeltaKind::Reasoning, DeltaKind::ToolCall]
                            [k as usize];
                        SessionEvent::delta(seq, time, "s", kind, "b", &text)
                    }
                    3 => SessionEvent::other(
                        seq,
                        time,
                        "s",
                        "tool/result",
                        serde_json::json!({"i": i}),
                    ),
                    _ => SessionEvent::delta(seq, time, "s", DeltaKind::Text, "other", &text),
                };
                out.push(e);
            }
            out
        })
}

/// Rows with sequence numbers, times and gaps near the edges (and sometimes the wrong
/// number of gaps).
fn edge_rows() -> impl Strategy<Value = ChunkRowEvent> {
    (
        0usize..7,
        edge_u64(),
        edge_u64(),
        prop::collection::vec(fragment(), 0..6),
        prop::collection::vec(edge_i64(), 0..6),
        prop::bool::weighted(0.8),
    )
        .prop_map(|(k, seq, time, fragments, mut gaps, fit)| {
            // A row of the right shape keeps its numbers inside the range (near its
            // top when drawn past it); its members may still leave it.
            let (seq, time) = if fit {
                gaps.resize(fragments.len().saturating_sub(1), 0);
                for g in &mut gaps {
                    *g = fold_in_gap(*g);
                }
                (fold_in(seq), fold_in(time))
            } else {
                (seq, time)
            };
            let kind = match k {
                0 | 1 => DeltaKind::Text.row_type(),
                2 | 3 => DeltaKind::Reasoning.row_type(),
                4 | 5 => DeltaKind::ToolCall.row_type(),
                _ => "chunkrow/image-chunks",
            };
            ChunkRowEvent {
                kind: kind.to_owned(),
                seq,
                time,
                session_id: "s".to_owned(),
                turn_id: Some("t".to_owned()),
                data: ChunkData {
                    block: "b".to_owned(),
                    text: fragments.concat(),
                    lengths: fragments.iter().map(|f| f.len() as u32).collect(),
                    gaps,
                },
            }
        })
}

/// The refusal `pack` owes a page: the first event whose `seq` (then `time`) is past
/// 2^53 - 1.
fn expected_refusal(events: &[SessionEvent]) -> Option<RowError> {
    events.iter().find_map(|e| {
        if e.seq > MAX {
            Some(RowError::Seq)
        } else if e.time > MAX {
            Some(RowError::Time)
        } else {
            None
        }
    })
}

fn scalar_fold(events: &[SessionEvent]) -> AssistantFold {
    let mut f = AssistantFold::new();
    for e in events {
        f.fold_event(e);
    }
    f
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fixtures::proptest_cases()))]

    // PK-01, PK-04: for any page with numbers near the edges, pack then unpack is the
    // identity (directly and through both JSON writers) or a typed error exactly when a
    // number is past 2^53 - 1; never a panic. Accepted pages fold the same scalar and
    // packed.
    #[test]
    fn pack_unpack_is_the_identity_or_a_typed_error(events in edge_events()) {
        let packed = pack(&events);
        let mut direct = Vec::new();
        let written = write_packed_page(&events, &mut direct);
        match (expected_refusal(&events), packed) {
            (Some(want), Err(got)) => {
                prop_assert_eq!(got, want.clone());
                prop_assert!(matches!(written, Err(PackError::Row(ref e)) if *e == want));
                prop_assert!(direct.is_empty());
                // The journal and the fold refuse such events too.
                let records: Vec<_> = events.iter().cloned().map(SessionHistoryRecord::Event).collect();
                prop_assert!(unpack_records(&records).is_err());
                let outcome = Journal::new().accept_page(&records);
                prop_assert!(
                    matches!(outcome, JournalOutcome::BadRow(_) | JournalOutcome::BrokenPage { .. }),
                    "{:?}", outcome
                );
            }
            (None, Ok(records)) => {
                prop_assert_eq!(unpack_records(&records).unwrap(), events.clone());
                written.unwrap();
                let via_serde = serde_json::to_vec(&HistoryPage { records: records.clone() }).unwrap();
                prop_assert_eq!(&direct, &via_serde);
                let back: HistoryPage = serde_json::from_slice(&direct).unwrap();
                prop_assert_eq!(&back.records, &records);
                prop_assert_eq!(unpack_records(&back.records).unwrap(), events.clone());

                let scalar = scalar_fold(&events);
                let mut folded = AssistantFold::new();
                for r in &records { folded.fold_record(r).unwrap(); }
                prop_assert_eq!(folded.entries, records.len() as u64);
                folded.entries = scalar.entries;
                prop_assert_eq!(folded, scalar);

                let outcome = Journal::new().accept_page(&records);
                prop_assert!(
                    matches!(outcome, JournalOutcome::Published { .. } | JournalOutcome::BrokenPage { .. })
                        || (events.is_empty() && outcome == JournalOutcome::Duplicate),
                    "{:?}", outcome
                );
            }
            (want, got) => prop_assert!(false, "expected {:?}, pack gave {:?}", want, got),
        }
        // Live delivery of the same events never panics and refuses exactly the
        // out-of-range ones.
        let mut journal = Journal::new();
        for e in &events {
            let outcome = journal.accept_live(e);
            let bad = e.seq > MAX || e.time > MAX;
            prop_assert_eq!(matches!(outcome, JournalOutcome::BadRow(_)), bad);
        }
        if let Some(span) = journal.span() {
            prop_assert!(*span.end() <= MAX);
        }
    }

    // PK-01, PK-03, PK-04: any row, numbers near the edges included, either unpacks to
    // members that pack back to the same row, fold like the row and are published by a
    // journal, or every entry point answers the same typed error. Never a panic.
    #[test]
    fn any_row_unpacks_and_repacks_or_is_refused_everywhere(r in edge_rows()) {
        let record = SessionHistoryRecord::Chunks(r.clone());
        let mut fold = AssistantFold::new();
        let folded = fold.fold_row(&r);
        let published = Journal::new().accept_page(std::slice::from_ref(&record));
        match unpack(&r) {
            Ok(members) => {
                prop_assert!(validate_row(&r).is_ok());
                prop_assert!(members.iter().all(|e| e.seq <= MAX && e.time <= MAX));
                let range = record.seq_range().unwrap().unwrap();
                prop_assert_eq!(*range.start(), members[0].seq);
                prop_assert_eq!(*range.end(), members[members.len() - 1].seq);
                let repacked = pack(&members).unwrap();
                if members.len() > 1 {
                    prop_assert_eq!(&repacked, &vec![record.clone()]);
                }
                prop_assert_eq!(unpack_records(&repacked).unwrap(), members.clone());
                // The row goes through JSON unchanged.
                let json = serde_json::to_string(&r).unwrap();
                prop_assert_eq!(serde_json::from_str::<ChunkRowEvent>(&json).unwrap(), r.clone());
                // Both folds agree.
                folded.unwrap();
                let scalar = scalar_fold(&members);
                fold.entries = scalar.entries;
                prop_assert_eq!(fold, scalar);
                let published_ok = matches!(published, JournalOutcome::Published { .. });
                prop_assert!(published_ok);
            }
            Err(e) => {
                prop_assert_eq!(validate_row(&r), Err(e.clone()));
                prop_assert_eq!(folded, Err(e.clone()));
                prop_assert_eq!(fold, AssistantFold::new());
                prop_assert_eq!(published, JournalOutcome::BadRow(e.clone()));
                prop_assert_eq!(unpack_records(std::slice::from_ref(&record)), Err(e));
            }
        }
    }
}

// RB-04: a live event's `seq` is a wire integer; one at or past 2^53 (up to u64::MAX)
// is ignored as malformed, never added to or wrapped, and the conversation stays as it
// was; 2^53-1 itself is taken.
#[test]
fn client_replay_sequence_numbers_at_and_past_the_limit() {
    use timeline_core::replay::{ConversationClient, ReplayOutcome};
    let chunk = r#"{"type":"structured_replay","seq":0,"last":true,"truncated":false,
      "reclaimed":false,"running":{"running":false},
      "events":[{"seq":9007199254740990,"type":"session_init"}]}"#;
    let mut c = ConversationClient::new();
    assert_eq!(
        c.handle_replay_chunk(chunk, timeline_core::time::Millis(0)),
        ReplayOutcome::Complete
    );
    let before = c.view().len();
    for seq in [u64::MAX, 1 << 63, 1 << 53] {
        let live = format!(r#"{{"seq":{seq},"type":"assistant_delta","text":"x"}}"#);
        assert_eq!(c.handle_live(&live), ReplayOutcome::Ignored, "seq {seq}");
        assert_eq!(c.view().len(), before);
    }
    let at_limit = r#"{"seq":9007199254740991,"type":"session_init"}"#;
    assert_ne!(c.handle_live(at_limit), ReplayOutcome::Ignored);
}
