//! Helpers shared by the integration tests: the recorded files and a driver of the
//! tail reader over bytes in memory.

#![allow(dead_code)] // each test file uses a part
#![allow(clippy::disallowed_methods)] // reads the recordings

use std::path::PathBuf;

use agent_claude::tail::{TailPage, TailRead, TailStep};
use agent_claude::transcript::PageError;

/// The copies of the recordings in `tests/data`.
pub fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

/// The bytes of a recording in `tests/data`.
pub fn data(rel: &str) -> Vec<u8> {
    let path = data_dir().join(rel);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{} is missing: {e}", path.display()))
}

/// Every transcript (not stream) recording in `tests/data`, by relative path.
pub const TRANSCRIPT_FILES: &[&str] = &[
    "claude-code-viewer/1af7fc5e-8455-4414-9ccd-011d40f70b2a.jsonl",
    "claude-code-viewer/5c0375b4-57a5-4f26-b12d-d022ee4e51b7.jsonl",
    "claude-code-viewer/agent-test-hash-123.jsonl",
    "spotter/ae4a77f8-aedd-4bc1-888f-c94edc91af04.lines1461-1540.excerpt.jsonl",
    "spotter/ae4a77f8-aedd-4bc1-888f-c94edc91af04_subagents_agent-aac57f5.jsonl",
    "spotter/ae4a77f8-aedd-4bc1-888f-c94edc91af04_subagents_agent-acompact-946d2b.jsonl",
    "spotter/short.jsonl",
    "spotter/tool_heavy.jsonl",
    "agent-sessions/claude-small.jsonl",
];

/// The stream-json recordings in `tests/data`.
pub const STREAM_FILES: &[&str] = &["anyagent-rs/claude-stream-json/01-single-prompt.jsonl"];

/// Runs a tail read over `bytes` as the file, checking that every read asked for lies
/// inside the file.
pub fn drive(bytes: &[u8], mut read: TailRead) -> Result<TailPage, PageError> {
    loop {
        match read.poll() {
            TailStep::Done(answer) => return answer,
            TailStep::Read { start, end } => {
                assert!(
                    start <= end && end as usize <= bytes.len(),
                    "{start}..{end}"
                );
                read.handle_read(start, &bytes[start as usize..end as usize]);
            }
        }
    }
}
