//! What the server tests share: an in-process agent, a host with history, a server on
//! loopback, and pairing.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use host_core::{
    Agent, AgentCall, AgentEffect, AgentInput, FileError, Host, HostConfig, ProcessId, ReadId,
    WriteFailure, WriteId,
};
use host_runtime::server::{Devices, Server, ServerConfig};
use host_runtime::Runtime;
use outbox_core::adapter::{Capabilities, SendKind, SendResult};
use outbox_core::entry::Acceptance;
use outbox_core::ids::{RunId, ThreadId, TurnId};
use outbox_core::{MemoryOutboxStore, SessionInfo};
use overlay_core::live::RunEventKind;
use overlay_core::store::{RowClass, StoredBlock};
use overlay_core::{MemoryOverlayStore, MemorySource, SourceKind};
use timeline_core::rows::{ApprovalKind, ApprovalResult, Decision};
use timeline_core::{
    ApprovalRequest, Block, BlockKey, BlockType, BoundaryToken, HostKey, Millis, SessionId,
};
use timeline_core::{OperationId, TargetId};
use tokio::net::TcpStream;

pub fn sid() -> SessionId {
    SessionId::new("s1").unwrap()
}

/// An in-process agent. Each send is a new run, accepted and proven; the user's row is
/// published, then by the text:
/// - `flood:N`: N reply rows of 32 KB, one write every 5 ms;
/// - `stream:N`: one reply row of 64 KB written N times, 10 ms apart, its text starting
///   with the write's number (`0000`, `0001`, ...);
/// - `slow`: one reply row whose text grows by a word every 40 ms, 40 times;
/// - `approve`: an approval card (accept or decline); the decision's result is the reply;
/// - `hold`: nothing more, and the run never ends (nor is a stop answered);
/// - anything else: the reply `echo: <text>`.
///
/// The run ends 50 ms after the last row.
pub struct Scripted {
    out: VecDeque<AgentEffect>,
    end_at: Option<(Millis, RunId)>,
    /// Rows still to publish, each this long after the one before, and when the next
    /// is due; the run ends 50 ms after the last.
    later: VecDeque<(Millis, StoredBlock)>,
    next_at: Option<Millis>,
    after_later: Option<RunId>,
    /// An approval waiting for its decision: its run.
    asked: Option<(ApprovalRequest, RunId)>,
    /// Sends handed to it.
    pub sends: Arc<AtomicUsize>,
}

impl Scripted {
    pub fn new() -> Scripted {
        Scripted {
            out: VecDeque::new(),
            end_at: None,
            later: VecDeque::new(),
            next_at: None,
            after_later: None,
            asked: None,
            sends: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn publish(&mut self, rows: Vec<StoredBlock>) {
        self.out.push_back(AgentEffect::Input(AgentInput::Rows {
            session: sid(),
            target: TargetId::main(&sid()),
            rows,
        }));
    }
}

impl Agent for Scripted {
    fn capabilities(&self) -> Capabilities {
        Capabilities::codex()
    }
    fn serves(&self, session: &SessionId) -> bool {
        *session == sid()
    }
    fn handle_call(&mut self, call: AgentCall, now: Millis) {
        match call {
            AgentCall::Send(request) => {
                self.sends.fetch_add(1, Ordering::SeqCst);
                let SendKind::Start { run } = request.kind.clone() else {
                    return;
                };
                let op = request.operation_id.clone();
                self.out
                    .push_back(AgentEffect::Input(AgentInput::SendResult {
                        attempt: request.attempt,
                        result: SendResult::Accepted(Acceptance {
                            run_id: run.clone(),
                            thread_id: ThreadId::new("thread-1").unwrap(),
                            turn_id: TurnId::new(format!("turn-{op}")).unwrap(),
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
                self.publish(vec![user]);
                self.out
                    .push_back(AgentEffect::Input(AgentInput::DeliveryProof {
                        session: request.session.clone(),
                        operation_id: op.clone(),
                    }));
                let reply_key = format!("reply-{op}");
                let mut last = now;
                if let Some(n) = text
                    .strip_prefix("flood:")
                    .and_then(|n| n.parse::<u64>().ok())
                {
                    for i in 0..n {
                        let at = now.saturating_add(Millis(5 * (i + 1)));
                        let big = "x".repeat(32 * 1024);
                        let r = row(
                            BlockType::AgentReply,
                            &format!("flood-{i}"),
                            &big,
                            &run,
                            None,
                            at,
                        );
                        self.later.push_back((at, r));
                        last = at;
                    }
                } else if let Some(n) = text
                    .strip_prefix("stream:")
                    .and_then(|n| n.parse::<u64>().ok())
                {
                    let body = "x".repeat(64 * 1024);
                    for i in 0..n {
                        let r = row(
                            BlockType::AgentReply,
                            &reply_key,
                            &format!("{i:04}{body}"),
                            &run,
                            None,
                            now,
                        );
                        self.later.push_back((Millis(10), r));
                    }
                } else if text.starts_with("slow") {
                    let mut words = String::new();
                    for i in 0..40u64 {
                        words.push_str(&format!("word{i} "));
                        let at = now.saturating_add(Millis(40 * (i + 1)));
                        let r = row(
                            BlockType::AgentReply,
                            &reply_key,
                            words.trim_end(),
                            &run,
                            None,
                            now,
                        );
                        self.later.push_back((at, r));
                        last = at;
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
                            session: sid(),
                            target: TargetId::main(&sid()),
                            run: Some(run.clone()),
                            request: request.clone(),
                            summary: "npm test".into(),
                        }));
                    self.asked = Some((request, run));
                    return;
                } else if text.starts_with("hold") {
                    return;
                } else {
                    let r = row(
                        BlockType::AgentReply,
                        &reply_key,
                        &format!("echo: {text}"),
                        &run,
                        None,
                        now,
                    );
                    self.publish(vec![r]);
                }
                self.end_at = Some((last.saturating_add(Millis(50)), run));
            }
            AgentCall::ResolveApproval {
                request, decision, ..
            } => {
                let Some((asked, run)) = self.asked.take() else {
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
                self.publish(vec![r]);
                self.end_at = Some((now.saturating_add(Millis(50)), run));
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
        let end = self.end_at.as_ref().map(|(at, _)| *at);
        end.into_iter()
            .chain(self.later.front().map(|(at, _)| *at))
            .min()
    }
    fn handle_timeout(&mut self, now: Millis) {
        while self.later.front().is_some_and(|(at, _)| *at <= now) {
            if let Some((_, r)) = self.later.pop_front() {
                self.publish(vec![r]);
            }
        }
        if self.end_at.as_ref().is_some_and(|(at, _)| *at <= now) {
            if let Some((_, run)) = self.end_at.take() {
                self.out.push_back(AgentEffect::Input(AgentInput::RunEnded {
                    session: sid(),
                    run,
                    outcome: RunEventKind::Completed,
                    untaken: Vec::new(),
                }));
            }
        }
    }
}

pub fn row(
    t: BlockType,
    id: &str,
    text: &str,
    run: &RunId,
    op: Option<OperationId>,
    at: Millis,
) -> StoredBlock {
    let mut block = Block::new(BlockKey::parse(t, id).unwrap(), at)
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

/// A server on loopback over a host whose session `s1` has `history` saved rows, and
/// the count of sends its agent was handed.
pub async fn serve(config: ServerConfig, history: usize) -> (Runtime, Server, Arc<AtomicUsize>) {
    let mut n = 0u64;
    let uuids = Box::new(move || {
        n += 1;
        format!("00000000-0000-4000-8000-{n:012x}")
    });
    let mut host = Host::new(
        MemoryOutboxStore::new(),
        MemoryOverlayStore::new(),
        HostConfig::new(HostKey::from_bytes([9; 32]), uuids),
    );
    let mut source = MemorySource::new(
        SourceKind::Codex {
            thread_id: "thread-1".into(),
            generation: 1,
        },
        BoundaryToken::codex_rollout("/sessions/rollout-1.jsonl"),
    );
    for i in 0..history {
        let key = BlockKey::parse(BlockType::AgentReply, &format!("saved-{i:03}")).unwrap();
        source.push(vec![Block::new(key, Millis(1 + i as u64)).with_data(
            serde_json::json!({ "text": format!("saved reply {i}") }),
        )]);
    }
    host.add_session(
        &sid(),
        SessionInfo::new(Capabilities::codex()),
        Box::new(source),
    );
    let agent = Scripted::new();
    let sends = Arc::clone(&agent.sends);
    let mut runtime = Runtime::builder(host).agent(agent).start().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = Server::start(&mut runtime, listener, config, Devices::default(), None)
        .await
        .unwrap();
    (runtime, server, sends)
}

/// A minimal HTTP/1.1 POST on loopback: the status and the JSON body.
pub async fn post(
    addr: SocketAddr,
    path: &str,
    body: &serde_json::Value,
) -> (u16, serde_json::Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = body.to_string();
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    stream.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8(out).unwrap();
    let status: u16 = text.split(' ').nth(1).unwrap().parse().unwrap();
    let json = text
        .split("\r\n\r\n")
        .nth(1)
        .and_then(|b| serde_json::from_str(b).ok())
        .unwrap_or(serde_json::Value::Null);
    (status, json)
}

/// Pairs a device through `POST /pair`: its token.
pub async fn pair(server: &Server, name: &str) -> String {
    let code = server.pairing_code().unwrap();
    let (status, body) = post(
        server.local_addr(),
        "/pair",
        &serde_json::json!({ "code": code, "deviceName": name }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body["token"].as_str().unwrap().to_owned()
}
