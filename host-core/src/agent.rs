//! The agent seam: one non-blocking, IO-free interface between [`crate::Host`] and an
//! agent (Codex's app-server, Claude Code, a scripted stand-in).
//!
//! An [`Agent`] follows the loop contract of every machine here. The host's
//! [`AgentCall`]s go in through [`Agent::handle_call`]; what the agent's processes print
//! goes in line by line through [`Agent::handle_line`], their ends through
//! [`Agent::handle_exit`], the outcome of each write through [`Agent::handle_written`]
//! and the bytes of each file read through [`Agent::handle_file`]. Out of
//! [`Agent::poll_effect`] come [`AgentEffect`]s: inputs for the host
//! ([`AgentEffect::Input`]) and the IO to carry out (start a process, write a line, close
//! its input, kill it, read a file). Deadlines (the 30 s reply deadline of a send, a
//! stop's wait) go out through [`Agent::poll_timeout`] and come back as
//! [`Agent::handle_timeout`].
//!
//! The runtime that carries out the IO owns the processes; an agent names them with the
//! [`ProcessId`]s it chooses. A line arrives without its newline; a line longer than the
//! runtime's limit arrives as [`Agent::handle_line_too_long`] (its bytes dropped), never
//! as an unbounded buffer.
//!
//! Which agent serves which session is the embedder's choice: an agent answers
//! [`Agent::serves`] for the sessions it was given, and every [`AgentCall`] names its
//! session ([`AgentCall::session`]).

use outbox_core::adapter::{ReadHistoryRequest, StopRequest, TakeBackRequest};
use std::ffi::OsString;
use std::path::PathBuf;

use outbox_core::adapter::Capabilities;
use timeline_core::key::SessionId;
use timeline_core::time::Millis;

use crate::io::{AgentCall, AgentInput};

/// A process of an agent, named by the agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProcessId(pub u64);

/// One write to a process, named by the agent, so its outcome comes back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WriteId(pub u64);

/// One file read, named by the agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReadId(pub u64);

/// How to start an agent's process: the program, its arguments, its environment and
/// its working directory. The runtime starts it in a process group of its own, with
/// stdin, stdout and stderr piped, and kills the group when the process is dropped.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProcessSpec {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Variables set (`Some`) or removed (`None`) in its environment.
    pub env: Vec<(OsString, Option<OsString>)>,
    /// Its working directory (the runtime's own when `None`).
    pub cwd: Option<PathBuf>,
}

impl ProcessSpec {
    /// `program` with no arguments, the runtime's environment and directory.
    pub fn new(program: impl Into<PathBuf>) -> ProcessSpec {
        ProcessSpec {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            cwd: None,
        }
    }

    /// Adds arguments.
    #[must_use]
    pub fn args<I, S>(mut self, args: I) -> ProcessSpec
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets an environment variable.
    #[must_use]
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> ProcessSpec {
        self.env.push((key.into(), Some(value.into())));
        self
    }

    /// Removes an environment variable.
    #[must_use]
    pub fn env_remove(mut self, key: impl Into<OsString>) -> ProcessSpec {
        self.env.push((key.into(), None));
        self
    }

    /// Sets the working directory.
    #[must_use]
    pub fn cwd(mut self, dir: impl Into<PathBuf>) -> ProcessSpec {
        self.cwd = Some(dir.into());
        self
    }
}

/// Why a write did not go through whole.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WriteFailure {
    /// Not one byte was written (the process is gone, its input closed): the agent
    /// cannot have read it.
    #[error("nothing was written: {0}")]
    NotWritten(String),
    /// Part of the line may have been written before the pipe broke: the agent may have
    /// read it.
    #[error("the write broke off: {0}")]
    Broken(String),
}

/// Something an [`Agent`] asks for.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum AgentEffect {
    /// An input for the host ([`crate::Host::handle_agent`]).
    Input(AgentInput),
    /// Start a process; its lines and its end come back under `process`.
    Spawn {
        /// The name the agent gives it.
        process: ProcessId,
        /// How to start it.
        spec: ProcessSpec,
    },
    /// Write `line` and a newline to the process's input; the outcome comes back as
    /// [`Agent::handle_written`].
    Write {
        /// The process.
        process: ProcessId,
        /// The write.
        write: WriteId,
        /// The line, without its newline.
        line: Vec<u8>,
    },
    /// Close the process's input (it ends when it has read everything).
    CloseInput {
        /// The process.
        process: ProcessId,
    },
    /// Kill the process and its group.
    Kill {
        /// The process.
        process: ProcessId,
    },
    /// Read a whole file, at most `limit` bytes: [`Agent::handle_file`].
    ReadFile {
        /// The read.
        read: ReadId,
        /// The file.
        path: PathBuf,
        /// Bytes past this are a failure, not a longer buffer.
        limit: u64,
    },
}

/// What became of a file read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FileError {
    /// No such file.
    #[error("no file at {0}")]
    NotFound(String),
    /// The file is longer than the read's limit.
    #[error("{path} is longer than {limit} bytes")]
    TooLarge {
        /// The file.
        path: String,
        /// The limit.
        limit: u64,
    },
    /// Any other failure, in the system's words.
    #[error("{0}")]
    Io(String),
}

/// One agent as the host drives it. See the module doc.
pub trait Agent {
    /// What the agent supports.
    fn capabilities(&self) -> Capabilities;
    /// True when the agent serves `session`.
    fn serves(&self, session: &SessionId) -> bool;
    /// Work from the host.
    fn handle_call(&mut self, call: AgentCall, now: Millis);
    /// A line `process` printed on its output, without the newline.
    fn handle_line(&mut self, process: ProcessId, line: &[u8], now: Millis);
    /// `process` printed a line longer than the runtime's limit; its bytes were dropped.
    fn handle_line_too_long(&mut self, process: ProcessId, now: Millis);
    /// `process` ended (or could not be started): `reason` in the system's words.
    fn handle_exit(&mut self, process: ProcessId, reason: String, now: Millis);
    /// What became of a write.
    fn handle_written(
        &mut self,
        process: ProcessId,
        write: WriteId,
        result: Result<(), WriteFailure>,
        now: Millis,
    );
    /// What a file read found.
    fn handle_file(&mut self, read: ReadId, result: Result<Vec<u8>, FileError>, now: Millis);
    /// The next effect, if any.
    #[must_use]
    fn poll_effect(&mut self) -> Option<AgentEffect>;
    /// The earliest deadline of the agent, if any.
    #[must_use]
    fn poll_timeout(&self) -> Option<Millis>;
    /// The deadline came.
    fn handle_timeout(&mut self, now: Millis);
}

impl AgentCall {
    /// The session the call is for.
    pub fn session(&self) -> &SessionId {
        match self {
            AgentCall::Send(request) => &request.session,
            AgentCall::ReadHistory(ReadHistoryRequest { session, .. })
            | AgentCall::Stop(StopRequest { session, .. })
            | AgentCall::TakeBack(TakeBackRequest { session, .. })
            | AgentCall::ResolveApproval { session, .. }
            | AgentCall::SessionMessageResult { session, .. }
            | AgentCall::ClearThreadLink { session } => session,
        }
    }
}

/// The answer to `call` when no agent serves its session: the message was not handed
/// to anyone (proven unadmitted), the history cannot be read, nothing was stopped or
/// taken back, the decision did not reach an agent. `None` for calls that need no
/// answer.
pub fn unserved(call: AgentCall) -> Option<AgentInput> {
    use outbox_core::adapter::{HistoryRead, SendResult, StopResult, TakeBackResult};
    let why = |session: &SessionId| format!("no agent serves session {session}");
    match call {
        AgentCall::Send(request) => Some(AgentInput::SendResult {
            result: SendResult::ProvenUnadmitted {
                error: why(&request.session),
            },
            attempt: request.attempt,
        }),
        AgentCall::ReadHistory(ReadHistoryRequest { attempt, .. }) => {
            Some(AgentInput::HistoryRead {
                attempt,
                read: HistoryRead::Unreadable,
            })
        }
        AgentCall::Stop(StopRequest {
            attempt, session, ..
        }) => Some(AgentInput::StopResult {
            attempt,
            result: StopResult::Failed {
                error: why(&session),
            },
        }),
        AgentCall::TakeBack(TakeBackRequest {
            attempt, session, ..
        }) => Some(AgentInput::TakeBack {
            attempt,
            result: TakeBackResult::NotDetached {
                reason: why(&session),
            },
        }),
        AgentCall::ResolveApproval {
            session, request, ..
        } => Some(AgentInput::ApprovalResolved {
            result: Err(why(&session)),
            request_id: request.request_id,
            thread_id: request.thread_id,
            turn_id: request.turn_id,
            item_id: request.item_id,
        }),
        AgentCall::SessionMessageResult { .. } | AgentCall::ClearThreadLink { .. } => None,
    }
}
