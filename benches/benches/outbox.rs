//! Custody: the pure cost of one full message cycle (submit, drain, accepted,
//! confirmed, removed, run ended) against the in-memory store, and of one ledger
//! transition; the same cycle on SQLite with UUID keys, NORMAL and FULL; the cycle while
//! 10,000 held entries stay in the outbox; and a FULL cycle against one raw commit.
//!
//! `cargo bench -p benches --bench outbox`

// criterion_group! generates an undocumented function.
#![allow(missing_docs)]

use benches::custody::{custody_over, hold, one_cycle};
use benches::storage::{library_settings, Keys, RawAppend};
use criterion::{criterion_group, criterion_main, Criterion};
use outbox_core::ledger::{transition, LedgerRecord, LedgerStatus};
use outbox_core::store::memory::MemoryOutboxStore;
use storage_sqlite::{SqliteStore, Synchronous};
use timeline_core::time::Millis;

fn cycle(c: &mut Criterion) {
    let (mut custody, session) = custody_over(MemoryOutboxStore::new(), Keys::Short);
    let mut i = 0u64;
    c.bench_function("custody_full_cycle", |b| {
        b.iter(|| {
            i += 1;
            one_cycle(&mut custody, &session, Keys::Short, i);
        })
    });

    // The same cycle on SQLite, with the IDs clients send: what a host pays per message
    // for custody (every store write is a commit).
    let mut group = c.benchmark_group("custody_full_cycle_sqlite_uuid_keys");
    group.sample_size(30);
    let dir = tempfile::tempdir().expect("dir");
    for (label, sync) in [("normal", Synchronous::Normal), ("full", Synchronous::Full)] {
        let store = SqliteStore::open(
            dir.path().join(format!("{label}.sqlite")),
            library_settings(sync),
        )
        .expect("open");
        let (mut custody, session) = custody_over(store, Keys::Uuid);
        let mut i = 0u64;
        group.bench_function(label, |b| {
            b.iter(|| {
                i += 1;
                one_cycle(&mut custody, &session, Keys::Uuid, i);
            })
        });
    }
    group.finish();
}

/// A cycle while N held entries stay in the session's outbox (N = 0 and 10,000): the
/// cost must not grow with what just sits there.
fn cycle_with_held(c: &mut Criterion) {
    let mut group = c.benchmark_group("custody_cycle_with_held");
    let dir = tempfile::tempdir().expect("dir");
    for n in [0u64, 10_000] {
        let mut memory = MemoryOutboxStore::new();
        hold(&mut memory, Keys::Uuid, n);
        let (mut custody, session) = custody_over(memory, Keys::Uuid);
        let mut i = 0u64;
        group.bench_function(format!("memory/{n}"), |b| {
            b.iter(|| {
                i += 1;
                one_cycle(&mut custody, &session, Keys::Uuid, i);
            })
        });
        let mut store = SqliteStore::open(
            dir.path().join(format!("held-{n}.sqlite")),
            library_settings(Synchronous::Normal),
        )
        .expect("open");
        hold(&mut store, Keys::Uuid, n);
        let (mut custody, session) = custody_over(store, Keys::Uuid);
        let mut i = 0u64;
        group.bench_function(format!("sqlite_normal/{n}"), |b| {
            b.iter(|| {
                i += 1;
                one_cycle(&mut custody, &session, Keys::Uuid, i);
            })
        });
    }
    group.finish();

    // FULL: a whole cycle against one raw fsync'd single-row commit on the same disk.
    let mut group = c.benchmark_group("custody_cycle_full_against_raw_commit");
    group.sample_size(30);
    let mut raw = RawAppend::open(&dir.path().join("raw.sqlite"), Synchronous::Full, true);
    group.bench_function("raw_commit", |b| b.iter(|| raw.commit()));
    let store = SqliteStore::open(
        dir.path().join("cycle-full.sqlite"),
        library_settings(Synchronous::Full),
    )
    .expect("open");
    let (mut custody, session) = custody_over(store, Keys::Uuid);
    let mut i = 0u64;
    group.bench_function("cycle", |b| {
        b.iter(|| {
            i += 1;
            one_cycle(&mut custody, &session, Keys::Uuid, i);
        })
    });
    group.finish();
}

fn ledger_transition(c: &mut Criterion) {
    let current = LedgerRecord::new(LedgerStatus::Sending, Millis(1));
    c.bench_function("ledger_transition", |b| {
        b.iter(|| {
            let proposed = LedgerRecord::new(std::hint::black_box(LedgerStatus::Sent), Millis(2));
            transition(Some(std::hint::black_box(&current)), proposed)
        })
    });
}

criterion_group!(benches, cycle, cycle_with_held, ledger_transition);
criterion_main!(benches);
