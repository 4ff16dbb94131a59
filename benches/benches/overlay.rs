//! Host overlay: the cost of one emitted overlay write with 1, 128 and 1,000 subscribed
//! targets (the write goes to one of them), the latest-window builder over a 100-row
//! page against an overlay of 1,000 rows, and the anchored builders with the anchor D
//! rows back (the scan reads D rows, so its time must grow linearly in D) and the newer
//! load after such a page (it resumes at the page, so its time must not grow with D).
//!
//! `cargo bench -p benches --bench overlay`

// criterion_group! generates an undocumented function.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use overlay_core::live::{LiveHub, Payload, WindowId};
use overlay_core::overlay::Change;
use overlay_core::source::{
    HistorySource, MemorySource, SourceError, SourceItem, SourceKind, SourcePage, SourcePosition,
};
use overlay_core::store::memory::MemoryOverlayStore;
use overlay_core::store::write;
use overlay_core::store::{RowClass, StoredBlock};
use overlay_core::window::{anchored_window, latest_window, Target};
use timeline_core::anchor::Anchor;
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
                hub.handle_payload(
                    Payload::Blocks {
                        session: session.clone(),
                        target: ids[0].clone(),
                        overlay: o,
                    },
                    Millis(now),
                );
                hub.handle_timeout(Millis(now + 50));
                let mut n = 0;
                while hub.poll_effect().is_some() {
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

/// `latest_window_paired/{new,previous,baseline}/N`: the latest window (a 100-row page,
/// nothing to settle) over a memory store whose target holds N live rows, built by
/// today's `window::latest_window` over `MemoryOverlayStore`, by the code this change
/// replaced (the whole stored form built for the answer, the answer serialized into a
/// buffer for its size), and by the code before the indexed overlay over the
/// whole-overlay store it had (`benches::baseline`), in one run.
fn latest_window_paired(c: &mut Criterion) {
    use benches::baseline::{baseline_latest_window, previous_latest_window, BaselineOverlayStore};

    let session = SessionId::new("s").expect("id");
    let target = TargetId::main(&session);
    let run = RunId::new("run-1").expect("id");
    let key = HostKey::from_bytes([1; 32]);
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
    let mut group = c.benchmark_group("latest_window_paired");
    for n in [100u64, 1_000, 10_000] {
        let live: Vec<StoredBlock> = (0..n)
            .map(|i| StoredBlock {
                block: row(format!("live-{i}"), 1_000_000 + i)
                    .with_source_order(SourceOrder::live(i)),
                class: RowClass::Ordinary,
                run_id: Some(run.clone()),
            })
            .collect();
        let mut store = MemoryOverlayStore::new();
        write(
            &mut store,
            &session,
            &target,
            &Change::Publish(live.clone()),
        )
        .expect("write");
        // Its own rows (not shared with `store`'s), as a separate store would hold them.
        let mut previous = MemoryOverlayStore::new();
        write(
            &mut previous,
            &session,
            &target,
            &Change::Publish(live.clone()),
        )
        .expect("write");
        let mut old = BaselineOverlayStore::new();
        old.write(&session, &target, &Change::Publish(live))
            .expect("write");
        let t = Target {
            session: &session,
            target: &target,
            current_run: Some(&run),
        };
        group.bench_with_input(BenchmarkId::new("new", n), &n, |b, _| {
            b.iter(|| {
                let built = latest_window(&mut store, &mut source, &key, t, 100).expect("window");
                built.window.live_overlay.map_or(0, |o| o.blocks.len())
            })
        });
        group.bench_with_input(BenchmarkId::new("previous", n), &n, |b, _| {
            b.iter(|| {
                let (window, _) = previous_latest_window(
                    &mut previous,
                    &mut source,
                    &key,
                    &session,
                    &target,
                    Some(&run),
                    100,
                )
                .expect("window");
                window.live_overlay.map_or(0, |o| o.blocks.len())
            })
        });
        group.bench_with_input(BenchmarkId::new("baseline", n), &n, |b, _| {
            b.iter(|| {
                let (window, _) = baseline_latest_window(
                    &mut old,
                    &mut source,
                    &key,
                    &session,
                    &target,
                    Some(&run),
                    100,
                )
                .expect("window");
                window.live_overlay.map_or(0, |o| o.blocks.len())
            })
        });
    }
    group.finish();
}

/// A Codex history of `len` items of one row each (`h-<i>`, positions `item-<i>`) that
/// builds each item when it is read, as a source parsing its history from storage does:
/// a read costs the items it returns, whatever the history's length, and no history
/// sits in memory between reads.
struct GeneratedSource {
    len: u64,
}

impl GeneratedSource {
    fn item(i: u64) -> SourceItem {
        SourceItem {
            position: SourcePosition(format!("item-{i}")),
            blocks: vec![row(format!("h-{i}"), i).with_source_order(SourceOrder::history(i, 0))],
        }
    }

    /// The index of `position`, if the history holds it.
    fn index(&self, position: &SourcePosition) -> Result<u64, SourceError> {
        position
            .0
            .strip_prefix("item-")
            .and_then(|n| n.parse::<u64>().ok())
            .filter(|&n| n < self.len)
            .ok_or(SourceError::PositionGone)
    }
}

impl HistorySource for GeneratedSource {
    fn kind(&self) -> SourceKind {
        SourceKind::Codex {
            thread_id: "thread-1".into(),
            generation: 1,
        }
    }

    fn boundary_token(&self) -> BoundaryToken {
        BoundaryToken::codex_rollout("/rollouts/r.jsonl")
    }

    fn read(
        &mut self,
        before: Option<&SourcePosition>,
        limit: usize,
    ) -> Result<SourcePage, SourceError> {
        let end = match before {
            None => self.len,
            Some(p) => self.index(p)?,
        };
        let start = end.saturating_sub(limit as u64);
        Ok(SourcePage {
            items: (start..end).rev().map(Self::item).collect(),
            more: start > 0,
        })
    }

    fn read_newer(
        &mut self,
        after: &SourcePosition,
        limit: usize,
    ) -> Result<SourcePage, SourceError> {
        let start = self.index(after)? + 1;
        let end = start.saturating_add(limit as u64).min(self.len);
        Ok(SourcePage {
            items: (start..end).map(Self::item).collect(),
            more: end < self.len,
        })
    }
}

/// The same history as a [`MemorySource`] (every item held in memory and cloned by each
/// read).
fn memory_history(len: u64) -> MemorySource {
    let mut source = MemorySource::new(
        SourceKind::Codex {
            thread_id: "thread-1".into(),
            generation: 1,
        },
        BoundaryToken::codex_rollout("/rollouts/r.jsonl"),
    );
    for i in 0..len {
        source.push(GeneratedSource::item(i).blocks);
    }
    source
}

/// Anchors D rows back from the newest row, in a history of D + 100 rows.
const ANCHOR_DEPTHS: [(u64, &str); 4] = [
    (1_000, "1k"),
    (4_000, "4k"),
    (16_000, "16k"),
    (64_000, "64k"),
];

/// The row `depth` rows back from the newest of a history of `len` rows.
fn row_back(len: u64, depth: u64) -> BlockKey {
    BlockKey::parse(BlockType::AgentReply, &format!("h-{}", len - 1 - depth)).expect("id")
}

/// `anchored_window/D`: an anchored load whose row is D rows back (a page in the past:
/// the scan reads D rows, so the time must grow linearly in D). `anchored_newer_page/D`:
/// the newer load after that page (it resumes at the page: the time must not grow with
/// D). `anchored_window_memory_source/D`: the anchored load over a [`MemorySource`].
fn anchored_builders(c: &mut Criterion) {
    let session = SessionId::new("s").expect("id");
    let target = TargetId::main(&session);
    let key = HostKey::from_bytes([1; 32]);
    let t = Target {
        session: &session,
        target: &target,
        current_run: None,
    };
    let mut group = c.benchmark_group("anchored_window");
    for (depth, name) in ANCHOR_DEPTHS {
        let mut source = GeneratedSource { len: depth + 100 };
        let mut store = MemoryOverlayStore::new();
        let anchor = Anchor::row(&row_back(depth + 100, depth));
        group.bench_function(name, |b| {
            b.iter(|| {
                let built =
                    anchored_window(&mut store, &mut source, &key, t, &anchor).expect("window");
                assert!(built.window.newer_cursor.is_some(), "a page in the past");
                built.window.blocks.len()
            })
        });
    }
    group.finish();
    let mut group = c.benchmark_group("anchored_newer_page");
    for (depth, name) in ANCHOR_DEPTHS {
        let mut source = GeneratedSource { len: depth + 100 };
        let mut store = MemoryOverlayStore::new();
        let place = Anchor::row(&row_back(depth + 100, depth));
        let first = anchored_window(&mut store, &mut source, &key, t, &place).expect("window");
        let anchor = Anchor::Newer {
            token: first.window.newer_cursor.expect("a page in the past"),
        };
        group.bench_function(name, |b| {
            b.iter(|| {
                let built =
                    anchored_window(&mut store, &mut source, &key, t, &anchor).expect("window");
                assert_eq!(built.window.blocks.len(), 40);
                built.window.blocks.len()
            })
        });
    }
    group.finish();
    let mut group = c.benchmark_group("anchored_window_memory_source");
    for (depth, name) in ANCHOR_DEPTHS {
        let mut source = memory_history(depth + 100);
        let mut store = MemoryOverlayStore::new();
        let anchor = Anchor::row(&row_back(depth + 100, depth));
        group.bench_function(name, |b| {
            b.iter(|| {
                let built =
                    anchored_window(&mut store, &mut source, &key, t, &anchor).expect("window");
                built.window.blocks.len()
            })
        });
    }
    group.finish();
}

/// `overlay_publish/{memory,sqlite_normal}/{100,10000}`: one `store::write` that
/// publishes one updated row (new text, same key and place) into an overlay of n rows,
/// on the memory store and on SQLite with `synchronous = NORMAL` (a file, WAL). The cost
/// should follow the one changed row, not n. `naive_memory` is the baseline: the same
/// publish the way the memory store computed it before the indexed overlay (the whole
/// overlay cloned, filtered, sorted and compared; `fixtures::naive_overlay`).
fn overlay_publish(c: &mut Criterion) {
    use fixtures::naive_overlay::Reference;
    use overlay_core::store::OverlayStore;
    use storage_sqlite::{Settings, SqliteStore, Synchronous};

    fn live_row(i: u64, text: &str, run: &RunId) -> StoredBlock {
        StoredBlock {
            block: row(format!("live-{i}"), 1_000_000 + i)
                .with_source_order(SourceOrder::live(i))
                .with_data(serde_json::json!({ "text": text })),
            class: RowClass::Ordinary,
            run_id: Some(run.clone()),
        }
    }

    fn bench<S: OverlayStore>(
        group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
        name: &str,
        n: u64,
        store: &mut S,
    ) {
        let session = SessionId::new("s").expect("id");
        let target = TargetId::main(&session);
        let run = RunId::new("run-1").expect("id");
        let rows: Vec<StoredBlock> = (0..n)
            .map(|i| live_row(i, "streaming reply text of ordinary length", &run))
            .collect();
        write(store, &session, &target, &Change::Publish(rows)).expect("fill");
        let mut version = 0u64;
        group.bench_with_input(BenchmarkId::new(name, n), &n, |b, &n| {
            b.iter(|| {
                version += 1;
                let text = format!("streaming reply text, token {version}");
                let row = live_row(n / 2, &text, &run);
                write(store, &session, &target, &Change::Publish(vec![row])).expect("publish")
            })
        });
    }

    let mut group = c.benchmark_group("overlay_publish");
    for n in [100u64, 10_000] {
        bench(&mut group, "memory", n, &mut MemoryOverlayStore::new());
    }
    for n in [100u64, 10_000] {
        let target = TargetId::new("s").expect("id");
        let run = RunId::new("run-1").expect("id");
        let rows: Vec<StoredBlock> = (0..n)
            .map(|i| live_row(i, "streaming reply text of ordinary length", &run))
            .collect();
        let mut naive = Reference::new(0);
        naive.write(&target, &Change::Publish(rows)).expect("fill");
        let mut version = 0u64;
        group.bench_with_input(BenchmarkId::new("naive_memory", n), &n, |b, &n| {
            b.iter(|| {
                version += 1;
                let text = format!("streaming reply text, token {version}");
                let row = live_row(n / 2, &text, &run);
                naive
                    .write(&target, &Change::Publish(vec![row]))
                    .expect("publish")
                    .map(|o| o.revision)
            })
        });
    }
    for n in [100u64, 10_000] {
        let dir = tempfile::tempdir().expect("dir");
        let mut settings = Settings::default();
        settings.synchronous = Synchronous::Normal;
        let mut store =
            SqliteStore::open(dir.path().join("overlay.sqlite"), settings).expect("open");
        bench(&mut group, "sqlite_normal", n, &mut store);
    }
    group.finish();
}

criterion_group!(
    benches,
    emit_per_write,
    latest_window_builder,
    latest_window_paired,
    anchored_builders
);
criterion_group!(publish, overlay_publish);
criterion_main!(benches, publish);
