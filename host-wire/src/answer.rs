//! What each method returns, typed, and the frames that carry a host [`Reply`].

use host_core::Reply;
use outbox_core::custody::StopAnswer;
use outbox_core::entry::StoredEntry;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use timeline_core::key::{AgentKind, RunId, SessionId};
use timeline_core::rows::ApprovalResult;
use timeline_core::wire::TimelineWindow;

use crate::error::{WireError, INTERNAL_ERROR};
use crate::event::replay_frame;
use crate::frame::{RequestId, Response};

/// The result of `run.chatOutboxRemove`, `run.chatOutboxReorder`, `run.chatOutboxSendNow`,
/// `run.chatOutboxStopAndSendNow` and `run.chatLeave`: done, nothing more to say.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Ack {}

/// How a stop ended for the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub enum CancelStatus {
    /// The run stopped.
    Stopped,
    /// No result within 5 s; the stop goes on and keeps new runs blocked.
    StillSettling,
}

/// The result of `run.cancel` (a failed stop is the error `STOP_FAILED`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CancelResult {
    /// How it ended.
    pub status: CancelStatus,
}

/// The result of `run.chatResolveApproval`: the result the agent took.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ApprovalResolved {
    /// The result.
    pub result: ApprovalResult,
}

/// One session of a `run.chatReconcileSessions` answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReconciledSession {
    /// The app session.
    pub app_session_id: SessionId,
    /// Its latest window, with its overlay (apply both in one step).
    pub window: TimelineWindow,
    /// Its outbox (an entry that cannot be decoded shows as blocked).
    pub outbox: Vec<StoredEntry>,
    /// Its active run.
    pub active_run: Option<RunId>,
}

/// The result of `run.chatReconcileSessions`: one session per session asked, in order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ReconcileResult {
    /// The sessions.
    pub sessions: Vec<ReconciledSession>,
}

/// The result of `run.chatJoin`, sent after the replay's chunks (each a
/// `structured_replay` notification).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct JoinResult {
    /// How many chunks came before this answer.
    pub chunks: u64,
}

/// One active run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActiveRun {
    /// The app session.
    pub app_session_id: SessionId,
    /// The run.
    pub run_id: RunId,
}

/// The result of `run.list`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ListResult {
    /// Every active run, after the stale reclaim.
    pub runs: Vec<ActiveRun>,
}

/// A session of `run.chatListSessions`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListedSession {
    /// The app session.
    pub app_session_id: SessionId,
    /// Its agent: `codex`, `claude` or `acp`.
    pub agent: AgentKind,
    /// Its title (empty when it has none).
    pub title: String,
    /// The directory its agent works in, when the host knows it (wire version 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Its active run, if one runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_run_id: Option<RunId>,
}

/// The result of `run.chatListSessions` (wire version 2): every session the host
/// serves, in session order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ListSessionsResult {
    /// The sessions.
    pub sessions: Vec<ListedSession>,
}

/// The result of `session.page` (wire version 4): a page of the session's event log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionPageResult {
    /// The log the sequence numbers belong to; `null` while the session has no log. A
    /// different ID than the one a client holds is a new log (the host restarted, let
    /// the session go, rewrote its history, or dropped the log past its bound): drop
    /// what it holds of the old one.
    pub log_id: Option<String>,
    /// The records, oldest first: `{type:"event", event}` or `{type:"chunks", event}`
    /// with a chunk row (`chunkrow/text-chunks`, `chunkrow/reasoning-chunks`,
    /// `chunkrow/tool-call-chunks`) that unpacks to the events it holds (PK-01).
    #[schemars(with = "Vec<serde_json::Value>")]
    pub records: Vec<timeline_core::history::SessionHistoryRecord>,
    /// An older page can be asked for (`beforeSeq`: the first record's `seq`).
    pub has_older: bool,
    /// The oldest sequence number the host still holds.
    pub first_seq: u64,
    /// The sequence number of the next event: live `session-event`s from here on
    /// follow this page.
    pub next_seq: u64,
}

/// [`SessionPageResult`] borrowed from the host's page, for writing.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PageRef<'a> {
    log_id: Option<&'a str>,
    records: &'a [timeline_core::history::SessionHistoryRecord],
    has_older: bool,
    first_seq: u64,
    next_seq: u64,
}

/// The result of `run.chatNewSession` (wire version 3): the session made, which the
/// host serves from now on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NewSessionResult {
    /// The new app session.
    pub app_session_id: SessionId,
}

/// The frames that answer request `id` with the host's `reply`, in the order to send
/// them: for a join, the replay's chunks, then the response; for anything else, the
/// response alone.
pub fn reply_frames(id: RequestId, reply: &Reply) -> Vec<String> {
    let mut frames = Vec::new();
    if let Reply::Replay(chunks) = reply {
        frames.extend(chunks.iter().map(replay_frame));
    }
    frames.push(reply_response(id, reply).to_json());
    frames
}

/// The response that answers request `id` with the host's `reply` (a join's chunks go
/// before it: [`reply_frames`]).
pub fn reply_response(id: RequestId, reply: &Reply) -> Response {
    match reply_result(reply) {
        Ok(result) => Response::result(id, result),
        Err(error) => Response::error(Some(id), error),
    }
}

fn reply_result(reply: &Reply) -> Result<serde_json::Value, WireError> {
    match reply {
        Reply::Submitted(r) => to_json(r.as_ref().map_err(WireError::from)?),
        Reply::Edited(r) => to_json(r.as_ref().map_err(WireError::from)?),
        Reply::Done(r) => {
            r.as_ref().map_err(WireError::from)?;
            to_json(&Ack {})
        }
        Reply::Stop(StopAnswer::Stopped) => to_json(&CancelResult {
            status: CancelStatus::Stopped,
        }),
        Reply::Stop(StopAnswer::StillSettling) => to_json(&CancelResult {
            status: CancelStatus::StillSettling,
        }),
        Reply::Stop(StopAnswer::Failed(text)) => Err(WireError::refused("STOP_FAILED", text)),
        Reply::LatestWindow(r) => to_json(r.as_ref().map_err(WireError::from)?),
        Reply::OlderPage(r) => to_json(r.as_ref().map_err(WireError::from)?),
        Reply::Approval(r) => to_json(&ApprovalResolved {
            result: *r.as_ref().map_err(WireError::from)?,
        }),
        Reply::Reconciled(r) => {
            let sessions = r.as_ref().map_err(WireError::from)?;
            Ok(serde_json::json!({ "sessions": to_json(sessions)? }))
        }
        Reply::Replay(chunks) => to_json(&JoinResult {
            chunks: chunks.len() as u64,
        }),
        Reply::Sessions(sessions) => to_json(&ListSessionsResult {
            sessions: sessions
                .iter()
                .map(|s| ListedSession {
                    app_session_id: s.session.clone(),
                    agent: s.agent,
                    title: s.title.clone(),
                    cwd: s.cwd.clone(),
                    active_run_id: s.active_run.clone(),
                })
                .collect(),
        }),
        Reply::SessionOpened(Ok(session)) => to_json(&NewSessionResult {
            app_session_id: session.clone(),
        }),
        Reply::SessionOpened(Err(e)) => {
            Err(WireError::refused("SESSION_NOT_CREATED", e.to_string()))
        }
        Reply::SessionPage(r) => {
            let page = r.as_ref().map_err(WireError::from)?;
            // Written from the page as it is: its records are not copied first.
            to_json(&PageRef {
                log_id: page.log_id.as_deref(),
                records: &page.records,
                has_older: page.has_older,
                first_seq: page.first_seq,
                next_seq: page.next_seq,
            })
        }
        Reply::Runs(runs) => to_json(&ListResult {
            runs: runs
                .iter()
                .map(|(session, run)| ActiveRun {
                    app_session_id: session.clone(),
                    run_id: run.clone(),
                })
                .collect(),
        }),
        // A desktop window's subscription is not a wire method: a reply of it here is
        // the embedder's mistake, said as such.
        Reply::Subscribed(_) => Err(internal("a window subscription has no wire answer")),
        _ => Err(internal("this reply has no wire form in this version")),
    }
}

fn to_json<T: Serialize + ?Sized>(value: &T) -> Result<serde_json::Value, WireError> {
    serde_json::to_value(value)
        .map_err(|e| internal(&format!("the answer could not be written: {e}")))
}

fn internal(message: &str) -> WireError {
    WireError::new(INTERNAL_ERROR, "INTERNAL_ERROR", message)
}
