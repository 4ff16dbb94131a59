//! # storage-postgres
//!
//! Every storage trait of the core crates on PostgreSQL 13 or newer, for hosts that share
//! one database: [`overlay_core::store::OverlayStore`], [`overlay_core::store::CleanupJournal`]
//! and [`outbox_core::store::OutboxStore`], with the seed's tables and the rules of the
//! SQLite backend (ST-01 to ST-04), and beside them what several hosts need that the
//! traits do not cover: a shared run registry with leases and a per-session lease that
//! says which host drains a session ([`hosts`]).
//!
//! ```no_run
//! use outbox_core::store::OutboxStore;
//! use storage_postgres::{PostgresStore, Settings};
//!
//! let mut store = PostgresStore::connect(
//!     "host=/run/postgresql user=custody dbname=custody",
//!     Settings::default(),
//! )?;
//! assert_eq!(store.schema_version()?, storage_postgres::SCHEMA_VERSION);
//! assert!(store.outbox_sessions()?.is_empty());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # The client
//!
//! The synchronous [`postgres`] crate. The storage traits are synchronous `&mut self`
//! methods, called by synchronous machines, one connection per store, one statement at
//! a time; `postgres` is exactly `tokio-postgres` behind a blocking facade (it drives the
//! asynchronous client on a private single-threaded runtime), maintained with it. A
//! facade of our own over `tokio-postgres` would gain nothing and would need its own
//! runtime handling; a host written on tokio can still run a store on a blocking thread.
//! No type of the driver appears in this crate's API: connections are described by
//! [`ConnectOptions`] and [`Settings`], failures by [`OpenError`] and [`DatabaseError`],
//! so the driver can change without a change of this API.
//!
//! # Connecting
//!
//! [`PostgresStore::connect`] takes a connection string (key=value pairs or a
//! `postgres://` URL); [`PostgresStore::open`] takes [`ConnectOptions`], parsed from a
//! string or built from host, port, user, password, database and server options. The
//! [`Settings`] say the rest: durability, lock and idle timeouts, the connect timeout,
//! the `application_name`, the leases, and TLS.
//!
//! # TLS
//!
//! Plain connections are the default ([`TlsMode::Disable`]): use a Unix socket or a
//! trusted network. With the crate's `tls` feature (off by default), [`TlsMode::Require`]
//! connects through rustls (with its `ring` provider, so nothing needs cmake) or not at
//! all: the server must offer TLS and present a certificate that chains to a trusted root
//! and names the host (or its IP address); no connection falls back to plain. The trusted
//! roots are the platform's (`rustls-native-certs`), unless [`Tls::system_roots`] is off,
//! and those given as PEM in [`Tls::extra_roots`], for a server whose certificate a
//! private CA signed:
//!
//! ```no_run
//! use storage_postgres::{ConnectOptions, PostgresStore, Settings, Tls};
//!
//! let mut settings = Settings::default();
//! settings.tls = Tls::require()
//!     .with_extra_roots(std::fs::read("/etc/custody/db-ca.pem")?)
//!     .without_system_roots();
//! let options = ConnectOptions::new()
//!     .host("db.internal")
//!     .user("custody")
//!     .dbname("custody");
//! let store = PostgresStore::open(options, settings)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! A connection string's `sslmode=require` requires TLS the same way (verified, unlike
//! libpq's `require`); its `sslmode=disable` with `TlsMode::Require` is refused. The
//! server offers TLS only over TCP, so TLS to a Unix socket fails. Without the `tls`
//! feature the settings are there but `TlsMode::Require` (or `sslmode=require`) is
//! refused with [`OpenError::TlsUnsupported`] before anything is sent, so code that
//! chooses TLS at run time compiles either way and never connects in plain by mistake.
//!
//! # Errors
//!
//! Opening fails with an [`OpenError`]: [`OpenError::Config`] for a connection string
//! that does not parse, [`OpenError::Tls`] when TLS is required and the server offers
//! none or its certificate does not verify, [`OpenError::TlsUnsupported`],
//! [`OpenError::Database`] when the server cannot be reached or refuses, the schema
//! errors (`NewerSchema`, `UnknownSchema`, `Migration`, `NoSchema`) and
//! [`OpenError::InvalidSetting`]. A [`DatabaseError`] keeps what the driver said as
//! data: its [`kind`](DatabaseError::kind), its [`message`](DatabaseError::message),
//! and the SQLSTATE [`code`](DatabaseError::code) of an error the server sent. The
//! outbox's `Unavailable` errors carry one as their `source()`; the overlay's carry its
//! message.
//!
//! # Tables and rules
//!
//! The tables and columns of `storage-sqlite` (`migrations/*.sql` says why each differs):
//! IDs are `BYTEA` with their exact UTF-8 bytes (PostgreSQL text cannot hold a NUL byte,
//! which an ID may contain, and `BYTEA` orders like Rust strings); JSON is `TEXT` byte for
//! byte as written; the global revision counter `chat_live_timeline_overlay_revisions` is
//! a sequence. Numbered migrations (`migrations/*.sql`) are recorded in
//! `custody_schema_migrations`, each applied in one transaction under an advisory lock,
//! so hosts that start together migrate once.
//!
//! Every multi-record rule is one transaction (the submit claim, the hand-off with its
//! ledger row, the overlay compare-and-set with its revision, the session message with
//! its route, the sent proof across aliases). Every statement is prepared once per
//! connection and reused. Nothing read back is trusted: every value is checked like wire
//! input; an outbox row that does not decode is shown blocked (OB-05), any other
//! unreadable record is a typed `Corrupt` error naming the table, the column and the
//! value. Errors are grouped like the SQLite backend's: `Unavailable` (with a
//! [`DatabaseError`] as `source()` for the outbox), `Corrupt`, and the conflicts.
//!
//! # Several hosts, one database
//!
//! Transactions run at `READ COMMITTED` with explicit locks, so each rule takes exactly
//! the lock it needs and different sessions never wait for each other:
//!
//! - **A submit claim has one winner.** The identity's primary key decides: `INSERT ..
//!   ON CONFLICT DO NOTHING` waits for a racing insert of the same key to commit or roll
//!   back, then inserts or finds it; the loser reads the winner's identity (OB-03).
//! - **Compare-and-set writes** (`replace_entry`, `rekey_entry`) read the entry
//!   `FOR UPDATE`, so no update is lost between the compare and the set.
//! - **Overlay writes** take a transaction-scoped advisory lock on the (session, target)
//!   before reading it, then a revision from the sequence: a target's writers queue, its
//!   revisions rise in commit order, and writers of other targets do not wait. The
//!   sequence never hands out a revision twice, across hosts and deletes (OV-02).
//! - **One active run per session** is the primary key of `chat_active_runs`; a start
//!   locks the session's row (or inserts it) in one transaction. A run carries a lease its
//!   host renews; a stale run (no activity for 45 s) is reclaimed by its own host unless
//!   the adapter vetoes, and by any host once the lease has expired ([`hosts`]).
//! - **One host drains a session at a time**: a lease on the base session with a fencing
//!   token; with fencing on, every outbox write checks the lease in its transaction
//!   (`FOR SHARE`), so a host that lost the session writes nothing more there.
//!
//! Against the alternatives: `SERIALIZABLE` with retry would give the same invariants
//! without naming locks, but PostgreSQL's predicate locks are coarse (index pages), so
//! concurrent submits to different sessions abort each other now and then and every
//! write needs a retry loop; under load that wastes whole transactions where a lock only
//! queues. Advisory locks alone (session-level, held by a connection) would free a dead
//! host's claims only when its connection closes, which a hung host never does, and they
//! do not survive a reconnect; leases with a server-clock expiry and a token do both.
//! Row locks are used wherever a row exists to lock; the advisory lock is used only for
//! an overlay target, which may not have a row yet. Deadlocks and serialization failures
//! (SQLSTATE 40P01, 40001) are retried a few times inside the store.
//!
//! # Durability
//!
//! [`SynchronousCommit::On`] is the default: an acknowledged write survives a host kill
//! and a server crash. [`SynchronousCommit::Off`] still survives a host kill at any
//! point, but a server crash may lose the last commits. A commit whose answer is lost (the
//! connection broke) may or may not have happened: the caller gets `Unavailable` and its
//! retry is idempotent. A closed connection is opened again at the next call.

#![warn(unreachable_pub)]

use std::collections::HashMap;
use std::time::Duration;

use postgres::types::ToSql;
use postgres::{Client, Config, GenericClient, Row, Statement, Transaction};

mod columns;
mod connect;
mod error;
pub mod hosts;
mod outbox;
mod overlay;

use connect::Connector;
pub use connect::{ConnectOptions, Tls, TlsMode};
pub(crate) use error::pg_message;
pub use error::{DatabaseError, DatabaseErrorKind};

pub use hosts::{
    Heartbeat, HostId, HostedRun, LeaseError, LeaseLost, LeaseSet, Leases, RunStartError,
    SessionBusy, SessionLease, Wake, WakeListener, WAKE_CHANNEL,
};
pub use overlay_core::store::OVERLAY_CACHE_TARGETS;

/// The migrations, in order; version N is `MIGRATIONS[N - 1]`.
pub const MIGRATIONS: [(&str, &str); 3] = [
    (
        "0001_initial",
        include_str!("../migrations/0001_initial.sql"),
    ),
    ("0002_hosts", include_str!("../migrations/0002_hosts.sql")),
    (
        "0003_host_addresses",
        include_str!("../migrations/0003_host_addresses.sql"),
    ),
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// The table that records which migrations were applied.
pub const MIGRATIONS_TABLE: &str = "custody_schema_migrations";

/// How many times a transaction that PostgreSQL aborted for a deadlock or a
/// serialization failure is run again before the error is returned.
pub const MAX_TRANSACTION_ATTEMPTS: u32 = 4;

/// PostgreSQL's `synchronous_commit` for this connection's transactions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SynchronousCommit {
    /// A commit returns once its WAL is flushed: survives a host kill and a server crash.
    On,
    /// A commit returns before its WAL is flushed: survives a host kill at any point; a
    /// server crash may lose the last commits (never half of one).
    Off,
}

/// Per-connection settings.
///
/// Start from [`Settings::default`] and change fields:
///
/// ```
/// use std::time::Duration;
/// use storage_postgres::Settings;
///
/// let mut settings = Settings::default();
/// settings.lock_timeout = Duration::from_secs(2);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Settings {
    /// `synchronous_commit` (default [`SynchronousCommit::On`]).
    pub synchronous_commit: SynchronousCommit,
    /// How long a statement waits for another connection's lock before it fails as
    /// unavailable (default 5 s; PostgreSQL's `lock_timeout`).
    pub lock_timeout: Duration,
    /// How long a transaction may sit idle before the server ends it and frees its locks
    /// (default 60 s; `idle_in_transaction_session_timeout`): a host that hangs inside a
    /// transaction does not hold a session's rows for ever. Never longer than
    /// [`Leases::session_lease`]: a fenced write holds its lease row until it commits,
    /// so a host cut off inside one would otherwise keep every other host from taking
    /// the session over until this ran out.
    pub idle_in_transaction_timeout: Duration,
    /// How long connecting may take (default 10 s).
    pub connect_timeout: Duration,
    /// The `application_name` the server shows for this connection (default
    /// `"storage-postgres"`).
    pub application_name: String,
    /// Run and session leases ([`hosts`]).
    pub leases: Leases,
    /// TLS (default none: plain connections). [`TlsMode::Require`] needs the crate's
    /// `tls` feature.
    pub tls: Tls,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            synchronous_commit: SynchronousCommit::On,
            lock_timeout: Duration::from_secs(5),
            idle_in_transaction_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
            application_name: "storage-postgres".to_owned(),
            leases: Leases::default(),
            tls: Tls::default(),
        }
    }
}

/// Why a database could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The connection string does not parse, or the connection parameters do not fit
    /// together ([`DatabaseErrorKind::Config`]; the message says which).
    #[error("{0}")]
    Config(#[source] DatabaseError),
    /// TLS is required and could not be set up: the server offers none (it has
    /// `ssl = off`, or the host is a Unix socket), or its certificate did not verify
    /// against the trusted roots for the host's name ([`DatabaseErrorKind::Tls`]).
    #[error("TLS with the server failed: {0}")]
    Tls(#[source] DatabaseError),
    /// TLS is required ([`TlsMode::Require`] or the connection string's
    /// `sslmode=require`), but the crate was built without its `tls` feature. Nothing
    /// was sent to the server.
    #[error(
        "TLS is required, but storage-postgres was built without its `tls` feature; \
         nothing was sent to the server"
    )]
    TlsUnsupported,
    /// The server could not be reached, or refused to connect or a statement while
    /// opening.
    #[error("cannot open the database: {0}")]
    Database(#[source] DatabaseError),
    /// The database was written by a newer schema.
    #[error("the database has schema version {found}, newer than {supported}")]
    NewerSchema {
        /// What the database says.
        found: u32,
        /// What this build knows.
        supported: u32,
    },
    /// The migrations table holds a version this build cannot read (negative).
    #[error(
        "the database says schema version {found}; this build knows versions 0 to {supported}"
    )]
    UnknownSchema {
        /// What the database says.
        found: i64,
        /// The newest version this build knows.
        supported: u32,
    },
    /// A migration did not apply: the recorded version does not match the tables the
    /// schema holds. Nothing of that migration was written.
    #[error(
        "the database says schema version {found}, but migration {migration} does not apply to it \
         ({reason}); this build knows versions 0 to {supported}"
    )]
    Migration {
        /// What the database says.
        found: u32,
        /// The migration that failed, by name.
        migration: &'static str,
        /// The server's message.
        reason: String,
        /// The newest version this build knows.
        supported: u32,
    },
    /// The connection has no schema to create tables in (its `search_path` names none
    /// that exists).
    #[error("the connection's search_path names no existing schema to keep the tables in")]
    NoSchema,
    /// A setting the server would refuse or ignore, or TLS settings that do not fit
    /// together (roots that do not parse, none to verify with, roots without TLS).
    #[error("invalid setting {name}: {reason}")]
    InvalidSetting {
        /// The field of [`Settings`] (`tls` for TLS as a whole).
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

/// A driver failure while opening: TLS failures apart, since their fix is the
/// certificates.
fn open_error(e: postgres::Error) -> OpenError {
    let e = DatabaseError::from_driver(e);
    match e.kind() {
        DatabaseErrorKind::Tls => OpenError::Tls(e),
        DatabaseErrorKind::Config => OpenError::Config(e),
        _ => OpenError::Database(e),
    }
}

/// Statements prepared on this connection, by their text.
#[derive(Default)]
struct Statements(HashMap<&'static str, Statement>);

impl Statements {
    fn get(
        &mut self,
        client: &mut impl GenericClient,
        sql: &'static str,
    ) -> Result<Statement, postgres::Error> {
        if let Some(statement) = self.0.get(sql) {
            return Ok(statement.clone());
        }
        let statement = client.prepare(sql)?;
        self.0.insert(sql, statement.clone());
        Ok(statement)
    }
}

/// Parameters of one statement.
type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// A connection or transaction with the prepared statements of its connection.
struct Conn<'a, C: GenericClient> {
    client: &'a mut C,
    statements: &'a mut Statements,
}

impl<C: GenericClient> Conn<'_, C> {
    fn query(
        &mut self,
        sql: &'static str,
        params: Params<'_>,
    ) -> Result<Vec<Row>, postgres::Error> {
        let statement = self.statements.get(self.client, sql)?;
        self.client.query(&statement, params)
    }

    fn query_opt(
        &mut self,
        sql: &'static str,
        params: Params<'_>,
    ) -> Result<Option<Row>, postgres::Error> {
        let statement = self.statements.get(self.client, sql)?;
        self.client.query_opt(&statement, params)
    }

    fn execute(&mut self, sql: &'static str, params: Params<'_>) -> Result<u64, postgres::Error> {
        let statement = self.statements.get(self.client, sql)?;
        self.client.execute(&statement, params)
    }
}

/// Why a transaction body stopped: the server failed (retried when PostgreSQL says the
/// transaction may simply run again), or the body refused with the caller's error.
enum Fail<E> {
    Db(postgres::Error),
    Refused(E),
}

impl<E> From<postgres::Error> for Fail<E> {
    fn from(e: postgres::Error) -> Self {
        Fail::Db(e)
    }
}

/// SQLSTATEs after which a transaction is run again: deadlock detected, serialization
/// failure.
fn retryable(e: &postgres::Error) -> bool {
    use postgres::error::SqlState;
    e.code().is_some_and(|c| {
        *c == SqlState::T_R_DEADLOCK_DETECTED || *c == SqlState::T_R_SERIALIZATION_FAILURE
    })
}

/// What a store keeps beside its connection.
#[derive(Debug, Default)]
struct Local {
    overlays: overlay_core::store::OverlayCache,
    fence: hosts::Fence,
    /// The host this store is custody's shared run registry for ([`PostgresStore::share_runs`]).
    runs_host: Option<hosts::HostId>,
    pause_before_commit: Option<Duration>,
}

/// One connection to the custody database. See the crate docs.
pub struct PostgresStore {
    client: Client,
    config: Config,
    connector: Connector,
    settings: Settings,
    statements: Statements,
    /// The schema the tables live in (`current_schema()`), part of every advisory key.
    schema: String,
    local: Local,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("schema", &self.schema)
            .field("settings", &self.settings)
            .field("statements", &self.statements.0.len())
            .field("local", &self.local)
            .finish()
    }
}

/// A 64-bit advisory-lock key for `parts` in `schema`: FNV-1a over the length-prefixed
/// parts, the same on every host and every build. Two things that collide only wait for
/// each other; they never share a lock's meaning beyond that.
fn lock_key(schema: &str, parts: &[&[u8]]) -> i64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = OFFSET;
    for part in std::iter::once(schema.as_bytes()).chain(parts.iter().copied()) {
        for byte in (part.len() as u64).to_le_bytes().iter().chain(part) {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(PRIME);
        }
    }
    i64::from_le_bytes(hash.to_le_bytes())
}

/// A duration as whole milliseconds for a setting or an interval, at least 1.
fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX).max(1)
}

fn session_setup(client: &mut Client, settings: &Settings) -> Result<(), postgres::Error> {
    let sync = match settings.synchronous_commit {
        SynchronousCommit::On => "on",
        SynchronousCommit::Off => "off",
    };
    // The values are numbers and fixed words, never caller text.
    client.batch_execute(&format!(
        "SET lock_timeout = {}; SET idle_in_transaction_session_timeout = {}; \
         SET synchronous_commit = {sync};",
        millis(settings.lock_timeout),
        millis(
            settings
                .idle_in_transaction_timeout
                .min(settings.leases.session_lease)
        ),
    ))
}

fn check_settings(settings: &Settings) -> Result<(), OpenError> {
    let int_max = Duration::from_millis(i32::MAX as u64);
    for (name, value) in [
        ("lock_timeout", settings.lock_timeout),
        (
            "idle_in_transaction_timeout",
            settings.idle_in_transaction_timeout,
        ),
    ] {
        if value.is_zero() || value > int_max {
            return Err(OpenError::InvalidSetting {
                name,
                reason: format!("{value:?} is not from 1 ms to {int_max:?}"),
            });
        }
    }
    let leases = &settings.leases;
    for (name, value) in [
        ("leases.stale_after", leases.stale_after),
        ("leases.run_lease", leases.run_lease),
        ("leases.session_lease", leases.session_lease),
    ] {
        if value.is_zero() {
            return Err(OpenError::InvalidSetting {
                name,
                reason: "a lease or limit of zero would expire at once".to_owned(),
            });
        }
    }
    Ok(())
}

/// The recorded schema version, inside the migration lock.
fn recorded_version(tx: &mut Transaction<'_>) -> Result<u32, OpenError> {
    let found: i64 = tx
        .query_one(
            "SELECT coalesce(max(version), 0)::BIGINT FROM custody_schema_migrations",
            &[],
        )
        .map_err(open_error)?
        .get(0);
    let version = u32::try_from(found).map_err(|_| OpenError::UnknownSchema {
        found,
        supported: SCHEMA_VERSION,
    })?;
    if version > SCHEMA_VERSION {
        return Err(OpenError::NewerSchema {
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    Ok(version)
}

/// Applies migrations up to `target`, each in its own transaction under the schema's
/// migration lock, so hosts that open the database together migrate it once.
fn migrate(client: &mut Client, schema: &str, target: u32) -> Result<u32, OpenError> {
    let key = lock_key(schema, &[b"migrations"]);
    loop {
        let mut tx = client.transaction().map_err(open_error)?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&key])
            .map_err(open_error)?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS custody_schema_migrations (
                 version    INTEGER     PRIMARY KEY,
                 name       TEXT        NOT NULL,
                 applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
             )",
        )
        .map_err(open_error)?;
        let found = recorded_version(&mut tx)?;
        let Some((name, sql)) = MIGRATIONS
            .get(found as usize)
            .filter(|_| found < target.min(SCHEMA_VERSION))
        else {
            tx.commit().map_err(open_error)?;
            return Ok(found);
        };
        tx.batch_execute(sql).map_err(|e| OpenError::Migration {
            found,
            migration: name,
            reason: e
                .as_db_error()
                .map_or_else(|| e.to_string(), |d| d.message().to_owned()),
            supported: SCHEMA_VERSION,
        })?;
        tx.execute(
            "INSERT INTO custody_schema_migrations (version, name) VALUES ($1, $2)",
            &[&(found as i32 + 1), name],
        )
        .map_err(open_error)?;
        tx.commit().map_err(open_error)?;
    }
}

impl PostgresStore {
    /// Connects with a connection string (`postgres://user@host/db` or
    /// `host=/run/postgresql dbname=custody`) and migrates the schema of its
    /// `search_path` to [`SCHEMA_VERSION`].
    pub fn connect(params: &str, settings: Settings) -> Result<Self, OpenError> {
        Self::open(ConnectOptions::parse(params)?, settings)
    }

    /// Connects with `options` and migrates the schema of its `search_path` to
    /// [`SCHEMA_VERSION`].
    pub fn open(options: ConnectOptions, settings: Settings) -> Result<Self, OpenError> {
        Self::migrate_to(options, settings, SCHEMA_VERSION)
    }

    /// Connects and migrates only up to `version` (to write databases of an older schema
    /// in tests of the upgrade path).
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn open_at(
        options: ConnectOptions,
        settings: Settings,
        version: u32,
    ) -> Result<Self, OpenError> {
        Self::migrate_to(options, settings, version)
    }

    fn migrate_to(
        options: ConnectOptions,
        settings: Settings,
        version: u32,
    ) -> Result<Self, OpenError> {
        check_settings(&settings)?;
        let mut config = options.config;
        let connector = connect::connector(&mut config, &settings.tls)?;
        config
            .connect_timeout(settings.connect_timeout)
            .application_name(&settings.application_name);
        let mut client = connector.connect(&config).map_err(open_error)?;
        session_setup(&mut client, &settings).map_err(open_error)?;
        let schema: Option<String> = client
            .query_one("SELECT current_schema()::TEXT", &[])
            .map_err(open_error)?
            .get(0);
        let schema = schema.ok_or(OpenError::NoSchema)?;
        migrate(&mut client, &schema, version)?;
        Ok(PostgresStore {
            client,
            config,
            connector,
            settings,
            statements: Statements::default(),
            schema,
            local: Local::default(),
        })
    }

    /// The schema version of the database.
    pub fn schema_version(&mut self) -> Result<u32, DatabaseError> {
        self.reconnect_if_closed()
            .map_err(DatabaseError::from_driver)?;
        let found: i64 = self
            .client
            .query_one(
                "SELECT coalesce(max(version), 0)::BIGINT FROM custody_schema_migrations",
                &[],
            )
            .map_err(DatabaseError::from_driver)?
            .get(0);
        Ok(u32::try_from(found).unwrap_or(0))
    }

    /// The schema the tables live in.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The settings the store was opened with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Sets the global revision counter (to test the 2^53 - 1 cap).
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn set_revision_counter(&mut self, revision: u64) -> Result<(), DatabaseError> {
        let revision = i64::try_from(revision).unwrap_or(i64::MAX);
        self.client
            .execute(
                "SELECT setval('chat_live_timeline_overlay_revisions', $1, true)",
                &[&revision],
            )
            .map_err(DatabaseError::from_driver)?;
        Ok(())
    }

    /// Waits this long before every commit (to kill a host in the middle of a
    /// transaction in tests).
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn pause_before_commit(&mut self, pause: Option<Duration>) {
        self.local.pause_before_commit = pause;
    }

    /// Opens the connection again when the server closed it (a restart, a network
    /// break): prepared statements belong to the old connection and are forgotten.
    fn reconnect_if_closed(&mut self) -> Result<(), postgres::Error> {
        if !self.client.is_closed() {
            return Ok(());
        }
        let mut client = self.connector.connect(&self.config)?;
        session_setup(&mut client, &self.settings)?;
        self.client = client;
        self.statements = Statements::default();
        Ok(())
    }

    /// Runs `body` outside a transaction (one statement is one snapshot).
    fn read<T, E>(
        &mut self,
        db: fn(postgres::Error) -> E,
        body: impl FnOnce(&mut Conn<'_, Client>, &mut Local) -> Result<T, Fail<E>>,
    ) -> Result<T, E> {
        self.reconnect_if_closed().map_err(db)?;
        let mut conn = Conn {
            client: &mut self.client,
            statements: &mut self.statements,
        };
        body(&mut conn, &mut self.local).map_err(|f| match f {
            Fail::Db(e) => db(e),
            Fail::Refused(e) => e,
        })
    }

    /// Runs `body` in one transaction and commits it when the body returns `Ok`; an
    /// `Err` rolls everything back. A deadlock or serialization failure runs the body
    /// again, up to [`MAX_TRANSACTION_ATTEMPTS`] times in all.
    fn transact<T, E>(
        &mut self,
        db: fn(postgres::Error) -> E,
        mut body: impl FnMut(&mut Conn<'_, Transaction<'_>>, &mut Local) -> Result<T, Fail<E>>,
    ) -> Result<T, E> {
        self.reconnect_if_closed().map_err(db)?;
        let mut attempt = 1;
        loop {
            let outcome = (|| {
                let mut tx = self.client.transaction()?;
                let mut conn = Conn {
                    client: &mut tx,
                    statements: &mut self.statements,
                };
                let value = body(&mut conn, &mut self.local)?;
                if let Some(pause) = self.local.pause_before_commit {
                    std::thread::sleep(pause);
                }
                tx.commit()?;
                Ok(value)
            })();
            match outcome {
                Ok(value) => return Ok(value),
                Err(Fail::Db(e)) if retryable(&e) && attempt < MAX_TRANSACTION_ATTEMPTS => {
                    attempt += 1;
                }
                Err(Fail::Db(e)) => return Err(db(e)),
                Err(Fail::Refused(e)) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The advisory keys are fixed by their definition: every host computes the same one.
    #[test]
    fn lock_keys_are_stable_and_separate_schemas_and_parts() {
        let a = lock_key("public", &[b"overlay", b"s1", b"t1"]);
        assert_eq!(a, lock_key("public", &[b"overlay", b"s1", b"t1"]));
        assert_ne!(a, lock_key("other", &[b"overlay", b"s1", b"t1"]));
        // Length prefixes: moving a byte between parts changes the key.
        assert_ne!(a, lock_key("public", &[b"overlay", b"s1t", b"1"]));
        // Pinned: a change of the function would split hosts of two builds.
        assert_eq!(lock_key("public", &[b"overlay"]), 7_324_875_950_072_564_511);
    }

    #[test]
    fn invalid_settings_are_refused_before_connecting() {
        let settings = Settings {
            lock_timeout: Duration::ZERO,
            ..Settings::default()
        };
        assert!(matches!(
            check_settings(&settings),
            Err(OpenError::InvalidSetting {
                name: "lock_timeout",
                ..
            })
        ));
        let mut settings = Settings::default();
        settings.leases.run_lease = Duration::ZERO;
        assert!(matches!(
            check_settings(&settings),
            Err(OpenError::InvalidSetting {
                name: "leases.run_lease",
                ..
            })
        ));
        assert!(check_settings(&Settings::default()).is_ok());
    }
}
