//! Memory per idle session: the heap a host keeps for each open session, with 1,000
//! sessions open (memory stores, each session's history source, and its agent's
//! record: Codex's and Claude's), counted by an instrumented allocator.
//!
//! `cargo run --release -p benches --bin session-memory`

use std::alloc::System;

use agent_claude::{ClaudeAgent, ClaudeConfig};
use agent_codex::{CodexAgent, ThreadConfig};
use host_core::{Host, HostConfig, ProcessSpec};
use outbox_core::adapter::Capabilities;
use outbox_core::{MemoryOutboxStore, SessionInfo};
use overlay_core::{MemoryOverlayStore, MemorySource, SourceKind};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use timeline_core::{BoundaryToken, HostKey, Millis, SessionId};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const SESSIONS: usize = 1_000;

fn retained(region: &Region<'_, System>) -> i64 {
    let s = region.change();
    (s.bytes_allocated as i64 - s.bytes_deallocated as i64) + s.bytes_reallocated as i64
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut n = 0u64;
    let uuids = Box::new(move || {
        n += 1;
        format!("00000000-0000-4000-8000-{n:012x}")
    });
    let mut host = Host::new(
        MemoryOutboxStore::new(),
        MemoryOverlayStore::new(),
        HostConfig::new(HostKey::from_bytes([7; 32]), uuids),
    );
    host.start(Millis(1))?;
    let mut codex = CodexAgent::new(ProcessSpec::new("codex"), "bench", "0.1.0");
    let mut claude = ClaudeAgent::new(ClaudeConfig::new(
        ProcessSpec::new("claude"),
        "/home/u/.claude/projects",
        "/work/project",
    ));
    let ids: Vec<SessionId> = (0..SESSIONS)
        .map(|i| SessionId::new(format!("session-{i:04}")))
        .collect::<Result<_, _>>()?;
    let region = Region::new(GLOBAL);
    for (i, id) in ids.iter().enumerate() {
        let codex_session = i % 2 == 0;
        let source = MemorySource::new(
            SourceKind::Codex {
                thread_id: format!("thread-{i}"),
                generation: 1,
            },
            BoundaryToken::codex_rollout(&format!("/sessions/rollout-{i}.jsonl")),
        );
        let caps = if codex_session {
            Capabilities::codex()
        } else {
            Capabilities::claude()
        };
        host.add_session(id, SessionInfo::new(caps), Box::new(source));
        if codex_session {
            codex.add_session(id, ThreadConfig::new("/work/project"));
        } else {
            claude.add_session(
                id,
                &format!("0000{i:04}-0000-4000-8000-000000000000"),
                false,
            );
        }
    }
    let bytes = retained(&region);
    println!(
        "{SESSIONS} idle sessions (half Codex, half Claude): {bytes} bytes retained, {} bytes a session",
        bytes / SESSIONS as i64
    );
    // Keep them alive until measured.
    drop((host, codex, claude));
    Ok(())
}
