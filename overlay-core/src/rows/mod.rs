//! The indexed overlay: one target's live rows by key, in canonical order (TL-04), and
//! the ephemeral rows by class and run (OV-03), as persistent maps that share what two
//! versions have in common.
//!
//! [`OverlayRows`] is the representation the memory store keeps, the SQLite store keeps
//! beside its per-row table, and a [`Snapshot`] hands to a caller. Cloning it is O(1);
//! an insert or a removal costs O(log n) and copies only its path, so
//! [`crate::overlay::apply`] builds the next version of an n-row overlay in
//! O(k log n) for k changed rows while the version before stays whole for whoever holds
//! it. What changed is a [`Changes`] value: the rows a store writes and a patch carries.
//!
//! Invariants: one row per key; `by_order`, `by_key` and `ephemeral` always index the
//! same rows (`tests/indexed_overlay.rs` checks them against the naive overlay after
//! every write).
//!
//! Each row also remembers, once asked, the size of its wire block serialized as JSON,
//! so a latest window counts its overlay's bytes for the 8 MiB cap in O(n) additions
//! instead of serializing every row again ([`OverlayRows::client_blocks_json_len`]). The
//! size is a function of the row, kept in the row's shared entry: a version that shares
//! the entry shares the size, and a changed row is a new entry that has none yet.

mod tree;

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};
use timeline_core::block::Block;
use timeline_core::key::{BlockKey, RunId};
use timeline_core::order::OrderKey;
use timeline_core::wire::LiveOverlay;

use tree::PMap;

/// The stored format version (OV-01).
pub const FORMAT_VERSION: u32 = 2;

/// What kind of live row a block is (OV-03). Ordinary rows have a saved counterpart in
/// the agent's history; the others are ephemeral and no history row ever replaces them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub enum RowClass {
    /// A row whose key will appear in saved history (message, reply, command, tool call).
    Ordinary,
    /// The `thinking-<runId>` status row of a run.
    Status,
    /// The marker shown while the agent compacts its context.
    CompactingMarker,
    /// A copy of a child thread's progress in the parent conversation.
    ProgressMirror,
    /// An activity row with an approval field.
    ApprovalCard,
}

impl RowClass {
    /// True for every class but [`RowClass::Ordinary`].
    pub fn is_ephemeral(self) -> bool {
        !matches!(self, RowClass::Ordinary)
    }
}

/// A live row with its settlement metadata (stays on the host).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredBlock {
    /// The wire block clients receive.
    pub block: Block,
    /// Its class.
    pub class: RowClass,
    /// The run that wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<RunId>,
}

/// One target's overlay as stored (format version 2): the whole form, as a load returns
/// it and a stale compare-and-set reports it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredOverlay {
    /// Always [`FORMAT_VERSION`].
    pub format_version: u32,
    /// Rises only when an ordinary row leaves because history holds its key (OV-04).
    pub settlement_epoch: u64,
    /// From the global counter.
    pub revision: u64,
    /// The rows, in canonical order.
    pub blocks: Vec<StoredBlock>,
}

impl StoredOverlay {
    /// What a client receives: `{settlementEpoch, revision, blocks}` with wire blocks
    /// only; classes and runs stay on the host.
    pub fn client_form(&self) -> LiveOverlay {
        LiveOverlay {
            settlement_epoch: self.settlement_epoch,
            revision: self.revision,
            blocks: self.blocks.iter().map(|b| b.block.clone()).collect(),
        }
    }
}

/// The key of an ephemeral row in the class index: class, run, row key.
type EphemeralKey = (u8, Option<RunId>, BlockKey);

/// The place of a class in the ephemeral index; `None` for ordinary rows.
fn class_rank(class: RowClass) -> Option<u8> {
    match class {
        RowClass::Ordinary => None,
        RowClass::Status => Some(0),
        RowClass::CompactingMarker => Some(1),
        RowClass::ProgressMirror => Some(2),
        RowClass::ApprovalCard => Some(3),
    }
}

/// Which runs a class query takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runs<'a> {
    /// Rows of every run (and rows without one).
    Any,
    /// Rows of this run (`None`: rows without a run).
    Of(Option<&'a RunId>),
    /// Rows of every other run (`None`: rows that have a run).
    NotOf(Option<&'a RunId>),
}

/// A row as the order index keeps it: the row, and the size of its wire block as JSON
/// once it was asked for (0: not yet; no block serializes to nothing).
struct Row {
    stored: StoredBlock,
    json_len: AtomicUsize,
}

impl Row {
    fn new(stored: StoredBlock) -> Self {
        Row {
            stored,
            json_len: AtomicUsize::new(0),
        }
    }

    /// The size of `serde_json::to_vec(&self.stored.block)`, counted once.
    fn json_len(&self) -> usize {
        match self.json_len.load(Ordering::Relaxed) {
            0 => {
                let len = block_json_len(&self.stored.block);
                self.json_len.store(len, Ordering::Relaxed);
                len
            }
            len => len,
        }
    }
}

impl PartialEq for Row {
    /// Rows are equal when their stored forms are (the size follows from them).
    fn eq(&self, other: &Self) -> bool {
        self.stored == other.stored
    }
}

/// Counts the bytes written to it and keeps none.
struct ByteCount(usize);

impl std::io::Write for ByteCount {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 = self.0.saturating_add(buf.len());
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The size of `value` serialized as JSON (compact, exactly what `serde_json::to_vec`
/// writes), counted without building the text.
pub(crate) fn json_len<T: serde::Serialize + ?Sized>(value: &T) -> serde_json::Result<usize> {
    let mut count = ByteCount(0);
    serde_json::to_writer(&mut count, value)?;
    Ok(count.0)
}

/// The size of `block` serialized as JSON.
fn block_json_len(block: &Block) -> usize {
    // A block's fields are strings, integers and a JSON value: serializing one cannot
    // fail, and the count writer never refuses a byte. Were it ever to fail, the size
    // would be unknown; `usize::MAX` then makes every cap refuse the overlay.
    json_len(block).map_or(usize::MAX, |len| len.max(1))
}

/// One target's rows, indexed. See the module docs.
#[derive(Clone, Default)]
pub struct OverlayRows {
    /// Every row, in canonical order.
    by_order: PMap<OrderKey, Row>,
    /// Each row's place in `by_order`.
    by_key: PMap<BlockKey, OrderKey>,
    /// The rows that are not ordinary.
    ephemeral: PMap<EphemeralKey, ()>,
}

impl OverlayRows {
    /// No rows.
    pub fn new() -> Self {
        Self::default()
    }

    /// The rows of `blocks`, in any order. Two rows with one key are refused with that
    /// key (OV-01: one row per key).
    pub fn from_blocks(blocks: Vec<StoredBlock>) -> Result<Self, BlockKey> {
        let mut by_key: Vec<(BlockKey, OrderKey)> = Vec::with_capacity(blocks.len());
        let mut ephemeral: Vec<(EphemeralKey, ())> = Vec::new();
        let mut by_order: Vec<(OrderKey, Row)> = Vec::with_capacity(blocks.len());
        for row in blocks {
            let order = row.block.order_key();
            if let Some(rank) = class_rank(row.class) {
                ephemeral.push(((rank, row.run_id.clone(), order.key.clone()), ()));
            }
            by_key.push((order.key.clone(), order.clone()));
            by_order.push((order, Row::new(row)));
        }
        by_key.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let twice = by_key.windows(2).find_map(|pair| match pair {
            [a, b] if a.0 == b.0 => Some(a.0.clone()),
            _ => None,
        });
        if let Some(key) = twice {
            return Err(key);
        }
        by_order.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        ephemeral.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        Ok(OverlayRows {
            by_order: PMap::from_sorted(by_order),
            by_key: PMap::from_sorted(by_key),
            ephemeral: PMap::from_sorted(ephemeral),
        })
    }

    /// The number of rows.
    pub fn len(&self) -> usize {
        self.by_order.len()
    }

    /// True when there are no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The row with `key`, in O(log n).
    pub fn get(&self, key: &BlockKey) -> Option<&StoredBlock> {
        self.by_order.get(self.by_key.get(key)?).map(|r| &r.stored)
    }

    /// Every row, in canonical order.
    pub fn iter(&self) -> impl Iterator<Item = &StoredBlock> + '_ {
        self.by_order.iter().map(|e| &e.1.stored)
    }

    /// Every row, in canonical order, as the stored form holds them (O(n)).
    pub fn to_blocks(&self) -> Vec<StoredBlock> {
        self.iter().cloned().collect()
    }

    /// Every row's wire block, in canonical order (O(n)).
    pub fn client_blocks(&self) -> Vec<Block> {
        let mut blocks = Vec::with_capacity(self.len());
        blocks.extend(self.iter().map(|b| b.block.clone()));
        blocks
    }

    /// The size of [`OverlayRows::client_blocks`] serialized as a JSON array's members:
    /// every block's JSON and the commas between them (`serde_json::to_vec` of the
    /// blocks is 2 bytes more, for `[` and `]`). Each row's size is counted the first
    /// time it is asked for and kept with the row, so this is O(n) additions when every
    /// row was counted before and serializes only the rows that were not.
    pub fn client_blocks_json_len(&self) -> usize {
        self.by_order
            .iter()
            .fold(self.len().saturating_sub(1), |sum, e| {
                sum.saturating_add(e.1.json_len())
            })
    }

    /// The keys of the rows of an ephemeral `class` whose run `runs` takes, in O(log n)
    /// per row returned (and none for [`RowClass::Ordinary`], which has no class index).
    pub fn ephemeral_keys(&self, class: RowClass, runs: Runs<'_>) -> Vec<BlockKey> {
        let Some(rank) = class_rank(class) else {
            return Vec::new();
        };
        let keys = |from: &dyn Fn(&EphemeralKey) -> bool, take: &dyn Fn(&EphemeralKey) -> bool| {
            self.ephemeral
                .iter_from(from)
                .take_while(|e| take(&e.0))
                .map(|e| e.0 .2.clone())
                .collect::<Vec<_>>()
        };
        match runs {
            Runs::Any => keys(&|k| k.0 >= rank, &|k| k.0 == rank),
            Runs::Of(run) => keys(&|k| (k.0, k.1.as_ref()) >= (rank, run), &|k| {
                k.0 == rank && k.1.as_ref() == run
            }),
            Runs::NotOf(run) => {
                let mut out = keys(&|k| k.0 >= rank, &|k| k.0 == rank && k.1.as_ref() < run);
                out.extend(keys(&|k| (k.0, k.1.as_ref()) > (rank, run), &|k| {
                    k.0 == rank
                }));
                out
            }
        }
    }

    /// Stores `row`, replacing the row with its key.
    pub fn insert(&mut self, row: StoredBlock) {
        let order = row.block.order_key();
        let in_place = self.by_key.get(&order.key) == Some(&order);
        if in_place {
            // The row keeps its place (the common streaming update): only its entry and,
            // when its class or run changed, the class index change.
            if let Some(old) = self.by_order.get(&order).map(|r| &r.stored) {
                if old.class != row.class || old.run_id != row.run_id {
                    if let Some(rank) = class_rank(old.class) {
                        self.ephemeral
                            .remove(&(rank, old.run_id.clone(), order.key.clone()));
                    }
                    if let Some(rank) = class_rank(row.class) {
                        self.ephemeral
                            .insert((rank, row.run_id.clone(), order.key.clone()), ());
                    }
                }
            }
            self.by_order.insert(order, Row::new(row));
            return;
        }
        self.remove_entry(&order.key);
        if let Some(rank) = class_rank(row.class) {
            self.ephemeral
                .insert((rank, row.run_id.clone(), order.key.clone()), ());
        }
        self.by_key.insert(order.key.clone(), order.clone());
        self.by_order.insert(order, Row::new(row));
    }

    /// Removes the row with `key`; returns it, or `None` when there was none.
    pub fn remove(&mut self, key: &BlockKey) -> Option<StoredBlock> {
        self.remove_entry(key).map(|e| {
            Arc::try_unwrap(e).map_or_else(|shared| shared.1.stored.clone(), |own| own.1.stored)
        })
    }

    fn remove_entry(&mut self, key: &BlockKey) -> Option<Arc<(OrderKey, Row)>> {
        let place = self.by_key.remove(key)?;
        let entry = self.by_order.remove(&place.1)?;
        let row = &entry.1.stored;
        if let Some(rank) = class_rank(row.class) {
            self.ephemeral
                .remove(&(rank, row.run_id.clone(), key.clone()));
        }
        Some(entry)
    }

    /// Applies `changes` (removals, then upserts), as a recipient of a patch does.
    pub fn apply_changes(&mut self, changes: &Changes) {
        for key in &changes.removals {
            self.remove_entry(key);
        }
        for row in &changes.upserts {
            self.insert(row.clone());
        }
    }
}

impl PartialEq for OverlayRows {
    fn eq(&self, other: &Self) -> bool {
        // The key and class indexes follow from the rows.
        self.by_order == other.by_order
    }
}

impl fmt::Debug for OverlayRows {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// What one write changed in a target's rows: the rows a store persists and a patch
/// carries.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Changes {
    /// Rows added or replaced, in canonical order.
    pub upserts: Vec<StoredBlock>,
    /// Keys of rows that left, in key order.
    pub removals: Vec<BlockKey>,
    /// True when an ordinary row left because history holds its key (OV-04), or history
    /// lost rows (OV-10): the settlement epoch rises with this write.
    pub raises_epoch: bool,
}

impl Changes {
    /// True when nothing changed.
    pub fn is_empty(&self) -> bool {
        self.upserts.is_empty() && self.removals.is_empty()
    }
}

/// One stored version of a target's overlay: its revision and epoch and its rows,
/// shared with the store (O(1) to take and to keep; the store's next write does not
/// copy it).
///
/// The whole stored form ([`Snapshot::stored`]) is built from the rows on first use, in
/// O(n); [`Snapshot::rows`] reads rows without building it, and
/// [`Snapshot::client_form`] copies only the wire blocks (what a latest window answers).
pub struct Snapshot {
    /// From the global counter (OV-02).
    pub revision: u64,
    /// The settlement epoch (OV-04).
    pub settlement_epoch: u64,
    rows: OverlayRows,
    whole: OnceLock<StoredOverlay>,
}

impl Snapshot {
    /// A snapshot of `rows` at `revision` and `settlement_epoch`.
    pub fn new(revision: u64, settlement_epoch: u64, rows: OverlayRows) -> Self {
        Snapshot {
            revision,
            settlement_epoch,
            rows,
            whole: OnceLock::new(),
        }
    }

    /// The snapshot of a stored form; two rows with one key are refused with that key.
    pub fn from_stored(stored: StoredOverlay) -> Result<Self, BlockKey> {
        Ok(Snapshot::new(
            stored.revision,
            stored.settlement_epoch,
            OverlayRows::from_blocks(stored.blocks)?,
        ))
    }

    /// The rows.
    pub fn rows(&self) -> &OverlayRows {
        &self.rows
    }

    /// The whole stored form, built on first use (O(n)) and kept with this value.
    pub fn stored(&self) -> &StoredOverlay {
        self.whole.get_or_init(|| self.build())
    }

    /// The whole stored form, built anew (O(n)) unless this value already holds it.
    pub fn to_stored(&self) -> StoredOverlay {
        self.whole.get().cloned().unwrap_or_else(|| self.build())
    }

    /// The whole stored form, moved out when this value holds it.
    pub fn into_stored(self) -> StoredOverlay {
        let Snapshot {
            revision,
            settlement_epoch,
            rows,
            whole,
        } = self;
        whole.into_inner().unwrap_or_else(|| StoredOverlay {
            format_version: FORMAT_VERSION,
            settlement_epoch,
            revision,
            blocks: rows.to_blocks(),
        })
    }

    /// What a client receives (`{settlementEpoch, revision, blocks}`), built from the
    /// rows in O(n).
    pub fn client_form(&self) -> LiveOverlay {
        LiveOverlay {
            settlement_epoch: self.settlement_epoch,
            revision: self.revision,
            blocks: self.rows.client_blocks(),
        }
    }

    fn build(&self) -> StoredOverlay {
        StoredOverlay {
            format_version: FORMAT_VERSION,
            settlement_epoch: self.settlement_epoch,
            revision: self.revision,
            blocks: self.rows.to_blocks(),
        }
    }
}

impl Clone for Snapshot {
    /// Shares the rows; the built stored form stays with the original.
    fn clone(&self) -> Self {
        Snapshot::new(self.revision, self.settlement_epoch, self.rows.clone())
    }
}

impl PartialEq for Snapshot {
    fn eq(&self, other: &Self) -> bool {
        self.revision == other.revision
            && self.settlement_epoch == other.settlement_epoch
            && self.rows == other.rows
    }
}

impl fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Snapshot")
            .field("revision", &self.revision)
            .field("settlement_epoch", &self.settlement_epoch)
            .field("rows", &self.rows)
            .finish()
    }
}

impl From<Snapshot> for StoredOverlay {
    fn from(snapshot: Snapshot) -> Self {
        snapshot.into_stored()
    }
}
