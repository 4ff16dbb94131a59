//! Every Codex file of the shared real data, read end to end: the app-server wire
//! recordings replayed through the codec, the projection and the delivery proofs, and
//! the rollouts through the rollout reader. A census per file asserts how many lines of
//! each kind it has and that every line is parsed or deliberately skipped.
//!
//! The files are read from the copies in `tests/data/` (licences beside them), or else
//! from the shared directory `../shared/real-data` beside the workspace; when neither
//! exists the tests fail and say so.

#![allow(clippy::disallowed_methods)] // a test of real files reads them

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use agent_codex::codec::{AnswerError, Codec, Incoming, Response};
use agent_codex::diag::Skip;
use agent_codex::project::{Projected, Projector};
use agent_codex::proof::{self, DeliveryWatch, Verdict};
use agent_codex::protocol::{
    ClientRequest, Method, RequestId, ServerNotification, ThreadItem, UserInput,
};
use agent_codex::rollout::{EventMsg, RolloutReader, RolloutRecord, TurnItem};
use agent_codex::send::{self, SendMethod};
use outbox_core::adapter::{HistoryRead, SendResult};
use overlay_core::store::RowClass;
use proptest::prelude::*;
use serde_json::Value;
use timeline_core::history::{pack, unpack_records, SessionEvent};
use timeline_core::key::{BlockKey, BlockType, OperationId};
use timeline_core::rows::{ApprovalResult, Decision};
use timeline_core::time::Millis;

const APP_SERVER: [&str; 2] = [
    "anyagent-rs/codex-app-server/02-approvals-and-tools.jsonl",
    "anyagent-rs/codex-app-server/03-steer-and-queue.jsonl",
];
const ROLLOUTS: [&str; 2] = [
    "codex-session-view/rollout-2025-11-17T15-30-28-019a93b9-f380-7600-98ff-940e6b99603c.jsonl",
    "agent-sessions/codex-small.jsonl",
];

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn shared_dir() -> PathBuf {
    manifest()
        .join("..")
        .join("..")
        .join("shared")
        .join("real-data")
}

fn data_file(rel: &str) -> PathBuf {
    let copy = manifest().join("tests").join("data").join(rel);
    if copy.is_file() {
        return copy;
    }
    let shared = shared_dir().join(rel);
    assert!(
        shared.is_file(),
        "the real data is absent: neither {} nor {} exists",
        copy.display(),
        shared.display()
    );
    shared
}

fn read(rel: &str) -> Vec<u8> {
    std::fs::read(data_file(rel)).expect("read a real-data file")
}

/// Every Codex file of the shared directory is one this test reads, and its copy here
/// is byte for byte the same. Without the shared directory, the copies are checked.
#[test]
fn every_shared_codex_file_is_covered_and_copied_verbatim() {
    let shared = shared_dir();
    let expected: BTreeSet<String> = APP_SERVER
        .iter()
        .chain(ROLLOUTS.iter())
        .map(|s| s.to_string())
        .collect();
    if !shared.is_dir() {
        eprintln!(
            "{} is absent: checking the copies in tests/data only",
            shared.display()
        );
        for rel in &expected {
            assert!(
                manifest().join("tests/data").join(rel).is_file(),
                "{rel}: no copy and no shared real data"
            );
        }
        return;
    }
    let mut found = BTreeSet::new();
    for dir in [
        "anyagent-rs/codex-app-server",
        "codex-session-view",
        "agent-sessions",
    ] {
        // Another tree of shared data may lack a folder: nothing to compare there.
        let Ok(entries) = std::fs::read_dir(shared.join(dir)) else {
            continue;
        };
        for e in entries {
            let name = e.expect("entry").file_name().to_string_lossy().into_owned();
            let codex = dir != "agent-sessions" || name.starts_with("codex");
            if codex && (name.ends_with(".jsonl") || name.ends_with(".jsonl.zst")) {
                found.insert(format!("{dir}/{name}"));
            }
        }
    }
    for rel in found.difference(&expected) {
        // A file the census does not know: read end to end (lines typed or counted,
        // never a panic), a compressed one decompressed.
        let (batch, _) =
            agent_codex::edge::read_rollout_file(&shared.join(rel)).expect("read the shared file");
        let bytes = if rel.ends_with(".zst") {
            zstd::stream::decode_all(
                std::fs::File::open(shared.join(rel)).expect("open the shared file"),
            )
            .expect("decompress the shared file")
        } else {
            std::fs::read(shared.join(rel)).expect("read the shared file")
        };
        let mut codec = Codec::new();
        let refused = bytes
            .split(|b| *b == b'\n')
            .filter(|line| codec.handle_line(line).is_err())
            .count();
        eprintln!(
            "{rel}: not in the census; {} rollout lines, {refused} lines the codec refused",
            batch.lines.len()
        );
    }
    let expected: BTreeSet<String> = expected.intersection(&found).cloned().collect();
    for rel in &expected {
        let copy = manifest().join("tests/data").join(rel);
        let original = std::fs::read(shared.join(rel)).expect("read the shared file");
        assert_eq!(
            std::fs::read(&copy).expect("read the copy"),
            original,
            "{rel}: the copy differs from the shared file"
        );
    }
}

// ----- app-server recordings ------------------------------------------------------------

/// The request a recorded `_sent` line holds, typed.
fn typed_request(method: &str, p: &Value) -> ClientRequest {
    let s = |f: &str| p[f].as_str().expect(f).to_owned();
    let input = || {
        p["input"]
            .as_array()
            .expect("input")
            .iter()
            .map(|i| UserInput::Text(i["text"].as_str().expect("text").to_owned()))
            .collect()
    };
    match method {
        "initialize" => ClientRequest::Initialize {
            name: p["clientInfo"]["name"].as_str().expect("name").into(),
            version: p["clientInfo"]["version"].as_str().expect("version").into(),
        },
        "thread/start" => ClientRequest::ThreadStart {
            cwd: p["cwd"].as_str().map(str::to_owned),
            approval_policy: p["approvalPolicy"].as_str().map(str::to_owned),
            sandbox: p["sandbox"].as_str().map(str::to_owned),
            model: p["model"].as_str().map(str::to_owned),
            model_provider: p["modelProvider"].as_str().map(str::to_owned),
        },
        "turn/start" => ClientRequest::TurnStart {
            thread_id: s("threadId"),
            client_user_message_id: s("clientUserMessageId"),
            input: input(),
        },
        "turn/steer" => ClientRequest::TurnSteer {
            thread_id: s("threadId"),
            expected_turn_id: s("expectedTurnId"),
            client_user_message_id: s("clientUserMessageId"),
            input: input(),
        },
        other => panic!("no typed request for {other}"),
    }
}

fn decision(v: &Value) -> Decision {
    match v["decision"].as_str() {
        Some("accept") => Decision::Accept,
        Some("decline") => Decision::Decline,
        other => panic!("decision {other:?}"),
    }
}

fn result_of(d: Decision) -> ApprovalResult {
    match d {
        Decision::Accept => ApprovalResult::Accepted,
        Decision::Decline => ApprovalResult::Declined,
        other => panic!("{other:?}"),
    }
}

/// Everything a replay of one recording produced.
#[derive(Default)]
struct Replay {
    census: BTreeMap<String, usize>,
    notifications: Vec<ServerNotification>,
    projected: Vec<Projected>,
    /// Operation → its send result.
    sends: BTreeMap<String, SendResult>,
    /// Duplicate approval answers the codec refused.
    refused_answers: usize,
    codec: Codec,
}

fn bump(census: &mut BTreeMap<String, usize>, label: String) {
    *census.entry(label).or_insert(0) += 1;
}

/// Replays a recording: the client lines are re-encoded by the codec and compared with
/// what was written; the server lines go through the codec and the projection.
fn replay(rel: &str) -> Replay {
    let bytes = read(rel);
    let mut r = Replay::default();
    let mut projector = Projector::new("session-1", None, 1);
    // Request ID → operation of the send it carried.
    let mut send_ops: BTreeMap<u64, (SendMethod, String, String)> = BTreeMap::new();
    let mut t = 0u64;
    for line in bytes.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        t += 1;
        let now = Millis(t);
        let v: Value = serde_json::from_slice(line).expect("every recorded line is JSON");
        if v.get("_meta").is_some() {
            bump(&mut r.census, "harness:meta".into());
            continue;
        }
        if v.get("_note").is_some() {
            bump(&mut r.census, "harness:note".into());
            continue;
        }
        if let Some(sent) = v.get("_sent") {
            match sent["method"].as_str() {
                Some("initialized") => {
                    let ours: Value = serde_json::from_slice(&r.codec.initialized()).expect("JSON");
                    assert_eq!(&ours, sent, "{rel}: initialized");
                    bump(&mut r.census, "sent:initialized".into());
                }
                Some(method) => {
                    let request = typed_request(method, &sent["params"]);
                    let (id, out) = r.codec.request(&request);
                    let ours: Value = serde_json::from_slice(&out).expect("JSON");
                    assert_eq!(
                        &ours, sent,
                        "{rel}: our {method} differs from the recorded one"
                    );
                    assert_eq!(Some(id), sent["id"].as_u64());
                    if let ClientRequest::TurnStart {
                        thread_id,
                        client_user_message_id,
                        ..
                    }
                    | ClientRequest::TurnSteer {
                        thread_id,
                        client_user_message_id,
                        ..
                    } = &request
                    {
                        let m = if request.method() == Method::TurnStart {
                            SendMethod::TurnStart
                        } else {
                            SendMethod::TurnSteer
                        };
                        send_ops.insert(id, (m, client_user_message_id.clone(), thread_id.clone()));
                    }
                    bump(&mut r.census, format!("sent:{method}"));
                }
                None => {
                    let id = RequestId::from_value(&sent["id"]).expect("answer id");
                    let d = decision(&sent["result"]);
                    match r.codec.answer_approval(&id, d) {
                        Ok(out) => {
                            let ours: Value = serde_json::from_slice(&out).expect("JSON");
                            assert_eq!(&ours, sent, "{rel}: approval answer");
                            r.projected
                                .extend(projector.decided(&id, result_of(d), now));
                        }
                        // The recording answered one request twice; the codec refuses
                        // the second answer.
                        Err(AnswerError::NotOpen(_)) => r.refused_answers += 1,
                        Err(e) => panic!("{e}"),
                    }
                    bump(&mut r.census, "sent:answer".into());
                }
            }
            continue;
        }
        let incoming = r
            .codec
            .handle_line(line)
            .unwrap_or_else(|e| panic!("{rel}: a server line was not read: {e}"));
        match incoming {
            Incoming::Response { id, response } => {
                let method = match &response {
                    Response::Initialize { .. } => "initialize",
                    Response::ThreadStart { .. } => "thread/start",
                    Response::TurnStart { .. } => "turn/start",
                    Response::TurnSteer { .. } => "turn/steer",
                    other => panic!("unexpected answer {other:?}"),
                };
                let turn = match &response {
                    Response::TurnStart { turn } => Some(turn.id.clone()),
                    Response::TurnSteer { turn_id } => Some(turn_id.clone()),
                    _ => None,
                };
                if let (Some(turn), Some((_, op, thread))) = (turn, send_ops.remove(&id)) {
                    let run = timeline_core::key::RunId::new("run-1").expect("run");
                    r.sends.insert(op, send::accepted(run, &thread, &turn, now));
                }
                bump(&mut r.census, format!("response:{method}"));
            }
            Incoming::Error { id, method, error } => {
                let method = method.expect("the error answers a request of ours");
                if let Some((m, op, _)) = id.and_then(|i| send_ops.remove(&i)) {
                    r.sends
                        .insert(op, send::failed(m, &send::SendFailure::Rpc(error)));
                }
                bump(&mut r.census, format!("error:{}", method.as_str()));
            }
            Incoming::Notification(n) => {
                let method = v["method"].as_str().expect("method").to_owned();
                r.projected.extend(projector.handle(&n, now));
                r.notifications.push(n.body);
                bump(&mut r.census, format!("notification:{method}"));
            }
            Incoming::Request { request, reply } => {
                assert!(
                    reply.is_none(),
                    "{rel}: every recorded request is an approval"
                );
                let method = v["method"].as_str().expect("method").to_owned();
                r.projected.extend(projector.handle_request(&request, now));
                bump(&mut r.census, format!("request:{method}"));
            }
            Incoming::Skipped => bump(&mut r.census, "skipped".into()),
            other => panic!("{other:?}"),
        }
    }
    r
}

fn census(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// Every server line was typed or is a known, deliberately ignored notification.
fn assert_nothing_unknown(rel: &str, codec: &Codec) {
    let d = codec.diagnostics();
    assert_eq!(d.total(Skip::Unknown), 0, "{rel}: {d}");
    assert_eq!(d.total(Skip::Malformed), 0, "{rel}: {d}");
}

// OB-08
#[test]
fn census_of_02_approvals_and_tools() {
    let rel = APP_SERVER[0];
    let r = replay(rel);
    assert_eq!(
        r.census,
        census(&[
            ("harness:meta", 1),
            ("harness:note", 4),
            ("notification:account/rateLimits/updated", 6),
            ("notification:item/agentMessage/delta", 50),
            ("notification:item/completed", 13),
            ("notification:item/started", 13),
            ("notification:mcpServer/startupStatus/updated", 5),
            ("notification:remoteControl/status/changed", 1),
            ("notification:serverRequest/resolved", 2),
            ("notification:thread/started", 1),
            ("notification:thread/status/changed", 10),
            ("notification:thread/tokenUsage/updated", 6),
            ("notification:turn/completed", 3),
            ("notification:turn/diff/updated", 3),
            ("notification:turn/started", 3),
            ("request:item/fileChange/requestApproval", 2),
            ("response:initialize", 1),
            ("response:thread/start", 1),
            ("response:turn/start", 3),
            ("sent:answer", 3),
            ("sent:initialize", 1),
            ("sent:initialized", 1),
            ("sent:thread/start", 1),
            ("sent:turn/start", 3),
        ])
    );
    assert_eq!(r.census.values().sum::<usize>(), 137, "every line counted");
    assert_nothing_unknown(rel, &r.codec);
    let d = r.codec.diagnostics();
    assert_eq!(d.agent_version.as_deref(), Some("0.147.0"));
    assert_eq!(
        d.get(Skip::Ignored, "notification:account/rateLimits/updated"),
        6
    );
    assert_eq!(
        r.refused_answers, 1,
        "the duplicate answer to request 0 is refused"
    );
}

// OB-08
#[test]
fn census_of_03_steer_and_queue() {
    let rel = APP_SERVER[1];
    let r = replay(rel);
    assert_eq!(
        r.census,
        census(&[
            ("error:turn/steer", 1),
            ("harness:meta", 1),
            ("harness:note", 5),
            ("notification:account/rateLimits/updated", 3),
            ("notification:item/agentMessage/delta", 12),
            ("notification:item/completed", 7),
            ("notification:item/started", 7),
            ("notification:mcpServer/startupStatus/updated", 4),
            ("notification:remoteControl/status/changed", 1),
            ("notification:thread/started", 1),
            ("notification:thread/status/changed", 2),
            ("notification:thread/tokenUsage/updated", 3),
            ("notification:turn/completed", 1),
            ("notification:turn/started", 1),
            ("response:initialize", 1),
            ("response:thread/start", 1),
            ("response:turn/start", 2),
            ("response:turn/steer", 1),
            ("sent:initialize", 1),
            ("sent:initialized", 1),
            ("sent:thread/start", 1),
            ("sent:turn/start", 2),
            ("sent:turn/steer", 2),
        ])
    );
    assert_eq!(r.census.values().sum::<usize>(), 61, "every line counted");
    assert_nothing_unknown(rel, &r.codec);
    assert_eq!(
        r.codec.diagnostics().agent_version.as_deref(),
        Some("0.147.0")
    );
}

fn user_client_ids(ns: &[ServerNotification]) -> BTreeSet<String> {
    ns.iter()
        .filter_map(|n| match n {
            ServerNotification::ItemCompleted {
                item:
                    ThreadItem::UserMessage {
                        client_id: Some(c), ..
                    },
                ..
            } => Some(c.clone()),
            _ => None,
        })
        .collect()
}

// OB-08: the echo proves delivery in any turn; a steer and a mid-turn turn/start land in
// the running turn; the stale steer is proven unadmitted and never echoed.
#[test]
fn delivery_proofs_of_the_recordings() {
    let thread02 = "01a04657-9189-7991-b6e7-74e876164626";
    let r = replay(APP_SERVER[0]);
    assert_eq!(
        user_client_ids(&r.notifications),
        ["m1", "m2", "m3"].map(String::from).into()
    );
    for op in ["m1", "m2", "m3"] {
        assert!(
            matches!(r.sends.get(op), Some(SendResult::Accepted(_))),
            "{op}: {:?}",
            r.sends.get(op)
        );
        assert!(matches!(
            proof::delivery(op, thread02, &r.notifications),
            Verdict::Delivered { .. }
        ));
    }

    let thread03 = "01a04658-f095-7b11-89bd-76bc2f8fde8e";
    let running = "01a04658-f0c0-7b30-8d28-66462412eb05";
    let r = replay(APP_SERVER[1]);
    for op in ["m1", "m2", "m3"] {
        assert_eq!(
            proof::delivery(op, thread03, &r.notifications),
            Verdict::Delivered {
                turn_id: running.into()
            },
            "{op}"
        );
    }
    // m3 was a turn/start while a turn ran: accepted by a turn that never ran.
    let Some(SendResult::Accepted(a)) = r.sends.get("m3") else {
        panic!("{:?}", r.sends.get("m3"))
    };
    assert_ne!(a.turn_id.as_str(), running);
    // m4 named a stale expectedTurnId: -32600, proven unadmitted, never echoed.
    assert!(matches!(
        r.sends.get("m4"),
        Some(SendResult::ProvenUnadmitted { error }) if error.contains("-32600")
    ));
    assert_eq!(
        proof::delivery("m4", thread03, &r.notifications),
        Verdict::Pending
    );
    assert_eq!(user_client_ids(&r.notifications).len(), 3);
    // A watch fed one notification at a time settles at the echo.
    let mut w = DeliveryWatch::new("m2", thread03);
    let settled_at = r
        .notifications
        .iter()
        .position(|n| w.handle(n) != &Verdict::Pending)
        .expect("m2 is echoed");
    assert!(matches!(
        &r.notifications[settled_at],
        ServerNotification::ItemStarted { .. }
    ));
}

fn rows(projected: &[Projected]) -> Vec<&overlay_core::store::StoredBlock> {
    projected
        .iter()
        .filter_map(|p| match p {
            Projected::Row(b) => Some(b),
            _ => None,
        })
        .collect()
}

fn deltas(projected: &[Projected]) -> Vec<SessionEvent> {
    projected
        .iter()
        .filter_map(|p| match p {
            Projected::Delta(e) => Some(e.clone()),
            _ => None,
        })
        .collect()
}

// PK-01, PK-04: the deltas of every reply pack into one row per reply, unpack exactly,
// and their concatenation is the text `item/completed` says (the authoritative item).
#[test]
fn deltas_go_through_the_packed_history_path_and_match_the_completed_text() {
    for rel in APP_SERVER {
        let r = replay(rel);
        let events = deltas(&r.projected);
        let records = pack(&events).expect("pack");
        assert_eq!(unpack_records(&records).expect("unpack"), events, "{rel}");
        let mut by_block: BTreeMap<String, String> = BTreeMap::new();
        for e in &events {
            let (_, block, text) = e.as_delta().expect("a delta");
            by_block.entry(block.to_owned()).or_default().push_str(text);
        }
        let mut completed = 0;
        for n in &r.notifications {
            if let ServerNotification::ItemCompleted {
                item: ThreadItem::AgentMessage { id, text, .. },
                ..
            } = n
            {
                assert_eq!(by_block.get(id), Some(text), "{rel}: {id}");
                completed += 1;
            }
        }
        assert_eq!(completed, by_block.len(), "{rel}: one packed run per reply");
        assert_eq!(
            records.len(),
            by_block.len(),
            "{rel}: one chunk row per reply"
        );
    }
}

// TL-03, TL-05, RW-06
#[test]
fn projected_rows_of_02() {
    let r = replay(APP_SERVER[0]);
    let rows = rows(&r.projected);
    // The user rows carry their operations.
    for op in ["m1", "m2", "m3"] {
        let key = BlockKey::user_message(&OperationId::new(op).unwrap());
        let row = rows
            .iter()
            .rev()
            .find(|b| b.block.key() == key)
            .unwrap_or_else(|| panic!("no user row for {op}"));
        assert_eq!(
            row.block.operation_id.as_ref().map(|o| o.as_str()),
            Some(op)
        );
    }
    // A row keeps its place when item/completed rewrites it.
    let mut placed: BTreeMap<BlockKey, (Millis, Option<Vec<u64>>)> = BTreeMap::new();
    for b in &rows {
        let place = (
            b.block.timestamp,
            b.block.source_order.as_ref().map(|o| o.as_slice().to_vec()),
        );
        let first = placed.entry(b.block.key()).or_insert(place.clone());
        assert_eq!(*first, place, "{} moved", b.block.key());
    }
    // The command row: title is the command, exit code the signal.
    let cmd = rows
        .iter()
        .rev()
        .find(|b| b.block.id.as_str() == "exec-ab1629f4-8921-421a-9e95-ae50d8b90f46")
        .expect("the command row");
    assert_eq!(cmd.block.data["title"], "/bin/zsh -lc 'echo PEAR'");
    assert_eq!(cmd.block.data["status"], "completed");
    // Two approval cards: pending, then accepted; pending, then declined.
    let cards: Vec<_> = rows
        .iter()
        .filter(|b| b.class == RowClass::ApprovalCard)
        .map(|b| {
            (
                b.block.id.as_str().to_owned(),
                b.block.data["approval"]["status"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            )
        })
        .collect();
    let statuses: Vec<&str> = cards.iter().map(|(_, s)| s.as_str()).collect();
    assert_eq!(statuses, ["pending", "accepted", "pending", "declined"]);
    assert_eq!(
        cards[0].0, cards[1].0,
        "the decision replaces the card in place"
    );
    assert!(cards[0].0.starts_with("approval:1:0"));
    assert!(rows
        .iter()
        .all(|b| b.block.block_type != BlockType::Activity || b.block.data.is_object()));
    // Each turn's end is handed to the host.
    let ended = r
        .projected
        .iter()
        .filter(|p| matches!(p, Projected::TurnEnded { .. }))
        .count();
    assert_eq!(ended, 3);
}

// ----- rollouts ----------------------------------------------------------------------------

fn rollout_census(
    rel: &str,
) -> (
    BTreeMap<String, usize>,
    RolloutReader,
    usize,
    Vec<agent_codex::rollout::RolloutLine>,
) {
    let bytes = read(rel);
    let mut reader = RolloutReader::new();
    let batch = reader.read(&bytes);
    assert_eq!(batch.consumed, bytes.len(), "{rel}: read to the end");
    assert!(!batch.torn_tail);
    let mut c = BTreeMap::new();
    for l in &batch.lines {
        bump(&mut c, l.label.clone());
    }
    let n = bytes
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .count();
    (c, reader, n, batch.lines)
}

#[test]
fn census_of_the_0_58_rollout() {
    let rel = ROLLOUTS[0];
    let (c, reader, n, lines) = rollout_census(rel);
    assert_eq!(
        c,
        census(&[
            ("event_msg/agent_reasoning", 39),
            ("event_msg/token_count", 79),
            ("event_msg/user_message", 1),
            ("response_item/function_call", 39),
            ("response_item/function_call_output", 39),
            ("response_item/ghost_snapshot", 1),
            ("response_item/message", 2),
            ("response_item/reasoning", 38),
            ("session_meta", 1),
            ("turn_context", 40),
        ])
    );
    assert_eq!(lines.len(), n, "every line is read");
    assert_eq!(n, 279);
    let d = reader.diagnostics();
    assert_eq!(d.total(Skip::Unknown) + d.total(Skip::Malformed), 0, "{d}");
    assert_eq!(d.agent_version.as_deref(), Some("0.58.0"));
    // 0.58 predates client IDs: its one user message proves nothing.
    let users: Vec<_> = lines
        .iter()
        .filter_map(|l| match &l.record {
            RolloutRecord::EventMsg(EventMsg::UserMessage { client_id, .. }) => Some(client_id),
            _ => None,
        })
        .collect();
    assert_eq!(users, [&None]);
}

#[test]
fn census_of_the_0_146_coverage_rollout() {
    let rel = ROLLOUTS[1];
    let (c, reader, n, lines) = rollout_census(rel);
    assert_eq!(
        c,
        census(&[
            ("compacted", 6),
            ("event_msg/agent_message", 1),
            ("event_msg/agent_reasoning", 1),
            ("event_msg/collab_agent_interaction_end", 2),
            ("event_msg/collab_agent_spawn_end", 1),
            ("event_msg/collab_close_end", 1),
            ("event_msg/collab_waiting_end", 1),
            ("event_msg/context_compacted", 1),
            ("event_msg/dynamic_tool_call_request", 1),
            ("event_msg/dynamic_tool_call_response", 1),
            ("event_msg/entered_review_mode", 6),
            ("event_msg/error", 1),
            ("event_msg/exec_command_end", 3),
            ("event_msg/exited_review_mode", 3),
            ("event_msg/guardian_assessment", 4),
            ("event_msg/image_generation_end", 2),
            ("event_msg/item_completed", 13),
            ("event_msg/mcp_tool_call_end", 6),
            ("event_msg/patch_apply_end", 1),
            ("event_msg/sub_agent_activity", 1),
            ("event_msg/task_complete", 2),
            ("event_msg/task_started", 2),
            ("event_msg/thread_goal_updated", 2),
            ("event_msg/thread_name_updated", 1),
            ("event_msg/thread_settings_applied", 1),
            ("event_msg/token_count", 3),
            ("event_msg/turn_aborted", 1),
            ("event_msg/undo_completed", 1),
            ("event_msg/user_message", 3),
            ("event_msg/view_image_tool_call", 1),
            ("event_msg/web_search_end", 1),
            ("inter_agent_communication_metadata", 1),
            ("response_item/agent_message", 2),
            ("response_item/custom_tool_call", 2),
            ("response_item/custom_tool_call_output", 3),
            ("response_item/function_call", 2),
            ("response_item/function_call_output", 2),
            ("response_item/ghost_snapshot", 1),
            ("response_item/image_generation_call", 1),
            ("response_item/message", 3),
            ("response_item/reasoning", 2),
            ("response_item/tool_search_call", 2),
            ("response_item/tool_search_output", 1),
            ("response_item/web_search_call", 1),
            ("session_meta", 7),
            ("turn_context", 9),
            ("world_state", 5),
        ])
    );
    assert_eq!(lines.len(), n, "every line is read");
    assert_eq!(n, 118);
    let d = reader.diagnostics();
    assert_eq!(d.total(Skip::Unknown) + d.total(Skip::Malformed), 0, "{d}");
    assert_eq!(d.get(Skip::Ignored, "line:world_state"), 5);
    assert_eq!(
        d.get(Skip::Ignored, "line:inter_agent_communication_metadata"),
        1
    );
    assert_eq!(d.agent_version.as_deref(), Some("0.146.0"));
}

// OB-08: every user message that carries a client ID is found by the history proof, in
// legacy mode (`user_message.client_id`) and paginated mode (`item_completed`).
#[test]
fn rollout_delivery_proofs() {
    let mut all = BTreeSet::new();
    for rel in ROLLOUTS {
        let (_, _, _, lines) = rollout_census(rel);
        for (i, l) in lines.iter().enumerate() {
            let id = match &l.record {
                RolloutRecord::EventMsg(EventMsg::UserMessage {
                    client_id: Some(c), ..
                }) => c,
                RolloutRecord::EventMsg(EventMsg::ItemCompleted {
                    item:
                        TurnItem::UserMessage {
                            client_id: Some(c), ..
                        },
                    ..
                }) => c,
                _ => continue,
            };
            let p = proof::in_rollout(&lines, id).expect("found");
            assert!(p.line <= i, "{rel}: {id}");
            assert_eq!(proof::rollout_history_read(&lines, id), HistoryRead::Found);
            all.insert(id.clone());
        }
        assert_eq!(
            proof::rollout_history_read(&lines, "op-never-sent"),
            HistoryRead::Missing
        );
    }
    assert_eq!(
        all,
        ["cli", "[trimmed for fixture]"].map(String::from).into()
    );
    // The legacy proof names the turn that was running.
    let (_, _, _, lines) = rollout_census(ROLLOUTS[1]);
    let p = proof::in_rollout(&lines, "cli").unwrap();
    assert_eq!(
        p.turn_id.as_deref(),
        Some("019fc8be-0000-7000-8000-000000000001")
    );
}

#[test]
fn the_edge_reads_a_real_rollout_file() {
    let path = data_file(ROLLOUTS[0]);
    let (batch, reader) = agent_codex::edge::read_rollout_file(Path::new(&path)).unwrap();
    assert_eq!(batch.lines.len(), 279);
    assert_eq!(
        reader.diagnostics().agent_version.as_deref(),
        Some("0.58.0")
    );
}

/// Every real rollout, compressed here as Codex compresses a cold one: reading the
/// `.jsonl.zst` gives the same lines, the same diagnostics and the same history pages
/// (same positions, same rows) as the plain file, and the same boundary token.
#[test]
fn a_compressed_rollout_reads_as_the_plain_one() {
    use agent_codex::edge::RolloutSource;
    use overlay_core::source::HistorySource;

    let dir = tempfile::tempdir().expect("tempdir");
    for rel in ROLLOUTS {
        let plain_bytes = read(rel);
        let name = Path::new(rel).file_name().expect("name");
        let plain = dir.path().join(name);
        std::fs::write(&plain, &plain_bytes).expect("write plain");
        let zst = dir.path().join(format!("{}.zst", name.to_string_lossy()));
        let packed = zstd::stream::encode_all(plain_bytes.as_slice(), 3).expect("compress");
        assert!(packed.len() < plain_bytes.len(), "{rel}: compressed");
        std::fs::write(&zst, packed).expect("write zst");

        let (a, ra) = agent_codex::edge::read_rollout_file(&plain).unwrap();
        let (b, rb) = agent_codex::edge::read_rollout_file(&zst).unwrap();
        assert_eq!(a, b, "{rel}: the same lines");
        assert_eq!(ra.diagnostics(), rb.diagnostics(), "{rel}");

        let mut sa = RolloutSource::open(&plain, 1).unwrap();
        let mut sb = RolloutSource::open(&zst, 1).unwrap();
        assert_eq!(sa.boundary_token(), sb.boundary_token(), "{rel}");
        assert_eq!(sa.kind(), sb.kind(), "{rel}");
        let mut before = None;
        loop {
            let pa = sa.read(before.as_ref(), 7).unwrap();
            let pb = sb.read(before.as_ref(), 7).unwrap();
            assert_eq!(pa, pb, "{rel}: the same page");
            before = match (pa.more, pa.items.last()) {
                (true, Some(last)) => Some(last.position.clone()),
                _ => break,
            };
        }
        assert!(agent_codex::edge::rollout_holds(&zst, "cli").is_ok());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    // A file read while Codex writes it: reading a prefix, then the rest from where the
    // first read stopped, gives exactly the lines of one read of the whole file.
    #[test]
    fn a_rollout_read_in_two_parts_equals_one_read(cut in 0usize..=145_596) {
        let bytes = read(ROLLOUTS[1]);
        let cut = cut.min(bytes.len());
        let whole = RolloutReader::new().read(&bytes).lines;
        let mut reader = RolloutReader::new();
        let first = reader.read(&bytes[..cut]);
        prop_assert!(first.consumed <= cut);
        prop_assert_eq!(first.torn_tail, first.consumed < cut);
        let second = reader.read(&bytes[first.consumed..]);
        let mut lines = first.lines;
        lines.extend(second.lines);
        prop_assert_eq!(lines, whole);
        prop_assert_eq!(reader.diagnostics().total(Skip::Malformed), 0);
    }
}
