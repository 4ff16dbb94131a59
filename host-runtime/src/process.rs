//! Agent processes: started in a process group of their own, their output cut into
//! bounded lines, their input written line by line with the outcome of each write
//! reported, the group killed on `kill`, on drop and at shutdown.
//!
//! An event sent to the host loop ([`tell`]) fails only when the loop has stopped (its
//! receiver is gone): nobody is left to tell, so it is logged and the task ends.

use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use host_core::{FileError, ProcessId, ProcessSpec, ReadId, WriteFailure, WriteId};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use crate::lines::{LineSplitter, Piece};

/// How long output is still read after the agent's leader exited, before its group is
/// killed and the end reported.
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// The bytes of agent output on their way to the host loop, for every process of a
/// runtime together: a line waits for its bytes before it is sent, and gives them back
/// once the host thread has handled it, so output the host is behind on costs at most
/// the budget (plus one line longer than the budget, which waits for the whole budget
/// and passes alone).
#[derive(Clone, Debug)]
pub(crate) struct Budget {
    permits: Arc<Semaphore>,
    total: usize,
}

impl Budget {
    /// A budget of `bytes` (at least one; at most what a semaphore counts).
    pub(crate) fn new(bytes: usize) -> Budget {
        let total = bytes.clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize));
        Budget {
            permits: Arc::new(Semaphore::new(total)),
            total,
        }
    }

    /// Waits until `bytes` of the budget are free and holds them.
    async fn hold(&self, bytes: usize) -> Held {
        // The total fits a u32 (see `new`); the semaphore is never closed.
        let n = u32::try_from(bytes.clamp(1, self.total)).unwrap_or(u32::MAX);
        Held(Arc::clone(&self.permits).acquire_many_owned(n).await.ok())
    }
}

/// Bytes of the [`Budget`] a line holds until the host thread has handled it (given
/// back when dropped).
#[derive(Debug)]
pub(crate) struct Held(#[allow(dead_code)] Option<OwnedSemaphorePermit>);

/// What the IO side tells the host thread.
#[derive(Debug)]
pub(crate) enum IoEvent {
    Line {
        agent: usize,
        process: ProcessId,
        line: Vec<u8>,
        /// Its bytes of the budget, given back when the event is dropped.
        held: Held,
    },
    TooLong {
        agent: usize,
        process: ProcessId,
    },
    Exit {
        agent: usize,
        process: ProcessId,
        reason: String,
    },
    Written {
        agent: usize,
        process: ProcessId,
        write: WriteId,
        result: Result<(), WriteFailure>,
    },
    File {
        agent: usize,
        read: ReadId,
        result: Result<Vec<u8>, FileError>,
    },
}

/// What the host thread asks of one process's input.
#[derive(Debug)]
pub(crate) enum InputCommand {
    Write(WriteId, Vec<u8>),
    Close,
}

/// The host thread's handle on one process.
#[derive(Debug)]
pub(crate) struct ProcessHandle {
    pub(crate) input: mpsc::Sender<InputCommand>,
    /// The process group (the child's pid), when it started.
    pub(crate) group: Option<u32>,
    /// Set once the leader was reaped and its group killed: no signal after that.
    gone: Arc<AtomicBool>,
}

impl ProcessHandle {
    /// Kills the process's group (the agent and everything it started).
    pub(crate) fn kill(&self) {
        if self.gone.load(Ordering::SeqCst) {
            return;
        }
        if let Some(pid) = self.group.and_then(|p| i32::try_from(p).ok()) {
            // ESRCH: already gone; nothing else can fail for a group we started.
            kill_group(pid);
        }
    }
}

impl Drop for ProcessHandle {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `spec` for `agent` as `process` on `io`; its output and end go to `events`.
/// A process that cannot start is reported as ended at once.
pub(crate) fn spawn(
    io: &tokio::runtime::Handle,
    agent: usize,
    process: ProcessId,
    spec: &ProcessSpec,
    max_line: usize,
    budget: Budget,
    events: mpsc::Sender<IoEvent>,
) -> ProcessHandle {
    let (input, mut commands) = mpsc::channel::<InputCommand>(256);
    let mut command = tokio::process::Command::new(&spec.program);
    command
        .args(&spec.args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    for (key, value) in &spec.env {
        match value {
            Some(v) => command.env(key, v),
            None => command.env_remove(key),
        };
    }
    if let Some(dir) = &spec.cwd {
        command.current_dir(dir);
    }
    let program = spec.program.display().to_string();
    // Spawning registers the child with the reactor: do it inside the IO runtime.
    let _guard = io.enter();
    let mut child = match command.spawn() {
        Ok(c) => c,
        Err(e) => {
            let reason = format!("{program} could not be started: {e}");
            io.spawn(async move {
                // Nothing was written to it: every write fails whole.
                tell(
                    &events,
                    IoEvent::Exit {
                        agent,
                        process,
                        reason: reason.clone(),
                    },
                )
                .await;
                while let Some(c) = commands.recv().await {
                    if let InputCommand::Write(write, _) = c {
                        tell(
                            &events,
                            IoEvent::Written {
                                agent,
                                process,
                                write,
                                result: Err(WriteFailure::NotWritten(reason.clone())),
                            },
                        )
                        .await;
                    }
                }
            });
            return ProcessHandle {
                input,
                group: None,
                gone: Arc::new(AtomicBool::new(true)),
            };
        }
    };
    let group = child.id();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let stdin = child.stdin.take();

    // Input: one write at a time, each reported.
    let writer_events = events.clone();
    io.spawn(async move {
        let mut stdin = stdin;
        while let Some(c) = commands.recv().await {
            match c {
                InputCommand::Close => {
                    stdin = None;
                }
                InputCommand::Write(write, mut line) => {
                    line.push(b'\n');
                    let result = match stdin.as_mut() {
                        None => Err(WriteFailure::NotWritten("its input is closed".to_owned())),
                        Some(pipe) => write_line(pipe, &line).await,
                    };
                    if result.is_err() {
                        stdin = None;
                    }
                    if writer_events
                        .send(IoEvent::Written {
                            agent,
                            process,
                            write,
                            result,
                        })
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
    });

    // Errors: read and dropped (bounded), so the agent never blocks on a full pipe.
    if let Some(mut stderr) = stderr {
        io.spawn(async move {
            let mut buf = vec![0u8; 8192];
            while matches!(stderr.read(&mut buf).await, Ok(n) if n > 0) {}
        });
    }

    // Output, then the end. The end is the leader's exit: output still coming is read
    // for a short grace, then the group is killed (a grandchild holding the pipe open
    // does not hide the end), and only then is the end reported.
    let gone = Arc::new(AtomicBool::new(false));
    let reaped = Arc::clone(&gone);
    io.spawn(async move {
        let mut splitter = LineSplitter::new(max_line);
        let mut pieces = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut stdout = stdout;
        let mut reason: Option<String> = None;
        let mut grace = None;
        loop {
            let reading = stdout.is_some();
            let read = async {
                match stdout.as_mut() {
                    Some(out) => out.read(&mut buf).await,
                    None => std::future::pending().await,
                }
            };
            let until = async {
                match grace {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = read => match r {
                    Ok(n) if n > 0 => {
                        splitter.push(&buf[..n], &mut pieces);
                        for piece in pieces.drain(..) {
                            if send_piece(&events, &budget, agent, process, piece).await.is_err() {
                                return;
                            }
                        }
                    }
                    _ => {
                        stdout = None;
                        if let Some(piece) = splitter.finish() {
                            if send_piece(&events, &budget, agent, process, piece).await.is_err() {
                                return;
                            }
                        }
                    }
                },
                status = child.wait(), if reason.is_none() => {
                    reason = Some(match status {
                        Ok(status) => format!("{program} ended: {status}"),
                        Err(e) => format!("{program} ended; its status could not be read: {e}"),
                    });
                    grace = Some(tokio::time::Instant::now() + EXIT_GRACE);
                }
                () = until => break,
            }
            if reason.is_some() && !reading {
                break;
            }
        }
        // What the group left behind goes with it, while the group's ID is still its
        // own; after this the handle sends no signal (the ID may be reused).
        if let Some(pid) = group.and_then(|p| i32::try_from(p).ok()) {
            // ESRCH: the group left nothing behind.
            kill_group(pid);
        }
        reaped.store(true, Ordering::SeqCst);
        tell(
            &events,
            IoEvent::Exit {
                agent,
                process,
                reason: reason.unwrap_or_else(|| format!("{program} ended")),
            },
        )
        .await;
    });
    ProcessHandle { input, group, gone }
}

async fn send_piece(
    events: &mpsc::Sender<IoEvent>,
    budget: &Budget,
    agent: usize,
    process: ProcessId,
    piece: Piece,
) -> Result<(), mpsc::error::SendError<IoEvent>> {
    let event = match piece {
        Piece::Line(line) => IoEvent::Line {
            agent,
            process,
            held: budget.hold(line.len()).await,
            line,
        },
        Piece::TooLong => IoEvent::TooLong { agent, process },
    };
    events.send(event).await
}

/// Writes `line` whole: nothing written is `NotWritten`, a break after the first byte
/// is `Broken`.
async fn write_line(
    pipe: &mut tokio::process::ChildStdin,
    line: &[u8],
) -> Result<(), WriteFailure> {
    let first = match pipe.write(line).await {
        Ok(0) => return Err(WriteFailure::NotWritten("the pipe took no byte".to_owned())),
        Ok(n) => n,
        Err(e) => return Err(WriteFailure::NotWritten(e.to_string())),
    };
    let rest = line.get(first..).unwrap_or_default();
    pipe.write_all(rest)
        .await
        .map_err(|e| WriteFailure::Broken(e.to_string()))?;
    pipe.flush()
        .await
        .map_err(|e| WriteFailure::Broken(e.to_string()))
}

/// Reads `path` whole on a blocking thread, at most `limit` bytes.
pub(crate) fn read_file(
    io: &tokio::runtime::Handle,
    agent: usize,
    read: ReadId,
    path: std::path::PathBuf,
    limit: u64,
    events: mpsc::Sender<IoEvent>,
) {
    io.spawn(async move {
        let result = tokio::task::spawn_blocking(move || read_bounded(&path, limit))
            .await
            .unwrap_or_else(|e| Err(FileError::Io(e.to_string())));
        tell(
            &events,
            IoEvent::File {
                agent,
                read,
                result,
            },
        )
        .await;
    });
}

fn read_bounded(path: &std::path::Path, limit: u64) -> Result<Vec<u8>, FileError> {
    use std::io::Read;
    let shown = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => FileError::NotFound(shown.clone()),
        _ => FileError::Io(format!("{shown}: {e}")),
    })?;
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| FileError::Io(format!("{shown}: {e}")))?;
    if bytes.len() as u64 > limit {
        return Err(FileError::TooLarge { path: shown, limit });
    }
    Ok(bytes)
}

/// Sends `event` to the host loop; one that has stopped gets nothing, and that is logged.
async fn tell(events: &mpsc::Sender<IoEvent>, event: IoEvent) {
    if events.send(event).await.is_err() {
        tracing::debug!("the host loop has stopped; an agent IO event was not delivered");
    }
}

/// Kills process group `pid` with SIGKILL. `ESRCH` (the group is already gone) is the
/// expected miss; anything else is logged.
fn kill_group(pid: i32) {
    use nix::errno::Errno;
    match nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    ) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(e) => tracing::warn!(pid, error = %e, "the agent's process group could not be killed"),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    fn line(bytes: usize) -> Piece {
        Piece::Line(vec![b'x'; bytes])
    }

    // RT-01: the agents' output waiting for the host thread is bounded in bytes: a line waits
    // for its bytes, the host handling a line gives them back, and a line longer than
    // the whole budget waits for all of it and passes alone.
    #[test]
    fn lines_wait_for_their_bytes_of_the_budget() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let budget = Budget::new(4 * MIB);
            let (tx, mut rx) = mpsc::channel(1024);
            let p = ProcessId(1);
            for _ in 0..4 {
                send_piece(&tx, &budget, 0, p, line(MIB)).await.unwrap();
            }
            let fifth = send_piece(&tx, &budget, 0, p, line(MIB));
            tokio::pin!(fifth);
            let wait = Duration::from_millis(50);
            assert!(
                tokio::time::timeout(wait, &mut fifth).await.is_err(),
                "a fifth MiB past a 4 MiB budget waits"
            );
            drop(rx.recv().await.expect("a line"));
            tokio::time::timeout(Duration::from_secs(5), &mut fifth)
                .await
                .expect("one MiB given back lets it pass")
                .unwrap();

            let long = send_piece(&tx, &budget, 0, p, line(8 * MIB));
            tokio::pin!(long);
            assert!(
                tokio::time::timeout(wait, &mut long).await.is_err(),
                "a line past the budget waits for the whole budget"
            );
            for _ in 0..4 {
                drop(rx.recv().await.expect("a line"));
            }
            tokio::time::timeout(Duration::from_secs(5), &mut long)
                .await
                .expect("the whole budget free lets it pass")
                .unwrap();
            let Some(IoEvent::Line { line, .. }) = rx.recv().await else {
                panic!("the long line")
            };
            assert_eq!(line.len(), 8 * MIB);
        });
    }
}
