//! `fake-claude`: a stand-in for `claude -p --input-format stream-json --output-format
//! stream-json --replay-user-messages`, for the tests of the process driver. It prints
//! the lines of a real recording, byte for byte, and can be told to die mid-turn.
//!
//! For every user line read from stdin it:
//! 1. exits at once with `--die-before-transcript` (Claude never took the message);
//! 2. appends a user entry with the message's UUID to `--transcript PATH`, as Claude
//!    writes the prompt to its transcript before it calls the model;
//! 3. prints the lines of `--recording PATH`. With `--echo`, the replayed echo of the
//!    message (the line read, with `"isReplay":true`, as `--replay-user-messages` does)
//!    follows the recording's `system/init` line. A recording the tests wrote may
//!    carry `{{uuid}}`, replaced by the message's UUID; a real recording has none, so
//!    its lines are printed as recorded.
//!
//! Faults: `--die-after N` exits with code 137 before line N of the turn (0-based);
//! `--pause-before N` waits before line N for one more stdin line (a user line is
//! echoed and written to the transcript; an `interrupt` control request ends the
//! process); `--await-control` waits after a `control_request` line for the
//! `control_response` naming it and appends that answer to `--log PATH`; `--hang`
//! prints nothing after the echo until stdin closes. Unknown flags (Claude's own) are
//! ignored; with `--log PATH`, the arguments it was started with are the log's first
//! line (`{"argv":[...]}`).

#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // a test program: files and stdio
#![allow(clippy::unwrap_used)] // a failure of the test double is a test failure

use std::io::{BufRead, Write};

#[derive(Default)]
struct Options {
    recording: Option<String>,
    transcript: Option<String>,
    log: Option<String>,
    echo: bool,
    die_after: Option<usize>,
    die_before_transcript: bool,
    pause_before: Option<usize>,
    await_control: bool,
    hang: bool,
}

fn options() -> Options {
    let mut o = Options::default();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--recording" => o.recording = args.next(),
            "--transcript" => o.transcript = args.next(),
            "--log" => o.log = args.next(),
            "--echo" => o.echo = true,
            "--die-after" => o.die_after = args.next().and_then(|n| n.parse().ok()),
            "--die-before-transcript" => o.die_before_transcript = true,
            "--pause-before" => o.pause_before = args.next().and_then(|n| n.parse().ok()),
            "--await-control" => o.await_control = true,
            "--hang" => o.hang = true,
            _ => {}
        }
    }
    o
}

fn print(line: &str) {
    let mut out = std::io::stdout().lock();
    out.write_all(line.as_bytes()).unwrap();
    out.write_all(b"\n").unwrap();
    out.flush().unwrap();
}

fn append(path: &str, line: &str) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    f.write_all(line.as_bytes()).unwrap();
    f.write_all(b"\n").unwrap();
}

struct Fake {
    o: Options,
    recording: Vec<String>,
    session: String,
    input: std::io::Lines<std::io::StdinLock<'static>>,
}

impl Fake {
    /// Takes a user line: the transcript entry, then (with `--echo`) its echo once
    /// `init` is out. Returns the message's UUID and the echo line.
    fn take(&self, line: &serde_json::Value) -> (String, String) {
        if self.o.die_before_transcript {
            std::process::exit(137);
        }
        let uuid = line["uuid"].as_str().unwrap_or_default().to_owned();
        if let Some(path) = &self.o.transcript {
            let entry = serde_json::json!({
                "type": "user",
                "uuid": uuid,
                "parentUuid": null,
                "isSidechain": false,
                "sessionId": self.session,
                "timestamp": "2026-08-23T05:53:55.614Z",
                "message": line["message"],
            });
            append(path, &entry.to_string());
        }
        let mut echo = line.clone();
        echo["isReplay"] = true.into();
        (uuid, echo.to_string())
    }

    fn next_input(&mut self) -> Option<serde_json::Value> {
        let l = self.input.next()?.ok()?;
        serde_json::from_str(&l).ok()
    }

    fn turn(&mut self, first: &serde_json::Value) {
        let (uuid, echo) = self.take(first);
        let lines = self.recording.clone();
        let mut echoed = false;
        for (i, line) in lines.iter().enumerate() {
            if self.o.die_after == Some(i) {
                std::process::exit(137);
            }
            if self.o.pause_before == Some(i) {
                match self.next_input() {
                    Some(v) if v["type"] == "user" => {
                        let (_, steer_echo) = self.take(&v);
                        if self.o.echo {
                            print(&steer_echo);
                        }
                    }
                    Some(v) if v["request"]["subtype"] == "interrupt" => std::process::exit(0),
                    _ => std::process::exit(0),
                }
            }
            print(&line.replace("{{uuid}}", &uuid));
            let v: serde_json::Value = serde_json::from_str(line).unwrap_or_default();
            if v["type"] == "system" && v["subtype"] == "init" && self.o.echo && !echoed {
                print(&echo);
                echoed = true;
                if self.o.hang {
                    while self.next_input().is_some() {}
                    std::process::exit(0);
                }
            }
            if v["type"] == "control_request" && self.o.await_control {
                let id = v["request_id"].clone();
                while let Some(answer) = self.next_input() {
                    if answer["type"] == "control_response"
                        && answer["response"]["request_id"] == id
                    {
                        if let Some(log) = &self.o.log {
                            append(log, &answer.to_string());
                        }
                        break;
                    }
                }
            }
        }
    }
}

fn main() {
    let o = options();
    if let Some(log) = &o.log {
        let argv: Vec<String> = std::env::args().skip(1).collect();
        append(log, &serde_json::json!({ "argv": argv }).to_string());
    }
    let recording: Vec<String> = match &o.recording {
        Some(p) => std::fs::read_to_string(p)
            .unwrap()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_owned)
            .collect(),
        None => Vec::new(),
    };
    let session = recording
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["subtype"] == "init")
        .and_then(|v| v["session_id"].as_str().map(str::to_owned))
        .unwrap_or_default();
    let mut fake = Fake {
        o,
        recording,
        session,
        input: std::io::stdin().lock().lines(),
    };
    while let Some(v) = fake.next_input() {
        if v["type"] == "user" {
            fake.turn(&v);
        }
    }
}
