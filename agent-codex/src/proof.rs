//! Delivery proof for Codex (OB-08, the seed's "Confirmed" and "No clear reply"): a user
//! message whose `clientId` is the operation ID, in any turn (a steer, and a `turn/start`
//! sent while a turn runs, land in the running turn, not in the turn the answer named).
//! Item IDs are never used: live IDs and rebuilt-history IDs differ.
//!
//! - Live: [`DeliveryWatch`] over the notifications after the send. The echo proves
//!   delivery; a turn that ends interrupted before the echo means the message was not
//!   delivered (an interrupted turn drops its pending input).
//! - History: [`in_thread`] over a `thread/read` / `thread/resume` answer, and
//!   [`in_rollout`] over rollout lines (`event_msg` `user_message.client_id` in legacy
//!   mode, `item_completed` `UserMessage.client_id` in paginated mode).

use outbox_core::adapter::HistoryRead;

use crate::protocol::{ServerNotification, Thread, ThreadItem, TurnStatus};
use crate::rollout::{EventMsg, RolloutLine, RolloutRecord, TurnItem};

/// What the live stream says about the delivery of one operation (the verdict of a
/// [`DeliveryWatch`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No proof either way yet.
    Pending,
    /// Codex recorded the message in this turn.
    Delivered {
        /// The turn that holds the message.
        turn_id: String,
    },
    /// The running turn ended interrupted before the message appeared.
    NotDelivered {
        /// The interrupted turn.
        turn_id: String,
    },
}

/// Watches the notifications after a send for the proof of one operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeliveryWatch {
    operation_id: String,
    thread_id: String,
    state: Verdict,
}

impl DeliveryWatch {
    /// Watches for `operation_id` in `thread_id`, from the moment of the send.
    pub fn new(operation_id: &str, thread_id: &str) -> DeliveryWatch {
        DeliveryWatch {
            operation_id: operation_id.to_owned(),
            thread_id: thread_id.to_owned(),
            state: Verdict::Pending,
        }
    }

    /// What is known so far.
    pub fn state(&self) -> &Verdict {
        &self.state
    }

    /// Takes the next notification; returns the state once it is settled. A settled
    /// state never changes.
    pub fn handle(&mut self, n: &ServerNotification) -> &Verdict {
        if self.state != Verdict::Pending {
            return &self.state;
        }
        match n {
            ServerNotification::ItemStarted {
                thread_id,
                turn_id,
                item: ThreadItem::UserMessage { client_id, .. },
                ..
            }
            | ServerNotification::ItemCompleted {
                thread_id,
                turn_id,
                item: ThreadItem::UserMessage { client_id, .. },
                ..
            } if *thread_id == self.thread_id
                && client_id.as_deref() == Some(self.operation_id.as_str()) =>
            {
                self.state = Verdict::Delivered {
                    turn_id: turn_id.clone(),
                };
            }
            ServerNotification::TurnCompleted { thread_id, turn }
                if *thread_id == self.thread_id && turn.status == TurnStatus::Interrupted =>
            {
                self.state = Verdict::NotDelivered {
                    turn_id: turn.id.clone(),
                };
            }
            _ => {}
        }
        &self.state
    }
}

/// The live delivery of `operation_id` over `notifications` (in order, after the send).
pub fn delivery<'a>(
    operation_id: &str,
    thread_id: &str,
    notifications: impl IntoIterator<Item = &'a ServerNotification>,
) -> Verdict {
    let mut w = DeliveryWatch::new(operation_id, thread_id);
    for n in notifications {
        if w.handle(n) != &Verdict::Pending {
            break;
        }
    }
    w.state
}

/// The history proof in a thread read with its turns: found when any turn holds a user
/// message with that client ID.
pub fn in_thread(thread: &Thread, operation_id: &str) -> HistoryRead {
    let found = thread.turns.iter().any(|t| {
        t.items.iter().any(|v| {
            matches!(
                ThreadItem::from_value(v),
                Ok(ThreadItem::UserMessage { client_id: Some(c), .. }) if c == operation_id
            )
        })
    });
    if found {
        HistoryRead::Found
    } else {
        HistoryRead::Missing
    }
}

/// Where a rollout proves an operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutProof {
    /// The index of the line in `lines`.
    pub line: usize,
    /// The turn, when the file names it (`turn_id` of `item_completed`, or the turn
    /// started last before a legacy `user_message`).
    pub turn_id: Option<String>,
}

/// The first line of `lines` that proves `operation_id`, if any.
pub fn in_rollout(lines: &[RolloutLine], operation_id: &str) -> Option<RolloutProof> {
    let mut turn: Option<String> = None;
    for (i, l) in lines.iter().enumerate() {
        match &l.record {
            RolloutRecord::EventMsg(EventMsg::TaskStarted { turn_id }) => turn = turn_id.clone(),
            RolloutRecord::TurnContext {
                turn_id: Some(t), ..
            } => turn = Some(t.clone()),
            RolloutRecord::EventMsg(EventMsg::UserMessage {
                client_id: Some(c), ..
            }) if c == operation_id => {
                return Some(RolloutProof {
                    line: i,
                    turn_id: turn,
                })
            }
            RolloutRecord::EventMsg(EventMsg::ItemCompleted {
                turn_id,
                item:
                    TurnItem::UserMessage {
                        client_id: Some(c), ..
                    },
            }) if c == operation_id => {
                return Some(RolloutProof {
                    line: i,
                    turn_id: turn_id.clone().or(turn),
                })
            }
            _ => {}
        }
    }
    None
}

/// [`in_rollout`] as a history read.
pub fn rollout_history_read(lines: &[RolloutLine], operation_id: &str) -> HistoryRead {
    match in_rollout(lines, operation_id) {
        Some(_) => HistoryRead::Found,
        None => HistoryRead::Missing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Turn;

    fn user(turn: &str, client: Option<&str>) -> ServerNotification {
        ServerNotification::ItemCompleted {
            thread_id: "th".into(),
            turn_id: turn.into(),
            item: ThreadItem::UserMessage {
                id: "x".into(),
                client_id: client.map(str::to_owned),
                text: String::new(),
            },
            at_ms: None,
        }
    }

    fn ended(turn: &str, status: TurnStatus) -> ServerNotification {
        ServerNotification::TurnCompleted {
            thread_id: "th".into(),
            turn: Turn {
                id: turn.into(),
                status,
                items: vec![],
                error: None,
                started_at: None,
            },
        }
    }

    #[test]
    fn the_echo_in_any_turn_proves_delivery() {
        let ns = [user("running", Some("other")), user("running", Some("op"))];
        assert_eq!(
            delivery("op", "th", &ns),
            Verdict::Delivered {
                turn_id: "running".into()
            }
        );
        // Another thread's echo proves nothing.
        let n = ServerNotification::ItemStarted {
            thread_id: "sibling".into(),
            turn_id: "t".into(),
            item: ThreadItem::UserMessage {
                id: "x".into(),
                client_id: Some("op".into()),
                text: String::new(),
            },
            at_ms: None,
        };
        assert_eq!(delivery("op", "th", [&n]), Verdict::Pending);
    }

    #[test]
    fn an_interrupted_turn_without_the_echo_means_not_delivered() {
        let ns = [
            user("t", None),
            ended("t", TurnStatus::Interrupted),
            user("t2", Some("op")),
        ];
        assert_eq!(
            delivery("op", "th", &ns),
            Verdict::NotDelivered {
                turn_id: "t".into()
            }
        );
        // A turn that completes normally settles nothing (the steer may land later).
        let ns = [ended("t", TurnStatus::Completed)];
        assert_eq!(delivery("op", "th", &ns), Verdict::Pending);
        // The echo before the interruption wins.
        let ns = [user("t", Some("op")), ended("t", TurnStatus::Interrupted)];
        assert!(matches!(
            delivery("op", "th", &ns),
            Verdict::Delivered { .. }
        ));
    }
}
