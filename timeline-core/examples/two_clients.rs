//! A desktop window and a phone watch one conversation. Each merges a history page, the
//! live overlay and a pending send into one ordered, duplicate-free list; a reply
//! streams, settles into history, and the phone pages in older rows. The rows are
//! printed side by side with an invariant report.
//!
//! `cargo run -p timeline-core --example two_clients`

use std::collections::HashSet;

use fixtures::sim_host::SimHost;
use timeline_core::key::{BlockKey, BlockType, OperationId};
use timeline_core::time::Millis;
use timeline_core::timeline::{ClientMode, Origin, PendingSend, Timeline, TimelineEffect};
use timeline_core::wire::LiveOverlay;

struct Client {
    name: &'static str,
    timeline: Timeline,
}

impl Client {
    fn new(name: &'static str, mode: ClientMode, host: &SimHost) -> Client {
        let mut timeline = Timeline::new(mode);
        timeline.open_target(host.target().clone(), Millis(0));
        Client { name, timeline }
    }

    /// Carries out the client's effects against the host, answering at once.
    fn serve(&mut self, host: &mut SimHost, now: Millis) -> Vec<LiveOverlay> {
        let mut emitted = Vec::new();
        while let Some(effect) = self.timeline.poll_effect() {
            match effect {
                TimelineEffect::LoadLatestWindow { tag, page_size, .. } => {
                    let (window, snapshot) = host.latest_window_sized(page_size);
                    emitted.extend(snapshot);
                    self.timeline.handle_latest_window(&tag, Ok(window), now);
                }
                TimelineEffect::LoadOlderPage { tag, cursor, .. } => {
                    let page = host.older_page(&cursor);
                    self.timeline.handle_older_page(&tag, Ok(page), now);
                }
                other => println!("  {} ignores {other:?}", self.name),
            }
        }
        emitted
    }

    fn rows(&self) -> Vec<String> {
        self.timeline
            .rows()
            .map(|r| {
                let origin = match r.origin {
                    Origin::History => "history",
                    Origin::Live => "live",
                    Origin::Pending => "pending",
                };
                format!("{:<8} {}", origin, r.block.key())
            })
            .collect()
    }
}

fn main() {
    let mut host = SimHost::new("session-1");
    host.append_history(20);
    let mut desktop = Client::new("desktop", ClientMode::Desktop, &host);
    let mut phone = Client::new("phone", ClientMode::Phone, &host);
    let mut relay: Vec<LiveOverlay> = Vec::new();
    for c in [&mut desktop, &mut phone] {
        relay.extend(c.serve(&mut host, Millis(1)));
    }

    // The phone sends "run it again"; its echo shows at once under the key its history
    // row will have.
    let op = OperationId::new("op-42").expect("non-blank");
    phone.timeline.add_pending(PendingSend {
        operation_id: op.clone(),
        created_at: Millis(5_000),
        data: serde_json::json!({ "text": "run it again" }),
    });

    // The host accepts it and the agent streams a reply; every write goes to the relay.
    relay.push(host.stream_user_message(&op));
    let reply = BlockKey::parse(BlockType::AgentReply, "reply-1").expect("non-blank");
    for _ in 0..3 {
        relay.push(host.stream_live(reply.clone(), None));
    }
    // One relay event is lost on the way to the phone; the next snapshot carries it all.
    relay.remove(1);
    for snapshot in relay.drain(..) {
        for c in [&mut desktop, &mut phone] {
            c.timeline
                .handle_live_update(host.target(), snapshot.clone(), Millis(6_000));
        }
    }

    // The agent saves both rows; the desktop's next latest window settles them (the
    // epoch rises), and the phone refuses that newer epoch live and reloads its own.
    host.save_to_history(&BlockKey::user_message(&op));
    host.save_to_history(&reply);
    desktop.timeline.reload(Millis(7_000));
    let settled = desktop.serve(&mut host, Millis(7_000));
    for snapshot in settled {
        let outcome = phone
            .timeline
            .handle_live_update(host.target(), snapshot, Millis(7_001));
        println!("phone, live update after settlement: {outcome:?}");
    }
    phone.serve(&mut host, Millis(7_002));
    // The outbox let go of the message because it was sent: the echo retires by itself
    // once a row carries it (here at once: the history row does).
    let delivered = phone.timeline.mark_delivered(&op);
    println!("phone, message delivered: {delivered:?}");

    // The phone reads back: one older page splices above its seam.
    phone.timeline.load_older(Millis(8_000));
    phone.serve(&mut host, Millis(8_000));

    let (d, p) = (desktop.rows(), phone.rows());
    println!("\n{:<40} | phone", "desktop");
    println!("{:-<40}-+-{:-<40}", "", "");
    for i in 0..d.len().max(p.len()) {
        let cell = |v: &Vec<String>| v.get(i).cloned().unwrap_or_default();
        println!("{:<40} | {}", cell(&d), cell(&p));
    }

    let report = |c: &Client| {
        let keys: HashSet<BlockKey> = c.timeline.rows().map(|r| r.block.key()).collect();
        let unique = keys.len() == c.timeline.len();
        let sorted = c
            .timeline
            .rows()
            .collect::<Vec<_>>()
            .windows(2)
            .all(|w| w[0].block.order_key() < w[1].block.order_key());
        let settled = c.timeline.row(&reply).map(|r| r.origin) == Some(Origin::History);
        println!(
            "{:<8} rows={:<3} no duplicates={unique} sorted={sorted} reply settled={settled}",
            c.name,
            c.timeline.len()
        );
        unique && sorted && settled
    };
    println!();
    let ok = report(&desktop) & report(&phone);
    let newest = |c: &Client| c.rows().into_iter().rev().take(12).collect::<Vec<_>>();
    let converged = newest(&desktop) == newest(&phone);
    println!("newest rows converged={converged}");
    if !(ok && converged) {
        std::process::exit(1);
    }
}
