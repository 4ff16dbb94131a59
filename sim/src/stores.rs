//! The host's stores in the simulation: memory or SQLite, behind failure-injecting
//! wrappers, kept across host crashes.
//!
//! - Memory: one [`MemoryOutboxStore`] and one [`MemoryOverlayStore`] behind shared
//!   handles. The `Host` has no way to hand its stores back when it is dropped, so the
//!   world keeps a second handle to each and gives the next host new handles to the same
//!   stores: a crash loses the host's memory, never the stores'.
//! - SQLite: one temporary file, two connections (outbox and overlays) per host; a crash
//!   drops both and the next host opens the file again. A third connection reads for the
//!   invariant checks.
//!
//! Outbox calls go through `fixtures::failing::FailingStore`, overlay and journal calls
//! through `fixtures::failing::FailingOverlay` (each with its `FaultPlan`), and then
//! through [`Recording`], which notes every overlay saved; the world changes the plans
//! while the host owns the stores.

use outbox_core::ids::ScopeId;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use fixtures::failing::{FailingOverlay, FailingStore, FaultPlan};
use outbox_core::entry::StoredEntry;
use outbox_core::ids::{OperationId, SessionId};
use outbox_core::ledger::LedgerRecord;
use outbox_core::store::{OutboxError, OutboxStore};
use outbox_core::MemoryOutboxStore;
use overlay_core::overlay::Change;
use overlay_core::store::{OverlayError, Update};
use overlay_core::{CleanupJournal, MemoryOverlayStore, OverlayStore, StoredBlock, StoredOverlay};
use storage_sqlite::{Settings, SqliteStore, Synchronous};
use timeline_core::key::{RunId, TargetId};

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Where the outbox lives.
#[derive(Debug)]
pub enum OutboxBackend {
    /// The memory store, shared with the world.
    Memory(Arc<Mutex<MemoryOutboxStore>>),
    /// A connection to the SQLite file.
    Sqlite(Box<SqliteStore>),
}

macro_rules! delegate_outbox {
    ($($name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        impl OutboxStore for OutboxBackend {
            $(fn $name(&mut self, $($arg: $ty),*) -> $ret {
                match self {
                    OutboxBackend::Memory(m) => lock(m).$name($($arg),*),
                    OutboxBackend::Sqlite(s) => s.$name($($arg),*),
                }
            })*
        }
    };
}

fixtures::outbox_store_methods!(delegate_outbox);

/// Where the overlays and the cleanup journal live.
#[derive(Debug)]
pub enum OverlayBackend {
    /// The memory store, shared with the world.
    Memory(Arc<Mutex<MemoryOverlayStore>>),
    /// A connection to the SQLite file.
    Sqlite(Box<SqliteStore>),
}

macro_rules! on_overlay {
    ($self:ident, $s:ident => $call:expr) => {
        match $self {
            OverlayBackend::Memory(m) => {
                let mut guard = lock(m);
                let $s = &mut *guard;
                $call
            }
            OverlayBackend::Sqlite(b) => {
                let $s = b.as_mut();
                $call
            }
        }
    };
}

impl OverlayStore for OverlayBackend {
    fn load(&mut self, s: &SessionId, t: &TargetId) -> Result<Option<StoredOverlay>, OverlayError> {
        on_overlay!(self, x => x.load(s, t))
    }
    fn compare_and_set(
        &mut self,
        s: &SessionId,
        t: &TargetId,
        expected: Option<u64>,
        epoch: u64,
        blocks: Vec<StoredBlock>,
    ) -> Result<StoredOverlay, OverlayError> {
        on_overlay!(self, x => x.compare_and_set(s, t, expected, epoch, blocks))
    }
    fn update(&mut self, s: &SessionId, t: &TargetId, c: &Change) -> Result<Update, OverlayError> {
        on_overlay!(self, x => x.update(s, t, c))
    }
    fn delete(&mut self, s: &SessionId, t: &TargetId) -> Result<bool, OverlayError> {
        on_overlay!(self, x => x.delete(s, t))
    }
    fn targets(&mut self, s: &SessionId) -> Result<Vec<TargetId>, OverlayError> {
        on_overlay!(self, x => x.targets(s))
    }
    fn current_revision(&mut self) -> Result<u64, OverlayError> {
        on_overlay!(self, x => x.current_revision())
    }
}

impl CleanupJournal for OverlayBackend {
    fn add_cleanup(&mut self, s: &SessionId, r: &RunId) -> Result<(), OverlayError> {
        on_overlay!(self, x => x.add_cleanup(s, r))
    }
    fn remove_cleanup(&mut self, s: &SessionId, r: &RunId) -> Result<bool, OverlayError> {
        on_overlay!(self, x => x.remove_cleanup(s, r))
    }
    fn pending_cleanups(
        &mut self,
        s: Option<&SessionId>,
    ) -> Result<Vec<(SessionId, RunId)>, OverlayError> {
        on_overlay!(self, x => x.pending_cleanups(s))
    }
}

/// Every overlay the store saved, by session, target, epoch and revision: the digest of
/// its rows in the form a client holds them ([`overlay_digest`]).
pub type SavedOverlays = BTreeMap<(SessionId, TargetId, u64, u64), u64>;

/// The digest of a client's rows of one overlay, in any order: each row's JSON, by key.
pub fn overlay_digest<'a>(blocks: impl Iterator<Item = &'a timeline_core::Block>) -> u64 {
    let mut rows: Vec<(String, String)> = blocks
        .map(|b| {
            let json = serde_json::to_string(b).unwrap_or_default();
            (b.key().to_string(), json)
        })
        .collect();
    rows.sort();
    let mut digest = 0xcbf2_9ce4_8422_2325_u64;
    for (key, json) in &rows {
        for byte in key.bytes().chain([0]).chain(json.bytes()).chain([0]) {
            digest ^= u64::from(byte);
            digest = digest.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    digest
}

/// An overlay store and cleanup journal that notes every overlay it saved
/// ([`SavedOverlays`]), for the check that a client only ever shows a saved state. It
/// fails nothing: the failing store wraps it, so only a write that went through is noted.
#[derive(Debug)]
pub struct Recording<S> {
    inner: S,
    saved: Arc<Mutex<SavedOverlays>>,
}

impl<S> Recording<S> {
    /// Wraps `inner`, noting into `saved`.
    pub fn new(inner: S, saved: Arc<Mutex<SavedOverlays>>) -> Self {
        Recording { inner, saved }
    }

    fn saved(&self, s: &SessionId, t: &TargetId, o: &timeline_core::wire::LiveOverlay) {
        let digest = overlay_digest(o.blocks.iter());
        lock(&self.saved).insert(
            (s.clone(), t.clone(), o.settlement_epoch, o.revision),
            digest,
        );
    }
}

impl<S: OverlayStore> OverlayStore for Recording<S> {
    fn load(&mut self, s: &SessionId, t: &TargetId) -> Result<Option<StoredOverlay>, OverlayError> {
        self.inner.load(s, t)
    }
    fn compare_and_set(
        &mut self,
        s: &SessionId,
        t: &TargetId,
        expected: Option<u64>,
        epoch: u64,
        blocks: Vec<StoredBlock>,
    ) -> Result<StoredOverlay, OverlayError> {
        let stored = self.inner.compare_and_set(s, t, expected, epoch, blocks)?;
        let client = stored.client_form();
        self.saved(s, t, &client);
        Ok(stored)
    }
    fn update(&mut self, s: &SessionId, t: &TargetId, c: &Change) -> Result<Update, OverlayError> {
        let update = self.inner.update(s, t, c)?;
        if let Update::Written { stored, .. } = &update {
            let client = stored.client_form();
            self.saved(s, t, &client);
        }
        Ok(update)
    }
    fn delete(&mut self, s: &SessionId, t: &TargetId) -> Result<bool, OverlayError> {
        self.inner.delete(s, t)
    }
    fn targets(&mut self, s: &SessionId) -> Result<Vec<TargetId>, OverlayError> {
        self.inner.targets(s)
    }
    fn current_revision(&mut self) -> Result<u64, OverlayError> {
        self.inner.current_revision()
    }
}

impl<S: CleanupJournal> CleanupJournal for Recording<S> {
    fn add_cleanup(&mut self, s: &SessionId, r: &RunId) -> Result<(), OverlayError> {
        self.inner.add_cleanup(s, r)
    }
    fn remove_cleanup(&mut self, s: &SessionId, r: &RunId) -> Result<bool, OverlayError> {
        self.inner.remove_cleanup(s, r)
    }
    fn pending_cleanups(
        &mut self,
        s: Option<&SessionId>,
    ) -> Result<Vec<(SessionId, RunId)>, OverlayError> {
        self.inner.pending_cleanups(s)
    }
}

/// The host as the world runs it.
pub type SimHost = host_core::Host<HostOutbox, HostOverlays>;

/// The outbox store a host owns.
pub type HostOutbox = FailingStore<OutboxBackend>;
/// The overlay store a host owns.
pub type HostOverlays = FailingOverlay<Recording<OverlayBackend>>;

/// Which backend a run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The memory stores.
    Memory,
    /// SQLite on a temporary file.
    Sqlite,
}

/// The stores of one run, outliving every host.
pub struct Stores {
    backend: Backend,
    memory_outbox: Arc<Mutex<MemoryOutboxStore>>,
    memory_overlays: Arc<Mutex<MemoryOverlayStore>>,
    file: Option<(tempfile::TempDir, std::path::PathBuf)>,
    /// A third SQLite connection for the checks.
    observer: Option<SqliteStore>,
    /// The outbox fault plan of the current host.
    pub outbox_plan: Arc<Mutex<FaultPlan>>,
    /// The overlay fault plan (shared by every host).
    pub overlay_plan: Arc<Mutex<FaultPlan>>,
    /// Every overlay the hosts saved.
    pub saved: Arc<Mutex<SavedOverlays>>,
}

impl std::fmt::Debug for Stores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stores")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

fn settings() -> Settings {
    let mut s = Settings::default();
    // A simulated crash drops the process, not the machine's power.
    s.synchronous = Synchronous::Normal;
    s
}

impl Stores {
    /// Empty stores of `backend`.
    ///
    /// # Errors
    ///
    /// The text of a temporary file or SQLite failure.
    pub fn new(backend: Backend) -> Result<Stores, String> {
        let (file, observer) = match backend {
            Backend::Memory => (None, None),
            Backend::Sqlite => {
                let dir = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
                let path = dir.path().join("sim.sqlite");
                let observer = SqliteStore::open(&path, settings())
                    .map_err(|e| format!("open {}: {e}", path.display()))?;
                (Some((dir, path)), Some(observer))
            }
        };
        Ok(Stores {
            backend,
            memory_outbox: Arc::new(Mutex::new(MemoryOutboxStore::new())),
            memory_overlays: Arc::new(Mutex::new(MemoryOverlayStore::new())),
            file,
            observer,
            outbox_plan: Arc::new(Mutex::new(FaultPlan::default())),
            overlay_plan: Arc::new(Mutex::new(FaultPlan::default())),
            saved: Arc::new(Mutex::new(SavedOverlays::new())),
        })
    }

    /// The backend.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The stores for a new host: new handles to the memory stores, or two new
    /// connections to the file. The outbox plan is the new store's.
    ///
    /// # Errors
    ///
    /// The text of a SQLite failure.
    pub fn open(&mut self) -> Result<(HostOutbox, HostOverlays), String> {
        let (outbox, overlays) = match &self.file {
            None => (
                OutboxBackend::Memory(Arc::clone(&self.memory_outbox)),
                OverlayBackend::Memory(Arc::clone(&self.memory_overlays)),
            ),
            Some((_, path)) => {
                let open = || {
                    SqliteStore::open(path, settings())
                        .map(Box::new)
                        .map_err(|e| format!("open {}: {e}", path.display()))
                };
                (
                    OutboxBackend::Sqlite(open()?),
                    OverlayBackend::Sqlite(open()?),
                )
            }
        };
        let outbox = FailingStore::new(outbox);
        // The new store counts its calls from zero; the world keeps its plan.
        self.outbox_plan = outbox.plan();
        Ok((
            outbox,
            FailingOverlay::with_shared_plan(
                Recording::new(overlays, Arc::clone(&self.saved)),
                Arc::clone(&self.overlay_plan),
            ),
        ))
    }

    /// Runs `f` on the outbox store as it is (no fault), for the checks.
    pub fn with_outbox<T>(&mut self, f: impl FnOnce(&mut dyn OutboxStore) -> T) -> T {
        match &mut self.observer {
            Some(s) => f(s),
            None => f(&mut *lock(&self.memory_outbox)),
        }
    }

    /// Runs `f` on the overlay store as it is (no fault), for the checks.
    pub fn with_overlays<T>(&mut self, f: impl FnOnce(&mut dyn OverlayStore) -> T) -> T {
        match &mut self.observer {
            Some(s) => f(s),
            None => f(&mut *lock(&self.memory_overlays)),
        }
    }

    /// The saved outbox of `session`, for the checks.
    ///
    /// # Errors
    ///
    /// The store's error.
    pub fn entries(&mut self, session: &SessionId) -> Result<Vec<StoredEntry>, OutboxError> {
        self.with_outbox(|s| s.entries(session))
    }

    /// The saved ledger row of `op`, for the checks.
    ///
    /// # Errors
    ///
    /// The store's error.
    pub fn ledger(
        &mut self,
        session: &SessionId,
        op: &OperationId,
    ) -> Result<Option<LedgerRecord>, OutboxError> {
        self.with_outbox(|s| s.ledger(&ScopeId::of(session), op))
    }

    /// Heals both plans.
    pub fn heal(&mut self) {
        lock(&self.outbox_plan).heal();
        lock(&self.overlay_plan).heal();
    }

    /// Sets one fault in the outbox plan (see `FaultPlan`).
    pub fn outbox_fault(&mut self, f: impl FnOnce(&mut FaultPlan)) {
        f(&mut lock(&self.outbox_plan));
    }

    /// Sets one fault in the overlay plan.
    pub fn overlay_fault(&mut self, f: impl FnOnce(&mut FaultPlan)) {
        f(&mut lock(&self.overlay_plan));
    }

    /// Failures injected into the current outbox store and every overlay store.
    pub fn injected(&self) -> (u64, u64) {
        (
            lock(&self.outbox_plan).injected,
            lock(&self.overlay_plan).injected,
        )
    }
}
