//! What one full custody cycle of a message asks of its store: the calls by method,
//! counted on the in-memory store and on SQLite (UUID keys, NORMAL and FULL), with the
//! time per cycle. The criterion figures are in `benches/outbox.rs`; this shows where a
//! durable store's time goes: every write is a commit, every read its own read
//! transaction.
//!
//! `cargo run --release -p benches --example custody_store_calls`
#![allow(clippy::unwrap_used)]

use std::time::Instant;

use benches::custody::{custody_over, one_cycle, Counting};
use benches::storage::{library_settings, Keys};
use outbox_core::store::memory::MemoryOutboxStore;
use outbox_core::store::OutboxStore;
use storage_sqlite::{SqliteStore, Synchronous};

const CYCLES: u64 = 2_000;

fn measure<S: OutboxStore>(label: &str, store: S, keys: Keys) {
    let (mut custody, session) = custody_over(Counting::new(store), keys);
    let start = Instant::now();
    for i in 1..=CYCLES {
        one_cycle(&mut custody, &session, keys, i);
    }
    let micros = start.elapsed().as_secs_f64() * 1e6 / CYCLES as f64;
    let calls: Vec<String> = custody
        .store()
        .calls
        .iter()
        .map(|(name, n)| format!("{name} {}", *n as f64 / CYCLES as f64))
        .collect();
    println!("| {label} | {micros:.1} µs | {} |", calls.join(", "));
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    println!("| store | time per cycle | calls per cycle |");
    println!("|---|---:|---|");
    measure(
        "in memory, short keys",
        MemoryOutboxStore::new(),
        Keys::Short,
    );
    for (label, sync) in [("NORMAL", Synchronous::Normal), ("FULL", Synchronous::Full)] {
        let store = SqliteStore::open(
            dir.path().join(format!("{label}.sqlite")),
            library_settings(sync),
        )
        .unwrap();
        measure(&format!("SQLite {label}, UUID keys"), store, Keys::Uuid);
    }
}
