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
    /// Items, newest first.
    pub items: Vec<SourceItem>,
    /// True when older items exist.
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
}

/// An in-memory source: items oldest first, positions `item-<n>`.
#[derive(Clone, Debug)]
pub struct MemorySource {
    kind: SourceKind,
    token: BoundaryToken,
    items: Vec<SourceItem>,
    next: u64,
    /// Reads counted, for tests of the read budget.
    pub reads: usize,
    /// When set, every read fails with this error.
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
        if let Some(e) = &self.fail_with {
            return Err(e.clone());
        }
        let end = match before {
            None => self.items.len(),
            Some(p) => self
                .items
                .iter()
                .position(|i| &i.position == p)
                .ok_or(SourceError::PositionGone)?,
        };
        let start = end.saturating_sub(limit);
        Ok(SourcePage {
            items: self.items[start..end].iter().rev().cloned().collect(),
            more: start > 0,
        })
    }
}
