//! Property tests of the client timeline over random interleavings of host writes,
//! settlement, latest-window loads, older pages, pending sends and relay events that are
//! lost, duplicated and reordered (TL-02, TL-03, TL-06, TL-07, TL-08).
//!
//! Invariants checked after every step:
//! - never two rows with one key; rows always in canonical order; the incremental view
//!   equals a full rebuild from the held inputs;
//! - a history copy always wins over a live copy;
//! - a pending echo shows exactly while no row carries its operation ID;
//! - a message the user sent and did not remove is on screen in every state from its
//!   submit on, as its echo or as a row carrying its operation; once its sent proof
//!   arrived ([`Timeline::mark_delivered`]) it stays on screen forever after, whatever
//!   order the proof, live snapshots and patches, history windows and reloads come in
//!   (unless a window moved past its saved row, which is then older history that paging
//!   reaches);
//! - a live row never disappears until the client has shown its history copy (or a
//!   window that does not join the held rows moved past it, so it is older history);
//! - a live update with a newer epoch never removes a visible row;
//! - within an epoch a lower revision never changes the view;
//! - applying the same live update twice changes nothing (snapshot or patch);
//! - a patch from another base, epoch or an old revision changes nothing;
//! - a latest window answered at once shows exactly the host's view;
//! - a renderer that redraws only what [`Timeline::take_row_changes`] names, each row
//!   put after [`Timeline::row_before`], shows exactly the rows.
//!
//! And for live patches: for any sequence of writes, a client fed patch by patch shows
//! exactly what a client fed whole snapshots shows, on every client mode; a client that
//! lost patches refuses the next ones without changing a row and is healed by the next
//! snapshot.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet, HashSet};

use fixtures::sim_host::SimHost;
use proptest::prelude::*;
use timeline_core::block::Block;
use timeline_core::key::{BlockKey, BlockType, OperationId};
use timeline_core::time::Millis;
use timeline_core::timeline::IgnoreReason;
use timeline_core::timeline::{
    ClientMode, Origin, Outcome, PendingSend, RequestTag, RowChanges, Timeline, TimelineEffect,
};
use timeline_core::wire::{LiveOverlay, LivePatch, OlderPage, TimelineWindow};

#[derive(Clone, Debug)]
enum Step {
    AppendHistory(usize),
    StreamLive(u8),
    StreamUser(u8),
    SaveLive(prop::sample::Index),
    LoadLatest,
    DeliverLatest(prop::sample::Index),
    LoadOlder,
    DeliverOlder(prop::sample::Index),
    DeliverRelay(prop::sample::Index, bool),
    DropRelay(prop::sample::Index),
    /// A live patch (from the host's previous snapshot) reaches the client, maybe twice.
    DeliverPatch(prop::sample::Index, bool),
    AddPending(u8),
    RemovePending(u8),
    ConfirmPending(u8),
    /// The sent proof of a message arrives (the outbox lets go of it).
    MarkDelivered(u8),
    Advance(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => (1usize..4).prop_map(Step::AppendHistory),
        4 => (0u8..10).prop_map(Step::StreamLive),
        2 => (0u8..OPS).prop_map(Step::StreamUser),
        3 => any::<prop::sample::Index>().prop_map(Step::SaveLive),
        2 => Just(Step::LoadLatest),
        3 => any::<prop::sample::Index>().prop_map(Step::DeliverLatest),
        2 => Just(Step::LoadOlder),
        2 => any::<prop::sample::Index>().prop_map(Step::DeliverOlder),
        6 => (any::<prop::sample::Index>(), any::<bool>()).prop_map(|(i, d)| Step::DeliverRelay(i, d)),
        1 => any::<prop::sample::Index>().prop_map(Step::DropRelay),
        4 => (any::<prop::sample::Index>(), any::<bool>()).prop_map(|(i, d)| Step::DeliverPatch(i, d)),
        2 => (0u8..OPS).prop_map(Step::AddPending),
        1 => (0u8..OPS).prop_map(Step::RemovePending),
        1 => (0u8..OPS).prop_map(Step::ConfirmPending),
        2 => (0u8..OPS).prop_map(Step::MarkDelivered),
        1 => (1u64..200_000).prop_map(Step::Advance),
    ]
}

/// How many distinct operations a run may send.
const OPS: u8 = 6;

fn op(n: u8) -> OperationId {
    OperationId::new(format!("op-{n}")).unwrap()
}

struct World {
    host: SimHost,
    client: Timeline,
    now: Millis,
    /// Latest-window answers on their way: (tag, answer).
    latest: Vec<(RequestTag, TimelineWindow)>,
    older: Vec<(RequestTag, OlderPage)>,
    relay: Vec<LiveOverlay>,
    /// Patches on their way, each from the snapshot the host emitted before it.
    patches: Vec<LivePatch>,
    /// The host's last emitted snapshot (the base of the next patch).
    last_emitted: Option<LiveOverlay>,
    /// Keys the client has shown as history at least once.
    shown_as_history: HashSet<BlockKey>,
    /// Sent, neither removed by the user nor delivered: the echo must show exactly
    /// while no row carries the operation.
    pending: BTreeSet<OperationId>,
    /// Sent and delivered (sent proof received): on screen forever after.
    delivered: BTreeSet<OperationId>,
    /// Every operation ever sent (a message is sent once).
    submitted: BTreeSet<OperationId>,
    /// What a renderer that redraws only the changed rows shows.
    drawn: Vec<(Origin, Block)>,
}

type View = Vec<(Origin, BlockKey)>;

fn view(t: &Timeline) -> View {
    t.rows().map(|r| (r.origin, r.block.key())).collect()
}

impl World {
    fn new(mode: ClientMode) -> World {
        let host = SimHost::new("session-1");
        let mut client = Timeline::new(mode);
        client.open_target(host.target().clone(), Millis(0));
        let mut w = World {
            host,
            client,
            now: Millis(0),
            latest: Vec::new(),
            older: Vec::new(),
            relay: Vec::new(),
            patches: Vec::new(),
            last_emitted: None,
            shown_as_history: HashSet::new(),
            pending: BTreeSet::new(),
            delivered: BTreeSet::new(),
            submitted: BTreeSet::new(),
            drawn: Vec::new(),
        };
        w.drain_effects().unwrap();
        w
    }

    /// Carries out the client's effects: the host builds each answer now; the answer
    /// travels until a Deliver step.
    fn drain_effects(&mut self) -> Result<(), TestCaseError> {
        while let Some(e) = self.client.poll_effect() {
            match e {
                TimelineEffect::LoadLatestWindow { tag, page_size, .. } => {
                    let (window, emitted) = self.host.latest_window_sized(page_size);
                    if let Some(snap) = emitted {
                        self.emit(snap);
                    }
                    self.latest.push((tag, window));
                }
                TimelineEffect::LoadOlderPage { tag, cursor, .. } => {
                    let page = self.host.older_page(&cursor);
                    self.older.push((tag, page));
                }
                TimelineEffect::StopPaging { cursor } => {
                    prop_assert_eq!(self.client.mode(), ClientMode::Desktop, "{}", cursor);
                }
                other => panic!("unexpected effect {other:?}"),
            }
        }
        Ok(())
    }

    /// The host emits a snapshot: it travels whole on the relay, and as a patch from the
    /// previous snapshot when one can express it (same epoch).
    fn emit(&mut self, snap: LiveOverlay) {
        if let Some(p) = self
            .last_emitted
            .as_ref()
            .and_then(|prev| LivePatch::between(prev, &snap))
        {
            self.patches.push(p);
        }
        self.last_emitted = Some(snap.clone());
        self.relay.push(snap);
    }

    /// A renderer's redraw from the changes alone: each changed key taken out, and put
    /// back after the row before it when it still shows.
    fn redraw(&mut self) -> Result<(), TestCaseError> {
        match self.client.take_row_changes() {
            RowChanges::All => {
                self.drawn = self
                    .client
                    .rows()
                    .map(|r| (r.origin, r.block.clone()))
                    .collect();
            }
            RowChanges::Keys(keys) => {
                for k in keys {
                    self.drawn.retain(|(_, b)| b.key() != k);
                    let Some(row) = self.client.row(&k) else {
                        continue;
                    };
                    let at = match self.client.row_before(&k) {
                        None => 0,
                        Some(before) => {
                            let i = self.drawn.iter().position(|(_, b)| &b.key() == before);
                            prop_assert!(i.is_some(), "{k} comes after {before}, not drawn");
                            i.unwrap_or(0) + 1
                        }
                    };
                    self.drawn.insert(at, (row.origin, row.block.clone()));
                }
            }
            other => panic!("{other:?}"),
        }
        let rows: Vec<(Origin, Block)> = self
            .client
            .rows()
            .map(|r| (r.origin, r.block.clone()))
            .collect();
        prop_assert_eq!(
            &self.drawn,
            &rows,
            "the changed rows alone do not redraw the view"
        );
        Ok(())
    }

    fn check(&mut self, before: &View) -> Result<(), TestCaseError> {
        self.redraw()?;
        let rows: Vec<_> = self.client.rows().collect();
        // One row per key, canonical order, incremental == full rebuild.
        let keys: HashSet<BlockKey> = rows.iter().map(|r| r.block.key()).collect();
        prop_assert_eq!(keys.len(), rows.len(), "two rows with one key");
        for w in rows.windows(2) {
            prop_assert!(
                w[0].block.order_key() < w[1].block.order_key(),
                "rows out of order"
            );
        }
        let rebuilt: Vec<(Origin, BlockKey)> = self
            .client
            .full_rebuild()
            .into_iter()
            .map(|(o, b)| (o, b.key()))
            .collect();
        prop_assert_eq!(&view(&self.client), &rebuilt);
        for r in &rows {
            if r.origin == Origin::History {
                self.shown_as_history.insert(r.block.key());
            }
        }
        // TL-03: a pending echo shows exactly while no row carries its operation.
        let carried: HashSet<&OperationId> = rows
            .iter()
            .filter(|r| r.origin != Origin::Pending)
            .filter_map(|r| r.block.operation_id.as_ref())
            .collect();
        for r in &rows {
            if r.origin == Origin::Pending {
                let o = r.block.operation_id.as_ref().unwrap();
                prop_assert!(
                    !carried.contains(o),
                    "echo of {o} shown beside a row carrying it"
                );
                prop_assert!(self.pending.contains(o) || self.delivered.contains(o));
            }
        }
        for o in &self.pending {
            let shown = rows
                .iter()
                .any(|r| r.block.operation_id.as_ref() == Some(o));
            prop_assert!(
                shown || self.client.newer_cursor().is_some(),
                "{o} vanished"
            );
        }
        self.check_delivered()?;
        // A live row never disappears before its history copy showed, unless a new
        // window that does not join the held rows moved past it: then it is saved
        // history above the window, where paging reaches it.
        let now: HashSet<BlockKey> = rows.iter().map(|r| r.block.key()).collect();
        let oldest_history = rows
            .iter()
            .find(|r| r.origin == Origin::History)
            .map(|r| r.block.order_key());
        for (origin, k) in before {
            if *origin == Origin::Live && !now.contains(k) && !self.shown_as_history.contains(k) {
                let saved = self.host.history().iter().find(|b| &b.key() == k);
                let above_window = match (saved, &oldest_history) {
                    (Some(b), Some(oldest)) => b.order_key() < *oldest,
                    _ => false,
                };
                prop_assert!(above_window, "live row {k} disappeared");
            }
        }
        Ok(())
    }

    /// TL-03: every delivered message is on screen, as its echo or as a row carrying its
    /// operation, unless its saved row is above the oldest history row shown (a window
    /// moved past it; paging reaches it) or a page in the past shows.
    fn check_delivered(&self) -> Result<(), TestCaseError> {
        let oldest_history = self
            .client
            .rows()
            .find(|r| r.origin == Origin::History)
            .map(|r| r.block.order_key());
        for o in &self.delivered {
            let shown = self
                .client
                .rows()
                .any(|r| r.block.operation_id.as_ref() == Some(o));
            let above_window = self.host.history().iter().any(|b| {
                b.operation_id.as_ref() == Some(o)
                    && oldest_history
                        .as_ref()
                        .is_some_and(|oldest| b.order_key() < *oldest)
            });
            prop_assert!(
                shown || above_window || self.client.newer_cursor().is_some(),
                "delivered {o} vanished"
            );
            if shown && self.client.is_pending_delivered(o).is_none() {
                // Retired: a row (not an echo) shows it.
                prop_assert!(self.client.rows().any(
                    |r| r.origin != Origin::Pending && r.block.operation_id.as_ref() == Some(o)
                ));
            }
        }
        Ok(())
    }

    fn run(&mut self, s: Step) -> Result<(), TestCaseError> {
        let before = view(&self.client);
        match s {
            Step::AppendHistory(n) => self.host.append_history(n),
            Step::StreamLive(n) => {
                let key = BlockKey::parse(BlockType::AgentReply, &format!("live-{n}")).unwrap();
                if !self.host.history().iter().any(|b| b.key() == key) {
                    let snap = self.host.stream_live(key, None);
                    self.emit(snap);
                }
            }
            Step::StreamUser(n) => {
                let key = BlockKey::user_message(&op(n));
                if !self.host.history().iter().any(|b| b.key() == key) {
                    let snap = self.host.stream_user_message(&op(n));
                    self.emit(snap);
                }
            }
            Step::SaveLive(i) => {
                let live = self.host.live_keys();
                if !live.is_empty() {
                    self.host.save_to_history(&live[i.index(live.len())]);
                }
            }
            Step::LoadLatest => self.client.reload(self.now),
            Step::DeliverLatest(i) => {
                if !self.latest.is_empty() {
                    let (tag, window) = self.latest.remove(i.index(self.latest.len()));
                    let fresh = self.latest.is_empty() && self.relay.is_empty();
                    let host_view = window.clone();
                    let outcome = self.client.handle_latest_window(&tag, Ok(window), self.now);
                    if fresh
                        && outcome == Outcome::Applied
                        && host_view.live_overlay == Some(self.host.snapshot())
                    {
                        // Answered with nothing else in flight: the client shows the
                        // host's view (page + overlay), plus older rows it kept.
                        for b in host_view
                            .blocks
                            .iter()
                            .chain(&host_view.live_overlay.unwrap().blocks)
                        {
                            prop_assert!(
                                self.client.row(&b.key()).is_some(),
                                "{} missing",
                                b.key()
                            );
                        }
                        for r in self.client.rows() {
                            if r.origin == Origin::Live {
                                prop_assert!(self.host.live_keys().contains(&r.block.key()));
                            }
                        }
                    }
                }
            }
            Step::LoadOlder => {
                self.client.load_older(self.now);
            }
            Step::DeliverOlder(i) => {
                if !self.older.is_empty() {
                    let (tag, page) = self.older.remove(i.index(self.older.len()));
                    self.client.handle_older_page(&tag, Ok(page), self.now);
                }
            }
            Step::DeliverRelay(i, twice) => {
                if !self.relay.is_empty() {
                    let snap = self.relay.remove(i.index(self.relay.len()));
                    let held = self.client.overlay_version();
                    let target = self.host.target().clone();
                    self.client
                        .handle_live_update(&target, snap.clone(), self.now);
                    let after = view(&self.client);
                    if let Some((epoch, rev)) = held {
                        if snap.settlement_epoch > epoch {
                            // TL-06: refused, rows kept.
                            prop_assert_eq!(&after, &before);
                        }
                        if snap.settlement_epoch == epoch && snap.revision < rev {
                            prop_assert_eq!(&after, &before);
                        }
                    }
                    if twice {
                        let again = self.client.handle_live_update(&target, snap, self.now);
                        prop_assert!(
                            matches!(
                                again,
                                Outcome::Unchanged
                                    | Outcome::Ignored(_)
                                    | Outcome::ReloadRequired(_)
                            ),
                            "{again:?}"
                        );
                        prop_assert_eq!(&view(&self.client), &after);
                    }
                }
            }
            Step::DeliverPatch(i, twice) => {
                if !self.patches.is_empty() {
                    let p = self.patches.remove(i.index(self.patches.len()));
                    let held = self.client.overlay_version();
                    let target = self.host.target().clone();
                    let outcome = self.client.handle_live_patch(&target, p.clone(), self.now);
                    let after = view(&self.client);
                    if let Some((epoch, rev)) = held {
                        let applies = p.settlement_epoch == epoch && p.base_revision == rev;
                        if !applies {
                            // TL-06: a patch from another base, epoch or an old revision
                            // changes no row.
                            prop_assert_eq!(&after, &before, "{:?}", outcome);
                        }
                    }
                    if twice {
                        let again = self.client.handle_live_patch(&target, p, self.now);
                        prop_assert!(
                            matches!(again, Outcome::Ignored(_) | Outcome::ReloadRequired(_)),
                            "{again:?}"
                        );
                        prop_assert_eq!(&view(&self.client), &after);
                    }
                }
            }
            Step::DropRelay(i) => {
                if !self.relay.is_empty() {
                    self.relay.remove(i.index(self.relay.len()));
                }
            }
            Step::AddPending(n) => {
                if self.submitted.insert(op(n)) {
                    self.client.add_pending(PendingSend {
                        operation_id: op(n),
                        created_at: self.now,
                        data: serde_json::json!({"text": "same text"}),
                    });
                    self.pending.insert(op(n));
                }
            }
            Step::RemovePending(n) => {
                let held = self.client.is_pending_delivered(&op(n));
                let outcome = self.client.remove_pending(&op(n));
                match held {
                    // A delivered message is not the user's to take back.
                    Some(true) => {
                        prop_assert_eq!(outcome, Outcome::Ignored(IgnoreReason::Delivered))
                    }
                    Some(false) => {
                        prop_assert_eq!(outcome, Outcome::Applied);
                        self.pending.remove(&op(n));
                    }
                    None => prop_assert_eq!(outcome, Outcome::Unchanged),
                }
            }
            Step::ConfirmPending(n) => {
                self.client.confirm_pending(&op(n));
            }
            Step::MarkDelivered(n) => {
                // The sent proof comes only for a message the user sent and did not
                // remove; it may come before, between or after the rows carrying it.
                let outcome = self.client.mark_delivered(&op(n));
                if self.pending.remove(&op(n)) {
                    prop_assert_eq!(outcome, Outcome::Applied);
                    self.delivered.insert(op(n));
                } else if !self.delivered.contains(&op(n)) {
                    prop_assert_eq!(outcome, Outcome::Ignored(IgnoreReason::NotInFlight));
                }
            }
            Step::Advance(ms) => {
                self.now = self.now.saturating_add(Millis(ms));
                self.client.handle_timeout(self.now);
            }
        }
        self.drain_effects()?;
        self.check(&before)
    }
}

fn run_world(mode: ClientMode, steps: Vec<Step>) -> Result<(), TestCaseError> {
    let mut w = World::new(mode);
    w.host.append_history(3);
    for s in steps {
        w.run(s)?;
    }
    // Converge: drop everything in flight, load a fresh window, deliver it at once.
    w.latest.clear();
    w.relay.clear();
    w.patches.clear();
    w.client.reload(w.now);
    w.drain_effects()?;
    let (tag, window) = w.latest.pop().unwrap();
    w.relay.clear();
    let outcome = w
        .client
        .handle_latest_window(&tag, Ok(window.clone()), w.now);
    prop_assert_eq!(outcome, Outcome::Applied);
    let mut expect: BTreeMap<BlockKey, Origin> = BTreeMap::new();
    for b in &window.live_overlay.as_ref().unwrap().blocks {
        expect.insert(b.key(), Origin::Live);
    }
    for b in &window.blocks {
        expect.insert(b.key(), Origin::History);
    }
    for (k, o) in &expect {
        prop_assert_eq!(w.client.row(k).map(|r| r.origin), Some(*o), "{}", k);
    }
    w.check_delivered()?;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fixtures::proptest_cases()))]

    // TL-02, TL-03, TL-06, TL-07, TL-08
    #[test]
    fn phone_timeline_invariants(steps in prop::collection::vec(step(), 1..80)) {
        run_world(ClientMode::Phone, steps)?;
    }

    // TL-02, TL-03, TL-06, TL-07, TL-08
    #[test]
    fn desktop_timeline_invariants(steps in prop::collection::vec(step(), 1..80)) {
        run_world(ClientMode::Desktop, steps)?;
    }

    // TL-02, TL-04: whatever blocks arrive in whatever order, the view is the sorted,
    // de-duplicated union with history over live over pending.
    #[test]
    fn view_is_independent_of_arrival_order(
        history in prop::collection::vec(fixtures::strategies::block(), 0..12),
        live in prop::collection::vec(fixtures::strategies::block(), 0..12),
    ) {
        let dedup = |v: Vec<timeline_core::block::Block>| {
            let mut m = BTreeMap::new();
            for b in v { m.insert(b.key(), b); }
            m.into_values().collect::<Vec<_>>()
        };
        let (history, live) = (dedup(history), dedup(live));
        let mut views = Vec::new();
        for reverse in [false, true] {
            let mut t = Timeline::new(ClientMode::Phone);
            let target = timeline_core::key::TargetId::new("t").unwrap();
            t.open_target(target.clone(), Millis(0));
            let Some(TimelineEffect::LoadLatestWindow { tag, .. }) = t.poll_effect() else { panic!() };
            let (mut h, mut l) = (history.clone(), live.clone());
            if reverse { h.reverse(); l.reverse(); }
            let w = TimelineWindow {
                blocks: h, oldest_cursor: None,
                boundary_token: timeline_core::cursor::BoundaryToken::claude("t"),
                window_revision: 1,
                live_overlay: Some(LiveOverlay { settlement_epoch: 1, revision: 1, blocks: l }),
                anchor_row: None, anchor_notice: None, newer_cursor: None,
            };
            prop_assert_eq!(t.handle_latest_window(&tag, Ok(w), Millis(1)), Outcome::Applied);
            for r in t.rows() {
                if history.iter().any(|b| b.key() == r.block.key()) {
                    prop_assert_eq!(r.origin, Origin::History);
                }
            }
            views.push(view(&t));
        }
        prop_assert_eq!(&views[0], &views[1]);
    }
}

// ----- live patches: patch by patch equals snapshot --------------------------------------

/// One host write for the patch property.
#[derive(Clone, Debug)]
enum Write {
    /// Publish rows (same key replaces).
    Upsert(Vec<Block>),
    /// Remove live rows (picked among those live).
    Remove(Vec<prop::sample::Index>),
    /// A live row's text grows by a token (a streaming reply): a patch carries it as an
    /// append.
    Grow(prop::sample::Index, String),
    /// A latest window settles the oldest live row: epoch + 1, every client loads it.
    Settle,
    /// Every client adds the echo of a send.
    Pending(u8),
}

fn write() -> impl Strategy<Value = Write> {
    prop_oneof![
        6 => prop::collection::vec(fixtures::strategies::block(), 1..4).prop_map(Write::Upsert),
        3 => prop::collection::vec(any::<prop::sample::Index>(), 1..3).prop_map(Write::Remove),
        4 => (any::<prop::sample::Index>(), "[a-z é]{0,4}").prop_map(|(i, t)| Write::Grow(i, t)),
        1 => Just(Write::Settle),
        1 => (0u8..4).prop_map(Write::Pending),
    ]
}

/// A write, whether the lossy client loses its patch, and whether a whole snapshot
/// reaches the lossy client after it (relay repair).
fn patch_step() -> impl Strategy<Value = (Write, bool, bool)> {
    (
        write(),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.15),
    )
}

/// The host side of the patch property: live rows by key, an epoch and a revision.
struct PatchHost {
    history: Vec<Block>,
    live: BTreeMap<BlockKey, Block>,
    epoch: u64,
    revision: u64,
}

impl PatchHost {
    fn snapshot(&self) -> LiveOverlay {
        LiveOverlay {
            settlement_epoch: self.epoch,
            revision: self.revision,
            blocks: self.live.values().cloned().collect(),
        }
    }

    fn window(&self) -> TimelineWindow {
        TimelineWindow {
            blocks: self.history.clone(),
            oldest_cursor: None,
            boundary_token: timeline_core::cursor::BoundaryToken::claude("t"),
            window_revision: self.epoch,
            live_overlay: Some(self.snapshot()),
            anchor_row: None,
            anchor_notice: None,
            newer_cursor: None,
        }
    }
}

fn full(t: &Timeline) -> Vec<(Origin, Block)> {
    t.rows().map(|r| (r.origin, r.block.clone())).collect()
}

fn load(t: &mut Timeline, host: &PatchHost, now: Millis) -> Result<(), TestCaseError> {
    t.reload(now);
    let tag = std::iter::from_fn(|| t.poll_effect())
        .filter_map(|e| match e {
            TimelineEffect::LoadLatestWindow { tag, .. } => Some(tag),
            _ => None,
        })
        .last()
        .unwrap();
    prop_assert_eq!(
        t.handle_latest_window(&tag, Ok(host.window()), now),
        Outcome::Applied
    );
    Ok(())
}

fn run_patches(
    mode: ClientMode,
    history: &[Block],
    steps: &[(Write, bool, bool)],
) -> Result<(), TestCaseError> {
    let mut history_keys = HashSet::new();
    let mut host = PatchHost {
        history: history
            .iter()
            .filter(|b| history_keys.insert(b.key()))
            .cloned()
            .collect(),
        live: BTreeMap::new(),
        epoch: 1,
        revision: 1,
    };
    let target = timeline_core::key::TargetId::new("t").unwrap();
    // by_snapshot gets every snapshot, by_patch every patch, lossy loses some patches.
    let mut clients: Vec<Timeline> = (0..3).map(|_| Timeline::new(mode)).collect();
    for c in &mut clients {
        c.open_target(target.clone(), Millis(0));
        load(c, &host, Millis(1))?;
    }
    let mut lossy_synced = true;
    for (i, (w, lost, heal)) in steps.iter().enumerate() {
        let now = Millis(10 + i as u64);
        let prev = host.snapshot();
        match w {
            Write::Upsert(rows) => {
                for b in rows {
                    host.live.insert(b.key(), b.clone());
                }
            }
            Write::Grow(pick, token) => {
                let keys: Vec<BlockKey> = host.live.keys().cloned().collect();
                if !keys.is_empty() {
                    let b = host.live.get_mut(&keys[pick.index(keys.len())]).unwrap();
                    let text = b.data.get("text").and_then(|t| t.as_str()).unwrap_or("");
                    let grown = format!("{text}{token}");
                    match b.data.as_object_mut() {
                        Some(o) => {
                            o.insert("text".into(), serde_json::Value::String(grown));
                        }
                        None => b.data = serde_json::json!({ "text": grown }),
                    }
                }
            }
            Write::Remove(picks) => {
                for pick in picks {
                    let keys: Vec<BlockKey> = host.live.keys().cloned().collect();
                    if !keys.is_empty() {
                        host.live.remove(&keys[pick.index(keys.len())]);
                    }
                }
            }
            Write::Settle => {
                if let Some((_, b)) = host.live.pop_first() {
                    host.history.retain(|h| h.key() != b.key());
                    host.history.push(b);
                }
                host.epoch += 1;
                host.revision += 1;
                for c in &mut clients {
                    load(c, &host, now)?;
                }
                lossy_synced = true;
            }
            Write::Pending(n) => {
                for c in &mut clients {
                    c.add_pending(PendingSend {
                        operation_id: op(*n),
                        created_at: Millis(3),
                        data: serde_json::json!({"text": "same"}),
                    });
                }
            }
        }
        if matches!(w, Write::Upsert(_) | Write::Remove(_) | Write::Grow(..)) {
            host.revision += 1;
            let next = host.snapshot();
            let patch = LivePatch::between(&prev, &next).unwrap();
            prop_assert_eq!(
                patch.apply_to(&prev).map(|o| o.blocks.len()),
                Ok(next.blocks.len())
            );
            prop_assert_eq!(
                clients[0].handle_live_update(&target, next.clone(), now),
                Outcome::Applied
            );
            prop_assert_eq!(
                clients[1].handle_live_patch(&target, patch.clone(), now),
                Outcome::Applied
            );
            if *lost {
                lossy_synced = false;
            } else {
                let before = full(&clients[2]);
                let outcome = clients[2].handle_live_patch(&target, patch, now);
                if lossy_synced {
                    prop_assert_eq!(outcome, Outcome::Applied);
                } else {
                    // Refused with the typed outcome; not a row changes.
                    prop_assert_eq!(outcome, Outcome::Ignored(IgnoreReason::BaseMismatch));
                    prop_assert_eq!(full(&clients[2]), before);
                }
            }
            if *heal {
                let healed = clients[2].handle_live_update(&target, next, now);
                let expect = if lossy_synced {
                    Outcome::Unchanged
                } else {
                    Outcome::Applied
                };
                prop_assert_eq!(healed, expect);
                lossy_synced = true;
            }
        }
        // Patch by patch equals snapshot, row for row, and the incremental index equals
        // a full rebuild.
        let expected = full(&clients[0]);
        prop_assert_eq!(&full(&clients[1]), &expected, "step {}: {:?}", i, w);
        prop_assert_eq!(clients[1].overlay_version(), clients[0].overlay_version());
        prop_assert_eq!(&clients[1].full_rebuild(), &expected);
        if lossy_synced {
            prop_assert_eq!(&full(&clients[2]), &expected, "healed at step {}", i);
        }
        prop_assert_eq!(&clients[2].full_rebuild(), &full(&clients[2]));
        for c in &mut clients {
            prop_assert!(c.poll_effect().is_none(), "no reload asked");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fixtures::proptest_cases()))]

    // TL-06 (live patches), TL-02, TL-03: patch by patch equals snapshot, on every
    // client mode; a client that lost a patch refuses the next and heals at a snapshot.
    #[test]
    fn patch_by_patch_equals_snapshot_on_every_client_mode(
        history in prop::collection::vec(fixtures::strategies::block(), 0..6),
        steps in prop::collection::vec(patch_step(), 1..60),
    ) {
        for mode in [ClientMode::Phone, ClientMode::Desktop] {
            run_patches(mode, &history, &steps)?;
        }
    }
}
