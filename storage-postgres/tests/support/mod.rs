//! A PostgreSQL server for the tests, and a schema of its own for each test.
//!
//! `DATABASE_URL` when it is set (any server of PostgreSQL 13 or newer the tests may
//! create schemas on). Otherwise a private throwaway cluster, started once per test
//! binary and shared by its tests, from the server binaries installed on the machine:
//! `initdb` and `pg_ctl` on `PATH`, or the newest `/usr/lib/postgresql/*/bin`. The
//! cluster lives in a temporary directory with its own Unix socket directory and a free
//! port, listens on no TCP address, and runs as an unprivileged user when the tests run
//! as root (PostgreSQL refuses to run as root): `postgres` if that user exists, else
//! `nobody`. A guardian process holds the read end of a pipe whose write end only this
//! process has: when the test binary exits, however it exits, the guardian stops the
//! cluster and removes the directory.
//!
//! When neither is possible the tests fail with a message saying what to install; they
//! are never skipped.
#![allow(dead_code, clippy::unwrap_used)]

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

use storage_postgres::{ConnectOptions, PostgresStore, Settings};

/// What to do when there is no server.
const INSTALL: &str = "the PostgreSQL tests need a server: set DATABASE_URL to a database of \
    PostgreSQL 13 or newer where they may create schemas (postgres://user:password@host/db), \
    or install the PostgreSQL server binaries so that initdb and pg_ctl are on PATH or under \
    /usr/lib/postgresql/<version>/bin (Debian and Ubuntu: apt-get install postgresql)";

/// The server the tests of this binary share, or a private cluster of one test file.
pub struct Server {
    /// Connection parameters without a schema (a URL or key=value pairs).
    pub url: String,
    /// Private clusters started with [`Cluster::tcp`]: the port on 127.0.0.1.
    pub tcp_port: Option<u16>,
    /// Private clusters: the guardian's pipe, held open until the process exits (or
    /// the server is dropped).
    guardian: Option<Mutex<ChildStdin>>,
    /// Private clusters: where the cluster lives.
    pub root: Option<PathBuf>,
}

/// What a private cluster starts with beyond the defaults of [`server`].
#[derive(Default)]
pub struct Cluster {
    /// Listen on 127.0.0.1 too (the server offers TLS only over TCP).
    pub tcp: bool,
    /// Files written into the data directory before the start, readable only by the
    /// cluster's user (as PostgreSQL wants a key file): name and content.
    pub files: Vec<(&'static str, Vec<u8>)>,
    /// More server settings, `name=value`.
    pub settings: Vec<String>,
}

static SERVER: OnceLock<Result<Server, String>> = OnceLock::new();
static SCHEMAS: AtomicU32 = AtomicU32::new(0);

/// The shared server, started on first use; panics with [`INSTALL`] when there is none.
pub fn server() -> &'static Server {
    match SERVER.get_or_init(start) {
        Ok(server) => server,
        Err(why) => panic!("{why}"),
    }
}

fn start() -> Result<Server, String> {
    if let Ok(url) = std::env::var("DATABASE_URL") {
        if !url.trim().is_empty() {
            let mut client = postgres::Client::connect(&url, postgres::NoTls).map_err(|e| {
                format!("DATABASE_URL is set but the server refused: {}", chain(&e))
            })?;
            check_version(&mut client)?;
            return Ok(Server {
                url,
                tcp_port: None,
                guardian: None,
                root: None,
            });
        }
    }
    private_cluster(&Cluster::default())
}

/// An error with its causes, for a message a person reads.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

fn check_version(client: &mut postgres::Client) -> Result<(), String> {
    let row = client
        .query_one("SELECT current_setting('server_version_num')::INT", &[])
        .map_err(|e| e.to_string())?;
    let version: i32 = row.get(0);
    if version < 130000 {
        return Err(format!(
            "the server is version {version}; storage-postgres needs 13 or newer. {INSTALL}"
        ));
    }
    Ok(())
}

/// The directory with `initdb` and `pg_ctl`.
fn binaries() -> Result<PathBuf, String> {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    for dir in on_path {
        if dir.join("initdb").is_file() && dir.join("pg_ctl").is_file() {
            return Ok(dir);
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            (bin.join("initdb").is_file() && bin.join("pg_ctl").is_file()).then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .ok_or_else(|| format!("DATABASE_URL is not set and no initdb was found. {INSTALL}"))
}

/// The uid and gid of `user`, from `id`.
fn ids_of(user: &str) -> Option<(u32, u32)> {
    let id = |flag: &str| -> Option<u32> {
        let out = Command::new("id").args([flag, user]).output().ok()?;
        if !out.status.success() {
            return None;
        }
        String::from_utf8(out.stdout).ok()?.trim().parse().ok()
    };
    Some((id("-u")?, id("-g")?))
}

/// Who runs the cluster: `None` for this process's own user; an unprivileged user when
/// this process is root.
fn cluster_user() -> Result<Option<(u32, u32)>, String> {
    let me = std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .map_err(|e| format!("cannot tell which user runs the tests: {e}"))?;
    if me != 0 {
        return Ok(None);
    }
    ["postgres", "nobody"]
        .iter()
        .find_map(|u| ids_of(u).filter(|(uid, _)| *uid != 0))
        .map(Some)
        .ok_or_else(|| {
            format!(
                "the tests run as root and PostgreSQL refuses to; no unprivileged user \
                 (postgres or nobody) was found to run it as. Create one (useradd postgres) \
                 or set DATABASE_URL. {INSTALL}"
            )
        })
}

/// A command for a PostgreSQL binary, as the cluster's user.
fn as_cluster_user(program: PathBuf, user: Option<(u32, u32)>, root: &Path) -> Command {
    let mut command = Command::new(program);
    command.current_dir(root);
    // Nothing of the caller's PostgreSQL environment reaches the private cluster.
    for (key, _) in std::env::vars_os() {
        if key.to_str().is_some_and(|k| k.starts_with("PG")) {
            command.env_remove(key);
        }
    }
    if let Some((uid, gid)) = user {
        command.uid(uid).gid(gid);
    }
    // Its own process group: a Ctrl-C at the terminal does not reach the server, whose
    // guardian stops it.
    command.process_group(0);
    command
}

fn chown(path: &Path, user: Option<(u32, u32)>) -> Result<(), String> {
    if let Some((uid, gid)) = user {
        std::os::unix::fs::chown(path, Some(uid), Some(gid))
            .map_err(|e| format!("cannot give {} to the cluster's user: {e}", path.display()))?;
    }
    Ok(())
}

fn run(command: &mut Command, what: &str) -> Result<(), String> {
    let out = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {what}: {e}. {INSTALL}"))?;
    if !out.status.success() {
        return Err(format!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// Starts a throwaway cluster from the installed server binaries; it stops and its
/// directory goes when the returned server is dropped or the process exits.
pub fn private_cluster(spec: &Cluster) -> Result<Server, String> {
    let bin = binaries()?;
    let user = cluster_user()?;
    let root = tempfile::Builder::new()
        .prefix("storage-postgres-")
        .tempdir()
        .map_err(|e| format!("cannot make a temporary directory: {e}"))?
        .keep();
    chown(&root, user)?;
    let data = root.join("data");
    let sock = root.join("sock");
    std::fs::create_dir(&sock).map_err(|e| format!("cannot make the socket directory: {e}"))?;
    chown(&sock, user)?;
    // The guardian comes first, so the directory goes whatever happens next.
    let guardian = Command::new("sh")
        .arg("-c")
        .arg(
            r#"cat >/dev/null
               pid=$(head -n 1 "$1/data/postmaster.pid" 2>/dev/null)
               if [ -n "$pid" ]; then
                 kill -INT "$pid" 2>/dev/null
                 n=0
                 while kill -0 "$pid" 2>/dev/null && [ $n -lt 100 ]; do sleep 0.1; n=$((n+1)); done
                 kill -KILL "$pid" 2>/dev/null
               fi
               rm -rf "$1""#,
        )
        .arg("guardian")
        .arg(&root)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start the cluster's guardian (sh): {e}"))?;
    let pipe = guardian.stdin.ok_or("the guardian has no stdin")?;
    run(
        as_cluster_user(bin.join("initdb"), user, &root)
            .arg("-D")
            .arg(&data)
            .args([
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--locale=C",
                "-N",
            ]),
        "initdb",
    )?;
    for (name, content) in &spec.files {
        let path = data.join(name);
        std::fs::write(&path, content)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .map_err(|e| format!("cannot restrict {}: {e}", path.display()))?;
        chown(&path, user)?;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("cannot find a free port: {e}"))?;
    let listen = if spec.tcp { "127.0.0.1" } else { "" };
    let mut options = format!(
        "-k {} -p {port} -c listen_addresses={listen} -c max_connections=200 \
         -c shared_buffers=32MB -c fsync=off -c full_page_writes=off -c synchronous_commit=on",
        sock.display()
    );
    for setting in &spec.settings {
        options.push_str(" -c ");
        options.push_str(setting);
    }
    run(
        as_cluster_user(bin.join("pg_ctl"), user, &root)
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(root.join("server.log"))
            .args(["-w", "-t", "60", "-s", "-o", &options, "start"]),
        "pg_ctl start",
    )
    .map_err(|e| {
        let log = std::fs::read_to_string(root.join("server.log")).unwrap_or_default();
        format!("{e}\nserver log:\n{log}")
    })?;
    let url = format!(
        "host={} port={port} user=postgres dbname=postgres",
        sock.display()
    );
    let mut client = postgres::Client::connect(&url, postgres::NoTls)
        .map_err(|e| format!("the private cluster does not answer: {}", chain(&e)))?;
    check_version(&mut client)?;
    Ok(Server {
        url,
        tcp_port: spec.tcp.then_some(port),
        guardian: Some(Mutex::new(pipe)),
        root: Some(root),
    })
}

/// A schema of its own for one test, dropped when the test ends.
pub struct TestDb {
    /// The schema.
    pub schema: String,
    /// The server's parameters (without the schema).
    pub url: String,
}

impl TestDb {
    /// A fresh empty schema.
    pub fn new(hint: &str) -> TestDb {
        let server = server();
        let n = SCHEMAS.fetch_add(1, Ordering::Relaxed);
        let clean: String = hint
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
            .take(30)
            .collect();
        let schema = format!("t{}_{n}_{clean}", std::process::id()).to_lowercase();
        let mut admin = postgres::Client::connect(&server.url, postgres::NoTls).unwrap();
        admin
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
            ))
            .unwrap();
        TestDb {
            schema,
            url: server.url.clone(),
        }
    }

    /// The driver's connection config of this test's schema (for plain clients).
    pub fn config(&self) -> postgres::Config {
        config_for(&self.url, &self.schema)
    }

    /// The store's connection options for this test's schema.
    pub fn options(&self) -> ConnectOptions {
        ConnectOptions::parse(&self.url)
            .unwrap()
            .options(&format!("-c search_path={}", self.schema))
    }

    /// A store on this test's schema.
    pub fn open(&self) -> PostgresStore {
        PostgresStore::open(self.options(), Settings::default()).unwrap()
    }

    /// A store with `settings`.
    pub fn open_with(&self, settings: Settings) -> PostgresStore {
        PostgresStore::open(self.options(), settings).unwrap()
    }

    /// A plain client on this test's schema.
    pub fn client(&self) -> postgres::Client {
        self.config().connect(postgres::NoTls).unwrap()
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let dropped = postgres::Client::connect(&self.url, postgres::NoTls).and_then(|mut c| {
            c.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema))
        });
        if let Err(e) = dropped {
            eprintln!("schema {} was not dropped: {e}", self.schema);
        }
    }
}

/// `url` with its `search_path` set to `schema`.
pub fn config_for(url: &str, schema: &str) -> postgres::Config {
    let mut config: postgres::Config = url.parse().unwrap();
    config.options(&format!("-c search_path={schema}"));
    config
}

/// Keeps the guardian's pipe referenced (it closes when the process exits).
pub fn guardian_alive() -> bool {
    server()
        .guardian
        .as_ref()
        .is_none_or(|g| g.lock().map(|mut p| p.flush().is_ok()).unwrap_or(false))
}
