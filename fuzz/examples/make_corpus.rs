//! Writes the seed corpus of every fuzz target (`fuzz/corpus/<target>/`) and its
//! `NOTICE`, from two sources:
//!
//! - what the library itself writes: cursors and tokens from the encoders, windows,
//!   older pages and live snapshots from the scripted host, packed pages from `pack` and
//!   `write_packed_page`, replay chunks from the host's replay buffers, envelopes, card
//!   IDs and the shared sample rows;
//! - lines of the public recordings and transcripts under `shared/real-data` that
//!   `PROVENANCE.md` lists as MIT licensed (see [`SOURCES`]): real thread, session and
//!   item IDs, real delta fragments, commands, outputs, file paths and messages.
//!
//! Seeds are small (each under 64 KiB, the whole corpus well under 2 MB) and the output
//! is deterministic, so regenerating changes nothing unless the encoders change.
//!
//! ```text
//! cargo run --manifest-path fuzz/Cargo.toml --example make_corpus [OUT_DIR [REAL_DATA_DIR]]
//! ```

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use custody_fuzz::script::ScriptWriter;
use custody_fuzz::targets::{
    client_replay, envelope, history, overlay_replay, rows, timeline, tokens,
};
use fixtures::sim_host::SimHost;
use outbox_core::adapter::AgentKind;
use outbox_core::envelope::EnvelopeSender;
use overlay_core::replay::{EventKind, ReplayBuffers, ReplayConfig, RunningState};
use serde_json::{json, Value};
use timeline_core::anchor::{Anchor, AnchorToken, LinkPlace, NewerPlace};
use timeline_core::cursor::{BoundaryToken, ClaudeCursor, CodexCursor};
use timeline_core::history::{
    pack, write_packed_page, HistoryPage, SessionEvent, SessionHistoryRecord,
};
use timeline_core::key::{BlockKey, BlockType, OperationId, SessionId};
use timeline_core::rows::{ActivityRow, ApprovalKind, ApprovalRequest, Decision, RowStatus};
use timeline_core::seal::HostKey;
use timeline_core::time::Millis;

/// The real-data files the corpus is made from: (path under real-data, licence file
/// beside it, what it is).
const SOURCES: [(&str, &str, &str); 6] = [
    (
        "anyagent-rs/codex-app-server/02-approvals-and-tools.jsonl",
        "anyagent-rs/LICENSE-MIT.upstream",
        "spotta85/anyagent-rs tests/fixtures/codex/02-approvals-and-tools.jsonl (Codex app-server recording)",
    ),
    (
        "anyagent-rs/codex-app-server/03-steer-and-queue.jsonl",
        "anyagent-rs/LICENSE-MIT.upstream",
        "spotta85/anyagent-rs tests/fixtures/codex/03-steer-and-queue.jsonl (Codex app-server recording)",
    ),
    (
        "anyagent-rs/claude-stream-json/01-single-prompt.jsonl",
        "anyagent-rs/LICENSE-MIT.upstream",
        "spotta85/anyagent-rs tests/fixtures/claude/01-single-prompt.jsonl (Claude Code stream-json recording)",
    ),
    (
        "claude-code-viewer/1af7fc5e-8455-4414-9ccd-011d40f70b2a.jsonl",
        "claude-code-viewer/LICENSE.upstream",
        "d-kimuson/claude-code-viewer mock-global-claude-dir/projects/sample-project/1af7fc5e-8455-4414-9ccd-011d40f70b2a.jsonl (Claude Code transcript)",
    ),
    (
        "spotter/short.jsonl",
        "spotter/LICENSE.upstream",
        "marot/spotter test/fixtures/transcripts/short.jsonl (Claude Code transcript)",
    ),
    (
        "codex-session-view/rollout-2025-11-17T15-30-28-019a93b9-f380-7600-98ff-940e6b99603c.jsonl",
        "codex-session-view/LICENSE.upstream",
        "AcidicSoil/codex-session-view .sample_session/rollout-2025-11-17T15-30-28-019a93b9-f380-7600-98ff-940e6b99603c.jsonl (Codex CLI rollout)",
    ),
];

/// The largest line of a source used whole (longer ones are skipped).
const MAX_LINE: usize = 16 * 1024;

struct Corpus {
    root: PathBuf,
    files: usize,
    bytes: usize,
}

impl Corpus {
    fn put(&mut self, target: &str, name: &str, data: &[u8]) {
        let dir = self.root.join(target);
        fs::create_dir_all(&dir).expect("create corpus dir");
        fs::write(dir.join(name), data).expect("write seed");
        self.files += 1;
        self.bytes += data.len();
    }

    fn script(&mut self, target: &str, name: &str, w: &ScriptWriter) {
        self.put(target, name, &w.finish());
    }
}

/// The parsed lines of the real-data sources, and values taken from them.
struct Real {
    /// Lines of each source, in [`SOURCES`] order.
    lines: Vec<Vec<Value>>,
}

impl Real {
    fn load(dir: &Path) -> Real {
        let lines = SOURCES
            .iter()
            .map(|(file, _, _)| {
                let text = fs::read_to_string(dir.join(file))
                    .unwrap_or_else(|e| panic!("read {file}: {e}"));
                text.lines()
                    .filter(|l| l.len() <= MAX_LINE)
                    .filter_map(|l| serde_json::from_str(l).ok())
                    .collect()
            })
            .collect();
        Real { lines }
    }

    fn codex(&self) -> impl Iterator<Item = &Value> {
        self.lines[0].iter().chain(self.lines[1].iter())
    }

    fn claude_stream(&self) -> &[Value] {
        &self.lines[2]
    }

    fn transcripts(&self) -> impl Iterator<Item = &Value> {
        self.lines[3].iter().chain(self.lines[4].iter())
    }

    fn rollout(&self) -> &[Value] {
        &self.lines[5]
    }

    fn strings_at(&self, values: impl Iterator<Item = Value>) -> Vec<String> {
        let set: BTreeSet<String> = values
            .filter_map(|v| v.as_str().map(str::to_owned))
            .filter(|s| !s.trim().is_empty())
            .collect();
        set.into_iter().collect()
    }

    fn codex_threads(&self) -> Vec<String> {
        self.strings_at(
            self.codex()
                .filter_map(|v| v.pointer("/params/threadId").cloned()),
        )
    }

    fn codex_items(&self) -> Vec<String> {
        self.strings_at(
            self.codex()
                .filter_map(|v| v.pointer("/params/item/id").cloned()),
        )
    }

    fn claude_sessions(&self) -> Vec<String> {
        self.strings_at(
            self.transcripts()
                .filter_map(|v| v.get("sessionId").cloned()),
        )
    }

    fn claude_uuids(&self) -> Vec<String> {
        self.strings_at(self.transcripts().filter_map(|v| v.get("uuid").cloned()))
    }

    /// User message texts of the transcripts.
    fn user_texts(&self) -> Vec<String> {
        self.transcripts()
            .filter(|v| v.get("type").and_then(Value::as_str) == Some("user"))
            .filter_map(|v| {
                let c = v.pointer("/message/content")?;
                match c {
                    Value::String(s) => Some(s.clone()),
                    Value::Array(parts) => parts
                        .iter()
                        .find_map(|p| p.get("text").and_then(Value::as_str))
                        .map(str::to_owned),
                    _ => None,
                }
            })
            .collect()
    }

    /// Tool results of the transcripts (outputs, file contents, diffs).
    fn tool_results(&self) -> Vec<String> {
        let mut out = Vec::new();
        for v in self.transcripts() {
            let Some(Value::Array(parts)) = v.pointer("/message/content") else {
                continue;
            };
            for p in parts {
                if p.get("type").and_then(Value::as_str) == Some("tool_result") {
                    match p.get("content") {
                        Some(Value::String(s)) if !s.is_empty() => out.push(s.clone()),
                        Some(Value::Array(a)) => out.extend(
                            a.iter()
                                .filter_map(|x| x.get("text").and_then(Value::as_str))
                                .map(str::to_owned),
                        ),
                        _ => {}
                    }
                }
            }
        }
        out
    }

    /// Tool uses of the transcripts: (tool name, input).
    fn tool_uses(&self) -> Vec<(String, Value)> {
        let mut out = Vec::new();
        for v in self.transcripts() {
            let Some(Value::Array(parts)) = v.pointer("/message/content") else {
                continue;
            };
            for p in parts {
                if p.get("type").and_then(Value::as_str) == Some("tool_use") {
                    let name = p.get("name").and_then(Value::as_str).unwrap_or("tool");
                    out.push((
                        name.to_owned(),
                        p.get("input").cloned().unwrap_or(Value::Null),
                    ));
                }
            }
        }
        out
    }

    /// Codex approval requests: (request id, thread, turn, item, kind).
    fn approvals(&self) -> Vec<ApprovalRequest> {
        self.codex()
            .filter(|v| {
                v.get("method")
                    .and_then(Value::as_str)
                    .is_some_and(|m| m.ends_with("requestApproval"))
            })
            .filter_map(|v| {
                let p = v.get("params")?;
                let kind = if v.get("method")?.as_str()?.contains("fileChange") {
                    ApprovalKind::FileChange
                } else {
                    ApprovalKind::CommandExecution
                };
                Some(ApprovalRequest {
                    request_id: v.get("id")?.to_string(),
                    thread_id: p.get("threadId")?.as_str()?.to_owned(),
                    turn_id: p.get("turnId")?.as_str()?.to_owned(),
                    item_id: p.get("itemId")?.as_str()?.to_owned(),
                    kind,
                    allowed: vec![Decision::Accept, Decision::Decline, Decision::Cancel],
                })
            })
            .collect()
    }

    /// Codex items completed: commands (command, output, exit code) and file changes
    /// (path, diff).
    fn codex_rows(&self) -> Vec<ActivityRow> {
        let mut out = Vec::new();
        for v in self.codex() {
            if v.get("method").and_then(Value::as_str) != Some("item/completed") {
                continue;
            }
            let Some(item) = v.pointer("/params/item") else {
                continue;
            };
            match item.get("type").and_then(Value::as_str) {
                Some("commandExecution") => out.push(ActivityRow::command(
                    item.get("command")
                        .and_then(Value::as_str)
                        .unwrap_or_default(),
                    RowStatus::Completed,
                    item.get("exitCode")
                        .and_then(Value::as_i64)
                        .and_then(|c| i32::try_from(c).ok()),
                    item.get("aggregatedOutput")
                        .and_then(Value::as_str)
                        .unwrap_or_default(),
                )),
                Some("fileChange") => {
                    for c in item
                        .get("changes")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                    {
                        out.push(ActivityRow::file_change(
                            c.get("path").and_then(Value::as_str).unwrap_or("file"),
                            true,
                            RowStatus::Completed,
                            c.get("diff").and_then(Value::as_str).unwrap_or_default(),
                        ));
                    }
                }
                _ => {}
            }
        }
        out
    }

    /// Logical delta events of the Codex recordings and the Claude stream.
    fn delta_events(&self) -> (Vec<SessionEvent>, Vec<SessionEvent>) {
        let codex: Vec<SessionEvent> = self
            .codex()
            .enumerate()
            .filter_map(|(i, v)| {
                fixtures::history::codex_delta(v, i as u64 + 1, "codex-thread").or_else(|| {
                    let method = v.get("method")?.as_str()?;
                    let time = v.get("emittedAtMs").and_then(Value::as_u64).unwrap_or(0);
                    Some(SessionEvent::other(
                        i as u64 + 1,
                        time,
                        "codex-thread",
                        method,
                        json!({}),
                    ))
                })
            })
            .collect();
        let claude: Vec<SessionEvent> = self
            .claude_stream()
            .iter()
            .enumerate()
            .filter_map(|(i, v)| {
                let seq = i as u64 + 1;
                fixtures::history::claude_delta(v, seq, 1_000 + 7 * seq, "msg").or_else(|| {
                    let t = v.get("type")?.as_str()?;
                    Some(SessionEvent::other(
                        seq,
                        1_000 + 7 * seq,
                        "claude",
                        t,
                        json!({}),
                    ))
                })
            })
            .collect();
        (renumber(codex), renumber(claude))
    }
}

/// Consecutive sequence numbers from 1, in order.
fn renumber(mut events: Vec<SessionEvent>) -> Vec<SessionEvent> {
    for (i, e) in events.iter_mut().enumerate() {
        e.seq = i as u64 + 1;
    }
    events
}

fn key() -> HostKey {
    HostKey::from_bytes(tokens::HOST_KEY)
}

fn block_key(t: BlockType, id: &str) -> BlockKey {
    BlockKey::parse(t, id).expect("real IDs are not blank")
}

fn tokens_corpus(c: &mut Corpus, real: &Real) {
    let t = "tokens";
    let threads = real.codex_threads();
    let items = real.codex_items();
    let rollout = format!(
        "/home/user/.codex/sessions/2025/11/17/{}",
        SOURCES[5].0.rsplit('/').next().unwrap_or_default()
    );
    let rollout_id = real
        .rollout()
        .first()
        .and_then(|v| v.pointer("/payload/id"))
        .and_then(Value::as_str)
        .unwrap_or("019a93b9-f380-7600-98ff-940e6b99603c")
        .to_owned();
    let mut codex = Vec::new();
    for (i, thread) in threads.iter().chain([&rollout_id]).enumerate() {
        let source = if i % 2 == 0 {
            BoundaryToken::codex_rollout(&rollout)
        } else {
            BoundaryToken::codex_owned_thread_store(thread)
        };
        let item = items
            .get(i % items.len().max(1))
            .cloned()
            .unwrap_or("item-1".into());
        codex.push(CodexCursor {
            thread_id: thread.clone(),
            sidecar_cursor: (i % 3 != 0).then(|| format!("{item}@{i}")),
            generation: i as u64,
            source_token: source,
            seam: block_key(BlockType::Activity, &item),
            window_revision: 1 + i as u64,
        });
    }
    for (i, cur) in codex.iter().enumerate() {
        let mut w = ScriptWriter::new();
        w.byte(tokens::Mode::CodexText as u8)
            .text(&cur.thread_id)
            .text(cur.source_token.as_str())
            .raw(cur.encode(&key()));
        c.script(t, &format!("codex-cursor-{i}"), &w);
        let mut w = ScriptWriter::new();
        w.byte(tokens::Mode::CodexPayload as u8)
            .raw(serde_json::to_vec(cur).expect("cursor JSON"));
        c.script(t, &format!("codex-payload-{i}"), &w);
    }
    let sessions = real.claude_sessions();
    let uuids = real.claude_uuids();
    for (i, session) in sessions.iter().enumerate() {
        let before = uuids
            .get(i * 7 % uuids.len().max(1))
            .cloned()
            .unwrap_or_default();
        let cur = ClaudeCursor {
            session: session.clone(),
            before: before.clone(),
            anchor: block_key(BlockType::User, &format!("{before}-anchor")),
            revision: i as u64 + 2,
        };
        let mut w = ScriptWriter::new();
        w.byte(tokens::Mode::ClaudeText as u8)
            .text(session)
            .raw(cur.encode(&key()));
        c.script(t, &format!("claude-cursor-{i}"), &w);
        let mut w = ScriptWriter::new();
        w.byte(tokens::Mode::ClaudePayload as u8)
            .raw(serde_json::to_vec(&cur).expect("cursor JSON"));
        c.script(t, &format!("claude-payload-{i}"), &w);
    }
    let anchors = [
        AnchorToken::Link(LinkPlace {
            app_session_id: sessions.first().cloned(),
            thread_id: None,
            row: block_key(
                BlockType::User,
                &format!(
                    "user-message::{}",
                    uuids.first().cloned().unwrap_or_default()
                ),
            ),
        }),
        AnchorToken::Link(LinkPlace {
            app_session_id: None,
            thread_id: threads.first().cloned(),
            row: block_key(
                BlockType::Activity,
                items.first().map_or("item-1", String::as_str),
            ),
        }),
        AnchorToken::Newer(NewerPlace {
            target: threads.first().cloned().unwrap_or_default(),
            source_token: BoundaryToken::codex_rollout(&rollout),
            after: block_key(
                BlockType::AgentReply,
                items.last().map_or("item-2", String::as_str),
            ),
            position: Some("line:120".into()),
        }),
    ];
    for (i, a) in anchors.iter().enumerate() {
        let text = a.encode(&key());
        let mut w = ScriptWriter::new();
        w.byte(tokens::Mode::AnchorText as u8).raw(&text);
        c.script(t, &format!("anchor-token-{i}"), &w);
        let mut w = ScriptWriter::new();
        w.byte(tokens::Mode::AnchorPayload as u8)
            .raw(serde_json::to_vec(a).expect("anchor JSON"));
        c.script(t, &format!("anchor-payload-{i}"), &w);
        let wire = if i == 2 {
            Anchor::Newer { token: text }
        } else {
            Anchor::Link { token: text }
        };
        let mut w = ScriptWriter::new();
        w.byte(tokens::Mode::WireAnchor as u8)
            .raw(serde_json::to_vec(&wire).expect("anchor JSON"));
        c.script(t, &format!("wire-anchor-{i}"), &w);
    }
    let row = Anchor::row(&block_key(
        BlockType::Activity,
        items.first().map_or("item-1", String::as_str),
    ));
    let mut w = ScriptWriter::new();
    w.byte(tokens::Mode::WireAnchor as u8)
        .raw(serde_json::to_vec(&row).expect("anchor JSON"));
    c.script(t, "wire-anchor-row", &w);
    let texts = [
        block_key(BlockType::User, "user-message::op-1").encoded(),
        block_key(
            BlockType::Thinking,
            &format!("thinking-{}", uuids.first().cloned().unwrap_or_default()),
        )
        .encoded(),
        BoundaryToken::codex_rollout(&rollout).as_str().to_owned(),
        rollout.clone(),
    ];
    for (i, text) in texts.iter().enumerate() {
        let mut w = ScriptWriter::new();
        w.byte(tokens::Mode::KeysAndHex as u8).raw(text);
        c.script(t, &format!("keys-and-hex-{i}"), &w);
    }
}

fn timeline_corpus(c: &mut Corpus, real: &Real) {
    let t = "timeline";
    // A scripted host session: history, live rows, a pending send, an older page and an
    // anchored load, each answer as the JSON a client receives.
    for (n, desktop) in [(30usize, false), (5, true)] {
        let mut host = SimHost::new(timeline::TARGETS[0]);
        host.append_history(n);
        let mut w = ScriptWriter::new();
        timeline::write_mode(&mut w, desktop);
        let op = OperationId::new("op-1").expect("not blank");
        let snapshot = host.stream_user_message(&op);
        timeline::write_add_pending(&mut w, 1, 20);
        let (window, _) = host.latest_window_sized(12);
        let json = serde_json::to_string(&window).expect("window JSON");
        timeline::write_raw_answer(&mut w, timeline::Op::LatestRaw, &json);
        timeline::write_raw_live(
            &mut w,
            &serde_json::to_string(&snapshot).expect("overlay JSON"),
        );
        let live = host.stream_live(block_key(BlockType::Activity, "live-1"), None);
        timeline::write_raw_live(&mut w, &serde_json::to_string(&live).expect("overlay JSON"));
        if let Some(cursor) = &window.oldest_cursor {
            timeline::write_request(&mut w, 0, "");
            let page = host.older_page(cursor);
            timeline::write_raw_answer(
                &mut w,
                timeline::Op::OlderRaw,
                &serde_json::to_string(&page).expect("page JSON"),
            );
        }
        host.save_to_history(&BlockKey::user_message(&op));
        let (settled, _) = host.latest_window_sized(12);
        timeline::write_request(&mut w, 1, "");
        timeline::write_raw_answer(
            &mut w,
            timeline::Op::LatestRaw,
            &serde_json::to_string(&settled).expect("window JSON"),
        );
        let first = settled.blocks.first().map(|b| b.key());
        if let Some(first) = first {
            let token = host.link_token(&first);
            timeline::write_request(&mut w, 5, &token);
            if let Ok(anchored) = host.anchored(&Anchor::Link { token }) {
                timeline::write_raw_answer(
                    &mut w,
                    timeline::Op::AnchoredRaw,
                    &serde_json::to_string(&anchored).expect("window JSON"),
                );
            }
        }
        timeline::write_timeout(&mut w, 200_000);
        c.script(t, &format!("sim-host-{n}"), &w);
    }
    // A window of real transcript rows: real IDs, real texts, real operation IDs.
    let mut blocks = Vec::new();
    for (i, v) in real.transcripts().take(40).enumerate() {
        let (Some(ty), Some(uuid)) = (
            v.get("type").and_then(Value::as_str),
            v.get("uuid").and_then(Value::as_str),
        ) else {
            continue;
        };
        let block_type = match ty {
            "user" => BlockType::User,
            "assistant" => BlockType::AgentReply,
            "system" => BlockType::System,
            _ => BlockType::Activity,
        };
        let text: String = v
            .pointer("/message/content")
            .map(|c| c.to_string())
            .unwrap_or_default()
            .chars()
            .take(160)
            .collect();
        blocks.push(json!({
            "type": block_type.as_str(),
            "id": uuid,
            "timestamp": 1_756_860_439_000u64 + 1_000 * i as u64,
            "sourceOrder": [0, 1, i, 0],
            "data": { "text": text },
        }));
    }
    let session = real
        .claude_sessions()
        .first()
        .cloned()
        .unwrap_or("session-1".into());
    let window = json!({
        "blocks": blocks,
        "oldestCursor": "cursor-0",
        "boundaryToken": session,
        "windowRevision": 1,
        "liveOverlay": { "settlementEpoch": 1, "revision": 7, "blocks": [] },
    });
    let mut w = ScriptWriter::new();
    timeline::write_mode(&mut w, false);
    timeline::write_raw_answer(&mut w, timeline::Op::LatestRaw, &window.to_string());
    timeline::write_request(&mut w, 0, "");
    c.script(t, "real-transcript-window", &w);
}

fn history_corpus(c: &mut Corpus, real: &Real) {
    let t = "history";
    let (codex, claude) = real.delta_events();
    let samples = [
        ("codex-recording", codex),
        ("claude-stream", claude),
        (
            "codex-sample",
            fixtures::history::convert_sample(fixtures::history::CODEX_SAMPLE, |v, seq| {
                fixtures::history::codex_delta(v, seq, "t-1")
            }),
        ),
        (
            "claude-sample",
            fixtures::history::convert_sample(fixtures::history::CLAUDE_SAMPLE, |v, seq| {
                fixtures::history::claude_delta(v, seq, 1_000 + seq, "msg_1")
            }),
        ),
        (
            "synthetic-tail",
            fixtures::history::synthetic_tail_page(7)
                .into_iter()
                .take(200)
                .collect(),
        ),
    ];
    for (name, events) in &samples {
        let records = pack(events).expect("real events pack");
        let page = HistoryPage {
            records: records.clone(),
        };
        let mut w = ScriptWriter::new();
        history::write_json(
            &mut w,
            history::Mode::PageJson,
            &serde_json::to_vec(&page).expect("page JSON"),
        );
        c.script(t, &format!("{name}-page"), &w);
        let mut buf = Vec::new();
        write_packed_page(events, &mut buf).expect("packed page");
        let mut w = ScriptWriter::new();
        history::write_json(&mut w, history::Mode::PageJson, &buf);
        c.script(t, &format!("{name}-written-page"), &w);
        let mut w = ScriptWriter::new();
        history::write_json(
            &mut w,
            history::Mode::EventsJson,
            &serde_json::to_vec(events).expect("events JSON"),
        );
        c.script(t, &format!("{name}-events"), &w);
        for (i, r) in records
            .iter()
            .enumerate()
            .filter(|(_, r)| matches!(r, SessionHistoryRecord::Chunks(_)))
            .take(3)
        {
            if let SessionHistoryRecord::Chunks(row) = r {
                let mut w = ScriptWriter::new();
                history::write_json(
                    &mut w,
                    history::Mode::RowJson,
                    &serde_json::to_vec(row).expect("row JSON"),
                );
                c.script(t, &format!("{name}-row-{i}"), &w);
            }
        }
        // The journal: the newer half first, then the older half, then a live event
        // and a duplicate of it.
        let mid = events.len() / 2;
        let mut w = ScriptWriter::new();
        history::write_journal_start(&mut w);
        for part in [&events[mid..], &events[..mid]] {
            let page = HistoryPage {
                records: pack(part).expect("real events pack"),
            };
            history::write_journal_page(&mut w, &serde_json::to_vec(&page).expect("page JSON"));
        }
        if let Some(last) = events.last() {
            let mut next = last.clone();
            next.seq += 1;
            let live = serde_json::to_vec(&next).expect("event JSON");
            history::write_journal_live(&mut w, &live);
            history::write_journal_live(&mut w, &live);
        }
        c.script(t, &format!("{name}-journal"), &w);
    }
}

fn overlay_replay_corpus(c: &mut Corpus, real: &Real) {
    let t = "overlay_replay";
    let event_kind = |v: &Value| -> u8 {
        match v.get("method").and_then(Value::as_str) {
            Some(m) if m.ends_with("requestApproval") => 1,
            Some("thread/started") => 0,
            _ => 2,
        }
    };
    let sets: [(&str, Vec<&Value>); 3] = [
        ("codex-recording", real.codex().take(60).collect()),
        ("claude-transcript", real.transcripts().take(40).collect()),
        ("codex-rollout", real.rollout().iter().take(30).collect()),
    ];
    for (name, lines) in &sets {
        for (config, small) in [("default", false), ("small-chunks", true)] {
            let mut w = ScriptWriter::new();
            if small {
                overlay_replay::write_small_config(&mut w, 24, 64 * 1024, 1024);
            } else {
                overlay_replay::write_default_config(&mut w);
            }
            overlay_replay::write_append(&mut w, 0, r#"{"type":"session_init"}"#);
            for v in lines {
                overlay_replay::write_append(&mut w, event_kind(v), &v.to_string());
            }
            overlay_replay::write_replay(&mut w);
            c.script(t, &format!("{name}-{config}"), &w);
        }
    }
}

fn client_replay_corpus(c: &mut Corpus, real: &Real) {
    let t = "client_replay";
    // What the host writes: replay chunks of a session with real texts.
    let s = SessionId::new("s1").expect("not blank");
    let texts = real.user_texts();
    let (_, claude) = real.delta_events();
    let fragments: Vec<String> = claude
        .iter()
        .filter_map(|e| e.as_delta().map(|(_, _, t)| t.to_owned()))
        .collect();
    for (name, chunk_bytes) in [("one-chunk", 256 * 1024), ("many-chunks", 700)] {
        let mut b = ReplayBuffers::new(ReplayConfig {
            chunk_bytes,
            ..ReplayConfig::default()
        });
        b.append(
            &s,
            EventKind::Init,
            r#"{"type":"session_init"}"#.into(),
            Millis(0),
        )
        .expect("an object");
        for (i, text) in texts.iter().take(4).enumerate() {
            let text: String = text.chars().take(200).collect();
            b.append_user_message(&s, &text, Some(&format!("c-{}", i % 3)), Millis(1));
            for f in fragments.iter().skip(i * 3).take(6) {
                b.append_value(
                    &s,
                    EventKind::Other,
                    &json!({"type": "assistant_delta", "text": f}),
                    Millis(2),
                )
                .expect("an object");
            }
        }
        b.append_value(
            &s,
            EventKind::Approval {
                request_id: "req-1".into(),
            },
            &json!({"type": "approval_request", "requestId": "req-1", "text": "Approve command"}),
            Millis(3),
        )
        .expect("an object");
        b.decide_approval(&s, "req-1", true);
        b.set_running(
            &s,
            RunningState {
                running: true,
                run_id: Some("run-1".into()),
            },
            Millis(4),
        )
        .expect("a small running state");
        let mut w = ScriptWriter::new();
        client_replay::write_send(&mut w, 0, "pending text");
        for chunk in b.replay(&s) {
            client_replay::write_chunk(&mut w, &chunk.json);
        }
        let next = b
            .append_value(
                &s,
                EventKind::Other,
                &json!({"type": "run_state", "running": false}),
                Millis(5),
            )
            .expect("an object");
        if let Some(live) = b.event(&s, next) {
            client_replay::write_live(&mut w, &live);
            client_replay::write_live(&mut w, &live);
        }
        c.script(t, name, &w);
    }
}

fn envelope_corpus(c: &mut Corpus, real: &Real) {
    let t = "envelope";
    let sessions = real.claude_sessions();
    let texts = real.user_texts();
    for (i, body) in texts.iter().take(6).enumerate() {
        let session = sessions
            .get(i % sessions.len().max(1))
            .cloned()
            .unwrap_or("s-1".into());
        let title: String = texts
            .get(i + 1)
            .map(|t| {
                t.lines()
                    .next()
                    .unwrap_or_default()
                    .chars()
                    .take(36)
                    .collect()
            })
            .unwrap_or_default();
        let sender = EnvelopeSender {
            session_id: SessionId::new(session.clone()).expect("not blank"),
            title: title.clone(),
            agent: if i % 2 == 0 {
                AgentKind::Claude
            } else {
                AgentKind::Codex
            },
        };
        let text = outbox_core::envelope::envelope(envelope::PRODUCT, &sender, body);
        let mut w = ScriptWriter::new();
        envelope::write_parse(&mut w, &text);
        c.script(t, &format!("parse-{i}"), &w);
        let mut w = ScriptWriter::new();
        envelope::write_build(
            &mut w,
            envelope::PRODUCT,
            &session,
            &title,
            body,
            i % 2 == 0,
        );
        c.script(t, &format!("build-{i}"), &w);
    }
}

fn rows_corpus(c: &mut Corpus, real: &Real) {
    let t = "rows";
    for sample in fixtures::rows::samples() {
        let mut w = ScriptWriter::new();
        rows::write_rest(
            &mut w,
            rows::Mode::RowJson,
            &serde_json::to_vec(&sample.row).expect("row JSON"),
        );
        c.script(t, &format!("sample-{}", sample.name), &w);
        if let Some(fact) = &sample.row.message {
            let mut w = ScriptWriter::new();
            rows::write_rest(
                &mut w,
                rows::Mode::FactJson,
                &serde_json::to_vec(fact).expect("fact JSON"),
            );
            c.script(t, &format!("fact-{}", sample.name), &w);
        }
    }
    for (i, row) in real.codex_rows().iter().enumerate() {
        let mut w = ScriptWriter::new();
        rows::write_rest(
            &mut w,
            rows::Mode::RowJson,
            &serde_json::to_vec(row).expect("row JSON"),
        );
        c.script(t, &format!("codex-row-{i}"), &w);
    }
    let results = real.tool_results();
    for (i, (tool, input)) in real.tool_uses().iter().take(12).enumerate() {
        let arg = input
            .get("command")
            .or_else(|| input.get("file_path"))
            .or_else(|| input.get("pattern"))
            .and_then(Value::as_str)
            .map_or_else(|| input.to_string(), str::to_owned);
        let output: String = results
            .get(i)
            .map(|r| r.chars().take(4_000).collect())
            .unwrap_or_default();
        let mut w = ScriptWriter::new();
        rows::write_constructors(&mut w, &arg, tool, &output);
        c.script(t, &format!("claude-tool-{i}"), &w);
    }
    for (i, req) in real.approvals().iter().enumerate() {
        let mut w = ScriptWriter::new();
        rows::write_rest(&mut w, rows::Mode::CardParse, req.card_id().as_bytes());
        c.script(t, &format!("card-id-{i}"), &w);
        let mut w = ScriptWriter::new();
        rows::write_rest(
            &mut w,
            rows::Mode::ApprovalJson,
            &serde_json::to_vec(req).expect("request JSON"),
        );
        c.script(t, &format!("approval-{i}"), &w);
        let mut w = ScriptWriter::new();
        w.byte(rows::Mode::CardBuild as u8)
            .text(&req.request_id)
            .text(&req.thread_id)
            .text(&req.turn_id)
            .text(&req.item_id);
        c.script(t, &format!("card-build-{i}"), &w);
    }
}

fn notice(real_dir: &Path) -> String {
    let mut out = String::from(
        "Seed corpus notice\n\
         ==================\n\n\
         The seeds under this directory are written by fuzz/examples/make_corpus.rs. Some hold\n\
         values taken from the public data files below (IDs, delta fragments, commands, outputs,\n\
         file paths, message texts, whole JSON lines), copied from shared/real-data, whose\n\
         PROVENANCE.md records their origin, commit and licence. Each is MIT licensed; the\n\
         licence and copyright notice of each source follow.\n\n",
    );
    let mut licences: Vec<&str> = Vec::new();
    for (file, licence, what) in SOURCES {
        out.push_str(&format!("- {file}\n  from {what}\n  licence: {licence}\n"));
        if !licences.contains(&licence) {
            licences.push(licence);
        }
    }
    for licence in licences {
        let text = fs::read_to_string(real_dir.join(licence))
            .unwrap_or_else(|e| panic!("read {licence}: {e}"));
        out.push_str(&format!("\n---- {licence} ----\n\n{}\n", text.trim_end()));
    }
    out
}

/// The wire's example requests (one per method), and frames at its edges.
fn wire_corpus(c: &mut Corpus, manifest: &Path) {
    let t = "wire";
    let dir = manifest.join("../host-wire/schema/1/examples/requests");
    let mut names: Vec<PathBuf> = fs::read_dir(&dir)
        .expect("the wire's examples")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    names.sort();
    for path in names {
        let name = path.file_name().expect("a file").to_string_lossy().into_owned();
        c.put(t, &name, &fs::read(&path).expect("an example"));
    }
    for (name, text) in [
        ("not-json", "{"),
        ("no-id", r#"{"jsonrpc":"2.0","method":"run.list"}"#),
        ("page-641", r#"{"jsonrpc":"2.0","id":1,"method":"run.chatLoad","params":{"appSessionId":"s","pageSize":641}}"#),
        ("blank-anchor", r#"{"jsonrpc":"2.0","id":1,"method":"run.chatLoad","params":{"appSessionId":"s","anchor":{"kind":"row","row":{"type":"user","id":" "}}}}"#),
    ] {
        c.put(t, name, text.as_bytes());
    }
}

fn main() {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut args = std::env::args().skip(1);
    let root = args
        .next()
        .map_or_else(|| manifest.join("corpus"), PathBuf::from);
    let real_dir = args
        .next()
        .map_or_else(|| manifest.join("../../shared/real-data"), PathBuf::from);
    let real = Real::load(&real_dir);
    for (target, _) in custody_fuzz::targets::ALL {
        let dir = root.join(target);
        if dir.exists() {
            fs::remove_dir_all(&dir).expect("clear corpus dir");
        }
    }
    let mut c = Corpus {
        root: root.clone(),
        files: 0,
        bytes: 0,
    };
    tokens_corpus(&mut c, &real);
    timeline_corpus(&mut c, &real);
    history_corpus(&mut c, &real);
    overlay_replay_corpus(&mut c, &real);
    client_replay_corpus(&mut c, &real);
    envelope_corpus(&mut c, &real);
    rows_corpus(&mut c, &real);
    wire_corpus(&mut c, &manifest);
    fs::write(root.join("NOTICE"), notice(&real_dir)).expect("write NOTICE");
    println!(
        "{} seeds, {} bytes, in {}",
        c.files,
        c.bytes,
        root.display()
    );
}
