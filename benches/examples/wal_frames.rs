//! Why a two-table submit commits slower than a single-row append: WAL frames written per
//! commit, for the shapes in the storage benchmark (automatic checkpoints off, so the WAL
//! size counts every frame). Run with
//! `cargo run --release -p benches --example wal_frames`.
#![allow(clippy::unwrap_used)]

use rusqlite::{params, Connection, Transaction, TransactionBehavior};
use std::time::Instant;

const COMMITS: u64 = 50_000;
/// A WAL frame is a 24-byte header plus one 4096-byte page.
const FRAME_BYTES: f64 = 4120.0;

fn measure(name: &str, schema: &str, mut write: impl FnMut(&Transaction, u64)) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("probe.sqlite");
    let mut conn = Connection::open(&path).unwrap();
    conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get::<_, String>(0))
        .unwrap();
    conn.execute_batch("PRAGMA synchronous = NORMAL; PRAGMA wal_autocheckpoint = 0;")
        .unwrap();
    conn.execute_batch(schema).unwrap();
    let start = Instant::now();
    for i in 0..COMMITS {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        write(&tx, i);
        tx.commit().unwrap();
    }
    let micros = start.elapsed().as_secs_f64() * 1e6 / COMMITS as f64;
    let wal = std::fs::metadata(dir.path().join("probe.sqlite-wal"))
        .map(|m| m.len())
        .unwrap_or(0);
    let frames = wal as f64 / FRAME_BYTES / COMMITS as f64;
    println!("{name:44} {micros:7.2} µs/commit  {frames:5.2} frames/commit");
}

fn main() {
    let json = "x".repeat(300);
    let fingerprint = "f".repeat(64);
    let kv = "CREATE TABLE kv (k INTEGER PRIMARY KEY, v TEXT NOT NULL)";
    let two = "CREATE TABLE identity (s TEXT, o TEXT, f TEXT, q TEXT, PRIMARY KEY (s, o)) WITHOUT ROWID;
               CREATE TABLE outbox (s TEXT, q TEXT, o TEXT, p INTEGER, j TEXT, PRIMARY KEY (s, q)) WITHOUT ROWID;";
    let submit = |tx: &Transaction, op: String, queue: String, i: u64, body: &str| {
        tx.prepare_cached("INSERT INTO identity VALUES ('session', ?1, ?2, ?3)")
            .unwrap()
            .execute(params![op, fingerprint, queue])
            .unwrap();
        tx.prepare_cached("INSERT INTO outbox VALUES ('session', ?1, ?2, ?3, ?4)")
            .unwrap()
            .execute(params![queue, op, i as i64, body])
            .unwrap();
    };
    measure("(a) one rowid append", kv, |tx, i| {
        tx.prepare_cached("INSERT INTO kv VALUES (?1, 'value')")
            .unwrap()
            .execute(params![i as i64])
            .unwrap();
    });
    measure(
        "two rowid appends in two tables",
        &format!("{kv}; CREATE TABLE kv2 (k INTEGER PRIMARY KEY, v TEXT NOT NULL)"),
        |tx, i| {
            for table in ["kv", "kv2"] {
                tx.prepare_cached(&format!("INSERT INTO {table} VALUES (?1, 'value')"))
                    .unwrap()
                    .execute(params![i as i64])
                    .unwrap();
            }
        },
    );
    measure("submit shape, text keys (as in the bench)", two, |tx, i| {
        submit(tx, format!("op-{i}"), format!("q-{i}"), i, &json)
    });
    measure("submit shape, keys in insertion order", two, |tx, i| {
        submit(tx, format!("op-{i:010}"), format!("q-{i:010}"), i, &json)
    });
    measure("submit shape, 1-byte entry", two, |tx, i| {
        submit(tx, format!("op-{i}"), format!("q-{i}"), i, "v")
    });
}
