//! Relay fan-out to many phones: the WebSocket server of `host_runtime::server` in a
//! process of its own, N phones (WebSocket clients in this process, loopback) joined to
//! one session, and a reply written 50 times, 100 ms apart (the scripted agent's
//! `tick:50`), each write carrying the host's time of the write. Measured: for every
//! phone and every write, the time from the write to the phone's receipt (p50, p99,
//! max), and the server process's resident memory per connection (its RSS with N
//! phones joined, less its RSS before they came, over N).
//!
//! `cargo run --release -p benches --bin fanout -- [PHONES]` (1,000 by default).
//! Loopback only; the server stops when this process ends or after two minutes.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

type Error = Box<dyn std::error::Error + Send + Sync>;

const WRITES: u64 = 50;

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn rss_kib(pid: u32) -> Result<u64, Error> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .ok_or("no VmRSS")?;
    Ok(line.split_whitespace().nth(1).ok_or("no number")?.parse()?)
}

/// The server side: a host with one session, the scripted agent, the server; prints its
/// address and a pairing code, and ends when its input closes or after two minutes.
async fn server() -> Result<(), Error> {
    use host_core::{Host, HostConfig};
    use host_runtime::server::{Devices, Server, ServerConfig};
    let mut n = 0u64;
    let uuids = Box::new(move || {
        n += 1;
        format!("00000000-0000-4000-8000-{n:012x}")
    });
    let mut host = Host::new(
        outbox_core::MemoryOutboxStore::new(),
        overlay_core::MemoryOverlayStore::new(),
        HostConfig::new(timeline_core::HostKey::from_bytes([1; 32]), uuids),
    );
    let session = timeline_core::SessionId::new("s1")?;
    let history = overlay_core::MemorySource::new(
        overlay_core::SourceKind::Codex {
            thread_id: "thread-1".into(),
            generation: 1,
        },
        timeline_core::BoundaryToken::codex_rollout("/sessions/rollout-1.jsonl"),
    );
    host.add_session(
        &session,
        outbox_core::SessionInfo::new(outbox_core::Capabilities::codex()),
        Box::new(history),
    );
    let mut runtime = host_runtime::Runtime::builder(host)
        .agent(scripted_model::echo::EchoAgent::new())
        .start()?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let server = Server::start(
        &mut runtime,
        listener,
        ServerConfig::default(),
        Devices::default(),
        None,
    )
    .await?;
    println!("{} {}", server.local_addr(), server.pairing_code()?);
    std::io::stdout().flush()?;
    let stdin = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        // Any line, or the end of input, ends the server.
        let _ = std::io::stdin().read_line(&mut line);
    });
    tokio::select! {
        _ = stdin => {}
        () = tokio::time::sleep(Duration::from_secs(120)) => {}
    }
    server.shutdown().await?;
    runtime.shutdown().await?;
    Ok(())
}

async fn pair(addr: &str, code: &str) -> Result<String, Error> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = serde_json::json!({ "code": code, "deviceName": "fanout" }).to_string();
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let head = format!(
        "POST /pair HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await?;
    s.write_all(body.as_bytes()).await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    let json: serde_json::Value =
        serde_json::from_str(out.split("\r\n\r\n").nth(1).ok_or("no body")?)?;
    Ok(json["token"].as_str().ok_or("no token")?.to_owned())
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn phones(count: usize) -> Result<(), Error> {
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .arg("--server")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut first = String::new();
    BufReader::new(child.stdout.take().ok_or("no stdout")?).read_line(&mut first)?;
    let mut parts = first.split_whitespace();
    let addr = parts.next().ok_or("no address")?.to_owned();
    let code = parts.next().ok_or("no code")?.to_owned();
    let token = pair(&addr, &code).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = rss_kib(child.id())?;
    // Connect and join, 50 at a time.
    let mut sockets = Vec::with_capacity(count);
    for chunk in 0..count.div_ceil(50) {
        let mut batch = Vec::new();
        for _ in 0..50.min(count - chunk * 50) {
            let url = format!("ws://{addr}/ws?token={token}");
            batch.push(tokio::spawn(async move {
                let (mut ws, _) = tokio_tungstenite::connect_async(url).await?;
                let join = r#"{"jsonrpc":"2.0","id":1,"method":"run.chatJoin","params":{"appSessionId":"s1"}}"#;
                ws.send(Message::Text(join.into())).await?;
                while let Some(msg) = ws.next().await {
                    if let Message::Text(t) = msg? {
                        if t.contains(r#""id":1"#) {
                            break;
                        }
                    }
                }
                Ok::<_, Error>(ws)
            }));
        }
        for b in batch {
            sockets.push(b.await??);
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss_kib(child.id())?;
    // Every phone reads and notes, for each write, when it came.
    let mut readers = Vec::new();
    for (i, ws) in sockets.into_iter().enumerate() {
        let (mut sink, mut stream) = ws.split();
        if i == 0 {
            let submit = serde_json::json!({
                "jsonrpc": "2.0", "id": 2, "method": "run.chatOutboxSubmit",
                "params": {
                    "appSessionId": "s1", "queueId": "q-1", "operationId": "op-1",
                    "userText": format!("tick:{WRITES}"), "source": "bench", "createdAt": 1,
                    "intent": "automatic", "sendMode": "queue", "idempotencyKey": "k-1",
                },
            });
            sink.send(Message::Text(submit.to_string().into())).await?;
        }
        readers.push(tokio::spawn(async move {
            let _sink = sink;
            let mut latencies = Vec::new();
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            while latencies.len() < WRITES as usize {
                let Ok(Some(msg)) = tokio::time::timeout_at(deadline, stream.next()).await else {
                    break;
                };
                let Message::Text(t) = msg? else { continue };
                if !t.contains("sentAtMs") {
                    continue;
                }
                let received = wall_ms();
                let v: serde_json::Value = serde_json::from_str(&t)?;
                let blocks = v["params"]["liveOverlay"]["blocks"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                if let Some(sent) = blocks.iter().find_map(|b| b["data"]["sentAtMs"].as_u64()) {
                    latencies.push(received.saturating_sub(sent));
                }
            }
            Ok::<_, Error>(latencies)
        }));
    }
    let mut all = Vec::new();
    let mut short = 0;
    for r in readers {
        let l = r.await??;
        if l.len() < WRITES as usize {
            short += 1;
        }
        all.extend(l);
    }
    all.sort_unstable();
    if let Some(mut stdin) = child.stdin.take() {
        writeln!(stdin)?;
    }
    child.wait()?;
    println!(
        "phones: {count}, writes: {WRITES} (one every 100 ms), receipts: {}",
        all.len()
    );
    if all.is_empty() {
        return Err("no receipt".into());
    }
    println!(
        "write to receipt: p50 {} ms, p99 {} ms, max {} ms; phones that missed a write: {short}",
        percentile(&all, 0.5),
        percentile(&all, 0.99),
        all[all.len() - 1]
    );
    println!(
        "server RSS: {before} KiB before, {after} KiB with {count} phones joined: {:.1} KiB per connection",
        (after.saturating_sub(before)) as f64 / count as f64
    );
    Ok(())
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    match args.as_slice() {
        [flag] if flag == "--server" => rt.block_on(server()),
        [] => rt.block_on(phones(1_000)),
        [n] => rt.block_on(phones(n.parse()?)),
        _ => Err("usage: fanout [PHONES]".into()),
    }
}
