//! The IO edge: reading a rollout file from disk. Everything else in the crate is
//! sans-IO; this module only hands bytes to [`crate::rollout::RolloutReader`].
//!
//! `.jsonl.zst` (a rollout Codex compressed after 7 idle days) is refused with
//! [`EdgeError::Compressed`] until the crate reads zstd.

#![allow(clippy::disallowed_methods)] // the one module that reads files

use std::path::Path;

use crate::rollout::{ReadBatch, RolloutReader};

/// Why a rollout file was not read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EdgeError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// A compressed rollout (`.jsonl.zst`), not read by this version.
    #[error("{0} is a compressed rollout, which this version does not read")]
    Compressed(String),
}

/// Reads a whole rollout file: its lines, and the reader with its diagnostics. A last
/// line that is not whole JSON (Codex is writing it) is left out; `consumed` in the
/// batch says where the next read should start.
pub fn read_rollout_file(path: &Path) -> Result<(ReadBatch, RolloutReader), EdgeError> {
    if path.extension().is_some_and(|e| e == "zst") {
        return Err(EdgeError::Compressed(path.display().to_string()));
    }
    let bytes = std::fs::read(path).map_err(|source| EdgeError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let mut reader = RolloutReader::new();
    let batch = reader.read_to_end(&bytes);
    Ok((batch, reader))
}
