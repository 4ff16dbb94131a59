//! The overlay store: [`OverlayStore`] and [`CleanupJournal`] on SQLite.
//!
//! A target's overlay is a header row in `chat_live_timeline_overlays` (revision,
//! settlement epoch) and one row per overlay row in `chat_live_timeline_overlay_rows`,
//! keyed by (session, target, block type, block ID). A write applies its change to the
//! target's indexed rows and writes, in one `IMMEDIATE` transaction, the global revision
//! counter, the header and only the rows that changed, so it costs O(k log n) for k
//! changed rows. The rows come from the cache of this connection when the header still
//! holds the revision and epoch they were read at, and from the table otherwise. A
//! delete records the target's epoch in `chat_live_timeline_overlay_deleted_epochs`, and
//! the target's next first write takes it (one higher) and removes the record, in its own
//! transaction.

use outbox_core::ids::{RunId, SessionId};
use overlay_core::overlay::{apply, Change};
use overlay_core::store::{
    created_epoch, next_epoch, CleanupJournal, OverlayCache, OverlayError, OverlayRows,
    OverlayStore, Snapshot, StoredBlock, StoredOverlay, Update, FORMAT_VERSION,
};
use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};
use timeline_core::key::TargetId;
use timeline_core::policy::MAX_EXACT_INTEGER;

use crate::columns::{self, Column};
use crate::error::{ov, overlay_corrupt, overlay_refused, to_json};
use crate::SqliteStore;

const OVERLAYS: &str = "chat_live_timeline_overlays";
const OVERLAY_TARGET: Column = Column::new(OVERLAYS, "timeline_target_id");
const OVERLAY_REVISION: Column = Column::new(OVERLAYS, "revision");
const OVERLAY_EPOCH: Column = Column::new(OVERLAYS, "settlement_epoch");
const OVERLAY_SNAPSHOT: Column = Column::new(OVERLAYS, "snapshot_json");
const ROWS: &str = "chat_live_timeline_overlay_rows";
const ROW_TYPE: Column = Column::new(ROWS, "block_type");
const ROW_ID: Column = Column::new(ROWS, "block_id");
const ROW_JSON: Column = Column::new(ROWS, "row_json");
const COUNTER: Column = Column::new("chat_live_timeline_overlay_revisions", "revision");
const DELETED_EPOCH: Column = Column::new(
    "chat_live_timeline_overlay_deleted_epochs",
    "settlement_epoch",
);
const CLEANUPS: &str = "chat_pending_terminal_overlay_cleanups";
const CLEANUP_SESSION: Column = Column::new(CLEANUPS, "app_session_id");
const CLEANUP_RUN: Column = Column::new(CLEANUPS, "run_id");

/// A target's header row.
struct Header {
    revision: u64,
    epoch: u64,
    /// A version-4 snapshot that did not split into rows (see migration 5).
    legacy: Option<String>,
}

/// A target's overlay as one transaction read it.
struct Current {
    revision: u64,
    epoch: u64,
    rows: OverlayRows,
    /// The rows came from a version-4 snapshot: the next write rewrites them as rows.
    legacy: bool,
}

impl Current {
    fn into_stored(self) -> StoredOverlay {
        StoredOverlay {
            format_version: FORMAT_VERSION,
            settlement_epoch: self.epoch,
            revision: self.revision,
            blocks: self.rows.to_blocks(),
        }
    }
}

fn what(session: &SessionId, target: &TargetId) -> String {
    format!("overlay {session}/{target}")
}

fn read_header(
    conn: &Connection,
    session: &SessionId,
    target: &TargetId,
) -> Result<Option<Header>, OverlayError> {
    use rusqlite::types::Value;
    let row: Option<(Value, Value, Value)> = conn
        .prepare_cached(
            "SELECT revision, settlement_epoch, snapshot_json FROM chat_live_timeline_overlays
             WHERE app_session_id = ?1 AND timeline_target_id = ?2",
        )
        .map_err(ov)?
        .query_row(params![session.as_str(), target.as_str()], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .optional()
        .map_err(ov)?;
    let Some((revision, epoch, legacy)) = row else {
        return Ok(None);
    };
    let refused = || overlay_refused(what(session, target));
    Ok(Some(Header {
        revision: columns::exact(OVERLAY_REVISION, (&revision).into()).map_err(refused())?,
        epoch: columns::exact(OVERLAY_EPOCH, (&epoch).into()).map_err(refused())?,
        legacy: columns::optional_text(OVERLAY_SNAPSHOT, (&legacy).into()).map_err(refused())?,
    }))
}

/// The rows of a version-4 snapshot, checked as version 4 checked them.
fn legacy_rows(
    json: &str,
    session: &SessionId,
    target: &TargetId,
) -> Result<OverlayRows, OverlayError> {
    let blocks: Vec<StoredBlock> = serde_json::from_str(json)
        .map_err(|e| overlay_corrupt(what(session, target))(e.to_string()))?;
    OverlayRows::from_blocks(blocks).map_err(|key| {
        overlay_corrupt(what(session, target))(format!(
            "{OVERLAY_SNAPSHOT} holds two blocks with the key {} {:?}",
            key.block_type,
            key.id.as_str()
        ))
    })
}

/// Every row of a target from the rows table, each checked: its columns of the right
/// type, its JSON a stored block whose key is the row's key.
fn read_rows(
    conn: &Connection,
    session: &SessionId,
    target: &TargetId,
) -> Result<OverlayRows, OverlayError> {
    use rusqlite::types::Value;
    let mut stmt = conn
        .prepare_cached(
            "SELECT block_type, block_id, row_json FROM chat_live_timeline_overlay_rows
             WHERE app_session_id = ?1 AND timeline_target_id = ?2",
        )
        .map_err(ov)?;
    let found = stmt
        .query_map(params![session.as_str(), target.as_str()], |r| {
            Ok((
                r.get::<_, Value>(0)?,
                r.get::<_, Value>(1)?,
                r.get::<_, Value>(2)?,
            ))
        })
        .map_err(ov)?;
    let mut blocks = Vec::new();
    for row in found {
        let (block_type, id, json) = row.map_err(ov)?;
        let refused = || overlay_refused(what(session, target));
        let block_type = columns::text(ROW_TYPE, (&block_type).into()).map_err(refused())?;
        let id = columns::text(ROW_ID, (&id).into()).map_err(refused())?;
        let json = columns::text(ROW_JSON, (&json).into()).map_err(refused())?;
        let block: StoredBlock = serde_json::from_str(&json).map_err(|e| {
            overlay_corrupt(what(session, target))(format!(
                "{ROW_JSON} of the row {block_type} {id:?}: {e}"
            ))
        })?;
        if block.block.block_type.as_str() != block_type || block.block.id.as_str() != id {
            return Err(overlay_corrupt(what(session, target))(format!(
                "{ROW_JSON} holds the key {} {:?} in the row {block_type} {id:?}",
                block.block.block_type,
                block.block.id.as_str()
            )));
        }
        blocks.push(block);
    }
    // The unique key and the check above keep one row per key (OV-01).
    OverlayRows::from_blocks(blocks).map_err(|key| {
        overlay_corrupt(what(session, target))(format!("{ROWS} holds the key {key} twice"))
    })
}

/// The target's overlay inside `conn`'s transaction: from `cache` when it holds the
/// header's revision and epoch, else from the file (and then cached).
fn read_overlay(
    conn: &Connection,
    cache: &mut OverlayCache,
    session: &SessionId,
    target: &TargetId,
) -> Result<Option<Current>, OverlayError> {
    let Some(header) = read_header(conn, session, target)? else {
        cache.forget(session, target);
        return Ok(None);
    };
    let (rows, legacy) = match &header.legacy {
        Some(json) => (legacy_rows(json, session, target)?, true),
        None => match cache.rows(session, target, header.revision, header.epoch) {
            Some(rows) => (rows, false),
            None => {
                let rows = read_rows(conn, session, target)?;
                let snapshot = Snapshot::new(header.revision, header.epoch, rows.clone());
                cache.put(session, target, snapshot);
                (rows, false)
            }
        },
    };
    Ok(Some(Current {
        revision: header.revision,
        epoch: header.epoch,
        rows,
        legacy,
    }))
}

/// The stored revision of a target, if it has a row.
fn stored_revision(
    conn: &Connection,
    session: &SessionId,
    target: &TargetId,
) -> Result<Option<u64>, OverlayError> {
    target_integer(
        conn,
        "SELECT revision FROM chat_live_timeline_overlays
         WHERE app_session_id = ?1 AND timeline_target_id = ?2",
        OVERLAY_REVISION,
        session,
        target,
    )
}

/// The epoch a deleted target had, if it was deleted and not written since (schema 6).
fn deleted_epoch(
    conn: &Connection,
    session: &SessionId,
    target: &TargetId,
) -> Result<Option<u64>, OverlayError> {
    target_integer(
        conn,
        "SELECT settlement_epoch FROM chat_live_timeline_overlay_deleted_epochs
         WHERE app_session_id = ?1 AND timeline_target_id = ?2",
        DELETED_EPOCH,
        session,
        target,
    )
}

/// One exact integer column of a target's row (`sql` selects it by session and target),
/// checked like wire input; `None` when there is no row.
fn target_integer(
    conn: &Connection,
    sql: &str,
    column: Column,
    session: &SessionId,
    target: &TargetId,
) -> Result<Option<u64>, OverlayError> {
    let value: Option<rusqlite::types::Value> = conn
        .prepare_cached(sql)
        .map_err(ov)?
        .query_row(params![session.as_str(), target.as_str()], |r| r.get(0))
        .optional()
        .map_err(ov)?;
    value
        .map(|v| {
            columns::exact(column, (&v).into()).map_err(overlay_refused(what(session, target)))
        })
        .transpose()
}

/// The epoch a target's first write stores, inside `tx`: `asked`, raised above the
/// epoch the target was deleted at ([`overlay_core::store::created_epoch`]). The record
/// of that epoch is removed in the same transaction, as the target now holds it.
fn first_epoch(
    tx: &Transaction<'_>,
    session: &SessionId,
    target: &TargetId,
    asked: u64,
) -> Result<u64, OverlayError> {
    let Some(deleted) = deleted_epoch(tx, session, target)? else {
        return Ok(asked);
    };
    tx.prepare_cached(
        "DELETE FROM chat_live_timeline_overlay_deleted_epochs
         WHERE app_session_id = ?1 AND timeline_target_id = ?2",
    )
    .map_err(ov)?
    .execute(params![session.as_str(), target.as_str()])
    .map_err(ov)?;
    Ok(created_epoch(asked, Some(deleted)))
}

/// The global revision counter (OV-02). A missing row or a value outside 0 to 2^53 - 1
/// is [`OverlayError::Corrupt`]: no revision can be handed out from it.
fn read_counter(conn: &Connection) -> Result<u64, OverlayError> {
    let what = "overlay revision counter";
    let counter: Option<rusqlite::types::Value> = conn
        .prepare_cached("SELECT revision FROM chat_live_timeline_overlay_revisions WHERE id = 1")
        .map_err(ov)?
        .query_row([], |r| r.get(0))
        .optional()
        .map_err(ov)?;
    let counter = counter.ok_or_else(|| {
        overlay_corrupt(what)("chat_live_timeline_overlay_revisions has no row with id 1".into())
    })?;
    columns::exact(COUNTER, (&counter).into()).map_err(overlay_refused(what))
}

/// Takes the next revision from the counter, inside `tx`. `previous` is the target's
/// stored revision: a counter below it would hand out a revision again (OV-02), so it
/// is refused as corrupt.
fn take_revision(
    tx: &Transaction<'_>,
    session: &SessionId,
    target: &TargetId,
    previous: Option<u64>,
) -> Result<u64, OverlayError> {
    let counter = read_counter(tx)?;
    if let Some(previous) = previous.filter(|&p| p > counter) {
        return Err(overlay_corrupt("overlay revision counter")(format!(
            "{COUNTER} holds INTEGER {counter}, below the revision {previous} of overlay \
             {session}/{target}"
        )));
    }
    if counter >= MAX_EXACT_INTEGER {
        return Err(OverlayError::RevisionExhausted);
    }
    let revision = counter + 1;
    tx.prepare_cached("UPDATE chat_live_timeline_overlay_revisions SET revision = ?1 WHERE id = 1")
        .map_err(ov)?
        .execute(params![revision as i64])
        .map_err(ov)?;
    Ok(revision)
}

/// Stores the target's header: its revision and epoch, and no version-4 snapshot.
fn write_header(
    tx: &Transaction<'_>,
    session: &SessionId,
    target: &TargetId,
    revision: u64,
    epoch: u64,
) -> Result<(), OverlayError> {
    tx.prepare_cached(
        "INSERT INTO chat_live_timeline_overlays
             (app_session_id, timeline_target_id, revision, settlement_epoch, snapshot_json)
         VALUES (?1, ?2, ?3, ?4, NULL)
         ON CONFLICT (app_session_id, timeline_target_id) DO UPDATE SET
             revision = excluded.revision,
             settlement_epoch = excluded.settlement_epoch,
             snapshot_json = NULL",
    )
    .map_err(ov)?
    .execute(params![
        session.as_str(),
        target.as_str(),
        revision as i64,
        epoch as i64
    ])
    .map_err(ov)?;
    Ok(())
}

/// Inserts or replaces one row.
fn put_row(
    tx: &Transaction<'_>,
    session: &SessionId,
    target: &TargetId,
    row: &StoredBlock,
) -> Result<(), OverlayError> {
    let json = to_json(row).map_err(overlay_corrupt("overlay row"))?;
    tx.prepare_cached(
        "INSERT INTO chat_live_timeline_overlay_rows
             (app_session_id, timeline_target_id, block_type, block_id, row_json)
         VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (app_session_id, timeline_target_id, block_type, block_id)
         DO UPDATE SET row_json = excluded.row_json",
    )
    .map_err(ov)?
    .execute(params![
        session.as_str(),
        target.as_str(),
        row.block.block_type.as_str(),
        row.block.id.as_str(),
        json
    ])
    .map_err(ov)?;
    Ok(())
}

/// Writes what one change changed: its removals and its upserts, nothing else.
fn write_changes(
    tx: &Transaction<'_>,
    session: &SessionId,
    target: &TargetId,
    changes: &overlay_core::store::Changes,
) -> Result<(), OverlayError> {
    for key in &changes.removals {
        tx.prepare_cached(
            "DELETE FROM chat_live_timeline_overlay_rows
             WHERE app_session_id = ?1 AND timeline_target_id = ?2
               AND block_type = ?3 AND block_id = ?4",
        )
        .map_err(ov)?
        .execute(params![
            session.as_str(),
            target.as_str(),
            key.block_type.as_str(),
            key.id.as_str()
        ])
        .map_err(ov)?;
    }
    for row in &changes.upserts {
        put_row(tx, session, target, row)?;
    }
    Ok(())
}

/// Replaces every row of the target with `rows` (a whole-overlay write, a new target,
/// or a version-4 snapshot's first write as rows).
fn replace_rows(
    tx: &Transaction<'_>,
    session: &SessionId,
    target: &TargetId,
    rows: &OverlayRows,
) -> Result<(), OverlayError> {
    delete_rows(tx, session, target)?;
    for row in rows.iter() {
        put_row(tx, session, target, row)?;
    }
    Ok(())
}

fn delete_rows(
    tx: &Transaction<'_>,
    session: &SessionId,
    target: &TargetId,
) -> Result<usize, OverlayError> {
    tx.prepare_cached(
        "DELETE FROM chat_live_timeline_overlay_rows
         WHERE app_session_id = ?1 AND timeline_target_id = ?2",
    )
    .map_err(ov)?
    .execute(params![session.as_str(), target.as_str()])
    .map_err(ov)
}

impl OverlayStore for SqliteStore {
    fn load(
        &mut self,
        session: &SessionId,
        target: &TargetId,
    ) -> Result<Option<StoredOverlay>, OverlayError> {
        // One read transaction, so the header and the rows are one version.
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Deferred)
            .map_err(ov)?;
        let current = read_overlay(&tx, &mut self.overlays, session, target)?;
        tx.commit().map_err(ov)?;
        Ok(current.map(Current::into_stored))
    }

    fn compare_and_set(
        &mut self,
        session: &SessionId,
        target: &TargetId,
        expected: Option<u64>,
        epoch: u64,
        blocks: Vec<StoredBlock>,
    ) -> Result<StoredOverlay, OverlayError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(ov)?;
        if stored_revision(&tx, session, target)? != expected {
            let now = read_overlay(&tx, &mut self.overlays, session, target)?;
            return Err(OverlayError::Stale {
                current: now.map(|c| Box::new(c.into_stored())),
            });
        }
        let rows =
            OverlayRows::from_blocks(blocks).map_err(|key| OverlayError::DuplicateKey { key })?;
        let epoch = match expected {
            Some(_) => epoch,
            None => first_epoch(&tx, session, target, epoch)?,
        };
        let revision = take_revision(&tx, session, target, expected)?;
        replace_rows(&tx, session, target, &rows)?;
        write_header(&tx, session, target, revision, epoch)?;
        tx.commit().map_err(ov)?;
        let stored = Snapshot::new(revision, epoch, rows);
        let whole = stored.to_stored();
        self.overlays.put(session, target, stored);
        Ok(whole)
    }

    fn update(
        &mut self,
        session: &SessionId,
        target: &TargetId,
        change: &Change,
    ) -> Result<Update, OverlayError> {
        // One immediate transaction: read, apply, write. Another connection waits
        // (busy_timeout) instead of racing, so no writer starves.
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(ov)?;
        let current = read_overlay(&tx, &mut self.overlays, session, target)?;
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
            None => first_epoch(&tx, session, target, next_epoch(None, &next.changes))?,
        };
        let revision = take_revision(&tx, session, target, base_revision)?;
        match &current {
            Some(c) if !c.legacy => write_changes(&tx, session, target, &next.changes)?,
            _ => replace_rows(&tx, session, target, &next.rows)?,
        }
        write_header(&tx, session, target, revision, epoch)?;
        tx.commit().map_err(ov)?;
        let stored = Snapshot::new(revision, epoch, next.rows);
        self.overlays.put(session, target, stored.clone());
        Ok(Update::Written {
            base_revision,
            stored,
            changes: next.changes,
        })
    }

    fn delete(&mut self, session: &SessionId, target: &TargetId) -> Result<bool, OverlayError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(ov)?;
        // The epoch is read back checked: a header whose epoch does not read back is
        // `Corrupt` and stays, rather than letting the target start over at epoch 0.
        let Some(header) = read_header(&tx, session, target)? else {
            delete_rows(&tx, session, target)?;
            tx.commit().map_err(ov)?;
            self.overlays.forget(session, target);
            return Ok(false);
        };
        tx.prepare_cached(
            "DELETE FROM chat_live_timeline_overlays
             WHERE app_session_id = ?1 AND timeline_target_id = ?2",
        )
        .map_err(ov)?
        .execute(params![session.as_str(), target.as_str()])
        .map_err(ov)?;
        delete_rows(&tx, session, target)?;
        tx.prepare_cached(
            "INSERT INTO chat_live_timeline_overlay_deleted_epochs
                 (app_session_id, timeline_target_id, settlement_epoch)
             VALUES (?1, ?2, ?3)
             ON CONFLICT (app_session_id, timeline_target_id) DO UPDATE SET
                 settlement_epoch = excluded.settlement_epoch",
        )
        .map_err(ov)?
        .execute(params![
            session.as_str(),
            target.as_str(),
            header.epoch as i64
        ])
        .map_err(ov)?;
        tx.commit().map_err(ov)?;
        self.overlays.forget(session, target);
        Ok(true)
    }

    fn targets(&mut self, session: &SessionId) -> Result<Vec<TargetId>, OverlayError> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT timeline_target_id FROM chat_live_timeline_overlays
                 WHERE app_session_id = ?1 ORDER BY timeline_target_id",
            )
            .map_err(ov)?;
        let rows = stmt
            .query_map(params![session.as_str()], |r| {
                r.get::<_, rusqlite::types::Value>(0)
            })
            .map_err(ov)?;
        let mut out = Vec::new();
        for t in rows {
            let t = t.map_err(ov)?;
            let t = columns::text(OVERLAY_TARGET, (&t).into())
                .map_err(overlay_refused("timeline target"))?;
            out.push(
                TargetId::new(t).map_err(|e| overlay_corrupt("timeline target")(e.to_string()))?,
            );
        }
        Ok(out)
    }

    fn current_revision(&mut self) -> Result<u64, OverlayError> {
        read_counter(&self.conn)
    }
}

impl CleanupJournal for SqliteStore {
    fn add_cleanup(&mut self, session: &SessionId, run: &RunId) -> Result<(), OverlayError> {
        self.write_one(
            "INSERT OR IGNORE INTO chat_pending_terminal_overlay_cleanups (app_session_id, run_id)
             VALUES (?1, ?2)",
            params![session.as_str(), run.as_str()],
        )
        .map_err(ov)?;
        Ok(())
    }

    fn remove_cleanup(&mut self, session: &SessionId, run: &RunId) -> Result<bool, OverlayError> {
        let n = self
            .write_one(
                "DELETE FROM chat_pending_terminal_overlay_cleanups
                 WHERE app_session_id = ?1 AND run_id = ?2",
                params![session.as_str(), run.as_str()],
            )
            .map_err(ov)?;
        Ok(n > 0)
    }

    fn pending_cleanups(
        &mut self,
        session: Option<&SessionId>,
    ) -> Result<Vec<(SessionId, RunId)>, OverlayError> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT app_session_id, run_id FROM chat_pending_terminal_overlay_cleanups
                 WHERE ?1 IS NULL OR app_session_id = ?1 ORDER BY app_session_id, run_id",
            )
            .map_err(ov)?;
        let rows = stmt
            .query_map(params![session.map(|s| s.as_str())], |r| {
                Ok((
                    r.get::<_, rusqlite::types::Value>(0)?,
                    r.get::<_, rusqlite::types::Value>(1)?,
                ))
            })
            .map_err(ov)?;
        let mut out = Vec::new();
        for row in rows {
            let (s, r) = row.map_err(ov)?;
            let what = "cleanup journal row";
            let s = columns::text(CLEANUP_SESSION, (&s).into()).map_err(overlay_refused(what))?;
            let r = columns::text(CLEANUP_RUN, (&r).into()).map_err(overlay_refused(what))?;
            let bad = |e: timeline_core::key::KeyError| overlay_corrupt(what)(e.to_string());
            out.push((SessionId::new(s).map_err(bad)?, RunId::new(r).map_err(bad)?));
        }
        Ok(out)
    }
}

/// Test hooks.
#[cfg(feature = "testing")]
impl SqliteStore {
    /// Sets the global revision counter (to test the 2^53 - 1 cap).
    pub fn set_revision_counter(&mut self, revision: u64) -> rusqlite::Result<()> {
        // Refused above `i64::MAX`, never wrapped.
        let revision = i64::try_from(revision)
            .map_err(|e| rusqlite::Error::ToSqlConversionFailure(e.into()))?;
        self.conn.execute(
            "UPDATE chat_live_timeline_overlay_revisions SET revision = ?1 WHERE id = 1",
            params![revision],
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod deleted_epoch_tests {
    //! Schema 6: a deleted target keeps its settlement epoch (OV-02, OV-04, TL-06).
    use super::*;
    use crate::{Settings, SCHEMA_VERSION};
    use overlay_core::store::write;
    use timeline_core::block::Block;
    use timeline_core::key::{BlockKey, BlockType};
    use timeline_core::time::Millis;

    fn row(id: &str) -> StoredBlock {
        StoredBlock {
            block: Block::new(
                BlockKey::parse(BlockType::AgentReply, id).unwrap(),
                Millis(1),
            ),
            class: overlay_core::store::RowClass::Ordinary,
            run_id: None,
        }
    }

    fn settle(id: &str) -> Change {
        Change::Settle([BlockKey::parse(BlockType::AgentReply, id).unwrap()].into())
    }

    fn ids() -> (SessionId, TargetId, TargetId) {
        (
            SessionId::new("s").unwrap(),
            TargetId::new("thread-1").unwrap(),
            TargetId::new("thread-2").unwrap(),
        )
    }

    // ST-02, OV-04: a version 5 file upgrades to version 6 with every overlay as it was;
    // a target deleted after the upgrade comes back one epoch higher, one deleted before
    // it (which left no epoch behind) starts at 0 as version 5 did.
    #[test]
    fn a_version_5_database_upgrades_and_deletes_keep_their_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v5.sqlite");
        let (s, kept, gone) = ids();
        // A version 5 file as version 5 wrote it: `kept` at epoch 1 with one row;
        // `gone` deleted (version 5 removed its header and rows and left nothing).
        let v5 = SqliteStore::open_at(&path, Settings::default(), 5).unwrap();
        let b = to_json(&row("b")).unwrap();
        v5.connection()
            .execute_batch(&format!(
                "UPDATE chat_live_timeline_overlay_revisions SET revision = 4 WHERE id = 1;
                 INSERT INTO chat_live_timeline_overlays VALUES ('s', 'thread-1', 3, 1, NULL);
                 INSERT INTO chat_live_timeline_overlay_rows
                     (app_session_id, timeline_target_id, block_type, block_id, row_json)
                     VALUES ('s', 'thread-1', 'agent-reply', 'b', '{b}');"
            ))
            .unwrap();
        drop(v5);
        let before = StoredOverlay {
            format_version: FORMAT_VERSION,
            settlement_epoch: 1,
            revision: 3,
            blocks: vec![row("b")],
        };

        let mut store = SqliteStore::open(&path, Settings::default()).unwrap();
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        assert_eq!(store.load(&s, &kept).unwrap(), Some(before.clone()));
        let again = write(&mut store, &s, &gone, &Change::Publish(vec![row("c")])).unwrap();
        assert_eq!(again.stored().unwrap().settlement_epoch, 0);

        let settled = write(&mut store, &s, &kept, &settle("b")).unwrap();
        assert_eq!(settled.stored().unwrap().settlement_epoch, 2);
        assert!(store.delete(&s, &kept).unwrap());
        let recorded: i64 = store
            .connection()
            .query_row(
                "SELECT settlement_epoch FROM chat_live_timeline_overlay_deleted_epochs",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(recorded, 2);
        drop(store);
        let mut store = SqliteStore::open(&path, Settings::default()).unwrap();
        let back = write(&mut store, &s, &kept, &Change::Publish(vec![row("d")])).unwrap();
        let back = back.stored().unwrap();
        assert_eq!(back.settlement_epoch, 3);
        assert!(back.revision > before.revision);
        let left: i64 = store
            .connection()
            .query_row(
                "SELECT count(*) FROM chat_live_timeline_overlay_deleted_epochs",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(left, 0, "the record leaves with the first write");
    }

    // OV-04: a recorded epoch that does not read back is `Corrupt`, and the write that
    // needed it stores nothing; an epoch that does not read back is never deleted away.
    #[test]
    fn unreadable_epochs_are_corrupt_and_nothing_is_written() {
        let mut store = SqliteStore::open_in_memory(Settings::default()).unwrap();
        let (s, t, other) = ids();
        store
            .connection()
            .execute(
                "INSERT INTO chat_live_timeline_overlay_deleted_epochs VALUES ('s', 'thread-1', 'x')",
                [],
            )
            .unwrap();
        let err = write(&mut store, &s, &t, &Change::Publish(vec![row("a")])).unwrap_err();
        assert!(
            matches!(&err, OverlayError::Corrupt { reason, .. }
                if reason.contains("chat_live_timeline_overlay_deleted_epochs.settlement_epoch")),
            "{err:?}"
        );
        let err = store.compare_and_set(&s, &t, None, 0, vec![row("a")]);
        assert!(matches!(err, Err(OverlayError::Corrupt { .. })), "{err:?}");
        assert_eq!(store.load(&s, &t).unwrap(), None);
        assert_eq!(store.current_revision().unwrap(), 0);

        write(&mut store, &s, &other, &Change::Publish(vec![row("a")])).unwrap();
        store
            .connection()
            .execute(
                "UPDATE chat_live_timeline_overlays SET settlement_epoch = -1
                 WHERE timeline_target_id = 'thread-2'",
                [],
            )
            .unwrap();
        assert!(matches!(
            store.delete(&s, &other),
            Err(OverlayError::Corrupt { .. })
        ));
        assert_eq!(store.targets(&s).unwrap(), vec![other]);
    }
}
