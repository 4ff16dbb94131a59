//! The host machine: see the crate docs for the loop.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};

use outbox_core::adapter::SendKind;
use outbox_core::custody::{self, Custody, SessionInfo};
use outbox_core::ids::OperationId;
use outbox_core::runs::STALE_RUN_AFTER;
use outbox_core::store::{OutboxError, OutboxStore};
use overlay_core::live::{Delivery, LiveHub, LiveProtocol, Payload, RelayOutcome};

use crate::events::SessionLogs;
use overlay_core::live::{RunEvent, RunEventKind};
use overlay_core::overlay::{Change, LiveSequencer};
use overlay_core::replay::{EventKind, ReplayBuffers, ReplayConfig, RunningState};
use overlay_core::scan::{self, ExactScans, ScanEffect, ScanReport};
use overlay_core::source::HistorySource;
use overlay_core::store::{self as overlay_store, WriteResult};
use overlay_core::store::{CleanupJournal, OverlayError, OverlayStore};
use overlay_core::store::{RowClass, StoredBlock, StoredOverlay};
use overlay_core::window::{self, BuildError, OlderPageRequest, Target};
use timeline_core::key::{BlockKey, RunId, SessionId, TargetId};
use timeline_core::policy::ANCHORED_PAGE_SIZE;
use timeline_core::seal::HostKey;
use timeline_core::time::Millis;

use crate::approvals::{ApprovalEffect, ApprovalId, Approvals};
use crate::io::{
    AgentCall, AgentInput, ClientRequest, HostEffect, LoadError, NewSessionError, Notice, Reply,
    ReplyTo, SessionSummary,
};
use crate::run_book::RunBook;

/// History pages of [`EXACT_SCAN_PAGE`] items an exact scan reads back from the present
/// of each target, at most, while keys of the run are still missing.
pub const EXACT_SCAN_READS: usize = 20;
/// Items per page of an exact scan's history read.
pub const EXACT_SCAN_PAGE: usize = 100;

/// A live row or approval card the overlay store refused is written again this long
/// after (and a target whose cards could not be read at start is read again).
const WRITE_RETRY: Millis = Millis(1_000);

/// How many runs whose rows left history each session remembers (OV-10).
const LEFT_RUNS_KEPT: usize = 16;

/// How a host is set up: [`HostConfig::new`], then change what differs.
#[non_exhaustive]
pub struct HostConfig {
    /// Seals cursors and anchor tokens; keep it across restarts.
    pub key: HostKey,
    /// Caps and timers of the replay buffers.
    pub replay: ReplayConfig,
    /// Fresh UUIDs for custody (run IDs, attempt bases). The host draws no randomness.
    pub uuids: Box<dyn FnMut() -> String + Send>,
    /// Serve only the sessions granted with [`Host::grant_session`] (default: every
    /// session): for a host among several on one database, each serving the session
    /// scopes whose lease it holds.
    pub granted_only: bool,
    /// The bound of each session's event log in bytes ([`SESSION_LOG_BYTES`] by
    /// default): past it the oldest messages go.
    ///
    /// [`SESSION_LOG_BYTES`]: crate::SESSION_LOG_BYTES
    pub session_log_bytes: usize,
    /// The bound of every session's event log together in bytes ([`SESSION_LOGS_BYTES`]
    /// by default): past it the log appended to longest ago goes.
    ///
    /// [`SESSION_LOGS_BYTES`]: crate::SESSION_LOGS_BYTES
    pub session_logs_bytes: usize,
}

impl HostConfig {
    /// A host sealing with `key`, drawing UUIDs from `uuids`, with the seed's replay
    /// caps.
    pub fn new(key: HostKey, uuids: Box<dyn FnMut() -> String + Send>) -> Self {
        HostConfig {
            key,
            replay: ReplayConfig::default(),
            uuids,
            granted_only: false,
            session_log_bytes: crate::SESSION_LOG_BYTES,
            session_logs_bytes: crate::SESSION_LOGS_BYTES,
        }
    }
}

impl std::fmt::Debug for HostConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostConfig")
            .field("replay", &self.replay)
            .finish_non_exhaustive()
    }
}

/// Why [`Host::start`] failed: nothing was changed, and starting again is safe.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The outbox could not be read.
    #[error("the outbox could not be read at start: {0}")]
    Outbox(#[from] OutboxError),
}

/// The history source of one timeline target.
type Source = Box<dyn HistorySource + Send>;

/// One session the host serves.
struct Session {
    /// Its history sources, by target (the main conversation first, then child threads).
    sources: BTreeMap<TargetId, Source>,
    /// Runs the exact scans must repeat after a restart (the cleanup journal's rows),
    /// started when the session's first target opens.
    repair: Vec<RunId>,
    /// A history rewrite (OV-10) the cleanup journal kept from before a restart: done
    /// when the session's first target opens.
    rewrite: bool,
}

/// The run ID under which the cleanup journal keeps a session's pending history rewrite
/// (OV-10): a write that announces lost history and was refused is recorded there, so
/// a restart does it again. No run of an agent has this ID (runs are `run-<uuid>-<ms>`).
pub const REWRITE_JOURNAL_RUN: &str = "custody-history-rewrite";

fn rewrite_journal_run() -> Option<RunId> {
    RunId::new(REWRITE_JOURNAL_RUN).ok()
}

/// The host machine. See the crate docs.
pub struct Host<O, V> {
    custody: Custody<O>,
    overlays: V,
    key: HostKey,
    sessions: BTreeMap<SessionId, Session>,
    hub: LiveHub,
    scans: ExactScans,
    replay: ReplayBuffers,
    sequencer: LiveSequencer,
    approvals: Approvals,
    /// The runs the hub was told about: started and not ended, the last one ended (so
    /// the agent's own report of an end custody already let go is not sent twice), and
    /// the one a stop was sent for.
    runs: RunBook,
    /// Phones joined to each session (joins not yet left): the relay keeps the
    /// session's interest while any is.
    phones: BTreeMap<SessionId, Phones>,
    /// Rows and approval cards whose write the overlay store refused, by session,
    /// target and key (the newest of a key), tried again at `retry_at`: a client that
    /// loaded its window before would otherwise never see them, and a card never comes
    /// back from history at all.
    unsaved: BTreeMap<(SessionId, TargetId, BlockKey), Unsaved>,
    /// Scopes an overlay write found this host no longer holds: let go at the next pump.
    lost: BTreeSet<SessionId>,
    retry_at: Option<Millis>,
    /// Sessions whose history lost rows (OV-10) and whose announcing write the overlay
    /// store refused: written again at `retry_at`.
    rewrites: BTreeSet<SessionId>,
    /// Sessions whose pending rewrite the cleanup journal holds ([`REWRITE_JOURNAL_RUN`]).
    rewrites_journaled: BTreeSet<SessionId>,
    /// Runs whose rows left the agent's history (a rolled-back turn, a gone thread), the
    /// last [`LEFT_RUNS_KEPT`] per session: a late row of theirs is not published.
    left_runs: BTreeMap<SessionId, VecDeque<RunId>>,
    /// Operations whose user message the replay holds already, by session (RB-02).
    replayed: ReplayedSends,
    stats: HostStats,
    effects: VecDeque<HostEffect>,
    events: SessionLogs,
}

/// Counters of what a host did, for diagnostics and metrics ([`Host::stats`]). Each
/// only grows; compare two snapshots for a rate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HostStats {
    /// Live deliveries handed out (desktop windows, the progress sink, the relay).
    pub deliveries: u64,
    /// Of those, relay events.
    pub relay_events: u64,
    /// The relay events' JSON, in bytes as `serde_json` writes them compactly.
    pub relay_bytes: u64,
    /// Overlay writes the store refused (live rows, cards, announcements of lost history).
    pub overlay_write_failures: u64,
    /// Writes kept for a retry and tried again.
    pub write_retries: u64,
    /// Exact scans run (OV-06).
    pub exact_scans: u64,
    /// Runs whose exact scans ended with rows unsettled.
    pub scans_gave_up: u64,
    /// Replays answered to a phone's join (RB-03).
    pub replays: u64,
    /// Replay chunks in those answers.
    pub replay_chunks: u64,
    /// Announcements that a session's history lost rows (OV-10).
    pub history_rewrites: u64,
    /// Custody's own counters (stale answers, outbox store failures, loads).
    pub custody: outbox_core::custody::CustodyStats,
}

/// Counts the bytes written into it.
struct ByteCount(u64);

impl std::io::Write for ByteCount {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 = self.0.saturating_add(buf.len() as u64);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The operations whose user message each session's replay recorded: a message sent
/// again (a deferred send, a fresh thread, the user's own send after a hold) is the same
/// message, so the replay records it once. At most as many per session as the replay
/// keeps events: an older one has left the replay anyway.
#[derive(Debug, Default)]
struct ReplayedSends {
    cap: usize,
    by_session: BTreeMap<SessionId, (VecDeque<OperationId>, BTreeSet<OperationId>)>,
}

impl ReplayedSends {
    fn new(cap: usize) -> Self {
        ReplayedSends {
            cap: cap.max(1),
            by_session: BTreeMap::new(),
        }
    }

    /// True the first time `op` is seen for `session`.
    fn first(&mut self, session: &SessionId, op: &OperationId) -> bool {
        let (order, seen) = self.by_session.entry(session.clone()).or_default();
        if !seen.insert(op.clone()) {
            return false;
        }
        order.push_back(op.clone());
        while order.len() > self.cap {
            if let Some(old) = order.pop_front() {
                seen.remove(&old);
            }
        }
        true
    }
}

/// A write the overlay store refused, kept to be tried again.
#[derive(Clone, Debug)]
enum Unsaved {
    /// An ordinary live row of the agent's.
    Row(StoredBlock),
    /// An approval card, pending or decided.
    Card {
        /// The card.
        row: StoredBlock,
        /// Whether it shows a decision.
        decided: bool,
    },
}

/// The phones joined to a session (joins not yet left), and whether every one of them
/// asked for patches. A leave does not say which phone left, so a session whose relay
/// fell back to snapshots keeps them until its last phone leaves (snapshots every phone
/// reads).
#[derive(Clone, Copy, Debug)]
struct Phones {
    joined: usize,
    all_patch: bool,
}

impl<O, V> std::fmt::Debug for Host<O, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host")
            .field("sessions", &self.sessions.len())
            .field("runs", &self.runs)
            .field("effects", &self.effects.len())
            .finish_non_exhaustive()
    }
}

impl<O: OutboxStore, V: OverlayStore + CleanupJournal> Host<O, V> {
    /// A host over an outbox store and an overlay store (two connections to one SQLite
    /// file, or the memory stores). Call [`Host::start`] before anything else.
    pub fn new(outbox: O, overlays: V, config: HostConfig) -> Self {
        let mut custody = Custody::new(outbox, config.uuids);
        if config.granted_only {
            custody.grant_only();
        }
        Host {
            custody,
            overlays,
            key: config.key,
            sessions: BTreeMap::new(),
            hub: LiveHub::new(),
            scans: ExactScans::new(),
            replayed: ReplayedSends::new(config.replay.max_events),
            stats: HostStats::default(),
            replay: ReplayBuffers::new(config.replay),
            sequencer: LiveSequencer::new(),
            approvals: Approvals::default(),
            runs: RunBook::default(),
            phones: BTreeMap::new(),
            unsaved: BTreeMap::new(),
            lost: BTreeSet::new(),
            retry_at: None,
            rewrites: BTreeSet::new(),
            rewrites_journaled: BTreeSet::new(),
            left_runs: BTreeMap::new(),
            effects: VecDeque::new(),
            events: SessionLogs::new(config.session_log_bytes, config.session_logs_bytes),
        }
    }

    /// Reads every saved outbox (entries still sending are confirmed from the agent's
    /// history) and the cleanup journal (its runs are scanned again when their session
    /// opens). Call once, after the sessions are added.
    ///
    /// # Errors
    ///
    /// [`StartError`] when the outbox cannot be read.
    pub fn start(&mut self, now: Millis) -> Result<(), StartError> {
        self.custody.start_up(now)?;
        self.restore_cards(now);
        self.read_journal(None);
        self.pump(now);
        Ok(())
    }

    /// Reads the cleanup journal (of one session, or of all): each run's scans repeat
    /// when its session's target next opens (the restart repair, a capability of its
    /// own), and a rewrite a host before this one could not write is redone.
    fn read_journal(&mut self, session: Option<&SessionId>) {
        match self.overlays.pending_cleanups(session) {
            Ok(rows) => {
                for (session, run) in rows {
                    if Some(&run) == rewrite_journal_run().as_ref() {
                        if let Some(s) = self.sessions.get_mut(&session) {
                            s.rewrite = true;
                        }
                        continue;
                    }
                    let repair = self
                        .custody
                        .session(&session)
                        .is_some_and(|i| i.capabilities.restart_repair);
                    if let (true, Some(s)) = (repair, self.sessions.get_mut(&session)) {
                        if !s.repair.contains(&run) {
                            s.repair.push(run);
                        }
                    }
                }
            }
            Err(error) => self.notice(Notice::JournalFailed {
                session: session.cloned(),
                run: None,
                error,
            }),
        }
    }

    /// The approval cards the overlay store kept across a restart are known again, so
    /// the agent's resolution after the restart decides them (RW-06).
    fn restore_cards(&mut self, now: Millis) {
        let targets: BTreeSet<(SessionId, TargetId)> = self
            .sessions
            .iter()
            .flat_map(|(s, x)| x.sources.keys().map(move |t| (s.clone(), t.clone())))
            .collect();
        self.approvals.read_again(targets);
        self.read_cards(now);
    }

    /// Reads the cards of every target whose cards are not known yet; a target the
    /// store cannot read now is read again after [`WRITE_RETRY`]. Resolutions that came
    /// for requests not known then are applied once their cards are.
    fn read_cards(&mut self, now: Millis) {
        let mut read_any = false;
        for (session, target) in self.approvals.unread() {
            match self.overlays.load(&session, &target) {
                Ok(stored) => {
                    let active = self
                        .custody
                        .runs()
                        .active(&session)
                        .map(|r| r.run_id.clone());
                    let rows = stored.iter().flat_map(|o| o.blocks.iter());
                    self.approvals
                        .cards_read(&session, &target, rows, active.as_ref());
                    self.drain_approvals(now);
                    read_any = true;
                }
                Err(error) => {
                    self.notice(Notice::CardsUnread {
                        session,
                        target,
                        error,
                    });
                    self.retry_at.get_or_insert(now.saturating_add(WRITE_RETRY));
                }
            }
        }
        if read_any {
            for (id, result) in self.approvals.take_late() {
                self.approval_resolved(id, result, now);
            }
        }
    }

    /// The agent resolved an approval (or did not take a decision). A resolution for a
    /// request the host does not know while cards kept from before a restart are still
    /// unread waits for them.
    fn approval_resolved(
        &mut self,
        id: ApprovalId,
        result: Result<timeline_core::rows::ApprovalResult, String>,
        now: Millis,
    ) {
        if self.approvals.wants_cards_for(&id) {
            self.read_cards(now);
        }
        let (runs, custody) = (&self.runs, &self.custody);
        self.approvals.resolved(id, result, |session, run| {
            runs.gone(session) == Some(run)
                || custody.runs().active(session).map(|r| &r.run_id) != Some(run)
        });
        self.drain_approvals(now);
    }

    /// Does what the approvals machine asks, in its order.
    fn drain_approvals(&mut self, now: Millis) {
        while let Some(effect) = self.approvals.poll_effect() {
            match effect {
                ApprovalEffect::Replay {
                    session,
                    kind,
                    event,
                } => self.append_replay(&session, kind, &event, now),
                ApprovalEffect::PublishCard {
                    session,
                    target,
                    row,
                    decided,
                } => self.publish_card(&session, &target, row, decided, now),
                ApprovalEffect::SaveDecision {
                    id,
                    session,
                    target,
                    row,
                } => {
                    let saved = self.publish_rows(&session, &target, vec![row], now);
                    self.approvals.decision_saved(&id, saved);
                }
                ApprovalEffect::SendDecision {
                    session,
                    request,
                    decision,
                } => self
                    .effects
                    .push_back(HostEffect::Agent(AgentCall::ResolveApproval {
                        session,
                        request,
                        decision,
                    })),
                ApprovalEffect::Reply { to, reply } => {
                    self.effects.push_back(HostEffect::Reply { to, reply })
                }
                ApprovalEffect::Stamp {
                    session,
                    request_id,
                    allowed,
                } => self.replay.decide_approval(&session, &request_id, allowed),
                ApprovalEffect::Failed(e) => self.notice(Notice::Unknown(e)),
            }
        }
    }

    /// Serves a session: what its agent supports, and the history source of its main
    /// conversation. Adding a session again replaces its info and source.
    pub fn add_session(&mut self, session: &SessionId, info: SessionInfo, source: Source) {
        self.custody.set_session(session, info);
        let entry = self.sessions.entry(session.clone()).or_insert(Session {
            sources: BTreeMap::new(),
            repair: Vec::new(),
            rewrite: false,
        });
        entry.sources.insert(TargetId::main(session), source);
    }

    /// The embedder's answer to [`HostEffect::OpenSession`]: the session it made (and
    /// added with [`Host::add_session`]), or why it made none. The client is answered
    /// [`Reply::SessionOpened`]; a session named but not added is
    /// [`NewSessionError::NotAdded`], never an answer that names a session nobody serves.
    pub fn handle_session_opened(
        &mut self,
        to: ReplyTo,
        result: Result<SessionId, NewSessionError>,
        _now: Millis,
    ) {
        let result = result.and_then(|session| {
            if self.sessions.contains_key(&session) {
                Ok(session)
            } else {
                Err(NewSessionError::NotAdded(session))
            }
        });
        self.effects.push_back(HostEffect::Reply {
            to,
            reply: Reply::SessionOpened(result),
        });
    }

    /// Every session served here (granted, when the host serves only granted ones), in
    /// session order. O(sessions).
    fn session_summaries(&self) -> Vec<SessionSummary> {
        self.sessions
            .keys()
            .filter(|s| self.custody.scope_granted(s))
            .filter_map(|s| {
                let info = self.custody.session(s)?;
                Some(SessionSummary {
                    session: s.clone(),
                    agent: info.capabilities.agent,
                    title: info.title.clone(),
                    cwd: info.cwd.clone(),
                    active_run: self.custody.runs().active(s).map(|r| r.run_id.clone()),
                })
            })
            .collect()
    }

    /// Adds the history source of a child thread or subagent of `session`.
    pub fn add_target(&mut self, session: &SessionId, target: TargetId, source: Source) {
        if let Some(s) = self.sessions.get_mut(session) {
            s.sources.insert(target, source);
        }
    }

    /// What the host did so far: deliveries, relay bytes, write failures and retries,
    /// exact scans, replays, and custody's counters. O(1).
    pub fn stats(&self) -> HostStats {
        HostStats {
            custody: self.custody.stats(),
            ..self.stats
        }
    }

    /// The custody machine, to read (entries, runs, stats, store failures).
    pub fn custody(&self) -> &Custody<O> {
        &self.custody
    }

    /// The outbox entries of a session, as saved.
    ///
    /// # Errors
    ///
    /// The outbox store's error when it cannot be read.
    pub fn entries(
        &mut self,
        session: &SessionId,
    ) -> Result<Vec<outbox_core::entry::StoredEntry>, OutboxError> {
        self.custody.entries(session)
    }

    /// The overlay store. Writes through it bypass the host: no client is told of them
    /// and the host's exact scans do not see them, so it is for reading what is saved
    /// (and, in tests, for changing how a test store behaves).
    pub fn overlays(&mut self) -> &mut V {
        &mut self.overlays
    }

    // ----- the loop -------------------------------------------------------------------

    /// Next effect to carry out.
    #[must_use]
    pub fn poll_effect(&mut self) -> Option<HostEffect> {
        self.effects.pop_front()
    }

    /// The earliest deadline of every machine inside; call [`Host::handle_timeout`] then.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Millis> {
        [
            self.custody.poll_timeout(),
            self.hub.poll_timeout(),
            self.scans.poll_timeout(),
            self.replay.poll_timeout(),
            self.retry_at,
            self.stale_at(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Handles every deadline that passed. Safe to call early or twice.
    pub fn handle_timeout(&mut self, now: Millis) {
        self.custody.handle_timeout(now);
        self.scans.handle_timeout(now);
        self.replay.handle_timeout(now);
        self.hub.handle_timeout(now);
        if self.retry_at.is_some_and(|at| at <= now) {
            self.retry_writes(now);
            self.read_cards(now);
        }
        if self.stale_at().is_some_and(|at| at <= now) {
            // Custody reclaims a stale run at its next start or when the active runs are
            // read (OB-14); with nothing else happening that is now, or the queue
            // behind the run would wait for ever.
            self.custody.reclaim_stale_runs(now);
        }
        self.pump(now);
    }

    /// When the earliest active run becomes stale ([`STALE_RUN_AFTER`] without
    /// activity), if any run is active.
    fn stale_at(&self) -> Option<Millis> {
        self.sessions
            .keys()
            .filter_map(|s| self.custody.runs().active(s))
            .map(|r| {
                r.last_activity
                    .saturating_add(STALE_RUN_AFTER)
                    .saturating_add(Millis(1))
            })
            .min()
    }

    /// Serves the scope of `session` (its base session and the alias) from now on: this
    /// host acquired its lease ([`HostConfig::granted_only`]). Called again while held,
    /// it reads the scope again (another host wrote into it: a session message). Each
    /// saved outbox of the scope is read and checked as at a restart, so a message a
    /// host that died had out with its agent is confirmed from history, never sent
    /// again blindly; then the queues drain.
    pub fn grant_session(&mut self, session: &SessionId, now: Millis) {
        self.custody.grant_scope(session, now);
        // The journal rows of the scope, perhaps left by a host that died: their scans
        // repeat when the session next opens, as after a restart.
        let base = outbox_core::ids::base_session(session);
        let members: Vec<SessionId> = self
            .sessions
            .keys()
            .filter(|s| outbox_core::ids::base_session(s) == base)
            .cloned()
            .collect();
        for member in members {
            self.read_journal(Some(&member));
        }
        self.pump(now);
    }

    /// Stops serving the scope of `session` (the host hands it over, or its lease was
    /// lost): custody drops it, [`Notice::SessionReleased`] says so. What the agent still
    /// answers for it is ignored; its rows are refused by the store's fencing.
    pub fn release_session(&mut self, session: &SessionId, reason: &str, now: Millis) {
        self.let_go(session, reason);
        self.pump(now);
    }

    /// Drops the scope of `session` from custody and the rows waiting to be written again.
    fn let_go(&mut self, session: &SessionId, reason: &str) {
        let base = outbox_core::ids::base_session(session);
        self.custody.release_scope(&base, reason);
        self.unsaved
            .retain(|(s, _, _), _| outbox_core::ids::base_session(s) != base);
        // Its scans and journal rows are the next owner's to repeat; its replay would
        // have a gap were the scope to come back here, so it starts again empty.
        self.scans
            .forget(|s| outbox_core::ids::base_session(s) == base);
        for (s, state) in &mut self.sessions {
            if outbox_core::ids::base_session(s) == base {
                state.repair.clear();
                state.rewrite = false;
                self.replay.reclaim(s);
                self.replayed.by_session.remove(s);
                self.events.forget(s);
            }
        }
    }

    /// Whether this host serves the scope of `session` now.
    pub fn serves(&self, session: &SessionId) -> bool {
        self.custody.scope_granted(session)
    }

    /// A client request; its [`Reply`] comes out of [`Host::poll_effect`] addressed to
    /// `to` (at once, or for a stop or an approval once the agent answered).
    pub fn handle_client(&mut self, to: ReplyTo, request: ClientRequest, now: Millis) {
        let reply = match request {
            ClientRequest::Submit(req) => Some(Reply::Submitted(self.custody.submit(req, now))),
            ClientRequest::Edit {
                session,
                queue_id,
                new_operation,
                request,
            } => Some(Reply::Edited(self.custody.edit(
                &session,
                &queue_id,
                new_operation,
                request,
                now,
            ))),
            ClientRequest::Remove { session, queue_id } => {
                Some(Reply::Done(self.custody.remove(&session, &queue_id, now)))
            }
            ClientRequest::Reorder {
                session,
                queue_id,
                before,
            } => Some(Reply::Done(self.custody.reorder(
                &session,
                &queue_id,
                before.as_ref(),
                now,
            ))),
            ClientRequest::SendNow { session, queue_id } => {
                Some(Reply::Done(self.custody.send_now(&session, &queue_id, now)))
            }
            ClientRequest::StopAndSendNow { session, queue_id } => Some(Reply::Done(
                self.custody.stop_and_send_now(&session, &queue_id, now),
            )),
            ClientRequest::Stop { session } => {
                match self
                    .custody
                    .runs()
                    .active(&session)
                    .map(|r| r.run_id.clone())
                {
                    Some(run) => {
                        self.custody.stop(&session, &run, Some(to.0), now);
                        None
                    }
                    None => Some(Reply::Stop(custody::StopAnswer::Stopped)),
                }
            }
            ClientRequest::LatestWindow {
                session,
                target,
                page_size,
            } => Some(Reply::LatestWindow(
                self.window(&session, &target, page_size, None, now),
            )),
            ClientRequest::ReconcileSessions { sessions } => {
                Some(Reply::Reconciled(self.reconcile(sessions, now)))
            }
            ClientRequest::Anchored {
                session,
                target,
                anchor,
            } => Some(Reply::LatestWindow(self.window(
                &session,
                &target,
                ANCHORED_PAGE_SIZE,
                Some(&anchor),
                now,
            ))),
            ClientRequest::OlderPage {
                session,
                target,
                cursor,
                page_size,
                expected_boundary_token,
            } => {
                let req = OlderPageRequest {
                    cursor: &cursor,
                    page_size,
                    expected_boundary_token: expected_boundary_token.as_ref(),
                };
                let page = match self
                    .sessions
                    .get_mut(&session)
                    .and_then(|s| s.sources.get_mut(&target))
                {
                    Some(source) => {
                        window::older_page(source.as_mut(), &self.key, req).map_err(LoadError::from)
                    }
                    None => Err(LoadError::UnknownTarget { session, target }),
                };
                Some(Reply::OlderPage(page))
            }
            ClientRequest::ResolveApproval {
                request_id,
                thread_id,
                turn_id,
                item_id,
                decision,
            } => {
                // Saved first, then sent: a host that restarts finds the decision on
                // its way on the kept card (see `approvals`).
                let id = ApprovalId::new(request_id, thread_id, turn_id, item_id);
                self.approvals.decide(id, decision, to);
                self.drain_approvals(now);
                None
            }
            ClientRequest::Subscribe {
                window,
                session,
                target,
                protocol,
            } => {
                self.open_target(&session, now);
                Some(Reply::Subscribed(self.hub.subscribe_with(
                    &mut self.overlays,
                    window,
                    &session,
                    &target,
                    protocol,
                )))
            }
            ClientRequest::Unsubscribe { window } => {
                self.hub.unsubscribe(window);
                Some(Reply::Done(Ok(())))
            }
            ClientRequest::Join { session, protocol } => {
                self.open_target(&session, now);
                // The session's relay speaks patches only while every phone that joined
                // does: a phone that knows only snapshots never gets a patch.
                let phones = self.phones.entry(session.clone()).or_insert(Phones {
                    joined: 0,
                    all_patch: true,
                });
                phones.joined += 1;
                phones.all_patch &= protocol == LiveProtocol::Patches;
                let speaks = if phones.all_patch {
                    LiveProtocol::Patches
                } else {
                    LiveProtocol::Snapshots
                };
                self.hub.set_relay_protocol(&session, speaks);
                self.hub.set_phone_interest(&session, true);
                self.replay.subscribe(&session, now);
                let chunks = self.replay.replay(&session);
                self.stats.replays += 1;
                self.stats.replay_chunks += chunks.len() as u64;
                Some(Reply::Replay(chunks))
            }
            ClientRequest::Leave { session } => {
                // Interest lasts while any phone that joined is still there.
                let left = match self.phones.get_mut(&session) {
                    Some(p) if p.joined > 1 => {
                        p.joined -= 1;
                        false
                    }
                    _ => {
                        self.phones.remove(&session);
                        true
                    }
                };
                if left {
                    self.hub.set_phone_interest(&session, false);
                }
                self.replay.unsubscribe(&session, now);
                Some(Reply::Done(Ok(())))
            }
            ClientRequest::ListRuns => Some(Reply::Runs(self.custody.active_runs(now))),
            ClientRequest::ListSessions => Some(Reply::Sessions(self.session_summaries())),
            ClientRequest::SessionPage {
                session,
                before,
                max_events,
            } => Some(Reply::SessionPage(
                self.session_page(&session, before, max_events),
            )),
            ClientRequest::NewSession(request) => {
                self.effects
                    .push_back(HostEffect::OpenSession { to, request });
                None
            }
        };
        if let Some(reply) = reply {
            self.effects.push_back(HostEffect::Reply { to, reply });
        }
        self.pump(now);
    }

    /// A delivery from [`HostEffect::Deliver`] was not carried out (the window or the relay
    /// was gone, the write failed), or its recipient refused it (a timeline answered a
    /// patch with `Ignored(BaseMismatch)`): the host forgets what that recipient holds,
    /// so its next `blocks` update is a whole snapshot instead of a patch on a base it
    /// does not have.
    pub fn handle_delivery_lost(&mut self, delivery: &Delivery, now: Millis) {
        self.hub.report_lost(delivery);
        self.pump(now);
    }

    /// An answer from the agent, or something the agent did.
    pub fn handle_agent(&mut self, input: AgentInput, now: Millis) {
        match input {
            AgentInput::SendResult { attempt, result } => {
                self.custody.handle_send_result(attempt, result, now);
            }
            AgentInput::HistoryRead { attempt, read } => {
                self.custody.handle_history_read(attempt, read, now);
            }
            AgentInput::StopResult { attempt, result } => {
                self.custody.handle_stop_result(attempt, result, now);
            }
            AgentInput::TakeBack { attempt, result } => {
                self.custody.handle_take_back(attempt, result, now);
            }
            AgentInput::DeliveryProof {
                session,
                operation_id,
            } => self
                .custody
                .handle_delivery_proof(&session, &operation_id, now),
            AgentInput::RolledBack {
                session,
                operation_id,
            } => {
                self.custody
                    .handle_rolled_back(&session, &operation_id, now);
                self.history_rewritten(&session, now);
            }
            AgentInput::Rows {
                session,
                target,
                mut rows,
            } => {
                // A late row of a turn that left history would never settle (OV-10).
                if let Some(left) = self.left_runs.get(&session) {
                    rows.retain(|r| r.run_id.as_ref().is_none_or(|run| !left.contains(run)));
                }
                if !rows.is_empty() {
                    self.publish_rows(&session, &target, rows, now);
                }
            }
            AgentInput::Delta { session, fragment } => {
                // Only a session served here is logged: a scope let go is the next
                // owner's to show.
                if self.custody.session(&session).is_some() && self.serves(&session) {
                    let custody = &mut self.custody;
                    let event = self
                        .events
                        .delta(&session, fragment, now.as_u64(), || custody.fresh_uuid());
                    self.emit_event(&session, event, now);
                }
            }
            AgentInput::RunActive { session, run } => self.custody.touch_run(&session, &run, now),
            AgentInput::RunEnded {
                session,
                run,
                outcome,
                untaken,
            } => {
                self.custody.handle_run_ended(&session, &run, &untaken, now);
                if self.runs.live(&session) == Some(&run) {
                    self.run_gone(&session, &run, outcome, now);
                } else if self.runs.gone(&session) != Some(&run) {
                    // A run this host did not start (a turn the agent began, or one
                    // from before a restart): its end is news to the clients too.
                    self.runs.set_live(&session, &run);
                    self.run_gone(&session, &run, outcome, now);
                }
            }
            AgentInput::SessionMessage(call) => {
                let session = call.sender_session.clone();
                let call_id = call.call_id.clone();
                let result = match self.custody.send_session_message(call, now) {
                    Ok(result) => result,
                    Err(error) => outbox_core::session_message::ToolResult::Error {
                        message: error.to_string(),
                    },
                };
                self.effects
                    .push_back(HostEffect::Agent(AgentCall::SessionMessageResult {
                        session,
                        call_id,
                        result,
                    }));
            }
            AgentInput::ApprovalAsked {
                session,
                target,
                run,
                request,
                summary,
            } => {
                self.approvals
                    .asked(&session, &target, run, request, summary, now);
                self.drain_approvals(now);
            }
            AgentInput::ApprovalResolved {
                request_id,
                thread_id,
                turn_id,
                item_id,
                result,
            } => self.approval_resolved(
                ApprovalId::new(request_id, thread_id, turn_id, item_id),
                result,
                now,
            ),
        }
        self.pump(now);
    }

    // ----- loads --------------------------------------------------------------------

    /// A latest window (`anchor: None`) or an anchored one. Opening a target first
    /// starts the restart repair of its session.
    fn window(
        &mut self,
        session: &SessionId,
        target: &TargetId,
        page_size: usize,
        anchor: Option<&timeline_core::anchor::Anchor>,
        now: Millis,
    ) -> Result<timeline_core::wire::TimelineWindow, LoadError> {
        self.open_target(session, now);
        let run = self
            .custody
            .runs()
            .active(session)
            .map(|r| r.run_id.clone());
        let t = Target {
            session,
            target,
            current_run: run.as_ref(),
        };
        let Some(source) = self
            .sessions
            .get_mut(session)
            .and_then(|s| s.sources.get_mut(target))
        else {
            return Err(LoadError::UnknownTarget {
                session: session.clone(),
                target: target.clone(),
            });
        };
        let (store, key) = (&mut self.overlays, &self.key);
        let built = match anchor {
            None => window::latest_window(store, source.as_mut(), key, t, page_size),
            Some(anchor) => window::anchored_window(store, source.as_mut(), key, t, anchor),
        };
        self.built(session, target, built, now)
    }

    /// `run.chatReconcileSessions`: the caps are checked before anything is read (a
    /// session named twice is invalid params: the seed is silent, and one answer per
    /// session is what a client merges); each
    /// session's outbox is loaded as a client load does (OB-10), and what settlement
    /// saved is sent, also when a later session failed.
    fn reconcile(
        &mut self,
        sessions: Vec<SessionId>,
        now: Millis,
    ) -> Result<Vec<window::SessionSnapshot>, LoadError> {
        use timeline_core::policy::RECONCILE_MAX_SESSIONS;
        if sessions.len() > RECONCILE_MAX_SESSIONS {
            return Err(LoadError::Window(window::WindowError::InvalidParams(
                format!("at most {RECONCILE_MAX_SESSIONS} sessions per call"),
            )));
        }
        let mut named = BTreeSet::new();
        if let Some(twice) = sessions.iter().find(|s| !named.insert(*s)) {
            return Err(LoadError::Window(window::WindowError::InvalidParams(
                format!("session {twice} is named twice"),
            )));
        }
        let mut outboxes = Vec::with_capacity(sessions.len());
        for session in &sessions {
            self.open_target(session, now);
            let entries =
                self.custody
                    .load_outbox(session, now)
                    .map_err(|error| LoadError::Outbox {
                        session: session.clone(),
                        error,
                    })?;
            let outbox = entries
                .iter()
                .map(serde_json::to_value)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| LoadError::Outbox {
                    session: session.clone(),
                    error: outbox_core::store::OutboxError::Corrupt {
                        what: "an outbox entry".to_owned(),
                        reason: e.to_string(),
                    },
                })?;
            let run = self
                .custody
                .runs()
                .active(session)
                .map(|r| r.run_id.clone());
            outboxes.push((outbox, run));
        }
        let mut requests = Vec::with_capacity(sessions.len());
        let mut iter = sessions.iter().zip(outboxes);
        let mut missing = None;
        // The main conversation of each named session, borrowed from its own entry.
        let mut sources: BTreeMap<&SessionId, &mut Source> = BTreeMap::new();
        for (id, s) in self
            .sessions
            .iter_mut()
            .filter(|(id, _)| named.contains(id))
        {
            if let Some(source) = s.sources.get_mut(&TargetId::main(id)) {
                sources.insert(id, source);
            }
        }
        for (session, (outbox, active_run)) in iter.by_ref() {
            let Some(source) = sources.remove(session) else {
                missing = Some(session.clone());
                break;
            };
            requests.push(window::ReconcileSession {
                session: session.clone(),
                target: TargetId::main(session),
                source: source.as_mut(),
                outbox,
                active_run,
            });
        }
        if let Some(session) = missing {
            return Err(LoadError::UnknownTarget {
                target: TargetId::main(&session),
                session,
            });
        }
        let result = window::reconcile_sessions(&mut self.overlays, &self.key, requests);
        match result {
            Ok(done) => {
                for (s, t, stored) in &done.settled {
                    self.emit_blocks(s, t, stored, now);
                }
                Ok(done.sessions)
            }
            Err(BuildError { error, written }) => {
                for (s, t, stored) in written {
                    self.emit_blocks(&s, &t, &stored, now);
                }
                Err(LoadError::Window(error))
            }
        }
    }

    /// Sends what a builder saved (also when it failed after saving) and answers.
    fn built(
        &mut self,
        session: &SessionId,
        target: &TargetId,
        built: Result<window::BuiltWindow, BuildError>,
        now: Millis,
    ) -> Result<timeline_core::wire::TimelineWindow, LoadError> {
        match built {
            Ok(built) => {
                if let Some(stored) = built.settled {
                    self.emit_blocks(session, target, &stored, now);
                }
                Ok(built.window)
            }
            Err(BuildError { error, written }) => {
                for (s, t, stored) in written {
                    self.emit_blocks(&s, &t, &stored, now);
                }
                Err(LoadError::Window(error))
            }
        }
    }

    /// The first open of a session's target starts the restart repair of its runs.
    fn open_target(&mut self, session: &SessionId, now: Millis) {
        let mut rewrite = false;
        if let Some(s) = self.sessions.get_mut(session) {
            if !s.repair.is_empty() {
                let runs = std::mem::take(&mut s.repair);
                self.scans.target_opened(session, &runs, now);
            }
            rewrite = std::mem::take(&mut s.rewrite);
        }
        if rewrite {
            // The rewrite a host before this one could not write (OV-10). Which runs
            // left is not known any more: none is remembered as gone, and the run the
            // registry holds active keeps its rows. The journal row goes once it is
            // written.
            self.rewrites_journaled.insert(session.clone());
            self.rewrite_history(session, false, now);
        }
    }

    // ----- live path -----------------------------------------------------------------

    /// Saves an approval card (pending, or `decided`), then sends it. A refused write is
    /// kept and tried again after [`WRITE_RETRY`]: unlike a row of the agent's, a card
    /// never reaches clients from history, so without the retry a decided card would
    /// show pending forever (RW-06).
    fn publish_card(
        &mut self,
        session: &SessionId,
        target: &TargetId,
        row: StoredBlock,
        decided: bool,
        now: Millis,
    ) {
        let key = (session.clone(), target.clone(), row.block.key());
        if !self.publish_rows(session, target, vec![row.clone()], now) {
            self.unsaved.insert(key, Unsaved::Card { row, decided });
            self.retry_at.get_or_insert(now.saturating_add(WRITE_RETRY));
        }
    }

    /// Writes again what the overlay store refused. A decided card is written only over
    /// its pending card: when the overlay no longer holds the card (the post-run cleanup
    /// removed it), nothing stale shows, and writing it back would show a card of a
    /// finished run again.
    fn retry_writes(&mut self, now: Millis) {
        self.retry_at = None;
        let unsaved = std::mem::take(&mut self.unsaved);
        self.stats.write_retries += (unsaved.len() + self.rewrites.len()) as u64;
        let mut rows: BTreeMap<(SessionId, TargetId), Vec<StoredBlock>> = BTreeMap::new();
        for ((session, target, key), write) in unsaved {
            match write {
                Unsaved::Row(row) => rows.entry((session, target)).or_default().push(row),
                Unsaved::Card { row, decided } => {
                    if decided {
                        match self.overlays.load(&session, &target) {
                            Ok(Some(o)) if o.blocks.iter().any(|b| b.block.key() == key) => {}
                            Ok(_) => continue,
                            Err(error) => {
                                self.notice(Notice::OverlayWriteFailed {
                                    session: session.clone(),
                                    target: target.clone(),
                                    error,
                                });
                                self.unsaved
                                    .insert((session, target, key), Unsaved::Card { row, decided });
                                self.retry_at.get_or_insert(now.saturating_add(WRITE_RETRY));
                                continue;
                            }
                        }
                    }
                    self.publish_card(&session, &target, row, decided, now);
                }
            }
        }
        for ((session, target), rows) in rows {
            self.publish_rows(&session, &target, rows, now);
        }
        for session in std::mem::take(&mut self.rewrites) {
            self.history_rewritten(&session, now);
        }
    }

    /// The agent's history lost rows (OV-10: a replace latest rolled back the latest
    /// turn, or the session went on in a fresh thread). In every target of the session
    /// the ordinary rows of runs other than the current one leave (no history row would
    /// ever settle a row of a turn that is gone) and the settlement epoch rises, so a
    /// client holding a window from before loads the latest one again; what was saved
    /// is sent. Those runs' rows waiting for a retry are dropped, and a late row of
    /// theirs is not published. A refused write is said and tried again.
    fn history_rewritten(&mut self, session: &SessionId, now: Millis) {
        // The fragments of the turns that left history leave its log too: the next
        // page starts a new log.
        self.events.forget(session);
        self.rewrite_history(session, true, now);
    }

    /// [`Host::history_rewritten`]; `remember`: the runs whose rows leave are known (not
    /// after a restart), and their late rows are dropped.
    fn rewrite_history(&mut self, session: &SessionId, remember: bool, now: Millis) {
        self.stats.history_rewrites += 1;
        let current = self.runs.live(session).cloned().or_else(|| {
            self.custody
                .runs()
                .active(session)
                .map(|r| r.run_id.clone())
        });
        let main = TargetId::main(session);
        let mut targets = match self.overlays.targets(session) {
            Ok(targets) => targets,
            Err(error) => {
                self.rewrite_failed(session, main, error, now);
                return;
            }
        };
        let mut failed = false;
        if !targets.contains(&main) {
            targets.push(main);
        }
        let mut left: BTreeSet<RunId> = [self.runs.gone(session), self.runs.stopping(session)]
            .into_iter()
            .flatten()
            .filter(|r| Some(*r) != current.as_ref())
            .cloned()
            .collect();
        let change = Change::HistoryRewritten {
            current_run: current.clone(),
        };
        for target in targets {
            if let Ok(Some(o)) = self.overlays.load(session, &target) {
                let runs = o.blocks.iter().filter(|b| b.class == RowClass::Ordinary);
                left.extend(
                    runs.filter_map(|b| b.run_id.clone())
                        .filter(|r| Some(r) != current.as_ref()),
                );
            }
            match overlay_store::write(&mut self.overlays, session, &target, &change) {
                Ok(WriteResult::Written { stored, .. }) => {
                    let stored = stored.stored().clone();
                    self.emit_blocks(session, &target, &stored, now);
                }
                Ok(WriteResult::Unchanged(_)) => {}
                Err(error) => {
                    failed = true;
                    self.rewrite_failed(session, target, error, now);
                }
            }
        }
        if !failed && self.rewrites_journaled.remove(session) {
            if let Some(run) = rewrite_journal_run() {
                if let Err(error) = self.overlays.remove_cleanup(session, &run) {
                    // The row stays: the next restart rewrites once more, which is
                    // harmless.
                    self.journal_failed(session, &run, error);
                }
            }
        }
        if !remember {
            return;
        }
        // Rows waiting for a retry go by the same rule as the stored ones.
        self.unsaved.retain(|(s, _, _), write| match write {
            Unsaved::Row(r) if s == session => match &r.run_id {
                Some(run) if Some(run) != current.as_ref() => {
                    left.insert(run.clone());
                    false
                }
                _ => true,
            },
            _ => true,
        });
        let kept = self.left_runs.entry(session.clone()).or_default();
        for run in left {
            if !kept.contains(&run) {
                kept.push_back(run);
            }
        }
        while kept.len() > LEFT_RUNS_KEPT {
            kept.pop_front();
        }
    }

    fn rewrite_failed(
        &mut self,
        session: &SessionId,
        target: TargetId,
        error: OverlayError,
        now: Millis,
    ) {
        self.notice(Notice::HistoryRewriteFailed {
            session: session.clone(),
            target,
            error,
        });
        // Kept in the journal too, so a restart before the retry does it again.
        if !self.rewrites_journaled.contains(session) {
            if let Some(run) = rewrite_journal_run() {
                match self.overlays.add_cleanup(session, &run) {
                    Ok(()) => {
                        self.rewrites_journaled.insert(session.clone());
                    }
                    Err(error) => self.journal_failed(session, &run, error),
                }
            }
        }
        self.rewrites.insert(session.clone());
        self.retry_at.get_or_insert(now.saturating_add(WRITE_RETRY));
    }

    /// Saves the rows, then sends the saved snapshot. False when the store refused the
    /// write (said with [`Notice::OverlayWriteFailed`]); the ordinary rows are then kept
    /// and written again after [`WRITE_RETRY`] (ephemeral ones are not: a newer status
    /// row or mirror may have replaced them meanwhile). A saved row replaces what of its
    /// key waited for a retry.
    fn publish_rows(
        &mut self,
        session: &SessionId,
        target: &TargetId,
        mut rows: Vec<StoredBlock>,
        now: Millis,
    ) -> bool {
        for row in &mut rows {
            if let Some(run) = &row.run_id {
                self.custody.touch_run(session, run, now);
                if row.block.source_order.is_none() {
                    row.block.source_order =
                        Some(self.sequencer.source_order(run, &row.block.key()));
                }
            }
        }
        let change = Change::Publish(rows.clone());
        let result = overlay_store::write(&mut self.overlays, session, target, &change);
        let saved = match result {
            Ok(WriteResult::Written { stored, .. }) => {
                let stored = stored.stored().clone();
                self.emit_blocks(session, target, &stored, now);
                true
            }
            Ok(WriteResult::Unchanged(_)) => true,
            Err(error) => {
                self.notice(Notice::OverlayWriteFailed {
                    session: session.clone(),
                    target: target.clone(),
                    error,
                });
                false
            }
        };
        for row in rows {
            let key = (session.clone(), target.clone(), row.block.key());
            if saved {
                self.unsaved.remove(&key);
            } else if row.class == RowClass::Ordinary {
                self.unsaved.insert(key, Unsaved::Row(row));
                self.retry_at.get_or_insert(now.saturating_add(WRITE_RETRY));
            }
        }
        saved
    }

    fn emit_blocks(
        &mut self,
        session: &SessionId,
        target: &TargetId,
        stored: &StoredOverlay,
        now: Millis,
    ) {
        let payload = Payload::Blocks {
            session: session.clone(),
            target: target.clone(),
            overlay: stored.client_form(),
        };
        self.emit(payload, now);
    }

    fn emit(&mut self, payload: Payload, now: Millis) {
        let session = match &payload {
            Payload::Blocks { session, .. } | Payload::SessionEvent { session, .. } => {
                Some(session.clone())
            }
            Payload::Run(e) => Some(e.app_session_id.clone()),
            _ => None,
        };
        if let (RelayOutcome::Rejected(error), Some(session)) =
            (self.hub.handle_payload(payload, now), session)
        {
            self.effects
                .push_back(HostEffect::Notice(Notice::RelayRefused { session, error }));
        }
    }

    fn emit_event(
        &mut self,
        session: &SessionId,
        event: timeline_core::history::SessionEvent,
        now: Millis,
    ) {
        let log_id = self.events.id(session).unwrap_or_default().to_owned();
        self.emit(
            Payload::SessionEvent {
                session: session.clone(),
                log_id,
                event,
            },
            now,
        );
    }

    fn session_page(
        &self,
        session: &SessionId,
        before: Option<u64>,
        max_events: usize,
    ) -> Result<crate::SessionPage, LoadError> {
        if self.custody.session(session).is_none() || !self.serves(session) {
            return Err(LoadError::UnknownTarget {
                session: session.clone(),
                target: TargetId::main(session),
            });
        }
        let max_events = max_events.clamp(1, crate::MAX_PAGE_EVENTS);
        self.events
            .page(session, before, max_events)
            .map_err(|error| LoadError::Events {
                session: session.clone(),
                error,
            })
    }

    fn run_started(
        &mut self,
        session: &SessionId,
        run: &RunId,
        op: &outbox_core::ids::OperationId,
        now: Millis,
    ) {
        if self.runs.live(session) == Some(run) {
            return;
        }
        if let Some(old) = self.runs.live(session).cloned() {
            self.run_gone(session, &old, RunEventKind::Aborted, now);
        }
        self.runs.set_live(session, run);
        // A run that starts again (the same run sent to a fresh thread) is not gone.
        if let Some(left) = self.left_runs.get_mut(session) {
            left.retain(|r| r != run);
        }
        self.set_running(session, Some(run), now);
        self.emit(
            Payload::Run(RunEvent {
                event: RunEventKind::Started,
                app_session_id: session.clone(),
                run_id: run.clone(),
                timestamp: now,
                operation_id: Some(op.clone()),
                agent_error_info: None,
            }),
            now,
        );
    }

    /// A run the hub knows ended (the agent said so, or custody let it go).
    fn run_gone(&mut self, session: &SessionId, run: &RunId, outcome: RunEventKind, now: Millis) {
        if !self.runs.end(session, run) {
            return;
        }
        self.sequencer.end_run(run);
        // The run's pending cards expire: the agent can no longer take a decision on
        // them, and its own word on it may have died with a host.
        self.approvals.run_ended(session, run);
        self.drain_approvals(now);
        self.set_running(session, None, now);
        self.emit(
            Payload::Run(RunEvent {
                event: outcome,
                app_session_id: session.clone(),
                run_id: run.clone(),
                timestamp: now,
                operation_id: None,
                agent_error_info: None,
            }),
            now,
        );
        let exact = self
            .custody
            .session(session)
            .is_some_and(|i| i.capabilities.exact_scan);
        if exact && !self.scans.is_active(session, run) {
            self.scans.run_ended(session.clone(), run.clone(), now);
        }
    }

    fn set_running(&mut self, session: &SessionId, run: Option<&RunId>, now: Millis) {
        let state = RunningState {
            running: run.is_some(),
            run_id: run.map(|r| r.as_str().to_owned()),
        };
        // A run ID long enough to leave a replay chunk no room is refused and the
        // previous state stays: said, not hidden.
        if let Err(e) = self.replay.set_running(session, state, now) {
            self.notice(Notice::ReplayRefused {
                session: session.clone(),
                error: e.to_string(),
            });
        }
    }

    fn append_replay(
        &mut self,
        session: &SessionId,
        kind: EventKind,
        json: &serde_json::Value,
        now: Millis,
    ) {
        if let Err(e) = self.replay.append_value(session, kind, json, now) {
            // Only events the host built reach here; a refusal is a defect, reported.
            self.notice(Notice::ReplayRefused {
                session: session.clone(),
                error: e.to_string(),
            });
        }
    }

    // ----- the pump ------------------------------------------------------------------

    /// Moves what the inner machines want done into the host's effects, and carries out
    /// what the host does itself (journal rows, exact scans), until nothing is left.
    fn pump(&mut self, now: Millis) {
        loop {
            let mut progressed = false;
            for (session, reason) in std::mem::take(&mut self.lost)
                .into_iter()
                .map(|s| (s, "an overlay write found the lease lost"))
            {
                self.let_go(&session, reason);
            }
            while let Some(effect) = self.custody.poll_effect() {
                progressed = true;
                self.custody_effect(effect, now);
            }
            while let Some(effect) = self.scans.poll_effect() {
                progressed = true;
                self.scan_effect(effect, now);
            }
            self.sync_runs(now);
            while let Some(delivery) = self.hub.poll_effect() {
                progressed = true;
                self.stats.deliveries += 1;
                if let Delivery::Relay(event) = &delivery {
                    let fragment = event.is_session_event();
                    let (session, json) = (event.session.clone(), event.json.clone());
                    let mut bytes = ByteCount(0);
                    self.stats.relay_events += 1;
                    // A `Value` written into a counter that takes every byte cannot fail;
                    // were it to, the event would count with no bytes, and nothing else
                    // depends on the count.
                    if serde_json::to_writer(&mut bytes, &json).is_ok() {
                        self.stats.relay_bytes = self.stats.relay_bytes.saturating_add(bytes.0);
                    }
                    // A streamed fragment is not kept for a joining phone: it would
                    // push the events the replay exists for out of its bounds, and the
                    // log serves it (`session.page`, from the page's `nextSeq` on).
                    if !fragment {
                        self.append_replay(&session, EventKind::Other, &json, now);
                    }
                }
                self.effects.push_back(HostEffect::Deliver(delivery));
            }
            if !progressed {
                break;
            }
        }
    }

    fn custody_effect(&mut self, effect: custody::CustodyEffect, now: Millis) {
        use custody::CustodyEffect as C;
        let out = match effect {
            C::Send(req) => {
                if let SendKind::Start { run } = &req.kind {
                    self.run_started(&req.session, run, &req.operation_id, now);
                }
                // The session goes on in a fresh thread (its old one is gone): the old
                // thread's rows left history; the run this send starts keeps its own.
                if req.fresh_thread {
                    self.history_rewritten(&req.session, now);
                }
                if self.replayed.first(&req.session, &req.operation_id) {
                    let text = req.request.user_text.clone();
                    self.replay.append_user_message(
                        &req.session,
                        &text,
                        Some(req.operation_id.as_str()),
                        now,
                    );
                }
                HostEffect::Agent(AgentCall::Send(req))
            }
            C::ReadHistory(read) => HostEffect::Agent(AgentCall::ReadHistory(read)),
            C::Stop(stop) => {
                // A run custody lets go after a stop was stopped, not failed.
                self.runs.stop_sent(&stop.session, &stop.run);
                HostEffect::Agent(AgentCall::Stop(stop))
            }
            C::TakeBack(take) => HostEffect::Agent(AgentCall::TakeBack(take)),
            C::StopAnswer { caller, answer } => HostEffect::Reply {
                to: ReplyTo(caller),
                reply: Reply::Stop(answer),
            },
            C::ClearThreadLink { session } => {
                HostEffect::Agent(AgentCall::ClearThreadLink { session })
            }
            C::RouteDeliveryChanged {
                operation_id,
                sender_session,
                sender_call_id,
                delivery,
            } => {
                self.republish_sender_row(&sender_session, &sender_call_id, delivery, now);
                HostEffect::Notice(Notice::RouteDeliveryChanged {
                    operation_id,
                    sender_session,
                    delivery,
                })
            }
            C::TakeBackRefused {
                session,
                operation_id,
                reason,
            } => HostEffect::Notice(Notice::TakeBackRefused {
                session,
                operation_id,
                reason,
            }),
            C::RunRefused {
                session,
                operation_id,
                error,
            } => HostEffect::Notice(Notice::RunRefused {
                session,
                operation_id,
                error,
            }),
            C::StoreFailed(failure) => HostEffect::Notice(Notice::OutboxStoreFailed(failure)),
            C::ScopeReleased { session, reason } => {
                HostEffect::Notice(Notice::SessionReleased { session, reason })
            }
            other => HostEffect::Notice(Notice::Unknown(format!("{other:?}"))),
        };
        self.effects.push_back(out);
    }

    /// "Each change of the queue publishes the row of the sender again" (RW-04): the
    /// sender's message row (the activity row keyed by its `send_session_message` call,
    /// in any live overlay of the sender's session) shows the new delivery, and is saved
    /// and sent like every live row. A row that settled into history is in no overlay:
    /// its history source shows the delivery it reads.
    fn republish_sender_row(
        &mut self,
        sender: &SessionId,
        call: &outbox_core::ids::CallId,
        delivery: outbox_core::store::RouteDelivery,
        now: Millis,
    ) {
        use outbox_core::store::RouteDelivery as R;
        use timeline_core::rows::{ActivityRow, Direction, MessageDelivery, DECLINED_REASON};
        let Ok(key) = BlockKey::parse(timeline_core::key::BlockType::Activity, call.as_str())
        else {
            return;
        };
        let targets: Vec<TargetId> = self
            .sessions
            .get(sender)
            .map(|s| s.sources.keys().cloned().collect())
            .unwrap_or_default();
        for target in targets {
            let overlay = match self.overlays.load(sender, &target) {
                Ok(o) => o,
                Err(error) => {
                    self.notice(Notice::OverlayWriteFailed {
                        session: sender.clone(),
                        target,
                        error,
                    });
                    continue;
                }
            };
            let Some(mut row) =
                overlay.and_then(|o| o.blocks.into_iter().find(|b| b.block.key() == key))
            else {
                continue;
            };
            let Ok(activity) = serde_json::from_value::<ActivityRow>(row.block.data.clone()) else {
                continue;
            };
            let Some(mut fact) = activity.message.filter(|f| f.direction == Direction::Sent) else {
                continue;
            };
            let (shown, reason) = match delivery {
                R::Sent => (MessageDelivery::Sent, None),
                R::NeedsApproval => (MessageDelivery::NeedsApproval, None),
                R::Declined => (MessageDelivery::NotSent, Some(DECLINED_REASON.to_owned())),
            };
            if fact.delivery == Some(shown) && fact.failure_reason == reason {
                continue;
            }
            fact.delivery = Some(shown);
            fact.failure_reason = reason;
            let updated = ActivityRow::message(fact, activity.subtitle.as_deref());
            let Ok(data) = serde_json::to_value(&updated) else {
                continue;
            };
            row.block.data = data;
            if !self.publish_rows(sender, &target, vec![row.clone()], now) {
                self.unsaved
                    .insert((sender.clone(), target, key.clone()), Unsaved::Row(row));
                self.retry_at.get_or_insert(now.saturating_add(WRITE_RETRY));
            }
        }
    }

    /// A run the hub was told about that custody no longer holds active (a refused
    /// start, a stale reclaim) ends for the clients too.
    fn sync_runs(&mut self, now: Millis) {
        let gone: Vec<(SessionId, RunId)> = self
            .runs
            .live_runs()
            .filter(|(s, r)| self.custody.runs().active(s).map(|a| &a.run_id) != Some(*r))
            .map(|(s, r)| (s.clone(), r.clone()))
            .collect();
        for (session, run) in gone {
            let outcome = if self.runs.stopping(&session) == Some(&run) {
                RunEventKind::Aborted
            } else {
                RunEventKind::Failed
            };
            self.run_gone(&session, &run, outcome, now);
        }
    }

    fn scan_effect(&mut self, effect: ScanEffect, now: Millis) {
        match effect {
            ScanEffect::WriteJournal { session, run } => {
                if let Err(error) = self.overlays.add_cleanup(&session, &run) {
                    self.journal_failed(&session, &run, error);
                }
                // The scans go on either way; only the restart repair needs the row.
                self.scans.journal_written(&session, &run);
            }
            ScanEffect::Scan { session, run, .. } => {
                self.stats.exact_scans += 1;
                let result = self.exact_scan(&session, &run, now);
                self.scans.handle_scan_result(&session, &run, result, now);
            }
            ScanEffect::RemoveJournal { session, run } => {
                if let Err(error) = self.overlays.remove_cleanup(&session, &run) {
                    self.journal_failed(&session, &run, error);
                }
            }
            ScanEffect::GaveUp { session, run } => {
                self.stats.scans_gave_up += 1;
                self.notice(Notice::ScanGaveUp { session, run });
            }
            other => self.notice(Notice::Unknown(format!("{other:?}"))),
        }
    }

    /// One exact scan (OV-06): the run's keys that history holds settle, in every target
    /// of the session; what was saved is sent, also when a later write failed.
    fn exact_scan(
        &mut self,
        session: &SessionId,
        run: &RunId,
        now: Millis,
    ) -> Result<ScanReport, ()> {
        let wanted = match scan::run_keys(&mut self.overlays, session, run) {
            Ok(keys) => keys,
            Err(error) => {
                self.scan_failed(session, run, error);
                return Err(());
            }
        };
        let found = match self.sessions.get_mut(session) {
            Some(s) => find_keys(&mut s.sources, &wanted),
            None => HashSet::new(),
        };
        match scan::settle_run(&mut self.overlays, session, run, &found) {
            Ok((report, written)) => {
                self.emit_settled(session, written, now);
                Ok(report)
            }
            Err(e) => {
                self.emit_settled(session, e.written, now);
                self.scan_failed(session, run, e.error);
                Err(())
            }
        }
    }

    fn emit_settled(
        &mut self,
        session: &SessionId,
        written: Vec<(TargetId, StoredOverlay)>,
        now: Millis,
    ) {
        for (target, stored) in written {
            self.emit_blocks(session, &target, &stored, now);
        }
    }

    fn notice(&mut self, notice: Notice) {
        if matches!(
            notice,
            Notice::OverlayWriteFailed { .. } | Notice::HistoryRewriteFailed { .. }
        ) {
            self.stats.overlay_write_failures += 1;
        }
        if let Notice::OverlayWriteFailed {
            error: OverlayError::LeaseLost { session, .. },
            ..
        } = &notice
        {
            if self.custody.scope_granted(session) {
                self.lost.insert(session.clone());
            }
        }
        self.effects.push_back(HostEffect::Notice(notice));
    }

    fn journal_failed(&mut self, session: &SessionId, run: &RunId, error: OverlayError) {
        self.notice(Notice::JournalFailed {
            session: Some(session.clone()),
            run: Some(run.clone()),
            error,
        });
    }

    fn scan_failed(&mut self, session: &SessionId, run: &RunId, error: OverlayError) {
        self.notice(Notice::ScanFailed {
            session: session.clone(),
            run: run.clone(),
            error,
        });
    }
}

/// The keys of `wanted` that the sources hold, reading back from the present.
fn find_keys(
    sources: &mut BTreeMap<TargetId, Source>,
    wanted: &HashSet<BlockKey>,
) -> HashSet<BlockKey> {
    let mut found = HashSet::new();
    for source in sources.values_mut() {
        let mut before = None;
        for _ in 0..EXACT_SCAN_READS {
            if found.len() == wanted.len() {
                return found;
            }
            let Ok(page) = source.read(before.as_ref(), EXACT_SCAN_PAGE) else {
                break;
            };
            for item in &page.items {
                for b in &item.blocks {
                    let k = b.key();
                    if wanted.contains(&k) {
                        found.insert(k);
                    }
                }
            }
            match (page.more, page.items.last()) {
                (true, Some(last)) => before = Some(last.position.clone()),
                _ => break,
            }
        }
    }
    found
}
