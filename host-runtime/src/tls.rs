//! The server over TLS (feature `tls`): rustls with its `ring` provider.
//!
//! Give [`ServerConfig::tls`](crate::server::ServerConfig::tls) a [`TlsConfig`] made from a
//! PEM certificate chain and its private key, and the server speaks only TLS on its
//! listener: `wss://` for the WebSocket, `https://` for pairing and the page. Without one
//! it speaks plain HTTP, as a loopback server or one behind a TLS-terminating proxy does.
//!
//! Handshakes run on tasks of their own, so a client that connects and says nothing
//! holds up no other: each has [`HANDSHAKE_DEADLINE`] to finish, and at most
//! [`MAX_HANDSHAKES`] run at once (past it, new connections wait in the kernel's backlog).
//! A failed or late handshake closes that connection and is logged at `debug`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinHandle;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// How long a client has to finish its TLS handshake.
pub const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(10);

/// Handshakes in progress at most.
pub const MAX_HANDSHAKES: usize = 256;

/// A certificate and its key, ready to serve.
#[derive(Clone)]
pub struct TlsConfig {
    server: Arc<rustls::ServerConfig>,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig").finish_non_exhaustive()
    }
}

/// Why a certificate and key could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The certificate PEM holds no certificate.
    #[error("the certificate file holds no certificate")]
    NoCertificate,
    /// A PEM section could not be read.
    #[error("unreadable PEM: {0}")]
    Pem(String),
    /// rustls refused the pair (a key that does not match the certificate, an
    /// unsupported key type).
    #[error("the certificate and key were refused: {0}")]
    Refused(String),
}

impl TlsConfig {
    /// From a PEM certificate chain (leaf first) and a PEM private key (PKCS#8, PKCS#1
    /// or SEC1). TLS 1.2 and 1.3, the provider's safe defaults, no client certificates;
    /// the server offers `http/1.1`.
    ///
    /// # Errors
    ///
    /// [`TlsError`]: no certificate, unreadable PEM, or a pair rustls refuses.
    pub fn from_pem(cert_chain: &[u8], key: &[u8]) -> Result<TlsConfig, TlsError> {
        let certs = CertificateDer::pem_slice_iter(cert_chain)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsError::Pem(e.to_string()))?;
        if certs.is_empty() {
            return Err(TlsError::NoCertificate);
        }
        let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| TlsError::Pem(e.to_string()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Refused(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| TlsError::Refused(e.to_string()))?;
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(TlsConfig {
            server: Arc::new(server),
        })
    }
}

/// A listener whose connections have finished their TLS handshake.
pub(crate) struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local_addr: SocketAddr,
    accepting: JoinHandle<()>,
}

impl TlsListener {
    pub(crate) fn new(listener: TcpListener, config: &TlsConfig) -> std::io::Result<TlsListener> {
        let local_addr = listener.local_addr()?;
        let acceptor = TlsAcceptor::from(Arc::clone(&config.server));
        let (done, ready) = mpsc::channel(MAX_HANDSHAKES);
        let accepting = tokio::spawn(accept_loop(listener, acceptor, done));
        Ok(TlsListener {
            ready,
            local_addr,
            accepting,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    done: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let slots = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let (tcp, from) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // As axum's own listener does: a full descriptor table clears up by
                // itself, so wait a moment rather than spin.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let done = done.clone();
        tokio::spawn(async move {
            let _slot = slot;
            match tokio::time::timeout(HANDSHAKE_DEADLINE, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => {
                    if done.send((stream, from)).await.is_err() {
                        tracing::debug!(%from, "server ended before the connection was served");
                    }
                }
                Ok(Err(e)) => tracing::debug!(%from, error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(%from, "TLS handshake took too long"),
            }
        });
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(accepted) => accepted,
            // The accept loop ends only when the listener is dropped, and `self` is
            // alive here; wait as a listener with no more clients does.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local_addr)
    }
}
