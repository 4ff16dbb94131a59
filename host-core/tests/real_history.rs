//! Real agent history files through the host, as the `history` example prints them: a
//! desktop timeline that loads the latest window and pages back to the start shows
//! exactly the rows the history source holds, in canonical order (TL-04, TL-08, OV-05).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use host_core::{ClientRequest, Host, HostConfig, HostEffect, Reply, ReplyTo};
use outbox_core::{Capabilities, MemoryOutboxStore, SessionInfo};
use overlay_core::{HistorySource, MemoryOverlayStore};
use timeline_core::timeline::{LoadFailure, TimelineEffect};
use timeline_core::{BlockKey, ClientMode, HostKey, Millis, SessionId, TargetId, Timeline};

/// Every row of the source, read back from the present to the start, in canonical order.
fn all_rows(source: &mut dyn HistorySource) -> Vec<BlockKey> {
    let mut blocks = Vec::new();
    let mut before = None;
    loop {
        let page = source.read(before.as_ref(), 50).unwrap();
        for item in &page.items {
            blocks.extend(item.blocks.iter().cloned());
        }
        match (page.more, page.items.last()) {
            (true, Some(last)) => before = Some(last.position.clone()),
            _ => break,
        }
    }
    blocks.sort_by_cached_key(timeline_core::Block::order_key);
    blocks.iter().map(timeline_core::Block::key).collect()
}

/// The rows a desktop shows after loading the latest window and paging to the start.
fn through_the_host(source: Box<dyn HistorySource + Send>, caps: Capabilities) -> Vec<BlockKey> {
    let session = SessionId::new("history").unwrap();
    let target = TargetId::main(&session);
    let config = HostConfig::new(HostKey::from_bytes([1; 32]), Box::new(String::new));
    let mut host = Host::new(MemoryOutboxStore::new(), MemoryOverlayStore::new(), config);
    host.add_session(&session, SessionInfo::new(caps), source);
    host.start(Millis(0)).unwrap();
    let mut desktop = Timeline::new(ClientMode::Desktop);
    desktop.open_target(target.clone(), Millis(0));
    let mut pages = 0;
    loop {
        while let Some(effect) = desktop.poll_effect() {
            let (request, tag) = match effect {
                TimelineEffect::LoadLatestWindow { tag, page_size, .. } => (
                    ClientRequest::LatestWindow {
                        session: session.clone(),
                        target: target.clone(),
                        page_size,
                    },
                    tag,
                ),
                TimelineEffect::LoadOlderPage {
                    tag,
                    cursor,
                    page_size,
                    expected_boundary_token,
                } => (
                    ClientRequest::OlderPage {
                        session: session.clone(),
                        target: target.clone(),
                        cursor,
                        page_size,
                        expected_boundary_token,
                    },
                    tag,
                ),
                _ => continue,
            };
            host.handle_client(ReplyTo(pages), request, Millis(0));
            while let Some(effect) = host.poll_effect() {
                match effect {
                    HostEffect::Reply {
                        reply: Reply::LatestWindow(w),
                        ..
                    } => {
                        let w = w.map_err(|_| LoadFailure::Unavailable);
                        desktop.handle_latest_window(&tag, w, Millis(0));
                    }
                    HostEffect::Reply {
                        reply: Reply::OlderPage(p),
                        ..
                    } => {
                        let p = p.map_err(|_| LoadFailure::Unavailable);
                        desktop.handle_older_page(&tag, p, Millis(0));
                    }
                    HostEffect::Notice(n) => panic!("unexpected notice {n:?}"),
                    _ => {}
                }
            }
        }
        pages += 1;
        assert!(pages < 10_000, "paging ends");
        if !desktop.load_older(Millis(0)) {
            break;
        }
    }
    desktop.rows().map(|r| r.block.key()).collect()
}

fn data(krate: &str, file: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(krate)
        .join("tests/data")
        .join(file)
}

#[test]
fn a_real_codex_rollout_pages_through_the_host_to_its_start() {
    let path = data(
        "agent-codex",
        "codex-session-view/rollout-2025-11-17T15-30-28-019a93b9-f380-7600-98ff-940e6b99603c.jsonl",
    );
    let mut whole = agent_codex::RolloutSource::open(&path, 1).unwrap();
    let expected = all_rows(&mut whole);
    assert!(expected.len() > 50, "{}", expected.len());
    let source = agent_codex::RolloutSource::open(&path, 1).unwrap();
    assert_eq!(
        through_the_host(Box::new(source), Capabilities::codex()),
        expected
    );
}

#[test]
fn a_real_claude_transcript_pages_through_the_host_to_its_start() {
    let path = data("agent-claude", "spotter/tool_heavy.jsonl");
    let mut whole = agent_claude::TranscriptFile::new(&path, "tool_heavy");
    let expected = all_rows(&mut whole);
    assert!(expected.len() > 10, "{}", expected.len());
    let source = agent_claude::TranscriptFile::new(&path, "tool_heavy");
    assert_eq!(
        through_the_host(Box::new(source), Capabilities::claude()),
        expected
    );
}
