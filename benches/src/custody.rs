//! One full custody cycle of a message (submit, drain, accepted, confirmed, removed, run
//! ended), for the outbox bench (`benches/outbox.rs`) and the store-call count
//! (`examples/custody_store_calls.rs`), and a store that counts the calls it is given.

use std::collections::BTreeMap;

use outbox_core::adapter::{Capabilities, SendKind, SendResult};
use outbox_core::custody::{Custody, CustodyEffect, SessionInfo, SubmitRequest};
use outbox_core::entry::{Acceptance, Controls, MessageRequest};
use outbox_core::ids::{SessionId, ThreadId, TurnId};
use outbox_core::store::OutboxStore;
use timeline_core::time::Millis;

use crate::storage::Keys;

/// Custody over `store` with one Codex session, `keys`' session.
pub fn custody_over<S: OutboxStore>(store: S, keys: Keys) -> (Custody<S>, SessionId) {
    let mut n = 0u64;
    let mut custody = Custody::new(
        store,
        Box::new(move || {
            n += 1;
            format!("{n:032x}")
        }),
    );
    let session = keys.session();
    custody.set_session(&session, SessionInfo::new(Capabilities::codex()));
    (custody, session)
}

/// The `i`th message's full cycle through `custody`, with `keys`' IDs: submitted, sent
/// by the drain, accepted by a turn, confirmed by its echo (ledger sent, entry removed),
/// and the run ended.
pub fn one_cycle<S: OutboxStore>(
    custody: &mut Custody<S>,
    session: &SessionId,
    keys: Keys,
    i: u64,
) {
    let now = Millis(i);
    let (queue_id, op) = keys.ids(i);
    custody
        .submit(
            SubmitRequest {
                session: session.clone(),
                queue_id,
                operation_id: op.clone(),
                request: MessageRequest::text("run the tests again please", "composer", now),
                controls: Controls::automatic(),
            },
            now,
        )
        .expect("submit");
    let Some(CustodyEffect::Send(req)) = custody.poll_effect() else {
        panic!("the drain sends");
    };
    let SendKind::Start { run } = &req.kind else {
        panic!("a start");
    };
    let run = run.clone();
    let acceptance = Acceptance {
        run_id: run.clone(),
        thread_id: ThreadId::new("thread-1").expect("id"),
        turn_id: TurnId::new(format!("turn-{i}")).expect("id"),
        accepted_at: now,
    };
    custody.handle_send_result(req.attempt, SendResult::Accepted(acceptance), now);
    custody.handle_delivery_proof(session, &op, now);
    custody.handle_run_ended(session, &run, &[], now);
    debug_assert!(custody.poll_effect().is_none());
}

/// Fills `store` with `n` held entries (queued, auto-drain off) of `keys`' session, with
/// IDs far from the cycles': entries that just sit in the outbox.
pub fn hold<S: OutboxStore>(store: &mut S, keys: Keys, n: u64) {
    let session = keys.session();
    for i in 0..n {
        let mut e = crate::storage::bench_entry(1_000_000_000 + i, keys);
        e.state = e.state.hold(None);
        e.position = 1_000_000 + i as i64;
        let fp = outbox_core::fingerprint::request_fingerprint(&session, &e.queue_id, &e.request);
        store.claim(&session, &fp, &e).expect("claim");
    }
}

/// A store that counts how often each [`OutboxStore`] method is called, then passes the
/// call on.
pub struct Counting<S> {
    /// The store the calls go to.
    pub inner: S,
    /// Calls so far, by method name.
    pub calls: BTreeMap<&'static str, u64>,
}

impl<S> Counting<S> {
    /// Counts the calls to `inner`.
    pub fn new(inner: S) -> Self {
        Counting {
            inner,
            calls: BTreeMap::new(),
        }
    }
}

macro_rules! counted {
    ($($name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        impl<S: OutboxStore> OutboxStore for Counting<S> {
            $(fn $name(&mut self, $($arg: $ty),*) -> $ret {
                *self.calls.entry(stringify!($name)).or_default() += 1;
                self.inner.$name($($arg),*)
            })*
        }
    };
}

fixtures::outbox_store_methods!(counted);

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::ids::ScopeId;
    use outbox_core::store::memory::MemoryOutboxStore;

    // A cycle ends with the message confirmed and removed, and the counting store sees
    // every write a cycle makes.
    #[test]
    fn a_cycle_confirms_and_removes_the_message() {
        for keys in [Keys::Short, Keys::Uuid] {
            let (mut custody, session) =
                custody_over(Counting::new(MemoryOutboxStore::new()), keys);
            for i in 1..=3 {
                one_cycle(&mut custody, &session, keys, i);
            }
            assert!(custody.entries(&session).expect("entries").is_empty());
            let (_, op) = keys.ids(3);
            let ledger = custody
                .store()
                .inner
                .ledger(&ScopeId::of(&session), &op)
                .expect("ledger");
            assert_eq!(
                ledger.map(|l| l.status),
                Some(outbox_core::ledger::LedgerStatus::Sent)
            );
            let calls = &custody.store().calls;
            assert_eq!(calls.get("claim_sending"), Some(&3));
            assert_eq!(calls.get("confirm_sent"), Some(&3));
        }
    }
}
