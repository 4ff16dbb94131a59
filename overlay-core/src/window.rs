//! History windows on the host: the latest window with settlement and the multi-session
//! reconcile (OV-05), older pages (TL-08, host side) and anchored windows (TL-12, host
//! side).
//!
//! Every builder reads a [`HistorySource`], writes the overlay through
//! [`crate::overlay::write`] when a page settles rows, and answers with the wire types of
//! timeline-core. Cursors and anchor tokens are sealed with the host's [`HostKey`].
//!
//! - [`latest_window`]: the newest page, then the overlay without the rows whose keys the
//!   page holds (epoch + 1 when an ordinary row left) and without ephemerals of
//!   non-current runs, in one answer. `windowRevision` is the global revision counter's
//!   value, so a page cut from an older window is never newer than a fresh window.
//! - [`older_page`]: the rows above a cursor's seam, `orderedBlockKeys` (rows, then the
//!   seam), `windowRevision` = cursor revision + 1, and the next cursor whose seam is the
//!   page's top row. One request reads up to four source pages until one yields a visible
//!   row.
//! - [`anchored_window`]: always 40 rows; a place in the newest 40 gives the newest
//!   window; a place further back gives a page in the past with `newerCursor` and no
//!   overlay; `newer` loads continue with no gap and no overlap until the present.
//! - [`reconcile_sessions`]: up to 16 sessions, each with its latest window, overlay,
//!   outbox (at most 256 entries) and active run, with the 8 MiB cap checked while the
//!   answer grows.

use std::collections::HashSet;

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

use crate::overlay::{self, Change, WriteResult};
use crate::source::{HistorySource, SourceError, SourceItem, SourceKind, SourcePosition};
use crate::store::{OverlayStore, StoreError, StoredOverlay};

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
    Store(#[from] StoreError),
    /// The answer would pass 8 MiB.
    #[error("timeline snapshot too large ({bytes} bytes)")]
    TooLarge {
        /// The size reached when the builder stopped.
        bytes: usize,
    },
}

impl WindowError {
    /// The `errorCode` a client receives.
    pub fn error_code(&self) -> &'static str {
        match self {
            WindowError::TooLarge { .. } => SNAPSHOT_TOO_LARGE_CODE,
            WindowError::InvalidParams(_)
            | WindowError::Anchor(AnchorError::InvalidParams(_))
            | WindowError::Cursor(CursorError::TooLong { .. }) => "INVALID_PARAMS",
            WindowError::Cursor(_) | WindowError::Anchor(_) => "INVALID_CURSOR",
            WindowError::Source(_) | WindowError::Store(_) => "HISTORY_UNAVAILABLE",
        }
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
    /// The overlay the settlement write stored, when it wrote.
    pub settled: Option<StoredOverlay>,
}

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

fn check_size<T: Serialize>(value: &T) -> Result<usize, WindowError> {
    let bytes = serde_json::to_vec(value)
        .map(|v| v.len())
        .map_err(|e| WindowError::InvalidParams(e.to_string()))?;
    if bytes > RESPONSE_CAP_BYTES {
        return Err(WindowError::TooLarge { bytes });
    }
    Ok(bytes)
}

/// Settles the overlay against `rows` like a latest window and returns the client form
/// and the stored snapshot if it changed.
fn settle_against<S: OverlayStore + ?Sized>(
    store: &mut S,
    t: Target<'_>,
    rows: &[Block],
) -> Result<(LiveOverlay, Option<StoredOverlay>), StoreError> {
    let change = Change::LatestWindow {
        history_keys: rows.iter().map(Block::key).collect::<HashSet<_>>(),
        current_run: t.current_run.cloned(),
    };
    let result = overlay::write(store, t.session, t.target, &change)?;
    let overlay = result.stored().map_or(
        LiveOverlay {
            settlement_epoch: 0,
            revision: 0,
            blocks: Vec::new(),
        },
        StoredOverlay::client_form,
    );
    let settled = match result {
        WriteResult::Written { stored, .. } => Some(stored),
        WriteResult::Unchanged(_) => None,
    };
    Ok((overlay, settled))
}

/// Builds the latest window of `page_size` rows (decoded up to 640, served up to 100).
pub fn latest_window<S: OverlayStore + ?Sized>(
    store: &mut S,
    source: &mut dyn HistorySource,
    key: &HostKey,
    t: Target<'_>,
    page_size: usize,
) -> Result<BuiltWindow, WindowError> {
    let page_size = effective_page_size(page_size).map_err(page_size_error)?;
    // Read until a visible row shows (or history ends), so an answer is never a false
    // empty conversation.
    let scan = scan_back(
        source,
        None,
        page_size,
        MAX_SOURCE_READS_PER_SCAN,
        |items| visible_rows(items) > 0,
    )?;
    present_window(store, source, key, t, scan.items, scan.more)
}

fn present_window<S: OverlayStore + ?Sized>(
    store: &mut S,
    source: &mut dyn HistorySource,
    key: &HostKey,
    t: Target<'_>,
    items: Vec<SourceItem>,
    more: bool,
) -> Result<BuiltWindow, WindowError> {
    let rows = rows_of(&items);
    let (overlay, settled) = settle_against(store, t, &rows)?;
    let revision = store.current_revision()?;
    let token = source.boundary_token();
    let oldest_cursor = window_cursor(&source.kind(), &token, key, &items, &rows, more, revision);
    let window = TimelineWindow {
        blocks: rows,
        oldest_cursor,
        boundary_token: token,
        window_revision: revision,
        live_overlay: Some(overlay),
        anchor_row: None,
        anchor_notice: None,
        newer_cursor: None,
    };
    check_size(&window)?;
    Ok(BuiltWindow { window, settled })
}

/// An older-page request.
#[derive(Clone, Copy, Debug)]
pub struct OlderPageRequest<'a> {
    /// `beforeCursor`.
    pub cursor: &'a str,
    /// `pageSize`.
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
pub fn anchored_window<S: OverlayStore + ?Sized>(
    store: &mut S,
    source: &mut dyn HistorySource,
    key: &HostKey,
    t: Target<'_>,
    anchor: &Anchor,
) -> Result<BuiltWindow, WindowError> {
    anchor.check_params()?;
    let (place, notice) = match anchor {
        Anchor::Newer { token } => {
            let place = AnchorToken::decode_newer(token, key)?;
            if place.target != t.target.as_str() || place.source_token != source.boundary_token() {
                return Err(AnchorError::Invalid.into());
            }
            return newer_window(store, source, key, t, &place);
        }
        Anchor::Link { token } => {
            let place = AnchorToken::decode_link(token, key)?;
            let session_ok = place
                .app_session_id
                .as_deref()
                .is_none_or(|s| s == t.session.as_str());
            let thread_ok = match &place.thread_id {
                Some(thread) => thread == t.target.as_str(),
                None => t.target == &TargetId::main(t.session),
            };
            if !(session_ok && thread_ok) {
                return Err(AnchorError::Invalid.into());
            }
            (place.row, MESSAGE_NOT_SAVED_NOTICE)
        }
        Anchor::Row { .. } => (anchor.row_key()?, ROW_NOT_SAVED_NOTICE),
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
    )?;
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
        let page = source.read(Some(&from), older_needed)?;
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
    let mut built = past_page(store, source, key, t, items, more)?;
    built.window.anchor_row = Some(place);
    Ok(built)
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
fn newer_window<S: OverlayStore + ?Sized>(
    store: &mut S,
    source: &mut dyn HistorySource,
    key: &HostKey,
    t: Target<'_>,
    place: &NewerPlace,
) -> Result<BuiltWindow, WindowError> {
    let position = place.position.clone().map(SourcePosition);
    let holds_place = |i: &SourceItem| {
        Some(&i.position) == position.as_ref() || i.blocks.iter().any(|b| b.key() == place.after)
    };
    let scan = scan_back(
        source,
        None,
        ANCHORED_PAGE_SIZE,
        MAX_SOURCE_READS_PER_SCAN,
        |items| items.iter().any(holds_place),
    )?;
    let Some(at) = scan.items.iter().position(holds_place) else {
        return Err(AnchorError::Invalid.into());
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
        let items = scan.items[..end].to_vec();
        let rows = rows_of(&items);
        let (overlay, settled) = settle_against(store, t, &rows)?;
        let window = TimelineWindow {
            blocks: rows,
            oldest_cursor: None,
            boundary_token: source.boundary_token(),
            window_revision: store.current_revision()?,
            live_overlay: Some(overlay),
            anchor_row: None,
            anchor_notice: None,
            newer_cursor: None,
        };
        check_size(&window)?;
        return Ok(BuiltWindow { window, settled });
    }
    let mut built = past_page(store, source, key, t, scan.items[start..end].to_vec(), true)?;
    // Older paging belongs to the first page in the past; a newer answer carries none.
    built.window.oldest_cursor = None;
    Ok(built)
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
pub fn reconcile_sessions<S: OverlayStore + ?Sized>(
    store: &mut S,
    key: &HostKey,
    sessions: Vec<ReconcileSession<'_>>,
) -> Result<Reconciled, WindowError> {
    if sessions.len() > RECONCILE_MAX_SESSIONS {
        return Err(WindowError::InvalidParams(format!(
            "at most {RECONCILE_MAX_SESSIONS} sessions per call"
        )));
    }
    if let Some(s) = sessions
        .iter()
        .find(|s| s.outbox.len() > RECONCILE_MAX_OUTBOX_ENTRIES)
    {
        return Err(WindowError::InvalidParams(format!(
            "session {} has more than {RECONCILE_MAX_OUTBOX_ENTRIES} outbox entries",
            s.session
        )));
    }
    let mut out = Reconciled {
        sessions: Vec::with_capacity(sessions.len()),
        settled: Vec::new(),
    };
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
        )?;
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
        bytes += serde_json::to_vec(&snapshot)
            .map(|v| v.len() + 1)
            .map_err(|e| WindowError::InvalidParams(e.to_string()))?;
        if bytes > RESPONSE_CAP_BYTES {
            return Err(WindowError::TooLarge { bytes });
        }
        out.sessions.push(snapshot);
    }
    Ok(out)
}
