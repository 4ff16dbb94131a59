//! The app-server JSON-RPC 2.0 codec over newline-delimited stdio, sans-IO: the host
//! writes the bytes [`Codec`] returns and hands it every line it reads.
//!
//! Invariants:
//! - Client request IDs are unique per codec (from 1, increasing); a response is typed by
//!   the method of the request it answers, and a response for no pending request is
//!   counted and skipped.
//! - Every server request gets exactly one answer: approvals by [`Codec::answer_approval`]
//!   (a second answer for the same request is refused), anything else at once with a
//!   JSON-RPC error ([`Incoming::Request`] carries the reply), so the server never waits.
//! - No line is fatal: a line that is not JSON, not JSON-RPC, or a known method with a
//!   shape this version cannot read is a [`LineError`] and is counted in
//!   [`Codec::diagnostics`]; unknown methods and item types are counted and skipped.
//! - The agent version is read from the `initialize` answer (`userAgent`) and from every
//!   thread (`cliVersion`).
//!
//! ```
//! use agent_codex::codec::{Codec, Incoming, Response};
//! use agent_codex::protocol::ClientRequest;
//!
//! let mut codec = Codec::new();
//! let (id, line) = codec.request(&ClientRequest::Initialize {
//!     name: "host".into(),
//!     version: "1.0".into(),
//! });
//! assert!(line.ends_with(b"\n"));
//! let answer = format!(
//!     r#"{{"id":{id},"result":{{"userAgent":"host/0.147.0 (Mac OS; arm64)"}}}}"#
//! );
//! match codec.handle_line(answer.as_bytes()).unwrap() {
//!     Incoming::Response { response: Response::Initialize { .. }, .. } => {}
//!     other => panic!("{other:?}"),
//! }
//! let _initialized: Vec<u8> = codec.initialized();
//! assert_eq!(codec.diagnostics().agent_version.as_deref(), Some("0.147.0"));
//! ```

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde_json::{json, Value};
use timeline_core::rows::Decision;

use crate::diag::{Diagnostics, Skip};
use crate::protocol::{
    opt_str, ApprovalAsk, ApprovalMethod, ClientRequest, DeltaStream, Method, Notification,
    RequestId, ServerNotification, ServerRequest, ShapeError, Thread, ThreadItem, Turn,
};

/// The JSON-RPC error code of an invalid request (Codex: a stale `expectedTurnId`,
/// nothing to interrupt).
pub const INVALID_REQUEST: i64 = -32600;
/// The code Codex answers when it is overloaded.
pub const OVERLOADED: i64 = -32001;
/// The code this codec answers a server request it does not support with.
pub const METHOD_NOT_FOUND: i64 = -32601;

/// A JSON-RPC error object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RpcError {
    /// The code.
    pub code: i64,
    /// The message.
    pub message: String,
}

/// One entry of a `thread/items/list` page.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ListedItem {
    /// `turnId`: the turn the item belongs to.
    pub turn_id: Option<String>,
    /// `item`, as sent (read with [`crate::protocol::ThreadItem::from_value`]); for an
    /// `unsupportedItem` entry, that object.
    pub item: Value,
    /// The entry was an `unsupportedItem`: a public item this Codex cannot describe.
    pub unsupported: bool,
    /// `startedAtMs`, when the producer recorded it.
    pub started_at_ms: Option<u64>,
    /// `completedAtMs`, when the producer recorded it.
    pub completed_at_ms: Option<u64>,
}

impl ListedItem {
    /// Reads one entry. An entry with neither or both of `item` and `unsupportedItem`,
    /// or whose item is not an object, fails the whole page.
    pub fn from_entry(entry: &Value) -> Result<ListedItem, ShapeError> {
        let object = |key: &str| entry.get(key).filter(|v| !v.is_null());
        let (item, unsupported) = match (object("item"), object("unsupportedItem")) {
            (Some(item), None) => (item, false),
            (None, Some(item)) => (item, true),
            _ => {
                return Err(ShapeError {
                    field: "data[]",
                    expected: "exactly one of item and unsupportedItem",
                })
            }
        };
        if !item.is_object() {
            return Err(ShapeError {
                field: "data[].item",
                expected: "an object",
            });
        }
        let ms = |key: &str| entry.get(key).and_then(Value::as_u64);
        Ok(ListedItem {
            turn_id: opt_str(entry, "turnId").map(str::to_owned),
            item: item.clone(),
            unsupported,
            started_at_ms: ms("startedAtMs"),
            completed_at_ms: ms("completedAtMs"),
        })
    }
}

/// A typed answer to a client request.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Response {
    /// `initialize`.
    Initialize {
        /// `userAgent` (`<client>/<codex version> (...)`).
        user_agent: String,
    },
    /// `thread/start`.
    ThreadStart {
        /// The thread.
        thread: Thread,
    },
    /// `thread/resume`, with its history.
    ThreadResume {
        /// The thread.
        thread: Thread,
    },
    /// `thread/read`.
    ThreadRead {
        /// The thread.
        thread: Thread,
    },
    /// `thread/items/list`: one page of items, each with its turn, and the next page's
    /// cursor (`None` on the last page).
    ThreadItemsList {
        /// Each entry, in the order asked.
        items: Vec<ListedItem>,
        /// `nextCursor`.
        next_cursor: Option<String>,
    },
    /// `turn/start`: the turn that took the message (it may never materialise when a
    /// turn was already running: the message then lands in the running turn).
    TurnStart {
        /// The turn.
        turn: Turn,
    },
    /// `turn/steer`: the running turn took the message as pending input.
    TurnSteer {
        /// The turn.
        turn_id: String,
    },
    /// `turn/interrupt`.
    TurnInterrupt,
}

/// One line the server sent, typed.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Incoming {
    /// The answer to request `id`.
    Response {
        /// The request.
        id: u64,
        /// The answer.
        response: Response,
    },
    /// An error answer. `method` is the method of the request it answers (`None` when
    /// the ID matches no pending request, or is absent).
    Error {
        /// The request, if the error names one.
        id: Option<u64>,
        /// Its method.
        method: Option<Method>,
        /// The error.
        error: RpcError,
    },
    /// A notification.
    Notification(Notification),
    /// A request of the server. `reply` is `Some` when the codec answered it itself
    /// (an unsupported request): the host writes those bytes.
    Request {
        /// The request.
        request: ServerRequest,
        /// The bytes to write at once, if any.
        reply: Option<Vec<u8>>,
    },
    /// A line that was read and deliberately dropped (a response for no pending
    /// request); counted in the diagnostics.
    Skipped,
}

/// A line that cannot be read. Never fatal: the line is counted and the stream goes on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LineError {
    /// Not JSON.
    #[error("the line is not JSON")]
    NotJson,
    /// JSON, but no JSON-RPC message (no `method`, `result` or `error`).
    #[error("the line is not a JSON-RPC message")]
    NotJsonRpc,
    /// A known method, or an answer, without what this crate needs.
    #[error("`{what}`: {shape}")]
    Shape {
        /// The method or answer.
        what: String,
        /// What is missing.
        shape: ShapeError,
    },
}

/// Why an approval answer was not written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AnswerError {
    /// No open approval has that ID (never asked, or answered already).
    #[error("no open approval request {0}")]
    NotOpen(RequestId),
    /// The request does not allow the decision.
    #[error("the decision {0:?} is not allowed for this request")]
    NotAllowed(Decision),
}

/// The decisions a Codex approval allows, in the shared model's words. `acceptBroadly`
/// is Codex's `acceptWithExecpolicyAmendment` and needs a proposed amendment;
/// `availableDecisions`, when sent, narrows the list, except for `decline` and
/// `acceptForSession`: Codex 0.169 leaves both out of a command's list
/// (`["accept", {"acceptWithExecpolicyAmendment": ..}, "cancel"]`) and takes both, and
/// without `decline` the only refusal left would be `cancel`, which ends the whole turn.
pub fn allowed_decisions(ask: &ApprovalAsk) -> Vec<Decision> {
    let mut all = vec![Decision::Accept, Decision::AcceptForSession];
    if ask.method == ApprovalMethod::CommandExecution && ask.proposed_execpolicy_amendment.is_some()
    {
        all.push(Decision::AcceptBroadly);
    }
    all.extend([Decision::Decline, Decision::Cancel]);
    match &ask.available_decisions {
        Some(names) => all
            .into_iter()
            .filter(|d| {
                matches!(d, Decision::Decline | Decision::AcceptForSession)
                    || names.iter().any(|n| n == decision_wire_name(*d))
            })
            .collect(),
        None => all,
    }
}

fn decision_wire_name(d: Decision) -> &'static str {
    match d {
        Decision::Accept => "accept",
        Decision::AcceptForSession => "acceptForSession",
        Decision::AcceptBroadly => "acceptWithExecpolicyAmendment",
        Decision::Decline => "decline",
        Decision::Cancel => "cancel",
    }
}

/// The version in a user agent `<client>/<version> (...)`.
pub fn version_of_user_agent(user_agent: &str) -> Option<&str> {
    let (_, rest) = user_agent.split_once('/')?;
    let v = rest.split_whitespace().next()?;
    (!v.is_empty()).then_some(v)
}

fn line(v: &Value) -> Vec<u8> {
    let mut out = v.to_string().into_bytes();
    out.push(b'\n');
    out
}

/// `T` read only from a JSON object (a derived `Deserialize` also takes an array).
struct MapOnly<T>(T);

impl<'de, T: serde::Deserialize<'de>> serde::Deserialize<'de> for MapOnly<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Objects<T>(std::marker::PhantomData<T>);
        impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for Objects<T> {
            type Value = MapOnly<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(MapOnly)
            }
        }
        d.deserialize_map(Objects(std::marker::PhantomData))
    }
}

/// A delta notification as it comes on the wire, read without building a JSON tree.
#[derive(serde::Deserialize)]
struct DeltaLine<'a> {
    #[serde(borrow)]
    method: Cow<'a, str>,
    #[serde(borrow)]
    params: MapOnly<DeltaParams<'a>>,
    #[serde(rename = "emittedAtMs")]
    emitted_at_ms: Option<u64>,
    id: Option<serde::de::IgnoredAny>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeltaParams<'a> {
    #[serde(borrow)]
    thread_id: Cow<'a, str>,
    #[serde(borrow)]
    turn_id: Cow<'a, str>,
    #[serde(borrow)]
    item_id: Cow<'a, str>,
    #[serde(borrow)]
    delta: Cow<'a, str>,
}

/// The fast path of the line most streamed (a token-sized delta): a delta notification
/// read into its fields directly. `None` for any other line, and for a delta line of any
/// other shape (a field missing or mistyped, duplicated keys, an `id`, an `emittedAtMs`
/// that is not an integer): the general reader then gives the same answer it always
/// gives (checked by `tests/codec_props.rs`).
fn fast_delta(bytes: &[u8]) -> Option<Notification> {
    // Only lines that can be deltas are tried: every delta method ends in `elta"`.
    if !bytes.windows(5).any(|w| w == b"elta\"") {
        return None;
    }
    let MapOnly(line) = serde_json::from_slice::<MapOnly<DeltaLine<'_>>>(bytes).ok()?;
    if line.id.is_some() {
        return None;
    }
    let stream = match line.method.as_ref() {
        "item/agentMessage/delta" => DeltaStream::AgentMessage,
        "item/reasoning/summaryTextDelta" => DeltaStream::ReasoningSummary,
        "item/reasoning/textDelta" => DeltaStream::ReasoningText,
        "item/commandExecution/outputDelta" => DeltaStream::CommandOutput,
        _ => return None,
    };
    let MapOnly(p) = line.params;
    Some(Notification {
        emitted_at_ms: line.emitted_at_ms,
        body: ServerNotification::ItemDelta {
            stream,
            thread_id: p.thread_id.into_owned(),
            turn_id: p.turn_id.into_owned(),
            item_id: p.item_id.into_owned(),
            delta: p.delta.into_owned(),
        },
    })
}

/// The codec. See the module doc for its invariants.
#[derive(Debug)]
pub struct Codec {
    next_id: u64,
    pending: BTreeMap<u64, Method>,
    approvals: BTreeMap<RequestId, ApprovalAsk>,
    /// Server requests this codec answered and Codex has not said are settled, the last
    /// [`ANSWERED_KEPT`] (oldest first in `answered_order`).
    answered: BTreeSet<RequestId>,
    answered_order: VecDeque<RequestId>,
    diagnostics: Diagnostics,
}

/// How many answered server requests the codec remembers while Codex has not settled
/// them (`serverRequest/resolved` forgets one at once).
pub const ANSWERED_KEPT: usize = 1_024;

impl Default for Codec {
    fn default() -> Self {
        Codec::new()
    }
}

impl Codec {
    /// A codec whose first request ID is 1.
    pub fn new() -> Codec {
        Codec {
            next_id: 1,
            pending: BTreeMap::new(),
            approvals: BTreeMap::new(),
            answered: BTreeSet::new(),
            answered_order: VecDeque::new(),
            diagnostics: Diagnostics::new(),
        }
    }

    /// What was skipped so far, and the agent version.
    pub fn diagnostics(&self) -> &Diagnostics {
        &self.diagnostics
    }

    /// Encodes a request: its ID and the line to write (newline included).
    pub fn request(&mut self, request: &ClientRequest) -> (u64, Vec<u8>) {
        let id = self.next_id;
        self.next_id = self.next_id.saturating_add(1);
        let method = request.method();
        self.pending.insert(id, method);
        let v = json!({
            "jsonrpc": "2.0",
            "id": id,
            "method": method.as_str(),
            "params": request.params(),
        });
        (id, line(&v))
    }

    /// The `initialized` notification that follows the `initialize` answer.
    pub fn initialized(&self) -> Vec<u8> {
        line(&json!({ "jsonrpc": "2.0", "method": "initialized", "params": {} }))
    }

    /// The methods of the requests still waiting for an answer, by ID. When the process
    /// ends, each of them is uncertain ([`crate::send::SendFailure::ProcessExited`]).
    pub fn pending(&self) -> impl Iterator<Item = (u64, Method)> + '_ {
        self.pending.iter().map(|(id, m)| (*id, *m))
    }

    /// Forgets every pending request and open approval (the process ended), returning
    /// the pending requests.
    pub fn abandon(&mut self) -> Vec<(u64, Method)> {
        self.approvals.clear();
        std::mem::take(&mut self.pending).into_iter().collect()
    }

    /// The open approval with this ID.
    pub fn approval(&self, id: &RequestId) -> Option<&ApprovalAsk> {
        self.approvals.get(id)
    }

    /// Answers an open approval with `decision`: the line to write. Refused when the
    /// approval is not open (never asked, or answered already) or does not allow it.
    pub fn answer_approval(
        &mut self,
        id: &RequestId,
        decision: Decision,
    ) -> Result<Vec<u8>, AnswerError> {
        let ask = self
            .approvals
            .get(id)
            .ok_or_else(|| AnswerError::NotOpen(id.clone()))?;
        if !allowed_decisions(ask).contains(&decision) {
            return Err(AnswerError::NotAllowed(decision));
        }
        let wire = match (decision, &ask.proposed_execpolicy_amendment) {
            (Decision::AcceptBroadly, Some(amendment)) => json!({
                "acceptWithExecpolicyAmendment": { "execpolicy_amendment": amendment }
            }),
            (d, _) => json!(decision_wire_name(d)),
        };
        self.approvals.remove(id);
        if self.answered.insert(id.clone()) {
            self.answered_order.push_back(id.clone());
            while self.answered_order.len() > ANSWERED_KEPT {
                if let Some(old) = self.answered_order.pop_front() {
                    self.answered.remove(&old);
                }
            }
        }
        Ok(line(&json!({
            "jsonrpc": "2.0",
            "id": id.to_value(),
            "result": { "decision": wire },
        })))
    }

    /// True when this codec answered the server request `id` and Codex has not said it
    /// is settled yet (`serverRequest/resolved` for it forgets it).
    pub fn answered(&self, id: &RequestId) -> bool {
        self.answered.contains(id)
    }

    /// Reads one line the server sent (without or with its newline).
    pub fn handle_line(&mut self, bytes: &[u8]) -> Result<Incoming, LineError> {
        let r = self.read(bytes);
        // Codex settled a request (after an interrupt, or answered elsewhere): it takes
        // no answer any more, so none may be written as if it were taken.
        if let Ok(Incoming::Notification(Notification {
            body: ServerNotification::ServerRequestResolved { request_id, .. },
            ..
        })) = &r
        {
            self.approvals.remove(request_id);
            if self.answered.remove(request_id) {
                self.answered_order.retain(|a| a != request_id);
            }
        }
        if let Err(e) = &r {
            let label = match e {
                LineError::NotJson => "line:not-json".to_owned(),
                LineError::NotJsonRpc => "line:not-json-rpc".to_owned(),
                LineError::Shape { what, .. } => format!("shape:{what}"),
            };
            self.diagnostics.count(Skip::Malformed, label);
        }
        r
    }

    fn read(&mut self, bytes: &[u8]) -> Result<Incoming, LineError> {
        if let Some(n) = fast_delta(bytes) {
            return Ok(Incoming::Notification(n));
        }
        let v: Value = serde_json::from_slice(bytes).map_err(|_| LineError::NotJson)?;
        if !v.is_object() {
            return Err(LineError::NotJsonRpc);
        }
        let id = v.get("id").filter(|i| !i.is_null());
        if let Some(method) = opt_str(&v, "method") {
            let params = v.get("params").unwrap_or(&Value::Null);
            let shape = |shape| LineError::Shape {
                what: method.to_owned(),
                shape,
            };
            return match id {
                Some(id) => {
                    let id = RequestId::from_value(id).ok_or(LineError::NotJsonRpc)?;
                    let request =
                        ServerRequest::from_parts(id.clone(), method, params).map_err(shape)?;
                    Ok(self.server_request(request, method))
                }
                None => {
                    let body = ServerNotification::from_parts(method, params).map_err(shape)?;
                    self.note(&body);
                    Ok(Incoming::Notification(Notification {
                        emitted_at_ms: v.get("emittedAtMs").and_then(Value::as_u64),
                        body,
                    }))
                }
            };
        }
        let num_id = id.and_then(Value::as_u64);
        if let Some(err) = v.get("error") {
            let method = num_id.and_then(|i| self.pending.remove(&i));
            return Ok(Incoming::Error {
                id: num_id,
                method,
                error: RpcError {
                    code: err.get("code").and_then(Value::as_i64).unwrap_or(0),
                    message: opt_str(err, "message").unwrap_or_default().to_owned(),
                },
            });
        }
        let Some(result) = v.get("result") else {
            return Err(LineError::NotJsonRpc);
        };
        let Some((id, method)) = num_id.and_then(|i| self.pending.remove(&i).map(|m| (i, m)))
        else {
            self.diagnostics.count(Skip::Unknown, "response:unmatched");
            return Ok(Incoming::Skipped);
        };
        let response = self
            .response(method, result)
            .map_err(|shape| LineError::Shape {
                what: format!("{} answer", method.as_str()),
                shape,
            })?;
        Ok(Incoming::Response { id, response })
    }

    fn response(&mut self, method: Method, r: &Value) -> Result<Response, ShapeError> {
        let thread = |r: &Value| Thread::from_value(r.get("thread").unwrap_or(&Value::Null));
        Ok(match method {
            Method::Initialize => {
                let user_agent = opt_str(r, "userAgent").unwrap_or_default().to_owned();
                if let Some(v) = version_of_user_agent(&user_agent) {
                    self.diagnostics.set_version(v);
                }
                Response::Initialize { user_agent }
            }
            Method::ThreadStart => Response::ThreadStart {
                thread: self.thread_version(thread(r)?),
            },
            Method::ThreadResume => Response::ThreadResume {
                thread: self.thread_version(thread(r)?),
            },
            Method::ThreadRead => Response::ThreadRead {
                thread: self.thread_version(thread(r)?),
            },
            Method::ThreadItemsList => {
                let data = r.get("data").and_then(Value::as_array).ok_or(ShapeError {
                    field: "data",
                    expected: "an array of items",
                })?;
                let mut items = Vec::with_capacity(data.len());
                for entry in data {
                    items.push(ListedItem::from_entry(entry)?);
                }
                Response::ThreadItemsList {
                    items,
                    next_cursor: opt_str(r, "nextCursor").map(str::to_owned),
                }
            }
            Method::TurnStart => Response::TurnStart {
                turn: Turn::from_value(r.get("turn").unwrap_or(&Value::Null))?,
            },
            Method::TurnSteer => Response::TurnSteer {
                turn_id: crate::protocol::req_str(r, "turnId")?.to_owned(),
            },
            Method::TurnInterrupt => Response::TurnInterrupt,
        })
    }

    fn thread_version(&mut self, thread: Thread) -> Thread {
        if let Some(v) = &thread.cli_version {
            self.diagnostics.set_version(v);
        }
        thread
    }

    fn server_request(&mut self, request: ServerRequest, method: &str) -> Incoming {
        match &request {
            ServerRequest::Approval(ask) => {
                self.approvals.insert(ask.request_id.clone(), ask.clone());
                Incoming::Request {
                    request,
                    reply: None,
                }
            }
            ServerRequest::Unsupported { request_id, .. } => {
                self.diagnostics
                    .count(Skip::Unknown, format!("request:{method}"));
                let reply = line(&json!({
                    "jsonrpc": "2.0",
                    "id": request_id.to_value(),
                    "error": {
                        "code": METHOD_NOT_FOUND,
                        "message": format!("unsupported request: {method}"),
                    },
                }));
                Incoming::Request {
                    request,
                    reply: Some(reply),
                }
            }
        }
    }

    /// Counts what a notification skips, and reads the version a thread states.
    fn note(&mut self, body: &ServerNotification) {
        let item = match body {
            ServerNotification::Ignored { method } => {
                self.diagnostics
                    .count(Skip::Ignored, format!("notification:{method}"));
                None
            }
            ServerNotification::Unknown { method } => {
                self.diagnostics
                    .count(Skip::Unknown, format!("notification:{method}"));
                None
            }
            ServerNotification::ThreadStarted { thread } => {
                if let Some(v) = &thread.cli_version {
                    self.diagnostics.set_version(v);
                }
                None
            }
            ServerNotification::ItemStarted { item, .. }
            | ServerNotification::ItemCompleted { item, .. } => Some(item),
            _ => None,
        };
        if let Some(ThreadItem::Unknown { item_type, .. }) = item {
            self.diagnostics
                .count(Skip::Unknown, format!("item:{item_type}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_increase_from_one_and_type_their_answers() {
        let mut c = Codec::new();
        let (a, _) = c.request(&ClientRequest::TurnInterrupt {
            thread_id: "t".into(),
            turn_id: "u".into(),
        });
        let (b, _) = c.request(&ClientRequest::TurnSteer {
            thread_id: "t".into(),
            expected_turn_id: "u".into(),
            client_user_message_id: "op-1".into(),
            input: vec![],
        });
        assert_eq!((a, b), (1, 2));
        let r = c
            .handle_line(br#"{"id":2,"result":{"turnId":"u"}}"#)
            .unwrap();
        assert_eq!(
            r,
            Incoming::Response {
                id: 2,
                response: Response::TurnSteer {
                    turn_id: "u".into()
                }
            }
        );
        // The same ID again answers nothing: counted, skipped.
        assert_eq!(
            c.handle_line(br#"{"id":2,"result":{"turnId":"u"}}"#),
            Ok(Incoming::Skipped)
        );
        assert_eq!(c.diagnostics().get(Skip::Unknown, "response:unmatched"), 1);
    }

    #[test]
    fn bad_lines_are_typed_errors_and_counted() {
        let mut c = Codec::new();
        assert_eq!(c.handle_line(b"{not json"), Err(LineError::NotJson));
        assert_eq!(c.handle_line(b"[1,2]"), Err(LineError::NotJsonRpc));
        assert_eq!(c.handle_line(b"{\"x\":1}"), Err(LineError::NotJsonRpc));
        assert!(matches!(
            c.handle_line(br#"{"method":"item/agentMessage/delta","params":{}}"#),
            Err(LineError::Shape { .. })
        ));
        assert_eq!(c.diagnostics().total(Skip::Malformed), 4);
    }

    #[test]
    fn an_unsupported_server_request_is_answered_at_once() {
        let mut c = Codec::new();
        let r = c
            .handle_line(br#"{"id":7,"method":"item/tool/requestUserInput","params":{}}"#)
            .unwrap();
        let Incoming::Request {
            reply: Some(reply), ..
        } = r
        else {
            panic!("{r:?}")
        };
        let v: Value = serde_json::from_slice(&reply).unwrap();
        assert_eq!(v["id"], 7);
        assert_eq!(v["error"]["code"], METHOD_NOT_FOUND);
    }

    #[test]
    fn an_approval_is_answered_once_and_only_with_an_allowed_decision() {
        let mut c = Codec::new();
        let line = br#"{"id":0,"method":"item/commandExecution/requestApproval","params":{"threadId":"t","turnId":"u","itemId":"i","startedAtMs":1,"proposedExecpolicyAmendment":["echo"]}}"#;
        assert!(matches!(
            c.handle_line(line).unwrap(),
            Incoming::Request { reply: None, .. }
        ));
        let id = RequestId::Number(0);
        let out = c.answer_approval(&id, Decision::AcceptBroadly).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v["result"]["decision"]["acceptWithExecpolicyAmendment"]["execpolicy_amendment"],
            json!(["echo"])
        );
        assert_eq!(
            c.answer_approval(&id, Decision::Accept),
            Err(AnswerError::NotOpen(id.clone()))
        );
        assert!(c.answered(&id));
        // Codex says it is settled: nothing of it is kept.
        let resolved =
            br#"{"method":"serverRequest/resolved","params":{"threadId":"t","requestId":0}}"#;
        c.handle_line(resolved).unwrap();
        assert!(!c.answered(&id));
        assert!(c.answered.is_empty() && c.answered_order.is_empty());

        let file = br#"{"id":1,"method":"item/fileChange/requestApproval","params":{"threadId":"t","turnId":"u","itemId":"j","startedAtMs":1}}"#;
        c.handle_line(file).unwrap();
        assert_eq!(
            c.answer_approval(&RequestId::Number(1), Decision::AcceptBroadly),
            Err(AnswerError::NotAllowed(Decision::AcceptBroadly))
        );
    }

    // Answers Codex never settles are kept up to a bound, oldest forgotten first.
    #[test]
    fn answered_requests_are_bounded() {
        let mut c = Codec::new();
        for n in 0..(ANSWERED_KEPT as i64 + 10) {
            let ask = format!(
                r#"{{"id":{n},"method":"item/commandExecution/requestApproval","params":{{"threadId":"t","turnId":"u","itemId":"i{n}","startedAtMs":1}}}}"#
            );
            c.handle_line(ask.as_bytes()).unwrap();
            c.answer_approval(&RequestId::Number(n), Decision::Accept)
                .unwrap();
        }
        assert_eq!(c.answered.len(), ANSWERED_KEPT);
        assert!(!c.answered(&RequestId::Number(0)));
        assert!(c.answered(&RequestId::Number(ANSWERED_KEPT as i64 + 9)));
    }

    #[test]
    fn the_version_comes_from_the_user_agent() {
        assert_eq!(
            version_of_user_agent("anyagent-probe/0.147.0 (Mac OS 26.5.1; arm64) unknown"),
            Some("0.147.0")
        );
        assert_eq!(version_of_user_agent("no-slash"), None);
    }
}
