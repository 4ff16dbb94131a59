//! # agent-codex
//!
//! The Codex agent for the custody engine: the app-server JSON-RPC codec, the projection
//! of its notifications into the library's blocks, and rollout files as a history source.
//! The core is sans-IO; reading files and driving the child process live at the edge.
