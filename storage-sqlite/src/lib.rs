//! # storage-sqlite
//!
//! The durable backend: every storage trait of the core crates on one SQLite file
//! (ST-01 to ST-04), through rusqlite with the bundled SQLite, so a fresh machine needs
//! no system library.
//!
//! - One [`SqliteStore`] per connection. It implements
//!   [`overlay_core::store::OverlayStore`], [`overlay_core::store::CleanupJournal`] and
//!   [`outbox_core::store::OutboxStore`] with the seed's tables.
//! - Every connection sets WAL (for files), `foreign_keys`, an explicit `busy_timeout`,
//!   the chosen `synchronous` level and WAL checkpoint size, outside the migrations. A
//!   file this library creates gets 2 KiB pages ([`DEFAULT_PAGE_SIZE`]).
//! - Every write is one `IMMEDIATE` transaction, so each multi-record rule of the
//!   catalog (the submit claim, the overlay compare-and-set with the global revision,
//!   the session-message route with its entry, ledger-sent then removal across aliases)
//!   commits whole or not at all. Hot statements use `prepare_cached`.
//! - Numbered migrations in `migrations/*.sql`, tracked in `PRAGMA user_version`. A
//!   version that does not match the file's tables fails with the stored version and
//!   the versions this build knows ([`OpenError::Migration`]).
//! - Nothing read from the file is trusted: every column value is checked like wire
//!   input (its SQLite type, an integer's range, a boolean's 0 or 1, an overlay row's
//!   JSON against its key columns, a ledger status against its JSON). An outbox row that does not read
//!   back shows as a blocked entry with what it holds and never hides its neighbours
//!   (OB-05); any other unreadable record is a `Corrupt` error naming the table, the
//!   column and the stored value.
//!
//! # What a submit writes
//!
//! A submit inserts one identity row and one outbox row in one transaction, and every
//! page the transaction changes is one WAL frame written (and, with
//! [`Synchronous::Full`], synced) at commit. Schema version 3 keeps that count low: the
//! outbox is a rowid table, so its few-hundred-byte row is appended at the table's end
//! and only a small index entry lands inside the (session, queue) key order; the
//! identity keeps the fingerprint as its 32 digest bytes; the entry JSON leaves out the
//! queue ID, operation ID and position, which the row's columns hold. New files get
//! 2 KiB pages and the WAL is checkpointed every 8192 pages (16 MiB): both are
//! [`Settings`]. Version 4 stores a session, queue or operation ID that ends in a
//! canonical UUID, as client IDs do, in 16 bytes instead of 36 characters
//! ([`IdColumn`]; every other ID stays text and all read back exactly): the identity
//! table keeps a row for every operation ever claimed, in random key order, so smaller
//! keys mean fewer pages changed per submit and fewer copied per checkpoint.
//! `benches/README.md` has the measurements.
//!
//! # What an overlay write writes
//!
//! Since schema version 5 a target's overlay is a header row (revision, settlement
//! epoch) in `chat_live_timeline_overlays` and one row per overlay row in
//! `chat_live_timeline_overlay_rows`, keyed by (session, target, block type, block ID).
//! [`OverlayStore::update`] applies its change to the target's indexed rows
//! ([`overlay_core::store::OverlayRows`]) and writes, in one `IMMEDIATE` transaction, the
//! counter, the header and only the rows the change inserted, replaced or removed: a
//! write costs O(k log n) for k changed rows of an n-row overlay, not a re-serialized
//! snapshot. Each connection keeps the rows of the last [`OVERLAY_CACHE_TARGETS`]
//! targets it read or wrote, each with the revision and epoch it was read at; a write
//! uses them only when the header, read in the same transaction, still holds that
//! revision and epoch (no revision is handed out twice, so then no connection wrote the
//! target since), and reads the rows from the table otherwise. A version-4 snapshot that
//! does not split into rows (not JSON, a key twice) stays as it was and reads as
//! `Corrupt`, as before. A delete keeps the target's settlement epoch in
//! `chat_live_timeline_overlay_deleted_epochs` (schema 6) until the target's next first
//! write, which stores a higher epoch ([`overlay_core::store::created_epoch`]).
//!
//! # Durability
//!
//! [`Synchronous::Full`] is the default: an acknowledged write (a receipt returned, a
//! ledger row stored) survives a process kill and a power loss. [`Synchronous::Normal`]
//! in WAL mode is faster and still survives a process kill at any point, but the last
//! commits before a power loss or OS crash may be lost. Choose it with
//! [`Settings::synchronous`].
//!
//! ```
//! use outbox_core::store::OutboxStore;
//! use storage_sqlite::{Settings, SqliteStore};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let mut store = SqliteStore::open(dir.path().join("custody.sqlite"), Settings::default()).unwrap();
//! assert_eq!(store.schema_version().unwrap(), storage_sqlite::SCHEMA_VERSION);
//! assert!(store.outbox_sessions().unwrap().is_empty());
//! ```

use std::path::Path;
use std::time::Duration;

use outbox_core::entry::{
    Acceptance, BlockedEntry, Controls, EntryStatus, HandoffRef, MessageRequest, OutboxEntry,
    SessionMessageOrigin, StateWire, StoredEntry,
};
use outbox_core::fingerprint::Digest256;
use outbox_core::ids::{CallId, OperationId, QueueId, RunId, SessionId, ThreadId};
use outbox_core::ledger::{LedgerRecord, LedgerStatus};
use outbox_core::store::{
    Claim, Identity, OutboxStore, RouteClaim, RouteDelivery, SessionMessageRoute,
    StoreError as OutboxError,
};
use overlay_core::overlay::{apply, Change};
use overlay_core::store::{
    created_epoch, next_epoch, CleanupJournal, OverlayRows, OverlayStore, Snapshot,
    StoreError as OverlayError, StoredBlock, StoredOverlay, Update, FORMAT_VERSION,
};
use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};
use timeline_core::key::TargetId;
use timeline_core::policy::MAX_EXACT_INTEGER;
use timeline_core::time::Millis;

mod columns;
mod id_column;
use columns::{Column, Refused};
pub use id_column::{read_id, IdColumn};

/// The migrations, in order; version N is `MIGRATIONS[N - 1]`.
pub const MIGRATIONS: [(&str, &str); 6] = [
    (
        "0001_initial",
        include_str!("../migrations/0001_initial.sql"),
    ),
    (
        "0002_identity_claim_time",
        include_str!("../migrations/0002_identity_claim_time.sql"),
    ),
    (
        "0003_compact_submit_rows",
        include_str!("../migrations/0003_compact_submit_rows.sql"),
    ),
    (
        "0004_uuid_ids_as_bytes",
        include_str!("../migrations/0004_uuid_ids_as_bytes.sql"),
    ),
    (
        "0005_overlay_rows",
        include_str!("../migrations/0005_overlay_rows.sql"),
    ),
    (
        "0006_deleted_overlay_epochs",
        include_str!("../migrations/0006_deleted_overlay_epochs.sql"),
    ),
];
/// The schema version this build writes.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// SQLite's `synchronous` level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Synchronous {
    /// Survives a process kill at any point; a power loss may lose the last commits.
    Normal,
    /// Survives a process kill and a power loss.
    Full,
}

/// The page size a new file gets unless [`Settings::page_size`] says otherwise.
///
/// 2 KiB rather than SQLite's 4 KiB: a submit changes about five pages (a leaf in each
/// of three B-trees, and now and then the pages a split touches), and every changed page
/// is one WAL frame written at commit, so smaller pages halve the bytes each commit
/// writes (`benches/README.md` has the figures).
pub const DEFAULT_PAGE_SIZE: u32 = 2048;

/// The WAL size, in pages, at which a commit checkpoints automatically unless
/// [`Settings::wal_autocheckpoint_pages`] says otherwise: 8192 pages of 2 KiB, a 16 MiB
/// WAL (SQLite's default is 1000 pages).
pub const DEFAULT_WAL_AUTOCHECKPOINT_PAGES: u32 = 8192;

/// Per-connection settings.
///
/// Start from [`Settings::default`] and change fields:
///
/// ```
/// use storage_sqlite::{Settings, Synchronous};
///
/// let mut settings = Settings::default();
/// settings.synchronous = Synchronous::Normal;
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Settings {
    /// The `synchronous` level (default [`Synchronous::Full`]).
    pub synchronous: Synchronous,
    /// How long a writer waits for another connection's lock (default 5 s).
    pub busy_timeout: Duration,
    /// The page size of a file this library creates: a power of two from 512 to 65536
    /// (default [`DEFAULT_PAGE_SIZE`]). An existing file keeps the page size it was
    /// created with; SQLite cannot change it in WAL mode.
    pub page_size: u32,
    /// Checkpoint the WAL into the database once it holds this many pages (default
    /// [`DEFAULT_WAL_AUTOCHECKPOINT_PAGES`]). A checkpoint writes each page changed since
    /// the last one once, and with [`Synchronous::Normal`] it is the only moment the
    /// files are synced, so a larger WAL means fewer, cheaper checkpoints per commit.
    /// With [`Synchronous::Full`], commits after opening are slower until the WAL file
    /// has grown to this size once (each sync then also records its new length; about
    /// the first 1,700 submits with the default), so a host that reopens often may want
    /// a smaller value. 0 turns automatic checkpoints off: the WAL then grows until the
    /// host runs `PRAGMA wal_checkpoint` itself.
    pub wal_autocheckpoint_pages: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            synchronous: Synchronous::Full,
            busy_timeout: Duration::from_secs(5),
            page_size: DEFAULT_PAGE_SIZE,
            wal_autocheckpoint_pages: DEFAULT_WAL_AUTOCHECKPOINT_PAGES,
        }
    }
}

/// Why a database could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// SQLite refused.
    #[error("cannot open the database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The file was written by a newer schema.
    #[error("the database has schema version {found}, newer than {supported}")]
    NewerSchema {
        /// What the file says.
        found: u32,
        /// What this build knows.
        supported: u32,
    },
    /// The file's `user_version` is not a schema version this build knows (it is
    /// negative or out of range).
    #[error(
        "the database says schema version {found}; this build knows versions 0 to {supported}"
    )]
    UnknownSchema {
        /// What the file says.
        found: i64,
        /// The newest version this build knows.
        supported: u32,
    },
    /// A migration did not apply to the file: its `user_version` does not match the
    /// tables it holds. Nothing of that migration was written.
    #[error(
        "the database says schema version {found}, but migration {migration} does not apply to it \
         ({reason}); this build knows versions 0 to {supported}"
    )]
    Migration {
        /// What the file says.
        found: u32,
        /// The migration that failed, by name.
        migration: &'static str,
        /// SQLite's message, without the migration's text.
        reason: String,
        /// The newest version this build knows.
        supported: u32,
    },
    /// A setting SQLite would ignore or refuse.
    #[error("invalid setting {name}: {reason}")]
    InvalidSetting {
        /// The field of [`Settings`].
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

/// One connection to the custody database. See the crate docs.
#[derive(Debug)]
pub struct SqliteStore {
    conn: Connection,
    /// Overlays this connection read or wrote (see [`OverlayCache`]).
    overlays: OverlayCache,
}

fn configure(conn: &Connection, settings: &Settings, file: bool) -> Result<(), OpenError> {
    let size = settings.page_size;
    if !(512..=65536).contains(&size) || !size.is_power_of_two() {
        return Err(OpenError::InvalidSetting {
            name: "page_size",
            reason: format!("{size} is not a power of two from 512 to 65536"),
        });
    }
    // Before WAL: a new file takes the page size at its first write; an existing one
    // keeps its own.
    conn.pragma_update(None, "page_size", size)?;
    if file {
        // WAL lets readers and one writer work at once; it is a property of the file.
        let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
        debug_assert_eq!(mode.to_lowercase(), "wal");
    }
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.busy_timeout(settings.busy_timeout)?;
    let sync = match settings.synchronous {
        Synchronous::Normal => "NORMAL",
        Synchronous::Full => "FULL",
    };
    conn.pragma_update(None, "synchronous", sync)?;
    conn.pragma_update(
        None,
        "wal_autocheckpoint",
        settings.wal_autocheckpoint_pages,
    )?;
    Ok(())
}

fn user_version(conn: &Connection) -> rusqlite::Result<u32> {
    conn.query_row("PRAGMA user_version", [], |r| r.get(0))
}

/// The file's `user_version` as a version this build can migrate from.
fn known_version(conn: &Connection) -> Result<u32, OpenError> {
    // SQLite keeps a signed 32-bit number; read it whole so a negative one is named.
    let found: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let unknown = || OpenError::UnknownSchema {
        found,
        supported: SCHEMA_VERSION,
    };
    let version = u32::try_from(found).map_err(|_| unknown())?;
    if version > SCHEMA_VERSION {
        return Err(OpenError::NewerSchema {
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    Ok(version)
}

/// SQLite's message for a failed migration, without the SQL text rusqlite attaches to
/// an error in a statement (the whole migration file).
fn migration_reason(e: &rusqlite::Error) -> String {
    match e {
        rusqlite::Error::SqlInputError { msg, .. } => msg.clone(),
        rusqlite::Error::SqliteFailure(_, Some(msg)) => msg.clone(),
        other => other.to_string(),
    }
}

/// Applies migrations up to `target`, each in its own immediate transaction.
fn migrate(conn: &mut Connection, target: u32) -> Result<u32, OpenError> {
    let found = known_version(conn)?;
    for (version, (name, sql)) in (1..=target.min(SCHEMA_VERSION))
        .zip(MIGRATIONS)
        .skip(found as usize)
    {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute_batch(sql).map_err(|e| OpenError::Migration {
            found,
            migration: name,
            reason: migration_reason(&e),
            supported: SCHEMA_VERSION,
        })?;
        tx.pragma_update(None, "user_version", version)?;
        tx.commit()?;
    }
    known_version(conn)
}

impl SqliteStore {
    /// Opens (or creates) the database file and migrates it to [`SCHEMA_VERSION`].
    pub fn open(path: impl AsRef<Path>, settings: Settings) -> Result<Self, OpenError> {
        Self::open_at(path, settings, SCHEMA_VERSION)
    }

    /// Opens the file migrated only up to `version` (to write databases of an older
    /// schema in tests of the upgrade path).
    #[doc(hidden)]
    pub fn open_at(
        path: impl AsRef<Path>,
        settings: Settings,
        version: u32,
    ) -> Result<Self, OpenError> {
        let mut conn = Connection::open(path)?;
        configure(&conn, &settings, true)?;
        migrate(&mut conn, version)?;
        Ok(SqliteStore {
            conn,
            overlays: OverlayCache::default(),
        })
    }

    /// A private in-memory database (`:memory:`), migrated.
    pub fn open_in_memory(settings: Settings) -> Result<Self, OpenError> {
        let mut conn = Connection::open_in_memory()?;
        configure(&conn, &settings, false)?;
        migrate(&mut conn, SCHEMA_VERSION)?;
        Ok(SqliteStore {
            conn,
            overlays: OverlayCache::default(),
        })
    }

    /// The schema version of the file.
    pub fn schema_version(&self) -> rusqlite::Result<u32> {
        user_version(&self.conn)
    }

    /// The connection (for inspection in tests and tools).
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// Sets the global revision counter (to test the 2^53 - 1 cap).
    #[doc(hidden)]
    pub fn set_revision_counter(&mut self, revision: u64) -> rusqlite::Result<()> {
        // `u64` as a parameter is refused above `i64::MAX`, never wrapped.
        self.conn.execute(
            "UPDATE chat_live_timeline_overlay_revisions SET revision = ?1 WHERE id = 1",
            params![revision],
        )?;
        Ok(())
    }

    fn write(&mut self) -> rusqlite::Result<Transaction<'_>> {
        self.conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
    }

    /// Runs one write statement in its own `IMMEDIATE` transaction; the rows it changed.
    fn write_one(&mut self, sql: &str, params: impl rusqlite::Params) -> rusqlite::Result<usize> {
        let tx = self.write()?;
        let changed = tx.prepare_cached(sql)?.execute(params)?;
        tx.commit()?;
        Ok(changed)
    }
}

// ----- error mapping ---------------------------------------------------------------------

fn ov(e: rusqlite::Error) -> OverlayError {
    OverlayError::Unavailable(e.to_string())
}

fn ob(e: rusqlite::Error) -> OutboxError {
    OutboxError::backend(e)
}

/// The error for a stored `what` that does not read back, for `map_err`.
fn corrupt(what: impl Into<String>) -> impl FnOnce(String) -> OutboxError {
    move |reason| OutboxError::Corrupt {
        what: what.into(),
        reason,
    }
}

/// The same for overlay storage.
fn overlay_corrupt(what: impl Into<String>) -> impl FnOnce(String) -> OverlayError {
    move |reason| OverlayError::Corrupt {
        what: what.into(),
        reason,
    }
}

/// A refused column value as the outbox's typed error about `what`, for `map_err`.
fn refused(what: impl Into<String>) -> impl FnOnce(Refused) -> OutboxError {
    move |r| corrupt(what)(r.to_string())
}

/// The same for overlay storage.
fn overlay_refused(what: impl Into<String>) -> impl FnOnce(Refused) -> OverlayError {
    move |r| overlay_corrupt(what)(r.to_string())
}

fn to_json<T: serde::Serialize>(v: &T) -> Result<String, String> {
    serde_json::to_string(v).map_err(|e| e.to_string())
}

fn id<T>(what: &'static str, v: Result<T, timeline_core::key::KeyError>) -> Result<T, OutboxError> {
    v.map_err(|e| corrupt(what)(e.to_string()))
}

/// An ID column as read by [`read_id`], made into its type.
fn stored_id<T>(
    what: &'static str,
    read: Result<String, String>,
    make: impl FnOnce(String) -> Result<T, timeline_core::key::KeyError>,
) -> Result<T, OutboxError> {
    id(what, make(read.map_err(corrupt(what))?))
}

// ----- overlays --------------------------------------------------------------------------
//
// Since schema version 5 a target's overlay is a header row in chat_live_timeline_overlays
// (revision, epoch) and one row per overlay row in chat_live_timeline_overlay_rows. A
// write applies its change to the target's indexed rows and writes only the rows that
// changed, so it costs O(k log n) for k changed rows. The rows come from the cache of
// this connection when the header still holds the revision and epoch they were read
// at, and from the table otherwise. Since schema version 6 a delete records the target's
// epoch in chat_live_timeline_overlay_deleted_epochs, and the target's next first write
// takes it (one higher) and removes the record, in its own transaction.

const OVERLAYS: &str = "chat_live_timeline_overlays";
const OVERLAY_TARGET: Column = Column::new(OVERLAYS, "timeline_target_id");
const OVERLAY_REVISION: Column = Column::new(OVERLAYS, "revision");
const OVERLAY_EPOCH: Column = Column::new(OVERLAYS, "settlement_epoch");
const OVERLAY_SNAPSHOT: Column = Column::new(OVERLAYS, "snapshot_json");
const ROWS: &str = "chat_live_timeline_overlay_rows";
const ROW_TYPE: Column = Column::new(ROWS, "block_type");
const ROW_ID: Column = Column::new(ROWS, "block_id");
const ROW_JSON: Column = Column::new(ROWS, "row_json");
const COUNTER: Column = Column::new("chat_live_timeline_overlay_revisions", "revision");
const DELETED_EPOCH: Column = Column::new(
    "chat_live_timeline_overlay_deleted_epochs",
    "settlement_epoch",
);
const CLEANUPS: &str = "chat_pending_terminal_overlay_cleanups";
const CLEANUP_SESSION: Column = Column::new(CLEANUPS, "app_session_id");
const CLEANUP_RUN: Column = Column::new(CLEANUPS, "run_id");

/// Targets whose rows a connection keeps in memory. A target past this count pushes out
/// the one used longest ago; its next write reads its rows from the table again.
pub const OVERLAY_CACHE_TARGETS: usize = 64;

/// The overlays a connection read or wrote last, by target, each at the revision and
/// epoch it was read or written at.
///
/// An entry is used only inside a transaction that read the same revision and epoch
/// from the target's header row: the global counter never hands out a revision twice
/// (OV-02), so then no connection has written the target since. An entry changes only
/// after its write committed; a failed or refused write leaves the entry of the version
/// the file still holds.
#[derive(Default)]
struct OverlayCache {
    entries: std::collections::HashMap<(SessionId, TargetId), (Snapshot, u64)>,
    clock: u64,
}

impl OverlayCache {
    /// The rows of the target if the cached version is `revision` and `epoch`.
    fn rows(
        &mut self,
        session: &SessionId,
        target: &TargetId,
        revision: u64,
        epoch: u64,
    ) -> Option<OverlayRows> {
        self.clock += 1;
        let (snapshot, used) = self.entries.get_mut(&(session.clone(), target.clone()))?;
        if (snapshot.revision, snapshot.settlement_epoch) != (revision, epoch) {
            return None;
        }
        *used = self.clock;
        Some(snapshot.rows().clone())
    }

    fn put(&mut self, session: &SessionId, target: &TargetId, snapshot: Snapshot) {
        self.clock += 1;
        let k = (session.clone(), target.clone());
        if self.entries.len() >= OVERLAY_CACHE_TARGETS && !self.entries.contains_key(&k) {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                self.entries.remove(&oldest);
            }
        }
        self.entries.insert(k, (snapshot, self.clock));
    }

    fn forget(&mut self, session: &SessionId, target: &TargetId) {
        self.entries.remove(&(session.clone(), target.clone()));
    }
}

impl std::fmt::Debug for OverlayCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OverlayCache")
            .field("targets", &self.entries.len())
            .finish()
    }
}

/// A target's header row.
struct Header {
    revision: u64,
    epoch: u64,
    /// A version-4 snapshot that did not split into rows (see migration 5).
    legacy: Option<String>,
}

/// A target's overlay as one transaction read it.
struct Current {
    revision: u64,
    epoch: u64,
    rows: OverlayRows,
    /// The rows came from a version-4 snapshot: the next write rewrites them as rows.
    legacy: bool,
}

impl Current {
    fn into_stored(self) -> StoredOverlay {
        StoredOverlay {
            format_version: FORMAT_VERSION,
            settlement_epoch: self.epoch,
            revision: self.revision,
            blocks: self.rows.to_blocks(),
        }
    }
}

fn what(session: &SessionId, target: &TargetId) -> String {
    format!("overlay {session}/{target}")
}

fn read_header(
    conn: &Connection,
    session: &SessionId,
    target: &TargetId,
) -> Result<Option<Header>, OverlayError> {
    use rusqlite::types::Value;
    let row: Option<(Value, Value, Value)> = conn
        .prepare_cached(
            "SELECT revision, settlement_epoch, snapshot_json FROM chat_live_timeline_overlays
             WHERE app_session_id = ?1 AND timeline_target_id = ?2",
        )
        .map_err(ov)?
        .query_row(params![session.as_str(), target.as_str()], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .optional()
        .map_err(ov)?;
    let Some((revision, epoch, legacy)) = row else {
        return Ok(None);
    };
    let refused = || overlay_refused(what(session, target));
    Ok(Some(Header {
        revision: columns::exact(OVERLAY_REVISION, (&revision).into()).map_err(refused())?,
        epoch: columns::exact(OVERLAY_EPOCH, (&epoch).into()).map_err(refused())?,
        legacy: columns::optional_text(OVERLAY_SNAPSHOT, (&legacy).into()).map_err(refused())?,
    }))
}

/// The rows of a version-4 snapshot, checked as version 4 checked them.
fn legacy_rows(
    json: &str,
    session: &SessionId,
    target: &TargetId,
) -> Result<OverlayRows, OverlayError> {
    let blocks: Vec<StoredBlock> = serde_json::from_str(json)
        .map_err(|e| overlay_corrupt(what(session, target))(e.to_string()))?;
    OverlayRows::from_blocks(blocks).map_err(|key| {
        overlay_corrupt(what(session, target))(format!(
            "{OVERLAY_SNAPSHOT} holds two blocks with the key {} {:?}",
            key.block_type,
            key.id.as_str()
        ))
    })
}

/// Every row of a target from the rows table, each checked: its columns of the right
/// type, its JSON a stored block whose key is the row's key.
fn read_rows(
    conn: &Connection,
    session: &SessionId,
    target: &TargetId,
) -> Result<OverlayRows, OverlayError> {
    use rusqlite::types::Value;
    let mut stmt = conn
        .prepare_cached(
            "SELECT block_type, block_id, row_json FROM chat_live_timeline_overlay_rows
             WHERE app_session_id = ?1 AND timeline_target_id = ?2",
        )
        .map_err(ov)?;
    let found = stmt
        .query_map(params![session.as_str(), target.as_str()], |r| {
            Ok((
                r.get::<_, Value>(0)?,
                r.get::<_, Value>(1)?,
                r.get::<_, Value>(2)?,
            ))
        })
        .map_err(ov)?;
    let mut blocks = Vec::new();
    for row in found {
        let (block_type, id, json) = row.map_err(ov)?;
        let refused = || overlay_refused(what(session, target));
        let block_type = columns::text(ROW_TYPE, (&block_type).into()).map_err(refused())?;
        let id = columns::text(ROW_ID, (&id).into()).map_err(refused())?;
        let json = columns::text(ROW_JSON, (&json).into()).map_err(refused())?;
        let block: StoredBlock = serde_json::from_str(&json).map_err(|e| {
            overlay_corrupt(what(session, target))(format!(
                "{ROW_JSON} of the row {block_type} {id:?}: {e}"
            ))
        })?;
        if block.block.block_type.as_str() != block_type || block.block.id.as_str() != id {
            return Err(overlay_corrupt(what(session, target))(format!(
                "{ROW_JSON} holds the key {} {:?} in the row {block_type} {id:?}",
                block.block.block_type,
                block.block.id.as_str()
            )));
        }
        blocks.push(block);
    }
    // The unique key and the check above keep one row per key (OV-01).
    OverlayRows::from_blocks(blocks).map_err(|key| {
        overlay_corrupt(what(session, target))(format!("{ROWS} holds the key {key} twice"))
    })
}

/// The target's overlay inside `conn`'s transaction: from `cache` when it holds the
/// header's revision and epoch, else from the file (and then cached).
fn read_overlay(
    conn: &Connection,
    cache: &mut OverlayCache,
    session: &SessionId,
    target: &TargetId,
) -> Result<Option<Current>, OverlayError> {
    let Some(header) = read_header(conn, session, target)? else {
        cache.forget(session, target);
        return Ok(None);
    };
    let (rows, legacy) = match &header.legacy {
        Some(json) => (legacy_rows(json, session, target)?, true),
        None => match cache.rows(session, target, header.revision, header.epoch) {
            Some(rows) => (rows, false),
            None => {
                let rows = read_rows(conn, session, target)?;
                let snapshot = Snapshot::new(header.revision, header.epoch, rows.clone());
                cache.put(session, target, snapshot);
                (rows, false)
            }
        },
    };
    Ok(Some(Current {
        revision: header.revision,
        epoch: header.epoch,
        rows,
        legacy,
    }))
}

/// The stored revision of a target, if it has a row.
fn stored_revision(
    conn: &Connection,
    session: &SessionId,
    target: &TargetId,
) -> Result<Option<u64>, OverlayError> {
    target_integer(
        conn,
        "SELECT revision FROM chat_live_timeline_overlays
         WHERE app_session_id = ?1 AND timeline_target_id = ?2",
        OVERLAY_REVISION,
        session,
        target,
    )
}

/// The epoch a deleted target had, if it was deleted and not written since (schema 6).
fn deleted_epoch(
    conn: &Connection,
    session: &SessionId,
    target: &TargetId,
) -> Result<Option<u64>, OverlayError> {
    target_integer(
        conn,
        "SELECT settlement_epoch FROM chat_live_timeline_overlay_deleted_epochs
         WHERE app_session_id = ?1 AND timeline_target_id = ?2",
        DELETED_EPOCH,
        session,
        target,
    )
}

/// One exact integer column of a target's row (`sql` selects it by session and target),
/// checked like wire input; `None` when there is no row.
fn target_integer(
    conn: &Connection,
    sql: &str,
    column: Column,
    session: &SessionId,
    target: &TargetId,
) -> Result<Option<u64>, OverlayError> {
    let value: Option<rusqlite::types::Value> = conn
        .prepare_cached(sql)
        .map_err(ov)?
        .query_row(params![session.as_str(), target.as_str()], |r| r.get(0))
        .optional()
        .map_err(ov)?;
    value
        .map(|v| {
            columns::exact(column, (&v).into()).map_err(overlay_refused(what(session, target)))
        })
        .transpose()
}

/// The epoch a target's first write stores, inside `tx`: `asked`, raised above the
/// epoch the target was deleted at ([`overlay_core::store::created_epoch`]). The record
/// of that epoch is removed in the same transaction, as the target now holds it.
fn first_epoch(
    tx: &Transaction<'_>,
    session: &SessionId,
    target: &TargetId,
    asked: u64,
) -> Result<u64, OverlayError> {
    let Some(deleted) = deleted_epoch(tx, session, target)? else {
        return Ok(asked);
    };
    tx.prepare_cached(
        "DELETE FROM chat_live_timeline_overlay_deleted_epochs
         WHERE app_session_id = ?1 AND timeline_target_id = ?2",
    )
    .map_err(ov)?
    .execute(params![session.as_str(), target.as_str()])
    .map_err(ov)?;
    Ok(created_epoch(asked, Some(deleted)))
}

/// The global revision counter (OV-02). A missing row or a value outside 0 to 2^53 - 1
/// is [`OverlayError::Corrupt`]: no revision can be handed out from it.
fn read_counter(conn: &Connection) -> Result<u64, OverlayError> {
    let what = "overlay revision counter";
    let counter: Option<rusqlite::types::Value> = conn
        .prepare_cached("SELECT revision FROM chat_live_timeline_overlay_revisions WHERE id = 1")
        .map_err(ov)?
        .query_row([], |r| r.get(0))
        .optional()
        .map_err(ov)?;
    let counter = counter.ok_or_else(|| {
        overlay_corrupt(what)("chat_live_timeline_overlay_revisions has no row with id 1".into())
    })?;
    columns::exact(COUNTER, (&counter).into()).map_err(overlay_refused(what))
}

/// Takes the next revision from the counter, inside `tx`. `previous` is the target's
/// stored revision: a counter below it would hand out a revision again (OV-02), so it
/// is refused as corrupt.
fn take_revision(
    tx: &Transaction<'_>,
    session: &SessionId,
    target: &TargetId,
    previous: Option<u64>,
) -> Result<u64, OverlayError> {
    let counter = read_counter(tx)?;
    if let Some(previous) = previous.filter(|&p| p > counter) {
        return Err(overlay_corrupt("overlay revision counter")(format!(
            "{COUNTER} holds INTEGER {counter}, below the revision {previous} of overlay \
             {session}/{target}"
        )));
    }
    if counter >= MAX_EXACT_INTEGER {
        return Err(OverlayError::RevisionExhausted);
    }
    let revision = counter + 1;
    tx.prepare_cached("UPDATE chat_live_timeline_overlay_revisions SET revision = ?1 WHERE id = 1")
        .map_err(ov)?
        .execute(params![revision as i64])
        .map_err(ov)?;
    Ok(revision)
}

/// Stores the target's header: its revision and epoch, and no version-4 snapshot.
fn write_header(
    tx: &Transaction<'_>,
    session: &SessionId,
    target: &TargetId,
    revision: u64,
    epoch: u64,
) -> Result<(), OverlayError> {
    tx.prepare_cached(
        "INSERT INTO chat_live_timeline_overlays
             (app_session_id, timeline_target_id, revision, settlement_epoch, snapshot_json)
         VALUES (?1, ?2, ?3, ?4, NULL)
         ON CONFLICT (app_session_id, timeline_target_id) DO UPDATE SET
             revision = excluded.revision,
             settlement_epoch = excluded.settlement_epoch,
             snapshot_json = NULL",
    )
    .map_err(ov)?
    .execute(params![
        session.as_str(),
        target.as_str(),
        revision as i64,
        epoch as i64
    ])
    .map_err(ov)?;
    Ok(())
}

/// Inserts or replaces one row.
fn put_row(
    tx: &Transaction<'_>,
    session: &SessionId,
    target: &TargetId,
    row: &StoredBlock,
) -> Result<(), OverlayError> {
    let json = to_json(row).map_err(overlay_corrupt("overlay row"))?;
    tx.prepare_cached(
        "INSERT INTO chat_live_timeline_overlay_rows
             (app_session_id, timeline_target_id, block_type, block_id, row_json)
         VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (app_session_id, timeline_target_id, block_type, block_id)
         DO UPDATE SET row_json = excluded.row_json",
    )
    .map_err(ov)?
    .execute(params![
        session.as_str(),
        target.as_str(),
        row.block.block_type.as_str(),
        row.block.id.as_str(),
        json
    ])
    .map_err(ov)?;
    Ok(())
}

/// Writes what one change changed: its removals and its upserts, nothing else.
fn write_changes(
    tx: &Transaction<'_>,
    session: &SessionId,
    target: &TargetId,
    changes: &overlay_core::store::Changes,
) -> Result<(), OverlayError> {
    for key in &changes.removals {
        tx.prepare_cached(
            "DELETE FROM chat_live_timeline_overlay_rows
             WHERE app_session_id = ?1 AND timeline_target_id = ?2
               AND block_type = ?3 AND block_id = ?4",
        )
        .map_err(ov)?
        .execute(params![
            session.as_str(),
            target.as_str(),
            key.block_type.as_str(),
            key.id.as_str()
        ])
        .map_err(ov)?;
    }
    for row in &changes.upserts {
        put_row(tx, session, target, row)?;
    }
    Ok(())
}

/// Replaces every row of the target with `rows` (a whole-overlay write, a new target,
/// or a version-4 snapshot's first write as rows).
fn replace_rows(
    tx: &Transaction<'_>,
    session: &SessionId,
    target: &TargetId,
    rows: &OverlayRows,
) -> Result<(), OverlayError> {
    delete_rows(tx, session, target)?;
    for row in rows.iter() {
        put_row(tx, session, target, row)?;
    }
    Ok(())
}

fn delete_rows(
    tx: &Transaction<'_>,
    session: &SessionId,
    target: &TargetId,
) -> Result<usize, OverlayError> {
    tx.prepare_cached(
        "DELETE FROM chat_live_timeline_overlay_rows
         WHERE app_session_id = ?1 AND timeline_target_id = ?2",
    )
    .map_err(ov)?
    .execute(params![session.as_str(), target.as_str()])
    .map_err(ov)
}

impl OverlayStore for SqliteStore {
    fn load(
        &mut self,
        session: &SessionId,
        target: &TargetId,
    ) -> Result<Option<StoredOverlay>, OverlayError> {
        // One read transaction, so the header and the rows are one version.
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Deferred)
            .map_err(ov)?;
        let current = read_overlay(&tx, &mut self.overlays, session, target)?;
        tx.commit().map_err(ov)?;
        Ok(current.map(Current::into_stored))
    }

    fn compare_and_set(
        &mut self,
        session: &SessionId,
        target: &TargetId,
        expected: Option<u64>,
        epoch: u64,
        blocks: Vec<StoredBlock>,
    ) -> Result<StoredOverlay, OverlayError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(ov)?;
        if stored_revision(&tx, session, target)? != expected {
            let now = read_overlay(&tx, &mut self.overlays, session, target)?;
            return Err(OverlayError::Stale {
                current: now.map(|c| Box::new(c.into_stored())),
            });
        }
        let rows =
            OverlayRows::from_blocks(blocks).map_err(|key| OverlayError::DuplicateKey { key })?;
        let epoch = match expected {
            Some(_) => epoch,
            None => first_epoch(&tx, session, target, epoch)?,
        };
        let revision = take_revision(&tx, session, target, expected)?;
        replace_rows(&tx, session, target, &rows)?;
        write_header(&tx, session, target, revision, epoch)?;
        tx.commit().map_err(ov)?;
        let stored = Snapshot::new(revision, epoch, rows);
        let whole = stored.to_stored();
        self.overlays.put(session, target, stored);
        Ok(whole)
    }

    fn update(
        &mut self,
        session: &SessionId,
        target: &TargetId,
        change: &Change,
    ) -> Result<Update, OverlayError> {
        // One immediate transaction: read, apply, write. Another connection waits
        // (busy_timeout) instead of racing, so no writer starves.
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(ov)?;
        let current = read_overlay(&tx, &mut self.overlays, session, target)?;
        let rows = current
            .as_ref()
            .map_or_else(OverlayRows::new, |c| c.rows.clone());
        let Some(next) = apply(&rows, change) else {
            let unchanged = current.map(|c| Snapshot::new(c.revision, c.epoch, c.rows));
            return Ok(Update::Unchanged(unchanged));
        };
        let base_revision = current.as_ref().map(|c| c.revision);
        let epoch = match &current {
            Some(c) => next_epoch(Some(c.epoch), &next.changes),
            None => first_epoch(&tx, session, target, next_epoch(None, &next.changes))?,
        };
        let revision = take_revision(&tx, session, target, base_revision)?;
        match &current {
            Some(c) if !c.legacy => write_changes(&tx, session, target, &next.changes)?,
            _ => replace_rows(&tx, session, target, &next.rows)?,
        }
        write_header(&tx, session, target, revision, epoch)?;
        tx.commit().map_err(ov)?;
        let stored = Snapshot::new(revision, epoch, next.rows);
        self.overlays.put(session, target, stored.clone());
        Ok(Update::Written {
            base_revision,
            stored,
            changes: next.changes,
        })
    }

    fn delete(&mut self, session: &SessionId, target: &TargetId) -> Result<bool, OverlayError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(ov)?;
        // The epoch is read back checked: a header whose epoch does not read back is
        // `Corrupt` and stays, rather than letting the target start over at epoch 0.
        let Some(header) = read_header(&tx, session, target)? else {
            delete_rows(&tx, session, target)?;
            tx.commit().map_err(ov)?;
            self.overlays.forget(session, target);
            return Ok(false);
        };
        tx.prepare_cached(
            "DELETE FROM chat_live_timeline_overlays
             WHERE app_session_id = ?1 AND timeline_target_id = ?2",
        )
        .map_err(ov)?
        .execute(params![session.as_str(), target.as_str()])
        .map_err(ov)?;
        delete_rows(&tx, session, target)?;
        tx.prepare_cached(
            "INSERT INTO chat_live_timeline_overlay_deleted_epochs
                 (app_session_id, timeline_target_id, settlement_epoch)
             VALUES (?1, ?2, ?3)
             ON CONFLICT (app_session_id, timeline_target_id) DO UPDATE SET
                 settlement_epoch = excluded.settlement_epoch",
        )
        .map_err(ov)?
        .execute(params![
            session.as_str(),
            target.as_str(),
            header.epoch as i64
        ])
        .map_err(ov)?;
        tx.commit().map_err(ov)?;
        self.overlays.forget(session, target);
        Ok(true)
    }

    fn targets(&mut self, session: &SessionId) -> Result<Vec<TargetId>, OverlayError> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT timeline_target_id FROM chat_live_timeline_overlays
                 WHERE app_session_id = ?1 ORDER BY timeline_target_id",
            )
            .map_err(ov)?;
        let rows = stmt
            .query_map(params![session.as_str()], |r| {
                r.get::<_, rusqlite::types::Value>(0)
            })
            .map_err(ov)?;
        let mut out = Vec::new();
        for t in rows {
            let t = t.map_err(ov)?;
            let t = columns::text(OVERLAY_TARGET, (&t).into())
                .map_err(overlay_refused("timeline target"))?;
            out.push(
                TargetId::new(t).map_err(|e| overlay_corrupt("timeline target")(e.to_string()))?,
            );
        }
        Ok(out)
    }

    fn current_revision(&mut self) -> Result<u64, OverlayError> {
        read_counter(&self.conn)
    }
}

impl CleanupJournal for SqliteStore {
    fn add_cleanup(&mut self, session: &SessionId, run: &RunId) -> Result<(), OverlayError> {
        self.write_one(
            "INSERT OR IGNORE INTO chat_pending_terminal_overlay_cleanups (app_session_id, run_id)
             VALUES (?1, ?2)",
            params![session.as_str(), run.as_str()],
        )
        .map_err(ov)?;
        Ok(())
    }

    fn remove_cleanup(&mut self, session: &SessionId, run: &RunId) -> Result<bool, OverlayError> {
        let n = self
            .write_one(
                "DELETE FROM chat_pending_terminal_overlay_cleanups
                 WHERE app_session_id = ?1 AND run_id = ?2",
                params![session.as_str(), run.as_str()],
            )
            .map_err(ov)?;
        Ok(n > 0)
    }

    fn pending_cleanups(
        &mut self,
        session: Option<&SessionId>,
    ) -> Result<Vec<(SessionId, RunId)>, OverlayError> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT app_session_id, run_id FROM chat_pending_terminal_overlay_cleanups
                 WHERE ?1 IS NULL OR app_session_id = ?1 ORDER BY app_session_id, run_id",
            )
            .map_err(ov)?;
        let rows = stmt
            .query_map(params![session.map(|s| s.as_str())], |r| {
                Ok((
                    r.get::<_, rusqlite::types::Value>(0)?,
                    r.get::<_, rusqlite::types::Value>(1)?,
                ))
            })
            .map_err(ov)?;
        let mut out = Vec::new();
        for row in rows {
            let (s, r) = row.map_err(ov)?;
            let what = "cleanup journal row";
            let s = columns::text(CLEANUP_SESSION, (&s).into()).map_err(overlay_refused(what))?;
            let r = columns::text(CLEANUP_RUN, (&r).into()).map_err(overlay_refused(what))?;
            let bad = |e: timeline_core::key::KeyError| overlay_corrupt(what)(e.to_string());
            out.push((SessionId::new(s).map_err(bad)?, RunId::new(r).map_err(bad)?));
        }
        Ok(out)
    }
}

// ----- outbox ----------------------------------------------------------------------------

/// An entry as `entry_json` holds it since schema version 3: everything but the queue
/// ID, the operation ID and the position, which the row's own columns hold. The JSON is
/// most of a submit's bytes, so it stays small; rows written before version 3 still
/// carry the three fields, and the columns win when an entry is read.
///
/// The entry's state is stored as the six fields of [`StateWire`] (`status`, `autoDrain`,
/// `error`, `holdReason`, `acceptance`, `handoff`), in the places and the form they have
/// always had, so files written before the state existed read back unchanged; a
/// combination no state has reads back blocked (the decode goes through the entry's own
/// `Deserialize`).
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct EntryBody<'a> {
    request: &'a MessageRequest,
    controls: &'a Controls,
    status: EntryStatus,
    auto_drain: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hold_reason: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    acceptance: Option<&'a Acceptance>,
    #[serde(skip_serializing_if = "Option::is_none")]
    handoff: Option<HandoffRef<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    session_message: Option<&'a SessionMessageOrigin>,
}

fn entry_json(entry: &OutboxEntry) -> Result<String, OutboxError> {
    // Every field is named, so a field added to the entry (or its state's wire) does not
    // compile here until it is stored too.
    let OutboxEntry {
        queue_id: _,
        operation_id: _,
        position: _,
        request,
        controls,
        state,
        session_message,
    } = entry;
    let StateWire {
        status,
        auto_drain,
        error,
        hold_reason,
        acceptance,
        handoff,
    } = state.wire();
    to_json(&EntryBody {
        request,
        controls,
        status,
        auto_drain,
        error,
        hold_reason,
        acceptance,
        handoff,
        session_message: session_message.as_ref(),
    })
    .map_err(corrupt("outbox entry"))
}

/// The outbox columns an entry is read from, in [`EntryRow`] order.
const ENTRY_COLUMNS: &str = "queue_id, operation_id, position, entry_json";

const OUTBOX: &str = "workspace_chat_outbox";
const OUTBOX_POSITION: Column = Column::new(OUTBOX, "position");
const OUTBOX_JSON: Column = Column::new(OUTBOX, "entry_json");

/// The position a blocked entry shows when its `position` column does not read back:
/// after every entry whose position does.
const UNREADABLE_POSITION: i64 = i64::MAX;

/// An outbox row: queue ID, operation ID, position and the entry JSON, each checked as
/// it is read. A column that does not read back never fails the read: the row then
/// shows as blocked (OB-05) and its neighbours read as usual.
struct EntryRow {
    queue_id: String,
    operation_id: String,
    position: i64,
    json: String,
    /// Why a column did not read back, with what it holds (the row then shows as
    /// blocked).
    refused: Option<String>,
}

impl EntryRow {
    fn read(r: &rusqlite::Row<'_>) -> rusqlite::Result<EntryRow> {
        // An ID column that does not read back blocks the entry: the queue ID is then
        // shown as stored, the operation ID left out. A position or JSON column of the
        // wrong type blocks it too, with what is stored in the reason.
        let mut reasons = Vec::new();
        let (queue, op) = (r.get_ref(0)?, r.get_ref(1)?);
        let queue_id = read_id(queue).unwrap_or_else(|reason| {
            reasons.push(reason);
            id_column::shown(queue)
        });
        let operation_id = read_id(op).unwrap_or_else(|reason| {
            reasons.push(reason);
            String::new()
        });
        // Any INTEGER is a position (front-of-queue entries go below zero).
        let position = columns::integer(OUTBOX_POSITION, r.get_ref(2)?, i64::MIN, i64::MAX)
            .unwrap_or_else(|refused| {
                reasons.push(refused.to_string());
                UNREADABLE_POSITION
            });
        let json = columns::text(OUTBOX_JSON, r.get_ref(3)?).unwrap_or_else(|refused| {
            reasons.push(refused.to_string());
            String::new()
        });
        Ok(EntryRow {
            queue_id,
            operation_id,
            position,
            json,
            refused: (!reasons.is_empty()).then(|| reasons.join("; ")),
        })
    }

    /// The entry: the JSON with the columns put back.
    fn decode(&self) -> Result<OutboxEntry, String> {
        use serde_json::{Map, Value};
        if let Some(reason) = &self.refused {
            return Err(reason.clone());
        }
        let mut fields: Map<String, Value> =
            serde_json::from_str(&self.json).map_err(|e| e.to_string())?;
        fields.insert("queueId".into(), self.queue_id.clone().into());
        fields.insert("operationId".into(), self.operation_id.clone().into());
        fields.insert("position".into(), self.position.into());
        serde_json::from_value(Value::Object(fields)).map_err(|e| e.to_string())
    }

    /// What a session's outbox shows for the row: the entry, or a blocked entry when
    /// the row does not decode.
    fn into_stored(self) -> StoredEntry {
        match self.decode() {
            Ok(e) => StoredEntry::Entry(Box::new(e)),
            Err(reason) => StoredEntry::Blocked(BlockedEntry {
                operation_id: Some(self.operation_id).filter(|o| !o.is_empty()),
                queue_id: self.queue_id,
                position: self.position,
                reason,
            }),
        }
    }
}

fn insert_entry(
    tx: &Transaction<'_>,
    session: &SessionId,
    entry: &OutboxEntry,
) -> Result<(), OutboxError> {
    let json = entry_json(entry)?;
    tx.prepare_cached(
        "INSERT INTO workspace_chat_outbox (session_id, queue_id, operation_id, position, entry_json)
         VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (session_id, queue_id) DO UPDATE SET
             operation_id = excluded.operation_id,
             position = excluded.position,
             entry_json = excluded.entry_json",
    )
    .map_err(ob)?
    .execute(params![
        IdColumn(session.as_str()),
        IdColumn(entry.queue_id.as_str()),
        IdColumn(entry.operation_id.as_str()),
        entry.position,
        json
    ])
    .map_err(ob)?;
    Ok(())
}

fn insert_identity(
    tx: &Transaction<'_>,
    session: &SessionId,
    op: &OperationId,
    fingerprint: &Digest256,
    queue: &QueueId,
    claimed_at: Millis,
) -> Result<(), OutboxError> {
    tx.prepare_cached(
        "INSERT INTO workspace_chat_outbox_operation_identity
             (session_id, operation_id, fingerprint, queue_id, removed, claimed_at)
         VALUES (?1, ?2, ?3, ?4, 0, ?5)",
    )
    .map_err(ob)?
    .execute(params![
        IdColumn(session.as_str()),
        IdColumn(op.as_str()),
        FingerprintColumn::of(fingerprint),
        IdColumn(queue.as_str()),
        claimed_at.as_u64() as i64
    ])
    .map_err(ob)?;
    Ok(())
}

/// A fingerprint as the identity table stores it: the 32 digest bytes when it is the 64
/// lowercase hex characters this library computes, the text itself otherwise, so what
/// is read back always equals what was written.
enum FingerprintColumn<'a> {
    Bytes([u8; 32]),
    Text(&'a str),
}

impl<'a> FingerprintColumn<'a> {
    fn of(digest: &'a Digest256) -> Self {
        match timeline_core::seal::unhex(digest.as_str()).map(<[u8; 32]>::try_from) {
            Some(Ok(bytes)) => FingerprintColumn::Bytes(bytes),
            _ => FingerprintColumn::Text(digest.as_str()),
        }
    }

    /// The fingerprint a stored value holds: a BLOB of exactly the 32 digest bytes, or
    /// text as written (the form any other digest text is kept in). A BLOB of another
    /// length or a value of another type is refused.
    fn read(value: rusqlite::types::ValueRef<'_>) -> Result<Digest256, Refused> {
        use rusqlite::types::ValueRef;
        match value {
            ValueRef::Blob(bytes) if bytes.len() == 32 => {
                Ok(Digest256::from_hex(timeline_core::seal::hex(bytes)))
            }
            ValueRef::Blob(_) => Err(Refused::new(
                IDENTITY_FINGERPRINT,
                value,
                "a BLOB of 32 digest bytes or TEXT",
            )),
            _ => columns::text(IDENTITY_FINGERPRINT, value).map(Digest256::from_hex),
        }
    }
}

impl rusqlite::ToSql for FingerprintColumn<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, ValueRef};
        Ok(ToSqlOutput::Borrowed(match self {
            FingerprintColumn::Bytes(bytes) => ValueRef::Blob(bytes),
            FingerprintColumn::Text(text) => ValueRef::Text(text.as_bytes()),
        }))
    }
}

const IDENTITIES: &str = "workspace_chat_outbox_operation_identity";
const IDENTITY_FINGERPRINT: Column = Column::new(IDENTITIES, "fingerprint");
const IDENTITY_REMOVED: Column = Column::new(IDENTITIES, "removed");

fn read_identity(
    conn: &Connection,
    session: &SessionId,
    op: &OperationId,
) -> Result<Option<Identity>, OutboxError> {
    use rusqlite::types::Value;
    let row: Option<(Value, Result<String, String>, Value)> = conn
        .prepare_cached(
            "SELECT fingerprint, queue_id, removed FROM workspace_chat_outbox_operation_identity
             WHERE session_id = ?1 AND operation_id = ?2",
        )
        .map_err(ob)?
        .query_row(
            params![IdColumn(session.as_str()), IdColumn(op.as_str())],
            |r| Ok((r.get(0)?, read_id(r.get_ref(1)?), r.get(2)?)),
        )
        .optional()
        .map_err(ob)?;
    row.map(|(fp, q, removed)| {
        let what = || format!("operation identity {session}/{op}");
        Ok(Identity {
            fingerprint: FingerprintColumn::read((&fp).into()).map_err(refused(what()))?,
            queue_id: stored_id("identity queue ID", q, QueueId::new)?,
            removed: columns::boolean(IDENTITY_REMOVED, (&removed).into())
                .map_err(refused(what()))?,
        })
    })
    .transpose()
}

/// The outbox row of (session, queue), decoded or not.
fn read_entry_row(
    conn: &Connection,
    session: &SessionId,
    queue: &QueueId,
) -> Result<Option<EntryRow>, OutboxError> {
    conn.prepare_cached(&format!(
        "SELECT {ENTRY_COLUMNS} FROM workspace_chat_outbox WHERE session_id = ?1 AND queue_id = ?2"
    ))
    .map_err(ob)?
    .query_row(
        params![IdColumn(session.as_str()), IdColumn(queue.as_str())],
        EntryRow::read,
    )
    .optional()
    .map_err(ob)
}

/// The entry of (session, queue), if its row decodes.
fn read_entry(
    conn: &Connection,
    session: &SessionId,
    queue: &QueueId,
) -> Result<Option<OutboxEntry>, OutboxError> {
    Ok(read_entry_row(conn, session, queue)?.and_then(|r| r.decode().ok()))
}

/// Deletes the outbox row of (session, queue); `queue` as the column holds it.
fn delete_entry(
    tx: &Transaction<'_>,
    session: &SessionId,
    queue: &dyn rusqlite::ToSql,
) -> Result<(), OutboxError> {
    tx.prepare_cached("DELETE FROM workspace_chat_outbox WHERE session_id = ?1 AND queue_id = ?2")
        .map_err(ob)?
        .execute(params![IdColumn(session.as_str()), queue])
        .map_err(ob)?;
    Ok(())
}

fn mark_removed(tx: &Transaction<'_>, session: &SessionId, op: &str) -> Result<(), OutboxError> {
    tx.prepare_cached(
        "UPDATE workspace_chat_outbox_operation_identity SET removed = 1
         WHERE session_id = ?1 AND operation_id = ?2",
    )
    .map_err(ob)?
    .execute(params![IdColumn(session.as_str()), IdColumn(op)])
    .map_err(ob)?;
    Ok(())
}

/// A route row's columns as stored, in [`ROUTE_COLUMNS`] order; [`parse_route`] checks
/// them.
fn route_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<[rusqlite::types::Value; 10]> {
    use rusqlite::types::Value;
    let mut out: [rusqlite::types::Value; 10] = std::array::from_fn(|_| Value::Null);
    for (i, slot) in out.iter_mut().enumerate() {
        *slot = r.get(i)?;
    }
    Ok(out)
}

const ROUTE_COLUMNS: &str = "operation_id, recipient_session_id, sender_session_id, sender_call_id,
    sender_run_id, sender_thread_id, chain_id, hop, created_at, delivery";

const ROUTES: &str = "chat_session_messages";
const ROUTE_OPERATION: Column = Column::new(ROUTES, "operation_id");
const ROUTE_RECIPIENT: Column = Column::new(ROUTES, "recipient_session_id");
const ROUTE_SENDER: Column = Column::new(ROUTES, "sender_session_id");
const ROUTE_CALL: Column = Column::new(ROUTES, "sender_call_id");
const ROUTE_RUN: Column = Column::new(ROUTES, "sender_run_id");
const ROUTE_THREAD: Column = Column::new(ROUTES, "sender_thread_id");
const ROUTE_CHAIN: Column = Column::new(ROUTES, "chain_id");
const ROUTE_HOP: Column = Column::new(ROUTES, "hop");
const ROUTE_CREATED: Column = Column::new(ROUTES, "created_at");
const ROUTE_DELIVERY: Column = Column::new(ROUTES, "delivery");

/// The route a row holds (OB-16), every column checked: IDs are UTF-8 text that makes a
/// valid ID, `hop` fits a `u32`, `created_at` is from 0 to 2^53 - 1, and `delivery` is
/// one of its three names.
fn parse_route(v: [rusqlite::types::Value; 10]) -> Result<SessionMessageRoute, OutboxError> {
    use rusqlite::types::ValueRef;
    let what = "session message route";
    let at = |i: usize| v.get(i).map_or(ValueRef::Null, ValueRef::from);
    let text = |column: Column, i: usize| columns::text(column, at(i)).map_err(refused(what));
    let optional =
        |column: Column, i: usize| columns::optional_text(column, at(i)).map_err(refused(what));
    let bad = |reason: String| corrupt(what)(reason);
    let hop = columns::integer(ROUTE_HOP, at(7), 0, i64::from(u32::MAX)).map_err(refused(what))?;
    Ok(SessionMessageRoute {
        operation_id: id(
            "route operation",
            OperationId::new(text(ROUTE_OPERATION, 0)?),
        )?,
        recipient_session_id: id("route recipient", SessionId::new(text(ROUTE_RECIPIENT, 1)?))?,
        sender_session_id: id("route sender", SessionId::new(text(ROUTE_SENDER, 2)?))?,
        sender_call_id: id("route call", CallId::new(text(ROUTE_CALL, 3)?))?,
        sender_run_id: optional(ROUTE_RUN, 4)?
            .map(RunId::new)
            .transpose()
            .map_err(|e| bad(e.to_string()))?,
        sender_thread_id: optional(ROUTE_THREAD, 5)?
            .map(ThreadId::new)
            .transpose()
            .map_err(|e| bad(e.to_string()))?,
        chain_id: text(ROUTE_CHAIN, 6)?,
        hop: u32::try_from(hop).map_err(|e| bad(e.to_string()))?,
        created_at: Millis(columns::exact(ROUTE_CREATED, at(8)).map_err(refused(what))?),
        delivery: columns::one_of(
            ROUTE_DELIVERY,
            at(9),
            &[
                RouteDelivery::Sent,
                RouteDelivery::NeedsApproval,
                RouteDelivery::Declined,
            ]
            .map(|d| (delivery_text(d), d)),
        )
        .map_err(refused(what))?,
    })
}

fn delivery_text(d: RouteDelivery) -> &'static str {
    match d {
        RouteDelivery::Sent => "sent",
        RouteDelivery::NeedsApproval => "needs-approval",
        RouteDelivery::Declined => "declined",
    }
}

impl OutboxStore for SqliteStore {
    fn claim(
        &mut self,
        session: &SessionId,
        fingerprint: &Digest256,
        entry: &OutboxEntry,
    ) -> Result<Claim, OutboxError> {
        let tx = self.write().map_err(ob)?;
        let claim = claim_in(&tx, session, fingerprint, entry)?;
        if claim == Claim::Claimed {
            tx.commit().map_err(ob)?;
        }
        Ok(claim)
    }

    fn claim_sending(
        &mut self,
        session: &SessionId,
        fingerprint: &Digest256,
        entry: &OutboxEntry,
        ledger_session: &SessionId,
        record: &LedgerRecord,
    ) -> Result<Claim, OutboxError> {
        let tx = self.write().map_err(ob)?;
        let claim = claim_in(&tx, session, fingerprint, entry)?;
        if claim == Claim::Claimed {
            put_ledger(&tx, ledger_session, &entry.operation_id, record)?;
            tx.commit().map_err(ob)?;
        }
        Ok(claim)
    }

    fn claim_session_message(
        &mut self,
        recipient: &SessionId,
        fingerprint: &Digest256,
        entry: &OutboxEntry,
        route: &SessionMessageRoute,
    ) -> Result<RouteClaim, OutboxError> {
        let tx = self.write().map_err(ob)?;
        let existing = tx
            .prepare_cached(&format!(
                "SELECT {ROUTE_COLUMNS} FROM chat_session_messages
                 WHERE sender_session_id = ?1 AND sender_call_id = ?2"
            ))
            .map_err(ob)?
            .query_row(
                params![
                    route.sender_session_id.as_str(),
                    route.sender_call_id.as_str()
                ],
                route_from_row,
            )
            .optional()
            .map_err(ob)?;
        if let Some(row) = existing {
            return Ok(RouteClaim::ExistingCall(parse_route(row)?));
        }
        if read_identity(&tx, recipient, &entry.operation_id)?.is_some() {
            return Err(OutboxError::OperationTaken(entry.operation_id.clone()));
        }
        insert_identity(
            &tx,
            recipient,
            &entry.operation_id,
            fingerprint,
            &entry.queue_id,
            route.created_at,
        )?;
        insert_entry(&tx, recipient, entry)?;
        tx.prepare_cached(&format!(
            "INSERT INTO chat_session_messages ({ROUTE_COLUMNS})
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
        ))
        .map_err(ob)?
        .execute(params![
            route.operation_id.as_str(),
            route.recipient_session_id.as_str(),
            route.sender_session_id.as_str(),
            route.sender_call_id.as_str(),
            route.sender_run_id.as_ref().map(|r| r.as_str()),
            route.sender_thread_id.as_ref().map(|t| t.as_str()),
            route.chain_id,
            route.hop as i64,
            route.created_at.as_u64() as i64,
            delivery_text(route.delivery),
        ])
        .map_err(ob)?;
        tx.commit().map_err(ob)?;
        Ok(RouteClaim::Claimed)
    }

    fn identity(
        &mut self,
        session: &SessionId,
        op: &OperationId,
    ) -> Result<Option<Identity>, OutboxError> {
        read_identity(&self.conn, session, op)
    }

    fn entries(&mut self, session: &SessionId) -> Result<Vec<StoredEntry>, OutboxError> {
        let mut stmt = self
            .conn
            .prepare_cached(&format!(
                "SELECT {ENTRY_COLUMNS} FROM workspace_chat_outbox WHERE session_id = ?1"
            ))
            .map_err(ob)?;
        let mut rows = stmt
            .query_map(params![IdColumn(session.as_str())], EntryRow::read)
            .map_err(ob)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(ob)?;
        // Ordered here, not in SQL: a stored ID's bytes do not sort like its text.
        rows.sort_by(|a, b| (a.position, &a.queue_id).cmp(&(b.position, &b.queue_id)));
        Ok(rows.into_iter().map(EntryRow::into_stored).collect())
    }

    fn outbox_sessions(&mut self) -> Result<Vec<SessionId>, OutboxError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT DISTINCT session_id FROM workspace_chat_outbox")
            .map_err(ob)?;
        let rows = stmt
            .query_map([], |r| Ok(read_id(r.get_ref(0)?)))
            .map_err(ob)?;
        let mut out = Vec::new();
        for s in rows {
            out.push(stored_id("outbox session", s.map_err(ob)?, SessionId::new)?);
        }
        // Ordered here, not in SQL: a stored ID's bytes do not sort like its text.
        out.sort();
        Ok(out)
    }

    fn replace_entry(
        &mut self,
        session: &SessionId,
        expected: &OutboxEntry,
        new: &OutboxEntry,
    ) -> Result<bool, OutboxError> {
        let tx = self.write().map_err(ob)?;
        if read_entry(&tx, session, &expected.queue_id)?.as_ref() != Some(expected) {
            return Ok(false);
        }
        insert_entry(&tx, session, new)?;
        tx.commit().map_err(ob)?;
        Ok(true)
    }

    fn replace_entry_with_ledger(
        &mut self,
        session: &SessionId,
        expected: &OutboxEntry,
        new: &OutboxEntry,
        ledger_session: &SessionId,
        record: &LedgerRecord,
    ) -> Result<bool, OutboxError> {
        let tx = self.write().map_err(ob)?;
        if read_entry(&tx, session, &expected.queue_id)?.as_ref() != Some(expected) {
            return Ok(false);
        }
        insert_entry(&tx, session, new)?;
        put_ledger(&tx, ledger_session, &new.operation_id, record)?;
        tx.commit().map_err(ob)?;
        Ok(true)
    }

    fn rekey_entry(
        &mut self,
        session: &SessionId,
        expected: &OutboxEntry,
        fingerprint: &Digest256,
        new: &OutboxEntry,
    ) -> Result<bool, OutboxError> {
        let tx = self.write().map_err(ob)?;
        if read_entry(&tx, session, &expected.queue_id)?.as_ref() != Some(expected) {
            return Ok(false);
        }
        if read_identity(&tx, session, &new.operation_id)?.is_some() {
            return Err(OutboxError::OperationTaken(new.operation_id.clone()));
        }
        mark_removed(&tx, session, expected.operation_id.as_str())?;
        insert_identity(
            &tx,
            session,
            &new.operation_id,
            fingerprint,
            &new.queue_id,
            new.request.created_at,
        )?;
        insert_entry(&tx, session, new)?;
        tx.commit().map_err(ob)?;
        Ok(true)
    }

    fn remove_entry(
        &mut self,
        session: &SessionId,
        queue_id: &QueueId,
    ) -> Result<Option<OutboxEntry>, OutboxError> {
        let tx = self.write().map_err(ob)?;
        let Some(row) = read_entry_row(&tx, session, queue_id)? else {
            return Ok(None);
        };
        delete_entry(&tx, session, &IdColumn(queue_id.as_str()))?;
        mark_removed(&tx, session, &row.operation_id)?;
        tx.commit().map_err(ob)?;
        Ok(row.decode().ok())
    }

    fn set_positions(
        &mut self,
        session: &SessionId,
        positions: &[(QueueId, i64)],
    ) -> Result<(), OutboxError> {
        // The position is a column of its own; the entry JSON does not hold it.
        let tx = self.write().map_err(ob)?;
        for (q, p) in positions {
            tx.prepare_cached(
                "UPDATE workspace_chat_outbox SET position = ?3
                 WHERE session_id = ?1 AND queue_id = ?2",
            )
            .map_err(ob)?
            .execute(params![IdColumn(session.as_str()), IdColumn(q.as_str()), p])
            .map_err(ob)?;
        }
        tx.commit().map_err(ob)
    }

    fn ledger(
        &mut self,
        session: &SessionId,
        op: &OperationId,
    ) -> Result<Option<LedgerRecord>, OutboxError> {
        use rusqlite::types::Value;
        let row: Option<(Value, Value)> = self
            .conn
            .prepare_cached(
                "SELECT status, record_json FROM chat_operation_ledger
                 WHERE app_session_id = ?1 AND operation_id = ?2",
            )
            .map_err(ob)?
            .query_row(params![session.as_str(), op.as_str()], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()
            .map_err(ob)?;
        row.map(|(status, json)| read_ledger(session, op, &status, &json))
            .transpose()
    }

    fn put_ledger(
        &mut self,
        session: &SessionId,
        op: &OperationId,
        record: &LedgerRecord,
    ) -> Result<(), OutboxError> {
        let tx = self.write().map_err(ob)?;
        put_ledger(&tx, session, op, record)?;
        tx.commit().map_err(ob)
    }

    fn confirm_sent(
        &mut self,
        scope: &[SessionId],
        op: &OperationId,
        record: &LedgerRecord,
    ) -> Result<Vec<(SessionId, QueueId)>, OutboxError> {
        let Some(base) = scope.first() else {
            return Ok(Vec::new());
        };
        let tx = self.write().map_err(ob)?;
        put_ledger(&tx, base, op, record)?;
        let mut removed = Vec::new();
        for session in scope {
            // Each queue ID as stored, to delete by, and as read back.
            let queues: Vec<(rusqlite::types::Value, Result<String, String>)> = {
                let mut stmt = tx
                    .prepare_cached(
                        // Through the identity's primary key and the outbox's
                        // unique (session, queue) index: a cost independent of the
                        // entries that stay in the outbox.
                        "SELECT o.queue_id
                         FROM workspace_chat_outbox_operation_identity AS i
                         JOIN workspace_chat_outbox AS o
                           ON o.session_id = i.session_id AND o.queue_id = i.queue_id
                         WHERE i.session_id = ?1 AND i.operation_id = ?2
                           AND o.operation_id = ?2",
                    )
                    .map_err(ob)?;
                let rows = stmt
                    .query_map(
                        params![IdColumn(session.as_str()), IdColumn(op.as_str())],
                        |r| Ok((r.get(0)?, read_id(r.get_ref(0)?))),
                    )
                    .map_err(ob)?;
                rows.collect::<Result<_, _>>().map_err(ob)?
            };
            for (stored, q) in queues {
                delete_entry(&tx, session, &stored)?;
                removed.push((session.clone(), stored_id("queue ID", q, QueueId::new)?));
            }
            mark_removed(&tx, session, op.as_str())?;
        }
        tx.commit().map_err(ob)?;
        Ok(removed)
    }

    fn route(&mut self, op: &OperationId) -> Result<Option<SessionMessageRoute>, OutboxError> {
        let row = self
            .conn
            .prepare_cached(&format!(
                "SELECT {ROUTE_COLUMNS} FROM chat_session_messages WHERE operation_id = ?1"
            ))
            .map_err(ob)?
            .query_row(params![op.as_str()], route_from_row)
            .optional()
            .map_err(ob)?;
        row.map(parse_route).transpose()
    }

    fn set_route_delivery(
        &mut self,
        op: &OperationId,
        delivery: RouteDelivery,
    ) -> Result<(), OutboxError> {
        self.write_one(
            "UPDATE chat_session_messages SET delivery = ?2 WHERE operation_id = ?1",
            params![op.as_str(), delivery_text(delivery)],
        )
        .map_err(ob)?;
        Ok(())
    }
}

const LEDGER: &str = "chat_operation_ledger";
const LEDGER_STATUS: Column = Column::new(LEDGER, "status");
const LEDGER_RECORD: Column = Column::new(LEDGER, "record_json");

/// The `status` column's text for a ledger status: its name in the record JSON.
fn status_text(status: LedgerStatus) -> String {
    serde_json::to_value(status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// A ledger row read back (OB-07): the record JSON decodes, and the `status` column
/// says the same status as the JSON. A row where they differ is refused, since either
/// could be the truth and the ledger decides what a retry may do.
fn read_ledger(
    session: &SessionId,
    op: &OperationId,
    status: &rusqlite::types::Value,
    json: &rusqlite::types::Value,
) -> Result<LedgerRecord, OutboxError> {
    let what = || format!("ledger {session}/{op}");
    let json = columns::text(LEDGER_RECORD, json.into()).map_err(refused(what()))?;
    let record: LedgerRecord =
        serde_json::from_str(&json).map_err(|e| corrupt(what())(e.to_string()))?;
    let said = status_text(record.status);
    match status {
        rusqlite::types::Value::Text(column) if *column == said => Ok(record),
        other => Err(refused(what())(Refused::new(
            LEDGER_STATUS,
            other.into(),
            format!("TEXT '{said}', the status of {LEDGER_RECORD}"),
        ))),
    }
}

/// The claim's two inserts inside `tx` (committed by the caller when it claimed).
fn claim_in(
    tx: &Transaction<'_>,
    session: &SessionId,
    fingerprint: &Digest256,
    entry: &OutboxEntry,
) -> Result<Claim, OutboxError> {
    let json = entry_json(entry)?;
    // The identity's primary key decides: a claimed operation inserts nothing, and the
    // transaction ends without writing.
    let inserted = tx
        .prepare_cached(
            "INSERT INTO workspace_chat_outbox_operation_identity
                 (session_id, operation_id, fingerprint, queue_id, removed, claimed_at)
             VALUES (?1, ?2, ?3, ?4, 0, ?5)
             ON CONFLICT (session_id, operation_id) DO NOTHING",
        )
        .map_err(ob)?
        .execute(params![
            IdColumn(session.as_str()),
            IdColumn(entry.operation_id.as_str()),
            FingerprintColumn::of(fingerprint),
            IdColumn(entry.queue_id.as_str()),
            entry.request.created_at.as_u64() as i64
        ])
        .map_err(ob)?;
    if inserted == 0 {
        let existing = read_identity(tx, session, &entry.operation_id)?;
        return existing
            .map(Claim::Existing)
            .ok_or_else(|| corrupt("operation identity")("claimed but unreadable".into()));
    }
    // A queue ID that holds another operation's entry is refused (nothing written).
    let placed = tx
        .prepare_cached(
            "INSERT INTO workspace_chat_outbox (session_id, queue_id, operation_id, position, entry_json)
             VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (session_id, queue_id) DO NOTHING",
        )
        .map_err(ob)?
        .execute(params![
            IdColumn(session.as_str()),
            IdColumn(entry.queue_id.as_str()),
            IdColumn(entry.operation_id.as_str()),
            entry.position,
            json
        ])
        .map_err(ob)?;
    if placed == 0 {
        return Err(OutboxError::QueueTaken(entry.queue_id.clone()));
    }
    Ok(Claim::Claimed)
}

fn put_ledger(
    tx: &Transaction<'_>,
    session: &SessionId,
    op: &OperationId,
    record: &LedgerRecord,
) -> Result<(), OutboxError> {
    let json = to_json(record).map_err(corrupt("ledger record"))?;
    let status = status_text(record.status);
    tx.prepare_cached(
        "INSERT INTO chat_operation_ledger (app_session_id, operation_id, status, record_json)
         VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (app_session_id, operation_id) DO UPDATE SET
             status = excluded.status, record_json = excluded.record_json",
    )
    .map_err(ob)?
    .execute(params![session.as_str(), op.as_str(), status, json])
    .map_err(ob)?;
    Ok(())
}

#[cfg(test)]
mod deleted_epoch_tests {
    //! Schema 6: a deleted target keeps its settlement epoch (OV-02, OV-04, TL-06).
    use super::*;
    use overlay_core::overlay::write;
    use timeline_core::block::Block;
    use timeline_core::key::{BlockKey, BlockType};

    fn row(id: &str) -> StoredBlock {
        StoredBlock {
            block: Block::new(
                BlockKey::parse(BlockType::AgentReply, id).unwrap(),
                Millis(1),
            ),
            class: overlay_core::store::RowClass::Ordinary,
            run_id: None,
        }
    }

    fn settle(id: &str) -> Change {
        Change::Settle([BlockKey::parse(BlockType::AgentReply, id).unwrap()].into())
    }

    fn ids() -> (SessionId, TargetId, TargetId) {
        (
            SessionId::new("s").unwrap(),
            TargetId::new("thread-1").unwrap(),
            TargetId::new("thread-2").unwrap(),
        )
    }

    // ST-02, OV-04: a version 5 file upgrades to version 6 with every overlay as it was;
    // a target deleted after the upgrade comes back one epoch higher, one deleted before
    // it (which left no epoch behind) starts at 0 as version 5 did.
    #[test]
    fn a_version_5_database_upgrades_and_deletes_keep_their_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v5.sqlite");
        let (s, kept, gone) = ids();
        // A version 5 file as version 5 wrote it: `kept` at epoch 1 with one row;
        // `gone` deleted (version 5 removed its header and rows and left nothing).
        let v5 = SqliteStore::open_at(&path, Settings::default(), 5).unwrap();
        let b = to_json(&row("b")).unwrap();
        v5.connection()
            .execute_batch(&format!(
                "UPDATE chat_live_timeline_overlay_revisions SET revision = 4 WHERE id = 1;
                 INSERT INTO chat_live_timeline_overlays VALUES ('s', 'thread-1', 3, 1, NULL);
                 INSERT INTO chat_live_timeline_overlay_rows
                     (app_session_id, timeline_target_id, block_type, block_id, row_json)
                     VALUES ('s', 'thread-1', 'agent-reply', 'b', '{b}');"
            ))
            .unwrap();
        drop(v5);
        let before = StoredOverlay {
            format_version: FORMAT_VERSION,
            settlement_epoch: 1,
            revision: 3,
            blocks: vec![row("b")],
        };

        let mut store = SqliteStore::open(&path, Settings::default()).unwrap();
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        assert_eq!(store.load(&s, &kept).unwrap(), Some(before.clone()));
        let again = write(&mut store, &s, &gone, &Change::Publish(vec![row("c")])).unwrap();
        assert_eq!(again.stored().unwrap().settlement_epoch, 0);

        let settled = write(&mut store, &s, &kept, &settle("b")).unwrap();
        assert_eq!(settled.stored().unwrap().settlement_epoch, 2);
        assert!(store.delete(&s, &kept).unwrap());
        let recorded: i64 = store
            .connection()
            .query_row(
                "SELECT settlement_epoch FROM chat_live_timeline_overlay_deleted_epochs",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(recorded, 2);
        drop(store);
        let mut store = SqliteStore::open(&path, Settings::default()).unwrap();
        let back = write(&mut store, &s, &kept, &Change::Publish(vec![row("d")])).unwrap();
        let back = back.stored().unwrap();
        assert_eq!(back.settlement_epoch, 3);
        assert!(back.revision > before.revision);
        let left: i64 = store
            .connection()
            .query_row(
                "SELECT count(*) FROM chat_live_timeline_overlay_deleted_epochs",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(left, 0, "the record leaves with the first write");
    }

    // OV-04: a recorded epoch that does not read back is `Corrupt`, and the write that
    // needed it stores nothing; an epoch that does not read back is never deleted away.
    #[test]
    fn unreadable_epochs_are_corrupt_and_nothing_is_written() {
        let mut store = SqliteStore::open_in_memory(Settings::default()).unwrap();
        let (s, t, other) = ids();
        store
            .connection()
            .execute(
                "INSERT INTO chat_live_timeline_overlay_deleted_epochs VALUES ('s', 'thread-1', 'x')",
                [],
            )
            .unwrap();
        let err = write(&mut store, &s, &t, &Change::Publish(vec![row("a")])).unwrap_err();
        assert!(
            matches!(&err, OverlayError::Corrupt { reason, .. }
                if reason.contains("chat_live_timeline_overlay_deleted_epochs.settlement_epoch")),
            "{err:?}"
        );
        let err = store.compare_and_set(&s, &t, None, 0, vec![row("a")]);
        assert!(matches!(err, Err(OverlayError::Corrupt { .. })), "{err:?}");
        assert_eq!(store.load(&s, &t).unwrap(), None);
        assert_eq!(store.current_revision().unwrap(), 0);

        write(&mut store, &s, &other, &Change::Publish(vec![row("a")])).unwrap();
        store
            .connection()
            .execute(
                "UPDATE chat_live_timeline_overlays SET settlement_epoch = -1
                 WHERE timeline_target_id = 'thread-2'",
                [],
            )
            .unwrap();
        assert!(matches!(
            store.delete(&s, &other),
            Err(OverlayError::Corrupt { .. })
        ));
        assert_eq!(store.targets(&s).unwrap(), vec![other]);
    }
}
