//! Snapshots of the rows each real recording projects to, in the row wording, one line
//! per row in canonical order (TL-04): the app-server recordings through the codec and
//! the live projection (the rows as they stand at the end), the rollouts through the
//! rollout history source (every page, from the tail back to the start).
//!
//! A line: `kind | title | subtitle | signal | status`, `-` for what a row does not
//! have. A user, reply, reasoning or system row shows the first line of its text as its
//! title. Snapshots live in `tests/snapshots/` and are never written by CI
//! (`INSTA_UPDATE=no`).

#![allow(clippy::disallowed_methods)] // reads the real data

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use agent_codex::codec::{Codec, Incoming};
use agent_codex::edge::RolloutSource;
use agent_codex::project::{Projected, Projector};
use agent_codex::protocol::RequestId;
use overlay_core::source::HistorySource;
use serde_json::Value;
use timeline_core::block::Block;
use timeline_core::key::{BlockKey, BlockType};
use timeline_core::rows::{first_line_chars, ActivityRow, ApprovalResult};
use timeline_core::time::Millis;

fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(rel)
}

/// A title on one line: its line breaks shown as `⏎`, at most 120 characters.
fn shown(title: &str) -> String {
    let flat = title.trim().replace("\r\n", "\n").replace('\n', " ⏎ ");
    first_line_chars(&flat, 120)
}

fn text_title(b: &Block) -> String {
    let text = b.data["text"].as_str().unwrap_or_default();
    let line = first_line_chars(text.trim(), 100);
    if line.is_empty() {
        "(empty)".to_owned()
    } else {
        line
    }
}

/// One row in the row wording.
fn row_line(b: &Block) -> String {
    let dash = |s: Option<&str>| s.filter(|s| !s.is_empty()).unwrap_or("-").to_owned();
    match b.block_type {
        BlockType::Activity => {
            let row: ActivityRow = serde_json::from_value(b.data.clone()).expect("an activity row");
            let status = serde_json::to_value(row.status).expect("status");
            let card = row
                .approval
                .as_ref()
                .map(|a| {
                    format!(
                        " [card {}]",
                        serde_json::to_value(a.status)
                            .expect("card status")
                            .as_str()
                            .unwrap_or_default()
                    )
                })
                .unwrap_or_default();
            format!(
                "activity  | {} | {} | {} | {}{card}",
                shown(&row.title),
                dash(row.subtitle.as_deref()),
                dash(row.display.signal.as_deref()),
                status.as_str().unwrap_or_default(),
            )
        }
        BlockType::User => {
            let op = b
                .operation_id
                .as_ref()
                .map(|o| format!(" [operation {}]", o.as_str()))
                .unwrap_or_default();
            format!("user      | {} | - | - | -{op}", text_title(b))
        }
        BlockType::AgentReply => format!("reply     | {} | - | - | -", text_title(b)),
        BlockType::Thinking => match b.data["label"].as_str() {
            Some(label) => format!("status    | {label} | - | - | -"),
            None => format!("reasoning | {} | - | - | -", text_title(b)),
        },
        BlockType::System => format!("system    | {} | - | - | -", text_title(b)),
    }
}

fn lines(mut rows: Vec<Block>) -> String {
    rows.sort_by_cached_key(Block::order_key);
    rows.iter().map(row_line).collect::<Vec<_>>().join("\n") + "\n"
}

/// The rows an app-server recording stands at after its last line: every server line
/// through the codec and the projection, the recorded approval answers as decisions.
fn live_rows(rel: &str) -> String {
    let bytes = std::fs::read(data(rel)).expect("read the recording");
    let mut codec = Codec::new();
    let mut projector = Projector::new("session-1", None, 1);
    let mut rows: BTreeMap<BlockKey, Block> = BTreeMap::new();
    // The host's clock: the server's latest `emittedAtMs`.
    let mut now = Millis(0);
    for line in bytes.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let v: Value = serde_json::from_slice(line).expect("JSON");
        if let Some(ms) = v.get("emittedAtMs").and_then(Value::as_u64) {
            now = Millis(ms);
        }
        if v.get("_meta").is_some() || v.get("_note").is_some() {
            continue;
        }
        let out = if let Some(sent) = v.get("_sent") {
            if sent.get("method").is_some() {
                // Client requests: typed by the codec only to match their answers.
                if let Some(id) = sent["id"].as_u64() {
                    let method = sent["method"].as_str().expect("method");
                    register(&mut codec, method, id);
                }
                continue;
            }
            let id = RequestId::from_value(&sent["id"]).expect("id");
            let result = match sent["result"]["decision"].as_str() {
                Some("accept") => ApprovalResult::Accepted,
                Some("decline") => ApprovalResult::Declined,
                other => panic!("{other:?}"),
            };
            projector.decided(&id, result, now)
        } else {
            match codec.handle_line(line).expect("a server line") {
                Incoming::Notification(n) => projector.handle(&n, now),
                Incoming::Request { request, .. } => projector.handle_request(&request, now),
                _ => Vec::new(),
            }
        };
        for p in out {
            if let Projected::Row(s) = p {
                rows.insert(s.block.key(), s.block);
            }
        }
    }
    lines(rows.into_values().collect())
}

/// Makes the codec wait for the answer to a recorded request (the answer's shape is
/// typed by its method).
fn register(codec: &mut Codec, method: &str, id: u64) {
    use agent_codex::protocol::ClientRequest;
    let request = match method {
        "initialize" => ClientRequest::Initialize {
            name: "n".into(),
            version: "v".into(),
        },
        "thread/start" => ClientRequest::ThreadStart {
            cwd: None,
            approval_policy: None,
            sandbox: None,
            model: None,
            model_provider: None,
        },
        "turn/start" => ClientRequest::TurnStart {
            thread_id: "t".into(),
            client_user_message_id: "c".into(),
            input: vec![],
        },
        "turn/steer" => ClientRequest::TurnSteer {
            thread_id: "t".into(),
            expected_turn_id: "u".into(),
            client_user_message_id: "c".into(),
            input: vec![],
        },
        other => panic!("{other}"),
    };
    let (ours, _) = codec.request(&request);
    assert_eq!(ours, id, "the recording numbers its requests from 1");
}

/// Every row of a rollout, read page by page from its tail.
fn history_rows(path: &Path) -> String {
    let mut source = RolloutSource::open(path, 1).expect("open the rollout");
    let mut rows = Vec::new();
    let mut before = None;
    loop {
        let page = source.read(before.as_ref(), 25).expect("a page");
        rows.extend(page.items.iter().flat_map(|i| i.blocks.clone()));
        before = match (page.more, page.items.last()) {
            (true, Some(last)) => Some(last.position.clone()),
            _ => break,
        };
    }
    lines(rows)
}

// RW-01, RW-06, TL-03: the live rows of a turn with a command and two approvals.
#[test]
fn rows_of_02_approvals_and_tools() {
    insta::assert_snapshot!(
        "live_02_approvals_and_tools",
        live_rows("anyagent-rs/codex-app-server/02-approvals-and-tools.jsonl")
    );
}

// RW-01, TL-03: steered messages land in the running turn.
#[test]
fn rows_of_03_steer_and_queue() {
    insta::assert_snapshot!(
        "live_03_steer_and_queue",
        live_rows("anyagent-rs/codex-app-server/03-steer-and-queue.jsonl")
    );
}

// RW-01, TL-05: a real Codex 0.58.0 rollout as history rows.
#[test]
fn rows_of_the_0_58_rollout() {
    insta::assert_snapshot!(
        "history_codex_0_58",
        history_rows(&data(
            "codex-session-view/rollout-2025-11-17T15-30-28-019a93b9-f380-7600-98ff-940e6b99603c.jsonl"
        ))
    );
}

// RW-01, TL-05: the 0.146 schema-coverage rollout as history rows.
#[test]
fn rows_of_the_0_146_coverage_rollout() {
    insta::assert_snapshot!(
        "history_codex_0_146_coverage",
        history_rows(&data("agent-sessions/codex-small.jsonl"))
    );
}
