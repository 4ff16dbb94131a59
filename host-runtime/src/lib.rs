//! # host-runtime
//!
//! Runs a [`host_core::Host`] for real: a monotonic clock, timers at the host's and the
//! agents' deadlines, agent processes ([`host_core::Agent`]s such as Codex's
//! `CodexAgent` and Claude's), and clients that ask and get answers. `host-core` decides;
//! this crate only carries out.
//!
//! ```no_run
//! use host_core::{ClientRequest, Host, HostConfig, ProcessSpec};
//! use host_runtime::{Output, Runtime};
//! use outbox_core::MemoryOutboxStore;
//! use overlay_core::MemoryOverlayStore;
//! use timeline_core::HostKey;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let mut n = 0u64;
//! let uuids = Box::new(move || { n += 1; format!("00000000-0000-4000-8000-{n:012x}") });
//! let host = Host::new(
//!     MemoryOutboxStore::new(),
//!     MemoryOverlayStore::new(),
//!     HostConfig::new(HostKey::from_bytes([7; 32]), uuids),
//! );
//! // Add sessions to the host and to the agent that serves them, then:
//! let codex = agent_codex::CodexAgent::new(
//!     ProcessSpec::new("codex").args(["app-server"]),
//!     "my-host",
//!     "1.0",
//! );
//! let mut runtime = Runtime::builder(host).agent(codex).start()?;
//! let client = runtime.client();
//! // client.request(ClientRequest::Submit(..)).await? answers with the host's Reply;
//! // runtime.next_output().await yields live deliveries and notices.
//! while let Some(output) = runtime.next_output().await {
//!     if let Output::Notice(notice) = output {
//!         eprintln!("{notice:?}");
//!     }
//! #   break;
//! }
//! runtime.shutdown().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # How it runs
//!
//! - **The host on its own thread.** The stores do synchronous IO inside the host's
//!   handlers; the host thread runs them and nothing else waits on it but its own loop.
//!   Its loop: take the next input (a client request, a line or end of an agent process,
//!   a write's outcome, a file read) or the earliest deadline, feed it in with the
//!   current time, then carry out every effect of the host and of the agents until both
//!   are quiet.
//! - **Processes on an IO thread** (a Tokio runtime of one worker): each agent process
//!   starts in a process group of its own; its output is cut into lines of at most
//!   [`RuntimeBuilder::max_line_bytes`] (a longer line is dropped as it streams and the
//!   agent is told); its error output is read and dropped; its group is killed when the
//!   agent asks, when the runtime shuts down and when the runtime is dropped.
//! - **Bounded channels everywhere.** Process output waits when the host thread is
//!   behind (the agent then blocks on its pipe); a write to an agent whose input queue
//!   (256 lines) is full is not made and is reported so (the host never waits on an
//!   agent); the agents' output on its way to the host thread is bounded in bytes too,
//!   for all processes together ([`RuntimeBuilder::max_buffered_bytes`], 64 MiB unless
//!   set; a line longer than that waits for the whole budget and passes alone); live
//!   output waits for the embedder to take it with
//!   [`Runtime::next_output`]: an embedder that stops reading stops the host, it never
//!   grows a buffer.
//! - **Time.** The clock is monotonic: the wall time read once at start, plus the time
//!   elapsed since by [`std::time::Instant`].
//! - **A call no agent serves** is answered at once by [`host_core::unserved`].
//! - **Shutdown** ([`Runtime::shutdown`]) stops between two inputs, so no handler is cut
//!   in half; then every agent process group is killed.
//! - **Blocking stores.** The host and its agents run on the host's thread outside any
//!   async context; only the loop's waits (the next input, a full output queue) run in
//!   one. A store whose driver blocks on an async runtime of its own (the PostgreSQL
//!   client of `storage-postgres`) may be given to the host.
//! - **Tracing**: a span per client request, per agent call and per process (`tracing`,
//!   silent unless the embedder installs a subscriber).
//!
//! # Sessions made on request
//!
//! A client may ask for a new session (`ClientRequest::NewSession`; on the wire
//! `run.chatNewSession`; an ACP client's `session/new`). The runtime hands it to the
//! embedder's [`SessionMaker`] ([`RuntimeBuilder::sessions`]) on the host's thread: it
//! tells the agent that will serve the session (found by its type with
//! [`Agents::get_mut`]), adds the session to the host with its history source, and
//! names it. Without a maker the host makes none (`NewSessionError::NotOffered`). A
//! session made this way is the embedder's to add again after a restart, as every
//! other session is.
//!
//! # Phones and browsers
//!
//! With the feature `server`, `server::Server` serves the host's wire (`host-wire`:
//! JSON-RPC 2.0 on a WebSocket) to paired devices: pairing codes, device tokens kept as
//! hashes, dispatch caps, idempotency keys, relay events after each join's replay, and a
//! bounded send queue per connection. See its module doc.
//!
//! # Several hosts
//!
//! With the feature `cluster`, `cluster::Cluster` runs the host as one of several on one
//! PostgreSQL database: it serves the sessions whose lease it holds and takes over those
//! of a host that died. See its module doc.

#![warn(unreachable_pub)]

#[cfg(feature = "acp")]
pub mod acp;
#[cfg(feature = "server")]
mod auth;
#[cfg(feature = "cluster")]
pub mod cluster;
mod lines;
mod process;
#[cfg(feature = "server")]
pub mod server;
mod sessions;
#[cfg(feature = "tls")]
pub mod tls;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use host_core::{
    Agent, AgentCall, AgentEffect, ClientRequest, Host, HostEffect, HostStats, Notice, ProcessId,
    Reply, ReplyTo,
};
use outbox_core::OutboxStore;
use overlay_core::live::Delivery;
use overlay_core::{CleanupJournal, OverlayStore};
use timeline_core::key::SessionId;
use timeline_core::time::Millis;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, debug_span, warn};

use crate::process::{InputCommand, IoEvent, ProcessHandle};
use crate::sessions::RuntimeAgent;
pub use crate::sessions::{Agents, SessionMaker};

/// The default bound on one line an agent prints: 16 MiB.
pub const DEFAULT_MAX_LINE: usize = 16 * 1024 * 1024;

/// The default bound on the agents' output waiting for the host thread, all processes
/// together: 64 MiB.
pub const DEFAULT_MAX_BUFFERED: usize = 64 * 1024 * 1024;

/// Inputs taken in one round of the host loop at most, before its effects are carried
/// out.
const BURST: usize = 64;

/// Capacity of each channel between the threads (in messages; outputs travel in batches,
/// one per round of the host loop).
const CHANNEL: usize = 1024;

/// Why the runtime could not start or ended badly.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// A thread or the IO runtime could not be started.
    #[error("the runtime could not start: {0}")]
    Start(#[from] std::io::Error),
    /// The host refused to start (its outbox could not be read).
    #[error(transparent)]
    Host(#[from] host_core::StartError),
    /// The runtime has stopped: nothing more is answered.
    #[error("the runtime has stopped")]
    Stopped,
    /// The host thread panicked.
    #[error("the host thread panicked")]
    Panicked,
}

/// What the host sends out besides answers: live deliveries and notices.
#[derive(Debug)]
#[non_exhaustive]
pub enum Output {
    /// A live event for a desktop window, the progress sink or the relay.
    Deliver(Delivery),
    /// A failure or refusal to show or log.
    Notice(Notice),
}

/// The monotonic clock of the runtime.
#[derive(Clone, Copy, Debug)]
struct Clock {
    wall: u64,
    start: Instant,
}

impl Clock {
    fn new() -> Clock {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        Clock {
            wall,
            start: Instant::now(),
        }
    }

    fn now(&self) -> Millis {
        let elapsed = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        Millis(self.wall.saturating_add(elapsed))
    }

    /// The instant of `at`; a deadline past any real one (a year and more away) is
    /// a year away.
    fn instant(&self, at: Millis) -> Instant {
        const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);
        let after = Duration::from_millis(at.as_u64().saturating_sub(self.wall)).min(YEAR);
        self.start.checked_add(after).unwrap_or(self.start + YEAR)
    }
}

enum Command {
    Request(Box<ClientRequest>, oneshot::Sender<Reply>),
    Grant(SessionId, oneshot::Sender<()>),
    Release(SessionId, String, oneshot::Sender<()>),
    Serves(SessionId, oneshot::Sender<bool>),
    Processes(oneshot::Sender<Vec<AgentProcess>>),
    Stats(oneshot::Sender<RuntimeStats>),
}

/// Counters of a running host and its agent processes ([`Client::stats`]). Each only
/// grows but `processes_running`; compare two snapshots for a rate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RuntimeStats {
    /// The host's own counters.
    pub host: HostStats,
    /// Agent processes started.
    pub processes_started: u64,
    /// Agent processes that ended (by themselves or killed).
    pub processes_ended: u64,
    /// Agent processes running now.
    pub processes_running: usize,
    /// Lines read from agents' output.
    pub lines_read: u64,
    /// Over-long lines dropped as they streamed (longer than the line limit).
    pub lines_dropped: u64,
    /// Writes to an agent's input that did not happen (it stopped reading, or was gone).
    pub writes_refused: u64,
    /// Outputs (deliveries and notices) handed to the embedder.
    pub outputs: u64,
}

/// One agent process the runtime runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AgentProcess {
    /// The agent, by the order it was added to the builder (from 0).
    pub agent: usize,
    /// The agent's name for it.
    pub process: ProcessId,
    /// Its operating-system process ID (also its process group's), once started.
    pub pid: Option<u32>,
}

/// Builds a [`Runtime`].
pub struct RuntimeBuilder<O, V> {
    host: Host<O, V>,
    agents: Vec<Box<dyn RuntimeAgent>>,
    maker: Option<Box<dyn SessionMaker<O, V>>>,
    max_line: usize,
    max_buffered: usize,
}

impl<O, V> std::fmt::Debug for RuntimeBuilder<O, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeBuilder")
            .field("agents", &self.agents.len())
            .field("max_line", &self.max_line)
            .field("max_buffered", &self.max_buffered)
            .field("makes_sessions", &self.maker.is_some())
            .finish_non_exhaustive()
    }
}

impl<O, V> RuntimeBuilder<O, V>
where
    O: OutboxStore + Send + 'static,
    V: OverlayStore + CleanupJournal + Send + 'static,
{
    /// Adds an agent; each call goes to the first agent that serves its session.
    #[must_use]
    pub fn agent(mut self, agent: impl Agent + Send + 'static) -> Self {
        self.agents.push(Box::new(agent));
        self
    }

    /// Makes the sessions clients ask for (`ClientRequest::NewSession`,
    /// `run.chatNewSession`, an ACP client's `session/new`). Without one, the host
    /// makes none: such a request is answered `NewSessionError::NotOffered`.
    #[must_use]
    pub fn sessions(mut self, maker: impl SessionMaker<O, V> + 'static) -> Self {
        self.maker = Some(Box::new(maker));
        self
    }

    /// The bound on one line an agent prints ([`DEFAULT_MAX_LINE`] unless set).
    #[must_use]
    pub fn max_line_bytes(mut self, max: usize) -> Self {
        self.max_line = max;
        self
    }

    /// The bound on the agents' output waiting for the host thread, in bytes, all
    /// processes together ([`DEFAULT_MAX_BUFFERED`] unless set). When the host is
    /// behind, a process's next line waits (and the agent then blocks on its pipe).
    #[must_use]
    pub fn max_buffered_bytes(mut self, max: usize) -> Self {
        self.max_buffered = max;
        self
    }

    /// Starts the host (its outbox is read now) and the threads.
    ///
    /// # Errors
    ///
    /// The host's [`host_core::StartError`], or a thread that could not start.
    pub fn start(self) -> Result<Runtime, RuntimeError> {
        let io = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("host-runtime-io")
            .enable_all()
            .build()?;
        let (commands, command_rx) = mpsc::channel(CHANNEL);
        let (io_tx, io_rx) = mpsc::channel(CHANNEL);
        let (out_tx, out_rx) = mpsc::channel(CHANNEL);
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let stop = Arc::new(tokio::sync::Notify::new());
        let stop_loop = Arc::clone(&stop);
        let handle = io.handle().clone();
        let RuntimeBuilder {
            host,
            agents,
            maker,
            max_line,
            max_buffered,
        } = self;
        let thread = std::thread::Builder::new()
            .name("host-runtime-host".to_owned())
            .spawn(move || {
                let local = match tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        // `start` waits on the other end until this answer comes; were
                        // it gone, there is nobody to tell and the thread ends anyway.
                        if started_tx.send(Err(RuntimeError::Start(e))).is_err() {
                            debug!("the runtime's start stopped waiting");
                        }
                        return;
                    }
                };
                let clock = Clock::new();
                let mut l = Loop {
                    host,
                    agents,
                    maker,
                    clock,
                    io: handle,
                    io_tx,
                    out: out_tx,
                    pending: Vec::new(),
                    processes: BTreeMap::new(),
                    waiting: BTreeMap::new(),
                    next_reply: 1,
                    max_line,
                    budget: process::Budget::new(max_buffered),
                    stats: RuntimeStats::default(),
                };
                if let Err(e) = l.host.start(clock.now()) {
                    // As above: nobody left to tell means nothing left to do.
                    if started_tx.send(Err(RuntimeError::Host(e))).is_err() {
                        debug!("the runtime's start stopped waiting");
                    }
                    return;
                }
                // Nobody waiting for the start means no runtime to serve: end.
                if started_tx.send(Ok(())).is_err() {
                    return;
                }
                l.run(&local, command_rx, io_rx, &stop_loop);
            })?;
        match started_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                // The thread returns right after this answer; a panic on its way out
                // is still said.
                return Err(match thread.join() {
                    Ok(()) => e,
                    Err(_) => RuntimeError::Panicked,
                });
            }
            Err(_) => {
                // The thread died before answering (a panic): the join waits for it
                // to be gone, and the error is the panic either way.
                return Err(match thread.join() {
                    Ok(()) | Err(_) => RuntimeError::Panicked,
                });
            }
        }
        Ok(Runtime {
            commands,
            stop,
            outputs: Outputs {
                rx: Some(out_rx),
                batch: std::collections::VecDeque::new(),
            },
            thread: Some(thread),
            io: Some(io),
        })
    }
}

/// A running host. See the crate doc.
#[derive(Debug)]
pub struct Runtime {
    commands: mpsc::Sender<Command>,
    /// Tells the host loop to stop (a permit kept until it looks, so a full command
    /// channel cannot lose it).
    stop: Arc<tokio::sync::Notify>,
    outputs: Outputs,
    thread: Option<std::thread::JoinHandle<()>>,
    io: Option<tokio::runtime::Runtime>,
}

/// The live deliveries and notices of a running host, in order.
#[derive(Debug)]
pub struct Outputs {
    rx: Option<mpsc::Receiver<Vec<Output>>>,
    /// The rest of the last batch.
    batch: std::collections::VecDeque<Output>,
}

impl Outputs {
    /// The next output; `None` once the runtime stopped.
    pub async fn next(&mut self) -> Option<Output> {
        loop {
            if let Some(o) = self.batch.pop_front() {
                return Some(o);
            }
            self.batch = self.rx.as_mut()?.recv().await?.into();
        }
    }
}

/// A client of a running host: asks and gets the host's answer. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Client {
    commands: mpsc::Sender<Command>,
}

impl Client {
    /// Asks the host; the answer is the host's [`Reply`].
    ///
    /// # Errors
    ///
    /// [`RuntimeError::Stopped`] when the runtime stopped before answering.
    pub async fn request(&self, request: ClientRequest) -> Result<Reply, RuntimeError> {
        self.ask(|tx| Command::Request(Box::new(request), tx)).await
    }

    /// Sends the command `make` builds around the answer's channel, and waits for it.
    async fn ask<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, RuntimeError> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(make(tx))
            .await
            .map_err(|_| RuntimeError::Stopped)?;
        rx.await.map_err(|_| RuntimeError::Stopped)
    }

    /// Serves the scope of `session` from now on (its lease was acquired), or reads it
    /// again (another host wrote into it): [`host_core::Host::grant_session`]. Returns
    /// once the host has done it.
    ///
    /// # Errors
    ///
    /// [`RuntimeError::Stopped`] when the runtime stopped.
    pub async fn grant_session(&self, session: SessionId) -> Result<(), RuntimeError> {
        self.ask(|tx| Command::Grant(session, tx)).await
    }

    /// Stops serving the scope of `session`: [`host_core::Host::release_session`].
    ///
    /// # Errors
    ///
    /// [`RuntimeError::Stopped`] when the runtime stopped.
    pub async fn release_session(
        &self,
        session: SessionId,
        reason: String,
    ) -> Result<(), RuntimeError> {
        self.ask(|tx| Command::Release(session, reason, tx)).await
    }

    /// Whether the host serves the scope of `session` now.
    ///
    /// # Errors
    ///
    /// [`RuntimeError::Stopped`] when the runtime stopped.
    pub async fn serves(&self, session: SessionId) -> Result<bool, RuntimeError> {
        self.ask(|tx| Command::Serves(session, tx)).await
    }

    /// The counters of the host and its agent processes, now.
    ///
    /// # Errors
    ///
    /// [`RuntimeError::Stopped`] when the runtime stopped.
    pub async fn stats(&self) -> Result<RuntimeStats, RuntimeError> {
        self.ask(Command::Stats).await
    }

    /// The agent processes running now.
    ///
    /// # Errors
    ///
    /// [`RuntimeError::Stopped`] when the runtime stopped.
    pub async fn processes(&self) -> Result<Vec<AgentProcess>, RuntimeError> {
        self.ask(Command::Processes).await
    }
}

impl Runtime {
    /// Starts building a runtime around `host` (sessions already added).
    pub fn builder<O, V>(host: Host<O, V>) -> RuntimeBuilder<O, V>
    where
        O: OutboxStore + Send + 'static,
        V: OverlayStore + CleanupJournal + Send + 'static,
    {
        RuntimeBuilder {
            host,
            agents: Vec::new(),
            maker: None,
            max_line: DEFAULT_MAX_LINE,
            max_buffered: DEFAULT_MAX_BUFFERED,
        }
    }

    /// A client of this host.
    pub fn client(&self) -> Client {
        Client {
            commands: self.commands.clone(),
        }
    }

    /// The next live delivery or notice; `None` once the runtime stopped (or the
    /// outputs were taken with [`Runtime::take_outputs`]).
    pub async fn next_output(&mut self) -> Option<Output> {
        self.outputs.next().await
    }

    /// Takes the stream of outputs, to read it from a task of its own. Whoever holds
    /// it must keep reading: the host waits while it is full.
    pub fn take_outputs(&mut self) -> Outputs {
        Outputs {
            rx: self.outputs.rx.take(),
            batch: std::mem::take(&mut self.outputs.batch),
        }
    }

    /// Stops between two inputs and kills every agent process group.
    ///
    /// # Errors
    ///
    /// [`RuntimeError::Panicked`] when the host thread panicked.
    pub async fn shutdown(mut self) -> Result<(), RuntimeError> {
        self.stop.notify_one();
        // Outputs still queued would hold the host thread up: let them go.
        if let Some(rx) = self.outputs.rx.as_mut() {
            rx.close();
            while rx.recv().await.is_some() {}
        }
        self.join()
    }

    fn join(&mut self) -> Result<(), RuntimeError> {
        let joined = match self.thread.take() {
            Some(t) => t.join().map_err(|_| RuntimeError::Panicked),
            None => Ok(()),
        };
        if let Some(io) = self.io.take() {
            io.shutdown_background();
        }
        joined
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.stop.notify_one();
            if let Some(rx) = self.outputs.rx.as_mut() {
                rx.close();
            }
            // Drop cannot return it; `shutdown` is the way to handle a panicked host.
            if let Err(e) = self.join() {
                warn!(error = %e, "the host thread ended badly");
            }
        }
    }
}

/// What the loop woke for.
enum Next {
    Stop,
    Command(Option<Command>),
    Io(IoEvent),
    Timeout,
}

/// The host thread's state.
struct Loop<O, V> {
    host: Host<O, V>,
    agents: Vec<Box<dyn RuntimeAgent>>,
    maker: Option<Box<dyn SessionMaker<O, V>>>,
    clock: Clock,
    io: tokio::runtime::Handle,
    io_tx: mpsc::Sender<IoEvent>,
    out: mpsc::Sender<Vec<Output>>,
    /// Outputs of the current round, sent as one batch when the round is quiet.
    pending: Vec<Output>,
    processes: BTreeMap<(usize, ProcessId), ProcessHandle>,
    waiting: BTreeMap<u64, oneshot::Sender<Reply>>,
    next_reply: u64,
    max_line: usize,
    budget: process::Budget,
    stats: RuntimeStats,
}

impl<O, V> Loop<O, V>
where
    O: OutboxStore,
    V: OverlayStore + CleanupJournal,
{
    /// The host's loop. Only the waits run inside `local` (the next input, a full
    /// output queue): the host and the agents run outside any async context, so stores
    /// whose drivers block on an async runtime of their own (the PostgreSQL client) may
    /// be used.
    fn run(
        mut self,
        local: &tokio::runtime::Runtime,
        mut commands: mpsc::Receiver<Command>,
        mut io: mpsc::Receiver<IoEvent>,
        stop: &tokio::sync::Notify,
    ) {
        self.settle(local);
        // One timer for the loop's life, moved to each round's deadline (not one made
        // and dropped per round).
        let sleep = {
            let _runtime = local.enter();
            tokio::time::sleep_until(tokio::time::Instant::now())
        };
        tokio::pin!(sleep);
        loop {
            let wake = self
                .deadline()
                .map(|at| tokio::time::Instant::from_std(self.clock.instant(at)));
            if let Some(at) = wake {
                if sleep.deadline() != at {
                    sleep.as_mut().reset(at);
                }
            }
            let next = local.block_on(async {
                tokio::select! {
                    biased;
                    () = stop.notified() => Next::Stop,
                    command = commands.recv() => Next::Command(command),
                    Some(event) = io.recv() => Next::Io(event),
                    () = &mut sleep, if wake.is_some() => Next::Timeout,
                }
            });
            let go_on = match next {
                Next::Stop => false,
                Next::Command(command) => self.command(command),
                Next::Io(event) => {
                    self.io_event(event);
                    true
                }
                Next::Timeout => {
                    self.timeout();
                    true
                }
            };
            if !go_on {
                break;
            }
            // Take what else is already waiting before carrying out the effects: one
            // round (one output batch, one wake of the embedder) for a burst of inputs.
            let mut stop = false;
            for _ in 0..BURST {
                if let Ok(event) = io.try_recv() {
                    self.io_event(event);
                } else if let Ok(command) = commands.try_recv() {
                    if !self.command(Some(command)) {
                        stop = true;
                        break;
                    }
                } else {
                    break;
                }
            }
            // A deadline that came while inputs kept arriving is not put off by them.
            if self.deadline().is_some_and(|d| d <= self.clock.now()) {
                self.timeout();
            }
            self.settle(local);
            if stop {
                break;
            }
        }
        for (_, p) in std::mem::take(&mut self.processes) {
            p.kill();
        }
    }

    /// Carries out one command; false when the loop must stop.
    fn command(&mut self, command: Option<Command>) -> bool {
        match command {
            Some(Command::Request(request, reply)) => self.request(*request, reply),
            Some(Command::Grant(session, done)) => {
                self.host.grant_session(&session, self.clock.now());
                answer(done, ());
            }
            Some(Command::Release(session, reason, done)) => {
                self.host
                    .release_session(&session, &reason, self.clock.now());
                answer(done, ());
            }
            Some(Command::Serves(session, reply)) => {
                answer(reply, self.host.serves(&session));
            }
            Some(Command::Stats(reply)) => {
                let stats = RuntimeStats {
                    host: self.host.stats(),
                    processes_running: self.processes.len(),
                    ..self.stats
                };
                answer(reply, stats);
            }
            Some(Command::Processes(reply)) => {
                let list = self
                    .processes
                    .iter()
                    .map(|((agent, process), h)| AgentProcess {
                        agent: *agent,
                        process: *process,
                        pid: h.group,
                    })
                    .collect();
                answer(reply, list);
            }
            // Every client and the runtime are gone.
            None => return false,
        }
        true
    }

    fn deadline(&self) -> Option<Millis> {
        let agents = self.agents.iter().filter_map(|a| a.poll_timeout());
        self.host.poll_timeout().into_iter().chain(agents).min()
    }

    fn request(&mut self, request: ClientRequest, reply: oneshot::Sender<Reply>) {
        let to = self.next_reply;
        self.next_reply += 1;
        self.waiting.insert(to, reply);
        let _span = debug_span!("request", to).entered();
        let now = self.clock.now();
        self.host.handle_client(ReplyTo(to), request, now);
    }

    fn timeout(&mut self) {
        let now = self.clock.now();
        if self.host.poll_timeout().is_some_and(|d| d <= now) {
            self.host.handle_timeout(now);
        }
        for a in &mut self.agents {
            if a.poll_timeout().is_some_and(|d| d <= now) {
                a.handle_timeout(now);
            }
        }
    }

    fn io_event(&mut self, event: IoEvent) {
        let now = self.clock.now();
        match event {
            IoEvent::Line {
                agent,
                process,
                line,
                held: _held,
            } => {
                self.stats.lines_read += 1;
                if let Some(a) = self.agents.get_mut(agent) {
                    a.handle_line(process, &line, now);
                }
            }
            IoEvent::TooLong { agent, process } => {
                self.stats.lines_dropped += 1;
                warn!(
                    agent,
                    process = process.0,
                    "an agent printed an over-long line"
                );
                if let Some(a) = self.agents.get_mut(agent) {
                    a.handle_line_too_long(process, now);
                }
            }
            IoEvent::Exit {
                agent,
                process,
                reason,
            } => {
                debug!(agent, process = process.0, %reason, "agent process ended");
                if self.processes.remove(&(agent, process)).is_some() {
                    self.stats.processes_ended += 1;
                }
                if let Some(a) = self.agents.get_mut(agent) {
                    a.handle_exit(process, reason, now);
                }
            }
            IoEvent::Written {
                agent,
                process,
                write,
                result,
            } => {
                if let Some(a) = self.agents.get_mut(agent) {
                    a.handle_written(process, write, result, now);
                }
            }
            IoEvent::File {
                agent,
                read,
                result,
            } => {
                if let Some(a) = self.agents.get_mut(agent) {
                    a.handle_file(read, result, now);
                }
            }
        }
    }

    /// Carries out the effects of the host and the agents until both are quiet.
    fn settle(&mut self, local: &tokio::runtime::Runtime) {
        loop {
            let mut quiet = true;
            while let Some(effect) = self.host.poll_effect() {
                quiet = false;
                self.host_effect(effect);
            }
            for i in 0..self.agents.len() {
                while let Some(effect) = self.agents[i].poll_effect() {
                    quiet = false;
                    self.agent_effect(i, effect);
                }
            }
            if quiet {
                if !self.pending.is_empty() {
                    // One hand-off per round: the embedder wakes once, not per output.
                    let batch = std::mem::take(&mut self.pending);
                    // Without waiting when the channel has room; when it is full the
                    // host waits for the embedder (bounded). Fails only when the
                    // embedder dropped its outputs, or at shutdown: nobody is left to
                    // read them.
                    let sent = match self.out.try_send(batch) {
                        Ok(()) => Ok(()),
                        Err(mpsc::error::TrySendError::Full(batch)) => {
                            local.block_on(self.out.send(batch)).map_err(drop)
                        }
                        Err(mpsc::error::TrySendError::Closed(_)) => Err(()),
                    };
                    if sent.is_err() {
                        tracing::debug!("the embedder's outputs are gone; a batch was dropped");
                    }
                }
                return;
            }
        }
    }

    fn host_effect(&mut self, effect: HostEffect) {
        match effect {
            HostEffect::Reply { to, reply } => {
                if let Some(tx) = self.waiting.remove(&to.0) {
                    answer(tx, reply);
                }
            }
            HostEffect::Agent(call) => self.agent_call(call),
            HostEffect::Deliver(delivery) => {
                self.stats.outputs += 1;
                self.pending.push(Output::Deliver(delivery));
            }
            HostEffect::Notice(notice) => {
                self.stats.outputs += 1;
                self.pending.push(Output::Notice(notice));
            }
            HostEffect::OpenSession { to, request } => {
                let _span = debug_span!("new_session", to = to.0).entered();
                let result = match self.maker.as_mut() {
                    None => Err(host_core::NewSessionError::NotOffered),
                    Some(maker) => {
                        let mut agents = Agents {
                            agents: &mut self.agents,
                        };
                        maker
                            .make(&request, &mut self.host, &mut agents)
                            .map_err(host_core::NewSessionError::Refused)
                    }
                };
                self.host
                    .handle_session_opened(to, result, self.clock.now());
            }
            other => {
                warn!(?other, "an effect this runtime does not know");
            }
        }
    }

    fn agent_call(&mut self, call: AgentCall) {
        let now = self.clock.now();
        let session = call.session().clone();
        let _span = debug_span!("agent_call", session = %session).entered();
        match self.agents.iter_mut().find(|a| a.serves(&session)) {
            Some(agent) => agent.handle_call(call, now),
            None => {
                if let Some(input) = host_core::unserved(call) {
                    self.host.handle_agent(input, now);
                }
            }
        }
    }

    fn agent_effect(&mut self, agent: usize, effect: AgentEffect) {
        let now = self.clock.now();
        match effect {
            AgentEffect::Input(input) => self.host.handle_agent(input, now),
            AgentEffect::Spawn { process, spec } => {
                let _span = debug_span!("process", agent, process = process.0).entered();
                let handle = process::spawn(
                    &self.io,
                    agent,
                    process,
                    &spec,
                    self.max_line,
                    self.budget.clone(),
                    self.io_tx.clone(),
                );
                self.stats.processes_started += 1;
                self.processes.insert((agent, process), handle);
            }
            AgentEffect::Write {
                process,
                write,
                line,
            } => match self.processes.get(&(agent, process)) {
                Some(p) => {
                    // Never wait on an agent that stopped reading: a full input queue
                    // is a write that did not happen, and the host goes on.
                    let refused = match p.input.try_send(InputCommand::Write(write, line)) {
                        Ok(()) => None,
                        Err(mpsc::error::TrySendError::Full(_)) => {
                            Some("the agent stopped reading its input")
                        }
                        Err(mpsc::error::TrySendError::Closed(_)) => Some("the process is gone"),
                    };
                    if let Some(why) = refused {
                        self.stats.writes_refused += 1;
                        self.agents[agent].handle_written(
                            process,
                            write,
                            Err(host_core::WriteFailure::NotWritten(why.to_owned())),
                            now,
                        );
                    }
                }
                None => {
                    self.stats.writes_refused += 1;
                    self.agents[agent].handle_written(
                        process,
                        write,
                        Err(host_core::WriteFailure::NotWritten(
                            "the process is gone".to_owned(),
                        )),
                        now,
                    );
                }
            },
            AgentEffect::CloseInput { process } => {
                if let Some(p) = self.processes.get(&(agent, process)) {
                    // A full queue: the agent is not reading anyway; its end comes by
                    // the kill or by itself. A closed one: the writer has ended already.
                    if let Err(e) = p.input.try_send(InputCommand::Close) {
                        tracing::debug!(process = ?process, error = %e, "the agent's input was not closed");
                    }
                }
            }
            AgentEffect::Kill { process } => {
                if let Some(p) = self.processes.get(&(agent, process)) {
                    p.kill();
                }
            }
            AgentEffect::ReadFile { read, path, limit } => {
                process::read_file(&self.io, agent, read, path, limit, self.io_tx.clone());
            }
            other => warn!(?other, "an agent effect this runtime does not know"),
        }
    }
}

/// Answers a caller of the [`Client`]. The send fails only when the caller dropped its
/// receiver (it stopped waiting), so there is nobody to tell; that is logged, not lost.
fn answer<T>(reply: oneshot::Sender<T>, value: T) {
    if reply.send(value).is_err() {
        tracing::debug!("a runtime caller stopped waiting for its answer");
    }
}
