//! Vectors made by the simulator: one phone of a seed's run, every input its timeline
//! and its conversation were given, as `timeline-wasm` commands, checked in beside the
//! hand-written vectors (`timeline-wasm/vectors/sim-seed-*.json`). The commands replayed
//! through the wasm client's JSON interface end on the rows the simulator's phone showed,
//! so a client in another language replaying them meets what a whole faulty run gave
//! one phone: relay losses, reloads, restarts, replays.
//!
//! `UPDATE_VECTORS=1 cargo test -p sim --test vectors` rewrites the file.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// The test writes and reads the checked-in vector; the simulator itself does no IO.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde_json::{json, Value};
use sim::{Config, Recording};

/// The seed of the checked-in vector.
const SEED: u64 = 7;

fn vector_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("timeline-wasm")
        .join("vectors")
        .join(format!("sim-seed-{SEED}.json"))
}

/// The seed's run with client `c` recorded.
fn recorded(c: usize) -> (sim::Outcome, Recording) {
    let mut cfg = Config::new(SEED);
    cfg.trace = true;
    cfg.record = Some(c);
    let outcome = sim::run(cfg);
    assert!(outcome.violation.is_none(), "{}", outcome.report());
    let recording = outcome.recording.clone().expect("a recording");
    (outcome, recording)
}

fn state(answer: &Value) -> Value {
    match answer.get("loadState") {
        Some(s) => json!({ "loadState": s }),
        None => json!({
            "running": answer["running"], "truncated": answer["truncated"],
            "reclaimed": answer["reclaimed"], "rebuilding": answer["rebuilding"],
        }),
    }
}

fn view_of(client: &mut timeline_wasm::Client) -> Vec<String> {
    let answer: Value = serde_json::from_str(&client.handle(r#"{"cmd":"view"}"#)).unwrap();
    answer["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| match r["origin"].as_str().unwrap() {
            "pending" => format!("pending::{}", r["text"].as_str().unwrap()),
            origin => format!("{origin}:{}:{}", r["seq"], r["text"].as_str().unwrap()),
        })
        .collect()
}

// TL-02, TL-03, TL-06, TL-07, TL-08, TL-13, RB-03, RB-04: a phone's whole run, replayed
// through the wasm client, ends on the rows the simulator's phone showed.
#[test]
fn a_seeds_phone_replays_through_the_wasm_client_to_the_same_rows() {
    // The first phone of the seed (recording changes nothing in the run).
    let plain = {
        let mut cfg = Config::new(SEED);
        cfg.trace = true;
        sim::run(cfg)
    };
    let (outcome, recording) = (0..8)
        .map(recorded)
        .find(|(_, r)| r.commands[0]["mode"] == "phone")
        .expect("a phone among the seed's clients");
    assert_eq!(outcome.digest, plain.digest, "recording changed the run");
    for command in &recording.commands {
        assert!(
            command.get("unrecordable").is_none(),
            "seed {SEED} gave its phone an input with no JSON form: {command}"
        );
    }

    let mut client = timeline_wasm::Client::new();
    let mut steps = Vec::new();
    let mut kinds = BTreeSet::new();
    for command in &recording.commands {
        let answer: Value = serde_json::from_str(&client.handle(&command.to_string())).unwrap();
        assert!(answer.get("error").is_none(), "{command}: {answer}");
        kinds.insert(command["cmd"].as_str().unwrap().to_owned());
        steps.push(json!({
            "command": command,
            "outcome": answer["outcome"],
            "state": state(&answer),
            "effects": answer["effects"],
            "rows": answer.get("rows").cloned().unwrap_or(Value::Null),
            "changes": answer.get("changes").cloned().unwrap_or(Value::Null),
        }));
    }
    let rows: Value =
        serde_json::from_str::<Value>(&client.handle(r#"{"cmd":"rows"}"#)).unwrap()["rows"].clone();
    assert_eq!(
        rows,
        Value::Array(recording.rows.clone()),
        "the timeline's rows"
    );
    assert_eq!(view_of(&mut client), recording.view, "the conversation");
    // The run gave the phone the inputs that make it a vector worth replaying.
    for kind in ["open", "window", "live", "pending", "replayChunk"] {
        assert!(kinds.contains(kind), "no {kind} in the run: {kinds:?}");
    }

    let vector = json!({
        "name": format!("sim-seed-{SEED}"),
        "rules": ["TL-02", "TL-03", "TL-06", "TL-07", "TL-08", "TL-13", "RB-03", "RB-04"],
        "what": format!(
            "Every input the phone (client {}) of simulator seed {SEED} was given in its run \
             (`sim --seed {SEED}`), faults included; the rows after each are the wasm \
             client's, and the last are the rows the simulator's phone showed.",
            recording.client
        ),
        "steps": steps,
    });
    let path = vector_path();
    if std::env::var_os("UPDATE_VECTORS").is_some() {
        std::fs::write(&path, serde_json::to_string_pretty(&vector).unwrap() + "\n").unwrap();
    }
    let held: Value = serde_json::from_str(
        &std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_VECTORS=1 writes it)", path.display())),
    )
    .unwrap();
    assert!(
        held == vector,
        "{} differs from what the seed gives (UPDATE_VECTORS=1 rewrites it)",
        path.display()
    );
}
