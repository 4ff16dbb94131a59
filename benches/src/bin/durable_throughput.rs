//! Durable throughput: messages per second through the runtime with 100 sessions
//! sending at once on SQLite with `synchronous = FULL`, against raw batched commits of
//! rows of the same size on the same disk (the fsync limit), in one run. Beside it, the
//! same load with `synchronous = NORMAL` (in WAL mode a commit writes but does not wait
//! for the disk; only a checkpoint syncs) and on the memory stores: what the runtime
//! reaches when no commit waits for an fsync, and with no SQLite at all.
//!
//! `cargo run --release -p benches --bin durable-throughput`

#![allow(clippy::unwrap_used)] // a measurement: a failed step is a failed run

use std::time::{Duration, Instant};

use host_core::{ClientRequest, Host, HostConfig, Reply};
use host_runtime::Runtime;
use outbox_core::adapter::Capabilities;
use outbox_core::{Controls, MessageRequest, OperationId, QueueId, SessionInfo, SubmitRequest};
use overlay_core::{MemorySource, SourceKind};
use scripted_model::instant::InstantAgent;
use storage_sqlite::{Settings, SqliteStore, Synchronous};
use timeline_core::{BoundaryToken, HostKey, Millis, SessionId};

const SESSIONS: usize = 100;
const PER_SESSION: usize = 10;

fn uuids() -> Box<dyn FnMut() -> String + Send> {
    let mut n = 0u64;
    Box::new(move || {
        n += 1;
        format!("00000000-0000-4000-8000-{n:012x}")
    })
}

fn on_sqlite(dir: &std::path::Path, name: &str, synchronous: Synchronous) -> f64 {
    let path = dir.join(name);
    let mut settings = Settings::default();
    settings.synchronous = synchronous;
    let host = Host::new(
        SqliteStore::open(&path, settings).unwrap(),
        SqliteStore::open(&path, settings).unwrap(),
        HostConfig::new(HostKey::from_bytes([7; 32]), uuids()),
    );
    through_runtime(host)
}

fn through_runtime<O, V>(mut host: Host<O, V>) -> f64
where
    O: outbox_core::OutboxStore + Send + 'static,
    V: overlay_core::OverlayStore + overlay_core::CleanupJournal + Send + 'static,
{
    let sessions: Vec<SessionId> = (0..SESSIONS)
        .map(|i| SessionId::new(format!("s-{i:03}")).unwrap())
        .collect();
    for (i, s) in sessions.iter().enumerate() {
        let source = MemorySource::new(
            SourceKind::Codex {
                thread_id: format!("thread-{i}"),
                generation: 1,
            },
            BoundaryToken::codex_rollout(&format!("/r-{i}.jsonl")),
        );
        host.add_session(s, SessionInfo::new(Capabilities::codex()), Box::new(source));
    }
    let mut runtime = Runtime::builder(host)
        .agent(InstantAgent::new())
        .start()
        .unwrap();
    let mut outputs = runtime.take_outputs();
    let client = runtime.client();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        tokio::spawn(async move { while outputs.next().await.is_some() {} });
        let began = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for s in sessions {
            let c = client.clone();
            tasks.spawn(async move {
                for m in 0..PER_SESSION {
                    let op = format!("{s}-op-{m}");
                    let reply = c
                        .request(ClientRequest::Submit(SubmitRequest {
                            session: s.clone(),
                            queue_id: QueueId::new(format!("q-{op}")).unwrap(),
                            operation_id: OperationId::new(&op).unwrap(),
                            request: MessageRequest::text("Run the tests", "phone", Millis(0)),
                            controls: Controls::automatic(),
                        }))
                        .await
                        .unwrap();
                    assert!(matches!(reply, Reply::Submitted(Ok(_))), "{reply:?}");
                }
            });
        }
        while tasks.join_next().await.is_some() {}
        let elapsed = began.elapsed();
        runtime.shutdown().await.unwrap();
        let messages = (SESSIONS * PER_SESSION) as f64;
        messages / elapsed.as_secs_f64()
    })
}

/// Raw commits on the same disk: `rows` rows of `size` bytes per commit, FULL.
fn raw(dir: &std::path::Path, commits: usize, rows: usize, size: usize) -> (f64, Duration) {
    let path = dir.join(format!("raw-{rows}.sqlite"));
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    conn.pragma_update(None, "synchronous", "FULL").unwrap();
    conn.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v BLOB)", [])
        .unwrap();
    let blob = vec![b'x'; size];
    let began = Instant::now();
    let mut k = 0u64;
    for _ in 0..commits {
        conn.execute_batch("BEGIN").unwrap();
        for _ in 0..rows {
            k += 1;
            conn.execute(
                "INSERT OR REPLACE INTO t (k, v) VALUES (?1, ?2)",
                rusqlite::params![format!("k-{k}"), blob],
            )
            .unwrap();
        }
        conn.execute_batch("COMMIT").unwrap();
    }
    let elapsed = began.elapsed();
    (commits as f64 / elapsed.as_secs_f64(), elapsed)
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let through = on_sqlite(dir.path(), "full.sqlite", Synchronous::Full);
    let normal = on_sqlite(dir.path(), "normal.sqlite", Synchronous::Normal);
    let memory = through_runtime(Host::new(
        outbox_core::MemoryOutboxStore::new(),
        overlay_core::MemoryOverlayStore::new(),
        HostConfig::new(HostKey::from_bytes([7; 32]), uuids()),
    ));
    // A message's rows: the outbox entry and its ledger (saved, accepted, confirmed),
    // about 1 KiB each; three durable moments.
    let (single, _) = raw(dir.path(), 200, 1, 1024);
    let (batched, _) = raw(dir.path(), 50, 3 * SESSIONS, 1024);
    let limit = batched * SESSIONS as f64;
    println!("through the runtime, {SESSIONS} sessions at once, FULL: {through:.0} messages/s");
    println!(
        "raw commits, FULL, same disk: {single:.0} commits/s of one row ({:.0} messages/s at three commits a message)",
        single / 3.0
    );
    println!(
        "raw batched commits, FULL: {batched:.0} commits/s of {} rows = the rows of {SESSIONS} messages a commit: limit {limit:.0} messages/s",
        3 * SESSIONS
    );
    println!("through the runtime, NORMAL (commits wait for no fsync): {normal:.0} messages/s");
    println!("through the runtime, memory stores: {memory:.0} messages/s");
    println!("ours / limit: {:.3}", through / limit);
    println!("NORMAL / limit: {:.3}", normal / limit);
    println!("memory / limit: {:.3}", memory / limit);
}
