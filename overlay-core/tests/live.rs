//! Live delivery (OV-07 to OV-09).
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use overlay_core::live::{
    validate_relay_overlay, Delivery, LiveHub, Payload, RelayError, RelayOutcome, RunEvent,
    RunEventKind, WindowId,
};
use overlay_core::overlay::{write, Change};
use overlay_core::store::memory::MemoryOverlayStore;
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
    std::iter::from_fn(|| hub.poll_delivery()).collect()
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
    hub.emit(run_event(RunEventKind::Started, 0), Millis(0));
    let _ = deliveries(&mut hub);
    for (rev, at) in [(41, 0), (42, 20), (43, 45)] {
        assert_eq!(
            hub.emit(blocks(&t, rev), Millis(10 + at)),
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
    hub.emit(run_event(RunEventKind::Completed, 58), Millis(58));
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
    hub.emit(blocks(&a, 1), Millis(0));
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
    hub.emit(
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
    hub.emit(blocks(&main_target(), 5), Millis(0));
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
        hub.emit(blocks(t, 1), Millis(0));
    }
    assert!(deliveries(&mut hub).is_empty(), "128 targets wait");
    hub.emit(blocks(&targets[128], 1), Millis(1));
    assert_eq!(deliveries(&mut hub).len(), 129);
    assert_eq!(hub.poll_timeout(), None);
}

// OV-07: progress carries only run events, with their fields; failed carries
// agentErrorInfo to the relay only.
#[test]
fn progress_and_relay_fields_of_run_events() {
    let (mut hub, _) = hub_with_window(&main_target());
    hub.set_phone_interest(&session(), true);
    hub.emit(run_event(RunEventKind::Failed, 7), Millis(7));
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
    hub.emit(run_event(RunEventKind::Aborted, 8), Millis(8));
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
    assert_eq!(hub.emit(blocks(&t, 1), Millis(0)), RelayOutcome::NoInterest);
    hub.set_phone_interest(&session(), true);
    assert_eq!(
        hub.emit(blocks(&t, 0), Millis(0)),
        RelayOutcome::Rejected(RelayError::ZeroRevision)
    );
    assert_eq!(
        hub.emit(blocks(&t, 9_007_199_254_740_991), Millis(0)),
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
    assert_eq!(hub.emit(blocks(&t, 3), Millis(0)), RelayOutcome::NoInterest);
}

// OV-08: every 5 s while a run is active, targets without a new write are re-sent to
// the relay only.
#[test]
fn relay_repair_resends_quiet_targets_every_5_seconds_while_a_run_is_active() {
    let (a, b) = (main_target(), TargetId::new("thread-2").unwrap());
    let (mut hub, _) = hub_with_window(&a);
    hub.set_phone_interest(&session(), true);
    hub.emit(run_event(RunEventKind::Started, 0), Millis(0));
    assert_eq!(
        hub.poll_timeout(),
        None,
        "armed by the first snapshot of the run"
    );
    hub.emit(blocks(&a, 10), Millis(100));
    hub.emit(blocks(&b, 11), Millis(200));
    hub.handle_timeout(Millis(150));
    let _ = deliveries(&mut hub);
    assert_eq!(hub.poll_timeout(), Some(Millis(5_100)));
    // Target B is written again within the first tick; A is not.
    hub.emit(blocks(&b, 12), Millis(4_000));
    let _ = deliveries(&mut hub);
    hub.handle_timeout(Millis(5_100));
    let first_tick = deliveries(&mut hub);
    // Both were written since the run started: the first tick resends nothing.
    assert!(first_tick.is_empty(), "{first_tick:?}");
    hub.emit(blocks(&b, 13), Millis(6_000));
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
    hub.emit(run_event(RunEventKind::Completed, 11_000), Millis(11_000));
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
    assert_eq!(hub.emit(signal(0), Millis(0)), RelayOutcome::Sent);
    let first = deliveries(&mut hub);
    assert_eq!(first.len(), 1);
    let Delivery::Relay(r) = &first[0] else {
        panic!()
    };
    assert_eq!(r.json["event"], "agent-threads");
    assert_eq!(r.json["threadId"], serde_json::Value::Null);
    for at in [100, 300, 900] {
        assert_eq!(hub.emit(signal(at), Millis(at)), RelayOutcome::Throttled);
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
        hub.emit(
            Payload::AgentThreads {
                session: other,
                timestamp: Millis(1_001)
            },
            Millis(1_001)
        ),
        RelayOutcome::Sent
    );
}

// OV-07: the producer saves before it sends, so a client that missed events recovers
// everything from the next snapshot.
#[test]
fn a_client_that_missed_events_recovers_from_the_next_saved_snapshot() {
    use timeline_core::timeline::{ClientMode, Effect, Origin, Timeline};
    use timeline_core::wire::TimelineWindow;
    let (s, t) = (session(), main_target());
    let mut store = MemoryOverlayStore::new();
    let mut hub = LiveHub::new();
    hub.set_phone_interest(&s, true);
    let mut phone = Timeline::new(ClientMode::Phone);
    phone.open_target(t.clone(), Millis(0));
    let Some(Effect::LoadLatestWindow { tag, .. }) = phone.poll_effect() else {
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
        hub.emit(
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
