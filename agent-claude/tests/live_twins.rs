//! Live rows and their saved twins share keys (TL-01): the latest window settles a live
//! row only when the page holds a row with the same key. Claude's stream-json
//! `assistant` and `user` frames carry the same `message` objects the transcript saves,
//! so the real transcripts, replayed as frames, must project to exactly the reply,
//! thinking and tool keys the transcript reader gives for the conversation.
//!
//! Claude Code 1.0 wrote a subagent's lines into the main transcript (`isSidechain`);
//! live, those frames carry `parent_tool_use_id` and belong to the subagent's own
//! target, so the replay of a main file leaves them out, as the reader's conversation
//! does.

#![allow(clippy::disallowed_methods)] // reads the real data

use std::collections::BTreeSet;

use agent_claude::project::{Output, Projector};
use agent_claude::stream::StreamDecoder;
use agent_claude::transcript::Transcript;
use timeline_core::key::{BlockKey, BlockType};
use timeline_core::time::Millis;

fn data(rel: &str) -> Vec<u8> {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(rel);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{} is missing: {e}", path.display()))
}

fn agent_keys(keys: impl Iterator<Item = BlockKey>) -> BTreeSet<String> {
    keys.filter(|k| k.block_type != BlockType::User && k.block_type != BlockType::System)
        .map(|k| k.encoded())
        .collect()
}

// TL-01
#[test]
fn replayed_transcripts_give_the_saved_keys() {
    for file in [
        "spotter/short.jsonl",
        "spotter/tool_heavy.jsonl",
        "claude-code-viewer/5c0375b4-57a5-4f26-b12d-d022ee4e51b7.jsonl",
        "spotter/ae4a77f8-aedd-4bc1-888f-c94edc91af04_subagents_agent-aac57f5.jsonl",
    ] {
        let bytes = data(file);
        let mut t = Transcript::new();
        assert_eq!(t.feed(&bytes), bytes.len());
        let saved = agent_keys(t.blocks().into_iter().map(|b| b.key()));

        let subagent_file = t.is_sidechain_file() == Some(true);
        let mut dec = StreamDecoder::new();
        let mut p = Projector::new("s", 0);
        for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let v: serde_json::Value = serde_json::from_slice(line).expect("JSON");
            if !subagent_file && v["isSidechain"] == true {
                continue;
            }
            if let Some(l) = dec.decode(line) {
                p.handle_line(&l, Millis(1));
            }
        }
        let live = agent_keys(
            std::iter::from_fn(|| p.poll_effect()).filter_map(|o| match o {
                Output::Row(b) => Some(b.key()),
                _ => None,
            }),
        );
        assert!(!saved.is_empty(), "{file}");
        assert_eq!(live, saved, "{file}");
    }
}
