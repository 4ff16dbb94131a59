//! Approvals decided once, on any device (RW-06).
//!
//! An approval request from either agent is kept by its full identity (request, thread,
//! turn and item IDs: `run.chatResolveApproval` carries no session ID). The first allowed
//! decision from any client goes to the agent; while the agent takes it, and after, a
//! decision from another device is answered [`ApprovalError::AlreadyResolved`]. The
//! agent's answer decides the card: the decided card replaces the pending one in place
//! (same ID), and replays stamp the request with its outcome. A decision the agent did not
//! take leaves the card pending, so any device may decide again.
//!
//! A decision is saved before it goes to the agent: the pending card is written again
//! with the decision on its way (`approval.decision`, [`DECISION_FIELD`]). A host that
//! restarts while a decision is on its way finds it on the kept card, refuses other
//! devices as before, and sends the same decision to the agent again: an agent that took
//! it already keeps what it took (one decision, delivered at least once), and one that
//! never got it takes it now. Without the saved decision the new host would show the
//! request pending and a second device could decide it a second time.
//!
//! An agent's request lives in its turn. When the host sees a run end, the run's cards
//! still pending expire (`resolvedExternally`, shown as expired); so does a pending card
//! kept across a restart whose run the run registry no longer holds as active (its turn
//! ended while no host was there, and the agent's own word on it died with the host),
//! and a decision the agent refuses after the run ended.
//!
//! [`Approvals`] is a machine of its own: each call says what happened (an agent asks,
//! a client decides, a card was saved or not, the agent answers, a run ended, kept cards
//! were read) and what the host must do comes out of [`Approvals::poll_effect`] as an
//! [`ApprovalEffect`] (save and send a card, send a decision to the agent, answer a
//! client, stamp the replay). The host drains the effects right after each call, so they
//! keep their order among the host's own. It reads no store: the host reads the kept
//! cards of the targets [`Approvals::unread`] names and gives them with
//! [`Approvals::cards_read`].

use std::collections::{BTreeSet, HashMap, VecDeque};

use overlay_core::replay::EventKind;
use overlay_core::store::{RowClass, StoredBlock};
use timeline_core::block::Block;
use timeline_core::key::{BlockKey, BlockType, RunId, SessionId, TargetId};
use timeline_core::rows::{approval_card, ActivityRow, ApprovalRequest, ApprovalResult};
use timeline_core::rows::{CardStatus, Decision};
use timeline_core::time::Millis;

use crate::io::{ApprovalError, Reply, ReplyTo};

/// Decided requests remembered (to answer late decisions from other devices); the
/// oldest decided one is forgotten past this.
pub const DECIDED_KEPT: usize = 4096;

/// The field of a saved pending card that holds the decision on its way to the agent
/// (under `approval`, beside `status`): absent on a card nobody decided yet.
pub const DECISION_FIELD: &str = "decision";

/// A request's identity: its request, thread, turn and item IDs, compared in that order.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ApprovalId {
    request: String,
    thread: String,
    turn: String,
    item: String,
}

impl ApprovalId {
    /// The identity a client's decision or the agent's resolution names.
    pub(crate) fn new(request: String, thread: String, turn: String, item: String) -> Self {
        ApprovalId {
            request,
            thread,
            turn,
            item,
        }
    }

    fn of(r: &ApprovalRequest) -> Self {
        ApprovalId::new(
            r.request_id.clone(),
            r.thread_id.clone(),
            r.turn_id.clone(),
            r.item_id.clone(),
        )
    }
}

/// What the host does for an approval, in the order the effects come out.
#[derive(Debug)]
pub(crate) enum ApprovalEffect {
    /// A new request: its event goes into the session's replay.
    Replay {
        session: SessionId,
        kind: EventKind,
        event: serde_json::Value,
    },
    /// Save the card, then send it; a refused write is tried again (a `decided` card
    /// only over its pending one).
    PublishCard {
        session: SessionId,
        target: TargetId,
        row: StoredBlock,
        decided: bool,
    },
    /// Save the card with a decision on its way, then say whether it was saved with
    /// [`Approvals::decision_saved`]: only a saved decision goes to the agent.
    SaveDecision {
        id: ApprovalId,
        session: SessionId,
        target: TargetId,
        row: StoredBlock,
    },
    /// Send a decision to the agent of `session`.
    SendDecision {
        session: SessionId,
        request: ApprovalRequest,
        decision: Decision,
    },
    /// Answer the client that decided.
    Reply { to: ReplyTo, reply: Reply },
    /// Stamp the request's replay event with its outcome.
    Stamp {
        session: SessionId,
        request_id: String,
        allowed: bool,
    },
    /// A card that could not be made (its row does not serialise).
    Failed(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    Pending,
    /// A decision is on its way to the agent; `by` is the client to answer (none when
    /// the decision was found on a kept card after a restart).
    Deciding {
        by: Option<ReplyTo>,
        decision: Decision,
    },
    /// A decision found on its way on a kept card, not sent again yet.
    Kept(Decision),
    /// Expired by the host, not by the agent: its run ended, or the agent refused a
    /// decision after it. Shown as expired; an answer of the agent's that took a
    /// decision (one on its way when the run ended) still replaces it.
    Lapsed,
    Decided(ApprovalResult),
}

#[derive(Clone, Debug)]
struct Open {
    session: SessionId,
    target: TargetId,
    run: Option<RunId>,
    request: ApprovalRequest,
    summary: String,
    asked_at: Millis,
    state: State,
}

/// Every approval request the host knows, and what it must do for them.
#[derive(Debug, Default)]
pub(crate) struct Approvals {
    open: HashMap<ApprovalId, Open>,
    decided: VecDeque<ApprovalId>,
    /// Targets whose cards kept from before a restart are not known yet (the overlay
    /// store could not read them).
    unread: BTreeSet<(SessionId, TargetId)>,
    /// Resolutions for requests not known while some kept cards were unread, applied
    /// once cards are read (at most [`DECIDED_KEPT`], the oldest dropped).
    late: VecDeque<(ApprovalId, Result<ApprovalResult, String>)>,
    effects: VecDeque<ApprovalEffect>,
}

impl Approvals {
    /// The next thing the host must do.
    pub(crate) fn poll_effect(&mut self) -> Option<ApprovalEffect> {
        self.effects.pop_front()
    }

    /// The agent asks: its event goes into the replay and its pending card is saved and
    /// sent. A request known already changes nothing (an agent that asks twice).
    pub(crate) fn asked(
        &mut self,
        session: &SessionId,
        target: &TargetId,
        run: Option<RunId>,
        request: ApprovalRequest,
        summary: String,
        now: Millis,
    ) {
        let id = ApprovalId::of(&request);
        if self.open.contains_key(&id) {
            return;
        }
        let open = Open {
            session: session.clone(),
            target: target.clone(),
            run,
            request,
            summary,
            asked_at: now,
            state: State::Pending,
        };
        let row = match card_row(&open, None) {
            Ok(row) => row,
            Err(e) => {
                self.effects.push_back(ApprovalEffect::Failed(e));
                return;
            }
        };
        let event = serde_json::json!({
            "type": "approval_request",
            "requestId": open.request.request_id,
            "threadId": open.request.thread_id,
            "turnId": open.request.turn_id,
            "itemId": open.request.item_id,
            "kind": open.request.kind,
            "allowed": open.request.allowed,
        });
        let kind = EventKind::Approval {
            request_id: open.request.request_id.clone(),
        };
        self.effects.push_back(ApprovalEffect::Replay {
            session: session.clone(),
            kind,
            event,
        });
        self.effects.push_back(ApprovalEffect::PublishCard {
            session: session.clone(),
            target: target.clone(),
            row,
            decided: false,
        });
        self.open.insert(id, open);
    }

    /// Every target of the host has cards kept from before a restart, unread yet.
    pub(crate) fn read_again(&mut self, targets: BTreeSet<(SessionId, TargetId)>) {
        self.unread = targets;
    }

    /// The targets whose kept cards the host must read and give to
    /// [`Approvals::cards_read`].
    pub(crate) fn unread(&self) -> Vec<(SessionId, TargetId)> {
        self.unread.iter().cloned().collect()
    }

    /// True when the host should read the unread cards before it gives a resolution for
    /// `id`: the request is not known, and may be on a card not read yet.
    pub(crate) fn wants_cards_for(&self, id: &ApprovalId) -> bool {
        !self.open.contains_key(id) && !self.unread.is_empty()
    }

    /// The kept rows of one target, read: its cards are known again; a pending card
    /// whose run is not `active` expired while no host was there (see the module docs),
    /// and a decision found on its way goes to the agent again (one decision, delivered
    /// at least once).
    pub(crate) fn cards_read<'a>(
        &mut self,
        session: &SessionId,
        target: &TargetId,
        rows: impl IntoIterator<Item = &'a StoredBlock>,
        active: Option<&RunId>,
    ) {
        for row in rows {
            self.restore(session, target, row);
        }
        for id in self.orphans(session, active) {
            self.lapse(&id);
        }
        for (session, request, decision) in self.resend() {
            self.effects.push_back(ApprovalEffect::SendDecision {
                session,
                request,
                decision,
            });
        }
        self.unread.remove(&(session.clone(), target.clone()));
    }

    /// The resolutions that waited for cards to be read; the host gives each again with
    /// [`Approvals::resolved`] once it read some.
    pub(crate) fn take_late(&mut self) -> VecDeque<(ApprovalId, Result<ApprovalResult, String>)> {
        std::mem::take(&mut self.late)
    }

    /// The pending requests of a run that ended expire: the agent can no longer take a
    /// decision on them, and its own word on it may have died with a host.
    pub(crate) fn run_ended(&mut self, session: &SessionId, run: &RunId) {
        for id in self.ended(session, run) {
            self.lapse(&id);
        }
    }

    /// Knows again a card the overlay store kept across a restart, so the agent's
    /// resolution (or a late decision) finds it: a pending card opens its request again,
    /// a decided one answers later decisions as already resolved. The card's subtitle
    /// stands for the summary it was made from. Returns false for any other row.
    fn restore(&mut self, session: &SessionId, target: &TargetId, row: &StoredBlock) -> bool {
        if row.class != RowClass::ApprovalCard {
            return false;
        }
        let Ok(activity) = serde_json::from_value::<ActivityRow>(row.block.data.clone()) else {
            return false;
        };
        let Some(card) = activity.approval else {
            return false;
        };
        let id = ApprovalId::of(&card.request);
        if self.open.contains_key(&id) {
            return false;
        }
        let on_its_way = row
            .block
            .data
            .get("approval")
            .and_then(|a| a.get(DECISION_FIELD))
            .and_then(|d| serde_json::from_value::<Decision>(d.clone()).ok());
        let state = match (card.status, card.result) {
            (CardStatus::Pending, _) => match on_its_way {
                Some(decision) => State::Kept(decision),
                None => State::Pending,
            },
            // An expired card may be one a host inferred (its run ended): the agent's
            // word on what it took still replaces it.
            (CardStatus::Expired, _) | (_, Some(ApprovalResult::ResolvedExternally)) => {
                State::Lapsed
            }
            (_, Some(result)) => State::Decided(result),
            _ => return false,
        };
        let decided = matches!(state, State::Decided(_) | State::Lapsed);
        self.open.insert(
            id.clone(),
            Open {
                session: session.clone(),
                target: target.clone(),
                run: row.run_id.clone(),
                request: card.request,
                summary: activity.subtitle.unwrap_or_default(),
                asked_at: row.block.timestamp,
                state,
            },
        );
        if decided {
            self.decided.push_back(id);
            if self.decided.len() > DECIDED_KEPT {
                if let Some(old) = self.decided.pop_front() {
                    self.open.remove(&old);
                }
            }
        }
        true
    }

    /// The decisions found on their way on kept cards (see [`Approvals::restore`]) that
    /// were not sent again yet: each goes to the agent once more.
    fn resend(&mut self) -> Vec<(SessionId, ApprovalRequest, Decision)> {
        let mut out: Vec<_> = self
            .open
            .values_mut()
            .filter_map(|o| match o.state {
                State::Kept(decision) => {
                    o.state = State::Deciding { by: None, decision };
                    Some((o.session.clone(), o.request.clone(), decision))
                }
                _ => None,
            })
            .collect();
        out.sort_by_key(|a| a.1.card_id());
        out
    }

    /// The requests of `run` still pending in `session`: their run ended, so the agent
    /// can take no decision on them any more. Each is then resolved as
    /// [`ApprovalResult::ResolvedExternally`] (it shows as expired), which the agent's
    /// own answer may have said already and a restart lost.
    fn ended(&self, session: &SessionId, run: &RunId) -> Vec<ApprovalId> {
        let mut out: Vec<ApprovalId> = self
            .open
            .iter()
            .filter(|(_, o)| {
                &o.session == session && o.state == State::Pending && o.run.as_ref() == Some(run)
            })
            .map(|(id, _)| id.clone())
            .collect();
        out.sort();
        out
    }

    /// The requests of `session` still pending with a run other than `active`: after a
    /// restart, a kept card whose run the registry no longer holds as active belongs to
    /// a turn that ended while no host was there (an agent's request lives in its turn),
    /// so it expired. A decision found on its way is sent again instead (the agent may
    /// have taken it before the run ended); the agent's refusal then expires it.
    fn orphans(&self, session: &SessionId, active: Option<&RunId>) -> Vec<ApprovalId> {
        let mut out: Vec<ApprovalId> = self
            .open
            .iter()
            .filter(|(_, o)| {
                &o.session == session
                    && o.state == State::Pending
                    && o.run.is_some()
                    && o.run.as_ref() != active
            })
            .map(|(id, _)| id.clone())
            .collect();
        out.sort();
        out
    }

    /// A client decides: the card is saved with the decision on its way
    /// ([`ApprovalEffect::SaveDecision`]), or the client is answered why not.
    pub(crate) fn decide(&mut self, id: ApprovalId, decision: Decision, by: ReplyTo) {
        let effect = match self.deciding(&id, decision, by) {
            Ok((session, target, row)) => ApprovalEffect::SaveDecision {
                id,
                session,
                target,
                row,
            },
            Err(e) => ApprovalEffect::Reply {
                to: by,
                reply: Reply::Approval(Err(e)),
            },
        };
        self.effects.push_back(effect);
    }

    fn deciding(
        &mut self,
        id: &ApprovalId,
        decision: Decision,
        by: ReplyTo,
    ) -> Result<(SessionId, TargetId, StoredBlock), ApprovalError> {
        let open = self.open.get_mut(id).ok_or(ApprovalError::Unknown)?;
        match open.state {
            State::Pending => {}
            State::Deciding { .. } | State::Kept(_) => {
                return Err(ApprovalError::AlreadyResolved { result: None })
            }
            State::Lapsed => {
                return Err(ApprovalError::AlreadyResolved {
                    result: Some(ApprovalResult::ResolvedExternally),
                })
            }
            State::Decided(result) => {
                return Err(ApprovalError::AlreadyResolved {
                    result: Some(result),
                })
            }
        }
        open.request
            .decide(decision)
            .map_err(|e| ApprovalError::NotAllowed(e.0))?;
        open.state = State::Deciding {
            by: Some(by),
            decision,
        };
        let mut row = card_row(open, None).map_err(ApprovalError::Unsaved)?;
        if let Some(card) = row.block.data.get_mut("approval") {
            card[DECISION_FIELD] = serde_json::json!(decision);
        }
        Ok((open.session.clone(), open.target.clone(), row))
    }

    /// The card of [`ApprovalEffect::SaveDecision`] was saved (the decision goes to the
    /// agent), or not: then the decision is not sent, the deciding client is told, and
    /// the request is open again for any device.
    pub(crate) fn decision_saved(&mut self, id: &ApprovalId, saved: bool) {
        let Some(open) = self.open.get_mut(id) else {
            return;
        };
        let State::Deciding { by, decision } = open.state else {
            return;
        };
        if saved {
            self.effects.push_back(ApprovalEffect::SendDecision {
                session: open.session.clone(),
                request: open.request.clone(),
                decision,
            });
        } else {
            open.state = State::Pending;
            if let Some(to) = by {
                self.effects.push_back(ApprovalEffect::Reply {
                    to,
                    reply: Reply::Approval(Err(ApprovalError::Unsaved(
                        "the overlay store refused the card".to_owned(),
                    ))),
                });
            }
        }
    }

    /// The agent resolved a request, or did not take a decision (`Err`). A refusal
    /// after the request's run ended (`run_over` says which runs did) expires it, unless
    /// the agent says otherwise later. A resolution for a request not known while kept
    /// cards are unread waits for them (see [`Approvals::take_late`]).
    pub(crate) fn resolved(
        &mut self,
        id: ApprovalId,
        result: Result<ApprovalResult, String>,
        run_over: impl Fn(&SessionId, &RunId) -> bool,
    ) {
        if self.wants_cards_for(&id) {
            if self.late.len() >= DECIDED_KEPT {
                self.late.pop_front();
            }
            self.late.push_back((id, result));
            return;
        }
        let result = match result {
            Err(text) => match self.open.get(&id) {
                Some(Open {
                    session,
                    run: Some(run),
                    ..
                }) if run_over(session, run) => {
                    self.settle(&id, Ok(ApprovalResult::ResolvedExternally), true);
                    return;
                }
                _ => Err(text),
            },
            ok => ok,
        };
        self.settle(&id, result, false);
    }

    /// The host expires a request itself: its run ended, so the agent can no longer
    /// take a decision on it (an answer of the agent's that says otherwise still wins).
    fn lapse(&mut self, id: &ApprovalId) {
        self.settle(id, Ok(ApprovalResult::ResolvedExternally), true);
    }

    fn settle(&mut self, id: &ApprovalId, result: Result<ApprovalResult, String>, lapsed: bool) {
        if let Err(e) = self.settled(id, result, lapsed) {
            self.effects.push_back(ApprovalEffect::Failed(e));
        }
    }

    /// The agent answered (or the request was settled elsewhere). With `lapsed`, the
    /// host itself expires the request (`result` is then `resolvedExternally`): it
    /// shows as expired until an answer of the agent's says what it took. The effects
    /// come out in the order stamp, reply, card.
    fn settled(
        &mut self,
        id: &ApprovalId,
        result: Result<ApprovalResult, String>,
        lapsed: bool,
    ) -> Result<(), String> {
        let mut out = Resolved::default();
        let Some(open) = self.open.get_mut(id) else {
            return Ok(());
        };
        let was_lapsed = open.state == State::Lapsed;
        let by = match (&open.state, &result) {
            (State::Deciding { by, .. }, _) => *by,
            (State::Pending | State::Kept(_), _) => None,
            // The agent took a decision the host had given up on.
            (State::Lapsed, Ok(r)) if !lapsed && *r != ApprovalResult::ResolvedExternally => None,
            // The first result the agent took stays; a repeated answer changes nothing.
            (State::Decided(_) | State::Lapsed, _) => return Ok(()),
        };
        match result {
            Err(text) => {
                // The saved card loses the decision it showed on its way.
                if open.state != State::Pending {
                    out.row = Some((
                        open.session.clone(),
                        open.target.clone(),
                        card_row(open, None)?,
                    ));
                }
                open.state = State::Pending;
                out.reply = by.map(|to| (to, Reply::Approval(Err(ApprovalError::Refused(text)))));
            }
            Ok(result) => {
                open.state = if lapsed {
                    State::Lapsed
                } else {
                    State::Decided(result)
                };
                out.reply = by.map(|to| {
                    let answer = if result == ApprovalResult::ResolvedExternally {
                        Err(ApprovalError::AlreadyResolved {
                            result: Some(result),
                        })
                    } else {
                        Ok(result)
                    };
                    (to, Reply::Approval(answer))
                });
                out.row = Some((
                    open.session.clone(),
                    open.target.clone(),
                    card_row(open, Some(result))?,
                ));
                let allowed = matches!(
                    result,
                    ApprovalResult::Accepted
                        | ApprovalResult::AcceptedForSession
                        | ApprovalResult::AcceptedBroadly
                );
                out.stamp = Some((
                    open.session.clone(),
                    open.request.request_id.clone(),
                    allowed,
                ));
                if !was_lapsed {
                    self.decided.push_back(id.clone());
                }
                if self.decided.len() > DECIDED_KEPT {
                    if let Some(old) = self.decided.pop_front() {
                        self.open.remove(&old);
                    }
                }
            }
        }
        let Resolved { reply, row, stamp } = out;
        if let Some((session, request_id, allowed)) = stamp {
            self.effects.push_back(ApprovalEffect::Stamp {
                session,
                request_id,
                allowed,
            });
        }
        if let Some((to, reply)) = reply {
            self.effects.push_back(ApprovalEffect::Reply { to, reply });
        }
        if let Some((session, target, row)) = row {
            self.effects.push_back(ApprovalEffect::PublishCard {
                session,
                target,
                row,
                decided: true,
            });
        }
        Ok(())
    }
}

/// What one answer of the agent's settles, before it goes out as effects.
#[derive(Debug, Default)]
struct Resolved {
    reply: Option<(ReplyTo, Reply)>,
    row: Option<(SessionId, TargetId, StoredBlock)>,
    stamp: Option<(SessionId, String, bool)>,
}

/// The card row: an ephemeral activity row whose ID is the card ID, at the time the
/// request was asked, so the decided card replaces the pending one in place.
fn card_row(open: &Open, result: Option<ApprovalResult>) -> Result<StoredBlock, String> {
    let data = serde_json::to_value(approval_card(&open.request, &open.summary, result))
        .map_err(|e| format!("approval card {}: {e}", open.request.card_id()))?;
    let key = BlockKey::parse(BlockType::Activity, &open.request.card_id())
        .map_err(|e| format!("approval card {}: {e}", open.request.card_id()))?;
    Ok(StoredBlock {
        block: Block::new(key, open.asked_at).with_data(data),
        class: RowClass::ApprovalCard,
        run_id: open.run.clone(),
    })
}

#[cfg(test)]
mod tests {
    use timeline_core::rows::ApprovalKind;

    use super::*;

    fn session() -> SessionId {
        SessionId::new("s").unwrap()
    }

    fn request(id: &str) -> ApprovalRequest {
        ApprovalRequest {
            request_id: id.to_owned(),
            thread_id: "thread".to_owned(),
            turn_id: "turn".to_owned(),
            item_id: "item".to_owned(),
            kind: ApprovalKind::CommandExecution,
            allowed: vec![Decision::Accept, Decision::Decline],
        }
    }

    fn id(request_id: &str) -> ApprovalId {
        ApprovalId::of(&request(request_id))
    }

    fn drain(a: &mut Approvals) -> Vec<ApprovalEffect> {
        std::iter::from_fn(|| a.poll_effect()).collect()
    }

    fn asked(a: &mut Approvals, run: &RunId, request_id: &str) {
        let s = session();
        let t = TargetId::main(&s);
        a.asked(
            &s,
            &t,
            Some(run.clone()),
            request(request_id),
            "ls".into(),
            Millis(5),
        );
    }

    // RW-06: the request is saved and sent once; an agent that asks twice changes nothing.
    #[test]
    fn a_request_is_replayed_and_its_card_published_once() {
        let mut a = Approvals::default();
        let run = RunId::new("run").unwrap();
        asked(&mut a, &run, "r1");
        let effects = drain(&mut a);
        assert!(
            matches!(effects[0], ApprovalEffect::Replay { .. }),
            "{effects:?}"
        );
        assert!(
            matches!(
                effects[1],
                ApprovalEffect::PublishCard { decided: false, .. }
            ),
            "{effects:?}"
        );
        assert_eq!(effects.len(), 2);
        asked(&mut a, &run, "r1");
        assert!(drain(&mut a).is_empty());
    }

    // RW-06: saved first, then sent; a second device is refused while it is on its way,
    // and an unsaved decision is not sent and opens the request again.
    #[test]
    fn a_decision_goes_to_the_agent_only_once_its_card_is_saved() {
        let mut a = Approvals::default();
        let run = RunId::new("run").unwrap();
        asked(&mut a, &run, "r1");
        drain(&mut a);

        a.decide(id("r1"), Decision::Accept, ReplyTo(1));
        let effects = drain(&mut a);
        let [ApprovalEffect::SaveDecision { row, .. }] = &effects[..] else {
            panic!("{effects:?}");
        };
        assert_eq!(row.block.data["approval"][DECISION_FIELD], "accept");
        a.decide(id("r1"), Decision::Decline, ReplyTo(2));
        let effects = drain(&mut a);
        assert!(
            matches!(
                &effects[..],
                [ApprovalEffect::Reply {
                    to: ReplyTo(2),
                    reply: Reply::Approval(Err(ApprovalError::AlreadyResolved { result: None }))
                }]
            ),
            "{effects:?}"
        );

        a.decision_saved(&id("r1"), false);
        let effects = drain(&mut a);
        assert!(
            matches!(
                &effects[..],
                [ApprovalEffect::Reply {
                    to: ReplyTo(1),
                    reply: Reply::Approval(Err(ApprovalError::Unsaved(_)))
                }]
            ),
            "{effects:?}"
        );

        a.decide(id("r1"), Decision::Decline, ReplyTo(2));
        drain(&mut a);
        a.decision_saved(&id("r1"), true);
        let effects = drain(&mut a);
        assert!(
            matches!(
                &effects[..],
                [ApprovalEffect::SendDecision {
                    decision: Decision::Decline,
                    ..
                }]
            ),
            "{effects:?}"
        );
        // The agent took it: the replay is stamped, the client answered, the card decided.
        a.resolved(id("r1"), Ok(ApprovalResult::Declined), |_, _| false);
        let effects = drain(&mut a);
        assert!(
            matches!(
                &effects[..],
                [
                    ApprovalEffect::Stamp { allowed: false, .. },
                    ApprovalEffect::Reply {
                        to: ReplyTo(2),
                        reply: Reply::Approval(Ok(ApprovalResult::Declined))
                    },
                    ApprovalEffect::PublishCard { decided: true, .. },
                ]
            ),
            "{effects:?}"
        );
        // A repeated answer changes nothing.
        a.resolved(id("r1"), Ok(ApprovalResult::Accepted), |_, _| false);
        assert!(drain(&mut a).is_empty());
    }

    // RW-06: a run that ends expires its pending requests; a refusal after the run ended
    // expires the request instead of opening it again.
    #[test]
    fn the_requests_of_a_run_that_ended_expire() {
        let mut a = Approvals::default();
        let run = RunId::new("run").unwrap();
        let other = RunId::new("other").unwrap();
        asked(&mut a, &run, "r1");
        asked(&mut a, &run, "r2");
        drain(&mut a);

        a.run_ended(&session(), &other);
        assert!(
            drain(&mut a).is_empty(),
            "another run's end expires nothing"
        );

        a.decide(id("r2"), Decision::Accept, ReplyTo(1));
        drain(&mut a);
        a.decision_saved(&id("r2"), true);
        drain(&mut a);

        a.run_ended(&session(), &run);
        let effects = drain(&mut a);
        assert!(
            matches!(
                &effects[..],
                [
                    ApprovalEffect::Stamp { allowed: false, .. },
                    ApprovalEffect::PublishCard { decided: true, .. },
                ]
            ),
            "only the pending r1 expires: {effects:?}"
        );

        a.resolved(id("r2"), Err("no such turn".into()), |_, r| r == &run);
        let effects = drain(&mut a);
        assert!(
            matches!(
                &effects[..],
                [
                    ApprovalEffect::Stamp { .. },
                    ApprovalEffect::Reply {
                        to: ReplyTo(1),
                        reply: Reply::Approval(Err(ApprovalError::AlreadyResolved {
                            result: Some(ApprovalResult::ResolvedExternally)
                        }))
                    },
                    ApprovalEffect::PublishCard { decided: true, .. },
                ]
            ),
            "{effects:?}"
        );
    }

    // RW-06: a resolution for a request on a card not read yet waits for the cards, at
    // most DECIDED_KEPT of them, and a decision found on its way is sent again.
    #[test]
    fn a_resolution_waits_for_unread_cards_and_a_kept_decision_is_sent_again() {
        let mut first = Approvals::default();
        let run = RunId::new("run").unwrap();
        asked(&mut first, &run, "r1");
        drain(&mut first);
        first.decide(id("r1"), Decision::Accept, ReplyTo(1));
        let effects = drain(&mut first);
        let [ApprovalEffect::SaveDecision { row, .. }] = &effects[..] else {
            panic!("{effects:?}");
        };

        let s = session();
        let t = TargetId::main(&s);
        let mut a = Approvals::default();
        a.read_again([(s.clone(), t.clone())].into());
        assert!(a.wants_cards_for(&id("r1")));
        for n in 0..=DECIDED_KEPT {
            a.resolved(
                id(&format!("late-{n}")),
                Ok(ApprovalResult::Accepted),
                |_, _| false,
            );
        }
        a.resolved(id("r1"), Ok(ApprovalResult::Accepted), |_, _| false);
        assert!(drain(&mut a).is_empty());

        a.cards_read(&s, &t, [row], Some(&run));
        let effects = drain(&mut a);
        assert!(
            matches!(
                &effects[..],
                [ApprovalEffect::SendDecision {
                    decision: Decision::Accept,
                    ..
                }]
            ),
            "{effects:?}"
        );
        assert!(a.unread().is_empty());
        let late = a.take_late();
        assert_eq!(
            late.len(),
            DECIDED_KEPT,
            "the oldest one past the cap is dropped"
        );
        assert_eq!(late.front().map(|l| &l.0), Some(&id("late-2")));
        assert_eq!(late.back().map(|l| &l.0), Some(&id("r1")));
    }
}
