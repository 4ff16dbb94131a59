//! Errors: why a database does not open ([`OpenError`]), SQLite's own errors
//! ([`SqliteError`]), and the mapping of SQLite's errors and unreadable values onto the
//! typed errors of the storage traits.

use outbox_core::store::StoreError as OutboxError;
use overlay_core::store::StoreError as OverlayError;

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
    /// SQLite refused.
    #[error("cannot open the database: {0}")]
    Sqlite(#[from] SqliteError),
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

/// SQLite's error as an [`OpenError::Sqlite`], for `map_err`.
pub(crate) fn open_error(e: rusqlite::Error) -> OpenError {
    OpenError::Sqlite(SqliteError(e))
}

pub(crate) fn ov(e: rusqlite::Error) -> OverlayError {
    OverlayError::Unavailable(e.to_string())
}

pub(crate) fn ob(e: rusqlite::Error) -> OutboxError {
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
