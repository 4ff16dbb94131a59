//! Durable throughput: messages per second through the runtime with 100 sessions
//! sending at once on SQLite with `synchronous = FULL`, against raw batched commits of
//! rows of the same size on the same disk (the fsync limit), in one run.
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
use storage_sqlite::{Settings, SqliteStore};
use timeline_core::{BoundaryToken, HostKey, Millis, SessionId};

const SESSIONS: usize = 100;
const PER_SESSION: usize = 10;

fn through_runtime(dir: &std::path::Path) -> (f64, u64) {
    let path = dir.join("custody.sqlite");
    let mut n = 0u64;
    let uuids = Box::new(move || {
        n += 1;
        format!("00000000-0000-4000-8000-{n:012x}")
    });
    let mut host = Host::new(
        SqliteStore::open(&path, Settings::default()).unwrap(),
        SqliteStore::open(&path, Settings::default()).unwrap(),
        HostConfig::new(HostKey::from_bytes([7; 32]), uuids),
    );
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
        (messages / elapsed.as_secs_f64(), 0)
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
    let (through, _) = through_runtime(dir.path());
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
    println!("ours / limit: {:.3}", through / limit);
}
