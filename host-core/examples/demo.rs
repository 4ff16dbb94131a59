//! End to end on a real SQLite file: one [`Host`] over two connections to the file (or to a
//! PostgreSQL database with `--backend postgres`), a
//! scripted Codex-like agent, a desktop window and a phone behind a lossy relay.
//!
//! The phone sends two messages: the first is accepted and confirmed by its echo; the
//! reply to the second is lost, so it is confirmed from the agent's history instead of
//! being sent again. The agent asks for an approval: the phone allows it, the desktop's
//! late decision is refused as already resolved. One relay event to the phone is lost.
//! Halfway the host restarts from the file. Both timelines are printed as a person reads
//! them, with an invariant report.
//!
//! `cargo run -p host-core --example demo` (SQLite), or on a PostgreSQL database:
//! `DATABASE_URL=... cargo run -p host-core --example demo -- --backend postgres`

// The demo is the embedding, outside the pure core: it reads its configuration and the
// clock; the host itself never does.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use outbox_core::adapter::ReadHistoryRequest;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use host_core::{
    AgentCall, AgentInput, ClientRequest, Host, HostConfig, HostEffect, Reply, ReplyTo,
};
use outbox_core::adapter::SendKind;
use outbox_core::entry::Acceptance;
use outbox_core::ids::{ThreadId, TurnId};
use outbox_core::OutboxStore;
use outbox_core::{Capabilities, Controls, HistoryRead, MessageRequest, OperationId, QueueId};
use outbox_core::{SendResult, SessionInfo, SubmitRequest};
use overlay_core::source::{SourcePage, SourcePosition};
use overlay_core::{CleanupJournal, OverlayStore};
use overlay_core::{Delivery, HistorySource, LiveProtocol, MemorySource, Payload, RowClass};
use overlay_core::{RunEventKind, SourceError, SourceKind, StoredBlock, WindowId};
use storage_postgres::PostgresStore;
use storage_sqlite::SqliteStore;
use timeline_core::rows::ApprovalKind;
use timeline_core::timeline::TimelineEffect;
use timeline_core::{ApprovalRequest, Block, BlockKey, BlockType, BoundaryToken, ClientMode};
use timeline_core::{Decision, HostKey, LiveOverlay, Millis, RunId, SessionId, SourceOrder};
use timeline_core::{TargetId, Timeline};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;
type Transcript = Arc<Mutex<MemorySource>>;

// ----- the host: the drive loop and nothing else -------------------------------------

fn open_host<O: OutboxStore, V: OverlayStore + CleanupJournal>(
    (outbox, overlays): (O, V),
    session: &SessionId,
    transcript: &Transcript,
) -> Result<Host<O, V>> {
    let mut n = 0u64;
    let uuids = Box::new(move || {
        n += 1;
        format!("00000000-0000-4000-8000-{n:012x}")
    });
    let config = HostConfig::new(HostKey::from_bytes([0x42; 32]), uuids);
    let mut host = Host::new(outbox, overlays, config);
    let source = Box::new(Shared(transcript.clone()));
    host.add_session(session, SessionInfo::new(Capabilities::codex()), source);
    host.start(Millis(0))?;
    Ok(host)
}

/// How far ahead the demo waits for a deadline (the live coalescing window is 50 ms).
const WAIT: Millis = Millis(100);

/// Steps 2 and 3 of the loop: carry out every effect; wait for the next deadline if it
/// is near, and handle it.
fn drive<O: OutboxStore, V: OverlayStore + CleanupJournal>(w: &mut World<O, V>) {
    loop {
        while let Some(effect) = w.host.poll_effect() {
            match effect {
                HostEffect::Agent(call) => {
                    for input in w.agent.answer(call, w.now) {
                        w.host.handle_agent(input, w.now);
                    }
                }
                HostEffect::Deliver(delivery) => w.deliver(delivery),
                HostEffect::Reply { to, reply } => w.reply(to, reply),
                HostEffect::Notice(notice) => {
                    println!("  notice ({:?}): {notice}", notice.severity())
                }
                _ => {}
            }
        }
        match w.host.poll_timeout() {
            Some(deadline) if deadline <= w.now.saturating_add(WAIT) => {
                w.now = w.now.max(deadline);
                w.host.handle_timeout(w.now);
            }
            _ => break,
        }
    }
}

// ----- the world around it: an agent, two clients, a relay ---------------------------

/// A Codex-like agent: accepts every send except the one whose reply it loses, and keeps
/// a transcript the host reads as history.
struct Agent {
    transcript: Transcript,
    lose_reply_of: Option<OperationId>,
    sends: HashMap<OperationId, usize>,
}

impl Agent {
    fn answer(&mut self, call: AgentCall, now: Millis) -> Vec<AgentInput> {
        match call {
            AgentCall::Send(req) => {
                *self.sends.entry(req.operation_id.clone()).or_default() += 1;
                let result = if self.lose_reply_of.as_ref() == Some(&req.operation_id) {
                    SendResult::AdmissionUncertain {
                        error: "the reply was lost".into(),
                    }
                } else {
                    let run = match &req.kind {
                        SendKind::Start { run } | SendKind::Steer { run } => run.clone(),
                    };
                    let (thread, turn) = (ThreadId::new("thread-1"), TurnId::new("turn-1"));
                    match (thread, turn) {
                        (Ok(thread_id), Ok(turn_id)) => SendResult::Accepted(Acceptance {
                            run_id: run,
                            thread_id,
                            turn_id,
                            accepted_at: now,
                        }),
                        _ => SendResult::ProvenUnadmitted {
                            error: "bad IDs".into(),
                        },
                    }
                };
                vec![AgentInput::SendResult {
                    attempt: req.attempt,
                    result,
                }]
            }
            AgentCall::ReadHistory(ReadHistoryRequest {
                attempt,
                operation_id,
                ..
            }) => {
                let found = self.transcript.lock().is_ok_and(|t| {
                    t.all_blocks()
                        .iter()
                        .any(|b| b.operation_id.as_ref() == Some(&operation_id))
                });
                let read = if found {
                    HistoryRead::Found
                } else {
                    HistoryRead::Missing
                };
                vec![AgentInput::HistoryRead { attempt, read }]
            }
            AgentCall::ResolveApproval {
                request, decision, ..
            } => {
                let [request_id, thread_id, turn_id, item_id] = [
                    request.request_id.clone(),
                    request.thread_id.clone(),
                    request.turn_id.clone(),
                    request.item_id.clone(),
                ];
                let result = request.decide(decision).map_err(|e| e.to_string());
                vec![AgentInput::ApprovalResolved {
                    request_id,
                    thread_id,
                    turn_id,
                    item_id,
                    result,
                }]
            }
            _ => Vec::new(),
        }
    }

    /// The agent saves a row to its transcript.
    fn save(
        &mut self,
        key: BlockKey,
        op: Option<OperationId>,
        text: &str,
        at: Millis,
    ) -> Result<Block> {
        let mut block = Block::new(key, at).with_data(serde_json::json!({ "text": text }));
        block.operation_id = op;
        let mut t = self.transcript.lock().map_err(|_| "transcript lock")?;
        let order = SourceOrder::history(t.all_blocks().len() as u64, 0);
        t.push(vec![block.clone().with_source_order(order)]);
        Ok(block)
    }

    /// The agent streams a row of `run`.
    fn row(
        &mut self,
        session: &SessionId,
        run: &RunId,
        key: BlockKey,
        op: Option<OperationId>,
        text: &str,
        at: Millis,
    ) -> Result<AgentInput> {
        let mut block = Block::new(key, at).with_data(serde_json::json!({ "text": text }));
        block.operation_id = op;
        let rows = vec![StoredBlock {
            block,
            class: RowClass::Ordinary,
            run_id: Some(run.clone()),
        }];
        Ok(AgentInput::Rows {
            session: session.clone(),
            target: TargetId::main(session),
            rows,
        })
    }
}

struct World<O, V> {
    host: Host<O, V>,
    agent: Agent,
    session: SessionId,
    target: TargetId,
    clients: [Timeline; 2], // desktop, phone
    loads: HashMap<u64, (usize, timeline_core::RequestTag)>,
    next_request: u64,
    lost_relay_events: usize,
    drop_next_relay_event: bool,
    decisions: HashMap<ReplyTo, String>,
    now: Millis,
}

impl<O: OutboxStore, V: OverlayStore + CleanupJournal> World<O, V> {
    /// A client's load effects become host requests.
    fn serve(&mut self, client: usize) {
        while let Some(effect) = self.clients[client].poll_effect() {
            self.next_request += 1;
            let (session, target) = (self.session.clone(), self.target.clone());
            let request = match effect {
                TimelineEffect::LoadLatestWindow { tag, page_size, .. } => {
                    self.loads.insert(self.next_request, (client, tag));
                    ClientRequest::LatestWindow {
                        session,
                        target,
                        page_size,
                    }
                }
                TimelineEffect::LoadOlderPage {
                    tag,
                    cursor,
                    page_size,
                    expected_boundary_token,
                } => {
                    self.loads.insert(self.next_request, (client, tag));
                    ClientRequest::OlderPage {
                        session,
                        target,
                        cursor,
                        page_size,
                        expected_boundary_token,
                    }
                }
                _ => continue,
            };
            self.host
                .handle_client(ReplyTo(self.next_request), request, self.now);
            drive(self);
        }
    }

    fn reply(&mut self, to: ReplyTo, reply: Reply) {
        match (reply, self.loads.remove(&to.0)) {
            (Reply::LatestWindow(w), Some((c, tag))) => {
                self.clients[c].handle_latest_window(
                    &tag,
                    w.map_err(|_| timeline_core::timeline::LoadFailure::Unavailable),
                    self.now,
                );
            }
            (Reply::OlderPage(p), Some((c, tag))) => {
                self.clients[c].handle_older_page(
                    &tag,
                    p.map_err(|_| timeline_core::timeline::LoadFailure::Unavailable),
                    self.now,
                );
            }
            (Reply::Subscribed(Ok(sub)), _) => {
                if let Some(overlay) = sub.overlay {
                    self.clients[0].handle_live_update(&self.target, overlay, self.now);
                }
            }
            (Reply::Submitted(r), _) => println!(
                "  saved: {}",
                r.map(|r| format!("queue {}", r.queue_id))
                    .unwrap_or_else(|e| e.to_string())
            ),
            (Reply::Approval(r), _) => {
                let said = match r {
                    Ok(result) => format!("taken ({})", result.label()),
                    Err(e) => format!("refused ({e})"),
                };
                self.decisions.insert(to, said);
            }
            (Reply::Replay(chunks), _) => {
                println!("  phone joined: replay of {} chunk(s)", chunks.len())
            }
            _ => {}
        }
    }

    fn deliver(&mut self, delivery: Delivery) {
        match delivery {
            Delivery::Window {
                payload: Payload::Blocks { overlay, .. },
                ..
            } => {
                self.clients[0].handle_live_update(&self.target, overlay, self.now);
            }
            Delivery::Relay(event) if self.drop_next_relay_event => {
                self.drop_next_relay_event = false;
                self.lost_relay_events += 1;
                drop(event);
            }
            Delivery::Relay(event) => {
                if let Ok(o) =
                    serde_json::from_value::<LiveOverlay>(event.json["liveOverlay"].clone())
                {
                    self.clients[1].handle_live_update(&self.target, o, self.now);
                }
            }
            _ => {}
        }
    }

    fn submit(&mut self, n: u32, text: &str) -> Result<OperationId> {
        let op = OperationId::new(format!("op-{n}"))?;
        self.clients[1].add_pending(timeline_core::PendingSend {
            operation_id: op.clone(),
            created_at: self.now,
            data: serde_json::json!({ "text": text }),
        });
        let request = SubmitRequest {
            session: self.session.clone(),
            queue_id: QueueId::new(format!("q-{n}"))?,
            operation_id: op.clone(),
            request: MessageRequest::text(text, "phone", self.now),
            controls: Controls::automatic(),
        };
        self.host
            .handle_client(ReplyTo(0), ClientRequest::Submit(request), self.now);
        self.clients[1].confirm_pending(&op);
        drive(self);
        Ok(op)
    }

    fn active_run(&self) -> Result<RunId> {
        Ok(self
            .host
            .custody()
            .runs()
            .active(&self.session)
            .map(|r| r.run_id.clone())
            .ok_or("no active run")?)
    }
}

/// A transcript the agent writes and the host reads.
struct Shared(Transcript);

impl HistorySource for Shared {
    fn kind(&self) -> SourceKind {
        self.0
            .lock()
            .map(|s| s.kind())
            .unwrap_or(SourceKind::Claude {
                session: String::new(),
            })
    }
    fn boundary_token(&self) -> BoundaryToken {
        self.0
            .lock()
            .map(|s| s.boundary_token())
            .unwrap_or_else(|_| BoundaryToken::codex_rollout(""))
    }
    fn read(
        &mut self,
        before: Option<&SourcePosition>,
        limit: usize,
    ) -> std::result::Result<SourcePage, SourceError> {
        let mut s = self
            .0
            .lock()
            .map_err(|_| SourceError::Unavailable("transcript lock".into()))?;
        s.read(before, limit)
    }
}

/// A row as a person reads it, with where it comes from.
fn words(row: &timeline_core::Row<'_>) -> String {
    let origin = format!("{:?}", row.origin).to_lowercase();
    format!("{origin:<8} {}", timeline_core::rows::plain_text(row.block))
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().skip(1).map(String::as_str).collect::<Vec<_>>()[..] {
        [] | ["--backend", "sqlite"] => {
            let dir = tempfile::tempdir()?;
            let path = dir.path().join("custody.sqlite");
            println!("database: {}\n", path.display());
            let open = || -> Result<(SqliteStore, SqliteStore)> {
                let settings = storage_sqlite::Settings::default;
                Ok((
                    SqliteStore::open(&path, settings())?,
                    SqliteStore::open(&path, settings())?,
                ))
            };
            run(open, "session-1")
        }
        ["--backend", "postgres"] => {
            let url = std::env::var("DATABASE_URL")
                .map_err(|_| "--backend postgres needs DATABASE_URL (a PostgreSQL 13+ database)")?;
            println!("database: {url}\n");
            let open = || -> Result<(PostgresStore, PostgresStore)> {
                let settings = storage_postgres::Settings::default;
                Ok((
                    PostgresStore::connect(&url, settings())?,
                    PostgresStore::connect(&url, settings())?,
                ))
            };
            // A session of its own, so the demo can run again on the same database.
            let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
            run(open, &format!("session-{}", stamp.as_millis()))
        }
        _ => Err("usage: demo [--backend sqlite|postgres]".into()),
    }
}

/// The demo on the stores `open` opens (called again for the restart).
fn run<O: OutboxStore, V: OverlayStore + CleanupJournal>(
    mut open: impl FnMut() -> Result<(O, V)>,
    session: &str,
) -> Result<()> {
    let session = SessionId::new(session)?;
    let kind = SourceKind::Codex {
        thread_id: "thread-1".into(),
        generation: 1,
    };
    let transcript: Transcript = Arc::new(Mutex::new(MemorySource::new(
        kind,
        BoundaryToken::codex_rollout("/sessions/rollout-1.jsonl"),
    )));
    for i in 0..30u64 {
        let t = if i % 2 == 0 {
            BlockType::User
        } else {
            BlockType::AgentReply
        };
        let block = Block::new(
            BlockKey::parse(t, &format!("old-{i}"))?,
            Millis(1_000 + i * 10),
        )
        .with_source_order(SourceOrder::history(i, 0))
        .with_data(serde_json::json!({ "text": format!("earlier message {i}") }));
        transcript.lock().map_err(|_| "lock")?.push(vec![block]);
    }
    let agent = Agent {
        transcript: transcript.clone(),
        lose_reply_of: None,
        sends: HashMap::new(),
    };
    let mut w = World {
        host: open_host(open()?, &session, &transcript)?,
        agent,
        session: session.clone(),
        target: TargetId::main(&session),
        clients: [
            Timeline::new(ClientMode::Desktop),
            Timeline::new(ClientMode::Phone),
        ],
        loads: HashMap::new(),
        next_request: 100,
        lost_relay_events: 0,
        drop_next_relay_event: false,
        decisions: HashMap::new(),
        now: Millis(10_000),
    };

    let subscribe = |s: &SessionId| ClientRequest::Subscribe {
        window: WindowId(1),
        session: s.clone(),
        target: TargetId::main(s),
        protocol: LiveProtocol::Snapshots,
    };
    w.host.handle_client(ReplyTo(1), subscribe(&session), w.now);
    w.host.handle_client(
        ReplyTo(2),
        ClientRequest::Join {
            session: session.clone(),
            protocol: LiveProtocol::Snapshots,
        },
        w.now,
    );
    drive(&mut w);
    for c in 0..2 {
        w.clients[c].open_target(w.target.clone(), w.now);
        w.serve(c);
    }

    println!("1. the phone sends a message; the turn accepts it; the echo confirms it");
    let op1 = w.submit(1, "Run the test suite")?;
    let run1 = w.active_run()?;
    w.now = w.now.saturating_add(Millis(10));
    let mut inputs = vec![w.agent.row(
        &session,
        &run1,
        BlockKey::user_message(&op1),
        Some(op1.clone()),
        "Run the test suite",
        w.now,
    )?];
    w.drop_next_relay_event = true;
    for chunk in ["Running", "Running the tests: 412 passed"] {
        inputs.push(w.agent.row(
            &session,
            &run1,
            BlockKey::parse(BlockType::AgentReply, "reply-1")?,
            None,
            chunk,
            w.now,
        )?);
    }
    let request = ApprovalRequest {
        request_id: "7".into(),
        thread_id: "thread-1".into(),
        turn_id: "turn-1".into(),
        item_id: "item-9".into(),
        kind: ApprovalKind::CommandExecution,
        allowed: vec![Decision::Accept, Decision::Decline],
    };
    inputs.push(AgentInput::ApprovalAsked {
        session: session.clone(),
        target: w.target.clone(),
        run: Some(run1.clone()),
        request: request.clone(),
        summary: "cargo test --workspace".into(),
    });
    inputs.push(AgentInput::DeliveryProof {
        session: session.clone(),
        operation_id: op1.clone(),
    });
    for input in inputs {
        w.host.handle_agent(input, w.now);
        drive(&mut w);
    }
    w.clients[1].mark_delivered(&op1);
    w.agent.save(
        BlockKey::user_message(&op1),
        Some(op1.clone()),
        "Run the test suite",
        w.now,
    )?;
    w.agent.save(
        BlockKey::parse(BlockType::AgentReply, "reply-1")?,
        None,
        "Running the tests: 412 passed",
        w.now,
    )?;
    let decide = |d| ClientRequest::ResolveApproval {
        request_id: "7".into(),
        thread_id: "thread-1".into(),
        turn_id: "turn-1".into(),
        item_id: "item-9".into(),
        decision: d,
    };
    w.host
        .handle_client(ReplyTo(3), decide(Decision::Accept), w.now);
    w.host
        .handle_client(ReplyTo(4), decide(Decision::Decline), w.now);
    drive(&mut w);
    let (phone, desktop) = (&w.decisions[&ReplyTo(3)], &w.decisions[&ReplyTo(4)]);
    println!("  approval: phone allows: {phone}; desktop declines later: {desktop}");
    let card = BlockKey::parse(BlockType::Activity, &request.card_id())?;
    if let Some(row) = w.clients[0].row(&card) {
        println!("  desktop shows  {}", words(&row));
    }
    w.host.handle_agent(
        AgentInput::RunEnded {
            session: session.clone(),
            run: run1,
            outcome: RunEventKind::Completed,
            untaken: Vec::new(),
        },
        w.now,
    );
    drive(&mut w);

    println!("2. the second message's reply is lost; history proves it arrived");
    w.now = w.now.saturating_add(Millis(1_000));
    let op2 = OperationId::new("op-2")?;
    w.agent.lose_reply_of = Some(op2.clone());
    // The agent took it and wrote it to its transcript before the reply was lost.
    w.agent.save(
        BlockKey::user_message(&op2),
        Some(op2.clone()),
        "Now fix the flaky login test",
        w.now,
    )?;
    w.submit(2, "Now fix the flaky login test")?;
    w.clients[1].mark_delivered(&op2);
    println!(
        "  {op2}: sent {} time(s), outbox holds {} entries",
        w.agent.sends[&op2],
        w.host.entries(&session)?.len()
    );

    println!("3. the host restarts from the file");
    drop(std::mem::replace(
        &mut w.host,
        open_host(open()?, &session, &transcript)?,
    ));
    w.host.handle_client(ReplyTo(1), subscribe(&session), w.now);
    drive(&mut w);

    println!("4. both clients reload; the phone pages in older rows");
    for c in 0..2 {
        w.clients[c].reload(w.now);
        w.serve(c);
    }
    w.clients[1].load_older(w.now);
    w.serve(1);

    for (name, c) in [("desktop", 0), ("phone", 1)] {
        println!("\n{name}: {} rows, newest 8", w.clients[c].len());
        for row in w.clients[c]
            .rows()
            .rev()
            .take(8)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            println!("  {}", words(&row));
        }
    }
    println!("\ninvariants");
    let mut ok = true;
    for (name, t) in [("desktop", &w.clients[0]), ("phone", &w.clients[1])] {
        let rows: Vec<_> = t.rows().collect();
        let ordered = rows
            .windows(2)
            .all(|x| x[0].block.order_key() < x[1].block.order_key());
        let visible = [&op1, &op2]
            .iter()
            .all(|op| t.row(&BlockKey::user_message(op)).is_some());
        println!("  {name:<8} ordered and unique={ordered} both messages shown={visible}");
        ok &= ordered && visible;
    }
    let once = w.agent.sends.values().all(|n| *n == 1);
    let empty = w.host.entries(&session)?.is_empty();
    println!(
        "  each message reached the agent once={once}, outbox empty={empty}, lost relay events={}",
        w.lost_relay_events
    );
    let desktop = &w.decisions[&ReplyTo(4)];
    ok &= once && empty && desktop.contains("already resolved");
    if !ok {
        return Err("an invariant failed".into());
    }
    Ok(())
}
