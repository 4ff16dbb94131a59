//! # outbox-core
//!
//! Custody of a message from the composer to the agent, as pure state machines behind
//! storage traits and an agent-adapter boundary (OB-01 to OB-18). A message is saved,
//! accepted and confirmed at three separate moments; it is never lost; it is never sent
//! to the agent twice unless the agent confirmed the first copy was not applied.
//!
//! - [`ids`]: identities and the alias scope (OB-01, OB-06).
//! - [`fingerprint`]: the request fingerprint and the admission input digest (OB-02,
//!   OB-07).
//! - [`entry`]: the outbox entry model, submission controls and the fixed texts (OB-04,
//!   OB-05).
//! - [`ledger`]: the ledger lattice and the 256-record memory fallback (OB-07).
//! - [`store`]: the storage trait and the in-memory reference store.
//! - [`adapter`]: the agent boundary and capabilities.
//! - [`runs`]: the run registry (OB-14).
//! - [`custody`]: submit, drain lanes, send results, history reads, interrupt, stop,
//!   stop and send now (OB-03, OB-08 to OB-13, OB-15).
//! - [`session_message`], [`envelope`], [`titles`]: messages between sessions and
//!   session titles (OB-16 to OB-18).
//!
//! Nothing here reads a clock, sleeps, spawns or draws randomness: time is an argument,
//! UUIDs come from the host, and agent work comes out as effects.

#![warn(unreachable_pub)]

pub mod adapter;
pub mod custody;
pub mod entry;
pub mod envelope;
pub mod fingerprint;
pub mod ids;
pub mod ledger;
pub mod runs;
pub mod session_message;
pub mod store;
pub mod titles;

pub use adapter::{AgentAdapter, AgentKind, AttemptId, Capabilities, HistoryRead, SendResult};
pub use custody::{Custody, SessionInfo, SubmitRequest};
pub use entry::{
    Controls, EntryState, InvalidEntryState, MessageRequest, OutboxEntry, Receipt, StoredEntry,
};
pub use ids::{OperationId, QueueId, ScopeId};
pub use store::memory::MemoryOutboxStore;
pub use store::OutboxStore;
