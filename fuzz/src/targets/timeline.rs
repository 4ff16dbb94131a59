//! Target `timeline`: wire answers into a client [`Timeline`] (TL-02, TL-03, TL-06,
//! TL-07, TL-08, TL-12, TL-13).
//!
//! The input is a sequence of operations: open a target, a latest-window answer, an
//! older-page answer, a live snapshot, an anchored answer (each either raw JSON or built
//! from a few fuzzed numbers and serialized), a failed load, add, confirm or remove a
//! pending send, a request (older page, reload, recover, anchored or newer load), and a
//! timeout. Answers are delivered under any tag the timeline ever issued, current or
//! stale. After every step:
//!
//! - no key shows twice and rows are in strictly increasing canonical order;
//! - the incremental index equals [`Timeline::full_rebuild`], origins and blocks;
//! - `len` and `row(key)` agree with the rows.

use arbitrary::Arbitrary;
use timeline_core::anchor::Anchor;
use timeline_core::block::Block;
use timeline_core::cursor::BoundaryToken;
use timeline_core::key::{BlockKey, BlockType, OperationId, TargetId};
use timeline_core::order::SourceOrder;
use timeline_core::time::Millis;
use timeline_core::timeline::{
    ClientMode, TimelineEffect, LoadFailure, Origin, PendingSend, RequestTag, Timeline,
};
use timeline_core::wire::{LiveOverlay, OlderPage, TimelineWindow};

use crate::script::{Script, ScriptWriter};

/// The targets a script can open (`session-1` is open at the start).
pub const TARGETS: [&str; 2] = ["session-1", "session-2"];

/// The operations, in the order of the operation byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    /// Target index byte.
    OpenTarget = 0,
    /// Tag index byte, then a latest-window JSON text.
    LatestRaw = 1,
    /// Tag index byte, then a built window.
    LatestBuilt = 2,
    /// Tag index byte, then an older-page JSON text.
    OlderRaw = 3,
    /// Tag index byte, then a built older page.
    OlderBuilt = 4,
    /// Target index byte, then a live-overlay JSON text.
    LiveRaw = 5,
    /// Target index byte, then a built overlay.
    LiveBuilt = 6,
    /// Operation byte, time byte, data byte.
    AddPending = 7,
    /// Operation byte.
    RemovePending = 8,
    /// Operation byte.
    ConfirmPending = 9,
    /// A `u32` of milliseconds to advance, then a flag to fire twice.
    Timeout = 10,
    /// Request byte, then its fields.
    Request = 11,
    /// Kind byte, tag index byte, failure byte.
    Fail = 12,
    /// Tag index byte, then an anchored-window JSON text.
    AnchoredRaw = 13,
    /// Tag index byte, then a built window.
    AnchoredBuilt = 14,
}

impl Op {
    const ALL: [Op; 15] = [
        Op::OpenTarget,
        Op::LatestRaw,
        Op::LatestBuilt,
        Op::OlderRaw,
        Op::OlderBuilt,
        Op::LiveRaw,
        Op::LiveBuilt,
        Op::AddPending,
        Op::RemovePending,
        Op::ConfirmPending,
        Op::Timeout,
        Op::Request,
        Op::Fail,
        Op::AnchoredRaw,
        Op::AnchoredBuilt,
    ];

    fn read(s: &mut Script<'_>) -> Op {
        let i = usize::from(s.pick(Op::ALL.len() as u8));
        Op::ALL.get(i).copied().unwrap_or(Op::Timeout)
    }
}

/// Writes the start of a script: the client mode.
pub fn write_mode(w: &mut ScriptWriter, desktop: bool) {
    w.byte(u8::from(desktop));
}

/// Writes a raw answer operation (`LatestRaw`, `OlderRaw`, `AnchoredRaw`): the newest
/// tag of its kind is index 0.
pub fn write_raw_answer(w: &mut ScriptWriter, op: Op, json: &str) {
    w.byte(op as u8).byte(0).text(json);
}

/// Writes a raw live snapshot for `session-1`.
pub fn write_raw_live(w: &mut ScriptWriter, json: &str) {
    w.byte(Op::LiveRaw as u8).byte(0).text(json);
}

/// Writes a request: 0 older page, 1 reload, 2 recover, 3 newer, 4 row anchor at the
/// first row, 5 link anchor with a token text, 6 reading row.
pub fn write_request(w: &mut ScriptWriter, request: u8, token: &str) {
    w.byte(Op::Request as u8).byte(request);
    if request == 5 {
        w.text(token);
    }
}

/// Writes an add-pending operation.
pub fn write_add_pending(w: &mut ScriptWriter, op: u8, at: u8) {
    w.byte(Op::AddPending as u8).byte(op).byte(at).byte(1);
}

/// Writes a timeout `ms` later.
pub fn write_timeout(w: &mut ScriptWriter, ms: u32) {
    w.byte(Op::Timeout as u8).u32(ms).byte(0);
}

/// One block from a few numbers: keys from a small set (so copies collide across
/// history, live and pending), timestamps from a small range (so ties need the source
/// order and the key).
#[derive(Arbitrary, Clone, Copy, Debug, Default)]
struct ArbBlock {
    ty: u8,
    id: u8,
    ts: u8,
    order: u8,
    order_n: u8,
    op: u8,
    data: u8,
}

fn op_id(n: u8) -> OperationId {
    OperationId::new(format!("op-{}", n % 4)).expect("op-N is not blank")
}

fn arb_key(ty: u8, id: u8) -> BlockKey {
    if id % 16 >= 12 {
        return BlockKey::user_message(&op_id(id));
    }
    let t = BlockType::ALL[usize::from(ty) % BlockType::ALL.len()];
    match BlockKey::parse(t, &format!("item-{}", id % 12)) {
        Ok(k) => k,
        Err(_) => BlockKey::user_message(&op_id(id)),
    }
}

impl ArbBlock {
    fn block(self) -> Block {
        let mut b = Block::new(arb_key(self.ty, self.id), Millis(u64::from(self.ts % 32)));
        let n = u64::from(self.order_n);
        b.source_order = match self.order % 6 {
            0 => None,
            1 => Some(SourceOrder::history(n / 16, n % 16)),
            2 => Some(SourceOrder::live(n)),
            3 => Some(SourceOrder::synthetic(n)),
            4 => Some(SourceOrder::legacy_codex(n / 16, n % 16)),
            _ => Some(SourceOrder::from_raw(vec![
                n % 3;
                usize::from(self.order % 3)
            ])),
        };
        if self.op % 3 == 2 {
            b.operation_id = Some(op_id(self.op / 3));
        }
        b.data = match self.data % 3 {
            0 => serde_json::Value::Null,
            1 => serde_json::json!({ "text": "row" }),
            _ => serde_json::json!({ "n": self.data }),
        };
        b
    }
}

fn blocks(s: &mut Script<'_>, dedup: bool) -> Vec<Block> {
    let n = s.pick(10);
    let mut out: Vec<Block> = Vec::new();
    for _ in 0..n {
        let b = s.value::<ArbBlock>().block();
        if dedup && out.iter().any(|o| o.key() == b.key()) {
            continue;
        }
        out.push(b);
    }
    out
}

fn overlay(s: &mut Script<'_>, dedup: bool) -> LiveOverlay {
    LiveOverlay {
        settlement_epoch: u64::from(s.pick(4)),
        revision: u64::from(s.pick(16)),
        blocks: blocks(s, dedup),
    }
}

fn built_window(s: &mut Script<'_>) -> TimelineWindow {
    let flags = s.byte();
    let dedup = flags & 64 == 0;
    let blocks = blocks(s, dedup);
    let anchor_row = if flags & 8 != 0 {
        let i = usize::from(s.byte());
        match blocks.get(i % blocks.len().max(1)) {
            Some(b) if i < 200 => Some(b.key()),
            _ => Some(arb_key(s.byte(), s.byte())),
        }
    } else {
        None
    };
    TimelineWindow {
        oldest_cursor: (flags & 1 != 0).then(|| format!("cursor-{}", s.pick(4))),
        boundary_token: BoundaryToken::claude(TARGETS[usize::from(flags >> 1) & 1]),
        window_revision: u64::from(s.pick(8)),
        live_overlay: (flags & 4 == 0).then(|| overlay(s, dedup)),
        anchor_row,
        anchor_notice: (flags & 16 != 0).then(|| "This row is not in the saved history.".into()),
        newer_cursor: (flags & 32 != 0).then(|| format!("newer-{}", s.pick(4))),
        blocks,
    }
}

fn built_older(s: &mut Script<'_>, t: &Timeline) -> OlderPage {
    let flags = s.byte();
    let blocks = blocks(s, flags & 64 == 0);
    let top = t
        .rows()
        .find(|r| r.origin == Origin::History)
        .map(|r| r.block.key());
    let boundary: Vec<BlockKey> = match (flags >> 1) % 4 {
        0 | 1 => top.into_iter().collect(),
        2 => vec![arb_key(s.byte(), s.byte())],
        _ => Vec::new(),
    };
    let mut ordered: Vec<BlockKey> = blocks
        .iter()
        .map(Block::key)
        .chain(boundary.iter().cloned())
        .collect();
    if flags & 8 != 0 {
        ordered.reverse();
    }
    OlderPage {
        boundary_block_keys: boundary,
        ordered_block_keys: ordered,
        window_revision: t.window_revision() + u64::from(s.pick(3)),
        oldest_cursor: (flags & 1 != 0).then(|| format!("cursor-{}", s.pick(4))),
        reload_required: flags & 0xf0 == 0xf0,
        blocks,
    }
}

/// The JSON a client would receive, decoded and validated the way an embedding does.
fn as_wire_window(w: &TimelineWindow) -> Result<TimelineWindow, LoadFailure> {
    let json = serde_json::to_string(w).unwrap_or_default();
    TimelineWindow::from_json(&json).map_err(LoadFailure::Malformed)
}

fn as_wire_older(p: &OlderPage) -> Result<OlderPage, LoadFailure> {
    let json = serde_json::to_string(p).unwrap_or_default();
    OlderPage::from_json(&json).map_err(LoadFailure::Malformed)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Latest,
    Older,
    Anchored,
}

struct World {
    t: Timeline,
    now: Millis,
    /// Every tag issued, newest first, with its kind (at most 32 kept).
    tags: Vec<(Kind, RequestTag)>,
}

impl World {
    fn drain(&mut self) {
        while let Some(e) = self.t.poll_effect() {
            let (kind, tag) = match e {
                TimelineEffect::LoadLatestWindow { tag, .. } => (Kind::Latest, tag),
                TimelineEffect::LoadOlderPage { tag, .. } => (Kind::Older, tag),
                TimelineEffect::LoadAnchored { tag, .. } => (Kind::Anchored, tag),
                _ => continue,
            };
            self.tags.insert(0, (kind, tag));
            self.tags.truncate(32);
        }
    }

    /// The `i`-th newest tag of `kind`, wrapping; `None` when none was issued.
    fn tag(&self, kind: Kind, i: u8) -> Option<RequestTag> {
        let of_kind: Vec<&RequestTag> = self
            .tags
            .iter()
            .filter(|(k, _)| *k == kind)
            .map(|(_, t)| t)
            .collect();
        if of_kind.is_empty() {
            return None;
        }
        of_kind
            .get(usize::from(i) % of_kind.len())
            .map(|t| (*t).clone())
    }

    fn target(i: u8) -> TargetId {
        TargetId::new(TARGETS[usize::from(i) % TARGETS.len()]).expect("targets are not blank")
    }

    fn step(&mut self, s: &mut Script<'_>) {
        match Op::read(s) {
            Op::OpenTarget => {
                let target = Self::target(s.byte());
                self.t.open_target(target, self.now);
            }
            Op::LatestRaw => {
                let i = s.byte();
                let answer = TimelineWindow::from_json(&s.text()).map_err(LoadFailure::Malformed);
                if let Some(tag) = self.tag(Kind::Latest, i) {
                    let _outcome = self.t.handle_latest_window(&tag, answer, self.now);
                }
            }
            Op::OlderRaw => {
                let i = s.byte();
                let answer = OlderPage::from_json(&s.text()).map_err(LoadFailure::Malformed);
                if let Some(tag) = self.tag(Kind::Older, i) {
                    let _outcome = self.t.handle_older_page(&tag, answer, self.now);
                }
            }
            Op::AnchoredRaw => {
                let i = s.byte();
                let answer = TimelineWindow::from_json(&s.text()).map_err(LoadFailure::Malformed);
                if let Some(tag) = self.tag(Kind::Anchored, i) {
                    let _outcome = self.t.handle_anchored(&tag, answer, self.now);
                }
            }
            Op::LatestBuilt => {
                let i = s.byte();
                let answer = as_wire_window(&built_window(s));
                if let Some(tag) = self.tag(Kind::Latest, i) {
                    let _outcome = self.t.handle_latest_window(&tag, answer, self.now);
                }
            }
            Op::OlderBuilt => {
                let i = s.byte();
                let answer = as_wire_older(&built_older(s, &self.t));
                if let Some(tag) = self.tag(Kind::Older, i) {
                    let _outcome = self.t.handle_older_page(&tag, answer, self.now);
                }
            }
            Op::AnchoredBuilt => {
                let i = s.byte();
                let answer = as_wire_window(&built_window(s));
                if let Some(tag) = self.tag(Kind::Anchored, i) {
                    let _outcome = self.t.handle_anchored(&tag, answer, self.now);
                }
            }
            Op::LiveRaw => {
                let target = Self::target(s.byte());
                if let Ok(update) = serde_json::from_slice::<LiveOverlay>(s.bytes()) {
                    let _outcome = self.t.handle_live_update(&target, update, self.now);
                }
            }
            Op::LiveBuilt => {
                let target = Self::target(s.byte());
                let dedup = s.flag();
                let update = overlay(s, dedup);
                let _outcome = self.t.handle_live_update(&target, update, self.now);
            }
            Op::AddPending => {
                let op = op_id(s.byte());
                let at = Millis(u64::from(s.byte() % 32));
                let data = serde_json::json!({ "text": s.byte() });
                let _outcome = self.t.add_pending(PendingSend {
                    operation_id: op,
                    created_at: at,
                    data,
                });
            }
            Op::RemovePending => {
                let _outcome = self.t.remove_pending(&op_id(s.byte()));
            }
            Op::ConfirmPending => {
                let _outcome = self.t.confirm_pending(&op_id(s.byte()));
            }
            Op::Timeout => {
                self.now = self.now.saturating_add(Millis(u64::from(s.u32())));
                self.t.handle_timeout(self.now);
                if s.flag() {
                    // Safe to call early or twice.
                    self.t.handle_timeout(self.now);
                }
            }
            Op::Request => self.request(s),
            Op::Fail => {
                let kind = [Kind::Latest, Kind::Older, Kind::Anchored][usize::from(s.pick(3))];
                let i = s.byte();
                let failure = match s.pick(3) {
                    0 => LoadFailure::Unavailable,
                    1 => LoadFailure::SnapshotTooLarge,
                    _ => LoadFailure::TimedOut,
                };
                if let Some(tag) = self.tag(kind, i) {
                    let _outcome = match kind {
                        Kind::Latest => self.t.handle_latest_window(&tag, Err(failure), self.now),
                        Kind::Older => self.t.handle_older_page(&tag, Err(failure), self.now),
                        Kind::Anchored => self.t.handle_anchored(&tag, Err(failure), self.now),
                    };
                }
            }
        }
        self.drain();
    }

    fn request(&mut self, s: &mut Script<'_>) {
        match s.pick(7) {
            0 => {
                let _asked = self.t.load_older(self.now);
            }
            1 => self.t.reload(self.now),
            2 => self.t.recover(self.now),
            3 => {
                let _asked = self.t.load_newer(self.now);
            }
            4 => {
                let first = self.t.rows().next().map(|r| r.block.key());
                let key = first.unwrap_or_else(|| arb_key(0, 0));
                let _checked = self.t.load_anchored(Anchor::row(&key), self.now);
            }
            5 => {
                let token = s.text().into_owned();
                let _checked = self.t.load_anchored(Anchor::Link { token }, self.now);
            }
            _ => {
                let key = self.t.rows().last().map(|r| r.block.key());
                self.t.set_reading_row(key);
            }
        }
    }

    fn check(&self) {
        let rows: Vec<(Origin, Block)> =
            self.t.rows().map(|r| (r.origin, r.block.clone())).collect();
        let mut keys: Vec<BlockKey> = rows.iter().map(|(_, b)| b.key()).collect();
        for pair in rows.windows(2) {
            if let [(_, a), (_, b)] = pair {
                assert!(
                    a.order_key() < b.order_key(),
                    "rows out of canonical order: {} then {}",
                    a.key(),
                    b.key()
                );
            }
        }
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), rows.len(), "two rows with one key");
        assert_eq!(
            rows,
            self.t.full_rebuild(),
            "incremental index differs from the full rebuild"
        );
        assert_eq!(self.t.len(), rows.len());
        for (origin, block) in &rows {
            let row = self.t.row(&block.key());
            assert_eq!(row.map(|r| (r.origin, r.block)), Some((*origin, block)));
        }
    }
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let mut s = Script::new(data);
    let mode = if s.flag() {
        ClientMode::Desktop
    } else {
        ClientMode::Phone
    };
    let mut w = World {
        t: Timeline::new(mode),
        now: Millis(0),
        tags: Vec::new(),
    };
    w.t.open_target(World::target(0), w.now);
    w.drain();
    w.check();
    let mut steps = 0;
    while !s.is_empty() && steps < 256 {
        w.step(&mut s);
        w.check();
        steps += 1;
    }
}
