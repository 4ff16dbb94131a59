//! The client timeline reducer (TL-02, TL-03, TL-06, TL-07, TL-08, TL-12, TL-13).
//!
//! One [`Timeline`] per client view (a desktop window or a phone). It merges three
//! inputs into one ordered, duplicate-free list of rows:
//!
//! - canonical history (origin [`Origin::History`]), from latest windows, older pages and
//!   anchored loads;
//! - the live overlay (origin [`Origin::Live`]), from the same windows and from live
//!   updates: whole snapshots ([`Timeline::handle_live_update`]) or patches from the held
//!   revision ([`Timeline::handle_live_patch`]), which reach the same rows;
//! - pending sends (origin [`Origin::Pending`]), the local echo of messages this client
//!   sent, drawn under the key their history row will have.
//!
//! One row shows per key: history over live over pending. A pending echo also hides as
//! soon as any history or live row carries its operation ID. Rows are kept in the
//! canonical order (timestamp, `sourceOrder`, key) by an incremental index, so a live
//! revision costs time in the size of the overlay, not of the timeline.
//!
//! # The life of a pending echo (TL-03)
//!
//! A message the user sends shows at once and never vanishes on its way:
//!
//! 1. [`Timeline::add_pending`] when the user sends it; [`Timeline::await_receipt`] when
//!    the outbox command goes out; [`Timeline::confirm_pending`] when the host's receipt
//!    says it saved the entry.
//! 2. [`Timeline::mark_delivered`] when the sent proof arrives (the agent recorded the
//!    message; the outbox entry leaves the queue). The echo stays until a history or live
//!    row carries the operation, and then retires by itself: the message is always on
//!    screen, as its echo or as its row, whatever order the proof and the rows arrive in.
//! 3. [`Timeline::remove_pending`] only when the user removed or canceled the message:
//!    its echo goes at once. A delivered message is not the user's to take back, so
//!    removing one is refused ([`IgnoreReason::Delivered`]).
//!
//! Once the echo retired, the row stays: the host takes a user row out of the overlay
//! only when history holds it (OV-04), and the client takes that removal only from the
//! latest window that brings the history copy in the same step (TL-06, TL-07). Only a
//! window that moved past the row (it is then older history, where paging reaches it)
//! or a page in the past hides it.
//!
//! The reducer is sans-IO. It asks for loads by returning [`TimelineEffect`]s, takes `now` as an
//! argument, and reports deadlines through [`Timeline::poll_timeout`]. Every response is
//! tagged with the [`RequestTag`] of the effect that asked for it; a response for a target
//! that is no longer current, or one nobody waits for any more, is ignored. An answer
//! handed to the handler of another kind of request ([`IgnoreReason::Misrouted`]) is
//! refused and the request keeps waiting with its own deadline.
//!
//! Waits (TL-13): a latest-window or anchored load (`run.chatLoad`) 115 s, an older page
//! 60 s, the receipt of a send 20 s ([`Timeline::await_receipt`]); a failed or timed-out
//! latest window is retried at most 3 times, after 0.75 s, 1.5 s and 3 s. A deadline
//! passes when `now` reaches it. When the last retry fails too, a first load ends
//! [`LoadState::Failed`] and a reload of a shown window ends [`LoadState::ReloadFailed`]:
//! the rows stay readable and [`Timeline::recover`] tries again.
//!
//! # Drive loop
//!
//! ```
//! use timeline_core::key::TargetId;
//! use timeline_core::time::Millis;
//! use timeline_core::timeline::{ClientMode, TimelineEffect, Timeline};
//!
//! let mut t = Timeline::new(ClientMode::Phone);
//! t.open_target(TargetId::new("session-1").unwrap(), Millis(0));
//! let mut in_flight = Vec::new();
//! while let Some(effect) = t.poll_effect() {
//!     match effect {
//!         TimelineEffect::LoadLatestWindow { tag, page_size, .. } => {
//!             // Send run.chatLoad; later feed the answer to
//!             // t.handle_latest_window(&tag, answer, now).
//!             assert_eq!(page_size, 12);
//!             in_flight.push(tag);
//!         }
//!         _ => {}
//!     }
//! }
//! assert_eq!(in_flight.len(), 1, "one latest window asked for");
//! // When nothing else happens, wake up at the deadline.
//! assert_eq!(t.poll_timeout(), Some(Millis(115_000)));
//! ```
//!
//! # Choices where the seed is silent
//!
//! - A latest window replaces the held window, older pages included. Keeping paged-in
//!   rows above a new page cannot be proven gap-free (a row saved late keeps its older
//!   timestamp and may land between them), so the client never stitches. Instead a
//!   reload asks for enough rows to cover what it shows plus one initial page (at most
//!   100), so the rows the reader sees stay in the new window.
//! - While a page in the past shows (anchored load with `newerCursor`), live rows and
//!   pending echoes are hidden and live updates are ignored; the final `newer` answer,
//!   which reaches the present, brings the overlay back. [`Timeline::recover`] reloads
//!   that page at the reading row instead of jumping to the newest window.
//! - A live update before any window loaded is not applied: the load in flight brings
//!   a complete state. The newest such update is kept, though, because the load may have
//!   been answered before the write it carries.
//!
//! # Never behind a version offered (TL-06)
//!
//! A live update the client cannot take when it comes (a higher epoch, which only a
//! latest window may bring; one before the first window or over a page in the past; a
//! patch from a base the client does not hold) is remembered as the newest version it
//! was offered, with the whole snapshot when it was one. When a window of the present
//! lands, a kept snapshot of the window's epoch that is newer than the window's overlay
//! is applied (within an epoch a higher revision replaces the overlay), and a client
//! still behind the offered version loads the latest window again at once: the host
//! saved that version before it sent it, so a window asked for now carries it. A
//! refused patch waits [`LIVE_GAP_WAIT`] for the whole snapshot that heals it (relay
//! repair), then loads the latest window itself ([`LoadReason::MissedUpdate`]). Once it
//! asked again, the client forgets the offer (an offer that comes while that load
//! travels is kept anew), so a version the host never reaches cannot make it reload
//! forever.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use crate::anchor::Anchor;
use crate::block::Block;
use crate::cursor::BoundaryToken;
use crate::key::{BlockKey, BlockType, OperationId, TargetId};
use crate::order::OrderKey;
use crate::policy::{
    initial_load_retry_delay, ANCHORED_PAGE_SIZE, INITIAL_LOAD_TIMEOUT, INITIAL_PAGE_SIZE,
    LIVE_GAP_WAIT, MAX_PAGE_SIZE, OLDER_PAGE_SIZE, OUTBOX_ACK_TIMEOUT, PAGINATED_LOAD_TIMEOUT,
};
use crate::time::Millis;
use crate::wire::{LiveOverlay, LivePatch, OlderPage, ResponseError, TimelineWindow};

/// Where the client runs. The two differ only in how an older page that no longer fits
/// is handled (TL-08).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientMode {
    /// A desktop window: the seam must be present in the window; a page that does not
    /// fit stops paging from its cursor.
    Desktop,
    /// A phone: the seam must still be the oldest row; a page that does not fit reloads
    /// the latest window.
    Phone,
}

/// Which input a visible row comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Origin {
    /// Canonical history.
    History,
    /// The live overlay.
    Live,
    /// A local echo of a pending send.
    Pending,
}

/// One visible row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Row<'a> {
    /// The input the row comes from.
    pub origin: Origin,
    /// The block.
    pub block: &'a Block,
}

/// What changed in the visible rows since the last [`Timeline::take_row_changes`]: a
/// renderer redraws only these.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RowChanges {
    /// Any row may have changed (a window applied, a target opened, or more keys
    /// changed than the timeline shows): redraw every row.
    All,
    /// These keys changed: first the keys no longer shown, then the shown ones in
    /// canonical order, so each can be put after the row
    /// [`Timeline::row_before`] names, which is then already in place.
    Keys(Vec<BlockKey>),
}

/// The keys changed since the last take; collapsed to "all" once they outnumber the
/// rows (or when a rebuild touched every row).
#[derive(Clone, Debug, Default)]
struct Changed {
    all: bool,
    keys: BTreeSet<BlockKey>,
}

/// Fewer changed keys than this never collapse to "all".
const CHANGED_KEYS_FLOOR: usize = 64;

/// Identifies one request of this timeline. Responses carry it back.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RequestTag {
    /// The target the request was made for.
    pub target: TargetId,
    /// The target generation: it rises at every target switch.
    pub generation: u64,
    /// A number unique within this timeline.
    pub request: u64,
}

/// Why the client asks for the latest window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LoadReason {
    /// The target was opened.
    Open,
    /// A retry of a failed or timed-out load (1-based).
    Retry(u32),
    /// A live update carried a newer settlement epoch.
    EpochAdvanced,
    /// A live update carried the held revision with different rows.
    RevisionConflict,
    /// A phone dropped an older page that no longer fits.
    PageDropped,
    /// The host answered an older page with `reloadRequired`.
    ReloadRequired,
    /// The embedding asked for it.
    Requested,
    /// The live path offered a newer overlay than the held one that could not be taken
    /// in the held epoch: a patch from a base the client does not hold that no whole
    /// snapshot healed within [`LIVE_GAP_WAIT`], or an update that came before the
    /// first window (or over a page in the past) newer than the window that landed.
    MissedUpdate,
    /// The host refused the cursor of the shown page in the past ([`LoadFailure::Invalid`]):
    /// history changed under it, so the present is loaded instead (TL-15).
    PageInvalid,
}

/// What the timeline wants done outside. Drain with [`Timeline::poll_effect`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum TimelineEffect {
    /// Load the latest window (`run.chatLoad`).
    LoadLatestWindow {
        /// Tag to answer with.
        tag: RequestTag,
        /// Rows to ask for.
        page_size: usize,
        /// Why, in words for the user or the log.
        reason: LoadReason,
    },
    /// Load an older page (`run.chatLoadPageBefore`).
    LoadOlderPage {
        /// Tag to answer with.
        tag: RequestTag,
        /// `beforeCursor`: where the older page ends, from the previous answer.
        cursor: String,
        /// `pageSize`: the rows asked for.
        page_size: usize,
        /// `expectedBoundaryToken`: the history source the cursor was written for.
        expected_boundary_token: Option<BoundaryToken>,
    },
    /// Load a window at an anchor.
    LoadAnchored {
        /// Tag to answer with.
        tag: RequestTag,
        /// The anchor.
        anchor: Anchor,
        /// Always [`ANCHORED_PAGE_SIZE`].
        page_size: usize,
    },
    /// Desktop: an older page from this cursor no longer fits; do not page from it again.
    StopPaging {
        /// The cursor.
        cursor: String,
    },
    /// No receipt for a pending send came within [`OUTBOX_ACK_TIMEOUT`] of
    /// [`Timeline::await_receipt`]: tell the user the phone could not confirm the host
    /// saved it (reload the outbox before sending again). The echo stays.
    ReceiptOverdue {
        /// The operation.
        operation_id: OperationId,
    },
}

/// Why a load failed, as the embedding reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LoadFailure {
    /// The host could not answer (transport error, history source unavailable).
    Unavailable,
    /// The answer did not decode or validate.
    Malformed(ResponseError),
    /// The answer would pass the 8 MiB cap (`TIMELINE_SNAPSHOT_TOO_LARGE`).
    SnapshotTooLarge,
    /// No answer before the deadline.
    TimedOut,
    /// The host refused the request's cursor or anchor (`INVALID_CURSOR`, "The timeline
    /// anchor is invalid; reload the timeline"): the page it named is no longer what
    /// history holds (TL-15). For the newer rows of the shown page in the past the
    /// client loads the latest window instead of asking again.
    Invalid,
}

/// Where loading the current target stands.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LoadState {
    /// No target is open.
    Closed,
    /// The first window of the target is loading (`retry` retries so far).
    Loading {
        /// Retries so far.
        retry: u32,
    },
    /// A window is shown.
    Ready,
    /// Loading failed after every retry. The rows that were readable stay; the
    /// embedding offers recovery ([`Timeline::recover`]).
    Failed(LoadFailure),
    /// A window is shown, but reloading it failed after every retry: the rows stay
    /// readable (they may be behind the host). The embedding says so and offers recovery:
    /// [`Timeline::recover`] asks again (with its own retries) and the state returns to
    /// [`LoadState::Ready`]. A window that lands by any other way (a reload in flight,
    /// an anchored load) also returns it to [`LoadState::Ready`].
    ReloadFailed {
        /// Why the last try failed.
        reason: LoadFailure,
        /// The retries tried after the first request before giving up.
        retries: u32,
    },
}

/// Why an input changed nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum IgnoreReason {
    /// The input is for a target or generation that is no longer current.
    StaleTarget,
    /// Nobody waits for this response (already answered or timed out).
    NotInFlight,
    /// A lower settlement epoch than the held one.
    StaleEpoch,
    /// A lower revision within the held epoch.
    StaleRevision,
    /// No window has loaded yet.
    NotLoaded,
    /// A page in the past shows.
    PastPage,
    /// An answer to an older request than the window already shown.
    Superseded,
    /// A live patch from a revision other than the held one (an update was lost on the
    /// way): rows are kept, and the next whole snapshot heals.
    BaseMismatch,
    /// The answer was handed to the handler of another kind of request (for example a
    /// latest-window tag given to [`Timeline::handle_older_page`]). The request keeps
    /// waiting with its own deadline; hand the answer to the right handler.
    Misrouted,
    /// The message was delivered ([`Timeline::mark_delivered`]): its echo stays until a
    /// row carries it, and the user can no longer remove it.
    Delivered,
}

/// Why a page or update was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DropReason {
    /// The seam is no longer in place.
    SeamMoved,
    /// The page revision is not newer than the held one (the same page landing twice).
    RevisionNotNewer,
}

/// What one input did. Returned by every `handle_*` method.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Outcome {
    /// The input changed the timeline.
    Applied,
    /// The input equals what is held.
    Unchanged,
    /// The input was ignored.
    Ignored(IgnoreReason),
    /// Rows are kept and a latest-window load was requested.
    ReloadRequired(LoadReason),
    /// An older page was dropped (desktop: paging from its cursor stopped).
    Dropped(DropReason),
    /// A failed or malformed load; rows are kept. A retry may be scheduled.
    Failed(LoadFailure),
}

/// A send this client made that the timeline echoes until a row carries its operation.
#[derive(Clone, Debug, PartialEq)]
pub struct PendingSend {
    /// The operation.
    pub operation_id: OperationId,
    /// When the user sent it.
    pub created_at: Millis,
    /// What the echo shows (for example `{"text": ...}`).
    pub data: serde_json::Value,
}

/// Where the receipt of a pending send stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Receipt {
    /// The embedding has not said when the outbox command went out.
    NotAwaited,
    /// The outbox command went out; the receipt is due by `deadline`.
    Awaited {
        /// `sent + OUTBOX_ACK_TIMEOUT`.
        deadline: Millis,
    },
    /// No receipt came by the deadline ([`TimelineEffect::ReceiptOverdue`] was emitted).
    Overdue,
    /// The host saved it (receipt received).
    Confirmed,
    /// The sent proof arrived: the agent recorded it. The echo retires as soon as a row
    /// carries the operation.
    Delivered,
}

#[derive(Clone, Debug)]
struct Pending {
    block: Block,
    receipt: Receipt,
}

#[derive(Clone, Debug)]
struct HeldOverlay {
    epoch: u64,
    revision: u64,
    blocks: HashMap<BlockKey, Block>,
}

#[derive(Clone, Debug)]
enum RequestKind {
    Latest { retry: u32 },
    Older { cursor: String },
    Anchored { anchor: Anchor },
}

#[derive(Clone, Debug)]
struct InFlight {
    kind: RequestKind,
    deadline: Millis,
}

/// A newer overlay version the live path offered and the client could not take (TL-06):
/// an update in a higher epoch (taken only from a latest window), one that came before
/// the first window or over a page in the past, or a patch from a base the client does
/// not hold. The client must not end up behind a version it was offered: when a window
/// of the present lands, a kept snapshot of the window's epoch that is newer is applied,
/// and a client still behind loads the latest window again.
#[derive(Clone, Debug)]
struct Behind {
    /// The newest `(settlementEpoch, revision)` offered and not taken.
    version: (u64, u64),
    /// The newest whole snapshot offered and not taken.
    snapshot: Option<LiveOverlay>,
    /// Set by a refused patch: unless a snapshot or a window brings the client up to
    /// [`Behind::version`] by then, the latest window is loaded.
    due: Option<Millis>,
}

impl Behind {
    fn offer(&mut self, version: (u64, u64), snapshot: Option<LiveOverlay>) {
        self.version = self.version.max(version);
        if let Some(s) = snapshot {
            let newer = self.snapshot.as_ref().is_none_or(|k| {
                (k.settlement_epoch, k.revision) < (s.settlement_epoch, s.revision)
            });
            if newer {
                self.snapshot = Some(s);
            }
        }
    }

    /// Asks to catch up by `at` at the latest.
    fn due_by(&mut self, at: Millis) {
        self.due = Some(self.due.map_or(at, |d| d.min(at)));
    }
}

/// Paging state of the window.
#[derive(Clone, Debug, Default)]
struct Paging {
    oldest_cursor: Option<String>,
    boundary_token: Option<BoundaryToken>,
    window_revision: u64,
    /// Desktop: cursors whose page no longer fit.
    dead_cursors: Vec<String>,
    /// `Some` while a page in the past shows.
    newer_cursor: Option<String>,
    anchor_row: Option<BlockKey>,
    anchor_notice: Option<String>,
}

/// The client timeline. See the module docs for the drive loop.
#[derive(Debug)]
pub struct Timeline {
    mode: ClientMode,
    target: Option<TargetId>,
    generation: u64,
    next_request: u64,
    load: LoadState,
    history: HashMap<BlockKey, Block>,
    overlay: Option<HeldOverlay>,
    pending: BTreeMap<OperationId, Pending>,
    /// How many history and live rows carry each operation.
    carried: HashMap<OperationId, u32>,
    paging: Paging,
    reading_row: Option<BlockKey>,
    /// The visible rows in canonical order.
    index: BTreeMap<OrderKey, Origin>,
    /// The index entry of each visible key.
    shown: HashMap<BlockKey, OrderKey>,
    in_flight: BTreeMap<u64, InFlight>,
    /// The request whose window shows (a window of the present, or a place an anchored
    /// load opened); answers to older latest-window or place requests are stale.
    newest_window_request: u64,
    /// The newest request that opens a place (a `link` or `row` anchor); an answer to an
    /// older one is stale, whatever order the answers come in.
    newest_place_request: u64,
    /// A newer overlay version offered and not taken.
    behind: Option<Behind>,
    retry_at: Option<(Millis, u32)>,
    effects: VecDeque<TimelineEffect>,
    /// The rows changed since the last [`Timeline::take_row_changes`].
    changed: Changed,
}

impl Timeline {
    /// An empty timeline with no target.
    pub fn new(mode: ClientMode) -> Timeline {
        Timeline {
            mode,
            target: None,
            generation: 0,
            next_request: 0,
            load: LoadState::Closed,
            history: HashMap::new(),
            overlay: None,
            pending: BTreeMap::new(),
            carried: HashMap::new(),
            paging: Paging::default(),
            reading_row: None,
            index: BTreeMap::new(),
            shown: HashMap::new(),
            in_flight: BTreeMap::new(),
            newest_window_request: 0,
            newest_place_request: 0,
            behind: None,
            retry_at: None,
            effects: VecDeque::new(),
            changed: Changed {
                all: true,
                keys: BTreeSet::new(),
            },
        }
    }

    // ----- accessors -------------------------------------------------------------------

    /// The client mode.
    pub fn mode(&self) -> ClientMode {
        self.mode
    }

    /// The current target.
    pub fn target(&self) -> Option<&TargetId> {
        self.target.as_ref()
    }

    /// Where loading stands.
    pub fn load_state(&self) -> &LoadState {
        &self.load
    }

    /// The visible rows in canonical order.
    pub fn rows(&self) -> impl DoubleEndedIterator<Item = Row<'_>> + '_ {
        self.index.iter().filter_map(|(k, origin)| {
            let block = self.block_of(&k.key, *origin)?;
            Some(Row {
                origin: *origin,
                block,
            })
        })
    }

    /// The number of visible rows.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// True when no row is visible.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// What changed in the visible rows since the last call (every row, the first time).
    /// Costs the number of changed keys, not the number of rows.
    pub fn take_row_changes(&mut self) -> RowChanges {
        let changed = std::mem::take(&mut self.changed);
        if changed.all {
            return RowChanges::All;
        }
        let mut gone: Vec<BlockKey> = Vec::new();
        let mut shown: Vec<(&OrderKey, BlockKey)> = Vec::new();
        for key in changed.keys {
            match self.shown.get(&key) {
                Some(ok) => shown.push((ok, key)),
                None => gone.push(key),
            }
        }
        shown.sort_by(|a, b| a.0.cmp(b.0));
        gone.extend(shown.into_iter().map(|(_, k)| k));
        RowChanges::Keys(gone)
    }

    /// The key of the visible row just before the visible row `key` (`None` for the
    /// first row, or when `key` is not shown).
    pub fn row_before(&self, key: &BlockKey) -> Option<&BlockKey> {
        let ok = self.shown.get(key)?;
        self.index.range(..ok).next_back().map(|(k, _)| &k.key)
    }

    /// The visible row with `key`, if any.
    pub fn row(&self, key: &BlockKey) -> Option<Row<'_>> {
        let ok = self.shown.get(key)?;
        let origin = *self.index.get(ok)?;
        Some(Row {
            origin,
            block: self.block_of(key, origin)?,
        })
    }

    /// The held overlay's `(settlementEpoch, revision)`.
    pub fn overlay_version(&self) -> Option<(u64, u64)> {
        self.overlay.as_ref().map(|o| (o.epoch, o.revision))
    }

    /// The rows of the held overlay, in no particular order: what the client holds of
    /// the host's live overlay at [`Timeline::overlay_version`] (a row that history also
    /// holds is among them; it shows from history).
    pub fn overlay_blocks(&self) -> impl Iterator<Item = &Block> + '_ {
        self.overlay.iter().flat_map(|o| o.blocks.values())
    }

    /// The cursor of the next older page, unless paging from it stopped.
    pub fn oldest_cursor(&self) -> Option<&str> {
        let c = self.paging.oldest_cursor.as_deref()?;
        (!self.paging.dead_cursors.iter().any(|d| d == c)).then_some(c)
    }

    /// The held window revision.
    pub fn window_revision(&self) -> u64 {
        self.paging.window_revision
    }

    /// `Some(token)` while a page in the past shows.
    pub fn newer_cursor(&self) -> Option<&str> {
        self.paging.newer_cursor.as_deref()
    }

    /// The row an anchored load opened.
    pub fn anchor_row(&self) -> Option<&BlockKey> {
        self.paging.anchor_row.as_ref()
    }

    /// The host's notice when an anchored load opened no row.
    pub fn anchor_notice(&self) -> Option<&str> {
        self.paging.anchor_notice.as_deref()
    }

    /// True when the pending send `op` was confirmed by a receipt (or delivered, which
    /// implies it). `None` when no echo of `op` is held.
    pub fn is_pending_confirmed(&self, op: &OperationId) -> Option<bool> {
        self.pending
            .get(op)
            .map(|p| matches!(p.receipt, Receipt::Confirmed | Receipt::Delivered))
    }

    /// True when the pending send `op` was delivered ([`Timeline::mark_delivered`]) and
    /// its echo waits for a row carrying the operation. `None` when no echo of `op` is
    /// held (never added, removed, or retired because a row carries it).
    pub fn is_pending_delivered(&self, op: &OperationId) -> Option<bool> {
        self.pending
            .get(op)
            .map(|p| p.receipt == Receipt::Delivered)
    }

    /// True when no receipt for the pending send `op` came within
    /// [`OUTBOX_ACK_TIMEOUT`] of [`Timeline::await_receipt`].
    pub fn is_receipt_overdue(&self, op: &OperationId) -> Option<bool> {
        self.pending.get(op).map(|p| p.receipt == Receipt::Overdue)
    }

    /// Next effect to carry out.
    #[must_use]
    pub fn poll_effect(&mut self) -> Option<TimelineEffect> {
        self.effects.pop_front()
    }

    /// The earliest deadline at which [`Timeline::handle_timeout`] has work.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Millis> {
        let inflight = self.in_flight.values().map(|f| f.deadline);
        let retry = self.retry_at.map(|(at, _)| at);
        let receipts = self.pending.values().filter_map(|p| match p.receipt {
            Receipt::Awaited { deadline } => Some(deadline),
            _ => None,
        });
        inflight
            .chain(retry)
            .chain(receipts)
            .chain(self.behind.as_ref().and_then(|b| b.due))
            .min()
    }

    // ----- commands --------------------------------------------------------------------

    /// Switches to `target`: every row, pending echo and request of the old target is
    /// dropped, and the latest window is requested. Responses for the old target are
    /// ignored from now on (TL-13).
    pub fn open_target(&mut self, target: TargetId, now: Millis) {
        self.generation += 1;
        self.target = Some(target);
        self.history.clear();
        self.overlay = None;
        self.pending.clear();
        self.carried.clear();
        self.paging = Paging::default();
        self.reading_row = None;
        self.index.clear();
        self.shown.clear();
        self.changed.all = true;
        self.in_flight.clear();
        self.behind = None;
        self.retry_at = None;
        self.load = LoadState::Loading { retry: 0 };
        self.request_latest(LoadReason::Open, 0, now);
    }

    /// Asks for the latest window again (for example on a pull to refresh).
    pub fn reload(&mut self, now: Millis) {
        if self.target.is_some() {
            self.request_latest(LoadReason::Requested, 0, now);
        }
    }

    /// Offers recovery after a failure or a gap: while a page in the past shows, reloads
    /// that page with a row anchor at the reading row (the reading position stays);
    /// otherwise reloads the latest window. [`LoadState::Failed`] becomes
    /// [`LoadState::Loading`] and [`LoadState::ReloadFailed`] becomes [`LoadState::Ready`]
    /// (the rows stay), and the new load has its own retries.
    pub fn recover(&mut self, now: Millis) {
        if self.target.is_none() {
            return;
        }
        let reading = self
            .reading_row
            .clone()
            .or_else(|| self.paging.anchor_row.clone());
        match (&self.paging.newer_cursor, reading) {
            (Some(_), Some(row)) => self.request_anchored(Anchor::row(&row), now),
            _ => {
                if matches!(self.load, LoadState::Failed(_)) {
                    self.load = LoadState::Loading { retry: 0 };
                }
                self.request_latest(LoadReason::Requested, 0, now)
            }
        }
        if matches!(self.load, LoadState::ReloadFailed { .. }) {
            self.load = LoadState::Ready;
        }
    }

    /// Records the row the reader reads, for [`Timeline::recover`].
    pub fn set_reading_row(&mut self, key: Option<BlockKey>) {
        self.reading_row = key;
    }

    /// Asks for the next older page. Returns `false` when there is none to ask for: no
    /// cursor, paging from it stopped, or a page is already loading.
    pub fn load_older(&mut self, now: Millis) -> bool {
        let Some(cursor) = self.oldest_cursor().map(str::to_owned) else {
            return false;
        };
        if self
            .in_flight
            .values()
            .any(|f| matches!(f.kind, RequestKind::Older { .. }))
        {
            return false;
        }
        let Some(tag) = self.tag_for(
            RequestKind::Older {
                cursor: cursor.clone(),
            },
            now,
            PAGINATED_LOAD_TIMEOUT,
        ) else {
            return false;
        };
        self.effects.push_back(TimelineEffect::LoadOlderPage {
            tag,
            cursor,
            page_size: OLDER_PAGE_SIZE,
            expected_boundary_token: self.paging.boundary_token.clone(),
        });
        true
    }

    /// Loads a window at `anchor` (always 40 rows, TL-12). A blank token or row key is
    /// refused here, before anything is sent.
    pub fn load_anchored(
        &mut self,
        anchor: Anchor,
        now: Millis,
    ) -> Result<(), crate::anchor::AnchorError> {
        anchor.check_params()?;
        self.request_anchored(anchor, now);
        Ok(())
    }

    /// Loads the rows after the page in the past. Returns `false` when no page in the
    /// past shows.
    pub fn load_newer(&mut self, now: Millis) -> bool {
        let Some(token) = self.paging.newer_cursor.clone() else {
            return false;
        };
        self.request_anchored(Anchor::Newer { token }, now);
        true
    }

    /// Adds the local echo of a send. Adding the same operation again changes nothing.
    pub fn add_pending(&mut self, send: PendingSend) -> Outcome {
        if self.pending.contains_key(&send.operation_id) {
            return Outcome::Unchanged;
        }
        let key = BlockKey::user_message(&send.operation_id);
        let block = Block::new(key.clone(), send.created_at)
            .with_operation(send.operation_id.clone())
            .with_data(send.data);
        self.pending.insert(
            send.operation_id,
            Pending {
                block,
                receipt: Receipt::NotAwaited,
            },
        );
        self.refresh(&key);
        Outcome::Applied
    }

    /// The outbox command of pending send `op` went out at `now`: its receipt is due
    /// within [`OUTBOX_ACK_TIMEOUT`] (20 s, TL-13). Without one by then,
    /// [`TimelineEffect::ReceiptOverdue`] asks the embedding to say so; the echo stays, so the
    /// text the user wrote is never lost. Calling it again restarts the wait.
    pub fn await_receipt(&mut self, op: &OperationId, now: Millis) -> Outcome {
        match self.pending.get_mut(op) {
            Some(p) if matches!(p.receipt, Receipt::Confirmed | Receipt::Delivered) => {
                Outcome::Unchanged
            }
            Some(p) => {
                p.receipt = Receipt::Awaited {
                    deadline: now.saturating_add(OUTBOX_ACK_TIMEOUT),
                };
                Outcome::Applied
            }
            None => Outcome::Ignored(IgnoreReason::NotInFlight),
        }
    }

    /// Marks a pending send as saved by the host (its receipt arrived, also after it
    /// was overdue). The echo stays until a row carries the operation.
    pub fn confirm_pending(&mut self, op: &OperationId) -> Outcome {
        match self.pending.get_mut(op) {
            Some(p) if !matches!(p.receipt, Receipt::Confirmed | Receipt::Delivered) => {
                p.receipt = Receipt::Confirmed;
                Outcome::Applied
            }
            Some(_) => Outcome::Unchanged,
            None => Outcome::Ignored(IgnoreReason::NotInFlight),
        }
    }

    /// The sent proof of pending send `op` arrived (the agent recorded the message; the
    /// outbox entry leaves the queue). The echo stays until a history or live row carries
    /// the operation and then retires by itself, so the message never leaves the screen
    /// between "sent" and "saved". When a row carries it already, the echo retires now.
    ///
    /// Call this, not [`Timeline::remove_pending`], when the outbox lets go of a message
    /// because it was sent. Returns [`IgnoreReason::NotInFlight`] when no echo of `op` is
    /// held and [`Outcome::Unchanged`] when it is already marked.
    pub fn mark_delivered(&mut self, op: &OperationId) -> Outcome {
        let Some(p) = self.pending.get_mut(op) else {
            return Outcome::Ignored(IgnoreReason::NotInFlight);
        };
        if p.receipt == Receipt::Delivered {
            return Outcome::Unchanged;
        }
        p.receipt = Receipt::Delivered;
        if self.carried.contains_key(op) {
            self.pending.remove(op);
            self.refresh(&BlockKey::user_message(op));
        }
        Outcome::Applied
    }

    /// Drops the echo of a pending send at once, because the user removed or canceled
    /// the message (the outbox no longer holds it and never will send it). A delivered
    /// message ([`Timeline::mark_delivered`]) is refused with
    /// [`IgnoreReason::Delivered`]: its echo stays until its row shows. Returns
    /// [`Outcome::Unchanged`] when no echo of `op` is held.
    pub fn remove_pending(&mut self, op: &OperationId) -> Outcome {
        match self.pending.get(op) {
            None => return Outcome::Unchanged,
            Some(p) if p.receipt == Receipt::Delivered => {
                return Outcome::Ignored(IgnoreReason::Delivered)
            }
            Some(_) => {}
        }
        self.pending.remove(op);
        self.refresh(&BlockKey::user_message(op));
        Outcome::Applied
    }

    // ----- responses -------------------------------------------------------------------

    /// Applies a latest-window answer: history page and overlay in one operation (TL-07),
    /// so no intermediate state lacks a settled row. This is the only way a higher
    /// settlement epoch is taken (TL-06).
    pub fn handle_latest_window(
        &mut self,
        tag: &RequestTag,
        answer: Result<TimelineWindow, LoadFailure>,
        now: Millis,
    ) -> Outcome {
        let retry = match self.take_request(tag, |f| match &f.kind {
            RequestKind::Latest { retry } => Some(*retry),
            _ => None,
        }) {
            Ok(retry) => retry,
            Err(reason) => return Outcome::Ignored(reason),
        };
        let window = match answer.and_then(|w| {
            w.validate().map_err(LoadFailure::Malformed)?;
            if w.live_overlay.is_none() {
                return Err(LoadFailure::Malformed(ResponseError::MissingOverlay));
            }
            Ok(w)
        }) {
            Ok(w) => w,
            Err(failure) => return self.latest_failed(failure, retry, now),
        };
        let outcome = self.apply_present_window(window, tag.request);
        self.catch_up(now);
        outcome
    }

    /// Applies a live overlay update for `target` (TL-06).
    ///
    /// Within the held epoch a higher revision replaces the overlay, a lower one is
    /// ignored, the same revision with other rows reloads. A higher epoch is refused
    /// (rows kept) and the latest window is loaded; when one is already on its way and
    /// lands older than this update, it is loaded again. An update that comes before the
    /// first window or over a page in the past is not applied but kept: a window that
    /// lands older in the same epoch is brought up to it.
    pub fn handle_live_update(
        &mut self,
        target: &TargetId,
        update: LiveOverlay,
        now: Millis,
    ) -> Outcome {
        if self.target.as_ref() != Some(target) {
            return Outcome::Ignored(IgnoreReason::StaleTarget);
        }
        if let Err(e) = update.validate() {
            return Outcome::Failed(LoadFailure::Malformed(e));
        }
        let version = (update.settlement_epoch, update.revision);
        if self.paging.newer_cursor.is_some() {
            self.note_offer(version, Some(update));
            return Outcome::Ignored(IgnoreReason::PastPage);
        }
        let Some(held) = &self.overlay else {
            self.note_offer(version, Some(update));
            return Outcome::Ignored(IgnoreReason::NotLoaded);
        };
        if update.settlement_epoch > held.epoch {
            self.note_offer(version, Some(update));
            return self.require_reload(LoadReason::EpochAdvanced, now);
        }
        if update.settlement_epoch < held.epoch || update.revision < held.revision {
            let reason = if update.settlement_epoch < held.epoch {
                IgnoreReason::StaleEpoch
            } else {
                IgnoreReason::StaleRevision
            };
            return Outcome::Ignored(reason);
        }
        if update.revision == held.revision {
            let same = update.blocks.len() == held.blocks.len()
                && update
                    .blocks
                    .iter()
                    .all(|b| held.blocks.get(&b.key()) == Some(b));
            return if same {
                Outcome::Unchanged
            } else {
                self.require_reload(LoadReason::RevisionConflict, now)
            };
        }
        self.replace_overlay(update);
        self.settle_behind();
        Outcome::Applied
    }

    /// Applies a live patch for `target` (TL-06 for patches, `docs/live-patches.md`).
    ///
    /// Within the held epoch, a patch whose `baseRevision` is the held revision is applied
    /// in one step and leaves the same rows as the snapshot of its `revision`; a patch to
    /// a revision not above the held one is ignored ([`IgnoreReason::StaleRevision`]); a
    /// patch from another base is ignored ([`IgnoreReason::BaseMismatch`]) and the next
    /// snapshot heals; when none comes within [`LIVE_GAP_WAIT`],
    /// [`Timeline::handle_timeout`] loads the latest window
    /// ([`LoadReason::MissedUpdate`]). The embedding may also tell the host that the
    /// recipient lost its base, so its next update is whole (the host's
    /// `LiveHub::report_lost`). A patch in a higher epoch asks for the latest window, like a
    /// snapshot would; a lower epoch is stale. A removal of a row the held revision does
    /// not have (or an append to a row without text) means the held revision differs
    /// from the host's: nothing is applied and the latest window is requested
    /// ([`LoadReason::RevisionConflict`]). Rows are kept
    /// whenever the patch is not applied.
    pub fn handle_live_patch(
        &mut self,
        target: &TargetId,
        patch: LivePatch,
        now: Millis,
    ) -> Outcome {
        if self.target.as_ref() != Some(target) {
            return Outcome::Ignored(IgnoreReason::StaleTarget);
        }
        if let Err(e) = patch.validate() {
            return Outcome::Failed(LoadFailure::Malformed(e));
        }
        let version = (patch.settlement_epoch, patch.revision);
        if self.paging.newer_cursor.is_some() {
            self.note_offer(version, None);
            return Outcome::Ignored(IgnoreReason::PastPage);
        }
        let Some(held) = &self.overlay else {
            self.note_offer(version, None);
            return Outcome::Ignored(IgnoreReason::NotLoaded);
        };
        if patch.settlement_epoch > held.epoch {
            self.note_offer(version, None);
            return self.require_reload(LoadReason::EpochAdvanced, now);
        }
        if patch.settlement_epoch < held.epoch {
            return Outcome::Ignored(IgnoreReason::StaleEpoch);
        }
        if patch.revision <= held.revision {
            return Outcome::Ignored(IgnoreReason::StaleRevision);
        }
        if patch.base_revision != held.revision {
            // An update was lost on the way. The next whole snapshot heals; unless one
            // comes within LIVE_GAP_WAIT, the latest window is loaded.
            self.note_offer(version, None);
            if let Some(b) = &mut self.behind {
                b.due_by(now.saturating_add(LIVE_GAP_WAIT));
            }
            return Outcome::Ignored(IgnoreReason::BaseMismatch);
        }
        let appendable = |k: &BlockKey| {
            held.blocks
                .get(k)
                .is_some_and(|b| b.data.get("text").is_some_and(serde_json::Value::is_string))
        };
        if patch.removals.iter().any(|k| !held.blocks.contains_key(k))
            || patch.appends.iter().any(|a| !appendable(&a.key))
        {
            return self.require_reload(LoadReason::RevisionConflict, now);
        }
        self.apply_patch(patch);
        self.settle_behind();
        Outcome::Applied
    }

    /// Applies an older-page answer (TL-08).
    pub fn handle_older_page(
        &mut self,
        tag: &RequestTag,
        answer: Result<OlderPage, LoadFailure>,
        now: Millis,
    ) -> Outcome {
        let cursor = match self.take_request(tag, |f| match &f.kind {
            RequestKind::Older { cursor } => Some(cursor.clone()),
            _ => None,
        }) {
            Ok(cursor) => cursor,
            Err(reason) => return Outcome::Ignored(reason),
        };
        let page =
            match answer.and_then(|p| p.validate().map(|_| p).map_err(LoadFailure::Malformed)) {
                Ok(p) => p,
                Err(failure) => return Outcome::Failed(failure),
            };
        if page.reload_required {
            return self.require_reload(LoadReason::ReloadRequired, now);
        }
        let drop = if page.window_revision <= self.paging.window_revision {
            Some(DropReason::RevisionNotNewer)
        } else if !self.seam_in_place(&page.boundary_block_keys) {
            Some(DropReason::SeamMoved)
        } else {
            None
        };
        if let Some(reason) = drop {
            return match self.mode {
                ClientMode::Phone => self.require_reload(LoadReason::PageDropped, now),
                ClientMode::Desktop => {
                    if !self.paging.dead_cursors.contains(&cursor) {
                        self.paging.dead_cursors.push(cursor.clone());
                    }
                    self.effects
                        .push_back(TimelineEffect::StopPaging { cursor });
                    Outcome::Dropped(reason)
                }
            };
        }
        for block in page.blocks {
            self.insert_history(block);
        }
        self.paging.oldest_cursor = page.oldest_cursor;
        self.paging.window_revision = page.window_revision;
        Outcome::Applied
    }

    /// Applies an anchored-load answer (TL-12): a `link` or `row` answer opens a window
    /// (a page in the past when it carries `newerCursor`); a `newer` answer appends the
    /// rows after the page, and leaves the past when it carries no `newerCursor`.
    ///
    /// Answers are tied to the request that is current, whatever order they come in: an
    /// answer to a place asked for before a newer place (or before a window that already
    /// shows) is [`IgnoreReason::Superseded`] and the newer place stays; a `newer` answer
    /// is taken only while the page whose `newerCursor` it was asked with still shows.
    /// When the answer brings the present back and the live path offered a newer overlay
    /// meanwhile, the latest window is loaded again at once (due at `now`, through
    /// [`Timeline::poll_timeout`]).
    pub fn handle_anchored(
        &mut self,
        tag: &RequestTag,
        answer: Result<TimelineWindow, LoadFailure>,
        now: Millis,
    ) -> Outcome {
        let anchor = match self.take_request(tag, |f| match &f.kind {
            RequestKind::Anchored { anchor } => Some(anchor.clone()),
            _ => None,
        }) {
            Ok(taken) => taken,
            Err(reason) => return Outcome::Ignored(reason),
        };
        let current = match &anchor {
            // Newer rows for a page in the past that is no longer shown (the present came
            // back, or another place opened): taking them would put the present back in
            // the past, or leave a gap after the other page.
            Anchor::Newer { token } => self.paging.newer_cursor.as_ref() == Some(token),
            // A place asked for before a newer place, or before a window that shows.
            Anchor::Link { .. } | Anchor::Row { .. } => {
                tag.request >= self.newest_place_request
                    && tag.request >= self.newest_window_request
            }
        };
        if !current {
            return Outcome::Ignored(IgnoreReason::Superseded);
        }
        let window = match answer.and_then(|w| {
            self.check_anchored(&anchor, &w)
                .map_err(LoadFailure::Malformed)?;
            Ok(w)
        }) {
            Ok(w) => w,
            // TL-15: asking again with the same cursor would be refused for ever.
            Err(LoadFailure::Invalid) if matches!(anchor, Anchor::Newer { .. }) => {
                self.paging.newer_cursor = None;
                return self.require_reload(LoadReason::PageInvalid, now);
            }
            Err(failure) => return Outcome::Failed(failure),
        };
        let outcome = if anchor.opens_a_place() {
            let (row, notice) = (window.anchor_row.clone(), window.anchor_notice.clone());
            let outcome = if window.newer_cursor.is_some() {
                self.apply_past_page(window, tag.request)
            } else {
                self.apply_present_window(window, tag.request)
            };
            if outcome == Outcome::Applied {
                self.paging.anchor_row = row;
                self.paging.anchor_notice = notice;
            }
            outcome
        } else {
            self.apply_newer_rows(window)
        };
        if self.paging.newer_cursor.is_none() && self.behind.is_some() {
            // The present shows: catch up with what the live path offered, at once.
            self.settle_behind();
            if let Some(b) = &mut self.behind {
                b.due_by(now);
            }
        }
        outcome
    }

    /// Handles every deadline that passed: a load that timed out fails (and a latest
    /// window is retried), a retry that is due is sent, a receipt that did not come in
    /// time is reported, a client still behind a live version it was offered loads the
    /// latest window. A deadline passes when `now` reaches it. Safe to call early or
    /// twice.
    pub fn handle_timeout(&mut self, now: Millis) {
        for (op, p) in self.pending.iter_mut() {
            if let Receipt::Awaited { deadline } = p.receipt {
                if self.carried.contains_key(op) {
                    // A row carries the operation: the host had it, whatever the receipt.
                    p.receipt = Receipt::Confirmed;
                } else if deadline <= now {
                    p.receipt = Receipt::Overdue;
                    self.effects.push_back(TimelineEffect::ReceiptOverdue {
                        operation_id: op.clone(),
                    });
                }
            }
        }
        let expired: Vec<u64> = self
            .in_flight
            .iter()
            .filter(|(_, f)| f.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            if let Some(f) = self.in_flight.remove(&id) {
                if let RequestKind::Latest { retry } = f.kind {
                    self.latest_failed(LoadFailure::TimedOut, retry, now);
                }
            }
        }
        if let Some((at, retry)) = self.retry_at {
            if at <= now {
                self.retry_at = None;
                self.request_latest(LoadReason::Retry(retry), retry, now);
            }
        }
        if let Some(b) = self
            .behind
            .as_mut()
            .filter(|b| b.due.is_some_and(|d| d <= now))
        {
            // Nothing brought the client up to the version it was offered: load the
            // latest window (unless one is on its way; its landing catches up).
            b.due = None;
            self.catch_up(now);
        }
    }

    // ----- internals -------------------------------------------------------------------

    fn tag_for(&mut self, kind: RequestKind, now: Millis, wait: Millis) -> Option<RequestTag> {
        let target = self.target.clone()?;
        self.next_request += 1;
        self.in_flight.insert(
            self.next_request,
            InFlight {
                kind,
                deadline: now.saturating_add(wait),
            },
        );
        Some(RequestTag {
            target,
            generation: self.generation,
            request: self.next_request,
        })
    }

    fn request_latest(&mut self, reason: LoadReason, retry: u32, now: Millis) {
        if let Some(tag) = self.tag_for(RequestKind::Latest { retry }, now, INITIAL_LOAD_TIMEOUT) {
            let page_size = self.latest_page_size();
            self.effects.push_back(TimelineEffect::LoadLatestWindow {
                tag,
                page_size,
                reason,
            });
        }
    }

    /// The page size of a latest-window load: an initial page when nothing shows; else
    /// enough to cover the history rows the client shows plus one initial page for rows
    /// that arrived since, up to [`MAX_PAGE_SIZE`], so a reload keeps the rows the reader
    /// sees.
    fn latest_page_size(&self) -> usize {
        (self.history.len() + INITIAL_PAGE_SIZE).min(MAX_PAGE_SIZE)
    }

    fn request_anchored(&mut self, anchor: Anchor, now: Millis) {
        // An anchored load is a `run.chatLoad` (or `run.chatLoadThread`) with an anchor:
        // the phone waits for it as long as for any load of those methods, longer than
        // the host's 95-second dispatch cap.
        let opens_a_place = anchor.opens_a_place();
        if let Some(tag) = self.tag_for(
            RequestKind::Anchored {
                anchor: anchor.clone(),
            },
            now,
            INITIAL_LOAD_TIMEOUT,
        ) {
            if opens_a_place {
                // A newer jump supersedes every place asked for before it (TL-12).
                self.newest_place_request = tag.request;
            }
            self.effects.push_back(TimelineEffect::LoadAnchored {
                tag,
                anchor,
                page_size: ANCHORED_PAGE_SIZE,
            });
        }
    }

    /// Asks for the latest window unless one is already on its way; rows are kept.
    fn require_reload(&mut self, reason: LoadReason, now: Millis) -> Outcome {
        let waiting = self
            .in_flight
            .values()
            .any(|f| matches!(f.kind, RequestKind::Latest { .. }));
        if !waiting {
            self.request_latest(reason, 0, now);
        }
        Outcome::ReloadRequired(reason)
    }

    /// Keeps a version the live path offered and the client did not take, when it is
    /// newer than the held overlay (with the whole snapshot, when it was one).
    fn note_offer(&mut self, version: (u64, u64), snapshot: Option<LiveOverlay>) {
        if self.overlay_version().is_some_and(|held| version <= held) {
            return;
        }
        match &mut self.behind {
            Some(b) => b.offer(version, snapshot),
            None => {
                self.behind = Some(Behind {
                    version,
                    snapshot,
                    due: None,
                })
            }
        }
    }

    /// Takes what can be taken of a version the live path offered (TL-06): while the
    /// present shows, a kept snapshot in the held epoch and newer than the held revision
    /// replaces the overlay, as it would have had it come after the window; a kept
    /// snapshot of a higher epoch waits for a window of that epoch. Once the held
    /// overlay is as new as the offered version, nothing is behind.
    fn settle_behind(&mut self) {
        if self.paging.newer_cursor.is_some() {
            return;
        }
        let Some(held) = self.overlay_version() else {
            return;
        };
        let Some(b) = self.behind.as_mut() else {
            return;
        };
        match b.snapshot.take() {
            Some(s) if s.settlement_epoch == held.0 && s.revision > held.1 => {
                self.replace_overlay(s);
            }
            Some(s) if s.settlement_epoch > held.0 => b.snapshot = Some(s),
            _ => {}
        }
        let held = self.overlay_version();
        if self
            .behind
            .as_ref()
            .is_some_and(|b| held.is_some_and(|h| h >= b.version))
        {
            self.behind = None;
        }
    }

    /// A client still behind a version it was offered, once its window of the present
    /// landed (or an answer was refused, or a refused patch's wait ran out), loads the
    /// latest window again: at once, because the host saved that version before it sent
    /// it, so a window asked for now carries it. Not while a latest window is on its way
    /// or due (its landing catches up), a page in the past shows (the present comes back
    /// with a `newer` answer) or loading failed ([`Timeline::recover`] loads).
    fn catch_up(&mut self, now: Millis) {
        self.settle_behind();
        let (Some(offered), Some(held)) = (
            self.behind.as_ref().map(|b| b.version),
            self.overlay_version(),
        ) else {
            return;
        };
        if self.paging.newer_cursor.is_some()
            || !matches!(self.load, LoadState::Ready)
            || self.latest_pending()
        {
            return;
        }
        let reason = if offered.0 > held.0 {
            LoadReason::EpochAdvanced
        } else {
            LoadReason::MissedUpdate
        };
        // Asked once: an offer that comes while this load travels is kept anew.
        self.behind = None;
        self.request_latest(reason, 0, now);
    }

    /// True while a latest window is on its way or a retry of one is due.
    fn latest_pending(&self) -> bool {
        self.retry_at.is_some()
            || self
                .in_flight
                .values()
                .any(|f| matches!(f.kind, RequestKind::Latest { .. }))
    }

    /// Takes the request `tag` answers when `pick` accepts its kind. A request of
    /// another kind is left exactly as it was (its deadline included) and the answer is
    /// refused as [`IgnoreReason::Misrouted`].
    fn take_request<T>(
        &mut self,
        tag: &RequestTag,
        pick: impl FnOnce(&InFlight) -> Option<T>,
    ) -> Result<T, IgnoreReason> {
        if self.target.as_ref() != Some(&tag.target) || tag.generation != self.generation {
            return Err(IgnoreReason::StaleTarget);
        }
        let f = self
            .in_flight
            .get(&tag.request)
            .ok_or(IgnoreReason::NotInFlight)?;
        let taken = pick(f).ok_or(IgnoreReason::Misrouted)?;
        self.in_flight.remove(&tag.request);
        Ok(taken)
    }

    fn latest_failed(&mut self, failure: LoadFailure, retry: u32, now: Millis) -> Outcome {
        let next = retry + 1;
        match initial_load_retry_delay(next) {
            Some(delay) if self.retry_at.is_none() => {
                self.retry_at = Some((now.saturating_add(delay), next));
                if matches!(self.load, LoadState::Loading { .. }) {
                    self.load = LoadState::Loading { retry: next };
                }
            }
            Some(_) => {}
            None => {
                // Every retry failed. A shown window keeps its rows and says so.
                self.load = match self.load {
                    LoadState::Ready | LoadState::ReloadFailed { .. } => LoadState::ReloadFailed {
                        reason: failure.clone(),
                        retries: retry,
                    },
                    _ => LoadState::Failed(failure.clone()),
                };
            }
        }
        Outcome::Failed(failure)
    }

    fn check_anchored(&self, anchor: &Anchor, w: &TimelineWindow) -> Result<(), ResponseError> {
        w.validate()?;
        if anchor.opens_a_place() {
            if w.anchor_row.is_some() == w.anchor_notice.is_some() {
                return Err(ResponseError::AnchorFields);
            }
            if let Some(row) = &w.anchor_row {
                if !w.blocks.iter().any(|b| b.key() == *row) {
                    return Err(ResponseError::AnchorRowMissing);
                }
            }
        } else {
            // Rows after the page: none held already, all after the newest held row.
            let newest = self.newest_history();
            for b in &w.blocks {
                if self.history.contains_key(&b.key())
                    || newest.as_ref().is_some_and(|n| b.order_key() <= *n)
                {
                    return Err(ResponseError::NewerRowsDoNotFollow);
                }
            }
        }
        if w.newer_cursor.is_none() && w.live_overlay.is_none() {
            return Err(ResponseError::MissingOverlay);
        }
        Ok(())
    }

    fn newest_history(&self) -> Option<OrderKey> {
        self.index
            .iter()
            .rev()
            .find(|(_, o)| **o == Origin::History)
            .map(|(k, _)| k.clone())
    }

    fn oldest_history(&self) -> Option<&OrderKey> {
        self.index
            .iter()
            .find(|(_, o)| **o == Origin::History)
            .map(|(k, _)| k)
    }

    fn seam_in_place(&self, seam: &[BlockKey]) -> bool {
        match self.mode {
            ClientMode::Desktop => {
                if seam.is_empty() {
                    return self.history.is_empty();
                }
                seam.iter().all(|k| self.history.contains_key(k))
            }
            ClientMode::Phone => match self.oldest_history() {
                Some(oldest) => seam.contains(&oldest.key),
                None => seam.is_empty(),
            },
        }
    }

    /// A window of the present: history page plus overlay, in one step.
    fn apply_present_window(&mut self, w: TimelineWindow, request: u64) -> Outcome {
        let Some(overlay) = w.live_overlay else {
            return Outcome::Failed(LoadFailure::Malformed(ResponseError::MissingOverlay));
        };
        if request < self.newest_window_request {
            return Outcome::Ignored(IgnoreReason::Superseded);
        }
        if let Some(held) = &self.overlay {
            if overlay.settlement_epoch < held.epoch {
                return Outcome::Ignored(IgnoreReason::StaleEpoch);
            }
        }
        self.newest_window_request = request;
        let take_overlay = match &self.overlay {
            Some(held) => {
                (overlay.settlement_epoch, overlay.revision) >= (held.epoch, held.revision)
            }
            None => true,
        };
        self.history = w.blocks.into_iter().map(|b| (b.key(), b)).collect();
        if take_overlay {
            self.overlay = Some(HeldOverlay {
                epoch: overlay.settlement_epoch,
                revision: overlay.revision,
                blocks: overlay.blocks.into_iter().map(|b| (b.key(), b)).collect(),
            });
        }
        self.paging.oldest_cursor = w.oldest_cursor;
        self.paging.window_revision = w.window_revision;
        self.paging.dead_cursors.clear();
        self.paging.boundary_token = Some(w.boundary_token);
        self.paging.newer_cursor = None;
        self.paging.anchor_row = None;
        self.paging.anchor_notice = None;
        self.load = LoadState::Ready;
        self.retry_at = None;
        self.rebuild();
        Outcome::Applied
    }

    fn apply_past_page(&mut self, w: TimelineWindow, request: u64) -> Outcome {
        self.newest_window_request = request;
        self.history = w.blocks.into_iter().map(|b| (b.key(), b)).collect();
        self.paging.oldest_cursor = w.oldest_cursor;
        self.paging.window_revision = w.window_revision;
        self.paging.boundary_token = Some(w.boundary_token);
        self.paging.dead_cursors.clear();
        self.paging.newer_cursor = w.newer_cursor;
        self.load = LoadState::Ready;
        self.retry_at = None;
        self.rebuild();
        Outcome::Applied
    }

    fn apply_newer_rows(&mut self, w: TimelineWindow) -> Outcome {
        for b in w.blocks {
            self.insert_history(b);
        }
        match w.newer_cursor {
            Some(next) => self.paging.newer_cursor = Some(next),
            None => {
                // The present: take the overlay the answer carries (it comes with the
                // history rows that settled it) and show live rows again.
                self.paging.newer_cursor = None;
                if let Some(overlay) = w.live_overlay {
                    let newer = self.overlay.as_ref().is_none_or(|h| {
                        (overlay.settlement_epoch, overlay.revision) >= (h.epoch, h.revision)
                    });
                    if newer {
                        self.overlay = Some(HeldOverlay {
                            epoch: overlay.settlement_epoch,
                            revision: overlay.revision,
                            blocks: overlay.blocks.into_iter().map(|b| (b.key(), b)).collect(),
                        });
                    }
                }
                self.rebuild();
            }
        }
        Outcome::Applied
    }

    fn replace_overlay(&mut self, update: LiveOverlay) {
        let new_blocks: HashMap<BlockKey, Block> =
            update.blocks.into_iter().map(|b| (b.key(), b)).collect();
        let old = self.overlay.replace(HeldOverlay {
            epoch: update.settlement_epoch,
            revision: update.revision,
            blocks: new_blocks,
        });
        let mut touched: Vec<BlockKey> = Vec::new();
        if let Some(old) = old {
            for (k, b) in old.blocks {
                if let Some(op) = &b.operation_id {
                    self.uncarry(op, &mut touched);
                }
                touched.push(k);
            }
        }
        let carried_now: Vec<OperationId> = self
            .overlay
            .as_ref()
            .map(|o| {
                o.blocks
                    .values()
                    .filter_map(|b| b.operation_id.clone())
                    .collect()
            })
            .unwrap_or_default();
        for op in carried_now {
            self.carry(&op, &mut touched);
        }
        if let Some(o) = &self.overlay {
            touched.extend(o.blocks.keys().cloned());
        }
        for k in touched {
            self.refresh(&k);
        }
    }

    /// Applies a checked patch to the held overlay: only the touched keys are
    /// re-indexed, so a patch costs O(k log n) for k changed rows.
    fn apply_patch(&mut self, patch: LivePatch) {
        let Some(held) = self.overlay.as_mut() else {
            return;
        };
        held.revision = patch.revision;
        let mut touched: Vec<BlockKey> = Vec::new();
        let mut gone: Vec<OperationId> = Vec::new();
        let mut came: Vec<OperationId> = Vec::new();
        for k in patch.removals {
            if let Some(old) = held.blocks.remove(&k) {
                gone.extend(old.operation_id);
            }
            touched.push(k);
        }
        for b in patch.upserts {
            let k = b.key();
            came.extend(b.operation_id.clone());
            if let Some(old) = held.blocks.insert(k.clone(), b) {
                gone.extend(old.operation_id);
            }
            touched.push(k);
        }
        for a in patch.appends {
            if let Some(serde_json::Value::String(text)) = held
                .blocks
                .get_mut(&a.key)
                .and_then(|b| b.data.get_mut("text"))
            {
                text.push_str(&a.text);
            }
            touched.push(a.key);
        }
        for op in &came {
            self.carry(op, &mut touched);
        }
        for op in &gone {
            self.uncarry(op, &mut touched);
        }
        for k in touched {
            self.refresh(&k);
        }
    }

    fn insert_history(&mut self, block: Block) {
        let key = block.key();
        let mut touched = vec![key.clone()];
        if let Some(op) = &block.operation_id {
            self.carry(op, &mut touched);
        }
        if let Some(old) = self.history.insert(key, block) {
            if let Some(op) = &old.operation_id {
                self.uncarry(op, &mut touched);
            }
        }
        for k in touched {
            self.refresh(&k);
        }
    }

    fn carry(&mut self, op: &OperationId, touched: &mut Vec<BlockKey>) {
        *self.carried.entry(op.clone()).or_insert(0) += 1;
        self.retire_if_delivered(op);
        touched.push(BlockKey::user_message(op));
    }

    /// A delivered echo retires once a row carries its operation (the row shows the
    /// message from now on). The caller refreshes the echo's key.
    fn retire_if_delivered(&mut self, op: &OperationId) {
        if self
            .pending
            .get(op)
            .is_some_and(|p| p.receipt == Receipt::Delivered)
        {
            self.pending.remove(op);
        }
    }

    fn uncarry(&mut self, op: &OperationId, touched: &mut Vec<BlockKey>) {
        if let Some(n) = self.carried.get_mut(op) {
            *n -= 1;
            if *n == 0 {
                self.carried.remove(op);
            }
        }
        touched.push(BlockKey::user_message(op));
    }

    fn block_of(&self, key: &BlockKey, origin: Origin) -> Option<&Block> {
        match origin {
            Origin::History => self.history.get(key),
            Origin::Live => self.overlay.as_ref()?.blocks.get(key),
            Origin::Pending => {
                let op = pending_op(key)?;
                self.pending.get(op).map(|p| &p.block)
            }
        }
    }

    /// The row that should show under `key`, if any: history over live over pending.
    fn winner(&self, key: &BlockKey) -> Option<(OrderKey, Origin)> {
        if let Some(b) = self.history.get(key) {
            return Some((b.order_key(), Origin::History));
        }
        if self.paging.newer_cursor.is_some() {
            return None;
        }
        if let Some(b) = self.overlay.as_ref().and_then(|o| o.blocks.get(key)) {
            return Some((b.order_key(), Origin::Live));
        }
        let op = pending_op(key)?;
        let p = self.pending.get(op)?;
        if self.carried.contains_key(op) {
            return None;
        }
        Some((p.block.order_key(), Origin::Pending))
    }

    fn refresh(&mut self, key: &BlockKey) {
        if !self.changed.all {
            self.changed.keys.insert(key.clone());
            if self.changed.keys.len() > self.index.len().max(CHANGED_KEYS_FLOOR) {
                self.changed.all = true;
                self.changed.keys = BTreeSet::new();
            }
        }
        let want = self.winner(key);
        let have = self.shown.get(key);
        match (have, want) {
            (None, None) => {}
            (Some(h), Some((ok, origin))) if *h == ok => {
                self.index.insert(ok, origin);
            }
            (have, want) => {
                if let Some(h) = have.cloned() {
                    self.index.remove(&h);
                    self.shown.remove(key);
                }
                if let Some((ok, origin)) = want {
                    self.shown.insert(key.clone(), ok.clone());
                    self.index.insert(ok, origin);
                }
            }
        }
    }

    fn rebuild(&mut self) {
        self.changed.all = true;
        self.changed.keys = BTreeSet::new();
        self.index.clear();
        self.shown.clear();
        self.carried.clear();
        let mut keys: Vec<BlockKey> = self.history.keys().cloned().collect();
        let mut ops: Vec<OperationId> = self
            .history
            .values()
            .filter_map(|b| b.operation_id.clone())
            .collect();
        if let Some(o) = &self.overlay {
            keys.extend(o.blocks.keys().cloned());
            ops.extend(o.blocks.values().filter_map(|b| b.operation_id.clone()));
        }
        for op in ops {
            *self.carried.entry(op).or_insert(0) += 1;
        }
        let carried = &self.carried;
        self.pending
            .retain(|op, p| !(p.receipt == Receipt::Delivered && carried.contains_key(op)));
        keys.extend(self.pending.values().map(|p| p.block.key()));
        for k in keys {
            self.refresh(&k);
        }
    }

    /// The visible rows computed from scratch (collect every input, apply the
    /// precedence rules, sort). The incremental index must always equal it; tests and the
    /// benchmark baseline use it.
    #[doc(hidden)]
    pub fn full_rebuild(&self) -> Vec<(Origin, Block)> {
        let past = self.paging.newer_cursor.is_some();
        let mut rows: HashMap<BlockKey, (Origin, &Block)> = HashMap::new();
        let mut carried: HashMap<&OperationId, ()> = HashMap::new();
        for b in self.history.values() {
            rows.insert(b.key(), (Origin::History, b));
            if let Some(op) = &b.operation_id {
                carried.insert(op, ());
            }
        }
        if let Some(o) = &self.overlay {
            for b in o.blocks.values() {
                if let Some(op) = &b.operation_id {
                    carried.insert(op, ());
                }
                if !past {
                    rows.entry(b.key()).or_insert((Origin::Live, b));
                }
            }
        }
        if !past {
            for (op, p) in &self.pending {
                if !carried.contains_key(op) {
                    rows.entry(p.block.key())
                        .or_insert((Origin::Pending, &p.block));
                }
            }
        }
        let mut out: Vec<(Origin, Block)> =
            rows.into_values().map(|(o, b)| (o, b.clone())).collect();
        out.sort_by_cached_key(|(_, b)| b.order_key());
        out
    }
}

/// The operation of a pending echo key (`user` + `user-message::<op>`).
fn pending_op(key: &BlockKey) -> Option<&str> {
    if key.block_type != BlockType::User {
        return None;
    }
    key.id
        .as_str()
        .strip_prefix(crate::key::USER_MESSAGE_ID_PREFIX)
}
