//! Where to connect ([`ConnectOptions`]) and how to secure it ([`Tls`]), and the
//! connector they make.

use std::str::FromStr;

use postgres::config::{Host, SslMode};
use postgres::{Client, Config};

use crate::{DatabaseError, OpenError};

/// Where and as whom to connect: hosts, ports, user, password, database and server
/// options. Parse a connection string ([`ConnectOptions::parse`], or `str::parse`) or
/// build one:
///
/// ```
/// use storage_postgres::ConnectOptions;
///
/// let by_string: ConnectOptions = "host=db.internal port=5432 user=custody dbname=custody".parse()?;
/// let built = ConnectOptions::new()
///     .host("db.internal")
///     .port(5432)
///     .user("custody")
///     .dbname("custody")
///     .options("-c search_path=custody");
/// # Ok::<(), storage_postgres::OpenError>(())
/// ```
///
/// A connection string is either key=value pairs (`host=/run/postgresql dbname=custody`)
/// or a URL (`postgres://custody:secret@db.internal:5432/custody`), with libpq's keys
/// for what is above and `connect_timeout`, `keepalives`, `target_session_attrs`,
/// `channel_binding` and `sslmode`. The rest of what a store needs lives in
/// [`Settings`](crate::Settings); its `connect_timeout` and `application_name` replace
/// the string's. `sslmode=require` requires TLS as [`TlsMode::Require`] does (verified
/// against [`Tls`]'s roots, unlike libpq's `require`); `sslmode=disable` with
/// `TlsMode::Require` is refused as a conflict; `sslmode=prefer` is the driver's default
/// when the string names none, so it means the same as naming none: [`Settings::tls`]
/// decides.
///
/// [`Settings::tls`]: crate::Settings::tls
#[derive(Clone, Default)]
pub struct ConnectOptions {
    pub(crate) config: Config,
}

impl ConnectOptions {
    /// Nothing set yet: add at least a host (opening without one fails with
    /// [`OpenError::Config`]). The port defaults to 5432, the user to the one running
    /// the process, the database to the user's name.
    pub fn new() -> ConnectOptions {
        ConnectOptions::default()
    }

    /// Parses a connection string (key=value pairs or a `postgres://` URL).
    pub fn parse(params: &str) -> Result<ConnectOptions, OpenError> {
        params
            .parse::<Config>()
            .map(|config| ConnectOptions { config })
            .map_err(|e| OpenError::Config(DatabaseError::from_driver(e)))
    }

    /// Adds a host: a name, an IP address, or the directory of the server's Unix
    /// socket (an absolute path, `/run/postgresql`). Several hosts are tried in order.
    #[must_use]
    pub fn host(mut self, host: &str) -> ConnectOptions {
        self.config.host(host);
        self
    }

    /// Adds a port: one for every host, or one per host in the order of the hosts
    /// (default 5432).
    #[must_use]
    pub fn port(mut self, port: u16) -> ConnectOptions {
        self.config.port(port);
        self
    }

    /// The user to connect as.
    #[must_use]
    pub fn user(mut self, user: &str) -> ConnectOptions {
        self.config.user(user);
        self
    }

    /// The password, when the server asks for one.
    #[must_use]
    pub fn password(mut self, password: impl AsRef<[u8]>) -> ConnectOptions {
        self.config.password(password);
        self
    }

    /// The database (default: the user's name).
    #[must_use]
    pub fn dbname(mut self, dbname: &str) -> ConnectOptions {
        self.config.dbname(dbname);
        self
    }

    /// Command-line options for the server's session, as libpq's `options`:
    /// `-c search_path=custody` keeps the tables in the schema `custody`.
    #[must_use]
    pub fn options(mut self, options: &str) -> ConnectOptions {
        self.config.options(options);
        self
    }
}

impl FromStr for ConnectOptions {
    type Err = OpenError;

    fn from_str(params: &str) -> Result<ConnectOptions, OpenError> {
        ConnectOptions::parse(params)
    }
}

impl std::fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hosts: Vec<String> = self
            .config
            .get_hosts()
            .iter()
            .map(|h| match h {
                Host::Tcp(name) => name.clone(),
                #[cfg(unix)]
                Host::Unix(path) => path.display().to_string(),
            })
            .collect();
        f.debug_struct("ConnectOptions")
            .field("hosts", &hosts)
            .field("ports", &self.config.get_ports())
            .field("user", &self.config.get_user())
            .field("password", &self.config.get_password().map(|_| "(set)"))
            .field("dbname", &self.config.get_dbname())
            .field("options", &self.config.get_options())
            .finish_non_exhaustive()
    }
}

/// Whether a connection uses TLS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TlsMode {
    /// Plain connections (the default): use a Unix socket or a trusted network.
    #[default]
    Disable,
    /// TLS or no connection: the server must offer TLS and present a certificate that
    /// verifies against the trusted roots for the host's name (or IP address). Needs the
    /// crate's `tls` feature; without it, opening fails with
    /// [`OpenError::TlsUnsupported`]. The server offers TLS only over TCP, never on a
    /// Unix socket.
    Require,
}

/// TLS for a store's connections ([`Settings::tls`](crate::Settings::tls)).
///
/// ```
/// use storage_postgres::{Settings, Tls};
///
/// # let ca_pem = Vec::new();
/// let mut settings = Settings::default();
/// // The server's certificate is signed by a private CA, given as a PEM file's bytes.
/// settings.tls = Tls::require().with_extra_roots(ca_pem);
/// ```
///
/// With [`TlsMode::Require`], the server's certificate must chain to a trusted root:
/// the platform's (read once per store by `rustls-native-certs`: on Linux the OpenSSL
/// locations, or `SSL_CERT_FILE` and `SSL_CERT_DIR` when set; the keychain on macOS; the
/// system store on Windows), unless [`Tls::system_roots`] is off, and those of
/// [`Tls::extra_roots`]. A store that trusts only its private CA turns the system roots
/// off.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Tls {
    /// Plain or TLS (default [`TlsMode::Disable`]).
    pub mode: TlsMode,
    /// Root certificates to trust, as PEM: the bytes of one or more `.pem` or `.crt`
    /// files, each with one or more `BEGIN CERTIFICATE` blocks (default none). Refused
    /// when TLS is not required, so that roots given for a connection that would be
    /// plain are not taken as TLS turned on.
    pub extra_roots: Vec<u8>,
    /// Whether the platform's trusted roots count too (default `true`).
    pub system_roots: bool,
}

impl Default for Tls {
    fn default() -> Self {
        Tls {
            mode: TlsMode::Disable,
            extra_roots: Vec::new(),
            system_roots: true,
        }
    }
}

impl Tls {
    /// Plain connections (the default).
    pub fn disable() -> Tls {
        Tls::default()
    }

    /// TLS required, verified against the platform's roots.
    pub fn require() -> Tls {
        Tls {
            mode: TlsMode::Require,
            ..Tls::default()
        }
    }

    /// Adds root certificates to trust, as PEM (a file's bytes).
    #[must_use]
    pub fn with_extra_roots(mut self, pem: impl AsRef<[u8]>) -> Tls {
        let pem = pem.as_ref();
        if !self.extra_roots.is_empty() && !self.extra_roots.ends_with(b"\n") {
            self.extra_roots.push(b'\n');
        }
        self.extra_roots.extend_from_slice(pem);
        self
    }

    /// Trusts only [`Tls::extra_roots`], not the platform's roots.
    #[must_use]
    pub fn without_system_roots(mut self) -> Tls {
        self.system_roots = false;
        self
    }
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("mode", &self.mode)
            .field(
                "extra_roots",
                &format_args!("{} bytes of PEM", self.extra_roots.len()),
            )
            .field("system_roots", &self.system_roots)
            .finish()
    }
}

/// What makes a store's connections: plain, or TLS with the roots of its settings.
#[derive(Clone)]
pub(crate) enum Connector {
    Plain,
    #[cfg(feature = "tls")]
    Rustls(tokio_postgres_rustls::MakeRustlsConnect),
}

impl Connector {
    pub(crate) fn connect(&self, config: &Config) -> Result<Client, postgres::Error> {
        match self {
            Connector::Plain => config.connect(postgres::NoTls),
            #[cfg(feature = "tls")]
            Connector::Rustls(tls) => config.connect(tls.clone()),
        }
    }
}

/// The TLS mode a connection uses: the settings', raised to `Require` by the connection
/// string's `sslmode=require`; a string's `sslmode=disable` against a required mode is a
/// conflict.
fn effective_mode(config: &Config, tls: &Tls) -> Result<TlsMode, OpenError> {
    match (config.get_ssl_mode(), tls.mode) {
        (SslMode::Disable, TlsMode::Require) => Err(OpenError::InvalidSetting {
            name: "tls.mode",
            reason: "TLS is required, but the connection string says sslmode=disable".to_owned(),
        }),
        (SslMode::Require, _) => Ok(TlsMode::Require),
        (_, mode) => Ok(mode),
    }
}

/// Checks the TLS settings against the connection string, fixes the driver's
/// `sslmode` to the outcome (never the driver's default `prefer`, which would fall back
/// to plain), and makes the connector.
pub(crate) fn connector(config: &mut Config, tls: &Tls) -> Result<Connector, OpenError> {
    let mode = effective_mode(config, tls)?;
    match mode {
        TlsMode::Disable => {
            if !tls.extra_roots.is_empty() {
                return Err(OpenError::InvalidSetting {
                    name: "tls.extra_roots",
                    reason: "root certificates are given, but TLS is not required (set \
                             tls.mode to TlsMode::Require)"
                        .to_owned(),
                });
            }
            config.ssl_mode(SslMode::Disable);
            Ok(Connector::Plain)
        }
        TlsMode::Require => {
            config.ssl_mode(SslMode::Require);
            rustls_connector(tls)
        }
    }
}

#[cfg(not(feature = "tls"))]
fn rustls_connector(_: &Tls) -> Result<Connector, OpenError> {
    Err(OpenError::TlsUnsupported)
}

#[cfg(feature = "tls")]
fn rustls_connector(tls: &Tls) -> Result<Connector, OpenError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;

    let invalid = |name: &'static str, reason: String| OpenError::InvalidSetting { name, reason };
    let mut roots = rustls::RootCertStore::empty();
    if !tls.extra_roots.is_empty() {
        let mut given = 0;
        for cert in CertificateDer::pem_slice_iter(&tls.extra_roots) {
            let cert = cert
                .map_err(|e| invalid("tls.extra_roots", format!("the PEM does not parse: {e}")))?;
            roots.add(cert).map_err(|e| {
                invalid(
                    "tls.extra_roots",
                    format!("a certificate is not a usable root: {e}"),
                )
            })?;
            given += 1;
        }
        if given == 0 {
            return Err(invalid(
                "tls.extra_roots",
                "the PEM holds no CERTIFICATE block".to_owned(),
            ));
        }
    }
    let mut system_errors = Vec::new();
    if tls.system_roots {
        let system = rustls_native_certs::load_native_certs();
        // Certificates of the system store that rustls cannot use are skipped, as
        // other clients skip them.
        roots.add_parsable_certificates(system.certs);
        system_errors = system.errors;
    }
    if roots.is_empty() {
        let why = if !tls.system_roots {
            "the system roots are off and no extra roots are given".to_owned()
        } else if system_errors.is_empty() {
            "the system store holds no certificate and no extra roots are given".to_owned()
        } else {
            let errors: Vec<String> = system_errors.iter().map(|e| e.to_string()).collect();
            format!(
                "the system store could not be read ({}) and no extra roots are given",
                errors.join("; ")
            )
        };
        return Err(invalid(
            "tls",
            format!("no root certificate to verify the server with: {why}"),
        ));
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid("tls", format!("the TLS provider refused: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    // What libpq sends: PostgreSQL 17 and newer require it for `sslnegotiation=direct`
    // and check it when it is sent; older servers ignore it.
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok(Connector::Rustls(
        tokio_postgres_rustls::MakeRustlsConnect::new(config),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(s: &str) -> Config {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn the_connection_strings_sslmode_only_ever_raises_the_mode() {
        let plain = Tls::default();
        let required = Tls::require();
        let mode = |s: &str, tls: &Tls| effective_mode(&config(s), tls).ok();
        assert_eq!(mode("host=h", &plain), Some(TlsMode::Disable));
        assert_eq!(
            mode("host=h sslmode=prefer", &plain),
            Some(TlsMode::Disable)
        );
        assert_eq!(
            mode("host=h sslmode=disable", &plain),
            Some(TlsMode::Disable)
        );
        assert_eq!(
            mode("host=h sslmode=require", &plain),
            Some(TlsMode::Require)
        );
        assert_eq!(mode("host=h", &required), Some(TlsMode::Require));
        assert_eq!(
            mode("host=h sslmode=prefer", &required),
            Some(TlsMode::Require)
        );
        assert!(matches!(
            effective_mode(&config("host=h sslmode=disable"), &required),
            Err(OpenError::InvalidSetting {
                name: "tls.mode",
                ..
            })
        ));
    }

    #[test]
    fn plain_connections_fix_sslmode_to_disable_and_refuse_roots() {
        let mut c = config("host=h");
        assert!(matches!(
            connector(&mut c, &Tls::default()),
            Ok(Connector::Plain)
        ));
        assert_eq!(c.get_ssl_mode(), SslMode::Disable);
        let roots = Tls::default().with_extra_roots("-----BEGIN CERTIFICATE-----");
        assert!(matches!(
            connector(&mut config("host=h"), &roots),
            Err(OpenError::InvalidSetting {
                name: "tls.extra_roots",
                ..
            })
        ));
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn without_the_feature_tls_is_refused_before_connecting() {
        assert!(matches!(
            connector(&mut config("host=h"), &Tls::require()),
            Err(OpenError::TlsUnsupported)
        ));
        assert!(matches!(
            connector(&mut config("host=h sslmode=require"), &Tls::default()),
            Err(OpenError::TlsUnsupported)
        ));
    }

    #[cfg(feature = "tls")]
    #[test]
    fn roots_that_do_not_parse_or_are_missing_are_refused() {
        let garbage = Tls::require()
            .with_extra_roots("not a certificate")
            .without_system_roots();
        assert!(matches!(
            connector(&mut config("host=h"), &garbage),
            Err(OpenError::InvalidSetting {
                name: "tls.extra_roots",
                ..
            })
        ));
        let broken = Tls::require()
            .with_extra_roots("-----BEGIN CERTIFICATE-----\nAAAA\n")
            .without_system_roots();
        assert!(matches!(
            connector(&mut config("host=h"), &broken),
            Err(OpenError::InvalidSetting {
                name: "tls.extra_roots",
                ..
            })
        ));
        let none = Tls::require().without_system_roots();
        assert!(matches!(
            connector(&mut config("host=h"), &none),
            Err(OpenError::InvalidSetting { name: "tls", .. })
        ));
    }

    #[test]
    fn options_build_and_debug_without_the_password() {
        let o = ConnectOptions::new()
            .host("/run/postgresql")
            .host("db.internal")
            .port(5433)
            .user("custody")
            .password("secret")
            .dbname("custody")
            .options("-c search_path=custody");
        assert_eq!(o.config.get_hosts().len(), 2);
        assert_eq!(o.config.get_ports(), &[5433]);
        assert_eq!(o.config.get_user(), Some("custody"));
        assert_eq!(o.config.get_dbname(), Some("custody"));
        assert_eq!(o.config.get_options(), Some("-c search_path=custody"));
        let shown = format!("{o:?}");
        assert!(
            shown.contains("db.internal") && !shown.contains("secret"),
            "{shown}"
        );
        assert!(matches!(
            "port=x".parse::<ConnectOptions>(),
            Err(OpenError::Config(_))
        ));
    }
}
