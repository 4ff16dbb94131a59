//! The runtime's cost per message against the pure `Host` cycle: the same host, the
//! same in-process scripted agent (it accepts, proves and ends each message's run at
//! once), one message after another; the pure cycle drives the host and the agent in
//! a plain loop, the runtime carries each request across its threads and back.
//!
//! `cargo bench -p host-runtime --bench runtime`

#![allow(clippy::unwrap_used)] // a bench: a failed step is a failed run
// criterion_group! generates an undocumented function.
#![allow(missing_docs)]

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use host_core::{Agent, AgentEffect, ClientRequest, Host, HostConfig, HostEffect, ReplyTo};
use host_runtime::Runtime;
use outbox_core::adapter::Capabilities;
use outbox_core::{
    Controls, MemoryOutboxStore, MessageRequest, OperationId, QueueId, SessionInfo, SubmitRequest,
};
use overlay_core::{MemoryOverlayStore, MemorySource, SourceKind};
use scripted_model::instant::InstantAgent;
use timeline_core::{BoundaryToken, HostKey, Millis, SessionId};

fn host(session: &SessionId) -> Host<MemoryOutboxStore, MemoryOverlayStore> {
    let mut n = 0u64;
    let uuids = Box::new(move || {
        n += 1;
        format!("00000000-0000-4000-8000-{n:012x}")
    });
    let mut host = Host::new(
        MemoryOutboxStore::new(),
        MemoryOverlayStore::new(),
        HostConfig::new(HostKey::from_bytes([7; 32]), uuids),
    );
    let source = MemorySource::new(
        SourceKind::Codex {
            thread_id: "thread-1".into(),
            generation: 1,
        },
        BoundaryToken::codex_rollout("/sessions/rollout-1.jsonl"),
    );
    host.add_session(
        session,
        SessionInfo::new(Capabilities::codex()),
        Box::new(source),
    );
    host
}

fn submit(session: &SessionId, i: u64) -> ClientRequest {
    ClientRequest::Submit(SubmitRequest {
        session: session.clone(),
        queue_id: QueueId::new(format!("q-{i}")).unwrap(),
        operation_id: OperationId::new(format!("op-{i}")).unwrap(),
        request: MessageRequest::text("Run the tests", "phone", Millis(0)),
        controls: Controls::automatic(),
    })
}

/// The pure cycle: the host and the agent in a plain loop, a clock that moves 1 ms a
/// message.
fn pure(n: u64) -> Duration {
    let session = SessionId::new("s-1").unwrap();
    let mut host = host(&session);
    let mut agent = InstantAgent::new();
    host.start(Millis(1)).unwrap();
    let began = Instant::now();
    for i in 0..n {
        let now = Millis(10 + i);
        host.handle_client(ReplyTo(i), submit(&session, i), now);
        loop {
            let mut quiet = true;
            while let Some(e) = host.poll_effect() {
                quiet = false;
                if let HostEffect::Agent(call) = e {
                    agent.handle_call(call, now);
                }
            }
            while let Some(e) = agent.poll_effect() {
                quiet = false;
                if let AgentEffect::Input(input) = e {
                    host.handle_agent(input, now);
                }
            }
            if quiet {
                break;
            }
        }
    }
    began.elapsed()
}

/// The same messages through the runtime: each request crosses to the host thread and
/// its answer comes back before the next is asked.
fn through_runtime(rt: &tokio::runtime::Runtime, n: u64) -> Duration {
    let session = SessionId::new("s-1").unwrap();
    let agent = InstantAgent::new();
    let mut runtime = Runtime::builder(host(&session))
        .agent(agent)
        .start()
        .unwrap();
    let mut outputs = runtime.take_outputs();
    let client = runtime.client();
    let elapsed = rt.block_on(async move {
        tokio::spawn(async move { while outputs.next().await.is_some() {} });
        let began = Instant::now();
        for i in 0..n {
            client.request(submit(&session, i)).await.unwrap();
        }
        let elapsed = began.elapsed();
        runtime.shutdown().await.unwrap();
        elapsed
    });
    elapsed
}

/// The same messages with every request in flight at once (clients that do not wait
/// for one answer before they ask again): the threads' hand-offs overlap.
fn pipelined(rt: &tokio::runtime::Runtime, n: u64) -> Duration {
    let session = SessionId::new("s-1").unwrap();
    let agent = InstantAgent::new();
    let mut runtime = Runtime::builder(host(&session))
        .agent(agent)
        .start()
        .unwrap();
    let mut outputs = runtime.take_outputs();
    let client = runtime.client();
    rt.block_on(async move {
        tokio::spawn(async move { while outputs.next().await.is_some() {} });
        let began = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..n {
            let (c, s) = (client.clone(), session.clone());
            tasks.spawn(async move { c.request(submit(&s, i)).await.unwrap() });
        }
        while tasks.join_next().await.is_some() {}
        let elapsed = began.elapsed();
        runtime.shutdown().await.unwrap();
        elapsed
    })
}

/// The floor: the same two hand-offs with nothing behind them (a request over a
/// bounded channel to a thread running a current-thread Tokio runtime, its answer back
/// over a oneshot).
fn bare_round_trip(rt: &tokio::runtime::Runtime, n: u64) -> Duration {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(u64, tokio::sync::oneshot::Sender<u64>)>(1024);
    let echo = std::thread::spawn(move || {
        let local = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        local.block_on(async move {
            while let Some((i, back)) = rx.recv().await {
                let _ = back.send(i);
            }
        });
    });
    let elapsed = rt.block_on(async move {
        let began = Instant::now();
        for i in 0..n {
            let (back, answer) = tokio::sync::oneshot::channel();
            tx.send((i, back)).await.unwrap();
            answer.await.unwrap();
        }
        began.elapsed()
    });
    echo.join().unwrap();
    elapsed
}

fn bench(c: &mut Criterion) {
    const N: u64 = 200;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut g = c.benchmark_group("runtime_per_message");
    g.sample_size(20);
    g.bench_function("pure_host_cycle", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| pure(N)).sum::<Duration>() / N as u32)
    });
    g.bench_function("through_runtime", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| through_runtime(&rt, N))
                .sum::<Duration>()
                / N as u32
        })
    });
    g.bench_function("bare_round_trip", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| bare_round_trip(&rt, N))
                .sum::<Duration>()
                / N as u32
        })
    });
    g.bench_function("through_runtime_pipelined", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| pipelined(&rt, N)).sum::<Duration>() / N as u32)
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
