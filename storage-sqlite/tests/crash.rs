//! Crash safety (ST-03): a writer in a child process (this test binary, re-executed) is
//! killed with SIGKILL at random moments during bursts of submits, ledger updates and
//! overlay writes. After each kill the parent reopens the file and checks:
//!
//! - every acknowledged submit is there (its entry, or its sent proof);
//! - no half submit: no identity row without its entry, no entry without its identity;
//! - the ledger never shows weaker proof than was acknowledged;
//! - overlay revisions are unique and increasing, and never behind an acknowledged one.
//!
//! 50 kill points per run; `CRASH_KILLS` sets more. `CRASH_SEED` picks the kill times.
//! The child acknowledges a write (one line in a log file) only after its commit
//! returned, exactly as a host returns a receipt only after the transaction.

use outbox_core::ids::ScopeId;
use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use outbox_core::entry::{Controls, MessageRequest, OutboxEntry};
use outbox_core::fingerprint::request_fingerprint;
use outbox_core::ids::{OperationId, QueueId, SessionId};
use outbox_core::ledger::{LedgerRecord, LedgerStatus};
use outbox_core::store::OutboxStore;
use overlay_core::overlay::Change;
use overlay_core::store::write;
use overlay_core::store::{OverlayStore, RowClass, StoredBlock};
use storage_sqlite::{Settings, SqliteStore, Synchronous};
use timeline_core::block::Block;
use timeline_core::key::{BlockKey, BlockType, RunId, TargetId};
use timeline_core::time::Millis;

const CHILD_DB: &str = "STORAGE_CRASH_CHILD_DB";
const CHILD_LOG: &str = "STORAGE_CRASH_CHILD_LOG";
const CHILD_ROUND: &str = "STORAGE_CRASH_CHILD_ROUND";

type Check = Result<(), String>;

fn settings() -> Settings {
    // NORMAL in WAL mode: an acknowledged write survives a process kill (not a power
    // loss), which is what this harness checks.
    let mut settings = Settings::default();
    settings.synchronous = Synchronous::Normal;
    settings
}

fn session() -> SessionId {
    SessionId::new("s1").expect("id")
}

fn entry(op: &str) -> OutboxEntry {
    OutboxEntry::queued(
        QueueId::new(format!("q-{op}")).expect("id"),
        OperationId::new(op).expect("id"),
        MessageRequest::text(format!("message {op}"), "composer", Millis(1)),
        Controls::enqueue(),
        0,
    )
}

/// Appends one acknowledgement line with a single write, so a kill never leaves half
/// a line behind.
fn acknowledge(ack: &mut std::fs::File, line: &str) {
    let mut text = String::with_capacity(line.len() + 1);
    text.push_str(line);
    text.push('\n');
    ack.write_all(text.as_bytes()).expect("ack");
}

/// The child: writes until it is killed, acknowledging each committed write.
fn child(db: &str, log: &str, round: &str) -> ! {
    let mut store = SqliteStore::open(db, settings()).expect("open");
    let mut ack = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("log");
    let s = session();
    let target = TargetId::new("s1").expect("id");
    for i in 0u64.. {
        // Half the operations have UUID IDs, as clients send them (stored as bytes),
        // half plain ones (stored as text).
        let op = if i % 2 == 0 {
            format!("op-{round}-{i}")
        } else {
            let round: u32 = round.parse().expect("round number");
            format!("{round:08x}-0000-4000-8000-{i:012x}")
        };
        let e = entry(&op);
        let fp = request_fingerprint(&s, &e.queue_id, &e.request);
        store.claim(&s, &fp, &e).expect("claim");
        acknowledge(&mut ack, &format!("submit {op}"));
        let status = if i % 2 == 0 {
            LedgerStatus::Sending
        } else {
            LedgerStatus::Canceled
        };
        store
            .put_ledger(
                &ScopeId::of(&s),
                &e.operation_id,
                &LedgerRecord::new(status, Millis(i)),
            )
            .expect("ledger");
        acknowledge(&mut ack, &format!("ledger {op} {}", status.strength()));
        if i % 3 == 0 {
            let sent = LedgerRecord::new(LedgerStatus::Sent, Millis(i));
            store
                .confirm_sent(
                    &ScopeId::of(&s),
                    std::slice::from_ref(&s),
                    &e.operation_id,
                    &sent,
                )
                .expect("sent");
            acknowledge(&mut ack, &format!("ledger {op} 3"));
        }
        let block = StoredBlock {
            block: Block::new(
                BlockKey::parse(BlockType::AgentReply, &op).expect("key"),
                Millis(i),
            ),
            class: RowClass::Ordinary,
            run_id: Some(RunId::new("run-1").expect("id")),
        };
        let result =
            write(&mut store, &s, &target, &Change::Publish(vec![block])).expect("overlay");
        let revision = result.stored().expect("stored").revision;
        acknowledge(&mut ack, &format!("overlay {revision}"));
        if i % 5 == 0 {
            // Keep the overlay small: retract rows written before.
            let old: Vec<BlockKey> = result
                .stored()
                .expect("stored")
                .blocks
                .iter()
                .map(|b| b.block.key())
                .take(3)
                .collect();
            let r = write(&mut store, &s, &target, &Change::Retract(old)).expect("retract");
            if let Some(st) = r.stored() {
                acknowledge(&mut ack, &format!("overlay {}", st.revision));
            }
        }
    }
    unreachable!("the writer loops until it is killed")
}

fn check(db: &std::path::Path, log: &std::path::Path, last_counter: &mut u64) -> Check {
    let mut store = SqliteStore::open(db, settings()).map_err(|e| e.to_string())?;
    let c = store.connection();
    let ok: String = c
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .map_err(|e| e.to_string())?;
    if ok != "ok" {
        return Err(format!("integrity check: {ok}"));
    }
    // No half submit.
    let orphans: i64 = c
        .query_row(
            "SELECT count(*) FROM workspace_chat_outbox_operation_identity i
             WHERE i.removed = 0 AND NOT EXISTS (SELECT 1 FROM workspace_chat_outbox o
                 WHERE o.session_id = i.session_id AND o.operation_id = i.operation_id)",
            [],
            |r| r.get(0),
        )
        .map_err(|e| e.to_string())?;
    let strays: i64 = c
        .query_row(
            "SELECT count(*) FROM workspace_chat_outbox o
             WHERE NOT EXISTS (SELECT 1 FROM workspace_chat_outbox_operation_identity i
                 WHERE o.session_id = i.session_id AND o.operation_id = i.operation_id)",
            [],
            |r| r.get(0),
        )
        .map_err(|e| e.to_string())?;
    if orphans != 0 || strays != 0 {
        return Err(format!(
            "half submits: {orphans} identities without entry, {strays} entries without identity"
        ));
    }
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut ledger_acked: HashMap<String, u8> = HashMap::new();
    let mut max_revision = 0u64;
    let s = session();
    for line in text.lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        match parts.as_slice() {
            ["submit", op] => {
                let id = OperationId::new(*op).map_err(|e| e.to_string())?;
                let identity = store.identity(&s, &id).map_err(|e| e.to_string())?;
                let Some(identity) = identity else {
                    return Err(format!("acknowledged submit {op} is gone"));
                };
                if identity.removed {
                    let sent = store
                        .ledger(&ScopeId::of(&s), &id)
                        .map_err(|e| e.to_string())?;
                    if sent.map(|l| l.status) != Some(LedgerStatus::Sent) {
                        return Err(format!("{op} was removed without a sent proof"));
                    }
                }
            }
            ["ledger", op, strength] => {
                let Ok(st) = strength.parse::<u8>() else {
                    continue;
                };
                let e = ledger_acked.entry((*op).to_owned()).or_insert(0);
                *e = (*e).max(st);
            }
            ["overlay", rev] => {
                let Ok(rev) = rev.parse::<u64>() else {
                    continue;
                };
                max_revision = max_revision.max(rev);
            }
            // A line is written with one write after its commit; anything else was never
            // acknowledged whole.
            _ => {}
        }
    }
    for (op, acked) in ledger_acked {
        let id = OperationId::new(op.clone()).map_err(|e| e.to_string())?;
        let now = store
            .ledger(&ScopeId::of(&s), &id)
            .map_err(|e| e.to_string())?
            .map(|l| l.status.strength());
        if now.unwrap_or(0) < acked {
            return Err(format!("ledger of {op} weaker than acknowledged"));
        }
    }
    let counter = store.current_revision().map_err(|e| e.to_string())?;
    if counter < max_revision {
        return Err(format!(
            "revision counter {counter} behind acknowledged {max_revision}"
        ));
    }
    if counter < *last_counter {
        return Err(format!(
            "revision counter went back from {last_counter} to {counter}"
        ));
    }
    let overlay = store
        .load(&s, &TargetId::new("s1").map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    if let Some(o) = overlay {
        if o.revision != counter {
            return Err(format!(
                "overlay revision {} is not the counter {counter}",
                o.revision
            ));
        }
    }
    *last_counter = counter;
    Ok(())
}

fn main() {
    if let (Ok(db), Ok(log), Ok(round)) = (
        std::env::var(CHILD_DB),
        std::env::var(CHILD_LOG),
        std::env::var(CHILD_ROUND),
    ) {
        child(&db, &log, &round);
    }
    let kills: u32 = std::env::var("CRASH_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let mut seed: u64 = std::env::var("CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed_c0de);
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("crash.sqlite");
    let log = dir.path().join("acks.log");
    drop(SqliteStore::open(&db, settings()).expect("create"));
    let exe = std::env::current_exe().expect("exe");
    let mut last_counter = 0;
    let mut failures = Vec::new();
    for round in 0..kills {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let wait = Duration::from_millis(5 + (seed >> 33) % 60);
        let mut child = Command::new(&exe)
            .env(CHILD_DB, &db)
            .env(CHILD_LOG, &log)
            .env(CHILD_ROUND, round.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn");
        std::thread::sleep(wait);
        // SIGKILL: no destructor, no flush, no rollback.
        child.kill().expect("kill");
        child.wait().expect("wait");
        if let Err(e) = check(&db, &log, &mut last_counter) {
            failures.push(format!("after kill {round} ({wait:?}): {e}"));
        }
    }
    let acked = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .count();
    println!("crash safety: {kills} kills, {acked} acknowledged writes, counter {last_counter}");
    if acked == 0 {
        failures.push("the writer never acknowledged a write; the harness proved nothing".into());
    }
    // Both ways an ID is stored were written and checked: UUIDs as bytes, others as text.
    let kinds: Vec<String> = SqliteStore::open(&db, settings())
        .expect("reopen")
        .connection()
        .prepare(
            "SELECT DISTINCT typeof(operation_id) FROM workspace_chat_outbox_operation_identity
             ORDER BY 1",
        )
        .and_then(|mut stmt| stmt.query_map([], |r| r.get(0))?.collect())
        .expect("kinds");
    if kinds != ["blob", "text"] {
        failures.push(format!(
            "operation IDs stored as {kinds:?}, not as both blob and text"
        ));
    }
    if !failures.is_empty() {
        eprintln!("crash safety failed:\n{}", failures.join("\n"));
        std::process::exit(1);
    }
}
