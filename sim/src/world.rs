//! The world: one host, the agent, the clients, the relay and the clock, driven by one
//! seed through the host's public loop, exactly as an embedder drives it.
//!
//! A run is a number of steps. Each step may first inject faults (a host crash, a
//! phone's reconnect, a client's reload, the agent's history going down, a store that
//! fails), then does one thing: a user action on a client, something the agent does by
//! itself, or time passing (messages arrive, deadlines pass). After every step the
//! invariants of `check` are checked. Then the faults stop and the world runs until
//! nothing is pending (quiescence), and the final invariants are checked.
//!
//! The embedder's side of the loop, step by step:
//!
//! 1. Inputs go in with the time they arrive: client requests ([`Event::ToHost`]),
//!    agent answers and stream events ([`Event::FromAgent`]), and `handle_timeout` when
//!    the host's deadline passes.
//! 2. Every effect is drained at once (`World::pump`): agent calls travel to the
//!    agent, live deliveries to the desktop windows and, through the relay, to the
//!    phones joined to the session, replies to the client that asked, notices to the
//!    trace.
//! 3. The next thing to happen is the earliest of the host's deadline, the clients'
//!    deadlines and the next arrival.

use outbox_core::adapter::{ReadHistoryRequest, StopRequest, TakeBackRequest};
use std::collections::{BTreeMap, BTreeSet};

use host_core::{AgentCall, AgentInput, ClientRequest, Host, HostEffect, Reply};
use outbox_core::ids::QueueId;
use overlay_core::live::{Delivery, LiveProtocol, Payload};
use timeline_core::timeline::RequestTag;
use timeline_core::wire::LivePatch;
use timeline_core::{BlockKey, Millis, OperationId, SessionId};

use crate::agent::{Agent, AgentViolation};
use crate::client::{Client, Kind};
use crate::faults::{FaultCounts, FaultKind, Faults};
use crate::invariant::{Invariant, Known, Violation};
use crate::net::{Event, Net};
use crate::rng::Rng;
use crate::stores::{Backend, Stores};
use crate::trace::clip;
use crate::trace::Trace;
use crate::Defect;

mod checks;
mod clients;
mod embedder;

pub(crate) use crate::observed::Message;
pub use crate::observed::Session;
pub use crate::stores::SimHost;

/// How one run is set up.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Config {
    /// The seed: the same seed gives the same run.
    pub seed: u64,
    /// Steps before quiescence.
    pub steps: usize,
    /// Fault kinds that never strike.
    pub without: Vec<FaultKind>,
    /// A deliberate defect, to show that a check catches it.
    pub defect: Option<Defect>,
    /// The backend; `None` draws it from the seed (SQLite for one run in sixteen).
    pub backend: Option<Backend>,
    /// Print every trace line as it is written.
    pub echo: bool,
    /// Write the trace (off: faster, no digest and no report lines; a failing run is
    /// run again with it on to report).
    pub trace: bool,
    /// Users also replace the latest turn (on by default). Its draws are a stream of
    /// their own, so a run without it is the run the seed made before replace latest
    /// was driven (`--no-replace-latest`).
    pub replace_latest: bool,
    /// Users also reorder queued messages (on by default), drawn from a stream of its
    /// own like replace latest (`--no-reorder`).
    pub reorder: bool,
    /// Record this client's inputs as `timeline-wasm` commands (`Outcome::recording`).
    pub record: Option<usize>,
}

impl Config {
    /// A run of `seed` with the default step count.
    pub fn new(seed: u64) -> Config {
        Config {
            seed,
            steps: DEFAULT_STEPS,
            without: Vec::new(),
            defect: None,
            backend: None,
            echo: false,
            trace: true,
            replace_latest: true,
            reorder: true,
            record: None,
        }
    }
}

/// Steps of a run unless told otherwise.
pub const DEFAULT_STEPS: usize = 200;

/// What a run did, counted (to see that the faults and actions reach the system).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Runs counted.
    pub runs: u64,
    /// Messages users sent (new operations, edits included).
    pub messages: u64,
    /// Messages the agent had at the end.
    pub delivered: u64,
    /// Approvals the agent asked.
    pub approvals: u64,
    /// Decisions a client was told were taken.
    pub decided: u64,
    /// Latest windows, older pages and anchored windows that reached a client.
    pub loads: u64,
    /// Replays a phone rebuilt from.
    pub replays: u64,
    /// Relay events that reached a phone.
    pub relay_events: u64,
    /// Host restarts.
    pub restarts: u64,
    /// Decisions the agent got again from a host that restarted while the decision was
    /// on its way (allowed: one decision, delivered at least once).
    pub decisions_again: u64,
    /// Replace-latest messages users sent (Codex and Claude sessions).
    pub replace_latest: u64,
    /// Replace-latest messages a Claude session refused with the typed error.
    pub replace_refused: u64,
    /// Sends with `rollback_before_send` the host made (replace-latest sends).
    pub rollback_sends: u64,
    /// Sends to a fresh thread the host made (after the agent said a thread is gone).
    pub fresh_sends: u64,
    /// Turns the agent rolled back.
    pub rollbacks: u64,
    /// Rollbacks asked again for an operation the agent had rolled back for, or whose
    /// thread it had found gone (not done twice).
    pub rollbacks_again: u64,
    /// Times the agent answered that a thread is gone.
    pub threads_gone: u64,
    /// Reorders users asked.
    pub reorders: u64,
    /// Reorders the host carried out.
    pub reordered: u64,
}

impl Stats {
    /// Adds every count of `other`.
    pub fn merge(&mut self, other: &Stats) {
        self.runs += other.runs;
        self.messages += other.messages;
        self.delivered += other.delivered;
        self.approvals += other.approvals;
        self.decided += other.decided;
        self.loads += other.loads;
        self.replays += other.replays;
        self.relay_events += other.relay_events;
        self.restarts += other.restarts;
        self.decisions_again += other.decisions_again;
        self.replace_latest += other.replace_latest;
        self.replace_refused += other.replace_refused;
        self.rollback_sends += other.rollback_sends;
        self.fresh_sends += other.fresh_sends;
        self.rollbacks += other.rollbacks;
        self.rollbacks_again += other.rollbacks_again;
        self.threads_gone += other.threads_gone;
        self.reorders += other.reorders;
        self.reordered += other.reordered;
    }
}

/// What a request in flight was, so its reply goes to the right handler.
#[derive(Clone, Debug)]
pub(crate) enum Asked {
    Latest(RequestTag),
    Older(RequestTag),
    Anchored(RequestTag),
    Submit(OperationId),
    Edit { old: OperationId, new: OperationId },
    Remove(QueueId),
    Reorder,
    SendNow,
    StopAndSendNow,
    Stop,
    Approval(String),
    Subscribe(SessionId),
    Join(SessionId),
    Leave,
}

/// A request in flight.
#[derive(Clone, Debug)]
pub(crate) struct Request {
    pub client: usize,
    pub asked: Asked,
}

/// The world of one run.
pub struct World {
    pub(crate) cfg: Config,
    pub(crate) rng: Rng,
    /// The draws that choose a replace latest among the user's actions: a stream of its
    /// own, so a run that never draws one runs exactly as before replace latest was
    /// driven (the seeds pinned in `tests/regressions.rs` build their situations still).
    pub(crate) actions: Rng,
    /// The draws of reorders, a stream of their own for the same reason.
    pub(crate) reorders: Rng,
    /// The client recorded, and its log.
    recording: Option<(usize, crate::recorded::Log)>,
    pub(crate) faults: Faults,
    /// Faults injected so far.
    pub counts: FaultCounts,
    pub(crate) now: Millis,
    pub(crate) step: usize,
    pub(crate) stores: Stores,
    pub(crate) host: Option<SimHost>,
    pub(crate) incarnation: u64,
    pub(crate) agent: Agent,
    pub(crate) sessions: Vec<Session>,
    pub(crate) clients: Vec<Client>,
    pub(crate) net: Net,
    pub(crate) requests: BTreeMap<u64, Request>,
    next_request: u64,
    pub(crate) next_op: u64,
    pub(crate) messages: BTreeMap<OperationId, Message>,
    /// The operation each queue entry carries now.
    pub(crate) queues: BTreeMap<QueueId, OperationId>,
    /// Operations the host has sent to the agent at least once.
    pub(crate) sent: BTreeSet<OperationId>,
    /// Operations the host may send again: the agent said it does not have them.
    pub(crate) resend_ok: BTreeSet<OperationId>,
    /// The operation of each send, history read and take-back attempt.
    pub(crate) attempts: BTreeMap<u64, OperationId>,
    /// Answers the agent gave, to deliver again later (answers for old attempts).
    old_answers: Vec<AgentInput>,
    /// Replies per request.
    pub(crate) replies: BTreeMap<u64, u32>,
    /// When a client whose window subscription or join got no answer (or failed)
    /// connects again.
    connect_deadline: BTreeMap<usize, Millis>,
    /// The request number of each client's newest subscribe or join: only its answer
    /// connects the client (an answer to an older one, overtaken by a leave, does not).
    connect_request: BTreeMap<usize, u64>,
    /// The trace.
    pub trace: Trace,
    /// What went wrong.
    pub violations: Vec<Violation>,
    pub(crate) ledger_watch: crate::check::LedgerWatch,
    /// True once the faults stopped.
    pub(crate) settling: bool,
    /// Clients told their decision was taken, per request.
    approvals_taken: BTreeMap<String, u32>,
    /// Known issues of other crates met, with what was seen.
    pub known: Vec<(Known, String)>,
    /// Operations a history read reported missing to the host.
    pub(crate) missing_read: BTreeSet<OperationId>,
    /// Operations the agent itself said it did not take (a cancel, an untaken steer, a
    /// confirmed take-back): a canceled row of one may be reopened without a read
    /// (OB-12 reads history first only for an attempt whose acceptance stands).
    pub(crate) said_untaken: BTreeSet<OperationId>,
    /// What the run did.
    pub stats: Stats,
    /// The joins the relay passed on to the current host: (phone, session).
    /// The relay's view: for each (phone, session), the request number of the join it
    /// passed on to the current host.
    pub(crate) relay_joins: BTreeMap<(usize, SessionId), u64>,
    /// The host incarnation whose decision the agent took, by request ID.
    pub(crate) decisions_from: BTreeMap<String, u64>,
    /// Operations the agent holds as a turn's pending input that a history read
    /// reported missing, or whose send reached the agent after the host that sent it
    /// died (see `Known::PendingInputMissing`).
    pub(crate) zombies: BTreeSet<OperationId>,
    /// Operations the user asked the host to send now (OB-08): a message held because
    /// the host could not confirm it goes once on the user's word, even when the
    /// agent's history stays unreadable.
    pub(crate) user_asked: BTreeSet<OperationId>,
    /// Operations sent again on the user's word after an unreadable history: if the
    /// agent held them after all, the second copy is the user's choice, not the host's.
    pub(crate) user_resends: BTreeSet<OperationId>,
    /// Rows that left the agent's history for good, per session: the rows of turns a
    /// replace latest rolled back, and of threads that are gone.
    pub(crate) gone_rows: BTreeMap<SessionId, BTreeSet<BlockKey>>,
    /// Sessions whose announcement of lost history the overlay store refused, and its
    /// journal row too (only a retry in memory waits), and those where a host died with
    /// such a retry.
    pub(crate) rewrites_failed: BTreeSet<SessionId>,
    pub(crate) rewrites_lost: BTreeSet<SessionId>,
}

/// The host's key: the same for every incarnation (cursors survive restarts).
const HOST_KEY: [u8; 32] = [0x5a; 32];

fn millis(ms: u64) -> Millis {
    Millis(ms)
}

impl World {
    /// The recorded client's commands and what it shows now.
    pub fn recording(&self) -> Option<crate::Recording> {
        let (client, log) = self.recording.as_ref()?;
        let c = self.clients.get(*client)?;
        let rows = c
            .timeline
            .rows()
            .map(|row| {
                let origin = match row.origin {
                    timeline_core::timeline::Origin::History => "history",
                    timeline_core::timeline::Origin::Live => "live",
                    _ => "pending",
                };
                serde_json::json!({ "origin": origin, "block": row.block })
            })
            .collect();
        let view = c
            .conversation
            .view()
            .into_iter()
            .map(|row| match row {
                timeline_core::replay::ViewRow::Entry(e) => format!("record:{}:{}", e.seq, e.text),
                timeline_core::replay::ViewRow::Pending { text, .. } => format!("pending::{text}"),
            })
            .collect();
        Some(crate::Recording {
            client: *client,
            commands: log.commands(),
            rows,
            view,
        })
    }

    /// Builds the world of `cfg.seed`: sessions, stores, host, agent and clients.
    ///
    /// # Errors
    ///
    /// The text of a failure to set up the stores or start the host.
    pub fn new(cfg: Config) -> Result<World, String> {
        let mut rng = Rng::new(cfg.seed);
        let actions = Rng::new(cfg.seed ^ 0x7265_706c_6163_6521);
        let reorders = Rng::new(cfg.seed ^ 0x7265_6f72_6465_7221);
        let faults = Faults::draw(&mut rng, &cfg.without);
        let sqlite = rng.chance(1.0 / 16.0);
        let backend = cfg.backend.unwrap_or(if sqlite {
            Backend::Sqlite
        } else {
            Backend::Memory
        });
        let stores = Stores::new(backend)?;
        let mut agent = Agent::default();
        agent.keep_rolled_back = cfg.defect == Some(Defect::KeepRolledBackTurn);
        let n_sessions = if rng.chance(0.5) { 2 } else { 1 };
        let mut sessions = Vec::new();
        for i in 0..n_sessions {
            let id = SessionId::new(format!("s{i}")).map_err(|e| e.to_string())?;
            let codex = rng.chance(0.5);
            let transcript = agent.add_session(&id, codex);
            let history = rng.below(40);
            agent.seed_history(&id, history);
            let relay = if rng.chance(0.5) {
                LiveProtocol::Patches
            } else {
                LiveProtocol::Snapshots
            };
            sessions.push(Session {
                id,
                codex,
                transcript,
                relay,
            });
        }
        let n_clients = rng.range(1, 4) as usize;
        let mut clients = Vec::new();
        let mut recording = None;
        for i in 0..n_clients {
            let kind = if i == 0 || (i == 1 && rng.chance(0.2)) {
                Kind::Desktop
            } else {
                Kind::Phone
            };
            let session = sessions[rng.index(sessions.len())].id.clone();
            let protocol = match kind {
                Kind::Desktop if rng.chance(0.5) => LiveProtocol::Patches,
                Kind::Desktop => LiveProtocol::Snapshots,
                Kind::Phone => sessions
                    .iter()
                    .find(|s| s.id == session)
                    .map_or(LiveProtocol::Snapshots, |s| s.relay),
            };
            let log = (cfg.record == Some(i)).then(|| {
                let log = crate::recorded::Log::default();
                log.push(serde_json::json!({ "cmd": "new", "mode": match kind {
                    Kind::Desktop => "desktop",
                    Kind::Phone => "phone",
                } }));
                log
            });
            if let Some(log) = &log {
                recording = Some((i, log.clone()));
            }
            clients.push(Client::new(kind, i, session, protocol, log));
        }
        let mut trace = Trace::default();
        trace.echo = cfg.echo;
        trace.log(format!(
            "seed {} backend {:?} sessions [{}] clients [{}] faults [{}]",
            cfg.seed,
            backend,
            sessions
                .iter()
                .map(|s| format!(
                    "{}:{}:{:?}",
                    s.id,
                    if s.codex { "codex" } else { "claude" },
                    s.relay
                ))
                .collect::<Vec<_>>()
                .join(" "),
            clients
                .iter()
                .enumerate()
                .map(|(i, c)| format!("{}:{}:{:?}", c.name(i), c.session, c.protocol))
                .collect::<Vec<_>>()
                .join(" "),
            faults
                .active()
                .iter()
                .map(|k| format!("{}={:.3}", k.name(), faults.p(*k)))
                .collect::<Vec<_>>()
                .join(" ")
        ));
        let mut world = World {
            cfg,
            rng,
            actions,
            reorders,
            recording,
            faults,
            counts: FaultCounts::default(),
            now: millis(10_000),
            step: 0,
            stores,
            host: None,
            incarnation: 0,
            agent,
            sessions,
            clients,
            net: Net::default(),
            requests: BTreeMap::new(),
            next_request: 0,
            next_op: 0,
            messages: BTreeMap::new(),
            queues: BTreeMap::new(),
            sent: BTreeSet::new(),
            resend_ok: BTreeSet::new(),
            attempts: BTreeMap::new(),
            old_answers: Vec::new(),
            replies: BTreeMap::new(),
            connect_deadline: BTreeMap::new(),
            connect_request: BTreeMap::new(),
            trace,
            violations: Vec::new(),
            ledger_watch: crate::check::LedgerWatch::default(),
            settling: false,
            approvals_taken: BTreeMap::new(),
            known: Vec::new(),
            missing_read: BTreeSet::new(),
            said_untaken: BTreeSet::new(),
            stats: Stats::default(),
            relay_joins: BTreeMap::new(),
            decisions_from: BTreeMap::new(),
            zombies: BTreeSet::new(),
            user_asked: BTreeSet::new(),
            user_resends: BTreeSet::new(),
            gone_rows: BTreeMap::new(),
            rewrites_failed: BTreeSet::new(),
            rewrites_lost: BTreeSet::new(),
        };
        world.boot()?;
        for c in 0..world.clients.len() {
            world.connect(c);
            let target = world.clients[c].target();
            world.clients[c].timeline.open_target(target, world.now);
        }
        world.pump();
        Ok(world)
    }

    /// The seed of this run.
    pub fn seed(&self) -> u64 {
        self.cfg.seed
    }

    /// The simulated time.
    pub fn now(&self) -> Millis {
        self.now
    }

    pub(crate) fn log(&mut self, line: impl FnOnce() -> String) {
        if !self.cfg.trace {
            return;
        }
        let line = format!("[{} {}] {}", self.step, self.now.as_u64(), line());
        self.trace.log(line);
    }

    pub(crate) fn violate(&mut self, invariant: Invariant, detail: String) {
        self.log(|| format!("VIOLATION {}: {detail}", invariant.name()));
        self.violations.push(Violation {
            invariant,
            detail,
            step: self.step,
            time: self.now,
        });
    }

    pub(crate) fn known_issue(&mut self, known: Known, detail: String) {
        self.log(|| format!("KNOWN {}: {detail}", known.name()));
        self.known.push((known, detail));
    }

    pub(crate) fn defect(&self, d: Defect) -> bool {
        self.cfg.defect == Some(d)
    }

    // ----- the host's life -----------------------------------------------------------

    /// Draws whether a fault of `kind` strikes now, and counts it when it does.
    fn strike(&mut self, kind: FaultKind) -> bool {
        let hit = self.faults.strikes(&mut self.rng, kind);
        if hit {
            self.counts.add(kind);
        }
        hit
    }

    // ----- requests and replies ----------------------------------------------------

    // ----- effects ------------------------------------------------------------------

    // ----- time --------------------------------------------------------------------

    /// The earliest thing that happens next: an arrival, or a deadline of the host or a
    /// client.
    pub(crate) fn next_time(&self) -> Option<Millis> {
        let host = self.host.as_ref().and_then(Host::poll_timeout);
        let clients = self
            .clients
            .iter()
            .flat_map(|c| [c.timeline.poll_timeout(), c.conversation.poll_timeout()])
            .flatten()
            .min();
        let joins = self.connect_deadline.values().min().copied();
        let beat = self.agent.next_heartbeat();
        [self.net.next_time(), host, clients, joins, beat]
            .into_iter()
            .flatten()
            .min()
    }

    /// Lets time pass until `until`: every arrival and deadline on the way is handled in
    /// order.
    pub(crate) fn advance(&mut self, until: Millis) {
        let mut guard = 0u32;
        while let Some(t) = self.next_time() {
            if t > until {
                break;
            }
            guard += 1;
            if guard > 20_000 {
                self.violate(
                    Invariant::TimerInfinite,
                    "more than 20000 things happened without time moving on".into(),
                );
                return;
            }
            self.now = self.now.max(t);
            self.tick();
            if !self.violations.is_empty() {
                return;
            }
        }
        self.now = self.now.max(until);
        self.tick();
    }

    /// Handles everything due at `now`.
    fn tick(&mut self) {
        let beats = self.agent.heartbeat(self.now);
        self.agent_out(beats);
        while let Some(event) = self.net.pop_due(self.now) {
            self.arrive(event);
            self.pump();
        }
        let now = self.now;
        if let Some(host) = self.host.as_mut() {
            if host.poll_timeout().is_some_and(|d| d <= now) {
                host.handle_timeout(now);
                // After the host handled its deadlines, the next one lies ahead.
                if let Some(d) = host.poll_timeout() {
                    if d <= now {
                        self.violate(
                            Invariant::TimerInfinite,
                            format!(
                                "the host's deadline {} is not after {}",
                                d.as_u64(),
                                now.as_u64()
                            ),
                        );
                    }
                }
            }
        }
        for c in 0..self.clients.len() {
            if self.clients[c]
                .timeline
                .poll_timeout()
                .is_some_and(|d| d <= now)
            {
                self.clients[c].timeline.handle_timeout(now);
            }
            if self.clients[c]
                .conversation
                .poll_timeout()
                .is_some_and(|d| d <= now)
            {
                self.clients[c].conversation.handle_timeout(now);
            }
            // A replay the phone asks for again is a join.
            let again = std::iter::from_fn(|| self.clients[c].conversation.poll_effect())
                .any(|e| e == timeline_core::replay::ClientEffect::RequestReplay);
            let late = self.connect_deadline.get(&c).is_some_and(|d| *d <= now);
            let phone = self.clients[c].kind == Kind::Phone;
            if late || (again && phone) {
                self.connect_deadline.remove(&c);
                let name = self.clients[c].name(c);
                self.log(|| format!("{name} connects again"));
                self.connect(c);
            }
        }
        self.pump();
    }

    /// One message arrives.
    fn arrive(&mut self, event: Event) {
        let now = self.now;
        match event {
            Event::ToHost {
                to,
                request,
                incarnation,
            } => {
                if incarnation != self.incarnation {
                    self.log(|| format!("#{} reached a host that is gone", to.0));
                    return;
                }
                let join = matches!(request, ClientRequest::Join { .. });
                if let ClientRequest::SendNow { queue_id, .. } = &request {
                    if let Some(op) = self.queues.get(queue_id) {
                        self.user_asked.insert(op.clone());
                    }
                }
                // The relay knows which of its phones joined which session, in the
                // order the phone asked: it passes a leave on only for a join that
                // reached the host and that the phone asked before the leave (one
                // phone's requests travel on one connection; a late leave does not
                // undo a newer join).
                let phone = self.requests.get(&to.0).map(|r| r.client);
                match (&request, phone) {
                    (ClientRequest::Join { session, .. }, Some(p)) => {
                        let join = self.relay_joins.entry((p, session.clone())).or_insert(0);
                        *join = (*join).max(to.0);
                    }
                    (ClientRequest::Leave { session }, Some(p)) => {
                        let key = (p, session.clone());
                        match self.relay_joins.get(&key) {
                            Some(join) if *join < to.0 => {
                                self.relay_joins.remove(&key);
                            }
                            joined => {
                                let why = if joined.is_some() {
                                    "the phone joined again after it"
                                } else {
                                    "that phone never joined"
                                };
                                self.log(|| format!("the relay drops #{}: {why}", to.0));
                                self.requests.remove(&to.0);
                                return;
                            }
                        }
                    }
                    _ => {}
                }
                let Some(host) = self.host.as_mut() else {
                    return;
                };
                host.handle_client(to, request, now);
                if join {
                    self.check_join_effects();
                }
            }
            Event::Reply {
                to,
                reply,
                incarnation,
            } => {
                // A window subscribed or a phone joined on a host that died is not
                // connected to the one that runs now.
                let stale_connection = incarnation != self.incarnation
                    && matches!(reply, Reply::Subscribed(_) | Reply::Replay(_));
                if stale_connection {
                    self.requests.remove(&to.0);
                    self.log(|| format!("#{} answered by a host that is gone", to.0));
                } else {
                    self.deliver_reply(to, reply);
                }
            }
            Event::ToAgent { call, incarnation } => {
                let line = call_line(&call);
                self.log(|| format!("agent gets {line}"));
                // A send of a host that died meanwhile reaches the agent now.
                if let (AgentCall::Send(req), true) = (&call, incarnation < self.incarnation) {
                    self.zombies.insert(req.operation_id.clone());
                }
                // The host whose decision the agent took, for each request: a decision
                // the agent refused was not taken, so a later one from another host may
                // be the one it keeps.
                let deciding = match &call {
                    AgentCall::ResolveApproval {
                        session, request, ..
                    } => Some((session.clone(), request.request_id.clone())),
                    _ => None,
                };
                let taken_before = deciding.as_ref().is_some_and(|(s, id)| {
                    self.agent
                        .session(s)
                        .is_some_and(|a| a.decided(id).is_some())
                });
                let out = self
                    .agent
                    .call(call, &mut self.rng, &self.faults, &mut self.counts, now);
                if let Some((s, id)) = &deciding {
                    let taken = self
                        .agent
                        .session(s)
                        .is_some_and(|a| a.decided(id).is_some());
                    if taken && !taken_before {
                        self.decisions_from.insert(id.clone(), incarnation);
                    }
                }
                let first_decision = deciding
                    .as_ref()
                    .and_then(|(_, id)| self.decisions_from.get(id).copied());
                let found = std::mem::take(&mut self.agent.violations);
                // A message the user sent again after a hold asked them to check the
                // timeline: the agent may hold it, or have held it before a rollback.
                let mut user_sent: BTreeSet<OperationId> = BTreeSet::new();
                for v in found {
                    match v {
                        AgentViolation::SentTwice(op, text) if self.zombies.contains(&op) => {
                            self.known_issue(Known::PendingInputMissing, text);
                        }
                        AgentViolation::SentTwice(op, text)
                        | AgentViolation::Reappears(op, text)
                            if user_sent.contains(&op) || self.user_resends.remove(&op) =>
                        {
                            self.log(|| format!("  {text}: the user sent it again"));
                            user_sent.insert(op);
                        }
                        AgentViolation::SentTwice(_, text) => {
                            self.violate(Invariant::SentTwice, text)
                        }
                        AgentViolation::DecidedAgain(_, text)
                            if first_decision.is_some_and(|f| f != incarnation) =>
                        {
                            self.stats.decisions_again += 1;
                            self.log(|| format!("  {text}, from another host"));
                        }
                        AgentViolation::DecidedTwice(_, text)
                        | AgentViolation::DecidedAgain(_, text) => {
                            self.violate(Invariant::ApprovalTwice, text)
                        }
                        AgentViolation::Reappears(_, text) => {
                            self.violate(Invariant::ReplacedReappears, text)
                        }
                        AgentViolation::Unsupported(_, text) => {
                            self.violate(Invariant::UnsupportedControl, text)
                        }
                    }
                }
                self.agent_events();
                self.agent_out(out);
            }
            Event::FromAgent(input) => {
                let line = input_line(&input);
                self.log(|| format!("agent → host {line}"));
                self.note_input(&input);
                if let Some(host) = self.host.as_mut() {
                    let before = host.custody().stats().stale_answers;
                    host.handle_agent(input, now);
                    if host.custody().stats().stale_answers > before {
                        self.log(|| "  (stale: the host ignores it)".to_owned());
                    }
                }
            }
            Event::Relay { phone, json } => self.relay_arrives(phone, &json),
            Event::Window { desktop, delivery } => {
                if self.defect(Defect::WindowIgnoresUpdates) {
                    return;
                }
                let defect = self.cfg.defect;
                let client = &mut self.clients[desktop];
                let target = client.target();
                let o = match delivery {
                    Delivery::Window {
                        payload:
                            Payload::Blocks {
                                target: t, overlay, ..
                            },
                        ..
                    } if t == target => {
                        client.offer((overlay.settlement_epoch, overlay.revision));
                        Some(client.timeline.handle_live_update(&t, overlay, now))
                    }
                    Delivery::WindowPatch {
                        target: t,
                        mut patch,
                        ..
                    } if t == target => {
                        client.offer((patch.settlement_epoch, patch.revision));
                        if defect == Some(Defect::PatchOnAnyBase) {
                            rebase(&client.timeline, &mut patch);
                        }
                        Some(client.timeline.handle_live_patch(&t, patch, now))
                    }
                    _ => None,
                };
                if let Some(o) = o {
                    self.log(|| format!("d{desktop} window update {o:?}"));
                }
            }
            Event::HistoryBack(session) => {
                if let Some(s) = self.sessions.iter().find(|s| s.id == session) {
                    s.transcript.set_unreadable(false);
                }
                self.log(|| format!("history of {session} readable again"));
            }
            Event::OutboxWritesBack => self.stores.outbox_fault(|p| p.writes_off = false),
            Event::OverlayWritesBack => self.stores.overlay_fault(|p| p.writes_off = false),
        }
    }

    // ----- steps -------------------------------------------------------------------

    /// One step of the run.
    pub fn step(&mut self) {
        self.step += 1;
        self.inject_faults();
        if !self.violations.is_empty() {
            return;
        }
        let choice = self.rng.weighted(&[30, 12, 25, 18, 3]);
        match choice {
            // Time passes to the next arrival or deadline.
            0 => {
                let next = self.next_time().unwrap_or(self.now);
                let until = next
                    .max(self.now)
                    .min(self.now.saturating_add(millis(120_000)));
                self.advance(until);
            }
            // Time passes a while.
            1 => {
                let ms = if self.rng.chance(0.1) {
                    self.rng.range(5_000, 90_000)
                } else {
                    self.rng.range(1, 2_000)
                };
                self.advance(self.now.saturating_add(millis(ms)));
            }
            // A user acts.
            2 => self.user_action(),
            // The agent works.
            3 => {
                let running: Vec<SessionId> = self
                    .agent
                    .sessions()
                    .filter(|s| s.running().is_some())
                    .map(|s| s.session.clone())
                    .collect();
                if !running.is_empty() {
                    let s = running[self.rng.index(running.len())].clone();
                    let now = self.now;
                    let out =
                        self.agent
                            .act(&s, &mut self.rng, &self.faults, &mut self.counts, now);
                    self.agent_out(out);
                }
            }
            // An old answer arrives again.
            _ => {
                if self
                    .faults
                    .strikes(&mut self.rng, FaultKind::AgentOldAttempt)
                    && !self.old_answers.is_empty()
                {
                    self.counts.add(FaultKind::AgentOldAttempt);
                    let i = self.rng.index(self.old_answers.len());
                    let input = self.old_answers[i].clone();
                    let line = input_line(&input);
                    self.log(|| format!("old answer again: {line}"));
                    let at = self.now.saturating_add(millis(1));
                    self.net.send(at, Event::FromAgent(input));
                }
            }
        }
        // Every step takes at least a millisecond.
        self.advance(self.now.saturating_add(millis(1)));
        self.pump();
        self.sync_outbox();
    }

    fn inject_faults(&mut self) {
        if self.faults.strikes(&mut self.rng, FaultKind::HostCrash) {
            self.crash();
        }
        if self
            .faults
            .strikes(&mut self.rng, FaultKind::ClientReconnect)
        {
            let phones: Vec<usize> = (0..self.clients.len())
                .filter(|c| self.clients[*c].kind == Kind::Phone)
                .collect();
            if !phones.is_empty() {
                let p = phones[self.rng.index(phones.len())];
                self.counts.add(FaultKind::ClientReconnect);
                self.log(|| format!("p{p} reconnects"));
                if let Some(session) = self.clients[p].joined.take() {
                    self.request(p, Asked::Leave, ClientRequest::Leave { session });
                }
                self.connect(p);
                self.clients[p].timeline.reload(self.now);
            }
        }
        if self.faults.strikes(&mut self.rng, FaultKind::ClientReload) {
            let c = self.rng.index(self.clients.len());
            self.counts.add(FaultKind::ClientReload);
            self.log(|| format!("client {c} reloads"));
            self.clients[c].timeline.reload(self.now);
        }
        if self
            .faults
            .strikes(&mut self.rng, FaultKind::HistoryUnreadable)
        {
            let i = self.rng.index(self.sessions.len());
            let ms = self.rng.range(1_000, 60_000);
            self.counts.add(FaultKind::HistoryUnreadable);
            let session = self.sessions[i].id.clone();
            self.sessions[i].transcript.set_unreadable(true);
            self.log(|| format!("history of {session} unreadable for {ms} ms"));
            self.net.send(
                self.now.saturating_add(millis(ms)),
                Event::HistoryBack(session),
            );
        }
        if self.strike(FaultKind::OutboxStoreFail) {
            let how = self.rng.below(3);
            let n = self.rng.range(1, 6);
            let commit = self.rng.chance(0.3);
            let ms = self.rng.range(500, 10_000);
            self.log(|| format!("outbox store fault {how} n={n} commit_then_fail={commit}"));
            match how {
                0 | 1 => self.stores.outbox_fault(|p| {
                    p.nth = Some(p.calls + n);
                    p.commit_then_fail = commit;
                }),
                _ => {
                    self.stores.outbox_fault(|p| {
                        p.writes_off = true;
                        p.commit_then_fail = commit;
                    });
                    self.net
                        .send(self.now.saturating_add(millis(ms)), Event::OutboxWritesBack);
                }
            }
        }
        if self.strike(FaultKind::OverlayStoreFail) {
            let how = self.rng.below(3);
            let n = self.rng.range(1, 3);
            let ms = self.rng.range(500, 10_000);
            self.log(|| format!("overlay store fault {how} n={n}"));
            match how {
                0 | 1 => self.stores.overlay_fault(|p| p.fail_next = n),
                _ => {
                    self.stores.overlay_fault(|p| p.writes_off = true);
                    self.net.send(
                        self.now.saturating_add(millis(ms)),
                        Event::OverlayWritesBack,
                    );
                }
            }
        }
    }

    /// Runs every step, then brings the world to quiescence and checks it.
    pub fn run(&mut self) {
        for _ in 0..self.cfg.steps {
            self.step();
            self.check_step();
            if !self.violations.is_empty() {
                return;
            }
        }
        self.settle();
        if self.violations.is_empty() {
            self.check_final();
        }
        self.stats.runs = 1;
        self.stats.delivered = self.messages.keys().filter(|op| self.agent.had(op)).count() as u64;
        self.stats.approvals = self.agent.sessions().map(|s| s.asked.len() as u64).sum();
    }
}

/// The (epoch, revision) a relay `blocks` or `blocks-patch` event brings.
fn relay_version(json: &serde_json::Value) -> Option<(u64, u64)> {
    let o = json.get("liveOverlay").or_else(|| json.get("livePatch"))?;
    Some((o["settlementEpoch"].as_u64()?, o["revision"].as_u64()?))
}

/// The host's effects in a canonical order: each run of consecutive relay deliveries
/// sorted by session (stably). The live hub's relay repair visits sessions in the order
/// of a `HashMap`, which differs between runs; the deliveries of different sessions go
/// to different phones, so this order means nothing, but it must be the same for a seed
/// to replay bit for bit.
fn canonical(mut effects: Vec<HostEffect>) -> Vec<HostEffect> {
    let relay_session = |e: &HostEffect| match e {
        HostEffect::Deliver(Delivery::Relay(r)) => Some(r.session.clone()),
        _ => None,
    };
    let mut i = 0;
    while i < effects.len() {
        if relay_session(&effects[i]).is_none() {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < effects.len() && relay_session(&effects[j]).is_some() {
            j += 1;
        }
        effects[i..j].sort_by_key(relay_session);
        i = j;
    }
    effects
}

fn request_line(r: &ClientRequest) -> String {
    match r {
        ClientRequest::Submit(s) => format!(
            "submit {} {} {:?}/{:?}",
            s.operation_id, s.queue_id, s.controls.intent, s.controls.send_mode
        ),
        ClientRequest::Edit {
            queue_id,
            new_operation,
            ..
        } => format!("edit {queue_id} → {new_operation}"),
        ClientRequest::Remove { queue_id, .. } => format!("remove {queue_id}"),
        ClientRequest::SendNow { queue_id, .. } => format!("send-now {queue_id}"),
        ClientRequest::Reorder {
            queue_id, before, ..
        } => format!("reorder {queue_id} before {before:?}"),
        ClientRequest::Stop { session } => format!("stop {session}"),
        ClientRequest::StopAndSendNow { queue_id, .. } => format!("stop-and-send-now {queue_id}"),
        ClientRequest::LatestWindow {
            target, page_size, ..
        } => format!("latest {target} {page_size}"),
        ClientRequest::OlderPage { target, .. } => format!("older {target}"),
        ClientRequest::Anchored { target, anchor, .. } => format!("anchored {target} {anchor:?}"),
        ClientRequest::ResolveApproval {
            request_id,
            decision,
            ..
        } => format!("decide {request_id} {decision:?}"),
        ClientRequest::Subscribe { window, target, .. } => format!("subscribe {window:?} {target}"),
        ClientRequest::Unsubscribe { window } => format!("unsubscribe {window:?}"),
        ClientRequest::Join { session, protocol } => format!("join {session} {protocol:?}"),
        ClientRequest::Leave { session } => format!("leave {session}"),
        other => clip(&format!("{other:?}"), 120),
    }
}

fn reply_line(r: &Reply) -> String {
    match r {
        Reply::Submitted(Ok(receipt)) => format!(
            "submitted {} replayed={}",
            receipt.operation_id, receipt.replayed
        ),
        Reply::Submitted(Err(e)) => format!("submit refused: {e}"),
        Reply::Edited(r) => format!("edited {:?}", r.as_ref().map(|r| r.operation_id.clone())),
        Reply::Done(r) => format!("done {r:?}"),
        Reply::Stop(a) => format!("stop {a:?}"),
        Reply::LatestWindow(Ok(w)) => format!(
            "window {} rows rev {} overlay {:?} newer {}",
            w.blocks.len(),
            w.window_revision,
            w.live_overlay
                .as_ref()
                .map(|o| (o.settlement_epoch, o.revision, o.blocks.len())),
            w.newer_cursor.is_some()
        ),
        Reply::LatestWindow(Err(e)) => format!("window failed: {e}"),
        Reply::OlderPage(Ok(p)) => format!(
            "older page {} rows rev {} reload {}",
            p.blocks.len(),
            p.window_revision,
            p.reload_required
        ),
        Reply::OlderPage(Err(e)) => format!("older page failed: {e}"),
        Reply::Approval(r) => format!("approval {r:?}"),
        Reply::Subscribed(Ok(s)) => format!(
            "subscribed {} {:?}",
            s.subscription_id,
            s.overlay.as_ref().map(|o| (o.settlement_epoch, o.revision))
        ),
        Reply::Subscribed(Err(e)) => format!("subscribe failed: {e}"),
        Reply::Replay(chunks) => format!("replay of {} chunk(s)", chunks.len()),
        other => clip(&format!("{other:?}"), 120),
    }
}

pub(crate) fn call_line(c: &AgentCall) -> String {
    match c {
        AgentCall::Send(r) => format!(
            "send {} {} {:?}",
            r.operation_id,
            r.attempt,
            match &r.kind {
                outbox_core::adapter::SendKind::Start { run } => format!("start {run}"),
                outbox_core::adapter::SendKind::Steer { run } => format!("steer {run}"),
            }
        ),
        AgentCall::ReadHistory(ReadHistoryRequest {
            attempt,
            operation_id,
            ..
        }) => format!("read-history {operation_id} {attempt}"),
        AgentCall::Stop(StopRequest { attempt, run, .. }) => format!("stop {run} {attempt}"),
        AgentCall::TakeBack(TakeBackRequest {
            attempt,
            operation_id,
            ..
        }) => format!("take-back {operation_id} {attempt}"),
        AgentCall::ResolveApproval {
            request, decision, ..
        } => format!("resolve {} {decision:?}", request.request_id),
        AgentCall::ClearThreadLink { session } => format!("clear-thread-link {session}"),
        other => clip(&format!("{other:?}"), 120),
    }
}

pub(crate) fn input_line(i: &AgentInput) -> String {
    match i {
        AgentInput::SendResult { attempt, result } => format!("send-result {attempt} {result:?}"),
        AgentInput::HistoryRead { attempt, read } => format!("history {attempt} {read:?}"),
        AgentInput::StopResult { attempt, result } => format!("stop-result {attempt} {result:?}"),
        AgentInput::TakeBack { attempt, result } => format!("take-back {attempt} {result:?}"),
        AgentInput::DeliveryProof { operation_id, .. } => format!("proof {operation_id}"),
        AgentInput::Rows { rows, .. } => format!(
            "rows [{}]",
            rows.iter()
                .map(|r| r.block.id.as_str().to_owned())
                .collect::<Vec<_>>()
                .join(" ")
        ),
        AgentInput::RunActive { run, .. } => format!("run-active {run}"),
        AgentInput::RolledBack { operation_id, .. } => format!("rolled-back {operation_id}"),
        AgentInput::RunEnded {
            run,
            outcome,
            untaken,
            ..
        } => format!("run-ended {run} {outcome:?} untaken {untaken:?}"),
        AgentInput::ApprovalAsked { request, .. } => {
            format!("approval-asked {}", request.request_id)
        }
        AgentInput::ApprovalResolved {
            request_id, result, ..
        } => format!("approval-resolved {request_id} {result:?}"),
        other => clip(&format!("{other:?}"), 120),
    }
}

impl World {
    /// The backend of this run.
    pub fn stores_backend(&self) -> Backend {
        self.stores.backend()
    }
}

/// The defect [`Defect::PatchOnAnyBase`]: the patch claims the base the client holds in
/// its epoch, so the client applies it there.
fn rebase(timeline: &timeline_core::Timeline, patch: &mut LivePatch) {
    if let Some((epoch, revision)) = timeline.overlay_version() {
        if epoch == patch.settlement_epoch && revision < patch.revision {
            patch.base_revision = revision;
        }
    }
}
