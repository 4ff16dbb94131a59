//! The real Claude Code (`claude -p` of the pinned `@anthropic-ai/claude-code`) driven
//! through the runtime, the `Host` and `ClaudeAgent`, offline against the scripted model
//! on loopback. Needs the binary: `.ci/run` installs it; by hand,
//! `npm install --prefix ~/.cache/custody-agents @anthropic-ai/claude-code@2.1.328`, or
//! set `CLAUDE_BIN`. Without it these tests fail saying so; they are never skipped.

#![allow(clippy::unwrap_used)] // a test: a failed step is a failed test

mod common;

use std::time::Duration;

use common::{
    active_run, eventually_async, latest_rows, outbox, pending_card, streamed, submit, Rig,
};
use host_core::{ClientRequest, Reply};

const OP_1: &str = "11111111-2222-4333-8444-555555555555";
const OP_2: &str = "22222222-3333-4444-8555-666666666666";

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
    // PK-06: the reply's streamed fragments are in the session's log, packed.
    let (rows, text) = streamed(&client, &rig.session).await;
    assert!(rows >= 1, "the reply is a packed row");
    assert!(text.contains("Reply to: Say hello"), "{text:?}");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_real_claude_permission_is_decided_on_one_device_and_refused_on_the_other() {
    // RW-06, AG-02: the first decision goes to Claude, the second device is told it was
    // already resolved, the turn finishes; the command ran only if accept won.
    let rig = Rig::claude().await;
    let client = rig.client();
    client
        .request(submit(&rig.session, OP_1, "Make the file [[tool]]"))
        .await
        .unwrap();
    let card = common::wait_for("the permission card", Duration::from_secs(60), || {
        pending_card(&client, &rig.session)
    })
    .await;
    let accepted = common::decide_on_two_devices(&client, card).await;
    eventually_async("the turn to finish", Duration::from_secs(60), || async {
        active_run(&client, &rig.session).await.is_none()
    })
    .await;
    let ran = rig.home.join("project/scripted-model-ran.txt").exists();
    assert_eq!(
        ran, accepted,
        "the file exists: {ran}, accepted: {accepted}"
    );
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn real_claude_killed_mid_turn_ends_the_run_and_the_next_message_resumes_the_session() {
    // OB-08, AG-02: the run ends with the process; the delivered message is not sent
    // again; the next message resumes the same Claude session.
    let rig = Rig::claude().await;
    let client = rig.client();
    client
        .request(submit(&rig.session, OP_1, "Count slowly [[slow]]"))
        .await
        .unwrap();
    eventually_async(
        "the slow turn to reach the model",
        Duration::from_secs(60),
        || async { !rig.model.turns().is_empty() },
    )
    .await;
    let pid = client.processes().await.unwrap()[0].pid.unwrap();
    std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    eventually_async("the run to end", Duration::from_secs(60), || async {
        active_run(&client, &rig.session).await.is_none()
    })
    .await;
    client
        .request(submit(&rig.session, OP_2, "Are you back"))
        .await
        .unwrap();
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
    eventually_async("the outbox to empty", Duration::from_secs(60), || async {
        outbox(&client, &rig.session).await.is_empty()
    })
    .await;
    let first = rig
        .model
        .turns()
        .iter()
        .filter(|t| {
            let last = t.body["messages"]
                .as_array()
                .and_then(|m| m.iter().rev().find(|m| m["role"] == "user").cloned());
            last.is_some_and(|l| l.to_string().contains("Count slowly"))
        })
        .count();
    assert_eq!(
        first, 1,
        "the killed turn's message went to the model again"
    );
    // The session's transcript holds the next message. (Whether it holds the first is
    // Claude's: 2.1.328 writes a message to its transcript well after it started, so a
    // kill in the first half second leaves none, and the next run creates the session
    // again under its ID rather than failing to resume it.)
    eventually_async(
        "the transcript to hold the next message",
        Duration::from_secs(60),
        || async { std::fs::read_to_string(rig.transcript()).is_ok_and(|t| t.contains(OP_2)) },
    )
    .await;
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn the_history_real_claude_wrote_gives_the_rows_the_clients_were_shown() {
    // TL-01, AG-02: the rows the live path showed (user message, reply) come back from
    // Claude's transcript with the same keys and words.
    let rig = Rig::claude().await;
    let client = rig.client();
    client
        .request(submit(&rig.session, OP_1, "Say hello"))
        .await
        .unwrap();
    eventually_async("the reply live", Duration::from_secs(60), || async {
        latest_rows(&client, &rig.session)
            .await
            .iter()
            .any(|t| t.contains("Reply to: Say hello"))
    })
    .await;
    let live: Vec<serde_json::Value> = latest_rows(&client, &rig.session)
        .await
        .iter()
        .map(|r| serde_json::from_str(r).unwrap())
        .filter(|r: &serde_json::Value| r["data"]["text"].is_string())
        .collect();
    assert!(live.len() >= 2, "the message and its reply: {live:?}");
    eventually_async(
        "the run to end and the transcript to hold it",
        Duration::from_secs(60),
        || async {
            active_run(&client, &rig.session).await.is_none()
                && std::fs::read_to_string(rig.transcript())
                    .is_ok_and(|t| t.contains("Reply to: Say hello"))
        },
    )
    .await;
    let reply = client
        .request(ClientRequest::LatestWindow {
            session: rig.session.clone(),
            target: timeline_core::TargetId::main(&rig.session),
            page_size: 100,
        })
        .await
        .unwrap();
    let Reply::LatestWindow(Ok(window)) = reply else {
        panic!("{reply:?}");
    };
    let saved: Vec<(String, String)> = window
        .blocks
        .iter()
        .filter_map(|b| {
            Some((
                b.id.as_str().to_owned(),
                b.data["text"].as_str()?.to_owned(),
            ))
        })
        .collect();
    for row in &live {
        let id = row["id"].as_str().unwrap().to_owned();
        let text = row["data"]["text"].as_str().unwrap().to_owned();
        assert!(
            saved.contains(&(id.clone(), text.clone())),
            "the live row {id} ({text:?}) is not in the history read back: {saved:?}"
        );
    }
    rig.stop().await;
}

/// The user entries of a transcript that carry `uuid`: a message Claude was given once
/// has exactly one.
fn user_entries(transcript: &str, uuid: &str) -> usize {
    transcript
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["type"] == "user" && v["uuid"] == uuid)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_real_claude_turn_whose_model_answers_500_first_is_retried_by_claude_and_sent_once() {
    // OB-08, AG-02: the model's failure is Claude's to retry; custody sends the message
    // once, and the transcript holds it once.
    let rig = Rig::claude().await;
    let client = rig.client();
    client
        .request(submit(&rig.session, OP_1, "Try again [[e500:1]]"))
        .await
        .unwrap();
    eventually_async(
        "the reply after the retry",
        Duration::from_secs(90),
        || async {
            latest_rows(&client, &rig.session)
                .await
                .iter()
                .any(|t| t.contains("Reply to: Try again"))
        },
    )
    .await;
    eventually_async(
        "the message to be let go",
        Duration::from_secs(60),
        || async {
            outbox(&client, &rig.session).await.is_empty()
                && active_run(&client, &rig.session).await.is_none()
        },
    )
    .await;
    let asked = rig
        .model
        .turns()
        .iter()
        .filter(|t| t.body.to_string().contains("Try again"))
        .count();
    assert!(asked >= 2, "the 500 was not retried: {asked} requests");
    let transcript = std::fs::read_to_string(rig.transcript()).unwrap();
    assert_eq!(user_entries(&transcript, OP_1), 1, "{transcript}");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_real_claude_stream_cut_halfway_ends_the_turn_without_sending_the_message_again() {
    // OB-08, AG-02: the model's stream breaks every time; Claude gives the turn up; the
    // message was delivered once (its echo proved it) and custody does not send it again.
    let rig = Rig::claude().await;
    let client = rig.client();
    client
        .request(submit(&rig.session, OP_1, "Broken stream [[cut]]"))
        .await
        .unwrap();
    eventually_async("the run to end", Duration::from_secs(180), || async {
        !rig.model.turns().is_empty()
            && active_run(&client, &rig.session).await.is_none()
            && outbox(&client, &rig.session).await.is_empty()
    })
    .await;
    let transcript = std::fs::read_to_string(rig.transcript()).unwrap();
    assert_eq!(user_entries(&transcript, OP_1), 1, "{transcript}");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_stop_ends_a_real_claude_turn_whose_model_hangs() {
    // OB-08, AG-02: a model that never answers does not hold the run: the stop ends it,
    // and the message, delivered, is not put back to be sent again.
    let rig = Rig::claude().await;
    let client = rig.client();
    client
        .request(submit(&rig.session, OP_1, "Wait forever [[hang]]"))
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
    assert!(
        outbox(&client, &rig.session).await.is_empty(),
        "a delivered message came back to be sent again"
    );
    rig.stop().await;
}
