//! End to end on a real SQLite file: a host (custody, overlay store, live hub) with a
//! scripted Codex-like agent, a desktop window and a phone.
//!
//! The phone sends two messages: the first is accepted and confirmed by its echo; the
//! reply to the second is lost, so it is confirmed from the agent's history instead of
//! being sent again. The agent streams live rows; one relay event to the phone is lost.
//! Halfway the host restarts from the file. The rows settle into history, the phone pages
//! in older rows, and both timelines are printed side by side with an invariant report.
//!
//! `cargo run -p storage-sqlite --example demo`

use std::collections::{BTreeSet, HashSet};

use fixtures::adapters::{ScriptedAdapter, Step};
use outbox_core::adapter::Capabilities;
use outbox_core::custody::{Custody, SessionInfo, SubmitRequest};
use outbox_core::entry::{Controls, MessageRequest};
use outbox_core::ids::{OperationId, QueueId};
use overlay_core::live::{Delivery, LiveHub, Payload, WindowId};
use overlay_core::overlay::{write, Change, LiveSequencer};
use overlay_core::source::{MemorySource, SourceKind};
use overlay_core::store::{RowClass, StoredBlock, StoredOverlay};
use overlay_core::window::{latest_window, older_page, OlderPageRequest, Target};
use storage_sqlite::{Settings, SqliteStore};
use timeline_core::block::Block;
use timeline_core::cursor::BoundaryToken;
use timeline_core::key::{BlockKey, BlockType, RunId, SessionId, TargetId};
use timeline_core::order::SourceOrder;
use timeline_core::seal::HostKey;
use timeline_core::time::Millis;
use timeline_core::timeline::{ClientMode, Effect, Origin, PendingSend, Timeline};
use timeline_core::wire::LiveOverlay;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The host: custody and overlays on two connections to one file, the live hub.
struct Host {
    custody: Custody<SqliteStore>,
    overlays: SqliteStore,
    hub: LiveHub,
}

impl Host {
    fn open(path: &std::path::Path, session: &SessionId) -> Result<Host> {
        let mut n = 0u64;
        let mut custody = Custody::new(
            SqliteStore::open(path, Settings::default())?,
            Box::new(move || {
                n += 1;
                format!("{n:08x}")
            }),
        );
        custody.set_session(session, SessionInfo::new(Capabilities::codex()));
        let mut hub = LiveHub::new();
        hub.set_phone_interest(session, true);
        Ok(Host {
            custody,
            overlays: SqliteStore::open(path, Settings::default())?,
            hub,
        })
    }
}

struct World {
    host: Host,
    agent: ScriptedAdapter,
    source: MemorySource,
    key: HostKey,
    session: SessionId,
    target: TargetId,
    desktop: Timeline,
    phone: Timeline,
    phone_inbox: Vec<LiveOverlay>,
    sequencer: LiveSequencer,
    now: Millis,
    ordinal: u64,
    lost_relay_events: usize,
}

impl World {
    fn tick(&mut self) -> Millis {
        self.now = self.now.saturating_add(Millis(10));
        self.now
    }

    /// Serves a client's load effects from the host.
    fn serve(&mut self, phone: bool) -> Result<()> {
        loop {
            let client = if phone {
                &mut self.phone
            } else {
                &mut self.desktop
            };
            let Some(effect) = client.poll_effect() else {
                break;
            };
            let t = Target {
                session: &self.session,
                target: &self.target,
                current_run: None,
            };
            match effect {
                Effect::LoadLatestWindow { tag, page_size, .. } => {
                    let built = latest_window(
                        &mut self.host.overlays,
                        &mut self.source,
                        &self.key,
                        t,
                        page_size,
                    )?;
                    if let Some(stored) = built.settled {
                        self.emit(&stored);
                    }
                    let client = if phone {
                        &mut self.phone
                    } else {
                        &mut self.desktop
                    };
                    client.handle_latest_window(&tag, Ok(built.window), self.now);
                }
                Effect::LoadOlderPage {
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
                    let page = older_page(&mut self.source, &self.key, req)?;
                    let client = if phone {
                        &mut self.phone
                    } else {
                        &mut self.desktop
                    };
                    client.handle_older_page(&tag, Ok(page), self.now);
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Saved before sent: emit the stored snapshot; deliver windows and relay.
    fn emit(&mut self, stored: &StoredOverlay) {
        let payload = Payload::Blocks {
            session: self.session.clone(),
            target: self.target.clone(),
            overlay: stored.client_form(),
        };
        self.host.hub.emit(payload, self.now);
        self.host
            .hub
            .handle_timeout(self.now.saturating_add(Millis(50)));
        self.deliver();
    }

    fn deliver(&mut self) {
        while let Some(d) = self.host.hub.poll_delivery() {
            match d {
                Delivery::Window {
                    payload: Payload::Blocks { overlay, .. },
                    ..
                } => {
                    self.desktop
                        .handle_live_update(&self.target, overlay, self.now);
                }
                Delivery::Relay(event) => {
                    if let Ok(o) =
                        serde_json::from_value::<LiveOverlay>(event.json["liveOverlay"].clone())
                    {
                        self.phone_inbox.push(o);
                    }
                }
                _ => {}
            }
        }
    }

    fn flush_phone(&mut self) {
        for o in std::mem::take(&mut self.phone_inbox) {
            self.phone.handle_live_update(&self.target, o, self.now);
        }
    }

    /// The agent writes a live row of `run`.
    fn stream(
        &mut self,
        key: BlockKey,
        op: Option<OperationId>,
        run: &RunId,
        text: &str,
    ) -> Result<()> {
        let t = self.tick();
        let mut block = Block::new(key.clone(), t)
            .with_source_order(self.sequencer.source_order(run, &key))
            .with_data(serde_json::json!({ "text": text }));
        block.operation_id = op;
        let row = StoredBlock {
            block,
            class: RowClass::Ordinary,
            run_id: Some(run.clone()),
        };
        let result = write(
            &mut self.host.overlays,
            &self.session,
            &self.target,
            &Change::Publish(vec![row]),
        )?;
        if let Some(stored) = result.stored().cloned() {
            self.emit(&stored);
        }
        Ok(())
    }

    /// The agent saves a live row to its transcript (same key, same timestamp).
    fn save(&mut self, key: &BlockKey) -> Result<()> {
        let stored = overlay_core::store::OverlayStore::load(
            &mut self.host.overlays,
            &self.session,
            &self.target,
        )?;
        if let Some(row) = stored.and_then(|o| o.blocks.into_iter().find(|b| &b.block.key() == key))
        {
            let mut b = row.block;
            b.source_order = Some(SourceOrder::history(self.ordinal, 0));
            self.ordinal += 1;
            self.source.push(vec![b]);
        }
        Ok(())
    }

    fn submit(&mut self, n: u32, text: &str) -> Result<OperationId> {
        let op = OperationId::new(format!("op-{n}"))?;
        let at = self.tick();
        self.phone.add_pending(PendingSend {
            operation_id: op.clone(),
            created_at: at,
            data: serde_json::json!({ "text": text }),
        });
        let receipt = self.host.custody.submit(
            SubmitRequest {
                session: self.session.clone(),
                queue_id: QueueId::new(format!("q-{n}"))?,
                operation_id: op.clone(),
                request: MessageRequest::text(text, "phone", self.now),
                controls: Controls::automatic(),
            },
            self.now,
        )?;
        self.phone.confirm_pending(&op);
        println!(
            "  saved     {} (receipt: queue {}, replayed {})",
            op, receipt.queue_id, receipt.replayed
        );
        Ok(op)
    }
}

fn rows(t: &Timeline) -> Vec<String> {
    t.rows()
        .map(|r| {
            let origin = match r.origin {
                Origin::History => "history",
                Origin::Live => "live",
                Origin::Pending => "pending",
            };
            format!("{origin:<8} {}", r.block.key())
        })
        .collect()
}

fn main() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("custody.sqlite");
    println!("database: {}\n", path.display());
    let session = SessionId::new("session-1")?;
    let target = TargetId::main(&session);
    let mut source = MemorySource::new(
        SourceKind::Codex {
            thread_id: "thread-1".into(),
            generation: 1,
        },
        BoundaryToken::codex_rollout("/sessions/rollout-1.jsonl"),
    );
    // An older conversation is already saved.
    for i in 0..30u64 {
        let t = BlockType::ALL[(i % 2) as usize * 3]; // user, agent-reply
        source.push(vec![Block::new(
            BlockKey::parse(t, &format!("old-{i}"))?,
            Millis(1_000 + i * 10),
        )
        .with_source_order(SourceOrder::history(i, 0))]);
    }
    let mut w = World {
        host: Host::open(&path, &session)?,
        agent: ScriptedAdapter::codex(),
        source,
        key: HostKey::from_bytes([0x42; 32]),
        session: session.clone(),
        target: target.clone(),
        desktop: Timeline::new(ClientMode::Desktop),
        phone: Timeline::new(ClientMode::Phone),
        phone_inbox: Vec::new(),
        sequencer: LiveSequencer::new(),
        now: Millis(10_000),
        ordinal: 30,
        lost_relay_events: 0,
    };
    w.agent.default = fixtures::adapters::WhenUnscripted::Accept;
    w.host
        .hub
        .subscribe(&mut w.host.overlays, WindowId(1), &session, &target)?;
    w.desktop.open_target(target.clone(), w.now);
    w.phone.open_target(target.clone(), w.now);
    w.serve(false)?;
    w.serve(true)?;

    println!("1. the phone sends a message; the turn accepts it; the echo confirms it");
    let op1 = w.submit(1, "Run the test suite")?;
    let notes = w.host.custody.drive(&mut w.agent, w.now);
    assert!(notes.is_empty());
    let run1 = w
        .host
        .custody
        .runs()
        .active(&session)
        .map(|r| r.run_id.clone())
        .ok_or("a run started")?;
    w.stream(
        BlockKey::user_message(&op1),
        Some(op1.clone()),
        &run1,
        "Run the test suite",
    )?;
    for chunk in ["Running", "Running the", "Running the tests: 412 passed"] {
        w.stream(
            BlockKey::parse(BlockType::AgentReply, "reply-1")?,
            None,
            &run1,
            chunk,
        )?;
    }
    // One relay event to the phone is lost on the way; the next snapshot carries all.
    w.phone_inbox.remove(1);
    w.lost_relay_events += 1;
    w.flush_phone();
    w.host.custody.handle_delivery_proof(&session, &op1, w.now);
    w.host.custody.handle_run_ended(&session, &run1, &[], w.now);
    w.host.custody.drive(&mut w.agent, w.now);
    println!(
        "  confirmed {op1}: the outbox holds {} entries",
        w.host.custody.entries(&session)?.len()
    );

    println!("2. the second message's reply is lost; history proves it arrived");
    w.agent.then(Step::lost_reply_but_recorded());
    let op2 = w.submit(2, "Now fix the flaky login test")?;
    w.host.custody.drive(&mut w.agent, w.now);
    println!(
        "  {op2}: sent {} time(s) to the agent, outbox holds {} entries",
        w.agent.send_count(&op2),
        w.host.custody.entries(&session)?.len()
    );
    let run2 = w
        .host
        .custody
        .runs()
        .active(&session)
        .map(|r| r.run_id.clone())
        .ok_or("a run")?;
    w.stream(
        BlockKey::user_message(&op2),
        Some(op2.clone()),
        &run2,
        "Now fix the flaky login test",
    )?;
    w.stream(
        BlockKey::parse(BlockType::AgentReply, "reply-2")?,
        None,
        &run2,
        "Fixed: the test waited on a timer.",
    )?;
    w.flush_phone();

    println!("3. the agent saves its transcript; the host restarts from the file");
    for key in [
        BlockKey::user_message(&op1),
        BlockKey::parse(BlockType::AgentReply, "reply-1")?,
        BlockKey::user_message(&op2),
        BlockKey::parse(BlockType::AgentReply, "reply-2")?,
    ] {
        w.save(&key)?;
    }
    w.host.custody.handle_run_ended(&session, &run2, &[], w.now);
    let revision_before =
        overlay_core::store::OverlayStore::current_revision(&mut w.host.overlays)?;
    let placeholder = Host::open(&path, &session)?;
    drop(std::mem::replace(&mut w.host, placeholder));
    w.host.custody.start_up(w.now)?;
    w.host.custody.drive(&mut w.agent, w.now);
    w.host
        .hub
        .subscribe(&mut w.host.overlays, WindowId(1), &session, &target)?;
    let revision_after = overlay_core::store::OverlayStore::current_revision(&mut w.host.overlays)?;
    println!("  reopened: revision counter {revision_before} -> {revision_after} (kept)");

    println!("4. latest windows settle the live rows into history; the phone reads back");
    w.desktop.reload(w.now);
    w.serve(false)?;
    w.flush_phone();
    w.phone.reload(w.now);
    w.serve(true)?;
    for op in [&op1, &op2] {
        w.phone.remove_pending(op);
    }
    w.phone.load_older(w.now);
    w.serve(true)?;

    let (d, p) = (rows(&w.desktop), rows(&w.phone));
    println!("\n{:<44} | phone", "desktop");
    println!("{:-<44}-+-{:-<44}", "", "");
    for i in 0..d.len().max(p.len()) {
        println!(
            "{:<44} | {}",
            d.get(i).cloned().unwrap_or_default(),
            p.get(i).cloned().unwrap_or_default()
        );
    }

    println!("\ninvariants");
    let mut ok = true;
    for (name, t) in [("desktop", &w.desktop), ("phone", &w.phone)] {
        let keys: HashSet<BlockKey> = t.rows().map(|r| r.block.key()).collect();
        let unique = keys.len() == t.len();
        let sorted = t
            .rows()
            .collect::<Vec<_>>()
            .windows(2)
            .all(|x| x[0].block.order_key() < x[1].block.order_key());
        let settled = [BlockKey::user_message(&op1), BlockKey::user_message(&op2)]
            .iter()
            .all(|k| t.row(k).map(|r| r.origin) == Some(Origin::History));
        println!("  {name:<8} rows={:<3} no duplicates={unique} ordered={sorted} messages in history={settled}", t.len());
        ok &= unique && sorted && settled;
    }
    let sends: BTreeSet<usize> = [&op1, &op2].iter().map(|o| w.agent.send_count(o)).collect();
    let nothing_lost =
        w.host.custody.entries(&session)?.is_empty() && w.source.all_blocks().len() == 34;
    let newest = |t: &Timeline| {
        t.rows()
            .rev()
            .take(12)
            .map(|r| r.block.key())
            .collect::<Vec<_>>()
    };
    let converged = newest(&w.desktop) == newest(&w.phone);
    println!(
        "  each message reached the agent once={}",
        sends == BTreeSet::from([1])
    );
    println!("  nothing lost (outbox empty, transcript complete)={nothing_lost}");
    println!(
        "  lost relay events={} and both clients converged={converged}",
        w.lost_relay_events
    );
    ok &= sends == BTreeSet::from([1]) && nothing_lost && converged;
    if !ok {
        return Err("an invariant failed".into());
    }
    Ok(())
}
