//! Overlays, the global revision counter and the terminal-cleanup journal (OV-01 to
//! OV-06) on PostgreSQL.
//!
//! A target's overlay is a header row (revision, settlement epoch) in
//! `chat_live_timeline_overlays` and one row per overlay row in
//! `chat_live_timeline_overlay_rows`. Every write of a target runs in one transaction
//! that first takes the target's advisory lock (transaction-scoped, so a host that dies
//! frees it with its connection), then reads the header, applies its change to the
//! target's indexed rows ([`OverlayRows`]), takes the next revision from the sequence
//! and writes only the rows the change inserted, replaced or removed, in one statement
//! each for the upserts and the removals. The lock comes before any read: a read in a
//! statement that also waits for the lock would see the state from before the wait.
//!
//! Invariants: the sequence never hands out a revision twice, across hosts and deletes,
//! and refuses to pass 2^53 - 1 (OV-02); a target's revisions rise in commit order, since
//! its writers hold its lock from before they take a revision until they commit; a
//! revision not above the target's stored one is `Corrupt`, never stored. A target's rows
//! are cached per connection with the revision and epoch they were read at, and used only
//! when the header read under the lock still holds both: no revision is handed out
//! twice, so then no host wrote the target since.

use overlay_core::overlay::{apply, Change};
use overlay_core::store::{
    created_epoch, next_epoch, Changes, CleanupJournal, OverlayCache, OverlayError, OverlayRows,
    OverlayStore, Snapshot, StoredBlock, StoredOverlay, Update, FORMAT_VERSION,
};
use postgres::error::SqlState;
use postgres::{GenericClient, Row};
use timeline_core::key::{BlockKey, RunId, SessionId, TargetId};

use crate::columns::{self, Column, Refused};
use crate::{lock_key, pg_message, Conn, Fail, PostgresStore};

const OVERLAYS: &str = "chat_live_timeline_overlays";
const OVERLAY_TARGET: Column = Column::new(OVERLAYS, "timeline_target_id");
const OVERLAY_REVISION: Column = Column::new(OVERLAYS, "revision");
const OVERLAY_EPOCH: Column = Column::new(OVERLAYS, "settlement_epoch");
const ROWS: &str = "chat_live_timeline_overlay_rows";
const ROW_TYPE: Column = Column::new(ROWS, "block_type");
const ROW_ID: Column = Column::new(ROWS, "block_id");
const ROW_JSON: Column = Column::new(ROWS, "row_json");
const COUNTER: Column = Column::new("chat_live_timeline_overlay_revisions", "last_value");
const DELETED_EPOCH: Column = Column::new(
    "chat_live_timeline_overlay_deleted_epochs",
    "settlement_epoch",
);
const CLEANUPS: &str = "chat_pending_terminal_overlay_cleanups";
const CLEANUP_SESSION: Column = Column::new(CLEANUPS, "app_session_id");
const CLEANUP_RUN: Column = Column::new(CLEANUPS, "run_id");

pub(crate) fn ov(e: postgres::Error) -> OverlayError {
    OverlayError::Unavailable(pg_message(&e))
}

fn corrupt(what: impl Into<String>, reason: impl Into<String>) -> OverlayError {
    OverlayError::Corrupt {
        what: what.into(),
        reason: reason.into(),
    }
}

/// The overlay store's typed error for a write refused under a lost lease.
fn overlay_lease_lost(session: SessionId, message: String) -> OverlayError {
    OverlayError::LeaseLost { session, message }
}

fn what(session: &SessionId, target: &TargetId) -> String {
    format!("overlay {session}/{target}")
}

/// A refused column of a target's overlay, as the body's error.
fn refused<'a>(
    session: &'a SessionId,
    target: &'a TargetId,
) -> impl Fn(Refused) -> Fail<OverlayError> + 'a {
    move |r| Fail::Refused(corrupt(what(session, target), r.to_string()))
}

/// A target's overlay as one transaction read it.
struct Current {
    revision: u64,
    epoch: u64,
    rows: OverlayRows,
}

/// The revision and epoch of a header row, checked.
fn header_of(
    row: &Row,
    session: &SessionId,
    target: &TargetId,
) -> Result<(u64, u64), Fail<OverlayError>> {
    let bad = refused(session, target);
    let revision = columns::get::<i64>(row, 0, OVERLAY_REVISION)
        .and_then(|v| columns::exact(OVERLAY_REVISION, v))
        .map_err(&bad)?;
    let epoch = columns::get::<i64>(row, 1, OVERLAY_EPOCH)
        .and_then(|v| columns::exact(OVERLAY_EPOCH, v))
        .map_err(&bad)?;
    Ok((revision, epoch))
}

/// One overlay row from columns `first..first + 3` (block type, block ID, row JSON),
/// checked: its JSON a stored block whose key is the row's key.
fn block_of(
    row: &Row,
    first: usize,
    session: &SessionId,
    target: &TargetId,
) -> Result<StoredBlock, Fail<OverlayError>> {
    let bad = refused(session, target);
    let block_type: &str = columns::get(row, first, ROW_TYPE).map_err(&bad)?;
    let id: &[u8] = columns::get(row, first + 1, ROW_ID).map_err(&bad)?;
    let id = columns::id_text(ROW_ID, id).map_err(&bad)?;
    let json: &str = columns::get(row, first + 2, ROW_JSON).map_err(&bad)?;
    let block: StoredBlock = serde_json::from_str(json).map_err(|e| {
        Fail::Refused(corrupt(
            what(session, target),
            format!("{ROW_JSON} of the row {block_type} {id:?}: {e}"),
        ))
    })?;
    if block.block.block_type.as_str() != block_type || block.block.id.as_str() != id {
        return Err(Fail::Refused(corrupt(
            what(session, target),
            format!(
                "{ROW_JSON} holds the key {} {:?} in the row {block_type} {id:?}",
                block.block.block_type,
                block.block.id.as_str()
            ),
        )));
    }
    Ok(block)
}

fn rows_of(
    blocks: Vec<StoredBlock>,
    session: &SessionId,
    target: &TargetId,
) -> Result<OverlayRows, Fail<OverlayError>> {
    // The primary key and the check above keep one row per key (OV-01).
    OverlayRows::from_blocks(blocks).map_err(|key| {
        Fail::Refused(corrupt(
            what(session, target),
            format!("{ROWS} holds the key {key} twice"),
        ))
    })
}

fn ids<'a>(session: &'a SessionId, target: &'a TargetId) -> (&'a [u8], &'a [u8]) {
    (session.as_str().as_bytes(), target.as_str().as_bytes())
}

fn read_header<C: GenericClient>(
    c: &mut Conn<'_, C>,
    session: &SessionId,
    target: &TargetId,
) -> Result<Option<(u64, u64)>, Fail<OverlayError>> {
    let (s, t) = ids(session, target);
    let row = c.query_opt(
        "SELECT revision, settlement_epoch FROM chat_live_timeline_overlays
         WHERE app_session_id = $1 AND timeline_target_id = $2",
        &[&s, &t],
    )?;
    row.map(|row| header_of(&row, session, target)).transpose()
}

fn read_rows<C: GenericClient>(
    c: &mut Conn<'_, C>,
    session: &SessionId,
    target: &TargetId,
) -> Result<OverlayRows, Fail<OverlayError>> {
    let (s, t) = ids(session, target);
    let found = c.query(
        "SELECT block_type, block_id, row_json FROM chat_live_timeline_overlay_rows
         WHERE app_session_id = $1 AND timeline_target_id = $2",
        &[&s, &t],
    )?;
    let blocks = found
        .iter()
        .map(|row| block_of(row, 0, session, target))
        .collect::<Result<Vec<_>, _>>()?;
    rows_of(blocks, session, target)
}

/// The target's overlay inside a transaction that holds its lock: rows from `cache` when
/// it holds the header's revision and epoch, else from the table (and then cached).
fn read_overlay<C: GenericClient>(
    c: &mut Conn<'_, C>,
    cache: &mut OverlayCache,
    session: &SessionId,
    target: &TargetId,
) -> Result<Option<Current>, Fail<OverlayError>> {
    let Some((revision, epoch)) = read_header(c, session, target)? else {
        cache.forget(session, target);
        return Ok(None);
    };
    let rows = match cache.rows(session, target, revision, epoch) {
        Some(rows) => rows,
        None => {
            let rows = read_rows(c, session, target)?;
            cache.put(
                session,
                target,
                Snapshot::new(revision, epoch, rows.clone()),
            );
            rows
        }
    };
    Ok(Some(Current {
        revision,
        epoch,
        rows,
    }))
}

/// Takes the target's advisory lock until the transaction ends.
fn lock_target<C: GenericClient>(c: &mut Conn<'_, C>, key: i64) -> Result<(), Fail<OverlayError>> {
    c.execute("SELECT pg_advisory_xact_lock($1)", &[&key])?;
    Ok(())
}

/// The epoch a target's first write stores: `asked`, raised above the epoch the target
/// was deleted at; the record of that epoch leaves in the same transaction.
fn first_epoch<C: GenericClient>(
    c: &mut Conn<'_, C>,
    session: &SessionId,
    target: &TargetId,
    asked: u64,
) -> Result<u64, Fail<OverlayError>> {
    let (s, t) = ids(session, target);
    let row = c.query_opt(
        "DELETE FROM chat_live_timeline_overlay_deleted_epochs
         WHERE app_session_id = $1 AND timeline_target_id = $2
         RETURNING settlement_epoch",
        &[&s, &t],
    )?;
    let Some(row) = row else {
        return Ok(asked);
    };
    // An epoch that does not read back fails the write, which rolls the delete back.
    let deleted = columns::get::<i64>(&row, 0, DELETED_EPOCH)
        .and_then(|v| columns::exact(DELETED_EPOCH, v))
        .map_err(refused(session, target))?;
    Ok(created_epoch(asked, Some(deleted)))
}

/// Takes the next revision from the sequence. `previous` is the target's stored
/// revision: a value not above it would break the target's order (someone set the
/// sequence back), so it is refused as corrupt.
fn take_revision<C: GenericClient>(
    c: &mut Conn<'_, C>,
    session: &SessionId,
    target: &TargetId,
    previous: Option<u64>,
) -> Result<u64, Fail<OverlayError>> {
    let row = match c.query_opt(
        "SELECT nextval('chat_live_timeline_overlay_revisions')",
        &[],
    ) {
        Err(e) if e.code() == Some(&SqlState::SEQUENCE_GENERATOR_LIMIT_EXCEEDED) => {
            return Err(Fail::Refused(OverlayError::RevisionExhausted))
        }
        other => other?,
    };
    let what = "overlay revision counter";
    let value: i64 = row
        .as_ref()
        .map(|r| columns::get(r, 0, COUNTER))
        .transpose()
        .map_err(|r| Fail::Refused(corrupt(what, r.to_string())))?
        .unwrap_or(-1);
    let revision =
        columns::exact(COUNTER, value).map_err(|r| Fail::Refused(corrupt(what, r.to_string())))?;
    if let Some(previous) = previous.filter(|&p| p >= revision) {
        return Err(Fail::Refused(corrupt(
            what,
            format!(
                "{COUNTER} handed out {revision}, not above the revision {previous} of overlay \
                 {session}/{target}"
            ),
        )));
    }
    Ok(revision)
}

fn write_header<C: GenericClient>(
    c: &mut Conn<'_, C>,
    session: &SessionId,
    target: &TargetId,
    revision: u64,
    epoch: u64,
) -> Result<(), Fail<OverlayError>> {
    let (s, t) = ids(session, target);
    c.execute(
        "INSERT INTO chat_live_timeline_overlays
             (app_session_id, timeline_target_id, revision, settlement_epoch)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (app_session_id, timeline_target_id) DO UPDATE SET
             revision = excluded.revision, settlement_epoch = excluded.settlement_epoch",
        &[&s, &t, &(revision as i64), &(epoch as i64)],
    )?;
    Ok(())
}

/// Inserts or replaces `rows`, in one statement.
fn put_rows<'r, C: GenericClient>(
    c: &mut Conn<'_, C>,
    session: &SessionId,
    target: &TargetId,
    rows: impl Iterator<Item = &'r StoredBlock>,
) -> Result<(), Fail<OverlayError>> {
    let (mut types, mut block_ids, mut jsons) = (Vec::new(), Vec::new(), Vec::new());
    for row in rows {
        types.push(row.block.block_type.as_str());
        block_ids.push(row.block.id.as_str().as_bytes());
        jsons.push(
            serde_json::to_string(row)
                .map_err(|e| Fail::Refused(corrupt("overlay row", e.to_string())))?,
        );
    }
    if types.is_empty() {
        return Ok(());
    }
    let (s, t) = ids(session, target);
    c.execute(
        "INSERT INTO chat_live_timeline_overlay_rows
             (app_session_id, timeline_target_id, block_type, block_id, row_json)
         SELECT $1, $2, r.block_type, r.block_id, r.row_json
         FROM unnest($3::TEXT[], $4::BYTEA[], $5::TEXT[]) AS r (block_type, block_id, row_json)
         ON CONFLICT (app_session_id, timeline_target_id, block_type, block_id)
         DO UPDATE SET row_json = excluded.row_json",
        &[&s, &t, &types, &block_ids, &jsons],
    )?;
    Ok(())
}

/// Deletes the rows of `keys`, in one statement.
fn delete_keys<C: GenericClient>(
    c: &mut Conn<'_, C>,
    session: &SessionId,
    target: &TargetId,
    keys: &[BlockKey],
) -> Result<(), Fail<OverlayError>> {
    if keys.is_empty() {
        return Ok(());
    }
    let types: Vec<&str> = keys.iter().map(|k| k.block_type.as_str()).collect();
    let block_ids: Vec<&[u8]> = keys.iter().map(|k| k.id.as_str().as_bytes()).collect();
    let (s, t) = ids(session, target);
    c.execute(
        "DELETE FROM chat_live_timeline_overlay_rows
         WHERE app_session_id = $1 AND timeline_target_id = $2
           AND (block_type, block_id) IN (SELECT * FROM unnest($3::TEXT[], $4::BYTEA[]))",
        &[&s, &t, &types, &block_ids],
    )?;
    Ok(())
}

fn delete_rows<C: GenericClient>(
    c: &mut Conn<'_, C>,
    session: &SessionId,
    target: &TargetId,
) -> Result<(), Fail<OverlayError>> {
    let (s, t) = ids(session, target);
    c.execute(
        "DELETE FROM chat_live_timeline_overlay_rows
         WHERE app_session_id = $1 AND timeline_target_id = $2",
        &[&s, &t],
    )?;
    Ok(())
}

/// Writes what one change changed: its removals and its upserts, nothing else.
fn write_changes<C: GenericClient>(
    c: &mut Conn<'_, C>,
    session: &SessionId,
    target: &TargetId,
    changes: &Changes,
) -> Result<(), Fail<OverlayError>> {
    delete_keys(c, session, target, &changes.removals)?;
    put_rows(c, session, target, changes.upserts.iter())
}

/// Replaces every row of the target with `rows`.
fn replace_rows<C: GenericClient>(
    c: &mut Conn<'_, C>,
    session: &SessionId,
    target: &TargetId,
    rows: &OverlayRows,
) -> Result<(), Fail<OverlayError>> {
    delete_rows(c, session, target)?;
    put_rows(c, session, target, rows.iter())
}

impl PostgresStore {
    fn target_key(&self, session: &SessionId, target: &TargetId) -> i64 {
        let (s, t) = ids(session, target);
        lock_key(&self.schema, &[b"overlay", s, t])
    }
}

impl OverlayStore for PostgresStore {
    fn load(
        &mut self,
        session: &SessionId,
        target: &TargetId,
    ) -> Result<Option<StoredOverlay>, OverlayError> {
        // One statement is one snapshot: the header and its rows are one version.
        self.read(ov, |c, local| {
            let (s, t) = ids(session, target);
            let found = c.query(
                "SELECT o.revision, o.settlement_epoch, r.block_type, r.block_id, r.row_json
                 FROM chat_live_timeline_overlays AS o
                 LEFT JOIN chat_live_timeline_overlay_rows AS r
                   ON r.app_session_id = o.app_session_id
                  AND r.timeline_target_id = o.timeline_target_id
                 WHERE o.app_session_id = $1 AND o.timeline_target_id = $2",
                &[&s, &t],
            )?;
            let Some(first) = found.first() else {
                local.overlays.forget(session, target);
                return Ok(None);
            };
            let (revision, epoch) = header_of(first, session, target)?;
            let mut blocks = Vec::with_capacity(found.len());
            for row in &found {
                let joined: Option<&str> = row.try_get(2).ok().flatten();
                if joined.is_some() {
                    blocks.push(block_of(row, 2, session, target)?);
                }
            }
            let rows = rows_of(blocks, session, target)?;
            let snapshot = Snapshot::new(revision, epoch, rows);
            let stored = snapshot.to_stored();
            local.overlays.put(session, target, snapshot);
            Ok(Some(stored))
        })
    }

    fn compare_and_set(
        &mut self,
        session: &SessionId,
        target: &TargetId,
        expected: Option<u64>,
        epoch: u64,
        blocks: Vec<StoredBlock>,
    ) -> Result<StoredOverlay, OverlayError> {
        let key = self.target_key(session, target);
        let rows = OverlayRows::from_blocks(blocks);
        let stored = self.transact(ov, |c, local| {
            crate::hosts::fence_check(c, &local.fence, &[session], overlay_lease_lost)?;
            lock_target(c, key)?;
            if read_header(c, session, target)?.map(|(revision, _)| revision) != expected {
                let now = read_overlay(c, &mut local.overlays, session, target)?;
                return Err(Fail::Refused(OverlayError::Stale {
                    current: now.map(|n| {
                        Box::new(StoredOverlay {
                            format_version: FORMAT_VERSION,
                            settlement_epoch: n.epoch,
                            revision: n.revision,
                            blocks: n.rows.to_blocks(),
                        })
                    }),
                }));
            }
            let rows = rows
                .clone()
                .map_err(|key| Fail::Refused(OverlayError::DuplicateKey { key }))?;
            let epoch = match expected {
                Some(_) => epoch,
                None => first_epoch(c, session, target, epoch)?,
            };
            let revision = take_revision(c, session, target, expected)?;
            replace_rows(c, session, target, &rows)?;
            write_header(c, session, target, revision, epoch)?;
            Ok(Snapshot::new(revision, epoch, rows))
        })?;
        let whole = stored.to_stored();
        self.local.overlays.put(session, target, stored);
        Ok(whole)
    }

    fn update(
        &mut self,
        session: &SessionId,
        target: &TargetId,
        change: &Change,
    ) -> Result<Update, OverlayError> {
        let key = self.target_key(session, target);
        let update = self.transact(ov, |c, local| {
            crate::hosts::fence_check(c, &local.fence, &[session], overlay_lease_lost)?;
            lock_target(c, key)?;
            let current = read_overlay(c, &mut local.overlays, session, target)?;
            let rows = current
                .as_ref()
                .map_or_else(OverlayRows::new, |c| c.rows.clone());
            let Some(next) = apply(&rows, change) else {
                let unchanged = current.map(|c| Snapshot::new(c.revision, c.epoch, c.rows));
                return Ok(Update::Unchanged(unchanged));
            };
            let base_revision = current.as_ref().map(|c| c.revision);
            let epoch = match &current {
                Some(c) => next_epoch(Some(c.epoch), &next.changes),
                None => first_epoch(c, session, target, next_epoch(None, &next.changes))?,
            };
            let revision = take_revision(c, session, target, base_revision)?;
            match &current {
                Some(_) => write_changes(c, session, target, &next.changes)?,
                None => replace_rows(c, session, target, &next.rows)?,
            }
            write_header(c, session, target, revision, epoch)?;
            Ok(Update::Written {
                base_revision,
                stored: Snapshot::new(revision, epoch, next.rows),
                changes: next.changes,
            })
        })?;
        if let Update::Written { stored, .. } = &update {
            self.local.overlays.put(session, target, stored.clone());
        }
        Ok(update)
    }

    fn delete(&mut self, session: &SessionId, target: &TargetId) -> Result<bool, OverlayError> {
        let key = self.target_key(session, target);
        let deleted = self.transact(ov, |c, local| {
            crate::hosts::fence_check(c, &local.fence, &[session], overlay_lease_lost)?;
            lock_target(c, key)?;
            // The epoch is read back checked: a header whose epoch does not read back is
            // `Corrupt` and stays, rather than letting the target start over at epoch 0.
            let Some((_, epoch)) = read_header(c, session, target)? else {
                delete_rows(c, session, target)?;
                return Ok(false);
            };
            let (s, t) = ids(session, target);
            c.execute(
                "DELETE FROM chat_live_timeline_overlays
                 WHERE app_session_id = $1 AND timeline_target_id = $2",
                &[&s, &t],
            )?;
            delete_rows(c, session, target)?;
            c.execute(
                "INSERT INTO chat_live_timeline_overlay_deleted_epochs
                     (app_session_id, timeline_target_id, settlement_epoch)
                 VALUES ($1, $2, $3)
                 ON CONFLICT (app_session_id, timeline_target_id) DO UPDATE SET
                     settlement_epoch = excluded.settlement_epoch",
                &[&s, &t, &(epoch as i64)],
            )?;
            Ok(true)
        })?;
        self.local.overlays.forget(session, target);
        Ok(deleted)
    }

    fn targets(&mut self, session: &SessionId) -> Result<Vec<TargetId>, OverlayError> {
        self.read(ov, |c, _| {
            // BYTEA orders byte by byte, like the IDs' text.
            let found = c.query(
                "SELECT timeline_target_id FROM chat_live_timeline_overlays
                 WHERE app_session_id = $1 ORDER BY timeline_target_id",
                &[&session.as_str().as_bytes()],
            )?;
            let what = "timeline target";
            let bad = |r: Refused| Fail::Refused(corrupt(what, r.to_string()));
            found
                .iter()
                .map(|row| {
                    let bytes: &[u8] = columns::get(row, 0, OVERLAY_TARGET).map_err(bad)?;
                    let text = columns::id_text(OVERLAY_TARGET, bytes).map_err(bad)?;
                    TargetId::new(text).map_err(|e| Fail::Refused(corrupt(what, e.to_string())))
                })
                .collect()
        })
    }

    fn current_revision(&mut self) -> Result<u64, OverlayError> {
        self.read(ov, |c, _| {
            let row = c.query_opt(
                "SELECT last_value, is_called FROM chat_live_timeline_overlay_revisions",
                &[],
            )?;
            let what = "overlay revision counter";
            let row = row.ok_or_else(|| {
                Fail::Refused(corrupt(
                    what,
                    "chat_live_timeline_overlay_revisions has no row",
                ))
            })?;
            let bad = |r: Refused| Fail::Refused(corrupt(what, r.to_string()));
            let last: i64 = columns::get(&row, 0, COUNTER).map_err(bad)?;
            let called: bool = columns::get(
                &row,
                1,
                Column::new("chat_live_timeline_overlay_revisions", "is_called"),
            )
            .map_err(bad)?;
            // Before its first value the sequence holds its start (1) as not handed out.
            let handed_out = if called { last } else { last - 1 };
            columns::exact(COUNTER, handed_out).map_err(bad)
        })
    }
}

impl CleanupJournal for PostgresStore {
    fn add_cleanup(&mut self, session: &SessionId, run: &RunId) -> Result<(), OverlayError> {
        self.transact(ov, |c, local| {
            crate::hosts::fence_check(c, &local.fence, &[session], overlay_lease_lost)?;

            c.execute(
                "INSERT INTO chat_pending_terminal_overlay_cleanups (app_session_id, run_id)
                 VALUES ($1, $2) ON CONFLICT DO NOTHING",
                &[&session.as_str().as_bytes(), &run.as_str().as_bytes()],
            )?;
            Ok(())
        })
    }

    fn remove_cleanup(&mut self, session: &SessionId, run: &RunId) -> Result<bool, OverlayError> {
        self.transact(ov, |c, local| {
            crate::hosts::fence_check(c, &local.fence, &[session], overlay_lease_lost)?;

            let n = c.execute(
                "DELETE FROM chat_pending_terminal_overlay_cleanups
                 WHERE app_session_id = $1 AND run_id = $2",
                &[&session.as_str().as_bytes(), &run.as_str().as_bytes()],
            )?;
            Ok(n > 0)
        })
    }

    fn pending_cleanups(
        &mut self,
        session: Option<&SessionId>,
    ) -> Result<Vec<(SessionId, RunId)>, OverlayError> {
        self.read(ov, |c, _| {
            let session = session.map(|s| s.as_str().as_bytes());
            let found = c.query(
                "SELECT app_session_id, run_id FROM chat_pending_terminal_overlay_cleanups
                 WHERE $1::BYTEA IS NULL OR app_session_id = $1
                 ORDER BY app_session_id, run_id",
                &[&session],
            )?;
            let what = "cleanup journal row";
            let bad = |r: Refused| Fail::Refused(corrupt(what, r.to_string()));
            let key = |e: timeline_core::key::KeyError| Fail::Refused(corrupt(what, e.to_string()));
            found
                .iter()
                .map(|row| {
                    let s: &[u8] = columns::get(row, 0, CLEANUP_SESSION).map_err(bad)?;
                    let r: &[u8] = columns::get(row, 1, CLEANUP_RUN).map_err(bad)?;
                    let s = columns::id_text(CLEANUP_SESSION, s).map_err(bad)?;
                    let r = columns::id_text(CLEANUP_RUN, r).map_err(bad)?;
                    Ok((SessionId::new(s).map_err(key)?, RunId::new(r).map_err(key)?))
                })
                .collect()
        })
    }
}
