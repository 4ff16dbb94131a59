//! The clients and the relay: the desktop windows and phones, their requests and the
//! replies they get, the live deliveries they take (directly, or through the relay and
//! its replay for a phone), and the user's actions on them.

use crate::client::{Echo, Kind, Mine};
use crate::faults::FaultKind;
use crate::invariant::Invariant;
use crate::net::{Event, WINDOW_STREAM};
use crate::trace::clip;
use crate::Defect;
use host_core::ReplyTo;
use host_core::{ClientRequest, HostEffect, Reply};
use outbox_core::entry::{Controls, Intent, MessageRequest};
use outbox_core::ids::QueueId;
use outbox_core::SubmitRequest;
use overlay_core::live::{Delivery, LiveProtocol, Payload};
use timeline_core::anchor::Anchor;
use timeline_core::timeline::{LoadState, TimelineEffect};
use timeline_core::wire::{LiveOverlay, LivePatch};
use timeline_core::{BlockKey, Millis, OperationId, PendingSend, SessionId, TargetId};

use super::{
    call_line, millis, rebase, relay_version, reply_line, request_line, Asked, Message, Request,
    World,
};

impl World {
    /// True while a client waits to be connected.
    pub(crate) fn joining(&self) -> bool {
        !self.connect_deadline.is_empty()
    }

    /// A client connects again and reloads (a phone whose connection dropped).
    pub(crate) fn reconnect(&mut self, c: usize) {
        self.connect(c);
        let now = self.now;
        self.clients[c].timeline.reload(now);
    }

    /// A client connects to the current host: a window subscribes, a phone joins.
    pub(crate) fn connect(&mut self, c: usize) {
        let session = self.clients[c].session.clone();
        match self.clients[c].kind {
            Kind::Desktop => {
                self.connect_deadline
                    .insert(c, self.now.saturating_add(millis(10_000)));
                let request = ClientRequest::Subscribe {
                    window: self.clients[c].window,
                    session: session.clone(),
                    target: TargetId::main(&session),
                    protocol: self.clients[c].protocol,
                };
                self.request(c, Asked::Subscribe(session), request);
                self.connect_request.insert(c, self.next_request);
            }
            Kind::Phone => {
                self.clients[c].joined = Some(session.clone());
                let protocol = self.clients[c].protocol;
                self.connect_deadline
                    .insert(c, self.now.saturating_add(millis(10_000)));
                self.request(
                    c,
                    Asked::Join(session.clone()),
                    ClientRequest::Join { session, protocol },
                );
                self.connect_request.insert(c, self.next_request);
            }
        }
    }

    /// A client sends a request to the host.
    pub(crate) fn request(&mut self, c: usize, asked: Asked, request: ClientRequest) {
        self.next_request += 1;
        let id = self.next_request;
        let name = self.clients[c].name(c);
        self.log(|| format!("{name} asks #{id} {}", request_line(&request)));
        self.requests.insert(id, Request { client: c, asked });
        let phone = self.clients[c].kind == Kind::Phone;
        if phone && self.strike(FaultKind::RequestLost) {
            self.log(|| format!("#{id} lost on its way"));
            return;
        }
        let delay = if self.strike(FaultKind::RequestLate) {
            self.rng.range(1_000, 120_000)
        } else {
            self.rng.range(1, 40)
        };
        let event = Event::ToHost {
            to: ReplyTo(id),
            request,
            incarnation: self.incarnation,
        };
        // One client's requests arrive in the order it sent them.
        let at = self.now.saturating_add(millis(delay));
        self.net.send_ordered(10_000 + c as u64, at, event);
    }

    pub(crate) fn deliver_reply(&mut self, to: ReplyTo, reply: Reply) {
        let Some(req) = self.requests.remove(&to.0) else {
            self.log(|| format!("reply to #{} that nobody waits for", to.0));
            return;
        };
        let c = req.client;
        let now = self.now;
        let name = self.clients[c].name(c);
        let line = reply_line(&reply);
        let asked = format!("{:?}", req.asked);
        self.log(|| format!("{name} gets #{} ({}) {line}", to.0, clip(&asked, 80)));
        if let (Asked::Approval(id), Reply::Approval(Ok(result))) = (&req.asked, &reply) {
            self.stats.decided += 1;
            let n = self.approvals_taken.entry(id.clone()).or_default();
            *n += 1;
            if *n > 1 {
                let text =
                    format!("a second client was told its decision on {id} was taken ({result:?})");
                self.violate(Invariant::ApprovalTwice, text);
            }
        }
        let client = &mut self.clients[c];
        match (req.asked, reply) {
            (Asked::Latest(tag), Reply::LatestWindow(w)) => {
                self.stats.loads += 1;
                let o = client.timeline.handle_latest_window(
                    &tag,
                    w.map_err(|e| e.load_failure()),
                    now,
                );
                self.log(|| format!("  {o:?}"));
            }
            (Asked::Anchored(tag), Reply::LatestWindow(w)) => {
                self.stats.loads += 1;
                let opens = w
                    .as_ref()
                    .is_ok_and(|w| w.anchor_row.is_some() || w.anchor_notice.is_some());
                let o = client
                    .timeline
                    .handle_anchored(&tag, w.map_err(|e| e.load_failure()), now);
                if opens && o == timeline_core::timeline::Outcome::Applied {
                    // An answer to an older place request applied after a newer one's.
                    let out_of_order = client.placed.is_some_and(|p| p > tag.request);
                    client.placed = Some(client.placed.map_or(tag.request, |p| p.max(tag.request)));
                    self.log(|| format!("  {o:?}"));
                    if out_of_order {
                        self.violate(
                            Invariant::ViewDiffers,
                            format!(
                                "client {c} applied the answer of place request {} after a newer one's",
                                tag.request
                            ),
                        );
                    }
                } else {
                    self.log(|| format!("  {o:?}"));
                }
            }
            (Asked::Older(tag), Reply::OlderPage(p)) => {
                self.stats.loads += 1;
                let o =
                    client
                        .timeline
                        .handle_older_page(&tag, p.map_err(|e| e.load_failure()), now);
                self.log(|| format!("  {o:?}"));
            }
            (Asked::Submit(op), Reply::Submitted(r)) => match r {
                Ok(_) => {
                    client.timeline.confirm_pending(&op);
                    if let Some(m) = client.mine.get_mut(&op) {
                        if m.echo == Echo::Awaiting {
                            m.echo = Echo::Saved;
                        }
                    }
                }
                Err(outbox_core::custody::SubmitError::Store(_)) => {
                    // The store failed: the echo waits for its receipt, and the client
                    // sends the same message again when it is overdue.
                }
                Err(_) => {
                    // Refused: the user sees the error; the echo goes.
                    client.timeline.remove_pending(&op);
                    client.mine.remove(&op);
                }
            },
            (Asked::Edit { old, new }, Reply::Edited(Ok(_))) if client.mine.contains_key(&old) => {
                client.mine.remove(&old);
                client.timeline.remove_pending(&old);
                let m = self.messages.get(&new).cloned();
                if let Some(m) = m {
                    client.timeline.add_pending(PendingSend {
                        operation_id: new.clone(),
                        created_at: m.request.created_at,
                        data: serde_json::json!({ "text": m.request.user_text }),
                    });
                    client.timeline.confirm_pending(&new);
                    client.mine.insert(
                        new,
                        Mine {
                            queue: m.queue,
                            echo: Echo::Saved,
                        },
                    );
                }
            }
            (Asked::Reorder, Reply::Done(Ok(()))) => self.stats.reordered += 1,
            (Asked::Remove(queue), Reply::Done(Ok(()))) => {
                let op = self.queues.get(&queue).cloned();
                if let Some(op) = op {
                    if client.mine.remove(&op).is_some() {
                        client.timeline.remove_pending(&op);
                    }
                }
            }
            // The window tries again a second later.
            (Asked::Subscribe(session), Reply::Subscribed(Err(_)))
                if client.session == session && self.connect_request.get(&c) == Some(&to.0) =>
            {
                self.connect_deadline
                    .insert(c, now.saturating_add(millis(1_000)));
            }
            (Asked::Subscribe(session), Reply::Subscribed(Ok(sub))) => {
                if client.session == session && self.connect_request.get(&c) == Some(&to.0) {
                    self.connect_deadline.remove(&c);
                }
                if let (Some(overlay), true) = (sub.overlay, client.session == session) {
                    let target = TargetId::main(&session);
                    let o = client.timeline.handle_live_update(&target, overlay, now);
                    self.log(|| format!("  {o:?}"));
                }
            }
            (Asked::Join(session), Reply::Replay(chunks))
                if client.joined.as_ref() == Some(&session)
                    && self.connect_request.get(&c) == Some(&to.0) =>
            {
                self.connect_deadline.remove(&c);
                self.apply_replay(c, &chunks);
                // Live events from here on; what happened before the join comes from a
                // new window.
                self.clients[c].timeline.reload(now);
            }
            _ => {}
        }
    }

    /// A phone rebuilds its conversation from a replay: no live side effect may come
    /// out of it but the running state it adopts at the end (RB-04).
    pub(crate) fn apply_replay(&mut self, c: usize, chunks: &[overlay_core::replay::ReplayChunk]) {
        let now = self.now;
        let defect = self.defect(Defect::ReplayAsLive);
        let client = &mut self.clients[c];
        // Effects left from before belong to earlier events.
        while client.conversation.poll_effect().is_some() {}
        let mut outcomes = Vec::new();
        if defect {
            // A broken embedding plays the replay's events on the live path instead of
            // rebuilding from them.
            client.conversation.restart();
        }
        for chunk in chunks {
            if defect {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&chunk.json) {
                    for e in v["events"].as_array().into_iter().flatten() {
                        outcomes.push(client.conversation.handle_live(&e.to_string()));
                    }
                }
                continue;
            }
            outcomes.push(client.conversation.handle_replay_chunk(&chunk.json, now));
        }
        client.replays += 1;
        self.stats.replays += 1;
        let effects: Vec<_> = std::iter::from_fn(|| client.conversation.poll_effect()).collect();
        let mut running_changes = 0;
        let mut bad = Vec::new();
        for e in &effects {
            match e {
                timeline_core::replay::ClientEffect::RunningChanged(_) => running_changes += 1,
                timeline_core::replay::ClientEffect::RequestReplay => {}
                other => bad.push(format!("{other:?}")),
            }
        }
        let complete = outcomes.contains(&timeline_core::replay::ReplayOutcome::Complete);
        self.log(|| {
            format!(
                "  replay of {} chunk(s): {outcomes:?} {effects:?}",
                chunks.len()
            )
        });
        if !bad.is_empty() || running_changes > usize::from(complete) {
            self.violate(
                Invariant::ReplaySideEffect,
                format!("a replay on phone {c} triggered live effects: {effects:?}"),
            );
        }
    }

    /// Records what the checks need of a reply as the host sends it.
    pub(crate) fn note_reply(&mut self, to: ReplyTo, reply: &Reply) {
        let Some(req) = self.requests.get(&to.0) else {
            self.violate(
                Invariant::ReplyTwice,
                format!("a reply nobody asked for: #{}", to.0),
            );
            return;
        };
        if let (Asked::Submit(op), Reply::Submitted(r)) = (&req.asked, reply) {
            let op = op.clone();
            self.check_control(&op, r);
        }
        let Some(req) = self.requests.get(&to.0) else {
            return;
        };
        match (&req.asked, reply) {
            (Asked::Submit(op), Reply::Submitted(Ok(_))) => {
                if let Some(m) = self.messages.get_mut(op) {
                    m.acked = true;
                }
            }
            (Asked::Edit { old, new }, Reply::Edited(Ok(_))) => {
                // An edit replaces whatever the entry carries now (an edit from another
                // device may have come first: the last edit wins).
                let queue = self.messages.get(old).map(|m| m.queue.clone());
                if let Some(queue) = queue {
                    let current = self.queues.get(&queue).cloned();
                    for op in [Some(old.clone()), current].into_iter().flatten() {
                        if let Some(m) = self.messages.get_mut(&op) {
                            m.replaced = true;
                        }
                    }
                    self.queues.insert(queue, new.clone());
                }
                if let Some(m) = self.messages.get_mut(new) {
                    m.acked = true;
                }
            }
            // A store failure leaves the outcome unknown: the removal may have taken.
            (
                Asked::Remove(queue),
                Reply::Done(Ok(()) | Err(outbox_core::custody::ActionError::Store(_))),
            ) => {
                if let Some(op) = self.queues.get(queue).cloned() {
                    if let Some(m) = self.messages.get_mut(&op) {
                        m.removed = true;
                    }
                }
            }
            // Unknown outcome: the edit may have replaced what the entry carried.
            (
                Asked::Edit { old, .. },
                Reply::Edited(Err(outbox_core::custody::ActionError::Store(_))),
            ) => {
                let queue = self.messages.get(old).map(|m| m.queue.clone());
                let current = queue.and_then(|q| self.queues.get(&q).cloned());
                for op in [Some(old.clone()), current].into_iter().flatten() {
                    if let Some(m) = self.messages.get_mut(&op) {
                        m.replaced = true;
                    }
                }
            }
            _ => {}
        }
    }

    /// The host's answer to a replace latest (OB-04): Codex takes it; Claude refuses it
    /// with the typed error, and the message is not in its outbox (the user keeps it:
    /// nothing was taken into custody).
    pub(crate) fn check_control(
        &mut self,
        op: &OperationId,
        r: &Result<outbox_core::Receipt, outbox_core::custody::SubmitError>,
    ) {
        use outbox_core::custody::{SubmitError, ValidationError};
        let Some(m) = self.messages.get(op) else {
            return;
        };
        if m.controls.intent != Intent::ReplaceLatest {
            return;
        }
        let session = m.session.clone();
        let codex = self.sessions.iter().any(|s| s.id == session && s.codex);
        let refused = matches!(
            r,
            Err(SubmitError::Invalid(ValidationError::Unsupported(
                "replace-latest"
            )))
        );
        let wrong = match r {
            // A store failure says nothing yet: the client sends it again.
            Err(SubmitError::Store(_)) => None,
            // Codex: taken; a conflict (an operation sent again after its removal) is
            // about the operation, not the control.
            Ok(_) | Err(SubmitError::Conflict(_)) if codex => None,
            Ok(_) => Some(format!(
                "{session} (Claude) admitted the replace latest {op}"
            )),
            Err(_) if refused && !codex => {
                if let Some(m) = self.messages.get_mut(op) {
                    self.stats.replace_refused += u64::from(!m.refused);
                    m.refused = true;
                }
                let queued = self.stores.entries(&session).is_ok_and(|entries| {
                    entries
                        .iter()
                        .filter_map(|e| e.entry())
                        .any(|e| &e.operation_id == op)
                });
                queued.then(|| {
                    format!("{session} refused the replace latest {op}, yet its outbox holds it")
                })
            }
            Err(e) => Some(format!(
                "{session} ({}) answered the replace latest {op} with {e:?}",
                if codex { "Codex" } else { "Claude" }
            )),
        };
        if let Some(w) = wrong {
            self.violate(Invariant::UnsupportedControl, w);
        }
    }

    pub(crate) fn route_delivery(&mut self, delivery: Delivery) {
        match &delivery {
            Delivery::Window { window, .. } | Delivery::WindowPatch { window, .. } => {
                let Some(d) = self
                    .clients
                    .iter()
                    .position(|c| c.kind == Kind::Desktop && c.window == *window)
                else {
                    return;
                };
                if matches!(
                    &delivery,
                    Delivery::Window {
                        payload: Payload::Run(_),
                        ..
                    }
                ) {
                    return;
                }
                let delay = self.rng.range(0, 5);
                let at = self.now.saturating_add(millis(delay));
                self.net.send_ordered(
                    WINDOW_STREAM + d as u64,
                    at,
                    Event::Window {
                        desktop: d,
                        delivery,
                    },
                );
            }
            Delivery::Relay(event) => {
                let kind = event.json["event"].as_str().unwrap_or("?").to_owned();
                self.log(|| format!("relay {kind} for {}", event.session));
                for p in 0..self.clients.len() {
                    if self.clients[p].kind != Kind::Phone
                        || self.clients[p].joined.as_ref() != Some(&event.session)
                    {
                        continue;
                    }
                    if self.strike(FaultKind::RelayDrop) {
                        if let Some(v) = relay_version(&event.json) {
                            let lost = &mut self.clients[p].relay_lost;
                            *lost = Some(lost.map_or(v, |l| l.max(v)));
                        }
                        self.log(|| format!("  dropped for p{p}"));
                        continue;
                    }
                    let copies = if self.strike(FaultKind::RelayDuplicate) {
                        2
                    } else {
                        1
                    };
                    for _ in 0..copies {
                        let delay = if self.strike(FaultKind::RelayDelay) {
                            self.rng.range(200, 20_000)
                        } else {
                            self.rng.range(1, 30)
                        };
                        self.net.send(
                            self.now.saturating_add(millis(delay)),
                            Event::Relay {
                                phone: p,
                                json: event.json.clone(),
                            },
                        );
                    }
                }
            }
            _ => {}
        }
    }

    pub(crate) fn client_effect(&mut self, c: usize, effect: TimelineEffect) {
        let session = self.clients[c].session.clone();
        match effect {
            TimelineEffect::LoadLatestWindow { tag, page_size, .. } => {
                let request = ClientRequest::LatestWindow {
                    session,
                    target: tag.target.clone(),
                    page_size,
                };
                self.request(c, Asked::Latest(tag), request);
            }
            TimelineEffect::LoadOlderPage {
                tag,
                cursor,
                page_size,
                expected_boundary_token,
            } => {
                let request = ClientRequest::OlderPage {
                    session,
                    target: tag.target.clone(),
                    cursor,
                    page_size,
                    expected_boundary_token,
                };
                self.request(c, Asked::Older(tag), request);
            }
            TimelineEffect::LoadAnchored { tag, anchor, .. } => {
                let request = ClientRequest::Anchored {
                    session,
                    target: tag.target.clone(),
                    anchor,
                };
                self.request(c, Asked::Anchored(tag), request);
            }
            TimelineEffect::ReceiptOverdue { operation_id } => {
                // The phone could not confirm the host saved it: it sends the same
                // message again (same operation, same content).
                let again = self.messages.get(&operation_id).map(|m| SubmitRequest {
                    session: m.session.clone(),
                    queue_id: m.queue.clone(),
                    operation_id: operation_id.clone(),
                    request: m.request.clone(),
                    controls: m.controls.clone(),
                });
                if let (Some(again), true) = (again, self.clients[c].session == session) {
                    self.clients[c]
                        .timeline
                        .await_receipt(&operation_id, self.now);
                    self.request(c, Asked::Submit(operation_id), ClientRequest::Submit(again));
                }
            }
            _ => {}
        }
    }

    pub(crate) fn relay_arrives(&mut self, p: usize, json: &serde_json::Value) {
        self.stats.relay_events += 1;
        let now = self.now;
        let defect = self.cfg.defect;
        let client = &mut self.clients[p];
        let event = json["event"].as_str().unwrap_or_default();
        let target = json["timelineTargetId"]
            .as_str()
            .and_then(|t| TargetId::new(t).ok());
        let mine = target.as_ref() == Some(&client.target());
        if let (true, Some(v), Some(lost)) = (mine, relay_version(json), client.relay_lost) {
            if v >= lost {
                client.relay_lost = None;
            }
        }
        let o = match (event, target) {
            ("blocks", Some(t)) => {
                serde_json::from_value::<LiveOverlay>(json["liveOverlay"].clone())
                    .ok()
                    .map(|o| {
                        if mine {
                            client.offer((o.settlement_epoch, o.revision));
                        }
                        client.timeline.handle_live_update(&t, o, now)
                    })
            }
            ("blocks-patch", Some(t)) => {
                serde_json::from_value::<LivePatch>(json["livePatch"].clone())
                    .ok()
                    .map(|mut patch| {
                        if mine {
                            client.offer((patch.settlement_epoch, patch.revision));
                        }
                        if defect == Some(Defect::PatchOnAnyBase) {
                            rebase(&client.timeline, &mut patch);
                        }
                        client.timeline.handle_live_patch(&t, patch, now)
                    })
            }
            _ => None,
        };
        if let Some(o) = o {
            self.log(|| format!("p{p} relay {event} {o:?}"));
        }
    }

    /// A join must not make the host do anything live: no agent call (RB-04, the host's
    /// side).
    pub(crate) fn check_join_effects(&mut self) {
        let Some(host) = self.host.as_mut() else {
            return;
        };
        let effects: Vec<HostEffect> = std::iter::from_fn(|| host.poll_effect()).collect();
        if let Some(call) = effects.iter().find_map(|e| match e {
            HostEffect::Agent(call) => Some(call.clone()),
            _ => None,
        }) {
            self.violate(
                Invariant::ReplaySideEffect,
                format!("a join made the host call the agent: {}", call_line(&call)),
            );
        }
        for e in effects {
            self.host_effect(e);
        }
    }

    /// A new message from client `c` with `controls`.
    pub(crate) fn send_message(&mut self, c: usize, controls: Controls) {
        self.next_op += 1;
        let n = self.next_op;
        let (Ok(op), Ok(queue)) = (
            OperationId::new(format!("op-{n}")),
            QueueId::new(format!("q-{n}")),
        ) else {
            return;
        };
        let session = self.clients[c].session.clone();
        let text = format!("message {n}");
        let source = match self.clients[c].kind {
            Kind::Desktop => "composer",
            Kind::Phone => "phone",
        };
        let mut request = MessageRequest::text(text.clone(), source, self.now);
        // Replace latest goes with `rollbackBeforeSend` (OB-04).
        request.rollback_before_send = controls.intent == Intent::ReplaceLatest;
        self.stats.messages += 1;
        self.stats.replace_latest += u64::from(request.rollback_before_send);
        self.messages.insert(
            op.clone(),
            Message {
                session: session.clone(),
                queue: queue.clone(),
                request: request.clone(),
                controls: controls.clone(),
                acked: false,
                removed: false,
                replaced: false,
                refused: false,
            },
        );
        self.queues.insert(queue.clone(), op.clone());
        let now = self.now;
        let client = &mut self.clients[c];
        client.timeline.add_pending(PendingSend {
            operation_id: op.clone(),
            created_at: now,
            data: serde_json::json!({ "text": text }),
        });
        client.timeline.await_receipt(&op, now);
        if self.cfg.defect == Some(Defect::EndlessTimer) {
            // A broken embedding gives the timeline a time at the end of all time.
            client.timeline.await_receipt(&op, Millis(u64::MAX - 1));
        }
        if client.kind == Kind::Phone {
            client.conversation.send(op.as_str(), &text);
        }
        client.mine.insert(
            op.clone(),
            Mine {
                queue: queue.clone(),
                echo: Echo::Awaiting,
            },
        );
        if self.defect(Defect::DropEcho) {
            // A broken embedding drops the echo as soon as the message is sent.
            self.clients[c].timeline.remove_pending(&op);
        }
        self.request(
            c,
            Asked::Submit(op.clone()),
            ClientRequest::Submit(SubmitRequest {
                session,
                queue_id: queue,
                operation_id: op,
                request,
                controls,
            }),
        );
    }

    /// Client `c` switches to the other session.
    pub(crate) fn switch_session(&mut self, c: usize) {
        let others: Vec<SessionId> = self
            .sessions
            .iter()
            .map(|s| s.id.clone())
            .filter(|s| *s != self.clients[c].session)
            .collect();
        if others.is_empty() {
            return;
        }
        let session = others[self.rng.index(others.len())].clone();
        self.log(|| format!("client {c} opens {session}"));
        if self.clients[c].kind == Kind::Phone {
            if let Some(old) = self.clients[c].joined.take() {
                self.request(c, Asked::Leave, ClientRequest::Leave { session: old });
            }
            let relay = self
                .sessions
                .iter()
                .find(|s| s.id == session)
                .map_or(LiveProtocol::Snapshots, |s| s.relay);
            self.clients[c].protocol = relay;
        }
        let client = &mut self.clients[c];
        client.session = session.clone();
        client.mine.clear();
        // What the live path brought and lost was of the old target.
        client.offered = None;
        client.relay_lost = None;
        client.conversation.restart();
        let target = client.target();
        client.timeline.open_target(target, self.now);
        self.connect(c);
    }

    /// Client `c` jumps to a saved row of its session.
    pub(crate) fn jump(&mut self, c: usize) {
        let session = self.clients[c].session.clone();
        let Some(s) = self.sessions.iter().find(|s| s.id == session) else {
            return;
        };
        let blocks = s.transcript.blocks();
        if blocks.is_empty() {
            return;
        }
        let key: BlockKey = blocks[self.rng.index(blocks.len())].key();
        let now = self.now;
        let r = self.clients[c]
            .timeline
            .load_anchored(Anchor::row(&key), now);
        self.log(|| format!("client {c} jumps to {} ({r:?})", key.id));
    }

    /// The host's view of the client's load state, for traces.
    pub(crate) fn load_states(&self) -> Vec<LoadState> {
        self.clients
            .iter()
            .map(|c| c.timeline.load_state().clone())
            .collect()
    }
}
