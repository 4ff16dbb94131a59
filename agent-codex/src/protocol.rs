//! The Codex app-server v2 wire shapes this crate reads and writes: thread items, turns,
//! threads, server notifications, server requests (approvals) and client requests.
//!
//! Reading is lenient by construction: a shape is read field by field from a parsed JSON
//! value, fields this version does not know are ignored, and an item `type` it does not
//! know becomes [`ThreadItem::Unknown`] (counted by the caller), never an error. Only a
//! missing or mistyped field that the crate needs (an item's `id`, a delta's `itemId`)
//! makes a known shape [`ShapeError`].

use serde_json::{json, Map, Value};

/// A known shape without a field this crate needs, or with a field of the wrong type.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{field}` missing or not {expected}")]
pub struct ShapeError {
    /// The field.
    pub field: &'static str,
    /// What it should have been.
    pub expected: &'static str,
}

pub(crate) fn obj(v: &Value) -> Option<&Map<String, Value>> {
    v.as_object()
}

pub(crate) fn opt_str<'a>(v: &'a Value, field: &str) -> Option<&'a str> {
    v.get(field).and_then(Value::as_str)
}

pub(crate) fn req_str<'a>(v: &'a Value, field: &'static str) -> Result<&'a str, ShapeError> {
    opt_str(v, field).ok_or(ShapeError {
        field,
        expected: "a string",
    })
}

pub(crate) fn opt_u64(v: &Value, field: &str) -> Option<u64> {
    v.get(field).and_then(Value::as_u64)
}

/// A JSON-RPC request ID: the server's own requests use their own ID space (numbers
/// from 0 in the recordings), so an ID is matched together with its direction.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RequestId {
    /// A number.
    Number(i64),
    /// A string.
    Text(String),
}

impl RequestId {
    /// Reads an ID (a number or a string).
    pub fn from_value(v: &Value) -> Option<RequestId> {
        match v {
            Value::Number(n) => n.as_i64().map(RequestId::Number),
            Value::String(s) => Some(RequestId::Text(s.clone())),
            _ => None,
        }
    }

    /// The ID as JSON.
    pub fn to_value(&self) -> Value {
        match self {
            RequestId::Number(n) => json!(n),
            RequestId::Text(s) => json!(s),
        }
    }
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestId::Number(n) => write!(f, "{n}"),
            RequestId::Text(s) => f.write_str(s),
        }
    }
}

/// The status of an item (`inProgress`, `completed`, `failed`, `declined`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ItemStatus {
    /// Still running.
    InProgress,
    /// The turn completed.
    Completed,
    /// The turn failed.
    Failed,
    /// Declined by the user.
    Declined,
    /// A status this version does not know.
    Other(String),
}

impl ItemStatus {
    fn read(v: &Value) -> ItemStatus {
        match opt_str(v, "status") {
            Some("inProgress") | None => ItemStatus::InProgress,
            Some("completed") => ItemStatus::Completed,
            Some("failed") => ItemStatus::Failed,
            Some("declined") => ItemStatus::Declined,
            Some(other) => ItemStatus::Other(other.to_owned()),
        }
    }
}

/// One file of a `fileChange` item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileUpdate {
    /// The path.
    pub path: String,
    /// `add`, `delete` or `update`.
    pub kind: String,
    /// The diff (for an added file, its contents).
    pub diff: String,
}

/// A thread item (`ThreadItem`, tag `type`) as far as rows need it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum ThreadItem {
    /// A user message; `client_id` is the `clientUserMessageId` it was sent with.
    UserMessage {
        /// The item ID (UUIDv7 live, `item-N` in rebuilt history: never identity).
        id: String,
        /// The client ID (the operation ID), when the client gave one.
        client_id: Option<String>,
        /// The text inputs, joined by a blank line.
        text: String,
    },
    /// Reply text.
    AgentMessage {
        /// The item ID.
        id: String,
        /// The text (empty at `item/started`).
        text: String,
        /// `commentary` or `final_answer`.
        phase: Option<String>,
    },
    /// The agent's reasoning.
    Reasoning {
        /// The item ID.
        id: String,
        /// Summary parts.
        summary: Vec<String>,
        /// Raw reasoning parts.
        content: Vec<String>,
    },
    /// A shell command.
    CommandExecution {
        /// The item ID.
        id: String,
        /// The command line.
        command: String,
        /// Its status.
        status: ItemStatus,
        /// Output, once known.
        aggregated_output: Option<String>,
        /// Exit code, once ended.
        exit_code: Option<i64>,
    },
    /// A file change.
    FileChange {
        /// The item ID.
        id: String,
        /// The files.
        changes: Vec<FileUpdate>,
        /// Its status.
        status: ItemStatus,
    },
    /// A call of an MCP tool.
    McpToolCall {
        /// The item ID.
        id: String,
        /// The server.
        server: String,
        /// The tool.
        tool: String,
        /// Its status.
        status: ItemStatus,
        /// The arguments as JSON text.
        arguments: String,
    },
    /// A web search.
    WebSearch {
        /// The item ID.
        id: String,
        /// The query.
        query: String,
    },
    /// A plan.
    Plan {
        /// The item ID.
        id: String,
        /// The plan text.
        text: String,
    },
    /// The context was compacted.
    ContextCompaction {
        /// The item ID.
        id: String,
    },
    /// An item type this crate does not project (known or new); the caller counts it.
    Unknown {
        /// Its `type`.
        item_type: String,
        /// Its `id`, if it has one.
        id: Option<String>,
    },
}

fn texts(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|p| p.as_str().or_else(|| opt_str(p, "text")))
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

impl ThreadItem {
    /// Reads an item. An unknown `type` is [`ThreadItem::Unknown`]; a known type
    /// without its `id` (or a value that is not an object) is a [`ShapeError`].
    pub fn from_value(v: &Value) -> Result<ThreadItem, ShapeError> {
        let item_type = req_str(v, "type")?;
        let id = || req_str(v, "id").map(str::to_owned);
        Ok(match item_type {
            "userMessage" => ThreadItem::UserMessage {
                id: id()?,
                client_id: opt_str(v, "clientId").map(str::to_owned),
                text: texts(v.get("content")).join("\n\n"),
            },
            "agentMessage" => ThreadItem::AgentMessage {
                id: id()?,
                text: opt_str(v, "text").unwrap_or_default().to_owned(),
                phase: opt_str(v, "phase").map(str::to_owned),
            },
            "reasoning" => ThreadItem::Reasoning {
                id: id()?,
                summary: texts(v.get("summary")),
                content: texts(v.get("content")),
            },
            "commandExecution" => ThreadItem::CommandExecution {
                id: id()?,
                command: opt_str(v, "command").unwrap_or_default().to_owned(),
                status: ItemStatus::read(v),
                aggregated_output: opt_str(v, "aggregatedOutput").map(str::to_owned),
                exit_code: v.get("exitCode").and_then(Value::as_i64),
            },
            "fileChange" => ThreadItem::FileChange {
                id: id()?,
                changes: v
                    .get("changes")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .map(|c| FileUpdate {
                                path: opt_str(c, "path").unwrap_or_default().to_owned(),
                                kind: c
                                    .get("kind")
                                    .and_then(|k| opt_str(k, "type").or_else(|| k.as_str()))
                                    .unwrap_or("update")
                                    .to_owned(),
                                diff: opt_str(c, "diff").unwrap_or_default().to_owned(),
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                status: ItemStatus::read(v),
            },
            "mcpToolCall" => ThreadItem::McpToolCall {
                id: id()?,
                server: opt_str(v, "server").unwrap_or_default().to_owned(),
                tool: opt_str(v, "tool").unwrap_or_default().to_owned(),
                status: ItemStatus::read(v),
                arguments: v
                    .get("arguments")
                    .filter(|a| !a.is_null())
                    .map(Value::to_string)
                    .unwrap_or_default(),
            },
            "webSearch" => ThreadItem::WebSearch {
                id: id()?,
                query: opt_str(v, "query").unwrap_or_default().to_owned(),
            },
            "plan" => ThreadItem::Plan {
                id: id()?,
                text: opt_str(v, "text").unwrap_or_default().to_owned(),
            },
            "contextCompaction" => ThreadItem::ContextCompaction { id: id()? },
            other => ThreadItem::Unknown {
                item_type: other.to_owned(),
                id: opt_str(v, "id").map(str::to_owned),
            },
        })
    }

    /// The item ID (`None` only for an unknown item without one).
    pub fn id(&self) -> Option<&str> {
        match self {
            ThreadItem::UserMessage { id, .. }
            | ThreadItem::AgentMessage { id, .. }
            | ThreadItem::Reasoning { id, .. }
            | ThreadItem::CommandExecution { id, .. }
            | ThreadItem::FileChange { id, .. }
            | ThreadItem::McpToolCall { id, .. }
            | ThreadItem::WebSearch { id, .. }
            | ThreadItem::Plan { id, .. }
            | ThreadItem::ContextCompaction { id } => Some(id),
            ThreadItem::Unknown { id, .. } => id.as_deref(),
        }
    }
}

/// The status of a turn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TurnStatus {
    /// The item is still running.
    InProgress,
    /// Ended normally.
    Completed,
    /// Interrupted (`turn/interrupt`, or a `cancel` decision).
    Interrupted,
    /// The item failed.
    Failed,
    /// A status this version does not know.
    Other(String),
}

/// A turn. `items` is a summary in `turn/completed` (`itemsView: "summary"`) and the
/// full list in a `thread/read` with turns.
#[derive(Clone, Debug, PartialEq)]
pub struct Turn {
    /// The turn ID.
    pub id: String,
    /// Its status.
    pub status: TurnStatus,
    /// Its items as sent, read with [`ThreadItem::from_value`] when needed.
    pub items: Vec<Value>,
    /// The error text of a failed turn.
    pub error: Option<String>,
    /// Start, in seconds since 1970, once started.
    pub started_at: Option<u64>,
}

impl Turn {
    /// Reads a turn.
    pub fn from_value(v: &Value) -> Result<Turn, ShapeError> {
        Ok(Turn {
            id: req_str(v, "id")?.to_owned(),
            status: match opt_str(v, "status") {
                Some("inProgress") | None => TurnStatus::InProgress,
                Some("completed") => TurnStatus::Completed,
                Some("interrupted") => TurnStatus::Interrupted,
                Some("failed") => TurnStatus::Failed,
                Some(other) => TurnStatus::Other(other.to_owned()),
            },
            items: v
                .get("items")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default(),
            error: v
                .get("error")
                .and_then(|e| opt_str(e, "message"))
                .map(str::to_owned),
            started_at: opt_u64(v, "startedAt"),
        })
    }
}

/// A thread.
#[derive(Clone, Debug, PartialEq)]
pub struct Thread {
    /// The thread ID.
    pub id: String,
    /// The Codex version that wrote it.
    pub cli_version: Option<String>,
    /// The rollout file.
    pub path: Option<String>,
    /// `legacy` or `paginated`.
    pub history_mode: Option<String>,
    /// Its turns (empty unless asked for).
    pub turns: Vec<Turn>,
}

impl Thread {
    /// Reads a thread.
    pub fn from_value(v: &Value) -> Result<Thread, ShapeError> {
        let turns = match v.get("turns").and_then(Value::as_array) {
            Some(a) => a.iter().map(Turn::from_value).collect::<Result<_, _>>()?,
            None => Vec::new(),
        };
        Ok(Thread {
            id: req_str(v, "id")?.to_owned(),
            cli_version: opt_str(v, "cliVersion").map(str::to_owned),
            path: opt_str(v, "path").map(str::to_owned),
            history_mode: opt_str(v, "historyMode").map(str::to_owned),
            turns,
        })
    }
}

/// Which stream an item delta belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeltaStream {
    /// `item/agentMessage/delta`.
    AgentMessage,
    /// `item/reasoning/summaryTextDelta`.
    ReasoningSummary,
    /// `item/reasoning/textDelta`.
    ReasoningText,
    /// `item/commandExecution/outputDelta`.
    CommandOutput,
}

/// A server notification this crate reads.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum ServerNotification {
    /// `thread/started`.
    ThreadStarted {
        /// The thread.
        thread: Thread,
    },
    /// `thread/status/changed`; `waiting_on_approval` from `activeFlags`.
    ThreadStatusChanged {
        /// The thread.
        thread_id: String,
        /// `idle`, `active`, ...
        status: String,
        /// The `waitingOnApproval` flag.
        waiting_on_approval: bool,
    },
    /// `thread/closed`: Codex unloaded the thread (0.169 does so about a minute after
    /// the last subscriber left an idle thread, after `thread/status/changed` with
    /// `notLoaded`). Nothing more of it comes, and a `turn/start` on it is refused
    /// ("thread not found") until `thread/resume` loads it again.
    ThreadClosed {
        /// The thread.
        thread_id: String,
    },
    /// `turn/started`.
    TurnStarted {
        /// The thread.
        thread_id: String,
        /// The turn.
        turn: Turn,
    },
    /// `turn/completed` (any end: completed, interrupted, failed).
    TurnCompleted {
        /// The thread.
        thread_id: String,
        /// The turn (its items only a summary).
        turn: Turn,
    },
    /// `item/started`.
    ItemStarted {
        /// The thread.
        thread_id: String,
        /// The turn the item belongs to.
        turn_id: String,
        /// The item.
        item: ThreadItem,
        /// `startedAtMs`.
        at_ms: Option<u64>,
    },
    /// `item/completed`: the authoritative item.
    ItemCompleted {
        /// The thread.
        thread_id: String,
        /// The turn the item belongs to.
        turn_id: String,
        /// The item.
        item: ThreadItem,
        /// `completedAtMs`.
        at_ms: Option<u64>,
    },
    /// A delta of an item's text.
    ItemDelta {
        /// Which stream.
        stream: DeltaStream,
        /// The thread.
        thread_id: String,
        /// The turn.
        turn_id: String,
        /// The item.
        item_id: String,
        /// The fragment.
        delta: String,
    },
    /// `serverRequest/resolved`: a server request is settled (answered by us or not).
    ServerRequestResolved {
        /// The thread.
        thread_id: String,
        /// The server request.
        request_id: RequestId,
    },
    /// `turn/diff/updated`.
    TurnDiffUpdated {
        /// The thread.
        thread_id: String,
        /// The turn.
        turn_id: String,
        /// The whole diff of the turn so far.
        diff: String,
    },
    /// `error`.
    Error {
        /// The message.
        message: String,
        /// The turn, if named.
        turn_id: Option<String>,
    },
    /// A notification known to this version and deliberately not used (the method is
    /// counted as [`crate::diag::Skip::Ignored`]).
    Ignored {
        /// The method.
        method: String,
    },
    /// A method this version does not know (counted as [`crate::diag::Skip::Unknown`]).
    Unknown {
        /// The method.
        method: String,
    },
}

/// Notifications known and deliberately not projected.
pub const IGNORED_NOTIFICATIONS: &[&str] = &[
    "account/rateLimits/updated",
    "thread/tokenUsage/updated",
    "mcpServer/startupStatus/updated",
    "remoteControl/status/changed",
    "item/reasoning/summaryPartAdded",
    "item/commandExecution/terminalInteraction",
    "item/fileChange/patchUpdated",
    "item/fileChange/outputDelta",
    "item/mcpToolCall/progress",
    "item/plan/delta",
    "turn/plan/updated",
    "thread/name/updated",
    "thread/compacted",
    "thread/archived",
    "thread/unarchived",
    "deprecationNotice",
    "warning",
    "model/rerouted",
    "hook/started",
    "hook/completed",
];

impl ServerNotification {
    /// Reads a notification from its method and params.
    pub fn from_parts(method: &str, p: &Value) -> Result<ServerNotification, ShapeError> {
        let s = |f: &'static str| req_str(p, f).map(str::to_owned);
        let delta = |stream| -> Result<ServerNotification, ShapeError> {
            Ok(ServerNotification::ItemDelta {
                stream,
                thread_id: s("threadId")?,
                turn_id: s("turnId")?,
                item_id: s("itemId")?,
                delta: s("delta")?,
            })
        };
        let item = || {
            p.get("item")
                .ok_or(ShapeError {
                    field: "item",
                    expected: "an object",
                })
                .and_then(ThreadItem::from_value)
        };
        let turn = || {
            p.get("turn")
                .ok_or(ShapeError {
                    field: "turn",
                    expected: "an object",
                })
                .and_then(Turn::from_value)
        };
        Ok(match method {
            "thread/started" => ServerNotification::ThreadStarted {
                thread: Thread::from_value(p.get("thread").unwrap_or(&Value::Null))?,
            },
            "thread/status/changed" => {
                let status = p.get("status").unwrap_or(&Value::Null);
                ServerNotification::ThreadStatusChanged {
                    thread_id: s("threadId")?,
                    status: opt_str(status, "type").unwrap_or_default().to_owned(),
                    waiting_on_approval: status
                        .get("activeFlags")
                        .and_then(Value::as_array)
                        .is_some_and(|f| f.iter().any(|x| x == "waitingOnApproval")),
                }
            }
            "thread/closed" => ServerNotification::ThreadClosed {
                thread_id: s("threadId")?,
            },
            "turn/started" => ServerNotification::TurnStarted {
                thread_id: s("threadId")?,
                turn: turn()?,
            },
            "turn/completed" => ServerNotification::TurnCompleted {
                thread_id: s("threadId")?,
                turn: turn()?,
            },
            "item/started" => ServerNotification::ItemStarted {
                thread_id: s("threadId")?,
                turn_id: s("turnId")?,
                item: item()?,
                at_ms: opt_u64(p, "startedAtMs"),
            },
            "item/completed" => ServerNotification::ItemCompleted {
                thread_id: s("threadId")?,
                turn_id: s("turnId")?,
                item: item()?,
                at_ms: opt_u64(p, "completedAtMs"),
            },
            "item/agentMessage/delta" => delta(DeltaStream::AgentMessage)?,
            "item/reasoning/summaryTextDelta" => delta(DeltaStream::ReasoningSummary)?,
            "item/reasoning/textDelta" => delta(DeltaStream::ReasoningText)?,
            "item/commandExecution/outputDelta" => delta(DeltaStream::CommandOutput)?,
            "serverRequest/resolved" => ServerNotification::ServerRequestResolved {
                thread_id: s("threadId")?,
                request_id: p.get("requestId").and_then(RequestId::from_value).ok_or(
                    ShapeError {
                        field: "requestId",
                        expected: "a number or a string",
                    },
                )?,
            },
            "turn/diff/updated" => ServerNotification::TurnDiffUpdated {
                thread_id: s("threadId")?,
                turn_id: s("turnId")?,
                diff: s("diff")?,
            },
            "error" => ServerNotification::Error {
                message: p
                    .get("error")
                    .and_then(|e| opt_str(e, "message"))
                    .or_else(|| opt_str(p, "message"))
                    .unwrap_or_default()
                    .to_owned(),
                turn_id: opt_str(p, "turnId").map(str::to_owned),
            },
            m if IGNORED_NOTIFICATIONS.contains(&m) => ServerNotification::Ignored {
                method: m.to_owned(),
            },
            m => ServerNotification::Unknown {
                method: m.to_owned(),
            },
        })
    }
}

/// A notification with the server's `emittedAtMs` (0.147 and later).
#[derive(Clone, Debug, PartialEq)]
pub struct Notification {
    /// When the server emitted it.
    pub emitted_at_ms: Option<u64>,
    /// What it says.
    pub body: ServerNotification,
}

/// What an approval is for (the Codex request methods).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ApprovalMethod {
    /// `item/commandExecution/requestApproval`.
    CommandExecution,
    /// `item/fileChange/requestApproval`.
    FileChange,
}

impl ApprovalMethod {
    /// The wire method.
    pub const fn method(self) -> &'static str {
        match self {
            ApprovalMethod::CommandExecution => "item/commandExecution/requestApproval",
            ApprovalMethod::FileChange => "item/fileChange/requestApproval",
        }
    }
}

/// An approval the server asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApprovalAsk {
    /// The server's request ID (the answer names it).
    pub request_id: RequestId,
    /// What it is for.
    pub method: ApprovalMethod,
    /// The thread.
    pub thread_id: String,
    /// The turn.
    pub turn_id: String,
    /// The item that waits.
    pub item_id: String,
    /// Why, if the agent said.
    pub reason: Option<String>,
    /// The command, for a command approval.
    pub command: Option<String>,
    /// The execpolicy amendment Codex proposes ("allow commands like this"): the only
    /// way to answer `acceptBroadly`.
    pub proposed_execpolicy_amendment: Option<Vec<String>>,
    /// `availableDecisions`, when the server restricts them (experimental).
    pub available_decisions: Option<Vec<String>>,
}

/// A request the server sends to the client.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerRequest {
    /// An approval.
    Approval(ApprovalAsk),
    /// A request this crate does not answer with a decision (user input, dynamic tool
    /// calls, elicitation, permissions, new methods). [`crate::codec::Codec`] answers
    /// it with a JSON-RPC error at once, so the server never waits forever.
    Unsupported {
        /// The server's request ID.
        request_id: RequestId,
        /// The method.
        method: String,
    },
}

impl ServerRequest {
    /// Reads a server request.
    pub fn from_parts(
        request_id: RequestId,
        method: &str,
        p: &Value,
    ) -> Result<ServerRequest, ShapeError> {
        let kind = match method {
            "item/commandExecution/requestApproval" => ApprovalMethod::CommandExecution,
            "item/fileChange/requestApproval" => ApprovalMethod::FileChange,
            _ => {
                return Ok(ServerRequest::Unsupported {
                    request_id,
                    method: method.to_owned(),
                })
            }
        };
        let strings = |f: &str| {
            p.get(f).and_then(Value::as_array).map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
        };
        Ok(ServerRequest::Approval(ApprovalAsk {
            request_id,
            method: kind,
            thread_id: req_str(p, "threadId")?.to_owned(),
            turn_id: req_str(p, "turnId")?.to_owned(),
            item_id: req_str(p, "itemId")?.to_owned(),
            reason: opt_str(p, "reason").map(str::to_owned),
            command: opt_str(p, "command").map(str::to_owned),
            proposed_execpolicy_amendment: strings("proposedExecpolicyAmendment")
                .filter(|a| !a.is_empty()),
            available_decisions: p
                .get("availableDecisions")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|d| {
                            d.as_str()
                                .map(str::to_owned)
                                .or_else(|| obj(d).and_then(|o| o.keys().next().cloned()))
                        })
                        .collect()
                }),
        }))
    }
}

/// One input of a user message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UserInput {
    /// A text part.
    Text(String),
    /// An image by URL.
    Image(String),
    /// An image file.
    LocalImage(String),
}

impl UserInput {
    fn to_value(&self) -> Value {
        match self {
            UserInput::Text(t) => json!({ "type": "text", "text": t }),
            UserInput::Image(u) => json!({ "type": "image", "url": u }),
            UserInput::LocalImage(p) => json!({ "type": "localImage", "path": p }),
        }
    }
}

/// A request the client sends.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientRequest {
    /// `initialize`.
    Initialize {
        /// `clientInfo.name`.
        name: String,
        /// `clientInfo.version`.
        version: String,
    },
    /// `thread/start`.
    ThreadStart {
        /// The working directory.
        cwd: Option<String>,
        /// `untrusted`, `on-failure`, `on-request`, `never`.
        approval_policy: Option<String>,
        /// `read-only`, `workspace-write`, `danger-full-access`.
        sandbox: Option<String>,
        /// The model (Codex's `config.toml` default when `None`).
        model: Option<String>,
        /// The model provider, by its `config.toml` name (the default when `None`).
        model_provider: Option<String>,
    },
    /// `thread/resume`: loads a thread (its history comes back in the answer).
    ThreadResume {
        /// The thread.
        thread_id: String,
    },
    /// `thread/read`.
    ThreadRead {
        /// The thread.
        thread_id: String,
        /// Whether to include turns and items.
        include_turns: bool,
    },
    /// `thread/items/list`: one page of a thread's completed items (Codex 0.169: at
    /// most 100 per page; `nextCursor` names the next).
    ThreadItemsList {
        /// The thread.
        thread_id: String,
        /// The cursor of the page (`None`: the first).
        cursor: Option<String>,
        /// Items asked for (Codex caps it at 100).
        limit: u32,
        /// Newest first.
        newest_first: bool,
    },
    /// `turn/start` carrying the operation as `clientUserMessageId`.
    TurnStart {
        /// The thread.
        thread_id: String,
        /// The operation ID.
        client_user_message_id: String,
        /// The inputs.
        input: Vec<UserInput>,
    },
    /// `turn/steer` into the running turn `expected_turn_id`.
    TurnSteer {
        /// The thread.
        thread_id: String,
        /// The turn the steer is for; another running turn is refused with `-32600`.
        expected_turn_id: String,
        /// The operation ID.
        client_user_message_id: String,
        /// The inputs.
        input: Vec<UserInput>,
    },
    /// `turn/interrupt`.
    TurnInterrupt {
        /// The thread.
        thread_id: String,
        /// The turn.
        turn_id: String,
    },
}

/// The method of a client request, which types its answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    /// `initialize`.
    Initialize,
    /// `thread/start`.
    ThreadStart,
    /// `thread/resume`.
    ThreadResume,
    /// `thread/read`.
    ThreadRead,
    /// `thread/items/list`.
    ThreadItemsList,
    /// `turn/start`.
    TurnStart,
    /// `turn/steer`.
    TurnSteer,
    /// `turn/interrupt`.
    TurnInterrupt,
}

impl Method {
    /// The wire method.
    pub const fn as_str(self) -> &'static str {
        match self {
            Method::Initialize => "initialize",
            Method::ThreadStart => "thread/start",
            Method::ThreadResume => "thread/resume",
            Method::ThreadRead => "thread/read",
            Method::ThreadItemsList => "thread/items/list",
            Method::TurnStart => "turn/start",
            Method::TurnSteer => "turn/steer",
            Method::TurnInterrupt => "turn/interrupt",
        }
    }
}

impl ClientRequest {
    /// Its method.
    pub fn method(&self) -> Method {
        match self {
            ClientRequest::Initialize { .. } => Method::Initialize,
            ClientRequest::ThreadStart { .. } => Method::ThreadStart,
            ClientRequest::ThreadResume { .. } => Method::ThreadResume,
            ClientRequest::ThreadRead { .. } => Method::ThreadRead,
            ClientRequest::ThreadItemsList { .. } => Method::ThreadItemsList,
            ClientRequest::TurnStart { .. } => Method::TurnStart,
            ClientRequest::TurnSteer { .. } => Method::TurnSteer,
            ClientRequest::TurnInterrupt { .. } => Method::TurnInterrupt,
        }
    }

    /// Its params.
    pub fn params(&self) -> Value {
        let inputs = |i: &[UserInput]| Value::Array(i.iter().map(UserInput::to_value).collect());
        match self {
            ClientRequest::Initialize { name, version } => {
                json!({ "clientInfo": { "name": name, "version": version } })
            }
            ClientRequest::ThreadStart {
                cwd,
                approval_policy,
                sandbox,
                model,
                model_provider,
            } => {
                let mut m = Map::new();
                for (k, v) in [
                    ("cwd", cwd),
                    ("approvalPolicy", approval_policy),
                    ("sandbox", sandbox),
                    ("model", model),
                    ("modelProvider", model_provider),
                ] {
                    if let Some(v) = v {
                        m.insert(k.to_owned(), json!(v));
                    }
                }
                Value::Object(m)
            }
            ClientRequest::ThreadResume { thread_id } => json!({ "threadId": thread_id }),
            ClientRequest::ThreadRead {
                thread_id,
                include_turns,
            } => json!({ "threadId": thread_id, "includeTurns": include_turns }),
            ClientRequest::ThreadItemsList {
                thread_id,
                cursor,
                limit,
                newest_first,
            } => {
                let mut m = Map::new();
                m.insert("threadId".to_owned(), json!(thread_id));
                if let Some(c) = cursor {
                    m.insert("cursor".to_owned(), json!(c));
                }
                m.insert("limit".to_owned(), json!(limit));
                let direction = if *newest_first { "desc" } else { "asc" };
                m.insert("sortDirection".to_owned(), json!(direction));
                Value::Object(m)
            }
            ClientRequest::TurnStart {
                thread_id,
                client_user_message_id,
                input,
            } => json!({
                "threadId": thread_id,
                "clientUserMessageId": client_user_message_id,
                "input": inputs(input),
            }),
            ClientRequest::TurnSteer {
                thread_id,
                expected_turn_id,
                client_user_message_id,
                input,
            } => json!({
                "threadId": thread_id,
                "expectedTurnId": expected_turn_id,
                "clientUserMessageId": client_user_message_id,
                "input": inputs(input),
            }),
            ClientRequest::TurnInterrupt { thread_id, turn_id } => {
                json!({ "threadId": thread_id, "turnId": turn_id })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_item_type_is_kept_as_unknown_not_an_error() {
        let v = json!({"type": "collabAgentToolCall", "id": "x", "new": 1});
        assert_eq!(
            ThreadItem::from_value(&v),
            Ok(ThreadItem::Unknown {
                item_type: "collabAgentToolCall".into(),
                id: Some("x".into())
            })
        );
        let bad = json!({"type": "agentMessage"});
        assert_eq!(ThreadItem::from_value(&bad).unwrap_err().field, "id");
    }

    #[test]
    fn an_unknown_notification_method_is_unknown() {
        let n = ServerNotification::from_parts("thread/teleported", &json!({})).unwrap();
        assert_eq!(
            n,
            ServerNotification::Unknown {
                method: "thread/teleported".into()
            }
        );
    }
}
