//! Submit throughput on a real server, in one run: a raw single-row `INSERT` commit on
//! one connection, this library's submit (`OutboxStore::claim`: identity and entry in
//! one transaction) on one connection, and the same submit from 16 connections at once,
//! each to its own session (PostgreSQL group-commits concurrent transactions; the
//! library must not serialize them).
//!
//! `cargo run --release -p storage-postgres --example throughput -- 'host=/run/postgresql
//! user=postgres dbname=postgres' [seconds]` (or `DATABASE_URL`). It works in a schema
//! of its own and drops it at the end. Run it against a server with `fsync` on: the
//! figures are commit rates.

use std::time::{Duration, Instant};

use outbox_core::entry::{Controls, MessageRequest, OutboxEntry};
use outbox_core::fingerprint::request_fingerprint;
use outbox_core::ids::{OperationId, QueueId, SessionId};
use outbox_core::store::OutboxStore;
use storage_postgres::{ConnectOptions, PostgresStore, Settings};
use timeline_core::time::Millis;

type Failure = Box<dyn std::error::Error + Send + Sync>;

/// The driver's settings, for the raw `INSERT`.
fn config(url: &str, schema: &str) -> Result<postgres::Config, Failure> {
    let mut config: postgres::Config = url.parse()?;
    config.options(&format!("-c search_path={schema}"));
    Ok(config)
}

/// This library's options, for the stores.
fn options(url: &str, schema: &str) -> Result<ConnectOptions, Failure> {
    Ok(ConnectOptions::parse(url)?.options(&format!("-c search_path={schema}")))
}

/// Submits to `session` for `run`; how many.
fn submits(store: &mut PostgresStore, session: &str, run: Duration) -> Result<u64, Failure> {
    let s = SessionId::new(session)?;
    let end = Instant::now() + run;
    let mut n = 0u64;
    while Instant::now() < end {
        let op = format!("{session}-{n}");
        let entry = OutboxEntry::queued(
            QueueId::new(format!("q-{op}"))?,
            OperationId::new(op.clone())?,
            MessageRequest::text(format!("message {op}"), "composer", Millis(n)),
            Controls::enqueue(),
            i64::try_from(n)?,
        );
        let print = request_fingerprint(&s, &entry.queue_id, &entry.request);
        store.claim(&s, &print, &entry)?;
        n += 1;
    }
    Ok(n)
}

fn main() -> Result<(), Failure> {
    let mut args = std::env::args().skip(1);
    let url = match args.next() {
        Some(url) => url,
        None => std::env::var("DATABASE_URL")
            .map_err(|_| "give a connection string or set DATABASE_URL")?,
    };
    let seconds: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(3);
    let run = Duration::from_secs(seconds);
    let schema = format!("throughput_{}", std::process::id());
    let mut admin = postgres::Client::connect(&url, postgres::NoTls)?;
    admin.batch_execute(&format!(
        "CREATE SCHEMA {schema};
         CREATE TABLE {schema}.raw_insert (k BIGINT PRIMARY KEY, v TEXT NOT NULL)"
    ))?;

    let mut raw = config(&url, &schema)?.connect(postgres::NoTls)?;
    let insert = raw.prepare("INSERT INTO raw_insert (k, v) VALUES ($1, $2)")?;
    let end = Instant::now() + run;
    let mut raw_n = 0i64;
    while Instant::now() < end {
        raw.execute(
            &insert,
            &[&raw_n, &"a message of a few dozen bytes, like a submit"],
        )?;
        raw_n += 1;
    }
    let raw_rate = raw_n as f64 / run.as_secs_f64();

    let mut one = PostgresStore::open(options(&url, &schema)?, Settings::default())?;
    let one_rate = submits(&mut one, "solo", run)? as f64 / run.as_secs_f64();

    let connections = 16;
    let mut stores = Vec::with_capacity(connections);
    for _ in 0..connections {
        stores.push(PostgresStore::open(
            options(&url, &schema)?,
            Settings::default(),
        )?);
    }
    let total: u64 = std::thread::scope(|scope| {
        let handles: Vec<_> = stores
            .iter_mut()
            .enumerate()
            .map(|(i, store)| scope.spawn(move || submits(store, &format!("many-{i}"), run)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| Failure::from("a thread panicked"))?)
            .sum::<Result<u64, Failure>>()
    })?;
    let many_rate = total as f64 / run.as_secs_f64();

    admin.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))?;
    println!("raw single-row INSERT commit, 1 connection: {raw_rate:>9.0} /s");
    println!(
        "submit (claim), 1 connection:               {one_rate:>9.0} /s  ({:.2}x raw)",
        one_rate / raw_rate
    );
    println!(
        "submit (claim), {connections} connections:              {many_rate:>9.0} /s  ({:.2}x one connection)",
        many_rate / one_rate
    );
    Ok(())
}
