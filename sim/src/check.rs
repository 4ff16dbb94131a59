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

//!
//! Every check here is a pure function over an `Observation` (what the world observed
//! at one moment) and returns what it found (`Finding`s, in the order it found them);
//! the world builds the observation, applies the findings and drives the world to rest.
//! The one memory a check keeps across steps, the ledger status each row was last seen
//! with, is `LedgerWatch`, owned by the world and handed in.

use std::collections::{BTreeMap, BTreeSet};

use outbox_core::entry::EntryState;
use outbox_core::ids::base_session;
use outbox_core::ledger::LedgerStatus;
use overlay_core::RowClass;
use timeline_core::order::OrderKey;
use timeline_core::rows::CardStatus;
use timeline_core::{Block, BlockKey, Millis, OperationId, Origin, SessionId};

use crate::client::Kind;
use crate::invariant::{Invariant, Known};
use crate::observed::Observation;
use crate::stores::overlay_digest;
use crate::trace::clip;

/// The longest a deadline may lie ahead (the longest timer of the system is the replay
/// buffer's 30-minute idle reclaim).
const FINITE: Millis = Millis(24 * 60 * 60 * 1000);

/// What a check found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Finding {
    /// An invariant does not hold.
    Violation(Invariant, String),
    /// A known issue showed.
    Known(Known, String),
    /// A line for the trace that explains what follows.
    Log(String),
}

/// The ledger status each row was last seen with, keyed (base session, operation).
#[derive(Clone, Debug, Default)]
pub(crate) struct LedgerWatch {
    seen: BTreeMap<(SessionId, OperationId), LedgerStatus>,
}

/// The invariants of every step, in their order; `rows` adds the rows against the
/// reducer's full rebuild (the costliest check). Also returns the operations whose
/// reopen the ledger check took (their marks are spent).
pub(crate) fn step(
    o: &Observation<'_>,
    watch: &mut LedgerWatch,
    rows: bool,
) -> (Vec<Finding>, Vec<OperationId>) {
    let mut found = messages(o);
    let (ledger_found, reopened) = ledger(o, watch);
    found.extend(ledger_found);
    if rows {
        found.extend(self::rows(o));
    }
    found.extend(live_rows(o));
    found.extend(echoes(o));
    found.extend(timers(o));
    found.extend(replaced(o));
    (found, reopened)
}

/// A message that left the agent's history (its turn rolled back by a replace latest, or
/// its thread gone) is not in that history again (a send of it again is caught as the
/// agent receives it).
pub(crate) fn replaced(o: &Observation<'_>) -> Vec<Finding> {
    let mut found = Vec::new();
    for s in o.agent.sessions() {
        let left: BTreeMap<&OperationId, crate::agent::Left> = s.left_ops().collect();
        if left.is_empty() {
            continue;
        }
        for b in s.transcript.blocks() {
            if let Some(why) = b.operation_id.as_ref().and_then(|op| left.get(op)) {
                found.push(Finding::Violation(
                    Invariant::ReplacedReappears,
                    format!(
                        "{} is in the history of {} again after it left it ({why:?})",
                        b.id, s.session
                    ),
                ));
            }
        }
    }
    found
}

/// At rest no client shows a row that left the agent's history (a rolled-back turn, a
/// gone thread), and the host's overlay keeps none: the clients converged to the history
/// after the rollback. A client showing such a row from history has not converged; one
/// showing it as a live row the host's saved overlay still keeps for its run is
/// [`Known::RolledBackRowsUnsettled`].
pub(crate) fn gone_rows(o: &Observation<'_>) -> Vec<Finding> {
    let mut found: Vec<(bool, String)> = Vec::new();
    let mut kept: BTreeMap<SessionId, BTreeSet<BlockKey>> = BTreeMap::new();
    for (session, gone) in o.gone_rows {
        for b in o
            .overlays
            .get(session)
            .into_iter()
            .flat_map(|ov| &ov.blocks)
        {
            let key = b.block.key();
            if !gone.contains(&key) {
                continue;
            }
            let unsettled = b.class == RowClass::Ordinary
                && b.run_id.is_some()
                && o.rewrites_lost.contains(session);
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
    for (c, client) in o.clients.iter().enumerate() {
        let Some(gone) = o.gone_rows.get(&client.session) else {
            continue;
        };
        for (origin, b) in &o.visible[c] {
            let key = b.key();
            if *origin == Origin::Pending || !gone.contains(&key) {
                continue;
            }
            let from_overlay = *origin == Origin::Live
                && kept.get(&client.session).is_some_and(|k| k.contains(&key));
            found.push((
                from_overlay,
                format!(
                    "client {c} ({}) shows {} ({origin:?}), a row that left the agent's history",
                    client.session, b.id
                ),
            ));
        }
    }
    found
        .into_iter()
        .map(|(known, s)| {
            if known {
                Finding::Known(Known::RolledBackRowsUnsettled, s)
            } else {
                Finding::Violation(Invariant::ReplacedReappears, s)
            }
        })
        .collect()
}

/// Every client's live rows are the rows the host saved at the (epoch, revision) the
/// client holds (OV-02, OV-07, TL-06): a client never shows a live state the host never
/// published, not even one the next snapshot would heal. The one transitional state: an
/// empty overlay at a version the host never saved, which is how the host answers for a
/// target that has no saved overlay.
pub(crate) fn live_rows(o: &Observation<'_>) -> Vec<Finding> {
    let mut found = Vec::new();
    for (c, client) in o.clients.iter().enumerate() {
        let t = &client.timeline;
        let (Some((epoch, revision)), Some(target)) = (t.overlay_version(), t.target()) else {
            continue;
        };
        let key = (client.session.clone(), target.clone(), epoch, revision);
        let broken = match o.saved_overlays.get(&key) {
            Some(d) if *d == overlay_digest(t.overlay_blocks()) => continue,
            // No overlay saved for the target: the host answers an empty one.
            None if t.overlay_blocks().next().is_none() => continue,
            Some(_) => format!(
                "client {c} holds rows at epoch {epoch} revision {revision} that differ \
from what the host saved there"
            ),
            None => format!(
                "client {c} holds epoch {epoch} revision {revision}, which the host never \
saved for {target}"
            ),
        };
        found.push(Finding::Violation(Invariant::LiveRowsUnsaved, broken));
    }
    found
}

/// Every message the host acknowledged is in the saved outbox, or the agent holds it,
/// or the user removed or replaced it (OB-03, OB-05).
pub(crate) fn messages(o: &Observation<'_>) -> Vec<Finding> {
    let mut found = Vec::new();
    for (op, m) in o.messages {
        if !m.acked || m.removed || m.replaced || o.outboxes.contains_key(op) {
            continue;
        }
        // Held, or delivered and then rolled back or left in a thread that is gone.
        if o.agent.sessions().any(|s| s.holds(op) || s.had(op)) {
            continue;
        }
        found.push(Finding::Violation(
            Invariant::MessageLost,
            format!("{op} was acknowledged, but neither the outbox nor the agent has it"),
        ));
    }
    found
}

/// A saved ledger row never moves to a weaker status, except the reopen of a canceled
/// row (OB-07, OB-12). Returns the operations whose reopen it took.
pub(crate) fn ledger(
    o: &Observation<'_>,
    watch: &mut LedgerWatch,
) -> (Vec<Finding>, Vec<OperationId>) {
    let mut found = Vec::new();
    let mut reopened_ops = Vec::new();
    for (op, m) in o.messages {
        let key = (base_session(&m.session), op.clone());
        let Some(record) = o.ledger.get(&key) else {
            continue;
        };
        let now = record.status;
        if let Some(before) = watch.seen.get(&key).copied() {
            // The reopen (OB-12): after the history said the message is not there, or
            // the agent itself said it did not take it (its acceptance is then revoked,
            // so no read is due), a canceled row goes back to failed, and a new attempt
            // may record sending. Checks between steps may see a sending row go to
            // canceled and back to failed (or sending) as one change.
            let marked = (o.missing_read.contains(op) || o.said_untaken.contains(op))
                && !reopened_ops.contains(op);
            let reopened = matches!(before, LedgerStatus::Canceled | LedgerStatus::Sending)
                && matches!(now, LedgerStatus::Failed | LedgerStatus::Sending)
                && marked;
            if now.strength() < before.strength() && reopened {
                reopened_ops.push(op.clone());
            } else if now.strength() < before.strength() {
                found.push(Finding::Violation(
                    Invariant::LedgerWeakened,
                    format!("the ledger of {op} went from {before:?} to {now:?}"),
                ));
            }
        }
        watch.seen.insert(key, now);
    }
    (found, reopened_ops)
}

/// Every client's rows are unique by key, in canonical order, and equal to the reducer's
/// full rebuild (TL-02, TL-04).
pub(crate) fn rows(o: &Observation<'_>) -> Vec<Finding> {
    let mut found = Vec::new();
    for (c, client) in o.clients.iter().enumerate() {
        let rows = &o.visible[c];
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
        if problem.is_none() && *rows != client.timeline.full_rebuild() {
            problem = Some("the rows differ from a full rebuild".to_owned());
        }
        if let Some(p) = problem {
            found.push(Finding::Violation(
                Invariant::RowsOutOfOrder,
                format!("client {c}: {p}"),
            ));
        }
    }
    found
}

/// A message a client sent shows on that client from the moment it is sent: as its echo
/// or as its row; only a page in the past or a window that moved past its row hides it,
/// and only the user's removal or edit ends it (TL-03).
pub(crate) fn echoes(o: &Observation<'_>) -> Vec<Finding> {
    let mut found = Vec::new();
    for (c, client) in o.clients.iter().enumerate() {
        let t = &client.timeline;
        if t.newer_cursor().is_some() {
            continue;
        }
        let mut oldest: Option<Option<OrderKey>> = None;
        for op in client.mine.keys() {
            let Some(m) = o.messages.get(op) else {
                continue;
            };
            // A message that left the agent's history (a rollback, a gone thread) leaves
            // the screen with it.
            if m.removed || m.replaced || o.agent.left(op) {
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
            let row = o.saved_row(&client.session, &key);
            let moved_past = match (oldest, row) {
                (Some(oldest), Some(row)) => row.order_key() < oldest,
                _ => false,
            };
            if !moved_past {
                found.push(Finding::Violation(
                    Invariant::EchoVanished,
                    format!("client {c} sent {op}, and it no longer shows"),
                ));
            }
        }
    }
    found
}

/// Every deadline a machine asks for lies within a day.
pub(crate) fn timers(o: &Observation<'_>) -> Vec<Finding> {
    let limit = o.now.saturating_add(FINITE);
    let mut bad = Vec::new();
    if let Some(d) = o.host_timeout {
        if d > limit {
            bad.push(format!("the host asks for {}", d.as_u64()));
        }
    }
    for (c, client) in o.clients.iter().enumerate() {
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
    bad.into_iter()
        .map(|b| {
            Finding::Violation(
                Invariant::TimerInfinite,
                format!("{b} at {}", o.now.as_u64()),
            )
        })
        .collect()
}

/// At rest every acknowledged message was delivered (the agent has it) or waits held in
/// the outbox with its reason; none is still queued to drain, sending or accepted.
pub(crate) fn delivered(o: &Observation<'_>) -> Vec<Finding> {
    let mut stuck = Vec::new();
    for (op, m) in o.messages {
        if !m.acked || m.removed || m.replaced {
            continue;
        }
        let delivered = o.agent.had(op);
        match o.outboxes.get(op) {
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
    let mut found = Vec::new();
    if !stuck.is_empty() {
        for (s, line) in &o.outbox_lines {
            let custody = o.host.map(|h| {
                let c = h.custody();
                (
                    c.runs().active(s).map(|r| r.run_id.clone()),
                    c.runs().cancellation_pending(s),
                    c.lane_busy(s),
                )
            });
            found.push(Finding::Log(format!("outbox of {s}: {line}")));
            found.push(Finding::Log(format!(
                "custody of {s}: (active run, cancelling, lanes busy) {custody:?}"
            )));
        }
    }
    found.extend(stuck.into_iter().map(|(i, d)| Finding::Violation(i, d)));
    found
}

/// The host's history of `session`'s main target: every saved row, and the rows of its
/// saved overlay.
fn reference(o: &Observation<'_>, session: &SessionId) -> (Vec<Block>, Vec<Block>) {
    let overlay = o
        .overlays
        .get(session)
        .map(|ov| ov.blocks.iter().map(|b| b.block.clone()).collect())
        .unwrap_or_default();
    (o.history(session), overlay)
}

/// The first difference between what client `c` shows and the host's history, if any,
/// with the trace lines that explain it.
pub(crate) fn view_difference(o: &Observation<'_>, c: usize) -> Option<(String, Vec<Finding>)> {
    let client = &o.clients[c];
    let session = &client.session;
    let (history, overlay) = reference(o, session);
    let shown: Vec<&(Origin, Block)> = o.visible[c]
        .iter()
        .filter(|(origin, _)| *origin != Origin::Pending)
        .collect();
    let oldest: Option<OrderKey> = shown
        .iter()
        .find(|(origin, _)| *origin == Origin::History)
        .map(|(_, b)| b.order_key());
    // From the oldest history row the client shows on: history over the overlay. Above
    // it: the overlay's rows, which a client shows whatever its window. A client whose
    // window holds no history (it was empty when it loaded) shows every row the host has,
    // from the overlay where it holds one.
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
    if got == expected {
        return None;
    }
    let names = |rows: &[&Block]| {
        rows.iter()
            .map(|b| format!("{}@{}", b.id, b.timestamp.as_u64()))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let origins: Vec<String> = shown
        .iter()
        .map(|(origin, b)| format!("{}:{origin:?}", b.id))
        .collect();
    let (g, e) = (names(&got), names(&expected));
    let host = o
        .overlays
        .get(session)
        .map(|ov| (ov.settlement_epoch, ov.revision));
    let held = client.timeline.overlay_version();
    let offered = client.offered;
    let logs = vec![
        Finding::Log(format!(
            "client {c} holds {held:?}, was offered {offered:?}, the host has {host:?}"
        )),
        Finding::Log(format!("client {c} shows   {}", origins.join(" "))),
        Finding::Log(format!("client {c} rows    {g}")),
        Finding::Log(format!("host history       {e}")),
    ];
    Some((diff(&got, &expected), logs))
}

/// Why client `c` may be behind, when the cause is a known issue: it shows rows from
/// history that left it (a rollback, a gone thread) and no one told it (host-core); or
/// its overlay is older than the host's, and it is a phone the relay never brought the
/// newest version to (overlay-core).
pub(crate) fn known_cause(o: &Observation<'_>, c: usize) -> Option<Known> {
    let client = &o.clients[c];
    let session = &client.session;
    if let Some(gone) = o
        .gone_rows
        .get(session)
        .filter(|_| o.rewrites_lost.contains(session))
    {
        let stale = client
            .timeline
            .rows()
            .any(|r| r.origin == Origin::History && gone.contains(&r.block.key()));
        if stale {
            return Some(Known::RollbackUnannounced);
        }
    }
    let host = o
        .overlays
        .get(session)
        .map_or((0, 0), |ov| (ov.settlement_epoch, ov.revision));
    let held = client.timeline.overlay_version()?;
    if held >= host {
        return None;
    }
    // A client that was offered the newer version must have taken it.
    let offered = client.offered.is_some_and(|v| v > held);
    (client.kind == Kind::Phone && client.relay_lost.is_some() && !offered)
        .then_some(Known::RelayLossUnrepaired)
}

/// Every approval card the host keeps shows the outcome the agent took (RW-06).
pub(crate) fn cards(o: &Observation<'_>) -> Vec<Finding> {
    let mut found = Vec::new();
    for session in o.sessions.iter().map(|s| &s.id) {
        for b in o
            .overlays
            .get(session)
            .into_iter()
            .flat_map(|ov| &ov.blocks)
        {
            let approval = &b.block.data["approval"];
            let Some(request_id) = approval["requestId"].as_str() else {
                continue;
            };
            let status: Option<CardStatus> =
                serde_json::from_value(approval["status"].clone()).ok();
            let agent = o.agent.session(session).and_then(|s| s.decided(request_id));
            let expected = CardStatus::of(agent);
            if status != Some(expected) {
                found.push(Finding::Violation(
                    Invariant::ApprovalCardStale,
                    format!("the card of {request_id} shows {status:?}, the agent took {agent:?}"),
                ));
            }
        }
    }
    found
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
