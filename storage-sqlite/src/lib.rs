//! # storage-sqlite
//!
//! The durable backend: every storage trait of the core crates on one SQLite database
//! (ST-01 to ST-04), through rusqlite, with SQLite compiled in (the default `bundled`
//! feature, so a fresh machine needs no system library) or the system's libsqlite3.
//!
//! One [`SqliteStore`] is one connection. It implements
//! [`OverlayStore`](overlay_core::store::OverlayStore),
//! [`CleanupJournal`](overlay_core::store::CleanupJournal) and
//! [`OutboxStore`](outbox_core::store::OutboxStore); open it with [`SqliteStore::open`]
//! (a file of its own) or [`SqliteStore::open_in_memory`], with [`Settings`], or with
//! [`SqliteStore::from_connection`] on a connection the application opened, so the
//! tables live in the application's own database.
//!
//! # Which files open
//!
//! [`SqliteStore::open`] creates a store only where no file exists, and opens an existing
//! file only if it is a custody store; every other file is refused with
//! [`OpenError::Corrupt`] (its reason says what is wrong) before anything is written to
//! it, so a damaged store is never mistaken for a first run and never overwritten. A
//! file holds a custody store when it has the `custody_schema` table, or, written by an
//! earlier release (which kept the schema version in `PRAGMA user_version`), this
//! library's tables:
//!
//! | At the path | Outcome |
//! |---|---|
//! | nothing | a new store |
//! | nothing, but a non-empty `-wal` or `-journal` beside it | refused: the store's file was removed or moved without its log |
//! | an empty (0-byte) file | refused: a truncated store looks like this |
//! | a file SQLite calls malformed or not a database | refused |
//! | an SQLite database with no tables and `user_version` 0 | refused: a store whose WAL was lost before a checkpoint looks like this |
//! | an SQLite database with no tables and `user_version` N > 0 | refused: an earlier release's store that lost its tables looks like this |
//! | another program's database (its own tables, none of ours, whatever its `user_version`) | refused: a store opened by path keeps a file of its own; use [`SqliteStore::from_connection`] to share one |
//! | a `custody_schema` table that is not one row with an INTEGER version | refused |
//! | schema version N > 0 without all the tables version N has (or `custody_schema` at 0 and no other table of ours) | refused: it held a store and lost them |
//! | a custody store at version N (other tables beside ours are left alone) | opened and migrated |
//! | an earlier release's store (our tables, no `custody_schema`, `user_version` N) | converted once: `custody_schema` is created with version N, then migrated as above |
//! | a newer or unknown version, or a version whose migration does not apply | [`OpenError::NewerSchema`], [`OpenError::UnknownSchema`], [`OpenError::Migration`] |
//!
//! [`SqliteStore::from_connection`] checks the application's database the same way,
//! with one difference: a database with neither `custody_schema` nor any table of ours
//! (empty, or holding only the application's tables) gets a new store beside what it
//! holds, whatever its `user_version` says. A database that held a store is refused as
//! above, never given its tables again empty. It takes the database as the connection
//! sees it, so an empty (0-byte) file, which is what `Connection::open` makes of a path
//! where nothing is, is an empty database there, and gets a new store.
//!
//! [`SqliteStore::open`] never creates a store in a file that is already there: a caller
//! that made an empty file itself (a `tempfile::NamedTempFile`, say) passes a path where
//! nothing exists instead, deletes the file first, or opens it on a connection of its own
//! with [`SqliteStore::from_connection`]. A new store is built beside its path under
//! a name of its own (`<name>.<process>-<n>.creating`), migrated, synced and linked into
//! place in one step (a hard link, which never replaces a file; a rename on file systems
//! without hard links), so a process killed while creating leaves nothing at the path
//! (at most that temporary file, which the next open ignores), and, with hard links, two
//! processes creating one path at once share the store that was linked first. `path` is
//! always a file name: URIs and `:memory:` are not taken.
//!
//! Later, while the store is in use, an error SQLite reports as `SQLITE_CORRUPT` or
//! `SQLITE_NOTADB` (any extended code; by code, not by message) is the storage traits'
//! `Corrupt` error naming the `database file`, never `Unavailable`: retrying reads the
//! same bytes. Busy, locked, IO and full-disk errors stay `Unavailable`.
//!
//! # Tables
//!
//! - `workspace_chat_outbox`: one row per queued entry, keyed by (session, queue ID),
//!   with its operation ID, its position and the rest of the entry as JSON.
//! - `workspace_chat_outbox_operation_identity`: one row per operation ever claimed in a
//!   session: its fingerprint, its queue ID, whether it was removed, when it was claimed.
//! - `chat_operation_ledger`: one ledger record per (session, operation), its status in
//!   a column of its own beside the record JSON.
//! - `chat_session_messages`: the route of every session message, by operation and by
//!   (sender session, sender call).
//! - `chat_live_timeline_overlays`: one header per (session, timeline target), its
//!   revision and settlement epoch; `chat_live_timeline_overlay_rows`: one row per
//!   overlay row, keyed by (session, target, block type, block ID);
//!   `chat_live_timeline_overlay_revisions`: the global revision counter (OV-02);
//!   `chat_live_timeline_overlay_deleted_epochs`: the epoch of a deleted target until
//!   its next first write.
//! - `chat_pending_terminal_overlay_cleanups`: the cleanup journal, one row per (session,
//!   run).
//! - `custody_schema` ([`SCHEMA_TABLE`]): one row, `(id, version)` with `id` 1, the
//!   schema version (the number of the last migration applied).
//!
//! No other table, index or pragma of the database is written, apart from the pragmas
//! [`SqliteStore::open`] and [`SqliteStore::open_in_memory`] set (see "Durability"); of
//! the rest, only the list of tables and, where `custody_schema` is not there, `PRAGMA
//! user_version` are read (see "Which files open"). Migrations 4 and 5 use a `TEMP` table of their own (`id_bytes`,
//! `movable`) while they run, and drop it.
//!
//! In the two tables a submit writes, a session, queue or operation ID that ends in a
//! canonical UUID is stored as a 16-byte BLOB; every ID reads back as the exact text it
//! was written as.
//!
//! # Transactions
//!
//! Every write is one `IMMEDIATE` transaction, so each multi-record rule of the catalog
//! (the submit claim, the overlay compare-and-set with the global revision, the
//! session-message route with its entry, ledger-sent then removal across aliases)
//! commits whole or not at all, and a second connection waits for the lock
//! ([`Settings::busy_timeout`]) instead of racing. An overlay update reads the target,
//! applies the change and writes the counter, the header and only the rows the change
//! inserted, replaced or removed, all in one transaction: O(k log n) for k changed rows of
//! an n-row overlay. Each connection keeps the rows of the last
//! [`OVERLAY_CACHE_TARGETS`] targets it read or wrote, and uses them only when the
//! header, read in the same transaction, still holds the revision and epoch they were
//! read at. Hot statements use `prepare_cached`.
//!
//! # Durability
//!
//! Every connection [`SqliteStore::open`] and [`SqliteStore::open_in_memory`] open sets
//! WAL (for files), `foreign_keys`, `busy_timeout`, `synchronous` and the WAL checkpoint
//! size, outside the migrations. [`SqliteStore::from_connection`] sets none of them: the
//! application's connection keeps its own, and they decide what a write survives (see
//! there). [`Synchronous::Full`] is the default: an acknowledged write (a receipt
//! returned, a ledger row stored) survives a process kill and a power loss. [`Synchronous::Normal`] in WAL mode is faster and
//! still survives a process kill at any point, but the last commits before a power loss
//! or OS crash may be lost. A file this library creates gets 2 KiB pages
//! ([`DEFAULT_PAGE_SIZE`]), and the WAL is checkpointed every
//! [`DEFAULT_WAL_AUTOCHECKPOINT_PAGES`] pages; all of these are [`Settings`].
//!
//! # Guarantees
//!
//! - The schema is numbered migrations tracked in the `custody_schema` table, applied on
//!   open, each in one transaction with its new version. A database of a newer or unknown
//!   version is refused, and a version that does not match the database's tables fails
//!   with the stored version and the versions this build knows ([`OpenError`]). A file
//!   that is not a custody store is refused as damaged (see "Which files open").
//!   `PRAGMA user_version` is the application's: it is never written, and read only
//!   where `custody_schema` is not there, to convert a store of an earlier release
//!   (once) or to say why [`SqliteStore::open`] refuses a file without tables.
//! - A file SQLite calls damaged is a `Corrupt` error, on open and on every later call,
//!   never one that says to retry.
//! - Nothing read from the file is trusted: every column value is checked like wire
//!   input (its SQLite type, an integer's range, a boolean's 0 or 1, an overlay row's
//!   JSON against its key columns, a ledger status against its JSON). An outbox row that
//!   does not read back shows as a blocked entry with what it holds and never hides its
//!   neighbours (OB-05); any other unreadable record is a `Corrupt` error naming the
//!   table, the column and the stored value.
//! - A deleted target's settlement epoch is remembered, so the target comes back one
//!   epoch higher and a client that still holds the old epoch reloads
//!   ([`created_epoch`](overlay_core::store::created_epoch)).
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
//!
//! # Features
//!
//! - `bundled` (on by default): SQLite is compiled from source into the crate
//!   (rusqlite's `bundled`), so the build needs a C compiler and no system library.
//!   Without it (`default-features = false`), the system's libsqlite3 is linked, found
//!   with pkg-config (or vcpkg on Windows; `SQLITE3_LIB_DIR` and `SQLITE3_INCLUDE_DIR`
//!   name another one). rusqlite 0.43 needs SQLite 3.45.3 or later: with an older
//!   library (Debian 12 ships 3.40) the build fails to link.
//! - `sqlcipher` (off by default): SQLCipher, SQLite with encryption, is compiled in
//!   instead (rusqlite's `bundled-sqlcipher`, whatever `bundled` says), linked against
//!   OpenSSL's libcrypto (on Debian, `libssl-dev`). The application opens the
//!   connection, sets its key (`PRAGMA key`) and hands it to
//!   [`SqliteStore::from_connection`]; [`SqliteStore::open`] and
//!   [`SqliteStore::open_in_memory`] set no key, so they create unencrypted databases
//!   and refuse an encrypted one as [`OpenError::Corrupt`] (SQLite calls it not a
//!   database), as does `from_connection` with a wrong key or none.
//! - `testing` (off by default): hooks for tests and benchmarks that reach below the
//!   storage traits: `SqliteStore::connection` (the rusqlite connection),
//!   `SqliteStore::open_at` (a file migrated only up to an older version),
//!   `SqliteStore::set_revision_counter`, and the ID codec `IdColumn` with `read_id`.
//!
//! An application that uses rusqlite itself depends on the same rusqlite version
//! (0.43): a program links one `libsqlite3-sys`. Cargo merges the rusqlite features
//! both ask for, so any other rusqlite feature (`bundled-sqlcipher-vendored-openssl`,
//! say) is chosen through the application's own dependency. rusqlite 0.43 needs Rust
//! 1.89, so this crate does too.
//!
//! The one rusqlite type in the public API is `rusqlite::Connection`, which
//! [`SqliteStore::from_connection`] takes and [`SqliteStore::into_connection`] gives
//! back; SQLite's errors stay behind [`SqliteError`]. The crate re-exports [`rusqlite`],
//! so an application without a rusqlite dependency of its own opens the connection
//! with `storage_sqlite::rusqlite::Connection`, and moving to a rusqlite release that is
//! not semver-compatible with 0.43 is a breaking change of this crate.
#![warn(unreachable_pub)]

mod columns;
mod connection;
mod error;
mod id_column;
mod migrations;
mod outbox;
mod overlay;

pub use connection::{
    Settings, SqliteStore, Synchronous, DEFAULT_PAGE_SIZE, DEFAULT_WAL_AUTOCHECKPOINT_PAGES,
};
pub use error::{OpenError, SqliteError};
#[cfg(feature = "testing")]
pub use id_column::{read_id, IdColumn};
pub use migrations::{MIGRATIONS, SCHEMA_TABLE, SCHEMA_VERSION};
pub use overlay_core::store::OVERLAY_CACHE_TARGETS;
/// The rusqlite this crate is built with, for [`SqliteStore::from_connection`].
pub use rusqlite;
