//! # host-core
//!
//! One pure host machine: [`Host`] owns, for one host process, message custody over an
//! outbox store, the overlay store, the history source of every timeline target, live
//! delivery to desktop windows and the phone relay, the Codex exact scans with their
//! cleanup journal, the replay buffers a joining phone reads, and approvals decided once
//! across devices. It reads no clock, does no IO and draws no randomness: the embedder
//! feeds it client requests, agent answers and the time, and carries out its effects.
//!
//! # The drive loop
//!
//! Every machine in this workspace follows one contract, and `Host` is the one an
//! embedder drives:
//!
//! 1. Feed an input with the current time: [`Host::handle_client`] (a request from a
//!    window or phone, with a [`ReplyTo`] of your choosing), [`Host::handle_agent`] (an
//!    answer or event from an agent), or [`Host::handle_timeout`] when the deadline came.
//! 2. Drain [`Host::poll_effect`] until it is empty, and carry out each [`HostEffect`]:
//!    call the agent ([`AgentCall`]; its answer comes back through step 1), deliver a
//!    live event, send a [`Reply`] to the client that asked, show or log a [`Notice`].
//! 3. Ask [`Host::poll_timeout`] for the next deadline (the earliest of every inner
//!    machine) and wait for it or for the next input, whichever comes first. Go to 1.
//!
//! ```
//! use host_core::{AgentCall, AgentInput, ClientRequest, Host, HostConfig, HostEffect, Reply, ReplyTo};
//! use outbox_core::{Capabilities, Controls, MemoryOutboxStore, MessageRequest, OperationId};
//! use outbox_core::{QueueId, SendResult, SessionInfo, SubmitRequest};
//! use overlay_core::{MemoryOverlayStore, MemorySource, SourceKind};
//! use timeline_core::{BoundaryToken, HostKey, Millis, SessionId};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut n = 0u64;
//! let uuids = Box::new(move || { n += 1; format!("00000000-0000-4000-8000-{n:012x}") });
//! let mut host = Host::new(
//!     MemoryOutboxStore::new(),
//!     MemoryOverlayStore::new(),
//!     HostConfig::new(HostKey::from_bytes([7; 32]), uuids),
//! );
//! let session = SessionId::new("session-1")?;
//! let source = MemorySource::new(
//!     SourceKind::Codex { thread_id: "thread-1".into(), generation: 1 },
//!     BoundaryToken::codex_rollout("/sessions/rollout-1.jsonl"),
//! );
//! host.add_session(&session, SessionInfo::new(Capabilities::codex()), Box::new(source));
//! host.start(Millis(0))?;
//!
//! // 1. A phone sends a message.
//! let op = OperationId::new("op-1")?;
//! let now = Millis(1_000);
//! host.handle_client(
//!     ReplyTo(1),
//!     ClientRequest::Submit(SubmitRequest {
//!         session: session.clone(),
//!         queue_id: QueueId::new("q-1")?,
//!         operation_id: op.clone(),
//!         request: MessageRequest::text("Run the tests", "phone", now),
//!         controls: Controls::automatic(),
//!     }),
//!     now,
//! );
//! // 2. Carry out the effects: the receipt goes to the phone, the message to the agent.
//! let mut saved = false;
//! while let Some(effect) = host.poll_effect() {
//!     match effect {
//!         HostEffect::Reply { to: ReplyTo(1), reply: Reply::Submitted(receipt) } => saved = receipt.is_ok(),
//!         HostEffect::Agent(AgentCall::Send(request)) => {
//!             // Hand it to the agent; here it answers at once.
//!             let result = SendResult::Delivered;
//!             host.handle_agent(AgentInput::SendResult { attempt: request.attempt, result }, now);
//!         }
//!         _ => {} // live deliveries, notices
//!     }
//! }
//! assert!(saved);
//! // 3. Wait for the next deadline or input.
//! if let Some(deadline) = host.poll_timeout() {
//!     host.handle_timeout(deadline);
//! }
//! assert!(host.entries(&session)?.is_empty(), "delivered: the outbox let it go");
//! # Ok(())
//! # }
//! ```
//!
//! # What the host decides for the embedder
//!
//! - **Save, then send.** Agent rows ([`AgentInput::Rows`]) are written to the overlay
//!   store first; only the saved snapshot goes to windows and the relay. A refused write
//!   sends nothing and says so ([`Notice::OverlayWriteFailed`]).
//! - **Runs.** A run starts when custody hands a message to the agent as a new turn (the
//!   hub and the replay's running state learn of it then) and ends when the agent says
//!   so ([`AgentInput::RunEnded`]), or when custody lets it go (a refused start, the stale
//!   reclaim: clients see it as failed). A Codex run's end starts its exact scans (OV-06):
//!   the host writes the cleanup journal row, reads each target's history back from the
//!   present ([`EXACT_SCAN_READS`] pages of [`EXACT_SCAN_PAGE`] items at most) for the
//!   run's keys, settles what it found and sends what it saved. Journal rows left at a
//!   restart are scanned again when their session is first opened (the restart repair).
//! - **Session events.** The fragments the agent streams ([`AgentInput::Delta`]) are
//!   logged per session with sequence numbers and sent on live one by one; [`ClientRequest::SessionPage`] answers a page of the log cut at
//!   message boundaries and packed into chunk rows (PK-01, PK-02). The log is memory
//!   only, bounded by [`HostConfig::session_log_bytes`] per session and
//!   [`HostConfig::session_logs_bytes`] in all; it is not kept in the replay (a joining
//!   phone pages it).
//! - **Replay.** Every event sent to the relay, every user message handed to the agent
//!   and every approval request is appended to the session's replay buffer; a phone that
//!   joins ([`ClientRequest::Join`]) gets the replay and then live events.
//! - **Approvals** are decided once across devices (see [`ApprovalError`]). A card is
//!   saved like any live row, but it never comes back from history, so a card write
//!   the store refused is tried again a second later (a decided card only over its
//!   pending one) until it is saved.
//! - **Anchored loads** are answered like latest windows (same answer type); the client
//!   gives them the 115 s of `run.chatLoad`.
//! - **Failures are never dropped**: a caller's request gets its error in its [`Reply`];
//!   anything else the host meets comes out as a [`Notice`].

#![warn(unreachable_pub)]

mod agent;
mod approvals;
mod events;
mod host;
mod io;
mod run_book;

pub use agent::{
    unserved, Agent, AgentEffect, FileError, ProcessId, ProcessSpec, ReadId, WriteFailure, WriteId,
};

pub use approvals::{DECIDED_KEPT, DECISION_FIELD};
pub use events::{Fragment, SessionPage, MAX_PAGE_EVENTS, SESSION_LOGS_BYTES, SESSION_LOG_BYTES};
pub use host::{
    Host, HostConfig, HostStats, StartError, EXACT_SCAN_PAGE, EXACT_SCAN_READS, REWRITE_JOURNAL_RUN,
};
pub use io::{
    AgentCall, AgentInput, ApprovalError, ClientRequest, HostEffect, LoadError, NewSession,
    NewSessionError, Notice, Reply, ReplyTo, SessionSummary, Severity,
};
