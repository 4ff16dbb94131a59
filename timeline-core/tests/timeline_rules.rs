//! One named test per rule branch of the client timeline.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use fixtures::sim_host::SimHost;
use timeline_core::anchor::{Anchor, AnchorError};
use timeline_core::block::{Block, CommandOutput, CommandRowData};
use timeline_core::key::{BlockKey, BlockType};
use timeline_core::order::SourceOrder;
use timeline_core::policy::{
    ANCHORED_PAGE_SIZE, INITIAL_LOAD_MAX_RETRIES, INITIAL_LOAD_TIMEOUT, OLDER_PAGE_SIZE,
    PAGINATED_LOAD_TIMEOUT,
};
use timeline_core::time::Millis;
use timeline_core::timeline::{
    ClientMode, DropReason, IgnoreReason, LoadFailure, LoadReason, LoadState, Origin, Outcome,
    PendingSend, RequestTag, Timeline, TimelineEffect,
};
use timeline_core::wire::{LiveOverlay, LivePatch, OlderPage, ResponseError, TimelineWindow};

fn pending(id: &str, at: u64) -> PendingSend {
    PendingSend {
        operation_id: op(id),
        created_at: Millis(at),
        data: serde_json::json!({ "text": "run it again" }),
    }
}

// TL-02
#[test]
fn history_copy_wins_over_live_copy() {
    let mut l = live("item-9", 5, 1);
    l.data = serde_json::json!({"text": "streaming"});
    let t = opened(
        ClientMode::Phone,
        window(
            vec![hist("item-9", 5)],
            overlay(1, 2, vec![l, live("item-10", 6, 2)]),
        ),
    );
    assert_eq!(
        ids(&t),
        [
            (Origin::History, "item-9".into()),
            (Origin::Live, "item-10".into())
        ]
    );
    assert_eq!(
        t.row(&reply("item-9")).unwrap().block.data,
        serde_json::Value::Null
    );
}

// TL-03
#[test]
fn equal_text_sends_are_two_rows_and_an_echo_hides_when_a_row_carries_its_operation() {
    let mut t = opened(ClientMode::Phone, window(vec![], overlay(1, 1, vec![])));
    t.add_pending(pending("op-41", 10));
    t.add_pending(pending("op-42", 10));
    assert_eq!(t.len(), 2, "same text, different operation IDs");
    assert_eq!(t.add_pending(pending("op-41", 10)), Outcome::Unchanged);
    // A live row under a different key that carries op-41 hides its echo.
    let carrier =
        Block::new(key(BlockType::User, "codex-item-3"), Millis(11)).with_operation(op("op-41"));
    let target = target("s");
    t.handle_live_update(&target, overlay(1, 2, vec![carrier]), Millis(2));
    let rows = ids(&t);
    assert_eq!(
        rows,
        [
            (Origin::Pending, "user-message::op-42".into()),
            (Origin::Live, "codex-item-3".into()),
        ]
    );
    assert_eq!(t.confirm_pending(&op("op-42")), Outcome::Applied);
    assert_eq!(t.is_pending_confirmed(&op("op-42")), Some(true));
    assert_eq!(t.remove_pending(&op("op-42")), Outcome::Applied);
    assert_eq!(t.len(), 1);
}

// TL-06
#[test]
fn a_higher_revision_replaces_the_whole_overlay_and_a_lower_one_is_ignored() {
    let mut t = opened(
        ClientMode::Phone,
        window(
            vec![],
            overlay(3, 10, vec![live("a", 1, 1), live("b", 2, 2)]),
        ),
    );
    let s = target("s");
    assert_eq!(
        t.handle_live_update(&s, overlay(3, 11, vec![live("c", 3, 3)]), Millis(2)),
        Outcome::Applied
    );
    assert_eq!(ids(&t), [(Origin::Live, "c".into())]);
    assert_eq!(
        t.handle_live_update(&s, overlay(3, 9, vec![live("a", 1, 1)]), Millis(2)),
        Outcome::Ignored(IgnoreReason::StaleRevision)
    );
    assert_eq!(
        t.handle_live_update(&s, overlay(2, 99, vec![]), Millis(2)),
        Outcome::Ignored(IgnoreReason::StaleEpoch)
    );
    // Within the epoch, an empty higher revision clears the overlay.
    assert_eq!(
        t.handle_live_update(&s, overlay(3, 12, vec![]), Millis(2)),
        Outcome::Applied
    );
    assert!(t.is_empty());
    assert!(effects(&mut t).is_empty());
}

// TL-06
#[test]
fn the_same_revision_is_a_no_op_with_the_same_rows_and_a_reload_with_other_rows() {
    let mut t = opened(
        ClientMode::Phone,
        window(vec![], overlay(3, 10, vec![live("a", 1, 1)])),
    );
    let s = target("s");
    assert_eq!(
        t.handle_live_update(&s, overlay(3, 10, vec![live("a", 1, 1)]), Millis(2)),
        Outcome::Unchanged
    );
    assert_eq!(
        t.handle_live_update(&s, overlay(3, 10, vec![live("z", 1, 1)]), Millis(2)),
        Outcome::ReloadRequired(LoadReason::RevisionConflict)
    );
    assert_eq!(ids(&t), [(Origin::Live, "a".into())], "rows kept");
    let e = effects(&mut t);
    assert!(matches!(
        e.as_slice(),
        [TimelineEffect::LoadLatestWindow {
            reason: LoadReason::RevisionConflict,
            ..
        }]
    ));
}

// TL-06
#[test]
fn a_higher_epoch_comes_only_from_a_latest_window() {
    let mut t = opened(
        ClientMode::Phone,
        window(vec![], overlay(3, 10, vec![live("a", 1, 1)])),
    );
    let s = target("s");
    assert_eq!(
        t.handle_live_update(&s, overlay(4, 11, vec![]), Millis(2)),
        Outcome::ReloadRequired(LoadReason::EpochAdvanced)
    );
    assert_eq!(ids(&t), [(Origin::Live, "a".into())], "rows kept");
    // A second refused update does not ask again while the reload is on its way.
    t.handle_live_update(&s, overlay(4, 12, vec![]), Millis(3));
    let e = effects(&mut t);
    assert_eq!(e.len(), 1);
    let tag = latest_tag(&e);
    let w = window(vec![hist("a", 1)], overlay(4, 11, vec![]));
    assert_eq!(
        t.handle_latest_window(&tag, Ok(w), Millis(4)),
        Outcome::Applied
    );
    // The window takes epoch 4; the update of revision 12 that came while it was on its
    // way is newer in that epoch, so it applies too (never behind a version offered).
    assert_eq!(t.overlay_version(), Some((4, 12)));
    assert_eq!(ids(&t), [(Origin::History, "a".into())]);
    assert!(effects(&mut t).is_empty(), "caught up: no reload");
}

// TL-06
#[test]
fn a_live_update_before_any_window_or_for_another_target_is_ignored() {
    let mut t = Timeline::new(ClientMode::Desktop);
    t.open_target(target("s"), Millis(0));
    assert_eq!(
        t.handle_live_update(&target("s"), overlay(1, 1, vec![]), Millis(0)),
        Outcome::Ignored(IgnoreReason::NotLoaded)
    );
    assert_eq!(
        t.handle_live_update(&target("other"), overlay(1, 1, vec![]), Millis(0)),
        Outcome::Ignored(IgnoreReason::StaleTarget)
    );
}

// TL-06: malformed numbers are a typed error, rows kept.
#[test]
fn an_overlay_past_the_exact_integer_range_is_malformed() {
    let mut t = opened(
        ClientMode::Phone,
        window(vec![], overlay(1, 1, vec![live("a", 1, 1)])),
    );
    let out = t.handle_live_update(
        &target("s"),
        overlay(1, 9_007_199_254_740_992, vec![]),
        Millis(1),
    );
    assert_eq!(
        out,
        Outcome::Failed(LoadFailure::Malformed(ResponseError::NumberOutOfRange(
            "revision"
        )))
    );
    assert_eq!(t.len(), 1);
    assert_eq!(
        t.handle_live_update(
            &target("s"),
            overlay(1, 9_007_199_254_740_991, vec![]),
            Millis(1)
        ),
        Outcome::Applied
    );
}

// TL-07
#[test]
fn a_latest_window_settles_in_one_step() {
    let mut t = opened(
        ClientMode::Phone,
        window(vec![], overlay(1, 5, vec![live("a", 1, 1)])),
    );
    t.reload(Millis(2));
    let tag = latest_tag(&effects(&mut t));
    // The window holds A in history and an overlay without A, one epoch higher.
    let w = window(vec![hist("a", 1)], overlay(2, 6, vec![live("b", 2, 2)]));
    assert_eq!(
        t.handle_latest_window(&tag, Ok(w), Millis(3)),
        Outcome::Applied
    );
    assert_eq!(
        ids(&t),
        [(Origin::History, "a".into()), (Origin::Live, "b".into())]
    );
}

fn older_page(blocks: Vec<Block>, seam: &str, rev: u64, next: Option<&str>) -> OlderPage {
    let keys: Vec<_> = blocks.iter().map(Block::key).collect();
    OlderPage {
        ordered_block_keys: keys.into_iter().chain([reply(seam)]).collect(),
        blocks,
        boundary_block_keys: vec![reply(seam)],
        window_revision: rev,
        oldest_cursor: next.map(str::to_owned),
        reload_required: false,
    }
}

fn paged(mode: ClientMode) -> Timeline {
    let mut w = window(
        vec![hist("item-120", 120), hist("item-121", 121)],
        overlay(1, 1, vec![]),
    );
    w.oldest_cursor = Some("cursor-120".into());
    w.window_revision = 1;
    opened(mode, w)
}

fn older_tag(t: &mut Timeline) -> timeline_core::timeline::RequestTag {
    assert!(t.load_older(Millis(10)));
    match effects(t).as_slice() {
        [TimelineEffect::LoadOlderPage {
            tag,
            page_size,
            cursor,
            ..
        }] => {
            assert_eq!(*page_size, OLDER_PAGE_SIZE);
            assert_eq!(cursor, "cursor-120");
            tag.clone()
        }
        other => panic!("{other:?}"),
    }
}

// TL-08
#[test]
fn an_older_page_splices_above_its_seam_and_moves_the_cursor() {
    let mut t = paged(ClientMode::Phone);
    let tag = older_tag(&mut t);
    let page = older_page(
        vec![
            hist("item-117", 117),
            hist("item-118", 118),
            hist("item-119", 119),
        ],
        "item-120",
        2,
        Some("cursor-117"),
    );
    assert_eq!(
        t.handle_older_page(&tag, Ok(page.clone()), Millis(11)),
        Outcome::Applied
    );
    assert_eq!(t.len(), 5);
    assert_eq!(t.oldest_cursor(), Some("cursor-117"));
    assert_eq!(t.window_revision(), 2);
    // The same page again is not waited for.
    assert_eq!(
        t.handle_older_page(&tag, Ok(page), Millis(12)),
        Outcome::Ignored(IgnoreReason::NotInFlight)
    );
}

// TL-08
#[test]
fn a_page_whose_revision_is_not_newer_is_dropped() {
    let mut t = paged(ClientMode::Desktop);
    let tag = older_tag(&mut t);
    let page = older_page(vec![hist("item-119", 119)], "item-120", 1, None);
    assert_eq!(
        t.handle_older_page(&tag, Ok(page), Millis(11)),
        Outcome::Dropped(DropReason::RevisionNotNewer)
    );
    assert_eq!(t.len(), 2);
}

// TL-08
#[test]
fn desktop_stops_paging_from_a_cursor_whose_seam_is_gone() {
    let mut t = paged(ClientMode::Desktop);
    let tag = older_tag(&mut t);
    let page = older_page(vec![hist("item-99", 99)], "item-100", 2, None);
    assert_eq!(
        t.handle_older_page(&tag, Ok(page), Millis(11)),
        Outcome::Dropped(DropReason::SeamMoved)
    );
    assert_eq!(
        effects(&mut t),
        [TimelineEffect::StopPaging {
            cursor: "cursor-120".into()
        }]
    );
    assert_eq!(t.oldest_cursor(), None);
    assert!(!t.load_older(Millis(12)));
}

// TL-08
#[test]
fn phone_reloads_when_the_seam_is_not_the_oldest_row() {
    let mut t = paged(ClientMode::Phone);
    let tag = older_tag(&mut t);
    // The seam item-121 is in the window but not the oldest row: a desktop would
    // accept it, a phone reloads.
    let page = older_page(vec![hist("item-119", 119)], "item-121", 2, None);
    assert_eq!(
        t.handle_older_page(&tag, Ok(page.clone()), Millis(11)),
        Outcome::ReloadRequired(LoadReason::PageDropped)
    );
    assert_eq!(t.len(), 2);
    assert!(matches!(
        effects(&mut t).as_slice(),
        [TimelineEffect::LoadLatestWindow {
            reason: LoadReason::PageDropped,
            ..
        }]
    ));
    let mut d = paged(ClientMode::Desktop);
    let tag = older_tag(&mut d);
    assert_eq!(
        d.handle_older_page(&tag, Ok(page), Millis(11)),
        Outcome::Applied
    );
}

// TL-08, TL-09
#[test]
fn reload_required_reloads_and_a_malformed_page_keeps_rows() {
    let mut t = paged(ClientMode::Desktop);
    let tag = older_tag(&mut t);
    assert_eq!(
        t.handle_older_page(&tag, Ok(OlderPage::reload_required()), Millis(11)),
        Outcome::ReloadRequired(LoadReason::ReloadRequired)
    );
    let mut t = paged(ClientMode::Desktop);
    let tag = older_tag(&mut t);
    let mut bad = older_page(vec![hist("item-119", 119)], "item-120", 2, None);
    bad.ordered_block_keys.reverse();
    assert_eq!(
        t.handle_older_page(&tag, Ok(bad), Millis(11)),
        Outcome::Failed(LoadFailure::Malformed(ResponseError::OrderedKeysMismatch))
    );
    assert_eq!(t.len(), 2);
    // Paging can be tried again.
    assert!(t.load_older(Millis(12)));
}

// TL-12
#[test]
fn an_anchored_load_asks_for_40_rows_and_needs_exactly_one_of_row_and_notice() {
    let mut t = opened(
        ClientMode::Phone,
        window(vec![hist("a", 1)], overlay(1, 1, vec![])),
    );
    assert!(matches!(
        t.load_anchored(Anchor::Link { token: " ".into() }, Millis(1)),
        Err(AnchorError::InvalidParams(_))
    ));
    t.load_anchored(Anchor::row(&reply("a")), Millis(1))
        .unwrap();
    let tag = match effects(&mut t).as_slice() {
        [TimelineEffect::LoadAnchored { tag, page_size, .. }] => {
            assert_eq!(*page_size, ANCHORED_PAGE_SIZE);
            tag.clone()
        }
        other => panic!("{other:?}"),
    };
    let mut both = window(vec![hist("a", 1)], overlay(1, 1, vec![]));
    both.anchor_row = Some(reply("a"));
    both.anchor_notice = Some("This row is not in the saved history.".into());
    assert_eq!(
        t.handle_anchored(&tag, Ok(both), Millis(1)),
        Outcome::Failed(LoadFailure::Malformed(ResponseError::AnchorFields))
    );
    t.load_anchored(Anchor::row(&reply("a")), Millis(1))
        .unwrap();
    let tag = match effects(&mut t).as_slice() {
        [TimelineEffect::LoadAnchored { tag, .. }] => tag.clone(),
        other => panic!("{other:?}"),
    };
    let mut neither = window(vec![hist("a", 1)], overlay(1, 1, vec![]));
    neither.anchor_row = Some(reply("zzz"));
    assert_eq!(
        t.handle_anchored(&tag, Ok(neither), Millis(1)),
        Outcome::Failed(LoadFailure::Malformed(ResponseError::AnchorRowMissing))
    );
}

// TL-13
#[test]
fn an_initial_load_retries_three_times_with_backoff_then_offers_recovery() {
    let mut t = Timeline::new(ClientMode::Phone);
    t.open_target(target("s"), Millis(0));
    let mut tag = latest_tag(&effects(&mut t));
    let mut now = Millis(0);
    for (retry, delay) in [(1, 750), (2, 1500), (3, 3000)] {
        let out = t.handle_latest_window(&tag, Err(LoadFailure::Unavailable), now);
        assert_eq!(out, Outcome::Failed(LoadFailure::Unavailable));
        assert_eq!(t.poll_timeout(), Some(Millis(now.as_u64() + delay)));
        t.handle_timeout(Millis(now.as_u64() + delay - 1));
        assert!(effects(&mut t).is_empty(), "not before the delay");
        now = Millis(now.as_u64() + delay);
        t.handle_timeout(now);
        t.handle_timeout(now); // twice is harmless
        let e = effects(&mut t);
        assert!(
            matches!(e.as_slice(), [TimelineEffect::LoadLatestWindow { reason: LoadReason::Retry(r), .. }] if *r == retry)
        );
        tag = latest_tag(&e);
        assert_eq!(t.load_state(), &LoadState::Loading { retry });
    }
    t.handle_latest_window(&tag, Err(LoadFailure::SnapshotTooLarge), now);
    assert_eq!(
        t.load_state(),
        &LoadState::Failed(LoadFailure::SnapshotTooLarge)
    );
    assert_eq!(t.poll_timeout(), None);
    t.recover(now);
    assert!(matches!(
        effects(&mut t).as_slice(),
        [TimelineEffect::LoadLatestWindow {
            reason: LoadReason::Requested,
            ..
        }]
    ));
}

// TL-13
#[test]
fn loads_time_out_at_115_and_60_seconds() {
    let mut t = Timeline::new(ClientMode::Phone);
    t.open_target(target("s"), Millis(0));
    let tag = latest_tag(&effects(&mut t));
    assert_eq!(t.poll_timeout(), Some(Millis(115_000)));
    t.handle_timeout(Millis(115_000));
    assert_eq!(t.poll_timeout(), Some(Millis(115_750)), "retry scheduled");
    // The late answer is no longer waited for.
    let w = window(vec![], overlay(1, 1, vec![]));
    assert_eq!(
        t.handle_latest_window(&tag, Ok(w), Millis(115_001)),
        Outcome::Ignored(IgnoreReason::NotInFlight)
    );
    let mut t = paged(ClientMode::Desktop);
    assert!(t.load_older(Millis(1_000)));
    let _ = effects(&mut t);
    assert_eq!(t.poll_timeout(), Some(Millis(61_000)));
    t.handle_timeout(Millis(61_000));
    assert!(t.load_older(Millis(61_001)), "paging can start again");
}

// TL-14
#[test]
fn command_rows_carry_a_descriptor_and_the_reducer_never_looks_inside() {
    let data = CommandRowData {
        command: "npm test".into(),
        output: Some(CommandOutput::Artifact {
            artifact_id: "artifact-1".into(),
            byte_length: 52_428_800,
        }),
    };
    let json = serde_json::to_value(&data).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"command": "npm test", "output": {"kind": "artifact", "artifactId": "artifact-1", "byteLength": 52428800}})
    );
    let b = Block::new(key(BlockType::Activity, "cmd-1"), Millis(1)).with_data(json.clone());
    let t = opened(ClientMode::Phone, window(vec![b], overlay(1, 1, vec![])));
    assert_eq!(t.rows().next().unwrap().block.data, json);
    let back: CommandRowData = serde_json::from_value(json).unwrap();
    assert_eq!(back, data);
    let retained: CommandRowData =
        serde_json::from_str(r#"{"command":"ls","output":{"kind":"retained","text":"a\nb"}}"#)
            .unwrap();
    assert_eq!(
        retained.output,
        Some(CommandOutput::Retained {
            text: "a\nb".into()
        })
    );
}

// Unknown fields from a newer peer are ignored; malformed known fields are typed errors.
#[test]
fn unknown_fields_are_ignored_and_malformed_known_fields_fail() {
    let json = r#"{"blocks":[{"type":"user","id":"u1","timestamp":5,"future":1}],
        "boundaryToken":"s","windowRevision":1,"newField":{"x":1},
        "liveOverlay":{"settlementEpoch":1,"revision":2,"blocks":[]}}"#;
    let w = TimelineWindow::from_json(json).unwrap();
    assert_eq!(w.blocks.len(), 1);
    let bad = json.replace("\"timestamp\":5", "\"timestamp\":\"5\"");
    assert!(matches!(
        TimelineWindow::from_json(&bad),
        Err(ResponseError::Decode(_))
    ));
    let dup = r#"{"blocks":[{"type":"user","id":"u1","timestamp":5},{"type":"user","id":"u1","timestamp":6}],
        "boundaryToken":"s"}"#;
    assert!(matches!(
        TimelineWindow::from_json(dup),
        Err(ResponseError::DuplicateKey(_))
    ));
}

// ----- live patches (TL-06 for patches; docs/live-patches.md) ---------------------------

fn patch(
    epoch: u64,
    base: u64,
    revision: u64,
    upserts: Vec<Block>,
    removals: &[&str],
) -> LivePatch {
    LivePatch {
        settlement_epoch: epoch,
        base_revision: base,
        revision,
        upserts,
        removals: removals.iter().map(|id| reply(id)).collect(),
        appends: Vec::new(),
    }
}

/// The visible rows with their whole blocks.
fn full(t: &Timeline) -> Vec<(Origin, Block)> {
    t.rows().map(|r| (r.origin, r.block.clone())).collect()
}

// TL-06: a patch from the held revision applies in one step and leaves exactly the rows
// the snapshot of its revision gives.
#[test]
fn a_patch_from_the_held_revision_reaches_the_rows_of_the_snapshot() {
    let base = overlay(
        3,
        10,
        vec![live("a", 1, 1), live("b", 2, 2), live("c", 3, 3)],
    );
    let mut b2 = live("b", 2, 2);
    b2.data = serde_json::json!({"text": "longer"});
    let next = overlay(3, 12, vec![live("a", 1, 1), b2, live("d", 4, 4)]);
    let p = LivePatch::between(&base, &next).unwrap();
    assert_eq!(p.upserts.len(), 2, "b changed, d is new; a is not sent");
    assert_eq!(p.removals, vec![reply("c")]);
    let s = target("s");
    for mode in [ClientMode::Phone, ClientMode::Desktop] {
        let mut by_patch = opened(mode, window(vec![hist("h", 0)], base.clone()));
        let mut by_snapshot = opened(mode, window(vec![hist("h", 0)], base.clone()));
        assert_eq!(
            by_patch.handle_live_patch(&s, p.clone(), Millis(2)),
            Outcome::Applied
        );
        assert_eq!(
            by_snapshot.handle_live_update(&s, next.clone(), Millis(2)),
            Outcome::Applied
        );
        assert_eq!(full(&by_patch), full(&by_snapshot), "{mode:?}");
        assert_eq!(by_patch.overlay_version(), Some((3, 12)));
        // The same patch again is stale: nothing changes.
        assert_eq!(
            by_patch.handle_live_patch(&s, p.clone(), Millis(3)),
            Outcome::Ignored(IgnoreReason::StaleRevision)
        );
        assert_eq!(full(&by_patch), full(&by_snapshot));
        assert!(effects(&mut by_patch).is_empty());
    }
}

// TL-06: a patch from another base (an update was lost) is refused, rows are kept, and
// the next snapshot heals.
#[test]
fn a_patch_from_another_base_is_ignored_and_the_next_snapshot_heals() {
    let s = target("s");
    let mut t = opened(
        ClientMode::Phone,
        window(vec![], overlay(3, 10, vec![live("a", 1, 1)])),
    );
    let before = full(&t);
    assert_eq!(
        t.handle_live_patch(
            &s,
            patch(3, 11, 12, vec![live("b", 2, 2)], &["a"]),
            Millis(2)
        ),
        Outcome::Ignored(IgnoreReason::BaseMismatch)
    );
    assert_eq!(full(&t), before, "rows kept");
    assert!(
        effects(&mut t).is_empty(),
        "no reload: the next snapshot heals"
    );
    assert_eq!(
        t.handle_live_update(&s, overlay(3, 12, vec![live("b", 2, 2)]), Millis(3)),
        Outcome::Applied
    );
    assert_eq!(ids(&t), [(Origin::Live, "b".into())]);
    // From the healed revision, patches apply again.
    assert_eq!(
        t.handle_live_patch(&s, patch(3, 12, 13, vec![live("c", 3, 3)], &[]), Millis(4)),
        Outcome::Applied
    );
    assert_eq!(
        ids(&t),
        [(Origin::Live, "b".into()), (Origin::Live, "c".into())]
    );
}

// TL-06: epochs and revisions decide before anything is applied; rows are kept.
#[test]
fn a_patch_in_another_epoch_or_to_an_old_revision_changes_no_row() {
    let s = target("s");
    let mut t = opened(
        ClientMode::Phone,
        window(vec![], overlay(3, 10, vec![live("a", 1, 1)])),
    );
    let before = full(&t);
    assert_eq!(
        t.handle_live_patch(&s, patch(2, 10, 11, vec![], &["a"]), Millis(2)),
        Outcome::Ignored(IgnoreReason::StaleEpoch)
    );
    assert_eq!(
        t.handle_live_patch(&s, patch(3, 9, 10, vec![], &["a"]), Millis(2)),
        Outcome::Ignored(IgnoreReason::StaleRevision)
    );
    assert!(effects(&mut t).is_empty());
    // A higher epoch is taken only from a latest window: reload, rows kept.
    assert_eq!(
        t.handle_live_patch(&s, patch(4, 10, 11, vec![], &["a"]), Millis(2)),
        Outcome::ReloadRequired(LoadReason::EpochAdvanced)
    );
    assert_eq!(full(&t), before);
    assert!(matches!(
        effects(&mut t).as_slice(),
        [TimelineEffect::LoadLatestWindow {
            reason: LoadReason::EpochAdvanced,
            ..
        }]
    ));
}

// TL-06: a removal of a row the held revision lacks means the client's revision differs
// from the host's (same revision, other rows): nothing is applied, reload.
#[test]
fn a_patch_that_removes_a_row_the_client_lacks_applies_nothing_and_reloads() {
    let s = target("s");
    let mut t = opened(
        ClientMode::Desktop,
        window(vec![], overlay(3, 10, vec![live("a", 1, 1)])),
    );
    let before = full(&t);
    assert_eq!(
        t.handle_live_patch(
            &s,
            patch(3, 10, 11, vec![live("b", 2, 2)], &["zz"]),
            Millis(2)
        ),
        Outcome::ReloadRequired(LoadReason::RevisionConflict)
    );
    assert_eq!(full(&t), before, "atomic: b was not added either");
    assert_eq!(t.overlay_version(), Some((3, 10)));
}

// TL-06, TL-13: where a snapshot is ignored, so is a patch.
#[test]
fn a_patch_for_another_target_before_a_window_or_over_a_past_page_is_ignored() {
    let mut t = Timeline::new(ClientMode::Phone);
    t.open_target(target("s"), Millis(0));
    assert_eq!(
        t.handle_live_patch(&target("s"), patch(1, 1, 2, vec![], &[]), Millis(1)),
        Outcome::Ignored(IgnoreReason::NotLoaded)
    );
    assert_eq!(
        t.handle_live_patch(&target("other"), patch(1, 1, 2, vec![], &[]), Millis(1)),
        Outcome::Ignored(IgnoreReason::StaleTarget)
    );
    effects(&mut t); // the latest window of the open stays unanswered
    let mut past = window(vec![hist("h", 1)], overlay(1, 1, vec![]));
    past.live_overlay = None;
    past.newer_cursor = Some("newer".into());
    t.load_anchored(Anchor::row(&reply("h")), Millis(1))
        .unwrap();
    let anchored = effects(&mut t)
        .into_iter()
        .find_map(|e| match e {
            TimelineEffect::LoadAnchored { tag, .. } => Some(tag),
            _ => None,
        })
        .unwrap();
    past.anchor_row = Some(reply("h"));
    assert_eq!(
        t.handle_anchored(&anchored, Ok(past), Millis(1)),
        Outcome::Applied
    );
    assert_eq!(
        t.handle_live_patch(
            &target("s"),
            patch(1, 1, 2, vec![live("x", 2, 2)], &[]),
            Millis(2)
        ),
        Outcome::Ignored(IgnoreReason::PastPage)
    );
}

// TL-06, TL-13: a malformed patch is a typed failure; rows are kept.
#[test]
fn a_malformed_patch_fails_with_a_typed_error() {
    let s = target("s");
    let mut t = opened(
        ClientMode::Phone,
        window(vec![], overlay(3, 10, vec![live("a", 1, 1)])),
    );
    let before = full(&t);
    let cases = [
        (
            patch(3, 10, 10, vec![], &[]),
            ResponseError::PatchNotForward,
        ),
        (
            patch(3, 10, 11, vec![live("a", 1, 1), live("a", 2, 2)], &[]),
            ResponseError::DuplicateKey(reply("a")),
        ),
        (
            patch(3, 10, 11, vec![live("a", 1, 1)], &["a"]),
            ResponseError::DuplicateKey(reply("a")),
        ),
        (
            patch(3, 10, 11, vec![], &["a", "a"]),
            ResponseError::DuplicateKey(reply("a")),
        ),
        (
            patch(3, 9_007_199_254_740_992, 9_007_199_254_740_993, vec![], &[]),
            ResponseError::NumberOutOfRange("baseRevision"),
        ),
        (
            patch(9_007_199_254_740_992, 10, 11, vec![], &[]),
            ResponseError::NumberOutOfRange("settlementEpoch"),
        ),
        (
            patch(3, 10, 11, vec![live("b", 9_007_199_254_740_992, 2)], &[]),
            ResponseError::NumberOutOfRange("timestamp"),
        ),
    ];
    for (p, err) in cases {
        assert_eq!(
            t.handle_live_patch(&s, p, Millis(2)),
            Outcome::Failed(LoadFailure::Malformed(err))
        );
    }
    assert_eq!(full(&t), before);
    // From JSON: unknown fields are ignored, a missing list is a decode error.
    let json = r#"{"settlementEpoch":3,"baseRevision":10,"revision":11,"future":true,
        "upserts":[{"type":"agent-reply","id":"b","timestamp":2}],"removals":[{"type":"agent-reply","id":"a"}]}"#;
    let p = LivePatch::from_json(json).unwrap();
    assert_eq!(t.handle_live_patch(&s, p, Millis(3)), Outcome::Applied);
    assert_eq!(ids(&t), [(Origin::Live, "b".into())]);
    assert!(matches!(
        LivePatch::from_json(
            r#"{"settlementEpoch":3,"baseRevision":10,"revision":11,"upserts":[]}"#
        ),
        Err(ResponseError::Decode(_))
    ));
    assert_eq!(
        LivePatch::from_json(
            r#"{"settlementEpoch":3,"baseRevision":10,"revision":9007199254740992,"upserts":[],"removals":[]}"#
        ),
        Err(ResponseError::NumberOutOfRange("revision"))
    );
}

// TL-03 with patches: a patched row that carries an operation hides its echo; removing
// it shows the echo again.
#[test]
fn a_patch_carrying_an_operation_hides_its_echo_until_the_row_leaves() {
    let s = target("s");
    let mut t = opened(ClientMode::Phone, window(vec![], overlay(3, 10, vec![])));
    t.add_pending(pending("op-41", 10));
    let carrier =
        Block::new(key(BlockType::User, "codex-item-3"), Millis(11)).with_operation(op("op-41"));
    let p = LivePatch {
        settlement_epoch: 3,
        base_revision: 10,
        revision: 11,
        upserts: vec![carrier],
        removals: vec![],
        appends: vec![],
    };
    assert_eq!(t.handle_live_patch(&s, p, Millis(2)), Outcome::Applied);
    assert_eq!(ids(&t), [(Origin::Live, "codex-item-3".into())]);
    let p = LivePatch {
        settlement_epoch: 3,
        base_revision: 11,
        revision: 12,
        upserts: vec![],
        removals: vec![key(BlockType::User, "codex-item-3")],
        appends: vec![],
    };
    assert_eq!(t.handle_live_patch(&s, p, Millis(3)), Outcome::Applied);
    assert_eq!(ids(&t), [(Origin::Pending, "user-message::op-41".into())]);
    assert_eq!(full(&t).len(), t.full_rebuild().len());
}

// The host-side diff: applying `between(a, b)` to `a` gives `b` in canonical order, and
// a patch never crosses an epoch or goes backwards.
#[test]
fn between_and_apply_to_are_inverse_and_refuse_other_bases() {
    let a = overlay(1, 5, vec![live("a", 1, 1), live("b", 2, 2)]);
    let b = overlay(1, 6, vec![live("c", 0, 3), live("a", 1, 1)]);
    let p = LivePatch::between(&a, &b).unwrap();
    let mut sorted = b.clone();
    sorted.blocks.sort_by_cached_key(Block::order_key);
    assert_eq!(p.apply_to(&a), Ok(sorted));
    assert_eq!(LivePatch::between(&b, &a), None, "not later");
    assert_eq!(
        LivePatch::between(&a, &overlay(2, 9, vec![])),
        None,
        "another epoch"
    );
    use timeline_core::wire::PatchMismatch;
    assert_eq!(p.apply_to(&b), Err(PatchMismatch::Base));
    assert_eq!(
        p.apply_to(&overlay(2, 5, vec![])),
        Err(PatchMismatch::Epoch)
    );
    assert_eq!(
        p.apply_to(&overlay(1, 5, vec![live("a", 1, 1)])),
        Err(PatchMismatch::MissingRow(reply("b")))
    );
    let empty: LiveOverlay = overlay(1, 7, vec![]);
    assert_eq!(LivePatch::between(&b, &empty).unwrap().removals.len(), 2);
}

// ----- pending echoes: delivered versus removed ------------------------------------------

/// A user row carrying `id` (the key its history row has), live or saved.
fn user_row(id: &str, at: u64, live: bool) -> Block {
    let order = if live {
        SourceOrder::live(at)
    } else {
        SourceOrder::history(at, 0)
    };
    Block::new(BlockKey::user_message(&op(id)), Millis(at))
        .with_operation(op(id))
        .with_source_order(order)
}

fn echo_key(id: &str) -> BlockKey {
    BlockKey::user_message(&op(id))
}

/// The incremental rows equal the full rebuild.
fn assert_rebuilt(t: &Timeline) {
    let rows: Vec<(Origin, Block)> = t.rows().map(|r| (r.origin, r.block.clone())).collect();
    assert_eq!(rows, t.full_rebuild());
}

/// Reloads and applies `w` as the answer.
fn reload_with(t: &mut Timeline, w: TimelineWindow, now: Millis) -> Outcome {
    t.reload(now);
    let tag = latest_tag(&effects(t));
    t.handle_latest_window(&tag, Ok(w), now)
}

// TL-03: the sent proof usually comes before any row carrying the message. The echo of a
// delivered message stays until a row carries the operation and then retires by itself;
// the message is on screen in every state. Only a removal by the user drops an echo at
// once, and a delivered message cannot be removed.
#[test]
fn a_delivered_echo_stays_until_a_row_carries_it_then_retires_by_itself() {
    let target = target("s");
    let mut t = opened(ClientMode::Phone, window(vec![], overlay(1, 1, vec![])));
    t.add_pending(pending("op-1", 10));
    t.add_pending(pending("op-2", 10));
    assert_eq!(t.mark_delivered(&op("op-1")), Outcome::Applied);
    assert_eq!(t.mark_delivered(&op("op-1")), Outcome::Unchanged);
    assert_eq!(
        t.mark_delivered(&op("op-9")),
        Outcome::Ignored(IgnoreReason::NotInFlight)
    );
    assert_eq!(t.is_pending_delivered(&op("op-1")), Some(true));
    assert_eq!(
        t.is_pending_confirmed(&op("op-1")),
        Some(true),
        "delivered implies saved"
    );
    assert_eq!(t.is_pending_delivered(&op("op-2")), Some(false));
    // Sent, no row yet: the echo stays, also through a reload that does not carry it yet.
    assert_eq!(t.row(&echo_key("op-1")).unwrap().origin, Origin::Pending);
    assert_eq!(
        t.remove_pending(&op("op-1")),
        Outcome::Ignored(IgnoreReason::Delivered)
    );
    assert_eq!(t.row(&echo_key("op-1")).unwrap().origin, Origin::Pending);
    assert_eq!(
        reload_with(&mut t, window(vec![], overlay(1, 2, vec![])), Millis(2)),
        Outcome::Applied
    );
    assert_eq!(t.row(&echo_key("op-1")).unwrap().origin, Origin::Pending);
    assert_rebuilt(&t);
    // The live row arrives: it shows the message and the echo retires.
    let live_row = user_row("op-1", 12, true);
    assert_eq!(
        t.handle_live_update(&target, overlay(1, 3, vec![live_row.clone()]), Millis(3)),
        Outcome::Applied
    );
    assert_eq!(t.row(&echo_key("op-1")).unwrap().origin, Origin::Live);
    assert_eq!(t.is_pending_delivered(&op("op-1")), None, "retired");
    assert_eq!(t.remove_pending(&op("op-1")), Outcome::Unchanged);
    assert_rebuilt(&t);
    // The settling window brings its history copy in the same step.
    assert_eq!(
        reload_with(
            &mut t,
            window(vec![user_row("op-1", 12, false)], overlay(2, 4, vec![])),
            Millis(4)
        ),
        Outcome::Applied
    );
    assert_eq!(t.row(&echo_key("op-1")).unwrap().origin, Origin::History);
    assert_rebuilt(&t);
    // A message the user removes (never delivered) goes at once.
    assert_eq!(t.remove_pending(&op("op-2")), Outcome::Applied);
    assert!(t.row(&echo_key("op-2")).is_none());
    assert_eq!(t.is_pending_delivered(&op("op-2")), None);
    assert_rebuilt(&t);
}

// TL-03: whichever input brings the row carrying a delivered operation (a whole
// snapshot, a patch, a window, or a row that was there before the proof), the echo
// retires in that step and the row shows the message.
#[test]
fn a_delivered_echo_retires_in_the_step_a_row_carries_it_whatever_brings_the_row() {
    let target = target("s");
    let mut t = opened(ClientMode::Desktop, window(vec![], overlay(1, 1, vec![])));
    for id in ["op-3", "op-4", "op-5"] {
        t.add_pending(pending(id, 10));
    }
    // A row under another key carries op-3 before its proof: the echo hides but stays
    // held (the outbox still holds the message); the proof retires it at once.
    let carrier =
        Block::new(key(BlockType::User, "codex-item-3"), Millis(11)).with_operation(op("op-3"));
    t.handle_live_update(&target, overlay(1, 2, vec![carrier.clone()]), Millis(2));
    assert!(t.row(&echo_key("op-3")).is_none());
    assert_eq!(t.is_pending_delivered(&op("op-3")), Some(false));
    assert_eq!(t.mark_delivered(&op("op-3")), Outcome::Applied);
    assert_eq!(t.is_pending_delivered(&op("op-3")), None);
    assert_eq!(
        t.row(&key(BlockType::User, "codex-item-3")).unwrap().origin,
        Origin::Live
    );
    assert_rebuilt(&t);
    // A patch brings op-4's row.
    t.mark_delivered(&op("op-4"));
    t.mark_delivered(&op("op-5"));
    let prev = overlay(1, 2, vec![carrier.clone()]);
    let next = overlay(1, 3, vec![carrier.clone(), user_row("op-4", 13, true)]);
    let patch = LivePatch::between(&prev, &next).unwrap();
    assert_eq!(
        t.handle_live_patch(&target, patch, Millis(3)),
        Outcome::Applied
    );
    assert_eq!(t.is_pending_delivered(&op("op-4")), None);
    assert_eq!(t.row(&echo_key("op-4")).unwrap().origin, Origin::Live);
    assert_eq!(t.row(&echo_key("op-5")).unwrap().origin, Origin::Pending);
    assert_rebuilt(&t);
    // A window brings op-5's history row.
    let w = window(
        vec![user_row("op-5", 14, false)],
        overlay(1, 3, vec![carrier, user_row("op-4", 13, true)]),
    );
    assert_eq!(reload_with(&mut t, w, Millis(4)), Outcome::Applied);
    assert_eq!(t.is_pending_delivered(&op("op-5")), None);
    assert_eq!(t.row(&echo_key("op-5")).unwrap().origin, Origin::History);
    assert_eq!(t.len(), 3);
    assert_rebuilt(&t);
}

// ----- misrouted answers -----------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Latest,
    Older,
    Anchored,
}

/// A desktop timeline showing a window with an older page to load, one request of `kind`
/// in flight (sent at `sent`), its tag and the host that answers.
fn one_request(kind: Kind, sent: Millis) -> (Timeline, RequestTag, SimHost) {
    let mut host = SimHost::new("s");
    host.append_history(30);
    let mut t = Timeline::new(ClientMode::Desktop);
    t.open_target(host.target().clone(), Millis(0));
    let tag = latest_tag(&effects(&mut t));
    let (w, _) = host.latest_window();
    assert_eq!(
        t.handle_latest_window(&tag, Ok(w), Millis(1)),
        Outcome::Applied
    );
    match kind {
        Kind::Latest => t.reload(sent),
        Kind::Older => assert!(t.load_older(sent)),
        Kind::Anchored => {
            let row = host.history()[0].key();
            t.load_anchored(Anchor::row(&row), sent).unwrap();
        }
    }
    let tag = match effects(&mut t).as_slice() {
        [TimelineEffect::LoadLatestWindow { tag, .. }
        | TimelineEffect::LoadOlderPage { tag, .. }
        | TimelineEffect::LoadAnchored { tag, .. }] => tag.clone(),
        other => panic!("{other:?}"),
    };
    (t, tag, host)
}

/// Hands `tag` to the handler of `kind` with an answer of that handler's type.
fn answer(
    t: &mut Timeline,
    host: &mut SimHost,
    kind: Kind,
    tag: &RequestTag,
    now: Millis,
) -> Outcome {
    match kind {
        Kind::Latest => {
            let (w, _) = host.latest_window();
            t.handle_latest_window(tag, Ok(w), now)
        }
        Kind::Older => {
            let page = host.older_page(t.oldest_cursor().unwrap_or("none"));
            t.handle_older_page(tag, Ok(page), now)
        }
        Kind::Anchored => {
            let row = host.history()[0].key();
            let w = host.anchored(&Anchor::row(&row)).unwrap();
            t.handle_anchored(tag, Ok(w), now)
        }
    }
}

// TL-13: an answer handed to the handler of another kind of request is refused and the
// request keeps waiting with its own deadline: the right answer still lands, and without
// one the load times out (a latest window is retried). Every pair of handlers.
#[test]
fn a_misrouted_answer_is_refused_and_the_request_keeps_its_deadline() {
    let kinds = [Kind::Latest, Kind::Older, Kind::Anchored];
    let sent = Millis(1_000);
    for issued in kinds {
        let deadline = Millis(
            sent.0
                + match issued {
                    Kind::Older => PAGINATED_LOAD_TIMEOUT.0,
                    _ => INITIAL_LOAD_TIMEOUT.0,
                },
        );
        for wrong in kinds.into_iter().filter(|k| *k != issued) {
            let case = format!("{issued:?} answered as {wrong:?}");
            // The right answer still lands after the misrouted one.
            let (mut t, tag, mut host) = one_request(issued, sent);
            assert_eq!(t.poll_timeout(), Some(deadline), "{case}");
            assert_eq!(
                answer(&mut t, &mut host, wrong, &tag, Millis(2_000)),
                Outcome::Ignored(IgnoreReason::Misrouted),
                "{case}"
            );
            assert_eq!(t.poll_timeout(), Some(deadline), "{case}: deadline kept");
            assert!(effects(&mut t).is_empty(), "{case}");
            assert_eq!(
                answer(&mut t, &mut host, issued, &tag, Millis(3_000)),
                Outcome::Applied,
                "{case}: the right handler"
            );
            // Without the right answer, the load times out at its own deadline.
            let (mut t, tag, mut host) = one_request(issued, sent);
            answer(&mut t, &mut host, wrong, &tag, Millis(2_000));
            t.handle_timeout(Millis(deadline.0 - 1));
            assert_eq!(t.poll_timeout(), Some(deadline), "{case}");
            t.handle_timeout(deadline);
            match issued {
                Kind::Latest => {
                    assert_eq!(t.poll_timeout(), Some(Millis(deadline.0 + 750)), "{case}");
                    t.handle_timeout(Millis(deadline.0 + 750));
                    assert!(
                        matches!(
                            effects(&mut t).as_slice(),
                            [TimelineEffect::LoadLatestWindow {
                                reason: LoadReason::Retry(1),
                                ..
                            }]
                        ),
                        "{case}: retried"
                    );
                }
                Kind::Older | Kind::Anchored => {
                    assert_eq!(t.poll_timeout(), None, "{case}: timed out");
                }
            }
            assert_eq!(
                answer(&mut t, &mut host, issued, &tag, Millis(deadline.0 + 1)),
                Outcome::Ignored(IgnoreReason::NotInFlight),
                "{case}: a late answer"
            );
        }
    }
}

// ----- a reload that gives up ------------------------------------------------------------

/// Times out every try of a reload of a shown window, from `now`, until `tries` requests
/// (the first and its retries) have timed out. Returns the time of the last timeout.
fn time_out_reload_tries(t: &mut Timeline, mut now: Millis, tries: u32) -> Millis {
    t.reload(now);
    let mut request = latest_tag(&effects(t));
    for n in 1..=tries {
        let deadline = now.saturating_add(INITIAL_LOAD_TIMEOUT);
        assert_eq!(t.poll_timeout(), Some(deadline));
        t.handle_timeout(deadline);
        now = deadline;
        if n == tries {
            break;
        }
        // A retry is due; send it.
        let due = t.poll_timeout().unwrap();
        t.handle_timeout(due);
        now = due;
        let tag = latest_tag(&effects(t));
        assert_ne!(tag, request);
        request = tag;
        assert_eq!(t.load_state(), &LoadState::Ready, "retry {n} under way");
    }
    now
}

// TL-13, seed case 6 ("preserve readable history and expose recovery"): a reload of a
// shown window whose first try and 3 retries all time out keeps the rows and says it
// failed, with the way to recover. At the retry limit (the 3rd retry under way) the state
// is still Ready; one past it, ReloadFailed, and no 4th retry.
#[test]
fn a_reload_that_gives_up_says_so_and_offers_recovery() {
    assert_eq!(INITIAL_LOAD_MAX_RETRIES, 3);
    let mut host = SimHost::new("s");
    host.append_history(20);
    let mut t = Timeline::new(ClientMode::Phone);
    t.open_target(host.target().clone(), Millis(0));
    let tag = latest_tag(&effects(&mut t));
    let (w, _) = host.latest_window();
    t.handle_latest_window(&tag, Ok(w), Millis(1));
    let before: Vec<BlockKey> = t.rows().map(|r| r.block.key()).collect();
    // At the limit: the first try and 2 retries timed out, the 3rd retry is under way.
    let now = time_out_reload_tries(&mut t, Millis(10), 3);
    let due = t.poll_timeout().unwrap();
    t.handle_timeout(due);
    let last = latest_tag(&effects(&mut t));
    assert_eq!(t.load_state(), &LoadState::Ready);
    assert_eq!(
        t.poll_timeout(),
        Some(due.saturating_add(INITIAL_LOAD_TIMEOUT))
    );
    assert!(due > now);
    // One past it: the 3rd retry times out too.
    t.handle_timeout(due.saturating_add(INITIAL_LOAD_TIMEOUT));
    assert_eq!(
        t.load_state(),
        &LoadState::ReloadFailed {
            reason: LoadFailure::TimedOut,
            retries: 3
        }
    );
    assert_eq!(t.poll_timeout(), None, "no 4th retry");
    assert!(effects(&mut t).is_empty());
    let after: Vec<BlockKey> = t.rows().map(|r| r.block.key()).collect();
    assert_eq!(before, after, "the rows stay readable");
    assert_eq!(
        t.handle_latest_window(&last, Err(LoadFailure::Unavailable), Millis(500_000)),
        Outcome::Ignored(IgnoreReason::NotInFlight)
    );
    // Recovery: a new load with its own retries; the state is Ready while it runs.
    t.recover(Millis(500_000));
    assert_eq!(t.load_state(), &LoadState::Ready);
    let tag = match effects(&mut t).as_slice() {
        [TimelineEffect::LoadLatestWindow {
            tag,
            reason: LoadReason::Requested,
            ..
        }] => tag.clone(),
        other => panic!("{other:?}"),
    };
    let (w, _) = host.latest_window();
    assert_eq!(
        t.handle_latest_window(&tag, Ok(w), Millis(500_001)),
        Outcome::Applied
    );
    assert_eq!(t.load_state(), &LoadState::Ready);
}

// TL-13: the same with answers that fail: the reason is the last failure, and a window
// that lands by another request clears the failure.
#[test]
fn a_reload_whose_every_retry_fails_keeps_the_rows_and_names_the_last_failure() {
    let mut host = SimHost::new("s");
    host.append_history(5);
    let mut t = Timeline::new(ClientMode::Desktop);
    t.open_target(host.target().clone(), Millis(0));
    let tag = latest_tag(&effects(&mut t));
    let (w, _) = host.latest_window();
    t.handle_latest_window(&tag, Ok(w), Millis(1));
    let rows = t.len();
    t.reload(Millis(10));
    let mut now = Millis(10);
    for retry in 0..=INITIAL_LOAD_MAX_RETRIES {
        let tag = latest_tag(&effects(&mut t));
        let failure = if retry == INITIAL_LOAD_MAX_RETRIES {
            LoadFailure::SnapshotTooLarge
        } else {
            LoadFailure::Unavailable
        };
        assert_eq!(t.load_state(), &LoadState::Ready, "retry {retry}");
        t.handle_latest_window(&tag, Err(failure), now);
        if let Some(due) = t.poll_timeout() {
            now = due;
            t.handle_timeout(now);
        }
    }
    assert_eq!(
        t.load_state(),
        &LoadState::ReloadFailed {
            reason: LoadFailure::SnapshotTooLarge,
            retries: INITIAL_LOAD_MAX_RETRIES
        }
    );
    assert_eq!(t.len(), rows);
    // A pull to refresh that lands returns the state to Ready.
    assert_eq!(
        reload_with(&mut t, host.latest_window().0, now),
        Outcome::Applied
    );
    assert_eq!(t.load_state(), &LoadState::Ready);
}
