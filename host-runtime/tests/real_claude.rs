//! The real Claude Code (`claude -p` of the pinned `@anthropic-ai/claude-code`) driven
//! through the runtime, the `Host` and `ClaudeAgent`, offline against the scripted model
//! on loopback. Needs the binary: `.ci/run` installs it; by hand,
//! `npm install --prefix ~/.cache/custody-agents @anthropic-ai/claude-code@2.1.328`, or
//! set `CLAUDE_BIN`. Without it these tests fail saying so; they are never skipped.

#![allow(clippy::unwrap_used)] // a test: a failed step is a failed test

mod common;

use std::time::Duration;

use common::{eventually_async, latest_rows, outbox, submit, Rig};
use host_core::{ClientRequest, Reply};

const OP_1: &str = "11111111-2222-4333-8444-555555555555";
const OP_2: &str = "22222222-3333-4444-8555-666666666666";

async fn active_run(
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

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_message_to_real_claude_is_accepted_proven_answered_and_let_go() {
    // AG-02, RT-01
    // OB-08, OB-09: saved, accepted (`command_lifecycle` queued), proven (started, the
    // echo), let go; the reply streams into the rows; the transcript holds the UUID.
    let rig = Rig::claude().await;
    let client = rig.client();
    let reply = client
        .request(submit(&rig.session, OP_1, "Say hello"))
        .await
        .unwrap();
    assert!(matches!(reply, Reply::Submitted(Ok(_))), "{reply:?}");
    eventually_async(
        "the outbox to let the message go",
        Duration::from_secs(60),
        || async { outbox(&client, &rig.session).await.is_empty() },
    )
    .await;
    eventually_async(
        "the reply in the session's rows",
        Duration::from_secs(60),
        || async {
            latest_rows(&client, &rig.session)
                .await
                .iter()
                .any(|t| t.contains("Reply to: Say hello"))
        },
    )
    .await;
    eventually_async("the run to end", Duration::from_secs(60), || async {
        active_run(&client, &rig.session).await.is_none()
    })
    .await;
    let transcript = std::fs::read_to_string(rig.transcript()).unwrap();
    assert!(
        transcript.contains(OP_1),
        "the transcript does not name the message"
    );
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_stop_of_real_claude_returns_the_queued_message_once_and_claude_never_runs_it() {
    // AG-02, RT-01
    // OB-08: Claude 2.1.328 keeps a message queued behind a turn through a plain
    // interrupt and runs it next; the stop cancels it, so custody's put-back is the only
    // copy: the model never sees its words.
    let rig = Rig::claude().await;
    let client = rig.client();
    client
        .request(submit(&rig.session, OP_1, "Count slowly [[slow]]"))
        .await
        .unwrap();
    let run = common::wait_for("the slow turn", Duration::from_secs(60), || async {
        let run = active_run(&client, &rig.session).await;
        run.filter(|_| !rig.model.turns().is_empty())
    })
    .await;
    let mut steer = submit(&rig.session, OP_2, "Queued behind the turn");
    if let ClientRequest::Submit(s) = &mut steer {
        s.controls = outbox_core::Controls::steer(run);
    }
    let reply = client.request(steer).await.unwrap();
    assert!(matches!(reply, Reply::Submitted(Ok(_))), "{reply:?}");
    // Wait until Claude queued it (the outbox shows it accepted, not sending).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stop = client
        .request(ClientRequest::Stop {
            session: rig.session.clone(),
        })
        .await
        .unwrap();
    assert!(matches!(stop, Reply::Stop(_)), "{stop:?}");
    eventually_async("the run to end", Duration::from_secs(60), || async {
        active_run(&client, &rig.session).await.is_none()
    })
    .await;
    // Give Claude time to run a queued message if it kept one.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ran = rig
        .model
        .turns()
        .iter()
        .any(|t| t.body.to_string().contains("Queued behind the turn"));
    let held = outbox(&client, &rig.session).await;
    assert!(
        !ran || held.is_empty(),
        "Claude ran the message and custody still holds it: a double send ({held:?})"
    );
    assert!(
        ran || !held.is_empty(),
        "the message is neither run nor held: lost"
    );
    // With `cancel_queued` Claude drops it: it comes back to the outbox, held for the
    // user (automatic drain off), and the model never saw it.
    assert!(!ran, "Claude ran the queued message after the stop");
    assert_eq!(held.len(), 1, "{held:?}");
    rig.stop().await;
}
