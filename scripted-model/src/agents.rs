//! Where the pinned real agents are, and homes that point them at a [`ModelServer`].
//!
//! `.ci/run` installs the versions of `agents/package.json` into
//! `~/.cache/custody-agents` (`AGENTS_DIR` overrides it); `CODEX_BIN` and `CLAUDE_BIN`
//! name a binary directly. A finder that finds nothing says what to install.

use std::path::{Path, PathBuf};

use crate::ModelServer;

/// The pinned Codex version.
pub const CODEX_VERSION: &str = "0.169.0";

/// The pinned Claude Code version.
pub const CLAUDE_VERSION: &str = "2.1.328";

/// Where the pinned agents are installed.
pub fn agents_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("AGENTS_DIR") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
    home.join(".cache/custody-agents")
}

fn find_under(dir: &Path, name: &str, depth: usize) -> Option<PathBuf> {
    let mut dirs = Vec::new();
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        if p.is_dir() {
            dirs.push(p);
        } else if p.file_name().is_some_and(|n| n == name)
            && p.parent().is_some_and(|d| d.ends_with("bin"))
        {
            return Some(p);
        }
    }
    if depth == 0 {
        return None;
    }
    dirs.sort();
    dirs.iter().find_map(|d| find_under(d, name, depth - 1))
}

/// The pinned Codex binary (the native one the npm package ships), or what to install.
///
/// # Errors
///
/// The words that say what to install, when there is no binary.
pub fn codex_bin() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("CODEX_BIN") {
        return Ok(PathBuf::from(p));
    }
    let root = agents_dir().join("node_modules/@openai");
    find_under(&root, "codex", 6).ok_or_else(|| {
        format!(
            "the real Codex is not installed under {}: run .ci/run, or \
             `npm install --prefix {} @openai/codex@{CODEX_VERSION}`, or set CODEX_BIN",
            root.display(),
            agents_dir().display()
        )
    })
}

/// The pinned Claude Code binary (the native one the npm package ships), or what to
/// install.
///
/// # Errors
///
/// The words that say what to install, when there is no binary.
pub fn claude_bin() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("CLAUDE_BIN") {
        return Ok(PathBuf::from(p));
    }
    let root = agents_dir().join("node_modules/@anthropic-ai");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("claude-code-"))
        })
        .collect();
    dirs.sort();
    dirs.into_iter()
        .map(|d| d.join("claude"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "the real Claude Code is not installed under {}: run .ci/run, or \
                 `npm install --prefix {} @anthropic-ai/claude-code@{CLAUDE_VERSION}`, or set \
                 CLAUDE_BIN",
                root.display(),
                agents_dir().display()
            )
        })
}

/// Writes a `CODEX_HOME` at `home` whose model provider is `model`, with everything
/// that would reach the network turned off. Codex reads the key from
/// `SCRIPTED_MODEL_KEY`.
///
/// # Errors
///
/// The file could not be written.
pub fn write_codex_home(home: &Path, model: &ModelServer) -> std::io::Result<()> {
    std::fs::create_dir_all(home)?;
    let config = format!(
        r#"model = "gpt-5.5"
model_provider = "scripted"
web_search = "disabled"
check_for_update_on_startup = false

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"

[features]
plugins = false
apps = false
remote_plugin = false
tool_suggest = false
api_key_model_discovery = false
in_app_updates = false
image_generation = false
goals = false

[agents]
enabled = false

[model_providers.scripted]
name = "scripted"
base_url = "{}"
wire_api = "responses"
env_key = "SCRIPTED_MODEL_KEY"
request_max_retries = 1
stream_max_retries = 1
stream_idle_timeout_ms = 20000
"#,
        model.openai_base_url()
    );
    std::fs::write(home.join("config.toml"), config)
}
