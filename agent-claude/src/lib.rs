//! # agent-claude
//!
//! The Claude Code agent for the custody engine: the stream-json codec, the projection of
//! its events into the library's blocks, and transcripts as a history source. The core is
//! sans-IO; reading files and driving the child process live at the edge.
