//! TLS (the `tls` feature, which the tests turn on): a private cluster with `ssl = on`
//! and a certificate signed by a CA made here, listening on 127.0.0.1, and a second one
//! without TLS. With TLS required and the test CA as an extra root, the store works and
//! its connections are encrypted, also after a reconnect; another CA, another host's
//! name, a server without TLS and a Unix socket each fail to open with
//! [`OpenError::Tls`], never a panic or a plain connection.
//!
//! These clusters are always private (`DATABASE_URL` is not used: the tests need to
//! choose the server's certificate), started once per test binary from the installed
//! server binaries, and stopped with it like the shared one (`support`).
#![cfg(feature = "tls")]
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::OnceLock;
use std::time::Duration;

use outbox_core::entry::{Controls, MessageRequest, OutboxEntry};
use outbox_core::fingerprint::request_fingerprint;
use outbox_core::ids::{OperationId, QueueId, SessionId};
use outbox_core::store::{OutboxErrorKind, OutboxStore};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use storage_postgres::{
    ConnectOptions, DatabaseErrorKind, OpenError, PostgresStore, Settings, Tls, SCHEMA_VERSION,
};
use support::{private_cluster, Cluster, Server};
use timeline_core::time::Millis;

/// A CA: its certificate as PEM, and what signs with it.
struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn ca(name: &str) -> Ca {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let key = KeyPair::generate().unwrap();
    let pem = params.self_signed(&key).unwrap().pem();
    Ca {
        pem,
        issuer: Issuer::new(params, key),
    }
}

/// A server certificate for `localhost` and 127.0.0.1 signed by `ca`: certificate and
/// key as PEM.
fn server_certificate(ca: &Ca) -> (String, String) {
    let mut params =
        CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// The cluster with TLS, and the PEM of the CA that signed its certificate.
struct TlsServer {
    server: Server,
    ca_pem: String,
}

fn tls_server() -> &'static TlsServer {
    static SERVER: OnceLock<Result<TlsServer, String>> = OnceLock::new();
    let started = SERVER.get_or_init(|| {
        let ca = ca("storage-postgres test CA");
        let (cert, key) = server_certificate(&ca);
        let server = private_cluster(&Cluster {
            tcp: true,
            files: vec![
                ("server.crt", cert.into_bytes()),
                ("server.key", key.into_bytes()),
            ],
            settings: vec![
                "ssl=on".to_owned(),
                "ssl_cert_file=server.crt".to_owned(),
                "ssl_key_file=server.key".to_owned(),
            ],
        })?;
        Ok(TlsServer {
            server,
            ca_pem: ca.pem,
        })
    });
    match started {
        Ok(server) => server,
        Err(why) => panic!("{why}"),
    }
}

fn plain_server() -> &'static Server {
    static SERVER: OnceLock<Result<Server, String>> = OnceLock::new();
    match SERVER.get_or_init(|| {
        private_cluster(&Cluster {
            tcp: true,
            ..Cluster::default()
        })
    }) {
        Ok(server) => server,
        Err(why) => panic!("{why}"),
    }
}

/// `host` on the cluster's TCP port, as the superuser, in a schema of its own.
fn tcp_options(server: &Server, host: &str, schema: &str) -> ConnectOptions {
    let mut admin = postgres::Client::connect(&server.url, postgres::NoTls).unwrap();
    admin
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
        ))
        .unwrap();
    ConnectOptions::new()
        .host(host)
        .port(server.tcp_port.unwrap())
        .user("postgres")
        .dbname("postgres")
        .options(&format!("-c search_path={schema}"))
}

fn settings(tls: Tls, name: &str) -> Settings {
    let mut settings = Settings::default();
    settings.tls = tls;
    settings.application_name = name.to_owned();
    settings.connect_timeout = Duration::from_secs(10);
    settings
}

/// Whether the server shows the connections of `name` encrypted: one bool per
/// connection.
fn encrypted(server: &Server, name: &str) -> Vec<bool> {
    let mut admin = postgres::Client::connect(&server.url, postgres::NoTls).unwrap();
    admin
        .query(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
             WHERE a.application_name = $1",
            &[&name],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

fn submit(store: &mut PostgresStore, n: u32) -> Result<(), outbox_core::store::OutboxError> {
    let session = SessionId::new("s1").unwrap();
    let entry = OutboxEntry::queued(
        QueueId::new(format!("q-{n}")).unwrap(),
        OperationId::new(format!("op-{n}")).unwrap(),
        MessageRequest::text(format!("text {n}"), "composer", Millis(1)),
        Controls::enqueue(),
        0,
    );
    let print = request_fingerprint(&session, &entry.queue_id, &entry.request);
    store.claim(&session, &print, &entry).map(|_| ())
}

/// The TLS failure `opened` must be, with its message.
fn tls_failure(opened: Result<PostgresStore, OpenError>) -> String {
    match opened {
        Err(OpenError::Tls(e)) => {
            assert_eq!(e.kind(), DatabaseErrorKind::Tls, "{e}");
            assert_eq!(e.code(), None);
            e.to_string()
        }
        other => panic!("not a TLS failure: {other:?}"),
    }
}

// With TLS required and the test CA as an extra root (beside the system's roots, or
// alone), the store opens, submits and reads back over an encrypted connection; a
// connection the server closed is opened again with TLS.
#[test]
fn a_required_tls_connection_to_a_private_ca_works_and_reconnects_encrypted() {
    let tls = tls_server();
    let s = SessionId::new("s1").unwrap();
    for (n, trust) in [
        Tls::require().with_extra_roots(&tls.ca_pem),
        Tls::require()
            .with_extra_roots(&tls.ca_pem)
            .without_system_roots(),
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("tls works {n}");
        let options = tcp_options(&tls.server, "127.0.0.1", &format!("tls_works_{n}"));
        let mut store = PostgresStore::open(options, settings(trust, &name)).unwrap();
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        submit(&mut store, 1).unwrap();
        assert_eq!(store.entries(&s).unwrap().len(), 1);
        assert_eq!(encrypted(&tls.server, &name), vec![true]);

        let mut admin = postgres::Client::connect(&tls.server.url, postgres::NoTls).unwrap();
        admin
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
                &[&name],
            )
            .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        if let Err(e) = store.entries(&s) {
            assert_eq!(e.kind(), OutboxErrorKind::Unavailable, "{e}");
        }
        submit(&mut store, 2).unwrap();
        assert_eq!(store.entries(&s).unwrap().len(), 2);
        assert_eq!(encrypted(&tls.server, &name), vec![true]);
    }
}

// The host name is checked: `localhost` is in the certificate too; a name that is not
// fails, even at the right address.
#[test]
fn the_servers_certificate_must_name_the_host() {
    let tls = tls_server();
    let trust = Tls::require().with_extra_roots(&tls.ca_pem);
    let options = tcp_options(&tls.server, "localhost", "tls_localhost");
    let mut store = PostgresStore::open(options, settings(trust.clone(), "tls localhost")).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);

    tcp_options(&tls.server, "127.0.0.1", "tls_wrong_name");
    let wrong = format!(
        "host=wrong-name.invalid hostaddr=127.0.0.1 port={} user=postgres dbname=postgres",
        tls.server.tcp_port.unwrap()
    );
    let opened = PostgresStore::open(wrong.parse().unwrap(), settings(trust, "tls wrong name"));
    let message = tls_failure(opened);
    assert!(message.contains("certificate"), "{message}");
}

// A certificate of another CA does not verify: with a wrong CA as the only root, and
// with the system's roots alone. Nothing is left connected.
#[test]
fn a_certificate_of_another_ca_is_refused() {
    let tls = tls_server();
    let other = ca("another CA");
    for (n, trust) in [
        Tls::require()
            .with_extra_roots(&other.pem)
            .without_system_roots(),
        Tls::require().with_extra_roots(&other.pem),
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("tls wrong ca {n}");
        let options = tcp_options(&tls.server, "127.0.0.1", &format!("tls_wrong_ca_{n}"));
        let message = tls_failure(PostgresStore::open(options, settings(trust, &name)));
        assert!(message.contains("certificate"), "{message}");
        assert!(encrypted(&tls.server, &name).is_empty());
    }
    // The platform's roots alone do not know the test CA (when the machine has none,
    // opening is refused before connecting, as a setting).
    let options = tcp_options(&tls.server, "127.0.0.1", "tls_system_only");
    match PostgresStore::open(options, settings(Tls::require(), "tls system only")) {
        Err(OpenError::Tls(e)) => assert_eq!(e.kind(), DatabaseErrorKind::Tls),
        Err(OpenError::InvalidSetting { name: "tls", .. }) => {}
        other => panic!("{other:?}"),
    }
}

// A connection string's `sslmode=require` requires TLS as `TlsMode::Require` does, with
// the settings' roots; without the test CA it fails.
#[test]
fn sslmode_require_in_the_connection_string_requires_verified_tls() {
    let tls = tls_server();
    tcp_options(&tls.server, "127.0.0.1", "tls_sslmode");
    let params = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres sslmode=require \
         options='-c search_path=tls_sslmode'",
        tls.server.tcp_port.unwrap()
    );
    // The settings' mode stays `Disable`: the string raises it.
    let roots = Tls::default()
        .with_extra_roots(&tls.ca_pem)
        .without_system_roots();
    let mut store = PostgresStore::connect(&params, settings(roots, "tls sslmode")).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    assert_eq!(encrypted(&tls.server, "tls sslmode"), vec![true]);

    let wrong = Tls::default()
        .with_extra_roots(ca("another CA").pem)
        .without_system_roots();
    tls_failure(PostgresStore::connect(
        &params,
        settings(wrong, "tls sslmode wrong"),
    ));
}

// TLS required to a server without TLS fails with the typed error; so does a Unix socket
// (the server never offers TLS there). Plain connections, the default, still work to
// both servers.
#[test]
fn tls_required_to_a_server_without_tls_is_a_typed_error() {
    let plain = plain_server();
    let options = tcp_options(plain, "127.0.0.1", "no_tls");
    // Roots of their own, so that the outcome does not depend on the machine's store.
    let trust = Tls::require()
        .with_extra_roots(ca("unused CA").pem)
        .without_system_roots();
    let message = tls_failure(PostgresStore::open(
        options.clone(),
        settings(trust, "no tls"),
    ));
    assert!(message.contains("does not support TLS"), "{message}");
    let mut store = PostgresStore::open(options, settings(Tls::default(), "no tls plain")).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);

    let tls = tls_server();
    let socket: ConnectOptions = format!("{} options='-c search_path=tls_socket'", tls.server.url)
        .parse()
        .unwrap();
    tcp_options(&tls.server, "127.0.0.1", "tls_socket");
    let trust = Tls::require().with_extra_roots(&tls.ca_pem);
    tls_failure(PostgresStore::open(
        socket.clone(),
        settings(trust, "tls socket"),
    ));
    let mut store =
        PostgresStore::open(socket, settings(Tls::default(), "tls socket plain")).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    assert_eq!(encrypted(&tls.server, "tls socket plain"), vec![false]);
}
