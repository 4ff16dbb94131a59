//! A blocking driver for one [`host_core::Agent`] and its real processes, for tests that
//! run an agent against the real binaries without a runtime: processes started with
//! `std::process`, their lines read on threads, writes reported, files read, inputs for
//! the host collected in order.

#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // drives processes, reads the clock

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use host_core::{Agent, AgentCall, AgentEffect, AgentInput, FileError, ProcessId, WriteFailure};
use timeline_core::time::Millis;

enum Seen {
    Line(ProcessId, Vec<u8>),
    End(ProcessId),
}

/// The driver. `inputs` holds what the agent gave the host, in order.
pub struct Blocking<A: Agent> {
    /// The agent.
    pub agent: A,
    /// Inputs for the host, in order.
    pub inputs: Vec<AgentInput>,
    /// Every line written, as JSON where it is JSON.
    pub written: Vec<serde_json::Value>,
    /// Time spent inside the agent's methods (its share of the work, without the
    /// process's), since the start.
    pub agent_time: Duration,
    children: BTreeMap<ProcessId, (Child, Option<ChildStdin>)>,
    tx: Sender<Seen>,
    rx: Receiver<Seen>,
    began: Instant,
}

impl<A: Agent> std::fmt::Debug for Blocking<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Blocking")
            .field("inputs", &self.inputs.len())
            .field("children", &self.children.len())
            .finish_non_exhaustive()
    }
}

impl<A: Agent> Blocking<A> {
    /// Drives `agent`.
    pub fn new(agent: A) -> Blocking<A> {
        let (tx, rx) = std::sync::mpsc::channel();
        Blocking {
            agent,
            inputs: Vec::new(),
            written: Vec::new(),
            agent_time: Duration::ZERO,
            children: BTreeMap::new(),
            tx,
            rx,
            began: Instant::now(),
        }
    }

    /// The driver's clock.
    pub fn now(&self) -> Millis {
        Millis(u64::try_from(self.began.elapsed().as_millis()).unwrap_or(u64::MAX))
    }

    /// Hands the agent a call and carries out what follows.
    pub fn call(&mut self, call: AgentCall) {
        let now = self.now();
        let t = Instant::now();
        self.agent.handle_call(call, now);
        self.agent_time += t.elapsed();
        self.effects();
    }

    /// The OS process ID of the agent's process `p`.
    pub fn pid(&self, p: ProcessId) -> Option<u32> {
        self.children.get(&p).map(|(c, _)| c.id())
    }

    /// The agent's processes that run.
    pub fn processes(&self) -> Vec<ProcessId> {
        self.children.keys().copied().collect()
    }

    fn effects(&mut self) {
        while let Some(e) = self.agent.poll_effect() {
            let now = self.now();
            match e {
                AgentEffect::Input(i) => self.inputs.push(i),
                AgentEffect::Spawn { process, spec } => {
                    let mut cmd = Command::new(&spec.program);
                    cmd.args(&spec.args)
                        .stdin(Stdio::piped())
                        .stdout(Stdio::piped())
                        .stderr(Stdio::null());
                    for (k, v) in &spec.env {
                        match v {
                            Some(v) => cmd.env(k, v),
                            None => cmd.env_remove(k),
                        };
                    }
                    if let Some(d) = &spec.cwd {
                        cmd.current_dir(d);
                    }
                    match cmd.spawn() {
                        Ok(mut child) => {
                            let stdin = child.stdin.take();
                            if let Some(stdout) = child.stdout.take() {
                                let tx = self.tx.clone();
                                std::thread::spawn(move || {
                                    for line in BufReader::new(stdout).split(b'\n') {
                                        let Ok(line) = line else { break };
                                        if tx.send(Seen::Line(process, line)).is_err() {
                                            return;
                                        }
                                    }
                                    if tx.send(Seen::End(process)).is_err() {
                                        // The driver is gone, and with it whoever
                                        // would have read this end.
                                    }
                                });
                            }
                            self.children.insert(process, (child, stdin));
                        }
                        Err(e) => self.agent.handle_exit(
                            process,
                            format!("{} could not be started: {e}", spec.program.display()),
                            now,
                        ),
                    }
                }
                AgentEffect::Write {
                    process,
                    write,
                    line,
                } => {
                    self.written.push(
                        serde_json::from_slice(&line)
                            .unwrap_or_else(|_| String::from_utf8_lossy(&line).into()),
                    );
                    let r = match self.children.get_mut(&process).and_then(|c| c.1.as_mut()) {
                        None => Err(WriteFailure::NotWritten("the input is closed".into())),
                        Some(stdin) => {
                            let mut bytes = line;
                            bytes.push(b'\n');
                            stdin
                                .write_all(&bytes)
                                .and_then(|()| stdin.flush())
                                .map_err(|e| WriteFailure::Broken(e.to_string()))
                        }
                    };
                    self.agent.handle_written(process, write, r, now);
                }
                AgentEffect::CloseInput { process } => {
                    if let Some(c) = self.children.get_mut(&process) {
                        c.1 = None;
                    }
                }
                AgentEffect::Kill { process } => {
                    if let Some(c) = self.children.get_mut(&process) {
                        if c.0.kill().is_err() {
                            // `kill` fails only for a child already reaped: it is gone,
                            // and its end comes through its output thread either way.
                        }
                    }
                }
                AgentEffect::ReadFile { read, path, limit } => {
                    let r = match std::fs::read(&path) {
                        Ok(b) if b.len() as u64 > limit => Err(FileError::TooLarge {
                            path: path.display().to_string(),
                            limit,
                        }),
                        Ok(b) => Ok(b),
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                            Err(FileError::NotFound(path.display().to_string()))
                        }
                        Err(e) => Err(FileError::Io(e.to_string())),
                    };
                    self.agent.handle_file(read, r, now);
                }
                _ => {}
            }
        }
    }

    /// Runs until `done` holds for the inputs, at most `limit`.
    ///
    /// # Panics
    ///
    /// When `limit` passes first, with `what` and the inputs.
    pub fn until(
        &mut self,
        what: &str,
        limit: Duration,
        mut done: impl FnMut(&[AgentInput]) -> bool,
    ) {
        let end = Instant::now() + limit;
        loop {
            self.effects();
            if done(&self.inputs) {
                return;
            }
            assert!(
                Instant::now() < end,
                "{what} did not come: {:#?}",
                self.inputs
            );
            let got = self.rx.recv_timeout(Duration::from_millis(20));
            let now = self.now();
            match got {
                Ok(Seen::Line(p, line)) => {
                    let t = Instant::now();
                    self.agent.handle_line(p, &line, now);
                    self.agent_time += t.elapsed();
                }
                Ok(Seen::End(p)) => {
                    let status = self
                        .children
                        .remove(&p)
                        .and_then(|(mut c, _)| c.wait().ok())
                        .map_or_else(|| "ended".to_owned(), |s| format!("ended: {s}"));
                    self.agent.handle_exit(p, status, now);
                }
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {}
            }
            if self.agent.poll_timeout().is_some_and(|d| d <= now) {
                self.agent.handle_timeout(now);
            }
        }
    }
}

impl<A: Agent> Drop for Blocking<A> {
    fn drop(&mut self) {
        for (_, (mut c, _)) in std::mem::take(&mut self.children) {
            // Both fail only for a child already reaped: nothing is left to stop or
            // to wait for.
            if c.kill().is_ok() && c.wait().is_err() {
                // Reaped meanwhile: nothing is left to wait for.
            }
        }
    }
}
