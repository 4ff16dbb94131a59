//! What the world observed, as the checks read it: the users' messages from submit to
//! their end ([`Message`]), and [`Observation`], one moment of the world seen from
//! outside: the saved stores, the clients' screens, the agent, the host's deadline.
//!
//! The world builds an observation and hands it to the pure checks of `check`; the
//! checks never reach into the world, so they can be read on their own.

use std::collections::{BTreeMap, BTreeSet};

use outbox_core::entry::{Controls, EntryState, MessageRequest};
use outbox_core::ids::QueueId;
use outbox_core::ledger::LedgerRecord;
use overlay_core::StoredOverlay;
use timeline_core::{Block, BlockKey, Millis, OperationId, Origin, SessionId};

use crate::agent::{Agent, TranscriptHandle};
use crate::client::Client;
use crate::stores::{SavedOverlays, SimHost};
use overlay_core::live::LiveProtocol;

/// One session of the world.
#[derive(Clone, Debug)]
pub struct Session {
    /// Its ID.
    pub id: SessionId,
    /// Codex or Claude.
    pub codex: bool,
    /// Its transcript.
    pub transcript: TranscriptHandle,
    /// What its relay speaks.
    pub relay: LiveProtocol,
}

/// A message of the world, from submit to its end.
#[derive(Clone, Debug)]
pub(crate) struct Message {
    pub session: SessionId,
    pub queue: QueueId,
    pub request: MessageRequest,
    pub controls: Controls,
    /// The host acknowledged it (a receipt or an edit's answer went out).
    pub acked: bool,
    /// The user removed it (and the host said so).
    pub removed: bool,
    /// An edit replaced it with another operation (and the host said so).
    pub replaced: bool,
    /// The host refused it as a control its agent does not support (replace latest on
    /// Claude).
    pub refused: bool,
}

/// One moment of the world, as the checks see it.
pub(crate) struct Observation<'a> {
    /// The time.
    pub now: Millis,
    /// The host's next deadline (none while it is down).
    pub host_timeout: Option<Millis>,
    /// The host, for the diagnostics of a failing check.
    pub host: Option<&'a SimHost>,
    /// Every message the users sent.
    pub messages: &'a BTreeMap<OperationId, Message>,
    /// The clients.
    pub clients: &'a [Client],
    /// Each client's rows as the checks see them (a planted defect may spoil them).
    pub visible: Vec<Vec<(Origin, Block)>>,
    /// The agent.
    pub agent: &'a Agent,
    /// The saved outbox of every session: operation → state.
    pub outboxes: BTreeMap<OperationId, EntryState>,
    /// The saved outbox of every session, one line each (for the diagnostics).
    pub outbox_lines: Vec<(SessionId, String)>,
    /// The saved ledger row of every message's operation, keyed (base session,
    /// operation).
    pub ledger: BTreeMap<(SessionId, OperationId), LedgerRecord>,
    /// Every overlay the host saved ([`SavedOverlays`]).
    pub saved_overlays: &'a SavedOverlays,
    /// The saved overlay of each session's main target, at rest only.
    pub overlays: BTreeMap<SessionId, StoredOverlay>,
    /// The sessions, with their saved history (their transcripts).
    pub sessions: &'a [Session],
    /// Rows that left the agent's history, by session.
    pub gone_rows: &'a BTreeMap<SessionId, BTreeSet<BlockKey>>,
    /// Sessions whose rewrite after a rollback was lost.
    pub rewrites_lost: &'a BTreeSet<SessionId>,
    /// Operations a history read found missing.
    pub missing_read: &'a BTreeSet<OperationId>,
    /// Operations the agent said it did not take.
    pub said_untaken: &'a BTreeSet<OperationId>,
}

impl Observation<'_> {
    /// The saved row with `key` in `session`'s history.
    pub(crate) fn saved_row(&self, session: &SessionId, key: &BlockKey) -> Option<Block> {
        let s = self.sessions.iter().find(|s| &s.id == session)?;
        s.transcript.blocks().into_iter().find(|b| &b.key() == key)
    }

    /// The saved history of `session`.
    pub(crate) fn history(&self, session: &SessionId) -> Vec<Block> {
        self.sessions
            .iter()
            .find(|s| &s.id == session)
            .map(|s| s.transcript.blocks())
            .unwrap_or_default()
    }
}
