//! The connection and its settings: opening a file, a private in-memory database or the
//! database of a connection the application owns, the pragmas the library's own
//! connections set, and the transactions writes run in.
//!
//! The invariant kept here: [`SqliteStore::open`] creates a store only where no file
//! exists, and a path never names a half-made store. A new store is built beside its
//! path under a name of its own, migrated, synced and then linked into place in one
//! step, so a process killed while creating leaves either nothing at the path or a whole
//! store, and another opener never sees a file in the making. Any file that is there is looked at before
//! anything is written to it, and opened only if it is a custody store: an empty file
//! is a truncated store, not a new one (see the crate docs, "Which files open"). A
//! database that held a custody store (its `custody_schema` table, or an earlier
//! release's `user_version` with this library's tables) is never taken for a new one,
//! whichever way it is opened.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, Transaction, TransactionBehavior};

use crate::error::{open_error, sqlite_error, OpenError, SqliteError};
use crate::migrations::{self, migrate, schema_tables, Stored, SCHEMA_TABLE, SCHEMA_VERSION};
use overlay_core::store::OverlayCache;

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

/// Refuses settings SQLite would ignore or refuse, before any file is touched.
fn check_settings(settings: &Settings) -> Result<(), OpenError> {
    let size = settings.page_size;
    if !(512..=65536).contains(&size) || !size.is_power_of_two() {
        return Err(OpenError::InvalidSetting {
            name: "page_size",
            reason: format!("{size} is not a power of two from 512 to 65536"),
        });
    }
    Ok(())
}

/// Sets the connection's pragmas from `settings`, outside the migrations (they are not
/// part of the schema): the page size of a new database, WAL (for files),
/// `foreign_keys`, `busy_timeout`, `synchronous` and the WAL checkpoint size. The
/// settings were checked ([`check_settings`]).
fn configure(conn: &Connection, settings: &Settings, file: bool) -> Result<(), OpenError> {
    // Before WAL: a new database takes the page size at its first write; an existing one
    // keeps its own.
    conn.pragma_update(None, "page_size", settings.page_size)
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

/// An [`OpenError::Io`] about `path`, for `map_err`.
fn io_error<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> OpenError + 'a {
    move |source| OpenError::Io {
        action,
        path: path.to_owned(),
        source,
    }
}

/// `path` with `suffix` appended to its file name, as SQLite names a file's `-wal` and
/// `-journal`.
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = OsString::from(path.as_os_str());
    name.push(suffix);
    PathBuf::from(name)
}

/// The length of the file at `path`, `None` if there is none.
fn file_len(path: &Path) -> Result<Option<u64>, OpenError> {
    match fs::metadata(path) {
        Ok(meta) => Ok(Some(meta.len())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_error("read the metadata of", path)(e)),
    }
}

/// SQLite's files beside a database that hold its writes: a database file without them
/// loses what they hold.
const SIDE_FILES: [(&str, &str); 2] = [
    ("-wal", "write-ahead log"),
    ("-journal", "rollback journal"),
];

/// Numbers the temporary files this process builds new stores in.
static NEW_STORES: AtomicU64 = AtomicU64::new(0);

/// Creates a store at `path`, where no file is: builds it beside `path` under a name of
/// its own ([`build`]) and links it into place ([`link`]). If another opener linked a
/// store there first, that one is kept and this one dropped.
fn create(path: &Path, settings: &Settings, version: u32) -> Result<(), OpenError> {
    for (suffix, what) in SIDE_FILES {
        let side = with_suffix(path, suffix);
        if let Some(len @ 1..) = file_len(&side)? {
            // SQLite would take this file for the new store's, or delete it.
            return Err(OpenError::Corrupt {
                reason: format!(
                    "the database file does not exist, but its {what} ({}) holds {len} bytes: \
                     the store's file was removed or moved without it; put the file back \
                     beside it (a new store here would throw it away)",
                    side.display()
                ),
            });
        }
    }
    let Some(name) = path.file_name() else {
        return Err(io_error("create", path)(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the path does not end in a file name",
        )));
    };
    let mut temp = name.to_os_string();
    temp.push(format!(
        ".{}-{}.creating",
        std::process::id(),
        NEW_STORES.fetch_add(1, Ordering::Relaxed)
    ));
    let temp = path.with_file_name(temp);
    let made = build(&temp, settings, version).and_then(|()| link(&temp, path));
    // The temporary name goes in every case (after `link`, the store has its own name;
    // after a rename it is gone already). A failure to remove it is reported only when
    // nothing else failed first.
    let removed = match fs::remove_file(&temp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    };
    made?;
    removed.map_err(io_error("remove the temporary file", &temp))?;
    sync_directory(path)
}

/// Builds a new store migrated to `version` in the file `temp`, which nobody else
/// opens, and syncs it: no journal file, no sync per migration, one sync at the end.
fn build(temp: &Path, settings: &Settings, version: u32) -> Result<(), OpenError> {
    // A file left by a killed process that had this process's ID is not a store.
    match fs::remove_file(temp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            return Err(io_error("remove the stale temporary file", temp)(e))
        }
        _ => {}
    }
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let mut conn = Connection::open_with_flags(temp, flags).map_err(open_error)?;
    conn.pragma_update(None, "page_size", settings.page_size)
        .map_err(open_error)?;
    let _mode: String = conn
        .query_row("PRAGMA journal_mode = MEMORY", [], |r| r.get(0))
        .map_err(open_error)?;
    conn.pragma_update(None, "synchronous", "OFF")
        .map_err(open_error)?;
    conn.pragma_update(None, "foreign_keys", "ON")
        .map_err(open_error)?;
    migrate(&mut conn, version)?;
    conn.close().map_err(|(_, e)| open_error(e))?;
    fs::OpenOptions::new()
        .write(true)
        .open(temp)
        .and_then(|f| f.sync_all())
        .map_err(io_error("sync", temp))
}

/// Gives the built store at `temp` the name `path` in one step, without replacing a file
/// that is there: a hard link, which fails if `path` exists (another opener created its
/// store first: that one is kept). On a file system without hard links, a rename, as
/// atomic, but it would replace a store another opener moved there in the same instant.
fn link(temp: &Path, path: &Path) -> Result<(), OpenError> {
    match fs::hard_link(temp, path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(_) if file_len(path)?.is_some() => Ok(()),
        Err(_) => fs::rename(temp, path).map_err(io_error("move the new store to", path)),
    }
}

/// Syncs the directory of `path`, so the new store's name survives a power loss.
#[cfg(unix)]
fn sync_directory(path: &Path) -> Result<(), OpenError> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_error("sync the directory of", path))
}

/// Other systems sync a directory entry with the file, or offer no way to sync it.
#[cfg(not(unix))]
fn sync_directory(_: &Path) -> Result<(), OpenError> {
    Ok(())
}

/// At most this many names of another program's tables are shown in a refusal.
const SHOWN_TABLES: usize = 5;

/// Who else keeps tables in the database a store opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    /// Nobody: [`SqliteStore::open`] keeps a file of its own, so an existing file
    /// without this library's schema is refused.
    Store,
    /// The application ([`SqliteStore::from_connection`]): a database without this
    /// library's schema gets it beside the application's tables.
    App,
}

/// Refuses an existing database that is not a custody store (for [`Owner::Store`]) or
/// that held one and lost it (for both), before anything is written to it (see the
/// crate docs, "Which files open"). SQLite's verdict that the file is damaged or not a
/// database is [`OpenError::Corrupt`] too ([`open_error`]). A newer or unknown version
/// and a version whose migration does not apply are left to [`migrate`], which names
/// them.
fn check_custody_file(conn: &Connection, owner: Owner) -> Result<(), OpenError> {
    let found = migrations::found(conn)?;
    let tables = &found.tables;
    let versions = schema_tables().map_err(open_error)?;
    let corrupt = |reason: String| Err(OpenError::Corrupt { reason });
    let (version, kept_in) = match found.stored {
        Stored::Absent if owner == Owner::App => return Ok(()),
        Stored::Absent => return refuse_foreign(conn, tables, versions),
        Stored::Table(version) => (version, SCHEMA_TABLE),
        Stored::UserVersion(version) => (version, "user_version"),
    };
    match u32::try_from(version) {
        Ok(0) => {
            let ours: BTreeSet<&String> = versions.iter().flatten().collect();
            if tables.iter().any(|t| ours.contains(t)) {
                // Our tables under a version of 0: the migration says what is wrong.
                Ok(())
            } else {
                // Only the schema table, which is written with the first migration.
                corrupt(format!(
                    "its {SCHEMA_TABLE} table says schema version 0 and it holds none of \
                     this library's other tables; this library writes that table only \
                     with its first migration, so the database held a custody store and \
                     lost it"
                ))
            }
        }
        Ok(version) if version <= SCHEMA_VERSION => {
            let missing = missing_tables(tables, versions, version);
            if missing.is_empty() {
                Ok(())
            } else {
                corrupt(format!(
                    "it says schema version {version} (in its {kept_in}) but lacks the \
                     tables {} that version has: it held a custody store and lost them",
                    missing.join(", ")
                ))
            }
        }
        // Newer or unknown: `migrate` names it.
        _ => Ok(()),
    }
}

/// The tables of schema `version` (from 1) that `tables` lacks, in name order.
fn missing_tables<'a>(
    tables: &'a BTreeSet<String>,
    versions: &'a [BTreeSet<String>],
    version: u32,
) -> Vec<&'a str> {
    versions
        .get(version as usize - 1)
        .map(|t| t.difference(tables).map(String::as_str).collect())
        .unwrap_or_default()
}

/// Refuses an existing file that holds neither the schema table nor any of this
/// library's tables, for [`SqliteStore::open`]: a custody store is created only where
/// no file exists. `PRAGMA user_version` is read to tell a file that kept an earlier
/// release's version (and lost its tables) from a blank one.
fn refuse_foreign(
    conn: &Connection,
    tables: &BTreeSet<String>,
    versions: &[BTreeSet<String>],
) -> Result<(), OpenError> {
    let corrupt = |reason: String| Err(OpenError::Corrupt { reason });
    if !tables.is_empty() {
        // In name order (a `BTreeSet`).
        let shown: Vec<&str> = tables
            .iter()
            .take(SHOWN_TABLES)
            .map(String::as_str)
            .collect();
        let more = tables.len().saturating_sub(SHOWN_TABLES);
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        return corrupt(format!(
            "it is another program's SQLite database: it holds the tables {}{more}, none \
             of this library's; SqliteStore::open keeps a file of its own, and a store \
             beside another program's tables is opened with SqliteStore::from_connection",
            shown.join(", ")
        ));
    }
    match u32::try_from(migrations::user_version(conn)?) {
        Ok(0) => corrupt(
            "it is an SQLite database with no tables and schema version 0, not a custody \
             store: a store whose write-ahead log (-wal) was lost before a checkpoint \
             looks like this, as does an empty database another program made; a new store \
             is created only where no file exists"
                .into(),
        ),
        Ok(version) if version <= SCHEMA_VERSION => corrupt(format!(
            "it has no tables, but its user_version says schema version {version}, where \
             earlier releases of this library kept it; it lacks the tables {} that version \
             has: it held a custody store and lost them",
            missing_tables(tables, versions, version).join(", ")
        )),
        _ => corrupt(
            "it is an SQLite database with no tables and a user_version that is no schema \
             version of this library, not a custody store; a new store is created only \
             where no file exists"
                .into(),
        ),
    }
}

impl SqliteStore {
    /// Opens the custody store in the file at `path` and migrates it to
    /// [`SCHEMA_VERSION`]; where no file exists, creates one first.
    ///
    /// A file that is there opens only if it is a custody store: an empty (0-byte) file,
    /// an SQLite database without this library's tables, a file whose schema version
    /// names tables it does not hold, and a file SQLite calls malformed or not a
    /// database are [`OpenError::Corrupt`], and nothing is written to them. See the crate
    /// docs, "Which files open". `path` is a file name, never a URI; for a private
    /// in-memory database use [`SqliteStore::open_in_memory`], and for a store beside an
    /// application's own tables [`SqliteStore::from_connection`].
    ///
    /// The connection gets the pragmas of `settings` (see the crate docs,
    /// "Durability"), WAL among them: on a database an application shares, that changes
    /// the journal mode of its file too.
    pub fn open(path: impl AsRef<Path>, settings: Settings) -> Result<Self, OpenError> {
        Self::open_file(path.as_ref(), settings, SCHEMA_VERSION)
    }

    /// Opens the file migrated only up to `version`, from 1 (to write databases of an
    /// older schema in tests of the upgrade path). The same files open as with
    /// [`SqliteStore::open`].
    #[cfg(any(test, feature = "testing"))]
    pub fn open_at(
        path: impl AsRef<Path>,
        settings: Settings,
        version: u32,
    ) -> Result<Self, OpenError> {
        Self::open_file(path.as_ref(), settings, version)
    }

    /// Creates the file if none is there, refuses one that is not a custody store, sets
    /// its pragmas and migrates it up to `version`.
    fn open_file(path: &Path, settings: Settings, version: u32) -> Result<Self, OpenError> {
        check_settings(&settings)?;
        let special = path.as_os_str().is_empty() || path.as_os_str() == ":memory:";
        if special {
            return Err(io_error("open", path)(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a file name (SQLite would open a private database): use \
                 SqliteStore::open_in_memory",
            )));
        }
        if file_len(path)?.is_none() {
            create(path, &settings, version)?;
        }
        if file_len(path)? == Some(0) {
            // Before SQLite opens it: on a 0-page file SQLite deletes the `-wal` beside it.
            let wal = with_suffix(path, "-wal");
            let kept = match file_len(&wal)? {
                Some(len @ 1..) => format!(
                    "; its write-ahead log ({}) holds {len} bytes",
                    wal.display()
                ),
                _ => String::new(),
            };
            return Err(OpenError::Corrupt {
                reason: format!(
                    "the file is empty (0 bytes), as a store cut short by a failed copy or \
                     write is; a new store is created only where no file exists{kept}"
                ),
            });
        }
        // No `SQLITE_OPEN_CREATE`: the file was there or was just linked into place. No
        // `SQLITE_OPEN_URI`: the path is the file that was looked at.
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let mut conn = Connection::open_with_flags(path, flags).map_err(open_error)?;
        // Before the first read: a new store's opener may hold the lock while it turns
        // on WAL.
        conn.busy_timeout(settings.busy_timeout)
            .map_err(open_error)?;
        check_custody_file(&conn, Owner::Store)?;
        configure(&conn, &settings, true)?;
        migrate(&mut conn, version)?;
        Ok(SqliteStore {
            conn,
            overlays: OverlayCache::default(),
        })
    }

    /// A private in-memory database (`:memory:`), migrated.
    pub fn open_in_memory(settings: Settings) -> Result<Self, OpenError> {
        check_settings(&settings)?;
        let mut conn = Connection::open_in_memory().map_err(open_error)?;
        configure(&conn, &settings, false)?;
        migrate(&mut conn, SCHEMA_VERSION)?;
        Ok(SqliteStore {
            conn,
            overlays: OverlayCache::default(),
        })
    }

    /// Opens the custody store in the database of `conn`, a connection the application
    /// opened and may share the database with, and migrates it to [`SCHEMA_VERSION`].
    ///
    /// A database without this library's schema (no [`SCHEMA_TABLE`] and none of its
    /// tables) gets it: the migrations create this library's tables and the schema
    /// table beside the application's own, which are left alone, as is `PRAGMA
    /// user_version`. A database that held a custody store is opened only if it still
    /// is one (see the crate docs, "Which files open"); a store written by
    /// [`SqliteStore::open`] of an earlier release, with its version in
    /// `user_version`, is converted once and opens here too.
    ///
    /// No pragma is set, and [`Settings`] does not apply: the journal mode,
    /// `synchronous`, `foreign_keys` (this library's tables have no foreign keys),
    /// `busy_timeout`, the page size and the checkpoint size stay as the application
    /// set them, since each is the application's choice for the whole database and the
    /// tables work under any of them. What a write survives is then the connection's:
    ///
    /// - `synchronous = FULL` (SQLite's default) keeps an acknowledged write through a
    ///   process kill and a power loss, in WAL mode (what [`SqliteStore::open`] sets) and
    ///   with a rollback journal alike;
    /// - `NORMAL` in WAL mode keeps it through a process kill, but the last commits
    ///   before a power loss may be lost; `OFF`, or `NORMAL` with a rollback journal, can
    ///   leave the file damaged after a power loss;
    /// - `journal_mode = OFF` or `MEMORY` gives up atomic commits: a process killed in
    ///   the middle of a write can leave it half done or the file damaged, where the
    ///   storage traits count on every write being whole or absent.
    ///
    /// Every write is an `IMMEDIATE` transaction, so when other connections write to the
    /// database, set a `busy_timeout` on this one first, or a write that meets their lock
    /// fails at once as `Unavailable`. With the `sqlcipher` feature, set the key (`PRAGMA
    /// key`) before handing the connection over.
    ///
    /// `conn` must not be inside a transaction (SQLite refuses the migrations'), and is
    /// the store's from here on (get it back with [`SqliteStore::into_connection`]); when
    /// opening fails, it is closed.
    ///
    /// ```
    /// use rusqlite::Connection;
    /// use storage_sqlite::{SqliteStore, SCHEMA_VERSION};
    ///
    /// let conn = Connection::open_in_memory().unwrap();
    /// conn.execute_batch("CREATE TABLE notes (body TEXT); PRAGMA user_version = 7;")
    ///     .unwrap();
    /// let store = SqliteStore::from_connection(conn).unwrap();
    /// assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    /// let conn = store.into_connection();
    /// let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
    /// assert_eq!(version, 7);
    /// ```
    pub fn from_connection(mut conn: Connection) -> Result<Self, OpenError> {
        check_custody_file(&conn, Owner::App)?;
        migrate(&mut conn, SCHEMA_VERSION)?;
        Ok(SqliteStore {
            conn,
            overlays: OverlayCache::default(),
        })
    }

    /// The connection, given back: the store is closed, the connection stays open.
    pub fn into_connection(self) -> Connection {
        self.conn
    }

    /// The schema version of the database (the row of its [`SCHEMA_TABLE`]).
    pub fn schema_version(&self) -> Result<u32, SqliteError> {
        migrations::schema_version(&self.conn).map_err(sqlite_error)
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
