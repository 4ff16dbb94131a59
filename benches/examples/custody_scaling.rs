//! How a full custody cycle grows with entries that just sit in the outbox, and what a
//! cycle costs on SQLite against one raw single-row commit, measured in one run.
//!
//! For N = 0, 100 and 10,000 held entries (queued, auto-drain off) in the session, the
//! median of 300 full cycles (submit, send, accepted, echo confirms, removed, run ends)
//! on the in-memory store and on SQLite with `synchronous = NORMAL`; then the cycle with
//! `FULL` against a raw `INSERT` commit with `FULL` on the same disk.
//!
//! `cargo run --release -p benches --example custody_scaling`

use std::time::{Duration, Instant};

use benches::custody::{custody_over, hold, one_cycle};
use benches::storage::{library_settings, Keys, RawAppend};
use outbox_core::store::memory::MemoryOutboxStore;
use outbox_core::store::OutboxStore;
use storage_sqlite::{SqliteStore, Synchronous};

const CYCLES: u64 = 300;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn cycles<S: OutboxStore>(store: S, keys: Keys) -> Duration {
    let (mut custody, session) = custody_over(store, keys);
    let mut times = Vec::new();
    for i in 1..=CYCLES {
        let t = Instant::now();
        one_cycle(&mut custody, &session, keys, i);
        times.push(t.elapsed());
    }
    let stats = custody.stats();
    assert!(
        stats.outbox_loads <= 1 && stats.store_failures == 0,
        "the outbox is read once: {stats:?}"
    );
    median(times)
}

fn sqlite(dir: &std::path::Path, name: &str, sync: Synchronous) -> SqliteStore {
    SqliteStore::open(dir.join(name), library_settings(sync)).expect("open")
}

fn main() {
    let keys = Keys::Uuid;
    let dir = tempfile::tempdir().expect("dir");
    println!("full custody cycle, median of {CYCLES}, UUID keys");
    println!("| N held | memory | SQLite NORMAL |");
    println!("|---:|---:|---:|");
    let mut first: Option<(Duration, Duration)> = None;
    for n in [0u64, 100, 10_000] {
        let mut memory = MemoryOutboxStore::new();
        hold(&mut memory, keys, n);
        let m = cycles(memory, keys);
        let mut store = sqlite(dir.path(), &format!("n{n}.sqlite3"), Synchronous::Normal);
        hold(&mut store, keys, n);
        let s = cycles(store, keys);
        println!("| {n} | {m:.2?} | {s:.2?} |");
        match first {
            None => first = Some((m, s)),
            Some((m0, s0)) if n == 10_000 => println!(
                "ratio N=10,000 / N=0: memory {:.2}, SQLite NORMAL {:.2} (target <= 1.5)",
                m.as_secs_f64() / m0.as_secs_f64(),
                s.as_secs_f64() / s0.as_secs_f64()
            ),
            Some(_) => {}
        }
    }
    // FULL: a cycle against one raw fsync'd single-row commit, interleaved; and the same
    // two with NORMAL, to separate the syncs from the rest of the work.
    let mut medians = Vec::new();
    for (label, sync) in [("FULL", Synchronous::Full), ("NORMAL", Synchronous::Normal)] {
        let mut raw = RawAppend::open(&dir.path().join(format!("raw-{label}.sqlite3")), sync, true);
        let store = sqlite(dir.path(), &format!("cycle-{label}.sqlite3"), sync);
        let (mut custody, session) = custody_over(store, keys);
        let (mut raw_t, mut cycle_t) = (Vec::new(), Vec::new());
        for i in 1..=CYCLES {
            let t = Instant::now();
            raw.commit();
            raw_t.push(t.elapsed());
            let t = Instant::now();
            one_cycle(&mut custody, &session, keys, i);
            cycle_t.push(t.elapsed());
        }
        let (r, c) = (median(raw_t), median(cycle_t));
        println!(
            "{label}: raw single-row commit {r:.2?}, full cycle {c:.2?}, ratio {:.2}",
            c.as_secs_f64() / r.as_secs_f64()
        );
        medians.push((r.as_secs_f64(), c.as_secs_f64()));
    }
    if let [(raw_full, cycle_full), (raw_normal, cycle_normal)] = medians[..] {
        // Three commits each pay one sync more than with NORMAL; the rest is the work a
        // NORMAL cycle does.
        let sync = raw_full - raw_normal;
        let bound = (3.0 * sync + cycle_normal) / raw_full;
        println!(
            "FULL cycle / raw commit {:.2} (target <= 4); three syncs plus the NORMAL cycle's work give {:.2}",
            cycle_full / raw_full,
            bound
        );
    }
}
