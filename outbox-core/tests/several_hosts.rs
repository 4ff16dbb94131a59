//! Several hosts on one store (MH-01, MH-02, MH-04, MH-05): custody works only the
//! scopes it was granted, a write refused for a lost lease lets the scope go at once and
//! is never retried, the host that takes the scope over confirms an in-flight send from
//! history instead of sending it again, and a session message for a scope another host
//! serves is saved for that host.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use common::*;
use outbox_core::adapter::{Capabilities, HistoryRead};
use outbox_core::custody::{Custody, Effect, SessionInfo, SubmitError};
use outbox_core::entry::{Controls, OutboxEntry, StoredEntry};
use outbox_core::fingerprint::Digest256;
use outbox_core::ids::{base_session, OperationId, QueueId, SessionId};
use outbox_core::ledger::{LedgerRecord, LedgerStatus};
use outbox_core::store::memory::MemoryOutboxStore;
use outbox_core::store::{
    Claim, Identity, OutboxStore, RouteClaim, SessionMessageRoute, StoreError, StoreErrorKind,
};
use timeline_core::time::Millis;

/// One database: the outbox and who holds each scope's lease.
#[derive(Default)]
struct Db {
    store: MemoryOutboxStore,
    holders: BTreeMap<SessionId, &'static str>,
    /// Writes refused for a lost lease.
    refused: usize,
}

/// One host's connection: every write checks that this host holds the lease of the
/// session it writes, as the PostgreSQL store's fencing does.
struct Fenced {
    host: &'static str,
    db: Arc<Mutex<Db>>,
}

impl Fenced {
    fn write<T>(
        &mut self,
        session: &SessionId,
        f: impl FnOnce(&mut MemoryOutboxStore) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut db = self.db.lock().unwrap();
        let base = base_session(session);
        if db.holders.get(&base) != Some(&self.host) {
            db.refused += 1;
            return Err(StoreError::LeaseLost {
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
    fn claim(
        &mut self,
        session: &SessionId,
        fingerprint: &Digest256,
        entry: &OutboxEntry,
    ) -> Result<Claim, StoreError> {
        self.write(session, |s| s.claim(session, fingerprint, entry))
    }
    fn claim_session_message(
        &mut self,
        recipient: &SessionId,
        fingerprint: &Digest256,
        entry: &OutboxEntry,
        route: &SessionMessageRoute,
    ) -> Result<RouteClaim, StoreError> {
        self.read(|s| s.claim_session_message(recipient, fingerprint, entry, route))
    }
    fn identity(
        &mut self,
        session: &SessionId,
        op: &OperationId,
    ) -> Result<Option<Identity>, StoreError> {
        self.read(|s| s.identity(session, op))
    }
    fn entries(&mut self, session: &SessionId) -> Result<Vec<StoredEntry>, StoreError> {
        self.read(|s| s.entries(session))
    }
    fn outbox_sessions(&mut self) -> Result<Vec<SessionId>, StoreError> {
        self.read(|s| s.outbox_sessions())
    }
    fn replace_entry(
        &mut self,
        session: &SessionId,
        expected: &OutboxEntry,
        new: &OutboxEntry,
    ) -> Result<bool, StoreError> {
        self.write(session, |s| s.replace_entry(session, expected, new))
    }
    fn rekey_entry(
        &mut self,
        session: &SessionId,
        expected: &OutboxEntry,
        fingerprint: &Digest256,
        new: &OutboxEntry,
    ) -> Result<bool, StoreError> {
        self.write(session, |s| {
            s.rekey_entry(session, expected, fingerprint, new)
        })
    }
    fn remove_entry(
        &mut self,
        session: &SessionId,
        queue_id: &QueueId,
    ) -> Result<Option<OutboxEntry>, StoreError> {
        self.write(session, |s| s.remove_entry(session, queue_id))
    }
    fn set_positions(
        &mut self,
        session: &SessionId,
        positions: &[(QueueId, i64)],
    ) -> Result<(), StoreError> {
        self.write(session, |s| s.set_positions(session, positions))
    }
    fn ledger(
        &mut self,
        session: &SessionId,
        op: &OperationId,
    ) -> Result<Option<LedgerRecord>, StoreError> {
        self.read(|s| s.ledger(session, op))
    }
    fn put_ledger(
        &mut self,
        session: &SessionId,
        op: &OperationId,
        record: &LedgerRecord,
    ) -> Result<(), StoreError> {
        self.write(session, |s| s.put_ledger(session, op, record))
    }
    fn confirm_sent(
        &mut self,
        scope: &[SessionId],
        op: &OperationId,
        record: &LedgerRecord,
    ) -> Result<Vec<(SessionId, QueueId)>, StoreError> {
        let first = scope.first().cloned().unwrap_or_else(|| s("none"));
        self.write(&first, |s| s.confirm_sent(scope, op, record))
    }
    fn route(&mut self, op: &OperationId) -> Result<Option<SessionMessageRoute>, StoreError> {
        self.read(|s| s.route(op))
    }
    fn set_route_delivery(
        &mut self,
        op: &OperationId,
        delivery: outbox_core::store::RouteDelivery,
    ) -> Result<(), StoreError> {
        self.read(|s| s.set_route_delivery(op, delivery))
    }
}

fn host(name: &'static str, db: &Arc<Mutex<Db>>) -> Custody<Fenced> {
    let mut c = Custody::new(
        Fenced {
            host: name,
            db: db.clone(),
        },
        uuids(),
    );
    c.set_session(&s("s1"), SessionInfo::new(Capabilities::codex()));
    c.set_session(&s("s2"), SessionInfo::new(Capabilities::codex()));
    c.grant_only();
    c
}

fn effects(c: &mut Custody<Fenced>) -> Vec<Effect> {
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
    assert_eq!(store.kind(), StoreErrorKind::LeaseLost);
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
        .any(|e| matches!(e, Effect::Send(r) if r.operation_id == op("op-1"))));
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
            Effect::Send(r) => Some(r),
            _ => None,
        })
        .expect("handed to the agent");

    // The lease of s1 passes to `b`; `a` has not noticed yet.
    lease(&db, "s1", "b");
    let refused_before = db.lock().unwrap().refused;
    a.handle_delivery_proof(&s("s1"), &op("op-1"), Millis(1_100));
    let released: Vec<Effect> = effects(&mut a);
    assert!(
        released
            .iter()
            .any(|e| matches!(e, Effect::ScopeReleased { session, .. } if *session == s("s1"))),
        "{released:?}"
    );
    assert!(
        !released.iter().any(|e| matches!(e, Effect::StoreFailed(_))),
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
    let taken: Vec<Effect> = effects(&mut b);
    assert!(
        !taken.iter().any(|e| matches!(e, Effect::Send(_))),
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
        .ledger(&s("s1"), &op("op-1"))
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
            .ledger(&s("s1"), &op("op-1"))
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
            Effect::Send(r) => Some(r.operation_id),
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
        !taken.iter().any(|e| matches!(e, Effect::Send(_))),
        "{taken:?}"
    );
    let attempt = history_read(&taken, "s1", "op-1").expect("the first is confirmed");
    b.handle_history_read(attempt, HistoryRead::Found, Millis(20_010));
    let sends: Vec<OperationId> = effects(&mut b)
        .into_iter()
        .filter_map(|e| match e {
            Effect::Send(r) => Some(r.operation_id),
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
    assert!(a.release_scope(&s("s1"), "handed over", Millis(1_010)));
    assert_eq!(
        effects(&mut a),
        vec![Effect::ScopeReleased {
            session: s("s1"),
            reason: "handed over".into()
        }]
    );
    assert_eq!(a.poll_timeout(), None, "no deadline of the scope is kept");
    assert!(!a.release_scope(&s("s1"), "again", Millis(1_020)));
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
            Effect::Send(r) => match r.kind {
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
        !effects(&mut a).iter().any(|e| matches!(e, Effect::Send(_))),
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
            Effect::Send(r) => Some(r.operation_id),
            _ => None,
        })
        .collect();
    assert_eq!(sent, vec![message_op], "then it goes, once");
}
