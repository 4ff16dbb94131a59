//! Overlay store and settlement rules (OV-01 to OV-04).
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashSet;

use common::*;
use overlay_core::overlay::{apply, Change, LiveSequencer};
use overlay_core::store::memory::MemoryOverlayStore;
use overlay_core::store::{write, WriteResult};
use overlay_core::store::{OverlayError, OverlayRows, OverlayStore, RowClass, FORMAT_VERSION};
use proptest::prelude::*;
use timeline_core::key::TargetId;
use timeline_core::order::SourceOrder;

fn publish(
    store: &mut MemoryOverlayStore,
    rows: Vec<overlay_core::store::StoredBlock>,
) -> WriteResult {
    write(store, &session(), &main_target(), &Change::Publish(rows)).unwrap()
}

// OV-01
#[test]
fn the_stored_form_is_version_2_and_clients_get_only_three_fields() {
    let mut store = MemoryOverlayStore::new();
    let stored = publish(&mut store, vec![live("a", 1, "run-1")])
        .stored()
        .cloned()
        .unwrap();
    assert_eq!(stored.format_version, FORMAT_VERSION);
    let json = serde_json::to_value(&stored).unwrap();
    assert_eq!(json["formatVersion"], 2);
    assert_eq!(json["blocks"][0]["class"], "ordinary");
    let client = serde_json::to_value(stored.client_form()).unwrap();
    let keys: HashSet<&str> = client
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        HashSet::from(["settlementEpoch", "revision", "blocks"])
    );
    assert!(
        client["blocks"][0].get("class").is_none(),
        "settlement metadata stays on the host"
    );
}

// OV-02
#[test]
fn a_stale_writer_retries_against_current_state_and_never_overwrites() {
    let mut store = MemoryOverlayStore::new();
    let first = publish(&mut store, vec![live("a", 1, "run-1")])
        .stored()
        .cloned()
        .unwrap();
    // Writer B read revision `first` and then A wrote again.
    publish(&mut store, vec![live("b", 2, "run-1")]);
    let err = store
        .compare_and_set(&session(), &main_target(), Some(first.revision), 0, vec![])
        .unwrap_err();
    let OverlayError::Stale { current } = err else {
        panic!()
    };
    assert_eq!(
        current.unwrap().blocks.len(),
        2,
        "the stale writer sees current state"
    );
    // The write loop re-applies the change to the current state: both rows stay.
    publish(&mut store, vec![live("c", 3, "run-1")]);
    let now = store.load(&session(), &main_target()).unwrap().unwrap();
    let ids: Vec<_> = now
        .blocks
        .iter()
        .map(|b| b.block.id.as_str().to_owned())
        .collect();
    assert_eq!(ids, ["a", "b", "c"]);
}

// OV-02
#[test]
fn revisions_come_from_one_counter_and_a_deleted_target_never_reuses_one() {
    let mut store = MemoryOverlayStore::new();
    let other = TargetId::new("thread-9").unwrap();
    let r1 = publish(&mut store, vec![live("a", 1, "run-1")])
        .stored()
        .unwrap()
        .revision;
    let r2 = write(
        &mut store,
        &session(),
        &other,
        &Change::Publish(vec![live("x", 1, "run-1")]),
    )
    .unwrap()
    .stored()
    .unwrap()
    .revision;
    assert!(r2 > r1);
    assert!(store.delete(&session(), &other).unwrap());
    let r3 = write(
        &mut store,
        &session(),
        &other,
        &Change::Publish(vec![live("y", 1, "run-1")]),
    )
    .unwrap()
    .stored()
    .unwrap()
    .revision;
    assert!(r3 > r2, "a recreated target gets a fresh revision");
    assert_eq!(store.current_revision().unwrap(), r3);
}

// OV-02, TL-13: the counter stops at 2^53 - 1, at the limit and one past it.
#[test]
fn the_revision_counter_stops_at_the_exact_integer_limit() {
    let mut store = MemoryOverlayStore::with_revision(9_007_199_254_740_990);
    let at_limit = publish(&mut store, vec![live("a", 1, "run-1")]);
    assert_eq!(at_limit.stored().unwrap().revision, 9_007_199_254_740_991);
    let past = write(
        &mut store,
        &session(),
        &main_target(),
        &Change::Publish(vec![live("b", 2, "run-1")]),
    );
    assert_eq!(past, Err(OverlayError::RevisionExhausted));
    // Nothing was half-written.
    assert_eq!(
        store
            .load(&session(), &main_target())
            .unwrap()
            .unwrap()
            .blocks
            .len(),
        1
    );
}

// OV-02
#[test]
fn an_emptied_overlay_is_stored_and_keeps_its_epoch_and_revision() {
    let mut store = MemoryOverlayStore::new();
    publish(&mut store, vec![live("a", 1, "run-1")]);
    let settled = write(
        &mut store,
        &session(),
        &main_target(),
        &Change::Settle(HashSet::from([reply("a")])),
    )
    .unwrap();
    let WriteResult::Written {
        stored,
        epoch_raised,
        ..
    } = settled
    else {
        panic!()
    };
    assert!(epoch_raised);
    assert!(stored.rows().is_empty());
    let loaded = store.load(&session(), &main_target()).unwrap().unwrap();
    assert_eq!(
        (loaded.settlement_epoch, loaded.revision),
        (1, stored.revision)
    );
}

// OV-04
#[test]
fn the_epoch_rises_only_when_history_settles_an_ordinary_row() {
    let mut store = MemoryOverlayStore::new();
    publish(
        &mut store,
        vec![
            live("a", 1, "run-1"),
            live("b", 2, "run-1"),
            ephemeral("thinking-run-1", RowClass::Status, "run-1"),
            ephemeral("approval:x", RowClass::ApprovalCard, "run-1"),
        ],
    );
    let epoch = |s: &mut MemoryOverlayStore| {
        s.load(&session(), &main_target())
            .unwrap()
            .unwrap()
            .settlement_epoch
    };
    // A retraction never raises it.
    write(
        &mut store,
        &session(),
        &main_target(),
        &Change::Retract(vec![reply("b")]),
    )
    .unwrap();
    assert_eq!(epoch(&mut store), 0);
    // Ephemeral removals never raise it.
    write(
        &mut store,
        &session(),
        &main_target(),
        &Change::RunCleanup(run("run-1")),
    )
    .unwrap();
    assert_eq!(epoch(&mut store), 0);
    // A latest window whose page holds no live key: no rise.
    let lw = |keys: Vec<_>| Change::LatestWindow {
        history_keys: keys.into_iter().collect(),
        current_run: Some(run("run-1")),
    };
    write(
        &mut store,
        &session(),
        &main_target(),
        &lw(vec![reply("zzz")]),
    )
    .unwrap();
    assert_eq!(epoch(&mut store), 0);
    // The page holds A: A leaves and the epoch rises in that same write.
    let r = write(
        &mut store,
        &session(),
        &main_target(),
        &lw(vec![reply("a")]),
    )
    .unwrap();
    assert!(matches!(
        r,
        WriteResult::Written {
            epoch_raised: true,
            ..
        }
    ));
    assert_eq!(epoch(&mut store), 1);
}

// OV-03
#[test]
fn row_classes_leave_by_their_rules() {
    let mut store = MemoryOverlayStore::new();
    publish(
        &mut store,
        vec![
            ephemeral("thinking-run-1", RowClass::Status, "run-1"),
            ephemeral("compacting-run-1", RowClass::CompactingMarker, "run-1"),
            ephemeral("mirror-run-1", RowClass::ProgressMirror, "run-1"),
            ephemeral("approval:1", RowClass::ApprovalCard, "run-1"),
        ],
    );
    let ids = |s: &mut MemoryOverlayStore| -> Vec<String> {
        s.load(&session(), &main_target())
            .unwrap()
            .unwrap()
            .blocks
            .iter()
            .map(|b| b.block.id.as_str().to_owned())
            .collect()
    };
    // A newer status row replaces the old one; a mirror from another run replaces it.
    publish(
        &mut store,
        vec![
            ephemeral("thinking-run-2", RowClass::Status, "run-2"),
            ephemeral("mirror-run-2", RowClass::ProgressMirror, "run-2"),
        ],
    );
    let now = ids(&mut store);
    assert!(!now.contains(&"thinking-run-1".to_owned()));
    assert!(!now.contains(&"mirror-run-1".to_owned()));
    assert!(now.contains(&"compacting-run-1".to_owned()));
    // A latest window while run-2 is current drops run-1's marker, keeps run-2's rows and
    // every approval card.
    write(
        &mut store,
        &session(),
        &main_target(),
        &Change::LatestWindow {
            history_keys: HashSet::new(),
            current_run: Some(run("run-2")),
        },
    )
    .unwrap();
    let mut now = ids(&mut store);
    now.sort();
    assert_eq!(now, ["approval:1", "mirror-run-2", "thinking-run-2"]);
    // The Codex post-run cleanup of run-1 removes its approval card; a Claude run has no
    // cleanup, so without it the card stays.
    write(
        &mut store,
        &session(),
        &main_target(),
        &Change::RunCleanup(run("run-1")),
    )
    .unwrap();
    let mut now = ids(&mut store);
    now.sort();
    assert_eq!(now, ["mirror-run-2", "thinking-run-2"]);
}

// TL-05
#[test]
fn a_live_row_gets_its_sequence_once_per_run() {
    let mut seq = LiveSequencer::new();
    let a = seq.source_order(&run("run-1"), &reply("a"));
    let b = seq.source_order(&run("run-1"), &reply("b"));
    assert_eq!(seq.source_order(&run("run-1"), &reply("a")), a);
    assert_eq!(a, SourceOrder::live(1));
    assert_eq!(b, SourceOrder::live(2));
    seq.end_run(&run("run-1"));
    assert_eq!(
        seq.source_order(&run("run-2"), &reply("a")),
        SourceOrder::live(3)
    );
}

fn change() -> impl Strategy<Value = Change> {
    let id = || (0u8..6).prop_map(|n| format!("r{n}"));
    let class = prop::sample::select(vec![
        RowClass::Ordinary,
        RowClass::Ordinary,
        RowClass::Status,
        RowClass::CompactingMarker,
        RowClass::ProgressMirror,
        RowClass::ApprovalCard,
    ]);
    let runs = prop::sample::select(vec!["run-1", "run-2"]);
    prop_oneof![
        prop::collection::vec((id(), class, runs.clone(), 0u64..5), 1..4).prop_map(|rows| {
            Change::Publish(
                rows.into_iter()
                    .map(|(id, class, r, t)| {
                        let mut b = live(&id, t, r);
                        b.class = class;
                        b
                    })
                    .collect(),
            )
        }),
        prop::collection::vec(id(), 1..3)
            .prop_map(|ids| Change::Retract(ids.iter().map(|i| reply(i)).collect())),
        (
            prop::collection::vec(id(), 0..4),
            prop::option::of(runs.clone())
        )
            .prop_map(|(ids, r)| Change::LatestWindow {
                history_keys: ids.iter().map(|i| reply(i)).collect(),
                current_run: r.map(run),
            }),
        prop::collection::vec(id(), 0..4)
            .prop_map(|ids| Change::Settle(ids.iter().map(|i| reply(i)).collect())),
        runs.prop_map(|r| Change::RunCleanup(run(r))),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fixtures::proptest_cases()))]

    // OV-02, OV-04: over any sequence of changes and stale interleavings, revisions only
    // grow, the epoch rises exactly in writes that settled an ordinary row, and a write
    // never loses a row that another writer stored meanwhile.
    #[test]
    fn writes_keep_the_epoch_rule_and_unique_revisions(changes in prop::collection::vec(change(), 1..30)) {
        let mut store = MemoryOverlayStore::new();
        let mut last_revision = 0;
        for c in changes {
            let before = store.load(&session(), &main_target()).unwrap();
            let rows = before.as_ref().map_or_else(OverlayRows::new, |b| OverlayRows::from_blocks(b.blocks.clone()).unwrap());
            let expected = apply(&rows, &c).map(|n| n.rows.to_blocks());
            let result = write(&mut store, &session(), &main_target(), &c).unwrap();
            match (&result, expected) {
                (WriteResult::Written { stored, epoch_raised, .. }, Some(next)) => {
                    prop_assert!(stored.revision > last_revision);
                    last_revision = stored.revision;
                    let next = overlay_core::store::StoredOverlay { format_version: FORMAT_VERSION, settlement_epoch: 0, revision: 0, blocks: next };
                    prop_assert_eq!(&stored.stored().blocks, &next.blocks);
                    let old_epoch = before.as_ref().map_or(0, |b| b.settlement_epoch);
                    let settled_ordinary = before.as_ref().is_some_and(|b| b.blocks.iter().any(|row| {
                        row.class == RowClass::Ordinary
                            && !next.blocks.iter().any(|n| n.block.key() == row.block.key())
                            && match &c {
                                Change::LatestWindow { history_keys, .. } => history_keys.contains(&row.block.key()),
                                Change::Settle(keys) => keys.contains(&row.block.key()),
                                _ => false,
                            }
                    }));
                    prop_assert_eq!(*epoch_raised, settled_ordinary);
                    prop_assert_eq!(stored.settlement_epoch, old_epoch + u64::from(settled_ordinary));
                }
                (WriteResult::Unchanged(_), None) => {}
                (r, e) => prop_assert!(false, "{:?} vs {:?}", r, e),
            }
            // At most one status row and mirrors of one run.
            let now = store.load(&session(), &main_target()).unwrap();
            if let Some(now) = now {
                prop_assert!(now.blocks.iter().filter(|b| b.class == RowClass::Status).count() <= 1);
                let mirror_runs: HashSet<_> = now.blocks.iter().filter(|b| b.class == RowClass::ProgressMirror).map(|b| b.run_id.clone()).collect();
                prop_assert!(mirror_runs.len() <= 1);
                let keys: HashSet<_> = now.blocks.iter().map(|b| b.block.key()).collect();
                prop_assert_eq!(keys.len(), now.blocks.len());
            }
        }
    }
}

/// A store on which another writer stores a row between a writer's read and its
/// compare-and-set, `races` times.
struct Racing {
    inner: MemoryOverlayStore,
    races: usize,
}

impl OverlayStore for Racing {
    fn load(
        &mut self,
        s: &timeline_core::key::SessionId,
        t: &TargetId,
    ) -> Result<Option<overlay_core::store::StoredOverlay>, OverlayError> {
        self.inner.load(s, t)
    }
    fn compare_and_set(
        &mut self,
        s: &timeline_core::key::SessionId,
        t: &TargetId,
        expected: Option<u64>,
        epoch: u64,
        blocks: Vec<overlay_core::store::StoredBlock>,
    ) -> Result<overlay_core::store::StoredOverlay, OverlayError> {
        if self.races > 0 {
            self.races -= 1;
            let id = format!("other-{}", self.races);
            write(
                &mut self.inner,
                s,
                t,
                &Change::Publish(vec![live(&id, 9, "run-1")]),
            )
            .unwrap();
        }
        self.inner.compare_and_set(s, t, expected, epoch, blocks)
    }
    fn delete(
        &mut self,
        s: &timeline_core::key::SessionId,
        t: &TargetId,
    ) -> Result<bool, OverlayError> {
        self.inner.delete(s, t)
    }
    fn targets(
        &mut self,
        s: &timeline_core::key::SessionId,
    ) -> Result<Vec<TargetId>, OverlayError> {
        self.inner.targets(s)
    }
    fn current_revision(&mut self) -> Result<u64, OverlayError> {
        self.inner.current_revision()
    }
}

// OV-02
#[test]
fn the_write_loop_reapplies_its_change_after_losing_a_race() {
    let mut store = Racing {
        inner: MemoryOverlayStore::new(),
        races: 3,
    };
    let result = write(
        &mut store,
        &session(),
        &main_target(),
        &Change::Publish(vec![live("mine", 1, "run-1")]),
    )
    .unwrap();
    let stored = result.stored().unwrap();
    let mut ids: Vec<_> = stored
        .blocks
        .iter()
        .map(|b| b.block.id.as_str().to_owned())
        .collect();
    ids.sort();
    assert_eq!(
        ids,
        ["mine", "other-0", "other-1", "other-2"],
        "nothing the racing writer stored is lost"
    );
    assert_eq!(stored.revision, 4, "three racing writes, then ours");
    // A writer that loses every race gives up with a typed error instead of looping.
    let mut store = Racing {
        inner: MemoryOverlayStore::new(),
        races: usize::MAX,
    };
    let err = write(
        &mut store,
        &session(),
        &main_target(),
        &Change::Publish(vec![live("mine", 1, "run-1")]),
    );
    assert!(matches!(err, Err(OverlayError::Unavailable(_))));
}

/// Publishes `a`, `b`, `c`, settles `a` and `b` (epoch 2), deletes the target and writes
/// it again; returns the epochs and revisions before and after.
fn delete_and_write_again<S: OverlayStore>(store: &mut S) -> ((u64, u64), (u64, u64)) {
    let (s, t) = (session(), main_target());
    let rows = ["a", "b", "c"]
        .iter()
        .enumerate()
        .map(|(i, id)| live(id, i as u64, "run-1"))
        .collect();
    write(store, &s, &t, &Change::Publish(rows)).unwrap();
    let mut old = None;
    for id in ["a", "b"] {
        let w = write(store, &s, &t, &Change::Settle([reply(id)].into())).unwrap();
        old = w.stored().map(|o| (o.settlement_epoch, o.revision));
    }
    assert!(store.delete(&s, &t).unwrap());
    assert_eq!(store.load(&s, &t).unwrap(), None);
    let again = write(store, &s, &t, &Change::Publish(vec![live("d", 9, "run-2")])).unwrap();
    let WriteResult::Written {
        epoch_raised,
        base_revision,
        ..
    } = &again
    else {
        panic!("{again:?}")
    };
    assert!(!epoch_raised, "nothing was settled by this write");
    assert_eq!(*base_revision, None, "a new row");
    let new = again
        .stored()
        .map(|o| (o.settlement_epoch, o.revision))
        .unwrap();
    (old.unwrap(), new)
}

// OV-02, OV-04, TL-06: a target written again after a delete does not start over at
// epoch 0 (a client holding the old target's epoch would ignore it as stale): it starts
// one above the epoch it was deleted at, through the memory store's own update and
// through the trait's default compare-and-set loop.
#[test]
fn a_target_written_again_after_a_delete_starts_one_epoch_higher() {
    let mut memory = MemoryOverlayStore::new();
    let mut default_loop = Racing {
        inner: MemoryOverlayStore::new(),
        races: 0,
    };
    for ((old_epoch, old_revision), (epoch, revision)) in [
        delete_and_write_again(&mut memory),
        delete_and_write_again(&mut default_loop),
    ] {
        assert_eq!(old_epoch, 2);
        assert_eq!(epoch, 3);
        assert!(revision > old_revision);
    }
    // The epoch goes on from there; a target never deleted starts at 0.
    let next = publish(&mut memory, vec![live("e", 10, "run-2")]);
    assert_eq!(next.stored().unwrap().settlement_epoch, 3);
    let other = TargetId::new("thread-9").unwrap();
    let fresh = write(
        &mut memory,
        &session(),
        &other,
        &Change::Publish(vec![live("a", 1, "run-1")]),
    )
    .unwrap();
    assert_eq!(fresh.stored().unwrap().settlement_epoch, 0);
}

// OV-10: history lost rows (a replace latest rolled back the latest turn, or a fresh
// thread): the ordinary rows of every run but the current one leave, rows without a
// run and ephemeral rows stay, and the epoch rises in that write, also when no row
// left and on a target that had no overlay, so every client holding an older window
// reloads.
#[test]
fn a_history_rewrite_takes_out_other_runs_rows_and_raises_the_epoch() {
    let mut store = MemoryOverlayStore::new();
    let mut without_run = live("free", 1, "run-1");
    without_run.run_id = None;
    publish(
        &mut store,
        vec![
            live("old", 1, "run-1"),
            live("new", 2, "run-2"),
            without_run,
            ephemeral("status", RowClass::Status, "run-1"),
        ],
    );
    let before = store.load(&session(), &main_target()).unwrap().unwrap();
    let change = Change::HistoryRewritten {
        current_run: Some(run("run-2")),
    };
    let WriteResult::Written {
        stored,
        epoch_raised,
        changes,
        ..
    } = write(&mut store, &session(), &main_target(), &change).unwrap()
    else {
        panic!("written")
    };
    assert!(epoch_raised);
    assert_eq!(changes.removals, vec![reply("old")]);
    let after = stored.stored();
    assert_eq!(after.settlement_epoch, before.settlement_epoch + 1);
    let ids: Vec<&str> = after.blocks.iter().map(|b| b.block.id.as_str()).collect();
    assert!(!ids.contains(&"old") && ids.contains(&"new") && ids.contains(&"free"));
    assert_eq!(after.blocks.len(), 3, "the status row stays: {ids:?}");
    // Nothing left to take out: the epoch rises all the same.
    let again = write(&mut store, &session(), &main_target(), &change).unwrap();
    let again = again.stored().unwrap();
    assert_eq!(again.settlement_epoch, before.settlement_epoch + 2);
    assert_eq!(again.blocks.len(), 3);
    // A target with no overlay gets one, one epoch up, so its clients hear of it.
    let child = TargetId::new("child-thread").unwrap();
    let first = write(&mut store, &session(), &child, &change).unwrap();
    assert_eq!(first.stored().unwrap().settlement_epoch, 1);
    assert!(first.stored().unwrap().blocks.is_empty());
}
