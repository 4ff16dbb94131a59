//! The real `codex-acp` (the pinned `@zed-industries/codex-acp`) driven through the
//! runtime, the `Host` and the ACP agent, offline against the scripted model on
//! loopback. Needs the binary: `.ci/run` installs it; by hand, `npm install --prefix
//! ~/.cache/custody-agents @zed-industries/codex-acp@0.16.0`, or set `CODEX_ACP_BIN`.
//! Without it these tests fail saying so; they are never skipped.

#![allow(clippy::unwrap_used)] // a test: a failed step is a failed test

mod common;

use std::time::Duration;

use common::{active_run, eventually_async, latest_rows, outbox, submit, Rig};
use host_core::{ClientRequest, Reply};
use outbox_core::custody::{SubmitError, ValidationError};

const OP_1: &str = "11111111-2222-4333-8444-555555555555";
const OP_2: &str = "22222222-3333-4444-8555-666666666666";
const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_message_to_a_real_acp_agent_is_answered_and_its_timeline_is_its_history() {
    // AG-03, RT-01, OB-08: saved, accepted and proven by the agent's first update, let
    // go; the reply streams into the rows; once the run ended the window reads the
    // turn from history, each row once.
    let rig = Rig::codex_acp().await;
    let client = rig.client();
    let reply = client
        .request(submit(&rig.session, OP_1, "Say hello"))
        .await
        .unwrap();
    assert!(matches!(reply, Reply::Submitted(Ok(_))), "{reply:?}");
    eventually_async("the outbox to let the message go", MINUTE, || async {
        outbox(&client, &rig.session).await.is_empty()
    })
    .await;
    eventually_async("the run to end", MINUTE, || async {
        active_run(&client, &rig.session).await.is_none()
    })
    .await;
    eventually_async("the reply in the session's rows", MINUTE, || async {
        latest_rows(&client, &rig.session)
            .await
            .iter()
            .any(|t| t.contains("Reply to: Say hello"))
    })
    .await;
    let rows = latest_rows(&client, &rig.session).await;
    let replies = rows
        .iter()
        .filter(|t| t.contains("Reply to: Say hello"))
        .count();
    let users = rows.iter().filter(|t| t.contains(OP_1)).count();
    assert_eq!((users, replies), (1, 1), "each row once: {rows:#?}");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_message_into_the_running_turn_of_an_acp_agent_is_refused_at_submit() {
    // AG-03, OB-04: ACP v1 has no steer: refused with no receipt, as replace latest is
    // for Claude; the running turn goes on.
    let rig = Rig::codex_acp().await;
    let client = rig.client();
    client
        .request(submit(&rig.session, OP_1, "Count slowly [[slow]]"))
        .await
        .unwrap();
    let run = common::wait_for("the slow turn", MINUTE, || async {
        active_run(&client, &rig.session).await
    })
    .await;
    let mut steer = submit(&rig.session, OP_2, "Into the turn");
    if let ClientRequest::Submit(s) = &mut steer {
        s.controls = outbox_core::Controls::steer(run);
    }
    let reply = client.request(steer).await.unwrap();
    assert_eq!(
        reply,
        Reply::Submitted(Err(SubmitError::Invalid(ValidationError::Unsupported(
            "steer-running"
        ))))
    );
    eventually_async("the run to end", MINUTE, || async {
        active_run(&client, &rig.session).await.is_none()
    })
    .await;
    assert!(rig
        .model
        .turns()
        .iter()
        .all(|t| !t.body.to_string().contains("Into the turn")));
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_message_whose_acp_agent_died_before_a_word_is_held_for_the_user_never_resent() {
    // AG-03, OB-08: the agent killed while the prompt is out and nothing came back: the
    // outcome is unknown and ACP gives nothing to prove it, so the message is held for
    // the user with the unconfirmed text; the agent never gets it a second time.
    let rig = Rig::codex_acp().await;
    let client = rig.client();
    client
        .request(submit(&rig.session, OP_1, "Wait for me [[hang]]"))
        .await
        .unwrap();
    eventually_async("the model to be asked", MINUTE, || async {
        !rig.model.turns().is_empty()
    })
    .await;
    let work = rig.home.join("work");
    assert!(
        Rig::kill_processes_in(&work) >= 1,
        "no agent process in {work:?}"
    );
    let held = common::wait_for("the message held for the user", MINUTE, || async {
        let o = outbox(&client, &rig.session).await;
        o.into_iter()
            .find(|e| e.to_string().contains(outbox_core::entry::UNCONFIRMED_TEXT))
    })
    .await;
    assert!(held.to_string().contains(OP_1), "{held}");
    // Nothing sends it again by itself: one model turn carried its words.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let asked = rig
        .model
        .turns()
        .iter()
        .filter(|t| t.body.to_string().contains("Wait for me"))
        .count();
    assert_eq!(asked, 1);
    rig.stop().await;
}
