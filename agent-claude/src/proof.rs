//! Delivery proofs of a Claude message (OB-08, the seed's Claude column: "The transcript
//! holds a user message with the UUID that claude_operations saved").
//!
//! Live, three lines carry the UUID the host sent: the replayed echo (`user` with
//! `isReplay`), `command_lifecycle` (`command_uuid`) and `result.user_message_uuid`.
//! In history, a `user` transcript entry with that `uuid` proves it.
//!
//! Invariant: only lines that name the UUID count; a `queued` lifecycle is an acceptance
//! (the interrupt drops queued messages), not a delivery; `refused` proves the agent did
//! not take it.

use outbox_core::adapter::HistoryRead;

use crate::stream::{LifecycleState, MessageUuid, StreamLine};
use crate::transcript::Transcript;

/// Which line carried the UUID.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProofSource {
    /// The replayed echo of the sent message.
    ReplayedEcho,
    /// A `command_lifecycle` line in this state.
    Lifecycle(LifecycleState),
    /// A `result` naming the message in `user_message_uuid`.
    ResultNamed,
}

/// What a proof says about the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// In the conversation: the send is confirmed.
    Delivered,
    /// Waiting in Claude's queue: accepted, not yet delivered.
    Queued,
    /// Claude refused it: not delivered.
    Refused,
    /// Cancelled (`command_lifecycle` `cancelled`): not delivered when it had not
    /// started; a message that started stays delivered.
    Cancelled,
    /// A lifecycle state this crate does not know: no conclusion.
    Unknown,
}

/// A live line that names a sent message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evidence {
    /// The UUID named.
    pub uuid: String,
    /// The line.
    pub source: ProofSource,
}

impl Evidence {
    /// What it proves.
    pub fn verdict(&self) -> Verdict {
        match &self.source {
            ProofSource::ReplayedEcho | ProofSource::ResultNamed => Verdict::Delivered,
            ProofSource::Lifecycle(LifecycleState::Queued) => Verdict::Queued,
            ProofSource::Lifecycle(LifecycleState::Started | LifecycleState::Completed) => {
                Verdict::Delivered
            }
            ProofSource::Lifecycle(LifecycleState::Refused) => Verdict::Refused,
            ProofSource::Lifecycle(LifecycleState::Cancelled) => Verdict::Cancelled,
            ProofSource::Lifecycle(_) => Verdict::Unknown,
        }
    }

    /// True when this evidence is about `uuid` (UUIDs compare without case).
    pub fn is_for(&self, uuid: &MessageUuid) -> bool {
        self.uuid.eq_ignore_ascii_case(uuid.as_str())
    }
}

/// The evidence a line carries, if it names a sent message.
pub fn evidence(line: &StreamLine) -> Option<Evidence> {
    match line {
        StreamLine::User(u) if u.is_replay => Some(Evidence {
            uuid: u.uuid.clone()?,
            source: ProofSource::ReplayedEcho,
        }),
        StreamLine::Lifecycle(l) => Some(Evidence {
            uuid: l.command_uuid.clone(),
            source: ProofSource::Lifecycle(l.state.clone()),
        }),
        StreamLine::Result(r) => Some(Evidence {
            uuid: r.user_message_uuid.clone()?,
            source: ProofSource::ResultNamed,
        }),
        _ => None,
    }
}

/// True when `line` is a transcript `user` entry whose `uuid` is `uuid` (compared
/// without case).
pub fn is_user_entry(line: &[u8], uuid: &MessageUuid) -> bool {
    #[derive(serde::Deserialize)]
    struct Entry {
        #[serde(rename = "type", default)]
        kind: Option<String>,
        #[serde(default)]
        uuid: Option<String>,
    }
    serde_json::from_slice::<Entry>(line).is_ok_and(|e| {
        e.kind.as_deref() == Some("user")
            && e.uuid
                .is_some_and(|u| u.eq_ignore_ascii_case(uuid.as_str()))
    })
}

/// The history read after an uncertain send: [`HistoryRead::Found`] when the transcript
/// holds a user entry with the UUID, else [`HistoryRead::Missing`]. (A transcript that
/// could not be read is the caller's [`HistoryRead::Unreadable`].)
pub fn history_read(transcript: &Transcript, uuid: &MessageUuid) -> HistoryRead {
    if transcript.has_user_message(uuid.as_str()) {
        HistoryRead::Found
    } else {
        HistoryRead::Missing
    }
}
