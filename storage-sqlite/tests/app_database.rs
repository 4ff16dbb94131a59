//! A store in a database the application owns, opened on its connection with
//! `SqliteStore::from_connection` (ST-01, ST-02): this library's tables and its
//! `custody_schema` are created beside the application's tables, which stay as they
//! were, as do `PRAGMA user_version` and every pragma the application set; reopened, the
//! store finds its schema version. A database that held a custody store, or that SQLite
//! calls damaged, is refused as by `SqliteStore::open`.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use outbox_core::entry::{Controls, MessageRequest, OutboxEntry};
use outbox_core::fingerprint::request_fingerprint;
use outbox_core::ids::{OperationId, QueueId, SessionId};
use outbox_core::store::OutboxStore;
use rusqlite::Connection;
use storage_sqlite::{OpenError, Settings, SqliteStore, MIGRATIONS, SCHEMA_TABLE, SCHEMA_VERSION};
use timeline_core::time::Millis;

fn s1() -> SessionId {
    SessionId::new("s1").unwrap()
}

fn entry(n: i64) -> OutboxEntry {
    OutboxEntry::queued(
        QueueId::new(format!("q-{n}")).unwrap(),
        OperationId::new(format!("op-{n}")).unwrap(),
        MessageRequest::text(format!("text {n}"), "composer", Millis(1)),
        Controls::enqueue(),
        n,
    )
}

fn claim(store: &mut SqliteStore, n: i64) {
    let e = entry(n);
    let fp = request_fingerprint(&s1(), &e.queue_id, &e.request);
    store.claim(&s1(), &fp, &e).unwrap();
}

/// The application's database at `path`: its own table with a row, its own
/// `user_version`, and the pragmas it chose.
fn app_database(path: &Path) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.execute_batch(
        "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT NOT NULL);
         INSERT INTO notes (body) VALUES ('keep me');
         PRAGMA user_version = 42;",
    )
    .unwrap();
    app_pragmas(&conn);
    conn
}

/// The pragmas the application sets on each of its connections.
fn app_pragmas(conn: &Connection) {
    conn.pragma_update(None, "synchronous", "NORMAL").unwrap();
    conn.pragma_update(None, "foreign_keys", "ON").unwrap();
    conn.pragma_update(None, "wal_autocheckpoint", 500).unwrap();
    conn.pragma_update(None, "cache_size", -4000).unwrap();
    conn.busy_timeout(Duration::from_millis(250)).unwrap();
}

/// What the application set: journal mode, `synchronous`, `foreign_keys`,
/// `busy_timeout`, `wal_autocheckpoint`, `cache_size`, page size, `user_version`.
fn pragmas(conn: &Connection) -> (String, i64, i64, i64, i64, i64, i64, i64) {
    let int = |name: &str| -> i64 {
        conn.query_row(&format!("PRAGMA {name}"), [], |r| r.get(0))
            .unwrap()
    };
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    (
        mode,
        int("synchronous"),
        int("foreign_keys"),
        int("busy_timeout"),
        int("wal_autocheckpoint"),
        int("cache_size"),
        int("page_size"),
        int("user_version"),
    )
}

fn notes(conn: &Connection) -> Vec<String> {
    conn.prepare("SELECT body FROM notes ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn table_names(conn: &Connection) -> Vec<String> {
    conn.prepare("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn file() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.sqlite");
    (dir, path)
}

// ST-01, ST-02: an application's database with its own table and its own
// `user_version`, opened on its connection: this library's tables and `custody_schema`
// are created, the application's table, its `user_version` and every pragma it set are
// untouched, and reopening finds the schema version and what was written.
#[test]
fn an_app_database_gets_the_tables_and_keeps_its_own() {
    let (_dir, path) = file();
    let conn = app_database(&path);
    let before = pragmas(&conn);
    assert_eq!(before.0, "delete");
    assert_eq!(before.7, 42);
    let mut store = SqliteStore::from_connection(conn).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    claim(&mut store, 1);
    let conn = store.into_connection();
    assert_eq!(pragmas(&conn), before, "no pragma changed");
    assert_eq!(notes(&conn), ["keep me"]);
    let tables = table_names(&conn);
    for table in [
        "notes",
        SCHEMA_TABLE,
        "workspace_chat_outbox",
        "chat_live_timeline_overlay_rows",
    ] {
        assert!(tables.iter().any(|t| t == table), "{table} in {tables:?}");
    }
    let version: i64 = conn
        .query_row("SELECT version FROM custody_schema", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, i64::from(SCHEMA_VERSION));
    drop(conn);

    // Reopened on a new connection of the application: the schema version is found,
    // no migration runs again, and the application's table and version are still its own.
    let conn = Connection::open(&path).unwrap();
    app_pragmas(&conn);
    conn.execute("INSERT INTO notes (body) VALUES ('and me')", [])
        .unwrap();
    let mut store = SqliteStore::from_connection(conn).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    assert_eq!(store.entries(&s1()).unwrap().len(), 1);
    claim(&mut store, 2);
    let conn = store.into_connection();
    assert_eq!(pragmas(&conn), before);
    assert_eq!(notes(&conn), ["keep me", "and me"]);
    drop(conn);

    // The application's own database is a store now: `SqliteStore::open` finds it too.
    let mut store = SqliteStore::open(&path, Settings::default()).unwrap();
    assert_eq!(store.entries(&s1()).unwrap().len(), 2);
}

// ST-02: the application's `user_version` plays no part, whatever it says (0, a
// version this library knows, one it does not, a negative one): a database without this
// library's tables gets them, and a store in it opens at the version in
// `custody_schema`.
#[test]
fn the_apps_user_version_is_never_taken_for_the_schemas() {
    for app_version in [0i64, 1, 3, SCHEMA_VERSION.into(), 77, -1] {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE notes (body TEXT)")
            .unwrap();
        conn.pragma_update(None, "user_version", app_version)
            .unwrap();
        let mut store = SqliteStore::from_connection(conn).unwrap();
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        claim(&mut store, 1);
        let conn = store.into_connection();
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, app_version, "{app_version}");
        // The application changes its version; the store still opens at its own.
        conn.pragma_update(None, "user_version", app_version + 1)
            .unwrap();
        let mut store = SqliteStore::from_connection(conn).unwrap();
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        assert_eq!(store.entries(&s1()).unwrap().len(), 1);
    }
}

// ST-02: a new, empty database opened on a connection gets the store, and a store at an
// older version that also holds the application's tables is upgraded, the application's
// rows kept.
#[test]
fn an_empty_app_database_and_an_older_schema_open() {
    let (_dir, path) = file();
    let store = SqliteStore::from_connection(Connection::open(&path).unwrap()).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    drop(store);

    // A store at version 2 to which the application added its table.
    let (_dir, path) = file();
    drop(SqliteStore::open_at(&path, Settings::default(), 2).unwrap());
    let conn = app_database(&path);
    let version: i64 = conn
        .query_row("SELECT version FROM custody_schema", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, 2);
    let store = SqliteStore::from_connection(conn).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    assert_eq!(notes(&store.into_connection()), ["keep me"]);
}

// ST-02: a database that held a custody store and lost some of its tables is refused
// as `Corrupt`, never given the missing tables again empty; one SQLite calls not a
// database is refused as `Corrupt` too. Nothing is written to either.
#[test]
fn a_damaged_app_database_is_refused() {
    let (_dir, path) = file();
    drop(SqliteStore::from_connection(app_database(&path)).unwrap());
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch("DROP TABLE workspace_chat_outbox")
        .unwrap();
    match SqliteStore::from_connection(conn) {
        Err(OpenError::Corrupt { reason }) => {
            assert!(reason.contains("workspace_chat_outbox"), "{reason}");
            assert!(reason.contains("lost"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert!(!table_names(&Connection::open(&path).unwrap())
        .iter()
        .any(|t| t == "workspace_chat_outbox"));

    let (_dir, path) = file();
    std::fs::write(&path, "not a database, ".repeat(100)).unwrap();
    let before = std::fs::read(&path).unwrap();
    match SqliteStore::from_connection(Connection::open(&path).unwrap()) {
        Err(OpenError::Corrupt { reason }) => {
            assert!(reason.contains("not a database"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(std::fs::read(&path).unwrap(), before);
}

// ST-02: a connection inside a transaction of the application is refused by SQLite
// (the migrations are transactions of their own), as a plain SQLite error, not as a
// damaged file.
#[test]
fn a_connection_inside_a_transaction_is_refused() {
    let conn = Connection::open_in_memory().unwrap();
    conn.execute_batch("CREATE TABLE notes (body TEXT); BEGIN; INSERT INTO notes VALUES ('x');")
        .unwrap();
    match SqliteStore::from_connection(conn) {
        Err(err @ OpenError::Sqlite(_)) => {
            assert!(err.to_string().contains("transaction"), "{err}")
        }
        other => panic!("{other:?}"),
    }
}

// ST-02: the migrations run on the application's connection as they do on a file of
// the library's own: each version's tables, in order, on a database that already holds
// other tables.
#[test]
fn every_version_applies_beside_other_tables() {
    let conn = Connection::open_in_memory().unwrap();
    conn.execute_batch("CREATE TABLE notes (body TEXT)")
        .unwrap();
    let store = SqliteStore::from_connection(conn).unwrap();
    let conn = store.into_connection();
    let fresh = Connection::open_in_memory().unwrap();
    for (_, sql) in MIGRATIONS {
        fresh.execute_batch(sql).unwrap();
    }
    let mut expected = table_names(&fresh);
    expected.push("notes".into());
    expected.push(SCHEMA_TABLE.into());
    expected.sort();
    assert_eq!(table_names(&conn), expected);
}

// ST-02: with the `sqlcipher` feature, an encrypted database is opened on a connection
// whose key the application set: the store works and reopens with the key, the file
// holds none of its text in the clear, and without the key or with another one it is
// refused as `Corrupt` (SQLite calls it not a database) and left as it was.
#[cfg(feature = "sqlcipher")]
#[test]
fn an_encrypted_database_opens_with_its_key_only() {
    let (_dir, path) = file();
    let keyed = |key: &str| {
        let conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "key", key).unwrap();
        conn
    };
    let mut store = SqliteStore::from_connection(keyed("the key")).unwrap();
    claim(&mut store, 1);
    drop(store);
    let mut store = SqliteStore::from_connection(keyed("the key")).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    assert_eq!(store.entries(&s1()).unwrap().len(), 1);
    drop(store);

    let before = std::fs::read(&path).unwrap();
    for needle in [&b"workspace_chat_outbox"[..], b"text 1", b"SQLite format 3"] {
        assert!(!before.windows(needle.len()).any(|w| w == needle));
    }
    for conn in [keyed("another key"), Connection::open(&path).unwrap()] {
        match SqliteStore::from_connection(conn) {
            Err(OpenError::Corrupt { reason }) => {
                assert!(reason.contains("not a database"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(matches!(
        SqliteStore::open(&path, Settings::default()),
        Err(OpenError::Corrupt { .. })
    ));
    assert_eq!(std::fs::read(&path).unwrap(), before, "nothing was written");
}
