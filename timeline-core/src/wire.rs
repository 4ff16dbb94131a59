//! Wire types a client receives for a timeline (camelCase JSON) and their validation.
//!
//! Unknown fields are ignored (additive protocol); a malformed known field is a typed
//! [`ResponseError`]. Validation checks what the reducer relies on: no key twice, every
//! number inside JavaScript's exact-integer range (revisions, epochs, every block's
//! `timestamp` and every part of its `sourceOrder`), `orderedBlockKeys` equal to the
//! older rows followed by the seam. A [`LivePatch`] (the changes between two snapshots
//! of one epoch) is held to the same number checks, and its revision must be above its
//! base.
//!
//! [`WireInt`] is the type-level form of that range: an integer in `0..=2^53 - 1`, built
//! only through a checked constructor or a decoder that refuses anything else (a
//! negative, a fraction, or 2^53 and above). Packed history decodes its sequence numbers
//! and times through it.
//!
//! ```
//! use timeline_core::wire::{OutOfRange, WireInt};
//!
//! assert_eq!(WireInt::new(9_007_199_254_740_991).map(WireInt::get), Ok(9_007_199_254_740_991));
//! assert_eq!(WireInt::new(9_007_199_254_740_992), Err(OutOfRange(9_007_199_254_740_992)));
//! assert!(serde_json::from_str::<WireInt>("9007199254740992").is_err());
//! assert!(serde_json::from_str::<WireInt>("-1").is_err());
//! assert!(serde_json::from_str::<WireInt>("1.5").is_err());
//! ```

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Deserializer, Serialize};

use crate::block::Block;
use crate::cursor::BoundaryToken;
use crate::key::BlockKey;
use crate::policy::MAX_EXACT_INTEGER;

/// The notice of a link load whose message is not in saved history (TL-12).
pub const MESSAGE_NOT_SAVED_NOTICE: &str = "This message is not in the saved history.";
/// The notice of a row load whose row is not in saved history (TL-12).
pub const ROW_NOT_SAVED_NOTICE: &str = "This row is not in the saved history.";

/// A malformed response.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResponseError {
    /// The JSON did not decode into the response type.
    #[error("malformed timeline response: {0}")]
    Decode(String),
    /// Two blocks with one key in one list.
    #[error("malformed timeline response: block {0} appears twice")]
    DuplicateKey(BlockKey),
    /// A number a client must read exactly is past 2^53 - 1 (the field's wire name).
    #[error("malformed timeline response: {0} is past the exact integer range")]
    NumberOutOfRange(&'static str),
    /// `orderedBlockKeys` is not the older rows followed by the seam.
    #[error("malformed timeline response: orderedBlockKeys does not match the page")]
    OrderedKeysMismatch,
    /// A link or row load answered with both or neither of `anchorRow` and
    /// `anchorNotice`.
    #[error("malformed timeline response: exactly one of anchorRow and anchorNotice must be set")]
    AnchorFields,
    /// `anchorRow` names a row the window does not hold.
    #[error("malformed timeline response: anchorRow is not in the window")]
    AnchorRowMissing,
    /// A window for the present without its live overlay.
    #[error("malformed timeline response: liveOverlay is missing")]
    MissingOverlay,
    /// Rows of a `newer` answer that overlap the held window or leave a gap before it.
    #[error("malformed timeline response: newer rows do not follow the held page")]
    NewerRowsDoNotFollow,
    /// A `livePatch` whose `revision` is not above its `baseRevision`.
    #[error("malformed live patch: revision must be above baseRevision")]
    PatchNotForward,
}

/// A number past the exact integer range (2^53 - 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0} is past the exact integer range (2^53 - 1)")]
pub struct OutOfRange(pub u64);

/// An integer a client reads exactly: `0..=2^53 - 1` ([`MAX_EXACT_INTEGER`]).
///
/// The only ways to get one are [`WireInt::new`], [`TryFrom<u64>`], the arithmetic
/// below (which refuses to leave the range) and decoding, which refuses negatives,
/// fractions and anything past the range. Serialized as a plain JSON number.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct WireInt(u64);

impl WireInt {
    /// The wire integer 0.
    pub const ZERO: WireInt = WireInt(0);
    /// 2^53 - 1, the largest value.
    pub const MAX: WireInt = WireInt(MAX_EXACT_INTEGER);

    /// `n`, when it is at most 2^53 - 1.
    pub const fn new(n: u64) -> Result<WireInt, OutOfRange> {
        if n > MAX_EXACT_INTEGER {
            return Err(OutOfRange(n));
        }
        Ok(WireInt(n))
    }

    /// The number.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// `self + n`, or `None` past 2^53 - 1.
    pub const fn checked_add(self, n: u64) -> Option<WireInt> {
        match self.0.checked_add(n) {
            Some(sum) if sum <= MAX_EXACT_INTEGER => Some(WireInt(sum)),
            _ => None,
        }
    }

    /// `self + 1`, or `None` at [`WireInt::MAX`].
    pub const fn next(self) -> Option<WireInt> {
        self.checked_add(1)
    }

    /// `self + d` for a signed `d`, or `None` when the sum leaves `0..=2^53 - 1`.
    pub const fn checked_add_signed(self, d: i64) -> Option<WireInt> {
        match self.0.checked_add_signed(d) {
            Some(sum) if sum <= MAX_EXACT_INTEGER => Some(WireInt(sum)),
            _ => None,
        }
    }

    /// `later - self` as a signed difference. Both lie in `0..=2^53 - 1`, so the
    /// difference always fits in an `i64` and its magnitude in the range.
    pub const fn signed_diff(self, later: WireInt) -> i64 {
        // Both values are below 2^53, so both casts and the subtraction are exact.
        later.0 as i64 - self.0 as i64
    }

    /// Decodes a `u64` field through the range check (`#[serde(deserialize_with)]`).
    pub fn deserialize_u64<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        WireInt::deserialize(d).map(WireInt::get)
    }

    /// Decodes a list of signed differences whose magnitudes stay in the range
    /// (`#[serde(deserialize_with)]`), such as the time gaps of a packed row.
    pub fn deserialize_signed_vec<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<i64>, D::Error> {
        let v = Vec::<i64>::deserialize(d)?;
        if let Some(bad) = v.iter().find(|g| g.unsigned_abs() > MAX_EXACT_INTEGER) {
            return Err(serde::de::Error::custom(format_args!(
                "{bad} is past the exact integer range (2^53 - 1)"
            )));
        }
        Ok(v)
    }
}

impl TryFrom<u64> for WireInt {
    type Error = OutOfRange;
    fn try_from(n: u64) -> Result<WireInt, OutOfRange> {
        WireInt::new(n)
    }
}

impl From<WireInt> for u64 {
    fn from(n: WireInt) -> u64 {
        n.0
    }
}

impl std::fmt::Display for WireInt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl<'de> Deserialize<'de> for WireInt {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<WireInt, D::Error> {
        // `u64` refuses negatives and fractions; the range check refuses 2^53 and up.
        let n = u64::deserialize(d)?;
        WireInt::new(n).map_err(serde::de::Error::custom)
    }
}

/// An integer in `0..=2^53 - 1`.
#[cfg(feature = "schema")]
impl schemars::JsonSchema for WireInt {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed("WireInt")
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "integer",
            "minimum": 0,
            "maximum": MAX_EXACT_INTEGER
        })
    }
}

fn exact(n: u64, what: &'static str) -> Result<(), ResponseError> {
    WireInt::new(n)
        .map(drop)
        .map_err(|_| ResponseError::NumberOutOfRange(what))
}

/// Checks each block's numbers (`timestamp`, every part of `sourceOrder`) and that no
/// key appears twice.
fn check_blocks(blocks: &[Block]) -> Result<(), ResponseError> {
    let mut seen = HashSet::with_capacity(blocks.len());
    for b in blocks {
        exact(b.timestamp.as_u64(), "timestamp")?;
        if let Some(order) = &b.source_order {
            for &part in order.as_slice() {
                exact(part, "sourceOrder")?;
            }
        }
        let k = b.key();
        if !seen.insert(k.clone()) {
            return Err(ResponseError::DuplicateKey(k));
        }
    }
    Ok(())
}

/// `liveOverlay`: the full unresolved live projection of one target.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct LiveOverlay {
    /// Rises only when a live row moves into history (TL-06).
    pub settlement_epoch: u64,
    /// From the host's global counter; within an epoch higher replaces lower.
    pub revision: u64,
    /// The live rows.
    pub blocks: Vec<Block>,
}

impl LiveOverlay {
    /// Checks the numbers (its own and its blocks') and that no key appears twice.
    pub fn validate(&self) -> Result<(), ResponseError> {
        exact(self.settlement_epoch, "settlementEpoch")?;
        exact(self.revision, "revision")?;
        check_blocks(&self.blocks)
    }
}

/// `livePatch`: the changes that take one target's overlay from the snapshot of
/// `baseRevision` to the snapshot of `revision`, within one settlement epoch (an additive
/// extension of the seed's whole snapshots; `docs/live-patches.md`).
///
/// A client that holds exactly `baseRevision` in `settlementEpoch` applies it in one step:
/// every key of `removals` leaves, every block of `upserts` is added or replaces the row
/// with its key, and every row of `appends` gets its text appended to its `data.text`. The result has the same rows as the snapshot of `revision`. A patch never
/// crosses an epoch: a settlement always travels as a whole snapshot.
///
/// ```
/// use timeline_core::block::Block;
/// use timeline_core::key::{BlockKey, BlockType};
/// use timeline_core::time::Millis;
/// use timeline_core::wire::{LiveOverlay, LivePatch, TextAppend};
///
/// let row = |id: &str, text: &str| {
///     Block::new(BlockKey::parse(BlockType::AgentReply, id).unwrap(), Millis(1))
///         .with_data(serde_json::json!({ "text": text }))
/// };
/// let key = |id: &str| BlockKey::parse(BlockType::AgentReply, id).unwrap();
/// let base = LiveOverlay { settlement_epoch: 1, revision: 7, blocks: vec![row("a", "Hel"), row("b", "x")] };
/// let next = LiveOverlay { settlement_epoch: 1, revision: 9, blocks: vec![row("a", "Hello"), row("c", "new")] };
/// let patch = LivePatch::between(&base, &next).unwrap();
/// assert_eq!((patch.base_revision, patch.revision), (7, 9));
/// assert_eq!(patch.upserts, vec![row("c", "new")]);
/// assert_eq!(patch.removals, vec![key("b")]);
/// // "a" only grew: the patch carries the new text, not the row.
/// assert_eq!(patch.appends, vec![TextAppend { key: key("a"), text: "lo".into() }]);
/// assert_eq!(patch.apply_to(&base), Ok(next));
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct LivePatch {
    /// The epoch of both the base and the result.
    pub settlement_epoch: u64,
    /// The revision a client must hold for the patch to apply.
    pub base_revision: u64,
    /// The revision the client holds after applying it.
    pub revision: u64,
    /// Rows added or replaced (same key replaces).
    pub upserts: Vec<Block>,
    /// Keys of rows that leave.
    pub removals: Vec<BlockKey>,
    /// Rows whose only change is text appended to their `data.text` (a streaming reply):
    /// each names the row and carries only the new text. Absent when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub appends: Vec<TextAppend>,
}

/// Text appended to the `data.text` string of one row, every other field unchanged: how a
/// patch carries one more token of a streaming reply without sending the whole row again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct TextAppend {
    /// The row.
    pub key: BlockKey,
    /// What is appended to its text.
    pub text: String,
}

/// Why [`LivePatch::apply_to`] refused a base snapshot.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PatchMismatch {
    /// The base is in another settlement epoch.
    #[error("the live patch is for another settlement epoch")]
    Epoch,
    /// The base holds another revision than `baseRevision`.
    #[error("the live patch is for another base revision")]
    Base,
    /// A removal or an append names a row the base does not hold: the base differs from
    /// the host's.
    #[error("the live patch changes {0}, which the base does not hold")]
    MissingRow(BlockKey),
    /// An append names a row whose `data.text` is not a string.
    #[error("the live patch appends text to {0}, which has no text")]
    NoText(BlockKey),
}

/// The text `new` appends to `old`'s `data.text` when that is the only difference
/// between the two rows; `None` otherwise (or when nothing was appended).
fn appended_text<'a>(old: &Block, new: &'a Block) -> Option<&'a str> {
    if old.block_type != new.block_type
        || old.id != new.id
        || old.timestamp != new.timestamp
        || old.source_order != new.source_order
        || old.operation_id != new.operation_id
    {
        return None;
    }
    let (old_data, new_data) = (old.data.as_object()?, new.data.as_object()?);
    let (old_text, new_text) = (
        old_data.get("text")?.as_str()?,
        new_data.get("text")?.as_str()?,
    );
    let tail = new_text.strip_prefix(old_text).filter(|t| !t.is_empty())?;
    let same_rest = old_data.len() == new_data.len()
        && new_data
            .iter()
            .all(|(k, v)| k == "text" || old_data.get(k) == Some(v));
    same_rest.then_some(tail)
}

/// A block's key, borrowed (no allocation while diffing).
fn borrowed_key(b: &Block) -> (crate::key::BlockType, &str) {
    (b.block_type, b.id.as_str())
}

impl LivePatch {
    /// The patch from `base` to `next`, or `None` when no patch can express the step:
    /// the epochs differ or `next` is not a later revision. Upserts follow `next`'s
    /// order, removals `base`'s order. Time linear in the two snapshots, no row copied
    /// but the changed ones.
    pub fn between(base: &LiveOverlay, next: &LiveOverlay) -> Option<LivePatch> {
        if base.settlement_epoch != next.settlement_epoch || next.revision <= base.revision {
            return None;
        }
        let held: HashMap<_, &Block> = base.blocks.iter().map(|b| (borrowed_key(b), b)).collect();
        let mut kept = 0usize;
        let mut upserts = Vec::new();
        let mut appends = Vec::new();
        for b in &next.blocks {
            match held.get(&borrowed_key(b)) {
                Some(old) => {
                    kept += 1;
                    if *old != b {
                        match appended_text(old, b) {
                            Some(text) => appends.push(TextAppend {
                                key: b.key(),
                                text: text.to_owned(),
                            }),
                            None => upserts.push(b.clone()),
                        }
                    }
                }
                None => upserts.push(b.clone()),
            }
        }
        let removals = if kept == held.len() {
            Vec::new()
        } else {
            let now: HashSet<_> = next.blocks.iter().map(borrowed_key).collect();
            base.blocks
                .iter()
                .filter(|b| !now.contains(&borrowed_key(b)))
                .map(Block::key)
                .collect()
        };
        Some(LivePatch {
            settlement_epoch: next.settlement_epoch,
            base_revision: base.revision,
            revision: next.revision,
            upserts,
            removals,
            appends,
        })
    }

    /// Checks the numbers (its own and its upserts'), that `revision` is above
    /// `baseRevision`, and that no key appears twice (within or across the two lists).
    pub fn validate(&self) -> Result<(), ResponseError> {
        exact(self.settlement_epoch, "settlementEpoch")?;
        exact(self.base_revision, "baseRevision")?;
        exact(self.revision, "revision")?;
        if self.revision <= self.base_revision {
            return Err(ResponseError::PatchNotForward);
        }
        check_blocks(&self.upserts)?;
        let upserted: HashSet<_> = self.upserts.iter().map(borrowed_key).collect();
        let mut removed = HashSet::with_capacity(self.removals.len() + self.appends.len());
        for k in self
            .removals
            .iter()
            .chain(self.appends.iter().map(|a| &a.key))
        {
            let borrowed = (k.block_type, k.id.as_str());
            if upserted.contains(&borrowed) || !removed.insert(borrowed) {
                return Err(ResponseError::DuplicateKey(k.clone()));
            }
        }
        Ok(())
    }

    /// Decodes and validates JSON.
    pub fn from_json(json: &str) -> Result<LivePatch, ResponseError> {
        let p: LivePatch =
            serde_json::from_str(json).map_err(|e| ResponseError::Decode(e.to_string()))?;
        p.validate()?;
        Ok(p)
    }

    /// The snapshot this patch makes of `base`, rows in canonical order (TL-04), or why
    /// `base` is not the patch's base. All or nothing.
    pub fn apply_to(&self, base: &LiveOverlay) -> Result<LiveOverlay, PatchMismatch> {
        if base.settlement_epoch != self.settlement_epoch {
            return Err(PatchMismatch::Epoch);
        }
        if base.revision != self.base_revision {
            return Err(PatchMismatch::Base);
        }
        let mut rows: HashMap<_, &Block> =
            base.blocks.iter().map(|b| (borrowed_key(b), b)).collect();
        for k in &self.removals {
            if rows.remove(&(k.block_type, k.id.as_str())).is_none() {
                return Err(PatchMismatch::MissingRow(k.clone()));
            }
        }
        let mut appended = Vec::with_capacity(self.appends.len());
        for a in &self.appends {
            let row = rows
                .remove(&(a.key.block_type, a.key.id.as_str()))
                .ok_or_else(|| PatchMismatch::MissingRow(a.key.clone()))?;
            appended.push(append_to(row, a)?);
        }
        for b in &self.upserts {
            rows.insert(borrowed_key(b), b);
        }
        let mut blocks: Vec<Block> = rows.into_values().cloned().chain(appended).collect();
        blocks.sort_by_cached_key(Block::order_key);
        Ok(LiveOverlay {
            settlement_epoch: self.settlement_epoch,
            revision: self.revision,
            blocks,
        })
    }
}

/// `row` with `append.text` appended to its `data.text`.
fn append_to(row: &Block, append: &TextAppend) -> Result<Block, PatchMismatch> {
    let mut row = row.clone();
    match row.data.get_mut("text") {
        Some(serde_json::Value::String(text)) => {
            text.push_str(&append.text);
            Ok(row)
        }
        _ => Err(PatchMismatch::NoText(append.key.clone())),
    }
}

/// The answer of a latest-window load (`run.chatLoad`) or an anchored load: a history
/// page, its paging state and, for a window of the present, the live overlay.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct TimelineWindow {
    /// History rows of the page.
    pub blocks: Vec<Block>,
    /// Where the next older page starts; `None` at the start of history.
    #[serde(default)]
    pub oldest_cursor: Option<String>,
    /// The history source.
    pub boundary_token: BoundaryToken,
    /// The window revision the cursor carries.
    #[serde(default)]
    pub window_revision: u64,
    /// The live overlay; absent on a page in the past.
    #[serde(default)]
    pub live_overlay: Option<LiveOverlay>,
    /// The block to center and mark (anchored loads).
    #[serde(default)]
    pub anchor_row: Option<BlockKey>,
    /// The host's sentence when an anchored load opened no row.
    #[serde(default)]
    pub anchor_notice: Option<String>,
    /// Set when the window is a page in the past: the token of the next `newer` load.
    #[serde(default)]
    pub newer_cursor: Option<String>,
}

impl TimelineWindow {
    /// Checks numbers (blocks' included) and unique keys of the page and of its overlay.
    pub fn validate(&self) -> Result<(), ResponseError> {
        exact(self.window_revision, "windowRevision")?;
        check_blocks(&self.blocks)?;
        if let Some(o) = &self.live_overlay {
            o.validate()?;
        }
        Ok(())
    }

    /// Decodes and validates JSON.
    pub fn from_json(json: &str) -> Result<TimelineWindow, ResponseError> {
        let w: TimelineWindow =
            serde_json::from_str(json).map_err(|e| ResponseError::Decode(e.to_string()))?;
        w.validate()?;
        Ok(w)
    }
}

/// The answer of an older-page load (`run.chatLoadPageBefore`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct OlderPage {
    /// The older rows.
    pub blocks: Vec<Block>,
    /// The seam: the key(s) the cursor was cut at.
    pub boundary_block_keys: Vec<BlockKey>,
    /// The older rows' keys, then the seam.
    pub ordered_block_keys: Vec<BlockKey>,
    /// The cursor's revision + 1.
    pub window_revision: u64,
    /// The next cursor; its seam is the top row of this page.
    #[serde(default)]
    pub oldest_cursor: Option<String>,
    /// The source changed or the cursor's place is gone: reload the latest window.
    #[serde(default)]
    pub reload_required: bool,
}

impl OlderPage {
    /// An empty page that tells the client to reload.
    pub fn reload_required() -> OlderPage {
        OlderPage {
            blocks: Vec::new(),
            boundary_block_keys: Vec::new(),
            ordered_block_keys: Vec::new(),
            window_revision: 0,
            oldest_cursor: None,
            reload_required: true,
        }
    }

    /// Checks numbers (blocks' included), unique keys and `orderedBlockKeys`.
    pub fn validate(&self) -> Result<(), ResponseError> {
        if self.reload_required {
            return Ok(());
        }
        exact(self.window_revision, "windowRevision")?;
        check_blocks(&self.blocks)?;
        let expected = self
            .blocks
            .iter()
            .map(Block::key)
            .chain(self.boundary_block_keys.iter().cloned());
        if !expected.eq(self.ordered_block_keys.iter().cloned()) {
            return Err(ResponseError::OrderedKeysMismatch);
        }
        Ok(())
    }

    /// Decodes and validates JSON.
    pub fn from_json(json: &str) -> Result<OlderPage, ResponseError> {
        let p: OlderPage =
            serde_json::from_str(json).map_err(|e| ResponseError::Decode(e.to_string()))?;
        p.validate()?;
        Ok(p)
    }
}
