//! The overlay reducer: changes and settlement (OV-01 to OV-04).
//!
//! Every change to a target's overlay is a [`Change`] value. [`apply`] computes the next
//! rows and what changed from the current [`crate::rows::OverlayRows`] (a pure function that knows no
//! store), and a store applies that result: [`crate::store::write`] stores it through
//! [`crate::store::OverlayStore::update`], which re-applies the change to the current
//! overlay when another writer got there first. So a stale writer
//! never overwrites, and the rules below hold whatever the interleaving:
//!
//! - the settlement epoch rises only in a write that removes at least one ordinary row
//!   because history now holds its key (OV-04), or in the write that tells every
//!   client history lost rows (OV-10); ephemeral removals and retractions never raise
//!   it;
//! - a newer status row replaces the target's other status rows; a progress mirror from
//!   one run replaces mirrors from other runs; a latest window drops status rows,
//!   compacting markers and mirrors of runs that are not the current run; the Codex
//!   post-run cleanup removes every ephemeral row of its run; approval cards leave only
//!   with that cleanup (OV-03);
//! - an overlay that becomes empty is still stored, so the target keeps its epoch and
//!   revision (OV-02).
//!
//! # Cost
//!
//! [`apply`] touches only the rows the change names or the rules remove: a lookup by
//! key for each published, retracted or settled key, and a range of the class index for
//! each class rule, each O(log n) in the overlay's n rows. A publish of k rows costs
//! O(k log n), a latest window O((h + e) log n) for h keys on its page and e ephemeral
//! rows it removes. The version it starts from is shared, never copied, and the result
//! is equal, row for row and in order, to rebuilding the whole overlay the naive way
//! (`fixtures::naive_overlay` is that reference; `tests/indexed_overlay.rs`
//! and the storage conformance suite check it on random writes).

pub(crate) mod reducer;

pub use reducer::{apply, Change, LiveSequencer, Next};
// The write of a change, at the path it had before the reducer and the store were
// separated: it lives in the store, which applies what the reducer produced.
pub use crate::store::{write, WriteResult};
