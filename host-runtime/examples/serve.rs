//! A host a browser or a phone connects to: the WebSocket server of `host_runtime::server`
//! on loopback, over a SQLite file, with the scripted in-process agent
//! (`scripted_model::echo::EchoAgent`: write `slow ...` for a reply that streams,
//! `approve ...` for an approval card, anything else for an echo). It prints the page's
//! address and a pairing code, and stops by itself after ten minutes (`--minutes N`).
//!
//! ```sh
//! cargo run -p host-runtime --features server --example serve
//! ```
//!
//! Over TLS (`https://`, `wss://`) with a PEM certificate chain and its key:
//!
//! ```sh
//! cargo run -p host-runtime --features tls --example serve -- --tls cert.pem key.pem
//! ```
//!
//! The page's timeline is `timeline-wasm` built for wasm32 (the example builds it into
//! `target/wasm-page`; `rustup target add wasm32-unknown-unknown`).

use std::path::PathBuf;
use std::time::Duration;

use host_core::{Host, HostConfig};
use host_runtime::server::{Devices, Server, ServerConfig};
use host_runtime::Runtime;
use outbox_core::adapter::Capabilities;
use outbox_core::SessionInfo;
use overlay_core::{MemorySource, SourceKind};
use storage_sqlite::{Settings, SqliteStore};
use timeline_core::{BoundaryToken, HostKey, SessionId};

type Error = Box<dyn std::error::Error>;

struct Args {
    minutes: u64,
    /// The certificate chain and key files.
    tls: Option<(PathBuf, PathBuf)>,
}

fn args() -> Result<Args, Error> {
    let mut args = Args {
        minutes: 10,
        tls: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match (flag.as_str(), it.next()) {
            ("--minutes", Some(n)) => args.minutes = n.parse()?,
            ("--tls", Some(cert)) => {
                let key = it.next().ok_or("--tls needs CERT KEY")?;
                args.tls = Some((cert.into(), key.into()));
            }
            _ => return Err("usage: serve [--minutes N] [--tls CERT KEY]".into()),
        }
    }
    Ok(args)
}

#[cfg(feature = "tls")]
fn with_tls(config: ServerConfig, tls: Option<(PathBuf, PathBuf)>) -> Result<ServerConfig, Error> {
    let Some((cert, key)) = tls else {
        return Ok(config);
    };
    let tls = host_runtime::tls::TlsConfig::from_pem(&std::fs::read(cert)?, &std::fs::read(key)?)?;
    Ok(config.tls(tls))
}

#[cfg(not(feature = "tls"))]
fn with_tls(config: ServerConfig, tls: Option<(PathBuf, PathBuf)>) -> Result<ServerConfig, Error> {
    match tls {
        None => Ok(config),
        Some(_) => Err("--tls needs the example built with --features tls".into()),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let Args { minutes, tls } = args()?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let wasm = scripted_model::wasm::timeline_wasm()?;
    let dir = std::env::temp_dir().join(format!("custody-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path: PathBuf = dir.join("custody.sqlite");
    let session = SessionId::new("s1")?;
    let mut n = 0u64;
    let uuids = Box::new(move || {
        n += 1;
        format!("00000000-0000-4000-8000-{n:012x}")
    });
    let mut host = Host::new(
        SqliteStore::open(&path, Settings::default())?,
        SqliteStore::open(&path, Settings::default())?,
        HostConfig::new(HostKey::from_bytes([42; 32]), uuids),
    );
    let history = MemorySource::new(
        SourceKind::Codex {
            thread_id: "thread-1".into(),
            generation: 1,
        },
        BoundaryToken::codex_rollout("/sessions/rollout-1.jsonl"),
    );
    host.add_session(
        &session,
        SessionInfo::new(Capabilities::codex()),
        Box::new(history),
    );
    // A client may ask for a new session (`run.chatNewSession`, an ACP client's second
    // `session/new`): `s2`, `s3`, ... with no saved history; the echo agent serves
    // every session.
    let mut made = 1u64;
    let maker = move |request: &host_core::NewSession,
                      host: &mut Host<SqliteStore, SqliteStore>,
                      _: &mut host_runtime::Agents<'_>|
          -> Result<SessionId, String> {
        made += 1;
        let session = SessionId::new(format!("s{made}")).map_err(|e| e.to_string())?;
        let history = MemorySource::new(
            SourceKind::Codex {
                thread_id: format!("thread-{made}"),
                generation: 1,
            },
            BoundaryToken::codex_rollout(&format!("/sessions/rollout-{made}.jsonl")),
        );
        let mut info = SessionInfo::new(Capabilities::codex());
        info.cwd = request.cwd.clone();
        host.add_session(&session, info, Box::new(history));
        Ok(session)
    };
    let mut runtime = Runtime::builder(host)
        .agent(scripted_model::echo::EchoAgent::new())
        .sessions(maker)
        .start()?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let server = Server::start(
        &mut runtime,
        listener,
        with_tls(ServerConfig::default().page(wasm), tls)?,
        Devices::default(),
        None,
    )
    .await?;
    println!("database:     {}", path.display());
    println!(
        "open:         {scheme}://{}/?session=s1",
        server.local_addr()
    );
    println!(
        "pairing code: {} (single use, five minutes)",
        server.pairing_code()?
    );
    println!("stops in {minutes} minutes (or Ctrl-C)");
    tokio::select! {
        () = tokio::time::sleep(Duration::from_secs(minutes * 60)) => {}
        r = tokio::signal::ctrl_c() => r?,
    }
    println!(
        "paired devices: {}; connections: {}",
        server.devices().list().len(),
        server.stats().connections
    );
    server.shutdown().await?;
    runtime.shutdown().await?;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
