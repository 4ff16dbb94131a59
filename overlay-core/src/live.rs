//! Live delivery (OV-07 to OV-09): one emit entry point feeding three sinks, routed by
//! payload kind as the seed's table says, with live patches as a negotiated extension.
//!
//! | payload | window stream (`chat:stream`) | progress (`chat:progress`) | relay (`chat:timeline-updated`) |
//! |---|---|---|---|
//! | `blocks` | windows subscribed to that target, coalesced 50 ms | no | yes, at once |
//! | `started`/`completed`/`failed`/`aborted` | every window | yes | yes (`failed` with `agentErrorInfo`) |
//! | `runtime` | every window | no | yes |
//! | `agent-threads` | every window | no | yes |
//!
//! - Window stream: a snapshot for a target starts a 50 ms timer; a newer snapshot for
//!   that target replaces the waiting one, newer meaning a higher settlement epoch, or a
//!   higher revision in the same epoch (an older snapshot that arrives later is dropped,
//!   so the window gets the newest whatever the arrival order); at most 128 targets
//!   wait, and one more target
//!   sends them all at once; a run event sends the waiting snapshots first. Every event a
//!   window gets carries its `subscriptionId` and a `streamRevision` shared by all
//!   windows. Subscribing returns the saved overlay, so a window starts complete.
//! - Relay: only for sessions where a phone holds interest; never coalesced; a `blocks`
//!   payload must carry a `liveOverlay` with exactly `settlementEpoch`, `revision` and
//!   `blocks`, a revision above 0, and both numbers inside the exact-integer range.
//! - Relay repair: every 5 s while a run of the session is active, each target that had
//!   no new write since the last tick has its newest saved overlay sent again, to the
//!   relay only. The timer is armed by the first snapshot emitted during the run, and the
//!   first tick counts from there: a target written before (between runs, or in an
//!   earlier run) and quiet since is resent at the first tick.
//! - `agent-threads`: the first signal of a session goes at once, then at most one more at
//!   the end of a 1-second window. A signal that goes out (at the window's end, or at once
//!   when it arrives after the window ended) stands for any signal held back before it,
//!   which is dropped: no signal ever follows a newer one.
//!
//! # A target deleted and written again
//!
//! Every comparison here (coalescing, what a recipient holds, what repair resends) orders
//! one target's snapshots by `(settlementEpoch, revision)`, as clients do (TL-06). That is
//! a total order over a target's whole life only because epochs never start over: a
//! target written again after a delete starts one epoch above the one it was deleted at
//! ([`crate::store::created_epoch`], kept by every store). Had it restarted at 0, the
//! hub would take its snapshots for older ones, and a client still holding the old
//! target's epoch would ignore them as stale until it opened the target anew; with the
//! higher epoch the client keeps its rows and reloads a latest window, which carries the
//! new overlay. Telling clients "this target is new" instead would need a field or an
//! event that the seed's clients do not know, so the existing epoch fence is used.
//!
//! The producer saves an overlay before it emits it, so every `blocks` payload is a whole
//! saved snapshot: a client that missed events recovers everything from the next one.
//! The per-write cost depends on the windows subscribed to the written target, not on
//! the number of idle targets.
//!
//! # Live patches (`docs/live-patches.md`)
//!
//! A recipient that negotiated [`LiveProtocol::Patches`] (a window through
//! [`LiveHub::subscribe_with`], a session's relay through [`LiveHub::set_relay_protocol`])
//! may get a [`LivePatch`] instead of a whole snapshot: `blocks-patch` with `livePatch`
//! on the relay, [`Delivery::WindowPatch`] on the window stream. Every other recipient
//! gets exactly the seed's snapshots. The hub sends a patch only from a snapshot it knows
//! the recipient holds: one it sent there (whole or by patch) in the same epoch, with
//! nothing lost since as far as it can tell. It forgets that base when a delivery was
//! refused or reported lost ([`LiveHub::report_lost`]), when interest or the protocol
//! changed, and after a snapshot that raised the epoch (the recipient reloads, so its
//! base is unknown). A patch that would carry as many rows as the snapshot goes whole.
//!
//! On the relay a patch goes only while a run of the session is active, because relay
//! repair is what heals a phone that lost one (it refuses the next patches and keeps its
//! rows): for a patching relay the tick resends every target whose newest relay event
//! since the last tick was not a whole snapshot, quiet or not, and a run's end sends a
//! whole snapshot of every target patched since its last one. Repair always sends whole
//! snapshots. A session whose relay speaks snapshots sees exactly the seed's behaviour.
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
//! hub.handle_payload(Payload::Blocks { session: s, target: t, overlay }, Millis(0));
//! assert!(hub.poll_effect().is_none(), "coalesced for 50 ms");
//! let at = hub.poll_timeout().unwrap();
//! hub.handle_timeout(at);
//! assert!(matches!(hub.poll_effect(), Some(Delivery::Window { subscription_id, .. }) if subscription_id == sub.subscription_id));
//! // A delivery the embedding could not carry out (or whose recipient refused a patch)
//! // is reported, so the next one for that recipient is a whole snapshot:
//! // hub.report_lost(&delivery);
//! ```

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use serde::Serialize;
use timeline_core::key::{OperationId, RunId, SessionId, TargetId};
use timeline_core::policy::MAX_EXACT_INTEGER;
use timeline_core::time::Millis;
use timeline_core::wire::{LiveOverlay, LivePatch};

use crate::store::{OverlayError, OverlayStore};

/// How long a snapshot waits for a newer one before a window gets it.
pub const COALESCE_WINDOW: Millis = Millis(50);
/// Targets that may wait at once; one more sends them all.
pub const MAX_WAITING_TARGETS: usize = 128;
/// The relay repair tick.
pub const RELAY_REPAIR_INTERVAL: Millis = Millis(5_000);
/// The `agent-threads` throttle window.
pub const AGENT_THREADS_WINDOW: Millis = Millis(1_000);
/// The relay event name of a live patch (the seed's snapshots are `blocks`).
pub const BLOCKS_PATCH_EVENT: &str = "blocks-patch";

/// A desktop window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WindowId(pub u64);

/// How a recipient takes `blocks` updates, as negotiated with it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum LiveProtocol {
    /// Whole snapshots only: the seed's protocol, and the default.
    #[default]
    Snapshots,
    /// Whole snapshots, and patches from a snapshot the recipient is known to hold.
    Patches,
}

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

/// The relay `event` of [`Payload::SessionEvent`].
pub const SESSION_EVENT: &str = "session-event";

/// What a producer emits.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Payload {
    /// The whole saved overlay of one target after a write.
    Blocks {
        /// The app session it concerns.
        session: SessionId,
        /// The timeline target it concerns.
        target: TargetId,
        /// The saved snapshot.
        overlay: LiveOverlay,
    },
    /// A run event.
    Run(RunEvent),
    /// A runtime event of a session.
    Runtime {
        /// The app session it concerns.
        session: SessionId,
        /// The event.
        data: serde_json::Value,
    },
    /// One logged event of a session (a streamed fragment), live and scalar: to the
    /// windows of the session and to the relay ([`SESSION_EVENT`], with the log's ID so
    /// a client never joins the numbers of two logs).
    SessionEvent {
        /// The app session it concerns.
        session: SessionId,
        /// The log the event's `seq` belongs to.
        log_id: String,
        /// The event.
        event: timeline_core::history::SessionEvent,
    },
    /// The agents list of a session changed.
    AgentThreads {
        /// The app session it concerns.
        session: SessionId,
        /// When it happened.
        timestamp: Millis,
    },
}

impl Payload {
    fn session(&self) -> &SessionId {
        match self {
            Payload::Blocks { session, .. }
            | Payload::Runtime { session, .. }
            | Payload::SessionEvent { session, .. }
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

impl RelayEvent {
    /// Whether it carries one streamed fragment ([`SESSION_EVENT`]): kept out of the
    /// replay, and sent only to the phones that asked for fragments.
    pub fn is_session_event(&self) -> bool {
        self.json.get("event").and_then(serde_json::Value::as_str) == Some(SESSION_EVENT)
    }
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
    /// `chat:stream` to one desktop window that negotiated [`LiveProtocol::Patches`]: the
    /// changes from the snapshot it holds to the newest one of its target.
    WindowPatch {
        /// The window.
        window: WindowId,
        /// Its subscription.
        subscription_id: u64,
        /// The shared stream counter.
        stream_revision: u64,
        /// The app session it concerns.
        session: SessionId,
        /// The timeline target it concerns.
        target: TargetId,
        /// The patch.
        patch: LivePatch,
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
    /// `livePatch` is not an object of exactly the five fields.
    #[error(
        "livePatch must have exactly settlementEpoch, baseRevision, revision, upserts and removals"
    )]
    PatchFields,
    /// A `livePatch` number past 2^53 - 1 or not an integer.
    #[error("livePatch numbers must be exact integers")]
    PatchNotExact,
    /// `baseRevision` is 0, or `revision` is not above it.
    #[error("livePatch needs 0 < baseRevision < revision")]
    PatchRevisions,
}

fn exact(v: &serde_json::Value) -> Option<u64> {
    v.as_u64().filter(|n| *n <= MAX_EXACT_INTEGER)
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
    exact(&obj["settlementEpoch"]).ok_or(RelayError::NotExact)?;
    let revision = exact(&obj["revision"]).ok_or(RelayError::NotExact)?;
    if revision == 0 {
        return Err(RelayError::ZeroRevision);
    }
    Ok(())
}

/// Checks the `livePatch` of a relay `blocks-patch` payload: exactly `settlementEpoch`,
/// `baseRevision`, `revision`, `upserts` and `removals`, and optionally `appends`, the
/// lists arrays, the three
/// numbers exact integers with `0 < baseRevision < revision` (a base is a relay snapshot,
/// whose revision is above 0).
pub fn validate_relay_patch(patch: &serde_json::Value) -> Result<(), RelayError> {
    let obj = patch.as_object().ok_or(RelayError::PatchFields)?;
    if obj.get("appends").is_some_and(|a| !a.is_array()) {
        return Err(RelayError::PatchFields);
    }
    let fields: HashSet<&str> = obj
        .keys()
        .map(String::as_str)
        .filter(|k| *k != "appends")
        .collect();
    let expected = HashSet::from([
        "settlementEpoch",
        "baseRevision",
        "revision",
        "upserts",
        "removals",
    ]);
    if fields != expected || !obj["upserts"].is_array() || !obj["removals"].is_array() {
        return Err(RelayError::PatchFields);
    }
    exact(&obj["settlementEpoch"]).ok_or(RelayError::PatchNotExact)?;
    let base = exact(&obj["baseRevision"]).ok_or(RelayError::PatchNotExact)?;
    let revision = exact(&obj["revision"]).ok_or(RelayError::PatchNotExact)?;
    if base == 0 || revision <= base {
        return Err(RelayError::PatchRevisions);
    }
    Ok(())
}

/// What happened to a payload at the relay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RelayOutcome {
    /// Sent (a whole snapshot or, to a relay that negotiated it, a patch).
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

/// `(settlementEpoch, revision)`: newer compares greater.
type Version = (u64, u64);

fn version(o: &LiveOverlay) -> Version {
    (o.settlement_epoch, o.revision)
}

/// What a recipient that held `held` holds after it got the snapshot `got`, as far as
/// the hub can tell: an older snapshot is ignored, a newer one in the same epoch is
/// taken, one in a higher epoch makes it reload a latest window (unknown result).
fn held_after_snapshot(held: Option<Version>, got: Version) -> Option<Version> {
    match held {
        Some(h) if got <= h => Some(h),
        Some(h) if got.0 > h.0 => None,
        _ => Some(got),
    }
}

/// The patch from `base` to `next`, when one helps: the epochs match, `next` is later,
/// and it carries fewer rows than the snapshot.
fn useful_patch(base: &LiveOverlay, next: &LiveOverlay) -> Option<LivePatch> {
    let patch = LivePatch::between(base, next)?;
    let changed = patch.upserts.len() + patch.removals.len() + patch.appends.len();
    (changed < next.blocks.len()).then_some(patch)
}

#[derive(Debug)]
struct WindowSub {
    subscription_id: u64,
    session: SessionId,
    target: TargetId,
    protocol: LiveProtocol,
    /// The overlay version the window holds, as far as the hub can tell.
    holds: Option<Version>,
}

#[derive(Debug, Default)]
struct TargetState {
    /// The last saved snapshot emitted (repair resends it).
    last: Option<Arc<LiveOverlay>>,
    /// A write happened since the last repair tick and the newest relay event it made
    /// was a whole snapshot (the seed's "new write" for a relay that speaks snapshots).
    whole_since_tick: bool,
    /// The snapshot the relay's phones hold, as far as the hub can tell.
    relay_holds: Option<Arc<LiveOverlay>>,
    /// The relay got a patch since its last whole snapshot of this target.
    patched_since_whole: bool,
    /// The newest snapshot the target's windows were sent (or subscribed with).
    windows_hold: Option<Arc<LiveOverlay>>,
}

/// The `agent-threads` throttle of one session (OV-09).
#[derive(Debug, Default)]
struct Throttle {
    /// The end of the window that the last signal sent opened.
    window_end: Option<Millis>,
    /// The newest signal held back for the end of that window. A signal that goes out
    /// replaces it, so no signal ever follows a newer one.
    pending: Option<Payload>,
}

type TargetKey = (SessionId, TargetId);

/// The live delivery machine. See the module docs.
#[derive(Debug, Default)]
pub struct LiveHub {
    next_subscription: u64,
    stream_revision: u64,
    windows: BTreeMap<WindowId, WindowSub>,
    /// target -> windows subscribed to it
    by_target: HashMap<TargetKey, Vec<WindowId>>,
    /// Waiting snapshots: target -> (snapshot, due), and arrival order.
    waiting: HashMap<TargetKey, (Arc<LiveOverlay>, Millis)>,
    waiting_order: VecDeque<TargetKey>,
    phone_interest: HashSet<SessionId>,
    /// Sessions whose relay negotiated patches.
    relay_patches: HashSet<SessionId>,
    /// Sessions with an active run -> next repair tick.
    active_runs: HashMap<SessionId, Option<Millis>>,
    targets: HashMap<TargetKey, TargetState>,
    throttles: HashMap<SessionId, Throttle>,
    out: VecDeque<Delivery>,
}

impl LiveHub {
    /// A hub with no windows and no interest.
    pub fn new() -> Self {
        Self::default()
    }

    /// Subscribes `window` to one target (replacing its previous subscription) and
    /// returns the saved overlay to start from. The window gets whole snapshots only.
    pub fn subscribe<S: OverlayStore + ?Sized>(
        &mut self,
        store: &mut S,
        window: WindowId,
        session: &SessionId,
        target: &TargetId,
    ) -> Result<Subscription, OverlayError> {
        self.subscribe_with(store, window, session, target, LiveProtocol::Snapshots)
    }

    /// [`LiveHub::subscribe`] for a window that speaks `protocol`. A window that speaks
    /// [`LiveProtocol::Patches`] holds the returned overlay, so later deliveries may be
    /// patches from it.
    pub fn subscribe_with<S: OverlayStore + ?Sized>(
        &mut self,
        store: &mut S,
        window: WindowId,
        session: &SessionId,
        target: &TargetId,
        protocol: LiveProtocol,
    ) -> Result<Subscription, OverlayError> {
        let saved = store
            .load(session, target)?
            .map(|o| Arc::new(o.client_form()));
        self.unsubscribe(window);
        self.next_subscription += 1;
        let id = self.next_subscription;
        self.windows.insert(
            window,
            WindowSub {
                subscription_id: id,
                session: session.clone(),
                target: target.clone(),
                protocol,
                holds: saved.as_deref().map(version),
            },
        );
        let k = (session.clone(), target.clone());
        self.by_target.entry(k.clone()).or_default().push(window);
        if let Some(saved) = &saved {
            let state = self.targets.entry(k).or_default();
            let newer = state
                .windows_hold
                .as_deref()
                .is_none_or(|h| version(h) < version(saved));
            if newer {
                state.windows_hold = Some(Arc::clone(saved));
            }
        }
        Ok(Subscription {
            subscription_id: id,
            overlay: saved.map(Arc::unwrap_or_clone),
        })
    }

    /// Ends a window's subscription (the window still gets run events).
    pub fn unsubscribe(&mut self, window: WindowId) {
        if let Some(sub) = self.windows.remove(&window) {
            let k = (sub.session, sub.target);
            if let Some(v) = self.by_target.get_mut(&k) {
                v.retain(|w| *w != window);
                if v.is_empty() {
                    self.by_target.remove(&k);
                }
            }
        }
    }

    /// A phone holds (or dropped) interest in a session. Dropping it forgets what the
    /// relay holds, so the next `blocks` payload after interest returns is whole.
    pub fn set_phone_interest(&mut self, session: &SessionId, interested: bool) {
        if interested {
            self.phone_interest.insert(session.clone());
        } else {
            self.phone_interest.remove(session);
            self.forget_relay(session, None);
        }
    }

    /// How the relay of `session` takes `blocks` updates. Set
    /// [`LiveProtocol::Patches`] only while every phone it serves for the session applies
    /// patches. A change forgets what the relay holds, so the next update is whole.
    pub fn set_relay_protocol(&mut self, session: &SessionId, protocol: LiveProtocol) {
        match protocol {
            LiveProtocol::Patches => self.relay_patches.insert(session.clone()),
            LiveProtocol::Snapshots => self.relay_patches.remove(session),
        };
        self.forget_relay(session, None);
    }

    /// A delivery was not carried out, or its recipient refused it (for example a
    /// timeline answered a patch with `Ignored(BaseMismatch)`): the hub forgets what
    /// that recipient holds, so its next `blocks` update is a whole snapshot. A lost relay
    /// snapshot or patch is also resent whole at the next repair tick of an active run.
    pub fn report_lost(&mut self, delivery: &Delivery) {
        match delivery {
            Delivery::Window {
                window,
                payload: Payload::Blocks { .. },
                ..
            }
            | Delivery::WindowPatch { window, .. } => {
                if let Some(sub) = self.windows.get_mut(window) {
                    sub.holds = None;
                }
            }
            Delivery::Relay(event) => {
                let kind = event.json.get("event").and_then(serde_json::Value::as_str);
                if matches!(kind, Some("blocks") | Some(BLOCKS_PATCH_EVENT)) {
                    let target = event
                        .json
                        .get("timelineTargetId")
                        .and_then(serde_json::Value::as_str)
                        .and_then(|t| TargetId::new(t).ok());
                    self.forget_relay(&event.session, target.as_ref());
                    for ((s, t), state) in self.targets.iter_mut() {
                        if *s == event.session && target.as_ref().is_none_or(|x| x == t) {
                            state.whole_since_tick = false;
                        }
                    }
                }
            }
            _ => {}
        }
    }

    /// Forgets what the relay holds for one target of `session`, or for all of them.
    fn forget_relay(&mut self, session: &SessionId, target: Option<&TargetId>) {
        for ((s, t), state) in self.targets.iter_mut() {
            if s == session && target.is_none_or(|x| x == t) {
                state.relay_holds = None;
            }
        }
    }

    /// The one emit entry point: a payload the producer saved (or a run event), to every
    /// sink it concerns. Returns what happened at the relay.
    pub fn handle_payload(&mut self, payload: Payload, now: Millis) -> RelayOutcome {
        if let Payload::AgentThreads { session, .. } = &payload {
            let th = self.throttles.entry(session.clone()).or_default();
            if th.window_end.is_some_and(|end| now < end) {
                th.pending = Some(payload);
                return RelayOutcome::Throttled;
            }
            // The window is over (its timer may not have been handled yet): this signal
            // goes out now and stands for the one held back, which is dropped rather
            // than sent after it with an older timestamp.
            th.pending = None;
            th.window_end = Some(now.saturating_add(AGENT_THREADS_WINDOW));
        }
        self.route(payload, now)
    }

    fn route(&mut self, payload: Payload, now: Millis) -> RelayOutcome {
        match payload {
            Payload::Blocks {
                session,
                target,
                overlay,
            } => self.route_blocks((session, target), Arc::new(overlay), now),
            Payload::Run(ref event) => {
                self.flush_waiting();
                match event.event {
                    RunEventKind::Started => {
                        self.active_runs.insert(event.app_session_id.clone(), None);
                    }
                    _ => {
                        self.active_runs.remove(&event.app_session_id);
                        self.close_patched(&event.app_session_id);
                    }
                }
                self.out.push_back(Delivery::Progress(RunEvent {
                    agent_error_info: None,
                    ..event.clone()
                }));
                self.deliver_to_every_window(&payload);
                self.relay(&payload)
            }
            Payload::Runtime { .. } | Payload::AgentThreads { .. } => {
                self.deliver_to_every_window(&payload);
                self.relay(&payload)
            }
            Payload::SessionEvent { ref session, .. } => {
                self.deliver_to_session_windows(session, &payload);
                self.relay(&payload)
            }
        }
    }

    fn route_blocks(&mut self, k: TargetKey, snap: Arc<LiveOverlay>, now: Millis) -> RelayOutcome {
        if let Some(tick @ None) = self.active_runs.get_mut(&k.0) {
            // The first snapshot of the run arms the repair timer, and the first tick's
            // "since the last tick" starts here: a write before it (between runs, or in
            // an earlier run) does not make a target count as written (OV-08).
            *tick = Some(now.saturating_add(RELAY_REPAIR_INTERVAL));
            for ((s, _), state) in self.targets.iter_mut() {
                if *s == k.0 {
                    state.whole_since_tick = false;
                }
            }
        }
        if self.by_target.contains_key(&k) {
            self.enqueue_snapshot(k.clone(), Arc::clone(&snap), now);
        }
        let (outcome, patched) = self.relay_blocks(&k, &snap);
        let state = self.targets.entry(k).or_default();
        // A snapshot older than the newest one emitted (a producer that sends out of
        // order) neither replaces what repair resends nor counts as a new write.
        let newest = state
            .last
            .as_deref()
            .is_none_or(|last| version(last) <= version(&snap));
        if newest {
            state.last = Some(snap);
            state.whole_since_tick = !patched;
        }
        outcome
    }

    /// Sends one written snapshot to the relay: as a patch when the relay negotiated
    /// patches, a run of the session is active (so repair heals a loss) and the hub
    /// knows what the relay holds; whole otherwise. Returns whether it was a patch.
    fn relay_blocks(&mut self, k: &TargetKey, snap: &Arc<LiveOverlay>) -> (RelayOutcome, bool) {
        if !self.phone_interest.contains(&k.0) {
            self.forget_relay(&k.0, Some(&k.1));
            return (RelayOutcome::NoInterest, false);
        }
        let patch = if self.relay_patches.contains(&k.0) && self.active_runs.contains_key(&k.0) {
            self.targets
                .get(k)
                .and_then(|s| s.relay_holds.as_deref())
                .and_then(|held| useful_patch(held, snap))
        } else {
            None
        };
        let Some(patch) = patch else {
            return (self.relay_whole(k, snap), false);
        };
        let json = match relay_patch_json(&k.0, &k.1, &patch) {
            Ok(json) => json,
            Err(e) => {
                self.forget_relay(&k.0, Some(&k.1));
                return (RelayOutcome::Rejected(e), false);
            }
        };
        self.out.push_back(Delivery::Relay(RelayEvent {
            session: k.0.clone(),
            json,
        }));
        let state = self.targets.entry(k.clone()).or_default();
        state.relay_holds = Some(Arc::clone(snap));
        state.patched_since_whole = true;
        (RelayOutcome::Sent, true)
    }

    /// Sends a whole snapshot to the relay and records what the relay then holds.
    fn relay_whole(&mut self, k: &TargetKey, snap: &Arc<LiveOverlay>) -> RelayOutcome {
        let outcome = self.relay(&Payload::Blocks {
            session: k.0.clone(),
            target: k.1.clone(),
            overlay: LiveOverlay::clone(snap),
        });
        if outcome != RelayOutcome::Sent {
            self.forget_relay(&k.0, Some(&k.1));
            return outcome;
        }
        let state = self.targets.entry(k.clone()).or_default();
        let held = state.relay_holds.as_deref().map(version);
        match held_after_snapshot(held, version(snap)) {
            Some(v) if v == version(snap) => {
                state.relay_holds = Some(Arc::clone(snap));
                state.patched_since_whole = false;
            }
            Some(_) => {}
            None => state.relay_holds = None,
        }
        outcome
    }

    /// A run of `session` ended: every target whose relay got patches since its last
    /// whole snapshot gets one now, so a phone that lost a patch near the end heals.
    fn close_patched(&mut self, session: &SessionId) {
        let mut close: Vec<(TargetId, Arc<LiveOverlay>)> = self
            .targets
            .iter()
            .filter(|((s, _), st)| s == session && st.patched_since_whole)
            .filter_map(|((_, t), st)| Some((t.clone(), Arc::clone(st.last.as_ref()?))))
            .collect();
        close.sort_by(|a, b| a.0.cmp(&b.0));
        for (target, snap) in close {
            self.relay_whole(&(session.clone(), target), &snap);
        }
    }

    fn enqueue_snapshot(&mut self, k: TargetKey, overlay: Arc<LiveOverlay>, now: Millis) {
        if let Some(w) = self.waiting.get_mut(&k) {
            // A newer snapshot (a higher epoch, or a higher revision in the same epoch)
            // replaces the waiting one; an older one that arrives later is dropped. The
            // timer stays.
            if version(&overlay) > version(&w.0) {
                w.0 = overlay;
            }
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

    /// Delivers a target's newest snapshot to its windows: a patch to a window that
    /// negotiated patches and holds the snapshot the target's windows were last sent,
    /// the whole snapshot to every other window.
    fn deliver_snapshot(&mut self, k: &TargetKey, snap: Arc<LiveOverlay>) {
        let windows = self.by_target.get(k).cloned().unwrap_or_default();
        let base = self.targets.get(k).and_then(|s| s.windows_hold.clone());
        let mut patch: Option<Option<LivePatch>> = None;
        for w in windows {
            let Some(sub) = self.windows.get_mut(&w) else {
                continue;
            };
            self.stream_revision += 1;
            let from_base = sub.protocol == LiveProtocol::Patches
                && base
                    .as_deref()
                    .is_some_and(|b| sub.holds == Some(version(b)));
            let p = if from_base {
                patch
                    .get_or_insert_with(|| base.as_deref().and_then(|b| useful_patch(b, &snap)))
                    .clone()
            } else {
                None
            };
            let delivery = match p {
                Some(patch) => {
                    sub.holds = Some(version(&snap));
                    Delivery::WindowPatch {
                        window: w,
                        subscription_id: sub.subscription_id,
                        stream_revision: self.stream_revision,
                        session: k.0.clone(),
                        target: k.1.clone(),
                        patch,
                    }
                }
                None => {
                    sub.holds = held_after_snapshot(sub.holds, version(&snap));
                    Delivery::Window {
                        window: w,
                        subscription_id: sub.subscription_id,
                        stream_revision: self.stream_revision,
                        payload: Payload::Blocks {
                            session: k.0.clone(),
                            target: k.1.clone(),
                            overlay: LiveOverlay::clone(&snap),
                        },
                    }
                }
            };
            self.out.push_back(delivery);
        }
        let state = self.targets.entry(k.clone()).or_default();
        let newer = state
            .windows_hold
            .as_deref()
            .is_none_or(|h| version(h) < version(&snap));
        if newer {
            state.windows_hold = Some(snap);
        }
    }

    fn deliver_to_every_window(&mut self, payload: &Payload) {
        self.deliver_to_windows(None, payload);
    }

    /// To each window subscribed to a target of `session`.
    fn deliver_to_session_windows(&mut self, session: &SessionId, payload: &Payload) {
        self.deliver_to_windows(Some(session), payload);
    }

    /// To each window (of `session` only, when one is named).
    fn deliver_to_windows(&mut self, session: Option<&SessionId>, payload: &Payload) {
        let windows: Vec<(WindowId, u64)> = self
            .windows
            .iter()
            .filter(|(_, sub)| session.is_none_or(|s| sub.session == *s))
            .map(|(w, sub)| (*w, sub.subscription_id))
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
    pub fn poll_effect(&mut self) -> Option<Delivery> {
        self.out.pop_front()
    }

    /// The old name of [`Self::poll_effect`].
    #[deprecated(note = "renamed poll_effect: one name for every machine's output")]
    #[must_use]
    pub fn poll_delivery(&mut self) -> Option<Delivery> {
        self.poll_effect()
    }

    /// The next deadline: a waiting snapshot, a repair tick, or the end of a throttle
    /// window with a signal held back.
    #[must_use]
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
    /// had no write since the last tick, to the relay only, as a whole snapshot. A target
    /// whose newest relay event since the last tick was a patch counts as quiet.
    fn repair(&mut self, session: &SessionId, now: Millis) {
        if let Some(tick) = self.active_runs.get_mut(session) {
            *tick = Some(now.saturating_add(RELAY_REPAIR_INTERVAL));
        }
        let mut resend = Vec::new();
        for ((s, t), state) in self.targets.iter_mut() {
            if s != session {
                continue;
            }
            if !state.whole_since_tick {
                if let Some(o) = &state.last {
                    resend.push((t.clone(), Arc::clone(o)));
                }
            }
            state.whole_since_tick = false;
        }
        resend.sort_by(|a, b| a.0.cmp(&b.0));
        for (target, overlay) in resend {
            self.relay_whole(&(session.clone(), target), &overlay);
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
        Payload::SessionEvent {
            session,
            log_id,
            event,
        } => serde_json::json!({
            "event": SESSION_EVENT,
            "appSessionId": session,
            "logId": log_id,
            "sessionEvent": serde_json::to_value(event).map_err(|_| RelayError::Fields)?,
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

/// The relay JSON of a live patch (`blocks-patch`), validated.
fn relay_patch_json(
    session: &SessionId,
    target: &TargetId,
    patch: &LivePatch,
) -> Result<serde_json::Value, RelayError> {
    let patch = serde_json::to_value(patch).map_err(|_| RelayError::PatchFields)?;
    validate_relay_patch(&patch)?;
    Ok(serde_json::json!({
        "event": BLOCKS_PATCH_EVENT,
        "appSessionId": session,
        "timelineTargetId": target,
        "livePatch": patch,
    }))
}
