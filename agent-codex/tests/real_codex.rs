//! `CodexAgent` against the real `codex app-server` of the pinned `@openai/codex`,
//! offline against the scripted model on loopback, driven by
//! `scripted_model::drive::Blocking` (the runtime's tests drive it through
//! `host-runtime`). Needs the binary:
//! `.ci/run` installs it; without it these tests fail saying what to install.

#![allow(clippy::unwrap_used)] // a test: a failed step is a failed test
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // the driver loop reads the clock

use outbox_core::adapter::{ReadHistoryRequest, StopRequest};
use std::cell::Cell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::Duration;

use agent_codex::{CodexAgent, ThreadConfig};
use host_core::{
    Agent, AgentCall, AgentEffect, AgentInput, FileError, ProcessId, ProcessSpec, ReadId,
    WriteFailure, WriteId,
};
use outbox_core::adapter::Capabilities;
use outbox_core::adapter::{
    AttemptId, HistoryRead, ProofKind, SendKind, SendRequest, SendResult, StopResult,
};
use outbox_core::{MessageRequest, OperationId};
use scripted_model::drive::Blocking;
use scripted_model::ModelServer;
use timeline_core::key::{RunId, SessionId};
use timeline_core::rows::{ApprovalResult, Decision};
use timeline_core::time::Millis;

const MINUTE: Duration = Duration::from_secs(60);

struct Real<A: Agent = CodexAgent> {
    d: Blocking<A>,
    session: SessionId,
    _model: ModelServer,
    home: std::path::PathBuf,
}

impl Real {
    fn new(thread: impl FnOnce(ThreadConfig) -> ThreadConfig) -> Real {
        Real::with(thread, |codex| codex)
    }
}

impl<A: Agent> Real<A> {
    /// Codex as `wrap` makes it, on the thread `thread` describes.
    fn with(
        thread: impl FnOnce(ThreadConfig) -> ThreadConfig,
        wrap: impl FnOnce(CodexAgent) -> A,
    ) -> Real<A> {
        let model = ModelServer::start().unwrap();
        let home = std::env::temp_dir().join(format!(
            "custody-agent-codex-real-{}-{}",
            std::process::id(),
            model.port()
        ));
        scripted_model::agents::write_codex_home(&home, &model).unwrap();
        std::fs::create_dir_all(home.join("work")).unwrap();
        let bin = scripted_model::agents::codex_bin().unwrap_or_else(|e| panic!("{e}"));
        let spec = ProcessSpec::new(bin)
            .args(["app-server"])
            .env("CODEX_HOME", home.as_os_str())
            .env("SCRIPTED_MODEL_KEY", "sk-scripted")
            .env_remove("OPENAI_API_KEY")
            .cwd(&home);
        let session = SessionId::new("s-1").unwrap();
        let mut agent = CodexAgent::new(spec, "custody-tests", "0.1.0");
        let work = home.join("work").display().to_string();
        agent.add_session(
            &session,
            thread(ThreadConfig::new(work).sandbox("danger-full-access")),
        );
        Real {
            d: Blocking::new(wrap(agent)),
            session,
            _model: model,
            home,
        }
    }

    fn call(&mut self, call: AgentCall) {
        self.d.call(call);
    }

    /// Runs until `done` holds for what came, at most a minute.
    fn until(&mut self, what: &str, done: impl FnMut(&[AgentInput]) -> bool) {
        self.d.until(what, MINUTE, done);
    }

    /// Lets `d` pass without reading what Codex prints.
    fn pause(&mut self, d: Duration) {
        std::thread::sleep(d);
    }
}

impl<A: Agent> Drop for Real<A> {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.home);
    }
}

fn run() -> RunId {
    RunId::new("run-1").unwrap()
}

fn start(session: &SessionId, op: &str, text: &str) -> AgentCall {
    AgentCall::Send(SendRequest {
        attempt: AttemptId(1),
        session: session.clone(),
        operation_id: OperationId::new(op).unwrap(),
        request: MessageRequest::text(text, "phone", Millis(0)),
        kind: SendKind::Start { run: run() },
        rollback_before_send: false,
        fresh_thread: false,
    })
}

fn has(inputs: &[AgentInput], f: impl Fn(&AgentInput) -> bool) -> bool {
    inputs.iter().any(f)
}

#[test]
fn real_codex_reads_its_history_through_thread_items_list() {
    // AG-01, AG-02
    // OB-08: the uncertain-delivery read is `thread/items/list`, newest first.
    let mut r = Real::new(|t| t);
    let s = r.session.clone();
    r.call(start(&s, "op-real-1", "Say hello"));
    r.until("the acceptance and the end of the run", |i| {
        has(i, |i| {
            matches!(
                i,
                AgentInput::SendResult {
                    result: SendResult::Accepted(_),
                    ..
                }
            )
        }) && has(i, |i| matches!(i, AgentInput::DeliveryProof { .. }))
            && has(i, |i| matches!(i, AgentInput::RunEnded { .. }))
    });
    for (attempt, op, want) in [
        (2, "op-real-1", HistoryRead::Found),
        (3, "op-never-sent", HistoryRead::Missing),
    ] {
        r.d.inputs.clear();
        r.call(AgentCall::ReadHistory(ReadHistoryRequest {
            attempt: AttemptId(attempt),
            session: s.clone(),
            operation_id: OperationId::new(op).unwrap(),
            proof: ProofKind::ClientIdEcho,
        }));
        r.until("the history read", |i| {
            has(i, |i| matches!(i, AgentInput::HistoryRead { .. }))
        });
        assert!(
            has(&r.d.inputs, |i| matches!(i,
                AgentInput::HistoryRead { attempt: a, read } if *a == AttemptId(attempt) && *read == want)),
            "{op}: {:?}",
            r.d.inputs
        );
        assert_eq!(r.d.written.last().unwrap()["method"], "thread/items/list");
    }
}

#[test]
fn a_stop_that_reaches_real_codex_after_its_turn_ended_is_stopped() {
    // AG-01, AG-02
    // The real 0.169 answers `turn/interrupt` for a finished turn with -32600 "no active
    // turn to interrupt"; the stop is written before its `turn/completed` is read.
    let mut r = Real::new(|t| t);
    let s = r.session.clone();
    r.call(start(&s, "op-race", "Quick one"));
    r.until("the acceptance", |i| {
        has(i, |i| {
            matches!(
                i,
                AgentInput::SendResult {
                    result: SendResult::Accepted(_),
                    ..
                }
            )
        })
    });
    // The turn ends at Codex while nothing is read here.
    r.pause(Duration::from_secs(2));
    r.call(AgentCall::Stop(StopRequest {
        attempt: AttemptId(9),
        session: s,
        run: run(),
    }));
    r.until("the stop's answer", |i| {
        has(i, |i| matches!(i, AgentInput::StopResult { .. }))
    });
    assert!(
        has(&r.d.inputs, |i| matches!(
            i,
            AgentInput::StopResult {
                result: StopResult::Stopped { .. },
                ..
            }
        )),
        "{:?}",
        r.d.inputs
    );
    r.until("the run's end", |i| {
        has(i, |i| matches!(i, AgentInput::RunEnded { .. }))
    });
}

#[test]
fn an_approval_real_codex_settled_after_an_interrupt_takes_no_answer() {
    // AG-01, AG-02
    // RW-06: after an interrupt, Codex sends `serverRequest/resolved` for the pending
    // approval; a decision after it is refused and never written as taken.
    let mut r = Real::new(|t| t.approval_policy("untrusted"));
    let s = r.session.clone();
    r.call(start(&s, "op-tool", "Make the file [[tool]]"));
    r.until("the approval", |i| {
        has(i, |i| matches!(i, AgentInput::ApprovalAsked { .. }))
    });
    let request =
        r.d.inputs
            .iter()
            .find_map(|i| match i {
                AgentInput::ApprovalAsked { request, .. } => Some(request.clone()),
                _ => None,
            })
            .unwrap();
    r.call(AgentCall::Stop(StopRequest {
        attempt: AttemptId(9),
        session: s.clone(),
        run: run(),
    }));
    r.until("the approval settled by Codex", |i| {
        has(i, |i| {
            matches!(
                i,
                AgentInput::ApprovalResolved {
                    result: Ok(ApprovalResult::ResolvedExternally),
                    ..
                }
            )
        })
    });
    let writes = r.d.written.len();
    r.d.inputs.clear();
    r.call(AgentCall::ResolveApproval {
        session: s,
        request,
        decision: Decision::Accept,
    });
    assert_eq!(r.d.written.len(), writes, "no answer was written");
    assert!(
        has(&r.d.inputs, |i| matches!(
            i,
            AgentInput::ApprovalResolved { result: Err(_), .. }
        )),
        "{:?}",
        r.d.inputs
    );
    assert!(!r.home.join("work/scripted-model-ran.txt").exists());
}

#[test]
fn a_steer_real_codex_gets_after_its_turn_ended_is_proven_unadmitted() {
    // OB-09, AG-02: the steer is written while the turn's end is still unread; Codex
    // 0.169 answers -32600 "no active turn to steer", which the send table proves
    // unadmitted (nothing of it entered a turn).
    let mut r = Real::new(|t| t);
    let s = r.session.clone();
    r.call(start(&s, "op-first", "Quick one"));
    r.until("the acceptance", |i| {
        has(i, |i| {
            matches!(
                i,
                AgentInput::SendResult {
                    result: SendResult::Accepted(_),
                    ..
                }
            )
        })
    });
    r.pause(Duration::from_secs(2));
    r.d.inputs.clear();
    r.call(AgentCall::Send(SendRequest {
        attempt: AttemptId(2),
        session: s,
        operation_id: OperationId::new("op-late-steer").unwrap(),
        request: MessageRequest::text("Too late", "phone", Millis(0)),
        kind: SendKind::Steer { run: run() },
        rollback_before_send: false,
        fresh_thread: false,
    }));
    assert_eq!(r.d.written.last().unwrap()["method"], "turn/steer");
    r.until("the steer's answer", |i| {
        has(i, |i| {
            matches!(
                i,
                AgentInput::SendResult {
                    attempt: AttemptId(2),
                    ..
                }
            )
        })
    });
    assert!(
        has(&r.d.inputs, |i| matches!(
            i,
            AgentInput::SendResult {
                attempt: AttemptId(2),
                result: SendResult::ProvenUnadmitted { .. }
            }
        )),
        "{:?}",
        r.d.inputs
    );
}

/// `CodexAgent` with a tap on its process: a test writes a line of its own to Codex
/// (what another client of the same app-server could ask), and sees whether Codex said
/// it unloaded the thread (`thread/status/changed` with `notLoaded`, then
/// `thread/closed`). Lines and writes of the tap's own never reach the agent.
struct Tap {
    codex: CodexAgent,
    inject: VecDeque<AgentEffect>,
    closed: Rc<Cell<bool>>,
}

/// The first write ID of the tap's own lines (the agent counts up from 1).
const TAP_WRITES: u64 = u64::MAX - 1_000;

impl Tap {
    fn new(codex: CodexAgent) -> Tap {
        Tap {
            codex,
            inject: VecDeque::new(),
            closed: Rc::new(Cell::new(false)),
        }
    }

    /// Writes `line` to Codex at the next effect.
    fn write(&mut self, line: &serde_json::Value) {
        let process = self.codex.process().expect("Codex runs");
        let n = u64::try_from(self.inject.len()).unwrap();
        self.inject.push_back(AgentEffect::Write {
            process,
            write: WriteId(TAP_WRITES + n),
            line: serde_json::to_vec(line).unwrap(),
        });
    }
}

impl Agent for Tap {
    fn capabilities(&self) -> Capabilities {
        self.codex.capabilities()
    }
    fn serves(&self, session: &SessionId) -> bool {
        self.codex.serves(session)
    }
    fn handle_call(&mut self, call: AgentCall, now: Millis) {
        self.codex.handle_call(call, now);
    }
    fn handle_line(&mut self, process: ProcessId, line: &[u8], now: Millis) {
        let v: serde_json::Value = serde_json::from_slice(line).unwrap_or_default();
        let unloaded =
            v["method"] == "thread/status/changed" && v["params"]["status"]["type"] == "notLoaded";
        if unloaded || v["method"] == "thread/closed" {
            self.closed.set(true);
        }
        if v["id"].as_str().is_some_and(|id| id.starts_with("tap-")) {
            return;
        }
        self.codex.handle_line(process, line, now);
    }
    fn handle_line_too_long(&mut self, process: ProcessId, now: Millis) {
        self.codex.handle_line_too_long(process, now);
    }
    fn handle_exit(&mut self, process: ProcessId, reason: String, now: Millis) {
        self.codex.handle_exit(process, reason, now);
    }
    fn handle_written(
        &mut self,
        process: ProcessId,
        write: WriteId,
        result: Result<(), WriteFailure>,
        now: Millis,
    ) {
        if write.0 >= TAP_WRITES {
            result.unwrap();
            return;
        }
        self.codex.handle_written(process, write, result, now);
    }
    fn handle_file(&mut self, read: ReadId, result: Result<Vec<u8>, FileError>, now: Millis) {
        self.codex.handle_file(read, result, now);
    }
    fn poll_effect(&mut self) -> Option<AgentEffect> {
        self.inject.pop_front().or_else(|| self.codex.poll_effect())
    }
    fn poll_timeout(&self) -> Option<Millis> {
        self.codex.poll_timeout()
    }
    fn handle_timeout(&mut self, now: Millis) {
        self.codex.handle_timeout(now);
    }
}

#[test]
fn a_thread_real_codex_closes_ends_its_run_and_is_resumed_for_the_next_send() {
    // AG-01, AG-02
    // Codex 0.169 unloads a thread nobody subscribes to about a minute after it went
    // idle and says so (`thread/status/changed` with `notLoaded`, then `thread/closed`);
    // a `turn/start` on it is then refused ("thread not found"). Here the subscription is dropped mid-turn (`thread/unsubscribe`, as
    // another client could ask), so the turn's end never reaches the agent: the closing
    // ends the run, and the next send resumes the thread before its turn.
    let mut r = Real::with(|t| t, Tap::new);
    let closed = Rc::clone(&r.d.agent.closed);
    let s = r.session.clone();
    r.call(start(&s, "op-real-1", "Count slowly [[slow]]"));
    r.until("the acceptance", |i| {
        has(i, |i| {
            matches!(
                i,
                AgentInput::SendResult {
                    result: SendResult::Accepted(_),
                    ..
                }
            )
        })
    });
    let thread = r.d.agent.codex.thread_of(&s).unwrap().to_owned();
    r.d.agent.write(&serde_json::json!({
        "id": "tap-unsubscribe",
        "method": "thread/unsubscribe",
        "params": {"threadId": thread},
    }));
    r.d.until("the run's end", 3 * MINUTE, |i| {
        has(i, |i| matches!(i, AgentInput::RunEnded { .. }))
    });
    assert!(
        closed.get(),
        "the run ended before Codex unloaded the thread"
    );
    assert!(
        has(&r.d.inputs, |i| matches!(
            i,
            AgentInput::RunEnded {
                outcome: overlay_core::live::RunEventKind::Failed,
                ..
            }
        )),
        "{:?}",
        r.d.inputs
    );
    r.d.inputs.clear();
    let sent = r.d.written.len();
    let run2 = RunId::new("run-2").unwrap();
    r.call(AgentCall::Send(SendRequest {
        attempt: AttemptId(2),
        session: s.clone(),
        operation_id: OperationId::new("op-real-2").unwrap(),
        request: MessageRequest::text("Say hello", "phone", Millis(0)),
        kind: SendKind::Start { run: run2.clone() },
        rollback_before_send: false,
        fresh_thread: false,
    }));
    r.until("the second run's acceptance, proof and end", |i| {
        has(i, |i| {
            matches!(
                i,
                AgentInput::SendResult {
                    attempt: AttemptId(2),
                    result: SendResult::Accepted(_),
                }
            )
        }) && has(i, |i| matches!(i, AgentInput::DeliveryProof { .. }))
            && has(
                i,
                |i| matches!(i, AgentInput::RunEnded { run, .. } if *run == run2),
            )
    });
    let methods: Vec<&serde_json::Value> = r.d.written[sent..]
        .iter()
        .filter(|v| v.get("id").is_some())
        .map(|v| &v["method"])
        .collect();
    assert_eq!(
        methods.first().copied(),
        Some(&serde_json::json!("thread/resume")),
        "{methods:?}"
    );
    let turn = r.d.written[sent..]
        .iter()
        .find(|v| v["method"] == "turn/start")
        .unwrap();
    assert_eq!(turn["params"]["threadId"], thread.as_str());
    assert_eq!(r.d.agent.codex.thread_of(&s), Some(thread.as_str()));
}
