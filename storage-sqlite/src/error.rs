//! Errors: why a database does not open ([`OpenError`]), SQLite's own errors
//! ([`SqliteError`]), and the mapping of SQLite's errors and unreadable values onto the
//! typed errors of the storage traits.
//!
//! The invariant kept here: SQLite's verdict that the file is damaged
//! (`SQLITE_CORRUPT`, `SQLITE_NOTADB` and their extended codes, told apart by code,
//! never by message) is a `Corrupt` error at every boundary, never the "retry later"
//! of `Unavailable` or a plain [`OpenError::Sqlite`]: retrying reads the same bytes.

use std::path::PathBuf;

use outbox_core::store::OutboxError;
use overlay_core::store::OverlayError;

use crate::columns::Refused;

/// An error SQLite reported while opening, configuring, migrating or reading the file.
/// Its text is SQLite's message.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct SqliteError(rusqlite::Error);

/// Why a database could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// SQLite refused (the file cannot be opened, is locked, an IO error). A file SQLite
    /// calls damaged is [`OpenError::Corrupt`] instead.
    #[error("cannot open the database: {0}")]
    Sqlite(#[from] SqliteError),
    /// The file is damaged or is not a custody store, so it is not opened: retrying reads
    /// the same bytes, and nothing was written to it. The reason says which: SQLite
    /// calls it malformed or not a database; it is empty (0 bytes, as a truncated store
    /// is); it is missing while its write-ahead log is there; it is an SQLite database
    /// without this library's tables (empty, or another program's, which only
    /// [`SqliteStore::open`](crate::SqliteStore::open) refuses); its `custody_schema`
    /// table does not read as one row with an integer version; or its schema version
    /// names tables it does not hold. See the crate docs, "Which files open".
    #[error("the database file is damaged or not a custody store: {reason}")]
    Corrupt {
        /// What is wrong with the file.
        reason: String,
    },
    /// The file system refused while a new store was made or an existing one looked at
    /// (reading the file's metadata, writing, syncing or linking a new file).
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file it was done to.
        path: PathBuf,
        /// The file system's error.
        #[source]
        source: std::io::Error,
    },
    /// The file was written by a newer schema.
    #[error("the database has schema version {found}, newer than {supported}")]
    NewerSchema {
        /// What the file says.
        found: u32,
        /// What this build knows.
        supported: u32,
    },
    /// The stored schema version (in the `custody_schema` table, or in the
    /// `user_version` of a store written by an earlier release) is not one this build
    /// knows (it is negative or out of range).
    #[error(
        "the database says schema version {found}; this build knows versions 0 to {supported}"
    )]
    UnknownSchema {
        /// What the file says.
        found: i64,
        /// The newest version this build knows.
        supported: u32,
    },
    /// A migration did not apply to the database: its stored schema version does not
    /// match the tables it holds. Nothing of that migration was written.
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
        /// The field of [`Settings`](crate::Settings).
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

/// SQLite's error as a [`SqliteError`], for `map_err`.
pub(crate) fn sqlite_error(e: rusqlite::Error) -> SqliteError {
    SqliteError(e)
}

/// Whether SQLite says the file is damaged: `SQLITE_CORRUPT` or `SQLITE_NOTADB`, with
/// any extended code (rusqlite folds those into their primary [`ErrorCode`]). Busy,
/// locked, IO, full-disk and every other code are not.
///
/// [`ErrorCode`]: rusqlite::ErrorCode
pub(crate) fn is_damage(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase)
    )
}

/// What a `Corrupt` error from SQLite's own verdict names as the damaged record.
pub(crate) const DAMAGED_FILE: &str = "database file";

/// The reason of an error SQLite gave about a damaged file: its message, then the
/// primary and extended code.
fn damage_reason(e: &rusqlite::Error) -> String {
    match e {
        rusqlite::Error::SqliteFailure(code, msg) => {
            let text = msg.clone().unwrap_or_else(|| code.to_string());
            let extended = code.extended_code;
            format!(
                "{text} (SQLite code {}, extended {extended})",
                extended & 0xff
            )
        }
        other => other.to_string(),
    }
}

/// SQLite's error as an [`OpenError`], for `map_err`: [`OpenError::Corrupt`] when SQLite
/// says the file is damaged, [`OpenError::Sqlite`] otherwise.
pub(crate) fn open_error(e: rusqlite::Error) -> OpenError {
    if is_damage(&e) {
        return OpenError::Corrupt {
            reason: damage_reason(&e),
        };
    }
    OpenError::Sqlite(SqliteError(e))
}

/// SQLite's error as the overlay store's: `Corrupt` when SQLite says the file is damaged,
/// `Unavailable` (retry later) otherwise.
pub(crate) fn ov(e: rusqlite::Error) -> OverlayError {
    if is_damage(&e) {
        return OverlayError::Corrupt {
            what: DAMAGED_FILE.into(),
            reason: damage_reason(&e),
        };
    }
    OverlayError::Unavailable(e.to_string())
}

/// SQLite's error as the outbox store's: `Corrupt` when SQLite says the file is damaged,
/// `Unavailable` (retry later, with SQLite's error as its source) otherwise.
pub(crate) fn ob(e: rusqlite::Error) -> OutboxError {
    if is_damage(&e) {
        return OutboxError::Corrupt {
            what: DAMAGED_FILE.into(),
            reason: damage_reason(&e),
        };
    }
    OutboxError::backend(e)
}

/// The error for a stored `what` that does not read back, for `map_err`.
pub(crate) fn corrupt(what: impl Into<String>) -> impl FnOnce(String) -> OutboxError {
    move |reason| OutboxError::Corrupt {
        what: what.into(),
        reason,
    }
}

/// The same for overlay storage.
pub(crate) fn overlay_corrupt(what: impl Into<String>) -> impl FnOnce(String) -> OverlayError {
    move |reason| OverlayError::Corrupt {
        what: what.into(),
        reason,
    }
}

/// A refused column value as the outbox's typed error about `what`, for `map_err`.
pub(crate) fn refused(what: impl Into<String>) -> impl FnOnce(Refused) -> OutboxError {
    move |r| corrupt(what)(r.to_string())
}

/// The same for overlay storage.
pub(crate) fn overlay_refused(what: impl Into<String>) -> impl FnOnce(Refused) -> OverlayError {
    move |r| overlay_corrupt(what)(r.to_string())
}

pub(crate) fn to_json<T: serde::Serialize>(v: &T) -> Result<String, String> {
    serde_json::to_string(v).map_err(|e| e.to_string())
}

pub(crate) fn id<T>(
    what: &'static str,
    v: Result<T, timeline_core::key::KeyError>,
) -> Result<T, OutboxError> {
    v.map_err(|e| corrupt(what)(e.to_string()))
}

/// An ID column as read by [`read_id`](crate::id_column::read_id), made into its type.
pub(crate) fn stored_id<T>(
    what: &'static str,
    read: Result<String, String>,
    make: impl FnOnce(String) -> Result<T, timeline_core::key::KeyError>,
) -> Result<T, OutboxError> {
    id(what, make(read.map_err(corrupt(what))?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::store::OutboxErrorKind;
    use rusqlite::ffi;

    fn failure(code: i32, msg: &str) -> rusqlite::Error {
        rusqlite::Error::SqliteFailure(ffi::Error::new(code), Some(msg.into()))
    }

    // ST-02, ST-01: SQLite's damage codes, extended ones too, are `Corrupt` at every
    // boundary; busy, locked, IO, full and read-only stay `Unavailable` (or a plain
    // `OpenError::Sqlite`), whatever their message says: the code decides, not the text.
    #[test]
    fn damage_is_told_by_code_not_by_message() {
        let damaged = [
            ffi::SQLITE_CORRUPT,
            ffi::SQLITE_CORRUPT_VTAB,
            ffi::SQLITE_CORRUPT | (2 << 8), // SQLITE_CORRUPT_SEQUENCE
            ffi::SQLITE_CORRUPT | (3 << 8), // SQLITE_CORRUPT_INDEX
            ffi::SQLITE_NOTADB,
        ];
        for code in damaged {
            let e = || failure(code, "some message");
            assert_eq!(ob(e()).kind(), OutboxErrorKind::Corrupt, "{code}");
            assert!(
                matches!(ov(e()), OverlayError::Corrupt { ref what, .. } if what == DAMAGED_FILE),
                "{code}"
            );
            let reason = match open_error(e()) {
                OpenError::Corrupt { reason } => reason,
                other => panic!("{code}: {other:?}"),
            };
            assert!(reason.starts_with("some message"), "{reason}");
            assert!(reason.contains(&format!("extended {code}")), "{reason}");
        }
        let transient = [
            ffi::SQLITE_BUSY,
            ffi::SQLITE_BUSY_SNAPSHOT,
            ffi::SQLITE_LOCKED,
            ffi::SQLITE_IOERR,
            ffi::SQLITE_IOERR_SHORT_READ,
            ffi::SQLITE_FULL,
            ffi::SQLITE_READONLY,
            ffi::SQLITE_CANTOPEN,
        ];
        for code in transient {
            // The message of a damaged file on a code that is not one.
            let e = || failure(code, "database disk image is malformed");
            assert_eq!(ob(e()).kind(), OutboxErrorKind::Unavailable, "{code}");
            assert!(matches!(ov(e()), OverlayError::Unavailable(_)), "{code}");
            assert!(matches!(open_error(e()), OpenError::Sqlite(_)), "{code}");
        }
    }
}
