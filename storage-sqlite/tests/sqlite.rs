//! SQLite specifics: migrations, connection settings, two writers on one file, corrupt
//! rows (ST-01, ST-02).
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::path::Path;

use outbox_core::ids::{OperationId, SessionId};
use outbox_core::store::OutboxStore;
use overlay_core::overlay::Change;
use overlay_core::store::write;
use overlay_core::store::{OverlayError, OverlayStore, RowClass, StoredBlock};
use rusqlite::Connection;
use storage_sqlite::{
    OpenError, Settings, SqliteStore, Synchronous, MIGRATIONS, SCHEMA_TABLE, SCHEMA_VERSION,
};
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
    // The version is the one row of `custody_schema`; `user_version` is not used.
    assert!(t.contains(SCHEMA_TABLE));
    assert_eq!(
        schema_rows(store.connection()),
        [(1, i64::from(SCHEMA_VERSION))]
    );
    assert_eq!(user_version(store.connection()), 0);
    // Opening again is a no-op.
    drop(store);
    let store = SqliteStore::open(dir.path().join("db.sqlite"), Settings::default()).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    assert_eq!(
        schema_rows(store.connection()),
        [(1, i64::from(SCHEMA_VERSION))]
    );
}

/// The rows of `custody_schema`: (id, version).
fn schema_rows(conn: &Connection) -> Vec<(i64, i64)> {
    conn.prepare("SELECT id, version FROM custody_schema")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn user_version(conn: &Connection) -> i64 {
    conn.query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap()
}

/// A file as an earlier release wrote it at `version`: WAL, the first `version`
/// migrations, the version in `user_version` and no `custody_schema`; session `s1`
/// holds the cleanup job of `run-1`.
fn earlier_release_file(path: &Path, version: usize) {
    let conn = Connection::open(path).unwrap();
    let _: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .unwrap();
    for (_, sql) in &MIGRATIONS[..version] {
        conn.execute_batch(sql).unwrap();
    }
    conn.pragma_update(None, "user_version", version as i64)
        .unwrap();
    conn.execute(
        "INSERT INTO chat_pending_terminal_overlay_cleanups VALUES ('s1', 'run-1')",
        [],
    )
    .unwrap();
}

// ST-02: a store written by an earlier release, which kept its version in
// `PRAGMA user_version`, opens and upgrades: `user_version` is read once, the
// `custody_schema` table is created with that version in the transaction of the first
// migration (or of its own, when none is due), and from then on `user_version` is never
// read or written again: whatever it says later, the store opens at its version, and it
// keeps the value the earlier release left.
#[test]
fn a_store_of_an_earlier_release_upgrades_and_leaves_user_version_behind() {
    use overlay_core::store::CleanupJournal;
    let dir = tempfile::tempdir().unwrap();
    for version in [2, SCHEMA_VERSION as usize] {
        let path = dir.path().join(format!("v{version}.sqlite"));
        earlier_release_file(&path, version);
        let mut store = SqliteStore::open(&path, Settings::default()).unwrap();
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        assert_eq!(store.pending_cleanups(None).unwrap().len(), 1);
        assert_eq!(
            schema_rows(store.connection()),
            [(1, i64::from(SCHEMA_VERSION))]
        );
        assert_eq!(
            user_version(store.connection()),
            version as i64,
            "not written"
        );
        drop(store);
        for stale in [0, 1, -5, 99] {
            Connection::open(&path)
                .unwrap()
                .pragma_update(None, "user_version", stale)
                .unwrap();
            let mut store = SqliteStore::open(&path, Settings::default()).unwrap();
            assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
            assert_eq!(store.pending_cleanups(None).unwrap().len(), 1);
            assert_eq!(user_version(store.connection()), stale, "not written");
        }
    }
    // Through a connection the application owns, the same.
    let path = dir.path().join("shared.sqlite");
    earlier_release_file(&path, 3);
    let store = SqliteStore::from_connection(Connection::open(&path).unwrap()).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    assert_eq!(user_version(store.connection()), 3);
}

// ST-02: connections that open one store of an earlier release at once convert and
// migrate it once: each reads the version again inside its write transaction.
#[test]
fn connections_upgrading_one_file_at_once_migrate_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.sqlite");
    earlier_release_file(&path, 1);
    let openers: Vec<_> = (0..4)
        .map(|_| {
            let path = path.clone();
            std::thread::spawn(move || {
                SqliteStore::open(&path, Settings::default())
                    .map(|store| store.schema_version().unwrap())
                    .map_err(|e| e.to_string())
            })
        })
        .collect();
    for opener in openers {
        assert_eq!(opener.join().unwrap(), Ok(SCHEMA_VERSION));
    }
    let conn = Connection::open(&path).unwrap();
    assert_eq!(schema_rows(&conn), [(1, i64::from(SCHEMA_VERSION))]);
    assert_eq!(user_version(&conn), 1);
}

// ST-02: a database written by the first schema version opens and upgrades.
#[test]
fn a_version_1_database_upgrades_with_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.sqlite");
    let v1 = SqliteStore::open_at(&path, Settings::default(), 1).unwrap();
    assert_eq!(v1.schema_version().unwrap(), 1);
    // Data as version 1 wrote it.
    const HEX: &str = "00ff0123456789abcdef00ff0123456789abcdef00ff0123456789abcdef00ff";
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
             INSERT INTO workspace_chat_outbox_operation_identity VALUES ('s1', 'op-2', '{HEX}', 'q-2', 1);
             INSERT INTO chat_pending_terminal_overlay_cleanups VALUES ('s1', 'run-1');"
        ))
        .unwrap();
    drop(v1);
    let mut store = SqliteStore::open(&path, Settings::default()).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    let s1 = SessionId::new("s1").unwrap();
    let entries = store.entries(&s1).unwrap();
    assert_eq!(entries.len(), 1);
    let e = entries[0].entry().unwrap();
    assert_eq!(
        (e.queue_id.as_str(), e.operation_id.as_str(), e.position),
        ("q-1", "op-1", 0)
    );
    assert_eq!(e.request.user_text, "hello");
    // Version 3 rebuilt the outbox as a rowid table; the queue ID stays unique.
    let dup = store.connection().execute(
        "INSERT INTO workspace_chat_outbox (session_id, queue_id, operation_id, position, entry_json)
         VALUES ('s1', 'q-1', 'op-2', 1, '{}')",
        [],
    );
    assert!(dup.is_err(), "a second row for (s1, q-1) was accepted");
    let id = store
        .identity(&s1, &OperationId::new("op-1").unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(id.fingerprint.as_str(), "abc");
    // Version 3 keeps a hex fingerprint as its 32 bytes and anything else as text; both
    // read back exactly as written.
    let hex = store
        .identity(&s1, &OperationId::new("op-2").unwrap())
        .unwrap()
        .unwrap();
    assert_eq!((hex.fingerprint.as_str(), hex.removed), (HEX, true));
    let stored: Vec<(String, String)> = store
        .connection()
        .prepare("SELECT operation_id, typeof(fingerprint) FROM workspace_chat_outbox_operation_identity ORDER BY operation_id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        stored,
        [
            ("op-1".to_string(), "text".to_string()),
            ("op-2".into(), "blob".into())
        ]
    );
    let claimed_at: Vec<i64> = store
        .connection()
        .prepare("SELECT claimed_at FROM workspace_chat_outbox_operation_identity")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(claimed_at, [0, 0], "the new column has its default");
    use overlay_core::store::CleanupJournal;
    assert_eq!(store.pending_cleanups(None).unwrap().len(), 1);
}

// ST-02: a file from a newer schema is refused, not damaged: a version in
// `custody_schema` above this build's, and the same in the `user_version` of a store
// without that table (nothing is written to it: it does not get the table).
#[test]
fn a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new.sqlite");
    let store = SqliteStore::open(&path, Settings::default()).unwrap();
    store
        .connection()
        .execute(
            "UPDATE custody_schema SET version = ?1",
            [SCHEMA_VERSION + 1],
        )
        .unwrap();
    drop(store);
    let newer = |path: &Path| match SqliteStore::open(path, Settings::default()) {
        Err(OpenError::NewerSchema { found, supported }) => {
            assert_eq!((found, supported), (SCHEMA_VERSION + 1, SCHEMA_VERSION))
        }
        other => panic!("{other:?}"),
    };
    newer(&path);
    assert_eq!(
        schema_rows(&Connection::open(&path).unwrap()),
        [(1, i64::from(SCHEMA_VERSION) + 1)]
    );

    let path = dir.path().join("newer-release.sqlite");
    earlier_release_file(&path, SCHEMA_VERSION as usize);
    Connection::open(&path)
        .unwrap()
        .pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    newer(&path);
    let tables: i64 = Connection::open(&path)
        .unwrap()
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE name = 'custody_schema'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(tables, 0, "nothing was written");
}

// ST-02: WAL, foreign keys, busy timeout and synchronous on every connection.
#[test]
fn every_connection_gets_its_pragmas() {
    let dir = tempfile::tempdir().unwrap();
    for (sync, expect) in [(Synchronous::Full, 2i64), (Synchronous::Normal, 1)] {
        let mut settings = Settings::default();
        settings.synchronous = sync;
        settings.busy_timeout = std::time::Duration::from_millis(1234);
        settings.wal_autocheckpoint_pages = 777;
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
        let checkpoint: i64 = c
            .query_row("PRAGMA wal_autocheckpoint", [], |r| r.get(0))
            .unwrap();
        assert_eq!(
            (mode.as_str(), fk, busy, synchronous, checkpoint),
            ("wal", 1, 1234, expect, 777)
        );
    }
    assert_eq!(Settings::default().synchronous, Synchronous::Full);
}

/// A new entry `q` / `op` saying "hi".
fn hi_entry() -> outbox_core::entry::OutboxEntry {
    use outbox_core::entry::{Controls, MessageRequest, OutboxEntry};
    OutboxEntry::queued(
        outbox_core::ids::QueueId::new("q").unwrap(),
        OperationId::new("op").unwrap(),
        MessageRequest::text("hi", "composer", Millis(1)),
        Controls::automatic(),
        0,
    )
}

// OB-02, ST-01: a claim stores the fingerprint as its 32 digest bytes and reads it back
// as the same hex text; the entry JSON leaves out what the row's columns hold.
#[test]
fn a_claim_stores_compact_rows() {
    use outbox_core::fingerprint::request_fingerprint;
    let mut store = SqliteStore::open_in_memory(Settings::default()).unwrap();
    let session = SessionId::new("s").unwrap();
    let entry = hi_entry();
    let fp = request_fingerprint(&session, &entry.queue_id, &entry.request);
    store.claim(&session, &fp, &entry).unwrap();
    let (kind, len): (String, i64) = store
        .connection()
        .query_row(
            "SELECT typeof(fingerprint), length(fingerprint) FROM workspace_chat_outbox_operation_identity",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!((kind.as_str(), len), ("blob", 32));
    let identity = store
        .identity(&session, &entry.operation_id)
        .unwrap()
        .unwrap();
    assert_eq!(identity.fingerprint, fp);
    let json: String = store
        .connection()
        .query_row("SELECT entry_json FROM workspace_chat_outbox", [], |r| {
            r.get(0)
        })
        .unwrap();
    for column in ["queueId", "operationId", "position"] {
        assert!(!json.contains(column), "{column} in {json}");
    }
    assert!(json.contains("\"userText\":\"hi\""), "{json}");
    assert_eq!(store.entries(&session).unwrap()[0].entry(), Some(&entry));
}

fn page_size(store: &SqliteStore) -> i64 {
    store
        .connection()
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .unwrap()
}

// ST-02: a new file gets the configured page size; a file keeps the size it was
// created with, whatever a later connection asks for.
#[test]
fn a_new_file_takes_the_page_size_and_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("default.sqlite"), Settings::default()).unwrap();
    assert_eq!(
        page_size(&store),
        i64::from(storage_sqlite::DEFAULT_PAGE_SIZE)
    );

    let path = dir.path().join("big.sqlite");
    let mut settings = Settings::default();
    settings.page_size = 8192;
    let mut store = SqliteStore::open(&path, settings).unwrap();
    let session = SessionId::new("s").unwrap();
    let target = TargetId::new("s").unwrap();
    write(
        &mut store,
        &session,
        &target,
        &Change::Publish(vec![row("a".into())]),
    )
    .unwrap();
    drop(store);
    let mut store = SqliteStore::open(&path, Settings::default()).unwrap();
    assert_eq!(page_size(&store), 8192);
    let overlay = store.load(&session, &target).unwrap().unwrap();
    assert_eq!(overlay.blocks.len(), 1);
}

// Page sizes SQLite would silently ignore are refused, at both ends of the range.
#[test]
fn page_sizes_outside_sqlites_range_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (size, ok) in [
        (511, false),
        (512, true),
        (3000, false),
        (65536, true),
        (65537, false),
        (131072, false),
    ] {
        let mut settings = Settings::default();
        settings.page_size = size;
        let opened = SqliteStore::open(dir.path().join(format!("{size}.sqlite")), settings);
        match opened {
            Ok(store) => {
                assert!(ok, "{size} was accepted");
                assert_eq!(page_size(&store), i64::from(size));
            }
            Err(OpenError::InvalidSetting { name, reason }) => {
                assert!(!ok, "{size} was refused: {reason}");
                assert_eq!(name, "page_size");
                assert!(reason.starts_with(&size.to_string()), "{reason}");
            }
            Err(other) => panic!("{size}: {other}"),
        }
    }
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
        Err(OverlayError::Stale { current: Some(now) }) => assert_eq!(now.blocks.len(), 2),
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
        Err(OverlayError::Corrupt { .. })
    ));
}

mod fingerprint_storage {
    use outbox_core::fingerprint::Digest256;
    use outbox_core::ids::SessionId;
    use outbox_core::store::OutboxStore;
    use proptest::prelude::*;
    use storage_sqlite::{Settings, SqliteStore};

    fn fingerprints() -> impl Strategy<Value = String> {
        prop_oneof![
            // What the library computes: 64 lowercase hex characters.
            "[0-9a-f]{64}",
            // Near misses that must stay text: uppercase, one short, one long, not hex.
            "[0-9A-F]{64}",
            "[0-9a-f]{63}",
            "[0-9a-f]{65}",
            "[0-9a-fg]{64}",
            // Anything at all.
            ".{0,80}",
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(fixtures::proptest_cases()))]

        // OB-02, ST-01: whatever fingerprint is claimed reads back exactly, whether it is
        // stored as 32 bytes or as text.
        #[test]
        fn a_fingerprint_reads_back_as_written(text in fingerprints()) {
            let mut store = SqliteStore::open_in_memory(Settings::default()).unwrap();
            let session = SessionId::new("s").unwrap();
            let entry = super::hi_entry();
            let fp = Digest256::from_hex(text.clone());
            store.claim(&session, &fp, &entry).unwrap();
            let identity = store.identity(&session, &entry.operation_id).unwrap().unwrap();
            prop_assert_eq!(identity.fingerprint.as_str(), text.as_str());
            let kind: String = store
                .connection()
                .query_row(
                    "SELECT typeof(fingerprint) FROM workspace_chat_outbox_operation_identity",
                    [],
                    |r| r.get(0),
                )
                .unwrap();
            let hex = text.len() == 64 && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
            prop_assert_eq!(kind, if hex { "blob" } else { "text" });
        }
    }
}

// ST-02: a version 3 database whose IDs are UUID text upgrades to version 4; the rows
// read back exactly, and the same operation is still the same claim.
#[test]
fn a_version_3_database_with_uuid_ids_upgrades() {
    const SESSION: &str = "7d5e2a50-2b8e-4c77-9a43-0f5e1c7d9b21";
    const QUEUE: &str = "0e5c7c34-5d1f-4a3b-9c2e-7f1a2b3c4d5e";
    const OP: &str = "session-message-f3a9d2e1-8c7b-4f6a-9e5d-1c2b3a4f5e6d";
    const UPPER: &str = "F3A9D2E1-8C7B-4F6A-9E5D-1C2B3A4F5E6D";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v3.sqlite");
    let v3 = SqliteStore::open_at(&path, Settings::default(), 3).unwrap();
    let entry = serde_json::json!({
        "request": {"userText": "hello", "source": "composer", "createdAt": 5},
        "controls": {"intent": "enqueue", "sendMode": "queue"},
        "status": "queued", "autoDrain": true
    });
    v3.connection()
        .execute_batch(&format!(
            "INSERT INTO workspace_chat_outbox (session_id, queue_id, operation_id, position, entry_json)
                 VALUES ('{SESSION}', '{QUEUE}', '{OP}', 0, '{entry}'),
                        ('{SESSION}', '{UPPER}', 'op-2', 1, '{entry}');
             INSERT INTO workspace_chat_outbox_operation_identity
                 (session_id, operation_id, fingerprint, queue_id, removed, claimed_at)
                 VALUES ('{SESSION}', '{OP}', 'abc', '{QUEUE}', 0, 5),
                        ('{SESSION}', 'op-2', 'def', '{UPPER}', 0, 5);"
        ))
        .unwrap();
    drop(v3);
    let mut store = SqliteStore::open(&path, Settings::default()).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    let kinds: Vec<String> = store
        .connection()
        .prepare(
            "SELECT typeof(session_id) || ' ' || typeof(queue_id) || ' ' || typeof(operation_id)
             FROM workspace_chat_outbox ORDER BY position",
        )
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(kinds, ["blob blob blob", "blob text text"]);
    let ok: String = store
        .connection()
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");

    let session = SessionId::new(SESSION).unwrap();
    let read: Vec<(String, String)> = store
        .entries(&session)
        .unwrap()
        .iter()
        .map(|e| {
            let e = e.entry().unwrap();
            (e.queue_id.as_str().into(), e.operation_id.as_str().into())
        })
        .collect();
    assert_eq!(
        read,
        [(QUEUE.into(), OP.into()), (UPPER.into(), "op-2".into())]
    );
    let op = OperationId::new(OP).unwrap();
    let identity = store.identity(&session, &op).unwrap().unwrap();
    assert_eq!(
        (identity.fingerprint.as_str(), identity.queue_id.as_str()),
        ("abc", QUEUE)
    );
    // The same operation claimed again finds the upgraded row.
    let mut again = store.entries(&session).unwrap()[0].entry().unwrap().clone();
    again.position = 7;
    let claim = store
        .claim(&session, &identity.fingerprint, &again)
        .unwrap();
    assert!(matches!(claim, outbox_core::store::Claim::Existing(_)));
    assert_eq!(store.entries(&session).unwrap().len(), 2);
}

mod id_storage {
    use proptest::prelude::*;
    use rusqlite::Connection;
    use storage_sqlite::{read_id, IdColumn, MIGRATIONS};

    fn ids() -> impl Strategy<Value = String> {
        let uuid = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}";
        prop_oneof![
            uuid.prop_map(|u| u),
            ("(\\PC|[a-z-]){0,10}", uuid).prop_map(|(p, u)| p + &u),
            // Near misses: upper case, a dash moved, one character short or long.
            "[0-9A-F]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
            "[0-9a-f]{7}-[0-9a-f]{5}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
            "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{11,13}",
            "\\PC{0,50}",
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases((fixtures::proptest_cases() / 4).max(1)))]

        // ST-02: migration 4 converts a stored ID exactly as the library writes a new
        // one, so rows from before the upgrade are found by the same keys.
        #[test]
        fn migration_4_stores_ids_as_the_library_does(ids in prop::collection::vec(ids(), 1..40)) {
            let conn = Connection::open_in_memory().unwrap();
            for (_, sql) in &MIGRATIONS[..3] {
                conn.execute_batch(sql).unwrap();
            }
            for (i, id) in ids.iter().enumerate() {
                conn.execute(
                    "INSERT INTO workspace_chat_outbox_operation_identity
                         (session_id, operation_id, fingerprint, queue_id)
                     VALUES (?1, ?2, x'00', ?1)",
                    rusqlite::params![id, i as i64],
                )
                .unwrap();
            }
            conn.execute_batch(MIGRATIONS[3].1).unwrap();
            let mut stmt = conn
                .prepare(
                    "SELECT session_id, queue_id FROM workspace_chat_outbox_operation_identity
                     ORDER BY CAST(operation_id AS INTEGER)",
                )
                .unwrap();
            let stored: Vec<(rusqlite::types::Value, rusqlite::types::Value)> = stmt
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            prop_assert_eq!(stored.len(), ids.len());
            for (id, (session, queue)) in ids.iter().zip(&stored) {
                prop_assert_eq!(session, &IdColumn(id).value());
                prop_assert_eq!(queue, &IdColumn(id).value());
                prop_assert_eq!(read_id(session.into()), Ok(id.clone()));
            }
        }
    }
}

// OB-05, ST-01: an outbox row whose ID column does not read back as an ID (a BLOB too
// short to hold a UUID) shows as a blocked entry, the queue ID as stored; an identity
// whose queue ID does not read back is a typed error, never a panic.
#[test]
fn an_undecodable_id_column_blocks_the_entry() {
    use outbox_core::entry::StoredEntry;
    use outbox_core::store::OutboxError;
    let mut store = SqliteStore::open_in_memory(Settings::default()).unwrap();
    store
        .connection()
        .execute_batch(
            "INSERT INTO workspace_chat_outbox (session_id, queue_id, operation_id, position, entry_json)
                 VALUES ('s1', x'0102', 'op-1', 0, '{}');
             INSERT INTO workspace_chat_outbox_operation_identity
                 (session_id, operation_id, fingerprint, queue_id)
                 VALUES ('s1', 'op-1', 'abc', x'0102');",
        )
        .unwrap();
    let s1 = SessionId::new("s1").unwrap();
    let entries = store.entries(&s1).unwrap();
    let [StoredEntry::Blocked(blocked)] = entries.as_slice() else {
        panic!("{entries:?}");
    };
    assert_eq!(blocked.queue_id, "X'0102'");
    assert_eq!(blocked.operation_id.as_deref(), Some("op-1"));
    assert_eq!(
        blocked.reason,
        "the ID is a 2-byte BLOB, shorter than a UUID"
    );
    let identity = store.identity(&s1, &OperationId::new("op-1").unwrap());
    assert!(
        matches!(identity, Err(OutboxError::Corrupt { ref what, .. }) if what == "identity queue ID"),
        "{identity:?}"
    );
}
