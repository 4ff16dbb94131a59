//! Every Claude recording of the shared real-data folder, read end to end: a census of
//! each file's lines by type (each parsed or deliberately skipped, unknown ones named),
//! one reply per `message.id`, tool results joined to their calls, delivery proofs for
//! every user message, and the torn-line and paging contracts on real bytes.
//!
//! The files are read from the copies in `tests/data/` (MIT, licence texts beside them),
//! else from `../../shared/real-data/`; a file found in neither fails the test saying
//! so. The expected numbers were counted independently with `jq` over the same files.

#![allow(clippy::disallowed_methods)] // a test of real files reads them

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;

use agent_claude::project::{Output, Projector};
use agent_claude::proof::history_read;
use agent_claude::stream::{MessageUuid, StreamDecoder};
use agent_claude::transcript::{ItemKind, Transcript};
use outbox_core::adapter::HistoryRead;
use timeline_core::history::DeltaKind;
use timeline_core::key::BlockType;
use timeline_core::time::Millis;

fn shared_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/real-data")
}

fn copies_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

fn read(rel: &str) -> Vec<u8> {
    let copy = copies_dir().join(rel);
    let shared = shared_dir().join(rel);
    std::fs::read(&copy)
        .or_else(|_| std::fs::read(&shared))
        .unwrap_or_else(|e| {
            panic!(
                "the Claude recording {rel} is missing: neither {} nor {} can be read ({e})",
                copy.display(),
                shared.display()
            )
        })
}

/// One transcript and what `jq` counted in it.
struct Expect {
    file: &'static str,
    lines: u64,
    /// Lines by type (`system/<subtype>` for system lines).
    census: &'static [(&'static str, u64)],
    /// Types this crate does not know (synthetic coverage fixture only).
    unknown: &'static [&'static str],
    /// Distinct `message.id`s.
    messages: usize,
    /// Messages with non-blank text / non-blank thinking.
    replies: usize,
    thinking: usize,
    /// `tool_use` blocks, and `tool_result`s whose call is not in the file.
    tool_uses: usize,
    orphan_results: u64,
    versions: &'static [&'static str],
}

const TRANSCRIPTS: &[Expect] = &[
    Expect {
        file: "claude-code-viewer/1af7fc5e-8455-4414-9ccd-011d40f70b2a.jsonl",
        lines: 29,
        census: &[("assistant", 15), ("user", 14)],
        unknown: &[],
        messages: 7,
        replies: 3,
        thinking: 0,
        tool_uses: 12,
        orphan_results: 0,
        versions: &["1.0.98"],
    },
    Expect {
        file: "claude-code-viewer/5c0375b4-57a5-4f26-b12d-d022ee4e51b7.jsonl",
        lines: 53,
        census: &[("assistant", 28), ("user", 25)],
        unknown: &[],
        messages: 20,
        replies: 7,
        thinking: 0,
        tool_uses: 21,
        orphan_results: 0,
        versions: &["1.0.108"],
    },
    Expect {
        file: "claude-code-viewer/agent-test-hash-123.jsonl",
        lines: 2,
        census: &[("assistant", 1), ("user", 1)],
        unknown: &[],
        messages: 1,
        replies: 1,
        thinking: 0,
        tool_uses: 0,
        orphan_results: 0,
        versions: &["2.0.28"],
    },
    Expect {
        file: "spotter/ae4a77f8-aedd-4bc1-888f-c94edc91af04.lines1461-1540.excerpt.jsonl",
        lines: 80,
        census: &[
            ("assistant", 15),
            ("file-history-snapshot", 3),
            ("progress", 47),
            ("system/compact_boundary", 1),
            ("system/stop_hook_summary", 1),
            ("system/turn_duration", 1),
            ("user", 12),
        ],
        unknown: &[],
        messages: 6,
        replies: 5,
        thinking: 2,
        tool_uses: 7,
        orphan_results: 1,
        versions: &["2.1.39"],
    },
    Expect {
        file: "spotter/ae4a77f8-aedd-4bc1-888f-c94edc91af04_subagents_agent-aac57f5.jsonl",
        lines: 40,
        census: &[("assistant", 15), ("progress", 12), ("user", 13)],
        unknown: &[],
        messages: 3,
        replies: 3,
        thinking: 0,
        tool_uses: 12,
        orphan_results: 0,
        versions: &["2.1.39"],
    },
    Expect {
        file: "spotter/ae4a77f8-aedd-4bc1-888f-c94edc91af04_subagents_agent-acompact-946d2b.jsonl",
        lines: 2,
        census: &[("assistant", 1), ("user", 1)],
        unknown: &[],
        messages: 1,
        replies: 1,
        thinking: 0,
        tool_uses: 0,
        orphan_results: 0,
        versions: &["2.1.39"],
    },
    Expect {
        file: "spotter/short.jsonl",
        lines: 15,
        census: &[
            ("assistant", 5),
            ("file-history-snapshot", 1),
            ("progress", 3),
            ("system/local_command", 2),
            ("user", 4),
        ],
        unknown: &[],
        messages: 1,
        replies: 1,
        thinking: 1,
        tool_uses: 2,
        orphan_results: 0,
        versions: &["2.1.38"],
    },
    Expect {
        file: "spotter/tool_heavy.jsonl",
        lines: 39,
        census: &[
            ("assistant", 9),
            ("file-history-snapshot", 3),
            ("progress", 10),
            ("queue-operation", 2),
            ("system/local_command", 2),
            ("user", 13),
        ],
        unknown: &[],
        messages: 4,
        replies: 1,
        thinking: 1,
        tool_uses: 6,
        orphan_results: 0,
        versions: &["2.1.38"],
    },
    Expect {
        file: "agent-sessions/claude-small.jsonl",
        lines: 89,
        census: &[
            ("agent-name", 1),
            ("ai-title", 1),
            ("assistant", 10),
            ("atis-latch", 1),
            ("attachment", 38),
            ("bridge-session", 1),
            ("custom-title", 1),
            ("file-history-snapshot", 1),
            ("frame-link", 1),
            ("last-prompt", 1),
            ("mode", 1),
            ("permission-mode", 1),
            ("pr-link", 1),
            ("progress", 1),
            ("queue-operation", 1),
            ("relocated", 1),
            ("result", 1),
            ("started", 1),
            ("summary", 1),
            ("system/api_error", 4),
            ("system/api_refusal", 1),
            ("system/compact_boundary", 2),
            ("system/error", 1),
            ("system/model_refusal_fallback", 1),
            ("system/session_start", 1),
            ("system/stop_hook_summary", 1),
            ("system/turn_duration", 1),
            ("user", 10),
            ("worktree-state", 2),
        ],
        // Undocumented record kinds of the synthetic fixture: skipped and counted
        // (`atis-latch` is known since Claude Code 2.1.328 wrote it in real runs).
        unknown: &["relocated", "result", "started"],
        // Three assistant lines carry no message.id: each is a reply of its own. Two
        // tool results name a blank tool_use_id: they join no call and are counted.
        messages: 5,
        replies: 5,
        thinking: 3,
        tool_uses: 3,
        orphan_results: 2,
        versions: &[
            "2.1.111",
            "2.1.112",
            "2.1.161",
            "2.1.220",
            "2.1.80",
            "[trimmed for fixture]",
        ],
    },
];

const STREAMS: &[&str] = &["anyagent-rs/claude-stream-json/01-single-prompt.jsonl"];

fn read_transcript(file: &str) -> Transcript {
    let bytes = read(file);
    let mut t = Transcript::new();
    let used = t.feed(&bytes);
    assert_eq!(
        used,
        bytes.len(),
        "{file}: every byte of a finished file is read"
    );
    t
}

fn census(t: &Transcript) -> BTreeMap<String, u64> {
    let d = t.diagnostics();
    let mut all = BTreeMap::new();
    for tally in [&d.parsed, &d.skipped, &d.unknown] {
        for (label, n) in tally.iter() {
            *all.entry(label.to_owned()).or_insert(0) += n;
        }
    }
    all
}

// Every Claude file of the shared folder is one of the files below, and the copy in
// the repository is byte for byte the shared one.
#[test]
fn every_shared_claude_file_is_covered_and_copied_verbatim() {
    let known: HashSet<&str> = TRANSCRIPTS
        .iter()
        .map(|e| e.file)
        .chain(STREAMS.iter().copied())
        .collect();
    for f in &known {
        assert!(
            copies_dir().join(f).exists(),
            "{f} has no copy in tests/data (a fresh clone could not run this suite)"
        );
    }
    let shared = shared_dir();
    if !shared.exists() {
        // A fresh clone: the copies above are the recordings.
        return;
    }
    let mut found = Vec::new();
    for dir in [
        "anyagent-rs/claude-stream-json",
        "claude-code-viewer",
        "spotter",
        "agent-sessions",
    ] {
        // Another tree of shared data may lack a folder: nothing to compare there.
        let Ok(entries) = std::fs::read_dir(shared.join(dir)) else {
            continue;
        };
        for entry in entries {
            let name = entry.expect("a directory entry").file_name();
            let name = name.to_string_lossy();
            if name.ends_with(".jsonl") && !(dir == "agent-sessions" && name.starts_with("codex")) {
                found.push(format!("{dir}/{name}"));
            }
        }
    }
    found.sort();
    for f in &found {
        let b = std::fs::read(shared.join(f)).expect("the shared file");
        if known.contains(f.as_str()) {
            let a = std::fs::read(copies_dir().join(f)).expect("the copy");
            assert!(a == b, "{f}: the copy differs from the shared recording");
        } else {
            // A file the census does not know: read end to end, every line typed or
            // counted, never a panic.
            let mut t = Transcript::new();
            let used = t.feed(&b);
            let mut decoder = StreamDecoder::new();
            for line in b.split(|c| *c == b'\n') {
                std::hint::black_box(decoder.decode(line));
            }
            eprintln!(
                "{f}: not in the census; read {used} of {} bytes, {} items",
                b.len(),
                t.items().len()
            );
        }
    }
}

// Census: every line of every transcript is parsed or deliberately skipped; unknown
// kinds are named; nothing is malformed; the stated versions are read.
#[test]
fn transcript_census() {
    for e in TRANSCRIPTS {
        let t = read_transcript(e.file);
        let d = t.diagnostics();
        assert_eq!(d.lines, e.lines, "{}: lines", e.file);
        assert_eq!(
            d.accounted(),
            d.lines,
            "{}: every line counted once",
            e.file
        );
        assert_eq!(d.malformed, 0, "{}: {:?}", e.file, d.first_malformed);
        let expected: BTreeMap<String, u64> = e
            .census
            .iter()
            .map(|(k, v)| ((*k).to_owned(), *v))
            .collect();
        assert_eq!(census(&t), expected, "{}: census", e.file);
        let unknown: Vec<&str> = d.unknown.iter().map(|(k, _)| k).collect();
        assert_eq!(unknown, e.unknown, "{}: unknown kinds", e.file);
        let versions: Vec<&str> = d.versions.iter().map(String::as_str).collect();
        assert_eq!(versions, e.versions, "{}: versions", e.file);
        assert_eq!(
            d.unknown_parts.get("tool_result/without-call"),
            e.orphan_results,
            "{}: tool results without their call",
            e.file
        );
    }
}

// Claude writes one line per content block: the lines of one message.id come out as
// one item, with one reply row, one thinking row and one row per tool call.
#[test]
fn one_reply_per_message_id() {
    for e in TRANSCRIPTS {
        let t = read_transcript(e.file);
        let replies: Vec<&str> = t
            .items()
            .iter()
            .filter_map(|i| match &i.kind {
                ItemKind::Reply(r) => Some(r.message_id.as_str()),
                _ => None,
            })
            .collect();
        let distinct: HashSet<&str> = replies.iter().copied().collect();
        assert_eq!(
            replies.len(),
            distinct.len(),
            "{}: a message split over items",
            e.file
        );
        assert_eq!(replies.len(), e.messages, "{}: messages", e.file);
        let mut rows: std::collections::HashMap<BlockType, usize> =
            std::collections::HashMap::new();
        let mut keys = HashSet::new();
        for (ordinal, item) in t.items().iter().enumerate() {
            for b in item.blocks(ordinal as u64) {
                assert!(
                    keys.insert(b.key()),
                    "{}: duplicate row {}",
                    e.file,
                    b.key()
                );
                *rows.entry(b.block_type).or_insert(0) += 1;
            }
        }
        let count = |t| rows.get(&t).copied().unwrap_or(0);
        assert_eq!(
            count(BlockType::AgentReply),
            e.replies,
            "{}: reply rows",
            e.file
        );
        assert_eq!(
            count(BlockType::Thinking),
            e.thinking,
            "{}: thinking rows",
            e.file
        );
        assert_eq!(
            count(BlockType::Activity),
            e.tool_uses,
            "{}: tool rows",
            e.file
        );
    }
}

// Tool calls are joined with their results: every result whose call is in the file
// lands on that call's row, which is then no longer in progress.
#[test]
fn tool_calls_are_joined_with_their_results() {
    for e in TRANSCRIPTS {
        let t = read_transcript(e.file);
        let bytes = read(e.file);
        let mut results = 0usize;
        for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let v: serde_json::Value = serde_json::from_slice(line).expect("JSON");
            if let Some(parts) = v["message"]["content"].as_array() {
                results += parts.iter().filter(|p| p["type"] == "tool_result").count();
            }
        }
        let joined: usize = t
            .items()
            .iter()
            .filter_map(|i| match &i.kind {
                ItemKind::Reply(r) => Some(r.tools.iter().filter(|c| c.result.is_some()).count()),
                _ => None,
            })
            .sum();
        assert_eq!(
            joined as u64 + e.orphan_results,
            results as u64,
            "{}: joined results",
            e.file
        );
    }
}

// OB-08 (Claude proof): every user entry of every transcript is found by its UUID in a
// history read; a UUID the transcript does not hold is missing.
#[test]
fn delivery_proofs_for_every_user_message() {
    for e in TRANSCRIPTS {
        let t = read_transcript(e.file);
        let bytes = read(e.file);
        let mut users = 0;
        for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let v: serde_json::Value = serde_json::from_slice(line).expect("JSON");
            if v["type"] == "user" {
                let uuid = v["uuid"].as_str().expect("a user entry has a uuid");
                users += 1;
                assert!(t.has_user_message(uuid), "{}: {uuid}", e.file);
                if let Ok(u) = MessageUuid::parse(uuid) {
                    assert_eq!(history_read(&t, &u), HistoryRead::Found, "{}", e.file);
                }
            }
        }
        assert!(users > 0, "{}: no user entry", e.file);
        let absent = MessageUuid::parse("00000000-0000-4000-8000-000000000000").expect("uuid");
        assert_eq!(history_read(&t, &absent), HistoryRead::Missing);
    }
}

// A torn last line is left for the next read: cutting a real file anywhere and feeding
// the rest later gives the same items and counts as reading it whole.
#[test]
fn torn_lines_wait_for_the_next_read() {
    for e in TRANSCRIPTS {
        let bytes = read(e.file);
        let whole = read_transcript(e.file);
        let step = (bytes.len() / 17).max(1);
        for cut in (1..bytes.len()).step_by(step) {
            let mut t = Transcript::new();
            let used = t.feed(&bytes[..cut]);
            assert!(used <= cut);
            let rest = &bytes[used..];
            assert_eq!(t.feed(rest), rest.len(), "{} cut at {cut}", e.file);
            assert_eq!(t.items(), whole.items(), "{} cut at {cut}", e.file);
            assert_eq!(
                t.diagnostics(),
                whole.diagnostics(),
                "{} cut at {cut}",
                e.file
            );
        }
    }
}

// TL-09: paging by the `before` UUID walks the saved history back to its start (the
// last compaction) without gaps or overlaps; a UUID before the compaction is gone.
#[test]
fn pages_by_before_uuid_cover_the_saved_history() {
    for e in TRANSCRIPTS {
        let t = read_transcript(e.file);
        let visible: Vec<u64> = t.visible_items().map(|(o, _)| o).collect();
        let mut seen = Vec::new();
        let mut before: Option<String> = None;
        loop {
            let page = t.page_before(before.as_deref(), 3).expect("a page");
            seen.extend(page.items.iter().map(|(o, _)| *o));
            match page.items.last() {
                Some((_, item)) if page.more => before = Some(item.position.clone()),
                _ => break,
            }
        }
        seen.reverse();
        assert_eq!(seen, visible, "{}", e.file);
    }
    // The excerpt's compaction (its line 21) starts the saved history.
    let t = read_transcript(TRANSCRIPTS[3].file);
    let (_, first) = t.visible_items().next().expect("saved history");
    assert!(
        matches!(&first.kind, ItemKind::System { subtype, .. } if subtype == "compact_boundary")
    );
    let older = &t.items()[0].position;
    assert!(
        t.page_before(Some(older), 3).is_err(),
        "before the compaction: gone"
    );
}

// The stream-json recording: census of every line (with unknown top-level fields
// audited), the version, and its projection: two text deltas on the packed path, one
// reply row with the whole text, the turn's end, and no delivery evidence (the prompt
// was given on the command line, so no line names a sent UUID).
#[test]
fn stream_recording_census_and_projection() {
    let bytes = read(STREAMS[0]);
    let mut dec = StreamDecoder::new().audit_fields(true);
    let mut p = Projector::new("session-1", 100);
    for (i, line) in bytes
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .enumerate()
    {
        if let Some(l) = dec.decode(line) {
            p.handle_line(&l, Millis(1_000 + i as u64));
        }
    }
    let d = dec.diagnostics();
    assert_eq!(d.lines, 14);
    assert_eq!(d.accounted(), 14);
    assert!(d.all_understood(), "{d:?}");
    assert!(
        d.unknown_parts.is_empty() && d.unknown_fields.is_empty(),
        "{d:?}"
    );
    let parsed: Vec<(&str, u64)> = d.parsed.iter().collect();
    assert_eq!(
        parsed,
        [
            ("assistant", 1),
            ("result/success", 1),
            ("stream_event/content_block_delta", 2),
            ("stream_event/content_block_start", 1),
            ("stream_event/content_block_stop", 1),
            ("stream_event/message_delta", 1),
            ("stream_event/message_start", 1),
            ("stream_event/message_stop", 1),
            ("system/hook_response", 1),
            ("system/hook_started", 1),
            ("system/init", 1),
            ("system/status", 1),
        ]
    );
    assert_eq!(d.skipped.get("rate_limit_event"), 1);
    assert!(d.versions.contains("2.1.241"));

    let out: Vec<Output> = std::iter::from_fn(|| p.poll_effect()).collect();
    let deltas: Vec<(u64, String)> = out
        .iter()
        .filter_map(|o| match o {
            Output::Event(ev) => {
                let (kind, block, text) = ev.as_delta()?;
                assert_eq!(kind, DeltaKind::Text);
                assert_eq!(block, "msg_011CeKAKdZwzjicf9zHtFBnD");
                Some((ev.seq, text.to_owned()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(deltas, [(100, "p".to_owned()), (101, "ong".to_owned())]);
    let rows: Vec<_> = out
        .iter()
        .filter_map(|o| match o {
            Output::Row(b) => Some(b),
            _ => None,
        })
        .collect();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].block_type, BlockType::AgentReply);
    assert_eq!(rows[0].id.as_str(), "msg_011CeKAKdZwzjicf9zHtFBnD");
    assert_eq!(rows[0].data["text"], "pong");
    assert!(matches!(&out[0], Output::Started { version: Some(v), .. } if v == "2.1.241"));
    assert!(
        matches!(out.last(), Some(Output::TurnEnded(r)) if r.result.as_deref() == Some("pong") && !r.is_error)
    );
    assert!(!out.iter().any(|o| matches!(o, Output::Proof(_))));
}

// TL-09, TL-10: the transcript as an overlay-core history source: named by the session
// (or subagent) ID, read newest first by item UUID, forward from a page in the past,
// and a position before the last compaction is gone (empty page, reloadRequired).
#[test]
fn transcript_history_source_pages_by_uuid() {
    use agent_claude::source::TranscriptSource;
    use overlay_core::source::{HistorySource, SourceError, SourceKind, SourcePosition};

    let t = read_transcript(TRANSCRIPTS[3].file);
    let mut src = TranscriptSource {
        target: "ae4a77f8-aedd-4bc1-888f-c94edc91af04".into(),
        transcript: &t,
    };
    assert_eq!(
        src.kind(),
        SourceKind::Claude {
            session: "ae4a77f8-aedd-4bc1-888f-c94edc91af04".into()
        }
    );
    assert_eq!(
        src.boundary_token().as_str(),
        "ae4a77f8-aedd-4bc1-888f-c94edc91af04"
    );
    let newest = src.read(None, 4).expect("newest page");
    assert_eq!(newest.items.len(), 4);
    assert!(newest.more);
    let oldest_loaded = newest.items.last().expect("an item").position.clone();
    let older = src.read(Some(&oldest_loaded), 100).expect("older page");
    assert!(!older.more);
    // Older pages come newest first: forward from the newest of them gives the newest
    // page again; forward from the oldest gives everything after it.
    let next = src
        .read_newer(&older.items[0].position, 100)
        .expect("newer page");
    let positions = |p: &overlay_core::source::SourcePage| {
        p.items
            .iter()
            .map(|i| i.position.clone())
            .collect::<Vec<_>>()
    };
    let mut newest_oldest_first = positions(&newest);
    newest_oldest_first.reverse();
    assert_eq!(positions(&next), newest_oldest_first);
    assert!(!next.more);
    let oldest = &older.items.last().expect("an item").position;
    let all = src.read_newer(oldest, 100).expect("newer page");
    assert_eq!(all.items.len(), older.items.len() - 1 + newest.items.len());
    let before_compaction = SourcePosition(t.items()[0].position.clone());
    assert_eq!(
        src.read(Some(&before_compaction), 4),
        Err(SourceError::PositionGone)
    );
}
