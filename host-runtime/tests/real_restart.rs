//! The host restarted mid-turn from its SQLite file, with the real Codex: the runtime
//! shuts down while a slow turn runs (the Codex process group goes with it), a new
//! runtime opens the same file and resumes the thread, and the next message goes into
//! that thread once, with nothing lost or sent twice.

#![allow(clippy::unwrap_used)] // a test: a failed step is a failed test

mod common;

use std::path::Path;
use std::time::Duration;

use agent_codex::{CodexAgent, ThreadConfig};
use common::{codex_home, codex_spec, eventually_async, outbox, submit};
use host_core::{ClientRequest, Host, HostConfig, Reply};
use host_runtime::Runtime;
use outbox_core::adapter::Capabilities;
use outbox_core::SessionInfo;
use scripted_model::ModelServer;
use storage_sqlite::{Settings, SqliteStore};
use timeline_core::{HostKey, SessionId};

fn start(file: &Path, home: &Path, session: &SessionId, thread: Option<String>) -> Runtime {
    // A restarted host draws fresh IDs, as a real one would (its generator is random).
    let mut n: u64 = if thread.is_some() { 1_000_000 } else { 0 };
    let uuids = Box::new(move || {
        n += 1;
        format!("00000000-0000-4000-8000-{n:012x}")
    });
    let mut host = Host::new(
        SqliteStore::open(file, Settings::default()).unwrap(),
        SqliteStore::open(file, Settings::default()).unwrap(),
        HostConfig::new(HostKey::from_bytes([7; 32]), uuids),
    );
    let mut agent = CodexAgent::new(codex_spec(home), "custody-tests", "0.1.0");
    let mut config =
        ThreadConfig::new(home.join("work").display().to_string()).sandbox("danger-full-access");
    if let Some(t) = thread {
        config = config.resume(t);
    }
    agent.add_session(session, config);
    // The history is the thread's own, through `thread/items/list`.
    let reader = agent_codex::ItemsReader::start(
        agent_codex::DriverConfig::from_spec(&codex_spec(home)),
        "custody-tests-history",
        "0.1.0",
    )
    .unwrap();
    let pages: agent_codex::SharedPages = std::sync::Arc::new(std::sync::Mutex::new(reader));
    let source = agent_codex::ItemsSource::new(pages, agent.thread_link(session).unwrap(), 1);
    host.add_session(
        session,
        SessionInfo::new(Capabilities::codex()),
        Box::new(source),
    );
    let mut runtime = Runtime::builder(host).agent(agent).start().unwrap();
    let mut outputs = runtime.take_outputs();
    tokio::spawn(async move { while outputs.next().await.is_some() {} });
    runtime
}

fn rollouts(home: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![home.join("sessions")];
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

async fn active_run(client: &host_runtime::Client, session: &SessionId) -> bool {
    let reply = client
        .request(ClientRequest::ReconcileSessions {
            sessions: vec![session.clone()],
        })
        .await
        .unwrap();
    let Reply::Reconciled(Ok(mut s)) = reply else {
        panic!("{reply:?}");
    };
    s.remove(0).active_run.is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn the_host_restarted_mid_turn_from_its_sqlite_file_resumes_the_thread_and_sends_once() {
    // OB-08, ST-03, AG-02, RT-01
    let model = ModelServer::start().unwrap();
    let home = codex_home(&model);
    std::fs::create_dir_all(home.join("work")).unwrap();
    let file = home.join("custody.sqlite");
    let session = SessionId::new("s-1").unwrap();

    let runtime = start(&file, &home, &session, None);
    let client = runtime.client();
    client
        .request(submit(&session, "op-before", "Count slowly [[slow]]"))
        .await
        .unwrap();
    eventually_async("the slow turn", Duration::from_secs(60), || async {
        active_run(&client, &session).await && !model.turns().is_empty()
    })
    .await;
    let codex_pid = client.processes().await.unwrap()[0].pid.unwrap();
    // The host stops mid-turn; its agent's process group goes with it.
    runtime.shutdown().await.unwrap();
    eventually_async(
        "the old Codex to be gone",
        Duration::from_secs(10),
        || async {
            !Path::new(&format!("/proc/{codex_pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{codex_pid}/stat"))
                    .is_ok_and(|s| s.contains(") Z "))
        },
    )
    .await;
    // The thread's ID, as an embedder keeps it: from the rollout's name.
    let rollout = rollouts(&home).pop().expect("Codex wrote its rollout");
    let name = rollout.file_stem().unwrap().to_string_lossy().into_owned();
    let thread: String = name.rsplitn(6, '-').collect::<Vec<_>>()[..5]
        .iter()
        .rev()
        .copied()
        .collect::<Vec<_>>()
        .join("-");

    let runtime = start(&file, &home, &session, Some(thread));
    let client = runtime.client();
    client
        .request(submit(&session, "op-after", "Back again"))
        .await
        .unwrap();
    eventually_async(
        "the outbox to be empty",
        Duration::from_secs(90),
        || async { outbox(&client, &session).await.is_empty() },
    )
    .await;
    eventually_async(
        "the message to reach the model",
        Duration::from_secs(60),
        || async {
            model
                .turns()
                .iter()
                .any(|t| t.body.to_string().contains("Back again"))
        },
    )
    .await;
    // One thread, one rollout, each message once in it.
    let all = rollouts(&home);
    assert_eq!(all.len(), 1, "a second thread was opened: {all:?}");
    let text = std::fs::read_to_string(&all[0]).unwrap();
    for op in ["op-before", "op-after"] {
        let n = text.matches(&format!("\"client_id\":\"{op}\"")).count()
            + text.matches(&format!("\"clientId\":\"{op}\"")).count();
        assert!(
            agent_codex::rollout_holds(&all[0], op).unwrap(),
            "{op} missing"
        );
        assert!(n <= 2, "{op} appears {n} times");
    }
    let before = model
        .turns()
        .iter()
        .filter(|t| {
            t.body["input"]
                .as_array()
                .and_then(|i| i.last())
                .is_some_and(|l| l.to_string().contains("Count slowly"))
        })
        .count();
    assert_eq!(
        before, 1,
        "the first message was sent again after the restart"
    );
    runtime.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&home);
}
