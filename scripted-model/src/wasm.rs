//! The browser page's timeline: `timeline-wasm` built for `wasm32-unknown-unknown`, in a
//! target directory of its own (`target/wasm-page`: a test's cargo holds the
//! workspace's), for the server tests, the `serve` example and the wasm benchmark.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace's root.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Builds `timeline-wasm` for wasm32 (release; cargo does nothing when it is current)
/// and returns the module's path. Fails saying what to install when the target is
/// missing.
pub fn timeline_wasm_path() -> Result<PathBuf, String> {
    let target = workspace().join("target").join("wasm-page");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into());
    let status = Command::new(cargo)
        .args([
            "build",
            "-p",
            "timeline-wasm",
            "--target",
            "wasm32-unknown-unknown",
            "--release",
        ])
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(workspace())
        .status()
        .map_err(|e| format!("cargo could not run: {e}"))?;
    if !status.success() {
        return Err(
            "building timeline-wasm for wasm32 failed; is the target installed? \
             (rustup target add wasm32-unknown-unknown)"
                .into(),
        );
    }
    Ok(target.join("wasm32-unknown-unknown/release/timeline_wasm.wasm"))
}

/// The built module's bytes ([`timeline_wasm_path`]).
pub fn timeline_wasm() -> Result<Vec<u8>, String> {
    let path = timeline_wasm_path()?;
    std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))
}
