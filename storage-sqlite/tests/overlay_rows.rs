//! Overlays stored one row per overlay row (schema version 5; OV-01, OV-02, ST-01,
//! ST-02): a version-4 file upgrades and reads back exactly; a write changes only the
//! rows its change changed; a connection's cached rows never hide another connection's
//! write; and two connections writing in turn stay equal to the naive overlay.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;

use fixtures::naive_overlay::{self, Op, Reference};
use overlay_core::overlay::Change;
use overlay_core::store::{write, WriteResult};
use overlay_core::store::{
    OverlayError, OverlayStore, RowClass, StoredBlock, StoredOverlay, Update, FORMAT_VERSION,
};
use proptest::prelude::*;
use storage_sqlite::{Settings, SqliteStore, Synchronous, SCHEMA_VERSION};
use timeline_core::block::Block;
use timeline_core::key::{BlockKey, BlockType, OperationId, RunId, SessionId, TargetId};
use timeline_core::order::SourceOrder;
use timeline_core::time::Millis;

fn s(id: &str) -> SessionId {
    SessionId::new(id).unwrap()
}

fn t(id: &str) -> TargetId {
    TargetId::new(id).unwrap()
}

fn settings() -> Settings {
    let mut settings = Settings::default();
    settings.synchronous = Synchronous::Normal;
    settings
}

fn reply(id: &str, ts: u64) -> StoredBlock {
    StoredBlock {
        block: Block::new(
            BlockKey::parse(BlockType::AgentReply, id).unwrap(),
            Millis(ts),
        )
        .with_source_order(SourceOrder::live(ts))
        .with_data(serde_json::json!({ "text": format!("reply {id}") })),
        class: RowClass::Ordinary,
        run_id: Some(RunId::new("run-1").unwrap()),
    }
}

/// Writes `overlays` into a version-4 file exactly as version 4 stored them: one JSON
/// array per target, and the counter at the highest revision.
fn write_version_4(path: &Path, overlays: &[(SessionId, TargetId, StoredOverlay)]) {
    let v4 = SqliteStore::open_at(path, settings(), 4).unwrap();
    assert_eq!(v4.schema_version().unwrap(), 4);
    for (session, target, o) in overlays {
        v4.connection()
            .execute(
                "INSERT INTO chat_live_timeline_overlays
                     (app_session_id, timeline_target_id, revision, settlement_epoch, snapshot_json)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                rusqlite::params![
                    session.as_str(),
                    target.as_str(),
                    o.revision as i64,
                    o.settlement_epoch as i64,
                    serde_json::to_string(&o.blocks).unwrap()
                ],
            )
            .unwrap();
    }
    let top = overlays.iter().map(|o| o.2.revision).max().unwrap_or(0);
    v4.connection()
        .execute(
            "UPDATE chat_live_timeline_overlay_revisions SET revision = ?1",
            [top as i64],
        )
        .unwrap();
}

fn stored(revision: u64, epoch: u64, blocks: Vec<StoredBlock>) -> StoredOverlay {
    StoredOverlay {
        format_version: FORMAT_VERSION,
        settlement_epoch: epoch,
        revision,
        blocks,
    }
}

// ST-02, OV-01: a version-4 file upgrades to rows, and every target reads back exactly
// what version 4 stored: every class, runs or none, operations, nested data, numbers
// and text that JSON escapes; an empty overlay keeps its revision and epoch. Writes
// after the upgrade go on from there.
#[test]
fn a_version_4_file_upgrades_and_reads_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v4.sqlite");
    let mut rows = vec![
        reply("a", 1),
        StoredBlock {
            block: Block::new(
                BlockKey::parse(BlockType::Thinking, "thinking-run-1").unwrap(),
                Millis(2),
            )
            .with_source_order(SourceOrder::active_run_status(Millis(2))),
            class: RowClass::Status,
            run_id: Some(RunId::new("run-1").unwrap()),
        },
        StoredBlock {
            block: Block::new(
                BlockKey::parse(BlockType::Activity, "approval:1").unwrap(),
                Millis(3),
            )
            .with_data(serde_json::json!({
                "text": "naïve \"quoted\" \\ back\nslash \u{0} nul \u{1F600} \u{2028}",
                "numbers": [0, -1, 1.0, 2.5e10, -0.0, 9007199254740991_u64, 1.5e-7],
                "nested": { "a": [null, true, false, {}, []], "": "" }
            })),
            class: RowClass::ApprovalCard,
            run_id: None,
        },
        StoredBlock {
            block: {
                let mut b = Block::new(
                    BlockKey::parse(BlockType::User, "user-message::op-1").unwrap(),
                    Millis(3),
                );
                b.operation_id = Some(OperationId::new("op-1").unwrap());
                b
            },
            class: RowClass::Ordinary,
            run_id: None,
        },
        StoredBlock {
            block: Block::new(
                BlockKey::parse(BlockType::Activity, "mirror-1").unwrap(),
                Millis(3),
            ),
            class: RowClass::ProgressMirror,
            run_id: Some(RunId::new("run-1").unwrap()),
        },
        StoredBlock {
            block: Block::new(
                BlockKey::parse(BlockType::Activity, "compacting").unwrap(),
                Millis(4),
            ),
            class: RowClass::CompactingMarker,
            run_id: Some(RunId::new("run-1").unwrap()),
        },
    ];
    rows.sort_by_cached_key(|b| b.block.order_key());
    let overlays = vec![
        (s("s1"), t("s1"), stored(7, 2, rows.clone())),
        (s("s1"), t("thread-1"), stored(3, 1, vec![])),
        (s("s2"), t("s2"), stored(5, 0, vec![reply("a", 9)])),
    ];
    write_version_4(&path, &overlays);
    let mut store = SqliteStore::open(&path, settings()).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    for (session, target, want) in &overlays {
        assert_eq!(
            store.load(session, target).unwrap().as_ref(),
            Some(want),
            "{session}/{target}"
        );
    }
    let ok: String = store
        .connection()
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
    let (legacy, rows_stored): (i64, i64) = store
        .connection()
        .query_row(
            "SELECT (SELECT count(*) FROM chat_live_timeline_overlays WHERE snapshot_json IS NOT NULL),
                    (SELECT count(*) FROM chat_live_timeline_overlay_rows)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!((legacy, rows_stored), (0, rows.len() as i64 + 1));
    // The next write takes the next revision and changes one row.
    let result = write(
        &mut store,
        &s("s1"),
        &t("s1"),
        &Change::Publish(vec![reply("b", 5)]),
    )
    .unwrap();
    assert_eq!(result.snapshot().unwrap().revision, 8);
    drop(store);
    let mut store = SqliteStore::open(&path, settings()).unwrap();
    let now = store.load(&s("s1"), &t("s1")).unwrap().unwrap();
    assert_eq!(now.blocks.len(), rows.len() + 1);
    assert_eq!((now.revision, now.settlement_epoch), (8, 2));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fixtures::proptest_cases().min(48)))]

    // ST-02, OV-01: any version-4 overlays read back exactly after the upgrade.
    #[test]
    fn any_version_4_overlay_reads_back_after_the_upgrade(
        targets in prop::collection::vec((naive_overlay::overlay(12), 0u64..4), 1..4),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v4.sqlite");
        let overlays: Vec<_> = targets
            .into_iter()
            .enumerate()
            .map(|(i, (rows, epoch))| (s("s1"), t(&format!("t{i}")), stored(i as u64 + 1, epoch, rows)))
            .collect();
        write_version_4(&path, &overlays);
        let mut store = SqliteStore::open(&path, settings()).unwrap();
        for (session, target, want) in &overlays {
            let got = store.load(session, target).unwrap();
            prop_assert_eq!(got.as_ref(), Some(want));
        }
    }
}

/// (row_seq, block_id, row_json) of every stored row, by key.
fn stored_rows(store: &SqliteStore) -> BTreeMap<String, (i64, String)> {
    store
        .connection()
        .prepare("SELECT block_id, row_seq, row_json FROM chat_live_timeline_overlay_rows")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, (r.get(1)?, r.get(2)?))))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

// OV-02: publishing one row writes that row, the target's header and the counter, and
// nothing else, whatever the size of the overlay; every other row stays as it was.
#[test]
fn a_write_changes_only_the_rows_it_changed() {
    for n in [10u64, 1_000] {
        let mut store = SqliteStore::open_in_memory(settings()).unwrap();
        let (session, target) = (s("s1"), t("s1"));
        let rows: Vec<StoredBlock> = (0..n).map(|i| reply(&format!("r{i}"), i)).collect();
        write(&mut store, &session, &target, &Change::Publish(rows)).unwrap();
        let before = stored_rows(&store);
        let mut row = reply("r5", 5);
        row.block.data = serde_json::json!({ "text": "more text" });
        let changes = store.connection().total_changes();
        write(&mut store, &session, &target, &Change::Publish(vec![row])).unwrap();
        assert_eq!(
            store.connection().total_changes() - changes,
            3,
            "one row, the header and the counter, with {n} rows"
        );
        let after = stored_rows(&store);
        let changed: Vec<&String> = after
            .iter()
            .filter(|(k, v)| before.get(*k) != Some(v))
            .map(|(k, _)| k)
            .collect();
        assert_eq!(changed, ["r5"]);
        assert_eq!(after.len(), before.len());
        // A retraction deletes exactly its rows.
        let changes = store.connection().total_changes();
        write(
            &mut store,
            &session,
            &target,
            &Change::Retract(vec![
                BlockKey::parse(BlockType::AgentReply, "r1").unwrap(),
                BlockKey::parse(BlockType::AgentReply, "r2").unwrap(),
            ]),
        )
        .unwrap();
        assert_eq!(store.connection().total_changes() - changes, 4);
        assert_eq!(stored_rows(&store).len() as u64, n - 2);
    }
}

// OV-02: a connection that holds a target's rows in memory never writes over another
// connection's write: the other write took a new revision, so the rows are read again.
#[test]
fn cached_rows_never_hide_another_connections_write() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("two.sqlite");
    let mut a = SqliteStore::open(&path, settings()).unwrap();
    let mut b = SqliteStore::open(&path, settings()).unwrap();
    let (session, target) = (s("s1"), t("s1"));
    let publish = |store: &mut SqliteStore, id: &str| {
        write(
            store,
            &session,
            &target,
            &Change::Publish(vec![reply(id, 1)]),
        )
        .unwrap()
    };
    publish(&mut a, "from-a-1");
    publish(&mut b, "from-b-1");
    let ids = |r: &WriteResult| -> Vec<String> {
        r.stored()
            .unwrap()
            .blocks
            .iter()
            .map(|b| b.block.id.as_str().to_owned())
            .collect()
    };
    assert_eq!(
        ids(&publish(&mut a, "from-a-2")),
        ["from-a-1", "from-a-2", "from-b-1"]
    );
    // A delete and a new overlay on the other connection.
    assert!(b.delete(&session, &target).unwrap());
    assert_eq!(a.load(&session, &target).unwrap(), None);
    publish(&mut a, "from-a-3");
    b.compare_and_set(
        &session,
        &target,
        Some(a.current_revision().unwrap()),
        4,
        vec![reply("from-b-2", 1)],
    )
    .unwrap();
    let last = publish(&mut a, "from-a-4");
    assert_eq!(ids(&last), ["from-a-4", "from-b-2"]);
    assert_eq!(last.snapshot().unwrap().settlement_epoch, 4);
    assert_eq!(
        a.load(&session, &target).unwrap(),
        b.load(&session, &target).unwrap()
    );
}

// ST-02, OV-01: a whole snapshot in `snapshot_json` that reads back (only a hand edit
// makes one: the upgrade moves every such snapshot into rows) is the target's overlay;
// the next write stores it as rows and clears it.
#[test]
fn a_whole_snapshot_left_in_the_header_is_read_and_rewritten_as_rows() {
    let mut store = SqliteStore::open_in_memory(settings()).unwrap();
    let (session, target) = (s("s1"), t("s1"));
    write(
        &mut store,
        &session,
        &target,
        &Change::Publish(vec![reply("old", 1)]),
    )
    .unwrap();
    let whole = serde_json::to_string(&vec![reply("a", 2), reply("b", 3)]).unwrap();
    store
        .connection()
        .execute(
            "UPDATE chat_live_timeline_overlays SET snapshot_json = ?1",
            [&whole],
        )
        .unwrap();
    let loaded = store.load(&session, &target).unwrap().unwrap();
    assert_eq!(loaded.blocks, [reply("a", 2), reply("b", 3)]);
    write(
        &mut store,
        &session,
        &target,
        &Change::Publish(vec![reply("c", 4)]),
    )
    .unwrap();
    let ids: Vec<String> = stored_rows(&store).into_keys().collect();
    assert_eq!(ids, ["a", "b", "c"]);
    let left: Option<String> = store
        .connection()
        .query_row(
            "SELECT snapshot_json FROM chat_live_timeline_overlays",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(left, None);
    let now = store.load(&session, &target).unwrap().unwrap();
    assert_eq!(now.blocks, [reply("a", 2), reply("b", 3), reply("c", 4)]);
}

/// Two connections to one file, taking calls in turn.
struct TwoConnections {
    stores: [SqliteStore; 2],
    turn: usize,
}

impl TwoConnections {
    fn next(&mut self) -> &mut SqliteStore {
        self.turn += 1;
        &mut self.stores[self.turn % 2]
    }
}

impl OverlayStore for TwoConnections {
    fn load(&mut self, s: &SessionId, t: &TargetId) -> Result<Option<StoredOverlay>, OverlayError> {
        self.next().load(s, t)
    }
    fn compare_and_set(
        &mut self,
        s: &SessionId,
        t: &TargetId,
        expected: Option<u64>,
        epoch: u64,
        blocks: Vec<StoredBlock>,
    ) -> Result<StoredOverlay, OverlayError> {
        self.next().compare_and_set(s, t, expected, epoch, blocks)
    }
    fn update(
        &mut self,
        s: &SessionId,
        t: &TargetId,
        change: &Change,
    ) -> Result<Update, OverlayError> {
        self.next().update(s, t, change)
    }
    fn delete(&mut self, s: &SessionId, t: &TargetId) -> Result<bool, OverlayError> {
        self.next().delete(s, t)
    }
    fn targets(&mut self, s: &SessionId) -> Result<Vec<TargetId>, OverlayError> {
        self.next().targets(s)
    }
    fn current_revision(&mut self) -> Result<u64, OverlayError> {
        self.next().current_revision()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fixtures::proptest_cases().min(48)))]

    // OV-01 to OV-04: two connections writing one file in turn (each with its cached
    // rows) show exactly the naive overlay after every step.
    #[test]
    fn two_connections_in_turn_equal_the_naive_overlay(ops in naive_overlay::ops(), first in 0usize..2) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("naive.sqlite");
        let mut store = TwoConnections {
            stores: [SqliteStore::open(&path, settings()).unwrap(), SqliteStore::open(&path, settings()).unwrap()],
            turn: first,
        };
        let mut reference = Reference::new(0);
        for (i, op) in ops.iter().enumerate() {
            if let Op::Reopen = op {
                store.stores[i % 2] = SqliteStore::open(&path, settings()).unwrap();
            }
            naive_overlay::check(&mut store, &mut reference, &s("s1"), op)
                .map_err(|e| TestCaseError::fail(format!("step {i}: {e}")))?;
        }
    }
}
