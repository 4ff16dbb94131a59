//! Stop (OB-15), interrupt (OB-11) and the run registry at the custody level (OB-14),
//! driven by a simulated clock.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use fixtures::adapters::WhenUnscripted;
use outbox_core::adapter::StopRequest;
use outbox_core::adapter::{AttemptId, StopResult};
use outbox_core::custody::{CustodyEffect, SessionInfo, StopAnswer, MODEL_CHANGED_TEXT};
use outbox_core::entry::{Controls, EntryStatus, STOPPED_BEFORE_DELIVERY_TEXT};
use timeline_core::time::Millis;

fn effects(b: &mut Bench) -> Vec<CustodyEffect> {
    b.effects()
}

fn running(b: &mut Bench) -> outbox_core::ids::RunId {
    b.agent.default = WhenUnscripted::Accept;
    b.submit("s1", "run", Controls::automatic());
    b.active_run("s1").unwrap()
}

// OB-15: one worker per (session, run) shared by every caller; 5 s, then still settling.
#[test]
fn callers_share_one_worker_and_get_still_settling_after_5_seconds() {
    let mut b = Bench::codex(&["s1"]);
    let run = running(&mut b);
    let t0 = b.now;
    b.c.stop(&s("s1"), &run, Some(1), t0);
    b.c.stop(&s("s1"), &run, Some(2), t0.saturating_add(Millis(1_000)));
    let e = effects(&mut b);
    assert_eq!(
        e,
        [CustodyEffect::Stop(StopRequest {
            attempt: AttemptId(0),
            session: s("s1"),
            run: run.clone()
        })],
        "one worker"
    );
    assert_eq!(b.c.poll_timeout(), Some(t0.saturating_add(Millis(5_000))));
    b.c.handle_timeout(t0.saturating_add(Millis(5_000)));
    assert_eq!(
        effects(&mut b),
        [CustodyEffect::StopAnswer {
            caller: 1,
            answer: StopAnswer::StillSettling
        }]
    );
    // The worker goes on and keeps new runs blocked.
    b.c.submit(submit_req("s1", "next", Controls::interrupt()), b.now)
        .unwrap();
    assert!(effects(&mut b)
        .iter()
        .all(|e| !matches!(e, CustodyEffect::Send(_))));
    b.c.handle_timeout(t0.saturating_add(Millis(6_000)));
    assert_eq!(
        effects(&mut b),
        [CustodyEffect::StopAnswer {
            caller: 2,
            answer: StopAnswer::StillSettling
        }]
    );
    b.c.handle_stop_result(
        b.stop_attempt(),
        StopResult::Stopped { untaken: vec![] },
        t0.saturating_add(Millis(7_000)),
    );
    // After the result every outbox in the scope drains.
    b.drive();
    assert_eq!(b.agent.send_count(&op("op-next")), 1);
}

// OB-15: a success is kept 60 s for repeated requests; a failure is dropped at once.
#[test]
fn a_success_is_cached_for_60_seconds_and_a_failure_is_not() {
    let mut b = Bench::codex(&["s1"]);
    let run = running(&mut b);
    let t0 = b.now;
    b.c.stop(&s("s1"), &run, Some(1), t0);
    let _ = effects(&mut b);
    b.c.handle_stop_result(
        b.stop_attempt(),
        StopResult::Stopped { untaken: vec![] },
        t0,
    );
    assert!(effects(&mut b).contains(&CustodyEffect::StopAnswer {
        caller: 1,
        answer: StopAnswer::Stopped
    }));
    b.c.stop(&s("s1"), &run, Some(2), t0.saturating_add(Millis(59_999)));
    assert_eq!(
        effects(&mut b),
        [CustodyEffect::StopAnswer {
            caller: 2,
            answer: StopAnswer::Stopped
        }]
    );
    b.c.handle_timeout(t0.saturating_add(Millis(60_000)));
    b.c.stop(&s("s1"), &run, Some(3), t0.saturating_add(Millis(60_000)));
    assert_eq!(
        effects(&mut b),
        [CustodyEffect::Stop(StopRequest {
            attempt: AttemptId(0),
            session: s("s1"),
            run: run.clone()
        })],
        "the cache expired"
    );

    let mut b = Bench::codex(&["s1"]);
    let run = running(&mut b);
    b.c.stop(&s("s1"), &run, Some(1), b.now);
    let _ = effects(&mut b);
    b.c.handle_stop_result(
        b.stop_attempt(),
        StopResult::Failed {
            error: "turn not found".into(),
        },
        b.now,
    );
    assert!(effects(&mut b).contains(&CustodyEffect::StopAnswer {
        caller: 1,
        answer: StopAnswer::Failed("turn not found".into())
    }));
    assert_eq!(
        b.active_run("s1"),
        Some(run.clone()),
        "the run may still be active"
    );
    b.c.stop(&s("s1"), &run, Some(2), b.now);
    assert_eq!(
        effects(&mut b),
        [CustodyEffect::Stop(StopRequest {
            attempt: AttemptId(0),
            session: s("s1"),
            run
        })],
        "the next request checks the run again"
    );
}

// OB-15: a crashed attempt is retried after 250 ms.
#[test]
fn a_crashed_stop_attempt_is_retried_after_250_ms() {
    let mut b = Bench::codex(&["s1"]);
    let run = running(&mut b);
    let t0 = b.now;
    b.c.stop(&s("s1"), &run, None, t0);
    let _ = effects(&mut b);
    b.c.handle_stop_result(b.stop_attempt(), StopResult::Crashed, t0);
    assert_eq!(b.c.poll_timeout(), Some(t0.saturating_add(Millis(250))));
    b.c.handle_timeout(t0.saturating_add(Millis(249)));
    assert!(effects(&mut b).is_empty());
    b.c.handle_timeout(t0.saturating_add(Millis(250)));
    assert_eq!(
        effects(&mut b),
        [CustodyEffect::Stop(StopRequest {
            attempt: AttemptId(0),
            session: s("s1"),
            run
        })]
    );
}

// OB-15: stop removes no message; an accepted steer the agent had not taken returns with
// auto-drain off and the seed's text; queued messages stay as they are.
#[test]
fn stop_returns_untaken_steers_and_removes_nothing() {
    let mut b = Bench::claude(&["s1"]);
    let run = running(&mut b);
    b.submit("s1", "steer", Controls::steer(run.clone()));
    b.submit("s1", "queued", Controls::enqueue());
    b.agent.stops.push_back(StopResult::Stopped {
        untaken: vec![op("op-steer")],
    });
    b.c.stop(&s("s1"), &run, Some(9), b.now);
    b.drive();
    let steer = b.entry("s1", "steer").unwrap();
    assert_eq!(
        (
            steer.state.status(),
            steer.state.auto_drain(),
            steer.state.error()
        ),
        (
            EntryStatus::Queued,
            false,
            Some(STOPPED_BEFORE_DELIVERY_TEXT)
        )
    );
    // The queued message was not removed: it drained after the stop as its own run.
    assert_eq!(b.agent.send_count(&op("op-queued")), 1);
    assert_eq!(
        b.agent.send_count(&op("op-steer")),
        1,
        "the returned steer is not resent by itself"
    );
}

// OB-11: interrupt: model check, stop, poll every 25 ms up to 10 s, then start.
#[test]
fn an_interrupt_stops_the_run_and_starts_once_it_left_the_registry() {
    let mut b = Bench::codex(&["s1"]);
    let run = running(&mut b);
    b.agent.stops.push_back(StopResult::Crashed);
    let t0 = b.now;
    b.c.submit(submit_req("s1", "int", Controls::interrupt()), t0)
        .unwrap();
    assert_eq!(
        effects(&mut b),
        [CustodyEffect::Stop(StopRequest {
            attempt: AttemptId(0),
            session: s("s1"),
            run: run.clone()
        })]
    );
    // The stop settles after 300 ms (a crash, then the retry).
    b.c.handle_stop_result(b.stop_attempt(), StopResult::Crashed, t0);
    for t in (25..=250).step_by(25) {
        b.c.handle_timeout(t0.saturating_add(Millis(t)));
    }
    let retry = effects(&mut b);
    assert_eq!(
        retry,
        [CustodyEffect::Stop(StopRequest {
            attempt: AttemptId(0),
            session: s("s1"),
            run: run.clone()
        })]
    );
    b.c.handle_stop_result(
        b.stop_attempt(),
        StopResult::Stopped { untaken: vec![] },
        t0.saturating_add(Millis(300)),
    );
    b.drive();
    assert_eq!(
        b.agent.send_count(&op("op-int")),
        0,
        "waits for the next 25 ms poll"
    );
    b.advance(325);
    assert_eq!(b.agent.send_count(&op("op-int")), 1);
    assert_ne!(b.active_run("s1"), Some(run), "its own run");
}

// OB-11: a newer turn during the wait keeps it queued; 10 s of settling keeps it queued.
#[test]
fn an_interrupt_that_meets_a_newer_turn_or_a_slow_stop_stays_queued() {
    let mut b = Bench::codex(&["s1"]);
    let run = running(&mut b);
    let t0 = b.now;
    b.c.submit(submit_req("s1", "int", Controls::interrupt()), t0)
        .unwrap();
    let _ = effects(&mut b);
    // The stop never answers: after 10 s the message stays queued.
    for t in (25..=10_000).step_by(25) {
        b.c.handle_timeout(t0.saturating_add(Millis(t)));
    }
    let e = b.entry("s1", "int").unwrap();
    assert_eq!(e.state.status(), EntryStatus::Queued);
    assert_eq!(b.agent.send_count(&op("op-int")), 0);
    assert_eq!(b.active_run("s1"), Some(run.clone()));

    // A newer turn appears while the old run leaves.
    let mut b = Bench::codex(&["s1"]);
    let run = running(&mut b);
    let t0 = b.now;
    b.c.submit(submit_req("s1", "int", Controls::interrupt()), t0)
        .unwrap();
    assert!(effects(&mut b).contains(&CustodyEffect::Stop(StopRequest {
        attempt: AttemptId(0),
        session: s("s1"),
        run,
    })));
    b.c.handle_stop_result(
        b.stop_attempt(),
        StopResult::Stopped { untaken: vec![] },
        t0,
    );
    let _ = effects(&mut b);
    let newer = outbox_core::runs::ActiveRun {
        run_id: outbox_core::ids::RunId::new("run-newer").unwrap(),
        started_by: None,
        last_session_message: None,
        access: None,
        last_activity: t0,
        finalizing: false,
    };
    b.c.restore_run(&s("s1"), newer, t0).unwrap();
    b.advance(25);
    assert_eq!(
        b.agent.send_count(&op("op-int")),
        0,
        "a newer turn keeps it queued"
    );
    assert_eq!(
        b.entry("s1", "int").unwrap().state.status(),
        EntryStatus::Queued
    );
    assert_eq!(
        b.active_run("s1").unwrap().as_str(),
        "run-newer",
        "the newer turn is not interrupted"
    );
    // It waits like a queued message: when the newer run ends, it starts.
    b.c.handle_run_ended(
        &s("s1"),
        &outbox_core::ids::RunId::new("run-newer").unwrap(),
        &[],
        b.now,
    );
    b.drive();
    assert_eq!(b.agent.send_count(&op("op-int")), 1);
}

// OB-11: the model is checked before the run is stopped.
#[test]
fn an_interrupt_with_a_changed_model_holds_the_message_and_stops_nothing() {
    let mut b = Bench::codex(&["s1"]);
    let run = running(&mut b);
    let mut info = SessionInfo::new(outbox_core::adapter::Capabilities::codex());
    info.model = Some("gpt-next".into());
    b.c.set_session(&s("s1"), info);
    let mut req = submit_req("s1", "int", Controls::interrupt());
    req.request.expected_model = Some("gpt-old".into());
    b.c.submit(req, b.now).unwrap();
    assert!(effects(&mut b).is_empty(), "no stop");
    let e = b.entry("s1", "int").unwrap();
    assert_eq!(
        (e.state.auto_drain(), e.state.error()),
        (false, Some(MODEL_CHANGED_TEXT))
    );
    assert_eq!(b.active_run("s1"), Some(run));
}

// OB-14: the stale reclaim at each read of active runs, with the adapter's veto.
#[test]
fn active_runs_reclaim_stale_runs_unless_vetoed() {
    let mut b = Bench::codex(&["s1"]);
    let run = running(&mut b);
    let t0 = b.now;
    b.c.set_veto(&s("s1"), &run, true);
    assert_eq!(b.c.active_runs(t0.saturating_add(Millis(100_000))).len(), 1);
    b.c.set_veto(&s("s1"), &run, false);
    b.c.touch_run(&s("s1"), &run, t0.saturating_add(Millis(60_000)));
    assert_eq!(
        b.c.active_runs(t0.saturating_add(Millis(105_000))).len(),
        1,
        "45 s is not past"
    );
    assert!(b
        .c
        .active_runs(t0.saturating_add(Millis(105_001)))
        .is_empty());
}
