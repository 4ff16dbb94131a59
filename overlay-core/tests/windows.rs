//! Host-side windows: latest window and reconcile (OV-05), older pages (TL-08, TL-09),
//! anchored windows (TL-12), and the source reads they stand on: a newer load resumes
//! at its page, and every way of reading a source gives the same items.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use fixtures::failing::FailingOverlay;
use overlay_core::overlay::Change;
use overlay_core::source::{
    HistorySource, MemorySource, SourceError, SourceKind, SourcePage, SourcePosition,
};
use overlay_core::store::memory::MemoryOverlayStore;
use overlay_core::store::write;
use overlay_core::store::{OverlayError, OverlayStore, RowClass, StoredBlock};
use overlay_core::window::{
    anchored_window, latest_window, leaves_latest_window, older_page, reconcile_sessions,
    BuildError, OlderPageRequest, ReconcileSession, Target, WindowError,
};
use proptest::prelude::*;
use timeline_core::anchor::{Anchor, AnchorError, AnchorToken, LinkPlace};
use timeline_core::block::Block;
use timeline_core::cursor::{BoundaryToken, CursorError};
use timeline_core::key::{BlockKey, BlockType, RunId, SessionId, TargetId};
use timeline_core::time::Millis;
use timeline_core::wire::{TimelineWindow, MESSAGE_NOT_SAVED_NOTICE, ROW_NOT_SAVED_NOTICE};

fn target<'a>(s: &'a SessionId, t: &'a TargetId) -> Target<'a> {
    Target {
        session: s,
        target: t,
        current_run: None,
    }
}

/// The anchored window for `anchor` in `t`, under the test host key.
fn anchored(
    store: &mut MemoryOverlayStore,
    source: &mut dyn HistorySource,
    t: Target<'_>,
    anchor: &Anchor,
) -> Result<TimelineWindow, WindowError> {
    anchored_window(store, source, &host_key(), t, anchor)
        .map(|built| built.window)
        .map_err(|failed| {
            assert!(
                failed.written.is_empty(),
                "a failed anchored load saved nothing"
            );
            failed.error
        })
}

/// A link token to `row` (in `app_session`, when given), sealed with the test host key.
fn link_token(app_session: Option<&str>, row: BlockKey) -> String {
    AnchorToken::Link(LinkPlace {
        app_session_id: app_session.map(str::to_owned),
        thread_id: None,
        row,
    })
    .encode(&host_key())
}

fn ids(blocks: &[Block]) -> Vec<String> {
    blocks.iter().map(|b| b.id.as_str().to_owned()).collect()
}

/// An older-page request without an expected boundary token.
fn request(cursor: &str, page_size: usize) -> OlderPageRequest<'_> {
    OlderPageRequest {
        cursor,
        page_size,
        expected_boundary_token: None,
    }
}

// OV-05, TL-07
#[test]
fn a_latest_window_settles_the_rows_its_page_holds_in_the_same_answer() {
    let (s, t) = (session(), main_target());
    let mut store = store_with_live(vec![live("a", 2_000, "run-1"), live("b", 2_001, "run-1")]);
    let mut source = filled(claude_source(), 3);
    source.push(vec![saved("a", 2_000, 3)]);
    let built = latest_window(&mut store, &mut source, &host_key(), target(&s, &t), 12).unwrap();
    assert_eq!(ids(&built.window.blocks), ["h-0", "h-1", "h-2", "a"]);
    let overlay = built.window.live_overlay.unwrap();
    assert_eq!(ids(&overlay.blocks), ["b"]);
    assert_eq!(overlay.settlement_epoch, 1);
    let settled = built.settled.unwrap();
    assert_eq!(settled.revision, overlay.revision);
    assert_eq!(
        built.window.window_revision,
        store.current_revision().unwrap()
    );
    assert_eq!(built.window.oldest_cursor, None, "history fits in one page");
}

// TL-13: pageSize decoded up to 640, served up to 100.
#[test]
fn page_sizes_past_640_are_invalid_and_past_100_are_clamped() {
    let (s, t) = (session(), main_target());
    let mut store = MemoryOverlayStore::new();
    let mut source = filled(codex_source(), 150);
    let w = latest_window(&mut store, &mut source, &host_key(), target(&s, &t), 640).unwrap();
    assert_eq!(w.window.blocks.len(), 100);
    let e = latest_window(&mut store, &mut source, &host_key(), target(&s, &t), 641).unwrap_err();
    assert!(matches!(e.error, WindowError::InvalidParams(_)));
    assert!(e.written.is_empty());
    assert_eq!(e.error_code(), "INVALID_PARAMS");
}

fn first_cursor(source: &mut dyn HistorySource) -> (String, u64) {
    let (s, t) = (session(), main_target());
    let mut store = MemoryOverlayStore::new();
    let w = latest_window(&mut store, source, &host_key(), target(&s, &t), 12)
        .unwrap()
        .window;
    (w.oldest_cursor.unwrap(), w.window_revision)
}

// TL-08
#[test]
fn an_older_page_carries_the_seam_the_ordered_keys_and_revision_plus_one() {
    for mut source in [filled(codex_source(), 30), filled(claude_source(), 30)] {
        let (cursor, rev) = first_cursor(&mut source);
        let token = source.boundary_token();
        let req = OlderPageRequest {
            expected_boundary_token: Some(&token),
            ..request(&cursor, 5)
        };
        let page = older_page(&mut source, &host_key(), req).unwrap();
        assert_eq!(ids(&page.blocks), ["h-13", "h-14", "h-15", "h-16", "h-17"]);
        assert_eq!(page.boundary_block_keys, [reply("h-18")]);
        let mut expected: Vec<_> = page.blocks.iter().map(Block::key).collect();
        expected.push(reply("h-18"));
        assert_eq!(page.ordered_block_keys, expected);
        assert_eq!(page.window_revision, rev + 1);
        // The next cursor's seam is the page's top row.
        let next = page.oldest_cursor.unwrap();
        let req = OlderPageRequest {
            expected_boundary_token: Some(&token),
            ..request(&next, 5)
        };
        let page2 = older_page(&mut source, &host_key(), req).unwrap();
        assert_eq!(page2.boundary_block_keys, [reply("h-13")]);
        assert_eq!(page2.window_revision, rev + 2);
        page2.validate().unwrap();
    }
}

// TL-09
#[test]
fn cursors_for_another_thread_or_session_are_rejected() {
    let mut codex = filled(codex_source(), 30);
    let (cursor, _) = first_cursor(&mut codex);
    let mut other_thread = filled(
        overlay_core::source::MemorySource::new(
            overlay_core::source::SourceKind::Codex {
                thread_id: "thread-2".into(),
                generation: 1,
            },
            BoundaryToken::codex_rollout("/rollouts/r1.jsonl"),
        ),
        30,
    );
    let req = request(&cursor, 5);
    assert_eq!(
        older_page(&mut other_thread, &host_key(), req),
        Err(WindowError::Cursor(CursorError::OtherThread))
    );

    let mut claude = filled(claude_source(), 30);
    let (cursor, _) = first_cursor(&mut claude);
    let mut other_session = filled(
        overlay_core::source::MemorySource::new(
            overlay_core::source::SourceKind::Claude {
                session: "another".into(),
            },
            BoundaryToken::claude("another"),
        ),
        30,
    );
    let req = request(&cursor, 5);
    assert_eq!(
        older_page(&mut other_session, &host_key(), req),
        Err(WindowError::Cursor(CursorError::OtherSession))
    );
    // A Claude cursor longer than 4,096 characters.
    let long = format!("{{\"session\":\"{}\"}}", "x".repeat(4_100));
    let req = request(&long, 5);
    assert_eq!(
        older_page(&mut claude, &host_key(), req),
        Err(WindowError::Cursor(CursorError::TooLong { max: 4096 }))
    );
}

// TL-09, TL-10
#[test]
fn a_changed_source_fails_or_answers_reload_required() {
    let mut codex = filled(codex_source(), 30);
    let (cursor, _) = first_cursor(&mut codex);
    let old_token = codex.boundary_token();
    codex.set_boundary_token(BoundaryToken::codex_owned_thread_store("owner-2"));
    // The client still expects the old source: empty page, reloadRequired.
    let req = OlderPageRequest {
        expected_boundary_token: Some(&old_token),
        ..request(&cursor, 5)
    };
    let page = older_page(&mut codex, &host_key(), req).unwrap();
    assert!(page.reload_required && page.blocks.is_empty());
    // The cursor itself names the old source: "Timeline source changed".
    let req = request(&cursor, 5);
    let err = older_page(&mut codex, &host_key(), req).unwrap_err();
    assert_eq!(err.to_string(), "Timeline source changed");
}

// TL-09: the Claude `before` message is gone.
#[test]
fn a_gone_position_answers_an_empty_page_with_reload_required() {
    let mut claude = filled(claude_source(), 30);
    let (cursor, _) = first_cursor(&mut claude);
    // The oldest item of the window (the cursor's position) disappears.
    assert!(claude.remove(&overlay_core::source::SourcePosition("item-18".into())));
    let req = request(&cursor, 5);
    let page = older_page(&mut claude, &host_key(), req).unwrap();
    assert!(page.reload_required);
}

// TL-08: one request reads up to four source pages until one yields a visible row.
#[test]
fn an_older_page_reads_at_most_four_source_pages() {
    let mut source = claude_source();
    for i in 0..3 {
        source.push(vec![saved(&format!("old-{i}"), 10 + i, i)]);
    }
    for _ in 0..50 {
        source.push(vec![]); // items that project to no visible row
    }
    for i in 0..12 {
        source.push(vec![saved(&format!("new-{i}"), 1_000 + i, 100 + i)]);
    }
    let (cursor, _) = first_cursor(&mut source);
    source.reads = 0;
    let req = request(&cursor, 10);
    let page = older_page(&mut source, &host_key(), req).unwrap();
    assert_eq!(source.reads, 4);
    assert!(page.blocks.is_empty());
    // The cursor moves past the invisible items; the next request reaches old rows.
    let next = page.oldest_cursor.unwrap();
    let req = request(&next, 10);
    let page = older_page(&mut source, &host_key(), req).unwrap();
    assert_eq!(ids(&page.blocks), ["old-0", "old-1", "old-2"]);
    assert!(page.oldest_cursor.is_none());
}

// Seed case 6, host side: an unavailable or malformed source is an error, never an
// empty conversation.
#[test]
fn an_unavailable_source_is_an_error_not_an_empty_window() {
    let (s, t) = (session(), main_target());
    let mut store = MemoryOverlayStore::new();
    let mut source = filled(claude_source(), 3);
    source.fail_with = Some(SourceError::Malformed(
        "an entry with both item and unsupportedItem".into(),
    ));
    let e = latest_window(&mut store, &mut source, &host_key(), target(&s, &t), 12).unwrap_err();
    assert_eq!(e.error_code(), "HISTORY_UNAVAILABLE");
}

// OV-05, TL-13: at most 16 sessions, 256 outbox entries each; the 8 MiB cap.
#[test]
fn reconcile_enforces_its_caps_at_the_limit_and_one_past() {
    let mut store = MemoryOverlayStore::new();
    let run_reconcile =
        |store: &mut MemoryOverlayStore, sessions: usize, entries: usize, entry_bytes: usize| {
            let mut sources: Vec<_> = (0..sessions).map(|_| filled(claude_source(), 2)).collect();
            let reqs = sources
                .iter_mut()
                .enumerate()
                .map(|(i, src)| ReconcileSession {
                    session: SessionId::new(format!("s-{i}")).unwrap(),
                    target: TargetId::new(format!("s-{i}")).unwrap(),
                    source: src,
                    outbox: vec![serde_json::json!({ "text": "x".repeat(entry_bytes) }); entries],
                    active_run: None,
                })
                .collect();
            reconcile_sessions(store, &host_key(), reqs)
        };
    assert_eq!(
        run_reconcile(&mut store, 16, 1, 1).unwrap().sessions.len(),
        16
    );
    assert!(matches!(
        run_reconcile(&mut store, 17, 1, 1).map_err(|e| e.error),
        Err(WindowError::InvalidParams(_))
    ));
    assert_eq!(
        run_reconcile(&mut store, 1, 256, 1).unwrap().sessions[0]
            .outbox
            .len(),
        256
    );
    assert!(matches!(
        run_reconcile(&mut store, 1, 257, 1).map_err(|e| e.error),
        Err(WindowError::InvalidParams(_))
    ));
    // 16 sessions of 256 entries of ~2 KiB: about 8.4 MB, past the cap.
    let e = run_reconcile(&mut store, 16, 256, 2_048).unwrap_err();
    assert!(matches!(e.error, WindowError::TooLarge { .. }));
    assert_eq!(e.error_code(), "TIMELINE_SNAPSHOT_TOO_LARGE");
    // Just under: the same with 1.9 KiB entries fits.
    assert!(run_reconcile(&mut store, 16, 256, 1_900).is_ok());
}

// TL-12: always 40 rows; a place in the newest 40 gives the newest window.
#[test]
fn an_anchor_in_the_newest_40_rows_gives_the_newest_window() {
    let (s, t) = (session(), main_target());
    let mut store = store_with_live(vec![live("live-now", 9_999, "run-1")]);
    let mut source = filled(claude_source(), 100);
    let anchor = Anchor::row(&reply("h-70"));
    let w = anchored(&mut store, &mut source, target(&s, &t), &anchor).unwrap();
    assert_eq!(w.blocks.len(), 40);
    assert_eq!(w.blocks.last().unwrap().id.as_str(), "h-99");
    assert_eq!(w.anchor_row, Some(reply("h-70")));
    assert_eq!(w.anchor_notice, None);
    assert_eq!(w.newer_cursor, None);
    assert_eq!(w.live_overlay.unwrap().blocks.len(), 1);
}

// TL-12: a place further back gives a page in the past, and newer loads join it.
#[test]
fn a_page_in_the_past_has_no_overlay_and_newer_loads_join_without_gap() {
    let (s, t) = (session(), main_target());
    let mut store = store_with_live(vec![live("live-now", 9_999, "run-1")]);
    let mut source = filled(codex_source(), 200);
    let token = link_token(None, reply("h-30"));
    let w = anchored(
        &mut store,
        &mut source,
        target(&s, &t),
        &Anchor::Link { token },
    )
    .unwrap();
    assert_eq!(w.blocks.len(), 40);
    assert_eq!(w.anchor_row, Some(reply("h-30")));
    assert!(w.blocks.iter().any(|b| b.key() == reply("h-30")));
    assert!(
        w.live_overlay.is_none(),
        "a page in the past carries no overlay rows"
    );
    let mut seen: Vec<String> = ids(&w.blocks);
    let mut next = w.newer_cursor.clone().unwrap();
    let mut loads = 0;
    loop {
        let anchor = Anchor::Newer {
            token: next.clone(),
        };
        let w = anchored(&mut store, &mut source, target(&s, &t), &anchor).unwrap();
        assert!(w.blocks.len() <= 40);
        seen.extend(ids(&w.blocks));
        loads += 1;
        match w.newer_cursor {
            Some(c) => {
                assert!(w.live_overlay.is_none());
                next = c;
            }
            None => {
                assert_eq!(
                    w.live_overlay.unwrap().blocks.len(),
                    1,
                    "the present brings the overlay"
                );
                break;
            }
        }
        assert!(loads < 10);
    }
    let first: usize = seen[0].trim_start_matches("h-").parse().unwrap();
    let expected: Vec<String> = (first..200).map(|i| format!("h-{i}")).collect();
    assert_eq!(seen, expected, "no gap, no overlap");
}

// TL-12: a row that is only live has no saved place; notices say which kind.
#[test]
fn a_place_that_is_not_saved_gives_the_notice_of_its_anchor_kind() {
    let (s, t) = (session(), main_target());
    let mut store = store_with_live(vec![live("only-live", 9_999, "run-1")]);
    let mut source = filled(claude_source(), 60);
    let token = link_token(Some(s.as_str()), reply("only-live"));
    let w = anchored(
        &mut store,
        &mut source,
        target(&s, &t),
        &Anchor::Link { token },
    )
    .unwrap();
    assert_eq!(w.anchor_row, None);
    assert_eq!(w.anchor_notice.as_deref(), Some(MESSAGE_NOT_SAVED_NOTICE));
    assert_eq!(w.blocks.len(), 40);
    let w = anchored(
        &mut store,
        &mut source,
        target(&s, &t),
        &Anchor::row(&reply("gone")),
    )
    .unwrap();
    assert_eq!(w.anchor_notice.as_deref(), Some(ROW_NOT_SAVED_NOTICE));
}

// TL-11: a link of another session or thread, a forged token, a newer token of another
// target.
#[test]
fn anchors_that_do_not_belong_to_the_target_are_invalid() {
    let (s, t) = (session(), main_target());
    let mut store = MemoryOverlayStore::new();
    let mut source = filled(claude_source(), 60);
    let other = link_token(Some("other"), reply("h-1"));
    let e = anchored(
        &mut store,
        &mut source,
        target(&s, &t),
        &Anchor::Link { token: other },
    )
    .unwrap_err();
    assert_eq!(e, WindowError::Anchor(AnchorError::Invalid));
    assert_eq!(
        e.to_string(),
        "The timeline anchor is invalid; reload the timeline"
    );
    let forged = AnchorToken::Link(LinkPlace {
        app_session_id: None,
        thread_id: None,
        row: reply("h-1"),
    })
    .encode(&timeline_core::seal::HostKey::from_bytes([0; 32]));
    let e = anchored(
        &mut store,
        &mut source,
        target(&s, &t),
        &Anchor::Link { token: forged },
    )
    .unwrap_err();
    assert_eq!(e, WindowError::Anchor(AnchorError::Invalid));
    let e = anchored(
        &mut store,
        &mut source,
        target(&s, &t),
        &Anchor::Newer { token: "".into() },
    )
    .unwrap_err();
    assert!(matches!(
        e,
        WindowError::Anchor(AnchorError::InvalidParams(_))
    ));
    // A newer token written for another target.
    let thread = TargetId::new("thread-7").unwrap();
    let w = anchored(
        &mut store,
        &mut source,
        target(&s, &thread),
        &Anchor::row(&reply("h-2")),
    )
    .unwrap();
    let newer = w.newer_cursor.unwrap();
    let e = anchored(
        &mut store,
        &mut source,
        target(&s, &t),
        &Anchor::Newer { token: newer },
    )
    .unwrap_err();
    assert_eq!(e, WindowError::Anchor(AnchorError::Invalid));
}

// OV-05, TL-13: the 8 MiB cap, exactly at the limit and one byte past it.
#[test]
fn reconcile_allows_exactly_8_mib_and_refuses_one_byte_more() {
    let mut store = MemoryOverlayStore::new();
    let mut source = filled(claude_source(), 2);
    let call = |store: &mut MemoryOverlayStore,
                source: &mut overlay_core::source::MemorySource,
                pad: usize| {
        let req = ReconcileSession {
            session: session(),
            target: main_target(),
            source,
            outbox: vec![serde_json::json!({ "text": "x".repeat(pad) })],
            active_run: None,
        };
        reconcile_sessions(store, &host_key(), vec![req])
    };
    let base = call(&mut store, &mut source, 0).unwrap();
    // The answer is `{"sessions":[` + snapshot + `]}`.
    let base_bytes = 14 + serde_json::to_vec(&base.sessions[0]).unwrap().len() + 1;
    let cap = timeline_core::policy::RESPONSE_CAP_BYTES;
    assert!(call(&mut store, &mut source, cap - base_bytes).is_ok());
    assert_eq!(
        call(&mut store, &mut source, cap - base_bytes + 1).map_err(|e| e.error),
        Err(WindowError::TooLarge { bytes: cap + 1 })
    );
}

// OV-05, TL-13: the 8 MiB cap counts the overlay exactly (its rows' sizes are counted
// once and kept with the rows, not serialized again per window): a latest window whose
// overlay brings it to exactly 8 MiB is answered, again and again; one byte more in one
// row (a new version of that row only) is refused with the exact size.
#[test]
fn a_latest_window_counts_its_overlay_exactly_against_8_mib() {
    let (s, t) = (session(), main_target());
    let cap = timeline_core::policy::RESPONSE_CAP_BYTES;
    let padded = |pad: usize| {
        let mut row = live("pad", 5_000, "run-1");
        row.block.data = serde_json::json!({ "text": "x".repeat(pad) });
        row
    };
    let mut rows: Vec<StoredBlock> = (0..200)
        .map(|i| {
            let mut row = live(&format!("r{i}"), 3_000 + i, "run-1");
            row.block.data = serde_json::json!({ "text": format!("row {i} \"quoted\" é\n") });
            row
        })
        .collect();
    rows.push(padded(0));
    let mut store = store_with_live(rows);
    let mut source = filled(claude_source(), 30);
    let base = latest_window(&mut store, &mut source, &host_key(), target(&s, &t), 12).unwrap();
    let base_bytes = serde_json::to_vec(&base.window).unwrap().len();
    let publish = |store: &mut MemoryOverlayStore, pad: usize| {
        write(store, &s, &t, &Change::Publish(vec![padded(pad)])).unwrap();
    };
    publish(&mut store, cap - base_bytes);
    for _ in 0..2 {
        let at_cap =
            latest_window(&mut store, &mut source, &host_key(), target(&s, &t), 12).unwrap();
        assert_eq!(serde_json::to_vec(&at_cap.window).unwrap().len(), cap);
        assert_eq!(at_cap.window.live_overlay.unwrap().blocks.len(), 201);
    }
    publish(&mut store, cap - base_bytes + 1);
    let failed =
        latest_window(&mut store, &mut source, &host_key(), target(&s, &t), 12).unwrap_err();
    assert_eq!(failed.error, WindowError::TooLarge { bytes: cap + 1 });
    assert!(failed.written.is_empty(), "the window settled nothing");
}

// TL-12: a newer load resumes at the page it follows: one source read wherever that
// page is, never a scan back from the present.
#[test]
fn a_newer_load_reads_forward_from_its_page_not_back_from_the_present() {
    let (s, t) = (session(), main_target());
    let mut store = store_with_live(vec![live("live-now", 99_999, "run-1")]);
    let mut source = filled(codex_source(), 5_000);
    let w = anchored(
        &mut store,
        &mut source,
        target(&s, &t),
        &Anchor::row(&reply("h-100")),
    )
    .unwrap();
    let mut next = w.newer_cursor.unwrap();
    let mut last = w.blocks.last().unwrap().id.as_str().to_owned();
    for _ in 0..3 {
        source.reads = 0;
        let w = anchored(
            &mut store,
            &mut source,
            target(&s, &t),
            &Anchor::Newer { token: next },
        )
        .unwrap();
        assert_eq!(source.reads, 1, "one read of the 40 items after the page");
        let n: usize = last.trim_start_matches("h-").parse().unwrap();
        assert_eq!(
            w.blocks.first().unwrap().id.as_str(),
            format!("h-{}", n + 1)
        );
        assert_eq!(w.blocks.len(), 40);
        last = w.blocks.last().unwrap().id.as_str().to_owned();
        next = w.newer_cursor.unwrap();
    }
}

/// A source that reads only backwards: its newer reads are the provided method's.
struct Backwards(MemorySource);

impl HistorySource for Backwards {
    fn kind(&self) -> SourceKind {
        self.0.kind()
    }

    fn boundary_token(&self) -> BoundaryToken {
        self.0.boundary_token()
    }

    fn read(
        &mut self,
        before: Option<&SourcePosition>,
        limit: usize,
    ) -> Result<SourcePage, SourceError> {
        self.0.read(before, limit)
    }
}

/// What a model source holds or a read gives: (position, row IDs) per item.
type Items = Vec<(SourcePosition, Vec<String>)>;

/// A memory source of `rows` rows per item with the items at `removed` taken out, and
/// the model of what it holds (oldest first), and the positions gone.
fn source_and_model(
    rows: &[u8],
    removed: &[prop::sample::Index],
) -> (MemorySource, Items, Vec<SourcePosition>) {
    let mut source = claude_source();
    let mut model = Vec::new();
    for (i, &n) in rows.iter().enumerate() {
        let ids: Vec<String> = (0..n).map(|j| format!("r-{i}-{j}")).collect();
        let blocks = ids.iter().map(|id| saved(id, i as u64, i as u64)).collect();
        model.push((source.push(blocks), ids));
    }
    let mut gone = Vec::new();
    for r in removed {
        if model.is_empty() {
            break;
        }
        let at = r.index(model.len());
        let (position, _) = model.remove(at);
        assert!(source.remove(&position));
        gone.push(position);
    }
    (source, model, gone)
}

fn page_of(items: &[(SourcePosition, Vec<String>)], more: bool) -> (Items, bool) {
    (items.to_vec(), more)
}

fn seen(page: SourcePage) -> (Items, bool) {
    let items = page
        .items
        .into_iter()
        .map(|i| {
            let ids = i.blocks.iter().map(|b| b.id.as_str().to_owned()).collect();
            (i.position, ids)
        })
        .collect();
    (items, page.more)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fixtures::proptest_cases()))]

    // TL-09, TL-12: the memory source reads what a linear search of its items gives,
    // after any removals; a removed position is gone both ways.
    #[test]
    fn memory_source_reads_match_a_linear_model(
        rows in prop::collection::vec(0u8..3, 0..60),
        removed in prop::collection::vec(any::<prop::sample::Index>(), 0..10),
        limit in 0usize..50,
    ) {
        let (mut source, model, gone) = source_and_model(&rows, &removed);
        let newest_first: Vec<_> = model.iter().rev().cloned().collect();
        let start = model.len().saturating_sub(limit);
        prop_assert_eq!(
            seen(source.read(None, limit).unwrap()),
            page_of(&newest_first[..model.len() - start], start > 0)
        );
        for (at, (position, _)) in model.iter().enumerate() {
            let start = at.saturating_sub(limit);
            let older: Vec<_> = model[start..at].iter().rev().cloned().collect();
            prop_assert_eq!(
                seen(source.read(Some(position), limit).unwrap()),
                page_of(&older, start > 0)
            );
            let end = (at + 1 + limit).min(model.len());
            prop_assert_eq!(
                seen(source.read_newer(position, limit).unwrap()),
                page_of(&model[at + 1..end], end < model.len())
            );
        }
        for position in gone {
            prop_assert_eq!(source.read(Some(&position), limit), Err(SourceError::PositionGone));
            prop_assert_eq!(source.read_newer(&position, limit), Err(SourceError::PositionGone));
        }
    }

    // TL-12: a source that reads only backwards gets, from the provided `read_newer`,
    // exactly what a source that reads forward answers.
    #[test]
    fn the_provided_newer_read_answers_what_a_forward_read_answers(
        rows in prop::collection::vec(0u8..3, 0..60),
        removed in prop::collection::vec(any::<prop::sample::Index>(), 0..10),
        limit in 0usize..50,
    ) {
        let (source, model, gone) = source_and_model(&rows, &removed);
        let mut backwards = Backwards(source.clone());
        let mut forward = source;
        for (position, _) in model.iter() {
            prop_assert_eq!(
                backwards.read_newer(position, limit),
                forward.read_newer(position, limit)
            );
        }
        for position in gone.iter().chain([&SourcePosition("elsewhere".into())]) {
            prop_assert_eq!(
                backwards.read_newer(position, limit),
                Err(SourceError::PositionGone)
            );
        }
    }
}

/// Where a latest window stands toward the run that wrote an ephemeral row.
#[derive(Clone, Copy, Debug)]
enum Situation {
    /// The session has no current run.
    NoCurrentRun,
    /// The row's own run (`run-1`) is the current run.
    OwnRunCurrent,
    /// Another run (`run-2`) is the current run.
    OtherRunCurrent,
}

const SITUATIONS: [Situation; 3] = [
    Situation::NoCurrentRun,
    Situation::OwnRunCurrent,
    Situation::OtherRunCurrent,
];

impl Situation {
    fn current_run(self) -> Option<RunId> {
        match self {
            Situation::NoCurrentRun => None,
            Situation::OwnRunCurrent => Some(run("run-1")),
            Situation::OtherRunCurrent => Some(run("run-2")),
        }
    }
}

/// True when a latest window in `situation` keeps `row` (written by `run-1`, beside an
/// ordinary live row of the same run that history does not hold). Checks on the way that
/// the answer's overlay is what the store holds, that the row's leaving never raises the
/// epoch, and that [`leaves_latest_window`] says the same.
fn window_keeps(row: StoredBlock, situation: Situation) -> bool {
    let (s, t) = (session(), main_target());
    let current = situation.current_run();
    let key = row.block.key();
    let leaves = leaves_latest_window(&row, current.as_ref());
    let mut store = store_with_live(vec![live("b", 2_001, "run-1"), row]);
    let mut source = filled(claude_source(), 3);
    let built = latest_window(
        &mut store,
        &mut source,
        &host_key(),
        Target {
            session: &s,
            target: &t,
            current_run: current.as_ref(),
        },
        12,
    )
    .unwrap();
    let overlay = built.window.live_overlay.unwrap();
    let stored = store.load(&s, &t).unwrap().unwrap();
    assert_eq!(overlay, stored.client_form(), "{situation:?}");
    assert_eq!(overlay.settlement_epoch, 0, "ephemeral rows never raise it");
    assert!(overlay.blocks.iter().any(|b| b.key() == reply("b")));
    let kept = overlay.blocks.iter().any(|b| b.key() == key);
    assert_eq!(kept, !leaves, "{situation:?}: leaves_latest_window agrees");
    assert_eq!(
        built.settled.is_some(),
        !kept,
        "{situation:?}: a write iff it left"
    );
    kept
}

fn kept_by_situation(class: RowClass, id: &str) -> Vec<(&'static str, bool)> {
    SITUATIONS
        .iter()
        .map(|&situation| {
            let name = match situation {
                Situation::NoCurrentRun => "no current run",
                Situation::OwnRunCurrent => "its own run current",
                Situation::OtherRunCurrent => "another run current",
            };
            (name, window_keeps(ephemeral(id, class, "run-1"), situation))
        })
        .collect()
}

// OV-03, OV-05. The seed's table, status row: "A latest window drops it when another run
// is the current run." With no current run, no other run is current: it stays.
#[test]
fn a_latest_window_drops_a_status_row_only_when_another_run_is_current() {
    assert_eq!(
        kept_by_situation(RowClass::Status, "thinking-run-1"),
        [
            ("no current run", true),
            ("its own run current", true),
            ("another run current", false),
        ]
    );
}

// OV-03, OV-05. The seed's table, context-compacting marker: "A latest window drops it
// when its run is not the current run." With no current run, its run is not current.
#[test]
fn a_latest_window_drops_a_compacting_marker_whenever_its_run_is_not_current() {
    assert_eq!(
        kept_by_situation(RowClass::CompactingMarker, "compacting-run-1"),
        [
            ("no current run", false),
            ("its own run current", true),
            ("another run current", false),
        ]
    );
}

// OV-03, OV-05. The seed's table, parent progress mirror: "A latest window drops it when
// another run is the current run." With no current run, no other run is current.
#[test]
fn a_latest_window_drops_a_progress_mirror_only_when_another_run_is_current() {
    assert_eq!(
        kept_by_situation(RowClass::ProgressMirror, "mirror-run-1"),
        [
            ("no current run", true),
            ("its own run current", true),
            ("another run current", false),
        ]
    );
}

// OV-03, OV-05. The seed's table, approval card: "It stays with its decision." Only the
// Codex cleanup after a run removes it, never a latest window.
#[test]
fn a_latest_window_keeps_an_approval_card_in_every_situation() {
    assert_eq!(
        kept_by_situation(RowClass::ApprovalCard, "approval:1"),
        [
            ("no current run", true),
            ("its own run current", true),
            ("another run current", true),
        ]
    );
}

/// A main-target overlay with every ephemeral class of `run-1`, an ordinary row `a` that
/// the page of [`settling_source`] holds, and an ordinary row `b` it does not hold.
fn settling_store() -> MemoryOverlayStore {
    store_with_live(vec![
        live("a", 2_000, "run-1"),
        live("b", 2_001, "run-1"),
        ephemeral("thinking-run-1", RowClass::Status, "run-1"),
        ephemeral("compacting-run-1", RowClass::CompactingMarker, "run-1"),
        ephemeral("mirror-run-1", RowClass::ProgressMirror, "run-1"),
        ephemeral("approval:1", RowClass::ApprovalCard, "run-1"),
    ])
}

/// Three history rows, then `a` saved.
fn settling_source() -> MemorySource {
    let mut source = filled(claude_source(), 3);
    source.push(vec![saved("a", 2_000, 3)]);
    source
}

fn no_run<'a>(s: &'a SessionId, t: &'a TargetId) -> Target<'a> {
    Target {
        session: s,
        target: t,
        current_run: None,
    }
}

// OV-03, OV-04, OV-05: with no current run, one window settles `a` (epoch + 1), drops the
// compacting marker ("when its run is not the current run"), and keeps the status row,
// the mirror ("only when another run is the current run") and the card; the answer and
// the snapshot for the live sinks are what the store holds. An ephemeral row whose key
// the page holds leaves too, without raising the epoch.
#[test]
fn with_no_current_run_a_window_settles_and_drops_only_the_compacting_marker() {
    let (s, t) = (session(), main_target());
    let mut store = settling_store();
    let mut source = settling_source();
    let built = latest_window(&mut store, &mut source, &host_key(), no_run(&s, &t), 12).unwrap();
    let overlay = built.window.live_overlay.unwrap();
    let mut left = ids(&overlay.blocks);
    left.sort();
    assert_eq!(left, ["approval:1", "b", "mirror-run-1", "thinking-run-1"]);
    assert_eq!(overlay.settlement_epoch, 1);
    let stored = store.load(&s, &t).unwrap().unwrap();
    assert_eq!(built.settled, Some(stored.clone()));
    assert_eq!(overlay, stored.client_form());
    assert_eq!(built.window.window_revision, stored.revision);

    // History now holds the card's key: it leaves, and the epoch stays.
    let card = BlockKey::parse(BlockType::Activity, "approval:1").unwrap();
    source.push(vec![Block::new(card, Millis(3_000))]);
    let built = latest_window(&mut store, &mut source, &host_key(), no_run(&s, &t), 12).unwrap();
    let overlay = built.window.live_overlay.unwrap();
    let mut left = ids(&overlay.blocks);
    left.sort();
    assert_eq!(left, ["b", "mirror-run-1", "thinking-run-1"]);
    assert_eq!(overlay.settlement_epoch, 1);
}

/// A store that fails every `update` after the first `ok` ones (and then every read of
/// the counter too, with `and_counter`).
fn fail_after(
    inner: MemoryOverlayStore,
    ok: u64,
    and_counter: bool,
) -> FailingOverlay<MemoryOverlayStore> {
    let store = FailingOverlay::new(inner);
    store.with_plan(|p| {
        p.only = if and_counter {
            vec!["update", "current_revision"]
        } else {
            vec!["update"]
        };
        p.pass_writes = ok;
        p.writes_off = true;
        p.reads_off = true;
    });
    store
}

/// Checks that `failed` carries exactly the overlays `store` holds for `targets`, in
/// that order, each with `epoch`.
fn assert_saved(
    failed: &BuildError,
    store: &mut MemoryOverlayStore,
    targets: &[(SessionId, TargetId)],
    epoch: u64,
) {
    let expected: Vec<_> = targets
        .iter()
        .map(|(s, t)| (s.clone(), t.clone(), store.load(s, t).unwrap().unwrap()))
        .collect();
    assert_eq!(
        failed.written, expected,
        "what comes back is what is stored"
    );
    assert!(failed.written.iter().all(|w| w.2.settlement_epoch == epoch));
}

// OV-04, OV-05: the settlement write raised the epoch, then the store failed (on the
// retraction of the compacting marker, or on the counter read after it): the saved
// snapshot comes back with the error, for the live sinks ("the producer saves first and
// sends the saved snapshot").
#[test]
fn a_latest_window_that_fails_after_settling_returns_the_saved_snapshot() {
    let (s, t) = (session(), main_target());
    let mut store = fail_after(settling_store(), 1, true);
    let mut source = settling_source();
    let failed =
        latest_window(&mut store, &mut source, &host_key(), no_run(&s, &t), 12).unwrap_err();
    assert!(matches!(
        failed.error,
        WindowError::Store(OverlayError::Unavailable(_))
    ));
    assert_eq!(failed.error_code(), "HISTORY_UNAVAILABLE");
    assert!(failed.to_string().contains("injected failure of"));
    assert_saved(&failed, &mut store.inner, &[(s, t)], 1);
}

/// A live row of `run-1` carrying `bytes` of text.
fn big_live(id: &str, bytes: usize) -> StoredBlock {
    let mut row = live(id, 2_002, "run-1");
    row.block = row
        .block
        .with_data(serde_json::json!({ "text": "x".repeat(bytes) }));
    row
}

// OV-05, TL-13: the settlement raised the epoch, then the answer passed 8 MiB: the size
// error comes back with the saved snapshot.
#[test]
fn a_latest_window_past_8_mib_after_settling_returns_the_saved_snapshot() {
    let (s, t) = (session(), main_target());
    let cap = timeline_core::policy::RESPONSE_CAP_BYTES;
    let mut store = store_with_live(vec![live("a", 2_000, "run-1"), big_live("big", cap)]);
    let mut source = settling_source();
    let failed =
        latest_window(&mut store, &mut source, &host_key(), no_run(&s, &t), 12).unwrap_err();
    assert!(matches!(failed.error, WindowError::TooLarge { .. }));
    assert_saved(&failed, &mut store, &[(s, t)], 1);
}

/// The main target of `s-<i>`, with ordinary rows `a` (saved in [`settling_source`])
/// and `b` of `run-1`.
fn reconcile_target(store: &mut impl OverlayStore, i: usize) -> (SessionId, TargetId) {
    let s = SessionId::new(format!("s-{i}")).unwrap();
    let t = TargetId::main(&s);
    write(
        store,
        &s,
        &t,
        &Change::Publish(vec![live("a", 2_000, "run-1"), live("b", 2_001, "run-1")]),
    )
    .unwrap();
    (s, t)
}

fn reconcile_request<'a>(
    (s, t): &(SessionId, TargetId),
    source: &'a mut MemorySource,
    outbox_bytes: usize,
) -> ReconcileSession<'a> {
    ReconcileSession {
        session: s.clone(),
        target: t.clone(),
        source,
        outbox: vec![serde_json::json!({ "text": "x".repeat(outbox_bytes) })],
        active_run: Some(run("run-1")),
    }
}

// OV-05: the first session settled (epoch raised), the store failed on the second: the
// first session's snapshot comes back with the error.
#[test]
fn a_reconcile_that_fails_on_a_later_session_returns_the_earlier_settlements() {
    let mut inner = MemoryOverlayStore::new();
    let targets: Vec<_> = (0..2).map(|i| reconcile_target(&mut inner, i)).collect();
    let mut store = fail_after(inner, 1, false);
    let mut sources = [settling_source(), settling_source()];
    let [first, second] = &mut sources;
    let reqs = vec![
        reconcile_request(&targets[0], first, 1),
        reconcile_request(&targets[1], second, 1),
    ];
    let failed = reconcile_sessions(&mut store, &host_key(), reqs).unwrap_err();
    assert!(matches!(failed.error, WindowError::Store(_)));
    assert_saved(&failed, &mut store.inner, &targets[..1], 1);
    // The second session was not settled.
    let (s, t) = &targets[1];
    assert_eq!(store.inner.load(s, t).unwrap().unwrap().settlement_epoch, 0);
}

// OV-05, TL-13: both sessions settled, then the second one's outbox passed the 8 MiB cap:
// the size error comes back with both saved snapshots, in request order.
#[test]
fn a_reconcile_past_8_mib_returns_every_settlement_it_saved() {
    let mut store = MemoryOverlayStore::new();
    let targets: Vec<_> = (0..2).map(|i| reconcile_target(&mut store, i)).collect();
    let mut sources = [settling_source(), settling_source()];
    let [first, second] = &mut sources;
    let cap = timeline_core::policy::RESPONSE_CAP_BYTES;
    let reqs = vec![
        reconcile_request(&targets[0], first, 1),
        reconcile_request(&targets[1], second, cap),
    ];
    let failed = reconcile_sessions(&mut store, &host_key(), reqs).unwrap_err();
    assert!(matches!(failed.error, WindowError::TooLarge { .. }));
    assert_eq!(failed.error_code(), "TIMELINE_SNAPSHOT_TOO_LARGE");
    assert_saved(&failed, &mut store, &targets, 1);
}

// OV-05: refused parameters fail before any write, with nothing saved.
#[test]
fn a_refused_reconcile_saves_nothing() {
    let mut store = MemoryOverlayStore::new();
    let target = reconcile_target(&mut store, 0);
    let mut source = settling_source();
    let mut req = reconcile_request(&target, &mut source, 1);
    req.outbox = vec![serde_json::json!({}); 257];
    let failed = reconcile_sessions(&mut store, &host_key(), vec![req]).unwrap_err();
    assert!(matches!(failed.error, WindowError::InvalidParams(_)));
    assert!(failed.written.is_empty());
    let (s, t) = &target;
    assert_eq!(store.load(s, t).unwrap().unwrap().settlement_epoch, 0);
}
