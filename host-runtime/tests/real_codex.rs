//! The real Codex (`codex app-server` of the pinned `@openai/codex`) driven through the
//! runtime, the `Host` and `CodexAgent`, offline against the scripted model on
//! loopback. Needs the binary: `.ci/run` installs it; by hand,
//! `npm install --prefix ~/.cache/custody-agents @openai/codex@0.169.0`, or set
//! `CODEX_BIN`. Without it these tests fail saying so; they are never skipped.

#![allow(clippy::unwrap_used)] // a test: a failed step is a failed test

mod common;

use std::time::Duration;

use common::{
    active_run, eventually_async, latest_rows, outbox, pending_card, streamed, submit, wait_for,
    Rig,
};
use host_core::{ClientRequest, Reply};

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_message_to_real_codex_is_accepted_proven_answered_and_let_go() {
    // AG-02, RT-01
    // OB-08, OB-09: saved, accepted by the turn, proven by the echo of its clientId,
    // then the outbox lets it go; the reply streams into the session's rows.
    let rig = Rig::codex().await;
    let client = rig.client();
    let reply = client
        .request(submit(&rig.session, "op-real-1", "Say hello"))
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
    // PK-06: the reply's streamed fragments are in the session's log, packed.
    let (rows, text) = streamed(&client, &rig.session).await;
    assert!(rows >= 1, "the reply is a packed row");
    assert!(text.contains("Reply to: Say hello"), "{text:?}");
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
    let client = rig.client();
    client
        .request(submit(&rig.session, "op-slow-1", "Count slowly [[slow]]"))
        .await
        .unwrap();
    eventually_async(
        "the slow turn to reach the model",
        Duration::from_secs(60),
        || async { !rig.model.turns().is_empty() },
    )
    .await;
    let stop = client
        .request(ClientRequest::Stop {
            session: rig.session.clone(),
        })
        .await
        .unwrap();
    assert!(matches!(stop, Reply::Stop(_)), "{stop:?}");
    eventually_async(
        "the outbox to let the message go",
        Duration::from_secs(60),
        || async { outbox(&client, &rig.session).await.is_empty() },
    )
    .await;
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_steer_into_a_slow_real_codex_turn_is_accepted_and_proven_in_that_turn() {
    // OB-08, OB-09: `turn/steer` with the run's turn as `expectedTurnId`.
    let rig = Rig::codex().await;
    let client = rig.client();
    client
        .request(submit(&rig.session, "op-first", "Count slowly [[slow]]"))
        .await
        .unwrap();
    let run = wait_for("the run to be active", Duration::from_secs(60), || async {
        let run = active_run(&client, &rig.session).await;
        run.filter(|_| !rig.model.turns().is_empty())
    })
    .await;
    let mut steer = submit(&rig.session, "op-steer", "And then say done");
    if let ClientRequest::Submit(s) = &mut steer {
        s.controls = outbox_core::Controls::steer(run.clone());
    }
    let reply = client.request(steer).await.unwrap();
    assert!(matches!(reply, Reply::Submitted(Ok(_))), "{reply:?}");
    eventually_async(
        "both messages to be let go",
        Duration::from_secs(90),
        || async { outbox(&client, &rig.session).await.is_empty() },
    )
    .await;
    // Both are in the thread's rollout: the steer was delivered, not dropped.
    let rollouts = rig.rollouts();
    for op in ["op-first", "op-steer"] {
        assert!(
            rollouts
                .iter()
                .any(|p| agent_codex::rollout_holds(p, op).unwrap_or(false)),
            "{op} is not in the rollout"
        );
    }
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_real_codex_approval_is_decided_on_one_device_and_refused_on_the_other() {
    // RW-06: the first allowed decision goes to Codex; the second device is told it was
    // already resolved; the turn then finishes with the command's output.
    let rig = Rig::codex_with(|t| t.approval_policy("untrusted")).await;
    let client = rig.client();
    client
        .request(submit(&rig.session, "op-tool", "Make the file [[tool]]"))
        .await
        .unwrap();
    let card = wait_for("the approval card", Duration::from_secs(60), || {
        pending_card(&client, &rig.session)
    })
    .await;
    let accepted = common::decide_on_two_devices(&client, card).await;
    eventually_async("the turn to finish", Duration::from_secs(60), || async {
        outbox(&client, &rig.session).await.is_empty()
            && active_run(&client, &rig.session).await.is_none()
    })
    .await;
    // The command ran only when the accept was the decision taken.
    let ran = rig.home.join("work/scripted-model-ran.txt").exists();
    assert_eq!(
        ran, accepted,
        "the file exists: {ran}, accepted: {accepted}"
    );
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn real_codex_killed_mid_turn_sends_nothing_twice_and_serves_the_next_message() {
    // AG-02, RT-01
    // OB-08: the run ends with the process; what was delivered is not sent again; the
    // next message starts Codex again and resumes the thread.
    let rig = Rig::codex().await;
    let client = rig.client();
    client
        .request(submit(&rig.session, "op-killed", "Count slowly [[slow]]"))
        .await
        .unwrap();
    eventually_async(
        "the slow turn to reach the model",
        Duration::from_secs(60),
        || async { !rig.model.turns().is_empty() },
    )
    .await;
    let processes = client.processes().await.unwrap();
    let pid = processes[0].pid.unwrap();
    std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    eventually_async("the run to end", Duration::from_secs(60), || async {
        active_run(&client, &rig.session).await.is_none()
    })
    .await;
    client
        .request(submit(&rig.session, "op-after", "Are you back"))
        .await
        .unwrap();
    eventually_async(
        "the next message to be let go",
        Duration::from_secs(90),
        || async { outbox(&client, &rig.session).await.is_empty() },
    )
    .await;
    // The echo comes before the model is asked: wait for the model too.
    eventually_async(
        "the next message to reach the model",
        Duration::from_secs(60),
        || async {
            rig.model
                .turns()
                .iter()
                .any(|t| t.body.to_string().contains("Are you back"))
        },
    )
    .await;
    let turns = rig.model.turns();
    let killed = turns
        .iter()
        .filter(|t| {
            let last = t.body["input"].as_array().and_then(|i| i.last()).cloned();
            last.is_some_and(|l| l.to_string().contains("Count slowly"))
        })
        .count();
    assert_eq!(
        killed, 1,
        "the killed turn's message went to the model again"
    );
    let after = client.processes().await.unwrap();
    assert_ne!(
        after[0].pid,
        Some(pid),
        "a new Codex serves the next message"
    );
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_message_queued_behind_a_real_codex_run_goes_after_it_and_an_interrupt_replaces_the_turn()
{
    // OB-04, OB-10: `queue` waits for the run to end; `interrupt-running` stops the
    // running turn and starts its own.
    let rig = Rig::codex().await;
    let client = rig.client();
    client
        .request(submit(&rig.session, "op-run", "Count slowly [[slow]]"))
        .await
        .unwrap();
    eventually_async("the slow turn", Duration::from_secs(60), || async {
        active_run(&client, &rig.session).await.is_some() && !rig.model.turns().is_empty()
    })
    .await;
    client
        .request(submit(&rig.session, "op-queued", "After the run"))
        .await
        .unwrap();
    let mut interrupt = submit(&rig.session, "op-interrupt", "Stop and do this");
    if let ClientRequest::Submit(s) = &mut interrupt {
        s.controls = outbox_core::Controls::interrupt();
    }
    client.request(interrupt).await.unwrap();
    eventually_async(
        "every message to be let go",
        Duration::from_secs(90),
        || async { outbox(&client, &rig.session).await.is_empty() },
    )
    .await;
    eventually_async(
        "both to reach the model",
        Duration::from_secs(60),
        || async {
            let turns = rig.model.turns();
            let has = |w: &str| turns.iter().any(|t| t.body.to_string().contains(w));
            has("After the run") && has("Stop and do this")
        },
    )
    .await;
    for op in ["op-run", "op-queued", "op-interrupt"] {
        assert!(
            rig.rollouts()
                .iter()
                .any(|p| agent_codex::rollout_holds(p, op).unwrap_or(false)),
            "{op} is not in the rollout"
        );
    }
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_real_codex_turn_whose_model_answers_500_first_is_retried_by_codex_and_sent_once() {
    // OB-08: the model's failure is Codex's to retry; custody sends the message once.
    let rig = Rig::codex().await;
    let client = rig.client();
    client
        .request(submit(&rig.session, "op-500", "Try again [[e500:1]]"))
        .await
        .unwrap();
    eventually_async(
        "the reply after the retry",
        Duration::from_secs(60),
        || async {
            latest_rows(&client, &rig.session)
                .await
                .iter()
                .any(|t| t.contains("Reply to: Try again"))
        },
    )
    .await;
    let turns = rig.model.turns();
    assert!(turns.len() >= 2, "the 500 was not retried: {}", turns.len());
    let holders = rig
        .rollouts()
        .iter()
        .filter(|p| agent_codex::rollout_holds(p, "op-500").unwrap_or(false))
        .count();
    assert_eq!(holders, 1);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_thread_started_with_its_own_model_and_provider_asks_that_model() {
    // AG-01: the model and the provider go in `thread/start`, not only `config.toml`.
    let rig = Rig::codex_with(|t| t.model("gpt-custom-test", Some("scripted"))).await;
    let client = rig.client();
    client
        .request(submit(&rig.session, "op-model", "Which model"))
        .await
        .unwrap();
    eventually_async(
        "the turn to reach the model",
        Duration::from_secs(60),
        || async { !rig.model.turns().is_empty() },
    )
    .await;
    assert_eq!(rig.model.turns()[0].body["model"], "gpt-custom-test");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_real_codex_stream_cut_halfway_ends_the_turn_without_sending_the_message_again() {
    // OB-08, AG-02: the model's stream breaks every time; Codex retries it and gives
    // the turn up; the message was delivered once and is not sent again.
    let rig = Rig::codex().await;
    let client = rig.client();
    client
        .request(submit(&rig.session, "op-cut", "Broken stream [[cut]]"))
        .await
        .unwrap();
    eventually_async("the run to end", Duration::from_secs(90), || async {
        !rig.model.turns().is_empty()
            && active_run(&client, &rig.session).await.is_none()
            && outbox(&client, &rig.session).await.is_empty()
    })
    .await;
    let holders: Vec<_> = rig
        .rollouts()
        .into_iter()
        .filter(|p| agent_codex::rollout_holds(p, "op-cut").unwrap_or(false))
        .collect();
    assert_eq!(holders.len(), 1, "the message is in one rollout");
    let echoes = std::fs::read_to_string(&holders[0])
        .unwrap()
        .matches("\"op-cut\"")
        .count();
    assert!(echoes >= 1);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_stop_ends_a_real_codex_turn_whose_model_hangs() {
    // OB-08, AG-02: a model that never answers does not hold the run: the stop ends it.
    let rig = Rig::codex().await;
    let client = rig.client();
    client
        .request(submit(&rig.session, "op-hang", "Wait forever [[hang]]"))
        .await
        .unwrap();
    eventually_async("the hung turn", Duration::from_secs(60), || async {
        active_run(&client, &rig.session).await.is_some() && !rig.model.turns().is_empty()
    })
    .await;
    let stop = client
        .request(ClientRequest::Stop {
            session: rig.session.clone(),
        })
        .await
        .unwrap();
    assert!(matches!(stop, Reply::Stop(_)), "{stop:?}");
    eventually_async("the run to end", Duration::from_secs(30), || async {
        active_run(&client, &rig.session).await.is_none()
    })
    .await;
    rig.stop().await;
}

/// The rows of the session's latest window: `(id, text)` of its history rows and of its
/// live overlay rows.
async fn window_rows(
    client: &host_runtime::Client,
    session: &timeline_core::SessionId,
) -> (Vec<(String, String)>, Vec<(String, String)>) {
    let reply = client
        .request(ClientRequest::LatestWindow {
            session: session.clone(),
            target: timeline_core::TargetId::main(session),
            page_size: 100,
        })
        .await
        .unwrap();
    let Reply::LatestWindow(Ok(window)) = reply else {
        panic!("{reply:?}");
    };
    let rows = |blocks: &[timeline_core::Block]| -> Vec<(String, String)> {
        blocks
            .iter()
            .filter_map(|b| {
                Some((
                    b.id.as_str().to_owned(),
                    b.data["text"].as_str()?.to_owned(),
                ))
            })
            .collect()
    };
    let overlay = window
        .live_overlay
        .map(|o| rows(&o.blocks))
        .unwrap_or_default();
    (rows(&window.blocks), overlay)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn the_history_real_codex_lists_gives_the_rows_the_clients_were_shown() {
    // AG-05, TL-01, OV-06, AG-02: read through `thread/items/list`, the thread's history holds
    // every row a window was shown live (the user's message, the reply streaming slowly)
    // under the same key, with the reply's words, so the run's exact scan settles them
    // out of the overlay.
    let rig = Rig::codex().await;
    let client = rig.client();
    let reply = client
        .request(ClientRequest::Subscribe {
            window: overlay_core::WindowId(1),
            session: rig.session.clone(),
            target: timeline_core::TargetId::main(&rig.session),
            protocol: overlay_core::LiveProtocol::Snapshots,
        })
        .await
        .unwrap();
    assert!(matches!(reply, Reply::Subscribed(Ok(_))), "{reply:?}");
    client
        .request(submit(&rig.session, "op-real-1", "Say hello [[slow]]"))
        .await
        .unwrap();
    let (history, overlay) = wait_for(
        "the rows shown live settled into the history Codex lists",
        Duration::from_secs(60),
        || async {
            let shown = rig.shown.lock().unwrap().clone();
            let (history, overlay) = window_rows(&client, &rig.session).await;
            let replied = history
                .iter()
                .any(|(_, t)| t.contains("Reply to: Say hello"));
            let settled = !shown.is_empty()
                && shown.iter().all(|(id, _)| {
                    history.iter().any(|h| h.0 == *id) && overlay.iter().all(|o| o.0 != *id)
                });
            (replied && settled).then_some((history, overlay))
        },
    )
    .await;
    let shown = rig.shown.lock().unwrap().clone();
    // The reply was shown live, under the key history gives it.
    let (reply_id, _) = history
        .iter()
        .find(|(_, t)| t.contains("Reply to: Say hello"))
        .unwrap();
    assert!(shown.iter().any(|(id, _)| id == reply_id), "{shown:?}");
    assert!(history
        .iter()
        .any(|(id, t)| id == "user-message::op-real-1" && t == "Say hello [[slow]]"));
    assert!(overlay.is_empty(), "{overlay:?}");
    rig.stop().await;
}
