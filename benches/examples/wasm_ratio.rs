//! The client timeline applying a 1,000-row latest window: the wasm build
//! (`timeline-wasm` for wasm32, run by Node.js, as a browser would) against the same
//! build natively, in one run. Both take the same JSON commands (`new`, `open`, then the
//! `window` answer with 1,000 history rows and a 50-row overlay) and give the same rows;
//! the time is per window applied (the JSON in, the reducer, the rows out), the median
//! of 7 rounds of 200.
//!
//! `cargo run --release -p benches --example wasm_ratio` (needs `node` and the wasm32
//! target; it builds `timeline-wasm` into `target/wasm-page`).

use std::process::Command;
use std::time::Instant;

use serde_json::json;

const ROUNDS: usize = 7;
const PER_ROUND: usize = 200;

fn commands() -> Vec<String> {
    let block = |i: usize, live: bool| {
        json!({
            "type": "agent-reply",
            "id": format!("{}-{i}", if live { "live" } else { "item" }),
            "timestamp": 1_000 + i,
            "sourceOrder": if live { json!([2, i]) } else { json!([0, 1, i, 0]) },
            "data": { "text": format!("a reply of ordinary length, number {i}") },
        })
    };
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
        json!({ "cmd": "new", "mode": "phone" }).to_string(),
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

fn native(commands: &[String]) -> (f64, usize) {
    let mut rounds = Vec::new();
    let mut rows = 0;
    for _ in 0..ROUNDS {
        let start = Instant::now();
        for _ in 0..PER_ROUND {
            let mut client = timeline_wasm::Client::new();
            let mut last = String::new();
            for c in commands {
                last = client.handle(c);
            }
            rows = last.matches(r#""origin":"#).count();
        }
        rounds.push(start.elapsed().as_secs_f64() * 1e6 / PER_ROUND as f64);
    }
    rounds.sort_by(f64::total_cmp);
    (rounds[ROUNDS / 2], rows)
}

const NODE: &str = r#"
const fs = require("fs");
const [wasmPath, commandsPath, rounds, perRound] = process.argv.slice(2);
const commands = JSON.parse(fs.readFileSync(commandsPath, "utf8"));
const bytes = fs.readFileSync(wasmPath);
const compiled = new WebAssembly.Module(bytes);
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
// One instance per round (its memory grows once); `new` resets the timeline in it.
const times = [];
let rows = 0;
for (let r = 0; r < Number(rounds); r++) {
  const ask = client();
  const start = performance.now();
  for (let i = 0; i < Number(perRound); i++) {
    let last = "";
    for (const c of commands) last = ask(c);
    rows = (last.match(/"origin":/g) || []).length;
  }
  times.push((performance.now() - start) * 1000 / Number(perRound));
}
times.sort((a, b) => a - b);
console.log(JSON.stringify({ micros: times[Math.floor(times.length / 2)], rows }));
"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let wasm = scripted_model::wasm::timeline_wasm_path()?;
    let commands = commands();
    let dir = std::env::temp_dir().join(format!("wasm-ratio-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("commands.json"), serde_json::to_string(&commands)?)?;
    std::fs::write(dir.join("run.cjs"), NODE)?;
    let (native_us, native_rows) = native(&commands);
    let out = Command::new("node")
        .arg(dir.join("run.cjs"))
        .arg(&wasm)
        .arg(dir.join("commands.json"))
        .arg(ROUNDS.to_string())
        .arg(PER_ROUND.to_string())
        .output()
        .map_err(|e| format!("node is needed (Node.js): {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned().into());
    }
    let result: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let wasm_us = result["micros"].as_f64().ok_or("no time")?;
    let wasm_rows = result["rows"].as_u64().ok_or("no rows")? as usize;
    assert_eq!(wasm_rows, native_rows, "both give the same rows");
    println!("a 1,000-row window with a 50-row overlay applied ({native_rows} rows shown), median of {ROUNDS} rounds of {PER_ROUND}:");
    println!(
        "native: {native_us:.0} µs; wasm (Node.js {}): {wasm_us:.0} µs; wasm / native: {:.2}x",
        String::from_utf8_lossy(&Command::new("node").arg("--version").output()?.stdout).trim(),
        wasm_us / native_us
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
