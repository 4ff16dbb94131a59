//! What the server tests share: a host with history and the scripted in-process agent
//! (`scripted_model::echo::EchoAgent`), a server on loopback, and pairing.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use host_core::{Host, HostConfig};
use host_runtime::server::{Devices, Server, ServerConfig};
use host_runtime::Runtime;
use outbox_core::adapter::Capabilities;
use outbox_core::{MemoryOutboxStore, SessionInfo};
use overlay_core::{MemoryOverlayStore, MemorySource, SourceKind};
use timeline_core::{Block, BlockKey, BlockType, BoundaryToken, HostKey, Millis, SessionId};
use tokio::net::TcpStream;

pub fn sid() -> SessionId {
    SessionId::new("s1").unwrap()
}

/// A server on loopback over a host whose session `s1` has `history` saved rows, and
/// the count of sends its agent was handed. The host makes new sessions on request
/// (`made-1`, `made-2`, ...; the agent serves every session), and refuses one whose
/// `cwd` is `/refuse`.
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
    let agent = scripted_model::echo::EchoAgent::new();
    let sends = Arc::clone(&agent.sends);
    let mut made = 0u64;
    let maker = move |request: &host_core::NewSession,
                      host: &mut Host<MemoryOutboxStore, MemoryOverlayStore>,
                      _: &mut host_runtime::Agents<'_>|
          -> Result<SessionId, String> {
        if request.cwd.as_deref() == Some("/refuse") {
            return Err("no sessions under /refuse".to_owned());
        }
        made += 1;
        let session = SessionId::new(format!("made-{made}")).map_err(|e| e.to_string())?;
        let source = MemorySource::new(
            SourceKind::Codex {
                thread_id: format!("thread-made-{made}"),
                generation: 1,
            },
            BoundaryToken::codex_rollout(&format!("/sessions/rollout-made-{made}.jsonl")),
        );
        let mut info = SessionInfo::new(Capabilities::codex());
        info.cwd = request.cwd.clone();
        host.add_session(&session, info, Box::new(source));
        Ok(session)
    };
    let mut runtime = Runtime::builder(host)
        .agent(agent)
        .sessions(maker)
        .start()
        .unwrap();
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
