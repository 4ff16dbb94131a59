//! One host among several on one PostgreSQL database: the stores write under the
//! cluster keeper's leases, the host serves only the sessions granted to it, the
//! scripted [`several_hosts::LogAgent`] logs what it is given, and the WebSocket server
//! on loopback answers a session served elsewhere with where to go.
//!
//! `cluster-host key=value ...`:
//!
//! - `pg`: the connection parameters (libpq key=value, or a URL), `schema`: the schema;
//! - `host`: the host ID; `log`: the shared log; `token`: the device token clients use;
//! - `sessions` (default 6): sessions `s0` .. `sN-1`, added on every host;
//! - `lease_ms` (default 2000): the session and run lease; `turn_ms` (default 300);
//! - `seconds` (default 300): the host stops by itself after this long.
//!
//! It prints `ready ws://ADDR/ws` once it serves, and stops (giving its leases back)
//! when its standard input closes or says `stop`.

use std::sync::Arc;
use std::time::Duration;

use host_core::{Host, HostConfig};
use host_runtime::cluster::{Cluster, ClusterConfig};
use host_runtime::server::{Devices, Server, ServerConfig};
use host_runtime::{Output, Runtime};
use outbox_core::adapter::Capabilities;
use outbox_core::SessionInfo;
use several_hosts::{LogAgent, LogHistory};
use sha2::{Digest, Sha256};
use storage_postgres::{ConnectOptions, HostId, PostgresStore, Settings};
use timeline_core::{HostKey, Millis, SessionId};
use tokio::io::AsyncBufReadExt;

type Error = Box<dyn std::error::Error + Send + Sync>;

struct Args(std::collections::HashMap<String, String>);

impl Args {
    fn text(&self, key: &str) -> Result<String, Error> {
        self.0
            .get(key)
            .cloned()
            .ok_or_else(|| format!("missing {key}=").into())
    }
    fn number(&self, key: &str, default: u64) -> Result<u64, Error> {
        match self.0.get(key) {
            Some(v) => Ok(v.parse()?),
            None => Ok(default),
        }
    }
}

/// The devices every host knows: one, whose token is `token`.
fn devices(token: &str) -> Result<Devices, Error> {
    let hash: String = Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok(serde_json::from_value(serde_json::json!({
        "devices": { "device-test": {
            "deviceId": "device-test", "name": "test", "pairedAtMs": 0, "tokenSha256": hash,
        }}
    }))?)
}

/// The stores' driver blocks on an async runtime of its own, so the stores are opened
/// outside the server's runtime (the host's runtime runs them outside any, too).
fn main() -> Result<(), Error> {
    let args = Args(
        std::env::args()
            .skip(1)
            .filter_map(|a| a.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
            .collect(),
    );
    let host = args.text("host")?;
    // RUST_LOG=debug (say) shows what the keeper and the host do, on standard error.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let log = args.text("log")?;
    let options = ConnectOptions::parse(&args.text("pg")?)?
        .options(&format!("-c search_path={}", args.text("schema")?));
    let lease = Duration::from_millis(args.number("lease_ms", 2_000)?);
    let mut settings = Settings::default();
    settings.leases.session_lease = lease;
    settings.leases.run_lease = lease;
    // A run another host left is adopted by the session's next owner and reclaimed once
    // it had no activity for this long and its host stopped renewing it: the seed's 45 s
    // would hold a session whose host was killed mid-turn for that long, longer than the
    // tests wait.
    settings.leases.stale_after = lease;
    settings.application_name = host.clone();
    settings.connect_timeout = Duration::from_secs(2);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let address = format!("ws://{}/ws", listener.local_addr()?);
    let connect = {
        let (options, settings) = (options.clone(), settings.clone());
        Box::new(move || PostgresStore::open(options.clone(), settings.clone()))
    };
    let builder = Cluster::builder(connect, ClusterConfig::new(HostId::new(&host)?, &address))?;
    let leases = builder.leases();
    let mut outbox = PostgresStore::open(options.clone(), settings.clone())?;
    outbox.share_leases(&leases);
    outbox.share_runs(HostId::new(&host)?);
    let mut overlays = PostgresStore::open(options, settings)?;
    overlays.share_leases(&leases);

    // Run IDs and attempt bases unique across hosts: the process ID in each.
    let pid = std::process::id();
    let mut n = 0u64;
    let uuids = Box::new(move || {
        n += 1;
        format!("{pid:08x}-0000-4000-8000-{n:012x}")
    });
    // One key for all hosts: a cursor one host sealed opens on another.
    let mut config = HostConfig::new(HostKey::from_bytes([7; 32]), uuids);
    config.granted_only = true;
    let mut core = Host::new(outbox, overlays, config);
    for i in 0..args.number("sessions", 6)? {
        let session = SessionId::new(format!("s{i}"))?;
        let mut info = SessionInfo::new(Capabilities::codex());
        info.access = Some(outbox_core::entry::AccessLevel::FullAccess);
        core.add_session(&session, info, Box::new(LogHistory::new(&log, &session)));
    }
    let turn = Millis(args.number("turn_ms", 300)?);
    let mut runtime = Runtime::builder(core)
        .agent(LogAgent::new(&host, &log, turn))
        .start()?;
    let cluster = Arc::new(builder.start(runtime.client())?);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Output>(256);
    let notices = {
        let host = host.clone();
        rt.spawn(async move {
            while let Some(output) = rx.recv().await {
                if let Output::Notice(notice) = output {
                    eprintln!("{host}: {notice}");
                }
            }
        })
    };
    let config = ServerConfig::default().cluster(Arc::clone(&cluster));
    let devices = devices(&args.text("token")?)?;
    let lifetime = Duration::from_secs(args.number("seconds", 300)?);
    rt.block_on(serve(
        &mut runtime,
        listener,
        config,
        devices,
        tx,
        &host,
        &address,
        lifetime,
    ))?;
    rt.block_on(cluster.shutdown());
    rt.block_on(runtime.shutdown())?;
    notices.abort();
    Ok(())
}

/// Serves until standard input closes or says `stop`, or `lifetime` passed.
#[allow(clippy::too_many_arguments)]
async fn serve(
    runtime: &mut Runtime,
    listener: tokio::net::TcpListener,
    config: ServerConfig,
    devices: Devices,
    outputs: tokio::sync::mpsc::Sender<Output>,
    host: &str,
    address: &str,
    lifetime: Duration,
) -> Result<(), Error> {
    let server = Server::start(runtime, listener, config, devices, Some(outputs)).await?;
    println!("ready {address}");

    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let stopped = async {
        loop {
            match stdin.next_line().await {
                Ok(Some(line)) if line.trim() == "stop" => return,
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return,
            }
        }
    };
    tokio::select! {
        () = stopped => {}
        () = tokio::time::sleep(lifetime) => eprintln!("{host}: stopping after {lifetime:?}"),
    }
    server.shutdown().await?;
    Ok(())
}
