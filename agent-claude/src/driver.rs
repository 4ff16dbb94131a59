//! The process edge: one `claude -p` child, its input written a line at a time, its
//! output read a line at a time with a deadline, its exit seen. Nothing here reads
//! Claude's lines; [`crate::run`] does.
//!
//! A reader thread per pipe turns stdout into lines (each cut at [`MAX_LINE`], the rest
//! of a longer one skipped as it streams) and keeps the last [`STDERR_TAIL`] bytes of
//! stderr for the error text; a waiter thread owns the child and reaps it, sending its
//! exit; [`Driver::next_event`] waits for a line until a deadline and reports the exit
//! once stdout is closed. Nothing polls: every wait is on a channel.
//!
//! Invariant: the child leads a process group of its own, and a driver that is dropped
//! kills that group (the child and whatever it started) and reaps the child, so no
//! Claude process outlives the adapter that started it.

#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // the module that runs a process

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Instant;

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
    /// The child's process ID, which is also its process group's.
    pid: u32,
    /// The child's exit code (`None`: a signal ended it, or its status could not be
    /// read), sent once by the waiter thread that owns the child.
    exit: Receiver<Option<i32>>,
    /// The exit once received.
    status: Option<Option<i32>>,
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

/// Kills process group `pid` with SIGKILL; a group already gone is no error.
fn kill_group(pid: u32) -> std::io::Result<()> {
    use nix::errno::Errno;
    let pid = i32::try_from(pid).map_err(|_| std::io::Error::other("process ID out of range"))?;
    match nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    ) {
        Ok(()) | Err(Errno::ESRCH) => Ok(()),
        Err(e) => Err(std::io::Error::from(e)),
    }
}

/// Kills `child` (not yet owned by a waiter) and reaps it.
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
            .process_group(0)
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
        let pid = child.id();
        let (exit_tx, exit) = mpsc::channel();
        let waiter = std::thread::Builder::new()
            .name("claude-wait".into())
            .spawn(move || {
                let code = child.wait().ok().and_then(|s| s.code());
                // The driver may be gone: then nobody waits for the exit.
                exit_tx.send(code).ok();
            });
        if let Err(e) = waiter {
            // The child went with the closure; its group is all that is left to end.
            return Err(spawn_error(match kill_group(pid) {
                Ok(()) => e,
                Err(k) => std::io::Error::other(format!("{e}; ending the child: {k}")),
            }));
        }
        Ok(Driver {
            pid,
            exit,
            status: None,
            stdin,
            lines: rx,
            stderr,
            closed,
            exited: None,
        })
    }

    /// The child's process ID (also its process group's).
    pub fn id(&self) -> u32 {
        self.pid
    }

    /// The child's exit once it is known, waiting until `deadline` for it (`None`: as
    /// long as it takes). `None` while it runs.
    fn wait_exit(&mut self, deadline: Option<Instant>) -> Option<Option<i32>> {
        if self.status.is_none() {
            let got = match deadline {
                Some(d) => self
                    .exit
                    .recv_timeout(d.saturating_duration_since(Instant::now()))
                    .map_err(|e| matches!(e, RecvTimeoutError::Disconnected)),
                None => self.exit.recv().map_err(|_| true),
            };
            self.status = match got {
                Ok(code) => Some(code),
                // The waiter is gone without a word: the child was reaped, its status
                // unread.
                Err(true) => Some(None),
                Err(false) => None,
            };
        }
        self.status
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

    /// Stdout is closed: waits for the exit until `deadline` (then kills the child's
    /// group).
    fn reap(&mut self, deadline: Instant) -> DriverEvent {
        let code = match self.wait_exit(Some(deadline)) {
            Some(code) => code,
            // Output closed but the process lingers past the deadline.
            None => match kill_group(self.pid) {
                Ok(()) => self.wait_exit(None).flatten(),
                Err(_) => None,
            },
        };
        let stderr = self
            .stderr
            .lock()
            .map(|t| String::from_utf8_lossy(&t).into_owned())
            .unwrap_or_default();
        self.exited = Some((code, stderr.clone()));
        DriverEvent::Exited { code, stderr }
    }

    /// True while the child's output is open (it closes when the child ends).
    pub fn output_open(&self) -> bool {
        self.exited.is_none() && !self.closed.load(Ordering::Acquire)
    }

    /// True while the child runs.
    pub fn is_alive(&mut self) -> bool {
        self.exited.is_none() && self.wait_exit(Some(Instant::now())).is_none()
    }

    /// Kills the child's process group (the child and whatever it started) and reaps
    /// the child. An error: the group could not be signalled.
    pub fn kill(&mut self) -> std::io::Result<()> {
        self.stdin = None;
        kill_group(self.pid)?;
        self.wait_exit(None);
        Ok(())
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // Also after the child exited: what it started may still run in its group.
        // Nobody is left to tell of a kill that failed.
        self.kill().ok();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Whether process `pid` is gone or only a zombie (its parent has not reaped it).
    fn dead(pid: &str) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            Ok(stat) => stat
                .rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('Z')),
        }
    }

    fn eventually_dead(pid: &str) -> bool {
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if dead(pid) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    // RT-01: a dropped driver kills the child's whole process group, so what Claude
    // started (a tool's shell, say) does not outlive it.
    #[test]
    fn a_dropped_driver_kills_what_the_child_started() {
        let command = ClaudeCommand::new("sh").args(["-c", "sleep 100 & echo $!; wait"]);
        let mut driver = Driver::spawn(&command).unwrap();
        let DriverEvent::Line(pid) = driver.next_event(Instant::now() + Duration::from_secs(5))
        else {
            panic!("the grandchild's pid");
        };
        let pid = String::from_utf8(pid).unwrap();
        assert!(!dead(&pid), "the grandchild runs");
        drop(driver);
        assert!(
            eventually_dead(&pid),
            "the grandchild {pid} outlived the driver"
        );
    }

    // RT-01: a child that closed its output but lingers is killed at the deadline, its
    // exit seen without polling: the event comes at the deadline, not seconds later.
    #[test]
    fn a_child_lingering_after_its_output_closed_is_killed_at_the_deadline() {
        let command = ClaudeCommand::new("sh").args(["-c", "exec >&-; sleep 100"]);
        let mut driver = Driver::spawn(&command).unwrap();
        let started = Instant::now();
        let event = driver.next_event(started + Duration::from_millis(300));
        assert!(
            matches!(event, DriverEvent::Exited { code: None, .. }),
            "killed by a signal: {event:?}"
        );
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(3),
            "{took:?}"
        );
        assert!(!driver.is_alive());
        assert!(driver.kill().is_ok(), "a second kill finds the group gone");
    }

    // RT-01: a child that ends by itself reports its exit code.
    #[test]
    fn an_exit_reports_its_code() {
        let command = ClaudeCommand::new("sh").args(["-c", "exit 3"]);
        let mut driver = Driver::spawn(&command).unwrap();
        let event = driver.next_event(Instant::now() + Duration::from_secs(5));
        assert!(
            matches!(event, DriverEvent::Exited { code: Some(3), .. }),
            "{event:?}"
        );
    }

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
