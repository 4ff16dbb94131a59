//! Custody: the pure cost of one full message cycle (submit, drain, accepted,
//! confirmed, removed, run ended) against the in-memory store, and of one ledger
//! transition; and the same cycle on SQLite with UUID keys, NORMAL and FULL.
//!
//! `cargo bench -p benches --bench outbox`

// criterion_group! generates an undocumented function.
#![allow(missing_docs)]

use benches::custody::{custody_over, one_cycle};
use benches::storage::{library_settings, Keys};
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

fn ledger_transition(c: &mut Criterion) {
    let current = LedgerRecord::new(LedgerStatus::Sending, Millis(1));
    c.bench_function("ledger_transition", |b| {
        b.iter(|| {
            let proposed = LedgerRecord::new(std::hint::black_box(LedgerStatus::Sent), Millis(2));
            transition(Some(std::hint::black_box(&current)), proposed)
        })
    });
}

criterion_group!(benches, cycle, ledger_transition);
criterion_main!(benches);
