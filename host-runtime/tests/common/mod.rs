//! What the real-agent tests share: finding the pinned binaries, a home for each agent
//! pointed at the scripted model, a runtime around a host, and reading what clients see.

#![allow(dead_code, clippy::unwrap_used)] // shared by several test files

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agent_codex::{CodexAgent, ThreadConfig};
use host_core::{ClientRequest, Host, HostConfig, ProcessSpec, Reply};
use host_runtime::Runtime;
use outbox_core::adapter::Capabilities;
use outbox_core::{
    Controls, MemoryOutboxStore, MessageRequest, OperationId, QueueId, SessionInfo, SubmitRequest,
};
use overlay_core::{MemoryOverlayStore, MemorySource, SourceKind};
use scripted_model::ModelServer;
use timeline_core::{BoundaryToken, HostKey, Millis, SessionId, TargetId};

/// The Claude session the Claude rig's session runs as.
pub const CLAUDE_SESSION: &str = "5a1f0c3e-7b2d-4e8a-9c6f-0d1e2f3a4b5c";

/// The pinned Codex binary; panics with what to install when there is none.
pub fn codex_bin() -> PathBuf {
    scripted_model::agents::codex_bin().unwrap_or_else(|e| panic!("{e}"))
}

/// The pinned Claude Code binary; panics with what to install when there is none.
pub fn claude_bin() -> PathBuf {
    scripted_model::agents::claude_bin().unwrap_or_else(|e| panic!("{e}"))
}

/// A fresh directory under the system's temp dir.
pub fn temp_dir(what: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let d = std::env::temp_dir().join(format!("custody-{what}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A `CODEX_HOME` whose model provider is the scripted model.
pub fn codex_home(model: &ModelServer) -> PathBuf {
    let home = temp_dir("codex-home");
    scripted_model::agents::write_codex_home(&home, model).unwrap();
    home
}

/// `codex app-server` with `home` as its `CODEX_HOME`.
pub fn codex_spec(home: &Path) -> ProcessSpec {
    ProcessSpec::new(codex_bin())
        .args(["app-server"])
        .env("CODEX_HOME", home.as_os_str())
        .env("SCRIPTED_MODEL_KEY", "sk-scripted")
        .env("RUST_LOG", "warn")
        .env_remove("OPENAI_API_KEY")
        .cwd(home)
}

pub fn host(
    session: &SessionId,
    caps: Capabilities,
) -> Host<MemoryOutboxStore, MemoryOverlayStore> {
    let source = MemorySource::new(
        SourceKind::Codex {
            thread_id: "thread-1".into(),
            generation: 1,
        },
        BoundaryToken::codex_rollout("/sessions/rollout-1.jsonl"),
    );
    host_with(session, caps, Box::new(source))
}

/// A host with memory stores whose session reads its history from `source`.
pub fn host_with(
    session: &SessionId,
    caps: Capabilities,
    source: Box<dyn overlay_core::HistorySource + Send>,
) -> Host<MemoryOutboxStore, MemoryOverlayStore> {
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
    host.add_session(session, SessionInfo::new(caps), source);
    host
}

/// `(id, text)` of each row with a text that a desktop window was shown, in order.
pub type Shown = std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>;

/// Reads the runtime's outputs on a task of their own, keeping each as debug text, and
/// the rows windows were shown.
fn keep_outputs(runtime: &mut Runtime) -> (std::sync::Arc<std::sync::Mutex<Vec<String>>>, Shown) {
    use overlay_core::live::{Delivery, Payload};
    let outputs = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let shown: Shown = Default::default();
    let mut stream = runtime.take_outputs();
    let kept = std::sync::Arc::clone(&outputs);
    let rows = std::sync::Arc::clone(&shown);
    tokio::spawn(async move {
        while let Some(o) = stream.next().await {
            if let host_runtime::Output::Deliver(Delivery::Window {
                payload: Payload::Blocks { overlay, .. },
                ..
            }) = &o
            {
                let mut rows = rows.lock().unwrap();
                for b in &overlay.blocks {
                    if let Some(text) = b.data["text"].as_str() {
                        rows.push((b.id.as_str().to_owned(), text.to_owned()));
                    }
                }
            }
            kept.lock().unwrap().push(format!("{o:?}"));
        }
    });
    (outputs, shown)
}

/// A runtime with one session served by a real agent, and the model it talks to.
pub struct Rig {
    /// Every output of the host, as debug text, in order.
    pub outputs: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    /// The rows a desktop window subscribed to the session was shown.
    pub shown: Shown,
    pub model: ModelServer,
    pub home: PathBuf,
    pub session: SessionId,
    runtime: Option<Runtime>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- the host's notices:");
            for n in self
                .outputs
                .lock()
                .unwrap()
                .iter()
                .filter(|o| std::env::var_os("RIG_ALL").is_some() || o.starts_with("Notice"))
            {
                eprintln!("{n}");
            }
            eprintln!("--- the model's turns:");
            for t in self.model.requests() {
                let input = t.body["input"].as_array().map(|i| i.len()).unwrap_or(0);
                let last = t.body["input"]
                    .as_array()
                    .and_then(|i| i.last())
                    .map(|l| l.to_string())
                    .unwrap_or_default();
                eprintln!(
                    "{} {:?} ({input} input items) last: {}",
                    t.path,
                    t.script,
                    &last[..last.len().min(300)]
                );
            }
        }
    }
}

impl Rig {
    /// The real Codex serving session `s-1`, in a workspace of its own.
    pub async fn codex() -> Rig {
        Rig::codex_with(|t| t).await
    }

    /// [`Rig::codex`] with the thread configured by `thread`.
    pub async fn codex_with(thread: impl FnOnce(ThreadConfig) -> ThreadConfig) -> Rig {
        let model = ModelServer::start().unwrap();
        let home = codex_home(&model);
        let work = home.join("work");
        std::fs::create_dir_all(&work).unwrap();
        let session = SessionId::new("s-1").unwrap();
        let mut agent = CodexAgent::new(codex_spec(&home), "custody-tests", "0.1.0");
        agent.add_session(
            &session,
            thread(ThreadConfig::new(work.display().to_string()).sandbox("danger-full-access")),
        );
        // The history is the thread's own, through `thread/items/list` of a Codex of its
        // own, as the seed reads it.
        let reader = agent_codex::ItemsReader::start(
            agent_codex::DriverConfig::from_spec(&codex_spec(&home)),
            "custody-tests-history",
            "0.1.0",
        )
        .unwrap();
        let pages: agent_codex::SharedPages = std::sync::Arc::new(std::sync::Mutex::new(reader));
        let source = agent_codex::ItemsSource::new(pages, agent.thread_link(&session).unwrap(), 1);
        let host = host_with(&session, Capabilities::codex(), Box::new(source));
        let mut runtime = Runtime::builder(host).agent(agent).start().unwrap();
        let (outputs, shown) = keep_outputs(&mut runtime);
        Rig {
            outputs,
            shown,
            model,
            home,
            session,
            runtime: Some(runtime),
        }
    }

    /// The real Claude Code serving session `s-1` (Claude session `claude_session`), in
    /// a project directory of its own.
    pub async fn claude() -> Rig {
        let model = ModelServer::start().unwrap();
        let home = temp_dir("claude-home");
        let work = home.join("project");
        std::fs::create_dir_all(&work).unwrap();
        let session = SessionId::new("s-1").unwrap();
        let spec = ProcessSpec::new(claude_bin())
            .env("HOME", home.as_os_str())
            .env("ANTHROPIC_BASE_URL", model.anthropic_base_url())
            .env("ANTHROPIC_API_KEY", "sk-ant-scripted")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .env_remove("ANTHROPIC_AUTH_TOKEN")
            .cwd(&work);
        let cwd = work.display().to_string();
        let mut agent = agent_claude::ClaudeAgent::new(agent_claude::ClaudeConfig::new(
            spec,
            home.join(".claude/projects"),
            cwd,
        ));
        agent.add_session(&session, CLAUDE_SESSION, false);
        // The history is the Claude session's own transcript, as Claude writes it.
        let transcript = agent_claude::file::TranscriptFile::new(
            agent_claude::file::transcript_path(
                &home.join(".claude/projects"),
                &work.display().to_string(),
                CLAUDE_SESSION,
            ),
            CLAUDE_SESSION,
        );
        let host = host_with(&session, Capabilities::claude(), Box::new(transcript));
        let mut runtime = Runtime::builder(host).agent(agent).start().unwrap();
        let (outputs, shown) = keep_outputs(&mut runtime);
        Rig {
            outputs,
            shown,
            model,
            home,
            session,
            runtime: Some(runtime),
        }
    }

    /// The real `codex-acp` (the pinned `@zed-industries/codex-acp`) serving session
    /// `s-1` through the ACP agent, its history the agent's shared record.
    pub async fn codex_acp() -> Rig {
        let model = ModelServer::start().unwrap();
        let home = temp_dir("codex-acp-home");
        scripted_model::agents::write_codex_acp_home(&home, &model).unwrap();
        let work = home.join("work");
        std::fs::create_dir_all(&work).unwrap();
        let session = SessionId::new("s-1").unwrap();
        let bin = scripted_model::agents::codex_acp_bin().unwrap_or_else(|e| panic!("{e}"));
        let spec = ProcessSpec::new(bin)
            .env("CODEX_HOME", home.as_os_str())
            .env("HOME", home.as_os_str())
            .env("SCRIPTED_MODEL_KEY", "sk-scripted")
            .env("RUST_LOG", "error")
            .env_remove("OPENAI_API_KEY")
            .cwd(&work);
        let history = agent_acp::AcpHistory::new();
        let mut agent =
            agent_acp::AcpAgent::new(agent_acp::AcpConfig::new(spec, &work), history.clone());
        agent.add_session(&session, None);
        let host = host_with(
            &session,
            Capabilities::acp(),
            Box::new(history.source(&session)),
        );
        let mut runtime = Runtime::builder(host).agent(agent).start().unwrap();
        let (outputs, shown) = keep_outputs(&mut runtime);
        Rig {
            outputs,
            shown,
            model,
            home,
            session,
            runtime: Some(runtime),
        }
    }

    /// Kills (SIGKILL) every process whose working directory is `dir`.
    pub fn kill_processes_in(dir: &Path) -> usize {
        let mut killed = 0;
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let pid = e.file_name().to_string_lossy().to_string();
            if pid.parse::<u32>().is_err() {
                continue;
            }
            if std::fs::read_link(e.path().join("cwd")).ok().as_deref() == Some(dir) {
                let status = std::process::Command::new("kill")
                    .args(["-9", &pid])
                    .status()
                    .unwrap();
                killed += usize::from(status.success());
            }
        }
        killed
    }

    /// The Claude session's transcript.
    pub fn transcript(&self) -> PathBuf {
        let project = self.home.join("project").display().to_string();
        agent_claude::file::transcript_path(
            &self.home.join(".claude/projects"),
            &project,
            CLAUDE_SESSION,
        )
    }

    /// The rollout files Codex wrote.
    pub fn rollouts(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let mut dirs = vec![self.home.join("sessions")];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() {
                    dirs.push(p);
                } else if p.extension().is_some_and(|x| x == "jsonl") {
                    out.push(p);
                }
            }
        }
        out
    }

    /// The notices the host gave so far.
    pub fn notices(&self) -> Vec<String> {
        self.outputs
            .lock()
            .unwrap()
            .iter()
            .filter(|o| o.starts_with("Notice"))
            .cloned()
            .collect()
    }

    /// A client of the host.
    pub fn client(&self) -> host_runtime::Client {
        self.runtime.as_ref().unwrap().client()
    }

    pub async fn stop(mut self) {
        if let Some(r) = self.runtime.take() {
            r.shutdown().await.unwrap();
        }
        let _ = std::fs::remove_dir_all(&self.home);
    }
}

pub fn submit(session: &SessionId, op: &str, text: &str) -> ClientRequest {
    ClientRequest::Submit(SubmitRequest {
        session: session.clone(),
        queue_id: QueueId::new(format!("q-{op}")).unwrap(),
        operation_id: OperationId::new(op).unwrap(),
        request: MessageRequest::text(text, "phone", Millis(0)),
        controls: Controls::automatic(),
    })
}

/// The session's outbox entries, as the reconcile answers them.
pub async fn outbox(client: &host_runtime::Client, session: &SessionId) -> Vec<serde_json::Value> {
    let reply = client
        .request(ClientRequest::ReconcileSessions {
            sessions: vec![session.clone()],
        })
        .await
        .unwrap();
    let Reply::Reconciled(Ok(mut snapshots)) = reply else {
        panic!("reconcile answered {reply:?}");
    };
    snapshots.remove(0).outbox
}

/// The rows of the session's latest window (history and overlay), as JSON text.
pub async fn latest_rows(client: &host_runtime::Client, session: &SessionId) -> Vec<String> {
    let reply = client
        .request(ClientRequest::LatestWindow {
            session: session.clone(),
            target: TargetId::main(session),
            page_size: 100,
        })
        .await
        .unwrap();
    let Reply::LatestWindow(Ok(window)) = reply else {
        panic!("latest window answered {reply:?}");
    };
    let overlay = window.live_overlay.map(|o| o.blocks).unwrap_or_default();
    window
        .blocks
        .iter()
        .chain(overlay.iter())
        .map(|b| serde_json::to_string(b).unwrap())
        .collect()
}

/// The session's newest page of streamed fragments (`session.page`): how many of its
/// records are packed rows, and the text of its reply fragments, joined.
pub async fn streamed(client: &host_runtime::Client, session: &SessionId) -> (usize, String) {
    use timeline_core::history::{unpack_records, DeltaKind, SessionHistoryRecord};
    let reply = client
        .request(ClientRequest::SessionPage {
            session: session.clone(),
            before: None,
            max_events: 100_000,
        })
        .await
        .unwrap();
    let Reply::SessionPage(Ok(page)) = reply else {
        panic!("session page answered {reply:?}");
    };
    let rows = page
        .records
        .iter()
        .filter(|r| matches!(r, SessionHistoryRecord::Chunks(_)))
        .count();
    let text = unpack_records(&page.records)
        .unwrap()
        .iter()
        .filter_map(|e| e.as_delta())
        .filter(|(kind, _, _)| *kind == DeltaKind::Text)
        .map(|(_, _, text)| text.to_owned())
        .collect();
    (rows, text)
}

/// Waits until `done` answers true, at most `limit`.
pub async fn eventually_async<F, Fut>(what: &str, limit: Duration, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let began = Instant::now();
    while began.elapsed() < limit {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what} did not happen within {limit:?}");
}

/// Waits until `found` answers `Some`, at most `limit`, and gives what it found.
pub async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut found: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let began = Instant::now();
    while began.elapsed() < limit {
        if let Some(t) = found().await {
            return t;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what} did not happen within {limit:?}");
}

/// The session's active run, as the reconcile answers it.
pub async fn active_run(
    client: &host_runtime::Client,
    session: &timeline_core::SessionId,
) -> Option<outbox_core::ids::RunId> {
    let reply = client
        .request(ClientRequest::ReconcileSessions {
            sessions: vec![session.clone()],
        })
        .await
        .unwrap();
    let Reply::Reconciled(Ok(mut s)) = reply else {
        panic!("{reply:?}");
    };
    s.remove(0).active_run
}

/// The first pending approval card among the session's rows: its four IDs.
pub async fn pending_card(
    client: &host_runtime::Client,
    session: &timeline_core::SessionId,
) -> Option<[String; 4]> {
    latest_rows(client, session).await.iter().find_map(|row| {
        let v: serde_json::Value = serde_json::from_str(row).ok()?;
        let a = &v["data"]["approval"];
        (a["status"] == "pending").then(|| {
            ["requestId", "threadId", "turnId", "itemId"].map(|k| match &a[k] {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            })
        })
    })
}

/// Two devices decide the card `[request, thread, turn, item]` at once, one accepting,
/// one declining: exactly one is taken and the other is told it was already resolved
/// (RW-06). True when the accept was the one taken.
pub async fn decide_on_two_devices(client: &host_runtime::Client, card: [String; 4]) -> bool {
    let [request_id, thread_id, turn_id, item_id] = card;
    let decide = |decision| ClientRequest::ResolveApproval {
        request_id: request_id.clone(),
        thread_id: thread_id.clone(),
        turn_id: turn_id.clone(),
        item_id: item_id.clone(),
        decision,
    };
    let (a, b) = tokio::join!(
        client.request(decide(timeline_core::rows::Decision::Accept)),
        client.request(decide(timeline_core::rows::Decision::Decline)),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    let taken = [&a, &b]
        .iter()
        .filter(|r| matches!(r, Reply::Approval(Ok(_))))
        .count();
    let refused = [&a, &b]
        .iter()
        .filter(|r| {
            matches!(
                r,
                Reply::Approval(Err(host_core::ApprovalError::AlreadyResolved { .. }))
            )
        })
        .count();
    assert_eq!((taken, refused), (1, 1), "{a:?} / {b:?}");
    matches!(a, Reply::Approval(Ok(_)))
}
