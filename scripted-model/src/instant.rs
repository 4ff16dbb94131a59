//! An in-process agent that answers every run at once, for measuring what surrounds an
//! agent: each new run's message is accepted, proven and its run ended in the same
//! breath. Steers, history reads and the rest get no answer.

use std::collections::VecDeque;

use host_core::{
    Agent, AgentCall, AgentEffect, AgentInput, FileError, ProcessId, ReadId, WriteFailure, WriteId,
};
use outbox_core::adapter::{Capabilities, SendKind, SendResult};
use outbox_core::entry::Acceptance;
use outbox_core::ids::{ThreadId, TurnId};
use overlay_core::live::RunEventKind;
use timeline_core::key::SessionId;
use timeline_core::time::Millis;

/// The agent. See the module doc.
#[derive(Debug, Default)]
pub struct InstantAgent {
    out: VecDeque<AgentEffect>,
}

impl InstantAgent {
    /// An agent that serves every session.
    pub fn new() -> InstantAgent {
        InstantAgent::default()
    }
}

impl Agent for InstantAgent {
    fn capabilities(&self) -> Capabilities {
        Capabilities::codex()
    }
    fn serves(&self, _: &SessionId) -> bool {
        true
    }
    fn handle_call(&mut self, call: AgentCall, now: Millis) {
        let AgentCall::Send(r) = call else { return };
        let SendKind::Start { run } = r.kind.clone() else {
            return;
        };
        let (Ok(thread_id), Ok(turn_id)) = (ThreadId::new("thread-1"), TurnId::new("turn-1"))
        else {
            return;
        };
        let acceptance = Acceptance {
            run_id: run.clone(),
            thread_id,
            turn_id,
            accepted_at: now,
        };
        self.out.extend([
            AgentEffect::Input(AgentInput::SendResult {
                attempt: r.attempt,
                result: SendResult::Accepted(acceptance),
            }),
            AgentEffect::Input(AgentInput::DeliveryProof {
                session: r.session.clone(),
                operation_id: r.operation_id.clone(),
            }),
            AgentEffect::Input(AgentInput::RunEnded {
                session: r.session,
                run,
                outcome: RunEventKind::Completed,
                untaken: Vec::new(),
            }),
        ]);
    }
    fn handle_line(&mut self, _: ProcessId, _: &[u8], _: Millis) {}
    fn handle_line_too_long(&mut self, _: ProcessId, _: Millis) {}
    fn handle_exit(&mut self, _: ProcessId, _: String, _: Millis) {}
    fn handle_written(&mut self, _: ProcessId, _: WriteId, _: Result<(), WriteFailure>, _: Millis) {
    }
    fn handle_file(&mut self, _: ReadId, _: Result<Vec<u8>, FileError>, _: Millis) {}
    fn poll_effect(&mut self) -> Option<AgentEffect> {
        self.out.pop_front()
    }
    fn poll_timeout(&self) -> Option<Millis> {
        None
    }
    fn handle_timeout(&mut self, _: Millis) {}
}
