//! Host processes on a private PostgreSQL cluster, and a client that follows a session
//! to the host that serves it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

#[path = "../../../storage-postgres/tests/support/mod.rs"]
pub mod support;

/// The token of the one device every host knows.
pub const TOKEN: &str = "several-hosts-test-token";

/// Runs `f` on a thread of its own: the database driver is blocking, and may not run
/// on the test's async threads.
pub fn blocking<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| s.spawn(f).join().unwrap())
}

/// A database schema, a shared log and the settings the hosts run with.
pub struct World {
    pub server: support::Server,
    pub schema: String,
    pub dir: tempfile::TempDir,
    pub lease_ms: u64,
    pub turn_ms: u64,
    pub sessions: usize,
}

impl World {
    /// A private cluster listening on loopback TCP too (for the proxy), one schema.
    pub fn new(lease_ms: u64, turn_ms: u64, sessions: usize) -> World {
        blocking(|| World::start(lease_ms, turn_ms, sessions))
    }

    fn start(lease_ms: u64, turn_ms: u64, sessions: usize) -> World {
        let server = support::private_cluster(&support::Cluster {
            tcp: true,
            ..support::Cluster::default()
        })
        .unwrap_or_else(|why| panic!("{why}"));
        let schema = "hosts".to_owned();
        let mut admin = postgres::Client::connect(&server.url, postgres::NoTls).unwrap();
        admin
            .batch_execute(&format!("CREATE SCHEMA {schema}"))
            .unwrap();
        let world = World {
            server,
            schema,
            dir: tempfile::tempdir().unwrap(),
            lease_ms,
            turn_ms,
            sessions,
        };
        // Migrated once before the hosts start.
        let options = storage_postgres::ConnectOptions::parse(&world.server.url)
            .unwrap()
            .options(&format!("-c search_path={}", world.schema));
        storage_postgres::PostgresStore::open(options, storage_postgres::Settings::default())
            .unwrap();
        world
    }

    /// The connection parameters over TCP to `port` (the server's, or a proxy's).
    pub fn tcp(&self, port: u16) -> String {
        format!("host=127.0.0.1 port={port} user=postgres dbname=postgres")
    }

    /// The server's TCP port.
    pub fn port(&self) -> u16 {
        self.server.tcp_port.unwrap()
    }

    pub fn log(&self) -> PathBuf {
        self.dir.path().join("given.log")
    }

    /// The text of column 0 of each row `sql` (with `session` as `$1` when given)
    /// finds, queried on a plain client on the schema.
    pub fn query(&self, sql: &str, session: Option<&str>) -> Vec<Vec<String>> {
        let config = support::config_for(&self.server.url, &self.schema);
        blocking(|| {
            let mut client = config.connect(postgres::NoTls).unwrap();
            let rows = match session {
                Some(s) => client.query(sql, &[&s.as_bytes()]),
                None => client.query(sql, &[]),
            };
            rows.unwrap()
                .iter()
                .map(|r| {
                    (0..r.len())
                        .map(|i| {
                            r.try_get::<_, String>(i).unwrap_or_else(|_| {
                                String::from_utf8(r.get::<_, Vec<u8>>(i)).unwrap()
                            })
                        })
                        .collect()
                })
                .collect()
        })
    }

    /// What every connection of the server is doing, for a failure's message.
    pub fn activity(&self) -> String {
        let url = self.server.url.clone();
        blocking(move || {
            let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            client
                .query(
                    "SELECT application_name, state, wait_event_type, left(query, 120) \
                     FROM pg_stat_activity WHERE backend_type = 'client backend'",
                    &[],
                )
                .unwrap()
                .iter()
                .map(|r| {
                    (0..4)
                        .map(|i| r.get::<_, Option<String>>(i).unwrap_or_default())
                        .collect::<Vec<_>>()
                        .join(" | ")
                })
                .collect::<Vec<_>>()
                .join("\n")
        })
    }

    /// Which live lease each session's scope is under: session → host.
    pub fn holders(&self) -> BTreeMap<String, String> {
        self.query(
            "SELECT base_session_id, host_id FROM chat_session_leases \
             WHERE expires_at > clock_timestamp()",
            None,
        )
        .into_iter()
        .map(|r| (r[0].clone(), r[1].clone()))
        .collect()
    }

    /// Starts host `name`, its database reached through `pg`.
    pub fn host(&self, name: &str, pg: &str) -> HostProc {
        let mut child = Command::new(env!("CARGO_BIN_EXE_cluster-host"))
            .args([
                format!("pg={pg}"),
                format!("schema={}", self.schema),
                format!("host={name}"),
                format!("log={}", self.log().display()),
                format!("token={TOKEN}"),
                format!("sessions={}", self.sessions),
                format!("lease_ms={}", self.lease_ms),
                format!("turn_ms={}", self.turn_ms),
                "seconds=240".to_owned(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("host {name} did not start: {e}"));
        let address = line
            .strip_prefix("ready ")
            .unwrap_or_else(|| panic!("host {name} printed {line:?}"))
            .to_owned();
        if std::env::var_os("CLIENT_TRACE").is_some() {
            eprintln!("host {name} at {address}");
        }
        HostProc {
            name: name.to_owned(),
            stdin: child.stdin.take(),
            child,
            address,
        }
    }
}

/// A running host process.
pub struct HostProc {
    pub name: String,
    pub address: String,
    child: Child,
    stdin: Option<ChildStdin>,
}

impl HostProc {
    /// SIGKILL: no lease given back, nothing flushed.
    pub fn kill(&mut self) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
        self.child.wait().unwrap();
    }

    /// Asks it to stop (its leases given back) and waits.
    pub fn stop(&mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            // A host already gone has closed its end.
            let _ = stdin.write_all(b"stop\n");
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if self.child.try_wait().unwrap().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill();
    }
}

impl Drop for HostProc {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A client's connections, one per host address, and where it believes each session
/// is served.
#[derive(Default)]
pub struct Client {
    conns: HashMap<String, (Ws, u64)>,
    owner: HashMap<String, String>,
    /// Requests answered `SESSION_ELSEWHERE`, and connections that failed.
    pub redirects: usize,
    pub failures: usize,
}

/// What one call came to.
pub enum Answer {
    /// The response's `result`.
    Result(serde_json::Value),
    /// The response's `error`.
    Error(serde_json::Value),
}

impl Client {
    async fn conn(&mut self, address: &str) -> Result<&mut (Ws, u64), String> {
        if !self.conns.contains_key(address) {
            let url = format!("{address}?token={TOKEN}");
            let connected = tokio::time::timeout(
                Duration::from_secs(2),
                tokio_tungstenite::connect_async(url),
            )
            .await
            .map_err(|_| format!("connecting to {address} timed out"))?
            .map_err(|e| format!("connecting to {address}: {e}"))?;
            self.conns.insert(address.to_owned(), (connected.0, 0));
        }
        Ok(self.conns.get_mut(address).unwrap())
    }

    /// One call to the host at `address`, answered within `limit`.
    pub async fn call_at(
        &mut self,
        address: &str,
        method: &str,
        params: &serde_json::Value,
        limit: Duration,
    ) -> Result<Answer, String> {
        let outcome = async {
            let (ws, next) = self.conn(address).await?;
            *next += 1;
            let id = *next;
            let frame = serde_json::json!({
                "jsonrpc": "2.0", "id": id, "method": method, "params": params,
            });
            ws.send(Message::Text(frame.to_string().into()))
                .await
                .map_err(|e| e.to_string())?;
            tokio::time::timeout(limit, async {
                while let Some(msg) = ws.next().await {
                    let Message::Text(text) = msg.map_err(|e| e.to_string())? else {
                        continue;
                    };
                    let value: serde_json::Value =
                        serde_json::from_str(&text).map_err(|e| e.to_string())?;
                    if value["id"] == serde_json::json!(id) {
                        return Ok(if value.get("error").is_some() {
                            Answer::Error(value["error"].clone())
                        } else {
                            Answer::Result(value["result"].clone())
                        });
                    }
                }
                Err("the connection closed".to_owned())
            })
            .await
            .map_err(|_| format!("{method} at {address}: no answer within {limit:?}"))?
        }
        .await;
        if outcome.is_err() {
            self.conns.remove(address);
            self.failures += 1;
        }
        outcome
    }

    /// A call about `session`, made at the host believed to serve it (else at
    /// `hosts[first]`), following `SESSION_ELSEWHERE` and trying the others when a host
    /// does not answer, until `deadline`. `retry` says whether an error answer is
    /// worth another try.
    pub async fn call(
        &mut self,
        hosts: &[String],
        session: &str,
        method: &str,
        params: &serde_json::Value,
        deadline: Instant,
    ) -> Result<serde_json::Value, String> {
        let mut turn = session
            .trim_start_matches('s')
            .parse::<usize>()
            .unwrap_or(0);
        let mut last = String::new();
        while Instant::now() < deadline {
            let address = match self.owner.get(session) {
                Some(a) => a.clone(),
                None => hosts[turn % hosts.len()].clone(),
            };
            let answer = self
                .call_at(&address, method, params, Duration::from_secs(3))
                .await;
            if std::env::var_os("CLIENT_TRACE").is_some() {
                let said = match &answer {
                    Ok(Answer::Result(_)) => "ok".to_owned(),
                    Ok(Answer::Error(e)) => e.to_string(),
                    Err(e) => e.clone(),
                };
                eprintln!("client {session} {method} at {address}: {said}");
            }
            match answer {
                Ok(Answer::Result(result)) => {
                    self.owner.insert(session.to_owned(), address);
                    return Ok(result);
                }
                Ok(Answer::Error(error)) => {
                    last = error.to_string();
                    let code = error["data"]["errorCode"].as_str().unwrap_or_default();
                    let to = error["data"]["servedBy"]["address"].as_str();
                    match (code, to) {
                        // Followed even to a host started after this call began.
                        ("SESSION_ELSEWHERE", Some(to))
                            if self.owner.get(session).map(String::as_str) != Some(to) =>
                        {
                            self.redirects += 1;
                            self.owner.insert(session.to_owned(), to.to_owned());
                            continue;
                        }
                        (
                            "SESSION_ELSEWHERE"
                            | "STORE_UNAVAILABLE"
                            | "OUTBOX_UNAVAILABLE"
                            | "HISTORY_UNAVAILABLE"
                            | "DISPATCH_TIMEOUT",
                            _,
                        ) => {}
                        _ => return Err(last),
                    }
                }
                Err(e) => last = e,
            }
            // Not answered here: forget the owner, try the next host after a moment.
            self.owner.remove(session);
            turn += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!(
            "{method} for {session}: not answered in time; last: {last}"
        ))
    }
}

/// A phone joined to `session` at the host at `address` (its replay read).
pub async fn join(address: &str, session: &str) -> Ws {
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("{address}?token={TOKEN}"))
        .await
        .unwrap();
    let frame = serde_json::json!({
        "jsonrpc": "2.0", "id": 1, "method": "run.chatJoin",
        "params": { "appSessionId": session },
    });
    ws.send(Message::Text(frame.to_string().into()))
        .await
        .unwrap();
    notification(&mut ws, |v| v["id"] == 1, Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("the join at {address}: {e}"));
    ws
}

/// The first frame `ws` reads that `wanted` says yes to, within `limit`.
pub async fn notification(
    ws: &mut Ws,
    wanted: impl Fn(&serde_json::Value) -> bool,
    limit: Duration,
) -> Result<serde_json::Value, String> {
    tokio::time::timeout(limit, async {
        while let Some(msg) = ws.next().await {
            if let Message::Text(text) = msg.map_err(|e| e.to_string())? {
                let value: serde_json::Value =
                    serde_json::from_str(&text).map_err(|e| e.to_string())?;
                if wanted(&value) {
                    return Ok(value);
                }
            }
        }
        Err("the connection closed".to_owned())
    })
    .await
    .map_err(|_| format!("nothing wanted within {limit:?}"))?
}

/// The submit of message `op` to `session`.
pub fn submit(session: &str, op: &str, text: &str) -> serde_json::Value {
    serde_json::json!({
        "appSessionId": session, "queueId": format!("q-{op}"), "operationId": op,
        "userText": text, "source": "phone", "createdAt": 1_000,
        "intent": "automatic", "sendMode": "queue", "idempotencyKey": format!("key-{op}"),
    })
}

/// A TCP proxy on loopback to `port` that can be paused: paused, it forwards nothing
/// either way and holds its connections open, as a network that drops every packet.
pub struct Proxy {
    pub port: u16,
    paused: std::sync::Arc<std::sync::atomic::AtomicBool>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Proxy {
    pub fn start(to: u16) -> Proxy {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let paused = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (Arc::clone(&paused), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((inbound, _)) => {
                        let Ok(outbound) = std::net::TcpStream::connect(("127.0.0.1", to)) else {
                            continue;
                        };
                        for (from, into) in [
                            (inbound.try_clone().unwrap(), outbound.try_clone().unwrap()),
                            (outbound, inbound),
                        ] {
                            let (p, s) = (Arc::clone(&p), Arc::clone(&s));
                            std::thread::spawn(move || pipe(from, into, &p, &s));
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Proxy { port, paused, stop }
    }

    pub fn pause(&self, on: bool) {
        self.paused.store(on, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

fn pipe(
    mut from: std::net::TcpStream,
    mut into: std::net::TcpStream,
    paused: &std::sync::atomic::AtomicBool,
    stop: &std::sync::atomic::AtomicBool,
) {
    use std::io::Read;
    use std::sync::atomic::Ordering;
    from.set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    let mut buf = vec![0u8; 16 * 1024];
    while !stop.load(Ordering::SeqCst) {
        if paused.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if into.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    let _ = into.shutdown(std::net::Shutdown::Both);
}
