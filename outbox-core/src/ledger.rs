//! The operation ledger (OB-07): status only moves toward stronger proof.
//!
//! | status | replaced by |
//! |---|---|
//! | `failed` | anything |
//! | `sending` | `sent`, `canceled`, `sending` (a newer attempt record); never `failed` |
//! | `canceled` | `sent`; never `sending` (only [`reopen`] restarts it) |
//! | `sent` | nothing (final) |
//!
//! That is a total order `failed < sending < canceled < sent` and [`transition`]
//! applies a proposal only when it is not weaker, so the function is total and monotone
//! (property-tested). When the store cannot be written, a [`MemoryFallback`] of 256
//! records holds them.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};
use timeline_core::time::Millis;

use crate::entry::Acceptance;
use crate::fingerprint::Digest256;
use crate::ids::{OperationId, ScopeId};

/// A ledger status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum LedgerStatus {
    /// The attempt failed before the agent took the message.
    Failed,
    /// A send attempt started; a turn may exist.
    Sending,
    /// The run was stopped before the message was confirmed.
    Canceled,
    /// The agent's history holds the message.
    Sent,
}

impl LedgerStatus {
    /// Strength of the proof.
    pub fn strength(self) -> u8 {
        match self {
            LedgerStatus::Failed => 0,
            LedgerStatus::Sending => 1,
            LedgerStatus::Canceled => 2,
            LedgerStatus::Sent => 3,
        }
    }
}

/// One ledger row, keyed (scope, operation): one row for the base session and its alias.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LedgerRecord {
    /// The status.
    pub status: LedgerStatus,
    /// The turn that accepted the operation, once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acceptance: Option<Acceptance>,
    /// SHA-256 of the normalized text and image paths (Codex).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission_input_digest: Option<Digest256>,
    /// When the row last changed.
    pub updated_at: Millis,
}

impl LedgerRecord {
    /// A record with `status` and nothing else.
    pub fn new(status: LedgerStatus, at: Millis) -> LedgerRecord {
        LedgerRecord {
            status,
            acceptance: None,
            admission_input_digest: None,
            updated_at: at,
        }
    }
}

/// What [`transition`] decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transition {
    /// Store this record.
    Apply(LedgerRecord),
    /// Keep the current record: the proposal is weaker proof.
    Keep,
}

/// The ledger transition function: total over every (current, proposed) pair.
pub fn transition(current: Option<&LedgerRecord>, proposed: LedgerRecord) -> Transition {
    let Some(current) = current else {
        return Transition::Apply(proposed);
    };
    let (c, p) = (current.status, proposed.status);
    let apply = match (c, p) {
        (LedgerStatus::Sent, _) => false,
        (LedgerStatus::Canceled, LedgerStatus::Canceled) => false,
        _ => p.strength() >= c.strength(),
    };
    if !apply {
        return Transition::Keep;
    }
    // A newer record keeps what it does not replace.
    Transition::Apply(LedgerRecord {
        acceptance: proposed.acceptance.or_else(|| current.acceptance.clone()),
        admission_input_digest: proposed
            .admission_input_digest
            .or_else(|| current.admission_input_digest.clone()),
        ..proposed
    })
}

/// The reopen check's one exception (OB-12): a canceled record goes back to `failed`, so
/// the next attempt may record `sending`. Any other record is kept.
pub fn reopen(current: &LedgerRecord, at: Millis) -> Option<LedgerRecord> {
    (current.status == LedgerStatus::Canceled).then(|| LedgerRecord {
        status: LedgerStatus::Failed,
        acceptance: None,
        admission_input_digest: current.admission_input_digest.clone(),
        updated_at: at,
    })
}

/// Records of the memory fallback.
pub const FALLBACK_CAPACITY: usize = 256;

/// Why the fallback refused a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the ledger fallback holds {FALLBACK_CAPACITY} sent proofs and takes no more")]
pub struct FallbackFull;

/// The in-memory ledger used while the store cannot be written (OB-07).
#[derive(Clone, Debug, Default)]
pub struct MemoryFallback {
    records: VecDeque<((ScopeId, OperationId), LedgerRecord)>,
}

impl MemoryFallback {
    /// An empty fallback.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of records held.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The record of (scope, operation).
    pub fn get(&self, scope: &ScopeId, op: &OperationId) -> Option<&LedgerRecord> {
        self.records
            .iter()
            .find(|((s, o), _)| s == scope && o == op)
            .map(|(_, r)| r)
    }

    /// Applies `proposed` by the ledger rules. When full, drops the oldest record that is
    /// not a sent proof; refuses when all 256 are sent proofs.
    pub fn record(
        &mut self,
        scope: &ScopeId,
        op: &OperationId,
        proposed: LedgerRecord,
    ) -> Result<Transition, FallbackFull> {
        let at = self
            .records
            .iter()
            .position(|((s, o), _)| s == scope && o == op);
        let decision = transition(at.map(|i| &self.records[i].1), proposed);
        let Transition::Apply(record) = &decision else {
            return Ok(decision);
        };
        match at {
            Some(i) => self.records[i].1 = record.clone(),
            None => {
                if self.records.len() >= FALLBACK_CAPACITY {
                    let victim = self
                        .records
                        .iter()
                        .position(|(_, r)| r.status != LedgerStatus::Sent)
                        .ok_or(FallbackFull)?;
                    self.records.remove(victim);
                }
                self.records
                    .push_back(((scope.clone(), op.clone()), record.clone()));
            }
        }
        Ok(decision)
    }
}
