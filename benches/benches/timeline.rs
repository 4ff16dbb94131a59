//! Client timeline: the cost of applying one live overlay revision of 50 rows to a
//! timeline of N history rows, against a naive full rebuild of the view in the same run.
//!
//! `cargo bench -p benches --bench timeline`

// criterion_group! generates an undocumented function.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use timeline_core::block::Block;
use timeline_core::cursor::BoundaryToken;
use timeline_core::key::{BlockKey, BlockType, TargetId};
use timeline_core::order::SourceOrder;
use timeline_core::time::Millis;
use timeline_core::timeline::{ClientMode, Outcome, Timeline, TimelineEffect};
use timeline_core::wire::{LiveOverlay, TimelineWindow};

const OVERLAY_ROWS: usize = 50;

fn key(t: BlockType, id: String) -> BlockKey {
    BlockKey::parse(t, &id).expect("non-blank id")
}

fn history(n: usize) -> Vec<Block> {
    (0..n)
        .map(|i| {
            let t = if i % 3 == 0 {
                BlockType::User
            } else {
                BlockType::AgentReply
            };
            Block::new(key(t, format!("item-{i}")), Millis(1_000 + i as u64))
                .with_source_order(SourceOrder::history(i as u64, 0))
                .with_data(serde_json::json!({ "text": "a reply of ordinary length" }))
        })
        .collect()
}

/// Two alternating live projections: the same 50 streaming rows with new data, plus a
/// few rows that come and go, as during a run.
fn overlay_blocks(n: usize, variant: usize) -> Vec<Block> {
    (0..OVERLAY_ROWS)
        .map(|i| {
            let id = if i % 10 == 9 {
                format!("live-{i}-{variant}")
            } else {
                format!("live-{i}")
            };
            Block::new(
                key(BlockType::Activity, id),
                Millis(1_000 + n as u64 + i as u64),
            )
            .with_source_order(SourceOrder::live(i as u64))
            .with_data(serde_json::json!({ "text": "streaming", "v": variant }))
        })
        .collect()
}

fn loaded(history: Vec<Block>, live: Vec<Block>) -> (Timeline, TargetId) {
    let target = TargetId::new("session").expect("non-blank");
    let mut t = Timeline::new(ClientMode::Desktop);
    t.open_target(target.clone(), Millis(0));
    let Some(TimelineEffect::LoadLatestWindow { tag, .. }) = t.poll_effect() else {
        panic!("open asks for the latest window");
    };
    let w = TimelineWindow {
        blocks: history,
        oldest_cursor: None,
        boundary_token: BoundaryToken::claude("session"),
        window_revision: 1,
        live_overlay: Some(LiveOverlay {
            settlement_epoch: 1,
            revision: 1,
            blocks: live,
        }),
        anchor_row: None,
        anchor_notice: None,
        newer_cursor: None,
    };
    assert_eq!(
        t.handle_latest_window(&tag, Ok(w), Millis(1)),
        Outcome::Applied
    );
    (t, target)
}

fn live_revision(c: &mut Criterion) {
    let mut group = c.benchmark_group("live_revision_50_rows");
    for n in [1_000usize, 10_000, 100_000] {
        let hist = history(n);
        let variants = [overlay_blocks(n, 0), overlay_blocks(n, 1)];

        let (mut t, target) = loaded(hist.clone(), variants[0].clone());
        let mut revision = 1u64;
        group.bench_with_input(BenchmarkId::new("incremental", n), &n, |b, _| {
            b.iter(|| {
                revision += 1;
                let update = LiveOverlay {
                    settlement_epoch: 1,
                    revision,
                    blocks: variants[(revision % 2) as usize].clone(),
                };
                let out = t.handle_live_update(&target, update, Millis(2));
                debug_assert_eq!(out, Outcome::Applied);
                t.len()
            })
        });
        assert_eq!(t.len(), n + OVERLAY_ROWS);

        let mut revision = 1u64;
        group.bench_with_input(BenchmarkId::new("full_rebuild", n), &n, |b, _| {
            b.iter(|| {
                revision += 1;
                let blocks = variants[(revision % 2) as usize].clone();
                benches::naive_rebuild(&hist, &blocks).len()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, live_revision);
criterion_main!(benches);
