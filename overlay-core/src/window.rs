//! History windows on the host: the latest window with settlement and the multi-session
//! reconcile (OV-05), older pages (TL-08, host side) and anchored windows (TL-12, host
//! side).
//!
//! Every builder reads a [`HistorySource`], writes the overlay through
//! [`crate::store::write`] when a page settles rows, and answers with the wire types of
//! timeline-core. Cursors and anchor tokens are sealed with the host's [`HostKey`].
//!
//! - [`latest_window`]: the newest page, then the overlay without the rows whose keys the
//!   page holds (epoch + 1 when an ordinary row left) and without the ephemeral rows the
//!   seed's table lets a latest window drop, in one answer. `windowRevision` is the
//!   global revision counter's value, so a page cut from an older window is never newer
//!   than a fresh window.
//! - [`older_page`]: the rows above a cursor's seam, `orderedBlockKeys` (rows, then the
//!   seam), `windowRevision` = cursor revision + 1, and the next cursor whose seam is the
//!   page's top row. One request reads up to four source pages until one yields a visible
//!   row.
//! - [`anchored_window`]: always 40 rows; a place in the newest 40 gives the newest
//!   window; a place further back gives a page in the past with `newerCursor` and no
//!   overlay; `newer` loads continue with no gap and no overlap until the present.
//!
//! Cost: every scan checks each item once, when its page arrives, so a builder's time is
//! linear in the items it reads (an anchored load with its place D rows back reads D
//! rows). A `newer` load resumes at the page it follows through
//! [`HistorySource::read_newer`] and reads only the items it returns; only a token whose
//! position the source no longer holds scans back from the present for the page's last
//! row. The tests pin these builders to the earlier ones that re-checked every item read
//! so far and scanned from the present for each newer page (`naive`, test-only). A
//! latest window reads the settled overlay's rows straight from the stored version: one
//! copy of each wire block for the answer (the whole stored form is built only when the
//! window wrote, for the live sinks), and the 8 MiB check adds the rows' JSON sizes,
//! which each row keeps once counted ([`crate::store::OverlayRows::client_blocks_json_len`]),
//! instead of serializing the overlay again; answers are measured by counting, never
//! built as text.
//! - [`reconcile_sessions`]: up to 16 sessions, each with its latest window, overlay,
//!   outbox (at most 256 entries) and active run, with the 8 MiB cap checked while the
//!   answer grows.
//!
//! # Which ephemeral rows a latest window keeps (OV-03)
//!
//! The seed's table, class by class ([`leaves_latest_window`]):
//!
//! | class | no current run | its own run current | another run current |
//! |---|---|---|---|
//! | status row | kept | kept | dropped |
//! | context-compacting marker | dropped | kept | dropped |
//! | parent progress mirror | kept | kept | dropped |
//! | approval card | kept | kept | kept |
//!
//! With a current run the overlay's own [`Change::LatestWindow`] rule is exactly that
//! table, so the window is one write. With none, that rule would also drop status rows
//! and mirrors, so the window settles the page's keys ([`Change::Settle`]) and then
//! retracts what the table drops ([`Change::Retract`]): two writes at most, neither of
//! which raises the epoch for an ephemeral row.
//!
//! # Failures keep what was saved
//!
//! A settlement raises epochs that clients learn of only from the saved snapshot. A
//! builder that fails after it saved one (a store error on its second write, the 8 MiB
//! cap, a later session of a reconcile) returns a [`BuildError`] that carries, with the
//! error, the newest snapshot saved for each target it wrote, so the caller still sends
//! them to the live sinks ("the producer saves first and sends the saved snapshot").

use std::collections::{HashSet, VecDeque};

use serde::Serialize;
use timeline_core::anchor::{Anchor, AnchorError, AnchorToken, NewerPlace};
use timeline_core::block::Block;
use timeline_core::cursor::{BoundaryToken, ClaudeCursor, CodexCursor, CursorError};
use timeline_core::key::{BlockKey, RunId, SessionId, TargetId};
use timeline_core::policy::{
    effective_page_size, PageSizeError, ANCHORED_PAGE_SIZE, RECONCILE_MAX_OUTBOX_ENTRIES,
    RECONCILE_MAX_SESSIONS, RESPONSE_CAP_BYTES, SNAPSHOT_TOO_LARGE_CODE,
};
use timeline_core::seal::HostKey;
use timeline_core::wire::{
    LiveOverlay, OlderPage, TimelineWindow, MESSAGE_NOT_SAVED_NOTICE, ROW_NOT_SAVED_NOTICE,
};

use crate::overlay::Change;
use crate::source::{HistorySource, SourceError, SourceItem, SourceKind, SourcePosition};
use crate::store::{self, WriteResult};
use crate::store::{OverlayError, OverlayStore, RowClass, Snapshot, StoredBlock, StoredOverlay};

/// Source pages one older-page request may read before it answers.
pub const MAX_SOURCE_READS_PER_PAGE: usize = 4;
/// Source pages a scan for an anchored place may read.
pub const MAX_SOURCE_READS_PER_SCAN: usize = 10_000;

/// Why a window could not be built.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum WindowError {
    /// Bad request parameters (page size, counts).
    #[error("invalid params: {0}")]
    InvalidParams(String),
    /// The cursor was refused.
    #[error(transparent)]
    Cursor(#[from] CursorError),
    /// The anchor was refused.
    #[error(transparent)]
    Anchor(#[from] AnchorError),
    /// The history source failed.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The overlay store failed.
    #[error(transparent)]
    Store(#[from] OverlayError),
    /// The answer would pass 8 MiB.
    #[error("timeline snapshot too large ({bytes} bytes)")]
    TooLarge {
        /// The size reached when the builder stopped.
        bytes: usize,
    },
}

/// The `errorCode` of a refused cursor or anchor ("reload the timeline").
pub const INVALID_CURSOR_CODE: &str = "INVALID_CURSOR";

impl WindowError {
    /// The `errorCode` a client receives.
    pub fn error_code(&self) -> &'static str {
        match self {
            WindowError::TooLarge { .. } => SNAPSHOT_TOO_LARGE_CODE,
            WindowError::InvalidParams(_)
            | WindowError::Anchor(AnchorError::InvalidParams(_))
            | WindowError::Cursor(CursorError::TooLong { .. }) => "INVALID_PARAMS",
            WindowError::Cursor(_) | WindowError::Anchor(_) => INVALID_CURSOR_CODE,
            WindowError::Source(_) | WindowError::Store(_) => "HISTORY_UNAVAILABLE",
        }
    }
}

/// A builder that failed, with every overlay its settlement saved before the failure.
///
/// `written` holds, per (session, target) the builder wrote, the newest snapshot saved
/// for it (it holds every earlier write of that target). The caller sends them to the
/// live sinks as after a success: they are stored, and a raised settlement epoch reaches
/// clients only through them. Empty when the builder failed before it wrote.
///
/// It reads as its `error` (`Display` and `source` are the error's), so the message a
/// client receives is the same whether or not something was saved.
#[derive(Clone, Debug, PartialEq)]
pub struct BuildError {
    /// Why the builder stopped.
    pub error: WindowError,
    /// The overlays saved before it stopped, by (session, target), in the order written.
    pub written: Vec<(SessionId, TargetId, StoredOverlay)>,
}

impl BuildError {
    /// The `errorCode` a client receives.
    pub fn error_code(&self) -> &'static str {
        self.error.error_code()
    }
}

impl std::fmt::Display for BuildError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.error, f)
    }
}

impl std::error::Error for BuildError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.error)
    }
}

/// `error` from a step before the builder saved anything.
fn unsaved(error: impl Into<WindowError>) -> BuildError {
    BuildError {
        error: error.into(),
        written: Vec::new(),
    }
}

/// A single-target build's outcome with what its settlement saved: the window, or the
/// error with the saved snapshot.
fn with_saved(
    t: Target<'_>,
    built: Result<TimelineWindow, WindowError>,
    settled: Option<StoredOverlay>,
) -> Result<BuiltWindow, BuildError> {
    match built {
        Ok(window) => Ok(BuiltWindow { window, settled }),
        Err(error) => Err(BuildError {
            error,
            written: settled
                .map(|stored| (t.session.clone(), t.target.clone(), stored))
                .into_iter()
                .collect(),
        }),
    }
}

/// Which timeline a request is for.
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    /// The app session.
    pub session: &'a SessionId,
    /// The timeline target.
    pub target: &'a TargetId,
    /// The session's active run, if any (latest windows keep its ephemerals).
    pub current_run: Option<&'a RunId>,
}

/// A built latest window and the snapshot its settlement stored, if it changed the
/// overlay (the caller sends that snapshot to the live sinks).
#[derive(Clone, Debug, PartialEq)]
pub struct BuiltWindow {
    /// The answer.
    pub window: TimelineWindow,
    /// The newest overlay the settlement stored, when it wrote (with no current run it
    /// may write twice, settling then retracting; this one holds both).
    pub settled: Option<StoredOverlay>,
}

/// Items read back from a position, newest first, and the first of them a scan looked
/// for.
struct Scan {
    items: Vec<SourceItem>,
    more: bool,
    /// The index in `items` of the newest item `wanted` held for, if any.
    found: Option<usize>,
}

/// Reads newest first from `before` until an item satisfies `wanted`, the history ends,
/// or `max_reads` reads were made. Each item is checked once, when its page arrives, so
/// a scan costs time linear in the items it reads.
fn scan_back(
    source: &mut dyn HistorySource,
    before: Option<&SourcePosition>,
    page: usize,
    max_reads: usize,
    mut wanted: impl FnMut(&SourceItem) -> bool,
) -> Result<Scan, SourceError> {
    let mut items: Vec<SourceItem> = Vec::new();
    let mut position = before.cloned();
    let mut more = true;
    let mut found = None;
    for _ in 0..max_reads {
        let p = source.read(position.as_ref(), page)?;
        more = p.more;
        let checked = items.len();
        found = p.items.iter().position(&mut wanted).map(|i| checked + i);
        items.extend(p.items);
        if found.is_some() || !more {
            break;
        }
        match items.last() {
            Some(last) => position = Some(last.position.clone()),
            None => {
                more = false;
                break;
            }
        }
    }
    Ok(Scan { items, more, found })
}

/// True when `item` projects to the row `key` (compared in place, no key is built).
fn holds(item: &SourceItem, key: &BlockKey) -> bool {
    item.blocks
        .iter()
        .any(|b| b.block_type == key.block_type && b.id == key.id)
}

/// True when `item` projects to a visible row.
fn is_visible(item: &SourceItem) -> bool {
    !item.blocks.is_empty()
}

fn visible_rows(items: &[SourceItem]) -> usize {
    items.iter().map(|i| i.blocks.len()).sum()
}

/// Rows of `items` (newest first) in canonical order.
fn rows_of(items: &[SourceItem]) -> Vec<Block> {
    let mut rows: Vec<Block> = items
        .iter()
        .flat_map(|i| i.blocks.iter().cloned())
        .collect();
    rows.sort_by_cached_key(Block::order_key);
    rows
}

fn encode_cursor(
    kind: &SourceKind,
    token: &BoundaryToken,
    key: &HostKey,
    position: &SourcePosition,
    seam: BlockKey,
    revision: u64,
) -> String {
    match kind {
        SourceKind::Codex {
            thread_id,
            generation,
        } => CodexCursor {
            thread_id: thread_id.clone(),
            sidecar_cursor: Some(position.0.clone()),
            generation: *generation,
            source_token: token.clone(),
            seam,
            window_revision: revision,
        }
        .encode(key),
        SourceKind::Claude { session } => ClaudeCursor {
            session: session.clone(),
            before: position.0.clone(),
            anchor: seam,
            revision,
        }
        .encode(key),
    }
}

/// The `oldestCursor` of a window built from `items` (newest first) into `rows`: where
/// the source continues, seamed at the window's oldest row; none when the source has no
/// more or the window has no row.
fn window_cursor(
    kind: &SourceKind,
    token: &BoundaryToken,
    key: &HostKey,
    items: &[SourceItem],
    rows: &[Block],
    more: bool,
    revision: u64,
) -> Option<String> {
    match (more, items.last(), rows.first()) {
        (true, Some(item), Some(top)) => Some(encode_cursor(
            kind,
            token,
            key,
            &item.position,
            top.key(),
            revision,
        )),
        _ => None,
    }
}

/// A decoded cursor of either form.
struct DecodedCursor {
    position: SourcePosition,
    seam: BlockKey,
    revision: u64,
}

fn decode_cursor(
    kind: &SourceKind,
    token: &BoundaryToken,
    key: &HostKey,
    text: &str,
) -> Result<DecodedCursor, CursorError> {
    match kind {
        SourceKind::Codex { thread_id, .. } => {
            let c = CodexCursor::decode(text, key, thread_id, token)?;
            Ok(DecodedCursor {
                position: SourcePosition(c.sidecar_cursor.ok_or(CursorError::Invalid)?),
                seam: c.seam,
                revision: c.window_revision,
            })
        }
        SourceKind::Claude { session } => {
            let c = ClaudeCursor::decode(text, key, session)?;
            Ok(DecodedCursor {
                position: SourcePosition(c.before),
                seam: c.anchor,
                revision: c.revision,
            })
        }
    }
}

/// A refused `pageSize` as invalid params, named once: "invalid params: pageSize must
/// be between 1 and 640".
fn page_size_error(e: PageSizeError) -> WindowError {
    WindowError::InvalidParams(match e {
        PageSizeError::OutOfRange { max } => format!("pageSize must be between 1 and {max}"),
        other => other.to_string(),
    })
}

/// The size of `value` serialized as JSON, counted without building the text.
fn json_len<T: Serialize>(value: &T) -> Result<usize, WindowError> {
    crate::store::rows::json_len(value).map_err(|e| WindowError::InvalidParams(e.to_string()))
}

fn check_size<T: Serialize>(value: &T) -> Result<usize, WindowError> {
    cap(json_len(value)?)
}

fn cap(bytes: usize) -> Result<usize, WindowError> {
    if bytes > RESPONSE_CAP_BYTES {
        return Err(WindowError::TooLarge { bytes });
    }
    Ok(bytes)
}

/// [`check_size`] of `window` carrying `overlay`, whose blocks are known to take
/// `blocks_json_len` bytes as array members: the window is serialized with the
/// overlay's blocks left out (`"blocks":[]`) and their size added, so the overlay's rows
/// are not serialized again. Returns the window with the overlay in it.
fn window_with_overlay(
    mut window: TimelineWindow,
    overlay: SettledOverlay,
) -> Result<TimelineWindow, WindowError> {
    let SettledOverlay {
        mut overlay,
        blocks_json_len,
    } = overlay;
    let blocks = std::mem::take(&mut overlay.blocks);
    window.live_overlay = Some(overlay);
    let bytes = json_len(&window)?.saturating_add(blocks_json_len);
    cap(bytes)?;
    if let Some(o) = window.live_overlay.as_mut() {
        o.blocks = blocks;
    }
    Ok(window)
}

/// True when a latest window drops the ephemeral `row`, the seed's table class by class
/// (OV-03): a status row and a parent progress mirror "when another run is the current
/// run"; a context-compacting marker "when its run is not the current run"; an approval
/// card never ("it stays with its decision"). Ordinary rows leave only when history holds
/// their key, never by this rule.
pub fn leaves_latest_window(row: &StoredBlock, current_run: Option<&RunId>) -> bool {
    match row.class {
        RowClass::Status | RowClass::ProgressMirror => {
            current_run.is_some_and(|current| row.run_id.as_ref() != Some(current))
        }
        RowClass::CompactingMarker => {
            current_run.is_none_or(|current| row.run_id.as_ref() != Some(current))
        }
        RowClass::Ordinary | RowClass::ApprovalCard => false,
    }
}

/// Notes the snapshot `result` stored, if it wrote, in `settled` (its whole form, built
/// once).
fn noting(result: WriteResult, settled: &mut Option<StoredOverlay>) -> WriteResult {
    if let WriteResult::Written { stored, .. } = &result {
        *settled = Some(stored.to_stored());
    }
    result
}

/// A settled overlay in client form, and the size of its blocks as JSON array members
/// (every block and the commas between them), known from the rows without serializing
/// them again.
struct SettledOverlay {
    overlay: LiveOverlay,
    blocks_json_len: usize,
}

/// Settles the overlay against `rows` like a latest window (see the module docs for
/// which ephemeral rows leave) and returns the client form. Every snapshot it stores is
/// noted in `settled` as soon as it is stored, so a failure of a later write loses none.
///
/// Cost: the write (O((h + e) log n), [`crate::overlay`]), one copy of each wire block
/// for the answer, and the whole stored form only when the window wrote (for
/// `settled`).
fn settle_against<S: OverlayStore + ?Sized>(
    store: &mut S,
    t: Target<'_>,
    rows: &[Block],
    settled: &mut Option<StoredOverlay>,
) -> Result<SettledOverlay, OverlayError> {
    let history_keys: HashSet<BlockKey> = rows.iter().map(Block::key).collect();
    // `Change::LatestWindow` is the seed's table, with or without a current run: one
    // atomic write.
    let change = Change::LatestWindow {
        history_keys,
        current_run: t.current_run.cloned(),
    };
    let result = noting(store::write(store, t.session, t.target, &change)?, settled);
    // The client form straight from the rows: one copy of each block, and no whole
    // stored form when the window settled nothing.
    Ok(result.snapshot().map_or(
        SettledOverlay {
            overlay: LiveOverlay {
                settlement_epoch: 0,
                revision: 0,
                blocks: Vec::new(),
            },
            blocks_json_len: 0,
        },
        |snapshot: &Snapshot| SettledOverlay {
            overlay: snapshot.client_form(),
            blocks_json_len: snapshot.rows().client_blocks_json_len(),
        },
    ))
}

/// Builds the latest window of `page_size` rows (decoded up to 640, served up to 100).
///
/// On a failure after the settlement saved the overlay, the [`BuildError`] carries the
/// saved snapshot for the live sinks.
pub fn latest_window<S: OverlayStore + ?Sized>(
    store: &mut S,
    source: &mut dyn HistorySource,
    key: &HostKey,
    t: Target<'_>,
    page_size: usize,
) -> Result<BuiltWindow, BuildError> {
    let page_size = effective_page_size(page_size).map_err(|e| unsaved(page_size_error(e)))?;
    // Read until a visible row shows (or history ends), so an answer is never a false
    // empty conversation.
    let scan = scan_back(
        source,
        None,
        page_size,
        MAX_SOURCE_READS_PER_SCAN,
        is_visible,
    )
    .map_err(unsaved)?;
    present_window(store, source, key, t, scan.items, scan.more)
}

fn present_window<S: OverlayStore + ?Sized>(
    store: &mut S,
    source: &mut dyn HistorySource,
    key: &HostKey,
    t: Target<'_>,
    items: Vec<SourceItem>,
    more: bool,
) -> Result<BuiltWindow, BuildError> {
    let mut settled = None;
    let built = present_rows(store, source, key, t, items, more, &mut settled);
    with_saved(t, built, settled)
}

/// The window of the newest `items` with the settled overlay; what the settlement
/// stored goes to `settled` even when a later step fails.
fn present_rows<S: OverlayStore + ?Sized>(
    store: &mut S,
    source: &mut dyn HistorySource,
    key: &HostKey,
    t: Target<'_>,
    items: Vec<SourceItem>,
    more: bool,
    settled: &mut Option<StoredOverlay>,
) -> Result<TimelineWindow, WindowError> {
    let rows = rows_of(&items);
    let overlay = settle_against(store, t, &rows, settled)?;
    let revision = store.current_revision()?;
    let token = source.boundary_token();
    let oldest_cursor = window_cursor(&source.kind(), &token, key, &items, &rows, more, revision);
    let window = TimelineWindow {
        blocks: rows,
        oldest_cursor,
        boundary_token: token,
        window_revision: revision,
        live_overlay: None,
        anchor_row: None,
        anchor_notice: None,
        newer_cursor: None,
    };
    window_with_overlay(window, overlay)
}

/// The rows of a newer load that reaches the present (`items`, newest first), with the
/// settled overlay and no cursor.
fn present_newer<S: OverlayStore + ?Sized>(
    store: &mut S,
    source: &mut dyn HistorySource,
    t: Target<'_>,
    items: &[SourceItem],
) -> Result<BuiltWindow, BuildError> {
    let mut settled = None;
    let built = present_newer_rows(store, source, t, items, &mut settled);
    with_saved(t, built, settled)
}

/// [`present_newer`]'s window; what the settlement stored goes to `settled` even when a
/// later step fails.
fn present_newer_rows<S: OverlayStore + ?Sized>(
    store: &mut S,
    source: &mut dyn HistorySource,
    t: Target<'_>,
    items: &[SourceItem],
    settled: &mut Option<StoredOverlay>,
) -> Result<TimelineWindow, WindowError> {
    let rows = rows_of(items);
    let overlay = settle_against(store, t, &rows, settled)?;
    let window = TimelineWindow {
        blocks: rows,
        oldest_cursor: None,
        boundary_token: source.boundary_token(),
        window_revision: store.current_revision()?,
        live_overlay: None,
        anchor_row: None,
        anchor_notice: None,
        newer_cursor: None,
    };
    window_with_overlay(window, overlay)
}

/// An older-page request.
#[derive(Clone, Copy, Debug)]
pub struct OlderPageRequest<'a> {
    /// `beforeCursor`: where the older page ends, from the previous answer.
    pub cursor: &'a str,
    /// `pageSize`: the rows asked for.
    pub page_size: usize,
    /// `expectedBoundaryToken`, as the client holds it.
    pub expected_boundary_token: Option<&'a BoundaryToken>,
}

/// Builds an older page. A source token that differs from `expectedBoundaryToken`, or a
/// position the source no longer holds, answers an empty page with `reloadRequired`; a
/// Codex cursor written for another source fails with "Timeline source changed".
pub fn older_page(
    source: &mut dyn HistorySource,
    key: &HostKey,
    req: OlderPageRequest<'_>,
) -> Result<OlderPage, WindowError> {
    let page_size = effective_page_size(req.page_size).map_err(page_size_error)?;
    let token = source.boundary_token();
    if req.expected_boundary_token.is_some_and(|t| t != &token) {
        return Ok(OlderPage::reload_required());
    }
    let kind = source.kind();
    let cursor = decode_cursor(&kind, &token, key, req.cursor)?;
    let scan = match scan_back(
        source,
        Some(&cursor.position),
        page_size,
        MAX_SOURCE_READS_PER_PAGE,
        is_visible,
    ) {
        Ok(scan) => scan,
        Err(SourceError::PositionGone) => return Ok(OlderPage::reload_required()),
        Err(e) => return Err(e.into()),
    };
    let rows = rows_of(&scan.items);
    let revision = cursor.revision.saturating_add(1);
    let next_seam = rows.first().map_or(cursor.seam.clone(), Block::key);
    let oldest_cursor = match (scan.more, scan.items.last()) {
        (true, Some(item)) => Some(encode_cursor(
            &kind,
            &token,
            key,
            &item.position,
            next_seam,
            revision,
        )),
        _ => None,
    };
    let ordered_block_keys = rows
        .iter()
        .map(Block::key)
        .chain(std::iter::once(cursor.seam.clone()))
        .collect();
    let page = OlderPage {
        blocks: rows,
        boundary_block_keys: vec![cursor.seam],
        ordered_block_keys,
        window_revision: revision,
        oldest_cursor,
        reload_required: false,
    };
    check_size(&page)?;
    Ok(page)
}

/// Builds the window of an anchored load (always [`ANCHORED_PAGE_SIZE`] rows).
pub fn anchored_window<S: OverlayStore + ?Sized>(
    store: &mut S,
    source: &mut dyn HistorySource,
    key: &HostKey,
    t: Target<'_>,
    anchor: &Anchor,
) -> Result<BuiltWindow, BuildError> {
    anchor.check_params().map_err(unsaved)?;
    let (place, notice) = match anchor {
        Anchor::Newer { token } => {
            let place = AnchorToken::decode_newer(token, key).map_err(unsaved)?;
            if place.target != t.target.as_str() || place.source_token != source.boundary_token() {
                return Err(unsaved(AnchorError::Invalid));
            }
            return newer_window(store, source, key, t, &place);
        }
        Anchor::Link { token } => {
            let place = AnchorToken::decode_link(token, key).map_err(unsaved)?;
            let session_ok = place
                .app_session_id
                .as_deref()
                .is_none_or(|s| s == t.session.as_str());
            let thread_ok = match &place.thread_id {
                Some(thread) => thread == t.target.as_str(),
                None => t.target == &TargetId::main(t.session),
            };
            if !(session_ok && thread_ok) {
                return Err(unsaved(AnchorError::Invalid));
            }
            (place.row, MESSAGE_NOT_SAVED_NOTICE)
        }
        Anchor::Row { .. } => (anchor.row_key().map_err(unsaved)?, ROW_NOT_SAVED_NOTICE),
    };
    let Some(found) = scan_for_place(source, &place).map_err(unsaved)? else {
        // No saved place (only live, or gone): the newest window, with a notice.
        let mut built = latest_window(store, source, key, t, ANCHORED_PAGE_SIZE)?;
        built.window.anchor_notice = Some(notice.to_owned());
        return Ok(built);
    };
    if found.rows_to_place <= ANCHORED_PAGE_SIZE {
        let mut built = latest_window(store, source, key, t, ANCHORED_PAGE_SIZE)?;
        if built.window.blocks.iter().any(|b| b.key() == place) {
            built.window.anchor_row = Some(place);
        } else {
            built.window.anchor_notice = Some(notice.to_owned());
        }
        return Ok(built);
    }
    // A page in the past: whole items around the place, about half older, half newer.
    let PlaceScan {
        newer: mut newer_items,
        place: place_item,
        mut older,
        mut more,
        ..
    } = found;
    let mut first = newer_items.len(); // newest item of the window, in newest-first order
    let mut newer = 0;
    while let Some(prev) = first.checked_sub(1).and_then(|p| newer_items.get(p)) {
        if newer + prev.blocks.len() >= HALF_ANCHORED_PAGE {
            break;
        }
        newer += prev.blocks.len();
        first -= 1;
    }
    let mut items: Vec<SourceItem> = newer_items.split_off(first.min(newer_items.len())).into();
    items.push(place_item);
    let older_needed = ANCHORED_PAGE_SIZE.saturating_sub(visible_rows(&items));
    let mut older_rows = visible_rows(&older);
    while older_rows < older_needed && more {
        let Some(from) = older.last().or(items.last()).map(|i| i.position.clone()) else {
            break;
        };
        let page = source.read(Some(&from), older_needed).map_err(unsaved)?;
        more = page.more;
        if page.items.is_empty() {
            break;
        }
        older_rows += visible_rows(&page.items);
        older.extend(page.items);
    }
    let mut taken_rows = 0;
    let mut taken_items = 0;
    for item in &older {
        if taken_rows >= older_needed {
            break;
        }
        taken_rows += item.blocks.len();
        taken_items += 1;
    }
    more |= taken_items < older.len();
    items.extend(older.into_iter().take(taken_items));
    let mut built = past_page(store, source, key, t, items, more).map_err(unsaved)?;
    built.window.anchor_row = Some(place);
    Ok(built)
}

/// Rows of a page in the past newer than its anchored place, at most.
const HALF_ANCHORED_PAGE: usize = ANCHORED_PAGE_SIZE / 2;

/// What the scan for an anchored place keeps: only what the window around the place can
/// use, so its memory does not grow with the distance from the present.
struct PlaceScan {
    /// Rows of every item from the newest down to the place's item, that one included.
    rows_to_place: usize,
    /// The items just newer than the place's, newest first: the nearest ones holding
    /// fewer than [`HALF_ANCHORED_PAGE`] rows and the one after them (trimmed while the
    /// scan goes on, since a window never reaches further).
    newer: VecDeque<SourceItem>,
    /// The item that holds the place.
    place: SourceItem,
    /// The items older than the place's that its page brought, newest first.
    older: Vec<SourceItem>,
    /// True when the source has items older than `older`.
    more: bool,
}

/// Reads newest first from the present until an item holds `place`, the history ends,
/// or [`MAX_SOURCE_READS_PER_SCAN`] reads were made. Each item is looked at once, when
/// its page arrives. `None` when no item holds the place.
fn scan_for_place(
    source: &mut dyn HistorySource,
    place: &BlockKey,
) -> Result<Option<PlaceScan>, SourceError> {
    let mut newer: VecDeque<SourceItem> = VecDeque::new();
    let mut newer_rows = 0usize; // rows in `newer`
    let mut rows_read = 0usize; // rows of every item read
    let mut position: Option<SourcePosition> = None;
    for _ in 0..MAX_SOURCE_READS_PER_SCAN {
        let page = source.read(position.as_ref(), ANCHORED_PAGE_SIZE)?;
        if page.items.is_empty() {
            // A read that brings nothing ends the history, as in `scan_back`.
            break;
        }
        let mut items = page.items.into_iter();
        for item in items.by_ref() {
            rows_read = rows_read.saturating_add(item.blocks.len());
            if holds(&item, place) {
                return Ok(Some(PlaceScan {
                    rows_to_place: rows_read,
                    newer,
                    place: item,
                    older: items.collect(),
                    more: page.more,
                }));
            }
            newer_rows += item.blocks.len();
            newer.push_back(item);
            // The walk from the place toward the present stops at the first item that
            // brings the rows to half a page: anything newer than it is never used.
            while newer.len() > 1
                && newer
                    .front()
                    .is_some_and(|f| newer_rows - f.blocks.len() >= HALF_ANCHORED_PAGE)
            {
                if let Some(f) = newer.pop_front() {
                    newer_rows -= f.blocks.len();
                }
            }
        }
        match newer.back() {
            Some(last) if page.more => position = Some(last.position.clone()),
            _ => break,
        }
    }
    Ok(None)
}

/// A page in the past from `items` (newest first): no overlay, a `newerCursor`.
fn past_page<S: OverlayStore + ?Sized>(
    store: &mut S,
    source: &mut dyn HistorySource,
    key: &HostKey,
    t: Target<'_>,
    items: Vec<SourceItem>,
    more: bool,
) -> Result<BuiltWindow, WindowError> {
    let rows = rows_of(&items);
    let revision = store.current_revision()?;
    let token = source.boundary_token();
    let oldest_cursor = window_cursor(&source.kind(), &token, key, &items, &rows, more, revision);
    let newer_cursor = match (items.first(), rows.last()) {
        (Some(item), Some(last)) => Some(
            AnchorToken::Newer(NewerPlace {
                target: t.target.as_str().to_owned(),
                source_token: token.clone(),
                after: last.key(),
                position: Some(item.position.0.clone()),
            })
            .encode(key),
        ),
        _ => None,
    };
    let window = TimelineWindow {
        blocks: rows,
        oldest_cursor,
        boundary_token: token,
        window_revision: revision,
        live_overlay: None,
        anchor_row: None,
        anchor_notice: None,
        newer_cursor,
    };
    check_size(&window)?;
    Ok(BuiltWindow {
        window,
        settled: None,
    })
}

/// The rows after a page in the past: the next 40, or the rest with the overlay when
/// they reach the present.
///
/// The load resumes at the page's newest item (the token's position) and reads forward,
/// so it costs the items it returns. A token without a position, or whose position the
/// source no longer holds, finds the page's last row scanning back from the present.
fn newer_window<S: OverlayStore + ?Sized>(
    store: &mut S,
    source: &mut dyn HistorySource,
    key: &HostKey,
    t: Target<'_>,
    place: &NewerPlace,
) -> Result<BuiltWindow, BuildError> {
    let resumed = match &place.position {
        Some(p) => match read_after(source, &SourcePosition(p.clone())) {
            Ok(next) => next,
            Err(SourceError::PositionGone) => None,
            Err(e) => return Err(unsaved(e)),
        },
        None => None,
    };
    let next = match resumed {
        Some(next) => next,
        None => {
            let scan = scan_back(
                source,
                None,
                ANCHORED_PAGE_SIZE,
                MAX_SOURCE_READS_PER_SCAN,
                |i| holds(i, &place.after),
            )
            .map_err(unsaved)?;
            let Some(at) = scan.found else {
                return Err(unsaved(AnchorError::Invalid));
            };
            let mut newer_items = scan.items;
            newer_items.truncate(at);
            next_of(newer_items)
        }
    };
    if next.present {
        // Reaches the present: these rows and the overlay.
        return present_newer(store, source, t, &next.items);
    }
    let mut built = past_page(store, source, key, t, next.items, true).map_err(unsaved)?;
    // Older paging belongs to the first page in the past; a newer answer carries none.
    built.window.oldest_cursor = None;
    Ok(built)
}

/// The items of a newer load, newest first.
struct NextItems {
    items: Vec<SourceItem>,
    /// True when no item is newer than them.
    present: bool,
}

/// Takes, from `newer_items` (every item newer than a page, newest first), whole items
/// oldest first until they hold [`ANCHORED_PAGE_SIZE`] rows. They reach the present
/// when no item is left.
fn next_of(mut newer_items: Vec<SourceItem>) -> NextItems {
    let mut start = newer_items.len();
    let mut rows = 0;
    while rows < ANCHORED_PAGE_SIZE {
        let Some(item) = start.checked_sub(1).and_then(|s| newer_items.get(s)) else {
            break;
        };
        start -= 1;
        rows += item.blocks.len();
    }
    NextItems {
        present: start == 0,
        items: newer_items.split_off(start),
    }
}

/// Reads forward from `position` (the newest item of a page in the past) the items
/// [`next_of`] would take. `None` when the read budget ends first.
fn read_after(
    source: &mut dyn HistorySource,
    position: &SourcePosition,
) -> Result<Option<NextItems>, SourceError> {
    let mut taken: Vec<SourceItem> = Vec::new(); // oldest first
    let mut rows = 0;
    let mut from = position.clone();
    for _ in 0..MAX_SOURCE_READS_PER_SCAN {
        let page = source.read_newer(&from, ANCHORED_PAGE_SIZE)?;
        // A read that brings nothing ends the history, as in `scan_back`.
        let mut left = !page.items.is_empty() && page.more;
        let mut rest = page.items.into_iter();
        while rows < ANCHORED_PAGE_SIZE {
            let Some(item) = rest.next() else {
                break;
            };
            rows += item.blocks.len();
            from = item.position.clone();
            taken.push(item);
        }
        left |= rest.next().is_some();
        if rows >= ANCHORED_PAGE_SIZE || !left {
            taken.reverse();
            return Ok(Some(NextItems {
                items: taken,
                present: !left,
            }));
        }
    }
    Ok(None)
}

/// One session of a reconcile call.
pub struct ReconcileSession<'a> {
    /// The app session.
    pub session: SessionId,
    /// Its timeline target (the main conversation, usually).
    pub target: TargetId,
    /// Its history source.
    pub source: &'a mut dyn HistorySource,
    /// Its outbox entries, as the outbox serializes them.
    pub outbox: Vec<serde_json::Value>,
    /// Its active run, if any.
    pub active_run: Option<RunId>,
}

/// One session in a reconcile answer.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionSnapshot {
    /// The app session.
    pub app_session_id: SessionId,
    /// The latest window with its overlay.
    pub window: TimelineWindow,
    /// The outbox.
    pub outbox: Vec<serde_json::Value>,
    /// The active run.
    pub active_run: Option<RunId>,
}

/// A reconcile answer: the snapshots, and the overlays the settlement stored (to send to
/// the live sinks).
#[derive(Clone, Debug, PartialEq)]
pub struct Reconciled {
    /// One snapshot per session, in request order.
    pub sessions: Vec<SessionSnapshot>,
    /// Overlays settlement stored, by (session, target).
    pub settled: Vec<(SessionId, TargetId, StoredOverlay)>,
}

/// `run.chatReconcileSessions` (OV-05): at most 16 sessions and 256 outbox entries per
/// session (invalid params past either), the 8 MiB cap checked while the answer grows.
///
/// A failure after some sessions settled (a store error, the cap) returns a
/// [`BuildError`] with the overlays saved so far, for the live sinks.
pub fn reconcile_sessions<S: OverlayStore + ?Sized>(
    store: &mut S,
    key: &HostKey,
    sessions: Vec<ReconcileSession<'_>>,
) -> Result<Reconciled, BuildError> {
    if sessions.len() > RECONCILE_MAX_SESSIONS {
        return Err(unsaved(WindowError::InvalidParams(format!(
            "at most {RECONCILE_MAX_SESSIONS} sessions per call"
        ))));
    }
    if let Some(s) = sessions
        .iter()
        .find(|s| s.outbox.len() > RECONCILE_MAX_OUTBOX_ENTRIES)
    {
        return Err(unsaved(WindowError::InvalidParams(format!(
            "session {} has more than {RECONCILE_MAX_OUTBOX_ENTRIES} outbox entries",
            s.session
        ))));
    }
    let mut out = Reconciled {
        sessions: Vec::with_capacity(sessions.len()),
        settled: Vec::new(),
    };
    match reconcile_each(store, key, sessions, &mut out) {
        Ok(()) => Ok(out),
        Err(error) => Err(BuildError {
            error,
            written: out.settled,
        }),
    }
}

/// The sessions of a reconcile, one after the other, into `out`; every overlay a
/// settlement saves is in `out.settled` even when a later step fails.
fn reconcile_each<S: OverlayStore + ?Sized>(
    store: &mut S,
    key: &HostKey,
    sessions: Vec<ReconcileSession<'_>>,
    out: &mut Reconciled,
) -> Result<(), WindowError> {
    // `{"sessions":[` ... `]}`
    let mut bytes = 14usize;
    for s in sessions {
        let t = Target {
            session: &s.session,
            target: &s.target,
            current_run: s.active_run.as_ref(),
        };
        let built = latest_window(
            store,
            s.source,
            key,
            t,
            timeline_core::policy::INITIAL_PAGE_SIZE,
        )
        .map_err(|failed| {
            out.settled.extend(failed.written);
            failed.error
        })?;
        if let Some(stored) = built.settled {
            out.settled
                .push((s.session.clone(), s.target.clone(), stored));
        }
        let snapshot = SessionSnapshot {
            app_session_id: s.session,
            window: built.window,
            outbox: s.outbox,
            active_run: s.active_run,
        };
        bytes += json_len(&snapshot)? + 1;
        if bytes > RESPONSE_CAP_BYTES {
            return Err(WindowError::TooLarge { bytes });
        }
        out.sessions.push(snapshot);
    }
    Ok(())
}

/// The builders as they were before each page check looked only at the rows it had just
/// read: every scan re-checks all items read so far, and a newer load scans back from
/// the present. Kept as the reference the property tests pin the fast builders to.
#[cfg(test)]
mod naive {
    use super::*;

    /// Items read back from the newest, newest first.
    struct Scan {
        items: Vec<SourceItem>,
        more: bool,
    }

    /// Reads newest first from `before` until `stop` holds for the items read so far, the
    /// history ends, or `max_reads` reads were made.
    fn scan_back(
        source: &mut dyn HistorySource,
        before: Option<&SourcePosition>,
        page: usize,
        max_reads: usize,
        mut stop: impl FnMut(&[SourceItem]) -> bool,
    ) -> Result<Scan, SourceError> {
        let mut items: Vec<SourceItem> = Vec::new();
        let mut position = before.cloned();
        let mut more = true;
        for _ in 0..max_reads {
            let p = source.read(position.as_ref(), page)?;
            more = p.more;
            items.extend(p.items);
            if stop(&items) || !more {
                break;
            }
            match items.last() {
                Some(last) => position = Some(last.position.clone()),
                None => {
                    more = false;
                    break;
                }
            }
        }
        Ok(Scan { items, more })
    }

    /// Builds the latest window of `page_size` rows (decoded up to 640, served up to 100).
    pub(super) fn latest_window<S: OverlayStore + ?Sized>(
        store: &mut S,
        source: &mut dyn HistorySource,
        key: &HostKey,
        t: Target<'_>,
        page_size: usize,
    ) -> Result<BuiltWindow, BuildError> {
        let page_size = effective_page_size(page_size).map_err(|e| unsaved(page_size_error(e)))?;
        // Read until a visible row shows (or history ends), so an answer is never a false
        // empty conversation.
        let scan = scan_back(
            source,
            None,
            page_size,
            MAX_SOURCE_READS_PER_SCAN,
            |items| visible_rows(items) > 0,
        )
        .map_err(unsaved)?;
        present_window(store, source, key, t, scan.items, scan.more)
    }

    /// Builds an older page. A source token that differs from `expectedBoundaryToken`, or a
    /// position the source no longer holds, answers an empty page with `reloadRequired`; a
    /// Codex cursor written for another source fails with "Timeline source changed".
    pub(super) fn older_page(
        source: &mut dyn HistorySource,
        key: &HostKey,
        req: OlderPageRequest<'_>,
    ) -> Result<OlderPage, WindowError> {
        let page_size = effective_page_size(req.page_size).map_err(page_size_error)?;
        let token = source.boundary_token();
        if req.expected_boundary_token.is_some_and(|t| t != &token) {
            return Ok(OlderPage::reload_required());
        }
        let kind = source.kind();
        let cursor = decode_cursor(&kind, &token, key, req.cursor)?;
        let scan = match scan_back(
            source,
            Some(&cursor.position),
            page_size,
            MAX_SOURCE_READS_PER_PAGE,
            |items| visible_rows(items) > 0,
        ) {
            Ok(scan) => scan,
            Err(SourceError::PositionGone) => return Ok(OlderPage::reload_required()),
            Err(e) => return Err(e.into()),
        };
        let rows = rows_of(&scan.items);
        let revision = cursor.revision.saturating_add(1);
        let next_seam = rows.first().map_or(cursor.seam.clone(), Block::key);
        let oldest_cursor = match (scan.more, scan.items.last()) {
            (true, Some(item)) => Some(encode_cursor(
                &kind,
                &token,
                key,
                &item.position,
                next_seam,
                revision,
            )),
            _ => None,
        };
        let ordered_block_keys = rows
            .iter()
            .map(Block::key)
            .chain(std::iter::once(cursor.seam.clone()))
            .collect();
        let page = OlderPage {
            blocks: rows,
            boundary_block_keys: vec![cursor.seam],
            ordered_block_keys,
            window_revision: revision,
            oldest_cursor,
            reload_required: false,
        };
        check_size(&page)?;
        Ok(page)
    }

    /// Builds the window of an anchored load (always [`ANCHORED_PAGE_SIZE`] rows).
    pub(super) fn anchored_window<S: OverlayStore + ?Sized>(
        store: &mut S,
        source: &mut dyn HistorySource,
        key: &HostKey,
        t: Target<'_>,
        anchor: &Anchor,
    ) -> Result<BuiltWindow, BuildError> {
        anchor.check_params().map_err(unsaved)?;
        let (place, notice) = match anchor {
            Anchor::Newer { token } => {
                let place = AnchorToken::decode_newer(token, key).map_err(unsaved)?;
                if place.target != t.target.as_str()
                    || place.source_token != source.boundary_token()
                {
                    return Err(unsaved(AnchorError::Invalid));
                }
                return newer_window(store, source, key, t, &place);
            }
            Anchor::Link { token } => {
                let place = AnchorToken::decode_link(token, key).map_err(unsaved)?;
                let session_ok = place
                    .app_session_id
                    .as_deref()
                    .is_none_or(|s| s == t.session.as_str());
                let thread_ok = match &place.thread_id {
                    Some(thread) => thread == t.target.as_str(),
                    None => t.target == &TargetId::main(t.session),
                };
                if !(session_ok && thread_ok) {
                    return Err(unsaved(AnchorError::Invalid));
                }
                (place.row, MESSAGE_NOT_SAVED_NOTICE)
            }
            Anchor::Row { .. } => (anchor.row_key().map_err(unsaved)?, ROW_NOT_SAVED_NOTICE),
        };
        let scan = scan_back(
            source,
            None,
            ANCHORED_PAGE_SIZE,
            MAX_SOURCE_READS_PER_SCAN,
            |items| {
                items
                    .iter()
                    .any(|i| i.blocks.iter().any(|b| b.key() == place))
            },
        )
        .map_err(unsaved)?;
        let found = scan
            .items
            .iter()
            .position(|i| i.blocks.iter().any(|b| b.key() == place));
        let Some(found) = found else {
            // No saved place (only live, or gone): the newest window, with a notice.
            let mut built = latest_window(store, source, key, t, ANCHORED_PAGE_SIZE)?;
            built.window.anchor_notice = Some(notice.to_owned());
            return Ok(built);
        };
        // Rows newer than the place's item, plus the place's own item.
        let newer_rows = visible_rows(&scan.items[..=found]);
        if newer_rows <= ANCHORED_PAGE_SIZE {
            let mut built = latest_window(store, source, key, t, ANCHORED_PAGE_SIZE)?;
            if built.window.blocks.iter().any(|b| b.key() == place) {
                built.window.anchor_row = Some(place);
            } else {
                built.window.anchor_notice = Some(notice.to_owned());
            }
            return Ok(built);
        }
        // A page in the past: whole items around the place, about half older, half newer.
        let half = ANCHORED_PAGE_SIZE / 2;
        let mut first = found; // newest item of the window (index into newest-first items)
        let mut newer = 0;
        while first > 0 && newer + scan.items[first - 1].blocks.len() < half {
            first -= 1;
            newer += scan.items[first].blocks.len();
        }
        let mut items: Vec<SourceItem> = scan.items[first..=found].to_vec();
        let older_needed = ANCHORED_PAGE_SIZE.saturating_sub(visible_rows(&items));
        let mut older: Vec<SourceItem> = scan.items[found + 1..].to_vec();
        let mut more = scan.more;
        while visible_rows(&older) < older_needed && more {
            let from = older.last().unwrap_or(&scan.items[found]).position.clone();
            let page = source.read(Some(&from), older_needed).map_err(unsaved)?;
            more = page.more;
            if page.items.is_empty() {
                break;
            }
            older.extend(page.items);
        }
        let mut taken_rows = 0;
        let mut taken_items = 0;
        for item in &older {
            if taken_rows >= older_needed {
                break;
            }
            taken_rows += item.blocks.len();
            taken_items += 1;
        }
        more |= taken_items < older.len();
        items.extend(older.into_iter().take(taken_items));
        let mut built = past_page(store, source, key, t, items, more).map_err(unsaved)?;
        built.window.anchor_row = Some(place);
        Ok(built)
    }

    /// The rows after a page in the past: the next 40, or the rest with the overlay when
    /// they reach the present.
    fn newer_window<S: OverlayStore + ?Sized>(
        store: &mut S,
        source: &mut dyn HistorySource,
        key: &HostKey,
        t: Target<'_>,
        place: &NewerPlace,
    ) -> Result<BuiltWindow, BuildError> {
        let position = place.position.clone().map(SourcePosition);
        let holds_place = |i: &SourceItem| {
            Some(&i.position) == position.as_ref()
                || i.blocks.iter().any(|b| b.key() == place.after)
        };
        let scan = scan_back(
            source,
            None,
            ANCHORED_PAGE_SIZE,
            MAX_SOURCE_READS_PER_SCAN,
            |items| items.iter().any(holds_place),
        )
        .map_err(unsaved)?;
        let Some(at) = scan.items.iter().position(holds_place) else {
            return Err(unsaved(AnchorError::Invalid));
        };
        // Items newer than the page, oldest of them first: take whole items up to 40 rows.
        let mut end = at; // exclusive bound in newest-first order
        let mut start = at;
        let mut rows = 0;
        while start > 0 && rows < ANCHORED_PAGE_SIZE {
            start -= 1;
            rows += scan.items[start].blocks.len();
        }
        if start == 0 {
            // Reaches the present: these rows and the overlay.
            end = at;
            return present_newer(store, source, t, &scan.items[..end]);
        }
        let mut built = past_page(store, source, key, t, scan.items[start..end].to_vec(), true)
            .map_err(unsaved)?;
        // Older paging belongs to the first page in the past; a newer answer carries none.
        built.window.oldest_cursor = None;
        Ok(built)
    }
}

/// The fast builders pinned to [`naive`]: for any history, anchor and sequence of newer
/// and older loads (with items removed in between), both answer the same windows and
/// leave the same overlay store.
#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use proptest::prelude::*;
    use timeline_core::anchor::LinkPlace;
    use timeline_core::key::BlockType;
    use timeline_core::order::SourceOrder;
    use timeline_core::time::Millis;

    use super::*;
    use crate::source::{MemorySource, SourcePage};
    use crate::store::memory::MemoryOverlayStore;
    use crate::store::{RowClass, StoredBlock};

    /// A source that reads only backwards: its newer loads go through the provided
    /// `HistorySource::read_newer`.
    struct Backwards(MemorySource);

    impl HistorySource for Backwards {
        fn kind(&self) -> SourceKind {
            self.0.kind()
        }

        fn boundary_token(&self) -> BoundaryToken {
            self.0.boundary_token()
        }

        fn read(
            &mut self,
            before: Option<&SourcePosition>,
            limit: usize,
        ) -> Result<SourcePage, SourceError> {
            self.0.read(before, limit)
        }
    }

    /// The source under test: a memory source, or the same items read only backwards.
    enum Fast {
        Memory(MemorySource),
        Backwards(Backwards),
    }

    impl Fast {
        fn source(&mut self) -> &mut dyn HistorySource {
            match self {
                Fast::Memory(s) => s,
                Fast::Backwards(s) => s,
            }
        }

        fn memory(&mut self) -> &mut MemorySource {
            match self {
                Fast::Memory(s) => s,
                Fast::Backwards(Backwards(s)) => s,
            }
        }
    }

    /// What happens to both sources before a newer load.
    #[derive(Clone, Debug)]
    enum Edit {
        None,
        /// The item the newer token resumes at is removed (compaction).
        RemoveResumePoint,
        /// Some item is removed.
        Remove(prop::sample::Index),
    }

    /// The row a test anchors to.
    #[derive(Clone, Debug)]
    enum Aim {
        Row(prop::sample::Index),
        Link(prop::sample::Index),
        /// The row of that number (`h-<n>`), or a missing one.
        Nth(usize),
        /// A row the history does not hold.
        Missing,
    }

    #[derive(Clone, Debug)]
    struct Case {
        claude: bool,
        backwards: bool,
        /// Per item, the timestamps of its rows (possibly none): ties and rows out of
        /// item order occur. Keys are unique, as TL-01 keeps them.
        items: Vec<Vec<u64>>,
        with_source_order: bool,
        /// History rows that are also live (settlement writes).
        live: Vec<prop::sample::Index>,
        aim: Aim,
        edits: Vec<Edit>,
    }

    fn edit() -> impl Strategy<Value = Edit> {
        prop_oneof![
            6 => Just(Edit::None),
            1 => Just(Edit::RemoveResumePoint),
            1 => any::<prop::sample::Index>().prop_map(Edit::Remove),
        ]
    }

    fn aim() -> impl Strategy<Value = Aim> {
        prop_oneof![
            4 => any::<prop::sample::Index>().prop_map(Aim::Row),
            2 => any::<prop::sample::Index>().prop_map(Aim::Link),
            1 => Just(Aim::Missing),
        ]
    }

    fn case() -> impl Strategy<Value = Case> {
        (
            any::<bool>(),
            any::<bool>(),
            prop::collection::vec(
                prop_oneof![
                    3 => prop::collection::vec(0u64..400, 1..=3),
                    1 => Just(Vec::new()),
                ],
                0..240,
            ),
            any::<bool>(),
            prop::collection::vec(any::<prop::sample::Index>(), 0..4),
            aim(),
            prop::collection::vec(edit(), 0..12),
        )
            .prop_map(
                |(claude, backwards, items, with_source_order, live, aim, edits)| Case {
                    claude,
                    backwards,
                    items,
                    with_source_order,
                    live,
                    aim,
                    edits,
                },
            )
    }

    fn key() -> HostKey {
        HostKey::from_bytes([3; 32])
    }

    fn session() -> SessionId {
        SessionId::new("session-1").unwrap()
    }

    fn row_key(id: &str) -> BlockKey {
        BlockKey::parse(BlockType::AgentReply, id).unwrap()
    }

    struct World {
        source: MemorySource,
        rows: Vec<BlockKey>,
        store: MemoryOverlayStore,
    }

    fn world(case: &Case) -> World {
        let (kind, token) = if case.claude {
            (
                SourceKind::Claude {
                    session: "c".into(),
                },
                BoundaryToken::claude("c"),
            )
        } else {
            (
                SourceKind::Codex {
                    thread_id: "thread-1".into(),
                    generation: 1,
                },
                BoundaryToken::codex_rollout("/rollouts/r.jsonl"),
            )
        };
        let mut source = MemorySource::new(kind, token);
        let mut rows = Vec::new();
        for stamps in &case.items {
            let blocks = stamps
                .iter()
                .map(|&t| {
                    let n = rows.len() as u64;
                    let block = Block::new(row_key(&format!("h-{n}")), Millis(t));
                    rows.push(block.key());
                    if case.with_source_order {
                        block.with_source_order(SourceOrder::history(n, 0))
                    } else {
                        block
                    }
                })
                .collect();
            source.push(blocks);
        }
        let mut store = MemoryOverlayStore::new();
        let s = session();
        let run = RunId::new("run-1").unwrap();
        let mut live: Vec<StoredBlock> = case
            .live
            .iter()
            .filter(|_| !rows.is_empty())
            .map(|i| i.get(&rows).clone())
            .chain(std::iter::once(row_key("live-only")))
            .map(|k| StoredBlock {
                block: Block::new(k, Millis(10_000)).with_source_order(SourceOrder::live(1)),
                class: RowClass::Ordinary,
                run_id: Some(run.clone()),
            })
            .collect();
        live.dedup_by_key(|b| b.block.key());
        store::write(&mut store, &s, &TargetId::main(&s), &Change::Publish(live)).unwrap();
        World {
            source,
            rows,
            store,
        }
    }

    /// The overlay store as a caller sees it.
    fn store_state(store: &mut MemoryOverlayStore) -> (u64, Option<StoredOverlay>) {
        let s = session();
        (
            store.current_revision().unwrap(),
            store.load(&s, &TargetId::main(&s)).unwrap(),
        )
    }

    /// Runs `case` through the fast builders and the reference; fails on the first
    /// answer or store state that differs.
    fn pin(case: &Case) -> Result<(), TestCaseError> {
        let World {
            source,
            rows,
            store,
        } = world(case);
        let (mut fast_store, mut ref_store) = (store.clone(), store);
        let mut ref_source = source.clone();
        let mut fast = if case.backwards {
            Fast::Backwards(Backwards(source))
        } else {
            Fast::Memory(source)
        };
        let s = session();
        let main = TargetId::main(&s);
        let t = Target {
            session: &s,
            target: &main,
            current_run: None,
        };
        let k = key();
        let anchor = match &case.aim {
            Aim::Row(i) if !rows.is_empty() => Anchor::row(i.get(&rows)),
            Aim::Link(i) if !rows.is_empty() => Anchor::Link {
                token: AnchorToken::Link(LinkPlace {
                    app_session_id: None,
                    thread_id: None,
                    row: i.get(&rows).clone(),
                })
                .encode(&k),
            },
            Aim::Nth(n) => Anchor::row(rows.get(*n).unwrap_or(&row_key("missing"))),
            _ => Anchor::row(&row_key("missing")),
        };

        let latest_fast = latest_window(&mut fast_store, fast.source(), &k, t, 12);
        let latest_ref = naive::latest_window(&mut ref_store, &mut ref_source, &k, t, 12);
        prop_assert_eq!(&latest_fast, &latest_ref);
        prop_assert_eq!(store_state(&mut fast_store), store_state(&mut ref_store));

        let first_fast = anchored_window(&mut fast_store, fast.source(), &k, t, &anchor);
        let first_ref = naive::anchored_window(&mut ref_store, &mut ref_source, &k, t, &anchor);
        prop_assert_eq!(&first_fast, &first_ref);
        prop_assert_eq!(store_state(&mut fast_store), store_state(&mut ref_store));
        let Ok(first) = first_fast else {
            return Ok(());
        };

        // Older pages below the first window.
        let mut cursor = first.window.oldest_cursor.clone();
        for _ in 0..8 {
            let Some(c) = cursor else { break };
            let req = OlderPageRequest {
                cursor: &c,
                page_size: 7,
                expected_boundary_token: None,
            };
            let fast_page = older_page(fast.source(), &k, req);
            let ref_page = naive::older_page(&mut ref_source, &k, req);
            prop_assert_eq!(&fast_page, &ref_page);
            cursor = fast_page.ok().and_then(|p| p.oldest_cursor);
        }

        // Newer loads until the present, with the edits in between.
        let mut newer = first.window.newer_cursor;
        let mut edits = case.edits.iter();
        for _ in 0..40 {
            let Some(token) = newer else { break };
            match edits.next() {
                Some(Edit::RemoveResumePoint) => {
                    let place = AnchorToken::decode_newer(&token, &k).unwrap();
                    let at = SourcePosition(place.position.unwrap());
                    prop_assert_eq!(fast.memory().remove(&at), ref_source.remove(&at));
                }
                Some(Edit::Remove(i)) => {
                    let all = ref_source.read(None, usize::MAX).unwrap().items;
                    if !all.is_empty() {
                        let at = i.get(&all).position.clone();
                        prop_assert!(fast.memory().remove(&at) && ref_source.remove(&at));
                    }
                }
                Some(Edit::None) | None => {}
            }
            let anchor = Anchor::Newer { token };
            let next_fast = anchored_window(&mut fast_store, fast.source(), &k, t, &anchor);
            let next_ref = naive::anchored_window(&mut ref_store, &mut ref_source, &k, t, &anchor);
            prop_assert_eq!(&next_fast, &next_ref);
            prop_assert_eq!(store_state(&mut fast_store), store_state(&mut ref_store));
            newer = next_fast.ok().and_then(|b| b.window.newer_cursor);
        }
        Ok(())
    }

    proptest! {
        // TL-12, TL-08: the fast anchored, newer and older builders answer exactly what
        // the reference answers.
        #[test]
        fn fast_builders_answer_what_the_reference_answers(case in case()) {
            pin(&case)?;
        }
    }

    // TL-12: histories of one row per item, anchored far back, then every newer load up
    // to the present, on both kinds of source, resumed at the token's position or (its
    // item removed before each load) found again from the present. The lengths sweep
    // every way the last page can meet the present.
    #[test]
    fn long_newer_chains_match_the_reference() {
        for backwards in [false, true] {
            for resume_gone in [false, true] {
                for n in (100..190).chain([500]) {
                    let case = Case {
                        claude: false,
                        backwards,
                        items: (0..n).map(|i| vec![i]).collect(),
                        with_source_order: true,
                        live: Vec::new(),
                        aim: Aim::Nth(30),
                        edits: vec![
                            if resume_gone {
                                Edit::RemoveResumePoint
                            } else {
                                Edit::None
                            };
                            40
                        ],
                    };
                    pin(&case).unwrap();
                }
            }
        }
    }
}
