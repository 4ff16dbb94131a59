//! A real agent through the runtime, offline: the scripted model on loopback, the pinned
//! Codex (`codex app-server`) as the agent, a host with memory stores, two messages, and
//! the conversation printed as a person reads it.
//!
//! `cargo run -p host-runtime --example real_agent`
//!
//! Needs the pinned Codex (`.ci/run` installs it under `~/.cache/custody-agents`; or set
//! `CODEX_BIN`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_codex::{CodexAgent, DriverConfig, ItemsReader, ItemsSource, SharedPages, ThreadConfig};
use host_core::{ClientRequest, Host, HostConfig, ProcessSpec, Reply};
use host_runtime::{Client, Runtime};
use outbox_core::adapter::Capabilities;
use outbox_core::{
    Controls, MemoryOutboxStore, MessageRequest, OperationId, QueueId, SessionInfo, SubmitRequest,
};
use overlay_core::MemoryOverlayStore;
use scripted_model::ModelServer;
use timeline_core::{HostKey, Millis, SessionId, TargetId};

type Error = Box<dyn std::error::Error>;

fn find(dir: &Path, name: &str, depth: usize) -> Option<PathBuf> {
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
    dirs.sort();
    (depth > 0)
        .then(|| dirs.iter().find_map(|d| find(d, name, depth - 1)))
        .flatten()
}

fn codex_bin() -> Result<PathBuf, Error> {
    if let Some(p) = std::env::var_os("CODEX_BIN") {
        return Ok(PathBuf::from(p));
    }
    let agents = std::env::var_os("AGENTS_DIR").map_or_else(
        || {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/custody-agents")
        },
        PathBuf::from,
    );
    find(&agents.join("node_modules/@openai"), "codex", 6).ok_or_else(|| {
        format!(
            "Codex is not installed: run `npm install --prefix {} @openai/codex@0.169.0` \
             (or .ci/run), or set CODEX_BIN",
            agents.display()
        )
        .into()
    })
}

fn codex_home(model: &ModelServer) -> Result<PathBuf, Error> {
    let home = std::env::temp_dir().join(format!("custody-demo-codex-{}", std::process::id()));
    std::fs::create_dir_all(home.join("work"))?;
    std::fs::write(
        home.join("config.toml"),
        format!(
            "model = \"gpt-5.5\"\nmodel_provider = \"scripted\"\nweb_search = \"disabled\"\n\
             check_for_update_on_startup = false\n\n[analytics]\nenabled = false\n\n\
             [feedback]\nenabled = false\n\n[otel]\nexporter = \"none\"\n\n\
             [model_providers.scripted]\nname = \"scripted\"\nbase_url = \"{}\"\n\
             wire_api = \"responses\"\nenv_key = \"SCRIPTED_MODEL_KEY\"\n",
            model.openai_base_url()
        ),
    )?;
    Ok(home)
}

/// The rows of the latest window, as a person reads them.
async fn conversation(client: &Client, session: &SessionId) -> Result<Vec<String>, Error> {
    let reply = client
        .request(ClientRequest::LatestWindow {
            session: session.clone(),
            target: TargetId::main(session),
            page_size: 100,
        })
        .await?;
    let Reply::LatestWindow(Ok(window)) = reply else {
        return Err(format!("the latest window failed: {reply:?}").into());
    };
    let overlay = window.live_overlay.map(|o| o.blocks).unwrap_or_default();
    let mut blocks: Vec<_> = window.blocks.into_iter().chain(overlay).collect();
    blocks.sort_by_key(|b| b.order_key());
    Ok(blocks
        .iter()
        .filter_map(|b| {
            let d = &b.data;
            let (who, text) = if let Some(t) = d["text"].as_str() {
                let user = b.operation_id.is_some() || b.id.as_str().starts_with("user-message");
                (if user { "You" } else { "Codex" }, t)
            } else {
                ("  ·", d["title"].as_str()?)
            };
            Some(format!("{who}: {text}"))
        })
        .collect())
}

async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) -> Result<(), Error> {
    let began = Instant::now();
    while began.elapsed() < Duration::from_secs(60) {
        if done().await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("{what} did not happen within 60 s").into())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let model = ModelServer::start()?;
    let home = codex_home(&model)?;
    let session = SessionId::new("demo-session")?;
    let spec = ProcessSpec::new(codex_bin()?)
        .args(["app-server"])
        .env("CODEX_HOME", home.as_os_str())
        .env("SCRIPTED_MODEL_KEY", "demo")
        .env_remove("OPENAI_API_KEY")
        .cwd(&home);
    let mut codex = CodexAgent::new(spec.clone(), "custody-demo", env!("CARGO_PKG_VERSION"));
    codex.add_session(
        &session,
        ThreadConfig::new(home.join("work").display().to_string()),
    );
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
    // The session's history is its Codex thread's, read through `thread/items/list` of
    // a Codex of its own.
    let reader = ItemsReader::start(
        DriverConfig::from_spec(&spec),
        "custody-demo-history",
        env!("CARGO_PKG_VERSION"),
    )?;
    let pages: SharedPages = Arc::new(Mutex::new(reader));
    let link = codex
        .thread_link(&session)
        .ok_or("the session was just added")?;
    host.add_session(
        &session,
        SessionInfo::new(Capabilities::codex()),
        Box::new(ItemsSource::new(pages, link, 1)),
    );
    let mut runtime = Runtime::builder(host).agent(codex).start()?;
    let mut outputs = runtime.take_outputs();
    tokio::spawn(async move { while outputs.next().await.is_some() {} });
    let client = runtime.client();
    for (i, text) in ["Hello, who are you?", "Please summarise the plan."]
        .iter()
        .enumerate()
    {
        let op = OperationId::new(format!("demo-op-{i}"))?;
        let reply = client
            .request(ClientRequest::Submit(SubmitRequest {
                session: session.clone(),
                queue_id: QueueId::new(format!("demo-q-{i}"))?,
                operation_id: op,
                request: MessageRequest::text(*text, "demo", Millis(0)),
                controls: Controls::automatic(),
            }))
            .await?;
        if !matches!(reply, Reply::Submitted(Ok(_))) {
            return Err(format!("the submit failed: {reply:?}").into());
        }
        let expect = format!("Reply to: {text}");
        until("Codex's answer", async || {
            conversation(&client, &session)
                .await
                .is_ok_and(|rows| rows.iter().any(|r| r.contains(&expect)))
        })
        .await?;
    }
    for line in conversation(&client, &session).await? {
        println!("{line}");
    }
    runtime.shutdown().await?;
    let _ = std::fs::remove_dir_all(&home);
    Ok(())
}
