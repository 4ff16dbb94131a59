//! Messages between sessions (OB-16): the `send_session_message` tool.
//!
//! The message is an ordinary outbox entry of the recipient (`session-message-<uuid>`),
//! so custody, the queue, the ledger and the delivery proof all apply. With a running
//! turn and no hold it is `automatic` + `steer-running` with the recipient's run ID;
//! otherwise `enqueue` + `queue` at the back. The route row is written in the same
//! transaction as the entry and is unique per (sender session, sender call), which makes
//! a repeated tool call safe.
//!
//! Hold rule: the message waits for approval when the recipient's access level (the
//! running turn's level when it runs) is higher than the sender's, or cannot be
//! confirmed. It is checked when the call saves the entry and again before each drain;
//! sending the queued entry with any intent other than `enqueue` approves it.

use timeline_core::time::Millis;

use crate::adapter::AgentKind;
use crate::custody::Custody;
use crate::entry::{
    AccessLevel, Controls, EntryState, MessageRequest, OutboxEntry, SessionMessageOrigin,
};
use crate::envelope::{envelope, EnvelopeSender};
use crate::fingerprint::request_fingerprint;
use crate::ids::{base_session, CallId, OperationId, QueueId, RunId, SessionId, ThreadId};
use crate::store::{OutboxError, OutboxStore, RouteClaim, RouteDelivery, SessionMessageRoute};

/// The prefix of session-message operation and queue IDs.
pub use crate::envelope::SESSION_MESSAGE_PREFIX;
/// The hold reason when the recipient's access level cannot be confirmed.
pub const ACCESS_UNCONFIRMED_REASON: &str =
    "The desktop could not confirm the access level of the recipient session.";

/// One `send_session_message` call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionMessageCall {
    /// The calling session (taken from the agent, not chosen by the model).
    pub sender_session: SessionId,
    /// The calling run.
    pub sender_run: Option<RunId>,
    /// The calling agent thread.
    pub sender_thread: Option<ThreadId>,
    /// The tool call.
    pub call_id: CallId,
    /// The recipient the model chose; `None` when it named none.
    pub recipient: Option<SessionId>,
    /// The message.
    pub body: String,
    /// The sender's title (for the envelope).
    pub sender_title: String,
    /// The sender's agent.
    pub sender_agent: AgentKind,
    /// The sender's access level.
    pub sender_access: AccessLevel,
    /// The sender's project.
    pub sender_project: Option<String>,
    /// The host product's name ("HB Code").
    pub product: String,
}

/// What the tool returns to the calling agent.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ToolResult {
    /// Saved; it goes to the recipient's running turn or queue.
    Queued,
    /// Saved, waiting for the user's approval.
    WaitingForApproval {
        /// Why, in words for the user or the log.
        reason: String,
    },
    /// The same call was repeated; nothing new was saved.
    AlreadySent,
    /// The call was refused; the message was not saved.
    Error {
        /// Why, in words for the user or the log.
        message: String,
    },
}

/// The tool error for a repeated call to another recipient.
pub const ONE_SEND_PER_CALL_TEXT: &str =
    "This tool call already sent its message to another session. One tool call sends one message.";
/// The tool error for a message to the sender's own session.
pub const OWN_SESSION_TEXT: &str = "A session cannot send a message to itself.";
/// The tool error when no session or an unknown session was named.
pub const UNKNOWN_SESSION_TEXT: &str = "Unknown session";

/// The hold reason for a message to `recipient` from a sender at `sender_access`, or
/// `None` when it may go.
pub(crate) fn hold_reason<S: OutboxStore>(
    custody: &Custody<S>,
    recipient: &SessionId,
    sender_access: AccessLevel,
) -> Option<String> {
    let running = custody.runs().active(recipient).map(|r| r.access);
    let level = match running {
        Some(turn) => turn,
        None => custody.session(recipient).and_then(|i| i.access),
    };
    match level {
        None => Some(ACCESS_UNCONFIRMED_REASON.to_owned()),
        Some(l) if l > sender_access => Some(format!(
            "The recipient session runs with {} access, higher than the sender's {}.",
            l.as_str(),
            sender_access.as_str()
        )),
        Some(_) => None,
    }
}

impl<S: OutboxStore> Custody<S> {
    /// Saves a message from another session (OB-16).
    pub fn send_session_message(
        &mut self,
        call: SessionMessageCall,
        now: Millis,
    ) -> Result<ToolResult, OutboxError> {
        let Some(recipient) = call.recipient.clone().filter(|r| self.session(r).is_some()) else {
            return Ok(ToolResult::Error {
                message: UNKNOWN_SESSION_TEXT.to_owned(),
            });
        };
        if base_session(&recipient) == base_session(&call.sender_session) {
            return Ok(ToolResult::Error {
                message: OWN_SESSION_TEXT.to_owned(),
            });
        }
        let (chain_id, hop) = self.exchange_of(&call)?;
        let hold = hold_reason(self, &recipient, call.sender_access);
        let running = self.runs().active(&recipient).map(|r| r.run_id.clone());
        let controls = match (&running, &hold) {
            (Some(run), None) => Controls::steer(run.clone()),
            _ => Controls::enqueue(),
        };
        let id = format!("{SESSION_MESSAGE_PREFIX}{}", self.next_uuid());
        let (Ok(op), Ok(queue_id)) = (OperationId::new(id.clone()), QueueId::new(id)) else {
            return Ok(ToolResult::Error {
                message: "the host gave a blank ID".to_owned(),
            });
        };
        let sender = EnvelopeSender {
            session_id: call.sender_session.clone(),
            title: call.sender_title.clone(),
            agent: call.sender_agent,
        };
        let mut request = MessageRequest::text(call.body.clone(), "session-message", now);
        request.prompt_text = Some(envelope(&call.product, &sender, &call.body));
        let here = self.scope_granted(&recipient);
        let position = if here {
            self.place(&recipient, controls.intent, None, now)?
        } else {
            // Served by another host (MH-04): its memory and runs are not here, so the
            // message goes after the recipient's saved queue, read from the store; the
            // store's write wakes the owner, which reads the scope again and drains it.
            let saved = self.mirror.store.entries(&recipient)?;
            saved.iter().map(|e| e.position()).max().map_or(0, |m| {
                m.saturating_add(crate::custody::submit::POSITION_STEP)
            })
        };
        let state = match &hold {
            Some(reason) => EntryState::waiting_for_approval(reason.clone()),
            None => EntryState::queued(),
        };
        let entry = OutboxEntry {
            state,
            session_message: Some(SessionMessageOrigin {
                sender_session_id: call.sender_session.clone(),
                sender_call_id: call.call_id.clone(),
                sender_run_id: call.sender_run.clone(),
                sender_thread_id: call.sender_thread.clone(),
                sender_access: call.sender_access,
                sender_project: call.sender_project.clone(),
                chain_id: chain_id.clone(),
                hop,
                approved: false,
            }),
            ..OutboxEntry::queued(queue_id.clone(), op.clone(), request, controls, position)
        };
        let route = SessionMessageRoute {
            operation_id: op.clone(),
            recipient_session_id: recipient.clone(),
            sender_session_id: call.sender_session.clone(),
            sender_call_id: call.call_id.clone(),
            sender_run_id: call.sender_run.clone(),
            sender_thread_id: call.sender_thread.clone(),
            chain_id,
            hop,
            created_at: now,
            delivery: if hold.is_some() {
                RouteDelivery::NeedsApproval
            } else {
                RouteDelivery::Sent
            },
        };
        let fp = request_fingerprint(&recipient, &queue_id, &entry.request);
        let claim = self
            .mirror
            .claim_session_message(&recipient, &fp, &entry, &route, here);
        let claim = match claim {
            Ok(claim) => claim,
            Err(e) => {
                self.forget(&recipient, now);
                return Err(e);
            }
        };
        match claim {
            RouteClaim::ExistingCall(existing) => {
                Ok(if existing.recipient_session_id == recipient {
                    ToolResult::AlreadySent
                } else {
                    ToolResult::Error {
                        message: ONE_SEND_PER_CALL_TEXT.to_owned(),
                    }
                })
            }
            RouteClaim::Claimed => {
                if here {
                    self.wake(&recipient, now);
                }
                Ok(match hold {
                    Some(reason) => ToolResult::WaitingForApproval { reason },
                    None => ToolResult::Queued,
                })
            }
        }
    }

    /// The exchange of a call: a run that a session message started or joined continues
    /// its exchange with hop + 1; any other run starts a new exchange at hop 1.
    fn exchange_of(&mut self, call: &SessionMessageCall) -> Result<(String, u32), OutboxError> {
        let active = self.runs().active(&call.sender_session).cloned();
        let joined = active.filter(|a| Some(&a.run_id) == call.sender_run.as_ref());
        if let Some(run) = joined {
            for op in [run.last_session_message, run.started_by]
                .into_iter()
                .flatten()
            {
                if let Some(route) = self.mirror.store.route(&op)? {
                    return Ok((route.chain_id, route.hop + 1));
                }
            }
        }
        Ok((format!("chain-{}", self.next_uuid()), 1))
    }
}
