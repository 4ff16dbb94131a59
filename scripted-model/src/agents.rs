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

/// The pinned ACP agent of Codex (`@zed-industries/codex-acp`).
pub const CODEX_ACP_VERSION: &str = "0.16.0";

/// The pinned ACP agent of Claude Code (`@zed-industries/claude-agent-acp`).
pub const CLAUDE_AGENT_ACP_VERSION: &str = "0.23.1";

/// The pinned headless ACP client (`acpx`).
pub const ACPX_VERSION: &str = "0.19.1";

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
    native_in(&root, "claude-code-", "claude").ok_or_else(|| {
        format!(
            "the real Claude Code is not installed under {}: run .ci/run, or \
             `npm install --prefix {} @anthropic-ai/claude-code@{CLAUDE_VERSION}`, or set \
             CLAUDE_BIN",
            root.display(),
            agents_dir().display()
        )
    })
}

/// The native binary `file` of the first platform package under `root` whose name
/// starts with `prefix`.
fn native_in(root: &Path, prefix: &str, file: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
        })
        .collect();
    dirs.sort();
    dirs.into_iter().map(|d| d.join(file)).find(|p| p.is_file())
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

fn npm_bin(name: &str, package: &str, version: &str, var: &str) -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os(var) {
        return Ok(PathBuf::from(p));
    }
    let p = agents_dir().join("node_modules/.bin").join(name);
    if p.exists() {
        return Ok(p);
    }
    Err(format!(
        "{package} is not installed under {}: run .ci/run, or `npm install --prefix {} \
         {package}@{version}`, or set {var}",
        agents_dir().join("node_modules").display(),
        agents_dir().display()
    ))
}

/// The pinned `codex-acp` binary (the native one its npm package ships), or what to
/// install.
///
/// # Errors
///
/// The words that say what to install, when there is no binary.
pub fn codex_acp_bin() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("CODEX_ACP_BIN") {
        return Ok(PathBuf::from(p));
    }
    let root = agents_dir().join("node_modules/@zed-industries");
    native_in(&root, "codex-acp-", "bin/codex-acp").ok_or_else(|| {
        format!(
            "@zed-industries/codex-acp is not installed under {}: run .ci/run, or `npm \
             install --prefix {} @zed-industries/codex-acp@{CODEX_ACP_VERSION}`, or set \
             CODEX_ACP_BIN",
            root.display(),
            agents_dir().display()
        )
    })
}

/// The pinned `claude-agent-acp` program (a Node.js script), or what to install.
///
/// # Errors
///
/// The words that say what to install, when there is none.
pub fn claude_agent_acp_bin() -> Result<PathBuf, String> {
    npm_bin(
        "claude-agent-acp",
        "@zed-industries/claude-agent-acp",
        CLAUDE_AGENT_ACP_VERSION,
        "CLAUDE_AGENT_ACP_BIN",
    )
}

/// The pinned `acpx` client (a Node.js script), or what to install.
///
/// # Errors
///
/// The words that say what to install, when there is none.
pub fn acpx_bin() -> Result<PathBuf, String> {
    npm_bin("acpx", "acpx", ACPX_VERSION, "ACPX_BIN")
}

/// Writes a `CODEX_HOME` at `home` for `codex-acp`, whose Codex core is older than the
/// pinned Codex and refuses some of [`write_codex_home`]'s keys: the model provider is
/// `model`, every command asks for approval (`untrusted`) and runs unsandboxed once
/// approved (the test directory is the sandbox), nothing reaches the network.
/// Codex reads the key from `SCRIPTED_MODEL_KEY`.
///
/// # Errors
///
/// The file could not be written.
pub fn write_codex_acp_home(home: &Path, model: &ModelServer) -> std::io::Result<()> {
    std::fs::create_dir_all(home)?;
    let config = format!(
        r#"model = "gpt-5.5"
model_provider = "scripted"
approval_policy = "untrusted"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"

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
