//! The storage conformance suite against SQLite, on a file in a temporary directory
//! and on `:memory:`, with the same expectations as the in-memory stores (ST-04).
#![allow(clippy::unwrap_used)]

use fixtures::conformance::Backend;
use outbox_core::ids::SessionId;
use storage_sqlite::{IdColumn, Settings, SqliteStore};

/// SQLite on a file in a temporary directory, where a reopen closes the connection and
/// opens the file again; or on `:memory:`, one connection for the whole case, which a
/// reopen keeps.
pub struct SqliteBackend {
    dir: Option<tempfile::TempDir>,
}

impl SqliteBackend {
    /// A file in a fresh temporary directory.
    pub fn file() -> Self {
        SqliteBackend {
            dir: Some(tempfile::tempdir().unwrap()),
        }
    }

    /// `:memory:`.
    pub fn in_memory() -> Self {
        SqliteBackend { dir: None }
    }
}

impl Backend for SqliteBackend {
    type Store = SqliteStore;
    fn open(&mut self) -> SqliteStore {
        match &self.dir {
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
