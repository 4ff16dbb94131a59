//! The crate's own error for a failure of the server or the connection.

use std::error::Error as _;

/// A failure of the database server or of the connection to it, with what the driver
/// said as data: which kind of failure, the message, and for an error the server sent
/// its SQLSTATE code.
///
/// Its [`source`](std::error::Error::source) is the driver's own error, for a report
/// of the whole chain; the type behind it is not part of this crate's API. The outbox's
/// [`Unavailable`](outbox_core::store::OutboxError::Unavailable) errors carry a
/// `DatabaseError` as their source:
///
/// ```no_run
/// # fn f(err: outbox_core::store::OutboxError) {
/// use std::error::Error as _;
/// use storage_postgres::DatabaseError;
///
/// let db = err.source().and_then(|s| s.downcast_ref::<DatabaseError>());
/// if db.and_then(DatabaseError::code) == Some("55P03") {
///     // lock_timeout: another connection held the row too long
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct DatabaseError {
    kind: DatabaseErrorKind,
    message: String,
    code: Option<String>,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

/// What kind of failure a [`DatabaseError`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DatabaseErrorKind {
    /// The server answered with an error; [`DatabaseError::code`] is its SQLSTATE.
    Server,
    /// The server could not be reached, did not answer in time, or the connection
    /// broke.
    Connection,
    /// TLS could not be set up: the server offers none, or its certificate did not
    /// verify (an unknown issuer, another host's name, expired).
    Tls,
    /// The connection parameters do not parse or do not fit together.
    Config,
    /// Anything else the driver reports (an answer it could not read, a failed
    /// authentication exchange).
    Other,
}

impl DatabaseError {
    /// The driver's error as ours.
    pub(crate) fn from_driver(e: postgres::Error) -> DatabaseError {
        DatabaseError {
            kind: kind_of(&e),
            message: pg_message(&e),
            code: e.code().map(|c| c.code().to_owned()),
            source: Some(Box::new(e)),
        }
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> DatabaseErrorKind {
        self.kind
    }

    /// The message: for an error the server sent, its severity, SQLSTATE and text
    /// (`ERROR 55P03: canceling statement due to lock timeout`); for any other, the
    /// driver's description with its causes.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The SQLSTATE code of an error the server sent (five characters, `40P01` for a
    /// deadlock); `None` for a failure of the connection or the client.
    pub fn code(&self) -> Option<&str> {
        self.code.as_deref()
    }
}

impl std::fmt::Display for DatabaseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for DatabaseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|e| e as _)
    }
}

/// The kind of a driver error. The driver keeps its own kinds private but names each
/// with a fixed text, which is what this reads (pinned by the tests).
fn kind_of(e: &postgres::Error) -> DatabaseErrorKind {
    if e.as_db_error().is_some() {
        return DatabaseErrorKind::Server;
    }
    if e.is_closed() {
        return DatabaseErrorKind::Connection;
    }
    match e.to_string().as_str() {
        "error performing TLS handshake" => DatabaseErrorKind::Tls,
        "error connecting to server"
        | "timeout waiting for server"
        | "error communicating with the server" => DatabaseErrorKind::Connection,
        "invalid connection string" | "invalid configuration" => DatabaseErrorKind::Config,
        _ => DatabaseErrorKind::Other,
    }
}

/// The server's error as a caller reads it: severity, SQLSTATE and message for an error
/// the server sent, the chain of causes for any other (a broken connection, a timeout).
pub(crate) fn pg_message(e: &postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{} {}: {}", db.severity(), db.code().code(), db.message());
    }
    let mut message = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        message.push_str(": ");
        message.push_str(&c.to_string());
        cause = c.source();
    }
    message
}

/// The outbox's error for a failure of the server or the connection, with a
/// [`DatabaseError`] as its source.
pub(crate) fn ob(e: postgres::Error) -> outbox_core::store::OutboxError {
    let e = DatabaseError::from_driver(e);
    outbox_core::store::OutboxError::Unavailable {
        message: e.message().to_owned(),
        source: Some(std::sync::Arc::new(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_string_that_does_not_parse_is_a_config_error() {
        let e = "port=not-a-number"
            .parse::<postgres::Config>()
            .map(|_| ())
            .unwrap_err();
        let e = DatabaseError::from_driver(e);
        assert_eq!(e.kind(), DatabaseErrorKind::Config);
        assert_eq!(e.code(), None);
        assert!(e.message().starts_with("invalid connection string"), "{e}");
        assert!(e.source().is_some());
    }
}
