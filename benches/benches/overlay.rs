//! Host overlay: the cost of one emitted overlay write with 1, 128 and 1,000 subscribed
//! targets (the write goes to one of them), and the latest-window builder over a
//! 100-row page against an overlay of 1,000 rows.
//!
//! `cargo bench -p benches --bench overlay`

// criterion_group! generates an undocumented function.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use overlay_core::live::{LiveHub, Payload, WindowId};
use overlay_core::overlay::{write, Change};
use overlay_core::source::{MemorySource, SourceKind};
use overlay_core::store::memory::MemoryOverlayStore;
use overlay_core::store::{RowClass, StoredBlock};
use overlay_core::window::{latest_window, Target};
use timeline_core::block::Block;
use timeline_core::cursor::BoundaryToken;
use timeline_core::key::{BlockKey, BlockType, RunId, SessionId, TargetId};
use timeline_core::order::SourceOrder;
use timeline_core::seal::HostKey;
use timeline_core::time::Millis;
use timeline_core::wire::LiveOverlay;

fn row(id: String, t: u64) -> Block {
    Block::new(
        BlockKey::parse(BlockType::AgentReply, &id).expect("id"),
        Millis(t),
    )
    .with_data(serde_json::json!({ "text": "streaming reply text of ordinary length" }))
}

fn emit_per_write(c: &mut Criterion) {
    let session = SessionId::new("s").expect("id");
    let overlay = LiveOverlay {
        settlement_epoch: 1,
        revision: 1,
        blocks: (0..20).map(|i| row(format!("live-{i}"), i)).collect(),
    };
    let mut group = c.benchmark_group("emit_overlay_write");
    for targets in [1usize, 128, 1_000] {
        let mut store = MemoryOverlayStore::new();
        let mut hub = LiveHub::new();
        hub.set_phone_interest(&session, true);
        let ids: Vec<TargetId> = (0..targets)
            .map(|i| TargetId::new(format!("t-{i}")).expect("id"))
            .collect();
        for (i, t) in ids.iter().enumerate() {
            hub.subscribe(&mut store, WindowId(i as u64), &session, t)
                .expect("subscribe");
        }
        let mut now = 0u64;
        group.bench_with_input(BenchmarkId::from_parameter(targets), &targets, |b, _| {
            b.iter(|| {
                now += 60;
                let mut o = overlay.clone();
                o.revision = now;
                hub.emit(
                    Payload::Blocks {
                        session: session.clone(),
                        target: ids[0].clone(),
                        overlay: o,
                    },
                    Millis(now),
                );
                hub.handle_timeout(Millis(now + 50));
                let mut n = 0;
                while hub.poll_delivery().is_some() {
                    n += 1;
                }
                n
            })
        });
    }
    group.finish();
}

fn latest_window_builder(c: &mut Criterion) {
    let session = SessionId::new("s").expect("id");
    let target = TargetId::main(&session);
    let run = RunId::new("run-1").expect("id");
    let mut store = MemoryOverlayStore::new();
    let live: Vec<StoredBlock> = (0..1_000)
        .map(|i| StoredBlock {
            block: row(format!("live-{i}"), 1_000_000 + i).with_source_order(SourceOrder::live(i)),
            class: RowClass::Ordinary,
            run_id: Some(run.clone()),
        })
        .collect();
    write(&mut store, &session, &target, &Change::Publish(live)).expect("write");
    let mut source = MemorySource::new(
        SourceKind::Claude {
            session: "c".into(),
        },
        BoundaryToken::claude("c"),
    );
    for i in 0..500u64 {
        source.push(vec![
            row(format!("h-{i}"), i).with_source_order(SourceOrder::history(i, 0))
        ]);
    }
    let key = HostKey::from_bytes([1; 32]);
    c.bench_function("latest_window_100_rows_overlay_1000", |b| {
        b.iter(|| {
            let t = Target {
                session: &session,
                target: &target,
                current_run: Some(&run),
            };
            let built = latest_window(&mut store, &mut source, &key, t, 100).expect("window");
            built.window.blocks.len()
        })
    });
}

criterion_group!(benches, emit_per_write, latest_window_builder);
criterion_main!(benches);
