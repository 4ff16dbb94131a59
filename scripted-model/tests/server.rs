//! The scripted model answers over real sockets as each script says.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use scripted_model::{Api, ModelServer, Script};
use serde_json::{json, Value};

fn post(server: &ModelServer, path: &str, body: &Value) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", server.port())).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let text = body.to_string();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{text}",
        text.len()
    )
    .expect("write");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, out)
}

/// The text the stream's deltas make.
fn streamed_text(body: &str) -> String {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| match v["type"].as_str() {
            Some("content_block_delta") => v["delta"]["text"].as_str().map(str::to_owned),
            Some("response.output_text.delta") => v["delta"].as_str().map(str::to_owned),
            _ => None,
        })
        .collect()
}

fn responses(text: &str) -> Value {
    json!({"model": "m", "stream": true, "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}]})
}

fn messages(text: &str) -> Value {
    json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": text}]})
}

#[test]
fn a_text_turn_streams_deltas_that_make_the_reply_on_both_apis() {
    let server = ModelServer::start().expect("start");
    let (status, body) = post(&server, "/v1/responses", &responses("hello there"));
    assert_eq!(status, 200);
    assert!(body.contains("event: response.output_text.delta"));
    assert!(body.contains("event: response.completed"));
    assert_eq!(streamed_text(&body), "Reply to: hello there");
    let (status, body) = post(&server, "/v1/messages?beta=true", &messages("hi [[text]]"));
    assert_eq!(status, 200);
    assert!(body.contains("event: content_block_delta"));
    assert!(body.contains("event: message_stop"));
    let turns = server.turns();
    assert_eq!(turns.len(), 2);
    assert_eq!(turns[0].api, Api::Responses);
    assert_eq!(turns[1].api, Api::Messages);
    assert_eq!(turns[1].script, Some(Script::Text));
}

#[test]
fn an_error_script_fails_n_times_then_answers() {
    let server = ModelServer::start().expect("start");
    let body = responses("try [[e500:2]]");
    assert_eq!(post(&server, "/v1/responses", &body).0, 500);
    assert_eq!(post(&server, "/v1/responses", &body).0, 500);
    assert_eq!(post(&server, "/v1/responses", &body).0, 200);
}

#[test]
fn a_tool_turn_asks_for_a_shell_call_and_its_output_gets_text() {
    let server = ModelServer::start().expect("start");
    let (_, body) = post(&server, "/v1/messages", &messages("[[tool]]"));
    assert!(body.contains("\"tool_use\""), "{body}");
    assert!(body.contains("\"stop_reason\":\"tool_use\""), "{body}");
    let follow = json!({"model": "m", "stream": true, "messages": [
        {"role": "user", "content": "[[tool]]"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "Bash", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ran"}]}]});
    let (_, body) = post(&server, "/v1/messages", &follow);
    assert_eq!(streamed_text(&body), "The command printed: ran");
    let (_, body) = post(&server, "/v1/responses", &responses("[[tool]]"));
    assert!(body.contains("\"function_call\""), "{body}");
}

#[test]
fn a_cut_stream_has_no_end_and_a_hang_ends_when_the_client_leaves() {
    let server = ModelServer::start().expect("start");
    let (status, body) = post(&server, "/v1/responses", &responses("[[cut]]"));
    assert_eq!(status, 200);
    assert!(!body.contains("response.completed"));
    assert!(!body.ends_with("0\r\n\r\n"));
    // A hang: the first event comes; the client gives up after a second.
    let mut s = TcpStream::connect(("127.0.0.1", server.port())).expect("connect");
    let text = messages("[[hang]]").to_string();
    write!(
        s,
        "POST /v1/messages HTTP/1.1\r\ncontent-length: {}\r\n\r\n{text}",
        text.len()
    )
    .expect("write");
    s.set_read_timeout(Some(Duration::from_secs(1)))
        .expect("timeout");
    let mut buf = vec![0u8; 4096];
    let n = s.read(&mut buf).expect("the first event");
    assert!(String::from_utf8_lossy(&buf[..n]).contains("200 OK"));
    drop(s);
    drop(server); // stops, with the hang's connection gone
}
