//! Message custody on PostgreSQL: the outbox, operation identities, the operation ledger
//! and session-message routes ([`OutboxStore`]), every method one transaction.
//!
//! Invariants, across any number of hosts on the database:
//! - a claim writes its identity and its entry together or nothing; the identity's
//!   primary key picks one winner among racing claims, and the losers read the
//!   winner's identity (OB-03);
//! - a compare-and-set on an entry (`replace_entry`, `rekey_entry`) reads it `FOR
//!   UPDATE`, so no other write lands between the compare and the set;
//! - a removed entry's identity stays, marked removed (OB-03);
//! - an outbox row that does not decode is shown blocked with what it holds, never
//!   dropped and never hiding its neighbours (OB-05);
//! - with fencing on ([`crate::hosts`]), every write checks in its own transaction that
//!   this host still holds the session's lease.

use outbox_core::entry::{OutboxEntry, StoredEntry};
use outbox_core::fingerprint::Digest256;
use outbox_core::ids::{CallId, OperationId, QueueId, RunId, ScopeId, SessionId, ThreadId};
use outbox_core::ledger::{LedgerRecord, LedgerStatus};
use outbox_core::store::{
    Claim, EntryColumns, Identity, OutboxError, OutboxStore, RouteClaim, RouteDelivery,
    SessionMessageRoute,
};
use postgres::{GenericClient, Row};
use timeline_core::time::Millis;

use crate::columns::{self, Column, Refused, Stored};
use crate::error::ob;
use crate::hosts::fence_check;
use crate::{Conn, Fail, PostgresStore};

fn corrupt(what: impl Into<String>, reason: impl Into<String>) -> OutboxError {
    OutboxError::Corrupt {
        what: what.into(),
        reason: reason.into(),
    }
}

/// A refused column value as the outbox's typed error about `what`.
fn refused(what: impl Into<String>) -> impl FnOnce(Refused) -> Fail<OutboxError> {
    move |r| Fail::Refused(corrupt(what, r.to_string()))
}

fn to_json<T: serde::Serialize>(v: &T, what: &str) -> Result<String, OutboxError> {
    serde_json::to_string(v).map_err(|e| corrupt(what, e.to_string()))
}

/// An ID column, as UTF-8 text made into its type.
fn stored_id<T>(
    row: &Row,
    i: usize,
    column: Column,
    what: &'static str,
    make: impl FnOnce(String) -> Result<T, timeline_core::key::KeyError>,
) -> Result<T, Fail<OutboxError>> {
    let bytes: &[u8] = columns::get(row, i, column).map_err(refused(what))?;
    let text = columns::id_text(column, bytes).map_err(refused(what))?;
    make(text).map_err(|e| Fail::Refused(corrupt(what, e.to_string())))
}

/// An optional ID column.
fn optional_id<T>(
    row: &Row,
    i: usize,
    column: Column,
    what: &'static str,
    make: impl FnOnce(String) -> Result<T, timeline_core::key::KeyError>,
) -> Result<Option<T>, Fail<OutboxError>> {
    let bytes: Option<&[u8]> = columns::get(row, i, column).map_err(refused(what))?;
    bytes
        .map(|bytes| {
            let text = columns::id_text(column, bytes).map_err(refused(what))?;
            make(text).map_err(|e| Fail::Refused(corrupt(what, e.to_string())))
        })
        .transpose()
}

fn b(id: &str) -> &[u8] {
    id.as_bytes()
}

// ----- entries ---------------------------------------------------------------------------

/// An entry as `entry_json` holds it: the entry's own encoding (the seed's entry JSON)
/// without the queue ID, the operation ID and the position, which the row's own columns
/// hold (as in the SQLite backend). A JSON that still carries them reads the same: the
/// columns win. Whatever the entry encodes is kept, so a field added to the entry is
/// stored without a change here.
fn entry_json(entry: &OutboxEntry) -> Result<String, OutboxError> {
    let mut value =
        serde_json::to_value(entry).map_err(|e| corrupt("outbox entry", e.to_string()))?;
    if let Some(fields) = value.as_object_mut() {
        for column in ["queueId", "operationId", "position"] {
            fields.remove(column);
        }
    }
    to_json(&value, "outbox entry")
}

/// The outbox columns an entry is read from, in [`EntryRow::read`] order.
macro_rules! entry_columns {
    () => {
        "queue_id, operation_id, position, entry_json"
    };
}

const OUTBOX: &str = "workspace_chat_outbox";
const OUTBOX_QUEUE: Column = Column::new(OUTBOX, "queue_id");
const OUTBOX_OPERATION: Column = Column::new(OUTBOX, "operation_id");
const OUTBOX_POSITION: Column = Column::new(OUTBOX, "position");
const OUTBOX_JSON: Column = Column::new(OUTBOX, "entry_json");

/// An outbox row, each column checked as it is read. A column that does not read back
/// never fails the read: the row then shows as blocked (OB-05).
struct EntryRow {
    columns: EntryColumns,
    /// The operation ID's bytes as stored (to mark its identity removed).
    operation_bytes: Vec<u8>,
}

impl EntryRow {
    fn read(row: &Row) -> EntryRow {
        let mut reasons = Vec::new();
        let mut id = |i: usize, column: Column| -> (String, Vec<u8>) {
            match columns::get::<&[u8]>(row, i, column) {
                Ok(bytes) => match columns::id_text(column, bytes) {
                    Ok(text) => (text, bytes.to_vec()),
                    Err(r) => {
                        reasons.push(r.to_string());
                        (String::from_utf8_lossy(bytes).into_owned(), bytes.to_vec())
                    }
                },
                Err(r) => {
                    reasons.push(r.to_string());
                    (String::new(), Vec::new())
                }
            }
        };
        let (queue_id, _) = id(0, OUTBOX_QUEUE);
        let (operation_id, operation_bytes) = id(1, OUTBOX_OPERATION);
        let position = columns::get::<i64>(row, 2, OUTBOX_POSITION).unwrap_or_else(|r| {
            reasons.push(r.to_string());
            EntryColumns::UNREADABLE_POSITION
        });
        let json = columns::get::<String>(row, 3, OUTBOX_JSON).unwrap_or_else(|r| {
            reasons.push(r.to_string());
            String::new()
        });
        EntryRow {
            columns: EntryColumns {
                queue_id,
                operation_id,
                position,
                json,
                refused: (!reasons.is_empty()).then(|| reasons.join("; ")),
            },
            operation_bytes,
        }
    }
}

fn insert_entry<C: GenericClient>(
    c: &mut Conn<'_, C>,
    session: &SessionId,
    entry: &OutboxEntry,
    json: &str,
) -> Result<(), Fail<OutboxError>> {
    c.execute(
        "INSERT INTO workspace_chat_outbox (session_id, queue_id, operation_id, position, entry_json)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (session_id, queue_id) DO UPDATE SET
             operation_id = excluded.operation_id,
             position = excluded.position,
             entry_json = excluded.entry_json",
        &[
            &b(session.as_str()),
            &b(entry.queue_id.as_str()),
            &b(entry.operation_id.as_str()),
            &entry.position,
            &json,
        ],
    )?;
    Ok(())
}

/// Inserts an identity row unless the operation has one; true when it inserted.
fn insert_identity<C: GenericClient>(
    c: &mut Conn<'_, C>,
    session: &SessionId,
    op: &OperationId,
    fingerprint: &Digest256,
    queue: &QueueId,
    claimed_at: Millis,
) -> Result<bool, Fail<OutboxError>> {
    let inserted = c.execute(
        "INSERT INTO workspace_chat_outbox_operation_identity
             (session_id, operation_id, fingerprint, queue_id, removed, claimed_at)
         VALUES ($1, $2, $3, $4, false, $5)
         ON CONFLICT (session_id, operation_id) DO NOTHING",
        &[
            &b(session.as_str()),
            &b(op.as_str()),
            &fingerprint.as_str(),
            &b(queue.as_str()),
            &(i64::try_from(claimed_at.as_u64()).unwrap_or(i64::MAX)),
        ],
    )?;
    Ok(inserted == 1)
}

const IDENTITIES: &str = "workspace_chat_outbox_operation_identity";
const IDENTITY_FINGERPRINT: Column = Column::new(IDENTITIES, "fingerprint");
const IDENTITY_QUEUE: Column = Column::new(IDENTITIES, "queue_id");
const IDENTITY_REMOVED: Column = Column::new(IDENTITIES, "removed");

fn read_identity<C: GenericClient>(
    c: &mut Conn<'_, C>,
    session: &SessionId,
    op: &OperationId,
) -> Result<Option<Identity>, Fail<OutboxError>> {
    let row = c.query_opt(
        "SELECT fingerprint, queue_id, removed FROM workspace_chat_outbox_operation_identity
         WHERE session_id = $1 AND operation_id = $2",
        &[&b(session.as_str()), &b(op.as_str())],
    )?;
    row.map(|row| {
        let what = format!("operation identity {session}/{op}");
        let fingerprint: String =
            columns::get(&row, 0, IDENTITY_FINGERPRINT).map_err(refused(what.clone()))?;
        Ok(Identity {
            fingerprint: Digest256::from_hex(fingerprint),
            queue_id: stored_id(&row, 1, IDENTITY_QUEUE, "identity queue ID", QueueId::new)?,
            removed: columns::get(&row, 2, IDENTITY_REMOVED).map_err(refused(what))?,
        })
    })
    .transpose()
}

/// The outbox row of (session, queue), locked until the transaction ends.
fn lock_entry_row<C: GenericClient>(
    c: &mut Conn<'_, C>,
    session: &SessionId,
    queue: &QueueId,
) -> Result<Option<EntryRow>, Fail<OutboxError>> {
    let row = c.query_opt(
        concat!(
            "SELECT ",
            entry_columns!(),
            " FROM workspace_chat_outbox WHERE session_id = $1 AND queue_id = $2 FOR UPDATE"
        ),
        &[&b(session.as_str()), &b(queue.as_str())],
    )?;
    Ok(row.as_ref().map(EntryRow::read))
}

/// True when the stored entry of `expected`'s queue ID decodes to `expected`; the row
/// stays locked for the rest of the transaction.
fn still<C: GenericClient>(
    c: &mut Conn<'_, C>,
    session: &SessionId,
    expected: &OutboxEntry,
) -> Result<bool, Fail<OutboxError>> {
    let row = lock_entry_row(c, session, &expected.queue_id)?;
    Ok(row.and_then(|r| r.columns.decode().ok()).as_ref() == Some(expected))
}

fn mark_removed<C: GenericClient>(
    c: &mut Conn<'_, C>,
    session: &SessionId,
    op: &[u8],
) -> Result<(), Fail<OutboxError>> {
    c.execute(
        "UPDATE workspace_chat_outbox_operation_identity SET removed = true
         WHERE session_id = $1 AND operation_id = $2",
        &[&b(session.as_str()), &op],
    )?;
    Ok(())
}

// ----- ledger ----------------------------------------------------------------------------

const LEDGER: &str = "chat_operation_ledger";
const LEDGER_STATUS: Column = Column::new(LEDGER, "status");
const LEDGER_RECORD: Column = Column::new(LEDGER, "record_json");

/// The `status` column's text for a ledger status: its name in the record JSON.
fn status_text(status: LedgerStatus) -> String {
    serde_json::to_value(status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// A ledger row read back (OB-07): the record JSON decodes, and the `status` column says
/// the same status as the JSON. A row where they differ is refused, since either could
/// be the truth and the ledger decides what a retry may do.
fn read_ledger(
    row: &Row,
    session: &SessionId,
    op: &OperationId,
) -> Result<LedgerRecord, Fail<OutboxError>> {
    let what = || format!("ledger {session}/{op}");
    let status: String = columns::get(row, 0, LEDGER_STATUS).map_err(refused(what()))?;
    let json: String = columns::get(row, 1, LEDGER_RECORD).map_err(refused(what()))?;
    let record: LedgerRecord = serde_json::from_str(&json)
        .map_err(|e| Fail::Refused(corrupt(what(), format!("{LEDGER_RECORD}: {e}"))))?;
    let said = status_text(record.status);
    if status != said {
        return Err(refused(what())(Refused::new(
            LEDGER_STATUS,
            Stored::Text(&status),
            format!("TEXT '{said}', the status of {LEDGER_RECORD}"),
        )));
    }
    Ok(record)
}

fn put_ledger<C: GenericClient>(
    c: &mut Conn<'_, C>,
    session: &SessionId,
    op: &OperationId,
    record: &LedgerRecord,
) -> Result<(), Fail<OutboxError>> {
    let json = to_json(record, "ledger record").map_err(Fail::Refused)?;
    c.execute(
        "INSERT INTO chat_operation_ledger (app_session_id, operation_id, status, record_json)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (app_session_id, operation_id) DO UPDATE SET
             status = excluded.status, record_json = excluded.record_json",
        &[
            &b(session.as_str()),
            &b(op.as_str()),
            &status_text(record.status),
            &json,
        ],
    )?;
    Ok(())
}

/// The claim's two inserts inside the caller's transaction.
fn claim_in<C: GenericClient>(
    c: &mut Conn<'_, C>,
    session: &SessionId,
    fingerprint: &Digest256,
    entry: &OutboxEntry,
    json: &str,
) -> Result<Claim, Fail<OutboxError>> {
    // The identity's primary key decides: a racing claim of the same operation waits for
    // this one's commit and then finds it; a claimed operation inserts nothing.
    if !insert_identity(
        c,
        session,
        &entry.operation_id,
        fingerprint,
        &entry.queue_id,
        entry.request.created_at,
    )? {
        let existing = read_identity(c, session, &entry.operation_id)?;
        return existing
            .map(Claim::Existing)
            .ok_or_else(|| Fail::Refused(corrupt("operation identity", "claimed but unreadable")));
    }
    // A queue ID that holds another operation's entry is refused (the transaction rolls
    // back, the identity with it).
    let placed = c.execute(
        "INSERT INTO workspace_chat_outbox (session_id, queue_id, operation_id, position, entry_json)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (session_id, queue_id) DO NOTHING",
        &[
            &b(session.as_str()),
            &b(entry.queue_id.as_str()),
            &b(entry.operation_id.as_str()),
            &entry.position,
            &json,
        ],
    )?;
    if placed == 0 {
        return Err(Fail::Refused(OutboxError::QueueTaken(
            entry.queue_id.clone(),
        )));
    }
    Ok(Claim::Claimed)
}

// ----- routes ----------------------------------------------------------------------------

macro_rules! route_columns {
    () => {
        "operation_id, recipient_session_id, sender_session_id, sender_call_id, \
         sender_run_id, sender_thread_id, chain_id, hop, created_at, delivery"
    };
}

const ROUTES: &str = "chat_session_messages";
const ROUTE_OPERATION: Column = Column::new(ROUTES, "operation_id");
const ROUTE_RECIPIENT: Column = Column::new(ROUTES, "recipient_session_id");
const ROUTE_SENDER: Column = Column::new(ROUTES, "sender_session_id");
const ROUTE_CALL: Column = Column::new(ROUTES, "sender_call_id");
const ROUTE_RUN: Column = Column::new(ROUTES, "sender_run_id");
const ROUTE_THREAD: Column = Column::new(ROUTES, "sender_thread_id");
const ROUTE_CHAIN: Column = Column::new(ROUTES, "chain_id");
const ROUTE_HOP: Column = Column::new(ROUTES, "hop");
const ROUTE_CREATED: Column = Column::new(ROUTES, "created_at");
const ROUTE_DELIVERY: Column = Column::new(ROUTES, "delivery");

fn delivery_text(d: RouteDelivery) -> &'static str {
    match d {
        RouteDelivery::Sent => "sent",
        RouteDelivery::NeedsApproval => "needs-approval",
        RouteDelivery::Declined => "declined",
    }
}

/// The route a row holds (OB-16), every column checked.
fn parse_route(row: &Row) -> Result<SessionMessageRoute, Fail<OutboxError>> {
    let what = "session message route";
    let chain: &[u8] = columns::get(row, 6, ROUTE_CHAIN).map_err(refused(what))?;
    let hop: i64 = columns::get(row, 7, ROUTE_HOP).map_err(refused(what))?;
    let hop = columns::integer(ROUTE_HOP, hop, 0, i64::from(u32::MAX)).map_err(refused(what))?;
    let created: i64 = columns::get(row, 8, ROUTE_CREATED).map_err(refused(what))?;
    let delivery: String = columns::get(row, 9, ROUTE_DELIVERY).map_err(refused(what))?;
    Ok(SessionMessageRoute {
        operation_id: stored_id(row, 0, ROUTE_OPERATION, "route operation", OperationId::new)?,
        recipient_session_id: stored_id(
            row,
            1,
            ROUTE_RECIPIENT,
            "route recipient",
            SessionId::new,
        )?,
        sender_session_id: stored_id(row, 2, ROUTE_SENDER, "route sender", SessionId::new)?,
        sender_call_id: stored_id(row, 3, ROUTE_CALL, "route call", CallId::new)?,
        sender_run_id: optional_id(row, 4, ROUTE_RUN, what, RunId::new)?,
        sender_thread_id: optional_id(row, 5, ROUTE_THREAD, what, ThreadId::new)?,
        chain_id: columns::id_text(ROUTE_CHAIN, chain).map_err(refused(what))?,
        hop: u32::try_from(hop).map_err(|e| Fail::Refused(corrupt(what, e.to_string())))?,
        created_at: Millis(columns::exact(ROUTE_CREATED, created).map_err(refused(what))?),
        delivery: columns::one_of(
            ROUTE_DELIVERY,
            &delivery,
            &[
                RouteDelivery::Sent,
                RouteDelivery::NeedsApproval,
                RouteDelivery::Declined,
            ]
            .map(|d| (delivery_text(d), d)),
        )
        .map_err(refused(what))?,
    })
}

impl OutboxStore for PostgresStore {
    fn shared_runs(&mut self) -> Option<&mut dyn outbox_core::store::SharedRuns> {
        if self.local.runs_host.is_some() {
            Some(self)
        } else {
            None
        }
    }

    fn claim(
        &mut self,
        session: &SessionId,
        fingerprint: &Digest256,
        entry: &OutboxEntry,
    ) -> Result<Claim, OutboxError> {
        let json = entry_json(entry)?;
        self.transact(ob, |c, local| {
            fence_check(
                c,
                &local.fence,
                &[session],
                PostgresStore::outbox_lease_lost,
            )?;
            claim_in(c, session, fingerprint, entry, &json)
        })
    }

    fn claim_sending(
        &mut self,
        session: &SessionId,
        fingerprint: &Digest256,
        entry: &OutboxEntry,
        scope: &ScopeId,
        record: &LedgerRecord,
    ) -> Result<Claim, OutboxError> {
        let json = entry_json(entry)?;
        self.transact(ob, |c, local| {
            fence_check(
                c,
                &local.fence,
                &[session, scope.base()],
                PostgresStore::outbox_lease_lost,
            )?;
            let claim = claim_in(c, session, fingerprint, entry, &json)?;
            if claim == Claim::Claimed {
                put_ledger(c, scope.base(), &entry.operation_id, record)?;
            }
            Ok(claim)
        })
    }

    fn claim_session_message(
        &mut self,
        recipient: &SessionId,
        fingerprint: &Digest256,
        entry: &OutboxEntry,
        route: &SessionMessageRoute,
    ) -> Result<RouteClaim, OutboxError> {
        let json = entry_json(entry)?;
        self.transact(ob, |c, local| {
            // The sender's host writes into the recipient's outbox whoever serves the
            // recipient: under the sender's lease, and the recipient's owner is woken
            // when this commits (it reads the outbox again).
            fence_check(
                c,
                &local.fence,
                &[&route.sender_session_id],
                PostgresStore::outbox_lease_lost,
            )?;
            // The route's unique keys decide among racing claims: the sender's call
            // (its own route again) and the operation (taken by another call).
            let placed = c.execute(
                concat!(
                    "INSERT INTO chat_session_messages (",
                    route_columns!(),
                    ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT DO NOTHING"
                ),
                &[
                    &b(route.operation_id.as_str()),
                    &b(route.recipient_session_id.as_str()),
                    &b(route.sender_session_id.as_str()),
                    &b(route.sender_call_id.as_str()),
                    &route.sender_run_id.as_ref().map(|r| b(r.as_str())),
                    &route.sender_thread_id.as_ref().map(|t| b(t.as_str())),
                    &b(&route.chain_id),
                    &i64::from(route.hop),
                    &(i64::try_from(route.created_at.as_u64()).unwrap_or(i64::MAX)),
                    &delivery_text(route.delivery),
                ],
            )?;
            if placed == 0 {
                let existing = c.query_opt(
                    concat!(
                        "SELECT ",
                        route_columns!(),
                        " FROM chat_session_messages
                         WHERE sender_session_id = $1 AND sender_call_id = $2"
                    ),
                    &[
                        &b(route.sender_session_id.as_str()),
                        &b(route.sender_call_id.as_str()),
                    ],
                )?;
                return match existing {
                    Some(row) => Ok(RouteClaim::ExistingCall(parse_route(&row)?)),
                    None => Err(Fail::Refused(OutboxError::OperationTaken(
                        entry.operation_id.clone(),
                    ))),
                };
            }
            if !insert_identity(
                c,
                recipient,
                &entry.operation_id,
                fingerprint,
                &entry.queue_id,
                route.created_at,
            )? {
                return Err(Fail::Refused(OutboxError::OperationTaken(
                    entry.operation_id.clone(),
                )));
            }
            insert_entry(c, recipient, entry, &json)?;
            crate::hosts::notify_wake(c, recipient)?;
            Ok(RouteClaim::Claimed)
        })
    }

    fn identity(
        &mut self,
        session: &SessionId,
        op: &OperationId,
    ) -> Result<Option<Identity>, OutboxError> {
        self.read(ob, |c, _| read_identity(c, session, op))
    }

    fn entries(&mut self, session: &SessionId) -> Result<Vec<StoredEntry>, OutboxError> {
        self.read(ob, |c, _| {
            let found = c.query(
                concat!(
                    "SELECT ",
                    entry_columns!(),
                    " FROM workspace_chat_outbox WHERE session_id = $1"
                ),
                &[&b(session.as_str())],
            )?;
            let mut rows: Vec<EntryColumns> =
                found.iter().map(|r| EntryRow::read(r).columns).collect();
            rows.sort_by(|a, b| (a.position, &a.queue_id).cmp(&(b.position, &b.queue_id)));
            Ok(rows.into_iter().map(EntryColumns::into_stored).collect())
        })
    }

    fn outbox_sessions(&mut self) -> Result<Vec<SessionId>, OutboxError> {
        self.read(ob, |c, _| {
            let found = c.query(
                "SELECT DISTINCT session_id FROM workspace_chat_outbox ORDER BY session_id",
                &[],
            )?;
            found
                .iter()
                .map(|row| {
                    stored_id(
                        row,
                        0,
                        Column::new(OUTBOX, "session_id"),
                        "outbox session",
                        SessionId::new,
                    )
                })
                .collect()
        })
    }

    fn replace_entry(
        &mut self,
        session: &SessionId,
        expected: &OutboxEntry,
        new: &OutboxEntry,
    ) -> Result<bool, OutboxError> {
        let json = entry_json(new)?;
        self.transact(ob, |c, local| {
            fence_check(
                c,
                &local.fence,
                &[session],
                PostgresStore::outbox_lease_lost,
            )?;
            if !still(c, session, expected)? {
                return Ok(false);
            }
            insert_entry(c, session, new, &json)?;
            Ok(true)
        })
    }

    fn replace_entry_with_ledger(
        &mut self,
        session: &SessionId,
        expected: &OutboxEntry,
        new: &OutboxEntry,
        scope: &ScopeId,
        record: &LedgerRecord,
    ) -> Result<bool, OutboxError> {
        let json = entry_json(new)?;
        self.transact(ob, |c, local| {
            fence_check(
                c,
                &local.fence,
                &[session, scope.base()],
                PostgresStore::outbox_lease_lost,
            )?;
            if !still(c, session, expected)? {
                return Ok(false);
            }
            insert_entry(c, session, new, &json)?;
            put_ledger(c, scope.base(), &new.operation_id, record)?;
            Ok(true)
        })
    }

    fn rekey_entry(
        &mut self,
        session: &SessionId,
        expected: &OutboxEntry,
        fingerprint: &Digest256,
        new: &OutboxEntry,
    ) -> Result<bool, OutboxError> {
        let json = entry_json(new)?;
        self.transact(ob, |c, local| {
            fence_check(
                c,
                &local.fence,
                &[session],
                PostgresStore::outbox_lease_lost,
            )?;
            if !still(c, session, expected)? {
                return Ok(false);
            }
            if !insert_identity(
                c,
                session,
                &new.operation_id,
                fingerprint,
                &new.queue_id,
                new.request.created_at,
            )? {
                return Err(Fail::Refused(OutboxError::OperationTaken(
                    new.operation_id.clone(),
                )));
            }
            mark_removed(c, session, b(expected.operation_id.as_str()))?;
            insert_entry(c, session, new, &json)?;
            Ok(true)
        })
    }

    fn remove_entry(
        &mut self,
        session: &SessionId,
        queue_id: &QueueId,
    ) -> Result<Option<OutboxEntry>, OutboxError> {
        self.transact(ob, |c, local| {
            fence_check(c, &local.fence, &[session], PostgresStore::outbox_lease_lost)?;
            let row = c.query_opt(
                concat!(
                    "DELETE FROM workspace_chat_outbox WHERE session_id = $1 AND queue_id = $2 RETURNING ",
                    entry_columns!()
                ),
                &[&b(session.as_str()), &b(queue_id.as_str())],
            )?;
            let Some(row) = row.as_ref().map(EntryRow::read) else {
                return Ok(None);
            };
            mark_removed(c, session, &row.operation_bytes)?;
            Ok(row.columns.decode().ok())
        })
    }

    fn set_positions(
        &mut self,
        session: &SessionId,
        positions: &[(QueueId, i64)],
    ) -> Result<(), OutboxError> {
        let queues: Vec<&[u8]> = positions.iter().map(|(q, _)| b(q.as_str())).collect();
        let places: Vec<i64> = positions.iter().map(|(_, p)| *p).collect();
        self.transact(ob, |c, local| {
            fence_check(
                c,
                &local.fence,
                &[session],
                PostgresStore::outbox_lease_lost,
            )?;
            // The position is a column of its own; the entry JSON does not hold it.
            c.execute(
                "UPDATE workspace_chat_outbox AS o SET position = p.position
                 FROM unnest($2::BYTEA[], $3::BIGINT[]) AS p (queue_id, position)
                 WHERE o.session_id = $1 AND o.queue_id = p.queue_id",
                &[&b(session.as_str()), &queues, &places],
            )?;
            Ok(())
        })
    }

    fn ledger(
        &mut self,
        scope: &ScopeId,
        op: &OperationId,
    ) -> Result<Option<LedgerRecord>, OutboxError> {
        let session = scope.base();
        self.read(ob, |c, _| {
            let row = c.query_opt(
                "SELECT status, record_json FROM chat_operation_ledger
                 WHERE app_session_id = $1 AND operation_id = $2",
                &[&b(session.as_str()), &b(op.as_str())],
            )?;
            row.map(|row| read_ledger(&row, session, op)).transpose()
        })
    }

    fn put_ledger(
        &mut self,
        scope: &ScopeId,
        op: &OperationId,
        record: &LedgerRecord,
    ) -> Result<(), OutboxError> {
        let session = scope.base();
        self.transact(ob, |c, local| {
            fence_check(
                c,
                &local.fence,
                &[session],
                PostgresStore::outbox_lease_lost,
            )?;
            put_ledger(c, session, op, record)
        })
    }

    fn confirm_sent(
        &mut self,
        scope: &ScopeId,
        members: &[SessionId],
        op: &OperationId,
        record: &LedgerRecord,
    ) -> Result<Vec<(SessionId, QueueId)>, OutboxError> {
        self.transact(ob, |c, local| {
            let members: Vec<&SessionId> = members.iter().filter(|m| scope.contains(m)).collect();
            let mut sessions = members.clone();
            if !sessions.contains(&scope.base()) {
                sessions.push(scope.base());
            }
            fence_check(c, &local.fence, &sessions, PostgresStore::outbox_lease_lost)?;
            put_ledger(c, scope.base(), op, record)?;
            let mut removed = Vec::new();
            for session in members {
                // Through the identity's primary key and the outbox's: a cost
                // independent of the entries that stay in the outbox.
                let gone = c.query(
                    "DELETE FROM workspace_chat_outbox AS o
                     USING workspace_chat_outbox_operation_identity AS i
                     WHERE i.session_id = $1 AND i.operation_id = $2
                       AND o.session_id = i.session_id AND o.queue_id = i.queue_id
                       AND o.operation_id = $2
                     RETURNING o.queue_id",
                    &[&b(session.as_str()), &b(op.as_str())],
                )?;
                for row in &gone {
                    removed.push((
                        session.clone(),
                        stored_id(row, 0, OUTBOX_QUEUE, "queue ID", QueueId::new)?,
                    ));
                }
                mark_removed(c, session, b(op.as_str()))?;
            }
            Ok(removed)
        })
    }

    fn route(&mut self, op: &OperationId) -> Result<Option<SessionMessageRoute>, OutboxError> {
        self.read(ob, |c, _| {
            let row = c.query_opt(
                concat!(
                    "SELECT ",
                    route_columns!(),
                    " FROM chat_session_messages WHERE operation_id = $1"
                ),
                &[&b(op.as_str())],
            )?;
            row.as_ref().map(parse_route).transpose()
        })
    }

    fn set_route_delivery(
        &mut self,
        op: &OperationId,
        delivery: RouteDelivery,
    ) -> Result<(), OutboxError> {
        self.read(ob, |c, _| {
            c.execute(
                "UPDATE chat_session_messages SET delivery = $2 WHERE operation_id = $1",
                &[&b(op.as_str()), &delivery_text(delivery)],
            )?;
            Ok(())
        })
    }
}
