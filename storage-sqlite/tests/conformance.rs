//! The storage conformance suite against SQLite, on a file in a temporary directory
//! and on `:memory:`, with the same expectations as the in-memory stores (ST-04).
#![allow(clippy::unwrap_used)]

use fixtures::conformance::Backend;
use outbox_core::ids::SessionId;
use storage_sqlite::{Settings, SqliteStore};

/// A database file in a temporary directory; a reopen closes the connection and opens
/// the file again.
pub struct FileBackend {
    dir: tempfile::TempDir,
}

impl Default for FileBackend {
    /// A backend in a fresh temporary directory.
    fn default() -> Self {
        FileBackend {
            dir: tempfile::tempdir().unwrap(),
        }
    }
}

fn corrupt(store: &mut SqliteStore, session: &SessionId, queue: &str, op: &str) {
    store
        .connection()
        .execute(
            "INSERT INTO workspace_chat_outbox (session_id, queue_id, operation_id, position, entry_json)
             VALUES (?1, ?2, ?3, -1, '{\"queueId\": 7, \"status\": \"lost\"}')",
            rusqlite::params![session.as_str(), queue, op],
        )
        .unwrap();
}

impl Backend for FileBackend {
    type Store = SqliteStore;
    fn open(&mut self) -> SqliteStore {
        SqliteStore::open(self.dir.path().join("custody.sqlite"), Settings::default()).unwrap()
    }
    fn reopen(&mut self, store: SqliteStore) -> SqliteStore {
        drop(store);
        self.open()
    }
    fn set_revision_counter(&mut self, store: &mut SqliteStore, revision: u64) {
        store.set_revision_counter(revision).unwrap();
    }
    fn corrupt_entry(
        &mut self,
        store: &mut SqliteStore,
        session: &SessionId,
        queue: &str,
        op: &str,
    ) {
        corrupt(store, session, queue, op);
    }
}

/// `:memory:`: one connection for the whole case; a reopen keeps it.
pub struct InMemoryBackend;

impl Backend for InMemoryBackend {
    type Store = SqliteStore;
    fn open(&mut self) -> SqliteStore {
        SqliteStore::open_in_memory(Settings::default()).unwrap()
    }
    fn reopen(&mut self, store: SqliteStore) -> SqliteStore {
        store
    }
    fn set_revision_counter(&mut self, store: &mut SqliteStore, revision: u64) {
        store.set_revision_counter(revision).unwrap();
    }
    fn corrupt_entry(
        &mut self,
        store: &mut SqliteStore,
        session: &SessionId,
        queue: &str,
        op: &str,
    ) {
        corrupt(store, session, queue, op);
    }
}

mod file {
    fixtures::storage_conformance!(super::FileBackend::default());
}

mod memory {
    fixtures::storage_conformance!(super::InMemoryBackend);
}
