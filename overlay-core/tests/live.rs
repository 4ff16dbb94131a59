//! Live delivery (OV-07 to OV-09), and live patches on the relay and the window stream
//! (docs/live-patches.md): a patch goes only to a recipient that negotiated it, only from
//! a snapshot the hub knows it holds; relay repair and a run's end send whole snapshots
//! that heal a phone that lost a patch; streaming one row into a 1,000-row overlay sends
//! at most 2 % of the bytes whole snapshots send.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use overlay_core::live::{
    validate_relay_overlay, validate_relay_patch, Delivery, LiveHub, LiveProtocol, Payload,
    RelayError, RelayOutcome, RunEvent, RunEventKind, WindowId, AGENT_THREADS_WINDOW,
    BLOCKS_PATCH_EVENT, COALESCE_WINDOW,
};
use overlay_core::overlay::Change;
use overlay_core::store::memory::MemoryOverlayStore;
use overlay_core::store::write;
use timeline_core::key::{OperationId, SessionId, TargetId};
use timeline_core::time::Millis;
use timeline_core::wire::LiveOverlay;

fn snapshot(revision: u64) -> LiveOverlay {
    LiveOverlay {
        settlement_epoch: 0,
        revision,
        blocks: vec![],
    }
}

fn blocks(target: &TargetId, revision: u64) -> Payload {
    Payload::Blocks {
        session: session(),
        target: target.clone(),
        overlay: snapshot(revision),
    }
}

fn run_event(kind: RunEventKind, at: u64) -> Payload {
    Payload::Run(RunEvent {
        event: kind,
        app_session_id: session(),
        run_id: run("run-1"),
        timestamp: Millis(at),
        operation_id: Some(OperationId::new("op-1").unwrap()),
        agent_error_info: (kind == RunEventKind::Failed)
            .then(|| serde_json::json!({"code": "overloaded"})),
    })
}

fn deliveries(hub: &mut LiveHub) -> Vec<Delivery> {
    std::iter::from_fn(|| hub.poll_effect()).collect()
}

fn hub_with_window(target: &TargetId) -> (LiveHub, u64) {
    let mut store = MemoryOverlayStore::new();
    let mut hub = LiveHub::new();
    let sub = hub
        .subscribe(&mut store, WindowId(1), &session(), target)
        .unwrap();
    (hub, sub.subscription_id)
}

/// Seed case 3: three snapshots for one target within 50 ms reach a subscribed window as
/// one event with the newest overlay, and a completed event after it.
#[test]
fn seed_case_3_three_snapshots_in_50_ms_are_one_event_before_completed() {
    let t = main_target();
    let (mut hub, sub) = hub_with_window(&t);
    hub.set_phone_interest(&session(), true);
    hub.handle_payload(run_event(RunEventKind::Started, 0), Millis(0));
    let _ = deliveries(&mut hub);
    for (rev, at) in [(41, 0), (42, 20), (43, 45)] {
        assert_eq!(
            hub.handle_payload(blocks(&t, rev), Millis(10 + at)),
            RelayOutcome::Sent
        );
    }
    // Each write reached the relay at once; no window event yet.
    let relay: Vec<u64> = deliveries(&mut hub)
        .into_iter()
        .map(|d| match d {
            Delivery::Relay(r) => r.json["liveOverlay"]["revision"].as_u64().unwrap(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(relay, [41, 42, 43]);
    assert_eq!(
        hub.poll_timeout(),
        Some(Millis(60)),
        "the first snapshot started the 50 ms timer"
    );
    hub.handle_payload(run_event(RunEventKind::Completed, 58), Millis(58));
    let got = deliveries(&mut hub);
    let windows: Vec<&Payload> = got
        .iter()
        .filter_map(|d| match d {
            Delivery::Window {
                payload,
                subscription_id,
                ..
            } => {
                assert_eq!(*subscription_id, sub);
                Some(payload)
            }
            _ => None,
        })
        .collect();
    assert_eq!(windows.len(), 2);
    assert!(matches!(windows[0], Payload::Blocks { overlay, .. } if overlay.revision == 43));
    assert!(matches!(windows[1], Payload::Run(e) if e.event == RunEventKind::Completed));
    // ... and the completed event reached progress and relay too.
    assert!(got
        .iter()
        .any(|d| matches!(d, Delivery::Progress(e) if e.event == RunEventKind::Completed)));
    // The timer fired early through the run event; nothing is left waiting.
    hub.handle_timeout(Millis(60));
    assert!(deliveries(&mut hub).is_empty());
}

// OV-07: blocks only go to windows subscribed to their target.
#[test]
fn snapshots_go_only_to_windows_of_their_target_and_never_to_progress() {
    let (a, b) = (main_target(), TargetId::new("thread-2").unwrap());
    let mut store = MemoryOverlayStore::new();
    let mut hub = LiveHub::new();
    let sa = hub
        .subscribe(&mut store, WindowId(1), &session(), &a)
        .unwrap();
    let sb = hub
        .subscribe(&mut store, WindowId(2), &session(), &b)
        .unwrap();
    assert_ne!(sa.subscription_id, sb.subscription_id);
    hub.handle_payload(blocks(&a, 1), Millis(0));
    hub.handle_timeout(Millis(50));
    let got = deliveries(&mut hub);
    assert_eq!(
        got.len(),
        1,
        "no relay without interest, no progress for blocks"
    );
    assert!(matches!(
        &got[0],
        Delivery::Window {
            window: WindowId(1),
            ..
        }
    ));
    // Run, runtime and agent-threads events go to every window; a shared streamRevision.
    hub.handle_payload(
        Payload::Runtime {
            session: session(),
            data: serde_json::json!({"x": 1}),
        },
        Millis(60),
    );
    let revs: Vec<u64> = deliveries(&mut hub)
        .iter()
        .map(|d| match d {
            Delivery::Window {
                stream_revision, ..
            } => *stream_revision,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(revs, [2, 3]);
}

// OV-07: subscribe returns the saved overlay; re-subscribing replaces the old target.
#[test]
fn subscribe_returns_the_saved_overlay() {
    let mut store = MemoryOverlayStore::new();
    write(
        &mut store,
        &session(),
        &main_target(),
        &Change::Publish(vec![live("a", 1, "run-1")]),
    )
    .unwrap();
    let mut hub = LiveHub::new();
    let sub = hub
        .subscribe(&mut store, WindowId(1), &session(), &main_target())
        .unwrap();
    assert_eq!(sub.overlay.unwrap().blocks.len(), 1);
    let other = TargetId::new("thread-3").unwrap();
    let sub2 = hub
        .subscribe(&mut store, WindowId(1), &session(), &other)
        .unwrap();
    assert!(sub2.overlay.is_none());
    hub.handle_payload(blocks(&main_target(), 5), Millis(0));
    hub.handle_timeout(Millis(100));
    assert!(
        deliveries(&mut hub).is_empty(),
        "the window left that target"
    );
}

// OV-07, TL-13: at most 128 targets wait; the 129th sends them all.
#[test]
fn the_129th_waiting_target_flushes_all() {
    let mut store = MemoryOverlayStore::new();
    let mut hub = LiveHub::new();
    let targets: Vec<TargetId> = (0..129)
        .map(|i| TargetId::new(format!("t-{i}")).unwrap())
        .collect();
    for (i, t) in targets.iter().enumerate() {
        hub.subscribe(&mut store, WindowId(i as u64), &session(), t)
            .unwrap();
    }
    for t in &targets[..128] {
        hub.handle_payload(blocks(t, 1), Millis(0));
    }
    assert!(deliveries(&mut hub).is_empty(), "128 targets wait");
    hub.handle_payload(blocks(&targets[128], 1), Millis(1));
    assert_eq!(deliveries(&mut hub).len(), 129);
    assert_eq!(hub.poll_timeout(), None);
}

// OV-07: progress carries only run events, with their fields; failed carries
// agentErrorInfo to the relay only.
#[test]
fn progress_and_relay_fields_of_run_events() {
    let (mut hub, _) = hub_with_window(&main_target());
    hub.set_phone_interest(&session(), true);
    hub.handle_payload(run_event(RunEventKind::Failed, 7), Millis(7));
    let got = deliveries(&mut hub);
    let progress = got
        .iter()
        .find_map(|d| match d {
            Delivery::Progress(e) => Some(e),
            _ => None,
        })
        .unwrap();
    let json = serde_json::to_value(progress).unwrap();
    let mut keys: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        ["appSessionId", "event", "operationId", "runId", "timestamp"]
    );
    assert_eq!(json["event"], "failed");
    let relay = got
        .iter()
        .find_map(|d| match d {
            Delivery::Relay(r) => Some(r),
            _ => None,
        })
        .unwrap();
    assert_eq!(relay.json["agentErrorInfo"]["code"], "overloaded");
    hub.handle_payload(run_event(RunEventKind::Aborted, 8), Millis(8));
    let relay = deliveries(&mut hub)
        .into_iter()
        .find_map(|d| match d {
            Delivery::Relay(r) => Some(r),
            _ => None,
        })
        .unwrap();
    assert!(relay.json.get("agentErrorInfo").is_none());
}

// OV-07: the relay forwards only sessions a phone holds interest in, and validates
// blocks payloads strictly.
#[test]
fn the_relay_checks_interest_and_the_overlay_shape() {
    let mut hub = LiveHub::new();
    let t = main_target();
    assert_eq!(
        hub.handle_payload(blocks(&t, 1), Millis(0)),
        RelayOutcome::NoInterest
    );
    hub.set_phone_interest(&session(), true);
    assert_eq!(
        hub.handle_payload(blocks(&t, 0), Millis(0)),
        RelayOutcome::Rejected(RelayError::ZeroRevision)
    );
    assert_eq!(
        hub.handle_payload(blocks(&t, 9_007_199_254_740_991), Millis(0)),
        RelayOutcome::Sent
    );
    let ok = serde_json::json!({"settlementEpoch": 1, "revision": 2, "blocks": []});
    assert_eq!(validate_relay_overlay(&ok), Ok(()));
    for bad in [
        serde_json::json!({"settlementEpoch": 1, "revision": 2, "blocks": [], "extra": 1}),
        serde_json::json!({"settlementEpoch": 1, "revision": 2}),
        serde_json::json!({"settlementEpoch": 1, "revision": 2, "blocks": {}}),
    ] {
        assert_eq!(
            validate_relay_overlay(&bad),
            Err(RelayError::Fields),
            "{bad}"
        );
    }
    for bad in [
        serde_json::json!({"settlementEpoch": 9_007_199_254_740_992u64, "revision": 2, "blocks": []}),
        serde_json::json!({"settlementEpoch": 1, "revision": 9_007_199_254_740_992u64, "blocks": []}),
        serde_json::json!({"settlementEpoch": 1.5, "revision": 2, "blocks": []}),
        serde_json::json!({"settlementEpoch": -1, "revision": 2, "blocks": []}),
    ] {
        assert_eq!(
            validate_relay_overlay(&bad),
            Err(RelayError::NotExact),
            "{bad}"
        );
    }
    hub.set_phone_interest(&session(), false);
    assert_eq!(
        hub.handle_payload(blocks(&t, 3), Millis(0)),
        RelayOutcome::NoInterest
    );
}

// OV-08: every 5 s while a run is active, targets without a new write are re-sent to
// the relay only.
#[test]
fn relay_repair_resends_quiet_targets_every_5_seconds_while_a_run_is_active() {
    let (a, b) = (main_target(), TargetId::new("thread-2").unwrap());
    let (mut hub, _) = hub_with_window(&a);
    hub.set_phone_interest(&session(), true);
    hub.handle_payload(run_event(RunEventKind::Started, 0), Millis(0));
    assert_eq!(
        hub.poll_timeout(),
        None,
        "armed by the first snapshot of the run"
    );
    hub.handle_payload(blocks(&a, 10), Millis(100));
    hub.handle_payload(blocks(&b, 11), Millis(200));
    hub.handle_timeout(Millis(150));
    let _ = deliveries(&mut hub);
    assert_eq!(hub.poll_timeout(), Some(Millis(5_100)));
    // Target B is written again within the first tick; A is not.
    hub.handle_payload(blocks(&b, 12), Millis(4_000));
    let _ = deliveries(&mut hub);
    hub.handle_timeout(Millis(5_100));
    let first_tick = deliveries(&mut hub);
    // Both were written since the run started: the first tick resends nothing.
    assert!(first_tick.is_empty(), "{first_tick:?}");
    hub.handle_payload(blocks(&b, 13), Millis(6_000));
    let _ = deliveries(&mut hub);
    hub.handle_timeout(Millis(10_100));
    let second_tick = deliveries(&mut hub);
    assert_eq!(second_tick.len(), 1, "only A was quiet");
    match &second_tick[0] {
        Delivery::Relay(r) => {
            assert_eq!(r.json["timelineTargetId"], "session-1");
            assert_eq!(r.json["liveOverlay"]["revision"], 10);
        }
        other => panic!("relay only, got {other:?}"),
    }
    // The run ends: no more ticks.
    hub.handle_payload(run_event(RunEventKind::Completed, 11_000), Millis(11_000));
    let _ = deliveries(&mut hub);
    hub.handle_timeout(Millis(15_100));
    assert!(deliveries(&mut hub).is_empty());
    assert_eq!(hub.poll_timeout(), None);
}

// OV-09: the first agent-threads signal at once, then at most one more per second.
#[test]
fn agent_threads_signals_are_throttled_to_one_per_second() {
    let mut hub = LiveHub::new();
    hub.set_phone_interest(&session(), true);
    let signal = |at| Payload::AgentThreads {
        session: session(),
        timestamp: Millis(at),
    };
    assert_eq!(hub.handle_payload(signal(0), Millis(0)), RelayOutcome::Sent);
    let first = deliveries(&mut hub);
    assert_eq!(first.len(), 1);
    let Delivery::Relay(r) = &first[0] else {
        panic!()
    };
    assert_eq!(r.json["event"], "agent-threads");
    assert_eq!(r.json["threadId"], serde_json::Value::Null);
    for at in [100, 300, 900] {
        assert_eq!(
            hub.handle_payload(signal(at), Millis(at)),
            RelayOutcome::Throttled
        );
    }
    assert!(deliveries(&mut hub).is_empty());
    assert_eq!(hub.poll_timeout(), Some(Millis(1_000)));
    hub.handle_timeout(Millis(1_000));
    let trailing = deliveries(&mut hub);
    assert_eq!(trailing.len(), 1, "one more at the end of the window");
    let Delivery::Relay(r) = &trailing[0] else {
        panic!()
    };
    assert_eq!(r.json["timestamp"], 900, "the newest held signal");
    // Another session is not throttled by this one.
    let other = SessionId::new("other").unwrap();
    hub.set_phone_interest(&other, true);
    assert_eq!(
        hub.handle_payload(
            Payload::AgentThreads {
                session: other,
                timestamp: Millis(1_001)
            },
            Millis(1_001)
        ),
        RelayOutcome::Sent
    );
}

// OV-08: the first tick of a run resends a target written before the run's timer
// started (between runs, or in an earlier run): "since the last tick" begins when the
// first snapshot of the run arms the timer, so an older write does not count.
#[test]
fn the_first_repair_tick_resends_a_target_written_before_the_timer_started() {
    let (a, b) = (main_target(), TargetId::new("thread-2").unwrap());
    let tick_revisions = |ds: Vec<Delivery>| -> Vec<(String, u64)> {
        ds.into_iter()
            .map(|d| match d {
                Delivery::Relay(r) => (
                    r.json["timelineTargetId"].as_str().unwrap().to_owned(),
                    r.json["liveOverlay"]["revision"].as_u64().unwrap(),
                ),
                other => panic!("relay only, got {other:?}"),
            })
            .collect()
    };
    // Written between runs.
    let (mut hub, _) = hub_with_window(&a);
    hub.set_phone_interest(&session(), true);
    hub.handle_payload(blocks(&a, 1), Millis(0));
    hub.handle_payload(run_event(RunEventKind::Started, 1_000), Millis(1_000));
    hub.handle_payload(blocks(&b, 2), Millis(2_000));
    hub.handle_timeout(Millis(2_050));
    let _ = deliveries(&mut hub);
    assert_eq!(hub.poll_timeout(), Some(Millis(7_000)));
    hub.handle_timeout(Millis(7_000));
    assert_eq!(
        tick_revisions(deliveries(&mut hub)),
        [("session-1".to_owned(), 1)],
        "A was quiet for the whole first tick; B's write armed it"
    );

    // Written in an earlier run that ended before its first tick.
    let (mut hub, _) = hub_with_window(&a);
    hub.set_phone_interest(&session(), true);
    hub.handle_payload(run_event(RunEventKind::Started, 0), Millis(0));
    hub.handle_payload(blocks(&a, 1), Millis(100));
    hub.handle_payload(run_event(RunEventKind::Completed, 200), Millis(200));
    hub.handle_payload(run_event(RunEventKind::Started, 300), Millis(300));
    hub.handle_payload(blocks(&b, 2), Millis(400));
    hub.handle_timeout(Millis(450));
    let _ = deliveries(&mut hub);
    hub.handle_timeout(Millis(5_400));
    assert_eq!(
        tick_revisions(deliveries(&mut hub)),
        [("session-1".to_owned(), 1)]
    );
    // From then on the seed's rule: B, now quiet too, is resent at the second tick.
    hub.handle_timeout(Millis(10_400));
    assert_eq!(
        tick_revisions(deliveries(&mut hub)),
        [("session-1".to_owned(), 1), ("thread-2".to_owned(), 2)]
    );
}

/// The window snapshots among `ds`, as (epoch, revision).
fn window_versions(ds: &[Delivery]) -> Vec<(u64, u64)> {
    ds.iter()
        .filter_map(|d| match d {
            Delivery::Window {
                payload: Payload::Blocks { overlay, .. },
                ..
            } => Some((overlay.settlement_epoch, overlay.revision)),
            _ => None,
        })
        .collect()
}

fn blocks_at(target: &TargetId, epoch: u64, revision: u64) -> Payload {
    Payload::Blocks {
        session: session(),
        target: target.clone(),
        overlay: LiveOverlay {
            settlement_epoch: epoch,
            revision,
            blocks: vec![],
        },
    }
}

// OV-07: "a newer snapshot replaces the waiting one" means newer by version, not by
// arrival: revision 43 then 42 within the window delivers 43, and a higher settlement
// epoch wins over a higher revision of a lower epoch. The relay gets every write at once.
#[test]
fn coalescing_keeps_the_newest_snapshot_not_the_last_to_arrive() {
    let t = main_target();
    let (mut hub, _) = hub_with_window(&t);
    hub.set_phone_interest(&session(), true);
    hub.handle_payload(blocks(&t, 43), Millis(0));
    hub.handle_payload(blocks(&t, 42), Millis(20));
    let relay = deliveries(&mut hub);
    assert_eq!(relay.len(), 2, "the relay is not coalesced: {relay:?}");
    hub.handle_timeout(Millis(50));
    assert_eq!(window_versions(&deliveries(&mut hub)), [(0, 43)]);

    hub.handle_payload(blocks_at(&t, 4, 45), Millis(100));
    hub.handle_payload(blocks_at(&t, 3, 50), Millis(110));
    hub.handle_payload(blocks_at(&t, 4, 44), Millis(120));
    let _ = deliveries(&mut hub);
    hub.handle_timeout(Millis(150));
    assert_eq!(window_versions(&deliveries(&mut hub)), [(4, 45)]);
}

// OV-09: a signal at or after the end of a window goes out at once and stands for the
// signal held back in that window, which is dropped: no older signal follows a newer one.
#[test]
fn a_signal_that_goes_out_drops_the_older_held_signal() {
    let mut hub = LiveHub::new();
    hub.set_phone_interest(&session(), true);
    let signal = |at| Payload::AgentThreads {
        session: session(),
        timestamp: Millis(at),
    };
    let sent_timestamps = |ds: Vec<Delivery>| -> Vec<u64> {
        ds.into_iter()
            .filter_map(|d| match d {
                Delivery::Relay(r) => r.json["timestamp"].as_u64(),
                _ => None,
            })
            .collect()
    };
    assert_eq!(hub.handle_payload(signal(0), Millis(0)), RelayOutcome::Sent);
    assert_eq!(
        hub.handle_payload(signal(900), Millis(900)),
        RelayOutcome::Throttled
    );
    // The window's timer is not handled before the next signal arrives at its end.
    assert_eq!(
        hub.handle_payload(signal(1_000), Millis(1_000)),
        RelayOutcome::Sent
    );
    assert_eq!(sent_timestamps(deliveries(&mut hub)), [0, 1_000]);
    assert_eq!(hub.poll_timeout(), None, "nothing is held any more");
    hub.handle_timeout(Millis(1_000));
    hub.handle_timeout(Millis(2_000));
    assert!(deliveries(&mut hub).is_empty());
    // Later than the window's end too.
    assert_eq!(
        hub.handle_payload(signal(1_500), Millis(1_500)),
        RelayOutcome::Throttled
    );
    assert_eq!(
        hub.handle_payload(signal(2_200), Millis(2_200)),
        RelayOutcome::Sent
    );
    hub.handle_timeout(Millis(10_000));
    assert_eq!(sent_timestamps(deliveries(&mut hub)), [2_200]);
}

// OV-07: the producer saves before it sends, so a client that missed events recovers
// everything from the next snapshot.
#[test]
fn a_client_that_missed_events_recovers_from_the_next_saved_snapshot() {
    use timeline_core::timeline::{ClientMode, Origin, Timeline, TimelineEffect};
    use timeline_core::wire::TimelineWindow;
    let (s, t) = (session(), main_target());
    let mut store = MemoryOverlayStore::new();
    let mut hub = LiveHub::new();
    hub.set_phone_interest(&s, true);
    let mut phone = Timeline::new(ClientMode::Phone);
    phone.open_target(t.clone(), Millis(0));
    let Some(TimelineEffect::LoadLatestWindow { tag, .. }) = phone.poll_effect() else {
        panic!()
    };
    let w = TimelineWindow {
        blocks: vec![],
        oldest_cursor: None,
        boundary_token: timeline_core::cursor::BoundaryToken::claude("c"),
        window_revision: 0,
        live_overlay: Some(LiveOverlay {
            settlement_epoch: 0,
            revision: 0,
            blocks: vec![],
        }),
        anchor_row: None,
        anchor_notice: None,
        newer_cursor: None,
    };
    phone.handle_latest_window(&tag, Ok(w), Millis(1));
    let mut relayed = Vec::new();
    for (i, id) in ["a", "b", "c", "d"].iter().enumerate() {
        let stored = write(
            &mut store,
            &s,
            &t,
            &Change::Publish(vec![live(id, i as u64, "run-1")]),
        )
        .unwrap();
        hub.handle_payload(
            Payload::Blocks {
                session: s.clone(),
                target: t.clone(),
                overlay: stored.stored().unwrap().client_form(),
            },
            Millis(i as u64),
        );
        relayed.extend(deliveries(&mut hub));
    }
    // The phone gets only the last relay event.
    let Delivery::Relay(last) = relayed.last().unwrap() else {
        panic!()
    };
    let overlay: LiveOverlay = serde_json::from_value(last.json["liveOverlay"].clone()).unwrap();
    phone.handle_live_update(&t, overlay, Millis(10));
    let shown: Vec<String> = phone
        .rows()
        .filter(|r| r.origin == Origin::Live)
        .map(|r| r.block.id.as_str().to_owned())
        .collect();
    assert_eq!(shown, ["a", "b", "c", "d"]);
}

// ----- live patches --------------------------------------------------------------------

use overlay_core::store::{OverlayStore, StoredBlock};
use proptest::prelude::*;
use timeline_core::block::Block;
use timeline_core::timeline::{
    ClientMode, IgnoreReason, Origin, Outcome, Timeline, TimelineEffect,
};
use timeline_core::wire::{LivePatch, TimelineWindow};

/// Writes `rows` to the main target and emits the saved snapshot; returns it.
fn publish(
    store: &mut MemoryOverlayStore,
    hub: &mut LiveHub,
    rows: Vec<StoredBlock>,
    now: u64,
) -> LiveOverlay {
    let (s, t) = (session(), main_target());
    let written = write(store, &s, &t, &Change::Publish(rows)).unwrap();
    let snap = written.stored().unwrap().client_form();
    hub.handle_payload(
        Payload::Blocks {
            session: s,
            target: t,
            overlay: snap.clone(),
        },
        Millis(now),
    );
    snap
}

fn text_row(id: &str, t: u64, text: &str) -> StoredBlock {
    let mut row = live(id, t, "run-1");
    row.block.data = serde_json::json!({ "text": text });
    row
}

/// The relay `blocks` and `blocks-patch` events among `ds`, as (event name, JSON).
fn relay_blocks(ds: &[Delivery]) -> Vec<(String, serde_json::Value)> {
    ds.iter()
        .filter_map(|d| match d {
            Delivery::Relay(r) => {
                let kind = r.json["event"].as_str().unwrap().to_owned();
                (kind == "blocks" || kind == BLOCKS_PATCH_EVENT).then(|| (kind, r.json.clone()))
            }
            _ => None,
        })
        .collect()
}

/// A phone that loaded a latest window holding `overlay` (no history rows).
fn phone_at(overlay: LiveOverlay, mode: ClientMode) -> Timeline {
    let mut phone = Timeline::new(mode);
    phone.open_target(main_target(), Millis(0));
    let Some(TimelineEffect::LoadLatestWindow { tag, .. }) = phone.poll_effect() else {
        panic!()
    };
    let w = TimelineWindow {
        blocks: vec![],
        oldest_cursor: None,
        boundary_token: timeline_core::cursor::BoundaryToken::claude("c"),
        window_revision: 1,
        live_overlay: Some(overlay),
        anchor_row: None,
        anchor_notice: None,
        newer_cursor: None,
    };
    assert_eq!(
        phone.handle_latest_window(&tag, Ok(w), Millis(1)),
        Outcome::Applied
    );
    phone
}

/// What a phone does with one relay event: `blocks` whole, `blocks-patch` as a patch.
fn phone_takes(phone: &mut Timeline, d: &Delivery) -> Option<Outcome> {
    let Delivery::Relay(r) = d else { return None };
    let t = main_target();
    match r.json["event"].as_str()? {
        "blocks" => {
            let o: LiveOverlay = serde_json::from_value(r.json["liveOverlay"].clone()).unwrap();
            Some(phone.handle_live_update(&t, o, Millis(5)))
        }
        BLOCKS_PATCH_EVENT => {
            assert_eq!(validate_relay_patch(&r.json["livePatch"]), Ok(()));
            let p: LivePatch = serde_json::from_value(r.json["livePatch"].clone()).unwrap();
            Some(phone.handle_live_patch(&t, p, Millis(5)))
        }
        _ => None,
    }
}

fn rows_of(t: &Timeline) -> Vec<(Origin, Block)> {
    t.rows().map(|r| (r.origin, r.block.clone())).collect()
}

/// A hub whose session has phone interest, a relay speaking `protocol`, and a run.
fn relay_hub(protocol: LiveProtocol) -> LiveHub {
    let mut hub = LiveHub::new();
    hub.set_phone_interest(&session(), true);
    hub.set_relay_protocol(&session(), protocol);
    hub.handle_payload(run_event(RunEventKind::Started, 0), Millis(0));
    let _ = deliveries(&mut hub);
    hub
}

// OV-07 (patches): a relay that negotiated patches gets the first write whole and the
// next ones as patches from what it holds; a phone applying them shows what a phone fed
// the seed's snapshots shows. A relay that did not negotiate gets the seed's snapshots.
#[test]
fn a_patching_relay_gets_patches_and_its_phone_matches_a_snapshot_phone() {
    let mut store = MemoryOverlayStore::new();
    let mut patching = relay_hub(LiveProtocol::Patches);
    let mut seed = relay_hub(LiveProtocol::Snapshots);
    let start = LiveOverlay {
        settlement_epoch: 0,
        revision: 0,
        blocks: vec![],
    };
    let mut by_patch = phone_at(start.clone(), ClientMode::Phone);
    let mut by_snapshot = phone_at(start, ClientMode::Phone);
    let writes = [
        vec![
            text_row("a", 1, "a"),
            text_row("b", 2, "b"),
            text_row("c", 3, "c"),
        ],
        vec![text_row("a", 1, "ab")],
        vec![text_row("a", 1, "abc"), text_row("d", 4, "d")],
    ];
    let mut kinds = Vec::new();
    for (i, rows) in writes.into_iter().enumerate() {
        let snap = publish(&mut store, &mut patching, rows, 10 + i as u64);
        seed.handle_payload(
            Payload::Blocks {
                session: session(),
                target: main_target(),
                overlay: snap,
            },
            Millis(10 + i as u64),
        );
        for d in deliveries(&mut patching) {
            if let Some(o) = phone_takes(&mut by_patch, &d) {
                assert_eq!(o, Outcome::Applied);
            }
            kinds.extend(relay_blocks(&[d]));
        }
        for d in deliveries(&mut seed) {
            let (kind, _) = &relay_blocks(std::slice::from_ref(&d))[0];
            assert_eq!(kind, "blocks", "the seed's relay gets snapshots only");
            assert_eq!(phone_takes(&mut by_snapshot, &d), Some(Outcome::Applied));
        }
        assert_eq!(rows_of(&by_patch), rows_of(&by_snapshot), "write {i}");
    }
    let names: Vec<&str> = kinds.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["blocks", BLOCKS_PATCH_EVENT, BLOCKS_PATCH_EVENT]);
    let second = &kinds[1].1["livePatch"];
    assert_eq!(
        second["baseRevision"],
        kinds[0].1["liveOverlay"]["revision"]
    );
    // Row a only grew: the patch carries its new text, not the row.
    assert_eq!(second["upserts"], serde_json::json!([]));
    assert_eq!(second["appends"].as_array().unwrap().len(), 1, "only row a");
    assert_eq!(second["removals"], serde_json::json!([]));
    let fields: Vec<&str> = kinds[1]
        .1
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        fields.len(),
        4,
        "event, appSessionId, timelineTargetId, livePatch: {fields:?}"
    );
}

// OV-07 (patches): a patch only from a base the hub knows the relay holds: never outside
// a run, never after interest or the protocol changed, a loss was reported, or a
// snapshot raised the epoch.
#[test]
fn the_relay_gets_a_whole_snapshot_whenever_its_base_is_unknown() {
    let mut store = MemoryOverlayStore::new();
    let mut hub = LiveHub::new();
    hub.set_phone_interest(&session(), true);
    hub.set_relay_protocol(&session(), LiveProtocol::Patches);
    let rows = |text: &str| vec![text_row("a", 1, "x"), text_row("b", 2, text)];
    let kind_of_next = |store: &mut MemoryOverlayStore, hub: &mut LiveHub, text: &str, now| {
        publish(store, hub, rows(text), now);
        let got = relay_blocks(&deliveries(hub));
        assert_eq!(got.len(), 1);
        got[0].0.clone()
    };
    assert_eq!(kind_of_next(&mut store, &mut hub, "1", 1), "blocks");
    assert_eq!(
        kind_of_next(&mut store, &mut hub, "2", 2),
        "blocks",
        "no run is active"
    );
    hub.handle_payload(run_event(RunEventKind::Started, 3), Millis(3));
    let _ = deliveries(&mut hub);
    assert_eq!(
        kind_of_next(&mut store, &mut hub, "3", 4),
        BLOCKS_PATCH_EVENT
    );
    // Interest dropped and back: the relay's phones may be others.
    hub.set_phone_interest(&session(), false);
    assert_eq!(
        hub.handle_payload(blocks(&main_target(), 1), Millis(5)),
        RelayOutcome::NoInterest
    );
    hub.set_phone_interest(&session(), true);
    assert_eq!(kind_of_next(&mut store, &mut hub, "4", 6), "blocks");
    assert_eq!(
        kind_of_next(&mut store, &mut hub, "5", 7),
        BLOCKS_PATCH_EVENT
    );
    // The protocol was negotiated again.
    hub.set_relay_protocol(&session(), LiveProtocol::Patches);
    assert_eq!(kind_of_next(&mut store, &mut hub, "6", 8), "blocks");
    // The embedding could not deliver the last event.
    publish(&mut store, &mut hub, rows("7"), 9);
    let lost = deliveries(&mut hub);
    assert_eq!(relay_blocks(&lost)[0].0, BLOCKS_PATCH_EVENT);
    hub.report_lost(&lost[0]);
    assert_eq!(kind_of_next(&mut store, &mut hub, "8", 10), "blocks");
    // A settlement raises the epoch: whole, and the phones reload, so the next is whole.
    let (s, t) = (session(), main_target());
    let settled = write(
        &mut store,
        &s,
        &t,
        &Change::Settle([reply("a")].into_iter().collect()),
    )
    .unwrap();
    let snap = settled.stored().unwrap().client_form();
    assert_eq!(snap.settlement_epoch, 1);
    hub.handle_payload(
        Payload::Blocks {
            session: s,
            target: t,
            overlay: snap,
        },
        Millis(11),
    );
    assert_eq!(relay_blocks(&deliveries(&mut hub))[0].0, "blocks");
    assert_eq!(kind_of_next(&mut store, &mut hub, "9", 12), "blocks");
    assert_eq!(
        kind_of_next(&mut store, &mut hub, "10", 13),
        BLOCKS_PATCH_EVENT
    );
    // A relay speaking snapshots again gets snapshots.
    hub.set_relay_protocol(&session(), LiveProtocol::Snapshots);
    assert_eq!(kind_of_next(&mut store, &mut hub, "11", 14), "blocks");
    assert_eq!(kind_of_next(&mut store, &mut hub, "12", 15), "blocks");
}

// OV-08 (patches): while a run streams into a target, every repair tick sends it whole
// to a patching relay (the seed's rule would wait for a quiet tick), so a phone that lost
// a patch, and refused the next ones keeping its rows, heals within one tick; the run's
// end sends a whole snapshot of every patched target before the completed event.
#[test]
fn repair_and_the_run_end_send_whole_snapshots_that_heal_a_phone_that_lost_a_patch() {
    let mut store = MemoryOverlayStore::new();
    let mut hub = relay_hub(LiveProtocol::Patches);
    let base = publish(&mut store, &mut hub, vec![text_row("a", 1, "")], 100);
    let mut phone = phone_at(base, ClientMode::Phone);
    for d in deliveries(&mut hub) {
        phone_takes(&mut phone, &d);
    }
    let mut outcomes = Vec::new();
    let mut text = String::new();
    let mut healed_at = None;
    for i in 1..=70u64 {
        let now = 100 + i * 100;
        text.push_str("tok ");
        let snap = publish(
            &mut store,
            &mut hub,
            vec![text_row("a", 1, &text), text_row("b", 2, "x")],
            now,
        );
        hub.handle_timeout(Millis(now));
        for d in deliveries(&mut hub) {
            if i == 10 {
                continue; // lost on the way
            }
            let whole = relay_blocks(std::slice::from_ref(&d))
                .first()
                .is_some_and(|(k, _)| k == "blocks");
            let outcome = phone_takes(&mut phone, &d);
            if whole && i > 10 && healed_at.is_none() {
                healed_at = Some(now);
            }
            outcomes.extend(outcome.map(|o| (i, o)));
        }
        if healed_at.is_some() {
            let shown = phone.row(&reply("a")).unwrap().block.data.clone();
            assert_eq!(shown, snap.blocks[0].data, "healed at {i}");
        }
    }
    // Between the loss and the first tick after it, patches were refused, rows kept.
    assert!(outcomes
        .iter()
        .any(|(i, o)| *i > 10 && *o == Outcome::Ignored(IgnoreReason::BaseMismatch)));
    let healed_at = healed_at.unwrap();
    assert!(
        (5_100..=6_100).contains(&healed_at),
        "healed by the first repair tick after the loss, at {healed_at}"
    );
    // The run ends: one whole snapshot first, then the completed event.
    hub.handle_payload(run_event(RunEventKind::Completed, 8_000), Millis(8_000));
    let end: Vec<String> = deliveries(&mut hub)
        .iter()
        .filter_map(|d| match d {
            Delivery::Relay(r) => Some(r.json["event"].as_str().unwrap().to_owned()),
            _ => None,
        })
        .collect();
    assert_eq!(end, ["blocks", "completed"]);
}

// OV-07 (patches): a window that negotiated patches gets, after the 50 ms, one patch
// from the overlay it subscribed with to the newest snapshot; a window that did not gets
// the seed's snapshot; both tagged with the shared streamRevision. A reported loss sends
// the next update whole.
#[test]
fn windows_that_negotiated_patches_get_coalesced_patches_and_others_snapshots() {
    let mut store = MemoryOverlayStore::new();
    let mut hub = LiveHub::new();
    let (s, t) = (session(), main_target());
    publish(
        &mut store,
        &mut hub,
        vec![text_row("a", 1, ""), text_row("b", 2, "b")],
        0,
    );
    hub.handle_timeout(Millis(100));
    let _ = deliveries(&mut hub);
    let sub_p = hub
        .subscribe_with(&mut store, WindowId(1), &s, &t, LiveProtocol::Patches)
        .unwrap();
    let sub_s = hub.subscribe(&mut store, WindowId(2), &s, &t).unwrap();
    let mut desk_p = phone_at(sub_p.overlay.clone().unwrap(), ClientMode::Desktop);
    let mut desk_s = phone_at(sub_s.overlay.clone().unwrap(), ClientMode::Desktop);
    let mut step = |hub: &mut LiveHub, texts: &[&str], at: u64| -> Vec<Delivery> {
        for (i, x) in texts.iter().enumerate() {
            publish(
                &mut store,
                hub,
                vec![text_row("a", 1, x)],
                at + i as u64 * 10,
            );
        }
        hub.handle_timeout(Millis(at + 50));
        deliveries(hub)
    };
    let got = step(&mut hub, &["h", "he", "hel"], 1_000);
    assert_eq!(got.len(), 2, "one event per window: {got:?}");
    let mut revisions = Vec::new();
    for d in &got {
        match d {
            Delivery::WindowPatch {
                window: WindowId(1),
                subscription_id,
                stream_revision,
                patch,
                ..
            } => {
                assert_eq!(*subscription_id, sub_p.subscription_id);
                assert_eq!(
                    patch.base_revision,
                    sub_p.overlay.as_ref().unwrap().revision
                );
                assert_eq!(patch.upserts.len() + patch.appends.len(), 1);
                assert_eq!(
                    desk_p.handle_live_patch(&t, patch.clone(), Millis(2)),
                    Outcome::Applied
                );
                revisions.push(*stream_revision);
            }
            Delivery::Window {
                window: WindowId(2),
                stream_revision,
                payload: Payload::Blocks { overlay, .. },
                ..
            } => {
                assert_eq!(
                    desk_s.handle_live_update(&t, overlay.clone(), Millis(2)),
                    Outcome::Applied
                );
                revisions.push(*stream_revision);
            }
            other => panic!("{other:?}"),
        }
    }
    revisions.sort();
    assert_eq!(revisions[1], revisions[0] + 1, "one shared stream counter");
    assert_eq!(rows_of(&desk_p), rows_of(&desk_s));
    // The next write patches again from what the window now holds ...
    let got = step(&mut hub, &["hell"], 2_000);
    let lost = got
        .iter()
        .find(|d| matches!(d, Delivery::WindowPatch { .. }))
        .unwrap()
        .clone();
    // ... but it was lost: the window's next update is whole.
    hub.report_lost(&lost);
    let got = step(&mut hub, &["hello"], 3_000);
    assert!(
        got.iter().all(|d| matches!(d, Delivery::Window { .. })),
        "{got:?}"
    );
    for d in got {
        if let Delivery::Window {
            window: WindowId(1),
            payload: Payload::Blocks { overlay, .. },
            ..
        } = d
        {
            assert_eq!(
                desk_p.handle_live_update(&t, overlay, Millis(3)),
                Outcome::Applied
            );
        }
    }
    let got = step(&mut hub, &["hello!"], 4_000);
    assert!(got
        .iter()
        .any(|d| matches!(d, Delivery::WindowPatch { .. })));
}

// OV-07 (patches): the relay checks a patch as strictly as a snapshot.
#[test]
fn the_relay_checks_the_patch_shape() {
    let ok = serde_json::json!({"settlementEpoch": 1, "baseRevision": 2, "revision": 3, "upserts": [], "removals": []});
    assert_eq!(validate_relay_patch(&ok), Ok(()));
    let with = |field: &str, v: serde_json::Value| {
        let mut p = ok.clone();
        p[field] = v;
        p
    };
    let mut extra = ok.clone();
    extra["blocks"] = serde_json::json!([]);
    let mut missing = ok.clone();
    missing.as_object_mut().unwrap().remove("removals");
    for bad in [
        extra,
        missing,
        with("upserts", serde_json::json!({})),
        serde_json::json!([]),
    ] {
        assert_eq!(
            validate_relay_patch(&bad),
            Err(RelayError::PatchFields),
            "{bad}"
        );
    }
    for (field, v) in [
        (
            "settlementEpoch",
            serde_json::json!(9_007_199_254_740_992u64),
        ),
        ("baseRevision", serde_json::json!(-1)),
        ("revision", serde_json::json!(3.5)),
        ("revision", serde_json::json!(9_007_199_254_740_992u64)),
    ] {
        assert_eq!(
            validate_relay_patch(&with(field, v.clone())),
            Err(RelayError::PatchNotExact),
            "{field}: {v}"
        );
    }
    for (base, revision) in [(0, 3), (3, 3), (4, 3)] {
        let p = with("baseRevision", serde_json::json!(base));
        assert_eq!(
            validate_relay_patch(&with_rev(p, revision)),
            Err(RelayError::PatchRevisions)
        );
    }
    fn with_rev(mut p: serde_json::Value, revision: u64) -> serde_json::Value {
        p["revision"] = serde_json::json!(revision);
        p
    }
}

/// Streams one row's text, `tokens` tokens 20 ms apart, into an overlay of `rows` other
/// rows, in a run; every saved snapshot goes to two hubs, one whose relay speaks
/// patches and one whose relay speaks the seed's snapshots. Returns the bytes of every
/// relay event each sent from the first token to the run's end (repair and the run's
/// end included), the rows of a phone fed by the patching relay, and the saved overlay.
fn stream_one_row(rows: u64, tokens: u64) -> (usize, usize, Vec<Block>, Vec<Block>) {
    let (s, t) = (session(), main_target());
    let mut store = MemoryOverlayStore::new();
    let mut hubs = [
        relay_hub(LiveProtocol::Patches),
        relay_hub(LiveProtocol::Snapshots),
    ];
    let mut bytes = [0usize; 2];
    let overlay: Vec<StoredBlock> = (0..rows)
        .map(|i| {
            text_row(
                &format!("live-{i}"),
                1_000 + i,
                "streaming reply text of ordinary length",
            )
        })
        .collect();
    let mut phone = None;
    let mut text = String::new();
    for i in 0..=tokens {
        let now = 20 + i * 20;
        let row = if i == 0 {
            overlay.clone()
        } else {
            text.push_str(["The ", "row ", "grows ", "by ", "one ", "token."][(i % 6) as usize]);
            vec![text_row("streamed", 5_000, &text)]
        };
        let snap = write(&mut store, &s, &t, &Change::Publish(row))
            .unwrap()
            .stored()
            .unwrap()
            .client_form();
        let phone = phone.get_or_insert_with(|| phone_at(snap.clone(), ClientMode::Phone));
        for (h, hub) in hubs.iter_mut().enumerate() {
            let payload = Payload::Blocks {
                session: s.clone(),
                target: t.clone(),
                overlay: snap.clone(),
            };
            assert_eq!(hub.handle_payload(payload, Millis(now)), RelayOutcome::Sent);
            hub.handle_timeout(Millis(now));
            if i == tokens {
                hub.handle_payload(run_event(RunEventKind::Completed, now), Millis(now));
            }
            for d in deliveries(hub) {
                match &d {
                    // The 1,000 rows were there before the streaming started.
                    Delivery::Relay(r) if i > 0 => {
                        bytes[h] += serde_json::to_vec(&r.json).unwrap().len();
                    }
                    _ => {}
                }
                if h == 0 {
                    if let Some(o) = phone_takes(phone, &d) {
                        assert!(matches!(o, Outcome::Applied | Outcome::Unchanged), "{o:?}");
                    }
                }
            }
        }
    }
    let shown = phone
        .map(|p| p.rows().map(|r| r.block.clone()).collect())
        .unwrap_or_default();
    let mut saved = store.load(&s, &t).unwrap().unwrap().client_form().blocks;
    saved.sort_by_cached_key(Block::order_key);
    (bytes[0], bytes[1], shown, saved)
}

// OV-07, OV-08 (patches): streaming one row token by token (not coalesced: every write
// goes to the relay at once, as the seed says) into a 1,000-row overlay sends at most 2 %
// of the bytes whole snapshots send for the same writes, repair and the run's end
// included, and the phone fed patches ends with the saved rows.
#[test]
fn streaming_one_row_into_1000_rows_sends_at_most_2_percent_of_the_snapshot_bytes() {
    let (patched, whole, shown, saved) = stream_one_row(1_000, 500);
    assert_eq!(shown.len(), 1_001);
    assert_eq!(shown, saved);
    let ratio = patched as f64 / whole as f64;
    assert!(
        ratio <= 0.02,
        "patches {patched} B, snapshots {whole} B: {ratio:.4}"
    );
}

/// A phone takes one relay event (a refusal keeps every row); a reload it asks for is
/// then answered at once with the saved overlay.
fn feed(
    phone: &mut Timeline,
    d: &Delivery,
    store: &mut MemoryOverlayStore,
    now: u64,
) -> Option<Outcome> {
    let before = rows_of(phone);
    let outcome = phone_takes(phone, d);
    if let Some(Outcome::Ignored(_) | Outcome::ReloadRequired(_)) = outcome {
        assert_eq!(rows_of(phone), before, "{outcome:?}");
    }
    while let Some(e) = phone.poll_effect() {
        if let TimelineEffect::LoadLatestWindow { tag, .. } = e {
            let o = store
                .load(&session(), &main_target())
                .unwrap()
                .unwrap()
                .client_form();
            let w = TimelineWindow {
                blocks: vec![],
                oldest_cursor: None,
                boundary_token: timeline_core::cursor::BoundaryToken::claude("c"),
                window_revision: now,
                live_overlay: Some(o),
                anchor_row: None,
                anchor_notice: None,
                newer_cursor: None,
            };
            assert_eq!(
                phone.handle_latest_window(&tag, Ok(w), Millis(now)),
                Outcome::Applied
            );
        }
    }
    outcome
}

#[derive(Clone, Debug)]
enum HostStep {
    /// Publish rows `live-<n>` with a new text.
    Publish(Vec<u8>),
    /// Retract a row.
    Retract(u8),
    /// History now holds a row: it settles (epoch + 1).
    Settle(u8),
    /// Time passes (repair ticks, window timers).
    Advance(u64),
    /// A run starts or ends.
    Run(bool),
    /// The next relay event is lost on the way to the lossy phone.
    LoseNext,
}

fn host_step() -> impl Strategy<Value = HostStep> {
    prop_oneof![
        8 => prop::collection::vec(0u8..8, 1..3).prop_map(HostStep::Publish),
        2 => (0u8..8).prop_map(HostStep::Retract),
        1 => (0u8..8).prop_map(HostStep::Settle),
        3 => (1u64..3_000).prop_map(HostStep::Advance),
        1 => any::<bool>().prop_map(HostStep::Run),
        2 => Just(HostStep::LoseNext),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fixtures::proptest_cases()))]

    // OV-07, OV-08 (patches), TL-06: for any sequence of overlay writes, run events,
    // timers and losses: every patch the hub sends applies to what a recipient that lost
    // nothing holds and gives the saved snapshot of its revision; a patching window shows
    // what a snapshot window shows; a phone that lost events never loses a row it showed
    // without a reload, and the whole snapshot at the run's end heals it.
    #[test]
    fn patches_apply_to_what_recipients_hold_and_snapshots_heal_losses(
        steps in prop::collection::vec(host_step(), 1..80),
    ) {
        let (s, t) = (session(), main_target());
        let mut store = MemoryOverlayStore::new();
        let mut hub = LiveHub::new();
        hub.set_phone_interest(&s, true);
        hub.set_relay_protocol(&s, LiveProtocol::Patches);
        let sub_p = hub.subscribe_with(&mut store, WindowId(1), &s, &t, LiveProtocol::Patches).unwrap();
        let _ = hub.subscribe(&mut store, WindowId(2), &s, &t).unwrap();
        assert!(sub_p.overlay.is_none());
        // What a relay recipient that loses nothing holds, and the saved snapshots.
        let mut relay_held: Option<LiveOverlay> = None;
        let mut window_held: Option<LiveOverlay> = None;
        let mut window_whole: Option<LiveOverlay> = None;
        let mut saved: std::collections::HashMap<u64, LiveOverlay> = Default::default();
        let mut lossy: Option<Timeline> = None;
        let mut lose_next = false;
        let mut now = 0u64;
        let mut running = false;
        let mut version = 0u64;
        for step in steps {
            now += 1;
            let change = match step {
                HostStep::Publish(ids) => {
                    version += 1;
                    Some(Change::Publish(ids.iter().map(|i| text_row(&format!("live-{i}"), u64::from(*i), &format!("v{version}"))).collect()))
                }
                HostStep::Retract(i) => Some(Change::Retract(vec![reply(&format!("live-{i}"))])),
                HostStep::Settle(i) => Some(Change::Settle([reply(&format!("live-{i}"))].into_iter().collect())),
                HostStep::Advance(ms) => {
                    now += ms;
                    hub.handle_timeout(Millis(now));
                    None
                }
                HostStep::Run(start) => {
                    let kind = if start { RunEventKind::Started } else { RunEventKind::Completed };
                    if start != running {
                        running = start;
                        hub.handle_payload(run_event(kind, now), Millis(now));
                    }
                    None
                }
                HostStep::LoseNext => {
                    lose_next = true;
                    None
                }
            };
            if let Some(change) = change {
                if let Some(stored) = write(&mut store, &s, &t, &change).unwrap().stored() {
                    let snap = stored.client_form();
                    saved.insert(snap.revision, snap.clone());
                    hub.handle_payload(Payload::Blocks { session: s.clone(), target: t.clone(), overlay: snap }, Millis(now));
                }
            }
            for d in deliveries(&mut hub) {
                match &d {
                    Delivery::Relay(r) if r.json["event"] == "blocks" => {
                        let o: LiveOverlay = serde_json::from_value(r.json["liveOverlay"].clone()).unwrap();
                        if relay_held.as_ref().is_none_or(|h| (o.settlement_epoch, o.revision) >= (h.settlement_epoch, h.revision)) {
                            relay_held = Some(o.clone());
                        }
                        if lossy.is_none() {
                            lossy = Some(phone_at(o, ClientMode::Phone));
                            continue;
                        }
                    }
                    Delivery::Relay(r) if r.json["event"] == BLOCKS_PATCH_EVENT => {
                        let p: LivePatch = serde_json::from_value(r.json["livePatch"].clone()).unwrap();
                        let held = relay_held.as_ref().unwrap();
                        let next = p.apply_to(held);
                        prop_assert_eq!(next.as_ref().ok(), saved.get(&p.revision), "relay patch {:?}", p);
                        relay_held = next.ok();
                    }
                    Delivery::WindowPatch { window, patch, .. } => {
                        prop_assert_eq!(*window, WindowId(1));
                        let held = window_held.as_ref().unwrap();
                        let next = patch.apply_to(held);
                        prop_assert_eq!(next.as_ref().ok(), saved.get(&patch.revision));
                        window_held = next.ok();
                    }
                    Delivery::Window { window, payload: Payload::Blocks { overlay, .. }, .. } => {
                        let mut sorted = overlay.clone();
                        sorted.blocks.sort_by_cached_key(Block::order_key);
                        let newer = |h: &Option<LiveOverlay>| h.as_ref().is_none_or(|h| (overlay.settlement_epoch, overlay.revision) >= (h.settlement_epoch, h.revision));
                        if *window == WindowId(1) && newer(&window_held) {
                            window_held = Some(sorted);
                        } else if *window == WindowId(2) && newer(&window_whole) {
                            window_whole = Some(sorted);
                        }
                    }
                    _ => {}
                }
                if let Some(phone) = lossy.as_mut() {
                    if lose_next && matches!(d, Delivery::Relay(_)) {
                        lose_next = false;
                        continue;
                    }
                    feed(phone, &d, &mut store, now);
                }
            }
            // Both windows got this step's deliveries: a patching window shows what a
            // snapshot window shows.
            prop_assert_eq!(&window_held, &window_whole);
        }
        // One more write in a run, then the run ends, nothing lost now: the whole
        // snapshot of the run's end (or a reload) heals the lossy phone.
        if !running {
            hub.handle_payload(run_event(RunEventKind::Started, now), Millis(now));
        }
        write(&mut store, &s, &t, &Change::Publish(vec![text_row("live-0", 0, "final")])).unwrap();
        let last = store.load(&s, &t).unwrap().unwrap().client_form();
        hub.handle_payload(Payload::Blocks { session: s.clone(), target: t.clone(), overlay: last.clone() }, Millis(now));
        hub.handle_payload(run_event(RunEventKind::Completed, now + 1), Millis(now + 1));
        let deliveries = deliveries(&mut hub);
        let phone = lossy.get_or_insert_with(|| phone_at(last.clone(), ClientMode::Phone));
        for d in deliveries {
            feed(phone, &d, &mut store, now + 2);
        }
        let live: Vec<Block> = phone.rows().filter(|r| r.origin == Origin::Live).map(|r| r.block.clone()).collect();
        let mut want = last.blocks.clone();
        want.sort_by_cached_key(Block::order_key);
        prop_assert_eq!(live, want);
    }
}

// OV-04, OV-07, OV-08, TL-06: a target deleted and written again continues its
// settlement epoch one above the old one, so a phone that still holds the old target
// reloads (keeping its rows until the latest window answers) instead of ignoring the
// new target's updates as stale; windows get the new snapshot and repair resends it,
// never the old target's.
#[test]
fn a_target_written_again_after_a_delete_reaches_clients_that_held_the_old_one() {
    use timeline_core::timeline::LoadReason;
    let (s, t) = (session(), main_target());
    let mut store = MemoryOverlayStore::new();
    let mut hub = relay_hub(LiveProtocol::Snapshots);
    let _ = hub.subscribe(&mut store, WindowId(1), &s, &t).unwrap();
    publish(
        &mut store,
        &mut hub,
        vec![
            text_row("a", 1, "a"),
            text_row("b", 2, "b"),
            text_row("c", 3, "c"),
        ],
        10,
    );
    for id in ["a", "b"] {
        write(&mut store, &s, &t, &Change::Settle([reply(id)].into())).unwrap();
    }
    let old = store.load(&s, &t).unwrap().unwrap().client_form();
    assert_eq!(old.settlement_epoch, 2);
    hub.handle_payload(
        Payload::Blocks {
            session: s.clone(),
            target: t.clone(),
            overlay: old.clone(),
        },
        Millis(20),
    );
    hub.handle_timeout(Millis(60));
    assert_eq!(window_versions(&deliveries(&mut hub)), [(2, old.revision)]);
    let mut phone = phone_at(old.clone(), ClientMode::Phone);

    assert!(store.delete(&s, &t).unwrap());
    let new = publish(&mut store, &mut hub, vec![text_row("d", 4, "d")], 100);
    assert_eq!(
        new.settlement_epoch, 3,
        "one above the deleted target's epoch"
    );
    let got = deliveries(&mut hub);
    let relayed: Vec<&Delivery> = got
        .iter()
        .filter(|d| matches!(d, Delivery::Relay(_)))
        .collect();
    assert_eq!(relayed.len(), 1);
    assert_eq!(
        feed(&mut phone, relayed[0], &mut store, 101),
        Some(Outcome::ReloadRequired(LoadReason::EpochAdvanced)),
        "a phone holding epoch 2 reloads; it would ignore a restarted epoch 0 as stale"
    );
    let live: Vec<Block> = phone
        .rows()
        .filter(|r| r.origin == Origin::Live)
        .map(|r| r.block.clone())
        .collect();
    assert_eq!(live, new.blocks, "the reload shows the new target's rows");

    hub.handle_timeout(Millis(150));
    assert_eq!(window_versions(&deliveries(&mut hub)), [(3, new.revision)]);
    // The timer was armed at 10; the write at 100 counts for the first tick, and the
    // second resends the new target's snapshot.
    hub.handle_timeout(Millis(5_010));
    assert!(deliveries(&mut hub).is_empty());
    hub.handle_timeout(Millis(10_010));
    let repaired = relay_blocks(&deliveries(&mut hub));
    assert_eq!(repaired.len(), 1);
    assert_eq!(repaired[0].1["liveOverlay"]["settlementEpoch"], 3);
    assert_eq!(repaired[0].1["liveOverlay"]["revision"], new.revision);
}

/// Versions of one target's snapshots in arrival order: epochs never fall and revisions
/// rise, as the store hands them out, then shuffled.
fn shuffled_versions() -> impl Strategy<Value = (Vec<(u64, u64)>, Vec<u64>)> {
    (
        0u64..3,
        prop::collection::vec((any::<bool>(), 1u64..4), 1..10),
    )
        .prop_flat_map(|(epoch, steps)| {
            let mut versions = Vec::new();
            let (mut e, mut r) = (epoch, 0u64);
            for (settles, gap) in steps {
                e += u64::from(settles);
                r += gap;
                versions.push((e, r));
            }
            let n = versions.len();
            (
                Just(versions).prop_shuffle(),
                prop::collection::vec(0u64..50, n),
            )
        })
}

#[derive(Clone, Debug)]
enum SignalStep {
    /// A signal after this many ms.
    Emit(u64),
    /// The driver handles the timer after this many ms (early, on time or late).
    Timeout(u64),
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fixtures::proptest_cases()))]

    // OV-07: whatever order the snapshots of one target arrive in within a coalescing
    // window, the window gets one event, with the newest of them (highest epoch, then
    // highest revision); the relay gets every one at once, in arrival order.
    #[test]
    fn the_window_gets_the_newest_snapshot_whatever_the_arrival_order(
        (versions, offsets) in shuffled_versions(),
    ) {
        let t = main_target();
        let (mut hub, _) = hub_with_window(&t);
        hub.set_phone_interest(&session(), true);
        let mut offsets = offsets;
        offsets.sort_unstable();
        let start = 1_000;
        for ((epoch, revision), at) in versions.iter().zip(&offsets) {
            hub.handle_payload(blocks_at(&t, *epoch, *revision), Millis(start + at));
        }
        let relayed: Vec<(u64, u64)> = relay_blocks(&deliveries(&mut hub))
            .iter()
            .map(|(_, j)| (
                j["liveOverlay"]["settlementEpoch"].as_u64().unwrap(),
                j["liveOverlay"]["revision"].as_u64().unwrap(),
            ))
            .collect();
        prop_assert_eq!(&relayed, &versions);
        let due = start + offsets[0] + COALESCE_WINDOW.0;
        prop_assert_eq!(hub.poll_timeout(), Some(Millis(due)));
        hub.handle_timeout(Millis(due));
        let newest = versions.iter().copied().max().unwrap();
        prop_assert_eq!(window_versions(&deliveries(&mut hub)), vec![newest]);
    }

    // OV-09: for any signals and any timer handling (early, on time, late): signals go
    // out at least a window apart, the first at once; no signal goes out after a newer
    // one; and the newest signal always goes out.
    #[test]
    fn agent_threads_signals_never_go_out_stale_and_the_newest_always_goes_out(
        steps in prop::collection::vec(
            prop_oneof![
                3 => (1u64..1_500).prop_map(SignalStep::Emit),
                2 => (0u64..1_500).prop_map(SignalStep::Timeout),
            ],
            1..40,
        ),
    ) {
        let mut hub = LiveHub::new();
        hub.set_phone_interest(&session(), true);
        let mut now = 0u64;
        let mut emitted = Vec::new();
        // (when it went out, its timestamp)
        let mut sent: Vec<(u64, u64)> = Vec::new();
        let drain = |hub: &mut LiveHub, now: u64, sent: &mut Vec<(u64, u64)>| {
            for d in deliveries(hub) {
                if let Delivery::Relay(r) = d {
                    sent.push((now, r.json["timestamp"].as_u64().unwrap()));
                }
            }
        };
        for step in steps {
            match step {
                SignalStep::Emit(gap) => {
                    now += gap;
                    emitted.push(now);
                    let first = sent.is_empty() && emitted.len() == 1;
                    let outcome = hub.handle_payload(
                        Payload::AgentThreads { session: session(), timestamp: Millis(now) },
                        Millis(now),
                    );
                    if first {
                        prop_assert_eq!(outcome, RelayOutcome::Sent);
                    }
                }
                SignalStep::Timeout(gap) => {
                    now += gap;
                    hub.handle_timeout(Millis(now));
                }
            }
            drain(&mut hub, now, &mut sent);
        }
        while let Some(at) = hub.poll_timeout() {
            now = now.max(at.0);
            hub.handle_timeout(Millis(now));
            drain(&mut hub, now, &mut sent);
        }
        for pair in sent.windows(2) {
            prop_assert!(pair[1].0 >= pair[0].0 + AGENT_THREADS_WINDOW.0, "{:?}", sent);
            prop_assert!(pair[1].1 > pair[0].1, "a stale signal went out: {:?}", sent);
        }
        if let Some(last) = emitted.last() {
            prop_assert_eq!(sent.last().map(|s| s.1), Some(*last), "{:?}", sent);
        }
    }
}
