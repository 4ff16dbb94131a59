//! The seed's history-transport measurement, reproduced (PK-05): a synthetic tail page
//! with the seed's cardinalities (416,756 logical events; 696 records, 116 packed rows),
//! raw versus packed, all measured in one run.
//!
//! `cargo run --release -p benches --bin history-report`

use std::alloc::System;
use std::io::Write as _;
use std::time::{Duration, Instant};

use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use timeline_core::history::{
    pack, write_packed_page, AssistantFold, HistoryPage, SessionHistoryRecord,
};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Bytes a value built by `f` keeps on the heap.
fn retained<T>(f: impl FnOnce() -> T) -> (T, isize) {
    let region = Region::new(GLOBAL);
    let value = f();
    let stats = region.change();
    (
        value,
        stats.bytes_allocated as isize - stats.bytes_deallocated as isize + stats.bytes_reallocated,
    )
}

fn median(mut f: impl FnMut() -> Duration) -> Duration {
    let mut runs: Vec<Duration> = (0..5).map(|_| f()).collect();
    runs.sort();
    runs[2]
}

fn gzip(bytes: &[u8]) -> usize {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(bytes).expect("gzip");
    e.finish().expect("gzip").len()
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn fold(page: &HistoryPage) -> AssistantFold {
    let mut f = AssistantFold::new();
    for r in &page.records {
        f.fold_record(r).expect("valid row");
    }
    f
}

fn main() {
    let events = fixtures::history::synthetic_tail_page(1);
    let raw_page = HistoryPage {
        records: events
            .iter()
            .cloned()
            .map(SessionHistoryRecord::Event)
            .collect(),
    };

    // Host: serialize the raw events into a reused buffer.
    let mut raw_json = Vec::new();
    let raw_serialize = median(|| {
        raw_json.clear();
        let t = Instant::now();
        serde_json::to_writer(&mut raw_json, &raw_page).expect("json");
        t.elapsed()
    });
    // Host: pack the page into records (for reference) and pack + serialize directly.
    let mut packed_records = Vec::new();
    let pack_only = median(|| {
        let t = Instant::now();
        packed_records = pack(&events).expect("in-range page");
        t.elapsed()
    });
    let mut packed_json = Vec::new();
    let pack_serialize = median(|| {
        let t = Instant::now();
        write_packed_page(&events, &mut packed_json).expect("json");
        t.elapsed()
    });
    let rows = packed_records
        .iter()
        .filter(|r| matches!(r, SessionHistoryRecord::Chunks(_)))
        .count();

    // Client: parse + validate + fold, and the heap the parsed page keeps.
    let mut raw_fold = AssistantFold::new();
    let raw_client = median(|| {
        let t = Instant::now();
        let page: HistoryPage = serde_json::from_slice(&raw_json).expect("parse");
        raw_fold = fold(&page);
        let d = t.elapsed();
        drop(page);
        d
    });
    let mut packed_fold = AssistantFold::new();
    let packed_client = median(|| {
        let t = Instant::now();
        let page: HistoryPage = serde_json::from_slice(&packed_json).expect("parse");
        packed_fold = fold(&page);
        let d = t.elapsed();
        drop(page);
        d
    });
    let (raw_parsed, raw_heap) =
        retained(|| serde_json::from_slice::<HistoryPage>(&raw_json).expect("parse"));
    drop(raw_parsed);
    let (packed_parsed, packed_heap) =
        retained(|| serde_json::from_slice::<HistoryPage>(&packed_json).expect("parse"));
    drop(packed_parsed);

    // Same final state both ways (entries differ by design: one row is one entry).
    let mut a = raw_fold.clone();
    let mut b = packed_fold.clone();
    a.entries = 0;
    b.entries = 0;
    assert_eq!(a, b, "scalar and packed folds agree");

    let (raw_gz, packed_gz) = (gzip(&raw_json), gzip(&packed_json));
    println!("History transport, synthetic tail page (seed cardinalities), one run\n");
    println!("| measure | raw logical events | packed page | packed / raw |");
    println!("|---|---:|---:|---:|");
    println!(
        "| top-level records | {} | {} ({rows} rows) | {:.4} |",
        raw_page.records.len(),
        packed_records.len(),
        packed_records.len() as f64 / raw_page.records.len() as f64
    );
    println!(
        "| JSON bytes | {} | {} | {:.3} |",
        raw_json.len(),
        packed_json.len(),
        packed_json.len() as f64 / raw_json.len() as f64
    );
    println!(
        "| gzip bytes | {raw_gz} | {packed_gz} | {:.3} |",
        packed_gz as f64 / raw_gz as f64
    );
    println!("| pack (records) | - | {} | - |", ms(pack_only));
    println!(
        "| serialize raw / pack + serialize packed (reused buffer) | {} | {} | {:.3} |",
        ms(raw_serialize),
        ms(pack_serialize),
        pack_serialize.as_secs_f64() / raw_serialize.as_secs_f64()
    );
    println!(
        "| client parse + validate + fold | {} | {} | {:.3} ({:.1}x faster) |",
        ms(raw_client),
        ms(packed_client),
        packed_client.as_secs_f64() / raw_client.as_secs_f64(),
        raw_client.as_secs_f64() / packed_client.as_secs_f64()
    );
    println!(
        "| retained heap after parsing | {raw_heap} B | {packed_heap} B | {:.3} |",
        packed_heap as f64 / raw_heap as f64
    );
    println!();
    let checks = [
        (
            "packed JSON <= 7% of raw",
            (packed_json.len() as f64 / raw_json.len() as f64) <= 0.07,
        ),
        (
            "pack + serialize <= 0.35x raw serialize",
            pack_serialize.as_secs_f64() / raw_serialize.as_secs_f64() <= 0.35,
        ),
        (
            "client parse + fold >= 10x faster",
            raw_client.as_secs_f64() / packed_client.as_secs_f64() >= 10.0,
        ),
        (
            "retained heap <= 0.35x",
            (packed_heap as f64 / raw_heap as f64) <= 0.35,
        ),
    ];
    for (name, ok) in checks {
        println!("{} {name}", if ok { "met:" } else { "MISSED:" });
    }
    println!(
        "\nfold: {} deltas, last seq {:?}, {} blocks",
        packed_fold.delta_count,
        packed_fold.last_delta_seq,
        packed_fold.blocks.len()
    );
}
