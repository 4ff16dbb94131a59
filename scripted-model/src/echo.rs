//! An in-process agent that plays scripted turns by the words of each message, for the
//! server, the browser page and the examples: a reply, a reply that streams, an
//! approval, a flood of rows, a run that never ends. No process, no model.

use outbox_core::adapter::StopRequest;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use host_core::{
    Agent, AgentCall, AgentEffect, AgentInput, FileError, ProcessId, ReadId, WriteFailure, WriteId,
};
use outbox_core::adapter::{Capabilities, SendKind, SendResult, StopResult};
use outbox_core::entry::Acceptance;
use outbox_core::ids::{RunId, ThreadId, TurnId};
use overlay_core::live::RunEventKind;
use overlay_core::store::{RowClass, StoredBlock};
use timeline_core::key::{BlockKey, BlockType, OperationId, SessionId, TargetId};
use timeline_core::rows::{ApprovalKind, ApprovalRequest, ApprovalResult, Decision};
use timeline_core::time::Millis;
use timeline_core::Block;

/// An in-process agent. Each send is a new run, accepted and proven; the user's row is
/// published, then by the text:
/// - `flood:N`: N reply rows of 32 KB, one write every 5 ms;
/// - `stream:N`: one reply row of 64 KB written N times, 10 ms apart, its text starting
///   with the write's number (`0000`, `0001`, ...);
/// - `tick:N`: one reply row written N times, 100 ms apart, each carrying the host's
///   time of the write (`data.sentAtMs`);
/// - `slow`: one reply row whose text grows by a word every 40 ms, 40 times;
/// - `approve`: an approval card (accept or decline); the decision's result is the reply;
/// - `hold`: nothing more, and the run never ends (nor is a stop answered);
/// - `deltas:N`: N streamed fragments of the reply at once (`t0 `, `t1 `, ...), then the
///   reply row with their text;
/// - anything else: the reply `echo: <text>`.
///
/// The run ends 50 ms after the last row (3 s after an approval's decision). A stop
/// of a run it plays is answered at once: the rows still to come are dropped and the
/// run ends `aborted` (a `hold` run's stop is never answered).
#[derive(Debug)]
pub struct EchoAgent {
    out: VecDeque<AgentEffect>,
    end_at: Option<(Millis, SessionId, RunId)>,
    /// Rows still to publish, each this long after the one before, and when the next
    /// is due; the run ends 50 ms after the last.
    later: VecDeque<(Millis, StoredBlock)>,
    next_at: Option<Millis>,
    after_later: Option<(SessionId, RunId)>,
    /// The session of the rows still to publish.
    later_session: Option<SessionId>,
    /// An approval waiting for its decision: its run.
    asked: Option<(ApprovalRequest, SessionId, RunId)>,
    /// Sends handed to it.
    pub sends: Arc<AtomicUsize>,
}

impl Default for EchoAgent {
    fn default() -> EchoAgent {
        EchoAgent::new()
    }
}

impl EchoAgent {
    /// An agent that serves every session.
    pub fn new() -> EchoAgent {
        EchoAgent {
            out: VecDeque::new(),
            end_at: None,
            later: VecDeque::new(),
            next_at: None,
            after_later: None,
            later_session: None,
            asked: None,
            sends: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn publish(&mut self, session: &SessionId, rows: Vec<StoredBlock>) {
        self.out.push_back(AgentEffect::Input(AgentInput::Rows {
            session: session.clone(),
            target: TargetId::main(session),
            rows,
        }));
    }
}

impl Agent for EchoAgent {
    fn capabilities(&self) -> Capabilities {
        Capabilities::codex()
    }
    fn serves(&self, _: &SessionId) -> bool {
        true
    }
    fn handle_call(&mut self, call: AgentCall, now: Millis) {
        match call {
            AgentCall::Send(request) => {
                self.sends.fetch_add(1, Ordering::SeqCst);
                let SendKind::Start { run } = request.kind.clone() else {
                    return;
                };
                let session = request.session.clone();
                let op = request.operation_id.clone();
                self.out
                    .push_back(AgentEffect::Input(AgentInput::SendResult {
                        attempt: request.attempt,
                        result: SendResult::Accepted(Acceptance {
                            run_id: run.clone(),
                            thread_id: ThreadId::new("thread-1").expect("not blank"),
                            turn_id: TurnId::new(format!("turn-{op}")).expect("not blank"),
                            accepted_at: now,
                        }),
                    }));
                let text = request.request.user_text.clone();
                let user = row(
                    BlockType::User,
                    &format!("user-message::{op}"),
                    &text,
                    &run,
                    Some(op.clone()),
                    now,
                );
                self.publish(&session, vec![user]);
                self.out
                    .push_back(AgentEffect::Input(AgentInput::DeliveryProof {
                        session: request.session.clone(),
                        operation_id: op.clone(),
                    }));
                let reply_key = format!("reply-{op}");
                let number = |prefix: &str| {
                    text.strip_prefix(prefix)
                        .and_then(|n| n.parse::<u64>().ok())
                };
                if let Some(n) = number("flood:") {
                    for i in 0..n {
                        let big = "x".repeat(32 * 1024);
                        let id = format!("flood-{i}");
                        let r = row(BlockType::AgentReply, &id, &big, &run, None, now);
                        self.later.push_back((Millis(5), r));
                    }
                } else if let Some(n) = number("stream:") {
                    let body = "x".repeat(64 * 1024);
                    for i in 0..n {
                        let text = format!("{i:04}{body}");
                        let r = row(BlockType::AgentReply, &reply_key, &text, &run, None, now);
                        self.later.push_back((Millis(10), r));
                    }
                } else if let Some(n) = number("tick:") {
                    // Each write carries the host's time of the write, for latency.
                    for i in 0..n {
                        let mut r = row(
                            BlockType::AgentReply,
                            &reply_key,
                            &format!("tick {i}"),
                            &run,
                            None,
                            now,
                        );
                        r.block.data["sentAtMs"] = serde_json::json!(0);
                        self.later.push_back((Millis(100), r));
                    }
                } else if text.starts_with("slow") {
                    let mut words = String::new();
                    for i in 0..40u64 {
                        words.push_str(&format!("word{i} "));
                        let r = row(
                            BlockType::AgentReply,
                            &reply_key,
                            words.trim_end(),
                            &run,
                            None,
                            now,
                        );
                        self.later.push_back((Millis(40), r));
                    }
                } else if text.starts_with("approve") {
                    let request = ApprovalRequest {
                        request_id: format!("req-{op}"),
                        thread_id: "thread-1".into(),
                        turn_id: format!("turn-{op}"),
                        item_id: format!("item-{op}"),
                        kind: ApprovalKind::CommandExecution,
                        allowed: vec![Decision::Accept, Decision::Decline],
                    };
                    self.out
                        .push_back(AgentEffect::Input(AgentInput::ApprovalAsked {
                            session: session.clone(),
                            target: TargetId::main(&session),
                            run: Some(run.clone()),
                            request: request.clone(),
                            summary: "npm test".into(),
                        }));
                    self.asked = Some((request, session, run));
                    return;
                } else if text.starts_with("hold") {
                    return;
                } else if let Some(n) = number("deltas:") {
                    let mut whole = String::new();
                    for i in 0..n {
                        let fragment = format!("t{i} ");
                        whole.push_str(&fragment);
                        self.out.push_back(AgentEffect::Input(AgentInput::Delta {
                            session: session.clone(),
                            fragment: host_core::Fragment::new(
                                timeline_core::history::DeltaKind::Text,
                                reply_key.clone(),
                                fragment,
                            ),
                        }));
                    }
                    let r = row(BlockType::AgentReply, &reply_key, &whole, &run, None, now);
                    self.publish(&session, vec![r]);
                } else {
                    let reply = format!("echo: {text}");
                    let r = row(BlockType::AgentReply, &reply_key, &reply, &run, None, now);
                    self.publish(&session, vec![r]);
                }
                match self.later.front() {
                    Some((gap, _)) => {
                        self.next_at = Some(now.saturating_add(*gap));
                        self.later_session = Some(session.clone());
                        self.after_later = Some((session, run));
                    }
                    None => self.end_at = Some((now.saturating_add(Millis(50)), session, run)),
                }
            }
            AgentCall::ResolveApproval {
                request, decision, ..
            } => {
                let Some((asked, session, run)) = self.asked.take() else {
                    return;
                };
                let result = match decision {
                    Decision::Accept => ApprovalResult::Accepted,
                    Decision::Decline => ApprovalResult::Declined,
                    _ => ApprovalResult::Cancelled,
                };
                self.out
                    .push_back(AgentEffect::Input(AgentInput::ApprovalResolved {
                        request_id: request.request_id.clone(),
                        thread_id: request.thread_id.clone(),
                        turn_id: request.turn_id.clone(),
                        item_id: request.item_id.clone(),
                        result: Ok(result),
                    }));
                let r = row(
                    BlockType::AgentReply,
                    &format!("reply-{}", asked.request_id),
                    &format!("the command ran: {}", result.label()),
                    &run,
                    None,
                    now,
                );
                self.publish(&session, vec![r]);
                // The decided card stays until the run's end removes it (the Codex
                // cleanup): three seconds, so a person (or a test) sees it.
                self.end_at = Some((now.saturating_add(Millis(3_000)), session, run));
            }
            AgentCall::Stop(StopRequest {
                attempt,
                session,
                run,
            }) => {
                let playing = self.after_later.as_ref().is_some_and(|(_, r)| *r == run)
                    || self.end_at.as_ref().is_some_and(|(_, _, r)| *r == run)
                    || self.asked.as_ref().is_some_and(|(_, _, r)| *r == run);
                if !playing {
                    return;
                }
                self.later.clear();
                self.next_at = None;
                self.after_later = None;
                self.later_session = None;
                self.end_at = None;
                self.asked = None;
                self.out
                    .push_back(AgentEffect::Input(AgentInput::StopResult {
                        attempt,
                        result: StopResult::Stopped {
                            untaken: Vec::new(),
                        },
                    }));
                self.out.push_back(AgentEffect::Input(AgentInput::RunEnded {
                    session,
                    run,
                    outcome: RunEventKind::Aborted,
                    untaken: Vec::new(),
                }));
            }
            _ => {}
        }
    }
    fn handle_line(&mut self, _: ProcessId, _: &[u8], _: Millis) {}
    fn handle_line_too_long(&mut self, _: ProcessId, _: Millis) {}
    fn handle_exit(&mut self, _: ProcessId, _: String, _: Millis) {}
    fn handle_written(&mut self, _: ProcessId, _: WriteId, _: Result<(), WriteFailure>, _: Millis) {
    }
    fn handle_file(&mut self, _: ReadId, _: Result<Vec<u8>, FileError>, _: Millis) {}
    fn poll_effect(&mut self) -> Option<AgentEffect> {
        self.out.pop_front()
    }
    fn poll_timeout(&self) -> Option<Millis> {
        let end = self.end_at.as_ref().map(|(at, _, _)| *at);
        end.into_iter().chain(self.next_at).min()
    }
    fn handle_timeout(&mut self, now: Millis) {
        // One row per tick, the next one its gap after this one: a steady pace whatever
        // the host loop's delay.
        if self.next_at.is_some_and(|at| at <= now) {
            if let (Some((_, mut r)), Some(session)) =
                (self.later.pop_front(), self.later_session.clone())
            {
                if r.block.data.get("sentAtMs").is_some() {
                    r.block.data["sentAtMs"] = serde_json::json!(now.as_u64());
                }
                self.publish(&session, vec![r]);
            }
            self.next_at = self.later.front().map(|(gap, _)| now.saturating_add(*gap));
            if self.next_at.is_none() {
                if let Some((session, run)) = self.after_later.take() {
                    self.end_at = Some((now.saturating_add(Millis(50)), session, run));
                }
            }
        }
        if self.end_at.as_ref().is_some_and(|(at, _, _)| *at <= now) {
            if let Some((_, session, run)) = self.end_at.take() {
                self.out.push_back(AgentEffect::Input(AgentInput::RunEnded {
                    session,
                    run,
                    outcome: RunEventKind::Completed,
                    untaken: Vec::new(),
                }));
            }
        }
    }
}

/// A live row of `run`: type, ID, its text, the operation it carries, its time.
pub fn row(
    t: BlockType,
    id: &str,
    text: &str,
    run: &RunId,
    op: Option<OperationId>,
    at: Millis,
) -> StoredBlock {
    let mut block = Block::new(
        BlockKey::parse(t, id).expect("the IDs of this agent are not blank"),
        at,
    )
    .with_data(serde_json::json!({ "text": text }));
    if let Some(op) = op {
        block = block.with_operation(op);
    }
    StoredBlock {
        block,
        class: RowClass::Ordinary,
        run_id: Some(run.clone()),
    }
}
