//! The client timeline behind its JSON call: the wasm build (`timeline-wasm` for
//! wasm32, run by Node.js, as a browser would) against the same build natively, in one
//! run, on two paths:
//!
//! - a latest window of 1,000 history rows and a 50-row overlay applied (`new`, `open`,
//!   then the `window` answer; the rows out), per window;
//! - one streamed token on that timeline (a `patch` appending text to the newest live
//!   row), per token, with every row in the answer (`rows`) and with the changed rows
//!   only (`changes: true`), and the bytes each answer carries.
//!
//! The median of 7 rounds of 200.
//!
//! `cargo run --release -p benches --example wasm_ratio` (needs `node` and the wasm32
//! target; it builds `timeline-wasm` into `target/wasm-page`).

use std::process::Command;
use std::time::Instant;

use serde_json::{json, Value};

const ROUNDS: usize = 7;
const PER_ROUND: usize = 200;

/// One case: commands run once per round, then `PER_ROUND` iterations (each a list of
/// commands, cycled), timed.
struct Case {
    setup: Vec<String>,
    iterations: Vec<Vec<String>>,
}

fn block(i: usize, live: bool) -> Value {
    json!({
        "type": "agent-reply",
        "id": format!("{}-{i}", if live { "live" } else { "item" }),
        "timestamp": 1_000 + i,
        "sourceOrder": if live { json!([2, i]) } else { json!([0, 1, i, 0]) },
        "data": { "text": format!("a reply of ordinary length, number {i}") },
    })
}

fn opened(changes: bool) -> Vec<String> {
    let window = json!({
        "blocks": (0..1_000).map(|i| block(i, false)).collect::<Vec<_>>(),
        "oldestCursor": "cursor-1",
        "boundaryToken": "token-1",
        "windowRevision": 1,
        "liveOverlay": {
            "settlementEpoch": 1, "revision": 2,
            "blocks": (0..50).map(|i| block(i, true)).collect::<Vec<_>>(),
        },
    });
    vec![
        json!({ "cmd": "new", "mode": "phone", "changes": changes }).to_string(),
        json!({ "cmd": "open", "target": "s1", "now": 1 }).to_string(),
        json!({
            "cmd": "window",
            "tag": { "target": "s1", "generation": 1, "request": 1 },
            "answer": { "ok": window },
            "now": 2,
        })
        .to_string(),
    ]
}

fn window_case() -> Case {
    Case {
        setup: Vec::new(),
        iterations: vec![opened(false)],
    }
}

fn token_case(changes: bool) -> Case {
    let iterations = (0..PER_ROUND as u64)
        .map(|i| {
            vec![json!({ "cmd": "patch", "target": "s1", "now": 3 + i, "patch": {
                "settlementEpoch": 1, "baseRevision": 2 + i, "revision": 3 + i,
                "upserts": [], "removals": [],
                "appends": [{ "key": { "type": "agent-reply", "id": "live-49" }, "text": " token" }],
            } })
            .to_string()]
        })
        .collect();
    Case {
        setup: opened(changes),
        iterations,
    }
}

/// Median µs per iteration, the last answer's bytes, and the rows it shows.
fn native(case: &Case) -> (f64, usize, usize) {
    let mut rounds = Vec::new();
    let (mut bytes, mut rows) = (0, 0);
    for _ in 0..ROUNDS {
        let mut client = timeline_wasm::Client::new();
        for c in &case.setup {
            client.handle(c);
        }
        let start = Instant::now();
        let mut last = String::new();
        for i in 0..PER_ROUND {
            for c in &case.iterations[i % case.iterations.len()] {
                last = client.handle(c);
            }
        }
        rounds.push(start.elapsed().as_secs_f64() * 1e6 / PER_ROUND as f64);
        bytes = last.len();
        let all: Value =
            serde_json::from_str(&client.handle(r#"{"cmd":"rows"}"#)).unwrap_or_default();
        rows = all["rows"].as_array().map_or(0, Vec::len);
    }
    rounds.sort_by(f64::total_cmp);
    (rounds[ROUNDS / 2], bytes, rows)
}

const NODE: &str = r#"
const fs = require("fs");
const [wasmPath, casePath, rounds, perRound] = process.argv.slice(2);
const c = JSON.parse(fs.readFileSync(casePath, "utf8"));
const compiled = new WebAssembly.Module(fs.readFileSync(wasmPath));
const { performance } = require("perf_hooks");
function client() {
  const x = new WebAssembly.Instance(compiled, {}).exports;
  return (text) => {
    const b = new TextEncoder().encode(text);
    const at = x.input(b.length);
    new Uint8Array(x.memory.buffer, at, b.length).set(b);
    const len = x.call();
    const out = x.output();
    return new TextDecoder().decode(new Uint8Array(x.memory.buffer, out, len));
  };
}
// One instance per round; the time is the call and the answer's text, as natively.
const times = [];
let bytes = 0, rows = 0;
for (let r = 0; r < Number(rounds); r++) {
  const ask = client();
  for (const s of c.setup) ask(s);
  const start = performance.now();
  let last = "";
  for (let i = 0; i < Number(perRound); i++) {
    for (const s of c.iterations[i % c.iterations.length]) last = ask(s);
  }
  times.push((performance.now() - start) * 1000 / Number(perRound));
  bytes = new TextEncoder().encode(last).length;
  rows = JSON.parse(ask('{"cmd":"rows"}')).rows.length;
}
times.sort((a, b) => a - b);
console.log(JSON.stringify({ micros: times[Math.floor(times.length / 2)], bytes, rows }));
"#;

fn wasm(
    wasm: &std::path::Path,
    dir: &std::path::Path,
    case: &Case,
) -> Result<(f64, usize, usize), Box<dyn std::error::Error>> {
    let file = dir.join("case.json");
    std::fs::write(
        &file,
        serde_json::to_string(&json!({ "setup": case.setup, "iterations": case.iterations }))?,
    )?;
    let out = Command::new("node")
        .arg(dir.join("run.cjs"))
        .arg(wasm)
        .arg(&file)
        .arg(ROUNDS.to_string())
        .arg(PER_ROUND.to_string())
        .output()
        .map_err(|e| format!("node is needed (Node.js): {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned().into());
    }
    let result: Value = serde_json::from_slice(&out.stdout)?;
    let micros = result["micros"].as_f64().ok_or("no time")?;
    let bytes = result["bytes"].as_u64().ok_or("no bytes")? as usize;
    let rows = result["rows"].as_u64().ok_or("no rows")? as usize;
    Ok((micros, bytes, rows))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let wasm_path = scripted_model::wasm::timeline_wasm_path()?;
    let dir = std::env::temp_dir().join(format!("wasm-ratio-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("run.cjs"), NODE)?;
    let node = Command::new("node").arg("--version").output()?.stdout;
    println!(
        "timeline-wasm, native and wasm (Node.js {}), median of {ROUNDS} rounds of {PER_ROUND}:",
        String::from_utf8_lossy(&node).trim()
    );
    println!("| path | rows shown | answer bytes | native µs | wasm µs | wasm / native |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, case) in [
        ("a 1,000-row window with a 50-row overlay", window_case()),
        ("a streamed token, every row (`rows`)", token_case(false)),
        (
            "a streamed token, changed rows (`changes`)",
            token_case(true),
        ),
    ] {
        let (n_us, n_bytes, n_rows) = native(&case);
        let (w_us, w_bytes, w_rows) = wasm(&wasm_path, &dir, &case)?;
        assert_eq!(n_rows, w_rows, "both show the same rows");
        assert_eq!(n_bytes, w_bytes, "both answer the same");
        println!(
            "| {name} | {n_rows} | {n_bytes} | {n_us:.1} | {w_us:.1} | {:.2}x |",
            w_us / n_us
        );
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
