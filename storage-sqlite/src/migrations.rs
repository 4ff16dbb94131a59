//! The schema: numbered migrations in `migrations/*.sql`, tracked in the one row of the
//! `custody_schema` table ([`SCHEMA_TABLE`]).
//!
//! Version N is [`MIGRATIONS`]`[N - 1]`; each applies in its own `IMMEDIATE`
//! transaction together with the new version in that row, so a database is always at
//! exactly one version. A database at a version this build knows is migrated on open; a
//! newer or unknown version is refused, and a migration that does not apply to the
//! database's tables fails with the stored version and the versions this build knows
//! ([`OpenError::Migration`]).
//!
//! The version lives in a table of its own, not in `PRAGMA user_version`, so the tables
//! can share a database with an application that keeps its own version there
//! ([`SqliteStore::from_connection`](crate::SqliteStore::from_connection)). Earlier
//! releases kept it in `user_version`: a database with this library's tables and no
//! `custody_schema` is such a store, and its `user_version` is read once; the table is
//! created with that version in the transaction of the first migration due (or in one of
//! its own), and from then on `user_version` is neither read nor written. The table is
//! created with the first migration, never before, so it never says 0.
//!
//! The tables a version holds are not listed by hand: [`schema_tables`] runs the
//! migrations on a private in-memory database and reads them back, so the check on open
//! (`connection.rs`: a database whose version names tables it does not hold is refused)
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

use rusqlite::types::Value;
use rusqlite::{Connection, TransactionBehavior};

use crate::columns::{Column, Refused};
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

/// The table that holds the schema version: one row, its `version` column the number
/// of the last migration applied.
pub const SCHEMA_TABLE: &str = "custody_schema";

/// The schema table, created in the transaction of the first migration (or, for a store
/// of an earlier release, of its conversion), so it never holds a version no migration
/// reached. The `CHECK` keeps it to one row.
const CREATE_SCHEMA_TABLE: &str = "CREATE TABLE custody_schema (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL
)";

const VERSION_COLUMN: Column = Column::new(SCHEMA_TABLE, "version");

/// Where a database keeps this library's schema version, as found on open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stored {
    /// In [`SCHEMA_TABLE`]: the version its row holds.
    Table(i64),
    /// No [`SCHEMA_TABLE`], but tables of this library: a store written by an earlier
    /// release, which kept the version in `PRAGMA user_version`; the value found there.
    UserVersion(i64),
    /// Neither: no schema table and none of this library's tables.
    Absent,
}

/// What a database holds of this library's schema.
#[derive(Debug)]
pub(crate) struct Found {
    /// Every table of the database ([`table_names`]).
    pub(crate) tables: BTreeSet<String>,
    /// Where its version is kept, and what it says.
    pub(crate) stored: Stored,
}

/// Whether `name` is the schema table (SQLite compares table names without case).
pub(crate) fn is_schema_table(name: &str) -> bool {
    name.eq_ignore_ascii_case(SCHEMA_TABLE)
}

/// Reads what the database holds of this library's schema. `PRAGMA user_version` is read
/// only when there is no [`SCHEMA_TABLE`] and some of this library's tables are there
/// (a store of an earlier release); a schema table that does not read as one row with
/// an integer version is [`OpenError::Corrupt`].
pub(crate) fn found(conn: &Connection) -> Result<Found, OpenError> {
    let tables = table_names(conn).map_err(open_error)?;
    let stored = if tables.iter().any(|t| is_schema_table(t)) {
        Stored::Table(table_version(conn)?)
    } else {
        let versions = schema_tables().map_err(open_error)?;
        if versions.iter().flatten().any(|t| tables.contains(t)) {
            Stored::UserVersion(user_version(conn)?)
        } else {
            Stored::Absent
        }
    };
    Ok(Found { tables, stored })
}

/// `PRAGMA user_version`, whole: SQLite keeps a signed 32-bit number, so a negative one
/// is named as stored. Read only where the schema table is not there.
pub(crate) fn user_version(conn: &Connection) -> Result<i64, OpenError> {
    conn.query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(open_error)
}

/// The version the schema table's one row holds, checked like every value read back.
fn table_version(conn: &Connection) -> Result<i64, OpenError> {
    let corrupt = |reason: String| OpenError::Corrupt { reason };
    let not_ours = |e: rusqlite::Error| {
        if is_damage(&e) {
            return open_error(e);
        }
        corrupt(format!(
            "its {SCHEMA_TABLE} table is not the one this library writes ({})",
            migration_reason(&e)
        ))
    };
    let mut stmt = conn
        .prepare("SELECT version FROM custody_schema LIMIT 2")
        .map_err(not_ours)?;
    let values: Vec<Value> = stmt
        .query_map([], |r| r.get(0))
        .and_then(|rows| rows.collect())
        .map_err(not_ours)?;
    match values.as_slice() {
        [Value::Integer(version)] => Ok(*version),
        [other] => Err(corrupt(
            Refused::new(VERSION_COLUMN, other.into(), "an INTEGER").to_string(),
        )),
        [] => Err(corrupt(format!(
            "its {SCHEMA_TABLE} table holds no row, so it says no schema version; this \
             library writes its one row together with the table"
        ))),
        _ => Err(corrupt(format!(
            "its {SCHEMA_TABLE} table holds more than one row; this library writes one"
        ))),
    }
}

/// A stored version as one this build can migrate from.
fn known(found: i64) -> Result<u32, OpenError> {
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

/// The version and whether the schema table holds it; a database with neither the
/// table nor tables of this library is at version 0.
fn version(conn: &Connection) -> Result<(u32, bool), OpenError> {
    match found(conn)?.stored {
        Stored::Table(v) => Ok((known(v)?, true)),
        Stored::UserVersion(v) => Ok((known(v)?, false)),
        Stored::Absent => Ok((0, false)),
    }
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

/// Applies migrations up to `target`, each in its own `IMMEDIATE` transaction together
/// with the new version in the schema table; returns the version the database is at.
///
/// The version is read again inside each transaction, so connections that open one
/// database at once migrate it once. A store of an earlier release (no schema table,
/// the version in `user_version`) gets the schema table, with that version, in the
/// transaction of its first migration, or in one of its own when it needs none; from
/// then on `user_version` is neither read nor written.
pub(crate) fn migrate(conn: &mut Connection, target: u32) -> Result<u32, OpenError> {
    let target = target.min(SCHEMA_VERSION);
    // Without a write lock while nothing is to be done (every open of a current store).
    match version(conn)? {
        (found, true) if found >= target => return Ok(found),
        _ => {}
    }
    loop {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(open_error)?;
        let (found, in_table) = version(&tx)?;
        if !in_table && (found > 0 || found < target) {
            tx.execute_batch(CREATE_SCHEMA_TABLE).map_err(open_error)?;
            tx.execute(
                "INSERT INTO custody_schema (id, version) VALUES (1, ?1)",
                [found],
            )
            .map_err(open_error)?;
        }
        let Some((name, sql)) = MIGRATIONS.get(found as usize).filter(|_| found < target) else {
            tx.commit().map_err(open_error)?;
            return Ok(found);
        };
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
        // The table holds one row ([`table_version`] read it).
        let changed = tx
            .execute("UPDATE custody_schema SET version = ?1", [found + 1])
            .map_err(open_error)?;
        debug_assert_eq!(changed, 1);
        tx.commit().map_err(open_error)?;
    }
}

/// The schema version in the schema table.
pub(crate) fn schema_version(conn: &Connection) -> rusqlite::Result<u32> {
    conn.query_row("SELECT version FROM custody_schema", [], |r| r.get(0))
}
