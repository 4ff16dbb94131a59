//! Several hosts on one store (MH-01, MH-02, MH-04, MH-05): custody works only the
//! scopes it was granted, a write refused for a lost lease lets the scope go at once and
//! is never retried, the host that takes the scope over confirms an in-flight send from
//! history instead of sending it again, and a session message for a scope another host
//! serves is saved for that host.
#![allow(clippy::unwrap_used)]

mod common;

use outbox_core::adapter::StopRequest;
use outbox_core::ids::ScopeId;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use common::*;
use outbox_core::adapter::{Capabilities, HistoryRead};
use outbox_core::custody::{Custody, CustodyEffect, SessionInfo, SubmitError};
use outbox_core::entry::{Controls, OutboxEntry, StoredEntry};
use outbox_core::fingerprint::Digest256;
use outbox_core::ids::RunId;
use outbox_core::ids::{base_session, OperationId, QueueId, SessionId};
use outbox_core::ledger::{LedgerRecord, LedgerStatus};
use outbox_core::runs::{ActiveRun, RunError};
use outbox_core::store::memory::MemoryOutboxStore;
use outbox_core::store::{
    Claim, Identity, OutboxError, OutboxErrorKind, OutboxStore, RouteClaim, SessionMessageRoute,
};
use outbox_core::store::{SharedCancellation, SharedRun, SharedRuns, SharedScope};
use timeline_core::time::Millis;

/// One database: the outbox, who holds each scope's lease, and the run registry the
/// hosts share.
#[derive(Default)]
struct Db {
    store: MemoryOutboxStore,
    holders: BTreeMap<SessionId, &'static str>,
    /// Writes refused for a lost lease.
    refused: usize,
    runs: Table,
}

/// The shared run registry, by the database's clock `now` (set by each test), as the
/// PostgreSQL store keeps it: a run of another host may be reclaimed once it had no
/// activity for `STALE` and its host stopped renewing it for `LEASE`.
#[derive(Default)]
struct Table {
    now: u64,
    /// (run, host, last activity, lease until) per session.
    active: BTreeMap<SessionId, (ActiveRun, &'static str, u64, u64)>,
    stops: BTreeMap<(SessionId, RunId), &'static str>,
    /// While set, every write fails.
    down: bool,
}

const STALE: u64 = 3_000;
const LEASE: u64 = 1_500;

impl Table {
    fn reclaimable_in(&self, last: u64, until: u64) -> u64 {
        (last + STALE).max(until).saturating_sub(self.now)
    }
}

impl SharedRuns for Fenced {
    fn start_run(
        &mut self,
        session: &SessionId,
        run: &ActiveRun,
    ) -> Result<Result<(), RunError>, OutboxError> {
        let host = self.host;
        let mut db = self.db.lock().unwrap();
        let t = &mut db.runs;
        if t.down {
            return Err(OutboxError::unavailable("the registry is down"));
        }
        let base = base_session(session);
        if t.stops
            .iter()
            .any(|((s, _), h)| base_session(s) == base && *h != host)
        {
            return Ok(Err(RunError::CancellationPending));
        }
        if let Some((current, by, last, until)) = t.active.get(session) {
            let same = *by == host && current.run_id == run.run_id;
            if !same && t.reclaimable_in(*last, *until) > 0 {
                return Ok(Err(RunError::InProgress));
            }
        }
        let now = t.now;
        t.active
            .insert(session.clone(), (run.clone(), host, now, now + LEASE));
        Ok(Ok(()))
    }
    fn end_run(&mut self, session: &SessionId, run: &RunId) -> Result<(), OutboxError> {
        let mut db = self.db.lock().unwrap();
        if db.runs.down {
            return Err(OutboxError::unavailable("the registry is down"));
        }
        if db
            .runs
            .active
            .get(session)
            .is_some_and(|a| a.0.run_id == *run)
        {
            db.runs.active.remove(session);
        }
        Ok(())
    }
    fn joined_by(
        &mut self,
        session: &SessionId,
        run: &RunId,
        op: &OperationId,
    ) -> Result<(), OutboxError> {
        let mut db = self.db.lock().unwrap();
        if db.runs.down {
            return Err(OutboxError::unavailable("the registry is down"));
        }
        if let Some(a) = db.runs.active.get_mut(session) {
            if a.0.run_id == *run {
                a.0.last_session_message = Some(op.clone());
            }
        }
        Ok(())
    }
    fn renew(
        &mut self,
        runs: &[(SessionId, RunId, bool)],
        _stops: &[(SessionId, RunId)],
    ) -> Result<(), OutboxError> {
        let host = self.host;
        let mut db = self.db.lock().unwrap();
        let t = &mut db.runs;
        if t.down {
            return Err(OutboxError::unavailable("the registry is down"));
        }
        let now = t.now;
        for (session, run, touched) in runs {
            if let Some(a) = t.active.get_mut(session) {
                if a.0.run_id == *run && a.1 == host {
                    a.3 = now + LEASE;
                    if *touched {
                        a.2 = now;
                    }
                }
            }
        }
        Ok(())
    }
    fn renew_every(&self) -> Millis {
        Millis(LEASE / 3)
    }
    fn begin_cancellation(&mut self, session: &SessionId, run: &RunId) -> Result<(), OutboxError> {
        let mut db = self.db.lock().unwrap();
        if db.runs.down {
            return Err(OutboxError::unavailable("the registry is down"));
        }
        db.runs
            .stops
            .insert((session.clone(), run.clone()), self.host);
        Ok(())
    }
    fn end_cancellation(&mut self, session: &SessionId, run: &RunId) -> Result<(), OutboxError> {
        let mut db = self.db.lock().unwrap();
        if db.runs.down {
            return Err(OutboxError::unavailable("the registry is down"));
        }
        db.runs.stops.remove(&(session.clone(), run.clone()));
        Ok(())
    }
    fn scope(&mut self, base: &SessionId) -> Result<SharedScope, OutboxError> {
        let host = self.host;
        let db = self.db.lock().unwrap();
        let t = &db.runs;
        let mut scope = SharedScope::default();
        for (session, (run, by, last, until)) in &t.active {
            if base_session(session) == *base {
                let mut r = SharedRun::new(session.clone(), run.clone());
                r.mine = *by == host;
                r.reclaimable_in = Millis(t.reclaimable_in(*last, *until));
                scope.runs.push(r);
            }
        }
        for ((session, run), by) in &t.stops {
            if base_session(session) == *base {
                let mut stop = SharedCancellation::new(session.clone(), run.clone());
                stop.mine = *by == host;
                scope.cancellations.push(stop);
            }
        }
        Ok(scope)
    }
}

/// One host's connection: every write checks that this host holds the lease of the
/// session it writes, as the PostgreSQL store's fencing does.
struct Fenced {
    host: &'static str,
    db: Arc<Mutex<Db>>,
    /// The host writes its runs through to the shared registry.
    shared: bool,
}

impl Fenced {
    fn write<T>(
        &mut self,
        session: &SessionId,
        f: impl FnOnce(&mut MemoryOutboxStore) -> Result<T, OutboxError>,
    ) -> Result<T, OutboxError> {
        let mut db = self.db.lock().unwrap();
        let base = base_session(session);
        if db.holders.get(&base) != Some(&self.host) {
            db.refused += 1;
            return Err(OutboxError::LeaseLost {
                message: format!("host {} does not hold session {base}", self.host),
                session: base,
            });
        }
        f(&mut db.store)
    }
    fn read<T>(&mut self, f: impl FnOnce(&mut MemoryOutboxStore) -> T) -> T {
        f(&mut self.db.lock().unwrap().store)
    }
}

impl OutboxStore for Fenced {
    fn shared_runs(&mut self) -> Option<&mut dyn SharedRuns> {
        if self.shared {
            Some(self)
        } else {
            None
        }
    }
    fn claim(
        &mut self,
        session: &SessionId,
        fingerprint: &Digest256,
        entry: &OutboxEntry,
    ) -> Result<Claim, OutboxError> {
        self.write(session, |s| s.claim(session, fingerprint, entry))
    }
    fn claim_session_message(
        &mut self,
        recipient: &SessionId,
        fingerprint: &Digest256,
        entry: &OutboxEntry,
        route: &SessionMessageRoute,
    ) -> Result<RouteClaim, OutboxError> {
        self.read(|s| s.claim_session_message(recipient, fingerprint, entry, route))
    }
    fn identity(
        &mut self,
        session: &SessionId,
        op: &OperationId,
    ) -> Result<Option<Identity>, OutboxError> {
        self.read(|s| s.identity(session, op))
    }
    fn entries(&mut self, session: &SessionId) -> Result<Vec<StoredEntry>, OutboxError> {
        self.read(|s| s.entries(session))
    }
    fn outbox_sessions(&mut self) -> Result<Vec<SessionId>, OutboxError> {
        self.read(|s| s.outbox_sessions())
    }
    fn replace_entry(
        &mut self,
        session: &SessionId,
        expected: &OutboxEntry,
        new: &OutboxEntry,
    ) -> Result<bool, OutboxError> {
        self.write(session, |s| s.replace_entry(session, expected, new))
    }
    fn rekey_entry(
        &mut self,
        session: &SessionId,
        expected: &OutboxEntry,
        fingerprint: &Digest256,
        new: &OutboxEntry,
    ) -> Result<bool, OutboxError> {
        self.write(session, |s| {
            s.rekey_entry(session, expected, fingerprint, new)
        })
    }
    fn remove_entry(
        &mut self,
        session: &SessionId,
        queue_id: &QueueId,
    ) -> Result<Option<OutboxEntry>, OutboxError> {
        self.write(session, |s| s.remove_entry(session, queue_id))
    }
    fn set_positions(
        &mut self,
        session: &SessionId,
        positions: &[(QueueId, i64)],
    ) -> Result<(), OutboxError> {
        self.write(session, |s| s.set_positions(session, positions))
    }
    fn ledger(
        &mut self,
        scope: &ScopeId,
        op: &OperationId,
    ) -> Result<Option<LedgerRecord>, OutboxError> {
        self.read(|s| s.ledger(scope, op))
    }
    fn put_ledger(
        &mut self,
        scope: &ScopeId,
        op: &OperationId,
        record: &LedgerRecord,
    ) -> Result<(), OutboxError> {
        self.write(scope.base(), |s| s.put_ledger(scope, op, record))
    }
    fn confirm_sent(
        &mut self,
        scope: &ScopeId,
        members: &[SessionId],
        op: &OperationId,
        record: &LedgerRecord,
    ) -> Result<Vec<(SessionId, QueueId)>, OutboxError> {
        self.write(scope.base(), |s| s.confirm_sent(scope, members, op, record))
    }
    fn route(&mut self, op: &OperationId) -> Result<Option<SessionMessageRoute>, OutboxError> {
        self.read(|s| s.route(op))
    }
    fn set_route_delivery(
        &mut self,
        op: &OperationId,
        delivery: outbox_core::store::RouteDelivery,
    ) -> Result<(), OutboxError> {
        self.read(|s| s.set_route_delivery(op, delivery))
    }
}

fn host(name: &'static str, db: &Arc<Mutex<Db>>) -> Custody<Fenced> {
    host_with(name, db, false)
}

/// A host whose runs are written through to the shared registry.
fn sharing(name: &'static str, db: &Arc<Mutex<Db>>) -> Custody<Fenced> {
    host_with(name, db, true)
}

fn host_with(name: &'static str, db: &Arc<Mutex<Db>>, shared: bool) -> Custody<Fenced> {
    let mut c = Custody::new(
        Fenced {
            host: name,
            db: db.clone(),
            shared,
        },
        uuids(),
    );
    c.set_session(&s("s1"), SessionInfo::new(Capabilities::codex()));
    c.set_session(&s("s2"), SessionInfo::new(Capabilities::codex()));
    c.grant_only();
    c
}

fn effects(c: &mut Custody<Fenced>) -> Vec<CustodyEffect> {
    std::iter::from_fn(|| c.poll_effect()).collect()
}

fn lease(db: &Arc<Mutex<Db>>, session: &str, holder: &'static str) {
    db.lock().unwrap().holders.insert(s(session), holder);
}

// MH-01: a scope that was not granted is neither read nor written; the caller gets a
// typed error with the code a client can act on, and nothing is stored.
#[test]
fn a_scope_not_granted_is_refused_with_a_typed_error_and_nothing_is_written() {
    let db = Arc::new(Mutex::new(Db::default()));
    lease(&db, "s1", "a");
    let mut a = host("a", &db);
    let err = a
        .submit(submit_req("s1", "1", Controls::automatic()), Millis(1_000))
        .unwrap_err();
    let SubmitError::Store(store) = &err else {
        panic!("{err:?}")
    };
    assert_eq!(store.kind(), OutboxErrorKind::LeaseLost);
    assert_eq!(err.error_code(), "SESSION_ELSEWHERE");
    assert!(db
        .lock()
        .unwrap()
        .store
        .entries(&s("s1"))
        .unwrap()
        .is_empty());
    // Nothing was granted, so nothing is released and nothing waits.
    assert!(effects(&mut a).is_empty());
    assert_eq!(a.poll_timeout(), None);
    // Granted, the same request goes through.
    a.grant_scope(&s("s1"), Millis(1_001));
    a.submit(submit_req("s1", "1", Controls::automatic()), Millis(1_002))
        .unwrap();
    assert!(effects(&mut a)
        .iter()
        .any(|e| matches!(e, CustodyEffect::Send(r) if r.operation_id == op("op-1"))));
}

// MH-01, MH-05: host `a` hands a message to its agent, then loses the lease to `b` (a
// cut-off host's lease expired). `a`'s next write is refused: it lets the scope go at
// once, says so, and keeps no retry. `b` takes the scope over and confirms the message
// from history; it never sends it again, and `a`'s late answers change nothing.
#[test]
fn a_lost_lease_lets_the_scope_go_and_the_new_owner_confirms_from_history() {
    let db = Arc::new(Mutex::new(Db::default()));
    lease(&db, "s1", "a");
    lease(&db, "s2", "a");
    let mut a = host("a", &db);
    a.grant_scope(&s("s1"), Millis(1_000));
    a.grant_scope(&s("s2"), Millis(1_000));
    a.submit(submit_req("s1", "1", Controls::automatic()), Millis(1_000))
        .unwrap();
    let send = effects(&mut a)
        .into_iter()
        .find_map(|e| match e {
            CustodyEffect::Send(r) => Some(r),
            _ => None,
        })
        .expect("handed to the agent");

    // The lease of s1 passes to `b`; `a` has not noticed yet.
    lease(&db, "s1", "b");
    let refused_before = db.lock().unwrap().refused;
    a.handle_delivery_proof(&s("s1"), &op("op-1"), Millis(1_100));
    let released: Vec<CustodyEffect> = effects(&mut a);
    assert!(
        released.iter().any(
            |e| matches!(e, CustodyEffect::ScopeReleased { session, .. } if *session == s("s1"))
        ),
        "{released:?}"
    );
    assert!(
        !released
            .iter()
            .any(|e| matches!(e, CustodyEffect::StoreFailed(_))),
        "a lost lease is not a store failure to retry: {released:?}"
    );
    assert!(db.lock().unwrap().refused > refused_before);
    assert!(!a.scope_granted(&s("s1")));
    assert!(a.scope_granted(&s("s2")), "only the lost scope goes");
    // Nothing of s1 is retried: no deadline, and time passing writes nothing.
    assert_eq!(a.poll_timeout(), None);
    let refused = db.lock().unwrap().refused;
    a.handle_timeout(Millis(60_000));
    assert_eq!(db.lock().unwrap().refused, refused);
    assert!(effects(&mut a).is_empty());

    // `b` takes over: the entry is out with nothing in flight here, so it is confirmed
    // from the agent's history, never sent.
    let mut b = host("b", &db);
    b.grant_scope(&s("s1"), Millis(2_000));
    let taken: Vec<CustodyEffect> = effects(&mut b);
    assert!(
        !taken.iter().any(|e| matches!(e, CustodyEffect::Send(_))),
        "{taken:?}"
    );
    let attempt = history_read(&taken, "s1", "op-1").expect("an uncertain-delivery read");
    b.handle_history_read(attempt, HistoryRead::Found, Millis(2_010));
    let entries = db.lock().unwrap().store.entries(&s("s1")).unwrap();
    assert!(entries.is_empty(), "{entries:?}");
    let ledger = db
        .lock()
        .unwrap()
        .store
        .ledger(&ScopeId::of(&s("s1")), &op("op-1"))
        .unwrap();
    assert_eq!(ledger.map(|l| l.status), Some(LedgerStatus::Sent));

    // The old host's answer to its own attempt arrives late: ignored.
    a.handle_send_result(
        send.attempt,
        outbox_core::adapter::SendResult::AdmissionUncertain {
            error: "late".into(),
        },
        Millis(2_100),
    );
    assert!(effects(&mut a).is_empty());
    assert_eq!(
        db.lock()
            .unwrap()
            .store
            .ledger(&ScopeId::of(&s("s1")), &op("op-1"))
            .unwrap()
            .map(|l| l.status),
        Some(LedgerStatus::Sent)
    );
}

// MH-05: the dead host had one message out with its agent and one queued behind it. The
// new owner confirms the first from history and sends the second, once.
#[test]
fn a_queued_message_drains_once_on_the_host_that_takes_the_scope_over() {
    let db = Arc::new(Mutex::new(Db::default()));
    lease(&db, "s1", "a");
    let mut a = host("a", &db);
    a.grant_scope(&s("s1"), Millis(1_000));
    a.submit(submit_req("s1", "1", Controls::automatic()), Millis(1_000))
        .unwrap();
    a.submit(submit_req("s1", "2", Controls::automatic()), Millis(1_001))
        .unwrap();
    let sent_by_a: Vec<OperationId> = effects(&mut a)
        .into_iter()
        .filter_map(|e| match e {
            CustodyEffect::Send(r) => Some(r.operation_id),
            _ => None,
        })
        .collect();
    assert_eq!(
        sent_by_a,
        vec![op("op-1")],
        "the second waits behind the first"
    );
    drop(a); // the host dies
    lease(&db, "s1", "b");
    let mut b = host("b", &db);
    b.grant_scope(&s("s1"), Millis(20_000));
    let taken = effects(&mut b);
    assert!(
        !taken.iter().any(|e| matches!(e, CustodyEffect::Send(_))),
        "{taken:?}"
    );
    let attempt = history_read(&taken, "s1", "op-1").expect("the first is confirmed");
    b.handle_history_read(attempt, HistoryRead::Found, Millis(20_010));
    let sends: Vec<OperationId> = effects(&mut b)
        .into_iter()
        .filter_map(|e| match e {
            CustodyEffect::Send(r) => Some(r.operation_id),
            _ => None,
        })
        .collect();
    assert_eq!(sends, vec![op("op-2")]);
}

// MH-01: releasing a scope by hand (a host handing it over) drops its work and says so;
// releasing one not granted does nothing.
#[test]
fn a_release_drops_the_scope_and_a_second_release_does_nothing() {
    let db = Arc::new(Mutex::new(Db::default()));
    lease(&db, "s1", "a");
    let mut a = host("a", &db);
    a.grant_scope(&s("s1::skills-agent"), Millis(1_000));
    assert!(
        a.scope_granted(&s("s1")),
        "the alias grants its base's scope"
    );
    a.submit(submit_req("s1", "1", Controls::automatic()), Millis(1_000))
        .unwrap();
    let _ = effects(&mut a);
    assert!(a.poll_timeout().is_some(), "the send's deadline");
    assert!(a.release_scope(&s("s1"), "handed over"));
    assert_eq!(
        effects(&mut a),
        vec![CustodyEffect::ScopeReleased {
            session: s("s1"),
            reason: "handed over".into()
        }]
    );
    assert_eq!(a.poll_timeout(), None, "no deadline of the scope is kept");
    assert!(!a.release_scope(&s("s1"), "again"));
    assert!(effects(&mut a).is_empty());
}

// MH-04: a session message from a scope this host serves to one another host serves is
// written into the recipient's saved queue (after what is there) and answered queued;
// this host starts nothing for it. The recipient's owner, woken, reads the scope again
// and sends it once.
#[test]
fn a_session_message_to_a_scope_served_elsewhere_is_saved_for_its_owner() {
    use outbox_core::entry::AccessLevel;
    use outbox_core::ids::CallId;
    use outbox_core::session_message::{SessionMessageCall, ToolResult};
    use timeline_core::AgentKind;

    let db = Arc::new(Mutex::new(Db::default()));
    lease(&db, "s1", "a");
    lease(&db, "s2", "b");
    let with_access = |mut c: Custody<Fenced>| {
        for id in ["s1", "s2"] {
            let mut info = SessionInfo::new(Capabilities::codex());
            info.access = Some(AccessLevel::FullAccess);
            c.set_session(&s(id), info);
        }
        c
    };
    let mut a = with_access(host("a", &db));
    let mut b = with_access(host("b", &db));
    a.grant_scope(&s("s1"), Millis(1_000));
    b.grant_scope(&s("s2"), Millis(1_000));
    b.submit(submit_req("s2", "1", Controls::automatic()), Millis(1_001))
        .unwrap();
    let (in_flight, run) = effects(&mut b)
        .into_iter()
        .find_map(|e| match e {
            CustodyEffect::Send(r) => match r.kind {
                outbox_core::adapter::SendKind::Start { run } => Some((r.attempt, run)),
                outbox_core::adapter::SendKind::Steer { .. } => None,
            },
            _ => None,
        })
        .expect("op-1 starts a run");
    let result = a
        .send_session_message(
            SessionMessageCall {
                sender_session: s("s1"),
                sender_run: None,
                sender_thread: None,
                call_id: CallId::new("call-1").unwrap(),
                recipient: Some(s("s2")),
                body: "Please run the build.".into(),
                sender_title: "Web".into(),
                sender_agent: AgentKind::Codex,
                sender_access: AccessLevel::FullAccess,
                sender_project: None,
                product: "HB Code".into(),
            },
            Millis(1_002),
        )
        .unwrap();
    assert_eq!(result, ToolResult::Queued);
    assert!(
        !effects(&mut a)
            .iter()
            .any(|e| matches!(e, CustodyEffect::Send(_))),
        "the sender's host sends nothing for another host's session"
    );
    let saved = db.lock().unwrap().store.entries(&s("s2")).unwrap();
    assert_eq!(saved.len(), 2);
    let message = saved
        .iter()
        .find(|e| e.entry().is_some_and(|x| x.session_message.is_some()))
        .expect("saved in the recipient's queue");
    let first = saved
        .iter()
        .find(|e| e.entry().is_some_and(|x| x.session_message.is_none()))
        .unwrap();
    assert!(
        message.position() > first.position(),
        "after what was saved"
    );

    // Woken, the owner reads the scope again: once op-1's run ends, the message goes.
    let message_op = message.entry().unwrap().operation_id.clone();
    b.grant_scope(&s("s2"), Millis(1_003));
    let woken = effects(&mut b);
    assert!(
        woken.is_empty(),
        "it waits behind the message in flight, which is not read again: {woken:?}"
    );
    b.handle_send_result(
        in_flight,
        outbox_core::adapter::SendResult::Delivered,
        Millis(1_004),
    );
    effects(&mut b);
    b.handle_run_ended(&s("s2"), &run, &[], Millis(1_005));
    let sent: Vec<OperationId> = effects(&mut b)
        .into_iter()
        .filter_map(|e| match e {
            CustodyEffect::Send(r) => Some(r.operation_id),
            _ => None,
        })
        .collect();
    assert_eq!(sent, vec![message_op], "then it goes, once");
}

fn at(db: &Arc<Mutex<Db>>, now: u64) -> Millis {
    db.lock().unwrap().runs.now = now;
    Millis(now)
}

fn started(effects: &[CustodyEffect]) -> Vec<(OperationId, RunId)> {
    effects
        .iter()
        .filter_map(|e| match e {
            CustodyEffect::Send(r) => match &r.kind {
                outbox_core::adapter::SendKind::Start { run } => {
                    Some((r.operation_id.clone(), run.clone()))
                }
                outbox_core::adapter::SendKind::Steer { .. } => None,
            },
            _ => None,
        })
        .collect()
}

fn shared_run(db: &Arc<Mutex<Db>>, session: &str) -> Option<(RunId, &'static str)> {
    let db = db.lock().unwrap();
    db.runs
        .active
        .get(&s(session))
        .map(|(r, host, _, _)| (r.run_id.clone(), *host))
}

// MH-03, OB-14: host `a` dies mid-turn with a message queued behind its run. The new
// owner adopts the run from the shared registry: the queued message waits for it (one
// active run per session across hosts), and goes, once, when the registry says the run
// may be reclaimed: no activity for the stale limit and its host stopped renewing it.
#[test]
fn a_run_a_dead_host_left_holds_its_session_until_it_may_be_reclaimed() {
    let (db, mut a, run) = a_started_op_1();
    assert_eq!(shared_run(&db, "s1"), Some((run.clone(), "a")));
    a.submit(submit_req("s1", "2", Controls::automatic()), at(&db, 1_010))
        .unwrap();
    assert!(
        started(&effects(&mut a)).is_empty(),
        "op-2 waits behind the run"
    );
    // Renewed while `a` lives: the lease moves on.
    let renew = a.poll_timeout().expect("a renewal is due");
    assert!(renew <= Millis(1_000 + LEASE / 3), "{renew:?}");
    a.handle_timeout(at(&db, renew.as_u64()));
    let until = db.lock().unwrap().runs.active[&s("s1")].3;
    assert_eq!(until, renew.as_u64() + LEASE);
    drop(a); // killed mid-turn

    lease(&db, "s1", "b");
    let mut b = sharing("b", &db);
    let t = at(&db, 2_000);
    b.grant_scope(&s("s1"), t);
    let taken = effects(&mut b);
    assert!(started(&taken).is_empty(), "{taken:?}");
    assert_eq!(
        b.runs().active(&s("s1")).map(|r| r.run_id.clone()),
        Some(run.clone()),
        "the dead host's run is adopted"
    );
    // op-1 was out with nothing under way: confirmed from history, never sent again.
    let read = history_read(&taken, "s1", "op-1").expect("an uncertain-delivery read");
    b.handle_history_read(read, HistoryRead::Found, at(&db, 2_010));
    assert!(
        started(&effects(&mut b)).is_empty(),
        "op-2 still waits for the adopted run"
    );
    // The registry: last activity 1,000, lease renewed to `renew + LEASE`; reclaimable
    // at 1,000 + STALE = 4,000.
    let due = b.poll_timeout().expect("the adopted run's reclaim is due");
    assert_eq!(due, Millis(4_000));
    b.handle_timeout(at(&db, 3_999));
    assert!(started(&effects(&mut b)).is_empty(), "not before it may");
    b.handle_timeout(at(&db, 4_000));
    let after = effects(&mut b);
    let sent = started(&after);
    assert_eq!(sent.len(), 1, "{after:?}");
    assert_eq!(sent[0].0, op("op-2"));
    assert_ne!(sent[0].1, run);
    assert_eq!(shared_run(&db, "s1"), Some((sent[0].1.clone(), "b")));
}

// MH-03, OB-14: a run another host holds in the shared registry refuses a start here;
// nothing is sent, the run is adopted, and the message goes when it ends.
#[test]
fn a_start_the_shared_registry_refuses_waits_for_the_other_hosts_run() {
    let db = Arc::new(Mutex::new(Db::default()));
    lease(&db, "s1", "b");
    let mut b = sharing("b", &db);
    b.grant_scope(&s("s1"), at(&db, 1_000));
    assert!(effects(&mut b).is_empty());
    // A host that was cut off still holds a run of s1 in the registry.
    let other = RunId::new("run-c").unwrap();
    {
        let mut db = db.lock().unwrap();
        let mut run = b_active(&other);
        run.last_activity = Millis(0);
        db.runs
            .active
            .insert(s("s1"), (run, "c", 1_000, 1_000 + LEASE));
    }
    b.submit(submit_req("s1", "1", Controls::automatic()), at(&db, 1_100))
        .unwrap();
    let refused = effects(&mut b);
    assert!(started(&refused).is_empty(), "{refused:?}");
    assert_eq!(shared_run(&db, "s1"), Some((other.clone(), "c")));
    assert_eq!(
        b.runs().active(&s("s1")).map(|r| r.run_id.clone()),
        Some(other.clone())
    );
    // Last activity 1,000 by the registry's clock: it may be reclaimed at 1,000 + STALE.
    let due = b.poll_timeout().unwrap();
    assert_eq!(due, Millis(4_000));
    b.handle_timeout(at(&db, due.as_u64()));
    let sent = started(&effects(&mut b));
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].0, op("op-1"));
}

fn b_active(run: &RunId) -> ActiveRun {
    ActiveRun {
        run_id: run.clone(),
        started_by: None,
        last_session_message: None,
        access: None,
        last_activity: Millis(0),
        finalizing: false,
    }
}

// MH-05, OB-15: a stop host `a` began and did not end is resumed by the host that takes
// the scope over; once stopped, the run leaves both registries and the queue drains.
#[test]
fn a_stop_the_dead_host_began_is_resumed_by_the_new_owner() {
    let db = Arc::new(Mutex::new(Db::default()));
    lease(&db, "s1", "a");
    let mut a = sharing("a", &db);
    let t = at(&db, 1_000);
    a.grant_scope(&s("s1"), t);
    a.submit(submit_req("s1", "1", Controls::automatic()), t)
        .unwrap();
    let (send, run) = effects(&mut a)
        .into_iter()
        .find_map(|e| match e {
            CustodyEffect::Send(r) => match r.kind {
                outbox_core::adapter::SendKind::Start { run } => Some((r.attempt, run)),
                outbox_core::adapter::SendKind::Steer { .. } => None,
            },
            _ => None,
        })
        .expect("op-1 starts a run");
    a.handle_send_result(
        send,
        outbox_core::adapter::SendResult::Delivered,
        at(&db, 1_001),
    );
    a.submit(submit_req("s1", "2", Controls::automatic()), at(&db, 1_002))
        .unwrap();
    a.stop(&s("s1"), &run, None, at(&db, 1_003));
    assert!(effects(&mut a)
        .iter()
        .any(|e| matches!(e, CustodyEffect::Stop(StopRequest { run: r, .. }) if *r == run)));
    assert!(db
        .lock()
        .unwrap()
        .runs
        .stops
        .contains_key(&(s("s1"), run.clone())));
    drop(a); // dies before the agent answers

    lease(&db, "s1", "b");
    let mut b = sharing("b", &db);
    b.grant_scope(&s("s1"), at(&db, 2_000));
    let taken = effects(&mut b);
    let attempt = taken
        .iter()
        .find_map(|e| match e {
            CustodyEffect::Stop(StopRequest {
                attempt, run: r, ..
            }) if *r == run => Some(*attempt),
            _ => None,
        })
        .unwrap_or_else(|| panic!("the stop is resumed: {taken:?}"));
    assert!(started(&taken).is_empty());
    b.handle_stop_result(
        attempt,
        outbox_core::adapter::StopResult::Stopped {
            untaken: Vec::new(),
        },
        at(&db, 2_100),
    );
    let after = effects(&mut b);
    assert!(db.lock().unwrap().runs.stops.is_empty(), "the stop ended");
    let sent = started(&after);
    assert_eq!(sent.len(), 1, "{after:?}");
    assert_eq!(sent[0].0, op("op-2"));
    assert_eq!(shared_run(&db, "s1"), Some((sent[0].1.clone(), "b")));
}

// MH-03: an end the shared registry could not take is reported, kept and written at the
// next renewal; until then nothing else is lost.
#[test]
fn an_end_the_shared_registry_missed_is_written_at_the_next_renewal() {
    let (db, mut a, run) = a_started_op_1();
    db.lock().unwrap().runs.down = true;
    a.handle_run_ended(&s("s1"), &run, &[], at(&db, 1_100));
    let failed = effects(&mut a);
    assert!(
        failed
            .iter()
            .any(|e| matches!(e, CustodyEffect::StoreFailed(f) if f.session == s("s1"))),
        "{failed:?}"
    );
    assert!(a.runs().active(&s("s1")).is_none());
    assert_eq!(shared_run(&db, "s1").map(|r| r.0), Some(run.clone()));
    // Still down at the first renewal: kept, reported again.
    let due = a.poll_timeout().expect("a renewal is due");
    a.handle_timeout(at(&db, due.as_u64()));
    assert!(effects(&mut a)
        .iter()
        .any(|e| matches!(e, CustodyEffect::StoreFailed(_))));
    assert_eq!(shared_run(&db, "s1").map(|r| r.0), Some(run));
    db.lock().unwrap().runs.down = false;
    let due = a.poll_timeout().expect("the owed end keeps a renewal due");
    a.handle_timeout(at(&db, due.as_u64()));
    assert_eq!(shared_run(&db, "s1"), None);
    assert!(effects(&mut a).is_empty());
    assert_eq!(
        a.poll_timeout(),
        Some(Millis(1_000 + 31_000)),
        "nothing left to renew or write: only the unanswered send's own deadline"
    );
}

// MH-03: a scope that comes back to the host that let it go adopts that host's own run
// from before, which the agent may still be working: a new message waits for it as for
// any other host's run.
#[test]
fn a_scope_granted_again_to_its_last_host_waits_for_that_hosts_old_run() {
    let (db, mut a, old) = a_started_op_1();
    assert!(a.release_scope(&s("s1"), "the lease lapsed"));
    effects(&mut a);
    // The lease comes back to `a`; op-1, out with nothing under way, is confirmed.
    a.grant_scope(&s("s1"), at(&db, 2_000));
    let read = history_read(&effects(&mut a), "s1", "op-1").expect("a history read");
    a.handle_history_read(read, HistoryRead::Found, at(&db, 2_005));
    effects(&mut a);
    assert_eq!(
        a.runs().active(&s("s1")).map(|r| r.run_id.clone()),
        Some(old.clone()),
        "its own old run is adopted"
    );
    a.submit(submit_req("s1", "2", Controls::automatic()), at(&db, 2_010))
        .unwrap();
    assert!(
        started(&effects(&mut a)).is_empty(),
        "op-2 waits for the old run"
    );
    // Not renewed since 1,000: it may be reclaimed at 1,000 + STALE, not before.
    let early = until(&mut a, &db, 3_999);
    assert!(started(&early).is_empty(), "{early:?}");
    let sent = started(&until(&mut a, &db, 4_000));
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].0, op("op-2"));
    assert_eq!(shared_run(&db, "s1"), Some((sent[0].1.clone(), "a")));
}

// MH-03: an adopted run whose host renewed it after the adoption is not reclaimed at the
// time first read: custody asks the registry again and waits for the new time.
#[test]
fn an_adopted_run_its_host_renewed_meanwhile_is_asked_about_again() {
    let (db, mut a, run) = a_started_op_1();
    lease(&db, "s1", "b");
    let mut b = sharing("b", &db);
    b.grant_scope(&s("s1"), at(&db, 2_000));
    let read = history_read(&effects(&mut b), "s1", "op-1").expect("a history read");
    b.handle_history_read(read, HistoryRead::Found, at(&db, 2_005));
    effects(&mut b);
    b.submit(submit_req("s1", "2", Controls::automatic()), at(&db, 2_010))
        .unwrap();
    assert_eq!(b.poll_timeout(), Some(Millis(4_000)));
    // `a` still lives (cut off from its lease, not from the registry) and its turn has
    // activity: its renewal moves the run's times on.
    at(&db, 3_500);
    a.handle_timeout(Millis(3_500));
    effects(&mut a);
    {
        let mut db = db.lock().unwrap();
        let row = db.runs.active.get_mut(&s("s1")).unwrap();
        row.2 = 3_500;
        row.3 = 3_500 + LEASE;
    }
    b.handle_timeout(at(&db, 4_000));
    assert!(
        started(&effects(&mut b)).is_empty(),
        "renewed: still a's run"
    );
    assert_eq!(shared_run(&db, "s1"), Some((run.clone(), "a")));
    assert_eq!(b.poll_timeout(), Some(Millis(3_500 + STALE)));
    b.handle_timeout(at(&db, 3_500 + STALE));
    let sent = started(&effects(&mut b));
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].0, op("op-2"));
}

// MH-03: writes owed while the registry was down are written, in order, before the next
// start: a restore and the end of that run reach the registry before the new run, so the
// new run is what it holds.
#[test]
fn owed_writes_reach_the_registry_before_the_next_start() {
    let db = Arc::new(Mutex::new(Db::default()));
    lease(&db, "s1", "a");
    let mut a = sharing("a", &db);
    a.grant_scope(&s("s1"), at(&db, 1_000));
    effects(&mut a);
    db.lock().unwrap().runs.down = true;
    let old = RunId::new("run-old").unwrap();
    let mut restored = b_active(&old);
    restored.last_activity = Millis(1_000);
    a.restore_run(&s("s1"), restored, at(&db, 1_000)).unwrap();
    a.handle_run_ended(&s("s1"), &old, &[], at(&db, 1_010));
    let failed = effects(&mut a);
    assert!(
        failed
            .iter()
            .any(|e| matches!(e, CustodyEffect::StoreFailed(_))),
        "{failed:?}"
    );
    db.lock().unwrap().runs.down = false;
    a.submit(submit_req("s1", "1", Controls::automatic()), at(&db, 1_100))
        .unwrap();
    let sent = started(&effects(&mut a));
    assert_eq!(sent.len(), 1);
    assert_eq!(shared_run(&db, "s1"), Some((sent[0].1.clone(), "a")));
}

/// Handles every deadline of `c` up to `t`, in order; the effects they had.
fn until(c: &mut Custody<Fenced>, db: &Arc<Mutex<Db>>, t: u64) -> Vec<CustodyEffect> {
    let mut out = Vec::new();
    let mut steps = 0;
    while let Some(due) = c.poll_timeout().filter(|d| d.as_u64() <= t) {
        steps += 1;
        assert!(steps < 1_000, "a deadline at {due:?} is never cleared");
        c.handle_timeout(at(db, due.as_u64()));
        out.extend(effects(c));
    }
    out
}

// MH-03: an end still owed when the scope is taken up again is written before the
// registry is read, so the run this host ended is not adopted as a live one.
#[test]
fn a_run_this_host_ended_is_not_adopted_back_while_its_end_is_owed() {
    let (db, mut a, run) = a_started_op_1();
    db.lock().unwrap().runs.down = true;
    a.handle_run_ended(&s("s1"), &run, &[], at(&db, 1_100));
    effects(&mut a);
    assert_eq!(shared_run(&db, "s1").map(|r| r.0), Some(run));
    db.lock().unwrap().runs.down = false;
    assert!(a.release_scope(&s("s1"), "handed over"));
    a.grant_scope(&s("s1"), at(&db, 1_200));
    effects(&mut a);
    assert!(a.runs().active(&s("s1")).is_none(), "nothing adopted");
    assert_eq!(
        shared_run(&db, "s1"),
        None,
        "the owed end was written first"
    );
}

/// A database, and host `a` sharing its runs, holding s1's lease, which at 1,000 started
/// op-1's run (returned) and has it out with its agent.
fn a_started_op_1() -> (Arc<Mutex<Db>>, Custody<Fenced>, RunId) {
    let db = Arc::new(Mutex::new(Db::default()));
    lease(&db, "s1", "a");
    let mut a = sharing("a", &db);
    let t = at(&db, 1_000);
    a.grant_scope(&s("s1"), t);
    a.submit(submit_req("s1", "1", Controls::automatic()), t)
        .unwrap();
    let first = started(&effects(&mut a));
    assert_eq!(first.len(), 1, "op-1 starts a run: {first:?}");
    let run = first[0].1.clone();
    (db, a, run)
}
