//! Helpers shared by the outbox-core test files.
#![allow(dead_code, clippy::unwrap_used)]

use fixtures::adapters::ScriptedAdapter;
use fixtures::failing::FailingStore;
use outbox_core::adapter::{AttemptId, Capabilities};
use outbox_core::adapter::{ReadHistoryRequest, StopRequest};
use outbox_core::custody::{Custody, CustodyEffect, SessionInfo, SubmitRequest};
use outbox_core::entry::{Controls, MessageRequest, OutboxEntry, Receipt};
use outbox_core::ids::{OperationId, QueueId, RunId, SessionId};
use outbox_core::store::memory::MemoryOutboxStore;
use outbox_core::store::OutboxStore;
use timeline_core::time::Millis;

pub fn s(id: &str) -> SessionId {
    SessionId::new(id).unwrap()
}
pub fn op(id: &str) -> OperationId {
    OperationId::new(id).unwrap()
}
pub fn q(id: &str) -> QueueId {
    QueueId::new(id).unwrap()
}

pub fn uuids() -> Box<dyn FnMut() -> String + Send> {
    let mut n = 0u64;
    Box::new(move || {
        n += 1;
        format!("u{n}")
    })
}

/// The store a [`Bench`] runs on: the memory store behind the failing wrapper, which
/// fails nothing until a test changes its plan.
pub type TestStore = FailingStore<MemoryOutboxStore>;

/// The ledger's writes: the store methods that write a ledger row.
pub const LEDGER_WRITES: [&str; 4] = [
    "claim_sending",
    "replace_entry_with_ledger",
    "put_ledger",
    "confirm_sent",
];

pub fn custody<S: OutboxStore>(store: S, caps: Capabilities, sessions: &[&str]) -> Custody<S> {
    let mut c = Custody::new(store, uuids());
    for id in sessions {
        c.set_session(&s(id), SessionInfo::new(caps));
    }
    c
}

pub fn request(text: &str) -> MessageRequest {
    MessageRequest::text(text, "composer", Millis(1))
}

pub fn submit_req(session: &str, n: &str, controls: Controls) -> SubmitRequest {
    SubmitRequest {
        session: s(session),
        queue_id: q(&format!("q-{n}")),
        operation_id: op(&format!("op-{n}")),
        request: request(&format!("message {n}")),
        controls,
    }
}

/// A test bench: custody, a scripted adapter, and the effects meant for the embedding.
pub struct Bench {
    pub c: Custody<TestStore>,
    pub agent: ScriptedAdapter,
    pub now: Millis,
    pub notes: Vec<CustodyEffect>,
    /// The attempt of the last stop request seen by [`Bench::effects`].
    pub last_stop: Option<AttemptId>,
}

impl Bench {
    pub fn codex(sessions: &[&str]) -> Bench {
        Bench {
            c: custody(TestStore::default(), Capabilities::codex(), sessions),
            agent: ScriptedAdapter::codex(),
            now: Millis(1_000),
            notes: Vec::new(),
            last_stop: None,
        }
    }

    pub fn claude(sessions: &[&str]) -> Bench {
        Bench {
            c: custody(TestStore::default(), Capabilities::claude(), sessions),
            agent: ScriptedAdapter::claude(),
            now: Millis(1_000),
            notes: Vec::new(),
            last_stop: None,
        }
    }

    pub fn drive(&mut self) {
        let notes = self.c.drive(&mut self.agent, self.now);
        self.notes.extend(notes);
    }

    pub fn submit(&mut self, session: &str, n: &str, controls: Controls) -> Receipt {
        let r = self
            .c
            .submit(submit_req(session, n, controls), self.now)
            .unwrap();
        self.drive();
        r
    }

    /// The effects waiting, with each stop request's attempt kept in `last_stop` and
    /// shown as `AttemptId(0)`, so assertions compare what was asked.
    pub fn effects(&mut self) -> Vec<CustodyEffect> {
        let raw: Vec<CustodyEffect> = std::iter::from_fn(|| self.c.poll_effect()).collect();
        raw.into_iter()
            .map(|e| match e {
                CustodyEffect::Stop(StopRequest {
                    attempt,
                    session,
                    run,
                }) => {
                    self.last_stop = Some(attempt);
                    CustodyEffect::Stop(StopRequest {
                        attempt: AttemptId(0),
                        session,
                        run,
                    })
                }
                other => other,
            })
            .collect()
    }

    /// The attempt of the last stop request seen.
    pub fn stop_attempt(&self) -> AttemptId {
        self.last_stop.expect("a stop request was seen")
    }

    pub fn advance(&mut self, ms: u64) {
        self.now = self.now.saturating_add(Millis(ms));
        self.c.handle_timeout(self.now);
        self.drive();
    }

    pub fn entries(&mut self, session: &str) -> Vec<OutboxEntry> {
        self.c
            .entries(&s(session))
            .unwrap()
            .into_iter()
            .filter_map(|e| e.entry().cloned())
            .collect()
    }

    pub fn entry(&mut self, session: &str, n: &str) -> Option<OutboxEntry> {
        self.entries(session)
            .into_iter()
            .find(|e| e.operation_id == op(&format!("op-{n}")))
    }

    pub fn active_run(&self, session: &str) -> Option<RunId> {
        self.c.runs().active(&s(session)).map(|a| a.run_id.clone())
    }
}

/// The attempt of the history read of (`session`, `op`) among `effects`, if one was asked.
pub fn history_read(
    effects: &[CustodyEffect],
    session: &str,
    operation: &str,
) -> Option<AttemptId> {
    effects.iter().find_map(|e| match e {
        CustodyEffect::ReadHistory(ReadHistoryRequest {
            attempt,
            session: at,
            operation_id,
            ..
        }) if at == &s(session) && operation_id == &op(operation) => Some(*attempt),
        _ => None,
    })
}
