//! What a generator client speaks under MQTT: plain TCP, or TLS over TCP (the `tls-*` cases
//! of compare.sh, issue 13).
//!
//! TLS uses the broker's own stack (rustls with the ring provider), trusting one CA file and
//! optionally presenting a client certificate. Session resumption is off, so every connection
//! is a full handshake: the `handshakes` scenario measures what a fleet of devices reconnecting
//! after a broker restart costs, when no ticket is valid any more.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// How every client of a run secures its connection: shared (one `Arc`) by all of them, as
/// one rustls client config is.
#[derive(Clone)]
pub struct TlsClient {
    connector: TlsConnector,
    server_name: ServerName<'static>,
}

impl fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsClient")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl TlsClient {
    /// A client trusting the CA certificates in `ca` (PEM), checking the broker's certificate
    /// against `server_name`, presenting `identity` (certificate chain PEM, private key PEM)
    /// when given. Resumption is disabled: every handshake is a full one.
    ///
    /// # Errors
    ///
    /// A file that cannot be read or parsed, or a certificate rustls refuses.
    pub fn new(ca: &Path, identity: Option<(&Path, &Path)>, server_name: &str) -> Result<Self> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(ca)
            .with_context(|| format!("read CA file {}", ca.display()))?
        {
            roots
                .add(cert.with_context(|| format!("parse CA file {}", ca.display()))?)
                .context("add CA certificate")?;
        }
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_root_certificates(roots);
        let mut config = match identity {
            Some((cert, key)) => {
                let chain = CertificateDer::pem_file_iter(cert)
                    .with_context(|| format!("read {}", cert.display()))?
                    .collect::<Result<Vec<_>, _>>()
                    .with_context(|| format!("parse {}", cert.display()))?;
                let key = PrivateKeyDer::from_pem_file(key)
                    .with_context(|| format!("read key {}", key.display()))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .context("client certificate")?
            }
            None => builder.with_no_client_auth(),
        };
        config.resumption = rustls::client::Resumption::disabled();
        let server_name = ServerName::try_from(server_name.to_owned())
            .with_context(|| format!("invalid TLS server name {server_name:?}"))?;
        Ok(TlsClient {
            connector: TlsConnector::from(Arc::new(config)),
            server_name,
        })
    }

    /// Runs the TLS handshake on a connected socket.
    ///
    /// # Errors
    ///
    /// The handshake failed (certificate not trusted, protocol error, connection closed).
    pub async fn handshake(&self, tcp: TcpStream) -> Result<Stream> {
        let tls = self
            .connector
            .connect(self.server_name.clone(), tcp)
            .await
            .context("TLS handshake")?;
        Ok(Stream::Tls(Box::new(tls)))
    }
}

/// A client's byte stream: plain TCP, or TLS over TCP (boxed). The broker's own client stream
/// (the bridge's, `postbox::test_support::bridge::transport::RemoteStream`), so the generator does not keep
/// a copy of its `AsyncRead`/`AsyncWrite` delegation; the plain-TCP publisher drives the socket
/// through its readiness API ([`Stream::tcp`]).
pub use postbox::test_support::bridge::transport::RemoteStream as Stream;
