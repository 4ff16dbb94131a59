//! The Codex exact scan (OV-06), driven by a simulated clock.
#![allow(clippy::unwrap_used)]

mod common;

use fixtures::failing::FailingOverlay;
use std::collections::HashSet;

use common::*;
use overlay_core::overlay::Change;
use overlay_core::scan::{run_keys, settle_run, ExactScans, ScanEffect, ScanReport};
use overlay_core::store::memory::MemoryOverlayStore;
use overlay_core::store::write;
use overlay_core::store::{CleanupJournal, OverlayStore, RowClass};
use timeline_core::key::TargetId;
use timeline_core::time::Millis;

fn effects(s: &mut ExactScans) -> Vec<ScanEffect> {
    std::iter::from_fn(|| s.poll_effect()).collect()
}

fn scan(attempt: u32) -> ScanEffect {
    ScanEffect::Scan {
        session: session(),
        run: run("run-1"),
        attempt,
    }
}

// OV-06
#[test]
fn the_journal_row_comes_first_then_scans_at_0_100_and_250_ms() {
    let (s, r) = (session(), run("run-1"));
    let mut scans = ExactScans::new();
    scans.run_ended(s.clone(), r.clone(), Millis(1_000));
    assert_eq!(
        effects(&mut scans),
        [ScanEffect::WriteJournal {
            session: s.clone(),
            run: r.clone()
        }]
    );
    assert_eq!(
        effects(&mut scans),
        [],
        "no scan before the journal row is written"
    );
    scans.journal_written(&s, &r);
    assert_eq!(effects(&mut scans), [scan(1)]);
    scans.handle_scan_result(&s, &r, Ok(ScanReport { all_settled: false }), Millis(1_010));
    assert_eq!(scans.poll_timeout(), Some(Millis(1_100)));
    scans.handle_timeout(Millis(1_099));
    assert_eq!(effects(&mut scans), []);
    scans.handle_timeout(Millis(1_100));
    scans.handle_timeout(Millis(1_100));
    assert_eq!(effects(&mut scans), [scan(2)]);
    scans.handle_scan_result(&s, &r, Err(()), Millis(1_120));
    assert_eq!(scans.poll_timeout(), Some(Millis(1_250)));
    scans.handle_timeout(Millis(1_250));
    assert_eq!(effects(&mut scans), [scan(3)]);
    scans.handle_scan_result(&s, &r, Ok(ScanReport { all_settled: false }), Millis(1_300));
    assert_eq!(
        effects(&mut scans),
        [ScanEffect::GaveUp {
            session: s.clone(),
            run: r.clone()
        }]
    );
    assert_eq!(scans.poll_timeout(), None);
    assert!(!scans.is_active(&s, &r));
}

// OV-06
#[test]
fn a_settled_scan_removes_the_journal_row() {
    let (s, r) = (session(), run("run-1"));
    let mut scans = ExactScans::new();
    scans.run_ended(s.clone(), r.clone(), Millis(0));
    scans.journal_written(&s, &r);
    let _ = effects(&mut scans);
    scans.handle_scan_result(&s, &r, Ok(ScanReport { all_settled: false }), Millis(5));
    scans.handle_timeout(Millis(100));
    assert_eq!(effects(&mut scans), [scan(2)]);
    scans.handle_scan_result(&s, &r, Ok(ScanReport { all_settled: true }), Millis(105));
    assert_eq!(
        effects(&mut scans),
        [ScanEffect::RemoveJournal { session: s, run: r }]
    );
}

// OV-06: the whole cleanup has 2 minutes.
#[test]
fn a_scan_that_outlives_the_two_minute_budget_gives_up_and_keeps_the_row() {
    let (s, r) = (session(), run("run-1"));
    let mut scans = ExactScans::new();
    scans.run_ended(s.clone(), r.clone(), Millis(0));
    scans.journal_written(&s, &r);
    let _ = effects(&mut scans);
    assert_eq!(scans.poll_timeout(), Some(Millis(120_000)));
    scans.handle_timeout(Millis(119_999));
    assert_eq!(effects(&mut scans), []);
    scans.handle_timeout(Millis(120_000));
    assert_eq!(
        effects(&mut scans),
        [ScanEffect::GaveUp {
            session: s.clone(),
            run: r.clone()
        }]
    );
    // A result that arrives after giving up changes nothing.
    scans.handle_scan_result(
        &s,
        &r,
        Ok(ScanReport { all_settled: true }),
        Millis(121_000),
    );
    assert_eq!(effects(&mut scans), []);
}

// OV-06: the journal row survives a quit; opening a Codex target of the session repairs.
#[test]
fn the_restart_repair_settles_rows_when_a_target_of_the_session_opens() {
    let (s, r) = (session(), run("run-1"));
    let t = main_target();
    let child = TargetId::new("thread-2").unwrap();
    let mut store = MemoryOverlayStore::new();
    write(
        &mut store,
        &s,
        &t,
        &Change::Publish(vec![
            live("a", 1, "run-1"),
            ephemeral("thinking-run-1", RowClass::Status, "run-1"),
        ]),
    )
    .unwrap();
    write(
        &mut store,
        &s,
        &child,
        &Change::Publish(vec![live("b", 2, "run-1"), live("c", 3, "run-2")]),
    )
    .unwrap();
    // Before the quit: the journal row was written, no scan finished.
    let mut scans = ExactScans::new();
    scans.run_ended(s.clone(), r.clone(), Millis(0));
    let Some(ScanEffect::WriteJournal { session, run: jr }) = scans.poll_effect() else {
        panic!()
    };
    store.add_cleanup(&session, &jr).unwrap();
    drop(scans); // the app quits
                 // After the restart: a target of the session opens.
    let pending: Vec<_> = store
        .pending_cleanups(Some(&s))
        .unwrap()
        .into_iter()
        .map(|(_, r)| r)
        .collect();
    assert_eq!(pending, std::slice::from_ref(&r));
    let mut scans = ExactScans::new();
    scans.target_opened(&s, &pending, Millis(50_000));
    assert_eq!(effects(&mut scans), [scan(1)]);
    // The scan looks for the run's exact keys in every target of the session.
    let keys = run_keys(&mut store, &s, &r).unwrap();
    assert_eq!(keys, HashSet::from([reply("a"), reply("b")]));
    let epoch_before = store.load(&s, &t).unwrap().unwrap().settlement_epoch;
    let (report, written) = settle_run(&mut store, &s, &r, &keys).unwrap();
    assert!(report.all_settled);
    assert!(!written.is_empty());
    let main = store.load(&s, &t).unwrap().unwrap();
    assert!(
        main.blocks.is_empty(),
        "ordinary rows settled, the status row cleaned up"
    );
    assert_eq!(main.settlement_epoch, epoch_before + 1);
    let child_now = store.load(&s, &child).unwrap().unwrap();
    assert_eq!(child_now.blocks.len(), 1, "run-2's row stays");
    scans.handle_scan_result(&s, &r, Ok(report), Millis(50_010));
    let Some(ScanEffect::RemoveJournal { session, run }) = scans.poll_effect() else {
        panic!()
    };
    assert!(store.remove_cleanup(&session, &run).unwrap());
    assert!(store.pending_cleanups(None).unwrap().is_empty());
}

// OV-06: a partial scan settles what it found and reports the rest missing.
#[test]
fn a_partial_scan_settles_what_it_found() {
    let (s, r, t) = (session(), run("run-1"), main_target());
    let mut store = MemoryOverlayStore::new();
    write(
        &mut store,
        &s,
        &t,
        &Change::Publish(vec![live("a", 1, "run-1"), live("b", 2, "run-1")]),
    )
    .unwrap();
    let (report, _) = settle_run(&mut store, &s, &r, &HashSet::from([reply("a")])).unwrap();
    assert!(!report.all_settled);
    assert_eq!(
        run_keys(&mut store, &s, &r).unwrap(),
        HashSet::from([reply("b")])
    );
}

/// A store that fails every `update` after the first `ok` ones.
fn fail_after(inner: MemoryOverlayStore, ok: u64) -> FailingOverlay<MemoryOverlayStore> {
    let store = FailingOverlay::new(inner);
    store.with_plan(|p| {
        p.only = vec!["update"];
        p.pass_writes = ok;
        p.writes_off = true;
    });
    store
}

// OV-06: a scan settles the exact keys of its run. A key that history holds but a row of
// another run carries stays, and that target's epoch does not move.
#[test]
fn a_scan_settles_only_the_keys_of_its_own_run() {
    let (s, r, t) = (session(), run("run-1"), main_target());
    let other = TargetId::new("thread-other").unwrap();
    let mut store = MemoryOverlayStore::new();
    write(
        &mut store,
        &s,
        &t,
        &Change::Publish(vec![live("a", 1, "run-1")]),
    )
    .unwrap();
    write(
        &mut store,
        &s,
        &other,
        &Change::Publish(vec![live("b", 2, "run-2")]),
    )
    .unwrap();
    let epoch_other = store.load(&s, &other).unwrap().unwrap().settlement_epoch;
    // The history read holds both keys; only run-1's leaves.
    let found = HashSet::from([reply("a"), reply("b")]);
    let (report, _) = settle_run(&mut store, &s, &r, &found).unwrap();
    assert!(report.all_settled);
    assert!(store.load(&s, &t).unwrap().unwrap().blocks.is_empty());
    let kept = store.load(&s, &other).unwrap().unwrap();
    assert_eq!(kept.blocks.len(), 1, "run-2's row stays");
    assert_eq!(
        kept.settlement_epoch, epoch_other,
        "its epoch does not move"
    );
}

// OV-06, OV-07: a store failure in the middle of a settlement returns the snapshots saved
// before it, so they still reach the live sinks.
#[test]
fn a_settlement_that_fails_midway_returns_what_it_saved() {
    let (s, r, t) = (session(), run("run-1"), main_target());
    let other = TargetId::new("thread-other").unwrap();
    let mut inner = MemoryOverlayStore::new();
    for target in [&t, &other] {
        write(
            &mut inner,
            &s,
            target,
            &Change::Publish(vec![live(target.as_str(), 1, "run-1")]),
        )
        .unwrap();
    }
    let found = run_keys(&mut inner, &s, &r).unwrap();
    let mut store = fail_after(inner, 1);
    let err = settle_run(&mut store, &s, &r, &found).unwrap_err();
    assert_eq!(
        err.written.len(),
        1,
        "the first target's settlement was saved"
    );
    let (saved_target, saved) = &err.written[0];
    let stored_now = store
        .inner
        .targets(&s)
        .unwrap()
        .into_iter()
        .filter_map(|target| store.inner.load(&s, &target).unwrap())
        .find(|o| o.revision == saved.revision);
    assert_eq!(
        store.inner.load(&s, saved_target).unwrap().as_ref(),
        Some(saved),
        "the target named is the one stored"
    );
    assert_eq!(
        stored_now.as_ref(),
        Some(saved),
        "what comes back is what is stored"
    );
    assert!(err.to_string().contains("injected failure of update"));
}

// MH-01, OV-06: a scope let go forgets its scans and the effects not yet taken; other
// sessions' scans go on.
#[test]
fn forgetting_a_scope_drops_its_scans_and_their_pending_effects() {
    let (s, r) = (session(), run("run-1"));
    let other = timeline_core::key::SessionId::new("other").unwrap();
    let mut scans = ExactScans::new();
    scans.run_ended(s.clone(), r.clone(), Millis(1_000));
    scans.run_ended(other.clone(), r.clone(), Millis(1_000));
    scans.forget(|x| *x == s);
    assert!(!scans.is_active(&s, &r));
    assert!(scans.is_active(&other, &r));
    assert_eq!(
        effects(&mut scans),
        [ScanEffect::WriteJournal {
            session: other.clone(),
            run: r.clone()
        }]
    );
    // A late answer for the forgotten scan does nothing.
    scans.journal_written(&s, &r);
    scans.handle_scan_result(&s, &r, Ok(ScanReport { all_settled: true }), Millis(1_001));
    assert!(effects(&mut scans).is_empty());
    assert_eq!(
        scans.poll_timeout(),
        Some(Millis(1_000).saturating_add(overlay_core::scan::CLEANUP_BUDGET))
    );
}
