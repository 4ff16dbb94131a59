//! # agent-codex
//!
//! The Codex agent for the custody engine: the app-server JSON-RPC codec, the projection
//! of its notifications into the library's blocks, delivery proofs, and rollout files as
//! a history source. The core is sans-IO; reading files lives at the edge ([`edge`]).
//!
//! - [`codec`]: JSON-RPC 2.0 over newline-delimited stdio (v2 methods): typed requests,
//!   typed server lines, approval answers; nothing the server sends is fatal.
//! - [`protocol`]: the wire shapes (items, turns, threads, notifications, requests).
//! - [`send`]: every send failure mapped to the six send results in one table (OB-08,
//!   OB-09).
//! - [`proof`]: delivery proof by `clientId` live, in a thread read and in a rollout.
//! - [`project`]: notifications into overlay rows and packed-history delta events.
//! - [`rollout`]: rollout lines, typed, with torn-tail handling.
//! - [`history`]: rollout lines into history rows (calls joined with their outputs).
//! - [`tail`]: pages of a rollout read from its tail, sans-IO (latest, older, newer).
//! - [`diag`]: what was skipped, counted, and the agent version.
//! - [`driver`]: the process edge: `codex app-server` (or a stand-in) over stdio, with
//!   deadlines; its end is seen.
//! - [`adapter`]: the [`outbox_core::adapter::AgentAdapter`] for Codex over the driver.
//! - [`seam`]: Codex behind the host's agent seam ([`host_core::Agent`]): the same
//!   steps without blocking and without IO, for a runtime to drive. One process serves
//!   every session: a thread that does not open in time fails only its own session's
//!   sends, and a thread Codex closes (`thread/closed`) is resumed before its next turn.
//! - [`items`]: the session's history as the seed reads it, through `thread/items/list`
//!   of a `codex app-server` of its own ([`ItemsSource`] over an [`ItemsReader`]): the
//!   rows the live stream showed, under the same keys, so the exact scans settle them.
//!   This is the history source a host gives its Codex sessions.
//! - [`edge`]: the file IO: rollout bytes (plain or `.jsonl.zst`) and the rollout as an
//!   `overlay-core` history source ([`edge::RolloutSource`]), for rollout files on disk.
//!
//! Versions known to work: `codex app-server` of `@openai/codex` 0.169.0 (the pinned
//! one: its JSON Schema is checked in under `schema/0.169.0/`, every request the codec
//! writes validates against it, and the server notifications it prints are there too)
//! and 0.168.0, both run by the real-agent tests
//! (`tests/real_codex.rs` here, `host-runtime/tests/real_codex.rs`); 0.147's recordings
//! are replayed by the stand-in tests. Versions are pinned in the repository's
//! `agents/package.json` and `agents/older/package.json`.
//!
//! Tolerance of versions: an unknown method, notification, item type, line type or
//! field is skipped and counted in a [`diag::Diagnostics`], never an error.

#![warn(unreachable_pub)]

pub mod adapter;
pub mod codec;
pub mod diag;
pub mod driver;
pub mod edge;
pub mod history;
pub mod items;
pub mod project;
pub mod proof;
pub mod protocol;
pub mod rollout;
pub mod seam;
pub mod send;
pub mod tail;
pub mod time;

pub use adapter::{AdapterError, AdapterEvent, CodexAdapter};
pub use codec::{Codec, Incoming, ListedItem, Response};
pub use diag::{Diagnostics, Skip};
pub use driver::{Driver, DriverConfig, ReadLine};
pub use edge::{read_rollout_file, rollout_holds, EdgeError, RolloutBytes, RolloutSource};
pub use history::{CallOutput, Entry, LineRole};
pub use items::{ItemPages, ItemsPage, ItemsReader, ItemsSource, SharedPages, ThreadLink};
pub use project::{Projected, Projector};
pub use proof::{DeliveryWatch, Verdict};
pub use rollout::{RolloutLine, RolloutReader, RolloutRecord};
pub use seam::{CodexAgent, ThreadConfig};
pub use tail::{LinePosition, PageAfter, PageBefore, TailError, TailItem, TailPage};
