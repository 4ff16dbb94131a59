//! The indexed overlay pinned to the naive one (OV-01 to OV-04): for any sequence of
//! writes, compare-and-sets and deletes, the memory store (whose writes build the next
//! version of `OverlayRows` in O(k log n)) and the default compare-and-set loop of
//! `OverlayStore::update` show exactly what `fixtures::naive_overlay` (the
//! whole overlay cloned, filtered per row, sorted and compared on every write) shows:
//! the same rows in the same order, the same revisions, epochs and refusals; every
//! write's `Changes` is the difference of its two versions; the key and class indexes
//! agree with the rows.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use fixtures::naive_overlay::{self, Op, Reference};
use overlay_core::overlay::Change;
use overlay_core::store::memory::MemoryOverlayStore;
use overlay_core::store::{write, WriteResult};
use overlay_core::store::{OverlayError, OverlayStore, RowClass, StoredBlock, StoredOverlay};
use proptest::prelude::*;
use timeline_core::key::{SessionId, TargetId};

/// A store that keeps only the required methods, so `update` is the trait's default
/// compare-and-set loop over `load` and `compare_and_set`.
#[derive(Default)]
struct DefaultLoop(MemoryOverlayStore);

impl OverlayStore for DefaultLoop {
    fn load(&mut self, s: &SessionId, t: &TargetId) -> Result<Option<StoredOverlay>, OverlayError> {
        self.0.load(s, t)
    }
    fn compare_and_set(
        &mut self,
        s: &SessionId,
        t: &TargetId,
        expected: Option<u64>,
        epoch: u64,
        blocks: Vec<StoredBlock>,
    ) -> Result<StoredOverlay, OverlayError> {
        self.0.compare_and_set(s, t, expected, epoch, blocks)
    }
    fn delete(&mut self, s: &SessionId, t: &TargetId) -> Result<bool, OverlayError> {
        self.0.delete(s, t)
    }
    fn targets(&mut self, s: &SessionId) -> Result<Vec<TargetId>, OverlayError> {
        self.0.targets(s)
    }
    fn current_revision(&mut self) -> Result<u64, OverlayError> {
        self.0.current_revision()
    }
}

fn run_ops<S: OverlayStore>(store: &mut S, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut reference = Reference::new(0);
    for (i, op) in ops.iter().enumerate() {
        naive_overlay::check(store, &mut reference, &session(), op)
            .map_err(|e| TestCaseError::fail(format!("step {i}: {e}")))?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fixtures::proptest_cases()))]

    // OV-01, OV-02, OV-03, OV-04: the memory store's indexed writes equal the naive
    // overlay after every step.
    #[test]
    fn the_indexed_overlay_equals_the_naive_one(ops in naive_overlay::ops()) {
        run_ops(&mut MemoryOverlayStore::new(), &ops)?;
    }

    // OV-02: the default compare-and-set loop of `OverlayStore::update` equals it too.
    #[test]
    fn the_default_write_loop_equals_the_naive_one(ops in naive_overlay::ops()) {
        run_ops(&mut DefaultLoop::default(), &ops)?;
    }

    // The size a latest window counts for the 8 MiB cap: in every version a write
    // leaves (versions share rows, and each row keeps its size once counted), the rows'
    // wire blocks take exactly `client_blocks_json_len` bytes as array members, asked
    // once or again.
    #[test]
    fn the_counted_json_size_of_the_rows_is_their_serialized_size(ops in naive_overlay::ops()) {
        let mut store = MemoryOverlayStore::new();
        let mut versions = Vec::new();
        for op in &ops {
            if let Op::Write(n, change) = op {
                let target = TargetId::new(format!("target-{n}")).unwrap();
                if let Ok(result) = write(&mut store, &session(), &target, change) {
                    if let Some(snapshot) = result.snapshot() {
                        // Count some versions before later writes share their rows.
                        if versions.len() % 2 == 0 {
                            snapshot.rows().client_blocks_json_len();
                        }
                        versions.push(snapshot.clone());
                    }
                }
            }
        }
        for version in &versions {
            let rows = version.rows();
            let serialized = serde_json::to_vec(&rows.client_blocks()).unwrap().len();
            prop_assert_eq!(rows.client_blocks_json_len() + 2, serialized);
            prop_assert_eq!(rows.client_blocks_json_len() + 2, serialized);
        }
    }
}

// OV-02: a snapshot a caller holds is a version: later writes never change it, and the
// store's next write does not need it gone.
#[test]
fn a_held_snapshot_never_changes() {
    let mut store = MemoryOverlayStore::new();
    let rows: Vec<StoredBlock> = (0..200)
        .map(|i| live(&format!("r{i}"), i, "run-1"))
        .collect();
    let first = write(
        &mut store,
        &session(),
        &main_target(),
        &Change::Publish(rows.clone()),
    )
    .unwrap();
    let held = first.snapshot().unwrap().clone();
    let whole = held.to_stored();
    for i in 0..50 {
        let mut row = live(&format!("r{i}"), i, "run-1");
        row.block.data = serde_json::json!({ "text": "changed" });
        write(
            &mut store,
            &session(),
            &main_target(),
            &Change::Publish(vec![row]),
        )
        .unwrap();
    }
    assert_eq!(held.to_stored(), whole);
    assert_eq!(held.stored().blocks, rows);
    let now = store.load(&session(), &main_target()).unwrap().unwrap();
    assert_eq!(now.revision, held.revision + 50);
    assert_eq!(now.blocks[0].block.data["text"], "changed");
}

// OV-02, OV-03: a streaming update of one row changes one row; a status row replaces
// the old one; a settled row leaves; each write says so and nothing more.
#[test]
fn a_write_reports_exactly_the_rows_it_changed() {
    let mut store = MemoryOverlayStore::new();
    let rows: Vec<StoredBlock> = (0..100)
        .map(|i| live(&format!("r{i}"), i, "run-1"))
        .chain([ephemeral("thinking-1", RowClass::Status, "run-1")])
        .collect();
    write(
        &mut store,
        &session(),
        &main_target(),
        &Change::Publish(rows),
    )
    .unwrap();
    let mut row = live("r40", 40, "run-1");
    row.block.data = serde_json::json!({ "text": "more" });
    let WriteResult::Written {
        changes,
        base_revision,
        ..
    } = write(
        &mut store,
        &session(),
        &main_target(),
        &Change::Publish(vec![row.clone()]),
    )
    .unwrap()
    else {
        panic!("written")
    };
    assert_eq!(changes.upserts, [row]);
    assert!(changes.removals.is_empty() && !changes.raises_epoch);
    assert_eq!(base_revision, Some(1));
    let status = ephemeral("thinking-2", RowClass::Status, "run-2");
    let WriteResult::Written { changes, .. } = write(
        &mut store,
        &session(),
        &main_target(),
        &Change::Publish(vec![status.clone()]),
    )
    .unwrap() else {
        panic!("written")
    };
    assert_eq!(changes.upserts, [status]);
    assert_eq!(
        changes.removals,
        [timeline_core::key::BlockKey::parse(
            timeline_core::key::BlockType::Thinking,
            "thinking-1"
        )
        .unwrap()]
    );
    let WriteResult::Written {
        changes,
        epoch_raised,
        ..
    } = write(
        &mut store,
        &session(),
        &main_target(),
        &Change::Settle([reply("r3"), reply("absent")].into_iter().collect()),
    )
    .unwrap()
    else {
        panic!("written")
    };
    assert!(epoch_raised && changes.raises_epoch);
    assert_eq!(
        (changes.upserts.len(), changes.removals),
        (0, vec![reply("r3")])
    );
}
