//! The seed's history-transport measurement, reproduced (PK-05): a synthetic tail page
//! with the seed's cardinalities (416,756 logical events; 696 records, 116 packed rows),
//! raw versus packed, all measured in one run.
//!
//! Every ratio compares two measurements of the same run. The writer's ratio (pack +
//! serialize against serializing the raw events) comes from paired runs: each run
//! times the raw serializer and the packed writer back to back, so a burst of load from
//! elsewhere hits both, and the ratio reported is the median of the runs' ratios. The
//! stage table gives every stage's cost per logical event, next to two floors no writer
//! can beat: one pass that reads every byte the writer reads, and a copy of the bytes it
//! writes.
//!
//! `cargo run --release -p benches --bin history-report`

use std::alloc::System;
use std::hint::black_box;
use std::io::Write as _;
use std::time::{Duration, Instant};

use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use timeline_core::history::{
    pack, write_packed_page, AssistantFold, HistoryPage, SessionEvent, SessionHistoryRecord,
};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Runs of every timed stage (the median is reported).
const RUNS: usize = 7;

/// The writer's target: pack + serialize at most this fraction of serializing the raw
/// events.
const WRITER_TARGET: f64 = 0.25;

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

fn median_of<T: Copy + PartialOrd>(mut runs: Vec<T>) -> T {
    runs.sort_by(|a, b| a.partial_cmp(b).expect("comparable"));
    runs[runs.len() / 2]
}

fn median(mut f: impl FnMut() -> Duration) -> Duration {
    median_of((0..RUNS).map(|_| f()).collect())
}

/// Median times of `a` and `b` timed back to back in each run, and the median of the
/// runs' ratios `b / a`.
fn paired(
    mut a: impl FnMut() -> Duration,
    mut b: impl FnMut() -> Duration,
) -> (Duration, Duration, f64) {
    let runs: Vec<(Duration, Duration)> = (0..RUNS).map(|_| (a(), b())).collect();
    let ratios = runs
        .iter()
        .map(|(a, b)| b.as_secs_f64() / a.as_secs_f64())
        .collect();
    (
        median_of(runs.iter().map(|r| r.0).collect()),
        median_of(runs.iter().map(|r| r.1).collect()),
        median_of(ratios),
    )
}

fn time(f: impl FnOnce()) -> Duration {
    let t = Instant::now();
    f();
    t.elapsed()
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

/// The input floor of any packed writer: one pass that reads every field and every
/// byte a writer must read to pack the page (both numbers, the four identifiers it
/// compares, the fragment, whether `data` is null) and does nothing else with them.
fn read_every_input_byte(events: &[SessionEvent]) -> u64 {
    fn sum(s: &str) -> u64 {
        s.bytes().fold(0, |acc, b| acc.wrapping_add(u64::from(b)))
    }
    fn sum_opt(s: &Option<String>) -> u64 {
        s.as_deref().map_or(0, sum)
    }
    events.iter().fold(0, |acc, e| {
        acc.wrapping_add(e.seq ^ e.time)
            .wrapping_add(sum(&e.kind))
            .wrapping_add(sum(&e.session_id))
            .wrapping_add(sum_opt(&e.turn_id))
            .wrapping_add(sum_opt(&e.block))
            .wrapping_add(sum_opt(&e.text))
            .wrapping_add(u64::from(e.data.is_null()))
    })
}

fn main() {
    let events = fixtures::history::synthetic_tail_page(1);
    let n = events.len();
    let raw_page = HistoryPage {
        records: events
            .iter()
            .cloned()
            .map(SessionHistoryRecord::Event)
            .collect(),
    };

    // Host: serialize the raw events into a reused buffer, and pack + serialize the
    // packed page straight from the events into another, paired run by run.
    let mut raw_json = Vec::new();
    let mut packed_json = Vec::new();
    let (raw_serialize, pack_serialize, writer_ratio) = paired(
        || {
            raw_json.clear();
            time(|| serde_json::to_writer(&mut raw_json, &raw_page).expect("json"))
        },
        || time(|| write_packed_page(&events, &mut packed_json).expect("in-range page")),
    );
    // Host stages on their own: pack into records, serialize those records.
    let mut packed_records = Vec::new();
    let pack_only = median(|| time(|| packed_records = pack(&events).expect("in-range page")));
    let packed_page = HistoryPage {
        records: packed_records.clone(),
    };
    let mut records_json = Vec::new();
    let serialize_records = median(|| {
        records_json.clear();
        time(|| serde_json::to_writer(&mut records_json, &packed_page).expect("json"))
    });
    assert_eq!(
        records_json, packed_json,
        "the writer writes what serde writes"
    );
    // Floors: read every input byte once; copy the packed page's bytes.
    let read_floor = median(|| {
        time(|| {
            black_box(read_every_input_byte(black_box(&events)));
        })
    });
    let mut copy = Vec::new();
    let copy_floor = median(|| {
        copy.clear();
        time(|| copy.extend_from_slice(black_box(&packed_json)))
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
    println!(
        "| serialize raw / pack + serialize packed (reused buffer, paired) | {} | {} | {writer_ratio:.3} |",
        ms(raw_serialize),
        ms(pack_serialize),
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

    println!("\nPer logical event ({n} events), median of {RUNS} runs\n");
    println!("| stage | time | per event | / serialize raw |");
    println!("|---|---:|---:|---:|");
    let stages = [
        (
            "host: serialize raw events (serde_json, reused buffer)",
            raw_serialize,
        ),
        ("host: pack into records (`pack`)", pack_only),
        (
            "host: serialize pack's records (serde_json, reused buffer)",
            serialize_records,
        ),
        (
            "host: pack + serialize in one pass (`write_packed_page`)",
            pack_serialize,
        ),
        ("floor: read every byte the writer reads, once", read_floor),
        ("floor: copy the packed page's bytes (memcpy)", copy_floor),
        ("client: parse + validate + fold, raw page", raw_client),
        (
            "client: parse + validate + fold, packed page",
            packed_client,
        ),
    ];
    for (name, d) in stages {
        println!(
            "| {name} | {:.2} ms | {:.1} ns | {:.3} |",
            d.as_secs_f64() * 1e3,
            d.as_secs_f64() * 1e9 / n as f64,
            d.as_secs_f64() / raw_serialize.as_secs_f64()
        );
    }
    println!();
    let checks = [
        (
            "packed JSON <= 7% of raw".to_owned(),
            (packed_json.len() as f64 / raw_json.len() as f64) <= 0.07,
        ),
        (
            format!("pack + serialize <= {WRITER_TARGET}x raw serialize"),
            writer_ratio <= WRITER_TARGET,
        ),
        (
            "client parse + fold >= 10x faster".to_owned(),
            raw_client.as_secs_f64() / packed_client.as_secs_f64() >= 10.0,
        ),
        (
            "retained heap <= 0.35x".to_owned(),
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
