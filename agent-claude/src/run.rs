//! One Claude run as the adapter sees it (sans-IO): the lines one `claude -p` process
//! prints, what they prove about each message the host wrote, the rows they project
//! to, and the permission prompts that wait for an answer (OB-08, OB-09, RW-06).
//!
//! Drive loop, in order:
//! 1. [`ClaudeRun::written`] when the host wrote a user line (its UUID is the
//!    operation's);
//! 2. [`ClaudeRun::handle_line`] for every line Claude printed, with `now`;
//! 3. [`ClaudeRun::state_of`] says what is known of a message: [`SendState::Delivered`]
//!    (the replayed echo, `command_lifecycle` started or completed, or a `result`
//!    naming it), [`SendState::Queued`] (accepted, waiting for the current step),
//!    [`SendState::Refused`], or still [`SendState::Written`];
//!    [`send_result`] turns that into the send's result once the wait ends;
//! 4. the host drains [`ClaudeRun::poll_effect`]: the projection's rows, deltas and
//!    turn ends, and the approval cards ([`Output::Row`], keyed by card ID);
//! 5. [`ClaudeRun::resolve`] answers a prompt and gives the line to write;
//!    [`ClaudeRun::is_finished`] says when the run has nothing more to do.
//!
//! Invariants: a message is delivered once any line names it, whatever came before
//! (a late `queued` never takes it back); the wait for a message ends as uncertain, never
//! as delivered or refused, when Claude exits or the deadline passes without a line
//! naming it; every prompt is answered at most once.
//!
//! ```
//! use agent_claude::run::{ClaudeRun, SendState};
//! use agent_claude::stream::MessageUuid;
//! use timeline_core::key::RunId;
//! use timeline_core::time::Millis;
//!
//! let uuid = MessageUuid::parse("0b7e2f4c-9d1a-4c3b-8e5f-6a7b8c9d0e1f").unwrap();
//! let mut run = ClaudeRun::new(RunId::new("run-1").unwrap(), &uuid, "app-session", 0);
//! run.written(&uuid);
//! assert_eq!(run.state_of(&uuid), Some(SendState::Written));
//! run.handle_line(br#"{"type":"user","isReplay":true,"uuid":"0b7e2f4c-9d1a-4c3b-8e5f-6a7b8c9d0e1f","message":{"role":"user","content":"hi"}}"#, Millis(3));
//! assert_eq!(run.state_of(&uuid), Some(SendState::Delivered));
//! ```

use std::collections::{BTreeMap, VecDeque};

use outbox_core::adapter::SendResult;
use outbox_core::entry::Acceptance;
use outbox_core::ids::{ThreadId, TurnId};
use timeline_core::key::{BlockId, BlockKey, BlockType, RunId};
use timeline_core::rows::{ApprovalRequest, ApprovalResult, Decision, DecisionNotAllowed};
use timeline_core::time::Millis;

use crate::diag::Diagnostics;
use crate::permission::{answer_line, approval_request, card_block, summary};
use crate::project::{Output, Projector};
use crate::proof::Verdict;
use crate::stream::{ControlRequest, MessageUuid, ResultFrame, StreamDecoder};

/// What is known of a message the host wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendState {
    /// Written; no line named it yet.
    Written,
    /// Accepted into Claude's queue (`command_lifecycle` queued): it waits for the
    /// current step, and an interrupt drops it.
    Queued,
    /// In the conversation.
    Delivered,
    /// Claude refused it.
    Refused,
    /// Cancelled before it started (an interrupt with `cancel_queued`, or
    /// `cancel_async_message`): Claude never took it.
    Cancelled,
}

/// Why the wait for a message ended before a line settled it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitEnd {
    /// A line settled it (see [`ClaudeRun::state_of`]).
    Settled,
    /// Claude exited; `code` is its exit code when it had one.
    Exited {
        /// The exit code.
        code: Option<i32>,
        /// The end of what Claude wrote to stderr.
        stderr: String,
    },
    /// The deadline passed.
    TimedOut {
        /// How long the host waited, in milliseconds.
        waited_ms: u64,
    },
    /// The turn ended without a line naming the message.
    TurnEnded,
    /// The write failed after the process started.
    WriteFailed(String),
}

/// The send result of a wait for a message in state `state` that ended with `end`
/// (OB-08, OB-09): delivered, accepted (with `acceptance`) and refused as the lines
/// say; everything after the hand-off that leaves the message unnamed is uncertain.
pub fn send_result(
    state: Option<SendState>,
    end: &WaitEnd,
    acceptance: Option<Acceptance>,
) -> SendResult {
    match (state, acceptance) {
        (Some(SendState::Delivered), _) => SendResult::Delivered,
        (Some(SendState::Queued), Some(acceptance)) => SendResult::Accepted(acceptance),
        (Some(SendState::Queued), None) => SendResult::AdmissionUncertain {
            error: "Claude queued the message, but no acceptance could be recorded".to_owned(),
        },
        (Some(SendState::Refused), _) => SendResult::ProvenUnadmitted {
            error: "Claude refused the message".to_owned(),
        },
        (Some(SendState::Cancelled), _) => SendResult::ProvenUnadmitted {
            error: "Claude cancelled the message before it started".to_owned(),
        },
        (Some(SendState::Written) | None, _) => SendResult::AdmissionUncertain {
            error: match end {
                WaitEnd::Exited { code, stderr } => {
                    let code = code.map_or_else(
                        || "without an exit code".to_owned(),
                        |c| format!("code {c}"),
                    );
                    let tail = stderr.trim();
                    if tail.is_empty() {
                        format!("Claude exited ({code}) before confirming the message")
                    } else {
                        format!("Claude exited ({code}) before confirming the message: {tail}")
                    }
                }
                WaitEnd::TimedOut { waited_ms } => format!(
                    "Claude did not confirm the message within {} s",
                    waited_ms / 1000
                ),
                WaitEnd::TurnEnded => "The turn ended without naming the message".to_owned(),
                WaitEnd::WriteFailed(e) => format!("Writing the message to Claude failed: {e}"),
                WaitEnd::Settled => "No line named the message".to_owned(),
            },
        },
    }
}

/// Why a decision was not written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResolveError {
    /// This run holds no open prompt with the request ID: another adapter's request,
    /// or one answered or withdrawn before.
    #[error("no open Claude permission request {0:?}")]
    NotOpen(String),
    /// The request does not allow the decision.
    #[error(transparent)]
    NotAllowed(#[from] DecisionNotAllowed),
}

/// An unanswered permission prompt.
#[derive(Clone, Debug)]
struct OpenPrompt {
    prompt: ControlRequest,
    request: ApprovalRequest,
}

/// One Claude run; see the module doc.
pub struct ClaudeRun {
    run: RunId,
    turn: String,
    claude_session: Option<String>,
    version: Option<String>,
    decoder: StreamDecoder,
    projector: Projector,
    sends: BTreeMap<String, SendState>,
    prompts: BTreeMap<String, OpenPrompt>,
    last_result: Option<ResultFrame>,
    /// Lines since the last `result` (a turn in progress).
    busy: bool,
    /// Lines the host owes Claude (answers to control requests it does not serve).
    answers: VecDeque<String>,
    out: VecDeque<Output>,
}

/// The `control_response` that refuses a request this host does not serve.
fn refusal_line(prompt: &ControlRequest) -> String {
    let mut line = serde_json::json!({
        "type": "control_response",
        "response": {
            "subtype": "error",
            "request_id": prompt.request_id,
            "error": format!("this host does not serve {:?} requests", prompt.subtype),
        },
    })
    .to_string();
    line.push('\n');
    line
}

impl ClaudeRun {
    /// Run `run`, started by the message `first` (its UUID is the run's turn ID), for
    /// the host session `session`; delta events are numbered from `first_seq`.
    pub fn new(run: RunId, first: &MessageUuid, session: &str, first_seq: u64) -> ClaudeRun {
        ClaudeRun {
            run,
            turn: first.as_str().to_owned(),
            claude_session: None,
            version: None,
            decoder: StreamDecoder::new(),
            projector: Projector::new(session, first_seq),
            sends: BTreeMap::new(),
            prompts: BTreeMap::new(),
            last_result: None,
            busy: true,
            answers: VecDeque::new(),
            out: VecDeque::new(),
        }
    }

    /// The next line the host owes Claude, if any; it stays owed until
    /// [`ClaudeRun::answered`] says it was written.
    pub fn next_answer(&self) -> Option<&str> {
        self.answers.front().map(String::as_str)
    }

    /// The line [`ClaudeRun::next_answer`] gave was written.
    pub fn answered(&mut self) {
        self.answers.pop_front();
    }

    /// The run.
    pub fn run(&self) -> &RunId {
        &self.run
    }

    /// The Claude session, once `system/init` named it.
    pub fn claude_session(&self) -> Option<&str> {
        self.claude_session.as_deref()
    }

    /// The Claude Code version `system/init` stated.
    pub fn version(&self) -> Option<&str> {
        self.version.as_deref()
    }

    /// What the decoder saw.
    pub fn diagnostics(&self) -> &Diagnostics {
        self.decoder.diagnostics()
    }

    /// The acceptance of a message this run took into its queue (OB-08): the run, the
    /// Claude session as the thread (the run's turn until `init` named it) and the
    /// run's turn.
    pub fn acceptance(&self, now: Millis) -> Option<Acceptance> {
        let thread = self.claude_session.as_deref().unwrap_or(&self.turn);
        Some(Acceptance {
            run_id: self.run.clone(),
            thread_id: ThreadId::new(thread).ok()?,
            turn_id: TurnId::new(self.turn.as_str()).ok()?,
            accepted_at: now,
        })
    }

    /// The host wrote a user line carrying `uuid`.
    pub fn written(&mut self, uuid: &MessageUuid) {
        self.sends
            .entry(uuid.as_str().to_owned())
            .or_insert(SendState::Written);
        self.busy = true;
    }

    /// What is known of the message `uuid`; `None` for a message this run was not
    /// given.
    pub fn state_of(&self, uuid: &MessageUuid) -> Option<SendState> {
        self.sends.get(uuid.as_str()).copied()
    }

    /// Messages Claude cancelled before they started: the run never took them. A
    /// message still queued is not among them: Claude 2.1.328 keeps queued messages
    /// through a plain interrupt (`still_queued`) and runs them as the next turn; only an
    /// interrupt with `cancel_queued` (or `cancel_async_message`) drops one, and says so
    /// with `command_lifecycle` `cancelled`.
    pub fn untaken(&self) -> Vec<String> {
        self.sends
            .iter()
            .filter(|(_, s)| **s == SendState::Cancelled)
            .map(|(u, _)| u.clone())
            .collect()
    }

    /// Sets the Claude session before `system/init` names it (a run started with
    /// `--session-id` or `--resume` knows it from the start).
    pub fn set_claude_session(&mut self, claude_session: &str) {
        self.claude_session = Some(claude_session.to_owned());
    }

    /// The last `result` line.
    pub fn last_result(&self) -> Option<&ResultFrame> {
        self.last_result.as_ref()
    }

    /// True when a turn ended and nothing waits: every message written was delivered
    /// or refused, and no prompt is open. The host then closes Claude's input.
    pub fn is_finished(&self) -> bool {
        !self.busy
            && self.prompts.is_empty()
            && self.sends.values().all(|s| {
                matches!(
                    s,
                    SendState::Delivered | SendState::Refused | SendState::Cancelled
                )
            })
    }

    /// The prompts that wait for a decision.
    pub fn open_approvals(&self) -> impl Iterator<Item = &ApprovalRequest> {
        self.prompts.values().map(|p| &p.request)
    }

    /// The prompts that wait for a decision, each with its card's context line.
    pub fn open_prompts(&self) -> impl Iterator<Item = (&ApprovalRequest, String)> {
        self.prompts
            .values()
            .map(|p| (&p.request, summary(&p.prompt)))
    }

    /// True while a turn is in progress (lines came since the last `result`).
    pub fn is_busy(&self) -> bool {
        self.busy
    }

    /// The next output, oldest first.
    #[must_use]
    pub fn poll_effect(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    /// The old name of [`Self::poll_effect`].
    #[deprecated(note = "renamed poll_effect: one name for every machine's output")]
    #[must_use]
    pub fn poll_output(&mut self) -> Option<Output> {
        self.poll_effect()
    }

    /// Takes one line Claude printed at `now`.
    pub fn handle_line(&mut self, line: &[u8], now: Millis) {
        let Some(decoded) = self.decoder.decode(line) else {
            return;
        };
        self.projector.handle_line(&decoded, now);
        if self.projector.holds_echo() {
            // An echo the projection holds back is a turn's like its row: busy until
            // its result.
            self.busy = true;
        }
        while let Some(o) = self.projector.poll_effect() {
            self.take(o, now);
        }
    }

    /// The process ended: what the projection held back is shown
    /// ([`Projector::flush`]), at `now`.
    pub fn flush(&mut self, now: Millis) {
        self.projector.flush();
        while let Some(o) = self.projector.poll_effect() {
            self.take(o, now);
        }
    }

    fn take(&mut self, o: Output, now: Millis) {
        match &o {
            Output::Started {
                claude_session,
                version,
            } => {
                self.claude_session = Some(claude_session.clone());
                self.version.clone_from(version);
            }
            Output::Proof(ev) => {
                let uuid = ev.uuid.to_ascii_lowercase();
                let next = match ev.verdict() {
                    Verdict::Delivered => Some(SendState::Delivered),
                    Verdict::Queued => Some(SendState::Queued),
                    Verdict::Refused => Some(SendState::Refused),
                    Verdict::Cancelled => Some(SendState::Cancelled),
                    Verdict::Unknown => None,
                };
                if let (Some(state), Some(next)) = (self.sends.get_mut(&uuid), next) {
                    *state = match (*state, next) {
                        (SendState::Delivered, _) => SendState::Delivered,
                        (_, SendState::Delivered) => SendState::Delivered,
                        (SendState::Refused, _) | (_, SendState::Refused) => SendState::Refused,
                        (SendState::Cancelled, _) => SendState::Cancelled,
                        (_, next) => next,
                    };
                }
            }
            Output::TurnEnded(r) => {
                self.last_result = Some(r.clone());
                self.busy = false;
            }
            Output::Permission(prompt) => {
                let thread = self.claude_session.clone().unwrap_or_default();
                match approval_request(prompt, &thread, &self.turn) {
                    Some(request) => {
                        self.card(&request, &summary(prompt), None, now);
                        self.prompts.insert(
                            prompt.request_id.clone(),
                            OpenPrompt {
                                prompt: prompt.clone(),
                                request,
                            },
                        );
                    }
                    // Claude waits for an answer to every request: one this host does
                    // not serve gets an error at once instead of a hung turn.
                    None => self.answers.push_back(refusal_line(prompt)),
                }
            }
            Output::PermissionWithdrawn(id) => {
                if let Some(open) = self.prompts.remove(id) {
                    let s = summary(&open.prompt);
                    self.card(
                        &open.request,
                        &s,
                        Some(ApprovalResult::ResolvedExternally),
                        now,
                    );
                }
            }
            _ => {}
        }
        if matches!(o, Output::Row(_) | Output::Event(_)) {
            // A row or a delta belongs to a turn: busy until its result.
            self.busy = true;
        }
        self.out.push_back(o);
    }

    fn card(
        &mut self,
        request: &ApprovalRequest,
        summary: &str,
        result: Option<ApprovalResult>,
        now: Millis,
    ) {
        let Ok(id) = BlockId::new(request.card_id()) else {
            return;
        };
        let (at, seq) = self
            .projector
            .placement(BlockKey::new(BlockType::Activity, id), now);
        if let Some(b) = card_block(request, summary, result, at, seq) {
            self.out.push_back(Output::Row(b));
        }
    }

    /// Answers the open prompt `request_id` with `decision`: the `control_response`
    /// line to write and the result; the decided card replaces the pending one.
    pub fn resolve(
        &mut self,
        request_id: &str,
        decision: Decision,
        now: Millis,
    ) -> Result<(String, ApprovalResult), ResolveError> {
        let open = self
            .prompts
            .get(request_id)
            .ok_or_else(|| ResolveError::NotOpen(request_id.to_owned()))?;
        let result = open.request.decide(decision)?;
        let line = answer_line(&open.prompt, &open.request, decision)?;
        let open = self
            .prompts
            .remove(request_id)
            .ok_or_else(|| ResolveError::NotOpen(request_id.to_owned()))?;
        let s = summary(&open.prompt);
        self.card(&open.request, &s, Some(result), now);
        Ok((line, result))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OP: &str = "0b7e2f4c-9d1a-4c3b-8e5f-6a7b8c9d0e1f";

    fn run() -> (ClaudeRun, MessageUuid) {
        let uuid = MessageUuid::parse(OP).unwrap();
        let mut r = ClaudeRun::new(RunId::new("run-1").unwrap(), &uuid, "s", 0);
        r.written(&uuid);
        (r, uuid)
    }

    fn lifecycle(state: &str) -> String {
        format!(
            r#"{{"type":"command_lifecycle","command_uuid":"{OP}","state":"{state}","uuid":"l","session_id":"cs"}}"#
        )
    }

    // OB-08: queued is an acceptance, a later started delivers, and a late queued does
    // not take the delivery back.
    #[test]
    fn lines_settle_a_message_monotonically() {
        let (mut r, u) = run();
        r.handle_line(lifecycle("queued").as_bytes(), Millis(1));
        assert_eq!(r.state_of(&u), Some(SendState::Queued));
        assert!(
            r.untaken().is_empty(),
            "a queued message survives an interrupt"
        );
        r.handle_line(lifecycle("started").as_bytes(), Millis(2));
        assert_eq!(r.state_of(&u), Some(SendState::Delivered));
        r.handle_line(lifecycle("queued").as_bytes(), Millis(3));
        assert_eq!(r.state_of(&u), Some(SendState::Delivered));
        assert!(r.untaken().is_empty());
        let (mut r, u) = run();
        r.handle_line(lifecycle("refused").as_bytes(), Millis(1));
        assert_eq!(r.state_of(&u), Some(SendState::Refused));
    }

    // OB-08: Claude 2.1.328 cancels a queued message only when told to (`cancel_queued`,
    // `cancel_async_message`): that one was never taken; one that started and was then
    // cancelled (its turn interrupted) stays delivered.
    #[test]
    fn a_cancelled_message_is_untaken_only_when_it_never_started() {
        let (mut r, u) = run();
        r.handle_line(lifecycle("queued").as_bytes(), Millis(1));
        r.handle_line(lifecycle("cancelled").as_bytes(), Millis(2));
        assert_eq!(r.state_of(&u), Some(SendState::Cancelled));
        assert_eq!(r.untaken(), [OP.to_owned()]);
        // Any line that proves delivery wins: what may be delivered is never sent again.
        r.handle_line(lifecycle("started").as_bytes(), Millis(3));
        assert_eq!(r.state_of(&u), Some(SendState::Delivered));
        assert!(r.untaken().is_empty());
        let (mut r, u) = run();
        r.handle_line(lifecycle("started").as_bytes(), Millis(1));
        r.handle_line(lifecycle("cancelled").as_bytes(), Millis(2));
        assert_eq!(r.state_of(&u), Some(SendState::Delivered));
        assert!(r.untaken().is_empty());
    }

    // OB-08, OB-09: the send result of each way a wait ends.
    #[test]
    fn waits_end_in_the_six_results() {
        let (r, _) = run();
        let acc = r.acceptance(Millis(9));
        let a = acc.clone().unwrap();
        assert_eq!(a.turn_id.as_str(), OP);
        let ended = WaitEnd::Exited {
            code: Some(137),
            stderr: "killed".into(),
        };
        assert_eq!(
            send_result(Some(SendState::Delivered), &ended, acc.clone()),
            SendResult::Delivered
        );
        assert_eq!(
            send_result(Some(SendState::Queued), &WaitEnd::Settled, acc.clone()),
            SendResult::Accepted(a.clone())
        );
        assert!(matches!(
            send_result(Some(SendState::Refused), &WaitEnd::Settled, acc.clone()),
            SendResult::ProvenUnadmitted { .. }
        ));
        assert!(matches!(
            send_result(Some(SendState::Queued), &WaitEnd::Settled, None),
            SendResult::AdmissionUncertain { .. }
        ));
        for end in [
            ended,
            WaitEnd::TimedOut { waited_ms: 30_000 },
            WaitEnd::TurnEnded,
            WaitEnd::WriteFailed("broken pipe".into()),
        ] {
            let SendResult::AdmissionUncertain { error } =
                send_result(Some(SendState::Written), &end, acc.clone())
            else {
                panic!("{end:?}");
            };
            assert!(!error.is_empty());
        }
    }

    // RW-06: a prompt opens a pending card, a decision decides it in place and is
    // written once, a withdrawn prompt expires, an unknown request is not this run's.
    #[test]
    fn prompts_become_cards_and_answers() {
        let (mut r, _) = run();
        r.handle_line(
            br#"{"type":"system","subtype":"init","session_id":"cs","capabilities":[]}"#,
            Millis(1),
        );
        r.handle_line(br#"{"type":"control_request","request_id":"req-1","request":{"subtype":"can_use_tool","tool_name":"Bash","input":{"command":"rm -rf build"},"tool_use_id":"toolu_1"}}"#, Millis(2));
        r.handle_line(br#"{"type":"control_request","request_id":"req-2","request":{"subtype":"can_use_tool","tool_name":"Write","input":{"file_path":"a"},"tool_use_id":"toolu_2"}}"#, Millis(3));
        // A request this host does not serve is refused at once.
        r.handle_line(
            br#"{"type":"control_request","request_id":"req-0","request":{"subtype":"hook_callback","callback_id":"c"}}"#,
            Millis(2),
        );
        let refusal: serde_json::Value =
            serde_json::from_str(r.next_answer().expect("an answer owed")).unwrap();
        assert_eq!(refusal["response"]["subtype"], "error");
        assert_eq!(refusal["response"]["request_id"], "req-0");
        r.answered();
        assert_eq!(r.next_answer(), None);
        let open: Vec<&str> = r.open_approvals().map(|a| a.request_id.as_str()).collect();
        assert_eq!(open, ["req-1", "req-2"]);
        assert_eq!(r.open_approvals().next().unwrap().thread_id, "cs");
        assert!(!r.is_finished());
        let cards = |r: &mut ClaudeRun| {
            std::iter::from_fn(|| r.poll_effect())
                .filter_map(|o| match o {
                    Output::Row(b) if b.data.get("approval").is_some() => Some(b),
                    _ => None,
                })
                .collect::<Vec<_>>()
        };
        let pending = cards(&mut r);
        assert_eq!(pending.len(), 2);
        assert_eq!(pending[0].data["approval"]["status"], "pending");

        let (line, result) = r.resolve("req-1", Decision::Decline, Millis(4)).unwrap();
        assert_eq!(result, ApprovalResult::Declined);
        assert!(line.contains(r#""request_id":"req-1""#));
        assert_eq!(
            r.resolve("req-1", Decision::Accept, Millis(5)),
            Err(ResolveError::NotOpen("req-1".into()))
        );
        assert!(matches!(
            r.resolve("req-2", Decision::AcceptForSession, Millis(5)),
            Err(ResolveError::NotAllowed(_))
        ));
        r.handle_line(
            br#"{"type":"control_cancel_request","request_id":"req-2"}"#,
            Millis(6),
        );
        let decided = cards(&mut r);
        assert_eq!(decided.len(), 2);
        assert_eq!(decided[0].key(), pending[0].key());
        assert_eq!(
            decided[0].source_order, pending[0].source_order,
            "decided in place"
        );
        assert_eq!(decided[0].data["approval"]["status"], "declined");
        assert_eq!(decided[1].data["approval"]["status"], "expired");
        assert_eq!(r.open_approvals().count(), 0);
    }
}
