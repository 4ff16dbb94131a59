//! The schema: numbered migrations in `migrations/*.sql`, tracked in
//! `PRAGMA user_version`.
//!
//! Version N is [`MIGRATIONS`]`[N - 1]`; each applies in its own `IMMEDIATE`
//! transaction together with the new `user_version`, so a file is always at exactly one
//! version. A file at a version this build knows is migrated on open; a newer or unknown
//! version is refused, and a migration that does not apply to the file's tables fails
//! with the stored version and the versions this build knows
//! ([`OpenError::Migration`]).
//!
//! The tables a version holds are not listed by hand: [`schema_tables`] runs the
//! migrations on a private in-memory database and reads them back, so the check on open
//! (`connection.rs`: a file whose version names tables it does not hold is refused)
//! can never disagree with the migrations themselves. Each version only adds tables
//! (3 and 5 rebuild a table under its old name), so a version's tables are also held by
//! every later version.
//!
//! # History
//!
//! 1. The seed's tables.
//! 2. The identity row records when its operation was claimed.
//! 3. The two rows a submit inserts change few pages per commit (every page a commit
//!    changes is one WAL frame written, and with `synchronous = FULL` synced): the outbox
//!    becomes a rowid table, so its few-hundred-byte row is appended at the table's end
//!    and only a small index entry lands inside the (session, queue) key order; the
//!    identity keeps the fingerprint as its 32 digest bytes; the entry JSON leaves out
//!    the queue ID, operation ID and position, which the row's columns hold. Rows
//!    written before keep those fields in their JSON, and the columns win when an entry
//!    is read.
//! 4. A session, queue or operation ID that ends in a canonical UUID, as client IDs do,
//!    is stored in 16 bytes instead of 36 characters (`id_column.rs`; every other ID
//!    stays text and all read back exactly): the identity table keeps a row for every
//!    operation ever claimed, in random key order, so smaller keys mean fewer pages
//!    changed per submit and fewer copied per checkpoint.
//! 5. A target's overlay, until then one JSON snapshot in `chat_live_timeline_overlays`,
//!    becomes a header row there and one row per overlay row in
//!    `chat_live_timeline_overlay_rows`, so a write touches only the rows it changed. A
//!    version-4 snapshot that does not split into rows (not JSON, a key twice) stays in
//!    `snapshot_json` as it was and reads as `Corrupt`, as version 4 did; nothing is
//!    dropped. A snapshot found there is read as version 4 read it, and a write
//!    rewrites it as rows.
//! 6. A delete keeps the target's settlement epoch in
//!    `chat_live_timeline_overlay_deleted_epochs`, so the target comes back one epoch
//!    higher. A target deleted before this version left no epoch behind and starts at 0.
//!
//! `benches/README.md` has the measurements behind versions 3 and 4.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use rusqlite::{Connection, TransactionBehavior};

use crate::error::{is_damage, open_error, OpenError};

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

pub(crate) fn user_version(conn: &Connection) -> rusqlite::Result<u32> {
    conn.query_row("PRAGMA user_version", [], |r| r.get(0))
}

/// The names of the file's own tables (SQLite's internal `sqlite_*` tables left out).
pub(crate) fn table_names(conn: &Connection) -> rusqlite::Result<BTreeSet<String>> {
    let mut stmt = conn.prepare(
        r"SELECT name FROM sqlite_schema
          WHERE type = 'table' AND name NOT LIKE 'sqlite\_%' ESCAPE '\'",
    )?;
    let names = stmt.query_map([], |r| r.get(0))?;
    names.collect()
}

/// The tables of every version: entry N - 1 holds the tables a file at version N has,
/// read back from a private in-memory database the migrations ran on, once per process.
pub(crate) fn schema_tables() -> rusqlite::Result<&'static [BTreeSet<String>]> {
    static TABLES: OnceLock<Vec<BTreeSet<String>>> = OnceLock::new();
    if let Some(tables) = TABLES.get() {
        return Ok(tables);
    }
    // A failure is returned, not kept: the next open tries again.
    let tables = migrated_tables()?;
    Ok(TABLES.get_or_init(|| tables))
}

fn migrated_tables() -> rusqlite::Result<Vec<BTreeSet<String>>> {
    let conn = Connection::open_in_memory()?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    let mut tables = Vec::with_capacity(MIGRATIONS.len());
    for (_, sql) in MIGRATIONS {
        conn.execute_batch(sql)?;
        tables.push(table_names(&conn)?);
    }
    Ok(tables)
}

/// The file's `user_version` as a version this build can migrate from.
fn known_version(conn: &Connection) -> Result<u32, OpenError> {
    // SQLite keeps a signed 32-bit number; read it whole so a negative one is named.
    let found: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(open_error)?;
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
pub(crate) fn migrate(conn: &mut Connection, target: u32) -> Result<u32, OpenError> {
    let found = known_version(conn)?;
    for (version, (name, sql)) in (1..=target.min(SCHEMA_VERSION))
        .zip(MIGRATIONS)
        .skip(found as usize)
    {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(open_error)?;
        tx.execute_batch(sql).map_err(|e| {
            if is_damage(&e) {
                // Not a version that does not match its tables: SQLite says the file
                // is damaged.
                return open_error(e);
            }
            OpenError::Migration {
                found,
                migration: name,
                reason: migration_reason(&e),
                supported: SCHEMA_VERSION,
            }
        })?;
        tx.pragma_update(None, "user_version", version)
            .map_err(open_error)?;
        tx.commit().map_err(open_error)?;
    }
    known_version(conn)
}
