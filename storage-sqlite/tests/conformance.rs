//! The storage conformance suite against SQLite, on a file in a temporary directory,
//! on `:memory:`, and in an application's database opened on its own connection
//! (`SqliteStore::from_connection`), with the same expectations as the in-memory stores
//! (ST-04).
#![allow(clippy::unwrap_used)]

use fixtures::conformance::Backend;
use outbox_core::ids::SessionId;
use storage_sqlite::{IdColumn, Settings, SqliteStore};

/// SQLite on a file in a temporary directory, where a reopen closes the connection and
/// opens the file again; or on `:memory:`, one connection for the whole case, which a
/// reopen keeps.
pub struct SqliteBackend {
    dir: Option<tempfile::TempDir>,
    /// The file is an application's database, opened on the application's connection.
    app: bool,
}

impl SqliteBackend {
    /// A file in a fresh temporary directory.
    pub fn file() -> Self {
        SqliteBackend {
            dir: Some(tempfile::tempdir().unwrap()),
            app: false,
        }
    }

    /// `:memory:`.
    pub fn in_memory() -> Self {
        SqliteBackend {
            dir: None,
            app: false,
        }
    }

    /// An application's database (its own table and `user_version`, SQLite's default
    /// pragmas but a busy timeout) in a fresh temporary directory, opened on a new
    /// connection of the application each time.
    pub fn app_database() -> Self {
        SqliteBackend {
            dir: Some(tempfile::tempdir().unwrap()),
            app: true,
        }
    }
}

impl Backend for SqliteBackend {
    type Store = SqliteStore;
    fn open(&mut self) -> SqliteStore {
        match &self.dir {
            Some(dir) if self.app => {
                let conn = rusqlite::Connection::open(dir.path().join("app.sqlite")).unwrap();
                conn.busy_timeout(std::time::Duration::from_secs(5))
                    .unwrap();
                conn.execute_batch(
                    "CREATE TABLE IF NOT EXISTS notes (body TEXT); PRAGMA user_version = 42;",
                )
                .unwrap();
                SqliteStore::from_connection(conn).unwrap()
            }
            Some(dir) => {
                SqliteStore::open(dir.path().join("custody.sqlite"), Settings::default()).unwrap()
            }
            None => SqliteStore::open_in_memory(Settings::default()).unwrap(),
        }
    }
    fn reopen(&mut self, store: SqliteStore) -> SqliteStore {
        if self.dir.is_none() {
            return store;
        }
        drop(store);
        self.open()
    }
    fn set_revision_counter(&mut self, store: &mut SqliteStore, revision: u64) {
        store.set_revision_counter(revision).unwrap();
    }
    /// Stores the row with its IDs as the library stores them (`IdColumn`).
    fn corrupt_entry(
        &mut self,
        store: &mut SqliteStore,
        session: &SessionId,
        queue: &str,
        op: &str,
    ) {
        store
            .connection()
            .execute(
                "INSERT INTO workspace_chat_outbox (session_id, queue_id, operation_id, position, entry_json)
                 VALUES (?1, ?2, ?3, -1, '{\"queueId\": 7, \"status\": \"lost\"}')",
                rusqlite::params![IdColumn(session.as_str()), IdColumn(queue), IdColumn(op)],
            )
            .unwrap();
    }
}

mod file {
    fixtures::storage_conformance!(super::SqliteBackend::file());
}

mod memory {
    fixtures::storage_conformance!(super::SqliteBackend::in_memory());
}

mod app_database {
    fixtures::storage_conformance!(super::SqliteBackend::app_database());
}
