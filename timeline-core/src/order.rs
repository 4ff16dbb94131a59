//! The canonical order of rows (TL-04, TL-05): timestamp, then `sourceOrder` element by
//! element (a prefix sorts first; a row without `sourceOrder` sorts after rows that have
//! one), then the identity key. Arrival order never decides.
//!
//! [`OrderKey`] is a total order (reflexive, antisymmetric, transitive), so sorting with
//! it never panics; the property tests in `tests/order.rs` check the laws.

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

use crate::key::BlockKey;
use crate::time::Millis;

/// A short list of numbers that ranks rows with equal timestamps. The first number ranks
/// the source: `0` history, `2` live, `3` synthetic. Use the constructors; each is one
/// form of the seed's table.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(transparent)]
pub struct SourceOrder(Vec<u64>);

impl SourceOrder {
    /// Paginated history (Codex and Claude pages): `[0, 1, ordinal, entryIndex]`.
    pub fn history(ordinal: u64, entry_index: u64) -> SourceOrder {
        SourceOrder(vec![0, 1, ordinal, entry_index])
    }

    /// A legacy Codex `thread/resume` read: `[0, 0, position, entryIndex]`.
    pub fn legacy_codex(position: u64, entry_index: u64) -> SourceOrder {
        SourceOrder(vec![0, 0, position, entry_index])
    }

    /// A live row: `[2, sequence]`, the sequence assigned once when the row first entered
    /// its run.
    pub fn live(sequence: u64) -> SourceOrder {
        SourceOrder(vec![2, sequence])
    }

    /// The status row of an active run: `[2, startedAtMs]`, so every rebuild places it
    /// the same way.
    pub fn active_run_status(started_at: Millis) -> SourceOrder {
        SourceOrder(vec![2, started_at.as_u64()])
    }

    /// A row the host made without a transcript item or a live event: `[3, sequence]`.
    pub fn synthetic(sequence: u64) -> SourceOrder {
        SourceOrder(vec![3, sequence])
    }

    /// Any vector, as read from the wire.
    pub fn from_raw(parts: Vec<u64>) -> SourceOrder {
        SourceOrder(parts)
    }

    /// The numbers.
    pub fn as_slice(&self) -> &[u64] {
        &self.0
    }
}

/// The sort key of one row: timestamp, source order, identity key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OrderKey {
    /// When the row happened.
    pub timestamp: Millis,
    /// The tie-breaker from the host, if any.
    pub source_order: Option<SourceOrder>,
    /// The identity key, the last tie-breaker.
    pub key: BlockKey,
}

/// Compares two optional source orders: element by element, and a missing order sorts
/// after a present one.
pub fn cmp_source_order(a: Option<&SourceOrder>, b: Option<&SourceOrder>) -> Ordering {
    match (a, b) {
        (Some(a), Some(b)) => a.cmp(b),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    }
}

impl Ord for OrderKey {
    fn cmp(&self, other: &Self) -> Ordering {
        self.timestamp
            .cmp(&other.timestamp)
            .then_with(|| cmp_source_order(self.source_order.as_ref(), other.source_order.as_ref()))
            .then_with(|| self.key.cmp(&other.key))
    }
}

impl PartialOrd for OrderKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::BlockType;

    fn key(id: &str) -> BlockKey {
        BlockKey::parse(BlockType::AgentReply, id).unwrap()
    }

    // TL-05
    #[test]
    fn constructors_build_the_seed_forms() {
        assert_eq!(SourceOrder::history(7, 2).as_slice(), &[0, 1, 7, 2]);
        assert_eq!(SourceOrder::legacy_codex(7, 2).as_slice(), &[0, 0, 7, 2]);
        assert_eq!(SourceOrder::live(41).as_slice(), &[2, 41]);
        assert_eq!(
            SourceOrder::active_run_status(Millis(1_700_000_000_123)).as_slice(),
            &[2, 1_700_000_000_123]
        );
        assert_eq!(SourceOrder::synthetic(3).as_slice(), &[3, 3]);
    }

    // TL-04
    #[test]
    fn history_sorts_before_live_at_equal_time_and_a_prefix_first() {
        let t = Millis(10);
        let hist = OrderKey {
            timestamp: t,
            source_order: Some(SourceOrder::history(1, 0)),
            key: key("z"),
        };
        let live = OrderKey {
            timestamp: t,
            source_order: Some(SourceOrder::live(1)),
            key: key("a"),
        };
        let none = OrderKey {
            timestamp: t,
            source_order: None,
            key: key("0"),
        };
        let prefix = OrderKey {
            timestamp: t,
            source_order: Some(SourceOrder::from_raw(vec![2])),
            key: key("b"),
        };
        assert!(hist < live);
        assert!(live < none, "no sourceOrder sorts after rows that have one");
        assert!(prefix < live, "a prefix sorts first");
        let earlier = OrderKey {
            timestamp: Millis(9),
            source_order: None,
            key: key("zz"),
        };
        assert!(earlier < hist, "timestamp decides first");
    }
}
