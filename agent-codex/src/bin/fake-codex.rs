//! `fake-codex`: a stand-in for `codex app-server` that replays a real app-server
//! recording (the format of `tests/data/anyagent-rs/codex-app-server/*.jsonl`), for the
//! tests of the process driver and the adapter.
//!
//! Honest replay: every line the server wrote is printed as recorded, with only the
//! recorder's `_t` field taken off and, in an answer, the request ID changed to the one
//! the client used (so a client that numbers its requests differently is answered).
//! Where the recording shows a line the client wrote (`_sent`), the fake reads client
//! lines until one of that kind comes (same method; an answer for an approval), then
//! goes on. Two equal `_sent` lines in a row (a recording that answered twice) wait for
//! one line.
//!
//! Environment:
//! - `FAKE_CODEX_RECORDING` (required): the recording to replay.
//! - `FAKE_CODEX_ROLLOUT`: a rollout file to append what Codex persists in legacy
//!   mode: `session_meta` when a thread starts, `user_message` with its `client_id`
//!   when a user message is echoed, `agent_message` when a reply completes.
//! - `FAKE_CODEX_DIE`: end with status 1 part way: `before-answer:<n>` when the n-th
//!   send (`turn/start` or `turn/steer`, from 1) arrives, before answering it;
//!   `after-record:<n>` the same, after appending that message to the rollout (Codex
//!   took it, then died); `after-line:<n>` right after printing the n-th server line.
//!
//! At the end of the recording, or when stdin closes, it exits with status 0.

#![allow(clippy::disallowed_methods)] // a test program: reads its environment and files

use std::collections::HashMap;
use std::io::{BufRead, Write};

use serde_json::Value;

enum Step {
    /// A line the server wrote, as recorded.
    Server(String),
    /// A line the client wrote.
    Client(Value),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Die {
    BeforeAnswer(u64),
    AfterRecord(u64),
    AfterLine(u64),
}

fn die_rule() -> Option<Die> {
    let text = std::env::var("FAKE_CODEX_DIE").ok()?;
    let (what, n) = text.split_once(':')?;
    let n: u64 = n.parse().ok()?;
    match what {
        "before-answer" => Some(Die::BeforeAnswer(n)),
        "after-record" => Some(Die::AfterRecord(n)),
        "after-line" => Some(Die::AfterLine(n)),
        _ => None,
    }
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` of `ms` since 1970.
fn iso(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970 (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        ms % 1000
    )
}

/// The recorded line without the recorder's trailing `, "_t": <seconds>`.
fn without_t(raw: &str) -> String {
    if let Some(at) = raw.rfind(", \"_t\": ") {
        let rest = &raw[at + 8..];
        if let Some(num) = rest.strip_suffix('}') {
            if num.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
                return format!("{}}}", &raw[..at]);
            }
        }
    }
    raw.to_owned()
}

/// An answer line with the client's request ID in place of the recorded one.
fn renumbered(line: &str, ids: &HashMap<i64, Value>) -> String {
    let Ok(v) = serde_json::from_str::<Value>(line) else {
        return line.to_owned();
    };
    let is_answer =
        v.get("method").is_none() && (v.get("result").is_some() || v.get("error").is_some());
    let Some(recorded) = v.get("id").and_then(Value::as_i64).filter(|_| is_answer) else {
        return line.to_owned();
    };
    let Some(actual) = ids.get(&recorded) else {
        return line.to_owned();
    };
    let (head, tail) = (
        format!("{{\"id\": {recorded}, "),
        format!(", \"id\": {recorded}}}"),
    );
    if let Some(rest) = line.strip_prefix(&head) {
        format!("{{\"id\": {actual}, {rest}")
    } else if let Some(rest) = line.strip_suffix(&tail) {
        format!("{rest}, \"id\": {actual}}}")
    } else {
        line.to_owned()
    }
}

struct Rollout {
    path: Option<std::path::PathBuf>,
    last_ms: u64,
}

impl Rollout {
    fn append(&self, line: Value) {
        let Some(path) = &self.path else {
            return;
        };
        let mut file = match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            Ok(f) => f,
            Err(e) => {
                eprintln!(
                    "fake-codex: cannot open the rollout {}: {e}",
                    path.display()
                );
                std::process::exit(2);
            }
        };
        if let Err(e) = writeln!(file, "{line}") {
            eprintln!("fake-codex: cannot write the rollout: {e}");
            std::process::exit(2);
        }
    }

    fn event(&self, payload: Value) {
        self.append(serde_json::json!({
            "timestamp": iso(self.last_ms),
            "type": "event_msg",
            "payload": payload,
        }));
    }

    /// What Codex persists for the server line `v`.
    fn persist(&mut self, v: &Value) {
        if let Some(ms) = v.get("emittedAtMs").and_then(Value::as_u64) {
            self.last_ms = ms;
        }
        let method = v.get("method").and_then(Value::as_str).unwrap_or_default();
        let params = v.get("params").cloned().unwrap_or(Value::Null);
        let item = &params["item"];
        match (method, item["type"].as_str()) {
            ("thread/started", _) => self.append(serde_json::json!({
                "timestamp": iso(self.last_ms),
                "type": "session_meta",
                "payload": {
                    "id": params["thread"]["id"],
                    "cli_version": params["thread"]["cliVersion"],
                    "originator": "fake-codex",
                },
            })),
            ("item/started", Some("userMessage")) => {
                let text: Vec<&str> = item["content"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|c| c["text"].as_str()).collect())
                    .unwrap_or_default();
                self.event(serde_json::json!({
                    "type": "user_message",
                    "message": text.join("\n"),
                    "client_id": item["clientId"],
                }));
            }
            ("item/completed", Some("agentMessage")) => self.event(serde_json::json!({
                "type": "agent_message",
                "message": item["text"],
                "phase": item["phase"],
            })),
            _ => {}
        }
    }
}

fn main() {
    let Ok(recording) = std::env::var("FAKE_CODEX_RECORDING") else {
        eprintln!("fake-codex: set FAKE_CODEX_RECORDING to a recording");
        std::process::exit(2);
    };
    let text = match std::fs::read_to_string(&recording) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("fake-codex: reading {recording}: {e}");
            std::process::exit(2);
        }
    };
    let mut steps = Vec::new();
    for raw in text.lines().filter(|l| !l.trim().is_empty()) {
        let Ok(v) = serde_json::from_str::<Value>(raw) else {
            eprintln!("fake-codex: a recorded line is not JSON: {raw}");
            std::process::exit(2);
        };
        if v.get("_meta").is_some() || v.get("_note").is_some() {
            continue;
        }
        match v.get("_sent") {
            Some(sent) => {
                if let Some(Step::Client(prev)) = steps.last() {
                    if prev == sent {
                        continue;
                    }
                }
                steps.push(Step::Client(sent.clone()));
            }
            None => steps.push(Step::Server(raw.to_owned())),
        }
    }

    let die = die_rule();
    let mut rollout = Rollout {
        path: std::env::var_os("FAKE_CODEX_ROLLOUT").map(Into::into),
        last_ms: 0,
    };
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut ids: HashMap<i64, Value> = HashMap::new();
    let mut printed = 0u64;
    let mut sends = 0u64;
    for step in steps {
        match step {
            Step::Server(raw) => {
                let line = renumbered(&without_t(&raw), &ids);
                if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
                    // The client is gone.
                    std::process::exit(0);
                }
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    rollout.persist(&v);
                }
                printed += 1;
                if die == Some(Die::AfterLine(printed)) {
                    std::process::exit(1);
                }
            }
            Step::Client(expected) => {
                let method = expected.get("method").and_then(Value::as_str);
                let recorded_id = expected.get("id").and_then(Value::as_i64);
                loop {
                    let mut line = String::new();
                    match input.read_line(&mut line) {
                        Ok(0) | Err(_) => std::process::exit(0),
                        Ok(_) => {}
                    }
                    let Ok(got) = serde_json::from_str::<Value>(&line) else {
                        continue;
                    };
                    let got_method = got.get("method").and_then(Value::as_str);
                    let matches = match method {
                        Some(m) => {
                            got_method == Some(m)
                                && got.get("id").is_some() == recorded_id.is_some()
                        }
                        None => {
                            got_method.is_none()
                                && (got.get("result").is_some() || got.get("error").is_some())
                        }
                    };
                    if !matches {
                        continue;
                    }
                    if let (Some(m), Some(rec)) = (method, recorded_id) {
                        ids.insert(rec, got["id"].clone());
                        if m == "turn/start" || m == "turn/steer" {
                            sends += 1;
                            match die {
                                Some(Die::BeforeAnswer(n)) if n == sends => std::process::exit(1),
                                Some(Die::AfterRecord(n)) if n == sends => {
                                    let text: Vec<&str> = got["params"]["input"]
                                        .as_array()
                                        .map(|a| {
                                            a.iter().filter_map(|i| i["text"].as_str()).collect()
                                        })
                                        .unwrap_or_default();
                                    rollout.event(serde_json::json!({
                                        "type": "user_message",
                                        "message": text.join("\n"),
                                        "client_id": got["params"]["clientUserMessageId"],
                                    }));
                                    std::process::exit(1);
                                }
                                _ => {}
                            }
                        }
                    }
                    break;
                }
            }
        }
    }
}
