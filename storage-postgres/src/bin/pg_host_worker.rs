//! A host-like process for the multi-host tests of `storage-postgres`: it connects to
//! the database named by `PG_WORKER_URL` (schema `PG_WORKER_SCHEMA`), prints `ready`,
//! waits for a line on standard input so that all workers start together, then races
//! the others at one job and prints one line per outcome, after the outcome committed.
//!
//! `pg_host_worker <job> [key=value ...]`, where job is one of:
//!
//! - `submit ops=N conflict=0|1 tag=T`: claims operations `op-0` .. `op-N-1` of session
//!   `race` (`claimed op` or `existing op same|other`); with `conflict=1` each worker's
//!   request differs, so a loser's request conflicts with the winner's.
//! - `overlay writes=N tag=T delete_every=K`: publishes rows `T-i` to one target through
//!   `update` and, every third write, through a compare-and-set loop (`write rev epoch
//!   row`), deleting the target every K writes (`delete true|false`).
//! - `runs sessions=N tag=T`: starts run `run-T-i` in session `run-s-i` (`started i` or
//!   `refused i reason`).
//! - `own sessions=N tag=T veto=0|1`: starts runs in every session, prints `owned`, then
//!   heartbeats until killed.
//! - `drain appends=N tag=T`: with fencing on, appends N entries to session `drain`,
//!   each at the position after the last (a read, then a write: only safe while one
//!   host drains the session), under the session's lease, and now and then stalls past
//!   its lease before writing (`append token position`, `fenced`).
//! - `writer pause_ms=P tag=T`: submits, hands off, confirms and writes the overlay until
//!   killed (`begin op`, `submit op`, `ledger op strength`, `overlay revision`); with
//!   `pause_ms` every commit waits that long first.
//!
//! Lease timings come from `stale_ms`, `run_lease_ms` and `session_lease_ms`.

use outbox_core::ids::ScopeId;
use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::time::Duration;

use outbox_core::entry::{Controls, MessageRequest, OutboxEntry};
use outbox_core::fingerprint::request_fingerprint;
use outbox_core::ids::{OperationId, QueueId, RunId, SessionId};
use outbox_core::ledger::{LedgerRecord, LedgerStatus};
use outbox_core::store::{Claim, OutboxError, OutboxStore};
use overlay_core::overlay::Change;
use overlay_core::store::write;
use overlay_core::store::{OverlayError, OverlayStore, RowClass, StoredBlock};
use storage_postgres::hosts::LeaseError;
use storage_postgres::{ConnectOptions, HostId, PostgresStore, RunStartError, Settings};
use timeline_core::block::Block;
use timeline_core::key::{BlockKey, BlockType, TargetId};
use timeline_core::time::Millis;

type Failure = Box<dyn std::error::Error>;

/// The job's options.
struct Options(HashMap<String, String>);

impl Options {
    fn number(&self, key: &str, default: u64) -> Result<u64, Failure> {
        match self.0.get(key) {
            Some(v) => Ok(v.parse()?),
            None => Ok(default),
        }
    }

    fn text(&self, key: &str, default: &str) -> String {
        self.0
            .get(key)
            .cloned()
            .unwrap_or_else(|| default.to_owned())
    }
}

/// One line of output, whole, flushed at once.
fn say(line: &str) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    out.write_all(format!("{line}\n").as_bytes())?;
    out.flush()?;
    Ok(())
}

fn session(id: &str) -> Result<SessionId, Failure> {
    Ok(SessionId::new(id)?)
}

fn entry(op: &str, text: &str, position: i64) -> Result<OutboxEntry, Failure> {
    Ok(OutboxEntry::queued(
        QueueId::new(format!("q-{op}"))?,
        OperationId::new(op)?,
        MessageRequest::text(text, "composer", Millis(1)),
        Controls::enqueue(),
        position,
    ))
}

fn row(id: &str) -> Result<StoredBlock, Failure> {
    Ok(StoredBlock {
        block: Block::new(BlockKey::parse(BlockType::AgentReply, id)?, Millis(1)),
        class: RowClass::Ordinary,
        run_id: None,
    })
}

fn submit(store: &mut PostgresStore, o: &Options) -> Result<(), Failure> {
    let s = session("race")?;
    let tag = o.text("tag", "w");
    let text = if o.number("conflict", 0)? == 1 {
        format!("from {tag}")
    } else {
        "hello".to_owned()
    };
    for i in 0..o.number("ops", 100)? {
        let op = format!("op-{i}");
        let e = entry(&op, &text, i64::try_from(i)?)?;
        let print = request_fingerprint(&s, &e.queue_id, &e.request);
        let claim = if i % 2 == 0 {
            store.claim(&s, &print, &e)?
        } else {
            let record = LedgerRecord::new(LedgerStatus::Sending, Millis(i));
            store.claim_sending(&s, &print, &e, &ScopeId::of(&s), &record)?
        };
        match claim {
            Claim::Claimed => say(&format!("claimed {op}"))?,
            Claim::Existing(identity) => {
                let same = if identity.fingerprint == print {
                    "same"
                } else {
                    "other"
                };
                say(&format!("existing {op} {same}"))?
            }
        }
    }
    Ok(())
}

fn overlay(store: &mut PostgresStore, o: &Options) -> Result<(), Failure> {
    let s = session("race")?;
    let target = TargetId::new("shared")?;
    let tag = o.text("tag", "w");
    let delete_every = o.number("delete_every", 0)?;
    for i in 0..o.number("writes", 100)? {
        let id = format!("{tag}-{i}");
        let stored = if i % 3 == 2 {
            // The whole-overlay compare-and-set, retried against what is stored.
            loop {
                let now = store.load(&s, &target)?;
                let (expected, epoch, mut blocks) = match now {
                    Some(n) => (Some(n.revision), n.settlement_epoch, n.blocks),
                    None => (None, 0, Vec::new()),
                };
                blocks.push(row(&id)?);
                match store.compare_and_set(&s, &target, expected, epoch, blocks) {
                    Ok(stored) => break stored,
                    Err(OverlayError::Stale { .. }) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
        } else {
            let result = write(store, &s, &target, &Change::Publish(vec![row(&id)?]))?;
            result
                .stored()
                .ok_or("a publish of a new row changed nothing")?
                .clone()
        };
        say(&format!(
            "write {} {} {id}",
            stored.revision, stored.settlement_epoch
        ))?;
        if delete_every > 0 && i % delete_every == delete_every - 1 {
            say(&format!("delete {}", store.delete(&s, &target)?))?;
        }
    }
    Ok(())
}

fn never(_: &SessionId, _: &RunId) -> bool {
    false
}

fn runs(store: &mut PostgresStore, host: &HostId, o: &Options) -> Result<(), Failure> {
    let tag = o.text("tag", "w");
    for i in 0..o.number("sessions", 20)? {
        let s = session(&format!("run-s-{i}"))?;
        let run = RunId::new(format!("run-{tag}-{i}"))?;
        match store.start_run(host, &s, &run, None, None, &never) {
            Ok(()) => say(&format!("started {i}"))?,
            Err(RunStartError::Refused(why)) => say(&format!("refused {i} {why}"))?,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn own(store: &mut PostgresStore, host: &HostId, o: &Options) -> Result<(), Failure> {
    let tag = o.text("tag", "w");
    for i in 0..o.number("sessions", 20)? {
        let s = session(&format!("run-s-{i}"))?;
        store.start_run(
            host,
            &s,
            &RunId::new(format!("run-{tag}-{i}"))?,
            None,
            None,
            &never,
        )?;
    }
    say("owned")?;
    let veto = o.number("veto", 1)? == 1;
    let keep = move |_: &SessionId, _: &RunId| veto;
    let pause = Duration::from_millis(o.number("run_lease_ms", 15_000)? / 4);
    loop {
        store.heartbeat(host, &keep)?;
        std::thread::sleep(pause);
    }
}

fn drain(store: &mut PostgresStore, host: &HostId, o: &Options) -> Result<(), Failure> {
    let s = session("drain")?;
    let tag = o.text("tag", "w");
    let lease = Duration::from_millis(o.number("session_lease_ms", 15_000)?);
    store.set_fencing(true);
    let (mut done, mut attempt) = (0, 0u64);
    let goal = o.number("appends", 20)?;
    while done < goal {
        let held = match store.acquire_session(host, &s) {
            Ok(lease) => lease,
            Err(LeaseError::Busy(_)) => {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        for _ in 0..3 {
            attempt += 1;
            // A read, then a write that depends on it: what custody does with the
            // outbox it keeps in memory.
            let position = i64::try_from(store.entries(&s)?.len())?;
            if attempt % 5 == 0 {
                // A host that stalls past its lease (a pause, a lost network).
                std::thread::sleep(lease + Duration::from_millis(30));
            }
            let op = format!("{tag}-{attempt}");
            let e = entry(&op, "drained", position)?;
            let print = request_fingerprint(&s, &e.queue_id, &e.request);
            match store.claim(&s, &print, &e) {
                Ok(Claim::Claimed) => {
                    done += 1;
                    say(&format!("append {} {position} {op}", held.token))?;
                }
                Ok(Claim::Existing(_)) => return Err("a fresh operation existed".into()),
                Err(OutboxError::LeaseLost { .. }) => {
                    say(&format!("fenced {op}"))?;
                    break;
                }
                Err(e) => return Err(e.into()),
            }
            if done == goal {
                break;
            }
        }
        if let Err(e) = store.release_session(&held) {
            return Err(e.into());
        }
    }
    Ok(())
}

fn writer(store: &mut PostgresStore, o: &Options) -> Result<(), Failure> {
    let pause = o.number("pause_ms", 0)?;
    if pause > 0 {
        store.pause_before_commit(Some(Duration::from_millis(pause)));
    }
    let s = session("s1")?;
    let target = TargetId::new("s1")?;
    let tag = o.text("tag", "w");
    for i in 0u64.. {
        let op = format!("op-{tag}-{i}");
        let e = entry(&op, &format!("message {op}"), 0)?;
        let print = request_fingerprint(&s, &e.queue_id, &e.request);
        say(&format!("begin {op}"))?;
        let record = LedgerRecord::new(LedgerStatus::Sending, Millis(i));
        store.claim_sending(&s, &print, &e, &ScopeId::of(&s), &record)?;
        say(&format!("submit {op}"))?;
        say(&format!("ledger {op} {}", LedgerStatus::Sending.strength()))?;
        if i % 3 == 0 {
            let sent = LedgerRecord::new(LedgerStatus::Sent, Millis(i));
            store.confirm_sent(
                &ScopeId::of(&s),
                std::slice::from_ref(&s),
                &e.operation_id,
                &sent,
            )?;
            say(&format!("ledger {op} {}", LedgerStatus::Sent.strength()))?;
        }
        let result = write(store, &s, &target, &Change::Publish(vec![row(&op)?]))?;
        if let Some(st) = result.stored() {
            say(&format!("overlay {}", st.revision))?;
        }
        if i % 5 == 4 {
            let old: Vec<BlockKey> = result
                .stored()
                .map(|st| st.blocks.iter().map(|b| b.block.key()).take(3).collect())
                .unwrap_or_default();
            if let Some(st) = write(store, &s, &target, &Change::Retract(old))?.stored() {
                say(&format!("overlay {}", st.revision))?;
            }
        }
    }
    Ok(())
}

fn main() -> Result<(), Failure> {
    let mut args = std::env::args().skip(1);
    let job = args
        .next()
        .ok_or("usage: pg_host_worker <job> [key=value ...]")?;
    let options = Options(
        args.filter_map(|a| a.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
            .collect(),
    );
    let url = std::env::var("PG_WORKER_URL")?;
    let schema = std::env::var("PG_WORKER_SCHEMA")?;
    let connect = ConnectOptions::parse(&url)?.options(&format!("-c search_path={schema}"));
    let tag = options.text("tag", "w");
    let mut settings = Settings::default();
    settings.application_name = format!("pg_host_worker {job} {tag}");
    settings.leases.stale_after = Duration::from_millis(options.number("stale_ms", 45_000)?);
    settings.leases.run_lease = Duration::from_millis(options.number("run_lease_ms", 15_000)?);
    settings.leases.session_lease =
        Duration::from_millis(options.number("session_lease_ms", 15_000)?);
    let mut store = PostgresStore::open(connect, settings)?;
    let host = HostId::new(format!("host-{tag}"))?;
    say("ready")?;
    let mut go = String::new();
    std::io::stdin().lock().read_line(&mut go)?;
    match job.as_str() {
        "submit" => submit(&mut store, &options)?,
        "overlay" => overlay(&mut store, &options)?,
        "runs" => runs(&mut store, &host, &options)?,
        "own" => own(&mut store, &host, &options)?,
        "drain" => drain(&mut store, &host, &options)?,
        "writer" => writer(&mut store, &options)?,
        other => return Err(format!("unknown job {other}").into()),
    }
    say("done")
}
