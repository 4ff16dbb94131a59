//! The outbox store: [`OutboxStore`] on SQLite.
//!
//! Tables: the outbox (`workspace_chat_outbox`, one row per queued entry), the operation
//! identities (`workspace_chat_outbox_operation_identity`, one row per operation ever
//! claimed), the operation ledger (`chat_operation_ledger`) and the session-message
//! routes (`chat_session_messages`). Every multi-record rule (the submit claim, the
//! hand-off with its ledger row, a route with its entry, ledger-sent then removal across
//! aliases) is one `IMMEDIATE` transaction.

use outbox_core::entry::{
    Acceptance, Controls, EntryStatus, HandoffRef, MessageRequest, OutboxEntry,
    SessionMessageOrigin, StateWire, StoredEntry,
};
use outbox_core::fingerprint::Digest256;
use outbox_core::ids::{CallId, OperationId, QueueId, RunId, ScopeId, SessionId, ThreadId};
use outbox_core::ledger::{LedgerRecord, LedgerStatus};
use outbox_core::store::{
    Claim, EntryColumns, Identity, OutboxError, OutboxStore, RouteClaim, RouteDelivery,
    SessionMessageRoute,
};
use rusqlite::{params, Connection, OptionalExtension, Transaction};
use timeline_core::time::Millis;

use crate::columns::{self, Column, Refused};
use crate::error::{corrupt, id, ob, refused, stored_id, to_json};
use crate::id_column::{self, read_id, IdColumn};
use crate::SqliteStore;

/// An entry as `entry_json` holds it since schema version 3: everything but the queue
/// ID, the operation ID and the position, which the row's own columns hold. The JSON is
/// most of a submit's bytes, so it stays small; rows written before version 3 still
/// carry the three fields, and the columns win when an entry is read.
///
/// The entry's state is stored as the six fields of [`StateWire`] (`status`, `autoDrain`,
/// `error`, `holdReason`, `acceptance`, `handoff`), in the places and the form they have
/// always had, so files written before the state existed read back unchanged; a
/// combination no state has reads back blocked (the decode goes through the entry's own
/// `Deserialize`).
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct EntryBody<'a> {
    request: &'a MessageRequest,
    controls: &'a Controls,
    status: EntryStatus,
    auto_drain: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hold_reason: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    acceptance: Option<&'a Acceptance>,
    #[serde(skip_serializing_if = "Option::is_none")]
    handoff: Option<HandoffRef<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    session_message: Option<&'a SessionMessageOrigin>,
}

fn entry_json(entry: &OutboxEntry) -> Result<String, OutboxError> {
    // Every field is named, so a field added to the entry (or its state's wire) does not
    // compile here until it is stored too.
    let OutboxEntry {
        queue_id: _,
        operation_id: _,
        position: _,
        request,
        controls,
        state,
        session_message,
    } = entry;
    let StateWire {
        status,
        auto_drain,
        error,
        hold_reason,
        acceptance,
        handoff,
    } = state.wire();
    to_json(&EntryBody {
        request,
        controls,
        status,
        auto_drain,
        error,
        hold_reason,
        acceptance,
        handoff,
        session_message: session_message.as_ref(),
    })
    .map_err(corrupt("outbox entry"))
}

/// The outbox columns an entry is read from, in the order [`read_columns`] reads them.
const ENTRY_COLUMNS: &str = "queue_id, operation_id, position, entry_json";

const OUTBOX: &str = "workspace_chat_outbox";
const OUTBOX_POSITION: Column = Column::new(OUTBOX, "position");
const OUTBOX_JSON: Column = Column::new(OUTBOX, "entry_json");

/// Reads an outbox row (the columns of `entry_columns!`, in order), each column checked
/// as it is read: one that does not read back never fails the read, the row then shows
/// as blocked (OB-05) and its neighbours read as usual.
fn read_columns(r: &rusqlite::Row<'_>) -> rusqlite::Result<EntryColumns> {
    // An ID column that does not read back blocks the entry: the queue ID is then shown
    // as stored, the operation ID left out. A position or JSON column of the wrong type
    // blocks it too, with what is stored in the reason.
    let mut reasons = Vec::new();
    let (queue, op) = (r.get_ref(0)?, r.get_ref(1)?);
    let queue_id = read_id(queue).unwrap_or_else(|reason| {
        reasons.push(reason);
        id_column::shown(queue)
    });
    let operation_id = read_id(op).unwrap_or_else(|reason| {
        reasons.push(reason);
        String::new()
    });
    // Any INTEGER is a position (front-of-queue entries go below zero).
    let position = columns::integer(OUTBOX_POSITION, r.get_ref(2)?, i64::MIN, i64::MAX)
        .unwrap_or_else(|refused| {
            reasons.push(refused.to_string());
            EntryColumns::UNREADABLE_POSITION
        });
    let json = columns::text(OUTBOX_JSON, r.get_ref(3)?).unwrap_or_else(|refused| {
        reasons.push(refused.to_string());
        String::new()
    });
    Ok(EntryColumns {
        queue_id,
        operation_id,
        position,
        json,
        refused: (!reasons.is_empty()).then(|| reasons.join("; ")),
    })
}

fn insert_entry(
    tx: &Transaction<'_>,
    session: &SessionId,
    entry: &OutboxEntry,
) -> Result<(), OutboxError> {
    let json = entry_json(entry)?;
    tx.prepare_cached(
        "INSERT INTO workspace_chat_outbox (session_id, queue_id, operation_id, position, entry_json)
         VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (session_id, queue_id) DO UPDATE SET
             operation_id = excluded.operation_id,
             position = excluded.position,
             entry_json = excluded.entry_json",
    )
    .map_err(ob)?
    .execute(params![
        IdColumn(session.as_str()),
        IdColumn(entry.queue_id.as_str()),
        IdColumn(entry.operation_id.as_str()),
        entry.position,
        json
    ])
    .map_err(ob)?;
    Ok(())
}

fn insert_identity(
    tx: &Transaction<'_>,
    session: &SessionId,
    op: &OperationId,
    fingerprint: &Digest256,
    queue: &QueueId,
    claimed_at: Millis,
) -> Result<(), OutboxError> {
    tx.prepare_cached(
        "INSERT INTO workspace_chat_outbox_operation_identity
             (session_id, operation_id, fingerprint, queue_id, removed, claimed_at)
         VALUES (?1, ?2, ?3, ?4, 0, ?5)",
    )
    .map_err(ob)?
    .execute(params![
        IdColumn(session.as_str()),
        IdColumn(op.as_str()),
        FingerprintColumn::of(fingerprint),
        IdColumn(queue.as_str()),
        claimed_at.as_u64() as i64
    ])
    .map_err(ob)?;
    Ok(())
}

/// A fingerprint as the identity table stores it: the 32 digest bytes when it is the 64
/// lowercase hex characters this library computes, the text itself otherwise, so what
/// is read back always equals what was written.
enum FingerprintColumn<'a> {
    Bytes([u8; 32]),
    Text(&'a str),
}

impl<'a> FingerprintColumn<'a> {
    fn of(digest: &'a Digest256) -> Self {
        match timeline_core::seal::unhex(digest.as_str()).map(<[u8; 32]>::try_from) {
            Some(Ok(bytes)) => FingerprintColumn::Bytes(bytes),
            _ => FingerprintColumn::Text(digest.as_str()),
        }
    }

    /// The fingerprint a stored value holds: a BLOB of exactly the 32 digest bytes, or
    /// text as written (the form any other digest text is kept in). A BLOB of another
    /// length or a value of another type is refused.
    fn read(value: rusqlite::types::ValueRef<'_>) -> Result<Digest256, Refused> {
        use rusqlite::types::ValueRef;
        match value {
            ValueRef::Blob(bytes) if bytes.len() == 32 => {
                Ok(Digest256::from_hex(timeline_core::seal::hex(bytes)))
            }
            ValueRef::Blob(_) => Err(Refused::new(
                IDENTITY_FINGERPRINT,
                value,
                "a BLOB of 32 digest bytes or TEXT",
            )),
            _ => columns::text(IDENTITY_FINGERPRINT, value).map(Digest256::from_hex),
        }
    }
}

impl rusqlite::ToSql for FingerprintColumn<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, ValueRef};
        Ok(ToSqlOutput::Borrowed(match self {
            FingerprintColumn::Bytes(bytes) => ValueRef::Blob(bytes),
            FingerprintColumn::Text(text) => ValueRef::Text(text.as_bytes()),
        }))
    }
}

const IDENTITIES: &str = "workspace_chat_outbox_operation_identity";
const IDENTITY_FINGERPRINT: Column = Column::new(IDENTITIES, "fingerprint");
const IDENTITY_REMOVED: Column = Column::new(IDENTITIES, "removed");

fn read_identity(
    conn: &Connection,
    session: &SessionId,
    op: &OperationId,
) -> Result<Option<Identity>, OutboxError> {
    use rusqlite::types::Value;
    let row: Option<(Value, Result<String, String>, Value)> = conn
        .prepare_cached(
            "SELECT fingerprint, queue_id, removed FROM workspace_chat_outbox_operation_identity
             WHERE session_id = ?1 AND operation_id = ?2",
        )
        .map_err(ob)?
        .query_row(
            params![IdColumn(session.as_str()), IdColumn(op.as_str())],
            |r| Ok((r.get(0)?, read_id(r.get_ref(1)?), r.get(2)?)),
        )
        .optional()
        .map_err(ob)?;
    row.map(|(fp, q, removed)| {
        let what = || format!("operation identity {session}/{op}");
        Ok(Identity {
            fingerprint: FingerprintColumn::read((&fp).into()).map_err(refused(what()))?,
            queue_id: stored_id("identity queue ID", q, QueueId::new)?,
            removed: columns::boolean(IDENTITY_REMOVED, (&removed).into())
                .map_err(refused(what()))?,
        })
    })
    .transpose()
}

/// The outbox row of (session, queue), decoded or not.
fn read_entry_row(
    conn: &Connection,
    session: &SessionId,
    queue: &QueueId,
) -> Result<Option<EntryColumns>, OutboxError> {
    conn.prepare_cached(&format!(
        "SELECT {ENTRY_COLUMNS} FROM workspace_chat_outbox WHERE session_id = ?1 AND queue_id = ?2"
    ))
    .map_err(ob)?
    .query_row(
        params![IdColumn(session.as_str()), IdColumn(queue.as_str())],
        read_columns,
    )
    .optional()
    .map_err(ob)
}

/// The entry of (session, queue), if its row decodes.
fn read_entry(
    conn: &Connection,
    session: &SessionId,
    queue: &QueueId,
) -> Result<Option<OutboxEntry>, OutboxError> {
    Ok(read_entry_row(conn, session, queue)?.and_then(|r| r.decode().ok()))
}

/// Deletes the outbox row of (session, queue); `queue` as the column holds it.
fn delete_entry(
    tx: &Transaction<'_>,
    session: &SessionId,
    queue: &dyn rusqlite::ToSql,
) -> Result<(), OutboxError> {
    tx.prepare_cached("DELETE FROM workspace_chat_outbox WHERE session_id = ?1 AND queue_id = ?2")
        .map_err(ob)?
        .execute(params![IdColumn(session.as_str()), queue])
        .map_err(ob)?;
    Ok(())
}

fn mark_removed(tx: &Transaction<'_>, session: &SessionId, op: &str) -> Result<(), OutboxError> {
    tx.prepare_cached(
        "UPDATE workspace_chat_outbox_operation_identity SET removed = 1
         WHERE session_id = ?1 AND operation_id = ?2",
    )
    .map_err(ob)?
    .execute(params![IdColumn(session.as_str()), IdColumn(op)])
    .map_err(ob)?;
    Ok(())
}

/// A route row's columns as stored, in [`ROUTE_COLUMNS`] order; [`parse_route`] checks
/// them.
fn route_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<[rusqlite::types::Value; 10]> {
    use rusqlite::types::Value;
    let mut out: [rusqlite::types::Value; 10] = std::array::from_fn(|_| Value::Null);
    for (i, slot) in out.iter_mut().enumerate() {
        *slot = r.get(i)?;
    }
    Ok(out)
}

const ROUTE_COLUMNS: &str = "operation_id, recipient_session_id, sender_session_id, sender_call_id,
    sender_run_id, sender_thread_id, chain_id, hop, created_at, delivery";

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

/// The route a row holds (OB-16), every column checked: IDs are UTF-8 text that makes a
/// valid ID, `hop` fits a `u32`, `created_at` is from 0 to 2^53 - 1, and `delivery` is
/// one of its three names.
fn parse_route(v: [rusqlite::types::Value; 10]) -> Result<SessionMessageRoute, OutboxError> {
    use rusqlite::types::ValueRef;
    let what = "session message route";
    let at = |i: usize| v.get(i).map_or(ValueRef::Null, ValueRef::from);
    let text = |column: Column, i: usize| columns::text(column, at(i)).map_err(refused(what));
    let optional =
        |column: Column, i: usize| columns::optional_text(column, at(i)).map_err(refused(what));
    let bad = |reason: String| corrupt(what)(reason);
    let hop = columns::integer(ROUTE_HOP, at(7), 0, i64::from(u32::MAX)).map_err(refused(what))?;
    Ok(SessionMessageRoute {
        operation_id: id(
            "route operation",
            OperationId::new(text(ROUTE_OPERATION, 0)?),
        )?,
        recipient_session_id: id("route recipient", SessionId::new(text(ROUTE_RECIPIENT, 1)?))?,
        sender_session_id: id("route sender", SessionId::new(text(ROUTE_SENDER, 2)?))?,
        sender_call_id: id("route call", CallId::new(text(ROUTE_CALL, 3)?))?,
        sender_run_id: optional(ROUTE_RUN, 4)?
            .map(RunId::new)
            .transpose()
            .map_err(|e| bad(e.to_string()))?,
        sender_thread_id: optional(ROUTE_THREAD, 5)?
            .map(ThreadId::new)
            .transpose()
            .map_err(|e| bad(e.to_string()))?,
        chain_id: text(ROUTE_CHAIN, 6)?,
        hop: u32::try_from(hop).map_err(|e| bad(e.to_string()))?,
        created_at: Millis(columns::exact(ROUTE_CREATED, at(8)).map_err(refused(what))?),
        delivery: columns::one_of(
            ROUTE_DELIVERY,
            at(9),
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

fn delivery_text(d: RouteDelivery) -> &'static str {
    match d {
        RouteDelivery::Sent => "sent",
        RouteDelivery::NeedsApproval => "needs-approval",
        RouteDelivery::Declined => "declined",
    }
}

impl OutboxStore for SqliteStore {
    fn claim(
        &mut self,
        session: &SessionId,
        fingerprint: &Digest256,
        entry: &OutboxEntry,
    ) -> Result<Claim, OutboxError> {
        let tx = self.write().map_err(ob)?;
        let claim = claim_in(&tx, session, fingerprint, entry)?;
        if claim == Claim::Claimed {
            tx.commit().map_err(ob)?;
        }
        Ok(claim)
    }

    fn claim_sending(
        &mut self,
        session: &SessionId,
        fingerprint: &Digest256,
        entry: &OutboxEntry,
        scope: &ScopeId,
        record: &LedgerRecord,
    ) -> Result<Claim, OutboxError> {
        let tx = self.write().map_err(ob)?;
        let claim = claim_in(&tx, session, fingerprint, entry)?;
        if claim == Claim::Claimed {
            put_ledger(&tx, scope.base(), &entry.operation_id, record)?;
            tx.commit().map_err(ob)?;
        }
        Ok(claim)
    }

    fn claim_session_message(
        &mut self,
        recipient: &SessionId,
        fingerprint: &Digest256,
        entry: &OutboxEntry,
        route: &SessionMessageRoute,
    ) -> Result<RouteClaim, OutboxError> {
        let tx = self.write().map_err(ob)?;
        let existing = tx
            .prepare_cached(&format!(
                "SELECT {ROUTE_COLUMNS} FROM chat_session_messages
                 WHERE sender_session_id = ?1 AND sender_call_id = ?2"
            ))
            .map_err(ob)?
            .query_row(
                params![
                    route.sender_session_id.as_str(),
                    route.sender_call_id.as_str()
                ],
                route_from_row,
            )
            .optional()
            .map_err(ob)?;
        if let Some(row) = existing {
            return Ok(RouteClaim::ExistingCall(parse_route(row)?));
        }
        if read_identity(&tx, recipient, &entry.operation_id)?.is_some() {
            return Err(OutboxError::OperationTaken(entry.operation_id.clone()));
        }
        insert_identity(
            &tx,
            recipient,
            &entry.operation_id,
            fingerprint,
            &entry.queue_id,
            route.created_at,
        )?;
        insert_entry(&tx, recipient, entry)?;
        tx.prepare_cached(&format!(
            "INSERT INTO chat_session_messages ({ROUTE_COLUMNS})
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
        ))
        .map_err(ob)?
        .execute(params![
            route.operation_id.as_str(),
            route.recipient_session_id.as_str(),
            route.sender_session_id.as_str(),
            route.sender_call_id.as_str(),
            route.sender_run_id.as_ref().map(|r| r.as_str()),
            route.sender_thread_id.as_ref().map(|t| t.as_str()),
            route.chain_id,
            route.hop as i64,
            route.created_at.as_u64() as i64,
            delivery_text(route.delivery),
        ])
        .map_err(ob)?;
        tx.commit().map_err(ob)?;
        Ok(RouteClaim::Claimed)
    }

    fn identity(
        &mut self,
        session: &SessionId,
        op: &OperationId,
    ) -> Result<Option<Identity>, OutboxError> {
        read_identity(&self.conn, session, op)
    }

    fn entries(&mut self, session: &SessionId) -> Result<Vec<StoredEntry>, OutboxError> {
        let mut stmt = self
            .conn
            .prepare_cached(&format!(
                "SELECT {ENTRY_COLUMNS} FROM workspace_chat_outbox WHERE session_id = ?1"
            ))
            .map_err(ob)?;
        let mut rows = stmt
            .query_map(params![IdColumn(session.as_str())], read_columns)
            .map_err(ob)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(ob)?;
        // Ordered here, not in SQL: a stored ID's bytes do not sort like its text.
        rows.sort_by(|a, b| (a.position, &a.queue_id).cmp(&(b.position, &b.queue_id)));
        Ok(rows.into_iter().map(EntryColumns::into_stored).collect())
    }

    fn outbox_sessions(&mut self) -> Result<Vec<SessionId>, OutboxError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT DISTINCT session_id FROM workspace_chat_outbox")
            .map_err(ob)?;
        let rows = stmt
            .query_map([], |r| Ok(read_id(r.get_ref(0)?)))
            .map_err(ob)?;
        let mut out = Vec::new();
        for s in rows {
            out.push(stored_id("outbox session", s.map_err(ob)?, SessionId::new)?);
        }
        // Ordered here, not in SQL: a stored ID's bytes do not sort like its text.
        out.sort();
        Ok(out)
    }

    fn replace_entry(
        &mut self,
        session: &SessionId,
        expected: &OutboxEntry,
        new: &OutboxEntry,
    ) -> Result<bool, OutboxError> {
        let tx = self.write().map_err(ob)?;
        if read_entry(&tx, session, &expected.queue_id)?.as_ref() != Some(expected) {
            return Ok(false);
        }
        insert_entry(&tx, session, new)?;
        tx.commit().map_err(ob)?;
        Ok(true)
    }

    fn replace_entry_with_ledger(
        &mut self,
        session: &SessionId,
        expected: &OutboxEntry,
        new: &OutboxEntry,
        scope: &ScopeId,
        record: &LedgerRecord,
    ) -> Result<bool, OutboxError> {
        let tx = self.write().map_err(ob)?;
        if read_entry(&tx, session, &expected.queue_id)?.as_ref() != Some(expected) {
            return Ok(false);
        }
        insert_entry(&tx, session, new)?;
        put_ledger(&tx, scope.base(), &new.operation_id, record)?;
        tx.commit().map_err(ob)?;
        Ok(true)
    }

    fn rekey_entry(
        &mut self,
        session: &SessionId,
        expected: &OutboxEntry,
        fingerprint: &Digest256,
        new: &OutboxEntry,
    ) -> Result<bool, OutboxError> {
        let tx = self.write().map_err(ob)?;
        if read_entry(&tx, session, &expected.queue_id)?.as_ref() != Some(expected) {
            return Ok(false);
        }
        if read_identity(&tx, session, &new.operation_id)?.is_some() {
            return Err(OutboxError::OperationTaken(new.operation_id.clone()));
        }
        mark_removed(&tx, session, expected.operation_id.as_str())?;
        insert_identity(
            &tx,
            session,
            &new.operation_id,
            fingerprint,
            &new.queue_id,
            new.request.created_at,
        )?;
        insert_entry(&tx, session, new)?;
        tx.commit().map_err(ob)?;
        Ok(true)
    }

    fn remove_entry(
        &mut self,
        session: &SessionId,
        queue_id: &QueueId,
    ) -> Result<Option<OutboxEntry>, OutboxError> {
        let tx = self.write().map_err(ob)?;
        let Some(row) = read_entry_row(&tx, session, queue_id)? else {
            return Ok(None);
        };
        delete_entry(&tx, session, &IdColumn(queue_id.as_str()))?;
        mark_removed(&tx, session, &row.operation_id)?;
        tx.commit().map_err(ob)?;
        Ok(row.decode().ok())
    }

    fn set_positions(
        &mut self,
        session: &SessionId,
        positions: &[(QueueId, i64)],
    ) -> Result<(), OutboxError> {
        // The position is a column of its own; the entry JSON does not hold it.
        let tx = self.write().map_err(ob)?;
        for (q, p) in positions {
            tx.prepare_cached(
                "UPDATE workspace_chat_outbox SET position = ?3
                 WHERE session_id = ?1 AND queue_id = ?2",
            )
            .map_err(ob)?
            .execute(params![IdColumn(session.as_str()), IdColumn(q.as_str()), p])
            .map_err(ob)?;
        }
        tx.commit().map_err(ob)
    }

    fn ledger(
        &mut self,
        scope: &ScopeId,
        op: &OperationId,
    ) -> Result<Option<LedgerRecord>, OutboxError> {
        use rusqlite::types::Value;
        let session = scope.base();
        let row: Option<(Value, Value)> = self
            .conn
            .prepare_cached(
                "SELECT status, record_json FROM chat_operation_ledger
                 WHERE app_session_id = ?1 AND operation_id = ?2",
            )
            .map_err(ob)?
            .query_row(params![session.as_str(), op.as_str()], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()
            .map_err(ob)?;
        row.map(|(status, json)| read_ledger(session, op, &status, &json))
            .transpose()
    }

    fn put_ledger(
        &mut self,
        scope: &ScopeId,
        op: &OperationId,
        record: &LedgerRecord,
    ) -> Result<(), OutboxError> {
        let tx = self.write().map_err(ob)?;
        put_ledger(&tx, scope.base(), op, record)?;
        tx.commit().map_err(ob)
    }

    fn confirm_sent(
        &mut self,
        scope: &ScopeId,
        members: &[SessionId],
        op: &OperationId,
        record: &LedgerRecord,
    ) -> Result<Vec<(SessionId, QueueId)>, OutboxError> {
        let tx = self.write().map_err(ob)?;
        put_ledger(&tx, scope.base(), op, record)?;
        let mut removed = Vec::new();
        for session in members.iter().filter(|m| scope.contains(m)) {
            // Each queue ID as stored, to delete by, and as read back.
            let queues: Vec<(rusqlite::types::Value, Result<String, String>)> = {
                let mut stmt = tx
                    .prepare_cached(
                        // Through the identity's primary key and the outbox's
                        // unique (session, queue) index: a cost independent of the
                        // entries that stay in the outbox.
                        "SELECT o.queue_id
                         FROM workspace_chat_outbox_operation_identity AS i
                         JOIN workspace_chat_outbox AS o
                           ON o.session_id = i.session_id AND o.queue_id = i.queue_id
                         WHERE i.session_id = ?1 AND i.operation_id = ?2
                           AND o.operation_id = ?2",
                    )
                    .map_err(ob)?;
                let rows = stmt
                    .query_map(
                        params![IdColumn(session.as_str()), IdColumn(op.as_str())],
                        |r| Ok((r.get(0)?, read_id(r.get_ref(0)?))),
                    )
                    .map_err(ob)?;
                rows.collect::<Result<_, _>>().map_err(ob)?
            };
            for (stored, q) in queues {
                delete_entry(&tx, session, &stored)?;
                removed.push((session.clone(), stored_id("queue ID", q, QueueId::new)?));
            }
            mark_removed(&tx, session, op.as_str())?;
        }
        tx.commit().map_err(ob)?;
        Ok(removed)
    }

    fn route(&mut self, op: &OperationId) -> Result<Option<SessionMessageRoute>, OutboxError> {
        let row = self
            .conn
            .prepare_cached(&format!(
                "SELECT {ROUTE_COLUMNS} FROM chat_session_messages WHERE operation_id = ?1"
            ))
            .map_err(ob)?
            .query_row(params![op.as_str()], route_from_row)
            .optional()
            .map_err(ob)?;
        row.map(parse_route).transpose()
    }

    fn set_route_delivery(
        &mut self,
        op: &OperationId,
        delivery: RouteDelivery,
    ) -> Result<(), OutboxError> {
        self.write_one(
            "UPDATE chat_session_messages SET delivery = ?2 WHERE operation_id = ?1",
            params![op.as_str(), delivery_text(delivery)],
        )
        .map_err(ob)?;
        Ok(())
    }
}

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

/// A ledger row read back (OB-07): the record JSON decodes, and the `status` column
/// says the same status as the JSON. A row where they differ is refused, since either
/// could be the truth and the ledger decides what a retry may do.
fn read_ledger(
    session: &SessionId,
    op: &OperationId,
    status: &rusqlite::types::Value,
    json: &rusqlite::types::Value,
) -> Result<LedgerRecord, OutboxError> {
    let what = || format!("ledger {session}/{op}");
    let json = columns::text(LEDGER_RECORD, json.into()).map_err(refused(what()))?;
    let record: LedgerRecord =
        serde_json::from_str(&json).map_err(|e| corrupt(what())(e.to_string()))?;
    let said = status_text(record.status);
    match status {
        rusqlite::types::Value::Text(column) if *column == said => Ok(record),
        other => Err(refused(what())(Refused::new(
            LEDGER_STATUS,
            other.into(),
            format!("TEXT '{said}', the status of {LEDGER_RECORD}"),
        ))),
    }
}

/// The claim's two inserts inside `tx` (committed by the caller when it claimed).
fn claim_in(
    tx: &Transaction<'_>,
    session: &SessionId,
    fingerprint: &Digest256,
    entry: &OutboxEntry,
) -> Result<Claim, OutboxError> {
    let json = entry_json(entry)?;
    // The identity's primary key decides: a claimed operation inserts nothing, and the
    // transaction ends without writing.
    let inserted = tx
        .prepare_cached(
            "INSERT INTO workspace_chat_outbox_operation_identity
                 (session_id, operation_id, fingerprint, queue_id, removed, claimed_at)
             VALUES (?1, ?2, ?3, ?4, 0, ?5)
             ON CONFLICT (session_id, operation_id) DO NOTHING",
        )
        .map_err(ob)?
        .execute(params![
            IdColumn(session.as_str()),
            IdColumn(entry.operation_id.as_str()),
            FingerprintColumn::of(fingerprint),
            IdColumn(entry.queue_id.as_str()),
            entry.request.created_at.as_u64() as i64
        ])
        .map_err(ob)?;
    if inserted == 0 {
        let existing = read_identity(tx, session, &entry.operation_id)?;
        return existing
            .map(Claim::Existing)
            .ok_or_else(|| corrupt("operation identity")("claimed but unreadable".into()));
    }
    // A queue ID that holds another operation's entry is refused (nothing written).
    let placed = tx
        .prepare_cached(
            "INSERT INTO workspace_chat_outbox (session_id, queue_id, operation_id, position, entry_json)
             VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (session_id, queue_id) DO NOTHING",
        )
        .map_err(ob)?
        .execute(params![
            IdColumn(session.as_str()),
            IdColumn(entry.queue_id.as_str()),
            IdColumn(entry.operation_id.as_str()),
            entry.position,
            json
        ])
        .map_err(ob)?;
    if placed == 0 {
        return Err(OutboxError::QueueTaken(entry.queue_id.clone()));
    }
    Ok(Claim::Claimed)
}

fn put_ledger(
    tx: &Transaction<'_>,
    session: &SessionId,
    op: &OperationId,
    record: &LedgerRecord,
) -> Result<(), OutboxError> {
    let json = to_json(record).map_err(corrupt("ledger record"))?;
    let status = status_text(record.status);
    tx.prepare_cached(
        "INSERT INTO chat_operation_ledger (app_session_id, operation_id, status, record_json)
         VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (app_session_id, operation_id) DO UPDATE SET
             status = excluded.status, record_json = excluded.record_json",
    )
    .map_err(ob)?
    .execute(params![session.as_str(), op.as_str(), status, json])
    .map_err(ob)?;
    Ok(())
}
