//! The whole loop: one host (overlay store, history source, live hub) and two clients
//! (a desktop window and a phone, each a timeline-core reducer), under random
//! interleavings of live writes, history growth, latest-window loads and settlement,
//! with relay events lost, duplicated and reordered (OV-02, OV-04, OV-05, OV-07, TL-06).
//!
//! Invariants:
//! - no client ever shows a row twice;
//! - an ordinary live row never disappears from a client until that client has shown its
//!   history copy (or a fresh window moved past it, so it is older saved history);
//! - after each client loads a latest window answered at once, it shows exactly the
//!   host's view: the page and the overlay;
//! - overlay revisions handed out by the host are unique and increasing.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{HashMap, HashSet};

use common::*;
use overlay_core::live::{Delivery, LiveHub, Payload};
use overlay_core::overlay::Change;
use overlay_core::source::MemorySource;
use overlay_core::store::memory::MemoryOverlayStore;
use overlay_core::store::write;
use overlay_core::store::{OverlayStore, StoredOverlay};
use overlay_core::window::{latest_window, older_page, OlderPageRequest, Target};
use proptest::prelude::*;
use timeline_core::key::{BlockKey, SessionId, TargetId};
use timeline_core::time::Millis;
use timeline_core::timeline::{ClientMode, Origin, RequestTag, Timeline, TimelineEffect};
use timeline_core::wire::{LiveOverlay, OlderPage, TimelineWindow};

#[derive(Clone, Debug)]
enum Step {
    Stream(u8),
    Save(prop::sample::Index),
    Append,
    Load(usize),
    DeliverWindow(usize, prop::sample::Index),
    LoadOlder(usize),
    DeliverOlder(usize, prop::sample::Index),
    Relay(usize, prop::sample::Index, bool),
    Lose(usize, prop::sample::Index),
}

fn step() -> impl Strategy<Value = Step> {
    let c = 0usize..2;
    prop_oneof![
        4 => (0u8..12).prop_map(Step::Stream),
        3 => any::<prop::sample::Index>().prop_map(Step::Save),
        2 => Just(Step::Append),
        2 => c.clone().prop_map(Step::Load),
        3 => (c.clone(), any::<prop::sample::Index>()).prop_map(|(c, i)| Step::DeliverWindow(c, i)),
        1 => c.clone().prop_map(Step::LoadOlder),
        1 => (c.clone(), any::<prop::sample::Index>()).prop_map(|(c, i)| Step::DeliverOlder(c, i)),
        6 => (c.clone(), any::<prop::sample::Index>(), any::<bool>()).prop_map(|(c, i, d)| Step::Relay(c, i, d)),
        1 => (c, any::<prop::sample::Index>()).prop_map(|(c, i)| Step::Lose(c, i)),
    ]
}

struct Client {
    t: Timeline,
    windows: Vec<(RequestTag, TimelineWindow)>,
    pages: Vec<(RequestTag, OlderPage)>,
    relay: Vec<LiveOverlay>,
    shown_as_history: HashSet<BlockKey>,
}

struct World {
    s: SessionId,
    target: TargetId,
    store: MemoryOverlayStore,
    source: MemorySource,
    hub: LiveHub,
    clients: Vec<Client>,
    now: u64,
    next_ordinal: u64,
    revisions: Vec<u64>,
}

impl World {
    fn new() -> World {
        let s = session();
        let target = main_target();
        let mut hub = LiveHub::new();
        hub.set_phone_interest(&s, true);
        let clients = [ClientMode::Desktop, ClientMode::Phone]
            .into_iter()
            .map(|mode| {
                let mut t = Timeline::new(mode);
                t.open_target(target.clone(), Millis(0));
                Client {
                    t,
                    windows: vec![],
                    pages: vec![],
                    relay: vec![],
                    shown_as_history: HashSet::new(),
                }
            })
            .collect();
        let mut w = World {
            s,
            target,
            store: MemoryOverlayStore::new(),
            source: filled(claude_source(), 4),
            hub,
            clients,
            now: 10_000,
            next_ordinal: 4,
            revisions: vec![],
        };
        for c in 0..2 {
            w.serve(c);
        }
        w
    }

    fn tick(&mut self) -> u64 {
        self.now += 10;
        self.now
    }

    /// Sends a stored snapshot through the hub; every relay event goes to both phones'
    /// queues (the desktop client here also listens to the relay).
    fn emit(&mut self, stored: &StoredOverlay) {
        self.revisions.push(stored.revision);
        let payload = Payload::Blocks {
            session: self.s.clone(),
            target: self.target.clone(),
            overlay: stored.client_form(),
        };
        self.hub.handle_payload(payload, Millis(self.now));
        while let Some(d) = self.hub.poll_effect() {
            if let Delivery::Relay(r) = d {
                let o: LiveOverlay = serde_json::from_value(r.json["liveOverlay"].clone()).unwrap();
                for c in &mut self.clients {
                    c.relay.push(o.clone());
                }
            }
        }
    }

    fn serve(&mut self, c: usize) {
        while let Some(e) = self.clients[c].t.poll_effect() {
            match e {
                TimelineEffect::LoadLatestWindow { tag, page_size, .. } => {
                    let target = Target {
                        session: &self.s,
                        target: &self.target,
                        current_run: None,
                    };
                    let built = latest_window(
                        &mut self.store,
                        &mut self.source,
                        &host_key(),
                        target,
                        page_size,
                    )
                    .unwrap();
                    if let Some(stored) = &built.settled {
                        let stored = stored.clone();
                        self.emit(&stored);
                    }
                    self.clients[c].windows.push((tag, built.window));
                }
                TimelineEffect::LoadOlderPage {
                    tag,
                    cursor,
                    page_size,
                    expected_boundary_token,
                } => {
                    let req = OlderPageRequest {
                        cursor: &cursor,
                        page_size,
                        expected_boundary_token: expected_boundary_token.as_ref(),
                    };
                    let page = older_page(&mut self.source, &host_key(), req).unwrap();
                    self.clients[c].pages.push((tag, page));
                }
                TimelineEffect::StopPaging { .. } => {}
                other => panic!("{other:?}"),
            }
        }
    }

    fn run(&mut self, step: Step) -> Result<(), TestCaseError> {
        let before: Vec<Vec<(Origin, BlockKey)>> = self
            .clients
            .iter()
            .map(|c| c.t.rows().map(|r| (r.origin, r.block.key())).collect())
            .collect();
        let now = Millis(self.now);
        match step {
            Step::Stream(n) => {
                let id = format!("live-{n}");
                let saved_already = self
                    .source
                    .all_blocks()
                    .iter()
                    .any(|b| b.key() == reply(&id));
                if !saved_already {
                    let t = self.tick();
                    let row = live(&id, t, "run-1");
                    let result = write(
                        &mut self.store,
                        &self.s,
                        &self.target,
                        &Change::Publish(vec![row]),
                    )
                    .unwrap();
                    let stored = result.stored().unwrap().clone();
                    self.emit(&stored);
                }
            }
            Step::Save(i) => {
                let live_rows = self
                    .store
                    .load(&self.s, &self.target)
                    .unwrap()
                    .map(|o| o.blocks)
                    .unwrap_or_default();
                if !live_rows.is_empty() {
                    let row = &live_rows[i.index(live_rows.len())];
                    let key = row.block.key();
                    if !self.source.all_blocks().iter().any(|b| b.key() == key) {
                        let mut b = row.block.clone();
                        b.source_order = Some(timeline_core::order::SourceOrder::history(
                            self.next_ordinal,
                            0,
                        ));
                        self.next_ordinal += 1;
                        self.source.push(vec![b]);
                    }
                }
            }
            Step::Append => {
                let t = self.tick();
                let id = format!("h-{}", self.next_ordinal);
                self.source.push(vec![saved(&id, t, self.next_ordinal)]);
                self.next_ordinal += 1;
            }
            Step::Load(c) => {
                self.clients[c].t.reload(now);
            }
            Step::DeliverWindow(c, i) => {
                if !self.clients[c].windows.is_empty() {
                    let idx = i.index(self.clients[c].windows.len());
                    let (tag, w) = self.clients[c].windows.remove(idx);
                    self.clients[c].t.handle_latest_window(&tag, Ok(w), now);
                }
            }
            Step::LoadOlder(c) => {
                self.clients[c].t.load_older(now);
            }
            Step::DeliverOlder(c, i) => {
                if !self.clients[c].pages.is_empty() {
                    let idx = i.index(self.clients[c].pages.len());
                    let (tag, p) = self.clients[c].pages.remove(idx);
                    self.clients[c].t.handle_older_page(&tag, Ok(p), now);
                }
            }
            Step::Relay(c, i, dup) => {
                if !self.clients[c].relay.is_empty() {
                    let idx = i.index(self.clients[c].relay.len());
                    let o = if dup {
                        self.clients[c].relay[idx].clone()
                    } else {
                        self.clients[c].relay.remove(idx)
                    };
                    let target = self.target.clone();
                    self.clients[c].t.handle_live_update(&target, o, now);
                }
            }
            Step::Lose(c, i) => {
                if !self.clients[c].relay.is_empty() {
                    let idx = i.index(self.clients[c].relay.len());
                    self.clients[c].relay.remove(idx);
                }
            }
        }
        for c in 0..2 {
            self.serve(c);
        }
        for (c, before) in before.iter().enumerate() {
            self.check(c, before)?;
        }
        Ok(())
    }

    fn check(&mut self, c: usize, before: &[(Origin, BlockKey)]) -> Result<(), TestCaseError> {
        let saved: HashMap<BlockKey, timeline_core::order::OrderKey> = self
            .source
            .all_blocks()
            .iter()
            .map(|b| (b.key(), b.order_key()))
            .collect();
        let client = &mut self.clients[c];
        let rows: Vec<_> = client.t.rows().collect();
        let keys: HashSet<BlockKey> = rows.iter().map(|r| r.block.key()).collect();
        prop_assert_eq!(keys.len(), rows.len(), "a row shows twice");
        for r in &rows {
            if r.origin == Origin::History {
                client.shown_as_history.insert(r.block.key());
            }
        }
        let oldest = rows
            .iter()
            .find(|r| r.origin == Origin::History)
            .map(|r| r.block.order_key());
        for (origin, k) in before {
            if *origin == Origin::Live && !keys.contains(k) && !client.shown_as_history.contains(k)
            {
                let above = match (saved.get(k), &oldest) {
                    (Some(s), Some(o)) => s < o,
                    _ => false,
                };
                prop_assert!(above, "live row {} disappeared from client {}", k, c);
            }
        }
        Ok(())
    }

    /// Each client loads a latest window answered at once: it shows the host's view.
    fn converge(&mut self) -> Result<(), TestCaseError> {
        for c in 0..2 {
            self.clients[c].windows.clear();
            self.clients[c].relay.clear();
            self.clients[c].t.reload(Millis(self.now));
            self.serve(c);
            let (tag, w) = self.clients[c].windows.pop().unwrap();
            self.clients[c]
                .t
                .handle_latest_window(&tag, Ok(w.clone()), Millis(self.now));
            let host_view: HashSet<BlockKey> = w
                .blocks
                .iter()
                .chain(&w.live_overlay.as_ref().unwrap().blocks)
                .map(|b| b.key())
                .collect();
            let shown: HashSet<BlockKey> =
                self.clients[c].t.rows().map(|r| r.block.key()).collect();
            prop_assert_eq!(&shown, &host_view, "client {} differs from the host", c);
            let stored = self.store.load(&self.s, &self.target).unwrap();
            prop_assert_eq!(
                self.clients[c].t.overlay_version(),
                stored
                    .map(|o| (o.settlement_epoch, o.revision))
                    .or(Some((0, 0)))
            );
        }
        let mut sorted = self.revisions.clone();
        sorted.dedup();
        prop_assert!(
            sorted.windows(2).all(|w| w[0] < w[1]),
            "revisions unique and increasing"
        );
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fixtures::proptest_cases()))]

    // OV-02, OV-04, OV-05, OV-07, TL-06
    #[test]
    fn host_and_two_clients_converge_without_losing_or_doubling_rows(steps in prop::collection::vec(step(), 1..80)) {
        let mut w = World::new();
        for s in steps {
            w.run(s)?;
        }
        w.converge()?;
    }
}
