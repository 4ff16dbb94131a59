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

use std::collections::{HashMap, VecDeque};

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

/// A request's identity: request, thread, turn and item IDs.
pub(crate) type Identity = [String; 4];

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

/// What the host does after the agent's answer.
/// The pending card and the replay event of a new request.
pub(crate) type Asked = (StoredBlock, (EventKind, serde_json::Value));

#[derive(Debug, Default)]
pub(crate) struct Resolved {
    /// The answer to the deciding client.
    pub reply: Option<(ReplyTo, Reply)>,
    /// The decided card to save and send.
    pub row: Option<(SessionId, TargetId, StoredBlock)>,
    /// The replay stamp: session, request ID, allowed.
    pub stamp: Option<(SessionId, String, bool)>,
}

/// Every approval request the host knows.
#[derive(Debug, Default)]
pub(crate) struct Approvals {
    open: HashMap<Identity, Open>,
    decided: VecDeque<Identity>,
}

fn identity(r: &ApprovalRequest) -> Identity {
    [
        r.request_id.clone(),
        r.thread_id.clone(),
        r.turn_id.clone(),
        r.item_id.clone(),
    ]
}

impl Approvals {
    /// The agent asks. Returns the pending card and the replay event, or nothing when
    /// the request is known already (an agent that asks twice changes nothing).
    pub(crate) fn asked(
        &mut self,
        session: &SessionId,
        target: &TargetId,
        run: Option<RunId>,
        request: ApprovalRequest,
        summary: String,
        now: Millis,
    ) -> Result<Option<Asked>, String> {
        let id = identity(&request);
        if self.open.contains_key(&id) {
            return Ok(None);
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
        let row = card_row(&open, None)?;
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
        self.open.insert(id, open);
        Ok(Some((row, (kind, event))))
    }

    /// Knows again a card the overlay store kept across a restart, so the agent's
    /// resolution (or a late decision) finds it: a pending card opens its request again,
    /// a decided one answers later decisions as already resolved. The card's subtitle
    /// stands for the summary it was made from. Returns false for any other row.
    pub(crate) fn restore(
        &mut self,
        session: &SessionId,
        target: &TargetId,
        row: &StoredBlock,
    ) -> bool {
        if row.class != RowClass::ApprovalCard {
            return false;
        }
        let Ok(activity) = serde_json::from_value::<ActivityRow>(row.block.data.clone()) else {
            return false;
        };
        let Some(card) = activity.approval else {
            return false;
        };
        let id = identity(&card.request);
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
    pub(crate) fn resend(&mut self) -> Vec<(SessionId, ApprovalRequest, Decision)> {
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
    pub(crate) fn ended(&self, session: &SessionId, run: &RunId) -> Vec<Identity> {
        let mut out: Vec<Identity> = self
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
    pub(crate) fn orphans(&self, session: &SessionId, active: Option<&RunId>) -> Vec<Identity> {
        let mut out: Vec<Identity> = self
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

    /// The session and run of a known request.
    pub(crate) fn run_of(&self, id: &Identity) -> Option<(&SessionId, Option<&RunId>)> {
        self.open.get(id).map(|o| (&o.session, o.run.as_ref()))
    }

    /// True when a request with this identity is known (open or decided).
    pub(crate) fn knows(&self, id: &Identity) -> bool {
        self.open.contains_key(id)
    }

    /// A client decides. `Ok`: the card to save with the decision on its way (the
    /// decision goes to the agent of its session once it is saved, see
    /// [`Approvals::saved`] and [`Approvals::unsaved`]).
    pub(crate) fn decide(
        &mut self,
        id: &Identity,
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

    /// The card with the decision on its way was saved: the decision goes to the agent
    /// (the session, the request and the decision to send).
    pub(crate) fn saved(&self, id: &Identity) -> Option<(SessionId, ApprovalRequest, Decision)> {
        let open = self.open.get(id)?;
        match open.state {
            State::Deciding { decision, .. } => {
                Some((open.session.clone(), open.request.clone(), decision))
            }
            _ => None,
        }
    }

    /// The card with the decision on its way could not be saved: the decision is not
    /// sent, and the request is open again for any device.
    pub(crate) fn unsaved(&mut self, id: &Identity) {
        if let Some(open) = self.open.get_mut(id) {
            if matches!(open.state, State::Deciding { .. }) {
                open.state = State::Pending;
            }
        }
    }

    /// The agent answered (or the request was settled elsewhere). With `lapsed`, the
    /// host itself expires the request (`result` is then `resolvedExternally`): it
    /// shows as expired until an answer of the agent's says what it took.
    pub(crate) fn resolved(
        &mut self,
        id: &Identity,
        result: Result<ApprovalResult, String>,
        lapsed: bool,
    ) -> Result<Resolved, String> {
        let mut out = Resolved::default();
        let Some(open) = self.open.get_mut(id) else {
            return Ok(out);
        };
        let was_lapsed = open.state == State::Lapsed;
        let by = match (&open.state, &result) {
            (State::Deciding { by, .. }, _) => *by,
            (State::Pending | State::Kept(_), _) => None,
            // The agent took a decision the host had given up on.
            (State::Lapsed, Ok(r)) if !lapsed && *r != ApprovalResult::ResolvedExternally => None,
            // The first result the agent took stays; a repeated answer changes nothing.
            (State::Decided(_) | State::Lapsed, _) => return Ok(out),
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
        Ok(out)
    }
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
