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
//! - [`diag`]: what was skipped, counted, and the agent version.
//!
//! Tolerance of versions: an unknown method, notification, item type, line type or
//! field is skipped and counted in a [`diag::Diagnostics`], never an error.

pub mod codec;
pub mod diag;
pub mod edge;
pub mod project;
pub mod proof;
pub mod protocol;
pub mod rollout;
pub mod send;
