//! The connection and its settings: opening a file or a private in-memory database,
//! the pragmas every connection sets, and the transactions writes run in.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, Transaction, TransactionBehavior};

use crate::error::{open_error, sqlite_error, OpenError, SqliteError};
use crate::migrations::{migrate, user_version, SCHEMA_VERSION};
use crate::overlay::OverlayCache;

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

/// One connection to the custody database. See the crate docs.
#[derive(Debug)]
pub struct SqliteStore {
    pub(crate) conn: Connection,
    /// Overlays this connection read or wrote (see [`OverlayCache`]).
    pub(crate) overlays: OverlayCache,
}

/// Sets the connection's pragmas from `settings`, outside the migrations (they are not
/// part of the schema): the page size of a new file, WAL (for files), `foreign_keys`,
/// `busy_timeout`, `synchronous` and the WAL checkpoint size.
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
    conn.pragma_update(None, "page_size", size)
        .map_err(open_error)?;
    if file {
        // WAL lets readers and one writer work at once; it is a property of the file.
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(open_error)?;
        debug_assert_eq!(mode.to_lowercase(), "wal");
    }
    conn.pragma_update(None, "foreign_keys", "ON")
        .map_err(open_error)?;
    conn.busy_timeout(settings.busy_timeout)
        .map_err(open_error)?;
    let sync = match settings.synchronous {
        Synchronous::Normal => "NORMAL",
        Synchronous::Full => "FULL",
    };
    conn.pragma_update(None, "synchronous", sync)
        .map_err(open_error)?;
    conn.pragma_update(
        None,
        "wal_autocheckpoint",
        settings.wal_autocheckpoint_pages,
    )
    .map_err(open_error)?;
    Ok(())
}

impl SqliteStore {
    /// Opens (or creates) the database file and migrates it to [`SCHEMA_VERSION`].
    pub fn open(path: impl AsRef<Path>, settings: Settings) -> Result<Self, OpenError> {
        Self::open_file(path.as_ref(), settings, SCHEMA_VERSION)
    }

    /// Opens the file migrated only up to `version` (to write databases of an older
    /// schema in tests of the upgrade path).
    #[cfg(any(test, feature = "testing"))]
    pub fn open_at(
        path: impl AsRef<Path>,
        settings: Settings,
        version: u32,
    ) -> Result<Self, OpenError> {
        Self::open_file(path.as_ref(), settings, version)
    }

    /// Opens the file, sets its pragmas and migrates it up to `version`.
    fn open_file(path: &Path, settings: Settings, version: u32) -> Result<Self, OpenError> {
        let mut conn = Connection::open(path).map_err(open_error)?;
        configure(&conn, &settings, true)?;
        migrate(&mut conn, version)?;
        Ok(SqliteStore {
            conn,
            overlays: OverlayCache::default(),
        })
    }

    /// A private in-memory database (`:memory:`), migrated.
    pub fn open_in_memory(settings: Settings) -> Result<Self, OpenError> {
        let mut conn = Connection::open_in_memory().map_err(open_error)?;
        configure(&conn, &settings, false)?;
        migrate(&mut conn, SCHEMA_VERSION)?;
        Ok(SqliteStore {
            conn,
            overlays: OverlayCache::default(),
        })
    }

    /// The schema version of the file (its `user_version`).
    pub fn schema_version(&self) -> Result<u32, SqliteError> {
        user_version(&self.conn).map_err(sqlite_error)
    }

    /// The connection (for inspection in tests and tools).
    #[cfg(any(test, feature = "testing"))]
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// Begins an `IMMEDIATE` transaction: the write lock is taken at once.
    pub(crate) fn write(&mut self) -> rusqlite::Result<Transaction<'_>> {
        self.conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
    }

    /// Runs one write statement in its own `IMMEDIATE` transaction; the rows it changed.
    pub(crate) fn write_one(
        &mut self,
        sql: &str,
        params: impl rusqlite::Params,
    ) -> rusqlite::Result<usize> {
        let tx = self.write()?;
        let changed = tx.prepare_cached(sql)?.execute(params)?;
        tx.commit()?;
        Ok(changed)
    }
}
