//! What is on its way: every message between the host, the agent and the clients, with
//! the simulated time it arrives. Messages that arrive at the same time keep the order
//! they were sent in. An ordered channel (the agent's stream, a window's stream) never
//! lets a message overtake one sent before it.

use std::collections::BTreeMap;

use host_core::{AgentCall, AgentInput, ClientRequest, Reply, ReplyTo};
use overlay_core::Delivery;
use timeline_core::{Millis, SessionId};

/// One message in flight, or a timer of the world.
#[derive(Clone, Debug)]
pub enum Event {
    /// A client's request reaches the host.
    ToHost {
        /// Who asks.
        to: ReplyTo,
        /// The request.
        request: ClientRequest,
        /// The host incarnation it was sent to; a restart resets the connection.
        incarnation: u64,
    },
    /// The host's answer reaches the client.
    Reply {
        /// The request it answers.
        to: ReplyTo,
        /// The answer.
        reply: Reply,
        /// The host incarnation that answered.
        incarnation: u64,
    },
    /// A call reaches the agent.
    ToAgent {
        /// The call.
        call: AgentCall,
        /// The host incarnation that made it.
        incarnation: u64,
    },
    /// An answer or stream event reaches the host.
    FromAgent(AgentInput),
    /// A relay event reaches a phone.
    Relay {
        /// The phone (client index).
        phone: usize,
        /// The relay's JSON.
        json: serde_json::Value,
    },
    /// A live delivery reaches a desktop window.
    Window {
        /// The desktop (client index).
        desktop: usize,
        /// What the host delivered.
        delivery: Delivery,
    },
    /// A session's history can be read again.
    HistoryBack(SessionId),
    /// The outbox store takes writes again.
    OutboxWritesBack,
    /// The overlay store takes writes again.
    OverlayWritesBack,
}

/// The messages in flight, by arrival time.
#[derive(Debug, Default)]
pub struct Net {
    queue: BTreeMap<(Millis, u64), Event>,
    next: u64,
    /// The last arrival time of each ordered channel.
    channels: BTreeMap<u64, Millis>,
}

/// The agent's stream to the host.
pub const AGENT_STREAM: u64 = 0;
/// The channel of desktop window `i` is `WINDOW_STREAM + i`.
pub const WINDOW_STREAM: u64 = 1_000;

impl Net {
    /// Sends `event` to arrive at `at`.
    pub fn send(&mut self, at: Millis, event: Event) {
        self.next += 1;
        self.queue.insert((at, self.next), event);
    }

    /// Sends `event` on ordered channel `channel`, to arrive at `at` or right after the
    /// last message of the channel, whichever is later; returns when.
    pub fn send_ordered(&mut self, channel: u64, at: Millis, event: Event) -> Millis {
        let last = self.channels.get(&channel).copied().unwrap_or(Millis(0));
        let at = at.max(last);
        self.channels.insert(channel, at);
        self.send(at, event);
        at
    }

    /// When the next message arrives.
    pub fn next_time(&self) -> Option<Millis> {
        self.queue.keys().next().map(|(t, _)| *t)
    }

    /// The next message, if it arrives by `now`.
    pub fn pop_due(&mut self, now: Millis) -> Option<Event> {
        let (&(t, n), _) = self.queue.iter().next()?;
        if t > now {
            return None;
        }
        self.queue.remove(&(t, n))
    }

    /// Messages in flight.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// True when nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// True when a message matching `f` is in flight.
    pub fn any(&self, f: impl Fn(&Event) -> bool) -> bool {
        self.queue.values().any(f)
    }
}
