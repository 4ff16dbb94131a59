//! Replay buffer: append throughput with trimming active (events already serialized),
//! and the replay of a full buffer (10,000 events, about 8 MB) into 256 KB chunks side
//! by side with `serde_json::to_vec` of the same events; `append` beside the same append
//! as it was before it checked its text (`baseline_append_unchecked`) and as it was
//! before its one-pass reader (`previous_append_serde_check`, `benches::baseline`); and
//! two baselines for the check an append makes (serde_json's validation, one read of
//! every byte).
//!
//! `cargo bench -p benches --bench replay`

// criterion_group! generates an undocumented function.
#![allow(missing_docs)]

use benches::baseline::{BaselineKind, BaselineReplay};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use overlay_core::replay::{EventKind, ReplayBuffers, ReplayConfig};
use timeline_core::key::SessionId;
use timeline_core::time::Millis;

fn event(i: usize) -> serde_json::Value {
    serde_json::json!({
        "type": "assistant_delta",
        "itemId": format!("item-{}", i / 40),
        "text": "x".repeat(760 + i % 16),
    })
}

fn replay(c: &mut Criterion) {
    let session = SessionId::new("s").expect("id");
    let mut group = c.benchmark_group("replay_buffer");

    // Append with trimming active: the buffer holds 1,000 events and every append trims.
    let serialized: Vec<String> = (0..4_096).map(|i| event(i).to_string()).collect();
    let mut buffers = ReplayBuffers::new(ReplayConfig {
        max_events: 1_000,
        ..ReplayConfig::default()
    });
    buffers
        .append(
            &session,
            EventKind::Init,
            r#"{"type":"session_init"}"#.into(),
            Millis(0),
        )
        .expect("one JSON object");
    for s in serialized.iter().take(1_000) {
        buffers
            .append(&session, EventKind::Other, s.clone(), Millis(0))
            .expect("one JSON object");
    }
    let mut i = 0usize;
    group.bench_function("append_with_trimming", |b| {
        b.iter_batched(
            || {
                i += 1;
                serialized[i % serialized.len()].clone()
            },
            |json| buffers.append(&session, EventKind::Other, json, Millis(0)),
            BatchSize::SmallInput,
        )
    });

    // The same appends into the ring as it was before `append` checked its text
    // (`benches::baseline::BaselineReplay`), in the same run.
    let mut old = BaselineReplay::new(1_000, ReplayConfig::default().max_bytes);
    old.append(
        &session,
        BaselineKind::Init,
        r#"{"type":"session_init"}"#.into(),
        0,
    );
    for s in serialized.iter().take(1_000) {
        old.append(&session, BaselineKind::Other, s.clone(), 0);
    }
    let mut h = 0usize;
    group.bench_function("baseline_append_unchecked", |b| {
        b.iter_batched(
            || {
                h += 1;
                serialized[h % serialized.len()].clone()
            },
            |json| old.append(&session, BaselineKind::Other, json, 0),
            BatchSize::SmallInput,
        )
    });

    // `append` as it was before its one-pass reader (serde_json's parser with a visitor
    // checked every text), the same push and trim.
    let mut previous = BaselineReplay::new(1_000, ReplayConfig::default().max_bytes);
    previous.append(
        &session,
        BaselineKind::Init,
        r#"{"type":"session_init"}"#.into(),
        0,
    );
    for s in serialized.iter().take(1_000) {
        previous.append(&session, BaselineKind::Other, s.clone(), 0);
    }
    let mut g = 0usize;
    group.bench_function("previous_append_serde_check", |b| {
        b.iter_batched(
            || {
                g += 1;
                serialized[g % serialized.len()].clone()
            },
            |json| previous.append_checked(&session, BaselineKind::Other, json, 0),
            BatchSize::SmallInput,
        )
    });

    // Baselines for the check `append` makes, on the same texts: serde_json's own
    // validation (parse into IgnoredAny, building nothing), and one read of every byte
    // (counting quotes), the floor of any check that looks at the whole text.
    let mut j = 0usize;
    group.bench_function("baseline_serde_ignored_any", |b| {
        b.iter(|| {
            j += 1;
            let text = &serialized[j % serialized.len()];
            serde_json::from_str::<serde::de::IgnoredAny>(std::hint::black_box(text)).is_ok()
        })
    });
    let mut k = 0usize;
    group.bench_function("baseline_read_every_byte", |b| {
        b.iter(|| {
            k += 1;
            let text = &serialized[k % serialized.len()];
            std::hint::black_box(text)
                .bytes()
                .filter(|c| *c == b'"')
                .count()
        })
    });

    // A full buffer of 10,000 events (about 8 MB).
    let values: Vec<serde_json::Value> = (0..10_000).map(event).collect();
    let mut full = ReplayBuffers::new(ReplayConfig::default());
    full.append(
        &session,
        EventKind::Init,
        r#"{"type":"session_init"}"#.into(),
        Millis(0),
    )
    .expect("one JSON object");
    for v in &values {
        full.append(&session, EventKind::Other, v.to_string(), Millis(0))
            .expect("one JSON object");
    }
    assert!(full.bytes(&session) > 7_500_000);
    group.throughput(criterion::Throughput::Bytes(full.bytes(&session) as u64));
    let mut buf = String::new();
    group.bench_function("replay_10k_events_in_256k_chunks", |b| {
        b.iter(|| {
            // A server sends each chunk as it is built, from one reused buffer.
            let mut sent = 0usize;
            full.replay_with(&session, &mut buf, |_, _, chunk| sent += chunk.len());
            sent
        })
    });
    group.bench_function("serde_json_to_vec_10k_events", |b| {
        b.iter(|| serde_json::to_vec(&values).expect("json").len())
    });
    group.finish();
}

criterion_group!(benches, replay);
criterion_main!(benches);
