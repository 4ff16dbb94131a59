//! Storage traits of message custody, with the in-memory reference implementation in
//! [`memory`].
//!
//! One trait, [`OutboxStore`], covers the four aggregates that must change together:
//! the outbox (`workspace_chat_outbox`), operation identities
//! (`workspace_chat_outbox_operation_identity`), the operation ledger
//! (`chat_operation_ledger`) and session-message routes (`chat_session_messages`).
//!
//! Every method is one transaction. The multi-record rules:
//! - [`OutboxStore::claim`]: the (session, operation) identity with its fingerprint and
//!   the entry are written together, or nothing is written and the existing identity is
//!   returned (OB-03);
//! - [`OutboxStore::claim_session_message`]: the route (unique per sender session and
//!   sender call), the identity and the entry together (OB-16);
//! - [`OutboxStore::confirm_sent`]: the scope's ledger says sent, then the operation
//!   leaves the outbox of each member named, in one transaction (OB-06, OB-08);
//! - [`OutboxStore::rekey_entry`]: an edit claims the new operation and rewrites the
//!   entry together (OB-11);
//! - [`OutboxStore::claim_sending`]: a claim whose entry goes out at once also records
//!   the hand-off (entry `sending`, ledger `sending`) in the same transaction, so a
//!   message that finds its session idle costs one commit to save and hand off;
//! - [`OutboxStore::replace_entry_with_ledger`]: an entry change and the ledger row that
//!   goes with it (the hand-off, an acceptance, a cancel) together;
//! - removing an entry keeps its identity row, marked removed, so the operation can
//!   never be created again (OB-03).
//!
//! A stored entry that cannot be decoded comes back as [`StoredEntry::Blocked`], never as
//! an error that hides the rest of the outbox and never dropped (OB-05).

pub mod memory;

/// An outbox row as a backend read it back: the key columns (queue ID, operation ID,
/// position) it keeps apart from the rest of the entry's JSON, and why a column did not
/// read back, if one did not (`refused`: the row then shows as blocked, OB-05, and its
/// neighbours read as usual). Every backend reads its rows into this and decodes them
/// the same way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryColumns {
    /// The queue ID (as stored when it does not read back).
    pub queue_id: String,
    /// The operation ID (empty when it does not read back).
    pub operation_id: String,
    /// The position ([`EntryColumns::UNREADABLE_POSITION`] when it does not read back).
    pub position: i64,
    /// The rest of the entry's JSON.
    pub json: String,
    /// Why a column did not read back, with what it holds.
    pub refused: Option<String>,
}

impl EntryColumns {
    /// The position a blocked entry shows when its position column does not read back:
    /// after every entry whose position does.
    pub const UNREADABLE_POSITION: i64 = i64::MAX;

    /// The entry: the JSON with the columns put back ([`OutboxEntry::from_row`]).
    ///
    /// # Errors
    ///
    /// Why not: a column refused as it was read, or the decoder's text.
    pub fn decode(&self) -> Result<OutboxEntry, String> {
        if let Some(reason) = &self.refused {
            return Err(reason.clone());
        }
        OutboxEntry::from_row(
            &self.queue_id,
            &self.operation_id,
            self.position,
            &self.json,
        )
    }

    /// What a session's outbox shows for the row: the entry, or a blocked entry when
    /// the row does not decode ([`StoredEntry::from_row`]).
    pub fn into_stored(self) -> StoredEntry {
        StoredEntry::from_row(
            self.queue_id,
            self.operation_id,
            self.position,
            &self.json,
            self.refused,
        )
    }
}

mod shared_runs;
pub use shared_runs::{SharedCancellation, SharedRun, SharedRuns, SharedScope};

use serde::{Deserialize, Serialize};
use timeline_core::time::Millis;

use crate::entry::{OutboxEntry, StoredEntry};
use crate::fingerprint::Digest256;
use crate::ids::{CallId, OperationId, QueueId, RunId, ScopeId, SessionId, ThreadId};
use crate::ledger::LedgerRecord;

/// The identity row of an operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Identity {
    /// The request fingerprint it was claimed with.
    pub fingerprint: Digest256,
    /// Its entry.
    pub queue_id: QueueId,
    /// True once its entry was removed (sent, deleted or replaced by an edit).
    pub removed: bool,
}

/// What a claim found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// The identity and the entry were written.
    Claimed,
    /// The operation was claimed before; nothing was written.
    Existing(Identity),
}

/// Delivery of a session message, as the sender's row shows it (OB-16).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RouteDelivery {
    /// In the recipient's custody, going to its agent.
    Sent,
    /// Waiting for the user's approval.
    NeedsApproval,
    /// The user removed it from the queue.
    Declined,
}

/// One row of `chat_session_messages`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionMessageRoute {
    /// Primary key.
    pub operation_id: OperationId,
    /// The recipient session.
    pub recipient_session_id: SessionId,
    /// The sender session.
    pub sender_session_id: SessionId,
    /// The sender's tool call (unique with the sender session).
    pub sender_call_id: CallId,
    /// The sender's run.
    pub sender_run_id: Option<RunId>,
    /// The agent thread that sent it.
    pub sender_thread_id: Option<ThreadId>,
    /// The exchange.
    pub chain_id: String,
    /// Hop in the exchange.
    pub hop: u32,
    /// When it was saved.
    pub created_at: Millis,
    /// Delivery as the sender sees it.
    pub delivery: RouteDelivery,
}

/// What a session-message claim found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteClaim {
    /// Route, identity and entry were written.
    Claimed,
    /// The sender's call already has a route; nothing was written.
    ExistingCall(SessionMessageRoute),
}

/// A backend's own error, shared so [`OutboxError`] stays cheap to clone.
pub type BackendError = std::sync::Arc<dyn std::error::Error + Send + Sync + 'static>;

/// Why a store call failed. [`OutboxError::kind`] groups the variants by what the caller
/// does: retry later, show the damaged record, or resolve a conflict.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum OutboxError {
    /// The backend could not be read or written now; retry later.
    Unavailable {
        /// What failed, for the user.
        message: String,
        /// The backend's own error, when there is one (also [`std::error::Error::source`]).
        source: Option<BackendError>,
    },
    /// A stored row could not be decoded.
    Corrupt {
        /// Which row.
        what: String,
        /// The decoder's message.
        reason: String,
    },
    /// An operation ID that was claimed already (edit to a used operation).
    OperationTaken(OperationId),
    /// A queue ID that holds another operation's entry.
    QueueTaken(QueueId),
    /// This host does not hold the lease of the session's scope (it expired, another
    /// host took it over, or it was never granted): the write was refused and nothing
    /// was written. Custody lets the scope go at once and never retries it; the host
    /// that holds the lease serves it.
    LeaseLost {
        /// The base session of the scope.
        session: SessionId,
        /// What happened, for the user or the log.
        message: String,
    },
}

/// What a caller does about an [`OutboxError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum OutboxErrorKind {
    /// Retry later: the backend is down, busy or refused the write.
    Unavailable,
    /// Show the record as damaged; retrying reads the same bytes.
    Corrupt,
    /// The request conflicts with what is stored: ask for another ID.
    Conflict,
    /// Another host serves the session now: let it go, never retry.
    LeaseLost,
}

impl OutboxError {
    /// The backend is unavailable, with no error of its own to carry.
    pub fn unavailable(message: impl Into<String>) -> OutboxError {
        OutboxError::Unavailable {
            message: message.into(),
            source: None,
        }
    }

    /// The backend failed with `error`; it stays reachable through `source()`.
    pub fn backend(error: impl std::error::Error + Send + Sync + 'static) -> OutboxError {
        OutboxError::Unavailable {
            message: error.to_string(),
            source: Some(std::sync::Arc::new(error)),
        }
    }

    /// What the caller does about it.
    pub fn kind(&self) -> OutboxErrorKind {
        match self {
            OutboxError::Unavailable { .. } => OutboxErrorKind::Unavailable,
            OutboxError::Corrupt { .. } => OutboxErrorKind::Corrupt,
            OutboxError::OperationTaken(_) | OutboxError::QueueTaken(_) => {
                OutboxErrorKind::Conflict
            }
            OutboxError::LeaseLost { .. } => OutboxErrorKind::LeaseLost,
        }
    }
}

impl std::fmt::Display for OutboxError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OutboxError::Unavailable { message, .. } => {
                write!(f, "outbox store unavailable: {message}")
            }
            OutboxError::Corrupt { what, reason } => {
                write!(f, "stored {what} cannot be decoded: {reason}")
            }
            OutboxError::OperationTaken(op) => write!(f, "operation {op} was already claimed"),
            OutboxError::QueueTaken(q) => write!(f, "queue entry {q} holds another operation"),
            OutboxError::LeaseLost { message, .. } => write!(f, "session lease lost: {message}"),
        }
    }
}

impl std::error::Error for OutboxError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OutboxError::Unavailable {
                source: Some(source),
                ..
            } => Some(source.as_ref()),
            _ => None,
        }
    }
}

/// Two errors are equal when they say the same (the backend's error is compared by its
/// text).
impl PartialEq for OutboxError {
    fn eq(&self, other: &OutboxError) -> bool {
        match (self, other) {
            (
                OutboxError::Unavailable { message: a, .. },
                OutboxError::Unavailable { message: b, .. },
            ) => a == b,
            (
                OutboxError::Corrupt { what: a, reason: r },
                OutboxError::Corrupt { what: b, reason: t },
            ) => a == b && r == t,
            (OutboxError::OperationTaken(a), OutboxError::OperationTaken(b)) => a == b,
            (OutboxError::QueueTaken(a), OutboxError::QueueTaken(b)) => a == b,
            (
                OutboxError::LeaseLost {
                    session: a,
                    message: m,
                },
                OutboxError::LeaseLost {
                    session: b,
                    message: n,
                },
            ) => a == b && m == n,
            _ => false,
        }
    }
}

impl Eq for OutboxError {}

/// Outbox, identities, ledger and session-message routes. Every method is one
/// transaction; see the module docs for the multi-record rules.
pub trait OutboxStore {
    /// The run registry this store shares with other hosts, when it is one of several
    /// hosts' stores ([`SharedRuns`]). `None` (the default): custody's runs
    /// live in its own memory alone, the seed's design for one host.
    fn shared_runs(&mut self) -> Option<&mut dyn SharedRuns> {
        None
    }

    /// Claims (session, operation) with `fingerprint` and writes `entry`, or returns the
    /// existing identity and writes nothing. A queue ID that already holds another
    /// operation's entry is [`OutboxError::QueueTaken`], and nothing is written.
    fn claim(
        &mut self,
        session: &SessionId,
        fingerprint: &Digest256,
        entry: &OutboxEntry,
    ) -> Result<Claim, OutboxError>;

    /// [`OutboxStore::claim`], and when it claimed, the ledger row of
    /// (`scope`, the entry's operation) becomes `record`, in the same
    /// transaction. The default calls the two methods one after the other; a backend
    /// with transactions must override it so both or neither are written.
    fn claim_sending(
        &mut self,
        session: &SessionId,
        fingerprint: &Digest256,
        entry: &OutboxEntry,
        scope: &ScopeId,
        record: &LedgerRecord,
    ) -> Result<Claim, OutboxError> {
        let claim = self.claim(session, fingerprint, entry)?;
        if claim == Claim::Claimed {
            self.put_ledger(scope, &entry.operation_id, record)?;
        }
        Ok(claim)
    }

    /// [`OutboxStore::replace_entry`], and when it replaced, the ledger row of
    /// (`scope`, `new`'s operation) becomes `record`, in the same transaction.
    /// The default calls the two methods one after the other; a backend with
    /// transactions must override it so both or neither are written.
    fn replace_entry_with_ledger(
        &mut self,
        session: &SessionId,
        expected: &OutboxEntry,
        new: &OutboxEntry,
        scope: &ScopeId,
        record: &LedgerRecord,
    ) -> Result<bool, OutboxError> {
        if !self.replace_entry(session, expected, new)? {
            return Ok(false);
        }
        self.put_ledger(scope, &new.operation_id, record)?;
        Ok(true)
    }

    /// Writes the route, the identity and the entry of a session message, or returns
    /// the existing route of the sender's call and writes nothing.
    fn claim_session_message(
        &mut self,
        recipient: &SessionId,
        fingerprint: &Digest256,
        entry: &OutboxEntry,
        route: &SessionMessageRoute,
    ) -> Result<RouteClaim, OutboxError>;

    /// The identity row of (session, operation).
    fn identity(
        &mut self,
        session: &SessionId,
        op: &OperationId,
    ) -> Result<Option<Identity>, OutboxError>;

    /// The session's outbox in queue order; undecodable rows come back blocked.
    fn entries(&mut self, session: &SessionId) -> Result<Vec<StoredEntry>, OutboxError>;

    /// Every session with a saved outbox entry.
    fn outbox_sessions(&mut self) -> Result<Vec<SessionId>, OutboxError>;

    /// Replaces `expected` with `new` (same queue ID) only while the stored entry still
    /// equals `expected`. False when it changed or is gone.
    fn replace_entry(
        &mut self,
        session: &SessionId,
        expected: &OutboxEntry,
        new: &OutboxEntry,
    ) -> Result<bool, OutboxError>;

    /// An edit: claims `new.operation_id` with `fingerprint`, marks the old operation
    /// removed and rewrites the entry, only while it still equals `expected`.
    /// `Ok(false)` when the entry changed; [`OutboxError::OperationTaken`] when the new
    /// operation was claimed before.
    fn rekey_entry(
        &mut self,
        session: &SessionId,
        expected: &OutboxEntry,
        fingerprint: &Digest256,
        new: &OutboxEntry,
    ) -> Result<bool, OutboxError>;

    /// Removes the entry `queue_id`; its identity stays, marked removed.
    fn remove_entry(
        &mut self,
        session: &SessionId,
        queue_id: &QueueId,
    ) -> Result<Option<OutboxEntry>, OutboxError>;

    /// Sets the position of each listed entry (a renumbering of the queue).
    fn set_positions(
        &mut self,
        session: &SessionId,
        positions: &[(QueueId, i64)],
    ) -> Result<(), OutboxError>;

    /// The ledger row of (scope, operation). The ledger is the scope's: an operation has
    /// one row whichever member of the scope holds its entry.
    fn ledger(
        &mut self,
        scope: &ScopeId,
        op: &OperationId,
    ) -> Result<Option<LedgerRecord>, OutboxError>;

    /// Stores a ledger row (the caller applied [`crate::ledger::transition`]).
    fn put_ledger(
        &mut self,
        scope: &ScopeId,
        op: &OperationId,
        record: &LedgerRecord,
    ) -> Result<(), OutboxError>;

    /// One transaction: the ledger of (`scope`, `op`) becomes `record` (sent), then
    /// every entry of `op` in each of `members`, the sessions of the scope that may hold
    /// it, is removed (identities marked removed). A session of another scope among
    /// `members` is passed over; with no member, only the ledger row is written.
    /// Returns what was removed.
    fn confirm_sent(
        &mut self,
        scope: &ScopeId,
        members: &[SessionId],
        op: &OperationId,
        record: &LedgerRecord,
    ) -> Result<Vec<(SessionId, QueueId)>, OutboxError>;

    /// The route of a session message.
    fn route(&mut self, op: &OperationId) -> Result<Option<SessionMessageRoute>, OutboxError>;

    /// Updates a route's delivery.
    fn set_route_delivery(
        &mut self,
        op: &OperationId,
        delivery: RouteDelivery,
    ) -> Result<(), OutboxError>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    // A backend's error stays reachable, and each variant is grouped by what the caller
    // does about it.
    #[test]
    fn errors_carry_their_source_and_say_what_to_do() {
        let io = std::io::Error::other("disk I/O error");
        let e = OutboxError::backend(io);
        assert_eq!(e.kind(), OutboxErrorKind::Unavailable);
        assert_eq!(e.to_string(), "outbox store unavailable: disk I/O error");
        assert_eq!(
            e.source().map(ToString::to_string).as_deref(),
            Some("disk I/O error")
        );
        assert!(OutboxError::unavailable("busy").source().is_none());
        let corrupt = OutboxError::Corrupt {
            what: "entry".into(),
            reason: "bad".into(),
        };
        assert_eq!(corrupt.kind(), OutboxErrorKind::Corrupt);
        let op = OperationId::new("op-1").expect("id");
        assert_eq!(
            OutboxError::OperationTaken(op).kind(),
            OutboxErrorKind::Conflict
        );
        let q = QueueId::new("q-1").expect("id");
        assert_eq!(OutboxError::QueueTaken(q).kind(), OutboxErrorKind::Conflict);
    }
}
