//! # agent-claude
//!
//! The Claude Code agent for the custody engine: the stream-json codec, the projection of
//! its events into the library's blocks, and transcripts as a history source. The core is
//! sans-IO (bytes and lines in, values out; time is an argument); reading files and
//! driving the child process live at the edge.
//!
//! - [`stream`]: the codec for `claude -p --input-format stream-json --output-format
//!   stream-json --replay-user-messages`: the user line the host writes (its `uuid` is
//!   the message's UUID) and every line Claude prints, typed.
//! - [`proof`]: delivery evidence (the replayed echo, `command_lifecycle`,
//!   `result.user_message_uuid`; in history, a user entry with the UUID).
//! - [`project`]: live lines into rows, delta events and evidence.
//! - [`transcript`]: the transcript reader (lines merged by `message.id`, tool results
//!   joined, metadata skipped, torn last line left for the next read), paged by UUID.
//! - [`source`]: a transcript as an `overlay-core` history source.
//! - [`blocks`]: the rows both paths build, keyed alike; [`content`]: message content;
//!   [`diag`]: what was parsed, skipped, unknown or malformed; [`time`]: timestamps.
//!
//! Nothing here is fatal on input from a newer Claude: unknown line types, subtypes,
//! event, delta and block types are skipped and counted in [`diag::Diagnostics`].

pub mod blocks;
pub mod content;
pub mod diag;
pub mod project;
pub mod proof;
pub mod source;
pub mod stream;
pub mod time;
pub mod transcript;
