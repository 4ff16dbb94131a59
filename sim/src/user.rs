//! What users do: send (automatic, steer, queue, interrupt, replace latest), edit,
//! remove, reorder, send now, stop, stop and send now, decide approvals, page older, jump
//! to a row and back, reload, open another session.
//!
//! Replace latest (`replace-latest` + `interrupt-running`, with `rollbackBeforeSend`)
//! is drawn from a stream of its own ([`REPLACE_LATEST`] of the actions), on Codex
//! sessions, which take it, and on Claude sessions, which must refuse it.
//!
//! Session-to-session messages are not among them: the `Host` takes no input that
//! creates one (custody's `send_session_message` is not reachable through the host's
//! loop), so the world cannot drive them as an embedder would.

use host_core::ClientRequest;
use outbox_core::entry::Controls;
use outbox_core::ids::QueueId;
use timeline_core::rows::Decision;

use crate::client::Kind;
use crate::world::{Asked, World};

/// The share of user actions that are a replace latest.
pub(crate) const REPLACE_LATEST: f64 = 0.03;

/// The share of user actions that are a reorder (drawn from a stream of its own).
pub(crate) const REORDER: f64 = 0.04;

impl World {
    /// One user action on a random client.
    pub(crate) fn user_action(&mut self) {
        if self.reorders.chance(REORDER) && self.cfg.reorder {
            self.reorder();
            return;
        }
        if self.actions.chance(REPLACE_LATEST) && self.cfg.replace_latest {
            // Its own stream picks the client, so the world's stream draws only what the
            // send itself draws.
            let c = self.actions.index(self.clients.len());
            let session = self.clients[c].session.clone();
            let name = self.clients[c].name(c);
            self.log(|| format!("{name} replaces the latest turn of {session}"));
            self.send_message(c, Controls::replace_latest());
            return;
        }
        let c = self.rng.index(self.clients.len());
        let session = self.clients[c].session.clone();
        let action = self
            .rng
            .weighted(&[14, 5, 4, 2, 3, 3, 2, 2, 3, 8, 3, 2, 2, 2]);
        let name = self.clients[c].name(c);
        match action {
            // Send: automatic.
            0 => self.send_message(c, Controls::automatic()),
            // Steer the run the client believes runs (sometimes one that ended).
            1 => {
                let run = self
                    .host
                    .as_ref()
                    .and_then(|h| {
                        h.custody()
                            .runs()
                            .active(&session)
                            .map(|r| r.run_id.clone())
                    })
                    .or_else(|| {
                        self.agent
                            .session(&session)
                            .and_then(|s| s.running().cloned())
                    });
                match run {
                    Some(run) => self.send_message(c, Controls::steer(run)),
                    None => self.send_message(c, Controls::automatic()),
                }
            }
            // Queue.
            2 => self.send_message(c, Controls::enqueue()),
            // Interrupt the running turn with a new message.
            3 => self.send_message(c, Controls::interrupt()),
            // Edit a queued message.
            4 => {
                let Some(queue) = self.pick_queue(&session) else {
                    return;
                };
                let Some(old) = self.queues.get(&queue).cloned() else {
                    return;
                };
                self.edit(c, queue, old);
            }
            // Remove a queued message.
            5 => {
                if let Some(queue) = self.pick_queue(&session) {
                    self.request(
                        c,
                        Asked::Remove(queue.clone()),
                        ClientRequest::Remove {
                            session,
                            queue_id: queue,
                        },
                    );
                }
            }
            // Send a queued message now.
            6 => {
                if let Some(queue) = self.pick_queue(&session) {
                    self.request(
                        c,
                        Asked::SendNow,
                        ClientRequest::SendNow {
                            session,
                            queue_id: queue,
                        },
                    );
                }
            }
            // Stop.
            7 => self.request(c, Asked::Stop, ClientRequest::Stop { session }),
            // Stop and send now an accepted steer.
            8 => {
                if let Some(queue) = self.pick_queue(&session) {
                    self.request(
                        c,
                        Asked::StopAndSendNow,
                        ClientRequest::StopAndSendNow {
                            session,
                            queue_id: queue,
                        },
                    );
                }
            }
            // Decide an approval.
            9 => self.decide(c),
            // Page older.
            10 => {
                let now = self.now;
                let asked = self.clients[c].timeline.load_older(now);
                self.log(|| format!("{name} pages older ({asked})"));
            }
            // Jump to a row.
            11 => self.jump(c),
            // Back to the present, or a pull to refresh.
            12 => {
                let now = self.now;
                let t = &mut self.clients[c].timeline;
                if !t.load_newer(now) {
                    t.reload(now);
                }
                self.log(|| format!("{name} goes back to the present"));
            }
            // Open another session.
            _ => self.switch_session(c),
        }
    }

    /// A client moves one of its session's messages before another, or to the back
    /// (every draw from the reorder stream).
    fn reorder(&mut self) {
        let c = self.reorders.index(self.clients.len());
        let session = self.clients[c].session.clone();
        let queues: Vec<QueueId> = self
            .messages
            .values()
            .filter(|m| m.session == session && !m.replaced && !m.removed)
            .map(|m| m.queue.clone())
            .collect();
        if queues.is_empty() {
            return;
        }
        let queue_id = queues[self.reorders.index(queues.len())].clone();
        let before = if self.reorders.chance(0.25) {
            None
        } else {
            Some(queues[self.reorders.index(queues.len())].clone())
        };
        self.stats.reorders += 1;
        self.request(
            c,
            Asked::Reorder,
            ClientRequest::Reorder {
                session,
                queue_id,
                before,
            },
        );
    }

    /// A queue entry of `session`: one of the messages sent to it.
    fn pick_queue(&mut self, session: &timeline_core::SessionId) -> Option<QueueId> {
        let queues: Vec<QueueId> = self
            .messages
            .values()
            .filter(|m| &m.session == session && !m.replaced)
            .map(|m| m.queue.clone())
            .collect();
        if queues.is_empty() {
            return None;
        }
        Some(queues[self.rng.index(queues.len())].clone())
    }

    fn edit(&mut self, c: usize, queue: QueueId, old: timeline_core::OperationId) {
        let Some(m) = self.messages.get(&old).cloned() else {
            return;
        };
        self.next_op += 1;
        let n = self.next_op;
        let Ok(new) = timeline_core::OperationId::new(format!("op-{n}")) else {
            return;
        };
        self.stats.messages += 1;
        let mut request = m.request.clone();
        request.user_text = format!("{} (edited)", m.request.user_text);
        request.created_at = self.now;
        self.messages.insert(
            new.clone(),
            crate::world::Message {
                request: request.clone(),
                acked: false,
                removed: false,
                replaced: false,
                refused: false,
                ..m.clone()
            },
        );
        self.request(
            c,
            Asked::Edit {
                old,
                new: new.clone(),
            },
            ClientRequest::Edit {
                session: m.session,
                queue_id: queue,
                new_operation: new,
                request,
            },
        );
    }

    fn decide(&mut self, c: usize) {
        let session = self.clients[c].session.clone();
        let Some(asked) = self.agent.session(&session).map(|s| s.asked.clone()) else {
            return;
        };
        if asked.is_empty() {
            return;
        }
        let request = asked[self.rng.index(asked.len())].clone();
        let decision = if self.rng.chance(0.1) {
            Decision::AcceptBroadly
        } else {
            request.allowed[self.rng.index(request.allowed.len())]
        };
        let phone = self.clients[c].kind == Kind::Phone;
        let name = if phone { "phone" } else { "desktop" };
        self.log(|| {
            format!(
                "the {name} user decides {} {decision:?}",
                request.request_id
            )
        });
        self.request(
            c,
            Asked::Approval(request.request_id.clone()),
            ClientRequest::ResolveApproval {
                request_id: request.request_id.clone(),
                thread_id: request.thread_id.clone(),
                turn_id: request.turn_id.clone(),
                item_id: request.item_id.clone(),
                decision,
            },
        );
    }
}
