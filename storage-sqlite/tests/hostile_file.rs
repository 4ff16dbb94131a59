//! A database file edited by something other than this library: every value read back
//! is checked like wire input (ST-01). Each test writes good rows through the store,
//! changes one value with raw rusqlite (bypassing `CHECK` constraints where the schema
//! has one), reopens the file through the store and asserts the typed outcome: an
//! outbox row that does not read back shows as blocked and its neighbours read as usual
//! (OB-05); any other unreadable record is `Corrupt`, naming the table, the column and
//! the stored value, never `Unavailable`, a panic or a wrapped number.
//!
//! The last section damages the file itself (ST-02): a garbage page, a file cut short
//! or emptied, a missing file with its WAL left, another program's database, a store that
//! lost its tables. What SQLite calls damaged is `Corrupt` on open and on every call, and
//! only a path where no file exists opens as a new store.
#![allow(clippy::unwrap_used)]

use outbox_core::ids::ScopeId;
use std::path::{Path, PathBuf};

use outbox_core::entry::{Controls, MessageRequest, OutboxEntry, StoredEntry};
use outbox_core::fingerprint::request_fingerprint;
use outbox_core::ids::{OperationId, QueueId, SessionId};
use outbox_core::ledger::{LedgerRecord, LedgerStatus};
use outbox_core::store::{OutboxError, OutboxStore};
use overlay_core::store::{OverlayError, OverlayStore, RowClass, StoredBlock};
use proptest::prelude::*;
use rusqlite::types::Value;
use rusqlite::Connection;
use storage_sqlite::{OpenError, Settings, SqliteStore, SCHEMA_VERSION};
use timeline_core::block::Block;
use timeline_core::key::{BlockKey, BlockType, RunId, TargetId};
use timeline_core::policy::MAX_EXACT_INTEGER;
use timeline_core::time::Millis;

/// A fresh file in its own directory.
fn file() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("custody.sqlite");
    (dir, path)
}

fn open(path: &Path) -> SqliteStore {
    SqliteStore::open(path, Settings::default()).unwrap()
}

/// A raw connection to the file that does not enforce `CHECK` constraints, as a
/// foreign writer or a damaged page would not.
fn raw(path: &Path) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.pragma_update(None, "ignore_check_constraints", "ON")
        .unwrap();
    conn
}

fn s(id: &str) -> SessionId {
    SessionId::new(id).unwrap()
}

fn t(id: &str) -> TargetId {
    TargetId::new(id).unwrap()
}

fn op(id: &str) -> OperationId {
    OperationId::new(id).unwrap()
}

/// Entry `q-<n>` / `op-<n>` at position `n`.
fn entry(n: i64) -> OutboxEntry {
    OutboxEntry::queued(
        QueueId::new(format!("q-{n}")).unwrap(),
        op(&format!("op-{n}")),
        MessageRequest::text(format!("text {n}"), "composer", Millis(1)),
        Controls::enqueue(),
        n,
    )
}

/// A file whose session `s1` holds entries 1 and 2, claimed through the store.
fn two_entries() -> (tempfile::TempDir, PathBuf) {
    let (dir, path) = file();
    let mut store = open(&path);
    for n in [1, 2] {
        let e = entry(n);
        let fp = request_fingerprint(&s("s1"), &e.queue_id, &e.request);
        store.claim(&s("s1"), &fp, &e).unwrap();
    }
    (dir, path)
}

fn block(id: &str) -> StoredBlock {
    StoredBlock {
        block: Block::new(
            BlockKey::parse(BlockType::AgentReply, id).unwrap(),
            Millis(1),
        ),
        class: RowClass::Ordinary,
        run_id: Some(RunId::new("run-1").unwrap()),
    }
}

/// A file with overlays for targets `t1` and `t2` of session `s1`.
fn two_overlays() -> (tempfile::TempDir, PathBuf) {
    let (dir, path) = file();
    let mut store = open(&path);
    for target in ["t1", "t2"] {
        store
            .compare_and_set(&s("s1"), &t(target), None, 1, vec![block("a")])
            .unwrap();
    }
    (dir, path)
}

fn overlay_corrupt<T: std::fmt::Debug>(result: Result<T, OverlayError>) -> (String, String) {
    match result {
        Err(OverlayError::Corrupt { what, reason }) => (what, reason),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

fn outbox_corrupt<T: std::fmt::Debug>(result: Result<T, OutboxError>) -> (String, String) {
    match result {
        Err(OutboxError::Corrupt { what, reason }) => (what, reason),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

/// The entries of `s1` after reopening: the blocked one (queue `q-2`) and the decoded
/// neighbour, which must equal what was claimed.
fn blocked_beside_entry_1(path: &Path) -> outbox_core::entry::BlockedEntry {
    let mut store = open(path);
    let entries = store.entries(&s("s1")).unwrap();
    assert_eq!(entries.len(), 2, "{entries:?}");
    let mut blocked = None;
    for e in entries {
        match e {
            StoredEntry::Entry(e) => assert_eq!(*e, entry(1), "the neighbour reads as claimed"),
            StoredEntry::Blocked(b) => blocked = Some(b),
        }
    }
    let blocked = blocked.expect("the bad row shows as blocked");
    assert_eq!(
        (blocked.queue_id.as_str(), blocked.operation_id.as_deref()),
        ("q-2", Some("op-2"))
    );
    assert_eq!(store.outbox_sessions().unwrap(), [s("s1")]);
    blocked
}

// OB-05, ST-01: an `entry_json` whose state fields no entry state has (here an
// acceptance on a queued entry, and a sending entry with auto-drain off that is no
// requested stop and send now) blocks its own entry with the typed reason; the other
// entry of the session still reads.
#[test]
fn state_fields_no_state_has_block_only_their_entry() {
    use outbox_core::entry::InvalidEntryState;
    let acceptance = serde_json::json!({
        "runId": "run-1", "threadId": "thread-1", "turnId": "turn-1", "acceptedAt": 1
    });
    let cases = [
        (
            vec![("acceptance", acceptance)],
            InvalidEntryState::QueuedWithAcceptance,
        ),
        (
            vec![
                ("status", serde_json::json!("sending")),
                ("autoDrain", serde_json::json!(false)),
            ],
            InvalidEntryState::SendingWithoutAutoDrain,
        ),
    ];
    for (changes, expected) in cases {
        let (_dir, path) = two_entries();
        let conn = raw(&path);
        let json: String = conn
            .query_row(
                "SELECT entry_json FROM workspace_chat_outbox WHERE queue_id = 'q-2'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        let mut body: serde_json::Value = serde_json::from_str(&json).unwrap();
        for (field, value) in changes {
            body.as_object_mut()
                .unwrap()
                .insert(field.to_owned(), value);
        }
        conn.execute(
            "UPDATE workspace_chat_outbox SET entry_json = ?1 WHERE queue_id = 'q-2'",
            [body.to_string()],
        )
        .unwrap();
        drop(conn);
        let blocked = blocked_beside_entry_1(&path);
        assert_eq!(blocked.position, 2);
        assert!(
            blocked.reason.starts_with(&expected.to_string()),
            "{}",
            blocked.reason
        );
    }
}

// OB-05, ST-01: an `entry_json` stored as a BLOB blocks its own entry, with the BLOB
// shown; the other entry of the session still reads.
#[test]
fn an_entry_json_blob_blocks_only_its_entry() {
    let (_dir, path) = two_entries();
    raw(&path)
        .execute(
            "UPDATE workspace_chat_outbox SET entry_json = CAST(entry_json AS BLOB)
             WHERE queue_id = 'q-2'",
            [],
        )
        .unwrap();
    let blocked = blocked_beside_entry_1(&path);
    assert_eq!(blocked.position, 2);
    assert!(
        blocked
            .reason
            .starts_with("workspace_chat_outbox.entry_json holds BLOB X'7b22"),
        "{}",
        blocked.reason
    );
    assert!(
        blocked.reason.ends_with("expected TEXT"),
        "{}",
        blocked.reason
    );
}

// OB-05, ST-01: a `position` stored as TEXT or as a REAL blocks its own entry, shown
// after every readable entry, with the stored value in the reason.
#[test]
fn a_position_of_the_wrong_type_blocks_only_its_entry() {
    for (stored, shown) in [
        (Value::Text("twelve".into()), "TEXT 'twelve'"),
        (Value::Real(1.5), "REAL 1.5"),
    ] {
        let (_dir, path) = two_entries();
        raw(&path)
            .execute(
                "UPDATE workspace_chat_outbox SET position = ?1 WHERE queue_id = 'q-2'",
                [&stored],
            )
            .unwrap();
        let blocked = blocked_beside_entry_1(&path);
        assert_eq!(blocked.position, i64::MAX, "shown last");
        assert_eq!(
            blocked.reason,
            format!(
                "workspace_chat_outbox.position holds {shown}, expected an INTEGER from {} to {}",
                i64::MIN,
                i64::MAX
            )
        );
    }
}

// OB-05: every column that does not read back is named, not only the first.
#[test]
fn a_blocked_entry_names_every_bad_column() {
    let (_dir, path) = two_entries();
    raw(&path)
        .execute(
            "UPDATE workspace_chat_outbox SET position = 'x', entry_json = x'00'
             WHERE queue_id = 'q-2'",
            [],
        )
        .unwrap();
    let blocked = blocked_beside_entry_1(&path);
    assert!(
        blocked.reason.contains("position holds TEXT 'x'"),
        "{}",
        blocked.reason
    );
    assert!(
        blocked.reason.contains("entry_json holds BLOB X'00'"),
        "{}",
        blocked.reason
    );
}

// OB-05: removing a blocked entry still works, and leaves its neighbour alone.
#[test]
fn a_blocked_entry_can_be_removed() {
    let (_dir, path) = two_entries();
    raw(&path)
        .execute(
            "UPDATE workspace_chat_outbox SET entry_json = x'00' WHERE queue_id = 'q-2'",
            [],
        )
        .unwrap();
    let mut store = open(&path);
    assert_eq!(
        store
            .remove_entry(&s("s1"), &QueueId::new("q-2").unwrap())
            .unwrap(),
        None,
        "nothing decodes to return"
    );
    let entries = store.entries(&s("s1")).unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].entry(), Some(&entry(1)));
    assert!(
        store
            .identity(&s("s1"), &op("op-2"))
            .unwrap()
            .unwrap()
            .removed
    );
}

// OB-05 property: whatever value one column of one outbox row holds, the session's
// outbox reads, keeps both rows and decodes the untouched one exactly.
mod any_value_in_one_column {
    use super::*;

    fn values() -> impl Strategy<Value = Value> {
        prop_oneof![
            any::<i64>().prop_map(Value::Integer),
            any::<f64>()
                .prop_filter("SQLite stores NaN as NULL", |x| !x.is_nan())
                .prop_map(Value::Real),
            "\\PC{0,40}".prop_map(Value::Text),
            prop::collection::vec(any::<u8>(), 0..40).prop_map(Value::Blob),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases((fixtures::proptest_cases() / 4).max(8)))]

        #[test]
        fn never_takes_the_neighbour_with_it(
            column in prop::sample::select(vec!["queue_id", "operation_id", "position", "entry_json"]),
            value in values(),
        ) {
            let (_dir, path) = two_entries();
            let changed = raw(&path).execute(
                &format!("UPDATE workspace_chat_outbox SET {column} = ?1 WHERE queue_id = 'q-2'"),
                [&value],
            );
            // A queue ID equal to the neighbour's breaks the unique index: not a file
            // this test can make.
            prop_assume!(changed.is_ok());
            let mut store = open(&path);
            let entries = store.entries(&s("s1")).unwrap();
            prop_assert_eq!(entries.len(), 2);
            let first = entries.iter().filter_map(StoredEntry::entry).find(|e| e.queue_id.as_str() == "q-1");
            prop_assert_eq!(first, Some(&entry(1)));
        }
    }
}

// OV-02: a negative or too large revision or epoch is Corrupt, naming the column and
// the stored value, never a huge `u64`; the other target still loads.
#[test]
fn overlay_revisions_and_epochs_out_of_range_are_corrupt() {
    let too_big = MAX_EXACT_INTEGER as i64 + 1;
    for (column, stored, shown) in [
        ("revision", Value::Integer(-5), "INTEGER -5".to_owned()),
        (
            "revision",
            Value::Integer(too_big),
            format!("INTEGER {too_big}"),
        ),
        (
            "revision",
            Value::Text("seven".into()),
            "TEXT 'seven'".into(),
        ),
        ("settlement_epoch", Value::Integer(-1), "INTEGER -1".into()),
        (
            "settlement_epoch",
            Value::Integer(i64::MAX),
            format!("INTEGER {}", i64::MAX),
        ),
        ("settlement_epoch", Value::Real(2.5), "REAL 2.5".into()),
    ] {
        let (_dir, path) = two_overlays();
        raw(&path)
            .execute(
                &format!(
                    "UPDATE chat_live_timeline_overlays SET {column} = ?1
                     WHERE timeline_target_id = 't1'"
                ),
                [&stored],
            )
            .unwrap();
        let mut store = open(&path);
        let (what, reason) = overlay_corrupt(store.load(&s("s1"), &t("t1")));
        assert_eq!(what, "overlay s1/t1");
        assert_eq!(
            reason,
            format!(
                "chat_live_timeline_overlays.{column} holds {shown}, expected an INTEGER from 0 to {MAX_EXACT_INTEGER}"
            )
        );
        // A write to it is refused the same way, before anything is written.
        if column == "revision" {
            let (what, _) =
                overlay_corrupt(store.compare_and_set(&s("s1"), &t("t1"), Some(1), 1, vec![]));
            assert_eq!(what, "overlay s1/t1");
        }
        let other = store.load(&s("s1"), &t("t2")).unwrap().unwrap();
        assert_eq!((other.settlement_epoch, other.blocks.len()), (1, 1));
        assert_eq!(store.targets(&s("s1")).unwrap(), [t("t1"), t("t2")]);
    }
}

// OV-02: a corrupt revision counter is a typed error on read and on every write, never
// a panic, a wrap or `RevisionExhausted`; stored overlays still load.
#[test]
fn a_corrupt_revision_counter_is_a_typed_error() {
    let too_big = MAX_EXACT_INTEGER as i64 + 1;
    for (sql, reason) in [
        (
            "UPDATE chat_live_timeline_overlay_revisions SET revision = -1".to_owned(),
            format!(
                "chat_live_timeline_overlay_revisions.revision holds INTEGER -1, expected an INTEGER from 0 to {MAX_EXACT_INTEGER}"
            ),
        ),
        (
            format!("UPDATE chat_live_timeline_overlay_revisions SET revision = {too_big}"),
            format!(
                "chat_live_timeline_overlay_revisions.revision holds INTEGER {too_big}, expected an INTEGER from 0 to {MAX_EXACT_INTEGER}"
            ),
        ),
        (
            "UPDATE chat_live_timeline_overlay_revisions SET revision = 'many'".into(),
            format!(
                "chat_live_timeline_overlay_revisions.revision holds TEXT 'many', expected an INTEGER from 0 to {MAX_EXACT_INTEGER}"
            ),
        ),
        (
            "DELETE FROM chat_live_timeline_overlay_revisions".into(),
            "chat_live_timeline_overlay_revisions has no row with id 1".into(),
        ),
    ] {
        let (_dir, path) = two_overlays();
        raw(&path).execute_batch(&sql).unwrap();
        let mut store = open(&path);
        let expected = ("overlay revision counter".to_owned(), reason);
        assert_eq!(overlay_corrupt(store.current_revision()), expected);
        assert_eq!(
            overlay_corrupt(store.compare_and_set(&s("s1"), &t("t3"), None, 0, vec![])),
            expected
        );
        let before = store.load(&s("s1"), &t("t1")).unwrap().unwrap();
        assert_eq!(
            overlay_corrupt(overlay_core::store::write(
                &mut store,
                &s("s1"),
                &t("t1"),
                &overlay_core::overlay::Change::Publish(vec![block("b")]),
            )),
            expected
        );
        // Nothing was written.
        assert_eq!(store.load(&s("s1"), &t("t1")).unwrap().unwrap(), before);
        assert_eq!(store.load(&s("s1"), &t("t3")).unwrap(), None);
    }
}

// OV-02: a counter behind the revision of the target being written would hand that
// revision out again: the write is refused as Corrupt and nothing is written.
#[test]
fn a_counter_behind_the_targets_revision_is_corrupt() {
    let (_dir, path) = two_overlays();
    raw(&path)
        .execute_batch("UPDATE chat_live_timeline_overlay_revisions SET revision = 1")
        .unwrap();
    let mut store = open(&path);
    let before = store.load(&s("s1"), &t("t2")).unwrap().unwrap();
    assert_eq!(before.revision, 2);
    let (what, reason) =
        overlay_corrupt(store.compare_and_set(&s("s1"), &t("t2"), Some(2), 1, vec![]));
    assert_eq!(what, "overlay revision counter");
    assert_eq!(
        reason,
        "chat_live_timeline_overlay_revisions.revision holds INTEGER 1, below the revision 2 of overlay s1/t2"
    );
    let (what, _) = overlay_corrupt(overlay_core::store::write(
        &mut store,
        &s("s1"),
        &t("t2"),
        &overlay_core::overlay::Change::Publish(vec![block("b")]),
    ));
    assert_eq!(what, "overlay revision counter");
    assert_eq!(store.load(&s("s1"), &t("t2")).unwrap().unwrap(), before);
    assert_eq!(store.current_revision().unwrap(), 1);
}

// OV-01, ST-01, ST-02: a version-4 snapshot that holds one key twice cannot split into
// rows: the upgrade keeps it as it was, loading it is Corrupt as in version 4, a write
// to it is refused, and the other target loads.
#[test]
fn a_version_4_snapshot_with_a_key_twice_stays_and_is_corrupt() {
    let (_dir, path) = file();
    drop(SqliteStore::open_at(&path, Settings::default(), 4).unwrap());
    let mut changed = serde_json::to_value(block("a")).unwrap();
    changed["block"]["timestamp"] = 99.into();
    let twice =
        serde_json::to_string(&vec![serde_json::to_value(block("a")).unwrap(), changed]).unwrap();
    let once = serde_json::to_string(&vec![block("a")]).unwrap();
    let conn = raw(&path);
    conn.execute(
        "INSERT INTO chat_live_timeline_overlays VALUES ('s1', 't1', 1, 1, ?1), ('s1', 't2', 2, 1, ?2)",
        [&twice, &once],
    )
    .unwrap();
    conn.execute_batch("UPDATE chat_live_timeline_overlay_revisions SET revision = 2")
        .unwrap();
    drop(conn);
    let mut store = open(&path);
    let (what, reason) = overlay_corrupt(store.load(&s("s1"), &t("t1")));
    assert_eq!(what, "overlay s1/t1");
    assert_eq!(
        reason,
        "chat_live_timeline_overlays.snapshot_json holds two blocks with the key agentReply \"a\""
            .replace("agentReply", BlockType::AgentReply.as_str())
    );
    let (what, _) = overlay_corrupt(overlay_core::store::write(
        &mut store,
        &s("s1"),
        &t("t1"),
        &overlay_core::overlay::Change::Publish(vec![block("b")]),
    ));
    assert_eq!(what, "overlay s1/t1");
    assert_eq!(store.current_revision().unwrap(), 2, "nothing was written");
    let kept: String = raw(&path)
        .query_row(
            "SELECT snapshot_json FROM chat_live_timeline_overlays WHERE timeline_target_id = 't1'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(kept, twice, "the snapshot stays as it was");
    let other = store.load(&s("s1"), &t("t2")).unwrap().unwrap();
    assert_eq!((other.revision, other.blocks), (2, vec![block("a")]));
}

// ST-02: version-4 snapshots that are not a JSON array of blocks do not stop the
// upgrade; each stays as it was and reads as Corrupt, naming its target.
#[test]
fn a_version_4_snapshot_that_is_not_an_array_of_blocks_stays_and_is_corrupt() {
    let (_dir, path) = file();
    drop(SqliteStore::open_at(&path, Settings::default(), 4).unwrap());
    let bad = [
        ("t1", "not json"),
        ("t2", "[1, 2]"),
        ("t3", "{\"block\": {}}"),
        ("t4", "[{\"block\": {\"type\": 7, \"id\": \"a\"}}]"),
    ];
    let conn = raw(&path);
    for (n, (target, json)) in bad.iter().enumerate() {
        conn.execute(
            "INSERT INTO chat_live_timeline_overlays VALUES ('s1', ?1, ?2, 0, ?3)",
            rusqlite::params![target, n as i64 + 1, json],
        )
        .unwrap();
    }
    drop(conn);
    let mut store = open(&path);
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    for (target, json) in bad {
        let (what, _) = overlay_corrupt(store.load(&s("s1"), &t(target)));
        assert_eq!(what, format!("overlay s1/{target}"));
        let kept: String = raw(&path)
            .query_row(
                "SELECT snapshot_json FROM chat_live_timeline_overlays WHERE timeline_target_id = ?1",
                [target],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(kept, json);
    }
}

/// Changes the row of `t1` with raw SQL, reopens, and returns the load's Corrupt error.
fn t1_row_corrupt(sql: &str) -> (String, String) {
    let (_dir, path) = two_overlays();
    raw(&path).execute_batch(sql).unwrap();
    let mut store = open(&path);
    let result = overlay_corrupt(store.load(&s("s1"), &t("t1")));
    // A write to that target is refused the same way and writes nothing; the other
    // target still loads.
    let before = store.current_revision().unwrap();
    assert_eq!(
        overlay_corrupt(overlay_core::store::write(
            &mut store,
            &s("s1"),
            &t("t1"),
            &overlay_core::overlay::Change::Publish(vec![block("b")]),
        )),
        result
    );
    assert_eq!(store.current_revision().unwrap(), before);
    assert_eq!(
        store.load(&s("s1"), &t("t2")).unwrap().unwrap().blocks,
        [block("a")]
    );
    result
}

// OV-01, ST-01: a stored row whose JSON does not decode, whose JSON names another key
// than its key columns, or whose columns have the wrong type is Corrupt, naming the
// row; it is never dropped or taken for another row.
#[test]
fn overlay_rows_that_do_not_read_back_are_corrupt() {
    let reply = BlockType::AgentReply.as_str();
    let (what, reason) = t1_row_corrupt(
        "UPDATE chat_live_timeline_overlay_rows SET row_json = '{\"broken\": true}'
         WHERE timeline_target_id = 't1'",
    );
    assert_eq!(what, "overlay s1/t1");
    assert!(
        reason.starts_with(&format!(
            "chat_live_timeline_overlay_rows.row_json of the row {reply} \"a\": "
        )),
        "{reason}"
    );
    let (_, reason) = t1_row_corrupt(
        "UPDATE chat_live_timeline_overlay_rows SET block_id = 'z'
         WHERE timeline_target_id = 't1'",
    );
    assert_eq!(
        reason,
        format!(
            "chat_live_timeline_overlay_rows.row_json holds the key {reply} \"a\" in the row {reply} \"z\""
        )
    );
    let (_, reason) = t1_row_corrupt(
        "UPDATE chat_live_timeline_overlay_rows SET block_id = x'61'
         WHERE timeline_target_id = 't1'",
    );
    assert_eq!(
        reason,
        "chat_live_timeline_overlay_rows.block_id holds BLOB X'61', expected TEXT"
    );
    let (_, reason) = t1_row_corrupt(
        "UPDATE chat_live_timeline_overlays SET snapshot_json = x'07'
         WHERE timeline_target_id = 't1'",
    );
    assert_eq!(
        reason,
        "chat_live_timeline_overlays.snapshot_json holds BLOB X'07', expected TEXT"
    );
}

// ST-01: a target or cleanup-journal value of the wrong type is Corrupt, not
// Unavailable.
#[test]
fn text_columns_of_the_overlay_tables_refuse_other_types() {
    use overlay_core::store::CleanupJournal;
    let (_dir, path) = two_overlays();
    let mut store = open(&path);
    store
        .add_cleanup(&s("s1"), &RunId::new("run-1").unwrap())
        .unwrap();
    drop(store);
    let conn = raw(&path);
    conn.execute_batch(
        "UPDATE chat_live_timeline_overlays SET timeline_target_id = x'0102'
             WHERE timeline_target_id = 't2';
         UPDATE chat_pending_terminal_overlay_cleanups SET run_id = x'ff';",
    )
    .unwrap();
    drop(conn);
    let mut store = open(&path);
    let (_, reason) = overlay_corrupt(store.targets(&s("s1")));
    assert_eq!(
        reason,
        "chat_live_timeline_overlays.timeline_target_id holds BLOB X'0102', expected TEXT"
    );
    let (_, reason) = overlay_corrupt(store.pending_cleanups(None));
    assert_eq!(
        reason,
        "chat_pending_terminal_overlay_cleanups.run_id holds BLOB X'ff', expected TEXT"
    );
    assert!(store.load(&s("s1"), &t("t1")).unwrap().is_some());
}

// OB-03, ST-01: `removed` reads only 0 or 1; a 7 (or text) is Corrupt, never "removed",
// and a claim of that operation is refused the same way instead of guessing.
#[test]
fn a_removed_flag_other_than_0_or_1_is_corrupt() {
    for (stored, shown) in [
        (Value::Integer(7), "INTEGER 7"),
        (Value::Integer(-1), "INTEGER -1"),
        (Value::Text("yes".into()), "TEXT 'yes'"),
    ] {
        let (_dir, path) = two_entries();
        raw(&path)
            .execute(
                "UPDATE workspace_chat_outbox_operation_identity SET removed = ?1
                 WHERE operation_id = 'op-2'",
                [&stored],
            )
            .unwrap();
        let mut store = open(&path);
        let (what, reason) = outbox_corrupt(store.identity(&s("s1"), &op("op-2")));
        assert_eq!(what, "operation identity s1/op-2");
        assert_eq!(
            reason,
            format!(
                "workspace_chat_outbox_operation_identity.removed holds {shown}, expected the INTEGER 0 or 1"
            )
        );
        let e = entry(2);
        let fp = request_fingerprint(&s("s1"), &e.queue_id, &e.request);
        outbox_corrupt(store.claim(&s("s1"), &fp, &e));
        // The neighbour's identity is untouched.
        let other = store.identity(&s("s1"), &op("op-1")).unwrap().unwrap();
        assert!(!other.removed);
    }
}

// OB-02, ST-01: a fingerprint BLOB of any length but 32 bytes, or a number, is Corrupt
// instead of being returned as a digest of the wrong length.
#[test]
fn a_fingerprint_of_the_wrong_length_is_corrupt() {
    for (sql, shown) in [
        (
            "UPDATE workspace_chat_outbox_operation_identity SET fingerprint = x'00ff'
             WHERE operation_id = 'op-2'",
            "BLOB X'00ff', expected a BLOB of 32 digest bytes or TEXT",
        ),
        (
            "UPDATE workspace_chat_outbox_operation_identity
             SET fingerprint = substr(fingerprint, 1, 31) WHERE operation_id = 'op-2'",
            "BLOB X'",
        ),
        (
            "UPDATE workspace_chat_outbox_operation_identity SET fingerprint = 12
             WHERE operation_id = 'op-2'",
            "INTEGER 12, expected TEXT",
        ),
    ] {
        let (_dir, path) = two_entries();
        raw(&path).execute_batch(sql).unwrap();
        let mut store = open(&path);
        let (what, reason) = outbox_corrupt(store.identity(&s("s1"), &op("op-2")));
        assert_eq!(what, "operation identity s1/op-2");
        assert!(
            reason.starts_with(&format!(
                "workspace_chat_outbox_operation_identity.fingerprint holds {shown}"
            )),
            "{reason}"
        );
        let other = store.identity(&s("s1"), &op("op-1")).unwrap().unwrap();
        let e = entry(1);
        assert_eq!(
            other.fingerprint,
            request_fingerprint(&s("s1"), &e.queue_id, &e.request)
        );
    }
}

// OB-07, ST-01: a ledger row whose `status` column says something else than its JSON
// is Corrupt; the neighbour row reads.
#[test]
fn a_ledger_status_that_disagrees_with_its_json_is_corrupt() {
    let (_dir, path) = file();
    let mut store = open(&path);
    let sent = LedgerRecord::new(LedgerStatus::Sent, Millis(5));
    let failed = LedgerRecord::new(LedgerStatus::Failed, Millis(6));
    store
        .put_ledger(&ScopeId::of(&s("s1")), &op("op-1"), &sent)
        .unwrap();
    store
        .put_ledger(&ScopeId::of(&s("s1")), &op("op-2"), &failed)
        .unwrap();
    drop(store);
    raw(&path)
        .execute(
            "UPDATE chat_operation_ledger SET status = 'failed' WHERE operation_id = 'op-1'",
            [],
        )
        .unwrap();
    let mut store = open(&path);
    let (what, reason) = outbox_corrupt(store.ledger(&ScopeId::of(&s("s1")), &op("op-1")));
    assert_eq!(what, "ledger s1/op-1");
    assert_eq!(
        reason,
        "chat_operation_ledger.status holds TEXT 'failed', expected TEXT 'sent', the status of chat_operation_ledger.record_json"
    );
    assert_eq!(
        store.ledger(&ScopeId::of(&s("s1")), &op("op-2")).unwrap(),
        Some(failed)
    );

    // A record JSON stored as a BLOB is named too.
    raw(&path)
        .execute(
            "UPDATE chat_operation_ledger SET record_json = CAST(record_json AS BLOB)
             WHERE operation_id = 'op-2'",
            [],
        )
        .unwrap();
    let (_, reason) = outbox_corrupt(store.ledger(&ScopeId::of(&s("s1")), &op("op-2")));
    assert!(
        reason.starts_with("chat_operation_ledger.record_json holds BLOB X'7b"),
        "{reason}"
    );
}

// OB-16, ST-01: every column of a session-message route is checked: a negative or
// oversized hop, a created_at out of range or of the wrong type, an unknown delivery
// are Corrupt, naming the column; the neighbour route reads.
#[test]
fn route_columns_out_of_range_are_corrupt() {
    let too_big = MAX_EXACT_INTEGER as i64 + 1;
    for (column, stored, shown) in [
        (
            "hop",
            Value::Integer(-1),
            format!("INTEGER -1, expected an INTEGER from 0 to {}", u32::MAX),
        ),
        (
            "hop",
            Value::Integer(i64::from(u32::MAX) + 1),
            format!(
                "INTEGER {}, expected an INTEGER from 0 to {}",
                i64::from(u32::MAX) + 1,
                u32::MAX
            ),
        ),
        (
            "created_at",
            Value::Integer(-5),
            format!("INTEGER -5, expected an INTEGER from 0 to {MAX_EXACT_INTEGER}"),
        ),
        (
            "created_at",
            Value::Integer(too_big),
            format!("INTEGER {too_big}, expected an INTEGER from 0 to {MAX_EXACT_INTEGER}"),
        ),
        (
            "created_at",
            Value::Text("today".into()),
            format!("TEXT 'today', expected an INTEGER from 0 to {MAX_EXACT_INTEGER}"),
        ),
        (
            "delivery",
            Value::Text("lost".into()),
            "TEXT 'lost', expected one of 'sent', 'needs-approval', 'declined'".into(),
        ),
        (
            "chain_id",
            Value::Blob(vec![1]),
            "BLOB X'01', expected TEXT".into(),
        ),
    ] {
        let (_dir, path) = file();
        drop(open(&path));
        let conn = raw(&path);
        conn.execute_batch(
            "INSERT INTO chat_session_messages VALUES
                 ('op-1', 's2', 's1', 'call-1', NULL, NULL, 'chain', 1, 5, 'sent'),
                 ('op-2', 's2', 's1', 'call-2', 'run-1', NULL, 'chain', 2, 6, 'declined');",
        )
        .unwrap();
        conn.execute(
            &format!("UPDATE chat_session_messages SET {column} = ?1 WHERE operation_id = 'op-1'"),
            [&stored],
        )
        .unwrap();
        drop(conn);
        let mut store = open(&path);
        let (what, reason) = outbox_corrupt(store.route(&op("op-1")));
        assert_eq!(what, "session message route");
        assert_eq!(
            reason,
            format!("chat_session_messages.{column} holds {shown}")
        );
        let other = store.route(&op("op-2")).unwrap().unwrap();
        assert_eq!((other.hop, other.created_at), (2, Millis(6)));
    }
}

/// Turns the current store at `path` into what an earlier release wrote: the same tables,
/// no `custody_schema`, the version in `PRAGMA user_version`.
fn as_earlier_release(path: &Path, version: i64) {
    raw(path)
        .execute_batch(&format!(
            "DROP TABLE custody_schema; PRAGMA user_version = {version};"
        ))
        .unwrap();
}

/// Sets the version in the store's `custody_schema`.
fn set_schema_version(path: &Path, version: i64) {
    raw(path)
        .execute("UPDATE custody_schema SET version = ?1", [version])
        .unwrap();
}

/// Whether the file at `path` has a `custody_schema` table.
fn has_schema_table(path: &Path) -> bool {
    raw(path)
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE name = 'custody_schema'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .unwrap()
        == 1
}

/// Asserts that opening the store fails the migration after `found`, naming the stored
/// version and the versions this build knows, never the migration's SQL.
fn assert_migration_fails(path: &Path, found: u32) {
    let err = SqliteStore::open(path, Settings::default()).unwrap_err();
    let text = err.to_string();
    match err {
        OpenError::Migration {
            found: f,
            supported,
            migration,
            reason,
        } => {
            assert_eq!((f, supported), (found, SCHEMA_VERSION));
            assert_eq!(
                migration,
                storage_sqlite::MIGRATIONS[found as usize].0,
                "the first migration after the stored version"
            );
            assert!(!reason.is_empty());
        }
        other => panic!("{other:?}"),
    }
    assert!(text.contains(&format!("schema version {found}")), "{text}");
    assert!(
        text.contains(&format!("versions 0 to {SCHEMA_VERSION}")),
        "{text}"
    );
    for sql in ["CREATE TABLE", "ALTER TABLE", "INSERT INTO", "--"] {
        assert!(!text.contains(sql), "{text}");
    }
}

/// Asserts that opening the store is refused as a negative version, named as stored.
fn assert_negative_version_refused(path: &Path) {
    let err = SqliteStore::open(path, Settings::default()).unwrap_err();
    assert!(
        matches!(err, OpenError::UnknownSchema { found: -3, supported } if supported == SCHEMA_VERSION),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "the database says schema version -3; this build knows versions 0 to {SCHEMA_VERSION}"
        )
    );
}

// ST-02: a `user_version` that does not match the tables of a store written by an
// earlier release (which kept its version there) fails the migration with the stored
// version and the versions this build knows, never the migration's SQL; nothing of the
// failed migration is written (not even the `custody_schema` table the conversion
// adds), so the file opens once the version is right.
#[test]
fn a_bad_user_version_names_the_versions_not_the_sql() {
    let (_dir, path) = two_entries();
    as_earlier_release(&path, SCHEMA_VERSION.into());
    for found in [0u32, 1] {
        raw(&path)
            .pragma_update(None, "user_version", found)
            .unwrap();
        assert_migration_fails(&path, found);
        assert!(!has_schema_table(&path), "nothing was written");
    }
    // A negative version is named as stored.
    raw(&path).pragma_update(None, "user_version", -3).unwrap();
    assert_negative_version_refused(&path);
    assert!(!has_schema_table(&path), "nothing was written");
    // Nothing was damaged.
    raw(&path)
        .pragma_update(None, "user_version", SCHEMA_VERSION)
        .unwrap();
    let mut store = open(&path);
    assert_eq!(store.entries(&s("s1")).unwrap().len(), 2);
    assert!(has_schema_table(&path));
}

// ST-02: the same for a version in `custody_schema` that does not match the tables;
// nothing of the failed migration is written, so the file opens once the version is
// right. `user_version` plays no part: it stays 0 throughout.
#[test]
fn a_bad_schema_table_version_names_the_versions_not_the_sql() {
    let (_dir, path) = two_entries();
    for found in [0u32, 1] {
        set_schema_version(&path, found.into());
        assert_migration_fails(&path, found);
        let stored: i64 = raw(&path)
            .query_row("SELECT version FROM custody_schema", [], |r| r.get(0))
            .unwrap();
        assert_eq!(stored, i64::from(found), "nothing was written");
    }
    set_schema_version(&path, -3);
    assert_negative_version_refused(&path);
    set_schema_version(&path, SCHEMA_VERSION.into());
    let mut store = open(&path);
    assert_eq!(store.entries(&s("s1")).unwrap().len(), 2);
    let user_version: i64 = store
        .connection()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(user_version, 0);
}

// ST-02, ST-01: a `custody_schema` table that does not read as this library's (a
// version that is not an INTEGER, no row, two rows, no `version` column) is refused as
// `Corrupt`, naming the table; it is never taken for a store at some version, nor for
// a new one, and nothing is written.
#[test]
fn a_damaged_schema_table_is_refused() {
    let cases: [(&str, &str); 4] = [
        (
            "UPDATE custody_schema SET version = 'six'",
            "custody_schema.version holds TEXT 'six', expected an INTEGER",
        ),
        (
            "DELETE FROM custody_schema",
            "custody_schema table holds no row",
        ),
        (
            "DROP TABLE custody_schema;
             CREATE TABLE custody_schema (version INTEGER);
             INSERT INTO custody_schema VALUES (6), (6);",
            "custody_schema table holds more than one row",
        ),
        (
            "DROP TABLE custody_schema;
             CREATE TABLE custody_schema (schema_version INTEGER);
             INSERT INTO custody_schema VALUES (6);",
            "custody_schema table is not the one this library writes",
        ),
    ];
    for (edit, expected) in cases {
        let (_dir, path) = two_entries();
        raw(&path).execute_batch(edit).unwrap();
        checkpointed(&path);
        let before = std::fs::read(&path).unwrap();
        let reason = refused_open(SqliteStore::open(&path, Settings::default()));
        assert!(reason.contains(expected), "{edit}: {reason}");
        assert_eq!(
            std::fs::read(&path).unwrap(),
            before,
            "{edit}: nothing was written"
        );
        let conn = Connection::open(&path).unwrap();
        let reason = refused_open(SqliteStore::from_connection(conn));
        assert!(reason.contains(expected), "{edit}: {reason}");
    }
}

// ----------------------------------------------------------------------------------
// A damaged or foreign file (ST-02, ST-01): SQLite's verdict that the file is damaged is
// `Corrupt` at every boundary, never `Unavailable` ("retry later", which a caller would
// follow for ever); a store is created only where no file exists, and an existing file
// opens only if it is a custody store, with nothing written to a file that is refused.

/// The reason of an open refused as damaged or foreign.
fn refused_open(result: Result<SqliteStore, OpenError>) -> String {
    match result {
        Err(OpenError::Corrupt { reason }) => reason,
        Err(other) => panic!("expected OpenError::Corrupt, got {other}"),
        Ok(_) => panic!("expected OpenError::Corrupt, the file opened"),
    }
}

/// Closes every connection to the store at `path`, so its WAL is checkpointed into
/// the file and removed: the file alone holds the store.
fn checkpointed(path: &Path) {
    assert!(
        !with_suffix(path, "-wal").exists(),
        "a connection is still open"
    );
    assert!(std::fs::metadata(path).unwrap().len() > 0);
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// The names in the directory of `path`.
fn names_beside(path: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Overwrites page `page` (from 1) of the file with bytes no page has.
fn garbage_page(path: &Path, page: i64) {
    use std::io::{Seek, SeekFrom, Write};
    let size: i64 = raw(path)
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .unwrap();
    let mut file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.seek(SeekFrom::Start(((page - 1) * size) as u64))
        .unwrap();
    let junk: Vec<u8> = (0..size).map(|i| (i * 37 % 251) as u8 | 0x80).collect();
    file.write_all(&junk).unwrap();
    file.sync_all().unwrap();
}

fn root_page(path: &Path, table: &str) -> i64 {
    raw(path)
        .query_row(
            "SELECT rootpage FROM sqlite_schema WHERE name = ?1",
            [table],
            |r| r.get(0),
        )
        .unwrap()
}

// ST-02, ST-01: a page of garbage in a table is `Corrupt` on read and on write, for the
// outbox and for overlays alike (SQLite's SQLITE_CORRUPT, by code), never `Unavailable`.
#[test]
fn a_garbage_page_is_corrupt_not_unavailable() {
    let (_dir, path) = two_entries();
    {
        let mut store = open(&path);
        store
            .compare_and_set(&s("s1"), &t("t1"), None, 1, vec![block("a")])
            .unwrap();
    }
    checkpointed(&path);
    let outbox_page = root_page(&path, "workspace_chat_outbox");
    let rows_page = root_page(&path, "chat_live_timeline_overlay_rows");
    garbage_page(&path, outbox_page);
    garbage_page(&path, rows_page);

    // The schema is intact, so the file opens; the damaged tables do not read.
    let mut store = open(&path);
    let read = store.entries(&s("s1"));
    assert_eq!(
        read.as_ref().map_err(OutboxError::kind).err(),
        Some(outbox_core::store::OutboxErrorKind::Corrupt),
        "{read:?}"
    );
    let (what, reason) = outbox_corrupt(read);
    assert_eq!(what, "database file");
    assert!(reason.contains("malformed"), "{reason}");
    let e = entry(3);
    let fp = request_fingerprint(&s("s1"), &e.queue_id, &e.request);
    let claimed = store.claim(&s("s1"), &fp, &e);
    assert_eq!(
        claimed.as_ref().map_err(OutboxError::kind).err(),
        Some(outbox_core::store::OutboxErrorKind::Corrupt),
        "{claimed:?}"
    );
    let (what, _) = overlay_corrupt(store.load(&s("s1"), &t("t1")));
    assert_eq!(what, "database file");
    let written = store.compare_and_set(&s("s1"), &t("t1"), Some(1), 1, vec![block("b")]);
    overlay_corrupt(written);
}

/// A checkpointed store whose session `s1` holds 40 entries with long texts, which fill
/// the outbox's pages (so the last pages of the file hold entries).
fn forty_long_entries() -> (tempfile::TempDir, PathBuf) {
    let (dir, path) = file();
    {
        let mut store = open(&path);
        for n in 1..=40 {
            let mut e = entry(n);
            e.request = MessageRequest::text("x".repeat(3000), "composer", Millis(1));
            let fp = request_fingerprint(&s("s1"), &e.queue_id, &e.request);
            store.claim(&s("s1"), &fp, &e).unwrap();
        }
    }
    checkpointed(&path);
    (dir, path)
}

fn cut_to(path: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

// ST-02, ST-01: a file cut off in the middle of a page (a copy or write that stopped) is
// `Corrupt`: on open when the cut reaches the schema's pages, and on the read that
// reaches the lost pages otherwise; never `Unavailable`.
#[test]
fn a_file_cut_mid_page_is_corrupt_not_unavailable() {
    // Cut inside its last page: the schema is whole, the last entry's pages are not.
    let (_dir, path) = forty_long_entries();
    let len = std::fs::metadata(&path).unwrap().len();
    cut_to(&path, len - 1000);
    let mut store = open(&path);
    let read = store.entries(&s("s1"));
    assert_eq!(
        read.as_ref().map_err(OutboxError::kind).err(),
        Some(outbox_core::store::OutboxErrorKind::Corrupt),
        "{read:?}"
    );
    let (what, reason) = outbox_corrupt(read);
    assert_eq!(what, "database file");
    assert!(reason.contains("malformed"), "{reason}");

    // Cut in the middle of a page halfway: the schema's pages are lost too.
    let (_dir, path) = forty_long_entries();
    let len = std::fs::metadata(&path).unwrap().len();
    cut_to(&path, len / 2 / 2048 * 2048 + 700);
    let reason = refused_open(SqliteStore::open(&path, Settings::default()));
    assert!(reason.contains("malformed"), "{reason}");
}

// ST-02: a file whose first page is garbage, or that was cut inside SQLite's header, or
// that never was an SQLite database, is refused on open as `Corrupt` (SQLITE_NOTADB),
// never a plain SQLite error, and is left as it was.
#[test]
fn a_file_sqlite_calls_not_a_database_is_refused_as_corrupt() {
    let (_dir, path) = two_entries();
    checkpointed(&path);
    garbage_page(&path, 1);
    let before = std::fs::read(&path).unwrap();
    let reason = refused_open(SqliteStore::open(&path, Settings::default()));
    assert!(reason.contains("not a database"), "{reason}");
    assert_eq!(std::fs::read(&path).unwrap(), before, "nothing was written");

    let (_dir, path) = two_entries();
    cut_to(&path, 60);
    refused_open(SqliteStore::open(&path, Settings::default()));

    let (_dir, path) = file();
    std::fs::write(&path, "{\"entries\": []}\n".repeat(200)).unwrap();
    let reason = refused_open(SqliteStore::open(&path, Settings::default()));
    assert!(reason.contains("not a database"), "{reason}");
}

// ST-02, ST-03: an existing empty (0-byte) file is a store cut short, not a first run: it
// is refused, stays empty, and a write-ahead log beside it is kept (SQLite deletes the
// WAL of a 0-page file). The same for an empty file created by someone else.
#[test]
fn an_empty_existing_file_is_refused_not_opened_as_new() {
    // A store cut to 0 bytes while its WAL still held writes.
    let (dir, path) = two_entries();
    let wal = with_suffix(&path, "-wal");
    let kept = dir.path().join("kept-wal");
    {
        let mut store = open(&path);
        let e = entry(3);
        let fp = request_fingerprint(&s("s1"), &e.queue_id, &e.request);
        store.claim(&s("s1"), &fp, &e).unwrap();
        std::fs::copy(&wal, &kept).unwrap();
    }
    std::fs::File::create(&path).unwrap();
    std::fs::copy(&kept, &wal).unwrap();
    let reason = refused_open(SqliteStore::open(&path, Settings::default()));
    assert!(reason.contains("empty (0 bytes)"), "{reason}");
    assert!(reason.contains("write-ahead log"), "{reason}");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
    assert_eq!(std::fs::read(&wal).unwrap(), std::fs::read(&kept).unwrap());
    // Refused again: nothing changed.
    refused_open(SqliteStore::open(&path, Settings::default()));

    // An empty file made by another program (as `tempfile::NamedTempFile` makes one).
    let (_dir, path) = file();
    std::fs::File::create(&path).unwrap();
    let reason = refused_open(SqliteStore::open(&path, Settings::default()));
    assert!(reason.contains("empty (0 bytes)"), "{reason}");
    assert!(!reason.contains("write-ahead log"), "{reason}");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
}

// ST-02: a path where no file exists opens as a new store at the current version; it is
// built beside the path and linked into place, so nothing else is left in the directory,
// and it opens again with what was written.
#[test]
fn a_path_that_does_not_exist_opens_as_a_new_store() {
    let (_dir, path) = file();
    let mut store = open(&path);
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    assert!(store.outbox_sessions().unwrap().is_empty());
    let e = entry(1);
    let fp = request_fingerprint(&s("s1"), &e.queue_id, &e.request);
    store.claim(&s("s1"), &fp, &e).unwrap();
    let second = open(&path);
    drop((store, second));
    assert_eq!(names_beside(&path), ["custody.sqlite"]);
    assert_eq!(open(&path).entries(&s("s1")).unwrap().len(), 1);

    // Its page size is the setting's, as before the store was built beside the path.
    let (_dir, path) = file();
    let mut settings = Settings::default();
    settings.page_size = 4096;
    let store = SqliteStore::open(&path, settings).unwrap();
    let size: i64 = store
        .connection()
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .unwrap();
    assert_eq!(size, 4096);

    // A refused setting creates nothing, so the path is still new afterwards.
    let (_dir, path) = file();
    settings.page_size = 3000;
    assert!(matches!(
        SqliteStore::open(&path, settings),
        Err(OpenError::InvalidSetting { .. })
    ));
    assert!(!path.exists());
    drop(open(&path));
}

// ST-02: a missing file whose write-ahead log is still there is the store's file removed
// or moved without its log: refused, and the log is kept (a new store would take it for
// its own or throw it away).
#[test]
fn a_missing_file_with_its_wal_left_is_refused() {
    let (dir, path) = two_entries();
    let wal = with_suffix(&path, "-wal");
    let kept = dir.path().join("kept-wal");
    {
        let mut store = open(&path);
        let e = entry(3);
        let fp = request_fingerprint(&s("s1"), &e.queue_id, &e.request);
        store.claim(&s("s1"), &fp, &e).unwrap();
        std::fs::copy(&wal, &kept).unwrap();
    }
    std::fs::remove_file(&path).unwrap();
    std::fs::copy(&kept, &wal).unwrap();
    let reason = refused_open(SqliteStore::open(&path, Settings::default()));
    assert!(reason.contains("does not exist"), "{reason}");
    assert!(!path.exists());
    assert_eq!(std::fs::read(&wal).unwrap(), std::fs::read(&kept).unwrap());
}

// ST-02: another program's SQLite database (its own tables, none of ours, and whatever
// `user_version` it keeps) is refused by `SqliteStore::open`, not taken over: a store
// opened by path keeps a file of its own (a store beside an application's tables is
// opened with `SqliteStore::from_connection`). Nothing is written: the tables, the
// version and the journal mode stay the other program's.
#[test]
fn another_programs_database_is_refused_and_left_alone() {
    let (_dir, path) = file();
    {
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT);
             INSERT INTO users (name) VALUES ('ada');",
        )
        .unwrap();
    }
    for user_version in [0, 2, 41] {
        raw(&path)
            .pragma_update(None, "user_version", user_version)
            .unwrap();
        let before = std::fs::read(&path).unwrap();
        let reason = refused_open(SqliteStore::open(&path, Settings::default()));
        assert!(reason.contains("another program's"), "{reason}");
        assert!(reason.contains("users"), "{reason}");
        assert!(reason.contains("from_connection"), "{reason}");
        assert_eq!(std::fs::read(&path).unwrap(), before, "nothing was written");
        let conn = raw(&path);
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "delete", "the journal mode was not switched to WAL");
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, user_version);
        assert!(!has_schema_table(&path));
    }
}

// ST-02: an SQLite database with no tables and schema version 0 is refused: it is what
// a store whose WAL was lost before a checkpoint leaves (its file still the blank first
// page), and what a first open by an earlier build, killed before its first migration,
// left. Nothing in it is lost by refusing; taking it for new could lose the store.
#[test]
fn a_blank_sqlite_database_is_refused() {
    let (_dir, path) = file();
    {
        let conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "page_size", 2048).unwrap();
        let _: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .unwrap();
    }
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 2048);
    let reason = refused_open(SqliteStore::open(&path, Settings::default()));
    assert!(reason.contains("no tables"), "{reason}");
    let tables: i64 = raw(&path)
        .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
        .unwrap();
    assert_eq!(tables, 0, "no migration ran");
}

// ST-02: a file that held the schema (its `custody_schema` table, or the `user_version`
// above 0 an earlier release kept) but lost tables its version has is refused, naming
// them, by `SqliteStore::open` and `SqliteStore::from_connection` alike; it does not
// open with those tables missing or silently made again empty, and is never taken for a
// new store. Restored, it opens.
#[test]
fn a_store_that_lost_its_tables_is_refused() {
    let (_dir, path) = two_entries();
    raw(&path)
        .execute_batch(
            "DROP TABLE workspace_chat_outbox;
             DROP TABLE chat_live_timeline_overlay_rows;",
        )
        .unwrap();
    let reason = refused_open(SqliteStore::open(&path, Settings::default()));
    assert!(
        reason.contains(&format!(
            "schema version {SCHEMA_VERSION} (in its custody_schema)"
        )),
        "{reason}"
    );
    assert!(
        reason.contains("chat_live_timeline_overlay_rows, workspace_chat_outbox"),
        "{reason}"
    );
    // The same for a store of an earlier release.
    as_earlier_release(&path, SCHEMA_VERSION.into());
    let reason = refused_open(SqliteStore::open(&path, Settings::default()));
    assert!(
        reason.contains(&format!(
            "schema version {SCHEMA_VERSION} (in its user_version)"
        )),
        "{reason}"
    );
    assert!(!has_schema_table(&path), "nothing was written");

    // Every table gone but `custody_schema`, at its version or at 0: never a new store.
    for version in [SCHEMA_VERSION.into(), 0] {
        let (_dir, path) = two_entries();
        let conn = raw(&path);
        let tables: Vec<String> = conn
            .prepare(
                "SELECT name FROM sqlite_schema WHERE type = 'table' AND name != 'custody_schema'",
            )
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        for table in tables {
            conn.execute_batch(&format!("DROP TABLE {table}")).unwrap();
        }
        drop(conn);
        set_schema_version(&path, version);
        let opened = refused_open(SqliteStore::open(&path, Settings::default()));
        let shared = refused_open(SqliteStore::from_connection(raw(&path)));
        for reason in [opened, shared] {
            assert!(reason.contains("custody_schema"), "{reason}");
            assert!(reason.contains("lost"), "{reason}");
        }
        let tables: i64 = raw(&path)
            .query_row(
                "SELECT count(*) FROM sqlite_schema WHERE type = 'table'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(tables, 1, "no migration ran");
    }

    // Every table gone, the version kept (the version of a file's header alone).
    let (_dir, path) = file();
    {
        let conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "user_version", 2).unwrap();
    }
    let reason = refused_open(SqliteStore::open(&path, Settings::default()));
    assert!(reason.contains("schema version 2"), "{reason}");
    assert!(reason.contains("workspace_chat_outbox"), "{reason}");

    // A file at an older version with that version's tables opens and is migrated.
    let (_dir, path) = file();
    drop(SqliteStore::open_at(&path, Settings::default(), 2).unwrap());
    assert_eq!(open(&path).schema_version().unwrap(), SCHEMA_VERSION);
}
