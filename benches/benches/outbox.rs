//! Custody: the pure cost of one full message cycle (submit, drain, accepted,
//! confirmed, removed, run ended) against the in-memory store, and of one ledger
//! transition.
//!
//! `cargo bench -p benches --bench outbox`

// criterion_group! generates an undocumented function.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, Criterion};
use outbox_core::adapter::{Capabilities, SendKind, SendResult};
use outbox_core::custody::{Custody, Effect, SessionInfo, SubmitRequest};
use outbox_core::entry::{Acceptance, Controls, MessageRequest};
use outbox_core::ids::{OperationId, QueueId, SessionId, ThreadId, TurnId};
use outbox_core::ledger::{transition, LedgerRecord, LedgerStatus};
use outbox_core::store::memory::MemoryOutboxStore;
use timeline_core::time::Millis;

fn cycle(c: &mut Criterion) {
    let mut n = 0u64;
    let mut custody = Custody::new(
        MemoryOutboxStore::new(),
        Box::new(move || {
            n += 1;
            format!("{n:032x}")
        }),
    );
    let session = SessionId::new("session-1").expect("id");
    custody.set_session(&session, SessionInfo::new(Capabilities::codex()));
    let thread = ThreadId::new("thread-1").expect("id");
    let mut i = 0u64;
    c.bench_function("custody_full_cycle", |b| {
        b.iter(|| {
            i += 1;
            let now = Millis(i);
            let op = OperationId::new(format!("op-{i}")).expect("id");
            custody
                .submit(
                    SubmitRequest {
                        session: session.clone(),
                        queue_id: QueueId::new(format!("q-{i}")).expect("id"),
                        operation_id: op.clone(),
                        request: MessageRequest::text(
                            "run the tests again please",
                            "composer",
                            now,
                        ),
                        controls: Controls::automatic(),
                    },
                    now,
                )
                .expect("submit");
            let Some(Effect::Send(req)) = custody.poll_effect() else {
                panic!("the drain sends");
            };
            let SendKind::Start { run } = &req.kind else {
                panic!("a start");
            };
            let run = run.clone();
            let acceptance = Acceptance {
                run_id: run.clone(),
                thread_id: thread.clone(),
                turn_id: TurnId::new(format!("turn-{i}")).expect("id"),
                accepted_at: now,
            };
            custody.handle_send_result(&session, &op, SendResult::Accepted(acceptance), now);
            custody.handle_delivery_proof(&session, &op, now);
            custody.handle_run_ended(&session, &run, &[], now);
            debug_assert!(custody.poll_effect().is_none());
        })
    });
}

fn ledger_transition(c: &mut Criterion) {
    let current = LedgerRecord::new(LedgerStatus::Sending, Millis(1));
    c.bench_function("ledger_transition", |b| {
        b.iter(|| {
            let proposed = LedgerRecord::new(std::hint::black_box(LedgerStatus::Sent), Millis(2));
            transition(Some(std::hint::black_box(&current)), proposed)
        })
    });
}

criterion_group!(benches, cycle, ledger_transition);
criterion_main!(benches);
