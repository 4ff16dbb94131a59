//! The SQLite backend against raw rusqlite, in one run, with `synchronous` NORMAL and
//! FULL:
//!
//! (a) raw rusqlite: one INSERT per IMMEDIATE transaction into a two-column table;
//! (b) our submit claim (identity + entry in one transaction);
//! (c) our ledger status update;
//! (d) our overlay write (compare-and-set with the global revision counter);
//! (e) a hand-written rusqlite version of the same two-insert submit.
//!
//! `cargo bench -p benches --bench storage`

// criterion_group! generates an undocumented function.
#![allow(missing_docs)]

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use outbox_core::entry::{Controls, MessageRequest, OutboxEntry};
use outbox_core::fingerprint::request_fingerprint;
use outbox_core::ids::{OperationId, QueueId, SessionId};
use outbox_core::ledger::{LedgerRecord, LedgerStatus};
use outbox_core::store::OutboxStore;
use overlay_core::overlay::{write, Change};
use overlay_core::store::{RowClass, StoredBlock};
use rusqlite::{params, Connection, TransactionBehavior};
use storage_sqlite::{Settings, SqliteStore, Synchronous};
use timeline_core::block::Block;
use timeline_core::key::{BlockKey, BlockType, RunId, TargetId};
use timeline_core::time::Millis;

fn entry(i: u64) -> OutboxEntry {
    OutboxEntry::queued(
        QueueId::new(format!("q-{i}")).expect("id"),
        OperationId::new(format!("op-{i}")).expect("id"),
        MessageRequest::text("run the tests again please", "composer", Millis(i)),
        Controls::automatic(),
        i as i64,
    )
}

fn raw_connection(path: &std::path::Path, sync: &str) -> Connection {
    let conn = Connection::open(path).expect("open");
    conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get::<_, String>(0))
        .expect("wal");
    conn.pragma_update(None, "synchronous", sync).expect("sync");
    conn.busy_timeout(Duration::from_secs(5)).expect("busy");
    conn
}

fn storage(c: &mut Criterion) {
    for (label, sync, sql_sync) in [
        ("normal", Synchronous::Normal, "NORMAL"),
        ("full", Synchronous::Full, "FULL"),
    ] {
        let mut group = c.benchmark_group(format!("sqlite_{label}"));
        group.sample_size(if label == "full" { 30 } else { 100 });
        let dir = tempfile::tempdir().expect("dir");
        let settings = Settings {
            synchronous: sync,
            busy_timeout: Duration::from_secs(5),
        };

        // (a) raw single-insert commits.
        let mut raw = raw_connection(&dir.path().join("raw.sqlite"), sql_sync);
        raw.execute_batch("CREATE TABLE kv (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")
            .expect("table");
        let mut i = 0u64;
        group.bench_function(BenchmarkId::new("a_raw_insert", label), |b| {
            b.iter(|| {
                i += 1;
                let tx = raw
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .expect("tx");
                tx.prepare_cached("INSERT INTO kv (k, v) VALUES (?1, ?2)")
                    .expect("prepare")
                    .execute(params![i as i64, "value"])
                    .expect("insert");
                tx.commit().expect("commit");
            })
        });

        // (b) our submit claim.
        let mut store = SqliteStore::open(dir.path().join("ours.sqlite"), settings).expect("open");
        let session = SessionId::new("session-1").expect("id");
        let mut i = 0u64;
        group.bench_function(BenchmarkId::new("b_our_submit", label), |b| {
            b.iter(|| {
                i += 1;
                let e = entry(i);
                let fp = request_fingerprint(&session, &e.queue_id, &e.request);
                store.claim(&session, &fp, &e).expect("claim");
            })
        });

        // (c) our ledger update.
        let op = OperationId::new("op-ledger").expect("id");
        let mut i = 0u64;
        group.bench_function(BenchmarkId::new("c_our_ledger", label), |b| {
            b.iter(|| {
                i += 1;
                store
                    .put_ledger(
                        &session,
                        &op,
                        &LedgerRecord::new(LedgerStatus::Sending, Millis(i)),
                    )
                    .expect("ledger");
            })
        });

        // (d) our overlay write.
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
                write(&mut store, &session, &target, &Change::Publish(vec![row])).expect("write");
            })
        });

        // (e) the same two-insert submit, hand-written.
        let mut hand = raw_connection(&dir.path().join("hand.sqlite"), sql_sync);
        hand.execute_batch(storage_sqlite::MIGRATIONS[0].1)
            .expect("schema");
        hand.execute_batch(storage_sqlite::MIGRATIONS[1].1)
            .expect("schema");
        let mut i = 0u64;
        group.bench_function(BenchmarkId::new("e_hand_written_submit", label), |b| {
            b.iter(|| {
                i += 1;
                let e = entry(i);
                let fp = request_fingerprint(&session, &e.queue_id, &e.request);
                let json = serde_json::to_string(&e).expect("json");
                let tx = hand.transaction_with_behavior(TransactionBehavior::Immediate).expect("tx");
                tx.prepare_cached(
                    "INSERT INTO workspace_chat_outbox_operation_identity
                         (session_id, operation_id, fingerprint, queue_id, removed, claimed_at)
                     VALUES (?1, ?2, ?3, ?4, 0, ?5)",
                )
                .expect("prepare")
                .execute(params![session.as_str(), e.operation_id.as_str(), fp.as_str(), e.queue_id.as_str(), i as i64])
                .expect("identity");
                tx.prepare_cached(
                    "INSERT INTO workspace_chat_outbox (session_id, queue_id, operation_id, position, entry_json)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )
                .expect("prepare")
                .execute(params![session.as_str(), e.queue_id.as_str(), e.operation_id.as_str(), e.position, json])
                .expect("entry");
                tx.commit().expect("commit");
            })
        });
        group.finish();
    }
}

criterion_group!(benches, storage);
criterion_main!(benches);
