//! Running the checks: the world observes itself ([`Observation`]), hands that to the
//! pure checks of `check` and applies what they found; the defects a run may plant to
//! prove the checks catch them; and bringing the world to rest for the final checks.

use outbox_core::ids::base_session;
use outbox_core::ids::ScopeId;
use outbox_core::ledger::LedgerStatus;
use std::collections::{BTreeMap, BTreeSet};
use timeline_core::timeline::LoadState;
use timeline_core::{Block, BlockKey, Millis, OperationId, Origin, SessionId};

use super::World;
use crate::check::{self, Finding, LedgerWatch};
use crate::client::Kind;
use crate::invariant::Invariant;
use crate::observed::Observation;
use crate::stores::lock;
use crate::Defect;
use host_core::Host;

/// What the stores hold, read for one observation.
struct StoreReads {
    outboxes: BTreeMap<OperationId, outbox_core::entry::EntryState>,
    outbox_lines: Vec<(SessionId, String)>,
    ledger: BTreeMap<(SessionId, OperationId), outbox_core::ledger::LedgerRecord>,
    overlays: BTreeMap<SessionId, overlay_core::StoredOverlay>,
}

impl World {
    /// Runs `f` over what the world shows from outside now. `rows`: with each client's
    /// rows (the costliest part); `at_rest`: with the saved overlays and the outbox lines
    /// the checks at rest read.
    fn observed<T>(
        &mut self,
        rows: bool,
        at_rest: bool,
        f: impl FnOnce(&Observation<'_>, &mut LedgerWatch) -> T,
    ) -> T {
        let reads = self.read_stores(at_rest);
        let visible = if rows {
            (0..self.clients.len()).map(|c| self.visible(c)).collect()
        } else {
            Vec::new()
        };
        let saved = lock(&self.stores.saved);
        let o = Observation {
            now: self.now,
            host_timeout: self.host.as_ref().and_then(Host::poll_timeout),
            host: self.host.as_ref(),
            messages: &self.messages,
            clients: &self.clients,
            visible,
            agent: &self.agent,
            outboxes: reads.outboxes,
            outbox_lines: reads.outbox_lines,
            ledger: reads.ledger,
            saved_overlays: &saved,
            overlays: reads.overlays,
            sessions: &self.sessions,
            gone_rows: &self.gone_rows,
            rewrites_lost: &self.rewrites_lost,
            missing_read: &self.missing_read,
            said_untaken: &self.said_untaken,
        };
        f(&o, &mut self.ledger_watch)
    }

    /// Reads the saved outboxes and ledger rows (and, at rest, the overlays and the
    /// outbox lines) straight from the stores, past every fault.
    fn read_stores(&mut self, at_rest: bool) -> StoreReads {
        let sessions: Vec<SessionId> = self.sessions.iter().map(|s| s.id.clone()).collect();
        let mut outboxes = BTreeMap::new();
        for s in &sessions {
            if let Ok(entries) = self.stores.entries(s) {
                for e in entries.iter().filter_map(|e| e.entry()) {
                    outboxes.insert(e.operation_id.clone(), e.state.clone());
                }
            }
        }
        let mut ledger = BTreeMap::new();
        for (session, op) in self.message_ledger_keys() {
            if let Ok(Some(record)) = self.stores.ledger(&session, &op) {
                ledger.insert((session, op), record);
            }
        }
        let mut outbox_lines = Vec::new();
        let mut overlays = BTreeMap::new();
        if at_rest {
            for s in &sessions {
                let entries = self.stores.entries(s).unwrap_or_default();
                let line: Vec<String> = entries
                    .iter()
                    .filter_map(|e| e.entry())
                    .map(|e| format!("{}@{} {:?}", e.operation_id, e.position, e.state))
                    .collect();
                outbox_lines.push((s.clone(), line.join(" | ")));
            }
            let gone: Vec<SessionId> = self.gone_rows.keys().cloned().collect();
            for s in sessions.iter().chain(&gone) {
                let target = timeline_core::TargetId::main(s);
                if let Some(o) = self
                    .stores
                    .with_overlays(|st| st.load(s, &target))
                    .ok()
                    .flatten()
                {
                    overlays.insert(s.clone(), o);
                }
            }
        }
        StoreReads {
            outboxes,
            outbox_lines,
            ledger,
            overlays,
        }
    }

    /// A client's rows as the checks see them (a planted defect may spoil them).
    fn visible(&self, c: usize) -> Vec<(Origin, Block)> {
        let mut rows: Vec<(Origin, Block)> = self.clients[c]
            .timeline
            .rows()
            .map(|r| (r.origin, r.block.clone()))
            .collect();
        if self.defect(Defect::ShuffleRows) && rows.len() >= 2 {
            rows.swap(0, 1);
        }
        rows
    }

    /// Records what the checks found, in their order.
    fn apply(&mut self, found: Vec<Finding>) {
        for f in found {
            match f {
                Finding::Violation(invariant, detail) => self.violate(invariant, detail),
                Finding::Known(known, detail) => self.known_issue(known, detail),
                Finding::Log(line) => self.log(|| line),
            }
        }
    }

    /// The invariants of every step.
    pub(crate) fn check_step(&mut self) {
        if self.defect(Defect::ForgetEntry) {
            self.forget_an_entry();
        }
        if self.defect(Defect::WeakenLedger) {
            self.weaken_a_ledger();
        }
        // The rows against the reducer's full rebuild (the costliest check) every fourth
        // step and at quiescence.
        let rows = self.step.is_multiple_of(4) || self.settling;
        let (found, reopened) = self.observed(rows, false, |o, watch| check::step(o, watch, rows));
        // A reopen the ledger check saw spends the mark that allowed it.
        for op in reopened {
            self.missing_read.remove(&op);
            self.said_untaken.remove(&op);
        }
        self.apply(found);
    }

    /// The invariants at quiescence.
    pub(crate) fn check_final(&mut self) {
        self.forget_rows_back();
        self.check_step();
        let found = self.observed(false, true, |o, _| check::delivered(o));
        self.apply(found);
        self.check_views();
        let found = self.observed(true, true, |o, _| {
            let mut found = check::gone_rows(o);
            found.extend(check::cards(o));
            found
        });
        self.apply(found);
    }

    /// Every client shows exactly the host's history; a client behind for a known reason
    /// must heal when it reloads.
    fn check_views(&mut self) {
        let differ = self.observed(true, true, |o, _| {
            (0..o.clients.len())
                .filter_map(|c| {
                    let (detail, logs) = check::view_difference(o, c)?;
                    Some((c, detail, logs, check::known_cause(o, c)))
                })
                .collect::<Vec<_>>()
        });
        let mut healing = Vec::new();
        for (c, detail, logs, known) in differ {
            self.apply(logs);
            let session = self.clients[c].session.clone();
            let what = format!("client {c} ({session}) shows other rows than the host: {detail}");
            match known {
                Some(known) => {
                    self.known_issue(known, what);
                    healing.push(c);
                }
                None => self.violate(Invariant::ViewDiffers, what),
            }
        }
        if healing.is_empty() {
            return;
        }
        for c in &healing {
            let now = self.now;
            self.clients[*c].timeline.reload(now);
        }
        self.settle();
        let again = self.observed(true, true, |o, _| {
            healing
                .iter()
                .filter_map(|&c| check::view_difference(o, c).map(|(d, l)| (c, d, l)))
                .collect::<Vec<_>>()
        });
        for (c, detail, logs) in again {
            self.apply(logs);
            let session = self.clients[c].session.clone();
            self.violate(
                Invariant::ViewDiffers,
                format!(
                    "client {c} ({session}) differs from the host even after a reload: {detail}"
                ),
            );
        }
    }

    fn forget_an_entry(&mut self) {
        let acked: Vec<(SessionId, outbox_core::ids::QueueId)> = self
            .messages
            .values()
            .filter(|m| m.acked && !m.removed && !m.replaced)
            .map(|m| (m.session.clone(), m.queue.clone()))
            .collect();
        for (session, queue) in acked {
            let removed = self
                .stores
                .with_outbox(|s| s.remove_entry(&session, &queue));
            if let Ok(Some(e)) = removed {
                let op = e.operation_id.clone();
                if !self.agent.sessions().any(|s| s.holds(&op)) {
                    self.log(|| format!("DEFECT: the store forgets {op}"));
                    return;
                }
            }
        }
    }

    /// The ledger key of every message: its scope's base session and its operation.
    fn message_ledger_keys(&self) -> Vec<(SessionId, OperationId)> {
        self.messages
            .iter()
            .map(|(op, m)| (base_session(&m.session), op.clone()))
            .collect()
    }

    fn weaken_a_ledger(&mut self) {
        for (session, op) in self.message_ledger_keys() {
            let Ok(Some(mut record)) = self.stores.ledger(&session, &op) else {
                continue;
            };
            if record.status == LedgerStatus::Sent {
                record.status = LedgerStatus::Sending;
                let put = self
                    .stores
                    .with_outbox(|s| s.put_ledger(&ScopeId::of(&session), &op, &record));
                if put.is_ok() {
                    self.log(|| format!("DEFECT: the ledger of {op} is weakened"));
                }
                return;
            }
        }
    }

    /// Stops every fault and runs the world until nothing is pending: the agent
    /// finishes its turns, clients come back to the present (a page in the past scrolls
    /// down, a failed load is retried by the user, a phone without a connection joins
    /// again), and time passes through every deadline.
    pub(crate) fn settle(&mut self) {
        self.settling = true;
        self.faults.on = false;
        self.stores.heal();
        for s in &self.sessions {
            s.transcript.set_unreadable(false);
        }
        self.agent.calm = true;
        self.log(|| "QUIESCENCE: faults off".to_owned());
        for _ in 0..5_000 {
            let out = self.agent.finish(self.now);
            self.agent_out(out);
            let now = self.now;
            for c in 0..self.clients.len() {
                let client = &mut self.clients[c];
                // One load at a time, as a user scrolls.
                let idle = client.timeline.poll_timeout().is_none();
                if client.timeline.newer_cursor().is_some() && idle {
                    client.timeline.load_newer(now);
                }
                if matches!(
                    client.timeline.load_state(),
                    LoadState::Failed(_) | LoadState::ReloadFailed { .. }
                ) {
                    client.timeline.recover(now);
                }
                if client.kind == Kind::Phone && client.joined.is_none() {
                    self.connect_again(c);
                }
            }
            self.pump();
            if self.quiet() {
                return;
            }
            let next = self.next_time().unwrap_or(self.now);
            let until = next
                .max(self.now.saturating_add(Millis(1)))
                .min(self.now.saturating_add(Millis(600_000)));
            self.advance(until);
            if !self.violations.is_empty() {
                return;
            }
        }
        let states = self.load_states();
        self.violate(
            Invariant::NoQuiescence,
            format!(
                "still busy: {} in flight, agent busy {}, loads {states:?}, host deadline {:?}",
                self.net.len(),
                self.agent.busy(),
                self.host.as_ref().and_then(Host::poll_timeout)
            ),
        );
    }

    fn connect_again(&mut self, c: usize) {
        self.log(|| format!("p{c} connects again"));
        self.reconnect(c);
    }

    /// Nothing in flight, no turn running, no client waiting, and the host's next
    /// deadline (if any) far away.
    fn quiet(&self) -> bool {
        let far = self.now.saturating_add(Millis(600_000));
        self.net.is_empty()
            && !self.agent.busy()
            && self.clients.iter().all(|c| {
                c.timeline.poll_timeout().is_none()
                    && c.conversation.poll_timeout().is_none()
                    && c.timeline.newer_cursor().is_none()
            })
            && self
                .host
                .as_ref()
                .and_then(Host::poll_timeout)
                .is_none_or(|d| d > far)
            && !self.joining()
    }

    /// A row that left the agent's history and came back (the user sent its message
    /// again) is history's again.
    fn forget_rows_back(&mut self) {
        let sessions: Vec<SessionId> = self.gone_rows.keys().cloned().collect();
        for session in &sessions {
            let Some(agent) = self.agent.session(session) else {
                continue;
            };
            let back: BTreeSet<BlockKey> =
                agent.transcript.blocks().iter().map(|b| b.key()).collect();
            if let Some(gone) = self.gone_rows.get_mut(session) {
                gone.retain(|k| !back.contains(k));
            }
        }
    }
}
