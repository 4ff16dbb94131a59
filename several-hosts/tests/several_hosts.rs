//! Several host processes on one PostgreSQL database, with a scripted agent that logs
//! every message it is given into a file all hosts share (MH-01 to MH-05): hosts killed
//! mid-turn, a host cut off from the database and back, clients that follow their
//! sessions from host to host. Loopback only; every wait is bounded.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::{submit, Client, HostProc, Proxy, World};
use outbox_core::entry::UNCONFIRMED_TEXT;
use several_hosts::{read_log, read_stops};

/// Waits until `done`, or fails with `what` after `limit`.
async fn eventually(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The operations the log holds for each session, in the order given, and those given
/// more than once.
fn given(world: &World) -> (BTreeMap<String, Vec<String>>, Vec<String>) {
    let mut by_session: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    let mut twice = Vec::new();
    for g in read_log(&world.log()).unwrap() {
        if !seen.insert(g.operation.clone()) {
            twice.push(g.operation.clone());
        }
        by_session.entry(g.session).or_default().push(g.operation);
    }
    (by_session, twice)
}

/// The (type, id) of every row of `session`'s latest window, loaded at the host that
/// serves it, and the operations of its user rows in order.
async fn timeline(
    client: &mut Client,
    hosts: &[String],
    session: &str,
) -> (BTreeSet<(String, String)>, Vec<String>) {
    let window = client
        .call(
            hosts,
            session,
            "run.chatLoad",
            &serde_json::json!({ "appSessionId": session, "pageSize": 100 }),
            Instant::now() + Duration::from_secs(30),
        )
        .await
        .unwrap();
    let blocks = window["blocks"]
        .as_array()
        .unwrap_or_else(|| panic!("no blocks in {window}"));
    let rows = blocks
        .iter()
        .map(|b| {
            (
                b["type"].as_str().unwrap_or_default().to_owned(),
                b["id"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let users = blocks
        .iter()
        .filter_map(|b| b["operationId"].as_str().map(str::to_owned))
        .collect();
    (rows, users)
}

/// What history shows for `ops`: each message's user row and reply.
fn history_rows(ops: &[String]) -> BTreeSet<(String, String)> {
    ops.iter()
        .flat_map(|op| {
            [
                ("user".to_owned(), format!("user-message::{op}")),
                ("agent-reply".to_owned(), format!("reply-{op}")),
            ]
        })
        .collect()
}

/// Messages a client of the kill test sends at most (it stops when told).
const MAX_MESSAGES: usize = 200;

// MH-01, MH-02, MH-05: three hosts, six sessions spread across them by the hosts the
// clients ask first; one host at a time SIGKILLed while its agent is mid-turn, and a
// new one started in its place, three times. Its sessions move to the others within
// the lease time (orphans taken up at the next tick after the lease lapsed); every
// acknowledged message is given to an agent exactly once (an in-flight send is found
// in history by the new owner, never sent again); every session's timeline, loaded
// again from its owner, equals its history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_killed_mid_turn_lose_nothing_and_send_nothing_twice() {
    let lease_ms = 1_500;
    let world = World::new(lease_ms, 300, 6);
    let pg = world.tcp(world.port());
    let mut hosts: Vec<HostProc> = (0..3).map(|i| world.host(&format!("h{i}"), &pg)).collect();
    let addresses =
        |hosts: &[HostProc]| -> Vec<String> { hosts.iter().map(|h| h.address.clone()).collect() };

    // Clients: each session gets messages one after another through whichever host
    // serves it; each retried with the same operation until acknowledged.
    let (tx, mut acked) = tokio::sync::mpsc::unbounded_channel::<String>();
    let book = std::sync::Arc::new(std::sync::Mutex::new(addresses(&hosts)));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = Vec::new();
    for s in 0..world.sessions {
        let (tx, book) = (tx.clone(), std::sync::Arc::clone(&book));
        let done = std::sync::Arc::clone(&done);
        clients.push(tokio::spawn(async move {
            let mut client = Client::default();
            let session = format!("s{s}");
            for m in 0..MAX_MESSAGES {
                if done.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let op = format!("op-{session}-{m}");
                let params = submit(&session, &op, &format!("message {m} of {session}"));
                let deadline = Instant::now() + Duration::from_secs(40);
                let hosts: Vec<String> = book.lock().unwrap().clone();
                match client
                    .call(&hosts, &session, "run.chatOutboxSubmit", &params, deadline)
                    .await
                {
                    Ok(_) => tx.send(op).unwrap(),
                    Err(e) => panic!("{op} was never acknowledged: {e}"),
                }
                tokio::time::sleep(Duration::from_millis(120)).await;
            }
            (client.redirects, client.failures)
        }));
    }
    drop(tx);

    // Three kills, each while the victim's agent is mid-turn.
    let mut takeovers = Vec::new();
    let mut killed_hosts = BTreeSet::new();
    let mut runs_left = 0;
    for round in 0..3 {
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        let holders = world.holders();
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for h in holders.values() {
            *counts.entry(h.as_str()).or_default() += 1;
        }
        let victim = hosts
            .iter()
            .position(|h| counts.contains_key(h.name.as_str()))
            .expect("some live host holds a session");
        let name = hosts[victim].name.clone();
        let held: Vec<String> = holders
            .iter()
            .filter(|(_, h)| **h == name)
            .map(|(s, _)| s.clone())
            .collect();
        // Mid-turn: right after its agent was given a message (a turn lasts 300 ms).
        let before = read_log(&world.log()).unwrap().len();
        eprintln!("round {round}: killing {name}, holding {held:?}; {before} given so far");
        eventually(
            "the victim's agent is given a message",
            Duration::from_secs(20),
            || {
                read_log(&world.log())
                    .unwrap()
                    .iter()
                    .skip(before)
                    .any(|g| g.host == name)
            },
        )
        .await;
        hosts[victim].kill();
        let killed = Instant::now();
        killed_hosts.insert(name.clone());
        runs_left += world
            .query("SELECT host_id FROM chat_active_runs", None)
            .iter()
            .filter(|r| r[0] == name)
            .count();
        let replacement = world.host(&format!("h{}", 3 + round), &pg);
        hosts[victim] = replacement;
        *book.lock().unwrap() = addresses(&hosts);
        eventually(
            "the victim's sessions are served again",
            Duration::from_secs(15),
            || {
                let now = world.holders();
                held.iter().all(|s| now.get(s).is_some_and(|h| *h != name))
            },
        )
        .await;
        takeovers.push((held.len(), killed.elapsed()));
        eprintln!("round {round}: now {:?}", world.holders());
    }

    // A while after the last kill, the clients stop.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut redirects = 0;
    for c in clients {
        let (r, _) = c.await.unwrap();
        redirects += r;
    }
    let mut ops = BTreeSet::new();
    while let Some(op) = acked.recv().await {
        ops.insert(op);
    }
    assert!(
        ops.len() < world.sessions * MAX_MESSAGES,
        "the clients ran out of messages"
    );

    // Every acknowledged message given, none twice, nothing given that was not sent.
    // A message handed to the agent by a host killed before the agent logged it is
    // in no history: the new owner cannot tell whether it was taken, so it holds it for
    // the user (never sends it again by itself). Every other one is given.
    let deadline = Instant::now() + Duration::from_secs(30);
    let held = loop {
        let (by_session, _) = given(&world);
        let all: BTreeSet<&String> = by_session.values().flatten().collect();
        let held: BTreeSet<String> = world
            .query(
                "SELECT operation_id, entry_json FROM workspace_chat_outbox",
                None,
            )
            .into_iter()
            .filter(|r| r[1].contains(UNCONFIRMED_TEXT))
            .map(|r| r[0].clone())
            .collect();
        let missing: Vec<&String> = ops
            .iter()
            .filter(|op| !all.contains(op) && !held.contains(*op))
            .collect();
        if missing.is_empty() {
            break held;
        }
        assert!(
            Instant::now() < deadline,
            "acknowledged and never given: {missing:?}; saved: {:?}; ledger: {:?}; leases: {:?}",
            world.query(
                "SELECT session_id, operation_id, left(entry_json, 300) FROM workspace_chat_outbox",
                None
            ),
            world.query(
                "SELECT app_session_id, operation_id, status FROM chat_operation_ledger \
                 WHERE status <> 'sent'",
                None
            ),
            world.holders(),
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (by_session, twice) = given(&world);
    assert!(twice.is_empty(), "given twice: {twice:?}");
    let all: BTreeSet<String> = by_session.values().flatten().cloned().collect();
    assert!(
        all.is_subset(&ops),
        "given and never acknowledged: {:?}",
        all.difference(&ops)
    );
    assert!(
        held.is_disjoint(&all),
        "held for the user and given: {held:?}"
    );
    assert_eq!(all.len() + held.len(), ops.len());

    // MH-03, OB-14: the runs the killed hosts left in the shared registry were adopted
    // by the sessions' new owners and reclaimed once they could be; none is left.
    eventually(
        "the killed hosts' runs are reclaimed",
        Duration::from_secs(10),
        || {
            world
                .query("SELECT host_id FROM chat_active_runs", None)
                .iter()
                .all(|r| !killed_hosts.contains(&r[0]))
        },
    )
    .await;

    // Every timeline, loaded from the session's owner, equals its history.
    let now: Vec<String> = addresses(&hosts);
    let mut client = Client::default();
    for (session, ops) in &by_session {
        let (rows, users) = timeline(&mut client, &now, session).await;
        assert_eq!(rows, history_rows(ops), "{session}: rows against history");
        assert_eq!(&users, ops, "{session}: messages in the order given");
    }
    for (sessions, took) in &takeovers {
        assert!(
            *took < Duration::from_millis(lease_ms * 3),
            "{sessions} sessions took {took:?} to move (lease {lease_ms} ms)"
        );
    }
    eprintln!(
        "takeovers after a kill (sessions, time), lease {lease_ms} ms: {takeovers:?}; \
         {redirects} redirects; {} of {} messages held for the user; {runs_left} runs \
         left by the killed hosts, all reclaimed",
        held.len(),
        ops.len()
    );
    assert!(
        runs_left > 0,
        "each host was killed mid-turn, so its run was left"
    );
    for h in &mut hosts {
        h.stop();
    }
}

// MH-01, MH-02, MH-03: a host cut off from the database while it holds a session (a
// proxy that stops forwarding): another host takes the session over once the lease
// lapsed; the first comes back, and the write it had started under the lost lease is
// refused by the fencing token: the message it was writing is neither saved nor given,
// and the phone joined to the session there is told it moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_cut_off_and_back_cannot_write_under_its_lost_lease() {
    let lease_ms = 1_500;
    let world = World::new(lease_ms, 100, 2);
    let proxy = Proxy::start(world.port());
    let mut cut = world.host("cut", &world.tcp(proxy.port));
    let mut other = world.host("other", &world.tcp(world.port()));
    let both = vec![cut.address.clone(), other.address.clone()];

    // s0 is taken up by the host asked first: the one behind the proxy.
    let mut client = Client::default();
    let first = client
        .call_at(
            &cut.address,
            "run.chatOutboxSubmit",
            &submit("s0", "op-before", "before the cut"),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert!(matches!(first, common::Answer::Result(_)));
    assert_eq!(world.holders().get("s0").map(String::as_str), Some("cut"));
    eventually(
        "the first message is given",
        Duration::from_secs(10),
        || given(&world).0.get("s0").is_some_and(|o| o.len() == 1),
    )
    .await;

    // A phone joined to s0 at the host that serves it.
    let mut phone = common::join(&cut.address, "s0").await;

    // Cut off: its submit hangs on the database, unanswered.
    proxy.pause(true);
    let late = client
        .call_at(
            &cut.address,
            "run.chatOutboxSubmit",
            &submit("s0", "op-late", "written after the lease was lost"),
            Duration::from_millis(500),
        )
        .await;
    assert!(late.is_err(), "a host cut off from the database answered");

    // The lease lapses; the other host takes the session up and serves it.
    let deadline = Instant::now() + Duration::from_secs(15);
    while world.holders().get("s0").map(String::as_str) != Some("other") {
        assert!(
            Instant::now() < deadline,
            "the other host did not take s0 up: {:?}\n{}",
            world.holders(),
            world.activity()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut second = Client::default();
    second
        .call(
            std::slice::from_ref(&other.address),
            "s0",
            "run.chatOutboxSubmit",
            &submit("s0", "op-after", "after the takeover"),
            Instant::now() + Duration::from_secs(20),
        )
        .await
        .unwrap();

    // Back: its late write reaches the database and is refused.
    proxy.pause(false);
    let mut third = Client::default();
    let elsewhere = third
        .call_at(
            &cut.address,
            "run.chatOutboxSubmit",
            &submit("s0", "op-late-2", "asked of the old owner"),
            Duration::from_secs(20),
        )
        .await
        .unwrap();
    let common::Answer::Error(error) = elsewhere else {
        panic!("the old owner accepted a message for a session it lost");
    };
    assert_eq!(error["data"]["errorCode"], "SESSION_ELSEWHERE", "{error}");
    assert_eq!(error["data"]["servedBy"]["host"], "other", "{error}");
    assert_eq!(error["data"]["servedBy"]["address"], other.address.as_str());
    // The phone joined at the old owner was told the session moved.
    let moved = common::notification(
        &mut phone,
        |v| v["method"] == "chat:session-moved",
        Duration::from_secs(20),
    )
    .await
    .unwrap();
    assert_eq!(moved["params"]["appSessionId"], "s0", "{moved}");

    eventually(
        "the message after the takeover is given",
        Duration::from_secs(10),
        || given(&world).0.get("s0").is_some_and(|o| o.len() >= 2),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let (by_session, twice) = given(&world);
    assert!(twice.is_empty(), "{twice:?}");
    assert_eq!(
        by_session.get("s0").cloned().unwrap_or_default(),
        vec!["op-before".to_owned(), "op-after".to_owned()],
        "the late message was given"
    );
    let saved: Vec<String> = world
        .query(
            "SELECT operation_id FROM workspace_chat_outbox_operation_identity \
             WHERE session_id = $1 \
             UNION SELECT operation_id FROM chat_operation_ledger WHERE app_session_id = $1",
            Some("s0"),
        )
        .into_iter()
        .map(|r| r[0].clone())
        .collect();
    assert!(
        !saved.iter().any(|op| op.starts_with("op-late")),
        "a write under the lost lease is visible: {saved:?}"
    );
    let (rows, _) = timeline(&mut second, &both, "s0").await;
    assert_eq!(
        rows,
        history_rows(&["op-before".to_owned(), "op-after".to_owned()])
    );
    cut.stop();
    other.stop();
}

// MH-04: a session message from a session one host serves to a session another host
// serves is written into the recipient's outbox in the database (under the sender's
// lease) and wakes the recipient's owner, whose agent is given it once; the sender's
// tool learns it was queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_message_reaches_a_session_another_host_serves() {
    let world = World::new(3_000, 100, 2);
    let pg = world.tcp(world.port());
    let mut a = world.host("a", &pg);
    let mut b = world.host("b", &pg);
    let mut client = Client::default();
    // s0 is taken up by a, s1 by b: the hosts asked first.
    for (host, session) in [(&a, "s0"), (&b, "s1")] {
        let op = format!("op-{session}-first");
        let answer = client
            .call_at(
                &host.address,
                "run.chatOutboxSubmit",
                &submit(session, &op, "first"),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
        assert!(matches!(answer, common::Answer::Result(_)));
    }
    let holders = world.holders();
    assert_eq!(holders.get("s0").map(String::as_str), Some("a"));
    assert_eq!(holders.get("s1").map(String::as_str), Some("b"));

    let told = client
        .call_at(
            &a.address,
            "run.chatOutboxSubmit",
            &submit("s0", "op-tell", "tell:s1:please run the build"),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert!(matches!(told, common::Answer::Result(_)));
    let log = world.log();
    let deadline = Instant::now() + Duration::from_secs(15);
    while !read_log(&log)
        .unwrap()
        .iter()
        .any(|g| g.session == "s1" && g.host == "b" && g.text.contains("please run the build"))
    {
        assert!(
            Instant::now() < deadline,
            "b's agent was not given the session message: given {:?}; tools {:?}; \
             outboxes {:?}; session messages {:?}",
            read_log(&log).unwrap(),
            several_hosts::read_tools(&log).unwrap(),
            world.query(
                "SELECT session_id, operation_id, left(entry_json, 400) FROM workspace_chat_outbox",
                None
            ),
            world.query(
                "SELECT operation_id, recipient_session_id, sender_session_id \
                 FROM chat_session_messages",
                None
            ),
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eventually(
        "the sender's tool learns the outcome",
        Duration::from_secs(10),
        || {
            several_hosts::read_tools(&log)
                .unwrap()
                .iter()
                .any(|[host, session, call, _]| {
                    host == "a" && session == "s0" && call == "call-op-tell"
                })
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let given = read_log(&log).unwrap();
    let to_s1: Vec<_> = given.iter().filter(|g| g.session == "s1").collect();
    assert_eq!(
        to_s1.len(),
        2,
        "the first message and the session message, once: {to_s1:?}"
    );
    assert!(
        to_s1.iter().all(|g| g.host == "b"),
        "only s1's owner gave it: {to_s1:?}"
    );
    let tools = several_hosts::read_tools(&log).unwrap();
    assert!(
        tools.iter().any(|t| t[3] == "Queued"),
        "the tool was told it was queued: {tools:?}"
    );
    a.stop();
    b.stop();
}

// MH-05, OB-15, MH-03: a stop begun on a host that is killed before its agent answers
// is resumed by the session's next owner: it stops the run through its own agent, the
// stop's row and the run leave the shared registry, and the message queued behind the
// run goes, once, from the new owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_begun_on_a_host_killed_before_it_ended_is_resumed_by_the_new_owner() {
    let lease_ms = 1_500;
    let world = World::new(lease_ms, 300, 1);
    let pg = world.tcp(world.port());
    let mut a = world.host("a", &pg);
    let mut client = Client::default();
    let deadline = Instant::now() + Duration::from_secs(20);
    let at_a = vec![a.address.clone()];
    let long = submit("s0", "op-1", "hold: a turn only a stop ends");
    client
        .call(&at_a, "s0", "run.chatOutboxSubmit", &long, deadline)
        .await
        .unwrap();
    eventually("a's agent is given op-1", Duration::from_secs(20), || {
        read_log(&world.log())
            .unwrap()
            .iter()
            .any(|g| g.operation == "op-1" && g.host == "a")
    })
    .await;
    let next = submit("s0", "op-2", "after the stop");
    client
        .call(&at_a, "s0", "run.chatOutboxSubmit", &next, deadline)
        .await
        .unwrap();
    let stop = serde_json::json!({"appSessionId": "s0", "idempotencyKey": "stop-1"});
    let asked = client
        .call_at(&a.address, "run.cancel", &stop, Duration::from_millis(500))
        .await;
    assert!(
        asked.is_err(),
        "a's agent holds the stop, so it is not answered yet"
    );
    eventually(
        "the stop is pending in the shared registry",
        Duration::from_secs(10),
        || world.query("SELECT host_id FROM chat_run_cancellations", None) == [["a"]],
    )
    .await;
    assert!(read_log(&world.log())
        .unwrap()
        .iter()
        .all(|g| g.operation != "op-2"));
    a.kill();

    let mut b = world.host("b", &pg);
    eventually("b resumes the stop", Duration::from_secs(15), || {
        read_stops(&world.log())
            .unwrap()
            .iter()
            .any(|[host, session, _, outcome]| {
                host == "b" && session == "s0" && outcome == "stopped"
            })
    })
    .await;
    eventually("op-2 is given by b", Duration::from_secs(15), || {
        read_log(&world.log())
            .unwrap()
            .iter()
            .any(|g| g.operation == "op-2" && g.host == "b")
    })
    .await;
    let given = read_log(&world.log()).unwrap();
    for op in ["op-1", "op-2"] {
        assert_eq!(
            given.iter().filter(|g| g.operation == op).count(),
            1,
            "{op} given once: {given:?}"
        );
    }
    let stops = read_stops(&world.log()).unwrap();
    assert_eq!(stops.len(), 2, "asked once on each host: {stops:?}");
    assert_eq!(stops[0][2], stops[1][2], "the same run");
    assert!(world
        .query("SELECT host_id FROM chat_run_cancellations", None)
        .is_empty());
    assert!(world
        .query("SELECT host_id FROM chat_active_runs", None)
        .iter()
        .all(|r| r[0] != "a"));
    b.stop();
}
