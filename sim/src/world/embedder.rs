//! The embedder's loop: the host's life (boot, crash) and what the world does with
//! each of its effects, as an embedding does: agent calls travel to the agent, live
//! deliveries and replies to the clients (`clients`), notices to the trace; the agent's
//! answers and stream events come back as inputs.

use crate::agent::{AgentEvent, Out};
use crate::client::{Echo, Kind};
use crate::faults::FaultKind;
use crate::invariant::{Invariant, Known};
use crate::net::{Event, AGENT_STREAM};
use crate::trace::clip;
use crate::Defect;
use host_core::{AgentCall, AgentInput, Host, HostConfig, HostEffect, Notice};
use outbox_core::adapter::{HistoryRead, SendResult, StopResult, TakeBackResult};
use outbox_core::adapter::{ReadHistoryRequest, TakeBackRequest};
use outbox_core::{Capabilities, SessionInfo};
use std::collections::BTreeSet;
use timeline_core::{HostKey, Millis, OperationId};

use super::{call_line, canonical, input_line, millis, World, HOST_KEY};

impl World {
    /// Starts a host over the stores (the first one, or the one after a crash).
    pub(crate) fn boot(&mut self) -> Result<(), String> {
        let (outbox, overlays) = self.stores.open()?;
        let mut uuids = self.rng.fork();
        let uuids = Box::new(move || {
            let (a, b) = (uuids.next_u64(), uuids.next_u64());
            format!(
                "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
                a >> 32,
                (a >> 16) & 0xffff,
                a & 0xfff,
                b >> 52,
                b & 0xffff_ffff_ffff
            )
        });
        let mut host = Host::new(
            outbox,
            overlays,
            HostConfig::new(HostKey::from_bytes(HOST_KEY), uuids),
        );
        for s in &self.sessions {
            let caps = if s.codex {
                Capabilities::codex()
            } else {
                Capabilities::claude()
            };
            host.add_session(
                &s.id,
                SessionInfo::new(caps),
                Box::new(s.transcript.clone()),
            );
        }
        self.incarnation += 1;
        // Starting again after a failed start is safe; the embedder retries, and heals
        // the store after a few tries as an operator would.
        let mut tries = 0;
        loop {
            match host.start(self.now) {
                Ok(()) => break,
                Err(e) => {
                    tries += 1;
                    let now = self.now;
                    self.log(|| format!("host start failed ({e}); retrying at {}", now.as_u64()));
                    self.now = self.now.saturating_add(millis(1_000));
                    if tries >= 3 {
                        self.stores.heal();
                    }
                    if tries > 6 {
                        return Err(format!("the host could not start: {e}"));
                    }
                }
            }
        }
        self.host = Some(host);
        let incarnation = self.incarnation;
        self.log(|| format!("host {incarnation} started"));
        Ok(())
    }

    /// The host dies and a new one starts from the stores. Every connection to it is
    /// new: windows subscribe again, phones join again, and every client reloads.
    pub(crate) fn crash(&mut self) {
        self.counts.add(FaultKind::HostCrash);
        self.log(|| "HOST CRASH".to_owned());
        self.stats.restarts += 1;
        // The last effects of the dying host are lost with it, and so are the relay's
        // connections to it.
        self.host = None;
        self.relay_joins.clear();
        // A refused announcement of lost history waiting for its retry dies with the
        // host (see `Known::RolledBackRowsUnsettled`).
        let lost = std::mem::take(&mut self.rewrites_failed);
        self.rewrites_lost.extend(lost);
        if let Err(e) = self.boot() {
            self.violate(Invariant::HostDefect, format!("restart failed: {e}"));
            return;
        }
        // What the new host does at start (confirming sends, draining queues).
        self.pump();
        let out = self.agent.reconnected();
        let n = out.len();
        self.log(|| format!("the agent reconnects: {n} message(s) again"));
        self.agent_out(out);
        for c in 0..self.clients.len() {
            if self.clients[c].kind == Kind::Phone {
                self.clients[c].joined = None;
            }
            self.connect(c);
            self.clients[c].timeline.reload(self.now);
        }
    }

    /// Step 2 of the loop: carries out every effect of the host and of the clients.
    pub(crate) fn pump(&mut self) {
        loop {
            let mut progressed = false;
            let effects: Vec<HostEffect> =
                std::iter::from_fn(|| self.host.as_mut().and_then(Host::poll_effect)).collect();
            for effect in canonical(effects) {
                progressed = true;
                self.host_effect(effect);
            }
            for c in 0..self.clients.len() {
                while let Some(effect) = self.clients[c].timeline.poll_effect() {
                    progressed = true;
                    self.client_effect(c, effect);
                }
            }
            if !progressed {
                break;
            }
        }
    }

    pub(crate) fn host_effect(&mut self, effect: HostEffect) {
        match effect {
            HostEffect::Agent(call) => {
                self.note_call(&call);
                let line = call_line(&call);
                self.log(|| format!("host → agent {line}"));
                let delay = self.rng.range(1, 20);
                let at = self.now.saturating_add(millis(delay));
                if let (AgentCall::Send(_), true) = (&call, self.defect(Defect::DuplicateSend)) {
                    let event = Event::ToAgent {
                        call: call.clone(),
                        incarnation: self.incarnation,
                    };
                    self.net.send(at, event);
                }
                if let (AgentCall::ResolveApproval { .. }, true) =
                    (&call, self.defect(Defect::DuplicateDecision))
                {
                    let event = Event::ToAgent {
                        call: call.clone(),
                        incarnation: self.incarnation,
                    };
                    self.net.send(at, event);
                }
                let incarnation = self.incarnation;
                self.net.send(at, Event::ToAgent { call, incarnation });
            }
            HostEffect::Deliver(delivery) => self.route_delivery(delivery),
            HostEffect::Reply { to, reply } => {
                let n = self.replies.entry(to.0).or_default();
                *n += 1;
                if *n > 1 {
                    self.violate(
                        Invariant::ReplyTwice,
                        format!("request #{} answered twice", to.0),
                    );
                }
                self.note_reply(to, &reply);
                let phone = self
                    .requests
                    .get(&to.0)
                    .is_some_and(|r| self.clients[r.client].kind == Kind::Phone);
                if phone && self.strike(FaultKind::ReplyLost) {
                    self.log(|| format!("reply to #{} lost", to.0));
                    return;
                }
                let delay = if self.strike(FaultKind::RequestLate) {
                    self.rng.range(1_000, 120_000)
                } else {
                    self.rng.range(1, 40)
                };
                self.net.send(
                    self.now.saturating_add(millis(delay)),
                    Event::Reply {
                        to,
                        reply,
                        incarnation: self.incarnation,
                    },
                );
            }
            HostEffect::Notice(notice) => {
                let line = format!("{notice:?}");
                self.log(|| format!("notice {}", clip(&line, 200)));
                match notice {
                    Notice::ReplayRefused { .. }
                    | Notice::RelayRefused { .. }
                    | Notice::Unknown(_) => {
                        self.violate(
                            Invariant::HostDefect,
                            format!("the host reports a defect: {line}"),
                        );
                    }
                    // A refused announcement of lost history survives a restart in the
                    // cleanup journal; one whose journal row was refused too does not.
                    Notice::JournalFailed {
                        session: Some(session),
                        run: Some(run),
                        ..
                    } if run.as_str() == host_core::REWRITE_JOURNAL_RUN => {
                        self.rewrites_failed.insert(session);
                    }
                    _ => {}
                }
            }
            other => {
                let line = format!("{other:?}");
                self.log(|| format!("unknown effect {}", clip(&line, 200)));
            }
        }
    }

    /// Records what the checks need of an agent call.
    pub(crate) fn note_call(&mut self, call: &AgentCall) {
        match call {
            AgentCall::Send(req) => {
                let op = &req.operation_id;
                self.stats.rollback_sends += u64::from(req.rollback_before_send);
                self.stats.fresh_sends += u64::from(req.fresh_thread);
                self.attempts.insert(req.attempt.0, op.clone());
                // The user's "send now" of a message that left the agent's history (a
                // rolled-back turn, a gone thread) sends it again, as the user chose.
                if self.user_asked.contains(op)
                    && self.agent.sessions().any(|s| s.left(op).is_some())
                {
                    self.user_resends.insert(op.clone());
                }
                self.user_asked.remove(op);
                if self.sent.contains(op) && !self.resend_ok.remove(op) {
                    let text = format!(
                        "the host sent {op} again (attempt {}) though the agent never said it did not take it",
                        req.attempt
                    );
                    if self.zombies.contains(op) {
                        self.known_issue(Known::PendingInputMissing, text);
                    } else {
                        self.violate(Invariant::SentTwice, text);
                    }
                }
                self.sent.insert(op.clone());
            }
            AgentCall::ReadHistory(ReadHistoryRequest {
                attempt,
                operation_id,
                ..
            })
            | AgentCall::TakeBack(TakeBackRequest {
                attempt,
                operation_id,
                ..
            }) => {
                self.attempts.insert(attempt.0, operation_id.clone());
            }
            _ => {}
        }
    }

    /// Records what the checks need of an agent input as the host takes it: the
    /// operations the agent said it does not have.
    pub(crate) fn note_input(&mut self, input: &AgentInput) {
        let not_taken: Vec<OperationId> = match input {
            AgentInput::SendResult {
                attempt,
                result:
                    SendResult::ProvenUnadmitted { .. }
                    | SendResult::Deferred { .. }
                    | SendResult::Canceled
                    | SendResult::ThreadGone,
            } => self.attempts.get(&attempt.0).cloned().into_iter().collect(),
            AgentInput::HistoryRead {
                attempt,
                read: HistoryRead::Missing,
            } => {
                let op: Vec<OperationId> =
                    self.attempts.get(&attempt.0).cloned().into_iter().collect();
                self.missing_read.extend(op.iter().cloned());
                // The user's send after a hold, of a message whose turn was rolled back
                // or whose thread is gone: history does not hold it, so it goes, as the
                // user chose.
                for o in &op {
                    if self.user_asked.contains(o)
                        && self.agent.sessions().any(|s| s.left(o).is_some())
                    {
                        self.user_resends.insert(o.clone());
                    }
                }
                for o in &op {
                    // History holds no pending input: the turn has the message, the
                    // read says it is missing.
                    if self.agent_holds(o) && !self.agent.had(o) {
                        self.zombies.insert(o.clone());
                    }
                }
                op
            }
            AgentInput::HistoryRead {
                attempt,
                read: HistoryRead::Unreadable,
            } => {
                // The user's send after an unconfirmed hold goes even so, once.
                let op = self.attempts.get(&attempt.0).cloned();
                match op {
                    Some(o) if self.user_asked.contains(&o) => {
                        // Held by the agent, or left its history (a rollback, a gone
                        // thread): the user sends it again either way.
                        if self.agent_holds(&o) || self.agent.sessions().any(|s| s.had(&o)) {
                            self.user_resends.insert(o.clone());
                        }
                        self.resend_ok.insert(o);
                    }
                    _ => {}
                }
                Vec::new()
            }
            AgentInput::TakeBack {
                attempt,
                result: TakeBackResult::DetachedForReplay | TakeBackResult::AlreadyDetachedForReplay,
            } => self.attempts.get(&attempt.0).cloned().into_iter().collect(),
            AgentInput::StopResult {
                result: StopResult::Stopped { untaken },
                ..
            } => untaken.clone(),
            AgentInput::RunEnded { untaken, .. } => untaken.clone(),
            _ => Vec::new(),
        };
        let agent_said = !matches!(input, AgentInput::HistoryRead { .. });
        for op in not_taken {
            if agent_said {
                self.said_untaken.insert(op.clone());
            }
            if !self.agent_holds(&op) {
                self.resend_ok.insert(op);
            }
        }
    }

    pub(crate) fn agent_holds(&self, op: &OperationId) -> bool {
        self.agent.sessions().any(|s| s.holds(op))
    }

    /// Records what the agent did that the checks need: the rows that left its history
    /// (a rollback, a thread that is gone), and the counts.
    pub(crate) fn agent_events(&mut self) {
        for e in std::mem::take(&mut self.agent.events) {
            match e {
                AgentEvent::RolledBack {
                    session,
                    op,
                    ops,
                    rows,
                } => {
                    self.stats.rollbacks += 1;
                    self.log(|| {
                        format!(
                            "  the agent rolls back the latest turn of {session} for {op}: {} row(s), messages {ops:?}",
                            rows.len()
                        )
                    });
                    self.gone_rows.entry(session).or_default().extend(rows);
                }
                AgentEvent::RollbackAgain { session, op } => {
                    self.stats.rollbacks_again += 1;
                    self.violate(
                        Invariant::RolledBackTwice,
                        format!(
                            "{op} asks {session} to roll back again after its rollback was done"
                        ),
                    );
                }
                AgentEvent::ThreadGone { session } => {
                    self.stats.threads_gone += 1;
                    self.log(|| format!("  the thread of {session} is gone"));
                }
                AgentEvent::FreshThread {
                    session,
                    thread,
                    ops,
                    rows,
                } => {
                    self.log(|| {
                        format!(
                            "  {session} goes on in a fresh thread {thread}: {} row(s) of the old one left, messages {ops:?}",
                            rows.len()
                        )
                    });
                    self.gone_rows.entry(session).or_default().extend(rows);
                }
            }
        }
    }

    /// Schedules what the agent said.
    pub(crate) fn agent_out(&mut self, out: Vec<Out>) {
        let mut floor: Option<Millis> = None;
        // Reports first: the answer they come with (first in `out`) waits for them.
        let (reports, out): (Vec<Out>, Vec<Out>) =
            out.into_iter().partition(|o| matches!(o, Out::Report(_)));
        for o in reports.into_iter().chain(out) {
            if let (Out::Stream(AgentInput::ApprovalResolved { .. }), true) =
                (&o, self.defect(Defect::SilentResolution))
            {
                continue;
            }
            match o {
                // The adapter says it after what the agent streamed before and before
                // the answer it comes with.
                Out::Report(input) => {
                    let at = self
                        .net
                        .send_ordered(AGENT_STREAM, self.now, Event::FromAgent(input));
                    floor = floor.max(Some(at));
                }
                Out::Stream(input) => {
                    let delay = self.rng.range(1, 30);
                    let at = self.now.saturating_add(millis(delay));
                    self.net
                        .send_ordered(AGENT_STREAM, at, Event::FromAgent(input));
                }
                Out::Answer(input) => {
                    if self.strike(FaultKind::AgentReplyLost) {
                        let line = input_line(&input);
                        // The adapter waits 30 s for an answer. A send then reports
                        // the admission uncertain (custody's own 31 s deadline
                        // covers a lost one) and a proof is simply gone; a history
                        // read, a stop and a take-back end with the adapter's
                        // time-out answer.
                        let timed_out = match input {
                            AgentInput::HistoryRead { attempt, .. } => {
                                Some(AgentInput::HistoryRead {
                                    attempt,
                                    read: HistoryRead::Unreadable,
                                })
                            }
                            AgentInput::StopResult { attempt, .. } => {
                                Some(AgentInput::StopResult {
                                    attempt,
                                    result: StopResult::Failed {
                                        error: "the agent did not answer the stop".into(),
                                    },
                                })
                            }
                            AgentInput::TakeBack { attempt, .. } => Some(AgentInput::TakeBack {
                                attempt,
                                result: TakeBackResult::NotDetached {
                                    reason: "the agent did not answer".into(),
                                },
                            }),
                            _ => None,
                        };
                        self.log(|| format!("agent answer lost: {line}"));
                        if let Some(answer) = timed_out {
                            let at = self.now.saturating_add(millis(30_000));
                            self.net.send(at, Event::FromAgent(answer));
                        }
                        continue;
                    }
                    let copies = if self.strike(FaultKind::AgentReplyDuplicated) {
                        2
                    } else {
                        1
                    };
                    for _ in 0..copies {
                        let delay = if self.strike(FaultKind::AgentReplyLate) {
                            self.rng.range(25_000, 90_000)
                        } else {
                            self.rng.range(1, 50)
                        };
                        let at = self.now.saturating_add(millis(delay));
                        self.net.send(
                            floor.map_or(at, |f| at.max(f.saturating_add(Millis(1)))),
                            Event::FromAgent(input.clone()),
                        );
                    }
                    if self.old_answers.len() < 64 {
                        self.old_answers.push(input);
                    } else {
                        let i = self.rng.index(64);
                        self.old_answers[i] = input;
                    }
                }
            }
        }
    }

    /// The clients learn what the outbox did with their messages (the embedder shows
    /// the queue): a message the agent has and the outbox let go is delivered; one the
    /// user removed or replaced elsewhere leaves its echo.
    pub(crate) fn sync_outbox(&mut self) {
        for c in 0..self.clients.len() {
            if !self.rng.chance(0.3) || self.clients[c].mine.is_empty() {
                continue;
            }
            let session = self.clients[c].session.clone();
            let Ok(entries) = self.stores.entries(&session) else {
                continue;
            };
            let queued: BTreeSet<OperationId> = entries
                .iter()
                .filter_map(|e| e.entry().map(|e| e.operation_id.clone()))
                .collect();
            let ops: Vec<OperationId> = self.clients[c].mine.keys().cloned().collect();
            for op in ops {
                let Some(m) = self.messages.get(&op) else {
                    continue;
                };
                // A message that left the agent's history leaves the screen with it.
                let gone = m.removed || m.replaced || self.agent.left(&op);
                let delivered = !queued.contains(&op) && self.agent.had(&op);
                let client = &mut self.clients[c];
                if gone {
                    client.timeline.remove_pending(&op);
                    client.mine.remove(&op);
                } else if delivered {
                    if let Some(mine) = client.mine.get_mut(&op) {
                        if mine.echo != Echo::Delivered {
                            mine.echo = Echo::Delivered;
                            client.timeline.mark_delivered(&op);
                        }
                    }
                }
            }
        }
    }
}
