//! What several hosts on one database share beyond the storage traits: the run registry
//! (OB-14) with leases, and a lease per session scope that says which host drains it.
//!
//! The core's [`outbox_core::runs::RunRegistry`] lives in one process's memory, which is
//! the seed's design for one host. With several hosts, a session's runs and its outbox
//! must be owned by one host at a time across all of them, and the claims of a host that
//! died must pass to another. Custody reaches the run registry through the core trait
//! [`outbox_core::store::SharedRuns`], which this store implements once it is given its
//! host ([`PostgresStore::share_runs`]): custody writes its starts, ends, stops and
//! renewals through, adopts what a host that lost a scope left, and resumes its stops.
//! The methods below are the registry's whole surface, for a host that drives it by
//! hand:
//!
//! - **Runs.** [`PostgresStore::start_run`] keeps one active run per app session across
//!   hosts (the primary key of `chat_active_runs`), refuses a start while a cancellation
//!   is pending in the scope, and reclaims the session's stale run first: a run whose
//!   newest activity is older than [`Leases::stale_after`] (45 s, the seed's limit) is
//!   reclaimed by its own host unless that host's adapter vetoes (the `veto` argument),
//!   and by any other host only once the run's lease has expired too, since only the
//!   owning host can ask its adapter. A live host keeps its runs' leases fresh with
//!   [`PostgresStore::heartbeat`], which also reclaims its own stale runs the adapter does
//!   not veto; a host that dies stops renewing, and its runs pass to whoever starts next
//!   after the lease and the stale limit. Starts, restores and cancellations of one scope
//!   take the scope's advisory lock, the seed's start/cancel barrier across hosts.
//! - **Sessions.** [`PostgresStore::acquire_session`] gives one host the scope of a
//!   session (its base session and the alias) for [`Leases::session_lease`], with a
//!   fencing token that rises with every change of holder. The holder renews it; once it
//!   has expired another host may take it. With [`PostgresStore::set_fencing`] on, every
//!   outbox write checks in its own transaction that this store still holds the lease of
//!   the session it writes (`FOR SHARE` on the lease row, so a takeover waits for the
//!   write to commit and the write never lands after the takeover); a write without the
//!   lease is refused as unavailable with a [`LeaseLost`] source and writes nothing.
//!
//! Every time is the database server's clock (`clock_timestamp()`): hosts' clocks may
//! disagree; the server's is one for all. A [`HostId`] must be unique per running host
//! process (a host name with a process ID and start time, for example): two processes
//! with one ID would each take the other's runs and leases for their own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_core::entry::AccessLevel;
use outbox_core::ids::{base_session, OperationId, RunId, SessionId};
use outbox_core::runs::{ActiveRun, RunError, STALE_RUN_AFTER};
use outbox_core::store::{OutboxError, SharedCancellation, SharedRun, SharedScope};
use postgres::{GenericClient, Row};
use timeline_core::time::Millis;

use crate::columns::{self, Column, Refused};
use crate::error::ob;
use crate::{lock_key, Conn, Fail, PostgresStore};

timeline_core::string_id!(
    /// A host process among those that share the database; unique per running process.
    HostId,
    "host ID"
);

/// How long leases last and when a run is stale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leases {
    /// A run whose newest activity is older than this is stale (default 45 s, the seed's
    /// [`STALE_RUN_AFTER`]).
    pub stale_after: Duration,
    /// How long a host vouches for its runs and pending cancellations after each
    /// heartbeat or activity (default 15 s). Another host reclaims a stale run only after
    /// this has passed without a renewal.
    pub run_lease: Duration,
    /// How long a session's lease holds after each acquire or renewal (default 15 s).
    pub session_lease: Duration,
}

impl Default for Leases {
    fn default() -> Self {
        Leases {
            stale_after: Duration::from_millis(STALE_RUN_AFTER.as_u64()),
            run_lease: Duration::from_secs(15),
            session_lease: Duration::from_secs(15),
        }
    }
}

/// An active run with the host that runs it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HostedRun {
    /// The run; `last_activity` is the server's time in milliseconds since the epoch.
    pub run: ActiveRun,
    /// The host that started it.
    pub host: HostId,
    /// How long its lease still holds (zero once expired).
    pub lease_left: Duration,
}

/// Why a run could not be started or restored.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RunStartError {
    /// The registry's rule refused it, with the seed's text (OB-14).
    #[error(transparent)]
    Refused(#[from] RunError),
    /// The database failed.
    #[error(transparent)]
    Store(#[from] OutboxError),
}

/// A session scope held by a host.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionLease {
    /// The base session of the scope.
    pub session: SessionId,
    /// The host that holds it.
    pub host: HostId,
    /// The fencing token: rises with every change of holder.
    pub token: u64,
    /// How long the lease holds from when it was granted or renewed.
    pub expires_in: Duration,
}

/// A session scope another host holds.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionBusy {
    /// The base session of the scope.
    pub session: SessionId,
    /// The host that holds it.
    pub holder: HostId,
    /// How long its lease still holds unless renewed.
    pub expires_in: Duration,
}

/// Why a session lease was not granted or renewed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// Another host holds the scope.
    #[error("session {} is held by host {} for {:?} more", .0.session, .0.holder, .0.expires_in)]
    Busy(SessionBusy),
    /// The lease to renew expired or passed to another host.
    #[error(transparent)]
    Lost(#[from] LeaseLost),
    /// The database failed.
    #[error(transparent)]
    Store(#[from] OutboxError),
}

/// A write or renewal under a session lease that this store no longer holds (it expired,
/// another host took the scope over, or it was never acquired). A fenced write refused
/// for it is the stores' typed `LeaseLost` error (outbox and overlay), which custody
/// never retries.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("this host does not hold the lease of session {session}{}", match .token { Some(t) => format!(" (token {t} was lost)"), None => String::new() })]
pub struct LeaseLost {
    /// The base session of the scope.
    pub session: SessionId,
    /// The token this store held, if any.
    pub token: Option<u64>,
}

/// The session leases a host holds, shared by its connections: the store that acquires
/// a lease and the stores that write under it (the outbox's, the overlays') see the same
/// set, so every write of the host is fenced by the token its lease keeper holds.
/// [`PostgresStore::lease_set`] gives a store's set; [`PostgresStore::share_leases`]
/// makes another store use it (and turns its fencing on). Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct LeaseSet(Arc<Mutex<HashMap<SessionId, u64>>>);

impl LeaseSet {
    fn get(&self, base: &SessionId) -> Option<u64> {
        self.lock().get(base).copied()
    }
    fn insert(&self, base: SessionId, token: u64) {
        self.lock().insert(base, token);
    }
    fn remove(&self, base: &SessionId) {
        self.lock().remove(base);
    }
    /// The base sessions held, with their tokens.
    pub fn held(&self) -> Vec<(SessionId, u64)> {
        let mut held: Vec<(SessionId, u64)> =
            self.lock().iter().map(|(s, t)| (s.clone(), *t)).collect();
        held.sort();
        held
    }
    /// Stops writing under the lease of the scope of `session`: the stores sharing this
    /// set refuse its writes from now on ([`OutboxError::LeaseLost`]), before they reach
    /// the database. For a keeper that could not renew the lease in time; the lease
    /// itself lapses, or its keeper gives it back.
    ///
    /// [`OutboxError::LeaseLost`]: outbox_core::store::OutboxError::LeaseLost
    pub fn forget(&self, session: &SessionId) {
        self.remove(&base_session(session));
    }
    /// Whether the scope of `session` is held.
    pub fn holds(&self, session: &SessionId) -> bool {
        self.get(&base_session(session)).is_some()
    }
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, u64>> {
        // A panic while the map was held cannot leave it half-changed (one insert or
        // remove), so its contents are still right.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The leases this store holds, and whether its writes must hold one.
#[derive(Debug, Default)]
pub(crate) struct Fence {
    enabled: bool,
    held: LeaseSet,
}

/// With fencing on, checks inside the caller's transaction that this store holds a live
/// lease on the scope of each of `sessions`, and locks the lease rows `FOR SHARE` until
/// the transaction ends, so a takeover waits for this write. `refuse` makes the store's
/// typed error of a lost lease.
pub(crate) fn fence_check<C: GenericClient, E>(
    c: &mut Conn<'_, C>,
    fence: &Fence,
    sessions: &[&SessionId],
    refuse: fn(SessionId, String) -> E,
) -> Result<(), Fail<E>> {
    if !fence.enabled {
        return Ok(());
    }
    let mut bases: Vec<SessionId> = sessions.iter().map(|s| base_session(s)).collect();
    bases.sort();
    bases.dedup();
    for base in bases {
        let lost = |token| {
            let lost = LeaseLost {
                session: base.clone(),
                token,
            };
            Fail::Refused(refuse(base.clone(), lost.to_string()))
        };
        let Some(token) = fence.held.get(&base) else {
            return Err(lost(None));
        };
        let row = c.query_opt(
            "SELECT 1 FROM chat_session_leases
             WHERE base_session_id = $1 AND token = $2 AND expires_at > clock_timestamp()
             FOR SHARE",
            &[&base.as_str().as_bytes(), &(token as i64)],
        )?;
        if row.is_none() {
            return Err(lost(Some(token)));
        }
    }
    Ok(())
}

/// The channel on which a write into a session another host may serve wakes that host:
/// the payload is the base session (empty for one too long for a notification, which
/// wakes every session the listener serves).
pub const WAKE_CHANNEL: &str = "custody_wake";

/// Wakes the host serving the scope of `session` when the caller's transaction commits.
pub(crate) fn notify_wake<C: GenericClient, E>(
    c: &mut Conn<'_, C>,
    session: &SessionId,
) -> Result<(), Fail<E>> {
    let base = base_session(session);
    // PostgreSQL refuses a payload of 8,000 bytes or more.
    let payload = if base.as_str().len() < 7_900 {
        base.as_str()
    } else {
        ""
    };
    c.execute("SELECT pg_notify($1, $2)", &[&WAKE_CHANNEL, &payload])?;
    Ok(())
}

const RUNS: &str = "chat_active_runs";
const RUN_SESSION: Column = Column::new(RUNS, "app_session_id");
const RUN_ID: Column = Column::new(RUNS, "run_id");
const RUN_HOST: Column = Column::new(RUNS, "host_id");
const RUN_STARTED_BY: Column = Column::new(RUNS, "started_by");
const RUN_JOINED: Column = Column::new(RUNS, "last_session_message");
const RUN_ACCESS: Column = Column::new(RUNS, "access");
const RUN_ACTIVITY: Column = Column::new(RUNS, "last_activity");
const RUN_LEASE: Column = Column::new(RUNS, "lease_until");
const RUN_FINALIZING: Column = Column::new(RUNS, "finalizing");
const LEASES: &str = "chat_session_leases";
const LEASE_HOST: Column = Column::new(LEASES, "host_id");
const LEASE_TOKEN: Column = Column::new(LEASES, "token");
const LEASE_LEFT: Column = Column::new(LEASES, "expires_at");

/// The columns of a run row as [`read_run`] reads them, with the lease left and
/// whether the run is stale and its lease has lapsed, all by the server's clock.
/// `$STALE` is the stale limit in milliseconds.
macro_rules! run_columns {
    ($stale:literal) => {
        concat!(
            "app_session_id, run_id, host_id, started_by, last_session_message, access, ",
            "(extract(epoch FROM last_activity) * 1000)::BIGINT, ",
            "greatest(0, extract(epoch FROM lease_until - clock_timestamp()) * 1000)::BIGINT, ",
            "finalizing, ",
            "clock_timestamp() - last_activity > ",
            $stale,
            "::FLOAT8 * INTERVAL '1 millisecond', ",
            "lease_until <= clock_timestamp()"
        )
    };
}

/// A run row with its state by the server's clock.
struct RunRow {
    session: SessionId,
    hosted: HostedRun,
    stale: bool,
    lapsed: bool,
}

fn corrupt(what: &str, r: Refused) -> Fail<OutboxError> {
    Fail::Refused(OutboxError::Corrupt {
        what: what.to_owned(),
        reason: r.to_string(),
    })
}

fn id_of<T>(
    row: &Row,
    i: usize,
    column: Column,
    make: impl FnOnce(String) -> Result<T, timeline_core::key::KeyError>,
) -> Result<T, Fail<OutboxError>> {
    let what = "active run";
    let bytes: &[u8] = columns::get(row, i, column).map_err(|r| corrupt(what, r))?;
    let text = columns::id_text(column, bytes).map_err(|r| corrupt(what, r))?;
    make(text).map_err(|e| {
        Fail::Refused(OutboxError::Corrupt {
            what: what.to_owned(),
            reason: format!("{column}: {e}"),
        })
    })
}

fn optional_op(
    row: &Row,
    i: usize,
    column: Column,
) -> Result<Option<OperationId>, Fail<OutboxError>> {
    let present: Option<&[u8]> =
        columns::get(row, i, column).map_err(|r| corrupt("active run", r))?;
    match present {
        Some(_) => id_of(row, i, column, OperationId::new).map(Some),
        None => Ok(None),
    }
}

fn access_text(access: Option<AccessLevel>) -> Option<&'static str> {
    access.map(AccessLevel::as_str)
}

fn read_run(row: &Row) -> Result<RunRow, Fail<OutboxError>> {
    let what = "active run";
    let bad = |r: Refused| corrupt(what, r);
    let access: Option<String> = columns::get(row, 5, RUN_ACCESS).map_err(bad)?;
    let access = access
        .map(|a| {
            columns::one_of(
                RUN_ACCESS,
                &a,
                &[
                    AccessLevel::ReadOnly,
                    AccessLevel::WorkspaceWrite,
                    AccessLevel::FullAccess,
                    AccessLevel::Unrestricted,
                ]
                .map(|l| (l.as_str(), l)),
            )
        })
        .transpose()
        .map_err(bad)?;
    let activity: i64 = columns::get(row, 6, RUN_ACTIVITY).map_err(bad)?;
    let left: i64 = columns::get(row, 7, RUN_LEASE).map_err(bad)?;
    Ok(RunRow {
        session: id_of(row, 0, RUN_SESSION, SessionId::new)?,
        hosted: HostedRun {
            run: ActiveRun {
                run_id: id_of(row, 1, RUN_ID, RunId::new)?,
                started_by: optional_op(row, 3, RUN_STARTED_BY)?,
                last_session_message: optional_op(row, 4, RUN_JOINED)?,
                access,
                last_activity: Millis(columns::exact(RUN_ACTIVITY, activity).map_err(bad)?),
                finalizing: columns::get(row, 8, RUN_FINALIZING).map_err(bad)?,
            },
            host: id_of(row, 2, RUN_HOST, HostId::new)?,
            lease_left: Duration::from_millis(u64::try_from(left).unwrap_or(0)),
        },
        stale: columns::get(row, 9, Column::new(RUNS, "stale")).map_err(bad)?,
        lapsed: columns::get(row, 10, Column::new(RUNS, "lapsed")).map_err(bad)?,
    })
}

/// Whether `host` may reclaim the run: it is stale, and either `host` runs it and its
/// adapter does not veto, or another host runs it and has stopped renewing its lease.
fn reclaimable(run: &RunRow, host: &HostId, veto: &dyn Fn(&SessionId, &RunId) -> bool) -> bool {
    run.stale
        && if run.hosted.host == *host {
            !veto(&run.session, &run.hosted.run.run_id)
        } else {
            run.lapsed
        }
}

/// Writes `run` as the active run of `session` for `host`, active now and leased for
/// `lease` (the session holds no row: the caller deleted or found none).
fn insert_run<C: GenericClient>(
    c: &mut Conn<'_, C>,
    session: &SessionId,
    run: &ActiveRun,
    host: &HostId,
    lease: Duration,
) -> Result<(), postgres::Error> {
    c.execute(
        "INSERT INTO chat_active_runs
             (app_session_id, base_session_id, run_id, host_id, started_by,
              last_session_message, access, last_activity, lease_until, finalizing)
         VALUES ($1, $2, $3, $4, $5, $6, $7, clock_timestamp(),
                 clock_timestamp() + $8::FLOAT8 * INTERVAL '1 millisecond', $9)",
        &[
            &b(session.as_str()),
            &b(base_session(session).as_str()),
            &b(run.run_id.as_str()),
            &b(host.as_str()),
            &run.started_by.as_ref().map(|o| b(o.as_str())),
            &run.last_session_message.as_ref().map(|o| b(o.as_str())),
            &access_text(run.access),
            &ms(lease),
            &run.finalizing,
        ],
    )?;
    Ok(())
}

/// A milliseconds parameter for an interval.
fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn b(id: &str) -> &[u8] {
    id.as_bytes()
}

/// What [`PostgresStore::heartbeat`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Heartbeat {
    /// Runs and pending cancellations whose lease was renewed.
    pub renewed: u64,
    /// This host's stale runs its adapter did not veto, now reclaimed.
    pub reclaimed: Vec<(SessionId, RunId)>,
}

impl PostgresStore {
    fn scope_key(&self, session: &SessionId) -> i64 {
        lock_key(&self.schema, &[b"scope", b(base_session(session).as_str())])
    }

    /// Starts `run` in `session` for `host` (OB-14): refused with the seed's texts when a
    /// cancellation is pending in the scope or another run is active in the session;
    /// the session's stale run is reclaimed first (see the module docs for who may).
    #[allow(clippy::too_many_arguments)]
    pub fn start_run(
        &mut self,
        host: &HostId,
        session: &SessionId,
        run: &RunId,
        started_by: Option<&OperationId>,
        access: Option<AccessLevel>,
        veto: &dyn Fn(&SessionId, &RunId) -> bool,
    ) -> Result<(), RunStartError> {
        let scope = self.scope_key(session);
        let leases = self.settings.leases;
        let base = base_session(session);
        let outcome = self.transact(ob, |c, _| {
            c.execute("SELECT pg_advisory_xact_lock($1)", &[&scope])?;
            let pending = c.query_opt(
                "SELECT 1 FROM chat_run_cancellations
                 WHERE base_session_id = $1 AND lease_until > clock_timestamp() LIMIT 1",
                &[&b(base.as_str())],
            )?;
            if pending.is_some() {
                return Ok(Err(RunError::CancellationPending));
            }
            let current = c.query_opt(
                concat!(
                    "SELECT ",
                    run_columns!("$2"),
                    " FROM chat_active_runs WHERE app_session_id = $1 FOR UPDATE"
                ),
                &[&b(session.as_str()), &ms(leases.stale_after)],
            )?;
            if let Some(row) = current {
                let current = read_run(&row)?;
                if !reclaimable(&current, host, veto) {
                    return Ok(Err(RunError::InProgress));
                }
                c.execute(
                    "DELETE FROM chat_active_runs WHERE app_session_id = $1",
                    &[&b(session.as_str())],
                )?;
            }
            c.execute(
                "INSERT INTO chat_active_runs
                     (app_session_id, base_session_id, run_id, host_id, started_by, access,
                      last_activity, lease_until)
                 VALUES ($1, $2, $3, $4, $5, $6, clock_timestamp(),
                         clock_timestamp() + $7::FLOAT8 * INTERVAL '1 millisecond')",
                &[
                    &b(session.as_str()),
                    &b(base.as_str()),
                    &b(run.as_str()),
                    &b(host.as_str()),
                    &started_by.map(|o| b(o.as_str())),
                    &access_text(access),
                    &ms(leases.run_lease),
                ],
            )?;
            Ok(Ok(()))
        })?;
        outcome.map_err(RunStartError::Refused)
    }

    /// Puts `run` back after its predecessor turn removed it, for `host`; refused when a
    /// different run is active (the seed's restore never replaces).
    pub fn restore_run(
        &mut self,
        host: &HostId,
        session: &SessionId,
        run: &ActiveRun,
    ) -> Result<(), RunStartError> {
        let scope = self.scope_key(session);
        let lease = self.settings.leases.run_lease;
        let outcome = self.transact(ob, |c, _| {
            c.execute("SELECT pg_advisory_xact_lock($1)", &[&scope])?;
            let current = c.query_opt(
                "SELECT run_id FROM chat_active_runs WHERE app_session_id = $1 FOR UPDATE",
                &[&b(session.as_str())],
            )?;
            if let Some(row) = current {
                let id: &[u8] =
                    columns::get(&row, 0, RUN_ID).map_err(|r| corrupt("active run", r))?;
                return Ok(if id == b(run.run_id.as_str()) {
                    Ok(())
                } else {
                    Err(RunError::RestoreRefused)
                });
            }
            insert_run(c, session, run, host, lease)?;
            Ok(Ok(()))
        })?;
        outcome.map_err(RunStartError::Refused)
    }

    /// Ends `run`; false when it was not the session's active run.
    pub fn end_run(&mut self, session: &SessionId, run: &RunId) -> Result<bool, OutboxError> {
        self.read(ob, |c, _| {
            let n = c.execute(
                "DELETE FROM chat_active_runs WHERE app_session_id = $1 AND run_id = $2",
                &[&b(session.as_str()), &b(run.as_str())],
            )?;
            Ok(n == 1)
        })
    }

    /// Claims the finalizer of `run` once, across hosts.
    pub fn claim_finalizing(
        &mut self,
        session: &SessionId,
        run: &RunId,
    ) -> Result<bool, OutboxError> {
        self.read(ob, |c, _| {
            let n = c.execute(
                "UPDATE chat_active_runs SET finalizing = true
                 WHERE app_session_id = $1 AND run_id = $2 AND NOT finalizing",
                &[&b(session.as_str()), &b(run.as_str())],
            )?;
            Ok(n == 1)
        })
    }

    /// Records activity of `run` now (by the server's clock) and renews its lease;
    /// false when it is not the session's active run.
    pub fn touch_run(&mut self, session: &SessionId, run: &RunId) -> Result<bool, OutboxError> {
        let lease = self.settings.leases.run_lease;
        self.read(ob, |c, _| {
            let n = c.execute(
                "UPDATE chat_active_runs SET last_activity = clock_timestamp(),
                     lease_until = clock_timestamp() + $3::FLOAT8 * INTERVAL '1 millisecond'
                 WHERE app_session_id = $1 AND run_id = $2",
                &[&b(session.as_str()), &b(run.as_str()), &ms(lease)],
            )?;
            Ok(n == 1)
        })
    }

    /// Records the session message that joined `run`; false when it is not the
    /// session's active run.
    pub fn joined_by(
        &mut self,
        session: &SessionId,
        run: &RunId,
        op: &OperationId,
    ) -> Result<bool, OutboxError> {
        self.read(ob, |c, _| {
            let n = c.execute(
                "UPDATE chat_active_runs SET last_session_message = $3
                 WHERE app_session_id = $1 AND run_id = $2",
                &[&b(session.as_str()), &b(run.as_str()), &b(op.as_str())],
            )?;
            Ok(n == 1)
        })
    }

    /// The active run of a session, as stored (nothing is reclaimed).
    pub fn active_run(&mut self, session: &SessionId) -> Result<Option<HostedRun>, OutboxError> {
        let stale = ms(self.settings.leases.stale_after);
        self.read(ob, |c, _| {
            let row = c.query_opt(
                concat!(
                    "SELECT ",
                    run_columns!("$2"),
                    " FROM chat_active_runs WHERE app_session_id = $1"
                ),
                &[&b(session.as_str()), &stale],
            )?;
            row.map(|r| read_run(&r).map(|r| r.hosted)).transpose()
        })
    }

    /// Active runs in the scope of `session` (its base and the alias), as stored.
    pub fn scope_runs(
        &mut self,
        session: &SessionId,
    ) -> Result<Vec<(SessionId, RunId)>, OutboxError> {
        let stale = ms(self.settings.leases.stale_after);
        let base = base_session(session);
        self.read(ob, |c, _| {
            let rows = c.query(
                concat!(
                    "SELECT ",
                    run_columns!("$2"),
                    " FROM chat_active_runs WHERE base_session_id = $1 ORDER BY app_session_id"
                ),
                &[&b(base.as_str()), &stale],
            )?;
            rows.iter()
                .map(|r| read_run(r).map(|r| (r.session, r.hosted.run.run_id)))
                .collect()
        })
    }

    /// Reclaims every stale run `host` may reclaim (see the module docs), one
    /// transaction; returns what was reclaimed. Runs another host is starting or
    /// reclaiming at this moment are skipped, not waited for.
    pub fn reclaim_stale_runs(
        &mut self,
        host: &HostId,
        veto: &dyn Fn(&SessionId, &RunId) -> bool,
    ) -> Result<Vec<(SessionId, RunId)>, OutboxError> {
        let stale = ms(self.settings.leases.stale_after);
        self.transact(ob, |c, _| {
            let rows = c.query(
                concat!(
                    "SELECT ",
                    run_columns!("$1"),
                    " FROM chat_active_runs
                     WHERE clock_timestamp() - last_activity > $1::FLOAT8 * INTERVAL '1 millisecond'
                     ORDER BY app_session_id FOR UPDATE SKIP LOCKED"
                ),
                &[&stale],
            )?;
            let mut reclaimed = Vec::new();
            for row in &rows {
                let run = read_run(row)?;
                if reclaimable(&run, host, veto) {
                    c.execute(
                        "DELETE FROM chat_active_runs WHERE app_session_id = $1 AND run_id = $2",
                        &[&b(run.session.as_str()), &b(run.hosted.run.run_id.as_str())],
                    )?;
                    reclaimed.push((run.session, run.hosted.run.run_id));
                }
            }
            Ok(reclaimed)
        })
    }

    /// Every active run after reclaiming the stale ones `host` may reclaim (the seed
    /// reclaims at each read of the active runs).
    pub fn active_runs(
        &mut self,
        host: &HostId,
        veto: &dyn Fn(&SessionId, &RunId) -> bool,
    ) -> Result<Vec<(SessionId, HostedRun)>, OutboxError> {
        self.reclaim_stale_runs(host, veto)?;
        let stale = ms(self.settings.leases.stale_after);
        self.read(ob, |c, _| {
            let rows = c.query(
                concat!(
                    "SELECT ",
                    run_columns!("$1"),
                    " FROM chat_active_runs ORDER BY app_session_id"
                ),
                &[&stale],
            )?;
            rows.iter()
                .map(|r| read_run(r).map(|r| (r.session, r.hosted)))
                .collect()
        })
    }

    /// What a live host does every few seconds (well within [`Leases::run_lease`]):
    /// reclaims its own stale runs that `veto` does not keep, and renews the lease of
    /// its other runs and of its pending cancellations.
    pub fn heartbeat(
        &mut self,
        host: &HostId,
        veto: &dyn Fn(&SessionId, &RunId) -> bool,
    ) -> Result<Heartbeat, OutboxError> {
        let leases = self.settings.leases;
        self.transact(ob, |c, _| {
            let rows = c.query(
                concat!(
                    "SELECT ",
                    run_columns!("$2"),
                    " FROM chat_active_runs WHERE host_id = $1 ORDER BY app_session_id
                     FOR UPDATE SKIP LOCKED"
                ),
                &[&b(host.as_str()), &ms(leases.stale_after)],
            )?;
            let mut beat = Heartbeat::default();
            for row in &rows {
                let run = read_run(row)?;
                let (s, r) = (b(run.session.as_str()), b(run.hosted.run.run_id.as_str()));
                if reclaimable(&run, host, veto) {
                    c.execute(
                        "DELETE FROM chat_active_runs WHERE app_session_id = $1 AND run_id = $2",
                        &[&s, &r],
                    )?;
                    beat.reclaimed.push((run.session, run.hosted.run.run_id));
                } else {
                    beat.renewed += c.execute(
                        "UPDATE chat_active_runs
                         SET lease_until = clock_timestamp() + $3::FLOAT8 * INTERVAL '1 millisecond'
                         WHERE app_session_id = $1 AND run_id = $2",
                        &[&s, &r, &ms(leases.run_lease)],
                    )?;
                }
            }
            beat.renewed += c.execute(
                "UPDATE chat_run_cancellations
                 SET lease_until = clock_timestamp() + $2::FLOAT8 * INTERVAL '1 millisecond'
                 WHERE host_id = $1",
                &[&b(host.as_str()), &ms(leases.run_lease)],
            )?;
            Ok(beat)
        })
    }

    /// Marks a cancellation of `run` pending for `host`: new runs in the scope wait
    /// until it ends, or until its lease lapses if the host dies.
    pub fn begin_cancellation(
        &mut self,
        host: &HostId,
        session: &SessionId,
        run: &RunId,
    ) -> Result<(), OutboxError> {
        let scope = self.scope_key(session);
        let lease = self.settings.leases.run_lease;
        let base = base_session(session);
        self.transact(ob, |c, _| {
            c.execute("SELECT pg_advisory_xact_lock($1)", &[&scope])?;
            c.execute(
                "INSERT INTO chat_run_cancellations
                     (app_session_id, run_id, base_session_id, host_id, lease_until)
                 VALUES ($1, $2, $3, $4, clock_timestamp() + $5::FLOAT8 * INTERVAL '1 millisecond')
                 ON CONFLICT (app_session_id, run_id) DO UPDATE SET
                     host_id = excluded.host_id, lease_until = excluded.lease_until",
                &[
                    &b(session.as_str()),
                    &b(run.as_str()),
                    &b(base.as_str()),
                    &b(host.as_str()),
                    &ms(lease),
                ],
            )?;
            Ok(())
        })
    }

    /// Clears a pending cancellation.
    pub fn end_cancellation(
        &mut self,
        session: &SessionId,
        run: &RunId,
    ) -> Result<(), OutboxError> {
        let scope = self.scope_key(session);
        self.transact(ob, |c, _| {
            c.execute("SELECT pg_advisory_xact_lock($1)", &[&scope])?;
            c.execute(
                "DELETE FROM chat_run_cancellations WHERE app_session_id = $1 AND run_id = $2",
                &[&b(session.as_str()), &b(run.as_str())],
            )?;
            Ok(())
        })
    }

    /// True while a cancellation whose lease holds is pending in the scope of `session`.
    pub fn cancellation_pending(&mut self, session: &SessionId) -> Result<bool, OutboxError> {
        let base = base_session(session);
        self.read(ob, |c, _| {
            let row = c.query_opt(
                "SELECT 1 FROM chat_run_cancellations
                 WHERE base_session_id = $1 AND lease_until > clock_timestamp() LIMIT 1",
                &[&b(base.as_str())],
            )?;
            Ok(row.is_some())
        })
    }

    /// Gives `host` the scope of `session` for [`Leases::session_lease`]: granted when
    /// nobody holds it, its lease has expired, or `host` holds it already (then renewed,
    /// same token). Granted leases are remembered for fencing.
    pub fn acquire_session(
        &mut self,
        host: &HostId,
        session: &SessionId,
    ) -> Result<SessionLease, LeaseError> {
        let base = base_session(session);
        let lease = self.settings.leases.session_lease;
        let granted = self.transact(ob, |c, _| {
            // A holder that releases between the insert and the read of the holder lets
            // the next insert win; a few rounds settle any race that is not a loop.
            for _ in 0..8 {
                let row = c.query_opt(
                    "INSERT INTO chat_session_leases AS l (base_session_id, host_id, token, expires_at)
                     VALUES ($1, $2, nextval('chat_session_lease_tokens'),
                             clock_timestamp() + $3::FLOAT8 * INTERVAL '1 millisecond')
                     ON CONFLICT (base_session_id) DO UPDATE SET
                         token = CASE WHEN l.host_id = excluded.host_id
                                       AND l.expires_at > clock_timestamp()
                                      THEN l.token ELSE excluded.token END,
                         host_id = excluded.host_id,
                         expires_at = excluded.expires_at
                     WHERE l.host_id = excluded.host_id OR l.expires_at <= clock_timestamp()
                     RETURNING token",
                    &[&b(base.as_str()), &b(host.as_str()), &ms(lease)],
                )?;
                if let Some(row) = row {
                    let token: i64 = columns::get(&row, 0, LEASE_TOKEN)
                        .map_err(|r| corrupt("session lease", r))?;
                    return Ok(Ok(u64::try_from(token).unwrap_or(0)));
                }
                let holder = c.query_opt(
                    "SELECT host_id,
                            greatest(0, extract(epoch FROM expires_at - clock_timestamp()) * 1000)::BIGINT
                     FROM chat_session_leases WHERE base_session_id = $1",
                    &[&b(base.as_str())],
                )?;
                if let Some(holder) = holder {
                    let left: i64 = columns::get(&holder, 1, LEASE_LEFT)
                        .map_err(|r| corrupt("session lease", r))?;
                    return Ok(Err(SessionBusy {
                        session: base.clone(),
                        holder: id_of(&holder, 0, LEASE_HOST, HostId::new)?,
                        expires_in: Duration::from_millis(u64::try_from(left).unwrap_or(0)),
                    }));
                }
            }
            Err(Fail::Refused(OutboxError::unavailable(format!(
                "the lease of session {base} changed hands too often to be acquired"
            ))))
        });
        let token = match granted {
            Ok(Ok(token)) => token,
            Ok(Err(busy)) => return Err(LeaseError::Busy(busy)),
            Err(e) => return Err(LeaseError::Store(e)),
        };
        self.local.fence.held.insert(base.clone(), token);
        Ok(SessionLease {
            session: base,
            host: host.clone(),
            token,
            expires_in: lease,
        })
    }

    /// Renews a lease this host holds; [`LeaseError::Lost`] when it expired or passed to
    /// another host (the host must stop writing the scope and forget what it knew).
    pub fn renew_session(&mut self, lease: &SessionLease) -> Result<SessionLease, LeaseError> {
        let length = self.settings.leases.session_lease;
        let renewed = self.read(ob, |c, _| {
            let n = c.execute(
                "UPDATE chat_session_leases
                 SET expires_at = clock_timestamp() + $4::FLOAT8 * INTERVAL '1 millisecond'
                 WHERE base_session_id = $1 AND host_id = $2 AND token = $3
                   AND expires_at > clock_timestamp()",
                &[
                    &b(lease.session.as_str()),
                    &b(lease.host.as_str()),
                    &(lease.token as i64),
                    &ms(length),
                ],
            )?;
            Ok(n == 1)
        })?;
        if !renewed {
            self.local.fence.held.remove(&lease.session);
            return Err(LeaseError::Lost(LeaseLost {
                session: lease.session.clone(),
                token: Some(lease.token),
            }));
        }
        Ok(SessionLease {
            expires_in: length,
            ..lease.clone()
        })
    }

    /// Gives a lease back; false when it was not held any more.
    pub fn release_session(&mut self, lease: &SessionLease) -> Result<bool, OutboxError> {
        self.local.fence.held.remove(&lease.session);
        self.read(ob, |c, _| {
            let n = c.execute(
                "DELETE FROM chat_session_leases
                 WHERE base_session_id = $1 AND host_id = $2 AND token = $3",
                &[
                    &b(lease.session.as_str()),
                    &b(lease.host.as_str()),
                    &(lease.token as i64),
                ],
            )?;
            Ok(n == 1)
        })
    }

    /// Turns fencing on or off: when on, every outbox write must hold a live lease on
    /// the scope of the session it writes (acquired through this store), checked in the
    /// write's own transaction.
    pub fn set_fencing(&mut self, on: bool) {
        self.local.fence.enabled = on;
    }

    /// The session leases this store holds (shared with the stores given it through
    /// [`PostgresStore::share_leases`]).
    pub fn lease_set(&self) -> LeaseSet {
        self.local.fence.held.clone()
    }

    /// Makes this store write under the leases of `leases` (another store's, the one that
    /// acquires and renews them) and turns its fencing on: each of its writes is refused
    /// with the typed lease-lost error unless the set holds a live lease of the scope.
    pub fn share_leases(&mut self, leases: &LeaseSet) {
        self.local.fence.held = leases.clone();
        self.local.fence.enabled = true;
    }

    /// Makes this store the run registry custody shares with the other hosts, as `host`
    /// ([`outbox_core::store::SharedRuns`]): custody over this store writes its runs and
    /// stops through to `chat_active_runs` and `chat_run_cancellations`, adopts the runs
    /// a host that lost a scope left there, and resumes its stops.
    pub fn share_runs(&mut self, host: HostId) {
        self.local.runs_host = Some(host);
    }

    /// Records where `host` can be reached (a WebSocket URL, say) and that it is alive
    /// now; call at start and with every heartbeat.
    pub fn register_host(&mut self, host: &HostId, address: &str) -> Result<(), OutboxError> {
        self.read(ob, |c, _| {
            c.execute(
                "INSERT INTO chat_hosts (host_id, address, seen_at)
                 VALUES ($1, $2, clock_timestamp())
                 ON CONFLICT (host_id) DO UPDATE SET
                     address = excluded.address, seen_at = excluded.seen_at",
                &[&b(host.as_str()), &address],
            )?;
            Ok(())
        })
    }

    /// Who holds a live lease on the scope of `session`, with the address it registered
    /// (if any); `None` when nobody does.
    pub fn lease_holder(
        &mut self,
        session: &SessionId,
    ) -> Result<Option<(HostId, Option<String>)>, OutboxError> {
        let base = base_session(session);
        self.read(ob, |c, _| {
            let row = c.query_opt(
                "SELECT l.host_id, h.address FROM chat_session_leases l
                 LEFT JOIN chat_hosts h ON h.host_id = l.host_id
                 WHERE l.base_session_id = $1 AND l.expires_at > clock_timestamp()",
                &[&b(base.as_str())],
            )?;
            let Some(row) = row else { return Ok(None) };
            let host = id_of(&row, 0, LEASE_HOST, HostId::new)?;
            let address: Option<String> =
                columns::get(&row, 1, Column::new("chat_hosts", "address"))
                    .map_err(|r| corrupt("host address", r))?;
            Ok(Some((host, address)))
        })
    }

    /// Base sessions nobody serves that have something to serve: a lease that expired
    /// (its host died or let it lapse), or a saved outbox whose scope has no lease (a
    /// session message written for a session no host served). At most `limit`, in byte
    /// order. Costs one read of the lease table and of the outbox's session index.
    pub fn orphaned_sessions(&mut self, limit: usize) -> Result<Vec<SessionId>, OutboxError> {
        self.read(ob, |c, _| {
            let leases = c.query(
                "SELECT base_session_id, expires_at > clock_timestamp() FROM chat_session_leases",
                &[],
            )?;
            let mut live = std::collections::BTreeSet::new();
            let mut orphans = std::collections::BTreeSet::new();
            for row in &leases {
                let base = id_of(
                    row,
                    0,
                    Column::new(LEASES, "base_session_id"),
                    SessionId::new,
                )?;
                let held: bool =
                    columns::get(row, 1, LEASE_LEFT).map_err(|r| corrupt("session lease", r))?;
                if held {
                    live.insert(base);
                } else {
                    orphans.insert(base);
                }
            }
            let saved = c.query("SELECT DISTINCT session_id FROM workspace_chat_outbox", &[])?;
            for row in &saved {
                let session = id_of(
                    row,
                    0,
                    Column::new("workspace_chat_outbox", "session_id"),
                    SessionId::new,
                )?;
                let base = base_session(&session);
                if !live.contains(&base) {
                    orphans.insert(base);
                }
            }
            Ok(orphans.into_iter().take(limit).collect())
        })
    }

    /// Turns this store into a listener of wake-ups ([`WAKE_CHANNEL`]): a write into a
    /// session another host may serve (a session message) wakes whoever listens. Give it
    /// a connection of its own.
    ///
    /// # Errors
    ///
    /// The database's error when `LISTEN` fails.
    pub fn into_wake_listener(mut self) -> Result<WakeListener, OutboxError> {
        self.read(ob, |c, _| {
            c.execute("LISTEN custody_wake", &[])?;
            Ok(())
        })?;
        Ok(WakeListener { store: self })
    }

    /// The outbox's typed error for a write refused under a lost lease.
    pub(crate) fn outbox_lease_lost(session: SessionId, message: String) -> OutboxError {
        OutboxError::LeaseLost { session, message }
    }
}

/// A connection that listens for wake-ups ([`PostgresStore::into_wake_listener`]).
pub struct WakeListener {
    store: PostgresStore,
}

impl std::fmt::Debug for WakeListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WakeListener").finish_non_exhaustive()
    }
}

/// One wake-up.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Wake {
    /// Something was written into the scope of this base session.
    Session(SessionId),
    /// Something was written into a scope whose name is too long for a notification:
    /// read every scope served again.
    Every,
}

impl WakeListener {
    /// The wake-ups that arrive within `timeout` (returns at the first, with any others
    /// already there, or empty after `timeout`).
    ///
    /// # Errors
    ///
    /// The connection failed: open a new listener (wake-ups meanwhile are lost, so read
    /// every scope served again).
    pub fn wait(&mut self, timeout: Duration) -> Result<Vec<Wake>, OutboxError> {
        let mut notes = self.store.client.notifications();
        let mut wakes = Vec::new();
        let first = notes.timeout_iter(timeout).next();
        let mut take = |n: postgres::Notification| {
            if n.channel() != WAKE_CHANNEL {
                return;
            }
            wakes.push(match SessionId::new(n.payload()) {
                Ok(s) => Wake::Session(s),
                Err(_) => Wake::Every,
            });
        };
        use postgres::fallible_iterator::FallibleIterator;
        match first {
            Ok(Some(n)) => take(n),
            Ok(None) => return Ok(wakes),
            Err(e) => return Err(ob(e)),
        }
        let mut more = notes.iter();
        loop {
            match more.next() {
                Ok(Some(n)) => take(n),
                Ok(None) => break,
                Err(e) => return Err(ob(e)),
            }
        }
        Ok(wakes)
    }
}

/// The run registry shared with the other hosts, as the host given to
/// [`PostgresStore::share_runs`] (none given: every method fails as unavailable).
impl outbox_core::store::SharedRuns for PostgresStore {
    fn start_run(
        &mut self,
        session: &SessionId,
        run: &ActiveRun,
    ) -> Result<Result<(), RunError>, OutboxError> {
        let host = self.runs_host()?;
        let scope = self.scope_key(session);
        let lease = self.settings.leases.run_lease;
        let stale = ms(self.settings.leases.stale_after);
        let base = base_session(session);
        self.transact(ob, |c, _| {
            c.execute("SELECT pg_advisory_xact_lock($1)", &[&scope])?;
            let pending = c.query_opt(
                "SELECT 1 FROM chat_run_cancellations
                 WHERE base_session_id = $1 AND host_id <> $2
                   AND lease_until > clock_timestamp() LIMIT 1",
                &[&b(base.as_str()), &b(host.as_str())],
            )?;
            if pending.is_some() {
                return Ok(Err(RunError::CancellationPending));
            }
            let current = c.query_opt(
                concat!(
                    "SELECT ",
                    run_columns!("$2"),
                    " FROM chat_active_runs WHERE app_session_id = $1 FOR UPDATE"
                ),
                &[&b(session.as_str()), &stale],
            )?;
            if let Some(row) = current {
                let current = read_run(&row)?;
                let same = current.hosted.host == host && current.hosted.run.run_id == run.run_id;
                let reclaimable = current.stale && current.lapsed;
                if !(same || reclaimable) {
                    return Ok(Err(RunError::InProgress));
                }
                c.execute(
                    "DELETE FROM chat_active_runs WHERE app_session_id = $1",
                    &[&b(session.as_str())],
                )?;
            }
            insert_run(c, session, run, &host, lease)?;
            Ok(Ok(()))
        })
    }

    fn end_run(&mut self, session: &SessionId, run: &RunId) -> Result<(), OutboxError> {
        PostgresStore::end_run(self, session, run).map(|_| ())
    }

    fn joined_by(
        &mut self,
        session: &SessionId,
        run: &RunId,
        op: &OperationId,
    ) -> Result<(), OutboxError> {
        PostgresStore::joined_by(self, session, run, op).map(|_| ())
    }

    fn renew(
        &mut self,
        runs: &[(SessionId, RunId, bool)],
        stops: &[(SessionId, RunId)],
    ) -> Result<(), OutboxError> {
        let host = self.runs_host()?;
        let lease = ms(self.settings.leases.run_lease);
        self.transact(ob, |c, _| {
            for (session, run, touched) in runs {
                c.execute(
                    "UPDATE chat_active_runs
                     SET lease_until = clock_timestamp() + $4::FLOAT8 * INTERVAL '1 millisecond',
                         last_activity = CASE WHEN $5 THEN clock_timestamp() ELSE last_activity END
                     WHERE app_session_id = $1 AND run_id = $2 AND host_id = $3",
                    &[
                        &b(session.as_str()),
                        &b(run.as_str()),
                        &b(host.as_str()),
                        &lease,
                        touched,
                    ],
                )?;
            }
            for (session, run) in stops {
                c.execute(
                    "UPDATE chat_run_cancellations
                     SET lease_until = clock_timestamp() + $4::FLOAT8 * INTERVAL '1 millisecond'
                     WHERE app_session_id = $1 AND run_id = $2 AND host_id = $3",
                    &[
                        &b(session.as_str()),
                        &b(run.as_str()),
                        &b(host.as_str()),
                        &lease,
                    ],
                )?;
            }
            Ok(())
        })
    }

    fn renew_every(&self) -> Millis {
        let every = self.settings.leases.run_lease / 3;
        Millis(u64::try_from(every.as_millis()).unwrap_or(u64::MAX).max(1))
    }

    fn begin_cancellation(&mut self, session: &SessionId, run: &RunId) -> Result<(), OutboxError> {
        let host = self.runs_host()?;
        PostgresStore::begin_cancellation(self, &host, session, run)
    }

    fn end_cancellation(&mut self, session: &SessionId, run: &RunId) -> Result<(), OutboxError> {
        PostgresStore::end_cancellation(self, session, run)
    }

    fn scope(&mut self, base: &SessionId) -> Result<SharedScope, OutboxError> {
        let host = self.runs_host()?;
        let stale = ms(self.settings.leases.stale_after);
        self.read(ob, |c, _| {
            let rows = c.query(
                concat!(
                    "SELECT ",
                    run_columns!("$2"),
                    ", greatest(0,
                        $2::FLOAT8 - extract(epoch FROM clock_timestamp() - last_activity) * 1000,
                        extract(epoch FROM lease_until - clock_timestamp()) * 1000)::BIGINT
                     FROM chat_active_runs WHERE base_session_id = $1 ORDER BY app_session_id"
                ),
                &[&b(base.as_str()), &stale],
            )?;
            let mut scope = SharedScope::default();
            for row in &rows {
                let run = read_run(row)?;
                let wait: i64 = columns::get(row, 11, Column::new(RUNS, "reclaimable_in"))
                    .map_err(|r| corrupt("active run", r))?;
                let mut shared = SharedRun::new(run.session, run.hosted.run);
                shared.mine = run.hosted.host == host;
                shared.reclaimable_in = Millis(u64::try_from(wait).unwrap_or(0));
                scope.runs.push(shared);
            }
            let rows = c.query(
                "SELECT app_session_id, run_id, host_id FROM chat_run_cancellations
                 WHERE base_session_id = $1 ORDER BY app_session_id, run_id",
                &[&b(base.as_str())],
            )?;
            for row in &rows {
                let session = id_of(row, 0, RUN_SESSION, SessionId::new)?;
                let run = id_of(row, 1, RUN_ID, RunId::new)?;
                let by = id_of(row, 2, RUN_HOST, HostId::new)?;
                let mut stop = SharedCancellation::new(session, run);
                stop.mine = by == host;
                scope.cancellations.push(stop);
            }
            Ok(scope)
        })
    }
}

impl PostgresStore {
    /// The host given to [`PostgresStore::share_runs`].
    fn runs_host(&self) -> Result<HostId, OutboxError> {
        self.local.runs_host.clone().ok_or_else(|| {
            OutboxError::unavailable(
                "this store is no shared run registry: no host was given to share_runs",
            )
        })
    }
}
