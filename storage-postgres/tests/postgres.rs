//! PostgreSQL specifics (ST-01, ST-02, OB-05, OB-14): migrations and upgrades, values
//! that do not read back, compare-and-set between connections, lock timeouts, broken
//! connections, and the run registry and session leases of several hosts, driven from
//! one process.
#![allow(clippy::unwrap_used)]

mod support;

use outbox_core::ids::ScopeId;
use std::collections::BTreeSet;
use std::error::Error as _;
use std::time::{Duration, Instant};

use outbox_core::entry::{
    Controls, MessageRequest, OutboxEntry, StoredEntry, CANCELLATION_PENDING_TEXT,
    RUN_IN_PROGRESS_TEXT,
};
use outbox_core::fingerprint::request_fingerprint;
use outbox_core::ids::{OperationId, QueueId, RunId, SessionId};
use outbox_core::ledger::{LedgerRecord, LedgerStatus};
use outbox_core::runs::RunError;
use outbox_core::store::{OutboxError, OutboxErrorKind, OutboxStore};
use overlay_core::overlay::Change;
use overlay_core::store::write;
use overlay_core::store::{CleanupJournal, OverlayError, OverlayStore, RowClass, StoredBlock};
use storage_postgres::hosts::{LeaseError, LeaseLost};
use storage_postgres::{
    DatabaseError, DatabaseErrorKind, HostId, OpenError, PostgresStore, RunStartError, Settings,
    MIGRATIONS, SCHEMA_VERSION,
};
use support::TestDb;
use timeline_core::block::Block;
use timeline_core::key::{BlockKey, BlockType, TargetId};
use timeline_core::time::Millis;

fn s(id: &str) -> SessionId {
    SessionId::new(id).unwrap()
}

fn entry(n: &str) -> OutboxEntry {
    OutboxEntry::queued(
        QueueId::new(format!("q-{n}")).unwrap(),
        OperationId::new(format!("op-{n}")).unwrap(),
        MessageRequest::text(format!("text {n}"), "composer", Millis(1)),
        Controls::enqueue(),
        0,
    )
}

fn claim(store: &mut PostgresStore, session: &str, e: &OutboxEntry) {
    let print = request_fingerprint(&s(session), &e.queue_id, &e.request);
    store.claim(&s(session), &print, e).unwrap();
}

fn row(id: &str) -> StoredBlock {
    StoredBlock {
        block: Block::new(
            BlockKey::parse(BlockType::AgentReply, id).unwrap(),
            Millis(1),
        ),
        class: RowClass::Ordinary,
        run_id: None,
    }
}

fn tables(db: &TestDb) -> BTreeSet<String> {
    db.client()
        .query(
            "SELECT table_name::TEXT FROM information_schema.tables WHERE table_schema = $1",
            &[&db.schema],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

// ST-01, ST-02: the migrations build every table of the seed and the hosts' tables, and
// record each version with its name.
#[test]
fn migrations_build_the_tables_and_record_their_versions() {
    let db = TestDb::new("migrations");
    let mut store = db.open();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    assert_eq!(store.schema(), db.schema);
    let found = tables(&db);
    for table in [
        "workspace_chat_outbox",
        "workspace_chat_outbox_operation_identity",
        "chat_operation_ledger",
        "chat_live_timeline_overlays",
        "chat_live_timeline_overlay_rows",
        "chat_live_timeline_overlay_deleted_epochs",
        "chat_pending_terminal_overlay_cleanups",
        "chat_session_messages",
        "chat_active_runs",
        "chat_run_cancellations",
        "chat_session_leases",
        "custody_schema_migrations",
    ] {
        assert!(found.contains(table), "{table} missing from {found:?}");
    }
    // The revision counter is the seed's one-row relation.
    let counter: i64 = db
        .client()
        .query_one(
            "SELECT count(*) FROM chat_live_timeline_overlay_revisions",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(counter, 1);
    let recorded: Vec<(i32, String)> = db
        .client()
        .query(
            "SELECT version, name FROM custody_schema_migrations ORDER BY version",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let want: Vec<(i32, String)> = MIGRATIONS
        .iter()
        .enumerate()
        .map(|(i, (name, _))| (i as i32 + 1, (*name).to_owned()))
        .collect();
    assert_eq!(recorded, want);
}

// ST-02: a database written by schema version 1 opens, upgrades and keeps its data.
#[test]
fn a_version_1_database_upgrades_with_its_data() {
    let db = TestDb::new("upgrade");
    let mut old = PostgresStore::open_at(db.options(), Settings::default(), 1).unwrap();
    assert_eq!(old.schema_version().unwrap(), 1);
    assert!(!tables(&db).contains("chat_active_runs"));
    claim(&mut old, "s1", &entry("1"));
    let written = write(
        &mut old,
        &s("s1"),
        &TargetId::new("t").unwrap(),
        &Change::Publish(vec![row("a")]),
    )
    .unwrap();
    let revision = written.stored().unwrap().revision;
    drop(old);
    let mut store = db.open();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    assert_eq!(store.entries(&s("s1")).unwrap().len(), 1);
    let loaded = store
        .load(&s("s1"), &TargetId::new("t").unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(loaded.revision, revision);
    let host = HostId::new("h").unwrap();
    store
        .start_run(
            &host,
            &s("s1"),
            &RunId::new("run-1").unwrap(),
            None,
            None,
            &|_, _| false,
        )
        .unwrap();
}

// ST-02: a database of a newer schema is refused and left as it is.
#[test]
fn a_newer_schema_is_refused() {
    let db = TestDb::new("newer");
    drop(db.open());
    db.client()
        .execute(
            "INSERT INTO custody_schema_migrations (version, name) VALUES (99, 'future')",
            &[],
        )
        .unwrap();
    let err = PostgresStore::open(db.options(), Settings::default()).unwrap_err();
    assert!(
        matches!(err, OpenError::NewerSchema { found: 99, supported } if supported == SCHEMA_VERSION),
        "{err:?}"
    );
    assert!(err.to_string().contains("99"), "{err}");
}

// ST-02: a migration that does not apply names itself, and nothing of it is written.
#[test]
fn a_failed_migration_names_itself_and_writes_nothing() {
    let db = TestDb::new("failed");
    drop(PostgresStore::open_at(db.options(), Settings::default(), 1).unwrap());
    db.client()
        .batch_execute("CREATE TABLE chat_active_runs (x INT)")
        .unwrap();
    let err = PostgresStore::open(db.options(), Settings::default()).unwrap_err();
    match &err {
        OpenError::Migration {
            found: 1,
            migration: "0002_hosts",
            reason,
            ..
        } => assert!(reason.contains("chat_active_runs"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert!(
        !tables(&db).contains("chat_run_cancellations"),
        "half a migration"
    );
}

// ST-02: hosts that open a new database together migrate it once.
#[test]
fn hosts_opening_together_migrate_once() {
    let db = TestDb::new("together");
    let options = db.options();
    let opened: Vec<Result<u32, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let options = options.clone();
                scope.spawn(move || {
                    PostgresStore::open(options, Settings::default())
                        .map_err(|e| e.to_string())
                        .and_then(|mut s| s.schema_version().map_err(|e| e.to_string()))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(
        opened.iter().all(|v| v == &Ok(SCHEMA_VERSION)),
        "{opened:?}"
    );
    let rows: i64 = db
        .client()
        .query_one("SELECT count(*) FROM custody_schema_migrations", &[])
        .unwrap()
        .get(0);
    assert_eq!(rows, i64::from(SCHEMA_VERSION));
}

// OB-05, OB-11: two connections replace the same entry at once (each commit waits, so
// both read before either writes): exactly one wins, the other sees the change.
#[test]
fn a_compare_and_set_on_an_entry_has_one_winner_between_connections() {
    let db = TestDb::new("entry_cas");
    let mut setup = db.open();
    let base = entry("1");
    claim(&mut setup, "s1", &base);
    let mut stores = [db.open(), db.open()];
    for store in &mut stores {
        store.pause_before_commit(Some(Duration::from_millis(50)));
    }
    for round in 0..3 {
        let expected = setup.entries(&s("s1")).unwrap()[0].entry().unwrap().clone();
        let start = std::sync::Barrier::new(2);
        let results: Vec<bool> = std::thread::scope(|scope| {
            let handles: Vec<_> = stores
                .iter_mut()
                .zip(1..)
                .map(|(store, who)| {
                    let (expected, start) = (expected.clone(), &start);
                    scope.spawn(move || {
                        let new = OutboxEntry {
                            position: round * 10 + who,
                            ..expected.clone()
                        };
                        start.wait();
                        store.replace_entry(&s("s1"), &expected, &new).unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(
            results.iter().filter(|r| **r).count(),
            1,
            "round {round}: {results:?}"
        );
    }
}

// ST-02: a write that waits for another connection's lock longer than `lock_timeout`
// fails as unavailable, with the server's error as its source, and writes nothing.
#[test]
fn a_lock_held_too_long_is_unavailable_not_a_hang() {
    let db = TestDb::new("lock_timeout");
    let mut store = db.open();
    let e = entry("1");
    claim(&mut store, "s1", &e);
    let mut settings = Settings::default();
    settings.lock_timeout = Duration::from_millis(200);
    let mut waiting = db.open_with(settings);
    let mut holder = db.client();
    let mut tx = holder.transaction().unwrap();
    tx.execute("SELECT 1 FROM workspace_chat_outbox FOR UPDATE", &[])
        .unwrap();
    let started = Instant::now();
    let moved = OutboxEntry {
        position: 5,
        ..e.clone()
    };
    let err = waiting.replace_entry(&s("s1"), &e, &moved).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(err.kind(), OutboxErrorKind::Unavailable);
    assert!(err.to_string().contains("55P03"), "{err}");
    let db = err
        .source()
        .and_then(|e| e.downcast_ref::<DatabaseError>())
        .unwrap();
    assert_eq!(db.kind(), DatabaseErrorKind::Server);
    assert_eq!(db.code(), Some("55P03"));
    assert!(db.message().contains("lock timeout"), "{db}");
    tx.rollback().unwrap();
    assert_eq!(store.entries(&s("s1")).unwrap()[0].entry(), Some(&e));
}

// ST-02: a connection the server closed is opened again: at most the call that found it closed
// fails (as unavailable), and the next ones work with the data intact.
#[test]
fn a_closed_connection_is_opened_again() {
    let db = TestDb::new("reconnect");
    let mut settings = Settings::default();
    settings.application_name = format!("reconnect {}", db.schema);
    let mut store = db.open_with(settings.clone());
    claim(&mut store, "s1", &entry("1"));
    let killed: i64 = db
        .client()
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
            &[&settings.application_name],
        )
        .unwrap()
        .get(0);
    assert_eq!(killed, 1);
    std::thread::sleep(Duration::from_millis(100));
    if let Err(e) = store.entries(&s("s1")) {
        assert_eq!(e.kind(), OutboxErrorKind::Unavailable, "{e}");
    }
    assert_eq!(store.entries(&s("s1")).unwrap().len(), 1);
    claim(&mut store, "s1", &entry("2"));
    assert_eq!(store.entries(&s("s1")).unwrap().len(), 2);
}

// OB-05, ST-01: values that do not read back. An outbox row whose ID is not UTF-8 shows
// blocked with what it holds, its neighbour still reads; an identity, a ledger row, an
// overlay row or header that does not read back is a typed `Corrupt` error naming the
// column, and a write that needed it stores nothing.
#[test]
fn values_that_do_not_read_back_are_blocked_or_corrupt() {
    let db = TestDb::new("corrupt");
    let mut store = db.open();
    claim(&mut store, "s1", &entry("ok"));
    let mut client = db.client();
    client
        .execute(
            "INSERT INTO workspace_chat_outbox (session_id, queue_id, operation_id, position, entry_json)
             VALUES ('s1'::BYTEA, '\\xff'::BYTEA, 'op-x'::BYTEA, 3, '{}')",
            &[],
        )
        .unwrap();
    let shown = store.entries(&s("s1")).unwrap();
    assert_eq!(shown.len(), 2);
    assert!(shown[0].entry().is_some());
    match &shown[1] {
        StoredEntry::Blocked(b) => {
            assert!(
                b.reason
                    .contains("workspace_chat_outbox.queue_id holds BYTEA '\\xff'"),
                "{}",
                b.reason
            );
            assert_eq!(b.operation_id.as_deref(), Some("op-x"));
        }
        other => panic!("{other:?}"),
    }

    client
        .execute(
            "UPDATE workspace_chat_outbox_operation_identity SET queue_id = '\\xfe'::BYTEA",
            &[],
        )
        .unwrap();
    let err = store
        .identity(&s("s1"), &OperationId::new("op-ok").unwrap())
        .unwrap_err();
    assert!(
        matches!(&err, OutboxError::Corrupt { reason, .. } if reason.contains("queue_id")),
        "{err:?}"
    );

    let op = OperationId::new("op-ok").unwrap();
    store
        .put_ledger(
            &ScopeId::of(&s("s1")),
            &op,
            &LedgerRecord::new(LedgerStatus::Sending, Millis(1)),
        )
        .unwrap();
    client
        .execute("UPDATE chat_operation_ledger SET status = 'sent'", &[])
        .unwrap();
    let err = store.ledger(&ScopeId::of(&s("s1")), &op).unwrap_err();
    assert!(
        matches!(&err, OutboxError::Corrupt { reason, .. } if reason.contains("chat_operation_ledger.status holds TEXT 'sent'")),
        "{err:?}"
    );

    let t = TargetId::new("t").unwrap();
    write(&mut store, &s("s1"), &t, &Change::Publish(vec![row("a")])).unwrap();
    let counter = store.current_revision().unwrap();
    client
        .execute(
            "UPDATE chat_live_timeline_overlay_rows SET block_id = 'b'::BYTEA",
            &[],
        )
        .unwrap();
    // A fresh connection (no cached rows) reads the table.
    let mut fresh = db.open();
    let err = fresh.load(&s("s1"), &t).unwrap_err();
    assert!(
        matches!(&err, OverlayError::Corrupt { reason, .. } if reason.contains("holds the key")),
        "{err:?}"
    );
    let err = write(&mut fresh, &s("s1"), &t, &Change::Publish(vec![row("c")])).unwrap_err();
    assert!(matches!(err, OverlayError::Corrupt { .. }), "{err:?}");
    assert_eq!(
        fresh.current_revision().unwrap(),
        counter,
        "a refused write took a revision"
    );

    client
        .batch_execute(
            "ALTER TABLE chat_live_timeline_overlays DROP CONSTRAINT chat_live_timeline_overlays_revision_check;
             UPDATE chat_live_timeline_overlays SET revision = -1",
        )
        .unwrap();
    let err = fresh
        .targets(&s("s1"))
        .map(|_| ())
        .and_then(|()| fresh.load(&s("s1"), &t).map(|_| ()));
    assert!(
        matches!(&err, Err(OverlayError::Corrupt { reason, .. }) if reason.contains("chat_live_timeline_overlays.revision holds BIGINT -1")),
        "{err:?}"
    );
}

fn never(_: &SessionId, _: &RunId) -> bool {
    false
}

fn always(_: &SessionId, _: &RunId) -> bool {
    true
}

/// Short leases for tests; long enough that a loaded machine's pauses between two
/// steps of a test do not expire them by accident.
fn quick() -> Settings {
    let mut settings = Settings::default();
    settings.leases.stale_after = Duration::from_millis(300);
    settings.leases.run_lease = Duration::from_millis(600);
    settings.leases.session_lease = Duration::from_millis(600);
    settings
}

fn run(id: &str) -> RunId {
    RunId::new(id).unwrap()
}

// OB-14: one active run per session with the seed's texts; a pending cancellation in
// the scope keeps new runs out until it ends; the finalizer is claimed once; a restore
// puts the same run back and never replaces another.
#[test]
fn the_shared_run_registry_keeps_the_seed_rules() {
    let db = TestDb::new("registry");
    let mut store = db.open();
    let h = HostId::new("h").unwrap();
    store
        .start_run(&h, &s("a"), &run("run-1"), None, None, &never)
        .unwrap();
    let err = store
        .start_run(&h, &s("a"), &run("run-2"), None, None, &never)
        .unwrap_err();
    assert_eq!(err, RunStartError::Refused(RunError::InProgress));
    assert_eq!(err.to_string(), RUN_IN_PROGRESS_TEXT);
    store
        .begin_cancellation(&h, &s("a"), &run("run-1"))
        .unwrap();
    assert!(store.end_run(&s("a"), &run("run-1")).unwrap());
    assert!(!store.end_run(&s("a"), &run("run-1")).unwrap());
    let err = store
        .start_run(&h, &s("a::skills-agent"), &run("run-3"), None, None, &never)
        .unwrap_err();
    assert_eq!(err.to_string(), CANCELLATION_PENDING_TEXT);
    assert!(store.cancellation_pending(&s("a::skills-agent")).unwrap());
    store.end_cancellation(&s("a"), &run("run-1")).unwrap();
    store
        .start_run(&h, &s("a"), &run("run-3"), None, None, &never)
        .unwrap();

    assert!(store.claim_finalizing(&s("a"), &run("run-3")).unwrap());
    assert!(!store.claim_finalizing(&s("a"), &run("run-3")).unwrap());
    let saved = store.active_run(&s("a")).unwrap().unwrap();
    assert_eq!(saved.host, h);
    assert!(saved.run.finalizing);
    store.end_run(&s("a"), &run("run-3")).unwrap();
    store.restore_run(&h, &s("a"), &saved.run).unwrap();
    assert_eq!(
        store.active_run(&s("a")).unwrap().unwrap().run.run_id,
        run("run-3")
    );
    store.restore_run(&h, &s("a"), &saved.run).unwrap();
    store.end_run(&s("a"), &run("run-3")).unwrap();
    store
        .start_run(&h, &s("a"), &run("run-4"), None, None, &never)
        .unwrap();
    assert_eq!(
        store.restore_run(&h, &s("a"), &saved.run),
        Err(RunStartError::Refused(RunError::RestoreRefused))
    );
    let op = OperationId::new("op-joined").unwrap();
    assert!(store.joined_by(&s("a"), &run("run-4"), &op).unwrap());
    assert_eq!(
        store
            .active_run(&s("a"))
            .unwrap()
            .unwrap()
            .run
            .last_session_message,
        Some(op)
    );
    store
        .start_run(&h, &s("a::skills-agent"), &run("run-5"), None, None, &never)
        .unwrap();
    assert_eq!(
        store.scope_runs(&s("a")).unwrap(),
        vec![(s("a"), run("run-4")), (s("a::skills-agent"), run("run-5"))]
    );
}

// OB-14: a stale run is reclaimed by its own host unless its adapter vetoes; another
// host reclaims it only once the owner stopped renewing the lease; activity keeps a run
// fresh.
#[test]
fn stale_runs_are_reclaimed_by_their_host_unless_vetoed_and_by_others_after_the_lease() {
    let db = TestDb::new("stale");
    let mut owner = db.open_with(quick());
    let mut other = db.open_with(quick());
    let (h, g) = (HostId::new("h").unwrap(), HostId::new("g").unwrap());
    owner
        .start_run(&h, &s("a"), &run("run-1"), None, None, &never)
        .unwrap();
    owner
        .start_run(&h, &s("b"), &run("run-2"), None, None, &never)
        .unwrap();
    std::thread::sleep(Duration::from_millis(350));
    // Both are stale; the owner's adapter vetoes and its heartbeat renews the leases.
    assert_eq!(owner.active_runs(&h, &always).unwrap().len(), 2, "vetoed");
    let beat = owner.heartbeat(&h, &always).unwrap();
    assert_eq!((beat.renewed, beat.reclaimed.len()), (2, 0));
    // Stale, but the owner's lease is fresh: another host must not take it.
    let refused = other.start_run(&g, &s("a"), &run("run-9"), None, None, &never);
    assert_eq!(refused, Err(RunStartError::Refused(RunError::InProgress)));
    assert_eq!(other.reclaim_stale_runs(&g, &never).unwrap(), vec![]);
    // Activity keeps `b` fresh; the owner's adapter lets the stale `a` go.
    assert!(owner.touch_run(&s("b"), &run("run-2")).unwrap());
    let runs = owner.active_runs(&h, &never).unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].0, s("b"));
    // The owner stops renewing (it died): after the lease and the stale limit, another
    // host reclaims `b` at its start.
    std::thread::sleep(Duration::from_millis(700));
    other
        .start_run(&g, &s("b"), &run("run-10"), None, None, &never)
        .unwrap();
    let now = other.active_run(&s("b")).unwrap().unwrap();
    assert_eq!((now.host, now.run.run_id), (g, run("run-10")));
}

fn active(id: &str) -> outbox_core::runs::ActiveRun {
    outbox_core::runs::ActiveRun {
        run_id: run(id),
        started_by: Some(OperationId::new("op-1").unwrap()),
        last_session_message: None,
        access: None,
        last_activity: Millis(0),
        finalizing: false,
    }
}

// MH-03, OB-14: the shared run registry custody writes through (`SharedRuns`): a
// start is refused while another host's run is active or its stop pending, a host's own
// leftover is replaced, renewals keep a run from being reclaimed, and the scope lists
// each run with whose it is and how long until another host may reclaim it.
#[test]
fn the_shared_registry_custody_writes_through_keeps_one_run_per_session_across_hosts() {
    use outbox_core::store::SharedRuns;
    let db = TestDb::new("shared_runs");
    let mut h = db.open_with(quick());
    let mut g = db.open_with(quick());
    assert!(h.shared_runs().is_none(), "off until a host is given");
    let err = SharedRuns::scope(&mut h, &s("a")).unwrap_err();
    assert_eq!(err.kind(), OutboxErrorKind::Unavailable);
    h.share_runs(HostId::new("h").unwrap());
    g.share_runs(HostId::new("g").unwrap());
    assert!(h.shared_runs().is_some());
    assert_eq!(SharedRuns::renew_every(&h), Millis(200));

    SharedRuns::start_run(&mut h, &s("a"), &active("run-1"))
        .unwrap()
        .unwrap();
    // Another host is refused, and so is another run of the same host (an old run its
    // agent may still work); the same run written again (a restore) is taken.
    assert_eq!(
        SharedRuns::start_run(&mut g, &s("a"), &active("run-9")).unwrap(),
        Err(RunError::InProgress)
    );
    assert_eq!(
        SharedRuns::start_run(&mut h, &s("a"), &active("run-2")).unwrap(),
        Err(RunError::InProgress)
    );
    SharedRuns::start_run(&mut h, &s("a"), &active("run-1"))
        .unwrap()
        .unwrap();
    SharedRuns::end_run(&mut h, &s("a"), &run("run-1")).unwrap();
    SharedRuns::start_run(&mut h, &s("a"), &active("run-2"))
        .unwrap()
        .unwrap();
    let joined = OperationId::new("op-joined").unwrap();
    SharedRuns::joined_by(&mut h, &s("a"), &run("run-2"), &joined).unwrap();
    let scope = SharedRuns::scope(&mut g, &s("a")).unwrap();
    assert_eq!(scope.runs.len(), 1);
    let seen = &scope.runs[0];
    assert_eq!((seen.run.run_id.clone(), seen.mine), (run("run-2"), false));
    assert_eq!(seen.run.started_by, Some(OperationId::new("op-1").unwrap()));
    assert_eq!(
        seen.run.last_session_message,
        Some(joined),
        "an adopter continues the exchange"
    );
    assert!(
        seen.reclaimable_in > Millis(400) && seen.reclaimable_in <= Millis(600),
        "the lease left: {:?}",
        seen.reclaimable_in
    );
    assert!(SharedRuns::scope(&mut h, &s("a")).unwrap().runs[0].mine);

    // A stop `h` began keeps `g` out of the whole scope, alias included.
    SharedRuns::begin_cancellation(&mut h, &s("a"), &run("run-2")).unwrap();
    let scope = SharedRuns::scope(&mut g, &s("a")).unwrap();
    assert_eq!(scope.cancellations.len(), 1);
    assert!(!scope.cancellations[0].mine);
    assert_eq!(
        SharedRuns::start_run(&mut g, &s("a::skills-agent"), &active("run-8")).unwrap(),
        Err(RunError::CancellationPending)
    );
    SharedRuns::end_cancellation(&mut g, &s("a"), &run("run-2")).unwrap();
    assert!(SharedRuns::scope(&mut g, &s("a"))
        .unwrap()
        .cancellations
        .is_empty());

    // Renewed with activity past the stale limit: still `h`'s.
    std::thread::sleep(Duration::from_millis(350));
    SharedRuns::renew(&mut h, &[(s("a"), run("run-2"), true)], &[]).unwrap();
    assert_eq!(
        SharedRuns::start_run(&mut g, &s("a"), &active("run-9")).unwrap(),
        Err(RunError::InProgress)
    );
    // `h` stops renewing (it died): after the lease, `g` may take the session.
    std::thread::sleep(Duration::from_millis(650));
    assert_eq!(
        SharedRuns::scope(&mut g, &s("a")).unwrap().runs[0].reclaimable_in,
        Millis(0)
    );
    SharedRuns::start_run(&mut g, &s("a"), &active("run-9"))
        .unwrap()
        .unwrap();
    let now = g.active_run(&s("a")).unwrap().unwrap();
    assert_eq!(
        (now.host, now.run.run_id),
        (HostId::new("g").unwrap(), run("run-9"))
    );
    SharedRuns::end_run(&mut h, &s("a"), &run("run-9")).unwrap();
    assert!(
        g.active_run(&s("a")).unwrap().is_none(),
        "an end is anyone's"
    );
}

// OB-10: one host holds a session scope at a time: another host is told who holds it and for
// how long; the holder renews it with the same token; once released or expired another
// host takes it with a higher token, and the old holder's renewal is refused.
#[test]
fn a_session_lease_has_one_holder_and_rising_tokens() {
    let db = TestDb::new("lease");
    let mut one = db.open_with(quick());
    let mut two = db.open_with(quick());
    let (h, g) = (HostId::new("h").unwrap(), HostId::new("g").unwrap());
    let first = one.acquire_session(&h, &s("a::skills-agent")).unwrap();
    assert_eq!(first.session, s("a"), "the lease covers the scope");
    match two.acquire_session(&g, &s("a")) {
        Err(LeaseError::Busy(busy)) => {
            assert_eq!(busy.holder, h);
            assert!(busy.expires_in <= Duration::from_millis(600));
        }
        other => panic!("{other:?}"),
    }
    let again = one.acquire_session(&h, &s("a")).unwrap();
    assert_eq!(again.token, first.token);
    let renewed = one.renew_session(&first).unwrap();
    assert_eq!(renewed.token, first.token);
    assert!(one.release_session(&first).unwrap());
    let second = two.acquire_session(&g, &s("a")).unwrap();
    assert!(second.token > first.token);
    assert!(matches!(
        one.renew_session(&first),
        Err(LeaseError::Lost(_))
    ));
    std::thread::sleep(Duration::from_millis(700));
    let third = one.acquire_session(&h, &s("a")).unwrap();
    assert!(third.token > second.token, "an expired lease passes on");
    assert!(matches!(
        two.renew_session(&second),
        Err(LeaseError::Lost(_))
    ));
}

// OB-10, MH-02: with fencing on, an outbox write needs the session's lease: without one,
// or after the lease passed to another host, the write is refused with the typed
// `LeaseLost` error (never retried) and writes nothing.
#[test]
fn fenced_writes_need_the_sessions_lease() {
    let db = TestDb::new("fence");
    let mut one = db.open_with(quick());
    let mut two = db.open_with(quick());
    one.set_fencing(true);
    let (h, g) = (HostId::new("h").unwrap(), HostId::new("g").unwrap());
    let e = entry("1");
    let print = request_fingerprint(&s("a"), &e.queue_id, &e.request);
    let refused = one.claim(&s("a"), &print, &e).unwrap_err();
    assert!(
        matches!(&refused, OutboxError::LeaseLost { session, .. } if *session == s("a")),
        "{refused:?}"
    );
    assert!(one.entries(&s("a")).unwrap().is_empty());

    one.acquire_session(&h, &s("a")).unwrap();
    one.claim(&s("a"), &print, &e).unwrap();
    std::thread::sleep(Duration::from_millis(700));
    two.acquire_session(&g, &s("a")).unwrap();
    let e2 = entry("2");
    let print2 = request_fingerprint(&s("a"), &e2.queue_id, &e2.request);
    let refused = one.claim(&s("a::skills-agent"), &print2, &e2).unwrap_err();
    assert_eq!(refused.kind(), OutboxErrorKind::LeaseLost);
    assert!(
        refused
            .to_string()
            .contains("does not hold the lease of session a"),
        "{refused}"
    );
    assert_eq!(two.entries(&s("a::skills-agent")).unwrap().len(), 0);
    // Unfenced stores (the other host here) write as before.
    two.claim(&s("a"), &print2, &e2).unwrap();
    assert_eq!(two.entries(&s("a")).unwrap().len(), 2);
}

// Opening fails with the crate's own errors: a server that is not there is a connection
// failure; options without a host are a configuration error; a database that does not
// exist is the server's error with its SQLSTATE.
#[test]
fn failures_to_open_are_typed_with_the_drivers_message_and_code() {
    let nowhere = tempfile::tempdir().unwrap();
    let mut settings = Settings::default();
    settings.connect_timeout = Duration::from_secs(2);
    let options = storage_postgres::ConnectOptions::new()
        .host(nowhere.path().to_str().unwrap())
        .port(1)
        .user("postgres");
    match PostgresStore::open(options, settings) {
        Err(OpenError::Database(e)) => {
            assert_eq!(e.kind(), DatabaseErrorKind::Connection, "{e}");
            assert_eq!(e.code(), None);
            assert!(e.source().is_some());
        }
        other => panic!("{other:?}"),
    }

    // No host at all: refused by the client before any connection.
    match PostgresStore::open(storage_postgres::ConnectOptions::new(), Settings::default()) {
        Err(OpenError::Config(e)) => assert_eq!(e.kind(), DatabaseErrorKind::Config, "{e}"),
        other => panic!("{other:?}"),
    }

    let db = TestDb::new("no_database");
    let missing = storage_postgres::ConnectOptions::parse(&db.url)
        .unwrap()
        .dbname(&format!("no_such_database_{}", std::process::id()));
    match PostgresStore::open(missing, Settings::default()) {
        Err(OpenError::Database(e)) => {
            assert_eq!(e.kind(), DatabaseErrorKind::Server, "{e}");
            assert_eq!(e.code(), Some("3D000"));
            assert!(e.message().contains("does not exist"), "{e}");
        }
        other => panic!("{other:?}"),
    }
}

// MH-02: the stores of one host share the leases its lease keeper holds: the overlay
// store and the outbox store write under the keeper's lease, and once it is lost both are
// refused with their typed `LeaseLost` error; the cleanup journal too. Nothing is
// written.
#[test]
fn a_hosts_stores_write_under_the_lease_its_keeper_holds() {
    let db = TestDb::new("shared_leases");
    let mut keeper = db.open_with(quick());
    let mut outbox = db.open_with(quick());
    let mut overlays = db.open_with(quick());
    let mut other = db.open_with(quick());
    let leases = keeper.lease_set();
    outbox.share_leases(&leases);
    overlays.share_leases(&leases);
    let (h, g) = (HostId::new("h").unwrap(), HostId::new("g").unwrap());
    let t = TargetId::main(&s("a"));
    let refused = write(
        &mut overlays,
        &s("a"),
        &t,
        &Change::Publish(vec![row("r1")]),
    );
    assert!(
        matches!(&refused, Err(OverlayError::LeaseLost { session, .. }) if *session == s("a")),
        "{refused:?}"
    );
    let lease = keeper.acquire_session(&h, &s("a")).unwrap();
    assert!(leases.holds(&s("a::skills-agent")));
    write(
        &mut overlays,
        &s("a"),
        &t,
        &Change::Publish(vec![row("r1")]),
    )
    .unwrap();
    let e = entry("1");
    let print = request_fingerprint(&s("a"), &e.queue_id, &e.request);
    outbox.claim(&s("a"), &print, &e).unwrap();
    overlays.add_cleanup(&s("a"), &run("run-1")).unwrap();

    // The lease lapses and another host takes it; the keeper learns at its renewal.
    std::thread::sleep(Duration::from_millis(700));
    let taken = other.acquire_session(&g, &s("a")).unwrap();
    assert!(taken.token > lease.token, "the token rises with the holder");
    let refused = write(
        &mut overlays,
        &s("a"),
        &t,
        &Change::Publish(vec![row("r2")]),
    );
    assert!(
        matches!(refused, Err(OverlayError::LeaseLost { .. })),
        "{refused:?}"
    );
    assert!(matches!(
        overlays.remove_cleanup(&s("a"), &run("run-1")),
        Err(OverlayError::LeaseLost { .. })
    ));
    let e2 = entry("2");
    let print2 = request_fingerprint(&s("a"), &e2.queue_id, &e2.request);
    assert_eq!(
        outbox.claim(&s("a"), &print2, &e2).unwrap_err().kind(),
        OutboxErrorKind::LeaseLost
    );
    assert!(matches!(
        keeper.renew_session(&lease),
        Err(LeaseError::Lost(LeaseLost { .. }))
    ));
    assert!(
        !leases.holds(&s("a")),
        "a lost renewal leaves the shared set"
    );
    // Nothing the old holder tried after losing the lease is there.
    let stored = other.load(&s("a"), &t).unwrap().unwrap();
    let keys: Vec<String> = stored
        .blocks
        .iter()
        .map(|b| b.block.key().id.as_str().to_owned())
        .collect();
    assert_eq!(keys, vec!["r1".to_owned()]);
    assert_eq!(other.entries(&s("a")).unwrap().len(), 1);
    assert_eq!(other.pending_cleanups(Some(&s("a"))).unwrap().len(), 1);
}

// MH-04: a session message is written into the recipient's outbox under the sender's
// lease, whoever serves the recipient, and wakes the recipient's owner through
// `LISTEN`/`NOTIFY` once it commits.
#[test]
fn a_session_message_to_a_session_another_host_serves_is_written_and_wakes_it() {
    use outbox_core::ids::CallId;
    use outbox_core::store::{RouteClaim, RouteDelivery, SessionMessageRoute};
    use storage_postgres::hosts::Wake;
    let db = TestDb::new("wake");
    let mut sender = db.open_with(quick());
    let mut owner = db.open_with(quick());
    let listener = db.open_with(quick());
    let mut listener = listener.into_wake_listener().unwrap();
    sender.set_fencing(true);
    owner.set_fencing(true);
    let (h, g) = (HostId::new("h").unwrap(), HostId::new("g").unwrap());
    sender.acquire_session(&h, &s("s1")).unwrap();
    owner.acquire_session(&g, &s("s2")).unwrap();
    let route = SessionMessageRoute {
        operation_id: OperationId::new("session-message-1").unwrap(),
        recipient_session_id: s("s2"),
        sender_session_id: s("s1"),
        sender_call_id: CallId::new("call-1").unwrap(),
        sender_run_id: None,
        sender_thread_id: None,
        chain_id: "chain-1".into(),
        hop: 1,
        created_at: Millis(1),
        delivery: RouteDelivery::Sent,
    };
    let e = OutboxEntry::queued(
        QueueId::new("session-message-1").unwrap(),
        route.operation_id.clone(),
        MessageRequest::text("from s1", "session-message", Millis(1)),
        Controls::automatic(),
        0,
    );
    let print = request_fingerprint(&s("s2"), &e.queue_id, &e.request);
    assert_eq!(
        sender
            .claim_session_message(&s("s2"), &print, &e, &route)
            .unwrap(),
        RouteClaim::Claimed
    );
    let wakes = listener.wait(Duration::from_secs(5)).unwrap();
    assert_eq!(wakes, vec![Wake::Session(s("s2"))]);
    assert_eq!(owner.entries(&s("s2")).unwrap().len(), 1);
    // Nothing else arrives.
    assert!(listener
        .wait(Duration::from_millis(100))
        .unwrap()
        .is_empty());
    // A sender that does not hold its own session's lease writes nothing.
    let mut stranger = db.open_with(quick());
    stranger.set_fencing(true);
    let route2 = SessionMessageRoute {
        operation_id: OperationId::new("session-message-2").unwrap(),
        sender_call_id: CallId::new("call-2").unwrap(),
        ..route
    };
    let e2 = OutboxEntry {
        queue_id: QueueId::new("session-message-2").unwrap(),
        operation_id: route2.operation_id.clone(),
        ..e
    };
    let refused = stranger.claim_session_message(&s("s2"), &print, &e2, &route2);
    assert!(
        matches!(refused, Err(OutboxError::LeaseLost { .. })),
        "{refused:?}"
    );
    assert_eq!(owner.entries(&s("s2")).unwrap().len(), 1);
    assert!(listener
        .wait(Duration::from_millis(100))
        .unwrap()
        .is_empty());
}

// MH-04: a client that asks the wrong host is told where to go: the holder and its
// registered address; a scope whose lease lapsed, or a saved outbox nobody serves, is an
// orphan another host takes up.
#[test]
fn the_holder_of_a_session_and_orphaned_sessions_are_found() {
    let db = TestDb::new("holders");
    let mut one = db.open_with(quick());
    let mut two = db.open_with(quick());
    let (h, g) = (HostId::new("h").unwrap(), HostId::new("g").unwrap());
    one.register_host(&h, "ws://127.0.0.1:4001/ws").unwrap();
    assert_eq!(two.lease_holder(&s("a")).unwrap(), None);
    one.acquire_session(&h, &s("a")).unwrap();
    assert_eq!(
        two.lease_holder(&s("a::skills-agent")).unwrap(),
        Some((h.clone(), Some("ws://127.0.0.1:4001/ws".to_owned())))
    );
    two.acquire_session(&g, &s("b")).unwrap();
    assert_eq!(one.lease_holder(&s("b")).unwrap(), Some((g.clone(), None)));
    assert!(two.orphaned_sessions(10).unwrap().is_empty());
    // A saved outbox whose scope nobody holds.
    let e = entry("1");
    let print = request_fingerprint(&s("c::skills-agent"), &e.queue_id, &e.request);
    two.claim(&s("c::skills-agent"), &print, &e).unwrap();
    assert_eq!(two.orphaned_sessions(10).unwrap(), vec![s("c")]);
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(
        two.orphaned_sessions(10).unwrap(),
        vec![s("a"), s("b"), s("c")]
    );
    assert_eq!(two.orphaned_sessions(2).unwrap(), vec![s("a"), s("b")]);
    assert_eq!(
        two.lease_holder(&s("a")).unwrap(),
        None,
        "a lapsed lease holds nothing"
    );
}

// MH-03: two hosts race to take one expired lease, again and again: exactly one wins each
// time, the other is told who holds it, and the token rises with every new holder.
#[test]
fn two_hosts_racing_for_one_expired_lease_have_one_winner() {
    let db = TestDb::new("lease_race");
    let mut dead = db.open_with(quick());
    let mut last_token = 0;
    for round in 0..20 {
        let session = s(&format!("s{round}"));
        let first = dead
            .acquire_session(&HostId::new("dead").unwrap(), &session)
            .unwrap();
        assert!(first.token > last_token);
        std::thread::sleep(Duration::from_millis(650));
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
        let racers: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|name| {
                let mut store = db.open_with(quick());
                let barrier = barrier.clone();
                let session = session.clone();
                std::thread::spawn(move || {
                    barrier.wait();
                    store.acquire_session(&HostId::new(name).unwrap(), &session)
                })
            })
            .collect();
        let results: Vec<_> = racers.into_iter().map(|r| r.join().unwrap()).collect();
        let won: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(won.len(), 1, "round {round}: {results:?}");
        let winner = won[0];
        assert!(winner.token > first.token);
        last_token = winner.token;
        let lost = results.iter().find_map(|r| r.as_ref().err()).unwrap();
        assert!(
            matches!(lost, LeaseError::Busy(b) if b.holder == winner.host),
            "round {round}: {lost:?}"
        );
    }
}
