//! Why a submit commits slower than a single-row append: the pages each commit changes,
//! counted as WAL frames and attributed to the B-tree that owns each page (SQLite's
//! `dbstat`). Every changed page is one frame written at commit, and with
//! `synchronous = FULL` one more page to sync.
//!
//! Writers run with automatic checkpoints off. Each case first commits 50,000 times so
//! the trees have their working depth (checkpointing every 1,000 commits from a second
//! connection), then truncates the WAL and counts 5,000 commits, timed without
//! checkpoints; `synchronous = NORMAL`. "Pages to checkpoint" counts the distinct pages
//! among those frames, per commit: what one checkpoint after them copies into the
//! database file (a page changed by many commits is copied once). The submit cases run with the bench's short keys
//! (`session-1`, `q-N`, `op-N`) and with UUID keys, as clients send them
//! (`benches::storage::Keys`).
//!
//! `cargo run --release -p benches --example wal_frames`
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Instant;

use benches::storage::{bench_entry, hand_json, Keys};
use outbox_core::fingerprint::request_fingerprint;
use outbox_core::store::OutboxStore;
use rusqlite::types::Value;
use rusqlite::{params, Connection, TransactionBehavior};
use storage_sqlite::{Settings, SqliteStore, Synchronous, MIGRATIONS};

const WARM: u64 = 50_000;
const COMMITS: u64 = 5_000;

/// Commits `commit(i)` for the warm-up, then counts frames per commit by B-tree. `conn`
/// is a second connection to the writer's file; the writer must not checkpoint.
fn measure(name: &str, conn: &Connection, wal: &Path, mut commit: impl FnMut(u64)) {
    for i in 0..WARM {
        commit(i);
        if i % 1000 == 999 {
            conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
                .unwrap();
        }
    }
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    let start = Instant::now();
    for i in WARM..WARM + COMMITS {
        commit(i);
    }
    let micros = start.elapsed().as_secs_f64() * 1e6 / COMMITS as f64;

    let page_size: usize = conn
        .query_row("PRAGMA page_size", [], |r| r.get::<_, i64>(0))
        .unwrap() as usize;
    let mut owner = HashMap::new();
    let mut stmt = conn.prepare("SELECT pageno, name FROM dbstat").unwrap();
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))
        .unwrap();
    for row in rows {
        let (page, tree) = row.unwrap();
        owner.insert(page as u32, tree);
    }
    let bytes = std::fs::read(wal).unwrap();
    let mut by_tree = BTreeMap::<String, u64>::new();
    let mut total = 0u64;
    let mut distinct = std::collections::HashSet::new();
    // A WAL is a 32-byte header, then frames: a 24-byte header (page number first) and
    // the page.
    let mut at = 32;
    while at + 24 + page_size <= bytes.len() {
        let page = u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        let tree = match page {
            1 => "page 1 (header)".to_string(),
            p => owner.get(&p).cloned().unwrap_or_else(|| "free".into()),
        };
        *by_tree.entry(tree).or_default() += 1;
        total += 1;
        distinct.insert(page);
        at += 24 + page_size;
    }
    let per = |n: u64| n as f64 / COMMITS as f64;
    let split: Vec<String> = by_tree
        .iter()
        .map(|(tree, n)| format!("{tree} {:.2}", per(*n)))
        .collect();
    println!(
        "| {name} | {page_size} | {micros:.1} µs | {:.2} | {:.1} | {:.2} | {} |",
        per(total),
        per(total) * (page_size + 24) as f64 / 1024.0,
        per(distinct.len() as u64),
        split.join(", ")
    );
}

fn raw(dir: &Path, file: &str, page_size: u32) -> Connection {
    let conn = Connection::open(dir.join(file)).unwrap();
    conn.pragma_update(None, "page_size", page_size).unwrap();
    conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get::<_, String>(0))
        .unwrap();
    conn.pragma_update(None, "synchronous", "NORMAL").unwrap();
    conn.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
    conn
}

fn append(dir: &Path, page_size: u32) {
    let file = format!("append-{page_size}.sqlite");
    let mut conn = raw(dir, &file, page_size);
    conn.execute_batch("CREATE TABLE kv (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        .unwrap();
    let wal = dir.join(format!("{file}-wal"));
    let name = format!("(a) one rowid append, {page_size}-byte pages");
    let probe = raw(dir, &file, page_size);
    measure(&name, &probe, &wal, |i| {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        tx.prepare_cached("INSERT INTO kv VALUES (?1, 'value')")
            .unwrap()
            .execute(params![i as i64])
            .unwrap();
        tx.commit().unwrap();
    });
}

fn our_submit(dir: &Path, keys: Keys, label: &str) {
    let file = format!("ours-{label}.sqlite");
    let mut settings = Settings::default();
    settings.synchronous = Synchronous::Normal;
    settings.wal_autocheckpoint_pages = 0;
    let mut store = SqliteStore::open(dir.join(&file), settings).unwrap();
    let probe = SqliteStore::open(dir.join(&file), settings).unwrap();
    let session = keys.session();
    let name = format!("our submit (schema {}), {label} keys", MIGRATIONS.len());
    measure(
        &name,
        probe.connection(),
        &dir.join(format!("{file}-wal")),
        |i| {
            let e = bench_entry(i, keys);
            let fp = request_fingerprint(&session, &e.queue_id, &e.request);
            store.claim(&session, &fp, &e).unwrap();
        },
    );
}

/// The submit as an older schema stored it, IDs as text. Version 2: both tables
/// WITHOUT ROWID, the whole entry as JSON, the fingerprint as hex text, SQLite's default
/// page size. Version 3: as version 4 but for the IDs (the library's page settings, the
/// fingerprint as bytes, the slim entry JSON).
fn old_schema_submit(dir: &Path, version: usize, keys: Keys, label: &str) {
    let file = format!("v{version}-{label}.sqlite");
    let page_size = if version == 2 {
        4096
    } else {
        storage_sqlite::DEFAULT_PAGE_SIZE
    };
    let mut conn = raw(dir, &file, page_size);
    for (_, sql) in &MIGRATIONS[..version] {
        conn.execute_batch(sql).unwrap();
    }
    let probe = raw(dir, &file, page_size);
    let session = keys.session();
    let name = format!("schema {version} submit, {label} keys");
    measure(&name, &probe, &dir.join(format!("{file}-wal")), |i| {
        let e = bench_entry(i, keys);
        let fp = request_fingerprint(&session, &e.queue_id, &e.request);
        let (fingerprint, json) = if version == 2 {
            (
                Value::Text(fp.as_str().to_owned()),
                serde_json::to_string(&e).unwrap(),
            )
        } else {
            (
                Value::Blob(timeline_core::seal::unhex(fp.as_str()).unwrap()),
                hand_json(&e),
            )
        };
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        tx.prepare_cached(
            "INSERT INTO workspace_chat_outbox_operation_identity
                 (session_id, operation_id, fingerprint, queue_id, removed, claimed_at)
             VALUES (?1, ?2, ?3, ?4, 0, ?5)",
        )
        .unwrap()
        .execute(params![
            session.as_str(),
            e.operation_id.as_str(),
            fingerprint,
            e.queue_id.as_str(),
            i as i64
        ])
        .unwrap();
        tx.prepare_cached(
            "INSERT INTO workspace_chat_outbox (session_id, queue_id, operation_id, position, entry_json)
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .unwrap()
        .execute(params![
            session.as_str(),
            e.queue_id.as_str(),
            e.operation_id.as_str(),
            e.position,
            json
        ])
        .unwrap();
        tx.commit().unwrap();
    });
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    println!(
        "| case | page size | time per commit | frames per commit | WAL KiB per commit | pages to checkpoint per commit | frames by B-tree |"
    );
    println!("|---|---:|---:|---:|---:|---:|---|");
    append(dir.path(), 4096);
    append(dir.path(), storage_sqlite::DEFAULT_PAGE_SIZE);
    for (keys, label) in [(Keys::Short, "short"), (Keys::Uuid, "UUID")] {
        old_schema_submit(dir.path(), 2, keys, label);
        old_schema_submit(dir.path(), 3, keys, label);
        our_submit(dir.path(), keys, label);
    }
}
