#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

/// The client timeline and the shared vocabulary: keys, blocks, rows, time (`timeline-core`).
pub use timeline_core as timeline;

/// Live overlays, settlement, live delivery and the replay record (`overlay-core`).
pub use overlay_core as overlay;

/// Message custody: the outbox, the ledger, send results, runs (`outbox-core`).
pub use outbox_core as outbox;

/// The host machine that joins them, and the agent seam (`host-core`).
pub use host_core as host;

/// The embedded store (`storage-sqlite`).
#[cfg(any(feature = "sqlite", feature = "sqlite-system", feature = "sqlcipher"))]
pub use storage_sqlite as sqlite;

/// The store several hosts share (`storage-postgres`).
#[cfg(feature = "postgres")]
pub use storage_postgres as postgres;

/// The Codex agent (`agent-codex`).
#[cfg(feature = "codex")]
pub use agent_codex as codex;

/// The Claude Code agent (`agent-claude`).
#[cfg(feature = "claude")]
pub use agent_claude as claude;

/// Any Agent Client Protocol agent (`agent-acp`).
#[cfg(feature = "acp")]
pub use agent_acp as acp;

/// The runtime that drives a host for real (`host-runtime`).
#[cfg(feature = "runtime")]
pub use host_runtime as runtime;

pub use host_core::{Host, HostConfig, HostStats, Notice, Severity};
pub use timeline_core::Timeline;

/// A host configuration with a fresh random key (the key seals the cursors and anchors
/// the host hands out: keep one per database to keep them valid across restarts, see
/// [`host_config_with_key`]) and random (v4) UUIDs for the run IDs.
///
/// # Panics
///
/// When the operating system has no randomness to give (`getrandom` fails), which a
/// host cannot run without.
pub fn host_config() -> HostConfig {
    let mut key = [0u8; 32];
    #[allow(clippy::expect_used)] // documented: no host runs without randomness
    getrandom::fill(&mut key).expect("the operating system gives random bytes");
    host_config_with_key(key)
}

/// A host configuration with the key given (32 bytes the embedder keeps, e.g. in its
/// keychain) and random (v4) UUIDs for the run IDs.
pub fn host_config_with_key(key: [u8; 32]) -> HostConfig {
    HostConfig::new(
        timeline_core::HostKey::from_bytes(key),
        Box::new(|| uuid::Uuid::new_v4().to_string()),
    )
}
