//! A WebSocket server that phones and browsers connect to (feature `server`): the wire of
//! `host-wire` on a running host.
//!
//! - `GET /ws` upgrades to a WebSocket carrying JSON-RPC 2.0 text frames, one
//!   connection per device. The device's token comes as `Authorization: Bearer <token>`
//!   or, for a browser (which cannot set that header on a WebSocket), as `?token=`.
//! - `POST /pair` takes `{"code": .., "deviceName": ..}`: a pairing code the host shows
//!   ([`Server::pairing_code`]: 8 characters, single use, five minutes) for a device
//!   token (256 random bits, shown once, kept only as its SHA-256). Tokens are listed
//!   and revoked through [`Server::devices`] and [`Server::revoke`]; [`Devices`] can be
//!   saved and given back at the next start (it holds only hashes).
//! - A bad or revoked token gets `401` with `errorCode` `UNAUTHORIZED`; five failures
//!   from one address within a minute get `429` (`TOO_MANY_ATTEMPTS`) without a check.
//! - Each request runs on a task of its own under its dispatch cap (95 s for
//!   `run.chatLoad` and `run.chatLoadThread`, 45 s for the rest): past it the client
//!   gets `DISPATCH_TIMEOUT`, and the host's work goes on (a stop and send now finishes
//!   when the client stopped waiting). Mutations go through the idempotency table, per
//!   device.
//! - `run.chatJoin` makes the connection receive the session's relay events after its
//!   replay (in 256 KB chunks, as the host cuts them); events that happen while the
//!   replay is on its way are held and sent after it, so none falls between the two (one
//!   may come twice: a snapshot is the whole overlay, so a repeat changes nothing). A
//!   closed connection leaves every session it joined.
//! - Every connection has a bounded send queue ([`ServerConfig::send_queue`] frames,
//!   [`ServerConfig::send_queue_bytes`] bytes). A `blocks` snapshot takes the place of
//!   the one of its target still waiting (a snapshot is the whole overlay, so nothing is
//!   lost, and a burst after a stall of the host does not fill the queue); a phone that
//!   still does not keep up is cut off (close code 1013, "try again later") and comes
//!   back through replay and reload; it never holds up the host or another phone.
//!
//! Outputs other than relay events (desktop windows, progress, notices) go to the sink
//! given to [`Server::start`], or, without one, notices are logged through `tracing`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{ConnectInfo, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use host_core::{ClientRequest, Notice, Reply};
use host_wire::frame::Outcome;
use host_wire::{decode_request, Admission, Call, DispatchClass, Idempotency, RequestId};
use overlay_core::live::Delivery;
use timeline_core::key::SessionId;
use timeline_core::time::Millis;
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tracing::{debug, warn};

pub use crate::auth::{Device, Devices, FAILURE_WINDOW, MAX_FAILURES, PAIRING_CODE_LIFETIME};
use crate::auth::{Gate, Refused};
use crate::{Client, Output, Outputs, Runtime};

/// The read and write buffer of each WebSocket.
const SOCKET_BUFFER: usize = 4 * 1024;

/// How long one frame may take to leave before the connection counts as gone.
const WRITE_DEADLINE: Duration = Duration::from_secs(30);

/// How the server behaves.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ServerConfig {
    /// The dispatch cap of `run.chatLoad` and `run.chatLoadThread` (the seed: 95 s).
    pub load_cap: Duration,
    /// The dispatch cap of every other method (the seed: 45 s).
    pub other_cap: Duration,
    /// Frames waiting for one connection at most; past it the connection is cut.
    pub send_queue: usize,
    /// Bytes waiting for one connection at most; past it the connection is cut.
    pub send_queue_bytes: usize,
    /// The largest frame a client may send, in bytes.
    pub max_frame_bytes: usize,
    /// The conversation page (`/`, `/app.js`) and the timeline it runs
    /// (`/timeline.wasm`: the `timeline-wasm` crate built for `wasm32-unknown-unknown`);
    /// not served when `None`.
    pub page_wasm: Option<Arc<Vec<u8>>>,
    /// With several hosts on one database: every call about a session is routed first,
    /// and one served by another host is answered `SESSION_ELSEWHERE` with where it is
    /// served (see [`crate::cluster`]).
    #[cfg(feature = "cluster")]
    pub cluster: Option<Arc<crate::cluster::Cluster>>,
    /// TLS on the listener when given (feature `tls`): `wss://` and `https://` only.
    #[cfg(feature = "tls")]
    pub tls: Option<crate::tls::TlsConfig>,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            load_cap: Duration::from_millis(timeline_core::policy::LOAD_DISPATCH_CAP.as_u64()),
            other_cap: Duration::from_millis(timeline_core::policy::DISPATCH_CAP.as_u64()),
            send_queue: 256,
            send_queue_bytes: 16 * 1024 * 1024,
            max_frame_bytes: host_wire::frame::MAX_FRAME_BYTES,
            page_wasm: None,
            #[cfg(feature = "cluster")]
            cluster: None,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }
}

impl ServerConfig {
    /// Sets the two dispatch caps.
    #[must_use]
    pub fn dispatch_caps(mut self, load: Duration, other: Duration) -> ServerConfig {
        self.load_cap = load;
        self.other_cap = other;
        self
    }

    /// Serves over TLS with `tls` (see [`crate::tls`]).
    #[cfg(feature = "tls")]
    #[must_use]
    pub fn tls(mut self, tls: crate::tls::TlsConfig) -> ServerConfig {
        self.tls = Some(tls);
        self
    }

    /// Serves the conversation page, with `wasm` (the `timeline-wasm` build) as its
    /// timeline.
    #[must_use]
    pub fn page(mut self, wasm: Vec<u8>) -> ServerConfig {
        self.page_wasm = Some(Arc::new(wasm));
        self
    }

    /// Routes every call about a session through `cluster` (several hosts on one
    /// database).
    #[cfg(feature = "cluster")]
    #[must_use]
    pub fn cluster(mut self, cluster: Arc<crate::cluster::Cluster>) -> ServerConfig {
        self.cluster = Some(cluster);
        self
    }

    /// Sets the send queue bound, in frames (at least 1).
    #[must_use]
    pub fn send_queue(mut self, frames: usize) -> ServerConfig {
        self.send_queue = frames.max(1);
        self
    }
}

/// Counters of a running server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerStats {
    /// Connections accepted.
    pub connections: u64,
    /// Connections cut off because their send queue was full.
    pub cut_off: u64,
    /// Upgrades and pairings refused (bad token or code, or rate limited).
    pub refused: u64,
    /// Requests past their dispatch cap.
    pub timed_out: u64,
    /// Relay events sent to connections.
    pub relayed: u64,
    /// Streamed fragments not sent to a connection whose queue had no room for them.
    pub events_dropped: u64,
}

/// Which snapshot a queued frame is: a newer `blocks` snapshot of the same session and
/// target takes its place.
type SnapshotKey = (SessionId, String);

/// The frames waiting for one connection, bounded in frames and bytes. A `blocks`
/// snapshot replaces, in its place, the one of its target still waiting (it is the whole
/// overlay, so the older one carries nothing the newer lacks, and the place keeps a run
/// event behind the rows it followed); everything else queues.
#[derive(Default)]
struct Queue {
    /// Frames, each with its snapshot key and whether it counts against the bounds.
    frames: VecDeque<(Option<SnapshotKey>, String, bool)>,
    /// Bounded frames waiting, and their bytes.
    count: usize,
    bytes: usize,
}

/// One connection's place in the relay routing.
struct Conn {
    id: u64,
    queue: Mutex<Queue>,
    /// Wakes the writer when a frame is queued.
    ready: Notify,
    /// Set once when the connection is cut off or the server stops: the reader stops,
    /// the writer closes the socket.
    cut: watch::Sender<bool>,
    state: Mutex<ConnState>,
}

#[derive(Default)]
struct ConnState {
    /// Sessions joined, with how many joins (each is one phone to the host).
    joined: HashMap<SessionId, Joined>,
    cut: bool,
}

#[derive(Default)]
struct Joined {
    /// Joins not yet left.
    count: u32,
    /// Events held while a replay is on its way; `None` once live.
    held: Option<Vec<String>>,
    /// A join asked for the streamed fragments (`sessionEvents`).
    events: bool,
}

impl Conn {
    /// Queues a frame; a queue past its bounds cuts the connection.
    fn send(&self, frame: String, shared: &Shared) {
        self.queue_frame(None, frame, shared);
    }

    /// Queues a relay frame, a `blocks` snapshot taking the place of the waiting one of
    /// its target.
    fn send_relay(&self, event: &overlay_core::live::RelayEvent, frame: String, shared: &Shared) {
        let key = (event.json.get("event").and_then(serde_json::Value::as_str) == Some("blocks"))
            .then(|| {
                let target = event
                    .json
                    .get("timelineTargetId")
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or_default();
                (event.session.clone(), target.to_owned())
            });
        self.queue_frame(key, frame, shared);
    }

    fn queue_frame(&self, key: Option<SnapshotKey>, frame: String, shared: &Shared) {
        let over = {
            let mut q = lock(&self.queue);
            let q = &mut *q;
            let waiting = key.as_ref().and_then(|k| {
                q.frames
                    .iter_mut()
                    .find(|(kk, _, _)| kk.as_ref() == Some(k))
            });
            match waiting {
                Some((_, held, _)) => {
                    q.bytes = q.bytes - held.len() + frame.len();
                    *held = frame;
                }
                None => {
                    q.count += 1;
                    q.bytes += frame.len();
                    q.frames.push_back((key, frame, true));
                }
            }
            q.count > shared.config.send_queue || q.bytes > shared.config.send_queue_bytes
        };
        if over {
            self.cut_off(shared);
        } else {
            self.ready.notify_one();
        }
    }

    /// Queues a streamed fragment while the queue is under half its bounds, so
    /// fragments alone never fill it (the other frames keep at least the other half);
    /// a fragment with no room is not sent (the client pages what it missed) and never
    /// cuts the connection itself. Returns whether it was queued.
    fn offer_event(&self, frame: String, shared: &Shared) -> bool {
        let queued = {
            let mut q = lock(&self.queue);
            let room = q.count < shared.config.send_queue / 2
                && q.bytes + frame.len() <= shared.config.send_queue_bytes / 2;
            if room {
                q.count += 1;
                q.bytes += frame.len();
                q.frames.push_back((None, frame, true));
            }
            room
        };
        if queued {
            self.ready.notify_one();
        }
        queued
    }

    /// Queues a replay chunk outside the bounds.
    fn send_replay(&self, frame: String) {
        lock(&self.queue).frames.push_back((None, frame, false));
        self.ready.notify_one();
    }

    fn next_frame(&self) -> Option<String> {
        let mut q = lock(&self.queue);
        let (_, frame, bounded) = q.frames.pop_front()?;
        if bounded {
            q.count -= 1;
            q.bytes -= frame.len();
        }
        Some(frame)
    }

    fn cut_off(&self, shared: &Shared) {
        let first = {
            let mut s = lock(&self.state);
            !std::mem::replace(&mut s.cut, true)
        };
        if first {
            lock(&shared.stats).cut_off += 1;
            self.cut.send_replace(true);
        }
    }
}

struct Shared {
    client: Client,
    config: ServerConfig,
    devices: Mutex<Devices>,
    gate: Mutex<Gate>,
    idempotency: Mutex<Idempotency>,
    /// Waiters for a mutation's answer, by the synthetic request ID given to the table.
    waiters: Mutex<HashMap<RequestId, oneshot::Sender<Outcome>>>,
    next_waiter: Mutex<i64>,
    /// Relay routing: connections by joined session.
    sessions: Mutex<BTreeMap<SessionId, BTreeMap<u64, Arc<Conn>>>>,
    /// Every open connection (to close them at shutdown).
    conns: Mutex<BTreeMap<u64, Arc<Conn>>>,
    next_conn: Mutex<u64>,
    stats: Mutex<ServerStats>,
    start: Instant,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while a lock was held leaves data this module only ever writes whole
    // values into; carry on with it.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A running server. Dropping it stops accepting; [`Server::shutdown`] waits for it.
#[derive(Debug)]
pub struct Server {
    shared: Arc<SharedHandle>,
    local_addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), std::io::Error>>>,
    pump: Option<tokio::task::JoinHandle<()>>,
}

/// The shared state, behind a type that prints without its secrets.
struct SharedHandle(Shared);

impl std::fmt::Debug for SharedHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").finish_non_exhaustive()
    }
}

impl Server {
    /// Serves `runtime`'s host on `listener` (loopback unless the embedder chooses
    /// otherwise). Takes the runtime's outputs: relay events go to the connections that
    /// joined their session; every other output goes to `others` (when given; a full
    /// `others` waits, as the runtime's own outputs do), and without it a notice is
    /// logged. `devices` are the pairings kept from before.
    pub async fn start(
        runtime: &mut Runtime,
        listener: tokio::net::TcpListener,
        config: ServerConfig,
        devices: Devices,
        others: Option<mpsc::Sender<Output>>,
    ) -> std::io::Result<Server> {
        let local_addr = listener.local_addr()?;
        let shared = Arc::new(SharedHandle(Shared {
            client: runtime.client(),
            config,
            devices: Mutex::new(devices),
            gate: Mutex::new(Gate::default()),
            idempotency: Mutex::new(Idempotency::new()),
            waiters: Mutex::new(HashMap::new()),
            next_waiter: Mutex::new(0),
            sessions: Mutex::new(BTreeMap::new()),
            conns: Mutex::new(BTreeMap::new()),
            next_conn: Mutex::new(0),
            stats: Mutex::new(ServerStats::default()),
            start: Instant::now(),
        }));
        let pump = tokio::spawn(pump(runtime.take_outputs(), Arc::clone(&shared), others));
        let mut app = Router::new()
            .route("/ws", get(upgrade))
            .route("/pair", post(pair));
        if shared.0.config.page_wasm.is_some() {
            app = app
                .route("/", get(page_html))
                .route("/app.js", get(page_js))
                .route("/timeline.wasm", get(page_wasm));
        }
        let app = app.with_state(Arc::clone(&shared));
        let (stop, stopped) = oneshot::channel::<()>();
        let stopped = async move {
            // A dropped sender stops the server too.
            if stopped.await.is_err() {
                tracing::debug!("the server's handle was dropped: stopping");
            }
        };
        #[cfg(feature = "tls")]
        if let Some(tls) = &shared.0.config.tls {
            use axum::serve::ListenerExt;
            // `tap_io` gives the connection's peer address as its connect info, as a
            // plain listener does.
            let listener = crate::tls::TlsListener::new(listener, tls)?.tap_io(|_| {});
            let task = tokio::spawn(async move {
                axum::serve(
                    listener,
                    app.into_make_service_with_connect_info::<SocketAddr>(),
                )
                .with_graceful_shutdown(stopped)
                .await
            });
            return Ok(Server {
                shared,
                local_addr,
                stop: Some(stop),
                task: Some(task),
                pump: Some(pump),
            });
        }
        let task = tokio::spawn(async move {
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .with_graceful_shutdown(stopped)
            .await
        });
        Ok(Server {
            shared,
            local_addr,
            stop: Some(stop),
            task: Some(task),
            pump: Some(pump),
        })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// A new pairing code to show: single use, valid for five minutes.
    ///
    /// # Errors
    ///
    /// The system's random source failed.
    pub fn pairing_code(&self) -> Result<String, getrandom::Error> {
        lock(&self.shared.0.gate).new_code(Instant::now())
    }

    /// The paired devices (save them to keep pairings across restarts).
    pub fn devices(&self) -> Devices {
        lock(&self.shared.0.devices).clone()
    }

    /// Revokes a device: its token is refused from now on, and its open connections
    /// stay only until they close (a revoked token cannot open another).
    pub fn revoke(&self, device_id: &str) -> bool {
        lock(&self.shared.0.devices).revoke(device_id)
    }

    /// The server's counters now.
    pub fn stats(&self) -> ServerStats {
        *lock(&self.shared.0.stats)
    }

    /// Stops accepting, closes the connections and waits for the server to end.
    ///
    /// # Errors
    ///
    /// The server's accept loop failed.
    pub async fn shutdown(mut self) -> std::io::Result<()> {
        if let Some(stop) = self.stop.take() {
            // The server may have ended already; nothing then waits for the signal.
            if stop.send(()).is_err() {
                tracing::debug!("the server had already ended");
            }
        }
        let conns: Vec<Arc<Conn>> = lock(&self.shared.0.conns).values().cloned().collect();
        for conn in conns {
            conn.cut.send_replace(true);
        }
        if let Some(pump) = self.pump.take() {
            pump.abort();
        }
        match self.task.take() {
            Some(task) => task.await.unwrap_or_else(|e| Err(std::io::Error::other(e))),
            None => Ok(()),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            // Ending anyway: a server that already stopped needs no signal.
            if stop.send(()).is_err() {
                tracing::debug!("the server had already ended");
            }
        }
        if let Some(pump) = self.pump.take() {
            pump.abort();
        }
    }
}

/// Routes the runtime's outputs: relay events to the connections of their session.
async fn pump(
    mut outputs: Outputs,
    shared: Arc<SharedHandle>,
    others: Option<mpsc::Sender<Output>>,
) {
    while let Some(output) = outputs.next().await {
        match output {
            Output::Deliver(Delivery::Relay(event)) => {
                let conns: Vec<Arc<Conn>> = lock(&shared.0.sessions)
                    .get(&event.session)
                    .map(|m| m.values().cloned().collect())
                    .unwrap_or_default();
                if conns.is_empty() {
                    continue;
                }
                let frame = host_wire::relay_frame(&event);
                let fragment = event.is_session_event();
                for conn in conns {
                    if fragment {
                        // Only to the joins that asked, once live (one that falls in a
                        // join's replay is paged by the client, as any it missed).
                        let live = lock(&conn.state)
                            .joined
                            .get(&event.session)
                            .is_some_and(|j| j.events && j.held.is_none());
                        if live {
                            let sent = conn.offer_event(frame.clone(), &shared.0);
                            let mut stats = lock(&shared.0.stats);
                            if sent {
                                stats.relayed += 1;
                            } else {
                                stats.events_dropped += 1;
                            }
                        }
                        continue;
                    }
                    let held = {
                        let mut s = lock(&conn.state);
                        match s.joined.get_mut(&event.session).map(|j| &mut j.held) {
                            Some(Some(held)) => {
                                held.push(frame.clone());
                                held.len() > shared.0.config.send_queue
                            }
                            Some(None) => {
                                drop(s);
                                conn.send_relay(&event, frame.clone(), &shared.0);
                                lock(&shared.0.stats).relayed += 1;
                                false
                            }
                            None => false,
                        }
                    };
                    if held {
                        conn.cut_off(&shared.0);
                    }
                }
            }
            Output::Notice(Notice::SessionReleased { session, reason }) => {
                moved(&shared.0, &session, &reason);
                forward(
                    Output::Notice(Notice::SessionReleased { session, reason }),
                    &others,
                )
                .await;
            }
            other => forward(other, &others).await,
        }
    }
}

/// An output the server does not carry itself: to `others`, or logged.
async fn forward(output: Output, others: &Option<mpsc::Sender<Output>>) {
    match others {
        Some(tx) => {
            if tx.send(output).await.is_err() {
                warn!("the server's output sink closed; outputs are logged from now on");
            }
        }
        None => {
            if let Output::Notice(notice) = &output {
                warn!(severity = ?notice.severity(), "{notice}");
            }
        }
    }
}

/// The page: its words and its script are part of this crate.
const PAGE_HTML: &str = include_str!("../web/index.html");
const PAGE_JS: &str = include_str!("../web/app.js");

async fn page_html() -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8")],
        PAGE_HTML,
    )
        .into_response()
}

async fn page_js() -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/javascript; charset=utf-8",
        )],
        PAGE_JS,
    )
        .into_response()
}

async fn page_wasm(State(shared): State<Arc<SharedHandle>>) -> Response {
    match &shared.0.config.page_wasm {
        Some(wasm) => (
            [(axum::http::header::CONTENT_TYPE, "application/wasm")],
            wasm.as_ref().clone(),
        )
            .into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

#[derive(serde::Deserialize)]
struct TokenQuery {
    token: Option<String>,
}

fn refusal(status: StatusCode, code: &str, message: &str) -> Response {
    (
        status,
        Json(serde_json::json!({ "errorCode": code, "message": message })),
    )
        .into_response()
}

fn limited() -> Response {
    refusal(
        StatusCode::TOO_MANY_REQUESTS,
        "TOO_MANY_ATTEMPTS",
        "Too many failed attempts from this address; try again in a minute.",
    )
}

async fn upgrade(
    ws: WebSocketUpgrade,
    Query(query): Query<TokenQuery>,
    headers: HeaderMap,
    ConnectInfo(from): ConnectInfo<SocketAddr>,
    State(shared): State<Arc<SharedHandle>>,
) -> Response {
    let token = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned)
        .or(query.token);
    let device = match authorize(&shared.0, token.as_deref(), from.ip()) {
        Ok(device) => device,
        Err(Refused::Limited) => return limited(),
        Err(Refused::Bad) => {
            return refusal(
                StatusCode::UNAUTHORIZED,
                "UNAUTHORIZED",
                "This device is not paired, or its pairing was revoked. Pair it again.",
            )
        }
    };
    let max = shared.0.config.max_frame_bytes;
    // Small socket buffers: an idle phone costs what it holds, not tungstenite's 128 KiB
    // defaults; a large frame still goes (the buffers grow while it passes).
    ws.max_message_size(max)
        .max_frame_size(max)
        .read_buffer_size(SOCKET_BUFFER)
        .write_buffer_size(SOCKET_BUFFER)
        .on_upgrade(move |socket| connection(socket, device, shared))
}

/// The device a token names, unless the address is limited or the token is bad (a
/// failure counted).
fn authorize(shared: &Shared, token: Option<&str>, from: IpAddr) -> Result<Device, Refused> {
    let now = Instant::now();
    let mut gate = lock(&shared.gate);
    if let Err(limited) = gate.check(from, now) {
        lock(&shared.stats).refused += 1;
        return Err(limited);
    }
    let found = token.and_then(|t| lock(&shared.devices).authorize(t).cloned());
    match found {
        Some(device) => Ok(device),
        None => {
            gate.failed(from, now);
            lock(&shared.stats).refused += 1;
            Err(Refused::Bad)
        }
    }
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct PairRequest {
    code: String,
    device_name: String,
}

async fn pair(
    ConnectInfo(from): ConnectInfo<SocketAddr>,
    State(shared): State<Arc<SharedHandle>>,
    Json(req): Json<PairRequest>,
) -> Response {
    let name: String = req.device_name.trim().chars().take(100).collect();
    let paired = {
        let mut devices = lock(&shared.0.devices);
        lock(&shared.0.gate).pair(
            &mut devices,
            req.code.trim(),
            &name,
            from.ip(),
            Instant::now(),
            wall_ms(),
        )
    };
    match paired {
        Ok(Ok((device, token))) => Json(serde_json::json!({
            "deviceId": device.device_id,
            "token": token,
        }))
        .into_response(),
        Ok(Err(e)) => refusal(
            StatusCode::INTERNAL_SERVER_ERROR,
            "INTERNAL_ERROR",
            &format!("no random token could be made: {e}"),
        ),
        Err(Refused::Limited) => {
            lock(&shared.0.stats).refused += 1;
            limited()
        }
        Err(Refused::Bad) => {
            lock(&shared.0.stats).refused += 1;
            refusal(
                StatusCode::UNAUTHORIZED,
                "PAIRING_CODE_INVALID",
                "This pairing code is wrong, used or expired. Ask the host for a new one.",
            )
        }
    }
}

async fn connection(socket: WebSocket, device: Device, shared: Arc<SharedHandle>) {
    use futures_util::{SinkExt, StreamExt};
    let id = {
        let mut n = lock(&shared.0.next_conn);
        *n += 1;
        *n
    };
    lock(&shared.0.stats).connections += 1;
    debug!(id, device = %device.device_id, "connection opened");
    let (cut, _) = watch::channel(false);
    let conn = Arc::new(Conn {
        id,
        queue: Mutex::new(Queue::default()),
        ready: Notify::new(),
        cut,
        state: Mutex::new(ConnState::default()),
    });
    lock(&shared.0.conns).insert(id, Arc::clone(&conn));
    let (mut sink, mut stream) = socket.split();
    let writer_cut = until_cut(conn.cut.subscribe());
    let writer_conn = Arc::clone(&conn);
    let writer = tokio::spawn(async move {
        tokio::pin!(writer_cut);
        loop {
            let next = writer_conn.next_frame();
            tokio::select! {
                // A frame the socket takes (or a wait for one), unless cut meanwhile: a
                // socket that takes nothing cannot hold the writer past its cut.
                sent = async {
                    match next {
                        // A peer that takes nothing for WRITE_DEADLINE is gone.
                        Some(frame) => matches!(
                            tokio::time::timeout(WRITE_DEADLINE, sink.send(Message::Text(frame.into()))).await,
                            Ok(Ok(()))
                        ),
                        None => {
                            writer_conn.ready.notified().await;
                            true
                        }
                    }
                } => if !sent { break },
                () = &mut writer_cut => {
                    let close = Message::Close(Some(CloseFrame {
                        code: 1013,
                        reason: "try again later".into(),
                    }));
                    // The socket may already be gone or take nothing; it closes either
                    // way, within a second.
                    match tokio::time::timeout(Duration::from_secs(1), sink.send(close)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => tracing::debug!(error = %e, "the close frame was not sent"),
                        Err(_) => tracing::debug!("the close frame took over a second"),
                    }
                    break;
                }
            }
        }
    });
    let reader_cut = until_cut(conn.cut.subscribe());
    tokio::pin!(reader_cut);
    let mut requests = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            msg = stream.next() => match msg {
                Some(Ok(Message::Text(text))) => {
                    requests.spawn(request(
                        text.to_string(),
                        Arc::clone(&conn),
                        device.device_id.clone(),
                        Arc::clone(&shared),
                    ));
                }
                Some(Ok(Message::Binary(_))) => {
                    let refusal = host_wire::Refusal {
                        id: None,
                        error: host_wire::WireError::new(
                            host_wire::error::INVALID_REQUEST,
                            "INVALID_REQUEST",
                            "frames are JSON text",
                        ),
                    };
                    conn.send(refusal.response().to_json(), &shared.0);
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
            () = &mut reader_cut => break,
            Some(_) = requests.join_next(), if !requests.is_empty() => {}
        }
    }
    // Whatever ended the reader ends the writer too.
    conn.cut.send_replace(true);
    lock(&shared.0.conns).remove(&id);
    // Leave every session this connection joined, once per join: the host counts
    // phones.
    let joined: Vec<(SessionId, u32)> = lock(&conn.state)
        .joined
        .iter()
        .map(|(s, j)| (s.clone(), j.count))
        .collect();
    for (session, count) in joined {
        unroute(&shared.0, &session, conn.id);
        for _ in 0..count {
            let leave = ClientRequest::Leave {
                session: session.clone(),
            };
            if let Err(e) = shared.0.client.request(leave).await {
                debug!("leave of {session} after a close: {e}");
            }
        }
    }
    // Requests still waiting are dropped; the host's work they started goes on, and a
    // mutation's answer still settles its key (`asked`).
    requests.abort_all();
    drop(conn);
    // The writer ends when it is cut; a panic in it is the one failure left to report.
    if let Err(e) = writer.await {
        if e.is_panic() {
            tracing::error!(error = %e, "a connection's writer panicked");
        }
    }
}

/// Ends when the connection is cut (or its sender is gone).
async fn until_cut(mut cut: watch::Receiver<bool>) {
    // An error means the sender is gone: the connection is over either way.
    if cut.wait_for(|cut| *cut).await.is_err() {
        tracing::debug!("the connection's cut signal is gone");
    }
}

/// The host let the scope of `base` go: every connection joined to a session of it is
/// told (`chat:session-moved`) and its joins there end.
fn moved(shared: &Shared, base: &SessionId, reason: &str) {
    let gone: Vec<(SessionId, Vec<Arc<Conn>>)> = {
        let mut sessions = lock(&shared.sessions);
        let members: Vec<SessionId> = sessions
            .keys()
            .filter(|s| outbox_core::ids::base_session(s) == *base)
            .cloned()
            .collect();
        members
            .into_iter()
            .filter_map(|s| sessions.remove(&s).map(|m| (s, m.into_values().collect())))
            .collect()
    };
    for (session, conns) in gone {
        let frame = host_wire::SessionMoved::new(session.clone(), reason, None).frame();
        for conn in conns {
            lock(&conn.state).joined.remove(&session);
            conn.send(frame.clone(), shared);
        }
    }
}

fn unroute(shared: &Shared, session: &SessionId, conn: u64) {
    let mut sessions = lock(&shared.sessions);
    if let Some(m) = sessions.get_mut(session) {
        m.remove(&conn);
        if m.is_empty() {
            sessions.remove(session);
        }
    }
}

/// One request: decoded, admitted, asked under its cap, answered.
async fn request(text: String, conn: Arc<Conn>, device: String, shared: Arc<SharedHandle>) {
    let shared_ref = &shared.0;
    let request = match decode_request(&text) {
        Ok(r) => r,
        Err(refusal) => {
            conn.send(refusal.response().to_json(), shared_ref);
            return;
        }
    };
    let id = request.id.clone();
    let call = request.call;
    let cap = match call.dispatch_class() {
        DispatchClass::Load => shared_ref.config.load_cap,
        _ => shared_ref.config.other_cap,
    };
    debug!(method = call.method(), conn = conn.id, "request");
    let Some(key) = call.idempotency_key().cloned() else {
        read(id, call, cap, &conn, &shared).await;
        return;
    };
    // A mutation: once per key and device. The waiter's channel is in place before the
    // table can name it.
    let (waiter_tx, waiter_rx) = oneshot::channel();
    let waiter_id = {
        let mut n = lock(&shared_ref.next_waiter);
        *n += 1;
        RequestId::Number(*n)
    };
    lock(&shared_ref.waiters).insert(waiter_id.clone(), waiter_tx);
    let admission =
        lock(&shared_ref.idempotency).admit(&device, &key, &call, &waiter_id, now(shared_ref));
    if !matches!(admission, Admission::Wait) {
        lock(&shared_ref.waiters).remove(&waiter_id);
    }
    let outcome = match admission {
        Admission::Run => {
            let (tx, rx) = oneshot::channel();
            tokio::spawn(asked(Arc::clone(&shared), device, key, call, tx));
            match tokio::time::timeout(cap, rx).await {
                Ok(Ok((frames, outcome))) => {
                    for frame in frames {
                        conn.send(frame, shared_ref);
                    }
                    outcome
                }
                Ok(Err(_)) => internal("the request ended inside the server"),
                Err(_) => Outcome::Error(dispatch_timeout(shared_ref)),
            }
        }
        Admission::Wait => match tokio::time::timeout(cap, waiter_rx).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => internal("the request ended inside the server"),
            Err(_) => Outcome::Error(dispatch_timeout(shared_ref)),
        },
        Admission::Replay(outcome) => outcome,
        Admission::Refused(error) => Outcome::Error(error),
        _ => internal("this admission is not known to this server"),
    };
    conn.send(response(id, outcome), shared_ref);
}

/// Asks the host for a mutation and settles its key with the answer, whoever still
/// waits: it runs on a task of its own, so a caller past its cap or gone does not stop
/// it.
async fn asked(
    shared: Arc<SharedHandle>,
    device: String,
    key: outbox_core::ids::IdempotencyKey,
    call: Call,
    tx: oneshot::Sender<(Vec<String>, Outcome)>,
) {
    let (frames, outcome) = ask(&shared, call).await;
    finish(&shared.0, &device, &key, outcome.clone());
    if tx.send((frames, outcome)).is_err() {
        // The caller is gone (its cap passed, its connection closed); the outcome is
        // kept under its key for a retry all the same (`finish` above).
        debug!("an answered request's caller had stopped waiting");
    }
}

/// A read, a join or a leave: no key.
async fn read(
    id: RequestId,
    call: Call,
    cap: Duration,
    conn: &Arc<Conn>,
    shared: &Arc<SharedHandle>,
) {
    let shared_ref = &shared.0;
    let join = match &call {
        Call::ChatJoin(p) => Some((p.app_session_id.clone(), p.session_events)),
        _ => None,
    };
    let leave = match &call {
        Call::ChatLeave(p) => Some(p.app_session_id.clone()),
        _ => None,
    };
    if let Some((session, _)) = &join {
        // Route first and hold what comes until the replay is sent: no event falls
        // between the replay and the live stream.
        lock(&conn.state)
            .joined
            .entry(session.clone())
            .or_default()
            .held = Some(Vec::new());
        lock(&shared_ref.sessions)
            .entry(session.clone())
            .or_default()
            .insert(conn.id, Arc::clone(conn));
    }
    let (frames, outcome) = match tokio::time::timeout(cap, ask(shared, call)).await {
        Ok(answer) => answer,
        Err(_) => (Vec::new(), Outcome::Error(dispatch_timeout(shared_ref))),
    };
    let ok = matches!(outcome, Outcome::Result(_));
    // A join's replay is what the phone asked for, at most the replay buffer's bytes:
    // it never counts against the queue's bounds.
    for frame in frames {
        conn.send_replay(frame);
    }
    conn.send(response(id, outcome), shared_ref);
    if let Some((session, events)) = join {
        let held = {
            let mut state = lock(&conn.state);
            let joined = state.joined.entry(session.clone()).or_default();
            if ok {
                joined.count += 1;
                // A join that asked turns them on for the connection's joins of the
                // session until it leaves the session.
                joined.events |= events;
            }
            let held = joined.held.take();
            let gone = joined.count == 0;
            if gone {
                state.joined.remove(&session);
            }
            (held, gone)
        };
        if held.1 {
            unroute(shared_ref, &session, conn.id);
        }
        for frame in held.0.unwrap_or_default() {
            conn.send(frame, shared_ref);
        }
    }
    if let (Some(session), true) = (leave, ok) {
        let gone = {
            let mut state = lock(&conn.state);
            match state.joined.get_mut(&session) {
                Some(j) if j.count > 1 => {
                    j.count -= 1;
                    false
                }
                Some(_) => {
                    state.joined.remove(&session);
                    true
                }
                None => false,
            }
        };
        if gone {
            unroute(shared_ref, &session, conn.id);
        }
    }
}

/// Asks the host: the frames before the response (a join's replay) and the response's
/// outcome.
async fn ask(shared: &SharedHandle, call: Call) -> (Vec<String>, Outcome) {
    #[cfg(feature = "cluster")]
    if let Some(cluster) = &shared.0.config.cluster {
        for session in call.sessions() {
            match cluster.route(session).await {
                crate::cluster::Route::Here => {}
                crate::cluster::Route::Elsewhere(by) => {
                    let message = format!("session {session} is served by host {}", by.host);
                    let error = host_wire::WireError::elsewhere(message, Some(by));
                    return (Vec::new(), Outcome::Error(error));
                }
                crate::cluster::Route::Unavailable(why) => {
                    let error = host_wire::WireError::elsewhere(
                        format!("where session {session} is served is not known now: {why}"),
                        None,
                    );
                    return (Vec::new(), Outcome::Error(error));
                }
            }
        }
    }
    let request = match call.into_client_request() {
        Ok(r) => r,
        Err(e) => return (Vec::new(), Outcome::Error(e)),
    };
    match shared.0.client.request(request).await {
        Ok(reply) => outcome_of(&reply),
        Err(e) => (Vec::new(), internal(&e.to_string())),
    }
}

fn internal(message: &str) -> Outcome {
    Outcome::Error(host_wire::WireError::new(
        host_wire::error::INTERNAL_ERROR,
        "INTERNAL_ERROR",
        message,
    ))
}

fn outcome_of(reply: &Reply) -> (Vec<String>, Outcome) {
    let before = match reply {
        Reply::Replay(chunks) => chunks.iter().map(host_wire::replay_frame).collect(),
        _ => Vec::new(),
    };
    let outcome = host_wire::reply_response(RequestId::Number(0), reply).outcome;
    (before, outcome)
}

fn response(id: RequestId, outcome: Outcome) -> String {
    host_wire::Response {
        jsonrpc: host_wire::frame::Version2,
        id: Some(id),
        outcome,
    }
    .to_json()
}

fn finish(shared: &Shared, device: &str, key: &outbox_core::ids::IdempotencyKey, outcome: Outcome) {
    let waiting = lock(&shared.idempotency).complete(device, key, outcome.clone(), now(shared));
    let mut waiters = lock(&shared.waiters);
    for w in waiting {
        if let Some(tx) = waiters.remove(&w) {
            if tx.send(outcome.clone()).is_err() {
                // The waiter gave up (its own cap); the outcome stays kept for its key.
                debug!("a request waiting on an idempotency key had stopped waiting");
            }
        }
    }
}

fn dispatch_timeout(shared: &Shared) -> host_wire::WireError {
    lock(&shared.stats).timed_out += 1;
    host_wire::WireError::new(
        host_wire::error::SERVER_ERROR,
        "DISPATCH_TIMEOUT",
        "The host did not answer in time. The request may still take effect: check before sending it again.",
    )
}

fn now(shared: &Shared) -> Millis {
    Millis(u64::try_from(shared.start.elapsed().as_millis()).unwrap_or(u64::MAX))
}
