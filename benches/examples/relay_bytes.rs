//! Bytes a host sends while one row's text streams token by token into an overlay of
//! 1,000 other rows: whole snapshots (the seed's protocol) against live patches, on the
//! relay (never coalesced: every write goes at once) and on the window stream (coalesced
//! for 50 ms), for the same writes in one run.
//!
//! Each case saves every write to a memory overlay store and emits the saved snapshot to
//! two hubs: one whose relay and window speak snapshots, one whose relay and window
//! negotiated patches. A run is active, so relay repair ticks every 5 s (a patching relay
//! gets a whole snapshot at each tick while the row streams) and the run's end sends a
//! whole snapshot of a patched target. Tokens come every 20 ms (50 tokens per second);
//! a token is 3 to 6 characters. Counted: the JSON of every relay event from the first
//! token to the run's end, and the JSON of the overlay or patch of every window event.
//! A phone fed the patching relay must end with the saved rows.
//!
//! Bytes, not time: the figures are deterministic. The program fails when the relay
//! ratio of the 500-token case passes 2 %.
//!
//! `cargo run --release -p benches --example relay_bytes`
#![allow(clippy::unwrap_used)]

use overlay_core::live::{
    Delivery, LiveHub, LiveProtocol, Payload, RunEvent, RunEventKind, WindowId, BLOCKS_PATCH_EVENT,
};
use overlay_core::overlay::Change;
use overlay_core::store::memory::MemoryOverlayStore;
use overlay_core::store::write;
use overlay_core::store::{OverlayStore, RowClass, StoredBlock};
use timeline_core::block::Block;
use timeline_core::cursor::BoundaryToken;
use timeline_core::key::{BlockKey, BlockType, RunId, SessionId, TargetId};
use timeline_core::order::SourceOrder;
use timeline_core::time::Millis;
use timeline_core::timeline::{ClientMode, Outcome, Timeline, TimelineEffect};
use timeline_core::wire::{LiveOverlay, LivePatch, TimelineWindow};

const OVERLAY_ROWS: u64 = 1_000;
const TOKEN_EVERY_MS: u64 = 20;
const TOKENS: [&str; 6] = ["The ", "row ", "grows ", "by ", "one ", "token."];

fn row(id: &str, t: u64, text: &str) -> StoredBlock {
    StoredBlock {
        block: Block::new(
            BlockKey::parse(BlockType::AgentReply, id).unwrap(),
            Millis(t),
        )
        .with_source_order(SourceOrder::live(t))
        .with_data(serde_json::json!({ "text": text })),
        class: RowClass::Ordinary,
        run_id: Some(RunId::new("run-1").unwrap()),
    }
}

fn run_event(kind: RunEventKind, session: &SessionId, at: u64) -> Payload {
    Payload::Run(RunEvent {
        event: kind,
        app_session_id: session.clone(),
        run_id: RunId::new("run-1").unwrap(),
        timestamp: Millis(at),
        operation_id: None,
        agent_error_info: None,
    })
}

fn phone_at(target: &TargetId, overlay: LiveOverlay) -> Timeline {
    let mut phone = Timeline::new(ClientMode::Phone);
    phone.open_target(target.clone(), Millis(0));
    let Some(TimelineEffect::LoadLatestWindow { tag, .. }) = phone.poll_effect() else {
        panic!("the open asks for a window")
    };
    let window = TimelineWindow {
        blocks: vec![],
        oldest_cursor: None,
        boundary_token: BoundaryToken::claude("c"),
        window_revision: 1,
        live_overlay: Some(overlay),
        anchor_row: None,
        anchor_notice: None,
        newer_cursor: None,
    };
    assert_eq!(
        phone.handle_latest_window(&tag, Ok(window), Millis(1)),
        Outcome::Applied
    );
    phone
}

/// Bytes per sink: `[relay, window]`.
#[derive(Clone, Copy, Default)]
/// Bytes by sink: the relay's JSON, the window's JSON, and the relay's frames on the
/// wire (each event in its `chat:timeline-updated` notification, as a phone reads it).
struct Bytes([usize; 3]);

/// Streams `tokens` tokens; returns the bytes of the snapshot hub and the patch hub.
fn stream(tokens: u64) -> (Bytes, Bytes) {
    let session = SessionId::new("session-1").unwrap();
    let target = TargetId::main(&session);
    let mut store = MemoryOverlayStore::new();
    let mut hubs = [LiveProtocol::Snapshots, LiveProtocol::Patches].map(|protocol| {
        let mut hub = LiveHub::new();
        hub.set_phone_interest(&session, true);
        hub.set_relay_protocol(&session, protocol);
        hub.handle_payload(run_event(RunEventKind::Started, &session, 0), Millis(0));
        while hub.poll_effect().is_some() {}
        hub
    });
    let mut bytes = [Bytes::default(); 2];
    let mut phone: Option<Timeline> = None;
    let mut text = String::new();
    for i in 0..=tokens {
        let now = 20 + i * TOKEN_EVERY_MS;
        let rows = if i == 0 {
            (0..OVERLAY_ROWS)
                .map(|n| {
                    row(
                        &format!("live-{n}"),
                        1_000 + n,
                        "streaming reply text of ordinary length",
                    )
                })
                .collect()
        } else {
            text.push_str(TOKENS[(i % 6) as usize]);
            vec![row("streamed", 5_000, &text)]
        };
        let written = write(&mut store, &session, &target, &Change::Publish(rows)).unwrap();
        let snap = written.stored().unwrap().client_form();
        let phone = phone.get_or_insert_with(|| phone_at(&target, snap.clone()));
        for (h, hub) in hubs.iter_mut().enumerate() {
            let blocks = Payload::Blocks {
                session: session.clone(),
                target: target.clone(),
                overlay: snap.clone(),
            };
            hub.handle_payload(blocks, Millis(now));
            if i == 0 {
                // A window opens on the overlay before the row streams.
                let protocol = [LiveProtocol::Snapshots, LiveProtocol::Patches][h];
                hub.subscribe_with(&mut store, WindowId(1), &session, &target, protocol)
                    .unwrap();
            }
            hub.handle_timeout(Millis(now));
            if i == tokens {
                hub.handle_timeout(Millis(now + 50));
                hub.handle_payload(
                    run_event(RunEventKind::Completed, &session, now + 50),
                    Millis(now + 50),
                );
            }
            while let Some(d) = hub.poll_effect() {
                if i == 0 {
                    continue; // the 1,000 rows were there before the streaming
                }
                let (sink, size) = match &d {
                    Delivery::Relay(r) => (0, serde_json::to_vec(&r.json).unwrap().len()),
                    Delivery::Window {
                        payload: Payload::Blocks { overlay, .. },
                        ..
                    } => (1, serde_json::to_vec(overlay).unwrap().len()),
                    Delivery::WindowPatch { patch, .. } => {
                        (1, serde_json::to_vec(patch).unwrap().len())
                    }
                    _ => continue,
                };
                bytes[h].0[sink] += size;
                if let Delivery::Relay(r) = &d {
                    bytes[h].0[2] += host_wire::relay_frame(r).len();
                }
                if h == 1 {
                    if let Delivery::Relay(r) = &d {
                        if r.json["event"] == BLOCKS_PATCH_EVENT {
                            let p: LivePatch =
                                serde_json::from_value(r.json["livePatch"].clone()).unwrap();
                            assert_eq!(
                                phone.handle_live_patch(&target, p, Millis(now)),
                                Outcome::Applied
                            );
                        } else if r.json["event"] == "blocks" {
                            let o: LiveOverlay =
                                serde_json::from_value(r.json["liveOverlay"].clone()).unwrap();
                            let taken = phone.handle_live_update(&target, o, Millis(now));
                            assert!(matches!(taken, Outcome::Applied | Outcome::Unchanged));
                        }
                    }
                }
            }
        }
    }
    let mut saved = store
        .load(&session, &target)
        .unwrap()
        .unwrap()
        .client_form()
        .blocks;
    saved.sort_by_cached_key(Block::order_key);
    let shown: Vec<Block> = phone.unwrap().rows().map(|r| r.block.clone()).collect();
    assert_eq!(shown, saved, "the phone fed patches shows the saved rows");
    (bytes[0], bytes[1])
}

fn kib(b: usize) -> String {
    format!("{:.1} KiB", b as f64 / 1024.0)
}

fn main() {
    println!(
        "one row streamed into a {OVERLAY_ROWS}-row overlay, a token every {TOKEN_EVERY_MS} ms"
    );
    println!("| tokens (text length) | sink | whole snapshots | patches | patches / snapshots |");
    println!("|---:|---|---:|---:|---:|");
    let mut missed = false;
    for tokens in [100u64, 500, 2_000] {
        let chars: usize = (1..=tokens).map(|i| TOKENS[(i % 6) as usize].len()).sum();
        let (whole, patched) = stream(tokens);
        for (sink, name) in [
            (0, "relay (not coalesced)"),
            (1, "window (coalesced 50 ms)"),
        ] {
            let ratio = patched.0[sink] as f64 / whole.0[sink] as f64;
            println!(
                "| {tokens} ({chars} chars) | {name} | {} | {} | {:.2} % |",
                kib(whole.0[sink]),
                kib(patched.0[sink]),
                ratio * 100.0
            );
            if tokens == 500 && sink == 0 && ratio > 0.02 {
                missed = true;
            }
        }
    }
    println!();
    println!("on the wire (the relay's notification frames, as a phone reads them):");
    println!("| tokens | whole snapshots, bytes per token | patches, bytes per token | patches / snapshots |");
    println!("|---:|---:|---:|---:|");
    for tokens in [100u64, 500, 2_000] {
        let (whole, patched) = stream(tokens);
        println!(
            "| {tokens} | {:.0} | {:.0} | {:.2} % |",
            whole.0[2] as f64 / tokens as f64,
            patched.0[2] as f64 / tokens as f64,
            patched.0[2] as f64 / whole.0[2] as f64 * 100.0
        );
    }
    if missed {
        println!("MISSED: relay bytes with patches <= 2 % of whole snapshots (500 tokens)");
        std::process::exit(1);
    }
    println!("met: relay bytes with patches <= 2 % of whole snapshots (500 tokens)");
}
