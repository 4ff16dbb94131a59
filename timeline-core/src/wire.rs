//! Wire types a client receives for a timeline (camelCase JSON) and their validation.
//!
//! Unknown fields are ignored (additive protocol); a malformed known field is a typed
//! [`ResponseError`]. Validation checks what the reducer relies on: no key twice, every
//! number inside JavaScript's exact-integer range, `orderedBlockKeys` equal to the older
//! rows followed by the seam.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

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
    /// A number a client must read exactly is past 2^53 - 1.
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
}

fn exact(n: u64, what: &'static str) -> Result<(), ResponseError> {
    if n > MAX_EXACT_INTEGER {
        return Err(ResponseError::NumberOutOfRange(what));
    }
    Ok(())
}

fn unique_keys(blocks: &[Block]) -> Result<(), ResponseError> {
    let mut seen = HashSet::with_capacity(blocks.len());
    for b in blocks {
        let k = b.key();
        if !seen.insert(k.clone()) {
            return Err(ResponseError::DuplicateKey(k));
        }
    }
    Ok(())
}

/// `liveOverlay`: the full unresolved live projection of one target.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
    /// Checks the numbers and that no key appears twice.
    pub fn validate(&self) -> Result<(), ResponseError> {
        exact(self.settlement_epoch, "settlementEpoch")?;
        exact(self.revision, "revision")?;
        unique_keys(&self.blocks)
    }
}

/// The answer of a latest-window load (`run.chatLoad`) or an anchored load: a history
/// page, its paging state and, for a window of the present, the live overlay.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
    /// Checks numbers and unique keys of the page and of its overlay.
    pub fn validate(&self) -> Result<(), ResponseError> {
        exact(self.window_revision, "windowRevision")?;
        unique_keys(&self.blocks)?;
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

    /// Checks numbers, unique keys and `orderedBlockKeys`.
    pub fn validate(&self) -> Result<(), ResponseError> {
        if self.reload_required {
            return Ok(());
        }
        exact(self.window_revision, "windowRevision")?;
        unique_keys(&self.blocks)?;
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
