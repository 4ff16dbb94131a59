//! Delivery proofs of a Claude message (OB-08, the seed's Claude column: "The transcript
//! holds a user message with the UUID that claude_operations saved").
//!
//! Live, three lines carry the UUID the host sent: the replayed echo (`user` with
//! `isReplay`), `command_lifecycle` (`command_uuid`) and `result.user_message_uuid`.
//!
//! In history (one rule, `Marks::delivered`, for the whole-file reader and the
//! line-by-line scan), these entries prove a UUID delivered:
//! - a `user` entry with that `uuid`;
//! - a `user` entry that lists it in `mergedSendUuids` (Claude Code 2.1.328 merges the
//!   messages queued behind a turn into one entry under the last one's UUID);
//! - an `attachment` of type `queued_command` with it as `source_uuid` (a message that
//!   joined a running turn: 2.1.328 writes no `user` entry for it);
//! - a `queue-operation` `remove` with reason `absorbed_mid_turn` and it as
//!   `commandUuid` (the same message, from the queue's side).
//!
//! A `queue-operation` `remove` for any other reason (`cleared_on_cancel`: an interrupt
//! with `cancel_queued`, `cancel_async_message`) proves nothing: that message never
//! reached the conversation. An `enqueue` names no UUID.
//!
//! Invariant: only lines that name the UUID count; a `queued` lifecycle is an acceptance
//! (Claude may still drop the message: an interrupt with `cancel_queued`, a
//! `cancel_async_message`), not a delivery; `refused` proves the agent did not take it.

use outbox_core::adapter::HistoryRead;
use serde::Deserialize;
use serde_json::Value;

use crate::marks::{Attachment, Marks};
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

/// True when the transcript line `line` proves the message `uuid` delivered (compared
/// without case): a `user` entry with that `uuid` or listing it in `mergedSendUuids`,
/// a `queued_command` attachment naming it, or its `absorbed_mid_turn` queue removal
/// (see the module doc).
pub fn proves_delivery(line: &[u8], uuid: &MessageUuid) -> bool {
    #[derive(Deserialize)]
    struct Entry {
        #[serde(rename = "type", default)]
        kind: Option<String>,
        #[serde(default)]
        uuid: Option<String>,
        #[serde(default, rename = "mergedSendUuids")]
        merged_send_uuids: Option<Value>,
        #[serde(default)]
        operation: Option<Value>,
        #[serde(default)]
        reason: Option<Value>,
        #[serde(default, rename = "commandUuid")]
        command_uuid: Option<Value>,
        #[serde(default)]
        attachment: Option<Attachment>,
    }
    let Ok(e) = serde_json::from_slice::<Entry>(line) else {
        return false;
    };
    let marks = Marks {
        kind: e.kind.as_deref().unwrap_or_default(),
        uuid: e.uuid.as_deref(),
        merged_send_uuids: e.merged_send_uuids.as_ref(),
        operation: e.operation.as_ref(),
        reason: e.reason.as_ref(),
        command_uuid: e.command_uuid.as_ref(),
        attachment: e.attachment.as_ref(),
    };
    let mut found = false;
    marks.delivered(|u| found |= u.eq_ignore_ascii_case(uuid.as_str()));
    found
}

/// The earlier name of [`proves_delivery`], which answers for every entry that proves a
/// message delivered, not only `user` entries.
pub fn is_user_entry(line: &[u8], uuid: &MessageUuid) -> bool {
    proves_delivery(line, uuid)
}

/// The history read after an uncertain send: [`HistoryRead::Found`] when the transcript
/// proves the UUID delivered (a user entry with it, or a merged or absorbed message, see
/// the module doc), else [`HistoryRead::Missing`]. (A transcript that
/// could not be read is the caller's [`HistoryRead::Unreadable`].)
pub fn history_read(transcript: &Transcript, uuid: &MessageUuid) -> HistoryRead {
    if transcript.has_user_message(uuid.as_str()) {
        HistoryRead::Found
    } else {
        HistoryRead::Missing
    }
}
