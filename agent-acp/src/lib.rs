//! # agent-acp
//!
//! Any agent that speaks the [Agent Client Protocol](https://agentclientprotocol.com)
//! (ACP, version 1) behind the host's agent seam ([`host_core::Agent`]), so the host
//! keeps custody of its conversations as it does of Codex's and Claude Code's.
//!
//! - [`seam`]: [`AcpAgent`], one agent process serving every session, sans-IO: the
//!   runtime carries its lines, the agent turns them into the host's inputs.
//! - [`rows`]: `session/update` notifications into rows (user and agent message chunks,
//!   thoughts, tool calls and their updates, plans), one projection for live turns and
//!   for the replay of `session/load`.
//! - [`history`]: [`AcpHistory`], the sessions' history as the host's history source:
//!   the replay of `session/load` and every turn the agent ended since.
//!
//! The messages are the official `agent-client-protocol` crate's types
//! (`agent_client_protocol::v1::schema`); its async connection is not used, because the
//! host loop is sans-IO and its runtime owns the processes and their lines.
//!
//! What differs from Codex and Claude Code is data ([`outbox_core::adapter::Capabilities::acp`]):
//! ACP v1 has no client message ID and no steer. So a send whose outcome is unknown
//! (the process died, the agent failed before it said anything) is held for the user
//! and never sent again by itself; a message into a running turn is refused at submit,
//! as the seed refuses replace latest for Claude; and a `session/load` replay is
//! history, never live output.

#![warn(unreachable_pub)]

pub mod history;
pub mod rows;
pub mod seam;

pub use history::{AcpHistory, AcpSource};
pub use seam::{AcpAgent, AcpConfig};
