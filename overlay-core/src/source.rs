//! History sources behind a trait, and an in-memory source for tests.
//!
//! A source is the agent's saved history of one timeline target, read newest first in
//! pages of items; each item projects to zero or more rows (an item that projects to no
//! visible row still advances the position). The differences between agents are data
//! of the source, not branches in the builders:
//!
//! - [`SourceKind`] says which cursor form the host writes (Codex `thread-items-v5:` or
//!   Claude JSON) and what a cursor must match (thread or session);
//! - [`HistorySource::boundary_token`] names the source (TL-10);
//! - a position the source no longer holds (Claude: the `before` message is gone) is
//!   [`SourceError::PositionGone`], which the builders answer with an empty page and
//!   `reloadRequired`.
//!
//! Reads go both ways from a position: [`HistorySource::read`] gives older items (the
//! latest window, older pages, the scan for an anchored place) and
//! [`HistorySource::read_newer`] the items after a page in the past, so a `newer` load
//! resumes where its page ended instead of scanning back from the present. A source
//! that can only read backwards keeps the provided `read_newer`, which does that scan.
//! [`MemorySource`] finds a position in O(log n), so a read costs what it returns.

use std::collections::VecDeque;

use timeline_core::block::Block;
use timeline_core::cursor::BoundaryToken;

/// An opaque position in a source: reading `before` it gives the items older than it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SourcePosition(pub String);

/// The cursor form of a source.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SourceKind {
    /// Codex owned paginated history (`thread/items/list`).
    Codex {
        /// The thread the cursors page.
        thread_id: String,
        /// The generation of the history source.
        generation: u64,
    },
    /// A Claude transcript read through the SDK.
    Claude {
        /// The Claude session ID, or the subagent ID for a child thread.
        session: String,
    },
}

/// One saved item and the rows it projects to.
#[derive(Clone, Debug, PartialEq)]
pub struct SourceItem {
    /// The item's position.
    pub position: SourcePosition,
    /// Its rows (history source order), possibly none.
    pub blocks: Vec<Block>,
}

/// One read of a source.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct SourcePage {
    /// Items in the order read: newest first from [`HistorySource::read`], oldest first
    /// from [`HistorySource::read_newer`].
    pub items: Vec<SourceItem>,
    /// True when the history goes on past the last item in the direction read (older
    /// items exist after a `read`, newer ones after a `read_newer`).
    pub more: bool,
}

/// Why a source read failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// The history could not be read now.
    #[error("history source unavailable: {0}")]
    Unavailable(String),
    /// The position no longer exists in the source.
    #[error("the history position no longer exists")]
    PositionGone,
    /// The source answered something that cannot be projected (for example an entry
    /// with neither or both of item and unsupportedItem): the whole page fails.
    #[error("malformed history page: {0}")]
    Malformed(String),
}

/// The saved history of one timeline target.
pub trait HistorySource {
    /// The cursor form.
    fn kind(&self) -> SourceKind;
    /// The boundary token of the source.
    fn boundary_token(&self) -> BoundaryToken;
    /// Up to `limit` items older than `before` (`None`: the newest), newest first.
    fn read(
        &mut self,
        before: Option<&SourcePosition>,
        limit: usize,
    ) -> Result<SourcePage, SourceError>;

    /// Up to `limit` items newer than `after`, oldest first; `more` is true when newer
    /// items follow them. A position the source no longer holds is
    /// [`SourceError::PositionGone`].
    ///
    /// The provided method scans back from the present with [`HistorySource::read`]
    /// (pages of `limit` items, at most [`MAX_READS_PER_NEWER_SCAN`] of them; a position
    /// not met within them is gone) and keeps only the `limit + 1` items nearest to
    /// `after`: it costs time linear in the items between `after` and the present. A source that can read forward from a position
    /// overrides it, so the cost is that of the items returned.
    fn read_newer(
        &mut self,
        after: &SourcePosition,
        limit: usize,
    ) -> Result<SourcePage, SourceError> {
        // The items read since the present, newest first, trimmed to the `limit + 1`
        // nearest to `after` (the last one pushed is the nearest).
        let mut nearest: VecDeque<SourceItem> = VecDeque::new();
        let mut dropped = false;
        let mut before: Option<SourcePosition> = None;
        for _ in 0..MAX_READS_PER_NEWER_SCAN {
            let page = self.read(before.as_ref(), limit.max(1))?;
            let Some(last) = page.items.last() else {
                break;
            };
            before = Some(last.position.clone());
            for item in page.items {
                if &item.position == after {
                    let more = dropped || nearest.len() > limit;
                    let items = nearest.into_iter().rev().take(limit).collect();
                    return Ok(SourcePage { items, more });
                }
                nearest.push_back(item);
                if nearest.len() > limit.saturating_add(1) {
                    nearest.pop_front();
                    dropped = true;
                }
            }
            if !page.more {
                break;
            }
        }
        Err(SourceError::PositionGone)
    }
}

/// Source pages the provided [`HistorySource::read_newer`] reads back from the present
/// while it looks for its position (the same budget as the scan for an anchored place).
pub const MAX_READS_PER_NEWER_SCAN: usize = 10_000;

/// An in-memory source: items oldest first, positions `item-<n>` with `n` increasing
/// (removing items keeps that order, so a position is found by binary search).
#[derive(Clone, Debug)]
pub struct MemorySource {
    kind: SourceKind,
    token: BoundaryToken,
    items: Vec<SourceItem>,
    next: u64,
    /// Reads counted, for tests of the read budget.
    pub reads: usize,
    /// When set, every read fails with this error.
    #[cfg(feature = "testing")]
    pub fail_with: Option<SourceError>,
}

impl MemorySource {
    /// An empty source.
    pub fn new(kind: SourceKind, token: BoundaryToken) -> Self {
        MemorySource {
            kind,
            token,
            items: Vec::new(),
            next: 0,
            reads: 0,
            #[cfg(feature = "testing")]
            fail_with: None,
        }
    }

    /// Appends an item with `blocks` (possibly none) and returns its position.
    pub fn push(&mut self, blocks: Vec<Block>) -> SourcePosition {
        let position = SourcePosition(format!("item-{}", self.next));
        self.next += 1;
        self.items.push(SourceItem {
            position: position.clone(),
            blocks,
        });
        position
    }

    /// Removes the item at `position` (compaction, a rewritten transcript).
    pub fn remove(&mut self, position: &SourcePosition) -> bool {
        let before = self.items.len();
        self.items.retain(|i| &i.position != position);
        self.items.len() != before
    }

    /// Changes the boundary token (a different rollout, a new owner).
    pub fn set_boundary_token(&mut self, token: BoundaryToken) {
        self.token = token;
    }

    /// Every row, oldest first.
    pub fn all_blocks(&self) -> Vec<Block> {
        self.items.iter().flat_map(|i| i.blocks.clone()).collect()
    }

    /// The index of the item at `position`, if the source holds it.
    fn index_of(&self, position: &SourcePosition) -> Option<usize> {
        let number = |p: &SourcePosition| {
            p.0.strip_prefix("item-")
                .and_then(|n| n.parse::<u64>().ok())
        };
        let wanted = number(position)?;
        // Items that do not name a number sort first; `push` writes none of them.
        let at = self
            .items
            .binary_search_by_key(&Some(wanted), |i| number(&i.position))
            .ok()?;
        self.items
            .get(at)
            .is_some_and(|i| &i.position == position)
            .then_some(at)
    }
}

impl HistorySource for MemorySource {
    fn kind(&self) -> SourceKind {
        self.kind.clone()
    }

    fn boundary_token(&self) -> BoundaryToken {
        self.token.clone()
    }

    fn read(
        &mut self,
        before: Option<&SourcePosition>,
        limit: usize,
    ) -> Result<SourcePage, SourceError> {
        self.reads += 1;
        #[cfg(feature = "testing")]
        if let Some(e) = &self.fail_with {
            return Err(e.clone());
        }
        let end = match before {
            None => self.items.len(),
            Some(p) => self.index_of(p).ok_or(SourceError::PositionGone)?,
        };
        let start = end.saturating_sub(limit);
        Ok(SourcePage {
            items: self
                .items
                .get(start..end)
                .unwrap_or_default()
                .iter()
                .rev()
                .cloned()
                .collect(),
            more: start > 0,
        })
    }

    fn read_newer(
        &mut self,
        after: &SourcePosition,
        limit: usize,
    ) -> Result<SourcePage, SourceError> {
        self.reads += 1;
        #[cfg(feature = "testing")]
        if let Some(e) = &self.fail_with {
            return Err(e.clone());
        }
        let start = self
            .index_of(after)
            .ok_or(SourceError::PositionGone)?
            .saturating_add(1);
        let end = start.saturating_add(limit).min(self.items.len());
        Ok(SourcePage {
            items: self.items.get(start..end).unwrap_or_default().to_vec(),
            more: end < self.items.len(),
        })
    }
}
