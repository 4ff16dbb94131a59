//! The server over TLS (feature `tls`) with a self-signed certificate made for the test:
//! pairing over `https://` and the wire over `wss://` work; a plain-HTTP client on the
//! TLS port gets no answer while TLS clients are served; a client that connects and says
//! nothing holds up no one; a certificate or key that cannot be used is a typed error.
#![cfg(feature = "tls")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod page;

use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use host_runtime::server::{Server, ServerConfig};
use host_runtime::tls::{TlsConfig, TlsError};
use host_runtime::Runtime;
use page::serve;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use tokio_tungstenite::tungstenite::Message;

struct Cert {
    pem: String,
    key: String,
    der: CertificateDer<'static>,
}

fn cert() -> Cert {
    let c = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    Cert {
        pem: c.cert.pem(),
        key: c.signing_key.serialize_pem(),
        der: c.cert.der().clone(),
    }
}

/// A server over TLS with a new certificate, over a session with `history` saved rows.
async fn tls_server(history: usize) -> (Cert, Runtime, Server, Arc<AtomicUsize>) {
    let cert = cert();
    let config = TlsConfig::from_pem(cert.pem.as_bytes(), cert.key.as_bytes()).unwrap();
    let (runtime, server, sends) = serve(ServerConfig::default().tls(config), history).await;
    (cert, runtime, server, sends)
}

fn connector(cert: &Cert) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    TlsConnector::from(Arc::new(config))
}

async fn tls(addr: SocketAddr, cert: &Cert) -> TlsStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    tokio::time::timeout(Duration::from_secs(3), connector(cert).connect(name, tcp))
        .await
        .expect("the handshake took 3 s (less than the server's deadline for the silent client)")
        .unwrap()
}

/// One HTTP request on `stream`; what came back until the server closed.
async fn http(mut stream: impl AsyncRead + AsyncWrite + Unpin, head: &str, body: &str) -> String {
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    // A peer that closes without TLS's close_notify ends the read with an error; what
    // it sent before still counts.
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out)).await;
    assert!(read.is_ok(), "no end of the answer in 10 s");
    String::from_utf8_lossy(&out).into_owned()
}

fn pair_request(addr: SocketAddr, code: &str) -> (String, String) {
    let body = json!({ "code": code, "deviceName": "phone" }).to_string();
    let head = format!(
        "POST /pair HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    (head, body)
}

async fn pair_over_tls(addr: SocketAddr, cert: &Cert, code: &str) -> String {
    let (head, body) = pair_request(addr, code);
    let answer = http(tls(addr, cert).await, &head, &body).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let json: Value = serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    json["token"].as_str().unwrap().to_owned()
}

// SV-05: a phone pairs over https:// and joins the session over wss://.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pairing_and_the_wire_work_over_tls() {
    let (cert, runtime, server, _) = tls_server(2).await;
    let addr = server.local_addr();
    let token = pair_over_tls(addr, &cert, &server.pairing_code().unwrap()).await;
    let url = format!("wss://localhost:{}/ws?token={token}", addr.port());
    let (mut ws, _) = tokio_tungstenite::client_async(url, tls(addr, &cert).await)
        .await
        .unwrap();
    let join = json!({ "jsonrpc": "2.0", "id": 1, "method": "run.chatJoin",
        "params": { "appSessionId": "s1" } });
    ws.send(Message::Text(join.to_string().into()))
        .await
        .unwrap();
    let load = json!({ "jsonrpc": "2.0", "id": 2, "method": "run.chatLoad",
        "params": { "appSessionId": "s1", "pageSize": 10 } });
    ws.send(Message::Text(load.to_string().into()))
        .await
        .unwrap();
    let loaded = loop {
        let msg = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("no answer in 10 s");
        let Some(Ok(Message::Text(t))) = msg else {
            panic!("the socket ended: {msg:?}");
        };
        let v: Value = serde_json::from_str(&t).unwrap();
        assert!(v.get("error").is_none(), "{v}");
        if v["id"] == 2 {
            break v;
        }
    };
    let texts: Vec<&str> = loaded["result"]["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["data"]["text"].as_str())
        .collect();
    assert_eq!(texts, vec!["saved reply 0", "saved reply 1"]);
    drop(ws);
    drop(server);
    runtime.shutdown().await.unwrap();
}

// SV-05: the TLS port speaks only TLS. A plain-HTTP client gets no HTTP answer (its
// connection ends), and a client that connects and sends nothing does not hold up a TLS
// client's pairing behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_and_silent_clients_hold_up_no_one() {
    let (cert, runtime, server, _) = tls_server(0).await;
    let addr = server.local_addr();
    let silent = TcpStream::connect(addr).await.unwrap();
    let code = server.pairing_code().unwrap();
    let (head, body) = pair_request(addr, &code);
    let plain = http(TcpStream::connect(addr).await.unwrap(), &head, &body).await;
    assert!(
        !plain.contains("HTTP/1.1"),
        "plain HTTP was answered: {plain}"
    );
    // The code was not spent by the refused request: the TLS client pairs with it,
    // while the silent connection is still open.
    let token = pair_over_tls(addr, &cert, &code).await;
    assert_eq!(token.len(), 64);
    drop(silent);
    drop(server);
    runtime.shutdown().await.unwrap();
}

// SV-05: a certificate and key that cannot serve are refused before the server starts,
// each with its own error.
#[test]
fn unusable_certificates_are_typed_errors() {
    let good = cert();
    let other = cert();
    assert!(matches!(
        TlsConfig::from_pem(b"", good.key.as_bytes()),
        Err(TlsError::NoCertificate)
    ));
    assert!(matches!(
        TlsConfig::from_pem(good.pem.as_bytes(), b"not a key"),
        Err(TlsError::Pem(_))
    ));
    let broken = good.pem.replace("MII", "M!I");
    assert!(matches!(
        TlsConfig::from_pem(broken.as_bytes(), good.key.as_bytes()),
        Err(TlsError::Pem(_))
    ));
    assert!(matches!(
        TlsConfig::from_pem(good.pem.as_bytes(), other.key.as_bytes()),
        Err(TlsError::Refused(_))
    ));
    assert!(TlsConfig::from_pem(good.pem.as_bytes(), good.key.as_bytes()).is_ok());
}

// SV-05, AG-04: the ACP face reaches a host over wss://, trusting the certificate given
// with --ca; without --ca it refuses to start rather than connect unverified.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_acp_face_sends_over_wss() {
    use std::process::Stdio;
    use tokio::io::{AsyncBufReadExt, BufReader};

    const FACE: &str = env!("CARGO_BIN_EXE_custody-acp");
    let (cert, runtime, server, sends) = tls_server(0).await;
    let addr = server.local_addr();
    let token = pair_over_tls(addr, &cert, &server.pairing_code().unwrap()).await;
    let url = format!("wss://localhost:{}/ws?token={token}", addr.port());

    let unverified = tokio::process::Command::new(FACE)
        .args(["--url", &url, "--session", "s1"])
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    assert!(!unverified.status.success());
    let said = String::from_utf8_lossy(&unverified.stderr);
    assert!(said.contains("--ca"), "{said}");

    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("cert.pem");
    std::fs::write(&ca, &cert.pem).unwrap();
    let mut child = tokio::process::Command::new(FACE)
        .args(["--url", &url, "--session", "s1", "--ca"])
        .arg(&ca)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for line in [
        json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": { "protocolVersion": 1, "clientCapabilities": {} } }),
        json!({ "jsonrpc": "2.0", "id": 2, "method": "session/new",
            "params": { "cwd": "/", "mcpServers": [] } }),
        json!({ "jsonrpc": "2.0", "id": 3, "method": "session/prompt",
            "params": { "sessionId": "s1", "prompt": [{ "type": "text", "text": "over tls" }] } }),
    ] {
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap();
    }
    let mut reply = String::new();
    let end = loop {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("nothing from the face in 30 s")
            .unwrap()
            .expect("the face ended");
        let v: Value = serde_json::from_str(&line).unwrap();
        if let Some(t) = v["params"]["update"]["content"]["text"].as_str() {
            reply.push_str(t);
        }
        if v["id"] == 3 {
            break v;
        }
    };
    assert_eq!(end["result"]["stopReason"], "end_turn", "{end}");
    assert_eq!(reply, "echo: over tls");
    assert_eq!(sends.load(std::sync::atomic::Ordering::SeqCst), 1);
    child.kill().await.unwrap();
    drop(server);
    runtime.shutdown().await.unwrap();
}
