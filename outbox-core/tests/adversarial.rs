//! Custody against an unkind world, on the in-memory store: the properties of
//! [`fixtures::unkind`] (late, lost, duplicated and old-attempt answers, a failing store,
//! restarts), and named cases of what it found.
#![allow(clippy::unwrap_used)]

use fixtures::unkind::{cmd, Answer, Cmd, World, SESSION};
use outbox_core::adapter::SendResult;
use outbox_core::ids::SessionId;
use outbox_core::store::memory::MemoryOutboxStore;
use proptest::prelude::*;

fn s(id: &str) -> SessionId {
    SessionId::new(id).unwrap()
}

fn world() -> World<MemoryOutboxStore> {
    World::new(MemoryOutboxStore::new(), MemoryOutboxStore::new)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: fixtures::proptest_cases() * 4,
        max_shrink_iters: 4096,
        ..ProptestConfig::default()
    })]

    // OB-03, OB-07, OB-08, OB-09, OB-10, OB-12, OB-13, OB-15
    #[test]
    fn custody_survives_an_unkind_world(cmds in proptest::collection::vec(cmd(), 1..60)) {
        let mut w = world();
        for c in cmds {
            w.run(c)?;
        }
        w.quiesce()?;
    }
}

// OB-09: the late answer of an attempt whose history read said "missing" never lands on
// the user's next send of the same message.
#[test]
fn a_late_accepted_of_an_old_attempt_is_ignored() {
    let mut w = world();
    let session = s(SESSION);
    w.run(Cmd::Script(5)).unwrap(); // the first attempt's reply is lost, nothing recorded
    w.run(Cmd::Submit { n: 1, kind: 0 }).unwrap();
    let Some(Answer::Send(first, _)) = w.held.pop() else {
        panic!("the first attempt")
    };
    w.run(Cmd::Advance(31_000)).unwrap();
    w.run(Cmd::Answer(0)).unwrap(); // the read: missing
    assert_eq!(
        w.c.entries(&session).unwrap()[0]
            .entry()
            .unwrap()
            .state
            .error(),
        Some(outbox_core::entry::UNCONFIRMED_TEXT)
    );
    w.run(Cmd::RunEnded).unwrap(); // the first attempt's run ends
    w.run(Cmd::SendNow(1)).unwrap();
    // Sent again only after the history read says it is still missing.
    assert!(matches!(w.held.as_slice(), [Answer::Read(..)]));
    w.run(Cmd::Answer(0)).unwrap();
    let Some(Answer::Send(second, _)) = w.held.pop() else {
        panic!("the second attempt")
    };
    assert_ne!(first, second);
    let stale_before = w.c.stats().stale_answers;
    let acceptance = w
        .agent
        .acceptance(&outbox_core::ids::RunId::new("run-old").unwrap());
    w.c.handle_send_result(first, SendResult::Accepted(acceptance), w.now);
    assert_eq!(w.c.stats().stale_answers, stale_before + 1);
    w.c.handle_send_result(second, SendResult::Delivered, w.now);
    assert!(
        w.c.entries(&session).unwrap().is_empty(),
        "the second attempt's answer counts"
    );
}

// OB-08: a duplicated deferred answer does not send again by itself.
#[test]
fn a_duplicated_deferred_answer_sends_nothing() {
    let mut w = world();
    w.run(Cmd::Script(1)).unwrap();
    w.run(Cmd::Submit { n: 1, kind: 0 }).unwrap();
    w.run(Cmd::Answer(0)).unwrap(); // deferred: queued again, and sent again at once
    let sends = w.agent.sends.len();
    w.run(Cmd::Again(0)).unwrap(); // the same deferred answer again
    assert_eq!(w.agent.sends.len(), sends);
}

// A failed write is state: the entry stays as the store holds it, the embedding is told,
// and the answer is applied once the store works again.
#[test]
fn an_answer_whose_write_fails_is_applied_later() {
    let mut w = world();
    let session = s(SESSION);
    w.run(Cmd::Submit { n: 1, kind: 0 }).unwrap();
    w.run(Cmd::Fault(2)).unwrap(); // every write fails
    w.run(Cmd::Answer(0)).unwrap(); // accepted: its record cannot be written
    assert!(w.c.store_failure(&session).is_some());
    assert!(w.c.poll_timeout().is_some(), "a retry is planned");
    w.run(Cmd::Heal).unwrap();
    w.run(Cmd::Advance(1_000)).unwrap();
    assert!(w.c.store_failure(&session).is_none());
    let e = w.c.entries(&session).unwrap()[0].entry().unwrap().clone();
    assert!(
        e.state.acceptance().is_some(),
        "the acceptance was recorded on retry"
    );
}

// OB-08, OB-10: found by the unkind world. A steer's acceptance could not be written
// (the store failed), the host restarted, the ledger could not be read at start-up, so
// the entry was held as unconfirmed; the user's "send now" then sent it a second time.
// Sending an unconfirmed entry again reads the agent's history first.
#[test]
fn an_unconfirmed_entry_sent_again_is_read_from_history_first() {
    let mut w = world();
    for c in [
        Cmd::Script(0),
        Cmd::Submit { n: 5, kind: 0 },
        Cmd::Echo(0),
        Cmd::Answer(0),
        Cmd::Answer(0),
        Cmd::Submit { n: 1, kind: 2 },
        Cmd::Submit { n: 2, kind: 0 },
        Cmd::Fault(1),
        Cmd::Answer(0),
        Cmd::Script(0),
        Cmd::Script(0),
        Cmd::Restart,
        Cmd::Script(0),
        Cmd::SendNow(1),
    ] {
        w.run(c).unwrap();
    }
    w.quiesce().unwrap();
    assert_eq!(
        w.agent
            .send_count(&outbox_core::ids::OperationId::new("op-1").unwrap()),
        1
    );
}

// OB-08, OB-09: found by the unkind world. A deferred steer's write committed but was
// reported as failed, so the answer was kept for a retry; the message went out again as
// a new run, and the retried old answer matched the new attempt's identical entry and
// sent it a third time. A new attempt now drops the retries of older ones.
#[test]
fn a_deferred_answer_whose_write_was_lost_never_sends_twice() {
    let mut w = world();
    for c in [
        Cmd::Submit { n: 2, kind: 0 },
        Cmd::Script(1),
        Cmd::Advance(1),
        Cmd::Answer(0),
        Cmd::Submit { n: 0, kind: 2 },
        Cmd::Fault(4),
        Cmd::Submit { n: 0, kind: 0 },
        Cmd::Answer(0),
    ] {
        w.run(c).unwrap();
    }
    w.quiesce().unwrap();
    assert_eq!(
        w.agent
            .send_count(&outbox_core::ids::OperationId::new("op-0").unwrap()),
        2
    );
}

// OB-08, OB-10: found by the unkind world. The hand-off's write failed, the memory
// ledger took the `sending` record and the message went out; the host restarted (the
// memory ledger with it), the ledger could not be read at start-up, and the entry was
// held as unconfirmed with no ledger row; "send now" sent it a second time. An
// unconfirmed entry is always read from history before it is sent again.
#[test]
fn an_unconfirmed_entry_without_a_ledger_row_is_read_first() {
    let mut w = world();
    let cmds = [
        Cmd::Script(1),
        Cmd::Answer(0),
        Cmd::Submit { n: 0, kind: 0 },
        Cmd::Echo(0),
        Cmd::Script(4),
        Cmd::StopAndSendNow(0),
        Cmd::Echo(0),
        Cmd::Answer(0),
        Cmd::Submit { n: 0, kind: 0 },
        Cmd::Answer(0),
        Cmd::Stop,
        Cmd::Submit { n: 2, kind: 0 },
        Cmd::Answer(30),
        Cmd::Fault(1),
        Cmd::Answer(0),
        Cmd::Script(0),
        Cmd::Restart,
        Cmd::Heal,
        Cmd::SendNow(2),
    ];
    for c in cmds {
        w.run(c).unwrap();
    }
    w.quiesce().unwrap();
}

// OB-13: found by the unkind world. A steer was detached for stop and send now; the
// settlement of its stopped run failed on the store and waited for a retry; a repeated
// submit released the entry, which went out as its own run; the retried settlement then
// "dedicated" the entry that was sending, and it went out again. A stop and send now in
// progress owns its entry, and only a queued entry is dedicated.
#[test]
fn a_detached_steer_is_dedicated_once_and_never_while_sending() {
    let mut w = world();
    for c in [
        Cmd::Submit { n: 0, kind: 0 },
        Cmd::Script(2),
        Cmd::Submit { n: 5, kind: 0 },
        Cmd::Script(4),
        Cmd::Answer(0),
        Cmd::StopAndSendNow(0),
        Cmd::Answer(0),
        Cmd::Fault(5),
        Cmd::Answer(0),
        Cmd::Submit { n: 0, kind: 0 },
        Cmd::Echo(0),
        Cmd::Submit { n: 5, kind: 0 },
        Cmd::Submit { n: 0, kind: 0 },
        Cmd::Answer(0),
        Cmd::Fault(1),
        Cmd::Answer(0),
    ] {
        w.run(c).unwrap();
    }
    w.quiesce().unwrap();
}
