//! A client of the world: a desktop window or a phone, each a `Timeline` as the apps
//! hold it, and (phones) the conversation rebuilt from replays.

use std::collections::BTreeMap;

use outbox_core::ids::QueueId;
use overlay_core::{LiveProtocol, WindowId};
use timeline_core::replay::ConversationClient;

use crate::recorded::{Log, Recorded};
use timeline_core::{ClientMode, OperationId, SessionId, TargetId, Timeline};

/// Desktop or phone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A desktop window: subscribes to one target, gets the window stream.
    Desktop,
    /// A phone: joins a session through the relay, gets relay events and replays.
    Phone,
}

/// Where a message this client sent stands, as the client knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Echo {
    /// Sent; no receipt yet.
    Awaiting,
    /// The host saved it.
    Saved,
    /// The client learned it was delivered.
    Delivered,
}

/// A message this client sent on its current target.
#[derive(Clone, Debug)]
pub struct Mine {
    /// Its queue entry.
    pub queue: QueueId,
    /// Where it stands.
    pub echo: Echo,
}

/// One client.
#[derive(Debug)]
pub struct Client {
    /// Desktop or phone.
    pub kind: Kind,
    /// The timeline it shows.
    pub timeline: Recorded<Timeline>,
    /// Phones: the conversation rebuilt from replays.
    pub conversation: Recorded<ConversationClient>,
    /// The session it shows.
    pub session: SessionId,
    /// Desktops: its window.
    pub window: WindowId,
    /// Phones: the session its relay connection serves, once joined.
    pub joined: Option<SessionId>,
    /// What it takes on the live path.
    pub protocol: LiveProtocol,
    /// Messages it sent on its current target and still tracks.
    pub mine: BTreeMap<OperationId, Mine>,
    /// Replays received and fully applied.
    pub replays: u64,
    /// The newest overlay version (epoch, revision) the live path brought it for its
    /// current target.
    pub offered: Option<(u64, u64)>,
    /// The newest request whose answer opened a place (an anchored window).
    pub placed: Option<u64>,
    /// Phones: the newest overlay version the relay dropped on its way to it, until an
    /// event at least that new reaches it.
    pub relay_lost: Option<(u64, u64)>,
}

impl Client {
    /// A client of `kind` showing `session`.
    pub fn new(
        kind: Kind,
        index: usize,
        session: SessionId,
        protocol: LiveProtocol,
        log: Option<Log>,
    ) -> Client {
        let mode = match kind {
            Kind::Desktop => ClientMode::Desktop,
            Kind::Phone => ClientMode::Phone,
        };
        Client {
            kind,
            timeline: Recorded::new(Timeline::new(mode), log.clone()),
            conversation: Recorded::new(ConversationClient::new(), log),
            session,
            window: WindowId(index as u64 + 1),
            joined: None,
            protocol,
            mine: BTreeMap::new(),
            replays: 0,
            offered: None,
            placed: None,
            relay_lost: None,
        }
    }

    /// The target it shows.
    pub fn target(&self) -> TargetId {
        TargetId::main(&self.session)
    }

    /// Notes an overlay version the live path brought.
    pub fn offer(&mut self, version: (u64, u64)) {
        self.offered = Some(self.offered.map_or(version, |o| o.max(version)));
    }

    /// A short name for traces: `d0`, `p1`.
    pub fn name(&self, index: usize) -> String {
        match self.kind {
            Kind::Desktop => format!("d{index}"),
            Kind::Phone => format!("p{index}"),
        }
    }
}
