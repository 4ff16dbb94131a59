//! The Codex agent's two performance figures, each with its baseline in the same run:
//!
//! - `rollout_latest_page`: the latest page (12 items) of a 100 MB rollout built by
//!   repeating the turn of the real Codex 0.58 rollout, read from the file's tail
//!   ([`RolloutSource::read`]) against reading and parsing the whole file (every line
//!   typed, the conversation built, its newest 12 items taken). `AGENT_CODEX_BENCH_MB`
//!   sets other sizes (comma-separated, e.g. `100,500`).
//! - `project_live_deltas`: the real `item/agentMessage/delta` lines of both app-server
//!   recordings, repeated to 100,000, each through the codec (JSON parse included) and
//!   the projection into a packed-history delta event; throughput in deltas. Beside it:
//!   the codec alone, and the general reader (a JSON tree per line, then the typed
//!   notification, projected by reference) that every line took before the delta fast
//!   path.
//! - `project_recording`: every server line of `02-approvals-and-tools` through the
//!   codec and the projection; throughput in lines.
//!
//! `cargo bench -p agent-codex --bench rollout`

// criterion_group! generates an undocumented function.
#![allow(missing_docs, clippy::disallowed_methods)]

use std::hint::black_box;
use std::io::Write;
use std::path::{Path, PathBuf};

use agent_codex::codec::{Codec, Incoming};
use agent_codex::edge::RolloutSource;
use agent_codex::history::{self, LineRole};
use agent_codex::project::{Projected, Projector};
use agent_codex::protocol::{Notification, ServerNotification};
use agent_codex::rollout::RolloutReader;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use overlay_core::source::HistorySource;
use timeline_core::time::Millis;

fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(rel)
}

const ROLLOUT: &str =
    "codex-session-view/rollout-2025-11-17T15-30-28-019a93b9-f380-7600-98ff-940e6b99603c.jsonl";
const RECORDINGS: [&str; 2] = [
    "anyagent-rs/codex-app-server/02-approvals-and-tools.jsonl",
    "anyagent-rs/codex-app-server/03-steer-and-queue.jsonl",
];

/// A rollout of at least `mb` MiB: the real file's `session_meta`, then its turn (every
/// other line) again and again.
fn big_rollout(dir: &Path, mb: u64) -> PathBuf {
    let real = std::fs::read(data(ROLLOUT)).expect("read the real rollout");
    let nl = real.iter().position(|&b| b == b'\n').expect("a first line") + 1;
    let (head, turn) = real.split_at(nl);
    let path = dir.join(format!("rollout-{mb}mb.jsonl"));
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path).expect("create"));
    f.write_all(head).expect("write");
    let mut written = head.len() as u64;
    while written < mb << 20 {
        f.write_all(turn).expect("write");
        written += turn.len() as u64;
    }
    f.flush().expect("flush");
    path
}

/// The baseline: read the whole file, type every line, build the conversation (every
/// row-producing line, outputs joined by call ID), take the newest `limit` items.
fn whole_file_latest(path: &Path, limit: usize) -> usize {
    let bytes = std::fs::read(path).expect("read");
    let mut reader = RolloutReader::new();
    let batch = reader.read_to_end(&bytes);
    let mut entries = Vec::new();
    let mut outputs = std::collections::HashMap::new();
    for line in &batch.lines {
        match history::role(line) {
            LineRole::Entry(e) => entries.push(e),
            LineRole::Output { call_id, output } => {
                outputs.entry(call_id).or_insert(output);
            }
            _ => {}
        }
    }
    entries
        .iter()
        .rev()
        .take(limit)
        .map(|e| history::blocks(e, 0, Millis(0), e.call_id().and_then(|c| outputs.get(c))).len())
        .sum()
}

fn latest_page(c: &mut Criterion) {
    let sizes: Vec<u64> = std::env::var("AGENT_CODEX_BENCH_MB")
        .ok()
        .map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![100]);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut group = c.benchmark_group("rollout_latest_page");
    group.sample_size(10);
    for mb in sizes {
        let path = big_rollout(dir.path(), mb);
        let mut source = RolloutSource::open(&path, 1).expect("open");
        let before = source.bytes_read();
        let page = source.read(None, 12).expect("a page");
        assert_eq!(page.items.len(), 12);
        eprintln!(
            "rollout_latest_page/{mb}MB: one latest page read {} bytes of {}",
            source.bytes_read() - before,
            std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0)
        );
        group.bench_function(format!("tail/{mb}MB"), |b| {
            b.iter(|| black_box(source.read(None, 12).expect("a page")))
        });
        group.bench_function(format!("whole_file/{mb}MB"), |b| {
            b.iter(|| black_box(whole_file_latest(&path, 12)))
        });
    }
    group.finish();
}

/// The server lines of a recording (without the recorder's lines).
fn server_lines(rel: &str) -> Vec<Vec<u8>> {
    let bytes = std::fs::read(data(rel)).expect("read the recording");
    bytes
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .filter(|l| {
            let v: serde_json::Value = serde_json::from_slice(l).expect("JSON");
            v.get("_sent").is_none() && v.get("_meta").is_none() && v.get("_note").is_none()
        })
        .map(<[u8]>::to_vec)
        .collect()
}

fn project(codec: &mut Codec, projector: &mut Projector, line: &[u8]) -> usize {
    match codec.handle_line(line) {
        Ok(Incoming::Notification(n)) => projector
            .handle_owned(n, Millis(1))
            .iter()
            .filter(|p| matches!(p, Projected::Delta(_)))
            .count(),
        Ok(Incoming::Request { request, .. }) => {
            projector.handle_request(&request, Millis(1)).len()
        }
        _ => 0,
    }
}

fn live_deltas(c: &mut Criterion) {
    let deltas: Vec<Vec<u8>> = RECORDINGS
        .iter()
        .flat_map(|r| server_lines(r))
        .filter(|l| l.windows(23).any(|w| w == b"item/agentMessage/delta"))
        .collect();
    assert!(deltas.len() > 50, "the recordings' deltas");
    let stream: Vec<&[u8]> = deltas
        .iter()
        .map(Vec::as_slice)
        .cycle()
        .take(100_000)
        .collect();
    let mut group = c.benchmark_group("project_live_deltas");
    group.throughput(Throughput::Elements(stream.len() as u64));
    group.sample_size(20);
    group.bench_function("codec_and_projection", |b| {
        b.iter(|| {
            let mut codec = Codec::new();
            let mut projector = Projector::new("session-1", None, 1);
            let mut n = 0;
            for line in &stream {
                n += project(&mut codec, &mut projector, line);
            }
            assert_eq!(n, stream.len());
            black_box(n)
        })
    });
    group.bench_function("codec_only", |b| {
        b.iter(|| {
            let mut codec = Codec::new();
            let mut n = 0;
            for line in &stream {
                n += usize::from(matches!(
                    codec.handle_line(line),
                    Ok(Incoming::Notification(_))
                ));
            }
            black_box(n)
        })
    });
    // The baseline: the general reader every other line takes (a JSON tree, then the
    // typed notification) and the projection by reference, as every line went before
    // the delta fast path.
    group.bench_function("general_reader_baseline", |b| {
        b.iter(|| {
            let mut projector = Projector::new("session-1", None, 1);
            let mut n = 0;
            for line in &stream {
                let v: serde_json::Value = serde_json::from_slice(line).expect("JSON");
                let method = v["method"].as_str().expect("method");
                let body = ServerNotification::from_parts(method, &v["params"]).expect("a delta");
                let note = Notification {
                    emitted_at_ms: v.get("emittedAtMs").and_then(serde_json::Value::as_u64),
                    body,
                };
                n += projector.handle(&note, Millis(1)).len();
            }
            assert_eq!(n, stream.len());
            black_box(n)
        })
    });
    group.finish();

    let lines = server_lines(RECORDINGS[0]);
    let mut group = c.benchmark_group("project_recording");
    group.throughput(Throughput::Elements(lines.len() as u64));
    group.bench_function("02_approvals_and_tools", |b| {
        b.iter(|| {
            let mut codec = Codec::new();
            let mut projector = Projector::new("session-1", None, 1);
            black_box(
                lines
                    .iter()
                    .map(|l| project(&mut codec, &mut projector, l))
                    .sum::<usize>(),
            )
        })
    });
    group.finish();
}

criterion_group!(benches, latest_page, live_deltas);
criterion_main!(benches);
