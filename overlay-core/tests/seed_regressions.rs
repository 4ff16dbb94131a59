//! Seed regression cases 2 and 4 (SPEC.md section 8) at the host; case 3 is in
//! `tests/live.rs`.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use overlay_core::live::{Delivery, LiveHub, Payload, RunEvent, RunEventKind};
use overlay_core::overlay::Change;
use overlay_core::store::memory::MemoryOverlayStore;
use overlay_core::store::write;
use overlay_core::store::{OverlayStore, RowClass};
use overlay_core::window::{latest_window, Target};
use timeline_core::time::Millis;
use timeline_core::timeline::{
    ClientMode, IgnoreReason, Origin, Outcome, Timeline, TimelineEffect,
};
use timeline_core::wire::LiveOverlay;

/// Seed case 2: live content moves into history and an empty overlay with a newer epoch
/// comes back; old live rows never reappear, on the host or on a client.
#[test]
fn seed_case_2_live_rows_moved_into_history_never_reappear() {
    let (s, t) = (session(), main_target());
    let target = Target {
        session: &s,
        target: &t,
        current_run: Some(&run("run-1")),
    };
    let mut store = MemoryOverlayStore::new();
    let mut source = filled(claude_source(), 3);
    let old = write(
        &mut store,
        &s,
        &t,
        &Change::Publish(vec![live("a", 2_000, "run-1")]),
    )
    .unwrap()
    .stored()
    .unwrap()
    .client_form();

    let mut phone = Timeline::new(ClientMode::Phone);
    phone.open_target(t.clone(), Millis(0));
    let Some(TimelineEffect::LoadLatestWindow { tag, .. }) = phone.poll_effect() else {
        panic!()
    };
    let w = latest_window(&mut store, &mut source, &host_key(), target, 12).unwrap();
    phone.handle_latest_window(&tag, Ok(w.window), Millis(1));
    assert_eq!(phone.row(&reply("a")).unwrap().origin, Origin::Live);

    // The agent saves A; the desktop's latest window settles it: empty overlay, epoch + 1.
    source.push(vec![saved("a", 2_000, 3)]);
    let settled = latest_window(&mut store, &mut source, &host_key(), target, 12).unwrap();
    let emitted = settled.settled.unwrap().client_form();
    assert!(emitted.blocks.is_empty());
    assert_eq!(emitted.settlement_epoch, old.settlement_epoch + 1);

    // The phone refuses the newer epoch live, keeps A, and reloads.
    assert!(matches!(
        phone.handle_live_update(&t, emitted.clone(), Millis(2)),
        Outcome::ReloadRequired(_)
    ));
    assert_eq!(phone.row(&reply("a")).unwrap().origin, Origin::Live);
    let Some(TimelineEffect::LoadLatestWindow { tag, .. }) = phone.poll_effect() else {
        panic!()
    };
    let w = latest_window(&mut store, &mut source, &host_key(), target, 12).unwrap();
    assert!(w.settled.is_none(), "nothing left to settle");
    phone.handle_latest_window(&tag, Ok(w.window), Millis(3));
    assert_eq!(phone.row(&reply("a")).unwrap().origin, Origin::History);
    // A late copy of the old snapshot never brings A back as a live row.
    assert_eq!(
        phone.handle_live_update(&t, old, Millis(4)),
        Outcome::Ignored(IgnoreReason::StaleEpoch)
    );
    assert_eq!(phone.row(&reply("a")).unwrap().origin, Origin::History);
    // On the host, later writes never resurrect it either.
    write(
        &mut store,
        &s,
        &t,
        &Change::Publish(vec![live("b", 2_001, "run-1")]),
    )
    .unwrap();
    let now = store.load(&s, &t).unwrap().unwrap();
    assert!(now.blocks.iter().all(|b| b.block.key() != reply("a")));
}

/// Seed case 4: a Claude run ends and no window loads; its live rows stay in the overlay
/// and leave with the next latest window. That window has no current run, so of the
/// run's ephemeral rows (OV-03, the seed's table) only the compacting marker leaves ("when
/// its run is not the current run"); the status row stays (dropped "when another run is
/// the current run"), and so does the approval card ("A Claude run has no such cleanup,
/// so its card stays in the overlay").
#[test]
fn seed_case_4_claude_rows_stay_until_the_next_latest_window() {
    let (s, t) = (session(), main_target());
    let mut store = MemoryOverlayStore::new();
    let mut hub = LiveHub::new();
    hub.set_phone_interest(&s, true);
    let mut source = filled(claude_source(), 2);
    hub.handle_payload(
        Payload::Run(RunEvent {
            event: RunEventKind::Started,
            app_session_id: s.clone(),
            run_id: run("run-1"),
            timestamp: Millis(0),
            operation_id: None,
            agent_error_info: None,
        }),
        Millis(0),
    );
    let stored = write(
        &mut store,
        &s,
        &t,
        &Change::Publish(vec![
            live("reply", 2_000, "run-1"),
            ephemeral("thinking-run-1", RowClass::Status, "run-1"),
            ephemeral("compacting-run-1", RowClass::CompactingMarker, "run-1"),
            ephemeral("approval:1", RowClass::ApprovalCard, "run-1"),
        ]),
    )
    .unwrap();
    hub.handle_payload(
        Payload::Blocks {
            session: s.clone(),
            target: t.clone(),
            overlay: stored.stored().unwrap().client_form(),
        },
        Millis(1),
    );
    // The agent saves the reply and the run completes. Claude has no exact scan.
    source.push(vec![saved("reply", 2_000, 2)]);
    hub.handle_payload(
        Payload::Run(RunEvent {
            event: RunEventKind::Completed,
            app_session_id: s.clone(),
            run_id: run("run-1"),
            timestamp: Millis(10),
            operation_id: None,
            agent_error_info: None,
        }),
        Millis(10),
    );
    let _: Vec<Delivery> = std::iter::from_fn(|| hub.poll_effect()).collect();
    // Long after, with no window loaded, the live row is still in the overlay.
    hub.handle_timeout(Millis(600_000));
    assert_eq!(store.load(&s, &t).unwrap().unwrap().blocks.len(), 4);
    // The next latest window settles it.
    let target = Target {
        session: &s,
        target: &t,
        current_run: None,
    };
    let w = latest_window(&mut store, &mut source, &host_key(), target, 12).unwrap();
    let overlay: LiveOverlay = w.window.live_overlay.unwrap();
    let mut left: Vec<&str> = overlay.blocks.iter().map(|b| b.id.as_str()).collect();
    left.sort_unstable();
    assert_eq!(left, ["approval:1", "thinking-run-1"]);
    assert_eq!(overlay.settlement_epoch, 1);
    assert_eq!(w.settled.map(|o| o.client_form()), Some(overlay));
    assert!(w.window.blocks.iter().any(|b| b.key() == reply("reply")));
}
