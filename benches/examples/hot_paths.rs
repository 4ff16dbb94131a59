//! Issue 25, item 7: the latest window over the memory store and a replay `append`:
//! today's code, the code this change replaced (`previous`) and the code before the
//! changes that slowed them (`baseline`; both in `benches::baseline`), measured in one
//! run, interleaved.
//!
//! Paired (the default): for each case, rounds in which the three versions each run a
//! batch of calls (the order rotates); the table gives each one's median time per call
//! and the medians of the per-round ratios new / baseline and new / previous.
//!
//! `cargo run --release -p benches --example hot_paths`
//!
//! One case alone, for `valgrind --tool=callgrind` (instructions per call: a run with
//! `CALLS` calls minus a run with 0, divided by `CALLS`):
//!
//! `hot_paths one <window-new|window-previous|window-old|append-new|append-previous|append-old> <N rows> <CALLS>`

use std::time::Instant;

use benches::baseline::{
    baseline_latest_window, previous_latest_window, BaselineKind, BaselineOverlayStore,
    BaselineReplay,
};
use overlay_core::overlay::Change;
use overlay_core::replay::{EventKind, ReplayBuffers, ReplayConfig};
use overlay_core::source::{MemorySource, SourceKind};
use overlay_core::store::memory::MemoryOverlayStore;
use overlay_core::store::write;
use overlay_core::store::{RowClass, StoredBlock};
use overlay_core::window::{latest_window, Target};
use timeline_core::block::Block;
use timeline_core::cursor::BoundaryToken;
use timeline_core::key::{BlockKey, BlockType, RunId, SessionId, TargetId};
use timeline_core::order::SourceOrder;
use timeline_core::seal::HostKey;
use timeline_core::time::Millis;

fn row(id: String, t: u64) -> Block {
    Block::new(
        BlockKey::parse(BlockType::AgentReply, &id).expect("id"),
        Millis(t),
    )
    .with_data(serde_json::json!({ "text": "streaming reply text of ordinary length" }))
}

/// A target with `n` live rows in both stores, and a history of 500 one-row items.
struct Windows {
    session: SessionId,
    target: TargetId,
    run: RunId,
    key: HostKey,
    source: MemorySource,
    new: MemoryOverlayStore,
    previous: MemoryOverlayStore,
    old: BaselineOverlayStore,
}

impl Windows {
    fn new(n: u64) -> Self {
        let session = SessionId::new("s").expect("id");
        let target = TargetId::main(&session);
        let run = RunId::new("run-1").expect("id");
        let mut source = MemorySource::new(
            SourceKind::Claude {
                session: "c".into(),
            },
            BoundaryToken::claude("c"),
        );
        for i in 0..500u64 {
            source.push(vec![
                row(format!("h-{i}"), i).with_source_order(SourceOrder::history(i, 0))
            ]);
        }
        let live: Vec<StoredBlock> = (0..n)
            .map(|i| StoredBlock {
                block: row(format!("live-{i}"), 1_000_000 + i)
                    .with_source_order(SourceOrder::live(i)),
                class: RowClass::Ordinary,
                run_id: Some(run.clone()),
            })
            .collect();
        let mut new = MemoryOverlayStore::new();
        write(&mut new, &session, &target, &Change::Publish(live.clone())).expect("write");
        let mut previous = MemoryOverlayStore::new();
        write(
            &mut previous,
            &session,
            &target,
            &Change::Publish(live.clone()),
        )
        .expect("write");
        let mut old = BaselineOverlayStore::new();
        old.write(&session, &target, &Change::Publish(live))
            .expect("write");
        Windows {
            session,
            target,
            run,
            key: HostKey::from_bytes([1; 32]),
            source,
            new,
            previous,
            old,
        }
    }

    fn run_new(&mut self) -> usize {
        let t = Target {
            session: &self.session,
            target: &self.target,
            current_run: Some(&self.run),
        };
        let built =
            latest_window(&mut self.new, &mut self.source, &self.key, t, 100).expect("window");
        built.window.live_overlay.map_or(0, |o| o.blocks.len())
    }

    fn run_previous(&mut self) -> usize {
        let (window, _) = previous_latest_window(
            &mut self.previous,
            &mut self.source,
            &self.key,
            &self.session,
            &self.target,
            Some(&self.run),
            100,
        )
        .expect("window");
        window.live_overlay.map_or(0, |o| o.blocks.len())
    }

    fn run_old(&mut self) -> usize {
        let (window, _) = baseline_latest_window(
            &mut self.old,
            &mut self.source,
            &self.key,
            &self.session,
            &self.target,
            Some(&self.run),
            100,
        )
        .expect("window");
        window.live_overlay.map_or(0, |o| o.blocks.len())
    }
}

/// A session holding 1,000 events in both buffers (every append trims), and 4,096
/// ~800-byte events to append (the shape of `benches/replay.rs`).
struct Appends {
    session: SessionId,
    texts: Vec<String>,
    new: ReplayBuffers,
    previous: BaselineReplay,
    old: BaselineReplay,
    next: usize,
}

impl Appends {
    fn new() -> Self {
        let session = SessionId::new("s").expect("id");
        let texts: Vec<String> = (0..4_096)
            .map(|i| {
                serde_json::json!({
                    "type": "assistant_delta",
                    "itemId": format!("item-{}", i / 40),
                    "text": "x".repeat(760 + i % 16),
                })
                .to_string()
            })
            .collect();
        let mut new = ReplayBuffers::new(ReplayConfig {
            max_events: 1_000,
            ..ReplayConfig::default()
        });
        let mut old = BaselineReplay::new(1_000, ReplayConfig::default().max_bytes);
        let mut previous = BaselineReplay::new(1_000, ReplayConfig::default().max_bytes);
        let init = r#"{"type":"session_init"}"#;
        new.append(&session, EventKind::Init, init.into(), Millis(0))
            .expect("one JSON object");
        old.append(&session, BaselineKind::Init, init.into(), 0);
        previous.append(&session, BaselineKind::Init, init.into(), 0);
        for s in texts.iter().take(1_000) {
            new.append(&session, EventKind::Other, s.clone(), Millis(0))
                .expect("one JSON object");
            old.append(&session, BaselineKind::Other, s.clone(), 0);
            previous.append(&session, BaselineKind::Other, s.clone(), 0);
        }
        Appends {
            session,
            texts,
            new,
            previous,
            old,
            next: 0,
        }
    }

    /// The next text (the clone is part of both sides, as in the criterion bench).
    fn text(&mut self) -> String {
        self.next += 1;
        self.texts[self.next % self.texts.len()].clone()
    }

    fn run_new(&mut self) -> u64 {
        let json = self.text();
        self.new
            .append(&self.session, EventKind::Other, json, Millis(0))
            .expect("one JSON object")
    }

    fn run_previous(&mut self) -> u64 {
        let json = self.text();
        self.previous
            .append_checked(&self.session, BaselineKind::Other, json, 0)
            .expect("one JSON object")
    }

    fn run_old(&mut self) -> u64 {
        let json = self.text();
        self.old.append(&self.session, BaselineKind::Other, json, 0)
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median time per call of each of three versions, and medians of per-round ratios.
struct Paired {
    old: f64,
    previous: f64,
    new: f64,
    new_to_old: f64,
    new_to_previous: f64,
}

/// `rounds` rounds of `batch` calls of each version, in a rotating order.
fn paired(rounds: usize, batch: usize, run: &mut dyn FnMut(usize) -> usize) -> Paired {
    let mut sink = 0usize;
    let mut times: [Vec<f64>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    // Warm up every version.
    for _ in 0..batch {
        for v in 0..3 {
            sink = sink.wrapping_add(run(v));
        }
    }
    let (mut to_old, mut to_previous) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let mut this = [0f64; 3];
        for k in 0..3 {
            let v = (round + k) % 3;
            let t = Instant::now();
            for _ in 0..batch {
                sink = sink.wrapping_add(std::hint::black_box(run(v)));
            }
            this[v] = t.elapsed().as_secs_f64() / batch as f64;
        }
        for v in 0..3 {
            times[v].push(this[v]);
        }
        to_old.push(this[2] / this[0]);
        to_previous.push(this[2] / this[1]);
    }
    std::hint::black_box(sink);
    let [mut old, mut previous, mut new] = times;
    Paired {
        old: median(&mut old),
        previous: median(&mut previous),
        new: median(&mut new),
        new_to_old: median(&mut to_old),
        new_to_previous: median(&mut to_previous),
    }
}

fn show(seconds: f64) -> String {
    if seconds >= 1e-3 {
        format!("{:.3} ms", seconds * 1e3)
    } else if seconds >= 1e-6 {
        format!("{:.1} µs", seconds * 1e6)
    } else {
        format!("{:.1} ns", seconds * 1e9)
    }
}

fn one(case: &str, n: u64, calls: usize) {
    let mut sink = 0usize;
    match case {
        "window-new" | "window-previous" | "window-old" => {
            let mut w = Windows::new(n);
            for _ in 0..calls {
                sink += match case {
                    "window-new" => w.run_new(),
                    "window-previous" => w.run_previous(),
                    _ => w.run_old(),
                };
            }
        }
        "append-new" | "append-previous" | "append-old" => {
            let mut a = Appends::new();
            for _ in 0..calls {
                let seq = match case {
                    "append-new" => a.run_new(),
                    "append-previous" => a.run_previous(),
                    _ => a.run_old(),
                };
                sink = sink.wrapping_add(usize::try_from(seq).unwrap_or(0));
            }
        }
        other => panic!("unknown case {other}"),
    }
    println!("{case} n={n} calls={calls} ({sink})");
}

fn row_of(case: &str, p: &Paired) {
    println!(
        "| {case} | {} | {} | {} | {:.2}x | {:.2}x |",
        show(p.old),
        show(p.previous),
        show(p.new),
        p.new_to_old,
        p.new_to_previous
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("one") {
        let arg = |i: usize| args.get(i).expect("hot_paths one <case> <n> <calls>");
        one(
            arg(1),
            arg(2).parse().expect("n"),
            arg(3).parse().expect("calls"),
        );
        return;
    }
    println!("| case | baseline | previous | new | new / baseline | new / previous |");
    println!("|---|---:|---:|---:|---:|---:|");
    for n in [100u64, 1_000, 10_000] {
        let mut w = Windows::new(n);
        assert_eq!(w.run_new(), w.run_old());
        assert_eq!(w.run_new(), w.run_previous());
        let batch = (200_000 / n as usize).max(5);
        let p = paired(31, batch, &mut |v| match v {
            0 => w.run_old(),
            1 => w.run_previous(),
            _ => w.run_new(),
        });
        row_of(&format!("latest window, 100-row page, {n} live rows"), &p);
    }
    let mut a = Appends::new();
    let p = paired(31, 20_000, &mut |v| {
        let seq = match v {
            0 => a.run_old(),
            1 => a.run_previous(),
            _ => a.run_new(),
        };
        usize::try_from(seq).unwrap_or(0)
    });
    row_of("replay append, ~800-byte event, 1,000 kept", &p);
}
