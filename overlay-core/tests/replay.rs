//! Replay on join: the server's ring buffer and the client reducer (RB-01 to RB-05).
#![allow(clippy::unwrap_used)]

use overlay_core::replay::{
    AppendError, EventKind, EventProblem, ReplayBuffers, ReplayChunk, ReplayConfig, RunningState,
    RunningStateError, MAX_CHUNK_BYTES, MAX_EVENT_DEPTH,
};
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

/// Buffers cutting replays into `chunk_bytes` chunks, with the session's init event.
fn started_with_chunks(chunk_bytes: usize) -> ReplayBuffers {
    let mut b = ReplayBuffers::new(ReplayConfig {
        chunk_bytes,
        ..ReplayConfig::default()
    });
    init(&mut b, Millis(0));
    b
}

/// Appends the session-initialization event; returns its seq.
fn init(b: &mut ReplayBuffers, at: Millis) -> u64 {
    b.append(
        &s(),
        EventKind::Init,
        r#"{"type":"session_init"}"#.into(),
        at,
    )
    .unwrap()
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
        b.append(&s(), EventKind::Other, delta(&i.to_string()), Millis(0))
            .unwrap();
    }
    assert_eq!(b.len(&s()), 3);
    let c = join(&b);
    assert!(!c.truncated(), "at the limit nothing is trimmed");
    b.append(&s(), EventKind::Other, delta("3"), Millis(0))
        .unwrap();
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
        .map(|i| {
            probe
                .append(&s(), EventKind::Other, delta(&format!("{i}")), Millis(0))
                .unwrap()
        })
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
        b.append(&s(), EventKind::Other, delta(&format!("{i}")), Millis(0))
            .unwrap();
    }
    assert_eq!((b.len(&s()), b.bytes(&s())), (4, total));
    let mut b = ReplayBuffers::new(config(usize::MAX, total - 1));
    for i in 0..4 {
        b.append(&s(), EventKind::Other, delta(&format!("{i}")), Millis(0))
            .unwrap();
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
    b.append(&s(), EventKind::Other, delta("Running"), Millis(2))
        .unwrap();
    b.append_user_message(&s(), "also lint (steer)", Some("c-2"), Millis(3));
    b.append(&s(), EventKind::Other, delta("Linting"), Millis(4))
        .unwrap();
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
        )
        .unwrap();
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
    )
    .unwrap();
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
    let big = b
        .append(
            &s(),
            EventKind::Other,
            delta(&"z".repeat(300_000)),
            Millis(0),
        )
        .unwrap();
    b.append(&s(), EventKind::Other, delta("after"), Millis(0))
        .unwrap();
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

// RB-05, MH-01: a session its host let go is reclaimed at once, subscribed or not; a
// session with no replay is left alone.
#[test]
fn a_session_let_go_is_reclaimed_at_once() {
    let mut b = ReplayBuffers::new(config(100, usize::MAX));
    b.subscribe(&s(), Millis(0));
    init(&mut b, Millis(0));
    b.reclaim(&s());
    assert!(b.event(&s(), 0).is_none());
    assert!(b.was_reclaimed(&s()));
    assert_eq!(b.poll_timeout(), None, "nothing is left to reclaim");
    let other = timeline_core::key::SessionId::new("never-seen").unwrap();
    b.reclaim(&other);
    assert!(!b.was_reclaimed(&other));
    init(&mut b, Millis(10));
    assert!(b.replay(&s())[0].json.contains(r#""reclaimed":true"#));
}

// RB-04: seq 0 rebuilds; live-only effects are suppressed until the last chunk; the
// envelope's running state is adopted.
#[test]
fn a_rebuild_suppresses_live_only_effects_and_adopts_the_running_state() {
    let mut b = started_with_chunks(2_048);
    for i in 0..40 {
        let run = serde_json::json!({"type": "run_state", "running": i % 2 == 0}).to_string();
        b.append(&s(), EventKind::Other, run, Millis(0)).unwrap();
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
        )
        .unwrap();
    }
    b.set_running(
        &s(),
        RunningState {
            running: true,
            run_id: Some("run-9".into()),
        },
        Millis(0),
    )
    .unwrap();
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
    let next = b
        .append(
            &s(),
            EventKind::Other,
            serde_json::json!({"type": "run_state", "running": false}).to_string(),
            Millis(0),
        )
        .unwrap();
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
    let init = b
        .append(
            &s(),
            EventKind::Init,
            r#"{"type":"session_init"}"#.into(),
            Millis(0),
        )
        .unwrap();
    c.handle_live(&b.event(&s(), init).unwrap());
    c.send("c-1", "run the tests");
    assert!(matches!(c.view().last(), Some(ViewRow::Pending { .. })));
    // The server records the message, then the reply starts; the client gets the reply
    // first (reordering on a reconnect) and the acknowledgement after.
    let user = b.append_user_message(&s(), "run the tests", Some("c-1"), Millis(1));
    let reply = b
        .append(&s(), EventKind::Other, delta("Running"), Millis(2))
        .unwrap();
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
        )
        .unwrap();
        b.append(
            &s(),
            EventKind::Other,
            r#"{"type":"future_event_kind","x":1}"#.into(),
            Millis(0),
        )
        .unwrap();
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
    std::iter::from_fn(|| c.poll_effect()).for_each(drop);
    c.handle_timeout(Millis(deadline.as_u64() - 1));
    assert!(c.rebuilding(), "not yet due");
    assert_eq!(c.poll_effect(), None);
    c.handle_timeout(deadline);
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
            Ev::Delta(n) => b
                .append(
                    &s(),
                    EventKind::Other,
                    delta(&"d".repeat(*n as usize + 1)),
                    Millis(0),
                )
                .unwrap(),
            Ev::Approval(r, decided) => {
                let id = format!("r{i}-{r}");
                let json =
                    serde_json::json!({"type": "approval_request", "requestId": id}).to_string();
                let seq = b
                    .append(
                        &s(),
                        EventKind::Approval {
                            request_id: id.clone(),
                        },
                        json,
                        Millis(0),
                    )
                    .unwrap();
                live.push(b.event(&s(), seq).unwrap());
                if let Some(allowed) = decided {
                    b.decide_approval(&s(), &id, *allowed);
                    b.append(&s(), EventKind::Other, serde_json::json!({"type": "approval_decided", "requestId": id, "allowed": allowed}).to_string(), Millis(0)).unwrap()
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
                )
                .unwrap();
                b.append(
                    &s(),
                    EventKind::Other,
                    serde_json::json!({"type": "run_state", "running": r}).to_string(),
                    Millis(0),
                )
                .unwrap()
            }
            Ev::Unknown => b
                .append(
                    &s(),
                    EventKind::Other,
                    r#"{"type":"added_later"}"#.into(),
                    Millis(0),
                )
                .unwrap(),
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
            let seq = b
                .append(
                    &s(),
                    EventKind::Other,
                    delta(&"d".repeat(*n as usize + 1)),
                    Millis(0),
                )
                .unwrap();
            push(b, seq);
        }
        Ev::Approval(r, decided) => {
            let id = format!("late-{r}-{}", b.len(&s()));
            let json = serde_json::json!({"type": "approval_request", "requestId": id}).to_string();
            let seq = b
                .append(
                    &s(),
                    EventKind::Approval {
                        request_id: id.clone(),
                    },
                    json,
                    Millis(0),
                )
                .unwrap();
            push(b, seq);
            if let Some(allowed) = decided {
                b.decide_approval(&s(), &id, *allowed);
                let seq = b.append(&s(), EventKind::Other, serde_json::json!({"type": "approval_decided", "requestId": id, "allowed": allowed}).to_string(), Millis(0)).unwrap();
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
            )
            .unwrap();
            let seq = b
                .append(
                    &s(),
                    EventKind::Other,
                    serde_json::json!({"type": "run_state", "running": r}).to_string(),
                    Millis(0),
                )
                .unwrap();
            push(b, seq);
        }
        Ev::Unknown => {
            let seq = b
                .append(
                    &s(),
                    EventKind::Other,
                    r#"{"type":"added_later"}"#.into(),
                    Millis(0),
                )
                .unwrap();
            push(b, seq);
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Every replay ends (RB-03) and events are checked where they come in (RB-01).
// ---------------------------------------------------------------------------------------

/// The events a replay carries, chunk after chunk, as values.
fn replayed_events(chunks: &[ReplayChunk]) -> Vec<serde_json::Value> {
    chunks
        .iter()
        .flat_map(|c| {
            let v: serde_json::Value = serde_json::from_str(&c.json).unwrap();
            v["events"].as_array().unwrap().clone()
        })
        .collect()
}

/// The `seq` of every event a replay carries, in order.
fn replayed_seqs(chunks: &[ReplayChunk]) -> Vec<u64> {
    replayed_events(chunks)
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect()
}

/// How many events one chunk carries.
fn events_in(chunk: &ReplayChunk) -> usize {
    let v: serde_json::Value = serde_json::from_str(&chunk.json).unwrap();
    v["events"].as_array().unwrap().len()
}

/// Chunk numbers count from 0 and only the final chunk says `last`.
fn assert_sequenced(chunks: &[ReplayChunk]) {
    assert!(!chunks.is_empty());
    for (i, c) in chunks.iter().enumerate() {
        assert_eq!(c.seq, i as u64);
        assert_eq!(c.last, i + 1 == chunks.len());
    }
}

/// Replays with a hard stop, so a replay that loops fails the test instead of hanging.
fn bounded_replay(b: &ReplayBuffers, max_chunks: usize) -> Vec<ReplayChunk> {
    let mut chunks = Vec::new();
    let mut buf = String::new();
    let mut ended = false;
    b.replay_with(&s(), &mut buf, |seq, last, json| {
        assert!(
            chunks.len() < max_chunks,
            "more than {max_chunks} chunks: the replay does not end"
        );
        assert!(!ended, "a chunk after the last one");
        ended = last;
        chunks.push(ReplayChunk {
            seq,
            last,
            json: json.to_owned(),
        });
    });
    assert!(ended, "the replay never sent its last chunk");
    chunks
}

// RB-03: a running state that (nearly) fills a chunk by itself is refused where it is
// set, with the state handed back; the buffer keeps the previous state and its replay
// still ends within the cap. Before, such a state made the replay send empty chunks
// without end (or panic when a little larger).
#[test]
fn rb03_running_state_that_fills_a_chunk_still_ends() {
    let chunk_bytes = 1_024;
    let mut b = started_with_chunks(chunk_bytes);
    for i in 0..20 {
        b.append(
            &s(),
            EventKind::Other,
            delta(&format!("part {i}")),
            Millis(0),
        )
        .unwrap();
    }
    let before = b.replay(&s());
    for fill in [
        chunk_bytes - 150,
        chunk_bytes - 100,
        chunk_bytes - 40,
        chunk_bytes,
        10 * chunk_bytes,
    ] {
        let state = RunningState {
            running: true,
            run_id: Some("r".repeat(fill)),
        };
        let err = b.set_running(&s(), state.clone(), Millis(0)).unwrap_err();
        assert!(
            matches!(&err, RunningStateError::TooLarge { bytes, limit, running }
                if *running == state && bytes > limit && *limit < chunk_bytes),
            "{err:?}"
        );
        assert_eq!(bounded_replay(&b, 100), before, "nothing changed");
    }
}

// RB-03: a running state exactly at the limit is taken; every chunk then still holds at
// least one event within the cap (an event that does not fit travels as a marker), so
// the replay ends with at most one chunk per event and gives back every event in order.
#[test]
fn rb03_running_state_at_the_limit_leaves_room_for_one_event_per_chunk() {
    let chunk_bytes = 1_024;
    let mut b = started_with_chunks(chunk_bytes);
    for i in 0..20 {
        let text = if i % 5 == 0 {
            "w".repeat(300)
        } else {
            format!("{i}")
        };
        b.append(&s(), EventKind::Other, delta(&text), Millis(0))
            .unwrap();
    }
    // Learn the limit and the fixed overhead of the state from one refusal.
    let probe = RunningState {
        running: true,
        run_id: Some("r".repeat(chunk_bytes)),
    };
    let Err(RunningStateError::TooLarge { bytes, limit, .. }) =
        b.set_running(&s(), probe, Millis(0))
    else {
        panic!("a run ID the size of a chunk is refused");
    };
    let overhead = bytes - chunk_bytes;
    let at = |len: usize| RunningState {
        running: true,
        run_id: Some("r".repeat(len)),
    };
    assert!(b
        .set_running(&s(), at(limit - overhead + 1), Millis(0))
        .is_err());
    b.set_running(&s(), at(limit - overhead), Millis(0))
        .unwrap();
    let chunks = bounded_replay(&b, 100);
    assert_sequenced(&chunks);
    assert!(chunks.len() <= 21, "at most one chunk per kept event");
    for c in &chunks {
        assert!(
            c.json.len() <= chunk_bytes,
            "{} > {chunk_bytes}",
            c.json.len()
        );
        assert!(events_in(c) >= 1, "every chunk makes progress");
    }
    assert_eq!(replayed_seqs(&chunks), (0..21).collect::<Vec<u64>>());
    let c = join(&b);
    assert!(
        c.running() && c.truncated(),
        "the markers say it is not complete"
    );
    assert!(c
        .entries()
        .iter()
        .any(|e| matches!(e.kind, EntryKind::Omitted { .. })));
}

// RB-03: the one documented case of a chunk past the cap: a chunk size too small for an
// envelope with one event marker. Each chunk then carries exactly one event, so the
// replay still ends and still gives back every event once, in order.
#[test]
fn rb03_a_chunk_size_too_small_for_any_envelope_still_ends() {
    for chunk_bytes in [0, 1, 64, 150, 200] {
        let mut b = started_with_chunks(chunk_bytes);
        for i in 0..5 {
            b.append(&s(), EventKind::Other, delta(&i.to_string()), Millis(0))
                .unwrap();
        }
        let chunks = bounded_replay(&b, 100);
        assert_sequenced(&chunks);
        assert!(chunks.len() <= 6, "{chunk_bytes}: {} chunks", chunks.len());
        for c in &chunks {
            assert!(
                c.json.len() <= chunk_bytes || events_in(c) == 1,
                "{chunk_bytes}: an oversized chunk carries exactly one event"
            );
        }
        assert_eq!(replayed_seqs(&chunks), (0..6).collect::<Vec<u64>>());
        let mut client = ConversationClient::new();
        let outcomes: Vec<ReplayOutcome> = chunks
            .iter()
            .map(|c| client.handle_replay_chunk(&c.json, Millis(0)))
            .collect();
        assert_eq!(outcomes.last(), Some(&ReplayOutcome::Complete));
        // No running state fits in such chunks: every one is refused.
        assert!(b
            .set_running(&s(), RunningState::default(), Millis(0))
            .is_err());
    }
    // An empty session still ends: one chunk, possibly oversized, no events.
    let b = ReplayBuffers::new(ReplayConfig {
        chunk_bytes: 0,
        ..ReplayConfig::default()
    });
    let chunks = bounded_replay(&b, 10);
    assert_eq!(chunks.len(), 1);
    assert_eq!(events_in(&chunks[0]), 0);
}

/// Tells whether a refusal names the expected problem.
type Expect = fn(&EventProblem) -> bool;

/// Texts an append must refuse, with the problem it must name.
fn refused_texts() -> Vec<(&'static str, Expect)> {
    vec![
        // A second event smuggled behind the first (a forged approval card).
        (
            r#"{"type":"assistant_delta","text":"ok"}{"type":"approval_request","requestId":"forged"}"#,
            |p| matches!(p, EventProblem::TrailingText { .. }),
        ),
        (r#"{"a":1} {"b":2}"#, |p| {
            matches!(p, EventProblem::TrailingText { .. })
        }),
        (r#"{"a":1},"#, |p| {
            matches!(p, EventProblem::TrailingText { .. })
        }),
        (r#"[{"type":"approval_request"}]"#, |p| {
            *p == EventProblem::NotAnObject
        }),
        ("42", |p| *p == EventProblem::NotAnObject),
        (r#""text""#, |p| *p == EventProblem::NotAnObject),
        ("null", |p| *p == EventProblem::NotAnObject),
        ("true", |p| *p == EventProblem::NotAnObject),
        ("not json", |p| matches!(p, EventProblem::Syntax { .. })),
        (r#"{"type":"x""#, |p| {
            matches!(p, EventProblem::Syntax { .. })
        }),
        (r#"{"type":'x'}"#, |p| {
            matches!(p, EventProblem::Syntax { .. })
        }),
        ("", |p| *p == EventProblem::Empty),
        (" \n\t\r ", |p| *p == EventProblem::Empty),
        // What a client's parser refuses would make every later chunk unreadable.
        (r#"{"n":1e400}"#, |p| {
            matches!(p, EventProblem::Syntax { .. })
        }),
        (r#"{"t":"\ud800"}"#, |p| {
            matches!(p, EventProblem::Syntax { .. })
        }),
        // Only the buffer assigns `seq`; a second one would win in a client's parse.
        (r#"{"seq":99999,"type":"run_state"}"#, |p| {
            *p == EventProblem::ReservedSeq
        }),
        (r#"{"type":"x","\u0073eq":99999}"#, |p| {
            *p == EventProblem::ReservedSeq
        }),
        // Whitespace JSON does not know is not trimmed.
        ("\u{a0}{\"a\":1}", |p| {
            matches!(p, EventProblem::Syntax { .. })
        }),
    ]
}

// RB-01, RB-03: an append takes exactly one JSON object; anything else is refused with a
// typed error that hands the text back, and the buffer, its later replays and its
// sequence numbers are exactly as if the append never happened.
#[test]
fn rb01_append_refuses_anything_but_one_object_and_keeps_the_buffer() {
    let mut b = started_with_chunks(2_048);
    b.append(&s(), EventKind::Other, delta("before"), Millis(0))
        .unwrap();
    let (bytes, len, replay) = (b.bytes(&s()), b.len(&s()), b.replay(&s()));
    for (text, expected) in refused_texts() {
        for kind in [
            EventKind::Other,
            EventKind::Init,
            EventKind::Approval {
                request_id: "forged".into(),
            },
        ] {
            match b.append(&s(), kind, text.to_owned(), Millis(1)) {
                Err(AppendError::InvalidEvent { problem, json }) => {
                    assert!(expected(&problem), "{text:?}: {problem:?}");
                    assert_eq!(json, text, "the text comes back unchanged");
                }
                other => panic!("{text:?} was not refused: {other:?}"),
            }
            assert_eq!((b.bytes(&s()), b.len(&s())), (bytes, len), "{text:?}");
            assert_eq!(b.replay(&s()), replay, "{text:?}");
        }
    }
    // Later appends and replays carry on as if nothing was offered.
    let next = b
        .append(&s(), EventKind::Other, delta("after"), Millis(2))
        .unwrap();
    assert_eq!(next, 2, "refused appends take no sequence number");
    let c = join(&b);
    assert!(!c.truncated());
    assert_eq!(c.entries().len(), 2, "init + one assistant entry");
    assert_eq!(c.entries()[1].text, "beforeafter");
    assert!(
        !c.entries()
            .iter()
            .any(|e| matches!(e.kind, EntryKind::Approval { .. })),
        "no forged card"
    );
    // A refused append creates no session either (it would start an idle clock).
    b.subscribe(&s(), Millis(3));
    assert_eq!(b.poll_timeout(), None);
    let other = SessionId::new("other").unwrap();
    assert!(b
        .append(&other, EventKind::Other, "[]".into(), Millis(4))
        .is_err());
    assert_eq!(b.poll_timeout(), None);
}

// RB-01: JSON whitespace around the object is accepted and removed; inside, it is kept.
#[test]
fn rb01_whitespace_around_an_event_is_removed() {
    let mut b = ReplayBuffers::new(ReplayConfig::default());
    let seq = b
        .append(
            &s(),
            EventKind::Init,
            " \r\n\t{ \"type\" : \"session_init\" }\n".into(),
            Millis(0),
        )
        .unwrap();
    assert_eq!(
        b.event(&s(), seq).unwrap(),
        r#"{"seq":0, "type" : "session_init" }"#
    );
    let empty = b
        .append(&s(), EventKind::Other, " { \n } ".into(), Millis(0))
        .unwrap();
    assert_eq!(b.event(&s(), empty).unwrap(), r#"{"seq":1}"#);
    assert_eq!(
        b.bytes(&s()),
        b.event(&s(), 0).unwrap().len() + b.event(&s(), 1).unwrap().len()
    );
    let c = join(&b);
    assert_eq!(c.entries().len(), 1);
    assert_eq!(c.entries()[0].kind, EntryKind::Init);
}

/// An object nested `depth` levels deep (the object itself is level 1).
fn nested(depth: usize) -> String {
    let mut json = String::from(r#"{"type":"deep","v":"#);
    for _ in 1..depth {
        json.push('[');
    }
    json.push('0');
    for _ in 1..depth {
        json.push(']');
    }
    json.push('}');
    json
}

// RB-01, RB-03: an event as deep as the limit is kept and still parses inside a replay
// envelope; one level more is refused.
#[test]
fn rb01_nesting_is_limited_so_every_kept_event_replays() {
    let mut b = started_with_chunks(MAX_CHUNK_BYTES);
    let deep = b
        .append(&s(), EventKind::Other, nested(MAX_EVENT_DEPTH), Millis(0))
        .unwrap();
    assert_eq!(
        b.append(
            &s(),
            EventKind::Other,
            nested(MAX_EVENT_DEPTH + 1),
            Millis(0)
        ),
        Err(AppendError::InvalidEvent {
            problem: EventProblem::TooDeep {
                limit: MAX_EVENT_DEPTH
            },
            json: nested(MAX_EVENT_DEPTH + 1),
        })
    );
    // Nested objects count too, and a `seq` below the top level is the event's own.
    let mut obj = String::from(r#"{"type":"deep""#);
    for _ in 1..=MAX_EVENT_DEPTH {
        obj.push_str(r#","o":{"seq":1"#);
    }
    obj.push_str(&"}".repeat(MAX_EVENT_DEPTH + 1));
    assert!(matches!(
        b.append(&s(), EventKind::Other, obj, Millis(0)),
        Err(AppendError::InvalidEvent {
            problem: EventProblem::TooDeep { .. },
            ..
        })
    ));
    let chunks = b.replay(&s());
    assert_eq!(replayed_seqs(&chunks), [0, deep]);
    let mut c = ConversationClient::new();
    assert_eq!(
        c.handle_replay_chunk(&chunks[0].json, Millis(0)),
        ReplayOutcome::Complete
    );
    // Live, it parses on its own too.
    serde_json::from_str::<serde_json::Value>(&b.event(&s(), deep).unwrap()).unwrap();
}

// RB-01: events built from values are checked the same way.
#[test]
fn rb01_append_value_refuses_values_that_are_not_objects() {
    let mut b = started_with_chunks(MAX_CHUNK_BYTES);
    let replay = b.replay(&s());
    for v in [
        serde_json::json!([1, 2]),
        serde_json::json!(3),
        serde_json::json!(null),
        serde_json::json!({"seq": 5, "type": "x"}),
    ] {
        assert!(b
            .append_value(&s(), EventKind::Other, &v, Millis(0))
            .is_err());
    }
    assert_eq!(b.replay(&s()), replay);
    let seq = b
        .append_value(
            &s(),
            EventKind::Other,
            &serde_json::json!({"type": "x", "nested": {"seq": 5}}),
            Millis(0),
        )
        .unwrap();
    assert_eq!(seq, 1);
}

#[derive(Clone, Debug)]
enum Piece {
    Delta(String),
    Approval(Option<bool>, String),
    Other(usize),
}

fn piece() -> impl Strategy<Value = Piece> {
    let text = prop_oneof![
        3 => "[a-z \"\\\\\n\u{e9}\u{1f600}]{0,40}",
        1 => (0usize..2_000).prop_map(|n| "t".repeat(n)),
    ];
    prop_oneof![
        4 => text.clone().prop_map(Piece::Delta),
        2 => (prop::option::of(any::<bool>()), text).prop_map(|(d, t)| Piece::Approval(d, t)),
        1 => (0usize..6).prop_map(Piece::Other),
    ]
}

/// The depth of a value (an object or array is one level more than its deepest part).
fn depth(v: &serde_json::Value) -> usize {
    match v {
        serde_json::Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
        serde_json::Value::Object(m) => 1 + m.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

fn text_to_append() -> impl Strategy<Value = String> {
    let object = (
        prop_oneof![
            3 => "[a-z]{1,6}",
            1 => Just("seq".to_owned()),
            1 => Just("\\u0073eq".to_owned()),
        ],
        prop_oneof![
            Just("1".to_owned()),
            Just("\"s\"".to_owned()),
            Just("[1,{\"x\":null}]".to_owned()),
            Just("{\"seq\":1}".to_owned()),
            Just("1e400".to_owned()),
            Just("\"\\ud83d\\ude00\"".to_owned()),
            Just("\"\\udc00\"".to_owned()),
        ],
    )
        .prop_map(|(k, v)| format!("{{\"{k}\":{v}}}"));
    prop_oneof![
        // Random text over the characters JSON is made of.
        3 => "[{}\\[\\]\":,0-9a-z \n\t.+\\-\\\\]{0,30}",
        // An object, perhaps with something before or after it.
        3 => (
            "[ \n\t]{0,2}|x|\\[|,",
            object.clone(),
            "[ \n\t]{0,2}|x|\\]|,|\\{\\}|\\{\"b\":2\\}",
        )
            .prop_map(|(a, o, z)| format!("{a}{o}{z}")),
        // Two objects.
        1 => (object.clone(), object).prop_map(|(a, b)| format!("{a}{b}")),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fixtures::proptest_cases()))]

    // RB-03: for any buffer contents, running state and chunk size the replay ends,
    // every chunk is within the cap unless the chunk size cannot hold an envelope with
    // one marker (then it carries exactly one event), there are at most max(1, n)
    // chunks, and together they give back every kept event exactly once, in order:
    // as stored, stamped when decided, or as a marker of its exact size.
    #[test]
    fn replay_always_ends_and_carries_every_kept_event_once_in_order(
        with_init in any::<bool>(),
        pieces in prop::collection::vec(piece(), 0..60),
        run_id in prop::option::of(0usize..3_000),
        chunk_bytes in prop_oneof![0usize..300, 300usize..4_000, Just(MAX_CHUNK_BYTES)],
        max_events in 1usize..80,
        max_bytes in 100usize..40_000,
    ) {
        let mut b = ReplayBuffers::new(ReplayConfig { max_events, max_bytes, idle_reclaim: Millis(1), chunk_bytes });
        let mut appended = 0u64;
        let mut outcomes = std::collections::HashMap::new();
        if with_init {
            init(&mut b, Millis(0));
            appended += 1;
        }
        for (i, p) in pieces.iter().enumerate() {
            let pad = " ".repeat(i % 3);
            match p {
                Piece::Delta(t) => {
                    b.append(&s(), EventKind::Other, format!("{pad}{}{pad}", delta(t)), Millis(0)).unwrap();
                }
                Piece::Approval(decided, t) => {
                    let id = format!("r{i}");
                    let json = serde_json::json!({"type": "approval_request", "requestId": id, "text": t}).to_string();
                    let seq = b.append(&s(), EventKind::Approval { request_id: id.clone() }, json, Millis(0)).unwrap();
                    if let Some(allowed) = decided {
                        b.decide_approval(&s(), &id, *allowed);
                        outcomes.insert(seq, if *allowed { "allowed" } else { "denied" });
                    }
                }
                Piece::Other(n) => {
                    b.append(&s(), EventKind::Other, format!("{{{pad}}}{}", " ".repeat(*n)), Millis(0)).unwrap();
                }
            }
            appended += 1;
        }
        let mut running_set = false;
        if let Some(len) = run_id {
            let state = RunningState { running: true, run_id: Some("r".repeat(len)) };
            let before = b.replay(&s());
            match b.set_running(&s(), state.clone(), Millis(0)) {
                Ok(()) => running_set = true,
                Err(RunningStateError::TooLarge { bytes, limit, running }) => {
                    prop_assert!(bytes > limit);
                    prop_assert_eq!(running, state);
                    prop_assert_eq!(b.replay(&s()), before, "a refused state changes nothing");
                }
                Err(e) => prop_assert!(false, "{e:?}"),
            }
        }
        let kept: Vec<u64> = (0..appended).filter(|q| b.event(&s(), *q).is_some()).collect();
        let chunks = bounded_replay(&b, kept.len().max(1));
        assert_sequenced(&chunks);
        for c in &chunks {
            let fits = c.json.len() <= chunk_bytes;
            prop_assert!(fits || events_in(c) <= 1, "{} > {} with {} events", c.json.len(), chunk_bytes, events_in(c));
            // A chunk size that holds an envelope and one marker is never passed.
            prop_assert!(fits || !(running_set || chunk_bytes >= 300), "{} > {}", c.json.len(), chunk_bytes);
        }
        let events = replayed_events(&chunks);
        prop_assert_eq!(events.iter().map(|e| e["seq"].as_u64().unwrap()).collect::<Vec<_>>(), kept.clone());
        for (event, seq) in events.iter().zip(&kept) {
            let mut expected: serde_json::Value = serde_json::from_str(&b.event(&s(), *seq).unwrap()).unwrap();
            if let Some(outcome) = outcomes.get(seq) {
                expected["outcome"] = serde_json::json!(outcome);
            }
            if event["type"] == "replay_event_omitted" && expected["type"] != "replay_event_omitted" {
                // The marker gives the exact size of what it stands in for.
                let mut stripped = expected.clone();
                stripped.as_object_mut().unwrap().remove("seq");
                let size = if stripped.as_object().unwrap().is_empty() {
                    format!("{{\"seq\":{seq}}}").len()
                } else {
                    format!("{{\"seq\":{seq},").len() + stripped.to_string().len() - 1
                };
                if outcomes.contains_key(seq) {
                    prop_assert_eq!(event["bytes"].as_u64(), Some(size as u64));
                } else {
                    prop_assert_eq!(event["bytes"].as_u64(), Some(b.event(&s(), *seq).unwrap().len() as u64));
                }
                // Only an event that could not fit beside this chunk's envelope (give
                // or take the digits of the longest chunk number) is replaced.
                let chunk = chunks.iter().find(|c| c.json.contains(&format!("{{\"seq\":{seq},\"type\":\"replay_event_omitted\""))).unwrap();
                let frame = chunk.json.find("\"events\":[").unwrap() + "\"events\":[".len() + 2;
                prop_assert!(event["bytes"].as_u64().unwrap() as usize + frame + 40 > chunk_bytes, "{}", event);
            } else {
                prop_assert_eq!(event, &expected);
            }
        }
        let mut client = ConversationClient::new();
        for c in &chunks { client.handle_replay_chunk(&c.json, Millis(0)); }
        prop_assert!(!client.rebuilding());
        prop_assert_eq!(client.running(), running_set);
    }

    // RB-01: an append accepts exactly the texts a client parses into one object (no
    // deeper than the limit, without a top-level `seq`); a refused one leaves the buffer
    // as it was, and a kept one is broadcast as the same object with `seq` first.
    #[test]
    fn append_accepts_exactly_what_a_client_parses_as_one_object(
        texts in prop::collection::vec(text_to_append(), 1..20),
    ) {
        let mut b = started_with_chunks(4_096);
        let mut next = 1u64;
        for text in texts {
            let model = match serde_json::from_str::<serde_json::Value>(&text) {
                Ok(serde_json::Value::Object(m)) => !m.contains_key("seq") && depth(&serde_json::Value::Object(m.clone())) <= MAX_EVENT_DEPTH,
                _ => false,
            };
            let (bytes, len, replay) = (b.bytes(&s()), b.len(&s()), b.replay(&s()));
            match b.append(&s(), EventKind::Other, text.clone(), Millis(0)) {
                Ok(seq) => {
                    prop_assert!(model, "accepted {:?}", text);
                    prop_assert_eq!(seq, next);
                    next += 1;
                    let mut kept: serde_json::Value = serde_json::from_str(&b.event(&s(), seq).unwrap()).unwrap();
                    prop_assert_eq!(kept["seq"].as_u64(), Some(seq));
                    kept.as_object_mut().unwrap().remove("seq");
                    let given: serde_json::Value = serde_json::from_str(&text).unwrap();
                    prop_assert_eq!(kept, given);
                }
                Err(AppendError::InvalidEvent { json, .. }) => {
                    prop_assert!(!model, "refused {:?}", text);
                    prop_assert_eq!(json, text);
                    prop_assert_eq!((b.bytes(&s()), b.len(&s())), (bytes, len));
                    prop_assert_eq!(b.replay(&s()), replay);
                }
                Err(e) => prop_assert!(false, "{e:?}"),
            }
        }
        // Whatever was offered, the replay is readable and complete.
        let mut client = ConversationClient::new();
        let chunks = b.replay(&s());
        for c in &chunks { client.handle_replay_chunk(&c.json, Millis(0)); }
        prop_assert!(!client.rebuilding());
        prop_assert_eq!(replayed_seqs(&chunks), (0..next).collect::<Vec<_>>());
    }
}
