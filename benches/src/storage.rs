//! The storage workloads: the same commits for the criterion bench (`benches/storage.rs`),
//! the paired runner (`src/bin/storage_paired.rs`) and the examples, and the key shapes
//! they run with.

use std::path::Path;
use std::time::Duration;

use outbox_core::entry::{Controls, EntryStatus, MessageRequest, OutboxEntry};
use outbox_core::fingerprint::{request_fingerprint, Digest256};
use outbox_core::ids::{OperationId, QueueId, SessionId};
use outbox_core::store::OutboxStore;
use rusqlite::{params, Connection, TransactionBehavior};
use storage_sqlite::{IdColumn, Settings, SqliteStore, Synchronous, MIGRATIONS};
use timeline_core::time::Millis;

/// How the IDs of the submits look.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keys {
    /// Session `session-1`, queue `q-N`, operation `op-N`: short, and each new key lands
    /// next to the previous one in key order.
    Short,
    /// A UUID for the session, and a new UUID for each queue and operation ID, as
    /// clients send them: every new key lands at a random place in key order.
    Uuid,
}

impl Keys {
    /// The session every submit goes to.
    pub fn session(self) -> SessionId {
        SessionId::new(match self {
            Keys::Short => "session-1".to_owned(),
            Keys::Uuid => uuid_like(0, 0),
        })
        .expect("id")
    }

    /// The queue and operation ID of the `i`th submit.
    pub fn ids(self, i: u64) -> (QueueId, OperationId) {
        let (queue, op) = match self {
            Keys::Short => (format!("q-{i}"), format!("op-{i}")),
            Keys::Uuid => (uuid_like(i, 1), uuid_like(i, 2)),
        };
        (
            QueueId::new(queue).expect("id"),
            OperationId::new(op).expect("id"),
        )
    }
}

/// A canonical UUID (version 4 layout) from a mixing hash of `i` and `salt`: the same
/// keys in every run, in an order as random as real ones.
pub fn uuid_like(i: u64, salt: u64) -> String {
    let mix = |mut x: u64| {
        x ^= x >> 31;
        x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x ^ (x >> 29)
    };
    let a = mix(i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (salt << 56) ^ salt);
    let b = mix(a ^ 0x94D0_49BB_1331_11EB);
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        0x8000 | (b >> 48) & 0x3fff,
        b & 0xffff_ffff_ffff
    )
}

/// The entry of the `i`th submit: `keys`' IDs, a one-line message.
pub fn bench_entry(i: u64, keys: Keys) -> OutboxEntry {
    let (queue, op) = keys.ids(i);
    OutboxEntry::queued(
        queue,
        op,
        MessageRequest::text("run the tests again please", "composer", Millis(i)),
        Controls::automatic(),
        i as i64,
    )
}

/// Counts one more submit and returns its entry and fingerprint.
fn next_submit(i: &mut u64, keys: Keys, session: &SessionId) -> (OutboxEntry, Digest256) {
    *i += 1;
    let e = bench_entry(*i, keys);
    let fp = request_fingerprint(session, &e.queue_id, &e.request);
    (e, fp)
}

/// The library's settings at `synchronous`.
pub fn library_settings(synchronous: Synchronous) -> Settings {
    let mut settings = Settings::default();
    settings.synchronous = synchronous;
    settings
}

fn sync_name(synchronous: Synchronous) -> &'static str {
    match synchronous {
        Synchronous::Normal => "NORMAL",
        Synchronous::Full => "FULL",
    }
}

/// A plain rusqlite connection: WAL, `synchronous`, a busy timeout; with `library_pages`
/// also the library's page size and checkpoint size, otherwise SQLite's defaults.
pub fn raw_connection(path: &Path, synchronous: Synchronous, library_pages: bool) -> Connection {
    let conn = Connection::open(path).expect("open");
    if library_pages {
        conn.pragma_update(None, "page_size", storage_sqlite::DEFAULT_PAGE_SIZE)
            .expect("page size");
        conn.pragma_update(
            None,
            "wal_autocheckpoint",
            storage_sqlite::DEFAULT_WAL_AUTOCHECKPOINT_PAGES,
        )
        .expect("checkpoint");
    }
    conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get::<_, String>(0))
        .expect("wal");
    conn.pragma_update(None, "synchronous", sync_name(synchronous))
        .expect("sync");
    conn.busy_timeout(Duration::from_secs(5)).expect("busy");
    conn
}

/// (a) one `INSERT` per `IMMEDIATE` transaction into a two-column table.
pub struct RawAppend {
    conn: Connection,
    i: u64,
}

impl RawAppend {
    /// A new table in a new file.
    pub fn open(path: &Path, synchronous: Synchronous, library_pages: bool) -> RawAppend {
        let conn = raw_connection(path, synchronous, library_pages);
        conn.execute_batch("CREATE TABLE kv (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")
            .expect("table");
        RawAppend { conn, i: 0 }
    }

    /// One commit.
    pub fn commit(&mut self) {
        self.i += 1;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .expect("tx");
        tx.prepare_cached("INSERT INTO kv (k, v) VALUES (?1, ?2)")
            .expect("prepare")
            .execute(params![self.i as i64, "value"])
            .expect("insert");
        tx.commit().expect("commit");
    }
}

/// (b) the library's submit claim.
pub struct OurSubmit {
    /// The store (the criterion bench runs its ledger and overlay cases on it too).
    pub store: SqliteStore,
    keys: Keys,
    session: SessionId,
    i: u64,
}

impl OurSubmit {
    /// A new database file; submits with `keys`.
    pub fn open(path: &Path, synchronous: Synchronous, keys: Keys) -> OurSubmit {
        OurSubmit {
            store: SqliteStore::open(path, library_settings(synchronous)).expect("open"),
            keys,
            session: keys.session(),
            i: 0,
        }
    }

    /// One submit.
    pub fn commit(&mut self) {
        let (e, fp) = next_submit(&mut self.i, self.keys, &self.session);
        self.store.claim(&self.session, &fp, &e).expect("claim");
    }
}

/// The entry JSON of the hand-written submit: the fields the library stores besides the
/// columns (the bench's entries leave every optional field empty).
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct HandBody<'a> {
    request: &'a MessageRequest,
    controls: &'a Controls,
    status: EntryStatus,
    auto_drain: bool,
}

/// The entry JSON the hand-written submit stores.
pub fn hand_json(e: &OutboxEntry) -> String {
    serde_json::to_string(&HandBody {
        request: &e.request,
        controls: &e.controls,
        status: e.state.status(),
        auto_drain: e.state.auto_drain(),
    })
    .expect("json")
}

/// (e) the same two-insert submit written by hand: the library's schema and page
/// settings, the same bytes (IDs stored through [`IdColumn`], as the library does).
pub struct HandSubmit {
    conn: Connection,
    keys: Keys,
    session: SessionId,
    i: u64,
}

impl HandSubmit {
    /// A new database file with the library's schema; submits with `keys`.
    pub fn open(path: &Path, synchronous: Synchronous, keys: Keys) -> HandSubmit {
        let conn = raw_connection(path, synchronous, true);
        for (_, sql) in MIGRATIONS {
            conn.execute_batch(sql).expect("schema");
        }
        HandSubmit {
            conn,
            keys,
            session: keys.session(),
            i: 0,
        }
    }

    /// One submit.
    pub fn commit(&mut self) {
        let (e, fp) = next_submit(&mut self.i, self.keys, &self.session);
        let json = hand_json(&e);
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .expect("tx");
        tx.prepare_cached(
            "INSERT INTO workspace_chat_outbox_operation_identity
                 (session_id, operation_id, fingerprint, queue_id, removed, claimed_at)
             VALUES (?1, ?2, ?3, ?4, 0, ?5)",
        )
        .expect("prepare")
        .execute(params![
            IdColumn(self.session.as_str()),
            IdColumn(e.operation_id.as_str()),
            timeline_core::seal::unhex(fp.as_str()).expect("hex digest"),
            IdColumn(e.queue_id.as_str()),
            self.i as i64
        ])
        .expect("identity");
        tx.prepare_cached(
            "INSERT INTO workspace_chat_outbox (session_id, queue_id, operation_id, position, entry_json)
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .expect("prepare")
        .execute(params![
            IdColumn(self.session.as_str()),
            IdColumn(e.queue_id.as_str()),
            IdColumn(e.operation_id.as_str()),
            e.position,
            json
        ])
        .expect("entry");
        tx.commit().expect("commit");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The hand-written submit stores the same rows as the library, with either keys.
    #[test]
    fn hand_written_submit_stores_what_the_library_stores() {
        let dir = tempfile::tempdir().expect("dir");
        for keys in [Keys::Short, Keys::Uuid] {
            let path = |name: &str| dir.path().join(format!("{name}-{keys:?}.sqlite"));
            let mut ours = OurSubmit::open(&path("ours"), Synchronous::Normal, keys);
            let mut hand = HandSubmit::open(&path("hand"), Synchronous::Normal, keys);
            ours.commit();
            hand.commit();
            let rows = |conn: &Connection| -> String {
                conn.query_row(
                    "SELECT quote(i.session_id) || quote(i.operation_id) || quote(i.fingerprint)
                            || quote(i.queue_id) || quote(i.removed) || quote(i.claimed_at)
                            || quote(o.queue_id) || quote(o.position) || quote(o.entry_json)
                     FROM workspace_chat_outbox o
                     JOIN workspace_chat_outbox_operation_identity i
                         USING (session_id, operation_id)",
                    [],
                    |r| r.get(0),
                )
                .expect("one submit")
            };
            let stored = rows(ours.store.connection());
            assert_eq!(stored, rows(&hand.conn));
            // UUID keys are stored as bytes (quote() shows a BLOB as X'..').
            assert_eq!(stored.starts_with("X'"), keys == Keys::Uuid, "{stored}");
        }
    }

    // The UUID keys are canonical UUIDs, and different for every submit.
    #[test]
    fn uuid_keys_are_canonical_and_distinct() {
        let mut seen = std::collections::HashSet::new();
        for i in 0..10_000 {
            let (q, op) = Keys::Uuid.ids(i);
            for id in [q.as_str(), op.as_str()] {
                assert!(
                    matches!(IdColumn(id).value(), rusqlite::types::Value::Blob(_)),
                    "{id}"
                );
                assert!(seen.insert(id.to_owned()), "{id} twice");
            }
        }
    }
}
