//! The runtime drives a real host: requests answered, agent calls routed, deadlines
//! kept, processes started, their lines bounded, their groups killed.

#![allow(clippy::unwrap_used)] // a test: a failed lock or ID is a failed test

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use host_core::{
    Agent, AgentCall, AgentEffect, AgentInput, ClientRequest, FileError, Host, HostConfig,
    ProcessId, ProcessSpec, ReadId, Reply, WriteFailure, WriteId,
};
use host_runtime::{Output, Runtime};
use outbox_core::adapter::{Capabilities, SendKind, SendResult};
use outbox_core::entry::Acceptance;
use outbox_core::ids::{ThreadId, TurnId};
use outbox_core::{
    Controls, MemoryOutboxStore, MessageRequest, OperationId, QueueId, SessionInfo, SubmitRequest,
};
use overlay_core::live::RunEventKind;
use overlay_core::{MemoryOverlayStore, MemorySource, SourceKind};
use timeline_core::{BoundaryToken, HostKey, Millis, SessionId};

/// What the test agent saw.
#[derive(Debug, Default)]
struct Seen {
    calls: Vec<String>,
    lines: Vec<Vec<u8>>,
    too_long: usize,
    exits: Vec<String>,
    timeouts: Vec<Millis>,
    written: Vec<Result<(), WriteFailure>>,
}

/// An in-process agent: accepts each send as a new run, proves it, ends the run one
/// deadline later (through `poll_timeout`, so the runtime's timers drive it). With a
/// process spec it starts that process at its first call and writes each message's
/// text to it.
struct Scripted {
    session: SessionId,
    /// Sessions made while the runtime runs, served too.
    also: Vec<SessionId>,
    seen: Arc<Mutex<Seen>>,
    out: VecDeque<AgentEffect>,
    end_at: Option<(Millis, outbox_core::ids::RunId, SessionId)>,
    spec: Option<ProcessSpec>,
    started: bool,
    next_write: u64,
}

impl Scripted {
    fn new(session: &SessionId, spec: Option<ProcessSpec>) -> (Scripted, Arc<Mutex<Seen>>) {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let agent = Scripted {
            session: session.clone(),
            also: Vec::new(),
            seen: Arc::clone(&seen),
            out: VecDeque::new(),
            end_at: None,
            spec,
            started: false,
            next_write: 1,
        };
        (agent, seen)
    }
}

impl Agent for Scripted {
    fn capabilities(&self) -> Capabilities {
        Capabilities::codex()
    }
    fn serves(&self, session: &SessionId) -> bool {
        *session == self.session || self.also.contains(session)
    }
    fn handle_call(&mut self, call: AgentCall, now: Millis) {
        self.seen.lock().unwrap().calls.push(format!("{call:?}"));
        if let (Some(spec), false) = (&self.spec, self.started) {
            self.started = true;
            self.out.push_back(AgentEffect::Spawn {
                process: ProcessId(1),
                spec: spec.clone(),
            });
        }
        if let AgentCall::Send(request) = call {
            if self.spec.is_some() {
                self.out.push_back(AgentEffect::Write {
                    process: ProcessId(1),
                    write: WriteId(self.next_write),
                    line: request.request.user_text.clone().into_bytes(),
                });
                self.next_write += 1;
            }
            let SendKind::Start { run } = request.kind.clone() else {
                return;
            };
            let acceptance = Acceptance {
                run_id: run.clone(),
                thread_id: ThreadId::new("thread-1").unwrap(),
                turn_id: TurnId::new("turn-1").unwrap(),
                accepted_at: now,
            };
            self.out
                .push_back(AgentEffect::Input(AgentInput::SendResult {
                    attempt: request.attempt,
                    result: SendResult::Accepted(acceptance),
                }));
            self.out
                .push_back(AgentEffect::Input(AgentInput::DeliveryProof {
                    session: request.session.clone(),
                    operation_id: request.operation_id,
                }));
            self.end_at = Some((now.saturating_add(Millis(50)), run, request.session));
        }
    }
    fn handle_line(&mut self, _: ProcessId, line: &[u8], _: Millis) {
        self.seen.lock().unwrap().lines.push(line.to_vec());
    }
    fn handle_line_too_long(&mut self, _: ProcessId, _: Millis) {
        self.seen.lock().unwrap().too_long += 1;
    }
    fn handle_exit(&mut self, _: ProcessId, reason: String, _: Millis) {
        self.seen.lock().unwrap().exits.push(reason);
    }
    fn handle_written(&mut self, _: ProcessId, _: WriteId, r: Result<(), WriteFailure>, _: Millis) {
        self.seen.lock().unwrap().written.push(r);
    }
    fn handle_file(&mut self, _: ReadId, _: Result<Vec<u8>, FileError>, _: Millis) {}
    fn poll_effect(&mut self) -> Option<AgentEffect> {
        self.out.pop_front()
    }
    fn poll_timeout(&self) -> Option<Millis> {
        self.end_at.as_ref().map(|(at, _, _)| *at)
    }
    fn handle_timeout(&mut self, now: Millis) {
        if let Some((at, run, session)) = self.end_at.take() {
            assert!(now >= at, "woken at {now:?} before the deadline {at:?}");
            self.seen.lock().unwrap().timeouts.push(now);
            self.out.push_back(AgentEffect::Input(AgentInput::RunEnded {
                session,
                run,
                outcome: RunEventKind::Completed,
                untaken: Vec::new(),
            }));
        }
    }
}

fn host(session: &SessionId) -> Host<MemoryOutboxStore, MemoryOverlayStore> {
    let mut n = 0u64;
    let uuids = Box::new(move || {
        n += 1;
        format!("00000000-0000-4000-8000-{n:012x}")
    });
    let mut host = Host::new(
        MemoryOutboxStore::new(),
        MemoryOverlayStore::new(),
        HostConfig::new(HostKey::from_bytes([7; 32]), uuids),
    );
    let source = MemorySource::new(
        SourceKind::Codex {
            thread_id: "thread-1".into(),
            generation: 1,
        },
        BoundaryToken::codex_rollout("/sessions/rollout-1.jsonl"),
    );
    host.add_session(
        session,
        SessionInfo::new(Capabilities::codex()),
        Box::new(source),
    );
    host
}

fn submit(session: &SessionId, op: &str, text: &str) -> ClientRequest {
    ClientRequest::Submit(SubmitRequest {
        session: session.clone(),
        queue_id: QueueId::new(format!("q-{op}")).unwrap(),
        operation_id: OperationId::new(op).unwrap(),
        request: MessageRequest::text(text, "phone", Millis(0)),
        controls: Controls::automatic(),
    })
}

async fn outbox_len(client: &host_runtime::Client, session: &SessionId) -> usize {
    let reply = client
        .request(ClientRequest::ReconcileSessions {
            sessions: vec![session.clone()],
        })
        .await
        .unwrap();
    let Reply::Reconciled(Ok(snapshots)) = reply else {
        panic!("reconcile answered {reply:?}");
    };
    snapshots[0].outbox.len()
}

async fn eventually<F: FnMut() -> bool>(what: &str, mut done: F) {
    for _ in 0..200 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{what} did not happen within 5 s");
}

#[tokio::test]
async fn a_submit_is_answered_sent_proven_and_its_run_ended_by_the_agents_deadline() {
    // RT-01
    let session = SessionId::new("s-1").unwrap();
    let (agent, seen) = Scripted::new(&session, None);
    let mut runtime = Runtime::builder(host(&session))
        .agent(agent)
        .start()
        .unwrap();
    let client = runtime.client();
    let reply = client
        .request(submit(&session, "op-1", "Run the tests"))
        .await
        .unwrap();
    assert!(matches!(reply, Reply::Submitted(Ok(_))), "{reply:?}");
    // The run ends only when the runtime wakes the agent at its deadline.
    eventually("the agent's deadline", || {
        !seen.lock().unwrap().timeouts.is_empty()
    })
    .await;
    assert_eq!(outbox_len(&client, &session).await, 0, "delivered: let go");
    let calls = seen.lock().unwrap().calls.clone();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert!(calls[0].starts_with("Send("), "{calls:?}");
    // Live output reached the embedder (the run's status rows, at least).
    let first = tokio::time::timeout(Duration::from_secs(5), runtime.next_output())
        .await
        .unwrap();
    assert!(first.is_some());
    runtime.shutdown().await.unwrap();
}

// RT-01, AG-04: a session a client asks for is made on the host's thread by the
// embedder's maker, which tells its agent and adds it to the host; a message to it is
// then sent, proven and let go. Without a maker, or when the maker refuses or names a
// session it did not add, the client is told so and no session exists.
#[tokio::test]
async fn a_new_session_is_made_by_the_embedder_and_served_at_once() {
    use host_core::{NewSession, NewSessionError};
    let session = SessionId::new("s-1").unwrap();
    let (agent, seen) = Scripted::new(&session, None);
    let maker = |request: &NewSession,
                 host: &mut Host<MemoryOutboxStore, MemoryOverlayStore>,
                 agents: &mut host_runtime::Agents<'_>|
     -> Result<SessionId, String> {
        let title = request.title.clone().unwrap_or_default();
        if title == "refuse" {
            return Err("no room for another session".into());
        }
        let made = SessionId::new(format!("made-{title}")).map_err(|e| e.to_string())?;
        if title == "forget" {
            return Ok(made);
        }
        let scripted = agents.get_mut::<Scripted>().ok_or("no scripted agent")?;
        scripted.also.push(made.clone());
        let source = MemorySource::new(
            SourceKind::Codex {
                thread_id: format!("thread-{title}"),
                generation: 1,
            },
            BoundaryToken::codex_rollout("/sessions/rollout-made.jsonl"),
        );
        host.add_session(
            &made,
            SessionInfo::new(Capabilities::codex()),
            Box::new(source),
        );
        Ok(made)
    };
    let runtime = Runtime::builder(host(&session))
        .agent(agent)
        .sessions(maker)
        .start()
        .unwrap();
    let client = runtime.client();
    let reply = client
        .request(ClientRequest::NewSession(NewSession::new().title("one")))
        .await
        .unwrap();
    let Reply::SessionOpened(Ok(made)) = reply else {
        panic!("a new session: {reply:?}");
    };
    assert_eq!(made.as_str(), "made-one");
    let reply = client
        .request(submit(&made, "op-1", "hello, new session"))
        .await
        .unwrap();
    assert!(matches!(reply, Reply::Submitted(Ok(_))), "{reply:?}");
    eventually("the new session's run ends", || {
        !seen.lock().unwrap().timeouts.is_empty()
    })
    .await;
    assert_eq!(outbox_len(&client, &made).await, 0, "delivered: let go");
    assert!(seen.lock().unwrap().calls[0].contains("made-one"));
    for (title, want) in [
        (
            "refuse",
            NewSessionError::Refused("no room for another session".into()),
        ),
        (
            "forget",
            NewSessionError::NotAdded(SessionId::new("made-forget").unwrap()),
        ),
    ] {
        let reply = client
            .request(ClientRequest::NewSession(NewSession::new().title(title)))
            .await
            .unwrap();
        assert_eq!(reply, Reply::SessionOpened(Err(want)));
    }
    let Reply::Sessions(listed) = client.request(ClientRequest::ListSessions).await.unwrap() else {
        panic!("a list");
    };
    let names: Vec<&str> = listed.iter().map(|s| s.session.as_str()).collect();
    assert_eq!(names, ["made-one", "s-1"]);
    runtime.shutdown().await.unwrap();

    // No maker: the host makes no sessions.
    let runtime = Runtime::builder(host(&session)).start().unwrap();
    let reply = runtime
        .client()
        .request(ClientRequest::NewSession(NewSession::new()))
        .await
        .unwrap();
    assert_eq!(
        reply,
        Reply::SessionOpened(Err(NewSessionError::NotOffered))
    );
    runtime.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_call_no_agent_serves_is_answered_as_not_admitted() {
    // RT-01
    let session = SessionId::new("s-1").unwrap();
    let runtime = Runtime::builder(host(&session)).start().unwrap();
    let client = runtime.client();
    let reply = client
        .request(submit(&session, "op-1", "hello"))
        .await
        .unwrap();
    assert!(matches!(reply, Reply::Submitted(Ok(_))), "{reply:?}");
    // Proven unadmitted: the message stays, held for the user, never lost.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(outbox_len(&client, &session).await, 1);
    runtime.shutdown().await.unwrap();
}

#[tokio::test]
async fn process_lines_are_bounded_and_a_longer_line_is_dropped_as_it_streams() {
    // RT-01
    let session = SessionId::new("s-1").unwrap();
    // Reads one line, then prints a line at the bound, one past it, and a short one.
    let script = "read x; printf 'abcd\\nabcde\\nok\\n'; sleep 0.2";
    let spec = ProcessSpec::new("sh").args(["-c", script]);
    let (agent, seen) = Scripted::new(&session, Some(spec));
    let runtime = Runtime::builder(host(&session))
        .agent(agent)
        .max_line_bytes(4)
        .start()
        .unwrap();
    let client = runtime.client();
    client
        .request(submit(&session, "op-1", "go"))
        .await
        .unwrap();
    eventually("the process's end", || {
        !seen.lock().unwrap().exits.is_empty()
    })
    .await;
    let s = std::mem::take(&mut *seen.lock().unwrap());
    assert_eq!(s.lines, vec![b"abcd".to_vec(), b"ok".to_vec()]);
    assert_eq!(s.too_long, 1);
    assert_eq!(s.written, vec![Ok(())]);
    assert!(s.exits[0].contains("ended"), "{:?}", s.exits);
    // The counters saw the same.
    let stats = client.stats().await.unwrap();
    assert_eq!((stats.lines_read, stats.lines_dropped), (2, 1), "{stats:?}");
    assert_eq!(
        (
            stats.processes_started,
            stats.processes_ended,
            stats.processes_running
        ),
        (1, 1, 0)
    );
    assert_eq!(stats.writes_refused, 0);
    runtime.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_program_that_cannot_start_ends_at_once_and_its_writes_fail_whole() {
    // RT-01
    let session = SessionId::new("s-1").unwrap();
    let spec = ProcessSpec::new("/nonexistent/agent-binary");
    let (agent, seen) = Scripted::new(&session, Some(spec));
    let runtime = Runtime::builder(host(&session))
        .agent(agent)
        .start()
        .unwrap();
    let client = runtime.client();
    client
        .request(submit(&session, "op-1", "go"))
        .await
        .unwrap();
    eventually("the failed start", || {
        let s = seen.lock().unwrap();
        !s.exits.is_empty() && !s.written.is_empty()
    })
    .await;
    let s = std::mem::take(&mut *seen.lock().unwrap());
    assert!(s.exits[0].contains("could not be started"), "{:?}", s.exits);
    assert!(
        matches!(s.written[0], Err(WriteFailure::NotWritten(_))),
        "{:?}",
        s.written
    );
    runtime.shutdown().await.unwrap();
}

fn alive(pid: i32) -> bool {
    // Signal 0: is there such a process (zombies aside, which `ps` shows as Z)?
    std::process::Command::new("sh")
        .args(["-c", &format!("ps -o stat= -p {pid} | grep -qv Z")])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

#[tokio::test]
async fn shutdown_kills_the_agents_whole_process_group() {
    // RT-01
    let session = SessionId::new("s-1").unwrap();
    let dir = std::env::temp_dir().join(format!("host-runtime-group-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pidfile = dir.join("child.pid");
    // The agent starts a child of its own and prints nothing; both must die.
    let script = format!("sleep 300 & echo $! > {}; wait", pidfile.display());
    let spec = ProcessSpec::new("sh").args(["-c", &script]);
    let (agent, _seen) = Scripted::new(&session, Some(spec));
    let runtime = Runtime::builder(host(&session))
        .agent(agent)
        .start()
        .unwrap();
    let client = runtime.client();
    client
        .request(submit(&session, "op-1", "go"))
        .await
        .unwrap();
    eventually("the child's pid", || {
        std::fs::read_to_string(&pidfile).is_ok_and(|s| s.trim().parse::<i32>().is_ok())
    })
    .await;
    let child: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(alive(child));
    runtime.shutdown().await.unwrap();
    eventually("the grandchild's death", || !alive(child)).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn outputs_wait_for_the_embedder_and_requests_still_answer_after_it_reads() {
    // RT-01
    // Many outputs, none read for a while: the host waits (bounded), then catches up.
    let session = SessionId::new("s-1").unwrap();
    let (agent, _seen) = Scripted::new(&session, None);
    let mut runtime = Runtime::builder(host(&session))
        .agent(agent)
        .start()
        .unwrap();
    let client = runtime.client();
    for i in 0..20 {
        let reply = client
            .request(submit(&session, &format!("op-{i}"), "hi"))
            .await
            .unwrap();
        assert!(matches!(reply, Reply::Submitted(Ok(_))), "{reply:?}");
    }
    let mut n = 0;
    while let Ok(Some(o)) =
        tokio::time::timeout(Duration::from_millis(300), runtime.next_output()).await
    {
        assert!(matches!(o, Output::Deliver(_) | Output::Notice(_)));
        n += 1;
    }
    assert!(n > 0);
    runtime.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_agent_that_exits_while_its_child_holds_the_pipe_is_seen_ending_and_the_child_dies() {
    // RT-01: the end is the leader's exit, not the pipe's close.
    let session = SessionId::new("s-1").unwrap();
    let dir = std::env::temp_dir().join(format!("host-runtime-pipe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pidfile = dir.join("child.pid");
    let script = format!(
        "read x; sleep 300 & echo $! > {}; echo started; exit 0",
        pidfile.display()
    );
    let spec = ProcessSpec::new("sh").args(["-c", &script]);
    let (agent, seen) = Scripted::new(&session, Some(spec));
    let runtime = Runtime::builder(host(&session))
        .agent(agent)
        .start()
        .unwrap();
    let client = runtime.client();
    client
        .request(submit(&session, "op-1", "go"))
        .await
        .unwrap();
    eventually("the end, though the pipe stays open", || {
        !seen.lock().unwrap().exits.is_empty()
    })
    .await;
    assert_eq!(seen.lock().unwrap().lines, vec![b"started".to_vec()]);
    let child: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    eventually("the child's death", || !alive(child)).await;
    runtime.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_runtime_dropped_while_nobody_reads_its_outputs_stops_at_once() {
    // RT-01: dropping the runtime never hangs, whatever waits in its channels.
    let session = SessionId::new("s-1").unwrap();
    let (agent, _seen) = Scripted::new(&session, None);
    let runtime = Runtime::builder(host(&session))
        .agent(agent)
        .start()
        .unwrap();
    let client = runtime.client();
    for i in 0..50 {
        client
            .request(submit(&session, &format!("op-{i}"), "hi"))
            .await
            .unwrap();
    }
    let dropped = tokio::task::spawn_blocking(move || drop(runtime));
    tokio::time::timeout(Duration::from_secs(10), dropped)
        .await
        .expect("the drop returned")
        .unwrap();
    assert!(client
        .request(submit(&session, "op-late", "hi"))
        .await
        .is_err());
}
