//! Model-based property test of custody (OB-03 to OB-15): random sequences of submits
//! (with repeats and conflicts), send results of every kind, late results, echoes, run
//! ends, stops, stop-and-send-now, user actions, restarts and history reads, checked
//! after every step against a reference model of what was promised.
//!
//! Invariants:
//! - every operation that got a receipt is still in the outbox or proven sent (the user
//!   removing or editing it is the only other way out);
//! - no operation reaches the agent while the agent already holds it, unless the agent
//!   confirmed a detach (the scripted agent keeps its own history: a duplicate is a send
//!   of an operation it recorded);
//! - the ledger never moves to weaker proof (except the reopen check's canceled ->
//!   failed);
//! - no wake-up is lost: at rest, an idle, unambiguous session has no drainable entry;
//! - an ambiguous scope (two active runs, or a pending cancellation) sends nothing.
#![allow(clippy::unwrap_used)]

mod common;

use outbox_core::adapter::{ReadHistoryRequest, StopRequest, TakeBackRequest};
use outbox_core::ids::ScopeId;
use std::collections::{BTreeMap, BTreeSet};

use common::*;
use fixtures::adapters::{ScriptedAdapter, Step as AgentStep, WhenUnscripted};
use outbox_core::adapter::{AgentAdapter, Capabilities, SendResult, StopResult};
use outbox_core::custody::{ActionError, Custody, CustodyEffect, SubmitError};
use outbox_core::entry::{Controls, UNCONFIRMED_TEXT};
use outbox_core::ids::{OperationId, SessionId};
use outbox_core::ledger::LedgerStatus;
use outbox_core::runs::ActiveRun;
use outbox_core::store::memory::MemoryOutboxStore;
use proptest::prelude::*;
use timeline_core::time::Millis;

const SESSIONS: [&str; 2] = ["s1", "s1::skills-agent"];

#[derive(Clone, Debug)]
enum Cmd {
    Submit { session: usize, n: u8, kind: u8 },
    Conflict { n: u8 },
    Script(u8),
    Echo { n: u8 },
    RunEnded { session: usize, drop_untaken: bool },
    Stop { session: usize, drop_untaken: bool },
    StopAndSendNow { n: u8 },
    SendNow { n: u8 },
    Remove { n: u8 },
    Restart,
    Advance(u64),
    Unreadable(bool),
    AliasRun,
}

fn cmd() -> impl Strategy<Value = Cmd> {
    prop_oneof![
        6 => (0usize..2, 0u8..8, 0u8..4).prop_map(|(session, n, kind)| Cmd::Submit { session, n, kind }),
        1 => (0u8..8).prop_map(|n| Cmd::Conflict { n }),
        5 => (0u8..8).prop_map(Cmd::Script),
        2 => (0u8..8).prop_map(|n| Cmd::Echo { n }),
        2 => (0usize..2, any::<bool>()).prop_map(|(session, drop_untaken)| Cmd::RunEnded { session, drop_untaken }),
        2 => (0usize..2, any::<bool>()).prop_map(|(session, drop_untaken)| Cmd::Stop { session, drop_untaken }),
        1 => (0u8..8).prop_map(|n| Cmd::StopAndSendNow { n }),
        1 => (0u8..8).prop_map(|n| Cmd::SendNow { n }),
        1 => (0u8..8).prop_map(|n| Cmd::Remove { n }),
        1 => Just(Cmd::Restart),
        2 => (1u64..40_000).prop_map(Cmd::Advance),
        1 => any::<bool>().prop_map(Cmd::Unreadable),
        1 => Just(Cmd::AliasRun),
    ]
}

struct World {
    c: Custody<MemoryOutboxStore>,
    agent: ScriptedAdapter,
    now: Millis,
    /// Operations with a receipt, by session, that the user did not remove.
    promised: BTreeMap<OperationId, SessionId>,
    /// Strongest ledger status seen per operation.
    ledger_seen: BTreeMap<OperationId, LedgerStatus>,
    /// Operations the agent confirmed detached since it last recorded them.
    detached: BTreeSet<OperationId>,
}

fn opn(n: u8) -> OperationId {
    op(&format!("op-{n}"))
}

impl World {
    fn new() -> World {
        let mut agent = ScriptedAdapter::codex();
        agent.default = WhenUnscripted::Accept;
        World {
            c: custody(MemoryOutboxStore::new(), Capabilities::codex(), &SESSIONS),
            agent,
            now: Millis(1_000),
            promised: BTreeMap::new(),
            ledger_seen: BTreeMap::new(),
            detached: BTreeSet::new(),
        }
    }

    /// Carries out effects; checks the duplicate and ambiguity rules at every send.
    fn drive(&mut self) -> Result<(), TestCaseError> {
        while let Some(e) = self.c.poll_effect() {
            match e {
                CustodyEffect::Send(req) => {
                    prop_assert!(
                        !self.c.runs().cancellation_pending(&req.session),
                        "a send while a cancellation is pending"
                    );
                    prop_assert!(
                        self.c.runs().scope_runs(&req.session).len() <= 1,
                        "a send in an ambiguous scope"
                    );
                    let held = self.agent.history.contains(&req.operation_id);
                    prop_assert!(
                        !held || self.detached.contains(&req.operation_id),
                        "{} reached the agent twice",
                        req.operation_id
                    );
                    let result = self.agent.send(&req);
                    if self.agent.history.contains(&req.operation_id) {
                        self.detached.remove(&req.operation_id);
                    }
                    self.c.handle_send_result(req.attempt, result, self.now);
                }
                CustodyEffect::ReadHistory(ReadHistoryRequest {
                    attempt,
                    session,
                    operation_id,
                    ..
                }) => {
                    let read = self.agent.read_history(&session, &operation_id);
                    self.c.handle_history_read(attempt, read, self.now);
                }
                CustodyEffect::Stop(StopRequest {
                    attempt,
                    session,
                    run,
                }) => {
                    let r = self.agent.stop(&session, &run);
                    self.c.handle_stop_result(attempt, r, self.now);
                }
                CustodyEffect::TakeBack(TakeBackRequest {
                    attempt,
                    session,
                    operation_id,
                    acceptance,
                }) => {
                    let r = self.agent.take_back(&session, &operation_id, &acceptance);
                    if matches!(r, outbox_core::adapter::TakeBackResult::DetachedForReplay) {
                        self.detached.insert(operation_id.clone());
                    }
                    self.c.handle_take_back(attempt, r, self.now);
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn entry_session(
        &mut self,
        op: &OperationId,
    ) -> Option<(SessionId, outbox_core::entry::OutboxEntry)> {
        for sid in SESSIONS {
            let session = s(sid);
            if let Some(e) = self
                .c
                .entries(&session)
                .unwrap()
                .into_iter()
                .filter_map(|e| e.entry().cloned())
                .find(|e| &e.operation_id == op)
            {
                return Some((session, e));
            }
        }
        None
    }

    /// Accepted-but-unconfirmed operations of the run: the agent drops (untakes) them.
    /// The active run of session `n`, with the operations its end leaves untaken (taken
    /// out of the agent's history when `drop_untaken`).
    fn ending_run(
        &mut self,
        n: usize,
        drop_untaken: bool,
    ) -> Option<(SessionId, outbox_core::ids::RunId, Vec<OperationId>)> {
        let sid = s(SESSIONS[n]);
        let run = self.c.runs().active(&sid).map(|r| r.run_id.clone())?;
        let untaken = if drop_untaken {
            self.untake(&sid, &run)
        } else {
            Vec::new()
        };
        Some((sid, run, untaken))
    }

    fn untake(&mut self, session: &SessionId, run: &outbox_core::ids::RunId) -> Vec<OperationId> {
        let mut out = Vec::new();
        for e in self
            .c
            .entries(session)
            .unwrap()
            .into_iter()
            .filter_map(|e| e.entry().cloned())
        {
            // Only a sending entry holds an acceptance.
            if e.state.acceptance().is_some_and(|a| &a.run_id == run) {
                self.agent.history.remove(&e.operation_id);
                out.push(e.operation_id);
            }
        }
        out
    }

    fn run(&mut self, cmd: Cmd) -> Result<(), TestCaseError> {
        match cmd {
            Cmd::Submit { session, n, kind } => {
                let sid = SESSIONS[session];
                let controls = match kind {
                    0 => Controls::automatic(),
                    1 => Controls::enqueue(),
                    2 => match self.c.runs().active(&s(sid)) {
                        Some(r) => Controls::steer(r.run_id.clone()),
                        None => Controls::enqueue(),
                    },
                    _ => Controls::interrupt(),
                };
                let mut req = submit_req(sid, &n.to_string(), controls);
                req.queue_id = q(&format!("q-{sid}-{n}"));
                match self.c.submit(req, self.now) {
                    Ok(r) => {
                        if !r.replayed || self.promised.contains_key(&r.operation_id) {
                            self.promised.insert(r.operation_id, s(sid));
                        }
                    }
                    Err(SubmitError::Conflict(_)) | Err(SubmitError::Invalid(_)) => {}
                    Err(e) => prop_assert!(false, "{e}"),
                }
            }
            Cmd::Conflict { n } => {
                let mut req = submit_req("s1", &n.to_string(), Controls::automatic());
                req.queue_id = q(&format!("q-s1-{n}"));
                req.request.user_text = "a different request".into();
                if let Ok(r) = self.c.submit(req, self.now) {
                    self.promised.insert(r.operation_id, s("s1"));
                }
            }
            Cmd::Script(k) => {
                let step = match k {
                    0 => AgentStep::delivered(),
                    1 => AgentStep::result(SendResult::Deferred {
                        reason: "settling".into(),
                    }),
                    2 => AgentStep::result(SendResult::Canceled),
                    3 => AgentStep::result(SendResult::ProvenUnadmitted {
                        error: "closed".into(),
                    }),
                    4 => AgentStep::lost_reply_but_recorded(),
                    5 => AgentStep::lost_reply_not_recorded(),
                    _ => AgentStep {
                        result: SendResult::Accepted(
                            self.agent
                                .acceptance(&outbox_core::ids::RunId::new("run-x").unwrap()),
                        ),
                        recorded: true,
                    },
                };
                self.agent.then(step);
            }
            Cmd::Echo { n } => {
                let o = opn(n);
                if self.agent.history.contains(&o) {
                    if let Some((session, _)) = self.entry_session(&o) {
                        self.c.handle_delivery_proof(&session, &o, self.now);
                    }
                }
            }
            Cmd::RunEnded {
                session,
                drop_untaken,
            } => {
                if let Some((sid, run, untaken)) = self.ending_run(session, drop_untaken) {
                    self.c.handle_run_ended(&sid, &run, &untaken, self.now);
                }
            }
            Cmd::Stop {
                session,
                drop_untaken,
            } => {
                if let Some((sid, run, untaken)) = self.ending_run(session, drop_untaken) {
                    self.agent.stops.push_back(StopResult::Stopped { untaken });
                    self.c.stop(&sid, &run, Some(1), self.now);
                }
            }
            Cmd::StopAndSendNow { n } => {
                if let Some((session, e)) = self.entry_session(&opn(n)) {
                    // A refusal is an answer the user sees (OB-13): the entry is not an
                    // accepted steer of a running turn (any more), or it moved on. The
                    // memory store never fails, so nothing else may come back.
                    let r = self.c.stop_and_send_now(&session, &e.queue_id, self.now);
                    assert!(
                        matches!(
                            r,
                            Ok(())
                                | Err(ActionError::NotAnAcceptedSteer
                                    | ActionError::Blocked
                                    | ActionError::ModelChanged
                                    | ActionError::NotFound)
                        ),
                        "stop and send now: {r:?}"
                    );
                }
            }
            Cmd::SendNow { n } => {
                if let Some((session, e)) = self.entry_session(&opn(n)) {
                    // The user checks the timeline before resending an unconfirmed one.
                    if e.state.error() != Some(UNCONFIRMED_TEXT) {
                        // Refused only as the user would see it (OB-12): the entry moved
                        // on, or is out; the memory store never fails.
                        let r = self.c.send_now(&session, &e.queue_id, self.now);
                        assert!(!matches!(r, Err(ActionError::Store(_))), "send now: {r:?}");
                    }
                }
            }
            Cmd::Remove { n } => {
                if let Some((session, e)) = self.entry_session(&opn(n)) {
                    if self.c.remove(&session, &e.queue_id, self.now).is_ok() {
                        self.promised.remove(&e.operation_id);
                    }
                }
            }
            Cmd::Restart => {
                let placeholder = custody(MemoryOutboxStore::new(), Capabilities::codex(), &[]);
                let store = std::mem::replace(&mut self.c, placeholder).into_store();
                self.c = custody(store, Capabilities::codex(), &SESSIONS);
                self.c.start_up(self.now).unwrap();
            }
            Cmd::Advance(ms) => {
                self.now = self.now.saturating_add(Millis(ms));
                self.c.handle_timeout(self.now);
            }
            Cmd::Unreadable(u) => self.agent.unreadable = u,
            Cmd::AliasRun => {
                let alias = s(SESSIONS[1]);
                let run = ActiveRun {
                    run_id: outbox_core::ids::RunId::new(format!(
                        "run-alias-{}",
                        self.now.as_u64()
                    ))
                    .unwrap(),
                    started_by: None,
                    last_session_message: None,
                    access: None,
                    last_activity: self.now,
                    finalizing: false,
                };
                // The alias scope may hold a run already: then the restore is refused,
                // and nothing else may come back.
                let r = self.c.restore_run(&alias, run, self.now);
                assert!(
                    matches!(r, Ok(()) | Err(outbox_core::runs::RunError::RestoreRefused)),
                    "restore: {r:?}"
                );
            }
        }
        self.drive()?;
        self.check()
    }

    fn check(&mut self) -> Result<(), TestCaseError> {
        // Nothing promised is lost.
        for (o, session) in self.promised.clone() {
            let present = self.entry_session(&o).is_some();
            let base = outbox_core::ids::base_session(&session);
            let sent = self
                .c
                .ledger_of(&ScopeId::of(&base), &o)
                .unwrap()
                .is_some_and(|l| l.status == LedgerStatus::Sent);
            prop_assert!(present || sent, "{} was dropped", o);
        }
        // The ledger never weakens (but for the reopen check).
        for (o, session) in self.promised.clone() {
            let base = outbox_core::ids::base_session(&session);
            if let Some(l) = self.c.ledger_of(&ScopeId::of(&base), &o).unwrap() {
                if let Some(prev) = self.ledger_seen.get(&o) {
                    // The reopen check turns canceled into failed, and the next attempt
                    // may record sending in the same step.
                    let reopened = *prev == LedgerStatus::Canceled
                        && matches!(l.status, LedgerStatus::Failed | LedgerStatus::Sending);
                    prop_assert!(
                        l.status.strength() >= prev.strength() || reopened,
                        "{}: {:?} -> {:?}",
                        o,
                        prev,
                        l.status
                    );
                }
                self.ledger_seen.insert(o, l.status);
            }
        }
        Ok(())
    }

    /// At rest: every idle, unambiguous session has nothing drainable left.
    fn quiesce(&mut self) -> Result<(), TestCaseError> {
        self.agent.script.clear();
        self.agent.unreadable = false;
        for _ in 0..4 {
            self.now = self.now.saturating_add(Millis(40_000));
            self.c.handle_timeout(self.now);
            self.drive()?;
        }
        for sid in SESSIONS {
            let session = s(sid);
            if !self.c.runs().scope_runs(&session).is_empty()
                || self.c.runs().scope_ambiguous(&session)
            {
                continue;
            }
            let entries: Vec<_> = self
                .c
                .entries(&session)
                .unwrap()
                .into_iter()
                .filter_map(|e| e.entry().cloned())
                .collect();
            let sending = entries.iter().any(|e| e.state.is_sending());
            let drainable = entries
                .iter()
                .any(|e| e.drainable() && e.session_message.is_none());
            prop_assert!(
                sending || !drainable,
                "{}: a drainable entry waits in an idle session: {:?}",
                sid,
                entries
            );
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fixtures::proptest_cases()))]

    // OB-03 to OB-15
    #[test]
    fn custody_keeps_its_promises(cmds in prop::collection::vec(cmd(), 1..60)) {
        let mut w = World::new();
        for c in cmds {
            w.run(c)?;
        }
        w.quiesce()?;
        w.check()?;
    }
}

// A regression pinned from the model: an uncertain send whose run ends keeps its
// history read, and a missing answer holds it instead of resending.
#[test]
fn an_uncertain_start_is_never_resent_by_itself() {
    let mut w = World::new();
    w.agent.then(AgentStep::lost_reply_but_recorded());
    w.agent.unreadable = true;
    w.run(Cmd::Submit {
        session: 0,
        n: 1,
        kind: 0,
    })
    .unwrap();
    w.run(Cmd::Restart).unwrap();
    w.run(Cmd::Advance(100_000)).unwrap();
    w.quiesce().unwrap();
    assert_eq!(w.agent.send_count(&opn(1)), 1);
}

// OB-14, pinned from the model: a run of `s1` goes stale while `s1::skills-agent` queues
// behind it; the reclaim runs at the next start in `s1` and must wake the alias too,
// whose queue waited on that run (it was left waiting with nothing to wake it).
#[test]
fn a_reclaim_at_a_start_wakes_the_aliases_that_waited_on_the_run() {
    let mut w = World::new();
    let cmds = [
        Cmd::Script(2),
        Cmd::Submit {
            session: 0,
            n: 5,
            kind: 3,
        },
        Cmd::Submit {
            session: 1,
            n: 1,
            kind: 0,
        },
        Cmd::Script(5),
        Cmd::Submit {
            session: 0,
            n: 0,
            kind: 0,
        },
        Cmd::RunEnded {
            session: 1,
            drop_untaken: false,
        },
        Cmd::Submit {
            session: 0,
            n: 1,
            kind: 0,
        },
        Cmd::Script(2),
        Cmd::Script(4),
        Cmd::StopAndSendNow { n: 0 },
        Cmd::Submit {
            session: 0,
            n: 0,
            kind: 0,
        },
        Cmd::Advance(19_476),
        Cmd::Submit {
            session: 1,
            n: 0,
            kind: 0,
        },
        Cmd::Submit {
            session: 1,
            n: 2,
            kind: 0,
        },
        Cmd::Advance(25_525),
        Cmd::Submit {
            session: 0,
            n: 0,
            kind: 2,
        },
    ];
    for c in cmds {
        w.run(c).unwrap();
    }
    assert_eq!(w.agent.send_count(&opn(2)), 1, "the alias's queue drained");
    w.quiesce().unwrap();
}
