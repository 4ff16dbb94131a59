//! The process edge: a child process speaking newline-delimited JSON over stdio
//! (`codex app-server`, or any command that stands in for it), driven synchronously.
//!
//! - [`Driver::spawn`] starts the command with piped stdin, stdout and stderr. A thread
//!   reads stdout line by line (each cut at [`MAX_LINE`], the rest of a longer one
//!   skipped as it streams) into a channel; another
//!   keeps the last [`STDERR_TAIL_BYTES`] of stderr, so an exit can say what the
//!   process said last.
//! - [`Driver::write_line`] writes one line; it tells "nothing was written" (the process
//!   had already ended, or the pipe refused the first byte) from "the write broke part
//!   way", which the send-failure table classes differently (OB-09).
//! - [`Driver::read_line`] waits for the next line until a deadline: a line, the
//!   deadline, or the process's end ([`ReadLine::Exited`]).
//!
//! Invariant: once stdout has ended, every later read answers `Exited` at once; the
//! child leads a process group of its own, and a dropped driver kills that group (the
//! child and whatever it started) and reaps the child.

#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // the process edge

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How much of the child's stderr is kept for the exit message.
pub const STDERR_TAIL_BYTES: usize = 8 * 1024;

/// The longest line read (a bigger one is cut there and the rest of it dropped as it
/// streams): a large item fits, a runaway line does not take the memory.
pub const MAX_LINE: usize = 64 * 1024 * 1024;

/// How to start the agent process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverConfig {
    /// The program (`codex`).
    pub program: OsString,
    /// Its arguments (`app-server`).
    pub args: Vec<OsString>,
    /// Environment variables set for it, on top of the inherited ones.
    pub env: Vec<(OsString, OsString)>,
    /// Inherited environment variables it does not get.
    pub env_remove: Vec<OsString>,
    /// Its working directory (the host's when `None`).
    pub cwd: Option<PathBuf>,
    /// How long an answer to a request may take (the seed's 30 s reply deadline).
    pub reply_timeout: Duration,
}

impl DriverConfig {
    /// `codex app-server`, found on `PATH`, with a 30 s reply deadline.
    pub fn codex() -> DriverConfig {
        DriverConfig::command("codex", ["app-server"])
    }

    /// Any command with a 30 s reply deadline.
    pub fn command<I, S>(program: impl Into<OsString>, args: I) -> DriverConfig
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        DriverConfig {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            env: Vec::new(),
            env_remove: Vec::new(),
            cwd: None,
            reply_timeout: Duration::from_secs(30),
        }
    }

    /// The process a [`host_core::ProcessSpec`] describes (the spec the agent of the
    /// same Codex runs with), with a 30 s reply deadline.
    pub fn from_spec(spec: &host_core::ProcessSpec) -> DriverConfig {
        let mut config = DriverConfig::command(spec.program.as_os_str(), spec.args.clone());
        // In the spec's order: a later change of a variable wins.
        for (key, value) in &spec.env {
            config.env.retain(|(k, _)| k != key);
            config.env_remove.retain(|k| k != key);
            match value {
                Some(v) => config.env.push((key.clone(), v.clone())),
                None => config.env_remove.push(key.clone()),
            }
        }
        config.cwd = spec.cwd.clone();
        config
    }

    /// Adds an environment variable.
    pub fn with_env(
        mut self,
        key: impl Into<OsString>,
        value: impl Into<OsString>,
    ) -> DriverConfig {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Sets the reply deadline.
    pub fn with_reply_timeout(mut self, timeout: Duration) -> DriverConfig {
        self.reply_timeout = timeout;
        self
    }
}

/// Why the process could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpawnError {
    /// The OS refused to start it.
    #[error("starting {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// The error.
        source: std::io::Error,
    },
    /// It started without the pipes it needs.
    #[error("{0} started without a piped stdin, stdout or stderr")]
    Pipes(String),
}

/// Why a line was not written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    /// Nothing was written: the process had ended, or the pipe refused the first byte.
    #[error("nothing was written: {0}")]
    NotWritten(String),
    /// The write broke after it started (some bytes may have reached the process).
    #[error("the write broke part way: {0}")]
    Broken(String),
}

/// What a read found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadLine {
    /// A line, without its newline.
    Line(Vec<u8>),
    /// The deadline passed first.
    Timeout,
    /// The process ended (its stdout closed).
    Exited {
        /// The exit status and the end of what it wrote to stderr.
        reason: String,
    },
}

enum FromStdout {
    Line(Vec<u8>),
    Closed(Option<String>),
}

/// A running agent process. See the module doc.
#[derive(Debug)]
pub struct Driver {
    program: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<FromStdout>,
    stderr: Arc<Mutex<Vec<u8>>>,
    exited: Option<String>,
}

impl std::fmt::Debug for FromStdout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FromStdout::Line(l) => write!(f, "Line({} bytes)", l.len()),
            FromStdout::Closed(e) => write!(f, "Closed({e:?})"),
        }
    }
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

fn keep_tail(buf: &Mutex<Vec<u8>>, bytes: &[u8]) {
    if let Ok(mut b) = buf.lock() {
        b.extend_from_slice(bytes);
        let excess = b.len().saturating_sub(STDERR_TAIL_BYTES);
        b.drain(..excess);
    }
}

impl Driver {
    /// Starts the process.
    pub fn spawn(config: &DriverConfig) -> Result<Driver, SpawnError> {
        let program = config.program.to_string_lossy().into_owned();
        let mut cmd = Command::new(&config.program);
        cmd.args(&config.args)
            // Its own process group, so a kill reaches whatever it started too.
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for k in &config.env_remove {
            cmd.env_remove(k);
        }
        for (k, v) in &config.env {
            cmd.env(k, v);
        }
        if let Some(dir) = &config.cwd {
            cmd.current_dir(dir);
        }
        let mut child = cmd.spawn().map_err(|source| SpawnError::Spawn {
            program: program.clone(),
            source,
        })?;
        let (Some(stdin), Some(stdout), Some(mut stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(SpawnError::Pipes(program));
        };
        // Unbounded on purpose: this driver's writes to the child block, so a bounded
        // queue would let a child whose output filled (it then stops reading its input)
        // and a write waiting on that input hang each other for good. Each line is cut
        // at MAX_LINE; the runtime (host-runtime) bounds its queues, its writes never
        // waiting on the reader.
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = Vec::new();
            loop {
                match read_line_bounded(&mut reader, MAX_LINE, &mut line) {
                    Ok(false) => {
                        // The receiver may be gone (the driver was dropped): nothing
                        // is left to tell.
                        tx.send(FromStdout::Closed(None)).ok();
                        return;
                    }
                    Ok(true) => {
                        if tx
                            .send(FromStdout::Line(std::mem::take(&mut line)))
                            .is_err()
                        {
                            return;
                        }
                    }
                    Err(e) => {
                        tx.send(FromStdout::Closed(Some(e.to_string()))).ok();
                        return;
                    }
                }
            }
        });
        let tail = Arc::new(Mutex::new(Vec::new()));
        let keep = Arc::clone(&tail);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf) {
                if n == 0 {
                    return;
                }
                keep_tail(&keep, buf.get(..n).unwrap_or_default());
            }
        });
        Ok(Driver {
            program,
            child,
            stdin: Some(stdin),
            lines: rx,
            stderr: tail,
            exited: None,
        })
    }

    /// True until the process is known to have ended.
    pub fn is_running(&mut self) -> bool {
        self.exited.is_none() && matches!(self.child.try_wait(), Ok(None))
    }

    /// Writes one line (`line` ends with its newline).
    pub fn write_line(&mut self, line: &[u8]) -> Result<(), WriteError> {
        if let Some(reason) = &self.exited {
            return Err(WriteError::NotWritten(reason.clone()));
        }
        if let Ok(Some(status)) = self.child.try_wait() {
            return Err(WriteError::NotWritten(format!(
                "{} ended: {status}",
                self.program
            )));
        }
        let Some(stdin) = self.stdin.as_mut() else {
            return Err(WriteError::NotWritten("stdin is closed".to_owned()));
        };
        let first = match stdin.write(line) {
            Ok(0) => return Err(WriteError::NotWritten("the pipe took no byte".to_owned())),
            Ok(n) => n,
            Err(e) => return Err(WriteError::NotWritten(e.to_string())),
        };
        let rest = line.get(first..).unwrap_or_default();
        stdin
            .write_all(rest)
            .and_then(|()| stdin.flush())
            .map_err(|e| WriteError::Broken(e.to_string()))
    }

    /// The next line, waiting until `deadline`.
    pub fn read_line(&mut self, deadline: Instant) -> ReadLine {
        if let Some(reason) = &self.exited {
            return ReadLine::Exited {
                reason: reason.clone(),
            };
        }
        let wait = deadline.saturating_duration_since(Instant::now());
        match self.lines.recv_timeout(wait) {
            Ok(FromStdout::Line(l)) => ReadLine::Line(l),
            Err(RecvTimeoutError::Timeout) => ReadLine::Timeout,
            Ok(FromStdout::Closed(error)) => self.ended(error),
            Err(RecvTimeoutError::Disconnected) => self.ended(None),
        }
    }

    fn ended(&mut self, error: Option<String>) -> ReadLine {
        self.stdin = None;
        // stdout is closed: the process is ending; wait for its status.
        let status = match self.child.wait() {
            Ok(s) => s.to_string(),
            Err(e) => format!("status unknown ({e})"),
        };
        let stderr = self
            .stderr
            .lock()
            .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
            .unwrap_or_default();
        let mut reason = format!("{} ended ({status})", self.program);
        if let Some(e) = error {
            reason.push_str(&format!("; reading its output failed: {e}"));
        }
        if !stderr.is_empty() {
            reason.push_str(&format!("; it said: {stderr}"));
        }
        self.exited = Some(reason.clone());
        ReadLine::Exited { reason }
    }

    /// Stops the process and whatever it started (a kill of its process group), then
    /// reaps it.
    pub fn kill(&mut self) {
        self.stdin = None;
        kill_group(self.child.id());
        if matches!(self.child.try_wait(), Ok(None)) {
            // Killing a process that ended between the check and the kill fails
            // harmlessly; the wait below reaps it either way.
            self.child.kill().ok();
        }
        if let Ok(status) = self.child.wait() {
            self.exited
                .get_or_insert_with(|| format!("{} was stopped ({status})", self.program));
        }
    }
}

/// Kills process group `pid` with SIGKILL. A group already gone is the expected miss;
/// any other failure leaves the child to the kill of the child alone that follows.
fn kill_group(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        // ESRCH: the group is gone; EPERM cannot happen for our own child's group.
        nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .ok();
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    // RT-01: a dropped driver kills the child's whole process group, so what Codex
    // started (a tool's shell, say) does not outlive it.
    #[test]
    fn a_dropped_driver_kills_what_the_child_started() {
        let config = DriverConfig::command("sh", ["-c", "sleep 100 & echo $!; wait"]);
        let mut driver = Driver::spawn(&config).unwrap();
        let ReadLine::Line(pid) = driver.read_line(Instant::now() + Duration::from_secs(5)) else {
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
