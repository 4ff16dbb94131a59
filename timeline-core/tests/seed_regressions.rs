//! The seed's regression cases 1, 2, 5, 6 and 7 (SPEC.md section 8), at the client
//! level.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashSet;

use common::*;
use fixtures::sim_host::SimHost;
use timeline_core::anchor::Anchor;
use timeline_core::key::{BlockKey, BlockType};
use timeline_core::time::Millis;
use timeline_core::timeline::{
    ClientMode, IgnoreReason, LoadFailure, LoadState, Origin, Outcome, Timeline, TimelineEffect,
};
use timeline_core::wire::{OlderPage, TimelineWindow};

fn assert_unique(t: &Timeline) {
    let keys: HashSet<BlockKey> = t.rows().map(|r| r.block.key()).collect();
    assert_eq!(keys.len(), t.len(), "a key shows twice");
}

/// Seed case 1: switch targets while a history request is in flight; the old response
/// never replaces the new target.
#[test]
fn seed_case_1_switching_targets_while_a_history_request_is_in_flight() {
    let mut a = SimHost::new("project-a");
    a.append_history(3);
    let mut b = SimHost::new("project-b");
    b.append_history(2);
    let mut t = Timeline::new(ClientMode::Desktop);
    t.open_target(a.target().clone(), Millis(0));
    let tag_a = latest_tag(&effects(&mut t));
    t.open_target(b.target().clone(), Millis(1));
    let tag_b = latest_tag(&effects(&mut t));
    let (wa, _) = a.latest_window();
    assert_eq!(
        t.handle_latest_window(&tag_a, Ok(wa.clone()), Millis(2)),
        Outcome::Ignored(IgnoreReason::StaleTarget)
    );
    assert!(t.is_empty());
    let (wb, _) = b.latest_window();
    assert_eq!(
        t.handle_latest_window(&tag_b, Ok(wb), Millis(3)),
        Outcome::Applied
    );
    assert_eq!(t.len(), 2);
    // Back to A: the answer to the first request for A is still stale (older generation).
    t.open_target(a.target().clone(), Millis(4));
    let tag_a2 = latest_tag(&effects(&mut t));
    assert_eq!(
        t.handle_latest_window(&tag_a, Ok(wa.clone()), Millis(5)),
        Outcome::Ignored(IgnoreReason::StaleTarget)
    );
    assert!(t.is_empty());
    assert_eq!(
        t.handle_latest_window(&tag_a2, Ok(wa), Millis(6)),
        Outcome::Applied
    );
    // A live update for B no longer reaches the view of A.
    assert_eq!(
        t.handle_live_update(b.target(), b.snapshot(), Millis(7)),
        Outcome::Ignored(IgnoreReason::StaleTarget)
    );
}

/// Seed case 2: live content moves into history and an empty overlay with a newer epoch
/// comes back; old live rows never reappear.
#[test]
fn seed_case_2_settled_live_rows_never_reappear() {
    for mode in [ClientMode::Phone, ClientMode::Desktop] {
        let mut host = SimHost::new("s");
        host.append_history(2);
        let mut t = Timeline::new(mode);
        t.open_target(host.target().clone(), Millis(0));
        let tag = latest_tag(&effects(&mut t));
        let a = reply("reply-a");
        let old_snapshot = host.stream_live(a.clone(), None);
        let (w, _) = host.latest_window();
        t.handle_latest_window(&tag, Ok(w), Millis(1));
        assert_eq!(t.row(&a).unwrap().origin, Origin::Live);
        // The agent saves A; the next latest window settles it (epoch + 1, empty overlay).
        assert!(host.save_to_history(&a));
        let (w, emitted) = host.latest_window();
        let emitted = emitted.unwrap();
        assert!(emitted.blocks.is_empty());
        assert!(emitted.settlement_epoch > old_snapshot.settlement_epoch);
        // The empty overlay arrives live first: refused (newer epoch), A stays.
        assert!(matches!(
            t.handle_live_update(host.target(), emitted, Millis(2)),
            Outcome::ReloadRequired(_)
        ));
        assert_eq!(t.row(&a).unwrap().origin, Origin::Live);
        let tag = latest_tag(&effects(&mut t));
        t.handle_latest_window(&tag, Ok(w), Millis(3));
        assert_eq!(t.row(&a).unwrap().origin, Origin::History);
        // A late copy of the old snapshot that still holds A changes nothing.
        assert_eq!(
            t.handle_live_update(host.target(), old_snapshot, Millis(4)),
            Outcome::Ignored(IgnoreReason::StaleEpoch)
        );
        assert_eq!(t.row(&a).unwrap().origin, Origin::History);
        assert_eq!(t.rows().filter(|r| r.block.key() == a).count(), 1);
    }
}

/// Seed case 5: load older messages while the assistant streams; the reading anchor holds
/// and no row is duplicated. Streaming alone never disturbs the page; a settlement that
/// makes the phone reload keeps the reader's rows in the new window.
#[test]
fn seed_case_5_older_page_while_the_assistant_streams() {
    for mode in [ClientMode::Phone, ClientMode::Desktop] {
        let mut host = SimHost::new("s");
        host.append_history(60);
        let mut t = Timeline::new(mode);
        t.open_target(host.target().clone(), Millis(0));
        let tag = latest_tag(&effects(&mut t));
        let (w, _) = host.latest_window();
        t.handle_latest_window(&tag, Ok(w), Millis(1));

        // First page: the assistant streams while it travels.
        let streaming = reply("streaming");
        let (older_tag, cursor) = request_older(&mut t);
        for _ in 0..5 {
            let snap = host.stream_live(streaming.clone(), None);
            assert_eq!(
                t.handle_live_update(host.target(), snap, Millis(3)),
                Outcome::Applied
            );
        }
        let page = host.older_page(&cursor);
        assert_eq!(
            t.handle_older_page(&older_tag, Ok(page), Millis(4)),
            Outcome::Applied
        );
        let reading = t.rows().next().unwrap().block.key();
        t.set_reading_row(Some(reading.clone()));
        assert_eq!(t.row(&streaming).unwrap().origin, Origin::Live);
        assert_unique(&t);

        // Second page: meanwhile the reply is saved and settles; the client reloads.
        let (older_tag, cursor) = request_older(&mut t);
        assert!(host.save_to_history(&streaming));
        let shown_before = t.len();
        let (_, emitted) = host.latest_window();
        let outcome = t.handle_live_update(host.target(), emitted.unwrap(), Millis(5));
        assert!(matches!(outcome, Outcome::ReloadRequired(_)));
        assert_eq!(t.len(), shown_before, "rows kept while the reload travels");
        let reload = effects(&mut t);
        let Some(TimelineEffect::LoadLatestWindow { tag, page_size, .. }) = reload.first() else {
            panic!("{reload:?}");
        };
        assert!(*page_size > 12, "the reload covers what the reader sees");
        let (w, _) = host.latest_window_sized(*page_size);
        assert_eq!(
            t.handle_latest_window(tag, Ok(w), Millis(6)),
            Outcome::Applied
        );
        assert!(t.row(&reading).is_some(), "the reading anchor holds");
        assert_eq!(t.row(&streaming).unwrap().origin, Origin::History);
        // The page cut before the reload no longer fits; it never lands twice or in the
        // wrong place.
        let page = host.older_page(&cursor);
        let out = t.handle_older_page(&older_tag, Ok(page), Millis(7));
        assert!(!matches!(out, Outcome::Applied), "{out:?}");
        let _ = effects(&mut t);
        assert_unique(&t);
        assert!(t.row(&reading).is_some());
        assert_eq!(t.rows().filter(|r| r.block.key() == streaming).count(), 1);
        let order: Vec<_> = t.rows().map(|r| r.block.order_key()).collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]));
        // Paging goes on from the new window's cursor.
        let (older_tag, cursor) = request_older(&mut t);
        let page = host.older_page(&cursor);
        assert_eq!(
            t.handle_older_page(&older_tag, Ok(page), Millis(8)),
            Outcome::Applied
        );
        assert_unique(&t);
    }
}

fn request_older(t: &mut Timeline) -> (timeline_core::timeline::RequestTag, String) {
    assert!(t.load_older(Millis(2)));
    match effects(t).as_slice() {
        [TimelineEffect::LoadOlderPage { tag, cursor, .. }] => (tag.clone(), cursor.clone()),
        other => panic!("{other:?}"),
    }
}

/// Seed case 6: an unavailable or malformed history response keeps readable history,
/// offers recovery, and never shows a false empty conversation.
#[test]
fn seed_case_6_unavailable_or_malformed_history_keeps_what_was_readable() {
    // A first load that never succeeds ends Failed (recovery offered), not Ready+empty.
    let mut t = Timeline::new(ClientMode::Phone);
    t.open_target(target("s"), Millis(0));
    let mut now = Millis(0);
    for _ in 0..4 {
        let tag = latest_tag(&effects(&mut t));
        let malformed =
            TimelineWindow::from_json("{\"blocks\": 7}").map_err(LoadFailure::Malformed);
        assert!(matches!(
            t.handle_latest_window(&tag, malformed, now),
            Outcome::Failed(LoadFailure::Malformed(_))
        ));
        now = now.saturating_add(Millis(3_000));
        t.handle_timeout(now);
    }
    assert!(matches!(
        t.load_state(),
        LoadState::Failed(LoadFailure::Malformed(_))
    ));
    assert!(t.is_empty());
    // A client with rows keeps them through failed reloads and a malformed older page.
    let mut host = SimHost::new("s");
    host.append_history(20);
    let mut t = Timeline::new(ClientMode::Desktop);
    t.open_target(host.target().clone(), Millis(0));
    let tag = latest_tag(&effects(&mut t));
    let (w, _) = host.latest_window();
    t.handle_latest_window(&tag, Ok(w), Millis(1));
    let before: Vec<_> = t.rows().map(|r| r.block.key()).collect();
    t.reload(Millis(2));
    let tag = latest_tag(&effects(&mut t));
    t.handle_latest_window(&tag, Err(LoadFailure::Unavailable), Millis(3));
    assert!(t.load_older(Millis(4)));
    let otag = match effects(&mut t).as_slice() {
        [TimelineEffect::LoadOlderPage { tag, .. }] => tag.clone(),
        other => panic!("{other:?}"),
    };
    let bad = OlderPage::from_json("{\"blocks\":[],\"boundaryBlockKeys\":[{\"type\":\"x\"}]}")
        .map_err(LoadFailure::Malformed);
    assert!(matches!(
        t.handle_older_page(&otag, bad, Millis(5)),
        Outcome::Failed(_)
    ));
    let after: Vec<_> = t.rows().map(|r| r.block.key()).collect();
    assert_eq!(before, after);
    assert_eq!(t.load_state(), &LoadState::Ready);
    // Recovery is a retry: the scheduled one, or one the user asks for.
    assert!(t.poll_timeout().is_some());
    t.recover(Millis(6));
    let tag = latest_tag(&effects(&mut t));
    let (w, _) = host.latest_window();
    assert_eq!(
        t.handle_latest_window(&tag, Ok(w), Millis(7)),
        Outcome::Applied
    );
    // A reload whose every retry fails keeps the rows and says so (recovery offered),
    // instead of showing Ready as if the rows were current.
    let shown: Vec<_> = t.rows().map(|r| r.block.key()).collect();
    t.reload(Millis(8));
    let mut now = Millis(8);
    loop {
        let tag = latest_tag(&effects(&mut t));
        t.handle_latest_window(&tag, Err(LoadFailure::Unavailable), now);
        let Some(due) = t.poll_timeout() else { break };
        now = due;
        t.handle_timeout(now);
    }
    assert!(matches!(
        t.load_state(),
        LoadState::ReloadFailed {
            reason: LoadFailure::Unavailable,
            ..
        }
    ));
    assert_eq!(t.rows().map(|r| r.block.key()).collect::<Vec<_>>(), shown);
    t.recover(now);
    let tag = latest_tag(&effects(&mut t));
    let (w, _) = host.latest_window();
    assert_eq!(t.handle_latest_window(&tag, Ok(w), now), Outcome::Applied);
    assert_eq!(t.load_state(), &LoadState::Ready);
}

fn anchored(t: &mut Timeline, host: &mut SimHost, anchor: Anchor) -> Outcome {
    t.load_anchored(anchor.clone(), Millis(10)).unwrap();
    let tag = match effects(t).as_slice() {
        [TimelineEffect::LoadAnchored {
            tag,
            anchor: a,
            page_size,
        }] => {
            assert_eq!(a, &anchor);
            assert_eq!(*page_size, 40);
            tag.clone()
        }
        other => panic!("{other:?}"),
    };
    let answer = host.anchored(&anchor).unwrap();
    t.handle_anchored(&tag, Ok(answer), Millis(10))
}

/// Seed case 7: follow a link to a row older than the newest window, then the link back;
/// each load opens the exact row, and a page in the past shows no live rows below it.
#[test]
fn seed_case_7_links_open_the_exact_row_and_a_past_page_shows_no_live_rows() {
    let mut host = SimHost::new("s");
    host.append_history(150);
    let live_row = reply("live-now");
    host.stream_live(live_row.clone(), None);
    let mut t = Timeline::new(ClientMode::Phone);
    t.open_target(host.target().clone(), Millis(0));
    let tag = latest_tag(&effects(&mut t));
    let (w, _) = host.latest_window();
    t.handle_latest_window(&tag, Ok(w), Millis(1));
    assert!(t.row(&live_row).is_some());

    // The link on a message row points at h-20, far older than the newest window.
    let old = reply("h-20");
    let token = host.link_token(&old);
    assert_eq!(
        anchored(&mut t, &mut host, Anchor::Link { token }),
        Outcome::Applied
    );
    assert_eq!(t.anchor_row(), Some(&old));
    assert!(t.row(&old).is_some());
    assert!(t.newer_cursor().is_some(), "a page in the past");
    assert!(
        t.rows().all(|r| r.origin == Origin::History),
        "no live rows below it"
    );
    assert!(t.row(&live_row).is_none());
    // Live updates do not draw live rows under a page in the past.
    let snap = host.stream_live(live_row.clone(), None);
    assert_eq!(
        t.handle_live_update(host.target(), snap, Millis(11)),
        Outcome::Ignored(IgnoreReason::PastPage)
    );

    // The link back points at a row in the newest 40: the normal newest window.
    let back = reply("h-140");
    let token = host.link_token(&back);
    assert_eq!(
        anchored(&mut t, &mut host, Anchor::Link { token }),
        Outcome::Applied
    );
    assert_eq!(t.anchor_row(), Some(&back));
    assert_eq!(t.newer_cursor(), None);
    assert_eq!(t.row(&live_row).unwrap().origin, Origin::Live);

    // A link to a row that is only live gives a notice, not a place.
    let token = host.link_token(&live_row);
    assert_eq!(
        anchored(&mut t, &mut host, Anchor::Link { token }),
        Outcome::Applied
    );
    assert_eq!(t.anchor_row(), None);
    assert_eq!(
        t.anchor_notice(),
        Some("This message is not in the saved history.")
    );
}

/// Seed case 7, continued: `newer` loads from a page in the past join with no gap and no
/// overlap until the present, which brings the live rows back.
#[test]
fn seed_case_7_newer_loads_join_without_gap_or_overlap() {
    let mut host = SimHost::new("s");
    host.append_history(170);
    let live_row = reply("live-now");
    host.stream_live(live_row.clone(), None);
    let mut t = Timeline::new(ClientMode::Desktop);
    t.open_target(host.target().clone(), Millis(0));
    let tag = latest_tag(&effects(&mut t));
    let (w, _) = host.latest_window();
    t.handle_latest_window(&tag, Ok(w), Millis(1));
    let row = Anchor::row(&BlockKey::parse(BlockType::AgentReply, "h-30").unwrap());
    assert_eq!(anchored(&mut t, &mut host, row), Outcome::Applied);
    let first = t.rows().next().unwrap().block.id.as_str().to_owned();
    let mut loads = 0;
    while t.newer_cursor().is_some() {
        assert!(t.load_newer(Millis(20)));
        let tag = match effects(&mut t).as_slice() {
            [TimelineEffect::LoadAnchored { tag, anchor, .. }] => {
                let answer = host.anchored(anchor).unwrap();
                (tag.clone(), answer)
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(
            t.handle_anchored(&tag.0, Ok(tag.1), Millis(20)),
            Outcome::Applied
        );
        loads += 1;
        assert!(loads < 10);
    }
    assert!(loads >= 2);
    // Every saved row from the first one on shows exactly once, in order.
    let start: usize = first.trim_start_matches("h-").parse().unwrap();
    let hist_ids: Vec<String> = t
        .rows()
        .filter(|r| r.origin == Origin::History)
        .map(|r| r.block.id.as_str().to_owned())
        .collect();
    let expected: Vec<String> = (start..170).map(|i| format!("h-{i}")).collect();
    assert_eq!(hist_ids, expected);
    assert_eq!(t.row(&live_row).unwrap().origin, Origin::Live);
    assert_unique(&t);
}

/// Seed case 7, found by the `timeline` fuzz target: the answer to a newer load that
/// arrives after the present came back (a latest window) is superseded; it used to set
/// a newer cursor without hiding the live rows, so the shown rows differed from a full
/// rebuild.
#[test]
fn seed_case_7_a_newer_load_answered_after_the_present_came_back_is_superseded() {
    let mut host = SimHost::new("s");
    host.append_history(170);
    let live_row = reply("live-now");
    host.stream_live(live_row.clone(), None);
    let mut t = Timeline::new(ClientMode::Desktop);
    t.open_target(host.target().clone(), Millis(0));
    let tag = latest_tag(&effects(&mut t));
    let (w, _) = host.latest_window();
    t.handle_latest_window(&tag, Ok(w), Millis(1));
    let row = Anchor::row(&BlockKey::parse(BlockType::AgentReply, "h-30").unwrap());
    assert_eq!(anchored(&mut t, &mut host, row), Outcome::Applied);
    assert!(t.load_newer(Millis(20)));
    let (newer_tag, newer_answer) = match effects(&mut t).as_slice() {
        [TimelineEffect::LoadAnchored { tag, anchor, .. }] => {
            (tag.clone(), host.anchored(anchor).unwrap())
        }
        other => panic!("{other:?}"),
    };
    // The present comes back before the newer page's answer.
    t.reload(Millis(21));
    let tag = latest_tag(&effects(&mut t));
    let (w, _) = host.latest_window();
    assert_eq!(
        t.handle_latest_window(&tag, Ok(w), Millis(22)),
        Outcome::Applied
    );
    assert_eq!(t.row(&live_row).unwrap().origin, Origin::Live);
    let before: Vec<_> = t.rows().map(|r| (r.origin, r.block.clone())).collect();
    assert_eq!(
        t.handle_anchored(&newer_tag, Ok(newer_answer), Millis(22)),
        Outcome::Ignored(IgnoreReason::Superseded)
    );
    let after: Vec<_> = t.rows().map(|r| (r.origin, r.block.clone())).collect();
    assert_eq!(after, before);
    assert_eq!(after, t.full_rebuild());
    assert_eq!(t.newer_cursor(), None);
}
