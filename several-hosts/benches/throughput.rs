//! Messages per second through one host and through three on the same PostgreSQL
//! database: the same sessions and messages each time (clients send each session's
//! messages one after another, through whichever host serves it), timed from the first
//! submit until the agents were given every message. A paired runner: both runs in one
//! process, on one cluster, one after the other, `ROUNDS` times each, alternating.
//!
//! `cargo bench -p several-hosts` (`SEVERAL_HOSTS_MESSAGES` per session, default 25).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::{submit, Client, World};

const SESSIONS: usize = 12;
const ROUNDS: usize = 2;

fn messages() -> usize {
    std::env::var("SEVERAL_HOSTS_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(25)
}

/// One run with `hosts` hosts: messages per second.
async fn run(hosts: usize, tag: &str) -> f64 {
    let world = World::new(3_000, 0, SESSIONS);
    let pg = world.tcp(world.port());
    let mut procs: Vec<_> = (0..hosts)
        .map(|i| world.host(&format!("{tag}-h{i}"), &pg))
        .collect();
    let addresses: Vec<String> = procs.iter().map(|h| h.address.clone()).collect();
    let per = messages();
    let start = Instant::now();
    let mut clients = Vec::new();
    for s in 0..SESSIONS {
        let addresses = addresses.clone();
        clients.push(tokio::spawn(async move {
            let mut client = Client::default();
            let session = format!("s{s}");
            for m in 0..per {
                let op = format!("op-{session}-{m}");
                let params = submit(&session, &op, &format!("message {m}"));
                let deadline = Instant::now() + Duration::from_secs(60);
                client
                    .call(
                        &addresses,
                        &session,
                        "run.chatOutboxSubmit",
                        &params,
                        deadline,
                    )
                    .await
                    .unwrap();
            }
        }));
    }
    for c in clients {
        c.await.unwrap();
    }
    let total = SESSIONS * per;
    let deadline = Instant::now() + Duration::from_secs(120);
    while several_hosts::read_log(&world.log()).unwrap().len() < total {
        assert!(Instant::now() < deadline, "the messages were not all given");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = start.elapsed();
    for p in &mut procs {
        p.stop();
    }
    total as f64 / took.as_secs_f64()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut one = Vec::new();
    let mut three = Vec::new();
    for round in 0..ROUNDS {
        one.push(run(1, &format!("r{round}a")).await);
        three.push(run(3, &format!("r{round}b")).await);
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!(
        "{SESSIONS} sessions x {} messages: one host {:.0} msg/s {one:.0?}, three hosts {:.0} \
         msg/s {three:.0?}; three against one {:.2}x",
        messages(),
        mean(&one),
        mean(&three),
        mean(&three) / mean(&one)
    );
}
