//! Benchmarks of the workspace. The criterion benches live in `benches/`; each one runs
//! our implementation side by side with a baseline in the same run, and `README.md` in
//! this folder records the measured tables and the commands that produced them.
//!
//! This library holds the baselines the benches compare against, so they are compiled
//! and tested like any other code.

pub mod baseline;
pub mod custody;
pub mod storage;

use std::cmp::Ordering;
use std::collections::HashMap;

use timeline_core::block::Block;
use timeline_core::key::BlockKey;
use timeline_core::order::cmp_source_order;

/// Canonical order of two blocks without building sort keys (TL-04).
pub fn cmp_blocks(a: &Block, b: &Block) -> Ordering {
    a.timestamp
        .cmp(&b.timestamp)
        .then_with(|| cmp_source_order(a.source_order.as_ref(), b.source_order.as_ref()))
        .then_with(|| {
            a.block_type
                .as_str()
                .cmp(b.block_type.as_str())
                .then_with(|| a.id.as_str().cmp(b.id.as_str()))
        })
}

/// The naive client view: collect every history and live row, keep one per key
/// (history wins), sort. What a client does when it rebuilds its list on each update.
pub fn naive_rebuild<'a>(history: &'a [Block], live: &'a [Block]) -> Vec<&'a Block> {
    let mut by_key: HashMap<BlockKey, &'a Block> =
        HashMap::with_capacity(history.len() + live.len());
    for b in live {
        by_key.insert(b.key(), b);
    }
    for b in history {
        by_key.insert(b.key(), b);
    }
    let mut rows: Vec<&Block> = by_key.into_values().collect();
    rows.sort_unstable_by(|a, b| cmp_blocks(a, b));
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use timeline_core::key::BlockType;
    use timeline_core::order::SourceOrder;
    use timeline_core::time::Millis;

    #[test]
    fn naive_rebuild_keeps_history_and_sorts() {
        let k = |id: &str| BlockKey::parse(BlockType::AgentReply, id).unwrap();
        let h = vec![Block::new(k("b"), Millis(2)).with_source_order(SourceOrder::history(2, 0))];
        let l = vec![
            Block::new(k("b"), Millis(2)).with_source_order(SourceOrder::live(1)),
            Block::new(k("a"), Millis(1)).with_source_order(SourceOrder::live(2)),
        ];
        let rows = naive_rebuild(&h, &l);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].id.as_str(), "a");
        assert_eq!(rows[1].source_order, Some(SourceOrder::history(2, 0)));
        for w in rows.windows(2) {
            assert_eq!(
                cmp_blocks(w[0], w[1]),
                w[0].order_key().cmp(&w[1].order_key())
            );
        }
    }
}
