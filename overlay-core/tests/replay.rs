//! Replay on join: the server's ring buffer and the client reducer (RB-01 to RB-05).
#![allow(clippy::unwrap_used)]

use overlay_core::replay::{EventKind, ReplayBuffers, ReplayConfig, RunningState, MAX_CHUNK_BYTES};
use proptest::prelude::*;
use timeline_core::key::SessionId;
use timeline_core::replay::{
    ClientEffect, ConversationClient, EntryKind, ReplayOutcome, ReplayProblem, ViewRow,
};
use timeline_core::time::Millis;

fn s() -> SessionId {
    SessionId::new("s").unwrap()
}

fn config(max_events: usize, max_bytes: usize) -> ReplayConfig {
    ReplayConfig {
        max_events,
        max_bytes,
        idle_reclaim: Millis(60_000),
        chunk_bytes: MAX_CHUNK_BYTES,
    }
}

/// Appends the session-initialization event; returns its seq.
/// Buffers cutting replays into `chunk_bytes` chunks, with the session's init event.
fn started_with_chunks(chunk_bytes: usize) -> ReplayBuffers {
    let mut b = ReplayBuffers::new(ReplayConfig {
        chunk_bytes,
        ..ReplayConfig::default()
    });
    init(&mut b, Millis(0));
    b
}

fn init(b: &mut ReplayBuffers, at: Millis) -> u64 {
    b.append(
        &s(),
        EventKind::Init,
        r#"{"type":"session_init"}"#.into(),
        at,
    )
}

fn delta(text: &str) -> String {
    serde_json::json!({ "type": "assistant_delta", "text": text }).to_string()
}

fn join(buffers: &ReplayBuffers) -> ConversationClient {
    let mut c = ConversationClient::new();
    for chunk in buffers.replay(&s()) {
        c.handle_replay_chunk(&chunk.json, Millis(0));
    }
    c
}

// RB-01: the count cap, at the limit and one past; init is never trimmed.
#[test]
fn the_event_cap_trims_the_oldest_but_never_the_init_event() {
    let mut b = ReplayBuffers::new(config(3, usize::MAX));
    init(&mut b, Millis(0));
    for i in 0..3 {
        b.append(&s(), EventKind::Other, delta(&i.to_string()), Millis(0));
    }
    assert_eq!(b.len(&s()), 3);
    let c = join(&b);
    assert!(!c.truncated(), "at the limit nothing is trimmed");
    b.append(&s(), EventKind::Other, delta("3"), Millis(0));
    assert_eq!(b.len(&s()), 3);
    let c = join(&b);
    assert!(c.truncated());
    assert_eq!(c.entries()[0].kind, EntryKind::Init, "the init event stays");
    assert!(b.event(&s(), 1).is_none(), "the oldest event went");
    assert!(b.event(&s(), 0).is_some());
}

// RB-01: the byte cap is exact: the serialized size of what is replayed.
#[test]
fn the_byte_cap_counts_exactly_what_is_replayed() {
    let mut probe = ReplayBuffers::new(config(usize::MAX, usize::MAX));
    let seqs: Vec<u64> = (0..4)
        .map(|i| probe.append(&s(), EventKind::Other, delta(&format!("{i}")), Millis(0)))
        .collect();
    let sizes: Vec<usize> = seqs
        .iter()
        .map(|q| probe.event(&s(), *q).unwrap().len())
        .collect();
    let total: usize = sizes.iter().sum();
    assert_eq!(probe.bytes(&s()), total);
    // A cap of exactly the four events keeps them; one byte less drops the oldest.
    let mut b = ReplayBuffers::new(config(usize::MAX, total));
    for i in 0..4 {
        b.append(&s(), EventKind::Other, delta(&format!("{i}")), Millis(0));
    }
    assert_eq!((b.len(&s()), b.bytes(&s())), (4, total));
    let mut b = ReplayBuffers::new(config(usize::MAX, total - 1));
    for i in 0..4 {
        b.append(&s(), EventKind::Other, delta(&format!("{i}")), Millis(0));
    }
    assert_eq!(b.len(&s()), 3);
    assert_eq!(b.bytes(&s()), total - sizes[0]);
    // What is replayed is exactly those bytes plus the envelope.
    let chunks = b.replay(&s());
    let events: usize = (1..4).map(|q| b.event(&s(), q).unwrap().len()).sum();
    assert!(chunks[0].json.len() >= events + 2);
}

// RB-02: user messages, steers included, are recorded by the server in order.
#[test]
fn user_messages_are_recorded_at_their_true_position() {
    let mut b = ReplayBuffers::new(ReplayConfig::default());
    init(&mut b, Millis(0));
    b.append_user_message(&s(), "run the tests", Some("c-1"), Millis(1));
    b.append(&s(), EventKind::Other, delta("Running"), Millis(2));
    b.append_user_message(&s(), "also lint (steer)", Some("c-2"), Millis(3));
    b.append(&s(), EventKind::Other, delta("Linting"), Millis(4));
    let c = join(&b);
    let kinds: Vec<String> = c
        .entries()
        .iter()
        .map(|e| format!("{:?}:{}", std::mem::discriminant(&e.kind), e.text))
        .collect();
    assert_eq!(kinds.len(), 5);
    assert_eq!(c.entries()[3].text, "also lint (steer)");
    assert_eq!(c.entries()[4].text, "Linting");
}

// RB-03: chunks at most 256 KB, in order; decided approvals stamped.
#[test]
fn replay_chunks_stay_under_256_kb_and_decided_approvals_are_stamped() {
    let mut b = ReplayBuffers::new(ReplayConfig::default());
    init(&mut b, Millis(0));
    for i in 0..2_000 {
        b.append(
            &s(),
            EventKind::Other,
            delta(&"y".repeat(300 + i % 50)),
            Millis(0),
        );
    }
    let approval =
        serde_json::json!({"type": "approval_request", "requestId": "r1", "text": "rm -rf build"})
            .to_string();
    b.append(
        &s(),
        EventKind::Approval {
            request_id: "r1".into(),
        },
        approval,
        Millis(0),
    );
    b.decide_approval(&s(), "r1", false);
    let chunks = b.replay(&s());
    assert!(chunks.len() >= 3);
    for (i, c) in chunks.iter().enumerate() {
        assert!(
            c.json.len() <= MAX_CHUNK_BYTES,
            "chunk {i}: {}",
            c.json.len()
        );
        assert_eq!(c.seq, i as u64);
        assert_eq!(c.last, i + 1 == chunks.len());
        serde_json::from_str::<serde_json::Value>(&c.json).unwrap();
    }
    let client = join(&b);
    let card = client.entries().last().unwrap();
    assert_eq!(
        card.kind,
        EntryKind::Approval {
            request_id: "r1".into(),
            outcome: Some("denied".into())
        }
    );
}

// RB-03: an event larger than a chunk travels as a marker, never dropped silently.
#[test]
fn an_event_larger_than_a_chunk_is_replaced_by_a_marker() {
    let mut b = ReplayBuffers::new(ReplayConfig::default());
    init(&mut b, Millis(0));
    let big = b.append(
        &s(),
        EventKind::Other,
        delta(&"z".repeat(300_000)),
        Millis(0),
    );
    b.append(&s(), EventKind::Other, delta("after"), Millis(0));
    let chunks = b.replay(&s());
    assert!(chunks.iter().all(|c| c.json.len() <= MAX_CHUNK_BYTES));
    let c = join(&b);
    assert!(c.truncated(), "the replay says it is not complete");
    assert_eq!(c.entries()[1].seq, big);
    assert!(matches!(c.entries()[1].kind, EntryKind::Omitted { bytes } if bytes > 300_000));
    assert_eq!(c.entries()[2].text, "after");
}

// RB-05: an idle session is reclaimed at its deadline; resumed, it starts empty and
// says so.
#[test]
fn an_idle_session_is_reclaimed_and_a_resumed_one_says_so() {
    let mut b = ReplayBuffers::new(config(100, usize::MAX));
    b.subscribe(&s(), Millis(0));
    init(&mut b, Millis(0));
    assert_eq!(b.poll_timeout(), None, "subscribed sessions are kept");
    b.unsubscribe(&s(), Millis(1_000));
    assert_eq!(b.poll_timeout(), Some(Millis(61_000)));
    b.handle_timeout(Millis(60_999));
    assert_eq!(b.len(&s()) + usize::from(b.event(&s(), 0).is_some()), 1);
    b.handle_timeout(Millis(61_000));
    b.handle_timeout(Millis(61_000));
    assert!(b.event(&s(), 0).is_none());
    assert!(b.was_reclaimed(&s()));
    // Resumed: new events, a fresh record, and the replay says it was reclaimed.
    b.subscribe(&s(), Millis(70_000));
    init(&mut b, Millis(70_000));
    let chunks = b.replay(&s());
    assert!(chunks[0].json.contains(r#""reclaimed":true"#));
    let c = join(&b);
    assert!(c.reclaimed() && c.truncated());
    assert_eq!(c.entries().len(), 1);
}

// RB-04: seq 0 rebuilds; live-only effects are suppressed until the last chunk; the
// envelope's running state is adopted.
#[test]
fn a_rebuild_suppresses_live_only_effects_and_adopts_the_running_state() {
    let mut b = started_with_chunks(2_048);
    for i in 0..40 {
        let run = serde_json::json!({"type": "run_state", "running": i % 2 == 0}).to_string();
        b.append(&s(), EventKind::Other, run, Millis(0));
        let approval =
            serde_json::json!({"type": "approval_request", "requestId": format!("r{i}")})
                .to_string();
        b.append(
            &s(),
            EventKind::Approval {
                request_id: format!("r{i}"),
            },
            approval,
            Millis(0),
        );
    }
    b.set_running(
        &s(),
        RunningState {
            running: true,
            run_id: Some("run-9".into()),
        },
        Millis(0),
    );
    let chunks = b.replay(&s());
    assert!(chunks.len() > 2);
    let mut c = ConversationClient::new();
    c.set_queued(2);
    for chunk in &chunks[..chunks.len() - 1] {
        assert_eq!(
            c.handle_replay_chunk(&chunk.json, Millis(0)),
            ReplayOutcome::Progress
        );
        assert!(
            c.poll_effect().is_none(),
            "no live-only effect leaks during replay"
        );
        assert!(c.entries().is_empty(), "never a half-rebuilt timeline");
    }
    assert_eq!(
        c.handle_replay_chunk(&chunks.last().unwrap().json, Millis(0)),
        ReplayOutcome::Complete
    );
    assert!(c.running(), "the envelope's running state");
    let effects: Vec<ClientEffect> = std::iter::from_fn(|| c.poll_effect()).collect();
    assert_eq!(effects, [ClientEffect::RunningChanged(true)]);
    assert_eq!(
        c.entries().len(),
        41,
        "init + 40 cards; run states change state, not rows"
    );
    // Live again: effects flow.
    let next = b.append(
        &s(),
        EventKind::Other,
        serde_json::json!({"type": "run_state", "running": false}).to_string(),
        Millis(0),
    );
    assert_eq!(
        c.handle_live(&b.event(&s(), next).unwrap()),
        ReplayOutcome::Applied
    );
    let effects: Vec<ClientEffect> = std::iter::from_fn(|| c.poll_effect()).collect();
    assert!(effects.contains(&ClientEffect::DispatchQueued));
    assert!(effects.contains(&ClientEffect::StopWatchdog));
}

// RB-04: the pending placeholder is replaced at its authoritative position.
#[test]
fn the_pending_bubble_never_ends_up_below_the_reply() {
    let mut b = ReplayBuffers::new(ReplayConfig::default());
    let mut c = ConversationClient::new();
    let init = b.append(
        &s(),
        EventKind::Init,
        r#"{"type":"session_init"}"#.into(),
        Millis(0),
    );
    c.handle_live(&b.event(&s(), init).unwrap());
    c.send("c-1", "run the tests");
    assert!(matches!(c.view().last(), Some(ViewRow::Pending { .. })));
    // The server records the message, then the reply starts; the client gets the reply
    // first (reordering on a reconnect) and the acknowledgement after.
    let user = b.append_user_message(&s(), "run the tests", Some("c-1"), Millis(1));
    let reply = b.append(&s(), EventKind::Other, delta("Running"), Millis(2));
    assert_eq!(
        c.handle_live(&b.event(&s(), reply).unwrap()),
        ReplayOutcome::RequestReplay(ReplayProblem::Gap)
    );
    // The gap asks for a replay; the replay puts the message at its true place.
    for chunk in b.replay(&s()) {
        c.handle_replay_chunk(&chunk.json, Millis(3));
    }
    let view = c.view();
    assert_eq!(view.len(), 3);
    assert!(matches!(&view[1], ViewRow::Entry(e) if e.seq == user && e.text == "run the tests"));
    assert!(matches!(&view[2], ViewRow::Entry(e) if e.seq == reply));
}

// RB-04: unknown types are ignored; a malformed, out-of-order or unfinished replay asks
// for a new one and never shows a half-rebuilt timeline.
#[test]
fn bad_replays_ask_for_a_new_one_and_keep_the_view() {
    let mut b = started_with_chunks(1_024);
    for i in 0..30 {
        b.append(
            &s(),
            EventKind::Other,
            delta(&format!("part {i} of a longer reply")),
            Millis(0),
        );
        b.append(
            &s(),
            EventKind::Other,
            r#"{"type":"future_event_kind","x":1}"#.into(),
            Millis(0),
        );
    }
    let chunks = b.replay(&s());
    assert!(chunks.len() >= 3);
    let good = join(&b);
    assert_eq!(
        good.entries().len(),
        2,
        "init + one assistant entry; unknown types ignored"
    );
    let view = good.view();
    // Malformed.
    let mut c = join(&b);
    assert_eq!(
        c.handle_replay_chunk(&chunks[0].json, Millis(0)),
        ReplayOutcome::Progress
    );
    assert_eq!(
        c.handle_replay_chunk("{\"type\":\"structured_replay\"", Millis(0)),
        ReplayOutcome::RequestReplay(ReplayProblem::Malformed)
    );
    assert_eq!(c.view(), view);
    // Out of order.
    assert_eq!(
        c.handle_replay_chunk(&chunks[0].json, Millis(0)),
        ReplayOutcome::Progress
    );
    assert_eq!(
        c.handle_replay_chunk(&chunks[2].json, Millis(0)),
        ReplayOutcome::RequestReplay(ReplayProblem::OutOfOrder)
    );
    assert_eq!(c.view(), view);
    // The last chunk never comes.
    assert_eq!(
        c.handle_replay_chunk(&chunks[0].json, Millis(100)),
        ReplayOutcome::Progress
    );
    let deadline = c.poll_timeout().unwrap();
    assert_eq!(c.handle_timeout(Millis(deadline.as_u64() - 1)), None);
    assert_eq!(
        c.handle_timeout(deadline),
        Some(ReplayOutcome::RequestReplay(
            ReplayProblem::MissingLastChunk
        ))
    );
    assert!(!c.rebuilding());
    assert_eq!(c.view(), view);
    assert!(std::iter::from_fn(|| c.poll_effect()).any(|e| e == ClientEffect::RequestReplay));
}

#[derive(Clone, Debug)]
enum Ev {
    User(u8),
    Delta(u8),
    Approval(u8, Option<bool>),
    Run(bool),
    Unknown,
}

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        2 => (0u8..5).prop_map(Ev::User),
        4 => (0u8..50).prop_map(Ev::Delta),
        1 => (0u8..4, prop::option::of(any::<bool>())).prop_map(|(r, d)| Ev::Approval(r, d)),
        1 => any::<bool>().prop_map(Ev::Run),
        1 => Just(Ev::Unknown),
    ]
}

/// The server appends the stream; returns each event's broadcast form.
fn serve(b: &mut ReplayBuffers, stream: &[Ev]) -> Vec<String> {
    let mut live = Vec::new();
    let seq = init(b, Millis(0));
    live.push(b.event(&s(), seq).unwrap());
    for (i, e) in stream.iter().enumerate() {
        let seq = match e {
            Ev::User(n) => b.append_user_message(
                &s(),
                &format!("message {n}"),
                Some(&format!("c-{i}")),
                Millis(0),
            ),
            Ev::Delta(n) => b.append(
                &s(),
                EventKind::Other,
                delta(&"d".repeat(*n as usize + 1)),
                Millis(0),
            ),
            Ev::Approval(r, decided) => {
                let id = format!("r{i}-{r}");
                let json =
                    serde_json::json!({"type": "approval_request", "requestId": id}).to_string();
                let seq = b.append(
                    &s(),
                    EventKind::Approval {
                        request_id: id.clone(),
                    },
                    json,
                    Millis(0),
                );
                live.push(b.event(&s(), seq).unwrap());
                if let Some(allowed) = decided {
                    b.decide_approval(&s(), &id, *allowed);
                    b.append(&s(), EventKind::Other, serde_json::json!({"type": "approval_decided", "requestId": id, "allowed": allowed}).to_string(), Millis(0))
                } else {
                    continue;
                }
            }
            Ev::Run(r) => {
                b.set_running(
                    &s(),
                    RunningState {
                        running: *r,
                        run_id: None,
                    },
                    Millis(0),
                );
                b.append(
                    &s(),
                    EventKind::Other,
                    serde_json::json!({"type": "run_state", "running": r}).to_string(),
                    Millis(0),
                )
            }
            Ev::Unknown => b.append(
                &s(),
                EventKind::Other,
                r#"{"type":"added_later"}"#.into(),
                Millis(0),
            ),
        };
        live.push(b.event(&s(), seq).unwrap());
    }
    live
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fixtures::proptest_cases()))]

    // RB-01, RB-03, RB-04: replay on join, then live events, equals a client connected
    // from the start, minus trimmed events; the init event is always there; no chunk
    // passes the cap.
    #[test]
    fn joining_late_equals_being_there_minus_what_was_trimmed(
        stream in prop::collection::vec(ev(), 0..120),
        join_at in any::<prop::sample::Index>(),
        max_events in 1usize..80,
        max_bytes in 200usize..6_000,
        chunk_bytes in 600usize..4_000,
    ) {
        let mut b = ReplayBuffers::new(ReplayConfig { max_events, max_bytes, idle_reclaim: Millis(1), chunk_bytes });
        let split = join_at.index(stream.len() + 1);
        let live_before = serve(&mut b, &stream[..split]);
        // A client connected from the start.
        let mut always = ConversationClient::new();
        for e in &live_before { always.handle_live(e); }
        // A client joining now.
        let chunks = b.replay(&s());
        let mut late = ConversationClient::new();
        for c in &chunks {
            prop_assert!(c.json.len() <= chunk_bytes, "{} > {}", c.json.len(), chunk_bytes);
        }
        for c in &chunks { late.handle_replay_chunk(&c.json, Millis(0)); }
        prop_assert!(!late.rebuilding());
        // Then both get the rest live (appended after the join).
        for e in &stream[split..] {
            let tail = serve_one(&mut b, e);
            for line in tail { always.handle_live(&line); late.handle_live(&line); }
        }
        prop_assert_eq!(late.entries().first().map(|e| e.kind.clone()), Some(EntryKind::Init), "init always present");
        let got = late.entries();
        let all = always.entries();
        if !late.truncated() {
            prop_assert_eq!(got, all, "nothing trimmed: replay equals being there");
        } else if got.len() > 2 {
            // The first kept entry may start mid-message (its earlier deltas were
            // trimmed); every later entry is exactly the connected client's entry.
            let boundary = got[1].seq;
            let after: Vec<_> = all.iter().filter(|e| e.seq > boundary).cloned().collect();
            prop_assert_eq!(&got[2..], after.as_slice());
        }
        prop_assert_eq!(late.running(), always.running());
    }

    // RB-04: chunks delivered with loss, duplication or reordering never produce a
    // duplicated or reordered timeline: either the whole replay or the old view.
    #[test]
    fn damaged_chunk_streams_never_duplicate_or_reorder(
        stream in prop::collection::vec(ev(), 0..80),
        ops in prop::collection::vec((0u8..4, any::<prop::sample::Index>()), 0..30),
    ) {
        let mut b = ReplayBuffers::new(ReplayConfig { max_events: 1_000, max_bytes: 1 << 20, idle_reclaim: Millis(1), chunk_bytes: 700 });
        serve(&mut b, &stream);
        let chunks = b.replay(&s());
        let reference = {
            let mut c = ConversationClient::new();
            for ch in &chunks { c.handle_replay_chunk(&ch.json, Millis(0)); }
            c.entries().to_vec()
        };
        // A damaged delivery order.
        let mut order: Vec<usize> = (0..chunks.len()).collect();
        for (op, idx) in ops {
            if order.is_empty() { break; }
            let i = idx.index(order.len());
            match op {
                0 => { order.remove(i); }
                1 => { let x = order[i]; order.insert(i, x); }
                2 => { let j = (i + 1) % order.len(); order.swap(i, j); }
                _ => {}
            }
        }
        let mut c = ConversationClient::new();
        for i in order {
            c.handle_replay_chunk(&chunks[i].json, Millis(0));
            let seqs: Vec<u64> = c.entries().iter().map(|e| e.seq).collect();
            prop_assert!(seqs.windows(2).all(|w| w[0] < w[1]), "reordered or duplicated: {:?}", seqs);
            prop_assert!(c.entries().is_empty() || c.entries() == reference.as_slice(), "a partial timeline became visible");
        }
    }

    // Two devices joining at different moments end with the same view.
    #[test]
    fn two_devices_joining_at_different_moments_converge(
        stream in prop::collection::vec(ev(), 1..80),
        a in any::<prop::sample::Index>(),
        b_at in any::<prop::sample::Index>(),
    ) {
        let mut buffers = ReplayBuffers::new(ReplayConfig::default());
        let (ja, jb) = (a.index(stream.len()), b_at.index(stream.len()));
        let mut devices = [ConversationClient::new(), ConversationClient::new()];
        let mut joined = [false, false];
        serve(&mut buffers, &[]);
        for (i, e) in stream.iter().enumerate() {
            for (d, at) in [(0, ja), (1, jb)] {
                if i == at && !joined[d] {
                    for c in buffers.replay(&s()) { devices[d].handle_replay_chunk(&c.json, Millis(0)); }
                    joined[d] = true;
                }
            }
            for line in serve_one(&mut buffers, e) {
                for d in 0..2 { if joined[d] { devices[d].handle_live(&line); } }
            }
        }
        prop_assert_eq!(devices[0].entries(), devices[1].entries());
        prop_assert_eq!(devices[0].running(), devices[1].running());
    }
}

/// Appends one generated event (and its decision) and returns the broadcast lines.
fn serve_one(b: &mut ReplayBuffers, e: &Ev) -> Vec<String> {
    let mut out = Vec::new();
    let mut push = |b: &mut ReplayBuffers, seq: u64| out.push(b.event(&s(), seq).unwrap());
    match e {
        Ev::User(n) => {
            let seq = b.append_user_message(&s(), &format!("message {n}"), None, Millis(0));
            push(b, seq);
        }
        Ev::Delta(n) => {
            let seq = b.append(
                &s(),
                EventKind::Other,
                delta(&"d".repeat(*n as usize + 1)),
                Millis(0),
            );
            push(b, seq);
        }
        Ev::Approval(r, decided) => {
            let id = format!("late-{r}-{}", b.len(&s()));
            let json = serde_json::json!({"type": "approval_request", "requestId": id}).to_string();
            let seq = b.append(
                &s(),
                EventKind::Approval {
                    request_id: id.clone(),
                },
                json,
                Millis(0),
            );
            push(b, seq);
            if let Some(allowed) = decided {
                b.decide_approval(&s(), &id, *allowed);
                let seq = b.append(&s(), EventKind::Other, serde_json::json!({"type": "approval_decided", "requestId": id, "allowed": allowed}).to_string(), Millis(0));
                push(b, seq);
            }
        }
        Ev::Run(r) => {
            b.set_running(
                &s(),
                RunningState {
                    running: *r,
                    run_id: None,
                },
                Millis(0),
            );
            let seq = b.append(
                &s(),
                EventKind::Other,
                serde_json::json!({"type": "run_state", "running": r}).to_string(),
                Millis(0),
            );
            push(b, seq);
        }
        Ev::Unknown => {
            let seq = b.append(
                &s(),
                EventKind::Other,
                r#"{"type":"added_later"}"#.into(),
                Millis(0),
            );
            push(b, seq);
        }
    }
    out
}
