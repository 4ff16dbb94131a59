//! Several host processes on one database (ST-03, OB-03, OB-14, OV-02): two or three
//! processes of `pg_host_worker` start together (each waits for a line on its standard
//! input) and race submits, overlay writes, run starts, reclaims and drains on one
//! schema; a kill test SIGKILLs a writer in the middle of its transactions and checks
//! that nothing acknowledged is lost and nothing is half-written.
//!
//! A worker prints a line only after the outcome it reports committed, exactly as a
//! host answers only after its transaction.
#![allow(clippy::unwrap_used)]

mod support;

use outbox_core::ids::ScopeId;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use outbox_core::entry::RUN_IN_PROGRESS_TEXT;
use outbox_core::ids::{OperationId, SessionId};
use outbox_core::ledger::LedgerStatus;
use outbox_core::store::OutboxStore;
use overlay_core::store::OverlayStore;
use support::TestDb;
use timeline_core::key::TargetId;

/// One worker process and the lines it printed.
struct Worker {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    seen: Vec<String>,
}

impl Worker {
    /// Starts `job` on `db` and waits until it is connected.
    fn start(db: &TestDb, job: &str, args: &[&str]) -> Worker {
        let mut child = Command::new(env!("CARGO_BIN_EXE_pg_host_worker"))
            .arg(job)
            .args(args)
            .env("PG_WORKER_URL", &db.url)
            .env("PG_WORKER_SCHEMA", &db.schema)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (send, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let mut worker = Worker {
            stdin: child.stdin.take(),
            child,
            lines,
            seen: Vec::new(),
        };
        worker.wait_for("ready", Duration::from_secs(30));
        worker
    }

    /// Lets the worker begin.
    fn go(&mut self) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(b"go\n").unwrap();
        stdin.flush().unwrap();
    }

    /// Reads lines until one equals `line`.
    fn wait_for(&mut self, line: &str, limit: Duration) {
        let end = Instant::now() + limit;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l == line => return,
                Ok(l) => self.seen.push(l),
                Err(RecvTimeoutError::Timeout) => panic!("no {line:?} within {limit:?}"),
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("the worker ended before {line:?}: {:?}", self.child.wait())
                }
            }
        }
    }

    /// Waits for the worker to finish successfully; every line it printed.
    fn finish(mut self) -> Vec<String> {
        let status = self.child.wait().unwrap();
        self.seen.extend(self.lines.iter());
        assert!(
            status.success(),
            "worker failed: {status}; printed {:?}",
            self.seen
        );
        assert_eq!(self.seen.last().map(String::as_str), Some("done"));
        self.seen
    }

    /// SIGKILL: no destructor, no rollback, no goodbye to the server.
    fn kill(mut self) -> Vec<String> {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.seen.extend(self.lines.iter());
        self.seen
    }
}

/// Starts `n` workers of one job, tagged `a`, `b`, `c`, then lets them all go at once.
fn race(db: &TestDb, n: usize, job: &str, args: &[&str]) -> Vec<Vec<String>> {
    let mut workers: Vec<Worker> = ["a", "b", "c"][..n]
        .iter()
        .map(|tag| {
            let tag = format!("tag={tag}");
            let mut all: Vec<&str> = args.to_vec();
            all.push(&tag);
            Worker::start(db, job, &all)
        })
        .collect();
    for w in &mut workers {
        w.go();
    }
    workers.into_iter().map(Worker::finish).collect()
}

fn count(db: &TestDb, sql: &str) -> i64 {
    db.client().query_one(sql, &[]).unwrap().get(0)
}

// OB-03: three hosts submit the same 150 operations at once; each operation is claimed
// by exactly one, the others get the winner's identity, and exactly one identity and
// one entry are stored for each. With a different request per host, the losers see a
// conflict and the stored entry is the winner's.
#[test]
fn racing_submits_have_one_winner_per_operation() {
    for conflict in ["0", "1"] {
        let db = TestDb::new("submits");
        let outputs = race(
            &db,
            3,
            "submit",
            &["ops=150", &format!("conflict={conflict}")],
        );
        let mut winners: BTreeMap<String, usize> = BTreeMap::new();
        for (w, lines) in outputs.iter().enumerate() {
            for line in lines {
                let parts: Vec<&str> = line.split(' ').collect();
                match parts.as_slice() {
                    ["claimed", op] => {
                        assert!(
                            winners.insert((*op).to_owned(), w).is_none(),
                            "{op} claimed twice"
                        );
                    }
                    ["existing", _, kind] => {
                        let want = if conflict == "1" { "other" } else { "same" };
                        assert_eq!(*kind, want, "{line}");
                    }
                    ["done"] => {}
                    other => panic!("unexpected line {other:?}"),
                }
            }
        }
        assert_eq!(winners.len(), 150, "every operation has a winner");
        assert_eq!(
            count(
                &db,
                "SELECT count(*) FROM workspace_chat_outbox_operation_identity"
            ),
            150
        );
        assert_eq!(
            count(&db, "SELECT count(*) FROM workspace_chat_outbox"),
            150
        );
        assert_eq!(count(&db, "SELECT count(*) FROM chat_operation_ledger"), 75);
        if conflict == "1" {
            let mut store = db.open();
            let session = SessionId::new("race").unwrap();
            for stored in store.entries(&session).unwrap() {
                let entry = stored.entry().expect("decodes").clone();
                let winner = ["a", "b", "c"][winners[entry.operation_id.as_str()]];
                assert_eq!(entry.request.user_text, format!("from {winner}"));
            }
        }
    }
}

// OV-02: three hosts write one target at once, through `update` and through the
// compare-and-set loop: no write is lost, no revision is handed out twice, and each
// host sees its revisions rise.
#[test]
fn racing_overlay_writes_lose_nothing_and_never_share_a_revision() {
    let db = TestDb::new("overlays");
    let outputs = race(&db, 3, "overlay", &["writes=60"]);
    let mut revisions = BTreeSet::new();
    for lines in &outputs {
        let mine: Vec<u64> = lines
            .iter()
            .filter_map(|l| l.strip_prefix("write "))
            .map(|l| l.split(' ').next().unwrap().parse().unwrap())
            .collect();
        assert_eq!(mine.len(), 60);
        assert!(mine.windows(2).all(|w| w[0] < w[1]), "{mine:?}");
        for r in mine {
            assert!(revisions.insert(r), "revision {r} handed out twice");
        }
    }
    let mut store = db.open();
    let overlay = store
        .load(
            &SessionId::new("race").unwrap(),
            &TargetId::new("shared").unwrap(),
        )
        .unwrap()
        .unwrap();
    assert_eq!(overlay.blocks.len(), 180, "every row written is there");
    assert_eq!(Some(&overlay.revision), revisions.last());
    assert_eq!(store.current_revision().unwrap(), overlay.revision);
}

// OV-02, OV-04: while other hosts write the target, one deletes it now and then: no
// revision is ever handed out twice, and in revision order (the target's commit order)
// the settlement epoch never goes back.
#[test]
fn deletes_racing_writes_never_reuse_a_revision() {
    let db = TestDb::new("deletes");
    let mut workers = vec![
        Worker::start(&db, "overlay", &["writes=60", "tag=a", "delete_every=7"]),
        Worker::start(&db, "overlay", &["writes=60", "tag=b"]),
        Worker::start(&db, "overlay", &["writes=60", "tag=c", "delete_every=11"]),
    ];
    for w in &mut workers {
        w.go();
    }
    let mut writes: Vec<(u64, u64)> = Vec::new();
    let mut deletes = 0;
    for lines in workers.into_iter().map(Worker::finish) {
        for line in lines {
            let parts: Vec<&str> = line.split(' ').collect();
            match parts.as_slice() {
                ["write", rev, epoch, _] => {
                    writes.push((rev.parse().unwrap(), epoch.parse().unwrap()))
                }
                ["delete", "true"] => deletes += 1,
                _ => {}
            }
        }
    }
    assert!(deletes > 0, "some delete found the target");
    writes.sort();
    let unique: BTreeSet<u64> = writes.iter().map(|w| w.0).collect();
    assert_eq!(
        unique.len(),
        writes.len(),
        "a revision was handed out twice"
    );
    assert!(
        writes.windows(2).all(|w| w[0].1 <= w[1].1),
        "the epoch went back in revision order: {writes:?}"
    );
    assert!(
        writes.last().unwrap().1 >= 1,
        "a target written after a delete is a new epoch"
    );
}

// OB-14: three hosts start runs in the same 30 sessions at once: one run per session,
// the others refused with the seed's text.
#[test]
fn one_active_run_per_session_across_hosts() {
    let db = TestDb::new("runs");
    let outputs = race(&db, 3, "runs", &["sessions=30"]);
    let mut started: BTreeMap<u32, usize> = BTreeMap::new();
    for (w, lines) in outputs.iter().enumerate() {
        for line in lines {
            if let Some(i) = line.strip_prefix("started ") {
                assert!(
                    started.insert(i.parse().unwrap(), w).is_none(),
                    "two runs in {i}"
                );
            } else if let Some(rest) = line.strip_prefix("refused ") {
                assert!(rest.ends_with(RUN_IN_PROGRESS_TEXT), "{line}");
            }
        }
    }
    assert_eq!(started.len(), 30);
    assert_eq!(count(&db, "SELECT count(*) FROM chat_active_runs"), 30);
}

// OB-14: a host that runs its agents keeps its runs past the stale limit (its adapter
// vetoes, its heartbeat renews the 1 s lease every 250 ms); once it is killed, its stale
// runs are reclaimed after the lease, each by exactly one of the two hosts racing to
// start.
#[test]
fn a_dead_hosts_runs_are_reclaimed_by_exactly_one_host() {
    let db = TestDb::new("reclaim");
    let timing = ["sessions=10", "stale_ms=300", "run_lease_ms=1000"];
    let mut owner = Worker::start(
        &db,
        "own",
        &[&timing[..], &["tag=o", "veto=1"][..]].concat(),
    );
    owner.go();
    owner.wait_for("owned", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(600));
    // Stale, but vetoed and renewed by a live host: nobody takes them.
    for lines in race(&db, 2, "runs", &timing) {
        assert_eq!(
            lines.iter().filter(|l| l.starts_with("started")).count(),
            0,
            "{lines:?}"
        );
    }
    owner.kill();
    std::thread::sleep(Duration::from_millis(1100));
    let outputs = race(&db, 2, "runs", &timing);
    let mut started: BTreeMap<u32, usize> = BTreeMap::new();
    for (w, lines) in outputs.iter().enumerate() {
        for line in lines.iter().filter_map(|l| l.strip_prefix("started ")) {
            assert!(
                started.insert(line.parse().unwrap(), w).is_none(),
                "reclaimed twice"
            );
        }
    }
    assert_eq!(started.len(), 10, "every dead run reclaimed: {outputs:?}");
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM chat_active_runs WHERE host_id = 'host-o'::BYTEA"
        ),
        0
    );
}

// OB-10: one host drains a session at a time: three hosts append to one session's outbox, each
// at the position after the last one it read (a read, then a write), under the session
// lease with fencing on; some stall past their lease before writing. Every append lands
// at its own position, and a write after a lost lease writes nothing.
#[test]
fn one_host_drains_a_session_at_a_time() {
    let db = TestDb::new("drain");
    let outputs = race(&db, 3, "drain", &["appends=12", "session_lease_ms=150"]);
    let mut positions = BTreeSet::new();
    let mut holders: HashMap<u64, usize> = HashMap::new();
    let mut fenced = Vec::new();
    for (w, lines) in outputs.iter().enumerate() {
        for line in lines {
            let parts: Vec<&str> = line.split(' ').collect();
            match parts.as_slice() {
                ["append", token, position, _] => {
                    let position: i64 = position.parse().unwrap();
                    assert!(positions.insert(position), "two appends at {position}");
                    let holder = *holders.entry(token.parse().unwrap()).or_insert(w);
                    assert_eq!(holder, w, "two hosts under token {token}");
                }
                ["fenced", op] => fenced.push((*op).to_owned()),
                _ => {}
            }
        }
    }
    assert_eq!(positions, (0..36).collect::<BTreeSet<i64>>());
    assert!(!fenced.is_empty(), "a stalled write was refused");
    let mut store = db.open();
    let session = SessionId::new("drain").unwrap();
    assert_eq!(store.entries(&session).unwrap().len(), 36);
    for op in fenced {
        let identity = store.identity(&session, &OperationId::new(op).unwrap());
        assert_eq!(identity.unwrap(), None, "a fenced write wrote");
    }
}

/// What a killed writer had acknowledged.
#[derive(Default)]
struct Acks {
    begun: Vec<String>,
    submitted: BTreeSet<String>,
    ledger: HashMap<String, u8>,
    max_revision: u64,
}

impl Acks {
    fn read(lines: &[String]) -> Acks {
        let mut acks = Acks::default();
        for line in lines {
            let parts: Vec<&str> = line.split(' ').collect();
            match parts.as_slice() {
                ["begin", op] => acks.begun.push((*op).to_owned()),
                ["submit", op] => {
                    acks.submitted.insert((*op).to_owned());
                }
                ["ledger", op, strength] => {
                    let e = acks.ledger.entry((*op).to_owned()).or_insert(0);
                    *e = (*e).max(strength.parse().unwrap());
                }
                ["overlay", rev] => acks.max_revision = acks.max_revision.max(rev.parse().unwrap()),
                _ => {}
            }
        }
        acks
    }
}

fn check_after_kill(db: &TestDb, acks: &Acks, last_counter: &mut u64) -> Result<(), String> {
    let mut client = db.client();
    let one = |client: &mut postgres::Client, sql: &str| -> i64 {
        client.query_one(sql, &[]).unwrap().get(0)
    };
    // No half submit: an identity without its entry (and not removed by a sent proof),
    // an entry without its identity, a claim without its ledger row.
    let orphans = one(
        &mut client,
        "SELECT count(*) FROM workspace_chat_outbox_operation_identity i
         WHERE NOT i.removed AND NOT EXISTS (SELECT 1 FROM workspace_chat_outbox o
             WHERE o.session_id = i.session_id AND o.operation_id = i.operation_id)",
    );
    let strays = one(
        &mut client,
        "SELECT count(*) FROM workspace_chat_outbox o
         WHERE NOT EXISTS (SELECT 1 FROM workspace_chat_outbox_operation_identity i
             WHERE o.session_id = i.session_id AND o.operation_id = i.operation_id)",
    );
    let unledgered = one(
        &mut client,
        "SELECT count(*) FROM workspace_chat_outbox_operation_identity i
         WHERE NOT EXISTS (SELECT 1 FROM chat_operation_ledger l
             WHERE l.app_session_id = i.session_id AND l.operation_id = i.operation_id)",
    );
    let removed_unsent = one(
        &mut client,
        "SELECT count(*) FROM workspace_chat_outbox_operation_identity i
         WHERE i.removed AND NOT EXISTS (SELECT 1 FROM chat_operation_ledger l
             WHERE l.app_session_id = i.session_id AND l.operation_id = i.operation_id
               AND l.status = 'sent')",
    );
    if orphans + strays + unledgered + removed_unsent != 0 {
        return Err(format!(
            "half writes: {orphans} identities without entry, {strays} entries without identity, \
             {unledgered} claims without ledger, {removed_unsent} removed without sent proof"
        ));
    }
    let mut store = db.open();
    let s = SessionId::new("s1").unwrap();
    for op in &acks.submitted {
        let id = OperationId::new(op.clone()).unwrap();
        if store
            .identity(&s, &id)
            .map_err(|e| e.to_string())?
            .is_none()
        {
            return Err(format!("acknowledged submit {op} is gone"));
        }
    }
    for (op, acked) in &acks.ledger {
        let id = OperationId::new(op.clone()).unwrap();
        let now = store
            .ledger(&ScopeId::of(&s), &id)
            .map_err(|e| e.to_string())?
            .map(|l| l.status.strength());
        if now.unwrap_or(0) < *acked {
            return Err(format!("ledger of {op} weaker than acknowledged"));
        }
    }
    let counter = store.current_revision().map_err(|e| e.to_string())?;
    if counter < acks.max_revision || counter < *last_counter {
        return Err(format!(
            "revision counter {counter} behind the acknowledged {} or the last seen {last_counter}",
            acks.max_revision
        ));
    }
    let overlay = store
        .load(&s, &TargetId::new("s1").unwrap())
        .map_err(|e| e.to_string())?;
    if let Some(o) = overlay {
        if o.revision < acks.max_revision || o.revision > counter {
            return Err(format!(
                "overlay revision {} outside the acknowledged {} and the counter {counter}",
                o.revision, acks.max_revision
            ));
        }
    }
    *last_counter = counter;
    Ok(())
}

/// Waits until no backend of `name` is left (the server noticed the kill and rolled its
/// transaction back).
fn backend_gone(db: &TestDb, name: &str) {
    let mut client = db.client();
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        let left: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                &[&name],
            )
            .unwrap()
            .get(0);
        if left == 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("the killed worker's backend is still there");
}

// ST-03: a writer is SIGKILLed again and again, half the time while the server shows
// its connection `idle in transaction` (its commits wait 40 ms first, so the kill lands
// between its statements and its commit), half the time at a random moment. After each
// kill: every acknowledged submit and ledger proof is there, nothing is half-written,
// the revision counter never goes back. `PG_KILL_ROUNDS` sets the number of kills.
#[test]
fn a_host_killed_mid_transaction_loses_nothing_acknowledged_and_leaves_nothing_half_written() {
    let rounds: u32 = std::env::var("PG_KILL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let db = TestDb::new("kill");
    let mut seed: u64 = 0x5eed_c0de;
    let mut last_counter = 0;
    let (mut in_transaction, mut acknowledged) = (0, 0);
    let mut failures = Vec::new();
    for round in 0..rounds {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let tag = format!("r{round}");
        let name = format!("pg_host_worker writer {tag}");
        let paused = round % 2 == 0;
        let pause = if paused { "pause_ms=40" } else { "pause_ms=0" };
        let mut worker = Worker::start(&db, "writer", &[&format!("tag={tag}"), pause]);
        worker.go();
        if paused {
            // Kill once the server shows the worker inside a transaction, after a few
            // of its commits went through.
            let skip = 1 + (seed >> 33) % 4;
            let mut client = db.client();
            let mut seen = 0;
            let end = Instant::now() + Duration::from_secs(20);
            while Instant::now() < end {
                let state: Option<String> = client
                    .query_opt(
                        "SELECT state FROM pg_stat_activity WHERE application_name = $1",
                        &[&name],
                    )
                    .unwrap()
                    .and_then(|r| r.get(0));
                if state.as_deref() == Some("idle in transaction") {
                    seen += 1;
                    if seen > skip {
                        break;
                    }
                    // Wait for this transaction to end before counting the next.
                    std::thread::sleep(Duration::from_millis(45));
                } else {
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
            let still: Option<String> = client
                .query_opt(
                    "SELECT state FROM pg_stat_activity WHERE application_name = $1",
                    &[&name],
                )
                .unwrap()
                .and_then(|r| r.get(0));
            if still.as_deref() == Some("idle in transaction") {
                in_transaction += 1;
            }
        } else {
            std::thread::sleep(Duration::from_millis(10 + (seed >> 33) % 60));
        }
        let lines = worker.kill();
        backend_gone(&db, &name);
        let acks = Acks::read(&lines);
        acknowledged += acks.submitted.len();
        if let Err(e) = check_after_kill(&db, &acks, &mut last_counter) {
            failures.push(format!("after kill {round}: {e}"));
        }
        // A submit begun but not acknowledged is all there or not there at all.
        if let Some(last) = acks.begun.last().filter(|op| !acks.submitted.contains(*op)) {
            let mut store = db.open();
            let s = SessionId::new("s1").unwrap();
            let id = OperationId::new(last.clone()).unwrap();
            let identity = store.identity(&s, &id).unwrap();
            let ledger = store.ledger(&ScopeId::of(&s), &id).unwrap();
            if identity.is_some() != ledger.is_some() {
                failures.push(format!("after kill {round}: {last} half claimed"));
            }
            if let Some(l) = ledger {
                assert!(l.status == LedgerStatus::Sending || l.status == LedgerStatus::Sent);
            }
        }
    }
    println!(
        "kill test: {rounds} kills, {in_transaction} inside a transaction, {acknowledged} \
         acknowledged submits, counter {last_counter}"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        acknowledged > 0,
        "the writer never acknowledged a write; the test proved nothing"
    );
    assert!(
        in_transaction >= rounds / 4,
        "only {in_transaction} kills landed inside a transaction"
    );
}
