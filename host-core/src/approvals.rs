//! Approvals decided once, on any device (RW-06).
//!
//! An approval request from either agent is kept by its full identity (request, thread,
//! turn and item IDs: `run.chatResolveApproval` carries no session ID). The first allowed
//! decision from any client goes to the agent; while the agent takes it, and after, a
//! decision from another device is answered [`ApprovalError::AlreadyResolved`]. The
//! agent's answer decides the card: the decided card replaces the pending one in place
//! (same ID), and replays stamp the request with its outcome. A decision the agent did not
//! take leaves the card pending, so any device may decide again.

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

/// A request's identity: request, thread, turn and item IDs.
pub(crate) type Identity = [String; 4];

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    Pending,
    Deciding { by: ReplyTo },
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
    pub fn asked(
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
    pub fn restore(&mut self, session: &SessionId, target: &TargetId, row: &StoredBlock) -> bool {
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
        let state = match (card.status, card.result) {
            (CardStatus::Pending, _) => State::Pending,
            (_, Some(result)) => State::Decided(result),
            (CardStatus::Expired, None) => State::Decided(ApprovalResult::ResolvedExternally),
            _ => return false,
        };
        let decided = matches!(state, State::Decided(_));
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

    /// True when a request with this identity is known (open or decided).
    pub fn knows(&self, id: &Identity) -> bool {
        self.open.contains_key(id)
    }

    /// A client decides. `Ok`: the decision goes to the agent of the returned session.
    pub fn decide(
        &mut self,
        id: &Identity,
        decision: Decision,
        by: ReplyTo,
    ) -> Result<(SessionId, ApprovalRequest), ApprovalError> {
        let open = self.open.get_mut(id).ok_or(ApprovalError::Unknown)?;
        match open.state {
            State::Pending => {}
            State::Deciding { .. } => return Err(ApprovalError::AlreadyResolved { result: None }),
            State::Decided(result) => {
                return Err(ApprovalError::AlreadyResolved {
                    result: Some(result),
                })
            }
        }
        open.request
            .decide(decision)
            .map_err(|e| ApprovalError::NotAllowed(e.0))?;
        open.state = State::Deciding { by };
        Ok((open.session.clone(), open.request.clone()))
    }

    /// The agent answered (or the request was settled elsewhere).
    pub fn resolved(
        &mut self,
        id: &Identity,
        result: Result<ApprovalResult, String>,
    ) -> Result<Resolved, String> {
        let mut out = Resolved::default();
        let Some(open) = self.open.get_mut(id) else {
            return Ok(out);
        };
        let by = match open.state {
            State::Deciding { by } => Some(by),
            State::Pending => None,
            // The first result the agent took stays; a repeated answer changes nothing.
            State::Decided(_) => return Ok(out),
        };
        match result {
            Err(text) => {
                open.state = State::Pending;
                out.reply = by.map(|to| (to, Reply::Approval(Err(ApprovalError::Refused(text)))));
            }
            Ok(result) => {
                open.state = State::Decided(result);
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
                self.decided.push_back(id.clone());
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
