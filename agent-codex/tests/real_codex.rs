//! `CodexAgent` against the real `codex app-server` of the pinned `@openai/codex`,
//! offline against the scripted model on loopback, driven by a small blocking loop in
//! the test (the runtime's tests drive it through `host-runtime`). Needs the binary:
//! `.ci/run` installs it; without it these tests fail saying what to install.

#![allow(clippy::unwrap_used)] // a test: a failed step is a failed test
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // the driver loop reads the clock

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use agent_codex::{CodexAgent, ThreadConfig};
use host_core::{Agent, AgentCall, AgentEffect, AgentInput, ProcessId, ProcessSpec};
use outbox_core::adapter::{
    AttemptId, HistoryRead, ProofKind, SendKind, SendRequest, SendResult, StopResult,
};
use outbox_core::{MessageRequest, OperationId};
use scripted_model::ModelServer;
use timeline_core::key::{RunId, SessionId};
use timeline_core::rows::{ApprovalResult, Decision};
use timeline_core::time::Millis;

struct Real {
    agent: CodexAgent,
    session: SessionId,
    child: Option<(ProcessId, Child, ChildStdin)>,
    lines: Option<Receiver<Vec<u8>>>,
    began: Instant,
    inputs: Vec<AgentInput>,
    written: Vec<serde_json::Value>,
    _model: ModelServer,
    home: std::path::PathBuf,
}

impl Real {
    fn new(thread: impl FnOnce(ThreadConfig) -> ThreadConfig) -> Real {
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
            agent,
            session,
            child: None,
            lines: None,
            began: Instant::now(),
            inputs: Vec::new(),
            written: Vec::new(),
            _model: model,
            home,
        }
    }

    fn now(&self) -> Millis {
        Millis(u64::try_from(self.began.elapsed().as_millis()).unwrap())
    }

    fn effects(&mut self) {
        while let Some(e) = self.agent.poll_effect() {
            let now = self.now();
            match e {
                AgentEffect::Input(i) => self.inputs.push(i),
                AgentEffect::Spawn { process, spec } => {
                    let mut cmd = Command::new(&spec.program);
                    cmd.args(&spec.args)
                        .stdin(Stdio::piped())
                        .stdout(Stdio::piped())
                        .stderr(Stdio::null());
                    for (k, v) in &spec.env {
                        match v {
                            Some(v) => cmd.env(k, v),
                            None => cmd.env_remove(k),
                        };
                    }
                    if let Some(d) = &spec.cwd {
                        cmd.current_dir(d);
                    }
                    let mut child = cmd.spawn().unwrap();
                    let stdin = child.stdin.take().unwrap();
                    let stdout = child.stdout.take().unwrap();
                    let (tx, rx) = std::sync::mpsc::channel();
                    std::thread::spawn(move || {
                        for line in BufReader::new(stdout).split(b'\n') {
                            let Ok(line) = line else { break };
                            if tx.send(line).is_err() {
                                break;
                            }
                        }
                    });
                    self.child = Some((process, child, stdin));
                    self.lines = Some(rx);
                }
                AgentEffect::Write {
                    process,
                    write,
                    line,
                } => {
                    self.written.push(serde_json::from_slice(&line).unwrap());
                    let (_, _, stdin) = self.child.as_mut().unwrap();
                    let mut bytes = line;
                    bytes.push(b'\n');
                    let r = stdin
                        .write_all(&bytes)
                        .and_then(|()| stdin.flush())
                        .map_err(|e| host_core::WriteFailure::Broken(e.to_string()));
                    self.agent.handle_written(process, write, r, now);
                }
                AgentEffect::Kill { .. } => {
                    if let Some((_, c, _)) = self.child.as_mut() {
                        let _ = c.kill();
                    }
                }
                _ => {}
            }
        }
    }

    fn call(&mut self, call: AgentCall) {
        let now = self.now();
        self.agent.handle_call(call, now);
        self.effects();
    }

    /// Runs until `done` holds for what came, at most 60 s.
    fn until(&mut self, what: &str, mut done: impl FnMut(&[AgentInput]) -> bool) {
        let limit = Instant::now() + Duration::from_secs(60);
        loop {
            self.effects();
            if done(&self.inputs) {
                return;
            }
            assert!(
                Instant::now() < limit,
                "{what} did not come: {:#?}",
                self.inputs
            );
            let got = self
                .lines
                .as_ref()
                .map(|rx| rx.recv_timeout(Duration::from_millis(50)));
            let now = self.now();
            match got {
                Some(Ok(line)) => {
                    let p = self.child.as_ref().unwrap().0;
                    self.agent.handle_line(p, &line, now);
                }
                Some(Err(RecvTimeoutError::Disconnected)) => {
                    let p = self.child.as_ref().unwrap().0;
                    self.lines = None;
                    self.agent.handle_exit(p, "codex ended".into(), now);
                }
                _ => std::thread::sleep(Duration::from_millis(10)),
            }
            if self.agent.poll_timeout().is_some_and(|d| d <= now) {
                self.agent.handle_timeout(now);
            }
        }
    }

    /// Lets `d` pass without reading what Codex prints.
    fn pause(&mut self, d: Duration) {
        std::thread::sleep(d);
    }
}

impl Drop for Real {
    fn drop(&mut self) {
        if let Some((_, mut c, _)) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
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
        r.inputs.clear();
        r.call(AgentCall::ReadHistory {
            attempt: AttemptId(attempt),
            session: s.clone(),
            operation_id: OperationId::new(op).unwrap(),
            proof: ProofKind::ClientIdEcho,
        });
        r.until("the history read", |i| {
            has(i, |i| matches!(i, AgentInput::HistoryRead { .. }))
        });
        assert!(
            has(&r.inputs, |i| matches!(i,
                AgentInput::HistoryRead { attempt: a, read } if *a == AttemptId(attempt) && *read == want)),
            "{op}: {:?}",
            r.inputs
        );
        assert_eq!(r.written.last().unwrap()["method"], "thread/items/list");
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
    r.call(AgentCall::Stop {
        attempt: AttemptId(9),
        session: s,
        run: run(),
    });
    r.until("the stop's answer", |i| {
        has(i, |i| matches!(i, AgentInput::StopResult { .. }))
    });
    assert!(
        has(&r.inputs, |i| matches!(
            i,
            AgentInput::StopResult {
                result: StopResult::Stopped { .. },
                ..
            }
        )),
        "{:?}",
        r.inputs
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
    let request = r
        .inputs
        .iter()
        .find_map(|i| match i {
            AgentInput::ApprovalAsked { request, .. } => Some(request.clone()),
            _ => None,
        })
        .unwrap();
    r.call(AgentCall::Stop {
        attempt: AttemptId(9),
        session: s.clone(),
        run: run(),
    });
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
    let writes = r.written.len();
    r.inputs.clear();
    r.call(AgentCall::ResolveApproval {
        session: s,
        request,
        decision: Decision::Accept,
    });
    assert_eq!(r.written.len(), writes, "no answer was written");
    assert!(
        has(&r.inputs, |i| matches!(
            i,
            AgentInput::ApprovalResolved { result: Err(_), .. }
        )),
        "{:?}",
        r.inputs
    );
    assert!(!r.home.join("work/scripted-model-ran.txt").exists());
}
