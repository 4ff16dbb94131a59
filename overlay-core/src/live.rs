//! Live delivery (OV-07 to OV-09): one emit entry point feeding three sinks, routed by
//! payload kind as the seed's table says.
//!
//! | payload | window stream (`chat:stream`) | progress (`chat:progress`) | relay (`chat:timeline-updated`) |
//! |---|---|---|---|
//! | `blocks` | windows subscribed to that target, coalesced 50 ms | no | yes, at once |
//! | `started`/`completed`/`failed`/`aborted` | every window | yes | yes (`failed` with `agentErrorInfo`) |
//! | `runtime` | every window | no | yes |
//! | `agent-threads` | every window | no | yes |
//!
//! - Window stream: a snapshot for a target starts a 50 ms timer; a newer snapshot for
//!   that target replaces the waiting one; at most 128 targets wait, and one more target
//!   sends them all at once; a run event sends the waiting snapshots first. Every event a
//!   window gets carries its `subscriptionId` and a `streamRevision` shared by all
//!   windows. Subscribing returns the saved overlay, so a window starts complete.
//! - Relay: only for sessions where a phone holds interest; never coalesced; a `blocks`
//!   payload must carry a `liveOverlay` with exactly `settlementEpoch`, `revision` and
//!   `blocks`, a revision above 0, and both numbers inside the exact-integer range.
//! - Relay repair: every 5 s while a run of the session is active, each target that had
//!   no new write since the last tick has its saved overlay sent again, to the relay only.
//!   The timer is armed by the first snapshot emitted during the run.
//! - `agent-threads`: the first signal of a session goes at once, then at most one more at
//!   the end of a 1-second window.
//!
//! The producer saves an overlay before it emits it, so every `blocks` payload is a whole
//! saved snapshot: a client that missed events recovers everything from the next one.
//! The per-write cost depends on the windows subscribed to the written target, not on
//! the number of idle targets.
//!
//! # Drive loop
//!
//! ```
//! use overlay_core::live::{LiveHub, Payload, Delivery, WindowId};
//! use overlay_core::store::memory::MemoryOverlayStore;
//! use timeline_core::key::{SessionId, TargetId};
//! use timeline_core::time::Millis;
//! use timeline_core::wire::LiveOverlay;
//!
//! let mut store = MemoryOverlayStore::new();
//! let (s, t) = (SessionId::new("s").unwrap(), TargetId::new("s").unwrap());
//! let mut hub = LiveHub::new();
//! let sub = hub.subscribe(&mut store, WindowId(1), &s, &t).unwrap();
//! let overlay = LiveOverlay { settlement_epoch: 0, revision: 1, blocks: vec![] };
//! hub.emit(Payload::Blocks { session: s, target: t, overlay }, Millis(0));
//! assert!(hub.poll_delivery().is_none(), "coalesced for 50 ms");
//! let at = hub.poll_timeout().unwrap();
//! hub.handle_timeout(at);
//! assert!(matches!(hub.poll_delivery(), Some(Delivery::Window { subscription_id, .. }) if subscription_id == sub.subscription_id));
//! ```

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use serde::Serialize;
use timeline_core::key::{OperationId, RunId, SessionId, TargetId};
use timeline_core::policy::MAX_EXACT_INTEGER;
use timeline_core::time::Millis;
use timeline_core::wire::LiveOverlay;

use crate::store::{OverlayStore, StoreError};

/// How long a snapshot waits for a newer one before a window gets it.
pub const COALESCE_WINDOW: Millis = Millis(50);
/// Targets that may wait at once; one more sends them all.
pub const MAX_WAITING_TARGETS: usize = 128;
/// The relay repair tick.
pub const RELAY_REPAIR_INTERVAL: Millis = Millis(5_000);
/// The `agent-threads` throttle window.
pub const AGENT_THREADS_WINDOW: Millis = Millis(1_000);

/// A desktop window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WindowId(pub u64);

/// The kind of a run event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RunEventKind {
    /// The run started.
    Started,
    /// The run completed.
    Completed,
    /// The run failed.
    Failed,
    /// The run was stopped.
    Aborted,
}

/// A run event, with the fields the progress sink carries.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunEvent {
    /// Which event.
    pub event: RunEventKind,
    /// The app session.
    pub app_session_id: SessionId,
    /// The run.
    pub run_id: RunId,
    /// When it happened.
    pub timestamp: Millis,
    /// The operation that started the run, if any.
    pub operation_id: Option<OperationId>,
    /// Why it failed (`failed` only; the relay carries it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_error_info: Option<serde_json::Value>,
}

/// What a producer emits.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Payload {
    /// The whole saved overlay of one target after a write.
    Blocks {
        /// Session.
        session: SessionId,
        /// Target.
        target: TargetId,
        /// The saved snapshot.
        overlay: LiveOverlay,
    },
    /// A run event.
    Run(RunEvent),
    /// A runtime event of a session.
    Runtime {
        /// Session.
        session: SessionId,
        /// The event.
        data: serde_json::Value,
    },
    /// The agents list of a session changed.
    AgentThreads {
        /// Session.
        session: SessionId,
        /// When.
        timestamp: Millis,
    },
}

impl Payload {
    fn session(&self) -> &SessionId {
        match self {
            Payload::Blocks { session, .. }
            | Payload::Runtime { session, .. }
            | Payload::AgentThreads { session, .. } => session,
            Payload::Run(e) => &e.app_session_id,
        }
    }
}

/// One event for the relay (`chat:timeline-updated`), as JSON.
#[derive(Clone, Debug, PartialEq)]
pub struct RelayEvent {
    /// The session it is for.
    pub session: SessionId,
    /// The payload JSON (`event`, `appSessionId`, ...).
    pub json: serde_json::Value,
}

/// Where one delivery goes.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Delivery {
    /// `chat:stream` to one desktop window.
    Window {
        /// The window.
        window: WindowId,
        /// Its subscription.
        subscription_id: u64,
        /// The shared stream counter.
        stream_revision: u64,
        /// What it gets.
        payload: Payload,
    },
    /// `chat:progress`.
    Progress(RunEvent),
    /// `chat:timeline-updated` to the relay.
    Relay(RelayEvent),
}

/// Why the relay refused a payload.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// `liveOverlay` is not an object of exactly the three fields.
    #[error("liveOverlay must have exactly settlementEpoch, revision and blocks")]
    Fields,
    /// The revision is 0.
    #[error("liveOverlay.revision must be above 0")]
    ZeroRevision,
    /// A number past 2^53 - 1 or not an integer.
    #[error("liveOverlay numbers must be exact integers")]
    NotExact,
}

/// Checks the `liveOverlay` of a relay `blocks` payload.
pub fn validate_relay_overlay(overlay: &serde_json::Value) -> Result<(), RelayError> {
    let obj = overlay.as_object().ok_or(RelayError::Fields)?;
    let fields: HashSet<&str> = obj.keys().map(String::as_str).collect();
    if fields != HashSet::from(["settlementEpoch", "revision", "blocks"])
        || !obj["blocks"].is_array()
    {
        return Err(RelayError::Fields);
    }
    let exact = |v: &serde_json::Value| v.as_u64().filter(|n| *n <= MAX_EXACT_INTEGER);
    exact(&obj["settlementEpoch"]).ok_or(RelayError::NotExact)?;
    let revision = exact(&obj["revision"]).ok_or(RelayError::NotExact)?;
    if revision == 0 {
        return Err(RelayError::ZeroRevision);
    }
    Ok(())
}

/// What happened to a payload at the relay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RelayOutcome {
    /// Sent.
    Sent,
    /// No phone holds interest in the session.
    NoInterest,
    /// The payload failed validation and was not sent.
    Rejected(RelayError),
    /// Held back by the agent-threads throttle.
    Throttled,
}

/// A window's subscription, with the saved overlay it starts from.
#[derive(Clone, Debug, PartialEq)]
pub struct Subscription {
    /// Tags every event the window gets.
    pub subscription_id: u64,
    /// The saved overlay of the target.
    pub overlay: Option<LiveOverlay>,
}

#[derive(Debug, Default)]
struct TargetState {
    /// The last saved snapshot emitted.
    last: Option<LiveOverlay>,
    /// A write happened since the last repair tick.
    written: bool,
}

#[derive(Debug, Default)]
struct Throttle {
    window_end: Option<Millis>,
    pending: Option<Payload>,
}

/// The live delivery machine. See the module docs.
#[derive(Debug, Default)]
pub struct LiveHub {
    next_subscription: u64,
    stream_revision: u64,
    /// window -> (subscription id, session, target)
    windows: BTreeMap<WindowId, (u64, SessionId, TargetId)>,
    /// target -> windows subscribed to it
    by_target: HashMap<(SessionId, TargetId), Vec<WindowId>>,
    /// Waiting snapshots: target -> (snapshot, due), and arrival order.
    waiting: HashMap<(SessionId, TargetId), (LiveOverlay, Millis)>,
    waiting_order: VecDeque<(SessionId, TargetId)>,
    phone_interest: HashSet<SessionId>,
    /// Sessions with an active run -> next repair tick.
    active_runs: HashMap<SessionId, Option<Millis>>,
    targets: HashMap<(SessionId, TargetId), TargetState>,
    throttles: HashMap<SessionId, Throttle>,
    out: VecDeque<Delivery>,
}

impl LiveHub {
    /// A hub with no windows and no interest.
    pub fn new() -> Self {
        Self::default()
    }

    /// Subscribes `window` to one target (replacing its previous subscription) and
    /// returns the saved overlay to start from.
    pub fn subscribe<S: OverlayStore + ?Sized>(
        &mut self,
        store: &mut S,
        window: WindowId,
        session: &SessionId,
        target: &TargetId,
    ) -> Result<Subscription, StoreError> {
        let saved = store.load(session, target)?.map(|o| o.client_form());
        self.unsubscribe(window);
        self.next_subscription += 1;
        let id = self.next_subscription;
        self.windows
            .insert(window, (id, session.clone(), target.clone()));
        self.by_target
            .entry((session.clone(), target.clone()))
            .or_default()
            .push(window);
        Ok(Subscription {
            subscription_id: id,
            overlay: saved,
        })
    }

    /// Ends a window's subscription (the window still gets run events).
    pub fn unsubscribe(&mut self, window: WindowId) {
        if let Some((_, s, t)) = self.windows.remove(&window) {
            if let Some(v) = self.by_target.get_mut(&(s.clone(), t.clone())) {
                v.retain(|w| *w != window);
                if v.is_empty() {
                    self.by_target.remove(&(s, t));
                }
            }
        }
    }

    /// A phone holds (or dropped) interest in a session.
    pub fn set_phone_interest(&mut self, session: &SessionId, interested: bool) {
        if interested {
            self.phone_interest.insert(session.clone());
        } else {
            self.phone_interest.remove(session);
        }
    }

    /// The one emit entry point. Returns what happened at the relay.
    pub fn emit(&mut self, payload: Payload, now: Millis) -> RelayOutcome {
        if let Payload::AgentThreads { session, .. } = &payload {
            let th = self.throttles.entry(session.clone()).or_default();
            if th.window_end.is_some_and(|end| now < end) {
                th.pending = Some(payload);
                return RelayOutcome::Throttled;
            }
            th.window_end = Some(now.saturating_add(AGENT_THREADS_WINDOW));
        }
        self.route(payload, now)
    }

    fn route(&mut self, payload: Payload, now: Millis) -> RelayOutcome {
        match &payload {
            Payload::Blocks {
                session,
                target,
                overlay,
            } => {
                let k = (session.clone(), target.clone());
                let state = self.targets.entry(k.clone()).or_default();
                state.last = Some(overlay.clone());
                state.written = true;
                if let Some(tick) = self.active_runs.get_mut(session) {
                    tick.get_or_insert(now.saturating_add(RELAY_REPAIR_INTERVAL));
                }
                if self.by_target.contains_key(&k) {
                    self.enqueue_snapshot(k, overlay.clone(), now);
                }
            }
            Payload::Run(event) => {
                self.flush_waiting();
                match event.event {
                    RunEventKind::Started => {
                        self.active_runs.insert(event.app_session_id.clone(), None);
                    }
                    _ => {
                        self.active_runs.remove(&event.app_session_id);
                    }
                }
                self.out.push_back(Delivery::Progress(RunEvent {
                    agent_error_info: None,
                    ..event.clone()
                }));
                self.deliver_to_every_window(&payload);
            }
            Payload::Runtime { .. } | Payload::AgentThreads { .. } => {
                self.deliver_to_every_window(&payload)
            }
        }
        self.relay(&payload)
    }

    fn enqueue_snapshot(&mut self, k: (SessionId, TargetId), overlay: LiveOverlay, now: Millis) {
        if let Some(w) = self.waiting.get_mut(&k) {
            w.0 = overlay; // a newer snapshot replaces the waiting one; the timer stays
            return;
        }
        if self.waiting.len() >= MAX_WAITING_TARGETS {
            self.flush_waiting();
            self.deliver_snapshot(&k, overlay);
            return;
        }
        self.waiting
            .insert(k.clone(), (overlay, now.saturating_add(COALESCE_WINDOW)));
        self.waiting_order.push_back(k);
    }

    fn flush_waiting(&mut self) {
        while let Some(k) = self.waiting_order.pop_front() {
            if let Some((overlay, _)) = self.waiting.remove(&k) {
                self.deliver_snapshot(&k, overlay);
            }
        }
    }

    fn deliver_snapshot(&mut self, k: &(SessionId, TargetId), overlay: LiveOverlay) {
        let windows = self.by_target.get(k).cloned().unwrap_or_default();
        for w in windows {
            let Some((sub, _, _)) = self.windows.get(&w) else {
                continue;
            };
            self.stream_revision += 1;
            self.out.push_back(Delivery::Window {
                window: w,
                subscription_id: *sub,
                stream_revision: self.stream_revision,
                payload: Payload::Blocks {
                    session: k.0.clone(),
                    target: k.1.clone(),
                    overlay: overlay.clone(),
                },
            });
        }
    }

    fn deliver_to_every_window(&mut self, payload: &Payload) {
        let windows: Vec<(WindowId, u64)> = self
            .windows
            .iter()
            .map(|(w, (sub, _, _))| (*w, *sub))
            .collect();
        for (w, sub) in windows {
            self.stream_revision += 1;
            self.out.push_back(Delivery::Window {
                window: w,
                subscription_id: sub,
                stream_revision: self.stream_revision,
                payload: payload.clone(),
            });
        }
    }

    fn relay(&mut self, payload: &Payload) -> RelayOutcome {
        let session = payload.session();
        if !self.phone_interest.contains(session) {
            return RelayOutcome::NoInterest;
        }
        let json = match relay_json(payload) {
            Ok(json) => json,
            Err(e) => return RelayOutcome::Rejected(e),
        };
        self.out.push_back(Delivery::Relay(RelayEvent {
            session: session.clone(),
            json,
        }));
        RelayOutcome::Sent
    }

    /// The next delivery to carry out.
    #[must_use]
    pub fn poll_delivery(&mut self) -> Option<Delivery> {
        self.out.pop_front()
    }

    /// The next deadline: a waiting snapshot, a repair tick, or the end of a throttle
    /// window with a signal held back.
    pub fn poll_timeout(&self) -> Option<Millis> {
        let coalesce = self
            .waiting_order
            .front()
            .and_then(|k| self.waiting.get(k))
            .map(|(_, due)| *due);
        let repair = self.active_runs.values().flatten().min().copied();
        let throttle = self
            .throttles
            .values()
            .filter(|t| t.pending.is_some())
            .filter_map(|t| t.window_end)
            .min();
        [coalesce, repair, throttle].into_iter().flatten().min()
    }

    /// Handles every deadline that passed. Safe to call early or twice.
    pub fn handle_timeout(&mut self, now: Millis) {
        while let Some(k) = self.waiting_order.front().cloned() {
            match self.waiting.get(&k) {
                Some((_, due)) if *due <= now => {
                    self.waiting_order.pop_front();
                    if let Some((overlay, _)) = self.waiting.remove(&k) {
                        self.deliver_snapshot(&k, overlay);
                    }
                }
                Some(_) => break,
                None => {
                    self.waiting_order.pop_front();
                }
            }
        }
        let due: Vec<SessionId> = self
            .active_runs
            .iter()
            .filter(|(_, tick)| tick.is_some_and(|t| t <= now))
            .map(|(s, _)| s.clone())
            .collect();
        for session in due {
            self.repair(&session, now);
        }
        let ready: Vec<SessionId> = self
            .throttles
            .iter()
            .filter(|(_, t)| t.pending.is_some() && t.window_end.is_some_and(|e| e <= now))
            .map(|(s, _)| s.clone())
            .collect();
        for session in ready {
            let payload = self.throttles.get_mut(&session).and_then(|t| {
                t.window_end = Some(now.saturating_add(AGENT_THREADS_WINDOW));
                t.pending.take()
            });
            if let Some(p) = payload {
                self.route(p, now);
            }
        }
    }

    /// Relay repair (OV-08): resend the saved overlay of every target of the session that
    /// had no write since the last tick, to the relay only.
    fn repair(&mut self, session: &SessionId, now: Millis) {
        if let Some(tick) = self.active_runs.get_mut(session) {
            *tick = Some(now.saturating_add(RELAY_REPAIR_INTERVAL));
        }
        let mut resend = Vec::new();
        for ((s, t), state) in self.targets.iter_mut() {
            if s != session {
                continue;
            }
            if !state.written {
                if let Some(o) = &state.last {
                    resend.push((t.clone(), o.clone()));
                }
            }
            state.written = false;
        }
        resend.sort_by(|a, b| a.0.cmp(&b.0));
        for (target, overlay) in resend {
            self.relay(&Payload::Blocks {
                session: session.clone(),
                target,
                overlay,
            });
        }
    }
}

/// The relay JSON of a payload; `blocks` payloads are validated.
fn relay_json(payload: &Payload) -> Result<serde_json::Value, RelayError> {
    let json = match payload {
        Payload::Blocks {
            session,
            target,
            overlay,
        } => {
            let overlay = serde_json::to_value(overlay).map_err(|_| RelayError::Fields)?;
            validate_relay_overlay(&overlay)?;
            serde_json::json!({
                "event": "blocks",
                "appSessionId": session,
                "timelineTargetId": target,
                "liveOverlay": overlay,
            })
        }
        Payload::Run(e) => {
            let mut e = e.clone();
            if e.event != RunEventKind::Failed {
                e.agent_error_info = None;
            }
            serde_json::to_value(e).map_err(|_| RelayError::Fields)?
        }
        Payload::Runtime { session, data } => serde_json::json!({
            "event": "runtime",
            "appSessionId": session,
            "data": data,
        }),
        Payload::AgentThreads { session, timestamp } => serde_json::json!({
            "event": "agent-threads",
            "appSessionId": session,
            "timestamp": timestamp,
            "threadId": null,
        }),
    };
    Ok(json)
}
