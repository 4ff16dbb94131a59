//! The process edge: one `claude -p` child, its input written a line at a time, its
//! output read a line at a time with a deadline, its exit seen. Nothing here reads
//! Claude's lines; [`crate::run`] does.
//!
//! A reader thread per pipe turns stdout into lines (each cut at [`MAX_LINE`], the rest
//! of a longer one skipped as it streams) and keeps the last [`STDERR_TAIL`] bytes of
//! stderr for the error text; [`Driver::next_event`] waits for
//! a line until a deadline and reports the exit once stdout is closed.
//!
//! Invariant: a driver that is dropped kills and reaps its child, so no Claude process
//! outlives the adapter that started it.

#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // the module that runs a process

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The most bytes of Claude's stderr kept for an error text.
pub const STDERR_TAIL: usize = 4096;

/// The longest line read (a bigger one is cut there and the rest of it dropped): a
/// tool result of a few megabytes fits, a runaway line does not take the memory.
pub const MAX_LINE: usize = 64 * 1024 * 1024;

/// How to start Claude.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaudeCommand {
    /// The program (`claude`, or a path).
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// The working directory (the project), when not the host's.
    pub cwd: Option<PathBuf>,
    /// Extra environment variables.
    pub env: Vec<(OsString, OsString)>,
}

impl ClaudeCommand {
    /// `claude -p --input-format stream-json --output-format stream-json
    /// --replay-user-messages --verbose --permission-prompt-tool stdio`: stream-json
    /// both ways, the replayed echo of every user line (the delivery proof), the
    /// verbose output stream-json needs in print mode, and permission prompts as
    /// control requests on stdout.
    pub fn claude() -> ClaudeCommand {
        ClaudeCommand::new("claude").args([
            "-p",
            "--input-format",
            "stream-json",
            "--output-format",
            "stream-json",
            "--replay-user-messages",
            "--verbose",
            "--permission-prompt-tool",
            "stdio",
        ])
    }

    /// A program with no arguments.
    pub fn new(program: impl Into<OsString>) -> ClaudeCommand {
        ClaudeCommand {
            program: program.into(),
            args: Vec::new(),
            cwd: None,
            env: Vec::new(),
        }
    }

    /// Adds arguments.
    #[must_use]
    pub fn args<I, S>(mut self, args: I) -> ClaudeCommand
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets the working directory.
    #[must_use]
    pub fn current_dir(mut self, dir: impl Into<PathBuf>) -> ClaudeCommand {
        self.cwd = Some(dir.into());
        self
    }
}

/// What the child did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DriverEvent {
    /// One line of stdout, without its newline.
    Line(Vec<u8>),
    /// Stdout closed and the child exited: its exit code (`None` when a signal ended
    /// it) and the end of its stderr.
    Exited {
        /// The exit code.
        code: Option<i32>,
        /// The last [`STDERR_TAIL`] bytes of stderr, lossily decoded.
        stderr: String,
    },
    /// Nothing came before the deadline.
    TimedOut,
}

/// Why the driver could not do what it was asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DriverError {
    /// The program could not be started: nothing reached Claude.
    #[error("starting {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// The error.
        source: std::io::Error,
    },
    /// Writing to Claude's input failed (it exited, or closed its input).
    #[error("writing to Claude: {0}")]
    Write(std::io::Error),
    /// Claude's input is closed already.
    #[error("Claude's input is closed")]
    InputClosed,
}

enum Piped {
    Line(Vec<u8>),
    Eof,
}

/// A running Claude process.
pub struct Driver {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<Piped>,
    stderr: Arc<Mutex<Vec<u8>>>,
    /// Set by the reader when stdout closes (the process ended or is ending).
    closed: Arc<AtomicBool>,
    exited: Option<(Option<i32>, String)>,
}

/// Sends stdout's lines, then the end (and marks `closed`); stops early when the
/// driver is gone. A line past [`MAX_LINE`] is cut there.
fn read_lines(
    stdout: impl Read,
    tx: &mpsc::Sender<Piped>,
    closed: &AtomicBool,
) -> Result<(), mpsc::SendError<Piped>> {
    let mut reader = BufReader::new(stdout);
    let mut line = Vec::new();
    while let Ok(true) = read_line_bounded(&mut reader, MAX_LINE, &mut line) {
        tx.send(Piped::Line(std::mem::take(&mut line)))?;
    }
    closed.store(true, Ordering::Release);
    tx.send(Piped::Eof)
}

/// Reads one line into `line` (without its newline), at most `max` bytes of it: the rest
/// of a longer line streams past unkept, so a runaway line never takes the memory.
/// False at the end of the output.
fn read_line_bounded(
    reader: &mut impl BufRead,
    max: usize,
    line: &mut Vec<u8>,
) -> std::io::Result<bool> {
    line.clear();
    if reader.by_ref().take(max as u64).read_until(b'\n', line)? == 0 {
        return Ok(false);
    }
    if line.last() == Some(&b'\n') {
        line.pop();
    } else if line.len() >= max {
        loop {
            let buf = match reader.fill_buf() {
                Ok(buf) => buf,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if buf.is_empty() {
                break;
            }
            if let Some(i) = buf.iter().position(|&b| b == b'\n') {
                reader.consume(i + 1);
                break;
            }
            let n = buf.len();
            reader.consume(n);
        }
    }
    Ok(true)
}

/// Kills `child` and reaps it.
fn end(child: &mut Child) -> std::io::Result<()> {
    child.kill()?;
    child.wait().map(|_| ())
}

fn keep_tail(mut stderr: impl Read, tail: &Arc<Mutex<Vec<u8>>>) {
    let mut buf = [0u8; 4096];
    while let Ok(n) = stderr.read(&mut buf) {
        if n == 0 {
            break;
        }
        let Ok(mut t) = tail.lock() else {
            break;
        };
        t.extend_from_slice(buf.get(..n).unwrap_or_default());
        let over = t.len().saturating_sub(STDERR_TAIL);
        t.drain(..over);
    }
}

impl Driver {
    /// Starts `command` with piped stdin, stdout and stderr.
    pub fn spawn(command: &ClaudeCommand) -> Result<Driver, DriverError> {
        let mut cmd = Command::new(&command.program);
        cmd.args(&command.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(dir) = &command.cwd {
            cmd.current_dir(dir);
        }
        for (k, v) in &command.env {
            cmd.env(k, v);
        }
        let spawn_error = |source| DriverError::Spawn {
            program: command.program.to_string_lossy().into_owned(),
            source,
        };
        let mut child = cmd.spawn().map_err(spawn_error)?;
        let stdin = child.stdin.take();
        // Unbounded on purpose: this driver's writes to the child block, so a bounded
        // queue would let a child whose output filled (it then stops reading its input)
        // and a write waiting on that input hang each other for good. Each line is cut
        // at MAX_LINE; the runtime (host-runtime) bounds its queues, its writes never
        // waiting on the reader.
        let (tx, rx) = mpsc::channel();
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let closed = Arc::new(AtomicBool::new(false));
        let threads = (|| {
            let stdout = child
                .stdout
                .take()
                .ok_or_else(|| std::io::Error::other("no stdout pipe"))?;
            let closed = Arc::clone(&closed);
            std::thread::Builder::new()
                .name("claude-stdout".into())
                .spawn(move || read_lines(stdout, &tx, &closed))?;
            if let Some(err) = child.stderr.take() {
                let tail = Arc::clone(&stderr);
                std::thread::Builder::new()
                    .name("claude-stderr".into())
                    .spawn(move || keep_tail(err, &tail))?;
            }
            Ok(())
        })();
        if let Err(e) = threads {
            // Without its readers the child is of no use: end it before saying so.
            return Err(spawn_error(match end(&mut child) {
                Ok(()) => e,
                Err(k) => std::io::Error::other(format!("{e}; ending the child: {k}")),
            }));
        }
        Ok(Driver {
            child,
            stdin,
            lines: rx,
            stderr,
            closed,
            exited: None,
        })
    }

    /// The child's process ID.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Writes `line` (which ends with its newline) and flushes it.
    pub fn write_line(&mut self, line: &str) -> Result<(), DriverError> {
        let stdin = self.stdin.as_mut().ok_or(DriverError::InputClosed)?;
        stdin
            .write_all(line.as_bytes())
            .and_then(|()| stdin.flush())
            .map_err(DriverError::Write)
    }

    /// Closes Claude's input: a `-p` run ends when its input ends and its turn is done.
    pub fn close_input(&mut self) {
        self.stdin = None;
    }

    /// The next line, the exit, or [`DriverEvent::TimedOut`] at `deadline`.
    pub fn next_event(&mut self, deadline: Instant) -> DriverEvent {
        if let Some((code, stderr)) = &self.exited {
            return DriverEvent::Exited {
                code: *code,
                stderr: stderr.clone(),
            };
        }
        let wait = deadline.saturating_duration_since(Instant::now());
        match self.lines.recv_timeout(wait) {
            Ok(Piped::Line(l)) => DriverEvent::Line(l),
            Ok(Piped::Eof) | Err(RecvTimeoutError::Disconnected) => self.reap(deadline),
            Err(RecvTimeoutError::Timeout) => DriverEvent::TimedOut,
        }
    }

    /// Stdout is closed: waits for the exit until `deadline` (then kills the child).
    fn reap(&mut self, deadline: Instant) -> DriverEvent {
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Ok(None) | Err(_) => {
                    // Output closed but the process lingers past the deadline.
                    if self.child.kill().is_err() {
                        break None;
                    }
                    break self.child.wait().ok();
                }
            }
        };
        let stderr = self
            .stderr
            .lock()
            .map(|t| String::from_utf8_lossy(&t).into_owned())
            .unwrap_or_default();
        let code = status.and_then(|s| s.code());
        self.exited = Some((code, stderr.clone()));
        DriverEvent::Exited { code, stderr }
    }

    /// True while the child's output is open (it closes when the child ends).
    pub fn output_open(&self) -> bool {
        self.exited.is_none() && !self.closed.load(Ordering::Acquire)
    }

    /// True while the child runs.
    pub fn is_alive(&mut self) -> bool {
        self.exited.is_none() && matches!(self.child.try_wait(), Ok(None))
    }

    /// Kills the child and reaps it (an error: it had exited already).
    pub fn kill(&mut self) -> std::io::Result<()> {
        self.stdin = None;
        end(&mut self.child)
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if self.is_alive() {
            // Nobody is left to tell: a kill that fails found the child gone already.
            self.kill().ok();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8], max: usize, buffer: usize) -> Vec<Vec<u8>> {
        let mut reader = BufReader::with_capacity(buffer, input);
        let mut out = Vec::new();
        let mut line = Vec::new();
        while read_line_bounded(&mut reader, max, &mut line).unwrap() {
            out.push(line.clone());
        }
        out
    }

    // RT-01: a line at the limit is kept whole, one past it is cut there, and the rest
    // of a long line streams past (read a few bytes at a time) without the next line
    // losing a byte.
    #[test]
    fn a_line_past_the_limit_is_cut_and_the_next_line_is_whole() {
        let input = b"12345678\n123456789\nabcdefghijklmnopqrstuvwxyz\nlast";
        for buffer in [1, 2, 3, 64] {
            assert_eq!(
                lines(input, 8, buffer),
                [
                    b"12345678".to_vec(),
                    b"12345678".to_vec(),
                    b"abcdefgh".to_vec(),
                    b"last".to_vec()
                ],
                "buffer {buffer}"
            );
        }
        assert_eq!(lines(b"", 8, 4), Vec::<Vec<u8>>::new());
        assert_eq!(lines(b"\n\n", 8, 4), [Vec::<u8>::new(), Vec::new()]);
    }
}
