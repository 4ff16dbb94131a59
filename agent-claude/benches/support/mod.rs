//! Bench inputs: large transcripts made by repeating a real one, and a stream of
//! real-shaped text deltas.

#![allow(dead_code)] // each bench uses a part
#![allow(clippy::disallowed_methods, clippy::unwrap_used)] // bench set-up writes files

use std::io::Write;
use std::path::{Path, PathBuf};

/// The real transcript repeated (Claude Code 2.1.38, 39 KB, 13 items: prompts, replies
/// split per content block, tool calls and results, progress lines).
pub const SOURCE: &str = "tests/data/spotter/tool_heavy.jsonl";

fn source_lines() -> Vec<serde_json::Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(SOURCE);
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn suffix(v: &mut serde_json::Value, r: usize) {
    if let Some(s) = v.as_str() {
        *v = format!("{s}-{r}").into();
    }
}

/// Writes (once) a transcript of at least `bytes` bytes: the source file repeated, every
/// UUID, message ID and tool call ID given the repetition's suffix, each repetition
/// chained to the one before, so the whole file is one conversation. Returns its path.
pub fn big_transcript(bytes: u64) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/agent-claude-bench");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("transcript-{}mb.jsonl", bytes >> 20));
    if std::fs::metadata(&path).is_ok_and(|m| m.len() >= bytes) {
        return path;
    }
    let lines = source_lines();
    let tmp = path.with_extension("partial");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&tmp).unwrap());
    let mut written = 0u64;
    let mut last_uuid: Option<String> = None;
    let mut r = 0usize;
    while written < bytes {
        let mut first_chain = true;
        for line in &lines {
            let mut v = line.clone();
            for field in ["uuid", "parentUuid", "sourceToolAssistantUUID", "messageId"] {
                if let Some(x) = v.get_mut(field) {
                    suffix(x, r);
                }
            }
            if let Some(m) = v.get_mut("message") {
                if let Some(id) = m.get_mut("id") {
                    suffix(id, r);
                }
                if let Some(parts) = m.get_mut("content").and_then(|c| c.as_array_mut()) {
                    for p in parts {
                        for field in ["id", "tool_use_id"] {
                            if let Some(x) = p.get_mut(field) {
                                suffix(x, r);
                            }
                        }
                    }
                }
            }
            if v.get("uuid").is_some_and(|u| u.is_string()) {
                if first_chain {
                    v["parentUuid"] = last_uuid
                        .clone()
                        .map_or(serde_json::Value::Null, Into::into);
                    first_chain = false;
                }
                if v["type"] != "progress" {
                    last_uuid = v["uuid"].as_str().map(str::to_owned);
                }
            }
            let text = v.to_string();
            out.write_all(text.as_bytes()).unwrap();
            out.write_all(b"\n").unwrap();
            written += text.len() as u64 + 1;
        }
        r += 1;
    }
    out.flush().unwrap();
    drop(out);
    std::fs::rename(&tmp, &path).unwrap();
    path
}

/// A stream-json turn of `n` text deltas in the shape of the real recording
/// `anyagent-rs/claude-stream-json/01-single-prompt.jsonl` (its session, UUID and
/// `parent_tool_use_id` fields), 1 to 4 characters each as FORMATS.md §0.7 measured.
pub fn delta_stream(n: usize) -> Vec<Vec<u8>> {
    let session = "194b28b7-726f-409a-ad92-33a1605dfa8b";
    let mut lines = vec![
        format!(
            r#"{{"type":"stream_event","event":{{"type":"message_start","message":{{"model":"claude-sonnet-5","id":"msg_011CeKAKdZwzjicf9zHtFBnD","type":"message","role":"assistant","content":[]}}}},"session_id":"{session}","parent_tool_use_id":null,"uuid":"a4f6e2f8-2b5c-4e36-9b0a-2f0d1c3e5a71"}}"#
        ),
        format!(
            r#"{{"type":"stream_event","event":{{"type":"content_block_start","index":0,"content_block":{{"type":"text","text":""}}}},"session_id":"{session}","parent_tool_use_id":null,"uuid":"db78bc66-249b-474a-845c-2ef3bb1595a1"}}"#
        ),
    ];
    let pieces = ["I", "\u{2019}ll", " run", " the", " te", "sts", ".", " Ok"];
    for i in 0..n {
        let text = serde_json::to_string(pieces[i % pieces.len()]).unwrap();
        lines.push(format!(
            r#"{{"type":"stream_event","event":{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":{text}}}}},"session_id":"{session}","parent_tool_use_id":null,"uuid":"48f45969-f0ec-429c-a364-{i:012}"}}"#
        ));
    }
    lines.push(format!(r#"{{"type":"stream_event","event":{{"type":"content_block_stop","index":0}},"session_id":"{session}","parent_tool_use_id":null,"uuid":"77762062-6564-4b15-9a1f-df39f372a663"}}"#));
    lines.into_iter().map(String::into_bytes).collect()
}
