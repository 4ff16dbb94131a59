//! # agent-claude
//!
//! The Claude Code agent for the custody engine: the stream-json codec, the projection of
//! its events into the library's blocks, transcripts as a history source, and the agent
//! adapter over a `claude -p` process. The core is sans-IO (bytes and lines in, values
//! out; time is an argument); reading files and driving the child process live at the
//! edge ([`file`](mod@file), [`driver`], [`adapter`]).
//!
//! - [`stream`]: the codec for `claude -p --input-format stream-json --output-format
//!   stream-json --replay-user-messages`: the user line the host writes (its `uuid` is
//!   the message's UUID) and every line Claude prints, typed.
//! - [`proof`]: delivery evidence (the replayed echo, `command_lifecycle`,
//!   `result.user_message_uuid`; in history, a user entry with the UUID).
//! - [`project`]: live lines into rows, delta events and evidence; messages Claude merges
//!   into one turn are one row live, as in the transcript (the merged message's key,
//!   their words once).
//! - [`transcript`]: the transcript reader (lines merged by `message.id`, tool results
//!   joined, metadata skipped, the branch of the newest item as the conversation, a
//!   torn last line left for the next read, [`transcript::Transcript::finish`] for a
//!   complete file), paged by UUID.
//! - [`tail`]: pages of a transcript read from the file's end, sans-IO: the latest
//!   window costs the bytes of its page, not the file.
//! - [`source`]: a transcript read so far as an `overlay-core` history source.
//! - [`permission`]: Claude's permission prompts as the shared approval model (RW-06);
//!   accepting for the session forwards only the rules Claude suggests, for this session
//!   (never a mode change, a directory or a settings file).
//! - [`run`]: one Claude run: what its lines prove about each message written, its
//!   rows, its approval cards.
//! - [`file`](mod@file): the file edge: where transcripts live, whole and tail reads, the
//!   transcript file as a history source, the history read of a delivery proof.
//! - [`driver`]: the process edge: one `claude` child, lines with deadlines, its exit.
//! - [`adapter`]: the [`outbox_core::adapter::AgentAdapter`] for Claude.
//! - [`seam`]: Claude behind the host's agent seam ([`host_core::Agent`]), without
//!   blocking and without IO, for a runtime to drive.
//! - [`diag`]: what was parsed, skipped, unknown or malformed. Message content
//!   ([`Content`], [`ContentBlock`], [`Message`]) is re-exported here; the rows both paths
//!   build (keyed alike) are private to the crate, and timestamps are read by
//!   `timeline_core::time::parse_timestamp`, the parser the Codex adapter uses too.
//!
//! Nothing here is fatal on input from a newer Claude: unknown line types, subtypes,
//! event, delta and block types are skipped and counted in [`diag::Diagnostics`].

#![warn(unreachable_pub)]

pub mod adapter;
mod blocks;
mod content;
pub mod diag;
pub mod driver;
pub mod file;
mod marks;
pub mod permission;
pub mod project;
pub mod proof;
pub mod run;
pub mod seam;
pub mod source;
pub mod stream;
pub mod tail;
pub mod transcript;

pub use adapter::{AdapterConfig, ApprovalError, ClaudeAdapter};
pub use blocks::{ToolCall, ToolResult};
pub use content::{Content, ContentBlock, Message};
pub use diag::Diagnostics;
pub use driver::{ClaudeCommand, Driver, DriverError, DriverEvent};
pub use file::{
    has_user_entry, read_latest, read_transcript, transcript_path, FileError, TranscriptFile,
};
pub use permission::{answer_line, approval_request};
pub use project::{Output, Projector};
pub use proof::{history_read, Evidence, ProofSource, Verdict};
pub use run::{send_result, ClaudeRun, ResolveError, SendState, WaitEnd};
pub use seam::{ClaudeAgent, ClaudeConfig};
pub use source::TranscriptSource;
pub use stream::{MessageUuid, StreamDecoder, StreamLine, UserMessage};
pub use tail::{TailPage, TailRead, TailStep};
pub use transcript::{Item, ItemKind, Page, PageError, Reply, Transcript};
