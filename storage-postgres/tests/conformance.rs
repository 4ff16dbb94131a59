//! The shared storage conformance suite on PostgreSQL, unchanged, with the same
//! expectations as the in-memory and SQLite stores (ST-04). Each case runs in a schema
//! of its own on the test server (`support`); a reopen closes the connection and
//! connects again.
#![allow(clippy::unwrap_used)]

mod support;

use fixtures::conformance::Backend;
use outbox_core::ids::SessionId;
use storage_postgres::PostgresStore;
use support::TestDb;

/// One schema on the test server.
pub struct PostgresBackend {
    db: TestDb,
}

impl PostgresBackend {
    /// A fresh schema.
    pub fn fresh() -> Self {
        PostgresBackend {
            db: TestDb::new("conformance"),
        }
    }
}

impl Backend for PostgresBackend {
    type Store = PostgresStore;
    fn open(&mut self) -> PostgresStore {
        self.db.open()
    }
    fn reopen(&mut self, store: PostgresStore) -> PostgresStore {
        drop(store);
        self.open()
    }
    fn set_revision_counter(&mut self, store: &mut PostgresStore, revision: u64) {
        store.set_revision_counter(revision).unwrap();
    }
    /// Stores the row with its IDs as the library stores them (their UTF-8 bytes), on a
    /// connection of its own.
    fn corrupt_entry(
        &mut self,
        _store: &mut PostgresStore,
        session: &SessionId,
        queue: &str,
        op: &str,
    ) {
        self.db
            .client()
            .execute(
                "INSERT INTO workspace_chat_outbox (session_id, queue_id, operation_id, position, entry_json)
                 VALUES ($1, $2, $3, -1, '{\"queueId\": 7, \"status\": \"lost\"}')",
                &[&session.as_str().as_bytes(), &queue.as_bytes(), &op.as_bytes()],
            )
            .unwrap();
    }
}

mod postgres_schema {
    fixtures::storage_conformance!(super::PostgresBackend::fresh());
}
