//! SQLite specifics: migrations, connection settings, two writers on one file, corrupt
//! rows (ST-01, ST-02).
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;

use outbox_core::ids::{OperationId, SessionId};
use outbox_core::store::OutboxStore;
use overlay_core::overlay::{write, Change};
use overlay_core::store::{OverlayStore, RowClass, StoreError, StoredBlock};
use storage_sqlite::{OpenError, Settings, SqliteStore, Synchronous, MIGRATIONS, SCHEMA_VERSION};
use timeline_core::block::Block;
use timeline_core::key::{BlockKey, BlockType, RunId, TargetId};
use timeline_core::time::Millis;

fn tables(store: &SqliteStore) -> HashSet<String> {
    let mut stmt = store
        .connection()
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
        .unwrap();
    stmt.query_map([], |r| r.get::<_, String>(0))
        .unwrap()
        .map(|r| r.unwrap())
        .collect()
}

// ST-01, ST-02: the migrations build every table of the seed and set the version.
#[test]
fn migrations_build_the_seed_tables() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("db.sqlite"), Settings::default()).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    assert_eq!(SCHEMA_VERSION as usize, MIGRATIONS.len());
    let t = tables(&store);
    for name in [
        "workspace_chat_outbox",
        "workspace_chat_outbox_operation_identity",
        "chat_operation_ledger",
        "chat_live_timeline_overlays",
        "chat_live_timeline_overlay_revisions",
        "chat_pending_terminal_overlay_cleanups",
        "chat_session_messages",
    ] {
        assert!(t.contains(name), "{name}");
    }
    // Every migration is numbered in order and applies cleanly to a blank database.
    for (i, (name, sql)) in MIGRATIONS.iter().enumerate() {
        assert!(name.starts_with(&format!("{:04}_", i + 1)), "{name}");
        assert!(!sql.trim().is_empty());
    }
    let ok: String = store
        .connection()
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
    // Opening again is a no-op.
    drop(store);
    let store = SqliteStore::open(dir.path().join("db.sqlite"), Settings::default()).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
}

// ST-02: a database written by the first schema version opens and upgrades.
#[test]
fn a_version_1_database_upgrades_with_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.sqlite");
    let v1 = SqliteStore::open_at(&path, Settings::default(), 1).unwrap();
    assert_eq!(v1.schema_version().unwrap(), 1);
    // Data as version 1 wrote it.
    let entry = serde_json::json!({
        "queueId": "q-1", "operationId": "op-1",
        "request": {"userText": "hello", "source": "composer", "createdAt": 5},
        "controls": {"intent": "enqueue", "sendMode": "queue"},
        "status": "queued", "autoDrain": true, "position": 0
    });
    v1.connection()
        .execute_batch(&format!(
            "INSERT INTO workspace_chat_outbox VALUES ('s1', 'q-1', 'op-1', 0, '{entry}');
             INSERT INTO workspace_chat_outbox_operation_identity VALUES ('s1', 'op-1', 'abc', 'q-1', 0);
             INSERT INTO chat_pending_terminal_overlay_cleanups VALUES ('s1', 'run-1');"
        ))
        .unwrap();
    drop(v1);
    let mut store = SqliteStore::open(&path, Settings::default()).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    let s1 = SessionId::new("s1").unwrap();
    let entries = store.entries(&s1).unwrap();
    assert_eq!(entries[0].entry().unwrap().request.user_text, "hello");
    let id = store
        .identity(&s1, &OperationId::new("op-1").unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(id.fingerprint.as_str(), "abc");
    let claimed_at: i64 = store
        .connection()
        .query_row(
            "SELECT claimed_at FROM workspace_chat_outbox_operation_identity",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(claimed_at, 0, "the new column has its default");
    use overlay_core::store::CleanupJournal;
    assert_eq!(store.pending_cleanups(None).unwrap().len(), 1);
}

// ST-02: a file from a newer schema is refused, not damaged.
#[test]
fn a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new.sqlite");
    let store = SqliteStore::open(&path, Settings::default()).unwrap();
    store
        .connection()
        .pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    drop(store);
    match SqliteStore::open(&path, Settings::default()) {
        Err(OpenError::NewerSchema { found, supported }) => {
            assert_eq!((found, supported), (SCHEMA_VERSION + 1, SCHEMA_VERSION))
        }
        other => panic!("{other:?}"),
    }
}

// ST-02: WAL, foreign keys, busy timeout and synchronous on every connection.
#[test]
fn every_connection_gets_its_pragmas() {
    let dir = tempfile::tempdir().unwrap();
    for (sync, expect) in [(Synchronous::Full, 2i64), (Synchronous::Normal, 1)] {
        let settings = Settings {
            synchronous: sync,
            busy_timeout: std::time::Duration::from_millis(1234),
        };
        let store = SqliteStore::open(dir.path().join("p.sqlite"), settings).unwrap();
        let c = store.connection();
        let mode: String = c
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        let fk: i64 = c
            .query_row("PRAGMA foreign_keys", [], |r| r.get(0))
            .unwrap();
        let busy: i64 = c
            .query_row("PRAGMA busy_timeout", [], |r| r.get(0))
            .unwrap();
        let synchronous: i64 = c.query_row("PRAGMA synchronous", [], |r| r.get(0)).unwrap();
        assert_eq!(
            (mode.as_str(), fk, busy, synchronous),
            ("wal", 1, 1234, expect)
        );
    }
    assert_eq!(Settings::default().synchronous, Synchronous::Full);
}

fn row(id: String) -> StoredBlock {
    StoredBlock {
        block: Block::new(
            BlockKey::parse(BlockType::AgentReply, &id).unwrap(),
            Millis(1),
        ),
        class: RowClass::Ordinary,
        run_id: Some(RunId::new("run-1").unwrap()),
    }
}

// ST-02, OV-02: two connections write one target at once: the stale writer retries
// against current state, nothing is overwritten, and every revision is unique.
#[test]
fn two_connections_writing_one_file_never_overwrite_and_never_share_a_revision() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.sqlite");
    drop(SqliteStore::open(&path, Settings::default()).unwrap());
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let path = path.clone();
            std::thread::spawn(move || {
                let mut store = SqliteStore::open(&path, Settings::default()).unwrap();
                let (s, t) = (SessionId::new("s1").unwrap(), TargetId::new("s1").unwrap());
                let mut revisions = Vec::new();
                for i in 0..150 {
                    let result = write(
                        &mut store,
                        &s,
                        &t,
                        &Change::Publish(vec![row(format!("w{w}-{i}"))]),
                    )
                    .unwrap();
                    revisions.push(result.stored().unwrap().revision);
                }
                revisions
            })
        })
        .collect();
    let mut all: Vec<u64> = writers
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let mut store = SqliteStore::open(&path, Settings::default()).unwrap();
    let (s, t) = (SessionId::new("s1").unwrap(), TargetId::new("s1").unwrap());
    let stored = store.load(&s, &t).unwrap().unwrap();
    assert_eq!(
        stored.blocks.len(),
        300,
        "no write was lost to a stale writer"
    );
    let n = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), n, "revisions are unique");
    assert_eq!(store.current_revision().unwrap(), *all.last().unwrap());
    assert_eq!(stored.revision, *all.last().unwrap());
}

// OV-02: a stale writer on another connection gets the current state back.
#[test]
fn a_stale_compare_and_set_on_another_connection_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cas.sqlite");
    let mut a = SqliteStore::open(&path, Settings::default()).unwrap();
    let mut b = SqliteStore::open(&path, Settings::default()).unwrap();
    let (s, t) = (SessionId::new("s1").unwrap(), TargetId::new("s1").unwrap());
    let seen = a
        .compare_and_set(&s, &t, None, 0, vec![row("a".into())])
        .unwrap();
    b.compare_and_set(
        &s,
        &t,
        Some(seen.revision),
        0,
        vec![row("a".into()), row("b".into())],
    )
    .unwrap();
    match a.compare_and_set(&s, &t, Some(seen.revision), 0, vec![]) {
        Err(StoreError::Stale { current: Some(now) }) => assert_eq!(now.blocks.len(), 2),
        other => panic!("{other:?}"),
    }
}

// A corrupt overlay row is a typed error, never a panic or an empty overlay.
#[test]
fn a_corrupt_overlay_row_is_a_typed_error() {
    let mut store = SqliteStore::open_in_memory(Settings::default()).unwrap();
    store
        .connection()
        .execute(
            "INSERT INTO chat_live_timeline_overlays VALUES ('s1', 's1', 3, 0, '[{\"broken\": true}]')",
            [],
        )
        .unwrap();
    let (s, t) = (SessionId::new("s1").unwrap(), TargetId::new("s1").unwrap());
    assert!(matches!(
        store.load(&s, &t),
        Err(StoreError::Corrupt { .. })
    ));
}
