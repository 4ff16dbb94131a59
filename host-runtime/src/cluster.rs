//! Several hosts on one PostgreSQL database (feature `cluster`): each host serves the
//! session scopes whose lease it holds, and takes over those of a host that died.
//!
//! A [`Cluster`] runs beside a [`crate::Runtime`] whose host was built with
//! [`host_core::HostConfig::granted_only`] over stores that write under the cluster's
//! leases ([`ClusterBuilder::leases`], given to each store with
//! `PostgresStore::share_leases`), the outbox store also made the shared run registry
//! with `PostgresStore::share_runs` (the host's ID): custody then keeps one active run per
//! session across hosts, adopts the runs a host that lost a scope left behind (its next
//! message waits for them until they may be reclaimed) and resumes the stops it began.
//! Two threads of its own, each with its own connection:
//!
//! - **The lease keeper.** Takes a session's lease when a client asks this host for a
//!   session nobody serves ([`Cluster::route`]) and then grants it to the host
//!   ([`crate::Client::grant_session`]); renews every lease it holds each
//!   [`ClusterConfig::tick`]; registers the host's address; and takes up the orphans:
//!   sessions whose lease lapsed (a host that died) or that have a saved outbox nobody
//!   serves, which the host then reads as a restart does (an in-flight send is confirmed
//!   from history, never sent again blindly). A lease found lost at renewal, or not
//!   renewed within its length because the database could not be reached, is released
//!   on the host at once ([`crate::Client::release_session`]): the host stops serving the
//!   scope and its clients are told (`chat:session-moved`). Writes the host still tries
//!   under a lost lease are refused by the database (the lease's fencing token).
//! - **The watch.** Every lease has a deadline by this process's clock: its length after
//!   the start of its last acquire or renewal that succeeded (so never later than the
//!   database's). A lease not renewed by then (the database hangs, say) is forgotten at
//!   once: the stores refuse its writes before they reach the database, and the host
//!   lets the scope go, even while the keeper still waits on its connection.
//! - **The wake listener.** `LISTEN`s for writes into sessions another host made (a
//!   session message): the owner reads the scope again; a session nobody serves is
//!   taken up. A listener whose connection broke opens a new one and reads every held
//!   scope again (wake-ups meanwhile were lost).
//!
//! # Choices
//!
//! - **A client may connect to any host; a session served elsewhere is answered with
//!   where to go**, not forwarded: the reply is `SESSION_ELSEWHERE` with `servedBy` (the
//!   holder's host ID and the address it registered, [`ClusterConfig::address`]). A
//!   client keeps one connection per host it needs; nothing is proxied twice, and a
//!   host that dies takes no other host's clients with it.
//! - **Every host adds every session it may serve** (`Host::add_session`, with a history
//!   source that reads the same history on every host); [`ClusterBuilder::accept`]
//!   limits which sessions this host takes up.
//! - `run.list` lists this host's runs; an approval decision is answered by the host that
//!   asked for it (a card of a session served elsewhere is unknown here).
//! - A host shut down with [`Cluster::shutdown`] gives its leases back, so others take
//!   its sessions at once instead of after the lease time.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use host_wire::ServedBy;
use outbox_core::store::OutboxError;
use storage_postgres::hosts::{LeaseError, LeaseSet, SessionLease, Wake, WakeListener};
use storage_postgres::{HostId, OpenError, PostgresStore};
use timeline_core::key::SessionId;
use tokio::sync::oneshot;
use tracing::{debug, warn};

use crate::Client;

/// Opens a new connection to the database (the keeper's, the listener's).
pub type Connect = Box<dyn Fn() -> Result<PostgresStore, OpenError> + Send>;

/// How a [`Cluster`] behaves.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ClusterConfig {
    /// This host, unique per running process (a host name with a process ID, say).
    pub host: HostId,
    /// Where clients reach this host, told to clients another host sends here.
    pub address: String,
    /// How often leases are renewed and orphans looked for: well within the lease
    /// length (default: a third of the store's `Leases::session_lease`).
    pub tick: Option<Duration>,
    /// Orphaned sessions taken up per tick at most (default 64).
    pub takeovers_per_tick: usize,
}

impl ClusterConfig {
    /// A host `host` that clients reach at `address`.
    pub fn new(host: HostId, address: impl Into<String>) -> ClusterConfig {
        ClusterConfig {
            host,
            address: address.into(),
            tick: None,
            takeovers_per_tick: 64,
        }
    }
}

/// Where a session is served.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Route {
    /// Here: this host holds the lease and the host serves it.
    Here,
    /// By another host.
    Elsewhere(ServedBy),
    /// Not known now (the database could not be reached): try again.
    Unavailable(String),
}

/// The first step of a [`Cluster`]: its lease set, for the host's stores.
pub struct ClusterBuilder {
    connect: Connect,
    keeper: PostgresStore,
    config: ClusterConfig,
    accept: Box<dyn Fn(&SessionId) -> bool + Send>,
}

impl std::fmt::Debug for ClusterBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterBuilder")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl ClusterBuilder {
    /// The leases the keeper will hold: give them to each of the host's stores
    /// (`PostgresStore::share_leases`) before the host is built, and make the outbox
    /// store the shared run registry (`PostgresStore::share_runs` with this host's ID).
    pub fn leases(&self) -> LeaseSet {
        self.keeper.lease_set()
    }

    /// Takes up only the sessions `accept` says yes to (default: every session).
    #[must_use]
    pub fn accept(mut self, accept: impl Fn(&SessionId) -> bool + Send + 'static) -> Self {
        self.accept = Box::new(accept);
        self
    }

    /// Starts the keeper and the listener for the host `client` drives.
    ///
    /// # Errors
    ///
    /// The database's error when the host cannot be registered or the listener's
    /// connection cannot be opened; or a thread that could not start.
    pub fn start(self, client: Client) -> Result<Cluster, ClusterError> {
        let ClusterBuilder {
            connect,
            mut keeper,
            config,
            accept,
        } = self;
        keeper.register_host(&config.host, &config.address)?;
        let listener = connect()?.into_wake_listener()?;
        let tick = config
            .tick
            .unwrap_or(keeper.settings().leases.session_lease / 3)
            .max(Duration::from_millis(10));
        let (tx, rx) = std_mpsc::sync_channel::<Ask>(1024);
        let wakes = tx.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let listen = std::thread::Builder::new()
            .name("cluster-listener".into())
            .spawn(move || listen(listener, connect, wakes, &stopped))?;
        let leases = keeper.lease_set();
        let deadlines = Deadlines::default();
        let watch = {
            let (deadlines, leases, client) = (deadlines.clone(), leases.clone(), client.clone());
            let stopped = Arc::clone(&stop);
            let io = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let every = (tick / 4).clamp(Duration::from_millis(5), Duration::from_millis(100));
            std::thread::Builder::new()
                .name("cluster-watch".into())
                .spawn(move || watch(&deadlines, &leases, &client, &io, every, &stopped))?
        };
        let io = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let mut state = Keeper {
            deadlines,
            store: keeper,
            client,
            io,
            leases: BTreeMap::new(),
            tick,
            length: Duration::ZERO,
            config,
            accept,
        };
        state.length = state.store.settings().leases.session_lease;
        let keep = std::thread::Builder::new()
            .name("cluster-keeper".into())
            .spawn(move || state.run(rx))?;
        Ok(Cluster {
            tx,
            leases,
            stop,
            threads: Mutex::new(vec![
                ("keeper", keep),
                ("listener", listen),
                ("watch", watch),
            ]),
        })
    }
}

/// Why a cluster could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// A connection could not be opened.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The database refused or failed.
    #[error(transparent)]
    Store(#[from] OutboxError),
    /// A thread or its IO could not start.
    #[error("the cluster could not start: {0}")]
    Start(#[from] std::io::Error),
}

/// A running cluster member. See the module docs.
#[derive(Debug)]
pub struct Cluster {
    tx: std_mpsc::SyncSender<Ask>,
    leases: LeaseSet,
    /// Tells the listener to stop.
    stop: Arc<AtomicBool>,
    /// The keeper, the listener and the watch, until joined.
    threads: Mutex<Vec<(&'static str, std::thread::JoinHandle<()>)>>,
}

/// Each held lease's deadline by this process's clock, shared by the keeper (which sets
/// it) and the watch (which lets a lease past it go).
#[derive(Clone, Debug, Default)]
struct Deadlines(Arc<Mutex<BTreeMap<SessionId, Instant>>>);

impl Deadlines {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<SessionId, Instant>> {
        // One insert or remove at a time: a panic while held leaves the map whole.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

enum Ask {
    Route(SessionId, oneshot::Sender<Route>),
    Wake(Wake),
    /// Every wake-up may have been lost: read every held scope again.
    Reread,
    Stop(oneshot::Sender<()>),
}

impl Cluster {
    /// Opens the keeper's connection through `connect` (called again for the listener's
    /// and whenever the listener's connection breaks).
    ///
    /// # Errors
    ///
    /// The connection could not be opened.
    pub fn builder(connect: Connect, config: ClusterConfig) -> Result<ClusterBuilder, OpenError> {
        let keeper = connect()?;
        Ok(ClusterBuilder {
            connect,
            keeper,
            config,
            accept: Box::new(|_| true),
        })
    }

    /// Where `session` is served; a session nobody serves is taken up here first (its
    /// lease acquired, the host granted it).
    pub async fn route(&self, session: &SessionId) -> Route {
        let (tx, rx) = oneshot::channel();
        if self.tx.try_send(Ask::Route(session.clone(), tx)).is_err() {
            return Route::Unavailable("the lease keeper is busy or stopped".into());
        }
        rx.await
            .unwrap_or_else(|_| Route::Unavailable("the lease keeper stopped".into()))
    }

    /// The base sessions whose lease this host holds.
    pub fn held(&self) -> Vec<SessionId> {
        self.leases.held().into_iter().map(|(s, _)| s).collect()
    }

    /// Gives every lease back (the host stops serving its sessions, and other hosts may
    /// take them at once) and stops the threads. Callable through a shared reference
    /// (the server keeps one); a second call does nothing.
    pub async fn shutdown(&self) {
        let (tx, rx) = oneshot::channel();
        // A blocking send: a keeper with asks queued takes them first (it never waits on
        // this caller). Refused only by a keeper already stopped, with nothing to give back.
        if self.tx.send(Ask::Stop(tx)).is_ok() && rx.await.is_err() {
            warn!("the lease keeper stopped before giving its leases back; they lapse");
        }
        self.join();
    }

    fn join(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let threads = {
            let mut threads = self
                .threads
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            std::mem::take(&mut *threads)
        };
        for (name, thread) in threads {
            if thread.join().is_err() {
                warn!("the cluster's {name} thread panicked");
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let (tx, _rx) = oneshot::channel();
        // Blocking, as in `shutdown`, so the join below cannot wait on a keeper that never
        // heard it; refused only by a keeper already gone, which has nothing to stop.
        if self.tx.send(Ask::Stop(tx)).is_err() {
            debug!("the lease keeper was already stopped");
        }
        self.join();
    }
}

struct Keeper {
    deadlines: Deadlines,
    store: PostgresStore,
    client: Client,
    io: tokio::runtime::Runtime,
    leases: BTreeMap<SessionId, SessionLease>,
    tick: Duration,
    /// The lease length: a lease not renewed this long is gone.
    length: Duration,
    config: ClusterConfig,
    accept: Box<dyn Fn(&SessionId) -> bool + Send>,
}

impl Keeper {
    fn run(mut self, rx: std_mpsc::Receiver<Ask>) {
        let mut next = Instant::now();
        loop {
            let wait = next.saturating_duration_since(Instant::now());
            match rx.recv_timeout(wait) {
                Ok(Ask::Route(session, reply)) => {
                    let route = self.route(&session);
                    debug!(host = %self.config.host, %session, ?route, "routed");
                    if reply.send(route).is_err() {
                        debug!(%session, "the caller stopped waiting for its route");
                    }
                }
                Ok(Ask::Wake(Wake::Session(session))) => self.woken(&session),
                Ok(Ask::Wake(_) | Ask::Reread) => {
                    for session in self.leases.keys().cloned().collect::<Vec<_>>() {
                        self.grant(&session);
                    }
                }
                Ok(Ask::Stop(done)) => {
                    self.give_back();
                    if done.send(()).is_err() {
                        debug!("the shutdown's caller stopped waiting");
                    }
                    return;
                }
                Err(std_mpsc::RecvTimeoutError::Timeout) => {
                    self.tick();
                    next = Instant::now() + self.tick;
                }
                Err(std_mpsc::RecvTimeoutError::Disconnected) => {
                    self.give_back();
                    return;
                }
            }
        }
    }

    fn route(&mut self, session: &SessionId) -> Route {
        let base = outbox_core::ids::base_session(session);
        if self.leases.contains_key(&base) && self.deadlines.lock().contains_key(&base) {
            return Route::Here;
        }
        match self.take(&base) {
            Ok(true) => Route::Here,
            Ok(false) => match self.store.lease_holder(&base) {
                Ok(Some((host, address))) => Route::Elsewhere(ServedBy {
                    host: host.as_str().to_owned(),
                    address,
                }),
                // Released between the two reads: ask again.
                Ok(None) => Route::Unavailable(format!("session {base} is changing hosts")),
                Err(e) => Route::Unavailable(e.to_string()),
            },
            Err(e) => Route::Unavailable(e.to_string()),
        }
    }

    /// Acquires the lease of `base` and grants it to the host; false when another host
    /// holds it.
    fn take(&mut self, base: &SessionId) -> Result<bool, OutboxError> {
        let start = Instant::now();
        match self.store.acquire_session(&self.config.host, base) {
            Ok(lease) => {
                debug!(session = %base, token = lease.token, "lease taken");
                self.deadlines
                    .lock()
                    .insert(base.clone(), start + self.length);
                self.leases.insert(base.clone(), lease);
                self.grant(base);
                Ok(true)
            }
            Err(LeaseError::Busy(_)) => Ok(false),
            Err(LeaseError::Lost(lost)) => Err(OutboxError::LeaseLost {
                message: lost.to_string(),
                session: base.clone(),
            }),
            Err(LeaseError::Store(e)) => Err(e),
            Err(other) => Err(OutboxError::unavailable(other.to_string())),
        }
    }

    fn grant(&mut self, base: &SessionId) {
        let client = self.client.clone();
        let session = base.clone();
        if let Err(e) = self.io.block_on(client.grant_session(session)) {
            warn!(session = %base, error = %e, "the host could not be granted a session");
        }
    }

    fn release(&mut self, base: &SessionId, reason: String) {
        self.leases.remove(base);
        self.deadlines.lock().remove(base);
        let_go_on_host(&self.io, &self.client, base, reason);
    }

    fn woken(&mut self, base: &SessionId) {
        if self.leases.contains_key(base) {
            self.grant(base);
        } else if (self.accept)(base) {
            // A write into a session nobody serves: take it up (another host may win).
            if let Err(e) = self.take(base) {
                debug!(session = %base, error = %e, "a woken session could not be taken");
            }
        }
    }

    fn tick(&mut self) {
        if let Err(e) = self
            .store
            .register_host(&self.config.host, &self.config.address)
        {
            debug!(error = %e, "the host could not be registered");
        }
        for base in self.leases.keys().cloned().collect::<Vec<_>>() {
            let Some(lease) = self.leases.get(&base).cloned() else {
                continue;
            };
            if !self.deadlines.lock().contains_key(&base) {
                // The watch let it go (not renewed in time): give it back.
                self.leases.remove(&base);
                if let Err(e) = self.store.release_session(&lease) {
                    debug!(session = %base, error = %e, "a lapsed lease could not be given back");
                }
                continue;
            }
            let start = Instant::now();
            match self.store.renew_session(&lease) {
                Ok(renewed) => {
                    let mut deadlines = self.deadlines.lock();
                    if let Some(deadline) = deadlines.get_mut(&base) {
                        *deadline = start + self.length;
                        drop(deadlines);
                        self.leases.insert(base, renewed);
                    }
                    // Else the watch let it go during the renewal; the next tick gives
                    // it back.
                }
                Err(LeaseError::Lost(lost)) => self.release(&base, lost.to_string()),
                // The database could not be reached: the watch lets the lease go at its
                // deadline, whatever is heard meanwhile.
                Err(e) => debug!(session = %base, error = %e, "a lease could not be renewed"),
            }
        }
        match self.store.orphaned_sessions(self.config.takeovers_per_tick) {
            Ok(orphans) => {
                for base in orphans {
                    if !(self.accept)(&base) || self.leases.contains_key(&base) {
                        continue;
                    }
                    if let Err(e) = self.take(&base) {
                        debug!(session = %base, error = %e, "an orphan could not be taken");
                    }
                }
            }
            Err(e) => debug!(error = %e, "orphans could not be read"),
        }
    }

    fn give_back(&mut self) {
        for (base, lease) in std::mem::take(&mut self.leases) {
            self.deadlines.lock().remove(&base);
            let_go_on_host(
                &self.io,
                &self.client,
                &base,
                "the host is shutting down".into(),
            );
            if let Err(e) = self.store.release_session(&lease) {
                debug!(session = %base, error = %e, "a lease could not be given back; it lapses");
            }
        }
    }
}

/// Tells the host to stop serving the scope of `base`; a host already gone (its runtime
/// shut down) serves nothing anyway.
fn let_go_on_host(io: &tokio::runtime::Runtime, client: &Client, base: &SessionId, reason: String) {
    if let Err(e) = io.block_on(client.release_session(base.clone(), reason)) {
        debug!(session = %base, error = %e, "the host was gone before the release");
    }
}

/// The watch's loop: a lease past its deadline is forgotten by the stores and let go on
/// the host.
fn watch(
    deadlines: &Deadlines,
    leases: &LeaseSet,
    client: &Client,
    io: &tokio::runtime::Runtime,
    every: Duration,
    stop: &AtomicBool,
) {
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(every);
        let now = Instant::now();
        let lapsed: Vec<SessionId> = {
            let mut deadlines = deadlines.lock();
            let lapsed: Vec<SessionId> = deadlines
                .iter()
                .filter(|(_, at)| **at <= now)
                .map(|(s, _)| s.clone())
                .collect();
            for base in &lapsed {
                deadlines.remove(base);
            }
            lapsed
        };
        for base in lapsed {
            leases.forget(&base);
            warn!(session = %base, "a session lease was not renewed in time; letting it go");
            let reason = "the session's lease could not be renewed in time".to_owned();
            let_go_on_host(io, client, &base, reason);
        }
    }
}

/// The listener's loop: wake-ups to the keeper; a broken connection is opened again.
fn listen(
    mut listener: WakeListener,
    connect: Connect,
    keeper: std_mpsc::SyncSender<Ask>,
    stop: &AtomicBool,
) {
    while !stop.load(Ordering::SeqCst) {
        match listener.wait(Duration::from_millis(250)) {
            Ok(wakes) => {
                for wake in wakes {
                    if keeper.send(Ask::Wake(wake)).is_err() {
                        return;
                    }
                }
            }
            Err(e) => {
                warn!(error = %e, "the wake listener's connection broke; opening a new one");
                loop {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(250));
                    match connect().map(PostgresStore::into_wake_listener) {
                        Ok(Ok(l)) => {
                            listener = l;
                            break;
                        }
                        Ok(Err(e)) => debug!(error = %e, "LISTEN failed"),
                        Err(e) => debug!(error = %e, "the listener could not connect"),
                    }
                }
                if keeper.send(Ask::Reread).is_err() {
                    return;
                }
            }
        }
    }
}
