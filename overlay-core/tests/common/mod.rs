//! Helpers shared by the overlay-core test files.
#![allow(dead_code, clippy::unwrap_used)]

use overlay_core::overlay::Change;
use overlay_core::source::{MemorySource, SourceKind};
use overlay_core::store::memory::MemoryOverlayStore;
use overlay_core::store::write;
use overlay_core::store::{RowClass, StoredBlock};
use timeline_core::block::Block;
use timeline_core::cursor::BoundaryToken;
use timeline_core::key::{BlockKey, BlockType, RunId, SessionId, TargetId};
use timeline_core::order::SourceOrder;
use timeline_core::seal::HostKey;
use timeline_core::time::Millis;

pub fn session() -> SessionId {
    SessionId::new("session-1").unwrap()
}

pub fn main_target() -> TargetId {
    TargetId::main(&session())
}

pub fn run(id: &str) -> RunId {
    RunId::new(id).unwrap()
}

pub fn reply(id: &str) -> BlockKey {
    BlockKey::parse(BlockType::AgentReply, id).unwrap()
}

pub fn host_key() -> HostKey {
    HostKey::from_bytes([7; 32])
}

/// A live ordinary row of `run`.
/// A memory store whose main target's overlay holds `rows`, published in one write.
pub fn store_with_live(rows: Vec<StoredBlock>) -> MemoryOverlayStore {
    let mut store = MemoryOverlayStore::new();
    write(
        &mut store,
        &session(),
        &main_target(),
        &Change::Publish(rows),
    )
    .unwrap();
    store
}

pub fn live(id: &str, t: u64, run_id: &str) -> StoredBlock {
    StoredBlock {
        block: Block::new(reply(id), Millis(t)).with_source_order(SourceOrder::live(t)),
        class: RowClass::Ordinary,
        run_id: Some(run(run_id)),
    }
}

/// An ephemeral row of `class` for `run`.
pub fn ephemeral(id: &str, class: RowClass, run_id: &str) -> StoredBlock {
    let t = match class {
        RowClass::Status => BlockType::Thinking,
        _ => BlockType::Activity,
    };
    StoredBlock {
        block: Block::new(BlockKey::parse(t, id).unwrap(), Millis(1)),
        class,
        run_id: Some(run(run_id)),
    }
}

/// A history row with the same key a live row `id` has.
pub fn saved(id: &str, t: u64, ordinal: u64) -> Block {
    Block::new(reply(id), Millis(t)).with_source_order(SourceOrder::history(ordinal, 0))
}

pub fn claude_source() -> MemorySource {
    MemorySource::new(
        SourceKind::Claude {
            session: "claude-session".into(),
        },
        BoundaryToken::claude("claude-session"),
    )
}

pub fn codex_source() -> MemorySource {
    MemorySource::new(
        SourceKind::Codex {
            thread_id: "thread-1".into(),
            generation: 1,
        },
        BoundaryToken::codex_rollout("/rollouts/r1.jsonl"),
    )
}

/// A source with `n` items of one row each (`h-0` oldest).
pub fn filled(mut source: MemorySource, n: u64) -> MemorySource {
    for i in 0..n {
        source.push(vec![saved(&format!("h-{i}"), 1_000 + i, i)]);
    }
    source
}
