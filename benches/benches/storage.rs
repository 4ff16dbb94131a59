//! The SQLite backend against raw rusqlite, in one run, with `synchronous` NORMAL and
//! FULL:
//!
//! (a) raw rusqlite: one INSERT per IMMEDIATE transaction into a two-column table, on
//!     SQLite's default page size and checkpoint size;
//! (a2) the same on the library's page size and checkpoint size;
//! (b) our submit claim (identity + entry in one transaction);
//! (e) a hand-written rusqlite version of the same two-insert submit, on the library's
//!     page settings;
//! (b) and (e) again with UUID keys, as clients send them (`benches::storage::Keys`);
//! (c) our ledger status update;
//! (d) our overlay write (compare-and-set with the global revision counter).
//!
//! `cargo bench -p benches --bench storage`. The ratios are also measured paired, in
//! alternating rounds: `cargo run --release -p benches --bin storage-paired`.

// criterion_group! generates an undocumented function.
#![allow(missing_docs)]

use benches::storage::{HandSubmit, Keys, OurSubmit, RawAppend};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use outbox_core::ids::OperationId;
use outbox_core::ids::ScopeId;
use outbox_core::ledger::{LedgerRecord, LedgerStatus};
use outbox_core::store::OutboxStore;
use overlay_core::overlay::Change;
use overlay_core::store::write;
use overlay_core::store::{RowClass, StoredBlock};
use storage_sqlite::Synchronous;
use timeline_core::block::Block;
use timeline_core::key::{BlockKey, BlockType, RunId, TargetId};
use timeline_core::time::Millis;

fn storage(c: &mut Criterion) {
    for (label, sync) in [("normal", Synchronous::Normal), ("full", Synchronous::Full)] {
        let mut group = c.benchmark_group(format!("sqlite_{label}"));
        group.sample_size(if label == "full" { 30 } else { 100 });
        let dir = tempfile::tempdir().expect("dir");

        for (name, library_pages) in [
            ("a_raw_insert", false),
            ("a2_raw_insert_library_pages", true),
        ] {
            let path = dir.path().join(format!("{name}.sqlite"));
            let mut raw = RawAppend::open(&path, sync, library_pages);
            group.bench_function(BenchmarkId::new(name, label), |b| b.iter(|| raw.commit()));
        }

        let mut ours = OurSubmit::open(&dir.path().join("ours.sqlite"), sync, Keys::Short);
        group.bench_function(BenchmarkId::new("b_our_submit", label), |b| {
            b.iter(|| ours.commit())
        });

        let mut hand = HandSubmit::open(&dir.path().join("hand.sqlite"), sync, Keys::Short);
        group.bench_function(BenchmarkId::new("e_hand_written_submit", label), |b| {
            b.iter(|| hand.commit())
        });

        let mut ours_uuid = OurSubmit::open(&dir.path().join("ours-uuid.sqlite"), sync, Keys::Uuid);
        group.bench_function(BenchmarkId::new("b_our_submit_uuid_keys", label), |b| {
            b.iter(|| ours_uuid.commit())
        });

        let mut hand_uuid =
            HandSubmit::open(&dir.path().join("hand-uuid.sqlite"), sync, Keys::Uuid);
        group.bench_function(
            BenchmarkId::new("e_hand_written_submit_uuid_keys", label),
            |b| b.iter(|| hand_uuid.commit()),
        );

        let store = &mut ours.store;
        let session = Keys::Short.session();
        let op = OperationId::new("op-ledger").expect("id");
        let mut i = 0u64;
        group.bench_function(BenchmarkId::new("c_our_ledger", label), |b| {
            b.iter(|| {
                i += 1;
                store
                    .put_ledger(
                        &ScopeId::of(&session),
                        &op,
                        &LedgerRecord::new(LedgerStatus::Sending, Millis(i)),
                    )
                    .expect("ledger");
            })
        });

        let target = TargetId::new("session-1").expect("id");
        let run = RunId::new("run-1").expect("id");
        let mut i = 0u64;
        group.bench_function(BenchmarkId::new("d_our_overlay_write", label), |b| {
            b.iter(|| {
                i += 1;
                let row = StoredBlock {
                    block: Block::new(
                        BlockKey::parse(BlockType::AgentReply, "streaming").expect("key"),
                        Millis(1),
                    )
                    .with_data(serde_json::json!({ "text": "streaming reply", "n": i })),
                    class: RowClass::Ordinary,
                    run_id: Some(run.clone()),
                };
                write(store, &session, &target, &Change::Publish(vec![row])).expect("write");
            })
        });

        group.finish();
    }
}

criterion_group!(benches, storage);
criterion_main!(benches);
