//! Submit to echo with the real Codex: 100 messages, one turn each, through
//! `CodexAgent` and the real `codex app-server` against the scripted model; the time
//! from the send to its delivery proof (the `userMessage` echo), p50 and p99, and the
//! share of it spent in this crate's code (the agent's methods), measured apart.
//!
//! `cargo bench -p agent-codex --bench real_latency` (needs the pinned Codex).

#![allow(clippy::unwrap_used)] // a bench: a failed step is a failed run
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // it reads the clock
#![allow(missing_docs)]

use std::time::{Duration, Instant};

use agent_codex::{CodexAgent, ThreadConfig};
use host_core::{AgentCall, AgentInput, ProcessSpec};
use outbox_core::adapter::{AttemptId, SendKind, SendRequest};
use outbox_core::{MessageRequest, OperationId};
use scripted_model::drive::Blocking;
use scripted_model::ModelServer;
use timeline_core::key::{RunId, SessionId};
use timeline_core::time::Millis;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let model = ModelServer::start().unwrap();
    let home = std::env::temp_dir().join(format!("custody-latency-{}", std::process::id()));
    scripted_model::agents::write_codex_home(&home, &model).unwrap();
    std::fs::create_dir_all(home.join("work")).unwrap();
    let bin = scripted_model::agents::codex_bin().unwrap_or_else(|e| panic!("{e}"));
    let spec = ProcessSpec::new(bin)
        .args(["app-server"])
        .env("CODEX_HOME", home.as_os_str())
        .env("SCRIPTED_MODEL_KEY", "sk")
        .env_remove("OPENAI_API_KEY")
        .cwd(&home);
    let session = SessionId::new("s-1").unwrap();
    let mut agent = CodexAgent::new(spec, "latency", "0.1.0");
    agent.add_session(
        &session,
        ThreadConfig::new(home.join("work").display().to_string()),
    );
    let mut d = Blocking::new(agent);
    let mut totals = Vec::new();
    let mut ours = Vec::new();
    const N: u64 = 100;
    // One warm-up message (Codex starts, the thread opens), then N measured.
    for i in 0..=N {
        let op = format!("lat-{i}");
        let run = RunId::new(format!("run-{i}")).unwrap();
        d.inputs.clear();
        let before = d.agent_time;
        let began = Instant::now();
        d.call(AgentCall::Send(SendRequest {
            attempt: AttemptId(i + 1),
            session: session.clone(),
            operation_id: OperationId::new(&op).unwrap(),
            request: MessageRequest::text(format!("message {i}"), "bench", Millis(0)),
            kind: SendKind::Start { run: run.clone() },
            rollback_before_send: false,
            fresh_thread: false,
        }));
        d.until("the echo", Duration::from_secs(60), |inputs| {
            inputs
                .iter()
                .any(|x| matches!(x, AgentInput::DeliveryProof { operation_id, .. } if operation_id.as_str() == op))
        });
        let total = began.elapsed();
        let share = d.agent_time - before;
        d.until("the run's end", Duration::from_secs(60), |inputs| {
            inputs
                .iter()
                .any(|x| matches!(x, AgentInput::RunEnded { run: r, .. } if *r == run))
        });
        if i > 0 {
            totals.push(total);
            ours.push(share);
        }
    }
    totals.sort();
    ours.sort();
    println!(
        "submit to echo, real Codex {} ({} messages): p50 {:?}, p99 {:?}; this crate's share: p50 {:?}, p99 {:?}",
        scripted_model::agents::CODEX_VERSION,
        N,
        percentile(&totals, 0.5),
        percentile(&totals, 0.99),
        percentile(&ours, 0.5),
        percentile(&ours, 0.99),
    );
    let _ = std::fs::remove_dir_all(&home);
}
