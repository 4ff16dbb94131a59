//! # scripted-model
//!
//! A model API served on loopback, so the real agents (Codex's app-server, Claude
//! Code) run whole turns offline: `POST /v1/responses` streams OpenAI Responses
//! events (Codex, `wire_api = "responses"`), `POST /v1/messages` streams Anthropic
//! Messages events (Claude Code, `ANTHROPIC_BASE_URL`). Each reply follows a script
//! chosen by a marker in the newest user text of the request:
//!
//! | marker | reply |
//! |---|---|
//! | none, `[[text]]` | text in three deltas: `Reply to: <the user's words>` |
//! | `[[slow]]` | eight text deltas, one every [`SLOW_STEP`] (a steer, a queued message or an interrupt lands in the running turn) |
//! | `[[tool]]` | a call of the shell tool the request offers, which needs approval (`touch scripted-model-ran.txt`); the request carrying its output is answered with text quoting it |
//! | `[[e500]]`, `[[e500:N]]` | HTTP 500 for the first N requests of that text (1 by default), then text |
//! | `[[cut]]` | the stream closed halfway, every time |
//! | `[[hang]]` | the first event, then nothing until the client leaves or [`HANG_MAX`] passes |
//!
//! Every request is kept ([`ModelServer::requests`]) with the script it got. The server
//! listens on `127.0.0.1` only, on a port of its own, and stops when dropped; each
//! connection ends with its reply, and a hang ends by itself.
//!
//! [`agents`] finds the pinned real agents and writes the homes that point them here.

#![warn(unreachable_pub)]

pub mod agents;
pub mod drive;
pub mod echo;
pub mod instant;
pub mod wasm;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The pause between two deltas of `[[slow]]`.
pub const SLOW_STEP: Duration = Duration::from_millis(750);

/// The longest a `[[hang]]` holds its connection.
pub const HANG_MAX: Duration = Duration::from_secs(120);

/// The largest request body read (a bigger one is answered 413).
const MAX_BODY: usize = 32 * 1024 * 1024;

/// Which API a request came through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Api {
    /// OpenAI Responses (`/v1/responses`).
    Responses,
    /// Anthropic Messages (`/v1/messages`).
    Messages,
    /// Anything else (answered 404, or `count_tokens`).
    Other,
}

/// The script a reply follows.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Script {
    /// Text in three deltas.
    Text,
    /// Eight deltas, [`SLOW_STEP`] apart.
    Slow,
    /// A tool call that needs approval.
    Tool,
    /// The text that follows a tool's output.
    AfterTool,
    /// HTTP 500 for the first `n` requests of the text.
    Error500(u32),
    /// The stream closed halfway.
    Cut,
    /// The first event, then silence.
    Hang,
}

/// One request the server took.
#[derive(Clone, Debug)]
pub struct Logged {
    /// Its API.
    pub api: Api,
    /// The request path.
    pub path: String,
    /// The body, as JSON (`Null` when it was not JSON).
    pub body: Value,
    /// The script it got (`None` for requests that are not turns).
    pub script: Option<Script>,
}

#[derive(Default)]
struct Shared {
    requests: Mutex<Vec<Logged>>,
    /// Requests seen per (script marker, user text), for the `N` of `[[e500:N]]`.
    attempts: Mutex<BTreeMap<String, u32>>,
    next: AtomicU64,
    stop: AtomicBool,
}

/// The server. See the crate doc.
pub struct ModelServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ModelServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl ModelServer {
    /// Listens on `127.0.0.1` on a free port.
    ///
    /// # Errors
    ///
    /// The socket could not be bound.
    pub fn start() -> std::io::Result<ModelServer> {
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let s = Arc::clone(&shared);
        let accept = std::thread::Builder::new()
            .name("scripted-model".to_owned())
            .spawn(move || {
                for stream in listener.incoming() {
                    if s.stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let s = Arc::clone(&s);
                    // A connection that cannot get a thread is dropped: the client
                    // sees a closed connection, as from any server that is full.
                    if let Err(e) = std::thread::Builder::new()
                        .name("scripted-model-conn".to_owned())
                        .spawn(move || serve(stream, &s))
                    {
                        eprintln!("scripted-model: a connection was dropped: {e}");
                    }
                }
            })?;
        Ok(ModelServer {
            addr,
            shared,
            accept: Some(accept),
        })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The base URL of the OpenAI API (`http://127.0.0.1:PORT/v1`), for Codex's
    /// `model_providers.<name>.base_url`.
    pub fn openai_base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The base URL of the Anthropic API (`http://127.0.0.1:PORT`), for
    /// `ANTHROPIC_BASE_URL`.
    pub fn anthropic_base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request taken so far, in order.
    pub fn requests(&self) -> Vec<Logged> {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The turns asked so far (requests of either API that got a script).
    pub fn turns(&self) -> Vec<Logged> {
        self.requests()
            .into_iter()
            .filter(|r| r.script.is_some())
            .collect()
    }
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop. A refused connect means the loop has already ended
        // (its listener is gone), so there is nothing left to wake.
        if TcpStream::connect(self.addr).is_err() {
            eprintln!("scripted-model: the accept loop had already stopped");
        }
        if let Some(t) = self.accept.take() {
            // Drop cannot return an error; a panicked accept loop is said, not lost.
            if t.join().is_err() {
                eprintln!("scripted-model: the accept loop panicked");
            }
        }
    }
}

/// The marker of `text`: its name and number.
fn marker(text: &str) -> Option<(String, Option<u32>)> {
    let start = text.find("[[")?;
    let rest = &text[start + 2..];
    let end = rest.find("]]")?;
    let inner = &rest[..end];
    let (name, n) = match inner.split_once(':') {
        Some((name, n)) => (name, n.parse().ok()),
        None => (inner, None),
    };
    let ok = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric());
    ok.then(|| (name.to_ascii_lowercase(), n))
}

/// The user's words without the marker, for the reply.
fn words(text: &str) -> String {
    let mut out = text.to_owned();
    if let (Some(a), Some(b)) = (out.find("[["), out.find("]]")) {
        if a < b {
            out.replace_range(a..b + 2, "");
        }
    }
    let out = out.split_whitespace().collect::<Vec<_>>().join(" ");
    out.chars().take(80).collect()
}

fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter(|p| matches!(p["type"].as_str(), Some("text" | "input_text")))
            .filter_map(|p| p["text"].as_str())
            // Claude Code puts its own reminders before the user's words (and its agent
            // SDK the record of the local commands it ran, such as `/model`).
            .filter(|t| {
                let t = t.trim_start();
                !["<system-reminder>", "<local-command-", "<command-"]
                    .iter()
                    .any(|tag| t.starts_with(tag))
            })
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// The user texts of a Responses request, and whether its last item is a tool's
/// output (with that output).
fn responses_turn(body: &Value) -> (Vec<String>, Option<String>) {
    let items = body["input"].as_array().cloned().unwrap_or_default();
    let texts = items
        .iter()
        .filter(|i| i["type"] == "message" && i["role"] == "user")
        .map(|i| text_of(&i["content"]))
        .collect();
    let tool = items
        .last()
        .filter(|i| i["type"] == "function_call_output")
        .map(|i| match &i["output"] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        });
    (texts, tool)
}

/// The user texts of a Messages request (tool results left out), and the last tool
/// result when the newest user message carries one.
fn messages_turn(body: &Value) -> (Vec<String>, Option<String>) {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let mut texts = Vec::new();
    for m in messages.iter().filter(|m| m["role"] == "user") {
        let t = text_of(&m["content"]);
        if !t.is_empty() {
            texts.push(t);
        }
    }
    // A tool's result after the model's last message: the turn goes on with text. (A
    // message the user sent meanwhile may follow it, as a `system` message.)
    let after = messages
        .iter()
        .rposition(|m| m["role"] == "assistant")
        .map_or(0, |i| i + 1);
    let tool = messages[after.min(messages.len())..].iter().find_map(|m| {
        m["content"].as_array()?.iter().rev().find_map(|p| {
            (p["type"] == "tool_result").then(|| match &p["content"] {
                Value::String(s) => s.clone(),
                other => text_of(other),
            })
        })
    });
    (texts, tool)
}

/// The script of a turn whose newest user text is `last`.
fn choose(shared: &Shared, last: &str, tool_output: bool) -> Script {
    if tool_output {
        return Script::AfterTool;
    }
    let Some((name, n)) = marker(last) else {
        return Script::Text;
    };
    match name.as_str() {
        "slow" => Script::Slow,
        "tool" => Script::Tool,
        "cut" => Script::Cut,
        "hang" => Script::Hang,
        "e500" => {
            let mut attempts = shared
                .attempts
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let seen = attempts.entry(format!("e500 {last}")).or_insert(0);
            *seen += 1;
            let limit = n.unwrap_or(1);
            if *seen <= limit {
                Script::Error500(limit)
            } else {
                Script::Text
            }
        }
        _ => Script::Text,
    }
}

struct Request {
    method: String,
    path: String,
    body: Vec<u8>,
}

fn read_request(reader: &mut BufReader<TcpStream>) -> Option<Request> {
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_owned();
    let path = parts.next()?.to_owned();
    let mut length = 0usize;
    let mut chunked = false;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).ok()? == 0 {
            return None;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
            if k == "content-length" {
                length = v.parse().ok()?;
            } else if k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked") {
                chunked = true;
            }
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).ok()?;
            let n = usize::from_str_radix(size.trim(), 16).ok()?;
            if n == 0 {
                let mut end = String::new();
                reader.read_line(&mut end).ok()?;
                break;
            }
            if body.len() + n > MAX_BODY {
                return None;
            }
            let start = body.len();
            body.resize(start + n, 0);
            reader.read_exact(&mut body[start..]).ok()?;
            let mut crlf = [0u8; 2];
            reader.read_exact(&mut crlf).ok()?;
        }
    } else {
        if length > MAX_BODY {
            return None;
        }
        body.resize(length, 0);
        reader.read_exact(&mut body).ok()?;
    }
    Some(Request { method, path, body })
}

fn serve(stream: TcpStream, shared: &Shared) {
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    // Without the timeout a silent client holds this thread until it closes; the
    // request is still served, so a failure here is said and the connection goes on.
    if let Err(e) = stream.set_read_timeout(Some(Duration::from_secs(60))) {
        eprintln!("scripted-model: no read timeout on a connection: {e}");
    }
    let mut reader = BufReader::new(read_half);
    let mut out = stream;
    // One request per connection: the reply ends with `Connection: close`.
    let Some(request) = read_request(&mut reader) else {
        // The client sent no request it could read; if it cannot read the refusal
        // either, there is nobody left to tell.
        if let Err(e) = respond_json(&mut out, 400, &json!({"error": {"message": "bad request"}})) {
            eprintln!("scripted-model: a refusal was not written: {e}");
        }
        return;
    };
    // A reply cut short: the agent left (a stream it gave up on, a hang it stopped) or
    // cannot be written to. Said, since the test that drives it may be waiting for it.
    if let Err(e) = answer(&mut out, &mut reader, shared, &request) {
        eprintln!(
            "scripted-model: the reply to {} was not written whole: {e}",
            request.path
        );
    }
}

/// Answers one request: a refusal for what is not served, the script's reply otherwise.
fn answer(
    out: &mut TcpStream,
    reader: &mut BufReader<TcpStream>,
    shared: &Shared,
    request: &Request,
) -> std::io::Result<()> {
    let path = request
        .path
        .split('?')
        .next()
        .unwrap_or_default()
        .to_owned();
    let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
    let api = if path.ends_with("/responses") {
        Api::Responses
    } else if path.ends_with("/messages") {
        Api::Messages
    } else {
        Api::Other
    };
    if request.method != "POST" || api == Api::Other {
        log(shared, api, &request.path, body.clone(), None);
        if path.ends_with("/count_tokens") {
            return respond_json(out, 200, &json!({"input_tokens": 42}));
        }
        return respond_json(
            out,
            404,
            &json!({"type": "error", "error": {"type": "not_found_error", "message": "not served by the scripted model"}}),
        );
    }
    let (texts, tool) = match api {
        Api::Responses => responses_turn(&body),
        _ => messages_turn(&body),
    };
    let last = texts.last().cloned().unwrap_or_default();
    let script = choose(shared, &last, tool.is_some());
    let streamed = api == Api::Responses || body["stream"].as_bool().unwrap_or(false);
    let body_kept = body.clone();
    log(shared, api, &request.path, body, Some(script.clone()));
    let n = shared.next.fetch_add(1, Ordering::SeqCst) + 1;
    let reply = match (&script, &tool) {
        (Script::AfterTool, Some(out)) => format!("The command printed: {}", words(out)),
        _ => format!("Reply to: {}", words(&last)),
    };
    if let Script::Error500(_) = script {
        return respond_json(
            out,
            500,
            &json!({"type": "error", "error": {"type": "api_error", "message": "scripted 500"}}),
        );
    }
    if !streamed {
        // Claude Code's non-streaming fallback, or a side request: one whole message.
        return respond_json(
            out,
            200,
            &json!({"id": format!("msg_{n}"), "type": "message", "role": "assistant",
                    "model": "scripted", "stop_reason": "end_turn", "stop_sequence": null,
                    "content": [{"type": "text", "text": reply}],
                    "usage": {"input_tokens": 5, "output_tokens": 2}}),
        );
    }
    let events = match api {
        Api::Responses => responses_events(n, &script, &reply, &body_kept),
        _ => messages_events(n, &script, &reply),
    };
    stream_events(out, reader, &script, &events)
}

fn log(shared: &Shared, api: Api, path: &str, body: Value, script: Option<Script>) {
    shared
        .requests
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(Logged {
            api,
            path: path.to_owned(),
            body,
            script,
        });
}

fn respond_json(out: &mut TcpStream, status: u16, body: &Value) -> std::io::Result<()> {
    let text = body.to_string();
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        500 => "Internal Server Error",
        _ => "Bad Request",
    };
    write!(
        out,
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\nrequest-id: req_scripted\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
        text.len()
    )?;
    out.flush()
}

fn sse(name: &str, data: &Value) -> Vec<u8> {
    format!("event: {name}\ndata: {data}\n\n").into_bytes()
}

fn pieces(text: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let size = chars.len().div_ceil(n.max(1)).max(1);
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

fn responses_usage() -> Value {
    json!({"input_tokens": 100, "input_tokens_details": {"cached_tokens": 0},
           "output_tokens": 20, "output_tokens_details": {"reasoning_tokens": 0},
           "total_tokens": 120})
}

/// The command a `[[tool]]` turn runs.
const TOOL_COMMAND: &str = "touch scripted-model-ran.txt && echo ran";

/// The shell tool a Responses request offers, and the arguments that run
/// [`TOOL_COMMAND`] through it (Codex names and shapes it differently by version).
fn shell_call(body: &Value) -> (String, String) {
    let names: Vec<&str> = body["tools"]
        .as_array()
        .map(|t| {
            t.iter()
                .filter_map(|t| t["name"].as_str().or_else(|| t["type"].as_str()))
                .collect()
        })
        .unwrap_or_default();
    let (name, args) = if names.contains(&"exec_command") {
        ("exec_command", json!({"cmd": TOOL_COMMAND}))
    } else if names.contains(&"shell") {
        ("shell", json!({"command": ["bash", "-lc", TOOL_COMMAND]}))
    } else {
        ("shell_command", json!({"command": TOOL_COMMAND}))
    };
    (name.to_owned(), args.to_string())
}

/// The Responses events of a script.
fn responses_events(n: u64, script: &Script, reply: &str, body: &Value) -> Vec<Vec<u8>> {
    let created = sse(
        "response.created",
        &json!({"type": "response.created", "response": {"id": format!("resp_{n}")}}),
    );
    let completed = sse(
        "response.completed",
        &json!({"type": "response.completed",
                "response": {"id": format!("resp_{n}"), "usage": responses_usage()}}),
    );
    if *script == Script::Tool {
        let (name, arguments) = shell_call(body);
        let item = json!({"type": "function_call", "id": format!("fc_{n}"),
            "call_id": format!("call_{n}"), "name": name,
            "arguments": arguments, "status": "completed"});
        let mut added = item.clone();
        added["arguments"] = json!("");
        added["status"] = json!("in_progress");
        return vec![
            created,
            sse(
                "response.output_item.added",
                &json!({"type": "response.output_item.added", "output_index": 0, "item": added}),
            ),
            sse(
                "response.output_item.done",
                &json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
            ),
            completed,
        ];
    }
    let id = format!("msg_{n}");
    let count = if *script == Script::Slow { 8 } else { 3 };
    let mut events = vec![
        created,
        sse(
            "response.output_item.added",
            &json!({"type": "response.output_item.added", "output_index": 0,
                    "item": {"type": "message", "id": id, "role": "assistant",
                             "status": "in_progress", "content": []}}),
        ),
    ];
    for p in pieces(reply, count) {
        events.push(sse(
            "response.output_text.delta",
            &json!({"type": "response.output_text.delta", "item_id": id, "output_index": 0,
                    "content_index": 0, "delta": p}),
        ));
    }
    events.push(sse(
        "response.output_item.done",
        &json!({"type": "response.output_item.done", "output_index": 0,
                "item": {"type": "message", "id": id, "role": "assistant", "status": "completed",
                         "content": [{"type": "output_text", "text": reply, "annotations": []}]}}),
    ));
    events.push(completed);
    events
}

/// The Messages events of a script.
fn messages_events(n: u64, script: &Script, reply: &str) -> Vec<Vec<u8>> {
    let start = sse(
        "message_start",
        &json!({"type": "message_start", "message": {
            "id": format!("msg_{n}"), "type": "message", "role": "assistant", "model": "scripted",
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 10, "output_tokens": 1,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}}),
    );
    let block_start = |index: u64, block: Value| {
        sse(
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": block}),
        )
    };
    let block_stop = |index: u64| {
        sse(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": index}),
        )
    };
    let text_delta = |index: u64, text: &str| {
        sse(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": index,
                    "delta": {"type": "text_delta", "text": text}}),
        )
    };
    let end = |reason: &str| {
        vec![
            sse(
                "message_delta",
                &json!({"type": "message_delta",
                        "delta": {"stop_reason": reason, "stop_sequence": null},
                        "usage": {"output_tokens": 5}}),
            ),
            sse("message_stop", &json!({"type": "message_stop"})),
        ]
    };
    let mut events = vec![start];
    if *script == Script::Tool {
        events.push(block_start(0, json!({"type": "text", "text": ""})));
        events.push(text_delta(0, "Running it."));
        events.push(block_stop(0));
        events.push(block_start(
            1,
            json!({"type": "tool_use", "id": format!("toolu_scripted_{n}"), "name": "Bash", "input": {}}),
        ));
        let input = json!({"command": TOOL_COMMAND, "description": "Make a file"}).to_string();
        let half = input.len() / 2;
        for piece in [&input[..half], &input[half..]] {
            events.push(sse(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": 1,
                        "delta": {"type": "input_json_delta", "partial_json": piece}}),
            ));
        }
        events.push(block_stop(1));
        events.extend(end("tool_use"));
        return events;
    }
    let count = if *script == Script::Slow { 8 } else { 3 };
    events.push(block_start(0, json!({"type": "text", "text": ""})));
    for p in pieces(reply, count) {
        events.push(text_delta(0, &p));
    }
    events.push(block_stop(0));
    events.extend(end("end_turn"));
    events
}

fn chunk(out: &mut TcpStream, data: &[u8]) -> std::io::Result<()> {
    write!(out, "{:x}\r\n", data.len())?;
    out.write_all(data)?;
    out.write_all(b"\r\n")?;
    out.flush()
}

/// True when the client closed its end.
fn client_gone(reader: &mut BufReader<TcpStream>) -> bool {
    let s = reader.get_ref();
    if s.set_read_timeout(Some(Duration::from_millis(200)))
        .is_err()
    {
        return true;
    }
    let mut one = [0u8; 1];
    match s.peek(&mut one) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

/// The end of a connection this side closes: one the client closed first is closed
/// already, anything else is an error to say.
fn closed(shutdown: std::io::Result<()>) -> std::io::Result<()> {
    match shutdown {
        Err(e) if e.kind() == std::io::ErrorKind::NotConnected => Ok(()),
        other => other,
    }
}

fn stream_events(
    out: &mut TcpStream,
    reader: &mut BufReader<TcpStream>,
    script: &Script,
    events: &[Vec<u8>],
) -> std::io::Result<()> {
    write!(
        out,
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nrequest-id: req_scripted\r\nx-request-id: req_scripted\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    )?;
    match script {
        Script::Hang => {
            if let Some(first) = events.first() {
                chunk(out, first)?;
            }
            let began = Instant::now();
            while began.elapsed() < HANG_MAX && !client_gone(reader) {}
            return closed(out.shutdown(Shutdown::Both));
        }
        Script::Cut => {
            let half = events.len() / 2;
            for e in &events[..half] {
                chunk(out, e)?;
            }
            // No last chunk: the stream breaks off.
            return closed(out.shutdown(Shutdown::Both));
        }
        _ => {}
    }
    for e in events {
        chunk(out, e)?;
        let delta = e.starts_with(b"event: response.output_text.delta")
            || e.starts_with(b"event: content_block_delta");
        if *script == Script::Slow && delta {
            std::thread::sleep(SLOW_STEP);
        }
    }
    out.write_all(b"0\r\n\r\n")?;
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_are_read_with_their_number() {
        assert_eq!(marker("go [[slow]] now"), Some(("slow".into(), None)));
        assert_eq!(marker("[[e500:3]]"), Some(("e500".into(), Some(3))));
        assert_eq!(marker("no marker"), None);
        assert_eq!(marker("[[bad name]]"), None);
        assert_eq!(words("  say [[slow]]  hi  "), "say hi");
    }

    #[test]
    fn pieces_cover_the_text_in_order() {
        for text in ["", "a", "Reply to: hello", "ünïcödé text"] {
            for n in [1, 3, 8] {
                assert_eq!(pieces(text, n).concat(), text);
                assert!(pieces(text, n).len() <= n.max(1));
            }
        }
    }
}
