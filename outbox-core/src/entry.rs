//! The outbox entry model (OB-04, OB-05) and the texts the seed fixes.
//!
//! # One state per entry
//!
//! The seed persists an entry as a status, `queued` or `sending`, and flags: `autoDrain`,
//! `error`, `holdReason`, `acceptance` (the run, thread and turn of an accepted steer) and
//! `handoff` (the stage of stop and send now). Most combinations of these never occur.
//! Here they are one value, [`EntryState`], whose variants hold only what can be true
//! together, and custody changes it only through the named transitions below, never by
//! setting a flag. `sessionMessage` (the origin of a message from another session) is not
//! part of the state: it stays with the message whatever happens to it. Sent, canceled
//! and blocked are results of commands, not states. A saved entry that cannot be decoded
//! is a [`StoredEntry::Blocked`], shown and never dropped.
//!
//! | state | status | autoDrain | error, holdReason | acceptance | handoff |
//! |---|---|---|---|---|---|
//! | [`Ready`](EntryState::Ready): the drain sends it | queued | on | its [`EntryNotice`] | none | its mark |
//! | [`Held`](EntryState::Held): it waits for the user | queued | off | its notice | none | its mark |
//! | [`Sending`](EntryState::Sending): an attempt is out or its history read pending | sending | on | its notice | none | its mark |
//! | [`Accepted`](EntryState::Accepted): a turn accepted it | sending | on | none | the turn | its mark |
//! | [`HandingOff`](EntryState::HandingOff): stop and send now requested | sending | off | none | the turn | `requested`, the same turn |
//!
//! The persisted format is the seed's, unchanged: [`EntryState::wire`] gives the six
//! fields of the table, and a saved combination outside it (an acceptance on a queued
//! entry, an error on an accepted one, a sending entry with auto-drain off that is not
//! the requested `handoff` of its own turn) is an [`InvalidEntryState`], so the entry
//! reads back blocked.
//!
//! # Transitions
//!
//! Each transition returns the next state. One that does not apply to the current state
//! returns `None`, and custody leaves the entry as it is; [`EntryState::hold`] applies to
//! every state.
//!
//! | transition | from | to | rule |
//! |---|---|---|---|
//! | [`queued`](EntryState::queued) | (new) | `Ready` | submit (OB-03) |
//! | [`waiting_for_approval`](EntryState::waiting_for_approval) | (new) | `Held` with a hold reason | a session message held at save (OB-16) |
//! | [`hold_for_approval`](EntryState::hold_for_approval) | `Ready`, `Held` | `Held` with the reason, an error kept | the hold check before a drain (OB-16) |
//! | [`mark_sending`](EntryState::mark_sending) | `Ready`, `Held` | `Sending`, notice cleared | the hand-off to the agent (OB-09) |
//! | [`mark_confirming`](EntryState::mark_confirming) | `Ready`, `Held` | `Sending`, notice kept | a turn accepted an earlier attempt: history first (OB-08) |
//! | [`accept`](EntryState::accept) | `Sending`, `Accepted` | `Accepted` | an accepted steer or turn (OB-08) |
//! | [`defer`](EntryState::defer) | `Sending` | `Ready` with the reason, `Held` for a dedicated replay | deferred (OB-08) |
//! | [`hold`](EntryState::hold) | any | `Held` with the error, hold reason kept, acceptance dropped (and a `HandingOff`'s unconfirmed `handoff`) | proven unadmitted, unconfirmed, model changed, failed sending write, stopped before delivery (OB-08, OB-09, OB-11, OB-15) |
//! | [`cancel`](EntryState::cancel) | any | `Held` with no error and [`CANCELED_TEXT`] as hold reason, acceptance dropped (as `hold`) | canceled (OB-08) |
//! | [`pause_for_reopen`](EntryState::pause_for_reopen) | `Ready`, `Held` | `Held`, nothing else changed | an unconfirmed entry sent again reads history first (OB-08, OB-12) |
//! | [`await_reopen_check`](EntryState::await_reopen_check) | `Ready`, `Held` | `Held` with [`REOPEN_CHECK_TEXT`] as hold reason, an error kept | the reopen check of a canceled send reads history (OB-12) |
//! | [`release`](EntryState::release) | `Ready`, `Held` | `Ready`, notice cleared | send now (OB-11), reopened (OB-12) |
//! | [`resubmit`](EntryState::resubmit) | `Ready`, `Held` | `Ready`, notice cleared, unless an error is shown | queue, then send now (OB-04) |
//! | [`request_handoff`](EntryState::request_handoff) | `Accepted` without a mark | `HandingOff` | stop and send now requested (OB-13) |
//! | [`take_back`](EntryState::take_back) | `HandingOff` | `Held`, marked `requested` | the agent detached it (OB-13) |
//! | [`keep_accepted`](EntryState::keep_accepted) | `HandingOff` | `Accepted`, no mark | the agent did not detach it (OB-13) |
//! | [`dedicate`](EntryState::dedicate) | `Ready`, `Held` with a mark | `Ready`, marked `dedicated` | run R settled (OB-13) |
//!
//! ```
//! use outbox_core::entry::{EntryState, EntryStatus};
//!
//! // The drain hands a new entry to the agent, which defers it.
//! let sending = EntryState::queued().mark_sending().expect("a queued entry can go out");
//! assert_eq!(sending.status(), EntryStatus::Sending);
//! let back = sending.defer("the run still settles".into()).expect("an attempt is out");
//! assert!(back.is_ready());
//! assert_eq!(back.hold_reason(), Some("the run still settles"));
//! // A transition that does not apply gives nothing; the entry stays as it is.
//! assert_eq!(back.take_back(), None);
//! ```
//!
//! # Choices where the seed is silent
//!
//! These follow what custody has always written, so every saved entry reads back as it
//! was written:
//!
//! - The notice (error and hold reason) stays with an entry until it is released or a
//!   send attempt starts. A dedicated replay that was held with an error (its run
//!   stopped before the take-back was answered) shows it while it drains; an entry that
//!   goes sending only to be confirmed from history keeps showing why it waited.
//! - A `handoff` mark stays with the entry after its stage. A `requested` mark on a queued
//!   entry means "dedicate it once run R is gone", whatever else happened to it since; a
//!   `dedicated` mark makes a deferred send come back with auto-drain off and refuses a
//!   second stop and send now.
//! - [`EntryState`] is not `#[non_exhaustive]`: its variants are exactly the persisted
//!   format's valid combinations, and a new one would be a format change.

use serde::{Deserialize, Serialize};
use timeline_core::time::Millis;

use crate::ids::{CallId, OperationId, QueueId, RunId, SessionId, ThreadId, TurnId};

/// The hold text after an uncertain send whose history read did not find the message
/// (OB-08, OB-10).
pub const UNCONFIRMED_TEXT: &str = "The desktop could not confirm whether this message reached the agent. Check the timeline before sending it again.";
/// The text of an accepted steer that its run did not take before it ended, whether a
/// stop ended it or not (OB-11, OB-15).
pub const STOPPED_BEFORE_DELIVERY_TEXT: &str =
    "The active run stopped before this message reached the agent. Review and send it again.";
/// The hold reason of a send the agent answered canceled (OB-08): the seed's meaning of
/// the canceled status. It is a hold reason, not an error: the seed returns a canceled
/// send "with autoDrain off and no error".
pub const CANCELED_TEXT: &str = "The run was stopped before the message was confirmed.";
/// The hold reason while the reopen check reads the agent's history before a canceled
/// message that a turn accepted goes out again (OB-12). The seed has no text for this
/// wait; the entry shows it so that a check cut short (the host stopped) never leaves it
/// waiting without a reason, and custody resumes the check when it reads the outbox
/// again.
pub const REOPEN_CHECK_TEXT: &str =
    "Checking the agent's history before this message is sent again.";
/// The answer to the user's send of an unconfirmed steer while the run it was sent to
/// still works (OB-08). The seed has no text for this; the run may still take the steer
/// from its pending input, which no history shows.
pub const RUN_MAY_STILL_TAKE_IT_TEXT: &str = "The active run may still take this message. Send it again once the run has ended, or stop the run first.";
/// A second start in a session with an active run (OB-14).
pub const RUN_IN_PROGRESS_TEXT: &str =
    "Chat send already in progress for this session. Please wait or stop current run.";
/// A start while a cancellation is pending (OB-14).
pub const CANCELLATION_PENDING_TEXT: &str = "Run cancellation is in progress. Please wait.";

/// Where a submit puts the message (OB-04).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "kebab-case")]
pub enum Intent {
    /// Front of the queue, behind entries that are sending; the drain lane of its mode
    /// starts.
    Automatic,
    /// Back of the queue; an already-queued queue ID keeps its place.
    Enqueue,
    /// Codex only: front, with `rollbackBeforeSend`.
    ReplaceLatest,
}

/// How the message meets an active run (OB-04).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "kebab-case")]
pub enum SendMode {
    /// Wait for the active run to end.
    Queue,
    /// Join the run named by `expectedActiveRunId` (steer lane).
    SteerRunning,
    /// Stop the active run, wait until it settled, then start as its own run.
    InterruptRunning,
}

/// The four ordered access levels, the same scale for both agents (OB-16).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "kebab-case")]
pub enum AccessLevel {
    /// Reads only.
    ReadOnly,
    /// Writes inside the workspace.
    WorkspaceWrite,
    /// Writes anywhere, asks before risky commands.
    FullAccess,
    /// No limits.
    Unrestricted,
}

impl AccessLevel {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            AccessLevel::ReadOnly => "read-only",
            AccessLevel::WorkspaceWrite => "workspace-write",
            AccessLevel::FullAccess => "full-access",
            AccessLevel::Unrestricted => "unrestricted",
        }
    }
}

/// An attachment of a message.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Attachment {
    /// Its path.
    pub path: String,
    /// Its kind (`image`, `file`, ...).
    pub kind: String,
}

/// The fingerprinted content of a message (OB-02).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct MessageRequest {
    /// What the user wrote (for a session message: the body).
    pub user_text: String,
    /// What the agent receives when it differs (for a session message: the envelope).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_text: Option<String>,
    /// Attachments, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<Attachment>,
    /// The thread the message is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<ThreadId>,
    /// Speed mode (Codex only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed_mode: Option<String>,
    /// Access mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_mode: Option<AccessLevel>,
    /// The model the user saw when writing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_model: Option<String>,
    /// The effort the user saw when writing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_effort: Option<String>,
    /// Roll back the latest turn before sending (replace latest).
    #[serde(default, skip_serializing_if = "is_false")]
    pub rollback_before_send: bool,
    /// Where the message came from (`composer`, `phone`, `session-message`, ...).
    pub source: String,
    /// When it was written.
    pub created_at: Millis,
}

impl MessageRequest {
    /// A plain message from `source` with only text.
    pub fn text(user_text: impl Into<String>, source: &str, created_at: Millis) -> Self {
        MessageRequest {
            user_text: user_text.into(),
            prompt_text: None,
            attachments: Vec::new(),
            thread_id: None,
            speed_mode: None,
            access_mode: None,
            expected_model: None,
            expected_effort: None,
            rollback_before_send: false,
            source: source.to_owned(),
            created_at,
        }
    }

    /// The text the agent receives.
    pub fn agent_text(&self) -> &str {
        self.prompt_text.as_deref().unwrap_or(&self.user_text)
    }

    /// True when the two are the same message but for `rollback_before_send`.
    pub(crate) fn same_but_rollback(&self, other: &MessageRequest) -> bool {
        let MessageRequest {
            user_text,
            prompt_text,
            attachments,
            thread_id,
            speed_mode,
            access_mode,
            expected_model,
            expected_effort,
            rollback_before_send: _,
            source,
            created_at,
        } = self;
        *user_text == other.user_text
            && *prompt_text == other.prompt_text
            && *attachments == other.attachments
            && *thread_id == other.thread_id
            && *speed_mode == other.speed_mode
            && *access_mode == other.access_mode
            && *expected_model == other.expected_model
            && *expected_effort == other.expected_effort
            && *source == other.source
            && *created_at == other.created_at
    }
}

/// The submission controls (OB-04).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Controls {
    /// Where the message goes.
    pub intent: Intent,
    /// How it meets an active run.
    pub send_mode: SendMode,
    /// The run a steer joins (steer-running only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_active_run_id: Option<RunId>,
}

impl Controls {
    /// `automatic` + `queue`.
    pub fn automatic() -> Controls {
        Controls {
            intent: Intent::Automatic,
            send_mode: SendMode::Queue,
            expected_active_run_id: None,
        }
    }

    /// `enqueue` + `queue`.
    pub fn enqueue() -> Controls {
        Controls {
            intent: Intent::Enqueue,
            send_mode: SendMode::Queue,
            expected_active_run_id: None,
        }
    }

    /// `automatic` + `steer-running` for `run`.
    pub fn steer(run: RunId) -> Controls {
        Controls {
            intent: Intent::Automatic,
            send_mode: SendMode::SteerRunning,
            expected_active_run_id: Some(run),
        }
    }

    /// `automatic` + `interrupt-running`.
    pub fn interrupt() -> Controls {
        Controls {
            intent: Intent::Automatic,
            send_mode: SendMode::InterruptRunning,
            expected_active_run_id: None,
        }
    }

    /// `replace-latest` + `interrupt-running` (Codex only).
    pub fn replace_latest() -> Controls {
        Controls {
            intent: Intent::ReplaceLatest,
            send_mode: SendMode::InterruptRunning,
            expected_active_run_id: None,
        }
    }
}

/// The run, thread and turn that accepted an operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Acceptance {
    /// The run.
    pub run_id: RunId,
    /// The thread.
    pub thread_id: ThreadId,
    /// The turn.
    pub turn_id: TurnId,
    /// When it happened.
    pub accepted_at: Millis,
}

/// The stage of stop and send now (OB-13).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum HandoffPhase {
    /// The user asked; run, thread and turn recorded; auto-drain off.
    Requested,
    /// Detached and revoked: queued again for its own turn.
    Dedicated,
}

/// Stop and send now in progress for an entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Handoff {
    /// The stage.
    pub phase: HandoffPhase,
    /// The accepting run, thread and turn.
    pub acceptance: Acceptance,
}

impl Handoff {
    /// Stop and send now requested from the turn `acceptance` names.
    pub fn requested(acceptance: Acceptance) -> Handoff {
        Handoff {
            phase: HandoffPhase::Requested,
            acceptance,
        }
    }

    /// Dedicated to its own turn after the turn `acceptance` names settled.
    pub fn dedicated(acceptance: Acceptance) -> Handoff {
        Handoff {
            phase: HandoffPhase::Dedicated,
            acceptance,
        }
    }

    /// The `handoff` as a borrowed view.
    pub fn as_ref(&self) -> HandoffRef<'_> {
        HandoffRef {
            phase: self.phase,
            acceptance: &self.acceptance,
        }
    }
}

/// A `handoff` seen through an [`EntryState`]: its stage and the turn it concerns. It
/// encodes exactly as [`Handoff`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename = "Handoff", rename_all = "camelCase")]
pub struct HandoffRef<'a> {
    /// The stage.
    pub phase: HandoffPhase,
    /// The accepting run, thread and turn.
    pub acceptance: &'a Acceptance,
}

/// The origin of a message from another session (OB-16).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionMessageOrigin {
    /// The sending session.
    pub sender_session_id: SessionId,
    /// Its tool call.
    pub sender_call_id: CallId,
    /// Its run.
    pub sender_run_id: Option<RunId>,
    /// Its agent thread.
    pub sender_thread_id: Option<ThreadId>,
    /// Its access level when it sent.
    pub sender_access: AccessLevel,
    /// Its project.
    pub sender_project: Option<String>,
    /// The exchange.
    pub chain_id: String,
    /// Hop in the exchange (1 for a new exchange).
    pub hop: u32,
    /// The user approved it (sent it from the queue): no hold rule applies any more.
    #[serde(default, skip_serializing_if = "is_false")]
    pub approved: bool,
}

/// The persisted status (OB-05): the first column of the table in the module docs,
/// derived from an [`EntryState`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum EntryStatus {
    /// Waiting in the queue.
    Queued,
    /// A send attempt started.
    Sending,
}

/// What an entry shows the user about why it waits (OB-05, OB-08): an error, a hold
/// reason, both or neither.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EntryNotice {
    /// Why it waits, as an error for the user.
    pub error: Option<String>,
    /// Why it waits, held on purpose (or why the agent deferred it).
    pub hold_reason: Option<String>,
}

impl EntryNotice {
    /// True when the entry shows nothing.
    pub fn is_empty(&self) -> bool {
        self.error.is_none() && self.hold_reason.is_none()
    }
}

/// Where an outbox entry is in its custody (OB-05, OB-08, OB-13); see the module docs for
/// the table of states, their persisted fields and the transitions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryState {
    /// Queued with auto-drain on: the drain sends it by itself. A hold reason here is why
    /// the agent deferred the last attempt.
    Ready {
        /// What it shows.
        notice: EntryNotice,
        /// The stop-and-send-now mark it carries.
        handoff: Option<Handoff>,
    },
    /// Queued with auto-drain off: it waits for the user (held on purpose, failed,
    /// canceled, unconfirmed), for a reopen check, or, marked `requested`, for the run it
    /// was taken back from to settle.
    Held {
        /// What it shows.
        notice: EntryNotice,
        /// The stop-and-send-now mark it carries.
        handoff: Option<Handoff>,
    },
    /// A send attempt started and no turn accepted it yet: the send is out, or the
    /// agent's history is read to confirm it.
    Sending {
        /// What it shows (only while it is confirmed from history).
        notice: EntryNotice,
        /// The stop-and-send-now mark it carries.
        handoff: Option<Handoff>,
    },
    /// A running turn accepted it; the delivery proof or the end of the run settles it.
    Accepted {
        /// The run, thread and turn.
        acceptance: Acceptance,
        /// The stop-and-send-now mark it carries.
        handoff: Option<Handoff>,
    },
    /// Stop and send now requested: auto-drain off, the take-back of the steer from the
    /// turn that accepted it is pending (OB-13).
    HandingOff {
        /// The run, thread and turn it is taken back from.
        acceptance: Acceptance,
    },
}

/// The persisted fields of an [`EntryState`], borrowed, as an entry's JSON holds them
/// (OB-05). It encodes exactly like the fields of an entry written before the state
/// existed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StateWire<'a> {
    /// `queued` or `sending`.
    pub status: EntryStatus,
    /// The drain may send it by itself.
    pub auto_drain: bool,
    /// Why it waits, as an error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<&'a str>,
    /// Why it waits, held on purpose.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold_reason: Option<&'a str>,
    /// The accepting run, thread and turn.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acceptance: Option<&'a Acceptance>,
    /// The stop-and-send-now stage.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handoff: Option<HandoffRef<'a>>,
}

/// The persisted fields of an entry's state as a decoder reads them, before they are
/// checked ([`EntryState::try_from`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateFields {
    /// `queued` or `sending`.
    pub status: EntryStatus,
    /// The persisted `autoDrain` flag.
    pub auto_drain: bool,
    /// The persisted `error` text.
    pub error: Option<String>,
    /// The persisted `holdReason`.
    pub hold_reason: Option<String>,
    /// The persisted `acceptance`.
    pub acceptance: Option<Acceptance>,
    /// The persisted `handoff`.
    pub handoff: Option<Handoff>,
}

/// A saved combination of state fields that no [`EntryState`] has (OB-05). The entry
/// reads back blocked with this as its reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidEntryState {
    /// An acceptance on a queued entry.
    #[error("a queued entry holds an acceptance")]
    QueuedWithAcceptance,
    /// An error or hold reason on an entry a turn accepted.
    #[error("an entry a turn accepted shows an error or a hold reason")]
    AcceptedWithNotice,
    /// A sending entry with auto-drain off that is not a requested stop and send now.
    #[error("a sending entry has auto-drain off without a requested stop and send now of its accepted turn")]
    SendingWithoutAutoDrain,
    /// A requested stop and send now for another turn than the one that accepted it.
    #[error(
        "a requested stop and send now names another turn than the one that accepted the entry"
    )]
    HandoffOfAnotherTurn,
}

impl TryFrom<StateFields> for EntryState {
    type Error = InvalidEntryState;

    fn try_from(f: StateFields) -> Result<EntryState, InvalidEntryState> {
        let notice = EntryNotice {
            error: f.error,
            hold_reason: f.hold_reason,
        };
        let handoff = f.handoff;
        match (f.status, f.auto_drain, f.acceptance) {
            (EntryStatus::Queued, _, Some(_)) => Err(InvalidEntryState::QueuedWithAcceptance),
            (EntryStatus::Queued, true, None) => Ok(EntryState::Ready { notice, handoff }),
            (EntryStatus::Queued, false, None) => Ok(EntryState::Held { notice, handoff }),
            (EntryStatus::Sending, true, None) => Ok(EntryState::Sending { notice, handoff }),
            (EntryStatus::Sending, true, Some(acceptance)) => {
                if !notice.is_empty() {
                    return Err(InvalidEntryState::AcceptedWithNotice);
                }
                Ok(EntryState::Accepted {
                    acceptance,
                    handoff,
                })
            }
            (EntryStatus::Sending, false, Some(acceptance)) => match handoff {
                Some(h) if h.phase == HandoffPhase::Requested => {
                    if h.acceptance != acceptance {
                        return Err(InvalidEntryState::HandoffOfAnotherTurn);
                    }
                    if !notice.is_empty() {
                        return Err(InvalidEntryState::AcceptedWithNotice);
                    }
                    Ok(EntryState::HandingOff { acceptance })
                }
                _ => Err(InvalidEntryState::SendingWithoutAutoDrain),
            },
            (EntryStatus::Sending, false, None) => Err(InvalidEntryState::SendingWithoutAutoDrain),
        }
    }
}

impl EntryState {
    // ----- constructors ------------------------------------------------------------------

    /// A new entry as submit saves it: queued, auto-drain on, nothing shown (OB-03).
    pub fn queued() -> EntryState {
        EntryState::Ready {
            notice: EntryNotice::default(),
            handoff: None,
        }
    }

    /// A new session message that a hold rule keeps back: queued, auto-drain off, with
    /// the rule's `reason` (OB-16).
    pub fn waiting_for_approval(reason: String) -> EntryState {
        EntryState::Held {
            notice: EntryNotice {
                error: None,
                hold_reason: Some(reason),
            },
            handoff: None,
        }
    }

    // ----- what it says ------------------------------------------------------------------

    /// The persisted status.
    pub fn status(&self) -> EntryStatus {
        match self {
            EntryState::Ready { .. } | EntryState::Held { .. } => EntryStatus::Queued,
            EntryState::Sending { .. }
            | EntryState::Accepted { .. }
            | EntryState::HandingOff { .. } => EntryStatus::Sending,
        }
    }

    /// True while it waits in the queue (`Ready` or `Held`).
    pub fn is_queued(&self) -> bool {
        self.status() == EntryStatus::Queued
    }

    /// True once a send attempt started (`Sending`, `Accepted`, `HandingOff`).
    pub fn is_sending(&self) -> bool {
        self.status() == EntryStatus::Sending
    }

    /// True when the drain may send it by itself: queued with auto-drain on.
    pub fn is_ready(&self) -> bool {
        matches!(self, EntryState::Ready { .. })
    }

    /// The persisted `autoDrain`.
    pub fn auto_drain(&self) -> bool {
        !matches!(
            self,
            EntryState::Held { .. } | EntryState::HandingOff { .. }
        )
    }

    /// What it shows, for the states that show something.
    pub fn notice(&self) -> Option<&EntryNotice> {
        match self {
            EntryState::Ready { notice, .. }
            | EntryState::Held { notice, .. }
            | EntryState::Sending { notice, .. } => Some(notice),
            EntryState::Accepted { .. } | EntryState::HandingOff { .. } => None,
        }
    }

    /// Why it waits, as an error.
    pub fn error(&self) -> Option<&str> {
        self.notice().and_then(|n| n.error.as_deref())
    }

    /// Why it waits, held on purpose.
    pub fn hold_reason(&self) -> Option<&str> {
        self.notice().and_then(|n| n.hold_reason.as_deref())
    }

    /// The run, thread and turn that accepted it.
    pub fn acceptance(&self) -> Option<&Acceptance> {
        match self {
            EntryState::Accepted { acceptance, .. } | EntryState::HandingOff { acceptance } => {
                Some(acceptance)
            }
            EntryState::Ready { .. } | EntryState::Held { .. } | EntryState::Sending { .. } => None,
        }
    }

    /// Its stop-and-send-now stage.
    pub fn handoff(&self) -> Option<HandoffRef<'_>> {
        match self {
            EntryState::Ready { handoff, .. }
            | EntryState::Held { handoff, .. }
            | EntryState::Sending { handoff, .. }
            | EntryState::Accepted { handoff, .. } => handoff.as_ref().map(Handoff::as_ref),
            EntryState::HandingOff { acceptance } => Some(HandoffRef {
                phase: HandoffPhase::Requested,
                acceptance,
            }),
        }
    }

    /// The persisted fields.
    pub fn wire(&self) -> StateWire<'_> {
        StateWire {
            status: self.status(),
            auto_drain: self.auto_drain(),
            error: self.error(),
            hold_reason: self.hold_reason(),
            acceptance: self.acceptance(),
            handoff: self.handoff(),
        }
    }

    /// The notice and mark of a queued state.
    fn queued_parts(&self) -> Option<(&EntryNotice, &Option<Handoff>)> {
        match self {
            EntryState::Ready { notice, handoff } | EntryState::Held { notice, handoff } => {
                Some((notice, handoff))
            }
            EntryState::Sending { .. }
            | EntryState::Accepted { .. }
            | EntryState::HandingOff { .. } => None,
        }
    }

    // ----- transitions -------------------------------------------------------------------

    /// The hold check before a drain kept a session message back (OB-16): auto-drain off
    /// with `reason`; an error it shows stays. Queued states only.
    pub fn hold_for_approval(&self, reason: String) -> Option<EntryState> {
        let (notice, handoff) = self.queued_parts()?;
        Some(EntryState::Held {
            notice: EntryNotice {
                error: notice.error.clone(),
                hold_reason: Some(reason),
            },
            handoff: handoff.clone(),
        })
    }

    /// The hand-off to the agent (OB-09): a new send attempt, showing nothing and holding
    /// no acceptance yet (one of an earlier attempt would make the queue believe a turn
    /// holds this one). Queued states only.
    pub fn mark_sending(&self) -> Option<EntryState> {
        let (_, handoff) = self.queued_parts()?;
        Some(EntryState::Sending {
            notice: EntryNotice::default(),
            handoff: handoff.clone(),
        })
    }

    /// Sending while the agent's history is read, because a turn accepted an earlier
    /// attempt and nothing settled it (OB-08): nothing is sent, and it keeps showing why
    /// it waited. Queued states only.
    pub fn mark_confirming(&self) -> Option<EntryState> {
        let (notice, handoff) = self.queued_parts()?;
        Some(EntryState::Sending {
            notice: notice.clone(),
            handoff: handoff.clone(),
        })
    }

    /// A running turn accepted the attempt (OB-08): it stays sending with the
    /// acceptance and shows nothing (an attempt that went out showed nothing already).
    /// `Sending` and `Accepted` only.
    pub fn accept(&self, acceptance: Acceptance) -> Option<EntryState> {
        match self {
            EntryState::Sending { handoff, .. } | EntryState::Accepted { handoff, .. } => {
                Some(EntryState::Accepted {
                    acceptance,
                    handoff: handoff.clone(),
                })
            }
            EntryState::Ready { .. } | EntryState::Held { .. } | EntryState::HandingOff { .. } => {
                None
            }
        }
    }

    /// The agent deferred the attempt (OB-08): back in the queue with `reason` as its
    /// hold reason and auto-drain on, except a dedicated replay, which gets auto-drain
    /// off. `Sending` only.
    pub fn defer(&self, reason: String) -> Option<EntryState> {
        let EntryState::Sending { notice, handoff } = self else {
            return None;
        };
        let notice = EntryNotice {
            error: notice.error.clone(),
            hold_reason: Some(reason),
        };
        let handoff = handoff.clone();
        let dedicated = handoff
            .as_ref()
            .is_some_and(|h| h.phase == HandoffPhase::Dedicated);
        Some(if dedicated {
            EntryState::Held { notice, handoff }
        } else {
            EntryState::Ready { notice, handoff }
        })
    }

    /// Back in the queue for the user, showing `error` (OB-08, OB-09, OB-11, OB-15): a
    /// proven unadmitted attempt, an unconfirmed send, a changed model, a failed sending
    /// write, a steer its run did not take. A hold reason and the stop-and-send-now mark
    /// stay; a queued entry holds no acceptance, so what a turn accepted stays only in the
    /// ledger (the reopen check reads it there). A `handoff` still waiting for its
    /// take-back (`HandingOff`) leaves without a mark: a `requested` mark on a queued
    /// entry means the agent confirmed the detach, and only that lets the message go to
    /// a turn of its own by itself (OB-13). Applies to every state.
    pub fn hold(&self, error: Option<String>) -> EntryState {
        let (hold_reason, handoff) = self.kept_when_held();
        EntryState::Held {
            notice: EntryNotice { error, hold_reason },
            handoff,
        }
    }

    /// The agent answered the attempt canceled (OB-08): back in the queue for the user
    /// with auto-drain off and no error, showing [`CANCELED_TEXT`] as its hold reason so
    /// the user sees why it waits. The stop-and-send-now mark stays, as with
    /// [`EntryState::hold`]. Applies to every state.
    pub fn cancel(&self) -> EntryState {
        let (_, handoff) = self.kept_when_held();
        EntryState::Held {
            notice: EntryNotice {
                error: None,
                hold_reason: Some(CANCELED_TEXT.to_owned()),
            },
            handoff,
        }
    }

    /// What an entry held for the user keeps: its hold reason and its mark. A `handoff`
    /// whose take-back the agent never confirmed keeps none (OB-13).
    fn kept_when_held(&self) -> (Option<String>, Option<Handoff>) {
        match self {
            EntryState::Ready { notice, handoff }
            | EntryState::Held { notice, handoff }
            | EntryState::Sending { notice, handoff } => {
                (notice.hold_reason.clone(), handoff.clone())
            }
            EntryState::Accepted { handoff, .. } => (None, handoff.clone()),
            EntryState::HandingOff { .. } => (None, None),
        }
    }

    /// Auto-drain off while the reopen check reads the agent's history (OB-12); nothing
    /// else changes. Queued states only.
    pub fn pause_for_reopen(&self) -> Option<EntryState> {
        let (notice, handoff) = self.queued_parts()?;
        Some(EntryState::Held {
            notice: notice.clone(),
            handoff: handoff.clone(),
        })
    }

    /// The drain found the operation canceled after a turn accepted it, so the reopen
    /// check reads the agent's history before it goes out (OB-12): auto-drain off,
    /// showing [`REOPEN_CHECK_TEXT`] as its hold reason; an error it shows stays. Queued
    /// states only.
    pub fn await_reopen_check(&self) -> Option<EntryState> {
        let (notice, handoff) = self.queued_parts()?;
        Some(EntryState::Held {
            notice: EntryNotice {
                error: notice.error.clone(),
                hold_reason: Some(REOPEN_CHECK_TEXT.to_owned()),
            },
            handoff: handoff.clone(),
        })
    }

    /// The user sends it now (OB-11), or the reopen check found it missing (OB-12):
    /// auto-drain on, nothing shown. Queued states only.
    pub fn release(&self) -> Option<EntryState> {
        let (_, handoff) = self.queued_parts()?;
        Some(EntryState::Ready {
            notice: EntryNotice::default(),
            handoff: handoff.clone(),
        })
    }

    /// The same operation submitted again to be sent (queue, then send now; OB-04):
    /// released like [`EntryState::release`], except that an entry showing an error
    /// stays as it is, since only the user's explicit send releases it. Queued states
    /// only.
    pub fn resubmit(&self) -> Option<EntryState> {
        let (notice, _) = self.queued_parts()?;
        if notice.error.is_some() {
            return Some(self.clone());
        }
        self.release()
    }

    /// Stop and send now requested for an accepted steer (OB-13): auto-drain off, the
    /// turn recorded for the take-back. `Accepted` without a mark only.
    pub fn request_handoff(&self) -> Option<EntryState> {
        match self {
            EntryState::Accepted {
                acceptance,
                handoff: None,
            } => Some(EntryState::HandingOff {
                acceptance: acceptance.clone(),
            }),
            _ => None,
        }
    }

    /// The agent detached the steer (OB-13): queued again, auto-drain off, without its
    /// acceptance, marked `requested` until its run settled. `HandingOff` only.
    pub fn take_back(&self) -> Option<EntryState> {
        let EntryState::HandingOff { acceptance } = self else {
            return None;
        };
        Some(EntryState::Held {
            notice: EntryNotice::default(),
            handoff: Some(Handoff::requested(acceptance.clone())),
        })
    }

    /// The agent did not detach the steer (OB-13): it stays accepted, auto-drain on, the
    /// request forgotten. `HandingOff` only.
    pub fn keep_accepted(&self) -> Option<EntryState> {
        let EntryState::HandingOff { acceptance } = self else {
            return None;
        };
        Some(EntryState::Accepted {
            acceptance: acceptance.clone(),
            handoff: None,
        })
    }

    /// The run it was taken back from settled (OB-13): queued for its own turn with
    /// auto-drain on, marked `dedicated`. Queued states with a mark only.
    pub fn dedicate(&self) -> Option<EntryState> {
        let (notice, handoff) = self.queued_parts()?;
        let handoff = handoff.as_ref()?;
        Some(EntryState::Ready {
            notice: notice.clone(),
            handoff: Some(Handoff::dedicated(handoff.acceptance.clone())),
        })
    }
}

/// One outbox entry (OB-05). It encodes as the seed's entry JSON: the state's fields
/// ([`EntryState::wire`]) in their old places; a saved entry whose state fields are no
/// [`EntryState`] does not decode ([`InvalidEntryState`]).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "EntryWire")]
pub struct OutboxEntry {
    /// The visible entry.
    pub queue_id: QueueId,
    /// The operation.
    pub operation_id: OperationId,
    /// The message.
    pub request: MessageRequest,
    /// The controls it was submitted (or last sent) with.
    pub controls: Controls,
    /// Where it is in its custody.
    pub state: EntryState,
    /// The origin of a session message.
    pub session_message: Option<SessionMessageOrigin>,
    /// Its place: lower goes first.
    pub position: i64,
}

impl OutboxEntry {
    /// An entry from a saved row whose key columns (queue ID, operation ID, position)
    /// are kept apart from the rest of its JSON: the JSON with the columns put back.
    ///
    /// # Errors
    ///
    /// The decoder's text when the JSON is not an object or not an entry.
    pub fn from_row(
        queue_id: &str,
        operation_id: &str,
        position: i64,
        json: &str,
    ) -> Result<OutboxEntry, String> {
        use serde_json::{Map, Value};
        let mut fields: Map<String, Value> =
            serde_json::from_str(json).map_err(|e| e.to_string())?;
        fields.insert("queueId".into(), queue_id.into());
        fields.insert("operationId".into(), operation_id.into());
        fields.insert("position".into(), position.into());
        serde_json::from_value(Value::Object(fields)).map_err(|e| e.to_string())
    }

    /// A new entry as submit saves it: queued, auto-drain on, nothing holding it.
    pub fn queued(
        queue_id: QueueId,
        operation_id: OperationId,
        request: MessageRequest,
        controls: Controls,
        position: i64,
    ) -> OutboxEntry {
        OutboxEntry {
            queue_id,
            operation_id,
            request,
            controls,
            state: EntryState::queued(),
            session_message: None,
            position,
        }
    }

    /// True for an entry queued with auto-drain on.
    pub fn drainable(&self) -> bool {
        self.state.is_ready()
    }

    /// This entry in `state`.
    pub fn with_state(&self, state: EntryState) -> OutboxEntry {
        OutboxEntry {
            state,
            ..self.clone()
        }
    }

    /// True when this entry equals `snapshot` in everything but its place: a
    /// renumbering of the queue moves an entry without changing its custody, so an
    /// answer for the attempt `snapshot` was taken for still applies to it (OB-09).
    ///
    /// A replace latest whose rollback the agent did (OB-11) clears the entry's
    /// `rollback_before_send` without changing its custody either, so the flag is not
    /// compared.
    pub(crate) fn same_but_position(&self, snapshot: &OutboxEntry) -> bool {
        self.queue_id == snapshot.queue_id
            && self.operation_id == snapshot.operation_id
            && self.state == snapshot.state
            && self.request.same_but_rollback(&snapshot.request)
            && self.controls == snapshot.controls
            && self.session_message == snapshot.session_message
    }

    /// This entry once its rollback is done: the message is sent again without one.
    pub(crate) fn rolled_back(&self) -> OutboxEntry {
        let mut e = self.clone();
        e.request.rollback_before_send = false;
        e
    }
}

/// An entry as its JSON holds it, borrowed (the field order of the seed's format).
#[derive(Serialize)]
#[serde(rename = "OutboxEntry", rename_all = "camelCase")]
struct EntryWireRef<'a> {
    queue_id: &'a QueueId,
    operation_id: &'a OperationId,
    request: &'a MessageRequest,
    controls: &'a Controls,
    status: EntryStatus,
    auto_drain: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hold_reason: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    acceptance: Option<&'a Acceptance>,
    #[serde(skip_serializing_if = "Option::is_none")]
    handoff: Option<HandoffRef<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    session_message: Option<&'a SessionMessageOrigin>,
    position: i64,
}

impl Serialize for OutboxEntry {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let StateWire {
            status,
            auto_drain,
            error,
            hold_reason,
            acceptance,
            handoff,
        } = self.state.wire();
        EntryWireRef {
            queue_id: &self.queue_id,
            operation_id: &self.operation_id,
            request: &self.request,
            controls: &self.controls,
            status,
            auto_drain,
            error,
            hold_reason,
            acceptance,
            handoff,
            session_message: self.session_message.as_ref(),
            position: self.position,
        }
        .serialize(serializer)
    }
}

/// An entry as its JSON holds it, before its state fields are checked.
#[derive(Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename = "OutboxEntry", rename_all = "camelCase")]
struct EntryWire {
    queue_id: QueueId,
    operation_id: OperationId,
    request: MessageRequest,
    controls: Controls,
    status: EntryStatus,
    auto_drain: bool,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    hold_reason: Option<String>,
    #[serde(default)]
    acceptance: Option<Acceptance>,
    #[serde(default)]
    handoff: Option<Handoff>,
    #[serde(default)]
    session_message: Option<SessionMessageOrigin>,
    position: i64,
}

/// The schema of the entry's JSON (what [`OutboxEntry`] encodes and decodes).
#[cfg(feature = "schema")]
impl schemars::JsonSchema for OutboxEntry {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed("OutboxEntry")
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        <EntryWire as schemars::JsonSchema>::json_schema(generator)
    }
}

impl TryFrom<EntryWire> for OutboxEntry {
    type Error = InvalidEntryState;

    fn try_from(w: EntryWire) -> Result<OutboxEntry, InvalidEntryState> {
        let state = EntryState::try_from(StateFields {
            status: w.status,
            auto_drain: w.auto_drain,
            error: w.error,
            hold_reason: w.hold_reason,
            acceptance: w.acceptance,
            handoff: w.handoff,
        })?;
        Ok(OutboxEntry {
            queue_id: w.queue_id,
            operation_id: w.operation_id,
            request: w.request,
            controls: w.controls,
            state,
            session_message: w.session_message,
            position: w.position,
        })
    }
}

/// A saved entry that could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct BlockedEntry {
    /// The queue ID as stored.
    pub queue_id: String,
    /// The operation ID as stored, if readable.
    pub operation_id: Option<String>,
    /// Its place.
    pub position: i64,
    /// Why it could not be decoded.
    pub reason: String,
}

/// A saved entry as read back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum StoredEntry {
    /// A decoded entry.
    Entry(Box<OutboxEntry>),
    /// An entry shown as blocked: it is kept, never dropped, and never drained.
    Blocked(BlockedEntry),
}

impl StoredEntry {
    /// A saved row read back by a store that keeps an entry's key columns (queue ID,
    /// operation ID, position) apart from the rest of its JSON: the entry
    /// ([`OutboxEntry::from_row`]), or, when the row does not decode or a column was
    /// refused as it was read (`refused`, the reasons), a blocked entry that keeps its
    /// place and its IDs, never dropped.
    pub fn from_row(
        queue_id: String,
        operation_id: String,
        position: i64,
        json: &str,
        refused: Option<String>,
    ) -> StoredEntry {
        let decoded = match refused {
            Some(reason) => Err(reason),
            None => OutboxEntry::from_row(&queue_id, &operation_id, position, json),
        };
        match decoded {
            Ok(e) => StoredEntry::Entry(Box::new(e)),
            Err(reason) => StoredEntry::Blocked(BlockedEntry {
                operation_id: Some(operation_id).filter(|o| !o.is_empty()),
                queue_id,
                position,
                reason,
            }),
        }
    }

    /// The decoded entry, if any.
    pub fn entry(&self) -> Option<&OutboxEntry> {
        match self {
            StoredEntry::Entry(e) => Some(e.as_ref()),
            StoredEntry::Blocked(_) => None,
        }
    }

    /// The position.
    pub fn position(&self) -> i64 {
        match self {
            StoredEntry::Entry(e) => e.position,
            StoredEntry::Blocked(b) => b.position,
        }
    }
}

/// What a submit returns: custody is taken.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Receipt {
    /// The session.
    pub session_id: SessionId,
    /// The entry.
    pub queue_id: QueueId,
    /// The operation.
    pub operation_id: OperationId,
    /// True when this repeats an earlier submit of the same operation.
    pub replayed: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}
