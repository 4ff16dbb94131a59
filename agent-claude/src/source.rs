//! A Claude transcript read so far (in memory) as an `overlay-core` history source: the
//! windows and older pages of a Claude target are read from the conversation of a
//! [`Transcript`], positioned by item UUID (the `before` of a Claude cursor, TL-09) and
//! named by the session or subagent ID (TL-10). A transcript file read from its end is
//! [`crate::file::TranscriptFile`]; the two answer every read alike
//! (`tests/file_source.rs`).
//!
//! Invariant: a position the conversation does not hold (gone, on an abandoned branch,
//! or before the last compaction) is [`SourceError::PositionGone`], which the builders
//! answer with an empty page and `reloadRequired`.

use overlay_core::source::{
    HistorySource, SourceError, SourceItem, SourceKind, SourcePage, SourcePosition,
};
use timeline_core::cursor::BoundaryToken;

use crate::transcript::{Page, PageError, Transcript};

/// A transcript read so far, for one timeline target.
pub struct TranscriptSource<'a> {
    /// The Claude session ID for the main conversation, the subagent ID for a child.
    pub target: String,
    /// The transcript.
    pub transcript: &'a Transcript,
}

fn page(p: Page<'_>) -> SourcePage {
    SourcePage {
        items: p
            .items
            .into_iter()
            .map(|(ordinal, item)| SourceItem {
                position: SourcePosition(item.position.clone()),
                blocks: item.blocks(ordinal),
            })
            .collect(),
        more: p.more,
    }
}

fn gone(e: PageError) -> SourceError {
    match e {
        PageError::PositionGone(_) => SourceError::PositionGone,
    }
}

impl HistorySource for TranscriptSource<'_> {
    fn kind(&self) -> SourceKind {
        SourceKind::Claude {
            session: self.target.clone(),
        }
    }

    fn boundary_token(&self) -> BoundaryToken {
        BoundaryToken::claude(&self.target)
    }

    fn read(
        &mut self,
        before: Option<&SourcePosition>,
        limit: usize,
    ) -> Result<SourcePage, SourceError> {
        self.transcript
            .page_before(before.map(|p| p.0.as_str()), limit)
            .map(page)
            .map_err(gone)
    }

    fn read_newer(
        &mut self,
        after: &SourcePosition,
        limit: usize,
    ) -> Result<SourcePage, SourceError> {
        self.transcript
            .page_after(&after.0, limit)
            .map(page)
            .map_err(gone)
    }
}
