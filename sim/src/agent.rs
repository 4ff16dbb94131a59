//! The simulated agent: one per world, with a turn, a transcript and pending approvals
//! per session.
//!
//! It is truthful, so what the host learns from it can be checked against what it did:
//!
//! - it takes a message into a turn (saving its user row to the transcript and
//!   publishing it live) or does not, and its answer says which (`Accepted`,
//!   `Delivered`; `ProvenUnadmitted`, `Deferred`); `AdmissionUncertain` is the one answer
//!   that hides it, and the history read after it tells the truth (or `Unreadable` while
//!   the history is down);
//! - an accepted steer waits in the turn until the agent takes it, gives it back (a
//!   take-back, a stop) or reports it untaken when the turn ends;
//! - rows are saved in the order of their timestamps, and the live copy of a row carries
//!   the timestamp and source order its saved copy will have, so a row placed from the
//!   overlay and the same row placed from history sit in the same place;
//! - it counts what reaches it: a message it holds that is sent again, and a decision on
//!   an approval it already took, are violations it reports.
//!
//! Turns that start while another runs are refused, as an agent with one turn per
//! thread does (`ProvenUnadmitted`).
//!
//! A Codex session takes replace latest (`rollback_before_send`): it rolls back its
//! latest turn (the turn's user rows and replies leave the transcript, as
//! `thread/rollback` does) and starts a turn with the new message. The rollback and the
//! start are two steps: a refusal or a lost answer may come after the rollback took and
//! before the turn started. The adapter rolls back at most once per operation (its
//! `clientUserMessageId`): custody sends a replace-latest entry with
//! `rollback_before_send` on every attempt, so a retry after a rollback that took asks
//! again ([`AgentEvent::RollbackAgain`]). Sometimes the thread is gone (`ThreadGone`):
//! after the host clears the thread link, or on a send that asks for a fresh thread,
//! the session's history is a new, empty thread (the embedder's history source follows
//! the session's thread link), and every message of the old thread has left it. A
//! Claude session refuses a rollback; one reaching it is a violation.

use outbox_core::adapter::{ReadHistoryRequest, StopRequest, TakeBackRequest};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use host_core::{AgentCall, AgentInput};
use outbox_core::adapter::{HistoryRead, SendKind, SendResult, StopResult, TakeBackResult};
use outbox_core::entry::{Acceptance, AccessLevel};
use outbox_core::ids::{CallId, ThreadId, TurnId};
use outbox_core::session_message::SessionMessageCall;
use overlay_core::source::{SourcePage, SourcePosition};
use overlay_core::{HistorySource, MemorySource, RowClass, RunEventKind, SourceError};
use overlay_core::{SourceKind, StoredBlock};
use timeline_core::rows::{ApprovalKind, ApprovalRequest, ApprovalResult, Decision};
use timeline_core::{AgentKind, SessionId, SourceOrder, TargetId};
use timeline_core::{Block, BlockKey, BlockType, BoundaryToken, Millis, OperationId, RunId};

use crate::faults::{FaultCounts, FaultKind, Faults};
use crate::rng::Rng;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The agent's saved history of one session.
#[derive(Debug)]
pub struct Transcript {
    source: MemorySource,
    /// While set, every read fails.
    pub unreadable: bool,
}

/// A shared handle to a transcript: the agent writes it, the host reads it as the
/// session's history source.
#[derive(Clone, Debug)]
pub struct TranscriptHandle(Arc<Mutex<Transcript>>);

impl TranscriptHandle {
    fn new(kind: SourceKind, token: BoundaryToken) -> TranscriptHandle {
        TranscriptHandle(Arc::new(Mutex::new(Transcript {
            source: MemorySource::new(kind, token),
            unreadable: false,
        })))
    }

    /// Every saved row, oldest first.
    pub fn blocks(&self) -> Vec<Block> {
        lock(&self.0).source.all_blocks()
    }

    /// Sets or clears the unreadable fault.
    pub fn set_unreadable(&self, unreadable: bool) {
        lock(&self.0).unreadable = unreadable;
    }

    /// True while reads fail.
    pub fn unreadable(&self) -> bool {
        lock(&self.0).unreadable
    }

    fn save(&self, block: Block) -> SourcePosition {
        lock(&self.0).source.push(vec![block])
    }

    /// Removes the items at `positions` (a rollback).
    fn remove(&self, positions: &[SourcePosition]) {
        let mut t = lock(&self.0);
        for p in positions {
            t.source.remove(p);
        }
    }

    /// The session's history is a new thread: empty, with its own cursor form and
    /// boundary token.
    fn new_thread(&self, kind: SourceKind, token: BoundaryToken) {
        lock(&self.0).source = MemorySource::new(kind, token);
    }
}

impl HistorySource for TranscriptHandle {
    fn kind(&self) -> SourceKind {
        lock(&self.0).source.kind()
    }
    fn boundary_token(&self) -> BoundaryToken {
        lock(&self.0).source.boundary_token()
    }
    fn read(
        &mut self,
        before: Option<&SourcePosition>,
        limit: usize,
    ) -> Result<SourcePage, SourceError> {
        let mut t = lock(&self.0);
        if t.unreadable {
            return Err(SourceError::Unavailable(
                "the transcript cannot be read".into(),
            ));
        }
        t.source.read(before, limit)
    }
}

/// What the agent says, and how it travels.
#[derive(Clone, Debug, PartialEq)]
pub enum Out {
    /// An answer to a call, or a delivery proof: it may be lost, late, duplicated or
    /// delivered again later.
    Answer(AgentInput),
    /// The agent's stream (rows, run ends, approval requests and their resolution
    /// (`serverRequest/resolved`)): in order.
    Stream(AgentInput),
    /// What the adapter in the host's process says itself, before the answer it comes
    /// with (a rollback written): at once, never lost.
    Report(AgentInput),
}

/// A row the agent streams and has not saved yet.
#[derive(Clone, Debug)]
struct OpenRow {
    block: Block,
}

#[derive(Clone, Debug)]
struct Turn {
    run: RunId,
    turn_id: String,
    /// Accepted steers not taken yet: (operation, text).
    pending: Vec<(OperationId, String)>,
    /// The reply being streamed.
    open: Option<OpenRow>,
    /// Approvals asked in this turn and not answered.
    approvals: Vec<ApprovalRequest>,
    /// When the agent last told the host the turn works (rows or a heartbeat).
    touched: Millis,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum ApprovalState {
    Pending,
    /// A decision the agent took from the host.
    Decided(ApprovalResult),
    /// Settled without a decision from the host (the turn ended).
    Expired,
}

/// Why a message the agent had is no longer in its history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Left {
    /// A replace latest rolled its turn back.
    RolledBack,
    /// Its thread is gone; the session went on in a fresh thread.
    ThreadGone,
}

/// What the agent did that the world records (drained after each call).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AgentEvent {
    /// The latest turn of `session` was rolled back for `op`: the operations of its user
    /// rows and the keys of every row it saved.
    RolledBack {
        /// The session.
        session: SessionId,
        /// The replace-latest operation.
        op: OperationId,
        /// The operations whose user rows left.
        ops: Vec<OperationId>,
        /// Every row that left.
        rows: Vec<BlockKey>,
    },
    /// A rollback was asked again for an operation the agent rolled back for (or whose
    /// thread it found gone) already: not done twice.
    RollbackAgain {
        /// The session.
        session: SessionId,
        /// The operation.
        op: OperationId,
    },
    /// The agent answered that the session's thread is gone.
    ThreadGone {
        /// The session.
        session: SessionId,
    },
    /// A fresh thread was opened: every row of the old one left the history.
    FreshThread {
        /// The session.
        session: SessionId,
        /// The new thread's ID.
        thread: String,
        /// The operations whose user rows left.
        ops: Vec<OperationId>,
        /// Every row that left.
        rows: Vec<BlockKey>,
    },
}

/// One session as the agent sees it.
#[derive(Debug)]
pub struct AgentSession {
    /// The session.
    pub session: SessionId,
    /// Codex (exact scans, restart repair) or Claude.
    pub codex: bool,
    /// Its transcript.
    pub transcript: TranscriptHandle,
    turn: Option<Turn>,
    /// Operations saved in the transcript (its current thread).
    saved: BTreeSet<OperationId>,
    /// The items saved per turn, oldest first (the seeded history: one turn per
    /// exchange), for a rollback: each item's position and the operation of its user
    /// row.
    turns: Vec<Vec<(SourcePosition, BlockKey, Option<OperationId>)>>,
    /// Operations whose user rows left the transcript, and why.
    left: BTreeMap<OperationId, Left>,
    /// Operations a rollback was done for, or whose thread was found gone: a rollback
    /// asked again for one is not done again.
    rolled_for: BTreeSet<OperationId>,
    /// The thread: 1 for the session's first, one more for each fresh thread.
    thread: u64,
    /// The agent said the thread is gone: a send fails so until the host clears the
    /// link or asks for a fresh thread.
    gone: bool,
    /// The host cleared the link to the gone thread: the next send opens a fresh one.
    link_cleared: bool,
    /// Operations taken back (detached) at the host's request.
    detached: BTreeSet<OperationId>,
    last_ts: u64,
    next_ordinal: u64,
    next_row: u64,
    next_turn: u64,
    next_approval: u64,
    approvals: BTreeMap<String, (ApprovalRequest, ApprovalState)>,
    /// Every approval asked in this session (identity and card), for the clients.
    pub asked: Vec<ApprovalRequest>,
}

impl AgentSession {
    /// True while a turn runs.
    pub fn running(&self) -> Option<&RunId> {
        self.turn.as_ref().map(|t| &t.run)
    }

    /// True when the agent holds `op`: saved, or an accepted steer of the running turn.
    pub fn holds(&self, op: &OperationId) -> bool {
        self.saved.contains(op)
            || self
                .turn
                .as_ref()
                .is_some_and(|t| t.pending.iter().any(|(o, _)| o == op))
    }

    /// True when `op` is in the transcript.
    pub fn saved(&self, op: &OperationId) -> bool {
        self.saved.contains(op)
    }

    /// True when the agent had `op` in its history: it is there, or it left it (rolled
    /// back, or in a thread that is gone).
    pub fn had(&self, op: &OperationId) -> bool {
        self.saved.contains(op) || self.left.contains_key(op)
    }

    /// Why `op` left the history, if it did.
    pub fn left(&self, op: &OperationId) -> Option<Left> {
        self.left.get(op).copied()
    }

    /// Every operation that left the history.
    pub fn left_ops(&self) -> impl Iterator<Item = (&OperationId, Left)> {
        self.left.iter().map(|(o, l)| (o, *l))
    }

    /// The ID of the session's current thread.
    pub fn thread_id(&self) -> String {
        if self.thread <= 1 {
            format!("thread-{}", self.session)
        } else {
            format!("thread-{}-{}", self.session, self.thread)
        }
    }

    /// Saves `block` in the transcript, as an item of the latest turn.
    fn save_row(&mut self, block: Block, op: Option<OperationId>) {
        let key = block.key();
        let position = self.transcript.save(block);
        if self.turns.is_empty() {
            self.turns.push(Vec::new());
        }
        if let Some(turn) = self.turns.last_mut() {
            turn.push((position, key, op));
        }
    }

    /// Rolls back the latest turn that saved anything, for `op` (`thread/rollback`):
    /// its rows leave the transcript (unless `keep`, the defect), its user rows'
    /// operations leave the history. Once per operation.
    fn roll_back(
        &mut self,
        op: &OperationId,
        keep: bool,
        events: &mut Vec<AgentEvent>,
        out: &mut Vec<Out>,
    ) {
        out.push(Out::Report(AgentInput::RolledBack {
            session: self.session.clone(),
            operation_id: op.clone(),
        }));
        if !self.rolled_for.insert(op.clone()) {
            events.push(AgentEvent::RollbackAgain {
                session: self.session.clone(),
                op: op.clone(),
            });
            return;
        }
        let mut items = Vec::new();
        while let Some(turn) = self.turns.pop() {
            if !turn.is_empty() {
                items = turn;
                break;
            }
        }
        if !keep {
            let positions: Vec<SourcePosition> = items.iter().map(|(p, _, _)| p.clone()).collect();
            self.transcript.remove(&positions);
        }
        let mut ops = Vec::new();
        for o in items.iter().filter_map(|(_, _, o)| o.clone()) {
            self.saved.remove(&o);
            self.left.insert(o.clone(), Left::RolledBack);
            ops.push(o);
        }
        events.push(AgentEvent::RolledBack {
            session: self.session.clone(),
            op: op.clone(),
            ops,
            rows: items.into_iter().map(|(_, k, _)| k).collect(),
        });
    }

    /// Opens a fresh thread: the session's history starts again, empty; every message
    /// of the old thread has left it.
    fn fresh_thread(&mut self, events: &mut Vec<AgentEvent>) {
        self.thread += 1;
        self.gone = false;
        self.link_cleared = false;
        let rows: Vec<BlockKey> = self.transcript.blocks().iter().map(Block::key).collect();
        let ops: Vec<OperationId> = std::mem::take(&mut self.saved).into_iter().collect();
        for o in &ops {
            self.left.insert(o.clone(), Left::ThreadGone);
        }
        self.turns.clear();
        let thread = self.thread_id();
        self.transcript.new_thread(
            SourceKind::Codex {
                thread_id: thread.clone(),
                generation: 1,
            },
            BoundaryToken::codex_rollout(&format!(
                "/sessions/rollout-{}-{}.jsonl",
                self.session, self.thread
            )),
        );
        events.push(AgentEvent::FreshThread {
            session: self.session.clone(),
            thread,
            ops,
            rows,
        });
    }

    /// The result the agent took for an approval, if it took one.
    pub fn decided(&self, request_id: &str) -> Option<ApprovalResult> {
        match self.approvals.get(request_id) {
            Some((_, ApprovalState::Decided(r))) => Some(*r),
            Some((_, ApprovalState::Expired)) => Some(ApprovalResult::ResolvedExternally),
            _ => None,
        }
    }

    fn timestamp(&mut self, now: Millis) -> Millis {
        self.last_ts = now.as_u64().max(self.last_ts + 1);
        Millis(self.last_ts)
    }

    fn new_block(&mut self, key: BlockKey, now: Millis) -> Block {
        let ts = self.timestamp(now);
        let ordinal = self.next_ordinal;
        self.next_ordinal += 1;
        Block::new(key, ts).with_source_order(SourceOrder::history(ordinal, 0))
    }

    fn rows(&self, run: &RunId, blocks: Vec<Block>) -> AgentInput {
        AgentInput::Rows {
            session: self.session.clone(),
            target: TargetId::main(&self.session),
            rows: blocks
                .into_iter()
                .map(|block| StoredBlock {
                    block,
                    class: RowClass::Ordinary,
                    run_id: Some(run.clone()),
                })
                .collect(),
        }
    }

    /// Saves the open reply (rows are saved in the order they were made).
    fn close_reply(&mut self, out: &mut Vec<Out>) {
        let Some(turn) = self.turn.as_mut() else {
            return;
        };
        if let Some(open) = turn.open.take() {
            let run = turn.run.clone();
            self.save_row(open.block.clone(), None);
            out.push(Out::Stream(self.rows(&run, vec![open.block])));
        }
    }

    /// Takes `op` into the turn: its user row is saved and published, and proven.
    fn take(&mut self, op: &OperationId, text: &str, now: Millis, out: &mut Vec<Out>) {
        self.close_reply(out);
        let Some(run) = self.turn.as_ref().map(|t| t.run.clone()) else {
            return;
        };
        let block = self
            .new_block(BlockKey::user_message(op), now)
            .with_operation(op.clone())
            .with_data(serde_json::json!({ "text": text }));
        self.save_row(block.clone(), Some(op.clone()));
        self.saved.insert(op.clone());
        self.left.remove(op);
        out.push(Out::Stream(self.rows(&run, vec![block])));
        out.push(Out::Answer(AgentInput::DeliveryProof {
            session: self.session.clone(),
            operation_id: op.clone(),
        }));
    }

    fn start_turn(&mut self, run: &RunId, now: Millis) -> String {
        self.next_turn += 1;
        let turn_id = format!("turn-{}", self.next_turn);
        self.turns.push(Vec::new());
        self.turn = Some(Turn {
            run: run.clone(),
            turn_id: turn_id.clone(),
            pending: Vec::new(),
            open: None,
            approvals: Vec::new(),
            touched: now,
        });
        turn_id
    }

    fn acceptance(&self, run: &RunId, turn_id: &str, now: Millis) -> Option<Acceptance> {
        Some(Acceptance {
            run_id: run.clone(),
            thread_id: ThreadId::new(self.thread_id()).ok()?,
            turn_id: TurnId::new(turn_id).ok()?,
            accepted_at: now,
        })
    }

    /// Ends the turn: the open reply is saved unless `drop_open`, pending approvals
    /// expire, pending steers are given back.
    fn end_turn(&mut self, outcome: RunEventKind, drop_open: bool, out: &mut Vec<Out>) {
        if drop_open {
            if let Some(t) = self.turn.as_mut() {
                t.open = None;
            }
        } else {
            self.close_reply(out);
        }
        let Some(turn) = self.turn.take() else {
            return;
        };
        for request in &turn.approvals {
            if let Some((_, state)) = self.approvals.get_mut(&request.request_id) {
                if *state == ApprovalState::Pending {
                    *state = ApprovalState::Expired;
                    out.push(Out::Stream(resolved(
                        request,
                        Ok(ApprovalResult::ResolvedExternally),
                    )));
                }
            }
        }
        let untaken: Vec<OperationId> = turn.pending.into_iter().map(|(op, _)| op).collect();
        out.push(Out::Stream(AgentInput::RunEnded {
            session: self.session.clone(),
            run: turn.run,
            outcome,
            untaken,
        }));
    }
}

fn resolved(request: &ApprovalRequest, result: Result<ApprovalResult, String>) -> AgentInput {
    AgentInput::ApprovalResolved {
        request_id: request.request_id.clone(),
        thread_id: request.thread_id.clone(),
        turn_id: request.turn_id.clone(),
        item_id: request.item_id.clone(),
        result,
    }
}

/// Something the agent saw that it must never see.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AgentViolation {
    /// A message it holds was sent to it again.
    SentTwice(OperationId, String),
    /// A different decision came for a request it had taken a decision for.
    DecidedTwice(String, String),
    /// The decision it took came again: only from another host than the one whose
    /// decision it took (a host that restarted while the decision was on its way sends
    /// it again: one decision, delivered at least once).
    DecidedAgain(String, String),
    /// A message that left its history (rolled back by a replace latest, or in a thread
    /// that is gone) was sent to it again.
    Reappears(OperationId, String),
    /// A rollback (replace latest) reached a session whose agent does not support it.
    Unsupported(OperationId, String),
}

/// The agent of every session of the world.
#[derive(Debug, Default)]
pub struct Agent {
    sessions: BTreeMap<SessionId, AgentSession>,
    /// What the agent saw that it must never see, in order.
    pub violations: Vec<AgentViolation>,
    /// Send calls received, by operation.
    pub sends: BTreeMap<OperationId, u32>,
    /// Decisions received, by request ID.
    pub decisions: BTreeMap<String, u32>,
    /// When set, the agent behaves: no refusal, no uncertainty, and it finishes turns.
    pub calm: bool,
    /// What it did that the world records, in order (drained by the world).
    pub events: Vec<AgentEvent>,
    /// The defect [`crate::Defect::KeepRolledBackTurn`]: a rollback leaves the turn's
    /// rows in the transcript.
    pub keep_rolled_back: bool,
}

/// How often a replace latest finds the thread gone (while the agent is not calm).
const THREAD_GONE: f64 = 0.2;

impl Agent {
    /// Adds a session with an empty transcript; returns the transcript for the host.
    pub fn add_session(&mut self, session: &SessionId, codex: bool) -> TranscriptHandle {
        let (kind, token) = if codex {
            (
                SourceKind::Codex {
                    thread_id: format!("thread-{session}"),
                    generation: 1,
                },
                BoundaryToken::codex_rollout(&format!("/sessions/rollout-{session}.jsonl")),
            )
        } else {
            (
                SourceKind::Claude {
                    session: format!("claude-{session}"),
                },
                BoundaryToken::codex_rollout(&format!("/claude/{session}.jsonl")),
            )
        };
        let transcript = TranscriptHandle::new(kind, token);
        self.sessions.insert(
            session.clone(),
            AgentSession {
                session: session.clone(),
                codex,
                transcript: transcript.clone(),
                turn: None,
                saved: BTreeSet::new(),
                turns: Vec::new(),
                left: BTreeMap::new(),
                rolled_for: BTreeSet::new(),
                thread: 1,
                gone: false,
                link_cleared: false,
                detached: BTreeSet::new(),
                last_ts: 0,
                next_ordinal: 0,
                next_row: 0,
                next_turn: 0,
                next_approval: 0,
                approvals: BTreeMap::new(),
                asked: Vec::new(),
            },
        );
        transcript
    }

    /// The agent's view of `session`.
    pub fn session(&self, session: &SessionId) -> Option<&AgentSession> {
        self.sessions.get(session)
    }

    /// Every session.
    pub fn sessions(&self) -> impl Iterator<Item = &AgentSession> {
        self.sessions.values()
    }

    /// True when some session had `op` in its history: it is there, or a replace latest
    /// rolled it back, or its thread is gone (delivered, either way).
    pub fn had(&self, op: &OperationId) -> bool {
        self.sessions.values().any(|s| s.had(op))
    }

    /// True when `op` left some session's history (a rollback, a thread that is gone).
    pub fn left(&self, op: &OperationId) -> bool {
        self.sessions.values().any(|s| s.left(op).is_some())
    }

    /// True when any session has a turn running.
    pub fn busy(&self) -> bool {
        self.sessions.values().any(|s| s.turn.is_some())
    }

    /// Saves old history before the run starts: `n` exchanges in `session`.
    pub fn seed_history(&mut self, session: &SessionId, n: u64) {
        let Some(s) = self.sessions.get_mut(session) else {
            return;
        };
        for i in 0..n {
            let (t, who) = if i % 2 == 0 {
                (BlockType::User, "You")
            } else {
                (BlockType::AgentReply, "Agent")
            };
            let Ok(key) = BlockKey::parse(t, &format!("old-{i}")) else {
                continue;
            };
            let block = s
                .new_block(key, Millis(1 + i * 10))
                .with_data(serde_json::json!({ "text": format!("{who}: earlier message {i}") }));
            // Each exchange is a turn (for a rollback).
            if i % 2 == 0 {
                s.turns.push(Vec::new());
            }
            s.save_row(block, None);
        }
    }

    /// Handles one call from the host.
    pub fn call(
        &mut self,
        call: AgentCall,
        rng: &mut Rng,
        faults: &Faults,
        counts: &mut FaultCounts,
        now: Millis,
    ) -> Vec<Out> {
        let mut out = Vec::new();
        let calm = self.calm;
        let mut strike = |rng: &mut Rng, kind: FaultKind| {
            let hit = faults.strikes(rng, kind) && !calm;
            if hit {
                counts.add(kind);
            }
            hit
        };
        match call {
            AgentCall::Send(req) => {
                *self.sends.entry(req.operation_id.clone()).or_default() += 1;
                let Some(s) = self.sessions.get_mut(&req.session) else {
                    return out;
                };
                let op = req.operation_id.clone();
                if s.holds(&op) {
                    self.violations.push(AgentViolation::SentTwice(
                        op.clone(),
                        format!(
                            "the agent received {op} again although it holds it (attempt {})",
                            req.attempt
                        ),
                    ));
                }
                if let Some(why) = s.left(&op) {
                    let why = match why {
                        Left::RolledBack => "a replace latest rolled its turn back",
                        Left::ThreadGone => "its thread is gone",
                    };
                    self.violations.push(AgentViolation::Reappears(
                        op.clone(),
                        format!(
                            "the agent received {op} again (attempt {}) after {why}",
                            req.attempt
                        ),
                    ));
                }
                if req.rollback_before_send && !s.codex {
                    self.violations.push(AgentViolation::Unsupported(
                        op.clone(),
                        format!(
                            "a replace latest of {op} (attempt {}) reached a Claude session",
                            req.attempt
                        ),
                    ));
                    out.push(Out::Answer(AgentInput::SendResult {
                        attempt: req.attempt,
                        result: SendResult::ProvenUnadmitted {
                            error: "this agent does not roll back a turn".into(),
                        },
                    }));
                    return out;
                }
                let refuse = strike(rng, FaultKind::AgentRefuses);
                let uncertain = strike(rng, FaultKind::AgentUncertain);
                let took_anyway = rng.chance(0.5);
                let text = req.request.user_text.clone();
                // A second copy of a steer the turn holds as pending input: the turn
                // takes it now, so "delivered" is true.
                let pending = s
                    .turn
                    .as_ref()
                    .and_then(|t| t.pending.iter().position(|(o, _)| *o == op));
                if let Some(i) = pending {
                    if let Some(t) = s.turn.as_mut() {
                        t.pending.remove(i);
                    }
                    s.take(&op, &text, now, &mut out);
                }
                let result = match &req.kind {
                    SendKind::Start { run } => {
                        let rollback = req.rollback_before_send;
                        let keep = self.keep_rolled_back;
                        // A thread the agent said is gone takes nothing until the host
                        // clears the link or asks for a fresh thread.
                        let gone = s.gone && !req.fresh_thread && !s.link_cleared;
                        let fresh = !s.holds(&op)
                            && s.turn.is_none()
                            && !gone
                            && (req.fresh_thread || s.gone);
                        if fresh {
                            s.fresh_thread(&mut self.events);
                        }
                        if s.holds(&op) {
                            SendResult::Delivered
                        } else if s.turn.is_some() {
                            SendResult::ProvenUnadmitted {
                                error: "a turn is already running".into(),
                            }
                        } else if gone {
                            self.events.push(AgentEvent::ThreadGone {
                                session: s.session.clone(),
                            });
                            SendResult::ThreadGone
                        } else if rollback
                            && !calm
                            && !fresh
                            && !s.rolled_for.contains(&op)
                            && rng.chance(THREAD_GONE)
                        {
                            // The thread to roll back is gone: nothing happened, and the
                            // rollback of this message is moot.
                            s.gone = true;
                            s.link_cleared = false;
                            s.rolled_for.insert(op.clone());
                            self.events.push(AgentEvent::ThreadGone {
                                session: s.session.clone(),
                            });
                            SendResult::ThreadGone
                        } else if refuse {
                            // The rollback may have taken before the turn could not start.
                            if rollback && rng.chance(0.5) {
                                s.roll_back(&op, keep, &mut self.events, &mut out);
                            }
                            if rng.chance(0.5) {
                                SendResult::ProvenUnadmitted {
                                    error: "the agent is overloaded".into(),
                                }
                            } else {
                                SendResult::Deferred {
                                    reason: "the agent is busy".into(),
                                }
                            }
                        } else if uncertain && !took_anyway {
                            if rollback && rng.chance(0.5) {
                                s.roll_back(&op, keep, &mut self.events, &mut out);
                            }
                            SendResult::AdmissionUncertain {
                                error: "the reply was lost".into(),
                            }
                        } else {
                            if rollback {
                                s.roll_back(&op, keep, &mut self.events, &mut out);
                            }
                            let turn_id = s.start_turn(run, now);
                            s.take(&op, &text, now, &mut out);
                            if uncertain {
                                SendResult::AdmissionUncertain {
                                    error: "the reply was lost after the turn started".into(),
                                }
                            } else {
                                match s.acceptance(run, &turn_id, now) {
                                    Some(a) if rng.chance(0.8) => SendResult::Accepted(a),
                                    _ => SendResult::Delivered,
                                }
                            }
                        }
                    }
                    SendKind::Steer { run } => {
                        let running = s.turn.as_ref().map(|t| (t.run.clone(), t.turn_id.clone()));
                        match running {
                            _ if s.holds(&op) => SendResult::Delivered,
                            // A turn that runs cannot be rolled back.
                            _ if req.rollback_before_send => SendResult::ProvenUnadmitted {
                                error: "a steer cannot roll back a turn".into(),
                            },
                            Some((r, turn_id)) if &r == run => {
                                if refuse {
                                    SendResult::ProvenUnadmitted {
                                        error: "the steer was refused".into(),
                                    }
                                } else if uncertain {
                                    // An uncertain steer is taken at once or not at all.
                                    if took_anyway {
                                        s.take(&op, &text, now, &mut out);
                                    }
                                    SendResult::AdmissionUncertain {
                                        error: "the steer's reply was lost".into(),
                                    }
                                } else {
                                    if let Some(t) = s.turn.as_mut() {
                                        t.pending.push((op.clone(), text));
                                    }
                                    match s.acceptance(run, &turn_id, now) {
                                        Some(a) => SendResult::Accepted(a),
                                        None => SendResult::ProvenUnadmitted {
                                            error: "bad IDs".into(),
                                        },
                                    }
                                }
                            }
                            _ => SendResult::ProvenUnadmitted {
                                error: "no turn of that run is running".into(),
                            },
                        }
                    }
                };
                out.insert(
                    0,
                    Out::Answer(AgentInput::SendResult {
                        attempt: req.attempt,
                        result,
                    }),
                );
            }
            AgentCall::ReadHistory(ReadHistoryRequest {
                attempt,
                session,
                operation_id,
                ..
            }) => {
                let read = match self.sessions.get(&session) {
                    Some(s) if s.transcript.unreadable() => HistoryRead::Unreadable,
                    Some(s) if s.saved(&operation_id) => HistoryRead::Found,
                    Some(_) => HistoryRead::Missing,
                    None => HistoryRead::Unreadable,
                };
                out.push(Out::Answer(AgentInput::HistoryRead { attempt, read }));
            }
            AgentCall::Stop(StopRequest {
                attempt,
                session,
                run,
            }) => {
                let refuse = strike(rng, FaultKind::AgentRefuses);
                let crash = rng.chance(0.5);
                let Some(s) = self.sessions.get_mut(&session) else {
                    return out;
                };
                let result = if refuse {
                    if crash {
                        StopResult::Crashed
                    } else {
                        StopResult::Failed {
                            error: "the stop did not take".into(),
                        }
                    }
                } else if s.turn.as_ref().is_some_and(|t| t.run == run) {
                    let untaken: Vec<OperationId> = s
                        .turn
                        .as_ref()
                        .map(|t| t.pending.iter().map(|(o, _)| o.clone()).collect())
                        .unwrap_or_default();
                    let mut ended = Vec::new();
                    s.end_turn(RunEventKind::Aborted, false, &mut ended);
                    out.push(Out::Answer(AgentInput::StopResult {
                        attempt,
                        result: StopResult::Stopped {
                            untaken: untaken.clone(),
                        },
                    }));
                    out.extend(ended);
                    return out;
                } else {
                    StopResult::Stopped {
                        untaken: Vec::new(),
                    }
                };
                out.push(Out::Answer(AgentInput::StopResult { attempt, result }));
            }
            AgentCall::TakeBack(TakeBackRequest {
                attempt,
                session,
                operation_id,
                ..
            }) => {
                let Some(s) = self.sessions.get_mut(&session) else {
                    return out;
                };
                let pending = s
                    .turn
                    .as_ref()
                    .and_then(|t| t.pending.iter().position(|(o, _)| *o == operation_id));
                let result = match pending {
                    Some(i) => {
                        if let Some(t) = s.turn.as_mut() {
                            t.pending.remove(i);
                        }
                        s.detached.insert(operation_id.clone());
                        TakeBackResult::DetachedForReplay
                    }
                    None if s.detached.contains(&operation_id) && !s.saved(&operation_id) => {
                        TakeBackResult::AlreadyDetachedForReplay
                    }
                    None => TakeBackResult::NotDetached {
                        reason: "the turn took it or is gone".into(),
                    },
                };
                out.push(Out::Answer(AgentInput::TakeBack { attempt, result }));
            }
            AgentCall::ResolveApproval {
                session,
                request,
                decision,
            } => {
                let n = self
                    .decisions
                    .entry(request.request_id.clone())
                    .or_default();
                *n += 1;
                let refuse = strike(rng, FaultKind::AgentRefuses);
                let Some(s) = self.sessions.get_mut(&session) else {
                    return out;
                };
                let state = s
                    .approvals
                    .get(&request.request_id)
                    .map(|(_, st)| st.clone());
                let result = match state {
                    // The same decision again (a host that restarted while it was on its
                    // way sends it once more): one decision, delivered twice.
                    Some(ApprovalState::Decided(r)) if request.decide(decision) == Ok(r) => {
                        self.violations.push(AgentViolation::DecidedAgain(
                            request.request_id.clone(),
                            format!(
                                "approval {} got the decision it took ({decision:?}) again",
                                request.request_id
                            ),
                        ));
                        Ok(r)
                    }
                    Some(ApprovalState::Decided(r)) => {
                        self.violations.push(AgentViolation::DecidedTwice(
                            request.request_id.clone(),
                            format!(
                                "approval {} was decided again ({decision:?}) after the agent took {r:?}",
                                request.request_id
                            ),
                        ));
                        // The agent keeps the decision it took.
                        Ok(r)
                    }
                    Some(ApprovalState::Expired) => Err("the request is no longer open".into()),
                    None => Err("no such request".into()),
                    Some(ApprovalState::Pending) if refuse => {
                        Err("the agent could not take the decision".into())
                    }
                    Some(ApprovalState::Pending) => match request.decide(decision) {
                        Ok(r) => {
                            if let Some((_, st)) = s.approvals.get_mut(&request.request_id) {
                                *st = ApprovalState::Decided(r);
                            }
                            if let Some(t) = s.turn.as_mut() {
                                t.approvals.retain(|a| a.request_id != request.request_id);
                            }
                            Ok(r)
                        }
                        Err(e) => Err(e.to_string()),
                    },
                };
                out.push(Out::Stream(resolved(&request, result)));
            }
            // Only the link to a thread the agent said is gone: the next send opens a
            // fresh one. (The call travels on its own; one that comes after the fresh
            // thread opened clears nothing.)
            AgentCall::ClearThreadLink { session } => {
                if let Some(s) = self.sessions.get_mut(&session) {
                    if s.gone {
                        s.link_cleared = true;
                    }
                }
            }
            _ => {}
        }
        out
    }

    /// One thing the agent does by itself in `session`'s running turn, if any: stream
    /// a reply, save it, take a steer, ask for an approval, end the turn.
    pub fn act(
        &mut self,
        session: &SessionId,
        rng: &mut Rng,
        faults: &Faults,
        counts: &mut FaultCounts,
        now: Millis,
    ) -> Vec<Out> {
        let mut out = Vec::new();
        let interrupted = faults.strikes(rng, FaultKind::RunInterrupted) && !self.calm;
        let choice = rng.weighted(&[6, 2, 2, 1, 1, 2, 1]);
        let lose_open = rng.chance(0.5);
        let pick = rng.next_u64();
        let others: Vec<SessionId> = self
            .sessions
            .keys()
            .filter(|k| *k != session)
            .cloned()
            .collect();
        let Some(s) = self.sessions.get_mut(session) else {
            return out;
        };
        let Some(run) = s.running().cloned() else {
            return out;
        };
        if interrupted {
            counts.add(FaultKind::RunInterrupted);
            let outcome = if lose_open {
                RunEventKind::Failed
            } else {
                RunEventKind::Aborted
            };
            s.end_turn(outcome, lose_open, &mut out);
            return out;
        }
        match choice {
            // Stream a chunk of the reply.
            0 => {
                let open = s.turn.as_ref().and_then(|t| t.open.clone());
                let block = match open {
                    Some(o) => {
                        let mut b = o.block;
                        if let Some(serde_json::Value::String(text)) = b.data.get_mut("text") {
                            text.push_str(&format!(" chunk-{}", pick % 1000));
                        }
                        b
                    }
                    None => {
                        s.next_row += 1;
                        let Ok(key) = BlockKey::parse(
                            BlockType::AgentReply,
                            &format!("reply-{}", s.next_row),
                        ) else {
                            return out;
                        };
                        s.new_block(key, now).with_data(
                            serde_json::json!({ "text": format!("Agent: reply {}", s.next_row) }),
                        )
                    }
                };
                if let Some(t) = s.turn.as_mut() {
                    t.open = Some(OpenRow {
                        block: block.clone(),
                    });
                }
                out.push(Out::Stream(s.rows(&run, vec![block])));
            }
            // Save the reply.
            1 => s.close_reply(&mut out),
            // Take a pending steer.
            2 => {
                let next = s
                    .turn
                    .as_mut()
                    .and_then(|t| (!t.pending.is_empty()).then(|| t.pending.remove(0)));
                if let Some((op, text)) = next {
                    s.take(&op, &text, now, &mut out);
                }
            }
            // Ask for an approval.
            3 => {
                s.next_approval += 1;
                let n = s.next_approval;
                let Some(turn) = s.turn.as_ref() else {
                    return out;
                };
                let allowed = if pick.is_multiple_of(2) {
                    vec![Decision::Accept, Decision::Decline]
                } else {
                    vec![
                        Decision::Accept,
                        Decision::AcceptForSession,
                        Decision::Decline,
                        Decision::Cancel,
                    ]
                };
                let request = ApprovalRequest {
                    request_id: format!("{session}-req-{n}"),
                    thread_id: s.thread_id(),
                    turn_id: turn.turn_id.clone(),
                    item_id: format!("item-{n}"),
                    kind: ApprovalKind::CommandExecution,
                    allowed,
                };
                if let Some(t) = s.turn.as_mut() {
                    t.approvals.push(request.clone());
                }
                s.approvals.insert(
                    request.request_id.clone(),
                    (request.clone(), ApprovalState::Pending),
                );
                s.asked.push(request.clone());
                out.push(Out::Stream(AgentInput::ApprovalAsked {
                    session: session.clone(),
                    target: TargetId::main(session),
                    run: Some(run.clone()),
                    request,
                    summary: format!("cargo test -p crate-{n}"),
                }));
            }
            // Still working.
            4 => out.push(Out::Stream(AgentInput::RunActive {
                session: session.clone(),
                run: run.clone(),
            })),
            // Send a message to another session (`send_session_message`, OB-16). A call
            // ID drawn again repeats a call: the host answers it without saving twice.
            6 => {
                let Some(recipient) = others.get(pick as usize % others.len().max(1)).cloned()
                else {
                    return out;
                };
                let access = [
                    AccessLevel::ReadOnly,
                    AccessLevel::WorkspaceWrite,
                    AccessLevel::FullAccess,
                    AccessLevel::Unrestricted,
                ][(pick / 7 % 4) as usize];
                let Ok(call_id) = CallId::new(format!("{session}-call-{}", pick % 16)) else {
                    return out;
                };
                out.push(Out::Stream(AgentInput::SessionMessage(
                    SessionMessageCall {
                        sender_session: session.clone(),
                        sender_run: Some(run.clone()),
                        sender_thread: None,
                        call_id,
                        recipient: Some(recipient),
                        body: format!("From {session}: please check build {}", pick % 1000),
                        sender_title: format!("Session {session}"),
                        sender_agent: if s.codex {
                            AgentKind::Codex
                        } else {
                            AgentKind::Claude
                        },
                        sender_access: access,
                        sender_project: None,
                        product: "HB Code".into(),
                    },
                )));
            }
            // The turn completes.
            _ => {
                let waiting = s.turn.as_ref().is_some_and(|t| !t.approvals.is_empty());
                if !waiting || rng.chance(0.3) {
                    s.end_turn(RunEventKind::Completed, false, &mut out);
                }
            }
        }
        out
    }

    /// Brings every running turn to its end: used at quiescence. Pending steers are
    /// taken first.
    pub fn finish(&mut self, now: Millis) -> Vec<Out> {
        let mut out = Vec::new();
        for s in self.sessions.values_mut() {
            while let Some((op, text)) = s
                .turn
                .as_mut()
                .and_then(|t| (!t.pending.is_empty()).then(|| t.pending.remove(0)))
            {
                s.take(&op, &text, now, &mut out);
            }
            if s.turn.is_some() {
                s.end_turn(RunEventKind::Completed, false, &mut out);
            }
        }
        out
    }

    /// The adapter's heartbeat: a turn that said nothing for 20 s tells the host it
    /// still works (`RunActive`), as a registered Codex turn or a live Claude process
    /// vetoes the stale reclaim (OB-14).
    pub fn heartbeat(&mut self, now: Millis) -> Vec<Out> {
        let mut out = Vec::new();
        for s in self.sessions.values_mut() {
            if let Some(turn) = s.turn.as_mut() {
                if now.saturating_sub(turn.touched) >= Millis(20_000) {
                    turn.touched = now;
                    out.push(Out::Stream(AgentInput::RunActive {
                        session: s.session.clone(),
                        run: turn.run.clone(),
                    }));
                }
            }
        }
        out
    }

    /// When the next heartbeat is due, if a turn runs.
    pub fn next_heartbeat(&self) -> Option<Millis> {
        self.sessions
            .values()
            .filter_map(|s| s.turn.as_ref())
            .map(|t| t.touched.saturating_add(Millis(20_000)))
            .min()
    }

    /// After a host restart the agent's connection is new: it asks its open approvals
    /// again and says its turns still run.
    pub fn reconnected(&self) -> Vec<Out> {
        let mut out = Vec::new();
        for s in self.sessions.values() {
            let Some(turn) = &s.turn else {
                continue;
            };
            out.push(Out::Stream(AgentInput::RunActive {
                session: s.session.clone(),
                run: turn.run.clone(),
            }));
            for request in &turn.approvals {
                let n = request.item_id.trim_start_matches("item-");
                out.push(Out::Stream(AgentInput::ApprovalAsked {
                    session: s.session.clone(),
                    target: TargetId::main(&s.session),
                    run: Some(turn.run.clone()),
                    request: request.clone(),
                    summary: format!("cargo test -p crate-{n}"),
                }));
            }
        }
        out
    }
}
