//! The real Codex (`codex app-server` of the pinned `@openai/codex`) driven through the
//! runtime, the `Host` and `CodexAgent`, offline against the scripted model on
//! loopback. Needs the binary: `.ci/run` installs it; by hand,
//! `npm install --prefix ~/.cache/custody-agents @openai/codex@0.169.0`, or set
//! `CODEX_BIN`. Without it these tests fail saying so; they are never skipped.

#![allow(clippy::unwrap_used)] // a test: a failed step is a failed test

mod common;

use std::time::Duration;

use common::{eventually_async, latest_rows, outbox, submit, Rig};
use host_core::{ClientRequest, Reply};

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_message_to_real_codex_is_accepted_proven_answered_and_let_go() {
    // OB-08, OB-09: saved, accepted by the turn, proven by the echo of its clientId,
    // then the outbox lets it go; the reply streams into the session's rows.
    let rig = Rig::codex().await;
    let client = rig.runtime.client();
    let reply = client
        .request(submit(&rig.session, "op-real-1", "Say hello"))
        .await
        .unwrap();
    assert!(matches!(reply, Reply::Submitted(Ok(_))), "{reply:?}");
    eventually_async("the outbox to let the message go", Duration::from_secs(60), || async {
        outbox(&client, &rig.session).await.is_empty()
    })
    .await;
    eventually_async("the reply in the session's rows", Duration::from_secs(60), || async {
        latest_rows(&client, &rig.session)
            .await
            .iter()
            .any(|t| t.contains("Reply to: Say hello"))
    })
    .await;
    // Codex wrote the message, with its client ID, into the thread's rollout.
    let rollouts = rig.rollouts();
    assert!(
        rollouts
            .iter()
            .any(|p| agent_codex::rollout_holds(p, "op-real-1").unwrap_or(false)),
        "no rollout under {} holds op-real-1: {rollouts:?}",
        rig.home.display()
    );
    // One turn reached the model, with the user's words.
    let turns = rig.model.turns();
    assert!(!turns.is_empty());
    assert!(turns[0].body.to_string().contains("Say hello"));
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_stop_of_a_slow_real_codex_turn_is_stopped_and_the_run_ends() {
    // OB-08: the stop interrupts the running turn and settles.
    let rig = Rig::codex().await;
    let client = rig.runtime.client();
    client
        .request(submit(&rig.session, "op-slow-1", "Count slowly [[slow]]"))
        .await
        .unwrap();
    eventually_async("the slow turn to reach the model", Duration::from_secs(60), || async {
        !rig.model.turns().is_empty()
    })
    .await;
    let stop = client
        .request(ClientRequest::Stop {
            session: rig.session.clone(),
        })
        .await
        .unwrap();
    assert!(matches!(stop, Reply::Stop(_)), "{stop:?}");
    eventually_async("the outbox to let the message go", Duration::from_secs(60), || async {
        outbox(&client, &rig.session).await.is_empty()
    })
    .await;
    rig.stop().await;
}
