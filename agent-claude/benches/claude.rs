//! Criterion benches of the Claude reader and projection (figures and commands in
//! `agent-claude/BENCHES.md`):
//!
//! - `latest_window/100mb`: the newest 50 items of a 100 MB transcript (real turns
//!   repeated), read from the file's end, against reading and parsing the whole file;
//! - `deltas`: stream-json text deltas through the decoder (a JSON parse per line) and
//!   the projection into packed-history delta events.

#![allow(missing_docs)] // `criterion_group!` writes an undocumented function

mod support;

use std::time::Duration;

use agent_claude::file::{read_latest, read_transcript};
use agent_claude::project::Projector;
use agent_claude::stream::StreamDecoder;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use timeline_core::time::Millis;

const PAGE: usize = 50;

fn latest_window(c: &mut Criterion) {
    let path = support::big_transcript(100 << 20);
    let mut g = c.benchmark_group("latest_window");
    g.sample_size(10).measurement_time(Duration::from_secs(20));
    g.bench_function(BenchmarkId::new("tail", "100mb"), |b| {
        b.iter(|| {
            let page = read_latest(&path, PAGE).expect("a page");
            assert_eq!(page.items.len(), PAGE);
            page
        });
    });
    g.bench_function(BenchmarkId::new("whole_file", "100mb"), |b| {
        b.iter(|| {
            let t = read_transcript(&path).expect("read");
            let page = t.page_before(None, PAGE).expect("a page");
            assert_eq!(page.items.len(), PAGE);
            page.items.len()
        });
    });
    g.finish();
}

fn deltas(c: &mut Criterion) {
    const N: usize = 10_000;
    let lines = support::delta_stream(N);
    let mut g = c.benchmark_group("deltas");
    g.throughput(Throughput::Elements(N as u64));
    g.bench_function("decode_and_project", |b| {
        b.iter(|| {
            let mut dec = StreamDecoder::new();
            let mut p = Projector::new("session-1", 0);
            let mut events = 0usize;
            for line in &lines {
                if let Some(l) = dec.decode(line) {
                    p.handle_line(&l, Millis(1));
                }
                while let Some(o) = p.poll_effect() {
                    events += usize::from(matches!(o, agent_claude::project::Output::Event(_)));
                }
            }
            assert_eq!(events, N);
            events
        });
    });
    g.finish();
}

criterion_group!(benches, latest_window, deltas);
criterion_main!(benches);
