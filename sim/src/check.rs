//! The invariants, checked after every step and at quiescence.
//!
//! After every step:
//!
//! - [`Invariant::MessageLost`]: a message the host acknowledged is in the saved outbox,
//!   or the agent holds it, or the user removed or replaced it (OB-03, OB-05).
//! - [`Invariant::SentTwice`]: the host sends a message to the agent again only after
//!   the agent said it did not take it (a refusal, a deferral, a cancel, a history read
//!   that found nothing, a confirmed take-back, an untaken steer); and the agent never
//!   receives a message it holds (OB-08, OB-09, OB-13). Checked as the host sends and
//!   as the agent receives.
//! - [`Invariant::LedgerWeakened`]: a saved ledger row never moves to a weaker status,
//!   except the reopen of a canceled row (OB-07, OB-12).
//! - [`Invariant::RowsOutOfOrder`]: every client's rows are unique by key, in canonical
//!   order, and equal to the reducer's full rebuild (TL-02, TL-04).
//! - [`Invariant::LiveRowsUnsaved`]: every client's live rows are exactly the rows the
//!   host saved at the (epoch, revision) the client holds: a patch applied on the wrong
//!   base, or a snapshot the host never saved, is caught at once, not healed later
//!   (OV-02, OV-07, TL-06).
//! - [`Invariant::EchoVanished`]: a message a client sent shows on that client from the
//!   moment it is sent: as its echo or as its row; only a page in the past or a window
//!   that moved past its row hides it, and only the user's removal or edit ends it
//!   (TL-03).
//! - [`Invariant::TimerInfinite`]: every deadline a machine asks for lies within a day,
//!   and after the host handled its deadlines the next one lies ahead.
//! - [`Invariant::ReplaySideEffect`] (as replays arrive): a join makes the host call no
//!   agent; a rebuild from a replay triggers no live-only effect (RB-04).
//! - [`Invariant::ApprovalTwice`] (as decisions arrive): the agent never gets a second
//!   decision for a request it took a decision for; at most one client is told its
//!   decision was taken (RW-06).
//! - [`Invariant::ReplyTwice`], [`Invariant::HostDefect`]: every request gets at most
//!   one reply, to someone who asked; the host reports no defect of its own.
//!
//! At quiescence (faults off, the agent finishing its turns, time run on until nothing
//! is pending):
//!
//! - [`Invariant::Stuck`]: every acknowledged message was delivered (the agent has it)
//!   or waits held in the outbox with its reason; none is still queued to drain, sending
//!   or accepted;
//! - [`Invariant::ViewDiffers`]: every client shows exactly the host's history: from its
//!   oldest history row on, the same rows (history over overlay), in the same order, with
//!   the same content; above it, the overlay's rows (pending echoes aside, which
//!   `EchoVanished` covers);
//! - [`Invariant::ApprovalCardStale`]: every approval card the host keeps shows the
//!   outcome the agent took (RW-06);
//! - [`Invariant::NoQuiescence`]: the world comes to rest at all.

use std::collections::{BTreeMap, BTreeSet};

use host_core::Host;
use outbox_core::entry::EntryState;
use outbox_core::ids::base_session;
use outbox_core::ledger::LedgerStatus;
use overlay_core::RowClass;
use timeline_core::order::OrderKey;
use timeline_core::rows::CardStatus;
use timeline_core::timeline::LoadState;
use timeline_core::{Block, BlockKey, Millis, OperationId, Origin, SessionId};

use crate::client::Kind;
pub use crate::invariant::{Invariant, Known, Violation};
use crate::stores::{lock, overlay_digest};
use crate::trace::clip;
use crate::world::World;
use crate::Defect;

/// The longest a deadline may lie ahead (the longest timer of the system is the replay
/// buffer's 30-minute idle reclaim).
const FINITE: Millis = Millis(24 * 60 * 60 * 1000);

impl World {
    /// The invariants of every step.
    pub(crate) fn check_step(&mut self) {
        if self.defect(Defect::ForgetEntry) {
            self.forget_an_entry();
        }
        if self.defect(Defect::WeakenLedger) {
            self.weaken_a_ledger();
        }
        self.check_messages();
        self.check_ledger();
        // The rows against the reducer's full rebuild (the costliest check) every
        // fourth step and at quiescence.
        if self.step.is_multiple_of(4) || self.settling {
            self.check_rows();
        }
        self.check_live_rows();
        self.check_echoes();
        self.check_timers();
        self.check_replaced();
    }

    /// A message that left the agent's history (its turn rolled back by a replace
    /// latest, or its thread gone) is not in that history again (a send of it again is
    /// caught as the agent receives it).
    fn check_replaced(&mut self) {
        let mut back = Vec::new();
        for s in self.agent.sessions() {
            let left: BTreeMap<&OperationId, crate::agent::Left> = s.left_ops().collect();
            if left.is_empty() {
                continue;
            }
            for b in s.transcript.blocks() {
                if let Some(why) = b.operation_id.as_ref().and_then(|o| left.get(o)) {
                    back.push(format!(
                        "{} is in the history of {} again after it left it ({why:?})",
                        b.id, s.session
                    ));
                }
            }
        }
        for b in back {
            self.violate(Invariant::ReplacedReappears, b);
        }
    }

    /// At quiescence no client shows a row that left the agent's history (a rolled-back
    /// turn, a gone thread), and the host's overlay keeps none: the clients converged
    /// to the history after the rollback. A client showing such a row from history has
    /// not converged; one showing it as a live row the host's saved overlay still keeps
    /// for its run is [`Known::RolledBackRowsUnsettled`].
    fn check_gone_rows(&mut self) {
        let mut found: Vec<(bool, String)> = Vec::new();
        let mut kept: BTreeMap<SessionId, BTreeSet<BlockKey>> = BTreeMap::new();
        let sessions: Vec<SessionId> = self.gone_rows.keys().cloned().collect();
        for session in sessions {
            let target = timeline_core::TargetId::main(&session);
            let overlay = self
                .stores
                .with_overlays(|s| s.load(&session, &target))
                .ok()
                .flatten();
            let Some(gone) = self.gone_rows.get(&session) else {
                continue;
            };
            for b in overlay.into_iter().flat_map(|o| o.blocks) {
                let key = b.block.key();
                if !gone.contains(&key) {
                    continue;
                }
                let unsettled = b.class == RowClass::Ordinary
                    && b.run_id.is_some()
                    && self.rewrites_lost.contains(&session);
                found.push((
                    unsettled,
                    format!(
                        "the host's overlay of {session} keeps {} (run {:?}), a row that left the agent's history",
                        b.block.id, b.run_id
                    ),
                ));
                if unsettled {
                    kept.entry(session.clone()).or_default().insert(key);
                }
            }
        }
        for (c, client) in self.clients.iter().enumerate() {
            let Some(gone) = self.gone_rows.get(&client.session) else {
                continue;
            };
            for (o, b) in self.visible(c) {
                let key = b.key();
                if o == Origin::Pending || !gone.contains(&key) {
                    continue;
                }
                let from_overlay = o == Origin::Live
                    && kept.get(&client.session).is_some_and(|k| k.contains(&key));
                found.push((
                    from_overlay,
                    format!(
                        "client {c} ({}) shows {} ({o:?}), a row that left the agent's history",
                        client.session, b.id
                    ),
                ));
            }
        }
        for (known, s) in found {
            if known {
                self.known_issue(Known::RolledBackRowsUnsettled, s);
            } else {
                self.violate(Invariant::ReplacedReappears, s);
            }
        }
    }

    /// Every client's live rows are the rows the host saved at the (epoch, revision) the
    /// client holds (OV-02, OV-07, TL-06): a client never shows a live state the host never
    /// published, not even one the next snapshot would heal. The one transitional state:
    /// an empty overlay at a version the host never saved, which is how the host answers
    /// for a target that has no saved overlay.
    fn check_live_rows(&mut self) {
        let mut broken = Vec::new();
        {
            let saved = lock(&self.stores.saved);
            for (c, client) in self.clients.iter().enumerate() {
                let t = &client.timeline;
                let (Some((epoch, revision)), Some(target)) = (t.overlay_version(), t.target())
                else {
                    continue;
                };
                let key = (client.session.clone(), target.clone(), epoch, revision);
                match saved.get(&key) {
                    Some(d) if *d == overlay_digest(t.overlay_blocks()) => {}
                    // No overlay saved for the target: the host answers an empty one.
                    None if t.overlay_blocks().next().is_none() => {}
                    Some(_) => broken.push(format!(
                        "client {c} holds rows at epoch {epoch} revision {revision} that differ \
from what the host saved there"
                    )),
                    None => broken.push(format!(
                        "client {c} holds epoch {epoch} revision {revision}, which the host never \
saved for {target}"
                    )),
                }
            }
        }
        for b in broken {
            self.violate(Invariant::LiveRowsUnsaved, b);
        }
    }

    /// The saved outbox of every session: operation → state.
    fn outboxes(&mut self) -> BTreeMap<OperationId, EntryState> {
        let mut out = BTreeMap::new();
        let sessions: Vec<SessionId> = self.sessions.iter().map(|s| s.id.clone()).collect();
        for s in sessions {
            if let Ok(entries) = self.stores.entries(&s) {
                for e in entries.iter().filter_map(|e| e.entry()) {
                    out.insert(e.operation_id.clone(), e.state.clone());
                }
            }
        }
        out
    }

    fn check_messages(&mut self) {
        let saved = self.outboxes();
        let mut lost = Vec::new();
        for (op, m) in &self.messages {
            if !m.acked || m.removed || m.replaced || saved.contains_key(op) {
                continue;
            }
            // Held, or delivered and then rolled back or left in a thread that is gone.
            if self.agent.sessions().any(|s| s.holds(op) || s.had(op)) {
                continue;
            }
            lost.push(op.clone());
        }
        for op in lost {
            self.violate(
                Invariant::MessageLost,
                format!("{op} was acknowledged, but neither the outbox nor the agent has it"),
            );
        }
    }

    fn check_ledger(&mut self) {
        let ops: Vec<(SessionId, OperationId)> = self
            .messages
            .iter()
            .map(|(op, m)| (base_session(&m.session), op.clone()))
            .collect();
        for (session, op) in ops {
            let Ok(Some(record)) = self.stores.ledger(&session, &op) else {
                continue;
            };
            let key = (session, op);
            let now = record.status;
            if let Some(before) = self.ledger_seen.get(&key).copied() {
                // The reopen (OB-12): after the history said the message is not there,
                // or the agent itself said it did not take it (its acceptance is then
                // revoked, so no read is due), a canceled row goes back to failed, and a
                // new attempt may record sending. Checks between steps may see a sending
                // row go to canceled and back to failed (or sending) as one change.
                let reopened = matches!(before, LedgerStatus::Canceled | LedgerStatus::Sending)
                    && matches!(now, LedgerStatus::Failed | LedgerStatus::Sending)
                    && (self.missing_read.contains(&key.1) || self.said_untaken.contains(&key.1));
                if now.strength() < before.strength() && reopened {
                    self.missing_read.remove(&key.1);
                    self.said_untaken.remove(&key.1);
                } else if now.strength() < before.strength() {
                    self.violate(
                        Invariant::LedgerWeakened,
                        format!("the ledger of {} went from {before:?} to {now:?}", key.1),
                    );
                }
            }
            self.ledger_seen.insert(key, now);
        }
    }

    /// A client's rows as the checks see them (a defect may spoil them).
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

    fn check_rows(&mut self) {
        for c in 0..self.clients.len() {
            let rows = self.visible(c);
            let mut keys = BTreeSet::new();
            let mut problem = None;
            for (i, (_, b)) in rows.iter().enumerate() {
                if !keys.insert(b.key()) {
                    problem = Some(format!("row {} shows twice", b.id));
                    break;
                }
                if i > 0 && rows[i - 1].1.order_key() >= b.order_key() {
                    problem = Some(format!(
                        "row {} is placed before {}",
                        rows[i - 1].1.id,
                        b.id
                    ));
                    break;
                }
            }
            if problem.is_none() && rows != self.clients[c].timeline.full_rebuild() {
                problem = Some("the rows differ from a full rebuild".to_owned());
            }
            if let Some(p) = problem {
                self.violate(Invariant::RowsOutOfOrder, format!("client {c}: {p}"));
            }
        }
    }

    fn check_echoes(&mut self) {
        let mut vanished = Vec::new();
        for (c, client) in self.clients.iter().enumerate() {
            let t = &client.timeline;
            if t.newer_cursor().is_some() {
                continue;
            }
            let mut oldest: Option<Option<OrderKey>> = None;
            for op in client.mine.keys() {
                let Some(m) = self.messages.get(op) else {
                    continue;
                };
                // A message that left the agent's history (a rollback, a gone thread)
                // leaves the screen with it.
                if m.removed || m.replaced || self.agent_left(op) {
                    continue;
                }
                let key = BlockKey::user_message(op);
                if t.row(&key).is_some() {
                    continue;
                }
                // A window that moved past the row hides it: paging reaches it.
                let oldest = oldest
                    .get_or_insert_with(|| {
                        t.rows()
                            .find(|r| r.origin == Origin::History)
                            .map(|r| r.block.order_key())
                    })
                    .clone();
                let row = saved_row(self, &client.session, &key);
                let moved_past = match (oldest, row) {
                    (Some(oldest), Some(row)) => row.order_key() < oldest,
                    _ => false,
                };
                if !moved_past {
                    vanished.push((c, op.clone()));
                }
            }
        }
        for (c, op) in vanished {
            self.violate(
                Invariant::EchoVanished,
                format!("client {c} sent {op}, and it no longer shows"),
            );
        }
    }

    fn check_timers(&mut self) {
        let limit = self.now.saturating_add(FINITE);
        let mut bad = Vec::new();
        if let Some(d) = self.host.as_ref().and_then(Host::poll_timeout) {
            if d > limit {
                bad.push(format!("the host asks for {}", d.as_u64()));
            }
        }
        for (c, client) in self.clients.iter().enumerate() {
            for d in [
                client.timeline.poll_timeout(),
                client.conversation.poll_timeout(),
            ]
            .into_iter()
            .flatten()
            {
                if d > limit {
                    bad.push(format!("client {c} asks for {}", d.as_u64()));
                }
            }
        }
        for b in bad {
            self.violate(
                Invariant::TimerInfinite,
                format!("{b} at {}", self.now.as_u64()),
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

    fn weaken_a_ledger(&mut self) {
        let ops: Vec<(SessionId, OperationId)> = self
            .messages
            .iter()
            .map(|(op, m)| (base_session(&m.session), op.clone()))
            .collect();
        for (session, op) in ops {
            let Ok(Some(mut record)) = self.stores.ledger(&session, &op) else {
                continue;
            };
            if record.status == LedgerStatus::Sent {
                record.status = LedgerStatus::Sending;
                let put = self
                    .stores
                    .with_outbox(|s| s.put_ledger(&session, &op, &record));
                if put.is_ok() {
                    self.log(|| format!("DEFECT: the ledger of {op} is weakened"));
                }
                return;
            }
        }
    }

    // ----- quiescence -----------------------------------------------------------------

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

    /// The invariants at quiescence.
    pub(crate) fn check_final(&mut self) {
        self.forget_rows_back();
        self.check_step();
        self.check_delivered();
        self.check_views();
        self.check_gone_rows();
        self.check_cards();
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

    /// Every acknowledged message delivered or held with a reason.
    fn check_delivered(&mut self) {
        let saved = self.outboxes();
        let mut stuck = Vec::new();
        for (op, m) in &self.messages {
            if !m.acked || m.removed || m.replaced {
                continue;
            }
            let delivered = self.agent_saved(op);
            match saved.get(op) {
                None if delivered => {}
                None => stuck.push((Invariant::MessageLost, format!("{op} is gone undelivered"))),
                Some(EntryState::Held { notice, .. }) if !notice.is_empty() => {}
                Some(state @ EntryState::Held { .. }) => stuck.push((
                    Invariant::Stuck,
                    format!("{op} is held with no reason: {state:?}"),
                )),
                Some(state) if delivered => stuck.push((
                    Invariant::Stuck,
                    format!("{op} was delivered but the outbox still holds it: {state:?}"),
                )),
                Some(state) => stuck.push((
                    Invariant::Stuck,
                    format!("{op} is neither delivered nor held with a reason: {state:?}"),
                )),
            }
        }
        if !stuck.is_empty() {
            let sessions: Vec<SessionId> = self.sessions.iter().map(|s| s.id.clone()).collect();
            for s in sessions {
                let entries = self.stores.entries(&s).unwrap_or_default();
                let line: Vec<String> = entries
                    .iter()
                    .filter_map(|e| e.entry())
                    .map(|e| format!("{}@{} {:?}", e.operation_id, e.position, e.state))
                    .collect();
                let custody = self.host.as_ref().map(|h| {
                    let c = h.custody();
                    (
                        c.runs().active(&s).map(|r| r.run_id.clone()),
                        c.runs().cancellation_pending(&s),
                        c.lane_busy(&s),
                    )
                });
                self.log(|| format!("outbox of {s}: {}", line.join(" | ")));
                self.log(|| {
                    format!("custody of {s}: (active run, cancelling, lanes busy) {custody:?}")
                });
            }
        }
        for (i, d) in stuck {
            self.violate(i, d);
        }
    }

    /// The host's history of `session`'s main target: every saved row, and the rows of
    /// its saved overlay.
    fn reference(&mut self, session: &SessionId) -> (Vec<Block>, Vec<Block>) {
        let history = self
            .sessions
            .iter()
            .find(|s| &s.id == session)
            .map(|s| s.transcript.blocks())
            .unwrap_or_default();
        let target = timeline_core::TargetId::main(session);
        let overlay = self
            .stores
            .with_overlays(|s| s.load(session, &target))
            .ok()
            .flatten()
            .map(|o| o.blocks.into_iter().map(|b| b.block).collect())
            .unwrap_or_default();
        (history, overlay)
    }

    /// The first difference between what client `c` shows and the host's history, if
    /// any.
    fn view_difference(&mut self, c: usize) -> Option<String> {
        let session = self.clients[c].session.clone();
        let (history, overlay) = self.reference(&session);
        let shown: Vec<(Origin, Block)> = self
            .visible(c)
            .into_iter()
            .filter(|(o, _)| *o != Origin::Pending)
            .collect();
        let oldest: Option<OrderKey> = shown
            .iter()
            .find(|(o, _)| *o == Origin::History)
            .map(|(_, b)| b.order_key());
        // From the oldest history row the client shows on: history over the overlay.
        // Above it: the overlay's rows, which a client shows whatever its window. A
        // client whose window holds no history (it was empty when it loaded) shows every
        // row the host has, from the overlay where it holds one.
        let mut rows: BTreeMap<BlockKey, Block> = BTreeMap::new();
        match &oldest {
            Some(oldest) => {
                let saved: BTreeSet<BlockKey> = history.iter().map(Block::key).collect();
                for b in history.iter().filter(|b| b.order_key() >= *oldest) {
                    rows.insert(b.key(), b.clone());
                }
                for b in &overlay {
                    let k = b.key();
                    let in_window = b.order_key() >= *oldest;
                    if !(in_window && saved.contains(&k)) {
                        rows.entry(k).or_insert_with(|| b.clone());
                    }
                }
            }
            None => {
                for b in overlay.iter().chain(history.iter()) {
                    rows.entry(b.key()).or_insert_with(|| b.clone());
                }
            }
        }
        let mut reference: Vec<Block> = rows.into_values().collect();
        reference.sort_by_cached_key(Block::order_key);
        let expected: Vec<&Block> = reference.iter().collect();
        let got: Vec<&Block> = shown.iter().map(|(_, b)| b).collect();
        if got != expected {
            let names = |rows: &[&Block]| {
                rows.iter()
                    .map(|b| format!("{}@{}", b.id, b.timestamp.as_u64()))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            let origins: Vec<String> = shown
                .iter()
                .map(|(o, b)| format!("{}:{o:?}", b.id))
                .collect();
            let (g, e) = (names(&got), names(&expected));
            let target = timeline_core::TargetId::main(&session);
            let host = self
                .stores
                .with_overlays(|s| s.load(&session, &target))
                .ok()
                .flatten()
                .map(|o| (o.settlement_epoch, o.revision));
            let held = self.clients[c].timeline.overlay_version();
            let offered = self.clients[c].offered;
            self.log(|| {
                format!("client {c} holds {held:?}, was offered {offered:?}, the host has {host:?}")
            });
            self.log(|| format!("client {c} shows   {}", origins.join(" ")));
            self.log(|| format!("client {c} rows    {g}"));
            self.log(|| format!("host history       {e}"));
            return Some(diff(&got, &expected));
        }
        None
    }

    /// Why client `c` may be behind, when the cause is a known issue: it shows rows
    /// from history that left it (a rollback, a gone thread) and no one told it
    /// (host-core); or its overlay is older than the host's, and it is a phone the relay
    /// never brought the newest version to (overlay-core).
    fn known_cause(&mut self, c: usize) -> Option<Known> {
        let session = self.clients[c].session.clone();
        if let Some(gone) = self
            .gone_rows
            .get(&session)
            .filter(|_| self.rewrites_lost.contains(&session))
        {
            let stale = self.clients[c]
                .timeline
                .rows()
                .any(|r| r.origin == Origin::History && gone.contains(&r.block.key()));
            if stale {
                return Some(Known::RollbackUnannounced);
            }
        }
        let target = timeline_core::TargetId::main(&session);
        let host = self
            .stores
            .with_overlays(|s| s.load(&session, &target))
            .ok()
            .flatten()
            .map_or((0, 0), |o| (o.settlement_epoch, o.revision));
        let client = &self.clients[c];
        let held = client.timeline.overlay_version()?;
        if held >= host {
            return None;
        }
        // A client that was offered the newer version must have taken it.
        let offered = client.offered.is_some_and(|o| o > held);
        (client.kind == Kind::Phone && client.relay_lost.is_some() && !offered)
            .then_some(Known::RelayLossUnrepaired)
    }

    fn check_views(&mut self) {
        let mut healing = Vec::new();
        for c in 0..self.clients.len() {
            let Some(detail) = self.view_difference(c) else {
                continue;
            };
            let session = self.clients[c].session.clone();
            let what = format!("client {c} ({session}) shows other rows than the host: {detail}");
            match self.known_cause(c) {
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
        // A client behind for a known reason must heal when it reloads.
        for c in &healing {
            let now = self.now;
            self.clients[*c].timeline.reload(now);
        }
        self.settle();
        for c in healing {
            if let Some(detail) = self.view_difference(c) {
                let session = self.clients[c].session.clone();
                self.violate(
                    Invariant::ViewDiffers,
                    format!("client {c} ({session}) differs from the host even after a reload: {detail}"),
                );
            }
        }
    }

    fn check_cards(&mut self) {
        let sessions: Vec<SessionId> = self.sessions.iter().map(|s| s.id.clone()).collect();
        for session in sessions {
            let target = timeline_core::TargetId::main(&session);
            let overlay = self
                .stores
                .with_overlays(|s| s.load(&session, &target))
                .ok()
                .flatten();
            let mut stale = Vec::new();
            for b in overlay.into_iter().flat_map(|o| o.blocks) {
                let approval = &b.block.data["approval"];
                let Some(request_id) = approval["requestId"].as_str() else {
                    continue;
                };
                let status: Option<CardStatus> =
                    serde_json::from_value(approval["status"].clone()).ok();
                let agent = self
                    .agent
                    .session(&session)
                    .and_then(|s| s.decided(request_id));
                let expected = CardStatus::of(agent);
                if status != Some(expected) {
                    stale.push((
                        request_id.to_owned(),
                        format!(
                            "the card of {request_id} shows {status:?}, the agent took {agent:?}"
                        ),
                    ));
                }
            }
            for (_, s) in stale {
                self.violate(Invariant::ApprovalCardStale, s);
            }
        }
    }
}

/// The saved row with `key` in `session`'s transcript.
fn saved_row(w: &World, session: &SessionId, key: &BlockKey) -> Option<Block> {
    let s = w.sessions.iter().find(|s| &s.id == session)?;
    s.transcript.blocks().into_iter().find(|b| &b.key() == key)
}

/// The first difference between two row lists, in words.
fn diff(got: &[&Block], expected: &[&Block]) -> String {
    let name = |b: &Block| format!("{}:{}", b.block_type.as_str(), b.id);
    for i in 0..got.len().max(expected.len()) {
        match (got.get(i), expected.get(i)) {
            (Some(g), Some(e)) if g == e => continue,
            (Some(g), Some(e)) if g.key() == e.key() => {
                return format!(
                    "row {i} {} differs: shows {} / host {}",
                    name(g),
                    clip(&serde_json::to_string(g).unwrap_or_default(), 300),
                    clip(&serde_json::to_string(e).unwrap_or_default(), 300)
                )
            }
            (Some(g), Some(e)) => {
                return format!("row {i}: shows {} where the host has {}", name(g), name(e))
            }
            (Some(g), None) => return format!("row {i}: shows {} the host does not have", name(g)),
            (None, Some(e)) => return format!("row {i}: misses {}", name(e)),
            (None, None) => break,
        }
    }
    "no difference".to_owned()
}
