//! Defects of custody the whole-system simulator (`sim`) found, each pinned through the
//! public API with the first seed that showed it. Custody runs over the
//! failure-injecting store of `fixtures`, and the test plays the agent by hand, so each
//! answer arrives exactly when the seed had it arrive.
#![allow(clippy::unwrap_used)]

mod common;

use outbox_core::adapter::{ReadHistoryRequest, StopRequest, TakeBackRequest};
use outbox_core::ids::ScopeId;
use std::sync::{Arc, Mutex};

use common::{op, q, s, submit_req, uuids};
use fixtures::failing::{FailingStore, FaultPlan};
use outbox_core::adapter::{
    AttemptId, Capabilities, HistoryRead, SendKind, SendRequest, SendResult, StopResult,
    TakeBackResult,
};
use outbox_core::custody::{ActionError, Custody, CustodyEffect, SessionInfo, STORE_RETRY};
use outbox_core::entry::{
    Acceptance, Controls, EntryState, HandoffPhase, OutboxEntry, CANCELED_TEXT, REOPEN_CHECK_TEXT,
    STOPPED_BEFORE_DELIVERY_TEXT, UNCONFIRMED_TEXT,
};
use outbox_core::ids::{RunId, ThreadId, TurnId};
use outbox_core::ledger::LedgerStatus;
use outbox_core::store::memory::MemoryOutboxStore;
use outbox_core::store::OutboxStore;
use timeline_core::time::Millis;

const SESSION: &str = "s1";

/// Custody over a store that fails when told, with the effects it asked for so far.
struct Rig {
    c: Custody<FailingStore<MemoryOutboxStore>>,
    plan: Arc<Mutex<FaultPlan>>,
    now: Millis,
    effects: Vec<CustodyEffect>,
}

impl Rig {
    fn new() -> Rig {
        let store = FailingStore::new(MemoryOutboxStore::new());
        let plan = store.plan();
        let mut c = Custody::new(store, uuids());
        c.set_session(&s(SESSION), SessionInfo::new(Capabilities::codex()));
        Rig {
            c,
            plan,
            now: Millis(1_000),
            effects: Vec::new(),
        }
    }

    /// Every write fails from now on; a failing write is made first when `commit`.
    fn fail_writes(&self, commit: bool) {
        let mut plan = self.plan.lock().unwrap();
        plan.writes_off = true;
        plan.commit_then_fail = commit;
    }

    fn heal(&self) {
        self.plan.lock().unwrap().heal();
    }

    fn collect(&mut self) {
        while let Some(e) = self.c.poll_effect() {
            self.effects.push(e);
        }
    }

    fn tick(&mut self, ms: u64) {
        self.now = self.now.saturating_add(Millis(ms));
    }

    fn submit(&mut self, n: &str, controls: Controls) {
        self.c
            .submit(submit_req(SESSION, n, controls), self.now)
            .unwrap();
        self.collect();
    }

    /// Takes the send of `n` asked for so far (the latest one).
    fn take_send(&mut self, n: &str) -> SendRequest {
        let at = self
            .effects
            .iter()
            .rposition(
                |e| matches!(e, CustodyEffect::Send(r) if r.operation_id == op(&format!("op-{n}"))),
            )
            .unwrap_or_else(|| panic!("op-{n} was sent: {:?}", self.effects));
        match self.effects.remove(at) {
            CustodyEffect::Send(r) => r,
            _ => unreachable!("a send was found"),
        }
    }

    fn sends(&self, n: &str) -> usize {
        self.effects
            .iter()
            .filter(
                |e| matches!(e, CustodyEffect::Send(r) if r.operation_id == op(&format!("op-{n}"))),
            )
            .count()
    }

    /// Takes the history read of `n` asked for so far, if any.
    fn take_read(&mut self, n: &str) -> Option<AttemptId> {
        let at = self.effects.iter().position(|e| {
            matches!(e, CustodyEffect::ReadHistory(ReadHistoryRequest { operation_id, .. }) if operation_id == &op(&format!("op-{n}")))
        })?;
        match self.effects.remove(at) {
            CustodyEffect::ReadHistory(ReadHistoryRequest { attempt, .. }) => Some(attempt),
            _ => unreachable!("a read was found"),
        }
    }

    fn answer(&mut self, attempt: AttemptId, result: SendResult) {
        self.c.handle_send_result(attempt, result, self.now);
        self.collect();
    }

    fn read(&mut self, attempt: AttemptId, read: HistoryRead) {
        self.c.handle_history_read(attempt, read, self.now);
        self.collect();
    }

    fn run_ended(&mut self, run: &RunId, untaken: &[&str]) {
        let untaken: Vec<_> = untaken.iter().map(|n| op(&format!("op-{n}"))).collect();
        self.c
            .handle_run_ended(&s(SESSION), run, &untaken, self.now);
        self.collect();
    }

    fn timeout(&mut self) {
        self.c.handle_timeout(self.now);
        self.collect();
    }

    fn entry(&mut self, n: &str) -> Option<OutboxEntry> {
        self.plan.lock().unwrap().paused = true;
        let entries = self.c.entries(&s(SESSION));
        self.plan.lock().unwrap().paused = false;
        entries
            .unwrap()
            .into_iter()
            .filter_map(|e| e.entry().cloned())
            .find(|e| e.operation_id == op(&format!("op-{n}")))
    }

    /// The entry of `n` as the store holds it, read past custody's memory.
    fn stored(&mut self, n: &str) -> Option<OutboxEntry> {
        self.plan.lock().unwrap().paused = true;
        let entries = self.c.store().entries(&s(SESSION));
        self.plan.lock().unwrap().paused = false;
        entries
            .unwrap()
            .into_iter()
            .filter_map(|e| e.entry().cloned())
            .find(|e| e.operation_id == op(&format!("op-{n}")))
    }

    /// The host stops; a new one starts from the same store and reads every outbox.
    fn restart(&mut self) {
        let empty = Custody::new(FailingStore::new(MemoryOutboxStore::new()), uuids());
        let store = std::mem::replace(&mut self.c, empty).into_store();
        // A new machine draws other UUIDs, so its attempts are numbered apart.
        let mut n = 0u64;
        let fresh = Box::new(move || {
            n += 1;
            format!("restarted-{n}")
        });
        self.c = Custody::new(store, fresh);
        self.c
            .set_session(&s(SESSION), SessionInfo::new(Capabilities::codex()));
        self.effects.clear();
        self.c.start_up(self.now).unwrap();
        self.collect();
    }

    /// A run started by `n`, which its turn accepted: `n` goes out, the turn accepts it.
    fn running(&mut self, n: &str) -> RunId {
        self.submit(n, Controls::automatic());
        let send = self.take_send(n);
        let SendKind::Start { run } = send.kind.clone() else {
            panic!("op-{n} starts a run")
        };
        self.answer(send.attempt, SendResult::Accepted(acceptance(&run, 1)));
        run
    }

    /// Stop and send now for `n`: the take-back attempt it asks for.
    fn stop_and_send_now(&mut self, n: &str) -> AttemptId {
        self.c
            .stop_and_send_now(&s(SESSION), &q(&format!("q-{n}")), self.now)
            .unwrap();
        self.collect();
        self.effects
            .iter()
            .find_map(|e| match e {
                CustodyEffect::TakeBack(TakeBackRequest {
                    attempt,
                    operation_id,
                    ..
                }) if operation_id == &op(&format!("op-{n}")) => Some(*attempt),
                _ => None,
            })
            .unwrap_or_else(|| panic!("op-{n} is taken back: {:?}", self.effects))
    }

    /// A steer `n` for `run`, which the running turn accepted.
    fn accepted_steer(&mut self, n: &str, run: &RunId) {
        self.submit(n, Controls::steer(run.clone()));
        let send = self.take_send(n);
        self.answer(send.attempt, SendResult::Accepted(acceptance(run, 2)));
        assert!(matches!(
            self.entry(n).unwrap().state,
            EntryState::Accepted { .. }
        ));
    }
}

fn acceptance(run: &RunId, turn: u8) -> Acceptance {
    Acceptance {
        run_id: run.clone(),
        thread_id: ThreadId::new("thread-1").unwrap(),
        turn_id: TurnId::new(format!("turn-{turn}")).unwrap(),
        accepted_at: Millis(1_000),
    }
}

// OB-09, OB-10, sim seed 6: the submit's one-commit hand-off was made but reported as
// failed, and so was the plain claim after it. The entry stayed sending with nothing in
// flight, and the queue behind it waited until a restart. Now the failed write makes
// custody read the session again after `STORE_RETRY` and confirm the entry from history,
// as a restart does; it is never sent blindly.
#[test]
fn a_hand_off_written_but_reported_failed_is_confirmed_from_history() {
    let mut r = Rig::new();
    r.fail_writes(true);
    let refused =
        r.c.submit(submit_req(SESSION, "1", Controls::automatic()), r.now);
    assert!(refused.is_err(), "the store reported the submit as failed");
    r.heal();
    r.collect();
    assert_eq!(r.sends("1"), 0, "nothing reached the agent");
    assert!(
        r.stored("1").unwrap().state.is_sending(),
        "the store holds the hand-off all the same"
    );
    // The user sends it again: the same operation, already saved.
    r.submit("1", Controls::automatic());
    r.submit("2", Controls::enqueue());
    assert_eq!(
        r.sends("2"),
        0,
        "the queue waits behind the entry that is out"
    );
    assert_eq!(
        r.c.poll_timeout(),
        Some(Millis(1_000).saturating_add(STORE_RETRY)),
        "the repair is due"
    );
    r.tick(STORE_RETRY.as_u64());
    r.timeout();
    let read = r
        .take_read("1")
        .expect("the entry is confirmed from history");
    assert_eq!(r.sends("1"), 0, "never sent blindly");
    r.read(read, HistoryRead::Missing);
    assert_eq!(r.entry("1").unwrap().state.error(), Some(UNCONFIRMED_TEXT));
    assert_eq!(r.sends("1"), 0);
    assert_eq!(r.sends("2"), 1, "the queue behind it moves on");
}

// OB-09, OB-10, sim seed 6: the same in the drain. The hand-off of a queued message was
// made but reported as failed, and so was the hold that should have followed it: the
// entry stayed sending with nothing in flight until a restart.
#[test]
fn a_drain_hand_off_written_but_reported_failed_is_confirmed_from_history() {
    let mut r = Rig::new();
    let run = r.running("1");
    r.submit("2", Controls::automatic());
    assert_eq!(r.sends("2"), 0, "op-2 waits for the run");
    r.fail_writes(true);
    r.run_ended(&run, &[]);
    r.heal();
    assert_eq!(r.sends("2"), 0, "nothing reached the agent");
    assert!(r.stored("2").unwrap().state.is_sending());
    let read = r.take_read("1").expect("the run's end confirms op-1");
    r.read(read, HistoryRead::Found);
    r.tick(STORE_RETRY.as_u64());
    r.timeout();
    let read = r.take_read("2").expect("op-2 is confirmed from history");
    r.read(read, HistoryRead::Missing);
    assert_eq!(r.entry("2").unwrap().state.error(), Some(UNCONFIRMED_TEXT));
    assert_eq!(r.sends("2"), 0, "never sent blindly");
    r.submit("3", Controls::enqueue());
    assert_eq!(r.sends("3"), 1, "the queue moves on");
}

// OB-11, OB-15, sim seed 4: a steer the run accepted but did not take before the run
// ended (no stop) came back with no text at all. The seed gives it the stop's text.
#[test]
fn an_untaken_steer_of_a_run_that_ended_is_held_with_the_seeds_text() {
    let mut r = Rig::new();
    let run = r.running("1");
    r.accepted_steer("2", &run);
    r.run_ended(&run, &["2"]);
    let e = r.entry("2").unwrap();
    assert!(!e.state.auto_drain());
    assert_eq!(e.state.error(), Some(STOPPED_BEFORE_DELIVERY_TEXT));
    assert_eq!(r.sends("2"), 0, "not sent again without the user");
}

// OB-08, sim seed 4: a send answered canceled was held with no text. The seed returns it
// "with autoDrain off and no error"; its hold reason is the seed's meaning of canceled.
#[test]
fn a_canceled_send_is_held_with_a_reason_and_no_error() {
    let mut r = Rig::new();
    r.submit("1", Controls::automatic());
    let send = r.take_send("1");
    r.answer(send.attempt, SendResult::Canceled);
    let e = r.entry("1").unwrap();
    assert!(!e.state.auto_drain());
    assert_eq!(e.state.error(), None);
    assert_eq!(e.state.hold_reason(), Some(CANCELED_TEXT));
}

// OB-04, OB-09, sim seed 78: an automatic submit found no room at the front and
// renumbered the queue, moving the entry that was out. Its answer no longer equalled
// the entry's snapshot, so it was dropped, and the entry stayed sending (and the queue
// behind it waiting) until a restart. A renumbering is not a change of custody.
#[test]
fn an_answer_lands_on_an_entry_the_queue_renumbered_while_it_was_out() {
    let mut r = Rig::new();
    r.submit("1", Controls::automatic());
    let send = r.take_send("1");
    let SendKind::Start { run } = send.kind.clone() else {
        panic!("op-1 starts a run")
    };
    let before = r.entry("1").unwrap().position;
    r.submit("b", Controls::enqueue());
    // Each automatic submit halves the gap in front; the 21st renumbers the queue.
    for n in 0..21 {
        r.submit(&format!("a{n}"), Controls::automatic());
    }
    assert_ne!(r.entry("1").unwrap().position, before, "op-1 was moved");
    r.answer(send.attempt, SendResult::Accepted(acceptance(&run, 1)));
    assert_eq!(
        r.entry("1").unwrap().state.acceptance(),
        Some(&acceptance(&run, 1)),
        "the answer is applied"
    );
    r.run_ended(&run, &[]);
    let read = r.take_read("1").expect("the run's end confirms it");
    r.read(read, HistoryRead::Found);
    assert!(r.entry("1").is_none());
    assert_eq!(r.sends("a20"), 1, "the queue moves on");
}

// OB-08, OB-15, sim seed 160: the stop's result and the run's end (both saying the steer
// was not taken) came before the steer's `Accepted`, which then left the entry accepted
// by a run that was gone, until a restart. The run's history now settles it.
#[test]
fn an_acceptance_after_its_run_ended_is_settled_from_history() {
    let mut r = Rig::new();
    let run = r.running("1");
    r.submit("2", Controls::steer(run.clone()));
    let steer = r.take_send("2");
    r.c.stop(&s(SESSION), &run, None, r.now);
    r.collect();
    let stop = r
        .effects
        .iter()
        .find_map(|e| match e {
            CustodyEffect::Stop(StopRequest { attempt, .. }) => Some(*attempt),
            _ => None,
        })
        .unwrap();
    r.c.handle_stop_result(
        stop,
        StopResult::Stopped {
            untaken: vec![op("op-2")],
        },
        r.now,
    );
    r.collect();
    r.run_ended(&run, &["2"]);
    r.answer(steer.attempt, SendResult::Accepted(acceptance(&run, 2)));
    let read = r
        .take_read("2")
        .expect("the acceptance of a gone run is settled from history");
    r.read(read, HistoryRead::Missing);
    let e = r.entry("2").unwrap();
    assert_eq!(e.state.error(), Some(STOPPED_BEFORE_DELIVERY_TEXT));
    assert!(!e.state.auto_drain());
    assert_eq!(r.sends("2"), 0, "not sent again");
}

// OB-13, sim seed 796: stop and send now was asked for a steer whose run had ended (the
// run's end was confirming it from history), and the take-back was refused; the entry
// went back to accepted by a run that was gone. Only a running turn's steer can be
// taken back.
#[test]
fn stop_and_send_now_refuses_a_steer_whose_run_ended() {
    let mut r = Rig::new();
    let run = r.running("1");
    r.accepted_steer("2", &run);
    r.run_ended(&run, &[]);
    let read = r.take_read("2").expect("the run's end confirms the steer");
    assert_eq!(
        r.c.stop_and_send_now(&s(SESSION), &q("q-2"), r.now),
        Err(ActionError::NotAnAcceptedSteer)
    );
    r.collect();
    assert!(!r
        .effects
        .iter()
        .any(|e| matches!(e, CustodyEffect::TakeBack(TakeBackRequest { .. }))));
    r.read(read, HistoryRead::Missing);
    assert_eq!(
        r.entry("2").unwrap().state.error(),
        Some(STOPPED_BEFORE_DELIVERY_TEXT)
    );
}

// OB-10, sim seed 120: the `Accepted` of a new run was written but reported as failed,
// so the answer waited for its retry with the normal lane busy. The run's end then read
// the entry's history, which dropped that retry as superseded but never freed the lane:
// the queue waited until a restart.
#[test]
fn a_superseded_answer_frees_its_lane() {
    let mut r = Rig::new();
    r.submit("1", Controls::automatic());
    let send = r.take_send("1");
    let SendKind::Start { run } = send.kind.clone() else {
        panic!("op-1 starts a run")
    };
    r.fail_writes(true);
    r.answer(send.attempt, SendResult::Accepted(acceptance(&run, 1)));
    r.heal();
    r.submit("2", Controls::enqueue());
    r.run_ended(&run, &[]);
    let read = r.take_read("1").expect("the run's end confirms op-1");
    r.read(read, HistoryRead::Found);
    assert!(r.entry("1").is_none());
    assert_eq!(r.sends("2"), 1, "the lane is free: the queue moves on");
}

// OB-13, sim seed 1654, then a check written from the seed: a stop and send now whose
// take-back the agent never answered was dedicated to its own turn when the run ended
// first, and sent again. The seed: "Only detachedForReplay or alreadyDetachedForReplay
// lets the desktop go on." Without a confirmed detach, the accepted steer the run did not
// take returns with auto-drain off and the seed's text, whether the agent reported it
// untaken or the history read after the run said missing; the user sends it again.
#[test]
fn stop_and_send_now_without_a_confirmed_detach_is_held_at_the_run_end() {
    for reported in [true, false] {
        let mut r = Rig::new();
        let run = r.running("1");
        r.accepted_steer("2", &run);
        let take_back = r.stop_and_send_now("2");
        // op-1's proof arrives, then the run ends.
        r.c.handle_delivery_proof(&s(SESSION), &op("op-1"), r.now);
        r.collect();
        if reported {
            r.run_ended(&run, &["2"]);
        } else {
            r.run_ended(&run, &[]);
            let read = r.take_read("2").expect("the run's end reads history");
            r.read(read, HistoryRead::Missing);
        }
        let e = r.entry("2").unwrap();
        assert!(!e.state.auto_drain(), "reported {reported}: {e:?}");
        assert!(e.state.is_queued(), "reported {reported}: {e:?}");
        assert_eq!(e.state.error(), Some(STOPPED_BEFORE_DELIVERY_TEXT));
        assert_eq!(e.state.handoff(), None, "no hand-off goes on by itself");
        assert_eq!(
            r.sends("2"),
            0,
            "reported {reported}: not sent again by itself"
        );
        // A repair or a restart does not send it either.
        r.restart();
        assert_eq!(
            r.sends("2"),
            0,
            "reported {reported}: not sent after a restart"
        );
        // The take-back's late answer changes nothing.
        r.c.handle_take_back(take_back, TakeBackResult::DetachedForReplay, r.now);
        r.collect();
        assert_eq!(r.sends("2"), 0);
        // The user's send goes once, as its own turn (a canceled record that a turn
        // accepted reads history first, OB-12).
        r.c.send_now(&s(SESSION), &q("q-2"), r.now).unwrap();
        r.collect();
        if let Some(read) = r.take_read("2") {
            r.read(read, HistoryRead::Missing);
        }
        let again = r.take_send("2");
        assert!(matches!(again.kind, SendKind::Start { .. }), "its own turn");
        assert_eq!(r.sends("2"), 0, "sent once");
        r.answer(again.attempt, SendResult::Delivered);
        assert!(r.entry("2").is_none());
    }
}

// OB-13: a confirmed detach still goes on to the message's own turn when the run ends
// before it is stopped.
#[test]
fn a_confirmed_detach_goes_on_when_the_run_ends_first() {
    let mut r = Rig::new();
    let run = r.running("1");
    r.accepted_steer("2", &run);
    let take_back = r.stop_and_send_now("2");
    r.c.handle_take_back(take_back, TakeBackResult::DetachedForReplay, r.now);
    r.collect();
    assert_eq!(r.sends("2"), 0, "it waits for run R to settle");
    let stop = r
        .effects
        .iter()
        .find_map(|e| match e {
            CustodyEffect::Stop(StopRequest { attempt, .. }) => Some(*attempt),
            _ => None,
        })
        .expect("run R is stopped");
    r.run_ended(&run, &[]);
    let read = r.take_read("1").expect("op-1 is confirmed from history");
    r.read(read, HistoryRead::Found);
    assert_eq!(r.sends("2"), 0, "the stop has not answered yet");
    r.c.handle_stop_result(stop, StopResult::Stopped { untaken: vec![] }, r.now);
    r.collect();
    let again = r.take_send("2");
    assert!(matches!(again.kind, SendKind::Start { .. }), "its own turn");
    assert_eq!(
        r.entry("2").unwrap().state.handoff().map(|h| h.phase),
        Some(HandoffPhase::Dedicated)
    );
}

// OB-08, OB-15, a limit the simulator names (pending-input-missing), then a check written
// from the seed: a steer waiting as the running turn's pending input is not in the
// agent's history yet, so "missing" proves nothing while the run works. It stayed
// sending with no text until the run ended and was then held with "The active run
// stopped before this message reached the agent", which claims what custody does not
// know. Now it shows held with the seed's unconfirmed text once the read comes back; the
// user's send waits for the run (a typed error), the run's end reads history again,
// and a steer still missing keeps the unconfirmed text.
#[test]
fn an_uncertain_steer_missing_while_its_run_works_is_held_unconfirmed() {
    for read_says in [HistoryRead::Missing, HistoryRead::Unreadable] {
        let mut r = Rig::new();
        let run = r.running("1");
        r.submit("2", Controls::steer(run.clone()));
        let steer = r.take_send("2");
        r.answer(
            steer.attempt,
            SendResult::AdmissionUncertain {
                error: "the reply was lost".into(),
            },
        );
        let read = r.take_read("2").expect("an uncertain send reads history");
        r.read(read, read_says);
        let e = r.entry("2").unwrap();
        assert!(e.state.is_queued() && !e.state.auto_drain(), "{e:?}");
        assert_eq!(e.state.error(), Some(UNCONFIRMED_TEXT));
        assert_eq!(
            r.c.send_now(&s(SESSION), &q("q-2"), r.now),
            Err(ActionError::RunMayStillTakeIt),
            "the run may still take it"
        );
        r.collect();
        assert_eq!(r.take_read("2"), None);
        r.run_ended(&run, &[]);
        let read = r.take_read("2").expect("the run's end reads history again");
        r.read(read, HistoryRead::Missing);
        let e = r.entry("2").unwrap();
        assert_eq!(
            e.state.error(),
            Some(UNCONFIRMED_TEXT),
            "nothing more is known"
        );
        assert!(!e.state.auto_drain());
        assert_eq!(r.sends("2"), 0, "not sent again by itself");
        // Now the user's send goes, once.
        r.c.send_now(&s(SESSION), &q("q-2"), r.now).unwrap();
        r.collect();
        let read = r.take_read("2").expect("history is read once more");
        r.read(read, HistoryRead::Missing);
        let again = r.take_send("2");
        assert!(matches!(again.kind, SendKind::Start { .. }));
        assert_eq!(r.sends("2"), 0);
    }
}

// OB-08: an uncertain steer held while its run worked is settled by the run's end when
// the run took it after all.
#[test]
fn an_uncertain_steer_its_run_took_is_confirmed_at_the_run_end() {
    let mut r = Rig::new();
    let run = r.running("1");
    r.submit("2", Controls::steer(run.clone()));
    let steer = r.take_send("2");
    // The send path's 31 s deadline passes.
    r.tick(outbox_core::custody::SEND_PATH_DEADLINE.0);
    r.timeout();
    let _ = steer;
    let read = r.take_read("2").expect("an uncertain send reads history");
    r.read(read, HistoryRead::Missing);
    assert_eq!(r.entry("2").unwrap().state.error(), Some(UNCONFIRMED_TEXT));
    r.run_ended(&run, &[]);
    let read = r.take_read("2").expect("the run's end reads history again");
    r.read(read, HistoryRead::Found);
    assert!(r.entry("2").is_none(), "confirmed as sent");
    let ledger =
        r.c.ledger_of(&ScopeId::of(&s(SESSION)), &op("op-2"))
            .unwrap()
            .map(|l| l.status);
    assert_eq!(ledger, Some(LedgerStatus::Sent));
}

// OB-08, OB-12: the user's explicit send of a message held unconfirmed was swallowed
// while history stayed unreadable: `send_now` answered Ok, read history again, and the
// unreadable answer held it again, for ever. The user was asked to check the timeline
// before sending it again; after that, the send goes, once.
#[test]
fn the_users_send_of_an_unconfirmed_message_goes_once_while_history_is_unreadable() {
    let mut r = Rig::new();
    r.submit("1", Controls::automatic());
    let send = r.take_send("1");
    r.answer(
        send.attempt,
        SendResult::AdmissionUncertain {
            error: "the reply was lost".into(),
        },
    );
    let read = r.take_read("1").unwrap();
    r.read(read, HistoryRead::Unreadable);
    assert_eq!(r.entry("1").unwrap().state.error(), Some(UNCONFIRMED_TEXT));
    assert_eq!(r.sends("1"), 0);
    // The run its start registered ends (a new start waits for it, OB-14).
    let SendKind::Start { run } = send.kind.clone() else {
        panic!("op-1 starts a run")
    };
    r.run_ended(&run, &[]);
    r.c.send_now(&s(SESSION), &q("q-1"), r.now).unwrap();
    r.collect();
    let read = r.take_read("1").expect("history is read once more");
    r.read(read, HistoryRead::Unreadable);
    let again = r.take_send("1");
    assert_eq!(again.operation_id, op("op-1"), "the same operation");
    assert_eq!(r.sends("1"), 0, "once");
    assert!(r.entry("1").unwrap().state.is_sending());
    // Found on the read before the send: nothing goes out.
    let mut r = Rig::new();
    r.submit("1", Controls::automatic());
    let send = r.take_send("1");
    r.answer(
        send.attempt,
        SendResult::AdmissionUncertain {
            error: "the reply was lost".into(),
        },
    );
    let read = r.take_read("1").unwrap();
    r.read(read, HistoryRead::Unreadable);
    r.c.send_now(&s(SESSION), &q("q-1"), r.now).unwrap();
    r.collect();
    let read = r.take_read("1").unwrap();
    r.read(read, HistoryRead::Found);
    assert_eq!(r.sends("1"), 0);
    assert!(r.entry("1").is_none());
}

// OB-07, OB-09 ("Failures are state"): with the store failing every write, a send
// answered Accepted could not be recorded; at the retry the write failed again and a
// new failure was noted, but the repair due at the same moment then cleared it, so
// `store_failure` said nothing while the answer still waited for its retry. It now
// shows until the retries succeed.
#[test]
fn a_store_failure_shows_while_its_retry_is_pending() {
    let mut r = Rig::new();
    r.submit("1", Controls::automatic());
    let send = r.take_send("1");
    let SendKind::Start { run } = send.kind.clone() else {
        panic!("op-1 starts a run")
    };
    r.fail_writes(false);
    r.answer(send.attempt, SendResult::Accepted(acceptance(&run, 1)));
    let first = r.c.store_failure(&s(SESSION)).cloned().expect("noted");
    assert_eq!(first.retry_at, Some(r.now.saturating_add(STORE_RETRY)));
    r.tick(STORE_RETRY.0);
    r.timeout();
    let again = r.c.store_failure(&s(SESSION)).cloned();
    assert_eq!(
        again.as_ref().and_then(|f| f.retry_at),
        Some(r.now.saturating_add(STORE_RETRY)),
        "still failing: {again:?}"
    );
    r.tick(STORE_RETRY.0);
    r.timeout();
    assert!(r.c.store_failure(&s(SESSION)).is_some(), "still failing");
    r.heal();
    r.tick(STORE_RETRY.0);
    r.timeout();
    assert_eq!(r.c.store_failure(&s(SESSION)), None, "the retry succeeded");
    assert!(matches!(
        r.entry("1").unwrap().state,
        EntryState::Accepted { .. }
    ));
}

// OB-12, sim seed 3115: the reopen check of a canceled steer (the user sent it again)
// held the entry with nothing shown while it read the agent's history; the host stopped
// before the answer, and the entry stayed held with no reason for good. The wait now
// shows why, and the check is asked again when custody reads the outbox at start-up.
#[test]
fn a_reopen_check_cut_short_by_a_restart_is_asked_again() {
    let mut r = Rig::new();
    let run = r.running("1");
    r.accepted_steer("2", &run);
    r.run_ended(&run, &["2"]);
    let read = r.take_read("1").expect("the run's end confirms op-1");
    r.read(read, HistoryRead::Found);
    r.c.send_now(&s(SESSION), &q("q-2"), r.now).unwrap();
    r.collect();
    assert!(r.take_read("2").is_some(), "the reopen check reads history");
    let e = r.entry("2").unwrap();
    assert_eq!(e.state.hold_reason(), Some(REOPEN_CHECK_TEXT));
    // The host stops before the answer; a new one starts from the same store.
    r.restart();
    let read = r.take_read("2").expect("the check is asked again");
    r.read(read, HistoryRead::Missing);
    let again = r.take_send("2");
    assert!(matches!(again.kind, SendKind::Start { .. }), "its own turn");
}

// OB-09, OB-10, sim seed 4150: an acceptance whose write failed waited for its retry; the
// repair of the same failure, due at the same moment, ran first, found the entry sending
// with nothing in flight and read its history; the retry then recorded the acceptance,
// and the read (taken for the entry as it was) settled nothing, so the entry stayed
// accepted by a run that ended. A repair runs after the answers due with it.
#[test]
fn a_repair_runs_after_the_answers_due_with_it() {
    let mut r = Rig::new();
    r.submit("1", Controls::automatic());
    let send = r.take_send("1");
    let SendKind::Start { run } = send.kind.clone() else {
        panic!("op-1 starts a run")
    };
    r.fail_writes(false);
    r.answer(send.attempt, SendResult::Accepted(acceptance(&run, 1)));
    r.heal();
    r.tick(STORE_RETRY.as_u64());
    r.timeout();
    assert!(
        matches!(r.entry("1").unwrap().state, EntryState::Accepted { .. }),
        "the acceptance was recorded on retry"
    );
    assert!(
        r.take_read("1").is_none(),
        "what the working run accepted waits for the run's end"
    );
    r.run_ended(&run, &[]);
    let read = r.take_read("1").expect("the run's end confirms op-1");
    r.read(read, HistoryRead::Found);
    assert!(r.entry("1").is_none());
}

// OB-09, OB-10, OB-12, sim seed 4494: the reopen check's answer could not be written (the
// write was made and reported failed), so it waited for its retry; meanwhile the drain's
// hand-off of the message was made and reported failed as well, leaving it sending with
// nothing in flight. The repair took the waiting answer for something under way,
// though that answer was for the entry as it was before and applied to nothing. Only
// what applies to the entry as it is now counts as under way.
#[test]
fn a_repair_does_not_wait_for_an_answer_taken_for_an_older_state() {
    let mut r = Rig::new();
    let run = r.running("1");
    r.accepted_steer("2", &run);
    r.run_ended(&run, &["2"]);
    let read = r.take_read("1").expect("the run's end confirms op-1");
    r.read(read, HistoryRead::Found);
    // A failed submit schedules the session's repair.
    r.fail_writes(false);
    let refused =
        r.c.submit(submit_req(SESSION, "3", Controls::enqueue()), r.now);
    assert!(refused.is_err());
    r.heal();
    r.collect();
    let repair_at = r.c.poll_timeout().unwrap();
    // The user sends op-2 again: the reopen check reads history.
    r.c.send_now(&s(SESSION), &q("q-2"), r.now).unwrap();
    r.collect();
    let read = r.take_read("2").expect("the reopen check");
    // Its answer and the drain's hand-off are written, and reported failed.
    r.tick(100);
    r.fail_writes(true);
    r.read(read, HistoryRead::Missing);
    r.tick(100);
    r.c.wake(&s(SESSION), r.now);
    r.collect();
    r.heal();
    assert!(r.stored("2").unwrap().state.is_sending());
    assert_eq!(r.sends("2"), 0, "nothing reached the agent");
    r.now = repair_at;
    r.timeout();
    let read = r.take_read("2").expect("the repair confirms op-2");
    r.read(read, HistoryRead::Missing);
    assert_eq!(r.entry("2").unwrap().state.error(), Some(UNCONFIRMED_TEXT));
    r.tick(10_000);
    r.timeout();
    assert_eq!(r.sends("2"), 0, "never sent blindly");
}

// OB-08, OB-10, OB-15, sim seed 7543 (pending-input-missing): the host restarted while a
// steer waited as the pending input of a run the agent kept working on. The start-up
// read said missing (history does not see pending input), the entry was held as
// unconfirmed, and the user's "send now" sent it a second time. A run the agent reports
// working counts as working though the new host's registry does not hold it: what it
// accepted waits for its end.
#[test]
fn a_steer_of_a_run_from_before_a_restart_waits_for_that_run() {
    let mut r = Rig::new();
    let run = r.running("1");
    r.accepted_steer("2", &run);
    r.restart();
    r.tick(10);
    r.c.touch_run(&s(SESSION), &run, r.now);
    let read = r.take_read("2").expect("start-up confirms op-2");
    r.read(read, HistoryRead::Missing);
    assert!(
        matches!(r.entry("2").unwrap().state, EntryState::Accepted { .. }),
        "missing proves nothing while the run works"
    );
    assert_eq!(
        r.c.send_now(&s(SESSION), &q("q-2"), r.now),
        Err(ActionError::Blocked)
    );
    r.run_ended(&run, &["2"]);
    assert_eq!(
        r.entry("2").unwrap().state.error(),
        Some(STOPPED_BEFORE_DELIVERY_TEXT)
    );
    assert_eq!(r.sends("2"), 0, "not sent again");
}

// OB-10, OB-14: a run from before a restart that the agent stops reporting counts as
// gone once it is silent for as long as the stale reclaim waits; what it accepted is
// then confirmed from history.
#[test]
fn a_run_from_before_a_restart_that_goes_silent_is_gone() {
    let mut r = Rig::new();
    let run = r.running("1");
    r.accepted_steer("2", &run);
    r.restart();
    r.c.touch_run(&s(SESSION), &run, r.now);
    let read = r.take_read("2").expect("start-up confirms op-2");
    r.read(read, HistoryRead::Missing);
    assert!(r.entry("2").unwrap().state.is_sending());
    let silent_at = r.c.poll_timeout().expect("the run's silence is timed");
    assert_eq!(
        silent_at,
        r.now
            .saturating_add(outbox_core::runs::STALE_RUN_AFTER)
            .saturating_add(Millis(1))
    );
    r.now = silent_at;
    r.timeout();
    let read = r.take_read("2").expect("confirmed from history again");
    r.read(read, HistoryRead::Missing);
    assert_eq!(r.entry("2").unwrap().state.error(), Some(UNCONFIRMED_TEXT));
    assert_eq!(r.sends("2"), 0);
}

// OB-11, OB-14, sim seed 66039: a steer for a run whose own start was still unanswered
// was handed off with a write that committed and reported failure; the repair found the
// steer out with its run working and left it to the run's end. The agent then refused
// the run's start, so no end ever came and the steer stayed out for ever. A run whose
// start is refused settles the steers sent to it, as a run's end does.
#[test]
fn steers_sent_to_a_run_whose_start_was_refused_are_settled() {
    let mut r = Rig::new();
    r.submit("1", Controls::automatic());
    let start = r.take_send("1");
    let SendKind::Start { run } = start.kind.clone() else {
        panic!("op-1 starts a run")
    };
    // The steer is saved; its hand-off is written and reported failed.
    r.fail_writes(true);
    let refused = r.c.submit(
        submit_req(SESSION, "2", Controls::steer(run.clone())),
        r.now,
    );
    assert!(refused.is_err(), "the store reported failure");
    r.collect();
    r.tick(1_000);
    r.timeout();
    r.heal();
    let made = r.stored("2").map(|e| e.state);
    assert!(
        made.as_ref().is_some_and(EntryState::is_sending),
        "the hand-off was made: {made:?}"
    );
    assert_eq!(r.sends("2"), 0, "and nothing went out");
    // The repair after the failure leaves the steer to its run, which works.
    r.tick(1_000);
    r.timeout();
    assert_eq!(r.take_read("2"), None);
    assert_eq!(r.sends("2"), 0);
    r.answer(
        start.attempt,
        SendResult::ProvenUnadmitted {
            error: "a turn is already running".into(),
        },
    );
    assert!(
        r.take_read("2").is_some(),
        "the run never ran: the steer is confirmed from history"
    );
}
